//! What the root benchmarks (`apply`, `agent`) share: their environment variables and a
//! throwaway network namespace.

use std::process::Command;

/// `SVC_BENCH_BIN`, else this build's binary.
pub fn bin() -> String {
    std::env::var("SVC_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_svc-compile").to_string())
}

/// `SVC_BENCH_SIZES` (`SERVICESxENDPOINTS,...`), else `default`.
pub fn sizes(default: &str) -> Vec<(usize, usize)> {
    std::env::var("SVC_BENCH_SIZES")
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| {
            let (a, b) = s.trim().split_once('x')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

/// `SVC_BENCH_TARGETS` (comma-separated), else `default`.
pub fn targets(default: &str) -> Vec<String> {
    std::env::var("SVC_BENCH_TARGETS")
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .collect()
}

/// A network namespace, deleted on drop.
pub struct Netns(pub String);

impl Netns {
    pub fn new(name: &str) -> Netns {
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
