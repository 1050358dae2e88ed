//! `svc-compile trace`: what one node does with one packet, answered from its [`NodeView`].
//!
//! Pure: a view, a packet and a proxy mode in, a [`Trace`] out (the steps taken, in the
//! order kube-proxy's rules take them, and the [`Verdict`]). Every decision is read from
//! the view (which endpoint set, masquerade settings, REJECT/DROP, which chains exist);
//! nothing here looks at Kubernetes objects. What the modes do differently is decided by
//! `mode` (the view's [`crate::ir::ByMode`] fields and the few differences that live in
//! the rules themselves, each commented where it is decided).
//!
//! Invariant: the trace is deterministic; backends are listed in the view's endpoint
//! order (sorted by `ip:port`).

use crate::ir::{
    LocalDetector, NoEndpointsVerdict, NodePortAddresses, NodeView, PortView, Protocol,
};
use serde::Serialize;
use std::net::IpAddr;

/// The proxy mode whose rules are traced (they differ in a few places).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Iptables,
    Nftables,
}

/// One packet as it reaches the node's rules.
#[derive(Clone, Debug)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub port: u16,
    pub proto: Protocol,
    /// Addresses local to the node besides the view's node IPs and loopback (e.g. a pod
    /// gateway address): where node ports may also be reached.
    pub local_ips: Vec<IpAddr>,
}

/// Where the packet comes from, as the rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// The node itself (a node IP, or loopback): its packets take OUTPUT, not PREROUTING.
    Node,
    /// A pod, by the local-traffic detector.
    Pod,
    /// Anything else (the detector does not call it local, or there is no detector).
    Outside,
}

/// How the destination matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Match {
    ClusterIp,
    ExternalIp,
    LoadBalancerIp,
    NodePort,
}

impl Match {
    pub fn describe(self) -> &'static str {
        match self {
            Match::ClusterIp => "cluster IP",
            Match::ExternalIp => "external IP",
            Match::LoadBalancerIp => "load-balancer IP",
            Match::NodePort => "node port",
        }
    }
}

/// What happens to the packet.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Verdict {
    /// DNAT to one of `backends`.
    Forward {
        backends: Vec<Backend>,
        /// Source NATed (KUBE-MARK-MASQ / mark-for-masquerade), for every backend but a
        /// hairpin one (see [`Backend::masquerade`]).
        masquerade: bool,
        /// ClientIP affinity: the first packet picks, later ones stick for this many seconds.
        affinity_seconds: Option<u32>,
    },
    /// Refused (TCP reset / ICMP port unreachable).
    Reject,
    /// Dropped silently.
    Drop,
    /// No service rule touches it. `local`: the destination is a node address, so the
    /// node's own stack answers (refused when nothing listens); else it is routed on.
    NoMatch { local: bool },
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Backend {
    pub addr: String,
    /// Of a new connection (uniform: iptables' statistic chain and nft's numgen both are).
    pub probability: f64,
    /// This backend's connections are masqueraded (the flow's decision, or a hairpin:
    /// the backend is the sender).
    pub masquerade: bool,
    pub local: bool,
}

/// One decision, for humans; `rule` names the kind of rule that implements it so that a
/// back end can show its own ([`Step::rule`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Step {
    pub rule: Rule,
    pub text: String,
}

/// The kinds of rule a step stands for (a back end maps each to its chains or map entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    Source,
    ServiceMatch,
    Firewall,
    ExternalPolicy,
    ClusterPolicy,
    LocalPolicy,
    NoEndpoints,
    Masquerade,
    Affinity,
    Endpoints,
    NoMatch,
}

#[derive(Clone, Debug, Serialize)]
pub struct Trace {
    pub mode: Mode,
    pub origin: Origin,
    /// The matched service port: its `ns/name:port` and how it matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub matched: Option<Match>,
    /// Index into the view's ports (not serialised: the CLI's rule lookup uses it).
    #[serde(skip)]
    pub port_index: Option<usize>,
    pub steps: Vec<Step>,
    pub verdict: Verdict,
}

