//! The node view laid out as Cilium's load-balancing maps: typed entries, their bytes and
//! the order Cilium's reconciler writes them in.
//!
//! Invariants:
//! - One view gives one family's maps (`cilium_lb4_*` or `cilium_lb6_*`) plus the shared
//!   `cilium_lb_affinity_match`; the runtime maps (affinity, reverse_sk) are declared but empty.
//! - Entries are in write order: frontends in [`NodeView::ports`] order (cluster IP, external
//!   IPs, load-balancer IPs, node addresses, surrogate), and per frontend Cilium's order
//!   (`bpf_reconciler.go`, `updateFrontend`): new backends, each slot (with its affinity
//!   match), source ranges, rev-NAT, master, then the wildcard entry its address parents
//!   (written with the first parent only). A datapath that reads the master never sees a
//!   slot that is not written yet.
//! - Backends and their order come from Cilium's reading of the port (`PortView::cilium`),
//!   never kube-proxy's endpoint sets: slots hold the active backends, then the
//!   terminating ones (the master's `qcount`); maintenance backends have no slot.
//! - Ids come from [`assign_ids`] only: sorted frontends and backends, previous ids kept.
//! - Every map has the size [`MapSizes`] gives it; [`layout`] fails rather than grow one.
//! - Maglev tables ([`Entry::Maglev`]) only when the [`Agent`] options use Maglev: for the
//!   frontends the reconciler's `useMaglev` picks, over the backends it counts as active,
//!   written after the frontend's slots; the map is declared only when Maglev is in use.

use super::maglev;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use svc_compiler::ir::{
    BackendState, EbpfAgent, EbpfMapSizes, LbAlgorithm, NodePortAddresses, NodeView, PortView,
    Protocol,
};
use svc_compiler::net::{Cidr, IpFamily};
use svc_compiler::passes::allocate::NodeIds;

/// Cilium's `--bpf-lb-map-max` default (`DefaultLBMapMaxEntries`): the size of every LB
/// map whose own option is unset.
pub const DEFAULT_MAX_ENTRIES: u32 = 65536;

/// The size of each map, from Cilium's options as [`EbpfMapSizes`] holds them: a map's
/// own option, else `--bpf-lb-map-max`, else 65536 (`pkg/loadbalancer/config.go`,
/// `NewConfig`; `pkg/loadbalancer/maps/lbmaps.go`, `allMaps`: the affinity-match map
/// takes the affinity maps' size).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapSizes(pub EbpfMapSizes);

impl MapSizes {
    /// Every map `n` big (`--bpf-lb-map-max=n`).
    pub fn all(n: u32) -> MapSizes {
        MapSizes(EbpfMapSizes {
            all: Some(n),
            ..Default::default()
        })
    }

    /// The [`EbpfMapSizes`] key that sizes `id`.
    pub fn key(id: MapId) -> &'static str {
        match id {
            MapId::Services => "services",
            MapId::Backends => "backends",
            MapId::RevNat => "rev-nat",
            MapId::Affinity | MapId::AffinityMatch => "affinity",
            MapId::SourceRange => "source-ranges",
            MapId::ReverseSk => "sock-rev",
            MapId::Maglev => "maglev",
        }
    }

    /// The Cilium option that sizes `id`.
    pub fn option(id: MapId) -> &'static str {
        let key = Self::key(id);
        EbpfMapSizes::KEYS
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, o)| *o)
            .expect("every map has its option")
    }

    /// How big `id` is.
    pub fn of(&self, id: MapId) -> u32 {
        self.0
            .get(Self::key(id))
            .or(self.0.all)
            .unwrap_or(DEFAULT_MAX_ENTRIES)
    }
}

/// The most frontends one node's maps can name: the rev-NAT index (the service id) is 16
/// bits and 0 means none.
pub const MAX_FRONTENDS: usize = u16::MAX as usize;

/// The agent options that choose backends, resolved ([`EbpfAgent`] with Cilium's defaults
/// for what is unset; `pkg/loadbalancer/config.go`, `pkg/maglev/maglev.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agent {
    /// `--bpf-lb-algorithm`: the datapath's default algorithm.
    pub algorithm: LbAlgorithm,
    /// `--bpf-lb-algorithm-annotation`: `service.cilium.io/lb-algorithm` is read.
    pub annotation: bool,
    /// `--bpf-lb-maglev-table-size`: M.
    pub table_size: u32,
    /// The murmur3 seed of `--bpf-lb-maglev-hash-seed`.
    pub seed: u32,
}

impl Default for Agent {
    fn default() -> Self {
        Agent::of(&EbpfAgent::default())
    }
}

impl Agent {
    /// `a` resolved; values the agent would refuse (checked before: SVC326, the target's
    /// flags) fall back to the defaults.
    pub fn of(a: &EbpfAgent) -> Agent {
        let seed = a
            .maglev_hash_seed
            .as_deref()
            .and_then(|s| EbpfAgent::murmur_seed(s).ok());
        Agent {
            algorithm: a.lb_algorithm.unwrap_or(LbAlgorithm::Random),
            annotation: a.lb_algorithm_annotation.unwrap_or(false),
            table_size: a
                .maglev_table_size
                .filter(|m| EbpfAgent::TABLE_SIZES.contains(m))
                .unwrap_or(EbpfAgent::DEFAULT_TABLE_SIZE),
            seed: seed.unwrap_or_else(|| {
                EbpfAgent::murmur_seed(EbpfAgent::DEFAULT_HASH_SEED).expect("Cilium's seed")
            }),
        }
    }

