//! Byte layouts against hand-computed bytes (from the `lb.h` struct definitions),
//! id stability and determinism.

use super::*;
use svc_compiler::net::IpFamily;
use svc_compiler::passes::node::{node_view, NodeSelection};
use svc_compiler::source::SourceMap;

const NODES: &str = "
apiVersion: v1
kind: Node
metadata: {name: node-1}
spec: {podCIDRs: [10.244.1.0/24]}
status: {addresses: [{type: InternalIP, address: 192.0.2.10}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-2}
spec: {podCIDRs: [10.244.2.0/24]}
status: {addresses: [{type: InternalIP, address: 198.51.100.2}]}
";

/// dns: ClusterIP UDP with two endpoints, one terminating-but-not-ready left out by the
/// view; web: LoadBalancer, ETP=Local, affinity 300 s, a source range.
const SERVICES: &str = "
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: kube-system}
spec:
  clusterIP: 10.96.0.10
  selector: {app: dns}
  ports: [{port: 53, protocol: UDP, targetPort: 53}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: kube-system, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{port: 53, protocol: UDP}]
endpoints:
- {addresses: [10.244.2.3], nodeName: node-2}
- {addresses: [10.244.1.23], nodeName: node-1}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.12
  externalTrafficPolicy: Local
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 300}}
  selector: {app: web}
  loadBalancerSourceRanges: [192.0.2.0/24]
  ports: [{port: 80, targetPort: 8080, nodePort: 30082}]
status: {loadBalancer: {ingress: [{ip: 203.0.113.10}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-1}
- {addresses: [10.244.2.2], nodeName: node-2}
";

fn view_of(docs: &[&str]) -> NodeView {
    view_in(docs, IpFamily::IPv4)
}

/// The shapes of the maps `w` wants, as `bpftool map show` would give them.
pub(super) fn shapes_of(
    w: &super::plan::Wanted,
) -> std::collections::BTreeMap<String, super::plan::Shape> {
    w.maps
        .values()
        .map(|m| {
            (
                m.name.clone(),
                super::plan::Shape {
                    kind: m.kind.clone(),
                    key_size: m.key_size,
                    value_size: m.value_size,
                    max_entries: m.max_entries,
                },
            )
        })
        .collect()
}

/// The node-1 view of `docs` (compiled without errors) for `family`.
pub(super) fn view_in(docs: &[&str], family: IpFamily) -> NodeView {
    let mut sources = SourceMap::default();
    let files: Vec<_> = docs
        .iter()
        .enumerate()
        .map(|(i, t)| sources.add(format!("f{i}.yaml"), t.to_string()))
        .collect();
    let comp = svc_compiler::compile(&sources, &files, &svc_compiler::Options::default());
    assert!(!comp.diags.has_errors(), "{:?}", comp.diags);
    let sel = NodeSelection {
        name: "node-1".into(),
        ips: vec![],
    };
    node_view(&comp.module, &sel, family).unwrap()
}

fn find<'a>(l: &'a Layout, map: MapId, key: &str) -> &'a Entry {
    l.entries
        .iter()
        .find(|e| e.map() == map && hex(&e.key()) == key)
        .unwrap_or_else(|| panic!("no {map:?} entry with key {key}"))
}

