//! The rules behind a [`svc_compiler::trace::Trace`]: for each step, the lines of a
//! compiled document (iptables-restore or nft text) that implement it. Chain names come
//! from the same helpers the back ends use (`common.rs`), so a trace names exactly the
//! chains the document has. Pure: the document is text handed in.

use crate::common::{endpoint_hash, hash_and_truncate, port_proto_hash};
use std::net::IpAddr;
use svc_compiler::ir::{NodeView, PortView};
use svc_compiler::trace::{Rule, Trace, Verdict};

/// Targets whose rules a trace can show. For `ipvs` only the virtual server and its real
/// servers (its iptables part is not traced, and its verdicts are not checked against
/// IPVS).
pub const TRACEABLE: &[&str] = &["iptables", "nftables", "ipvs"];

/// For each step of `t` (same order), the document lines that implement it (maybe none).
/// `dst`, `port`: the packet's destination (the service-match step shows only the rule
/// that matched it).
pub fn rules(
    target: &str,
    view: &NodeView,
    t: &Trace,
    dst: IpAddr,
    port: u16,
    doc: &str,
) -> Vec<Vec<String>> {
    let Some(pv) = t.port_index.map(|i| &view.ports[i]) else {
        return t.steps.iter().map(|_| Vec::new()).collect();
    };
    let backends: Vec<String> = match &t.verdict {
        Verdict::Forward { backends, .. } => backends.iter().map(|b| b.addr.clone()).collect(),
        _ => Vec::new(),
    };
    if target == "ipvs" {
        return ipvs_rules(t, pv, dst, port, doc);
    }
    let names = match target {
        "iptables" => iptables_names(pv, &backends),
        "nftables" => nft_names(pv, &backends),
        _ => return t.steps.iter().map(|_| Vec::new()).collect(),
    };
    t.steps
        .iter()
        .map(|s| select(target, doc, pv, &names, s.rule))
        .zip(&t.steps)
        .map(|(lines, s)| {
            if !matches!(s.rule, Rule::ServiceMatch | Rule::NoEndpoints) {
                return lines;
            }
            // Only the rules or elements for this destination.
            let (by_ip, by_port) = if target == "iptables" {
                (
                    format!(" -d {dst} --dport {port} "),
                    format!(" --dport {port} "),
                )
            } else {
                (
                    format!("{{ {dst} . {} . {port} ", pv.protocol.lower()),
                    format!("{{ {} . {port} ", pv.protocol.lower()),
                )
            };
            let node_port = t.matched == Some(svc_compiler::trace::Match::NodePort);
            lines
                .into_iter()
                .filter(|l| {
                    if node_port {
                        l.contains(&by_port)
                            && (l.contains("NODEPORTS")
                                || l.contains("nodeports")
                                || l.contains("--dst-type LOCAL"))
                    } else {
                        l.contains(&by_ip)
                    }
                })
                .collect()
        })
        .collect()
}

