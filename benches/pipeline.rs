//! The performance benchmark: `cargo bench --bench pipeline [-- OPTIONS]`.
//!
//! Generates synthetic clusters (`svc_compiler::synth`: N services × 10 endpoints on 100
//! nodes) and measures, on this machine:
//! 1. every stage in-process (parse, decode, each pass, the node view, each target, and all
//!    100 nodes at once), at each size;
//! 2. the whole CLI run (the built `svc-compile` binary): wall time and peak RSS;
//! 3. the kernel's own load time of the produced rulesets (`iptables-legacy-restore`,
//!    `iptables-restore` with the nf_tables backend, `nft -f`) in a throwaway network
//!    namespace, once per case with a time limit: the floor for `apply`. Needs root;
//!    skipped otherwise. This part takes minutes: nf_tables loads grow faster than linearly
//!    with the number of sets (docs/performance.md).
//!
//! Times are the minimum over `--runs` runs (the least disturbed by other work on a shared
//! machine; stages shorter than that are repeated for a second), with the median in
//! brackets. Then every budget of issue 6 is checked.
//! It prints Markdown: the tables of docs/performance.md are this output.
//!
//! Options: `--sizes 1000,10000,20000,30000` `--runs 5` `--quick` (sizes 1000,2000, one
//! run, no kernel loads) `--no-kernel` `--no-cli` `--only NAME` (just the stages whose name
//! contains NAME, for a profiler).
use svc_node::sys::libc;

use rayon::prelude::*;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use svc_compiler::diag::Diagnostics;
use svc_compiler::ir::{Module, NodeView};
use svc_compiler::k8s::{self, Objects};
use svc_compiler::net::IpFamily;
use svc_compiler::passes::{self, node::NodeSelection};
use svc_compiler::source::FileId;
use svc_compiler::synth::{self, Format, Shape};
use svc_compiler::tree;

// The same allocator as the `svc-compile` binary (src/main.rs), with mimalloc's default
// purge delay (the binary's `--out` policy, src/alloc.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ENDPOINTS: usize = 10;
const NODES: usize = 100;
/// The size the absolute budgets are stated for.
const BUDGET_SIZE: usize = 10_000;

struct Args {
    sizes: Vec<usize>,
    only: Option<String>,
    runs: usize,
    kernel: bool,
    cli: bool,
}

fn args() -> Args {
    let mut a = Args {
        sizes: vec![1_000, 10_000, 20_000, 30_000],
        only: None,
        runs: 5,
        kernel: true,
        cli: true,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--sizes" => {
                a.sizes = it
                    .next()
                    .expect("--sizes N,N,...")
                    .split(',')
                    .map(|n| n.parse().expect("--sizes takes numbers"))
                    .collect()
            }
            "--runs" => a.runs = it.next().and_then(|n| n.parse().ok()).expect("--runs N"),
            "--quick" => {
                a.sizes = vec![1_000, 2_000];
                a.runs = 1;
                a.kernel = false;
            }
            "--only" => {
                a.only = it.next().cloned();
                a.cli = false;
                a.kernel = false;
            }
            "--no-kernel" => a.kernel = false,
            "--no-cli" => a.cli = false,
            // `cargo bench` passes `--bench`; filters are not supported.
            _ => {}
        }
    }
    a
}

/// Minimum and median of a few runs.
#[derive(Clone, Copy, Debug, Default)]
struct Stat {
    min: Duration,
    median: Duration,
}

impl Stat {
    fn of(mut v: Vec<Duration>) -> Stat {
        v.sort();
        Stat {
            min: v[0],
            median: v[v.len() / 2],
        }
    }
}

/// Times stages, `runs` times each; with `only`, just the stages whose name contains it
/// (for profiling one stage).
struct Timer<'a> {
    runs: usize,
    only: Option<&'a str>,
    stats: Vec<(&'static str, Stat)>,
}

