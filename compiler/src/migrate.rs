//! `svc-compile migrate`: where moving a node from one proxy mode to another changes what
//! happens to a packet, and why.
//!
//! Pure: a [`Module`], one node's [`NodeView`] and two [`Mode`]s in, a [`NodeReport`] out.
//! Every flow is a packet made up for a client class ([`Client`]) and a frontend
//! ([`FrontendKind`]) of a service port, traced in both modes by [`crate::trace`] (the
//! engine of `svc-compile trace`: nothing here decides what a mode does); the two fates are
//! compared ([`Fate`]) and, where they differ, the places where the modes' rules differ
//! that the packet met ([`ModeRule`], recorded by the trace) are the reasons, each with
//! what either mode does there ([`behaviour`]).
//!
//! Invariant: the report is deterministic: flows in view order (service ports sorted, then
//! frontends, then client classes), reasons in [`ModeRule`] order, not-modelled counts
//! sorted by mode and reason.

use crate::ir::{Module, NodeView, Protocol};
use crate::net::{Cidr, IpFamily};
use crate::trace::{trace, Mode, ModeRule, Origin, Packet, Trace, Verdict};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Who sends the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Client {
    /// A pod on the node (an address of its podCIDR that is no endpoint).
    Pod,
    /// A pod on another node, whose packet reaches this node (node ports, external and
    /// load-balancer IPs; its cluster-IP traffic is its own node's).
    RemotePod,
    /// The node itself (its first IP of the family).
    Node,
    /// An external client on the LAN (an address in no CIDR the cluster knows).
    Lan,
    /// An external client that a load-balancer IP's source ranges admit.
    LanAllowed,
    /// An external client outside a load-balancer IP's source ranges.
    LanDenied,
    /// The node to 127.0.0.1 / ::1 (node ports).
    Localhost,
    /// A pod of the service sending to its own service (the first local endpoint).
    Hairpin,
}

impl Client {
    pub fn describe(self) -> &'static str {
        match self {
            Client::Pod => "a pod on the node",
            Client::RemotePod => "a pod on another node",
            Client::Node => "the node itself",
            Client::Lan => "a LAN client",
            Client::LanAllowed => "a LAN client inside the source ranges",
            Client::LanDenied => "a LAN client outside the source ranges",
            Client::Localhost => "the node on localhost",
            Client::Hairpin => "the service's own pod (hairpin)",
        }
    }
}

/// How the packet addresses the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FrontendKind {
    ClusterIp,
    /// A node port on a node address (or another local address given).
    NodePort,
    /// A node port on 127.0.0.1 / ::1.
    LocalhostNodePort,
    ExternalIp,
    LoadBalancerIp,
    /// A service address (cluster, external or load-balancer IP) on a port none of its
    /// service ports has.
    OtherPort,
    /// An address of a service CIDR that no service has.
    UnallocatedServiceIp,
}

impl FrontendKind {
    pub fn describe(self) -> &'static str {
        match self {
            FrontendKind::ClusterIp => "cluster IP",
            FrontendKind::NodePort => "node port",
            FrontendKind::LocalhostNodePort => "localhost node port",
            FrontendKind::ExternalIp => "external IP",
            FrontendKind::LoadBalancerIp => "load-balancer IP",
            FrontendKind::OtherPort => "another port of a service address",
            FrontendKind::UnallocatedServiceIp => "unallocated service IP",
        }
    }
}

/// One packet compared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Flow {
    /// The service port (`ns/name:port`), the service (`ns/name`) for another port of its
    /// address, none for an unallocated address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    pub protocol: &'static str,
    pub frontend: FrontendKind,
    /// `ip:port` (`[ip]:port`).
    #[serde(rename = "destination")]
    pub to: String,
    pub client: Client,
    #[serde(rename = "source")]
    pub from: IpAddr,
}

/// What a backend sees as the packet's source.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "addr")]
pub enum Sees {
    /// The sender's own address.
    Client,
    /// A node address (masqueraded, or the node's own packet).
    Node,
    /// A VIP the node's own packet left from (IPVS).
    Vip(IpAddr),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reached {
    pub addr: String,
    pub sees: Sees,
}

/// A packet's fate in one mode, in the terms the comparison uses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Fate {
    /// To one of `backends` (sorted by address); `sticky` with ClientIP affinity.
    Forward {
        backends: Vec<Reached>,
        sticky: bool,
    },
    /// Refused: TCP reset or ICMP port unreachable.
    Reject,
    /// `connect()` fails with EHOSTUNREACH (a socket load balancer without backends).
    Unreachable,
    Drop,
    /// No service rule: routed on as addressed.
    Routed,
    /// No service rule: the node's own stack (refused where nothing listens).
    Local,
}

impl Fate {
    fn of(t: &Trace) -> Result<Fate, String> {
        Ok(match &t.verdict {
            Verdict::Forward {
                backends,
                affinity_seconds,
                source,
                ..
            } => {
                let mut backends: Vec<Reached> = backends
                    .iter()
                    .map(|b| Reached {
                        addr: b.addr.clone(),
                        sees: if b.masquerade {
                            Sees::Node
                        } else if t.origin == Origin::Node {
                            source.map_or(Sees::Node, Sees::Vip)
                        } else {
                            Sees::Client
                        },
                    })
                    .collect();
                backends.sort_by(|a, b| a.addr.cmp(&b.addr));
                Fate::Forward {
                    backends,
                    sticky: affinity_seconds.is_some(),
                }
            }
            Verdict::Reject => Fate::Reject,
            Verdict::Unreachable => Fate::Unreachable,
            Verdict::Drop => Fate::Drop,
            Verdict::NoMatch { local: false } => Fate::Routed,
            Verdict::NoMatch { local: true } => Fate::Local,
            Verdict::NotModelled { why } => return Err(why.clone()),
        })
    }

