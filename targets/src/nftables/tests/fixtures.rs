//! Hand-built NodeViews for exact-text tests of one behaviour at a time (the golden cases
//! cover what the node pass builds from manifests); `with_view` gives every port the node
//! pass's decisions. Named after kube-proxy's own test conventions: pods 10.0.0.0/8 (endpoints 10.180.x.y), ClusterIPs 172.30.0.0/16, node
//! 192.168.0.2, externalIPs 192.168.99.x, LB IPs 1.2.3.4 / 5.6.7.8, clients 203.0.113.0/24.

use std::net::IpAddr;
use svc_compiler::ir::{
    ByMode, EndpointView, LocalDetector, NoEndpointsVerdict, NodePortAddresses, NodeView, PortView,
    Protocol,
};
use svc_compiler::net::{Cidr, IpFamily};

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn cidr(s: &str) -> Cidr {
    s.parse().unwrap()
}

pub fn view_v4() -> NodeView {
    NodeView {
        node_name: "node-a".into(),
        family: IpFamily::IPv4,
        node_ips: vec![ip("192.168.0.2")],
        masquerade_mark: 0x4000,
        masquerade_all: false,
        local_detector: Some(LocalDetector::Cidr(cidr("10.0.0.0/8"))),
        node_port_addresses: NodePortAddresses::All,
        localhost_node_ports: true,
        martian_rule: true,
        large_cluster: false,
        drop_invalid: true,
        service_cidrs: vec![cidr("172.30.0.0/16")],
        ports: vec![],
    }
}

pub fn view_v6() -> NodeView {
    NodeView {
        node_name: "node-a".into(),
        family: IpFamily::IPv6,
        node_ips: vec![ip("2001:db8::1")],
        masquerade_mark: 0x4000,
        masquerade_all: false,
        local_detector: Some(LocalDetector::Cidr(cidr("fd00:10::/64"))),
        node_port_addresses: NodePortAddresses::All,
        localhost_node_ports: false,
        martian_rule: false,
        large_cluster: false,
        drop_invalid: true,
        service_cidrs: vec![cidr("fd00:10:96::/112")],
        ports: vec![],
    }
}

/// A TCP ClusterIP port `ns/name:port_name` with no endpoints.
pub fn port(ns: &str, name: &str, port_name: &str, cluster_ip: &str, port: u16) -> PortView {
    let spn = if port_name.is_empty() {
        format!("{ns}/{name}")
    } else {
        format!("{ns}/{name}:{port_name}")
    };
    PortView {
        service: 0,
        namespace: ns.into(),
        name: name.into(),
        port_name: port_name.into(),
        protocol: Protocol::TCP,
        spn,
        cluster_ip: Some(ip(cluster_ip)),
        port,
        node_port: None,
        external_ips: vec![],
        load_balancer_ips: vec![],
        source_ranges: vec![],
        source_ranges_include_node: false,
        health_check_node_port: None,
        affinity_timeout: None,
        externally_accessible: false,
        internal_local: false,
        external_local: false,
        has_endpoints: false,
        // Set by `with_view`, from the fields above.
        has_internal_endpoints: false,
        has_external_endpoints: false,
        no_endpoints_verdict: NoEndpointsVerdict::Reject,
        uses_external_chain: false,
        uses_firewall_chain: ByMode {
            iptables: false,
            nftables: false,
        },
        endpoints: vec![],
        cluster_endpoints: vec![],
        local_endpoints: vec![],
        topology: None,
    }
}

pub fn ep(addr: &str, port: u16, is_local: bool) -> EndpointView {
    let ip = ip(addr);
    EndpointView {
        ip,
        port,
        addr: svc_compiler::net::join_host_port(&ip, port).into(),
        is_local,
        ready: true,
        serving: true,
        terminating: false,
    }
}

