//! Configuration documents: kube-proxy's KubeProxyConfiguration (`validateKubeProxy*`)
//! and our ClusterConfig (what kube-apiserver's flags accept). One of each at most.

use super::{names, parse_cidr, Cx};
use crate::decode::Sp;
use crate::diag::Diagnostic;
use crate::k8s::{ClusterConfigDoc, Objects, ProxyConfigDoc};
use crate::net::IpFamily;
use crate::source::Span;

pub(super) fn check(cx: &mut Cx, o: &Objects) {
    only_one(
        cx,
        o.proxy_configs.iter().map(|p| p.span).collect(),
        "SVC306",
        "KubeProxyConfiguration",
    );
    only_one(
        cx,
        o.cluster_configs.iter().map(|c| c.span).collect(),
        "SVC307",
        "ClusterConfig",
    );
    for p in &o.proxy_configs {
        proxy(cx, p);
    }
    for c in &o.cluster_configs {
        cluster(cx, c);
    }
}

fn only_one(cx: &mut Cx, mut spans: Vec<Span>, code: &'static str, kind: &str) {
    spans.sort_unstable();
    if let Some((first, rest)) = spans.split_first() {
        for s in rest {
            cx.push(
                Diagnostic::error(code, format!("more than one {kind} document"))
                    .at(*s)
                    .path("kind")
                    .related(*first, "first one here")
                    .hint(format!(
                        "keep a single {kind} and merge the settings into it"
                    )),
            );
        }
    }
}

/// A comma-separated list of CIDRs with at most one per family (`clusterCIDR`,
/// `--service-cluster-ip-range`). Returns the first problem.
fn dual_stack_cidrs(text: &str) -> Result<(), String> {
    let mut fams: Vec<IpFamily> = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let c = parse_cidr(part).map_err(|e| {
            if text.contains(',') {
                format!("`{part}` is not a valid CIDR: {e}")
            } else {
                format!("not a valid CIDR: {e}")
            }
        })?;
        if fams.contains(&c.family()) {
            return Err(format!(
                "more than one {} CIDR: give at most one CIDR per IP family",
                c.family().as_str()
            ));
        }
        fams.push(c.family());
    }
    Ok(())
}

/// IPVS mode's deprecation (KEP-5495), unlocated: `mode: ipvs` gives it at the field,
/// and the CLI gives it for `--target ipvs` (`svc_targets::Target::deprecated`) when the
/// compile did not, so it is said once.
pub fn ipvs_deprecated() -> Diagnostic {
    Diagnostic::warning(
        "SVC321",
        "IPVS mode is deprecated (KEP-5495): deprecated in Kubernetes 1.35, off by default in 1.40, removed in 1.46",
    )
    .hint("nftables mode is its replacement: `mode: nftables`, `--target nftables`")
}

