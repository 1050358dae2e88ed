//! Per-node pass: what one node's proxy programs for one family.
//!
//! This is the part of kube-proxy that does not depend on the dataplane: its per-family
//! proxier setup (node IPs, local-traffic detector, `nodePortAddresses`,
//! `localhostNodePorts`), the service tracker (which service ports exist on a family),
//! `CategorizeEndpoints` (which endpoints each traffic policy uses on this node, after
//! topology and the terminating fallback) and the per-port decisions of the proxiers'
//! `syncProxyRules` (internal/external endpoints, REJECT or DROP, which chains exist;
//! per mode where iptables and nftables differ). Every decision lands in [`NodeView`] so
//! that back ends only print.
//!
//! Upstream references (kubernetes/kubernetes): `pkg/proxy/topology.go`,
//! `pkg/proxy/serviceport.go`, `pkg/proxy/servicechangetracker.go`,
//! `pkg/proxy/util/nodeport_addresses.go`, `pkg/proxy/iptables/proxier.go` and
//! `pkg/proxy/nftables/proxier.go` (`NewProxier`, `syncProxyRules`),
//! `cmd/kube-proxy/app/server.go` (`primary` node-port addresses, local detectors). The
//! deprecated `topologyKeys` follow seed 000.

use crate::diag::Diagnostic;
use crate::ir::{
    BackendState, ByMode, CiliumBackend, CiliumPort, DetectLocalMode, Endpoint, EndpointView,
    LocalDetector, Module, NoEndpointsVerdict, Node, NodePortAddress, NodePortAddresses, NodeView,
    PortView, Service, ServicePort, ServiceType, TrafficPolicy,
};
use crate::net::{Cidr, IpFamily};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Which node to compile for: a Node object's name, plus `--node-ip` addresses used when
/// there is no Node manifest (or added to its addresses).
#[derive(Clone, Debug, Default)]
pub struct NodeSelection {
    pub name: String,
    pub ips: Vec<IpAddr>,
}

/// kube-proxy's `largeClusterEndpointsThreshold`: above this many endpoints on a family
/// it leaves comments out of the per-endpoint rules.
const LARGE_CLUSTER_ENDPOINTS_THRESHOLD: usize = 1000;

const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
const TOPOLOGY_ANY: &str = "*";

/// Compute the view of `sel` for `family`. Errors (unknown node without `--node-ip`) are
/// returned as a diagnostic.
// The signature is the contract the CLI codes against; it runs once per node and family,
// so the size of the error does not matter.
#[allow(clippy::result_large_err)]
pub fn node_view(
    module: &Module,
    sel: &NodeSelection,
    family: IpFamily,
) -> Result<NodeView, Diagnostic> {
    check_selection(module, sel, family)?;
    let node = module.nodes.iter().find(|n| n.name == sel.name);
    let node_ips = node_ips(node, sel, family);

    let proxy = &module.proxy;
    let this = ThisNode {
        name: &sel.name,
        labels: node.map(|n| &n.labels),
        zone: node.and_then(Node::zone).unwrap_or(""),
    };

    // kube-proxy forces localhostNodePorts off for IPv6, and for IPv4 when
    // nodePortAddresses leaves out 127.0.0.0/8 (`ContainsIPv4Loopback`).
    let npa = node_port_cidrs(&proxy.node_port_addresses, &node_ips, family);
    let localhost_node_ports =
        family == IpFamily::IPv4 && proxy.localhost_node_ports && npa.contains_ipv4_loopback;
    let node_port_addresses = match npa.cidrs {
        None => NodePortAddresses::All,
        Some(cidrs) => NodePortAddresses::Ips(node_port_ips(
            &cidrs,
            &node_ips,
            family,
            localhost_node_ports,
        )),
    };

    // Services in parallel (in module order), then sorted.
    let (this, ips) = (&this, &node_ips[..]);
    let mut ports: Vec<PortView> = module
        .services
        .par_iter()
        .enumerate()
        .filter_map(|(id, svc)| Some((id, svc, proxied_cluster_ip(svc, family)?)))
        .flat_map_iter(|(id, svc, cluster_ip)| {
            svc.ports.iter().map(move |port| {
                port_view(module, id as u32, svc, port, cluster_ip, family, this, ips)
            })
        })
        .collect();
    ports.sort_by(|a, b| {
        (&a.namespace, &a.name, &a.port_name, a.protocol).cmp(&(
            &b.namespace,
            &b.name,
            &b.port_name,
            b.protocol,
        ))
    });

    // Counted like kube-proxy: every endpoint of the family (ready or not) of every
    // service port it tracks.
    let total_endpoints: usize = ports.iter().map(|p| p.endpoints.len()).sum();

    Ok(NodeView {
        random_fully: module.cluster.random_fully,
        nfacct: module.cluster.nfacct,
        nft_layout: module.cluster.nft_layout,
        ebpf_map_sizes: module.cluster.ebpf_map_sizes,
        ebpf_agent: module.cluster.ebpf_agent.clone(),
        node_name: sel.name.clone(),
        family,
        masquerade_mark: 1u32.checked_shl(proxy.masquerade_bit.into()).unwrap_or(0),
        masquerade_all: proxy.masquerade_all,
        local_detector: local_detector(&proxy.detect_local, &proxy.cluster_cidrs, node, family),
        node_port_addresses,
        localhost_node_ports,
        // The anti-martian rule exists to close the hole that route_localnet opens, so
        // kube-proxy writes it exactly when it enables localhost node ports.
        martian_rule: localhost_node_ports,
        large_cluster: total_endpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD,
        drop_invalid: !proxy.conntrack_tcp_be_liberal,
        service_cidrs: module
            .cluster
            .service_cidrs
            .iter()
            .filter(|c| c.family() == family)
            .copied()
            .collect(),
        node_ips,
        ports,
        ipvs_scheduler: proxy.ipvs_scheduler.clone(),
        ipvs: proxy.ipvs.clone(),
        conntrack: proxy.conntrack.clone(),
    })
}

/// The error [`node_view`] would return for `sel` and `family`, without computing the view:
/// a node the module does not know, without an address of the family.
#[allow(clippy::result_large_err)]
pub fn check_selection(
    module: &Module,
    sel: &NodeSelection,
    family: IpFamily,
) -> Result<(), Diagnostic> {
    let node = module.nodes.iter().find(|n| n.name == sel.name);
    if node.is_none() && node_ips(node, sel, family).is_empty() {
        return Err(Diagnostic::error(

            "SVC401",
            format!(
                "no Node named `{}` and no {} node address: add the Node manifest or pass `--node-ip`",
                sel.name,
                family.as_str()
            ),
        )
        .hint(format!(
            "add a Node manifest named `{}` with an {} address in status.addresses, or pass `--node-ip`",
            sel.name,
            family.as_str()
        )));
    }
    Ok(())
}

/// The client side of topology decisions.
struct ThisNode<'a> {
    name: &'a str,
    labels: Option<&'a BTreeMap<String, String>>,
    /// `topology.kubernetes.io/zone`, empty when unlabelled (kube-proxy's default).
    zone: &'a str,
}

/// The Node's addresses of `family` (status order: InternalIP then ExternalIP), then the
/// `--node-ip` ones, without duplicates. The first is what kube-proxy calls the node IP.
fn node_ips(node: Option<&Node>, sel: &NodeSelection, family: IpFamily) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = Vec::new();
    let from_node = node.map(|n| n.addresses.as_slice()).unwrap_or_default();
    for ip in from_node.iter().chain(&sel.ips) {
        if IpFamily::of(ip) == family && !ips.contains(ip) {
            ips.push(*ip);
        }
    }
    ips
}

fn loopback(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::IPv4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpFamily::IPv6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

/// kube-proxy's single node IP for a family: the first address, or loopback when the
/// node has none of that family (`detectNodeIPs`).
fn primary_ip(node_ips: &[IpAddr], family: IpFamily) -> IpAddr {
    node_ips
        .first()
        .copied()
        .unwrap_or_else(|| loopback(family))
}

fn local_detector(
    mode: &DetectLocalMode,
    cluster_cidrs: &[Cidr],
    node: Option<&Node>,
    family: IpFamily,
) -> Option<LocalDetector> {
    // kube-proxy prints the parsed network (`IPNet.String()`), so `10.0.0.1/8` is written
    // `10.0.0.0/8`.
    let first_of_family = |cidrs: &[Cidr]| {
        cidrs
            .iter()
            .find(|c| c.family() == family)
            .map(|c| LocalDetector::Cidr(c.network()))
    };
    match mode {
        DetectLocalMode::None => None,
        DetectLocalMode::ClusterCIDR => first_of_family(cluster_cidrs),
        DetectLocalMode::NodeCIDR => node.and_then(|n| first_of_family(&n.pod_cidrs)),
        DetectLocalMode::BridgeInterface(name) => {
            Some(LocalDetector::BridgeInterface(name.clone()))
        }
        DetectLocalMode::InterfaceNamePrefix(prefix) => {
            Some(LocalDetector::InterfaceNamePrefix(prefix.clone()))
        }
    }
}

/// `NewNodePortAddresses` for one family.
struct NodePortCidrs {
    /// `None` = match all (no CIDR of this family, or a zero CIDR among them).
    cidrs: Option<Vec<Cidr>>,
    contains_ipv4_loopback: bool,
}

fn node_port_cidrs(
    config: &[NodePortAddress],
    node_ips: &[IpAddr],
    family: IpFamily,
) -> NodePortCidrs {
    // `primary` is rewritten at start-up into the node IP of each family as a host
    // CIDR, loopback excluded; a family left without one falls back to match-all.
    let cidrs: Vec<Cidr> = if config.contains(&NodePortAddress::Primary) {
        Some(primary_ip(node_ips, family))
            .filter(|ip| !ip.is_loopback())
            .map(|addr| Cidr {
                addr,
                prefix: family.bits(),
            })
            .into_iter()
            .collect()
    } else {
        config
            .iter()
            .filter_map(|a| match a {
                NodePortAddress::Cidr(c) if c.family() == family => Some(c.network()),
                _ => None,
            })
            .collect()
    };
    if cidrs.is_empty() {
        // Upstream substitutes 0.0.0.0/0 (or ::/0), which contains loopback.
        return NodePortCidrs {
            cidrs: None,
            contains_ipv4_loopback: family == IpFamily::IPv4,
        };
    }
    let mut contains_ipv4_loopback = false;
    let mut kept = Vec::new();
    for c in cidrs {
        if c.family() == IpFamily::IPv4
            && (c.addr.is_loopback() || c.contains(&IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0))))
        {
            contains_ipv4_loopback = true;
        }
        if c.prefix == 0 {
            // A zero CIDR matches everything; upstream ignores the rest of the list.
            return NodePortCidrs {
                cidrs: None,
                contains_ipv4_loopback,
            };
        }
        kept.push(c);
    }
    NodePortCidrs {
        cidrs: Some(kept),
        contains_ipv4_loopback,
    }
}