impl Timer<'_> {
    /// Time `f`; its result is dropped outside the timed region.
    fn stage<T>(&mut self, name: &'static str, mut f: impl FnMut() -> T) {
        self.stage_with(name, || (), |()| f());
    }

    /// Time `f` on what `setup` made, which is not timed.
    fn stage_with<I, T>(
        &mut self,
        name: &'static str,
        mut setup: impl FnMut() -> I,
        mut f: impl FnMut(I) -> T,
    ) {
        if self.only.is_some_and(|o| !name.contains(o)) {
            self.stats.push((name, Stat::default()));
            return;
        }
        // Short stages are repeated until they have run for a second (at most 50 times):
        // their minimum is then as steady as a long stage's.
        let started = Instant::now();
        let mut times = Vec::new();
        while times.len() < self.runs
            || (started.elapsed() < Duration::from_secs(1) && times.len() < 50)
        {
            let input = setup();
            let t = Instant::now();
            let r = f(input);
            times.push(t.elapsed());
            drop(r);
        }
        self.stats.push((name, Stat::of(times)));
    }
}

fn shape(services: usize) -> Shape {
    Shape {
        services,
        endpoints: ENDPOINTS,
        nodes: NODES,
        seed: 1,
    }
}

/// Every stage of the pipeline at one size.
fn stages(services: usize, runs: usize, only: Option<&str>) -> Vec<(&'static str, Stat)> {
    let sh = shape(services);
    let list = synth::generate(&sh, Format::YamlList);
    let stream = synth::generate(&sh, Format::YamlStream);
    let json = synth::generate(&sh, Format::Json);
    let file = FileId(0);
    let mut t = Timer {
        runs,
        only,
        stats: Vec::new(),
    };
    t.stage("parse YAML (kind: List)", || tree::parse_file(file, &list));
    t.stage("parse YAML (--- stream)", || {
        tree::parse_file(file, &stream)
    });
    t.stage("parse JSON", || tree::parse_file(file, &json));

    let (docs, _) = tree::parse_file(file, &list);
    let decode = || {
        let mut objects = Objects::default();
        let mut diags = Diagnostics::default();
        for d in &docs {
            k8s::decode_document(d, &mut objects, &mut diags);
        }
        (objects, diags)
    };
    t.stage("decode (one thread)", decode);
    let mut sources = svc_compiler::source::SourceMap::default();
    let f = sources.add("cluster.yaml", list.clone());
    t.stage("parse + decode, in parallel as `compile` runs them", || {
        svc_compiler::read(&sources, &[f])
    });
    let (objects, mut diags) = decode();
    drop(docs);
    let opts = svc_compiler::Options {
        allocate: true,
        ..Default::default()
    };
    let settings = svc_compiler::settings(&objects, &opts);
    t.stage("validate", || {
        passes::validate::validate(&objects, &settings, &mut Diagnostics::default())
    });
    t.stage("resolve", || passes::resolve::resolve(&objects));
    let lock = Default::default();
    t.stage("allocate", || {
        let mut d = Diagnostics::default();
        passes::allocate::allocate(&objects, &settings, &lock, true, &mut d)
    });
    let resolved = passes::resolve::resolve(&objects);
    let (allocs, _) = passes::allocate::allocate(&objects, &settings, &lock, true, &mut diags);
    t.stage_with(
        "lower",
        || (resolved.clone(), allocs.clone()),
        |(r, a)| passes::lower::lower(&objects, &settings, r, a),
    );
    let module = passes::lower::lower(&objects, &settings, resolved, allocs);
    assert!(
        !diags.has_errors(),
        "the synthetic cluster compiles cleanly"
    );
    drop(objects);

    let view = |name: &str| {
        let sel = NodeSelection {
            name: name.into(),
            ips: vec![],
        };
        passes::node::node_view(&module, &sel, IpFamily::IPv4).expect("the node exists")
    };
    t.stage("node view, 1 node", || view("node-000"));
    let v = view("node-000");
    t.stage("iptables, 1 node", || {
        svc_targets::iptables::write_string(&v, &Default::default())
    });
    t.stage("nftables, 1 node", || {
        svc_targets::nftables::write_string(&v, &Default::default())
    });
    t.stage("ipvs (four parts), 1 node", || {
        svc_targets::ipvs::write_string(&v, &svc_targets::ipvs::Options::from_view(&v))
    });
    t.stage("node views + iptables, 100 nodes", || {
        all_nodes(&module, Target::Iptables)
    });
    t.stage("node views + nftables, 100 nodes", || {
        all_nodes(&module, Target::Nftables)
    });
    t.stage("node views + ipvs, 100 nodes", || {
        all_nodes(&module, Target::Ipvs)
    });
    t.stats
}

