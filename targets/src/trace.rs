//! The rules behind a [`svc_compiler::trace::Trace`]: for each step, the lines of a
//! compiled document that implement it. Each traceable back end answers for its own
//! document through its registry entry's [`Tracer`] ([`crate::Target::trace`]), from the
//! names it renders with (`iptables::names`, `nftables::names`), so a trace names exactly
//! the chains the document has; nothing here names a target. Pure: the document is text
//! handed in.
//!
//! Invariant (tested below on a generated cluster, through the registry): every step a
//! target's tracer shows ([`Tracer::shows`]) gets lines of the document that target
//! renders, so a chain renamed in a renderer and not in its tracer fails a test.

use crate::TARGETS;
use std::net::IpAddr;
use svc_compiler::ir::{NodeView, PortView};
use svc_compiler::trace::{Mode, Rule, Trace, Verdict};

/// A back end's side of `svc-compile trace`: which lines of its document implement each
/// step of a trace.
pub trait Tracer: Sync {
    /// The proxy mode whose decisions its document implements.
    fn mode(&self) -> Mode;
    /// For each step of `t` (same order), the lines of `doc` that implement it (maybe
    /// none). `pv` is the port `t` matched; `dst`, `port`: the packet's destination (the
    /// service-match step shows only the rules that matched it).
    fn rules(
        &self,
        t: &Trace,
        pv: &PortView,
        dst: IpAddr,
        port: u16,
        doc: &str,
    ) -> Vec<Vec<String>>;
    /// What a trace's heading says the lines under its steps are.
    fn heading(&self) -> &'static str {
        match self.mode() {
            Mode::Iptables => "iptables rules",
            Mode::Nftables => "nftables rules",
            Mode::Ipvs => "ipvs rules",
            Mode::Ebpf => "ebpf maps",
        }
    }
    /// Whether [`Tracer::rules`] gives a step of `rule` its lines (it then always does:
    /// tested). Default: every step that stands for rules, i.e. all but the packet's
    /// source and a miss.
    fn shows(&self, rule: Rule) -> bool {
        !matches!(rule, Rule::Source | Rule::NoMatch)
    }
}

/// Targets whose rules a trace can show: those whose registry entry has a [`Tracer`], in
/// [`TARGETS`] order. Computed at compile time, so that it stays a plain slice.
pub const TRACEABLE: &[&str] = &TRACEABLE_NAMES;

const TRACEABLE_COUNT: usize = {
    let (mut i, mut n) = (0, 0);
    while i < TARGETS.len() {
        if TARGETS[i].trace.is_some() {
            n += 1;
        }
        i += 1;
    }
    n
};

const TRACEABLE_NAMES: [&str; TRACEABLE_COUNT] = {
    let mut names = [""; TRACEABLE_COUNT];
    let (mut i, mut n) = (0, 0);
    while i < TARGETS.len() {
        if TARGETS[i].trace.is_some() {
            names[n] = TARGETS[i].name;
            n += 1;
        }
        i += 1;
    }
    names
};

/// The [`Tracer`] of the target named `target`, if it has one.
pub fn tracer(target: &str) -> Option<&'static dyn Tracer> {
    TARGETS.iter().find(|t| t.name == target)?.trace
}

/// For each step of `t` (same order), the lines of `target`'s document `doc` that implement
/// it (maybe none; none at all for a target without a [`Tracer`]). `dst`, `port`: the
/// packet's destination (the service-match step shows only the rule that matched it).
pub fn rules(
    target: &str,
    view: &NodeView,
    t: &Trace,
    dst: IpAddr,
    port: u16,
    doc: &str,
) -> Vec<Vec<String>> {
    match (t.port_index.map(|i| &view.ports[i]), tracer(target)) {
        (Some(pv), Some(tr)) => tr.rules(t, pv, dst, port, doc),
        _ => t.steps.iter().map(|_| Vec::new()).collect(),
    }
}

/// The addresses (`ip:port`) of the backends a trace forwards to, in its order.
pub(crate) fn backends(t: &Trace) -> Vec<String> {
    match &t.verdict {
        Verdict::Forward { backends, .. } => backends.iter().map(|b| b.addr.clone()).collect(),
        _ => Vec::new(),
    }
}

/// The per-port chain names of a chain-based back end: cluster policy, local policy,
/// external, firewall, and the endpoint chains of the trace's backends.
pub(crate) struct Chains {
    pub cluster: String,
    pub local: String,
    pub external: String,
    pub firewall: String,
    pub endpoints: Vec<String>,
}

