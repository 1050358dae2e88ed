//! Which UDP conntrack entries are stale after an apply: kube-proxy's reconciler
//! (`pkg/proxy/conntrack/cleanup.go`, `CleanStaleEntries`), as a pure [`Spec`] made from
//! one family's [`NodeView`]. `svc_node` dumps the node's conntrack table, asks
//! [`Spec::stale`] of each entry and deletes those.
//!
//! Why: a UDP "connection" has no end, so a conntrack entry made by the old DNAT keeps
//! sending a client's datagrams (same 5-tuple, e.g. a resolver's socket) to an endpoint
//! that is gone, and one made while the service had no endpoints keeps them from being
//! DNATed at all. As upstream:
//! - only UDP service ports (TCP ends with its connection; SCTP is not cleaned);
//! - a port's endpoints are its **serving** ones (`IsServing`: ready, or serving and
//!   terminating), whatever the traffic policies and topology, whether local or not: an
//!   entry to any of them is still served, so it stays;
//! - a port without serving endpoints adds nothing (its entries are left alone);
//! - an entry is stale when its original destination is a frontend of the port
//!   (`clusterIP:port`, each external IP's and each LoadBalancer VIP's `ip:port`) or its
//!   original destination port is the port's node port (any destination address), and
//!   its reply source (the endpoint it was DNATed to, or the frontend itself when it was
//!   not DNATed) is not one of the serving `ip:port`s.
//!
//! Where two ports share a frontend (two services listing one external IP), the entry
//! stays when either port serves its reply source: upstream keeps whichever its map
//! iteration wrote last, which is not deterministic.
//!
//! Not cleaned, as upstream: a service that is deleted (its frontends are no longer
//! known), and anything but UDP.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use svc_compiler::ir::{NodeView, PortView, Protocol};
use svc_compiler::net::IpFamily;

/// IANA protocol number of UDP, as conntrack tuples carry it.
pub const UDP: u8 = 17;

/// One conntrack entry as the cleanup sees it: the original direction's protocol and
/// destination, and the reply direction's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub protocol: u8,
    pub orig_dst: SocketAddr,
    pub reply_src: SocketAddr,
}

/// The stale-entry test of one family's node: frontends and node ports, each with the
/// serving endpoints its entries may be DNATed to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    family: IpFamily,
    frontends: BTreeMap<SocketAddr, BTreeSet<SocketAddr>>,
    node_ports: BTreeMap<u16, BTreeSet<SocketAddr>>,
}

/// The cleanup spec of one family's view (see the module doc).
pub fn spec(view: &NodeView) -> Spec {
    let mut spec = Spec {
        family: view.family,
        frontends: BTreeMap::new(),
        node_ports: BTreeMap::new(),
    };
    for p in view.ports.iter().filter(|p| p.protocol == Protocol::UDP) {
        let serving = serving(p);
        if serving.is_empty() {
            continue;
        }
        let frontends = p
            .cluster_ip
            .iter()
            .chain(&p.load_balancer_ips)
            .chain(&p.external_ips)
            .map(|ip| SocketAddr::new(*ip, p.port));
        for f in frontends {
            spec.frontends
                .entry(f)
                .or_default()
                .extend(serving.iter().copied());
        }
        if let Some(np) = p.node_port.filter(|&np| np != 0) {
            spec.node_ports
                .entry(np)
                .or_default()
                .extend(serving.iter().copied());
        }
    }
    spec
}

/// A port's serving endpoints (`endpoint.IsServing()`), from all of its endpoints of the
/// family (`PortView::endpoints`, before policies and topology), not from the policy sets.
fn serving(p: &PortView) -> BTreeSet<SocketAddr> {
    p.endpoints
        .iter()
        .filter(|e| e.serving)
        .map(|e| SocketAddr::new(e.ip, e.port))
        .collect()
}

impl Spec {
    /// The family of the view it was made from: the conntrack table to clean.
    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// Nothing can be stale: no dump is needed.
    pub fn is_empty(&self) -> bool {
        self.frontends.is_empty() && self.node_ports.is_empty()
    }

