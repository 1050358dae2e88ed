//! `svc-compile trace`: what one node does with one packet, answered from its [`NodeView`].
//!
//! Pure: a view, a packet and a proxy mode in, a [`Trace`] out (the steps taken, in the
//! order kube-proxy's rules take them, and the [`Verdict`]). Every decision is read from
//! the view (which endpoint set, masquerade settings, REJECT/DROP, which chains exist);
//! nothing here looks at Kubernetes objects. What the modes do differently is decided by
//! `mode` (the view's [`crate::ir::ByMode`] fields and the differences that live in the
//! rules or the datapath themselves, each commented where it is decided, with the
//! upstream file and function). Every such decision point a packet meets is recorded in
//! [`Trace::mode_rules`] (whatever the mode), which is how `svc-compile migrate`
//! (`crate::migrate`) says why two modes treat a packet differently.
//!
//! Modes: kube-proxy's iptables, nftables and IPVS proxiers, and `Ebpf`: Cilium's socket
//! load balancer as the ebpf target lays it out (connect-time translation of sockets on
//! the node: the node itself and its pods). Traffic that reaches the node from elsewhere
//! is served by Cilium's tc/XDP NodePort programs, which the ebpf target does not model:
//! such a packet's verdict is [`Verdict::NotModelled`].
//!
//! Invariant: the trace is deterministic; backends are listed in the view's endpoint
//! order (sorted by `ip:port`).

use crate::ir::{
    LocalDetector, NoEndpointsVerdict, NodePortAddresses, NodeView, PortView, Protocol,
};
use serde::Serialize;
use std::net::IpAddr;

/// The proxy mode whose rules are traced (they differ in a few places).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Iptables,
    Nftables,
    /// kube-proxy's IPVS mode (virtual servers, its ipsets and iptables rules).
    Ipvs,
    /// Cilium's socket load balancer, as the ebpf target lays out its maps.
    Ebpf,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Iptables, Mode::Nftables, Mode::Ipvs, Mode::Ebpf];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Ipvs => "ipvs",
            Mode::Ebpf => "ebpf",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == s)
    }

    /// One of kube-proxy's modes (not a socket load balancer).
    fn kube_proxy(self) -> bool {
        self != Mode::Ebpf
    }
}

/// A place where the modes' rules differ, met by a packet (recorded in every mode, so that
/// two traces of one packet name the same places). `crate::migrate` says what each mode
/// does there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModeRule {
    /// A service address (cluster IP; in IPVS mode any address on kube-ipvs0) on a port
    /// no service port has.
    OtherPort,
    /// An address of a service CIDR that no service has.
    UnallocatedServiceIp,
    /// A node port on 127.0.0.1 / ::1.
    LocalhostNodePort,
    /// A node port on a local address that does not take node ports
    /// (nodePortAddresses), whose service has no endpoint for external traffic.
    NodePortOtherAddress,
    /// loadBalancerSourceRanges of a service without endpoints.
    FirewallWithoutEndpoints,
    /// loadBalancerSourceRanges and traffic from inside the node.
    SourceRangesInNode,
    /// The node's own packet to an external or load-balancer IP of a service without
    /// endpoints.
    NoEndpointsFromNode,
    /// A pod's or the node's packet to an external destination (node port, external IP,
    /// load-balancer IP): which endpoints, masqueraded or not.
    ExternalFromInside,
    /// A Local traffic policy with no local endpoint on this node.
    LocalFallback,
    /// A service port without an endpoint to send this traffic to.
    NoBackends,
    /// Whether the source is rewritten.
    Masquerade,
    /// The node's own packet to a VIP on kube-ipvs0 leaves from that VIP.
    NodeSourceVip,
    /// A pod reaching itself through the service, not known to be local.
    HairpinNotLocal,
}

