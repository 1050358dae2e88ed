//! The rules of one service port (kube-proxy's `syncProxyRules` per service port): what
//! captures its addresses, the EXT / FW / SVC / SVL chains, and one KUBE-SEP- chain per
//! endpoint. Sees only the port and [`PortSettings`], so a port's rules can be shared
//! between nodes that agree on both.

use super::document::Sections;
use super::names::{PortChains, SepChain, KUBE_EXTERNAL_SERVICES, KUBE_MARK_MASQ};
use super::names::{KUBE_NODEPORTS, KUBE_PROXY_FIREWALL, KUBE_SERVICES};
use super::Options;
use crate::common::{quote, Quoted};
use std::fmt::Display;
use std::net::IpAddr;
use svc_compiler::ir::{LocalDetector, NoEndpointsVerdict, NodeView, PortView};
use svc_compiler::net::{FastIp, IpFamily};

/// kube-proxy's counter of localhost node-port connections (`Options::nfacct`).
const NFACCT_LOCALHOST_NODEPORT: &str = "localhost_nps_accepted_pkts";

/// What a service port's rules read of the node's view, beside the port itself: nodes
/// that agree on these and on the port share its rendering.
#[derive(Clone, PartialEq)]
pub struct PortSettings {
    family: IpFamily,
    large_cluster: bool,
    masquerade_all: bool,
    local_detector: Option<LocalDetector>,
    localhost_node_ports: bool,
}

impl PortSettings {
    pub(super) fn of(view: &NodeView) -> PortSettings {
        PortSettings {
            family: view.family,
            large_cluster: view.large_cluster,
            masquerade_all: view.masquerade_all,
            local_detector: view.local_detector.clone(),
            localhost_node_ports: view.localhost_node_ports,
        }
    }
}

/// Writes service ports' rules; sees only the ports and [`PortSettings`].
struct PortWriter<'a> {
    s: &'a PortSettings,
    opts: &'a Options,
    probabilities: Probabilities,
}

/// The KUBE-SEP- chain of each endpoint some chain dispatches to, hashed once; indexed
/// like `PortView::endpoints`.
struct SepChains(Vec<Option<SepChain>>);

impl SepChains {
    fn new(p: &PortView, reachable: &[u32]) -> SepChains {
        let mut seps = Vec::new();
        if !reachable.is_empty() {
            seps.resize_with(p.endpoints.len(), || None);
        }
        let proto = p.protocol.lower();
        for &i in reachable {
            let addr = &p.endpoints[i as usize].addr;
            seps[i as usize] = Some(SepChain::new(&p.spn, proto, addr));
        }
        SepChains(seps)
    }
    fn get(&self, i: u32) -> &SepChain {
        self.0[i as usize].as_ref().expect("a reachable endpoint")
    }
}

/// `-m tcp -p tcp -d 10.0.0.1 --dport 80`-style matches, with the destination in between.
struct Dest<'a> {
    proto: &'a str,
    ip: &'a IpAddr,
    port: u16,
}

impl Display for Dest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Dest { proto, ip, port } = self;
        write!(f, "-m {proto} -p {proto} -d {} --dport {port}", FastIp(ip))
    }
}

/// `-m comment --comment X ` for the per-endpoint rules, which large-cluster mode leaves
/// out to keep the ruleset small.
struct EndpointComment<T>(Option<T>);

impl<T: Display> Display for EndpointComment<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(c) => write!(f, "-m comment --comment {c} "),
            None => Ok(()),
        }
    }
}

/// Writes the rules of `ports` into `out`, one port after the other.
pub(super) fn write(out: &mut Sections, s: &PortSettings, opts: &Options, ports: &[PortView]) {
    let mut w = PortWriter {
        s,
        opts,
        probabilities: Probabilities::default(),
    };
    for p in ports {
        w.write(out, p);
    }
}

/// One service port as its rules see it: its chains, and what the node pass decided for it
/// (see `PortView`); the rules only print these decisions.
struct Port<'a> {
    p: &'a PortView,
    proto: &'static str,
    spn: &'a str,
    c: PortChains,
    /// The endpoints either endpoint set can reach, and their KUBE-SEP- chains.
    reachable: Vec<u32>,
    seps: SepChains,
    /// REJECT or DROP, for traffic with no endpoint to go to.
    verdict: &'static str,
    verdict_comment: String,
}

impl<'a> Port<'a> {
    fn new(p: &'a PortView) -> Self {
        let proto = p.protocol.lower();
        let spn = p.spn.as_str();
        let c = PortChains::new(spn, proto);
        let reachable = p.reachable_endpoints();
        let seps = SepChains::new(p, &reachable);
        let (verdict, verdict_comment) = match p.no_endpoints_verdict {
            NoEndpointsVerdict::Drop => ("DROP", quote(&format!("{spn} has no local endpoints"))),
            NoEndpointsVerdict::Reject => ("REJECT", quote(&format!("{spn} has no endpoints"))),
        };
        Port {
            p,
            proto,
            spn,
            c,
            reachable,
            seps,
            verdict,
            verdict_comment,
        }
    }

