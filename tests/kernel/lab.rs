//! The lab: a Kubernetes node with local pods, a second node with remote
//! pods, and a LAN with external clients, each host in its own network
//! namespace. See `mod.rs` for the addressing plan.
use svc_node::sys::libc;

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::thread;
use std::time::{Duration, Instant};

use super::echo::{probe_in, Outcome, Proto, Server, PROBE_TIMEOUT};
use super::sys::{self, run_bounded, run_ok, NETNS_PREFIX};

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

/// Fixed addresses of the lab (the same in every lab: namespaces isolate).
/// Everything is given as IPv4; the IPv6 twin of `a.b.c.d` is
/// `fd00:a:b:c::d` with the decimal digits read as hex ([`v6`]), e.g.
/// 10.244.1.2 → fd00:10:244:1::2, 192.0.2.10 → fd00:192:0:2::10. Prefix
/// lengths map /16 → /48, /24 → /64, /30 → /126, /32 → /128.
pub mod addr {
    use super::Family;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    /// The node's address on the LAN (eth0, 192.0.2.0/24); the clients'
    /// default gateway.
    pub const NODE_LAN: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
    /// The node's default gateway. Nobody has it: traffic the node does not
    /// DNAT elsewhere dies unanswered (ARP/ND fails).
    pub const LAN_ROUTER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    /// The node's end of the node–node2 link (eth1, /30).
    pub const NODE_LINK: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
    /// node2's end of the node–node2 link (eth0, /30).
    pub const NODE2_LINK: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
    /// The node's address on every local pod veth (`vpod<i>`, /32); the local
    /// pods' gateway.
    pub const NODE_POD_GW: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);
    /// node2's address on every remote pod veth; the remote pods' gateway.
    pub const NODE2_POD_GW: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 1);
    /// The node's podCIDR (local pods).
    pub const POD_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 244, 1, 0), 24);
    /// node2's podCIDR (remote pods).
    pub const REMOTE_POD_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 244, 2, 0), 24);
    /// The clusterCIDR.
    pub const CLUSTER_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 244, 0, 0), 16);
    /// The LAN of the node and the clients.
    pub const LAN_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(192, 0, 2, 0), 24);
    /// Prefix of the node-side interface names of pod veths (`vpod0`, ...),
    /// on node and node2 alike.
    pub const POD_IFACE_PREFIX: &str = "vpod";

    /// The IPv6 twin of an IPv4 address: `a.b.c.d` → `fd00:a:b:c::d`, each
    /// decimal number written with the same digits in hex.
    pub const fn v6(ip: Ipv4Addr) -> Ipv6Addr {
        const fn digits(mut n: u8) -> u16 {
            let (mut out, mut shift) = (0u16, 0);
            loop {
                out |= ((n % 10) as u16) << shift;
                n /= 10;
                shift += 4;
                if n == 0 {
                    return out;
                }
            }
        }
        let [a, b, c, d] = ip.octets();
        Ipv6Addr::new(0xfd00, digits(a), digits(b), digits(c), 0, 0, 0, digits(d))
    }

    /// `ip` itself for IPv4, its twin for IPv6.
    pub fn of(ip: Ipv4Addr, family: Family) -> IpAddr {
        match family {
            Family::V4 => IpAddr::V4(ip),
            Family::V6 => IpAddr::V6(v6(ip)),
        }
    }

    /// The prefix length in `family` for an IPv4 prefix length.
    pub fn prefix_len(v4_len: u8, family: Family) -> u8 {
        match (family, v4_len) {
            (Family::V4, len) => len,
            (Family::V6, 32) => 128,
            (Family::V6, 30) => 126,
            (Family::V6, 16) => 48,
            (Family::V6, _) => 64,
        }
    }

    /// A CIDR as text in `family`, e.g. `cidr(CLUSTER_CIDR, Family::V6)` =
    /// "fd00:10:244::/48".
    pub fn cidr((net, len): (Ipv4Addr, u8), family: Family) -> String {
        format!("{}/{}", of(net, family), prefix_len(len, family))
    }

    /// `/32` or `/128`: a host route or match in `ip`'s family.
    pub fn host_cidr(ip: IpAddr) -> String {
        match ip {
            IpAddr::V4(ip) => format!("{ip}/32"),
            IpAddr::V6(ip) => format!("{ip}/128"),
        }
    }
}

