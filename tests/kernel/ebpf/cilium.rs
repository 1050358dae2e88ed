//! Cilium's semantics in the socket load balancer, issue 31: a backend that turns
//! terminating keeps its established sockets (TCP peer, UDP replies translated back)
//! while new connections go to the active backends only; a wildcard entry on a
//! load-balancer IP leaves connections to its other ports untranslated (the socket LB's
//! lookup never returns it, as Cilium's `lb4_lookup_service` with the scope switch does
//! not).
//!
//! The maps change in place between the two states, with the planner `apply` uses
//! (`ebpf::plan::diff`, ids kept), while a process in the cgroup holds its sockets.

use super::super::echo::PROBE_TIMEOUT;
use super::super::lab::EXEC_TIMEOUT;
use super::super::sys::enter_netns;
use super::super::Proto;
use super::{dump, prerequisites, probe_set, Seen, Served};
use crate::support::root;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use svc_compiler::ir::NodeView;
use svc_compiler::net::IpFamily;
use svc_compiler::passes::node::{node_view, NodeSelection};
use svc_compiler::source::SourceMap;
use svc_node::sys::libc;
use svc_targets::ebpf::{self, plan, Layout, MapSizes};

/// The port the long-lived TCP servers listen on (the lab's own close after one line).
const HOLD_PORT: u16 = 9191;

/// node-1's view of `yaml` with the golden nodes.
fn view_of(yaml: &str) -> NodeView {
    let mut sources = SourceMap::default();
    let nodes = std::fs::read_to_string(root().join("golden/common/nodes.yaml")).unwrap();
    let files = vec![
        sources.add("nodes.yaml", nodes),
        sources.add("svc.yaml", yaml.to_string()),
    ];
    let opts = svc_compiler::Options {
        allocate: true,
        ..Default::default()
    };
    let comp = svc_compiler::compile(&sources, &files, &opts);
    assert!(!comp.diags.has_errors(), "{:?}", comp.diags);
    let sel = NodeSelection {
        name: "node-1".into(),
        ips: vec![],
    };
    node_view(&comp.module, &sel, IpFamily::IPv4).unwrap()
}

/// A service with a long-lived TCP port (80 → [`HOLD_PORT`]), a probe port (81 → 8080)
/// and a UDP port (53 → 8080), and two endpoints, pod-a and pod-r1; the one at
/// `terminating` (if any) is terminating and still serving.
fn hold_service(terminating: Option<&str>) -> String {
    let ep = |ip: &str, node: &str| {
        let cond = if Some(ip) == terminating {
            ", conditions: {ready: false, serving: true, terminating: true}"
        } else {
            ""
        };
        format!("- {{addresses: [{ip}], nodeName: {node}{cond}}}\n")
    };
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: hold, namespace: shop}}
spec:
  clusterIP: 10.96.0.50
  selector: {{app: hold}}
  ports:
  - {{name: t, port: 80, targetPort: {HOLD_PORT}}}
  - {{name: p, port: 81, targetPort: 8080}}
  - {{name: u, port: 53, protocol: UDP, targetPort: 8080}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: hold-1, namespace: shop, labels: {{kubernetes.io/service-name: hold}}}}
addressType: IPv4
ports:
- {{name: t, port: {HOLD_PORT}, protocol: TCP}}
- {{name: p, port: 8080, protocol: TCP}}
- {{name: u, port: 8080, protocol: UDP}}
endpoints:
{}{}",
        ep("10.244.1.2", "node-1"),
        ep("10.244.2.2", "node-2")
    )
}

