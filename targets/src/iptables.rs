//! iptables-restore output at kube-proxy (iptables mode) parity.
//!
//! [`write_string`] turns one [`NodeView`] into the document kube-proxy's proxier for that
//! family produces on a full sync (`pkg/proxy/iptables/proxier.go`, `syncProxyRules`):
//! `*filter` then `*nat`, chain lines first, then rules, in kube-proxy's order and
//! spelling (comment quoting, `%0.10f` probabilities, argument order). IPv6 views give
//! the ip6tables document.
//!
//! kube-proxy also changes iptables outside its restore data: `iptables.Monitor` creates
//! the empty `KUBE-PROXY-CANARY` chain in mangle, nat and filter, and each full sync runs
//! `EnsureChain` + `EnsureRule(Prepend)` for the jumps from the built-in chains. With
//! [`Options::setup`] those come first, as `-I` lines in kube-proxy's order, so that
//! `iptables-restore --noflush` of the whole file into an empty network namespace leaves
//! the same rules, in the same order, as kube-proxy starting there. Loading it twice
//! duplicates those jumps (kube-proxy checks with `-C` first; restore files cannot).
//!
//! Service order: kube-proxy walks a Go map, so its order changes from sync to sync. We
//! write services in [`NodeView::ports`] order (sorted by namespace, name, port name,
//! protocol), which is also the order its own tests compare in after sorting. Stale
//! chains (`-X`) are never written: a compiled ruleset has no previous state.

use crate::common::{chain_hash, quote, Cached, ChainHash, PortCache, Quoted};
use std::fmt::{Display, Write as _};
use std::net::IpAddr;
use std::sync::Arc;
use svc_compiler::ir::{LocalDetector, NodePortAddresses, NodeView, PortView};
use svc_compiler::net::FastIp;
use svc_compiler::net::IpFamily;

/// How the output should match a particular kube-proxy environment. The defaults are what a
/// current kube-proxy on a common node writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub mark: MarkFormat,
    /// Append `--random-fully` to the MASQUERADE rule (kube-proxy does when the iptables
    /// binary supports it, i.e. iptables ≥ 1.6.2).
    pub random_fully: bool,
    /// Use the nfacct counters `ct_state_invalid_dropped_pkts` and
    /// `localhost_nps_accepted_pkts` (kube-proxy does when it could create them over
    /// netlink). Off by default: the counters are not iptables objects, so a document
    /// using them only loads where they already exist.
    pub nfacct: bool,
    /// Write the canary chains and the jump rules from the built-in chains before the
    /// restore data (see the module docs).
    pub setup: bool,
}

/// How the masquerade mark is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkFormat {
    /// `0x00004000`: Go's `%#08x`, what kube-proxy writes.
    Padded,
    /// `0x4000`: what kube-proxy's unit tests inject and what iptables-save prints.
    Short,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mark: MarkFormat::Padded,
            random_fully: true,
            nfacct: false,
            setup: true,
        }
    }
}

/// The iptables-restore document for `view` (see the module docs).
pub fn write_string(view: &NodeView, opts: &Options) -> String {
    let mut text = String::new();
    render(view, opts, None, &mut text);
    text
}

/// Writes the documents of many nodes of one module (`--all-nodes`), each distinct service
/// port rendered once: on most nodes most ports render the same. Nodes may be written in
/// parallel. The output is [`write_string`]'s.
#[derive(Default)]
pub struct Renderer {
    opts: Options,
    cache: PortCache<PortSettings, Sections>,
}

impl Renderer {
    pub fn new(opts: Options) -> Renderer {
        Renderer {
            opts,
            cache: PortCache::default(),
        }
    }
    pub fn write_string(&self, view: &NodeView) -> String {
        let mut text = String::new();
        self.write_into(view, &mut text);
        text
    }
    /// [`Renderer::write_string`] into `text` (cleared first), reusing its memory.
    pub fn write_into(&self, view: &NodeView, text: &mut String) {
        render(view, &self.opts, Some(&self.cache), text)
    }
}

fn render(
    view: &NodeView,
    opts: &Options,
    cache: Option<&PortCache<PortSettings, Sections>>,
    text: &mut String,
) {
    let mark = match opts.mark {
        MarkFormat::Padded => format!("{:#010x}", view.masquerade_mark),
        MarkFormat::Short => format!("{:#x}", view.masquerade_mark),
    };
    let w = Writer { view, opts, mark };
    let (mut head, mut tail) = (Sections::default(), Sections::default());
    w.head(&mut head);
    w.tail(&mut tail);
    let settings = PortSettings::of(view);
    let mut ports = PortWriter {
        s: &settings,
        opts,
        probabilities: Probabilities::default(),
    };
    // The ports' rules: written one after the other, or each looked up in the cache.
    let pieces: Vec<Piece> = match cache {
        None => {
            // In parallel: a window of ports at a time, cut into runs each written into its
            // own sections, then appended in order.
            use rayon::prelude::*;
            const RUN: usize = 64;
            let mut s = Sections::default();
            for window in view.ports.chunks(RUN * 32) {
                let runs: Vec<Sections> = window
                    .par_chunks(RUN)
                    .map(|run| {
                        let mut w = PortWriter {
                            s: &settings,
                            opts,
                            probabilities: Probabilities::default(),
                        };
                        let mut sections = Sections::default();
                        for p in run {
                            w.write(&mut sections, p);
                        }
                        sections
                    })
                    .collect();
                runs.iter().for_each(|r| s.append(r));
            }
            vec![Piece::Own(s)]
        }
        Some(cache) => view
            .ports
            .iter()
            .map(|p| {
                Piece::Shared(cache.get_or_render(&settings, p, || {
                    let mut s = Sections::default();
                    ports.write(&mut s, p);
                    s
                }))
            })
            .collect(),
    };

    let (tool, v) = match view.family {
        IpFamily::IPv4 => ("iptables-restore", "IPv4"),
        IpFamily::IPv6 => ("ip6tables-restore", "IPv6"),
    };
    text.clear();
    let _ = writeln!(
        text,
        "# svc-compile: kube-proxy (iptables mode) rules for node {}, {v}; load with `{tool} --noflush`",
        view.node_name
    );
    if opts.setup {
        write_setup(text);
        text.push_str("# The restore data of a full sync.\n");
    }
    // Each section: the fixed head, every port's part, the fixed tail. Sized first, so the
    // document is copied together once.
    let all = || {
        std::iter::once(&head)
            .chain(pieces.iter().map(Piece::sections))
            .chain([&tail])
    };
    text.reserve(all().map(Sections::len).sum::<usize>() + 64);
    for (table, chains, rules) in [
        (
            "filter",
            Sections::filter_chains as Part,
            Sections::filter_rules as Part,
        ),
        ("nat", Sections::nat_chains, Sections::nat_rules),
    ] {
        let _ = writeln!(text, "*{table}");
        all().for_each(|s| text.push_str(chains(s)));
        all().for_each(|s| text.push_str(rules(s)));
        text.push_str("COMMIT\n");
    }
}

/// Ports' rules: rendered for this node, or one port's shared with other nodes.
enum Piece {
    Own(Sections),
    Shared(Arc<Cached<PortSettings, Sections>>),
}

impl Piece {
    fn sections(&self) -> &Sections {
        match self {
            Piece::Own(s) => s,
            Piece::Shared(c) => &c.rendered,
        }
    }
}

/// A section of [`Sections`].
type Part = fn(&Sections) -> &str;

/// kube-proxy's jump rules, in the order it ensures them (its own list, then the copy of
/// kubelet's KUBE-FIREWALL jumps): (table, from, to, extra match, comment).
#[rustfmt::skip]
const JUMPS: &[(&str, &str, &str, &str, &str)] = &[
    ("filter", "INPUT", "KUBE-EXTERNAL-SERVICES", CT_NEW, "kubernetes externally-visible service portals"),
    ("filter", "FORWARD", "KUBE-EXTERNAL-SERVICES", CT_NEW, "kubernetes externally-visible service portals"),
    ("filter", "INPUT", "KUBE-NODEPORTS", "", "kubernetes health check service ports"),
    ("filter", "FORWARD", "KUBE-SERVICES", CT_NEW, "kubernetes service portals"),
    ("filter", "OUTPUT", "KUBE-SERVICES", CT_NEW, "kubernetes service portals"),
    ("filter", "FORWARD", "KUBE-FORWARD", "", "kubernetes forwarding rules"),
    ("filter", "INPUT", "KUBE-PROXY-FIREWALL", CT_NEW, "kubernetes load balancer firewall"),
    ("filter", "OUTPUT", "KUBE-PROXY-FIREWALL", CT_NEW, "kubernetes load balancer firewall"),
    ("filter", "FORWARD", "KUBE-PROXY-FIREWALL", CT_NEW, "kubernetes load balancer firewall"),
    ("nat", "OUTPUT", "KUBE-SERVICES", "", "kubernetes service portals"),
    ("nat", "PREROUTING", "KUBE-SERVICES", "", "kubernetes service portals"),
    ("nat", "POSTROUTING", "KUBE-POSTROUTING", "", "kubernetes postrouting rules"),
    ("filter", "INPUT", "KUBE-FIREWALL", "", ""),
    ("filter", "OUTPUT", "KUBE-FIREWALL", "", ""),
];

const CT_NEW: &str = "-m conntrack --ctstate NEW";
const CANARY: &str = "KUBE-PROXY-CANARY";

/// The canary chains and the jumps. Each jump is prepended, so later entries end up above
/// earlier ones, exactly as kube-proxy's `EnsureRule(Prepend)` calls leave them.
fn write_setup(out: &mut String) {
    out.push_str(
        "# Set up outside the restore data: canary chains and jumps (iptables -N / -I).\n",
    );
    let _ = writeln!(out, "*mangle\n:{CANARY} - [0:0]\nCOMMIT");
    for table in ["filter", "nat"] {
        let _ = writeln!(out, "*{table}\n:{CANARY} - [0:0]");
        let mut created: Vec<&str> = Vec::new();
        for &(t, _, to, _, _) in JUMPS {
            if t == table && !created.contains(&to) {
                created.push(to);
                let _ = writeln!(out, ":{to} - [0:0]");
            }
        }
        for &(_, from, to, extra, comment) in JUMPS.iter().filter(|j| j.0 == table) {
            let _ = write!(out, "-I {from}");
            if !extra.is_empty() {
                let _ = write!(out, " {extra}");
            }
            if !comment.is_empty() {
                let _ = write!(out, " -m comment --comment {}", quote(comment));
            }
            let _ = writeln!(out, " -j {to}");
        }
        out.push_str("COMMIT\n");
    }
}

