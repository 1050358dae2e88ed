//! Endpoint resolution: Service ↔ EndpointSlices (label `kubernetes.io/service-name`),
//! Endpoints (mirrored into slices the way the mirroring controller does, for services
//! without a selector) and Pods (selected the way the EndpointSlice controller does, for
//! services whose slices are not in the input).
//!
//! The result per service port is sorted by the string `ip:port` and deduplicated, a
//! non-terminating endpoint winning over a terminating one (kube-proxy's order and merge).

use crate::decode::IntOrString;
use crate::ir::{Endpoint, Protocol};
use crate::k8s::{Objects, Pod, Service, SlicePort};
use crate::net::{join_host_port, parse_ip, HostPort};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

/// Per service (index into `objects.services`), its endpoints.
pub type Resolved = Vec<ServiceEndpoints>;

/// One service's endpoints.
#[derive(Clone, Debug, Default)]
pub struct ServiceEndpoints {
    /// Per port (spec order). A service without ports has one list: its endpoints
    /// whatever their ports, at port 0.
    pub ports: Vec<Vec<Endpoint>>,
    /// A service without ports: the ports its EndpointSlices (and mirrored Endpoints
    /// subsets) list, by (name, protocol), each with the endpoints that list it at their
    /// slice's number. Only DNS reads them (CoreDNS's SRV records come from the slices'
    /// ports). Empty when the service has ports.
    pub slice_ports: Vec<(String, Protocol, Vec<Endpoint>)>,
}

/// Which slice or subset port an endpoint list is for: a service port's (name, protocol),
/// or, for a service without ports, none (every endpoint, at port 0).
type Want<'a> = Option<(&'a str, Protocol)>;

pub fn protocol_of(s: Option<&str>) -> Protocol {
    match s {
        Some("UDP") => Protocol::UDP,
        Some("SCTP") => Protocol::SCTP,
        _ => Protocol::TCP,
    }
}

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";

pub fn resolve(objects: &Objects) -> Resolved {
    // Index slices, Endpoints and pods by namespace/name once: linear in the input.
    let mut slices_by_svc: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (i, s) in objects.slices.iter().enumerate() {
        if let Some(svc) = s.meta.label(SERVICE_NAME_LABEL) {
            slices_by_svc
                .entry((&s.meta.namespace.v, svc))
                .or_default()
                .push(i);
        }
    }
    let mut eps_by_name: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, e) in objects.endpoints.iter().enumerate() {
        eps_by_name
            .entry((&e.meta.namespace.v, &e.meta.name.v))
            .or_insert(i);
    }
    // Pods by (namespace, label key, label value): a selector looks up its rarest pair
    // and checks the rest, so selection is linear in the pods it could match.
    let mut pods_by_label: HashMap<(&str, &str, &str), Vec<&Pod>> = HashMap::new();
    for p in &objects.pods {
        for (k, v) in &p.meta.labels {
            pods_by_label
                .entry((&p.meta.namespace.v, &k.v, &v.v))
                .or_default()
                .push(p);
        }
    }
    let node_zone: HashMap<&str, &str> = objects
        .nodes
        .iter()
        .filter_map(|n| {
            Some((
                n.meta.name.v.as_str(),
                n.meta.label("topology.kubernetes.io/zone")?,
            ))
        })
        .collect();
    let names = Names::new(objects);
    let ctx = Ctx {
        objects,
        names: &names,
        node_zone: &node_zone,
    };

    // Services are independent of each other: resolved in parallel, kept in input order.
    objects
        .services
        .par_iter()
        .map(|svc| {
            let key = (svc.meta.namespace.v.as_str(), svc.meta.name.v.as_str());
            let has_selector = svc.selector.as_ref().is_some_and(|s| !s.is_empty());
            let slices = slices_by_svc.get(&key);
            // The EndpointSlice controller's work, for services whose slices are not given.
            let selected: Vec<&Pod> = match &svc.selector {
                Some(sel) if has_selector && slices.is_none() => sel
                    .iter()
                    .map(|(k, v)| {
                        pods_by_label
                            .get(&(key.0, k.v.as_str(), v.v.as_str()))
                            .map_or(&[][..], |p| p.as_slice())
                    })
                    .min_by_key(|c| c.len())
                    .unwrap_or(&[])
                    .iter()
                    .filter(|pod| {
                        sel.iter()
                            .all(|(k, v)| pod.meta.label(&k.v) == Some(v.v.as_str()))
                    })
                    .copied()
                    .collect(),
                _ => Vec::new(),
            };
            let mirrored = (!has_selector)
                .then(|| eps_by_name.get(&key).copied())
                .flatten();
            let one = |want: Want, port: Option<&crate::k8s::Port>| {
                let mut out = Vec::new();
                for &i in slices.into_iter().flatten() {
                    from_slice(&ctx, i, want, &mut out);
                }
                if let Some(i) = mirrored {
                    from_endpoints(&ctx, i, want, &mut out);
                } else if has_selector && (port.is_some() || want.is_none()) {
                    from_pods(&ctx, svc, port, &selected, &mut out);
                }
                sort_dedup(out)
            };
            if svc.ports.is_empty() {
                // The slices' own ports, for DNS: the EndpointSlice controller writes
                // none for a service without ports, so Pods give none.
                let mut listed: Vec<(&str, Protocol)> =
                    slices
                        .into_iter()
                        .flatten()
                        .flat_map(|&i| &objects.slices[i].ports)
                        .chain(mirrored.iter().flat_map(|&i| {
                            objects.endpoints[i].subsets.iter().flat_map(|s| &s.ports)
                        }))
                        .map(|p| {
                            (
                                p.name.as_ref().map_or("", |n| n.v.as_str()),
                                protocol_of(p.protocol.as_ref().map(|x| x.v.as_str())),
                            )
                        })
                        .collect();
                listed.sort();
                listed.dedup();
                let slice_ports = listed
                    .into_iter()
                    .map(|(name, proto)| (name.to_string(), proto, one(Some((name, proto)), None)))
                    .filter(|(.., eps)| !eps.is_empty())
                    .collect();
                return ServiceEndpoints {
                    ports: vec![one(None, None)],
                    slice_ports,
                };
            }
            let ports = svc.ports.iter().map(|port| {
                let pname = port.name.as_ref().map_or("", |n| n.v.as_str());
                let proto = protocol_of(port.protocol.as_ref().map(|p| p.v.as_str()));
                one(Some((pname, proto)), Some(port))
            });
            ServiceEndpoints {
                ports: ports.collect(),
                slice_ports: Vec::new(),
            }
        })
        .collect()
}