/// A TCP server in `netns` on [`HOLD_PORT`] that answers every line of every connection
/// with `name`, and keeps connections open until the client closes them. Stops (and is
/// joined) on drop.
struct HoldServer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HoldServer {
    fn start(netns: &str, name: &str) -> HoldServer {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (netns, name, flag) = (netns.to_string(), name.to_string(), stop.clone());
        let thread = std::thread::spawn(move || {
            let l = enter_netns(&netns)
                .and_then(|()| TcpListener::bind(("0.0.0.0", HOLD_PORT)))
                .and_then(|l| l.set_nonblocking(true).map(|()| l));
            let l = match l {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            std::thread::scope(|s| {
                while !flag.load(Ordering::SeqCst) {
                    match l.accept() {
                        Ok((c, _)) => {
                            let (name, flag) = (&name, &flag);
                            s.spawn(move || serve_lines(c, name, flag));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            });
        });
        rx.recv_timeout(EXEC_TIMEOUT)
            .expect("hold server did not start")
            .expect("hold server bind");
        HoldServer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HoldServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers each line with `name` until the client closes or the server stops.
fn serve_lines(c: TcpStream, name: &str, stop: &AtomicBool) {
    let _ = c.set_read_timeout(Some(Duration::from_millis(100)));
    let mut w = match c.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut r = BufReader::new(c);
    let mut line = String::new();
    while !stop.load(Ordering::SeqCst) {
        match r.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                if w.write_all(format!("{name}\n").as_bytes()).is_err() {
                    return;
                }
                line.clear();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// One line from `r`, waiting at most [`PROBE_TIMEOUT`].
fn read_line(s: &mut TcpStream) -> io::Result<String> {
    s.set_read_timeout(Some(PROBE_TIMEOUT))?;
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while s.read(&mut b)? == 1 && b[0] != b'\n' {
        out.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// What the holding process saw in one phase: the TCP connection's backend and peer
/// address, the UDP socket's backend and the source its replies showed.
#[derive(Debug, PartialEq, Eq)]
struct Held {
    tcp: String,
    tcp_peer: SocketAddr,
    udp: String,
    udp_from: SocketAddr,
}

/// One phase in the child: a line over the TCP connection and a datagram over the
/// connected UDP socket.
fn exchange(t: &mut TcpStream, u: &UdpSocket) -> io::Result<String> {
    t.write_all(b"again\n")?;
    let tcp = read_line(t)?;
    let peer = t.peer_addr()?;
    u.send(b"probe\n")?;
    let mut buf = [0u8; 512];
    let (n, from) = u.recv_from(&mut buf)?;
    let udp = String::from_utf8_lossy(&buf[..n]);
    let udp = udp.split_whitespace().next().unwrap_or("");
    Ok(format!("{tcp} {peer} {udp} {from}\n"))
}

/// A process in the cgroup of `served` and the namespace of `from` holding a TCP
/// connection to `tcp` and a connected UDP socket to `udp` that reaches the same backend
/// as the TCP connection (it tries sockets until one does). It reports what it saw
/// (phase 1), waits for the parent's go, and reports again over the same sockets
/// (phase 2).
struct Holder {
    pid: libc::pid_t,
    go: OwnedFd,
    out: std::fs::File,
}

impl Holder {
    fn start(served: &Served, from: &str, tcp: SocketAddr, udp: SocketAddr) -> Holder {
        let procs = std::ffi::CString::new(
            served
                .cg
                .0
                .join("cgroup.procs")
                .as_os_str()
                .as_encoded_bytes(),
        )
        .unwrap();
        let netns = served.lab.netns(from).to_string();
        let pipe = || {
            let mut fds = [0i32; 2];
            // SAFETY: pipe2 fills two descriptors we then own.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
        };
        let (out_r, out_w) = pipe();
        let (go_r, go_w) = pipe();
        // SAFETY: the child makes syscalls and small allocations only, and leaves with
        // _exit (as `probes` does).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            drop((out_r, go_w));
            let mut out = std::fs::File::from(out_w);
            let run = || -> io::Result<()> {
                // SAFETY: a NUL-terminated path; writing "0" moves this process.
                let fd = unsafe { libc::open(procs.as_ptr(), libc::O_WRONLY) };
                if fd < 0 || unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
                    return Err(io::Error::last_os_error());
                }
                unsafe { libc::close(fd) };
                enter_netns(&netns)?;
                let mut t = TcpStream::connect_timeout(&tcp, PROBE_TIMEOUT)?;
                t.write_all(b"hello\n")?;
                let first = read_line(&mut t)?;
                // A connected UDP socket on the TCP connection's backend.
                let mut held = None;
                for _ in 0..32 {
                    let u = UdpSocket::bind("0.0.0.0:0")?;
                    u.set_read_timeout(Some(PROBE_TIMEOUT))?;
                    u.connect(udp)?;
                    u.send(b"probe\n")?;
                    let mut buf = [0u8; 512];
                    let (n, _) = u.recv_from(&mut buf)?;
                    if String::from_utf8_lossy(&buf[..n]).split_whitespace().next()
                        == Some(first.as_str())
                    {
                        held = Some(u);
                        break;
                    }
                }
                let u = held.ok_or_else(|| io::Error::other("no UDP socket reached it"))?;
                out.write_all(exchange(&mut t, &u)?.as_bytes())?;
                let mut go = [0u8; 1];
                std::fs::File::from(go_r).read_exact(&mut go)?;
                out.write_all(exchange(&mut t, &u)?.as_bytes())?;
                Ok(())
            };
            if let Err(e) = run() {
                let _ = out.write_all(format!("error {e}\n").as_bytes());
            }
            // SAFETY: leave without running the test harness's destructors.
            unsafe { libc::_exit(0) };
        }
        drop((out_w, go_r));
        Holder {
            pid,
            go: go_w,
            out: std::fs::File::from(out_r),
        }
    }

    /// The next report (bounded by a hang guard).
    fn report(&mut self) -> Held {
        let start = Instant::now();
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        loop {
            let mut pfd = libc::pollfd {
                fd: self.out.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let left = EXEC_TIMEOUT.saturating_sub(start.elapsed());
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
            assert!(r > 0, "the holding process did not report");
            match self.out.read(&mut b) {
                Ok(1) if b[0] == b'\n' => break,
                Ok(1) => line.push(b[0]),
                _ => panic!(
                    "the holding process ended: {:?}",
                    String::from_utf8_lossy(&line)
                ),
            }
        }
        let line = String::from_utf8_lossy(&line).into_owned();
        let w: Vec<&str> = line.split_whitespace().collect();
        assert!(w.len() == 4 && w[0] != "error", "holding process: {line}");
        Held {
            tcp: w[0].to_string(),
            tcp_peer: w[1].parse().unwrap(),
            udp: w[2].to_string(),
            udp_from: w[3].parse().unwrap(),
        }
    }

    fn go(&self) {
        // SAFETY: one byte to our own pipe.
        assert_eq!(
            unsafe { libc::write(self.go.as_raw_fd(), b"g".as_ptr().cast(), 1) },
            1
        );
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let mut status = 0;
        // SAFETY: our own child; it is killed if it still runs (a failed assertion).
        unsafe {
            if libc::waitpid(self.pid, &mut status, libc::WNOHANG) == 0 {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, &mut status, 0);
            }
        }
    }
}

fn bpf(cmd: libc::c_long, attr: &mut [u64; 4]) -> io::Result<()> {
    // SAFETY: the attribute buffer outlives the call and is larger than the command's.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 32usize) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Moves the pinned maps of `served` from `old` to `view`'s layout in place (ids kept),
/// in the planner's order, as an incremental apply does; returns the new layout.
fn rewrite(served: &Served, old: &Layout, view: &NodeView) -> Layout {
    let sizes = MapSizes::default();
    let new = ebpf::layout(view, Some(&old.ids), &sizes).unwrap();
    let now: BTreeMap<String, plan::Contents> = plan::Wanted::from_layouts(&[old])
        .complete(&sizes)
        .expected()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let wanted = plan::Wanted::from_layouts(&[&new]).complete(&sizes);
    let mut fds = BTreeMap::new();
    for op in plan::diff(&wanted, &now) {
        let map = match &op {
            plan::Op::Update { map, .. } | plan::Op::Delete { map, .. } => map.clone(),
        };
        let fd = fds.entry(map.clone()).or_insert_with(|| {
            super::open_pinned(&served.pins.0.join(&map)).expect("open a pinned map")
        });
        let fd = fd.as_raw_fd() as u64;
        match &op {
            plan::Op::Update { key, value, .. } => {
                let mut attr = [fd, key.as_ptr() as u64, value.as_ptr() as u64, 0];
                bpf(2, &mut attr).expect("BPF_MAP_UPDATE_ELEM");
            }
            plan::Op::Delete { key, .. } => {
                let mut attr = [fd, key.as_ptr() as u64, 0, 0];
                bpf(3, &mut attr).expect("BPF_MAP_DELETE_ELEM");
            }
        }
    }
    new
}

/// The lab pod with this address.
fn pod_of(ip: &str) -> &'static str {
    match ip {
        "10.244.1.2" => "pod-a",
        "10.244.2.2" => "pod-r1",
        _ => panic!("no lab pod at {ip}"),
    }
}

/// A backend turns terminating while a pod holds a TCP connection and a connected UDP
/// socket to it: both keep working (the TCP peer and the UDP replies' source are still
/// the service address: recvmsg and getpeername translate back for the terminating
/// backend), the maps keep it in a slot behind the active one (count 1, qcount 1, its
/// backend entry flagged terminating), and new connections and sockets reach only the
/// active backend.
#[test]
fn terminating_backend_keeps_established_sockets() {
    let test = "kernel ebpf terminating backend";
    let Some((obj, cgroot)) = prerequisites(test) else {
        return;
    };
    let before = view_of(&hold_service(None));
    let served = Served::new("ebterm", &obj, &cgroot, &before);
    let _holds: Vec<HoldServer> = ["pod-a", "pod-r1"]
        .iter()
        .map(|p| HoldServer::start(served.lab.netns(p), p))
        .collect();
    let vip = |port: u16| SocketAddr::new("10.96.0.50".parse().unwrap(), port);
    let old = ebpf::layout(&before, None, &MapSizes::default()).unwrap();

    let mut holder = Holder::start(&served, "pod-b", vip(80), vip(53));
    let first = holder.report();
    assert_eq!(first.tcp_peer, vip(80), "{first:?}");
    assert_eq!(first.udp_from, vip(53), "{first:?}");
    assert_eq!(first.udp, first.tcp, "{first:?}");
    let held = first.tcp.clone();
    let held_ip = if held == "pod-a" {
        "10.244.1.2"
    } else {
        "10.244.2.2"
    };
    let other = if held == "pod-a" { "pod-r1" } else { "pod-a" };
    assert_eq!(pod_of(held_ip), held);

    // The held backend turns terminating; the maps change in place.
    let after = view_of(&hold_service(Some(held_ip)));
    let new = rewrite(&served, &old, &after);
    holder.go();
    let second = holder.report();
    assert_eq!(
        second, first,
        "the established sockets moved or lost their service address"
    );

    // In the maps: the terminating backend is in slot 2, behind the active one, and
    // counted in qcount; its backend entry says terminating (1).
    let services = dump(&served.pins, "cilium_lb4_services_v2");
    let entry = |key: &str| {
        let (_, v) = services
            .iter()
            .find(|(k, _)| k.starts_with(key))
            .unwrap_or_else(|| panic!("no service entry {key}: {services:?}"));
        plan::parse_hex(v).unwrap()
    };
    // 10.96.0.50:80/TCP, slot 0: count (bytes 4-5) 1, qcount (10-11) 1.
    let master = entry("0a 60 00 32 00 50 00 00 06");
    assert_eq!(
        (master[4], master[5], master[10], master[11]),
        (1, 0, 1, 0),
        "{master:?}"
    );
    let slot2 = entry("0a 60 00 32 00 50 02 00 06");
    let held_id = new.ids.backends.iter().find_map(|(b, id)| {
        (b.addr.ip().to_string() == held_ip && b.addr.port() == HOLD_PORT).then_some(*id)
    });
    let held_id = held_id.expect("the held backend's id");
    assert_eq!(
        slot2[..4],
        held_id.to_le_bytes(),
        "slot 2 names the terminating backend: {slot2:?}"
    );
    let backends = dump(&served.pins, "cilium_lb4_backends_v3");
    let flag = backends
        .iter()
        .find(|(k, _)| *k == ebpf::hex(&held_id.to_le_bytes()))
        .map(|(_, v)| v.split(' ').nth(7).unwrap().to_string());
    assert_eq!(flag.as_deref(), Some("01"), "{backends:?}");

    // New connections and new sockets: the active backend only.
    let want: BTreeSet<String> = [other.to_string()].into();
    let tcp = served.probes("pod-b", Proto::Tcp, vip(81), 30);
    assert_eq!(probe_set(&tcp), want, "{tcp:?}");
    let udp = served.probes("pod-b", Proto::Udp, vip(53), 30);
    assert_eq!(probe_set(&udp), want, "{udp:?}");
    for s in tcp.iter().chain(&udp) {
        assert!(
            matches!(s, Seen::Answer { peer, .. } if peer.ip() == vip(0).ip()),
            "{s:?}"
        );
    }
}

/// A wildcard entry on a load-balancer IP (here 192.0.2.100, the lab's client1, so
/// that an untranslated connection has somewhere to go): its served ports are
/// translated; a connection to another port is left alone, as Cilium's socket LB does
/// (its scope-switch lookup never returns the wildcard; the per-packet datapath drops
/// such traffic, which is not reproduced here), so it reaches client1 itself, neither a
/// backend nor EHOSTUNREACH.
#[test]
fn wildcard_entry_leaves_unserved_ports_alone() {
    let test = "kernel ebpf wildcard entry";
    let Some((obj, cgroot)) = prerequisites(test) else {
        return;
    };
    let v = view_of(
        "apiVersion: v1
kind: Service
metadata: {name: lb, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.51
  selector: {app: lb}
  ports: [{port: 80, targetPort: 8080, nodePort: 30100}]
status: {loadBalancer: {ingress: [{ip: 192.0.2.100}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: shop, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-1}
- {addresses: [10.244.2.2], nodeName: node-2}
",
    );
    let mut served = Served::new("ebwild", &obj, &cgroot, &v);
    served
        .lab
        .serve_on("client1", Proto::Tcp, 8080)
        .expect("client1 serves");
    let wildcard = dump(&served.pins, "cilium_lb4_services_v2")
        .into_iter()
        .find(|(k, _)| k == "c0 00 02 64 00 00 00 00 00 00 00 00");
    assert!(wildcard.is_some(), "no wildcard entry for 192.0.2.100");
    let lb = |port: u16| SocketAddr::new("192.0.2.100".parse().unwrap(), port);
    let served_port = served.probes("node", Proto::Tcp, lb(80), 20);
    let want: BTreeSet<String> = ["pod-a".to_string(), "pod-r1".to_string()].into();
    assert_eq!(probe_set(&served_port), want, "{served_port:?}");
    let other = served.probes("node", Proto::Tcp, lb(8080), 3);
    for s in &other {
        assert!(
            matches!(s, Seen::Answer { backend, peer } if backend == "client1" && *peer == lb(8080)),
            "a port no service serves must reach client1 untranslated: {other:?}"
        );
    }
    let refused = served.probes("node", Proto::Tcp, lb(8081), 1);
    assert_eq!(
        refused,
        [Seen::Errno(libc::ECONNREFUSED)],
        "client1's own refusal, not the socket LB's"
    );
}
