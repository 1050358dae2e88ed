//! The service health checks a node serves: kube-proxy's `healthCheckNodePort` servers
//! (`pkg/proxy/healthcheck/service_health.go`), derived from the node's views. Pure: the
//! agent (`svc_node::serve`) opens the servers this list names.
//!
//! kube-proxy runs one health server per single-stack proxier, so on a dual-stack node the
//! IPv4 and IPv6 proxiers both open the service's port (upstream issue 114702). Here a
//! service has one entry for the node, made from every family's view it appears in: its
//! listen addresses are both families', its count both families' endpoints.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use svc_compiler::ir::{Node, NodePortAddresses, NodeView};
use svc_compiler::net::IpFamily;

/// One service's health-check server on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    pub namespace: String,
    pub name: String,
    /// `spec.healthCheckNodePort`.
    pub port: u16,
    /// Where it listens, sorted (IPv4 first). `0.0.0.0` / `::` stand for every address of
    /// their family (nodePortAddresses matches all); other addresses are the node IPs
    /// nodePortAddresses selects. Empty: no node IP matched, nothing listens (as kube-proxy,
    /// whose listen loop then opens nothing).
    pub addresses: Vec<IpAddr>,
    /// Local, ready endpoints, counted once per IP across the service's ports
    /// (`EndpointsMap.LocalReadyEndpoints`). A terminating endpoint is not ready, so it
    /// does not count: the check fails on a node with only terminating endpoints.
    pub local_endpoints: usize,
}

