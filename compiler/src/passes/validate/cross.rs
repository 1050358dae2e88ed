//! Cross-object rules: duplicate objects, node ports and cluster IPs the allocators would
//! refuse because another Service holds them, endpoints pointing at cluster IPs,
//! endpoints naming a Service that is not there, and Service ports no port of their
//! endpoints matches by name.
//!
//! Each rule sorts (key, span) pairs once and walks runs of equal keys, so the result does
//! not depend on input order and the cost is n·log n. The "first" of a run is the one
//! earliest in the sources; every later one is reported with it as related location.
//!
//! The rules that relate objects to each other (duplicates, node ports, cluster IPs, the
//! Services that Endpoints and slices name) compare them within each cluster of the
//! [`Layout`] only, under the namespace and name kustomize gives them there (its
//! `namespace`, `namePrefix`, `nameSuffix`). kustomize renames an EndpointSlice but not
//! the Service its `kubernetes.io/service-name` label names (the label is no name
//! reference in its configuration), so a prefix leaves such a slice without its Service.

use super::endpoints::SERVICE_NAME_LABEL;
use super::service::{service_type, Type};
use super::{ident, written_cluster_ips, Cx};
use crate::decode::{closest, IntOrString, Sp};
use crate::diag::Diagnostic;
use crate::ir::Protocol;
use crate::k8s::{Meta, Objects, Service, SlicePort};
use crate::layout::{Layout, Origin, Transform};
use crate::net::parse_ip;
use crate::passes::resolve::{protocol_of, SKIP_MIRROR_LABEL};
use crate::source::Span;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

pub(super) fn check(cx: &mut Cx, o: &Objects) {
    duplicates(cx, "Service", true, o.services.iter().map(|s| &s.meta));
    duplicates(cx, "Endpoints", true, o.endpoints.iter().map(|e| &e.meta));
    duplicates(cx, "EndpointSlice", true, o.slices.iter().map(|s| &s.meta));
    duplicates(cx, "Node", false, o.nodes.iter().map(|n| &n.meta));
    duplicates(cx, "Pod", true, o.pods.iter().map(|p| &p.meta));
    node_ports(cx, &o.services);
    let by_ip = cluster_ips(cx, &o.services);
    endpoint_ips(cx, o, &by_ip);
    references(cx, o);
    port_names(cx, o);
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

/// An object's namespace and name in a cluster, as kustomize writes them there.
struct Named<'a> {
    cluster: u32,
    namespace: Cow<'a, str>,
    name: Cow<'a, str>,
    renamed: bool,
}

/// `m`'s identity in each cluster its file is in (one, under its own names, without a
/// layout). `namespaced`: kustomize sets the namespace of namespaced kinds only.
fn named<'a>(layout: &'a Layout, m: &'a Meta, namespaced: bool) -> impl Iterator<Item = Named<'a>> {
    layout.of(m.name.span.file).iter().map(move |(c, t)| {
        let (namespace, name) = rename(t, m, namespaced);
        Named {
            cluster: *c,
            renamed: !t.is_identity(),
            namespace,
            name,
        }
    })
}

fn rename<'a>(t: &'a Transform, m: &'a Meta, namespaced: bool) -> (Cow<'a, str>, Cow<'a, str>) {
    if t.is_identity() {
        return (Cow::Borrowed(&m.namespace.v), Cow::Borrowed(&m.name.v));
    }
    let ns = if namespaced {
        t.namespace(&m.namespace.v)
    } else {
        &m.namespace.v
    };
    (Cow::Borrowed(ns), Cow::Owned(t.name(&m.name.v)))
}

/// " in cluster `NAME`", said where kustomize renamed the object or the input holds
/// several clusters.
fn in_cluster(layout: &Layout, c: u32, renamed: bool) -> String {
    let plain = layout
        .clusters
        .get(c as usize)
        .is_some_and(|c| c.origin == Origin::Plain);
    if renamed || (layout.clusters.len() > 1 && !plain) {
        format!(" in cluster `{}`", layout.clusters[c as usize].name)
    } else {
        String::new()
    }
}