/// How a back end that compiles to chains of rules (iptables, nftables) spells what
/// [`chain_rules`] selects; its names come from the back end's own name module.
pub(crate) trait ChainSyntax: Sync {
    /// The proxy mode whose decisions its document implements ([`Tracer::mode`]).
    fn mode(&self) -> Mode;
    /// `pv`'s chains, with the endpoint chains of `backends` (`ip:port`, in that order).
    fn chains(&self, pv: &PortView, backends: &[String]) -> Chains;
    /// The rules of `chain`, in document order.
    fn chain_lines(&self, doc: &str, chain: &str) -> Vec<String>;
    /// A line outside the port's chains (which mentions the port) that matches its
    /// destination to send it on: a jump from the services chain, a map element.
    fn is_service_match(&self, line: &str) -> bool;
    /// A line outside the port's firewall chain that belongs to the firewall step.
    fn is_firewall_line(&self, line: &str) -> bool;
    /// The chain that marks a packet for masquerading.
    fn masquerade_chain(&self) -> &'static str;
    /// What a line matching the packet's destination contains: (by address and port, by
    /// port alone for a node port).
    fn destination(&self, pv: &PortView, dst: IpAddr, port: u16) -> (String, String);
    /// A line that matches node ports (of any address of the node).
    fn is_node_port_line(&self, line: &str) -> bool;
}

/// A chain-based back end's tracer: [`chain_rules`] over its spelling.
impl<S: ChainSyntax> Tracer for S {
    fn mode(&self) -> Mode {
        ChainSyntax::mode(self)
    }
    fn rules(
        &self,
        t: &Trace,
        pv: &PortView,
        dst: IpAddr,
        port: u16,
        doc: &str,
    ) -> Vec<Vec<String>> {
        chain_rules(self, t, pv, dst, port, doc)
    }
}

/// [`Tracer::rules`] for a chain-based back end.
fn chain_rules(
    s: &dyn ChainSyntax,
    t: &Trace,
    pv: &PortView,
    dst: IpAddr,
    port: u16,
    doc: &str,
) -> Vec<Vec<String>> {
    let names = s.chains(pv, &backends(t));
    let (by_ip, by_port) = s.destination(pv, dst, port);
    let node_port = t.matched == Some(svc_compiler::trace::Match::NodePort);
    t.steps
        .iter()
        .map(|step| {
            let lines = select(s, doc, pv, &names, step.rule);
            if !matches!(step.rule, Rule::ServiceMatch | Rule::NoEndpoints) {
                return lines;
            }
            // Only the rules or elements for this destination.
            lines
                .into_iter()
                .filter(|l| {
                    if node_port {
                        l.contains(&by_port) && s.is_node_port_line(l)
                    } else {
                        l.contains(&by_ip)
                    }
                })
                .collect()
        })
        .collect()
}