#[test]
fn bytes_match_the_structs() {
    let l = layout(&view_of(&[NODES, SERVICES]), None, &MapSizes::default()).unwrap();
    // Frontends sorted by address, EXT before /i: 0.0.0.0:30082 (1, 2), 10.96.0.10:53 (3),
    // 10.96.0.12:80 (4), 192.0.2.10:30082 (5, 6), 203.0.113.10:80 (7, 8).
    let dns = &l.ids.services;
    let dns_fe = Frontend {
        addr: "10.96.0.10:53".parse().unwrap(),
        proto: svc_compiler::ir::Protocol::UDP,
        scope: Scope::External,
    };
    assert_eq!(dns[&dns_fe], 3);
    // Backends sorted: 10.244.1.2:8080/TCP=1, 10.244.1.23:53/UDP=2, 10.244.2.2:8080/TCP=3,
    // 10.244.2.3:53/UDP=4.

    // lb4_key {be32 10.96.0.10, be16 53, u16 slot 0, proto 17, scope 0, pad}
    // → lb4_service {u32 union 0, u16 count 2, be16 rev_nat 3, flags 0, flags2 0, qcount 0}
    let m = find(&l, MapId::Services, "0a 60 00 0a 00 35 00 00 11 00 00 00");
    assert_eq!(hex(&m.value()), "00 00 00 00 02 00 00 03 00 00 00 00");
    // Slot 2 → backend id 4 (10.244.2.3, sorted after 10.244.1.23), host order.
    let s = find(&l, MapId::Services, "0a 60 00 0a 00 35 02 00 11 00 00 00");
    assert_eq!(hex(&s.value()), "04 00 00 00 00 00 00 03 00 00 00 00");
    // lb4_backend {be32 10.244.1.23, be16 53, proto 17, flags 0, cluster_id 0, zone, pad}
    let b = find(&l, MapId::Backends, "02 00 00 00");
    assert_eq!(hex(&b.value()), "0a f4 01 17 00 35 11 00 00 00 00 00");
    // reverse_nat: be16 3 → {be32 10.96.0.10, be16 53}
    let r = find(&l, MapId::RevNat, "00 03");
    assert_eq!(hex(&r.value()), "0a 60 00 0a 00 35");

    // The LB address with ETP=Local, ITP=Cluster: two scopes. EXT = rev-NAT 7 with
    // the local backend only; flags LOADBALANCER|EXT_LOCAL|AFFINITY|ROUTABLE|SOURCE_RANGE
    // = 0x20|0x04|0x10|0x40|0x80 = 0xf4, flags2 TWO_SCOPES = 0x20; union = 300 = 0x12c.
    let m = find(&l, MapId::Services, "cb 00 71 0a 00 50 00 00 06 00 00 00");
    assert_eq!(hex(&m.value()), "2c 01 00 00 01 00 00 07 f4 20 00 00");
    // Its slots drop the source-range bit: flags 0x74.
    let s = find(&l, MapId::Services, "cb 00 71 0a 00 50 01 00 06 00 00 00");
    assert_eq!(hex(&s.value()), "01 00 00 00 00 00 00 07 74 20 00 00");
    // INT scope (key byte 9 = 1): rev-NAT 8, both backends.
    let m = find(&l, MapId::Services, "cb 00 71 0a 00 50 00 00 06 01 00 00");
    assert_eq!(hex(&m.value()), "2c 01 00 00 02 00 00 08 f4 20 00 00");
    // source_range {u32 prefixlen 32+24, be16 rev_nat 7, pad, 192.0.2.0} → u8 0
    let sr = find(
        &l,
        MapId::SourceRange,
        "38 00 00 00 00 07 00 00 c0 00 02 00",
    );
    assert_eq!(hex(&sr.value()), "00");
    // affinity_match {u32 backend 1, be16 rev_nat 7, pad} → u8 0
    find(&l, MapId::AffinityMatch, "01 00 00 00 00 07 00 00");
    // The ClusterIP frontend of web is single-scope, not routable: flags
    // EXT_LOCAL|AFFINITY = 0x14, and both backends (ITP=Cluster).
    let m = find(&l, MapId::Services, "0a 60 00 0c 00 50 00 00 06 00 00 00");
    assert_eq!(hex(&m.value()), "2c 01 00 00 02 00 00 04 14 00 00 00");
    // The node-port surrogate 0.0.0.0:30082 (EXT, rev-NAT 1) is not routable:
    // NODEPORT|EXT_LOCAL|AFFINITY = 0x16, two scopes, the local backend.
    let m = find(&l, MapId::Services, "00 00 00 00 75 82 00 00 06 00 00 00");
    assert_eq!(hex(&m.value()), "2c 01 00 00 01 00 00 01 16 20 00 00");

    // Write order per frontend: backends, slots (with affinity match), ranges, rev-NAT, master.
    let pos = |want: &dyn Fn(&Entry) -> bool| l.entries.iter().position(want).unwrap();
    let slot = pos(&|e| matches!(e, Entry::Slot { rev_nat: 7, .. }));
    let rnat = pos(&|e| matches!(e, Entry::RevNat { id: 7, .. }));
    let master = pos(&|e| matches!(e, Entry::Master { rev_nat: 7, .. }));
    let range = pos(&|e| matches!(e, Entry::SourceRange { rev_nat: 7, .. }));
    assert!(slot < range && range < rnat && rnat < master);

    let sizes: Vec<(usize, usize)> = l
        .entries
        .iter()
        .map(|e| (e.key().len(), e.value().len()))
        .collect();
    for (e, (k, v)) in l.entries.iter().zip(sizes) {
        assert_eq!((k as u32, v as u32), e.map().sizes(IpFamily::IPv4), "{e:?}");
    }
}

#[test]
fn ipv6_sizes() {
    for m in MapId::ALL {
        let (k4, v4) = m.sizes(IpFamily::IPv4);
        let (k6, v6) = m.sizes(IpFamily::IPv6);
        let want = match m {
            MapId::Services => (12, 12, 24, 12),
            MapId::Backends => (4, 12, 4, 24),
            MapId::RevNat => (2, 6, 2, 18),
            MapId::Affinity => (16, 16, 24, 16),
            MapId::AffinityMatch => (8, 1, 8, 1),
            MapId::SourceRange => (12, 1, 24, 1),
            MapId::ReverseSk => (16, 8, 28, 20),
            MapId::Maglev => (2, 4, 2, 4),
        };
        assert_eq!((k4, v4, k6, v6), want, "{m:?}");
    }
}