/// The reserved host names.
pub const NODE: &str = "node";
pub const NODE2: &str = "node2";
/// The LAN switch (a bridge); not a host that takes part in traffic.
pub const LAN: &str = "lan";

/// A pod or client: its host name and IPv4 address.
#[derive(Clone, Debug)]
pub struct HostSpec {
    pub name: String,
    pub ip: Ipv4Addr,
}

impl HostSpec {
    pub fn new(name: &str, ip: Ipv4Addr) -> HostSpec {
        HostSpec {
            name: name.to_owned(),
            ip,
        }
    }
}

/// The pods and clients of a lab.
#[derive(Clone, Debug)]
pub struct LabSpec {
    /// Pods on the node, in 10.244.1.0/24 (not .0, .1, .255).
    pub local_pods: Vec<HostSpec>,
    /// Pods on node2, in 10.244.2.0/24 (not .0, .1, .255).
    pub remote_pods: Vec<HostSpec>,
    /// External clients on the LAN, in 192.0.2.0/24 (not .0, .1, .10, .255).
    pub clients: Vec<HostSpec>,
    /// Also set up IPv6: every host gets the twin ([`addr::v6`]) of each of
    /// its IPv4 addresses, with the same routes.
    pub ipv6: bool,
}

impl Default for LabSpec {
    /// `pod-a` 10.244.1.2, `pod-b` 10.244.1.3 (local); `pod-r1` 10.244.2.2,
    /// `pod-r2` 10.244.2.3 (remote); `client1` 192.0.2.100, `client2`
    /// 192.0.2.101; dual stack.
    fn default() -> LabSpec {
        LabSpec {
            local_pods: vec![
                HostSpec::new("pod-a", Ipv4Addr::new(10, 244, 1, 2)),
                HostSpec::new("pod-b", Ipv4Addr::new(10, 244, 1, 3)),
            ],
            remote_pods: vec![
                HostSpec::new("pod-r1", Ipv4Addr::new(10, 244, 2, 2)),
                HostSpec::new("pod-r2", Ipv4Addr::new(10, 244, 2, 3)),
            ],
            clients: vec![
                HostSpec::new("client1", Ipv4Addr::new(192, 0, 2, 100)),
                HostSpec::new("client2", Ipv4Addr::new(192, 0, 2, 101)),
            ],
            ipv6: true,
        }
    }
}

impl LabSpec {
    /// No pods and no clients, IPv4 only.
    pub fn bare() -> LabSpec {
        LabSpec {
            local_pods: vec![],
            remote_pods: vec![],
            clients: vec![],
            ipv6: false,
        }
    }

    fn validate(&self) -> io::Result<()> {
        let bad = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        let mut seen = BTreeMap::new();
        let groups: [(&[HostSpec], [u8; 3], &[u8]); 3] = [
            (&self.local_pods, [10, 244, 1], &[0, 1, 255]),
            (&self.remote_pods, [10, 244, 2], &[0, 1, 255]),
            (&self.clients, [192, 0, 2], &[0, 1, 10, 255]),
        ];
        for (hosts, net, reserved) in groups {
            for h in hosts {
                let o = h.ip.octets();
                if o[..3] != net || reserved.contains(&o[3]) {
                    return bad(format!("{}: address {} not allowed here", h.name, h.ip));
                }
                let name_ok = !h.name.is_empty()
                    && h.name.len() <= 40
                    && h.name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
                if !name_ok || [NODE, NODE2, LAN].contains(&h.name.as_str()) {
                    return bad(format!("bad host name {:?}", h.name));
                }
                if seen.insert(h.name.clone(), ()).is_some()
                    || hosts.iter().filter(|x| x.ip == h.ip).count() > 1
                {
                    return bad(format!("duplicate host name or address: {}", h.name));
                }
            }
        }
        Ok(())
    }
}

