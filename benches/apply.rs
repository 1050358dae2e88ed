//! `cargo bench --bench apply`: what `svc-compile apply` costs at scale (issue 13), in a
//! throwaway network namespace per target and size, against the budgets.
//!
//! Per size (services × endpoints) and target, in order, on one node: the first apply into
//! an empty namespace, the same input again (nothing changed), one service's endpoints
//! changed, one service added, that service removed, 100 services' endpoints changed, and
//! the same again after someone else put a rule in our services dispatch chain (mended).
//! Each is the wall time of one `svc-compile apply` process (compiling included) and the
//! apply's report. Then, in the same run: the raw load of the first apply's document by
//! hand (`iptables-restore --noflush` / `nft -f`) into another empty namespace, and the
//! peak RSS of the first apply (its own, from its times line, and with its tools, from
//! `wait4`) against that of
//! `svc-compile compile` of the same node. Every budget is printed as held or not held.
//!
//! Environment: `SVC_BENCH_SIZES` (default `1000x10`; e.g. `1000x10,10000x10,30000x10,5000x50`),
//! `SVC_BENCH_TARGETS` (default `iptables,nftables`; `nftables:fast` is nftables with
//! `--nft-layout fast`), `SVC_BENCH_BIN` (another svc-compile binary). A size with 50
//! endpoints runs for nftables only (the 5k × 50). Needs root and iproute2;
//! otherwise it says so and exits 0.
mod support;

