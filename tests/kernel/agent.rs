//! `svc-compile agent` in the real kernel, on a lab's node (`--netns`) with a temporary
//! state directory: traffic follows edits (renamed into place, written in place, held open
//! half-written), manifests with errors keep the last good state, a foreign change is
//! mended at the next period, SIGHUP reads everything, SIGTERM leaves the rules, a restart
//! resumes without compiling, a UDP client keeping its socket follows its service to a
//! new endpoint, and SIGKILL at random moments of syncs leaves a node the next agent
//! brings to the last version.
//!
//! The oracles are traffic (which backend answers, masqueraded or not), the kernel's own
//! listings cut by name (`KUBE-*`, the `kube-proxy` table), and the agent's log lines.

use super::apply::{
    install_foreign, manifests, split_iptables, without_tables, CHAT, CHAT_MORE, FLOWS_V1,
    FLOWS_V2, V1_API, V2_API,
};
use super::flows::{check_flows, parse_flows, BACKEND_PORT};
use super::{require_root, Lab, LabSpec, Proto};
use crate::support::{root, svc, Rng, TempDir};
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use svc_node::sys::libc;

const TARGETS: [&str; 2] = ["iptables", "nftables"];
/// The longest any awaited log line may take (a sync of a few services takes ms; the
/// machine may be loaded by the rest of the suite).
const WAIT: Duration = Duration::from_secs(60);

/// A running agent; killed (SIGKILL) and reaped on drop, also when a test fails.
struct Agent {
    child: Option<Child>,
    log: PathBuf,
    out: PathBuf,
}

impl Agent {
    /// [`Agent::start`], then waits for its first sync and requires it applied.
    fn started(
        lab: &Lab,
        target: &str,
        (dir, state, logs): (&TempDir, &TempDir, &TempDir),
        extra: &[&str],
    ) -> Agent {
        let agent = Agent::start(lab, target, dir.path(), state.path(), logs.path(), extra);
        let s = agent.sync(1);
        assert_eq!(
            result(&s),
            "applied",
            "[{target}] first sync: {}",
            agent.said()
        );
        agent
    }

