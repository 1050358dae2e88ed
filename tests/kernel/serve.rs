//! The agent's HTTP servers (`svc_node::serve`) inside a node's network namespace, asked
//! from a LAN client over the lab's bridge: the service health checks follow each
//! `set_health_checks`, `/healthz` and `/livez` follow the syncs reported, `/metrics`
//! passes `promtool check metrics`, a silent connection blocks nobody, and every port is
//! free again once its server is removed or the servers are dropped.

use super::lab::{skip, NODE};
use super::sys::in_netns;
use super::{require_root, Lab, LabSpec};
use crate::support::TempDir;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use svc_compiler::net::{Cidr, IpFamily};
use svc_compiler::passes::node::{node_view, NodeSelection};
use svc_compiler::source::SourceMap;
use svc_node::serve::{HealthCheck, Limits, Options, Servers};

const CLIENT: &str = "client1";
/// The node's LAN addresses.
const NODE_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const NODE_V6: Ipv6Addr = super::addr::v6(NODE_V4);
/// Hang guard for one request (not a time limit: answers come in milliseconds).
const WAIT: Duration = Duration::from_secs(30);

fn lab(tag: &str) -> Lab {
    let spec = LabSpec {
        clients: vec![super::HostSpec::new(CLIENT, Ipv4Addr::new(192, 0, 2, 100))],
        ..LabSpec::bare()
    };
    let spec = LabSpec { ipv6: true, ..spec };
    Lab::new(tag, &spec).expect("lab")
}

/// An answer as read off the wire.
#[derive(Debug)]
pub(super) struct Got {
    pub(super) status: u16,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: String,
}

impl Got {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads an HTTP/1.1 answer to the end of the connection (the request said `close`).
fn read_answer(mut s: TcpStream) -> io::Result<Got> {
    s.set_read_timeout(Some(WAIT))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8(raw).map_err(io::Error::other)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other(format!("no head in {text:?}")))?;
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let status = first
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {first:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    Ok(Got {
        status,
        headers,
        body: body.to_string(),
    })
}

/// `GET path` from `host`'s namespace to `dst` on a new connection.
pub(super) fn try_get(lab: &Lab, host: &str, dst: SocketAddr, path: &str) -> io::Result<Got> {
    in_netns(lab.netns(host), || {
        let mut s = TcpStream::connect_timeout(&dst, WAIT)?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n"
        )?;
        read_answer(s)
    })?
}

pub(super) fn get(lab: &Lab, host: &str, dst: SocketAddr, path: &str) -> Got {
    try_get(lab, host, dst, path).unwrap_or_else(|e| panic!("GET {dst}{path} from {host}: {e}"))
}