    fn dest<'b>(&'b self, ip: &'b IpAddr) -> Dest<'b> {
        Dest {
            proto: self.proto,
            ip,
            port: self.p.port,
        }
    }

    /// Where traffic to the cluster IP goes.
    fn internal_chain(&self) -> &str {
        if self.p.internal_local {
            &self.c.svl
        } else {
            &self.c.svc
        }
    }

    /// Where the EXT chain sends traffic that may stay.
    fn external_policy_chain(&self) -> &str {
        if self.p.external_local {
            &self.c.svl
        } else {
            &self.c.svc
        }
    }

    fn uses_fw_chain(&self) -> bool {
        self.p.uses_firewall_chain.iptables
    }

    /// `"SPN WHAT"`, quoted.
    fn comment(&self, what: &'a str) -> Quoted<Labelled<'a>> {
        Quoted(Labelled(self.spn, what))
    }
}

/// `SPN WHAT`, written without allocating.
#[derive(Clone, Copy)]
struct Labelled<'a>(&'a str, &'a str);

impl Display for Labelled<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.0, self.1)
    }
}

impl PortWriter<'_> {
    /// The per-endpoint comment, `None` in large-cluster mode.
    fn endpoint_comment<T>(&self, comment: T) -> EndpointComment<T> {
        EndpointComment((!self.s.large_cluster).then_some(comment))
    }

    /// All rules of one port, in kube-proxy's order.
    fn write(&mut self, out: &mut Sections, p: &PortView) {
        let port = Port::new(p);
        capture_cluster_ip(out, &port);
        capture_external_ips(out, &port);
        capture_load_balancer_ips(out, &port);
        self.capture_node_port(out, &port);
        health_check(out, &port);
        self.masquerade_internal(out, &port);
        self.external_chain(out, &port);
        firewall_chain(out, &port);
        if !p.cluster_endpoints.is_empty() {
            out.nat_chain(&port.c.svc);
            self.write_dispatch(out, p, &port.c.svc, &p.cluster_endpoints, &port.seps);
        }
        if !p.local_endpoints.is_empty() {
            out.nat_chain(&port.c.svl);
            self.write_dispatch(out, p, &port.c.svl, &p.local_endpoints, &port.seps);
        }
        self.endpoint_chains(out, &port);
    }

    /// The node port. Source ranges never apply to it.
    fn capture_node_port(&self, out: &mut Sections, port: &Port) {
        let Port {
            p, proto, spn, c, ..
        } = port;
        let Some(np) = p.node_port else {
            return;
        };
        if p.has_endpoints {
            if self.s.localhost_node_ports && self.s.family == IpFamily::IPv4 && self.opts.nfacct {
                // Same jump, only counted: kube-proxy's metric of localhost node-port use.
                out.nat_rule(format_args!(
                    "-A {KUBE_NODEPORTS} -m comment --comment {spn} -m {proto} -p {proto} -d 127.0.0.0/8 --dport {np} -m nfacct --nfacct-name {NFACCT_LOCALHOST_NODEPORT} -j {}",
                    c.ext
                ));
            }
            out.nat_rule(format_args!(
                "-A {KUBE_NODEPORTS} -m comment --comment {spn} -m {proto} -p {proto} --dport {np} -j {}",
                c.ext
            ));
        }
        if !p.has_external_endpoints {
            let (verdict, comment) = (port.verdict, &port.verdict_comment);
            out.filter_rule(format_args!(
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {comment} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np} -j {verdict}"
            ));
        }
    }

    /// Internal traffic: masquerade what does not come from a local pod, since a route to
    /// the service range via this node may bounce off-node.
    fn masquerade_internal(&self, out: &mut Sections, port: &Port) {
        let (true, Some(cip)) = (port.p.has_internal_endpoints, &port.p.cluster_ip) else {
            return;
        };
        let condition = if self.s.masquerade_all {
            Some(String::new())
        } else {
            self.s
                .local_detector
                .as_ref()
                .map(|d| format!(" {}", detector_args(d, false)))
        };
        if let Some(condition) = condition {
            out.nat_rule(format_args!(
                "-A {} -m comment --comment {} {}{condition} -j {KUBE_MARK_MASQ}",
                port.internal_chain(),
                port.comment("cluster IP"),
                port.dest(cip)
            ));
        }
    }

    /// External traffic: every external destination goes through the EXT chain.
    fn external_chain(&self, out: &mut Sections, port: &Port) {
        let Port { p, spn, c, .. } = port;
        if !p.uses_external_chain {
            return;
        }
        let ext = &c.ext;
        out.nat_chain(ext);
        if !p.external_local {
            // Cluster policy may send it to another node: masquerade.
            out.nat_rule(format_args!(
                "-A {ext} -m comment --comment {} -j {KUBE_MARK_MASQ}",
                Quoted(format_args!(
                    "masquerade traffic for {spn} external destinations"
                ))
            ));
        } else {
            // Local policy keeps the client IP, except for traffic from this node: pods
            // are sent on as if they had gone out to the load balancer and back, and the
            // host (whose source would be the VIP) is masqueraded.
            if let Some(d) = &self.s.local_detector {
                out.nat_rule(format_args!(
                    "-A {ext} -m comment --comment {} {} -j {}",
                    Quoted(format_args!("pod traffic for {spn} external destinations")),
                    detector_args(d, true),
                    c.svc
                ));
            }
            out.nat_rule(format_args!(
                "-A {ext} -m comment --comment {} -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}",
                Quoted(format_args!(
                    "masquerade LOCAL traffic for {spn} external destinations"
                ))
            ));
            out.nat_rule(format_args!(
                "-A {ext} -m comment --comment {} -m addrtype --src-type LOCAL -j {}",
                Quoted(format_args!(
                    "route LOCAL traffic for {spn} external destinations"
                )),
                c.svc
            ));
        }
        if p.has_external_endpoints {
            out.nat_rule(format_args!("-A {ext} -j {}", port.external_policy_chain()));
        }
    }

    /// One chain per endpoint either set can reach: hairpin masquerade, then DNAT.
    fn endpoint_chains(&self, out: &mut Sections, port: &Port) {
        let Port { p, proto, spn, .. } = port;
        let comment = self.endpoint_comment(spn);
        for &i in &port.reachable {
            let ep = &p.endpoints[i as usize];
            let chain = port.seps.get(i);
            out.nat_chain(chain);
            out.nat_rule(format_args!(
                "-A {chain} {comment}-s {} -j {KUBE_MARK_MASQ}",
                FastIp(&ep.ip)
            ));
            if p.affinity_timeout.is_some() {
                out.nat_rule(format_args!(
                    "-A {chain} {comment}-m recent --name {chain} --set -m {proto} -p {proto} -j DNAT --to-destination {}",
                    ep.addr
                ));
            } else {
                out.nat_rule(format_args!(
                    "-A {chain} {comment}-m {proto} -p {proto} -j DNAT --to-destination {}",
                    ep.addr
                ));
            }
        }
    }

    /// Affinity rules first (a client seen recently goes back to its endpoint), then
    /// the random choice: rule i of n matches with probability 1/(n-i), the last always.
    fn write_dispatch(
        &mut self,
        out: &mut Sections,
        p: &PortView,
        chain: &str,
        set: &[u32],
        seps: &SepChains,
    ) {
        let sep = |i| seps.get(i);
        let comment = |w: &Self, i: u32| {
            w.endpoint_comment(Quoted(format_args!(
                "{} -> {}",
                p.spn, p.endpoints[i as usize].addr
            )))
            .to_string()
        };
        if let Some(timeout) = p.affinity_timeout {
            for &i in set {
                let target = sep(i);
                out.nat_rule(format_args!("-A {chain} {}-m recent --name {target} --rcheck --seconds {timeout} --reap -j {target}",
                    comment(self, i)));
            }
        }
        let n = set.len();
        self.probabilities.prepare(n);
        for (k, &i) in set.iter().enumerate() {
            let comment = comment(self, i);
            if k + 1 < n {
                let probability = self.probabilities.get(n - k);
                out.nat_rule(format_args!("-A {chain} {comment}-m statistic --mode random --probability {probability} -j {}",
                    sep(i)));
            } else {
                out.nat_rule(format_args!("-A {chain} {comment}-j {}", sep(i)));
            }
        }
    }
}