fn is_local_addr(view: &NodeView, p: &Packet, ip: &IpAddr) -> bool {
    ip.is_loopback() || view.node_ips.contains(ip) || p.local_ips.contains(ip)
}

/// Trace `p` through `view`'s rules in `mode`.
pub fn trace(view: &NodeView, p: &Packet, mode: Mode) -> Trace {
    let mut t = Trace {
        mode,
        origin: Origin::Outside,
        service: None,
        matched: None,
        port_index: None,
        steps: Vec::new(),
        verdict: Verdict::NoMatch { local: false },
    };
    let step = |t: &mut Trace, rule: Rule, text: String| t.steps.push(Step { rule, text });

    // Origin. A packet to loopback can only come from the node itself.
    let detector_local = match &view.local_detector {
        Some(LocalDetector::Cidr(c)) => Some(c.contains(&p.src)),
        // Interface detectors need the arrival interface, which a trace does not have.
        _ => None,
    };
    t.origin = if p.dst.is_loopback() || p.src.is_loopback() || view.node_ips.contains(&p.src) {
        Origin::Node
    } else if detector_local == Some(true) {
        Origin::Pod
    } else {
        Origin::Outside
    };
    let why = match (&view.local_detector, t.origin) {
        (_, Origin::Node) => "a node address: the node's own packet (OUTPUT)".to_string(),
        (Some(LocalDetector::Cidr(c)), Origin::Pod) => format!("inside {c}: a pod"),
        (Some(LocalDetector::Cidr(c)), _) => format!("outside {c}: off-cluster"),
        (Some(_), _) => {
            "interface detector: the interface is unknown here, taken as off-cluster".to_string()
        }
        (None, _) => "no local-traffic detector: off-cluster".to_string(),
    };
    step(&mut t, Rule::Source, format!("source {}: {why}", p.src));

    // Which service port matches: cluster IP, external IP, LB IP, then node port.
    let same = |pv: &PortView| pv.protocol == p.proto;
    let found = view.ports.iter().enumerate().find_map(|(i, pv)| {
        if !same(pv) {
            return None;
        }
        if pv.cluster_ip == Some(p.dst) && pv.port == p.port {
            return Some((i, Match::ClusterIp));
        }
        if pv.port == p.port && pv.external_ips.contains(&p.dst) {
            return Some((i, Match::ExternalIp));
        }
        if pv.port == p.port && pv.load_balancer_ips.contains(&p.dst) {
            return Some((i, Match::LoadBalancerIp));
        }
        None
    });
    let found = found.or_else(|| {
        view.ports.iter().enumerate().find_map(|(i, pv)| {
            (same(pv) && pv.node_port == Some(p.port) && node_port_addr(view, p, mode))
                .then_some((i, Match::NodePort))
        })
    });
    let Some((i, how)) = found else {
        no_match(view, p, mode, &mut t);
        return t;
    };
    let pv = &view.ports[i];
    t.service = Some(pv.spn.clone());
    t.matched = Some(how);
    t.port_index = Some(i);
    step(
        &mut t,
        Rule::ServiceMatch,
        format!(
            "{} {}:{}/{} is {}'s {}",
            how.describe(),
            p.dst,
            p.port,
            p.proto.lower(),
            pv.spn,
            how.describe()
        ),
    );
    if how == Match::ClusterIp {
        internal(view, p, pv, &mut t);
    } else {
        external(view, p, pv, how, mode, &mut t);
    }
    t
}

/// Whether `p.dst` accepts node ports in `mode`.
fn node_port_addr(view: &NodeView, p: &Packet, mode: Mode) -> bool {
    if p.dst.is_loopback() {
        // Only iptables mode has localhost node ports (nftables never accepts them).
        return mode == Mode::Iptables && view.localhost_node_ports;
    }
    match &view.node_port_addresses {
        NodePortAddresses::All => is_local_addr(view, p, &p.dst),
        NodePortAddresses::Ips(ips) => ips.contains(&p.dst),
    }
}