    pub fn describe(&self) -> String {
        match self {
            Fate::Forward { backends, sticky } => {
                let all_same = backends.windows(2).all(|w| w[0].sees == w[1].sees);
                let sees = |s: &Sees| match s {
                    Sees::Client => "the client's address".to_string(),
                    Sees::Node => "a node address".to_string(),
                    Sees::Vip(ip) => format!("{ip} (the VIP)"),
                };
                let list: Vec<String> = backends
                    .iter()
                    .map(|b| {
                        if all_same {
                            b.addr.clone()
                        } else {
                            format!("{} (sees {})", b.addr, sees(&b.sees))
                        }
                    })
                    .collect();
                let mut s = format!("forwarded to {}", list.join(", "));
                if all_same {
                    if let Some(b) = backends.first() {
                        s += &format!("; the backend sees {}", sees(&b.sees));
                    }
                }
                if *sticky {
                    s += "; sticky (ClientIP affinity)";
                }
                s
            }
            Fate::Reject => "rejected (refused)".into(),
            Fate::Unreachable => "connect() fails: EHOSTUNREACH".into(),
            Fate::Drop => "dropped".into(),
            Fate::Routed => "no service rule: routed on as addressed".into(),
            Fate::Local => {
                "no service rule: the node's own stack (refused if nothing listens)".into()
            }
        }
    }
}

/// What differs between the two fates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aspect {
    /// Forwarded, refused, dropped or routed.
    Verdict,
    /// Which endpoints.
    Endpoints,
    /// The source address a backend sees (masquerade, hairpin, the IPVS VIP).
    Source,
    /// Session affinity.
    Affinity,
}

/// Why: a place where the two modes' rules differ, and what each does there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reason {
    pub rule: ModeRule,
    pub from: &'static str,
    pub to: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Difference {
    #[serde(flatten)]
    pub flow: Flow,
    /// The fate in `--from`'s mode and in `--to`'s.
    #[serde(rename = "before")]
    pub from: Fate,
    #[serde(rename = "after")]
    pub to: Fate,
    pub differs: Vec<Aspect>,
    pub why: Vec<Reason>,
}

/// Flows one mode's model does not cover, counted per reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NotModelled {
    pub mode: Mode,
    pub why: String,
    pub flows: usize,
}

/// One node view's comparison.
#[derive(Clone, Debug, Serialize)]
pub struct NodeReport {
    pub node: String,
    pub family: &'static str,
    /// Flows traced in both modes (those not modelled in one are not counted).
    pub compared: usize,
    pub differences: Vec<Difference>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_modelled: Vec<NotModelled>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub from: Mode,
    pub to: Mode,
    pub nodes: Vec<NodeReport>,
}

impl Report {
    pub fn differs(&self) -> bool {
        self.nodes.iter().any(|n| !n.differences.is_empty())
    }
}

