//! The differential's own oracle for generated manifests: what the generator wrote, as
//! data ([`Cluster`]), and which endpoints kube-proxy uses for each service port on the
//! lab node, computed here from that data ([`view`]) and never by the compiler (not
//! `--target ir`, not the node pass): an endpoint-selection bug in the compiler (topology,
//! terminating fallback, readiness, traffic policies) shows as a kernel that disagrees.
//!
//! The rules, from kubernetes/kubernetes:
//! - `pkg/proxy/endpointslicecache.go`, `addEndpoints`: `ready` and `serving` are true
//!   unless the condition says false, `terminating` only when it says true; an endpoint is
//!   local when its `nodeName` is this node's; zone hints are its `hints.forZones`.
//! - `pkg/proxy/topology.go`, `CategorizeEndpoints`: the cluster set (when the port uses
//!   it) is the ready endpoints,
//!   narrowed by `topologyModeFromHints` (every ready endpoint has a zone hint and one is
//!   for this node's zone: those hinted for it), else the serving-terminating ones; the
//!   local set (used by an internal or external Local policy) is the local ready ones,
//!   else the local serving-terminating ones; `hasAnyEndpoints` when the cluster set is
//!   not empty or (a Local policy) some endpoint is ready or serving-terminating.
//! - `pkg/proxy/serviceport.go`: `UsesClusterEndpoints` = ITP Cluster or externally
//!   accessible (a node port, load-balancer or external IPs: even with ETP Local, for the
//!   short-circuit of in-cluster traffic); `UsesLocalEndpoints` = ITP Local or ETP Local
//!   (which counts only for externally accessible services).
//! - The deprecated `spec.topologyKeys` as kube-proxy 1.17–1.21 filtered by them
//!   (`deprecatedTopologyFilter` in that release's `pkg/proxy/topology.go`: the first key
//!   whose value on this node some endpoint's node shares wins, `*` takes all, no match
//!   leaves none), in place of hints, with the project's documented choice (README,
//!   `--topology-keys honour`) that they filter the ready endpoints, then the
//!   serving-terminating ones, and that no match leaves the node without endpoints.
//! - `pkg/proxy/iptables/proxier.go`, `NewProxier`: `localhostNodePorts` takes effect only
//!   when `nodePortAddresses` admits 127.0.0.1 (`ContainsIPv4Loopback`: none given);
//!   `primary` and `192.0.2.0/24` both admit the lab node's LAN address.
//!
//! The lab node is `node-1`, zone `zone-a` (golden/common/nodes.yaml); node-2 is `zone-b`.

use super::{Cidr, Family, PortInfo, View};
use std::net::{IpAddr, Ipv4Addr};

/// What one generated manifest says.
#[derive(Clone, Debug, Default)]
pub(super) struct Cluster {
    pub(super) namespace: String,
    pub(super) masquerade_all: bool,
    /// The KubeProxyConfiguration's `iptables.localhostNodePorts` (default true).
    pub(super) localhost_node_ports: bool,
    /// `nodePortAddresses` given (`primary` or `192.0.2.0/24`); `false`: every address.
    pub(super) node_port_addresses: bool,
    pub(super) services: Vec<Svc>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Svc {
    pub(super) name: String,
    /// `ClusterIP`, `NodePort` or `LoadBalancer`.
    pub(super) kind: String,
    pub(super) cluster_ip: Option<Ipv4Addr>,
    pub(super) external_ips: Vec<Ipv4Addr>,
    pub(super) lb_ips: Vec<Ipv4Addr>,
    pub(super) source_ranges: Vec<Cidr>,
    pub(super) etp_local: bool,
    pub(super) itp_local: bool,
    pub(super) affinity: bool,
    pub(super) topology_keys: Vec<String>,
    pub(super) ports: Vec<Port>,
    /// Every endpoint of every slice, in the order written.
    pub(super) endpoints: Vec<Ep>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Port {
    /// Empty when unnamed.
    pub(super) name: String,
    pub(super) udp: bool,
    pub(super) port: u16,
    pub(super) target: u16,
    pub(super) node_port: Option<u16>,
}

#[derive(Clone, Debug)]
pub(super) struct Ep {
    pub(super) pod: String,
    pub(super) ip: Ipv4Addr,
    pub(super) node: Option<String>,
    pub(super) zone_hint: Option<String>,
    pub(super) ready: bool,
    pub(super) serving: bool,
    pub(super) terminating: bool,
}

/// The node the manifests are compiled for and its zone.
const THIS_NODE: &str = "node-1";
const THIS_ZONE: &str = "zone-a";

/// The zone label of a Node object of golden/common/nodes.yaml.
fn zone_of(node: &str) -> Option<&'static str> {
    match node {
        "node-1" => Some("zone-a"),
        "node-2" => Some("zone-b"),
        _ => None,
    }
}

impl Ep {
    fn local(&self) -> bool {
        self.node.as_deref() == Some(THIS_NODE)
    }
    fn serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
    /// This endpoint's node's value of a topology label (`None`: unknown).
    fn label(&self, key: &str) -> Option<&str> {
        let node = self.node.as_deref()?;
        match key {
            "kubernetes.io/hostname" => Some(node),
            "topology.kubernetes.io/zone" => zone_of(node),
            _ => None,
        }
    }
}

/// This node's value of a topology label.
fn this_label(key: &str) -> Option<&'static str> {
    match key {
        "kubernetes.io/hostname" => Some(THIS_NODE),
        "topology.kubernetes.io/zone" => Some(THIS_ZONE),
        _ => None,
    }
}