const KUBE_SERVICES: &str = "KUBE-SERVICES";
const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
const KUBE_FORWARD: &str = "KUBE-FORWARD";
const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
const KUBE_FIREWALL: &str = "KUBE-FIREWALL";

const NFACCT_INVALID: &str = "ct_state_invalid_dropped_pkts";
const NFACCT_LOCALHOST_NODEPORT: &str = "localhost_nps_accepted_pkts";

/// Append one line to a section of the document (writing to a String cannot fail).
macro_rules! line {
    ($buf:expr, $($arg:tt)*) => {{
        let _ = writeln!($buf, $($arg)*);
    }};
}

/// The restore data, section by section, each a growing String: the chain declarations
/// and the rules of `filter` and `nat`.
#[derive(Default)]
struct Sections {
    filter_chains: String,
    filter_rules: String,
    nat_chains: String,
    nat_rules: String,
}

impl Sections {
    fn append(&mut self, other: &Sections) {
        self.filter_chains.push_str(&other.filter_chains);
        self.filter_rules.push_str(&other.filter_rules);
        self.nat_chains.push_str(&other.nat_chains);
        self.nat_rules.push_str(&other.nat_rules);
    }
    fn filter_chains(&self) -> &str {
        &self.filter_chains
    }
    fn filter_rules(&self) -> &str {
        &self.filter_rules
    }
    fn nat_chains(&self) -> &str {
        &self.nat_chains
    }
    fn nat_rules(&self) -> &str {
        &self.nat_rules
    }
    fn len(&self) -> usize {
        self.filter_chains.len()
            + self.filter_rules.len()
            + self.nat_chains.len()
            + self.nat_rules.len()
    }
}

/// The rules that do not belong to a service port.
struct Writer<'a> {
    view: &'a NodeView,
    opts: &'a Options,
    mark: String,
}

/// What a service port's rules read of the node's view, beside the port itself: nodes
/// that agree on these and on the port share its rendering.
#[derive(Clone, PartialEq)]
struct PortSettings {
    family: IpFamily,
    large_cluster: bool,
    masquerade_all: bool,
    local_detector: Option<LocalDetector>,
    localhost_node_ports: bool,
}

impl PortSettings {
    fn of(view: &NodeView) -> PortSettings {
        PortSettings {
            family: view.family,
            large_cluster: view.large_cluster,
            masquerade_all: view.masquerade_all,
            local_detector: view.local_detector.clone(),
            localhost_node_ports: view.localhost_node_ports,
        }
    }
}

/// Writes one service port's rules; sees only the port and [`PortSettings`].
struct PortWriter<'a> {
    s: &'a PortSettings,
    opts: &'a Options,
    probabilities: Probabilities,
}

fn chain_line(out: &mut String, name: impl Display) {
    line!(out, ":{name} - [0:0]");
}

/// The chain names of one service port; they share one hash.
struct Chains {
    svc: String,
    svl: String,
    ext: String,
    fw: String,
}

/// `KUBE-SEP-<hash>`.
struct SepChain(ChainHash);

impl Display for SepChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KUBE-SEP-{}", self.0)
    }
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
            seps[i as usize] = Some(SepChain(chain_hash(&[&p.spn, proto, addr])));
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

impl Writer<'_> {
    /// Chains and rules before the service ports.
    fn head(&self, out: &mut Sections) {
        for chain in [
            KUBE_SERVICES,
            KUBE_EXTERNAL_SERVICES,
            KUBE_FORWARD,
            KUBE_NODEPORTS,
            KUBE_PROXY_FIREWALL,
        ] {
            chain_line(&mut out.filter_chains, chain);
        }
        for chain in [
            KUBE_SERVICES,
            KUBE_NODEPORTS,
            KUBE_POSTROUTING,
            KUBE_MARK_MASQ,
        ] {
            chain_line(&mut out.nat_chains, chain);
        }

        let mark = &self.mark;
        line!(
            out.nat_rules,
            "-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN"
        );
        // Clear the mark so a packet that goes through the stack again is not
        // masqueraded twice.
        line!(
            out.nat_rules,
            "-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}"
        );
        line!(
            out.nat_rules,
            "-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{}",
            if self.opts.random_fully { " --random-fully" } else { "" }
        );
        line!(
            out.nat_rules,
            "-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}"
        );

        if self.view.martian_rule {
            // route_localnet (needed for localhost node ports) lets remote hosts reach
            // 127.0.0.0/8; this closes that hole (a copy of kubelet's rule).
            chain_line(&mut out.filter_chains, KUBE_FIREWALL);
            line!(
                out.filter_rules,
                "-A {KUBE_FIREWALL} -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
            );
        }
    }

    /// Rules after the service ports.
    fn tail(&self, out: &mut Sections) {
        self.write_nodeports_tail(out);

        let mark = &self.mark;
        if self.view.drop_invalid {
            // INVALID packets would otherwise reach the pod un-NATed and reset connections.
            let nfacct = if self.opts.nfacct {
                format!(" -m nfacct --nfacct-name {NFACCT_INVALID}")
            } else {
                String::new()
            };
            line!(
                out.filter_rules,
                "-A {KUBE_FORWARD} -m conntrack --ctstate INVALID{nfacct} -j DROP"
            );
        }
        line!(
            out.filter_rules,
            "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
        );
        line!(
            out.filter_rules,
            "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
        );
    }

    /// The jump to KUBE-NODEPORTS; it must stay the last rule of nat KUBE-SERVICES.
    fn write_nodeports_tail(&self, out: &mut Sections) {
        let comment =
            "-m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\"";
        match &self.view.node_port_addresses {
            NodePortAddresses::All => {
                // Localhost node ports never work on IPv6, and on IPv4 only with
                // route_localnet, which kube-proxy sets only when they are on.
                let not_loopback = match self.view.family {
                    IpFamily::IPv6 => " ! -d ::1/128",
                    IpFamily::IPv4 if !self.view.localhost_node_ports => " ! -d 127.0.0.0/8",
                    IpFamily::IPv4 => "",
                };
                line!(
                    out.nat_rules,
                    "-A {KUBE_SERVICES} {comment} -m addrtype --dst-type LOCAL{not_loopback} -j {KUBE_NODEPORTS}"
                );
            }
            NodePortAddresses::Ips(ips) => {
                for ip in ips {
                    line!(
                        out.nat_rules,
                        "-A {KUBE_SERVICES} {comment} -d {ip} -j {KUBE_NODEPORTS}"
                    );
                }
            }
        }
    }
}