#[derive(Clone, Copy)]
enum Target {
    Iptables,
    Nftables,
    Ipvs,
}

/// What `--all-nodes` computes (without the file writes): every node's view and ruleset,
/// nodes in parallel, one renderer sharing ports between nodes. Returns the bytes produced.
fn all_nodes(module: &Module, target: Target) -> usize {
    let ipt = svc_targets::iptables::Renderer::default();
    let nft = svc_targets::nftables::Renderer::default();
    module
        .nodes
        .par_iter()
        .map_init(String::new, |text, n| {
            let sel = NodeSelection {
                name: n.name.clone(),
                ips: vec![],
            };
            let v: NodeView = passes::node::node_view(module, &sel, IpFamily::IPv4).unwrap();
            match target {
                Target::Iptables => ipt.write_into(&v, text),
                Target::Nftables => nft.write_into(&v, text),
                Target::Ipvs => {
                    *text = svc_targets::ipvs::write_string(
                        &v,
                        &svc_targets::ipvs::Options::from_view(&v),
                    )
                }
            }
            text.len()
        })
        .sum()
}

// ---------------------------------------------------------------------------------------
// The CLI, as a user runs it
// ---------------------------------------------------------------------------------------

/// Wall time and peak resident set size of one child process.
#[derive(Clone, Copy, Debug)]
struct Proc {
    wall: Duration,
    max_rss_kib: u64,
}

/// Run `cmd` and measure it. The peak RSS the kernel reports for a child includes the
/// memory of the process it was forked from (kept across fork and exec), and this process
/// holds whole clusters: so a fresh, small copy of this binary (`--measure-child`) starts
/// the command and reports.
fn run_measured(cmd: &Command) -> Proc {
    let out = Command::new(std::env::current_exe().expect("the bench binary"))
        .arg("--measure-child")
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run the measuring helper");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace().map(|n| n.parse::<u64>().ok());
    match (
        out.status.success(),
        it.next().flatten(),
        it.next().flatten(),
    ) {
        (true, Some(nanos), Some(kib)) => Proc {
            wall: Duration::from_nanos(nanos),
            max_rss_kib: kib,
        },
        _ => panic!("{cmd:?} failed: {text}"),
    }
}

/// `--measure-child PROGRAM ARGS...`: run it, print its wall time (ns) and peak RSS (KiB).
// The child is reaped by `wait4`, which also returns its resource usage.
#[allow(clippy::zombie_processes)]
fn measure_child(argv: &[String]) -> ! {
    let t = Instant::now();
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the measured command");
    let mut status = 0;
    // SAFETY: plain wait4 on our own child, with valid out-pointers.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru) };
    let wall = t.elapsed();
    if pid <= 0 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        eprintln!("{argv:?} failed (status {status})");
        std::process::exit(1);
    }
    println!("{} {}", wall.as_nanos(), ru.ru_maxrss);
    std::process::exit(0);
}

struct CliCase {
    input: &'static str,
    target: &'static str,
    all_nodes: bool,
}