/// Skips a kernel test when not root: prints
/// `skipped: <test>: needs root (network namespaces)` and returns false. Under
/// `SVC_KERNEL=require` (set by CI) it fails the test instead.
pub fn require_root(test: &str) -> bool {
    check_svc_kernel();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    skip(test, "needs root (network namespaces)");
    false
}

/// The environment variable that turns every skipped kernel test into a failure.
pub const SVC_KERNEL: &str = "SVC_KERNEL";

/// Skips a kernel test that cannot run here, saying why; panics instead when
/// `SVC_KERNEL=require`, so that a run claiming to test the kernel cannot pass without.
pub fn skip(test: &str, why: &str) {
    let value = std::env::var(SVC_KERNEL).ok();
    if kernel_required(value.as_deref()) {
        panic!("{test}: {why}, and {SVC_KERNEL}=require forbids skipping kernel tests");
    }
    println!("skipped: {test}: {why}");
}

/// Fails on an `SVC_KERNEL` value other than `require` (or none), also where nothing
/// would skip: every kernel test's prerequisites call it first, so a typo never passes
/// for a setting.
pub fn check_svc_kernel() {
    kernel_required(std::env::var(SVC_KERNEL).ok().as_deref());
}

/// `SVC_KERNEL`: unset or empty = kernel tests skip where they cannot run, `require` = they
/// fail. Anything else is a mistake, not a quiet default.
fn kernel_required(value: Option<&str>) -> bool {
    match value {
        None | Some("") => false,
        Some("require") => true,
        Some(other) => panic!("{SVC_KERNEL}={other:?}: the only value is `require`"),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Node,
    Node2,
    Lan,
    LocalPod(usize),
    RemotePod(usize),
    Client(usize),
}

struct Host {
    netns: String,
    role: Role,
    ip: Ipv4Addr,
}

/// Bound on each setup command. These bounds catch a hung process, they do not time it:
/// a tool that takes 0.1 s on an idle machine took over 30 s while another namespace
/// loaded 112k nf_tables chains (minutes of kernel CPU) at load 8 on 2 cores.
const SETUP_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on [`Lab::exec`] (a hang guard, as [`SETUP_TIMEOUT`]).
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(120);

/// One lab. Dropping it stops its servers and deletes all its namespaces
/// (also on panic unwind).
pub struct Lab {
    hosts: BTreeMap<String, Host>,
    /// Namespaces in creation order (the ones to delete).
    namespaces: Vec<String>,
    families: Vec<Family>,
    servers: Vec<Server>,
}

impl Lab {
    /// Builds the whole topology. `tag` (alphanumerics, at most 10 kept)
    /// goes into the namespace names: `sct-<tag>-<pid>-<n>-<host>`.
    /// The first lab of a process also deletes namespaces left by dead runs.
    pub fn new(tag: &str, spec: &LabSpec) -> io::Result<Lab> {
        spec.validate()?;
        static SWEEP: Once = Once::new();
        SWEEP.call_once(|| {
            if let Err(e) = sys::sweep_stale() {
                eprintln!("kernel lab: sweeping stale namespaces: {e}");
            }
        });
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let mut tag: String = tag
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(10)
            .collect();
        if tag.is_empty() {
            tag.push_str("lab");
        }
        let prefix = format!(
            "{NETNS_PREFIX}{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut lab = Lab {
            hosts: BTreeMap::new(),
            namespaces: Vec::new(),
            families: if spec.ipv6 {
                vec![Family::V4, Family::V6]
            } else {
                vec![Family::V4]
            },
            servers: Vec::new(),
        };
        let mut add = |name: &str, role: Role, ip: Ipv4Addr| {
            let netns = format!("{prefix}-{name}");
            lab.namespaces.push(netns.clone());
            lab.hosts.insert(name.to_owned(), Host { netns, role, ip });
        };
        add(NODE, Role::Node, addr::NODE_LAN);
        add(NODE2, Role::Node2, addr::NODE2_LINK);
        add(LAN, Role::Lan, Ipv4Addr::UNSPECIFIED);
        for (i, h) in spec.local_pods.iter().enumerate() {
            add(&h.name, Role::LocalPod(i), h.ip);
        }
        for (i, h) in spec.remote_pods.iter().enumerate() {
            add(&h.name, Role::RemotePod(i), h.ip);
        }
        for (i, h) in spec.clients.iter().enumerate() {
            add(&h.name, Role::Client(i), h.ip);
        }
        // On error, dropping `lab` deletes whatever was created.
        lab.build()?;
        Ok(lab)
    }

    fn host(&self, host: &str) -> &Host {
        self.hosts
            .get(host)
            .unwrap_or_else(|| panic!("kernel lab: no host named {host:?}"))
    }

    fn ns_of(&self, role: Role) -> &str {
        let h = self.hosts.values().find(|h| h.role == role);
        &h.expect("role present").netns
    }

    /// Runs an `ip -batch` script inside `netns`.
    fn ip_batch(netns: &str, script: &str) -> io::Result<()> {
        run_ok(
            Command::new("ip").args(["-n", netns, "-batch", "-"]),
            Some(script),
            SETUP_TIMEOUT,
        )
        .map(drop)
    }

    fn build(&mut self) -> io::Result<()> {
        let add: String = self
            .namespaces
            .iter()
            .map(|n| format!("netns add {n}\n"))
            .collect();
        run_ok(
            Command::new("ip").args(["-batch", "-"]),
            Some(&add),
            SETUP_TIMEOUT,
        )?;

        // Sysctls first: new interfaces copy conf/default.
        for host in self.hosts.values() {
            let mut sysctls: Vec<(&str, &str, bool)> = vec![
                ("net/ipv4/conf/all/rp_filter", "0", false),
                ("net/ipv4/conf/default/rp_filter", "0", false),
                // ICMP errors (REJECT's port-unreachable too) are rate
                // limited per destination (burst 6, then 1/s) and per
                // namespace (~1000/s, burst 50, random cost): that would make
                // Refused flaky. A type outside the ratemask is never limited.
                ("net/ipv4/icmp_ratemask", "0", false),
                ("net/ipv4/icmp_ratelimit", "0", false),
                ("net/ipv6/icmp/ratemask", "\n", true),
                ("net/ipv6/icmp/ratelimit", "0", true),
            ];
            match host.role {
                Role::Node | Role::Node2 => sysctls.extend([
                    ("net/ipv4/ip_forward", "1", false),
                    ("net/ipv6/conf/all/forwarding", "1", true),
                    ("net/ipv4/conf/all/send_redirects", "0", false),
                    ("net/ipv4/conf/default/send_redirects", "0", false),
                ]),
                Role::Lan => sysctls.extend([
                    ("net/bridge/bridge-nf-call-iptables", "0", true),
                    ("net/bridge/bridge-nf-call-ip6tables", "0", true),
                    ("net/bridge/bridge-nf-call-arptables", "0", true),
                ]),
                _ => {}
            }
            if host.role == Role::Node {
                sysctls.push(("net/ipv4/conf/all/route_localnet", "1", false));
            }
            if self.families.contains(&Family::V6) {
                // No duplicate address detection: addresses usable at once.
                sysctls.extend([
                    ("net/ipv6/conf/all/disable_ipv6", "0", false),
                    ("net/ipv6/conf/default/disable_ipv6", "0", false),
                    ("net/ipv6/conf/all/accept_dad", "0", false),
                    ("net/ipv6/conf/default/accept_dad", "0", false),
                ]);
            }
            sys::write_sysctls(&host.netns, &sysctls)?;
        }

        let (node, node2, lan) = (
            self.ns_of(Role::Node),
            self.ns_of(Role::Node2),
            self.ns_of(Role::Lan),
        );
        let pfx = addr::POD_IFACE_PREFIX;
        // Every veth end gets its own ifindex: the kernel's linkwatch treats
        // a device whose ifindex equals its peer's (common across
        // namespaces: both would be 2) as non-urgent and makes it
        // operational (real qdisc, bridge port forwarding) up to 1 s later.
        let last_index = std::cell::Cell::new(100u32);
        let veth = |name: &str, peer: &str, peer_ns: &str| {
            let a = last_index.get() + 1;
            last_index.set(a + 1);
            format!(
                "link add {name} index {a} type veth peer name {peer} index {} netns {peer_ns}\n",
                a + 1
            )
        };

        let fams = self.families.clone();
        // `addr add` in every family of the lab (v4 prefix length given).
        let addrs = |ip: Ipv4Addr, len: u8, dev: &str| -> String {
            fams.iter()
                .map(|&f| {
                    let (ip, len) = (addr::of(ip, f), addr::prefix_len(len, f));
                    let nodad = if f == Family::V6 { " nodad" } else { "" };
                    format!("addr add {ip}/{len} dev {dev}{nodad}\n")
                })
                .collect()
        };
        // `route add <dst> <rest>`, with every address in `rest` written as
        // `{0}`, `{1}`, ... in `args` order.
        let route = |dst: Option<(Ipv4Addr, u8)>, rest: &str, args: &[Ipv4Addr]| -> String {
            fams.iter()
                .map(|&f| {
                    let dst = dst.map_or("default".into(), |d| addr::cidr(d, f));
                    let mut rest = rest.to_owned();
                    for (k, a) in args.iter().enumerate() {
                        rest = rest.replace(&format!("{{{k}}}"), &addr::of(*a, f).to_string());
                    }
                    format!("route add {dst} {rest}\n")
                })
                .collect()
        };
        let host = |ip: Ipv4Addr| Some((ip, 32));

        // node: eth0 = LAN, eth1 = link to node2, vpod<i> = local pods.
        let mut s = String::from("link set lo up\n");
        s += &veth("eth0", "pnode", lan);
        s += &veth("eth1", "eth0", node2);
        s += &addrs(addr::NODE_LAN, 24, "eth0");
        s += &addrs(addr::NODE_LINK, 30, "eth1");
        s += "link set eth0 up\nlink set eth1 up\n";
        for h in self.hosts.values() {
            if let Role::LocalPod(i) = h.role {
                let dev = format!("{pfx}{i}");
                s += &veth(&dev, "eth0", &h.netns);
                s += &addrs(addr::NODE_POD_GW, 32, &dev);
                s += &format!("link set {dev} up\n");
                s += &route(
                    host(h.ip),
                    &format!("dev {dev} src {{0}}"),
                    &[addr::NODE_POD_GW],
                );
            }
        }
        s += &route(Some(addr::REMOTE_POD_CIDR), "via {0}", &[addr::NODE2_LINK]);
        s += &route(None, "via {0}", &[addr::LAN_ROUTER]);
        Self::ip_batch(node, &s)?;

        // lan: a bridge joining the node and the clients (no multicast
        // snooping: neighbour discovery must never depend on MLD state).
        let mut s = String::from(
            "link set lo up\nlink add br0 type bridge mcast_snooping 0\nlink set br0 up\n",
        );
        s += "link set pnode master br0\nlink set pnode up\n";
        for h in self.hosts.values() {
            if let Role::Client(i) = h.role {
                s += &veth(&format!("pc{i}"), "eth0", &h.netns);
                s += &format!("link set pc{i} master br0\nlink set pc{i} up\n");
            }
        }
        Self::ip_batch(lan, &s)?;

        // node2: eth0 = link to node, vpod<i> = remote pods.
        let mut s = String::from("link set lo up\n");
        s += &addrs(addr::NODE2_LINK, 30, "eth0");
        s += "link set eth0 up\n";
        for h in self.hosts.values() {
            if let Role::RemotePod(i) = h.role {
                let dev = format!("{pfx}{i}");
                s += &veth(&dev, "eth0", &h.netns);
                s += &addrs(addr::NODE2_POD_GW, 32, &dev);
                s += &format!("link set {dev} up\n");
                s += &route(
                    host(h.ip),
                    &format!("dev {dev} src {{0}}"),
                    &[addr::NODE2_POD_GW],
                );
            }
        }
        s += &route(Some(addr::POD_CIDR), "via {0}", &[addr::NODE_LINK]);
        s += &route(Some(addr::LAN_CIDR), "via {0}", &[addr::NODE_LINK]);
        Self::ip_batch(node2, &s)?;

        // Pods and clients, in parallel.
        let leaves: Vec<(String, String)> = self
            .hosts
            .values()
            .filter_map(|h| {
                let mut s = String::from("link set lo up\n");
                match h.role {
                    Role::LocalPod(_) | Role::RemotePod(_) => {
                        let gw = if matches!(h.role, Role::LocalPod(_)) {
                            addr::NODE_POD_GW
                        } else {
                            addr::NODE2_POD_GW
                        };
                        s += &addrs(h.ip, 32, "eth0");
                        s += "link set eth0 up\n";
                        s += &route(host(gw), "dev eth0", &[]);
                        s += &route(None, "via {0} dev eth0", &[gw]);
                    }
                    Role::Client(_) => {
                        s += &addrs(h.ip, 24, "eth0");
                        s += "link set eth0 up\n";
                        s += &route(None, "via {0}", &[addr::NODE_LAN]);
                    }
                    _ => return None,
                }
                Some((h.netns.clone(), s))
            })
            .collect();
        thread::scope(|scope| {
            let jobs: Vec<_> = leaves
                .iter()
                .map(|(ns, s)| scope.spawn(move || Self::ip_batch(ns, s)))
                .collect();
            jobs.into_iter()
                .map(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect::<io::Result<Vec<()>>>()
        })?;

        for ns in &self.namespaces {
            Self::wait_links_ready(ns)?;
        }
        Ok(())
    }

    /// Waits until every interface that is up is operational: carrier, a
    /// real qdisc (until the kernel's linkwatch work has run, a device sits
    /// on the "noop" qdisc that drops everything), bridge ports forwarding.
    fn wait_links_ready(netns: &str) -> io::Result<()> {
        // A hang guard: the loop goes on as soon as the links are up.
        let deadline = Instant::now() + SETUP_TIMEOUT;
        loop {
            let out = run_ok(
                Command::new("ip").args(["-n", netns, "-d", "-o", "link", "show"]),
                None,
                SETUP_TIMEOUT,
            )?;
            let pending: Vec<&str> = out
                .lines()
                .filter(|l| {
                    let flags = l
                        .split('<')
                        .nth(1)
                        .and_then(|r| r.split('>').next())
                        .unwrap_or("");
                    let flag = |name: &str| flags.split(',').any(|f| f == name);
                    // The bridge itself only matters through its ports here.
                    let bridge = l.split_whitespace().nth(1) == Some("br0:");
                    let port_blocked =
                        l.contains("bridge_slave") && !l.contains("bridge_slave state forwarding");
                    let not_ready = !flag("LOWER_UP")
                        || flag("NO-CARRIER")
                        || l.contains(" qdisc noop ")
                        || port_blocked;
                    flag("UP") && !bridge && not_ready
                })
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("links in {netns} not ready: {pending:?}"),
                ));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// The real network namespace name of a host ("node", "node2", "lan", a
    /// pod or a client). Panics on an unknown host.
    pub fn netns(&self, host: &str) -> &str {
        &self.host(host).netns
    }

    /// All namespaces of this lab.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// The families set up (IPv4, and IPv6 if the spec asked for it).
    pub fn families(&self) -> &[Family] {
        &self.families
    }

    /// A host's address in `family`: a pod's or client's own; the node's
    /// LAN address (192.0.2.10); node2's link address (198.51.100.2).
    pub fn ip(&self, host: &str, family: Family) -> IpAddr {
        let h = self.host(host);
        assert!(h.role != Role::Lan, "the lan switch has no address");
        assert!(
            self.families.contains(&family),
            "this lab has no {family:?}"
        );
        addr::of(h.ip, family)
    }

    /// `SocketAddr::new(self.ip(host, family), port)`.
    pub fn addr(&self, host: &str, family: Family, port: u16) -> SocketAddr {
        SocketAddr::new(self.ip(host, family), port)
    }

    /// Names of all pods, local then remote.
    pub fn pods(&self) -> Vec<&str> {
        let mut pods: Vec<(&Role, &str)> = self
            .hosts
            .iter()
            .filter(|(_, h)| matches!(h.role, Role::LocalPod(_) | Role::RemotePod(_)))
            .map(|(n, h)| (&h.role, n.as_str()))
            .collect();
        pods.sort_by_key(|(r, _)| match r {
            Role::LocalPod(i) => (0, *i),
            Role::RemotePod(i) => (1, *i),
            _ => (2, 0),
        });
        pods.into_iter().map(|(_, n)| n).collect()
    }

    /// Runs `program args...` inside a host's namespace (`ip netns exec`),
    /// with `stdin` as input; killed after [`EXEC_TIMEOUT`]. A non-zero exit
    /// is not an error here: look at `status`.
    pub fn exec(
        &self,
        host: &str,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> io::Result<Output> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.netns(host), program])
            .args(args);
        run_bounded(&mut cmd, stdin, EXEC_TIMEOUT)
    }

    /// Like [`Lab::exec`], but a non-zero exit is an error (with stderr);
    /// returns stdout.
    pub fn exec_ok(
        &self,
        host: &str,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> io::Result<String> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.netns(host), program])
            .args(args);
        run_ok(&mut cmd, stdin, EXEC_TIMEOUT)
    }

    /// Starts echo servers for `proto` on `port` on every pod, local and
    /// remote. Returns once all are listening.
    pub fn serve(&mut self, proto: Proto, port: u16) -> io::Result<()> {
        let pods: Vec<String> = self.pods().into_iter().map(str::to_owned).collect();
        for pod in pods {
            self.serve_on(&pod, proto, port)?;
        }
        Ok(())
    }

    /// Starts one echo server on any host (e.g. "node" for host-network
    /// backends). It listens on the wildcard address; a UDP answer leaves
    /// with the source address routing picks, so on a host with several
    /// addresses UDP is only reliable towards the address routing would pick.
    pub fn serve_on(&mut self, host: &str, proto: Proto, port: u16) -> io::Result<()> {
        self.serve_as(host, host, proto, port)
    }

    /// Like [`Lab::serve_on`], but the server answers with `name` instead of the
    /// host name (e.g. `pod-a:9090`, to tell a pod's ports apart).
    pub fn serve_as(&mut self, host: &str, name: &str, proto: Proto, port: u16) -> io::Result<()> {
        let server = Server::start(self.netns(host), name, proto, port)?;
        self.servers.push(server);
        Ok(())
    }

    /// One TCP connection or UDP datagram from `from` to `dst`, bounded by
    /// [`PROBE_TIMEOUT`].
    pub fn probe(&self, from: &str, proto: Proto, dst: SocketAddr) -> Outcome {
        probe_in(self.netns(from), proto, dst, PROBE_TIMEOUT)
    }

    /// Deletes all conntrack entries in the node, IPv4 and IPv6.
    pub fn flush_conntrack(&self) -> io::Result<()> {
        for family in ["ipv4", "ipv6"] {
            self.exec_ok(NODE, "conntrack", &["-F", "-f", family], None)?;
        }
        Ok(())
    }

    /// Deletes the node's conntrack entries that could steer the next ruleset's traffic
    /// (UDP flows, TCP connections still opening), IPv4 and IPv6, but keeps TCP entries
    /// in TIME_WAIT, as kube-proxy does: they keep NAT from handing a new connection a
    /// 4-tuple a backend still holds in TIME_WAIT (see `timewait.rs`), and a new
    /// connection on the same original tuple replaces such an entry anyway.
    pub fn reset_conntrack(&self) -> io::Result<()> {
        for family in ["ipv4", "ipv6"] {
            for filter in [&["-p", "udp"][..], &["-p", "tcp", "--state", "SYN_SENT"]] {
                let mut args = vec!["-D", "-f", family];
                args.extend_from_slice(filter);
                let out = self.exec(NODE, "conntrack", &args, None)?;
                // Exit status 1: nothing to delete.
                if !matches!(out.status.code(), Some(0 | 1)) {
                    return Err(io::Error::other(format!(
                        "conntrack {}: {}",
                        args.join(" "),
                        String::from_utf8_lossy(&out.stderr)
                    )));
                }
            }
        }
        Ok(())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for s in &self.servers {
            s.signal();
        }
        for mut s in self.servers.drain(..) {
            s.stop();
        }
        if let Err(e) = sys::delete_netns(&self.namespaces) {
            eprintln!("kernel lab: cleanup: {e}");
        }
    }
}
