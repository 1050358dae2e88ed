//! nf_tables' ruleset generation id (`NFT_MSG_GETGEN`), read over netlink.
//!
//! Every committed nf_tables transaction in a network namespace advances the id by one
//! (`nft -f`, and `iptables-restore` of iptables-nft: one per table block); checks
//! (`nft -c`, `--test`) and reads do not. So when the id is the one recorded right after
//! our verified load, nobody has written any nf_tables state of that namespace since, and
//! the recorded snapshot is what the kernel shows.
//!
//! The id alone does not name the namespace or the boot it counts in (a new namespace or
//! a reboot starts it again), so a [`Generation`] also holds the namespace's cookie
//! (`SO_NETNS_COOKIE`, never reused while the machine runs) and the boot id.

use crate::nfnl::{u16_at, u32_attr, Socket, NFNL_SUBSYS_NFTABLES};
use std::io;

const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
const NFTA_GEN_ID: u16 = 1;

/// Where a namespace's nf_tables state stands: equal values mean nothing was committed in
/// between.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Generation {
    pub(crate) boot: String,
    pub(crate) netns: u64,
    pub(crate) id: u32,
}

impl Generation {
    /// One line for the state directory.
    pub(crate) fn to_line(&self) -> String {
        format!("{} {} {}", self.boot, self.netns, self.id)
    }

    pub(crate) fn from_line(line: &str) -> Option<Generation> {
        let mut w = line.split_whitespace();
        let g = Generation {
            boot: w.next()?.to_string(),
            netns: w.next()?.parse().ok()?,
            id: w.next()?.parse().ok()?,
        };
        w.next().is_none().then_some(g)
    }

    /// The same namespace and boot, `n` transactions later.
    pub(crate) fn after(&self, n: u32) -> Generation {
        Generation {
            id: self.id.wrapping_add(n),
            ..self.clone()
        }
    }
}

/// The generation of the namespace `/run/netns/NAME` (`None`: this process's). `None`
/// when it cannot be read (no nf_tables, an old kernel): callers then read the rules.
pub(crate) fn generation(netns: Option<&str>) -> Option<Generation> {
    let boot = crate::netns::boot_id()?;
    let (netns, id) = crate::netns::in_named(netns, query).ok()?;
    Some(Generation { boot, netns, id })
}

/// (namespace cookie, generation id) of the calling thread's network namespace.
fn query() -> io::Result<(u64, u32)> {
    let mut nl = Socket::open()?;
    let cookie = crate::netns::cookie_of(&nl)?;
    let mut id = None;
    nl.request(
        NFT_MSG_GETGEN,
        libc::AF_UNSPEC as u8,
        libc::NLM_F_ACK as u16,
        &[],
        |msg| {
            id = id.or(gen_id(msg));
            Ok(())
        },
    )?;
    let id = id.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no generation id"))?;
    Ok((cookie, id))
}

/// The generation id of a `NFT_MSG_NEWGEN` answer.
fn gen_id(msg: &[u8]) -> Option<u32> {
    (u16_at(msg, 4)? == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN)
        .then(|| u32_attr(msg, NFTA_GEN_ID))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_lines_round_trip() {
        let g = Generation {
            boot: "b0".into(),
            netns: 4097,
            id: 12,
        };
        assert_eq!(Generation::from_line(&g.to_line()), Some(g.clone()));
        assert_eq!(g.after(2).id, 14);
        assert_eq!(Generation::from_line("b0 4097"), None);
        assert_eq!(Generation::from_line("b0 4097 12 x"), None);
    }

    #[test]
    fn the_id_is_read_from_a_newgen_answer() {
        let mut m = Vec::new();
        m.extend_from_slice(&36u32.to_ne_bytes());
        m.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN).to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&7u32.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&[0, 0, 0, 0]);
        // NFTA_GEN_PROC_PID first, then NFTA_GEN_ID.
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&2u16.to_ne_bytes());
        m.extend_from_slice(&99u32.to_be_bytes());
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&NFTA_GEN_ID.to_ne_bytes());
        m.extend_from_slice(&4242u32.to_be_bytes());
        assert_eq!(gen_id(&m), Some(4242));
        m[4] = 0;
        assert_eq!(gen_id(&m), None);
    }
}