fn select(s: &dyn ChainSyntax, doc: &str, pv: &PortView, n: &Chains, rule: Rule) -> Vec<String> {
    let all = |chains: &[&str]| -> Vec<String> {
        chains.iter().flat_map(|c| s.chain_lines(doc, c)).collect()
    };
    // Lines outside the port's own chains that mention the port: the service-match
    // jumps (iptables) or map elements (nft, by their comment or verdict).
    let mentions = |pred: &dyn Fn(&str) -> bool| -> Vec<String> {
        doc.lines()
            .filter(|l| {
                (l.contains(&n.cluster)
                    || l.contains(&n.external)
                    || l.contains(&n.firewall)
                    || l.contains(&n.local)
                    || l.contains(&format!("{} ", pv.spn))
                    || l.contains(&format!("\"{}\"", pv.spn)))
                    && pred(l)
            })
            .map(|l| l.trim().to_string())
            .collect()
    };
    match rule {
        Rule::ServiceMatch => mentions(&|l| s.is_service_match(l)),
        Rule::Firewall => {
            let mut v = all(&[&n.firewall]);
            v.extend(mentions(&|l| s.is_firewall_line(l)));
            v
        }
        Rule::ExternalPolicy => all(&[&n.external]),
        Rule::ClusterPolicy | Rule::Affinity => all(&[&n.cluster]),
        Rule::LocalPolicy => all(&[&n.local]),
        Rule::Masquerade => {
            let masq = s.masquerade_chain();
            all(&[&n.cluster, &n.external])
                .into_iter()
                .chain(n.endpoints.iter().flat_map(|c| s.chain_lines(doc, c)))
                .filter(|l| l.contains(masq))
                .collect()
        }
        Rule::Endpoints => n
            .endpoints
            .iter()
            .flat_map(|c| s.chain_lines(doc, c))
            .collect(),
        // Either syntax's spelling: a verdict is all the line has to say.
        Rule::NoEndpoints => mentions(&|l| {
            l.contains("REJECT") || l.contains("DROP") || l.contains("reject") || l.contains("drop")
        }),
        Rule::Source | Rule::NoMatch => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Params, Render, Sharing};
    use std::collections::{BTreeSet, HashSet};
    use svc_compiler::net::IpFamily;
    use svc_compiler::passes::node::{node_view, NodeSelection};
    use svc_compiler::source::SourceMap;
    use svc_compiler::synth::{generate, Format, Shape};
    use svc_compiler::trace::{trace, Packet};

    /// The packets that reach `pv` every way it is reachable: from a pod to its cluster
    /// IP, from outside to its external and load-balancer IPs and to its node port.
    fn packets(view: &NodeView, pv: &PortView) -> Vec<Packet> {
        let pod: IpAddr = "10.244.0.99".parse().unwrap();
        let outside: IpAddr = "198.51.100.7".parse().unwrap();
        let mut to: Vec<(IpAddr, IpAddr, u16)> = Vec::new();
        to.extend(pv.cluster_ip.map(|ip| (pod, ip, pv.port)));
        to.extend(pv.external_ips.iter().map(|&ip| (outside, ip, pv.port)));
        to.extend(
            pv.load_balancer_ips
                .iter()
                .map(|&ip| (outside, ip, pv.port)),
        );
        if let (Some(np), Some(&node)) = (pv.node_port, view.node_ips.first()) {
            to.push((outside, node, np));
        }
        to.into_iter()
            .map(|(src, dst, port)| Packet {
                src,
                dst,
                port,
                proto: pv.protocol,
                local_ips: Vec::new(),
                on_node: None,
            })
            .collect()
    }

    /// Every step a target's tracer shows gets lines of the rendered document (and only
    /// those), for every way every port of a generated cluster is reached (cluster IPs,
    /// external and load-balancer IPs, node ports; cluster and local policies, source
    /// ranges, affinity, ports without endpoints): a back end that renames a chain, set or
    /// server line without its tracer following fails here.
    #[test]
    fn traced_steps_find_their_lines() {
        let mut sources = SourceMap::default();
        // Seed 1: a cluster small enough to trace quickly that has every kind of step.
        let shape = Shape {
            services: 60,
            endpoints: 3,
            nodes: 2,
            seed: 1,
        };
        let f = sources.add("cluster.yaml", generate(&shape, Format::YamlStream));
        let opts = svc_compiler::Options {
            allocate: true,
            ..Default::default()
        };
        let comp = svc_compiler::compile(&sources, &[f], &opts);
        assert!(!comp.diags.has_errors());
        for target in TARGETS.iter().filter(|t| t.trace.is_some()) {
            let (name, tr) = (target.name, target.trace.expect("filtered"));
            let Render::Node(make) = target.render else {
                panic!("{name}: a traced target renders one node's document");
            };
            let renderer = make(&Params::default(), Sharing::One);
            // The shown rules seen with lines: each at least once, or the cluster is too
            // plain to test them.
            let mut seen = BTreeSet::new();
            for n in &comp.module.nodes {
                let sel = NodeSelection {
                    name: n.name.clone(),
                    ips: vec![],
                };
                let view = node_view(&comp.module, &sel, IpFamily::IPv4).unwrap();
                let mut doc = String::new();
                renderer.render_into(&view, &mut doc);
                let doc_lines: HashSet<&str> = doc.lines().map(str::trim).collect();
                for pv in &view.ports {
                    for p in packets(&view, pv) {
                        let t = trace(&view, &p, tr.mode());
                        let lines = rules(name, &view, &t, p.dst, p.port, &doc);
                        assert_eq!(lines.len(), t.steps.len(), "{name}");
                        for (step, lines) in t.steps.iter().zip(&lines) {
                            let what = format!("{name}, {}, {:?} {p:?}", pv.spn, step.rule);
                            assert_eq!(tr.shows(step.rule), !lines.is_empty(), "{what}");
                            for l in lines {
                                assert!(doc_lines.contains(l.trim()), "{what}: {l}");
                            }
                            if !lines.is_empty() {
                                seen.insert(format!("{:?}", step.rule));
                            }
                        }
                    }
                }
            }
            let shown: BTreeSet<String> = ALL_RULES
                .iter()
                .filter(|r| tr.shows(**r))
                .map(|r| format!("{r:?}"))
                .collect();
            assert_eq!(seen, shown, "{name}");
        }
    }

    const ALL_RULES: [Rule; 11] = [
        Rule::Source,
        Rule::ServiceMatch,
        Rule::Firewall,
        Rule::ExternalPolicy,
        Rule::ClusterPolicy,
        Rule::LocalPolicy,
        Rule::NoEndpoints,
        Rule::Masquerade,
        Rule::Affinity,
        Rule::Endpoints,
        Rule::NoMatch,
    ];

    /// The derived list is the one `src/` has always been handed, in `--help` order.
    #[test]
    fn traceable_targets() {
        assert_eq!(TRACEABLE, ["iptables", "nftables", "ipvs"]);
        assert!(TRACEABLE.iter().all(|t| tracer(t).is_some()));
        assert!(tracer("ir").is_none() && tracer("nope").is_none());
    }
}
