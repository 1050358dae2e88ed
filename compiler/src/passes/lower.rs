//! Lowering: typed objects + resolved endpoints + allocations → [`ir::Module`].
//!
//! Lenient by design: values that validation rejected are skipped, never panicked on.

use crate::ir::{self, DetectLocalMode, NodePortAddress, TrafficPolicy};
use crate::k8s::{Objects, ProxyConfigDoc};
use crate::net::{parse_ip, Cidr, IpFamily};
use crate::passes::allocate::{is_headless, target_port, Allocation};
use crate::passes::resolve::{protocol_of, Resolved};
use crate::passes::Settings;
use rayon::prelude::*;

/// Cilium's per-service annotations (`pkg/annotation/k8s.go`, `ServicePrefix`).
pub const CILIUM_ANNOTATION_PREFIX: &str = "service.cilium.io/";

pub fn lower(
    objects: &Objects,
    settings: &Settings,
    resolved: Resolved,
    allocs: Vec<Allocation>,
) -> ir::Module {
    // Each service is lowered on its own: in parallel, then sorted.
    let mut services: Vec<ir::Service> = objects
        .services
        .par_iter()
        .zip(resolved)
        .zip(allocs)
        .map(|((s, r), a)| {
            let mut eps = r.ports;
            let kind = match s.type_.as_ref().map(|t| t.v.as_str()) {
                Some("NodePort") => ir::ServiceType::NodePort,
                Some("LoadBalancer") => ir::ServiceType::LoadBalancer,
                Some("ExternalName") => ir::ServiceType::ExternalName,
                _ => ir::ServiceType::ClusterIP,
            };
            let policy =
                |p: &Option<crate::decode::Sp<String>>| match p.as_ref().map(|p| p.v.as_str()) {
                    Some("Local") => TrafficPolicy::Local,
                    _ => TrafficPolicy::Cluster,
                };
            // kube-proxy reads only the spec (the annotation is for cloud providers);
            // validation checks both.
            let ranges: Vec<Cidr> = s
                .load_balancer_source_ranges
                .iter()
                .filter_map(|r| r.v.trim().parse().ok())
                .collect();
            let mut ip_families: Vec<IpFamily> = a.cluster_ips.iter().map(IpFamily::of).collect();
            if ip_families.is_empty() {
                ip_families = a.headless_families.clone();
            }
            if ip_families.is_empty() {
                ip_families = s
                    .ip_families
                    .iter()
                    .filter_map(|f| IpFamily::parse(&f.v))
                    .collect();
            }
            // A service without ports has one list: its endpoints at port 0.
            let portless_endpoints = if s.ports.is_empty() {
                of_families(eps.pop().unwrap_or_default(), &ip_families)
            } else {
                Vec::new()
            };
            ir::Service {
                namespace: s.meta.namespace.v.clone(),
                name: s.meta.name.v.clone(),
                kind,
                headless: is_headless(s),
                cluster_ips: if kind == ir::ServiceType::ExternalName {
                    vec![]
                } else {
                    a.cluster_ips
                },
                ip_families: ip_families.clone(),
                external_name: s.external_name.as_ref().map(|e| e.v.clone()),
                external_ips: s
                    .external_ips
                    .iter()
                    .filter_map(|e| parse_ip(&e.v))
                    .collect(),
                // The API server drops status on create and refuses it on a Service that
                // is no LoadBalancer; an invalid entry is a warning (validate), left out.
                load_balancer_ingress: s
                    .lb_ingress
                    .iter()
                    .filter(|_| kind == ir::ServiceType::LoadBalancer)
                    .filter_map(|g| {
                        Some(ir::LoadBalancerIngress {
                            ip: parse_ip(&g.ip.as_ref()?.v)?,
                            proxy_mode: g.ip_mode.as_ref().is_some_and(|m| m.v == "Proxy"),
                        })
                    })
                    .collect(),
                load_balancer_source_ranges: ranges,
                external_traffic_policy: policy(&s.external_traffic_policy),
                internal_traffic_policy: policy(&s.internal_traffic_policy),
                session_affinity_timeout: (s
                    .session_affinity
                    .as_ref()
                    .is_some_and(|a| a.v == "ClientIP"))
                .then(|| {
                    s.affinity_timeout
                        .as_ref()
                        .map_or(10800, |t| t.v.clamp(0, u32::MAX as i64) as u32)
                }),
                health_check_node_port: a.health_check_node_port,
                // Ignored as a current kube-proxy does: lowered as if absent.
                topology_keys: match settings.topology_keys {
                    ir::TopologyKeys::Honour => {
                        s.topology_keys.iter().map(|k| k.v.clone()).collect()
                    }
                    ir::TopologyKeys::Ignore => Vec::new(),
                },
                traffic_distribution: s.traffic_distribution.as_ref().map(|t| t.v.clone()),
                topology_mode: s
                    .meta
                    .annotation("service.kubernetes.io/topology-aware-hints")
                    .or_else(|| s.meta.annotation("service.kubernetes.io/topology-mode"))
                    .map(|a| a.v.clone()),
                proxy_name: s
                    .meta
                    .label("service.kubernetes.io/service-proxy-name")
                    .map(str::to_string),
                headless_label: s.meta.label("service.kubernetes.io/headless").is_some(),
                load_balancer_class: s.load_balancer_class.as_ref().map(|c| c.v.clone()),
                cilium_annotations: s
                    .meta
                    .annotations
                    .iter()
                    .filter(|(k, _)| k.v.starts_with(CILIUM_ANNOTATION_PREFIX))
                    .map(|(k, v)| (k.v.clone(), v.v.clone()))
                    .collect(),
                ports: s
                    .ports
                    .iter()
                    .zip(eps)
                    .map(|(p, endpoints)| (p, of_families(endpoints, &ip_families)))
                    .enumerate()
                    .map(|(i, (p, endpoints))| ir::ServicePort {
                        name: p.name.as_ref().map_or(String::new(), |n| n.v.clone()),
                        protocol: protocol_of(p.protocol.as_ref().map(|x| x.v.as_str())),
                        port: p.port.as_ref().map_or(0, |p| p.v.clamp(0, 65535) as u16),
                        node_port: a.node_ports.get(i).copied().flatten(),
                        target_port: target_port(p),
                        endpoints,
                    })
                    .collect(),
                allocated: a.allocated,
                portless_endpoints,
                portless_slice_ports: r
                    .slice_ports
                    .into_iter()
                    .map(|(name, protocol, endpoints)| ir::SlicePort {
                        name,
                        protocol,
                        endpoints: of_families(endpoints, &ip_families),
                    })
                    .collect(),
            }
        })
        .collect();
    services.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    // Duplicates were reported by validation; keep the first of each identity.
    services.dedup_by(|b, a| a.namespace == b.namespace && a.name == b.name);

    let mut nodes: Vec<ir::Node> = objects
        .nodes
        .iter()
        .map(|n| {
            let mut addresses = Vec::new();
            for t in ["InternalIP", "ExternalIP"] {
                addresses.extend(
                    n.addresses
                        .iter()
                        .filter(|(ty, _)| ty == t)
                        .filter_map(|(_, a)| parse_ip(&a.v)),
                );
            }
            ir::Node {
                name: n.meta.name.v.clone(),
                addresses,
                labels: n
                    .meta
                    .labels
                    .iter()
                    .map(|(k, v)| (k.v.clone(), v.v.clone()))
                    .collect(),
                pod_cidrs: n
                    .pod_cidrs
                    .iter()
                    .filter_map(|c| c.v.parse().ok())
                    .collect(),
                deleting: n.meta.deletion_timestamp,
                taints: n.taints.clone(),
            }
        })
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes.dedup_by(|b, a| a.name == b.name);

    let mut pods: Vec<ir::Pod> = objects
        .pods
        .iter()
        .map(|p| ir::Pod {
            namespace: p.meta.namespace.v.clone(),
            name: p.meta.name.v.clone(),
            ip: p.pod_ips.first().and_then(|ip| parse_ip(&ip.v)),
            terminating: p.meta.deletion_timestamp,
        })
        .collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    pods.dedup_by(|b, a| a.namespace == b.namespace && a.name == b.name);

    ir::Module {
        cluster: ir::ClusterConfig {
            service_cidrs: settings.service_cidrs.clone(),
            node_port_range: settings.node_port_range,
            cluster_domain: settings.cluster_domain.clone(),
            random_fully: settings.random_fully,
            nfacct: settings.nfacct,
            nft_layout: settings.nft_layout,
            topology_keys: settings.topology_keys,
            dns_records: settings.dns_records,
            ebpf_map_sizes: settings.ebpf_map_sizes,
            ebpf_agent: settings.ebpf_agent.clone(),
            ebpf_service_topology: settings.ebpf_service_topology,
        },
        proxy: proxy_config(objects.proxy_configs.first()),
        services,
        nodes,
        pods,
    }
}