/// What the per-service work reads.
struct Ctx<'a> {
    objects: &'a Objects,
    names: &'a Names,
    node_zone: &'a HashMap<&'a str, &'a str>,
}

/// Node and zone names, shared by every endpoint that names them (a cluster has few nodes
/// and many endpoints).
struct Names(HashMap<String, Arc<str>>);

impl Names {
    fn new(objects: &Objects) -> Names {
        let mut names = HashMap::new();
        let mut add = |n: &str| {
            if !names.contains_key(n) {
                names.insert(n.to_string(), Arc::from(n));
            }
        };
        for s in &objects.slices {
            for e in &s.endpoints {
                e.node_name.iter().chain(&e.zone).for_each(|n| add(&n.v));
            }
        }
        for e in &objects.endpoints {
            for ss in &e.subsets {
                for a in ss.addresses.iter().chain(&ss.not_ready) {
                    a.node_name.iter().for_each(|n| add(&n.v));
                }
            }
        }
        for p in &objects.pods {
            p.node_name.iter().for_each(|n| add(&n.v));
        }
        for n in &objects.nodes {
            n.meta.label("topology.kubernetes.io/zone").map(&mut add);
        }
        Names(names)
    }
    fn get(&self, name: &str) -> Arc<str> {
        self.0.get(name).cloned().unwrap_or_else(|| Arc::from(name))
    }
}

/// The port a slice's (or an Endpoints subset's) endpoints serve `want` on: kube-proxy
/// matches by (name, protocol), and a port without a number is skipped (`None`). A
/// service without ports takes every endpoint, at port 0.
fn port_for(ports: &[SlicePort], want: Want) -> Option<u16> {
    let Some((pname, proto)) = want else {
        return Some(0);
    };
    ports
        .iter()
        .find(|p| {
            p.name.as_ref().map_or("", |n| n.v.as_str()) == pname
                && protocol_of(p.protocol.as_ref().map(|x| x.v.as_str())) == proto
        })
        .and_then(|p| p.port.as_ref())
        .and_then(|p| u16::try_from(p.v).ok())
        .filter(|p| *p != 0)
}

