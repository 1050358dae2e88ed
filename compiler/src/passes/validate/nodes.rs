//! Node (`ValidateNode`: pod CIDRs; addresses) and Pod (`validatePodIPs`) rules.

use super::{check_meta, parse_cidr, Cx};
use crate::decode::Sp;
use crate::diag::Diagnostic;
use crate::k8s::{NodeObj, Pod};
use crate::net::{parse_ip, IpFamily};
use crate::source::Span;

pub(super) fn check_node(cx: &mut Cx, n: &NodeObj) {
    check_meta(cx, &n.meta, "Node", false);
    let mut cidrs: Vec<(IpFamily, &Sp<String>)> = Vec::new();
    for (i, c) in n.pod_cidrs.iter().enumerate() {
        match parse_cidr(&c.v) {
            Ok(cidr) => cidrs.push((cidr.family(), c)),
            Err(e) => cx.push(
                Diagnostic::error(
                    "SVC212",
                    format!("pod CIDR `{}` is not a valid CIDR: {e}", c.v),
                )
                .at(c.span)
                .path(format!("spec.podCIDRs[{i}]"))
                .hint("write ADDRESS/PREFIX, e.g. 10.244.1.0/24"),
            ),
        }
    }
    one_per_family(cx, &cidrs, "SVC213", "pod CIDR", "spec.podCIDRs");
    for (i, (ty, a)) in n.addresses.iter().enumerate() {
        if (ty == "InternalIP" || ty == "ExternalIP") && parse_ip(&a.v).is_none() {
            cx.push(
                Diagnostic::error(
                    "SVC214",
                    format!("node {ty} `{}` is not a valid IP address", a.v),
                )
                .at(a.span)
                .path(format!("status.addresses[{i}].address"))
                .hint("InternalIP and ExternalIP addresses are IPs; use type Hostname or InternalDNS for names"),
            );
        }
    }
}

pub(super) fn check_pod(cx: &mut Cx, p: &Pod) {
    check_meta(cx, &p.meta, "Pod", true);
    let mut ips: Vec<(IpFamily, &Sp<String>)> = Vec::new();
    for (i, a) in p.pod_ips.iter().enumerate() {
        match parse_ip(&a.v) {
            Some(ip) => ips.push((IpFamily::of(&ip), a)),
            None => cx.push(
                Diagnostic::error(
                    "SVC215",
                    format!("pod IP `{}` is not a valid IP address", a.v),
                )
                .at(a.span)
                .path(format!("status.podIPs[{i}].ip"))
                .hint("write the pod's address, e.g. 10.244.1.5"),
            ),
        }
    }
    one_per_family(cx, &ips, "SVC216", "pod IP", "status.podIPs");
    // Both become one label of a DNS name (`hostname.subdomain.ns.svc...`); the API
    // server refuses anything else, and a zone with such a name does not load.
    for (field, v) in [("hostname", &p.hostname), ("subdomain", &p.subdomain)] {
        let Some(v) = v.as_ref().filter(|v| !v.v.is_empty()) else {
            continue;
        };
        if let Err(e) = crate::passes::validate::names::dns1123_label(&v.v) {
            cx.push(
                Diagnostic::error("SVC218", format!("invalid pod {field} `{}`: {e}", v.v))
                    .at(v.span)
                    .path(format!("spec.{field}"))
                    .hint("one DNS label, e.g. `web-0`"),
            );
        }
    }
}

/// At most one value per family, no duplicates (dual-stack lists: pod CIDRs, pod IPs).
fn one_per_family(
    cx: &mut Cx,
    items: &[(IpFamily, &Sp<String>)],
    code: &'static str,
    what: &str,
    path: &str,
) {
    let mut first: [Option<Span>; 2] = [None, None];
    for (fam, v) in items {
        let slot = &mut first[*fam as usize];
        match slot {
            None => *slot = Some(v.span),
            Some(f) => {
                let dup = items.iter().any(|(_, o)| o.span == *f && o.v == v.v);
                let msg = if dup {
                    format!("duplicate {what} `{}`", v.v)
                } else {
                    format!("more than one {} {what}: `{}`", fam.as_str(), v.v)
                };
                cx.push(
                    Diagnostic::error(code, msg)
                        .at(v.span)
                        .path(path)
                        .related(*f, "first one here")
                        .hint("list at most one IPv4 and one IPv6 value"),
                );
            }
        }
    }
}
