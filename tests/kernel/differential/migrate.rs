//! `svc-compile migrate --from iptables --to nftables` against the kernel: for every
//! manifest of the differential run, the flows where the two labs' outcomes differ
//! (the comparison key of [`super::key`]) must be exactly the flows `migrate` reports as
//! differing.
//!
//! Each lab flow is matched to `migrate`'s flow of the same destination (`ip:port`; for the
//! cluster IP's unknown port, the address's "other port" flow) and client class: the node
//! (to 127.0.0.1: localhost), a LAN client (inside or outside a load-balancer IP's source
//! ranges), a local pod (hairpin when it is a local endpoint of the service port).
//! `migrate` gets the lab node's pod gateway as `--local-ip`, as `trace` does. A reported
//! difference whose two fates the lab cannot tell apart (routed on with nobody there and
//! dropped both time out) is counted as unobservable and then must not show; one whose
//! backends the lab does not serve is not checked.

use super::{class, key, Flow, Manifest, Seen, View, NODE, SERVED_PORTS};
use crate::support::{root, svc};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// What the run saw of `migrate`'s claims.
#[derive(Default)]
pub(super) struct Counts {
    /// Lab flows matched to a `migrate` flow and checked.
    pub checked: usize,
    /// Of those, reported as differing (and seen differing).
    pub differing: usize,
    /// Reported, but not observable in the lab (and not seen differing), by the reasons
    /// `migrate` gave.
    pub unobservable: BTreeMap<String, usize>,
}

/// `migrate`'s differences: (destination, client class) → (iptables fate, nftables fate,
/// the reasons' rules).
pub(super) type Claims = BTreeMap<(String, String), (Value, Value, String)>;