/// What `mode` does at `rule`. Two modes whose texts are equal do the same there.
pub fn behaviour(rule: ModeRule, mode: Mode) -> &'static str {
    use Mode::*;
    use ModeRule::*;
    match (rule, mode) {
        (OtherPort, Iptables) => "no rule matches: routed on as addressed (a service address is not local)",
        // pkg/proxy/nftables/proxier.go: the cluster-ips-check chain rejects the
        // cluster-ips set's addresses on ports no service element took.
        (OtherPort, Nftables) => "a cluster IP's other ports are rejected (cluster-ips-check); other addresses are routed on",
        // pkg/proxy/ipvs/proxier.go, writeIptablesRules: KUBE-IPVS-FILTER rejects new
        // connections to KUBE-IPVS-IPS (every address bound to kube-ipvs0).
        (OtherPort, Ipvs) => "every service address is bound to kube-ipvs0: KUBE-IPVS-FILTER rejects new connections no virtual server took",
        (OtherPort, Ebpf) => "no service entry: the socket LB leaves the connection as addressed",
        (UnallocatedServiceIp, Nftables) => "dropped: an address of the service CIDRs that no service has (cluster-ips-check)",
        (UnallocatedServiceIp, Ebpf) => "no service entry: left as addressed",
        (UnallocatedServiceIp, _) => "no rule matches: routed on as addressed",
        (LocalhostNodePort, Iptables) => "served when localhostNodePorts is on (IPv4, route_localnet)",
        (LocalhostNodePort, Nftables) => "never served: nftables mode has no localhost node ports",
        // pkg/proxy/ipvs/proxier.go: syncProxyRules makes node-port virtual servers on the
        // node's IPs; writeIptablesRules returns loopback sources first.
        (LocalhostNodePort, Ipvs) => "never served: node-port virtual servers are on the node's IPs only",
        // Cilium bpf/bpf_sock.c, __sock4_xlate_fwd: sock4_wildcard_lookup_full finds the
        // 0.0.0.0 surrogate entry of a node port.
        (LocalhostNodePort, Ebpf) => "served through the node port's 0.0.0.0 / :: surrogate entry (written when node ports take every address)",
        // pkg/proxy/iptables/proxier.go: KUBE-EXTERNAL-SERVICES' node-port REJECT/DROP
        // match `-m addrtype --dst-type LOCAL`.
        (NodePortOtherAddress, Iptables) => "the no-endpoint REJECT/DROP of a node port matches every local address, whatever nodePortAddresses says",
        (NodePortOtherAddress, Nftables) => "the no-endpoint verdict of a node port matches the node-port addresses only: elsewhere the node's stack answers",
        (NodePortOtherAddress, Ipvs) => "no virtual server on that address: the node's stack answers",
        (NodePortOtherAddress, Ebpf) => "no service entry on that address: the node's stack answers",
        (FirewallWithoutEndpoints, Iptables) => "no KUBE-FW chain without endpoints: the no-endpoints REJECT answers first",
        (FirewallWithoutEndpoints, Nftables) => "the firewall is kept without endpoints (before DNAT): it drops first",
        (FirewallWithoutEndpoints, Ipvs) => "KUBE-LOAD-BALANCER-FW is filled without endpoints: filter INPUT drops first (the node's own packet meets the virtual server first)",
        (FirewallWithoutEndpoints, Ebpf) => "the socket LB does not check source ranges",
        (SourceRangesInNode, Iptables | Nftables) => "the firewall applies to every sender, pods and the node included (the node passes when a range holds its address)",
        (SourceRangesInNode, Ipvs) => "pods meet KUBE-SOURCE-RANGES-FIREWALL in INPUT; the node's own packet is dropped by KUBE-IPVS-OUT-FILTER unless a range holds a node IP",
        (SourceRangesInNode, Ebpf) => "not checked for sockets on the node (only Cilium's tc programs read the source-range map)",
        (NoEndpointsFromNode, Iptables) => "the REJECT is in KUBE-EXTERNAL-SERVICES (INPUT, FORWARD): the node's own packet leaves unanswered",
        (NoEndpointsFromNode, Nftables) => "the no-endpoints check also runs in filter-output: rejected",
        (NoEndpointsFromNode, Ipvs) => "the virtual server without real servers answers in LOCAL_OUT: refused",
        (NoEndpointsFromNode, Ebpf) => "connect() fails with EHOSTUNREACH",
        (ExternalFromInside, Iptables | Nftables) => "short-circuited to the cluster endpoints: the node masqueraded, pods masqueraded unless externalTrafficPolicy is Local",
        // pkg/proxy/ipvs/proxier.go, syncProxyRules: syncEndpoint(…, ExternalPolicyLocal(), …)
        // for external IPs, load-balancer IPs and node ports; the -LOCAL sets skip
        // KUBE-MARK-MASQ (ipsetWithIptablesChain).
        (ExternalFromInside, Ipvs) => "no short-circuit: the virtual server's real servers (by externalTrafficPolicy) for every sender, not masqueraded under Local",
        // Cilium bpf/lib/lb.h, lb4_lookup_service with the scope switch: sockets get a
        // two-scope service's internal scope.
        (ExternalFromInside, Ebpf) => "the internal scope: internalTrafficPolicy's endpoints, the destination rewritten only",
        (LocalFallback, Iptables | Nftables) => "a Local policy without a local endpoint drops",
        // pkg/proxy/ipvs/proxier.go, syncEndpoint (kubernetes#97081).
        (LocalFallback, Ipvs) => "a Local policy without a local endpoint takes the cluster endpoints, when the service has any in use (none when no policy of it is Cluster: then no real server, refused); not masqueraded under externalTrafficPolicy Local, so a remote endpoint's reply must come back through this node",
        (LocalFallback, Ebpf) => "internalTrafficPolicy Local without a local endpoint has no backend (EHOSTUNREACH); externalTrafficPolicy does not apply to sockets on the node",
        (NoBackends, Iptables | Nftables) => "REJECT (TCP reset, ICMP port unreachable), or DROP where endpoints exist elsewhere",
        (NoBackends, Ipvs) => "a virtual server without real servers: ICMP port unreachable",
        // Cilium bpf/bpf_sock.c, __sock4_xlate_fwd: a service whose count is 0.
        (NoBackends, Ebpf) => "connect() fails with EHOSTUNREACH",
        (Masquerade, Iptables | Nftables | Ipvs) => "marked for masquerade: the backend sees a node address",
        (Masquerade, Ebpf) => "the socket LB rewrites the destination only: the backend sees the sender's own address",
        (NodeSourceVip, Ipvs) => "the VIP is on kube-ipvs0, so the node's packet leaves from the VIP; not masqueraded, the backend sees the VIP",
        (NodeSourceVip, _) => "the node's packet leaves from a node address",
        (HairpinNotLocal, Iptables | Nftables) => "every endpoint's own rule masquerades a sender reaching itself",
        (HairpinNotLocal, Ipvs) => "KUBE-LOOP-BACK holds the endpoints known to be on this node only: an endpoint without nodeName reaching itself is not masqueraded (its reply is martian)",
        (HairpinNotLocal, Ebpf) => "the pod connects to itself directly",
    }
}

