//! The `ipvsadm` part: `ipvsadm-save -n` syntax, loadable with `ipvsadm-restore`.
//!
//! `-A {svc} -s SCHED[ -p TIMEOUT][ -b FLAGS]` per virtual server, then
//! `-a {svc} -r IP:PORT -m -w 1` per real server (masquerading, weight 1), where `{svc}`
//! is `-t`, `-u` or `--sctp-service` with `ip:port` (`[ip]:port` for IPv6). Servers come
//! in `ipvsadm-save`'s order (protocol number, address, port), so the part diffs cleanly
//! against a node's `ipvsadm-save -n`. With IPVS timeouts configured, the `--set` line
//! kube-proxy's start-up applies comes first (`ipvsadm-save` does not print it).

use super::model::State;
use super::Options;
use std::fmt::Write as _;
use std::net::IpAddr;
use svc_compiler::ir::Protocol;

pub(super) fn write(st: &State, opts: &Options, out: &mut String) {
    let c = &opts.config;
    if c.tcp_timeout > 0 || c.tcp_fin_timeout > 0 || c.udp_timeout > 0 {
        // 0 keeps the kernel's value, as kube-proxy's ConfigureTimeouts does.
        let _ = writeln!(
            out,
            "--set {} {} {}",
            c.tcp_timeout, c.tcp_fin_timeout, c.udp_timeout
        );
    }
    for vs in &st.virtual_servers {
        let svc = service(vs.proto, &vs.addr, vs.port);
        let _ = write!(out, "-A {svc} -s {}", opts.scheduler);
        if let Some(t) = vs.persistent {
            let _ = write!(out, " -p {t}");
        }
        // kube-proxy sets IP_VS_SVC_F_SCHED2 for mh, which ipvsadm names mh-port.
        if opts.scheduler == "mh" {
            out.push_str(" -b mh-port");
        }
        out.push('\n');
        for (ip, port) in &vs.reals {
            let _ = writeln!(out, "-a {svc} -r {} -m -w 1", host_port(ip, *port));
        }
    }
}

/// A virtual server as `ipvsadm` names it: `-t ip:port` (`-u`, `--sctp-service`).
pub(super) fn service(proto: Protocol, addr: &IpAddr, port: u16) -> String {
    let flag = match proto {
        Protocol::TCP => "-t",
        Protocol::UDP => "-u",
        Protocol::SCTP => "--sctp-service",
    };
    format!("{flag} {}", host_port(addr, port))
}

fn host_port(ip: &IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}
