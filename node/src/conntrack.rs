//! kube-proxy's stale UDP conntrack cleanup on the node, over ctnetlink: dump the family's
//! conntrack table, ask [`Spec::stale`] (`svc_targets::plan::conntrack`, which decides)
//! of each entry, and delete the stale ones one by one by their original tuple.
//!
//! Upstream does the same through vishvananda/netlink (`pkg/proxy/conntrack/conntrack.go`:
//! `ListEntries`, then `ClearEntries` → `ConntrackDeleteFilters`, which dumps the table a
//! second time); here one dump serves both. A delete names the entry by its whole
//! original tuple (the kernel's `ctnetlink_del_conntrack` then looks that one entry up;
//! without a tuple the request would flush the table), with its zone and its `CTA_ID`, so
//! that an entry recycled under the same tuple in between is not deleted (`ENOENT`, as for
//! an entry that timed out: already gone).

use crate::nfnl::{nested, nla, u16_at, Socket};
use std::io;
use std::net::{IpAddr, SocketAddr};
use svc_compiler::net::IpFamily;
use svc_targets::plan::conntrack::{Flow, Spec};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const NLA_F_NESTED: u16 = 1 << 15;
/// A dump the kernel marks interrupted is taken again this many times in all; the last
/// one's entries are used even so (upstream `ListEntries` retries on `EINTR`, then goes on
/// with the partial result).
const DUMP_ATTEMPTS: usize = 3;

/// What a cleanup did.
#[derive(Debug, Default)]
pub(crate) struct Cleaned {
    /// Entries deleted.
    pub(crate) deleted: usize,
    /// Deletes refused otherwise than by the entry being gone: how many, the first error.
    pub(crate) failed: Option<(usize, io::Error)>,
}

/// Deletes the stale UDP conntrack entries of `spec`'s family in the network namespace
/// `/run/netns/NAME` (`None`: this process's). `Err`: the table could not be dumped
/// (nothing deleted).
pub(crate) fn clean(netns: Option<&str>, spec: &Spec) -> io::Result<Cleaned> {
    if spec.is_empty() {
        return Ok(Cleaned::default());
    }
    let family = match spec.family() {
        IpFamily::IPv4 => libc::AF_INET,
        IpFamily::IPv6 => libc::AF_INET6,
    } as u8;
    crate::netns::in_named(netns, || clean_here(family, spec))
}

/// [`clean`] in the calling thread's network namespace.
fn clean_here(family: u8, spec: &Spec) -> io::Result<Cleaned> {
    let mut stale = Vec::new();
    for attempt in 1..=DUMP_ATTEMPTS {
        stale.clear();
        // A new socket each time: an interrupted dump's rest is not read.
        let mut nl = Socket::open()?;
        let dumped = nl.request_to(
            NFNL_SUBSYS_CTNETLINK,
            IPCTNL_MSG_CT_GET,
            family,
            libc::NLM_F_DUMP as u16,
            &[],
            |msg| {
                if let Some(e) = parse(msg).filter(|e| spec.stale(&e.flow)) {
                    stale.push(e.delete_attrs());
                }
                Ok(())
            },
        );
        match dumped {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted && attempt < DUMP_ATTEMPTS => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => break,
            Err(e) => return Err(e),
        }
    }
    let mut out = Cleaned::default();
    if stale.is_empty() {
        return Ok(out);
    }
    let mut nl = Socket::open()?;
    for attrs in &stale {
        let r = nl.request_to(
            NFNL_SUBSYS_CTNETLINK,
            IPCTNL_MSG_CT_DELETE,
            family,
            libc::NLM_F_ACK as u16,
            attrs,
            |_| Ok(()),
        );
        match r {
            Ok(()) => out.deleted += 1,
            // Timed out, or replaced by a new entry with another id, since the dump.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => match &mut out.failed {
                Some((n, _)) => *n += 1,
                None => out.failed = Some((1, e)),
            },
        }
    }
    Ok(out)
}

/// One dumped conntrack entry: its flow, and the attributes a delete echoes.
#[derive(Debug)]
struct Entry<'a> {
    flow: Flow,
    /// The `CTA_TUPLE_ORIG` payload.
    orig: &'a [u8],
    /// The `CTA_ID` payload.
    id: Option<&'a [u8]>,
    /// The `CTA_ZONE` payload.
    zone: Option<&'a [u8]>,
}

