//! Real-kernel test harness: a Kubernetes node in a network namespace, with
//! pods, a second node and LAN clients, where compiled rulesets are loaded
//! and real TCP/UDP traffic checks which backend answered and which source
//! address it saw. Needs root; every test calls [`require_root`] first.
//!
//! ```text
//!  client1 192.0.2.100 ─┐                         ┌─ pod-a 10.244.1.2 (vpod0)
//!  client2 192.0.2.101 ─┤ lan: br0                │─ pod-b 10.244.1.3 (vpod1)
//!                       └── eth0 192.0.2.10/24  node  (10.244.1.1/32 on each vpod<i>)
//!                                eth1 198.51.100.1/30
//!                                   │
//!                           eth0 198.51.100.2/30  node2 (10.244.2.1/32 on each vpod<i>)
//!                                                 ├─ pod-r1 10.244.2.2
//!                                                 └─ pod-r2 10.244.2.3
//! ```
//!
//! Every host has its own namespace `sct-<tag>-<pid>-<n>-<host>`; the
//! switch `lan` is one too. Pods: `eth0` with the pod IP/32 and `default via
//! <gw> dev eth0 onlink`, gw = 10.244.1.1 (node) or 10.244.2.1 (node2).
//! Clients: `eth0` IP/24, default via 192.0.2.10. node: routes
//! 10.244.2.0/24 via 198.51.100.2, default via 192.0.2.1 (absent, so
//! anything not DNATed elsewhere is lost), ip_forward=1, route_localnet=1,
//! rp_filter=0, send_redirects=0, no ICMP rate limits. node2: routes
//! 10.244.1.0/24 and 192.0.2.0/24 via 198.51.100.1, no default route.
//!
//! node2 has no default route: remote pods reach pods, nodes and the LAN,
//! not service VIPs (rules are only loaded on node).
//!
//! IPv6 (`LabSpec::ipv6`, on by default) mirrors all of it with the twin of
//! every address, `a.b.c.d` → `fd00:a:b:c::d` ([`addr::v6`]): node LAN
//! fd00:192:0:2::10/64, pods fd00:10:244:1::2/128 via fd00:10:244:1::1,
//! clusterCIDR fd00:10:244::/48, link fd00:198:51:100::1/126 ... Use
//! [`Family`] with `Lab::ip`/`Lab::addr` and `addr::of`/`addr::cidr`.
//!
//! Source address a backend sees when the node MASQUERADEs (the address of
//! the node's interface towards the backend):
//! - local pod backend (also hairpin pod → service → same pod): 10.244.1.1
//!   (fd00:10:244:1::1)
//! - remote pod backend: 198.51.100.1 (fd00:198:51:100::1)
//!
//! Without masquerade it sees the real client: a client's, a pod's IP, or
//! for traffic from the node itself 192.0.2.10 (the source picked for the
//! default route; the original route decides it, before DNAT).
//! Hairpin without masquerade gets no answer over IPv4: the pod drops a
//! packet whose source is its own address (martian).
//!
//! Servers ([`Lab::serve`]) answer one line `<host> <source-ip-seen>`;
//! [`Lab::probe`] turns that into an [`Outcome`].

mod agent;
mod apply;
mod conntrack;
mod differential;
mod drift;
mod ebpf;
mod ebpf_apply;
pub mod echo;
mod flows;
mod ipvs;
mod ipvs_apply;
pub mod lab;
mod nft_layout;
mod selftest;
mod serve;
pub mod sys;
mod timewait;

#[allow(unused_imports)]
pub use echo::{Outcome, Proto, PROBE_TIMEOUT};
#[allow(unused_imports)]
pub use lab::{addr, require_root, Family, HostSpec, Lab, LabSpec};
