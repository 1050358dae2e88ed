//! The agent's Prometheus metrics: kube-proxy's (`pkg/proxy/metrics/metrics.go`: names,
//! help texts with component-base's `[ALPHA] ` mark, buckets, `ip_family` labels) where
//! the agent measures the same thing, and its own under `svc_compile_agent_`.
//!
//! The `prometheus` crate writes the text format 0.0.4 that kube-proxy serves (and that
//! `promtool check metrics` reads); `prometheus-client` writes only OpenMetrics, whose
//! counter families drop `_total` from `# HELP`/`# TYPE` and which promtool 2.42 rejects.

use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, Opts, Registry, TextEncoder,
};
use prometheus::{GaugeVec, IntGaugeVec};
use svc_compiler::net::IpFamily;

/// kube-proxy's sync buckets: 1 ms × 2^k, 15 of them (1 ms … 16.384 s).
fn sync_buckets() -> Vec<f64> {
    exponential_buckets(0.001, 2.0, 15).expect("valid buckets")
}

/// `network_programming_duration_seconds`' buckets: 0, then 0.25 and 0.5 s, 1 … 59 s by
/// 1 s, 60 … 115 s by 5 s, 120 … 300 s by 30 s (component-base's `MergeBuckets` starts its
/// list with the 0).
fn network_programming_buckets() -> Vec<f64> {
    let mut b = vec![0.0, 0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

/// The metrics handle. Every method is cheap and never fails; call it from the agent's
/// sync thread.
pub struct Metrics {
    registry: Registry,
    sync: HistogramVec,
    sync_full: HistogramVec,
    sync_partial: HistogramVec,
    last_synced: GaugeVec,
    last_queued: GaugeVec,
    network_programming: HistogramVec,
    endpoint_changes: IntCounter,
    service_changes: IntCounter,
    healthz: IntCounterVec,
    livez: IntCounterVec,
    conntrack_seconds: HistogramVec,
    conntrack_deleted: IntCounterVec,
    compile: Histogram,
    plan: HistogramVec,
    kernel: HistogramVec,
    drift_repairs: IntCounterVec,
    rejected_syncs: IntCounter,
    health_check_errors: IntCounter,
    health_checks: IntGaugeVec,
}

/// component-base writes a metric's stability level before its help text.
fn alpha(help: &str) -> String {
    format!("[ALPHA] {help}")
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let registry = Registry::new();
        let histogram = |name: &str, help: String, buckets: Vec<f64>, labels: &[&str]| {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
                .expect("valid histogram");
            registry
                .register(Box::new(h.clone()))
                .expect("registered once");
            h
        };
        let counter = |name: &str, help: String, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
            registry
                .register(Box::new(c.clone()))
                .expect("registered once");
            c
        };
        let gauge = |name: &str, help: String| {
            let g = GaugeVec::new(Opts::new(name, help), &["ip_family"]).expect("valid gauge");
            registry
                .register(Box::new(g.clone()))
                .expect("registered once");
            g
        };
        let family = &["ip_family"][..];
        let sync = histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            alpha("SyncProxyRules latency in seconds"),
            sync_buckets(),
            family,
        );
        let sync_full = histogram(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            alpha("SyncProxyRules latency in seconds for full resyncs"),
            sync_buckets(),
            family,
        );
        let sync_partial = histogram(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            alpha("SyncProxyRules latency in seconds for partial resyncs"),
            sync_buckets(),
            family,
        );
        let last_synced = gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            alpha("The last time proxy rules were successfully synced"),
        );
        let last_queued = gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            alpha("The last time a sync of proxy rules was queued"),
        );
        let network_programming = histogram(
            "kubeproxy_network_programming_duration_seconds",
            alpha("In Cluster Network Programming Latency in seconds"),
            network_programming_buckets(),
            family,
        );
        let endpoint_changes = counter(
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            alpha("Cumulative proxy rules Endpoint changes"),
            &[],
        )
        .with_label_values::<&str>(&[]);
        let service_changes = counter(
            "kubeproxy_sync_proxy_rules_service_changes_total",
            alpha("Cumulative proxy rules Service changes"),
            &[],
        )
        .with_label_values::<&str>(&[]);
        let healthz = counter(
            "kubeproxy_proxy_healthz_total",
            alpha("Cumulative proxy healthz HTTP status"),
            &["code"],
        );
        let livez = counter(
            "kubeproxy_proxy_livez_total",
            alpha("Cumulative proxy livez HTTP status"),
            &["code"],
        );
        let conntrack_seconds = histogram(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            alpha("ReconcileConntrackFlowsLatency latency in seconds"),
            sync_buckets(),
            family,
        );
        let conntrack_deleted = counter(
            "kubeproxy_conntrack_reconciler_deleted_entries_total",
            alpha("Cumulative conntrack flows deleted by conntrack reconciler"),
            family,
        );
        let compile = histogram(
            "svc_compile_agent_compile_duration_seconds",
            "Time to read and compile the manifests into the node's views, in seconds".into(),
            sync_buckets(),
            &[],
        )
        .with_label_values::<&str>(&[]);
        let plan = histogram(
            "svc_compile_agent_plan_duration_seconds",
            "Time to plan one family's rules (from the record or the node's read) and compare what was read back, in seconds".into(),
            sync_buckets(),
            family,
        );
        let kernel = histogram(
            "svc_compile_agent_kernel_duration_seconds",
            "Time spent in the kernel and its tools (reads, loads, read-backs) for one family's sync, in seconds".into(),
            sync_buckets(),
            family,
        );
        let drift_repairs = counter(
            "svc_compile_agent_drift_repairs_total",
            "Syncs that found the node's rules changed by someone else and loaded them again"
                .into(),
            family,
        );
        let rejected_syncs = counter(
            "svc_compile_agent_rejected_syncs_total",
            "Syncs refused because the manifests had errors (the rules in place were kept)".into(),
            &[],
        )
        .with_label_values::<&str>(&[]);
        let health_check_errors = counter(
            "svc_compile_agent_health_check_server_errors_total",
            "Service health-check servers that could not listen (retried on the next sync)".into(),
            &[],
        )
        .with_label_values::<&str>(&[]);
        let health_checks = IntGaugeVec::new(
            Opts::new(
                "svc_compile_agent_health_check_servers",
                "Service health-check servers listening",
            ),
            &[],
        )
        .expect("valid gauge");
        registry
            .register(Box::new(health_checks.clone()))
            .expect("registered once");
        Metrics {
            registry,
            sync,
            sync_full,
            sync_partial,
            last_synced,
            last_queued,
            network_programming,
            endpoint_changes,
            service_changes,
            healthz,
            livez,
            conntrack_seconds,
            conntrack_deleted,
            compile,
            plan,
            kernel,
            drift_repairs,
            rejected_syncs,
            health_check_errors,
            health_checks,
        }
    }

    /// One sync of `family` took `seconds`; `full` when the whole ruleset was written,
    /// else an incremental one (kube-proxy's full and partial resyncs).
    pub fn observe_sync(&self, family: IpFamily, seconds: f64, full: bool) {
        let f = [family.as_str()];
        self.sync.with_label_values(&f).observe(seconds);
        let kind = if full {
            &self.sync_full
        } else {
            &self.sync_partial
        };
        kind.with_label_values(&f).observe(seconds);
    }

    /// From a changed EndpointSlice's `endpoints.kubernetes.io/last-change-trigger-time`
    /// to the end of the sync that programmed it (may be negative with a clock skew, as
    /// kube-proxy's).
    pub fn observe_network_programming(&self, family: IpFamily, seconds: f64) {
        self.network_programming
            .with_label_values(&[family.as_str()])
            .observe(seconds);
    }

    /// EndpointSlices added, changed or removed, seen by a sync.
    pub fn endpoint_changes(&self, n: u64) {
        self.endpoint_changes.inc_by(n);
    }

    /// Services added, changed or removed, seen by a sync.
    pub fn service_changes(&self, n: u64) {
        self.service_changes.inc_by(n);
    }

    /// The stale-conntrack cleanup of `family` took `seconds` and deleted `deleted` flows.
    pub fn conntrack_reconciled(&self, family: IpFamily, seconds: f64, deleted: u64) {
        let f = [family.as_str()];
        self.conntrack_seconds
            .with_label_values(&f)
            .observe(seconds);
        self.conntrack_deleted.with_label_values(&f).inc_by(deleted);
    }

    /// Reading and compiling the manifests took `seconds`.
    pub fn observe_compile(&self, seconds: f64) {
        self.compile.observe(seconds);
    }

    /// Planning `family` took `seconds`.
    pub fn observe_plan(&self, family: IpFamily, seconds: f64) {
        self.plan
            .with_label_values(&[family.as_str()])
            .observe(seconds);
    }

    /// `family`'s kernel work (reads, loads, read-backs) took `seconds`.
    pub fn observe_kernel(&self, family: IpFamily, seconds: f64) {
        self.kernel
            .with_label_values(&[family.as_str()])
            .observe(seconds);
    }

    /// A sync of `family` found the rules the record says are loaded changed by someone
    /// else, and loaded them again.
    pub fn drift_repaired(&self, family: IpFamily) {
        self.drift_repairs
            .with_label_values(&[family.as_str()])
            .inc();
    }

    /// A sync was refused because the manifests had errors.
    pub fn sync_rejected(&self) {
        self.rejected_syncs.inc();
    }

    pub(crate) fn last_synced(&self, family: IpFamily, unix_seconds: f64) {
        self.last_synced
            .with_label_values(&[family.as_str()])
            .set(unix_seconds);
    }

    pub(crate) fn last_queued(&self, family: IpFamily, unix_seconds: f64) {
        self.last_queued
            .with_label_values(&[family.as_str()])
            .set(unix_seconds);
    }

    pub(crate) fn healthz(&self, code: u16) {
        self.healthz.with_label_values(&[code.to_string()]).inc();
    }

    pub(crate) fn livez(&self, code: u16) {
        self.livez.with_label_values(&[code.to_string()]).inc();
    }

    pub(crate) fn health_check_errors(&self, n: usize) {
        self.health_check_errors.inc_by(n as u64);
    }

    pub(crate) fn health_check_servers(&self, n: usize) {
        self.health_checks
            .with_label_values::<&str>(&[])
            .set(n as i64);
    }

    /// The exposition (Prometheus text format 0.0.4).
    pub fn encode(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into memory");
        String::from_utf8(out).expect("the text format is UTF-8")
    }

    /// `Content-Type` of [`Metrics::encode`]'s text.
    pub fn content_type() -> &'static str {
        "text/plain; version=0.0.4; charset=utf-8"
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_kube_proxys() {
        let b = sync_buckets();
        assert_eq!(b.len(), 15);
        assert_eq!((b[0], b[14]), (0.001, 16.384));
        let n = network_programming_buckets();
        assert_eq!(n.len(), 1 + 2 + 59 + 12 + 7);
        assert_eq!(&n[..5], &[0.0, 0.25, 0.5, 1.0, 2.0]);
        assert_eq!(&n[61..64], &[59.0, 60.0, 65.0]);
        assert_eq!(&n[n.len() - 2..], &[270.0, 300.0]);
    }

    #[test]
    fn observations_show_under_kube_proxys_names() {
        let m = Metrics::new();
        m.observe_sync(IpFamily::IPv4, 0.003, true);
        m.observe_sync(IpFamily::IPv6, 0.02, false);
        m.last_synced(IpFamily::IPv4, 1_772_366_400.5);
        m.endpoint_changes(3);
        m.healthz(200);
        m.healthz(503);
        m.healthz(503);
        m.conntrack_reconciled(IpFamily::IPv4, 0.01, 4);
        m.sync_rejected();
        m.health_check_errors(2);
        let text = m.encode();
        for line in [
            "# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds",
            "# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.004\"} 1",
            "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 1",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 1",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1772366400.5",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 3",
            "kubeproxy_proxy_healthz_total{code=\"503\"} 2",
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 4",
            "svc_compile_agent_rejected_syncs_total 1",
            "svc_compile_agent_health_check_server_errors_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
        // A full sync is not a partial one.
        assert!(!text.contains(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}"
        ));
    }
}
