//! Exact-text tests (insta snapshots in `targets/snapshots/nftables.*`), one behaviour per
//! case, and (in `kernel`) loads into a real kernel.

mod fixtures;
mod kernel;

use super::*;
use crate::testing::snapshot;
use fixtures::*;
use svc_compiler::ir::{
    DetectLocalMode, Module, NodePortAddress, NodeView, Protocol, TrafficPolicy,
};
use svc_compiler::testing::lb_ingress;

/// Named views, one per behaviour; each unit test below checks one of them and the kernel
/// tests load them all.
const CASES: &[&str] = &[
    "clusterip-1-endpoint",
    "clusterip-3-endpoints",
    "nodeport",
    "external-ips",
    "lb-source-ranges-affinity",
    "lb-source-ranges-include-node",
    "etp-local-no-local-endpoints",
    "etp-local-local-endpoints",
    "itp-local-local-endpoints",
    "itp-local-no-local-endpoints",
    "no-endpoints",
    "affinity-local",
    "ipv6",
    "masquerade-all",
    "detector-none",
    "detector-bridge",
    "detector-interface-prefix",
    "nodeport-addresses",
    "no-service-cidrs",
    "unnamed-port-udp-sctp",
    "shared-external-ip",
];

fn case(name: &str) -> NodeView {
    // The cluster's settings, where a case changes them.
    let v4_with = |services, f: &dyn Fn(&mut Module)| {
        let mut m = cluster(services);
        f(&mut m);
        v4(&m)
    };
    match name {
        "clusterip-1-endpoint" => view_v4(vec![svc1()]),
        "clusterip-3-endpoints" => view_v4(vec![service(
            "ns1",
            "svc1",
            "p80",
            "172.30.0.41",
            80,
            vec![
                ep("10.180.0.1", 8080, false),
                ep("10.180.0.10", 8080, true),
                ep("10.180.0.2", 8080, false),
            ],
        )]),
        "nodeport" => view_v4(vec![svc3()]),
        "external-ips" => view_v4(vec![svc4()]),
        "lb-source-ranges-affinity" => view_v4(vec![svc5()]),
        "lb-source-ranges-include-node" => {
            let mut s = svc5();
            s.load_balancer_ingress = lb_ingress(&["5.6.7.8", "1.2.3.4"]);
            s.load_balancer_source_ranges = vec![cidr("192.168.0.0/24"), cidr("203.0.113.0/25")];
            s.session_affinity_timeout = None;
            view_v4(vec![s])
        }
        "etp-local-no-local-endpoints" => view_v4(vec![svc2(false)]),
        "etp-local-local-endpoints" => view_v4(vec![svc2(true)]),
        "itp-local-local-endpoints" | "itp-local-no-local-endpoints" => {
            let local = name == "itp-local-local-endpoints";
            let mut s = service(
                "ns7",
                "svc7",
                "p80",
                "172.30.0.47",
                80,
                vec![ep("10.180.0.7", 80, local), ep("10.180.1.7", 80, false)],
            );
            s.internal_traffic_policy = TrafficPolicy::Local;
            view_v4(vec![s])
        }
        "no-endpoints" => {
            let mut s = load_balancer(
                service("ns1", "svc1", "p80", "172.30.0.41", 80, vec![]),
                3001,
                &["1.2.3.4"],
            );
            s.external_ips = vec![ip("192.168.99.11")];
            s.load_balancer_source_ranges = vec![cidr("203.0.113.0/25")];
            view_v4(vec![s, svc6()])
        }
        "affinity-local" => {
            // ITP=Local + ETP=Local NodePort with affinity: both policy chains, each with
            // its own affinity rules; the local endpoint's set is shared.
            let mut s = node_port(
                service(
                    "ns8",
                    "svc8",
                    "",
                    "172.30.0.48",
                    53,
                    vec![ep("10.180.0.8", 53, true), ep("10.180.1.8", 53, false)],
                ),
                3008,
            );
            s.internal_traffic_policy = TrafficPolicy::Local;
            s.external_traffic_policy = TrafficPolicy::Local;
            s.session_affinity_timeout = Some(300);
            view_v4(vec![s])
        }
        "ipv6" => {
            let mut p = load_balancer(
                service(
                    "ns1",
                    "svc1",
                    "p80",
                    "fd00:172:30::41",
                    80,
                    vec![
                        ep("fd00:10:180::1", 80, false),
                        ep("fd00:10:180::2:1", 80, true),
                    ],
                ),
                3001,
                &["2001:db8:99::1"],
            );
            p.load_balancer_source_ranges = vec![cidr("2001:db8:f00::/48")];
            p.session_affinity_timeout = Some(10800);
            let mut q = service(
                "ns2",
                "svc2",
                "p80",
                "fd00:172:30::42",
                80,
                vec![ep("fd00:10:180::3", 80, false)],
            );
            q.internal_traffic_policy = TrafficPolicy::Local;
            view_v6(vec![p, q])
        }
        "masquerade-all" => v4_with(vec![svc1()], &|m| m.proxy.masquerade_all = true),
        "detector-none" | "detector-bridge" | "detector-interface-prefix" => {
            let detect_local = match name {
                "detector-none" => DetectLocalMode::None,
                "detector-bridge" => DetectLocalMode::BridgeInterface("cbr0".into()),
                _ => DetectLocalMode::InterfaceNamePrefix("veth".into()),
            };
            v4_with(vec![svc1(), svc2(true)], &|m| {
                m.proxy.detect_local = detect_local.clone()
            })
        }
        "nodeport-addresses" => v4_with(vec![svc3()], &|m| {
            // A second node address, and loopback (which nft leaves out of the set).
            m.nodes[0].addresses.push(ip("10.1.0.2"));
            m.proxy.node_port_addresses = ["192.168.0.0/24", "127.0.0.0/8", "10.1.0.0/16"]
                .map(|c| NodePortAddress::Cidr(cidr(c)))
                .to_vec();
        }),
        "no-service-cidrs" => v4_with(vec![svc6()], &|m| m.cluster.service_cidrs.clear()),
        "unnamed-port-udp-sctp" => {
            let mut dns = service(
                "kube-system",
                "kube-dns",
                "",
                "172.30.0.10",
                53,
                vec![ep("10.180.0.53", 53, false)],
            );
            dns.ports[0].protocol = Protocol::UDP;
            let mut sctp = service(
                "ns9",
                "svc9",
                "p99",
                "172.30.0.49",
                99,
                vec![ep("10.180.0.99", 9999, false)],
            );
            sctp.ports[0].protocol = Protocol::SCTP;
            view_v4(vec![dns, sctp])
        }
        "shared-external-ip" => {
            // Two services claim 192.168.99.33:80/TCP; the first in NodeView order keeps
            // it. The view is turned around so that the owner is not simply the port the
            // node pass sorts first.
            let mut a = svc4();
            a.name = "svc4a".into();
            a.cluster_ips = vec![ip("172.30.0.144")];
            let mut v = view_v4(vec![a, svc4()]);
            v.ports.reverse();
            v
        }
        _ => panic!("unknown case {name}"),
    }
}