impl PortWriter<'_> {
    /// The per-endpoint comment, `None` in large-cluster mode.
    fn endpoint_comment<T>(&self, comment: T) -> EndpointComment<T> {
        EndpointComment((!self.s.large_cluster).then_some(comment))
    }

    fn write(&mut self, out: &mut Sections, p: &PortView) {
        let proto = p.protocol.lower();
        let spn = p.spn.as_str();
        let hash = chain_hash(&[spn, proto]);
        let c = Chains {
            svc: format!("KUBE-SVC-{hash}"),
            svl: format!("KUBE-SVL-{hash}"),
            ext: format!("KUBE-EXT-{hash}"),
            fw: format!("KUBE-FW-{hash}"),
        };
        let reachable = p.reachable_endpoints();
        let seps = SepChains::new(p, &reachable);
        let sep = |i| seps.get(i);
        let dest = |ip| Dest {
            proto,
            ip,
            port: p.port,
        };

        let has_endpoints = p.has_endpoints;
        let uses_cluster_chain = !p.cluster_endpoints.is_empty();
        let uses_local_chain = !p.local_endpoints.is_empty();
        let internal_chain = if p.internal_local { &c.svl } else { &c.svc };
        let has_internal = has_endpoints && (!p.internal_local || uses_local_chain);
        let external_policy_chain = if p.external_local { &c.svl } else { &c.svc };
        let has_external = has_endpoints && (!p.external_local || uses_local_chain);
        // Built even without external endpoints: its short-circuit rules for pod and
        // host traffic still apply.
        let uses_ext_chain = has_endpoints && p.externally_accessible;
        let uses_fw_chain =
            has_endpoints && !p.load_balancer_ips.is_empty() && !p.source_ranges.is_empty();
        let lb_chain = if uses_fw_chain { &c.fw } else { &c.ext };

        // Filter verdicts: REJECT when nothing serves the service anywhere, DROP when
        // only the Local policy leaves this node without endpoints.
        let (verdict, verdict_comment) = if has_endpoints {
            ("DROP", quote(&format!("{spn} has no local endpoints")))
        } else {
            ("REJECT", quote(&format!("{spn} has no endpoints")))
        };
        let cluster_ip_comment = Quoted(format_args!("{spn} cluster IP"));
        let lb_comment = Quoted(format_args!("{spn} loadbalancer IP"));

        // Capture the cluster IP.
        if let Some(cip) = &p.cluster_ip {
            let m = dest(cip);
            if has_internal {
                line!(
                    out.nat_rules,
                    "-A {KUBE_SERVICES} -m comment --comment {cluster_ip_comment} {m} -j {internal_chain}"
                );
            } else {
                line!(
                    out.filter_rules,
                    "-A {KUBE_SERVICES} -m comment --comment {verdict_comment} {m} -j {verdict}"
                );
            }
        }

        // Capture external IPs.
        for ip in &p.external_ips {
            let m = dest(ip);
            if has_endpoints {
                line!(
                    out.nat_rules,
                    "-A {KUBE_SERVICES} -m comment --comment {} {m} -j {}",
                    Quoted(format_args!("{spn} external IP")),
                    c.ext
                );
            }
            if !has_external {
                line!(
                    out.filter_rules,
                    "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {verdict_comment} {m} -j {verdict}"
                );
            }
        }

        // Capture load-balancer IPs.
        for ip in &p.load_balancer_ips {
            let m = dest(ip);
            if has_endpoints {
                line!(
                    out.nat_rules,
                    "-A {KUBE_SERVICES} -m comment --comment {lb_comment} {m} -j {lb_chain}"
                );
            }
            if uses_fw_chain {
                // Whatever the FW chain did not accept reaches filter unDNATed.
                line!(
                    out.filter_rules,
                    "-A {KUBE_PROXY_FIREWALL} -m comment --comment {} {m} -j DROP",
                    Quoted(format_args!("{spn} traffic not accepted by {}", c.fw))
                );
            }
        }
        if !has_external {
            for ip in &p.load_balancer_ips {
                line!(
                    out.filter_rules,
                    "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {verdict_comment} {} -j {verdict}",
                    dest(ip)
                );
            }
        }

        // Capture the node port. Source ranges never apply to it.
        if let Some(np) = p.node_port {
            if has_endpoints {
                if self.s.localhost_node_ports
                    && self.s.family == IpFamily::IPv4
                    && self.opts.nfacct
                {
                    // Same jump, only counted: kube-proxy's metric of localhost node-port use.
                    line!(
                        out.nat_rules,
                        "-A {KUBE_NODEPORTS} -m comment --comment {spn} -m {proto} -p {proto} -d 127.0.0.0/8 --dport {np} -m nfacct --nfacct-name {NFACCT_LOCALHOST_NODEPORT} -j {}",
                        c.ext
                    );
                }
                line!(
                    out.nat_rules,
                    "-A {KUBE_NODEPORTS} -m comment --comment {spn} -m {proto} -p {proto} --dport {np} -j {}",
                    c.ext
                );
            }
            if !has_external {
                line!(
                    out.filter_rules,
                    "-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {verdict_comment} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np} -j {verdict}"
                );
            }
        }

        // Health checks are answered whether or not this node has local endpoints.
        if let Some(hc) = p.health_check_node_port {
            line!(
                out.filter_rules,
                "-A {KUBE_NODEPORTS} -m comment --comment {} -m tcp -p tcp --dport {hc} -j ACCEPT",
                Quoted(format_args!("{spn} health check node port"))
            );
        }

        // Internal traffic: masquerade what does not come from a local pod, since a
        // route to the service range via this node may bounce off-node.
        if has_internal {
            if let Some(cip) = &p.cluster_ip {
                let m = dest(cip);
                let condition = if self.s.masquerade_all {
                    Some(String::new())
                } else {
                    self.s
                        .local_detector
                        .as_ref()
                        .map(|d| format!(" {}", detector_args(d, false)))
                };
                if let Some(condition) = condition {
                    line!(
                        out.nat_rules,
                        "-A {internal_chain} -m comment --comment {cluster_ip_comment} {m}{condition} -j {KUBE_MARK_MASQ}"
                    );
                }
            }
        }

        // External traffic: every external destination goes through the EXT chain.
        if uses_ext_chain {
            chain_line(&mut out.nat_chains, &c.ext);
            if !p.external_local {
                // Cluster policy may send it to another node: masquerade.
                line!(
                    out.nat_rules,
                    "-A {} -m comment --comment {} -j {KUBE_MARK_MASQ}",
                    c.ext,
                    Quoted(format_args!(
                        "masquerade traffic for {spn} external destinations"
                    ))
                );
            } else {
                // Local policy keeps the client IP, except for traffic from this node:
                // pods are sent on as if they had gone out to the load balancer and
                // back, and the host (whose source would be the VIP) is masqueraded.
                if let Some(d) = &self.s.local_detector {
                    line!(
                        out.nat_rules,
                        "-A {} -m comment --comment {} {} -j {}",
                        c.ext,
                        Quoted(format_args!("pod traffic for {spn} external destinations")),
                        detector_args(d, true),
                        c.svc
                    );
                }
                line!(
                    out.nat_rules,
                    "-A {} -m comment --comment {} -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}",
                    c.ext,
                    Quoted(format_args!(
                        "masquerade LOCAL traffic for {spn} external destinations"
                    ))
                );
                line!(
                    out.nat_rules,
                    "-A {} -m comment --comment {} -m addrtype --src-type LOCAL -j {}",
                    c.ext,
                    Quoted(format_args!(
                        "route LOCAL traffic for {spn} external destinations"
                    )),
                    c.svc
                );
            }
            if has_external {
                line!(out.nat_rules, "-A {} -j {external_policy_chain}", c.ext);
            }
        }

        // loadBalancerSourceRanges: accept the ranges, fall through to the filter DROP.
        if uses_fw_chain {
            chain_line(&mut out.nat_chains, &c.fw);
            for cidr in &p.source_ranges {
                line!(
                    out.nat_rules,
                    "-A {} -m comment --comment {lb_comment} -s {cidr} -j {}",
                    c.fw,
                    c.ext
                );
            }
            if p.source_ranges_include_node {
                // A VIP that is also a local address loops node traffic back with the
                // VIP as source.
                for ip in &p.load_balancer_ips {
                    line!(
                        out.nat_rules,
                        "-A {} -m comment --comment {lb_comment} -s {ip} -j {}",
                        c.fw,
                        c.ext
                    );
                }
            }
            line!(
                out.nat_rules,
                "-A {} -m comment --comment {}",
                c.fw,
                Quoted(format_args!(
                    "other traffic to {spn} will be dropped by {KUBE_PROXY_FIREWALL}"
                ))
            );
        }

        if uses_cluster_chain {
            chain_line(&mut out.nat_chains, &c.svc);
            self.write_dispatch(out, p, &c.svc, &p.cluster_endpoints, &seps);
        }
        if uses_local_chain {
            chain_line(&mut out.nat_chains, &c.svl);
            self.write_dispatch(out, p, &c.svl, &p.local_endpoints, &seps);
        }

        // One chain per endpoint either set can reach: hairpin masquerade, then DNAT.
        let comment = self.endpoint_comment(spn);
        for &i in &reachable {
            let ep = &p.endpoints[i as usize];
            let chain = sep(i);
            chain_line(&mut out.nat_chains, chain);
            line!(
                out.nat_rules,
                "-A {chain} {comment}-s {} -j {KUBE_MARK_MASQ}",
                FastIp(&ep.ip)
            );
            if p.affinity_timeout.is_some() {
                line!(
                    out.nat_rules,
                    "-A {chain} {comment}-m recent --name {chain} --set -m {proto} -p {proto} -j DNAT --to-destination {}",
                    ep.addr
                );
            } else {
                line!(
                    out.nat_rules,
                    "-A {chain} {comment}-m {proto} -p {proto} -j DNAT --to-destination {}",
                    ep.addr
                );
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
                line!(
                    out.nat_rules,
                    "-A {chain} {}-m recent --name {target} --rcheck --seconds {timeout} --reap -j {target}",
                    comment(self, i)
                );
            }
        }
        let n = set.len();
        self.probabilities.prepare(n);
        for (k, &i) in set.iter().enumerate() {
            let comment = comment(self, i);
            if k + 1 < n {
                let probability = self.probabilities.get(n - k);
                line!(
                    out.nat_rules,
                    "-A {chain} {comment}-m statistic --mode random --probability {probability} -j {}",
                    sep(i)
                );
            } else {
                line!(out.nat_rules, "-A {chain} {comment}-j {}", sep(i));
            }
        }
    }
}

/// Go's `%0.10f` of 1/n for n = 2, 3, ...: every service's dispatch writes the same few,
/// so each is formatted once. Both Go and Rust round the exact binary value half to even.
#[derive(Default)]
struct Probabilities(Vec<String>);

