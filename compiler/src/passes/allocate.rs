//! Allocation of cluster IPs, node ports and health-check node ports.
//!
//! Deterministic and stable:
//! 1. values the user wrote are reserved first and always win;
//! 2. values in the lock file are kept for services that still need them;
//! 3. what is left is allocated from a slot derived from a hash of the service's identity,
//!    probing upward to the next free value, services taken in (namespace, name) order.
//!
//! So the order of files and documents never matters, and with the lock in place adding,
//! removing or editing one service never moves another's allocation.
//! Reserved like kube-apiserver: the network address, the IPv4 broadcast address and the
//! first host address (the `default/kubernetes` service's, which gets it when unset).

use crate::decode::IntOrString;
use crate::diag::{Diagnostic, Diagnostics};
use crate::k8s::{Objects, Service};
use crate::net::{parse_ip, Cidr, IpFamily};
use crate::passes::Settings;
use crate::tree::{Node, Value};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write;
use std::net::IpAddr;

/// What was decided for one service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocation {
    pub cluster_ips: Vec<IpAddr>,
    /// Per port, spec order.
    pub node_ports: Vec<Option<u16>>,
    pub health_check_node_port: Option<u16>,
    /// Field paths that svc-compile filled.
    pub allocated: Vec<String>,
    /// A headless service's families as the API server defaults them (it has no cluster
    /// IPs to tell; see `headless_families`). Empty for other services.
    pub headless_families: Vec<IpFamily>,
}

/// The lock file: every allocation, keyed by `namespace/name`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lock {
    pub services: BTreeMap<String, LockEntry>,
    /// `--target ebpf`'s service and backend ids, per (node, family `ipv4`/`ipv6`): the
    /// compiler only carries them (read, kept, written back); the back end assigns them.
    pub ebpf: BTreeMap<(String, String), NodeIds>,
}

/// One node's (and family's) eBPF ids, keyed by the frontend and backend text the
/// back end gives them (`10.96.0.10:53/UDP`, `[fd00::1]:80/TCP/i`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeIds {
    pub services: BTreeMap<String, u16>,
    pub backends: BTreeMap<String, u32>,
}

impl NodeIds {
    /// The lock file's key for a view's ids: (node, `ipv4` | `ipv6`).
    pub fn key_of(view: &crate::ir::NodeView) -> (String, String) {
        let fam = match view.family {
            IpFamily::IPv4 => "ipv4",
            IpFamily::IPv6 => "ipv6",
        };
        (view.node_name.to_string(), fam.to_string())
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockEntry {
    pub cluster_ips: Vec<IpAddr>,
    /// Keyed by (port name, or the port number when unnamed; protocol).
    pub node_ports: BTreeMap<(String, String), u16>,
    pub health_check_node_port: Option<u16>,
}

pub const LOCK_KIND: &str = "AllocationLock";

/// The API server's own service, which owns the first host address of the range.
const KUBERNETES: &str = "default/kubernetes";

/// `clusterIP: None`, or `clusterIPs: [None]` (the apiserver reads either).
pub fn is_headless(s: &Service) -> bool {
    s.cluster_ip.as_ref().is_some_and(|c| c.v == "None")
        || s.cluster_ips.first().is_some_and(|c| c.v == "None")
}

fn svc_type(s: &Service) -> &str {
    s.type_.as_ref().map_or("ClusterIP", |t| t.v.as_str())
}

fn port_key(p: &crate::k8s::Port) -> (String, String) {
    let name = match &p.name {
        Some(n) if !n.v.is_empty() => n.v.clone(),
        _ => p.port.as_ref().map_or(String::new(), |p| p.v.to_string()),
    };
    let proto = p
        .protocol
        .as_ref()
        .map_or("TCP".to_string(), |p| p.v.clone());
    (name, proto)
}

fn hash64(s: &str) -> u64 {
    let d = Sha256::digest(s.as_bytes());
    u64::from_be_bytes(d[..8].try_into().unwrap())
}

/// The API server's defaulting of a headless service's families (`initIPFamilyFields`).
/// With a selector, as any service. Without one, the policy defaults to RequireDualStack,
/// which gets the other family even on a single-stack cluster (such a service only names
/// its endpoints, it allocates nothing); PreferDualStack gets it on a dual-stack cluster.
fn headless_families(s: &Service, settings: &Settings) -> Vec<IpFamily> {
    let selectorless = s.selector.as_ref().is_none_or(|m| m.is_empty());
    if !selectorless {
        return wanted_families(s, settings);
    }
    let mut fams: Vec<IpFamily> = Vec::new();
    for f in s.ip_families.iter().filter_map(|f| IpFamily::parse(&f.v)) {
        if !fams.contains(&f) {
            fams.push(f);
        }
    }
    let primary = settings.service_cidrs.first().map(|c| c.family());
    if fams.is_empty() {
        fams.push(primary.unwrap_or(IpFamily::IPv4));
    }
    let dual_cluster = settings
        .service_cidrs
        .iter()
        .any(|c| Some(c.family()) != primary);
    let add_other = match s.ip_family_policy.as_ref().map(|p| p.v.as_str()) {
        None | Some("RequireDualStack") => true,
        Some("PreferDualStack") => dual_cluster,
        _ => false,
    };
    if add_other && fams.len() == 1 {
        fams.push(match fams[0] {
            IpFamily::IPv4 => IpFamily::IPv6,
            IpFamily::IPv6 => IpFamily::IPv4,
        });
    }
    fams.truncate(2);
    fams
}

/// Families the service gets cluster IPs for, primary first.
fn wanted_families(s: &Service, settings: &Settings) -> Vec<IpFamily> {
    let cluster: Vec<IpFamily> = settings.service_cidrs.iter().map(|c| c.family()).collect();
    let written: Vec<IpFamily> = written_ips(s).iter().map(IpFamily::of).collect();
    let asked: Vec<IpFamily> = s
        .ip_families
        .iter()
        .filter_map(|f| IpFamily::parse(&f.v))
        .collect();
    let policy = s.ip_family_policy.as_ref().map(|p| p.v.as_str());
    let primary = written
        .first()
        .or(asked.first())
        .or(cluster.first())
        .copied()
        .unwrap_or(IpFamily::IPv4);
    let mut fams = vec![primary];
    let dual = match policy {
        // A single-stack cluster is reported by validation (SVC124).
        Some("RequireDualStack") => true,
        Some("PreferDualStack") => true,
        _ => written.len() > 1 || asked.len() > 1,
    };
    if dual {
        for f in written.iter().chain(&asked).chain(&cluster) {
            if !fams.contains(f) && cluster.contains(f) {
                fams.push(*f);
            }
        }
    }
    fams.truncate(2);
    fams
}

fn written_ips(s: &Service) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = s
        .cluster_ips
        .iter()
        .filter_map(|c| parse_ip(&c.v))
        .collect();
    if v.is_empty() {
        v.extend(s.cluster_ip.as_ref().and_then(|c| parse_ip(&c.v)));
    }
    v
}

struct IpPool<'a> {
    cidr: &'a Cidr,
    used: HashSet<u128>,
}

