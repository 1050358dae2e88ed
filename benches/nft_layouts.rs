//! The two nftables layouts side by side (issue 14): `cargo bench --bench nft_layouts`.
//!
//! 1. Cold `nft -f` of the `--target nftables` output in a fresh network namespace, both
//!    layouts in the same run, at 1k × 50, 2k × 50, 5k × 50, 10k × 10 and 30k × 10
//!    (`svc-compile gen --services N --endpoints M --nodes 100`, 5 % of the services with
//!    ClientIP affinity as gen makes them): wall time and the loader's CPU time (user +
//!    system, from the kernel's accounting: on a shared machine the wall time also counts
//!    waiting for a core). The kube-proxy layout is stopped at `--cap` seconds (default
//!    120) and reported as "> N s".
//! 2. The data plane: the time to set up a TCP connection (`connect()` to the SYN-ACK)
//!    from the namespace to the last service of 10k × 10, through each layout, against a
//!    connection straight to the endpoint with no rules loaded (median and 90th
//!    percentile of 2000 connections, a Python client in the namespace).
//!
//! Needs root, `ip`, `nft` and `python3`. Prints Markdown (the tables of docs/performance.md).
//! Options: `--cap SECONDS` `--sizes 1000x50,5000x50` `--no-dataplane`
//! `--dataplane-services N` (default 10000) `--dataplane-cap SECONDS` (how long a layout
//! may take to load before its connection time is left out; default 900) `--no-loads`.
use svc_node::sys::libc;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_svc-compile");
const LAYOUTS: [&str; 2] = ["kube-proxy", "fast"];

/// A network namespace of our own, deleted when dropped (also on panic).
struct Netns(String);

impl Netns {
    fn new() -> Netns {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("svcnftbench-{}-{nanos}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip netns add {name} failed");
        Netns(name)
    }

    fn run(&self, argv: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(argv)
            .output()
            .expect("ip netns exec")
    }