fn no_match(view: &NodeView, p: &Packet, mode: Mode, t: &mut Trace) {
    let local = is_local_addr(view, p, &p.dst);
    if mode == Mode::Nftables {
        // nftables mode rejects a known cluster IP's other ports and drops unallocated
        // addresses of the service CIDRs.
        if view.ports.iter().any(|pv| pv.cluster_ip == Some(p.dst)) {
            t.steps.push(Step {
                rule: Rule::NoMatch,
                text: format!("{} is a cluster IP without this port: rejected", p.dst),
            });
            t.verdict = Verdict::Reject;
            return;
        }
        if let Some(c) = view.service_cidrs.iter().find(|c| c.contains(&p.dst)) {
            t.steps.push(Step {
                rule: Rule::NoMatch,
                text: format!(
                    "{} is in the service CIDR {c} but not allocated: dropped",
                    p.dst
                ),
            });
            t.verdict = Verdict::Drop;
            return;
        }
    }
    if mode == Mode::Iptables && local {
        // iptables mode's no-endpoint rules for node ports match every local address
        // (`-m addrtype --dst-type LOCAL`), whatever nodePortAddresses says; they are
        // in INPUT, which the node's own packets to itself also take.
        if let Some(pv) = view.ports.iter().find(|pv| {
            pv.protocol == p.proto && pv.node_port == Some(p.port) && !pv.has_external_endpoints
        }) {
            t.steps.push(Step {
                rule: Rule::NoEndpoints,
                text: format!(
                    "{}'s node port {} has no endpoint for external traffic; its filter \
                     rule matches any local address: {}",
                    pv.spn,
                    p.port,
                    verdict_word(pv.no_endpoints_verdict)
                ),
            });
            t.port_index = view.ports.iter().position(|x| std::ptr::eq(x, pv));
            t.service = Some(pv.spn.clone());
            t.verdict = no_endpoints(pv);
            return;
        }
    }
    t.steps.push(Step {
        rule: Rule::NoMatch,
        text: if local {
            format!(
                "no service port matches {}:{}/{}: delivered to the node itself",
                p.dst,
                p.port,
                p.proto.lower()
            )
        } else {
            format!(
                "no service port matches {}:{}/{}: routed on unchanged",
                p.dst,
                p.port,
                p.proto.lower()
            )
        },
    });
    t.verdict = Verdict::NoMatch { local };
}

fn verdict_word(v: NoEndpointsVerdict) -> &'static str {
    match v {
        NoEndpointsVerdict::Reject => "REJECT (no usable endpoint anywhere)",
        NoEndpointsVerdict::Drop => "DROP (endpoints exist, none for this traffic policy here)",
    }
}

fn no_endpoints(pv: &PortView) -> Verdict {
    match pv.no_endpoints_verdict {
        NoEndpointsVerdict::Reject => Verdict::Reject,
        NoEndpointsVerdict::Drop => Verdict::Drop,
    }
}

/// Cluster-IP traffic: the internal policy's endpoint set; masquerade by masqueradeAll
/// or the detector.
fn internal(view: &NodeView, p: &Packet, pv: &PortView, t: &mut Trace) {
    if !pv.has_internal_endpoints {
        t.steps.push(Step {
            rule: Rule::NoEndpoints,
            text: format!(
                "no endpoint for cluster traffic{}: {}",
                if pv.internal_local {
                    " (internalTrafficPolicy: Local)"
                } else {
                    ""
                },
                verdict_word(pv.no_endpoints_verdict)
            ),
        });
        t.verdict = no_endpoints(pv);
        return;
    }
    let (set, rule, what) = if pv.internal_local {
        (
            &pv.local_endpoints,
            Rule::LocalPolicy,
            "internalTrafficPolicy: Local: the local endpoints",
        )
    } else {
        (
            &pv.cluster_endpoints,
            Rule::ClusterPolicy,
            "internalTrafficPolicy: Cluster: the cluster endpoints",
        )
    };
    t.steps.push(Step {
        rule,
        text: what.to_string(),
    });
    let (masq, why) = if view.masquerade_all {
        (true, "masqueradeAll".to_string())
    } else {
        match &view.local_detector {
            Some(LocalDetector::Cidr(c)) if !c.contains(&p.src) => {
                (true, format!("source outside {c} (off-cluster)"))
            }
            Some(LocalDetector::Cidr(c)) => (false, format!("source inside {c}")),
            Some(_) => (
                false,
                "interface detector: taken as a pod's (not decidable offline)".to_string(),
            ),
            None => (false, "no local-traffic detector".to_string()),
        }
    };
    forward(p, pv, set, masq, &why, t);
}

