//! Endpoint resolution: Service ↔ EndpointSlices (label `kubernetes.io/service-name`),
//! Endpoints (mirrored into slices the way the mirroring controller does, for services
//! without a selector) and Pods (selected the way the EndpointSlice controller does, for
//! services whose slices are not in the input).
//!
//! The result per service port is sorted by the string `ip:port` and deduplicated, a
//! non-terminating endpoint winning over a terminating one (kube-proxy's order and merge).

use crate::decode::IntOrString;
use crate::ir::{Endpoint, Protocol};
use crate::k8s::{Objects, Pod, Service};
use crate::net::{parse_ip, HostPort};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

/// Endpoints per service (index into `objects.services`) per port (spec order).
pub type Resolved = Vec<Vec<Vec<Endpoint>>>;

pub fn protocol_of(s: Option<&str>) -> Protocol {
    match s {
        Some("UDP") => Protocol::UDP,
        Some("SCTP") => Protocol::SCTP,
        _ => Protocol::TCP,
    }
}

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";

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
    let mut pods_by_ns: HashMap<&str, Vec<&Pod>> = HashMap::new();
    for p in &objects.pods {
        pods_by_ns.entry(&p.meta.namespace.v).or_default().push(p);
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
            svc.ports
                .iter()
                .map(|port| {
                    let pname = port.name.as_ref().map_or("", |n| n.v.as_str());
                    let proto = protocol_of(port.protocol.as_ref().map(|p| p.v.as_str()));
                    let mut out = Vec::new();
                    let slices = slices_by_svc.get(&key);
                    for &i in slices.into_iter().flatten() {
                        from_slice(&ctx, i, pname, proto, &mut out);
                    }
                    if !has_selector {
                        if let Some(&i) = eps_by_name.get(&key) {
                            from_endpoints(&ctx, i, pname, proto, &mut out);
                        }
                    } else if slices.is_none() {
                        let pods = pods_by_ns.get(key.0).map_or(&[][..], |v| v.as_slice());
                        from_pods(&ctx, svc, port, proto, pods, &mut out);
                    }
                    sort_dedup(out)
                })
                .collect()
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

fn from_slice(ctx: &Ctx, i: usize, pname: &str, proto: Protocol, out: &mut Vec<Endpoint>) {
    let s = &ctx.objects.slices[i];
    if s.address_type.as_ref().is_some_and(|t| t.v == "FQDN") {
        return;
    }
    // kube-proxy matches slice ports by (name, protocol); nil name or port is skipped.
    let Some(sp) = s.ports.iter().find(|p| {
        p.name.as_ref().map_or("", |n| n.v.as_str()) == pname
            && protocol_of(p.protocol.as_ref().map(|x| x.v.as_str())) == proto
    }) else {
        return;
    };
    let Some(port) = sp
        .port
        .as_ref()
        .and_then(|p| u16::try_from(p.v).ok())
        .filter(|p| *p != 0)
    else {
        return;
    };
    let source: Arc<str> = format!("EndpointSlice {}/{}", s.meta.namespace.v, s.meta.name.v).into();
    for e in &s.endpoints {
        // Only addresses[0] is used.
        let Some(ip) = e.addresses.first().and_then(|a| parse_ip(&a.v)) else {
            continue;
        };
        out.push(Endpoint {
            ip,
            port,
            node_name: e.node_name.as_ref().map(|n| ctx.names.get(&n.v)),
            zone: e.zone.as_ref().map(|z| ctx.names.get(&z.v)),
            ready: e.ready.unwrap_or(true),
            serving: e.serving.unwrap_or(true),
            terminating: e.terminating.unwrap_or(false),
            hint_zones: e.hint_zones.clone(),
            hint_nodes: e.hint_nodes.clone(),
            source: source.clone(),
        });
    }
}

fn from_endpoints(ctx: &Ctx, i: usize, pname: &str, proto: Protocol, out: &mut Vec<Endpoint>) {
    let e = &ctx.objects.endpoints[i];
    if e.meta.label(SKIP_MIRROR_LABEL) == Some("true") {
        return;
    }
    let source: Arc<str> = format!("Endpoints {}/{}", e.meta.namespace.v, e.meta.name.v).into();
    for ss in &e.subsets {
        let Some(port) = ss
            .ports
            .iter()
            .find(|p| {
                p.name.as_ref().map_or("", |n| n.v.as_str()) == pname
                    && protocol_of(p.protocol.as_ref().map(|x| x.v.as_str())) == proto
            })
            .and_then(|p| p.port.as_ref())
            .and_then(|p| u16::try_from(p.v).ok())
            .filter(|p| *p != 0)
        else {
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
                    node_name: a.node_name.as_ref().map(|n| ctx.names.get(&n.v)),
                    zone: None,
                    ready,
                    serving: ready,
                    terminating: false,
                    hint_zones: vec![],
                    hint_nodes: vec![],
                    source: source.clone(),
                });
            }
        }
    }
}

fn from_pods(
    ctx: &Ctx,
    svc: &Service,
    port: &crate::k8s::Port,
    proto: Protocol,
    pods: &[&Pod],
    out: &mut Vec<Endpoint>,
) {
    let Some(sel) = &svc.selector else { return };
    for pod in pods {
        if !sel
            .iter()
            .all(|(k, v)| pod.meta.label(&k.v) == Some(v.v.as_str()))
        {
            continue;
        }
        if matches!(pod.phase.as_deref(), Some("Succeeded" | "Failed")) {
            continue;
        }
        let target = match &port.target_port {
            None => port.port.as_ref().map(|p| p.v),
            Some(t) => match &t.v {
                IntOrString::Int(n) => Some(*n),
                IntOrString::Str(name) => pod
                    .container_ports
                    .iter()
                    .find(|c| {
                        c.name.as_deref() == Some(name) && protocol_of(Some(&c.protocol)) == proto
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
        let terminating = pod.meta.deletion_timestamp;
        let ready = pod.ready && !terminating;
        let node_name = pod.node_name.as_ref().map(|n| ctx.names.get(&n.v));
        for ip in &pod.pod_ips {
            let Some(ip) = parse_ip(&ip.v) else { continue };
            out.push(Endpoint {
                ip,
                port: tp,
                zone: node_name
                    .as_deref()
                    .and_then(|n| ctx.node_zone.get(n))
                    .map(|z| ctx.names.get(z)),
                node_name: node_name.clone(),
                ready: ready || (svc.publish_not_ready_addresses && !terminating),
                serving: pod.ready || svc.publish_not_ready_addresses,
                terminating,
                hint_zones: vec![],
                hint_nodes: vec![],
                source: format!("Pod {}/{}", pod.meta.namespace.v, pod.meta.name.v).into(),
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
    keyed.dedup_by(|later, first| later.0 == first.0);
    keyed.into_iter().map(|(_, e)| e).collect()
}
