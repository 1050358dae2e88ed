//! Profiling: where an apply spent its time, and what the agent's metrics take from it.

use std::time::{Duration, Instant};
use svc_targets::plan::Family;

/// What a phase spent its time on, for the agent's metrics
/// (`svc_compile_agent_plan_duration_seconds`, `…_kernel_duration_seconds`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Planning: turning the document and the record (or the node's read) into commands
    /// and expectations, and comparing what was read with them.
    Plan,
    /// The kernel and its tools: reading the node, fingerprinting it, loading, checking,
    /// the scratch namespace, the conntrack cleanup.
    Kernel,
    /// Anything else (reading and writing the state directory, rendering).
    Other,
}

/// Where one apply spent its time, printed on stderr when `SVC_COMPILE_APPLY_TIMES` is set
/// (profiling; `cargo bench --bench apply` shows it), and kept for the agent ([`keep`]).
#[derive(Default)]
pub struct Times {
    last: Option<Instant>,
    phases: Vec<(&'static str, Kind, Duration)>,
    /// What a phase did, said after the phases.
    pub notes: Vec<String>,
    /// The family one family's apply is of (`None`: the compile's times).
    pub family: Option<Family>,
    /// The load put back what someone else changed in the rules the record says are
    /// loaded (the document was the recorded one).
    pub repaired: bool,
    /// The stale conntrack cleanup: how long it took and how many entries it deleted.
    pub conntrack: Option<(Duration, u64)>,
}

impl Times {
    /// The phase that ends now ([`Kind::Other`]).
    pub fn mark(&mut self, phase: &'static str) {
        self.mark_as(phase, Kind::Other);
    }

    /// A planning phase ends now.
    pub fn plan(&mut self, phase: &'static str) {
        self.mark_as(phase, Kind::Plan);
    }

    /// A phase spent in the kernel or its tools ends now.
    pub fn kernel(&mut self, phase: &'static str) {
        self.mark_as(phase, Kind::Kernel);
    }

    fn mark_as(&mut self, phase: &'static str, kind: Kind) {
        let now = Instant::now();
        if let Some(last) = self.last {
            self.phases.push((phase, kind, now - last));
        }
        self.last = Some(now);
    }

    /// The time the phases of `kind` took together.
    pub fn total(&self, kind: Kind) -> Duration {
        self.phases
            .iter()
            .filter(|p| p.1 == kind)
            .map(|p| p.2)
            .sum()
    }

    pub fn print(&self, what: &str) {
        if let Ok(mut kept) = KEPT.lock() {
            if let Some(kept) = kept.as_mut() {
                let phases: Vec<String> = self
                    .phases
                    .iter()
                    .map(|(p, _, d)| format!("{p} {:.1} ms", d.as_secs_f64() * 1e3))
                    .collect();
                let notes: String = self.notes.iter().map(|n| format!(" ({n})")).collect();
                kept.push(Kept {
                    line: format!("{what}{notes}: {}", phases.join(", ")),
                    family: self.family,
                    plan: self.total(Kind::Plan),
                    kernel: self.total(Kind::Kernel),
                    repaired: self.repaired,
                    conntrack: self.conntrack,
                });
            }
        }
        if std::env::var_os("SVC_COMPILE_APPLY_TIMES").is_none() {
            return;
        }
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|(p, _, d)| format!("{p} {} ms", d.as_millis()))
            .collect();
        // svc-compile's own peak, without the tools it ran (wait4 on it counts theirs).
        // SAFETY: an all-zero rusage is valid; getrusage fills it.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: RUSAGE_SELF with a valid pointer.
        let rss_kb = match unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } {
            0 => usage.ru_maxrss,
            _ => 0,
        };
        let notes: String = self.notes.iter().map(|n| format!("; {n}")).collect();
        eprintln!(
            "svc-compile: times: {what}: {}; own peak RSS {rss_kb} kB{notes}",
            phases.join(", ")
        );
    }
}

/// One [`Times::print`], kept for the agent: its sync line says where each sync's time
/// went, and its metrics take the family's plan and kernel time, a repair, the conntrack
/// cleanup.
#[derive(Clone, Debug)]
pub struct Kept {
    /// `WHAT (NOTES): PHASE N ms, ...`.
    pub line: String,
    /// `None`: the compile's times.
    pub family: Option<Family>,
    pub plan: Duration,
    pub kernel: Duration,
    pub repaired: bool,
    pub conntrack: Option<(Duration, u64)>,
}

/// What [`Times::print`] was given since the last [`take_kept`], when [`keep`] is on.
static KEPT: std::sync::Mutex<Option<Vec<Kept>>> = std::sync::Mutex::new(None);

/// From now on, keep each [`Times::print`]'s phases for [`take_kept`].
pub fn keep() {
    if let Ok(mut k) = KEPT.lock() {
        k.get_or_insert_with(Vec::new);
    }
}

/// What was kept since the last call, in order.
pub fn take_kept() -> Vec<Kept> {
    KEPT.lock()
        .ok()
        .and_then(|mut k| k.as_mut().map(std::mem::take))
        .unwrap_or_default()
}
