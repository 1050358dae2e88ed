//! `svc-compile apply --target ipvs` in a kernel with IPVS: run inside the IPVS VM by the
//! same boot as the golden flows ([`super::ipvs`] starts [`guest_apply`] after its own
//! guest suite), always with `--netns` on a lab's node and a temporary state directory.
//!
//! One lab, steps in order (each step's failures are reported under its name):
//! first apply serves the flows; the same apply again is unchanged; `--dry-run` changes
//! nothing; an incremental change (endpoints moved and added) touches only the changed
//! services' virtual servers (their connection counters survive: IPVS resets them when a
//! server is deleted and made again); a removed service leaves no server, address or set
//! entry; a document the kernel refuses changes nothing; a load that fails halfway on the
//! node (an `ip -batch` that refuses, after the ipsets were swapped and the servers added)
//! is put back; `--rollback`; SIGKILL at several moments leaves the old or the new
//! state. A user's own virtual servers, ipset and iptables rules are checked after every
//! step.
//!
//! The node's state is read here independently of the planner: `ipvsadm-save -n`,
//! `ipset save`, kube-ipvs0's addresses and `iptables-save`, normalised (sorted, without
//! counters and ipset's random `initval`).
use svc_node::sys::libc;

use super::flows::{check_flows, parse_flows, BACKEND_PORT};
use super::{Lab, LabSpec, Proto};
use crate::support::{root, svc, Run, TempDir};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The result lines' names, in order (the host test wants one line for each).
pub const STEPS: [&str; 9] = [
    "apply:first",
    "apply:unchanged",
    "apply:dry-run",
    "apply:incremental",
    "apply:service-removed",
    "apply:refused",
    "apply:half-done-reverted",
    "apply:rollback",
    "apply:sigkill",
];

/// web (ClusterIP 10.96.0.11), api (NodePort 10.96.0.12, 30080), chat (NodePort
/// 10.96.0.13, 30090); each `(name, endpoints)`; a service left out is not there.
fn manifests(services: &[(&str, &[&str])]) -> String {
    let mut out = String::new();
    for (name, eps) in services {
        let (ip, np) = match *name {
            "web" => ("10.96.0.11", None),
            "api" => ("10.96.0.12", Some(30080)),
            _ => ("10.96.0.13", Some(30090)),
        };
        out += &super::apply::service(name, ip, np, BACKEND_PORT, eps);
    }
    out
}

const WEB: (&str, &[&str]) = ("web", &["10.244.1.2", "10.244.2.2"]); // pod-a, pod-r1
const API_V1: (&str, &[&str]) = ("api", &["10.244.1.3", "10.244.2.3"]); // pod-b, pod-r2
const API_V2: (&str, &[&str]) = ("api", &["10.244.1.2", "10.244.2.3"]); // pod-a, pod-r2
const CHAT_V1: (&str, &[&str]) = ("chat", &["10.244.1.2"]); // pod-a
const CHAT_V2: (&str, &[&str]) = ("chat", &["10.244.1.2", "10.244.1.3"]); // + pod-b

const FLOWS_V1: &str = "\
pod-b    tcp 10.96.0.11:80    answer pod-a,pod-r1
client1  tcp 192.0.2.10:30080 answer pod-b,pod-r2 masq
client1  tcp 192.0.2.10:30090 answer pod-a masq
";
const FLOWS_V2: &str = "\
pod-b    tcp 10.96.0.11:80    answer pod-a,pod-r1
client1  tcp 192.0.2.10:30080 answer pod-a,pod-r2 masq
client1  tcp 192.0.2.10:30090 answer pod-a,pod-b masq
";
const FLOWS_V3: &str = "\
pod-b    tcp 10.96.0.11:80    answer pod-a,pod-r1
client1  tcp 192.0.2.10:30080 answer pod-a,pod-r2 masq
client1  tcp 192.0.2.10:30090 refused
";

