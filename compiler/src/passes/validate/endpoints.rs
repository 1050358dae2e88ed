//! Endpoints (`ValidateEndpoints`) and EndpointSlice (`discovery/validation`) rules.

use super::{check_meta, names, seen_before, special_ip, Cx};
use crate::decode::Sp;
use crate::diag::Diagnostic;
use crate::k8s::{EndpointSlice, Endpoints, SlicePort};
use crate::net::{parse_ip, IpFamily};
use std::collections::HashMap;

const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
const MAX_PORTS: usize = 100;
const MAX_HINTS: usize = 8;
pub(super) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

pub(super) fn check_endpoints(cx: &mut Cx, e: &Endpoints) {
    check_meta(cx, &e.meta, "Endpoints", true);
    for (i, ss) in e.subsets.iter().enumerate() {
        let sp = format!("subsets[{i}]");
        if ss.addresses.is_empty() && ss.not_ready.is_empty() {
            cx.push(
                Diagnostic::error(
                    "SVC209",
                    "Endpoints subset without `addresses` or `notReadyAddresses`",
                )
                .at(ss.ports.first().map_or(e.meta.name.span, |p| p.span))
                .path(sp.clone())
                .hint("list the backends' IPs under `addresses`, or remove the subset"),
            );
        }
        for (key, list) in [
            ("addresses", &ss.addresses),
            ("notReadyAddresses", &ss.not_ready),
        ] {
            for (j, a) in list.iter().enumerate() {
                ip_address(cx, &a.ip, None, || format!("{sp}.{key}[{j}].ip"));
                if let Some(n) = &a.node_name {
                    node_name(cx, n, || format!("{sp}.{key}[{j}].nodeName"));
                }
                if let Some(h) = &a.hostname {
                    hostname(cx, h, format!("{sp}.{key}[{j}].hostname"));
                }
            }
        }
        ports(cx, &ss.ports, &format!("{sp}.ports"), true);
    }
}

pub(super) fn check_slice(cx: &mut Cx, s: &EndpointSlice) {
    check_meta(cx, &s.meta, "EndpointSlice", true);
    if !s.meta.labels.iter().any(|(k, _)| k.v == SERVICE_NAME_LABEL) {
        cx.push(
            Diagnostic::warning(
                "SVC210",
                format!("EndpointSlice `{}` has no `{SERVICE_NAME_LABEL}` label", s.meta.name.v),
            )
            .at(s.meta.name.span)
            .path(format!("metadata.labels[{SERVICE_NAME_LABEL}]"))
            .hint(format!(
                "kube-proxy ignores slices without it; add `{SERVICE_NAME_LABEL}: <service name>` under metadata.labels"
            )),
        );
    }
    let family = match s.address_type.as_ref().filter(|t| !t.v.is_empty()) {
        None => {
            cx.push(
                Diagnostic::error("SVC202", "EndpointSlice without `addressType`")
                    .at(s.meta.name.span)
                    .path("addressType")
                    .hint("add `addressType: IPv4` (or IPv6, FQDN)"),
            );
            None
        }
        Some(t) => {
            let ok = cx.one_of(
                "SVC202",
                t,
                &["IPv4", "IPv6", "FQDN"],
                "addressType",
                "addressType",
            );
            ok.then_some(t.v.as_str())
        }
    };
    if s.endpoints.len() > MAX_ENDPOINTS {
        cx.push(
            Diagnostic::error(
                "SVC208",
                format!(
                    "too many endpoints: {} (an EndpointSlice holds at most {MAX_ENDPOINTS})",
                    s.endpoints.len()
                ),
            )
            .at(s.endpoints[MAX_ENDPOINTS].span)
            .path("endpoints")
            .hint(
                "split the endpoints over several EndpointSlices with the same service-name label",
            ),
        );
    } else {
        for (i, ep) in s.endpoints.iter().enumerate() {
            let ap = || format!("endpoints[{i}].addresses");
            if ep.addresses.is_empty() {
                cx.push(
                    Diagnostic::error("SVC209", "endpoint without addresses")
                        .at(ep.span)
                        .path(ap())
                        .hint("an endpoint needs at least one address; add one or remove the endpoint"),
                );
            } else if ep.addresses.len() > MAX_ADDRESSES {
                cx.push(
                    Diagnostic::error(
                        "SVC208",
                        format!(
                            "too many addresses: {} (an endpoint holds at most {MAX_ADDRESSES})",
                            ep.addresses.len()
                        ),
                    )
                    .at(ep.addresses[MAX_ADDRESSES].span)
                    .path(ap()),
                );
            }
            for (j, a) in ep.addresses.iter().enumerate() {
                let path = || format!("endpoints[{i}].addresses[{j}]");
                match family {
                    Some("IPv4") => ip_address(cx, a, Some(IpFamily::IPv4), path),
                    Some("IPv6") => ip_address(cx, a, Some(IpFamily::IPv6), path),
                    Some(_) => {
                        if let Err(e) = names::fqdn(&a.v) {
                            cx.push(
                                Diagnostic::error(
                                    "SVC203",
                                    format!("invalid FQDN address `{}`: {e}", a.v),
                                )
                                .at(a.span)
                                .path(path())
                                .hint("FQDN slices hold DNS names such as `db.example.com`"),
                            );
                        }
                    }
                    None => {}
                }
            }
            if let Some(n) = &ep.node_name {
                node_name(cx, n, || format!("endpoints[{i}].nodeName"));
            }
            if let Some(h) = &ep.hostname {
                hostname(cx, h, format!("endpoints[{i}].hostname"));
            }
            hints(cx, &ep.hints_written, &format!("endpoints[{i}]"));
        }
    }
    if s.ports.len() > MAX_PORTS {
        cx.push(
            Diagnostic::error(
                "SVC208",
                format!(
                    "too many ports: {} (an EndpointSlice holds at most {MAX_PORTS})",
                    s.ports.len()
                ),
            )
            .at(s.ports[MAX_PORTS].span)
            .path("ports")
            .hint("split the ports over several EndpointSlices"),
        );
    } else {
        ports(cx, &s.ports, "ports", false);
    }
}

