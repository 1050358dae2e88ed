//! `svc-compile diff`: what changes between two compiled revisions, for a reviewer.
//!
//! Pure: two `ir::Module`s (and, per node and family, two `ir::NodeView`s) in, a
//! [`Report`] out, rendered as text, markdown or JSON. The CLI adds the unified diffs of
//! the compiled rulesets ([`RulesDiff`]) and does all I/O.
//!
//! Invariants: every list of the report is sorted by a stable key (service `ns/name`, port
//! name, endpoint address, node name then family), never by input order, so the same two
//! revisions give byte-identical output whatever order their files come in. A report is
//! empty exactly when nothing it looks at changed ([`Report::is_empty`]).

use crate::ir::{EndpointView, Module, NodeView, PortView, Service, TargetPort};
use crate::net::IpFamily;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `ns/name`, sorted.
    pub services_added: Vec<String>,
    pub services_removed: Vec<String>,
    pub services_changed: Vec<ServiceChange>,
    /// Only nodes with a change, by node then family.
    pub nodes: Vec<NodeChange>,
    /// With `--rules`: one per node and family whose ruleset differs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RulesDiff>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceChange {
    pub service: String,
    /// Fields that differ, in a fixed order (service fields, then ports by name).
    pub fields: Vec<FieldChange>,
    /// Endpoints gained and lost per service port (by port name), each `ip:port`, its
    /// condition when not ready, and `on NODE` when it has one.
    pub endpoints: Vec<EndpointChange>,
}

#[derive(Debug, Serialize)]
pub struct FieldChange {
    pub field: String,
    /// `-` when absent.
    pub old: String,
    pub new: String,
}

#[derive(Debug, Serialize)]
pub struct EndpointChange {
    /// The service port (`http`, or `(unnamed)`), or on a node the flow
    /// (`ns/name:port/TCP internal`).
    pub port: String,
    pub gained: Vec<String>,
    pub lost: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct NodeChange {
    pub node: String,
    pub family: &'static str,
    /// Service ports whose traffic of a kind this node forwarded before is now dropped
    /// here: a Local policy left without a local endpoint.
    pub dropped: Vec<Dropped>,
    /// Flows (internal: cluster IP; external: node ports, external and LB IPs) whose
    /// backends on this node change.
    pub backends: Vec<EndpointChange>,
}

#[derive(Debug, Serialize)]
pub struct Dropped {
    /// `ns/name:port/PROTO`.
    pub port: String,
    /// `internal` (internalTrafficPolicy: Local) or `external` (externalTrafficPolicy: Local).
    pub traffic: &'static str,
}

#[derive(Debug, Serialize)]
pub struct RulesDiff {
    pub node: String,
    pub family: &'static str,
    pub target: String,
    /// A unified diff, `---`/`+++` headers included.
    pub diff: String,
}

impl Report {
    pub fn is_empty(&self) -> bool {
        self.services_added.is_empty()
            && self.services_removed.is_empty()
            && self.services_changed.is_empty()
            && self.nodes.is_empty()
            && self.rules.is_empty()
    }
}

pub fn family_name(f: IpFamily) -> &'static str {
    match f {
        IpFamily::IPv4 => "ipv4",
        IpFamily::IPv6 => "ipv6",
    }
}

/// The cluster-wide part: services added, removed and changed.
pub fn diff_modules(old: &Module, new: &Module) -> Report {
    let key = |s: &Service| format!("{}/{}", s.namespace, s.name);
    let olds: BTreeMap<String, &Service> = old.services.iter().map(|s| (key(s), s)).collect();
    let news: BTreeMap<String, &Service> = new.services.iter().map(|s| (key(s), s)).collect();
    let mut report = Report::default();
    for (k, n) in &news {
        match olds.get(k) {
            None => report.services_added.push(k.clone()),
            Some(o) => {
                let change = diff_service(k, o, n);
                if !change.fields.is_empty() || !change.endpoints.is_empty() {
                    report.services_changed.push(change);
                }
            }
        }
    }
    report.services_removed = olds
        .keys()
        .filter(|k| !news.contains_key(*k))
        .cloned()
        .collect();
    report
}

fn join<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    let v: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(", ")
    }
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".into(), T::to_string)
}

fn port_label(name: &str) -> String {
    if name.is_empty() {
        "(unnamed)".into()
    } else {
        name.to_string()
    }
}

