//! Cross-object rules: duplicate objects, node ports and cluster IPs the allocators would
//! refuse because another Service holds them, endpoints pointing at cluster IPs, and
//! endpoints naming a Service that is not there.
//!
//! Each rule sorts (key, span) pairs once and walks runs of equal keys, so the result does
//! not depend on input order and the cost is n·log n. The "first" of a run is the one
//! earliest in the sources; every later one is reported with it as related location.

use super::endpoints::SERVICE_NAME_LABEL;
use super::service::{service_type, Type};
use super::{ident, written_cluster_ips, Cx};
use crate::diag::Diagnostic;
use crate::k8s::{Meta, Objects, Service};
use crate::net::parse_ip;
use crate::source::Span;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

pub(super) fn check(cx: &mut Cx, o: &Objects) {
    duplicates(cx, "Service", o.services.iter().map(|s| &s.meta));
    duplicates(cx, "Endpoints", o.endpoints.iter().map(|e| &e.meta));
    duplicates(cx, "EndpointSlice", o.slices.iter().map(|s| &s.meta));
    duplicates(cx, "Node", o.nodes.iter().map(|n| &n.meta));
    duplicates(cx, "Pod", o.pods.iter().map(|p| &p.meta));
    node_ports(cx, &o.services);
    let by_ip = cluster_ips(cx, &o.services);
    endpoint_ips(cx, o, &by_ip);
    references(cx, o);
}

/// Call `f(first, later)` for every later element of each run of equal keys in sorted `v`.
fn runs<T, K: PartialEq>(v: &[T], key: impl Fn(&T) -> K, mut f: impl FnMut(&T, &T)) {
    let mut i = 0;
    while i < v.len() {
        let mut j = i + 1;
        while j < v.len() && key(&v[j]) == key(&v[i]) {
            f(&v[i], &v[j]);
            j += 1;
        }
        i = j;
    }
}

fn duplicates<'a>(cx: &mut Cx, kind: &str, metas: impl Iterator<Item = &'a Meta>) {
    let mut v: Vec<(&str, &str, Span)> = metas
        .map(|m| (m.namespace.v.as_str(), m.name.v.as_str(), m.name.span))
        .collect();
    v.sort_unstable();
    runs(
        &v,
        |e| (e.0, e.1),
        |first, dup| {
            let id = if dup.0.is_empty() {
                dup.1.to_string()
            } else {
                format!("{}/{}", dup.0, dup.1)
            };
            cx.push(
                Diagnostic::error("SVC301", format!("duplicate {kind} `{id}`"))
                    .at(dup.2)
                    .path("metadata.name")
                    .related(first.2, "first defined here")
                    .hint(format!(
                        "a {kind} is identified by namespace and name; rename or remove one of them"
                    )),
            );
        },
    );
}

struct NodePortUse {
    port: i64,
    span: Span,
    service: usize,
    /// `spec.ports[i].nodePort` or `spec.healthCheckNodePort`.
    path: String,
    health_check: bool,
}

/// The node-port allocator holds port numbers, whatever the protocol: a number belongs to
/// one Service (which may use it for several protocols).
fn node_ports(cx: &mut Cx, services: &[Service]) {
    let mut v: Vec<NodePortUse> = Vec::new();
    for (si, s) in services.iter().enumerate() {
        let ty = service_type(s);
        if !matches!(ty, Type::NodePort | Type::LoadBalancer) {
            continue;
        }
        for (pi, p) in s.ports.iter().enumerate() {
            if let Some(np) = p.node_port.as_ref().filter(|n| n.v != 0) {
                v.push(NodePortUse {
                    port: np.v,
                    span: np.span,
                    service: si,
                    path: format!("spec.ports[{pi}].nodePort"),
                    health_check: false,
                });
            }
        }
        let local = s
            .external_traffic_policy
            .as_ref()
            .is_some_and(|p| p.v == "Local");
        if let Some(h) = s.health_check_node_port.as_ref().filter(|h| h.v != 0) {
            if ty == Type::LoadBalancer && local {
                v.push(NodePortUse {
                    port: h.v,
                    span: h.span,
                    service: si,
                    path: "spec.healthCheckNodePort".into(),
                    health_check: true,
                });
            }
        }
    }
    v.sort_unstable_by_key(|u| (u.port, u.span));
    runs(
        &v,
        |u| u.port,
        |first, u| {
            if (first.service, first.health_check) == (u.service, u.health_check) {
                return;
            }
            let owner = if first.service == u.service {
                "this Service".to_string()
            } else {
                format!("Service `{}`", ident(&services[first.service].meta))
            };
            cx.push(
                Diagnostic::error(
                    "SVC302",
                    format!(
                        "node port {} is already used by {owner} ({})",
                        u.port, first.path
                    ),
                )
                .at(u.span)
                .path(u.path.clone())
                .related(first.span, "first used here")
                .hint("pick another port, or remove it to have a free one allocated"),
            );
        },
    );
}

