//! `svc-compile agent`: kube-proxy's job on a node, from manifests in files. A resident
//! process that applies the manifests at start, again whenever they change, and every sync
//! period (which finds and mends what someone else changed in the rules it owns).
//!
//! Every sync is an [`apply`](crate::apply::apply) with the same guarantees: the state
//! directory's lock, atomic loads, verification, mending foreign writes, the records a
//! restart and `--rollback` use, the stale UDP conntrack entries and the sysctls. What the
//! agent adds: it waits for the files to settle ([`watch::Batch`]: no sync while a changed
//! file is open for writing), keeps each file's parse between syncs (the CLI's
//! [`Source`]), keeps the last good state loaded when the manifests have errors, and stops
//! on SIGTERM or SIGINT leaving the rules loaded, as kube-proxy does. Beside the loop it
//! runs kube-proxy's HTTP servers ([`crate::serve`]): a health-check server per
//! externalTrafficPolicy=Local LoadBalancer service, `/healthz` and `/livez`, `/metrics`.
//!
//! Architecture Invariant: the agent decides nothing `apply` decides; it chooses when to
//! sync and reports what each sync did.

pub mod changes;
pub mod files;
pub mod watch;

use crate::apply::{self, Compile, Input};
use crate::serve::{self, HealthCheck, Servers};
use crate::times::Times;
use crate::Fail;
use changes::{Object, Tracker};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};
use svc_compiler::net::IpFamily;
use svc_targets::plan::Family;
use svc_targets::{Params, Target};
use watch::{Batch, Wake, Watch};

/// The agent's flags (besides the compile's, which the [`Source`] holds).
#[derive(Clone, Debug)]
pub struct Options {
    /// `--netns`, `--state-dir`, `--lock-timeout`, `--cgroup`, `--family`, as apply's.
    pub apply: apply::Options,
    /// `--sync-period`: the longest time between two syncs (kube-proxy's, 30 s).
    pub sync_period: Duration,
    /// `--min-sync-period`: the shortest time between two syncs (batches changes).
    pub min_sync_period: Duration,
    /// How long the files must be quiet before a sync.
    pub quiet: Duration,
    /// How long a file open for writing may hold a sync back.
    pub patience: Duration,
    /// `--log-format json`.
    pub json_log: bool,
    /// `--healthz-bind-address` (`/healthz`, `/livez`) and `--metrics-bind-address`;
    /// `None`: not served.
    pub healthz: Option<std::net::SocketAddr>,
    pub metrics: Option<std::net::SocketAddr>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            apply: apply::Options::default(),
            sync_period: Duration::from_secs(30),
            min_sync_period: Duration::ZERO,
            quiet: Duration::from_millis(10),
            patience: Duration::from_secs(2),
            json_log: false,
            healthz: Some(serve::Options::HEALTHZ),
            metrics: Some(serve::Options::METRICS),
        }
    }
}

/// The manifests, as the command line reads and compiles them.
pub trait Source {
    /// The files and directories to watch.
    fn watched(&self) -> Vec<PathBuf>;
    /// Read the manifests now, for an apply (which compiles them if it needs to).
    fn input(&mut self) -> Result<Input<'_>, Fail>;
    /// What the compiles since the last call parsed: (files parsed again, input files).
    fn parsed(&mut self) -> (usize, usize);
}

/// Why a sync ran.
#[derive(Debug)]
enum Reason {
    Start,
    Files(usize),
    Rescan(String),
    Period,
}

impl Reason {
    fn text(&self) -> String {
        match self {
            Reason::Start => "start".into(),
            Reason::Files(n) => format!("{n} file(s) changed"),
            Reason::Rescan(why) => format!("read everything: {why}"),
            Reason::Period => "sync period".into(),
        }
    }
}

/// What a sync did.
enum Synced {
    Applied,
    Rejected,
    Failed(String),
}

/// Counts since the start, for the log (and the metrics).
#[derive(Default, Debug)]
pub struct Counts {
    pub syncs: u64,
    pub applied: u64,
    pub rejected: u64,
    pub failed: u64,
}

