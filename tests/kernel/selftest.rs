//! Self-tests of the kernel lab: plain routing, hand-written DNAT and
//! masquerade, hairpin, REJECT/DROP, parallel labs, cleanup on panic.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::lab::addr;
use super::sys;
use super::{require_root, Lab, LabSpec, Outcome, Proto, PROBE_TIMEOUT};

const PROTOS: [Proto; 2] = [Proto::Tcp, Proto::Udp];

fn v4(a: u8, b: u8, c: u8, d: u8, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(a, b, c, d)), port)
}

/// A lab with echo servers on every pod, TCP and UDP, port 8080.
fn lab_serving(tag: &str) -> Lab {
    let mut lab = Lab::new(tag, &LabSpec::default()).expect("lab");
    for proto in PROTOS {
        lab.serve(proto, 8080).expect("serve");
    }
    lab
}

fn load_iptables(lab: &Lab, doc: &str) {
    lab.exec_ok("node", "iptables-restore", &["--noflush"], Some(doc))
        .expect("iptables-restore");
}

/// The names `ip netns list` shows.
fn ip_netns_list() -> Vec<String> {
    let out = sys::run_ok(
        Command::new("ip").args(["netns", "list"]),
        None,
        Duration::from_secs(10),
    )
    .expect("ip netns list");
    out.lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn direct_routing() {
    if !require_root("direct_routing") {
        return;
    }
    let lab = lab_serving("direct");
    let pairs = [
        ("client1", "pod-a"),
        ("client2", "pod-b"),
        ("client1", "pod-r1"),
        ("pod-a", "pod-b"),
        ("pod-b", "pod-a"),
        ("pod-a", "pod-r2"),
        ("pod-r1", "pod-a"),
        ("pod-r2", "pod-r1"),
        ("pod-r1", "client1"),
    ];
    for proto in PROTOS {
        for (from, to) in pairs {
            let want = if to == "client1" {
                Outcome::Refused // no server on the client
            } else {
                Outcome::answered(to, lab.ip(from))
            };
            assert_eq!(
                lab.probe(from, proto, lab.addr(to, 8080)),
                want,
                "{from} -> {to} {proto:?}"
            );
        }
        // The node reaches its pods from its pod-veth address, node2's pods
        // from its link address.
        let got = lab.probe("node", proto, lab.addr("pod-a", 8080));
        assert_eq!(
            got,
            Outcome::answered("pod-a", addr::NODE_POD_GW),
            "{proto:?}"
        );
        let got = lab.probe("node", proto, lab.addr("pod-r2", 8080));
        assert_eq!(
            got,
            Outcome::answered("pod-r2", addr::NODE_LINK),
            "{proto:?}"
        );
        // No server on that port: refused, not a time-out.
        assert_eq!(
            lab.probe("client1", proto, lab.addr("pod-a", 9)),
            Outcome::Refused
        );
    }
}

/// kube-proxy-like nat rules: 10.96.0.10:80 → pod-r1:8080 without
/// masquerade, 10.96.0.11:80 → pod-r1:8080 and 10.96.0.12:80 → pod-b:8080
/// marked for masquerade, 10.96.0.13:80 → pod-r1:8080 masquerading only
/// sources outside the clusterCIDR.
fn dnat_rules() -> String {
    let cluster = addr::CLUSTER_CIDR;
    format!(
        "\
*nat
:SCT-SERVICES - [0:0]
:SCT-MARK-MASQ - [0:0]
:SCT-POSTROUTING - [0:0]
-A PREROUTING -j SCT-SERVICES
-A OUTPUT -j SCT-SERVICES
-A POSTROUTING -j SCT-POSTROUTING
-A SCT-MARK-MASQ -j MARK --or-mark 0x4000
-A SCT-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A SCT-POSTROUTING -j MARK --xor-mark 0x4000
-A SCT-POSTROUTING -j MASQUERADE
-A SCT-SERVICES -d 10.96.0.10/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.2.2:8080
-A SCT-SERVICES -d 10.96.0.10/32 -p udp --dport 80 -j DNAT --to-destination 10.244.2.2:8080
-A SCT-SERVICES -d 10.96.0.11/32 -p tcp --dport 80 -j SCT-MARK-MASQ
-A SCT-SERVICES -d 10.96.0.11/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.2.2:8080
-A SCT-SERVICES -d 10.96.0.11/32 -p udp --dport 80 -j SCT-MARK-MASQ
-A SCT-SERVICES -d 10.96.0.11/32 -p udp --dport 80 -j DNAT --to-destination 10.244.2.2:8080
-A SCT-SERVICES -d 10.96.0.12/32 -p tcp --dport 80 -j SCT-MARK-MASQ
-A SCT-SERVICES -d 10.96.0.12/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.1.3:8080
-A SCT-SERVICES -d 10.96.0.12/32 -p udp --dport 80 -j SCT-MARK-MASQ
-A SCT-SERVICES -d 10.96.0.12/32 -p udp --dport 80 -j DNAT --to-destination 10.244.1.3:8080
-A SCT-SERVICES -d 10.96.0.13/32 ! -s {cluster} -j SCT-MARK-MASQ
-A SCT-SERVICES -d 10.96.0.13/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.2.2:8080
-A SCT-SERVICES -d 10.96.0.13/32 -p udp --dport 80 -j DNAT --to-destination 10.244.2.2:8080
COMMIT
"
    )
}

#[test]
fn node_settings() {
    if !require_root("node_settings") {
        return;
    }
    let lab = Lab::new("settings", &LabSpec::default()).expect("lab");
    for (key, want) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv4.conf.all.route_localnet", "1"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.eth0.rp_filter", "0"),
        ("net.ipv4.icmp_ratemask", "0"),
        ("net.ipv6.icmp.ratemask", ""),
    ] {
        let out = lab
            .exec("node", "sysctl", &["-n", key], None)
            .expect("sysctl");
        assert!(out.status.success(), "{key}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want, "{key}");
    }
    let out = lab
        .exec("node", "ip", &["route", "get", "10.244.2.3"], None)
        .expect("ip route get");
    let route = String::from_utf8_lossy(&out.stdout);
    assert!(route.contains("via 198.51.100.2 dev eth1"), "{route}");
    // A command that exits non-zero is an Output for exec, an error for exec_ok.
    let out = lab.exec("node", "false", &[], None).expect("false");
    assert!(!out.status.success());
    assert!(lab.exec_ok("node", "false", &[], None).is_err());
}

