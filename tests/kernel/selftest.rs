//! Self-tests of the kernel lab: plain routing, hand-written DNAT and
//! masquerade, hairpin, REJECT/DROP, parallel labs, cleanup on panic.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::lab::addr;
use super::sys;
use super::{require_root, Family, Lab, LabSpec, Outcome, Proto, PROBE_TIMEOUT};

const PROTOS: [Proto; 2] = [Proto::Tcp, Proto::Udp];

/// Service address 10.96.0.<last>:80, or its twin fd00:10:96::<last>.
fn vip(last: u8, family: Family) -> SocketAddr {
    SocketAddr::new(addr::of(Ipv4Addr::new(10, 96, 0, last), family), 80)
}

/// "-d <vip>/32 -p <proto> --dport 80": a rule match for a service.
fn svc(last: u8, family: Family, proto: &str) -> String {
    let ip = vip(last, family).ip();
    format!("-d {} -p {proto} --dport 80", addr::host_cidr(ip))
}

/// A lab with echo servers on every pod, TCP and UDP, port 8080.
fn lab_serving(tag: &str) -> Lab {
    let mut lab = Lab::new(tag, &LabSpec::default()).expect("lab");
    for proto in PROTOS {
        lab.serve(proto, 8080).expect("serve");
    }
    lab
}

/// Loads a ruleset into the node with iptables-restore or ip6tables-restore.
fn load_iptables(lab: &Lab, family: Family, doc: &str) {
    let program = match family {
        Family::V4 => "iptables-restore",
        Family::V6 => "ip6tables-restore",
    };
    if let Err(e) = lab.exec_ok("node", program, &["--noflush"], Some(doc)) {
        panic!("{e}\n{doc}");
    }
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
    for &fam in lab.families() {
        for proto in PROTOS {
            for (from, to) in pairs {
                let want = if to == "client1" {
                    Outcome::Refused // no server on the client
                } else {
                    Outcome::answered(to, lab.ip(from, fam))
                };
                let got = lab.probe(from, proto, lab.addr(to, fam, 8080));
                assert_eq!(got, want, "{from} -> {to} {proto:?} {fam:?}");
            }
            // The node reaches its pods from its pod-veth address, node2's
            // pods from its link address.
            let got = lab.probe("node", proto, lab.addr("pod-a", fam, 8080));
            let want = Outcome::answered("pod-a", addr::of(addr::NODE_POD_GW, fam));
            assert_eq!(got, want, "{proto:?} {fam:?}");
            let got = lab.probe("node", proto, lab.addr("pod-r2", fam, 8080));
            let want = Outcome::answered("pod-r2", addr::of(addr::NODE_LINK, fam));
            assert_eq!(got, want, "{proto:?} {fam:?}");
            // No server on that port: refused, not a time-out.
            let got = lab.probe("client1", proto, lab.addr("pod-a", fam, 9));
            assert_eq!(got, Outcome::Refused, "{proto:?} {fam:?}");
        }
    }
}

#[test]
fn node_settings() {
    if !require_root("node_settings") {
        return;
    }
    let lab = Lab::new("settings", &LabSpec::default()).expect("lab");
    for (key, want) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
        ("net.ipv6.conf.eth0.forwarding", "1"),
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
    for (dst, via) in [
        ("10.244.2.3", "via 198.51.100.2 dev eth1"),
        ("fd00:10:244:2::3", "via fd00:198:51:100::2 dev eth1"),
        ("10.244.1.3", "dev vpod1 src 10.244.1.1"),
        ("fd00:10:244:1::3", "dev vpod1 src fd00:10:244:1::1"),
    ] {
        let out = lab
            .exec("node", "ip", &["route", "get", dst], None)
            .expect("ip route get");
        let route = String::from_utf8_lossy(&out.stdout);
        assert!(route.contains(via), "{dst}: {route}");
    }
    // A command that exits non-zero is an Output for exec, an error for exec_ok.
    let out = lab.exec("node", "false", &[], None).expect("false");
    assert!(!out.status.success());
    assert!(lab.exec_ok("node", "false", &[], None).is_err());
}