#[test]
fn ids_keep_previous_and_fill_gaps() {
    let fe = |s: &str| Frontend {
        addr: s.parse().unwrap(),
        proto: svc_compiler::ir::Protocol::TCP,
        scope: Scope::External,
    };
    let be = |s: &str| Backend {
        addr: s.parse().unwrap(),
        proto: svc_compiler::ir::Protocol::TCP,
    };
    let f1: BTreeSet<_> = [fe("10.0.0.1:80"), fe("10.0.0.2:80")].into();
    let b1: BTreeSet<_> = [be("10.1.0.1:80")].into();
    let a = assign_ids(&f1, &b1, None).unwrap();
    assert_eq!(a.services[&fe("10.0.0.2:80")], 2);
    // A new frontend sorting first keeps the others' ids with the previous assignment.
    let f2: BTreeSet<_> = [fe("10.0.0.0:80"), fe("10.0.0.2:80")].into();
    let b = assign_ids(&f2, &b1, Some(&a)).unwrap();
    assert_eq!(b.services[&fe("10.0.0.2:80")], 2);
    // The id the gone frontend had is not given again in the same apply (the maps hold
    // it until the deletes); the next apply may.
    assert_eq!(
        b.services[&fe("10.0.0.0:80")],
        3,
        "the freed id 1 is held back"
    );
    let f3: BTreeSet<_> = [fe("10.0.0.0:80"), fe("10.0.0.2:80"), fe("10.0.0.3:80")].into();
    let d = assign_ids(&f3, &b1, Some(&b)).unwrap();
    assert_eq!(
        d.services[&fe("10.0.0.3:80")],
        1,
        "free again one apply later"
    );
    // Every id taken but the freed one: that one is given after all.
    let full: BTreeSet<_> = (0..MAX_FRONTENDS as u32)
        .map(|i| fe(&format!("10.{}.{}.{}:80", i >> 16, (i >> 8) & 255, i & 255)))
        .collect();
    let all = assign_ids(&full, &b1, None).unwrap();
    let mut swapped = full.clone();
    swapped.remove(&fe("10.0.0.0:80"));
    swapped.insert(fe("10.200.0.0:80"));
    let e = assign_ids(&swapped, &b1, Some(&all)).unwrap();
    assert_eq!(
        e.services[&fe("10.200.0.0:80")],
        all.services[&fe("10.0.0.0:80")]
    );
    // Backends alike: the new one does not get the gone one's id 1.
    let bs: BTreeSet<_> = [be("10.1.0.2:80")].into();
    let tiny = assign_ids(&f1, &bs, Some(&a)).unwrap();
    assert_eq!(tiny.backends[&be("10.1.0.2:80")], 2, "a fresh id first");
    // Without it, ids follow the sorted order.
    let c = assign_ids(&f2, &b1, None).unwrap();
    assert_eq!(c.services[&fe("10.0.0.2:80")], 2);
    assert_eq!(c.services[&fe("10.0.0.0:80")], 1);
    let many: BTreeSet<_> = (0..70000u32)
        .map(|i| fe(&format!("10.{}.{}.{}:80", i >> 16, (i >> 8) & 255, i & 255)))
        .collect();
    assert_eq!(
        assign_ids(&many, &b1, None),
        Err(Error::TooManyFrontends(70000))
    );
}

use std::collections::BTreeSet;

#[test]
fn renderings_are_deterministic_and_agree() {
    let a = view_of(&[NODES, SERVICES]);
    // The same manifests in the other order.
    let b = view_of(&[SERVICES, NODES]);
    for format in [Format::Json, Format::Batch, Format::Table] {
        let o = Options {
            format,
            ..Default::default()
        };
        assert_eq!(
            write_string(&a, None, &o).unwrap(),
            write_string(&b, None, &o).unwrap()
        );
    }
    let l = layout(&a, None, &MapSizes::default()).unwrap();
    let batch = write_batch(&a, &Options::default()).unwrap();
    let updates = batch
        .lines()
        .filter(|x| x.starts_with("map update"))
        .count();
    let creates = batch
        .lines()
        .filter(|x| x.starts_with("map create"))
        .count();
    assert_eq!((updates, creates), (l.entries.len(), 7));
    assert!(batch.contains(
        "map create /sys/fs/bpf/svc-compile/cilium_lb4_source_range type lpm_trie key 12 value 1 entries 65536 name cilium_lb4_sour flags 1\n"
    ));
    let json: serde_json::Value =
        serde_json::from_str(&write_json(&a, &Options::default()).unwrap()).unwrap();
    let n: usize = json["maps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["entries"].as_array().unwrap().len())
        .sum();
    assert_eq!(n, l.entries.len());
    let dns = json["maps"][0]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == "0a 60 00 0a 00 35 00 00 11 00 00 00")
        .unwrap();
    assert_eq!(dns["value"], "00 00 00 00 02 00 00 03 00 00 00 00");
    assert_eq!(
        dns["decoded"],
        serde_json::json!({"frontend": "10.96.0.10:53/UDP", "slot": 0, "count": 2, "qcount": 0,
            "revNat": 3, "flags": "0x0000", "flagsText": "ClusterIP, non-routable"})
    );
    assert_eq!(json["ids"]["backends"]["10.244.2.3:53/UDP"], 4);
    assert_eq!(json["maps"][5]["name"], "cilium_lb4_source_range");
    assert_eq!(json["maps"][5]["flags"], 1);
    assert_eq!(json["maps"][6]["entries"], serde_json::json!([]));
    let table = write_table(&a, &Options::default()).unwrap();
    // The widest key, `192.0.2.10:30082/TCP/i (1)`, is 26 wide: values start at 29.
    let row = |k: &str, v: &str| format!("{k:<29}{v}\n");
    assert!(table.starts_with(&row(
        "SERVICE ADDRESS",
        "BACKEND ADDRESS (REVNAT_ID) (SLOT)"
    )));
    for r in [
        row(
            "10.96.0.10:53/UDP (0)",
            "0.0.0.0:0 (3) (0) [ClusterIP, non-routable] ",
        ),
        row("203.0.113.10:80/TCP/i (1)", "10.244.1.2:8080/TCP (8) (1)"),
        row(
            "10.96.0.12:80/TCP (0)",
            "0.0.0.0:0 (4) (0) [ClusterIP, Local, sessionAffinity, non-routable] ",
        ),
    ] {
        assert!(table.contains(&r), "{r:?} not in\n{table}");
    }
}

