//! The API server's validation rules for the objects svc-compile reads, plus the
//! cross-object rules the API server enforces through its allocators (node ports, cluster
//! IPs) and checks on kube-proxy's own configuration.
//!
//! Architecture Invariant: this pass only reads [`Objects`] and pushes diagnostics; it
//! never changes or drops an object. It never stops at the first problem. Work is linear in
//! the number of objects, except for cross-object rules, which sort (n·log n); no rule
//! compares every object with every other.
//!
//! Defaults the API server fills in are honoured: a missing `type` is `ClusterIP`, a
//! missing `protocol` is `TCP`, a missing or zero `targetPort` is `port`, a zero `nodePort`
//! or `healthCheckNodePort` means "allocate one". Paths are relative to the object
//! (`spec.ports[0].nodePort`); map keys are written in brackets
//! (`metadata.labels[app.kubernetes.io/name]`).
//!
//! # Codes
//!
//! Metadata rules apply to every kind; they carry SVC1xx codes because Services are where
//! they matter most.
//!
//! | code   | severity | meaning |
//! |--------|----------|---------|
//! | SVC101 | error    | Service name is not a DNS-1035 label |
//! | SVC102 | error    | namespace is not a DNS-1123 label (any kind) |
//! | SVC103 | error    | label, selector or annotation key is not a qualified name (any kind) |
//! | SVC104 | error    | label or selector value is not a valid label value (any kind) |
//! | SVC105 | error    | unsupported Service `type` |
//! | SVC106 | error    | Service without ports (only ExternalName and headless may have none) |
//! | SVC107 | error    | port without a name in a Service with more than one port |
//! | SVC108 | error    | Service port name is not a DNS-1123 label |
//! | SVC109 | error    | duplicate Service port name |
//! | SVC110 | error    | Service `port` missing or outside 1-65535 |
//! | SVC111 | error    | duplicate Service port (same port and protocol) |
//! | SVC112 | error    | unsupported Service port protocol (TCP, UDP, SCTP) |
//! | SVC113 | error    | numeric `targetPort` outside 1-65535 |
//! | SVC114 | error    | named `targetPort` is not an IANA service name |
//! | SVC115 | error    | `nodePort` on a Service whose type is not NodePort or LoadBalancer |
//! | SVC116 | error    | `nodePort` outside the node-port range |
//! | SVC117 | error    | duplicate `nodePort` (same number and protocol) inside one Service |
//! | SVC118 | error    | `clusterIP`/`clusterIPs` entry is neither an IP address nor `None` |
//! | SVC119 | error    | cluster IP outside the service CIDR of its family |
//! | SVC120 | error    | `clusterIPs[0]` differs from `clusterIP` |
//! | SVC121 | error    | malformed `clusterIPs` (more than 2, misplaced `None`, two of one family) |
//! | SVC122 | error    | `ipFamilies` entry unsupported or duplicated, or more than 2 |
//! | SVC123 | error    | unsupported `ipFamilyPolicy` |
//! | SVC124 | error    | IP families, policy and cluster IPs disagree (with each other or the cluster) |
//! | SVC125 | error    | ExternalName Service without a valid DNS-1123 `externalName` |
//! | SVC126 | warning  | `externalName` is an IP address (it is resolved as a DNS name) |
//! | SVC127 | error    | ExternalName Service with cluster IPs, `ipFamilies` or `ipFamilyPolicy` |
//! | SVC128 | error    | headless (`clusterIP: None`) NodePort or LoadBalancer Service |
//! | SVC129 | error    | unsupported `externalTrafficPolicy` (Cluster, Local) |
//! | SVC130 | error    | `externalTrafficPolicy` on a Service that is not externally reachable |
//! | SVC131 | error    | unsupported `internalTrafficPolicy` (Cluster, Local) |
//! | SVC132 | error    | `healthCheckNodePort` without type LoadBalancer and `externalTrafficPolicy: Local` |
//! | SVC133 | error    | `healthCheckNodePort` outside the node-port range |
//! | SVC134 | error    | unsupported `sessionAffinity` (None, ClientIP) |
//! | SVC135 | error    | `sessionAffinityConfig.clientIP.timeoutSeconds` outside 1-86400 |
//! | SVC136 | error    | `sessionAffinityConfig` without `sessionAffinity: ClientIP` |
//! | SVC137 | error    | `externalIPs` entry is not an IP address |
//! | SVC138 | error    | `externalIPs` entry is unspecified, loopback or link-local |
//! | SVC139 | error    | load-balancer source range (field or annotation) is not a CIDR |
//! | SVC140 | error    | load-balancer source ranges on a Service that is not a LoadBalancer |
//! | SVC141 | warning  | `status.loadBalancer.ingress` with an invalid `ip` or `hostname` (left out) |
//! | SVC142 | warning  | `ipMode` unsupported (VIP, Proxy) or set without `ip` (read as VIP) |
//! | SVC143 | warning  | `status.loadBalancer.ingress` on a Service that is not a LoadBalancer (left out) |
//! | SVC144 | error    | more than 16 `topologyKeys` |
//! | SVC145 | error    | `topologyKeys` entry is not a valid label key |
//! | SVC146 | error    | duplicate `topologyKeys` entry |
//! | SVC147 | error    | `"*"` in `topologyKeys` is not the last entry |
//! | SVC148 | error    | `topologyKeys` together with `externalTrafficPolicy: Local` |
//! | SVC149 | error    | unsupported `trafficDistribution` (PreferClose, PreferSameZone, PreferSameNode) |
//! | SVC150 | error    | Service port `appProtocol` is not a qualified name |
//! | SVC151 | error    | `loadBalancerClass` or `allocateLoadBalancerNodePorts` on a Service that is not a LoadBalancer, or a class that is not a qualified name |
//! | SVC152 | error    | annotations larger than 256 KiB in total (any kind) |
//! | SVC153 | warning  | IPv4 address with leading zeros (read as decimal; any kind) |
//! | SVC154 | warning  | `topologyKeys` (removed in 1.22; a current kube-proxy ignores it) |
//! | SVC201 | error    | Endpoints, EndpointSlice, Node or Pod name is not a DNS-1123 subdomain |
//! | SVC202 | error    | EndpointSlice `addressType` missing or unsupported (IPv4, IPv6, FQDN) |
//! | SVC203 | error    | endpoint address is not an IP of the slice's type (or not an FQDN) |
//! | SVC204 | error    | endpoint address is unspecified, loopback, link-local or link-local multicast |
//! | SVC205 | error    | endpoint `port` outside 1-65535 |
//! | SVC206 | error    | unsupported endpoint port protocol (TCP, UDP, SCTP) |
//! | SVC207 | error    | endpoint port name missing (several ports), not a DNS-1123 label, or duplicated |
//! | SVC208 | error    | too many endpoints (1000), addresses per endpoint (100) or ports (100) |
//! | SVC209 | error    | endpoint or Endpoints subset without addresses |
//! | SVC210 | warning  | EndpointSlice without the `kubernetes.io/service-name` label (kube-proxy ignores it) |
//! | SVC211 | error    | endpoint `nodeName` is not a DNS-1123 subdomain |
//! | SVC212 | error    | Node pod CIDR is not a CIDR |
//! | SVC213 | error    | Node pod CIDRs: more than one per family, or duplicated |
//! | SVC214 | error    | Node InternalIP/ExternalIP address is not an IP address |
//! | SVC215 | error    | Pod IP is not an IP address |
//! | SVC216 | error    | Pod IPs: more than one per family, or duplicated |
//! | SVC217 | error    | endpoint port `appProtocol` is not a qualified name |
//! | SVC218 | error    | endpoint `hostname`, or a Pod's `spec.hostname`/`spec.subdomain`, is not a DNS-1123 label |
//! | SVC219 | error    | endpoint hints: more than 8, a zone that is no label value, or a repeated one |
//! | SVC301 | error    | two objects of the same kind, namespace and name |
//! | SVC302 | error    | node port used by two Services (or as a Service's health-check port too) |
//! | SVC303 | error    | cluster IP written on two Services |
//! | SVC304 | error    | endpoint address is a Service's cluster IP |
//! | SVC305 | warning  | Endpoints or EndpointSlice names a Service that is not in the input |
//! | SVC306 | error    | more than one KubeProxyConfiguration |
//! | SVC307 | error    | more than one ClusterConfig |
//! | SVC308 | error    | unsupported kube-proxy `mode` ("", iptables, ipvs, nftables) |
//! | SVC309 | error    | `masqueradeBit` outside 0-31 |
//! | SVC310 | error    | kube-proxy `clusterCIDR`: not CIDRs, or more than one per family |
//! | SVC311 | error    | unsupported `detectLocalMode` |
//! | SVC312 | error    | `detectLocalMode` without the `detectLocal` field it needs |
//! | SVC313 | warning  | `detectLocalMode: ClusterCIDR` without `clusterCIDR` (nothing is local) |
//! | SVC314 | error    | `nodePortAddresses` entry is not a CIDR, or `primary` mixed with CIDRs |
//! | SVC315 | error    | unknown `ipvs.scheduler` |
//! | SVC316 | error    | ClusterConfig `serviceClusterIPRange`: not CIDRs, or more than one per family |
//! | SVC317 | error    | ClusterConfig `serviceNodePortRange` is not `LOW-HIGH` within 1-65535 |
//! | SVC318 | error    | ClusterConfig `clusterDomain` is not a DNS-1123 subdomain |
//! | SVC319 | error    | `ipvs` section: a timeout is not a duration, or an `excludeCIDRs` entry is not a CIDR |
//! | SVC320 | error    | ClusterConfig `nftLayout` is not `kube-proxy` or `fast` |
//! | SVC321 | warning  | kube-proxy `mode: ipvs` (or `--target ipvs`): IPVS mode is deprecated (KEP-5495) |
//! | SVC322 | error    | ClusterConfig `topologyKeys` is not `honour` or `ignore` |
//! | SVC323 | error    | ClusterConfig `dnsRecords` is not `spec` or `coredns` |
//! | SVC324 | error    | ClusterConfig `ebpfMapSizes` is not `KEY=N,...` with known keys |
//! | SVC325 | warning  | a Service port no port of its EndpointSlices (or Endpoints) matches by name and protocol: kube-proxy finds no endpoint for it |
//! | SVC326 | error    | ClusterConfig `ebpfLbAlgorithm`, `ebpfMaglevTableSize` or `ebpfMaglevHashSeed` is not a value the cilium-agent accepts |
//! | SVC330 | error    | `conntrack` section: a timeout is not a duration, or a count is not 0-4294967295 |

