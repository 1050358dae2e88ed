//! The differential test's IPVS side (a child of [`super`], whose flows and checks it
//! reuses): generated manifests through `--target ipvs` in the IPVS VM, every flow checked
//! against the IR's expectation. Started inside the VM by `kernel::ipvs::golden_flows_ipvs`
//! (one boot for the whole IPVS suite) as [`guest_differential`].
//!
//! **Not run by default yet (a documented gap):** `SVC_DIFF_IPVS_CASES=N` runs N
//! generated manifests (seeds `SVC_DIFF_SEED` upwards, default 1); [`DEFAULT_CASES`] is 0
//! because the rules below do not yet cover every way IPVS mode differs, so enabled runs
//! fail. Seen on seeds 1–4 (seed 1 agrees):
//! - externalTrafficPolicy=Local, external destinations from pods and the node: iptables
//!   mode short-circuits them to the cluster endpoints (topology hints applied), IPVS mode
//!   has no short-circuit: the virtual server's local real servers answer (seeds 2, 4);
//! - Local policies without a usable local endpoint (ITP=Local UDP cluster IP; ETP=Local
//!   with only terminating local endpoints): iptables mode drops, the IPVS target's
//!   virtual server has the cluster's endpoints (seeds 2, 3) — whether that is kube-proxy's
//!   IPVS fallback or a target bug is open;
//! - seed 3: a pod reaching itself through a cluster IP (port 9090) sometimes times out.
//!
//! Each needs an explicit rule (or a fix) before this runs in CI. Budget then: TCG runs
//! about 20× slower than the host, an apply plus a manifest's flows take 10–60 s there,
//! so about 8 manifests keep the VM suite within a few minutes (the iptables/nftables
//! differential covers 150 on the host).
//!
//! Each manifest is applied with `svc-compile apply --target ipvs` to one lab node (the
//! previous manifest's state is there: every load is an incremental or full apply of a
//! different cluster), conntrack is flushed, and the flows of [`super::derive_flows`] run.
//!
//! The IPVS expectation is iptables mode's ([`Flow::expect`]`[0]`), except where IPVS
//! works differently; each exception is one rule of [`ipvs_expect`], decided from the
//! compiled IPVS parts (never by leaving the flow out), and named in a failure:
//!
//! - **no-server-local**: no virtual server for the destination, which is a local address
//!   (the node's, its pod gateway, 127.0.0.1, a VIP on kube-ipvs0): nothing listens,
//!   refused. (IPVS mode's node ports are on the Node object's addresses only, not on
//!   127.0.0.1 or the pod gateway; a cluster IP's other ports are rejected by
//!   KUBE-IPVS-FILTER.)
//! - **no-server-routed**: no virtual server, not local: routed on, no answer.
//! - **no-real-servers**: a virtual server without real servers (no endpoints, or ETP=Local
//!   without local ones, where iptables mode DROPs): IPVS answers ICMP port unreachable
//!   (`ip_vs_leave`): refused.
//! - **source-ranges**: a load-balancer IP in KUBE-LOAD-BALANCER-FW from a source that
//!   neither KUBE-LOAD-BALANCER-SOURCE-CIDR nor -SOURCE-IP admits: KUBE-SOURCE-RANGES-
//!   FIREWALL drops it in filter INPUT, before IPVS (LOCAL_IN, later priority): timeout.
//! - **as-iptables**: a virtual server with real servers: iptables mode's expectation.

use super::{derive_flows, generate, ok_vs, parse_view, run_flows, source_ip, Cidr4};
use super::{Expect, Flow, Intended, Manifest, Seen, NODE};
use crate::kernel::{Lab, LabSpec, Proto};
use crate::support::{root, svc, TempDir};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Generated manifests in the VM when `SVC_DIFF_IPVS_CASES` is unset (see the module docs).
pub const DEFAULT_CASES: u64 = 0;

/// The result lines the guest writes (`diff-ipvs:seed N`), for the host to expect.
pub fn steps() -> Vec<String> {
    let (first, n) = seeds();
    (first..first + n)
        .map(|s| format!("diff-ipvs:seed {s}"))
        .collect()
}

/// `export` lines that hand the host's knobs to the guest.
pub fn guest_env() -> String {
    let (first, n) = seeds();
    format!("export SVC_DIFF_SEED={first} SVC_DIFF_IPVS_CASES={n}\n")
}

