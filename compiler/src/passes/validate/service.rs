//! Service rules: `ValidateService`, `validateServicePort`, the cluster-IP/family rules and
//! what the node-port and cluster-IP allocators refuse for a single Service.

use super::{
    check_labels, check_meta, ident, names, seen_before, special_ip, written_cluster_ips, Cx,
};
use crate::decode::{IntOrString, Sp};
use crate::diag::Diagnostic;
use crate::k8s::Service;
use crate::net::{parse_ip, Cidr, IpFamily};
use crate::source::Span;
use std::collections::HashMap;
use std::net::IpAddr;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Type {
    ClusterIP,
    NodePort,
    LoadBalancer,
    ExternalName,
    /// An unsupported value, already reported; type-specific rules are skipped.
    Unknown,
}

pub(super) fn service_type(s: &Service) -> Type {
    match s.type_.as_ref().map(|t| t.v.as_str()) {
        None | Some("") | Some("ClusterIP") => Type::ClusterIP,
        Some("NodePort") => Type::NodePort,
        Some("LoadBalancer") => Type::LoadBalancer,
        Some("ExternalName") => Type::ExternalName,
        Some(_) => Type::Unknown,
    }
}

pub(super) fn is_headless(s: &Service) -> bool {
    s.cluster_ip.as_ref().is_some_and(|c| c.v == "None")
        || s.cluster_ips.first().is_some_and(|c| c.v == "None")
}

const TYPES: &[&str] = &["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"];
const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const MAX_AFFINITY_SECONDS: i64 = 86400;
const MAX_TOPOLOGY_KEYS: usize = 16;
pub(super) const LB_SOURCE_RANGES_ANNOTATION: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";

pub(super) fn check(cx: &mut Cx, s: &Service) {
    check_meta(cx, &s.meta, "Service", true);
    if let Some(t) = &s.type_ {
        if !t.v.is_empty() {
            cx.one_of("SVC105", t, TYPES, "Service type", "spec.type");
        }
    }
    let ty = service_type(s);
    let headless = is_headless(s);
    ports(cx, s, ty, headless);
    if let Some(sel) = &s.selector {
        check_labels(cx, sel, "spec.selector", "selector");
    }
    if ty == Type::ExternalName {
        external_name(cx, s);
    } else {
        cluster_ips(cx, s, headless);
    }
    if headless && matches!(ty, Type::NodePort | Type::LoadBalancer) {
        let c = s
            .cluster_ip
            .as_ref()
            .filter(|c| c.v == "None")
            .or(s.cluster_ips.first())
            .expect("headless has a None cluster IP");
        let t = s
            .type_
            .as_ref()
            .expect("NodePort or LoadBalancer is written");
        cx.push(
            Diagnostic::error(
                "SVC128",
                format!("clusterIP may not be `None` for {} Services", t.v),
            )
            .at(c.span)
            .path(if s.cluster_ips.is_empty() {
                "spec.clusterIP"
            } else {
                "spec.clusterIPs[0]"
            })
            .related(t.span, "type set here")
            .hint("a headless Service has no virtual IP to expose; use type ClusterIP, or remove `clusterIP: None`"),
        );
    }
    load_balancer_fields(cx, s, ty);
    traffic_policies(cx, s, ty);
    affinity(cx, s);
    external_ips(cx, s);
    source_ranges(cx, s, ty);
    lb_status(cx, s, ty);
    topology_keys(cx, s);
    if let Some(td) = &s.traffic_distribution {
        cx.one_of(
            "SVC149",
            td,
            &["PreferClose", "PreferSameZone", "PreferSameNode"],
            "trafficDistribution",
            "spec.trafficDistribution",
        );
    }
}

/// `loadBalancerClass` and `allocateLoadBalancerNodePorts` "may only be used when `type`
/// is 'LoadBalancer'"; a class is a qualified name (`example.com/internal-lb`).
fn load_balancer_fields(cx: &mut Cx, s: &Service, ty: Type) {
    let type_span = s.type_.as_ref().map(|t| t.span);
    let forbid = |cx: &mut Cx, span: Span, field: &str| {
        let mut d = Diagnostic::error(
            "SVC151",
            format!("`{field}` may only be used when `type` is LoadBalancer"),
        )
        .at(span)
        .path(format!("spec.{field}"))
        .hint(format!(
            "remove `{field}`, or make the Service type LoadBalancer"
        ));
        if let Some(t) = type_span {
            d = d.related(t, "type set here");
        }
        cx.push(d);
    };
    if ty != Type::LoadBalancer {
        if let Some(c) = &s.load_balancer_class {
            forbid(cx, c.span, "loadBalancerClass");
        }
        if let Some(span) = s.allocate_lb_node_ports_span {
            forbid(cx, span, "allocateLoadBalancerNodePorts");
        }
    } else if let Some(c) = &s.load_balancer_class {
        if let Err(e) = names::qualified_name(&c.v) {
            cx.push(
                Diagnostic::error(
                    "SVC151",
                    format!("invalid loadBalancerClass `{}`: {e}", c.v),
                )
                .at(c.span)
                .path("spec.loadBalancerClass")
                .hint("a class is `[prefix/]name`, e.g. `example.com/internal-lb`"),
            );
        }
    }
}