    /// Whether a service may use Maglev, so that the maps are declared: the default
    /// algorithm is Maglev, or a service can ask for it.
    pub fn maglev_declared(&self) -> bool {
        self.algorithm == LbAlgorithm::Maglev || self.annotation
    }

    /// The algorithm a frontend's master names (`BPFOps.lbAlgorithm`): the service's
    /// annotation when the agent reads it, else none (the datapath's default).
    fn algorithm_of(&self, pv: &PortView) -> Option<LbAlgorithm> {
        if self.annotation {
            pv.cilium.lb_algorithm
        } else {
            None
        }
    }

    /// `BPFOps.useMaglev`: whether the frontend gets a Maglev table. Not the node-port
    /// surrogate (an unspecified address); the annotation, when read, decides for every
    /// frontend type; else the default algorithm, for the types reachable from outside
    /// the node (ClusterIP only with `--bpf-lb-external-clusterip`, off here).
    fn uses_maglev(&self, p: &Planned) -> bool {
        if p.frontend.addr.ip().is_unspecified() {
            return false;
        }
        if let Some(a) = self.algorithm_of(p.pv) {
            return a == LbAlgorithm::Maglev;
        }
        self.algorithm == LbAlgorithm::Maglev && p.kind != FrontendKind::ClusterIP
    }
}

/// `cilium_lb{4,6}_services_v2` key scope (`LB_LOOKUP_SCOPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// 0: traffic from outside the cluster (and every single-scope service).
    External,
    /// 1: in-cluster traffic to a two-scope service; printed `/i`.
    Internal,
}

/// What kind of frontend an address is (Cilium's `SVCType`); decides the type flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrontendKind {
    ClusterIP,
    ExternalIPs,
    LoadBalancer,
    NodePort,
}

/// A frontend address as Cilium's `L3n4Addr`: what a service id is allocated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frontend {
    pub addr: SocketAddr,
    pub proto: Protocol,
    pub scope: Scope,
}

/// A backend address (ip, port, protocol): what a backend id is allocated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Backend {
    pub addr: SocketAddr,
    pub proto: Protocol,
}

impl fmt::Display for Frontend {
    /// `10.96.0.10:53/UDP`, `[fd00::1]:53/TCP/i`: `cilium bpf lb list`'s key text.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.proto.as_str())?;
        if self.scope == Scope::Internal {
            f.write_str("/i")?;
        }
        Ok(())
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.proto.as_str())
    }
}

/// Service (rev-NAT) and backend ids. Kept across compilations by passing the previous
/// assignment to [`assign_ids`] (the `--lock` file's job).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ids {
    pub services: BTreeMap<Frontend, u16>,
    pub backends: BTreeMap<Backend, u32>,
}

impl Ids {
    /// The ids a lock file keeps ([`NodeIds`]); entries whose text is not a frontend or
    /// backend (edited by hand) are left out, so their addresses get fresh ids.
    pub fn from_lock(locked: &NodeIds) -> Ids {
        Ids {
            services: locked
                .services
                .iter()
                .filter_map(|(k, v)| Some((parse_frontend(k)?, *v)))
                .collect(),
            backends: locked
                .backends
                .iter()
                .filter_map(|(k, v)| Some((parse_backend(k)?, *v)))
                .collect(),
        }
    }

    /// The lock file's form of these ids.
    pub fn to_lock(&self) -> NodeIds {
        NodeIds {
            services: self
                .services
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            backends: self
                .backends
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
        }
    }
}

fn parse_protocol(s: &str) -> Option<Protocol> {
    match s {
        "TCP" => Some(Protocol::TCP),
        "UDP" => Some(Protocol::UDP),
        "SCTP" => Some(Protocol::SCTP),
        _ => None,
    }
}

/// The inverse of [`Backend`]'s `Display`.
pub fn parse_backend(s: &str) -> Option<Backend> {
    let (addr, proto) = s.split_once('/')?;
    Some(Backend {
        addr: addr.parse().ok()?,
        proto: parse_protocol(proto)?,
    })
}

/// The inverse of [`Frontend`]'s `Display`.
pub fn parse_frontend(s: &str) -> Option<Frontend> {
    let (addr, rest) = s.split_once('/')?;
    let (proto, scope) = match rest.split_once('/') {
        Some((p, "i")) => (p, Scope::Internal),
        Some(_) => return None,
        None => (rest, Scope::External),
    };
    Some(Frontend {
        addr: addr.parse().ok()?,
        proto: parse_protocol(proto)?,
        scope,
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// More frontends than the 16-bit rev-NAT index can name.
    TooManyFrontends(usize),
    /// Maps the node's entries do not fit in: (map, entries, size), in [`MapId::ALL`]
    /// order.
    Overflow(Vec<(MapId, usize, u32)>),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::TooManyFrontends(n) => write!(
                f,
                "{n} frontends, but Cilium's 16-bit rev-NAT index names at most {MAX_FRONTENDS}"
            ),
            Error::Overflow(maps) => {
                let each: Vec<String> = maps
                    .iter()
                    .map(|(id, n, size)| {
                        format!(
                            "{}: {n} entries, {size} fit ({})",
                            MapSizes::key(*id),
                            MapSizes::option(*id)
                        )
                    })
                    .collect();
                write!(f, "Cilium's maps would overflow: {}", each.join("; "))
            }
        }
    }
}