mod config;
pub use config::ipvs_deprecated;
mod cross;
mod endpoints;
pub(crate) mod names;
mod nodes;
mod service;
#[cfg(test)]
mod tests;

use crate::decode::{closest, Sp};
use crate::diag::{Diagnostic, Diagnostics};
use crate::k8s::{Meta, Objects};
use crate::passes::Settings;
use crate::source::Span;
use std::collections::hash_map::{Entry, HashMap};
use std::hash::Hash;
use std::net::IpAddr;

/// Check every object; push every problem found (never stop at the first).
pub fn validate(objects: &Objects, settings: &Settings, diags: &mut Diagnostics) {
    let mut cx = Cx { settings, diags };
    for s in &objects.services {
        service::check(&mut cx, s);
    }
    for e in &objects.endpoints {
        endpoints::check_endpoints(&mut cx, e);
    }
    for s in &objects.slices {
        endpoints::check_slice(&mut cx, s);
    }
    for n in &objects.nodes {
        nodes::check_node(&mut cx, n);
    }
    for p in &objects.pods {
        nodes::check_pod(&mut cx, p);
    }
    config::check(&mut cx, objects);
    cross::check(&mut cx, objects);
    leading_zeros(&mut cx, objects);
}

/// The API server reads `010.0.0.1` as 10.0.0.1 and answers with a warning (its strict
/// parsing is for new fields only); so do we, for every IP field we read.
fn leading_zeros(cx: &mut Cx, o: &Objects) {
    let mut ips: Vec<(&Sp<String>, String)> = Vec::new();
    for s in &o.services {
        let one = s
            .cluster_ip
            .iter()
            .map(|c| (c, "spec.clusterIP".to_string()));
        let list = s.cluster_ips.iter().enumerate();
        ips.extend(one.chain(list.map(|(i, c)| (c, format!("spec.clusterIPs[{i}]")))));
        let ext = s.external_ips.iter().enumerate();
        ips.extend(ext.map(|(i, c)| (c, format!("spec.externalIPs[{i}]"))));
        ips.extend(
            s.load_balancer_ip
                .iter()
                .map(|c| (c, "spec.loadBalancerIP".to_string())),
        );
        let ranges = s.load_balancer_source_ranges.iter().enumerate();
        ips.extend(ranges.map(|(i, c)| (c, format!("spec.loadBalancerSourceRanges[{i}]"))));
        for (i, g) in s.lb_ingress.iter().enumerate() {
            let p = format!("status.loadBalancer.ingress[{i}].ip");
            ips.extend(g.ip.iter().map(|c| (c, p.clone())));
        }
    }
    for sl in &o.slices {
        for (i, e) in sl.endpoints.iter().enumerate() {
            let a = e.addresses.iter().enumerate();
            ips.extend(a.map(|(j, c)| (c, format!("endpoints[{i}].addresses[{j}]"))));
        }
    }
    for e in &o.endpoints {
        for (i, ss) in e.subsets.iter().enumerate() {
            for (key, list) in [
                ("addresses", &ss.addresses),
                ("notReadyAddresses", &ss.not_ready),
            ] {
                let a = list.iter().enumerate();
                ips.extend(a.map(|(j, a)| (&a.ip, format!("subsets[{i}].{key}[{j}].ip"))));
            }
        }
    }
    for n in &o.nodes {
        let c = n.pod_cidrs.iter().enumerate();
        ips.extend(c.map(|(i, c)| (c, format!("spec.podCIDRs[{i}]"))));
        let a = n.addresses.iter().enumerate();
        ips.extend(a.map(|(i, (_, c))| (c, format!("status.addresses[{i}].address"))));
    }
    for p in &o.pods {
        let a = p.pod_ips.iter().enumerate();
        ips.extend(a.map(|(i, c)| (c, format!("status.podIPs[{i}].ip"))));
    }
    for (ip, path) in ips {
        // A CIDR's address part counts too.
        let (addr, prefix) = match ip.v.split_once('/') {
            Some((a, p)) => (a, format!("/{p}")),
            None => (ip.v.as_str(), String::new()),
        };
        if crate::net::has_leading_zeros(addr) {
            let read = crate::net::parse_ip(addr).map_or(String::new(), |a| format!("{a}{prefix}"));
            cx.push(
                Diagnostic::warning(
                    "SVC153",
                    format!("IP address `{}` has leading zeros: it is read as {read}", ip.v),
                )
                .at(ip.span)
                .path(path)
                .hint(format!("write `{read}`; the API server warns, and some tools read a leading zero as octal")),
            );
        }
    }
}