/// `appProtocol` (Service, EndpointSlice and Endpoints ports) is a qualified name: an IANA
/// service name such as `http`, or `prefix/name` such as `kubernetes.io/h2c`.
pub(super) fn app_protocol(cx: &mut Cx, code: &'static str, a: &Sp<String>, path: String) {
    if let Err(e) = names::qualified_name(&a.v) {
        cx.push(
            Diagnostic::error(code, format!("invalid appProtocol `{}`: {e}", a.v))
                .at(a.span)
                .path(path)
                .hint("use an IANA service name (http, grpc) or a `domain/name` such as kubernetes.io/h2c"),
        );
    }
}

fn in_range(v: i64, lo: i64, hi: i64) -> bool {
    (lo..=hi).contains(&v)
}

fn ports(cx: &mut Cx, s: &Service, ty: Type, headless: bool) {
    if s.ports.is_empty() && !headless && ty != Type::ExternalName {
        cx.push(
            Diagnostic::error(
                "SVC106",
                format!("Service `{}` has no ports", ident(&s.meta)),
            )
            .at(s.ports_span.unwrap_or(s.meta.name.span))
            .path("spec.ports")
            .hint("add `ports: [{port: 80, targetPort: 8080}]`; only headless (`clusterIP: None`) and ExternalName Services may have none"),
        );
    }
    let multi = s.ports.len() > 1;
    let (lo, hi) = cx.settings.node_port_range;
    let mut names_seen: HashMap<&str, Span> = HashMap::new();
    let mut ports_seen: HashMap<(i64, &str), Span> = HashMap::new();
    let mut node_ports_seen: HashMap<(i64, &str), Span> = HashMap::new();
    for (i, p) in s.ports.iter().enumerate() {
        let path = |f: &str| format!("spec.ports[{i}].{f}");
        let proto = p.protocol.as_ref().map_or("TCP", |x| x.v.as_str());
        if let Some(a) = &p.app_protocol {
            app_protocol(cx, "SVC150", a, path("appProtocol"));
        }
        match p.name.as_ref().filter(|n| !n.v.is_empty()) {
            None if multi => cx.push(
                Diagnostic::error(
                    "SVC107",
                    "port needs a name: the Service has more than one port",
                )
                .at(p.name.as_ref().map_or(p.span, |n| n.span))
                .path(path("name"))
                .hint("name every port of a multi-port Service, e.g. `name: http`"),
            ),
            None => {}
            Some(n) => {
                if let Err(e) = names::dns1123_label(&n.v) {
                    let mut d =
                        Diagnostic::error("SVC108", format!("invalid port name `{}`: {e}", n.v))
                            .at(n.span)
                            .path(path("name"));
                    if let Some(sug) = names::suggest_label(&n.v, false) {
                        d = d.hint(format!("try `{sug}`"));
                    }
                    cx.push(d);
                }
                if let Some(first) = seen_before(&mut names_seen, n.v.as_str(), n.span) {
                    cx.push(
                        Diagnostic::error("SVC109", format!("duplicate port name `{}`", n.v))
                            .at(n.span)
                            .path(path("name"))
                            .related(first, "first used here")
                            .hint("port names must be unique within a Service"),
                    );
                }
            }
        }
        match &p.port {
            // Written with the wrong type: decoding reported it (SVC004).
            None if p.port_written => {}
            None => cx.push(
                Diagnostic::error("SVC110", "port without `port`")
                    .at(p.span)
                    .path(path("port"))
                    .hint("`port` is the number clients connect to, e.g. `port: 80`"),
            ),
            Some(n) if !in_range(n.v, 1, 65535) => cx.push(
                Diagnostic::error(
                    "SVC110",
                    format!("port {} is out of range: must be between 1 and 65535", n.v),
                )
                .at(n.span)
                .path(path("port")),
            ),
            Some(n) => {
                if let Some(first) = seen_before(&mut ports_seen, (n.v, proto), n.span) {
                    cx.push(
                        Diagnostic::error(
                            "SVC111",
                            format!("duplicate port {}/{proto}", n.v),
                        )
                        .at(n.span)
                        .path(path("port"))
                        .related(first, "first used here")
                        .hint("each (port, protocol) pair may appear once; remove one or change its port"),
                    );
                }
            }
        }
        if let Some(pr) = &p.protocol {
            cx.one_of("SVC112", pr, PROTOCOLS, "protocol", path("protocol"));
        }
        if let Some(tp) = &p.target_port {
            target_port(cx, tp, &path("targetPort"));
        }
        let Some(np) = p.node_port.as_ref().filter(|n| n.v != 0) else {
            continue;
        };
        match ty {
            Type::ClusterIP | Type::ExternalName => {
                let tname = s.type_.as_ref().map_or("ClusterIP", |t| t.v.as_str());
                cx.push(
                    Diagnostic::error(
                        "SVC115",
                        format!("nodePort may not be used when type is {tname}"),
                    )
                    .at(np.span)
                    .path(path("nodePort"))
                    .hint("set `type: NodePort` (or LoadBalancer) to expose the port on every node, or remove `nodePort`"),
                );
            }
            Type::NodePort | Type::LoadBalancer => {
                if !in_range(np.v, lo as i64, hi as i64) {
                    cx.push(
                        Diagnostic::error(
                            "SVC116",
                            format!(
                                "nodePort {} is not in the valid range {lo}-{hi}",
                                np.v
                            ),
                        )
                        .at(np.span)
                        .path(path("nodePort"))
                        .hint(format!(
                            "pick a port in {lo}-{hi} (--service-node-port-range), or remove `nodePort` to have one allocated"
                        )),
                    );
                }
                if let Some(first) = seen_before(&mut node_ports_seen, (np.v, proto), np.span) {
                    cx.push(
                        Diagnostic::error(
                            "SVC117",
                            format!("duplicate nodePort {}/{proto}", np.v),
                        )
                        .at(np.span)
                        .path(path("nodePort"))
                        .related(first, "first used here")
                        .hint("give each port its own nodePort, or remove it to have one allocated"),
                    );
                }
            }
            Type::Unknown => {}
        }
    }
}

