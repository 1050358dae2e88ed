//! Loads the rulesets into a real kernel, inside a throwaway network namespace: the final
//! word on whether nft accepts them. Needs root, `ip` and `nft`; otherwise each test prints
//! `skipped: …` and passes (fails under `SVC_KERNEL=require`).

use super::fixtures::{self, *};
use crate::nftables::{write_json, write_string, Options};
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// A network namespace deleted on drop, also when the test panics.
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Result<Netns, String> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "svcc-nft-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .map_err(|e| format!("cannot run `ip`: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`ip netns add` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Netns { name })
    }

    /// `nft ARGS` inside the namespace, with `stdin` as input.
    fn nft(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ip netns exec nft");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    #[track_caller]
    fn nft_ok(&self, args: &[&str], stdin: &str, what: &str) -> String {
        let out = self.nft(args, stdin);
        assert!(
            out.status.success(),
            "{what}: `nft {}` failed in netns {}:\n{}\n--- input ---\n{stdin}",
            args.join(" "),
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// A fresh namespace, or `None` after printing why the test is skipped.
fn netns_for(test: &str) -> Option<Netns> {
    let skip = |why: &str| {
        crate::testing::skip(test, why);
        None
    };
    if !is_root() {
        return skip("needs root");
    }
    if Command::new("nft").arg("--version").output().is_err() {
        return skip("needs nft");
    }
    match Netns::new() {
        Ok(ns) => Some(ns),
        Err(e) => skip(&e),
    }
}

#[test]
fn kernel_check_every_case() {
    let Some(ns) = netns_for("kernel_check_every_case") else {
        return;
    };
    for (name, view) in fixtures::all_cases() {
        let o = Options::default();
        ns.nft_ok(&["-c", "-f", "-"], &write_string(&view, &o), name);
        ns.nft_ok(&["-c", "-j", "-f", "-"], &write_json(&view, &o), name);
        // A check leaves nothing behind.
        let listed = ns.nft_ok(&["list", "ruleset"], "", name);
        assert!(listed.trim().is_empty(), "{name}: {listed}");
    }
}

#[test]
fn kernel_load_twice_replaces_table() {
    let Some(ns) = netns_for("kernel_load_twice_replaces_table") else {
        return;
    };
    let o = Options::default();
    let first = view_v4(vec![svc1(), svc3(), svc5()]);
    let second = view_v4(vec![svc1(), svc5()]); // ns3/svc3 goes away

    ns.nft_ok(&["-f", "-"], &write_string(&first, &o), "first load");
    let listed = ns.nft_ok(&["list", "table", "ip", "kube-proxy"], "", "list");
    assert!(listed.contains("chain service-4AT6LBPK-ns3/svc3/tcp/p80 {"));
    assert!(listed.contains("tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80"));

    // The same file again: still loads (add+delete makes it idempotent).
    ns.nft_ok(&["-f", "-"], &write_string(&first, &o), "reload");

    ns.nft_ok(&["-f", "-"], &write_string(&second, &o), "second load");
    let listed = ns.nft_ok(&["list", "table", "ip", "kube-proxy"], "", "list");
    assert!(
        !listed.contains("svc3"),
        "stale objects survived:\n{listed}"
    );
    assert!(listed.contains("chain service-ULMVA6XW-ns1/svc1/tcp/p80 {"));
    assert!(listed.contains("comment \"rules for kube-proxy\""));

    // The result equals a load of the second ruleset into an empty table.
    let fresh = netns_for("kernel_load_twice_replaces_table").unwrap();
    fresh.nft_ok(&["-f", "-"], &write_string(&second, &o), "fresh load");
    let fresh_listed = fresh.nft_ok(&["list", "table", "ip", "kube-proxy"], "", "list");
    assert_eq!(listed, fresh_listed);

    // IPv6 lives in its own table next to the IPv4 one.
    let v6 = super::case("ipv6");
    ns.nft_ok(&["-f", "-"], &write_string(&v6, &o), "ipv6 load");
    ns.nft_ok(&["-f", "-"], &write_string(&v6, &o), "ipv6 reload");
    let tables = ns.nft_ok(&["list", "tables"], "", "list tables");
    assert_eq!(tables, "table ip kube-proxy\ntable ip6 kube-proxy\n");
}

/// Text and JSON load to the same table (up to the table/chain/set comments, which nft
/// 1.0.6's JSON parser drops).
#[test]
fn kernel_json_loads_same_as_text() {
    let Some(text_ns) = netns_for("kernel_json_loads_same_as_text") else {
        return;
    };
    let json_ns = netns_for("kernel_json_loads_same_as_text").unwrap();
    let o = Options::default();
    for (name, view) in fixtures::all_cases() {
        let fam = crate::nftables::model::ip_kw(view.family);
        text_ns.nft_ok(&["-f", "-"], &write_string(&view, &o), name);
        json_ns.nft_ok(&["-j", "-f", "-"], &write_json(&view, &o), name);
        // Loading the JSON twice also replaces.
        json_ns.nft_ok(&["-j", "-f", "-"], &write_json(&view, &o), name);
        let list = |ns: &Netns| {
            ns.nft_ok(&["list", "table", fam, "kube-proxy"], "", name)
                .lines()
                .filter(|l| !l.trim_start().starts_with("comment \""))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(list(&text_ns), list(&json_ns), "{name}");
    }
}