fn seeds() -> (u64, u64) {
    (
        super::env_u64("SVC_DIFF_SEED", 1),
        super::env_u64("SVC_DIFF_IPVS_CASES", DEFAULT_CASES),
    )
}

/// What the compiled IPVS parts say about destinations.
#[derive(Default)]
struct Compiled {
    /// `-t IP:PORT` → its real servers.
    servers: BTreeMap<String, Vec<String>>,
    /// kube-ipvs0's addresses.
    bound: BTreeSet<IpAddr>,
    /// Entries of each set.
    sets: BTreeMap<String, BTreeSet<String>>,
}

fn read_bundle(bundle: &str) -> Compiled {
    let mut c = Compiled::default();
    for l in bundle.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["-A", flag, svc, ..] => {
                c.servers.entry(format!("{flag} {svc}")).or_default();
            }
            ["-a", flag, svc, "-r", real, ..] => c
                .servers
                .entry(format!("{flag} {svc}"))
                .or_default()
                .push(real.to_string()),
            ["address", "add", a, ..] => {
                if let Ok(ip) = a.split('/').next().unwrap_or("").parse() {
                    c.bound.insert(ip);
                }
            }
            ["add", set, entry] => {
                c.sets
                    .entry(set.to_string())
                    .or_default()
                    .insert(entry.to_string());
            }
            _ => {}
        }
    }
    c
}

/// The IPVS expectation of a flow and the rule that gave it (see the module docs).
fn ipvs_expect(f: &Flow, c: &Compiled) -> (Expect, &'static str) {
    let (flag, proto) = match f.proto {
        Proto::Tcp => ("-t", "tcp"),
        Proto::Udp => ("-u", "udp"),
    };
    let dst = format!("{},{proto}:{}", f.dst.ip(), f.dst.port());
    let src = source_ip(f);
    let set = |name: &str| c.sets.get(name).into_iter().flatten();
    let firewalled = set("KUBE-LOAD-BALANCER-FW").any(|e| *e == dst)
        && !set("KUBE-LOAD-BALANCER-SOURCE-CIDR").any(|e| {
            e.strip_prefix(&format!("{dst},"))
                .and_then(Cidr4::parse)
                .is_some_and(|cidr| cidr.contains(src))
        })
        && !set("KUBE-LOAD-BALANCER-SOURCE-IP").any(|e| *e == format!("{dst},{src}"));
    let local = |ip: IpAddr| {
        ip.is_loopback()
            || c.bound.contains(&ip)
            || ip == IpAddr::V4(super::super::addr::NODE_LAN)
            || ip == IpAddr::V4(super::super::addr::NODE_POD_GW)
    };
    match c.servers.get(&format!("{flag} {}", f.dst)) {
        _ if firewalled => (Expect::Timeout, "source-ranges"),
        None if local(f.dst.ip()) => (Expect::Refused, "no-server-local"),
        None => (Expect::NoAnswer, "no-server-routed"),
        Some(reals) if reals.is_empty() => (Expect::Refused, "no-real-servers"),
        Some(_) => (f.expect[0].clone(), "as-iptables"),
    }
}

fn lab() -> Lab {
    super::served_lab("dipvs")
}

/// One manifest: apply it, run its flows; the failures.
fn check(lab: &Lab, state: &Path, inputs: &Path, seed: u64) -> Vec<String> {
    let text = generate(seed);
    let m = Manifest {
        label: format!("seed {seed}"),
        case: None,
        text: Some(text.clone()),
    };
    let spec = LabSpec::default();
    let Some(view) = parse_view(&m.compile("ir"), &spec) else {
        return vec![format!("seed {seed}: no IPv4 node view")];
    };
    let bundle = m.compile("ipvs");
    let compiled = read_bundle(&bundle);
    let file = inputs.join(format!("seed-{seed}.yaml"));
    std::fs::write(&file, &text).unwrap();
    let r = svc(
        &[
            "apply",
            file.to_str().unwrap(),
            "--node",
            NODE,
            "--target",
            "ipvs",
            "--netns",
            lab.netns("node"),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        None,
        &root(),
    );
    if r.code != 0 {
        return vec![format!("`{}` exited {}: {}", r.cmdline, r.code, r.stderr)];
    }
    lab.flush_conntrack().expect("conntrack -F");

    let mut flows = derive_flows(&view);
    let mut rules = Vec::new();
    for f in &mut flows {
        let (e, rule) = ipvs_expect(f, &compiled);
        f.expect = [e.clone(), e];
        f.intended = None::<Intended>;
        rules.push(rule);
    }
    let all: Vec<usize> = (0..flows.len()).collect();
    let mut seen: Vec<Seen> = run_flows(lab, 0, &flows, &all, false);
    let bad: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| !ok_vs(&flows[i].expect[0], &flows[i].from, &seen[i]))
        .collect();
    if !bad.is_empty() {
        let again = run_flows(lab, 0, &flows, &bad, true);
        for &i in &bad {
            seen[i] = again[i].clone();
        }
    }
    let mut failures: Vec<String> = bad
        .iter()
        .filter(|&&i| !ok_vs(&flows[i].expect[0], &flows[i].from, &seen[i]))
        .map(|&i| {
            format!(
                "seed {seed}: {}: IPVS {} (rule {}: {:?})",
                flows[i].line(),
                seen[i].describe(),
                rules[i],
                flows[i].expect[0]
            )
        })
        .collect();
    if !failures.is_empty() {
        failures.push(format!("manifest: {text}"));
    }
    failures
}