struct Cx<'a> {
    settings: &'a Settings,
    diags: &'a mut Diagnostics,
}

impl Cx<'_> {
    fn push(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    /// `v` must be one of `allowed` (case-sensitive, as the API server compares). Returns
    /// whether it was.
    fn one_of(
        &mut self,
        code: &'static str,
        v: &Sp<String>,
        allowed: &[&str],
        what: &str,
        path: impl Into<String>,
    ) -> bool {
        if allowed.contains(&v.v.as_str()) {
            return true;
        }
        let list = allowed
            .iter()
            .map(|a| if a.is_empty() { "\"\"" } else { a })
            .collect::<Vec<_>>()
            .join(", ");
        // Short words are all close to each other; only suggest a case fix for them.
        let near = closest(&v.v, allowed)
            .filter(|s| !s.is_empty())
            .filter(|s| s.eq_ignore_ascii_case(&v.v) || v.v.chars().count() >= 6);
        let hint = match near {
            Some(s) => format!("did you mean `{s}`? (values are case-sensitive)"),
            None => format!("use one of: {list}"),
        };
        self.push(
            Diagnostic::error(
                code,
                format!("unsupported {what} `{}`: must be one of {list}", v.v),
            )
            .at(v.span)
            .path(path)
            .hint(hint),
        );
        false
    }
}

