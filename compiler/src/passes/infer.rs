//! The service range and node-port range of a live dump (`--no-allocate`) when none was
//! configured.
//!
//! A dump carries the range itself: ServiceCIDR objects (networking.k8s.io, 1.29+) name
//! it, and failing those, every cluster IP lies in it and `default/kubernetes` holds its
//! first host address. The range inferred from cluster IPs is the smallest block that holds
//! them all (aligned so that `kubernetes` is its first host, when that Service is there) and
//! none of them as its network or broadcast address: it never makes a written cluster IP an
//! error, and it may be narrower than the real range, which a note says.

use crate::diag::Diagnostic;
use crate::k8s::Objects;
use crate::net::{from_u128, parse_ip, to_u128, Cidr, IpFamily};
use crate::source::Span;
use std::net::IpAddr;

/// The inferred range (primary family first) and a note saying where it came from;
/// `None` when the dump has neither ServiceCIDRs nor cluster IPs.
pub fn service_cidrs(objects: &Objects) -> Option<(Vec<Cidr>, Diagnostic)> {
    let from_objects: Vec<(Cidr, Span)> = objects
        .service_cidrs
        .iter()
        .flat_map(|o| &o.cidrs)
        .filter_map(|c| Some((c.v.parse::<Cidr>().ok()?.network(), c.span)))
        .collect();
    if !from_objects.is_empty() {
        let mut out = Vec::new();
        for fam in [IpFamily::IPv4, IpFamily::IPv6] {
            let of: Vec<Cidr> = from_objects
                .iter()
                .map(|(c, _)| *c)
                .filter(|c| c.family() == fam)
                .collect();
            if let Some(first) = of.first() {
                // Several ServiceCIDRs of one family: the block that covers them all.
                let lo = of.iter().map(|c| to_u128(&c.addr)).min().unwrap_or(0);
                let hi = of
                    .iter()
                    .map(|c| to_u128(&c.addr) + (c.size() - 1))
                    .max()
                    .unwrap_or(0);
                let prefix = of.iter().map(|c| c.prefix).min().unwrap_or(first.prefix);
                out.push(covering(fam, lo, hi, prefix));
            }
        }
        // The first ServiceCIDR's first range is the primary family.
        if out.len() == 2 && out[1].family() == from_objects[0].0.family() {
            out.swap(0, 1);
        }
        let note = note(&out, "the ServiceCIDR objects", from_objects[0].1);
        return Some((out, note));
    }
    let mut ips: Vec<(IpAddr, Span)> = Vec::new();
    let mut kubernetes: Vec<IpAddr> = Vec::new();
    for s in &objects.services {
        let written = s.cluster_ips.iter().chain(s.cluster_ip.iter());
        for c in written {
            if let Some(ip) = parse_ip(&c.v) {
                ips.push((ip, c.span));
                if s.meta.name.v == "kubernetes" && s.meta.namespace.v == "default" {
                    kubernetes.push(ip);
                }
            }
        }
    }
    let first = ips.first()?.1;
    let mut out: Vec<Cidr> = Vec::new();
    for fam in [IpFamily::IPv4, IpFamily::IPv6] {
        let of: Vec<u128> = ips
            .iter()
            .filter(|(ip, _)| IpFamily::of(ip) == fam)
            .map(|(ip, _)| to_u128(ip))
            .collect();
        if of.is_empty() {
            continue;
        }
        let anchor = kubernetes
            .iter()
            .find(|ip| IpFamily::of(ip) == fam)
            .map(|ip| to_u128(ip).wrapping_sub(1));
        out.push(smallest_block(fam, &of, anchor));
    }
    // `kubernetes`'s first IP is of the primary family; else the family with more IPs.
    let primary = kubernetes.first().map(IpFamily::of).unwrap_or_else(|| {
        let v4 = ips.iter().filter(|(ip, _)| ip.is_ipv4()).count();
        match v4 * 2 >= ips.len() {
            true => IpFamily::IPv4,
            false => IpFamily::IPv6,
        }
    });
    if out.len() == 2 && out[1].family() == primary {
        out.swap(0, 1);
    }
    let note = note(&out, "the cluster IPs in the input", first);
    Some((out, note))
}

/// The node-port range, when a dump holds node ports outside the default 30000-32767: the
/// default widened to hold them all (the cluster's real range is not in the dump).
pub fn node_port_range(objects: &Objects, default: (u16, u16)) -> Option<((u16, u16), Diagnostic)> {
    let ports = objects.services.iter().flat_map(|s| {
        let np = s.ports.iter().filter_map(|p| p.node_port.as_ref());
        np.chain(s.health_check_node_port.as_ref())
    });
    let mut range = default;
    let mut first: Option<Span> = None;
    for p in ports.filter(|p| (1..=65535).contains(&p.v)) {
        let v = p.v as u16;
        if !(default.0..=default.1).contains(&v) {
            first.get_or_insert(p.span);
            range = (range.0.min(v), range.1.max(v));
        }
    }
    let at = first?;
    let note = Diagnostic::note(
        "SVC016",
        format!(
            "no node-port range was given: using {}-{}, which holds every node port in the input",
            range.0, range.1
        ),
    )
    .at(at)
    .hint("pass the cluster's --service-node-port-range (kube-apiserver's flag) to check against its real range");
    Some((range, note))
}

