//! The writes of an incremental apply, step by step against a model of the maps (each
//! op applied in order, with each map's capacity): what a datapath reading between two
//! writes sees, and whether the maps can hold every moment.
use super::layout::V6_BACKEND_BASE;
use super::plan::*;
use super::*;
use std::collections::BTreeMap;
use svc_compiler::net::IpFamily;

const NODES: &str = "
apiVersion: v1
kind: Node
metadata: {name: node-1}
spec: {podCIDRs: [10.244.1.0/24]}
status: {addresses: [{type: InternalIP, address: 192.0.2.10}]}
";

fn view(docs: &[&str], fam: IpFamily) -> NodeView {
    super::tests::view_in(docs, fam)
}

fn svc(name: &str, ip: &str, extra: &str, eps: &[&str]) -> String {
    let at = if ip.contains(':') { "IPv6" } else { "IPv4" };
    let lat = at.to_lowercase();
    let eps: String = eps
        .iter()
        .map(|a| format!("- {{addresses: [\"{a}\"], nodeName: node-1}}\n"))
        .collect();
    format!(
        "
apiVersion: v1
kind: Service
metadata: {{name: {name}-{lat}}}
spec:
  clusterIP: \"{ip}\"
  ipFamilies: [{at}]
{extra}  ports: [{{port: 80, targetPort: 8080, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-{lat}-1, labels: {{kubernetes.io/service-name: {name}-{lat}}}}}
addressType: {at}
ports: [{{port: 8080, protocol: TCP}}]
endpoints:
{eps}---
"
    )
}

const AFF: &str = "  sessionAffinity: ClientIP\n";

fn contents(w: &Wanted) -> BTreeMap<String, Contents> {
    w.expected()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// Applies ops one at a time to `now`, with a per-map capacity; calls `check` after each.
fn run(
    now: &mut BTreeMap<String, Contents>,
    ops: &[Op],
    cap: &dyn Fn(&str) -> usize,
    check: &mut dyn FnMut(usize, &BTreeMap<String, Contents>),
) -> Result<(), String> {
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Update { map, key, value } => {
                let m = now.entry(map.clone()).or_default();
                if !m.contains_key(key) && m.len() >= cap(map) {
                    return Err(format!("op {i}: E2BIG in {map} ({} entries)", m.len()));
                }
                m.insert(key.clone(), value.clone());
            }
            Op::Delete { map, key } => {
                now.entry(map.clone()).or_default().remove(key);
            }
        }
        check(i, now);
    }
    Ok(())
}

use super::tests::shapes_of;

/// The affinity-match map both families share is sized for both families' entries.
#[test]
fn the_shared_affinity_match_map_holds_both_families() {
    let v4 = svc(
        "aff",
        "10.96.0.40",
        AFF,
        &["10.244.1.2", "10.244.1.3", "10.244.1.4"],
    );
    let a6 = svc("a", "fd00::1", "", &["fd00:244::9"]);
    let v6 = svc(
        "aff",
        "fd00::40",
        AFF,
        &["fd00:244::2", "fd00:244::3", "fd00:244::4"],
    );
    let l4 = layout(
        &view(&[NODES, &v4], IpFamily::IPv4),
        None,
        &MapSizes::default(),
    )
    .unwrap();
    let l6 = layout(
        &view(&[NODES, &a6, &v6], IpFamily::IPv6),
        None,
        &MapSizes::default(),
    )
    .unwrap();
    let w = Wanted::from_layouts(&[&l4, &l6]).complete(&MapSizes::default());
    let m = &w.maps["cilium_lb_affinity_match"];
    assert!(
        m.entries.len() <= m.max_entries as usize,
        "{} > {}",
        m.entries.len(),
        m.max_entries
    );
    let mut now = BTreeMap::new();
    let caps: BTreeMap<String, usize> = w
        .maps
        .values()
        .map(|m| (m.name.clone(), m.max_entries as usize))
        .collect();
    run(
        &mut now,
        &diff(&w, &BTreeMap::new()),
        &|n| caps[n],
        &mut |_, _| {},
    )
    .unwrap();
}