/// Record `key` as seen at `span`; if it was seen before, return where.
fn seen_before<K: Hash + Eq>(seen: &mut HashMap<K, Span>, key: K, span: Span) -> Option<Span> {
    match seen.entry(key) {
        Entry::Occupied(e) => Some(*e.get()),
        Entry::Vacant(e) => {
            e.insert(span);
            None
        }
    }
}

/// `namespace/name` (or `name` for cluster-scoped objects), for messages.
fn ident(m: &Meta) -> String {
    if m.namespace.v.is_empty() {
        m.name.v.clone()
    } else {
        format!("{}/{}", m.namespace.v, m.name.v)
    }
}

/// The metadata rules every object shares: name, namespace, labels, annotation keys.
fn check_meta(cx: &mut Cx, m: &Meta, kind: &str, namespaced: bool) {
    let (res, code, rule) = if kind == "Service" {
        (
            names::dns1035_label(&m.name.v),
            "SVC101",
            "a DNS-1035 label",
        )
    } else {
        (
            names::dns1123_subdomain(&m.name.v),
            "SVC201",
            "a DNS-1123 subdomain",
        )
    };
    if let Err(e) = res {
        let mut d = Diagnostic::error(code, format!("invalid {kind} name `{}`: {e}", m.name.v))
            .at(m.name.span)
            .path("metadata.name");
        d = match names::suggest_label(&m.name.v, kind == "Service") {
            Some(s) => d.hint(format!("{kind} names must be {rule}; try `{s}`")),
            None => d.hint(format!("{kind} names must be {rule}")),
        };
        cx.push(d);
    }
    if namespaced {
        if let Err(e) = names::dns1123_label(&m.namespace.v) {
            let mut d = Diagnostic::error(
                "SVC102",
                format!("invalid namespace `{}`: {e}", m.namespace.v),
            )
            .at(m.namespace.span)
            .path("metadata.namespace");
            if let Some(s) = names::suggest_label(&m.namespace.v, false) {
                d = d.hint(format!("namespaces are DNS-1123 labels; try `{s}`"));
            }
            cx.push(d);
        }
    }
    check_labels(cx, &m.labels, "metadata.labels", "label");
    // ValidateAnnotationsSize: keys and values together.
    let size: usize = m
        .annotations
        .iter()
        .map(|(k, v)| k.v.len() + v.v.len())
        .sum();
    if size > ANNOTATIONS_MAX {
        let first = m.annotations.first().map_or(m.name.span, |(k, _)| k.span);
        cx.push(
            Diagnostic::error(
                "SVC152",
                format!("annotations take {size} bytes: at most {ANNOTATIONS_MAX} (256 KiB) are allowed"),
            )
            .at(first)
            .path("metadata.annotations")
            .hint("keep large data in a ConfigMap; kubectl apply's last-applied-configuration annotation counts too"),
        );
    }
    for (k, _) in &m.annotations {
        if let Err(e) = names::qualified_name(&k.v) {
            cx.push(
                Diagnostic::error("SVC103", format!("invalid annotation key `{}`: {e}", k.v))
                    .at(k.span)
                    .path(format!("metadata.annotations[{}]", k.v)),
            );
        }
    }
}

