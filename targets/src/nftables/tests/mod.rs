//! Exact-text tests on hand-built NodeViews, and (in `kernel`) loads into a real kernel.

mod fixtures;
mod kernel;

use super::*;
use fixtures::*;
use svc_compiler::ir::{LocalDetector, NodePortAddresses, NodeView};

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
    let v4 = |ports| with_view(view_v4(), ports);
    match name {
        "clusterip-1-endpoint" => v4(vec![svc1()]),
        "clusterip-3-endpoints" => v4(vec![with_endpoints(
            port("ns1", "svc1", "p80", "172.30.0.41", 80),
            vec![
                ep("10.180.0.1", 8080, false),
                ep("10.180.0.10", 8080, true),
                ep("10.180.0.2", 8080, false),
            ],
        )]),
        "nodeport" => v4(vec![svc3()]),
        "external-ips" => v4(vec![svc4()]),
        "lb-source-ranges-affinity" => v4(vec![svc5()]),
        "lb-source-ranges-include-node" => {
            let mut p = svc5();
            p.load_balancer_ips = vec![ip("5.6.7.8"), ip("1.2.3.4")];
            p.source_ranges = vec![cidr("192.168.0.0/24"), cidr("203.0.113.0/25")];
            p.source_ranges_include_node = true;
            p.affinity_timeout = None;
            v4(vec![p])
        }
        "etp-local-no-local-endpoints" => v4(vec![svc2(false)]),
        "etp-local-local-endpoints" => v4(vec![svc2(true)]),
        "itp-local-local-endpoints" | "itp-local-no-local-endpoints" => {
            let mut p = port("ns7", "svc7", "p80", "172.30.0.47", 80);
            p.internal_local = true;
            let local = name == "itp-local-local-endpoints";
            v4(vec![with_endpoints(
                p,
                vec![ep("10.180.0.7", 80, local), ep("10.180.1.7", 80, false)],
            )])
        }
        "no-endpoints" => {
            let mut p = load_balancer(
                port("ns1", "svc1", "p80", "172.30.0.41", 80),
                3001,
                &["1.2.3.4"],
            );
            p.external_ips = vec![ip("192.168.99.11")];
            p.source_ranges = vec![cidr("203.0.113.0/25")];
            v4(vec![p, svc6()])
        }
        "affinity-local" => {
            // ITP=Local + ETP=Local NodePort with affinity: both policy chains, each with
            // its own affinity rules; the local endpoint's set is shared.
            let mut p = node_port(port("ns8", "svc8", "", "172.30.0.48", 53), 3008);
            p.internal_local = true;
            p.external_local = true;
            p.affinity_timeout = Some(300);
            v4(vec![with_endpoints(
                p,
                vec![ep("10.180.0.8", 53, true), ep("10.180.1.8", 53, false)],
            )])
        }
        "ipv6" => {
            let mut p = load_balancer(
                port("ns1", "svc1", "p80", "fd00:172:30::41", 80),
                3001,
                &["2001:db8:99::1"],
            );
            p.source_ranges = vec![cidr("2001:db8:f00::/48")];
            p.affinity_timeout = Some(10800);
            p = with_endpoints(
                p,
                vec![
                    ep("fd00:10:180::1", 80, false),
                    ep("fd00:10:180::2:1", 80, true),
                ],
            );
            let mut q = port("ns2", "svc2", "p80", "fd00:172:30::42", 80);
            q.internal_local = true;
            q = with_endpoints(q, vec![ep("fd00:10:180::3", 80, false)]);
            with_view(view_v6(), vec![p, q])
        }
        "masquerade-all" => {
            let mut v = v4(vec![svc1()]);
            v.masquerade_all = true;
            v
        }
        "detector-none" | "detector-bridge" | "detector-interface-prefix" => {
            let mut v = v4(vec![svc1(), svc2(true)]);
            v.local_detector = match name {
                "detector-none" => None,
                "detector-bridge" => Some(LocalDetector::BridgeInterface("cbr0".into())),
                _ => Some(LocalDetector::InterfaceNamePrefix("veth".into())),
            };
            v
        }
        "nodeport-addresses" => {
            let mut v = v4(vec![svc3()]);
            v.node_port_addresses =
                NodePortAddresses::Ips(vec![ip("192.168.0.2"), ip("127.0.0.1"), ip("10.1.0.2")]);
            v
        }
        "no-service-cidrs" => {
            let mut v = v4(vec![svc6()]);
            v.service_cidrs.clear();
            v
        }
        "unnamed-port-udp-sctp" => {
            let mut dns = port("kube-system", "kube-dns", "", "172.30.0.10", 53);
            dns.protocol = svc_compiler::ir::Protocol::UDP;
            let mut sctp = port("ns9", "svc9", "p99", "172.30.0.49", 99);
            sctp.protocol = svc_compiler::ir::Protocol::SCTP;
            v4(vec![
                with_endpoints(dns, vec![ep("10.180.0.53", 53, false)]),
                with_endpoints(sctp, vec![ep("10.180.0.99", 9999, false)]),
            ])
        }
        "shared-external-ip" => {
            // Two services claim 192.168.99.33:80/TCP; the first in NodeView order keeps it.
            let mut a = svc4();
            a.name = "svc4a".into();
            a.spn = "ns4/svc4a:p80".into();
            a.cluster_ip = Some(ip("172.30.0.144"));
            v4(vec![a, svc4()])
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

#[track_caller]
fn check(name: &str, expected: &str) {
    let got = body(&case(name));
    let expected = expected.trim_start_matches('\n');
    if got != expected {
        panic!("case {name}: output differs\n--- got ---\n{got}--- expected ---\n{expected}");
    }
}

/// One remote endpoint: masquerade off-pod-network traffic to the ClusterIP, dispatch with `numgen … mod 1`, hairpin + DNAT in the endpoint chain.
#[test]
fn clusterip_1_endpoint() {
    check(
        "clusterip-1-endpoint",
        r#"
# ns1/svc1:p80
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80

add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80

add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
"#,
    );
}

/// Endpoints keep the IR's order (string-sorted `ip:port`, so .10 before .2) in the vmap.
#[test]
fn clusterip_3_endpoints() {
    check(
        "clusterip-3-endpoints",
        r#"
# ns1/svc1:p80
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy endpoint-LIVTTPDC-ns1/svc1/tcp/p80__10.180.0.1/8080
add chain ip kube-proxy endpoint-MCE2A2FT-ns1/svc1/tcp/p80__10.180.0.10/8080
add chain ip kube-proxy endpoint-COL4JORS-ns1/svc1/tcp/p80__10.180.0.2/8080

add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 3 vmap { 0 : goto endpoint-LIVTTPDC-ns1/svc1/tcp/p80__10.180.0.1/8080 , 1 : goto endpoint-MCE2A2FT-ns1/svc1/tcp/p80__10.180.0.10/8080 , 2 : goto endpoint-COL4JORS-ns1/svc1/tcp/p80__10.180.0.2/8080 }
add rule ip kube-proxy endpoint-LIVTTPDC-ns1/svc1/tcp/p80__10.180.0.1/8080 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-LIVTTPDC-ns1/svc1/tcp/p80__10.180.0.1/8080 meta l4proto tcp dnat to 10.180.0.1:8080
add rule ip kube-proxy endpoint-MCE2A2FT-ns1/svc1/tcp/p80__10.180.0.10/8080 ip saddr 10.180.0.10 jump mark-for-masquerade
add rule ip kube-proxy endpoint-MCE2A2FT-ns1/svc1/tcp/p80__10.180.0.10/8080 meta l4proto tcp dnat to 10.180.0.10:8080
add rule ip kube-proxy endpoint-COL4JORS-ns1/svc1/tcp/p80__10.180.0.2/8080 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-COL4JORS-ns1/svc1/tcp/p80__10.180.0.2/8080 meta l4proto tcp dnat to 10.180.0.2:8080

add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
"#,
    );
}

/// NodePort with ETP=Cluster: the external chain masquerades, then goes to the service chain.
#[test]
fn nodeport() {
    check(
        "nodeport",
        r#"
# ns3/svc3:p80
add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80

add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 ip daddr 172.30.0.43 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 }
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80

add element ip kube-proxy cluster-ips { 172.30.0.43 }
add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 }
"#,
    );
}