/// The first IPv6 backend id (IPv4 backends are below it).
pub const V6_BACKEND_BASE: u32 = 1 << 31;

/// Ids for `frontends` and `backends`: a key of `previous` keeps its id; the others get
/// the lowest free ids (from 1) in sorted order, so the result depends only on the sets
/// and `previous`. An id `previous` gave a key that is gone is not given again in the same
/// apply while any other is free: the maps still hold it until the deletes at the end,
/// and a slot or master read in between would find the new key's entry under it.
pub fn assign_ids(
    frontends: &BTreeSet<Frontend>,
    backends: &BTreeSet<Backend>,
    previous: Option<&Ids>,
) -> Result<Ids, Error> {
    fn assign<K: Ord + Copy, V: Ord + Copy + TryFrom<u64> + Into<u64>>(
        keys: &BTreeSet<K>,
        prev: Option<&BTreeMap<K, V>>,
        (min, max): (u64, u64),
    ) -> Option<BTreeMap<K, V>> {
        let in_range = |v: &V| (min..=max).contains(&(*v).into());
        let mut out = BTreeMap::new();
        let mut used = BTreeSet::new();
        for k in keys {
            if let Some(v) = prev.and_then(|p| p.get(k)).filter(|v| in_range(v)) {
                out.insert(*k, *v);
                used.insert(*v);
            }
        }
        // Freed in this apply: the ids of `previous` no key keeps.
        let freed: BTreeSet<V> = prev
            .map(|p| {
                p.values()
                    .copied()
                    .filter(|v| in_range(v) && !used.contains(v))
                    .collect()
            })
            .unwrap_or_default();
        let mut next: u64 = min;
        let mut reuse = false;
        for k in keys {
            if out.contains_key(k) {
                continue;
            }
            loop {
                if next > max {
                    if reuse || freed.is_empty() {
                        return None;
                    }
                    // Every fresh id taken: the freed ones after all.
                    reuse = true;
                    next = min;
                }
                let v = V::try_from(next).ok()?;
                next += 1;
                if !used.contains(&v) && (reuse || !freed.contains(&v)) {
                    out.insert(*k, v);
                    used.insert(v);
                    break;
                }
            }
        }
        Some(out)
    }
    let services = assign(
        frontends,
        previous.map(|p| &p.services),
        (1, MAX_FRONTENDS as u64),
    )
    .ok_or(Error::TooManyFrontends(frontends.len()))?;
    // Backend ids are global in Cilium; here each family is laid out alone, so IPv6
    // backends take the upper half: the affinity-match map both families share is keyed
    // by (backend id, rev-NAT id), and equal ids would let one family's entry keep the
    // other's pair wanted after its backend id moved on.
    let range = match backends.iter().any(|b| b.addr.is_ipv6()) {
        false => (1, V6_BACKEND_BASE as u64 - 1),
        true => (V6_BACKEND_BASE as u64, u32::MAX as u64),
    };
    let backends = assign(backends, previous.map(|p| &p.backends), range)
        .expect("fewer backends than 2^31 ids");
    Ok(Ids { services, backends })
}

// Service flags (`loadbalancer.ServiceFlags`: flags in the low byte, flags2 in the high).
pub const F_EXTERNAL_IP: u16 = 1 << 0;
pub const F_NODEPORT: u16 = 1 << 1;
pub const F_EXT_LOCAL_SCOPE: u16 = 1 << 2;
pub const F_HOSTPORT: u16 = 1 << 3;
pub const F_AFFINITY: u16 = 1 << 4;
pub const F_LOADBALANCER: u16 = 1 << 5;
pub const F_ROUTABLE: u16 = 1 << 6;
pub const F_SOURCE_RANGE: u16 = 1 << 7;
pub const F_INT_LOCAL_SCOPE: u16 = 1 << 12;
pub const F_TWO_SCOPES: u16 = 1 << 13;
/// On a master: the source ranges are a deny list (`SVC_FLAG_SOURCE_RANGE_DENY`; the
/// same bit marks a quarantined slot).
pub const F_SOURCE_RANGE_DENY: u16 = 1 << 14;

