//! What kube-proxy's IPVS proxier programs for one [`NodeView`], as plain data: virtual
//! servers with their real servers, every ipset with its entries, the addresses bound to
//! `kube-ipvs0`, and the load-balancer entries the node itself may not reach. Each part's
//! writer reads this; none looks at the view again.
//!
//! Follows `syncProxyRules` in `pkg/proxy/ipvs/proxier.go` service port by service port,
//! in [`NodeView::ports`] order. Lists kube-proxy keeps in Go sets are sorted here
//! (virtual and real servers as `ipvsadm-save` lists them, bound addresses numerically,
//! set entries as strings), so output is stable.

use std::collections::BTreeSet;
use std::net::IpAddr;
use svc_compiler::ir::{NodePortAddresses, NodeView, PortView, Protocol};
use svc_compiler::net::IpFamily;

/// One IPVS service (`ipvsadm -A`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualServer {
    pub proto_number: u8,
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Protocol,
    /// `-p`: ClientIP affinity's timeout.
    pub persistent: Option<u32>,
    /// Real servers `ip:port`, in `ipvsadm-save` order ([`save_order`]), deduplicated.
    pub reals: Vec<(IpAddr, u16)>,
}

/// The sets kube-proxy creates, in its `ipsetInfo` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Set {
    LoopBack,
    ClusterIp,
    ExternalIp,
    ExternalIpLocal,
    LoadBalancer,
    LoadBalancerFw,
    LoadBalancerLocal,
    LoadBalancerSourceIp,
    LoadBalancerSourceCidr,
    NodePortTcp,
    NodePortLocalTcp,
    NodePortUdp,
    NodePortLocalUdp,
    NodePortSctp,
    NodePortLocalSctp,
    HealthCheckNodePort,
    IpvsIps,
}

pub const ALL_SETS: [Set; 17] = [
    Set::LoopBack,
    Set::ClusterIp,
    Set::ExternalIp,
    Set::ExternalIpLocal,
    Set::LoadBalancer,
    Set::LoadBalancerFw,
    Set::LoadBalancerLocal,
    Set::LoadBalancerSourceIp,
    Set::LoadBalancerSourceCidr,
    Set::NodePortTcp,
    Set::NodePortLocalTcp,
    Set::NodePortUdp,
    Set::NodePortLocalUdp,
    Set::NodePortSctp,
    Set::NodePortLocalSctp,
    Set::HealthCheckNodePort,
    Set::IpvsIps,
];

impl Set {
    /// The IPv4 name (`ipset.go`).
    fn base_name(self) -> &'static str {
        match self {
            Set::LoopBack => "KUBE-LOOP-BACK",
            Set::ClusterIp => "KUBE-CLUSTER-IP",
            Set::ExternalIp => "KUBE-EXTERNAL-IP",
            Set::ExternalIpLocal => "KUBE-EXTERNAL-IP-LOCAL",
            Set::LoadBalancer => "KUBE-LOAD-BALANCER",
            Set::LoadBalancerFw => "KUBE-LOAD-BALANCER-FW",
            Set::LoadBalancerLocal => "KUBE-LOAD-BALANCER-LOCAL",
            Set::LoadBalancerSourceIp => "KUBE-LOAD-BALANCER-SOURCE-IP",
            Set::LoadBalancerSourceCidr => "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            Set::NodePortTcp => "KUBE-NODE-PORT-TCP",
            Set::NodePortLocalTcp => "KUBE-NODE-PORT-LOCAL-TCP",
            Set::NodePortUdp => "KUBE-NODE-PORT-UDP",
            Set::NodePortLocalUdp => "KUBE-NODE-PORT-LOCAL-UDP",
            Set::NodePortSctp => "KUBE-NODE-PORT-SCTP-HASH",
            Set::NodePortLocalSctp => "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
            Set::HealthCheckNodePort => "KUBE-HEALTH-CHECK-NODE-PORT",
            Set::IpvsIps => "KUBE-IPVS-IPS",
        }
    }

    /// The set's name for a family: IPv6 sets are `KUBE-6-…`, cut to ipset's 31 characters
    /// (`KUBE-6-LOAD-BALANCER-SOURCE-CID`).
    pub fn name(self, family: IpFamily) -> String {
        let base = self.base_name();
        match family {
            IpFamily::IPv4 => base.to_string(),
            IpFamily::IPv6 => {
                let mut n = base.replacen("KUBE-", "KUBE-6-", 1);
                n.truncate(31);
                n
            }
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Set::LoopBack | Set::LoadBalancerSourceIp => "hash:ip,port,ip",
            Set::LoadBalancerSourceCidr => "hash:ip,port,net",
            Set::NodePortTcp
            | Set::NodePortLocalTcp
            | Set::NodePortUdp
            | Set::NodePortLocalUdp
            | Set::HealthCheckNodePort => "bitmap:port",
            Set::IpvsIps => "hash:ip",
            _ => "hash:ip,port",
        }
    }

    /// What kube-proxy writes as the rule comment for rules matching this set.
    pub fn comment(self) -> &'static str {
        match self {
            Set::LoopBack => {
                "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"
            }
            Set::ClusterIp => "Kubernetes service cluster ip + port for masquerade purpose",
            Set::ExternalIp => {
                "Kubernetes service external ip + port for masquerade and filter purpose"
            }
            Set::ExternalIpLocal => {
                "Kubernetes service external ip + port with externalTrafficPolicy=local"
            }
            Set::LoadBalancer => "Kubernetes service lb portal",
            Set::LoadBalancerFw => {
                "Kubernetes service load balancer ip + port for load balancer with sourceRange"
            }
            Set::LoadBalancerLocal => {
                "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"
            }
            Set::LoadBalancerSourceIp => {
                "Kubernetes service load balancer ip + port + source IP for packet filter purpose"
            }
            Set::LoadBalancerSourceCidr => {
                "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"
            }
            Set::NodePortTcp => "Kubernetes nodeport TCP port for masquerade purpose",
            Set::NodePortLocalTcp => "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
            Set::NodePortUdp => "Kubernetes nodeport UDP port for masquerade purpose",
            Set::NodePortLocalUdp => "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
            Set::NodePortSctp => {
                "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"
            }
            Set::NodePortLocalSctp => {
                "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"
            }
            Set::HealthCheckNodePort => "Kubernetes health check node port",
            Set::IpvsIps => "Addresses on the ipvs interface",
        }
    }
}