/// IPVS: the virtual server `-A -t VIP:PORT` at the service-match step, its real servers
/// (`-a ... -r BACKEND`) at the endpoints step, from the `ipvsadm-save` part.
fn ipvs_rules(t: &Trace, pv: &PortView, dst: IpAddr, port: u16, doc: &str) -> Vec<Vec<String>> {
    let flag = match pv.protocol {
        svc_compiler::ir::Protocol::TCP => "-t",
        svc_compiler::ir::Protocol::UDP => "-u",
        svc_compiler::ir::Protocol::SCTP => "--sctp-service",
    };
    let vip = match dst {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    };
    let virtual_server = format!("-A {flag} {vip} ");
    let real = format!("-a {flag} {vip} -r ");
    let backends: Vec<String> = match &t.verdict {
        Verdict::Forward { backends, .. } => backends.iter().map(|b| b.addr.clone()).collect(),
        _ => Vec::new(),
    };
    t.steps
        .iter()
        .map(|s| match s.rule {
            Rule::ServiceMatch => doc
                .lines()
                .filter(|l| l.starts_with(&virtual_server))
                .map(str::to_string)
                .collect(),
            Rule::Endpoints => doc
                .lines()
                .filter(|l| {
                    l.strip_prefix(&real)
                        .is_some_and(|r| backends.iter().any(|b| r.starts_with(&format!("{b} "))))
                })
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// The per-port chain names: cluster policy, local policy, external, firewall, endpoints.
struct Names {
    cluster: String,
    local: String,
    external: String,
    firewall: String,
    endpoints: Vec<String>,
}

fn iptables_names(pv: &PortView, backends: &[String]) -> Names {
    let proto = pv.protocol.lower();
    let h = port_proto_hash(&pv.spn, proto);
    Names {
        cluster: format!("KUBE-SVC-{h}"),
        local: format!("KUBE-SVL-{h}"),
        external: format!("KUBE-EXT-{h}"),
        firewall: format!("KUBE-FW-{h}"),
        endpoints: backends
            .iter()
            .map(|a| format!("KUBE-SEP-{}", endpoint_hash(&pv.spn, proto, a)))
            .collect(),
    }
}

fn nft_names(pv: &PortView, backends: &[String]) -> Names {
    let proto = pv.protocol.lower();
    let base = hash_and_truncate(&format!(
        "{}/{}/{}/{}",
        pv.namespace, pv.name, proto, pv.port_name
    ));
    let endpoint = |addr: &str| {
        let e = pv.endpoints.iter().find(|e| &*e.addr == addr);
        let (ip, port) = match e {
            Some(e) => (e.ip.to_string().replace(':', "."), e.port),
            None => (String::new(), 0),
        };
        format!(
            "endpoint-{}",
            hash_and_truncate(&format!(
                "{}/{}/{}/{}__{ip}/{port}",
                pv.namespace, pv.name, proto, pv.port_name
            ))
        )
    };
    Names {
        cluster: format!("service-{base}"),
        local: format!("local-{base}"),
        external: format!("external-{base}"),
        firewall: format!("firewall-{base}"),
        endpoints: backends.iter().map(|a| endpoint(a)).collect(),
    }
}

/// iptables: the chain's `-A CHAIN ...` lines; nftables: its `add rule` lines.
fn chain_lines(target: &str, doc: &str, chain: &str) -> Vec<String> {
    if target == "iptables" {
        let head = format!("-A {chain} ");
        return doc
            .lines()
            .filter(|l| l.starts_with(&head))
            .map(str::to_string)
            .collect();
    }
    // `add rule <family> kube-proxy <chain> ...`
    doc.lines()
        .filter(|l| l.starts_with("add rule ") && l.split(' ').nth(4) == Some(chain))
        .map(str::to_string)
        .collect()
}

fn select(target: &str, doc: &str, pv: &PortView, n: &Names, rule: Rule) -> Vec<String> {
    let ipt = target == "iptables";
    let all = |chains: &[&str]| -> Vec<String> {
        chains
            .iter()
            .flat_map(|c| chain_lines(target, doc, c))
            .collect()
    };
    // Lines outside the port's own chains that mention the port: the service-match
    // jumps (iptables) or map elements (nft, by their comment or verdict).
    let mentions = |pred: &dyn Fn(&str) -> bool| -> Vec<String> {
        doc.lines()
            .filter(|l| {
                (l.contains(&n.cluster)
                    || l.contains(&n.external)
                    || l.contains(&n.firewall)
                    || l.contains(&n.local)
                    || l.contains(&format!("{} ", pv.spn))
                    || l.contains(&format!("\"{}\"", pv.spn)))
                    && pred(l)
            })
            .map(|l| l.trim().to_string())
            .collect()
    };
    match rule {
        Rule::ServiceMatch => mentions(&|l| {
            if ipt {
                (l.starts_with("-A KUBE-SERVICES ") || l.starts_with("-A KUBE-NODEPORTS "))
                    && !l.ends_with("-j REJECT")
                    && !l.ends_with("-j DROP")
            } else {
                l.starts_with("add element ") && !l.contains("no-endpoint-")
            }
        }),
        Rule::Firewall => {
            let mut v = all(&[&n.firewall]);
            if !ipt {
                v.extend(mentions(&|l| {
                    l.starts_with("add element ") && l.contains("firewall-ips")
                }));
            }
            v
        }
        Rule::ExternalPolicy => all(&[&n.external]),
        Rule::ClusterPolicy | Rule::Affinity => all(&[&n.cluster]),
        Rule::LocalPolicy => all(&[&n.local]),
        Rule::Masquerade => {
            let masq = if ipt {
                "KUBE-MARK-MASQ"
            } else {
                "mark-for-masquerade"
            };
            all(&[&n.cluster, &n.external])
                .into_iter()
                .chain(n.endpoints.iter().flat_map(|c| chain_lines(target, doc, c)))
                .filter(|l| l.contains(masq))
                .collect()
        }
        Rule::Endpoints => n
            .endpoints
            .iter()
            .flat_map(|c| chain_lines(target, doc, c))
            .collect(),
        Rule::NoEndpoints => mentions(&|l| {
            l.contains("REJECT") || l.contains("DROP") || l.contains("reject") || l.contains("drop")
        }),
        Rule::Source | Rule::NoMatch => Vec::new(),
    }
}