/// externalIPs go to the external chain through service-ips.
#[test]
fn external_ips() {
    check(
        "external-ips",
        r#"
# ns4/svc4:p80
add chain ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80
add chain ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80
add chain ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80
add chain ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80

add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 ip daddr 172.30.0.44 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 , 1 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 }
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 goto service-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 ip saddr 10.180.0.4 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 meta l4proto tcp dnat to 10.180.0.4:80
add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 ip saddr 10.180.0.5 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 meta l4proto tcp dnat to 10.180.0.5:80

add element ip kube-proxy cluster-ips { 172.30.0.44 }
add element ip kube-proxy service-ips { 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.33 . tcp . 80 : goto external-LAUZTJTB-ns4/svc4/tcp/p80 }
"#,
    );
}

/// LoadBalancer with loadBalancerSourceRanges and ClientIP affinity.
#[test]
fn lb_source_ranges_affinity() {
    check(
        "lb-source-ranges-affinity",
        r#"
# ns5/svc5:p80
add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }

add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80

add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip daddr 172.30.0.45 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80

add element ip kube-proxy cluster-ips { 172.30.0.45 }
add element ip kube-proxy service-ips { 5.6.7.8 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3002 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }
"#,
    );
}

/// A source range holds the node IP: the LB IPs are accepted as sources too.
#[test]
fn lb_source_ranges_include_node() {
    check(
        "lb-source-ranges-include-node",
        r#"
# ns5/svc5:p80
add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80

add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip daddr 172.30.0.45 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 192.168.0.0/24 , 203.0.113.0/25 , 5.6.7.8 , 1.2.3.4 } drop
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80

add element ip kube-proxy cluster-ips { 172.30.0.45 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-ips { 5.6.7.8 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3002 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy firewall-ips { 1.2.3.4 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }
"#,
    );
}

/// ETP=Local without a local endpoint: short-circuit rules but no final jump, DROP for external destinations.
#[test]
fn etp_local_no_local_endpoints() {
    check(
        "etp-local-no-local-endpoints",
        r#"
# ns2/svc2:p80
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80

add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80

add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy no-endpoint-services { 1.2.3.4 . tcp . 80 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy no-endpoint-services { 192.168.99.22 . tcp . 80 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns2/svc2:p80" : drop }
"#,
    );
}

/// ETP=Local with a local endpoint: the external chain ends in the local chain.
#[test]
fn etp_local_local_endpoints() {
    check(
        "etp-local-local-endpoints",
        r#"
# ns2/svc2:p80
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80

add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add rule ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 goto local-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80

add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
"#,
    );
}

/// ITP=Local: ClusterIP traffic goes to the local chain, which holds the masquerade rule.
#[test]
fn itp_local_local_endpoints() {
    check(
        "itp-local-local-endpoints",
        r#"
# ns7/svc7:p80
add chain ip kube-proxy local-H5D5N55F-ns7/svc7/tcp/p80
add chain ip kube-proxy endpoint-UPOKE2ZN-ns7/svc7/tcp/p80__10.180.0.7/80

add rule ip kube-proxy local-H5D5N55F-ns7/svc7/tcp/p80 ip daddr 172.30.0.47 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy local-H5D5N55F-ns7/svc7/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-UPOKE2ZN-ns7/svc7/tcp/p80__10.180.0.7/80 }
add rule ip kube-proxy endpoint-UPOKE2ZN-ns7/svc7/tcp/p80__10.180.0.7/80 ip saddr 10.180.0.7 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UPOKE2ZN-ns7/svc7/tcp/p80__10.180.0.7/80 meta l4proto tcp dnat to 10.180.0.7:80

add element ip kube-proxy cluster-ips { 172.30.0.47 }
add element ip kube-proxy service-ips { 172.30.0.47 . tcp . 80 : goto local-H5D5N55F-ns7/svc7/tcp/p80 }
"#,
    );
}

/// ITP=Local without a local endpoint: the ClusterIP is dropped (not rejected).
#[test]
fn itp_local_no_local_endpoints() {
    check(
        "itp-local-no-local-endpoints",
        r#"
add element ip kube-proxy cluster-ips { 172.30.0.47 }
add element ip kube-proxy no-endpoint-services { 172.30.0.47 . tcp . 80 comment "ns7/svc7:p80" : drop }
"#,
    );
}

/// No endpoints at all: REJECT for every destination, no nat chains; the firewall still applies.
#[test]
fn no_endpoints() {
    check(
        "no-endpoints",
        r#"
# ns1/svc1:p80
add chain ip kube-proxy firewall-ULMVA6XW-ns1/svc1/tcp/p80

add rule ip kube-proxy firewall-ULMVA6XW-ns1/svc1/tcp/p80 ip saddr != { 203.0.113.0/25 } drop

add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy cluster-ips { 172.30.0.46 }
add element ip kube-proxy firewall-ips { 1.2.3.4 . tcp . 80 : goto firewall-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip kube-proxy no-endpoint-services { 1.2.3.4 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }
add element ip kube-proxy no-endpoint-services { 172.30.0.41 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }
add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }
add element ip kube-proxy no-endpoint-services { 192.168.99.11 . tcp . 80 comment "ns1/svc1:p80" : goto reject-chain }
add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns1/svc1:p80" : goto reject-chain }
"#,
    );
}

/// Affinity with both policy chains; unnamed port (trailing `/` in chain names).
#[test]
fn affinity_local() {
    check(
        "affinity-local",
        r#"
# ns8/svc8
add set ip kube-proxy affinity-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53 { type ipv4_addr ; flags dynamic,timeout ; timeout 300s ; }
add set ip kube-proxy affinity-ORKV27X3-ns8/svc8/tcp/__10.180.1.8/53 { type ipv4_addr ; flags dynamic,timeout ; timeout 300s ; }

add chain ip kube-proxy service-KVW6RF4O-ns8/svc8/tcp/
add chain ip kube-proxy local-KVW6RF4O-ns8/svc8/tcp/
add chain ip kube-proxy external-KVW6RF4O-ns8/svc8/tcp/
add chain ip kube-proxy endpoint-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53
add chain ip kube-proxy endpoint-ORKV27X3-ns8/svc8/tcp/__10.180.1.8/53

add rule ip kube-proxy service-KVW6RF4O-ns8/svc8/tcp/ ip saddr @affinity-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53 goto endpoint-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53
add rule ip kube-proxy service-KVW6RF4O-ns8/svc8/tcp/ ip saddr @affinity-ORKV27X3-ns8/svc8/tcp/__10.180.1.8/53 goto endpoint-ORKV27X3-ns8/svc8/tcp/__10.180.1.8/53
add rule ip kube-proxy service-KVW6RF4O-ns8/svc8/tcp/ numgen random mod 2 vmap { 0 : goto endpoint-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53 , 1 : goto endpoint-ORKV27X3-ns8/svc8/tcp/__10.180.1.8/53 }
add rule ip kube-proxy local-KVW6RF4O-ns8/svc8/tcp/ ip daddr 172.30.0.48 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy local-KVW6RF4O-ns8/svc8/tcp/ ip saddr @affinity-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53 goto endpoint-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53
add rule ip kube-proxy local-KVW6RF4O-ns8/svc8/tcp/ numgen random mod 1 vmap { 0 : goto endpoint-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53 }
add rule ip kube-proxy external-KVW6RF4O-ns8/svc8/tcp/ ip saddr 10.0.0.0/8 goto service-KVW6RF4O-ns8/svc8/tcp/ comment "short-circuit pod traffic"
add rule ip kube-proxy external-KVW6RF4O-ns8/svc8/tcp/ fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-KVW6RF4O-ns8/svc8/tcp/ fib saddr type local goto service-KVW6RF4O-ns8/svc8/tcp/ comment "short-circuit local traffic"
add rule ip kube-proxy external-KVW6RF4O-ns8/svc8/tcp/ goto local-KVW6RF4O-ns8/svc8/tcp/
add rule ip kube-proxy endpoint-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53 ip saddr 10.180.0.8 jump mark-for-masquerade
add rule ip kube-proxy endpoint-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53 update @affinity-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53 { ip saddr }
add rule ip kube-proxy endpoint-QD43N5V6-ns8/svc8/tcp/__10.180.0.8/53 meta l4proto tcp dnat to 10.180.0.8:53
add rule ip kube-proxy endpoint-ORKV27X3-ns8/svc8/tcp/__10.180.1.8/53 ip saddr 10.180.1.8 jump mark-for-masquerade
add rule ip kube-proxy endpoint-ORKV27X3-ns8/svc8/tcp/__10.180.1.8/53 update @affinity-ORKV27X3-ns8/svc8/tcp/__10.180.1.8/53 { ip saddr }
add rule ip kube-proxy endpoint-ORKV27X3-ns8/svc8/tcp/__10.180.1.8/53 meta l4proto tcp dnat to 10.180.1.8:53

add element ip kube-proxy cluster-ips { 172.30.0.48 }
add element ip kube-proxy service-ips { 172.30.0.48 . tcp . 53 : goto local-KVW6RF4O-ns8/svc8/tcp/ }
add element ip kube-proxy service-nodeports { tcp . 3008 : goto external-KVW6RF4O-ns8/svc8/tcp/ }
"#,
    );
}

/// IPv6: ip6 matches, ipv6_addr sets, `.` for `:` in endpoint chain names, bracketed DNAT.
#[test]
fn ipv6() {
    check(
        "ipv6",
        r#"
# ns1/svc1:p80
add set ip6 kube-proxy affinity-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 { type ipv6_addr ; flags dynamic,timeout ; timeout 10800s ; }
add set ip6 kube-proxy affinity-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 { type ipv6_addr ; flags dynamic,timeout ; timeout 10800s ; }

add chain ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip6 kube-proxy external-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip6 kube-proxy firewall-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80
add chain ip6 kube-proxy endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80

add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip6 daddr fd00:172:30::41 ip6 saddr != fd00:10::/64 jump mark-for-masquerade
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip6 saddr @affinity-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 goto endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip6 saddr @affinity-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 goto endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 , 1 : goto endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 }
add rule ip6 kube-proxy external-ULMVA6XW-ns1/svc1/tcp/p80 jump mark-for-masquerade
add rule ip6 kube-proxy external-ULMVA6XW-ns1/svc1/tcp/p80 goto service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip6 kube-proxy firewall-ULMVA6XW-ns1/svc1/tcp/p80 ip6 saddr != { 2001:db8:f00::/48 } drop
add rule ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 ip6 saddr fd00:10:180::1 jump mark-for-masquerade
add rule ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 update @affinity-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 { ip6 saddr }
add rule ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 meta l4proto tcp dnat to [fd00:10:180::1]:80
add rule ip6 kube-proxy endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 ip6 saddr fd00:10:180::2:1 jump mark-for-masquerade
add rule ip6 kube-proxy endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 update @affinity-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 { ip6 saddr }
add rule ip6 kube-proxy endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 meta l4proto tcp dnat to [fd00:10:180::2:1]:80

add element ip6 kube-proxy cluster-ips { fd00:172:30::41 }
add element ip6 kube-proxy cluster-ips { fd00:172:30::42 }
add element ip6 kube-proxy service-ips { 2001:db8:99::1 . tcp . 80 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 kube-proxy service-ips { fd00:172:30::41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 kube-proxy service-nodeports { tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 kube-proxy firewall-ips { 2001:db8:99::1 . tcp . 80 : goto firewall-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip6 kube-proxy no-endpoint-services { fd00:172:30::42 . tcp . 80 comment "ns2/svc2:p80" : drop }
"#,
    );
}

/// masqueradeAll: the ClusterIP masquerade rule has no detector condition.
#[test]
fn masquerade_all() {
    check(
        "masquerade-all",
        r#"
# ns1/svc1:p80
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80

add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80

add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
"#,
    );
}

/// No local detector: no ClusterIP masquerade rule and no pod short-circuit.
#[test]
fn detector_none() {
    check(
        "detector-none",
        r#"
# ns1/svc1:p80
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80

add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80

# ns2/svc2:p80
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80

add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add rule ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 goto local-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80

add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
"#,
    );
}

/// Bridge-interface detector.
#[test]
fn detector_bridge() {
    check(
        "detector-bridge",
        r#"
# ns1/svc1:p80
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80

add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 iifname != cbr0 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80

# ns2/svc2:p80
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80

add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 iifname != cbr0 jump mark-for-masquerade
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add rule ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 iifname cbr0 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 goto local-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80

add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
"#,
    );
}

/// Interface-name-prefix detector (`veth*`).
#[test]
fn detector_interface_prefix() {
    check(
        "detector-interface-prefix",
        r#"
# ns1/svc1:p80
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80

add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 iifname != veth* jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80

# ns2/svc2:p80
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80

add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 iifname != veth* jump mark-for-masquerade
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add rule ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 iifname veth* goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 goto local-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80

add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
"#,
    );
}

/// Restricted nodeport-addresses: nodeport-ips elements, loopback skipped.
#[test]
fn nodeport_addresses() {
    check(
        "nodeport-addresses",
        r#"
# ns3/svc3:p80
add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80

add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 ip daddr 172.30.0.43 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 }
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80

add element ip kube-proxy nodeport-ips { 10.1.0.2 }
add element ip kube-proxy nodeport-ips { 192.168.0.2 }
add element ip kube-proxy cluster-ips { 172.30.0.43 }
add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 }
"#,
    );
}

/// Unknown service CIDRs: only the reject rule in cluster-ips-check (checked in `full_file`).
#[test]
fn no_service_cidrs() {
    check(
        "no-service-cidrs",
        r#"
add element ip kube-proxy cluster-ips { 172.30.0.46 }
add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }
"#,
    );
}

/// UDP and SCTP protocols; an unnamed port.
#[test]
fn unnamed_port_udp_sctp() {
    check(
        "unnamed-port-udp-sctp",
        r#"
# kube-system/kube-dns
add chain ip kube-proxy service-NVIXOA53-kube-system/kube-dns/udp/
add chain ip kube-proxy endpoint-OOJISC4I-kube-system/kube-dns/udp/__10.180.0.53/53

add rule ip kube-proxy service-NVIXOA53-kube-system/kube-dns/udp/ ip daddr 172.30.0.10 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-NVIXOA53-kube-system/kube-dns/udp/ numgen random mod 1 vmap { 0 : goto endpoint-OOJISC4I-kube-system/kube-dns/udp/__10.180.0.53/53 }
add rule ip kube-proxy endpoint-OOJISC4I-kube-system/kube-dns/udp/__10.180.0.53/53 ip saddr 10.180.0.53 jump mark-for-masquerade
add rule ip kube-proxy endpoint-OOJISC4I-kube-system/kube-dns/udp/__10.180.0.53/53 meta l4proto udp dnat to 10.180.0.53:53

# ns9/svc9:p99
add chain ip kube-proxy service-4IJGMKAZ-ns9/svc9/sctp/p99
add chain ip kube-proxy endpoint-QRSS66K2-ns9/svc9/sctp/p99__10.180.0.99/9999

add rule ip kube-proxy service-4IJGMKAZ-ns9/svc9/sctp/p99 ip daddr 172.30.0.49 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-4IJGMKAZ-ns9/svc9/sctp/p99 numgen random mod 1 vmap { 0 : goto endpoint-QRSS66K2-ns9/svc9/sctp/p99__10.180.0.99/9999 }
add rule ip kube-proxy endpoint-QRSS66K2-ns9/svc9/sctp/p99__10.180.0.99/9999 ip saddr 10.180.0.99 jump mark-for-masquerade
add rule ip kube-proxy endpoint-QRSS66K2-ns9/svc9/sctp/p99__10.180.0.99/9999 meta l4proto sctp dnat to 10.180.0.99:9999

add element ip kube-proxy cluster-ips { 172.30.0.10 }
add element ip kube-proxy cluster-ips { 172.30.0.49 }
add element ip kube-proxy service-ips { 172.30.0.10 . udp . 53 : goto service-NVIXOA53-kube-system/kube-dns/udp/ }
add element ip kube-proxy service-ips { 172.30.0.49 . sctp . 99 : goto service-4IJGMKAZ-ns9/svc9/sctp/p99 }
"#,
    );
}

/// Two services claim 192.168.99.33:80/TCP: the first in NodeView order keeps the element.
#[test]
fn shared_external_ip() {
    check(
        "shared-external-ip",
        r#"
# ns4/svc4a:p80
add chain ip kube-proxy service-4FD7EEQH-ns4/svc4a/tcp/p80
add chain ip kube-proxy external-4FD7EEQH-ns4/svc4a/tcp/p80
add chain ip kube-proxy endpoint-RACAUETL-ns4/svc4a/tcp/p80__10.180.0.4/80
add chain ip kube-proxy endpoint-5TFH4RCD-ns4/svc4a/tcp/p80__10.180.0.5/80

add rule ip kube-proxy service-4FD7EEQH-ns4/svc4a/tcp/p80 ip daddr 172.30.0.144 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-4FD7EEQH-ns4/svc4a/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-RACAUETL-ns4/svc4a/tcp/p80__10.180.0.4/80 , 1 : goto endpoint-5TFH4RCD-ns4/svc4a/tcp/p80__10.180.0.5/80 }
add rule ip kube-proxy external-4FD7EEQH-ns4/svc4a/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-4FD7EEQH-ns4/svc4a/tcp/p80 goto service-4FD7EEQH-ns4/svc4a/tcp/p80
add rule ip kube-proxy endpoint-RACAUETL-ns4/svc4a/tcp/p80__10.180.0.4/80 ip saddr 10.180.0.4 jump mark-for-masquerade
add rule ip kube-proxy endpoint-RACAUETL-ns4/svc4a/tcp/p80__10.180.0.4/80 meta l4proto tcp dnat to 10.180.0.4:80
add rule ip kube-proxy endpoint-5TFH4RCD-ns4/svc4a/tcp/p80__10.180.0.5/80 ip saddr 10.180.0.5 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5TFH4RCD-ns4/svc4a/tcp/p80__10.180.0.5/80 meta l4proto tcp dnat to 10.180.0.5:80

# ns4/svc4:p80
add chain ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80
add chain ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80
add chain ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80
add chain ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80

add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 ip daddr 172.30.0.44 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 , 1 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 }
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 goto service-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 ip saddr 10.180.0.4 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 meta l4proto tcp dnat to 10.180.0.4:80
add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 ip saddr 10.180.0.5 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 meta l4proto tcp dnat to 10.180.0.5:80

add element ip kube-proxy cluster-ips { 172.30.0.44 }
add element ip kube-proxy cluster-ips { 172.30.0.144 }
add element ip kube-proxy service-ips { 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.144 . tcp . 80 : goto service-4FD7EEQH-ns4/svc4a/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.33 . tcp . 80 : goto external-4FD7EEQH-ns4/svc4a/tcp/p80 }
"#,
    );
}