impl IpPool<'_> {
    fn reserved(&self, off: u128) -> bool {
        let size = self.cidr.size();
        off == 0
            || off == 1
            || (self.cidr.family() == IpFamily::IPv4 && off == size - 1 && size > 2)
    }
    fn take(&mut self, ip: &IpAddr) -> bool {
        self.cidr.contains(ip) && self.used.insert(self.cidr.offset(ip))
    }
    fn free(&self, ip: &IpAddr) -> bool {
        let off = self.cidr.offset(ip);
        self.cidr.contains(ip) && !self.used.contains(&off) && !self.reserved(off)
    }
    fn allocate(&mut self, key: &str) -> Option<IpAddr> {
        let size = self.cidr.size().min(1 << 40);
        let start = (hash64(key) as u128) % size;
        for i in 0..size {
            let off = (start + i) % size;
            if !self.reserved(off) && !self.used.contains(&off) {
                self.used.insert(off);
                return Some(self.cidr.nth(off));
            }
        }
        None
    }
}

struct PortPool {
    range: (u16, u16),
    /// One bit per port number (8 KiB): taking and testing never leaves the cache, where a
    /// hash set of tens of thousands of ports would.
    used: PortSet,
}

impl PortPool {
    fn allocate(&mut self, key: &str) -> Option<u16> {
        let (lo, hi) = self.range;
        let size = (hi - lo) as u64 + 1;
        let start = hash64(key) % size;
        (0..size)
            .map(|i| lo + ((start + i) % size) as u16)
            .find(|p| self.used.insert(*p))
    }
    fn free(&self, p: u16) -> bool {
        p >= self.range.0 && p <= self.range.1 && !self.used.contains(p)
    }
}

/// A set of port numbers as a bitmap.
struct PortSet(Vec<u64>);

impl Default for PortSet {
    fn default() -> Self {
        PortSet(vec![0; (u16::MAX as usize + 1) / 64])
    }
}

impl PortSet {
    /// Whether `p` was not in the set yet.
    fn insert(&mut self, p: u16) -> bool {
        let (word, bit) = (p as usize / 64, 1u64 << (p % 64));
        let new = self.0[word] & bit == 0;
        self.0[word] |= bit;
        new
    }
    fn contains(&self, p: u16) -> bool {
        self.0[p as usize / 64] & (1u64 << (p % 64)) != 0
    }
}