pub(super) fn case_views() -> Vec<(&'static str, NodeView)> {
    CASES.iter().map(|&n| (n, case(n))).collect()
}

/// The output after the service-independent part (which `full_file` checks once).
fn body(view: &NodeView) -> String {
    let out = write_string(view, &Options::default());
    let mut empty = view.clone();
    empty.ports.clear();
    let fixed = write_string(&empty, &Options::default());
    // nodeport-ips elements come last, with the services' elements: keep them in the body.
    let fixed = fixed.split("\nadd element").next().unwrap().trim_end();
    out.strip_prefix(fixed)
        .unwrap_or_else(|| panic!("fixed part differs:\n{out}"))
        .trim_start_matches('\n')
        .to_string()
}

/// The case's service part against its snapshot `nftables.case.<name>`.
fn check(name: &str) {
    snapshot(&format!("nftables.case.{name}"), &body(&case(name)));
}

/// One remote endpoint: masquerade off-pod-network traffic to the ClusterIP, dispatch with `numgen … mod 1`, hairpin + DNAT in the endpoint chain.
#[test]
fn clusterip_1_endpoint() {
    check("clusterip-1-endpoint");
}

/// Endpoints keep the IR's order in the vmap: the string `ip:port`, so `10.180.0.10:8080`
/// comes before `10.180.0.1:8080` (`0` < `:`), and both before `10.180.0.2:8080`.
#[test]
fn clusterip_3_endpoints() {
    check("clusterip-3-endpoints");
}

/// NodePort with ETP=Cluster: the external chain masquerades, then goes to the service chain.
#[test]
fn nodeport() {
    check("nodeport");
}

/// externalIPs go to the external chain through service-ips.
#[test]
fn external_ips() {
    check("external-ips");
}

/// LoadBalancer with loadBalancerSourceRanges and ClientIP affinity.
#[test]
fn lb_source_ranges_affinity() {
    check("lb-source-ranges-affinity");
}

/// A source range holds the node IP: the LB IPs are accepted as sources too.
#[test]
fn lb_source_ranges_include_node() {
    check("lb-source-ranges-include-node");
}

/// ETP=Local without a local endpoint: short-circuit rules but no final jump, DROP for external destinations.
#[test]
fn etp_local_no_local_endpoints() {
    check("etp-local-no-local-endpoints");
}

/// ETP=Local with a local endpoint: the external chain ends in the local chain.
#[test]
fn etp_local_local_endpoints() {
    check("etp-local-local-endpoints");
}