impl HealthCheck {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The health checks kube-proxy would serve on the node these views are of (one view per
/// family, in any order), sorted by (namespace, name): one per service whose ports carry a
/// `health_check_node_port` (a LoadBalancer with externalTrafficPolicy Local; the node pass
/// decides which).
pub fn health_checks<'a>(views: impl IntoIterator<Item = &'a NodeView>) -> Vec<HealthCheck> {
    #[derive(Default)]
    struct Acc {
        port: u16,
        addresses: BTreeSet<IpAddr>,
        ready: BTreeSet<IpAddr>,
    }
    let mut services: BTreeMap<(&str, &str), Acc> = BTreeMap::new();
    for view in views {
        let listen: Vec<IpAddr> = match &view.node_port_addresses {
            NodePortAddresses::All => vec![unspecified(view.family)],
            NodePortAddresses::Ips(ips) => ips.clone(),
        };
        for port in &view.ports {
            let Some(hc_port) = port.health_check_node_port else {
                continue;
            };
            let acc = services.entry((&port.namespace, &port.name)).or_default();
            acc.port = hc_port;
            acc.addresses.extend(listen.iter().copied());
            acc.ready.extend(
                port.endpoints
                    .iter()
                    .filter(|e| e.is_local && e.ready)
                    .map(|e| e.ip),
            );
        }
    }
    services
        .into_iter()
        .map(|((namespace, name), acc)| HealthCheck {
            namespace: namespace.to_string(),
            name: name.to_string(),
            port: acc.port,
            addresses: acc.addresses.into_iter().collect(),
            local_endpoints: acc.ready.len(),
        })
        .collect()
}

/// The Cluster Autoscaler's taint on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Whether the node may take load-balancer traffic, as kube-proxy's `/healthz` says
/// (`proxy_health.go`, `NodeEligible`): a Node manifest of that name (kube-proxy waits for
/// its Node before it serves), not being deleted (`deletionTimestamp`), and no taint with
/// the key [`TO_BE_DELETED_TAINT`], whatever its value or effect. `/livez` does not ask.
pub fn node_eligible(node: Option<&Node>) -> bool {
    node.is_some_and(|n| !n.deleting && !n.taints.iter().any(|t| t == TO_BE_DELETED_TAINT))
}

/// The address that stands for all of a family's.
pub fn unspecified(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::IPv4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpFamily::IPv6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use svc_compiler::ir::{Module, NodePortAddress, Service, ServiceType, TrafficPolicy};
    use svc_compiler::testing::{self as t, endpoints};

    /// A LoadBalancer `ns/name` with externalTrafficPolicy Local and health-check node port
    /// `hc`, ports `http` (80 → 8080) and `https` (443 → 8443) with these endpoints (on
    /// both ports), single-stack at `cluster_ip`'s family.
    fn local_lb(ns: &str, name: &str, cluster_ip: &str, hc: u16, eps: &[&str]) -> Service {
        let mut s = t::service(
            ns,
            name,
            ServiceType::LoadBalancer,
            cluster_ip,
            vec![
                t::port("http", 80, 8080, endpoints(eps, 8080)),
                t::port("https", 443, 8443, endpoints(eps, 8443)),
            ],
        );
        s.external_traffic_policy = TrafficPolicy::Local;
        s.health_check_node_port = Some(hc);
        s
    }

    fn module(services: Vec<Service>) -> Module {
        t::module(
            services,
            vec![
                t::node("node-1", &t::NODE_IPS, None),
                t::node("node-2", &["192.168.0.3", "2001:db8::2"], None),
            ],
        )
    }

    fn checks(m: &Module) -> Vec<HealthCheck> {
        let v4 = t::view(m, "node-1", IpFamily::IPv4);
        let v6 = t::view(m, "node-1", IpFamily::IPv6);
        health_checks([&v4, &v6])
    }

    #[test]
    fn a_node_being_deleted_or_tainted_for_deletion_is_not_eligible() {
        let node = t::node("n1", &["10.0.0.1"], None);
        assert!(node_eligible(Some(&node)));
        assert!(!node_eligible(None));
        let deleting = Node {
            deleting: true,
            ..node.clone()
        };
        assert!(!node_eligible(Some(&deleting)));
        let tainted = |keys: &[&str]| Node {
            taints: keys.iter().map(|k| k.to_string()).collect(),
            ..node.clone()
        };
        assert!(!node_eligible(Some(&tainted(&[
            "node.kubernetes.io/unschedulable",
            "ToBeDeletedByClusterAutoscaler"
        ]))));
        // Other taints, and the key's other spellings, leave it eligible.
        assert!(node_eligible(Some(&tainted(&[
            "node.kubernetes.io/unschedulable",
            "DeletionCandidateOfClusterAutoscaler",
            "tobedeletedbyclusterautoscaler"
        ]))));
    }

    #[test]
    fn counts_local_ready_endpoint_ips_once_across_ports() {
        let mut web = local_lb(
            "shop",
            "web",
            "172.30.0.10",
            31000,
            &[
                "10.0.1.1@node-1",
                "10.0.1.2@node-1",
                "10.0.1.3@node-1#serving-terminating",
                "10.0.1.4@node-1#terminating",
                "10.0.1.5@node-1#not-ready",
                "10.0.2.1@node-2",
                "10.0.9.9",
            ],
        );
        // An endpoint on one port only counts too.
        web.ports[1]
            .endpoints
            .extend(endpoints(&["10.0.1.6@node-1"], 8443));
        let hc = checks(&module(vec![web]));
        assert_eq!(
            hc,
            vec![HealthCheck {
                namespace: "shop".into(),
                name: "web".into(),
                port: 31000,
                addresses: vec![t::ip("0.0.0.0")],
                local_endpoints: 3,
            }]
        );
        assert_eq!(hc[0].key(), "shop/web");
    }

    #[test]
    fn only_local_load_balancers_have_one_sorted_by_name() {
        let mut cluster = local_lb("a", "cluster", "172.30.0.11", 31001, &["10.0.1.1@node-1"]);
        cluster.external_traffic_policy = TrafficPolicy::Cluster;
        let mut node_port = local_lb("a", "np", "172.30.0.12", 31002, &["10.0.1.1@node-1"]);
        node_port.kind = ServiceType::NodePort;
        let none = local_lb("b", "none", "172.30.0.13", 31003, &["10.0.2.1@node-2"]);
        let first = local_lb("a", "z", "172.30.0.14", 31004, &[]);
        let hc = checks(&module(vec![none, cluster, node_port, first]));
        let got: Vec<(String, u16, usize)> = hc
            .iter()
            .map(|h| (h.key(), h.port, h.local_endpoints))
            .collect();
        assert_eq!(
            got,
            [
                ("a/z".to_string(), 31004, 0),
                ("b/none".to_string(), 31003, 0)
            ]
        );
    }

    #[test]
    fn dual_stack_services_have_one_check_with_both_families() {
        let mut dual = local_lb(
            "shop",
            "dual",
            "172.30.0.10",
            31000,
            &["10.0.1.1@node-1", "fd00:10::1@node-1", "fd00:10::2@node-2"],
        );
        dual.cluster_ips.push(t::ip("fd00:10:96::10"));
        dual.ip_families.push(IpFamily::IPv6);
        let v6_only = local_lb(
            "shop",
            "v6",
            "fd00:10:96::11",
            31001,
            &["fd00:10::3@node-1"],
        );
        let hc = checks(&module(vec![dual, v6_only]));
        assert_eq!(hc.len(), 2);
        assert_eq!(
            (
                hc[0].key().as_str(),
                &hc[0].addresses,
                hc[0].local_endpoints
            ),
            ("shop/dual", &vec![t::ip("0.0.0.0"), t::ip("::")], 2)
        );
        // A single-stack service listens on its own family only.
        assert_eq!(
            (
                hc[1].key().as_str(),
                &hc[1].addresses,
                hc[1].local_endpoints
            ),
            ("shop/v6", &vec![t::ip("::")], 1)
        );
        // No such service, no check.
        assert!(checks(&module(vec![])).is_empty());
    }

    #[test]
    fn node_port_addresses_pick_the_node_ips_to_listen_on() {
        let mut m = module(vec![local_lb(
            "shop",
            "web",
            "172.30.0.10",
            31000,
            &["10.0.1.1@node-1"],
        )]);
        m.proxy.node_port_addresses = vec![NodePortAddress::Cidr(t::cidr("192.168.0.0/24"))];
        assert_eq!(checks(&m)[0].addresses, vec![t::ip("192.168.0.2")]);
        // The IPv6 view matches all when no IPv6 CIDR is given (kube-proxy per family),
        // but a single-stack IPv4 service appears in the IPv4 view only.
        m.proxy.node_port_addresses = vec![NodePortAddress::Cidr(t::cidr("10.9.0.0/16"))];
        let hc = &checks(&m)[0];
        assert!(hc.addresses.is_empty(), "{hc:?}");
        assert_eq!(hc.local_endpoints, 1);
        // Views in either order give the same list.
        m.proxy.node_port_addresses = vec![];
        let v4 = t::view(&m, "node-1", IpFamily::IPv4);
        let v6 = t::view(&m, "node-1", IpFamily::IPv6);
        assert_eq!(health_checks([&v6, &v4]), health_checks([&v4, &v6]));
    }
}