/// Updates come before deletes, so a map holds old and new keys at once: `fits` with the
/// maps' contents counts that moment, and a change that would overflow in place asks for
/// a new generation.
#[test]
fn fits_counts_the_moment_old_and_new_keys_are_both_there() {
    let old = svc(
        "a",
        "10.96.0.40",
        "",
        &["10.244.1.2", "10.244.1.3", "10.244.1.4"],
    );
    let new = svc(
        "b",
        "10.96.0.41",
        "",
        &["10.244.1.2", "10.244.1.3", "10.244.1.4"],
    );
    // Maps just big enough for one service's four service entries.
    let sizes = MapSizes::all(4);
    let lo = layout(&view(&[NODES, &old], IpFamily::IPv4), None, &sizes).unwrap();
    let ln = layout(&view(&[NODES, &new], IpFamily::IPv4), Some(&lo.ids), &sizes).unwrap();
    let (wo, wn) = (
        Wanted::from_layouts(&[&lo]).complete(&sizes),
        Wanted::from_layouts(&[&ln]).complete(&sizes),
    );
    let shapes = shapes_of(&wo);
    let now = contents(&wo);
    // The final state fits; the writes in place would not.
    assert_eq!(fits(&wn, &shapes, None), None);
    let mut model = now.clone();
    let cap = |n: &str| shapes[n].max_entries as usize;
    assert!(run(&mut model, &diff(&wn, &now), &cap, &mut |_, _| {}).is_err());
    let why = fits(&wn, &shapes, Some(&now)).expect("a new generation");
    assert!(why.contains("at once"), "{why}");
}