fn duplicates<'a>(
    cx: &mut Cx,
    kind: &str,
    namespaced: bool,
    metas: impl Iterator<Item = &'a Meta>,
) {
    let layout = cx.layout;
    let mut v: Vec<(Named, Span)> = metas
        .flat_map(|m| named(layout, m, namespaced).map(|n| (n, m.name.span)))
        .collect();
    v.sort_unstable_by(|(a, sa), (b, sb)| {
        (a.cluster, &a.namespace, &a.name, sa).cmp(&(b.cluster, &b.namespace, &b.name, sb))
    });
    runs(
        &v,
        |(n, _)| (n.cluster, n.namespace.clone(), n.name.clone()),
        |(_, first), (dup, at)| {
            let id = if dup.namespace.is_empty() {
                dup.name.to_string()
            } else {
                format!("{}/{}", dup.namespace, dup.name)
            };
            let cluster = in_cluster(layout, dup.cluster, dup.renamed);
            cx.push(
                Diagnostic::error("SVC301", format!("duplicate {kind} `{id}`{cluster}"))
                    .at(*at)
                    .path("metadata.name")
                    .related(*first, "first defined here")
                    .hint(format!(
                        "a {kind} is identified by namespace and name; rename or remove one of them"
                    )),
            );
        },
    );
}

/// `m`'s `namespace/name` in cluster `c`.
fn ident_in(layout: &Layout, m: &Meta, c: u32) -> String {
    match layout.of(m.name.span.file).iter().find(|(i, _)| *i == c) {
        Some((_, t)) if !t.is_identity() => {
            let (ns, name) = rename(t, m, true);
            if ns.is_empty() {
                name.into_owned()
            } else {
                format!("{ns}/{name}")
            }
        }
        _ => ident(m),
    }
}

/// The clusters `s`'s file is in.
fn clusters_of<'a>(layout: &'a Layout, m: &Meta) -> impl Iterator<Item = u32> + 'a {
    layout.of(m.name.span.file).iter().map(|(c, _)| *c)
}

