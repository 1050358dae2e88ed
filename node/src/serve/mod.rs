//! The resident agent's HTTP servers, as kube-proxy runs them beside its sync loop:
//!
//! - a health-check server per LoadBalancer service with externalTrafficPolicy Local, on
//!   its `healthCheckNodePort` (`pkg/proxy/healthcheck/service_health.go`), for the load
//!   balancer to learn which nodes have local endpoints;
//! - `/healthz` and `/livez` (`proxy_health.go`), default `0.0.0.0:10256`;
//! - `/metrics` (`pkg/proxy/metrics`), default `127.0.0.1:10249`.
//!
//! The agent starts them once ([`Servers::start`]) and, from its sync thread, reports
//! ([`Servers::queued`], [`Servers::updated`], [`Servers::set_node_eligible`], the
//! [`Metrics`] handle) and hands over the health checks each sync derives
//! ([`Servers::set_health_checks`], with `svc_targets::health::health_checks`). No call
//! waits on a client.
//!
//! Where: with [`Options::netns`] every socket is created by a thread that has entered
//! that network namespace (the node), and served from the runtime thread, which stays in
//! the agent's own namespace: a socket belongs to the namespace it was made in.
//!
//! How: hyper's HTTP/1 server on a current-thread tokio runtime, on one thread of its own.
//! On a 2-core node the servers answer a few requests a second; one thread serves every
//! socket, idle connections cost a task each instead of a thread, and hyper gives what a
//! hand-written server would have to get right: a head-size cap, a timeout on reading a
//! head (slowloris), keep-alive, pipelining, HEAD, and Go's behaviour on malformed
//! requests (400/431). The limits are [`Limits`], per server. A flood can take a server's
//! connection slots for at most [`Limits::read_timeout`] (or [`Limits::lifetime`]); it
//! never reaches the sync thread, which only takes a mutex the answers hold for a few
//! microseconds.
//!
//! Invariant: a health-check server that cannot listen (a port taken) is an error for
//! that service alone, returned and counted, never a panic; it is tried again on the next
//! [`Servers::set_health_checks`].

mod answer;
mod http;
mod metrics;
mod proxy;

pub use http::Limits;
pub use metrics::Metrics;
pub use svc_targets::health::HealthCheck;

use crate::Fail;
use answer::Reply;
use http::{listen, Bind, Respond, Runtime, Server};
use hyper::Method;
use proxy::{Now, Probe, ProxyHealth};
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use svc_compiler::net::IpFamily;

/// What [`Servers::start`] opens, and where.
#[derive(Clone, Debug)]
pub struct Options {
    /// The node's network namespace (`/run/netns/NAME`); `None`: this process's.
    pub netns: Option<String>,
    /// `/healthz` and `/livez` (kube-proxy's `healthzBindAddress`); `None`: not served.
    /// An unspecified IP listens on both families, as Go does.
    pub healthz: Option<SocketAddr>,
    /// `/metrics` (`metricsBindAddress`); `None`: not served.
    pub metrics: Option<SocketAddr>,
    /// How long a queued sync may stay pending before the proxy is unhealthy.
    pub health_timeout: Duration,
    pub limits: Limits,
}

impl Options {
    /// kube-proxy's `healthzBindAddress` default.
    pub const HEALTHZ: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 10256);
    /// kube-proxy's `metricsBindAddress` default.
    pub const METRICS: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 10249);

    /// kube-proxy's defaults for a sync period: both servers on their default addresses,
    /// health timeout 2 × `sync_period`, in this process's namespace.
    pub fn new(sync_period: Duration) -> Options {
        Options {
            netns: None,
            healthz: Some(Options::HEALTHZ),
            metrics: Some(Options::METRICS),
            health_timeout: sync_period * 2,
            limits: Limits::default(),
        }
    }
}

/// The running servers. Dropping it closes every socket and stops the runtime thread.
pub struct Servers {
    netns: Option<File>,
    limits: Limits,
    proxy: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
    healthz_addrs: Vec<SocketAddr>,
    metrics_addrs: Vec<SocketAddr>,
    checks: Mutex<BTreeMap<String, Check>>,
    /// `/healthz` and `/metrics`: they run until the runtime stops.
    fixed: Vec<Server>,
    // Last: dropped after the handles above, it closes the sockets.
    rt: Runtime,
}

/// One service's running health check.
struct Check {
    port: u16,
    addresses: Vec<IpAddr>,
    state: Arc<ServiceCheck>,
    server: Server,
}