fn proxy(cx: &mut Cx, p: &ProxyConfigDoc) {
    if let Some(m) = &p.mode {
        let known = cx.one_of(
            "SVC308",
            m,
            &["", "iptables", "ipvs", "nftables"],
            "kube-proxy mode",
            "mode",
        );
        if known && m.v == "ipvs" {
            cx.push(ipvs_deprecated().at(m.span).path("mode"));
        }
    }
    for (b, path) in &p.masquerade_bits {
        if !(0..=31).contains(&b.v) {
            cx.push(
                Diagnostic::error(
                    "SVC309",
                    format!(
                        "masqueradeBit {} is out of range: must be between 0 and 31",
                        b.v
                    ),
                )
                .at(b.span)
                .path(*path)
                .hint("the mark is 1 << masqueradeBit on a 32-bit fwmark; the default is 14"),
            );
        }
    }
    let cluster_cidr = p.cluster_cidr.as_ref().filter(|c| !c.v.trim().is_empty());
    if let Some(c) = cluster_cidr {
        if let Err(e) = dual_stack_cidrs(&c.v) {
            cx.push(
                Diagnostic::error("SVC310", format!("invalid clusterCIDR `{}`: {e}", c.v))
                    .at(c.span)
                    .path("clusterCIDR")
                    .hint("write one CIDR, or an IPv4 and an IPv6 CIDR separated by a comma (10.244.0.0/16,fd00:10:244::/56)"),
            );
        }
    }
    if let Some(m) = &p.detect_local_mode {
        let ok = cx.one_of(
            "SVC311",
            m,
            &[
                "",
                "ClusterCIDR",
                "NodeCIDR",
                "BridgeInterface",
                "InterfaceNamePrefix",
            ],
            "detectLocalMode",
            "detectLocalMode",
        );
        let needs = |field: &Option<Sp<String>>, name: &str, cx: &mut Cx| {
            if field.as_ref().is_none_or(|f| f.v.is_empty()) {
                cx.push(
                    Diagnostic::error(
                        "SVC312",
                        format!("detectLocalMode {} needs detectLocal.{name}", m.v),
                    )
                    .at(m.span)
                    .path(format!("detectLocal.{name}"))
                    .hint(format!(
                        "add `detectLocal: {{{name}: ...}}` naming the interface"
                    )),
                );
            }
        };
        match m.v.as_str() {
            _ if !ok => {}
            "BridgeInterface" => needs(&p.bridge_interface, "bridgeInterface", cx),
            "InterfaceNamePrefix" => needs(&p.interface_name_prefix, "interfaceNamePrefix", cx),
            "ClusterCIDR" if cluster_cidr.is_none() => cx.push(
                Diagnostic::warning(
                    "SVC313",
                    "detectLocalMode ClusterCIDR without clusterCIDR: no traffic counts as local",
                )
                .at(m.span)
                .path("clusterCIDR")
                .hint("set clusterCIDR to the pod network, or pick another detectLocalMode"),
            ),
            _ => {}
        }
    }
    let addrs = &p.node_port_addresses;
    for (i, a) in addrs.iter().enumerate() {
        let path = format!("nodePortAddresses[{i}]");
        if a.v == "primary" {
            if addrs.len() != 1 {
                cx.push(
                    Diagnostic::error("SVC314", "nodePortAddresses cannot mix `primary` and CIDRs")
                        .at(a.span)
                        .path(path)
                        .hint("use `[primary]` alone, or list CIDRs only"),
                );
            }
        } else if let Err(e) = parse_cidr(&a.v) {
            cx.push(
                Diagnostic::error(
                    "SVC314",
                    format!("nodePortAddresses entry `{}` is not a valid CIDR: {e}", a.v),
                )
                .at(a.span)
                .path(path)
                .hint("write CIDRs such as 192.168.0.0/16, or `primary`"),
            );
        }
    }
    if let Some(s) = p.ipvs_scheduler.as_ref().filter(|s| !s.v.is_empty()) {
        cx.one_of(
            "SVC315",
            s,
            &[
                "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh",
            ],
            "IPVS scheduler",
            "ipvs.scheduler",
        );
    }
    for (t, path) in
        p.ipvs_timeouts
            .iter()
            .zip(["ipvs.tcpTimeout", "ipvs.tcpFinTimeout", "ipvs.udpTimeout"])
    {
        let Some(t) = t else { continue };
        if let Err(e) = crate::decode::go_duration_secs(&t.v) {
            cx.push(
                Diagnostic::error("SVC319", format!("invalid {path} `{}`: {e}", t.v))
                    .at(t.span)
                    .path(path)
                    .hint("write a duration such as 900s or 15m (0 keeps the kernel's value)"),
            );
        }
    }
    for (t, path) in p.conntrack_timeouts.iter().zip([
        "conntrack.tcpEstablishedTimeout",
        "conntrack.tcpCloseWaitTimeout",
        "conntrack.udpTimeout",
        "conntrack.udpStreamTimeout",
    ]) {
        let Some(t) = t else { continue };
        if let Err(e) = crate::decode::go_duration_secs(&t.v) {
            cx.push(
                Diagnostic::error("SVC330", format!("invalid {path} `{}`: {e}", t.v))
                    .at(t.span)
                    .path(path)
                    .hint("write a duration such as 24h0m0s or 1h (0 keeps the kernel's value)"),
            );
        }
    }
    for (n, path) in p
        .conntrack_counts
        .iter()
        .zip(["conntrack.maxPerCore", "conntrack.min"])
    {
        let Some(n) = n else { continue };
        if u32::try_from(n.v).is_err() {
            cx.push(
                Diagnostic::error("SVC330", format!("invalid {path} `{}`", n.v))
                    .at(n.span)
                    .path(path)
                    .hint(
                        "write a count from 0 to 4294967295 (maxPerCore 0 keeps nf_conntrack_max)",
                    ),
            );
        }
    }
    for c in &p.ipvs_exclude_cidrs {
        if let Err(e) = parse_cidr(&c.v) {
            cx.push(
                Diagnostic::error(
                    "SVC319",
                    format!("ipvs.excludeCIDRs entry `{}` is not a valid CIDR: {e}", c.v),
                )
                .at(c.span)
                .path("ipvs.excludeCIDRs")
                .hint("write CIDRs such as 10.96.0.0/12"),
            );
        }
    }
}

/// `LOW-HIGH`, `BASE+OFFSET` or a single port, as `--service-node-port-range` accepts.
fn port_range(text: &str) -> Result<(), String> {
    let t = text.trim();
    let num = |s: &str| {
        s.trim()
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=65535).contains(n))
            .ok_or_else(|| format!("`{}` is not a port number (1-65535)", s.trim()))
    };
    let (lo, hi) = if let Some((a, b)) = t.split_once('-') {
        (num(a)?, num(b)?)
    } else if let Some((a, b)) = t.split_once('+') {
        let lo = num(a)?;
        let off: u32 = b
            .trim()
            .parse()
            .map_err(|_| format!("`{}` is not an offset", b.trim()))?;
        (lo, num(&(lo + off).to_string())?)
    } else {
        let p = num(t)?;
        (p, p)
    };
    if lo > hi {
        return Err(format!("the range {lo}-{hi} is empty"));
    }
    Ok(())
}

