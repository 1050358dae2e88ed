//! The HTTP plumbing every server shares: the runtime thread, listening sockets (made in
//! the node's network namespace), and one accept loop per socket with the limits.
//!
//! Limits, per server (one health-check service, `/healthz`, `/metrics`): at most
//! [`Limits::connections`] connections at once (the next is accepted when one ends: the
//! kernel's backlog holds the rest, so memory stays bounded); request heads up to
//! [`Limits::header_bytes`]; a request head must arrive within [`Limits::read_timeout`]
//! (also the idle time allowed between keep-alive requests); a connection lives at most
//! [`Limits::lifetime`] (a client that never reads its answer).

use super::answer::Reply;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use socket2::{Domain, Protocol, Socket, Type};
use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

/// Bounds on what one server accepts (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once.
    pub connections: usize,
    /// Request line and headers, in bytes (at least 8192: hyper's smallest buffer).
    pub header_bytes: usize,
    /// Time for a request's head to arrive, and idle time between keep-alive requests.
    pub read_timeout: Duration,
    /// Time a connection may stay open at all.
    pub lifetime: Duration,
}

impl Default for Limits {
    /// 32 connections, 8 KiB heads, 5 s to send one, 30 s per connection.
    fn default() -> Limits {
        Limits {
            connections: 32,
            header_bytes: 8192,
            read_timeout: Duration::from_secs(5),
            lifetime: Duration::from_secs(30),
        }
    }
}

/// Answers a request from its method and path (all these servers need).
pub(crate) trait Respond: Send + Sync + 'static {
    fn respond(&self, method: &Method, path: &str) -> Reply;
}

/// How long a stop waits for the runtime to close a server's sockets.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// The runtime thread: a current-thread tokio runtime that runs every server's tasks.
/// Dropping it stops the thread and closes every socket.
pub(crate) struct Runtime {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Runtime {
    pub fn start() -> io::Result<Runtime> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("svc-serve".into())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stopped.await;
                });
                // Dropping the runtime cancels every task: listeners and connections close.
                drop(rt);
            })?;
        Ok(Runtime {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Serves `app` on `listeners` (made by [`listen`]), sharing one connection limit.
    pub fn serve(
        &self,
        listeners: Vec<std::net::TcpListener>,
        app: Arc<dyn Respond>,
        limits: Limits,
    ) -> io::Result<Server> {
        let _in_runtime = self.handle.enter();
        let slots = Arc::new(Semaphore::new(limits.connections.max(1)));
        let mut server = Server {
            tasks: Vec::new(),
            addrs: Vec::new(),
        };
        for l in listeners {
            let addr = l.local_addr()?;
            let l = match TcpListener::from_std(l) {
                Ok(l) => l,
                Err(e) => {
                    self.stop(vec![server]);
                    return Err(e);
                }
            };
            server.addrs.push(addr);
            server.tasks.push(self.handle.spawn(accept_loop(
                l,
                app.clone(),
                limits,
                slots.clone(),
            )));
        }
        Ok(server)
    }

    /// Stops `servers` and returns once their sockets are closed (the ports are free).
    pub fn stop(&self, servers: Vec<Server>) {
        let tasks: Vec<JoinHandle<()>> = servers.into_iter().flat_map(|s| s.tasks).collect();
        if tasks.is_empty() {
            return;
        }
        for t in &tasks {
            t.abort();
        }
        let (done, wait) = std::sync::mpsc::channel();
        self.handle.spawn(async move {
            for t in tasks {
                // An aborted task's future (its listener, its connections) is dropped
                // before its handle completes.
                let _ = t.await;
            }
            let _ = done.send(());
        });
        let _ = wait.recv_timeout(STOP_WAIT);
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One server's accept loops (one per socket). Stopped by [`Runtime::stop`] or with the
/// runtime.
pub(crate) struct Server {
    tasks: Vec<JoinHandle<()>>,
    /// The addresses it listens on.
    pub addrs: Vec<SocketAddr>,
}

/// Where a socket listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bind {
    /// Exactly this address; an IPv6 wildcard takes IPv6 only.
    Exact(SocketAddr),
    /// Go's `net.Listen("tcp", "0.0.0.0:port")` (or `[::]`): every address of both
    /// families on one IPv6 socket, or IPv4's alone where the kernel has no IPv6.
    AnyFamily(u16),
}

impl std::fmt::Display for Bind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bind::Exact(a) => write!(f, "{a}"),
            Bind::AnyFamily(port) => write!(f, "[::]:{port} (both families)"),
        }
    }
}

/// The backlog of every listening socket (Go's: the kernel's somaxconn caps it).
const BACKLOG: i32 = 128;

/// Opens a listening socket: `SO_REUSEADDR` as Go's listeners, close-on-exec.
pub(crate) fn listen(bind: Bind) -> io::Result<std::net::TcpListener> {
    let (addr, v6only) = match bind {
        Bind::Exact(a) => (a, true),
        Bind::AnyFamily(port) => (
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
            false,
        ),
    };
    let socket = match Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)) {
        Err(e)
            if matches!(bind, Bind::AnyFamily(_))
                && e.raw_os_error() == Some(libc::EAFNOSUPPORT) =>
        {
            return listen(Bind::Exact(SocketAddr::new(
                IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                addr.port(),
            )));
        }
        r => r?,
    };
    if addr.is_ipv6() {
        socket.set_only_v6(v6only)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

async fn accept_loop(
    listener: TcpListener,
    app: Arc<dyn Respond>,
    limits: Limits,
    slots: Arc<Semaphore>,
) {
    // Dropped with this task: every connection it started ends with it.
    let mut conns = JoinSet::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                drop(slot);
                // A connection that failed before it was accepted is the client's
                // problem; anything else (out of descriptors) waits a little, as Go's
                // server does, instead of spinning.
                if !matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                ) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        while conns.try_join_next().is_some() {}
        let app = app.clone();
        conns.spawn(async move {
            let _slot = slot;
            serve_connection(stream, app, limits).await;
        });
    }
}

async fn serve_connection(stream: tokio::net::TcpStream, app: Arc<dyn Respond>, limits: Limits) {
    let service = service_fn(move |req: Request<Incoming>| {
        let reply = app.respond(req.method(), req.uri().path());
        async move { Ok::<_, Infallible>(response(reply)) }
    });
    let header_bytes = limits.header_bytes.max(8192);
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout)
        .max_buf_size(header_bytes)
        .max_header_size(header_bytes)
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), service);
    // Errors (a client gone, a head too large or too slow) only end this connection.
    let _ = tokio::time::timeout(limits.lifetime, conn).await;
}

fn response(reply: Reply) -> Response<Full<Bytes>> {
    let mut builder = Response::builder().status(reply.status);
    for (name, value) in reply.headers {
        builder = builder.header(name, value);
    }
    builder
        .body(Full::new(Bytes::from(reply.body)))
        .unwrap_or_else(|_| {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
            r
        })
}
