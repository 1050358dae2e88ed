//! `cargo bench --bench agent`: what a resident `svc-compile agent` costs per change, in a
//! throwaway network namespace per target and size, against issue 30's budgets.
//!
//! The manifests are split into files of 100 services each (a repository's layout, not one
//! dump). Per size and target: the agent's first sync; then, repeated, one service's
//! endpoints changed (its file renamed into place) timed from just before the rename to the
//! agent's log line for that sync (the kernel updated and verified); a file rewritten with
//! the same bytes (the agent's CPU time for it, from /proc); and a series of changes after
//! which the agent's RSS and open file descriptors are compared with the first ones. For
//! iptables, `iptables-restore --noflush` of the delta the agent loaded (its `load.rules`)
//! is timed alone, the budget's yardstick. The one-shot `svc-compile compile` of the same
//! node gives the peak RSS the agent's is held against.
//!
//! Environment: `SVC_BENCH_SIZES` (default `10000x10`), `SVC_BENCH_TARGETS` (default
//! `nftables:fast,nftables,iptables`), `SVC_BENCH_CHANGES` (default 100: the series for the
//! RSS and descriptor check), `SVC_BENCH_BIN`. Needs root; otherwise says so and exits 0.
mod support;

use support::Netns;
use svc_node::sys::libc;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PER_FILE: usize = 100;
const REPEATS: usize = 7;