#[track_caller]
fn check_full(got: String, expected: &str) {
    let expected = expected.trim_start_matches('\n');
    if got != expected {
        panic!("output differs\n--- got ---\n{got}--- expected ---\n{expected}");
    }
}

/// The whole file once: header, table replacement, the fixed chains, maps and rules.
#[test]
fn full_file() {
    check_full(
        write_string(&case("clusterip-1-endpoint"), &Options::default()),
        r#"
# kube-proxy nftables ruleset for node node-a, family ip (IPv4); generated by svc-compile
add table ip kube-proxy
delete table ip kube-proxy
add table ip kube-proxy { comment "rules for kube-proxy" ; }

add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy service-endpoints-check
add chain ip kube-proxy firewall-check
add chain ip kube-proxy services
add chain ip kube-proxy masquerading
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }

add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }

add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x00004000
add rule ip kube-proxy masquerading mark and 0x00004000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x00004000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip kube-proxy nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports

# ns1/svc1:p80
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80

add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80

add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
"#,
    );
}

/// IPv6 fixed part: `ip6`, `ipv6_addr`, and `::1` as the no-localhost guard.
#[test]
fn full_file_ipv6_empty() {
    check_full(
        write_string(&view_v6(), &Options::default()),
        r#"
# kube-proxy nftables ruleset for node node-a, family ip6 (IPv6); generated by svc-compile
add table ip6 kube-proxy
delete table ip6 kube-proxy
add table ip6 kube-proxy { comment "rules for kube-proxy" ; }

add chain ip6 kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip6 kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip6 kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip6 kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip6 kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip6 kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip6 kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip6 kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip6 kube-proxy nodeport-endpoints-check
add chain ip6 kube-proxy service-endpoints-check
add chain ip6 kube-proxy firewall-check
add chain ip6 kube-proxy services
add chain ip6 kube-proxy masquerading
add chain ip6 kube-proxy cluster-ips-check
add chain ip6 kube-proxy mark-for-masquerade
add chain ip6 kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }

add set ip6 kube-proxy cluster-ips { type ipv6_addr ; comment "Active ClusterIPs" ; }
add map ip6 kube-proxy no-endpoint-services { type ipv6_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip6 kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip6 kube-proxy firewall-ips { type ipv6_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add map ip6 kube-proxy service-ips { type ipv6_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip6 kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }

add rule ip6 kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip6 kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip6 kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip6 kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip6 kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip6 kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip6 kube-proxy nat-output jump services
add rule ip6 kube-proxy nat-prerouting jump services
add rule ip6 kube-proxy nat-postrouting jump masquerading
add rule ip6 kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip6 kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip6 kube-proxy mark-for-masquerade mark set mark or 0x00004000
add rule ip6 kube-proxy masquerading mark and 0x00004000 == 0 return
add rule ip6 kube-proxy masquerading mark set mark xor 0x00004000
add rule ip6 kube-proxy masquerading masquerade fully-random
add rule ip6 kube-proxy cluster-ips-check ip6 daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:10:96::/112 } drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip6 kube-proxy reject-chain reject
add rule ip6 kube-proxy service-endpoints-check ip6 daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip6 kube-proxy nodeport-endpoints-check ip6 daddr != ::1 meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip6 kube-proxy firewall-check ip6 daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip6 kube-proxy services ip6 daddr . meta l4proto . th dport vmap @service-ips
add rule ip6 kube-proxy services fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports
"#,
    );
}