/// `svc-compile migrate … --format json` for this manifest; exit 1 (differences) or 0.
pub(super) fn claims(m: &Manifest, family: crate::kernel::Family) -> Claims {
    let [gw, lan] = Manifest::local_ips(family);
    let mut a: Vec<String> = vec!["migrate".into()];
    match &m.case {
        Some(case) => {
            a.push(format!("golden/cases/{case}"));
            a.extend(crate::golden::case_args(case));
        }
        None => a.extend(["-".into(), "--node".into(), NODE.into()]),
    }
    for s in [
        "--from",
        "iptables",
        "--to",
        "nftables",
        "--format",
        "json",
        "--local-ip",
        &gw,
        "--local-ip",
        &lan,
    ] {
        a.push(s.into());
    }
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let r = svc(&a, m.text.as_deref(), &root());
    assert!(
        r.code == 0 || r.code == 1,
        "{}: `{}` exited {}\n{}",
        m.label,
        r.cmdline,
        r.code,
        r.stderr
    );
    let report: Value = serde_json::from_str(&r.stdout).expect("migrate JSON");
    let mut out = Claims::new();
    let family_name = match family {
        crate::kernel::Family::V4 => "IPv4",
        crate::kernel::Family::V6 => "IPv6",
    };
    let nodes = report["nodes"].as_array().expect("nodes");
    assert!(
        nodes.iter().any(|n| n["family"] == family_name),
        "{}: `migrate` reports no {family_name} node view",
        m.label
    );
    for n in nodes {
        if n["family"] != family_name {
            continue;
        }
        for d in n["differences"].as_array().expect("differences") {
            let to = d["destination"].as_str().expect("destination").to_string();
            let dst = if d["frontend"] == "other-port" {
                let addr: std::net::SocketAddr = to.parse().expect("an other-port destination");
                format!("other {}", addr.ip())
            } else {
                to
            };
            let client = d["client"].as_str().expect("client").to_string();
            let why: Vec<&str> = d["why"]
                .as_array()
                .expect("why")
                .iter()
                .filter_map(|w| w["rule"].as_str())
                .collect();
            out.insert(
                (dst, client),
                (d["before"].clone(), d["after"].clone(), why.join("+")),
            );
        }
    }
    assert_eq!(
        r.code == 1,
        !report["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["differences"].as_array().unwrap().is_empty()),
        "{}: exit code {} and the report disagree",
        m.label,
        r.code
    );
    out
}

/// The `migrate` key of a lab flow: its destination and client class.
fn flow_key(f: &Flow, view: &View) -> (String, String) {
    let spec = crate::kernel::LabSpec::default();
    let ip_of = |name: &str| {
        spec.local_pods
            .iter()
            .chain(&spec.clients)
            .find(|h| h.name == name)
            .map(|h| crate::kernel::lab::addr::of(h.ip, view.family))
    };
    let port = view
        .ports
        .iter()
        .find(|p| f.what.starts_with(&format!("{} ", p.spn)));
    let client = match f.from.as_str() {
        "node" if f.dst.ip().is_loopback() => "localhost",
        "node" => "node",
        c if c.starts_with("client") => {
            let ranges = port.map(|p| &p.source_ranges[..]).unwrap_or(&[]);
            match ip_of(c) {
                Some(ip) if f.kind == "load-balancer IP" && !ranges.is_empty() => {
                    if ranges.iter().any(|r| r.contains(ip)) {
                        "lan-allowed"
                    } else {
                        "lan-denied"
                    }
                }
                _ => "lan",
            }
        }
        // `migrate` sends another port's packets from a pod that is no endpoint; without
        // a local-traffic detector a pod is no different from a LAN client, and it sends
        // them from one.
        _ if f.kind == "cluster IP, unknown port" && view.detector.is_none() => "lan",
        _ if f.kind == "cluster IP, unknown port" => "pod",
        pod => match (ip_of(pod), port) {
            (Some(ip), Some(p)) if p.local_endpoint_ips.contains(&ip) => "hairpin",
            _ => "pod",
        },
    };
    let dst = if f.kind == "cluster IP, unknown port" {
        format!("other {}", f.dst.ip())
    } else {
        f.dst.to_string()
    };
    (dst, client.to_string())
}

/// What the lab can show of a fate: `Some(refused|silent|backend:port→masq…)`, `None`
/// when a backend is not served.
fn observable(fate: &Value, f: &Flow) -> Option<String> {
    Some(match fate["kind"].as_str()? {
        "reject" | "local" => "refused".into(),
        "drop" | "routed" => "silent".into(),
        "forward" => {
            let mut v = BTreeSet::new();
            for b in fate["backends"].as_array()? {
                let addr: std::net::SocketAddr = b["addr"].as_str()?.parse().ok()?;
                let port = addr.port();
                SERVED_PORTS.contains(&port).then_some(())?;
                let pod = super::pod_at(addr.ip())?;
                // The node's own packet: a node address whether masqueraded or not.
                let masq = b["sees"]["kind"] != "client" && f.from != "node";
                v.insert(format!("{pod}:{port}={masq}"));
            }
            format!("{v:?} sticky={}", fate["sticky"])
        }
        _ => return None,
    })
}

/// Whether the two labs' outcomes differ, as the differential compares them.
fn observed_differs(f: &Flow, s: &[Seen; 2]) -> bool {
    key(f, &s[0]) != key(f, &s[1])
}

/// The failures of one manifest's flows against `migrate`'s claims.
pub(super) fn check(
    claims: &Claims,
    flows: &[Flow],
    seen: &[[Seen; 2]],
    view: &View,
    counts: &mut Counts,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (f, s) in flows.iter().zip(seen) {
        let k = flow_key(f, view);
        let observed = observed_differs(f, s);
        let brief = |s: &Seen| {
            let mut v: BTreeSet<&str> = s.others.iter().map(|o| class(o)).collect();
            if !s.answers.is_empty() {
                v.insert("answered");
            }
            v.into_iter().collect::<Vec<_>>().join("+")
        };
        match claims.get(&k) {
            None => {
                counts.checked += 1;
                if observed {
                    failures.push(format!(
                        "  {}: the labs differ (iptables {}, nftables {}), `migrate` reports no \
                         difference for {k:?}",
                        f.line(),
                        brief(&s[0]),
                        brief(&s[1])
                    ));
                }
            }
            Some((a, b, why)) => {
                let (Some(oa), Some(ob)) = (observable(a, f), observable(b, f)) else {
                    continue; // a backend the lab does not serve
                };
                counts.checked += 1;
                if oa == ob {
                    *counts.unobservable.entry(why.clone()).or_default() += 1;
                    if observed {
                        failures.push(format!(
                            "  {}: `migrate`'s difference ({a} vs {b}) should not show in the \
                             lab, yet the labs differ (iptables {}, nftables {})",
                            f.line(),
                            brief(&s[0]),
                            brief(&s[1])
                        ));
                    }
                } else if observed {
                    counts.differing += 1;
                } else {
                    failures.push(format!(
                        "  {}: `migrate` reports {a} vs {b}, the labs agree ({})",
                        f.line(),
                        brief(&s[0])
                    ));
                }
            }
        }
    }
    failures
}