/// A node port another port of the same service with the same number already has: the
/// apiserver gives ports that differ only in protocol (DNS on 53/UDP and 53/TCP) one
/// node port.
fn sibling_node_port(s: &Service, node_ports: &[Option<u16>], pi: usize) -> Option<u16> {
    let number = s.ports[pi].port.as_ref()?.v;
    s.ports
        .iter()
        .zip(node_ports)
        .enumerate()
        .find(|(j, (p, np))| {
            *j != pi && np.is_some() && p.port.as_ref().is_some_and(|x| x.v == number)
        })
        .and_then(|(_, (_, np))| *np)
}

fn needs_node_ports(s: &Service) -> bool {
    match svc_type(s) {
        "NodePort" => !is_headless(s),
        "LoadBalancer" => !is_headless(s) && s.allocate_lb_node_ports,
        _ => false,
    }
}

fn needs_hcnp(s: &Service) -> bool {
    svc_type(s) == "LoadBalancer"
        && s.external_traffic_policy
            .as_ref()
            .is_some_and(|p| p.v == "Local")
}

/// Where the node ports of one allocation phase come from.
enum Phase<'a> {
    /// Step 2: the lock file's value, when it is still free; otherwise left to step 3.
    Lock(&'a LockEntry),
    /// Step 3: a new value from the slot hashed from `key` (`namespace/name`) and the
    /// field; a full range is SVC352.
    New {
        key: &'a str,
        diags: &'a mut Diagnostics,
    },
}

/// A node-port field of a service: a port's `nodePort` or the `healthCheckNodePort`.
#[derive(Clone, Copy)]
enum Field<'a> {
    Port(usize, &'a crate::k8s::Port),
    HealthCheck,
}

impl Field<'_> {
    fn path(self) -> String {
        match self {
            Field::Port(pi, _) => format!("spec.ports[{pi}].nodePort"),
            Field::HealthCheck => "spec.healthCheckNodePort".into(),
        }
    }
}

impl PortPool {
    /// A value for `field` of service `s` in `phase`, taken from the pool.
    fn take_for(&mut self, phase: &mut Phase, s: &Service, field: Field) -> Option<u16> {
        match phase {
            Phase::Lock(entry) => {
                let kept = match field {
                    Field::Port(_, p) => entry.node_ports.get(&port_key(p)).copied(),
                    Field::HealthCheck => entry.health_check_node_port,
                };
                let np = kept.filter(|np| self.free(*np))?;
                self.used.insert(np);
                Some(np)
            }
            Phase::New { key, diags } => {
                let slot = match field {
                    Field::Port(_, p) => {
                        let (pk, proto) = port_key(p);
                        format!("{key}/{pk}/{proto}")
                    }
                    Field::HealthCheck => format!("{key}/healthCheckNodePort"),
                };
                let np = self.allocate(&slot);
                if np.is_none() {
                    let d = Diagnostic::error("SVC352", "the node-port range is full")
                        .hint("widen --service-node-port-range");
                    diags.push(match field {
                        Field::Port(_, p) => d.at(p.span),
                        // Nothing written to point at: the service, and the field by path.
                        Field::HealthCheck => d.at(s.meta.name.span).path(field.path()),
                    });
                }
                np
            }
        }
    }
}

/// Fill what `a` still lacks of the node ports (`wanted.0`) and the health-check node port
/// (`wanted.1`) in `phase`. Ports that differ only in protocol share one node port, in
/// every phase.
fn assign_node_ports(
    s: &Service,
    a: &mut Allocation,
    wanted: (bool, bool),
    ports: &mut PortPool,
    mut phase: Phase,
) {
    let (node_ports, health_check) = wanted;
    if node_ports {
        for (pi, p) in s.ports.iter().enumerate() {
            if a.node_ports[pi].is_some() {
                continue;
            }
            let np = match sibling_node_port(s, &a.node_ports, pi) {
                Some(np) => Some(np),
                None => ports.take_for(&mut phase, s, Field::Port(pi, p)),
            };
            if np.is_some() {
                a.node_ports[pi] = np;
                a.allocated.push(Field::Port(pi, p).path());
            }
        }
    }
    if health_check && a.health_check_node_port.is_none() {
        if let Some(np) = ports.take_for(&mut phase, s, Field::HealthCheck) {
            a.health_check_node_port = Some(np);
            a.allocated.push(Field::HealthCheck.path());
        }
    }
}

