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

use std::fs::File;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

const NETLINK_NETFILTER: libc::c_int = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
const NFTA_GEN_ID: u16 = 1;
const NLMSG_ERROR: u16 = 2;

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
    let (netns, id) = match netns {
        None => query().ok()?,
        Some(name) => {
            let ns = File::open(Path::new("/run/netns").join(name)).ok()?;
            crate::netns::in_netns(&ns, query).ok()?.ok()?
        }
    };
    Some(Generation { boot, netns, id })
}

/// (namespace cookie, generation id) of the calling thread's network namespace.
fn query() -> io::Result<(u64, u32)> {
    // SAFETY: plain socket call; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned by socket.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let cookie = crate::netns::cookie_of(&sock)?;
    // struct timeval: a bounded wait for the answer.
    let tv = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };
    // SAFETY: setsockopt with a timeval of its size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        );
    }

    // nlmsghdr (16 bytes) + nfgenmsg (family AF_UNSPEC, version 0, res_id 0).
    let seq: u32 = 1;
    let mut req = Vec::with_capacity(20);
    req.extend_from_slice(&20u32.to_ne_bytes());
    req.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN).to_ne_bytes());
    req.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req.extend_from_slice(&seq.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    // SAFETY: sending a buffer we own to the kernel (nl_pid 0).
    let sent = unsafe {
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as u16;
        libc::sendto(
            sock.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&addr as *const libc::sockaddr_nl).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 8192];
    loop {
        // SAFETY: receiving into a buffer we own.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let msgs = &buf[..n as usize];
        if let Some(id) = parse_reply(msgs, seq)? {
            return Ok((cookie, id));
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The generation id in one datagram of answers; `None` when it holds none of ours.
fn parse_reply(mut msgs: &[u8], seq: u32) -> io::Result<Option<u32>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed netlink answer");
    while msgs.len() >= 16 {
        let len = u32_at(msgs, 0).ok_or_else(bad)? as usize;
        let kind = u16_at(msgs, 4).ok_or_else(bad)?;
        if len < 16 || len > msgs.len() {
            return Err(bad());
        }
        let msg = &msgs[..len];
        if u32_at(msg, 8) == Some(seq) {
            if kind == NLMSG_ERROR {
                let errno = u32_at(msg, 16).map_or(0, |e| e as i32);
                return Err(io::Error::from_raw_os_error(-errno));
            }
            if kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN {
                // Attributes after the 4-byte nfgenmsg, each 4-byte aligned.
                let mut at = 20;
                while at + 4 <= len {
                    let alen = u16_at(msg, at).ok_or_else(bad)? as usize;
                    let atype = u16_at(msg, at + 2).ok_or_else(bad)? & 0x3fff;
                    if alen < 4 {
                        return Err(bad());
                    }
                    if atype == NFTA_GEN_ID && alen >= 8 {
                        let v = msg.get(at + 4..at + 8).ok_or_else(bad)?;
                        return Ok(Some(u32::from_be_bytes(v.try_into().map_err(|_| bad())?)));
                    }
                    at += (alen + 3) & !3;
                }
                return Err(bad());
            }
        }
        let next = ((len + 3) & !3).min(msgs.len());
        msgs = &msgs[next..];
    }
    Ok(None)
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
        assert_eq!(parse_reply(&m, 7).unwrap(), Some(4242));
        assert_eq!(parse_reply(&m, 8).unwrap(), None);
    }
}