/// A ctnetlink dump message (nlmsghdr, nfgenmsg, attributes) as an [`Entry`]; `None` for
/// anything else or an entry without both full tuples.
fn parse(msg: &[u8]) -> Option<Entry<'_>> {
    if u16_at(msg, 4)? != (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW {
        return None;
    }
    let (mut orig, mut reply, mut id, mut zone) = (None, None, None, None);
    nested(msg.get(20..)?, |t, v| match t {
        CTA_TUPLE_ORIG => orig = Some(v),
        CTA_TUPLE_REPLY => reply = Some(v),
        CTA_ID => id = Some(v),
        CTA_ZONE => zone = Some(v),
        _ => {}
    });
    let orig = orig?;
    let (protocol, _, orig_dst) = tuple(orig)?;
    let (_, reply_src, _) = tuple(reply?)?;
    Some(Entry {
        flow: Flow {
            protocol,
            orig_dst,
            reply_src,
        },
        orig,
        id,
        zone,
    })
}

/// A tuple's (protocol, source, destination); `None` unless it has both addresses, the
/// protocol and both ports (ICMP's id and type are not ports: such entries are not ours).
fn tuple(b: &[u8]) -> Option<(u8, SocketAddr, SocketAddr)> {
    let (mut src, mut dst, mut proto, mut sport, mut dport) = (None, None, None, None, None);
    nested(b, |t, v| match t {
        CTA_TUPLE_IP => nested(v, |t, v| {
            let ip = match v.len() {
                4 => <[u8; 4]>::try_from(v).ok().map(IpAddr::from),
                16 => <[u8; 16]>::try_from(v).ok().map(IpAddr::from),
                _ => None,
            };
            match t {
                CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = ip,
                CTA_IP_V4_DST | CTA_IP_V6_DST => dst = ip,
                _ => {}
            }
        }),
        CTA_TUPLE_PROTO => nested(v, |t, v| {
            let port = <[u8; 2]>::try_from(v).ok().map(u16::from_be_bytes);
            match t {
                CTA_PROTO_NUM => proto = v.first().copied().filter(|_| v.len() == 1),
                CTA_PROTO_SRC_PORT => sport = port,
                CTA_PROTO_DST_PORT => dport = port,
                _ => {}
            }
        }),
        _ => {}
    });
    Some((
        proto?,
        SocketAddr::new(src?, sport?),
        SocketAddr::new(dst?, dport?),
    ))
}