/// Traffic to an external IP, load-balancer IP or node port.
fn external(view: &NodeView, p: &Packet, pv: &PortView, how: Match, mode: Mode, t: &mut Trace) {
    let step = |t: &mut Trace, rule: Rule, text: String| t.steps.push(Step { rule, text });
    // Firewall (loadBalancerSourceRanges), before anything else where its chain exists.
    let firewall = how == Match::LoadBalancerIp
        && !pv.source_ranges.is_empty()
        && match mode {
            Mode::Iptables => pv.uses_firewall_chain.iptables,
            Mode::Nftables => pv.uses_firewall_chain.nftables,
        };
    if firewall {
        let allowed = pv.source_ranges.iter().find(|c| c.contains(&p.src));
        let own = pv.source_ranges_include_node && p.src == p.dst;
        if allowed.is_none() && !own {
            let ranges: Vec<String> = pv.source_ranges.iter().map(|c| c.to_string()).collect();
            step(
                t,
                Rule::Firewall,
                format!(
                    "source {} is not in loadBalancerSourceRanges [{}]: dropped",
                    p.src,
                    ranges.join(", ")
                ),
            );
            t.verdict = Verdict::Drop;
            return;
        }
        step(
            t,
            Rule::Firewall,
            match allowed {
                Some(c) => format!("loadBalancerSourceRanges: source allowed by {c}"),
                None => "loadBalancerSourceRanges: the node's own traffic to its LB IP".into(),
            },
        );
    }
    if !pv.uses_external_chain {
        // No endpoint anywhere (the external chain exists whenever there are some).
        if mode == Mode::Iptables && t.origin == Origin::Node && how != Match::NodePort {
            // iptables mode's REJECT is in KUBE-EXTERNAL-SERVICES, reached from INPUT
            // and FORWARD only: the node's own packet to an external address leaves.
            step(
                t,
                Rule::NoEndpoints,
                "no endpoints; the REJECT is not on the node's OUTPUT path: routed on".into(),
            );
            t.verdict = Verdict::NoMatch {
                local: is_local_addr(view, p, &p.dst),
            };
            return;
        }
        step(
            t,
            Rule::NoEndpoints,
            verdict_word(pv.no_endpoints_verdict).into(),
        );
        t.verdict = no_endpoints(pv);
        return;
    }
    // The external chain: short-circuits for pods and the node, then the policy.
    if t.origin == Origin::Pod && pv.external_local {
        step(
            t,
            Rule::ExternalPolicy,
            "a pod's traffic to an external destination: short-circuited to the cluster \
             endpoints (not masqueraded: externalTrafficPolicy Local keeps sources)"
                .into(),
        );
        return forward(
            p,
            pv,
            &pv.cluster_endpoints,
            false,
            "pod traffic, ETP Local",
            t,
        );
    }
    if t.origin == Origin::Node {
        step(
            t,
            Rule::ExternalPolicy,
            "the node's own traffic (source type LOCAL): masqueraded, to the cluster endpoints"
                .into(),
        );
        return forward(p, pv, &pv.cluster_endpoints, true, "source is the node", t);
    }
    if !pv.external_local {
        step(
            t,
            Rule::ExternalPolicy,
            "externalTrafficPolicy: Cluster: masqueraded, to the cluster endpoints".into(),
        );
        return forward(
            p,
            pv,
            &pv.cluster_endpoints,
            true,
            "external traffic with externalTrafficPolicy Cluster",
            t,
        );
    }
    if !pv.has_external_endpoints || pv.local_endpoints.is_empty() {
        step(
            t,
            Rule::NoEndpoints,
            format!(
                "externalTrafficPolicy: Local and no local endpoint: {}",
                verdict_word(pv.no_endpoints_verdict)
            ),
        );
        t.verdict = no_endpoints(pv);
        return;
    }
    step(
        t,
        Rule::LocalPolicy,
        "externalTrafficPolicy: Local: the local endpoints, source kept".into(),
    );
    forward(
        p,
        pv,
        &pv.local_endpoints,
        false,
        "externalTrafficPolicy Local keeps the client's address",
        t,
    )
}

