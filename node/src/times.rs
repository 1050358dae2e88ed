//! Profiling: where an apply spent its time.

use std::time::{Duration, Instant};

/// Where one apply spent its time, printed on stderr when `SVC_COMPILE_APPLY_TIMES` is set
/// (profiling; `cargo bench --bench apply` shows it).
#[derive(Default)]
pub struct Times {
    last: Option<Instant>,
    phases: Vec<(&'static str, Duration)>,
    /// What a phase did, said after the phases.
    pub notes: Vec<String>,
}

impl Times {
    pub fn mark(&mut self, phase: &'static str) {
        let now = Instant::now();
        if let Some(last) = self.last {
            self.phases.push((phase, now - last));
        }
        self.last = Some(now);
    }

    pub fn print(&self, what: &str) {
        if let Ok(mut kept) = KEPT.lock() {
            if let Some(kept) = kept.as_mut() {
                let phases: Vec<String> = self
                    .phases
                    .iter()
                    .map(|(p, d)| format!("{p} {:.1} ms", d.as_secs_f64() * 1e3))
                    .collect();
                let notes: String = self.notes.iter().map(|n| format!(" ({n})")).collect();
                kept.push(format!("{what}{notes}: {}", phases.join(", ")));
            }
        }
        if std::env::var_os("SVC_COMPILE_APPLY_TIMES").is_none() {
            return;
        }
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|(p, d)| format!("{p} {} ms", d.as_millis()))
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

/// What [`Times::print`] was given since the last [`take_kept`], when [`keep`] is on (the
/// agent's sync line says where each sync's time went).
static KEPT: std::sync::Mutex<Option<Vec<String>>> = std::sync::Mutex::new(None);

/// From now on, keep each [`Times::print`]'s phases for [`take_kept`].
pub fn keep() {
    if let Ok(mut k) = KEPT.lock() {
        k.get_or_insert_with(Vec::new);
    }
}

/// What was kept since the last call, `WHAT: PHASE N ms, ...` each, in order.
pub fn take_kept() -> Vec<String> {
    KEPT.lock()
        .ok()
        .and_then(|mut k| k.as_mut().map(std::mem::take))
        .unwrap_or_default()
}
