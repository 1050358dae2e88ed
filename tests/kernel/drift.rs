//! `svc-compile drift` in the real kernel, per target, on a bare lab's node: a loaded
//! compiled ruleset shows no drift; the same ruleset loaded in another order (kube-proxy
//! writes chains, sets and services in Go map order) shows none; one rule changed by hand
//! is reported, alone, under its service; a saved listing of that node says the same.

use super::{require_root, Lab, LabSpec};
use crate::support::{root, svc, Run, TempDir};

const TARGETS: [&str; 2] = ["iptables", "nftables"];
/// Two services with two ports each, endpoints local and remote.
const INPUT: [&str; 3] = [
    "golden/cases/multi-port",
    "golden/common/nodes.yaml",
    "golden/common/kube-proxy.yaml",
];

fn drift(target: &str, extra: &[&str]) -> Run {
    let mut args = vec!["drift"];
    args.extend(INPUT);
    args.extend(["--node", "node-1", "--target", target]);
    args.extend(extra);
    svc(&args, None, &root())
}

/// The compiled document with chains, sets, elements and the services of shared chains
/// in another order, as another kube-proxy sync may write it.
fn reordered(target: &str, doc: &str) -> String {
    let lines: Vec<&str> = doc.lines().filter(|l| !l.starts_with('#')).collect();
    let mut out: Vec<String> = Vec::new();
    if target == "iptables" {
        // Per table: declarations reversed; chains' rule blocks in reversed order of first
        // appearance; in each chain, rules of services in reversed service order, then
        // the rest in their order.
        for block in lines.split_inclusive(|l| *l == "COMMIT") {
            let (head, rest) = block.split_first().unwrap();
            out.push(head.to_string());
            let decls: Vec<&&str> = rest.iter().filter(|l| l.starts_with(':')).collect();
            out.extend(decls.iter().rev().map(|l| l.to_string()));
            let inserts = rest.iter().filter(|l| l.starts_with("-I "));
            out.extend(inserts.map(|l| l.to_string()));
            let mut chains: Vec<(&str, Vec<&str>)> = Vec::new();
            for l in rest.iter().filter(|l| l.starts_with("-A ")) {
                let chain = l.split(' ').nth(1).unwrap();
                match chains.iter_mut().find(|(c, _)| *c == chain) {
                    Some((_, v)) => v.push(l),
                    None => chains.push((chain, vec![l])),
                }
            }
            for (_, mut rules) in chains.into_iter().rev() {
                let svc = |l: &str| {
                    let c = l.split_once("--comment \"").map(|x| x.1).unwrap_or("");
                    c.split(' ')
                        .next()
                        .filter(|w| w.contains('/'))
                        .map(String::from)
                };
                // Stable: rules of one service keep their order.
                rules.sort_by_key(|l| std::cmp::Reverse(svc(l).map(|s| (1, s))));
                out.extend(rules.iter().map(|l| l.to_string()));
            }
            out.push("COMMIT".into());
        }
    } else {
        let kind = |p: &'static str| lines.iter().filter(move |l| l.starts_with(p));
        out.extend(
            lines
                .iter()
                .take_while(|l| l.starts_with("add table") || l.starts_with("delete table"))
                .map(|l| l.to_string()),
        );
        out.extend(kind("add chain ").rev().map(|l| l.to_string()));
        out.extend(
            kind("add set ")
                .chain(kind("add map "))
                .rev()
                .map(|l| l.to_string()),
        );
        out.extend(kind("add rule ").map(|l| l.to_string()));
        out.extend(kind("add element ").rev().map(|l| l.to_string()));
        let known = out.len();
        assert_eq!(
            known,
            lines.iter().filter(|l| !l.trim().is_empty()).count(),
            "every line of the nft document is kept"
        );
    }
    out.join("\n") + "\n"
}