/// An endpoint as the report names it: its address, and its condition when not ready
/// (a change of condition is the old one lost and the new one gained).
fn endpoint_label(addr: &str, ready: bool, serving: bool, terminating: bool) -> String {
    match (ready, serving, terminating) {
        (true, _, _) => addr.to_string(),
        (false, true, true) => format!("{addr} (serving, terminating)"),
        (false, _, true) => format!("{addr} (terminating)"),
        _ => format!("{addr} (not ready)"),
    }
}

/// Every listing of the endpoints (a copy another slice lists too: each node serves its
/// own), labelled with its state and node: where it runs decides Local policies, so a move
/// is lost here and gained there. `bare`: the address without its port (port 0).
fn listed(eps: &[crate::ir::Endpoint], bare: bool) -> BTreeSet<String> {
    eps.iter()
        .flat_map(crate::ir::Endpoint::listings)
        .map(|e| {
            let addr = match bare {
                true => e.ip.to_string(),
                false => e.addr.to_string(),
            };
            let label = endpoint_label(&addr, e.ready, e.serving, e.terminating);
            match &e.node_name {
                Some(n) => format!("{label} on {n}"),
                None => label,
            }
        })
        .collect()
}

fn gained_lost(old: &BTreeSet<String>, new: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    (
        new.difference(old).cloned().collect(),
        old.difference(new).cloned().collect(),
    )
}

fn diff_service(key: &str, o: &Service, n: &Service) -> ServiceChange {
    let mut fields = Vec::new();
    let mut field = |name: &str, old: String, new: String| {
        if old != new {
            fields.push(FieldChange {
                field: name.to_string(),
                old,
                new,
            });
        }
    };
    let cluster_ips = |s: &Service| {
        if s.headless {
            "None".to_string()
        } else {
            join(&s.cluster_ips)
        }
    };
    let affinity = |s: &Service| match s.session_affinity_timeout {
        Some(t) => format!("ClientIP (timeout {t}s)"),
        None => "None".to_string(),
    };
    field("type", format!("{:?}", o.kind), format!("{:?}", n.kind));
    field("clusterIPs", cluster_ips(o), cluster_ips(n));
    field("externalName", opt(&o.external_name), opt(&n.external_name));
    field("externalIPs", join(&o.external_ips), join(&n.external_ips));
    let lb = |s: &Service| join(s.load_balancer_ingress.iter().map(|i| i.ip));
    field("loadBalancer ingress", lb(o), lb(n));
    field(
        "loadBalancerSourceRanges",
        join(&o.load_balancer_source_ranges),
        join(&n.load_balancer_source_ranges),
    );
    field(
        "externalTrafficPolicy",
        format!("{:?}", o.external_traffic_policy),
        format!("{:?}", n.external_traffic_policy),
    );
    field(
        "internalTrafficPolicy",
        format!("{:?}", o.internal_traffic_policy),
        format!("{:?}", n.internal_traffic_policy),
    );
    field("sessionAffinity", affinity(o), affinity(n));
    field(
        "healthCheckNodePort",
        opt(&o.health_check_node_port),
        opt(&n.health_check_node_port),
    );
    field(
        "topologyKeys",
        join(&o.topology_keys),
        join(&n.topology_keys),
    );
    field(
        "trafficDistribution",
        opt(&o.traffic_distribution),
        opt(&n.traffic_distribution),
    );

    // Ports by name: names are unique within a service, and only a single port may be
    // unnamed, so a renumbered port shows as a changed field, not a port removed and added.
    let ports = |s: &Service| -> BTreeMap<String, usize> {
        s.ports
            .iter()
            .enumerate()
            .map(|(i, p)| (port_label(&p.name), i))
            .collect()
    };
    let (op, np) = (ports(o), ports(n));
    let target = |t: &TargetPort| match t {
        TargetPort::Number(n) => n.to_string(),
        TargetPort::Name(s) => s.clone(),
    };
    let mut endpoints = Vec::new();
    let names: BTreeSet<&String> = op.keys().chain(np.keys()).collect();
    for name in names {
        let spec = |s: &Service, i: Option<&usize>| {
            i.map_or_else(
                || "-".to_string(),
                |&i| {
                    let p = &s.ports[i];
                    format!("{}/{}", p.port, p.protocol.as_str())
                },
            )
        };
        let (oi, ni) = (op.get(name), np.get(name));
        field(&format!("port {name}"), spec(o, oi), spec(n, ni));
        let (Some(&oi), Some(&ni)) = (oi, ni) else {
            continue;
        };
        let (a, b) = (&o.ports[oi], &n.ports[ni]);
        field(
            &format!("port {name} nodePort"),
            opt(&a.node_port),
            opt(&b.node_port),
        );
        field(
            &format!("port {name} targetPort"),
            target(&a.target_port),
            target(&b.target_port),
        );
        let (gained, lost) =
            gained_lost(&listed(&a.endpoints, false), &listed(&b.endpoints, false));
        if !gained.is_empty() || !lost.is_empty() {
            endpoints.push(EndpointChange {
                port: name.clone(),
                gained,
                lost,
            });
        }
    }
    // A service without ports (headless: its DNS records) has its endpoints all the same.
    let (gained, lost) = gained_lost(
        &listed(&o.portless_endpoints, true),
        &listed(&n.portless_endpoints, true),
    );
    if !gained.is_empty() || !lost.is_empty() {
        endpoints.push(EndpointChange {
            port: "(no ports)".into(),
            gained,
            lost,
        });
    }
    ServiceChange {
        service: key.to_string(),
        fields,
        endpoints,
    }
}

