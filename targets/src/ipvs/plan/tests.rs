//! The IPVS planner with hand-made documents and node reads (the kernel's spelling is
//! ours here: `ipvsadm-save` and `ipset save` read back what they were given, but for
//! `initval`/`bucketsize`); the VM tests (`tests/kernel/ipvs_apply.rs`) cover the real one.

use super::*;
use crate::plan::plan as plan2;

/// A bundle as `--target ipvs` writes it: sets `(name, entries)` (hash:ip,port), servers
/// `(service, reals)` (`-t VIP:80`), bound VIPs, and one iptables rule per set.
fn doc(sets: &[(&str, &[&str])], servers: &[(&str, &[&str])], extra: &str) -> String {
    let mut out = String::from("# ==== ipset: load with `ipset restore` (node n, IPv4) ====\n");
    out += &ipset_text(sets, false);
    out += "# ==== ipvsadm: load with `ipvsadm-restore` (node n, IPv4) ====\n";
    out += extra;
    out += &ipvs_text(servers);
    out += "# ==== addresses: load with `ip -batch -` (node n, IPv4) ====\n";
    out += "#   net.ipv4.vs.conntrack=1  (why)\n#   net.ipv4.vs.conn_reuse_mode=0  (only on kernels older than 5.9)\n";
    out += "link add kube-ipvs0 type dummy\n";
    for vip in vips(servers) {
        out += &format!("address add {vip}/32 dev kube-ipvs0\n");
    }
    out += "# ==== iptables: load with `iptables-restore --noflush` (node n, IPv4) ====\n";
    out += &ipt_doc(sets);
    out
}

/// The servers' addresses bound to kube-ipvs0: cluster IPs (10.96.…), not node addresses.
fn vips(servers: &[(&str, &[&str])]) -> Vec<String> {
    servers
        .iter()
        .map(|(s, _)| service_addr(s))
        .filter(|a| a.starts_with("10.96."))
        .collect()
}

fn ipset_text(sets: &[(&str, &[&str])], kernel: bool) -> String {
    let mut out = String::new();
    for (name, entries) in sets {
        let extra = if kernel {
            " bucketsize 12 initval 0x1234abcd"
        } else {
            ""
        };
        out +=
            &format!("create {name} hash:ip,port family inet hashsize 1024 maxelem 65536{extra}\n");
        for e in entries.iter() {
            out += &format!("add {name} {e}\n");
        }
    }
    out
}

fn ipvs_text(servers: &[(&str, &[&str])]) -> String {
    let mut out = String::new();
    for (s, reals) in servers {
        out += &format!("-A {s} -s rr\n");
        for r in reals.iter() {
            out += &format!("-a {s} -r {r} -m -w 1\n");
        }
    }
    out
}

fn ipt_doc(sets: &[(&str, &[&str])]) -> String {
    let mut out = String::from("*nat\n:KUBE-SERVICES - [0:0]\n");
    out += "-I PREROUTING -j KUBE-SERVICES\n";
    for (name, _) in sets {
        out += &format!("-A KUBE-SERVICES -m set --match-set {name} dst,dst -j ACCEPT\n");
    }
    out + "COMMIT\n"
}

/// `iptables-save` of a table holding `ipt_doc(sets)` (or nothing).
fn ipt_save(sets: Option<&[(&str, &[&str])]>) -> String {
    let mut out =
        String::from("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n");
    if let Some(sets) = sets {
        out += ":KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n";
        for (name, _) in sets {
            out += &format!("-A KUBE-SERVICES -m set --match-set {name} dst,dst -j ACCEPT\n");
        }
    }
    out + "COMMIT\n"
}

/// A node read (what `READ` prints).
fn read(
    sets: &[(&str, &[&str])],
    servers: &[(&str, &[&str])],
    addrs: &[&str],
    ipt: &str,
) -> String {
    let mut out = format!("#### ipset\n{}", ipset_text(sets, true));
    out += &format!("#### ipvsadm\n{}", ipvs_text(servers));
    out += "#### timeout\nTimeout (tcp tcpfin udp): 900 120 300\n#### addresses\n";
    if !addrs.is_empty() {
        out += "link kube-ipvs0\n";
    }
    for a in addrs {
        out += &format!("7: kube-ipvs0    inet {a}/32 scope global kube-ipvs0\\       valid_lft forever preferred_lft forever\n");
    }
    out + "#### iptables\n" + ipt
}