/// kube-proxy-like nat rules: VIP .10 → pod-r1:8080 without masquerade,
/// .11 → pod-r1:8080 and .12 → pod-b:8080 marked for masquerade, .13 →
/// pod-r1:8080 masquerading only sources outside the clusterCIDR.
fn dnat_rules(lab: &Lab, fam: Family) -> String {
    let cluster = addr::cidr(addr::CLUSTER_CIDR, fam);
    let (r1, b) = (lab.addr("pod-r1", fam, 8080), lab.addr("pod-b", fam, 8080));
    let mut doc = String::from(
        "*nat
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
",
    );
    for p in ["tcp", "udp"] {
        doc += &format!(
            "-A SCT-SERVICES {} -j DNAT --to-destination {r1}\n",
            svc(10, fam, p)
        );
        doc += &format!("-A SCT-SERVICES {} -j SCT-MARK-MASQ\n", svc(11, fam, p));
        doc += &format!(
            "-A SCT-SERVICES {} -j DNAT --to-destination {r1}\n",
            svc(11, fam, p)
        );
        doc += &format!("-A SCT-SERVICES {} -j SCT-MARK-MASQ\n", svc(12, fam, p));
        doc += &format!(
            "-A SCT-SERVICES {} -j DNAT --to-destination {b}\n",
            svc(12, fam, p)
        );
        doc += &format!(
            "-A SCT-SERVICES {} ! -s {cluster} -j SCT-MARK-MASQ\n",
            svc(13, fam, p)
        );
        doc += &format!(
            "-A SCT-SERVICES {} -j DNAT --to-destination {r1}\n",
            svc(13, fam, p)
        );
    }
    doc + "COMMIT\n"
}

#[test]
fn dnat_and_masquerade() {
    if !require_root("dnat_and_masquerade") {
        return;
    }
    let lab = lab_serving("dnat");
    for &fam in lab.families() {
        load_iptables(&lab, fam, &dnat_rules(&lab, fam));
        let (node_link, node_pod_gw) = (
            addr::of(addr::NODE_LINK, fam),
            addr::of(addr::NODE_POD_GW, fam),
        );
        for proto in PROTOS {
            for from in ["client1", "client2", "pod-a", "pod-b", "node"] {
                // The node's own traffic leaves from the address of its
                // default route: the LAN one.
                let real = lab.ip(from, fam);
                let off_cluster = if from.starts_with("pod-") {
                    real
                } else {
                    node_link
                };
                let cases = [
                    (vip(10, fam), Outcome::answered("pod-r1", real)),
                    (vip(11, fam), Outcome::answered("pod-r1", node_link)),
                    (vip(12, fam), Outcome::answered("pod-b", node_pod_gw)),
                    (vip(13, fam), Outcome::answered("pod-r1", off_cluster)),
                ];
                for (dst, want) in cases {
                    assert_eq!(
                        lab.probe(from, proto, dst),
                        want,
                        "{from} -> {dst} {proto:?}"
                    );
                }
            }
        }
    }
    let entries = lab
        .exec_ok("node", "conntrack", &["-L", "-f", "ipv4"], None)
        .expect("conntrack -L");
    assert!(entries.contains("dst=10.96.0.11"), "conntrack:\n{entries}");
    let entries = lab
        .exec_ok("node", "conntrack", &["-L", "-f", "ipv6"], None)
        .expect("conntrack -L");
    assert!(
        entries.contains("dst=fd00:10:96::11"),
        "conntrack:\n{entries}"
    );
    lab.flush_conntrack().expect("flush");
    for f in ["ipv4", "ipv6"] {
        let entries = lab
            .exec_ok("node", "conntrack", &["-L", "-f", f], None)
            .expect("conntrack -L");
        assert!(
            !entries.contains("dst=10.96.0.11") && !entries.contains("dst=fd00:10:96::11"),
            "{entries}"
        );
    }
}