/// `ServiceFlags.String()`: the type, then the properties that apply.
pub fn flags_text(flags: u16) -> String {
    let kind = if flags & F_EXTERNAL_IP != 0 {
        "ExternalIPs"
    } else if flags & F_NODEPORT != 0 {
        "NodePort"
    } else if flags & F_LOADBALANCER != 0 {
        "LoadBalancer"
    } else if flags & F_HOSTPORT != 0 {
        "HostPort"
    } else {
        "ClusterIP"
    };
    let mut v = vec![kind];
    for (bit, text) in [
        (F_EXT_LOCAL_SCOPE, "Local"),
        (F_INT_LOCAL_SCOPE, "InternalLocal"),
        (F_TWO_SCOPES, "two-scopes"),
        (F_AFFINITY, "sessionAffinity"),
    ] {
        if flags & bit != 0 {
            v.push(text);
        }
    }
    if flags & F_ROUTABLE == 0 {
        v.push("non-routable");
    }
    if flags & F_SOURCE_RANGE != 0 {
        v.push("check source-range");
        if flags & F_SOURCE_RANGE_DENY != 0 {
            v.push("deny");
        }
    }
    v.join(", ")
}

/// One map as Cilium declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapId {
    Services,
    Backends,
    RevNat,
    Affinity,
    AffinityMatch,
    SourceRange,
    ReverseSk,
    /// `cilium_lb{4,6}_maglev`: a hash of maps, rev-NAT id → an array of one value, the
    /// service's Maglev table. Not the socket load balancer's (it never uses Maglev).
    Maglev,
}

impl MapId {
    pub const ALL: [MapId; 8] = [
        MapId::Services,
        MapId::Backends,
        MapId::RevNat,
        MapId::Affinity,
        MapId::AffinityMatch,
        MapId::SourceRange,
        MapId::ReverseSk,
        MapId::Maglev,
    ];

    pub fn name(self, family: IpFamily) -> &'static str {
        let v6 = family == IpFamily::IPv6;
        match self {
            MapId::Services if v6 => "cilium_lb6_services_v2",
            MapId::Services => "cilium_lb4_services_v2",
            MapId::Backends if v6 => "cilium_lb6_backends_v3",
            MapId::Backends => "cilium_lb4_backends_v3",
            MapId::RevNat if v6 => "cilium_lb6_reverse_nat",
            MapId::RevNat => "cilium_lb4_reverse_nat",
            MapId::Affinity if v6 => "cilium_lb6_affinity",
            MapId::Affinity => "cilium_lb4_affinity",
            MapId::AffinityMatch => "cilium_lb_affinity_match",
            MapId::SourceRange if v6 => "cilium_lb6_source_range",
            MapId::SourceRange => "cilium_lb4_source_range",
            MapId::ReverseSk if v6 => "cilium_lb6_reverse_sk",
            MapId::ReverseSk => "cilium_lb4_reverse_sk",
            MapId::Maglev if v6 => "cilium_lb6_maglev",
            MapId::Maglev => "cilium_lb4_maglev",
        }
    }

    /// bpftool's spelling of the map type.
    pub fn kind(self) -> &'static str {
        match self {
            MapId::Affinity | MapId::ReverseSk => "lru_hash",
            MapId::SourceRange => "lpm_trie",
            MapId::Maglev => "hash_of_maps",
            _ => "hash",
        }
    }

    /// Map flags: an LPM trie must be created with `BPF_F_NO_PREALLOC`.
    pub fn flags(self) -> u32 {
        match self {
            MapId::SourceRange => 1,
            _ => 0,
        }
    }

    /// (key size, value size) in bytes, from `bpf/lib/lb.h`.
    pub fn sizes(self, family: IpFamily) -> (u32, u32) {
        let a = if family == IpFamily::IPv6 { 16 } else { 4 };
        match self {
            MapId::Services => (a + 8, 12),
            MapId::Backends => (4, a + 8),
            MapId::RevNat => (2, a + 2),
            // client ip or netns cookie (at least 8), rev_nat_id, flags byte, pad, pad32
            MapId::Affinity => (a.max(8) + 8, 16),
            MapId::AffinityMatch => (8, 1),
            MapId::SourceRange => (a + 8, 1),
            // cookie, address, port, pad → address, port, rev_nat_index
            MapId::ReverseSk => (a + 12, a + 4),
            // rev_nat_index (network order) → the inner map (an fd when written)
            MapId::Maglev => (2, 4),
        }
    }
}

/// One map entry, typed; [`Entry::key`] and [`Entry::value`] give Cilium's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Slot 0 of a frontend.
    Master {
        frontend: Frontend,
        count: u16,
        qcount: u16,
        rev_nat: u16,
        flags: u16,
        /// Session affinity timeout in seconds (the union's low 24 bits).
        affinity_timeout: Option<u32>,
        /// The algorithm the service asks for (the union's top byte; none = 0, the
        /// datapath's default).
        algorithm: Option<LbAlgorithm>,
    },
    /// Slot 1.. of a frontend.
    Slot {
        frontend: Frontend,
        slot: u16,
        backend_id: u32,
        backend: Backend,
        rev_nat: u16,
        flags: u16,
    },
    Backend {
        id: u32,
        backend: Backend,
        state: BackendState,
    },
    /// A wildcard entry (port 0, protocol 0): the address is a service's, so the
    /// per-packet datapath drops traffic to a port no service of it serves (Cilium's
    /// `upsertWildcard`). Count 0, rev-NAT 0, only the frontend type's flag.
    Wildcard {
        addr: IpAddr,
        flags: u16,
    },
    RevNat {
        id: u16,
        frontend: Frontend,
    },
    AffinityMatch {
        backend_id: u32,
        rev_nat: u16,
    },
    SourceRange {
        rev_nat: u16,
        cidr: Cidr,
    },
    /// A frontend's Maglev table (`BPFOps.updateMaglev`, `BPFLBMaps.UpdateMaglev`): the
    /// outer key is the rev-NAT id; the value is written into a new inner array of one
    /// element whose fd the outer map stores. [`Entry::value`] gives the inner value:
    /// the table's backend ids in host order.
    Maglev {
        frontend: Frontend,
        rev_nat: u16,
        /// Backend ids, `table_size` of them; shared by frontends with the same backends.
        table: Arc<Vec<u32>>,
    },
}

fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

impl Entry {
    pub fn map(&self) -> MapId {
        match self {
            Entry::Master { .. } | Entry::Slot { .. } | Entry::Wildcard { .. } => MapId::Services,
            Entry::Backend { .. } => MapId::Backends,
            Entry::RevNat { .. } => MapId::RevNat,
            Entry::AffinityMatch { .. } => MapId::AffinityMatch,
            Entry::SourceRange { .. } => MapId::SourceRange,
            Entry::Maglev { .. } => MapId::Maglev,
        }
    }

    /// The key as Cilium writes it: addresses, ports and rev-NAT ids in network order,
    /// slots and backend ids in host (little-endian) order.
    pub fn key(&self) -> Vec<u8> {
        let mut k = Vec::with_capacity(24);
        match self {
            Entry::Master { frontend, .. } | Entry::Slot { frontend, .. } => {
                let slot = match self {
                    Entry::Slot { slot, .. } => *slot,
                    _ => 0,
                };
                k.extend(ip_bytes(frontend.addr.ip()));
                k.extend(frontend.addr.port().to_be_bytes());
                k.extend(slot.to_le_bytes());
                k.push(frontend.proto.number());
                k.push(frontend.scope as u8);
                k.extend([0, 0]);
            }
            Entry::Wildcard { addr, .. } => {
                k.extend(ip_bytes(*addr));
                k.extend([0; 8]); // port, slot, protocol ANY, scope external, pad
            }
            Entry::Backend { id, .. } => k.extend(id.to_le_bytes()),
            Entry::RevNat { id, .. } => k.extend(id.to_be_bytes()),
            Entry::Maglev { rev_nat, .. } => k.extend(rev_nat.to_be_bytes()),
            Entry::AffinityMatch {
                backend_id,
                rev_nat,
            } => {
                k.extend(backend_id.to_le_bytes());
                k.extend(rev_nat.to_be_bytes());
                k.extend([0, 0]);
            }
            Entry::SourceRange { rev_nat, cidr } => {
                let net = cidr.network();
                // The LPM prefix also covers rev_nat_id and the pad: 32 bits.
                k.extend((32 + net.prefix as u32).to_le_bytes());
                k.extend(rev_nat.to_be_bytes());
                k.extend([0, 0]);
                k.extend(ip_bytes(net.addr));
            }
        }
        k
    }

    pub fn value(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24);
        match self {
            Entry::Master {
                count,
                qcount,
                rev_nat,
                flags,
                affinity_timeout,
                algorithm,
                ..
            } => service_value(
                &mut v,
                // `SetLbAlg`: the algorithm in the top byte, the timeout below it.
                (affinity_timeout.unwrap_or(0) & 0x00ff_ffff)
                    | (algorithm.map_or(0, LbAlgorithm::number) as u32) << 24,
                *count,
                *rev_nat,
                *flags,
                *qcount,
            ),
            Entry::Slot {
                backend_id,
                rev_nat,
                flags,
                ..
            } => service_value(&mut v, *backend_id, 0, *rev_nat, *flags, 0),
            Entry::Wildcard { flags, .. } => service_value(&mut v, 0, 0, 0, *flags, 0),
            Entry::Backend { backend, state, .. } => {
                v.extend(ip_bytes(backend.addr.ip()));
                v.extend(backend.addr.port().to_be_bytes());
                v.push(backend.proto.number());
                v.push(state_flag(*state));
                v.extend([0, 0]); // cluster_id (host order)
                v.extend([0, 0]); // zone, pad
            }
            Entry::RevNat { frontend, .. } => {
                v.extend(ip_bytes(frontend.addr.ip()));
                v.extend(frontend.addr.port().to_be_bytes());
            }
            Entry::AffinityMatch { .. } | Entry::SourceRange { .. } => v.push(0),
            Entry::Maglev { table, .. } => {
                v.reserve(table.len() * 4);
                for id in table.iter() {
                    v.extend(id.to_le_bytes());
                }
            }
        }
        v
    }
}

/// `lb{4,6}_backend.flags` for a state (`NewBackendFlags`: `BE_STATE_*` in
/// `bpf/lib/lb.h`; terminating-not-serving is stored as terminating).
pub fn state_flag(state: BackendState) -> u8 {
    match state {
        BackendState::Active => 0,
        BackendState::Terminating | BackendState::TerminatingNotServing => 1,
        BackendState::Maintenance => 3,
    }
}

fn service_value(v: &mut Vec<u8>, union: u32, count: u16, rev_nat: u16, flags: u16, qcount: u16) {
    v.extend(union.to_le_bytes());
    v.extend(count.to_le_bytes());
    v.extend(rev_nat.to_be_bytes());
    v.extend(flags.to_le_bytes()); // flags, flags2
    v.extend(qcount.to_le_bytes());
}