impl Probabilities {
    fn prepare(&mut self, upto: usize) {
        while self.0.len() + 2 <= upto {
            let n = self.0.len() + 2;
            self.0.push(format!("{:.10}", 1.0 / n as f64));
        }
    }
    fn get(&self, n: usize) -> &str {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::{endpoint_hash, port_proto_hash};
    use std::collections::BTreeMap;
    use svc_compiler::ir::{
        ClusterConfig, DetectLocalMode, Endpoint, LoadBalancerIngress, Module, Node,
        NodePortAddress, Protocol, ProxyConfig, Service, ServicePort, ServiceType, TargetPort,
        TrafficPolicy,
    };
    use svc_compiler::net::Cidr;
    use svc_compiler::passes::node::{node_view, NodeSelection};

    // Conventions of kube-proxy's proxier_test.go: pod IPs 10.0.0.0/8, service IPs
    // 172.30.0.0/16, this node `test-node` at 192.168.0.2.
    const TEST_NODE: &str = "test-node";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn module(services: Vec<Service>) -> Module {
        Module {
            cluster: ClusterConfig {
                service_cidrs: vec![cidr("172.30.0.0/16"), cidr("fd00:30::/108")],
                node_port_range: (30000, 32767),
                cluster_domain: "cluster.local".into(),
            },
            proxy: ProxyConfig {
                mode: "iptables".into(),
                cluster_cidrs: vec![cidr("10.0.0.0/8"), cidr("fd00:10::/64")],
                detect_local: DetectLocalMode::ClusterCIDR,
                masquerade_all: false,
                masquerade_bit: 14,
                localhost_node_ports: true,
                node_port_addresses: vec![],
                ipvs_scheduler: "rr".into(),
                conntrack_tcp_be_liberal: false,
                ipvs: Default::default(),
            },
            services,
            nodes: vec![Node {
                name: TEST_NODE.into(),
                addresses: vec![ip("192.168.0.2"), ip("2001:db8::1")],
                labels: BTreeMap::new(),
                pod_cidrs: vec![],
            }],
        }
    }

    /// A service with one TCP port `p80` (port 80) and these endpoints (`ip`, `ip@node`,
    /// with `#serving-terminating`, `#terminating` or `#not-ready` for a non-ready one;
    /// port 80), sorted the way the Module keeps them.
    fn service(ns: &str, name: &str, kind: ServiceType, cip: &str, eps: &[&str]) -> Service {
        let mut endpoints: Vec<Endpoint> = eps
            .iter()
            .map(|e| {
                let (e, state) = e.split_once('#').unwrap_or((e, ""));
                let (addr, node) = e.split_once('@').unwrap_or((e, ""));
                Endpoint {
                    ip: ip(addr),
                    port: 80,
                    addr: svc_compiler::net::join_host_port(&ip(addr), 80).into(),
                    node_name: (!node.is_empty()).then(|| node.into()),
                    zone: None,
                    ready: state.is_empty(),
                    serving: state.is_empty() || state == "serving-terminating",
                    terminating: state.contains("terminating"),
                    hint_zones: vec![],
                    hint_nodes: vec![],
                    source: format!("EndpointSlice {ns}/{name}").into(),
                }
            })
            .collect();
        endpoints.sort_by(|a, b| a.addr.cmp(&b.addr));
        let cluster_ip = ip(cip);
        Service {
            namespace: ns.into(),
            name: name.into(),
            kind,
            headless: false,
            cluster_ips: vec![cluster_ip],
            ip_families: vec![IpFamily::of(&cluster_ip)],
            external_name: None,
            external_ips: vec![],
            load_balancer_ingress: vec![],
            load_balancer_source_ranges: vec![],
            external_traffic_policy: TrafficPolicy::Cluster,
            internal_traffic_policy: TrafficPolicy::Cluster,
            session_affinity_timeout: None,
            health_check_node_port: None,
            topology_keys: vec![],
            traffic_distribution: None,
            ports: vec![ServicePort {
                name: "p80".into(),
                protocol: Protocol::TCP,
                port: 80,
                node_port: None,
                target_port: TargetPort::Number(80),
                endpoints,
            }],
            allocated: vec![],
        }
    }

    fn lb_ingress(ips: &[&str]) -> Vec<LoadBalancerIngress> {
        ips.iter()
            .map(|i| LoadBalancerIngress {
                ip: ip(i),
                proxy_mode: false,
            })
            .collect()
    }

    /// The options kube-proxy's unit tests run with (fake iptables without
    /// --random-fully, working nfacct, mark injected as 0x4000), without our setup part.
    fn upstream_test_options() -> Options {
        Options {
            mark: MarkFormat::Short,
            random_fully: false,
            nfacct: true,
            setup: false,
        }
    }

    fn compile(m: &Module, family: IpFamily, opts: &Options) -> String {
        let sel = NodeSelection {
            name: TEST_NODE.into(),
            ips: vec![],
        };
        write_string(&node_view(m, &sel, family).unwrap(), opts)
    }

    /// kube-proxy's `sortIPTablesRules`: tables by name; chains KUBE-NODEPORTS,
    /// KUBE-SERVICES, other KUBE-* alphabetically, then the rest; rules of the
    /// KUBE-NODEPORTS and KUBE-SERVICES chains stably sorted by the service name in their
    /// comment (the "must be the last rule" rule kept last); `#` lines dropped.
    fn sort_like_upstream(doc: &str) -> String {
        type Table<'a> = (&'a str, Vec<&'a str>, BTreeMap<&'a str, Vec<&'a str>>);
        let mut tables: Vec<Table> = Vec::new();
        for line in doc.lines().filter(|l| !l.starts_with('#')) {
            if let Some(name) = line.strip_prefix('*') {
                tables.push((name, Vec::new(), BTreeMap::new()));
            } else if let Some(decl) = line.strip_prefix(':') {
                let t = tables.last_mut().unwrap();
                t.1.push(decl.split(' ').next().unwrap());
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let chain = rule.split(' ').next().unwrap();
                let t = tables.last_mut().unwrap();
                t.2.entry(chain).or_default().push(line);
            } else {
                assert_eq!(line, "COMMIT", "unexpected line");
            }
        }
        tables.sort_by_key(|t| t.0);
        let rank = |c: &str| match c {
            "KUBE-NODEPORTS" => 0,
            "KUBE-SERVICES" => 1,
            c if c.starts_with("KUBE-") => 2,
            _ => 3,
        };
        let service_name = |rule: &str| -> String {
            let Some((_, rest)) = rule.split_once("--comment ") else {
                return String::new();
            };
            let value = match rest.strip_prefix('"') {
                Some(quoted) => quoted.split('"').next().unwrap(),
                None => rest.split(' ').next().unwrap(),
            };
            value.split([' ', ':']).next().unwrap().to_string()
        };
        let mut out = String::new();
        for (name, mut chains, mut rules) in tables {
            chains.sort_by_key(|c| (rank(c), *c));
            for chain in ["KUBE-NODEPORTS", "KUBE-SERVICES"] {
                if let Some(r) = rules.get_mut(chain) {
                    r.sort_by_key(|rule| {
                        (rule.contains("must be the last rule"), service_name(rule))
                    });
                }
            }
            out.push_str(&format!("*{name}\n"));
            for c in &chains {
                out.push_str(&format!(":{c} - [0:0]\n"));
            }
            for c in &chains {
                for rule in rules.get(c).into_iter().flatten() {
                    out.push_str(rule);
                    out.push('\n');
                }
            }
            out.push_str("COMMIT\n");
        }
        out
    }

    /// Strip the leading newline and the indentation of an expected document.
    fn dedent(s: &str) -> String {
        s.trim_start_matches('\n')
            .trim_end()
            .lines()
            .map(|l| l.trim_start())
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    }

    fn assert_lines_eq(got: &str, want: &str) {
        if got != want {
            let g: Vec<&str> = got.lines().collect();
            let w: Vec<&str> = want.lines().collect();
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                if a != b {
                    panic!(
                        "line {}:\n got: {a}\nwant: {b}\n\nfull output:\n{got}",
                        i + 1
                    );
                }
            }
            panic!("{} lines, want {}\n\nfull output:\n{got}", g.len(), w.len());
        }
    }