/// The aspects of a difference a rule can explain.
fn explains(rule: ModeRule) -> &'static [Aspect] {
    use Aspect::*;
    match rule {
        ModeRule::ExternalFromInside | ModeRule::LocalFallback => &[Verdict, Endpoints, Source],
        ModeRule::Masquerade | ModeRule::NodeSourceVip | ModeRule::HairpinNotLocal => &[Source],
        _ => &[Verdict],
    }
}

/// The aspects in which two fates differ (empty: the same fate). A REJECT and the node's
/// own stack with nothing listening are the same to a client: both refuse.
fn aspects(a: &Fate, b: &Fate) -> Vec<Aspect> {
    let refused = |f: &Fate| matches!(f, Fate::Reject | Fate::Local);
    if refused(a) && refused(b) {
        return Vec::new();
    }
    match (a, b) {
        (
            Fate::Forward {
                backends: x,
                sticky: s,
            },
            Fate::Forward {
                backends: y,
                sticky: t,
            },
        ) => {
            let mut v = Vec::new();
            let set = |r: &[Reached]| r.iter().map(|b| b.addr.clone()).collect::<BTreeSet<_>>();
            if set(x) != set(y) {
                v.push(Aspect::Endpoints);
            }
            let sees: BTreeMap<&str, &Sees> =
                y.iter().map(|b| (b.addr.as_str(), &b.sees)).collect();
            if x.iter()
                .any(|b| sees.get(b.addr.as_str()).is_some_and(|s| **s != b.sees))
            {
                v.push(Aspect::Source);
            }
            if s != t {
                v.push(Aspect::Affinity);
            }
            v
        }
        _ if a == b => Vec::new(),
        _ => vec![Aspect::Verdict],
    }
}

/// The reasons: rules met in either trace where the modes behave differently and that
/// explain one of the aspects; failing that, every such rule met.
fn reasons(ta: &Trace, tb: &Trace, from: Mode, to: Mode, differs: &[Aspect]) -> Vec<Reason> {
    let dropped = [ta, tb].iter().any(|t| t.verdict == Verdict::Drop);
    let met: BTreeSet<ModeRule> = ta
        .mode_rules
        .iter()
        .chain(&tb.mode_rules)
        .copied()
        .collect();
    let differing: Vec<ModeRule> = met
        .into_iter()
        .filter(|r| behaviour(*r, from) != behaviour(*r, to))
        .collect();
    let fitting: Vec<ModeRule> = differing
        .iter()
        .copied()
        .filter(|r| explains(*r).iter().any(|a| differs.contains(a)))
        .collect();
    let mut chosen = if fitting.is_empty() {
        differing
    } else {
        fitting
    };
    // Where one mode matches no service at all, that is the reason, not what the other
    // mode's rules did with the packet afterwards.
    const MATCH: [ModeRule; 4] = [
        ModeRule::OtherPort,
        ModeRule::UnallocatedServiceIp,
        ModeRule::LocalhostNodePort,
        ModeRule::NodePortOtherAddress,
    ];
    // A firewall that drops in one mode is why, not where the other mode sends it.
    const FIREWALL: [ModeRule; 2] = [
        ModeRule::FirewallWithoutEndpoints,
        ModeRule::SourceRangesInNode,
    ];
    // Localhost node ports explain a difference only where one mode serves them.
    if ta.matched.is_none() && tb.matched.is_none() && chosen.len() > 1 {
        chosen.retain(|r| *r != ModeRule::LocalhostNodePort);
    }
    // And a node port's no-endpoint rule on another address only where neither matched.
    if (ta.matched.is_some() || tb.matched.is_some()) && chosen.len() > 1 {
        chosen.retain(|r| *r != ModeRule::NodePortOtherAddress);
    }
    if chosen.iter().any(|r| MATCH.contains(r)) {
        chosen.retain(|r| MATCH.contains(r));
    } else if dropped && chosen.iter().any(|r| FIREWALL.contains(r)) {
        chosen.retain(|r| FIREWALL.contains(r));
    }
    // Only the source differs: the rules about sources say why.
    let source_only = |r: &ModeRule| explains(*r) == [Aspect::Source];
    if differs == [Aspect::Source] && chosen.iter().any(source_only) {
        chosen.retain(source_only);
    }
    // "No backends" is how a mode answers, rarely why the answers differ.
    if chosen.len() > 1 {
        chosen.retain(|r| *r != ModeRule::NoBackends);
    }
    chosen
        .into_iter()
        .map(|rule| Reason {
            rule,
            from: behaviour(rule, from),
            to: behaviour(rule, to),
        })
        .collect()
}

/// A packet to send, with who sends it.
struct Probe {
    flow: Flow,
    packet: Packet,
}

/// The first of `candidates` inside `within` (when given) that no CIDR of `avoid` holds and
/// that is none of `taken`.
fn pick(
    candidates: impl IntoIterator<Item = IpAddr>,
    avoid: &[Cidr],
    taken: &BTreeSet<IpAddr>,
) -> Option<IpAddr> {
    candidates
        .into_iter()
        .find(|ip| !taken.contains(ip) && !avoid.iter().any(|c| c.contains(ip)))
}

/// Host addresses of `c` from the top down (the broadcast address and the network address
/// left out), at most `n`.
fn from_top(c: &Cidr, n: u128) -> impl Iterator<Item = IpAddr> + '_ {
    let size = c.size();
    let last = if c.family() == IpFamily::IPv4 && size > 2 {
        size - 2
    } else {
        size.saturating_sub(1)
    };
    (0..n.min(last)).map(move |i| c.nth(last - i))
}

