//! The servers on loopback in this process's namespace (no root needed): what goes on
//! the wire, and the health checks' lifecycle. The kernel tests (`tests/kernel/serve.rs`)
//! run them inside a node's namespace and ask from another host.

use super::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(10);

/// An answer as read off the wire: status, headers in order, body.
#[derive(Debug)]
struct Got {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Got {
    /// The header names, sorted (their order on the wire is not part of HTTP), without
    /// `Connection` (the echo of the request's `close`).
    fn names(&self) -> Vec<&str> {
        let mut n: Vec<&str> = self
            .headers
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| *n != "Connection")
            .collect();
        n.sort_unstable();
        n
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One `method path` request on a fresh connection (`Connection: close`).
fn request(addr: SocketAddr, method: &str, path: &str) -> io::Result<Got> {
    let mut s = TcpStream::connect_timeout(&addr, WAIT)?;
    s.set_read_timeout(Some(WAIT))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8(raw).map_err(io::Error::other)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other(format!("no head in {text:?}")))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {status_line:?}")))?;
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

fn get(addr: SocketAddr, path: &str) -> Got {
    request(addr, "GET", path).unwrap_or_else(|e| panic!("GET {addr}{path}: {e}"))
}

fn loopback() -> Servers {
    let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    Servers::start(Options {
        netns: None,
        healthz: Some(any),
        metrics: Some(any),
        health_timeout: Duration::from_secs(60),
        limits: Limits::default(),
    })
    .expect("servers start on loopback")
}

/// Binds `addr`, tried for up to a second: a process another test forks meanwhile holds
/// a copy of every descriptor until it execs, so a closed socket can look bound that long.
fn bind_soon(addr: SocketAddr) -> io::Result<TcpListener> {
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        match TcpListener::bind(addr) {
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            r => return r,
        }
    }
}

/// A port nothing listens on now (the kernel's pick, released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn check(name: &str, port: u16, count: usize) -> HealthCheck {
    HealthCheck {
        namespace: "shop".into(),
        name: name.into(),
        port,
        addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        local_endpoints: count,
    }
}

#[test]
fn healthz_and_livez_on_the_wire() {
    let s = loopback();
    let addr = s.healthz_addrs()[0];
    s.updated(IpFamily::IPv4);
    // The node is not known yet: /healthz fails, /livez does not.
    let g = get(addr, "/healthz");
    assert_eq!(g.status, 503, "{g:?}");
    assert_eq!(
        g.names(),
        [
            "Content-Length",
            "Content-Type",
            "Date",
            "X-Content-Type-Options"
        ],
        "{g:?}"
    );
    assert_eq!(g.header("Content-Type"), Some("application/json"));
    assert_eq!(g.header("Content-Length"), Some(&*g.body.len().to_string()));
    assert!(
        g.body
            .contains("\"nodeEligible\":false,\"healthy\":true,\"status\":{\"IPv4\":{"),
        "{}",
        g.body
    );
    assert_eq!(get(addr, "/livez").status, 200);
    s.set_node_eligible(true);
    assert_eq!(get(addr, "/healthz").status, 200);
    assert!(s.healthy());
    // Any method; other paths are Go's 404.
    assert_eq!(request(addr, "POST", "/livez").unwrap().status, 200);
    let g = get(addr, "/metrics");
    assert_eq!((g.status, g.body.as_str()), (404, "404 page not found\n"));
    // The answers are counted by code.
    let m = get(s.metrics_addrs()[0], "/metrics");
    assert_eq!(m.status, 200);
    assert_eq!(
        m.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    for line in [
        "kubeproxy_proxy_healthz_total{code=\"200\"} 1",
        "kubeproxy_proxy_healthz_total{code=\"503\"} 1",
        "kubeproxy_proxy_livez_total{code=\"200\"} 2",
    ] {
        assert!(
            m.body.lines().any(|l| l == line),
            "{line:?} not in\n{}",
            m.body
        );
    }
    assert_eq!(get(s.metrics_addrs()[0], "/healthz").status, 404);
}

#[test]
fn health_checks_follow_each_call() {
    let s = loopback();
    let port = free_port();
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    assert!(s.set_health_checks(vec![check("web", port, 0)]).is_empty());
    let g = get(addr, "/anything");
    assert_eq!(g.status, 503);
    assert_eq!(g.header("X-Load-Balancing-Endpoint-Weight"), Some("0"));
    // A new count, in place: the same socket keeps serving.
    assert!(s.set_health_checks(vec![check("web", port, 2)]).is_empty());
    let g = get(addr, "/");
    assert_eq!(g.status, 200);
    assert_eq!(
        g.names(),
        [
            "Content-Length",
            "Content-Type",
            "Date",
            "X-Content-Type-Options",
            "X-Load-Balancing-Endpoint-Weight",
        ]
    );
    assert_eq!(
        g.body,
        "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
    );
    assert_eq!(s.health_checks(), [("shop/web".to_string(), vec![addr])]);
    // Removed: the port is free again once the call returns.
    assert!(s.set_health_checks(vec![]).is_empty());
    bind_soon(addr).expect("the port is free after the check is removed");
    assert!(s.health_checks().is_empty());
}

#[test]
fn a_taken_port_is_an_error_for_that_service_and_retried() {
    let s = loopback();
    let taken = TcpListener::bind("127.0.0.1:0").expect("a port to take");
    let port = taken.local_addr().unwrap().port();
    let other = free_port();
    let errors = s.set_health_checks(vec![check("web", port, 1), check("db", other, 1)]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, "shop/web");
    assert!(
        errors[0].1.contains(&format!("127.0.0.1:{port}")),
        "{errors:?}"
    );
    // The other service runs.
    assert_eq!(s.health_checks().len(), 1);
    let m = get(s.metrics_addrs()[0], "/metrics").body;
    assert!(
        m.contains("svc_compile_agent_health_check_server_errors_total 1\n"),
        "{m}"
    );
    // Once the port is free, the next call opens it.
    drop(taken);
    // Tried for up to a second, as in `bind_soon`.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        let errors = s.set_health_checks(vec![check("web", port, 1), check("db", other, 1)]);
        if errors.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{errors:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    assert_eq!(get(addr, "/").status, 200);
    // Dropping the servers frees every port.
    drop(s);
    bind_soon(addr).expect("the port is free after the servers are dropped");
}

#[test]
fn a_silent_connection_does_not_block_another_and_is_closed() {
    let s = Servers::start(Options {
        netns: None,
        healthz: Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)),
        metrics: None,
        health_timeout: Duration::from_secs(60),
        limits: Limits {
            read_timeout: Duration::from_millis(300),
            ..Limits::default()
        },
    })
    .expect("servers start");
    let addr = s.healthz_addrs()[0];
    let mut silent = TcpStream::connect(addr).unwrap();
    assert_eq!(get(addr, "/livez").status, 200);
    // The silent one is closed after the read timeout: EOF, no answer.
    silent.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = Vec::new();
    let started = std::time::Instant::now();
    let _ = silent.read_to_end(&mut buf);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // A head larger than allowed is refused (431), not buffered.
    let mut big = TcpStream::connect(addr).unwrap();
    big.set_read_timeout(Some(WAIT)).unwrap();
    let head = format!(
        "GET /livez HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let _ = big.write_all(head.as_bytes());
    let mut answer = String::new();
    let _ = big.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
}

/// The agent may hand the servers to another thread or share them.
#[test]
fn servers_are_send_and_sync() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Servers>();
    shareable::<Metrics>();
}