struct NodePortUse {
    cluster: u32,
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
    let layout = cx.layout;
    let mut v: Vec<NodePortUse> = Vec::new();
    for ((si, s), cluster) in services
        .iter()
        .enumerate()
        .flat_map(|(si, s)| clusters_of(layout, &s.meta).map(move |c| ((si, s), c)))
    {
        let ty = service_type(s);
        if !matches!(ty, Type::NodePort | Type::LoadBalancer) {
            continue;
        }
        for (pi, p) in s.ports.iter().enumerate() {
            if let Some(np) = p.node_port.as_ref().filter(|n| n.v != 0) {
                v.push(NodePortUse {
                    cluster,
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
                    cluster,
                    port: h.v,
                    span: h.span,
                    service: si,
                    path: "spec.healthCheckNodePort".into(),
                    health_check: true,
                });
            }
        }
    }
    v.sort_unstable_by_key(|u| (u.cluster, u.port, u.span));
    runs(
        &v,
        |u| (u.cluster, u.port),
        |first, u| {
            if (first.service, first.health_check) == (u.service, u.health_check) {
                return;
            }
            let owner = if first.service == u.service {
                "this Service".to_string()
            } else {
                format!(
                    "Service `{}`",
                    ident_in(layout, &services[first.service].meta, u.cluster)
                )
            };
            let cluster = in_cluster(layout, u.cluster, false);
            cx.push(
                Diagnostic::error(
                    "SVC302",
                    format!(
                        "node port {} is already used by {owner} ({}){cluster}",
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
    let layout = cx.layout;
    let mut v: Vec<(u32, IpAddr, Span, usize, String)> = Vec::new();
    for (si, s) in services.iter().enumerate() {
        if service_type(s) == Type::ExternalName {
            continue;
        }
        for (path, c) in written_cluster_ips(s) {
            if let Some(ip) = parse_ip(&c.v) {
                for cluster in clusters_of(layout, &s.meta) {
                    v.push((cluster, ip, c.span, si, path.clone()));
                }
            }
        }
    }
    v.sort_unstable_by_key(|e| (e.0, e.1, e.2));
    runs(
        &v,
        |e| (e.0, e.1),
        |first, e| {
            if first.3 == e.3 {
                return; // clusterIP repeated in clusterIPs: SVC120/SVC121 cover it
            }
            cx.push(
                Diagnostic::error(
                    "SVC303",
                    format!(
                        "cluster IP {} is already used by Service `{}`{}",
                        e.1,
                        ident_in(layout, &services[first.3].meta, e.0),
                        in_cluster(layout, e.0, false)
                    ),
                )
                .at(e.2)
                .path(e.4.clone())
                .related(first.2, "first used here")
                .hint(
                    "give each Service its own cluster IP, or leave it unset to have one allocated",
                ),
            );
        },
    );
    let mut by_ip = HashMap::with_capacity(v.len());
    for (_, ip, span, si, _) in &v {
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
    let layout = cx.layout;
    let services: HashSet<(u32, Cow<str>, Cow<str>)> = o
        .services
        .iter()
        .flat_map(|s| {
            named(layout, &s.meta, true).map(|n| (layout.related(n.cluster), n.namespace, n.name))
        })
        .collect();
    for e in &o.endpoints {
        for n in named(layout, &e.meta, true) {
            let cluster = in_cluster(layout, n.cluster, n.renamed);
            let key = (layout.related(n.cluster), n.namespace, n.name);
            if services.contains(&key) {
                continue;
            }
            cx.push(
                Diagnostic::warning(
                    "SVC305",
                    format!(
                        "Endpoints `{}` has no Service `{}` in namespace `{}`{cluster}",
                        ident(&e.meta),
                        key.2,
                        key.1
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
        for n in named(layout, &s.meta, true) {
            // The label is not renamed: kustomize does not read it as a reference.
            let key = (
                layout.related(n.cluster),
                n.namespace,
                Cow::Borrowed(v.v.as_str()),
            );
            if services.contains(&key) {
                continue;
            }
            let (ns, cluster) = (&key.1, in_cluster(layout, n.cluster, n.renamed));
            cx.push(
                Diagnostic::warning(
                    "SVC305",
                    format!(
                        "EndpointSlice `{}` names Service `{}` in namespace `{ns}`, which is not in the input{cluster}",
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

/// Where a Service's endpoints come from, as kube-proxy sees them: one EndpointSlice, or
/// one subset of the Endpoints the mirroring controller copies into slices.
struct Source<'a> {
    /// ``EndpointSlice `ns/name` `` or ``Endpoints `ns/name` ``, for messages.
    what: String,
    /// The path of its ports (`ports`, `subsets[0].ports`).
    path: String,
    ports: &'a [SlicePort],
    /// Where to point when it has no port for the Service's.
    name_span: Span,
}

/// One port of a [`Source`], with the (name, protocol) kube-proxy keys it by.
struct Listed<'a> {
    source: &'a Source<'a>,
    index: usize,
    port: &'a SlicePort,
    key: (&'a str, Protocol),
}

/// kube-proxy matches a slice's ports to a Service's ports by name and protocol
/// (`EndpointSliceCache.endpointInfoByServicePort` keys endpoints by `ServicePortName`: the
/// slice port's name and protocol; pkg/proxy/endpointslicecache.go) and never reads
/// `targetPort`. The EndpointSlice controller names slice ports after the Service's ports
/// (`getEndpointPorts`), the mirroring controller copies an Endpoints subset's ports as
/// they are (`epPortsToEpsPorts`). A Service port whose name and protocol no port of its
/// slices (with endpoints) has gets no endpoints: kube-proxy rejects its traffic. Warned
/// where the endpoints are in the input as resolve reads them (slices; Endpoints of a
/// Service without a selector); endpoints the controller would make from Pods match by
/// construction. Headless and ExternalName Services are not kube-proxy's.
fn port_names(cx: &mut Cx, o: &Objects) {
    let mut slices: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (i, s) in o.slices.iter().enumerate() {
        let ip = s
            .address_type
            .as_ref()
            .is_some_and(|t| t.v == "IPv4" || t.v == "IPv6");
        // The controller's placeholder slice has no endpoints (and no ports).
        let has_endpoints = s.endpoints.iter().any(|e| !e.addresses.is_empty());
        if let (true, true, Some(svc)) = (ip, has_endpoints, s.meta.label(SERVICE_NAME_LABEL)) {
            slices
                .entry((&s.meta.namespace.v, svc))
                .or_default()
                .push(i);
        }
    }
    let mut endpoints: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, e) in o.endpoints.iter().enumerate() {
        endpoints
            .entry((&e.meta.namespace.v, &e.meta.name.v))
            .or_insert(i);
    }
    for svc in &o.services {
        if svc.ports.is_empty()
            || super::service::is_headless(svc)
            || matches!(service_type(svc), Type::ExternalName | Type::Unknown)
        {
            continue;
        }
        let key = (svc.meta.namespace.v.as_str(), svc.meta.name.v.as_str());
        let mut sources: Vec<Source> = Vec::new();
        for &i in slices.get(&key).into_iter().flatten() {
            let s = &o.slices[i];
            sources.push(Source {
                what: format!("EndpointSlice `{}`", ident(&s.meta)),
                path: "ports".into(),
                ports: &s.ports,
                name_span: s.meta.name.span,
            });
        }
        let has_selector = svc.selector.as_ref().is_some_and(|s| !s.is_empty());
        let mirrored = endpoints
            .get(&key)
            .map(|&i| &o.endpoints[i])
            .filter(|e| !has_selector && e.meta.label(SKIP_MIRROR_LABEL) != Some("true"));
        if let Some(e) = mirrored {
            for (i, ss) in e.subsets.iter().enumerate() {
                if ss.addresses.is_empty() && ss.not_ready.is_empty() {
                    continue;
                }
                sources.push(Source {
                    what: format!("Endpoints `{}`", ident(&e.meta)),
                    path: format!("subsets[{i}].ports"),
                    ports: &ss.ports,
                    name_span: e.meta.name.span,
                });
            }
        }
        if sources.is_empty() {
            continue;
        }
        let wanted: Vec<(&str, Protocol)> = svc
            .ports
            .iter()
            .map(|p| key_of(p.name.as_ref(), p.protocol.as_ref()))
            .collect();
        let listed: Vec<Listed> = sources
            .iter()
            .flat_map(|source| {
                source
                    .ports
                    .iter()
                    .enumerate()
                    .map(move |(index, port)| Listed {
                        source,
                        index,
                        port,
                        key: key_of(port.name.as_ref(), port.protocol.as_ref()),
                    })
            })
            .collect();
        for (pi, (port, &want)) in svc.ports.iter().zip(&wanted).enumerate() {
            if !listed.iter().any(|l| l.key == want) {
                let orphans: Vec<&Listed> =
                    listed.iter().filter(|l| !wanted.contains(&l.key)).collect();
                let meant = meant_for(port, want, &orphans);
                cx.push(unmatched(svc, pi, want, &listed, meant, &sources[0]));
            }
        }
    }
}

/// The port of the endpoints meant for Service port `port` (keyed `want`), of those that
/// serve no Service port: by its number (the target port) and protocol, by its name (then
/// only the protocol differs), by a name a typo away, by its protocol, or the first.
fn meant_for<'a>(
    port: &crate::k8s::Port,
    want: (&str, Protocol),
    orphans: &[&'a Listed<'a>],
) -> Option<&'a Listed<'a>> {
    let target = match port.target_port.as_ref().map(|t| &t.v) {
        None | Some(IntOrString::Int(0)) => port.port.as_ref().map(|p| p.v),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::Str(_)) => None,
    };
    let names: Vec<&str> = orphans.iter().map(|l| l.key.0).collect();
    let near = closest(want.0, &names).filter(|n| !n.is_empty() && !want.0.is_empty());
    let number = |l: &Listed| target.is_some() && l.port.port.as_ref().map(|p| p.v) == target;
    let find = |f: &dyn Fn(&Listed) -> bool| orphans.iter().copied().find(|l| f(l));
    find(&|l| l.key.1 == want.1 && number(l))
        .or_else(|| find(&|l| l.key.0 == want.0))
        .or_else(|| find(&|l| Some(l.key.0) == near && l.key.1 == want.1))
        .or_else(|| find(&|l| Some(l.key.0) == near))
        .or_else(|| find(&|l| l.key.1 == want.1))
        .or_else(|| orphans.first().copied())
}

/// SVC325 for port `pi` of `svc`: at the port `meant` for it, else at the Service port.
fn unmatched(
    svc: &Service,
    pi: usize,
    want: (&str, Protocol),
    listed: &[Listed],
    meant: Option<&Listed>,
    first: &Source,
) -> Diagnostic {
    let port = &svc.ports[pi];
    let number = |p: &Option<Sp<i64>>| p.as_ref().map(|p| p.v);
    let mine = port_desc(want.0, want.1, number(&port.port));
    let mut theirs: Vec<String> = listed
        .iter()
        .map(|l| port_desc(l.key.0, l.key.1, number(&l.port.port)))
        .collect();
    theirs.sort();
    theirs.dedup();
    let list = match theirs.len() {
        0 => "no ports".to_string(),
        n if n > 6 => format!("{} and {} more", theirs[..6].join(", "), n - 6),
        _ => theirs.join(", "),
    };
    let message = format!(
        "Service `{}` port {mine}: no port of its endpoints has its name and protocol (they list {list}), so kube-proxy finds no endpoint for it and rejects its traffic",
        ident(&svc.meta)
    );
    let svc_path = format!("spec.ports[{pi}]");
    let svc_span = port.name.as_ref().map_or(port.span, |n| n.span);
    let Some(l) = meant else {
        return Diagnostic::warning("SVC325", message)
            .at(svc_span)
            .path(match port.name {
                Some(_) => format!("{svc_path}.name"),
                None => svc_path,
            })
            .related(first.name_span, format!("{} lists no port {mine}", first.what))
            .hint(format!("add the port to {}, with the Service port's name and protocol: kube-proxy pairs them by name and protocol (the EndpointSlice controller leaves a port out where no Pod has the container port a named targetPort names)", first.what));
    };
    let (name, proto) = l.key;
    let theirs = port_desc(name, proto, number(&l.port.port));
    let what = &l.source.what;
    let fix = if proto != want.1 && name == want.0 {
        format!(
            "set the protocol of port {theirs} of {what} to {}, the Service port's",
            want.1.as_str()
        )
    } else if proto != want.1 {
        let name = match want.0 {
            "" => "none".to_string(),
            n => format!("`{n}`"),
        };
        format!(
            "give port {theirs} of {what} the Service port's name ({name}) and protocol ({})",
            want.1.as_str()
        )
    } else if want.0.is_empty() {
        format!("the Service port has no name: remove the name of port {theirs} of {what}, or name the Service port `{name}`")
    } else {
        format!(
            "rename port {theirs} of {what} to `{}`, the Service port's name",
            want.0
        )
    };
    let field = if l.port.name.is_some() { ".name" } else { "" };
    Diagnostic::warning("SVC325", message)
        .at(l.port.name.as_ref().map_or(l.port.span, |n| n.span))
        .path(format!("{}[{}]{field}", l.source.path, l.index))
        .related(svc_span, format!("the Service port ({svc_path})"))
        .hint(format!("kube-proxy pairs a slice's ports with the Service's by name and protocol, never by number; {fix}"))
}

/// `` `http` (80/TCP) ``, or `80/TCP (unnamed)`.
fn port_desc(name: &str, proto: Protocol, port: Option<i64>) -> String {
    let number = port.map_or(String::new(), |p| format!("{p}/"));
    if name.is_empty() {
        format!("{number}{} (unnamed)", proto.as_str())
    } else {
        format!("`{name}` ({number}{})", proto.as_str())
    }
}

/// A port's (name, protocol) as kube-proxy keys it: no name is `""`, no protocol TCP.
fn key_of<'a>(name: Option<&'a Sp<String>>, proto: Option<&Sp<String>>) -> (&'a str, Protocol) {
    (
        name.map_or("", |n| n.v.as_str()),
        protocol_of(proto.map(|p| p.v.as_str())),
    )
}
