//! Issue 18's differential flake, reduced: a connection MASQUERADEd onto a 4-tuple that
//! the backend still holds in TIME_WAIT.
//!
//! The echo servers close first, so each backend keeps every finished connection in
//! TIME_WAIT for 60 s, keyed by the address and port it saw (after NAT). As long as the
//! node's conntrack entry of that connection lives (its TCP TIME_WAIT lasts 120 s), NAT
//! never hands the same reply tuple to a new connection. Flushing conntrack between
//! manifests forgot those reservations: a later connection from another client (or to
//! another service address) with the same source port was MASQUERADEd onto the very
//! 4-tuple in TIME_WAIT. Its SYN then fails the backend's PAWS check half the time (the
//! timestamp offset differs per address pair): the backend answers with an ACK of the old
//! connection (TcpExtPAWSTimewait), the client resets that, and only the SYN retransmitted
//! one second later gets through: "the first SYN is lost", with no conntrack drop.
//!
//! [`Lab::reset_conntrack`] deletes what could mislead the next manifest (UDP flows, TCP
//! ones still opening) but keeps TCP TIME_WAIT entries, as kube-proxy never flushes TCP
//! ones either; this test pins that down with fixed source ports.
use svc_node::sys::libc;

use super::echo::Proto;
use super::sys::in_netns;
use super::{require_root, Lab, LabSpec};
use std::io::Read;
use std::net::{Ipv4Addr, TcpStream};
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

/// The service address, DNATed to pod-b:8080 and MASQUERADEd.
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 50);

/// Longer than the SYN retransmission (1 s), so a retransmitted SYN shows as slow.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// One TCP connection from `port` (bound explicitly) to `VIP:80`: how long until the
/// answer, and the answer (`None`: none within [`CONNECT_TIMEOUT`]).
fn connect_from(lab: &Lab, host: &str, port: u16) -> (Duration, Option<String>) {
    in_netns(lab.netns(host), || {
        let start = Instant::now();
        // SAFETY: plain syscalls on a descriptor owned by the TcpStream right away.
        let stream = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let stream = TcpStream::from_raw_fd(fd);
            let one: libc::c_int = 1;
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                &one as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
            // A blocking connect() gives up after SO_SNDTIMEO.
            stream.set_write_timeout(Some(CONNECT_TIMEOUT)).unwrap();
            stream.set_read_timeout(Some(CONNECT_TIMEOUT)).unwrap();
            let sa = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(ip).to_be(),
                },
                sin_zero: [0; 8],
            };
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let local = sa(Ipv4Addr::UNSPECIFIED, port);
            let bound = libc::bind(fd, &local as *const _ as *const libc::sockaddr, len);
            assert_eq!(
                bound,
                0,
                "bind :{port}: {}",
                std::io::Error::last_os_error()
            );
            let remote = sa(VIP, 80);
            if libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len) != 0 {
                return (start.elapsed(), None);
            }
            stream
        };
        let mut text = String::new();
        let answer = (&stream)
            .take(512)
            .read_to_string(&mut text)
            .ok()
            .map(|_| text);
        (start.elapsed(), answer)
    })
    .expect("enter the client's namespace")
}

/// `nstat` counters of `host` (absolute values; nstat's history left alone).
pub fn counters(lab: &Lab, host: &str, names: &[&str]) -> Vec<u64> {
    let out = lab
        .exec_ok(host, "nstat", &["-asz", "--json"], None)
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    let table = v.get("kernel").cloned().unwrap_or_default();
    names
        .iter()
        .map(|n| table.get(n).and_then(|x| x.as_u64()).unwrap_or(0))
        .collect()
}

/// The same source port from client1, then (after the conntrack reset) from client2:
/// MASQUERADE keeps the port when it can, so without the first connection's conntrack
/// entry the second lands on the 4-tuple pod-b holds in TIME_WAIT.
fn second_connections(lab: &Lab, ports: std::ops::Range<u16>, flush: bool) -> Vec<String> {
    for p in ports.clone() {
        let (_, a) = connect_from(lab, "client1", p);
        assert!(
            a.as_deref().is_some_and(|a| a.starts_with("pod-b ")),
            "client1:{p}: {a:?}"
        );
    }
    match flush {
        true => lab.flush_conntrack().expect("conntrack -F"),
        false => lab.reset_conntrack().expect("conntrack reset"),
    }
    let mut slow = Vec::new();
    for p in ports {
        let (took, a) = connect_from(lab, "client2", p);
        if a.is_none() || took >= Duration::from_millis(900) {
            slow.push(format!("client2:{p} took {took:?}: {a:?}"));
        }
    }
    slow
}

#[test]
fn reset_conntrack_keeps_time_wait_reservations() {
    if !require_root("reset_conntrack_keeps_time_wait_reservations") {
        return;
    }
    let mut lab = Lab::new("tw", &LabSpec::default()).expect("lab");
    lab.serve_on("pod-b", Proto::Tcp, 8080).expect("serve");
    let rules = format!(
        "*nat\n-A PREROUTING -d {VIP}/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.1.3:8080\n\
         -A POSTROUTING -d 10.244.1.3/32 -p tcp --dport 8080 -j MASQUERADE\nCOMMIT\n"
    );
    lab.exec_ok("node", "iptables-restore", &["--noflush"], Some(&rules))
        .expect("iptables-restore");
    const NAMES: [&str; 2] = ["TcpExtPAWSTimewait", "TcpExtTW"];

    // What the full flush did (reported, not asserted: it is the kernel's behaviour).
    let before = counters(&lab, "pod-b", &NAMES);
    let rsts = counters(&lab, "client2", &["TcpOutRsts"]);
    let slow = second_connections(&lab, 41000..41032, true);
    let after = counters(&lab, "pod-b", &NAMES);
    let rsts = counters(&lab, "client2", &["TcpOutRsts"])[0] - rsts[0];
    eprintln!(
        "conntrack -F: {} of 32 second connections slow; pod-b PAWSTimewait +{}, \
         client2 OutRsts +{rsts}\n{}",
        slow.len(),
        after[0] - before[0],
        slow.join("\n")
    );

    // What reset_conntrack does: every second connection is answered at once.
    let before = counters(&lab, "pod-b", &NAMES);
    let slow = second_connections(&lab, 42000..42032, false);
    let after = counters(&lab, "pod-b", &NAMES);
    assert!(
        slow.is_empty() && after[0] == before[0],
        "after reset_conntrack, connections hit TIME_WAIT (PAWSTimewait +{}):\n{}",
        after[0] - before[0],
        slow.join("\n")
    );
}