/// Cluster IPs written on two Services. Returns, for every written IP, the first Service
/// holding it (index and span).
fn cluster_ips(cx: &mut Cx, services: &[Service]) -> HashMap<IpAddr, (usize, Span)> {
    let mut v: Vec<(IpAddr, Span, usize, String)> = Vec::new();
    for (si, s) in services.iter().enumerate() {
        if service_type(s) == Type::ExternalName {
            continue;
        }
        for (path, c) in written_cluster_ips(s) {
            if let Some(ip) = parse_ip(&c.v) {
                v.push((ip, c.span, si, path));
            }
        }
    }
    v.sort_unstable_by_key(|e| (e.0, e.1));
    runs(
        &v,
        |e| e.0,
        |first, e| {
            if first.2 == e.2 {
                return; // clusterIP repeated in clusterIPs: SVC120/SVC121 cover it
            }
            cx.push(
                Diagnostic::error(
                    "SVC303",
                    format!(
                        "cluster IP {} is already used by Service `{}`",
                        e.0,
                        ident(&services[first.2].meta)
                    ),
                )
                .at(e.1)
                .path(e.3.clone())
                .related(first.1, "first used here")
                .hint(
                    "give each Service its own cluster IP, or leave it unset to have one allocated",
                ),
            );
        },
    );
    let mut by_ip = HashMap::with_capacity(v.len());
    for (ip, span, si, _) in &v {
        by_ip.entry(*ip).or_insert((*si, *span));
    }
    by_ip
}

fn endpoint_ips(cx: &mut Cx, o: &Objects, by_ip: &HashMap<IpAddr, (usize, Span)>) {
    if by_ip.is_empty() {
        return;
    }
    let check = |cx: &mut Cx, text: &str, span: Span, path: String| {
        let Some(ip) = parse_ip(text) else { return };
        if let Some((si, cspan)) = by_ip.get(&ip) {
            cx.push(
                Diagnostic::error(
                    "SVC304",
                    format!(
                        "endpoint address {ip} is the cluster IP of Service `{}`",
                        ident(&o.services[*si].meta)
                    ),
                )
                .at(span)
                .path(path)
                .related(*cspan, "cluster IP set here")
                .hint("endpoints must be pod or node IPs; a cluster IP as a backend loops traffic through the proxy"),
            );
        }
    };
    for e in &o.endpoints {
        for (i, ss) in e.subsets.iter().enumerate() {
            for (key, list) in [
                ("addresses", &ss.addresses),
                ("notReadyAddresses", &ss.not_ready),
            ] {
                for (j, a) in list.iter().enumerate() {
                    check(
                        cx,
                        &a.ip.v,
                        a.ip.span,
                        format!("subsets[{i}].{key}[{j}].ip"),
                    );
                }
            }
        }
    }
    for s in &o.slices {
        if !s
            .address_type
            .as_ref()
            .is_some_and(|t| t.v == "IPv4" || t.v == "IPv6")
        {
            continue;
        }
        for (i, ep) in s.endpoints.iter().enumerate() {
            for (j, a) in ep.addresses.iter().enumerate() {
                check(cx, &a.v, a.span, format!("endpoints[{i}].addresses[{j}]"));
            }
        }
    }
}

fn references(cx: &mut Cx, o: &Objects) {
    let services: HashSet<(&str, &str)> = o
        .services
        .iter()
        .map(|s| (s.meta.namespace.v.as_str(), s.meta.name.v.as_str()))
        .collect();
    for e in &o.endpoints {
        let key = (e.meta.namespace.v.as_str(), e.meta.name.v.as_str());
        if !services.contains(&key) {
            cx.push(
                Diagnostic::warning(
                    "SVC305",
                    format!(
                        "Endpoints `{}` has no Service `{}` in namespace `{}`",
                        ident(&e.meta),
                        key.1,
                        key.0
                    ),
                )
                .at(e.meta.name.span)
                .path("metadata.name")
                .hint("Endpoints belong to the Service of the same namespace and name; add that Service or fix the name"),
            );
        }
    }
    for s in &o.slices {
        let Some((_, v)) = s
            .meta
            .labels
            .iter()
            .find(|(k, _)| k.v == SERVICE_NAME_LABEL)
        else {
            continue; // SVC210
        };
        let ns = s.meta.namespace.v.as_str();
        if !services.contains(&(ns, v.v.as_str())) {
            cx.push(
                Diagnostic::warning(
                    "SVC305",
                    format!(
                        "EndpointSlice `{}` names Service `{}` in namespace `{ns}`, which is not in the input",
                        ident(&s.meta),
                        v.v
                    ),
                )
                .at(v.span)
                .path(format!("metadata.labels[{SERVICE_NAME_LABEL}]"))
                .hint("the label must hold the name of a Service in the slice's namespace; add that Service or fix the label"),
            );
        }
    }
}