/// The frontend limit is checked before layout, with the count layout would assign
/// ids to: a view of exactly `max` frontends passes, one more than `max` is refused.
#[test]
fn too_many_frontends_is_refused_before_rendering() {
    let v = view_of(&[NODES, SERVICES]);
    let n = frontend_count(&v);
    assert_eq!(
        n,
        layout(&v, None, &MapSizes::default())
            .unwrap()
            .ids
            .services
            .len()
    );
    assert_eq!(check_at_most(&v, n), Ok(()));
    assert_eq!(check_at_most(&v, n - 1), Err(Error::TooManyFrontends(n)));
    assert_eq!(check(&v), Ok(()));
    // The same limit makes assign_ids fail: check and layout agree.
    let fes: BTreeSet<Frontend> = (0..=MAX_FRONTENDS)
        .map(|i| Frontend {
            addr: std::net::SocketAddr::new([10, 96, (i >> 8) as u8, i as u8].into(), 80),
            proto: svc_compiler::ir::Protocol::TCP,
            scope: Scope::External,
        })
        .collect();
    assert_eq!(fes.len(), MAX_FRONTENDS + 1);
    assert_eq!(
        assign_ids(&fes, &BTreeSet::new(), None),
        Err(Error::TooManyFrontends(MAX_FRONTENDS + 1))
    );
    let mut fewer = fes;
    fewer.pop_last();
    assert_eq!(
        assign_ids(&fewer, &BTreeSet::new(), None)
            .unwrap()
            .services
            .len(),
        MAX_FRONTENDS
    );
}

/// The registry's renderer asks [`check`] and the flags before rendering: a bad flag
/// value is its one-line refusal of every view.
#[test]
fn the_renderer_refuses_before_rendering() {
    let crate::Render::Node(new) = TARGET.render else {
        panic!("ebpf renders per node")
    };
    let v = view_of(&[NODES, SERVICES]);
    let r = new(&Params::default(), crate::Sharing::One);
    assert_eq!(r.check(&v), Ok(()));
    let mut out = String::from("old");
    r.render_into(&v, &mut out);
    assert_eq!(out, write_json(&v, &Options::default()).unwrap());
    let mut p = Params::default();
    p.push("map-format", "yaml".into());
    assert_eq!(
        new(&p, crate::Sharing::Many).check(&v),
        Err("--map-format `yaml`: use json, batch or table".into())
    );
}