fn target_port(cx: &mut Cx, tp: &Sp<IntOrString>, path: &str) {
    match &tp.v {
        // 0 and "" are defaulted to `port`.
        IntOrString::Int(0) => {}
        IntOrString::Int(n) if !in_range(*n, 1, 65535) => cx.push(
            Diagnostic::error(
                "SVC113",
                format!("targetPort {n} is out of range: must be between 1 and 65535"),
            )
            .at(tp.span)
            .path(path),
        ),
        IntOrString::Int(_) => {}
        IntOrString::Str(s) if s.is_empty() => {}
        IntOrString::Str(s) => {
            if let Err(e) = names::iana_svc_name(s) {
                let hint = if s.parse::<u16>().is_ok() {
                    format!(
                        "a quoted number is a port name; write `targetPort: {s}` without quotes"
                    )
                } else {
                    "a named targetPort must match a container port name: at most 15 lower case letters, digits and '-'".into()
                };
                cx.push(
                    Diagnostic::error("SVC114", format!("invalid targetPort name `{s}`: {e}"))
                        .at(tp.span)
                        .path(path)
                        .hint(hint),
                );
            }
        }
    }
}

fn family_of_cidrs(cidrs: &[Cidr], f: IpFamily) -> Option<&Cidr> {
    cidrs.iter().find(|c| c.family() == f)
}