fn forward(p: &Packet, pv: &PortView, set: &[u32], masq: bool, why: &str, t: &mut Trace) {
    t.steps.push(Step {
        rule: Rule::Masquerade,
        text: if masq {
            format!("masquerade: yes ({why})")
        } else {
            format!(
                "masquerade: no ({why}; a backend that is the sender is still hairpin-masqueraded)"
            )
        },
    });
    if let Some(s) = pv.affinity_timeout {
        t.steps.push(Step {
            rule: Rule::Affinity,
            text: format!("session affinity ClientIP: a source sticks to its backend for {s} s"),
        });
    }
    let n = set.len().max(1) as f64;
    let backends: Vec<Backend> = set
        .iter()
        .map(|&i| {
            let e = &pv.endpoints[i as usize];
            Backend {
                addr: e.addr.to_string(),
                probability: 1.0 / n,
                masquerade: masq || e.ip == p.src,
                local: e.is_local,
            }
        })
        .collect();
    let list: Vec<String> = backends
        .iter()
        .map(|b| {
            let mut s = format!("{} ({:.3}", b.addr, b.probability);
            if b.local {
                s += ", local";
            }
            if b.masquerade && !masq {
                s += ", hairpin: masqueraded";
            }
            s + ")"
        })
        .collect();
    t.steps.push(Step {
        rule: Rule::Endpoints,
        text: format!("DNAT to one of: {}", list.join(", ")),
    });
    t.verdict = Verdict::Forward {
        backends,
        masquerade: masq,
        affinity_seconds: pv.affinity_timeout,
    };
}