/// The clients' addresses for one view.
struct Senders {
    pod: Option<IpAddr>,
    remote_pod: Option<IpAddr>,
    node: Option<IpAddr>,
    lan: Option<IpAddr>,
}

fn senders(module: &Module, view: &NodeView) -> Senders {
    let fam = view.family;
    let of_family =
        |cs: &[Cidr]| -> Vec<Cidr> { cs.iter().copied().filter(|c| c.family() == fam).collect() };
    let mut taken: BTreeSet<IpAddr> = view.node_ips.iter().copied().collect();
    for pv in &view.ports {
        taken.extend(pv.endpoints.iter().map(|e| e.ip));
        taken.extend(pv.cluster_ip);
        taken.extend(&pv.external_ips);
        taken.extend(&pv.load_balancer_ips);
    }
    let here = module.nodes.iter().find(|n| n.name == view.node_name);
    let own_cidrs = here.map(|n| of_family(&n.pod_cidrs)).unwrap_or_default();
    let detector = match &view.local_detector {
        Some(crate::ir::LocalDetector::Cidr(c)) => vec![*c],
        _ => vec![],
    };
    let others: Vec<Cidr> = module
        .nodes
        .iter()
        .filter(|n| n.name != view.node_name)
        .flat_map(|n| of_family(&n.pod_cidrs))
        .collect();
    // A pod here: its podCIDR's highest addresses (no other node's); else the detector's.
    let pod = own_cidrs
        .iter()
        .chain(&detector)
        .find_map(|c| pick(from_top(c, 64), &others, &taken));
    let remote_pod = others
        .iter()
        .find_map(|c| pick(from_top(c, 64), &own_cidrs, &taken));
    let mut known: Vec<Cidr> = own_cidrs.clone();
    known.extend(&others);
    known.extend(&detector);
    known.extend(of_family(&module.proxy.cluster_cidrs));
    known.extend(&view.service_cidrs);
    for pv in &view.ports {
        known.extend(&pv.source_ranges);
    }
    let lan_candidates: Vec<IpAddr> = match fam {
        IpFamily::IPv4 => [
            [198, 51, 100, 201],
            [192, 0, 2, 201],
            [203, 0, 113, 201],
            [100, 64, 0, 201],
        ]
        .into_iter()
        .map(|o| IpAddr::V4(Ipv4Addr::from(o)))
        .collect(),
        IpFamily::IPv6 => [
            0x2001_0db8_ffff_0000u128 << 64 | 0x201,
            0x2001_0db8_fffe_0000u128 << 64 | 0x201,
        ]
        .into_iter()
        .map(|v| IpAddr::V6(Ipv6Addr::from(v)))
        .collect(),
    };
    Senders {
        pod,
        remote_pod,
        node: view.node_ips.first().copied(),
        lan: pick(lan_candidates, &known, &taken),
    }
}

fn join(ip: &IpAddr, port: u16) -> String {
    crate::net::join_host_port(ip, port)
}

/// The lowest port none of `used` holds (a service address's "other port").
fn free_port(used: &BTreeSet<u16>) -> u16 {
    (1..=u16::MAX).find(|p| !used.contains(p)).unwrap_or(1)
}