/// `GetNodeIPs`: the node's interface addresses inside some CIDR. We know the node IPs
/// plus the loopback address every node has on `lo`. Loopback is then dropped where
/// kube-proxy skips it (IPv6, or localhostNodePorts off).
fn node_port_ips(
    cidrs: &[Cidr],
    node_ips: &[IpAddr],
    family: IpFamily,
    localhost_node_ports: bool,
) -> Vec<IpAddr> {
    let lo = loopback(family);
    let mut ips = Vec::new();
    for ip in node_ips.iter().chain(std::iter::once(&lo)) {
        if ips.contains(ip) || !cidrs.iter().any(|c| c.contains(ip)) {
            continue;
        }
        if ip.is_loopback() && (family == IpFamily::IPv6 || !localhost_node_ports) {
            continue;
        }
        ips.push(*ip);
    }
    ips
}

/// The cluster IP the proxier of `family` uses, `Some(None)` for a port kept without one
/// (`--no-allocate`), `None` when the service is not proxied on this family.
fn proxied_cluster_ip(svc: &Service, family: IpFamily) -> Option<Option<IpAddr>> {
    // kube-proxy watches Services without `service.kubernetes.io/service-proxy-name` and
    // `service.kubernetes.io/headless` only.
    if svc.headless
        || svc.kind == ServiceType::ExternalName
        || svc.proxy_name.is_some()
        || svc.headless_label
    {
        return None;
    }
    if let Some(ip) = svc.cluster_ips.iter().find(|ip| IpFamily::of(ip) == family) {
        return Some(Some(*ip));
    }
    let unallocated_single_family = svc.cluster_ips.is_empty() && svc.ip_families == [family];
    unallocated_single_family.then_some(None)
}

#[allow(clippy::too_many_arguments)]
fn port_view(
    module: &Module,
    service: u32,
    svc: &Service,
    port: &ServicePort,
    cluster_ip: Option<IpAddr>,
    family: IpFamily,
    this: &ThisNode,
    node_ips: &[IpAddr],
) -> PortView {
    let spn = if port.name.is_empty() {
        format!("{}/{}", svc.namespace, svc.name)
    } else {
        format!("{}/{}:{}", svc.namespace, svc.name, port.name)
    };
    let of_family = |ip: &&IpAddr| IpFamily::of(ip) == family;
    let external_ips: Vec<IpAddr> = svc.external_ips.iter().filter(of_family).copied().collect();
    let load_balancer_ips: Vec<IpAddr> = svc
        .load_balancer_ingress
        .iter()
        .filter(|ing| !ing.proxy_mode)
        .map(|ing| ing.ip)
        .filter(|ip| IpFamily::of(ip) == family)
        .collect();
    // Printed as parsed networks, like every CIDR kube-proxy writes.
    let mut source_ranges: Vec<Cidr> = svc
        .load_balancer_source_ranges
        .iter()
        .filter(|c| c.family() == family)
        .map(Cidr::network)
        .collect();
    // A zero-prefix range allows everyone: the same as no ranges (newBaseServiceInfo).
    if source_ranges.iter().any(|c| c.prefix == 0) {
        source_ranges.clear();
    }
    let node_ip = primary_ip(node_ips, family);
    let source_ranges_include_node = source_ranges.iter().any(|c| c.contains(&node_ip));

    // Per port and family, as the proxier sees it: a LoadBalancer without ingress IPs
    // or node ports is not reachable from outside on this family.
    let externally_accessible =
        port.node_port.is_some() || !load_balancer_ips.is_empty() || !external_ips.is_empty();
    let internal_local = svc.internal_traffic_policy == TrafficPolicy::Local;
    let external_local = svc.external_traffic_policy == TrafficPolicy::Local
        && svc.externally_accessible()
        && externally_accessible;
    // `NeedsHealthCheck`: LoadBalancer with ETP=Local, whatever its ports.
    let health_check_node_port = if svc.kind == ServiceType::LoadBalancer
        && svc.external_traffic_policy == TrafficPolicy::Local
    {
        svc.health_check_node_port
    } else {
        None
    };

    let endpoints: Vec<&Endpoint> = port
        .endpoints
        .iter()
        .filter(|e| IpFamily::of(&e.ip) == family)
        .map(|e| own_copy(e, this.name))
        .collect();
    let views: Vec<EndpointView> = endpoints
        .iter()
        .map(|e| EndpointView {
            ip: e.ip,
            port: e.port,
            addr: e.addr.clone(),
            is_local: !this.name.is_empty() && e.node_name.as_deref() == Some(this.name),
            ready: e.ready,
            serving: e.serving,
            terminating: e.terminating,
        })
        .collect();

    // `UsesClusterEndpoints` / `UsesLocalEndpoints`. Cluster endpoints are needed by any
    // externally accessible port, even with ETP=Local: the EXT chain short-circuits
    // pod and host traffic to the cluster chain.
    let uses_cluster = !internal_local || externally_accessible;
    let uses_local = internal_local || external_local;
    let topology_keys = if external_local {
        // Seed 000: topologyKeys and ETP=Local are mutually exclusive; kube-proxy did not
        // apply topology to such services.
        &[][..]
    } else {
        &svc.topology_keys[..]
    };
    let cat = categorize(
        module,
        &endpoints,
        &views,
        topology_keys,
        uses_cluster,
        uses_local,
        this,
    );

    let cilium = cilium_port(
        svc,
        &endpoints,
        family,
        this,
        module.cluster.ebpf_service_topology,
    );

    let mut view = PortView {
        service,
        namespace: svc.namespace.clone(),
        name: svc.name.clone(),
        port_name: port.name.clone(),
        protocol: port.protocol,
        spn,
        cluster_ip,
        port: port.port,
        node_port: port.node_port,
        external_ips,
        load_balancer_ips,
        source_ranges,
        source_ranges_include_node,
        health_check_node_port,
        affinity_timeout: svc.session_affinity_timeout,
        externally_accessible,
        internal_local,
        external_local,
        has_endpoints: cat.has_endpoints,
        // Written by `record_decisions` below, from the fields above.
        has_internal_endpoints: false,
        has_external_endpoints: false,
        no_endpoints_verdict: NoEndpointsVerdict::Reject,
        uses_external_chain: false,
        uses_firewall_chain: ByMode {
            iptables: false,
            nftables: false,
        },
        endpoints: views,
        cluster_endpoints: cat.cluster,
        local_endpoints: cat.local,
        topology: cat.topology,
        cilium,
    };
    record_decisions(&mut view);
    view
}

const SAME_NODE: &str = "PreferSameNode";
const SAME_ZONE: &str = "PreferSameZone";

/// The service's `TrafficDistribution` as Cilium's agent reads it
/// (`reflectors/conversions.go`, `convertService`; `pkg/loadbalancer/service.go`): none
/// with `internalTrafficPolicy: Local`; `PreferSameNode`, or `PreferSameZone` for
/// `PreferSameZone` and its alias `PreferClose`; else `PreferSameZone` when the
/// topology annotation is set to anything but `""`, `disabled` or `Disabled`
/// (`getAnnotationTopologyAwareHints`).
fn cilium_distribution(svc: &Service) -> Option<&'static str> {
    if svc.internal_traffic_policy == TrafficPolicy::Local {
        return None;
    }
    match svc.traffic_distribution.as_deref() {
        Some("PreferSameNode") => return Some(SAME_NODE),
        Some("PreferSameZone" | "PreferClose") => return Some(SAME_ZONE),
        _ => {}
    }
    match svc.topology_mode.as_deref() {
        None | Some("" | "disabled" | "Disabled") => None,
        Some(_) => Some(SAME_ZONE),
    }
}

/// The load-balancer classes whose addresses Cilium's LB-IPAM (or its BGP and L2
/// announcers) own (`pkg/k8s/apis/cilium.io/v2alpha1`: `BGPLoadBalancerClass`,
/// `L2AnnounceLoadBalancerClass`).
const CILIUM_LB_CLASSES: [&str; 2] = ["io.cilium/bgp-control-plane", "io.cilium/l2-announcer"];