fn from_slice(ctx: &Ctx, i: usize, want: Want, out: &mut Vec<Endpoint>) {
    let s = &ctx.objects.slices[i];
    if s.address_type.as_ref().is_some_and(|t| t.v == "FQDN") {
        return;
    }
    let Some(port) = port_for(&s.ports, want) else {
        return;
    };
    let source: Arc<str> = format!("EndpointSlice {}/{}", s.meta.namespace.v, s.meta.name.v).into();
    for e in &s.endpoints {
        // kube-proxy uses addresses[0]; the others are kept for Cilium, which makes a
        // backend of each.
        let Some(ip) = e.addresses.first().and_then(|a| parse_ip(&a.v)) else {
            continue;
        };
        let mut other_addresses: Vec<std::net::IpAddr> = Vec::new();
        for a in e.addresses.iter().skip(1).filter_map(|a| parse_ip(&a.v)) {
            if a != ip && !other_addresses.contains(&a) {
                other_addresses.push(a);
            }
        }
        out.push(Endpoint {
            ip,
            port,
            addr: join_host_port(&ip, port).into(),
            other_addresses,
            node_name: e.node_name.as_ref().map(|n| ctx.names.get(&n.v)),
            zone: e.zone.as_ref().map(|z| ctx.names.get(&z.v)),
            hostname: e.hostname.as_ref().map(|h| h.v.clone()),
            ready: e.ready.unwrap_or(true),
            serving: e.serving.unwrap_or(true),
            terminating: e.terminating.unwrap_or(false),
            hint_zones: e.hint_zones.clone(),
            hint_nodes: e.hint_nodes.clone(),
            source: source.clone(),
            copies: Vec::new(),
        });
    }
}

fn from_endpoints(ctx: &Ctx, i: usize, want: Want, out: &mut Vec<Endpoint>) {
    let e = &ctx.objects.endpoints[i];
    if e.meta.label(SKIP_MIRROR_LABEL) == Some("true") {
        return;
    }
    let source: Arc<str> = format!("Endpoints {}/{}", e.meta.namespace.v, e.meta.name.v).into();
    for ss in &e.subsets {
        let Some(port) = port_for(&ss.ports, want) else {
            continue;
        };
        for (addrs, ready) in [(&ss.addresses, true), (&ss.not_ready, false)] {
            for a in addrs {
                let Some(ip) = parse_ip(&a.ip.v) else {
                    continue;
                };
                out.push(Endpoint {
                    ip,
                    port,
                    addr: join_host_port(&ip, port).into(),
                    other_addresses: Vec::new(),
                    node_name: a.node_name.as_ref().map(|n| ctx.names.get(&n.v)),
                    zone: None,
                    hostname: a.hostname.as_ref().map(|h| h.v.clone()),
                    ready,
                    serving: ready,
                    terminating: false,
                    hint_zones: vec![],
                    hint_nodes: vec![],
                    source: source.clone(),
                    copies: Vec::new(),
                });
            }
        }
    }
}

fn from_pods(
    ctx: &Ctx,
    svc: &Service,
    port: Option<&crate::k8s::Port>,
    pods: &[&Pod],
    out: &mut Vec<Endpoint>,
) {
    // trafficDistribution: the controller hints each endpoint for its own zone (and,
    // PreferSameNode, its own node); kube-proxy reads only those hints.
    let distribution = svc.traffic_distribution.as_ref().map(|t| t.v.as_str());
    let zone_hints = matches!(
        distribution,
        Some("PreferClose" | "PreferSameZone" | "PreferSameNode")
    );
    let node_hints = distribution == Some("PreferSameNode");
    for pod in pods {
        if matches!(pod.phase.as_deref(), Some("Succeeded" | "Failed")) {
            continue;
        }
        let tp = match port {
            // A service without ports: the pod, whatever it listens on.
            None => 0,
            Some(port) => {
                let proto = protocol_of(port.protocol.as_ref().map(|p| p.v.as_str()));
                let target = match &port.target_port {
                    None => port.port.as_ref().map(|p| p.v),
                    Some(t) => match &t.v {
                        IntOrString::Int(n) => Some(*n),
                        IntOrString::Str(name) => pod
                            .container_ports
                            .iter()
                            .find(|c| {
                                c.name.as_deref() == Some(name)
                                    && protocol_of(Some(&c.protocol)) == proto
                            })
                            .map(|c| c.port),
                    },
                };
                let Some(tp) = target
                    .and_then(|t| u16::try_from(t).ok())
                    .filter(|t| *t != 0)
                else {
                    continue;
                };
                tp
            }
        };
        // The controller's podToEndpoint: serving is the pod's Ready condition; ready is
        // serving and not terminating, or publishNotReadyAddresses.
        let terminating = pod.meta.deletion_timestamp;
        let serving = pod.ready;
        let ready = svc.publish_not_ready_addresses || (serving && !terminating);
        let node_name = pod.node_name.as_ref().map(|n| ctx.names.get(&n.v));
        // The controller's ShouldSetHostname: the pod names this service as its subdomain.
        let hostname = pod.hostname.as_ref().map(|h| h.v.clone()).filter(|h| {
            !h.is_empty()
                && pod.subdomain.as_ref().map(|d| d.v.as_str()) == Some(svc.meta.name.v.as_str())
        });
        let zone = node_name
            .as_deref()
            .and_then(|n| ctx.node_zone.get(n))
            .map(|z| ctx.names.get(z));
        for ip in &pod.pod_ips {
            let Some(ip) = parse_ip(&ip.v) else { continue };
            out.push(Endpoint {
                ip,
                port: tp,
                addr: join_host_port(&ip, tp).into(),
                other_addresses: Vec::new(),
                hint_zones: zone
                    .iter()
                    .filter(|_| zone_hints)
                    .map(|z| z.to_string())
                    .collect(),
                hint_nodes: node_name
                    .iter()
                    .filter(|_| node_hints)
                    .map(|n| n.to_string())
                    .collect(),
                zone: zone.clone(),
                node_name: node_name.clone(),
                hostname: hostname.clone(),
                ready,
                serving,
                terminating,
                source: format!("Pod {}/{}", pod.meta.namespace.v, pod.meta.name.v).into(),
                copies: Vec::new(),
            });
        }
    }
}

