//! Test fixtures shared by the unit tests of this crate (`passes::node`) and of
//! `svc-targets` (iptables, nftables): IR objects written by hand, turned into node views
//! by the real node pass, so that back-end tests see exactly the decisions the pass
//! records and never build a `NodeView` field by field.
//!
//! Compiled for this crate's tests and, through the `testing` feature that svc-targets
//! enables in its dev-dependencies only, for its tests; hidden from the docs and not part
//! of the API. No I/O, like the rest of the crate.
//!
//! Defaults follow kube-proxy's own unit tests (`proxier_test.go`): pods in 10.0.0.0/8
//! (fd00:10::/64), service IPs in 172.30.0.0/16 (fd00:10:96::/112), the node at
//! 192.168.0.2 (2001:db8::1). A test changes what it needs on the returned values.

use crate::ir::{
    ClusterConfig, DetectLocalMode, Endpoint, LoadBalancerIngress, Module, Node, NodeView,
    Protocol, ProxyConfig, Service, ServicePort, ServiceType, TargetPort, TrafficPolicy,
};
use crate::net::{join_host_port, Cidr, IpFamily};
use crate::passes::node::{node_view, NodeSelection};
use std::collections::BTreeMap;
use std::net::IpAddr;

pub fn ip(s: &str) -> IpAddr {
    s.parse()
        .unwrap_or_else(|_| panic!("fixture: bad IP {s:?}"))
}

pub fn cidr(s: &str) -> Cidr {
    s.parse()
        .unwrap_or_else(|_| panic!("fixture: bad CIDR {s:?}"))
}

/// The addresses of the node every back-end fixture compiles for.
pub const NODE_IPS: [&str; 2] = ["192.168.0.2", "2001:db8::1"];

/// A module of `services` and `nodes` (sorted by name, as the IR keeps them), with
/// kube-proxy's defaults: detectLocal by clusterCIDR, masqueradeBit 14, localhostNodePorts,
/// node ports on every local address.
pub fn module(services: Vec<Service>, mut nodes: Vec<Node>) -> Module {
    let mut services = services;
    services.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    Module {
        cluster: ClusterConfig {
            service_cidrs: vec![cidr("172.30.0.0/16"), cidr("fd00:10:96::/112")],
            node_port_range: (30000, 32767),
            cluster_domain: "cluster.local".into(),
            random_fully: None,
            nfacct: None,
            nft_layout: Default::default(),
            topology_keys: Default::default(),
            dns_records: Default::default(),
            ebpf_map_sizes: Default::default(),
            ebpf_agent: Default::default(),
            ebpf_service_topology: false,
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
            conntrack: Default::default(),
        },
        services,
        nodes,
        pods: vec![],
    }
}

/// A Node with these addresses, its `kubernetes.io/hostname` label and, when given, its
/// `topology.kubernetes.io/zone`; no podCIDRs.
pub fn node(name: &str, addrs: &[&str], zone: Option<&str>) -> Node {
    let mut labels = BTreeMap::new();
    labels.insert("kubernetes.io/hostname".to_string(), name.to_string());
    if let Some(z) = zone {
        labels.insert("topology.kubernetes.io/zone".to_string(), z.to_string());
    }
    Node {
        name: name.into(),
        addresses: addrs.iter().map(|a| ip(a)).collect(),
        labels,
        pod_cidrs: vec![],
        deleting: false,
        taints: vec![],
    }
}

/// A Service `ns/name` of `kind` with one cluster IP (single-stack of its family), both
/// traffic policies Cluster, no affinity, and these ports.
pub fn service(
    ns: &str,
    name: &str,
    kind: ServiceType,
    cluster_ip: &str,
    ports: Vec<ServicePort>,
) -> Service {
    let cluster_ip = ip(cluster_ip);
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
        topology_mode: None,
        proxy_name: None,
        headless_label: false,
        load_balancer_class: None,
        cilium_annotations: Default::default(),
        ports,
        allocated: vec![],
        portless_endpoints: vec![],
        portless_slice_ports: vec![],
    }
}

/// A TCP port `name` (empty: unnamed), `port` → `target_port`, without a node port.
pub fn port(name: &str, port: u16, target_port: u16, endpoints: Vec<Endpoint>) -> ServicePort {
    ServicePort {
        name: name.into(),
        protocol: Protocol::TCP,
        port,
        node_port: None,
        target_port: TargetPort::Number(target_port),
        endpoints,
    }
}

/// Endpoints on `port`, one per spec `ip[@node][#state]`, sorted like the IR keeps them
/// (by `ip:port`). See [`endpoint`].
pub fn endpoints(specs: &[&str], port: u16) -> Vec<Endpoint> {
    let mut v: Vec<Endpoint> = specs.iter().map(|s| endpoint(s, port)).collect();
    v.sort_by(|a, b| a.addr.cmp(&b.addr));
    v
}

/// One endpoint from `ip[@node][#state]`: without `@node` it is on no node (never local);
/// the state is ready unless `#serving-terminating`, `#terminating` (not serving) or
/// `#not-ready`.
pub fn endpoint(spec: &str, port: u16) -> Endpoint {
    let (rest, state) = spec.split_once('#').unwrap_or((spec, ""));
    let (addr, node) = rest.split_once('@').unwrap_or((rest, ""));
    let (ready, serving, terminating) = match state {
        "" => (true, true, false),
        "serving-terminating" => (false, true, true),
        "terminating" => (false, false, true),
        "not-ready" => (false, false, false),
        _ => panic!("fixture: unknown endpoint state {state:?} in {spec:?}"),
    };
    let ip = ip(addr);
    Endpoint {
        ip,
        port,
        addr: join_host_port(&ip, port).into(),
        other_addresses: vec![],
        node_name: (!node.is_empty()).then(|| node.into()),
        zone: None,
        hostname: None,
        ready,
        serving,
        terminating,
        hint_zones: vec![],
        hint_nodes: vec![],
        source: "EndpointSlice fixture".into(),
        copies: vec![],
    }
}

/// `status.loadBalancer.ingress` with these IPs (ipMode VIP).
pub fn lb_ingress(ips: &[&str]) -> Vec<LoadBalancerIngress> {
    ips.iter()
        .map(|i| LoadBalancerIngress {
            ip: ip(i),
            proxy_mode: false,
        })
        .collect()
}

/// What the node pass gives for `node` and `family`, as the CLI asks for it.
pub fn view(m: &Module, node: &str, family: IpFamily) -> NodeView {
    let sel = NodeSelection {
        name: node.into(),
        ips: vec![],
    };
    node_view(m, &sel, family).unwrap_or_else(|d| panic!("fixture: {}", d.message))
}