impl Servers {
    /// Starts the runtime thread and opens `/healthz` and `/metrics`. `Err` when the
    /// namespace cannot be entered or a socket cannot listen (one line, for the agent to
    /// exit with).
    pub fn start(options: Options) -> Result<Servers, Fail> {
        let netns = match &options.netns {
            None => None,
            Some(name) => Some(
                File::open(std::path::Path::new("/run/netns").join(name))
                    .map_err(|e| Fail(format!("cannot open network namespace {name}: {e}")))?,
            ),
        };
        let rt = Runtime::start()
            .map_err(|e| Fail(format!("cannot start the HTTP servers' thread: {e}")))?;
        let mut servers = Servers {
            netns,
            limits: options.limits,
            proxy: Arc::new(ProxyHealth::new(options.health_timeout)),
            metrics: Arc::new(Metrics::new()),
            healthz_addrs: Vec::new(),
            metrics_addrs: Vec::new(),
            checks: Mutex::new(BTreeMap::new()),
            fixed: Vec::new(),
            rt,
        };
        let fixed: [(Option<SocketAddr>, &str, Arc<dyn Respond>); 2] = [
            (
                options.healthz,
                "/healthz",
                Arc::new(ProxyServer {
                    proxy: servers.proxy.clone(),
                    metrics: servers.metrics.clone(),
                }),
            ),
            (
                options.metrics,
                "/metrics",
                Arc::new(MetricsServer {
                    metrics: servers.metrics.clone(),
                }),
            ),
        ];
        let where_ = match &options.netns {
            Some(ns) => format!(" in network namespace {ns}"),
            None => String::new(),
        };
        for (addr, what, app) in fixed {
            let Some(addr) = addr else { continue };
            let bind = if addr.ip().is_unspecified() {
                Bind::AnyFamily(addr.port())
            } else {
                Bind::Exact(addr)
            };
            let listeners = servers
                .listen_in_node(vec![vec![bind]])
                .and_then(|mut r| r.remove(0))
                .map_err(|e| Fail(format!("cannot serve {what} on {addr}{where_}: {e}")))?;
            let server = servers
                .rt
                .serve(listeners, app, servers.limits)
                .map_err(|e| Fail(format!("cannot serve {what} on {addr}{where_}: {e}")))?;
            if what == "/healthz" {
                servers.healthz_addrs = server.addrs.clone();
            } else {
                servers.metrics_addrs = server.addrs.clone();
            }
            servers.fixed.push(server);
        }
        Ok(servers)
    }

    /// Where `/healthz` and `/livez` listen (the bound addresses: a port 0 asked for is
    /// the port the kernel chose).
    pub fn healthz_addrs(&self) -> &[SocketAddr] {
        &self.healthz_addrs
    }