/// `deprecatedTopologyFilter`: `None` when no key matches.
fn by_keys(keys: &[String], eps: &[Ep], candidates: Vec<usize>) -> Option<Vec<usize>> {
    for key in keys {
        if key == "*" {
            return Some(candidates);
        }
        let Some(want) = this_label(key) else {
            continue;
        };
        let hit: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| eps[i].label(key) == Some(want))
            .collect();
        if !hit.is_empty() {
            return Some(hit);
        }
    }
    None
}

/// Cluster set, local set, `hasAnyEndpoints` (indices into `s.endpoints`).
pub(super) fn categorize(s: &Svc) -> (Vec<usize>, Vec<usize>, bool) {
    let eps = &s.endpoints;
    let all = |pred: &dyn Fn(&Ep) -> bool| -> Vec<usize> {
        (0..eps.len()).filter(|&i| pred(&eps[i])).collect()
    };
    let externally = s.kind != "ClusterIP" || !s.external_ips.is_empty();
    let external_local = externally && s.etp_local;
    // Even with ETP=Local an externally accessible port needs the cluster endpoints: the
    // external chain short-circuits the node's and the pods' traffic to them.
    let uses_cluster = !s.itp_local || externally;
    let uses_local = s.itp_local || external_local;

    let mut cluster = Vec::new();
    let mut any = false;
    let mut no_key_matched = false;
    if uses_cluster {
        if !s.topology_keys.is_empty() {
            let ready = by_keys(&s.topology_keys, eps, all(&|e| e.ready));
            let set = match ready {
                Some(set) if !set.is_empty() => Some(set),
                _ => by_keys(&s.topology_keys, eps, all(&Ep::serving_terminating)),
            };
            no_key_matched = set.as_ref().is_none_or(Vec::is_empty);
            cluster = set.unwrap_or_default();
        } else {
            let ready = all(&|e| e.ready);
            let zoned = !ready.is_empty()
                && ready.iter().all(|&i| eps[i].zone_hint.is_some())
                && ready
                    .iter()
                    .any(|&i| eps[i].zone_hint.as_deref() == Some(THIS_ZONE));
            cluster = if zoned {
                ready
                    .into_iter()
                    .filter(|&i| eps[i].zone_hint.as_deref() == Some(THIS_ZONE))
                    .collect()
            } else {
                ready
            };
            if cluster.is_empty() {
                cluster = all(&Ep::serving_terminating);
            }
        }
        any = !cluster.is_empty();
    }
    let mut local = Vec::new();
    if uses_local {
        any |= eps.iter().any(|e| e.ready || e.serving_terminating());
        local = all(&|e| e.local() && e.ready);
        if local.is_empty() {
            local = all(&|e| e.local() && e.serving_terminating());
        }
    }
    if no_key_matched {
        any = false;
        local.clear();
    }
    (cluster, local, any)
}