/// The cluster IP: to the internal chain, or REJECT/DROP without internal endpoints.
fn capture_cluster_ip(out: &mut Sections, port: &Port) {
    let Some(cip) = &port.p.cluster_ip else {
        return;
    };
    let m = port.dest(cip);
    if port.p.has_internal_endpoints {
        out.nat_rule(format_args!(
            "-A {KUBE_SERVICES} -m comment --comment {} {m} -j {}",
            port.comment("cluster IP"),
            port.internal_chain()
        ));
    } else {
        let (verdict, comment) = (port.verdict, &port.verdict_comment);
        out.filter_rule(format_args!(
            "-A {KUBE_SERVICES} -m comment --comment {comment} {m} -j {verdict}"
        ));
    }
}

/// External IPs: to the EXT chain; REJECT/DROP without external endpoints.
fn capture_external_ips(out: &mut Sections, port: &Port) {
    let (verdict, comment) = (port.verdict, &port.verdict_comment);
    for ip in &port.p.external_ips {
        let m = port.dest(ip);
        if port.p.has_endpoints {
            out.nat_rule(format_args!(
                "-A {KUBE_SERVICES} -m comment --comment {} {m} -j {}",
                port.comment("external IP"),
                port.c.ext
            ));
        }
        if !port.p.has_external_endpoints {
            out.filter_rule(format_args!(
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {comment} {m} -j {verdict}"
            ));
        }
    }
}