/// Allocate for every service (index-aligned with `objects.services`), and return the new lock.
pub fn allocate(
    objects: &Objects,
    settings: &Settings,
    lock: &Lock,
    enabled: bool,
    diags: &mut Diagnostics,
) -> (Vec<Allocation>, Lock) {
    let svcs = &objects.services;
    let mut out: Vec<Allocation> = svcs
        .iter()
        .map(|s| Allocation {
            cluster_ips: if is_headless(s) {
                vec![]
            } else {
                written_ips(s)
            },
            node_ports: s
                .ports
                .iter()
                .map(|p| {
                    p.node_port
                        .as_ref()
                        .and_then(|n| u16::try_from(n.v).ok())
                        .filter(|n| *n != 0)
                })
                .collect(),
            health_check_node_port: s
                .health_check_node_port
                .as_ref()
                .and_then(|n| u16::try_from(n.v).ok())
                .filter(|n| *n != 0),
            allocated: vec![],
            headless_families: vec![],
        })
        .collect();
    // Defaulting, not allocation: also under `--no-allocate`.
    for (a, s) in out.iter_mut().zip(svcs) {
        if is_headless(s) && svc_type(s) != "ExternalName" {
            a.headless_families = headless_families(s, settings);
        }
    }
    let mut new_lock = Lock::default();
    if !enabled {
        return (out, new_lock);
    }
    let mut pools: Vec<IpPool> = settings
        .service_cidrs
        .iter()
        .map(|c| IpPool {
            cidr: c,
            used: HashSet::new(),
        })
        .collect();
    let mut ports = PortPool {
        range: settings.node_port_range,
        used: PortSet::default(),
    };
    // 1. User-written values.
    for a in &out {
        for ip in &a.cluster_ips {
            for p in pools.iter_mut() {
                p.take(ip);
            }
        }
        for np in a
            .node_ports
            .iter()
            .flatten()
            .chain(&a.health_check_node_port)
        {
            ports.used.insert(*np);
        }
    }
    // Work in (namespace, name) order, whatever the input order.
    let mut order: Vec<usize> = (0..svcs.len()).collect();
    order.sort_by(|&a, &b| {
        (&svcs[a].meta.namespace.v, &svcs[a].meta.name.v)
            .cmp(&(&svcs[b].meta.namespace.v, &svcs[b].meta.name.v))
    });
    // Each service's `namespace/name`, made in input order: the loops below visit services
    // in name order, and reading these few compact strings there, rather than each
    // service's own scattered ones, keeps the pass linear at tens of thousands of services.
    let ids: Vec<String> = svcs
        .iter()
        .map(|s| format!("{}/{}", s.meta.namespace.v, s.meta.name.v))
        .collect();
    let ext_name = |s: &Service| svc_type(s) == "ExternalName";
    let families: Vec<Vec<IpFamily>> = svcs
        .iter()
        .map(|s| {
            if is_headless(s) || ext_name(s) {
                vec![]
            } else {
                wanted_families(s, settings)
            }
        })
        .collect();
    // What the name-order loops ask of each service, also made in input order.
    let node_ports_wanted: Vec<bool> = svcs.iter().map(needs_node_ports).collect();
    let hcnp_wanted: Vec<bool> = svcs.iter().map(needs_hcnp).collect();
    // 2. Lock values still valid and free.
    for &i in &order {
        let s = &svcs[i];
        let Some(entry) = lock.services.get(&ids[i]) else {
            continue;
        };
        for fam in &families[i] {
            if out[i].cluster_ips.iter().any(|ip| IpFamily::of(ip) == *fam) {
                continue;
            }
            if let Some(ip) = entry.cluster_ips.iter().find(|ip| IpFamily::of(ip) == *fam) {
                let kubernetes_first = ids[i] == KUBERNETES
                    && pools
                        .iter()
                        .any(|p| p.cidr.contains(ip) && p.cidr.offset(ip) == 1);
                if let Some(pool) = pools.iter_mut().find(|p| {
                    p.cidr.family() == *fam
                        && (p.free(ip) || (kubernetes_first && !p.used.contains(&1)))
                }) {
                    pool.take(ip);
                    out[i].cluster_ips.push(*ip);
                    out[i]
                        .allocated
                        .push(format!("spec.clusterIPs({})", fam.as_str()));
                }
            }
        }
        let wanted = (node_ports_wanted[i], hcnp_wanted[i]);
        assign_node_ports(s, &mut out[i], wanted, &mut ports, Phase::Lock(entry));
    }
    // 3. New allocations.
    for &i in &order {
        let s = &svcs[i];
        let key = &ids[i];
        for fam in families[i].clone() {
            if out[i].cluster_ips.iter().any(|ip| IpFamily::of(ip) == fam) {
                continue;
            }
            let Some(pool) = pools.iter_mut().find(|p| p.cidr.family() == fam) else {
                continue;
            };
            // The first host address is reserved for the `kubernetes` service itself.
            let ip = if key == KUBERNETES && !pool.used.contains(&1) {
                let ip = pool.cidr.nth(1);
                pool.used.insert(1);
                Some(ip)
            } else {
                pool.allocate(&format!("{key}/{}", fam.as_str()))
            };
            match ip {
                Some(ip) => {
                    out[i].cluster_ips.push(ip);
                    out[i]
                        .allocated
                        .push(format!("spec.clusterIPs({})", fam.as_str()));
                }
                None => diags.push(
                    Diagnostic::error("SVC351", format!("the service range {} is full", pool.cidr))
                        .at(s.meta.name.span)
                        .hint("widen --service-cluster-ip-range"),
                ),
            }
        }
        // Primary family first.
        if let Some(first) = families[i].first() {
            out[i]
                .cluster_ips
                .sort_by_key(|ip| IpFamily::of(ip) != *first);
        }
        let wanted = (node_ports_wanted[i], hcnp_wanted[i]);
        let phase = Phase::New { key, diags };
        assign_node_ports(s, &mut out[i], wanted, &mut ports, phase);
        out[i].allocated.sort();
        let mut entry = LockEntry {
            cluster_ips: out[i].cluster_ips.clone(),
            ..Default::default()
        };
        if node_ports_wanted[i] {
            for (pi, p) in s.ports.iter().enumerate() {
                if let Some(np) = out[i].node_ports[pi] {
                    entry.node_ports.insert(port_key(p), np);
                }
            }
        }
        entry.health_check_node_port = out[i].health_check_node_port.filter(|_| hcnp_wanted[i]);
        if entry != LockEntry::default() {
            new_lock.services.insert(key.clone(), entry);
        }
    }
    (out, new_lock)
}