/// A `-m ipvs` drop in KUBE-IPVS-OUT-FILTER: the node may not reach this load-balancer
/// port, whose source ranges leave the node out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoNodeAccess {
    pub ip: IpAddr,
    pub proto: Protocol,
    pub port: u16,
}

#[derive(Clone, Debug, Default)]
pub struct State {
    /// Sorted as `ipvsadm-save` lists them: protocol number, address ([`save_order`]), port.
    pub virtual_servers: Vec<VirtualServer>,
    /// Entries per set, indexed like [`ALL_SETS`]; each sorted as strings.
    pub sets: Vec<BTreeSet<String>>,
    /// Addresses bound to kube-ipvs0, sorted numerically.
    pub bound: BTreeSet<IpAddr>,
    /// In [`NodeView::ports`] order.
    pub no_node_access: Vec<NoNodeAccess>,
}

impl State {
    pub fn set(&self, s: Set) -> &BTreeSet<String> {
        &self.sets[s as usize]
    }
    fn add(&mut self, s: Set, entry: String) {
        self.sets[s as usize].insert(entry);
    }
}

/// `ip` as ipset and ipvsadm write it inside `ip,proto:port` (no brackets).
fn entry(ip: &IpAddr, proto: Protocol, port: u16) -> String {
    format!("{ip},{}:{port}", proto.lower())
}

/// The addresses node ports listen on: kube-proxy uses every local address but
/// kube-ipvs0's (loopback excluded) or, with nodePortAddresses, the matching ones. We
/// know the node's addresses from its Node object only.
fn node_port_ips(view: &NodeView) -> Vec<IpAddr> {
    let ips: Vec<IpAddr> = match &view.node_port_addresses {
        NodePortAddresses::All => view.node_ips.clone(),
        NodePortAddresses::Ips(ips) => ips.clone(),
    };
    let mut seen = BTreeSet::new();
    ips.into_iter()
        .filter(|ip| !ip.is_loopback() && seen.insert(*ip))
        .collect()
}

/// The address key `ipvsadm-save` sorts by. libipvs compares IPv4 addresses by
/// subtracting them (host order) into a C `int`, so 128.0.0.0 and above sort before
/// 0.0.0.0–127.255.255.255: the order of the addresses read as signed 32-bit numbers.
/// (Where two addresses are 2^31 or more apart that subtraction is not even an order;
/// the signed reading agrees with it on every pair within 2^31.) IPv6 compares bytewise.
fn save_order(ip: &IpAddr) -> (i32, u128) {
    match ip {
        IpAddr::V4(a) => (u32::from(*a) as i32, 0),
        IpAddr::V6(a) => (0, u128::from(*a)),
    }
}

/// kube-proxy's `syncEndpoint`: with the Local policy, the local endpoints, or the
/// cluster ones when no endpoint is local; otherwise the cluster endpoints.
fn reals(p: &PortView, local_policy: bool) -> Vec<(IpAddr, u16)> {
    let idx = if local_policy && !p.local_endpoints.is_empty() {
        &p.local_endpoints
    } else {
        &p.cluster_endpoints
    };
    let mut v: Vec<(IpAddr, u16)> = idx
        .iter()
        .map(|&i| {
            let e = &p.endpoints[i as usize];
            (e.ip, e.port)
        })
        .collect();
    v.sort_unstable_by_key(|(ip, port)| (save_order(ip), *port));
    v.dedup();
    v
}