const CLI_CASES: &[CliCase] = &[
    CliCase {
        input: "yaml",
        target: "iptables",
        all_nodes: false,
    },
    CliCase {
        input: "yaml",
        target: "nftables",
        all_nodes: false,
    },
    CliCase {
        input: "json",
        target: "iptables",
        all_nodes: false,
    },
    CliCase {
        input: "json",
        target: "nftables",
        all_nodes: false,
    },
    CliCase {
        input: "yaml",
        target: "iptables",
        all_nodes: true,
    },
    CliCase {
        input: "yaml",
        target: "nftables",
        all_nodes: true,
    },
    // Last: an all-nodes case is compared with the one-node case four before it.
    CliCase {
        input: "yaml",
        target: "ipvs",
        all_nodes: false,
    },
];

/// One CLI case at one size: wall time, peak RSS, and for `--all-nodes` the time to write
/// the same files with nothing else to do (the floor the disk sets).
struct CliResult {
    wall: Stat,
    max_rss_kib: u64,
    write_floor: Option<Stat>,
}

fn cli(dir: &Path, services: usize, runs: usize) -> Vec<CliResult> {
    let sh = shape(services);
    let yaml = dir.join(format!("cluster-{services}.yaml"));
    let json = dir.join(format!("cluster-{services}.json"));
    std::fs::write(&yaml, synth::generate(&sh, Format::YamlList)).unwrap();
    std::fs::write(&json, synth::generate(&sh, Format::Json)).unwrap();
    let out_dir = dir.join("out");
    let res = CLI_CASES
        .iter()
        .map(|c| {
            let input = if c.input == "yaml" { &yaml } else { &json };
            // All nodes write 100 full rulesets (gigabytes at 30k): fewer runs.
            let n = if c.all_nodes { runs.min(3) } else { runs };
            let mut sizes = Vec::new();
            let procs: Vec<Proc> = (0..n)
                .map(|_| {
                    let mut cmd = Command::new(env!("CARGO_BIN_EXE_svc-compile"));
                    cmd.arg(input).args(["--target", c.target]);
                    if c.all_nodes {
                        cmd.arg("--all-nodes").arg("--out").arg(&out_dir);
                    } else {
                        cmd.args(["--node", "node-000", "-o"])
                            .arg(dir.join("out.rules"));
                    }
                    let p = run_measured(&cmd);
                    if c.all_nodes {
                        sizes = std::fs::read_dir(&out_dir)
                            .unwrap()
                            .map(|e| e.unwrap().metadata().unwrap().len())
                            .collect();
                    }
                    let _ = std::fs::remove_dir_all(&out_dir);
                    p
                })
                .collect();
            CliResult {
                wall: Stat::of(procs.iter().map(|p| p.wall).collect()),
                max_rss_kib: procs.iter().map(|p| p.max_rss_kib).max().unwrap(),
                write_floor: c
                    .all_nodes
                    .then(|| Stat::of((0..n).map(|_| write_floor(&out_dir, &sizes)).collect())),
            }
        })
        .collect();
    let _ = std::fs::remove_file(&yaml);
    let _ = std::fs::remove_file(&json);
    res
}

/// Write files of these sizes into a fresh `dir`, in parallel as `--all-nodes` does, with
/// nothing to compute: how long the file system takes for the bytes alone.
fn write_floor(dir: &Path, sizes: &[u64]) -> Duration {
    let buf = vec![b'#'; sizes.iter().copied().max().unwrap_or(0) as usize];
    std::fs::create_dir_all(dir).unwrap();
    let t = Instant::now();
    sizes.par_iter().enumerate().for_each(|(i, &n)| {
        std::fs::write(dir.join(i.to_string()), &buf[..n as usize]).unwrap();
    });
    let d = t.elapsed();
    let _ = std::fs::remove_dir_all(dir);
    d
}

// ---------------------------------------------------------------------------------------
// The kernel's load time
// ---------------------------------------------------------------------------------------

/// A network namespace of our own, deleted when dropped (also on panic).
struct Netns(String);

impl Netns {
    fn new() -> Option<Netns> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("svcbench-{}-{nanos}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Netns(name))
    }