/// Runs inside the VM: one result line per manifest, appended to `results`.
fn run_guest(results: &Path) {
    let lab = lab();
    let state = TempDir::new("diff-ipvs-state");
    let inputs = TempDir::new("diff-ipvs-in");
    let (first, n) = seeds();
    for seed in first..first + n {
        let start = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&lab, state.path(), inputs.path(), seed)
        }));
        let failures = outcome.unwrap_or_else(|p| {
            vec![p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into())]
        });
        let verdict = if failures.is_empty() { "ok" } else { "fail" };
        let ms = start.elapsed().as_millis();
        println!("ipvs guest: diff-ipvs:seed {seed}: {verdict} in {ms} ms");
        let msg: Vec<String> = failures
            .iter()
            .map(|f| f.replace('\n', " / ").replace('\t', " "))
            .collect();
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(results)
            .unwrap();
        let _ = writeln!(
            f,
            "diff-ipvs:seed {seed}\t{verdict}\t{ms}\t{}",
            msg.join(" | ")
        );
    }
}

/// The guest side, started by `kernel::ipvs::golden_flows_ipvs` in the same boot.
#[test]
#[ignore = "runs inside the IPVS VM, started by golden_flows_ipvs"]
fn guest_differential() {
    let env = crate::kernel::ipvs::GUEST_DIR_ENV;
    let dir = PathBuf::from(
        std::env::var_os(env)
            .unwrap_or_else(|| panic!("{env} unset: this runs inside the IPVS VM")),
    );
    run_guest(&dir.join("results"));
}

#[test]
fn the_rules_read_the_compiled_parts() {
    let c = read_bundle(
        "-A -t 10.96.0.1:80 -s rr\n-a -t 10.96.0.1:80 -r 10.244.1.2:8080 -m -w 1\n\
         -A -t 192.0.2.10:30001 -s rr\naddress add 10.96.0.1/32 dev kube-ipvs0\n\
         add KUBE-LOAD-BALANCER-FW 203.0.113.5,tcp:80\n\
         add KUBE-LOAD-BALANCER-SOURCE-CIDR 203.0.113.5,tcp:80,192.0.2.100/32\n",
    );
    let flow = |from: &str, dst: &str| Flow {
        group: String::new(),
        kind: String::new(),
        what: String::new(),
        from: from.into(),
        proto: Proto::Tcp,
        dst: dst.parse().unwrap(),
        expect: [Expect::Unknown, Expect::Unknown],
        intended: None,
        traced: Default::default(),
    };
    let rule = |from: &str, dst: &str| ipvs_expect(&flow(from, dst), &c).1;
    assert_eq!(rule("pod-a", "10.96.0.1:80"), "as-iptables");
    assert_eq!(rule("pod-a", "10.96.0.1:1"), "no-server-local");
    assert_eq!(rule("client1", "192.0.2.10:30001"), "no-real-servers");
    assert_eq!(rule("pod-a", "10.244.1.1:30001"), "no-server-local");
    assert_eq!(rule("pod-a", "198.51.100.77:80"), "no-server-routed");
    assert_eq!(rule("client2", "203.0.113.5:80"), "source-ranges");
    assert_eq!(rule("client1", "203.0.113.5:80"), "no-server-routed");
}