/// Load-balancer IPs: to the FW chain (source ranges) or the EXT chain; what the FW chain
/// does not accept is dropped in filter; REJECT/DROP without external endpoints.
fn capture_load_balancer_ips(out: &mut Sections, port: &Port) {
    let Port { p, c, .. } = port;
    let lb_chain = if port.uses_fw_chain() { &c.fw } else { &c.ext };
    for ip in &p.load_balancer_ips {
        let m = port.dest(ip);
        if p.has_endpoints {
            out.nat_rule(format_args!(
                "-A {KUBE_SERVICES} -m comment --comment {} {m} -j {lb_chain}",
                port.comment("loadbalancer IP")
            ));
        }
        if port.uses_fw_chain() {
            // Whatever the FW chain did not accept reaches filter unDNATed.
            out.filter_rule(format_args!(
                "-A {KUBE_PROXY_FIREWALL} -m comment --comment {} {m} -j DROP",
                Quoted(format_args!(
                    "{} traffic not accepted by {}",
                    port.spn, c.fw
                ))
            ));
        }
    }
    if !p.has_external_endpoints {
        let (verdict, comment) = (port.verdict, &port.verdict_comment);
        for ip in &p.load_balancer_ips {
            out.filter_rule(format_args!(
                "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {comment} {} -j {verdict}",
                port.dest(ip)
            ));
        }
    }
}

/// Health checks are answered whether or not this node has local endpoints.
fn health_check(out: &mut Sections, port: &Port) {
    if let Some(hc) = port.p.health_check_node_port {
        out.filter_rule(format_args!(
            "-A {KUBE_NODEPORTS} -m comment --comment {} -m tcp -p tcp --dport {hc} -j ACCEPT",
            port.comment("health check node port")
        ));
    }
}

/// loadBalancerSourceRanges: accept the ranges, fall through to the filter DROP.
fn firewall_chain(out: &mut Sections, port: &Port) {
    let Port { p, spn, c, .. } = port;
    if !port.uses_fw_chain() {
        return;
    }
    let (fw, ext) = (&c.fw, &c.ext);
    let lb_comment = port.comment("loadbalancer IP");
    out.nat_chain(fw);
    for cidr in &p.source_ranges {
        out.nat_rule(format_args!(
            "-A {fw} -m comment --comment {lb_comment} -s {cidr} -j {ext}"
        ));
    }
    if p.source_ranges_include_node {
        // A VIP that is also a local address loops node traffic back with the VIP as
        // source.
        for ip in &p.load_balancer_ips {
            out.nat_rule(format_args!(
                "-A {fw} -m comment --comment {lb_comment} -s {ip} -j {ext}"
            ));
        }
    }
    out.nat_rule(format_args!(
        "-A {fw} -m comment --comment {}",
        Quoted(format_args!(
            "other traffic to {spn} will be dropped by {KUBE_PROXY_FIREWALL}"
        ))
    ));
}

/// Go's `%0.10f` of 1/n for n = 2, 3, ...: every service's dispatch writes the same few,
/// so each is formatted once. Both Go and Rust round the exact binary value half to even.
#[derive(Default)]
pub(super) struct Probabilities(Vec<String>);

impl Probabilities {
    pub(super) fn prepare(&mut self, upto: usize) {
        while self.0.len() + 2 <= upto {
            let n = self.0.len() + 2;
            self.0.push(format!("{:.10}", 1.0 / n as f64));
        }
    }
    pub(super) fn get(&self, n: usize) -> &str {
        &self.0[n - 2]
    }
}

/// The local detector's match, or its negation.
fn detector_args(d: &LocalDetector, local: bool) -> String {
    let not = if local { "" } else { "! " };
    match d {
        LocalDetector::Cidr(cidr) => format!("{not}-s {cidr}"),
        LocalDetector::BridgeInterface(name) => format!("{not}-i {name}"),
        LocalDetector::InterfaceNamePrefix(prefix) => format!("{not}-i {prefix}+"),
    }
}