impl ModeRule {
    /// The kebab-case name (as serialised).
    pub fn name(self) -> &'static str {
        match self {
            ModeRule::OtherPort => "other-port",
            ModeRule::UnallocatedServiceIp => "unallocated-service-ip",
            ModeRule::LocalhostNodePort => "localhost-node-port",
            ModeRule::NodePortOtherAddress => "node-port-other-address",
            ModeRule::FirewallWithoutEndpoints => "firewall-without-endpoints",
            ModeRule::SourceRangesInNode => "source-ranges-in-node",
            ModeRule::NoEndpointsFromNode => "no-endpoints-from-node",
            ModeRule::ExternalFromInside => "external-from-inside",
            ModeRule::LocalFallback => "local-fallback",
            ModeRule::NoBackends => "no-backends",
            ModeRule::Masquerade => "masquerade",
            ModeRule::NodeSourceVip => "node-source-vip",
            ModeRule::HairpinNotLocal => "hairpin-not-local",
        }
    }
}

/// One packet as it reaches the node's rules.
#[derive(Clone, Debug)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub port: u16,
    pub proto: Protocol,
    /// Addresses local to the node besides the view's node IPs and loopback (e.g. a pod
    /// gateway address): where node ports may also be reached, and whose packets are the
    /// node's own (a node address the Node object does not list).
    pub local_ips: Vec<IpAddr>,
    /// Whether the sender is a socket on this node (the node itself, or one of its pods),
    /// when the caller knows: what a socket load balancer ([`Mode::Ebpf`]) serves. `None`:
    /// only the node's own packets are taken as on the node.
    pub on_node: Option<bool>,
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
        /// The source address the node's own packet leaves with, when it is not a node
        /// address (IPVS: a VIP on kube-ipvs0 is its own local route's preferred source).
        #[serde(skip_serializing_if = "Option::is_none")]
        source: Option<IpAddr>,
    },
    /// Refused (TCP reset / ICMP port unreachable).
    Reject,
    /// The socket load balancer refuses the connection itself: `connect()` fails with
    /// EHOSTUNREACH (a service without backends).
    Unreachable,
    /// What this mode does with the packet is not modelled (said why).
    NotModelled { why: String },
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
    /// The places where the modes differ that the packet met, in order, without repeats
    /// (not serialised: `migrate` reads them).
    #[serde(skip)]
    pub mode_rules: Vec<ModeRule>,
}