const USER_SET: (&str, &[&str]) = ("USER-SET", &["203.0.113.1,tcp:22"]);
const USER_VS: (&str, &[&str]) = ("-t 192.0.2.10:8888", &["10.1.0.9:80"]);

/// The node read after `doc(sets, servers)` went in, with the user's own objects.
fn node_with(sets: &[(&str, &[&str])], servers: &[(&str, &[&str])]) -> String {
    let mut all_sets = sets.to_vec();
    all_sets.push(USER_SET);
    let mut all_servers = servers.to_vec();
    all_servers.push(USER_VS);
    let addrs = vips(servers);
    let addrs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    read(&all_sets, &all_servers, &addrs, &ipt_save(Some(sets)))
}

/// What the scratch namespace shows after loading `doc(sets, servers)`.
fn scratch_of(sets: &[(&str, &[&str])], servers: &[(&str, &[&str])]) -> String {
    let addrs = vips(servers);
    let addrs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    read(sets, servers, &addrs, &ipt_save(Some(sets)))
}

fn plan_for(
    new: &str,
    kernel: &str,
    previous: Option<Previous>,
    sets: &[(&str, &[&str])],
    servers: &[(&str, &[&str])],
) -> Plan {
    let prep = Ipvs
        .prepare(new, Family::V4, previous, kernel, false)
        .unwrap();
    plan2(&prep, &scratch_of(sets, servers)).unwrap()
}

const SETS_V1: [(&str, &[&str]); 2] = [
    ("KUBE-CLUSTER-IP", &["10.96.0.1,tcp:80", "10.96.0.2,tcp:80"]),
    ("KUBE-LOOP-BACK", &[]),
];
const SERVERS_V1: [(&str, &[&str]); 2] = [
    ("-t 10.96.0.1:80", &["10.244.1.2:8080", "10.244.1.3:8080"]),
    ("-t 10.96.0.2:80", &["10.244.1.4:8080"]),
];

#[test]
fn first_apply_loads_everything_in_order() {
    let new = doc(&SETS_V1, &SERVERS_V1, "");
    let kernel = read(&[USER_SET], &[USER_VS], &[], &ipt_save(None));
    let prep = Ipvs
        .prepare(&new, Family::V4, None, &kernel, false)
        .unwrap();
    assert_eq!(prep.mode, Mode::Full("no previous apply recorded".into()));
    // The scratch script loads the whole new state.
    for w in [
        "create KUBE-CLUSTER-IP",
        "-A -t 10.96.0.1:80 -s rr",
        "address add 10.96.0.2/32",
        "-A KUBE-SERVICES -m set",
    ] {
        assert!(prep.scratch.contains(w), "{w}: {}", prep.scratch);
    }
    let p = plan2(&prep, &scratch_of(&SETS_V1, &SERVERS_V1)).unwrap();
    let load = p.load.clone().unwrap();
    // The steps in the order of the module docs.
    let at = |w: &str| load.find(w).unwrap_or_else(|| panic!("{w}: {load}"));
    assert!(at("# 1.") < at("# 2.") && at("# 2.") < at("# 3.") && at("# 3.") < at("# 4."));
    assert!(at("# 4.") < at("# 6."));
    assert!(!load.contains("# 5.") && !load.contains("# 7."));
    assert!(load.contains("sysctl -qw net.ipv4.vs.conntrack=1\n"));
    assert!(!load.contains("conn_reuse_mode"));
    assert!(load.contains("link add kube-ipvs0 type dummy\n"));
    // The user's objects are neither loaded nor expected.
    assert!(!load.contains("USER-SET") && !load.contains("8888"));
    assert!(!p.expected.contains("USER-SET") && !p.expected.contains("8888"));
    // After the load the node shows the expectation.
    let after = node_with(&SETS_V1, &SERVERS_V1);
    assert_eq!(p.owned(&after).unwrap(), p.expected);
    assert_eq!(p.summary.rewritten, 2 + 2 + 1); // sets, servers, chain
}