#[test]
fn hairpin() {
    if !require_root("hairpin") {
        return;
    }
    let lab = lab_serving("hairpin");
    for &fam in lab.families() {
        let a = lab.addr("pod-a", fam, 8080);
        let mut doc = String::from(
            "*nat
:SCT-HAIRPIN - [0:0]
-A PREROUTING -j SCT-HAIRPIN
-A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
",
        );
        for p in ["tcp", "udp"] {
            doc += &format!(
                "-A SCT-HAIRPIN {} -j MARK --or-mark 0x4000\n",
                svc(20, fam, p)
            );
            doc += &format!(
                "-A SCT-HAIRPIN {} -j DNAT --to-destination {a}\n",
                svc(20, fam, p)
            );
            doc += &format!(
                "-A SCT-HAIRPIN {} -j DNAT --to-destination {a}\n",
                svc(21, fam, p)
            );
        }
        load_iptables(&lab, fam, &(doc + "COMMIT\n"));
        let gw = addr::of(addr::NODE_POD_GW, fam);
        for proto in PROTOS {
            let got = lab.probe("pod-a", proto, vip(20, fam));
            assert_eq!(got, Outcome::answered("pod-a", gw), "{proto:?} {fam:?}");
            // Other pods use the same VIP normally.
            let got = lab.probe("pod-b", proto, vip(20, fam));
            assert_eq!(got, Outcome::answered("pod-a", gw), "{proto:?} {fam:?}");
        }
    }
    // Without masquerade pod-a sees its own address as source: IPv4 drops
    // it as a martian.
    assert_eq!(
        lab.probe("pod-a", Proto::Tcp, vip(21, Family::V4)),
        Outcome::TimedOut
    );
}

