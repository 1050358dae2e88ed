//! Diagnostics on a large broken input: `cargo bench --bench diagnostics [-- OPTIONS]`.
//!
//! A synthetic cluster (`svc_compiler::synth`, one `kind: List` file) of about 50 MB with
//! 16,000 Service ports written `protocol: tcp` (SVC112 each) is checked by the built
//! `svc-compile` binary with `--format text` and `--format json`. Issue 16 asks that text
//! costs at most 1.5× JSON: text once looked every line up by scanning the file from the
//! start (282 s against 4 s). Prints the minimum wall time over `--runs` runs of each and
//! the ratio, and fails if the ratio is over the budget.
//!
//! Options: `--services N` (default 23000, about 50 MB) `--errors N` (default 16000)
//! `--runs N` (default 3).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use svc_compiler::synth::{self, Format, Shape};

const BUDGET: f64 = 1.5;

fn main() {
    let (mut services, mut errors, mut runs) = (23_000usize, 16_000usize, 3usize);
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut n = || -> usize {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{flag} N"))
        };
        match flag.as_str() {
            "--services" => services = n(),
            "--errors" => errors = n(),
            "--runs" => runs = n().max(1),
            // `cargo bench` passes `--bench`.
            _ => {}
        }
    }
    let text = broken_cluster(services, errors);
    let dir = std::env::temp_dir().join(format!("svc-compile-diag-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("cluster.yaml");
    std::fs::write(&file, &text).expect("write the input");

    println!(
        "input: {:.1} MB, {services} services, {errors} errors (SVC112)\n",
        text.len() as f64 / 1e6
    );
    println!("| format | wall (min of {runs}) | output |");
    println!("|---|---|---|");
    let mut best = Vec::new();
    for format in ["json", "text"] {
        let mut times = Vec::new();
        let mut out_len = 0;
        for _ in 0..runs {
            let t = Instant::now();
            let out = Command::new(env!("CARGO_BIN_EXE_svc-compile"))
                .args(["check", "--format", format])
                .arg(&file)
                .stdin(Stdio::null())
                .output()
                .expect("run svc-compile");
            times.push(t.elapsed());
            assert_eq!(out.status.code(), Some(1), "the input has errors");
            let found = String::from_utf8_lossy(&out.stdout)
                .matches("SVC112")
                .count();
            assert!(
                found >= errors,
                "{format}: {found} SVC112, expected {errors}"
            );
            out_len = out.stdout.len();
        }
        let min = times.into_iter().min().unwrap_or(Duration::ZERO);
        println!(
            "| {format} | {:.2} s | {:.1} MB |",
            min.as_secs_f64(),
            out_len as f64 / 1e6
        );
        best.push(min);
    }
    let ratio = best[1].as_secs_f64() / best[0].as_secs_f64();
    println!("\ntext / json: {ratio:.2} (budget {BUDGET})");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ratio <= BUDGET, "text diagnostics cost {ratio:.2}× JSON");
}

/// A synthetic cluster whose first `errors` Service ports say `protocol: tcp`.
fn broken_cluster(services: usize, errors: usize) -> String {
    let shape = Shape {
        services,
        endpoints: 10,
        nodes: 100,
        seed: 1,
    };
    let text = synth::generate(&shape, Format::YamlList);
    // Service ports are written at six spaces in a `kind: List`, EndpointSlice ports at four.
    let good = "\n      protocol: TCP\n";
    let bad = "\n      protocol: tcp\n";
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    for _ in 0..errors {
        let Some(i) = rest.find(good) else {
            panic!("only some of {errors} service ports found: raise --services")
        };
        out.push_str(&rest[..i]);
        out.push_str(bad);
        rest = &rest[i + good.len()..];
    }
    out.push_str(rest);
    out
}