pub fn build(view: &NodeView) -> State {
    let mut st = State {
        sets: vec![BTreeSet::new(); ALL_SETS.len()],
        ..State::default()
    };
    let node_ports = node_port_ips(view);
    let node_ips: BTreeSet<IpAddr> = view.node_ips.iter().copied().collect();
    for p in &view.ports {
        // kube-proxy's service map has no port without a cluster IP.
        let Some(cip) = p.cluster_ip else { continue };
        let proto = p.protocol;
        let vs = |addr: IpAddr, port: u16, local: bool| VirtualServer {
            proto_number: proto.number(),
            addr,
            port,
            proto,
            persistent: p.affinity_timeout,
            reals: reals(p, local),
        };
        // Hairpin: every local endpoint, whatever its state.
        for e in p.endpoints.iter().filter(|e| e.is_local) {
            st.add(
                Set::LoopBack,
                format!("{},{}", entry(&e.ip, proto, e.port), e.ip),
            );
        }
        st.add(Set::ClusterIp, entry(&cip, proto, p.port));
        st.virtual_servers.push(vs(cip, p.port, p.internal_local));
        st.bound.insert(cip);

        for ip in &p.external_ips {
            let set = if p.external_local {
                Set::ExternalIpLocal
            } else {
                Set::ExternalIp
            };
            st.add(set, entry(ip, proto, p.port));
            st.virtual_servers.push(vs(*ip, p.port, p.external_local));
            // Not bound when another interface of the node has it.
            if !node_ips.contains(ip) {
                st.bound.insert(*ip);
            }
        }

        for ip in &p.load_balancer_ips {
            let e = entry(ip, proto, p.port);
            st.add(Set::LoadBalancer, e.clone());
            if p.external_local {
                st.add(Set::LoadBalancerLocal, e.clone());
            }
            if !p.source_ranges.is_empty() {
                st.add(Set::LoadBalancerFw, e.clone());
                for c in &p.source_ranges {
                    // ipset spells a host-length net as the bare address, as `ipset
                    // save` prints it back.
                    let net = if c.prefix == c.family().bits() {
                        c.addr.to_string()
                    } else {
                        c.to_string()
                    };
                    st.add(Set::LoadBalancerSourceCidr, format!("{e},{net}"));
                }
                if p.source_ranges_include_node {
                    st.add(Set::LoadBalancerSourceIp, format!("{e},{ip}"));
                } else {
                    st.no_node_access.push(NoNodeAccess {
                        ip: *ip,
                        proto,
                        port: p.port,
                    });
                }
            }
            st.virtual_servers.push(vs(*ip, p.port, p.external_local));
            if !node_ips.contains(ip) {
                st.bound.insert(*ip);
            }
        }

        // `syncProxyRules` (pkg/proxy/ipvs/proxier.go): a node port without node IPs of
        // the family (`if len(nodeIPs) == 0 { continue }`) skips the rest of the service
        // port, its health-check node port included; a port without a node port keeps it.
        if p.node_port.is_some() && node_ports.is_empty() {
            continue;
        }
        if let Some(np) = p.node_port {
            let (set, local_set) = match proto {
                Protocol::TCP => (Set::NodePortTcp, Set::NodePortLocalTcp),
                Protocol::UDP => (Set::NodePortUdp, Set::NodePortLocalUdp),
                Protocol::SCTP => (Set::NodePortSctp, Set::NodePortLocalSctp),
            };
            // bitmap:port for TCP and UDP; SCTP is hash:ip,port, one entry per node IP.
            let entries: Vec<String> = match proto {
                Protocol::SCTP => node_ports.iter().map(|ip| entry(ip, proto, np)).collect(),
                _ => vec![np.to_string()],
            };
            for e in entries {
                if p.external_local {
                    st.add(local_set, e.clone());
                }
                st.add(set, e);
            }
            for ip in &node_ports {
                st.virtual_servers.push(vs(*ip, np, p.external_local));
            }
        }

        if let Some(hc) = p.health_check_node_port {
            st.add(Set::HealthCheckNodePort, hc.to_string());
        }
    }
    for ip in &st.bound {
        st.sets[Set::IpvsIps as usize].insert(ip.to_string());
    }
    // Two ports of one service never share protocol and port, but two services may
    // name the same external IP: IPVS has one virtual server per address, the later
    // wins as kube-proxy's update does. Keep one, with the last port's settings.
    st.virtual_servers.reverse();
    st.virtual_servers
        .sort_by_key(|v| (v.proto_number, save_order(&v.addr), v.port));
    st.virtual_servers
        .dedup_by(|a, b| (a.proto_number, a.addr, a.port) == (b.proto_number, b.addr, b.port));
    st
}