    fn ok(&self, argv: &[&str]) -> String {
        let o = self.run(argv);
        assert!(
            o.status.success(),
            "{argv:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Run `argv` inside: wall and CPU time, `None` wall when stopped at `timeout`.
    fn time(
        &self,
        argv: &[&str],
        timeout: Duration,
    ) -> Result<(Option<Duration>, Duration), String> {
        let cpu0 = children_cpu();
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
                    return Ok((Some(d), children_cpu() - cpu0));
                }
                let mut err = String::new();
                use std::io::Read;
                let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
                return Err(err.lines().take(3).collect::<Vec<_>>().join(" / "));
            }
            if t.elapsed() >= timeout {
                let _ = child.kill();
                let _ = child.wait();
                return Ok((None, children_cpu() - cpu0));
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

/// User + system time of the waited-for children so far.
fn children_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn gen(dir: &Path, services: usize, endpoints: usize) -> PathBuf {
    let input = dir.join(format!("gen-{services}x{endpoints}.yaml"));
    let st = Command::new(BIN)
        .args(["gen", "--services", &services.to_string()])
        .args([
            "--endpoints",
            &endpoints.to_string(),
            "--nodes",
            "100",
            "-o",
        ])
        .arg(&input)
        .status()
        .unwrap();
    assert!(st.success());
    input
}

fn compile(input: &Path, layout: &str, out: &Path) {
    let st = Command::new(BIN)
        .arg(input)
        .args([
            "--target",
            "nftables",
            "--node",
            "node-000",
            "--nft-layout",
            layout,
            "-o",
        ])
        .arg(out)
        .status()
        .unwrap();
    assert!(st.success());
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The last service section of a fast-layout document: its cluster IP:port and endpoints.
fn last_service(fast: &str) -> (String, Vec<String>) {
    let start = fast.rfind("\n# ").expect("a service section");
    let section = &fast[start..];
    let chain = section
        .lines()
        .find_map(|l| l.strip_prefix("add chain ip kube-proxy service-"))
        .expect("a service chain");
    let eps: Vec<String> = section
        .lines()
        .filter_map(|l| l.split("dnat to ").nth(1))
        .map(str::to_string)
        .collect();
    let goto = format!(": goto service-{chain} }}");
    let vip = fast
        .lines()
        .filter(|l| l.starts_with("add element ip kube-proxy service-ips {") && l.ends_with(&goto))
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            // add element ip kube-proxy service-ips { IP . tcp . PORT : goto ... }
            (w[8] == "tcp").then(|| format!("{}:{}", w[6], w[10]))
        })
        .expect("the service's cluster IP");
    (vip, eps)
}

const CLIENT: &str = r#"
import socket, struct, sys, threading, time
eps, dst, n = sys.argv[1].split(','), sys.argv[2], int(sys.argv[3])
def serve(s):
    while True:
        c, _ = s.accept()
        c.close()
for p in sorted({int(e.rsplit(':', 1)[1]) for e in eps}):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(('0.0.0.0', p))
    s.listen(4096)
    threading.Thread(target=serve, args=(s,), daemon=True).start()
ip, port = dst.rsplit(':', 1)
times = []
for i in range(n):
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
    t = time.perf_counter()
    c.connect((ip, int(port)))
    times.append(time.perf_counter() - t)
    c.close()
times.sort()
print('%.1f %.1f' % (times[len(times) // 2] * 1e6, times[len(times) * 9 // 10] * 1e6))
"#;

/// Median and p90 connect time (µs) from a fresh namespace with `rules` loaded (none:
/// straight to the first endpoint); not measured when the rules take longer than `cap` to
/// load.
fn connect_time(rules: Option<&Path>, vip: &str, eps: &[String], cap: Duration) -> String {
    let ns = Netns::new();
    ns.ok(&["ip", "link", "set", "lo", "up"]);
    // A default route out of a veth (no dummy module here), for the VIP's first routing.
    ns.ok(&[
        "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1",
    ]);
    ns.ok(&["ip", "link", "set", "d0", "up"]);
    ns.ok(&["ip", "link", "set", "d1", "up"]);
    ns.ok(&["ip", "addr", "add", "192.0.2.10/24", "dev", "d0"]);
    ns.ok(&["ip", "route", "add", "default", "dev", "d0"]);
    for e in eps {
        let ip = e.rsplit_once(':').unwrap().0;
        ns.ok(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "lo"]);
    }
    let dst = match rules {
        Some(r) => match ns.time(&["nft", "-f", r.to_str().unwrap()], cap) {
            Ok((Some(_), _)) => vip.to_string(),
            Ok((None, _)) => return format!("not measured: no load within {}", secs(cap)),
            Err(e) => panic!("nft -f {}: {e}", r.display()),
        },
        None => eps[0].clone(),
    };
    let out = ns.ok(&["python3", "-c", CLIENT, &eps.join(","), &dst, "2000"]);
    let w: Vec<&str> = out.split_whitespace().collect();
    format!("{} µs (p90 {} µs)", w[0], w[1])
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1).cloned())
    };
    let cap = Duration::from_secs(opt("--cap").map_or(120, |c| c.parse().expect("--cap SECONDS")));
    let sizes: Vec<(usize, usize)> = opt("--sizes")
        .unwrap_or_else(|| "1000x50,2000x50,5000x50,10000x10,30000x10".into())
        .split(',')
        .map(|s| {
            let (a, b) = s.split_once('x').expect("NxM");
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("nft_layouts: not root, skipped");
        return;
    }
    let dir = std::env::temp_dir().join(format!("svc-nft-layouts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let nft = Command::new("nft").arg("--version").output().unwrap();
    let mut report = String::new();
    let _ = writeln!(
        report,
        "{} cores, {}; `nft -f` in a fresh namespace, once per cell: wall [CPU user+sys]",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        String::from_utf8_lossy(&nft.stdout).trim()
    );
    let _ = writeln!(
        report,
        "\n| services × endpoints | lines kube-proxy / fast | kube-proxy layout | fast layout |"
    );
    let _ = writeln!(report, "|---|---:|---:|---:|");
    let mut fast_times = Vec::new();
    let loads = !argv.iter().any(|a| a == "--no-loads");
    for &(s, e) in sizes.iter().filter(|_| loads) {
        eprintln!("{s} × {e} ...");
        let input = gen(&dir, s, e);
        let mut cells = Vec::new();
        let mut lines = Vec::new();
        for layout in LAYOUTS {
            let rules = dir.join(format!("{layout}.nft"));
            compile(&input, layout, &rules);
            lines.push(std::fs::read_to_string(&rules).unwrap().lines().count());
            let limit = if layout == "fast" {
                Duration::from_secs(600)
            } else {
                cap
            };
            let ns = Netns::new();
            let cell = match ns.time(&["nft", "-f", rules.to_str().unwrap()], limit) {
                Ok((Some(d), cpu)) => {
                    if layout == "fast" {
                        fast_times.push(((s, e), d, cpu));
                    }
                    format!("{} [{}]", secs(d), secs(cpu))
                }
                Ok((None, cpu)) => format!("> {} (stopped) [{}]", secs(limit), secs(cpu)),
                Err(err) => format!("failed: {err}"),
            };
            eprintln!("  {layout}: {cell}");
            cells.push(cell);
        }
        let _ = writeln!(
            report,
            "| {}k × {e} | {} / {} | {} | {} |",
            s / 1000,
            lines[0],
            lines[1],
            cells[0],
            cells[1]
        );
        let _ = std::fs::remove_file(&input);
    }
    let find = |k: (usize, usize)| fast_times.iter().find(|t| t.0 == k);
    if let (Some(a), Some(b)) = (find((1000, 50)), find((5000, 50))) {
        let _ = writeln!(
            report,
            "\nfast layout, 1k × 50 → 5k × 50: wall {:.1}×, CPU {:.1}× (budget 6×)",
            b.1.as_secs_f64() / a.1.as_secs_f64(),
            b.2.as_secs_f64() / a.2.as_secs_f64()
        );
    }

    if !argv.iter().any(|a| a == "--no-dataplane") {
        eprintln!("data plane ...");
        let n: usize = opt("--dataplane-services").map_or(10_000, |n| n.parse().unwrap());
        let input = gen(&dir, n, 10);
        let paths: Vec<PathBuf> = LAYOUTS
            .iter()
            .map(|l| dir.join(format!("dp-{l}.nft")))
            .collect();
        for (l, p) in LAYOUTS.iter().zip(&paths) {
            compile(&input, l, p);
        }
        let (vip, eps) = last_service(&std::fs::read_to_string(&paths[1]).unwrap());
        let _ = writeln!(
            report,
            "\n| TCP connection set-up to the last of {n} services × 10 ({vip}) | median (p90) |\n|---|---:|"
        );
        let _ = writeln!(
            report,
            "| no rules, straight to {} | {} |",
            eps[0],
            connect_time(None, &vip, &eps, Duration::ZERO)
        );
        let cap = opt("--dataplane-cap").map_or(Duration::from_secs(900), |c| {
            Duration::from_secs(c.parse().expect("--dataplane-cap SECONDS"))
        });
        for (l, p) in LAYOUTS.iter().zip(&paths) {
            let _ = writeln!(
                report,
                "| {l} layout | {} |",
                connect_time(Some(p), &vip, &eps, cap)
            );
        }
        let _ = std::fs::remove_file(&input);
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{report}");
}
