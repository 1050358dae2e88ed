//! The ruleset as data: a flat list of nftables objects in output order, built once from a
//! [`NodeView`] and printed by both the text and the JSON writers.
//!
//! Architecture Invariant: every kube-proxy decision is taken here (or was taken by the node
//! pass); `text` and `json` only spell the same items in two syntaxes, so the two forms cannot
//! drift apart.

use super::names::SERVICE_NODEPORTS;
use super::names::{EndpointNames, PortChains, CLUSTER_IPS, CLUSTER_IPS_CHECK, FIREWALL_CHECK};
use super::names::{FIREWALL_IPS, HAIRPIN_ENDPOINTS, MARK_MASQ, MASQUERADING, NODEPORT_IPS};
use super::names::{NODEPORT_ENDPOINTS_CHECK, NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES};
use super::names::{REJECT_CHAIN, SERVICES, SERVICE_ENDPOINTS_CHECK, SERVICE_IPS};
use crate::common::hash_and_truncate;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::rc::Rc;
use svc_compiler::ir::{
    LocalDetector, NftLayout, NoEndpointsVerdict, NodePortAddresses, NodeView, PortView, Protocol,
};
use svc_compiler::net::{Cidr, FastIp, IpFamily};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ChainType {
    Filter,
    Nat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

impl ChainType {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        }
    }
}

impl Hook {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Input => "input",
            Hook::Forward => "forward",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BaseHook {
    pub kind: ChainType,
    pub hook: Hook,
    /// Numeric, as knftables writes it (dstnat = -100, srcnat = 100, filter = 0).
    pub priority: i32,
}

/// kube-proxy's base chains, named `${type}-${hook}`, in its creation order.
const BASE_CHAINS: [(&str, ChainType, Hook, i32); 8] = [
    // Before DNAT, so LoadBalancerSourceRanges see the LB IP, not the endpoint.
    (
        "filter-prerouting-pre-dnat",
        ChainType::Filter,
        Hook::Prerouting,
        -110,
    ),
    (
        "filter-output-pre-dnat",
        ChainType::Filter,
        Hook::Output,
        -110,
    ),
    ("filter-input", ChainType::Filter, Hook::Input, 0),
    ("filter-forward", ChainType::Filter, Hook::Forward, 0),
    ("filter-output", ChainType::Filter, Hook::Output, 0),
    ("nat-prerouting", ChainType::Nat, Hook::Prerouting, -100),
    ("nat-output", ChainType::Nat, Hook::Output, -100),
    ("nat-postrouting", ChainType::Nat, Hook::Postrouting, 100),
];

/// Jumps from base chains, in kube-proxy's order: (target, source, only `ct state new`).
const JUMPS: [(&str, &str, bool); 11] = [
    // The endpoint checks may `reject`, which older kernels allow only in
    // input/forward/output hooks, hence not from the pre-dnat chains.
    (NODEPORT_ENDPOINTS_CHECK, "filter-input", true),
    (SERVICE_ENDPOINTS_CHECK, "filter-input", true),
    (SERVICE_ENDPOINTS_CHECK, "filter-forward", true),
    (SERVICE_ENDPOINTS_CHECK, "filter-output", true),
    (FIREWALL_CHECK, "filter-prerouting-pre-dnat", true),
    (FIREWALL_CHECK, "filter-output-pre-dnat", true),
    (SERVICES, "nat-output", false),
    (SERVICES, "nat-prerouting", false),
    (MASQUERADING, "nat-postrouting", false),
    (CLUSTER_IPS_CHECK, "filter-forward", true),
    (CLUSTER_IPS_CHECK, "filter-output", true),
];

/// A chain or set name: a constant, or one made for a service port and shared by every
/// object that refers to it (a rule per endpoint refers to its chain: no copy each time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Name {
    Fixed(&'static str),
    Made(Rc<str>),
}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            Name::Fixed(s) => s,
            Name::Made(s) => s,
        }
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

impl From<&'static str> for Name {
    fn from(s: &'static str) -> Name {
        Name::Fixed(s)
    }
}

impl From<String> for Name {
    fn from(s: String) -> Name {
        Name::Made(s.into())
    }
}