fn view_key(p: &PortView) -> String {
    format!("{}/{}", p.spn, p.protocol.as_str())
}

/// The kinds of traffic this node drops for the port because a Local policy leaves no
/// local endpoint, while the service has endpoints elsewhere.
fn dropped_here(p: &PortView) -> Vec<&'static str> {
    let mut v = Vec::new();
    if p.has_endpoints && p.internal_local && !p.has_internal_endpoints {
        v.push("internal");
    }
    if p.has_endpoints && p.externally_accessible && p.external_local && !p.has_external_endpoints {
        v.push("external");
    }
    v
}

/// The backends of a flow on this node: internal traffic (to the cluster IP) and, on an
/// externally accessible port, external traffic; each the endpoint set its policy picks.
fn flow_backends(p: &PortView) -> Vec<(&'static str, BTreeSet<String>)> {
    let set = |ix: &[u32]| -> BTreeSet<String> {
        ix.iter()
            .map(|&i| {
                let e: &EndpointView = &p.endpoints[i as usize];
                endpoint_label(&e.addr, e.ready, e.serving, e.terminating)
            })
            .collect()
    };
    let pick = |has: bool, local: bool| {
        if !has {
            BTreeSet::new()
        } else if local {
            set(&p.local_endpoints)
        } else {
            set(&p.cluster_endpoints)
        }
    };
    let mut v = vec![("internal", pick(p.has_internal_endpoints, p.internal_local))];
    if p.externally_accessible {
        v.push(("external", pick(p.has_external_endpoints, p.external_local)));
    }
    v
}

/// One node and family: `None` when nothing the report looks at changed. Ports only in
/// one view (a service or port added or removed) are in the cluster-wide part.
pub fn diff_nodes(old: &NodeView, new: &NodeView) -> Option<NodeChange> {
    let olds: BTreeMap<String, &PortView> = old.ports.iter().map(|p| (view_key(p), p)).collect();
    let mut change = NodeChange {
        node: new.node_name.clone(),
        family: family_name(new.family),
        dropped: Vec::new(),
        backends: Vec::new(),
    };
    let news: BTreeMap<String, &PortView> = new.ports.iter().map(|p| (view_key(p), p)).collect();
    for (k, n) in news {
        let Some(o) = olds.get(&k) else { continue };
        let before = dropped_here(o);
        for t in dropped_here(n) {
            if !before.contains(&t) {
                change.dropped.push(Dropped {
                    port: k.clone(),
                    traffic: t,
                });
            }
        }
        let ob: BTreeMap<_, _> = flow_backends(o).into_iter().collect();
        for (flow, nb) in flow_backends(n) {
            let empty = BTreeSet::new();
            let (gained, lost) = gained_lost(ob.get(flow).unwrap_or(&empty), &nb);
            if !gained.is_empty() || !lost.is_empty() {
                change.backends.push(EndpointChange {
                    port: format!("{k} {flow}"),
                    gained,
                    lost,
                });
            }
        }
    }
    (!change.dropped.is_empty() || !change.backends.is_empty()).then_some(change)
}

