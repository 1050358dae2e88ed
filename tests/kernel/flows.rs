//! The golden cases in the real kernel: compile each case for the lab's node, load the
//! ruleset into the lab's `node` namespace, send the traffic its `flows` file lists and
//! check who answered and whether the source was masqueraded.
//!
//! `flows` syntax, one flow a line (`#` comments):
//! `[TARGETS] FROM PROTO DEST EXPECT`, where TARGETS (optional: `[iptables]`,
//! `[nftables]`, `[ipvs]`, `[ebpf]` (the socket load balancer, `ebpf.rs`) or a comma
//! list such as `[iptables,ipvs]`) limits the line to those targets, and EXPECT is one of
//! - `answer B1,B2,.. [direct|masq]`: 40 probes; every answer comes from the set, every
//!   backend of the set answers at least once; `direct`: the backend saw the sender's own
//!   address, `masq`: it saw another (the node's);
//! - `sticky B1,B2,..`: 20 probes, all answered by one backend of the set;
//! - `refused`: rejected (TCP RST or ICMP unreachable);
//! - `timeout`: no answer (dropped).

use super::{require_root, Family, Lab, LabSpec, Outcome, Proto};
use crate::golden::{case_dirs, case_flows, compile_case, compile_case_with};
use std::collections::BTreeSet;
use std::net::SocketAddr;

/// The port every pod serves (TCP and UDP) in the lab.
pub const BACKEND_PORT: u16 = 8080;

#[derive(Debug)]
pub struct Flow {
    pub line: usize,
    pub target: Option<String>,
    pub from: String,
    pub proto: Proto,
    pub dst: SocketAddr,
    pub expect: Expect,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    Answer {
        backends: BTreeSet<String>,
        masq: Option<bool>,
    },
    Sticky(BTreeSet<String>),
    Refused,
    Timeout,
}

pub fn parse_flows(text: &str) -> Vec<Flow> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let l = raw.split('#').next().unwrap().trim();
        if l.is_empty() {
            continue;
        }
        let mut w: Vec<&str> = l.split_whitespace().collect();
        let target = if w[0].starts_with('[') {
            Some(w.remove(0).trim_matches(['[', ']']).to_string())
        } else {
            None
        };
        let bad = || -> ! { panic!("flows line {}: cannot read `{raw}`", i + 1) };
        if w.len() < 4 {
            bad();
        }
        let proto = match w[1] {
            "tcp" => Proto::Tcp,
            "udp" => Proto::Udp,
            _ => bad(),
        };
        let set = |s: &str| s.split(',').map(String::from).collect::<BTreeSet<_>>();
        let expect = match w[3] {
            "answer" => Expect::Answer {
                backends: set(w.get(4).unwrap_or_else(|| bad())),
                masq: match w.get(5) {
                    None => None,
                    Some(&"masq") => Some(true),
                    Some(&"direct") => Some(false),
                    _ => bad(),
                },
            },
            "sticky" => Expect::Sticky(set(w.get(4).unwrap_or_else(|| bad()))),
            "refused" => Expect::Refused,
            "timeout" => Expect::Timeout,
            _ => bad(),
        };
        out.push(Flow {
            line: i + 1,
            target,
            from: w[0].to_string(),
            proto,
            dst: w[2].parse().unwrap_or_else(|_| bad()),
            expect,
        });
    }
    out
}