/// Every flow of one view (see the module docs for the classes and frontends).
fn probes(module: &Module, view: &NodeView, local_ips: &[IpAddr]) -> Vec<Probe> {
    let s = senders(module, view);
    let fam = view.family;
    let loopback = match fam {
        IpFamily::IPv4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpFamily::IPv6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
    };
    let local_ips: Vec<IpAddr> = local_ips
        .iter()
        .copied()
        .filter(|ip| IpFamily::of(ip) == fam && !view.node_ips.contains(ip))
        .collect();
    let mut out = Vec::new();
    let mut push = |service: Option<String>,
                    proto: Protocol,
                    frontend: FrontendKind,
                    dst: IpAddr,
                    port: u16,
                    client: Client,
                    src: Option<IpAddr>| {
        let Some(src) = src else { return };
        let on_node = match client {
            Client::Pod | Client::Hairpin => Some(true),
            Client::Node | Client::Localhost => Some(true),
            _ => Some(false),
        };
        out.push(Probe {
            flow: Flow {
                service,
                protocol: proto.as_str(),
                frontend,
                to: join(&dst, port),
                client,
                from: src,
            },
            packet: Packet {
                src,
                dst,
                port,
                proto,
                local_ips: local_ips.clone(),
                on_node,
            },
        });
    };
    let inside = [Client::Pod, Client::Node];
    for pv in &view.ports {
        let spn = Some(pv.spn.clone());
        let proto = pv.protocol;
        let hairpin = pv.endpoints.iter().find(|e| e.is_local).map(|e| e.ip);
        let mut add =
            |kind: FrontendKind, dst: IpAddr, port: u16, clients: &[(Client, Option<IpAddr>)]| {
                for (c, src) in clients {
                    push(spn.clone(), proto, kind, dst, port, *c, *src);
                }
            };
        if let Some(cip) = pv.cluster_ip {
            add(
                FrontendKind::ClusterIp,
                cip,
                pv.port,
                &[
                    (Client::Pod, s.pod),
                    (Client::Node, s.node),
                    (Client::Lan, s.lan),
                    (Client::Hairpin, hairpin),
                ],
            );
        }
        let outside = |ranges: &[Cidr]| -> Vec<(Client, Option<IpAddr>)> {
            let mut v = vec![
                (Client::Pod, s.pod),
                (Client::RemotePod, s.remote_pod),
                (Client::Node, s.node),
            ];
            if ranges.is_empty() {
                v.push((Client::Lan, s.lan));
            } else {
                // Inside a range: its first host (or the host itself).
                let allowed = ranges.iter().find_map(|c| {
                    let ip = if c.is_host() { c.addr } else { c.nth(1) };
                    (!view.node_ips.contains(&ip)).then_some(ip)
                });
                v.push((Client::LanAllowed, allowed));
                v.push((
                    Client::LanDenied,
                    s.lan.filter(|ip| !ranges.iter().any(|c| c.contains(ip))),
                ));
            }
            v.push((Client::Hairpin, hairpin));
            v
        };
        for ip in &pv.external_ips {
            add(FrontendKind::ExternalIp, *ip, pv.port, &outside(&[]));
        }
        for ip in &pv.load_balancer_ips {
            add(
                FrontendKind::LoadBalancerIp,
                *ip,
                pv.port,
                &outside(&pv.source_ranges),
            );
        }
        if let Some(np) = pv.node_port {
            let addrs: Vec<IpAddr> = view.node_ips.iter().chain(&local_ips).copied().collect();
            for ip in addrs {
                add(FrontendKind::NodePort, ip, np, &outside(&[]));
            }
            add(
                FrontendKind::LocalhostNodePort,
                loopback,
                np,
                &[(Client::Localhost, Some(loopback))],
            );
        }
    }
    // Another port of every service address (once per address and protocol).
    let mut addresses: BTreeMap<(IpAddr, Protocol), (String, FrontendKind, BTreeSet<u16>)> =
        BTreeMap::new();
    for pv in &view.ports {
        let svc = format!("{}/{}", pv.namespace, pv.name);
        let mut note = |ip: IpAddr, kind: FrontendKind| {
            addresses
                .entry((ip, pv.protocol))
                .or_insert_with(|| (svc.clone(), kind, BTreeSet::new()))
                .2
                .insert(pv.port);
        };
        if let Some(cip) = pv.cluster_ip {
            note(cip, FrontendKind::ClusterIp);
        }
        for ip in &pv.external_ips {
            note(*ip, FrontendKind::ExternalIp);
        }
        for ip in &pv.load_balancer_ips {
            note(*ip, FrontendKind::LoadBalancerIp);
        }
    }
    // Ports of every protocol are taken: a TCP probe must miss the UDP ports too only for
    // its own protocol, but one port free of all is clearer.
    let mut by_ip: BTreeMap<IpAddr, BTreeSet<u16>> = BTreeMap::new();
    for ((ip, _), (_, _, ports)) in &addresses {
        by_ip.entry(*ip).or_default().extend(ports);
    }
    let mut seen_ip = BTreeSet::new();
    for ((ip, _), (svc, _, _)) in &addresses {
        if view.node_ips.contains(ip) || !seen_ip.insert(*ip) {
            continue;
        }
        let port = free_port(&by_ip[ip]);
        for (c, src) in [
            (Client::Pod, s.pod),
            (Client::Node, s.node),
            (Client::Lan, s.lan),
        ] {
            push(
                Some(svc.clone()),
                Protocol::TCP,
                FrontendKind::OtherPort,
                *ip,
                port,
                c,
                src,
            );
        }
    }
    // An unallocated address of each service CIDR.
    let allocated: BTreeSet<IpAddr> = view.ports.iter().filter_map(|pv| pv.cluster_ip).collect();
    for c in &view.service_cidrs {
        if let Some(ip) = pick(from_top(c, 64), &[], &allocated) {
            for (cl, src) in inside
                .iter()
                .map(|c| (*c, if *c == Client::Pod { s.pod } else { s.node }))
            {
                push(
                    None,
                    Protocol::TCP,
                    FrontendKind::UnallocatedServiceIp,
                    ip,
                    80,
                    cl,
                    src,
                );
            }
        }
    }
    out
}

/// Compare `from` and `to` on one node view. `local_ips`: other addresses of the node
/// where node ports are reached (as `trace --local-ip`).
pub fn compare(
    module: &Module,
    view: &NodeView,
    from: Mode,
    to: Mode,
    local_ips: &[IpAddr],
) -> NodeReport {
    let mut report = NodeReport {
        node: view.node_name.clone(),
        family: match view.family {
            IpFamily::IPv4 => "IPv4",
            IpFamily::IPv6 => "IPv6",
        },
        compared: 0,
        differences: Vec::new(),
        not_modelled: Vec::new(),
    };
    let mut unmodelled: BTreeMap<(Mode, String), usize> = BTreeMap::new();
    for probe in probes(module, view, local_ips) {
        let (ta, tb) = (
            trace(view, &probe.packet, from),
            trace(view, &probe.packet, to),
        );
        let (fa, fb) = match (Fate::of(&ta), Fate::of(&tb)) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                for (m, r) in [(from, a), (to, b)] {
                    if let Err(why) = r {
                        *unmodelled.entry((m, why)).or_default() += 1;
                    }
                }
                continue;
            }
        };
        report.compared += 1;
        let differs = aspects(&fa, &fb);
        if differs.is_empty() {
            continue;
        }
        let why = reasons(&ta, &tb, from, to, &differs);
        report.differences.push(Difference {
            flow: probe.flow,
            from: fa,
            to: fb,
            differs,
            why,
        });
    }
    report.not_modelled = unmodelled
        .into_iter()
        .map(|((mode, why), flows)| NotModelled { mode, why, flows })
        .collect();
    report
}