impl From<&Name> for Name {
    fn from(n: &Name) -> Name {
        n.clone()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Chain {
    pub name: Name,
    pub base: Option<BaseHook>,
    pub comment: Option<&'static str>,
}

/// One component of a set's key type; `Addr` is `ipv4_addr` or `ipv6_addr` by family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeyType {
    Addr,
    InetProto,
    InetService,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Set {
    pub name: Name,
    pub key: Vec<KeyType>,
    /// A verdict map (`map … : verdict`) rather than a plain set.
    pub verdict_map: bool,
    /// A map to these (the fast layout's affinity maps: `Addr . InetService`); empty for
    /// sets and verdict maps.
    pub data: Vec<KeyType>,
    /// Affinity sets: `flags dynamic,timeout ; timeout Ns`.
    pub timeout: Option<u32>,
    pub comment: Option<&'static str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Side {
    Saddr,
    Daddr,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Expr {
    /// `ip saddr` / `ip6 daddr`: the family comes from the ruleset.
    Addr(Side),
    /// `meta l4proto`
    L4proto,
    /// `th dport`
    ThDport,
    /// `mark` (meta mark)
    Mark,
    /// `ct state`
    CtState,
    /// `ct status`
    CtStatus,
    /// `fib saddr type` / `fib daddr type`
    FibType(Side),
    /// `iifname`
    Iifname,
    /// `numgen random mod N`
    NumgenRandom(u32),
    Concat(Vec<Expr>),
    Ip(IpAddr),
    Prefix(Cidr),
    Num(u32),
    /// A mark value, written `0x%08x` as kube-proxy's `%#08x`.
    Hex(u32),
    /// A keyword constant: `new`, `local`, `tcp`.
    Sym(&'static str),
    /// An interface name (or `prefix*` wildcard).
    Ifname(String),
    /// `@name`
    SetRef(Name),
    /// `{ a , b }`; `comma_only` joins the items with a bare `,` (how kube-proxy writes
    /// its service CIDR list).
    AnonSet {
        items: Vec<Expr>,
        comma_only: bool,
    },
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Xor(Box<Expr>, Box<Expr>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// No operator in the text (`ip daddr 1.2.3.4`, `ct state new`); `==` in JSON, or `in`
    /// for flag types such as `ct state`.
    Implicit,
    Eq,
    Neq,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Jump(Name),
    Goto(Name),
    Return,
    Drop,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Stmt {
    Match {
        left: Expr,
        op: Op,
        right: Expr,
    },
    Verdict(Verdict),
    Reject,
    /// `mark set <value>`
    MarkSet(Expr),
    MasqueradeFullyRandom,
    /// `<key> vmap @map`
    VmapRef {
        key: Expr,
        map: &'static str,
    },
    /// `<key> vmap { 0 : goto a , 1 : goto b }`
    VmapInline {
        key: Expr,
        entries: Vec<(u32, Verdict)>,
    },
    /// `update @set { <elem> }`
    SetUpdate {
        set: Name,
        elem: Expr,
    },
    /// `dnat to ip:port` (`[ip]:port` for IPv6)
    Dnat {
        addr: IpAddr,
        port: u16,
    },
    /// `update @map { <key> : addr . port }` (text form only: nft 1.0.6's JSON parser has
    /// no map update statement)
    MapUpdate {
        map: Name,
        key: Expr,
        addr: IpAddr,
        port: u16,
    },
    /// `dnat ip to <key> map @map`, the map giving `addr . port` (text form only)
    DnatMap {
        key: Expr,
        map: Name,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Rule {
    pub chain: Name,
    pub stmts: Vec<Stmt>,
    pub comment: Option<&'static str>,
}

/// One component of an element key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Value {
    Ip(IpAddr),
    Proto(Protocol),
    Port(u16),
}

/// An element's place in the output as bytes: its set's position in [`ELEMENT_SETS`],
/// then its key, ordered as `Vec<Value>` orders (a tag per value, then the value, zero
/// padding after the last). Sorting these is a memcmp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Place([u8; 56]);

impl Element {
    pub(super) fn place(&self) -> Place {
        let mut b = [0u8; 56];
        b[0] = ELEMENT_SETS
            .iter()
            .position(|s| *s == self.set)
            .expect("a known set") as u8;
        let mut at = 1;
        for v in self.key.iter().take(3) {
            match v {
                Value::Ip(ip) => {
                    b[at] = 1;
                    let (family, bytes): (u8, [u8; 16]) = match ip {
                        IpAddr::V4(a) => {
                            let mut x = [0; 16];
                            x[..4].copy_from_slice(&a.octets());
                            (0, x)
                        }
                        IpAddr::V6(a) => (1, a.octets()),
                    };
                    b[at + 1] = family;
                    b[at + 2..at + 18].copy_from_slice(&bytes);
                }
                Value::Proto(p) => {
                    b[at] = 2;
                    b[at + 1] = *p as u8;
                }
                Value::Port(p) => {
                    b[at] = 3;
                    b[at + 1..at + 3].copy_from_slice(&p.to_be_bytes());
                }
            }
            at += 18;
        }
        assert!(self.key.len() <= 3, "element keys have at most three parts");
        Place(b)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Element {
    pub set: &'static str,
    pub key: Vec<Value>,
    pub comment: Option<String>,
    /// `None` for plain sets.
    pub verdict: Option<Verdict>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Item {
    /// A `# …` line in the text form (nothing in JSON).
    Section(String),
    Chain(Chain),
    Set(Set),
    Rule(Rule),
    Element(Element),
}

#[derive(Clone, Debug)]
pub(super) struct Ruleset {
    pub family: IpFamily,
    #[cfg_attr(not(test), allow(dead_code))]
    pub node: String,
    pub items: Vec<Item>,
}

pub(super) fn ip_kw(f: IpFamily) -> &'static str {
    match f {
        IpFamily::IPv4 => "ip",
        IpFamily::IPv6 => "ip6",
    }
}

// ---------------------------------------------------------------------------------------
// Building
// ---------------------------------------------------------------------------------------

/// The maps and sets whose elements are collected while services are walked and written
/// last, each sorted by key, in this order (the last only in the fast layout).
pub(super) const ELEMENT_SETS: [&str; 8] = [
    NODEPORT_IPS,
    CLUSTER_IPS,
    SERVICE_IPS,
    SERVICE_NODEPORTS,
    FIREWALL_IPS,
    NO_ENDPOINT_SERVICES,
    NO_ENDPOINT_NODEPORTS,
    HAIRPIN_ENDPOINTS,
];

/// Element key → (element comment, verdict).
type Elements = BTreeMap<Vec<Value>, (Option<String>, Option<Verdict>)>;

/// What a service port's objects read of the node's view, beside the port itself: nodes
/// that agree on these and on the port get the same objects for it.
#[derive(Clone, PartialEq)]
pub struct PortSettings {
    pub family: IpFamily,
    masquerade_all: bool,
    local_detector: Option<LocalDetector>,
    layout: NftLayout,
    /// The fast layout's affinity as one dynamic map per policy chain (text) rather than
    /// one set per endpoint (JSON; see [`Form`]).
    affinity_maps: bool,
}

/// Which syntax the model is built for. Both get the same objects, except that the fast
/// layout's affinity is one dynamic map per policy chain in the text form and kube-proxy's
/// one set per endpoint in the JSON form: nft 1.0.6's JSON parser has no statement that
/// updates a map from the packet path (`update @m { ip saddr : … }`), so the JSON form
/// can say it only with sets. Both forms give every packet the same fate. IPv6 uses the sets
/// in both forms: nft 1.0.6 aborts on `update @m { ip6 saddr : <ipv6> . <port> }` (an
/// assertion in netlink_linearize.c), the map's data being the endpoint's address and port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Form {
    Text,
    Json,
}

impl PortSettings {
    pub(super) fn of(view: &NodeView, form: Form) -> PortSettings {
        PortSettings {
            family: view.family,
            masquerade_all: view.masquerade_all,
            local_detector: view.local_detector.clone(),
            layout: view.nft_layout,
            affinity_maps: view.nft_layout == NftLayout::Fast
                && form == Form::Text
                && view.family == IpFamily::IPv4,
        }
    }
}

/// A share of the ruleset: items in output order (for a service port, a section: sets,
/// chains, rules) and the elements added to the maps, in the order they are added.
pub(super) struct Part {
    pub items: Vec<Item>,
    pub elements: Vec<Element>,
}

pub(super) fn port_part(s: &PortSettings, p: &PortView) -> Part {
    let mut b = PortBuilder {
        s,
        items: Vec::new(),
        elements: Vec::new(),
    };
    b.service_port(p);
    Part {
        items: b.items,
        elements: b.elements,
    }
}

/// Builds one port's [`Part`]; sees only the port and [`PortSettings`].
struct PortBuilder<'a> {
    s: &'a PortSettings,
    items: Vec<Item>,
    elements: Vec<Element>,
}

impl PortBuilder<'_> {
    fn element(
        &mut self,
        set: &'static str,
        key: Vec<Value>,
        comment: Option<&str>,
        verdict: Option<Verdict>,
    ) {
        self.elements.push(Element {
            set,
            key,
            comment: comment.map(str::to_string),
            verdict,
        });
    }

    fn service_port(&mut self, p: &PortView) {
        let view = self.s;
        let proto = p.protocol;
        let chains = PortChains::new(p);
        let cluster_chain: Name = chains.cluster.into();
        let local_chain: Name = chains.local.into();
        let external_chain: Name = chains.external.into();
        let firewall_chain: Name = chains.firewall.into();
        let reachable = p.reachable_endpoints();
        // Each reachable endpoint's names, hashed once.
        let mut names: Vec<Option<(Name, Name)>> = vec![None; p.endpoints.len()];
        for &i in &reachable {
            let n = EndpointNames::new(p, &p.endpoints[i as usize]);
            names[i as usize] = Some((n.chain.into(), n.affinity.into()));
        }
        let name = |i: u32| names[i as usize].as_ref().expect("a reachable endpoint");
        let endpoint_chain = |i: u32| name(i).0.clone();
        let affinity_set = |i: u32| name(i).1.clone();

        // Which chains exist, and where traffic goes: the node pass's decisions (see
        // `PortView`); a non-empty endpoint set is a policy chain that exists.
        let uses_cluster = !p.cluster_endpoints.is_empty();
        let uses_local = !p.local_endpoints.is_empty();
        let uses_external = p.uses_external_chain;
        let uses_firewall = p.uses_firewall_chain.nftables;
        let internal_chain = if p.internal_local {
            &local_chain
        } else {
            &cluster_chain
        };
        let external_policy_chain = if p.external_local {
            &local_chain
        } else {
            &cluster_chain
        };
        let has_internal = p.has_internal_endpoints;
        let has_external = p.has_external_endpoints;
        let no_endpoint_verdict = match p.no_endpoints_verdict {
            NoEndpointsVerdict::Drop => Verdict::Drop,
            NoEndpointsVerdict::Reject => Verdict::Goto(REJECT_CHAIN.into()),
        };
        let affinity = p.affinity_timeout;
        let fast = view.layout == NftLayout::Fast;

        // --- elements ---
        let spn = Some(p.spn.as_str());
        let key3 = |ip: IpAddr| vec![Value::Ip(ip), Value::Proto(proto), Value::Port(p.port)];
        if let Some(cip) = p.cluster_ip {
            self.element(CLUSTER_IPS, vec![Value::Ip(cip)], None, None);
            if has_internal {
                self.element(
                    SERVICE_IPS,
                    key3(cip),
                    None,
                    Some(Verdict::Goto(internal_chain.clone())),
                );
            } else {
                self.element(
                    NO_ENDPOINT_SERVICES,
                    key3(cip),
                    spn,
                    Some(no_endpoint_verdict.clone()),
                );
            }
        }
        for &ip in p.external_ips.iter().chain(&p.load_balancer_ips) {
            if uses_external {
                self.element(
                    SERVICE_IPS,
                    key3(ip),
                    None,
                    Some(Verdict::Goto(external_chain.clone())),
                );
            }
            if !has_external {
                self.element(
                    NO_ENDPOINT_SERVICES,
                    key3(ip),
                    spn,
                    Some(no_endpoint_verdict.clone()),
                );
            }
        }
        if uses_firewall {
            for &ip in &p.load_balancer_ips {
                self.element(
                    FIREWALL_IPS,
                    key3(ip),
                    None,
                    Some(Verdict::Goto(firewall_chain.clone())),
                );
            }
        }
        if let Some(np) = p.node_port.filter(|&np| np != 0) {
            let key = vec![Value::Proto(proto), Value::Port(np)];
            if uses_external {
                self.element(
                    SERVICE_NODEPORTS,
                    key.clone(),
                    None,
                    Some(Verdict::Goto(external_chain.clone())),
                );
            }
            if !has_external {
                self.element(
                    NO_ENDPOINT_NODEPORTS,
                    key,
                    spn,
                    Some(no_endpoint_verdict.clone()),
                );
            }
        }

        // --- sets and chains ---
        let start = self.items.len();
        // The fast layout's text form: one map per policy chain, named after the chain and
        // its endpoints (`affinity-<hash>-<chain>`), so that an incremental apply that
        // changes the endpoints replaces the map: no source stays stuck to an endpoint that
        // is gone (kube-proxy deletes a removed endpoint's set with it).
        let affinity_map = |chain: &Name, endpoints: &[u32]| -> Name {
            let eps: Vec<String> = endpoints
                .iter()
                .map(|&i| {
                    let ep = &p.endpoints[i as usize];
                    format!("{}:{}", FastIp(&ep.ip), ep.port)
                })
                .collect();
            let hash = hash_and_truncate(&eps.join(","));
            format!("affinity-{}-{chain}", &hash[..8]).into()
        };
        let maps = view.affinity_maps;
        if let (Some(_), true) = (affinity, maps) {
            for (uses, name, endpoints) in [
                (uses_cluster, &cluster_chain, &p.cluster_endpoints),
                (uses_local, &local_chain, &p.local_endpoints),
            ] {
                if uses {
                    self.items.push(Item::Set(Set {
                        name: affinity_map(name, endpoints),
                        key: vec![KeyType::Addr],
                        verdict_map: false,
                        data: vec![KeyType::Addr, KeyType::InetService],
                        timeout: affinity,
                        comment: None,
                    }));
                }
            }
        } else if affinity.is_some() {
            for &i in &reachable {
                self.items.push(Item::Set(Set {
                    name: affinity_set(i),
                    key: vec![KeyType::Addr],
                    verdict_map: false,
                    data: Vec::new(),
                    timeout: affinity,
                    comment: None,
                }));
            }
        }
        for (uses, name) in [
            (uses_cluster, &cluster_chain),
            (uses_local, &local_chain),
            (uses_external, &external_chain),
            (uses_firewall, &firewall_chain),
        ] {
            if uses {
                self.items.push(chain(name));
            }
        }
        if !fast {
            for &i in &reachable {
                self.items.push(chain(endpoint_chain(i)));
            }
        }

        // --- rules ---
        // Internal (ClusterIP) traffic from outside the pod network is masqueraded: it may
        // have been routed to this node from off-cluster and must return through it.
        let masq = match p.cluster_ip {
            Some(cip) if has_internal => {
                let daddr = m(Expr::Addr(Side::Daddr), Expr::Ip(cip));
                if view.masquerade_all {
                    Some(vec![daddr, jump(MARK_MASQ)])
                } else {
                    view.local_detector
                        .as_ref()
                        .map(|d| vec![daddr, detector(d, false), jump(MARK_MASQ)])
                }
            }
            _ => None,
        };
        let policy_chains = [
            (uses_cluster, &cluster_chain, &p.cluster_endpoints),
            (uses_local, &local_chain, &p.local_endpoints),
        ];
        for (uses, name, endpoints) in policy_chains {
            if !uses {
                continue;
            }
            if name == internal_chain {
                if let Some(stmts) = masq.clone() {
                    self.items.push(rule(name, stmts));
                }
            }
            if fast {
                let aff = match (affinity, maps) {
                    (None, _) => Affinity::None,
                    (Some(_), true) => Affinity::Map(affinity_map(name, endpoints)),
                    (Some(_), false) => Affinity::Sets(&affinity_set),
                };
                self.fast_dispatch(p, name, endpoints, aff);
                continue;
            }
            if affinity.is_some() {
                for &i in endpoints {
                    self.items.push(rule(
                        name,
                        vec![
                            m(Expr::Addr(Side::Saddr), Expr::SetRef(affinity_set(i))),
                            goto(endpoint_chain(i)),
                        ],
                    ));
                }
            }
            let entries = endpoints
                .iter()
                .enumerate()
                .map(|(n, &i)| (n as u32, Verdict::Goto(endpoint_chain(i))))
                .collect();
            self.items.push(rule(
                name,
                vec![Stmt::VmapInline {
                    key: Expr::NumgenRandom(endpoints.len() as u32),
                    entries,
                }],
            ));
        }

        if uses_external {
            if !p.external_local {
                // Endpoints may be on another node: masquerade so replies come back here.
                self.items
                    .push(rule(&external_chain, vec![jump(MARK_MASQ)]));
            } else {
                // Pod and host traffic to an external destination is not subject to the
                // Local policy (as if it went out to the load balancer and came back).
                if let (Some(d), true) = (&view.local_detector, uses_cluster) {
                    self.items.push(rule_c(
                        &external_chain,
                        vec![detector(d, true), goto(&cluster_chain)],
                        "short-circuit pod traffic",
                    ));
                }
                let from_host = || m(Expr::FibType(Side::Saddr), Expr::Sym("local"));
                self.items.push(rule_c(
                    &external_chain,
                    vec![from_host(), jump(MARK_MASQ)],
                    "masquerade local traffic",
                ));
                if uses_cluster {
                    self.items.push(rule_c(
                        &external_chain,
                        vec![from_host(), goto(&cluster_chain)],
                        "short-circuit local traffic",
                    ));
                }
            }
            if has_external {
                self.items
                    .push(rule(&external_chain, vec![goto(external_policy_chain)]));
            }
        }

        if uses_firewall {
            let mut allowed: Vec<Expr> = p
                .source_ranges
                .iter()
                .map(|c| Expr::Prefix(c.network()))
                .collect();
            // A VIP bound locally makes node-originated requests arrive with the VIP as
            // source; accept those when the node itself is allowed.
            if p.source_ranges_include_node {
                allowed.extend(p.load_balancer_ips.iter().map(|ip| Expr::Ip(*ip)));
            }
            if fast {
                // No anonymous set: an allowed source returns (to the chain that jumped
                // to firewall-check, as falling off this goto'd chain would), the rest drop.
                for a in allowed {
                    self.items.push(rule(
                        &firewall_chain,
                        vec![
                            m(Expr::Addr(Side::Saddr), a),
                            Stmt::Verdict(Verdict::Return),
                        ],
                    ));
                }
                self.items
                    .push(rule(&firewall_chain, vec![Stmt::Verdict(Verdict::Drop)]));
            } else {
                self.items.push(rule(
                    &firewall_chain,
                    vec![
                        m_neq(
                            Expr::Addr(Side::Saddr),
                            Expr::AnonSet {
                                items: allowed,
                                comma_only: false,
                            },
                        ),
                        Stmt::Verdict(Verdict::Drop),
                    ],
                ));
            }
        }

        if fast {
            for &i in &reachable {
                let ip = p.endpoints[i as usize].ip;
                self.element(
                    HAIRPIN_ENDPOINTS,
                    vec![Value::Ip(ip), Value::Ip(ip)],
                    None,
                    None,
                );
            }
        }
        for &i in reachable.iter().filter(|_| !fast) {
            let ep = &p.endpoints[i as usize];
            let name = endpoint_chain(i);
            // Hairpin: a pod reaching itself through the service must be masqueraded.
            self.items.push(rule(
                &name,
                vec![m(Expr::Addr(Side::Saddr), Expr::Ip(ep.ip)), jump(MARK_MASQ)],
            ));
            if affinity.is_some() {
                self.items.push(rule(
                    &name,
                    vec![Stmt::SetUpdate {
                        set: affinity_set(i),
                        elem: Expr::Addr(Side::Saddr),
                    }],
                ));
            }
            self.items.push(rule(
                &name,
                vec![
                    m(Expr::L4proto, Expr::Sym(proto.lower())),
                    Stmt::Dnat {
                        addr: ep.ip,
                        port: ep.port,
                    },
                ],
            ));
        }

        if self.items.len() > start {
            self.items.insert(start, Item::Section(p.spn.clone()));
        }
    }
}

/// How [`PortBuilder::fast_dispatch`] keeps session affinity.
enum Affinity<'a> {
    None,
    /// kube-proxy's set per endpoint, named by the function.
    Sets(&'a dyn Fn(u32) -> Name),
    /// One map for the chain.
    Map(Name),
}

impl PortBuilder<'_> {
    /// The fast layout's endpoint choice in policy chain `chain`: no endpoint chains and no
    /// anonymous vmap. Affinity first (a source in an endpoint's set goes back to it, as
    /// kube-proxy's `ip saddr @affinity-… goto endpoint-…`), then one rule per endpoint,
    /// the i-th of n taken with probability 1/(n-i) (`numgen random mod (n-i) 0`), so each
    /// is taken with probability 1/n, as kube-proxy's `numgen random mod n vmap`. Each rule
    /// DNATs itself; the hairpin masquerade is one rule in `masquerading` for all.
    ///
    /// With affinity as one map per policy chain (the text form), the map holds each
    /// source's endpoint (`addr . port`): a source in it is DNATed to that, its entry's
    /// timeout refreshed by the `update` (whose value only counts for a new entry: should
    /// the entry expire between the lookup and the update, the source is given the first
    /// endpoint, a valid choice); a new source is added by the rule that picks its endpoint.
    fn fast_dispatch(&mut self, p: &PortView, chain: &Name, endpoints: &[u32], aff: Affinity) {
        let proto = || m(Expr::L4proto, Expr::Sym(p.protocol.lower()));
        let dnat = |i: u32| {
            let ep = &p.endpoints[i as usize];
            Stmt::Dnat {
                addr: ep.ip,
                port: ep.port,
            }
        };
        let update = |set: Name| Stmt::SetUpdate {
            set,
            elem: Expr::Addr(Side::Saddr),
        };
        let map_update = |map: &Name, i: u32| {
            let ep = &p.endpoints[i as usize];
            Stmt::MapUpdate {
                map: map.clone(),
                key: Expr::Addr(Side::Saddr),
                addr: ep.ip,
                port: ep.port,
            }
        };
        match &aff {
            Affinity::None => {}
            Affinity::Sets(set) => {
                for &i in endpoints {
                    self.items.push(rule(
                        chain,
                        vec![
                            m(Expr::Addr(Side::Saddr), Expr::SetRef(set(i))),
                            proto(),
                            update(set(i)),
                            dnat(i),
                        ],
                    ));
                }
            }
            Affinity::Map(map) => {
                if let Some(&first) = endpoints.first() {
                    self.items.push(rule(
                        chain,
                        vec![
                            m(Expr::Addr(Side::Saddr), Expr::SetRef(map.clone())),
                            proto(),
                            map_update(map, first),
                            Stmt::DnatMap {
                                key: Expr::Addr(Side::Saddr),
                                map: map.clone(),
                            },
                        ],
                    ));
                }
            }
        }
        let n = endpoints.len() as u32;
        for (k, &i) in endpoints.iter().enumerate() {
            let left = n - k as u32;
            let mut stmts = vec![proto()];
            if left > 1 {
                stmts.push(m(Expr::NumgenRandom(left), Expr::Num(0)));
            }
            match &aff {
                Affinity::None => {}
                Affinity::Sets(set) => stmts.push(update(set(i))),
                Affinity::Map(map) => stmts.push(map_update(map, i)),
            }
            stmts.push(dnat(i));
            self.items.push(rule(chain, stmts));
        }
    }
}

/// Builds the table-level [`Part`].
struct Builder<'a> {
    view: &'a NodeView,
    items: Vec<Item>,
    elements: Vec<Element>,
}

/// The table-level objects and rules, which do not depend on services.
pub(super) fn fixed_part(view: &NodeView) -> Part {
    let mut b = Builder {
        view,
        items: Vec::new(),
        elements: Vec::new(),
    };
    b.fixed();
    Part {
        items: b.items,
        elements: b.elements,
    }
}

pub(super) fn build(view: &NodeView, form: Form) -> Ruleset {
    let fixed = fixed_part(view);
    let mut items = fixed.items;
    let mut elements = ElementMaps::default();
    elements.add(fixed.elements);
    let settings = PortSettings::of(view, form);
    for p in &view.ports {
        let part = port_part(&settings, p);
        items.extend(part.items);
        elements.add(part.elements);
    }
    elements.flush(&mut items);
    Ruleset {
        family: view.family,
        node: view.node_name.clone(),
        items,
    }
}

/// The elements of every map: per set, key → (comment, verdict). A BTreeMap both sorts and
/// deduplicates; the first service (in NodeView order) to claim a key keeps it.
#[derive(Default)]
struct ElementMaps(BTreeMap<&'static str, Elements>);

impl ElementMaps {
    fn add(&mut self, elements: Vec<Element>) {
        for e in elements {
            self.0
                .entry(e.set)
                .or_default()
                .entry(e.key)
                .or_insert((e.comment, e.verdict));
        }
    }

    /// The elements as items, map by map in [`ELEMENT_SETS`] order, each sorted by key.
    fn flush(mut self, items: &mut Vec<Item>) {
        for set in ELEMENT_SETS {
            let Some(elems) = self.0.remove(set) else {
                continue;
            };
            for (key, (comment, verdict)) in elems {
                items.push(Item::Element(Element {
                    set,
                    key,
                    comment,
                    verdict,
                }));
            }
        }
    }
}

fn chain(name: impl Into<Name>) -> Item {
    Item::Chain(Chain {
        name: name.into(),
        base: None,
        comment: None,
    })
}

fn rule(chain: impl Into<Name>, stmts: Vec<Stmt>) -> Item {
    Item::Rule(Rule {
        chain: chain.into(),
        stmts,
        comment: None,
    })
}

fn rule_c(chain: impl Into<Name>, stmts: Vec<Stmt>, comment: &'static str) -> Item {
    Item::Rule(Rule {
        chain: chain.into(),
        stmts,
        comment: Some(comment),
    })
}

fn m(left: Expr, right: Expr) -> Stmt {
    Stmt::Match {
        left,
        op: Op::Implicit,
        right,
    }
}

fn m_neq(left: Expr, right: Expr) -> Stmt {
    Stmt::Match {
        left,
        op: Op::Neq,
        right,
    }
}

fn jump(target: impl Into<Name>) -> Stmt {
    Stmt::Verdict(Verdict::Jump(target.into()))
}

fn goto(target: impl Into<Name>) -> Stmt {
    Stmt::Verdict(Verdict::Goto(target.into()))
}

fn ip_proto_port() -> Expr {
    Expr::Concat(vec![Expr::Addr(Side::Daddr), Expr::L4proto, Expr::ThDport])
}

fn proto_port() -> Expr {
    Expr::Concat(vec![Expr::L4proto, Expr::ThDport])
}

fn verdict_map(name: &'static str, key: Vec<KeyType>, comment: &'static str) -> Item {
    Item::Set(Set {
        name: name.into(),
        key,
        verdict_map: true,
        data: Vec::new(),
        timeout: None,
        comment: Some(comment),
    })
}

/// Match for "traffic from a local pod" (`local`) or its negation.
fn detector(d: &LocalDetector, local: bool) -> Stmt {
    let (left, right) = match d {
        LocalDetector::Cidr(c) => (Expr::Addr(Side::Saddr), Expr::Prefix(c.network())),
        LocalDetector::BridgeInterface(i) => (Expr::Iifname, Expr::Ifname(i.clone())),
        LocalDetector::InterfaceNamePrefix(p) => (Expr::Iifname, Expr::Ifname(format!("{p}*"))),
    };
    Stmt::Match {
        left,
        op: if local { Op::Implicit } else { Op::Neq },
        right,
    }
}

impl Builder<'_> {
    fn element(&mut self, set: &'static str, key: Vec<Value>) {
        self.elements.push(Element {
            set,
            key,
            comment: None,
            verdict: None,
        });
    }

    /// "Not to a localhost address", the guard on NodePort matching with match-all
    /// nodeport-addresses (kube-proxy's nftables mode never serves NodePorts on localhost).
    fn no_localhost(&self) -> Stmt {
        let right = match self.view.family {
            IpFamily::IPv4 => Expr::Prefix(Cidr {
                addr: IpAddr::V4([127, 0, 0, 0].into()),
                prefix: 8,
            }),
            IpFamily::IPv6 => Expr::Ip(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)),
        };
        m_neq(Expr::Addr(Side::Daddr), right)
    }

    /// Table-level objects and rules that do not depend on services.
    fn fixed(&mut self) {
        let view = self.view;
        let mark = view.masquerade_mark;
        let match_all = matches!(view.node_port_addresses, NodePortAddresses::All);

        for (name, kind, hook, priority) in BASE_CHAINS {
            self.items.push(Item::Chain(Chain {
                name: name.into(),
                base: Some(BaseHook {
                    kind,
                    hook,
                    priority,
                }),
                comment: None,
            }));
        }
        let mut regular: Vec<&str> = Vec::new();
        for name in JUMPS.iter().map(|j| j.0).chain([
            SERVICES,
            CLUSTER_IPS_CHECK,
            MASQUERADING,
            MARK_MASQ,
            FIREWALL_CHECK,
        ]) {
            if !regular.contains(&name) {
                regular.push(name);
            }
        }
        for name in regular {
            self.items.push(chain(name));
        }
        self.items.push(Item::Chain(Chain {
            name: REJECT_CHAIN.into(),
            base: None,
            comment: Some("helper for @no-endpoint-services / @no-endpoint-nodeports"),
        }));

        use KeyType::*;
        self.items.push(Item::Set(Set {
            name: CLUSTER_IPS.into(),
            key: vec![Addr],
            verdict_map: false,
            data: Vec::new(),
            timeout: None,
            comment: Some("Active ClusterIPs"),
        }));
        // With match-all nodeport-addresses kube-proxy deletes this set; as the whole table
        // is replaced here, leaving it out is the same.
        if !match_all {
            self.items.push(Item::Set(Set {
                name: NODEPORT_IPS.into(),
                key: vec![Addr],
                verdict_map: false,
                data: Vec::new(),
                timeout: None,
                comment: Some("IPs that accept NodePort traffic"),
            }));
        }
        self.items.push(verdict_map(
            NO_ENDPOINT_SERVICES,
            vec![Addr, InetProto, InetService],
            "vmap to drop or reject packets to services with no endpoints",
        ));
        self.items.push(verdict_map(
            NO_ENDPOINT_NODEPORTS,
            vec![InetProto, InetService],
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ));
        self.items.push(verdict_map(
            FIREWALL_IPS,
            vec![Addr, InetProto, InetService],
            "destinations that are subject to LoadBalancerSourceRanges",
        ));
        self.items.push(verdict_map(
            SERVICE_IPS,
            vec![Addr, InetProto, InetService],
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ));
        self.items.push(verdict_map(
            SERVICE_NODEPORTS,
            vec![InetProto, InetService],
            "NodePort traffic",
        ));
        let fast = view.nft_layout == NftLayout::Fast;
        if fast {
            self.items.push(Item::Set(Set {
                name: HAIRPIN_ENDPOINTS.into(),
                key: vec![Addr, Addr],
                verdict_map: false,
                data: Vec::new(),
                timeout: None,
                comment: Some("endpoint IPs, each twice: DNAT from an endpoint to itself"),
            }));
        }

        for (target, source, ct_new) in JUMPS {
            let mut stmts = Vec::new();
            if ct_new {
                stmts.push(m(Expr::CtState, Expr::Sym("new")));
            }
            stmts.push(jump(target));
            self.items.push(rule(source, stmts));
        }

        self.items.push(rule(
            MARK_MASQ,
            vec![Stmt::MarkSet(Expr::Or(
                Box::new(Expr::Mark),
                Box::new(Expr::Hex(mark)),
            ))],
        ));
        if fast {
            // kube-proxy marks a hairpin connection in each endpoint chain (`ip saddr
            // <endpoint> jump mark-for-masquerade`); here after DNAT, for all at once: a
            // DNATed connection whose source is its new destination.
            self.items.push(rule(
                MASQUERADING,
                vec![
                    m(Expr::CtStatus, Expr::Sym("dnat")),
                    m(
                        Expr::Concat(vec![Expr::Addr(Side::Saddr), Expr::Addr(Side::Daddr)]),
                        Expr::SetRef(HAIRPIN_ENDPOINTS.into()),
                    ),
                    jump(MARK_MASQ),
                ],
            ));
        }
        self.items.push(rule(
            MASQUERADING,
            vec![
                Stmt::Match {
                    left: Expr::And(Box::new(Expr::Mark), Box::new(Expr::Hex(mark))),
                    op: Op::Eq,
                    right: Expr::Num(0),
                },
                Stmt::Verdict(Verdict::Return),
            ],
        ));
        self.items.push(rule(
            MASQUERADING,
            vec![Stmt::MarkSet(Expr::Xor(
                Box::new(Expr::Mark),
                Box::new(Expr::Hex(mark)),
            ))],
        ));
        self.items
            .push(rule(MASQUERADING, vec![Stmt::MasqueradeFullyRandom]));

        self.items.push(rule_c(
            CLUSTER_IPS_CHECK,
            vec![
                m(Expr::Addr(Side::Daddr), Expr::SetRef(CLUSTER_IPS.into())),
                Stmt::Reject,
            ],
            "Reject traffic to invalid ports of ClusterIPs",
        ));
        if !view.service_cidrs.is_empty() {
            let items = view
                .service_cidrs
                .iter()
                .map(|c| Expr::Prefix(c.network()))
                .collect();
            self.items.push(rule_c(
                CLUSTER_IPS_CHECK,
                vec![
                    m(
                        Expr::Addr(Side::Daddr),
                        Expr::AnonSet {
                            items,
                            comma_only: true,
                        },
                    ),
                    Stmt::Verdict(Verdict::Drop),
                ],
                "Drop traffic to unallocated ClusterIPs",
            ));
        }

        self.items.push(rule(REJECT_CHAIN, vec![Stmt::Reject]));
        self.items.push(rule(
            SERVICE_ENDPOINTS_CHECK,
            vec![Stmt::VmapRef {
                key: ip_proto_port(),
                map: NO_ENDPOINT_SERVICES,
            }],
        ));
        let nodeport_dst = if match_all {
            self.no_localhost()
        } else {
            m(Expr::Addr(Side::Daddr), Expr::SetRef(NODEPORT_IPS.into()))
        };
        self.items.push(rule(
            NODEPORT_ENDPOINTS_CHECK,
            vec![
                nodeport_dst.clone(),
                Stmt::VmapRef {
                    key: proto_port(),
                    map: NO_ENDPOINT_NODEPORTS,
                },
            ],
        ));
        self.items.push(rule(
            FIREWALL_CHECK,
            vec![Stmt::VmapRef {
                key: ip_proto_port(),
                map: FIREWALL_IPS,
            }],
        ));
        self.items.push(rule(
            SERVICES,
            vec![Stmt::VmapRef {
                key: ip_proto_port(),
                map: SERVICE_IPS,
            }],
        ));
        let mut nodeports = Vec::new();
        if match_all {
            nodeports.push(m(Expr::FibType(Side::Daddr), Expr::Sym("local")));
        }
        nodeports.push(nodeport_dst);
        nodeports.push(Stmt::VmapRef {
            key: proto_port(),
            map: SERVICE_NODEPORTS,
        });
        self.items.push(rule(SERVICES, nodeports));

        if let NodePortAddresses::Ips(ips) = &view.node_port_addresses {
            // kube-proxy's nftables mode does not support localhost NodePorts.
            for ip in ips.iter().filter(|ip| !ip.is_loopback()) {
                self.element(NODEPORT_IPS, vec![Value::Ip(*ip)]);
            }
        }
    }
}