/// The user's own state: virtual servers (one on the node's address, one on an address
/// svc-compile never binds), a set, and iptables rules that use it.
const FOREIGN_IPVS: &str = "\
-A -t 192.0.2.10:8888 -s wrr
-a -t 192.0.2.10:8888 -r 10.244.1.2:8080 -m -w 3
-A -u 10.96.0.99:53 -s lc
";
const FOREIGN_IPSET: &str =
    "create USER-ALLOW hash:ip family inet hashsize 64 maxelem 16\nadd USER-ALLOW 203.0.113.7\n";
const FOREIGN_IPT: &str = "*filter\n:USER-IN - [0:0]\n-A USER-IN -m set --match-set USER-ALLOW src -j ACCEPT\n-A INPUT -j USER-IN\nCOMMIT\n";

struct Node<'a> {
    lab: &'a Lab,
    state: TempDir,
    inputs: TempDir,
}

impl Node<'_> {
    fn version(&self, name: &str, services: &[(&str, &[&str])]) -> String {
        let dir = self.inputs.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("svc.yaml"), manifests(services)).unwrap();
        dir.display().to_string()
    }

    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "apply".into(),
            "--target".into(),
            "ipvs".into(),
            "--netns".into(),
            self.lab.netns("node").into(),
            "--state-dir".into(),
            self.state.path().display().to_string(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    fn run(&self, extra: &[&str]) -> Run {
        let args = self.args(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        svc(&refs, None, &root())
    }

    fn apply(&self, version: &str, extra: &[&str]) -> Run {
        let mut e = vec![version, "golden/common", "--node", "node-1"];
        e.extend(extra);
        self.run(&e)
    }

    fn exec(&self, prog: &str, args: &[&str]) -> String {
        self.lab
            .exec_ok("node", prog, args, None)
            .unwrap_or_else(|e| panic!("{prog} {args:?}: {e}"))
    }

    /// The node's whole IPVS-mode state, normalised (see the module docs).
    fn state(&self) -> String {
        let mut ipvs: Vec<String> = super::ipvs::ipvsadm_save(self.lab, "node")
            .lines()
            .map(String::from)
            .collect();
        ipvs.sort();
        let mut sets: Vec<String> = self
            .exec("ipset", &["save"])
            .lines()
            .map(|l| {
                let mut w: Vec<&str> = Vec::new();
                let mut it = l.split_whitespace();
                while let Some(x) = it.next() {
                    if x == "initval" || x == "bucketsize" {
                        it.next();
                    } else {
                        w.push(x);
                    }
                }
                w.join(" ")
            })
            .collect();
        sets.sort();
        let addrs = self
            .lab
            .exec(
                "node",
                "ip",
                &["-o", "addr", "show", "dev", "kube-ipvs0"],
                None,
            )
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let mut addrs: Vec<String> = addrs
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let i = w.iter().position(|x| *x == "inet" || *x == "inet6")?;
                w.get(i + 1).map(|s| s.to_string())
            })
            .collect();
        addrs.sort();
        let ipt: Vec<String> = self
            .exec("iptables-save", &[])
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| match l.strip_prefix(':') {
                Some(c) => format!(":{}", c.split(" [").next().unwrap_or(c)),
                None => l.to_string(),
            })
            .collect();
        format!(
            "{}\n---\n{}\n---\n{}\n---\n{}\n",
            ipvs.join("\n"),
            sets.join("\n"),
            addrs.join("\n"),
            ipt.join("\n")
        )
    }

    /// The user's own objects as the node shows them.
    fn foreign(&self) -> String {
        let st = self.state();
        st.lines()
            .filter(|l| {
                l.contains("192.0.2.10:8888") || l.contains("10.96.0.99:53") || l.contains("USER-")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The `ipvsadm -L -n --stats` line of one virtual server (connections so far).
    fn conns(&self, svc: &str) -> u64 {
        let out = self.exec("ipvsadm", &["-L", "-n", "--stats", "-t", svc]);
        out.lines()
            .find(|l| l.trim_start().starts_with("TCP"))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no stats for {svc}: {out}"))
    }

    /// The virtual servers (with their real servers) keyed by service.
    fn servers(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut m: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for l in super::ipvs::ipvsadm_save(self.lab, "node").lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() > 2 {
                m.entry(format!("{} {}", w[1], w[2]))
                    .or_default()
                    .push(l.to_string());
            }
        }
        for v in m.values_mut() {
            v.sort();
        }
        m
    }

    fn flows(&self, flows: &str) -> Vec<String> {
        check_flows(self.lab, "ipvs", &parse_flows(flows))
    }

    fn load_script(&self) -> String {
        std::fs::read_to_string(self.state.path().join("ipvs-ipv4/load.ipvs")).unwrap_or_default()
    }

    fn record(&self) -> String {
        std::fs::read_to_string(self.state.path().join("ipvs-ipv4/applied.state"))
            .unwrap_or_default()
    }
}

/// A failure unless `cond`.
fn want(failures: &mut Vec<String>, cond: bool, what: impl FnOnce() -> String) {
    if !cond {
        failures.push(what());
    }
}

fn ran(failures: &mut Vec<String>, r: &Run, code: i32, word: &str) {
    want(failures, r.code == code && r.stdout.contains(word), || {
        format!(
            "`{}` exited {} (wanted {code}, output with `{word}`): {} {}",
            r.cmdline, r.code, r.stdout, r.stderr
        )
    });
}

fn hold_lock(path: &Path, wait: Duration) -> Option<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()?;
    let deadline = Instant::now() + wait;
    loop {
        // SAFETY: flock on an open descriptor.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Some(f);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs inside the VM: every step, one result line each appended to `results`.
pub fn run_guest(results: &Path) {
    let mut lab = Lab::new("ipap", &LabSpec::default()).expect("lab");
    lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve tcp");
    let node = Node {
        lab: &lab,
        state: TempDir::new("ipvs-apply-state"),
        inputs: TempDir::new("ipvs-apply-in"),
    };
    let v1 = node.version("v1", &[WEB, API_V1, CHAT_V1]);
    let v2 = node.version("v2", &[WEB, API_V2, CHAT_V2]);
    let v3 = node.version("v3", &[WEB, API_V2]);
    lab.exec_ok("node", "ipvsadm-restore", &[], Some(FOREIGN_IPVS))
        .expect("user's virtual servers");
    lab.exec_ok("node", "ipset", &["restore"], Some(FOREIGN_IPSET))
        .expect("user's set");
    lab.exec_ok(
        "node",
        "iptables-restore",
        &["--noflush"],
        Some(FOREIGN_IPT),
    )
    .expect("user's rules");
    let foreign = node.foreign();
    assert_eq!(foreign.lines().count(), 8, "the user's objects: {foreign}");

    let mut saved = std::collections::BTreeMap::<&str, String>::new();
    let step = |name: &str, f: &mut dyn FnMut(&mut Vec<String>)| {
        let start = Instant::now();
        let mut failures = Vec::new();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut failures)));
        if let Err(p) = outcome {
            failures.push(
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into()),
            );
        }
        if node.foreign() != foreign {
            failures.push(format!(
                "the user's objects changed: {} (were {foreign})",
                node.foreign()
            ));
        }
        let verdict = if failures.is_empty() { "ok" } else { "fail" };
        let ms = start.elapsed().as_millis();
        println!("ipvs guest: {name}: {verdict} in {ms} ms");
        let msg: Vec<String> = failures
            .iter()
            .map(|f| f.replace('\n', " / ").replace('\t', " "))
            .collect();
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(results)
            .unwrap();
        let _ = std::io::Write::write_all(
            &mut f,
            format!("{name}\t{verdict}\t{ms}\t{}\n", msg.join(" | ")).as_bytes(),
        );
    };

    step(STEPS[0], &mut |fl| {
        ran(fl, &node.apply(&v1, &[]), 0, "applied");
        fl.extend(node.flows(FLOWS_V1));
        saved.insert("v1", node.state());
    });
    step(STEPS[1], &mut |fl| {
        let record = node.record();
        ran(fl, &node.apply(&v1, &[]), 0, "unchanged");
        want(fl, node.state() == saved["v1"], || {
            "the node changed".into()
        });
        want(fl, node.record() == record, || "the record changed".into());
    });
    step(STEPS[2], &mut |fl| {
        let record = node.record();
        let r = node.apply(&v2, &["--dry-run"]);
        ran(fl, &r, 0, "svc_ipvsadm");
        want(fl, r.stdout.starts_with("#!/bin/sh"), || {
            format!("not a script: {}", r.stdout)
        });
        want(fl, node.state() == saved["v1"], || {
            "--dry-run changed the node".into()
        });
        want(fl, node.record() == record, || {
            "--dry-run changed the record".into()
        });
    });
    step(STEPS[3], &mut |fl| {
        let before = node.servers();
        let web = node.conns("10.96.0.11:80");
        want(fl, web > 0, || "the flows made no connection to web".into());
        ran(fl, &node.apply(&v2, &[]), 0, "incremental");
        fl.extend(node.flows(FLOWS_V2));
        saved.insert("v2", node.state());
        let after = node.servers();
        let mut changed: Vec<&String> = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k) != after.get(*k))
            .collect();
        changed.sort();
        changed.dedup();
        let expect = [
            "-t 10.96.0.12:80",
            "-t 10.96.0.13:80",
            "-t 192.0.2.10:30080",
            "-t 192.0.2.10:30090",
        ];
        want(fl, changed == expect, || {
            format!("changed servers {changed:?}, wanted {expect:?}")
        });
        // web's server was not touched: its counters go on (a re-made server starts at 0),
        // and the load did not name it.
        want(fl, node.conns("10.96.0.11:80") >= web, || {
            "web's virtual server was made again (its counters were reset)".into()
        });
        let load = node.load_script();
        want(
            fl,
            !load.contains("10.96.0.11") && load.contains("10.96.0.12"),
            || format!("the load should name api, not web:\n{load}"),
        );
    });
    step(STEPS[4], &mut |fl| {
        let web = node.conns("10.96.0.11:80");
        ran(fl, &node.apply(&v3, &[]), 0, "incremental");
        fl.extend(node.flows(FLOWS_V3));
        let st = node.state();
        want(
            fl,
            !st.contains("10.96.0.13") && !st.contains(":30090"),
            || format!("chat is still there:\n{st}"),
        );
        want(fl, node.conns("10.96.0.11:80") >= web, || {
            "web's counters were reset".into()
        });
        saved.insert("v3", st);
    });
    step(STEPS[5], &mut |fl| {
        let record = node.record();
        let good = svc(
            &[&v1, "golden/common", "--node", "node-1", "--target", "ipvs"],
            None,
            &root(),
        );
        want(fl, good.code == 0, || format!("compile: {}", good.stderr));
        for (what, from, to) in [
            (
                "bad set entry",
                "add KUBE-CLUSTER-IP 10.96.0.11,tcp:80",
                "add KUBE-CLUSTER-IP 10.96.0.300,tcp:80",
            ),
            (
                "bad scheduler",
                "-A -t 10.96.0.11:80 -s rr",
                "-A -t 10.96.0.11:80 -s nosuch",
            ),
            (
                "bad rule",
                "-A KUBE-MARK-MASQ -j MARK",
                "-A KUBE-MARK-MASQ -j KUBE-NO-SUCH-CHAIN",
            ),
        ] {
            want(fl, good.stdout.contains(from), || {
                format!("{what}: no `{from}`")
            });
            let f = node.inputs.path().join(what.replace(' ', "-"));
            std::fs::write(&f, good.stdout.replace(from, to)).unwrap();
            let r = node.run(&["--from", f.to_str().unwrap()]);
            want(
                fl,
                r.code == 2 && r.stderr.contains("nothing was changed"),
                || format!("{what}: exit {} {}", r.code, r.stderr),
            );
            want(fl, node.state() == saved["v3"], || {
                format!("{what} changed the node")
            });
            want(fl, node.record() == record, || {
                format!("{what} changed the record")
            });
        }
    });
    step(STEPS[6], &mut |fl| {
        // An `ip -batch` that refuses on the node (not in the scratch namespace): steps 1
        // and 2 of the load (sets swapped, servers added) went in, step 4 fails.
        let bin = TempDir::new("ipvs-fail-bin");
        let real = which("ip");
        let wrapper = format!(
            "#!/bin/sh\nif [ \"$1\" = -batch ] && [ \"$('{r}' netns identify)\" = '{}' ]; then echo 'injected failure' >&2; exit 1; fi\nexec '{r}' \"$@\"\n",
            node.lab.netns("node"),
            r = real.display()
        );
        let w = bin.path().join("ip");
        std::fs::write(&w, wrapper).unwrap();
        Command::new("chmod").arg("+x").arg(&w).status().unwrap();
        let path = std::env::var("PATH").unwrap_or_default();
        std::env::set_var("PATH", format!("{}:{path}", bin.path().display()));
        let r = node.apply(&v1, &[]);
        std::env::set_var("PATH", path);
        want(
            fl,
            r.code == 2 && r.stderr.contains("previous state is in place"),
            || format!("exit {}: {}", r.code, r.stderr),
        );
        let load = node.load_script();
        want(
            fl,
            load.contains("svc_ipvsadm") && load.contains("ipset restore"),
            || format!("the failed load had no steps before `ip -batch`:\n{load}"),
        );
        want(fl, node.state() == saved["v3"], || {
            format!("not put back:\n{}\nwas\n{}", node.state(), saved["v3"])
        });
        fl.extend(node.flows(FLOWS_V3));
    });
    step(STEPS[7], &mut |fl| {
        ran(fl, &node.apply(&v1, &[]), 0, "applied");
        want(fl, node.state() == saved["v1"], || {
            "v1 again differs from v1".into()
        });
        ran(fl, &node.run(&["--rollback"]), 0, "applied");
        want(fl, node.state() == saved["v3"], || {
            "--rollback did not bring back v3".into()
        });
        fl.extend(node.flows(FLOWS_V3));
    });
    step(STEPS[8], &mut |fl| {
        // Kill an apply from v3 to v2 at growing moments; once the lock is free (a loader
        // the kill left goes on), the node shows v3 or v2, nothing between.
        let exe = env!("CARGO_BIN_EXE_svc-compile");
        for delay_ms in [200u64, 1500, 3500] {
            let args = node.args(&[&v2, "golden/common", "--node", "node-1"]);
            let mut child = Command::new(exe)
                .args(&args)
                .current_dir(root())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(delay_ms));
            let _ = child.kill();
            let _ = child.wait();
            let lock = hold_lock(&node.state.path().join("lock"), Duration::from_secs(120));
            want(fl, lock.is_some(), || "the lock stayed taken".into());
            drop(lock);
            let st = node.state();
            want(fl, st == saved["v3"] || st == saved["v2"], || {
                format!("killed after {delay_ms} ms: neither v3 nor v2:\n{st}")
            });
            // Back to v3 for the next round (whatever the record says).
            let r = node.apply(&v3, &[]);
            want(fl, r.code == 0 && node.state() == saved["v3"], || {
                format!("after the kill, v3 again: {} {}", r.stdout, r.stderr)
            });
        }
        fl.extend(node.flows(FLOWS_V3));
    });
}

fn which(prog: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{prog} not in PATH"))
}

/// The guest side: started by [`super::ipvs`]'s `golden_flows_ipvs` after its guest
/// suite, in the same boot.
#[test]
#[ignore = "runs inside the IPVS VM, started by golden_flows_ipvs"]
fn guest_apply() {
    let dir = PathBuf::from(
        std::env::var_os(super::ipvs::GUEST_DIR_ENV).unwrap_or_else(|| {
            panic!(
                "{} unset: this runs inside the IPVS VM",
                super::ipvs::GUEST_DIR_ENV
            )
        }),
    );
    run_guest(&dir.join("results"));
}