/// The target's flags: defaults, every format, and each mistake as one line.
#[test]
fn flags_become_options() {
    let params = |kv: &[(&'static str, &str)]| {
        let mut p = Params::default();
        for (k, v) in kv {
            p.push(k, v.to_string());
        }
        p
    };
    assert_eq!(options(&Params::default()), Ok(Options::default()));
    let o = options(&params(&[
        ("map-format", "table"),
        ("pin-dir", "/sys/fs/bpf/x/"),
        ("max-entries", "1024"),
    ]))
    .unwrap();
    assert_eq!(
        o,
        Options {
            format: Format::Table,
            pin_dir: "/sys/fs/bpf/x/".into(),
            sizes: svc_compiler::ir::EbpfMapSizes {
                all: Some(1024),
                ..Default::default()
            },
            agent: Default::default(),
        }
    );
    assert_eq!(
        options(&params(&[("map-format", "batch")])).unwrap().format,
        Format::Batch
    );
    for (k, v) in [
        ("map-format", "yaml"),
        ("pin-dir", "relative"),
        ("pin-dir", "/with space"),
        ("max-entries", "0"),
        ("max-entries", "-1"),
        ("max-entries", "4294967296"),
    ] {
        let e = options(&params(&[(k, v)])).unwrap_err();
        assert!(e.starts_with(&format!("--{k} `{v}`: ")), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

/// The lock file's text of ids reads back as the same ids; text that is not a frontend
/// or backend is dropped (its address gets a fresh id).
#[test]
fn ids_round_trip_through_the_lock_text() {
    use super::layout::Ids;
    use svc_compiler::passes::allocate::NodeIds;
    let mut locked = NodeIds::default();
    for (k, v) in [
        ("10.96.0.10:53/UDP", 1),
        ("[fd00::1]:80/TCP/i", 2),
        ("0.0.0.0:30007/SCTP", 3),
        ("10.96.0.10:53/ICMP", 4),
        ("10.96.0.10/TCP", 5),
        ("10.96.0.10:53/TCP/x", 6),
    ] {
        locked.services.insert(k.to_string(), v);
    }
    locked.backends.insert("10.244.1.5:9376/TCP".into(), 7);
    locked.backends.insert("nonsense".into(), 8);
    let ids = Ids::from_lock(&locked);
    assert_eq!(ids.services.len(), 3);
    assert_eq!(ids.backends.len(), 1);
    let back = ids.to_lock();
    assert_eq!(back.services.len(), 3);
    for k in [
        "10.96.0.10:53/UDP",
        "[fd00::1]:80/TCP/i",
        "0.0.0.0:30007/SCTP",
    ] {
        assert_eq!(back.services[k], locked.services[k], "{k}");
    }
    assert_eq!(back.backends["10.244.1.5:9376/TCP"], 7);
}

mod plan {
    use super::super::plan::*;
    use super::*;
    use std::collections::BTreeMap;

    fn contents(w: &Wanted) -> BTreeMap<String, Contents> {
        w.expected()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    fn rank_names(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Update { map, key, .. } => format!("+{map}/{}", key.len()),
                Op::Delete { map, key } => format!("-{map}/{}", key.len()),
            })
            .collect()
    }

    /// From nothing every entry is written, backends first and masters last; the same
    /// state again writes nothing; the JSON rendering plans like the layout.
    #[test]
    fn a_first_plan_writes_everything_in_cilium_order_and_a_second_nothing() {
        let l = layout(&view_of(&[NODES, SERVICES]), None, &MapSizes::default()).unwrap();
        let w = Wanted::from_layouts(&[&l]);
        let ops = diff(&w, &BTreeMap::new());
        let configured = l.entries.len();
        assert_eq!(ops.len(), configured);
        let first_master = ops
            .iter()
            .position(|op| matches!(op, Op::Update { map, key, .. } if map == "cilium_lb4_services_v2" && key[6] == 0 && key[7] == 0))
            .unwrap();
        assert!(ops[first_master..].iter().all(|op| matches!(op, Op::Update { map, key, .. } if map == "cilium_lb4_services_v2" && key[6] == 0 && key[7] == 0)));
        assert!(matches!(&ops[0], Op::Update { map, .. } if map == "cilium_lb4_backends_v3"));
        assert_eq!(diff(&w, &contents(&w)), vec![]);
        let json = render(
            &l,
            &Options {
                format: Format::Json,
                ..Options::default()
            },
        );
        assert_eq!(Wanted::from_json(&[&json]).unwrap(), w);
        assert!(Wanted::from_json(&["{}"]).is_err());
    }

    /// One endpoint fewer: the changed master, then the slot that moved down, then
    /// the stale slot and backend deleted (slot before backend); nothing else written.
    #[test]
    fn an_endpoint_less_rewrites_only_what_changed() {
        let old = layout(&view_of(&[NODES, SERVICES]), None, &MapSizes::default()).unwrap();
        let fewer = SERVICES.replacen("- {addresses: [10.244.1.2], nodeName: node-1}\n", "", 1);
        assert_ne!(fewer, SERVICES);
        let new = layout(
            &view_of(&[NODES, &fewer]),
            Some(&old.ids),
            &MapSizes::default(),
        )
        .unwrap();
        let (wo, wn) = (Wanted::from_layouts(&[&old]), Wanted::from_layouts(&[&new]));
        let ops = diff(&wn, &contents(&wo));
        assert!(!ops.is_empty());
        // The dns service (10.96.0.10), whose endpoints did not change, is not written.
        assert!(
            ops.iter().all(|op| match op {
                Op::Update { key, .. } | Op::Delete { key, .. } =>
                    !key.starts_with(&[10, 96, 0, 10]),
            }),
            "{ops:?}"
        );
        // Applied to the old contents, the plan gives exactly the new ones.
        let mut now = contents(&wo);
        for op in &ops {
            match op {
                Op::Update { map, key, value } => {
                    now.entry(map.clone())
                        .or_default()
                        .insert(key.clone(), value.clone());
                }
                Op::Delete { map, key } => {
                    now.get_mut(map).unwrap().remove(key);
                }
            }
        }
        assert_eq!(now, contents(&wn));
        assert_eq!(first_mismatch(&wn, &now), None);
        assert!(first_mismatch(&wo, &now).is_some());
        // Updates before deletes; a deleted backend after every deleted slot.
        let names = rank_names(&ops);
        let first_delete = names.iter().position(|n| n.starts_with('-')).unwrap();
        assert!(
            names[first_delete..].iter().all(|n| n.starts_with('-')),
            "{names:?}"
        );
        let last_slot = names
            .iter()
            .rposition(|n| n == "-cilium_lb4_services_v2/12");
        let backend = names.iter().position(|n| n == "-cilium_lb4_backends_v3/4");
        assert!(last_slot < backend, "{names:?}");
    }

    #[test]
    fn dumps_and_shapes() {
        let dump = r#"[{"key":["0x01","0x00","0x00","0x00"],"value":["0x0a","0xf4"],"formatted":{}},{"key":["0x02","0x00","0x00","0x00"],"value":["0x0a","0xf5"]}]"#;
        let c = parse_dump(dump).unwrap();
        assert_eq!(c[&vec![1, 0, 0, 0]], vec![0x0a, 0xf4]);
        assert_eq!(c.len(), 2);
        assert!(parse_dump("[{\"key\": 1}]").is_err());
        let l = layout(&view_of(&[NODES, SERVICES]), None, &MapSizes::default()).unwrap();
        let w = Wanted::from_layouts(&[&l]);
        let mut shapes = shapes_of(&w);
        assert_eq!(fits(&w, &shapes, None), None);
        shapes
            .get_mut("cilium_lb4_services_v2")
            .unwrap()
            .max_entries = 2;
        assert!(fits(&w, &shapes, None)
            .unwrap()
            .contains("cilium_lb4_services_v2"));
        shapes.remove("cilium_lb4_backends_v3");
        assert!(fits(&w, &shapes, None).is_some());
        // A family without a document is wanted empty, so a leftover is deleted.
        let all = w.clone().complete(&MapSizes::all(16));
        assert_eq!(all.maps.len(), 9);
        assert!(all.maps["cilium_lb6_services_v2"].entries.is_empty());
        let mut stale = BTreeMap::new();
        stale.insert(
            "cilium_lb6_backends_v3".to_string(),
            Contents::from([(vec![1, 0, 0, 0], vec![0; 24])]),
        );
        assert!(diff(&all, &stale).contains(&Op::Delete {
            map: "cilium_lb6_backends_v3".into(),
            key: vec![1, 0, 0, 0]
        }));
        // Runtime maps are never planned.
        assert!(!w.maps.contains_key("cilium_lb4_affinity"));
        assert!(!w.maps.contains_key("cilium_lb4_reverse_sk"));
    }
}

/// Cilium writes affinity matches for active backends only (`bpf_reconciler.go`,
/// `updateFrontend`: `svc.SessionAffinity && be.State == BackendStateActive`), even under
/// the terminating fallback, where the master counts the terminating ones: a pin to one
/// of them does not hold (the datapath's match lookup fails and it picks again).
#[test]
fn affinity_matches_the_backends_the_master_counts() {
    let svc = |cond: &str| {
        format!(
            "
apiVersion: v1
kind: Service
metadata: {{name: aff}}
spec:
  clusterIP: 10.96.0.40
  sessionAffinity: ClientIP
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: aff-1, labels: {{kubernetes.io/service-name: aff}}}}
addressType: IPv4
ports: [{{port: 8080, protocol: TCP}}]
endpoints:
- {{addresses: [10.244.1.2], nodeName: node-1, conditions: {{ready: false, serving: true, terminating: true}}}}
- {{addresses: [10.244.1.3], nodeName: node-1, conditions: {cond}}}
"
        )
    };
    let matches = |cond: &str| {
        let l = layout(&view_of(&[NODES, &svc(cond)]), None, &MapSizes::default()).unwrap();
        l.entries
            .iter()
            .filter(|e| e.map() == MapId::AffinityMatch)
            .count()
    };
    assert_eq!(
        matches("{ready: false, serving: true, terminating: true}"),
        0
    );
    assert_eq!(matches("{ready: true}"), 1);
}

/// Every map holds exactly what [`occupancy`] counted for it, for the fixtures here and
/// a generated cluster: the capacity check and the layout agree.
#[test]
fn occupancy_counts_what_the_layout_writes() {
    let generated = svc_compiler::synth::generate(
        &svc_compiler::synth::Shape {
            services: 60,
            endpoints: 4,
            nodes: 3,
            seed: 7,
        },
        svc_compiler::synth::Format::YamlStream,
    );
    let wild = "
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.30
  ports: [{name: a, port: 80, nodePort: 30090}, {name: b, port: 443, nodePort: 30091}]
status: {loadBalancer: {ingress: [{ip: 203.0.113.30}]}}
";
    // Random, and Maglev for the NodePort and LoadBalancer frontends.
    let agents = [Agent::default(), maglev_agent(false)];
    let mut tables = 0;
    for docs in [&[NODES, SERVICES][..], &[NODES, wild]] {
        let v = view_of(docs);
        for agent in &agents {
            let l = layout_with(&v, None, &MapSizes::default(), agent).unwrap();
            for (id, n) in occupancy(&v, agent) {
                assert_eq!(
                    n,
                    l.entries.iter().filter(|e| e.map() == id).count(),
                    "{id:?}"
                );
            }
        }
        tables += occupancy(&v, &agents[1])[MapId::ALL.len() - 1].1;
    }
    assert!(tables > 0, "some Maglev table was counted");
    let mut sources = SourceMap::default();
    let f = sources.add("g.yaml", generated);
    let comp = svc_compiler::compile(&sources, &[f], &svc_compiler::Options::default());
    let sel = NodeSelection {
        name: comp.module.nodes[0].name.clone(),
        ips: vec![],
    };
    let v = node_view(&comp.module, &sel, IpFamily::IPv4).unwrap();
    for agent in &agents {
        let l = layout_with(&v, None, &MapSizes::default(), agent).unwrap();
        for (id, n) in occupancy(&v, agent) {
            assert_eq!(
                n,
                l.entries.iter().filter(|e| e.map() == id).count(),
                "{id:?}"
            );
        }
    }
}

/// Maglev by default (`--bpf-lb-algorithm maglev`) with 251-entry tables.
fn maglev_agent(annotation: bool) -> Agent {
    Agent {
        algorithm: svc_compiler::ir::LbAlgorithm::Maglev,
        annotation,
        table_size: 251,
        ..Agent::default()
    }
}

/// Maps are Cilium's size, never grown: a node that needs more is refused, one
/// diagnostic per map, naming the numbers and the options that give room.
#[test]
fn a_node_that_overflows_a_map_is_refused() {
    let v = view_of(&[NODES, SERVICES]);
    let services = occupancy(&v, &Agent::default())[0].1;
    let fits = MapSizes::all(services as u32);
    assert!(layout(&v, None, &fits).is_ok());
    assert!(map_full(&v, &fits, &Agent::default()).is_empty());
    let small = MapSizes(svc_compiler::ir::EbpfMapSizes {
        services: Some(services as u32 - 1),
        ..Default::default()
    });
    match layout(&v, None, &small) {
        Err(Error::Overflow(o)) => {
            assert_eq!(o, [(MapId::Services, services, services as u32 - 1)])
        }
        other => panic!("{other:?}"),
    }
    let d = map_full(&v, &small, &Agent::default());
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].code, MAP_FULL_CODE);
    assert!(
        d[0].message.contains(&format!(
            "{services} entries for Cilium's cilium_lb4_services_v2 map, which holds {}",
            services - 1
        )),
        "{}",
        d[0].message
    );
    let hint = d[0].hint.as_deref().unwrap();
    assert!(hint.contains("--map-sizes services=N") && hint.contains("--bpf-lb-service-map-max"));
    // `all` sizes every map without its own size; a map's own wins.
    let s = MapSizes(svc_compiler::ir::EbpfMapSizes {
        all: Some(10),
        affinity: Some(3),
        ..Default::default()
    });
    assert_eq!(s.of(MapId::Backends), 10);
    assert_eq!(s.of(MapId::AffinityMatch), 3);
    assert_eq!(MapSizes::default().of(MapId::RevNat), DEFAULT_MAX_ENTRIES);
}