    /// kube-proxy's TestOverallIPTablesRules, rebuilt from the same objects.
    #[test]
    fn overall_rules_match_upstream() {
        let svc1 = service(
            "ns1",
            "svc1",
            ServiceType::ClusterIP,
            "172.30.0.41",
            &["10.180.0.1"],
        );
        // No node name on the endpoint: not local, so ETP=Local has nothing here.
        let mut svc2 = service(
            "ns2",
            "svc2",
            ServiceType::LoadBalancer,
            "172.30.0.42",
            &["10.180.0.2"],
        );
        svc2.external_traffic_policy = TrafficPolicy::Local;
        svc2.ports[0].node_port = Some(3001);
        svc2.load_balancer_ingress = lb_ingress(&["1.2.3.4"]);
        svc2.external_ips = vec![ip("192.168.99.22")];
        svc2.health_check_node_port = Some(30000);
        let mut svc3 = service(
            "ns3",
            "svc3",
            ServiceType::NodePort,
            "172.30.0.43",
            &["10.180.0.3"],
        );
        svc3.ports[0].node_port = Some(3003);
        let mut svc4 = service(
            "ns4",
            "svc4",
            ServiceType::NodePort,
            "172.30.0.44",
            &["10.180.0.4", "10.180.0.5@test-node"],
        );
        svc4.external_ips = vec![ip("192.168.99.33")];
        let mut svc5 = service(
            "ns5",
            "svc5",
            ServiceType::LoadBalancer,
            "172.30.0.45",
            &["10.180.0.3"],
        );
        svc5.ports[0].node_port = Some(3002);
        svc5.load_balancer_ingress = lb_ingress(&["5.6.7.8"]);
        // Ignored: ETP=Cluster needs no health check.
        svc5.health_check_node_port = Some(30000);
        svc5.load_balancer_source_ranges = vec![cidr("203.0.113.0/25")];
        svc5.session_affinity_timeout = Some(10800);
        let svc6 = service("ns6", "svc6", ServiceType::ClusterIP, "172.30.0.46", &[]);
        let m = module(vec![svc1, svc2, svc3, svc4, svc5, svc6]);

        let got = compile(&m, IpFamily::IPv4, &upstream_test_options());
        let want = dedent(
            r#"
            *filter
            :KUBE-NODEPORTS - [0:0]
            :KUBE-SERVICES - [0:0]
            :KUBE-EXTERNAL-SERVICES - [0:0]
            :KUBE-FIREWALL - [0:0]
            :KUBE-FORWARD - [0:0]
            :KUBE-PROXY-FIREWALL - [0:0]
            -A KUBE-NODEPORTS -m comment --comment "ns2/svc2:p80 health check node port" -m tcp -p tcp --dport 30000 -j ACCEPT
            -A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT
            -A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j DROP
            -A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP
            -A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP
            -A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
            -A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP
            -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
            -A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
            -A KUBE-PROXY-FIREWALL -m comment --comment "ns5/svc5:p80 traffic not accepted by KUBE-FW-NUKIZ6OKUXPJNT4C" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP
            COMMIT
            *nat
            :KUBE-NODEPORTS - [0:0]
            :KUBE-SERVICES - [0:0]
            :KUBE-EXT-4SW47YFZTEDKD3PK - [0:0]
            :KUBE-EXT-GNZBNJ2PO5MGZ6GT - [0:0]
            :KUBE-EXT-NUKIZ6OKUXPJNT4C - [0:0]
            :KUBE-EXT-X27LE4BHSL4DOUIK - [0:0]
            :KUBE-FW-NUKIZ6OKUXPJNT4C - [0:0]
            :KUBE-MARK-MASQ - [0:0]
            :KUBE-POSTROUTING - [0:0]
            :KUBE-SEP-C6EBXVWJJZMIWKLZ - [0:0]
            :KUBE-SEP-I77PXRDZVX7PMWMN - [0:0]
            :KUBE-SEP-OYPFS5VJICHGATKP - [0:0]
            :KUBE-SEP-RS4RBKLTHTF2IUXJ - [0:0]
            :KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
            :KUBE-SEP-UKSFD7AGPMPPLUHC - [0:0]
            :KUBE-SVC-4SW47YFZTEDKD3PK - [0:0]
            :KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]
            :KUBE-SVC-NUKIZ6OKUXPJNT4C - [0:0]
            :KUBE-SVC-X27LE4BHSL4DOUIK - [0:0]
            :KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
            -A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3001 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
            -A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
            -A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3003 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-X27LE4BHSL4DOUIK
            -A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp --dport 3003 -j KUBE-EXT-X27LE4BHSL4DOUIK
            -A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3002 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-NUKIZ6OKUXPJNT4C
            -A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp --dport 3002 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
            -A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
            -A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
            -A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 external IP" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
            -A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 loadbalancer IP" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
            -A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK
            -A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK
            -A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 external IP" -m tcp -p tcp -d 192.168.99.33 --dport 80 -j KUBE-EXT-4SW47YFZTEDKD3PK
            -A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 -j KUBE-SVC-NUKIZ6OKUXPJNT4C
            -A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 loadbalancer IP" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j KUBE-FW-NUKIZ6OKUXPJNT4C
            -A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
            -A KUBE-EXT-4SW47YFZTEDKD3PK -m comment --comment "masquerade traffic for ns4/svc4:p80 external destinations" -j KUBE-MARK-MASQ
            -A KUBE-EXT-4SW47YFZTEDKD3PK -j KUBE-SVC-4SW47YFZTEDKD3PK
            -A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "pod traffic for ns2/svc2:p80 external destinations" -s 10.0.0.0/8 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
            -A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "masquerade LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
            -A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
            -A KUBE-EXT-NUKIZ6OKUXPJNT4C -m comment --comment "masquerade traffic for ns5/svc5:p80 external destinations" -j KUBE-MARK-MASQ
            -A KUBE-EXT-NUKIZ6OKUXPJNT4C -j KUBE-SVC-NUKIZ6OKUXPJNT4C
            -A KUBE-EXT-X27LE4BHSL4DOUIK -m comment --comment "masquerade traffic for ns3/svc3:p80 external destinations" -j KUBE-MARK-MASQ
            -A KUBE-EXT-X27LE4BHSL4DOUIK -j KUBE-SVC-X27LE4BHSL4DOUIK
            -A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
            -A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "other traffic to ns5/svc5:p80 will be dropped by KUBE-PROXY-FIREWALL"
            -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
            -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
            -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
            -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
            -A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -s 10.180.0.5 -j KUBE-MARK-MASQ
            -A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.5:80
            -A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
            -A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
            -A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
            -A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
            -A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
            -A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
            -A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
            -A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
            -A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -s 10.180.0.4 -j KUBE-MARK-MASQ
            -A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.4:80
            -A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
            -A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC
            -A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.5:80" -j KUBE-SEP-C6EBXVWJJZMIWKLZ
            -A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
            -A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ
            -A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
            -A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --rcheck --seconds 10800 --reap -j KUBE-SEP-I77PXRDZVX7PMWMN
            -A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -j KUBE-SEP-I77PXRDZVX7PMWMN
            -A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
            -A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.3:80" -j KUBE-SEP-OYPFS5VJICHGATKP
            -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
            -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ
            COMMIT
            "#,
        );
        assert_lines_eq(&sort_like_upstream(&got), &want);
    }

    /// The rules of `chain` in `table` (restore data only: setup has no `-A` lines).
    fn rules<'a>(doc: &'a str, table: &str, chain: &str) -> Vec<&'a str> {
        let mut current = "";
        let prefix = format!("-A {chain} ");
        doc.lines()
            .filter(|l| {
                if let Some(t) = l.strip_prefix('*') {
                    current = t;
                }
                current == table && l.starts_with(&prefix)
            })
            .collect()
    }

    /// kube-proxy's TestTerminatingEndpointsTrafficPolicyLocal: ETP=Local with affinity,
    /// first with local ready endpoints, then with only local terminating ones.
    #[test]
    fn terminating_endpoints_with_local_policy_match_upstream() {
        let lb = |eps: &[&str]| {
            let mut s = service("ns1", "svc1", ServiceType::LoadBalancer, "172.30.1.1", eps);
            s.ports[0].name.clear();
            s.external_traffic_policy = TrafficPolicy::Local;
            s.health_check_node_port = Some(30000);
            s.session_affinity_timeout = Some(10800);
            s.load_balancer_ingress = lb_ingress(&["1.2.3.4"]);
            module(vec![s])
        };
        // That version of the test predates the nfacct counters.
        let opts = Options {
            nfacct: false,
            ..upstream_test_options()
        };
        let static_part = dedent(
            r#"
            *filter
            :KUBE-NODEPORTS - [0:0]
            :KUBE-SERVICES - [0:0]
            :KUBE-EXTERNAL-SERVICES - [0:0]
            :KUBE-FIREWALL - [0:0]
            :KUBE-FORWARD - [0:0]
            :KUBE-PROXY-FIREWALL - [0:0]
            -A KUBE-NODEPORTS -m comment --comment "ns1/svc1 health check node port" -m tcp -p tcp --dport 30000 -j ACCEPT
            -A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
            -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
            -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
            -A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
            COMMIT
            *nat
            :KUBE-NODEPORTS - [0:0]
            :KUBE-SERVICES - [0:0]
            :KUBE-EXT-AQI2S6QIMU7PVVRP - [0:0]
            :KUBE-MARK-MASQ - [0:0]
            :KUBE-POSTROUTING - [0:0]
            "#,
        );
        let ext = dedent(
            r#"
            -A KUBE-SERVICES -m comment --comment "ns1/svc1 cluster IP" -m tcp -p tcp -d 172.30.1.1 --dport 80 -j KUBE-SVC-AQI2S6QIMU7PVVRP
            -A KUBE-SERVICES -m comment --comment "ns1/svc1 loadbalancer IP" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j KUBE-EXT-AQI2S6QIMU7PVVRP
            -A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
            -A KUBE-EXT-AQI2S6QIMU7PVVRP -m comment --comment "pod traffic for ns1/svc1 external destinations" -s 10.0.0.0/8 -j KUBE-SVC-AQI2S6QIMU7PVVRP
            -A KUBE-EXT-AQI2S6QIMU7PVVRP -m comment --comment "masquerade LOCAL traffic for ns1/svc1 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
            -A KUBE-EXT-AQI2S6QIMU7PVVRP -m comment --comment "route LOCAL traffic for ns1/svc1 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-AQI2S6QIMU7PVVRP
            -A KUBE-EXT-AQI2S6QIMU7PVVRP -j KUBE-SVL-AQI2S6QIMU7PVVRP
            -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
            -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
            -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
            -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
            "#,
        );

        let ready = lb(&[
            "10.0.1.1@test-node",
            "10.0.1.2@test-node",
            "10.0.1.3@test-node#serving-terminating",
            "10.0.1.4@test-node#terminating",
            "10.0.1.5@host-1",
        ]);
        let want = static_part.clone()
            + &dedent(
                r#"
            :KUBE-SEP-3JOIVZTXZZRGORX4 - [0:0]
            :KUBE-SEP-EQCHZ7S2PJ72OHAY - [0:0]
            :KUBE-SEP-IO5XOSKPAXIFQXAJ - [0:0]
            :KUBE-SVC-AQI2S6QIMU7PVVRP - [0:0]
            :KUBE-SVL-AQI2S6QIMU7PVVRP - [0:0]
            "#,
            )
            + &ext
            + &dedent(
                r#"
            -A KUBE-SEP-3JOIVZTXZZRGORX4 -m comment --comment ns1/svc1 -s 10.0.1.1 -j KUBE-MARK-MASQ
            -A KUBE-SEP-3JOIVZTXZZRGORX4 -m comment --comment ns1/svc1 -m recent --name KUBE-SEP-3JOIVZTXZZRGORX4 --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.1:80
            -A KUBE-SEP-EQCHZ7S2PJ72OHAY -m comment --comment ns1/svc1 -s 10.0.1.5 -j KUBE-MARK-MASQ
            -A KUBE-SEP-EQCHZ7S2PJ72OHAY -m comment --comment ns1/svc1 -m recent --name KUBE-SEP-EQCHZ7S2PJ72OHAY --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.5:80
            -A KUBE-SEP-IO5XOSKPAXIFQXAJ -m comment --comment ns1/svc1 -s 10.0.1.2 -j KUBE-MARK-MASQ
            -A KUBE-SEP-IO5XOSKPAXIFQXAJ -m comment --comment ns1/svc1 -m recent --name KUBE-SEP-IO5XOSKPAXIFQXAJ --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.2:80
            -A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 cluster IP" -m tcp -p tcp -d 172.30.1.1 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
            -A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80" -m recent --name KUBE-SEP-3JOIVZTXZZRGORX4 --rcheck --seconds 10800 --reap -j KUBE-SEP-3JOIVZTXZZRGORX4
            -A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" -m recent --name KUBE-SEP-IO5XOSKPAXIFQXAJ --rcheck --seconds 10800 --reap -j KUBE-SEP-IO5XOSKPAXIFQXAJ
            -A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.5:80" -m recent --name KUBE-SEP-EQCHZ7S2PJ72OHAY --rcheck --seconds 10800 --reap -j KUBE-SEP-EQCHZ7S2PJ72OHAY
            -A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80" -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-3JOIVZTXZZRGORX4
            -A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-IO5XOSKPAXIFQXAJ
            -A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.5:80" -j KUBE-SEP-EQCHZ7S2PJ72OHAY
            -A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80" -m recent --name KUBE-SEP-3JOIVZTXZZRGORX4 --rcheck --seconds 10800 --reap -j KUBE-SEP-3JOIVZTXZZRGORX4
            -A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" -m recent --name KUBE-SEP-IO5XOSKPAXIFQXAJ --rcheck --seconds 10800 --reap -j KUBE-SEP-IO5XOSKPAXIFQXAJ
            -A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-3JOIVZTXZZRGORX4
            -A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" -j KUBE-SEP-IO5XOSKPAXIFQXAJ
            COMMIT
            "#,
            );
        assert_lines_eq(
            &sort_like_upstream(&compile(&ready, IpFamily::IPv4, &opts)),
            &want,
        );

        let terminating = lb(&[
            "10.0.1.2@test-node#serving-terminating",
            "10.0.1.3@test-node#serving-terminating",
            "10.0.1.4@test-node#terminating",
            "10.0.1.5@host-1",
        ]);
        let want = static_part
            + &dedent(
                r#"
            :KUBE-SEP-EQCHZ7S2PJ72OHAY - [0:0]
            :KUBE-SEP-IO5XOSKPAXIFQXAJ - [0:0]
            :KUBE-SEP-XGJFVO3L2O5SRFNT - [0:0]
            :KUBE-SVC-AQI2S6QIMU7PVVRP - [0:0]
            :KUBE-SVL-AQI2S6QIMU7PVVRP - [0:0]
            "#,
            )
            + &ext
            + &dedent(
                r#"
            -A KUBE-SEP-EQCHZ7S2PJ72OHAY -m comment --comment ns1/svc1 -s 10.0.1.5 -j KUBE-MARK-MASQ
            -A KUBE-SEP-EQCHZ7S2PJ72OHAY -m comment --comment ns1/svc1 -m recent --name KUBE-SEP-EQCHZ7S2PJ72OHAY --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.5:80
            -A KUBE-SEP-IO5XOSKPAXIFQXAJ -m comment --comment ns1/svc1 -s 10.0.1.2 -j KUBE-MARK-MASQ
            -A KUBE-SEP-IO5XOSKPAXIFQXAJ -m comment --comment ns1/svc1 -m recent --name KUBE-SEP-IO5XOSKPAXIFQXAJ --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.2:80
            -A KUBE-SEP-XGJFVO3L2O5SRFNT -m comment --comment ns1/svc1 -s 10.0.1.3 -j KUBE-MARK-MASQ
            -A KUBE-SEP-XGJFVO3L2O5SRFNT -m comment --comment ns1/svc1 -m recent --name KUBE-SEP-XGJFVO3L2O5SRFNT --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.3:80
            -A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 cluster IP" -m tcp -p tcp -d 172.30.1.1 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
            -A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.5:80" -m recent --name KUBE-SEP-EQCHZ7S2PJ72OHAY --rcheck --seconds 10800 --reap -j KUBE-SEP-EQCHZ7S2PJ72OHAY
            -A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.5:80" -j KUBE-SEP-EQCHZ7S2PJ72OHAY
            -A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" -m recent --name KUBE-SEP-IO5XOSKPAXIFQXAJ --rcheck --seconds 10800 --reap -j KUBE-SEP-IO5XOSKPAXIFQXAJ
            -A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.3:80" -m recent --name KUBE-SEP-XGJFVO3L2O5SRFNT --rcheck --seconds 10800 --reap -j KUBE-SEP-XGJFVO3L2O5SRFNT
            -A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-IO5XOSKPAXIFQXAJ
            -A KUBE-SVL-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.3:80" -j KUBE-SEP-XGJFVO3L2O5SRFNT
            COMMIT
            "#,
            );
        assert_lines_eq(
            &sort_like_upstream(&compile(&terminating, IpFamily::IPv4, &opts)),
            &want,
        );
    }

    fn node_port_service() -> Service {
        let mut s = service(
            "ns1",
            "svc1",
            ServiceType::NodePort,
            "172.30.0.41",
            &["10.180.0.1@test-node", "10.180.0.2"],
        );
        s.ports[0].node_port = Some(30080);
        s
    }

    /// The whole document with the defaults: setup first (canaries, jumps in kube-proxy's
    /// prepend order), then the restore data in kube-proxy's emission order, with the
    /// mark as kube-proxy formats it and `--random-fully`.
    #[test]
    fn default_document() {
        let got = compile(
            &module(vec![node_port_service()]),
            IpFamily::IPv4,
            &Options::default(),
        );
        let want = dedent(
            r#"
            # svc-compile: kube-proxy (iptables mode) rules for node test-node, IPv4; load with `iptables-restore --noflush`
            # Set up outside the restore data: canary chains and jumps (iptables -N / -I).
            *mangle
            :KUBE-PROXY-CANARY - [0:0]
            COMMIT
            *filter
            :KUBE-PROXY-CANARY - [0:0]
            :KUBE-EXTERNAL-SERVICES - [0:0]
            :KUBE-NODEPORTS - [0:0]
            :KUBE-SERVICES - [0:0]
            :KUBE-FORWARD - [0:0]
            :KUBE-PROXY-FIREWALL - [0:0]
            :KUBE-FIREWALL - [0:0]
            -I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
            -I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
            -I INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
            -I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
            -I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
            -I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
            -I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
            -I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
            -I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
            -I INPUT -j KUBE-FIREWALL
            -I OUTPUT -j KUBE-FIREWALL
            COMMIT
            *nat
            :KUBE-PROXY-CANARY - [0:0]
            :KUBE-SERVICES - [0:0]
            :KUBE-POSTROUTING - [0:0]
            -I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
            -I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
            -I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
            COMMIT
            # The restore data of a full sync.
            *filter
            :KUBE-SERVICES - [0:0]
            :KUBE-EXTERNAL-SERVICES - [0:0]
            :KUBE-FORWARD - [0:0]
            :KUBE-NODEPORTS - [0:0]
            :KUBE-PROXY-FIREWALL - [0:0]
            :KUBE-FIREWALL - [0:0]
            -A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
            -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
            -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x00004000/0x00004000 -j ACCEPT
            -A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
            COMMIT
            *nat
            :KUBE-SERVICES - [0:0]
            :KUBE-NODEPORTS - [0:0]
            :KUBE-POSTROUTING - [0:0]
            :KUBE-MARK-MASQ - [0:0]
            :KUBE-EXT-XPGD46QRK7WJZT7O - [0:0]
            :KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
            :KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
            :KUBE-SEP-LXVODXWDISEETFEF - [0:0]
            -A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN
            -A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000
            -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
            -A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000
            -A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
            -A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 30080 -j KUBE-EXT-XPGD46QRK7WJZT7O
            -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
            -A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade traffic for ns1/svc1:p80 external destinations" -j KUBE-MARK-MASQ
            -A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVC-XPGD46QRK7WJZT7O
            -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-SXIVWICOYRO3J4NJ
            -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.2:80" -j KUBE-SEP-LXVODXWDISEETFEF
            -A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
            -A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
            -A KUBE-SEP-LXVODXWDISEETFEF -m comment --comment ns1/svc1:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
            -A KUBE-SEP-LXVODXWDISEETFEF -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
            -A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
            COMMIT
            "#,
        );
        assert_lines_eq(&got, &want);

        // Without the setup, the document is exactly kube-proxy's restore data.
        let bare = compile(
            &module(vec![node_port_service()]),
            IpFamily::IPv4,
            &Options {
                setup: false,
                ..Options::default()
            },
        );
        let data = &want[want.find("*filter\n:KUBE-SERVICES").unwrap()..];
        assert_eq!(bare, format!("{}\n{data}", want.lines().next().unwrap()));
    }

    #[test]
    fn ipv6_document() {
        let mut s = service(
            "ns1",
            "svc1",
            ServiceType::LoadBalancer,
            "fd00:30::41",
            &["fd00:10::1@test-node", "fd00:10::2"],
        );
        s.ports[0].node_port = Some(30080);
        s.load_balancer_ingress = lb_ingress(&["2001:db8:5::1"]);
        // Upstream never counts localhost node ports on IPv6, nfacct or not.
        let opts = Options {
            nfacct: true,
            ..Options::default()
        };
        let got = compile(&module(vec![s]), IpFamily::IPv6, &opts);
        assert!(got.starts_with(
            "# svc-compile: kube-proxy (iptables mode) rules for node test-node, IPv6; load with `ip6tables-restore --noflush`\n"
        ));
        // No martian rule, so no KUBE-FIREWALL in the restore data (the jump to the
        // empty chain is still made).
        assert!(rules(&got, "filter", "KUBE-FIREWALL").is_empty());
        assert_eq!(got.matches(":KUBE-FIREWALL - [0:0]").count(), 1);
        assert_eq!(
            rules(&got, "nat", "KUBE-NODEPORTS"),
            vec!["-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 30080 -j KUBE-EXT-XPGD46QRK7WJZT7O"]
        );
        assert_eq!(
            rules(&got, "nat", "KUBE-SERVICES"),
            vec![
                "-A KUBE-SERVICES -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp -p tcp -d fd00:30::41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O",
                "-A KUBE-SERVICES -m comment --comment \"ns1/svc1:p80 loadbalancer IP\" -m tcp -p tcp -d 2001:db8:5::1 --dport 80 -j KUBE-EXT-XPGD46QRK7WJZT7O",
                "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS",
            ]
        );
        assert_eq!(
            rules(&got, "nat", "KUBE-SEP-RT5VHSJR44ZNF7G5"),
            vec![
                "-A KUBE-SEP-RT5VHSJR44ZNF7G5 -m comment --comment ns1/svc1:p80 -s fd00:10::1 -j KUBE-MARK-MASQ",
                "-A KUBE-SEP-RT5VHSJR44ZNF7G5 -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination [fd00:10::1]:80",
            ]
        );
        assert!(got.contains(
            "-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp -p tcp -d fd00:30::41 --dport 80 ! -s fd00:10::/64 -j KUBE-MARK-MASQ\n"
        ));
        assert!(got.contains(
            "-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment \"ns1/svc1:p80 -> [fd00:10::1]:80\" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-RT5VHSJR44ZNF7G5\n"
        ));
        // nfacct still applies to the INVALID drop.
        assert_eq!(
            rules(&got, "filter", "KUBE-FORWARD")[0],
            "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"
        );
    }

    /// More than 1000 endpoints: only the per-endpoint rules (SEP chains and the
    /// dispatch to them) lose their comments.
    #[test]
    fn large_cluster_mode() {
        let addrs: Vec<String> = (0..1001)
            .map(|i| format!("10.180.{}.{}", i / 200, i % 200 + 1))
            .collect();
        let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
        let mut s = service("ns1", "svc1", ServiceType::ClusterIP, "172.30.0.41", &refs);
        s.session_affinity_timeout = Some(300);
        let got = compile(&module(vec![s]), IpFamily::IPv4, &upstream_test_options());
        let svc = rules(&got, "nat", "KUBE-SVC-XPGD46QRK7WJZT7O");
        assert_eq!(svc.len(), 1 + 2 * 1001);
        assert_eq!(
            svc[0],
            "-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ"
        );
        // The string order puts 10.180.0.100:80 first and 10.180.5.1:80 last.
        let sep = |addr: &str| format!("KUBE-SEP-{}", endpoint_hash("ns1/svc1:p80", "tcp", addr));
        let (first, last) = (sep("10.180.0.100:80"), sep("10.180.5.1:80"));
        assert_eq!(
            svc[1],
            format!("-A KUBE-SVC-XPGD46QRK7WJZT7O -m recent --name {first} --rcheck --seconds 300 --reap -j {first}")
        );
        assert_eq!(
            svc[1002],
            format!("-A KUBE-SVC-XPGD46QRK7WJZT7O -m statistic --mode random --probability 0.0009990010 -j {first}")
        );
        assert_eq!(svc[2002], format!("-A KUBE-SVC-XPGD46QRK7WJZT7O -j {last}"));
        assert_eq!(
            rules(&got, "nat", &first),
            vec![
                format!("-A {first} -s 10.180.0.100 -j KUBE-MARK-MASQ"),
                format!("-A {first} -m recent --name {first} --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.100:80"),
            ]
        );
        assert!(got.contains("-A KUBE-SERVICES -m comment --comment \"ns1/svc1:p80 cluster IP\""));
    }

    #[test]
    fn internal_local_without_local_endpoints_drops_cluster_ip() {
        let mut s = node_port_service();
        s.internal_traffic_policy = TrafficPolicy::Local;
        s.ports[0].endpoints.remove(0);
        let got = compile(&module(vec![s]), IpFamily::IPv4, &upstream_test_options());
        assert_eq!(
            rules(&got, "filter", "KUBE-SERVICES"),
            vec!["-A KUBE-SERVICES -m comment --comment \"ns1/svc1:p80 has no local endpoints\" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j DROP"]
        );
        // No cluster IP capture, but the node port still reaches the cluster chain,
        // which has no masquerade rule (that belongs to the internal chain, SVL).
        assert_eq!(rules(&got, "nat", "KUBE-SERVICES").len(), 1);
        assert_eq!(
            rules(&got, "nat", "KUBE-EXT-XPGD46QRK7WJZT7O"),
            vec![
                "-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment \"masquerade traffic for ns1/svc1:p80 external destinations\" -j KUBE-MARK-MASQ",
                "-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVC-XPGD46QRK7WJZT7O",
            ]
        );
        assert_eq!(
            rules(&got, "nat", "KUBE-SVC-XPGD46QRK7WJZT7O"),
            vec!["-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment \"ns1/svc1:p80 -> 10.180.0.2:80\" -j KUBE-SEP-LXVODXWDISEETFEF"]
        );
        assert!(!got.contains("KUBE-SVL-"));
        assert!(rules(&got, "filter", "KUBE-EXTERNAL-SERVICES").is_empty());
    }

    #[test]
    fn external_local_with_local_endpoints() {
        let mut s = node_port_service();
        s.kind = ServiceType::LoadBalancer;
        s.external_traffic_policy = TrafficPolicy::Local;
        s.health_check_node_port = Some(30000);
        s.load_balancer_ingress = lb_ingress(&["1.2.3.4"]);
        let got = compile(&module(vec![s]), IpFamily::IPv4, &upstream_test_options());
        assert_eq!(
            rules(&got, "nat", "KUBE-EXT-XPGD46QRK7WJZT7O")
                .last()
                .unwrap(),
            &"-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVL-XPGD46QRK7WJZT7O"
        );
        assert_eq!(
            rules(&got, "nat", "KUBE-SVL-XPGD46QRK7WJZT7O"),
            vec!["-A KUBE-SVL-XPGD46QRK7WJZT7O -m comment --comment \"ns1/svc1:p80 -> 10.180.0.1:80\" -j KUBE-SEP-SXIVWICOYRO3J4NJ"]
        );
        assert_eq!(rules(&got, "nat", "KUBE-SVC-XPGD46QRK7WJZT7O").len(), 3);
        assert!(rules(&got, "filter", "KUBE-EXTERNAL-SERVICES").is_empty());
        assert_eq!(
            rules(&got, "filter", "KUBE-NODEPORTS"),
            vec!["-A KUBE-NODEPORTS -m comment --comment \"ns1/svc1:p80 health check node port\" -m tcp -p tcp --dport 30000 -j ACCEPT"]
        );
        // Each reachable endpoint gets its chain once, in address order.
        let seps: Vec<&str> = got
            .lines()
            .filter(|l| l.starts_with(":KUBE-SEP-"))
            .collect();
        assert_eq!(
            seps,
            vec![
                ":KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]",
                ":KUBE-SEP-LXVODXWDISEETFEF - [0:0]"
            ]
        );
    }

    /// kube-proxy's TestNoEndpointsReject: every destination is rejected in filter and
    /// the service has no nat chains.
    #[test]
    fn no_endpoints_rejects_everything() {
        let mut s = service("ns1", "svc1", ServiceType::LoadBalancer, "172.30.0.41", &[]);
        s.ports[0].node_port = Some(3001);
        s.external_ips = vec![ip("192.168.99.11")];
        s.load_balancer_ingress = lb_ingress(&["1.2.3.4"]);
        s.load_balancer_source_ranges = vec![cidr("203.0.113.0/25")];
        let got = compile(&module(vec![s]), IpFamily::IPv4, &upstream_test_options());
        let reject = "-m comment --comment \"ns1/svc1:p80 has no endpoints\"";
        assert_eq!(
            rules(&got, "filter", "KUBE-SERVICES"),
            vec![format!(
                "-A KUBE-SERVICES {reject} -m tcp -p tcp -d 172.30.0.41 --dport 80 -j REJECT"
            )]
        );
        assert_eq!(
            rules(&got, "filter", "KUBE-EXTERNAL-SERVICES"),
            vec![
                format!("-A KUBE-EXTERNAL-SERVICES {reject} -m tcp -p tcp -d 192.168.99.11 --dport 80 -j REJECT"),
                format!("-A KUBE-EXTERNAL-SERVICES {reject} -m tcp -p tcp -d 1.2.3.4 --dport 80 -j REJECT"),
                format!("-A KUBE-EXTERNAL-SERVICES {reject} -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j REJECT"),
            ]
        );
        assert!(!got.contains("XPGD46QRK7WJZT7O"));
        assert!(!got.contains("KUBE-SEP-"));
        assert!(rules(&got, "filter", "KUBE-PROXY-FIREWALL").is_empty());
    }

    #[test]
    fn source_ranges_that_include_the_node() {
        let mut s = node_port_service();
        s.kind = ServiceType::LoadBalancer;
        s.load_balancer_ingress = lb_ingress(&["1.2.3.4", "5.6.7.8"]);
        s.load_balancer_source_ranges = vec![cidr("203.0.113.0/25"), cidr("192.168.0.0/16")];
        let got = compile(&module(vec![s]), IpFamily::IPv4, &upstream_test_options());
        let fw = "KUBE-FW-XPGD46QRK7WJZT7O";
        let lb = "-m comment --comment \"ns1/svc1:p80 loadbalancer IP\"";
        assert_eq!(
            rules(&got, "nat", fw),
            vec![
                format!("-A {fw} {lb} -s 203.0.113.0/25 -j KUBE-EXT-XPGD46QRK7WJZT7O"),
                format!("-A {fw} {lb} -s 192.168.0.0/16 -j KUBE-EXT-XPGD46QRK7WJZT7O"),
                format!("-A {fw} {lb} -s 1.2.3.4 -j KUBE-EXT-XPGD46QRK7WJZT7O"),
                format!("-A {fw} {lb} -s 5.6.7.8 -j KUBE-EXT-XPGD46QRK7WJZT7O"),
                format!("-A {fw} -m comment --comment \"other traffic to ns1/svc1:p80 will be dropped by KUBE-PROXY-FIREWALL\""),
            ]
        );
        let drop = format!("-m comment --comment \"ns1/svc1:p80 traffic not accepted by {fw}\"");
        assert_eq!(
            rules(&got, "filter", "KUBE-PROXY-FIREWALL"),
            vec![
                format!(
                    "-A KUBE-PROXY-FIREWALL {drop} -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP"
                ),
                format!(
                    "-A KUBE-PROXY-FIREWALL {drop} -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP"
                ),
            ]
        );
        // Node ports bypass the firewall chain.
        assert!(rules(&got, "nat", "KUBE-NODEPORTS")
            .iter()
            .all(|r| r.ends_with("-j KUBE-EXT-XPGD46QRK7WJZT7O")));
    }

    #[test]
    fn masquerade_and_local_detectors() {
        let mut s = node_port_service();
        s.external_traffic_policy = TrafficPolicy::Local;
        let cluster_ip = "-m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.41 --dport 80";
        let pod_traffic =
            "-m comment --comment \"pod traffic for ns1/svc1:p80 external destinations\"";
        let compile_with = |f: &dyn Fn(&mut ProxyConfig)| {
            let mut m = module(vec![s.clone()]);
            f(&mut m.proxy);
            compile(&m, IpFamily::IPv4, &upstream_test_options())
        };
        let svc = "KUBE-SVC-XPGD46QRK7WJZT7O";
        let ext = "KUBE-EXT-XPGD46QRK7WJZT7O";

        let got = compile_with(&|p| p.masquerade_all = true);
        assert_eq!(
            rules(&got, "nat", svc)[0],
            format!("-A {svc} {cluster_ip} -j KUBE-MARK-MASQ")
        );

        let got = compile_with(&|p| p.detect_local = DetectLocalMode::None);
        assert!(!rules(&got, "nat", svc)[0].contains("KUBE-MARK-MASQ"));
        assert!(!got.contains("pod traffic for"));
        assert_eq!(rules(&got, "nat", ext).len(), 3);

        let got =
            compile_with(&|p| p.detect_local = DetectLocalMode::BridgeInterface("cbr0".into()));
        assert_eq!(
            rules(&got, "nat", svc)[0],
            format!("-A {svc} {cluster_ip} ! -i cbr0 -j KUBE-MARK-MASQ")
        );
        assert_eq!(
            rules(&got, "nat", ext)[0],
            format!("-A {ext} {pod_traffic} -i cbr0 -j {svc}")
        );

        let got =
            compile_with(&|p| p.detect_local = DetectLocalMode::InterfaceNamePrefix("veth".into()));
        assert_eq!(
            rules(&got, "nat", svc)[0],
            format!("-A {svc} {cluster_ip} ! -i veth+ -j KUBE-MARK-MASQ")
        );
        assert_eq!(
            rules(&got, "nat", ext)[0],
            format!("-A {ext} {pod_traffic} -i veth+ -j {svc}")
        );
    }

    #[test]
    fn node_port_addresses_and_localhost() {
        let tail = "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\"";
        let mut m = module(vec![node_port_service()]);
        m.proxy.node_port_addresses = vec![
            NodePortAddress::Cidr(cidr("192.168.0.0/24")),
            NodePortAddress::Cidr(cidr("127.0.0.0/8")),
        ];
        let got = compile(&m, IpFamily::IPv4, &upstream_test_options());
        let services = rules(&got, "nat", "KUBE-SERVICES");
        assert_eq!(
            services[1..],
            [
                format!("{tail} -d 192.168.0.2 -j KUBE-NODEPORTS"),
                format!("{tail} -d 127.0.0.1 -j KUBE-NODEPORTS"),
            ]
        );
        assert_eq!(rules(&got, "filter", "KUBE-FIREWALL").len(), 1);

        m.proxy.node_port_addresses.clear();
        m.proxy.localhost_node_ports = false;
        let got = compile(&m, IpFamily::IPv4, &upstream_test_options());
        assert_eq!(
            rules(&got, "nat", "KUBE-SERVICES")[1],
            format!("{tail} -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS")
        );
        // No martian rule and no localhost counting without localhost node ports.
        assert!(!got.contains(":KUBE-FIREWALL"));
        assert!(!got.contains("localhost_nps_accepted_pkts"));
    }

    #[test]
    fn probabilities_unnamed_ports_and_unallocated_cluster_ips() {
        let mut s = service(
            "ns1",
            "svc1",
            ServiceType::NodePort,
            "172.30.0.41",
            &["10.180.0.1", "10.180.0.2", "10.180.0.3", "10.180.0.4"],
        );
        s.ports[0].name.clear();
        s.ports[0].node_port = Some(30080);
        s.ports[0].protocol = Protocol::UDP;
        s.cluster_ips.clear();
        let got = compile(&module(vec![s]), IpFamily::IPv4, &upstream_test_options());
        let chain = format!("KUBE-SVC-{}", port_proto_hash("ns1/svc1", "udp"));
        let dispatch: Vec<String> = rules(&got, "nat", &chain)
            .iter()
            .map(|r| {
                let (head, _) = r.split_once(" -j ").unwrap();
                head.split_once("\" ").map_or("", |(_, p)| p).to_string()
            })
            .collect();
        assert_eq!(
            dispatch,
            vec![
                "-m statistic --mode random --probability 0.2500000000",
                "-m statistic --mode random --probability 0.3333333333",
                "-m statistic --mode random --probability 0.5000000000",
                "",
            ]
        );
        assert!(got.contains("--comment \"ns1/svc1 -> 10.180.0.1:80\""));
        assert!(got.contains("-m comment --comment ns1/svc1 -m udp -p udp --dport 30080"));
        // No cluster IP (--no-allocate): no capture, no masquerade rule, no REJECT.
        assert!(!got.contains("cluster IP"));
        assert_eq!(rules(&got, "nat", "KUBE-SERVICES").len(), 1);
    }

    #[test]
    fn probability_formatting() {
        let mut p = Probabilities::default();
        p.prepare(2048);
        assert_eq!(p.get(2), "0.5000000000");
        assert_eq!(p.get(3), "0.3333333333");
        assert_eq!(p.get(7), "0.1428571429");
        // An exact tie rounds to even, as Go does.
        assert_eq!(p.get(2048), "0.0004882812");
    }

    /// A throwaway network namespace, deleted on drop.
    struct Netns(String);

    impl Netns {
        /// `None` when namespaces cannot be made here (not root, no `ip`).
        fn new() -> Option<Netns> {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let name = format!(
                "svcc-ipt-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            let made = std::process::Command::new("ip")
                .args(["netns", "add", &name])
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            made.then_some(Netns(name))
        }

        fn run(&self, tool: &str, args: &[&str], stdin: &str) -> Result<String, String> {
            use std::io::Write;
            use std::process::{Command, Stdio};
            let mut child = Command::new("ip")
                .args(["netns", "exec", &self.0, tool])
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("{tool}: {e}"))?;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(stdin.as_bytes())
                .map_err(|e| e.to_string())?;
            let out = child.wait_with_output().map_err(|e| e.to_string())?;
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        }
    }

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }

    /// Every feature at once, for one family.
    fn rich_module(v6: bool) -> Module {
        let a = |v4: &str, v6addr: &str| {
            if v6 {
                v6addr.to_string()
            } else {
                v4.to_string()
            }
        };
        let eps = |list: &[(&str, &str, &str)]| -> Vec<String> {
            list.iter()
                .map(|(v4, v6addr, rest)| format!("{}{rest}", a(v4, v6addr)))
                .collect()
        };
        fn refs(v: &[String]) -> Vec<&str> {
            v.iter().map(String::as_str).collect()
        }

        let e1 = eps(&[
            ("10.180.0.1", "fd00:10::1", "@test-node"),
            ("10.180.0.2", "fd00:10::2", ""),
            ("10.180.0.3", "fd00:10::3", "#serving-terminating"),
        ]);
        let mut affinity = service(
            "ns1",
            "affinity",
            ServiceType::ClusterIP,
            &a("172.30.0.41", "fd00:30::41"),
            &refs(&e1),
        );
        affinity.session_affinity_timeout = Some(10800);

        let mut lb = service(
            "ns2",
            "lb",
            ServiceType::LoadBalancer,
            &a("172.30.0.42", "fd00:30::42"),
            &refs(&e1),
        );
        lb.external_traffic_policy = TrafficPolicy::Local;
        lb.health_check_node_port = Some(30000);
        lb.ports[0].node_port = Some(30001);
        lb.external_ips = vec![ip(&a("192.168.99.22", "2001:db8:99::22"))];
        lb.load_balancer_ingress = lb_ingress(&[&a("1.2.3.4", "2001:db8:5::4")]);
        lb.load_balancer_source_ranges = vec![
            cidr(&a("203.0.113.0/25", "2001:db8:113::/64")),
            cidr(&a("192.168.0.0/16", "2001:db8::/48")),
        ];
        let mut udp = lb.ports[0].clone();
        udp.name = "dns".into();
        udp.protocol = Protocol::UDP;
        udp.node_port = Some(30002);
        let mut sctp = udp.clone();
        sctp.name = "sctp".into();
        sctp.protocol = Protocol::SCTP;
        sctp.node_port = Some(30003);
        lb.ports.extend([udp, sctp]);

        let e2 = eps(&[("10.180.0.2", "fd00:10::2", "")]);
        let mut itp = service(
            "ns3",
            "itp",
            ServiceType::NodePort,
            &a("172.30.0.43", "fd00:30::43"),
            &refs(&e2),
        );
        itp.internal_traffic_policy = TrafficPolicy::Local;
        itp.ports[0].node_port = Some(30004);

        let mut empty = service(
            "ns4",
            "empty",
            ServiceType::LoadBalancer,
            &a("172.30.0.44", "fd00:30::44"),
            &[],
        );
        empty.ports[0].node_port = Some(30005);
        empty.external_ips = vec![ip(&a("192.168.99.44", "2001:db8:99::44"))];
        empty.load_balancer_ingress = lb_ingress(&[&a("5.6.7.8", "2001:db8:5::8")]);

        let mut etp_remote = service(
            "ns5",
            "remote",
            ServiceType::NodePort,
            &a("172.30.0.45", "fd00:30::45"),
            &refs(&e2),
        );
        etp_remote.external_traffic_policy = TrafficPolicy::Local;
        etp_remote.ports[0].node_port = Some(30006);

        module(vec![affinity, lb, itp, empty, etp_remote])
    }

    /// The documents load with iptables-restore into an empty namespace, and the jumps
    /// end up in kube-proxy's order. Skipped where namespaces cannot be made.
    #[test]
    fn documents_load_into_an_empty_namespace() {
        for (family, tool, save) in [
            (IpFamily::IPv4, "iptables-restore", "iptables-save"),
            (IpFamily::IPv6, "ip6tables-restore", "ip6tables-save"),
        ] {
            let Some(ns) = Netns::new() else {
                eprintln!("skipping: cannot create a network namespace (needs root and iproute2)");
                return;
            };
            let m = rich_module(family == IpFamily::IPv6);
            let doc = compile(&m, family, &Options::default());
            for chain in [
                "KUBE-SVL-",
                "KUBE-FW-",
                "KUBE-EXT-",
                "REJECT",
                "DROP",
                "--rcheck",
            ] {
                assert!(doc.contains(chain), "{family:?} document has no {chain}");
            }
            if let Err(e) = ns.run(tool, &["--noflush"], &doc) {
                panic!("{tool} rejected the {family:?} document: {e}\n{doc}");
            }
            // A later full sync loads the restore data again over it.
            let resync = compile(
                &m,
                family,
                &Options {
                    setup: false,
                    ..Options::default()
                },
            );
            ns.run(tool, &["--noflush"], &resync)
                .unwrap_or_else(|e| panic!("{tool} rejected a resync: {e}"));

            let saved = ns.run(save, &["-t", "filter"], "").unwrap();
            let input: Vec<&str> = saved
                .lines()
                .filter(|l| l.starts_with("-A INPUT "))
                .map(|l| l.rsplit(' ').next().unwrap())
                .collect();
            assert_eq!(
                input,
                [
                    "KUBE-FIREWALL",
                    "KUBE-PROXY-FIREWALL",
                    "KUBE-NODEPORTS",
                    "KUBE-EXTERNAL-SERVICES"
                ]
            );
            let saved = ns.run(save, &["-t", "mangle"], "").unwrap();
            assert!(saved.contains(":KUBE-PROXY-CANARY - [0:0]"));
        }
    }
}