/// Restricted nodeport-addresses change the fixed part (nodeport-ips set, no fib check);
/// `replace_table: false` leaves out the add+delete lines.
#[test]
fn full_file_nodeport_addresses_no_replace() {
    check_full(
        write_string(
            &case("nodeport-addresses"),
            &Options {
                replace_table: false,
            },
        ),
        r#"
# kube-proxy nftables ruleset for node node-a, family ip (IPv4); generated by svc-compile
add table ip kube-proxy { comment "rules for kube-proxy" ; }

add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy service-endpoints-check
add chain ip kube-proxy firewall-check
add chain ip kube-proxy services
add chain ip kube-proxy masquerading
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }

add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }

add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x00004000
add rule ip kube-proxy masquerading mark and 0x00004000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x00004000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports

# ns3/svc3:p80
add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80

add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 ip daddr 172.30.0.43 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 }
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80

add element ip kube-proxy nodeport-ips { 10.1.0.2 }
add element ip kube-proxy nodeport-ips { 192.168.0.2 }
add element ip kube-proxy cluster-ips { 172.30.0.43 }
add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 }
"#,
    );
}

#[test]
fn cluster_ips_check_without_service_cidrs() {
    let out = write_string(&case("no-service-cidrs"), &Options::default());
    assert!(out.contains("add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject"));
    assert!(!out.contains("Drop traffic to unallocated ClusterIPs"));
    let mut two = case("no-service-cidrs");
    two.service_cidrs = vec![cidr("172.30.0.0/16"), cidr("10.96.0.1/12")];
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
    let v = with_view(view_v4(), vec![svc2(false), svc5()]);
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
    use svc_compiler::ir::Protocol;
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