fn cluster_ips(cx: &mut Cx, s: &Service, headless: bool) {
    let cip = s.cluster_ip.as_ref().filter(|c| !c.v.is_empty());
    if let (Some(c), Some(first)) = (cip, s.cluster_ips.first()) {
        if first.v != c.v {
            cx.push(
                Diagnostic::error(
                    "SVC120",
                    format!("clusterIPs[0] `{}` must match clusterIP `{}`", first.v, c.v),
                )
                .at(first.span)
                .path("spec.clusterIPs[0]")
                .related(c.span, "clusterIP set here")
                .hint("write the same address in both, or drop `clusterIP` and keep `clusterIPs`"),
            );
        }
    }
    let list = written_cluster_ips(s);
    let mut ips: Vec<(usize, IpAddr)> = Vec::new();
    let mut bad = false;
    for (i, (path, c)) in list.iter().enumerate() {
        if c.v == "None" {
            if i != 0 || list.len() > 1 {
                bad = true;
                cx.push(
                    Diagnostic::error("SVC121", "`None` must be the first and only cluster IP")
                        .at(c.span)
                        .path(path.clone())
                        .hint("a headless Service has `clusterIP: None` and no other cluster IP"),
                );
            }
            continue;
        }
        match parse_ip(&c.v) {
            Some(ip) => ips.push((i, ip)),
            None => {
                bad = true;
                let hint = if c.v.eq_ignore_ascii_case("none") {
                    "write `None` with a capital N for a headless Service".to_string()
                } else {
                    let range = cx
                        .settings
                        .service_cidrs
                        .iter()
                        .map(|c| c.to_string())
                        .collect::<Vec<_>>()
                        .join(", ");
                    format!("use an address in {range}, `None` for a headless Service, or leave it unset to have one allocated")
                };
                cx.push(
                    Diagnostic::error(
                        "SVC118",
                        format!("cluster IP `{}` is not a valid IP address", c.v),
                    )
                    .at(c.span)
                    .path(path.clone())
                    .hint(hint),
                );
            }
        }
    }
    if s.cluster_ips.len() > 2 {
        cx.push(
            Diagnostic::error("SVC121", "clusterIPs may hold at most 2 addresses")
                .at(s.cluster_ips[2].span)
                .path("spec.clusterIPs")
                .hint("give at most one IPv4 and one IPv6 address"),
        );
    } else if let [(_, a), (j, b)] = ips[..] {
        if IpFamily::of(&a) == IpFamily::of(&b) {
            cx.push(
                Diagnostic::error(
                    "SVC121",
                    "clusterIPs may hold no more than one IP of each family",
                )
                .at(list[j].1.span)
                .path(list[j].0.clone())
                .hint("a dual-stack Service has one IPv4 and one IPv6 cluster IP"),
            );
        }
    }

    // ipFamilies and ipFamilyPolicy on their own.
    let mut fams: Vec<Option<IpFamily>> = Vec::new();
    for (i, f) in s.ip_families.iter().enumerate() {
        let path = format!("spec.ipFamilies[{i}]");
        let fam = IpFamily::parse(&f.v);
        if fam.is_none() {
            cx.one_of("SVC122", f, &["IPv4", "IPv6"], "IP family", path.clone());
        }
        if fam.is_some() && fams.contains(&fam) {
            cx.push(
                Diagnostic::error("SVC122", format!("duplicate IP family `{}`", f.v))
                    .at(f.span)
                    .path(path)
                    .hint("list each family once; a dual-stack Service lists IPv4 and IPv6"),
            );
        }
        fams.push(fam);
    }
    if s.ip_families.len() > 2 {
        cx.push(
            Diagnostic::error("SVC122", "ipFamilies may hold at most 2 families")
                .at(s.ip_families[2].span)
                .path("spec.ipFamilies"),
        );
    }
    const POLICIES: &[&str] = &["SingleStack", "PreferDualStack", "RequireDualStack"];
    let policy = s.ip_family_policy.as_ref().filter(|p| {
        cx.one_of(
            "SVC123",
            p,
            POLICIES,
            "ipFamilyPolicy",
            "spec.ipFamilyPolicy",
        )
    });
    if bad {
        return;
    }

    // Consistency: cluster IPs against ipFamilies, policy against counts and the cluster.
    if !headless {
        for &(i, ip) in &ips {
            if let Some(Some(f)) = fams.get(i) {
                if *f != IpFamily::of(&ip) {
                    cx.push(
                        Diagnostic::error(
                            "SVC124",
                            format!(
                                "cluster IP `{ip}` is not {} as `ipFamilies[{i}]` says",
                                f.as_str()
                            ),
                        )
                        .at(list[i].1.span)
                        .path(list[i].0.clone())
                        .related(s.ip_families[i].span, "family set here")
                        .hint("order ipFamilies like the cluster IPs, or fix the address"),
                    );
                }
            }
        }
    }
    let two_ips = list.len() == 2;
    let two_fams = s.ip_families.len() == 2;
    if let Some(p) = policy.filter(|p| p.v == "SingleStack") {
        if two_ips || two_fams {
            let what = if two_ips {
                "two cluster IPs"
            } else {
                "two IP families"
            };
            cx.push(
                Diagnostic::error(
                    "SVC124",
                    format!("ipFamilyPolicy SingleStack with {what}"),
                )
                .at(p.span)
                .path("spec.ipFamilyPolicy")
                .hint("use PreferDualStack or RequireDualStack for a dual-stack Service, or keep one family"),
            );
        }
    }
    let settings = cx.settings;
    let cidrs = &settings.service_cidrs;
    let dual_cluster = family_of_cidrs(cidrs, IpFamily::IPv4).is_some()
        && family_of_cidrs(cidrs, IpFamily::IPv6).is_some();
    let require_dual = match policy {
        Some(p) => p.v == "RequireDualStack",
        None => two_ips || two_fams,
    };
    // The allocator's special case: a headless Service without a selector gets every
    // family it asks for, even on a single-stack cluster (no IP is allocated for it).
    let selectorless_headless = headless && s.selector.as_ref().is_none_or(|sel| sel.is_empty());
    let dual_refused = require_dual && !dual_cluster && !selectorless_headless;
    if dual_refused {
        let (span, path) = match policy {
            Some(p) => (p.span, "spec.ipFamilyPolicy".to_string()),
            None if two_fams => (s.ip_families[1].span, "spec.ipFamilies[1]".to_string()),
            None => (list[1].1.span, list[1].0.clone()),
        };
        cx.push(
            Diagnostic::error(
                "SVC124",
                "this cluster is not configured for dual-stack Services",
            )
            .at(span)
            .path(path)
            .hint("configure a service CIDR for each family (--service-cluster-ip-range or ClusterConfig), or use SingleStack/PreferDualStack"),
        );
    }
    // Each family asked for must be configured (headless Services with a selector too);
    // a refused RequireDualStack above already names this mistake.
    if !selectorless_headless && !dual_refused {
        for (i, f) in fams.iter().enumerate() {
            if let Some(f) = f {
                if family_of_cidrs(cidrs, *f).is_none() {
                    cx.push(
                        Diagnostic::error(
                            "SVC124",
                            format!("IP family {} is not configured on this cluster", f.as_str()),
                        )
                        .at(s.ip_families[i].span)
                        .path(format!("spec.ipFamilies[{i}]"))
                        .hint(format!(
                            "add a {} service CIDR (--service-cluster-ip-range or ClusterConfig), or remove this family",
                            f.as_str()
                        )),
                    );
                }
            }
        }
    }
    for &(i, ip) in &ips {
        let fam = IpFamily::of(&ip);
        let (path, c) = &list[i];
        match family_of_cidrs(cidrs, fam) {
            Some(range) if range.contains(&ip) => {
                // The allocator never hands out the network address (nor IPv4 broadcast).
                let edge = if range.prefix + 1 >= fam.bits() {
                    None
                } else if ip == range.network().addr {
                    Some("network")
                } else if fam == IpFamily::IPv4 && ip == range.nth(range.size() - 1) {
                    Some("broadcast")
                } else {
                    None
                };
                if let Some(edge) = edge {
                    cx.push(
                        Diagnostic::error(
                            "SVC119",
                            format!("cluster IP {ip} is the {edge} address of the service range {range}"),
                        )
                        .at(c.span)
                        .path(path.clone())
                        .hint("the API server never allocates it; pick another address in the range"),
                    );
                }
            }
            Some(range) => cx.push(
                Diagnostic::error(
                    "SVC119",
                    format!("cluster IP {ip} is not in the service range {range}"),
                )
                .at(c.span)
                .path(path.clone())
                .hint(if *cidrs == crate::passes::Settings::default().service_cidrs {
                    // The default is kubeadm's; many clusters differ (docs/config.md "The service range").
                    format!("use an address inside {range}, or leave clusterIP unset to have one allocated; {range} is svc-compile's default (kubeadm's): pass your cluster's --service-cluster-ip-range if it differs")
                } else {
                    format!("use an address inside {range}, or leave clusterIP unset to have one allocated")
                }),
            ),
            None => cx.push(
                Diagnostic::error(
                    "SVC119",
                    format!(
                        "cluster IP {ip} is {}, but this cluster has no {} service range",
                        fam.as_str(),
                        fam.as_str()
                    ),
                )
                .at(c.span)
                .path(path.clone())
                .hint(
                    "use an address of a configured family, or add a service CIDR for this family",
                ),
            ),
        }
    }
}