/// Ready endpoints, decided the way the node pass would for the port's policies: Cluster
/// endpoints unless only Local traffic exists (ITP=Local, not externally accessible), local
/// endpoints when a Local policy applies.
pub fn with_endpoints(mut p: PortView, eps: Vec<EndpointView>) -> PortView {
    p.has_endpoints = !eps.is_empty();
    let all: Vec<u32> = (0..eps.len() as u32).collect();
    let local: Vec<u32> = all
        .iter()
        .copied()
        .filter(|&i| eps[i as usize].is_local)
        .collect();
    let uses_cluster = !p.internal_local || p.externally_accessible;
    let uses_local = p.internal_local || p.external_local;
    p.cluster_endpoints = if uses_cluster { all } else { vec![] };
    p.local_endpoints = if uses_local { local } else { vec![] };
    p.endpoints = eps;
    p
}

pub fn node_port(mut p: PortView, np: u16) -> PortView {
    p.node_port = Some(np);
    p.externally_accessible = true;
    p
}

pub fn load_balancer(mut p: PortView, np: u16, lb_ips: &[&str]) -> PortView {
    p = node_port(p, np);
    p.load_balancer_ips = lb_ips.iter().map(|s| ip(s)).collect();
    p
}

/// The view with these ports, each with the node pass's decisions made from its fields.
pub fn with_view(mut v: NodeView, mut ports: Vec<PortView>) -> NodeView {
    ports
        .iter_mut()
        .for_each(svc_compiler::passes::node::record_decisions);
    v.ports = ports;
    v
}

/// ns1/svc1:p80, ClusterIP 172.30.0.41, one remote endpoint.
pub fn svc1() -> PortView {
    with_endpoints(
        port("ns1", "svc1", "p80", "172.30.0.41", 80),
        vec![ep("10.180.0.1", 80, false)],
    )
}

/// ns2/svc2:p80, LoadBalancer 1.2.3.4 with externalIP 192.168.99.22, nodePort 3001,
/// ETP=Local; `local` says whether its endpoint runs on this node.
pub fn svc2(local: bool) -> PortView {
    let mut p = load_balancer(
        port("ns2", "svc2", "p80", "172.30.0.42", 80),
        3001,
        &["1.2.3.4"],
    );
    p.external_ips = vec![ip("192.168.99.22")];
    p.external_local = true;
    p.health_check_node_port = Some(30000);
    with_endpoints(p, vec![ep("10.180.0.2", 80, local)])
}

/// ns3/svc3:p80, NodePort 3003.
pub fn svc3() -> PortView {
    with_endpoints(
        node_port(port("ns3", "svc3", "p80", "172.30.0.43", 80), 3003),
        vec![ep("10.180.0.3", 80, false)],
    )
}

/// ns4/svc4:p80, ClusterIP with externalIP 192.168.99.33, two endpoints (one local).
pub fn svc4() -> PortView {
    let mut p = port("ns4", "svc4", "p80", "172.30.0.44", 80);
    p.external_ips = vec![ip("192.168.99.33")];
    p.externally_accessible = true;
    with_endpoints(
        p,
        vec![ep("10.180.0.4", 80, false), ep("10.180.0.5", 80, true)],
    )
}

/// ns5/svc5:p80, LoadBalancer 5.6.7.8, nodePort 3002, source range 203.0.113.0/25,
/// ClientIP affinity.
pub fn svc5() -> PortView {
    let mut p = load_balancer(
        port("ns5", "svc5", "p80", "172.30.0.45", 80),
        3002,
        &["5.6.7.8"],
    );
    p.source_ranges = vec![cidr("203.0.113.0/25")];
    p.affinity_timeout = Some(10800);
    with_endpoints(p, vec![ep("10.180.0.3", 80, false)])
}

/// ns6/svc6:p80, ClusterIP without endpoints.
pub fn svc6() -> PortView {
    port("ns6", "svc6", "p80", "172.30.0.46", 80)
}

/// Every case the unit tests cover, for the kernel tests.
pub fn all_cases() -> Vec<(&'static str, NodeView)> {
    let v4 = view_v4;
    let mut cases = vec![
        ("empty", v4()),
        (
            "overall",
            with_view(
                v4(),
                vec![svc1(), svc2(false), svc3(), svc4(), svc5(), svc6()],
            ),
        ),
    ];
    cases.extend(crate::nftables::tests::case_views());
    cases
}