    /// Run `argv` inside the namespace: its wall time, `Ok(None)` when it was stopped at
    /// `timeout`, `Err` when it failed.
    fn time(&self, argv: &[&str], timeout: Duration) -> Result<Option<Duration>, String> {
        let t = Instant::now();
        // `ip netns exec` execs the command itself, so killing it kills the loader.
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                let d = t.elapsed();
                if status.success() {
                    return Ok(Some(d));
                }
                let mut err = String::new();
                use std::io::Read;
                let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
                return Err(err.lines().take(3).collect::<Vec<_>>().join(" / "));
            }
            if t.elapsed() >= timeout {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn kernel_skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    for tool in ["ip", "iptables-legacy-restore", "iptables-restore", "nft"] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("`{tool}` not found"));
        }
    }
    None
}

/// One kernel load: a cluster, a target, the loader, and how long to wait at most.
struct KernelCase {
    services: usize,
    endpoints: usize,
    target: &'static str,
    loader: &'static [&'static str],
    timeout_s: u64,
}

const LEGACY: &[&str] = &["iptables-legacy-restore", "--noflush"];
const IPT_NFT: &[&str] = &["iptables-restore", "--noflush"];
const NFT: &[&str] = &["nft", "-f"];

/// The budget case and a few sizes around it: enough to see how each loader scales.
#[rustfmt::skip]
const KERNEL_CASES: &[KernelCase] = &[
    KernelCase { services: 10_000, endpoints: 10, target: "iptables", loader: LEGACY, timeout_s: 120 },
    KernelCase { services: 1_000, endpoints: 10, target: "iptables", loader: IPT_NFT, timeout_s: 120 },
    KernelCase { services: 2_000, endpoints: 10, target: "iptables", loader: IPT_NFT, timeout_s: 120 },
    KernelCase { services: 1_000, endpoints: 10, target: "nftables", loader: NFT, timeout_s: 120 },
    KernelCase { services: 2_000, endpoints: 10, target: "nftables", loader: NFT, timeout_s: 120 },
    KernelCase { services: 10_000, endpoints: 10, target: "nftables", loader: NFT, timeout_s: 300 },
    KernelCase { services: 1_000, endpoints: 50, target: "nftables", loader: NFT, timeout_s: 120 },
    KernelCase { services: 2_000, endpoints: 50, target: "nftables", loader: NFT, timeout_s: 120 },
    KernelCase { services: 5_000, endpoints: 50, target: "nftables", loader: NFT, timeout_s: 120 },
];

/// A kernel load's result: (loader and input, lines, time), the time `None` after a timeout.
type KernelRow = (String, usize, Result<Option<Duration>, String>);

/// Each case once (a load is dominated by the kernel and the loader, not by noise), in a
/// fresh namespace, so that it starts from an empty ruleset.
fn kernel(dir: &Path) -> Vec<KernelRow> {
    let mut res = Vec::new();
    for c in KERNEL_CASES {
        eprintln!("kernel: {} {}×{} ...", c.loader[0], c.services, c.endpoints);
        let sh = Shape {
            services: c.services,
            endpoints: c.endpoints,
            nodes: NODES,
            seed: 1,
        };
        let input = dir.join("kernel.yaml");
        std::fs::write(&input, synth::generate(&sh, Format::YamlList)).unwrap();
        let rules = dir.join(format!("kernel.{}", c.target));
        let mut compile = Command::new(env!("CARGO_BIN_EXE_svc-compile"));
        compile
            .arg(&input)
            .args(["--target", c.target, "--node", "node-000", "-o"])
            .arg(&rules);
        run_measured(&compile);
        let lines = std::fs::read_to_string(&rules).unwrap().lines().count();
        let mut argv = c.loader.to_vec();
        argv.push(rules.to_str().unwrap());
        let r = match Netns::new() {
            Some(ns) => ns.time(&argv, Duration::from_secs(c.timeout_s)),
            None => Err("cannot create a network namespace".to_string()),
        };
        let what = format!(
            "`{}` of the {} output, {}k services × {} endpoints",
            c.loader.join(" "),
            c.target,
            c.services / 1000,
            c.endpoints
        );
        res.push((what, lines, r));
        let _ = std::fs::remove_file(&input);
        let _ = std::fs::remove_file(&rules);
    }
    res
}

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 10.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.2}")
    }
}