fn external_name(cx: &mut Cx, s: &Service) {
    let forbid = |cx: &mut Cx, span: Span, path: &str, what: &str| {
        cx.push(
            Diagnostic::error(
                "SVC127",
                format!("{what} may not be set for ExternalName Services"),
            )
            .at(span)
            .path(path)
            .hint("an ExternalName Service is a DNS CNAME with no cluster IP; remove this field"),
        );
    };
    if let Some(c) = s.cluster_ip.as_ref().filter(|c| !c.v.is_empty()) {
        forbid(cx, c.span, "spec.clusterIP", "clusterIP");
    } else if let Some(c) = s.cluster_ips.first() {
        forbid(cx, c.span, "spec.clusterIPs", "clusterIPs");
    }
    if let Some(f) = s.ip_families.first() {
        forbid(cx, f.span, "spec.ipFamilies", "ipFamilies");
    }
    if let Some(p) = &s.ip_family_policy {
        forbid(cx, p.span, "spec.ipFamilyPolicy", "ipFamilyPolicy");
    }
    let Some(n) = s.external_name.as_ref().filter(|n| !n.v.is_empty()) else {
        cx.push(
            Diagnostic::error("SVC125", "ExternalName Service without `externalName`")
                .at(s.type_.as_ref().map_or(s.meta.name.span, |t| t.span))
                .path("spec.externalName")
                .hint("add `externalName: db.example.com`, the DNS name this Service aliases"),
        );
        return;
    };
    let cname = n.v.strip_suffix('.').unwrap_or(&n.v);
    match names::dns1123_subdomain(cname) {
        Err(e) => {
            let hint = if parse_ip(cname).is_some() {
                "externalName is a DNS name; for an IP, use a Service without selector and an EndpointSlice"
            } else {
                "use a lower-case DNS name such as `db.example.com`"
            };
            cx.push(
                Diagnostic::error("SVC125", format!("invalid externalName `{}`: {e}", n.v))
                    .at(n.span)
                    .path("spec.externalName")
                    .hint(hint),
            );
        }
        Ok(()) if parse_ip(cname).is_some() => cx.push(
            Diagnostic::warning(
                "SVC126",
                format!("externalName `{}` is an IP address", n.v),
            )
            .at(n.span)
            .path("spec.externalName")
            .hint("cluster DNS does not resolve it (CoreDNS answers only names; `--target dns` writes no record for it); use a Service without selector and an EndpointSlice for an IP"),
        ),
        Ok(()) => {}
    }
}