/// The lock file's text: YAML, sorted, meant to be committed.
pub fn write_lock(lock: &Lock) -> String {
    let mut s = String::new();
    s.push_str("# svc-compile allocation lock: commit it next to the manifests.\n");
    s.push_str("# Regenerate with `svc-compile ... --lock FILE --write-lock`.\n");
    let _ = writeln!(s, "apiVersion: {}", crate::k8s::CLUSTER_CONFIG_API);
    let _ = writeln!(s, "kind: {LOCK_KIND}");
    if lock.services.is_empty() {
        s.push_str("services: []\n");
        write_ebpf_ids(&mut s, lock);
        return s;
    }
    s.push_str("services:\n");
    for (name, e) in &lock.services {
        let _ = writeln!(s, "- service: {name}");
        if !e.cluster_ips.is_empty() {
            let ips: Vec<String> = e.cluster_ips.iter().map(|i| format!("\"{i}\"")).collect();
            let _ = writeln!(s, "  clusterIPs: [{}]", ips.join(", "));
        }
        if !e.node_ports.is_empty() {
            s.push_str("  nodePorts:\n");
            for ((port, proto), np) in &e.node_ports {
                let _ = writeln!(
                    s,
                    "  - {{port: \"{port}\", protocol: {proto}, nodePort: {np}}}"
                );
            }
        }
        if let Some(h) = e.health_check_node_port {
            let _ = writeln!(s, "  healthCheckNodePort: {h}");
        }
    }
    write_ebpf_ids(&mut s, lock);
    s
}

/// The `ebpf:` section (absent when no eBPF ids were assigned, so other targets' locks
/// stay as they were).
fn write_ebpf_ids(s: &mut String, lock: &Lock) {
    if lock.ebpf.is_empty() {
        return;
    }
    s.push_str("ebpf:\n");
    for ((node, family), ids) in &lock.ebpf {
        let _ = writeln!(s, "- node: \"{node}\"\n  family: {family}");
        s.push_str("  services:\n");
        for (fe, id) in &ids.services {
            let _ = writeln!(s, "  - {{frontend: \"{fe}\", id: {id}}}");
        }
        s.push_str("  backends:\n");
        for (be, id) in &ids.backends {
            let _ = writeln!(s, "  - {{backend: \"{be}\", id: {id}}}");
        }
    }
}