fn note(cidrs: &[Cidr], from: &str, at: Span) -> Diagnostic {
    let list: Vec<String> = cidrs.iter().map(|c| c.to_string()).collect();
    Diagnostic::note(
        "SVC016",
        format!(
            "no service range was given: using {}, inferred from {from}",
            list.join(",")
        ),
    )
    .at(at)
    .hint("pass the cluster's --service-cluster-ip-range (kube-apiserver's flag) to check against its real range")
}

/// The block of `prefix` bits or fewer that holds `lo..=hi`.
fn covering(fam: IpFamily, lo: u128, hi: u128, prefix: u8) -> Cidr {
    let bits = fam.bits();
    let mut p = prefix.min(bits);
    while p > 0 && block(fam, lo, p) != block(fam, hi, p) {
        p -= 1;
    }
    Cidr {
        addr: from_u128(block(fam, lo, p), fam),
        prefix: p,
    }
}

/// The smallest block that holds every address, none of them as its network or
/// broadcast address, starting at `anchor` when one is given and that is possible.
fn smallest_block(fam: IpFamily, ips: &[u128], anchor: Option<u128>) -> Cidr {
    let bits = fam.bits();
    let lo = *ips.iter().min().expect("at least one address");
    let hi = *ips.iter().max().expect("at least one address");
    let start = anchor.filter(|a| *a < lo).unwrap_or(lo);
    for p in (0..=bits).rev() {
        let net = block(fam, start, p);
        if anchor.is_some_and(|a| a == start && net != a) {
            // The anchor is not aligned at this size nor any smaller: drop it.
            return smallest_block(fam, ips, None);
        }
        let size_minus_1 = if bits - p >= 128 {
            u128::MAX
        } else {
            (1u128 << (bits - p)) - 1
        };
        let broadcast = net.saturating_add(size_minus_1);
        let holds = block(fam, hi, p) == net;
        let edges = ips.iter().any(|&ip| ip == net || ip == broadcast);
        if holds && !edges && bits - p >= 2 {
            return Cidr {
                addr: from_u128(net, fam),
                prefix: p,
            };
        }
    }
    Cidr {
        addr: from_u128(0, fam),
        prefix: 0,
    }
}

/// `ip` with all but the first `prefix` bits cleared.
fn block(fam: IpFamily, ip: u128, prefix: u8) -> u128 {
    let host = (fam.bits() - prefix) as u32;
    if host >= 128 {
        0
    } else {
        ip & !((1u128 << host) - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infer(ips: &[&str], anchor: Option<&str>) -> String {
        let fam = IpFamily::of(&ips[0].parse().unwrap());
        let v: Vec<u128> = ips.iter().map(|s| to_u128(&s.parse().unwrap())).collect();
        let a = anchor.map(|s| to_u128(&s.parse::<IpAddr>().unwrap()) - 1);
        smallest_block(fam, &v, a).to_string()
    }

    #[test]
    fn blocks_hold_every_ip_away_from_the_edges() {
        // kubeadm: kubernetes at 10.96.0.1, IPs spread over the /12.
        let ips = ["10.96.0.1", "10.96.0.10", "10.100.5.3", "10.111.200.7"];
        assert_eq!(infer(&ips, Some("10.96.0.1")), "10.96.0.0/12");
        // Few Services: a narrower block, still aligned at the kubernetes Service.
        assert_eq!(
            infer(&["10.0.0.1", "10.0.0.3"], Some("10.0.0.1")),
            "10.0.0.0/29"
        );
        // Without the kubernetes Service: the common block, no IP at its edges.
        assert_eq!(infer(&["172.20.0.10", "172.20.3.1"], None), "172.20.0.0/22");
        assert_eq!(infer(&["10.0.0.255", "10.0.1.0"], None), "10.0.0.0/23");
        assert_eq!(
            infer(&["fd00:10::1", "fd00:10::a:1"], Some("fd00:10::1")),
            "fd00:10::/108"
        );
        // A kubernetes IP that is not a first host address is ignored.
        assert_eq!(
            infer(&["10.96.0.2", "10.96.0.9"], Some("10.96.0.2")),
            "10.96.0.0/28"
        );
    }

    #[test]
    fn service_cidrs_cover_each_other() {
        let v4 = |s: &str| to_u128(&s.parse::<IpAddr>().unwrap());
        let c = covering(IpFamily::IPv4, v4("10.96.0.0"), v4("10.96.255.255"), 16);
        assert_eq!(c.to_string(), "10.96.0.0/16");
        let c = covering(IpFamily::IPv4, v4("10.96.0.0"), v4("10.97.255.255"), 16);
        assert_eq!(c.to_string(), "10.96.0.0/15");
    }
}