fn traffic_policies(cx: &mut Cx, s: &Service, ty: Type) {
    let reachable = matches!(ty, Type::NodePort | Type::LoadBalancer)
        || (ty == Type::ClusterIP && !s.external_ips.is_empty());
    let etp = s
        .external_traffic_policy
        .as_ref()
        .filter(|p| !p.v.is_empty());
    if let Some(p) = etp {
        if !reachable && ty != Type::Unknown {
            cx.push(
                Diagnostic::error(
                    "SVC130",
                    "externalTrafficPolicy may only be set for externally reachable Services",
                )
                .at(p.span)
                .path("spec.externalTrafficPolicy")
                .hint("it applies to type NodePort or LoadBalancer, or to Services with externalIPs; remove it, or use internalTrafficPolicy for in-cluster traffic"),
            );
        } else {
            cx.one_of(
                "SVC129",
                p,
                &["Cluster", "Local"],
                "externalTrafficPolicy",
                "spec.externalTrafficPolicy",
            );
        }
    }
    if let Some(p) = &s.internal_traffic_policy {
        cx.one_of(
            "SVC131",
            p,
            &["Cluster", "Local"],
            "internalTrafficPolicy",
            "spec.internalTrafficPolicy",
        );
    }
    if let Some(h) = s.health_check_node_port.as_ref().filter(|h| h.v != 0) {
        let needs = ty == Type::LoadBalancer && etp.is_some_and(|p| p.v == "Local");
        let (lo, hi) = cx.settings.node_port_range;
        if !needs {
            if ty != Type::Unknown {
                cx.push(
                    Diagnostic::error(
                        "SVC132",
                        "healthCheckNodePort may only be set when type is LoadBalancer and externalTrafficPolicy is Local",
                    )
                    .at(h.span)
                    .path("spec.healthCheckNodePort")
                    .hint("remove healthCheckNodePort, or set `type: LoadBalancer` and `externalTrafficPolicy: Local`"),
                );
            }
        } else if !in_range(h.v, lo as i64, hi as i64) {
            cx.push(
                Diagnostic::error(
                    "SVC133",
                    format!(
                        "healthCheckNodePort {} is not in the valid range {lo}-{hi}",
                        h.v
                    ),
                )
                .at(h.span)
                .path("spec.healthCheckNodePort")
                .hint(format!(
                    "pick a port in {lo}-{hi}, or remove it to have one allocated"
                )),
            );
        }
    }
}

fn affinity(cx: &mut Cx, s: &Service) {
    let mut client_ip = false;
    let mut valid = true;
    if let Some(a) = s.session_affinity.as_ref().filter(|a| !a.v.is_empty()) {
        valid = cx.one_of(
            "SVC134",
            a,
            &["None", "ClientIP"],
            "sessionAffinity",
            "spec.sessionAffinity",
        );
        client_ip = a.v == "ClientIP";
    }
    let Some(t) = &s.affinity_timeout else { return };
    let path = "spec.sessionAffinityConfig.clientIP.timeoutSeconds";
    if !client_ip {
        if valid {
            let mut d = Diagnostic::error(
                "SVC136",
                "sessionAffinityConfig may only be set when sessionAffinity is ClientIP",
            )
            .at(t.span)
            .path(path)
            .hint("add `sessionAffinity: ClientIP`, or remove sessionAffinityConfig");
            if let Some(a) = &s.session_affinity {
                d = d.related(a.span, "sessionAffinity set here");
            }
            cx.push(d);
        }
    } else if !in_range(t.v, 1, MAX_AFFINITY_SECONDS) {
        cx.push(
            Diagnostic::error(
                "SVC135",
                format!(
                    "timeoutSeconds {} is out of range: must be between 1 and {MAX_AFFINITY_SECONDS}",
                    t.v
                ),
            )
            .at(t.span)
            .path(path)
            .hint("the default is 10800 (3 hours); the maximum is 86400 (1 day)"),
        );
    }
}