    /// How many `ip:port` frontends are checked.
    pub fn frontends(&self) -> usize {
        self.frontends.len()
    }

    /// How many node ports are checked.
    pub fn node_ports(&self) -> usize {
        self.node_ports.len()
    }

    /// Whether the entry is a UDP flow to a frontend (or node port) whose reply source is
    /// not a serving endpoint of it: upstream's two filters (orig dst ip:port + reply
    /// src, and orig dst port + reply src), either one deleting it.
    pub fn stale(&self, flow: &Flow) -> bool {
        if flow.protocol != UDP {
            return false;
        }
        let not_served = |set: &BTreeSet<SocketAddr>| !set.contains(&flow.reply_src);
        self.frontends.get(&flow.orig_dst).is_some_and(not_served)
            || self
                .node_ports
                .get(&flow.orig_dst.port())
                .is_some_and(not_served)
    }

    /// What would be cleaned, for the dry run's script.
    pub fn describe(&self) -> String {
        format!(
            "{} UDP frontend{} and {} node port{}",
            self.frontends(),
            if self.frontends() == 1 { "" } else { "s" },
            self.node_ports(),
            if self.node_ports() == 1 { "" } else { "s" },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use svc_compiler::ir::{ServiceType, TrafficPolicy};
    use svc_compiler::testing::{self as t, endpoints};

    fn udp(dst: &str, reply: &str) -> Flow {
        Flow {
            protocol: UDP,
            orig_dst: dst.parse().unwrap(),
            reply_src: reply.parse().unwrap(),
        }
    }

    /// `dns`: a UDP LoadBalancer 10.96.0.10:53 with node port 30053, external IP
    /// 203.0.113.5 and ingress 198.51.100.7, ITP=Local, with a ready endpoint on another
    /// node, a serving-terminating one and one neither ready nor serving; `web`: TCP;
    /// `empty`: UDP without a serving endpoint.
    fn view() -> NodeView {
        let mut dns_port = t::port(
            "dns",
            53,
            5353,
            endpoints(
                &[
                    "10.244.2.2@node-2",
                    "10.244.1.3@node-1#serving-terminating",
                    "10.244.1.4@node-1#terminating",
                ],
                5353,
            ),
        );
        dns_port.protocol = Protocol::UDP;
        dns_port.node_port = Some(30053);
        let mut dns = t::service(
            "kube-system",
            "dns",
            ServiceType::LoadBalancer,
            "10.96.0.10",
            vec![dns_port],
        );
        dns.external_ips = vec![t::ip("203.0.113.5")];
        dns.load_balancer_ingress = t::lb_ingress(&["198.51.100.7"]);
        dns.internal_traffic_policy = TrafficPolicy::Local;
        let web = t::service(
            "shop",
            "web",
            ServiceType::ClusterIP,
            "10.96.0.11",
            vec![t::port(
                "",
                53,
                5353,
                endpoints(&["10.244.1.2@node-1"], 5353),
            )],
        );
        let mut empty_port = t::port(
            "",
            5000,
            5000,
            endpoints(&["10.244.1.9@node-1#not-ready"], 5000),
        );
        empty_port.protocol = Protocol::UDP;
        let empty = t::service(
            "shop",
            "empty",
            ServiceType::ClusterIP,
            "10.96.0.12",
            vec![empty_port],
        );
        let m = t::module(
            vec![dns, web, empty],
            vec![
                t::node("node-1", &["192.0.2.10"], None),
                t::node("node-2", &["192.0.2.11"], None),
            ],
        );
        t::view(&m, "node-1", IpFamily::IPv4)
    }

    #[test]
    fn frontends_and_node_ports_of_udp_ports_with_serving_endpoints() {
        let s = spec(&view());
        // Cluster IP, LB VIP, external IP; one node port. `web` is TCP, `empty` serves none.
        assert_eq!((s.frontends(), s.node_ports()), (3, 1));
        assert_eq!(s.describe(), "3 UDP frontends and 1 node port");
        assert!(!s.is_empty());
    }

    #[test]
    fn an_entry_to_a_gone_endpoint_is_stale_one_to_a_serving_endpoint_is_not() {
        let s = spec(&view());
        for front in ["10.96.0.10:53", "203.0.113.5:53", "198.51.100.7:53"] {
            // Served: ready on another node (ITP=Local does not matter), serving-terminating.
            assert!(!s.stale(&udp(front, "10.244.2.2:5353")), "{front}");
            assert!(!s.stale(&udp(front, "10.244.1.3:5353")), "{front}");
            // Terminating and not serving, an endpoint that is gone, the right IP on an
            // old port, and the frontend itself (an entry made while nothing was DNATed).
            for reply in ["10.244.1.4:5353", "10.244.1.7:5353", "10.244.2.2:53", front] {
                assert!(s.stale(&udp(front, reply)), "{front} {reply}");
            }
        }
        // Another port of the cluster IP, and another protocol, are not this service's.
        assert!(!s.stale(&udp("10.96.0.10:54", "10.244.1.7:5353")));
        let mut tcp = udp("10.96.0.10:53", "10.244.1.7:5353");
        tcp.protocol = 6;
        assert!(!s.stale(&tcp));
    }

    #[test]
    fn node_ports_match_on_any_destination_address() {
        let s = spec(&view());
        for dst in ["192.0.2.10:30053", "127.0.0.1:30053", "10.1.2.3:30053"] {
            assert!(s.stale(&udp(dst, "10.244.1.7:5353")), "{dst}");
            assert!(s.stale(&udp(dst, dst)), "{dst}");
            assert!(!s.stale(&udp(dst, "10.244.2.2:5353")), "{dst}");
        }
        assert!(!s.stale(&udp("192.0.2.10:30054", "10.244.1.7:5353")));
    }

    #[test]
    fn ports_without_serving_endpoints_and_tcp_ports_add_nothing() {
        let s = spec(&view());
        // `empty`'s entries stay (upstream skips the port); `web` is TCP.
        assert!(!s.stale(&udp("10.96.0.12:5000", "10.96.0.12:5000")));
        assert!(!s.stale(&udp("10.96.0.11:53", "10.244.9.9:5353")));
        let m = t::module(vec![], vec![t::node("node-1", &["192.0.2.10"], None)]);
        assert!(spec(&t::view(&m, "node-1", IpFamily::IPv4)).is_empty());
    }

    #[test]
    fn a_frontend_two_ports_share_keeps_the_endpoints_of_both() {
        let mk = |name: &str, ip: &str, ep: &str| {
            let mut p = t::port("", 53, 53, endpoints(&[ep], 53));
            p.protocol = Protocol::UDP;
            let mut s = t::service("ns", name, ServiceType::ClusterIP, ip, vec![p]);
            s.external_ips = vec![t::ip("203.0.113.5")];
            s
        };
        let m = t::module(
            vec![
                mk("a", "10.96.0.1", "10.244.1.2"),
                mk("b", "10.96.0.2", "10.244.1.3"),
            ],
            vec![t::node("node-1", &["192.0.2.10"], None)],
        );
        let s = spec(&t::view(&m, "node-1", IpFamily::IPv4));
        assert!(!s.stale(&udp("203.0.113.5:53", "10.244.1.2:53")));
        assert!(!s.stale(&udp("203.0.113.5:53", "10.244.1.3:53")));
        assert!(s.stale(&udp("10.96.0.1:53", "10.244.1.3:53")));
    }

    #[test]
    fn ipv6_frontends_and_endpoints() {
        let mut p = t::port("", 53, 53, endpoints(&["fd00:10:244:1::2@node-1"], 53));
        p.protocol = Protocol::UDP;
        let svc = t::service(
            "ns",
            "dns6",
            ServiceType::ClusterIP,
            "fd00:10:96::10",
            vec![p],
        );
        let m = t::module(vec![svc], vec![t::node("node-1", &["fd00::10"], None)]);
        let s = spec(&t::view(&m, "node-1", IpFamily::IPv6));
        assert!(!s.stale(&udp("[fd00:10:96::10]:53", "[fd00:10:244:1::2]:53")));
        assert!(s.stale(&udp("[fd00:10:96::10]:53", "[fd00:10:244:1::3]:53")));
    }
}