/// The `ebpf:` section of a lock file.
fn read_ebpf_ids(
    root: &Node,
    lock: &mut Lock,
    bad: &dyn Fn(&Node, &str) -> Diagnostic,
    diags: &mut Diagnostics,
) {
    let Some(Value::Seq(items)) = root.get("ebpf").map(|n| &n.value) else {
        return;
    };
    for it in items {
        let node = it.get("node").and_then(Node::as_str);
        let family = it.get("family").and_then(Node::as_str);
        let (Some(node), Some(family @ ("ipv4" | "ipv6"))) = (node, family) else {
            diags.push(bad(it, "ebpf entries need node and family (ipv4 or ipv6)"));
            continue;
        };
        let mut ids = NodeIds::default();
        for (list, field) in [("services", "frontend"), ("backends", "backend")] {
            let Some(Value::Seq(es)) = it.get(list).map(|n| &n.value) else {
                continue;
            };
            for e in es {
                let key = e.get(field).and_then(Node::as_str);
                let id = e.get("id").and_then(Node::as_str);
                let ok = match (key, id, list) {
                    (Some(k), Some(v), "services") => v
                        .parse::<u16>()
                        .ok()
                        .filter(|v| *v != 0)
                        .map(|v| ids.services.insert(k.to_string(), v))
                        .is_some(),
                    (Some(k), Some(v), _) => v
                        .parse::<u32>()
                        .ok()
                        .filter(|v| *v != 0)
                        .map(|v| ids.backends.insert(k.to_string(), v))
                        .is_some(),
                    _ => false,
                };
                if !ok {
                    diags.push(bad(
                        e,
                        &format!("ebpf {list} entries need {field} and a non-zero id"),
                    ));
                }
            }
        }
        lock.ebpf
            .insert((node.to_string(), family.to_string()), ids);
    }
}

/// Read a lock file from its parsed root. Problems are SVC360 errors.
pub fn read_lock(root: &Node, diags: &mut Diagnostics) -> Lock {
    let mut lock = Lock::default();
    let bad = |n: &Node, m: &str| {
        Diagnostic::error("SVC360", format!("invalid lock file: {m}"))
            .at(n.span)
            .hint("regenerate it with --write-lock")
    };
    if root.get("kind").and_then(Node::as_str) != Some(LOCK_KIND) {
        diags.push(bad(root, "expected `kind: AllocationLock`"));
        return lock;
    }
    read_ebpf_ids(root, &mut lock, &bad, diags);
    let Some(Value::Seq(items)) = root.get("services").map(|n| &n.value) else {
        return lock;
    };
    for it in items {
        let Some(name) = it.get("service").and_then(Node::as_str) else {
            diags.push(bad(it, "entry without `service`"));
            continue;
        };
        let mut e = LockEntry::default();
        if let Some(Value::Seq(ips)) = it.get("clusterIPs").map(|n| &n.value) {
            for ip in ips {
                match ip.as_str().and_then(parse_ip) {
                    Some(a) => e.cluster_ips.push(a),
                    None => diags.push(bad(ip, "not an IP address")),
                }
            }
        }
        if let Some(Value::Seq(nps)) = it.get("nodePorts").map(|n| &n.value) {
            for np in nps {
                let port = np.get("port").and_then(Node::as_str);
                let proto = np.get("protocol").and_then(Node::as_str);
                let val = np
                    .get("nodePort")
                    .and_then(Node::as_str)
                    .and_then(|v| v.parse::<u16>().ok());
                match (port, proto, val) {
                    (Some(p), Some(pr), Some(v)) => {
                        e.node_ports.insert((p.to_string(), pr.to_string()), v);
                    }
                    _ => diags.push(bad(
                        np,
                        "nodePorts entries need port, protocol and nodePort",
                    )),
                }
            }
        }
        e.health_check_node_port = it
            .get("healthCheckNodePort")
            .and_then(Node::as_str)
            .and_then(|v| v.parse().ok());
        lock.services.insert(name.to_string(), e);
    }
    lock
}