fn main() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: agent benchmark: needs root (network namespaces)");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bin = support::bin();
    let sizes = support::sizes("10000x10");
    let targets = support::targets("nftables:fast,nftables,iptables");
    let changes: usize = std::env::var("SVC_BENCH_CHANGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let work = std::env::temp_dir().join(format!("svc-compile-agent-bench-{}", std::process::id()));
    let mut verdicts = Vec::new();
    for &(services, endpoints) in &sizes {
        for spec in &targets {
            let (target, extra): (&str, Vec<&str>) = match spec.split_once(':') {
                Some((t, layout)) => (t, vec!["--nft-layout", layout]),
                None => (spec.as_str(), vec![]),
            };
            let tag = format!("{services}x{endpoints} {spec}");
            let dir = work.join(format!("{services}x{endpoints}-{}", spec.replace(':', "-")));
            let _ = std::fs::remove_dir_all(&dir);
            let inputs = dir.join("in");
            let state = dir.join("state");
            std::fs::create_dir_all(&inputs).unwrap();
            for f in 0..services.div_ceil(PER_FILE) {
                std::fs::write(
                    inputs.join(format!("svc-{f:04}.yaml")),
                    file(f, services, endpoints, 0),
                )
                .unwrap();
            }
            for f in ["nodes.yaml", "kube-proxy.yaml"] {
                std::fs::copy(root.join("golden/common").join(f), inputs.join(f)).unwrap();
            }
            let netns = Netns::new(&format!("svcagb-{}-{}", std::process::id(), verdicts.len()));
            let once = compile_peak(&bin, &inputs, target, &extra);
            let mut agent = Agent::start(&bin, &inputs, &state, target, &extra, &netns.0);
            let first = agent.wait_sync(1, Duration::from_secs(600));
            println!("{tag}: first sync {} ms", first.ms);
            // RSS once what the sync freed went back (mimalloc's purge delay is 1 s).
            std::thread::sleep(Duration::from_millis(1500));
            let rss0 = agent.rss_kb();
            let fds0 = agent.fds();

            // One service's endpoints changed, from the rename to the sync's log line.
            let mut took = Vec::new();
            let mut deltas = Vec::new();
            for r in 1..=REPEATS {
                let t = Instant::now();
                rename_into(&inputs, 0, &file(0, services, endpoints, r));
                let s = agent.wait_sync(agent.synced + 1, Duration::from_secs(120));
                took.push(t.elapsed());
                assert_eq!(s.result, "applied", "{tag}: {}", agent.said());
                if target == "iptables" {
                    deltas.push(delta_restore(&state, &netns.0));
                }
            }
            let one = median(&mut took);
            println!(
                "{tag}: one service's endpoints: median {:.1} ms over {REPEATS} (each {:?})",
                ms(one),
                took.iter()
                    .map(|d| format!("{:.0}", ms(*d)))
                    .collect::<Vec<_>>()
            );
            if let Some(line) = agent.times_after(first.index) {
                println!("{tag}:   last sync's phases: {line}");
            }

            // The same bytes again: CPU only.
            let mut cpu = Vec::new();
            for _ in 0..REPEATS {
                let before = agent.cpu();
                rename_into(&inputs, 1, &file(1, services, endpoints, 0));
                agent.wait_sync(agent.synced + 1, Duration::from_secs(120));
                cpu.push(agent.cpu() - before);
            }
            let same = median(&mut cpu);
            println!("{tag}: same bytes rewritten: median {:.1} ms CPU", ms(same));

            // A series of changes: RSS and descriptors.
            for c in 0..changes {
                rename_into(
                    &inputs,
                    c % 3,
                    &file(c % 3, services, endpoints, REPEATS + 1 + c),
                );
                agent.wait_sync(agent.synced + 1, Duration::from_secs(120));
            }
            std::thread::sleep(Duration::from_millis(1500));
            let (rss1, fds1) = (agent.rss_kb(), agent.fds());
            let growth = (rss1 - rss0) as f64 * 100.0 / rss0 as f64;
            println!(
                "{tag}: after {changes} changes: RSS {rss0} → {rss1} kB ({growth:+.1} %), fds {fds0} → {fds1}; agent peak {} kB, one-shot compile peak {} kB ({:.2}×)",
                agent.peak_kb(),
                once,
                agent.peak_kb() as f64 / once as f64
            );
            let budget = match (target, extra.is_empty()) {
                ("nftables", false) => Some(("≤ 50 ms", Duration::from_millis(50))),
                ("nftables", true) => Some(("≤ 100 ms", Duration::from_millis(100))),
                _ => None,
            };
            if let Some((b, d)) = budget {
                verdicts.push(format!(
                    "{tag}: one change {:.1} ms, budget {b}: {}",
                    ms(one),
                    held(one <= d)
                ));
            }
            if !deltas.is_empty() {
                let raw = median(&mut deltas);
                let ratio = ms(one) / ms(raw);
                verdicts.push(format!(
                    "{tag}: one change {:.1} ms vs iptables-restore --noflush of the delta {:.1} ms: {ratio:.2}×, budget ≤ 1.2×: {}",
                    ms(one),
                    ms(raw),
                    held(ratio <= 1.2)
                ));
            }
            verdicts.push(format!(
                "{tag}: same bytes {:.1} ms CPU, budget ≤ 5 ms: {}",
                ms(same),
                held(same <= Duration::from_millis(5))
            ));
            let ratio = agent.peak_kb() as f64 / once as f64;
            verdicts.push(format!(
                "{tag}: agent peak RSS {:.2}× the one-shot compile's, budget ≤ 1.5×: {}",
                ratio,
                held(ratio <= 1.5)
            ));
            verdicts.push(format!(
                "{tag}: RSS over {changes} changes {growth:+.1} %, budget ≤ 5 %: {}; fds {fds0} → {fds1}: {}",
                held(growth <= 5.0),
                held(fds1 <= fds0)
            ));
            agent.stop();
        }
    }
    println!("\nbudgets:");
    for v in &verdicts {
        println!("  {v}");
    }
    let _ = std::fs::remove_dir_all(&work);
}