/// Run until SIGTERM or SIGINT (0). `Err` when it cannot start (not root, no namespace,
/// no watch); a sync that fails is logged, counted and retried at the next change or period.
pub fn run(
    target: &'static Target,
    opts: &Options,
    params: &Params,
    source: &mut dyn Source,
) -> Result<u8, Fail> {
    apply::preflight(target, &opts.apply)?;
    let watch = Watch::new(&source.watched())?;
    let servers = Servers::start(serve::Options {
        netns: opts.apply.netns.clone(),
        healthz: opts.healthz,
        metrics: opts.metrics,
        ..serve::Options::new(opts.sync_period)
    })?;
    crate::times::keep();
    let mut agent = Agent {
        target,
        opts,
        params,
        counts: Counts::default(),
        last: None,
        servers,
        families: vec![IpFamily::IPv4],
        checks: None,
        tracker: Tracker::new(SystemTime::now()),
    };
    agent.log_line("started", &[("target", target.name.to_string())]);
    agent.sync(source, Reason::Start);
    let mut batch = Batch::new();
    loop {
        let last = agent.last.unwrap_or_else(Instant::now);
        let period = last + opts.sync_period;
        let deadline = if batch.is_empty() {
            period
        } else {
            // Not before the files settle: the period waits for them too.
            batch
                .ready_at(opts.quiet, opts.patience)
                .max(last + opts.min_sync_period)
        };
        match watch.next(deadline) {
            Some(Wake::Stop(signal)) => {
                agent.log_line(
                    "stopped",
                    &[
                        ("signal", signal.to_string()),
                        ("rules", "left loaded".into()),
                    ],
                );
                return Ok(0);
            }
            Some(Wake::Hangup) => batch.rescan("SIGHUP".into()),
            Some(Wake::Rescan(why)) => batch.rescan(why),
            Some(Wake::File { path, open }) => batch.file(path, open),
            None if batch.is_empty() => agent.sync(source, Reason::Period),
            None => {
                let reason = match batch.rescan.take() {
                    Some(why) => Reason::Rescan(why),
                    None => Reason::Files(batch.files.len()),
                };
                batch = Batch::new();
                agent.sync(source, reason);
            }
        }
    }
}

struct Agent<'a> {
    target: &'static Target,
    opts: &'a Options,
    params: &'a Params,
    counts: Counts,
    /// When the last sync ended.
    last: Option<Instant>,
    servers: Servers,
    /// The families the last compile had views of.
    families: Vec<IpFamily>,
    /// The health checks being served (`None`: no compile yet).
    checks: Option<Vec<HealthCheck>>,
    /// The objects of the last applied sync, for the change counters.
    tracker: Tracker,
}

/// What a sync's compile showed, for the servers and the metrics.
struct Seen {
    compile_secs: f64,
    /// `None`: the manifests have errors.
    views: Option<Views>,
}

struct Views {
    checks: Vec<HealthCheck>,
    families: Vec<IpFamily>,
    node_eligible: bool,
    objects: Vec<Object>,
}