fn cluster(cx: &mut Cx, c: &ClusterConfigDoc) {
    if let Some(r) = &c.service_cluster_ip_range {
        if let Err(e) = dual_stack_cidrs(&r.v) {
            cx.push(
                Diagnostic::error(
                    "SVC316",
                    format!("invalid serviceClusterIPRange `{}`: {e}", r.v),
                )
                .at(r.span)
                .path("serviceClusterIPRange")
                .hint("write one CIDR, or an IPv4 and an IPv6 CIDR separated by a comma (10.96.0.0/12,fd00:10:96::/112)"),
            );
        }
    }
    if let Some(r) = &c.service_node_port_range {
        if let Err(e) = port_range(&r.v) {
            cx.push(
                Diagnostic::error(
                    "SVC317",
                    format!("invalid serviceNodePortRange `{}`: {e}", r.v),
                )
                .at(r.span)
                .path("serviceNodePortRange")
                .hint("write LOW-HIGH, e.g. 30000-32767"),
            );
        }
    }
    if let Some(d) = &c.cluster_domain {
        if let Err(e) = names::dns1123_subdomain(d.v.strip_suffix('.').unwrap_or(&d.v)) {
            cx.push(
                Diagnostic::error("SVC318", format!("invalid clusterDomain `{}`: {e}", d.v))
                    .at(d.span)
                    .path("clusterDomain")
                    .hint("the default is cluster.local"),
            );
        }
    }
    if let Some(l) = &c.nft_layout {
        if crate::ir::NftLayout::parse(&l.v).is_none() {
            cx.push(
                Diagnostic::error("SVC320", format!("unknown nftLayout `{}`", l.v))
                    .at(l.span)
                    .path("nftLayout")
                    .hint("write kube-proxy (the default) or fast"),
            );
        }
    }
    if let Some(t) = &c.topology_keys {
        if crate::ir::TopologyKeys::parse(&t.v).is_none() {
            cx.push(
                Diagnostic::error("SVC322", format!("unknown topologyKeys `{}`", t.v))
                    .at(t.span)
                    .path("topologyKeys")
                    .hint("write honour (the default: spec.topologyKeys picks endpoints) or ignore (as a current kube-proxy)"),
            );
        }
    }
    if let Some(r) = &c.dns_records {
        if crate::ir::DnsRecords::parse(&r.v).is_none() {
            cx.push(
                Diagnostic::error("SVC323", format!("unknown dnsRecords `{}`", r.v))
                    .at(r.span)
                    .path("dnsRecords")
                    .hint("write spec (the default: the Kubernetes DNS specification's records) or coredns (what CoreDNS's kubernetes plugin answers)"),
            );
        }
    }
    if let Some(m) = &c.ebpf_map_sizes {
        if let Err(e) = crate::ir::EbpfMapSizes::parse(&m.v) {
            cx.push(
                Diagnostic::error("SVC324", format!("invalid ebpfMapSizes: {e}"))
                    .at(m.span)
                    .path("ebpfMapSizes")
                    .hint("write KEY=N,... with keys all, services, backends, rev-nat, affinity, source-ranges, maglev, sock-rev (Cilium's --bpf-lb-*-map-max options)"),
            );
        }
    }
    use crate::ir::EbpfAgent;
    let agent_errors = [
        c.ebpf_lb_algorithm.as_ref().map(|a| {
            (
                "ebpfLbAlgorithm",
                a.span,
                EbpfAgent::parse_algorithm(&a.v).err(),
            )
        }),
        c.ebpf_maglev_table_size.as_ref().map(|m| {
            (
                "ebpfMaglevTableSize",
                m.span,
                EbpfAgent::parse_table_size(&m.v.to_string()).err(),
            )
        }),
        c.ebpf_maglev_hash_seed.as_ref().map(|h| {
            (
                "ebpfMaglevHashSeed",
                h.span,
                EbpfAgent::murmur_seed(&h.v).err(),
            )
        }),
    ];
    for (key, span, err) in agent_errors.into_iter().flatten() {
        if let Some(e) = err {
            cx.push(
                Diagnostic::error("SVC326", format!("invalid {key}: {e}"))
                    .at(span)
                    .path(key)
                    .hint("the cilium-agent would refuse to start: ebpfLbAlgorithm is random or maglev (--bpf-lb-algorithm), ebpfMaglevTableSize one of 251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071 (--bpf-lb-maglev-table-size), ebpfMaglevHashSeed base64 of 12 bytes (--bpf-lb-maglev-hash-seed)"),
            );
        }
    }
}
