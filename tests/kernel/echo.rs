//! "Who am I, who are you" servers and the probes that talk to them. No child
//! processes: a socket stays in the network namespace it was created in, so
//! each server and each probe runs on its own thread that first `setns`-es
//! into the host's namespace.
//!
//! Wire format: the server answers one line, `<host-name> <peer-ip>\n`, where
//! peer-ip is the source address it saw (IPv4-mapped addresses shown as IPv4).
//! TCP: accept, write the line, close. UDP: each datagram gets the line back.
use svc_node::sys::libc;

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::sys::{enter_netns, in_netns};

/// How long one probe may take at most (connect plus answer).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a server thread looks at its stop flag.
const SERVER_TICK_MS: i32 = 50;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proto {
    Tcp,
    Udp,
}

/// What one probe got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A server answered: its host name and the source address it saw.
    Answered {
        backend: String,
        seen_source: IpAddr,
    },
    /// ECONNREFUSED: a TCP RST, or an ICMP port-unreachable (e.g. from an
    /// iptables `REJECT`, or a pod with no server on that port).
    /// IPv6 TCP refused by an ICMPv6 error takes ~1 s: in one kernel the
    /// error comes back while connect() still holds the socket lock, so it
    /// only becomes a soft error (TcpExtLockDroppedIcmps); the SYN
    /// retransmit 1 s later gets the hard one. An RST is immediate.
    Refused,
    /// No answer within [`PROBE_TIMEOUT`] (e.g. `DROP`, or no route further).
    TimedOut,
    /// Anything else (host or network unreachable, a garbled answer, ...),
    /// with the error text.
    Failed(String),
}

impl Outcome {
    /// Shorthand for assertions.
    pub fn answered(backend: &str, seen_source: impl Into<IpAddr>) -> Outcome {
        Outcome::Answered {
            backend: backend.to_owned(),
            seen_source: seen_source.into(),
        }
    }

    /// The answering backend, if any.
    pub fn backend(&self) -> Option<&str> {
        match self {
            Outcome::Answered { backend, .. } => Some(backend),
            _ => None,
        }
    }
}

/// A running server thread; stopped (and joined) by [`Server::stop`] or Drop.
pub struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Starts a server for `host` (the name it answers with) inside `netns`,
    /// listening on `[::]:port` dual-stack (falls back to `0.0.0.0` if the
    /// namespace has no IPv6). Returns once the socket is bound.
    pub fn start(netns: &str, host: &str, proto: Proto, port: u16) -> io::Result<Server> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let (netns, host, flag) = (netns.to_owned(), host.to_owned(), stop.clone());
        let thread = thread::Builder::new()
            .name(format!("echo-{host}-{proto:?}-{port}"))
            .spawn(move || {
                let socket = enter_netns(&netns).and_then(|()| bind_any(proto, port));
                match socket {
                    Ok(fd) => {
                        let _ = ready_tx.send(Ok(()));
                        serve(fd, proto, &host, &flag);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })?;
        let mut server = Server {
            stop,
            thread: Some(thread),
        };
        // A hang guard (as `lab::EXEC_TIMEOUT`): the server says so as soon as it listens.
        match ready_rx.recv_timeout(super::lab::EXEC_TIMEOUT) {
            Ok(Ok(())) => Ok(server),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                server.stop();
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "server did not start",
                ))
            }
        }
    }

    /// Asks the thread to end and joins it (within about one tick).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Sets the stop flag without waiting (to stop many servers at once).
    pub fn signal(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: valid fd, pointer to a live c_int of the given size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// A non-blocking socket bound to the wildcard address on `port`, dual-stack.
fn bind_any(proto: Proto, port: u16) -> io::Result<OwnedFd> {
    let ty = match proto {
        Proto::Tcp => libc::SOCK_STREAM,
        Proto::Udp => libc::SOCK_DGRAM,
    } | libc::SOCK_CLOEXEC
        | libc::SOCK_NONBLOCK;
    // SAFETY: plain syscalls; the fd is owned right after creation.
    let fd = match cvt(unsafe { libc::socket(libc::AF_INET6, ty, 0) }) {
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            let fd = cvt(unsafe { libc::socket(libc::AF_INET, ty, 0) })?;
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
            let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            sa.sin_family = libc::AF_INET as libc::sa_family_t;
            sa.sin_port = port.to_be();
            cvt(unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    &sa as *const libc::sockaddr_in as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            })?;
            return listen_if_tcp(fd, proto);
        }
        Err(e) => return Err(e),
    };
    setsockopt_int(fd.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
    setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    sa.sin6_port = port.to_be();
    // SAFETY: sa is a fully initialised sockaddr_in6 of the size passed.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sa as *const libc::sockaddr_in6 as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    })?;
    listen_if_tcp(fd, proto)
}