fn masters(now: &BTreeMap<String, Contents>) -> Vec<(Vec<u8>, Vec<u8>)> {
    now.get("cilium_lb4_services_v2")
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k[6] == 0 && k[7] == 0)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// One scope to two (externalTrafficPolicy: Local): no moment has an external master
/// flagged TWO_SCOPES without its internal-scope master.
#[test]
fn a_two_scope_master_never_points_at_a_missing_internal_one() {
    let np = |etp: &str| {
        format!(
            "
apiVersion: v1
kind: Service
metadata: {{name: np}}
spec:
  type: NodePort
  clusterIP: 10.96.0.50
  externalTrafficPolicy: {etp}
  ports: [{{port: 80, targetPort: 8080, nodePort: 30080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: np-1, labels: {{kubernetes.io/service-name: np}}}}
addressType: IPv4
ports: [{{port: 8080, protocol: TCP}}]
endpoints:
- {{addresses: [10.244.1.2], nodeName: node-1}}
"
        )
    };
    let v = |etp: &str| view(&[NODES, &np(etp)], IpFamily::IPv4);
    let lo = layout(&v("Cluster"), None, &MapSizes::default()).unwrap();
    let ln = layout(&v("Local"), Some(&lo.ids), &MapSizes::default()).unwrap();
    let (wo, wn) = (Wanted::from_layouts(&[&lo]), Wanted::from_layouts(&[&ln]));
    let mut now = contents(&wo);
    let mut bad = Vec::new();
    let mut two = false;
    run(
        &mut now,
        &diff(&wn, &contents(&wo)),
        &|_| usize::MAX,
        &mut |i, now| {
            let ms = masters(now);
            for (k, v) in &ms {
                if k[9] == 0 && v[9] & (1 << 5) != 0 {
                    two = true;
                    let mut ik = k.clone();
                    ik[9] = 1;
                    if !ms.iter().any(|(k2, _)| *k2 == ik) {
                        bad.push((i, hex(k)));
                    }
                }
            }
        },
    )
    .unwrap();
    assert!(two, "the change made no two-scope master");
    assert!(
        bad.is_empty(),
        "two-scope masters without their internal one: {bad:?}"
    );
}

/// A backend gone in this apply keeps its id out of the new backends' reach: no moment
/// has a slot of the old service resolve to another service's backend.
#[test]
fn a_slot_never_resolves_to_another_services_backend() {
    let dns = |eps: &[&str]| svc("dns", "10.96.0.10", "", eps);
    let v = |docs: &[&str]| view(docs, IpFamily::IPv4);
    let lo = layout(
        &v(&[NODES, &dns(&["10.244.1.3", "10.244.1.5"])]),
        None,
        &MapSizes::default(),
    )
    .unwrap();
    let api = svc("zapi", "10.96.0.77", "", &["10.244.1.4"]);
    let ln = layout(
        &v(&[NODES, &dns(&["10.244.1.5"]), &api]),
        Some(&lo.ids),
        &MapSizes::default(),
    )
    .unwrap();
    let (wo, wn) = (Wanted::from_layouts(&[&lo]), Wanted::from_layouts(&[&ln]));
    let mut now = contents(&wo);
    let mut bad = Vec::new();
    run(
        &mut now,
        &diff(&wn, &contents(&wo)),
        &|_| usize::MAX,
        &mut |i, now| {
            for (k, v) in &now["cilium_lb4_services_v2"] {
                if k[..4] == [10, 96, 0, 10] && (k[6] != 0 || k[7] != 0) {
                    if let Some(b) = now["cilium_lb4_backends_v3"].get(&v[..4]) {
                        if b[..4] != [10, 244, 1, 3] && b[..4] != [10, 244, 1, 5] {
                            bad.push((i, format!("dns slot {} -> {:?}", k[6], &b[..4])));
                        }
                    }
                }
            }
        },
    )
    .unwrap();
    assert!(bad.is_empty(), "{bad:?}");
}

/// Two services on one external IP and port: one master for the key (the first service),
/// so what is written reads back as wanted and a second apply writes nothing.
#[test]
fn two_services_on_one_frontend_read_back_as_written() {
    let a = svc(
        "a",
        "10.96.0.40",
        "  externalIPs: [198.51.100.7]\n",
        &["10.244.1.2"],
    );
    let b = svc(
        "b",
        "10.96.0.41",
        "  externalIPs: [198.51.100.7]\n",
        &["10.244.1.3", "10.244.1.4"],
    );
    let l = layout(
        &view(&[NODES, &a, &b], IpFamily::IPv4),
        None,
        &MapSizes::default(),
    )
    .unwrap();
    let w = Wanted::from_layouts(&[&l]);
    let mut now = BTreeMap::new();
    run(
        &mut now,
        &diff(&w, &BTreeMap::new()),
        &|_| usize::MAX,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(first_mismatch(&w, &now), None);
    assert!(diff(&w, &now).is_empty());
}

/// The affinity-match map both families share is keyed by (backend id, rev-NAT id): IPv6
/// backend ids are apart from IPv4 ones, so no IPv6 entry keeps an IPv4 pair wanted after
/// IPv4 gave that backend id to another service's backend.
#[test]
fn affinity_matches_of_the_two_families_never_share_a_key() {
    let v4 = svc("aff", "10.96.0.40", AFF, &["10.244.1.2", "10.244.1.3"]);
    let v6 = svc("aff", "fd00::40", AFF, &["fd00:244::2", "fd00:244::3"]);
    let l4 = layout(
        &view(&[NODES, &v4], IpFamily::IPv4),
        None,
        &MapSizes::default(),
    )
    .unwrap();
    let l6 = layout(
        &view(&[NODES, &v6], IpFamily::IPv6),
        None,
        &MapSizes::default(),
    )
    .unwrap();
    assert!(l4.ids.backends.values().all(|&id| id < V6_BACKEND_BASE));
    assert!(l6.ids.backends.values().all(|&id| id >= V6_BACKEND_BASE));
    // IPv4's aff loses 10.244.1.3; a later apply gives its id to another service's backend.
    let v4b = svc("aff", "10.96.0.40", AFF, &["10.244.1.2"]);
    let l4b = layout(
        &view(&[NODES, &v4b], IpFamily::IPv4),
        Some(&l4.ids),
        &MapSizes::default(),
    )
    .unwrap();
    let other = svc("zz", "10.96.0.99", "", &["10.244.1.9"]);
    let l4c = layout(
        &view(&[NODES, &v4b, &other], IpFamily::IPv4),
        Some(&l4b.ids),
        &MapSizes::default(),
    )
    .unwrap();
    let w = Wanted::from_layouts(&[&l4c, &l6]).complete(&MapSizes::default());
    let aff_rev = l4c
        .ids
        .services
        .iter()
        .find(|(f, _)| f.addr.to_string() == "10.96.0.40:80")
        .unwrap()
        .1;
    let w9 = l4c
        .ids
        .backends
        .iter()
        .find(|(b, _)| b.addr.ip().to_string() == "10.244.1.9")
        .unwrap()
        .1;
    let mut k = w9.to_le_bytes().to_vec();
    k.extend(aff_rev.to_be_bytes());
    k.extend([0, 0]);
    let wanted = &w.maps["cilium_lb_affinity_match"].entries;
    assert!(
        !wanted.iter().any(|(kk, _)| *kk == k),
        "a stale pair is kept wanted"
    );
    assert_eq!(wanted.len(), 1 + 2, "aff's one IPv4 and two IPv6 matches");
}