/// `ns/name:port/PROTO`, or the service or address alone.
fn subject(f: &Flow) -> String {
    match &f.service {
        Some(s) if f.frontend == FrontendKind::OtherPort => format!("{s} (another port)"),
        Some(s) => format!("{s}/{}", f.protocol),
        None => "(no service)".into(),
    }
}

fn flow_line(f: &Flow) -> String {
    format!(
        "{} {} from {} {}",
        f.frontend.describe(),
        f.to,
        f.client.describe(),
        f.from
    )
}

/// `no difference`, `1 difference`, `N differences`.
fn count_differences(n: usize) -> String {
    match n {
        0 => "no difference".to_string(),
        1 => "1 difference".to_string(),
        k => format!("{k} differences"),
    }
}

/// The text report.
pub fn render_text(r: &Report) -> String {
    let (a, b) = (r.from.name(), r.to.name());
    let mut s = format!("svc-compile migrate: {a} -> {b}\n");
    for n in &r.nodes {
        let _ = writeln!(
            s,
            "\nnode {} ({}): {} in {} flows compared",
            n.node,
            n.family,
            count_differences(n.differences.len()),
            n.compared
        );
        let mut last = String::new();
        let mut i = 0;
        while i < n.differences.len() {
            let d = &n.differences[i];
            let subj = subject(&d.flow);
            if subj != last {
                let _ = writeln!(s, "  {subj}");
                last = subj;
            }
            // The flows of one subject that fare alike, for the same reasons, once.
            let alike = n.differences[i..]
                .iter()
                .take_while(|e| {
                    subject(&e.flow) == last && e.from == d.from && e.to == d.to && e.why == d.why
                })
                .count();
            for e in &n.differences[i..i + alike] {
                let _ = writeln!(s, "    {}", flow_line(&e.flow));
            }
            i += alike;
            let _ = writeln!(s, "      {a}: {}", d.from.describe());
            let _ = writeln!(s, "      {b}: {}", d.to.describe());
            for w in &d.why {
                let _ = writeln!(s, "      why ({}):", w.rule.name());
                let _ = writeln!(s, "        {a}: {}", w.from);
                let _ = writeln!(s, "        {b}: {}", w.to);
            }
        }
        for m in &n.not_modelled {
            let _ = writeln!(
                s,
                "  not modelled in {} ({} flows): {}",
                m.mode.name(),
                m.flows,
                m.why
            );
        }
    }
    s
}