/// kube-proxy's order (the string `ip:port`) and merge (non-terminating wins).
fn sort_dedup(eps: Vec<Endpoint>) -> Vec<Endpoint> {
    let mut keyed: Vec<(HostPort, Endpoint)> = eps
        .into_iter()
        .map(|e| (HostPort::new(&e.ip, e.port), e))
        .collect();
    keyed.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(a.1.terminating.cmp(&b.1.terminating))
            .then(a.1.source.cmp(&b.1.source))
    });
    let mut out: Vec<(HostPort, Endpoint)> = Vec::with_capacity(keyed.len());
    for (key, e) in keyed {
        match out.last_mut() {
            Some((k, first)) if *k == key => first.copies.push(e),
            _ => out.push((key, e)),
        }
    }
    out.into_iter().map(|(_, e)| e).collect()
}

#[cfg(test)]
mod tests {
    use crate::ir::{Endpoint, Module};
    use crate::source::SourceMap;

    fn module(yaml: &str) -> Module {
        let mut sources = SourceMap::default();
        let f = sources.add("t.yaml", yaml);
        let c = crate::compile(
            &sources,
            &[f],
            &crate::Options {
                allocate: true,
                ..Default::default()
            },
        );
        assert!(!c.diags.has_errors(), "{:?}", c.diags.items);
        c.module
    }

    fn eps(m: &Module, port: usize) -> Vec<&Endpoint> {
        m.services[0].ports[port].endpoints.iter().collect()
    }

    const SVC: &str =
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  selector: {app: web}\n";