/// `service.cilium.io/src-ranges-policy` (`pkg/annotation/k8s.go`).
const SRC_RANGES_POLICY: &str = "service.cilium.io/src-ranges-policy";

/// `service.cilium.io/lb-algorithm` (`pkg/annotation/k8s.go`,
/// `ServiceLoadBalancingAlgorithm`).
const LB_ALGORITHM: &str = "service.cilium.io/lb-algorithm";

/// `loadbalancer.DefaultBackendWeight`: every Kubernetes endpoint's Maglev weight.
const DEFAULT_BACKEND_WEIGHT: u16 = 100;

/// [`CiliumPort`] of one port: `endpoints` are this family's, each the copy this node
/// serves (as for kube-proxy). `topology`: Cilium's `--enable-service-topology`.
fn cilium_port(
    svc: &Service,
    endpoints: &[&Endpoint],
    family: IpFamily,
    this: &ThisNode,
    topology: bool,
) -> CiliumPort {
    struct Found<'e> {
        b: CiliumBackend,
        /// Selected under a Local traffic policy.
        local: bool,
        /// `BackendParams.NodeName` is this node's.
        on_node: bool,
        /// `BackendParams.Zone.ForZones`.
        zones: &'e [String],
    }
    let mut backends: Vec<Found> = Vec::new();
    for e in endpoints {
        let state = BackendState::of(e.ready, e.serving, e.terminating);
        let on_node = !this.name.is_empty() && e.node_name.as_deref() == Some(this.name);
        // `DefaultSelectBackends`: a backend without a node name is taken as local.
        let local = on_node || matches!(e.node_name.as_deref(), None | Some(""));
        for ip in std::iter::once(&e.ip).chain(&e.other_addresses) {
            if IpFamily::of(ip) == family {
                let b = CiliumBackend {
                    ip: *ip,
                    port: e.port,
                    state,
                    weight: DEFAULT_BACKEND_WEIGHT,
                };
                backends.push(Found {
                    b,
                    local,
                    on_node,
                    zones: &e.hint_zones,
                });
            }
        }
    }
    // By (address, port), the lowest state first, then one per address.
    backends.sort_by_key(|f| (f.b.ip, f.b.port, f.b.state));
    backends.dedup_by(|b, a| (a.b.ip, a.b.port) == (b.b.ip, b.b.port));

    // Cilium's topology rules narrow every frontend's selection alike.
    let distribution = if topology {
        cilium_distribution(svc)
    } else {
        None
    };
    let active = |f: &&Found| f.b.state == BackendState::Active;
    /// Which backends the topology rules keep.
    enum Keep<'z> {
        All,
        OnNode,
        Zone(&'z str),
    }
    let (keep, note) = match distribution {
        None => (Keep::All, String::new()),
        // PreferSameNode: this node's backends when an active one is here.
        Some(SAME_NODE) => {
            if backends.iter().filter(active).any(|f| f.on_node) {
                (Keep::OnNode, format!("node {}", this.name))
            } else {
                let why = format!("no active backend on node {}: every backend", this.name);
                (Keep::All, why)
            }
        }
        // PreferSameZone: the backends hinted for this node's zone, when the node has a
        // zone, every active backend has zone hints and one is hinted for the zone
        // (the safeguards of topology-aware routing; terminating backends, which the
        // EndpointSlice controller leaves without hints, do not count).
        Some(_) => {
            let zone = this.zone;
            let candidates: Vec<&Found> = backends.iter().filter(active).collect();
            if zone.is_empty() {
                (
                    Keep::All,
                    format!("node has no {LABEL_ZONE} label: every backend"),
                )
            } else if candidates.iter().any(|f| f.zones.is_empty()) {
                let why = "an active backend has no zone hint: every backend".to_string();
                (Keep::All, why)
            } else if candidates.iter().any(|f| f.zones.iter().any(|z| z == zone)) {
                (Keep::Zone(zone), format!("zone {zone}"))
            } else {
                let why = format!("no active backend hinted for zone {zone}: every backend");
                (Keep::All, why)
            }
        }
    };
    let kept = |f: &Found| match keep {
        Keep::All => true,
        Keep::OnNode => f.on_node,
        Keep::Zone(z) => f.zones.iter().any(|h| h == z),
    };
    let cluster = (0..backends.len() as u32)
        .filter(|&i| kept(&backends[i as usize]))
        .collect();
    let local = (0..backends.len() as u32)
        .filter(|&i| backends[i as usize].local && kept(&backends[i as usize]))
        .collect();
    let topology = distribution.map(|d| crate::ir::CiliumTopology {
        distribution: d,
        note,
    });
    let backends: Vec<CiliumBackend> = backends.into_iter().map(|f| f.b).collect();
    let source_ranges = svc
        .load_balancer_source_ranges
        .iter()
        .filter(|c| c.family() == family)
        .map(Cidr::network)
        .collect();
    let policy = svc.cilium_annotations.get(SRC_RANGES_POLICY);
    CiliumPort {
        backends,
        cluster,
        local,
        topology,
        source_ranges,
        // `GetSourceRangesPolicy`: `deny` in any case; anything else allows.
        source_ranges_deny: policy.is_some_and(|p| p.eq_ignore_ascii_case("deny")),
        lb_ipam_class: match &svc.load_balancer_class {
            None => true,
            Some(c) => CILIUM_LB_CLASSES.contains(&c.as_str()),
        },
        // `GetLBAlgorithmAnnotation` / `ToSVCLoadBalancingAlgorithm`: case matters.
        lb_algorithm: svc
            .cilium_annotations
            .get(LB_ALGORITHM)
            .and_then(|a| crate::ir::LbAlgorithm::parse(a)),
    }
}

/// The per-port decisions of both proxiers' `syncProxyRules`, made from what the view
/// already says (policies, external destinations, endpoint sets): `has_internal_endpoints`,
/// `has_external_endpoints`, `no_endpoints_verdict`, `uses_external_chain`,
/// `uses_firewall_chain`.
fn record_decisions(p: &mut PortView) {
    // Internal/external endpoints exist when the policy's set does: with a Cluster policy
    // the set is empty exactly when no endpoint is usable anywhere (the terminating
    // fallback and hints never empty it), so `has_endpoints` alone is kube-proxy's answer.
    let local_here = !p.local_endpoints.is_empty();
    p.has_internal_endpoints = p.has_endpoints && (!p.internal_local || local_here);
    // Only a port with external destinations has external endpoints (upstream computes
    // the value for every port but reads it only for external destinations).
    p.has_external_endpoints =
        p.externally_accessible && p.has_endpoints && (!p.external_local || local_here);
    let policy_set = |local: bool| {
        if local {
            &p.local_endpoints
        } else {
            &p.cluster_endpoints
        }
    };
    debug_assert!(!p.has_internal_endpoints || !policy_set(p.internal_local).is_empty());
    debug_assert!(!p.has_external_endpoints || !policy_set(p.external_local).is_empty());
    // REJECT when nothing serves the service anywhere, DROP when only a Local policy
    // leaves this node without endpoints.
    p.no_endpoints_verdict = if p.has_endpoints {
        NoEndpointsVerdict::Drop
    } else {
        NoEndpointsVerdict::Reject
    };
    // Even without external endpoints: the chain's short-circuit rules for pod and host
    // traffic still apply ...
    p.uses_external_chain = p.has_endpoints && p.externally_accessible;
    // ... and go to the cluster policy chain, so that chain exists.
    debug_assert!(!p.uses_external_chain || !p.cluster_endpoints.is_empty());
    let source_ranges_apply = !p.load_balancer_ips.is_empty() && !p.source_ranges.is_empty();
    p.uses_firewall_chain = ByMode {
        // The FW chain accepts into the external chain, which exists only with endpoints.
        iptables: p.has_endpoints && source_ranges_apply,
        // The firewall verdict map drops other sources before NAT, endpoints or not.
        nftables: source_ranges_apply,
    };
}

struct Categorized {
    cluster: Vec<u32>,
    local: Vec<u32>,
    has_endpoints: bool,
    topology: Option<String>,
}

/// kube-proxy's `CategorizeEndpoints`, with the deprecated `topologyKeys` (seed 000) in
/// place of hints when the service has them. `endpoints` and `views` are parallel.
fn categorize(
    module: &Module,
    endpoints: &[&Endpoint],
    views: &[EndpointView],
    topology_keys: &[String],
    uses_cluster: bool,
    uses_local: bool,
    this: &ThisNode,
) -> Categorized {
    let usable = |v: &EndpointView| v.ready || (v.serving && v.terminating);
    let serving_terminating = |v: &EndpointView| v.serving && v.terminating;
    let select = |pred: &dyn Fn(&EndpointView) -> bool| -> Vec<u32> {
        (0..views.len() as u32)
            .filter(|&i| pred(&views[i as usize]))
            .collect()
    };

    let mut cluster = Vec::new();
    let mut has_endpoints = false;
    let mut topology = None;
    let mut topology_rejects = false;
    if uses_cluster {
        if !topology_keys.is_empty() {
            // The keys are a hard filter: applied to the ready endpoints, then to the
            // serving-terminating fallback; no match leaves the node without endpoints.
            let by_keys = |tier: Vec<u32>| {
                filter_by_topology_keys(module, topology_keys, endpoints, tier, this)
            };
            let (mut set, mut key) = by_keys(select(&|v| v.ready));
            if set.is_empty() {
                (set, key) = by_keys(select(&serving_terminating));
            }
            topology = Some(match key {
                Some(k) => format!("topologyKeys: {k}"),
                None => "topologyKeys: no match, rejected".to_string(),
            });
            topology_rejects = set.is_empty();
            cluster = set;
        } else {
            let (mode, why) = topology_mode_from_hints(endpoints, views, this);
            topology = why;
            cluster = select(&|v| v.ready);
            cluster.retain(|&i| mode.admits(endpoints[i as usize], this));
            if cluster.is_empty() {
                // Hints are never the reason for an empty set here (they are only used
                // when this node's zone or node has a ready endpoint), so no ready
                // endpoint exists anywhere: fall back to the terminating ones.
                cluster = select(&serving_terminating);
            }
        }
        has_endpoints = !cluster.is_empty();
    }

    let mut local = Vec::new();
    if uses_local {
        has_endpoints |= views.iter().any(usable);
        local = select(&|v| v.is_local && v.ready);
        if local.is_empty() {
            local = select(&|v| v.is_local && serving_terminating(v));
        }
    }

    if topology_rejects {
        // Seed 000: when no key matches, the service has no endpoints for this node.
        has_endpoints = false;
        local.clear();
    }
    Categorized {
        cluster,
        local,
        has_endpoints,
        topology,
    }
}