/// A map to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapSpec {
    pub id: MapId,
    pub name: &'static str,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    /// A hash of maps' inner map: an array of one value this big (the Maglev table).
    pub inner_value_size: Option<u32>,
}

/// The whole state for one node and family.
#[derive(Clone, Debug)]
pub struct Layout {
    pub node: String,
    pub family: IpFamily,
    /// In [`MapId::ALL`] order.
    pub maps: Vec<MapSpec>,
    /// In write order (see the module docs).
    pub entries: Vec<Entry>,
    pub ids: Ids,
    /// The options the layout followed.
    pub agent: Agent,
}

/// One frontend address with what its master entry says and which backends it serves.
struct Planned<'a> {
    frontend: Frontend,
    kind: FrontendKind,
    pv: &'a PortView,
    flags: u16,
    /// Indices into `pv.cilium.backends`.
    backends: &'a [u32],
}

/// The frontends of one port and the backends each scope serves (Cilium's selection,
/// `PortView::cilium`).
fn frontends_of<'a>(view: &NodeView, pv: &'a PortView, out: &mut Vec<Planned<'a>>) {
    let local = |l: bool| {
        if l {
            &pv.cilium.local[..]
        } else {
            &pv.cilium.cluster[..]
        }
    };
    let mut add = |ip: IpAddr, port: u16, kind: FrontendKind, surrogate: bool| {
        let mut flags = match kind {
            FrontendKind::ClusterIP => 0,
            FrontendKind::ExternalIPs => F_EXTERNAL_IP,
            FrontendKind::LoadBalancer => F_LOADBALANCER,
            FrontendKind::NodePort => F_NODEPORT,
        };
        if pv.external_local {
            flags |= F_EXT_LOCAL_SCOPE;
        }
        if pv.internal_local {
            flags |= F_INT_LOCAL_SCOPE;
        }
        if pv.affinity_timeout.is_some() {
            flags |= F_AFFINITY;
        }
        if kind != FrontendKind::ClusterIP && !surrogate {
            flags |= F_ROUTABLE;
        }
        // `GetSourceRangesEnabled`: LoadBalancer and ExternalIPs frontends check the
        // ranges (`--bpf-lb-source-range-all-types` off); the policy annotation turns
        // them into a deny list.
        let checked = matches!(kind, FrontendKind::LoadBalancer | FrontendKind::ExternalIPs);
        if checked && !pv.cilium.source_ranges.is_empty() {
            flags |= F_SOURCE_RANGE;
            if pv.cilium.source_ranges_deny {
                flags |= F_SOURCE_RANGE_DENY;
            }
        }
        let two = kind != FrontendKind::ClusterIP && pv.external_local != pv.internal_local;
        let fe = |scope| Frontend {
            addr: SocketAddr::new(ip, port),
            proto: pv.protocol,
            scope,
        };
        if two {
            flags |= F_TWO_SCOPES;
        }
        // A single-scope entry serves what in-cluster clients reach: for a ClusterIP the
        // internal policy; for an external address both policies agree (else two scopes).
        let ext_local = if kind == FrontendKind::ClusterIP {
            pv.internal_local
        } else {
            pv.external_local
        };
        out.push(Planned {
            frontend: fe(Scope::External),
            kind,
            pv,
            flags,
            backends: local(ext_local),
        });
        if two {
            out.push(Planned {
                frontend: fe(Scope::Internal),
                kind,
                pv,
                flags,
                backends: local(pv.internal_local),
            });
        }
    };
    if let Some(ip) = pv.cluster_ip {
        add(ip, pv.port, FrontendKind::ClusterIP, false);
    }
    for ip in &pv.external_ips {
        add(*ip, pv.port, FrontendKind::ExternalIPs, false);
    }
    for ip in &pv.load_balancer_ips {
        add(*ip, pv.port, FrontendKind::LoadBalancer, false);
    }
    if let Some(np) = pv.node_port {
        let (ips, surrogate) = match &view.node_port_addresses {
            NodePortAddresses::All => (&view.node_ips, true),
            NodePortAddresses::Ips(ips) => (ips, false),
        };
        for ip in ips {
            add(*ip, np, FrontendKind::NodePort, false);
        }
        // Any other local address (loopback, ...) finds the service through the
        // 0.0.0.0 / :: surrogate entry.
        if surrogate {
            let any = match view.family {
                IpFamily::IPv4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpFamily::IPv6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            };
            add(any, np, FrontendKind::NodePort, true);
        }
    }
}

/// How many frontends (service ids) [`layout`] gives `view`, without laying it out.
pub fn frontend_count(view: &NodeView) -> usize {
    let mut planned = Vec::new();
    for pv in &view.ports {
        frontends_of(view, pv, &mut planned);
    }
    planned
        .iter()
        .map(|p| p.frontend)
        .collect::<BTreeSet<_>>()
        .len()
}