    fn pod(name: &str, ip: &str, node: &str, ready: bool, extra_meta: &str) -> String {
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{app: web}}{extra_meta}}}\nspec:\n  nodeName: {node}\n  containers:\n  - name: c\n    ports: [{{name: http, containerPort: 8080}}, {{name: dns, containerPort: 5353, protocol: UDP}}]\nstatus:\n  podIPs: [{{ip: {ip}}}]\n  conditions: [{{type: Ready, status: \"{}\"}}]\n",
            if ready { "True" } else { "False" }
        )
    }

    #[test]
    fn pods_give_endpoints_like_the_endpointslice_controller() {
        let y = format!(
            "{SVC}  ports:\n  - {{name: a, port: 80, targetPort: http}}\n  - {{name: b, port: 53, targetPort: dns, protocol: UDP}}\n  - {{name: c, port: 81, targetPort: nope}}\n{}{}{}{}",
            pod("p1", "10.0.0.1", "n1", true, ""),
            pod("p2", "10.0.0.2", "n1", false, ""),
            pod("p3", "10.0.0.3", "n2", true, ", deletionTimestamp: \"2026-01-01T00:00:00Z\""),
            // Another label: not selected.
            pod("p4", "10.0.0.4", "n1", true, "").replace("app: web", "app: other"),
        );
        let m = module(&y);
        let a = eps(&m, 0);
        let got: Vec<(String, u16, bool, bool, bool)> = a
            .iter()
            .map(|e| (e.ip.to_string(), e.port, e.ready, e.serving, e.terminating))
            .collect();
        assert_eq!(
            got,
            [
                ("10.0.0.1".into(), 8080, true, true, false),
                ("10.0.0.2".into(), 8080, false, false, false),
                ("10.0.0.3".into(), 8080, false, true, true),
            ]
        );
        // Named target ports are matched by name and protocol.
        assert_eq!(
            eps(&m, 1).iter().map(|e| e.port).collect::<Vec<_>>(),
            [5353; 3]
        );
        // A name no container has: no endpoint.
        assert!(eps(&m, 2).is_empty());
    }

    /// Every address of a slice endpoint is kept: the first as the endpoint (kube-proxy),
    /// the others, without repeats or bad ones, for Cilium.
    #[test]
    fn every_address_of_a_slice_endpoint_is_kept() {
        let svc = format!("{SVC}  ports: [{{port: 80, targetPort: 8080}}]\n");
        let slice = "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints:\n- addresses: [10.0.0.2, 10.0.0.3, 10.0.0.2, 10.0.0.4]\n";
        let m = module(&format!("{svc}{slice}"));
        let e = eps(&m, 0);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].ip.to_string(), "10.0.0.2");
        let others: Vec<String> = e[0].other_addresses.iter().map(|a| a.to_string()).collect();
        assert_eq!(others, ["10.0.0.3", "10.0.0.4"]);
    }

    #[test]
    fn hostnames_come_from_slices_endpoints_and_pods_under_the_subdomain() {
        let host = |h: &str, sub: &str| {
            pod("p", "10.0.0.1", "n1", true, "").replace(
                "  nodeName: n1\n",
                &format!("  nodeName: n1\n  hostname: {h}\n  subdomain: {sub}\n"),
            )
        };
        let svc = format!("{SVC}  ports: [{{port: 80, targetPort: 8080}}]\n");
        let m = module(&format!("{svc}{}", host("web-0", "web")));
        assert_eq!(eps(&m, 0)[0].hostname.as_deref(), Some("web-0"));
        // The controller sets the hostname only when the subdomain names the service.
        let m = module(&format!("{svc}{}", host("web-0", "other")));
        assert_eq!(eps(&m, 0)[0].hostname, None);
        let slice = "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints:\n- addresses: [10.0.0.2]\n  hostname: from-slice\n";
        let m = module(&format!("{svc}{slice}"));
        assert_eq!(eps(&m, 0)[0].hostname.as_deref(), Some("from-slice"));
        let y = "apiVersion: v1\nkind: Service\nmetadata: {name: ext}\nspec:\n  ports: [{port: 80}]\n---\napiVersion: v1\nkind: Endpoints\nmetadata: {name: ext}\nsubsets:\n- addresses: [{ip: 192.0.2.2, hostname: from-endpoints}]\n  ports: [{port: 80}]\n";
        assert_eq!(
            eps(&module(y), 0)[0].hostname.as_deref(),
            Some("from-endpoints")
        );
    }

    #[test]
    fn publish_not_ready_addresses_makes_every_pod_ready() {
        let y = format!(
            "{SVC}  publishNotReadyAddresses: true\n  ports: [{{port: 80, targetPort: 8080}}]\n{}{}",
            pod("p1", "10.0.0.1", "n1", false, ""),
            pod("p2", "10.0.0.2", "n1", true, ", deletionTimestamp: \"2026-01-01T00:00:00Z\""),
        );
        let m = module(&y);
        let got: Vec<(bool, bool, bool)> = eps(&m, 0)
            .iter()
            .map(|e| (e.ready, e.serving, e.terminating))
            .collect();
        assert_eq!(got, [(true, false, false), (true, true, true)]);
    }

    #[test]
    fn traffic_distribution_hints_pods_for_their_zone_and_node() {
        let nodes = "---\napiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {topology.kubernetes.io/zone: za}}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n2, labels: {topology.kubernetes.io/zone: zb}}\n";
        for (td, zones, nodes_hinted) in
            [("PreferClose", true, false), ("PreferSameNode", true, true)]
        {
            let y = format!(
                "{SVC}  trafficDistribution: {td}\n  ports: [{{port: 80, targetPort: 8080}}]\n{}{}{nodes}",
                pod("p1", "10.0.0.1", "n1", true, ""),
                pod("p2", "10.0.0.2", "n2", true, ""),
            );
            let m = module(&y);
            let e = eps(&m, 0);
            assert_eq!(e[0].zone.as_deref(), Some("za"));
            assert_eq!(
                e[0].hint_zones,
                if zones {
                    vec!["za".to_string()]
                } else {
                    vec![]
                }
            );
            assert_eq!(
                e[1].hint_nodes,
                if nodes_hinted {
                    vec!["n2".to_string()]
                } else {
                    vec![]
                }
            );
        }
    }

    #[test]
    fn endpoints_are_mirrored_for_services_without_selector() {
        let y = "apiVersion: v1\nkind: Service\nmetadata: {name: ext}\nspec:\n  ports: [{name: h, port: 80}]\n---\napiVersion: v1\nkind: Endpoints\nmetadata: {name: ext}\nsubsets:\n- addresses: [{ip: 192.0.2.2}, {ip: 192.0.2.10}]\n  notReadyAddresses: [{ip: 192.0.2.3}]\n  ports: [{name: h, port: 9376}]\n";
        let m = module(y);
        let got: Vec<(String, bool)> = eps(&m, 0)
            .iter()
            .map(|e| (crate::net::join_host_port(&e.ip, e.port), e.ready))
            .collect();
        // kube-proxy's order: the string `ip:port`.
        assert_eq!(
            got,
            [
                ("192.0.2.10:9376".into(), true),
                ("192.0.2.2:9376".into(), true),
                ("192.0.2.3:9376".into(), false)
            ]
        );
        let skipped = y.replace(
            "metadata: {name: ext}\nsubsets",
            "metadata: {name: ext, labels: {endpointslice.kubernetes.io/skip-mirror: \"true\"}}\nsubsets",
        );
        assert!(eps(&module(&skipped), 0).is_empty());
    }

    #[test]
    fn duplicate_endpoints_merge_with_the_non_terminating_one_winning() {
        let slice = |name: &str, term: bool| {
            format!("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{port: 8080}}]\nendpoints:\n- addresses: [10.0.0.1]\n  conditions: {{ready: {}, serving: true, terminating: {term}}}\n", !term)
        };
        let y = format!(
            "{SVC}  ports: [{{port: 80, targetPort: 8080}}]\n{}{}",
            slice("a", true),
            slice("b", false)
        );
        let e = eps(&module(&y), 0).into_iter().cloned().collect::<Vec<_>>();
        assert_eq!(e.len(), 1);
        assert!(!e[0].terminating && e[0].ready);
    }

    #[test]
    fn duplicate_endpoints_keep_the_other_copies_for_the_node_pass() {
        let slice = |name: &str, node: &str| {
            format!("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{port: 8080}}]\nendpoints:\n- addresses: [10.0.0.1]\n  nodeName: {node}\n")
        };
        let y = format!(
            "{SVC}  ports: [{{port: 80, targetPort: 8080}}]\n{}{}",
            slice("b", "n2"),
            slice("a", "n1")
        );
        let e = eps(&module(&y), 0).into_iter().cloned().collect::<Vec<_>>();
        assert_eq!(e.len(), 1);
        // The first by source keeps the place; the other copy rides along.
        assert_eq!(e[0].node_name.as_deref(), Some("n1"));
        let copies: Vec<_> = e[0].copies.iter().map(|c| c.node_name.as_deref()).collect();
        assert_eq!(copies, [Some("n2")]);
    }

    #[test]
    fn named_ports_of_sidecars_count_but_not_of_plain_init_containers() {
        let pod = |policy: &str| {
            format!("---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p, labels: {{app: web}}}}\nspec:\n  nodeName: n1\n  initContainers:\n  - name: proxy\n    {policy}\n    ports: [{{name: http, containerPort: 15001}}]\n  containers:\n  - name: app\nstatus:\n  podIPs: [{{ip: 10.0.0.1}}]\n  conditions: [{{type: Ready, status: \"True\"}}]\n")
        };
        let svc = format!("{SVC}  ports: [{{port: 80, targetPort: http}}]\n");
        let m = module(&format!("{svc}{}", pod("restartPolicy: Always")));
        assert_eq!(
            eps(&m, 0).iter().map(|e| e.port).collect::<Vec<_>>(),
            [15001]
        );
        let m = module(&format!("{svc}{}", pod("image: x")));
        assert!(eps(&m, 0).is_empty());
    }
}