impl Entry<'_> {
    /// The attributes of `IPCTNL_MSG_CT_DELETE` for this entry: its original tuple as
    /// dumped, its zone and its id.
    fn delete_attrs(&self) -> Vec<u8> {
        let mut out = nla(CTA_TUPLE_ORIG | NLA_F_NESTED, self.orig);
        if let Some(zone) = self.zone {
            out.extend(nla(CTA_ZONE, zone));
        }
        if let Some(id) = self.id {
            out.extend(nla(CTA_ID, id));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfnl::for_each_attr;
    use svc_targets::plan::conntrack::UDP;

    fn nested_nla(t: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        nla(t | NLA_F_NESTED, &parts.concat())
    }

    /// A tuple as the kernel dumps it.
    fn tuple_nla(t: u16, proto: u8, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
        let ip = |a: IpAddr| match a {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        let (s, d) = match src.ip() {
            IpAddr::V4(_) => (CTA_IP_V4_SRC, CTA_IP_V4_DST),
            IpAddr::V6(_) => (CTA_IP_V6_SRC, CTA_IP_V6_DST),
        };
        nested_nla(
            t,
            &[
                nested_nla(
                    CTA_TUPLE_IP,
                    &[nla(s, &ip(src.ip())), nla(d, &ip(dst.ip()))],
                ),
                nested_nla(
                    CTA_TUPLE_PROTO,
                    &[
                        nla(CTA_PROTO_NUM, &[proto]),
                        nla(CTA_PROTO_SRC_PORT, &src.port().to_be_bytes()),
                        nla(CTA_PROTO_DST_PORT, &dst.port().to_be_bytes()),
                    ],
                ),
            ],
        )
    }

    /// A dump message: nlmsghdr, nfgenmsg, attributes.
    fn message(kind: u16, family: u8, attrs: &[Vec<u8>]) -> Vec<u8> {
        let attrs = attrs.concat();
        let mut m = Vec::new();
        m.extend_from_slice(&(20 + attrs.len() as u32).to_ne_bytes());
        m.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | kind).to_ne_bytes());
        m.extend_from_slice(&2u16.to_ne_bytes()); // NLM_F_MULTI
        m.extend_from_slice(&1u32.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&[family, 0, 0, 0]);
        m.extend_from_slice(&attrs);
        m
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A client's datagram to a cluster IP, DNATed to an endpoint.
    fn dnat_entry(family: u8, client: &str, vip: &str, ep: &str) -> Vec<u8> {
        message(
            IPCTNL_MSG_CT_NEW,
            family,
            &[
                tuple_nla(CTA_TUPLE_ORIG, UDP, sa(client), sa(vip)),
                tuple_nla(CTA_TUPLE_REPLY, UDP, sa(ep), sa(client)),
                nla(3, &8u32.to_be_bytes()), // CTA_STATUS
                nla(CTA_TIMEOUT_FOR_TEST, &30u32.to_be_bytes()),
                nla(CTA_ID, &0xdead_beefu32.to_be_bytes()),
                nla(CTA_ZONE, &7u16.to_be_bytes()),
            ],
        )
    }
    const CTA_TIMEOUT_FOR_TEST: u16 = 7;

    #[test]
    fn a_dumped_entry_gives_its_flow() {
        let m = dnat_entry(2, "10.244.1.3:40000", "10.96.0.10:53", "10.244.1.2:5353");
        let e = parse(&m).unwrap();
        assert_eq!(
            e.flow,
            Flow {
                protocol: UDP,
                orig_dst: sa("10.96.0.10:53"),
                reply_src: sa("10.244.1.2:5353"),
            }
        );
        let m = dnat_entry(
            10,
            "[fd00:10:244:1::3]:40000",
            "[fd00:10:96::10]:53",
            "[fd00:10:244:1::2]:5353",
        );
        let e = parse(&m).unwrap();
        assert_eq!(e.flow.orig_dst, sa("[fd00:10:96::10]:53"));
        assert_eq!(e.flow.reply_src, sa("[fd00:10:244:1::2]:5353"));
    }

    #[test]
    fn the_delete_echoes_the_original_tuple_zone_and_id() {
        let m = dnat_entry(2, "10.244.1.3:40000", "10.96.0.10:53", "10.244.1.2:5353");
        let attrs = parse(&m).unwrap().delete_attrs();
        // Seen as the kernel parses a request: the attributes after the nfgenmsg.
        let mut req = vec![0u8; 20];
        req.extend_from_slice(&attrs);
        let mut seen = Vec::new();
        for_each_attr(&req, |t, v| seen.push((t, v.to_vec())));
        let orig = tuple_nla(
            CTA_TUPLE_ORIG,
            UDP,
            sa("10.244.1.3:40000"),
            sa("10.96.0.10:53"),
        );
        assert_eq!(
            seen,
            vec![
                (CTA_TUPLE_ORIG, orig[4..].to_vec()),
                (CTA_ZONE, 7u16.to_be_bytes().to_vec()),
                (CTA_ID, 0xdead_beefu32.to_be_bytes().to_vec()),
            ]
        );
        // The tuple is sent as nested, whole (the kernel needs addresses, protocol and
        // ports to look one entry up; without it the request would be a flush).
        assert_eq!(u16_at(&attrs, 2), Some(CTA_TUPLE_ORIG | NLA_F_NESTED));
        assert_eq!(&attrs[4..orig.len()], &orig[4..]);
    }

    #[test]
    fn other_messages_and_incomplete_entries_are_not_entries() {
        let m = dnat_entry(2, "10.244.1.3:40000", "10.96.0.10:53", "10.244.1.2:5353");
        let mut other = m.clone();
        other[4] = IPCTNL_MSG_CT_DELETE as u8;
        assert!(parse(&other).is_none());
        // No reply tuple.
        let half = message(
            IPCTNL_MSG_CT_NEW,
            2,
            &[tuple_nla(
                CTA_TUPLE_ORIG,
                UDP,
                sa("10.0.0.1:1"),
                sa("10.0.0.2:2"),
            )],
        );
        assert!(parse(&half).is_none());
        // Cut short anywhere: no entry, no panic.
        for n in 0..m.len() {
            let mut cut = m[..n].to_vec();
            if cut.len() >= 4 {
                cut[..4].copy_from_slice(&(n as u32).to_ne_bytes());
            }
            let _ = parse(&cut);
        }
        // ICMP: no ports.
        let icmp = message(
            IPCTNL_MSG_CT_NEW,
            2,
            &[
                nested_nla(
                    CTA_TUPLE_ORIG,
                    &[
                        nested_nla(
                            CTA_TUPLE_IP,
                            &[
                                nla(CTA_IP_V4_SRC, &[10, 0, 0, 1]),
                                nla(CTA_IP_V4_DST, &[10, 0, 0, 2]),
                            ],
                        ),
                        nested_nla(CTA_TUPLE_PROTO, &[nla(CTA_PROTO_NUM, &[1])]),
                    ],
                ),
                tuple_nla(CTA_TUPLE_REPLY, UDP, sa("10.0.0.2:2"), sa("10.0.0.1:1")),
            ],
        );
        assert!(parse(&icmp).is_none());
    }
}