/// The lab node's view of the manifest, as [`super::parse_view`] reads it from the IR.
pub(super) fn view(c: &Cluster) -> View {
    let mut ports = Vec::new();
    for s in &c.services {
        let (cluster, local, has_endpoints) = categorize(s);
        let externally = s.kind != "ClusterIP" || !s.external_ips.is_empty();
        for p in &s.ports {
            let spn = if p.name.is_empty() {
                format!("{}/{}", c.namespace, s.name)
            } else {
                format!("{}/{}:{}", c.namespace, s.name, p.name)
            };
            ports.push(PortInfo {
                spn,
                proto: Some(if p.udp {
                    super::Proto::Udp
                } else {
                    super::Proto::Tcp
                }),
                cluster_ip: s.cluster_ip.map(IpAddr::V4),
                port: p.port,
                node_port: p.node_port,
                external_ips: s.external_ips.iter().map(|&ip| ip.into()).collect(),
                lb_ips: s.lb_ips.iter().map(|&ip| ip.into()).collect(),
                source_ranges: if s.lb_ips.is_empty() {
                    Vec::new()
                } else {
                    s.source_ranges.clone()
                },
                affinity: s.affinity,
                internal_local: s.itp_local,
                external_local: externally && s.etp_local,
                has_endpoints,
                endpoints: s
                    .endpoints
                    .iter()
                    .map(|e| Some(format!("{}:{}", e.pod, p.target)))
                    .collect(),
                cluster: cluster.clone(),
                local: local.clone(),
                local_endpoint_ips: s
                    .endpoints
                    .iter()
                    .filter(|e| e.local())
                    .map(|e| IpAddr::V4(e.ip))
                    .collect(),
            });
        }
    }
    ports.sort_by(|a, b| a.spn.cmp(&b.spn));
    View {
        family: Family::V4,
        masquerade_all: c.masquerade_all,
        // clusterCIDR 10.244.0.0/16, detect-local-mode ClusterCIDR (the default).
        detector: Some(Some(Cidr(Ipv4Addr::new(10, 244, 0, 0).into(), 16))),
        localhost_node_ports: c.localhost_node_ports && !c.node_port_addresses,
        node_port_ip: Some(super::super::addr::NODE_LAN.into()),
        node_ports_everywhere: !c.node_port_addresses,
        ports,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(pod: &str, node: Option<&str>, cond: (bool, bool, bool), zone: Option<&str>) -> Ep {
        Ep {
            pod: pod.into(),
            ip: Ipv4Addr::UNSPECIFIED,
            node: node.map(str::to_string),
            zone_hint: zone.map(str::to_string),
            ready: cond.0,
            serving: cond.1,
            terminating: cond.2,
        }
    }
    const READY: (bool, bool, bool) = (true, true, false);
    const DRAINING: (bool, bool, bool) = (false, true, true);
    const GONE: (bool, bool, bool) = (false, false, true);

    fn svc(eps: Vec<Ep>) -> Svc {
        Svc {
            kind: "ClusterIP".into(),
            endpoints: eps,
            ..Svc::default()
        }
    }

    /// The cases of `CategorizeEndpoints` the generator reaches, worked by hand.
    #[test]
    fn categorize_follows_kube_proxy() {
        let local = Some("node-1");
        let remote = Some("node-2");
        // Ready ones win; draining ones only when nothing is ready.
        let s = svc(vec![
            ep("a", local, DRAINING, None),
            ep("r", remote, READY, None),
        ]);
        assert_eq!(categorize(&s), (vec![1], vec![], true));
        let s = svc(vec![
            ep("a", local, DRAINING, None),
            ep("r", remote, GONE, None),
        ]);
        assert_eq!(categorize(&s), (vec![0], vec![], true));
        let s = svc(vec![ep("r", remote, GONE, None)]);
        assert_eq!(categorize(&s), (vec![], vec![], false));
        // Zone hints: all ready hinted, one for zone-a.
        let s = svc(vec![
            ep("a", local, READY, Some("zone-b")),
            ep("r", remote, READY, Some("zone-a")),
        ]);
        assert_eq!(categorize(&s).0, vec![1]);
        // ... none for zone-a: ignored.
        let s = svc(vec![
            ep("a", local, READY, Some("zone-b")),
            ep("r", remote, READY, Some("zone-b")),
        ]);
        assert_eq!(categorize(&s).0, vec![0, 1]);
        // ITP=Local: no cluster set; local falls back to local draining; any usable
        // endpoint counts.
        let mut s = svc(vec![
            ep("a", local, DRAINING, None),
            ep("r", remote, READY, None),
        ]);
        s.itp_local = true;
        assert_eq!(categorize(&s), (vec![], vec![0], true));
        s.endpoints[0].node = None;
        assert_eq!(categorize(&s), (vec![], vec![], true));
        // topologyKeys: hostname without a match leaves nothing at all.
        let mut s = svc(vec![ep("r", remote, READY, None)]);
        s.topology_keys = vec!["kubernetes.io/hostname".into()];
        assert_eq!(categorize(&s), (vec![], vec![], false));
        s.topology_keys.push("*".into());
        assert_eq!(categorize(&s), (vec![0], vec![], true));
        // ... zone: the draining local one when no ready one is in zone-a.
        let mut s = svc(vec![
            ep("a", local, DRAINING, None),
            ep("r", remote, READY, None),
        ]);
        s.topology_keys = vec!["topology.kubernetes.io/zone".into()];
        assert_eq!(categorize(&s), (vec![0], vec![], true));
    }
}