/// ITP=Local: ClusterIP traffic goes to the local chain, which holds the masquerade rule.
#[test]
fn itp_local_local_endpoints() {
    check("itp-local-local-endpoints");
}

/// ITP=Local without a local endpoint: the ClusterIP is dropped (not rejected).
#[test]
fn itp_local_no_local_endpoints() {
    check("itp-local-no-local-endpoints");
}

/// No endpoints at all: REJECT for every destination, no nat chains; the firewall still applies.
#[test]
fn no_endpoints() {
    check("no-endpoints");
}

/// Affinity with both policy chains; unnamed port (trailing `/` in chain names).
#[test]
fn affinity_local() {
    check("affinity-local");
}

/// IPv6: ip6 matches, ipv6_addr sets, `.` for `:` in endpoint chain names, bracketed DNAT.
#[test]
fn ipv6() {
    check("ipv6");
}

/// masqueradeAll: the ClusterIP masquerade rule has no detector condition.
#[test]
fn masquerade_all() {
    check("masquerade-all");
}

/// No local detector: no ClusterIP masquerade rule and no pod short-circuit.
#[test]
fn detector_none() {
    check("detector-none");
}

/// Bridge-interface detector.
#[test]
fn detector_bridge() {
    check("detector-bridge");
}

/// Interface-name-prefix detector (`veth*`).
#[test]
fn detector_interface_prefix() {
    check("detector-interface-prefix");
}

/// Restricted nodeport-addresses: nodeport-ips elements, loopback skipped.
#[test]
fn nodeport_addresses() {
    check("nodeport-addresses");
}

/// Unknown service CIDRs: only the reject rule in cluster-ips-check (checked in `full_file`).
#[test]
fn no_service_cidrs() {
    check("no-service-cidrs");
}

/// UDP and SCTP protocols; an unnamed port.
#[test]
fn unnamed_port_udp_sctp() {
    check("unnamed-port-udp-sctp");
}

/// Two services claim 192.168.99.33:80/TCP: the first in NodeView order keeps the element.
#[test]
fn shared_external_ip() {
    check("shared-external-ip");
}

/// A whole file against its snapshot `nftables.<name>`.
fn check_full(name: &str, got: String) {
    snapshot(&format!("nftables.{name}"), &got);
}

/// The whole file once: header, table replacement, the fixed chains, maps and rules.
#[test]
fn full_file() {
    check_full(
        "full-file",
        write_string(&case("clusterip-1-endpoint"), &Options::default()),
    );
}

/// IPv6 fixed part: `ip6`, `ipv6_addr`, and `::1` as the no-localhost guard.
#[test]
fn full_file_ipv6_empty() {
    check_full(
        "full-file-ipv6-empty",
        write_string(&view_v6(vec![]), &Options::default()),
    );
}

/// Restricted nodeport-addresses change the fixed part (nodeport-ips set, no fib check);
/// `replace_table: false` leaves out the add+delete lines.
#[test]
fn full_file_nodeport_addresses_no_replace() {
    check_full(
        "full-file-nodeport-addresses-no-replace",
        write_string(
            &case("nodeport-addresses"),
            &Options {
                replace_table: false,
            },
        ),
    );
}

#[test]
fn cluster_ips_check_without_service_cidrs() {
    let out = write_string(&case("no-service-cidrs"), &Options::default());
    assert!(out.contains("add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject"));
    assert!(!out.contains("Drop traffic to unallocated ClusterIPs"));
    let mut m = cluster(vec![svc6()]);
    m.cluster.service_cidrs = vec![cidr("172.30.0.0/16"), cidr("10.96.0.1/12")];
    let two = v4(&m);
    let out = write_string(&two, &Options::default());
    assert!(out.contains(
        "cluster-ips-check ip daddr { 172.30.0.0/16,10.96.0.0/12 } drop comment \"Drop traffic to unallocated ClusterIPs\""
    ));
}

/// Same input, same bytes; the service order is the NodeView's, elements are sorted.
#[test]
fn deterministic() {
    for (name, v) in fixtures::all_cases() {
        let o = Options::default();
        assert_eq!(write_string(&v, &o), write_string(&v.clone(), &o), "{name}");
        assert_eq!(write_json(&v, &o), write_json(&v.clone(), &o), "{name}");
    }
}