#[test]
fn unchanged_node_loads_nothing() {
    let new = doc(&SETS_V1, &SERVERS_V1, "");
    let kernel = node_with(&SETS_V1, &SERVERS_V1);
    // Without a record the iptables chains are rewritten; the IPVS side is already right.
    let first = plan_for(&new, &kernel, None, &SETS_V1, &SERVERS_V1);
    let load = first.load.clone().unwrap();
    assert!(
        !load.contains("ipset restore") && !load.contains("svc_ipvsadm <<"),
        "{load}"
    );
    let snapshot = first.owned(&kernel).unwrap();
    let prev = Previous {
        document: &new,
        snapshot: &snapshot,
    };
    let p = plan_for(&new, &kernel, Some(prev), &SETS_V1, &SERVERS_V1);
    assert_eq!(p.mode, Mode::Unchanged);
    assert_eq!(p.load, None);
}

#[test]
fn incremental_touches_only_what_changed() {
    let old = doc(&SETS_V1, &SERVERS_V1, "");
    let kernel = node_with(&SETS_V1, &SERVERS_V1);
    let snapshot = plan_for(&old, &kernel, None, &SETS_V1, &SERVERS_V1)
        .owned(&kernel)
        .unwrap();
    // 10.96.0.1 loses an endpoint and gains one; 10.96.0.2 goes; 10.96.0.3 comes.
    let sets: [(&str, &[&str]); 2] = [
        ("KUBE-CLUSTER-IP", &["10.96.0.1,tcp:80", "10.96.0.3,tcp:80"]),
        ("KUBE-LOOP-BACK", &[]),
    ];
    let servers: [(&str, &[&str]); 2] = [
        ("-t 10.96.0.1:80", &["10.244.1.2:8080", "10.244.1.5:8080"]),
        ("-t 10.96.0.3:80", &["10.244.1.6:8080"]),
    ];
    let new = doc(&sets, &servers, "");
    let prev = Previous {
        document: &old,
        snapshot: &snapshot,
    };
    let p = plan_for(&new, &kernel, Some(prev), &sets, &servers);
    assert_eq!(p.mode, Mode::Incremental);
    let load = p.load.clone().unwrap();
    let tmp = format!("{TMP_PREFIX}{:016x}", fnv1a("KUBE-CLUSTER-IP"));
    let want = format!(
        "ipset restore <<'SVC_IPSET'\n\
         create {tmp} hash:ip,port family inet hashsize 1024 maxelem 65536\n\
         add {tmp} 10.96.0.1,tcp:80\nadd {tmp} 10.96.0.3,tcp:80\n\
         swap {tmp} KUBE-CLUSTER-IP\ndestroy {tmp}\nSVC_IPSET\n"
    );
    assert!(load.contains(&want), "{load}");
    let servers_step = "svc_ipvsadm <<'SVC_IPVSADM'\n\
        -a -t 10.96.0.1:80 -r 10.244.1.5:8080 -m -w 1\n\
        -d -t 10.96.0.1:80 -r 10.244.1.3:8080\n\
        -A -t 10.96.0.3:80 -s rr\n\
        -a -t 10.96.0.3:80 -r 10.244.1.6:8080 -m -w 1\nSVC_IPVSADM\n";
    assert!(load.contains(servers_step), "{load}");
    assert!(load.contains(
        "ip -batch - <<'SVC_IP'\naddress add 10.96.0.3/32 dev kube-ipvs0\naddress del 10.96.0.2/32 dev kube-ipvs0\nSVC_IP\n"
    ));
    assert!(load.contains("svc_ipvsadm <<'SVC_IPVSADM_DEL'\n-D -t 10.96.0.2:80\nSVC_IPVSADM_DEL\n"));
    // Untouched: the loop-back set, 10.96.0.1's kept real server, the iptables chain, the
    // user's objects.
    assert!(!load.contains("KUBE-LOOP-BACK") && !load.contains("10.244.1.2"));
    assert!(!load.contains("iptables-restore") && !load.contains("USER") && !load.contains("8888"));
}

