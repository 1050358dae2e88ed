//! Seeded property test (issue 18, the checker half of the `cluster` fuzz target): random
//! clusters from the structure-aware generator (`manifests.rs`) compile without errors,
//! and every target's output for every node and family passes the target's own checker:
//! `iptables-restore --test` / `ip6tables-restore --test` (iptables, and ipvs' iptables
//! part), `nft -c -f` (nftables, and `nft -j -c -f` for nftables-json), `ipset restore`
//! (ipvs' ipset part) in a throwaway network namespace, and a decoder of the eBPF JSON
//! (every map's keys and values have its sizes, no map holds more than it may).
//!
//! The kernel checkers need root (`unshare -n`): without it they are skipped like the
//! kernel tests (a failure under `SVC_KERNEL=require`); the eBPF decoder and the
//! compilation always run. `SVC_CHECKER_CASES` sets the number of clusters (default
//! [`DEFAULT_CASES`]), seeds 1 upwards.

use crate::kernel::require_root;
use crate::manifests::{cluster, Draw};
use crate::support::Rng;
use std::io::Write;
use std::process::{Command, Stdio};
use svc_compiler::net::IpFamily;
use svc_compiler::passes::node::{node_view, NodeSelection};
use svc_compiler::source::SourceMap;
use svc_targets::{Params, Render, Sharing, TARGETS};

/// Clusters per run when `SVC_CHECKER_CASES` is unset (each is checked by about ten
/// processes per node and family).
const DEFAULT_CASES: u64 = 12;

/// One rendered output: target, node, family, part (empty: the whole document).
struct Output {
    target: &'static str,
    what: String,
    family: IpFamily,
    part: &'static str,
    text: String,
}

fn outputs(text: &str) -> (Vec<Output>, String) {
    let mut sources = SourceMap::default();
    let f = sources.add("cluster.yaml", text);
    let opts = svc_compiler::Options {
        allocate: true,
        ..Default::default()
    };
    let comp = svc_compiler::compile(&sources, &[f], &opts);
    let errors = match comp.diags.has_errors() {
        true => svc_compiler::diag::render_all(&comp.diags, &sources),
        false => String::new(),
    };
    let mut views = Vec::new();
    for n in &comp.module.nodes {
        for fam in [IpFamily::IPv4, IpFamily::IPv6] {
            let sel = NodeSelection {
                name: n.name.clone(),
                ips: vec![],
            };
            if let Ok(v) = node_view(&comp.module, &sel, fam) {
                views.push((format!("{} {fam:?}", n.name), fam, v));
            }
        }
    }
    let mut out = Vec::new();
    for t in TARGETS {
        let Render::Node(new) = t.render else {
            continue;
        };
        let r = new(&Params::default(), Sharing::One);
        for (what, fam, v) in &views {
            if r.check(v).is_err() {
                continue;
            }
            let mut text = String::new();
            r.render_into(v, &mut text);
            out.push(Output {
                target: t.name,
                what: what.clone(),
                family: *fam,
                part: "",
                text,
            });
            for part in r.parts() {
                let mut text = String::new();
                r.render_part_into(v, part, &mut text);
                out.push(Output {
                    target: t.name,
                    what: what.clone(),
                    family: *fam,
                    part,
                    text,
                });
            }
        }
    }
    (out, errors)
}

/// The command that checks `o`, if any: program and arguments, run in a new network
/// namespace.
fn checker(o: &Output) -> Option<Vec<&'static str>> {
    let v6 = o.family == IpFamily::IPv6;
    let ipt = if v6 {
        "ip6tables-restore"
    } else {
        "iptables-restore"
    };
    Some(match (o.target, o.part) {
        ("iptables", "") | ("ipvs", "iptables") => vec![ipt, "--test"],
        ("nftables", "") => vec!["nft", "-c", "-f", "-"],
        ("nftables-json", "") => vec!["nft", "-j", "-c", "-f", "-"],
        ("ipvs", "ipset") => vec!["ipset", "restore"],
        _ => return None,
    })
}