/// Target port as the IR keeps it: the number or name written, the port when unset.
pub fn target_port(p: &crate::k8s::Port) -> crate::ir::TargetPort {
    match p.target_port.as_ref().map(|t| &t.v) {
        Some(IntOrString::Int(n)) => crate::ir::TargetPort::Number(*n as u16),
        Some(IntOrString::Str(s)) => match s.parse::<u16>() {
            Ok(n) => crate::ir::TargetPort::Number(n),
            Err(_) => crate::ir::TargetPort::Name(s.clone()),
        },
        None => crate::ir::TargetPort::Number(p.port.as_ref().map_or(0, |p| p.v as u16)),
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::Module;
    use crate::source::SourceMap;

    fn compile_with_errors(yaml: &str, lock: Option<&str>) -> crate::Compilation {
        let mut sources = SourceMap::default();
        let f = sources.add("t.yaml", yaml);
        let lock = lock.map(|l| sources.add("lock.yaml", l));
        crate::compile(
            &sources,
            &[f],
            &crate::Options {
                allocate: true,
                lock,
                ..Default::default()
            },
        )
    }
    fn compile(yaml: &str, lock: Option<&str>) -> crate::Compilation {
        let c = compile_with_errors(yaml, lock);
        assert!(!c.diags.has_errors(), "{:?}", c.diags.items);
        c
    }
    fn module(yaml: &str) -> Module {
        compile(yaml, None).module
    }

    #[test]
    fn headless_families_are_defaulted_as_the_api_server_does() {
        use crate::net::IpFamily::{IPv4, IPv6};
        let dual = "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\nserviceClusterIPRange: 10.96.0.0/16,fd00:96::/112\n---\n";
        let fams = |cluster: &str, spec: &str| {
            let y = format!("{cluster}apiVersion: v1\nkind: Service\nmetadata: {{name: h}}\nspec:\n  clusterIP: None\n{spec}  ports: [{{port: 80}}]\n");
            module(&y).services[0].ip_families.clone()
        };
        let sel = "  selector: {app: h}\n";
        // Selectorless: RequireDualStack by default, on any cluster.
        assert_eq!(fams("", ""), [IPv4, IPv6]);
        assert_eq!(fams("", "  ipFamilies: [IPv6]\n"), [IPv6, IPv4]);
        assert_eq!(fams("", "  ipFamilyPolicy: SingleStack\n"), [IPv4]);
        // PreferDualStack adds the other family only on a dual-stack cluster.
        assert_eq!(fams("", "  ipFamilyPolicy: PreferDualStack\n"), [IPv4]);
        assert_eq!(
            fams(dual, "  ipFamilyPolicy: PreferDualStack\n"),
            [IPv4, IPv6]
        );
        // With a selector: as any service (single-stack unless asked).
        assert_eq!(fams(dual, sel), [IPv4]);
        assert_eq!(
            fams(dual, &format!("{sel}  ipFamilyPolicy: RequireDualStack\n")),
            [IPv4, IPv6]
        );
    }

    #[test]
    fn the_kubernetes_service_gets_the_first_host_address() {
        let y = "apiVersion: v1\nkind: Service\nmetadata: {name: kubernetes, namespace: default}\nspec: {ports: [{name: https, port: 443}]}\n";
        let m = module(y);
        assert_eq!(m.services[0].cluster_ips[0].to_string(), "10.96.0.1");
        // Nobody else ever does.
        let other = y.replace("name: kubernetes,", "name: other,");
        assert_ne!(
            module(&other).services[0].cluster_ips[0].to_string(),
            "10.96.0.1"
        );
    }

    #[test]
    fn ports_differing_only_in_protocol_share_a_node_port() {
        let y = "apiVersion: v1\nkind: Service\nmetadata: {name: dns}\nspec:\n  type: NodePort\n  ports:\n  - {name: dns, port: 53, protocol: UDP}\n  - {name: dns-tcp, port: 53, protocol: TCP}\n  - {name: metrics, port: 9153}\n";
        let m = module(y);
        let np: Vec<Option<u16>> = m.services[0].ports.iter().map(|p| p.node_port).collect();
        assert_eq!(np[0], np[1]);
        assert_ne!(np[0], np[2]);
        // A node port written on one applies to the other.
        let written = y.replace("protocol: TCP}", "protocol: TCP, nodePort: 30053}");
        let m = module(&written);
        assert_eq!(m.services[0].ports[0].node_port, Some(30053));
    }

    #[test]
    fn cluster_ips_none_alone_means_headless() {
        let y = "apiVersion: v1\nkind: Service\nmetadata: {name: h}\nspec:\n  clusterIPs: [\"None\"]\n  selector: {app: x}\n  ports: [{port: 80}]\n";
        let m = module(y);
        assert!(m.services[0].headless);
        assert!(m.services[0].cluster_ips.is_empty());
    }

    /// The `ebpf:` section is read, carried through a compile and written back as it
    /// was; a bad entry is an SVC360 error.
    #[test]
    fn ebpf_ids_round_trip_through_the_lock() {
        let y = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.20\n  ports: [{port: 80}]\n";
        let lock = "apiVersion: svc-compile/v1alpha1\nkind: AllocationLock\nservices: []\nebpf:\n- node: \"node-a\"\n  family: ipv4\n  services:\n  - {frontend: \"10.96.0.20:80/TCP\", id: 7}\n  - {frontend: \"[fd00::1]:80/TCP/i\", id: 9}\n  backends:\n  - {backend: \"10.244.1.5:8080/TCP\", id: 3}\n";
        let c = compile(y, Some(lock));
        let ids = &c.lock.ebpf[&("node-a".to_string(), "ipv4".to_string())];
        assert_eq!(ids.services["10.96.0.20:80/TCP"], 7);
        assert_eq!(ids.services["[fd00::1]:80/TCP/i"], 9);
        assert_eq!(ids.backends["10.244.1.5:8080/TCP"], 3);
        let written = super::write_lock(&c.lock);
        assert!(
            written.ends_with(&lock[lock.find("ebpf:").unwrap()..]),
            "{written}"
        );
        // Read back, it is the same lock.
        let again = compile(y, Some(&written));
        assert_eq!(again.lock, c.lock);
        let bad = lock.replace("id: 7", "id: 0");
        let c = compile_with_errors(y, Some(&bad));
        assert!(c.diags.items.iter().any(|d| d.code == "SVC360"));
    }

    #[test]
    fn the_lock_file_wins_over_the_hashed_slot() {
        let y = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  type: NodePort\n  ports: [{name: http, port: 80}]\n";
        let free = module(y);
        assert_ne!(free.services[0].cluster_ips[0].to_string(), "10.96.7.7");
        assert_ne!(free.services[0].ports[0].node_port, Some(31111));
        let lock = "apiVersion: svc-compile/v1alpha1\nkind: AllocationLock\nservices:\n- service: default/web\n  clusterIPs: [\"10.96.7.7\"]\n  nodePorts:\n  - {port: \"http\", protocol: TCP, nodePort: 31111}\n";
        let c = compile(y, Some(lock));
        assert_eq!(c.module.services[0].cluster_ips[0].to_string(), "10.96.7.7");
        assert_eq!(c.module.services[0].ports[0].node_port, Some(31111));
        // ... and is written back unchanged.
        assert!(super::write_lock(&c.lock).contains("10.96.7.7"));
        assert!(super::write_lock(&c.lock).contains("nodePort: 31111"));
        // A lock value outside the range is allocated anew.
        let stale = lock.replace("10.96.7.7", "10.200.0.1");
        let c = compile(y, Some(&stale));
        assert_eq!(
            c.module.services[0].cluster_ips,
            free.services[0].cluster_ips
        );
    }

    #[test]
    fn load_balancers_may_go_without_node_ports() {
        let y = "apiVersion: v1\nkind: Service\nmetadata: {name: lb}\nspec:\n  type: LoadBalancer\n  allocateLoadBalancerNodePorts: false\n  externalTrafficPolicy: Local\n  ports: [{port: 80}]\n";
        let m = module(y);
        assert_eq!(m.services[0].ports[0].node_port, None);
        // The health-check port is allocated all the same.
        assert!(m.services[0].health_check_node_port.is_some());
        let default = module(&y.replace("  allocateLoadBalancerNodePorts: false\n", ""));
        assert!(default.services[0].ports[0].node_port.is_some());
    }

    /// Node ports and the health-check node port come from one range; whatever is
    /// allocated last, a full range is SVC352 (the health-check port used to be skipped
    /// silently), and lock values of both kinds are kept.
    #[test]
    fn node_ports_and_the_health_check_port_share_the_range() {
        let y = |range: &str| {
            format!(
                "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\nserviceNodePortRange: {range}\n---\n\
                 apiVersion: v1\nkind: Service\nmetadata: {{name: lb}}\nspec:\n  type: LoadBalancer\n  externalTrafficPolicy: Local\n  ports: [{{name: a, port: 80}}, {{name: b, port: 443}}]\n"
            )
        };
        let m = module(&y("30000-30002"));
        let s = &m.services[0];
        let mut all: Vec<u16> = s.ports.iter().filter_map(|p| p.node_port).collect();
        all.extend(s.health_check_node_port);
        all.sort_unstable();
        assert_eq!(all, [30000, 30001, 30002]);
        assert_eq!(
            s.allocated,
            [
                "spec.clusterIPs(IPv4)",
                "spec.healthCheckNodePort",
                "spec.ports[0].nodePort",
                "spec.ports[1].nodePort"
            ]
        );

        let full = compile_with_errors(&y("30000-30001"), None);
        let errors: Vec<(&str, Option<&str>)> = full
            .diags
            .items
            .iter()
            .map(|d| (d.code, d.path.as_deref()))
            .collect();
        assert_eq!(errors, [("SVC352", Some("spec.healthCheckNodePort"))]);
        assert_eq!(full.module.services[0].health_check_node_port, None);

        // The lock phase keeps both kinds, whichever slot the hash would give.
        let lock = "apiVersion: svc-compile/v1alpha1\nkind: AllocationLock\nservices:\n- service: default/lb\n  nodePorts:\n  - {port: \"a\", protocol: TCP, nodePort: 30002}\n  - {port: \"b\", protocol: TCP, nodePort: 30000}\n  healthCheckNodePort: 30001\n";
        let c = compile(&y("30000-30002"), Some(lock));
        let s = &c.module.services[0];
        let got: Vec<Option<u16>> = s.ports.iter().map(|p| p.node_port).collect();
        assert_eq!(got, [Some(30002), Some(30000)]);
        assert_eq!(s.health_check_node_port, Some(30001));
        assert!(super::write_lock(&c.lock).contains("healthCheckNodePort: 30001"));
    }
}