/// Whether a frontend parents a wildcard entry for its address (the reconciler's
/// `IsWildcardCandidate` and `isWildcardClass`, and `updateFrontend`'s test that the
/// address is not the node's): an external-scope LoadBalancer frontend whose address
/// Cilium's LB-IPAM owns. ClusterIP frontends would be candidates only with
/// `--bpf-lb-external-clusterip`, which this target does not model (off by default).
fn parents_wildcard(view: &NodeView, p: &Planned) -> bool {
    p.kind == FrontendKind::LoadBalancer
        && p.frontend.scope == Scope::External
        && p.pv.cilium.lb_ipam_class
        && !view.node_ips.contains(&p.frontend.addr.ip())
}

/// How many entries [`layout`] writes into each configuration map for `view` (in
/// [`MapId::ALL`] order, the runtime maps 0), counted without laying it out.
pub fn occupancy(view: &NodeView, agent: &Agent) -> Vec<(MapId, usize)> {
    let mut planned = Vec::new();
    for pv in &view.ports {
        frontends_of(view, pv, &mut planned);
    }
    let mut seen: BTreeSet<Frontend> = BTreeSet::new();
    planned.retain(|p| seen.insert(p.frontend));
    let (mut services, mut matches, mut ranges, mut tables) = (0, 0, 0, 0);
    let mut backends: BTreeSet<(IpAddr, u16, Protocol)> = BTreeSet::new();
    let mut wildcards: BTreeSet<IpAddr> = BTreeSet::new();
    for p in &planned {
        let c = &p.pv.cilium;
        let state = |i: &u32| c.backends[*i as usize].state;
        services += 1 + p
            .backends
            .iter()
            .filter(|i| state(i) != BackendState::Maintenance)
            .count();
        if p.pv.affinity_timeout.is_some() {
            matches += p
                .backends
                .iter()
                .filter(|i| state(i) == BackendState::Active)
                .count();
        }
        ranges += c.source_ranges.len();
        let n = |st| p.backends.iter().filter(|i| state(i) == st).count();
        if agent.uses_maglev(p) && n(BackendState::Active) + n(BackendState::Terminating) > 0 {
            tables += 1;
        }
        backends.extend(p.backends.iter().map(|&i| {
            let b = &c.backends[i as usize];
            (b.ip, b.port, p.pv.protocol)
        }));
        if parents_wildcard(view, p) {
            wildcards.insert(p.frontend.addr.ip());
        }
    }
    MapId::ALL
        .iter()
        .map(|&id| {
            let n = match id {
                MapId::Services => services + wildcards.len(),
                MapId::Backends => backends.len(),
                MapId::RevNat => planned.len(),
                MapId::AffinityMatch => matches,
                MapId::SourceRange => ranges,
                MapId::Maglev => tables,
                MapId::Affinity | MapId::ReverseSk => 0,
            };
            (id, n)
        })
        .collect()
}

/// Lays `view` out as Cilium's maps, each `sizes` big, with the agent options of the
/// view's ClusterConfig. `previous` ids are kept (see [`assign_ids`]).
pub fn layout(view: &NodeView, previous: Option<&Ids>, sizes: &MapSizes) -> Result<Layout, Error> {
    layout_with(view, previous, sizes, &Agent::of(&view.ebpf_agent))
}