fn external_ips(cx: &mut Cx, s: &Service) {
    for (i, e) in s.external_ips.iter().enumerate() {
        let path = format!("spec.externalIPs[{i}]");
        match parse_ip(&e.v) {
            None => {
                let hint = if e.v.contains('/') {
                    "write a single address, not a CIDR"
                } else {
                    "write an IP address such as 203.0.113.10"
                };
                cx.push(
                    Diagnostic::error(
                        "SVC137",
                        format!("external IP `{}` is not a valid IP address", e.v),
                    )
                    .at(e.span)
                    .path(path)
                    .hint(hint),
                );
            }
            Some(ip) => {
                if let Some(why) = special_ip(&ip) {
                    cx.push(
                        Diagnostic::error("SVC138", format!("external IP {ip} {why}"))
                            .at(e.span)
                            .path(path)
                            .hint(
                                "external IPs must be addresses routed to the nodes from outside",
                            ),
                    );
                }
            }
        }
    }
}

fn cidr_error(cx: &mut Cx, text: &str, span: Span, path: String) {
    if let Err(e) = super::parse_cidr(text.trim()) {
        let hint = if parse_ip(text.trim()).is_some() {
            format!("add a prefix length, e.g. `{}/32`", text.trim())
        } else {
            "write ADDRESS/PREFIX, e.g. 203.0.113.0/24".into()
        };
        cx.push(
            Diagnostic::error(
                "SVC139",
                format!("load-balancer source range `{text}` is not a valid CIDR: {e}"),
            )
            .at(span)
            .path(path)
            .hint(hint),
        );
    }
}

fn source_ranges(cx: &mut Cx, s: &Service, ty: Type) {
    let not_lb = |cx: &mut Cx, span: Span, path: &str| {
        if !matches!(ty, Type::LoadBalancer | Type::Unknown) {
            cx.push(
                Diagnostic::error(
                    "SVC140",
                    "load-balancer source ranges may only be used when type is LoadBalancer",
                )
                .at(span)
                .path(path)
                .hint("set `type: LoadBalancer`, or remove the source ranges"),
            );
        }
    };
    if let Some(first) = s.load_balancer_source_ranges.first() {
        not_lb(cx, first.span, "spec.loadBalancerSourceRanges");
        for (i, r) in s.load_balancer_source_ranges.iter().enumerate() {
            cidr_error(
                cx,
                &r.v,
                r.span,
                format!("spec.loadBalancerSourceRanges[{i}]"),
            );
        }
    } else if let Some(a) = s.meta.annotation(LB_SOURCE_RANGES_ANNOTATION) {
        let path = format!("metadata.annotations[{LB_SOURCE_RANGES_ANNOTATION}]");
        not_lb(cx, a.span, &path);
        let v = a.v.trim();
        if !v.is_empty() {
            for part in v.split(',') {
                cidr_error(cx, part.trim(), a.span, path.clone());
            }
        }
    }
}

