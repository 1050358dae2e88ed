//! The services the nftables tests render, written with the shared IR fixtures
//! (`svc_compiler::testing`) and turned into node views by the node pass, so that every
//! decision in them is the pass's. Named after kube-proxy's own test conventions: pods
//! 10.0.0.0/8 (endpoints 10.180.x.y), ClusterIPs 172.30.0.0/16, node `node-a` at
//! 192.168.0.2, externalIPs 192.168.99.x, LB IPs 1.2.3.4 / 5.6.7.8, clients 203.0.113.0/24.

use svc_compiler::ir::{Endpoint, Module, NodeView, Service, ServiceType, TrafficPolicy};
use svc_compiler::net::IpFamily;
use svc_compiler::testing::{self, lb_ingress, NODE_IPS};
pub use svc_compiler::testing::{cidr, ip};

/// The node every view is compiled for.
pub const NODE: &str = "node-a";

/// The cluster of these services, with one Node: `node-a`.
pub fn cluster(services: Vec<Service>) -> Module {
    testing::module(services, vec![testing::node(NODE, &NODE_IPS, None)])
}

pub fn v4(m: &Module) -> NodeView {
    testing::view(m, NODE, IpFamily::IPv4)
}

pub fn v6(m: &Module) -> NodeView {
    testing::view(m, NODE, IpFamily::IPv6)
}

/// The IPv4 view of a cluster of these services.
pub fn view_v4(services: Vec<Service>) -> NodeView {
    v4(&cluster(services))
}

/// The IPv6 view of a cluster of these services.
pub fn view_v6(services: Vec<Service>) -> NodeView {
    v6(&cluster(services))
}

/// A ready endpoint, on `node-a` when `local`, else on no node.
pub fn ep(addr: &str, port: u16, local: bool) -> Endpoint {
    let spec = if local {
        format!("{addr}@{NODE}")
    } else {
        addr.to_string()
    };
    testing::endpoint(&spec, port)
}

/// A TCP ClusterIP `ns/name` with one port `port_name` (empty: unnamed) and these endpoints.
pub fn service(
    ns: &str,
    name: &str,
    port_name: &str,
    cluster_ip: &str,
    port: u16,
    mut endpoints: Vec<Endpoint>,
) -> Service {
    endpoints.sort_by(|a, b| a.addr.cmp(&b.addr));
    let port = testing::port(port_name, port, port, endpoints);
    testing::service(ns, name, ServiceType::ClusterIP, cluster_ip, vec![port])
}

pub fn node_port(mut s: Service, np: u16) -> Service {
    s.kind = ServiceType::NodePort;
    s.ports[0].node_port = Some(np);
    s
}

pub fn load_balancer(s: Service, np: u16, lb_ips: &[&str]) -> Service {
    let mut s = node_port(s, np);
    s.kind = ServiceType::LoadBalancer;
    s.load_balancer_ingress = lb_ingress(lb_ips);
    s
}

/// ns1/svc1:p80, ClusterIP 172.30.0.41, one remote endpoint.
pub fn svc1() -> Service {
    service(
        "ns1",
        "svc1",
        "p80",
        "172.30.0.41",
        80,
        vec![ep("10.180.0.1", 80, false)],
    )
}

/// ns2/svc2:p80, LoadBalancer 1.2.3.4 with externalIP 192.168.99.22, nodePort 3001,
/// ETP=Local; `local` says whether its endpoint runs on this node.
pub fn svc2(local: bool) -> Service {
    let mut s = load_balancer(
        service(
            "ns2",
            "svc2",
            "p80",
            "172.30.0.42",
            80,
            vec![ep("10.180.0.2", 80, local)],
        ),
        3001,
        &["1.2.3.4"],
    );
    s.external_ips = vec![ip("192.168.99.22")];
    s.external_traffic_policy = TrafficPolicy::Local;
    s.health_check_node_port = Some(30000);
    s
}

/// ns3/svc3:p80, NodePort 3003.
pub fn svc3() -> Service {
    node_port(
        service(
            "ns3",
            "svc3",
            "p80",
            "172.30.0.43",
            80,
            vec![ep("10.180.0.3", 80, false)],
        ),
        3003,
    )
}

/// ns4/svc4:p80, ClusterIP with externalIP 192.168.99.33, two endpoints (one local).
pub fn svc4() -> Service {
    let mut s = service(
        "ns4",
        "svc4",
        "p80",
        "172.30.0.44",
        80,
        vec![ep("10.180.0.4", 80, false), ep("10.180.0.5", 80, true)],
    );
    s.external_ips = vec![ip("192.168.99.33")];
    s
}

/// ns5/svc5:p80, LoadBalancer 5.6.7.8, nodePort 3002, source range 203.0.113.0/25,
/// ClientIP affinity.
pub fn svc5() -> Service {
    let mut s = load_balancer(
        service(
            "ns5",
            "svc5",
            "p80",
            "172.30.0.45",
            80,
            vec![ep("10.180.0.3", 80, false)],
        ),
        3002,
        &["5.6.7.8"],
    );
    s.load_balancer_source_ranges = vec![cidr("203.0.113.0/25")];
    s.session_affinity_timeout = Some(10800);
    s
}

/// ns6/svc6:p80, ClusterIP without endpoints.
pub fn svc6() -> Service {
    service("ns6", "svc6", "p80", "172.30.0.46", 80, vec![])
}

/// Every case the unit tests cover, for the kernel tests.
pub fn all_cases() -> Vec<(&'static str, NodeView)> {
    let mut cases = vec![
        ("empty", view_v4(vec![])),
        (
            "overall",
            view_v4(vec![svc1(), svc2(false), svc3(), svc4(), svc5(), svc6()]),
        ),
    ];
    cases.extend(crate::nftables::tests::case_views());
    cases
}