/// An endpoint IP: valid, of the wanted family, and routable.
fn ip_address(cx: &mut Cx, a: &Sp<String>, want: Option<IpFamily>, path: impl FnOnce() -> String) {
    let kind = want.map_or("IP", |f| f.as_str());
    match parse_ip(&a.v) {
        None => cx.push(
            Diagnostic::error(
                "SVC203",
                format!("endpoint address `{}` is not a valid {kind} address", a.v),
            )
            .at(a.span)
            .path(path())
            .hint("write the backend's IP address, e.g. 10.244.1.5"),
        ),
        Some(ip) if want.is_some_and(|f| f != IpFamily::of(&ip)) => {
            let other = IpFamily::of(&ip).as_str();
            cx.push(
                Diagnostic::error(
                    "SVC203",
                    format!("endpoint address `{}` is not an {kind} address", a.v),
                )
                .at(a.span)
                .path(path())
                .hint(format!(
                    "an EndpointSlice holds one family; put {other} addresses in a slice with `addressType: {other}`"
                )),
            )
        }
        Some(ip) => {
            if let Some(why) = special_ip(&ip) {
                cx.push(
                    Diagnostic::error("SVC204", format!("endpoint address {ip} {why}"))
                        .at(a.span)
                        .path(path())
                        .hint(
                            "endpoints must be addresses other nodes can reach (pod or node IPs)",
                        ),
                );
            }
        }
    }
}

fn node_name(cx: &mut Cx, n: &Sp<String>, path: impl FnOnce() -> String) {
    if let Err(e) = names::dns1123_subdomain(&n.v) {
        cx.push(
            Diagnostic::error("SVC211", format!("invalid nodeName `{}`: {e}", n.v))
                .at(n.span)
                .path(path())
                .hint("nodeName is the Node object's name, a DNS-1123 subdomain"),
        );
    }
}

/// Endpoint ports. `legacy` (Endpoints) requires names when there are several ports;
/// EndpointSlices instead require names to be unique (the empty name included).
/// An endpoint's `hostname` is a DNS-1123 label (it becomes a DNS name under the Service).
fn hostname(cx: &mut Cx, h: &Sp<String>, path: String) {
    if let Err(e) = names::dns1123_label(&h.v) {
        cx.push(
            Diagnostic::error(
                "SVC218",
                format!("invalid endpoint hostname `{}`: {e}", h.v),
            )
            .at(h.span)
            .path(path)
            .hint("a hostname is one DNS label, e.g. `web-0`"),
        );
    }
}