#[test]
fn a_server_on_a_foreign_address_is_never_touched_but_one_on_our_vip_is() {
    let new = doc(&SETS_V1, &SERVERS_V1, "");
    let mut kernel_servers = SERVERS_V1.to_vec();
    // Someone's server on our VIP at another port: ours to delete (the VIP is ours).
    kernel_servers.push(("-t 10.96.0.1:9999", &["10.1.0.1:1"]));
    kernel_servers.push(USER_VS);
    let kernel = read(
        &SETS_V1,
        &kernel_servers,
        &["10.96.0.1", "10.96.0.2"],
        &ipt_save(Some(&SETS_V1)),
    );
    let p = plan_for(&new, &kernel, None, &SETS_V1, &SERVERS_V1);
    let load = p.load.unwrap();
    assert!(load.contains("-D -t 10.96.0.1:9999\n"), "{load}");
    assert!(!load.contains("8888"), "{load}");
}

#[test]
fn timeouts_keep_the_nodes_value_where_the_document_says_0() {
    let new = doc(&SETS_V1, &SERVERS_V1, "--set 0 0 60\n");
    let kernel = node_with(&SETS_V1, &SERVERS_V1);
    let p = plan_for(&new, &kernel, None, &SETS_V1, &SERVERS_V1);
    assert!(p.load.as_deref().unwrap().contains("--set 900 120 60\n"));
    assert!(p
        .expected
        .contains("Timeout (tcp tcpfin udp): 900 120 60\n"));
}

#[test]
fn revert_puts_back_what_a_failed_load_changed() {
    let old = doc(&SETS_V1, &SERVERS_V1, "");
    let kernel = node_with(&SETS_V1, &SERVERS_V1);
    let sets: [(&str, &[&str]); 2] = [
        ("KUBE-CLUSTER-IP", &["10.96.0.1,tcp:80"]),
        ("KUBE-LOOP-BACK", &[]),
    ];
    let servers: [(&str, &[&str]); 1] = [("-t 10.96.0.1:80", &["10.244.1.2:8080"])];
    let p = plan_for(&doc(&sets, &servers, ""), &kernel, None, &sets, &servers);
    // The load stopped after steps 1 and 2: the set swapped, a real server removed.
    let mut half = SERVERS_V1.to_vec();
    half[0] = ("-t 10.96.0.1:80", &["10.244.1.2:8080"]);
    let mut all = sets.to_vec();
    all.push(USER_SET);
    half.push(USER_VS);
    let after = read(
        &all,
        &half,
        &["10.96.0.1", "10.96.0.2"],
        &ipt_save(Some(&SETS_V1)),
    );
    let revert = p.revert(&after).unwrap().unwrap();
    assert!(revert.contains("add SVC-TMP-"), "{revert}");
    assert!(revert.contains("10.96.0.2,tcp:80"));
    assert!(revert.contains("-a -t 10.96.0.1:80 -r 10.244.1.3:8080 -m -w 1\n"));
    assert!(!revert.contains("USER") && !revert.contains("8888"));
    // Once it has run, the node shows what it showed before.
    assert_eq!(
        p.owned(&kernel).unwrap(),
        p.owned(&node_with(&SETS_V1, &SERVERS_V1)).unwrap()
    );
    let _ = old;
}

#[test]
fn a_set_that_changes_type_is_refused() {
    let new = doc(&SETS_V1, &SERVERS_V1, "");
    let kernel = node_with(&SETS_V1, &SERVERS_V1).replace(
        "create KUBE-LOOP-BACK hash:ip,port ",
        "create KUBE-LOOP-BACK hash:ip ",
    );
    let prep = Ipvs
        .prepare(&new, Family::V4, None, &kernel, false)
        .unwrap();
    let e = plan2(&prep, &scratch_of(&SETS_V1, &SERVERS_V1)).unwrap_err();
    assert!(e.contains("KUBE-LOOP-BACK is hash:ip on the node"), "{e}");
}