impl Trace {
    fn met(&mut self, r: ModeRule) {
        if !self.mode_rules.contains(&r) {
            self.mode_rules.push(r);
        }
    }
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
        mode_rules: Vec::new(),
    };
    let step = |t: &mut Trace, rule: Rule, text: String| t.steps.push(Step { rule, text });

    // Origin. A packet to loopback can only come from the node itself.
    let detector_local = match &view.local_detector {
        Some(LocalDetector::Cidr(c)) => Some(c.contains(&p.src)),
        // Interface detectors need the arrival interface, which a trace does not have.
        _ => None,
    };
    t.origin = if p.dst.is_loopback() || is_local_addr(view, p, &p.src) {
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

    // Cilium's socket LB translates at connect() in the sockets of the node's cgroup: the
    // node's own and its pods'. A packet from elsewhere meets tc/XDP programs instead.
    if mode == Mode::Ebpf && t.origin != Origin::Node && p.on_node != Some(true) {
        not_modelled(
            &mut t,
            "a packet from outside the node meets Cilium's tc/XDP NodePort programs, which \
             the ebpf target does not model (it models the socket load balancer)",
        );
        return t;
    }

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
    let node_port = |pv: &PortView| same(pv) && pv.node_port == Some(p.port);
    if p.dst.is_loopback() && found.is_none() && view.ports.iter().any(node_port) {
        t.met(ModeRule::LocalhostNodePort);
    }
    if mode == Mode::Ebpf
        && found.is_none()
        && view.node_port_addresses == NodePortAddresses::All
        && !p.dst.is_loopback()
        && !view.node_ips.contains(&p.dst)
        && p.local_ips.contains(&p.dst)
        && view.ports.iter().any(node_port)
    {
        not_modelled(
            &mut t,
            "a node port on a local address the Node object does not list: Cilium finds \
             it through its device detection, which the ebpf target does not model",
        );
        return t;
    }
    let found = found.or_else(|| {
        view.ports.iter().enumerate().find_map(|(i, pv)| {
            (node_port(pv) && node_port_addr(view, p, mode)).then_some((i, Match::NodePort))
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
    match (mode, how) {
        (Mode::Ebpf, _) => socket_lb(p, pv, how, &mut t),
        (_, Match::ClusterIp) => internal(view, p, pv, mode, &mut t),
        (Mode::Ipvs, _) => ipvs_external(view, p, pv, how, &mut t),
        _ => external(view, p, pv, how, mode, &mut t),
    }
    t
}

fn not_modelled(t: &mut Trace, why: &str) {
    t.steps.push(Step {
        rule: Rule::NoMatch,
        text: format!("not modelled: {why}"),
    });
    t.verdict = Verdict::NotModelled { why: why.into() };
}

/// Whether `p.dst` accepts node ports in `mode`.
fn node_port_addr(view: &NodeView, p: &Packet, mode: Mode) -> bool {
    if p.dst.is_loopback() {
        return match mode {
            // Only iptables mode has localhost node ports (route_localnet); nftables never
            // accepts them; IPVS mode makes node-port virtual servers on the node's IPs
            // only and returns loopback sources early (`syncProxyRules` and
            // `writeIptablesRules` in pkg/proxy/ipvs/proxier.go).
            Mode::Iptables => view.localhost_node_ports,
            Mode::Nftables | Mode::Ipvs => false,
            // The socket LB finds 127.0.0.1:nodePort through the 0.0.0.0 / :: surrogate
            // entry (`sock4_wildcard_lookup_full` in Cilium's bpf/bpf_sock.c), which the
            // target writes when node ports take every address.
            Mode::Ebpf => view.node_port_addresses == NodePortAddresses::All,
        };
    }
    match (&view.node_port_addresses, mode) {
        (NodePortAddresses::All, Mode::Ebpf) => view.node_ips.contains(&p.dst),
        (NodePortAddresses::All, _) => is_local_addr(view, p, &p.dst),
        (NodePortAddresses::Ips(ips), _) => ips.contains(&p.dst),
    }
}

/// The addresses IPVS mode binds to kube-ipvs0: every service port's cluster IP, external
/// and load-balancer IPs that no other interface has (`syncProxyRules`, `shouldBind`).
fn ipvs_bound(view: &NodeView, ip: &IpAddr) -> bool {
    view.ports
        .iter()
        .filter(|pv| pv.cluster_ip.is_some())
        .any(|pv| {
            pv.cluster_ip == Some(*ip)
                || ((pv.external_ips.contains(ip) || pv.load_balancer_ips.contains(ip))
                    && !view.node_ips.contains(ip))
        })
}

fn no_match(view: &NodeView, p: &Packet, mode: Mode, t: &mut Trace) {
    let local = is_local_addr(view, p, &p.dst);
    let is_cluster_ip = view.ports.iter().any(|pv| pv.cluster_ip == Some(p.dst));
    if is_cluster_ip || (mode == Mode::Ipvs && ipvs_bound(view, &p.dst)) {
        t.met(ModeRule::OtherPort);
    }
    let unallocated = if is_cluster_ip {
        None
    } else {
        view.service_cidrs.iter().find(|c| c.contains(&p.dst))
    };
    if unallocated.is_some() {
        t.met(ModeRule::UnallocatedServiceIp);
    }
    if mode == Mode::Nftables {
        // nftables mode rejects a known cluster IP's other ports and drops unallocated
        // addresses of the service CIDRs.
        if is_cluster_ip {
            t.steps.push(Step {
                rule: Rule::NoMatch,
                text: format!("{} is a cluster IP without this port: rejected", p.dst),
            });
            t.verdict = Verdict::Reject;
            return;
        }
        if let Some(c) = unallocated {
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
    if mode == Mode::Ipvs && ipvs_bound(view, &p.dst) {
        // Every service address is on kube-ipvs0, so the packet is local, and
        // KUBE-IPVS-FILTER rejects new connections to KUBE-IPVS-IPS that no virtual
        // server took (`writeIptablesRules` in pkg/proxy/ipvs/proxier.go).
        t.steps.push(Step {
            rule: Rule::NoMatch,
            text: format!(
                "{} is on kube-ipvs0 without a virtual server for this port: KUBE-IPVS-FILTER \
                 rejects it",
                p.dst
            ),
        });
        t.verdict = Verdict::Reject;
        return;
    }
    let np = view.ports.iter().find(|pv| {
        pv.protocol == p.proto && pv.node_port == Some(p.port) && !pv.has_external_endpoints
    });
    if local && np.is_some() {
        t.met(ModeRule::NodePortOtherAddress);
    }
    if mode == Mode::Iptables && local {
        // iptables mode's no-endpoint rules for node ports match every local address
        // (`-m addrtype --dst-type LOCAL`), whatever nodePortAddresses says; they are
        // in INPUT, which the node's own packets to itself also take.
        if let Some(pv) = np {
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

/// IPVS mode's real servers for a virtual server (`syncEndpoint` in
/// pkg/proxy/ipvs/proxier.go): with a Local policy the local endpoints or, when there is
/// none, the cluster endpoints (kubernetes#97081); otherwise the cluster endpoints.
fn ipvs_reals<'a>(pv: &'a PortView, local_policy: bool, t: &mut Trace) -> &'a [u32] {
    if !local_policy {
        return &pv.cluster_endpoints;
    }
    if !pv.local_endpoints.is_empty() {
        return &pv.local_endpoints;
    }
    t.met(ModeRule::LocalFallback);
    if !pv.cluster_endpoints.is_empty() {
        t.steps.push(Step {
            rule: Rule::LocalPolicy,
            text: "a Local policy without a local endpoint: IPVS mode's virtual server takes \
                   the cluster endpoints (kubernetes#97081)"
                .into(),
        });
    }
    &pv.cluster_endpoints
}

/// A virtual server without real servers: IPVS answers ICMP port unreachable.
fn ipvs_no_reals(t: &mut Trace) {
    t.met(ModeRule::NoBackends);
    t.steps.push(Step {
        rule: Rule::NoEndpoints,
        text: "the virtual server has no real server: IPVS refuses the packet (ICMP port \
               unreachable)"
            .into(),
    });
    t.verdict = Verdict::Reject;
}

/// Cluster-IP traffic: the internal policy's endpoint set; masquerade by masqueradeAll
/// or the detector.
fn internal(view: &NodeView, p: &Packet, pv: &PortView, mode: Mode, t: &mut Trace) {
    if pv.internal_local && pv.local_endpoints.is_empty() && pv.has_endpoints {
        t.met(ModeRule::LocalFallback);
    }
    if mode != Mode::Ipvs && !pv.has_internal_endpoints {
        t.met(ModeRule::NoBackends);
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
    t.steps.push(if pv.internal_local {
        Step {
            rule: Rule::LocalPolicy,
            text: "internalTrafficPolicy: Local: the local endpoints".into(),
        }
    } else {
        Step {
            rule: Rule::ClusterPolicy,
            text: "internalTrafficPolicy: Cluster: the cluster endpoints".into(),
        }
    });
    let set: &[u32] = match mode {
        Mode::Ipvs => {
            let reals = ipvs_reals(pv, pv.internal_local, t);
            if reals.is_empty() {
                ipvs_no_reals(t);
                return;
            }
            reals
        }
        _ if pv.internal_local => &pv.local_endpoints,
        _ => &pv.cluster_endpoints,
    };
    // IPVS mode's KUBE-CLUSTER-IP rules decide as iptables mode's KUBE-SVC ones:
    // masqueradeAll, else the detector's "not local" (`writeIptablesRules`).
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
    forward(p, pv, set, masq, &why, mode, t);
}

/// loadBalancerSourceRanges on `p` (every proxy mode's rule): the step that says why it
/// passes, or `None` when it is dropped (the mode says how).
fn source_ranges_pass(pv: &PortView, p: &Packet) -> Option<String> {
    match pv.source_ranges.iter().find(|c| c.contains(&p.src)) {
        Some(c) => Some(format!("loadBalancerSourceRanges: source allowed by {c}")),
        None if pv.source_ranges_include_node && p.src == p.dst => {
            Some("loadBalancerSourceRanges: the node's own traffic to its LB IP".into())
        }
        None => None,
    }
}

/// Traffic to an external IP, load-balancer IP or node port.
fn external(view: &NodeView, p: &Packet, pv: &PortView, how: Match, mode: Mode, t: &mut Trace) {
    let step = |t: &mut Trace, rule: Rule, text: String| t.steps.push(Step { rule, text });
    if how == Match::LoadBalancerIp && !pv.source_ranges.is_empty() && !pv.has_endpoints {
        t.met(ModeRule::FirewallWithoutEndpoints);
    }
    // Firewall (loadBalancerSourceRanges), before anything else where its chain exists.
    let firewall = how == Match::LoadBalancerIp
        && !pv.source_ranges.is_empty()
        && match mode {
            Mode::Nftables => pv.uses_firewall_chain.nftables,
            _ => pv.uses_firewall_chain.iptables,
        };
    if firewall {
        if t.origin == Origin::Node {
            t.met(ModeRule::SourceRangesInNode);
        }
        let Some(passed) = source_ranges_pass(pv, p) else {
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
        };
        step(t, Rule::Firewall, passed);
    }
    if !pv.uses_external_chain {
        // No endpoint anywhere (the external chain exists whenever there are some).
        t.met(ModeRule::NoBackends);
        if t.origin == Origin::Node && how != Match::NodePort {
            t.met(ModeRule::NoEndpointsFromNode);
        }
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
    if t.origin != Origin::Outside {
        t.met(ModeRule::ExternalFromInside);
    }
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
            mode,
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
        return forward(
            p,
            pv,
            &pv.cluster_endpoints,
            true,
            "source is the node",
            mode,
            t,
        );
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
            mode,
            t,
        );
    }
    if !pv.has_external_endpoints || pv.local_endpoints.is_empty() {
        t.met(ModeRule::LocalFallback);
        t.met(ModeRule::NoBackends);
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
        mode,
        t,
    )
}

/// IPVS mode's external destinations: one virtual server per address, the same for every
/// sender (no short-circuit for pods or the node), its real servers by the external
/// policy (`syncProxyRules` passes `ExternalPolicyLocal()` to `syncEndpoint` for external
/// IPs, load-balancer IPs and node ports); masquerade by the ipset rules: KUBE-EXTERNAL-IP,
/// KUBE-LOAD-BALANCER and KUBE-NODE-PORT-* mark, their -LOCAL twins do not
/// (`writeIptablesRules`, `ipsetWithIptablesChain`).
fn ipvs_external(view: &NodeView, p: &Packet, pv: &PortView, how: Match, t: &mut Trace) {
    let step = |t: &mut Trace, rule: Rule, text: String| t.steps.push(Step { rule, text });
    let ranges = how == Match::LoadBalancerIp && !pv.source_ranges.is_empty();
    if ranges && !pv.has_endpoints {
        t.met(ModeRule::FirewallWithoutEndpoints);
    }
    if ranges && t.origin != Origin::Node {
        // KUBE-LOAD-BALANCER-FW is filled whatever the endpoints; its filter INPUT rules
        // run before IPVS (LOCAL_IN) for every packet that arrives, pods' included.
        let Some(passed) = source_ranges_pass(pv, p) else {
            step(
                t,
                Rule::Firewall,
                format!(
                    "source {} is in no range of KUBE-LOAD-BALANCER-SOURCE-CIDR: \
                     KUBE-SOURCE-RANGES-FIREWALL drops it",
                    p.src
                ),
            );
            t.verdict = Verdict::Drop;
            return;
        };
        step(t, Rule::Firewall, passed);
    }
    let set = ipvs_reals(pv, pv.external_local, t);
    if set.is_empty() {
        if t.origin == Origin::Node && how != Match::NodePort {
            t.met(ModeRule::NoEndpointsFromNode);
        }
        ipvs_no_reals(t);
        return;
    }
    if t.origin != Origin::Outside {
        t.met(ModeRule::ExternalFromInside);
    }
    if ranges && t.origin == Origin::Node {
        // The node's own packet is scheduled in LOCAL_OUT, before filter OUTPUT, where
        // KUBE-IPVS-OUT-FILTER drops it unless a source range holds a node IP.
        t.met(ModeRule::SourceRangesInNode);
        if !pv.source_ranges_include_node {
            step(
                t,
                Rule::Firewall,
                "the node's own packet: KUBE-IPVS-OUT-FILTER drops it (no source range \
                 holds a node IP)"
                    .into(),
            );
            t.verdict = Verdict::Drop;
            return;
        }
    }
    let masq = !pv.external_local;
    step(
        t,
        Rule::ExternalPolicy,
        if pv.external_local {
            "externalTrafficPolicy: Local: the virtual server's real servers for every sender, \
             source kept (the -LOCAL sets skip KUBE-MARK-MASQ)"
                .into()
        } else {
            "externalTrafficPolicy: Cluster: the cluster endpoints, marked for masquerade".into()
        },
    );
    let set = set.to_vec();
    forward(
        p,
        pv,
        &set,
        masq,
        if masq {
            "the ipset rule marks it"
        } else {
            "externalTrafficPolicy Local"
        },
        Mode::Ipvs,
        t,
    );
    // The node's own packet to a VIP on kube-ipvs0 leaves from the VIP (the local route's
    // preferred source), and nothing rewrites it.
    if t.origin == Origin::Node && !masq && ipvs_bound(view, &p.dst) {
        t.met(ModeRule::NodeSourceVip);
        if let Verdict::Forward { source, .. } = &mut t.verdict {
            *source = Some(p.dst);
        }
        step(
            t,
            Rule::Masquerade,
            format!(
                "the node's own packet leaves from {} (kube-ipvs0): the backend sees the VIP",
                p.dst
            ),
        );
    }
    if t.origin == Origin::Outside && pv.external_local && pv.local_endpoints.is_empty() {
        step(
            t,
            Rule::LocalPolicy,
            "not masqueraded: the remote endpoint answers from its own address, which the \
             client does not expect unless the reply comes back through this node"
                .into(),
        );
    }
}

/// Cilium's socket LB (`__sock4_xlate_fwd` in bpf/bpf_sock.c, as bpf/sock_lb.c serves the
/// target's maps): the service at the address (for a two-scope service its internal
/// scope, `lb4_lookup_service` with the scope switch: a socket is in-cluster traffic), a
/// backend from its slots, the destination rewritten and nothing else; EHOSTUNREACH when
/// it has no backend. The maps carry loadBalancerSourceRanges, but only tc checks them:
/// sockets are not filtered.
fn socket_lb(p: &Packet, pv: &PortView, how: Match, t: &mut Trace) {
    if how != Match::ClusterIp {
        t.met(ModeRule::ExternalFromInside);
        if how == Match::LoadBalancerIp && !pv.source_ranges.is_empty() {
            t.met(ModeRule::SourceRangesInNode);
            if !pv.has_endpoints {
                t.met(ModeRule::FirewallWithoutEndpoints);
            }
        }
    }
    // Every frontend of a port serves in-cluster sockets the internal policy's endpoints
    // (a single-scope external frontend has both policies alike).
    let set = if pv.internal_local {
        &pv.local_endpoints
    } else {
        &pv.cluster_endpoints
    };
    if pv.internal_local && pv.local_endpoints.is_empty() && pv.has_endpoints {
        t.met(ModeRule::LocalFallback);
    }
    if how != Match::ClusterIp && pv.external_local && pv.local_endpoints.is_empty() {
        t.met(ModeRule::LocalFallback);
    }
    if set.is_empty() {
        t.met(ModeRule::NoBackends);
        if t.origin == Origin::Node && !matches!(how, Match::NodePort | Match::ClusterIp) {
            t.met(ModeRule::NoEndpointsFromNode);
        }
        t.steps.push(Step {
            rule: Rule::NoEndpoints,
            text: "no backend for in-cluster traffic: connect() fails with EHOSTUNREACH".into(),
        });
        t.verdict = Verdict::Unreachable;
        return;
    }
    t.steps.push(Step {
        rule: if pv.internal_local {
            Rule::LocalPolicy
        } else {
            Rule::ClusterPolicy
        },
        text: format!(
            "socket LB: internalTrafficPolicy {}: the {} endpoints{}",
            if pv.internal_local {
                "Local"
            } else {
                "Cluster"
            },
            if pv.internal_local {
                "local"
            } else {
                "cluster"
            },
            if how == Match::ClusterIp {
                ""
            } else {
                " (the internal scope: in-cluster traffic)"
            }
        ),
    });
    let set = set.clone();
    forward(
        p,
        pv,
        &set,
        false,
        "the socket LB rewrites the destination only",
        Mode::Ebpf,
        t,
    );
}

fn forward(
    p: &Packet,
    pv: &PortView,
    set: &[u32],
    masq: bool,
    why: &str,
    mode: Mode,
    t: &mut Trace,
) {
    if masq || !mode.kube_proxy() {
        t.met(ModeRule::Masquerade);
    }
    t.steps.push(Step {
        rule: Rule::Masquerade,
        text: if masq {
            format!("masquerade: yes ({why})")
        } else if mode.kube_proxy() {
            format!(
                "masquerade: no ({why}; a backend that is the sender is still hairpin-masqueraded)"
            )
        } else {
            format!("masquerade: no ({why})")
        },
    });
    if let Some(s) = pv.affinity_timeout {
        t.steps.push(Step {
            rule: Rule::Affinity,
            text: format!("session affinity ClientIP: a source sticks to its backend for {s} s"),
        });
    }
    let n = set.len().max(1) as f64;
    let mut not_local_self = false;
    let backends: Vec<Backend> = set
        .iter()
        .map(|&i| {
            let e = &pv.endpoints[i as usize];
            let own = e.ip == p.src;
            // Hairpin: iptables and nftables masquerade a sender reaching itself by the
            // endpoint's own `-s EP` rule; IPVS only through KUBE-LOOP-BACK, which holds
            // the endpoints it knows are local (`syncProxyRules`, `IsLocal()`); the socket
            // LB connects a pod to itself directly.
            let hairpin = match mode {
                Mode::Iptables | Mode::Nftables => own,
                Mode::Ipvs => own && e.is_local,
                Mode::Ebpf => false,
            };
            if own && !e.is_local {
                not_local_self = true;
            }
            Backend {
                addr: e.addr.to_string(),
                probability: 1.0 / n,
                masquerade: masq || hairpin,
                local: e.is_local,
            }
        })
        .collect();
    if not_local_self {
        t.met(ModeRule::HairpinNotLocal);
    }
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
        text: format!(
            "{} to one of: {}",
            if mode.kube_proxy() {
                "DNAT"
            } else {
                "connect() rewritten"
            },
            list.join(", ")
        ),
    });
    t.verdict = Verdict::Forward {
        backends,
        masquerade: masq,
        affinity_seconds: pv.affinity_timeout,
        source: None,
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
            Verdict::Unreachable => "connect() fails: host unreachable".to_string(),
            Verdict::NotModelled { .. } => "not modelled".to_string(),
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
            on_node: None,
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
        // From a local address the Node object does not list (`--local-ip`): the node's
        // own packet too, not a client's.
        let mut p = packet("192.168.7.7", "192.168.0.2", 30080);
        p.local_ips = vec!["192.168.7.7".parse().unwrap()];
        let t = trace(&v, &p, Mode::Iptables);
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