#[test]
fn drift_finds_one_hand_made_change_and_nothing_else() {
    if !require_root("drift_finds_one_hand_made_change_and_nothing_else") {
        return;
    }
    for target in TARGETS {
        let lab = Lab::new(&format!("drift{}", &target[..3]), &LabSpec::bare()).expect("lab");
        let ns = lab.netns("node").to_string();
        let mut compile: Vec<&str> = INPUT.to_vec();
        compile.extend(["--node", "node-1", "--target", target]);
        let doc = svc(&compile, None, &root()).expect(0).stdout.clone();
        let (loader, args): (&str, &[&str]) = match target {
            "iptables" => ("iptables-restore", &["--noflush"]),
            _ => ("nft", &["-f", "-"]),
        };

        // Loaded in another order: no drift.
        let other = reordered(target, &doc);
        let plain: String = doc
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| format!("{l}\n"))
            .collect();
        assert_ne!(other, plain, "[{target}] the reordered document differs");
        lab.exec_ok("node", loader, args, Some(&other))
            .unwrap_or_else(|e| panic!("[{target}] load reordered: {e}"));
        let run = drift(target, &["--netns", &ns]);
        run.expect(0);
        assert!(
            run.stdout.contains(": no drift"),
            "[{target}] {}",
            run.stdout
        );

        // One rule changed by hand: the DNAT of one endpoint.
        match target {
            "iptables" => {
                let save = lab
                    .exec_ok("node", "iptables-save", &["-t", "nat"], None)
                    .unwrap();
                let rule = save
                    .lines()
                    .find(|l| l.starts_with("-A KUBE-SEP-") && l.contains("DNAT"))
                    .expect("a DNAT rule");
                let chain = rule.split(' ').nth(1).unwrap();
                let changed = format!(
                    "{} --to-destination 10.244.9.9:9999",
                    rule.rsplit_once(" --to-destination").unwrap().0
                );
                let mut words: Vec<String> = vec![
                    "-t".into(),
                    "nat".into(),
                    "-R".into(),
                    chain.into(),
                    "2".into(),
                ];
                let spec = changed
                    .split_once(&format!("-A {chain} "))
                    .unwrap()
                    .1
                    .to_string();
                // `-R` takes the words without the shell's quotes.
                words.extend(shell_words(&spec));
                let refs: Vec<&str> = words.iter().map(String::as_str).collect();
                let position = save
                    .lines()
                    .filter(|l| l.starts_with(&format!("-A {chain} ")))
                    .position(|l| l == rule)
                    .unwrap();
                assert_eq!(position, 1, "the DNAT rule is a KUBE-SEP chain's second");
                lab.exec_ok("node", "iptables", &refs, None).unwrap();
            }
            _ => {
                let listing = lab
                    .exec_ok(
                        "node",
                        "nft",
                        &["-a", "list", "table", "ip", "kube-proxy"],
                        None,
                    )
                    .unwrap();
                let mut chain = "";
                let mut found = None;
                for l in listing.lines().map(str::trim) {
                    if let Some(c) = l.strip_prefix("chain ") {
                        chain = c.split(" {").next().unwrap_or(c);
                    } else if chain.starts_with("endpoint-") && l.contains("dnat to") {
                        found = Some((
                            chain.to_string(),
                            l.rsplit_once("# handle ").unwrap().1.to_string(),
                        ));
                        break;
                    }
                }
                let (chain, handle) = found.expect("an endpoint chain with dnat");
                lab.exec_ok(
                    "node",
                    "nft",
                    &[
                        "replace",
                        "rule",
                        "ip",
                        "kube-proxy",
                        &chain,
                        "handle",
                        &handle,
                        "meta",
                        "l4proto",
                        "tcp",
                        "dnat",
                        "to",
                        "10.244.9.9:9999",
                    ],
                    None,
                )
                .unwrap();
            }
        }
        let run = drift(target, &["--netns", &ns]);
        run.expect(1);
        let out = &run.stdout;
        assert!(
            out.contains(": 0 missing, 0 extra, 1 changed\n"),
            "[{target}] {out}"
        );
        assert_eq!(out.matches("10.244.9.9").count(), 1, "[{target}] {out}");
        assert!(
            out.lines().nth(1).unwrap().starts_with("shop/web"),
            "[{target}] {out}"
        );

        // The same node saved to a file: the same answer.
        let saved = TempDir::new("drift-saved");
        let file = saved.path().join("listing");
        let listing = match target {
            "iptables" => lab.exec_ok("node", "iptables-save", &["-c"], None),
            _ => lab.exec_ok("node", "nft", &["-j", "list", "ruleset"], None),
        }
        .unwrap();
        std::fs::write(&file, listing).unwrap();
        let from = drift(target, &["--from-saved", file.to_str().unwrap()]);
        from.expect(1);
        assert_eq!(
            from.stdout.lines().skip(1).collect::<Vec<_>>(),
            out.lines().skip(1).collect::<Vec<_>>(),
            "[{target}]"
        );

        // `-o FILE`: the same report in the file, nothing on stdout, the same exit code.
        let report = saved.path().join("report");
        let to_file = drift(
            target,
            &[
                "--from-saved",
                file.to_str().unwrap(),
                "-o",
                report.to_str().unwrap(),
            ],
        );
        to_file.expect(1);
        assert_eq!(to_file.stdout, "", "[{target}]");
        assert_eq!(
            std::fs::read_to_string(&report).unwrap(),
            from.stdout,
            "[{target}]"
        );
    }
}

/// A node applied with `--nft-layout fast`, checked without the flag: every object would
/// differ, so drift says the layouts differ (from apply's record) and exits 2; with the
/// flag, no drift.
#[test]
fn drift_names_the_layout_apply_wrote() {
    if !require_root("drift_names_the_layout_apply_wrote") {
        return;
    }
    let lab = Lab::new("driftlay", &LabSpec::bare()).expect("lab");
    let ns = lab.netns("node").to_string();
    let state = TempDir::new("drift-layout");
    let state_dir = state.path().to_str().unwrap();
    let mut apply = vec!["apply"];
    apply.extend(INPUT);
    apply.extend([
        "--node",
        "node-1",
        "--target",
        "nftables",
        "--nft-layout",
        "fast",
    ]);
    apply.extend(["--netns", &ns, "--state-dir", state_dir]);
    svc(&apply, None, &root()).expect(0);
    let run = drift("nftables", &["--netns", &ns, "--state-dir", state_dir]);
    run.expect(2);
    assert!(
        run.stderr.contains("applied with --nft-layout fast")
            && run.stderr.contains("compile with --nft-layout kube-proxy")
            && run.stderr.lines().count() == 1,
        "{}",
        run.stderr
    );
    assert_eq!(run.stdout, "", "no object listed");
    let same = drift(
        "nftables",
        &[
            "--netns",
            &ns,
            "--state-dir",
            state_dir,
            "--nft-layout",
            "fast",
        ],
    );
    same.expect(0);
    assert!(same.stdout.contains(": no drift"), "{}", same.stdout);
}

/// `a "b c" d` → [a, b c, d]: enough for iptables-save's quoting of comments.
fn shell_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for ch in s.chars() {
        match ch {
            '"' => quoted = !quoted,
            ' ' if !quoted => words.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    words.push(cur);
    words.retain(|w| !w.is_empty());
    words
}