impl Trace {
    /// The text report: one numbered line per step, then the verdict.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for (i, st) in self.steps.iter().enumerate() {
            s += &format!("{:>2}. {}\n", i + 1, st.text);
        }
        s += "=> ";
        s += &match &self.verdict {
            Verdict::Forward { backends, .. } => {
                format!("forwarded to {} backend(s)", backends.len())
            }
            Verdict::Reject => "rejected".to_string(),
            Verdict::Drop => "dropped".to_string(),
            Verdict::NoMatch { local: true } => "not a service: the node's own stack".to_string(),
            Verdict::NoMatch { local: false } => "not a service: routed on".to_string(),
        };
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ServiceType, TrafficPolicy};
    use crate::net::IpFamily;
    use crate::testing::*;

    fn packet(src: &str, dst: &str, port: u16) -> Packet {
        Packet {
            src: ip(src),
            dst: ip(dst),
            port,
            proto: Protocol::TCP,
            local_ips: vec![],
        }
    }

    fn addrs(v: &Verdict) -> Vec<(String, bool)> {
        match v {
            Verdict::Forward { backends, .. } => backends
                .iter()
                .map(|b| (b.addr.clone(), b.masquerade))
                .collect(),
            other => panic!("not forwarded: {other:?}"),
        }
    }

    /// A NodePort service with ETP=Local: two endpoints elsewhere, one (terminating but
    /// serving) here.
    fn etp_local() -> NodeView {
        let mut p = port(
            "http",
            80,
            8080,
            endpoints(
                &["10.1.0.5@other", "10.2.0.7@node-a#serving-terminating"],
                8080,
            ),
        );
        p.node_port = Some(30080);
        let mut s = service("ns", "web", ServiceType::NodePort, "172.30.0.10", vec![p]);
        s.external_traffic_policy = TrafficPolicy::Local;
        let m = module(
            vec![s],
            vec![
                node("node-a", &NODE_IPS, None),
                node("other", &["192.168.0.3"], None),
            ],
        );
        view(&m, "node-a", IpFamily::IPv4)
    }

    #[test]
    fn external_local_uses_the_terminating_fallback_and_keeps_the_source() {
        let v = etp_local();
        let t = trace(
            &v,
            &packet("203.0.113.9", "192.168.0.2", 30080),
            Mode::Iptables,
        );
        assert_eq!(t.origin, Origin::Outside);
        assert_eq!(t.matched, Some(Match::NodePort));
        assert_eq!(addrs(&t.verdict), [("10.2.0.7:8080".to_string(), false)]);
        // Cluster IP traffic from a pod: the ready endpoint only, not masqueraded.
        let t = trace(&v, &packet("10.9.9.9", "172.30.0.10", 80), Mode::Nftables);
        assert_eq!(t.origin, Origin::Pod);
        assert_eq!(addrs(&t.verdict), [("10.1.0.5:8080".to_string(), false)]);
        // The node itself: masqueraded, to the cluster endpoints.
        let t = trace(
            &v,
            &packet("192.168.0.2", "192.168.0.2", 30080),
            Mode::Iptables,
        );
        assert_eq!(t.origin, Origin::Node);
        assert_eq!(addrs(&t.verdict), [("10.1.0.5:8080".to_string(), true)]);
    }

    #[test]
    fn node_ports_on_loopback_differ_by_mode() {
        let v = etp_local();
        let p = packet("127.0.0.1", "127.0.0.1", 30080);
        assert!(matches!(
            trace(&v, &p, Mode::Iptables).verdict,
            Verdict::Forward { .. }
        ));
        assert_eq!(
            trace(&v, &p, Mode::Nftables).verdict,
            Verdict::NoMatch { local: true }
        );
    }

    #[test]
    fn external_local_without_local_endpoints_drops() {
        let mut p = port("", 80, 8080, endpoints(&["10.1.0.5@other"], 8080));
        p.node_port = Some(30081);
        let mut s = service("ns", "api", ServiceType::NodePort, "172.30.0.11", vec![p]);
        s.external_traffic_policy = TrafficPolicy::Local;
        let m = module(vec![s], vec![node("node-a", &NODE_IPS, None)]);
        let v = view(&m, "node-a", IpFamily::IPv4);
        for mode in [Mode::Iptables, Mode::Nftables] {
            let t = trace(&v, &packet("203.0.113.9", "192.168.0.2", 30081), mode);
            assert_eq!(t.verdict, Verdict::Drop, "{mode:?}");
        }
    }

    #[test]
    fn ipv6_and_no_match() {
        let p = port("", 443, 8443, endpoints(&["fd00:10::5@node-a"], 8443));
        let s = service(
            "ns",
            "v6",
            ServiceType::ClusterIP,
            "fd00:10:96::20",
            vec![p],
        );
        let m = module(vec![s], vec![node("node-a", &NODE_IPS, None)]);
        let v = view(&m, "node-a", IpFamily::IPv6);
        let t = trace(
            &v,
            &packet("fd00:10::9", "fd00:10:96::20", 443),
            Mode::Nftables,
        );
        assert_eq!(
            addrs(&t.verdict),
            [("[fd00:10::5]:8443".to_string(), false)]
        );
        let t = trace(
            &v,
            &packet("fd00:10::9", "fd00:10:96::20", 80),
            Mode::Nftables,
        );
        assert_eq!(t.verdict, Verdict::Reject);
        let t = trace(
            &v,
            &packet("fd00:10::9", "fd00:10:96::20", 80),
            Mode::Iptables,
        );
        assert_eq!(t.verdict, Verdict::NoMatch { local: false });
    }
}