/// Seed 000: for each key in order, the endpoints whose node has this node's value of
/// that label; the first key that yields any wins. `*` takes every endpoint; a key this
/// node has no label for is skipped. Returns the endpoints and the winning key.
fn filter_by_topology_keys<'k>(
    module: &Module,
    keys: &'k [String],
    endpoints: &[&Endpoint],
    candidates: Vec<u32>,
    this: &ThisNode,
) -> (Vec<u32>, Option<&'k str>) {
    for key in keys {
        if key == TOPOLOGY_ANY {
            return (candidates, Some(key));
        }
        let Some(want) = this_node_value(key, this) else {
            continue;
        };
        let matched: Vec<u32> = candidates
            .iter()
            .copied()
            .filter(|&i| endpoint_node_value(module, endpoints[i as usize], key) == Some(want))
            .collect();
        if !matched.is_empty() {
            return (matched, Some(key));
        }
    }
    (Vec::new(), None)
}

fn this_node_value<'a>(key: &str, this: &ThisNode<'a>) -> Option<&'a str> {
    if key == LABEL_HOSTNAME {
        // "Same node" even when the Node object (and so its labels) is missing.
        return Some(this.name);
    }
    this.labels?.get(key).map(String::as_str)
}

/// The label value of the endpoint's node. Without that Node object, the EndpointSlice
/// still says which node and zone the endpoint is in.
fn endpoint_node_value<'a>(module: &'a Module, ep: &'a Endpoint, key: &str) -> Option<&'a str> {
    let node_name = ep.node_name.as_deref();
    if key == LABEL_HOSTNAME {
        return node_name;
    }
    let node = node_name.and_then(|name| {
        module
            .nodes
            .binary_search_by(|n| n.name.as_str().cmp(name))
            .ok()
            .map(|i| &module.nodes[i])
    });
    match node {
        Some(n) => n.labels.get(key).map(String::as_str),
        None if key == LABEL_ZONE => ep.zone.as_deref(),
        None => None,
    }
}

/// How hints narrow the cluster endpoints (`topologyModeFromHints`).
enum HintMode {
    None,
    SameNode,
    SameZone,
}

impl HintMode {
    fn admits(&self, ep: &Endpoint, this: &ThisNode) -> bool {
        match self {
            HintMode::None => true,
            HintMode::SameNode => ep.hint_nodes.iter().any(|n| n == this.name),
            HintMode::SameZone => ep.hint_zones.iter().any(|z| z == this.zone),
        }
    }
}

/// kube-proxy reads the hints the EndpointSlice controller wrote (for
/// `trafficDistribution` PreferClose / PreferSameZone / PreferSameNode, or the
/// topology-mode annotation); the Service's own field plays no part here. Hints count
/// only when every ready endpoint carries one and some ready endpoint is hinted for
/// this node (node hints, PreferSameTrafficDistribution being on) or this node's zone.
/// Returns the mode and a note for humans.
fn topology_mode_from_hints(
    endpoints: &[&Endpoint],
    views: &[EndpointView],
    this: &ThisNode,
) -> (HintMode, Option<String>) {
    let ready: Vec<&Endpoint> = endpoints
        .iter()
        .zip(views)
        .filter(|(_, v)| v.ready)
        .map(|(e, _)| *e)
        .collect();
    let any_hints = ready
        .iter()
        .any(|e| !e.hint_nodes.is_empty() || !e.hint_zones.is_empty());
    if !any_hints {
        return (HintMode::None, None);
    }
    let ignored = |why: String| (HintMode::None, Some(format!("hints ignored: {why}")));

    let all_node_hints = ready.iter().all(|e| !e.hint_nodes.is_empty());
    if all_node_hints && ready.iter().any(|e| HintMode::SameNode.admits(e, this)) {
        return (
            HintMode::SameNode,
            Some(format!("hints: node {}", this.name)),
        );
    }
    let all_zone_hints = ready.iter().all(|e| !e.hint_zones.is_empty());
    if !all_zone_hints {
        return ignored("a ready endpoint has no zone hint".to_string());
    }
    if ready.iter().any(|e| HintMode::SameZone.admits(e, this)) {
        return (
            HintMode::SameZone,
            Some(format!("hints: zone {}", this.zone)),
        );
    }
    if this.zone.is_empty() {
        ignored(format!("node has no {LABEL_ZONE} label"))
    } else {
        ignored(format!("none for zone {}", this.zone))
    }
}

