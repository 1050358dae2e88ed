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
//!
//! `document` writes everything but the service ports (header, setup, tables, static
//! chains) and is meant to be shared with kube-proxy's IPVS mode; `ports` writes one
//! service port's rules. Ports are rendered through [`common::render_ports`].

pub(crate) mod document;
pub(crate) mod names;
pub mod plan;
mod ports;
mod trace;

use crate::common::{self, render_ports, PortCache, PortRendering};
use crate::{Render, Target};
use document::{write_document, Sections, StaticRules};
use ports::PortSettings;
use svc_compiler::ir::NodeView;

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
    Iptables::render(view, opts, None, &mut text);
    text
}

/// `--target iptables`.
pub const TARGET: Target = Target {
    name: "iptables",
    about: "iptables-restore input, as kube-proxy's iptables mode loads it",
    ext: "rules",
    render: Render::Node(|_, sharing| Renderer::boxed(sharing)),
    flags: &[],
    planner: Some(&plan::Iptables),
    trace: Some(&trace::Iptables),
    deprecated: None,
};

/// Writes the documents of many nodes (see [`common::Renderer`]).
pub type Renderer = common::Renderer<Iptables>;

/// The iptables back end, for [`common::Renderer`].
pub struct Iptables;

impl PortRendering for Iptables {
    type Options = Options;
    type Settings = PortSettings;
    type Part = Sections;

    fn render(
        view: &NodeView,
        opts: &Options,
        cache: Option<&PortCache<PortSettings, Sections>>,
        text: &mut String,
    ) {
        // Node capabilities the module sets (`--random-fully`, `--nfacct`, ClusterConfig)
        // win over the renderer's defaults.
        let own;
        let opts = match (view.random_fully, view.nfacct) {
            (None, None) => opts,
            (r, n) => {
                own = Options {
                    random_fully: r.unwrap_or(opts.random_fully),
                    nfacct: n.unwrap_or(opts.nfacct),
                    ..opts.clone()
                };
                &own
            }
        };
        let fixed = StaticRules::new(view, opts);
        let (mut head, mut tail) = (Sections::default(), Sections::default());
        fixed.head(&mut head);
        fixed.tail(&mut tail);
        let settings = PortSettings::of(view);
        let pieces = render_ports(&view.ports, &settings, cache, |out, ports| {
            ports::write(out, &settings, opts, ports)
        });
        // Each section: the fixed head, every port's part, the fixed tail.
        write_document(text, view, "iptables", opts.setup, || {
            std::iter::once(&head)
                .chain(pieces.iter().map(|p| &**p))
                .chain([&tail])
        });
    }
}

#[cfg(test)]
mod tests {
    use super::ports::Probabilities;
    use super::*;
    use crate::common::{endpoint_hash, port_proto_hash};
    use crate::testing::snapshot;
    use std::collections::BTreeMap;
    use svc_compiler::ir::{
        DetectLocalMode, Module, NodePortAddress, Protocol, ProxyConfig, Service, ServiceType,
        TrafficPolicy,
    };
    use svc_compiler::net::IpFamily;
    use svc_compiler::testing::{self, cidr, ip, lb_ingress, NODE_IPS};

    // Conventions of kube-proxy's proxier_test.go (the shared fixtures' defaults): pod IPs
    // 10.0.0.0/8, service IPs 172.30.0.0/16, this node `test-node` at 192.168.0.2.
    const TEST_NODE: &str = "test-node";

    fn module(services: Vec<Service>) -> Module {
        testing::module(services, vec![testing::node(TEST_NODE, &NODE_IPS, None)])
    }

    /// A service with one TCP port `p80` (port 80) and these endpoints (`ip`, `ip@node`,
    /// with `#serving-terminating`, `#terminating` or `#not-ready` for a non-ready one;
    /// port 80).
    fn service(ns: &str, name: &str, kind: ServiceType, cip: &str, eps: &[&str]) -> Service {
        let port = testing::port("p80", 80, 80, testing::endpoints(eps, 80));
        testing::service(ns, name, kind, cip, vec![port])
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
        write_string(&testing::view(m, TEST_NODE, family), opts)
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
        // Upstream's expected text, in its test's order.
        snapshot("iptables.upstream-overall", &sort_like_upstream(&got));
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
        let ready = lb(&[
            "10.0.1.1@test-node",
            "10.0.1.2@test-node",
            "10.0.1.3@test-node#serving-terminating",
            "10.0.1.4@test-node#terminating",
            "10.0.1.5@host-1",
        ]);
        snapshot(
            "iptables.upstream-terminating-local-ready",
            &sort_like_upstream(&compile(&ready, IpFamily::IPv4, &opts)),
        );

        let terminating = lb(&[
            "10.0.1.2@test-node#serving-terminating",
            "10.0.1.3@test-node#serving-terminating",
            "10.0.1.4@test-node#terminating",
            "10.0.1.5@host-1",
        ]);
        snapshot(
            "iptables.upstream-terminating-local-terminating",
            &sort_like_upstream(&compile(&terminating, IpFamily::IPv4, &opts)),
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
        snapshot("iptables.default-document", &got);

        // Without the setup, the document is exactly kube-proxy's restore data.
        let bare = compile(
            &module(vec![node_port_service()]),
            IpFamily::IPv4,
            &Options {
                setup: false,
                ..Options::default()
            },
        );
        let data = &got[got.find("*filter\n:KUBE-SERVICES").unwrap()..];
        assert_eq!(bare, format!("{}\n{data}", got.lines().next().unwrap()));
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
                let why = "cannot create a network namespace (needs root and iproute2)";
                crate::testing::skip("documents_load_into_an_empty_namespace", why);
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