use support::Netns;
use svc_node::sys::libc;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: apply benchmark: needs root (network namespaces)");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bin = support::bin();
    let sizes = support::sizes("1000x10");
    let targets = support::targets("iptables,nftables");
    let work = std::env::temp_dir().join(format!("svc-compile-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let mut verdicts: Vec<String> = Vec::new();

    for &(services, endpoints) in &sizes {
        let versions = [
            ("base", Change::None),
            ("endpoints", Change::Endpoints(1)),
            ("added", Change::Added),
            ("endpoints", Change::Endpoints(1)), // the added one removed again
            ("hundred", Change::Endpoints(100)),
        ];
        for (name, change) in &versions {
            let dir = work.join(format!("{services}x{endpoints}/{name}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(
                dir.join("services.yaml"),
                manifest(services, endpoints, *change),
            )
            .unwrap();
        }
        for spec in &targets {
            // `TARGET` or `TARGET:LAYOUT` (nftables' `--nft-layout`).
            let (target, extra): (&str, Vec<&str>) = match spec.split_once(':') {
                Some((t, layout)) => (t, vec!["--nft-layout", layout]),
                None => (spec, vec![]),
            };
            let target = &target.to_string();
            if endpoints > 10 && target != "nftables" {
                continue;
            }
            let tag = format!(
                "{services}x{endpoints}-{}{}",
                &target[..3],
                extra.last().map(|l| &l[..1]).unwrap_or("")
            );
            let input = |v: &str| work.join(format!("{services}x{endpoints}/{v}"));
            let ns = Netns::new(&format!("svcb-{}-{tag}", std::process::id()));
            let state = work.join(format!("state-{tag}"));
            println!("\n{spec}, {services} services × {endpoints} endpoints (node-1):");
            // Someone else's rule at the top of our services dispatch chain (it only
            // counts), put in before the last step: found and mended by that apply.
            let foreign: &[&str] = match target.as_str() {
                "iptables" => &["iptables", "-t", "nat", "-I", "KUBE-SERVICES"],
                _ => &[
                    "nft",
                    "insert",
                    "rule",
                    "ip",
                    "kube-proxy",
                    "services",
                    "counter",
                ],
            };
            let steps: [(&str, &str, bool); 7] = [
                ("first apply (full)", "base", false),
                ("nothing changed", "base", false),
                ("one service's endpoints changed", "endpoints", false),
                ("one service added", "added", false),
                ("one service removed", "endpoints", false),
                ("100 services changed", "hundred", false),
                ("a foreign rule in our chain mended", "hundred", true),
            ];
            let mut took: Vec<Duration> = Vec::new();
            let mut cpus: Vec<Duration> = Vec::new();
            let (mut apply_rss, mut own_rss) = (0, None);
            for (i, (what, v, foreign_first)) in steps.iter().enumerate() {
                if *foreign_first {
                    let ok = Command::new("ip")
                        .args(["netns", "exec", &ns.0])
                        .args(foreign)
                        .status()
                        .is_ok_and(|s| s.success());
                    assert!(ok, "{foreign:?} failed");
                }
                let run = apply(&bin, &root, &input(v), target, &extra, &ns.0, &state);
                println!(
                    "  {what:<34} {:>9} ms  (cpu {:>7} ms)   {}",
                    run.took.as_millis(),
                    run.cpu.as_millis(),
                    run.report
                );
                if i == 0 {
                    apply_rss = run.max_rss_kb;
                    own_rss = run.own_rss_kb;
                    // What the first apply loaded (nftables: the compiled objects grouped).
                    let load = state.join(format!("{target}-ipv4/load.{}", ext_of(target)));
                    let _ = std::fs::copy(load, work.join(format!("first-load-{tag}")));
                }
                took.push(run.took);
                cpus.push(run.cpu);
            }
            // The raw load of the first apply's full document, in an empty namespace.
            let ext = ext_of(target);
            let raw_doc = work.join(format!("raw-{tag}.{ext}"));
            let first_doc = compile(&bin, &root, &input("base"), target, &extra);
            let full_doc = match target.as_str() {
                "nftables" => first_doc.text,
                // iptables: apply's full load declares and fills the same chains.
                _ => first_doc.text,
            };
            std::fs::write(&raw_doc, full_doc).unwrap();
            let raw_ns = Netns::new(&format!("svcb-{}-{tag}-raw", std::process::id()));
            let raw = match target.as_str() {
                "iptables" => timed(
                    &[
                        "ip",
                        "netns",
                        "exec",
                        &raw_ns.0,
                        "iptables-restore",
                        "--noflush",
                    ],
                    &raw_doc,
                ),
                _ => timed(&["ip", "netns", "exec", &raw_ns.0, "nft", "-f"], &raw_doc),
            };
            let raw_tool = if target == "iptables" {
                "iptables-restore --noflush"
            } else {
                "nft -f"
            };
            println!(
                "  {:<34} {:>9} ms  (cpu {:>7} ms)",
                format!("raw `{raw_tool}` of the document"),
                raw.took.as_millis(),
                raw.cpu.as_millis()
            );
            // nftables: the same raw load of what the first apply itself loaded (the
            // compiled objects grouped), in a third namespace: how much of the apply's
            // lead is that form.
            if target == "nftables" {
                let grouped_ns = Netns::new(&format!("svcb-{}-{tag}-grp", std::process::id()));
                let grouped = timed(
                    &["ip", "netns", "exec", &grouped_ns.0, "nft", "-f"],
                    &work.join(format!("first-load-{tag}")),
                );
                println!(
                    "  {:<34} {:>9} ms  (cpu {:>7} ms)   first apply ÷ it: {:.2}×",
                    "raw `nft -f` of the apply's load",
                    grouped.took.as_millis(),
                    grouped.cpu.as_millis(),
                    took[0].as_secs_f64() / grouped.took.as_secs_f64().max(1e-9)
                );
            }
            let own_rss = own_rss.expect("the first apply's own peak RSS (its times line)");
            println!(
                "  peak RSS: apply {} MB itself, {} MB with its tools; compile {} MB; the raw load's tool {} MB",
                own_rss / 1024,
                apply_rss / 1024,
                first_doc.max_rss_kb / 1024,
                raw.max_rss_kb / 1024
            );
            let mut verdict = |budget: String, held: bool| {
                let line = format!(
                    "{spec} {services}×{endpoints}: {budget}: {}",
                    if held { "held" } else { "NOT held" }
                );
                println!("  budget: {line}");
                verdicts.push(line);
            };
            let ratio = took[0].as_secs_f64() / raw.took.as_secs_f64().max(1e-9);
            // CPU time too: on a shared machine wall time is mostly waiting for a CPU.
            let cpu_ratio = cpus[0].as_secs_f64() / raw.cpu.as_secs_f64().max(1e-9);
            verdict(
                format!("first apply ≤ 1.2× the raw load ({ratio:.2}× wall, {cpu_ratio:.2}× CPU)"),
                ratio <= 1.2,
            );
            if services == 10_000 {
                verdict(
                    format!("one changed service ≤ 150 ms ({} ms)", took[2].as_millis()),
                    took[2] <= Duration::from_millis(150),
                );
                verdict(
                    format!("nothing changed ≤ 100 ms ({} ms)", took[1].as_millis()),
                    took[1] <= Duration::from_millis(100),
                );
            }
            // svc-compile's own memory against compile's; the loader's own (the raw load
            // shows what it takes alone) is beside it.
            let rss = own_rss as f64 / (first_doc.max_rss_kb as f64).max(1.0);
            let with_tools = apply_rss as f64 / (first_doc.max_rss_kb as f64).max(1.0);
            verdict(
                format!(
                    "peak RSS of apply ≤ 2× compile ({rss:.2}× itself; {with_tools:.2}× with its tools, whose raw load alone is {:.2}×)",
                    raw.max_rss_kb as f64 / (first_doc.max_rss_kb as f64).max(1.0)
                ),
                rss <= 2.0,
            );
        }
    }
    println!("\nbudgets (the one-service and nothing-changed budgets are for 10k services):");
    for v in &verdicts {
        println!("  {v}");
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// The extension of a target's documents in the state directory (its registry entry's).
fn ext_of(target: &str) -> &'static str {
    svc_targets::TARGETS
        .iter()
        .find(|t| t.name == target)
        .expect("a target of the registry")
        .ext
}

#[derive(Clone, Copy)]
enum Change {
    None,
    /// The first endpoint of this many services moves.
    Endpoints(usize),
    /// One more service.
    Added,
}

/// One finished process: wall time, peak RSS in kB (its own and its reaped children's),
/// stdout.
struct Ran {
    took: Duration,
    max_rss_kb: i64,
    /// User + system CPU time of it and its reaped children: what load on the machine
    /// inflates least.
    cpu: Duration,
    text: String,
    report: String,
    /// svc-compile's own peak RSS in kB, without its tools (from its times line).
    own_rss_kb: Option<i64>,
}

fn run(mut cmd: Command) -> Ran {
    let start = Instant::now();
    let out_path = std::env::temp_dir().join(format!(
        "svc-compile-bench-out-{}-{}",
        std::process::id(),
        start.elapsed().as_nanos()
    ));
    let out = std::fs::File::create(&out_path).unwrap();
    // Reaped by wait4 below, for its resource usage.
    #[allow(clippy::zombie_processes)]
    let mut child = cmd
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run svc-compile");
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 on our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    // SAFETY: waiting for the child we spawned (reaped here, not by `child.wait`).
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let took = start.elapsed();
    assert_eq!(r, pid, "wait4");
    let text = std::fs::read_to_string(&out_path).unwrap();
    let _ = std::fs::remove_file(&out_path);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{cmd:?} failed: {stderr}"
    );
    let mut report = text
        .lines()
        .find(|l| l.starts_with("svc-compile: "))
        .map(|l| l.split(": ").skip(2).collect::<Vec<_>>().join(": "))
        .unwrap_or_default();
    // Where the apply's time went (SVC_COMPILE_APPLY_TIMES), and its own peak RSS.
    // One line for the compile, one per family applied; the peak is the largest.
    let mut own_rss_kb: Option<i64> = None;
    for times in stderr
        .lines()
        .filter_map(|l| l.strip_prefix("svc-compile: times: "))
    {
        let (phases, rest) = times.split_once("; own peak RSS ").unwrap_or((times, ""));
        let (rss, notes) = rest.split_once(" kB").unwrap_or((rest, ""));
        if let Ok(kb) = rss.parse::<i64>() {
            own_rss_kb = Some(own_rss_kb.map_or(kb, |k| k.max(kb)));
        }
        report += &format!("\n{:48}[{phases}{notes}]", "");
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Ran {
        took,
        max_rss_kb: usage.ru_maxrss,
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
        text,
        report,
        own_rss_kb,
    }
}

fn apply(
    bin: &str,
    root: &Path,
    manifests: &Path,
    target: &str,
    extra: &[&str],
    netns: &str,
    state: &Path,
) -> Ran {
    let mut c = Command::new(bin);
    c.env("SVC_COMPILE_APPLY_TIMES", "1");
    c.arg("apply")
        .arg(manifests)
        .arg(root.join("golden/common"))
        .args(["--node", "node-1", "--target", target, "--netns", netns])
        .args(extra)
        .arg("--state-dir")
        .arg(state);
    run(c)
}

fn compile(bin: &str, root: &Path, manifests: &Path, target: &str, extra: &[&str]) -> Ran {
    let mut c = Command::new(bin);
    c.arg("compile")
        .arg(manifests)
        .arg(root.join("golden/common"))
        .args(["--node", "node-1", "--target", target])
        .args(extra);
    run(c)
}

/// Wall time of `argv FILE`.
fn timed(argv: &[&str], file: &Path) -> Ran {
    let mut c = Command::new(argv[0]);
    c.args(&argv[1..]).arg(file);
    run(c)
}

/// `services` services with `endpoints` endpoints each, alternately on node-1 and node-2
/// (golden/common's nodes);
/// every fourth is a NodePort.
fn manifest(services: usize, endpoints: usize, change: Change) -> String {
    let count = services + usize::from(matches!(change, Change::Added));
    let moved = match change {
        Change::Endpoints(n) => n,
        _ => 0,
    };
    let mut out = String::with_capacity(count * (400 + endpoints * 60));
    for i in 0..count {
        let ip = format!(
            "10.{}.{}.{}",
            96 + (i + 1) / 65536,
            (i + 1) / 256 % 256,
            (i + 1) % 256
        );
        let node_port = if i % 4 == 0 {
            format!(", nodePort: {}", 30000 + i / 4)
        } else {
            String::new()
        };
        let kind = if i % 4 == 0 && i < 8000 {
            "NodePort"
        } else {
            "ClusterIP"
        };
        let node_port = if kind == "NodePort" {
            node_port
        } else {
            String::new()
        };
        out += &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\n\
             spec:\n  type: {kind}\n  clusterIP: {ip}\n  selector: {{app: svc-{i}}}\n  \
             ports:\n  - {{name: http, port: 80, targetPort: 8080{node_port}}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata:\n  name: svc-{i}-1\n  namespace: bench\n  labels: {{kubernetes.io/service-name: svc-{i}}}\n\
             addressType: IPv4\nports:\n- {{name: http, port: 8080, protocol: TCP}}\n\
             endpoints:\n"
        );
        for e in 0..endpoints {
            let n = i * endpoints + e;
            let third = if e == 0 && i < moved {
                255
            } else {
                n / 250 % 250
            };
            out += &format!(
                "- {{addresses: [10.{}.{third}.{}], nodeName: node-{}}}\n",
                128 + n / 62500 % 64,
                n % 250 + 1,
                e % 2 + 1
            );
        }
        out += "---\n";
    }
    out
}
