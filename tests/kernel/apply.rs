//! `svc-compile apply` in the real kernel, always with `--netns` on a lab's node and a
//! temporary state directory (never the root namespace): traffic after an apply, only the
//! changed service's chains rewritten, foreign rules untouched, SIGKILL at random moments,
//! concurrent applies, a refused ruleset, rollback, and established connections.
//!
//! Owned and foreign state are cut out of `iptables-save` / `nft` output here, independently
//! of the planner: owned = `KUBE-*` chains and jumps to them, the table `kube-proxy`.
use svc_node::sys::libc;

use super::flows::{check_flows, parse_flows, BACKEND_PORT};
use super::lab::EXEC_TIMEOUT;
use super::sys::in_netns;
use super::{require_root, Lab, LabSpec, Proto};
use crate::support::{root, svc, svc_env, Rng, Run, TempDir};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const TARGETS: [&str; 2] = ["iptables", "nftables"];

/// The services of these tests. `api` and `chat` take their endpoints as arguments.
/// - web: ClusterIP 10.96.0.11:80 → pod-a, pod-r1 (:8080)
/// - api: NodePort 10.96.0.12:80, node port 30080 (:8080)
/// - chat: NodePort 10.96.0.13:80, node port 30090 (:9090)
pub(super) fn manifests(api: &[&str], chat: &[&str]) -> String {
    let mut out = String::new();
    for (name, ip, node_port, port, eps) in [
        (
            "web",
            "10.96.0.11",
            None,
            BACKEND_PORT,
            &["10.244.1.2", "10.244.2.2"][..],
        ),
        ("api", "10.96.0.12", Some(30080), BACKEND_PORT, api),
        ("chat", "10.96.0.13", Some(30090), 9090, chat),
    ] {
        out += &service(name, ip, node_port, port, eps);
    }
    out
}

/// One ClusterIP or NodePort service `name` in namespace `shop`, port 80 → `port`, and its
/// EndpointSlice with `eps` (10.244.1.x on node-1, the others on node-2); ends with `---`.
pub(super) fn service(
    name: &str,
    ip: &str,
    node_port: Option<u16>,
    port: u16,
    eps: &[&str],
) -> String {
    let (kind, np) = match node_port {
        Some(p) => ("NodePort", format!(", nodePort: {p}")),
        None => ("ClusterIP", String::new()),
    };
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  type: {kind}\n  clusterIP: {ip}\n  selector: {{app: {name}}}\n  \
         ports:\n  - {{port: 80, targetPort: {port}{np}}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata:\n  name: {name}-1\n  namespace: shop\n  labels: {{kubernetes.io/service-name: {name}}}\n\
         addressType: IPv4\nports:\n- {{port: {port}, protocol: TCP}}\nendpoints:\n"
    );
    for ep in eps {
        let node = if ep.starts_with("10.244.1.") {
            "node-1"
        } else {
            "node-2"
        };
        out += &format!("- {{addresses: [{ep}], nodeName: {node}}}\n");
    }
    out += "---\n";
    out
}

pub(super) const V1_API: &[&str] = &["10.244.1.3", "10.244.2.3"]; // pod-b, pod-r2
pub(super) const V2_API: &[&str] = &["10.244.1.2", "10.244.2.3"]; // pod-a, pod-r2
pub(super) const CHAT: &[&str] = &["10.244.1.2"]; // pod-a
pub(super) const CHAT_MORE: &[&str] = &["10.244.1.2", "10.244.1.3"]; // pod-a, pod-b

pub(super) const FLOWS_V1: &str = "\
pod-b    tcp 10.96.0.11:80    answer pod-a,pod-r1
client1  tcp 192.0.2.10:30080 answer pod-b,pod-r2 masq
";
pub(super) const FLOWS_V2: &str = "\
pod-b    tcp 10.96.0.11:80    answer pod-a,pod-r1
client1  tcp 192.0.2.10:30080 answer pod-a,pod-r2 masq
";

/// One target on one lab's node, with its own state directory and manifest versions.
struct Node<'a> {
    lab: &'a Lab,
    target: &'static str,
    state: TempDir,
    inputs: TempDir,
    /// Added to svc-compile's environment.
    env: Vec<(String, String)>,
}