/// The EndpointSlice controller makes slices only for the service's families, so the
/// endpoints svc-compile selected from Pods keep only addresses of those (a single-stack
/// service of dual-stack pods). Given slices and Endpoints are kept as they are.
fn of_families(mut eps: Vec<ir::Endpoint>, families: &[IpFamily]) -> Vec<ir::Endpoint> {
    if !families.is_empty() {
        eps.retain(|e| !e.source.starts_with("Pod ") || families.contains(&IpFamily::of(&e.ip)));
    }
    eps
}

/// kube-proxy's configuration with upstream defaults.
pub fn proxy_config(doc: Option<&ProxyConfigDoc>) -> ir::ProxyConfig {
    let d = doc.cloned().unwrap_or_default();
    let cluster_cidrs: Vec<Cidr> = d
        .cluster_cidr
        .as_ref()
        .map(|c| {
            c.v.split(',')
                .filter_map(|x| x.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let detect_local = match d.detect_local_mode.as_ref().map(|m| m.v.as_str()) {
        Some("NodeCIDR") => DetectLocalMode::NodeCIDR,
        Some("BridgeInterface") => DetectLocalMode::BridgeInterface(
            d.bridge_interface
                .as_ref()
                .map_or(String::new(), |b| b.v.clone()),
        ),
        Some("InterfaceNamePrefix") => DetectLocalMode::InterfaceNamePrefix(
            d.interface_name_prefix
                .as_ref()
                .map_or(String::new(), |b| b.v.clone()),
        ),
        _ if cluster_cidrs.is_empty() => DetectLocalMode::None,
        _ => DetectLocalMode::ClusterCIDR,
    };
    let ipvs = ipvs_config(&d);
    let conntrack = conntrack_config(&d);
    ir::ProxyConfig {
        mode: d
            .mode
            .as_ref()
            .map(|m| m.v.clone())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "iptables".into()),
        cluster_cidrs,
        detect_local,
        masquerade_all: d.masquerade_all.is_some_and(|b| b.v),
        masquerade_bit: d
            .masquerade_bit
            .as_ref()
            .map_or(14, |b| b.v.clamp(0, 31) as u8),
        localhost_node_ports: d.localhost_node_ports.as_ref().is_none_or(|b| b.v),
        node_port_addresses: d
            .node_port_addresses
            .iter()
            .filter_map(|a| {
                if a.v == "primary" {
                    Some(NodePortAddress::Primary)
                } else {
                    a.v.parse().ok().map(NodePortAddress::Cidr)
                }
            })
            .collect(),
        ipvs_scheduler: d
            .ipvs_scheduler
            .as_ref()
            .map(|s| s.v.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "rr".into()),
        conntrack_tcp_be_liberal: d.tcp_be_liberal.is_some_and(|b| b.v),
        ipvs,
        conntrack,
    }
}

/// The `conntrack` section over kube-proxy's defaults; values the validation pass rejected
/// keep the default.
fn conntrack_config(d: &ProxyConfigDoc) -> ir::ConntrackConfig {
    let mut c = ir::ConntrackConfig::default();
    let [per_core, min] = &d.conntrack_counts;
    let count = |n: &Option<crate::decode::Sp<i64>>, default: u32| {
        n.as_ref()
            .and_then(|n| u32::try_from(n.v).ok())
            .unwrap_or(default)
    };
    c.max_per_core = count(per_core, c.max_per_core);
    c.min = count(min, c.min);
    let [est, close, udp, stream] = &d.conntrack_timeouts;
    let secs = |t: &Option<crate::decode::Sp<String>>, default: u32| {
        t.as_ref()
            .and_then(|t| crate::decode::go_duration_secs(&t.v).ok())
            .unwrap_or(default)
    };
    c.tcp_established_timeout = secs(est, c.tcp_established_timeout);
    c.tcp_close_wait_timeout = secs(close, c.tcp_close_wait_timeout);
    c.udp_timeout = secs(udp, c.udp_timeout);
    c.udp_stream_timeout = secs(stream, c.udp_stream_timeout);
    c
}

/// The `ipvs` section; values the validation pass rejected are left unset.
fn ipvs_config(d: &ProxyConfigDoc) -> ir::IpvsConfig {
    let secs = |t: &Option<crate::decode::Sp<String>>| {
        t.as_ref()
            .and_then(|t| crate::decode::go_duration_secs(&t.v).ok())
            .unwrap_or(0)
    };
    let [tcp, fin, udp] = &d.ipvs_timeouts;
    ir::IpvsConfig {
        strict_arp: d.ipvs_strict_arp.as_ref().is_some_and(|b| b.v),
        tcp_timeout: secs(tcp),
        tcp_fin_timeout: secs(fin),
        udp_timeout: secs(udp),
        exclude_cidrs: d
            .ipvs_exclude_cidrs
            .iter()
            .filter_map(|c| c.v.parse().ok())
            .collect(),
    }
}