#[test]
fn reject_and_drop() {
    if !require_root("reject_and_drop") {
        return;
    }
    let lab = lab_serving("reject");
    for &fam in lab.families() {
        let mut doc = String::from(
            "*filter
:SCT-FILTER - [0:0]
-A INPUT -j SCT-FILTER
-A FORWARD -j SCT-FILTER
-A OUTPUT -j SCT-FILTER
",
        );
        for p in ["tcp", "udp"] {
            doc += &format!("-A SCT-FILTER {} -j REJECT\n", svc(30, fam, p));
            doc += &format!("-A SCT-FILTER {} -j DROP\n", svc(31, fam, p));
        }
        load_iptables(&lab, fam, &(doc + "COMMIT\n"));
    }
    // REJECT: more probes than the ICMP rate limits' bursts, all refused;
    // one thread per source host. (IPv6 TCP takes ~1 s per probe, see
    // `Outcome::Refused`.)
    std::thread::scope(|s| {
        for from in ["client1", "pod-a", "node"] {
            let lab = &lab;
            s.spawn(move || {
                for &fam in lab.families() {
                    for proto in PROTOS {
                        let slow = (fam, proto) == (Family::V6, Proto::Tcp);
                        for i in 0..if slow { 2 } else { 10 } {
                            let got = lab.probe(from, proto, vip(30, fam));
                            assert_eq!(got, Outcome::Refused, "#{i} {from} {proto:?} {fam:?}");
                        }
                    }
                }
            });
        }
    });
    // DROP: every probe times out, not before the bound (in parallel, to keep
    // the test short). No upper bound: a loaded machine may be late.
    std::thread::scope(|s| {
        for &fam in lab.families() {
            for proto in PROTOS {
                for from in ["client1", "pod-a", "node"] {
                    let lab = &lab;
                    s.spawn(move || {
                        let start = Instant::now();
                        let got = lab.probe(from, proto, vip(31, fam));
                        assert_eq!(got, Outcome::TimedOut, "{from} {proto:?} {fam:?}");
                        let took = start.elapsed();
                        assert!(
                            took >= PROBE_TIMEOUT - Duration::from_millis(50),
                            "{from} {proto:?} {fam:?}: TimedOut after {took:?}"
                        );
                    });
                }
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
        // One dual-stack lab, one IPv4-only: same VIP, different backends.
        for (tag, backend, ipv6) in [("para", "pod-r1", true), ("parb", "pod-b", false)] {
            let names = &names;
            s.spawn(move || {
                let spec = LabSpec {
                    ipv6,
                    ..LabSpec::default()
                };
                let mut lab = Lab::new(tag, &spec).expect("lab");
                lab.serve(Proto::Tcp, 8080).expect("serve");
                names
                    .lock()
                    .unwrap()
                    .extend(lab.namespaces().iter().cloned());
                let mut families = vec![Family::V4];
                if ipv6 {
                    families.push(Family::V6);
                }
                assert_eq!(lab.families(), families);
                for &fam in lab.families() {
                    let to = lab.addr(backend, fam, 8080);
                    let doc = format!(
                        "*nat\n-A PREROUTING {} -j DNAT --to-destination {to}\nCOMMIT\n",
                        svc(40, fam, "tcp")
                    );
                    load_iptables(&lab, fam, &doc);
                    for _ in 0..20 {
                        let got = lab.probe("client1", Proto::Tcp, vip(40, fam));
                        assert_eq!(got.backend(), Some(backend), "{tag}: {got:?}");
                    }
                }
                if !ipv6 {
                    // No IPv6 address anywhere: unreachable.
                    let got = lab.probe("client1", Proto::Tcp, vip(40, Family::V6));
                    assert!(matches!(got, Outcome::Failed(_)), "{got:?}");
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
            lab.probe("client1", Proto::Udp, lab.addr("pod-a", Family::V4, 8080))
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

/// `SVC_KERNEL=require` turns a skipped kernel test into a failed one: this test binary,
/// run again as nobody on one kernel test, passes saying `skipped:` without the variable
/// and fails with it (and with a value it does not know).
#[test]
fn svc_kernel_require_fails_what_would_skip() {
    if !require_root("svc_kernel_require_fails_what_would_skip") {
        return;
    }
    // A copy nobody can run, wherever the build directory is (a checkout under /root is
    // not).
    let dir = crate::support::TempDir::new("svc-kernel");
    let exe = dir.path().join("tests");
    std::fs::copy(std::env::current_exe().expect("the test binary"), &exe).expect("copy");
    for p in [dir.path(), exe.as_path()] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    let test = "kernel::selftest::stale_namespaces_are_swept";
    for (value, passes, says) in [
        (
            None,
            true,
            "skipped: stale_namespaces_are_swept: needs root",
        ),
        (
            Some("require"),
            false,
            "needs root (network namespaces), and SVC_KERNEL=require forbids skipping",
        ),
        (
            Some("yes"),
            false,
            "SVC_KERNEL=\"yes\": the only value is `require`",
        ),
    ] {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"]);
        match value {
            Some(v) => cmd.env(super::lab::SVC_KERNEL, v),
            None => cmd.env_remove(super::lab::SVC_KERNEL),
        };
        let out = sys::run_bounded(&mut cmd, None, Duration::from_secs(60)).expect("run");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.success(), passes, "SVC_KERNEL={value:?}: {text}");
        assert!(text.contains(says), "SVC_KERNEL={value:?}: {text}");
        assert!(
            text.contains("1 passed") == passes,
            "SVC_KERNEL={value:?}: {text}"
        );
    }
    // As root, where nothing skips, a value it does not know still fails the test.
    let mut cmd = Command::new(&exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(super::lab::SVC_KERNEL, "requried");
    let out = sys::run_bounded(&mut cmd, None, Duration::from_secs(60)).expect("run");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "a typo passed as root: {text}");
    assert!(
        text.contains("SVC_KERNEL=\"requried\": the only value is `require`"),
        "{text}"
    );
}