/// The copy of a duplicated endpoint (two slices list one `ip:port`) this node serves:
/// its own copy when one is on this node, else the one resolution kept. kube-proxy's
/// endpoint cache lets a local copy replace another (`!exists || isLocal`), so with
/// `externalTrafficPolicy: Local` both nodes of a moved pod's two copies keep serving it.
fn own_copy<'a>(e: &'a Endpoint, node: &str) -> &'a Endpoint {
    let on_node = |c: &Endpoint| !node.is_empty() && c.node_name.as_deref() == Some(node);
    if on_node(e) {
        return e;
    }
    e.copies.iter().find(|c| on_node(c)).unwrap_or(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{LoadBalancerIngress, Protocol, TrafficPolicy};
    use crate::testing::{self, cidr, ip};

    /// The shared fixtures with this suite's ranges: services 10.96.0.0/12, pods
    /// 10.244.0.0/16 (and their IPv6 twins).
    fn module(services: Vec<Service>, nodes: Vec<Node>) -> Module {
        let mut m = testing::module(services, nodes);
        m.cluster.service_cidrs = vec![cidr("10.96.0.0/12"), cidr("fd00:96::/112")];
        m.proxy.cluster_cidrs = vec![cidr("10.244.0.0/16"), cidr("fd00:244::/56")];
        m
    }

    fn node(name: &str, addrs: &[&str], zone: Option<&str>) -> Node {
        let mut n = testing::node(name, addrs, zone);
        n.pod_cidrs = vec![cidr("10.244.1.0/24"), cidr("fd00:244:0:1::/64")];
        n
    }

    /// Three nodes: n1 (this node) and n2 in zone a, n3 in zone b.
    fn nodes() -> Vec<Node> {
        vec![
            node("n1", &["192.168.0.1", "fd00::1"], Some("a")),
            node("n2", &["192.168.0.2"], Some("a")),
            node("n3", &["192.168.0.3"], Some("b")),
        ]
    }

    /// A ready endpoint on port 8080 of `node` (none when empty).
    fn ep(addr: &str, node: &str) -> Endpoint {
        testing::endpoint(&format!("{addr}@{node}"), 8080)
    }

    fn terminating(mut e: Endpoint, serving: bool) -> Endpoint {
        e.ready = false;
        e.serving = serving;
        e.terminating = true;
        e
    }

    /// `ns/name` at 10.96.0.10 with one port `http` 80 → 8080 (node port 30080 unless
    /// ClusterIP).
    fn svc(name: &str, kind: ServiceType, endpoints: Vec<Endpoint>) -> Service {
        let mut port = testing::port("http", 80, 8080, endpoints);
        port.node_port = (kind != ServiceType::ClusterIP).then_some(30080);
        testing::service("ns", name, kind, "10.96.0.10", vec![port])
    }

    fn sel(name: &str) -> NodeSelection {
        NodeSelection {
            name: name.into(),
            ips: vec![],
        }
    }

    fn view(m: &Module) -> NodeView {
        testing::view(m, "n1", IpFamily::IPv4)
    }

    /// The addresses of the endpoints at `idx`.
    fn addrs(p: &PortView, idx: &[u32]) -> Vec<String> {
        idx.iter()
            .map(|&i| p.endpoints[i as usize].ip.to_string())
            .collect()
    }

    /// Cilium's reading of the endpoints: every address a backend, every condition a
    /// state (none dropped, no fallback), the Local selection counting an endpoint
    /// without a node as local, and the per-service settings.
    #[test]
    fn cilium_backends_states_and_selection() {
        let mut multi = ep("10.244.1.2", "n1");
        multi.other_addresses = vec![ip("10.244.1.9"), ip("fd00::2"), ip("10.244.1.10")];
        let eps = vec![
            multi,
            terminating(ep("10.244.2.2", "n2"), true),
            terminating(ep("10.244.2.3", "n2"), false),
            testing::endpoint("10.244.2.4@n2#not-ready", 8080),
            // No node: local for Cilium, not for kube-proxy.
            ep("10.244.3.3", ""),
        ];
        let mut s = svc("web", ServiceType::LoadBalancer, eps);
        s.load_balancer_source_ranges = vec![cidr("0.0.0.0/0"), cidr("fd00::/8")];
        s.cilium_annotations
            .insert(SRC_RANGES_POLICY.into(), "Deny".into());
        let v = view(&module(vec![s.clone()], nodes()));
        let c = &v.ports[0].cilium;
        let got: Vec<(String, BackendState)> = c
            .backends
            .iter()
            .map(|b| (format!("{}:{}", b.ip, b.port), b.state))
            .collect();
        use BackendState::*;
        assert_eq!(
            got,
            [
                ("10.244.1.2:8080", Active),
                ("10.244.1.9:8080", Active),
                ("10.244.1.10:8080", Active),
                ("10.244.2.2:8080", Terminating),
                ("10.244.2.3:8080", TerminatingNotServing),
                ("10.244.2.4:8080", Maintenance),
                ("10.244.3.3:8080", Active),
            ]
            .map(|(a, s)| (a.to_string(), s))
        );
        assert_eq!(c.cluster, (0..7).collect::<Vec<u32>>());
        assert_eq!(c.local, [0, 1, 2, 6]);
        // kube-proxy: only the ready ones, the first address, a node-less one not local.
        assert_eq!(
            addrs(&v.ports[0], &v.ports[0].cluster_endpoints),
            ["10.244.1.2", "10.244.3.3"]
        );
        assert_eq!(c.source_ranges, [cidr("0.0.0.0/0")]);
        assert!(v.ports[0].source_ranges.is_empty(), "kube-proxy: allow all");
        assert!(c.source_ranges_deny);
        assert!(c.lb_ipam_class);

        s.cilium_annotations
            .insert(SRC_RANGES_POLICY.into(), "allow".into());
        s.load_balancer_class = Some("example.com/other".into());
        let v = view(&module(vec![s.clone()], nodes()));
        assert!(!v.ports[0].cilium.source_ranges_deny);
        assert!(!v.ports[0].cilium.lb_ipam_class);
        s.load_balancer_class = Some("io.cilium/l2-announcer".into());
        let v = view(&module(vec![s], nodes()));
        assert!(v.ports[0].cilium.lb_ipam_class);
    }

    /// Two endpoints naming one address: one backend, the lower state.
    #[test]
    fn cilium_backend_named_twice_keeps_the_active_one() {
        let mut a = terminating(ep("10.244.2.2", "n2"), true);
        a.other_addresses = vec![ip("10.244.2.5")];
        let eps = vec![a, ep("10.244.2.5", "n2")];
        let v = view(&module(
            vec![svc("web", ServiceType::ClusterIP, eps)],
            nodes(),
        ));
        let c = &v.ports[0].cilium;
        assert_eq!(c.backends.len(), 2);
        assert_eq!(c.backends[1].ip, ip("10.244.2.5"));
        assert_eq!(c.backends[1].state, BackendState::Active);
    }

    #[test]
    fn unknown_node_needs_an_address() {
        let m = module(vec![], nodes());
        let err = node_view(&m, &sel("ghost"), IpFamily::IPv4).unwrap_err();
        assert_eq!(err.code, "SVC401");
        assert!(err
            .message
            .contains("add the Node manifest or pass `--node-ip`"));

        let with_ip = NodeSelection {
            name: "ghost".into(),
            ips: vec![ip("10.1.1.1"), ip("fd00::9")],
        };
        let v = node_view(&m, &with_ip, IpFamily::IPv4).unwrap();
        assert_eq!(v.node_ips, vec![ip("10.1.1.1")]);
        // Without a Node object there are no podCIDRs, but the cluster CIDR still works.
        assert_eq!(
            v.local_detector,
            Some(LocalDetector::Cidr(cidr("10.244.0.0/16")))
        );
        // A known node without an address of the family is fine: it just has none.
        let v6 = node_view(&m, &sel("n2"), IpFamily::IPv6).unwrap();
        assert!(v6.node_ips.is_empty());
        // --node-ip of the other family only does not identify the node.
        let v4_only = NodeSelection {
            name: "ghost".into(),
            ips: vec![ip("10.1.1.1")],
        };
        assert!(node_view(&m, &v4_only, IpFamily::IPv6).is_err());
    }

    #[test]
    fn node_identity_and_masquerade() {
        let mut m = module(vec![], nodes());
        m.proxy.masquerade_bit = 15;
        m.proxy.conntrack_tcp_be_liberal = true;
        m.proxy.cluster_cidrs = vec![cidr("10.244.3.7/16")];
        let extra = NodeSelection {
            name: "n1".into(),
            ips: vec![ip("192.168.9.9"), ip("192.168.0.1")],
        };
        let v = node_view(&m, &extra, IpFamily::IPv4).unwrap();
        assert_eq!(v.node_ips, vec![ip("192.168.0.1"), ip("192.168.9.9")]);
        assert_eq!(v.masquerade_mark, 0x8000);
        assert!(!v.drop_invalid);
        // The detector is written as the parsed network.
        assert_eq!(
            v.local_detector,
            Some(LocalDetector::Cidr(cidr("10.244.0.0/16")))
        );
        assert_eq!(v.service_cidrs, vec![cidr("10.96.0.0/12")]);
        // No IPv6 cluster CIDR: no detector on IPv6.
        let v6 = node_view(&m, &sel("n1"), IpFamily::IPv6).unwrap();
        assert_eq!(v6.local_detector, None);
        assert_eq!(v6.service_cidrs, vec![cidr("fd00:96::/112")]);

        m.proxy.detect_local = DetectLocalMode::NodeCIDR;
        assert_eq!(
            view(&m).local_detector,
            Some(LocalDetector::Cidr(cidr("10.244.1.0/24")))
        );
        let v6 = node_view(&m, &sel("n1"), IpFamily::IPv6).unwrap();
        assert_eq!(
            v6.local_detector,
            Some(LocalDetector::Cidr(cidr("fd00:244:0:1::/64")))
        );
        m.proxy.detect_local = DetectLocalMode::BridgeInterface("cbr0".into());
        assert_eq!(
            view(&m).local_detector,
            Some(LocalDetector::BridgeInterface("cbr0".into()))
        );
        m.proxy.detect_local = DetectLocalMode::InterfaceNamePrefix("veth".into());
        assert_eq!(
            view(&m).local_detector,
            Some(LocalDetector::InterfaceNamePrefix("veth".into()))
        );
        m.proxy.detect_local = DetectLocalMode::None;
        assert_eq!(view(&m).local_detector, None);
    }

    #[test]
    fn node_port_addresses_and_localhost() {
        let mut m = module(vec![], nodes());
        let v = view(&m);
        assert_eq!(v.node_port_addresses, NodePortAddresses::All);
        assert!(v.localhost_node_ports && v.martian_rule);
        let v6 = node_view(&m, &sel("n1"), IpFamily::IPv6).unwrap();
        assert_eq!(v6.node_port_addresses, NodePortAddresses::All);
        assert!(!v6.localhost_node_ports && !v6.martian_rule);

        // A CIDR without loopback turns localhost node ports off; IPv6 has no CIDR of
        // its own, so it matches all.
        m.proxy.node_port_addresses = vec![NodePortAddress::Cidr(cidr("192.168.0.0/24"))];
        let v = view(&m);
        assert_eq!(
            v.node_port_addresses,
            NodePortAddresses::Ips(vec![ip("192.168.0.1")])
        );
        assert!(!v.localhost_node_ports && !v.martian_rule);
        let v6 = node_view(&m, &sel("n1"), IpFamily::IPv6).unwrap();
        assert_eq!(v6.node_port_addresses, NodePortAddresses::All);

        // Loopback is on `lo` of every node.
        m.proxy.node_port_addresses = vec![
            NodePortAddress::Cidr(cidr("127.0.0.1/32")),
            NodePortAddress::Cidr(cidr("192.168.0.0/16")),
            NodePortAddress::Cidr(cidr("::1/128")),
            NodePortAddress::Cidr(cidr("fd00::/64")),
        ];
        let v = view(&m);
        assert_eq!(
            v.node_port_addresses,
            NodePortAddresses::Ips(vec![ip("192.168.0.1"), ip("127.0.0.1")])
        );
        assert!(v.localhost_node_ports);
        // IPv6 never serves node ports on loopback.
        let v6 = node_view(&m, &sel("n1"), IpFamily::IPv6).unwrap();
        assert_eq!(
            v6.node_port_addresses,
            NodePortAddresses::Ips(vec![ip("fd00::1")])
        );
        // localhostNodePorts=false drops loopback.
        m.proxy.localhost_node_ports = false;
        assert_eq!(
            view(&m).node_port_addresses,
            NodePortAddresses::Ips(vec![ip("192.168.0.1")])
        );

        // A zero CIDR wins over the rest.
        m.proxy.localhost_node_ports = true;
        m.proxy.node_port_addresses = vec![
            NodePortAddress::Cidr(cidr("10.0.0.0/8")),
            NodePortAddress::Cidr(cidr("0.0.0.0/0")),
        ];
        let v = view(&m);
        assert_eq!(v.node_port_addresses, NodePortAddresses::All);
        assert!(v.localhost_node_ports);

        // `primary`: the node IP as a host CIDR (no loopback, so no localhost ports); a
        // family without a node IP falls back to match-all.
        m.proxy.node_port_addresses = vec![NodePortAddress::Primary];
        let v = view(&m);
        assert_eq!(
            v.node_port_addresses,
            NodePortAddresses::Ips(vec![ip("192.168.0.1")])
        );
        assert!(!v.localhost_node_ports && !v.martian_rule);
        let v6 = node_view(&m, &sel("n2"), IpFamily::IPv6).unwrap();
        assert_eq!(v6.node_port_addresses, NodePortAddresses::All);
    }

    #[test]
    fn which_services_and_ports() {
        let mut headless = svc("headless", ServiceType::ClusterIP, vec![]);
        headless.headless = true;
        headless.cluster_ips.clear();
        let mut ext_name = svc("extname", ServiceType::ExternalName, vec![]);
        ext_name.cluster_ips.clear();
        let mut multi = svc("multi", ServiceType::ClusterIP, vec![]);
        let mut p = multi.ports[0].clone();
        p.name = "dns".into();
        p.protocol = Protocol::UDP;
        let mut q = p.clone();
        q.protocol = Protocol::TCP;
        let mut unnamed = svc("unnamed", ServiceType::ClusterIP, vec![]);
        unnamed.ports[0].name.clear();
        multi.ports = vec![multi.ports[0].clone(), p, q];
        let mut unallocated = svc("unallocated", ServiceType::ClusterIP, vec![]);
        unallocated.cluster_ips.clear();
        let mut unallocated_dual = unallocated.clone();
        unallocated_dual.name = "unallocated-dual".into();
        unallocated_dual.ip_families = vec![IpFamily::IPv4, IpFamily::IPv6];
        let m = module(
            vec![
                ext_name,
                headless,
                multi,
                unallocated,
                unallocated_dual,
                unnamed,
            ],
            nodes(),
        );
        let v = view(&m);
        let got: Vec<(&str, Option<IpAddr>)> = v
            .ports
            .iter()
            .map(|p| (p.spn.as_str(), p.cluster_ip))
            .collect();
        assert_eq!(
            got,
            vec![
                ("ns/multi:dns", Some(ip("10.96.0.10"))),
                ("ns/multi:dns", Some(ip("10.96.0.10"))),
                ("ns/multi:http", Some(ip("10.96.0.10"))),
                ("ns/unallocated:http", None),
                ("ns/unnamed", Some(ip("10.96.0.10"))),
            ]
        );
        assert_eq!(v.ports[0].protocol, Protocol::TCP);
        assert_eq!(v.ports[1].protocol, Protocol::UDP);
        assert_eq!(v.ports[0].service, 2);
        // A single-stack IPv4 service does not exist on IPv6.
        let v6 = node_view(&m, &sel("n1"), IpFamily::IPv6).unwrap();
        assert!(v6.ports.is_empty());
    }

    #[test]
    fn dual_stack_selects_the_family() {
        let mut s = svc(
            "web",
            ServiceType::LoadBalancer,
            // Sorted by the string `ip:port`, as the Module keeps them.
            vec![
                ep("10.244.1.5", "n1"),
                ep("fd00:244::1:5", "n2"),
                ep("fd00:244::5", "n1"),
            ],
        );
        s.cluster_ips = vec![ip("10.96.0.10"), ip("fd00:96::10")];
        s.ip_families = vec![IpFamily::IPv4, IpFamily::IPv6];
        s.external_ips = vec![ip("203.0.113.9"), ip("2001:db8::9")];
        s.load_balancer_ingress = vec![
            LoadBalancerIngress {
                ip: ip("198.51.100.1"),
                proxy_mode: false,
            },
            LoadBalancerIngress {
                ip: ip("2001:db8::1"),
                proxy_mode: false,
            },
            LoadBalancerIngress {
                ip: ip("2001:db8::2"),
                proxy_mode: true,
            },
        ];
        s.load_balancer_source_ranges = vec![cidr("203.0.113.0/24"), cidr("2001:db8::7/32")];
        let m = module(vec![s], nodes());
        let v6 = node_view(&m, &sel("n1"), IpFamily::IPv6).unwrap();
        let p = &v6.ports[0];
        assert_eq!(p.cluster_ip, Some(ip("fd00:96::10")));
        assert_eq!(p.external_ips, vec![ip("2001:db8::9")]);
        assert_eq!(p.load_balancer_ips, vec![ip("2001:db8::1")]);
        assert_eq!(p.source_ranges, vec![cidr("2001:db8::/32")]);
        assert!(!p.source_ranges_include_node);
        let eps: Vec<&str> = p.endpoints.iter().map(|e| &*e.addr).collect();
        assert_eq!(eps, vec!["[fd00:244::1:5]:8080", "[fd00:244::5]:8080"]);
        assert_eq!(addrs(p, &p.cluster_endpoints).len(), 2);
        assert!(p.endpoints[1].is_local && !p.endpoints[0].is_local);

        let v4 = view(&m);
        let p = &v4.ports[0];
        assert_eq!(p.cluster_ip, Some(ip("10.96.0.10")));
        assert_eq!(p.load_balancer_ips, vec![ip("198.51.100.1")]);
        assert_eq!(addrs(p, &p.cluster_endpoints), vec!["10.244.1.5"]);
    }

    #[test]
    fn load_balancer_details() {
        let mut s = svc(
            "lb",
            ServiceType::LoadBalancer,
            vec![ep("10.244.1.5", "n2")],
        );
        s.load_balancer_ingress = vec![LoadBalancerIngress {
            ip: ip("198.51.100.1"),
            proxy_mode: true,
        }];
        s.load_balancer_source_ranges = vec![cidr("192.168.0.0/16")];
        s.health_check_node_port = Some(31000);
        s.session_affinity_timeout = Some(600);
        let m = module(vec![s.clone()], nodes());
        let p = &view(&m).ports[0];
        // ipMode Proxy: not captured; the node port keeps it externally accessible.
        assert!(p.load_balancer_ips.is_empty());
        assert!(p.externally_accessible);
        assert!(p.source_ranges_include_node);
        assert_eq!(p.affinity_timeout, Some(600));
        // The health check node port only matters with ETP=Local.
        assert_eq!(p.health_check_node_port, None);
        s.external_traffic_policy = TrafficPolicy::Local;
        let m = module(vec![s.clone()], nodes());
        assert_eq!(view(&m).ports[0].health_check_node_port, Some(31000));

        // No node port and no captured IP: nothing reaches it from outside.
        s.ports[0].node_port = None;
        let m = module(vec![s], nodes());
        let p = &view(&m).ports[0];
        assert!(!p.externally_accessible && !p.external_local);
        assert!(p.local_endpoints.is_empty());
        assert_eq!(addrs(p, &p.cluster_endpoints), vec!["10.244.1.5"]);
    }

    /// (kind, ITP, ETP) → whether the cluster and local sets are computed.
    #[test]
    fn traffic_policy_combinations() {
        use ServiceType::*;
        use TrafficPolicy::*;
        let eps = vec![ep("10.244.1.5", "n1"), ep("10.244.2.5", "n2")];
        for (kind, itp, etp, cluster, local) in [
            (ClusterIP, Cluster, Cluster, true, false),
            (ClusterIP, Local, Cluster, false, true),
            // ETP=Local means nothing on a service nobody reaches from outside.
            (ClusterIP, Cluster, Local, true, false),
            (ClusterIP, Local, Local, false, true),
            (NodePort, Cluster, Cluster, true, false),
            (NodePort, Cluster, Local, true, true),
            // External traffic always needs the cluster set (short-circuit rules).
            (NodePort, Local, Cluster, true, true),
            (NodePort, Local, Local, true, true),
            (LoadBalancer, Local, Local, true, true),
        ] {
            let mut s = svc("s", kind, eps.clone());
            s.internal_traffic_policy = itp;
            s.external_traffic_policy = etp;
            let m = module(vec![s], nodes());
            let p = &view(&m).ports[0];
            let what = format!("{kind:?} itp={itp:?} etp={etp:?}");
            assert_eq!(p.internal_local, itp == Local, "{what}");
            assert_eq!(
                p.external_local,
                etp == Local && kind != ClusterIP,
                "{what}"
            );
            assert!(p.has_endpoints, "{what}");
            let want_cluster: &[&str] = if cluster {
                &["10.244.1.5", "10.244.2.5"]
            } else {
                &[]
            };
            let want_local: &[&str] = if local { &["10.244.1.5"] } else { &[] };
            assert_eq!(addrs(p, &p.cluster_endpoints), want_cluster, "{what}");
            assert_eq!(addrs(p, &p.local_endpoints), want_local, "{what}");
        }
    }

    /// syncProxyRules' decisions: (kind, ITP, ETP, endpoints) → has internal / external
    /// endpoints, verdict, external chain; the firewall chain per mode.
    #[test]
    fn port_decisions() {
        use NoEndpointsVerdict::{Drop, Reject};
        use ServiceType::*;
        use TrafficPolicy::*;
        let local = || vec![ep("10.244.1.5", "n1"), ep("10.244.2.5", "n2")];
        let remote = || vec![ep("10.244.2.5", "n2")];
        #[rustfmt::skip]
        let cases = [
            // kind, itp, etp, endpoints, internal, external, verdict, ext chain
            (ClusterIP, Cluster, Cluster, local(), true, false, Drop, false),
            (ClusterIP, Cluster, Cluster, vec![], false, false, Reject, false),
            (ClusterIP, Local, Cluster, remote(), false, false, Drop, false),
            (ClusterIP, Local, Cluster, local(), true, false, Drop, false),
            (NodePort, Cluster, Cluster, remote(), true, true, Drop, true),
            (NodePort, Cluster, Local, remote(), true, false, Drop, true),
            (NodePort, Cluster, Local, local(), true, true, Drop, true),
            (NodePort, Local, Cluster, remote(), false, true, Drop, true),
            (NodePort, Local, Local, vec![], false, false, Reject, false),
        ];
        for (kind, itp, etp, eps, internal, external, verdict, ext) in cases {
            let mut s = svc("s", kind, eps);
            s.internal_traffic_policy = itp;
            s.external_traffic_policy = etp;
            let m = module(vec![s], nodes());
            let p = &view(&m).ports[0];
            let what = format!("{kind:?} itp={itp:?} etp={etp:?} {:?}", p.endpoints);
            assert_eq!(p.has_internal_endpoints, internal, "{what}");
            assert_eq!(p.has_external_endpoints, external, "{what}");
            assert_eq!(p.no_endpoints_verdict, verdict, "{what}");
            assert_eq!(p.uses_external_chain, ext, "{what}");
        }

        // loadBalancerSourceRanges: iptables' FW chain needs endpoints, nftables' does not;
        // neither without a captured LoadBalancer IP or without ranges.
        let lb = |eps, ingress: bool, ranges: bool| {
            let mut s = svc("lb", LoadBalancer, eps);
            if ingress {
                s.load_balancer_ingress = vec![LoadBalancerIngress {
                    ip: ip("198.51.100.1"),
                    proxy_mode: false,
                }];
            }
            if ranges {
                s.load_balancer_source_ranges = vec![cidr("203.0.113.0/24")];
            }
            view(&module(vec![s], nodes())).ports[0].uses_firewall_chain
        };
        let by_mode = |iptables, nftables| ByMode { iptables, nftables };
        assert_eq!(lb(remote(), true, true), by_mode(true, true));
        assert_eq!(lb(vec![], true, true), by_mode(false, true));
        assert_eq!(lb(remote(), false, true), by_mode(false, false));
        assert_eq!(lb(remote(), true, false), by_mode(false, false));
    }

    #[test]
    fn a_duplicated_endpoint_is_local_on_the_node_of_each_copy() {
        // Two slices list 10.244.1.5, one on n1 and one on n2 (a moved pod, a mirrored
        // slice): each node serves its own copy, so with ETP=Local neither drops.
        let mut kept = ep("10.244.1.5", "n1");
        kept.copies = vec![ep("10.244.1.5", "n2")];
        let mut s = svc("s", ServiceType::NodePort, vec![kept]);
        s.external_traffic_policy = TrafficPolicy::Local;
        let m = module(vec![s], nodes());
        for n in ["n1", "n2"] {
            let p = node_view(&m, &sel(n), IpFamily::IPv4)
                .unwrap()
                .ports
                .remove(0);
            assert_eq!(addrs(&p, &p.local_endpoints), vec!["10.244.1.5"], "{n}");
            assert!(p.endpoints[0].is_local, "{n}");
        }
        let p = node_view(&m, &sel("n3"), IpFamily::IPv4)
            .unwrap()
            .ports
            .remove(0);
        assert!(p.local_endpoints.is_empty() && !p.endpoints[0].is_local);
        assert_eq!(addrs(&p, &p.cluster_endpoints), vec!["10.244.1.5"]);
    }

    #[test]
    fn terminating_fallback() {
        // Cluster: ready first; without any ready, serving-terminating ones; a
        // non-serving terminating endpoint is never used.
        let eps = vec![
            terminating(ep("10.244.1.5", "n1"), true),
            terminating(ep("10.244.1.6", "n1"), false),
            ep("10.244.2.5", "n2"),
        ];
        let mut s = svc("s", ServiceType::NodePort, eps);
        s.external_traffic_policy = TrafficPolicy::Local;
        let m = module(vec![s.clone()], nodes());
        let p = &view(&m).ports[0];
        assert_eq!(addrs(p, &p.cluster_endpoints), vec!["10.244.2.5"]);
        // Local: no local ready endpoint, so the local serving-terminating one.
        assert_eq!(addrs(p, &p.local_endpoints), vec!["10.244.1.5"]);
        assert!(p.has_endpoints);

        s.ports[0].endpoints[2] = terminating(ep("10.244.2.5", "n2"), true);
        let m = module(vec![s.clone()], nodes());
        let p = &view(&m).ports[0];
        assert_eq!(
            addrs(p, &p.cluster_endpoints),
            vec!["10.244.1.5", "10.244.2.5"]
        );

        // Nothing usable anywhere: no endpoints.
        s.ports[0].endpoints = vec![
            terminating(ep("10.244.1.6", "n1"), false),
            Endpoint {
                ready: false,
                ..ep("10.244.2.6", "n2")
            },
        ];
        let m = module(vec![s], nodes());
        let p = &view(&m).ports[0];
        assert!(!p.has_endpoints);
        assert!(p.cluster_endpoints.is_empty() && p.local_endpoints.is_empty());
        assert_eq!(p.endpoints.len(), 2);
    }

    fn with_keys(keys: &[&str], eps: Vec<Endpoint>) -> Module {
        let mut s = svc("topo", ServiceType::ClusterIP, eps);
        s.topology_keys = keys.iter().map(|k| k.to_string()).collect();
        let mut ns = nodes();
        ns[0]
            .labels
            .insert("topology.kubernetes.io/region".into(), "r1".into());
        module(vec![s], ns)
    }

    #[test]
    fn topology_keys() {
        let eps = || {
            vec![
                ep("10.244.1.5", "n1"),
                ep("10.244.2.5", "n2"),
                ep("10.244.3.5", "n3"),
            ]
        };
        let cluster = |m: &Module| {
            let p = view(m).ports.remove(0);
            (addrs(&p, &p.cluster_endpoints), p.has_endpoints, p.topology)
        };

        let (got, has, why) = cluster(&with_keys(&[LABEL_HOSTNAME, LABEL_ZONE], eps()));
        assert_eq!(got, vec!["10.244.1.5"]);
        assert!(has);
        assert_eq!(why.as_deref(), Some("topologyKeys: kubernetes.io/hostname"));

        // Nothing on this node: the zone key wins (n1 and n2 are in zone a).
        let mut no_local = eps();
        no_local.remove(0);
        no_local.push(ep("10.244.2.6", "n2"));
        let (got, _, why) = cluster(&with_keys(&[LABEL_HOSTNAME, LABEL_ZONE], no_local));
        assert_eq!(got, vec!["10.244.2.5", "10.244.2.6"]);
        assert_eq!(
            why.as_deref(),
            Some("topologyKeys: topology.kubernetes.io/zone")
        );

        // Only zone b has endpoints: the zone key yields none, `*` takes them all.
        let zone_b = vec![ep("10.244.3.5", "n3")];
        let (got, _, why) = cluster(&with_keys(&[LABEL_ZONE, "*"], zone_b.clone()));
        assert_eq!(got, vec!["10.244.3.5"]);
        assert_eq!(why.as_deref(), Some("topologyKeys: *"));

        // No key matches: no endpoints for this node, traffic is rejected.
        let (got, has, why) = cluster(&with_keys(
            &[LABEL_HOSTNAME, LABEL_ZONE, "topology.kubernetes.io/region"],
            zone_b.clone(),
        ));
        assert!(got.is_empty() && !has);
        assert_eq!(why.as_deref(), Some("topologyKeys: no match, rejected"));

        // A key this node has no label for is skipped.
        let (got, _, _) = cluster(&with_keys(&["rack", "*"], zone_b));
        assert_eq!(got, vec!["10.244.3.5"]);

        // The zone of an endpoint whose Node is unknown comes from the slice.
        let mut far = ep("10.244.9.5", "n9");
        far.zone = Some("a".into());
        let (got, _, _) = cluster(&with_keys(&[LABEL_ZONE], vec![far, ep("10.244.3.5", "n3")]));
        assert_eq!(got, vec!["10.244.9.5"]);

        // Ready endpoints elsewhere beat a terminating one here; with no ready one
        // at all, the keys apply to the terminating ones.
        let mixed = vec![
            terminating(ep("10.244.1.5", "n1"), true),
            ep("10.244.3.5", "n3"),
        ];
        let (got, _, _) = cluster(&with_keys(&[LABEL_HOSTNAME, "*"], mixed));
        assert_eq!(got, vec!["10.244.3.5"]);
        let all_term = vec![
            terminating(ep("10.244.1.5", "n1"), true),
            terminating(ep("10.244.3.5", "n3"), true),
        ];
        let (got, has, _) = cluster(&with_keys(&[LABEL_HOSTNAME], all_term));
        assert_eq!(got, vec!["10.244.1.5"]);
        assert!(has);
    }

    fn hinted(addr: &str, node: &str, zones: &[&str], nodes: &[&str]) -> Endpoint {
        Endpoint {
            hint_zones: zones.iter().map(|z| z.to_string()).collect(),
            hint_nodes: nodes.iter().map(|n| n.to_string()).collect(),
            ..ep(addr, node)
        }
    }

    /// Cilium's topology rules (`DefaultSelectBackends`, `convertService`), only with
    /// `--enable-service-topology`; kube-proxy's sets are not affected.
    #[test]
    fn cilium_topology() {
        let run = |eps: Vec<Endpoint>,
                   edit: &dyn Fn(&mut Service),
                   topology: bool,
                   this: &str|
         -> (Vec<String>, Vec<String>, Option<String>) {
            let mut s = svc("h", ServiceType::ClusterIP, eps);
            edit(&mut s);
            let mut m = module(vec![s], nodes());
            m.cluster.ebpf_service_topology = topology;
            let p = node_view(&m, &sel(this), IpFamily::IPv4)
                .unwrap()
                .ports
                .remove(0);
            let c = &p.cilium;
            let pick = |idx: &[u32]| -> Vec<String> {
                idx.iter()
                    .map(|&i| c.backends[i as usize].ip.to_string())
                    .collect()
            };
            (
                pick(&c.cluster),
                addrs(&p, &p.cluster_endpoints),
                c.topology
                    .as_ref()
                    .map(|t| format!("{}: {}", t.distribution, t.note)),
            )
        };
        let zoned = || {
            vec![
                hinted("10.244.1.5", "n1", &["a"], &[]),
                hinted("10.244.2.5", "n2", &["a"], &[]),
                hinted("10.244.3.5", "n3", &["b"], &[]),
            ]
        };
        let td = |t: &'static str| move |s: &mut Service| s.traffic_distribution = Some(t.into());
        let all = ["10.244.1.5", "10.244.2.5", "10.244.3.5"];
        // Off: hints and the field are not read.
        let (c, _, t) = run(zoned(), &td("PreferClose"), false, "n1");
        assert_eq!((c, t), (all.map(String::from).to_vec(), None));
        // PreferClose: the zone's backends.
        let (c, kp, t) = run(zoned(), &td("PreferClose"), true, "n1");
        assert_eq!(c, ["10.244.1.5", "10.244.2.5"]);
        assert_eq!(kp, c, "kube-proxy agrees here");
        assert_eq!(t.as_deref(), Some("PreferSameZone: zone a"));
        // Hints without a distribution: Cilium every backend, kube-proxy the zone's.
        let (c, kp, t) = run(zoned(), &|_| {}, true, "n1");
        assert_eq!((c.len(), kp.len(), t), (3, 2, None));
        // The annotation, unless disabled; internalTrafficPolicy: Local reads none.
        let ann = |v: &'static str| move |s: &mut Service| s.topology_mode = Some(v.into());
        assert_eq!(run(zoned(), &ann("auto"), true, "n1").0.len(), 2);
        assert_eq!(run(zoned(), &ann("Disabled"), true, "n1").0.len(), 3);
        let itp = |s: &mut Service| {
            s.traffic_distribution = Some("PreferClose".into());
            s.internal_traffic_policy = TrafficPolicy::Local;
        };
        assert_eq!(run(zoned(), &itp, true, "n1").2, None);
        // Safeguards: an active backend without hints, no backend for the zone, a node
        // without a zone: every backend.
        let mut missing = zoned();
        missing[2].hint_zones.clear();
        let (c, _, t) = run(missing, &td("PreferSameZone"), true, "n1");
        assert_eq!(c.len(), 3, "{t:?}");
        let other = vec![hinted("10.244.3.5", "n3", &["b"], &[])];
        assert_eq!(run(other, &td("PreferClose"), true, "n1").0.len(), 1);
        let mut m2 = nodes();
        m2[0].labels.clear();
        let mut s = svc("h", ServiceType::ClusterIP, zoned());
        s.traffic_distribution = Some("PreferClose".into());
        let mut m = module(vec![s], m2);
        m.cluster.ebpf_service_topology = true;
        assert_eq!(view(&m).ports[0].cilium.cluster.len(), 3);
        // A terminating backend without hints does not count and is not kept.
        let mut eps = zoned();
        eps.push(terminating(ep("10.244.3.9", "n3"), true));
        let (c, _, _) = run(eps, &td("PreferClose"), true, "n1");
        assert_eq!(c, ["10.244.1.5", "10.244.2.5"]);
        // PreferSameNode: by node name, not node hints; none active here: every backend.
        let (c, kp, t) = run(zoned(), &td("PreferSameNode"), true, "n1");
        assert_eq!(c, ["10.244.1.5"]);
        assert_eq!(kp, ["10.244.1.5", "10.244.2.5"], "kube-proxy: zone hints");
        assert_eq!(t.as_deref(), Some("PreferSameNode: node n1"));
        let mut eps = zoned();
        eps[0] = terminating(eps[0].clone(), true);
        assert_eq!(run(eps, &td("PreferSameNode"), true, "n1").0.len(), 3);
    }

    #[test]
    fn topology_hints() {
        let run = |eps: Vec<Endpoint>, this: &str| {
            let m = module(vec![svc("h", ServiceType::ClusterIP, eps)], nodes());
            let p = node_view(&m, &sel(this), IpFamily::IPv4)
                .unwrap()
                .ports
                .remove(0);
            (addrs(&p, &p.cluster_endpoints), p.topology)
        };
        let zoned = || {
            vec![
                hinted("10.244.1.5", "n1", &["a"], &[]),
                hinted("10.244.2.5", "n2", &["a"], &[]),
                hinted("10.244.3.5", "n3", &["b"], &[]),
            ]
        };
        let (got, why) = run(zoned(), "n1");
        assert_eq!(got, vec!["10.244.1.5", "10.244.2.5"]);
        assert_eq!(why.as_deref(), Some("hints: zone a"));
        let (got, _) = run(zoned(), "n3");
        assert_eq!(got, vec!["10.244.3.5"]);

        // One ready endpoint without a hint: hints are ignored.
        let mut missing = zoned();
        missing.push(ep("10.244.3.6", "n3"));
        let (got, why) = run(missing, "n1");
        assert_eq!(got.len(), 4);
        assert_eq!(
            why.as_deref(),
            Some("hints ignored: a ready endpoint has no zone hint")
        );

        // ...but a not-ready endpoint without hints does not count.
        let mut not_ready = zoned();
        not_ready.push(Endpoint {
            ready: false,
            ..ep("10.244.3.6", "n3")
        });
        assert_eq!(run(not_ready, "n1").0.len(), 2);

        // No endpoint hinted for this zone.
        let b_only = vec![
            hinted("10.244.2.5", "n2", &["b"], &[]),
            hinted("10.244.3.5", "n3", &["b"], &[]),
        ];
        let (got, why) = run(b_only.clone(), "n1");
        assert_eq!(got.len(), 2);
        assert_eq!(why.as_deref(), Some("hints ignored: none for zone a"));

        // A node without a zone label ignores zone hints.
        let mut ns = nodes();
        ns[0].labels.remove(LABEL_ZONE);
        let m = module(vec![svc("h", ServiceType::ClusterIP, b_only)], ns);
        let p = &view(&m).ports[0];
        assert_eq!(p.cluster_endpoints.len(), 2);
        assert_eq!(
            p.topology.as_deref(),
            Some("hints ignored: node has no topology.kubernetes.io/zone label")
        );

        // PreferSameNode: node hints win when every ready endpoint has one and one is
        // for this node; otherwise the zone hints apply.
        let noded = || {
            vec![
                hinted("10.244.1.5", "n1", &["a"], &["n1"]),
                hinted("10.244.2.5", "n2", &["a"], &["n2"]),
                hinted("10.244.3.5", "n3", &["b"], &["n3"]),
            ]
        };
        let (got, why) = run(noded(), "n2");
        assert_eq!(got, vec!["10.244.2.5"]);
        assert_eq!(why.as_deref(), Some("hints: node n2"));
        let mut other = noded();
        other.remove(0);
        let (got, why) = run(other, "n1");
        assert_eq!(got, vec!["10.244.2.5"]);
        assert_eq!(why.as_deref(), Some("hints: zone a"));

        // Topology never narrows the local set, and ITP=Local alone skips it.
        let mut s = svc("h", ServiceType::ClusterIP, zoned());
        s.internal_traffic_policy = TrafficPolicy::Local;
        let m = module(vec![s], nodes());
        let p = &node_view(&m, &sel("n3"), IpFamily::IPv4).unwrap().ports[0];
        assert_eq!(addrs(p, &p.local_endpoints), vec!["10.244.3.5"]);
        assert_eq!(p.topology, None);
    }

    #[test]
    fn services_of_another_proxy_are_not_proxied() {
        let mut other = svc("other", ServiceType::NodePort, vec![ep("10.244.2.5", "n2")]);
        other.proxy_name = Some("other-proxy".into());
        // Labelled as the EndpointSlice controller labels a headless service's slices.
        let mut labelled = svc(
            "labelled",
            ServiceType::NodePort,
            vec![ep("10.244.2.7", "n2")],
        );
        labelled.headless_label = true;
        let ours = svc("ours", ServiceType::ClusterIP, vec![ep("10.244.2.6", "n2")]);
        let v = view(&module(vec![other, labelled, ours], nodes()));
        let names: Vec<&str> = v.ports.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["ours"]);
    }

    #[test]
    fn large_cluster_threshold() {
        let eps = |n: usize| -> Vec<Endpoint> {
            (0..n)
                .map(|i| Endpoint {
                    // Not-ready endpoints count too.
                    ready: i % 2 == 0,
                    ..ep(&format!("10.244.{}.{}", i / 250, i % 250 + 1), "n2")
                })
                .collect()
        };
        let mut a = svc("a", ServiceType::ClusterIP, eps(600));
        a.name = "a".into();
        let b = svc("b", ServiceType::ClusterIP, eps(400));
        let m = module(vec![a.clone(), b.clone()], nodes());
        assert!(!view(&m).large_cluster);
        let c = svc("c", ServiceType::ClusterIP, eps(1));
        let m = module(vec![a, b, c], nodes());
        assert!(view(&m).large_cluster);
    }
}
