//! `cargo bench --bench apply`: how long `svc-compile apply` takes for 1,000 services, in a
//! throwaway network namespace, for both targets: a full apply into an empty namespace, a
//! one-service change (incremental), the same state again (unchanged), and a forced full
//! reload. Prints the wall time of each `svc-compile apply` process (compiling included)
//! and the apply's own report. Needs root and iproute2; otherwise it says so and exits 0.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const SERVICES: usize = 1000;
const RUNS: usize = 3;

fn main() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: apply benchmark: needs root (network namespaces)");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let work = std::env::temp_dir().join(format!("svc-compile-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("v1")).unwrap();
    std::fs::create_dir_all(work.join("v2")).unwrap();
    std::fs::write(work.join("v1/services.yaml"), manifest(None)).unwrap();
    std::fs::write(work.join("v2/services.yaml"), manifest(Some(SERVICES / 2))).unwrap();

    println!("svc-compile apply, {SERVICES} services (2 endpoints each, every 4th a NodePort), median of {RUNS}");
    for target in ["iptables", "nftables"] {
        let mut rows: Vec<(&str, Vec<Duration>, String)> = vec![
            ("full apply into an empty namespace", vec![], String::new()),
            ("one service changed", vec![], String::new()),
            ("same state again", vec![], String::new()),
            ("forced full reload (--full)", vec![], String::new()),
        ];
        for run in 0..RUNS {
            let ns = Netns::new(&format!("svcc-bench-{}-{target}-{run}", std::process::id()));
            let state = work.join(format!("state-{target}-{run}"));
            let steps: [(&str, &[&str]); 4] =
                [("v1", &[]), ("v2", &[]), ("v2", &[]), ("v2", &["--full"])];
            for (i, (dir, extra)) in steps.iter().enumerate() {
                let (took, report) = apply(&root, &work.join(dir), target, &ns.0, &state, extra);
                rows[i].1.push(took);
                rows[i].2 = report;
            }
        }
        println!("\n{target}:");
        for (what, mut times, report) in rows {
            times.sort();
            println!(
                "  {what:<38} {:>6} ms   ({})",
                times[times.len() / 2].as_millis(),
                report.trim()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}

fn apply(
    root: &Path,
    manifests: &Path,
    target: &str,
    netns: &str,
    state: &Path,
    extra: &[&str],
) -> (Duration, String) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_svc-compile"))
        .arg("apply")
        .arg(manifests)
        .arg(root.join("golden/common"))
        .args(["--node", "node-1", "--target", target, "--netns", netns])
        .arg("--state-dir")
        .arg(state)
        .args(extra)
        .output()
        .expect("run svc-compile");
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "svc-compile apply failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    let report = report.split(": ").skip(1).collect::<Vec<_>>().join(": ");
    (took, report)
}

/// `SERVICES` ClusterIP services with two endpoints each; every fourth is a NodePort. With
/// `changed`, that service's second endpoint moves.
fn manifest(changed: Option<usize>) -> String {
    let mut out = String::new();
    for i in 0..SERVICES {
        let (hi, lo) = (i / 250, i % 250 + 2);
        let node_port = if i % 4 == 0 {
            format!(", nodePort: {}", 30000 + i)
        } else {
            String::new()
        };
        let kind = if i % 4 == 0 { "NodePort" } else { "ClusterIP" };
        let second = if changed == Some(i) { 250 } else { lo };
        out += &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\n\
             spec:\n  type: {kind}\n  clusterIP: 10.96.{}.{}\n  selector: {{app: svc-{i}}}\n  \
             ports:\n  - {{name: http, port: 80, targetPort: 8080{node_port}}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata:\n  name: svc-{i}-1\n  namespace: bench\n  labels: {{kubernetes.io/service-name: svc-{i}}}\n\
             addressType: IPv4\nports:\n- {{name: http, port: 8080, protocol: TCP}}\n\
             endpoints:\n- {{addresses: [10.244.1{hi}.{lo}], nodeName: node-1}}\n\
             - {{addresses: [10.244.2{hi}.{second}], nodeName: node-2}}\n---\n",
            10 + hi,
            lo,
        );
    }
    out
}

/// A network namespace, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(name: &str) -> Netns {
        let ok = Command::new("ip")
            .args(["netns", "add", name])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip netns add {name} failed");
        Netns(name.to_string())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}
