//! The `addresses` part: `ip -batch` lines creating the dummy interface `kube-ipvs0` and
//! binding every address IPVS serves locally (cluster IPs; external and load-balancer IPs
//! that no other interface of the node has), plus, as comments (`ip -batch` skips them),
//! the sysctls IPVS mode sets at start-up.
//!
//! kube-ipvs0 stays down, as kube-proxy leaves it: its addresses still get local routes,
//! and a down link does not answer ARP for them.

use super::model::State;
use super::Options;
use std::fmt::Write as _;
use std::net::IpAddr;

pub(super) fn write(st: &State, opts: &Options, out: &mut String) {
    out.push_str("# sysctls kube-proxy's IPVS mode sets (`sysctl -w`):\n");
    out.push_str(
        "#   net.ipv4.vs.conntrack=1  (IPVS keeps conntrack entries: needed for MASQUERADE)\n",
    );
    out.push_str("#   net.ipv4.vs.expire_nodest_conn=1\n");
    out.push_str("#   net.ipv4.vs.expire_quiescent_template=1\n");
    out.push_str("#   net.ipv4.ip_forward=1\n");
    out.push_str("#   net.ipv4.vs.conn_reuse_mode=0  (only on kernels older than 5.9)\n");
    if opts.config.strict_arp {
        out.push_str("#   net.ipv4.conf.all.arp_ignore=1  (strictARP)\n");
        out.push_str("#   net.ipv4.conf.all.arp_announce=2  (strictARP)\n");
    }
    out.push_str("link add kube-ipvs0 type dummy\n");
    for ip in &st.bound {
        let len = match ip {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        let _ = writeln!(out, "address add {ip}/{len} dev kube-ipvs0");
    }
}