/// Run `argv` in a new network namespace with `input` on stdin; `sets` (an `ipset
/// restore` input) is loaded there first, for rules that name sets.
fn run_checker(argv: &[&str], input: &str, sets: Option<&str>) -> Result<(), String> {
    let mut cmd = Command::new("unshare");
    cmd.arg("-n");
    let dir;
    if let Some(sets) = sets {
        dir = crate::support::TempDir::new("checkers");
        let f = dir.path().join("sets");
        std::fs::write(&f, sets).unwrap();
        cmd.args(["sh", "-c", "ipset restore -f \"$0\" && exec \"$@\""])
            .arg(&f);
    }
    let mut child = cmd
        .args(argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_owned();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    writer.join().unwrap();
    match out.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// The eBPF target's JSON: every entry's key and value are hex of the map's sizes, and no
/// map holds more entries than it may.
fn decode_ebpf(text: &str) -> Result<usize, String> {
    let json: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let maps = json["maps"].as_array().ok_or("no maps")?;
    let mut n = 0;
    for m in maps {
        let size = |k: &str| m[k].as_u64().ok_or(format!("{}: no {k}", m["name"]));
        let (key, value, max) = (size("keySize")?, size("valueSize")?, size("maxEntries")?);
        let entries = m["entries"].as_array().ok_or("no entries")?;
        if entries.len() as u64 > max {
            return Err(format!("{}: {} entries > {max}", m["name"], entries.len()));
        }
        for e in entries {
            for (field, want) in [("key", key), ("value", value)] {
                let hex = e[field].as_str().ok_or(format!("entry without {field}"))?;
                let bytes: Vec<&str> = hex.split(' ').collect();
                let ok = bytes.len() as u64 == want
                    && bytes
                        .iter()
                        .all(|b| b.len() == 2 && u8::from_str_radix(b, 16).is_ok());
                if !ok {
                    return Err(format!(
                        "{}: {field} {hex:?} is not {want} bytes",
                        m["name"]
                    ));
                }
            }
            if !e["decoded"].is_object() {
                return Err(format!("{}: an entry without its decoded form", m["name"]));
            }
            n += 1;
        }
    }
    Ok(n)
}

/// The generator's bytes for `seed`.
fn bytes(seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..4096).map(|_| r.next() as u8).collect()
}

#[test]
fn generated_clusters_pass_every_targets_checker() {
    let cases: u64 = std::env::var("SVC_CHECKER_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let kernel = require_root("checkers: iptables-restore --test, nft -c, ipset restore");
    let mut failures = Vec::new();
    let (mut checked, mut entries, mut services) = (0, 0, 0);
    for seed in 1..=cases {
        let text = cluster(&mut Draw::new(&bytes(seed)));
        services += text.matches("\nkind: Service\n").count();
        let (outs, errors) = outputs(&text);
        if !errors.is_empty() {
            failures.push(format!("seed {seed}: does not compile:\n{errors}\n{text}"));
            continue;
        }
        for o in &outs {
            let what = format!("seed {seed}, {} {} {}", o.target, o.what, o.part);
            if o.target == "ebpf" && o.part.is_empty() {
                match decode_ebpf(&o.text) {
                    Ok(n) => entries += n,
                    Err(e) => failures.push(format!("{what}: {e}\n{}", o.text)),
                }
            }
            let Some(argv) = checker(o).filter(|_| kernel) else {
                continue;
            };
            checked += 1;
            // ipvs' iptables part names the sets of its ipset part.
            let sets = outs
                .iter()
                .find(|s| {
                    o.target == "ipvs"
                        && o.part == "iptables"
                        && s.target == "ipvs"
                        && s.part == "ipset"
                        && s.what == o.what
                })
                .map(|s| s.text.as_str());
            if let Err(e) = run_checker(&argv, &o.text, sets) {
                failures.push(format!(
                    "{what}: `{}` says:\n{e}\n{}\n--- manifest\n{text}",
                    argv.join(" "),
                    o.text
                ));
            }
        }
    }
    eprintln!(
        "checkers: {cases} clusters ({services} services), {checked} outputs checked by their \
         tools, {entries} eBPF entries decoded"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(!kernel || checked > 0, "nothing was checked");
}