fn listen_if_tcp(fd: OwnedFd, proto: Proto) -> io::Result<OwnedFd> {
    if proto == Proto::Tcp {
        // SAFETY: valid fd.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    }
    Ok(fd)
}

fn answer_line(host: &str, peer: SocketAddr) -> String {
    format!("{host} {}\n", peer.ip().to_canonical())
}

/// The server loop: wait up to one tick for input, answer, check the flag.
fn serve(fd: OwnedFd, proto: Proto, host: &str, stop: &AtomicBool) {
    let raw = fd.as_raw_fd();
    let (tcp, udp) = match proto {
        Proto::Tcp => (Some(TcpListener::from(fd)), None),
        Proto::Udp => (None, Some(UdpSocket::from(fd))),
    };
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd {
            fd: raw,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, SERVER_TICK_MS) } <= 0 {
            continue;
        }
        if let Some(listener) = &tcp {
            while let Ok((mut stream, peer)) = listener.accept() {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_write_timeout(Some(Duration::from_millis(500)));
                let _ = stream.write_all(answer_line(host, peer).as_bytes());
            }
        }
        if let Some(socket) = &udp {
            while let Ok((_, peer)) = socket.recv_from(&mut buf) {
                let _ = socket.send_to(answer_line(host, peer).as_bytes(), peer);
            }
        }
    }
}

fn classify(e: &io::Error) -> Outcome {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => Outcome::Refused,
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Outcome::TimedOut,
        _ => Outcome::Failed(e.to_string()),
    }
}

fn parse_answer(text: &str) -> Outcome {
    let mut words = text.split_whitespace();
    match (
        words.next(),
        words.next().map(str::parse::<IpAddr>),
        words.next(),
    ) {
        (Some(backend), Some(Ok(seen_source)), None) => Outcome::Answered {
            backend: backend.to_owned(),
            seen_source,
        },
        _ => Outcome::Failed(format!("unexpected answer {text:?}")),
    }
}

fn probe_tcp(dst: SocketAddr, timeout: Duration) -> Outcome {
    let start = Instant::now();
    let stream = match TcpStream::connect_timeout(&dst, timeout) {
        Ok(s) => s,
        Err(e) => return classify(&e),
    };
    let left = timeout
        .saturating_sub(start.elapsed())
        .max(Duration::from_millis(100));
    if let Err(e) = stream.set_read_timeout(Some(left)) {
        return Outcome::Failed(e.to_string());
    }
    let mut text = String::new();
    match stream.take(512).read_to_string(&mut text) {
        Ok(_) => parse_answer(&text),
        Err(e) => classify(&e),
    }
}

fn probe_udp(dst: SocketAddr, timeout: Duration) -> Outcome {
    let any: SocketAddr = match dst {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let run = || -> io::Result<String> {
        let socket = UdpSocket::bind(any)?;
        // Connected, so an ICMP error for the flow surfaces as ECONNREFUSED.
        socket.connect(dst)?;
        socket.set_read_timeout(Some(timeout))?;
        // An OUTPUT rule dropping the datagram on this very host makes
        // send() fail with EPERM, for DROP and REJECT alike. Wait anyway, as
        // TCP does: REJECT's ICMP error then still shows as Refused, and DROP
        // as TimedOut, like for traffic from any other host.
        if let Err(e) = socket.send(b"probe\n") {
            if e.raw_os_error() != Some(libc::EPERM) {
                return Err(e);
            }
        }
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    match run() {
        Ok(text) => parse_answer(&text),
        Err(e) => classify(&e),
    }
}

/// One TCP connection or UDP datagram to `dst` from inside `netns`.
pub fn probe_in(netns: &str, proto: Proto, dst: SocketAddr, timeout: Duration) -> Outcome {
    let result = in_netns(netns, || match proto {
        Proto::Tcp => probe_tcp(dst, timeout),
        Proto::Udp => probe_udp(dst, timeout),
    });
    result.unwrap_or_else(|e| Outcome::Failed(format!("entering netns {netns}: {e}")))
}