fn held(ok: bool) -> &'static str {
    if ok {
        "held"
    } else {
        "NOT held"
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// File `f` of the manifests: services `f*100 ..`, with service `f*100`'s first endpoint
/// in variant `v` (0 = as generated).
fn file(f: usize, services: usize, endpoints: usize, v: usize) -> String {
    let mut out = String::new();
    for i in f * PER_FILE..((f + 1) * PER_FILE).min(services) {
        let ip = format!(
            "10.{}.{}.{}",
            96 + (i + 1) / 65536,
            (i + 1) / 256 % 256,
            (i + 1) % 256
        );
        let (kind, np) = if i % 4 == 0 && i < 8000 {
            ("NodePort", format!(", nodePort: {}", 30000 + i / 4))
        } else {
            ("ClusterIP", String::new())
        };
        out += &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\n\
             spec:\n  type: {kind}\n  clusterIP: {ip}\n  selector: {{app: svc-{i}}}\n  \
             ports:\n  - {{name: http, port: 80, targetPort: 8080{np}}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata:\n  name: svc-{i}-1\n  namespace: bench\n  labels: {{kubernetes.io/service-name: svc-{i}}}\n\
             addressType: IPv4\nports:\n- {{name: http, port: 8080, protocol: TCP}}\nendpoints:\n"
        );
        for e in 0..endpoints {
            let n = i * endpoints + e;
            let addr = if e == 0 && i == f * PER_FILE && v > 0 {
                format!("10.255.{}.{}", v / 250 % 250, v % 250 + 1)
            } else {
                format!(
                    "10.{}.{}.{}",
                    128 + n / 62500 % 64,
                    n / 250 % 250,
                    n % 250 + 1
                )
            };
            out += &format!("- {{addresses: [{addr}], nodeName: node-{}}}\n", e % 2 + 1);
        }
        out += "---\n";
    }
    out
}

fn rename_into(dir: &Path, f: usize, text: &str) {
    let tmp = dir.join(format!(".svc-{f:04}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(format!("svc-{f:04}.yaml"))).unwrap();
}

/// `iptables-restore --noflush` of the agent's last loaded delta, in its namespace (the
/// chains it names are rewritten with what they hold).
fn delta_restore(state: &Path, netns: &str) -> Duration {
    let doc = state.join("iptables-ipv4/load.rules");
    let t = Instant::now();
    let ok = Command::new("ip")
        .args(["netns", "exec", netns, "iptables-restore", "--noflush"])
        .stdin(std::fs::File::open(&doc).unwrap())
        .status()
        .is_ok_and(|s| s.success());
    let took = t.elapsed();
    assert!(ok, "iptables-restore --noflush {}", doc.display());
    took
}

/// Peak RSS (kB) of `svc-compile compile` of the same node.
fn compile_peak(bin: &str, inputs: &Path, target: &str, extra: &[&str]) -> i64 {
    let child = Command::new(bin)
        .arg("compile")
        .arg(inputs)
        .args(["--node", "node-1", "--target", target, "-o", "/dev/null"])
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 on our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: reaping the child we spawned.
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }, pid);
    std::mem::forget(child);
    usage.ru_maxrss
}

struct Sync {
    index: usize,
    ms: String,
    result: String,
}

struct Agent {
    child: Option<Child>,
    log: PathBuf,
    synced: usize,
}

impl Agent {
    fn start(
        bin: &str,
        inputs: &Path,
        state: &Path,
        target: &str,
        extra: &[&str],
        netns: &str,
    ) -> Agent {
        let log = inputs.with_file_name("agent.log");
        let child = Command::new(bin)
            .env("SVC_COMPILE_APPLY_TIMES", "1")
            .arg("agent")
            .arg(inputs)
            .args(["--node", "node-1", "--target", target, "--netns", netns])
            .args(["--sync-period", "1h", "--log-format", "json"])
            .arg("--state-dir")
            .arg(state)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Agent {
            child: Some(child),
            log,
            synced: 0,
        }
    }

    fn said(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the `n`th sync line (polling every millisecond).
    fn wait_sync(&mut self, n: usize, limit: Duration) -> Sync {
        let end = Instant::now() + limit;
        loop {
            let text = self.said();
            let syncs: Vec<(usize, serde_json::Value)> = text
                .lines()
                .enumerate()
                .filter_map(|(i, l)| Some((i, serde_json::from_str::<serde_json::Value>(l).ok()?)))
                .filter(|(_, v)| v["event"] == "sync")
                .collect();
            if let Some((i, s)) = syncs.get(n - 1) {
                self.synced = n;
                return Sync {
                    index: *i,
                    ms: s["ms"].as_str().unwrap_or("").into(),
                    result: s["result"].as_str().unwrap_or("").into(),
                };
            }
            assert!(Instant::now() < end, "no sync {n}: {}", self.said());
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The times lines (`SVC_COMPILE_APPLY_TIMES`: the compile's, then each family's
    /// apply) of the last sync.
    fn times_after(&self, _first: usize) -> Option<String> {
        let text = self.said();
        let lines: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("svc-compile: times: "))
            .collect();
        let from = lines.iter().rposition(|l| l.starts_with("compile"))?;
        Some(lines[from..].join("\n    "))
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn status(&self, key: &str) -> i64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    fn rss_kb(&self) -> i64 {
        self.status("VmRSS:")
    }

    fn peak_kb(&self) -> i64 {
        self.status("VmHWM:")
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |d| d.count())
    }

    /// CPU time so far, all threads (the scheduler's nanoseconds, /proc/PID/task/*/schedstat).
    fn cpu(&self) -> Duration {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid())).unwrap();
        let ns: u64 = tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum();
        Duration::from_nanos(ns)
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: a signal to our own unreaped child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
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