/// The least-squares slope of `points` (x, y).
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(x, y), p| (x + p.0 / n, y + p.1 / n));
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(sxy, sxx), p| {
        (sxy + (p.0 - mx) * (p.1 - my), sxx + (p.0 - mx) * (p.0 - mx))
    });
    sxy / sxx
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn label(n: usize) -> String {
    if n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().is_some_and(|a| a == "--measure-child") {
        measure_child(&argv[1..]);
    }
    let a = args();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let dir: PathBuf =
        std::env::temp_dir().join(format!("svc-compile-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut report = String::new();
    let mut budgets: Vec<(String, bool)> = Vec::new();
    let _ = writeln!(
        report,
        "Machine: {cores} cores. Input: `svc-compile gen --services N --endpoints {ENDPOINTS} --nodes {NODES}`. \
         Times: minimum of {} runs [median].\n",
        a.runs
    );

    // 1. Stages.
    let mut by_size: Vec<Vec<(&str, Stat)>> = Vec::new();
    for &n in &a.sizes {
        eprintln!("stages: {n} services ...");
        by_size.push(stages(n, a.runs, a.only.as_deref()));
    }
    let _ = write!(report, "| stage (ms) |");
    for &n in &a.sizes {
        let _ = write!(report, " {} |", label(n));
    }
    // Linearity: the exponent b of time ∝ size^b, fitted (least squares on logarithms) over
    // the sizes from 10k up, where fixed costs and caches no longer flatter the small
    // sizes; doubling the input then multiplies the time by 2^b. One pair of sizes alone
    // is at the mercy of one disturbed measurement on a shared machine.
    let fit: Vec<usize> = (0..a.sizes.len())
        .filter(|&i| a.sizes[i] >= BUDGET_SIZE)
        .collect();
    let fitted = fit.len() >= 2;
    if fitted {
        let _ = write!(
            report,
            " ×, doubling ({}–{}) |",
            label(a.sizes[fit[0]]),
            label(a.sizes[*fit.last().unwrap()])
        );
    }
    let _ = writeln!(report);
    let _ = writeln!(
        report,
        "|---|{}{}",
        "---:|".repeat(a.sizes.len()),
        if fitted { "---:|" } else { "" }
    );
    for s in 0..by_size[0].len() {
        let name = by_size[0][s].0;
        let _ = write!(report, "| {name} |");
        for st in &by_size {
            let _ = write!(report, " {} [{}] |", ms(st[s].1.min), ms(st[s].1.median));
        }
        if fitted {
            let points: Vec<(f64, f64)> = fit
                .iter()
                .map(|&i| {
                    let t = by_size[i][s].1.min.as_secs_f64().max(1e-9);
                    ((a.sizes[i] as f64).ln(), t.ln())
                })
                .collect();
            let r = 2f64.powf(slope(&points));
            // Stages under a millisecond are timer noise, not growth.
            let tiny = fit
                .iter()
                .all(|&i| by_size[i][s].1.min < Duration::from_millis(1));
            let ok = r <= 2.2 || tiny;
            let _ = write!(report, " {r:.2}× |");
            budgets.push((format!("linear: {name} ×{r:.2} when the input doubles"), ok));
        }
        let _ = writeln!(report);
    }

    // 2. The CLI.
    if a.cli {
        let mut rows: Vec<Vec<CliResult>> = Vec::new();
        for &n in &a.sizes {
            eprintln!("cli: {n} services ...");
            rows.push(cli(&dir, n, a.runs));
        }
        let _ = write!(
            report,
            "\n| `svc-compile` end to end: wall [median], peak RSS |"
        );
        for &n in &a.sizes {
            let _ = write!(report, " {} |", label(n));
        }
        let _ = writeln!(report, "\n|---|{}", "---:|".repeat(a.sizes.len()));
        for (c, case) in CLI_CASES.iter().enumerate() {
            let nodes = if case.all_nodes {
                "all 100 nodes, `--out` on disk"
            } else {
                "1 node"
            };
            let _ = write!(
                report,
                "| {} → {}, {nodes} |",
                case.input.to_uppercase(),
                case.target
            );
            for r in &rows {
                let r = &r[c];
                let _ = write!(
                    report,
                    " {} [{}], {} MB |",
                    secs(r.wall.min),
                    secs(r.wall.median),
                    r.max_rss_kib / 1024
                );
            }
            let _ = writeln!(report);
            if case.all_nodes {
                let _ = write!(report, "| ↳ writing the same files, nothing else |");
                for r in &rows {
                    let f = r[c].write_floor.expect("all-nodes cases have one");
                    let _ = write!(report, " {} [{}] |", secs(f.min), secs(f.median));
                }
                let _ = writeln!(report);
            }
        }
        if let Some(i) = a.sizes.iter().position(|&n| n == BUDGET_SIZE) {
            let r = &rows[i];
            for (c, case) in CLI_CASES.iter().enumerate() {
                let (wall, rss) = (r[c].wall.min.as_secs_f64(), r[c].max_rss_kib);
                if case.all_nodes {
                    let one = r[c - 4].wall.min.as_secs_f64();
                    let floor = r[c].write_floor.expect("all-nodes").min.as_secs_f64();
                    budgets.push((
                        format!(
                            "10k, all 100 nodes, {}: {:.1}× one node (≤ 10×); writing the files alone takes {:.1}×",
                            case.target,
                            wall / one,
                            floor / one
                        ),
                        wall / one <= 10.0,
                    ));
                } else {
                    // The issue states the memory budget for the YAML input; the JSON
                    // (2.5× the bytes) has a time budget, its peak RSS is shown.
                    let json = case.input == "json";
                    let limit = if json { 0.5 } else { 1.5 };
                    budgets.push((
                        format!(
                            "10k {} → {}, 1 node: {wall:.2} s (≤ {limit} s), {} MB{}",
                            case.input.to_uppercase(),
                            case.target,
                            rss / 1024,
                            if json { "" } else { " (≤ 300 MB)" }
                        ),
                        wall <= limit && (json || rss <= 300 * 1024),
                    ));
                }
            }
        }
    }

    // 3. The kernel.
    if a.kernel {
        match kernel_skip_reason() {
            Some(why) => {
                let _ = writeln!(report, "\nKernel load times: skipped ({why}).");
            }
            None => {
                let _ = writeln!(
                    report,
                    "\n| kernel load, fresh network namespace, once | lines | time |"
                );
                let _ = writeln!(report, "|---|---:|---:|");
                for (c, (what, lines, r)) in KERNEL_CASES.iter().zip(kernel(&dir)) {
                    let t = match &r {
                        Ok(Some(d)) => secs(*d),
                        Ok(None) => format!("> {} s (stopped)", c.timeout_s),
                        Err(e) => format!("failed: {e}"),
                    };
                    let _ = writeln!(report, "| {what} | {lines} | {t} |");
                    if c.services == 5_000 && c.endpoints == 50 {
                        budgets.push((
                            format!("nft -f of 5k services × 50 endpoints: {t} (< 30 s)"),
                            matches!(r, Ok(Some(d)) if d.as_secs_f64() < 30.0),
                        ));
                    }
                }
            }
        }
    }

    let _ = writeln!(report, "\nBudgets:\n");
    for (what, ok) in &budgets {
        let _ = writeln!(report, "- {} {what}", if *ok { "✅" } else { "❌" });
    }
    let _ = std::fs::remove_dir_all(&dir);
    print!("{report}");
}