impl Agent<'_> {
    fn sync(&mut self, source: &mut dyn Source, reason: Reason) {
        let start = Instant::now();
        self.counts.syncs += 1;
        for f in &self.families {
            self.servers.queued(*f);
        }
        let full = matches!(reason, Reason::Start | Reason::Rescan(_));
        let mut seen: Option<Seen> = None;
        let result = match source.input() {
            Err(Fail(e)) => Synced::Failed(e),
            Ok(input) => {
                // The first sync always compiles: the health checks come from the views.
                let first = self.checks.is_none();
                let input = watch_compile(input, first, &mut seen);
                match apply::apply(self.target, &self.opts.apply, self.params, input) {
                    Ok(0) => Synced::Applied,
                    Ok(_) => Synced::Rejected,
                    Err(Fail(e)) => Synced::Failed(e),
                }
            }
        };
        let secs = start.elapsed().as_secs_f64();
        let ended = SystemTime::now();
        let metrics = self.servers.metrics();
        let kept = crate::times::take_kept();
        for k in &kept {
            let Some(f) = k.family.map(ip_family) else {
                continue;
            };
            metrics.observe_plan(f, k.plan.as_secs_f64());
            metrics.observe_kernel(f, k.kernel.as_secs_f64());
            if k.repaired {
                metrics.drift_repaired(f);
            }
            if let Some((took, deleted)) = k.conntrack {
                metrics.conntrack_reconciled(f, took.as_secs_f64(), deleted);
            }
        }
        let mut views = None;
        if let Some(s) = seen {
            metrics.observe_compile(s.compile_secs);
            views = s.views;
        }
        match (&result, views) {
            (Synced::Applied, Some(v)) => {
                self.families = v.families;
                // The sync that programs a change: counted, and its latency measured, now.
                let changes = self.tracker.changes(&v.objects, &self.families);
                self.tracker.applied(&v.objects);
                metrics.service_changes(changes.services);
                metrics.endpoint_changes(changes.slices);
                for (family, trigger) in changes.triggers {
                    let latency = match ended.duration_since(trigger) {
                        Ok(d) => d.as_secs_f64(),
                        Err(e) => -e.duration().as_secs_f64(),
                    };
                    metrics.observe_network_programming(family, latency);
                }
                self.servers.set_node_eligible(v.node_eligible);
                for (service, e) in self.servers.set_health_checks(v.checks.clone()) {
                    self.log_line("health-check", &[("service", service), ("error", e)]);
                }
                self.checks = Some(v.checks);
            }
            (Synced::Rejected, _) => metrics.sync_rejected(),
            _ => {}
        }
        if matches!(result, Synced::Applied) {
            for f in &self.families {
                metrics.observe_sync(*f, secs, full);
                self.servers.updated(*f);
            }
        }
        let (parsed, files) = source.parsed();
        let ms = format!("{:.1}", start.elapsed().as_secs_f64() * 1e3);
        let mut fields = vec![
            ("sync", self.counts.syncs.to_string()),
            ("reason", reason.text()),
        ];
        match &result {
            Synced::Applied => {
                self.counts.applied += 1;
                fields.push(("result", "applied".into()));
            }
            Synced::Rejected => {
                self.counts.rejected += 1;
                fields.push(("result", "rejected".into()));
                fields.push((
                    "what",
                    "the manifests have errors (printed above); the node keeps the last good state"
                        .into(),
                ));
            }
            Synced::Failed(e) => {
                self.counts.failed += 1;
                fields.push(("result", "failed".into()));
                fields.push(("error", e.clone()));
            }
        }
        fields.push(("parsed", format!("{parsed}/{files}")));
        if !kept.is_empty() {
            let phases: Vec<&str> = kept.iter().map(|k| k.line.as_str()).collect();
            fields.push(("phases", phases.join("; ")));
        }
        fields.push(("ms", ms));
        self.log_line("sync", &fields);
        self.last = Some(Instant::now());
    }

    /// One log line on stderr: `svc-compile: agent: EVENT: k=v, ...` or a JSON object.
    fn log_line(&self, event: &str, fields: &[(&str, String)]) {
        let line = if self.opts.json_log {
            let mut o = serde_json::Map::new();
            let ts = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            o.insert("ts".into(), serde_json::json!(ts));
            o.insert("event".into(), serde_json::json!(event));
            for (k, v) in fields {
                o.insert((*k).into(), serde_json::json!(v));
            }
            serde_json::Value::Object(o).to_string()
        } else {
            let kv: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("svc-compile: agent: {event}: {}", kv.join(", "))
        };
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}");
    }
}

/// The apply's input with its compile watched: what the views say for the servers goes
/// into `seen`. `force`: no fingerprint, so the apply compiles even when the inputs are
/// the last apply's (it then finds the node as recorded and loads nothing).
fn watch_compile<'a>(input: Input<'a>, force: bool, seen: &'a mut Option<Seen>) -> Input<'a> {
    let Input::Manifests {
        key,
        times,
        compile,
    } = input
    else {
        return input;
    };
    Input::Manifests {
        key: key.filter(|_| !force),
        times,
        compile: Box::new(move |t: &mut Times| -> Compile {
            let start = Instant::now();
            let mut r = compile(t);
            let views = match &mut r {
                Ok(Ok(c)) => Some(Views {
                    checks: svc_targets::health::health_checks(&c.views),
                    families: c.views.iter().map(|v| v.family).collect(),
                    node_eligible: c.node_eligible,
                    objects: std::mem::take(&mut c.objects),
                }),
                _ => None,
            };
            *seen = Some(Seen {
                compile_secs: start.elapsed().as_secs_f64(),
                views,
            });
            r
        }),
    }
}

fn ip_family(f: Family) -> IpFamily {
    match f {
        Family::V4 => IpFamily::IPv4,
        Family::V6 => IpFamily::IPv6,
    }
}