#[test]
fn dnat_and_masquerade() {
    if !require_root("dnat_and_masquerade") {
        return;
    }
    let lab = lab_serving("dnat");
    load_iptables(&lab, &dnat_rules());
    let (plain, masq_remote, masq_local) = (
        v4(10, 96, 0, 10, 80),
        v4(10, 96, 0, 11, 80),
        v4(10, 96, 0, 12, 80),
    );
    let off_cluster = v4(10, 96, 0, 13, 80);
    for proto in PROTOS {
        for from in ["client1", "client2", "pod-a", "pod-b", "node"] {
            let real = if from == "node" {
                IpAddr::V4(addr::NODE_LAN)
            } else {
                lab.ip(from)
            };
            let cases = [
                (plain, Outcome::answered("pod-r1", real)),
                (masq_remote, Outcome::answered("pod-r1", addr::NODE_LINK)),
                (masq_local, Outcome::answered("pod-b", addr::NODE_POD_GW)),
                if from.starts_with("pod-") {
                    (off_cluster, Outcome::answered("pod-r1", real))
                } else {
                    (off_cluster, Outcome::answered("pod-r1", addr::NODE_LINK))
                },
            ];
            for (vip, want) in cases {
                assert_eq!(
                    lab.probe(from, proto, vip),
                    want,
                    "{from} -> {vip} {proto:?}"
                );
            }
        }
    }
    let entries = lab
        .exec_ok("node", "conntrack", &["-L"], None)
        .expect("conntrack -L");
    assert!(entries.contains("dst=10.96.0.11"), "conntrack:\n{entries}");
    lab.flush_conntrack().expect("flush");
    let entries = lab
        .exec_ok("node", "conntrack", &["-L"], None)
        .expect("conntrack -L");
    assert!(
        !entries.contains("dst=10.96.0.11"),
        "conntrack after flush:\n{entries}"
    );
}

#[test]
fn hairpin() {
    if !require_root("hairpin") {
        return;
    }
    let lab = lab_serving("hairpin");
    load_iptables(
        &lab,
        "*nat
:SCT-HAIRPIN - [0:0]
-A PREROUTING -j SCT-HAIRPIN
-A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
-A SCT-HAIRPIN -d 10.96.0.20/32 -j MARK --or-mark 0x4000
-A SCT-HAIRPIN -d 10.96.0.20/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.1.2:8080
-A SCT-HAIRPIN -d 10.96.0.20/32 -p udp --dport 80 -j DNAT --to-destination 10.244.1.2:8080
-A SCT-HAIRPIN -d 10.96.0.21/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.1.2:8080
COMMIT
",
    );
    for proto in PROTOS {
        let got = lab.probe("pod-a", proto, v4(10, 96, 0, 20, 80));
        assert_eq!(
            got,
            Outcome::answered("pod-a", addr::NODE_POD_GW),
            "{proto:?}"
        );
        // Other pods use the same VIP normally.
        let got = lab.probe("pod-b", proto, v4(10, 96, 0, 20, 80));
        assert_eq!(
            got,
            Outcome::answered("pod-a", addr::NODE_POD_GW),
            "{proto:?}"
        );
    }
    // Without masquerade pod-a sees its own address as source and drops it.
    assert_eq!(
        lab.probe("pod-a", Proto::Tcp, v4(10, 96, 0, 21, 80)),
        Outcome::TimedOut
    );
}