/// `hints.forZones` (and `forNodes`): at most 8 each, names that are label values (node
/// names for `forNodes`), none twice.
fn hints(cx: &mut Cx, written: &[(&'static str, Sp<String>)], prefix: &str) {
    for key in ["forZones", "forNodes"] {
        let of: Vec<&Sp<String>> = written
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, n)| n)
            .collect();
        if of.len() > MAX_HINTS {
            cx.push(
                Diagnostic::error(
                    "SVC219",
                    format!(
                        "{} hints in `{key}`: at most {MAX_HINTS} are allowed",
                        of.len()
                    ),
                )
                .at(of[MAX_HINTS].span)
                .path(format!("{prefix}.hints.{key}"))
                .hint("hints name the few zones (or nodes) that should use this endpoint"),
            );
            continue;
        }
        let mut seen: HashMap<&str, crate::source::Span> = HashMap::new();
        for (i, n) in of.iter().enumerate() {
            let path = format!("{prefix}.hints.{key}[{i}].name");
            let valid = match key {
                "forZones" => names::label_value(&n.v),
                _ => names::dns1123_subdomain(&n.v),
            };
            if let Err(e) = valid {
                cx.push(
                    Diagnostic::error("SVC219", format!("invalid hint `{}`: {e}", n.v))
                        .at(n.span)
                        .path(path.clone()),
                );
            }
            if let Some(first) = seen_before(&mut seen, n.v.as_str(), n.span) {
                cx.push(
                    Diagnostic::error("SVC219", format!("duplicate hint `{}`", n.v))
                        .at(n.span)
                        .path(path)
                        .related(first, "first written here"),
                );
            }
        }
    }
}

fn ports(cx: &mut Cx, ports: &[SlicePort], prefix: &str, legacy: bool) {
    let mut seen: HashMap<&str, crate::source::Span> = HashMap::new();
    for (i, p) in ports.iter().enumerate() {
        let path = |f: &str| format!("{prefix}[{i}].{f}");
        if let Some(a) = &p.app_protocol {
            super::service::app_protocol(cx, "SVC217", a, path("appProtocol"));
        }
        let name = p.name.as_ref().map_or("", |n| n.v.as_str());
        if name.is_empty() {
            if legacy && ports.len() > 1 {
                cx.push(
                    Diagnostic::error("SVC207", "port needs a name: there is more than one port")
                        .at(p.name.as_ref().map_or(p.span, |n| n.span))
                        .path(path("name"))
                        .hint(
                            "name every port after the Service port it serves, e.g. `name: http`",
                        ),
                );
            }
        } else if let Err(e) = names::dns1123_label(name) {
            cx.push(
                Diagnostic::error("SVC207", format!("invalid port name `{name}`: {e}"))
                    .at(p.name.as_ref().map_or(p.span, |n| n.span))
                    .path(path("name")),
            );
        }
        if !legacy {
            let span = p.name.as_ref().map_or(p.span, |n| n.span);
            if let Some(first) = seen_before(&mut seen, name, span) {
                cx.push(
                    Diagnostic::error("SVC207", format!("duplicate port name `{name}`"))
                        .at(span)
                        .path(path("name"))
                        .related(first, "first used here")
                        .hint("each port of a slice needs its own name (the Service port's name)"),
                );
            }
        }
        match &p.port {
            // A slice port without a number means "all ports"; Endpoints need one.
            None if legacy && !p.port_written => cx.push(
                Diagnostic::error("SVC205", "Endpoints port without `port`")
                    .at(p.span)
                    .path(path("port"))
                    .hint("write the port the backends listen on, e.g. `port: 8080`"),
            ),
            Some(n) if !(1..=65535).contains(&n.v) => cx.push(
                Diagnostic::error(
                    "SVC205",
                    format!("port {} is out of range: must be between 1 and 65535", n.v),
                )
                .at(n.span)
                .path(path("port")),
            ),
            _ => {}
        }
        if let Some(pr) = &p.protocol {
            cx.one_of(
                "SVC206",
                pr,
                &["TCP", "UDP", "SCTP"],
                "protocol",
                path("protocol"),
            );
        }
    }
}