fn lb_status(cx: &mut Cx, s: &Service, ty: Type) {
    if s.lb_ingress.is_empty() {
        return;
    }
    let span_of = |g: &crate::k8s::LbIngress| {
        g.ip.as_ref()
            .or(g.hostname.as_ref())
            .or(g.ip_mode.as_ref())
            .map(|x| x.span)
    };
    if !matches!(ty, Type::LoadBalancer | Type::Unknown) {
        cx.push(
            Diagnostic::warning(
                "SVC143",
                "status.loadBalancer.ingress may only be set when type is LoadBalancer",
            )
            .at(s
                .lb_ingress
                .iter()
                .find_map(span_of)
                .unwrap_or(s.meta.name.span))
            .path("status.loadBalancer.ingress")
            .hint("the API server drops status when it creates the Service; svc-compile leaves it out: set `type: LoadBalancer`, or remove the status"),
        );
        return;
    }
    for (i, g) in s.lb_ingress.iter().enumerate() {
        let path = |f: &str| format!("status.loadBalancer.ingress[{i}].{f}");
        let ip = g.ip.as_ref().filter(|x| !x.v.is_empty());
        if let Some(ip) = ip {
            if parse_ip(&ip.v).is_none() {
                cx.push(
                    Diagnostic::warning(
                        "SVC141",
                        format!(
                            "load-balancer ingress ip `{}` is not a valid IP address",
                            ip.v
                        ),
                    )
                    .at(ip.span)
                    .path(path("ip"))
                    .hint("put host names in `hostname`, addresses in `ip`"),
                );
            }
        }
        if let Some(h) = g.hostname.as_ref().filter(|x| !x.v.is_empty()) {
            let err = if parse_ip(&h.v).is_some() {
                Some("must be a DNS name, not an IP address".to_string())
            } else {
                names::dns1123_subdomain(&h.v).err()
            };
            if let Some(e) = err {
                cx.push(
                    Diagnostic::warning(
                        "SVC141",
                        format!("invalid load-balancer ingress hostname `{}`: {e}", h.v),
                    )
                    .at(h.span)
                    .path(path("hostname"))
                    .hint("put addresses in `ip`, DNS names in `hostname`"),
                );
            }
        }
        if let Some(m) = &g.ip_mode {
            if ip.is_none() {
                cx.push(
                    Diagnostic::warning("SVC142", "ipMode may not be set when `ip` is not set")
                        .at(m.span)
                        .path(path("ipMode"))
                        .hint("add the load balancer's `ip`, or remove ipMode"),
                );
            } else if !matches!(m.v.as_str(), "VIP" | "Proxy") {
                cx.push(
                    Diagnostic::warning(
                        "SVC142",
                        format!("unsupported ipMode `{}`: must be one of VIP, Proxy", m.v),
                    )
                    .at(m.span)
                    .path(path("ipMode"))
                    .hint("read as VIP (the default); the API server drops status when it creates the Service"),
                );
            }
        }
    }
}

fn topology_keys(cx: &mut Cx, s: &Service) {
    let keys = &s.topology_keys;
    if keys.is_empty() {
        return;
    }
    let span = s.topology_keys_span.unwrap_or(keys[0].span);
    cx.push(
        Diagnostic::warning(
            "SVC154",
            "spec.topologyKeys was removed in Kubernetes 1.22: a current kube-proxy ignores it and picks endpoints by hints and trafficDistribution",
        )
        .at(span)
        .path("spec.topologyKeys")
        .hint("svc-compile honours it (kube-proxy 1.17-1.21); `--topology-keys ignore` (or ClusterConfig `topologyKeys: ignore`) compiles as a current kube-proxy; trafficDistribution: PreferClose replaces it"),
    );
    if let Some(p) = s
        .external_traffic_policy
        .as_ref()
        .filter(|p| p.v == "Local")
    {
        cx.push(
            Diagnostic::error(
                "SVC148",
                "topologyKeys may not be set when externalTrafficPolicy is Local",
            )
            .at(span)
            .path("spec.topologyKeys")
            .related(p.span, "externalTrafficPolicy set here")
            .hint("the two features are incompatible on one Service; remove one of them"),
        );
    }
    if keys.len() > MAX_TOPOLOGY_KEYS {
        cx.push(
            Diagnostic::error(
                "SVC144",
                format!(
                    "too many topologyKeys: {} (at most {MAX_TOPOLOGY_KEYS})",
                    keys.len()
                ),
            )
            .at(keys[MAX_TOPOLOGY_KEYS].span)
            .path("spec.topologyKeys")
            .hint("keep the most specific keys, ending with \"*\" if any endpoint may do"),
        );
    }
    let mut seen: HashMap<&str, Span> = HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        let path = format!("spec.topologyKeys[{i}]");
        if let Some(first) = seen_before(&mut seen, k.v.as_str(), k.span) {
            cx.push(
                Diagnostic::error("SVC146", format!("duplicate topology key `{}`", k.v))
                    .at(k.span)
                    .path(path.clone())
                    .related(first, "first listed here"),
            );
        }
        if k.v == "*" {
            if i + 1 != keys.len() {
                cx.push(
                    Diagnostic::error("SVC147", "\"*\" must be the last topology key")
                        .at(k.span)
                        .path(path)
                        .hint("keys after \"*\" are never used; move \"*\" to the end"),
                );
            }
        } else if let Err(e) = names::qualified_name(&k.v) {
            cx.push(
                Diagnostic::error("SVC145", format!("invalid topology key `{}`: {e}", k.v))
                    .at(k.span)
                    .path(path)
                    .hint("topology keys are node label keys such as `topology.kubernetes.io/zone`, or \"*\""),
            );
        }
    }
}