fn policy(traffic: &str) -> &'static str {
    if traffic == "internal" {
        "internalTrafficPolicy: Local"
    } else {
        "externalTrafficPolicy: Local"
    }
}

/// Plain text, one line per fact.
pub fn render_text(r: &Report) -> String {
    let mut out = String::new();
    if r.is_empty() {
        out.push_str("no changes\n");
        return out;
    }
    for s in &r.services_added {
        let _ = writeln!(out, "+ service {s}");
    }
    for s in &r.services_removed {
        let _ = writeln!(out, "- service {s}");
    }
    for s in &r.services_changed {
        let _ = writeln!(out, "~ service {}", s.service);
        for f in &s.fields {
            let _ = writeln!(out, "    {}: {} -> {}", f.field, f.old, f.new);
        }
        for e in &s.endpoints {
            let _ = writeln!(out, "    endpoints of port {}:{}", e.port, signs(e));
        }
    }
    for n in &r.nodes {
        let _ = writeln!(out, "node {} ({})", n.node, n.family);
        for d in &n.dropped {
            let _ = writeln!(
                out,
                "    ! {}: {} traffic dropped here ({}, no local endpoint left)",
                d.port,
                d.traffic,
                policy(d.traffic)
            );
        }
        for b in &n.backends {
            let _ = writeln!(out, "    {} backends:{}", b.port, signs(b));
        }
    }
    for d in &r.rules {
        let _ = writeln!(out, "rules {} ({}, {}):", d.node, d.family, d.target);
        out.push_str(&d.diff);
    }
    out
}

fn signs(e: &EndpointChange) -> String {
    let mut s = String::new();
    for g in &e.gained {
        let _ = write!(s, " +{g}");
    }
    for l in &e.lost {
        let _ = write!(s, " -{l}");
    }
    s
}

/// Markdown for a pull-request comment.
pub fn render_markdown(r: &Report) -> String {
    let mut out = String::from("### svc-compile diff\n\n");
    if r.is_empty() {
        out.push_str("No changes.\n");
        return out;
    }
    let code = |items: &[String]| -> String {
        items
            .iter()
            .map(|i| format!("`{i}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "**Services:** {} added, {} removed, {} changed\n",
        r.services_added.len(),
        r.services_removed.len(),
        r.services_changed.len()
    );
    for s in &r.services_added {
        let _ = writeln!(out, "- **added** `{s}`");
    }
    for s in &r.services_removed {
        let _ = writeln!(out, "- **removed** `{s}`");
    }
    for s in &r.services_changed {
        let _ = writeln!(out, "- **changed** `{}`", s.service);
        for f in &s.fields {
            let _ = writeln!(out, "  - {}: `{}` → `{}`", f.field, f.old, f.new);
        }
        for e in &s.endpoints {
            let _ = writeln!(out, "  - endpoints of port `{}`:{}", e.port, md_gl(e, code));
        }
    }
    for n in &r.nodes {
        let _ = writeln!(out, "\n#### Node `{}` ({})\n", n.node, n.family);
        for d in &n.dropped {
            let _ = writeln!(
                out,
                "- **{} traffic dropped** for `{}` ({}, no local endpoint left)",
                d.traffic,
                d.port,
                policy(d.traffic)
            );
        }
        for b in &n.backends {
            let _ = writeln!(out, "- backends of `{}`:{}", b.port, md_gl(b, code));
        }
    }
    if !r.rules.is_empty() {
        out.push_str("\n#### Rules\n");
        for d in &r.rules {
            let _ = write!(
                out,
                "\n<details><summary>{} ({}, {})</summary>\n\n```diff\n{}```\n\n</details>\n",
                d.node, d.family, d.target, d.diff
            );
        }
    }
    out
}

fn md_gl(e: &EndpointChange, code: impl Fn(&[String]) -> String) -> String {
    let mut s = String::new();
    if !e.gained.is_empty() {
        let _ = write!(s, " gained {}", code(&e.gained));
    }
    if !e.lost.is_empty() {
        if !e.gained.is_empty() {
            s.push(';');
        }
        let _ = write!(s, " lost {}", code(&e.lost));
    }
    s
}