/// Whether a connection from `host` to `dst` is refused (nothing listens), tried for up
/// to a second (see [`free_in_node`]: a forked copy of a closed listener still accepts).
fn refused(lab: &Lab, host: &str, dst: SocketAddr) -> bool {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let r =
            in_netns(lab.netns(host), || TcpStream::connect_timeout(&dst, WAIT)).expect("netns");
        match r {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return true,
            r if Instant::now() >= deadline => {
                eprintln!("connect to {dst} from {host}: {r:?}");
                return false;
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// `set_health_checks(checks)`, which must succeed: called again for up to a second
/// while a port is still held by a forked copy of the socket that was closed (see
/// [`free_in_node`]), as the agent's next sync would.
fn settle(servers: &Servers, checks: &[HealthCheck]) {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let errors = servers.set_health_checks(checks.to_vec());
        if errors.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{errors:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `addr` can be bound in the node's namespace, tried for up to a second: a
/// process another test forks meanwhile holds a copy of every descriptor until it execs
/// (close-on-exec), so a closed socket can look bound for that long.
fn free_in_node(lab: &Lab, addr: SocketAddr) -> bool {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let r = in_netns(lab.netns(NODE), || TcpListener::bind(addr).map(drop)).expect("netns");
        match r {
            Ok(()) => return true,
            Err(e) if Instant::now() >= deadline => {
                eprintln!("bind {addr} in the node: {e}");
                return false;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn v4(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(NODE_V4), port)
}

fn v6(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(NODE_V6), port)
}

const ANY_V4: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
const ANY_V6: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

fn options(lab: &Lab) -> Options {
    Options {
        netns: Some(lab.netns(NODE).to_string()),
        ..Options::new(Duration::from_secs(30))
    }
}

/// A LoadBalancer with externalTrafficPolicy Local and health-check node port 31000,
/// dual-stack; on node `node`: a ready and a terminating IPv4 endpoint on two ports, a
/// ready IPv6 one; on `node2`, a ready IPv4 one.
const MANIFESTS: &str = "\
apiVersion: v1
kind: Node
metadata: {name: node}
status: {addresses: [{type: InternalIP, address: 192.0.2.10}, {type: InternalIP, address: \"fd00:192:0:2::10\"}]}
---
apiVersion: v1
kind: Node
metadata: {name: node2}
status: {addresses: [{type: InternalIP, address: 198.51.100.2}, {type: InternalIP, address: \"fd00:198:51:100::2\"}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: 31000
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIPs: [10.96.0.10, \"fd00:10:96::10\"]
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080}
  - {name: https, port: 443, targetPort: 8443, nodePort: 30443}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: https, port: 8443}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node}
- {addresses: [10.244.1.3], nodeName: node, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.2.2], nodeName: node2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}, {name: https, port: 8443}]
endpoints:
- {addresses: [\"fd00:10:244:1::2\"], nodeName: node}
";

/// What `svc_targets::health` derives from [`MANIFESTS`] for the node `node`.
fn derived() -> Vec<HealthCheck> {
    let mut sources = SourceMap::default();
    let f = sources.add("serve.yaml", MANIFESTS);
    let opts = svc_compiler::Options {
        allocate: true,
        service_cidrs: Some(vec![
            "10.96.0.0/16".parse::<Cidr>().unwrap(),
            "fd00:10:96::/112".parse::<Cidr>().unwrap(),
        ]),
        ..Default::default()
    };
    let comp = svc_compiler::compile(&sources, &[f], &opts);
    assert!(!comp.diags.has_errors(), "{:?}", comp.diags);
    let sel = NodeSelection {
        name: NODE.into(),
        ips: vec![],
    };
    let views: Vec<_> = [IpFamily::IPv4, IpFamily::IPv6]
        .into_iter()
        .map(|f| node_view(&comp.module, &sel, f).expect("view"))
        .collect();
    svc_targets::health::health_checks(&views)
}

#[test]
fn health_checks_answer_the_lan_and_follow_each_update() {
    if !require_root("kernel serve: health-check node ports") {
        return;
    }
    let lab = lab("hc");
    let servers = Servers::start(options(&lab)).expect("servers");
    servers.set_node_eligible(true);

    // Derived from the manifests: one check, both families, 2 local ready endpoints.
    let mut web = derived();
    assert_eq!(web.len(), 1, "{web:?}");
    assert_eq!(
        (
            web[0].key().as_str(),
            web[0].port,
            &web[0].addresses,
            web[0].local_endpoints
        ),
        ("shop/web", 31000, &vec![ANY_V4, ANY_V6], 2)
    );
    settle(&servers, &web);
    for dst in [v4(31000), v6(31000)] {
        let g = get(&lab, CLIENT, dst, "/any/path");
        assert_eq!(g.status, 200, "{dst}: {g:?}");
        assert_eq!(g.header("X-Load-Balancing-Endpoint-Weight"), Some("2"));
        assert_eq!(g.header("Content-Type"), Some("application/json"));
        assert_eq!(g.header("X-Content-Type-Options"), Some("nosniff"));
        assert_eq!(
            g.body,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
    }

    // No local endpoint left: 503 with weight 0, on the same sockets.
    web[0].local_endpoints = 0;
    settle(&servers, &web);
    let g = get(&lab, CLIENT, v4(31000), "/");
    assert_eq!(
        (g.status, g.header("X-Load-Balancing-Endpoint-Weight")),
        (503, Some("0")),
        "{g:?}"
    );
    assert!(g.body.contains("\"localEndpoints\": 0,"), "{}", g.body);

    // Addresses changed: IPv4's node IP only; IPv6 is refused.
    web[0].local_endpoints = 1;
    web[0].addresses = vec![IpAddr::V4(NODE_V4)];
    settle(&servers, &web);
    assert_eq!(get(&lab, CLIENT, v4(31000), "/").status, 200);
    assert!(refused(&lab, CLIENT, v6(31000)));

    // Port changed: the old one is closed, the new one answers.
    web[0].port = 31001;
    settle(&servers, &web);
    assert!(refused(&lab, CLIENT, v4(31000)));
    assert!(free_in_node(&lab, SocketAddr::new(ANY_V4, 31000)));
    assert_eq!(get(&lab, CLIENT, v4(31001), "/").status, 200);
    assert_eq!(
        servers.health_checks(),
        [("shop/web".to_string(), vec![v4(31001)])]
    );

    // Removed: refused, and the port is free once the call returns.
    settle(&servers, &[]);
    assert!(refused(&lab, CLIENT, v4(31001)));
    assert!(free_in_node(&lab, v4(31001)));

    // The servers were never in the test's own namespace: the LAN reached the node.
    drop(servers);
}

#[test]
fn a_taken_port_is_that_services_error_and_the_next_call_retries() {
    if !require_root("kernel serve: health check on a taken port") {
        return;
    }
    let lab = lab("hctaken");
    let servers = Servers::start(options(&lab)).expect("servers");
    servers.set_node_eligible(true);
    let taker = in_netns(lab.netns(NODE), || TcpListener::bind(v4(31010)))
        .expect("netns")
        .expect("take the port in the node");
    let check = |name: &str, port: u16| HealthCheck {
        namespace: "shop".into(),
        name: name.into(),
        port,
        addresses: vec![ANY_V4, ANY_V6],
        local_endpoints: 1,
    };
    let wanted = vec![check("taken", 31010), check("free", 31011)];
    let errors = servers.set_health_checks(wanted.clone());
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, "shop/taken");
    assert!(errors[0].1.contains("0.0.0.0:31010"), "{errors:?}");
    // Nothing of the failed service listens (its IPv6 socket was closed with it); the
    // other one serves.
    assert!(refused(&lab, CLIENT, v6(31010)));
    assert_eq!(get(&lab, CLIENT, v4(31011), "/").status, 200);
    // The port is given back: the next call opens it.
    drop(taker);
    settle(&servers, &wanted);
    assert_eq!(get(&lab, CLIENT, v4(31010), "/").status, 200);
    assert_eq!(get(&lab, CLIENT, v6(31010), "/").status, 200);
    // Dropping the servers frees every port: health checks, /healthz, /metrics.
    drop(servers);
    for addr in [
        SocketAddr::new(ANY_V4, 31010),
        SocketAddr::new(ANY_V6, 31011),
        SocketAddr::new(ANY_V6, 10256),
        Options::METRICS,
    ] {
        assert!(free_in_node(&lab, addr), "{addr} still taken");
    }
}

#[test]
fn healthz_and_livez_follow_the_syncs_reported() {
    if !require_root("kernel serve: /healthz and /livez") {
        return;
    }
    let lab = lab("healthz");
    let timeout = Duration::from_millis(300);
    let servers = Servers::start(Options {
        health_timeout: timeout,
        ..options(&lab)
    })
    .expect("servers");
    // 0.0.0.0:10256 listens on both families, as Go's listener does.
    let (h4, h6) = (v4(10256), v6(10256));

    // Starting: healthy, but the node is not known yet.
    assert_eq!(get(&lab, CLIENT, h4, "/livez").status, 200);
    let g = get(&lab, CLIENT, h6, "/healthz");
    assert_eq!(g.status, 503, "{g:?}");
    assert!(
        g.body.contains("\"nodeEligible\":false,\"healthy\":true}"),
        "{}",
        g.body
    );
    servers.set_node_eligible(true);
    assert_eq!(get(&lab, CLIENT, h4, "/healthz").status, 200);

    // A sync queued and not done within the timeout: both fail, and so do the service
    // health checks (serviceProxyHealthy false).
    servers.updated(IpFamily::IPv4);
    servers.updated(IpFamily::IPv6);
    let hc = HealthCheck {
        namespace: "shop".into(),
        name: "web".into(),
        port: 31020,
        addresses: vec![ANY_V4],
        local_endpoints: 3,
    };
    settle(&servers, &[hc]);
    servers.queued(IpFamily::IPv6);
    let queued = Instant::now();
    let g = get(&lab, CLIENT, h4, "/livez");
    if queued.elapsed() < timeout {
        assert_eq!(g.status, 200, "pending for less than the timeout: {g:?}");
    }
    // The wait that makes the pending sync late (it defines the transition).
    std::thread::sleep(timeout + Duration::from_millis(100));
    for path in ["/livez", "/healthz"] {
        let g = get(&lab, CLIENT, h4, path);
        assert_eq!(g.status, 503, "{path}: {g:?}");
        assert!(
            g.body.contains("\"IPv4\":{")
                && g.body.contains("\"healthy\":true}")
                && g.body.contains("\"healthy\":false,\"status\""),
            "{path}: {}",
            g.body
        );
    }
    let g = get(&lab, CLIENT, v4(31020), "/");
    assert_eq!(g.status, 503, "{g:?}");
    assert!(
        g.body.ends_with("\"serviceProxyHealthy\": false\n}"),
        "{}",
        g.body
    );

    // The sync is done: healthy again; a node about to go away fails /healthz only.
    servers.updated(IpFamily::IPv6);
    assert_eq!(get(&lab, CLIENT, h6, "/livez").status, 200);
    assert_eq!(get(&lab, CLIENT, v4(31020), "/").status, 200);
    servers.set_node_eligible(false);
    assert_eq!(get(&lab, CLIENT, h4, "/healthz").status, 503);
    assert_eq!(get(&lab, CLIENT, h4, "/livez").status, 200);
    assert_eq!(get(&lab, CLIENT, h4, "/metrics").status, 404);
}

#[test]
fn metrics_pass_promtool_check_metrics() {
    if !require_root("kernel serve: /metrics") {
        return;
    }
    if std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_err()
    {
        skip(
            "kernel serve: /metrics",
            "promtool is not installed (Debian package prometheus)",
        );
        return;
    }
    let lab = lab("metrics");
    let servers = Servers::start(options(&lab)).expect("servers");
    servers.set_node_eligible(true);
    // Every metric the agent writes gets a sample.
    let m = servers.metrics();
    for family in [IpFamily::IPv4, IpFamily::IPv6] {
        servers.queued(family);
        servers.updated(family);
        m.observe_sync(family, 0.012, true);
        m.observe_sync(family, 0.003, false);
        m.observe_network_programming(family, 1.5);
        m.conntrack_reconciled(family, 0.002, 3);
        m.observe_plan(family, 0.004);
        m.observe_kernel(family, 0.008);
        m.drift_repaired(family);
    }
    m.observe_compile(0.05);
    m.endpoint_changes(4);
    m.service_changes(2);
    m.sync_rejected();
    let taker = in_netns(lab.netns(NODE), || TcpListener::bind(v4(31030)))
        .expect("netns")
        .expect("take a port");
    let hc = HealthCheck {
        namespace: "shop".into(),
        name: "web".into(),
        port: 31030,
        addresses: vec![IpAddr::V4(NODE_V4)],
        local_endpoints: 1,
    };
    assert_eq!(servers.set_health_checks(vec![hc]).len(), 1);
    drop(taker);
    get(&lab, CLIENT, v4(10256), "/healthz");
    get(&lab, CLIENT, v4(10256), "/livez");

    // 127.0.0.1:10249 in the node: scraped from the node itself.
    let g = get(&lab, NODE, Options::METRICS, "/metrics");
    assert_eq!(g.status, 200);
    assert_eq!(
        g.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    for line in [
        "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 2",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.016\"} 1",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total 4",
        "kubeproxy_proxy_healthz_total{code=\"200\"} 1",
        "kubeproxy_proxy_livez_total{code=\"200\"} 1",
        "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 3",
        "svc_compile_agent_health_check_server_errors_total 1",
        "svc_compile_agent_rejected_syncs_total 1",
    ] {
        assert!(g.body.lines().any(|l| l == line), "{line:?} not in\n{}", g.body);
    }
    // Not reachable from the LAN (loopback of the node).
    assert!(try_get(&lab, CLIENT, Options::METRICS, "/metrics").is_err());

    let tmp = TempDir::new("serve-metrics");
    let file = tmp.path().join("metrics.txt");
    std::fs::write(&file, &g.body).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_silent_connection_blocks_no_other_request() {
    if !require_root("kernel serve: slowloris") {
        return;
    }
    let lab = lab("slow");
    let read_timeout = Duration::from_secs(3);
    let _servers = Servers::start(Options {
        limits: Limits {
            connections: 2,
            read_timeout,
            ..Limits::default()
        },
        ..options(&lab)
    })
    .expect("servers");
    let h = v4(10256);
    let connect = || {
        in_netns(lab.netns(CLIENT), || TcpStream::connect_timeout(&h, WAIT))
            .expect("netns")
            .expect("connect")
    };
    // One client opens a connection and sends nothing.
    let silent = connect();
    let opened = Instant::now();
    let g = get(&lab, CLIENT, h, "/livez");
    assert_eq!(g.status, 200);
    // Answered while the silent connection was still open (not after it was dropped).
    assert!(
        opened.elapsed() < read_timeout,
        "answered after {:?}: the silent connection held it up",
        opened.elapsed()
    );
    silent.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    assert!(
        matches!((&silent).read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock),
        "the silent connection is still open"
    );

    // Both slots taken by silent clients: a request waits for a slot, which the read
    // timeout frees; it is answered, and the silent ones are closed (EOF, no answer).
    let silent2 = connect();
    let g = get(&lab, CLIENT, h, "/livez");
    assert_eq!(g.status, 200);
    for s in [silent, silent2] {
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut rest = Vec::new();
        let r = (&s).read_to_end(&mut rest);
        assert!(
            r.is_ok() || matches!(&r, Err(e) if e.kind() == io::ErrorKind::ConnectionReset),
            "the silent connection is not closed: {r:?} {rest:?}"
        );
    }
}