/// Load a compiled ruleset into the lab's node, checking it first.
pub fn load(lab: &Lab, target: &str, text: &str) {
    // The documents name their family in the first line.
    let v6 = text.lines().next().is_some_and(|l| l.contains("IPv6"));
    let (prog, test_args, args): (&str, &[&str], &[&str]) = match target {
        "iptables" if v6 => (
            "ip6tables-restore",
            &["--test", "--noflush"],
            &["--noflush"],
        ),
        "iptables" => ("iptables-restore", &["--test", "--noflush"], &["--noflush"]),
        "nftables" => ("nft", &["-c", "-f", "-"], &["-f", "-"]),
        _ => unreachable!(),
    };
    for a in [test_args, args] {
        let out = lab.exec("node", prog, a, Some(text)).expect("run loader");
        assert!(
            out.status.success(),
            "{prog} {a:?} failed: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Replace whatever ruleset an earlier [`load`] left in the lab's node. nftables text
/// deletes and recreates its own table; iptables restore data is loaded with
/// `--noflush` and inserts its jumps with `-I`, so the tables it uses (mangle, filter,
/// nat) are emptied first: every chain flushed, every user chain deleted.
pub fn reload(lab: &Lab, target: &str, text: &str) {
    if target == "iptables" {
        // Both families: the previous document may have been the other one's.
        let empty = "*mangle\nCOMMIT\n*filter\nCOMMIT\n*nat\nCOMMIT\n";
        for prog in ["iptables-restore", "ip6tables-restore"] {
            let out = lab
                .exec("node", prog, &[], Some(empty))
                .unwrap_or_else(|e| panic!("run {prog}: {e}"));
            assert!(
                out.status.success(),
                "emptying the {prog} tables failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    load(lab, target, text);
}

/// Run every flow of a case; returns the failures (empty = all good).
pub fn check_flows(lab: &Lab, target: &str, flows: &[Flow]) -> Vec<String> {
    let mut failures = Vec::new();
    for f in flows.iter().filter(|f| {
        f.target
            .as_deref()
            .is_none_or(|t| t.split(',').any(|t| t == target))
    }) {
        let fam = if f.dst.is_ipv6() {
            Family::V6
        } else {
            Family::V4
        };
        let own = lab.ip(&f.from, fam);
        let what = format!("line {}: {} {:?} {}", f.line, f.from, f.proto, f.dst);
        match &f.expect {
            Expect::Answer { backends, masq } => {
                let mut seen = BTreeSet::new();
                for _ in 0..40 {
                    match lab.probe(&f.from, f.proto, f.dst) {
                        Outcome::Answered {
                            backend,
                            seen_source,
                        } => {
                            if !backends.contains(&backend) {
                                failures.push(format!(
                                    "{what}: answered by {backend}, wanted one of {backends:?}"
                                ));
                                break;
                            }
                            if let Some(m) = masq {
                                if (seen_source != own) != *m {
                                    failures.push(format!(
                                        "{what}: {backend} saw source {seen_source} (sender {own}), wanted {}",
                                        if *m { "masquerade" } else { "the sender's address" }
                                    ));
                                    break;
                                }
                            }
                            seen.insert(backend);
                        }
                        other => {
                            failures.push(format!(
                                "{what}: {other:?}, wanted an answer from {backends:?}"
                            ));
                            break;
                        }
                    }
                }
                if failures.is_empty() && &seen != backends {
                    failures.push(format!(
                        "{what}: 40 probes reached {seen:?}, wanted all of {backends:?}"
                    ));
                }
            }
            Expect::Sticky(backends) => {
                let mut seen = BTreeSet::new();
                for _ in 0..20 {
                    match lab.probe(&f.from, f.proto, f.dst).backend() {
                        Some(b) => {
                            seen.insert(b.to_string());
                        }
                        None => {
                            failures.push(format!("{what}: no answer"));
                            break;
                        }
                    }
                }
                if seen.len() != 1 || !seen.is_subset(backends) {
                    failures.push(format!(
                        "{what}: answered by {seen:?}, wanted exactly one of {backends:?}"
                    ));
                }
            }
            Expect::Refused => {
                let o = lab.probe(&f.from, f.proto, f.dst);
                if o != Outcome::Refused {
                    failures.push(format!("{what}: {o:?}, wanted Refused"));
                }
            }
            Expect::Timeout => {
                let o = lab.probe(&f.from, f.proto, f.dst);
                if o != Outcome::TimedOut {
                    failures.push(format!("{what}: {o:?}, wanted TimedOut"));
                }
            }
        }
    }
    failures
}

/// Every golden case with a `flows` file, for one target, each in a fresh lab.
fn run_target(target: &str) {
    run_target_with(target, &[]);
}

/// [`run_target`] with more flags for the compiler (e.g. `--nft-layout fast`).
pub fn run_target_with(target: &str, extra: &[&str]) {
    let test = format!("kernel golden flows ({target} {extra:?})");
    if !require_root(&test) {
        return;
    }
    let mut failures = Vec::new();
    for (case, text) in case_flows() {
        let flows = parse_flows(&text);
        let rules = compile_case_with(&case, target, extra);
        let mut lab = Lab::new(
            &format!("{}{}{}", &target[..2], extra.len(), case.len()),
            &LabSpec::default(),
        )
        .expect("lab");
        lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve tcp");
        lab.serve(Proto::Udp, BACKEND_PORT).expect("serve udp");
        load(&lab, target, &rules);
        for f in check_flows(&lab, target, &flows) {
            failures.push(format!("{case} [{target} {extra:?}] {f}"));
        }
    }
    assert!(
        failures.is_empty(),
        "kernel disagrees with the IR:\n{}",
        failures.join("\n")
    );
}

#[test]
fn golden_flows_iptables() {
    run_target("iptables");
}

#[test]
fn golden_flows_nftables() {
    run_target("nftables");
}

/// Session affinity spreads different clients: twelve clients each stick to one backend
/// over five connections, and not all of them to the same one (chance of a false failure
/// with four backends: 4 · (1/4)^12 ≈ 2·10⁻⁷).
fn affinity_spreads(target: &str) {
    affinity_spreads_with(target, &[]);
}

/// [`affinity_spreads`] with more flags for the compiler.
pub fn affinity_spreads_with(target: &str, extra: &[&str]) {
    if !require_root(&format!("kernel affinity spread ({target} {extra:?})")) {
        return;
    }
    let spec = LabSpec {
        clients: (0..12)
            .map(|i| {
                super::HostSpec::new(
                    &format!("c{i}"),
                    std::net::Ipv4Addr::new(192, 0, 2, 100 + i),
                )
            })
            .collect(),
        ..LabSpec::default()
    };
    let mut lab = Lab::new(&format!("aff{}{}", &target[..2], extra.len()), &spec).expect("lab");
    lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve");
    load(&lab, target, &compile_case_with("affinity", target, extra));
    let dst: SocketAddr = "192.0.2.10:30089".parse().unwrap();
    let mut chosen = BTreeSet::new();
    for i in 0..12 {
        let from = format!("c{i}");
        let seen: BTreeSet<String> = (0..5)
            .map(|_| {
                lab.probe(&from, Proto::Tcp, dst)
                    .backend()
                    .unwrap_or_else(|| panic!("{from}: no answer"))
                    .to_string()
            })
            .collect();
        assert_eq!(seen.len(), 1, "{from} was not sticky: {seen:?}");
        chosen.extend(seen);
    }
    assert!(chosen.len() > 1, "twelve clients all landed on {chosen:?}");
}

#[test]
fn affinity_spreads_iptables() {
    affinity_spreads("iptables");
}

#[test]
fn affinity_spreads_nftables() {
    affinity_spreads("nftables");
}

/// Every golden case's `nftables-json` output is accepted by `nft -c -j -f`. (The text
/// targets are checked with `iptables-restore --test` / `nft -c` and loaded by the flows.)
#[test]
fn golden_outputs_pass_the_loaders_checks() {
    if !require_root("kernel golden loaders' checks") {
        return;
    }
    json_passes_nft_check("chk", &[]);
}

/// Every golden case's `nftables-json` output with `extra` flags is accepted by
/// `nft -c -j -f` in a lab tagged `tag`.
pub fn json_passes_nft_check(tag: &str, extra: &[&str]) {
    let lab = Lab::new(tag, &LabSpec::default()).expect("lab");
    let mut failures = Vec::new();
    for case in case_dirs() {
        let json = compile_case_with(&case, "nftables-json", extra);
        let out = lab
            .exec("node", "nft", &["-c", "-j", "-f", "-"], Some(&json))
            .expect("nft");
        if !out.status.success() {
            failures.push(format!(
                "{case}: nft -c -j: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `reload` leaves nothing of the previous ruleset: a node port of the first case is
/// gone after loading the second, and iptables' jumps into its chains are not doubled.
#[test]
fn reload_replaces_the_ruleset() {
    if !require_root("kernel reload") {
        return;
    }
    for target in ["iptables", "nftables"] {
        let mut lab = Lab::new(&format!("rl{}", &target[..2]), &LabSpec::default()).expect("lab");
        lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve tcp");
        let node_port: SocketAddr = "192.0.2.10:30080".parse().unwrap();
        reload(&lab, target, &compile_case("nodeport", target));
        let first = lab.probe("client1", Proto::Tcp, node_port);
        assert!(first.backend().is_some(), "{target}: {first:?}");
        reload(&lab, target, &compile_case("clusterip", target));
        reload(&lab, target, &compile_case("clusterip", target));
        lab.reset_conntrack().expect("conntrack reset");
        let gone = lab.probe("client1", Proto::Tcp, node_port);
        assert_eq!(
            gone,
            Outcome::Refused,
            "{target}: the old node port survived"
        );
        let still = lab.probe("pod-b", Proto::Tcp, "10.96.0.10:80".parse().unwrap());
        assert!(still.backend().is_some(), "{target}: {still:?}");
        if target == "iptables" {
            let nat = lab
                .exec_ok("node", "iptables-save", &["-t", "nat"], None)
                .expect("iptables-save");
            let jumps = nat
                .lines()
                .filter(|l| l.starts_with("-A PREROUTING") && l.ends_with("-j KUBE-SERVICES"))
                .count();
            assert_eq!(jumps, 1, "{target}: PREROUTING jumps after reloads:\n{nat}");
        }
    }
}
