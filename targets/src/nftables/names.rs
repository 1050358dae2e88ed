//! kube-proxy's nftables table, chain, set and map names, written once: the model
//! (`model.rs`) declares and fills these objects, the planner owns the table, `drift`
//! groups a per-port object by the service its name says and `trace` selects a step's
//! lines by them.
//!
//! Invariant: an object the model declares is a constant here, a base chain of the model's
//! `BASE_CHAINS`, a name [`PortChains`] or [`EndpointNames`] build, or a fast-layout
//! affinity map named after one of those chains; per-port names are
//! `KIND-HASH-ns/name/proto/port[__ip/port]` ([`port_of`] reads them back).

use crate::common::hash_and_truncate;
use std::net::IpAddr;
use svc_compiler::ir::{EndpointView, PortView};
use svc_compiler::net::FastIp;

/// The one table, in either family.
pub(crate) const TABLE: &str = "kube-proxy";
pub(crate) const TABLE_COMMENT: &str = "rules for kube-proxy";

// Top-level chains, sets and maps (kube-proxy's names).
pub(crate) const SERVICES: &str = "services";
pub(crate) const SERVICE_IPS: &str = "service-ips";
pub(crate) const SERVICE_NODEPORTS: &str = "service-nodeports";
pub(crate) const NODEPORT_IPS: &str = "nodeport-ips";
pub(crate) const CLUSTER_IPS: &str = "cluster-ips";
pub(crate) const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
pub(crate) const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
pub(crate) const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub(crate) const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub(crate) const REJECT_CHAIN: &str = "reject-chain";
pub(crate) const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
pub(crate) const FIREWALL_IPS: &str = "firewall-ips";
pub(crate) const FIREWALL_CHECK: &str = "firewall-check";
pub(crate) const MARK_MASQ: &str = "mark-for-masquerade";
pub(crate) const MASQUERADING: &str = "masquerading";
/// The fast layout's endpoint addresses, each as `addr . addr` (see `NftLayout::Fast`).
pub(crate) const HAIRPIN_ENDPOINTS: &str = "hairpin-endpoints";

/// The chains of one service port; they share one hashed base.
pub(crate) struct PortChains {
    /// Cluster traffic policy.
    pub cluster: String,
    /// Local traffic policy.
    pub local: String,
    /// External destinations.
    pub external: String,
    /// Load-balancer source ranges.
    pub firewall: String,
}

impl PortChains {
    pub(crate) fn new(p: &PortView) -> PortChains {
        let base = hash_and_truncate(&format!(
            "{}/{}/{}/{}",
            p.namespace,
            p.name,
            p.protocol.lower(),
            p.port_name
        ));
        PortChains {
            cluster: format!("service-{base}"),
            local: format!("local-{base}"),
            external: format!("external-{base}"),
            firewall: format!("firewall-{base}"),
        }
    }
}

/// The objects of one endpoint of a service port: its DNAT chain and its affinity set.
pub(crate) struct EndpointNames {
    pub chain: String,
    pub affinity: String,
}

impl EndpointNames {
    pub(crate) fn new(p: &PortView, ep: &EndpointView) -> EndpointNames {
        let base = hash_and_truncate(&format!(
            "{}/{}/{}/{}__{}/{}",
            p.namespace,
            p.name,
            p.protocol.lower(),
            p.port_name,
            // kube-proxy writes IPv6 colons as dots here.
            match ep.ip {
                IpAddr::V4(_) => FastIp(&ep.ip).to_string(),
                IpAddr::V6(a) => a.to_string().replace(':', "."),
            },
            ep.port
        ));
        EndpointNames {
            chain: format!("endpoint-{base}"),
            affinity: format!("affinity-{base}"),
        }
    }
}

/// The service port (`ns/name/proto/port`) a per-port object's name says
/// (`service-HASH-ns/name/proto/port`, `endpoint-HASH-ns/name/proto/port__ip/port`, …);
/// `None` for the other names.
pub(crate) fn port_of(name: &str) -> Option<&str> {
    let (_, rest) = name.split_once('-')?;
    let (_, rest) = rest.split_once('-')?;
    let port = rest.split("__").next()?;
    (port.matches('/').count() == 3).then_some(port)
}