impl<'a> Node<'a> {
    fn new(lab: &'a Lab, target: &'static str) -> Node<'a> {
        Node {
            lab,
            target,
            state: TempDir::new("apply-state"),
            inputs: TempDir::new("apply-in"),
            env: Vec::new(),
        }
    }

    /// Writes a manifest version; returns its directory.
    fn version(&self, name: &str, api: &[&str], chat: &[&str]) -> String {
        let dir = self.inputs.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("svc.yaml"), manifests(api, chat)).unwrap();
        dir.display().to_string()
    }

    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = ["apply", "--target", self.target, "--netns"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.push(self.lab.netns("node").to_string());
        a.push("--state-dir".into());
        a.push(self.state.path().display().to_string());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    /// `svc-compile apply VERSION golden/common --node node-1 ...`.
    fn apply(&self, version: &str, extra: &[&str]) -> Run {
        let mut e = vec![version, "golden/common", "--node", "node-1"];
        e.extend(extra);
        self.run(&e)
    }

    fn run(&self, extra: &[&str]) -> Run {
        let args = self.args(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        svc_env(&refs, None, &root(), &self.env)
    }

    fn exec(&self, prog: &str, args: &[&str]) -> String {
        self.lab
            .exec_ok("node", prog, args, None)
            .unwrap_or_else(|e| panic!("{prog} {args:?}: {e}"))
    }

    /// The owned state as the kernel shows it (see the module docs); for nftables
    /// [`settled`], as traffic sees it.
    fn owned(&self) -> String {
        match self.target {
            "nftables" => settled(&self.owned_raw()),
            _ => self.owned_raw(),
        }
    }

    /// The owned state with, for nftables, the stale chains apply leaves emptied for later.
    fn owned_raw(&self) -> String {
        match self.target {
            "iptables" => split_iptables(&self.exec("iptables-save", &[]))
                .0
                .join("\n"),
            _ => {
                // No table is an empty state: a failed `nft list` reads as nothing.
                let json = self
                    .lab
                    .exec(
                        "node",
                        "nft",
                        &["-j", "list", "table", "ip", "kube-proxy"],
                        None,
                    )
                    .unwrap();
                let text = String::from_utf8_lossy(&json.stdout);
                svc_targets::plan::nftables::owned_state(&text).unwrap()
            }
        }
    }

    /// Everything that is not owned: iptables-save's foreign lines, and the nft ruleset
    /// without the tables the target writes (iptables-nft's tables for iptables).
    fn foreign(&self) -> String {
        let ipt = split_iptables(&self.exec("iptables-save", &[]))
            .1
            .join("\n");
        let ruleset = self.exec("nft", &["list", "ruleset"]);
        let skip: &[&str] = match self.target {
            "iptables" => &[
                "table ip filter",
                "table ip nat",
                "table ip mangle",
                "table ip raw",
            ],
            _ => &["table ip kube-proxy"],
        };
        format!("{ipt}\n---\n{}", without_tables(&ruleset, skip))
    }

    /// What the last apply recorded.
    fn recorded(&self) -> String {
        let dir = self.state.path().join(format!("{}-ipv4", self.target));
        let text = std::fs::read_to_string(dir.join("applied.state")).unwrap();
        let state = text.split_once('\n').unwrap().1;
        match self.target {
            "nftables" => settled(state),
            _ => state.to_string(),
        }
    }

    /// The document the last load ran (`load.nft` / `load.rules` in the state directory).
    fn loaded(&self) -> String {
        let ext = if self.target == "nftables" {
            "nft"
        } else {
            "rules"
        };
        let dir = self.state.path().join(format!("{}-ipv4", self.target));
        std::fs::read_to_string(dir.join(format!("load.{ext}"))).unwrap()
    }

    fn lock_path(&self) -> std::path::PathBuf {
        self.state.path().join("lock")
    }

    fn flows(&self, flows: &str) {
        let failures = check_flows(self.lab, self.target, &parse_flows(flows));
        assert!(
            failures.is_empty(),
            "[{}] traffic disagrees:\n{}",
            self.target,
            failures.join("\n")
        );
    }
}

/// An nftables owned state as traffic sees it: without the stale chains apply empties and
/// deletes later, so an incremental apply's state compares equal to a full load's.
/// Written here from the canonical text's shape, not taken from the planner: a chain line
/// goes when it is no base chain (no `"hook"`), holds no rule and no `"target"` names it.
fn settled(owned: &str) -> String {
    let used: std::collections::HashSet<&str> = owned
        .lines()
        .flat_map(|l| {
            let chain = l.strip_prefix("rule ").and_then(|r| r.split(' ').next());
            let targets = l
                .split("\"target\":\"")
                .skip(1)
                .filter_map(|t| t.split('"').next());
            chain.into_iter().chain(targets)
        })
        .collect();
    owned
        .lines()
        .filter(|l| {
            let w: Vec<&str> = l.splitn(3, ' ').collect();
            w.len() != 3 || w[0] != "chain" || w[2].contains("\"hook\"") || used.contains(w[1])
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `iptables-save` → (owned lines, foreign lines), comments and counters dropped.
pub(super) fn split_iptables(save: &str) -> (Vec<String>, Vec<String>) {
    let (mut owned, mut foreign) = (Vec::new(), Vec::new());
    for line in save.lines().filter(|l| !l.starts_with('#')) {
        let line = match line.strip_prefix(':') {
            Some(d) => format!(":{}", d.rsplit_once(' ').map_or(d, |(a, _)| a)),
            None => line.to_string(),
        };
        if line.starts_with('*') {
            foreign.push(line);
            continue;
        }
        let ours = line.starts_with(":KUBE-")
            || line.starts_with("-A KUBE-")
            || (line.starts_with("-A ") && line.contains(" -j KUBE-"));
        if ours {
            owned.push(line);
        } else {
            foreign.push(line);
        }
    }
    (owned, foreign)
}

/// `nft list ruleset` without the named top-level blocks.
pub(super) fn without_tables(ruleset: &str, skip: &[&str]) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in ruleset.lines() {
        if !line.starts_with('\t') && line.starts_with("table ") {
            skipping = skip.iter().any(|s| line == format!("{s} {{"));
        }
        if !skipping {
            // Packet counts are traffic, not rules: `counter packets 3 bytes 180` → `counter`.
            let mut words = line.split(' ');
            let mut kept = Vec::new();
            while let Some(w) = words.next() {
                if matches!(w, "packets" | "bytes") {
                    words.next();
                } else {
                    kept.push(w);
                }
            }
            out += &kept.join(" ");
            out.push('\n');
        }
        if line == "}" {
            skipping = false;
        }
    }
    out
}

/// iptables-save -c: "table chain" → its lines with counters (empty chains included).
fn iptables_chains(save: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut table = String::new();
    for line in save.lines().filter(|l| !l.starts_with('#')) {
        if let Some(t) = line.strip_prefix('*') {
            table = t.to_string();
        } else if let Some(d) = line.strip_prefix(':') {
            let c = d.split(' ').next().unwrap();
            out.entry(format!("{table} {c}")).or_default();
        } else if line.starts_with('[') {
            let c = line.split(' ').nth(2).unwrap_or("");
            out.entry(format!("{table} {c}"))
                .or_default()
                .push(line.to_string());
        }
    }
    out
}

/// `nft -a list table`: object ("chain X", "map Y") → its block, handles included.
fn nft_objects(listing: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in listing.lines() {
        if let Some(head) = line.strip_prefix('\t').filter(|l| !l.starts_with('\t')) {
            if head == "}" {
                if let Some((k, v)) = current.take() {
                    out.insert(k, v);
                }
                continue;
            }
            let mut w = head.split(' ');
            if let (Some(kind @ ("chain" | "set" | "map")), Some(name)) = (w.next(), w.next()) {
                current = Some((format!("{kind} {name}"), String::new()));
                continue;
            }
        }
        if let Some((_, v)) = current.as_mut() {
            v.push_str(line);
            v.push('\n');
        }
    }
    out
}

/// What differs between two maps: keys added, removed or changed.
fn changed<V: PartialEq>(a: &BTreeMap<String, V>, b: &BTreeMap<String, V>) -> Vec<String> {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

/// The user's own rules, put in before anything else.
pub(super) fn install_foreign(lab: &Lab) {
    let ipt = "\
*raw\n-A PREROUTING -s 203.0.113.50/32 -j NOTRACK\nCOMMIT\n\
*mangle\n:MY-MANGLE - [0:0]\n-A MY-MANGLE -j RETURN\n-A FORWARD -j MY-MANGLE\nCOMMIT\n\
*filter\n:MY-FILTER - [0:0]\n-A MY-FILTER -s 203.0.113.9/32 -j DROP\n-A INPUT -j MY-FILTER\n\
-A FORWARD -s 203.0.113.10/32 -j DROP\n-A OUTPUT -d 203.0.113.11/32 -j REJECT\nCOMMIT\n\
*nat\n:MY-NAT - [0:0]\n-A MY-NAT -d 203.0.113.12/32 -j RETURN\n-A PREROUTING -j MY-NAT\n\
-A POSTROUTING -s 203.0.113.13/32 -j MASQUERADE\nCOMMIT\n";
    lab.exec_ok("node", "iptables-restore", &["--noflush"], Some(ipt))
        .unwrap();
    let nft = "table inet user {\n\
        set blocked { type ipv4_addr; elements = { 203.0.113.21 } }\n\
        chain in { type filter hook input priority 10; policy accept; ip saddr @blocked drop; }\n}\n";
    lab.exec_ok("node", "nft", &["-f", "-"], Some(nft)).unwrap();
}

fn lab(tag: &str) -> Lab {
    let mut lab = Lab::new(tag, &LabSpec::default()).expect("lab");
    lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve tcp");
    lab
}

fn for_each_target(test: &str, f: impl Fn(&'static str) + Sync) {
    if !require_root(test) {
        return;
    }
    thread::scope(|s| {
        let jobs: Vec<_> = TARGETS.iter().map(|t| s.spawn(|| f(t))).collect();
        for j in jobs {
            j.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        }
    });
}

/// Apply → traffic; change one service → only its chains change, traffic follows, and the
/// result equals a full load; foreign rules intact after ten applies.
#[test]
fn apply_changes_only_what_changed_and_leaves_foreign_rules() {
    for_each_target(
        "kernel apply: flows, one-service change, foreign rules",
        |target| {
            let lab = lab(&format!("ap{}", &target[..3]));
            install_foreign(&lab);
            let node = Node::new(&lab, target);
            let foreign_before = node.foreign();
            let v1 = node.version("v1", V1_API, CHAT);
            let v2 = node.version("v2", V2_API, CHAT);

            // Read back (nftables would otherwise keep a fingerprint): the incremental
            // records below are that snapshot edited by each change.
            let r = node.apply(&v1, &["--read-back"]);
            r.expect(0).says("full (no previous apply recorded)");
            // A node that shows nothing of ours takes the first load directly, once: no
            // scratch namespace (iptables-nft and nftables alike: the generation proves it).
            let ext = if target == "iptables" { "rules" } else { "nft" };
            let dir = node.state.path().join(format!("{target}-ipv4"));
            assert!(dir.join(format!("applied.{ext}")).exists());
            assert!(
                !dir.join(format!("scratch.{ext}")).exists(),
                "[{target}] the first load went through the scratch namespace"
            );
            node.flows(FLOWS_V1);
            let r = node.apply(&v1, &[]);
            r.expect(0).says(" unchanged");

            // Traffic through both services first, so rewritten iptables chains show by their
            // reset counters; nftables rules keep their handles unless rewritten.
            node.flows(FLOWS_V1);
            let before_ipt = iptables_chains(&node.exec("iptables-save", &["-c"]));
            let nft_listing = || match target {
                "nftables" => {
                    nft_objects(&node.exec("nft", &["-a", "list", "table", "ip", "kube-proxy"]))
                }
                _ => BTreeMap::new(),
            };
            let before_nft = nft_listing();
            let r = node.apply(&v2, &[]);
            r.expect(0).says(": incremental:");
            let after_ipt = iptables_chains(&node.exec("iptables-save", &["-c"]));
            let after_nft = nft_listing();
            let api_only = |names: Vec<String>, blocks: &[&BTreeMap<String, Vec<String>>]| {
                for n in &names {
                    let mentions_api = blocks.iter().any(|b| {
                        b.get(n)
                            .is_some_and(|r| r.iter().any(|l| l.contains("shop/api")))
                    });
                    let per_service = ["KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT-"]
                        .iter()
                        .any(|p| n.contains(p));
                    assert!(per_service && mentions_api, "[{target}] {n} changed");
                }
            };
            match target {
                "iptables" => {
                    let diff = changed(&before_ipt, &after_ipt);
                    assert!(!diff.is_empty());
                    api_only(diff, &[&before_ipt, &after_ipt]);
                    // Web's chains kept their (non-zero) counters: not rewritten.
                    let web: Vec<&String> = before_ipt
                        .iter()
                        .filter(|(k, r)| {
                            k.contains("KUBE-SVC-") && r.iter().any(|l| l.contains("shop/web"))
                        })
                        .map(|(k, _)| k)
                        .collect();
                    assert_eq!(web.len(), 1);
                    let counted = |r: &Vec<String>| r.iter().any(|l| !l.starts_with("[0:0]"));
                    assert!(counted(&before_ipt[web[0]]), "{:?}", before_ipt[web[0]]);
                }
                _ => {
                    let diff = changed(&before_nft, &after_nft);
                    assert!(!diff.is_empty());
                    for n in diff {
                        assert!(n.contains("shop/api"), "[{target}] {n} changed");
                    }
                }
            }
            node.flows(FLOWS_V2);
            // nftables: api's old chains are still there, emptied, for a later apply to
            // delete (a delete makes nft list every chain); a full load takes them away.
            let leftovers = |raw: &str| -> Vec<String> {
                let settled = settled(raw);
                raw.lines()
                    .filter(|l| !settled.lines().any(|s| s == *l))
                    .map(|l| l.split(' ').nth(1).unwrap_or("").to_string())
                    .collect()
            };
            let left = leftovers(&node.owned_raw());
            if target == "nftables" {
                assert!(
                    !left.is_empty(),
                    "[{target}] no stale chain was left emptied"
                );
                for c in &left {
                    assert!(c.contains("shop/api"), "[{target}] {c} left behind");
                }
                r.says(" emptied (deleted later)");
            } else {
                assert!(left.is_empty(), "{left:?}");
            }

            // Incremental equals full: the same owned state after a forced full reload.
            let incremental = node.recorded();
            let owned = node.owned();
            node.apply(&v2, &["--full"]).expect(0);
            assert!(leftovers(&node.owned_raw()).is_empty());
            assert_eq!(
                node.recorded(),
                incremental,
                "[{target}] incremental != full"
            );
            assert_eq!(node.owned(), owned);

            // Services losing and gaining map elements (api without endpoints moves from
            // service-ips to no-endpoint-services, and back): incremental equals full too.
            // The expected state is then edited element by element, not read.
            let v3 = node.version("v3", &[], CHAT_MORE);
            for v in [&v3, &v1] {
                let r = node.apply(v, &[]);
                r.expect(0).says(": incremental:");
                let incremental = node.recorded();
                node.apply(v, &["--full"]).expect(0);
                assert_eq!(
                    node.recorded(),
                    incremental,
                    "[{target}] incremental != full ({v})"
                );
            }

            // Ten applies of changing states; the user's rules stay byte for byte.
            for i in 0..10 {
                let v = if i % 2 == 0 { &v1 } else { &v2 };
                let extra: &[&str] = if i == 7 { &["--full"] } else { &[] };
                node.apply(v, extra).expect(0);
            }
            assert_eq!(
                node.foreign(),
                foreign_before,
                "[{target}] foreign rules changed"
            );
            node.flows(FLOWS_V2);
        },
    );
}

/// iptables-legacy does not write through nf_tables, so the generation cannot prove its
/// loads: the first load goes to the node directly (the node showed nothing of ours), its
/// read-back is planned again the usual way (scratch namespace, check, load, read), and
/// every later apply reads the node. The binaries are picked by PATH, as on a legacy host.
#[test]
fn iptables_legacy_is_applied_by_reading_the_node() {
    if !require_root("kernel apply: iptables-legacy") {
        return;
    }
    let bin = TempDir::new("legacy-bin");
    for (name, real) in [
        ("iptables-restore", "/usr/sbin/iptables-legacy-restore"),
        ("iptables-save", "/usr/sbin/iptables-legacy-save"),
        ("iptables", "/usr/sbin/iptables-legacy"),
    ] {
        std::os::unix::fs::symlink(real, bin.path().join(name)).unwrap();
    }
    let lab = lab("aplg");
    let mut node = Node::new(&lab, "iptables");
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap()
    );
    node.env = vec![
        ("PATH".into(), path),
        ("SVC_COMPILE_APPLY_TIMES".into(), "1".into()),
    ];
    let v1 = node.version("v1", V1_API, CHAT);
    let v2 = node.version("v2", V2_API, CHAT);
    let legacy = || node.exec("iptables-legacy-save", &[]);

    let r = node.apply(&v1, &[]);
    r.expect(0).says("full (no previous apply recorded)");
    r.says("(node state read)");
    // Loaded directly, then planned again from the read: both phases ran.
    let times = r
        .stderr
        .lines()
        .find(|l| l.contains("times: iptables"))
        .unwrap_or("");
    assert!(
        times.contains("load and read back") && times.contains("scratch namespace"),
        "{}",
        r.stderr
    );
    assert!(legacy().contains(":KUBE-SERVICES"), "{}", legacy());
    assert!(
        !node
            .exec("nft", &["list", "ruleset"])
            .contains("KUBE-SERVICES"),
        "the load went to iptables-nft"
    );
    node.flows(FLOWS_V1);

    // Never known by the generation: the same input reads the node and changes nothing.
    let r = node.apply(&v1, &[]);
    r.expect(0).says(" unchanged");
    r.says("(node state read)");
    let r = node.apply(&v2, &[]);
    r.expect(0).says(": incremental:");
    r.says("(node state read)");
    node.flows(FLOWS_V2);

    // A fresh node with this record (a reboot: legacy tables are made on first use, so
    // the node shows none): the same input is loaded directly, planned again from the read
    // (legacy: the load cannot be proven by a generation), and recorded; the next apply
    // finds it unchanged.
    let lab2 = self::lab("aplh");
    let mut rebooted = Node::new(&lab2, "iptables");
    rebooted.env = node.env.clone();
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(node.state.path().join("iptables-ipv4"))
        .arg(rebooted.state.path())
        .status()
        .unwrap();
    assert!(copied.success());
    assert!(rebooted.exec("iptables-legacy-save", &[]).trim().is_empty());
    let v2 = rebooted.version("v2", V2_API, CHAT);
    let r = rebooted.apply(&v2, &[]);
    r.expect(0).says(" applied ");
    assert!(r.stderr.contains("load and read back"), "{}", r.stderr);
    rebooted.flows(FLOWS_V2);
    rebooted.apply(&v2, &[]).expect(0).says(" unchanged: ");
}

/// A cached scratch read-back (`scratch.out`) the node then disagrees with (here edited;
/// in life, tools upgraded without a reboot) fails that apply and is dropped with the
/// record: the next apply loads the scratch namespace again and succeeds.
#[test]
fn a_scratch_read_back_the_node_disagrees_with_is_dropped() {
    if !require_root("kernel apply: stale scratch read-back") {
        return;
    }
    let lab = lab("apsc");
    let node = Node::new(&lab, "iptables");
    let v1 = node.version("v1", V1_API, CHAT);
    let cache = node.state.path().join("iptables-ipv4/scratch.out");
    node.apply(&v1, &[]).expect(0);
    // A full load onto our own state goes through the scratch namespace, whose read-back
    // is kept. (A drift is mended chain by chain, and goes through it too, with less.)
    let full = || node.apply(&v1, &["--full"]);
    full().expect(0).says(": full (asked for with --full)");
    let text = std::fs::read_to_string(&cache).expect("scratch.out");
    let edited = text.replacen(
        "-A KUBE-MARK-MASQ -j",
        "-A KUBE-MARK-MASQ -m comment --comment edited -j",
        1,
    );
    assert_ne!(edited, text);
    std::fs::write(&cache, edited).unwrap();
    let r = full();
    r.expect(2);
    assert!(
        r.stderr.contains("does not show what was loaded"),
        "{}",
        r.stderr
    );
    assert!(!cache.exists(), "the disagreeing read-back is kept");
    node.apply(&v1, &[]).expect(0);
    node.flows(FLOWS_V1);
    node.apply(&v1, &[]).expect(0).says(" unchanged");
}

/// `--rollback` on a dual-stack node goes back to the state before the last apply in both
/// families, also one the last apply did not change (its `previous` document is the one
/// it kept, not one from an older apply).
#[test]
fn a_dual_stack_rollback_restores_the_pair_before_the_last_apply() {
    if !require_root("kernel apply: dual-stack rollback") {
        return;
    }
    let lab = lab("aprb");
    let node = Node::new(&lab, "nftables");
    let case = root().join("golden/cases/dual-stack-ipv6");
    let version = |name: &str, v4: &str, v6: &str| {
        let dir = node.inputs.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(case.join("cluster.yaml"), dir.join("cluster.yaml")).unwrap();
        let svc = std::fs::read_to_string(case.join("svc.yaml"))
            .unwrap()
            .replace("[10.244.1.2]", &format!("[{v4}]"))
            .replace("\"fd00:10:244:1::2\"", &format!("\"{v6}\""));
        std::fs::write(dir.join("svc.yaml"), svc).unwrap();
        dir.display().to_string()
    };
    let a = version("a", "10.244.1.2", "fd00:10:244:1::2");
    let b = version("b", "10.244.1.3", "fd00:10:244:1::3");
    let c = version("c", "10.244.1.4", "fd00:10:244:1::3");
    let apply = |v: &str| {
        let r = node.run(&[
            v,
            "--node",
            "node-1",
            "--service-cluster-ip-range",
            "10.96.0.0/12,fd00:10:96::/112",
        ]);
        r.expect(0);
        r
    };
    // Each family's owned state as traffic sees it (emptied stale chains left out).
    let tables = || {
        ["ip", "ip6"].map(|f| {
            let json = node.exec("nft", &["-j", "list", "table", f, "kube-proxy"]);
            settled(&svc_targets::plan::nftables::owned_state(&json).unwrap())
        })
    };
    apply(&a).says("nftables ipv6 applied");
    apply(&b);
    let after_b = tables();
    assert!(after_b[1].contains("fd00:10:244:1::3"), "{}", after_b[1]);
    assert!(after_b[0].contains("10.244.1.3"), "{}", after_b[0]);
    // Only IPv4 changes.
    let r = apply(&c);
    r.says("nftables ipv6 unchanged");
    let after_c = tables();
    assert_eq!(after_c[1], after_b[1]);
    assert_ne!(after_c[0], after_b[0]);
    node.run(&["--rollback"]).expect(0);
    let back = tables();
    assert_eq!(
        back[0], after_b[0],
        "IPv4 is not what the last apply replaced"
    );
    assert_eq!(
        back[1], after_b[1],
        "IPv6 went back further than the last apply"
    );
    // Twice is a redo.
    node.run(&["--rollback"]).expect(0);
    assert_eq!(tables(), after_c);
}

/// Holds the state directory's lock until dropped; `None` if it stays busy for `wait`.
fn hold_lock(path: &Path, wait: Duration) -> Option<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap();
    let deadline = Instant::now() + wait;
    loop {
        // SAFETY: flock on an open descriptor.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Some(f);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// The kill moments' seed: `SVC_KILL_SEED` (decimal or `0x` hex) to repeat a run, else
/// one derived from the process id. Printed either way.
fn kill_seed(target: &str) -> u64 {
    match std::env::var("SVC_KILL_SEED") {
        Ok(v) => {
            let t = v.trim();
            let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
                None => t.replace('_', "").parse(),
            };
            parsed.unwrap_or_else(|_| panic!("SVC_KILL_SEED={v:?} is not a number"))
        }
        Err(_) => 0x9E37_79B9_7F4A_7C15 ^ u64::from(std::process::id()) ^ (target.len() as u64),
    }
}

/// SIGKILL at random moments: afterwards (once a loader the killed apply left behind has
/// finished, i.e. once the lock is free) the node shows exactly the old or the new state.
/// The moments are random between 0 and 1.3 times an apply's measured time, drawn from a
/// seed that `SVC_KILL_SEED` sets (the test prints the one it used).
#[test]
fn sigkill_at_random_moments_leaves_the_old_or_the_new_state() {
    const RUNS: usize = 50;
    for_each_target("kernel apply: SIGKILL", |target| {
        let spec = LabSpec::bare();
        let lab = Lab::new(&format!("kill{}", &target[..3]), &spec).expect("lab");
        install_foreign(&lab);
        let node = Node::new(&lab, target);
        let foreign = node.foreign();
        // a → b changes filter (api's REJECT goes) and nat (api's chains come): iptables
        // commits those in two transactions, and no kill may leave one without the other.
        let versions = [
            node.version("a", &[], CHAT),
            node.version("b", V2_API, CHAT_MORE),
        ];
        let mut states = Vec::new();
        let mut took = Duration::ZERO;
        for v in &versions {
            let t = Instant::now();
            node.apply(v, &[]).expect(0);
            took = took.max(t.elapsed());
            states.push(node.owned());
        }
        assert_ne!(states[0], states[1]);
        let mut current = 1;
        let seed = kill_seed(target);
        println!(
            "[{target}] kill moments from seed {seed:#x} (repeat with SVC_KILL_SEED={seed:#x})"
        );
        let mut rng = Rng::new(seed);
        let (mut old, mut new, mut finished) = (0, 0, 0);
        for run in 0..RUNS {
            let next = 1 - current;
            let mut e = vec![versions[next].as_str(), "golden/common", "--node", "node-1"];
            if run % 5 == 4 {
                e.push("--full");
            }
            let args = node.args(&e);
            let mut child = Command::new(env!("CARGO_BIN_EXE_svc-compile"))
                .args(&args)
                .current_dir(root())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(node.inputs.path().join("stderr")).unwrap())
                .spawn()
                .unwrap();
            let delay = Duration::from_micros(rng.next() % (took.as_micros() as u64 * 13 / 10 + 1));
            thread::sleep(delay);
            if child.try_wait().unwrap().is_some() {
                finished += 1;
            }
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
            let lock = hold_lock(&node.lock_path(), Duration::from_secs(30))
                .expect("a loader left behind never finished");
            let now = node.owned();
            drop(lock);
            if now == states[current] {
                old += 1;
            } else if now == states[next] {
                new += 1;
                current = next;
            } else {
                let diff = |want: &str| {
                    let (w, n): (Vec<&str>, Vec<&str>) =
                        (want.lines().collect(), now.lines().collect());
                    let missing: Vec<&&str> = w.iter().filter(|l| !n.contains(l)).collect();
                    let extra: Vec<&&str> = n.iter().filter(|l| !w.contains(l)).collect();
                    format!("missing {missing:#?}\nextra {extra:#?}")
                };
                let log = |f: &str| std::fs::read_to_string(f).unwrap_or_default();
                panic!(
                    "[{target}] run {run} (seed {seed:#x}, killed after {delay:?}): a state that is neither old nor new\n\
                     vs old: {}\nvs new: {}\nstderr: {}\nload.log: {}",
                    diff(&states[current]),
                    diff(&states[next]),
                    log(&node.inputs.path().join("stderr").display().to_string()),
                    log(&node.state.path().join(format!("{target}-ipv4/load.log")).display().to_string()),
                );
            }
        }
        println!(
            "[{target}] {RUNS} SIGKILLs within {:?}: {old} old, {new} new ({finished} had finished)",
            took * 13 / 10
        );
        // A killed apply never stops the next one from doing its job.
        let last = 1 - current;
        node.apply(&versions[last], &[]).expect(0);
        assert_eq!(node.owned(), states[last]);
        assert_eq!(node.foreign(), foreign);
    });
}

/// Two applies never interleave: one waits for the other's lock, a bounded wait fails
/// with a clear line, and two started together both finish with one whole state.
#[test]
fn concurrent_applies_serialise() {
    for_each_target("kernel apply: concurrency", |target| {
        let spec = LabSpec::bare();
        let lab = Lab::new(&format!("lock{}", &target[..3]), &spec).expect("lab");
        let node = Node::new(&lab, target);
        let a = node.version("a", V1_API, CHAT);
        let b = node.version("b", V2_API, CHAT_MORE);
        node.apply(&a, &[]).expect(0);
        let state_a = node.owned();

        // Someone holds the lock: a bounded wait gives up, and nothing changes.
        let lock = hold_lock(&node.lock_path(), Duration::from_secs(5)).unwrap();
        let r = node.apply(&b, &["--lock-timeout", "0.3"]);
        r.expect(2);
        assert!(r.stderr.contains("another apply holds"), "{}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        assert_eq!(node.owned(), state_a);

        // An apply started meanwhile waits, then runs.
        let args = node.args(&[&b, "golden/common", "--node", "node-1"]);
        let mut child = Command::new(env!("CARGO_BIN_EXE_svc-compile"))
            .args(&args)
            .current_dir(root())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        thread::sleep(Duration::from_millis(700));
        assert!(
            child.try_wait().unwrap().is_none(),
            "did not wait for the lock"
        );
        assert_eq!(node.owned(), state_a);
        drop(lock);
        assert!(child.wait().unwrap().success());
        let state_b = node.owned();
        assert_ne!(state_a, state_b);

        // Two at once, several times: both succeed, the node shows one whole state, and
        // the record matches it.
        for _ in 0..3 {
            let runs: Vec<Run> = thread::scope(|s| {
                let j1 = s.spawn(|| node.apply(&a, &[]));
                let j2 = s.spawn(|| node.apply(&b, &[]));
                vec![j1.join().unwrap(), j2.join().unwrap()]
            });
            for r in &runs {
                r.expect(0);
            }
            let now = node.owned();
            assert!(now == state_a || now == state_b, "[{target}] mixed state");
            let last = if now == state_a { &a } else { &b };
            let r = node.apply(last, &[]);
            r.expect(0).says(" unchanged");
        }
    });
}

/// A ruleset the kernel rejects is refused (exit 2, one line) and the old state keeps
/// serving; so is a document that writes outside what apply owns. Then rollback.
#[test]
fn broken_rulesets_are_refused_and_rollback_restores() {
    for_each_target("kernel apply: refusal and rollback", |target| {
        let lab = lab(&format!("bad{}", &target[..3]));
        let node = Node::new(&lab, target);
        let v1 = node.version("v1", V1_API, CHAT);
        let v2 = node.version("v2", V2_API, CHAT);

        // Refused as a first load, which goes to the node directly: iptables commits
        // mangle and filter before nat fails, and they come off again.
        let good_v1 = svc(
            &[&v1, "golden/common", "--node", "node-1", "--target", target],
            None,
            &root(),
        );
        good_v1.expect(0);
        let broken_first = match target {
            "iptables" => good_v1.stdout.replace(
                "-A KUBE-MARK-MASQ -j MARK",
                "-A KUBE-MARK-MASQ -j KUBE-NO-SUCH-CHAIN\n-A KUBE-MARK-MASQ -j MARK",
            ),
            _ => format!(
                "{}add rule ip kube-proxy services goto no-such-chain\n",
                good_v1.stdout
            ),
        };
        assert_ne!(broken_first, good_v1.stdout);
        let f = node.inputs.path().join("broken-first");
        std::fs::write(&f, broken_first).unwrap();
        let (owned_before, foreign_before) = (node.owned(), node.foreign());
        let r = node.run(&["--from", f.to_str().unwrap()]);
        r.expect(2);
        assert_eq!(r.stderr.lines().count(), 1, "[{target}] {}", r.stderr);
        assert!(r.stderr.contains("nothing was changed"), "{}", r.stderr);
        assert_eq!(
            node.owned(),
            owned_before,
            "[{target}] a refused first load stayed"
        );
        // iptables cannot remove a table it created: mangle and filter stay, as empty
        // built-in chains with their default policy. Every rule and chain is as before.
        let rules = |f: String| -> Vec<String> {
            f.lines()
                .filter(|l| !(l.starts_with(':') && l.ends_with(" ACCEPT")))
                .filter(|l| !l.is_empty() && !l.starts_with('*') && *l != "COMMIT")
                .map(str::to_string)
                .collect()
        };
        assert_eq!(rules(node.foreign()), rules(foreign_before));
        // iptables had committed tables to take off; nftables' one transaction nothing.
        let ext = if target == "iptables" { "rules" } else { "nft" };
        let revert = node
            .state
            .path()
            .join(format!("{target}-ipv4/revert.{ext}"));
        assert_eq!(revert.exists(), target == "iptables", "[{target}] took off");

        node.apply(&v1, &[]).expect(0);
        let state_v1 = node.owned();
        let recorded = node.recorded();

        let good = svc(
            &[&v2, "golden/common", "--node", "node-1", "--target", target],
            None,
            &root(),
        );
        good.expect(0);
        let broken: Vec<(&str, String)> =
            match target {
                "iptables" => {
                    vec![
                // A jump to a chain nobody declares.
                (
                    "no such chain",
                    good.stdout.replace(
                        "-A KUBE-MARK-MASQ -j MARK",
                        "-A KUBE-MARK-MASQ -j KUBE-NO-SUCH-CHAIN\n-A KUBE-MARK-MASQ -j MARK",
                    ),
                ),
                // A loop: passes iptables-restore --test, only the kernel sees it.
                (
                    "loop",
                    good.stdout.replace(
                        "-A KUBE-MARK-MASQ -j MARK",
                        "-A KUBE-MARK-MASQ -j KUBE-SERVICES\n-A KUBE-MARK-MASQ -j MARK",
                    ),
                ),
                ("not ours", good.stdout.replace("COMMIT\n", "-A INPUT -j DROP\nCOMMIT\n")),
            ]
                }
                _ => vec![
                    (
                        "no such chain",
                        format!(
                            "{}add rule ip kube-proxy services goto no-such-chain\n",
                            good.stdout
                        ),
                    ),
                    (
                        "bad syntax",
                        format!(
                            "{}add rule ip kube-proxy services ip daddr 10.0.0.300 drop\n",
                            good.stdout
                        ),
                    ),
                    ("not ours", format!("{}flush ruleset\n", good.stdout)),
                ],
            };
        for (what, doc) in broken {
            let f = node
                .inputs
                .path()
                .join(format!("broken-{}", what.replace(' ', "-")));
            std::fs::write(&f, doc).unwrap();
            let r = node.run(&["--from", f.to_str().unwrap()]);
            r.expect(2);
            assert_eq!(
                r.stderr.lines().count(),
                1,
                "[{target}] {what}: {}",
                r.stderr
            );
            assert!(r.stderr.starts_with("svc-compile: "), "{}", r.stderr);
            assert_eq!(node.owned(), state_v1, "[{target}] {what} changed the node");
            assert_eq!(node.recorded(), recorded);
        }
        node.flows(FLOWS_V1);

        // The good one goes in; --rollback brings back v1, twice is a redo.
        node.apply(&v2, &[]).expect(0);
        let state_v2 = node.owned();
        node.flows(FLOWS_V2);
        node.run(&["--rollback"]).expect(0);
        assert_eq!(node.owned(), state_v1);
        node.flows(FLOWS_V1);
        node.run(&["--rollback"]).expect(0);
        assert_eq!(node.owned(), state_v2);
    });
}

/// A TCP connection through a service keeps working across applies that keep its
/// endpoint, incremental and full.
#[test]
fn established_connections_survive_an_apply() {
    for_each_target("kernel apply: established connections", |target| {
        let lab = lab(&format!("est{}", &target[..3]));
        let node = Node::new(&lab, target);
        let v1 = node.version("v1", V1_API, CHAT);
        let v3 = node.version("v3", V1_API, CHAT_MORE);
        node.apply(&v1, &[]).expect(0);

        let listener = in_netns(lab.netns("pod-a"), || TcpListener::bind("0.0.0.0:9090"))
            .unwrap()
            .unwrap();
        let server = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(EXEC_TIMEOUT)).unwrap();
            let mut w = s.try_clone().unwrap();
            for line in BufReader::new(s).lines() {
                let Ok(line) = line else { break };
                if w.write_all(format!("pod-a {line}\n").as_bytes()).is_err() {
                    break;
                }
            }
        });
        // Hang guards, not time limits: a connection that breaks says so by a reset or by
        // a read that never answers.
        let stream = in_netns(lab.netns("client1"), || {
            TcpStream::connect_timeout(&"192.0.2.10:30090".parse().unwrap(), EXEC_TIMEOUT)
        })
        .unwrap()
        .expect("connect through the node port");
        stream.set_read_timeout(Some(EXEC_TIMEOUT)).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut talk = |msg: &str| {
            (&stream).write_all(format!("{msg}\n").as_bytes()).unwrap();
            let mut answer = String::new();
            reader
                .read_line(&mut answer)
                .unwrap_or_else(|e| panic!("[{target}] no answer to {msg}: {e}"));
            assert_eq!(answer, format!("pod-a {msg}\n"), "[{target}]");
        };
        talk("before");
        let r = node.apply(&v3, &[]);
        r.expect(0).says(": incremental:");
        talk("after an incremental apply");
        node.apply(&v3, &["--full"]).expect(0);
        talk("after a full apply");
        node.apply(&v1, &[]).expect(0);
        talk("after removing the other endpoint");
        drop(reader);
        drop(stream);
        server.join().unwrap();
    });
}

/// The iptables revert document puts back a table that a failed load had committed, in
/// the kernel's own spelling (the planner's model test covers the logic).
#[test]
fn a_half_committed_iptables_load_is_put_back() {
    if !require_root("kernel apply: iptables revert") {
        return;
    }
    use svc_targets::plan::{self, iptables::Iptables, Family, Planner, Previous};
    let spec = LabSpec::bare();
    let lab = Lab::new("revert", &spec).expect("lab");
    install_foreign(&lab);
    let node = Node::new(&lab, "iptables");
    // api without endpoints: a REJECT in filter; with endpoints: chains in nat.
    let v1 = node.version("v1", &[], CHAT);
    let v2 = node.version("v2", V2_API, CHAT);
    node.apply(&v1, &[]).expect(0);
    let before = node.exec("iptables-save", &[]);
    let doc = svc(
        &[
            &v2,
            "golden/common",
            "--node",
            "node-1",
            "--target",
            "iptables",
        ],
        None,
        &root(),
    )
    .stdout;
    let dir = node.state.path().join("iptables-ipv4");
    let applied = std::fs::read_to_string(dir.join("applied.rules")).unwrap();
    let snapshot = node.recorded();
    let previous = Previous {
        document: &applied,
        snapshot: &snapshot,
    };
    let prep = Iptables
        .prepare(&doc, Family::V4, Some(previous), &before, false)
        .unwrap();
    let scratch = Command::new("unshare")
        .args([
            "--net",
            "--",
            "sh",
            "-c",
            "iptables-restore --noflush && iptables-save",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(prep.scratch.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    let plan = plan::plan(&prep, &String::from_utf8_lossy(&scratch.stdout)).unwrap();
    let load = plan.load.clone().unwrap();
    let (filter, _) = load.split_at(load.find("COMMIT\n").unwrap() + 7);
    assert!(
        filter.starts_with("*filter") && load.contains("*nat"),
        "{load}"
    );
    // Only the filter table commits, as when the nat transaction fails.
    lab.exec_ok("node", "iptables-restore", &["--noflush"], Some(filter))
        .unwrap();
    let half = node.exec("iptables-save", &[]);
    assert_ne!(split_iptables(&half).0, split_iptables(&before).0);
    let revert = plan.revert(&half).unwrap().expect("a revert");
    assert!(!revert.contains("*nat"), "{revert}");
    lab.exec_ok("node", "iptables-restore", &["--noflush"], Some(&revert))
        .unwrap();
    let after = node.exec("iptables-save", &[]);
    assert_eq!(split_iptables(&after), split_iptables(&before));

    // Through the CLI: v2 plus a loop through a chain the load does not rewrite (web's
    // service chain jumps to KUBE-MARK-MASQ), which only the node's kernel sees: filter
    // commits, nat fails, filter is put back.
    let r = node.apply(&v1, &[]);
    r.expect(0).says(" unchanged");
    let web_chain = doc
        .lines()
        .find(|l| l.contains("\"shop/web cluster IP\"") && l.starts_with("-A KUBE-SERVICES"))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap()
        .to_string();
    let broken = doc.replace(
        "-A KUBE-MARK-MASQ -j MARK",
        &format!("-A KUBE-MARK-MASQ -j {web_chain}\n-A KUBE-MARK-MASQ -j MARK"),
    );
    let f = node.inputs.path().join("broken.rules");
    std::fs::write(&f, broken).unwrap();
    let r = node.run(&["--from", f.to_str().unwrap()]);
    r.expect(2);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("were put back; the previous state is in place"),
        "{}",
        r.stderr
    );
    assert_eq!(
        split_iptables(&node.exec("iptables-save", &[])),
        split_iptables(&before)
    );
    let r = node.apply(&v1, &[]);
    r.expect(0).says(" unchanged");
}

/// The command line around apply: dry runs change nothing; non-root, a missing tool or
/// namespace give one line and exit 2; input errors exit 1.
#[test]
fn apply_command_line() {
    if !require_root("kernel apply: command line") {
        return;
    }
    let spec = LabSpec::bare();
    let lab = Lab::new("applycli", &spec).expect("lab");
    for target in TARGETS {
        let node = Node::new(&lab, target);
        let v1 = node.version("v1", V1_API, CHAT);
        let fresh = node.state.path().join("not-yet");
        let owned = node.owned();
        let mut e = vec![
            v1.as_str(),
            "golden/common",
            "--node",
            "node-1",
            "--dry-run",
        ];
        let fresh_s = fresh.display().to_string();
        let mut args = node.args(&e);
        let i = args.iter().position(|a| a == "--state-dir").unwrap();
        args[i + 1] = fresh_s.clone();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = svc(&refs, None, &root());
        r.expect(0);
        assert!(r.stdout.starts_with("#!/bin/sh\n"), "{}", r.stdout);
        r.says("SVC_COMPILE_EOF");
        let restore = if target == "iptables" {
            "iptables-restore --noflush"
        } else {
            "nft -f"
        };
        r.says(restore);
        // A first load into a node that shows nothing of ours: nft's one transaction
        // needs no check, and iptables' scratch load of every chain stands for `--test`.
        for check in ["--test", "nft -c"] {
            assert!(!r.stdout.contains(check), "{}", r.stdout);
        }
        assert!(!fresh.exists(), "a dry run created the state directory");
        assert_eq!(node.owned(), owned);

        // A dry run's script does exactly what apply would.
        let script = node.state.path().join("dry.sh");
        std::fs::write(
            &script,
            r.stdout.replace(
                &fresh_s,
                &node.state.path().join("dry").display().to_string(),
            ),
        )
        .unwrap();
        let out = Command::new("sh").arg(&script).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let by_script = node.owned();
        node.apply(&v1, &[]).expect(0);
        assert_eq!(node.owned(), by_script);

        // A record torn by a kill between its two files (document of one apply, snapshot
        // of another) is not trusted: the next apply loads everything.
        let v2 = node.version("v2", V2_API, CHAT_MORE);
        node.apply(&v2, &[]).expect(0);
        let state_v2 = node.owned();
        node.apply(&v1, &[]).expect(0);
        let doc_v2 = svc(
            &[&v2, "golden/common", "--node", "node-1", "--target", target],
            None,
            &root(),
        )
        .stdout;
        let ext = if target == "iptables" { "rules" } else { "nft" };
        let applied = node
            .state
            .path()
            .join(format!("{target}-ipv4/applied.{ext}"));
        std::fs::write(&applied, doc_v2).unwrap();
        let r = node.apply(&v2, &[]);
        r.expect(0).says(": full (");
        assert!(r.stderr.contains("interrupted apply"), "{}", r.stderr);
        assert_eq!(node.owned(), state_v2);
        node.apply(&v1, &[]).expect(0);

        // Input errors: exit 1 with diagnostics; nothing loaded.
        let bad = node.inputs.path().join("bad");
        std::fs::create_dir_all(&bad).unwrap();
        std::fs::write(
            bad.join("svc.yaml"),
            "apiVersion: v1\nkind: Service\nmetadata: [\n",
        )
        .unwrap();
        e = vec![bad.to_str().unwrap(), "golden/common", "--node", "node-1"];
        let r = node.run(&e);
        r.expect(1);
        assert!(r.stderr.contains("error["), "{}", r.stderr);
        assert_eq!(node.owned(), by_script);

        // No such namespace.
        let r = svc(
            &[
                "apply",
                &v1,
                "--node",
                "node-1",
                "--target",
                target,
                "--netns",
                "no-such-ns",
            ],
            None,
            &root(),
        );
        r.expect(2);
        assert!(
            r.stderr.contains("no network namespace `no-such-ns`"),
            "{}",
            r.stderr
        );

        // A missing tool.
        let args = node.args(&[&v1, "golden/common", "--node", "node-1"]);
        let out = Command::new(env!("CARGO_BIN_EXE_svc-compile"))
            .args(&args)
            .current_dir(root())
            .env("PATH", "/nonexistent")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("not found in PATH; install"), "{err}");

        // Not root.
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_svc-compile"))
            .args(&args)
            .current_dir(root())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim(), "svc-compile: apply needs root: it reads and loads the node's packet filter rules (run it as root, or in a privileged pod with hostNetwork)");
    }
}

/// The report's word for how the node's state was known: read, or proven unchanged by the
/// nf_tables generation id (the fast path).
const READ: &str = "(node state read)";
const BY_GENERATION: &str = "(node state known by its nf_tables generation, not read)";
/// nftables: nf_tables moved, but the fingerprint of our table is the record's.
const BY_FINGERPRINT: &str =
    "(node state known by its fingerprint, not read: nf_tables changed elsewhere)";
/// nftables: our table's fingerprint differs from the record's in chains and sets only,
/// and those were written again.
const BY_REPAIR: &str =
    "(node state known by its fingerprint, not read: what differed from the record was mended)";
/// ... and the inputs are byte for byte the last apply's: not even compiled.
const NOT_COMPILED: &str = "the inputs are the last apply's: not compiled";

/// nftables and iptables-nft: an apply right after another one, with nothing written in
/// between, takes the fast path (no read); a write anywhere else in nf_tables sends it back
/// to reading. Both targets: a foreign writer changing one of our chains between two applies is detected and
/// repaired by the next one.
#[test]
fn a_foreign_change_to_our_chains_is_repaired_and_the_fast_path_only_runs_when_nothing_changed() {
    for_each_target("kernel apply: fast path and foreign writers", |target| {
        let lab = lab(&format!("fp{}", &target[..3]));
        install_foreign(&lab);
        let node = Node::new(&lab, target);
        let v1 = node.version("v1", V1_API, CHAT);
        let v2 = node.version("v2", V2_API, CHAT);
        // iptables-nft writes through nf_tables too; iptables-legacy has no fast path.
        let fast = target == "nftables" || node.exec("iptables", &["-V"]).contains("nf_tables");
        let path = |r: &Run, want: &str| {
            assert!(r.stdout.contains(want), "[{target}] {}", r.stdout);
        };
        // Compiled, or not even that (the inputs and the generation as the last apply left them).
        let compiled = |r: &Run, yes: bool| {
            assert_eq!(
                !r.stdout.contains(NOT_COMPILED),
                yes,
                "[{target}] compiled: {yes}? {}",
                r.stdout
            );
        };

        // nftables: a first load the generation proves is fingerprinted, not read.
        let nft = target == "nftables";
        let r = node.apply(&v1, &[]);
        r.expect(0);
        path(&r, if nft { BY_GENERATION } else { READ });
        compiled(&r, true);
        let r = node.apply(&v1, &[]);
        r.expect(0);
        path(&r, if fast { BY_GENERATION } else { READ });
        compiled(&r, !fast);
        r.says(" unchanged");
        // The same inputs with --full, or a dry run: compiled (and --full loads).
        let r = node.apply(&v1, &["--dry-run"]);
        r.expect(0);
        compiled(&r, true);
        // `-o FILE`: the dry run's script in the file, nothing of it on stdout.
        let script = TempDir::new("apply-o");
        let file = script.path().join("plan.sh");
        let o = node.apply(&v1, &["--dry-run", "-o", file.to_str().unwrap()]);
        o.expect(0);
        assert_eq!(o.stdout, "", "[{target}]");
        let written = std::fs::read_to_string(&file).unwrap();
        assert_eq!(written, r.stdout, "[{target}]");
        assert!(!written.is_empty(), "[{target}]");
        let r = node.apply(&v2, &[]);
        r.expect(0).says(": incremental:");
        path(&r, if fast { BY_GENERATION } else { READ });
        compiled(&r, true);
        node.flows(FLOWS_V2);
        let good = node.owned();
        let recorded = node.recorded();

        // Someone else writes, not to our state: the next apply finds it intact (nftables:
        // by the fingerprint of our table; iptables: by a read).
        write_elsewhere(&lab, "203.0.113.22");
        let r = node.apply(&v2, &[]);
        r.expect(0);
        path(&r, if nft { BY_FINGERPRINT } else { READ });
        compiled(&r, true);
        r.says(" unchanged");
        let r = node.apply(&v2, &[]);
        r.expect(0);
        path(&r, if fast { BY_GENERATION } else { READ });
        compiled(&r, !fast);

        // A foreign writer puts a rule at the top of api's service chain.
        match target {
            "iptables" => {
                let chains = iptables_chains(&node.exec("iptables-save", &["-c"]));
                let chain = chains
                    .iter()
                    .find(|(k, r)| {
                        k.starts_with("nat KUBE-SVC-") && r.iter().any(|l| l.contains("shop/api"))
                    })
                    .map(|(k, _)| k["nat ".len()..].to_string())
                    .expect("api's service chain");
                node.exec("iptables", &["-t", "nat", "-I", &chain, "-j", "RETURN"]);
            }
            _ => {
                let listing = node.exec("nft", &["list", "table", "ip", "kube-proxy"]);
                let chain = nft_objects(&listing)
                    .into_keys()
                    .filter_map(|k| k.strip_prefix("chain service-").map(str::to_string))
                    .find(|n| n.contains("shop/api"))
                    .map(|n| format!("service-{n}"))
                    .expect("api's service chain");
                node.exec(
                    "nft",
                    &["insert", "rule", "ip", "kube-proxy", &chain, "return"],
                );
            }
        }
        assert_ne!(
            node.owned(),
            good,
            "[{target}] the foreign rule is not there"
        );
        let r = node.apply(&v2, &[]);
        r.expect(0);
        compiled(&r, true);
        assert_eq!(node.owned(), good, "[{target}] not repaired");
        if nft {
            // The fingerprint named what changed, and that chain alone was written again:
            // the node is still known without a read.
            assert!(
                r.stderr.contains("note: nftables ipv4: chain service-")
                    && r.stderr.contains("changed since the last apply"),
                "{}",
                r.stderr
            );
            r.says(": incremental: 1 chain(s) written, 0 deleted, 0 jump(s), 0 element(s), 1 repaired;");
            path(&r, BY_REPAIR);
            assert!(recorded.starts_with("# not read back"), "{recorded}");
            assert_eq!(node.recorded(), recorded);
        } else {
            // Read, and that chain alone written again.
            path(&r, READ);
            r.says(": incremental: 1 chain(s) written, 0 deleted, 0 jump(s), 0 element(s), 1 repaired;");
            assert!(
                r.stderr.contains(
                    "warning: iptables ipv4: the kernel differs from what the last apply left"
                ) && r.stderr.contains(": 1 chain(s) written again"),
                "{}",
                r.stderr
            );
            assert_eq!(node.recorded(), recorded);
        }
        node.flows(FLOWS_V2);
        // And the repaired state is known again without a read.
        let r = node.apply(&v2, &[]);
        r.expect(0);
        path(&r, if fast { BY_GENERATION } else { READ });
        compiled(&r, !fast);
    });
}

/// nftables keeps no read of a load the generation proves: the record names the stale
/// chains it leaves (the lines after the marker), and a load that someone else's commit
/// followed cannot be checked against it, so the apply loads everything the usual way.
#[test]
fn an_unread_record_keeps_its_stale_chains_and_a_load_it_cannot_prove_loads_everything() {
    if !require_root("kernel apply: unread records") {
        return;
    }
    let lab = lab("unread");
    let mut node = Node::new(&lab, "nftables");
    let v1 = node.version("v1", V1_API, CHAT);
    let v2 = node.version("v2", V2_API, CHAT);
    node.apply(&v1, &[]).expect(0).says(BY_GENERATION);
    let r = node.apply(&v2, &[]);
    r.expect(0)
        .says(": incremental:")
        .says(" emptied (deleted later)");
    r.says(BY_GENERATION);
    // The stale chains the node shows are the ones the record names.
    let record = node.recorded();
    let mut recorded: Vec<&str> = record
        .lines()
        .filter_map(|l| l.strip_prefix("chain "))
        .collect();
    recorded.sort_unstable();
    let raw = node.owned_raw();
    let settled = settled(&raw);
    let mut stale: Vec<&str> = raw
        .lines()
        .filter(|l| !settled.lines().any(|s| s == *l))
        .filter_map(|l| l.split(' ').nth(1))
        .collect();
    stale.sort_unstable();
    assert!(record.starts_with("# not read back"), "{record}");
    assert!(!stale.is_empty());
    assert_eq!(recorded, stale);
    node.flows(FLOWS_V2);
    // The fingerprint the incremental apply updated (reading only what it wrote) is the one
    // a whole read gives: after a write elsewhere, the next apply knows our table by it.
    node.exec("nft", &["add", "table", "inet", "elsewhere"]);
    let r = node.apply(&v2, &[]);
    r.expect(0).says(" unchanged").says(BY_FINGERPRINT);

    // Someone else commits right before our load (an `nft` first in PATH does it).
    let bin = TempDir::new("apply-nft");
    let nft = bin.path().join("nft");
    std::fs::write(
        &nft,
        "#!/bin/sh\ncase \"$*\" in *load.nft*) /usr/sbin/nft add table inet sneaky ;; esac\nexec /usr/sbin/nft \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&nft, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    node.env.push(("PATH".into(), path));
    let r = node.apply(&v1, &[]);
    r.expect(0);
    assert!(
        r.stderr.contains("nf_tables changed during the load")
            && r.stdout.contains("full (no previous apply recorded)"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    node.env.clear();
    // Loaded and read back: the record is the node, as a full load's.
    let owned = node.owned();
    assert_eq!(node.recorded(), owned);
    node.flows(FLOWS_V1);
    node.apply(&v1, &["--full"]).expect(0);
    assert_eq!(node.owned(), owned);
    assert!(node.exec("nft", &["list", "tables"]).contains("sneaky"));
}

/// Gives service `name` of a [`Node::version`] directory ClientIP session affinity.
fn with_affinity(dir: &str, name: &str) {
    let file = std::path::Path::new(dir).join("svc.yaml");
    let head = format!("metadata: {{name: {name}, namespace: shop}}\nspec:\n");
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace(&head, &format!("{head}  sessionAffinity: ClientIP\n"));
    assert!(text.contains("sessionAffinity"));
    std::fs::write(file, text).unwrap();
}

/// Someone else's nf_tables write that is not to our table: `addr` added to the user's own
/// set ([`install_foreign`]).
fn write_elsewhere(lab: &Lab, addr: &str) {
    let element = format!("{{ {addr} }}");
    let args = ["add", "element", "inet", "user", "blocked", &element];
    lab.exec_ok("node", "nft", &args, None).unwrap();
}

/// The fingerprint of an unread record leaves out what traffic changes (affinity entries,
/// counters) and sees what a writer changes (an element added to one of our sets).
#[test]
fn the_fingerprint_sees_a_foreign_element_and_not_traffic() {
    if !require_root("kernel apply: fingerprint against traffic and a foreign element") {
        return;
    }
    let lab = lab("fpelem");
    install_foreign(&lab);
    let node = Node::new(&lab, "nftables");
    let v1 = node.version("v1", V1_API, CHAT);
    with_affinity(&v1, "api");
    node.apply(&v1, &[]).expect(0).says(BY_GENERATION);
    let good = node.owned();

    // Traffic fills api's affinity set; then someone writes elsewhere.
    node.flows("client1  tcp 192.0.2.10:30080 sticky pod-b,pod-r2\n");
    let listing = node.exec("nft", &["list", "table", "ip", "kube-proxy"]);
    assert!(
        listing.contains(" expires "),
        "no affinity entry: {listing}"
    );
    write_elsewhere(&lab, "203.0.113.23");
    let r = node.apply(&v1, &[]);
    r.expect(0).says(" unchanged").says(BY_FINGERPRINT);

    // An element added to our cluster-ips set: named, and the set refilled.
    node.exec(
        "nft",
        &[
            "add",
            "element",
            "ip",
            "kube-proxy",
            "cluster-ips",
            "{ 10.96.99.99 }",
        ],
    );
    let r = node.apply(&v1, &[]);
    r.expect(0)
        .says(": incremental: 0 chain(s) written")
        .says(", 1 repaired;")
        .says(BY_REPAIR);
    assert!(
        r.stderr
            .contains("note: nftables ipv4: set cluster-ips changed since the last apply"),
        "{}",
        r.stderr
    );
    assert_eq!(node.owned(), good);
    let load = node.loaded();
    assert!(
        load.contains("flush set ip kube-proxy cluster-ips\n") && !load.contains(" chain "),
        "{load}"
    );
}

/// Foreign writes of every kind to our table, put back object by object from an unread
/// record: a rule added to one of our chains, an element deleted from a map, a base chain
/// (policy drop) and a set of someone else's added to our table, and a stale chain the last
/// apply emptied deleted. The node is then as the record says, traffic flows again, and the
/// next apply knows it by the generation.
#[test]
fn foreign_writes_to_our_table_are_rewritten_object_by_object() {
    if !require_root("kernel apply: repair by the fingerprint") {
        return;
    }
    let lab = lab("repair");
    install_foreign(&lab);
    let node = Node::new(&lab, "nftables");
    let v1 = node.version("v1", V1_API, CHAT);
    let v2 = node.version("v2", V2_API, CHAT);
    node.apply(&v1, &[]).expect(0).says(BY_GENERATION);
    node.apply(&v2, &[])
        .expect(0)
        .says(" emptied (deleted later)")
        .says(BY_GENERATION);
    let good = node.owned();
    let raw = node.owned_raw();
    let stale: Vec<String> = raw
        .lines()
        .filter(|l| !good.lines().any(|g| g == *l))
        .filter_map(|l| l.strip_prefix("chain "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect();
    assert!(!stale.is_empty(), "{raw}");
    let listing = node.exec("nft", &["list", "table", "ip", "kube-proxy"]);
    let service = nft_objects(&listing)
        .into_keys()
        .filter_map(|k| k.strip_prefix("chain ").map(str::to_string))
        .find(|n| n.starts_with("service-") && n.contains("shop/api"))
        .expect("api's service chain");
    let foreign = format!(
        "add rule ip kube-proxy {service} counter\n\
         delete chain ip kube-proxy {}\n\
         delete element ip kube-proxy service-ips {{ 10.96.0.11 . tcp . 80 }}\n\
         add chain ip kube-proxy theirs {{ type filter hook forward priority 0 ; policy drop ; }}\n\
         add set ip kube-proxy their-set {{ type ipv4_addr ; elements = {{ 203.0.113.77 }} ; }}\n\
         add rule ip kube-proxy theirs ip saddr @their-set accept\n\
         flush chain ip kube-proxy cluster-ips-check\n\
         delete set ip kube-proxy cluster-ips\n",
        stale[0]
    );
    lab.exec_ok("node", "nft", &["-f", "-"], Some(&foreign))
        .unwrap();
    assert_ne!(node.owned(), good);

    let r = node.apply(&v2, &[]);
    r.expect(0)
        .says(": incremental: ")
        .says(", 7 repaired;")
        .says(BY_REPAIR);
    assert!(r.stderr.contains("since the last apply"), "{}", r.stderr);
    assert_eq!(node.owned(), good);
    let listing = node.exec("nft", &["list", "table", "ip", "kube-proxy"]);
    assert!(
        !listing.contains("theirs") && !listing.contains("their-set"),
        "{listing}"
    );
    node.flows(FLOWS_V2);
    // The record is still unread and names no stale chain the node lacks.
    let dir = node.state.path().join("nftables-ipv4");
    let state = std::fs::read_to_string(dir.join("applied.state")).unwrap();
    assert!(state.contains("# not read back"), "{state}");
    for c in state.lines().filter_map(|l| l.strip_prefix("chain ")) {
        assert!(
            node.owned_raw().contains(&format!("chain {c} ")),
            "{c}: {state}"
        );
    }
    // Its fingerprint is the node's: nothing else to do, and the same after a write
    // elsewhere.
    node.apply(&v2, &[])
        .expect(0)
        .says(" unchanged")
        .says(BY_GENERATION);
    write_elsewhere(&lab, "203.0.113.24");
    node.apply(&v2, &[])
        .expect(0)
        .says(" unchanged")
        .says(BY_FINGERPRINT);
    // A change to the table itself is not mended object by object: a full load.
    node.exec(
        "nft",
        &[
            "add",
            "table",
            "ip",
            "kube-proxy",
            "{",
            "flags",
            "dormant",
            ";",
            "}",
        ],
    );
    let r = node.apply(&v2, &[]);
    r.expect(0)
        .says("full (the kernel differs from what the last apply left");
    assert!(
        r.stderr.contains("table kube-proxy changed"),
        "{}",
        r.stderr
    );
    assert_eq!(node.owned(), good);
    node.flows(FLOWS_V2);
}

#[path = "apply_fast.rs"]
mod fast;

/// What writing objects again would not undo is not mended that way: a policy someone set
/// on one of our base chains (`add chain` leaves an existing chain's policy as it is), or a
/// repair the node refuses (a chain of theirs whose name nft's text cannot spell). Both load
/// everything, after a read.
#[test]
fn what_a_rewrite_cannot_mend_loads_everything() {
    if !require_root("kernel apply: drift a repair cannot mend") {
        return;
    }
    let lab = lab("norepair");
    let node = Node::new(&lab, "nftables");
    let v1 = node.version("v1", V1_API, CHAT);
    node.apply(&v1, &[]).expect(0).says(BY_GENERATION);
    let good = node.owned();
    node.flows(FLOWS_V1);

    node.exec(
        "nft",
        &[
            "add",
            "chain",
            "ip",
            "kube-proxy",
            "filter-forward",
            "{",
            "type",
            "filter",
            "hook",
            "forward",
            "priority",
            "0",
            ";",
            "policy",
            "drop",
            ";",
            "}",
        ],
    );
    assert_ne!(node.owned(), good);
    let r = node.apply(&v1, &[]);
    r.expect(0)
        .says("full (the kernel differs from what the last apply left");
    assert!(
        r.stderr
            .contains("chain filter-forward changed since the last apply"),
        "{}",
        r.stderr
    );
    assert_eq!(node.owned(), good);
    node.flows(FLOWS_V1);

    // Back to an unread record, then a chain of theirs named `a b`.
    node.apply(&v1, &["--full"]).expect(0);
    node.exec("nft", &["delete", "table", "ip", "kube-proxy"]);
    node.apply(&v1, &[]).expect(0).says(BY_GENERATION);
    // (nft's text refuses such a name; its JSON input takes any.)
    let json = r#"{"nftables": [{"add": {"chain": {"family": "ip", "table": "kube-proxy", "name": "a b"}}}]}"#;
    lab.exec_ok("node", "nft", &["-j", "-f", "-"], Some(json))
        .unwrap();
    let r = node.apply(&v1, &[]);
    r.expect(0)
        .says("full (the kernel differs from what the last apply left");
    assert!(
        r.stderr.contains("rewriting what differs was refused"),
        "{}",
        r.stderr
    );
    assert_eq!(node.owned(), good);
    assert!(!node
        .exec("nft", &["list", "table", "ip", "kube-proxy"])
        .contains("a b"));
    node.flows(FLOWS_V1);
}

/// A first apply loads the compiled document's objects grouped (each chain's rules and each
/// set's elements in one statement): the node's table is the one `nft -f` of the compiled
/// document gives, in both layouts, with affinity sets, and in both families' tables.
#[test]
fn the_first_load_gives_the_table_the_compiled_document_gives() {
    if !require_root("kernel apply: the grouped first load") {
        return;
    }
    let lab = lab("grouped");
    for (i, layout) in ["kube-proxy", "fast"].into_iter().enumerate() {
        let node = Node::new(&lab, "nftables");
        let v = node.version(&format!("v{i}"), V1_API, CHAT_MORE);
        with_affinity(&v, "api");
        let args = ["--nft-layout", layout];
        let r = node.apply(&v, &args);
        r.expect(0).says("full (no previous apply recorded)");
        let load = node.loaded();
        assert!(
            !load.contains("\nadd rule ") && !load.contains("\nadd element "),
            "[{layout}] not grouped: {load}"
        );
        let compiled = svc_env(
            &[
                "compile",
                &v,
                "golden/common",
                "--node",
                "node-1",
                "--target",
                "nftables",
                "--nft-layout",
                layout,
            ],
            None,
            &root(),
            &[],
        );
        compiled.expect(0);
        assert!(
            compiled.stdout.contains("\nadd rule "),
            "{}",
            compiled.stdout
        );
        let dir = TempDir::new("grouped");
        let file = dir.path().join("compiled.nft");
        std::fs::write(&file, &compiled.stdout).unwrap();
        let out = std::process::Command::new("unshare")
            .args(["--net", "--", "sh", "-c"])
            .arg("nft -f \"$1\" && nft list table ip kube-proxy")
            .arg("svc-compile-test")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let raw = String::from_utf8_lossy(&out.stdout).to_string();
        let applied = node.exec("nft", &["list", "table", "ip", "kube-proxy"]);
        assert!(applied.contains("hook prerouting"), "{applied}");
        // The same table, and the same chains, sets and maps (listed in the order they
        // were made).
        let head = |l: &str| l.lines().take(2).collect::<Vec<_>>().join("\n");
        assert_eq!(head(&applied), head(&raw), "[{layout}]");
        assert_eq!(nft_objects(&applied), nft_objects(&raw), "[{layout}]");
        // The next layout starts from a node without our table.
        node.exec("nft", &["delete", "table", "ip", "kube-proxy"]);
    }
}

/// iptables: a drift is mended chain by chain from the read. Someone deletes our jump from
/// nat PREROUTING and flushes one of our endpoint chains: the next apply puts the jump back
/// and refills that chain, nothing else, and traffic flows as before.
#[test]
fn iptables_drift_is_mended_chain_by_chain() {
    if !require_root("kernel apply: iptables drift mended chain by chain") {
        return;
    }
    let lab = lab("iptmend");
    install_foreign(&lab);
    let node = Node::new(&lab, "iptables");
    let v1 = node.version("v1", V1_API, CHAT);
    node.apply(&v1, &[]).expect(0);
    node.flows(FLOWS_V1);
    let good = node.owned();
    let foreign = node.foreign();
    let save = node.exec("iptables-save", &["-t", "nat"]);
    let jump = save
        .lines()
        .find(|l| l.starts_with("-A PREROUTING ") && l.ends_with("-j KUBE-SERVICES"))
        .expect("our jump in nat PREROUTING")
        .replacen("-A ", "-D ", 1);
    let sep = save
        .lines()
        .find_map(|l| {
            l.strip_prefix("-A ")
                .filter(|r| r.starts_with("KUBE-SEP-") && r.contains("DNAT"))
                .and_then(|r| r.split(' ').next())
        })
        .expect("an endpoint chain");
    let edit = format!("*nat\n{jump}\n:{sep} - [0:0]\nCOMMIT\n");
    lab.exec_ok("node", "iptables-restore", &["--noflush"], Some(&edit))
        .unwrap();
    assert_ne!(node.owned(), good);

    let r = node.apply(&v1, &[]);
    r.expect(0)
        .says(": incremental: 1 chain(s) written, 0 deleted, 1 jump(s), 0 element(s), 2 repaired;")
        .says(READ);
    assert!(
        r.stderr.contains(": 2 chain(s) written again"),
        "{}",
        r.stderr
    );
    assert!(
        node.loaded().contains(&format!(":{sep} - [0:0]")),
        "{}",
        node.loaded()
    );
    assert_eq!(node.owned(), good);
    assert_eq!(node.foreign(), foreign);
    node.flows(FLOWS_V1);
    node.apply(&v1, &[]).expect(0).says(" unchanged");
}

/// A `--from` document of table `kube-proxy` in `family` (`ip`, `ip6`): two chains, and
/// sets of each key shape svc-compile writes with `n` elements each, the ones in `skip`
/// left out, `extra` added to each and element 0 of the maps going to chain `to`.
fn keyed_doc(family: &str, n: u32, skip: u32, extra: u32, to: &str) -> String {
    let addr = |i: u32| match family {
        "ip" => format!("10.{}.{}.{}", 96 + i / 65536, i / 256 % 256, i % 256),
        _ => format!("fd00::{:x}", i + 1),
    };
    let a = if family == "ip" {
        "ipv4_addr"
    } else {
        "ipv6_addr"
    };
    let mut d = format!(
        "add table {family} kube-proxy\ndelete table {family} kube-proxy\n\
         add table {family} kube-proxy {{ comment \"rules for kube-proxy\" ; }}\n\
         add chain {family} kube-proxy a\nadd chain {family} kube-proxy b\n\
         add rule {family} kube-proxy a counter\nadd rule {family} kube-proxy b counter\n\
         add map {family} kube-proxy service-ips {{ type {a} . inet_proto . inet_service : verdict ; }}\n\
         add map {family} kube-proxy service-nodeports {{ type inet_proto . inet_service : verdict ; }}\n\
         add set {family} kube-proxy hairpin {{ type {a} . {a} ; }}\n\
         add set {family} kube-proxy cluster-ips {{ type {a} ; }}\n"
    );
    for i in (0..n).filter(|i| *i != skip).chain([extra]) {
        let chain = if i == 0 { to } else { "a" };
        let proto = ["tcp", "udp", "sctp"][i as usize % 3];
        let k = addr(i);
        d += &format!(
            "add element {family} kube-proxy service-ips {{ {k} . {proto} . {} : goto {chain} }}\n\
             add element {family} kube-proxy service-nodeports {{ {proto} . {} : goto {chain} }}\n\
             add element {family} kube-proxy hairpin {{ {k} . {k} }}\n",
            80 + i,
            30000 + i
        );
        if i != skip {
            d += &format!("add element {family} kube-proxy cluster-ips {{ {k} }}\n");
        }
    }
    d
}

/// After an incremental load that deletes and adds elements (and gives one map element
/// another verdict), the fingerprint asks the kernel for those elements by key instead of
/// listing the sets, and the fingerprint it records is the one a whole read gives: after a
/// write elsewhere, the next apply knows our table by it. Both families, every key shape.
#[test]
fn a_fingerprint_after_element_writes_asks_for_those_elements_alone() {
    if !require_root("kernel apply: element writes fingerprinted by key") {
        return;
    }
    let lab = lab("keyed");
    let mut node = Node::new(&lab, "nftables");
    node.env
        .push(("SVC_COMPILE_APPLY_TIMES".into(), "1".into()));
    for family in ["ip", "ip6"] {
        // 40 elements a set against two chains: lost elements go by `delete element`.
        let v1 = node.inputs.path().join(format!("{family}-v1.nft"));
        let v2 = node.inputs.path().join(format!("{family}-v2.nft"));
        std::fs::write(&v1, keyed_doc(family, 40, 40, 41, "a")).unwrap();
        std::fs::write(&v2, keyed_doc(family, 40, 7, 50, "b")).unwrap();
        let (v1, v2) = (v1.to_str().unwrap(), v2.to_str().unwrap());
        node.run(&["--from", v1]).expect(0).says(BY_GENERATION);
        let r = node.run(&["--from", v2]);
        r.expect(0).says(": incremental:").says(BY_GENERATION);
        // Every set: cluster-ips only gains one; the others lose element 7, gain element
        // 50, and the maps' element 0 goes to b instead of a.
        assert!(
            r.stderr
                .contains("; 4 set(s) fingerprinted by key, not listed"),
            "[{family}] {}",
            r.stderr
        );
        let list =
            |kind: &str, name: &str| node.exec("nft", &["list", kind, family, "kube-proxy", name]);
        let map = list("map", "service-ips");
        assert!(map.contains("goto b") && map.contains(". 130 :"), "{map}");
        let hairpin = list("set", "hairpin");
        let gone = if family == "ip" {
            "10.96.0.7 "
        } else {
            "fd00::8 "
        };
        assert!(!hairpin.contains(gone), "{hairpin}");
        node.exec(
            "nft",
            &["add", "table", "inet", &format!("elsewhere-{family}")],
        );
        node.run(&["--from", v2])
            .expect(0)
            .says(" unchanged")
            .says(BY_FINGERPRINT);
    }
}

/// Localhost node ports need `route_localnet` (kube-proxy's iptables mode sets it): an
/// iptables apply sets it once its rules (the martian drop among them) are in, says so
/// once, and `127.0.0.1:NODEPORT` answers; nftables mode has no localhost node ports and
/// leaves the sysctl alone.
#[test]
fn apply_sets_route_localnet_for_localhost_node_ports() {
    if !require_root("apply_sets_route_localnet_for_localhost_node_ports") {
        return;
    }
    let local = "127.0.0.1:30080".parse().unwrap();
    for target in TARGETS {
        let lab = lab(&format!("aprl{}", &target[..3]));
        let node = Node::new(&lab, target);
        let get = || node.exec("sysctl", &["-n", "net.ipv4.conf.all.route_localnet"]);
        node.exec("sysctl", &["-qw", "net.ipv4.conf.all.route_localnet=0"]);
        let v1 = node.version("v1", V1_API, CHAT);
        let r = node.apply(&v1, &[]);
        r.expect(0);
        let note = "set net.ipv4.conf.all.route_localnet=1, which its rules need";
        let probe = lab.probe("node", Proto::Tcp, local);
        if target == "iptables" {
            assert!(r.stderr.contains(note), "[{target}] {}", r.stderr);
            assert_eq!(get().trim(), "1", "[{target}]");
            assert!(
                matches!(probe, super::Outcome::Answered { .. }),
                "[{target}] {local}: {probe:?}"
            );
            // Set already: nothing said.
            let v2 = node.version("v2", V2_API, CHAT);
            let again = node.apply(&v2, &[]);
            again.expect(0);
            assert!(!again.stderr.contains(note), "[{target}] {}", again.stderr);
        } else {
            assert!(!r.stderr.contains(note), "[{target}] {}", r.stderr);
            assert_eq!(get().trim(), "0", "[{target}]");
        }
    }
}

/// KubeProxyConfiguration's conntrack timeouts are set in the node's namespace, as
/// kube-proxy sets them at start; `nf_conntrack_max` (the host's, for a `--netns` node) is
/// left alone and said once.
#[test]
fn apply_sets_the_conntrack_timeouts_of_the_proxy_configuration() {
    if !require_root("apply_sets_the_conntrack_timeouts_of_the_proxy_configuration") {
        return;
    }
    let host_max = || std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_max").ok();
    let before = host_max();
    for target in TARGETS {
        let lab = lab(&format!("apct{}", &target[..3]));
        let node = Node::new(&lab, target);
        let get = |k: &str| node.exec("sysctl", &["-n", k]).trim().to_string();
        let v1 = node.version("v1", V1_API, CHAT);
        let config = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
                      mode: iptables\nclusterCIDR: 10.244.0.0/16\n\
                      conntrack: {udpTimeout: 45s, udpStreamTimeout: 3m, tcpCloseWaitTimeout: 0s}\n";
        std::fs::write(Path::new(&v1).join("proxy.yaml"), config).unwrap();
        node.exec(
            "sysctl",
            &[
                "-qw",
                "net.netfilter.nf_conntrack_tcp_timeout_close_wait=77",
            ],
        );
        let r = node.run(&[&v1, "golden/common/nodes.yaml", "--node", "node-1"]);
        r.expect(0);
        // Given, default (24h), and 0 (left as it was).
        assert_eq!(
            get("net.netfilter.nf_conntrack_udp_timeout"),
            "45",
            "[{target}] {}",
            r.stderr
        );
        assert_eq!(
            get("net.netfilter.nf_conntrack_udp_timeout_stream"),
            "180",
            "[{target}]"
        );
        assert_eq!(
            get("net.netfilter.nf_conntrack_tcp_timeout_established"),
            "86400",
            "[{target}]"
        );
        assert_eq!(
            get("net.netfilter.nf_conntrack_tcp_timeout_close_wait"),
            "77",
            "[{target}]"
        );
        assert!(
            r.stderr
                .contains("set net.netfilter.nf_conntrack_udp_timeout=45"),
            "[{target}] {}",
            r.stderr
        );
        assert!(
            r.stderr
                .contains("is the host's: not set for a --netns node"),
            "[{target}] {}",
            r.stderr
        );
    }
    assert_eq!(host_max(), before, "the host's nf_conntrack_max changed");
}

/// `apply --target ipvs` on a kernel without IPVS (this one: the IPVS suite boots another
/// kernel) says so in one line that says what to do, not the read script and its output.
#[test]
fn apply_ipvs_without_ipvs_says_what_to_do_in_one_line() {
    if !require_root("apply_ipvs_without_ipvs_says_what_to_do_in_one_line") {
        return;
    }
    if Path::new("/proc/net/ip_vs").exists() {
        println!("this kernel has IPVS: nothing to check here");
        return;
    }
    let lab = Lab::new("apnoipvs", &LabSpec::bare()).expect("lab");
    let node = Node::new(&lab, "ipvs");
    let v1 = node.version("v1", V1_API, CHAT);
    let r = node.apply(&v1, &[]);
    r.expect(2);
    // The failure is one line (IPVS mode's deprecation warning, SVC321, may stand before
    // it); no script or tool output.
    let failure: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("svc-compile:"))
        .collect();
    assert_eq!(failure.len(), 1, "{}", r.stderr);
    assert!(
        failure[0].contains("this kernel has no IPVS") && failure[0].contains("modprobe ip_vs"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("ipvsadm -S"), "{}", r.stderr);
}

/// `svc-compile cleanup` on a node with the user's own rules: everything owned goes (the
/// dry run first changes nothing), the user's rules and table stay byte for byte, the
/// records go, a second cleanup is a no-op, and the next apply is a first apply.
#[test]
fn cleanup_removes_what_apply_owns_and_nothing_else() {
    for_each_target(
        "kernel cleanup: owned state gone, the user's kept",
        |target| {
            let lab = lab(&format!("cl{}", &target[..3]));
            let ipt = "*filter\n:MY-CHAIN - [0:0]\n-A MY-CHAIN -s 203.0.113.9/32 -j DROP\n\
                   -A INPUT -j MY-CHAIN\nCOMMIT\n";
            lab.exec_ok("node", "iptables-restore", &["--noflush"], Some(ipt))
                .unwrap();
            let nft = "table inet mine {\n\tchain in {\n\t\ttype filter hook input priority 10; policy accept;\n\
                   \t\tip saddr 203.0.113.22 drop\n\t}\n}\n";
            lab.exec_ok("node", "nft", &["-f", "-"], Some(nft)).unwrap();
            let node = Node::new(&lab, target);
            // The user's: iptables' filter table (comments and chain counters dropped) and
            // the table `inet mine`.
            let users = || {
                let filter = node.exec("iptables-save", &["-t", "filter"]);
                let filter: Vec<String> = filter
                    .lines()
                    .filter(|l| !l.starts_with('#'))
                    .map(|l| match l.strip_prefix(':') {
                        Some(d) => format!(":{}", d.rsplit_once(' ').map_or(d, |(a, _)| a)),
                        None => l.to_string(),
                    })
                    .collect();
                format!(
                    "{}\n---\n{}",
                    filter.join("\n"),
                    node.exec("nft", &["list", "table", "inet", "mine"])
                )
            };
            let before = users();
            assert!(before.contains("-A INPUT -j MY-CHAIN"), "{before}");
            let v1 = node.version("v1", V1_API, CHAT);
            let v2 = node.version("v2", V2_API, CHAT);
            node.apply(&v1, &[]).expect(0);
            node.apply(&v2, &[]).expect(0);
            let owned = node.owned_raw();
            assert!(
                owned.contains("KUBE-") || owned.contains("kube-proxy"),
                "[{target}] {owned}"
            );
            let records = node.state.path().join(format!("{target}-ipv4"));
            let inputs = node.state.path().join(format!("{target}.inputs"));
            assert!(records.join("previous.state").exists() && inputs.exists());

            let cleanup = |extra: &[&str]| {
                let ns = lab.netns("node").to_string();
                let state = node.state.path().display().to_string();
                let mut args = vec!["cleanup", "--target", target, "--netns", &ns];
                args.extend(["--state-dir", &state]);
                args.extend(extra);
                svc_env(&args, None, &root(), &[])
            };
            let dry = cleanup(&["--dry-run"]);
            dry.expect(0).says("svc-compile cleanup --dry-run");
            let removes = match target {
                "iptables" => "-X KUBE-SERVICES",
                _ => "delete table ip kube-proxy",
            };
            dry.says(removes);
            assert_eq!(
                node.owned_raw(),
                owned,
                "[{target}] the dry run changed the node"
            );
            assert!(
                records.exists() && inputs.exists(),
                "[{target}] the dry run forgot"
            );

            cleanup(&[])
                .expect(0)
                .says(&format!("{target} ipv4 in network namespace"));
            assert_eq!(node.owned_raw(), "", "[{target}] owned state left");
            let save = node.exec("iptables-save", &[]);
            let kube: Vec<&str> = save.lines().filter(|l| l.contains("KUBE-")).collect();
            assert!(kube.is_empty(), "[{target}] {kube:?}");
            let tables = node.exec("nft", &["list", "tables"]);
            assert!(!tables.contains("kube-proxy"), "[{target}] {tables}");
            assert_eq!(users(), before, "[{target}] the user's rules changed");
            assert!(!records.exists(), "[{target}] {} kept", records.display());
            assert!(!inputs.exists(), "[{target}] {} kept", inputs.display());

            cleanup(&[]).expect(0).says("nothing of ours there");
            assert_eq!(
                users(),
                before,
                "[{target}] the second cleanup changed the user's"
            );

            node.apply(&v1, &[])
                .expect(0)
                .says("full (no previous apply recorded)");
            node.flows(FLOWS_V1);
            let now = users();
            for line in [
                "-A INPUT -j MY-CHAIN",
                "-A MY-CHAIN -s 203.0.113.9/32 -j DROP",
            ] {
                assert!(now.contains(line), "[{target}] {line} gone: {now}");
            }
        },
    );
}

/// Switching proxy modes on one node: `apply --target B` after `apply --target A` with the
/// same state directory takes A's rules and records off once B's are in (a dry run only
/// says it would), traffic is answered throughout, and the user's own iptables chain and
/// nft table stay.
#[test]
fn switching_target_removes_the_last_targets_rules() {
    for_each_target(
        "kernel apply: switching target removes the other target's rules",
        |from| {
            let to = if from == "iptables" {
                "nftables"
            } else {
                "iptables"
            };
            let lab = lab(&format!("sw{}", &from[..3]));
            let ipt = "*filter\n:MY-CHAIN - [0:0]\n-A MY-CHAIN -s 203.0.113.9/32 -j DROP\n\
                   -A INPUT -j MY-CHAIN\nCOMMIT\n";
            lab.exec_ok("node", "iptables-restore", &["--noflush"], Some(ipt))
                .unwrap();
            let nft = "table inet mine {\n\tchain in {\n\t\ttype filter hook input priority 10; policy accept;\n\
                   \t\tip saddr 203.0.113.22 drop\n\t}\n}\n";
            lab.exec_ok("node", "nft", &["-f", "-"], Some(nft)).unwrap();
            let mut node = Node::new(&lab, from);
            let mine = || node_exec(&lab, "nft", &["list", "table", "inet", "mine"]);
            let mine_before = mine();
            let v1 = node.version("v1", V1_API, CHAT);
            node.apply(&v1, &[]).expect(0);
            node.flows(FLOWS_V1);
            let owned_before = node.owned_raw();
            assert!(!owned_before.is_empty(), "[{from}] nothing applied");
            let records = node.state.path().join(format!("{from}-ipv4"));
            let inputs = node.state.path().join(format!("{from}.inputs"));
            assert!(records.join("applied.state").exists() && inputs.exists());

            node.target = to;
            let said = format!("the {from} rules of the last apply (switching to {to})");
            let dry = node.apply(&v1, &["--dry-run"]);
            dry.expect(0).says(&format!("# then: remove {said}"));
            node.target = from;
            assert_eq!(
                node.owned_raw(),
                owned_before,
                "[{from}] the dry run removed"
            );
            assert!(records.exists(), "[{from}] the dry run forgot");

            node.target = to;
            let run = node.apply(&v1, &[]);
            run.expect(0);
            let removed = format!("removed {said}");
            assert!(
                run.stderr
                    .lines()
                    .any(|l| l.starts_with("svc-compile: note: ") && l.ends_with(&removed)),
                "[{from} → {to}] no note:\n{}",
                run.stderr
            );
            assert!(!node.owned_raw().is_empty(), "[{to}] nothing applied");
            node.flows(FLOWS_V1);
            match from {
                "nftables" => {
                    let tables = node.exec("nft", &["list", "tables"]);
                    assert!(!tables.contains("kube-proxy"), "[{from} → {to}] {tables}");
                }
                _ => {
                    let save = node.exec("iptables-save", &[]);
                    let kube: Vec<&str> = save.lines().filter(|l| l.contains("KUBE-")).collect();
                    assert!(kube.is_empty(), "[{from} → {to}] {kube:?}");
                }
            }
            assert!(!records.exists(), "[{from}] {} kept", records.display());
            assert!(!inputs.exists(), "[{from}] {} kept", inputs.display());
            let to_records = node.state.path().join(format!("{to}-ipv4"));
            assert!(
                to_records.join("applied.state").exists(),
                "[{to}] not recorded"
            );
            let save = node.exec("iptables-save", &["-t", "filter"]);
            for line in [
                "-A INPUT -j MY-CHAIN",
                "-A MY-CHAIN -s 203.0.113.9/32 -j DROP",
            ] {
                assert!(save.contains(line), "[{from} → {to}] {line} gone: {save}");
            }
            assert_eq!(
                mine(),
                mine_before,
                "[{from} → {to}] the user's table changed"
            );

            // Nothing of the other target is left to switch from.
            let again = node.apply(&v1, &["--full"]);
            again.expect(0);
            assert!(!again.stderr.contains("switching"), "{}", again.stderr);
            node.flows(FLOWS_V1);

            // IPVS mode's records: cleanup cannot remove its rules yet, so a warning only,
            // and its records stay.
            let ipvs = node.state.path().join("ipvs-ipv4");
            std::fs::create_dir_all(&ipvs).unwrap();
            std::fs::write(ipvs.join("applied.ipvs"), "# an earlier IPVS apply\n").unwrap();
            let warned = node.apply(&v1, &[]);
            warned.expect(0);
            assert!(
                warned
                    .stderr
                    .lines()
                    .any(|l| l.starts_with("svc-compile: warning: ")
                        && l.contains("the ipvs rules of the last apply are still in place")),
                "[{to}] {}",
                warned.stderr
            );
            assert!(
                ipvs.join("applied.ipvs").exists(),
                "[{to}] ipvs records touched"
            );
        },
    );
}

fn node_exec(lab: &Lab, prog: &str, args: &[&str]) -> String {
    lab.exec_ok("node", prog, args, None)
        .unwrap_or_else(|e| panic!("{prog} {args:?}: {e}"))
}