    /// Where `/metrics` listens.
    pub fn metrics_addrs(&self) -> &[SocketAddr] {
        &self.metrics_addrs
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A sync of `family` was asked for (a change seen, the sync period over): kube-proxy's
    /// `QueuedUpdate` and `sync_proxy_rules_last_queued_timestamp_seconds`.
    pub fn queued(&self, family: IpFamily) {
        let now = Now::read();
        self.proxy.queued(family, now);
        self.metrics
            .last_queued(family, proxy::unix_seconds(now.wall));
    }

    /// `family`'s rules are synced: kube-proxy's `Updated` and
    /// `sync_proxy_rules_last_timestamp_seconds`. Call it also once at start, as
    /// kube-proxy's sync loop does.
    pub fn updated(&self, family: IpFamily) {
        let now = Now::read();
        self.proxy.updated(family, now);
        self.metrics
            .last_synced(family, proxy::unix_seconds(now.wall));
    }

    /// Whether the node may take load-balancer traffic (`/healthz` only): the Node is
    /// known, has no `deletionTimestamp` and no `ToBeDeletedByClusterAutoscaler` taint.
    /// False until first set.
    pub fn set_node_eligible(&self, eligible: bool) {
        self.proxy.set_node_eligible(eligible);
    }

    /// What `/livez` says now (every synced family within the health timeout).
    pub fn healthy(&self) -> bool {
        self.proxy.health(Now::read()).healthy
    }

    /// Makes `checks` the running health-check servers (one per service, by
    /// `namespace/name`): starts the new ones, stops the ones not named any more, reopens
    /// one whose port or addresses changed, and updates the others' counts in place.
    /// Returns `(namespace/name, error)` for each service that could not listen (also
    /// counted in `svc_compile_agent_health_check_server_errors_total`); it is not
    /// running, and the next call tries again. Returns when every socket it closed is
    /// closed.
    pub fn set_health_checks(&self, checks: Vec<HealthCheck>) -> Vec<(String, String)> {
        let mut running = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        let wanted: BTreeMap<String, HealthCheck> =
            checks.into_iter().map(|c| (c.key(), c)).collect();

        // Stop first, so that a port moving between services is free to open again.
        let gone: Vec<String> = running
            .iter()
            .filter(|(key, c)| {
                wanted
                    .get(*key)
                    .is_none_or(|w| w.port != c.port || w.addresses != c.addresses)
            })
            .map(|(key, _)| key.clone())
            .collect();
        let stopped: Vec<Server> = gone
            .iter()
            .filter_map(|key| running.remove(key))
            .map(|c| c.server)
            .collect();
        self.rt.stop(stopped);

        let mut new = Vec::new();
        for (key, w) in wanted {
            match running.get(&key) {
                Some(c) => c
                    .state
                    .local_endpoints
                    .store(w.local_endpoints, Ordering::Relaxed),
                None => new.push(w),
            }
        }
        let mut errors = Vec::new();
        let binds: Vec<Vec<Bind>> = new
            .iter()
            .map(|w| {
                w.addresses
                    .iter()
                    .map(|ip| Bind::Exact(SocketAddr::new(*ip, w.port)))
                    .collect()
            })
            .collect();
        match self.listen_in_node(binds) {
            Err(e) => {
                for w in &new {
                    errors.push((w.key(), format!("cannot enter the node's namespace: {e}")));
                }
            }
            Ok(listened) => {
                for (w, listeners) in new.into_iter().zip(listened) {
                    let state = Arc::new(ServiceCheck {
                        namespace: w.namespace.clone(),
                        name: w.name.clone(),
                        local_endpoints: AtomicUsize::new(w.local_endpoints),
                        proxy: self.proxy.clone(),
                    });
                    let served = listeners.and_then(|l| {
                        self.rt
                            .serve(l, state.clone() as Arc<dyn Respond>, self.limits)
                    });
                    match served {
                        Ok(server) => {
                            running.insert(
                                w.key(),
                                Check {
                                    port: w.port,
                                    addresses: w.addresses,
                                    state,
                                    server,
                                },
                            );
                        }
                        Err(e) => errors.push((
                            w.key(),
                            format!("cannot serve its health check on port {}: {e}", w.port),
                        )),
                    }
                }
            }
        }
        self.metrics.health_check_errors(errors.len());
        self.metrics.health_check_servers(running.len());
        errors
    }

    /// The running health checks and the addresses each listens on, by `namespace/name`.
    pub fn health_checks(&self) -> Vec<(String, Vec<SocketAddr>)> {
        let running = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        running
            .iter()
            .map(|(key, c)| (key.clone(), c.server.addrs.clone()))
            .collect()
    }

    /// Opens each group of sockets in the node's namespace (one thread for all); a group
    /// that fails closes what it opened. `Err` when the namespace cannot be entered.
    fn listen_in_node(
        &self,
        groups: Vec<Vec<Bind>>,
    ) -> io::Result<Vec<io::Result<Vec<std::net::TcpListener>>>> {
        let open = move || {
            groups
                .into_iter()
                .map(|group| {
                    group
                        .into_iter()
                        .map(|b| {
                            listen(b).map_err(|e| {
                                io::Error::new(e.kind(), format!("listen on {b}: {e}"))
                            })
                        })
                        .collect::<io::Result<Vec<_>>>()
                })
                .collect::<Vec<_>>()
        };
        match &self.netns {
            None => Ok(open()),
            Some(ns) => crate::netns::in_netns(ns, open),
        }
    }
}

impl std::fmt::Debug for Servers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Servers")
            .field("healthz", &self.healthz_addrs)
            .field("metrics", &self.metrics_addrs)
            .finish_non_exhaustive()
    }
}

/// One service's health check: kube-proxy's `hcInstance` and `hcHandler`.
struct ServiceCheck {
    namespace: String,
    name: String,
    local_endpoints: AtomicUsize,
    proxy: Arc<ProxyHealth>,
}

impl Respond for ServiceCheck {
    /// Any method, any path.
    fn respond(&self, _: &Method, _: &str) -> Reply {
        let count = self.local_endpoints.load(Ordering::Relaxed);
        let healthy = self.proxy.health(Now::read()).healthy;
        answer::service_health(&self.namespace, &self.name, count, healthy)
    }
}

/// `/healthz` and `/livez`.
struct ProxyServer {
    proxy: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
}

impl Respond for ProxyServer {
    fn respond(&self, _: &Method, path: &str) -> Reply {
        let probe = match path {
            "/healthz" => Probe::Healthz,
            "/livez" => Probe::Livez,
            _ => return answer::not_found(),
        };
        let now = Now::read();
        let health = self.proxy.health(now);
        let reply = proxy::answer(probe, &health, self.proxy.node_eligible(), now.wall);
        match probe {
            Probe::Healthz => self.metrics.healthz(reply.status),
            Probe::Livez => self.metrics.livez(reply.status),
        }
        reply
    }
}

/// `/metrics`.
struct MetricsServer {
    metrics: Arc<Metrics>,
}

impl Respond for MetricsServer {
    fn respond(&self, _: &Method, path: &str) -> Reply {
        if path != "/metrics" {
            return answer::not_found();
        }
        Reply {
            status: 200,
            headers: vec![("Content-Type", Metrics::content_type().to_string())],
            body: self.metrics.encode().into_bytes(),
        }
    }
}

#[cfg(test)]
mod tests;