#[test]
fn reject_and_drop() {
    if !require_root("reject_and_drop") {
        return;
    }
    let lab = lab_serving("reject");
    load_iptables(
        &lab,
        "*filter
:SCT-FILTER - [0:0]
-A INPUT -j SCT-FILTER
-A FORWARD -j SCT-FILTER
-A OUTPUT -j SCT-FILTER
-A SCT-FILTER -d 10.96.0.30/32 -p tcp --dport 80 -j REJECT
-A SCT-FILTER -d 10.96.0.30/32 -p udp --dport 80 -j REJECT
-A SCT-FILTER -d 10.96.0.31/32 -p tcp --dport 80 -j DROP
-A SCT-FILTER -d 10.96.0.31/32 -p udp --dport 80 -j DROP
COMMIT
",
    );
    let (reject, drop) = (v4(10, 96, 0, 30, 80), v4(10, 96, 0, 31, 80));
    for proto in PROTOS {
        // More than the ICMP rate limit's burst (6): all must be refused.
        for i in 0..10 {
            for from in ["client1", "pod-a", "node"] {
                assert_eq!(
                    lab.probe(from, proto, reject),
                    Outcome::Refused,
                    "#{i} {from} {proto:?}"
                );
            }
        }
    }
    // DROP: every probe times out, after the bound and not much later (in
    // parallel, to keep the test short).
    std::thread::scope(|s| {
        for proto in PROTOS {
            for from in ["client1", "pod-a", "node"] {
                let lab = &lab;
                s.spawn(move || {
                    let start = Instant::now();
                    assert_eq!(
                        lab.probe(from, proto, drop),
                        Outcome::TimedOut,
                        "{from} {proto:?}"
                    );
                    let took = start.elapsed();
                    assert!(
                        took >= PROBE_TIMEOUT - Duration::from_millis(50)
                            && took < PROBE_TIMEOUT + Duration::from_millis(500),
                        "{from} {proto:?}: TimedOut after {took:?}"
                    );
                });
            }
        }
    });
}

#[test]
fn parallel_labs_do_not_interfere() {
    if !require_root("parallel_labs_do_not_interfere") {
        return;
    }
    let names = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for (tag, backend, ip) in [
            ("para", "pod-r1", "10.244.2.2"),
            ("parb", "pod-b", "10.244.1.3"),
        ] {
            let names = &names;
            s.spawn(move || {
                let lab = lab_serving(tag);
                names.lock().unwrap().extend(lab.namespaces().iter().cloned());
                let doc = format!(
                    "*nat\n-A PREROUTING -d 10.96.0.40/32 -p tcp --dport 80 -j DNAT --to-destination {ip}:8080\nCOMMIT\n"
                );
                load_iptables(&lab, &doc);
                for _ in 0..20 {
                    let got = lab.probe("client1", Proto::Tcp, v4(10, 96, 0, 40, 80));
                    assert_eq!(got.backend(), Some(backend), "{tag}: {got:?}");
                }
                let listed = ip_netns_list();
                assert!(lab.namespaces().iter().all(|n| listed.contains(n)));
            });
        }
    });
    let names = names.into_inner().unwrap();
    assert_eq!(names.len(), 2 * 9);
    let listed = ip_netns_list();
    let left: Vec<&String> = names.iter().filter(|n| listed.contains(n)).collect();
    assert!(left.is_empty(), "namespaces left after drop: {left:?}");
}

#[test]
fn panic_still_cleans_up() {
    if !require_root("panic_still_cleans_up") {
        return;
    }
    let names = Mutex::new(Vec::new());
    let result = std::panic::catch_unwind(|| {
        let lab = lab_serving("panic");
        names
            .lock()
            .unwrap()
            .extend(lab.namespaces().iter().cloned());
        assert_eq!(
            lab.probe("client1", Proto::Udp, lab.addr("pod-a", 8080))
                .backend(),
            Some("pod-a")
        );
        panic!("deliberate panic inside a kernel test (expected)");
    });
    assert!(result.is_err());
    let names = names.into_inner().unwrap_or_else(|e| e.into_inner());
    assert!(!names.is_empty());
    let listed = ip_netns_list();
    let left: Vec<&String> = names.iter().filter(|n| listed.contains(n)).collect();
    assert!(left.is_empty(), "namespaces left after panic: {left:?}");
}

#[test]
fn stale_namespaces_are_swept() {
    if !require_root("stale_namespaces_are_swept") {
        return;
    }
    // No process has this pid (above the kernel's pid_max limit).
    let stale = format!("{}stale-999999999-0-node", sys::NETNS_PREFIX);
    sys::run_ok(
        Command::new("ip").args(["netns", "add", &stale]),
        None,
        Duration::from_secs(10),
    )
    .expect("add");
    // (A lab starting in parallel may sweep it first: only its absence counts.)
    sys::sweep_stale().expect("sweep");
    assert!(!ip_netns_list().contains(&stale));
}

#[test]
fn bad_specs_are_rejected() {
    let mut spec = LabSpec::default();
    spec.local_pods[0].ip = Ipv4Addr::new(10, 244, 2, 9);
    assert!(Lab::new("bad", &spec).is_err());
    let mut spec = LabSpec::default();
    spec.clients[0].name = "node".into();
    assert!(Lab::new("bad", &spec).is_err());
}