/// The code is listed with the others (compiler/src/codes.rs).
#[test]
fn the_map_full_code_is_documented() {
    let codes = include_str!("../../../compiler/src/codes.rs");
    assert!(codes.contains(&format!("//! - {MAP_FULL_CODE}, error:")));
}

/// No wildcard entry for an address of the node (`updateFrontend`: `isLocalAddr`), nor
/// for a load-balancer class Cilium does not own, nor for a cluster IP.
#[test]
fn wildcards_only_for_cilium_owned_load_balancer_ips() {
    let lb = |name: &str, n: u8, ip: &str, class: &str| {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.{n}\n{class}  ports: [{{port: 80, nodePort: 3010{n}}}]\nstatus: {{loadBalancer: {{ingress: [{{ip: {ip}}}]}}}}\n"
        )
    };
    let docs = [
        lb("own", 1, "203.0.113.1", ""),
        lb(
            "bgp",
            2,
            "203.0.113.2",
            "  loadBalancerClass: io.cilium/bgp-control-plane\n",
        ),
        lb(
            "nodeipam",
            3,
            "203.0.113.3",
            "  loadBalancerClass: io.cilium/node\n",
        ),
        lb("on-node", 4, "192.0.2.10", ""),
    ]
    .concat();
    let l = layout(&view_of(&[NODES, &docs]), None, &MapSizes::default()).unwrap();
    let wild: Vec<String> = l
        .entries
        .iter()
        .filter_map(|e| match e {
            Entry::Wildcard { addr, flags } => {
                assert_eq!(*flags, super::layout::F_LOADBALANCER);
                Some(addr.to_string())
            }
            _ => None,
        })
        .collect();
    assert_eq!(wild, ["203.0.113.2", "203.0.113.1"]);
}