/// The JSON form has one command per text statement, in the same order, naming the same
/// objects.
#[test]
fn json_matches_text() {
    for (name, v) in fixtures::all_cases() {
        let o = Options::default();
        let text = write_string(&v, &o);
        let json: serde_json::Value = serde_json::from_str(&write_json(&v, &o)).unwrap();
        let cmds = json["nftables"].as_array().unwrap();
        assert_eq!(
            cmds[0],
            serde_json::json!({"metainfo": {"json_schema_version": 1}})
        );
        let stmts: Vec<&str> = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert_eq!(stmts.len(), cmds.len() - 1, "{name}");
        for (line, cmd) in stmts.iter().zip(&cmds[1..]) {
            let words: Vec<&str> = line.split(' ').collect();
            let (verb, kind, family, table) = (words[0], words[1], words[2], words[3]);
            let obj = &cmd[verb][kind];
            assert_eq!(obj["family"], family, "{name}: {line}");
            assert_eq!(
                obj.get("table").unwrap_or(&obj["name"]),
                table,
                "{name}: {line}"
            );
            let name_key = match kind {
                "rule" => "chain",
                _ => "name",
            };
            if kind != "table" {
                assert_eq!(obj[name_key], words[4], "{name}: {line}");
            }
        }
    }
}

/// The places where the JSON is patched beyond the crate's types.
#[test]
fn json_patched_objects() {
    let v = view_v4(vec![svc2(false), svc5()]);
    let json = write_json(&v, &Options::default());
    for want in [
        r#"{"add":{"table":{"family":"ip","name":"kube-proxy","comment":"rules for kube-proxy"}}}"#,
        r#"{"add":{"chain":{"family":"ip","table":"kube-proxy","name":"reject-chain","comment":"helper for @no-endpoint-services / @no-endpoint-nodeports"}}}"#,
        r#"{"add":{"map":{"family":"ip","table":"kube-proxy","name":"service-nodeports","type":["inet_proto","inet_service"],"map":"verdict","comment":"NodePort traffic"}}}"#,
        r#"{"add":{"set":{"family":"ip","table":"kube-proxy","name":"affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80","type":"ipv4_addr","flags":["timeout"],"timeout":10800}}}"#,
        r#"{"add":{"element":{"family":"ip","table":"kube-proxy","name":"no-endpoint-nodeports","elem":[[{"elem":{"val":{"concat":["tcp",3001]},"comment":"ns2/svc2:p80"}},{"drop":null}]]}}}"#,
        r#"{"add":{"element":{"family":"ip","table":"kube-proxy","name":"firewall-ips","elem":[[{"concat":["5.6.7.8","tcp",80]},{"goto":{"target":"firewall-HVFWP5L3-ns5/svc5/tcp/p80"}}]]}}}"#,
    ] {
        assert!(
            json.lines().any(|l| l.trim_end_matches(',') == want),
            "missing {want}\n{json}"
        );
    }
}

/// `Element::place` orders as (set in ELEMENT_SETS order, key as Vec<Value>) does.
#[test]
fn element_places_sort_like_keys() {
    use model::{Element, Value, ELEMENT_SETS};
    let ips = [
        "10.0.0.1",
        "10.0.0.2",
        "9.255.255.255",
        "255.0.0.0",
        "::1",
        "fd00::1",
    ];
    let mut elements = Vec::new();
    for set in ELEMENT_SETS {
        for ip in ips {
            for proto in [Protocol::UDP, Protocol::TCP, Protocol::SCTP] {
                for port in [80, 8080, 7, 65535] {
                    let ip = Value::Ip(ip.parse().unwrap());
                    for key in [
                        vec![ip],
                        vec![ip, Value::Proto(proto), Value::Port(port)],
                        vec![Value::Proto(proto), Value::Port(port)],
                    ] {
                        elements.push(Element {
                            set,
                            key,
                            comment: None,
                            verdict: None,
                        });
                    }
                }
            }
        }
    }
    let set_index = |s: &str| ELEMENT_SETS.iter().position(|x| *x == s).unwrap();
    let mut by_key = elements.clone();
    by_key.sort_by(|a, b| (set_index(a.set), &a.key).cmp(&(set_index(b.set), &b.key)));
    let mut by_place = elements;
    by_place.sort_by_key(|e| e.place());
    assert_eq!(by_key, by_place);
}

/// The planner tells the layouts apart by what each renders, in both families and with no
/// endpoint at all (drift refuses to compare two layouts).
#[test]
fn the_planner_names_each_documents_layout() {
    use crate::plan::Planner;
    use svc_compiler::ir::NftLayout;
    let empty = service("ns1", "none", "p", "172.30.0.42", 80, vec![]);
    for mut view in [view_v4(vec![svc1()]), view_v6(vec![]), view_v4(vec![empty])] {
        for (layout, name) in [
            (NftLayout::KubeProxy, "kube-proxy"),
            (NftLayout::Fast, "fast"),
        ] {
            view.nft_layout = layout;
            let doc = write_string(&view, &Options::default());
            assert_eq!(
                crate::nftables::plan::Nftables.layout_of(&doc),
                Some(("--nft-layout", name))
            );
        }
    }
    assert_eq!(crate::iptables::plan::Iptables.layout_of(""), None);
}