/// The API server's limit on all annotations of an object (keys and values).
const ANNOTATIONS_MAX: usize = 256 * 1024;

/// Label keys and values (also used for selectors).
fn check_labels(cx: &mut Cx, labels: &[(Sp<String>, Sp<String>)], path: &str, what: &str) {
    for (k, v) in labels {
        if let Err(e) = names::qualified_name(&k.v) {
            cx.push(
                Diagnostic::error("SVC103", format!("invalid {what} key `{}`: {e}", k.v))
                    .at(k.span)
                    .path(format!("{path}[{}]", k.v))
                    .hint("keys are `[prefix/]name`: a DNS subdomain prefix and a name of at most 63 characters"),
            );
        }
        if let Err(e) = names::label_value(&v.v) {
            cx.push(
                Diagnostic::error(
                    "SVC104",
                    format!("invalid {what} value `{}` for `{}`: {e}", v.v, k.v),
                )
                .at(v.span)
                .path(format!("{path}[{}]", k.v))
                .hint("label values are at most 63 characters of [A-Za-z0-9-_.]; put longer text in an annotation"),
            );
        }
    }
}

/// Parse a CIDR, with a reason that does not repeat the text.
fn parse_cidr(text: &str) -> Result<crate::net::Cidr, String> {
    if !text.contains('/') {
        return Err("expected ADDRESS/PREFIX".into());
    }
    text.parse()
}

/// Why the API server refuses `ip` where a routable address is needed, if it does.
fn special_ip(ip: &IpAddr) -> Option<&'static str> {
    let ip = match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => *ip,
        },
        _ => *ip,
    };
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            if a.is_unspecified() {
                Some("may not be unspecified (0.0.0.0)")
            } else if a.is_loopback() {
                Some("may not be in the loopback range (127.0.0.0/8)")
            } else if o[0] == 169 && o[1] == 254 {
                Some("may not be in the link-local range (169.254.0.0/16)")
            } else if o[0] == 224 && o[1] == 0 && o[2] == 0 {
                Some("may not be in the link-local multicast range (224.0.0.0/24)")
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            if a.is_unspecified() {
                Some("may not be unspecified (::)")
            } else if a.is_loopback() {
                Some("may not be the loopback address (::1)")
            } else if s[0] & 0xffc0 == 0xfe80 {
                Some("may not be in the link-local range (fe80::/10)")
            } else if s[0] & 0xff0f == 0xff02 {
                Some("may not be in the link-local multicast range (ff02::/16)")
            } else {
                None
            }
        }
    }
}

/// The cluster IPs a user wrote, with their field paths: `clusterIPs` when present (the
/// API server copies `clusterIP` into it otherwise), else a non-empty `clusterIP`.
fn written_cluster_ips(s: &crate::k8s::Service) -> Vec<(String, &Sp<String>)> {
    if !s.cluster_ips.is_empty() {
        s.cluster_ips
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("spec.clusterIPs[{i}]"), c))
            .collect()
    } else {
        s.cluster_ip
            .iter()
            .filter(|c| !c.v.is_empty())
            .map(|c| ("spec.clusterIP".to_string(), c))
            .collect()
    }
}