/// [`layout`] with these agent options.
pub fn layout_with(
    view: &NodeView,
    previous: Option<&Ids>,
    sizes: &MapSizes,
    agent: &Agent,
) -> Result<Layout, Error> {
    let mut planned = Vec::new();
    for pv in &view.ports {
        frontends_of(view, pv, &mut planned);
    }
    // Two service ports on one frontend (the same external IP and port, say): the first
    // in the view's order serves it, as one key holds one master.
    let mut seen: BTreeSet<Frontend> = BTreeSet::new();
    planned.retain(|p| seen.insert(p.frontend));
    let backend_of = |pv: &PortView, i: u32| {
        let b = &pv.cilium.backends[i as usize];
        (
            Backend {
                addr: SocketAddr::new(b.ip, b.port),
                proto: pv.protocol,
            },
            b.state,
        )
    };
    let fes: BTreeSet<Frontend> = planned.iter().map(|p| p.frontend).collect();
    let bes: BTreeSet<Backend> = planned
        .iter()
        .flat_map(|p| p.backends.iter().map(|&i| backend_of(p.pv, i).0))
        .collect();
    let ids = assign_ids(&fes, &bes, previous)?;

    let mut entries = Vec::new();
    let mut written: BTreeSet<Backend> = BTreeSet::new();
    let mut wildcards: BTreeSet<IpAddr> = BTreeSet::new();
    // Frontends with the same backends (a port's cluster IP, node ports, ...) share one
    // table: the ids and weights decide it.
    let mut tables: HashMap<Vec<(u32, u16)>, Arc<Vec<u32>>> = HashMap::new();
    for p in &planned {
        let rev_nat = ids.services[&p.frontend];
        // `sortedBackends`: by state (active, terminating, terminating-not-serving,
        // maintenance), then address and port (the order `cilium.backends` has).
        let mut order: Vec<(Backend, BackendState)> =
            p.backends.iter().map(|&i| backend_of(p.pv, i)).collect();
        order.sort_by_key(|(_, state)| *state);
        // Every backend is in the backends map (maintenance ones too); each new one is
        // written before the slots that name it.
        for (b, state) in &order {
            if written.insert(*b) {
                entries.push(Entry::Backend {
                    id: ids.backends[b],
                    backend: *b,
                    state: *state,
                });
            }
        }
        // `updateFrontend`: maintenance backends get no slot; the rest take slots
        // 1.. in order. The master counts the active ones and keeps the terminating
        // ones (and the terminating-not-serving ones) in the tail `qcount` counts, so
        // that their connections keep finding them; with no active backend the
        // terminating ones are counted instead (the KEP-1669 fallback).
        let slotted: Vec<(Backend, BackendState)> = order
            .into_iter()
            .filter(|(_, s)| *s != BackendState::Maintenance)
            .collect();
        let n = |st: BackendState| slotted.iter().filter(|(_, s)| *s == st).count() as u16;
        let (active, terminating) = (n(BackendState::Active), n(BackendState::Terminating));
        let inactive = slotted.len() as u16 - active - terminating;
        let (count, qcount) = if active == 0 {
            (terminating, inactive)
        } else {
            (active, inactive + terminating)
        };
        // The source-range flags are the master's only.
        let slot_flags = p.flags & !(F_SOURCE_RANGE | F_SOURCE_RANGE_DENY);
        for (n, (b, state)) in slotted.iter().enumerate() {
            let backend_id = ids.backends[b];
            entries.push(Entry::Slot {
                frontend: p.frontend,
                slot: n as u16 + 1,
                backend_id,
                backend: *b,
                rev_nat,
                flags: slot_flags,
            });
            // Affinity may pin a client to an active backend only (not even under the
            // terminating fallback).
            if p.pv.affinity_timeout.is_some() && *state == BackendState::Active {
                entries.push(Entry::AffinityMatch {
                    backend_id,
                    rev_nat,
                });
            }
        }
        // `updateFrontend`: the Maglev table over the backends the master counts
        // (`orderedBackends[:activeCount]`), after the slots; none when it counts none
        // (the reconciler deletes the table).
        if agent.uses_maglev(p) && count > 0 {
            let counted = &slotted[..count as usize];
            let weights: HashMap<Backend, u16> = p
                .backends
                .iter()
                .map(|&i| {
                    (
                        backend_of(p.pv, i).0,
                        p.pv.cilium.backends[i as usize].weight,
                    )
                })
                .collect();
            let key: Vec<(u32, u16)> = counted
                .iter()
                .map(|(b, _)| (ids.backends[b], weights[b]))
                .collect();
            let table = tables
                .entry(key)
                .or_insert_with_key(|key| {
                    let named: Vec<(String, u16)> = counted
                        .iter()
                        .zip(key)
                        .map(|((b, _), (_, w))| (maglev::hash_string(b.addr, b.proto), *w))
                        .collect();
                    let (order, table) = maglev::lookup_table(&named, agent.table_size, agent.seed);
                    Arc::new(
                        table
                            .into_iter()
                            .map(|t| key[order[t as usize]].0)
                            .collect(),
                    )
                })
                .clone();
            entries.push(Entry::Maglev {
                frontend: p.frontend,
                rev_nat,
                table,
            });
        }
        // Every frontend of the service gets the ranges' entries (the check itself
        // is the master's flag).
        for cidr in &p.pv.cilium.source_ranges {
            entries.push(Entry::SourceRange {
                rev_nat,
                cidr: *cidr,
            });
        }
        entries.push(Entry::RevNat {
            id: rev_nat,
            frontend: p.frontend,
        });
        entries.push(Entry::Master {
            frontend: p.frontend,
            count,
            qcount,
            rev_nat,
            flags: p.flags,
            affinity_timeout: p.pv.affinity_timeout,
            algorithm: agent.algorithm_of(p.pv),
        });
        // One wildcard per address, written with its first parent's master.
        let addr = p.frontend.addr.ip();
        if parents_wildcard(view, p) && wildcards.insert(addr) {
            entries.push(Entry::Wildcard {
                addr,
                flags: F_LOADBALANCER,
            });
        }
    }

    // Cilium's maps have the sizes its options give them; a node whose entries do not
    // fit is refused (the agent would fail its updates with E2BIG).
    let over: Vec<(MapId, usize, u32)> = MapId::ALL
        .iter()
        .map(|&id| (id, entries.iter().filter(|e| e.map() == id).count()))
        .filter(|&(id, n)| n > sizes.of(id) as usize)
        .map(|(id, n)| (id, n, sizes.of(id)))
        .collect();
    if !over.is_empty() {
        return Err(Error::Overflow(over));
    }
    let maps = MapId::ALL
        .iter()
        .filter(|&&id| id != MapId::Maglev || agent.maglev_declared())
        .map(|&id| {
            let (key_size, value_size) = id.sizes(view.family);
            MapSpec {
                id,
                name: id.name(view.family),
                key_size,
                value_size,
                max_entries: sizes.of(id),
                inner_value_size: (id == MapId::Maglev).then_some(4 * agent.table_size),
            }
        })
        .collect();
    Ok(Layout {
        node: view.node_name.clone(),
        family: view.family,
        maps,
        entries,
        ids,
        agent: *agent,
    })
}