/// The Maglev flags: each value as the agent takes it, each mistake one line; the flags
/// win over the ClusterConfig option by option; `--map-format batch` refuses tables a
/// `bpftool batch` line cannot hold.
#[test]
fn maglev_flags() {
    let params = |kv: &[(&'static str, &str)]| {
        let mut p = Params::default();
        for (k, v) in kv {
            p.push(k, v.to_string());
        }
        p
    };
    let o = options(&params(&[
        ("lb-algorithm", "maglev"),
        ("lb-algorithm-annotation", "on"),
        ("maglev-table-size", "1021"),
        ("maglev-hash-seed", "AAECAwQFBgcICQoL"),
    ]))
    .unwrap();
    let mut v = view_of(&[NODES, SERVICES]);
    v.ebpf_agent.maglev_table_size = Some(251);
    v.ebpf_agent.lb_algorithm = Some(svc_compiler::ir::LbAlgorithm::Random);
    assert_eq!(
        o.agent_for(&v),
        Agent {
            algorithm: svc_compiler::ir::LbAlgorithm::Maglev,
            annotation: true,
            table_size: 1021,
            seed: 0x0001_0203,
        }
    );
    // Unset flags leave the ClusterConfig's; unset there, Cilium's defaults.
    let a = Options::default().agent_for(&v);
    assert_eq!(
        (a.algorithm, a.annotation, a.table_size),
        (svc_compiler::ir::LbAlgorithm::Random, false, 251)
    );
    assert_eq!(Agent::default().table_size, 16381);
    assert_eq!(Agent::default().seed, 0x24b7_ef82);
    for (k, v) in [
        ("lb-algorithm", "Maglev"),
        ("lb-algorithm-annotation", "yes"),
        ("maglev-table-size", "16383"),
        ("maglev-hash-seed", "c2hvcnQ="),
    ] {
        let e = options(&params(&[(k, v)])).unwrap_err();
        assert!(e.starts_with(&format!("--{k} `{v}`")), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
    let crate::Render::Node(new) = TARGET.render else {
        panic!("ebpf renders per node")
    };
    let batch = |size: &str| {
        new(
            &params(&[
                ("map-format", "batch"),
                ("lb-algorithm", "maglev"),
                ("maglev-table-size", size),
            ]),
            crate::Sharing::One,
        )
        .check(&v)
    };
    assert_eq!(batch("509"), Ok(()));
    let e = batch("1021").unwrap_err();
    assert!(e.contains("--map-format json"), "{e}");
}

/// The reconciler's Maglev rules on one view (the golden cases `cilium-maglev` and
/// `cilium-maglev-annotation` show the bytes): which frontends get a table, over which
/// backends, where it is written, and the master's algorithm byte.
#[test]
fn maglev_tables_follow_the_reconciler() {
    let docs = "
apiVersion: v1
kind: Service
metadata: {name: np, namespace: t, annotations: {service.cilium.io/lb-algorithm: maglev}}
spec:
  type: NodePort
  clusterIP: 10.96.0.50
  selector: {app: np}
  ports: [{port: 80, targetPort: 80, nodePort: 30050}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: np-1, namespace: t, labels: {kubernetes.io/service-name: np}}
addressType: IPv4
ports: [{port: 80, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.5], nodeName: node-1}
- {addresses: [10.244.2.5], nodeName: node-2}
- {addresses: [10.244.2.6], nodeName: node-2, conditions: {ready: false, serving: true, terminating: true}}
";
    let v = view_of(&[NODES, docs]);
    let tables = |agent: &Agent| -> Vec<(String, Vec<u32>)> {
        let l = layout_with(&v, None, &MapSizes::default(), agent).unwrap();
        // Each table after its frontend's slots and before its rev-NAT and master.
        for (i, e) in l.entries.iter().enumerate() {
            if let Entry::Maglev { frontend, .. } = e {
                let slot = l.entries[..i]
                    .iter()
                    .any(|s| matches!(s, Entry::Slot { frontend: f, .. } if f == frontend));
                let master = l.entries[..i]
                    .iter()
                    .any(|s| matches!(s, Entry::Master { frontend: f, .. } if f == frontend));
                assert!(slot && !master, "{e:?}");
                assert_eq!(e.value().len(), 4 * agent.table_size as usize);
            }
        }
        assert_eq!(
            l.maps.iter().any(|m| m.id == MapId::Maglev),
            agent.maglev_declared()
        );
        l.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Maglev {
                    frontend, table, ..
                } => {
                    let mut ids: Vec<u32> = table.to_vec();
                    ids.sort();
                    ids.dedup();
                    Some((frontend.to_string(), ids))
                }
                _ => None,
            })
            .collect()
    };
    let ids = layout(&v, None, &MapSizes::default()).unwrap().ids;
    let be = |a: &str| ids.backends[&parse_backend(a).unwrap()];
    let active = vec![be("10.244.1.5:80/TCP"), be("10.244.2.5:80/TCP")];
    // Random: no tables, no map.
    assert!(tables(&Agent::default()).is_empty());
    // Maglev by default: the node address's NodePort only, over the active backends.
    let m = maglev_agent(false);
    assert_eq!(
        tables(&m),
        [("192.0.2.10:30050/TCP".to_string(), active.clone())]
    );
    // The annotation read: the cluster IP too, never the surrogate.
    let annotated = Agent {
        algorithm: svc_compiler::ir::LbAlgorithm::Random,
        ..maglev_agent(true)
    };
    assert_eq!(
        tables(&annotated),
        [
            ("10.96.0.50:80/TCP".to_string(), active.clone()),
            ("192.0.2.10:30050/TCP".to_string(), active)
        ]
    );
    // The master's top byte: the annotation's algorithm (2) when read, else 0.
    let top = |agent: &Agent| -> Vec<u8> {
        let l = layout_with(&v, None, &MapSizes::default(), agent).unwrap();
        l.entries
            .iter()
            .filter(|e| matches!(e, Entry::Master { .. }))
            .map(|e| e.value()[3])
            .collect()
    };
    assert_eq!(top(&m), [0, 0, 0]);
    assert_eq!(top(&annotated), [2, 2, 2]);
}