/// The Markdown report (for a pull request or an issue).
pub fn render_markdown(r: &Report) -> String {
    let (a, b) = (r.from.name(), r.to.name());
    let mut s = format!("### svc-compile migrate: `{a}` → `{b}`\n");
    for n in &r.nodes {
        let _ = writeln!(
            s,
            "\n#### Node `{}` ({}): {} in {} flows compared\n",
            n.node,
            n.family,
            count_differences(n.differences.len()),
            n.compared
        );
        if !n.differences.is_empty() {
            let _ = writeln!(s, "| service | packet | `{a}` | `{b}` | why |");
            let _ = writeln!(s, "|---|---|---|---|---|");
            for d in &n.differences {
                let why: Vec<String> = d
                    .why
                    .iter()
                    .map(|w| format!("**{}**: {a}: {}; {b}: {}", w.rule.name(), w.from, w.to))
                    .collect();
                let _ = writeln!(
                    s,
                    "| `{}` | {} | {} | {} | {} |",
                    subject(&d.flow),
                    flow_line(&d.flow),
                    d.from.describe(),
                    d.to.describe(),
                    why.join("<br>")
                );
            }
        }
        for m in &n.not_modelled {
            let _ = writeln!(
                s,
                "- not modelled in `{}` ({} flows): {}",
                m.mode.name(),
                m.flows,
                m.why
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ServiceType, TrafficPolicy};
    use crate::testing::*;

    /// node-a (pods 10.1.0.0/24) and other (10.2.0.0/24); `web`: a NodePort with
    /// externalTrafficPolicy Local whose only endpoint is on `other`, and externalIPs.
    fn cluster(etp_local: bool, itp_local: bool) -> Module {
        let mut p = port("http", 80, 8080, endpoints(&["10.2.0.7@other"], 8080));
        p.node_port = Some(30080);
        let mut s = service("ns", "web", ServiceType::NodePort, "172.30.0.10", vec![p]);
        if etp_local {
            s.external_traffic_policy = TrafficPolicy::Local;
        }
        if itp_local {
            s.internal_traffic_policy = TrafficPolicy::Local;
        }
        let mut a = node("node-a", &NODE_IPS, None);
        a.pod_cidrs = vec![cidr("10.1.0.0/24")];
        let mut o = node("other", &["192.168.0.3"], None);
        o.pod_cidrs = vec![cidr("10.2.0.0/24")];
        module(vec![s], vec![a, o])
    }

    fn run(m: &Module, from: Mode, to: Mode) -> NodeReport {
        compare(m, &view(m, "node-a", IpFamily::IPv4), from, to, &[])
    }

    fn find(r: &NodeReport, kind: FrontendKind, client: Client) -> Option<&Difference> {
        r.differences
            .iter()
            .find(|d| d.flow.frontend == kind && d.flow.client == client)
    }

    fn rules(d: &Difference) -> Vec<ModeRule> {
        d.why.iter().map(|w| w.rule).collect()
    }

    #[test]
    fn a_mode_against_itself_never_differs() {
        let m = cluster(true, false);
        for mode in Mode::ALL {
            let r = run(&m, mode, mode);
            assert!(r.differences.is_empty(), "{mode:?}: {:?}", r.differences);
            assert!(r.compared > 0);
        }
    }

    #[test]
    fn iptables_to_nftables() {
        let r = run(&cluster(false, false), Mode::Iptables, Mode::Nftables);
        let d = find(&r, FrontendKind::LocalhostNodePort, Client::Localhost).expect("localhost");
        assert!(matches!(d.from, Fate::Forward { .. }), "{d:?}");
        assert_eq!(d.to, Fate::Local);
        assert_eq!(rules(d), [ModeRule::LocalhostNodePort]);
        let d = find(&r, FrontendKind::OtherPort, Client::Pod).expect("other port");
        assert_eq!((&d.from, &d.to), (&Fate::Routed, &Fate::Reject));
        assert_eq!(rules(d), [ModeRule::OtherPort]);
        let d = find(&r, FrontendKind::UnallocatedServiceIp, Client::Node).expect("unallocated");
        assert_eq!((&d.from, &d.to), (&Fate::Routed, &Fate::Drop));
        // Nothing else: the service's own flows fare alike.
        assert!(r.differences.iter().all(|d| matches!(
            d.flow.frontend,
            FrontendKind::LocalhostNodePort
                | FrontendKind::OtherPort
                | FrontendKind::UnallocatedServiceIp
        )));
        // Reversed, the same flows, the fates swapped.
        let back = run(&cluster(false, false), Mode::Nftables, Mode::Iptables);
        assert_eq!(back.differences.len(), r.differences.len());
        for (x, y) in r.differences.iter().zip(&back.differences) {
            assert_eq!((&x.from, &x.to), (&y.to, &y.from));
        }
    }

    #[test]
    fn ipvs_falls_back_to_the_cluster_endpoints() {
        let r = run(&cluster(true, false), Mode::Iptables, Mode::Ipvs);
        let d = find(&r, FrontendKind::NodePort, Client::Lan).expect("LAN to the node port");
        assert_eq!(d.from, Fate::Drop);
        assert_eq!(
            d.to,
            Fate::Forward {
                backends: vec![Reached {
                    addr: "10.2.0.7:8080".into(),
                    sees: Sees::Client
                }],
                sticky: false
            }
        );
        assert_eq!(rules(d), [ModeRule::LocalFallback]);
        // A pod: iptables short-circuits to the cluster endpoints unmasqueraded, as IPVS
        // falls back: the same fate.
        assert!(find(&r, FrontendKind::NodePort, Client::Pod).is_none());
        // Another port of the cluster IP: on kube-ipvs0, rejected.
        let d = find(&r, FrontendKind::OtherPort, Client::Lan).expect("other port");
        assert_eq!((&d.from, &d.to), (&Fate::Routed, &Fate::Reject));
        assert!(find(&r, FrontendKind::UnallocatedServiceIp, Client::Pod).is_none());
    }

    #[test]
    fn ebpf_follows_the_internal_policy_and_leaves_sources() {
        let r = run(&cluster(false, true), Mode::Nftables, Mode::Ebpf);
        // The node to its node port: nftables masquerades to the cluster endpoints; the
        // socket LB takes the internal policy's (local: none here).
        let d = find(&r, FrontendKind::NodePort, Client::Node).expect("node to node port");
        assert!(matches!(d.from, Fate::Forward { .. }));
        assert_eq!(d.to, Fate::Unreachable);
        assert!(rules(d).contains(&ModeRule::ExternalFromInside), "{d:?}");
        // LAN clients and remote pods are not the socket LB's.
        assert!(find(&r, FrontendKind::NodePort, Client::Lan).is_none());
        assert!(r
            .not_modelled
            .iter()
            .any(|n| n.mode == Mode::Ebpf && n.flows > 0));
        // ETP=Cluster node port from a pod: masqueraded by kube-proxy, not by the socket LB
        // (its endpoints: none local under ITP Local, so take a Cluster service).
        let r = run(&cluster(false, false), Mode::Nftables, Mode::Ebpf);
        let d = find(&r, FrontendKind::NodePort, Client::Pod).expect("pod to node port");
        assert_eq!(d.differs, [Aspect::Source]);
        assert_eq!(rules(d), [ModeRule::Masquerade]);
    }

    #[test]
    fn every_difference_has_a_reason() {
        for (etp, itp) in [(false, false), (true, false), (false, true), (true, true)] {
            let m = cluster(etp, itp);
            for from in Mode::ALL {
                for to in Mode::ALL {
                    for d in run(&m, from, to).differences {
                        assert!(!d.why.is_empty(), "{from:?} -> {to:?}: {d:?}");
                        for w in &d.why {
                            assert_ne!(w.from, w.to, "{d:?}");
                        }
                    }
                }
            }
        }
    }
}