    /// `svc-compile agent DIR --target T --node node-1 --netns NODE --state-dir STATE
    /// --log-format json EXTRA...`, logging into `logs`.
    fn start(
        lab: &Lab,
        target: &str,
        dir: &Path,
        state: &Path,
        logs: &Path,
        extra: &[&str],
    ) -> Agent {
        let log = logs.join(format!("agent-{}.log", unique()));
        let out = log.with_extension("out");
        let mut args: Vec<String> = [
            "agent",
            "--target",
            target,
            "--node",
            "node-1",
            "--netns",
            lab.netns("node"),
            "--state-dir",
            &state.display().to_string(),
            "--log-format",
            "json",
            &dir.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(env!("CARGO_BIN_EXE_svc-compile"))
            .args(&args)
            .current_dir(root())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start the agent");
        Agent {
            child: Some(child),
            log,
            out,
        }
    }

    /// The agent's JSON log lines (the compile's diagnostics, in text, are skipped).
    fn lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The sync lines.
    fn syncs(&self) -> Vec<serde_json::Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["event"] == "sync")
            .collect()
    }

    /// Waits (bounded) for sync number `n` and returns it.
    fn sync(&self, n: usize) -> serde_json::Value {
        let end = Instant::now() + WAIT;
        loop {
            if let Some(s) = self.syncs().into_iter().nth(n - 1) {
                return s;
            }
            assert!(
                Instant::now() < end,
                "no sync {n} within {WAIT:?}; the agent said:\n{}",
                self.said()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the agent printed, for failure messages.
    fn said(&self) -> String {
        format!(
            "stderr:\n{}\nstdout:\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default(),
            std::fs::read_to_string(&self.out).unwrap_or_default()
        )
    }

    fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: a signal to our own child, which is not reaped yet.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    /// Waits (bounded) for the agent to exit; its exit code.
    fn exit(&mut self) -> i32 {
        let mut child = self.child.take().unwrap();
        let end = Instant::now() + WAIT;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st.code().unwrap_or(-1);
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the agent did not exit within {WAIT:?}:\n{}", self.said());
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn unique() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Writes `text` to `path` as editors and git do: a temporary file renamed over it.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_file_name(format!(".{}.tmp", unique()));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The inputs: `svc.yaml` (the services) and golden/common's nodes and proxy configuration.
fn inputs(dir: &Path, svc_yaml: &str) {
    for f in ["nodes.yaml", "kube-proxy.yaml"] {
        std::fs::copy(root().join("golden/common").join(f), dir.join(f)).unwrap();
    }
    replace(&dir.join("svc.yaml"), svc_yaml);
}

/// What the target owns on the node, from the kernel's listings cut by name.
fn owned(lab: &Lab, target: &str) -> String {
    match target {
        "iptables" => split_iptables(&exec(lab, "iptables-save", &[]))
            .0
            .join("\n"),
        _ => lab
            .exec("node", "nft", &["list", "table", "ip", "kube-proxy"], None)
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default(),
    }
}

/// Everything on the node the target does not own.
fn foreign(lab: &Lab, target: &str) -> String {
    let ipt = split_iptables(&exec(lab, "iptables-save", &[]))
        .1
        .join("\n");
    let skip: &[&str] = match target {
        "iptables" => &[
            "table ip filter",
            "table ip nat",
            "table ip mangle",
            "table ip raw",
        ],
        _ => &["table ip kube-proxy"],
    };
    format!(
        "{ipt}\n---\n{}",
        without_tables(&exec(lab, "nft", &["list", "ruleset"]), skip)
    )
}

/// A foreign write to what the agent owns: its services dispatch chain flushed (after
/// checking that this changes the owned state). Returns the owned state before it.
fn flush_services(lab: &Lab, target: &str) -> String {
    let good = owned(lab, target);
    match target {
        "iptables" => exec(lab, "iptables", &["-t", "nat", "-F", "KUBE-SERVICES"]),
        _ => exec(
            lab,
            "nft",
            &["flush", "chain", "ip", "kube-proxy", "services"],
        ),
    };
    assert_ne!(
        owned(lab, target),
        good,
        "[{target}] the foreign write did nothing"
    );
    good
}

fn exec(lab: &Lab, prog: &str, args: &[&str]) -> String {
    lab.exec_ok("node", prog, args, None)
        .unwrap_or_else(|e| panic!("{prog} {args:?}: {e}"))
}

fn flows(lab: &Lab, target: &str, flows: &str, when: &str) {
    let failures = check_flows(lab, target, &parse_flows(flows));
    assert!(
        failures.is_empty(),
        "[{target}] {when}: traffic disagrees:\n{}",
        failures.join("\n")
    );
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

fn result(sync: &serde_json::Value) -> &str {
    sync["result"].as_str().unwrap_or("")
}

/// Edits renamed into place and written in place are applied (traffic follows); a file
/// held open half-written is not compiled until it is closed; errors keep the last good
/// state and the next good edit applies; SIGHUP reads everything; a foreign change to
/// owned rules is mended at the next period; SIGTERM exits 0 and leaves the rules; a
/// restarted agent resumes without compiling. Foreign rules survive all of it.
#[test]
fn the_agent_follows_edits_keeps_the_last_good_state_and_leaves_the_rules_on_exit() {
    for_each_target("kernel agent: edits, errors, signals, restart", |target| {
        let mut lab = Lab::new(&format!("agt{}", &target[..3]), &LabSpec::default()).expect("lab");
        lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve tcp");
        install_foreign(&lab);
        let foreign_before = foreign(&lab, target);
        let (dir, state, logs) = (
            TempDir::new("agent-in"),
            TempDir::new("agent-state"),
            TempDir::new("agent-log"),
        );
        inputs(dir.path(), &manifests(V1_API, CHAT));
        let svc_yaml = dir.path().join("svc.yaml");
        // A period of 2 s: long enough that the edits below are what wakes each sync, short
        // enough to see the periodic check mend a foreign change.
        let mut agent = Agent::started(
            &lab,
            target,
            (&dir, &state, &logs),
            &["--sync-period", "2s"],
        );
        flows(&lab, target, FLOWS_V1, "v1");

        // Renamed into place.
        let before = agent.syncs().len();
        replace(&svc_yaml, &manifests(V2_API, CHAT_MORE));
        let s = wait_for(&agent, before, |s| s["reason"] != "sync period");
        assert_eq!(result(&s), "applied", "[{target}] v2: {}", agent.said());
        flows(&lab, target, FLOWS_V2, "v2, renamed into place");

        // Written in place, held open half-written: the first half alone is valid (it
        // drops `api`), so a sync now would load it. Nothing syncs while it is open.
        let v1 = manifests(V1_API, CHAT);
        let half = v1
            .find("kind: Service\nmetadata: {name: chat")
            .map(|i| &v1[..i])
            .unwrap();
        let before = agent.syncs().len();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&svc_yaml)
            .unwrap();
        f.write_all(half.as_bytes()).unwrap();
        f.flush().unwrap();
        thread::sleep(Duration::from_millis(500));
        let during: Vec<_> = agent.syncs()[before..]
            .iter()
            .filter(|s| s["reason"] != "sync period")
            .cloned()
            .collect();
        assert!(
            during.is_empty(),
            "[{target}] a sync while the file was open: {during:?}"
        );
        f.write_all(&v1.as_bytes()[half.len()..]).unwrap();
        drop(f);
        let s = wait_for(&agent, before, |s| s["reason"] != "sync period");
        assert_eq!(
            result(&s),
            "applied",
            "[{target}] in place: {}",
            agent.said()
        );
        flows(&lab, target, FLOWS_V1, "v1, written in place");

        // Errors: the last good state stays; the next good edit applies.
        let before = agent.syncs().len();
        replace(
            &svc_yaml,
            &(manifests(V2_API, CHAT) + "kind: Service\nmetadata: {name: [\n"),
        );
        let s = wait_for(&agent, before, |s| s["reason"] != "sync period");
        assert_eq!(result(&s), "rejected", "[{target}] {}", agent.said());
        flows(&lab, target, FLOWS_V1, "after a rejected edit");
        let before = agent.syncs().len();
        replace(&svc_yaml, &manifests(V2_API, CHAT));
        let s = wait_for(&agent, before, |s| s["reason"] != "sync period");
        assert_eq!(result(&s), "applied", "[{target}] {}", agent.said());
        flows(&lab, target, FLOWS_V2, "after the mending edit");

        // A ConfigMap volume's update (kubelet's atomic writer): the files are symlinks
        // through `..data`, which one rename points at the new version's directory.
        let cm = dir.path().join("cm");
        std::fs::create_dir(&cm).unwrap();
        let version = |n: &str, text: &str| {
            let d = cm.join(format!("..{n}"));
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("extra.yaml"), text).unwrap();
            let tmp = cm.join("..data_tmp");
            std::os::unix::fs::symlink(format!("..{n}"), &tmp).unwrap();
            std::fs::rename(&tmp, cm.join("..data")).unwrap();
        };
        let extra =
            |ip: &str| super::apply::service("extra", ip, None, BACKEND_PORT, &["10.244.1.2"]);
        let before = agent.syncs().len();
        version("v1", &extra("10.96.0.21"));
        std::os::unix::fs::symlink("..data/extra.yaml", cm.join("extra.yaml")).unwrap();
        let s = wait_for(&agent, before, |s| s["reason"] != "sync period");
        assert_eq!(result(&s), "applied", "[{target}] {}", agent.said());
        let before = agent.syncs().len();
        version("v2", &extra("10.96.0.22"));
        let s = wait_for(&agent, before, |s| s["reason"] != "sync period");
        assert_eq!(result(&s), "applied", "[{target}] {}", agent.said());
        flows(
            &lab,
            target,
            "pod-b tcp 10.96.0.22:80 answer pod-a\npod-b tcp 10.96.0.21:80 timeout\n",
            "a ConfigMap's update",
        );
        let before = agent.syncs().len();
        std::fs::remove_dir_all(&cm).unwrap();
        let s = wait_for(&agent, before, |s| s["reason"] != "sync period");
        assert_eq!(result(&s), "applied", "[{target}] {}", agent.said());

        // SIGHUP reads everything again.
        let before = agent.syncs().len();
        agent.signal(libc::SIGHUP);
        let s = wait_for(&agent, before, |s| s["reason"] != "sync period");
        assert!(
            s["reason"].as_str().unwrap().contains("SIGHUP"),
            "[{target}] {s}"
        );
        assert_eq!(result(&s), "applied");

        // A foreign change to what we own is mended by the next periodic sync.
        let good = flush_services(&lab, target);
        let before = agent.syncs().len();
        let s = wait_for(&agent, before, |s| s["reason"] == "sync period");
        assert_eq!(result(&s), "applied", "[{target}] {}", agent.said());
        assert_eq!(
            owned(&lab, target),
            good,
            "[{target}] not mended: {}",
            agent.said()
        );
        flows(&lab, target, FLOWS_V2, "after the mend");

        // SIGTERM: exit 0, the rules stay.
        agent.signal(libc::SIGTERM);
        assert_eq!(agent.exit(), 0, "[{target}] {}", agent.said());
        assert_eq!(
            owned(&lab, target),
            good,
            "[{target}] SIGTERM changed the rules"
        );
        flows(&lab, target, FLOWS_V2, "after SIGTERM");

        // A restart (same command line) with the node as it was left: compiled once (for
        // the health checks), nothing loaded.
        let agent = Agent::started(
            &lab,
            target,
            (&dir, &state, &logs),
            &["--sync-period", "2s"],
        );
        let out = std::fs::read_to_string(&agent.out).unwrap();
        assert!(
            out.lines().count() == 1 && out.contains(" unchanged in "),
            "[{target}] the restart loaded something: {}",
            agent.said()
        );
        assert_eq!(owned(&lab, target), good);
        assert_eq!(
            foreign(&lab, target),
            foreign_before,
            "[{target}] foreign rules changed"
        );
    });
}

/// Waits (bounded) for the first sync after the first `after` syncs that `pred` accepts.
fn wait_for(
    agent: &Agent,
    after: usize,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let end = Instant::now() + WAIT;
    loop {
        if let Some(s) = agent.syncs().into_iter().skip(after).find(|s| pred(s)) {
            return s;
        }
        assert!(
            Instant::now() < end,
            "no such sync within {WAIT:?}:\n{}",
            agent.said()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// A UDP client that keeps its socket (as a resolver does) reaches its service's new
/// endpoint once the agent applied the edit that moved it: the agent's syncs clean stale
/// UDP conntrack entries as kube-proxy's do.
#[test]
fn a_udp_client_follows_its_service_when_the_agent_moves_the_endpoint() {
    use super::conntrack::{ask, client};
    for_each_target("kernel agent: stale UDP conntrack", |target| {
        let mut lab = Lab::new(&format!("agu{}", &target[..3]), &LabSpec::default()).expect("lab");
        for pod in ["pod-a", "pod-r1"] {
            lab.serve_on(pod, Proto::Udp, 5353).expect("serve udp");
        }
        let (dir, state, logs) = (
            TempDir::new("agent-in"),
            TempDir::new("agent-state"),
            TempDir::new("agent-log"),
        );
        let cluster = root().join("golden/cases/dual-stack-ipv6/cluster.yaml");
        std::fs::copy(&cluster, dir.path().join("cluster.yaml")).unwrap();
        let svc_yaml = dir.path().join("svc.yaml");
        replace(
            &svc_yaml,
            &super::conntrack::manifests(Ipv4Addr::new(10, 244, 1, 2)),
        );
        let agent = Agent::started(
            &lab,
            target,
            (&dir, &state, &logs),
            &[
                "--sync-period",
                "1h",
                "--service-cluster-ip-range",
                "10.96.0.0/12,fd00:10:96::/112",
            ],
        );
        let vip = SocketAddr::new(Ipv4Addr::new(10, 96, 0, 53).into(), 53);
        let c = client(&lab, "pod-b", 40153, vip);
        assert_eq!(ask(&c, "pod-b to the cluster IP"), "pod-a", "[{target}]");
        let before = agent.syncs().len();
        replace(
            &svc_yaml,
            &super::conntrack::manifests(Ipv4Addr::new(10, 244, 2, 2)),
        );
        let s = wait_for(&agent, before, |_| true);
        assert_eq!(result(&s), "applied", "[{target}] {}", agent.said());
        assert_eq!(
            ask(&c, "pod-b to the cluster IP, moved"),
            "pod-r1",
            "[{target}] {}",
            agent.said()
        );
    });
}

/// SIGKILL at random moments while the agent syncs edits: every restarted agent brings the
/// node to the files' current version (traffic and `drift`), and foreign rules survive.
#[test]
fn sigkill_during_syncs_and_a_restart_carries_on() {
    const RUNS: usize = 12;
    for_each_target("kernel agent: SIGKILL during syncs", |target| {
        let mut lab = Lab::new(&format!("agk{}", &target[..3]), &LabSpec::default()).expect("lab");
        lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve tcp");
        install_foreign(&lab);
        let foreign_before = foreign(&lab, target);
        let (dir, state, logs) = (
            TempDir::new("agent-in"),
            TempDir::new("agent-state"),
            TempDir::new("agent-log"),
        );
        let versions = [manifests(V1_API, CHAT), manifests(V2_API, CHAT_MORE)];
        inputs(dir.path(), &versions[0]);
        let svc_yaml = dir.path().join("svc.yaml");
        let seed = 0x5eed_0000 + target.len() as u64;
        let mut rng = Rng::new(seed);
        let mut current = 0;
        for run in 0..RUNS {
            println!("[{target}] run {run} (seed {seed:#x})");
            let agent = Agent::started(
                &lab,
                target,
                (&dir, &state, &logs),
                &["--sync-period", "1h"],
            );
            current = 1 - current;
            replace(&svc_yaml, &versions[current]);
            // Killed somewhere between the edit and well after its sync.
            thread::sleep(Duration::from_micros(rng.next() % 150_000));
            drop(agent); // SIGKILL
        }
        // Kept running (it is killed on drop) while the node is checked.
        let _agent = Agent::started(
            &lab,
            target,
            (&dir, &state, &logs),
            &["--sync-period", "1h"],
        );
        let want = [FLOWS_V1, FLOWS_V2][current];
        flows(
            &lab,
            target,
            want,
            &format!("after {RUNS} kills (seed {seed:#x})"),
        );
        let d = dir.path().display().to_string();
        let st = state.path().display().to_string();
        let r = svc(
            &[
                "drift",
                "--target",
                target,
                "--node",
                "node-1",
                "--netns",
                lab.netns("node"),
                "--state-dir",
                &st,
                &d,
            ],
            None,
            &root(),
        );
        assert_eq!(
            r.code, 0,
            "[{target}] drift after the kills: {}{}",
            r.stdout, r.stderr
        );
        assert_eq!(
            foreign(&lab, target),
            foreign_before,
            "[{target}] foreign rules changed"
        );
    });
}

/// A LoadBalancer service with externalTrafficPolicy Local on the lab's node: the agent
/// serves its health-check node port as kube-proxy does (200 and the count with a local
/// endpoint, 503 without), `/healthz` and `/livez` answer 200 once the node is synced, and
/// `/metrics` (inside the node, on 127.0.0.1) passes `promtool check metrics` with the
/// syncs counted.
#[test]
fn the_agent_serves_health_checks_healthz_and_metrics() {
    use super::serve::get;
    for_each_target("kernel agent: health checks, healthz, metrics", |target| {
        let lab = Lab::new(&format!("ags{}", &target[..3]), &LabSpec::default()).expect("lab");
        let (dir, state, logs) = (
            TempDir::new("agent-in"),
            TempDir::new("agent-state"),
            TempDir::new("agent-log"),
        );
        let lb = |ep: &str, node: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: lb, namespace: shop}}\n\
                 spec:\n  type: LoadBalancer\n  externalTrafficPolicy: Local\n  clusterIP: 10.96.0.30\n  \
                 healthCheckNodePort: 32100\n  selector: {{app: lb}}\n  \
                 ports:\n  - {{port: 80, targetPort: 8080, nodePort: 30100}}\n---\n\
                 apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                 metadata:\n  name: lb-1\n  namespace: shop\n  labels: {{kubernetes.io/service-name: lb}}\n\
                 addressType: IPv4\nports:\n- {{port: 8080, protocol: TCP}}\n\
                 endpoints:\n- {{addresses: [{ep}], nodeName: {node}}}\n"
            )
        };
        inputs(dir.path(), &lb("10.244.1.2", "node-1"));
        let svc_yaml = dir.path().join("svc.yaml");
        let agent = Agent::started(
            &lab,
            target,
            (&dir, &state, &logs),
            &["--sync-period", "1h"],
        );
        let node: std::net::IpAddr = "192.0.2.10".parse().unwrap();
        let hc = SocketAddr::new(node, 32100);
        let g = get(&lab, "client1", hc, "/");
        assert_eq!(g.status, 200, "[{target}] {}", g.body);
        assert_eq!(g.header("X-Load-Balancing-Endpoint-Weight"), Some("1"));
        assert!(
            g.body.contains("\"localEndpoints\": 1"),
            "[{target}] {}",
            g.body
        );
        // The endpoint moves to node-2: no local endpoint here.
        let before = agent.syncs().len();
        replace(&svc_yaml, &lb("10.244.2.2", "node-2"));
        assert_eq!(result(&wait_for(&agent, before, |_| true)), "applied");
        let g = get(&lab, "client1", hc, "/");
        assert_eq!(g.status, 503, "[{target}] {}", g.body);
        assert!(
            g.body.contains("\"localEndpoints\": 0"),
            "[{target}] {}",
            g.body
        );
        for path in ["/healthz", "/livez"] {
            let g = get(&lab, "client1", SocketAddr::new(node, 10256), path);
            assert_eq!(g.status, 200, "[{target}] {path}: {}", g.body);
            assert!(
                g.body.contains("\"healthy\":true"),
                "[{target}] {path}: {}",
                g.body
            );
        }
        let metrics = get(&lab, "node", "127.0.0.1:10249".parse().unwrap(), "/metrics");
        assert_eq!(metrics.status, 200);
        let syncs = metrics
            .body
            .lines()
            .find(|l| {
                l.starts_with(
                    "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}",
                )
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
        assert_eq!(syncs, Some(2), "[{target}] {}", metrics.body);
        let mut promtool = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool (Debian package prometheus; .ci/run installs it)");
        promtool
            .stdin
            .take()
            .unwrap()
            .write_all(metrics.body.as_bytes())
            .unwrap();
        let out = promtool.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "[{target}] promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// `/healthz` follows the node's Node manifest as kube-proxy's follows the Node object:
/// 503 with `nodeEligible: false` while node-1 is tainted `ToBeDeletedByClusterAutoscaler`
/// or has a `deletionTimestamp`, 200 again when neither; `/livez` stays 200 throughout.
#[test]
fn healthz_says_a_node_being_deleted_is_not_eligible() {
    use super::serve::get;
    for_each_target("kernel agent: healthz and the Node", |target| {
        let lab = Lab::new(&format!("agh{}", &target[..3]), &LabSpec::default()).expect("lab");
        let (dir, state, logs) = (
            TempDir::new("agent-in"),
            TempDir::new("agent-state"),
            TempDir::new("agent-log"),
        );
        inputs(dir.path(), &manifests(V1_API, CHAT));
        let nodes_yaml = dir.path().join("nodes.yaml");
        let nodes = std::fs::read_to_string(&nodes_yaml).unwrap();
        let node_1 = "metadata:\n  name: node-1\n";
        assert!(nodes.contains(node_1));
        let agent = Agent::started(
            &lab,
            target,
            (&dir, &state, &logs),
            &["--sync-period", "1h"],
        );
        let healthz = SocketAddr::new("192.0.2.10".parse().unwrap(), 10256);
        let check = |when: &str, eligible: bool| {
            let g = get(&lab, "client1", healthz, "/healthz");
            assert_eq!(
                (
                    g.status,
                    g.body.contains(&format!("\"nodeEligible\":{eligible}"))
                ),
                (if eligible { 200 } else { 503 }, true),
                "[{target}] /healthz {when}: {}",
                g.body
            );
            let l = get(&lab, "client1", healthz, "/livez");
            assert_eq!(l.status, 200, "[{target}] /livez {when}: {}", l.body);
        };
        check("at start", true);
        // node-1's spec comes first in the file.
        let spec_1 = "spec:\n  podCIDRs: [10.244.1.0/24]\n";
        let taints = |list: &str| nodes.replacen(spec_1, &format!("{spec_1}  taints:\n{list}"), 1);
        for (when, text, eligible) in [
            (
                "tainted for deletion",
                taints(
                    "  - {key: node.kubernetes.io/unschedulable, effect: NoSchedule}\n  \
                     - {key: ToBeDeletedByClusterAutoscaler, value: \"1767225600\", effect: NoSchedule}\n",
                ),
                false,
            ),
            (
                "tainted otherwise",
                taints("  - {key: DeletionCandidateOfClusterAutoscaler, value: \"1767225600\", effect: PreferNoSchedule}\n"),
                true,
            ),
            (
                "being deleted",
                nodes.replacen(
                    node_1,
                    &format!("{node_1}  deletionTimestamp: \"2026-01-01T00:00:00Z\"\n"),
                    1,
                ),
                false,
            ),
            ("as before", nodes.clone(), true),
        ] {
            assert!(
                when == "as before" || text != nodes,
                "[{target}] {when}: the edit missed"
            );
            let before = agent.syncs().len();
            replace(&nodes_yaml, &text);
            let s = wait_for(&agent, before, |_| true);
            assert_eq!(result(&s), "applied", "[{target}] {when}: {}", agent.said());
            check(when, eligible);
        }
    });
}

/// The agent's metrics move as kube-proxy's would over a series of real changes, checked
/// with exact counts after each: a Service or EndpointSlice added, changed or removed is
/// one change (an edit that moves objects in their file without changing them is none);
/// a changed slice's `last-change-trigger-time` starts its network programming latency,
/// observed once at the end of the sync that programs it (a trigger time before the
/// agent's start, or a removed slice, is not); the compile, plan and kernel histograms
/// count each compile and each family's apply; manifests with errors count a rejected
/// sync and nothing else; a foreign write mended counts one drift repair. The exposition
/// stays clean under `promtool check metrics`.
#[test]
fn the_agent_metrics_count_changes_latencies_rejections_and_repairs() {
    use super::serve::get;
    for_each_target("kernel agent: metrics", |target| {
        let lab = Lab::new(&format!("agm{}", &target[..3]), &LabSpec::default()).expect("lab");
        let (dir, state, logs) = (
            TempDir::new("agent-in"),
            TempDir::new("agent-state"),
            TempDir::new("agent-log"),
        );
        let rfc3339 = |t: std::time::SystemTime| {
            let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
            let out = Command::new("date")
                .args([
                    "-u",
                    "-d",
                    &format!("@{}.{:09}", d.as_secs(), d.subsec_nanos()),
                    "+%Y-%m-%dT%H:%M:%S.%NZ",
                ])
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        // Written before the agent starts.
        let t0 = rfc3339(std::time::SystemTime::now());
        // `web` and `db`, each with one slice; the comment, web's endpoint and trigger
        // time, db's port and whether db's slice is there vary (db's slice says `t0`).
        let manifests = |comment: &str,
                         web_ep: &str,
                         trigger: &str,
                         db_port: u16,
                         db_slice: bool| {
            let service = |name: &str, ip: &str, port: u16| {
                format!(
                    "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\n\
                     spec:\n  clusterIP: {ip}\n  ports:\n  - {{port: {port}, targetPort: 8080}}\n---\n"
                )
            };
            let slice = |name: &str, svc: &str, ep: &str, trigger: &str| {
                format!(
                    "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                     metadata:\n  name: {name}\n  namespace: shop\n  labels: {{kubernetes.io/service-name: {svc}}}\n  \
                     annotations: {{endpoints.kubernetes.io/last-change-trigger-time: \"{trigger}\"}}\n\
                     addressType: IPv4\nports:\n- {{port: 8080, protocol: TCP}}\n\
                     endpoints:\n- {{addresses: [{ep}], nodeName: node-1}}\n---\n"
                )
            };
            let mut text = comment.to_string();
            text += &service("web", "10.96.0.40", 80);
            text += &slice("web-1", "web", web_ep, trigger);
            text += &service("db", "10.96.0.41", db_port);
            if db_slice {
                text += &slice("db-1", "db", "10.244.1.3", &t0);
            }
            text
        };
        inputs(dir.path(), &manifests("", "10.244.1.2", &t0, 5432, true));
        let svc_yaml = dir.path().join("svc.yaml");
        let mut agent = Agent::started(
            &lab,
            target,
            (&dir, &state, &logs),
            &["--sync-period", "1h"],
        );
        let scrape = || {
            let m = get(&lab, "node", "127.0.0.1:10249".parse().unwrap(), "/metrics");
            assert_eq!(m.status, 200, "[{target}] {}", m.body);
            m.body
        };
        let value = |body: &str, key: &str| -> f64 {
            body.lines()
                .find_map(|l| {
                    let (k, v) = l.rsplit_once(' ')?;
                    (k == key).then(|| v.parse::<f64>().unwrap())
                })
                .unwrap_or(0.0)
        };
        const V4: &str = "{ip_family=\"IPv4\"}";
        let keys = [
            "kubeproxy_sync_proxy_rules_service_changes_total".to_string(),
            "kubeproxy_sync_proxy_rules_endpoint_changes_total".to_string(),
            format!("kubeproxy_network_programming_duration_seconds_count{V4}"),
            "svc_compile_agent_compile_duration_seconds_count".to_string(),
            format!("svc_compile_agent_plan_duration_seconds_count{V4}"),
            format!("svc_compile_agent_kernel_duration_seconds_count{V4}"),
            "svc_compile_agent_rejected_syncs_total".to_string(),
            format!("svc_compile_agent_drift_repairs_total{V4}"),
        ];
        // [service changes, endpoint changes, latencies, compiles, plans, kernels,
        // rejected, repairs]
        let expect = |when: &str, want: [u32; 8]| {
            let body = scrape();
            let got: Vec<f64> = keys.iter().map(|k| value(&body, k)).collect();
            let want: Vec<f64> = want.iter().map(|&w| f64::from(w)).collect();
            assert_eq!(
                got,
                want,
                "[{target}] {when}: {keys:?}\n{body}\n{}",
                agent.said()
            );
            body
        };
        let edit = |agent: &Agent, text: &str, when: &str, applied: bool| {
            let before = agent.syncs().len();
            replace(&svc_yaml, text);
            let s = wait_for(agent, before, |_| true);
            let want = if applied { "applied" } else { "rejected" };
            assert_eq!(result(&s), want, "[{target}] {when}: {}", agent.said());
        };
        // Everything is added at the start; the trigger time is older than the agent.
        expect("at start", [2, 2, 0, 1, 1, 1, 0, 0]);

        // web's endpoint moves; its slice says the change was triggered 1.5 s ago (after
        // the agent started: it started more than 2 s ago).
        thread::sleep(Duration::from_secs(2));
        let trigger = std::time::SystemTime::now() - Duration::from_millis(1500);
        let trigger = rfc3339(trigger);
        let v2 = manifests("", "10.244.1.4", &trigger, 5432, true);
        edit(&agent, &v2, "an endpoint moved", true);
        let body = expect("an endpoint moved", [2, 3, 1, 2, 2, 2, 0, 0]);
        let npd = "kubeproxy_network_programming_duration_seconds";
        let sum = value(&body, &format!("{npd}_sum{V4}"));
        assert!(
            (1.5..1.5 + WAIT.as_secs_f64()).contains(&sum),
            "[{target}] latency {sum} s, not from the trigger time"
        );
        let le = |b: &str| {
            value(
                &body,
                &format!("{npd}_bucket{{ip_family=\"IPv4\",le=\"{b}\"}}"),
            )
        };
        assert_eq!((le("1"), le("+Inf")), (0.0, 1.0), "[{target}] {body}");

        // A comment above everything moves every object in the file: no change.
        edit(
            &agent,
            &format!("# moved down a line\n{v2}"),
            "a comment",
            true,
        );
        expect("a comment", [2, 3, 1, 3, 3, 3, 0, 0]);

        // db's port: one Service change.
        let v4 = manifests("", "10.244.1.4", &trigger, 5433, true);
        edit(&agent, &v4, "a port", true);
        expect("a port", [3, 3, 1, 4, 4, 4, 0, 0]);

        // Errors: rejected, compiled, nothing else.
        edit(&agent, &format!("{v4}kind: [\n"), "errors", false);
        expect("errors", [3, 3, 1, 5, 4, 4, 1, 0]);

        // db's slice removed (counted from the last applied sync): a change, no latency.
        let v6 = manifests("", "10.244.1.4", &trigger, 5433, false);
        edit(&agent, &v6, "a slice removed", true);
        expect("a slice removed", [3, 4, 1, 6, 5, 5, 1, 0]);

        // One sync sees db's port changed and another file broken (held open for writing
        // while svc.yaml is replaced): rejected. Once the broken file is gone, the port
        // change is counted, though svc.yaml was parsed by the rejected sync already.
        // Named to sort after svc.yaml: removing it moves no other file's id.
        let extra = dir.path().join("zz-broken.yaml");
        let mut broken = std::fs::File::create(&extra).unwrap();
        let before = agent.syncs().len();
        replace(
            &svc_yaml,
            &manifests("", "10.244.1.4", &trigger, 5434, false),
        );
        thread::sleep(Duration::from_millis(50));
        broken.write_all(b"kind: [\n").unwrap();
        drop(broken);
        assert_eq!(
            result(&wait_for(&agent, before, |_| true)),
            "rejected",
            "[{target}] {}",
            agent.said()
        );
        expect("a change beside errors", [3, 4, 1, 7, 5, 5, 2, 0]);
        let before = agent.syncs().len();
        std::fs::remove_file(&extra).unwrap();
        assert_eq!(result(&wait_for(&agent, before, |_| true)), "applied");
        expect("the errors gone", [4, 4, 1, 8, 6, 6, 2, 0]);

        // Someone flushes our rules; SIGHUP's sync finds and mends it.
        let good = flush_services(&lab, target);
        let before = agent.syncs().len();
        agent.signal(libc::SIGHUP);
        assert_eq!(result(&wait_for(&agent, before, |_| true)), "applied");
        assert_eq!(owned(&lab, target), good, "[{target}] not mended");
        let body = expect("a foreign write mended", [4, 4, 1, 9, 7, 7, 2, 1]);

        let mut promtool = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool (Debian package prometheus; .ci/run installs it)");
        promtool
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        let out = promtool.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "[{target}] promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        agent.signal(libc::SIGTERM);
        assert_eq!(agent.exit(), 0);
    });
}