#[test]
fn documents_and_reads_are_checked() {
    assert_eq!(
        Ipvs.family_of(&doc(&SETS_V1, &SERVERS_V1, "")),
        Some(Family::V4)
    );
    assert_eq!(Ipvs.family_of("-A -t 1.2.3.4:80 -s rr\n"), None);
    let one_part = "create KUBE-CLUSTER-IP hash:ip,port family inet\n";
    let e = Ipvs
        .prepare(one_part, Family::V4, None, "", false)
        .unwrap_err();
    assert!(e.contains("not one --part"), "{e}");
    let e = Ipvs
        .prepare(
            &doc(&SETS_V1, &SERVERS_V1, ""),
            Family::V4,
            None,
            "garbage\n",
            false,
        )
        .unwrap_err();
    assert!(e.contains("no `#### ipset` section"), "{e}");
}

#[test]
fn here_documents_never_end_early() {
    let mut out = String::new();
    heredoc(&mut out, "cat", "a\nSVC_X\nb\n", "X");
    assert_eq!(out, "cat <<'SVC_X_'\na\nSVC_X\nb\nSVC_X_\n");
}

/// A load that went in but was never recorded (SIGKILL between load and record): its
/// servers and VIPs are still ours through our sets on the node, so the next apply removes
/// them; the user's server stays.
#[test]
fn what_an_unrecorded_load_left_is_still_owned() {
    let sets: [(&str, &[&str]); 2] = [
        ("KUBE-IPVS-IPS", &["10.96.0.1"]),
        ("KUBE-NODE-PORT-TCP", &["30001"]),
    ];
    let servers: [(&str, &[&str]); 2] = [
        ("-t 10.96.0.1:80", &["10.244.1.2:8080"]),
        ("-t 192.0.2.10:30001", &["10.244.1.2:8080"]),
    ];
    let v1 = doc(&sets, &servers, "");
    let recorded = node_with(&sets, &servers);
    let snapshot = plan_for(&v1, &recorded, None, &sets, &servers)
        .owned(&recorded)
        .unwrap();
    // v2 went in: one more service with a node port; the record still says v1.
    let sets2: [(&str, &[&str]); 2] = [
        ("KUBE-IPVS-IPS", &["10.96.0.1", "10.96.0.2"]),
        ("KUBE-NODE-PORT-TCP", &["30001", "30002"]),
    ];
    let mut servers2 = servers.to_vec();
    servers2.push(("-t 10.96.0.2:80", &["10.244.1.3:8080"]));
    servers2.push(("-t 192.0.2.10:30002", &["10.244.1.3:8080"]));
    let kernel = node_with(&sets2, &servers2);
    let prev = Previous {
        document: &v1,
        snapshot: &snapshot,
    };
    let p = plan_for(&v1, &kernel, Some(prev), &sets, &servers);
    let load = p.load.unwrap();
    assert!(
        load.contains("-D -t 10.96.0.2:80\n-D -t 192.0.2.10:30002\n"),
        "{load}"
    );
    assert!(
        load.contains("address del 10.96.0.2/32 dev kube-ipvs0\n"),
        "{load}"
    );
    assert!(!load.contains("8888") && !load.contains("USER"), "{load}");
}

/// The read's `ipvsadm -S -n` settles: with a stand-in `ipvsadm` whose first listing
/// repeats a server (as a dump does while another namespace changes its servers), the read
/// prints the listing two reads in a row agreed on.
#[test]
fn the_ipvsadm_read_waits_for_two_equal_listings() {
    let dir = std::env::temp_dir().join(format!("svc-compile-stable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("ipvsadm");
    // Listing n (n = 1, 2, …): the first has `-A -t b` twice, the rest do not.
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nc=$(cat {0}/n 2>/dev/null || echo 0); c=$((c + 1)); echo $c > {0}/n\n\
             echo '-A -t a'; echo '-A -t b'; [ $c = 1 ] && echo '-A -t b'; exit 0\n",
            dir.display()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .args(["+x", fake.to_str().unwrap()])
        .status()
        .unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "set -e; PATH={}:$PATH\n{STABLE_IPVSADM}",
            dir.display()
        ))
        .output()
        .unwrap();
    let calls = std::fs::read_to_string(dir.join("n")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "-A -t a\n-A -t b\n");
    // 1 and 2 differ, 2 and 3 agree.
    assert_eq!(calls.trim(), "3");
}
