//! The IR: plain data that every back end reads.
//!
//! Two levels:
//! - [`Module`]: the cluster as the API server would hold it after validation, endpoint
//!   resolution and allocation. Target- and node-independent.
//! - [`NodeView`]: what one node's proxy programs for one IP family, produced by
//!   `passes::node`. Every kube-proxy decision (endpoint sets after traffic policies,
//!   topology and terminating fallback; masquerading; node-port addresses; which
//!   per-service chains exist; REJECT/DROP) is recorded here once, per proxy mode where
//!   the modes differ ([`ByMode`]).
//!
//! Architecture Invariant: back ends only read these types. They never look at the
//! Kubernetes objects and never recompute a decision recorded here.
//!
//! Architecture Invariant: every `Vec` is sorted by a stable key (documented on the field),
//! never by input order, so the same manifests in any file order give the same IR.
//!
//! Cross references are plain indices (`ServiceId`, indices into `NodeView::ports[..].endpoints`).

use crate::net::{Cidr, IpFamily};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

/// Index into [`Module::services`].
pub type ServiceId = u32;

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Module {
    pub cluster: ClusterConfig,
    pub proxy: ProxyConfig,
    /// Sorted by (namespace, name).
    pub services: Vec<Service>,
    /// Sorted by name.
    pub nodes: Vec<Node>,
    /// The Pods of the input, sorted by (namespace, name): only the `dns` target reads
    /// them (CoreDNS's `pods verified` records), so they are not in the IR's JSON.
    #[serde(skip)]
    pub pods: Vec<Pod>,
}

/// A Pod as DNS sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    /// `status.podIP` (the first of `status.podIPs`), when it is an address.
    pub ip: Option<IpAddr>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
}

/// What the API server decides: kube-apiserver's flags.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterConfig {
    /// `--service-cluster-ip-range`: at most one per family, primary first.
    #[serde(rename = "serviceCIDRs")]
    pub service_cidrs: Vec<Cidr>,
    /// `--service-node-port-range`, inclusive.
    pub node_port_range: (u16, u16),
    pub cluster_domain: String,
    /// Node capabilities kube-proxy detects at runtime, when set (`--random-fully`,
    /// `--nfacct` or the ClusterConfig document); `None` leaves each back end's default.
    /// Left out of the IR's JSON when unset, so modules serialise as before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_fully: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nfacct: Option<bool>,
    /// The nftables targets' ruleset layout (`--nft-layout` or `nftLayout`); left out of the
    /// IR's JSON when it is the default.
    #[serde(skip_serializing_if = "NftLayout::is_default")]
    pub nft_layout: NftLayout,
    /// Whether `spec.topologyKeys` picks endpoints (`--topology-keys` or `topologyKeys`);
    /// left out of the IR's JSON when it is the default.
    #[serde(skip_serializing_if = "TopologyKeys::is_default")]
    pub topology_keys: TopologyKeys,
    /// Whose answers the `dns` target writes (`dnsRecords`; the target's
    /// `--dns-records` wins); left out of the IR's JSON when it is the default.
    #[serde(skip_serializing_if = "DnsRecords::is_default")]
    pub dns_records: DnsRecords,
    /// Cilium's map sizes (`ebpfMapSizes`), for the ebpf target; left out of the IR's
    /// JSON when unset.
    #[serde(skip_serializing_if = "EbpfMapSizes::is_default")]
    pub ebpf_map_sizes: EbpfMapSizes,
    /// Cilium's load-balancing algorithm options (`ebpfLbAlgorithm`, ...), for the ebpf
    /// target; left out of the IR's JSON when unset.
    #[serde(skip_serializing_if = "EbpfAgent::is_default")]
    pub ebpf_agent: EbpfAgent,
    /// Cilium's `--enable-service-topology` (`ebpfServiceTopology`, off by default): the
    /// node pass narrows [`CiliumPort`]'s backends by Cilium's topology rules.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ebpf_service_topology: bool,
}

/// Cilium's backend selection algorithm (`--bpf-lb-algorithm`, and the per-service
/// annotation `service.cilium.io/lb-algorithm`): `pkg/loadbalancer/loadbalancer.go`,
/// `SVCLoadBalancingAlgorithm`, whose number the service value's algorithm byte holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LbAlgorithm {
    /// `random` (1): a random slot per new connection.
    Random,
    /// `maglev` (2): consistent hashing through the service's Maglev table.
    Maglev,
}

impl LbAlgorithm {
    /// `ToSVCLoadBalancingAlgorithm`: exactly `random` or `maglev` (anything else is
    /// Cilium's "undefined").
    pub fn parse(s: &str) -> Option<LbAlgorithm> {
        match s {
            "random" => Some(LbAlgorithm::Random),
            "maglev" => Some(LbAlgorithm::Maglev),
            _ => None,
        }
    }
    /// The service value's algorithm byte (`SVCLoadBalancingAlgorithm*`).
    pub fn number(self) -> u8 {
        match self {
            LbAlgorithm::Random => 1,
            LbAlgorithm::Maglev => 2,
        }
    }
}

/// Options of the Cilium agent that choose how backends are selected (the ClusterConfig's
/// `ebpfLbAlgorithm`, `ebpfLbAlgorithmAnnotation`, `ebpfMaglevTableSize`,
/// `ebpfMaglevHashSeed`; the ebpf target's flags override each one set). Unset = Cilium's
/// default (`pkg/loadbalancer/config.go`, `pkg/maglev/maglev.go`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EbpfAgent {
    /// `--bpf-lb-algorithm` (default `random`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lb_algorithm: Option<LbAlgorithm>,
    /// `--bpf-lb-algorithm-annotation` (default off): whether
    /// `service.cilium.io/lb-algorithm` is read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lb_algorithm_annotation: Option<bool>,
    /// `--bpf-lb-maglev-table-size` (default 16381), one of [`EbpfAgent::TABLE_SIZES`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maglev_table_size: Option<u32>,
    /// `--bpf-lb-maglev-hash-seed` (default `JLfvgnHc2kaSUFaI`): base64 of 12 bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maglev_hash_seed: Option<String>,
}

impl EbpfAgent {
    /// `maglev.DefaultTableSize`.
    pub const DEFAULT_TABLE_SIZE: u32 = 16381;
    /// `maglev.DefaultHashSeed`.
    pub const DEFAULT_HASH_SEED: &'static str = "JLfvgnHc2kaSUFaI";
    /// The table sizes the agent accepts (`maglevSupportedTableSizes`, primes).
    pub const TABLE_SIZES: [u32; 10] = [
        251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071,
    ];

    /// `--bpf-lb-algorithm`'s value, or why it is refused.
    pub fn parse_algorithm(s: &str) -> Result<LbAlgorithm, String> {
        LbAlgorithm::parse(s).ok_or_else(|| format!("`{s}`: use random or maglev"))
    }

    /// A table size the agent accepts (`UserConfig.ToConfig`), or why not.
    pub fn parse_table_size(s: &str) -> Result<u32, String> {
        match s.trim().parse::<u32>() {
            Ok(m) if Self::TABLE_SIZES.contains(&m) => Ok(m),
            _ => {
                let sizes: Vec<String> = Self::TABLE_SIZES.iter().map(u32::to_string).collect();
                Err(format!(
                    "`{s}` is not one of Cilium's sizes ({})",
                    sizes.join(", ")
                ))
            }
        }
    }

    /// The murmur3 seed of a hash seed (`UserConfig.ToConfig`: base64 of 12 bytes, the
    /// first four a big-endian number; the others seed the datapath's jhash), or why the
    /// agent refuses it.
    pub fn murmur_seed(seed: &str) -> Result<u32, String> {
        let d = data_encoding::BASE64
            .decode(seed.as_bytes())
            .map_err(|e| format!("`{seed}` is not base64 ({e})"))?;
        if d.len() != 12 {
            return Err(format!("`{seed}` decodes to {} bytes, not 12", d.len()));
        }
        Ok(u32::from_be_bytes([d[0], d[1], d[2], d[3]]))
    }

    /// `self`, with every option `over` sets taken from `over` (a flag over the document).
    pub fn overridden_by(&self, over: &EbpfAgent) -> EbpfAgent {
        EbpfAgent {
            lb_algorithm: over.lb_algorithm.or(self.lb_algorithm),
            lb_algorithm_annotation: over
                .lb_algorithm_annotation
                .or(self.lb_algorithm_annotation),
            maglev_table_size: over.maglev_table_size.or(self.maglev_table_size),
            maglev_hash_seed: over
                .maglev_hash_seed
                .clone()
                .or_else(|| self.maglev_hash_seed.clone()),
        }
    }

    pub fn is_default(&self) -> bool {
        *self == EbpfAgent::default()
    }
}

/// Which answers the `dns` target's zones give (docs/dns.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DnsRecords {
    /// The Kubernetes DNS-Based Service Discovery specification's records.
    #[default]
    Spec,
    /// What CoreDNS's kubernetes plugin answers (`pods verified`, `endpoint_pod_names`
    /// off): the spec's records and its extensions.
    Coredns,
}

impl DnsRecords {
    /// `spec` or `coredns`.
    pub fn parse(s: &str) -> Option<DnsRecords> {
        match s {
            "spec" => Some(DnsRecords::Spec),
            "coredns" => Some(DnsRecords::Coredns),
            _ => None,
        }
    }
    pub fn is_default(&self) -> bool {
        *self == DnsRecords::Spec
    }
}

/// What the node pass does with a Service's `spec.topologyKeys`. Kubernetes removed the
/// field in 1.22 and a current kube-proxy ignores it (endpoints are picked by hints and
/// `trafficDistribution`); the seeds describe it, so it is honoured unless asked not to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyKeys {
    /// Seed 000: the keys pick endpoints, as kube-proxy 1.17-1.21 did.
    #[default]
    Honour,
    /// As a current kube-proxy: the field is lowered as absent.
    Ignore,
}

impl TopologyKeys {
    /// `honour` or `ignore`.
    pub fn parse(s: &str) -> Option<TopologyKeys> {
        match s {
            "honour" => Some(TopologyKeys::Honour),
            "ignore" => Some(TopologyKeys::Ignore),
            _ => None,
        }
    }
    pub fn is_default(&self) -> bool {
        *self == TopologyKeys::Honour
    }
}

/// Sizes of Cilium's load-balancing maps as its agent options set them (`ebpfMapSizes`
/// in the ClusterConfig, or the ebpf target's `--map-sizes`): `KEY=N,...`. `all` is
/// `--bpf-lb-map-max` (65536 by default), the size of every map whose own option is
/// unset (`pkg/loadbalancer/config.go`, `NewConfig`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EbpfMapSizes {
    /// `--bpf-lb-map-max`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all: Option<u32>,
    /// `--bpf-lb-service-map-max`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub services: Option<u32>,
    /// `--bpf-lb-service-backend-map-max`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backends: Option<u32>,
    /// `--bpf-lb-rev-nat-map-max`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rev_nat: Option<u32>,
    /// `--bpf-lb-affinity-map-max` (the affinity and affinity-match maps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<u32>,
    /// `--bpf-lb-source-range-map-max`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_ranges: Option<u32>,
    /// `--bpf-lb-maglev-map-max`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maglev: Option<u32>,
    /// `--bpf-sock-rev-map-max` (Cilium sizes it from the node's memory when unset; here
    /// it is then `all`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sock_rev: Option<u32>,
}

impl EbpfMapSizes {
    /// The keys `KEY=N` takes, with the Cilium option each stands for.
    pub const KEYS: [(&'static str, &'static str); 8] = [
        ("all", "--bpf-lb-map-max"),
        ("services", "--bpf-lb-service-map-max"),
        ("backends", "--bpf-lb-service-backend-map-max"),
        ("rev-nat", "--bpf-lb-rev-nat-map-max"),
        ("affinity", "--bpf-lb-affinity-map-max"),
        ("source-ranges", "--bpf-lb-source-range-map-max"),
        ("maglev", "--bpf-lb-maglev-map-max"),
        ("sock-rev", "--bpf-sock-rev-map-max"),
    ];

    /// `services=131072,backends=262144`; an `Err` says what is wrong, in one line.
    pub fn parse(s: &str) -> Result<EbpfMapSizes, String> {
        let mut out = EbpfMapSizes::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((k, v)) = item.split_once('=') else {
                return Err(format!("`{item}` is not KEY=N"));
            };
            let n: u32 = v
                .trim()
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("`{item}`: give a number from 1 to 4294967295"))?;
            *out.slot(k.trim()).ok_or_else(|| {
                let keys: Vec<&str> = Self::KEYS.iter().map(|(k, _)| *k).collect();
                format!("unknown map `{}` (use {})", k.trim(), keys.join(", "))
            })? = Some(n);
        }
        Ok(out)
    }

    fn slot(&mut self, key: &str) -> Option<&mut Option<u32>> {
        Some(match key {
            "all" => &mut self.all,
            "services" => &mut self.services,
            "backends" => &mut self.backends,
            "rev-nat" => &mut self.rev_nat,
            "affinity" => &mut self.affinity,
            "source-ranges" => &mut self.source_ranges,
            "maglev" => &mut self.maglev,
            "sock-rev" => &mut self.sock_rev,
            _ => return None,
        })
    }

    /// `self`, with every key `over` sets taken from `over` (a flag over the document).
    pub fn overridden_by(mut self, over: &EbpfMapSizes) -> EbpfMapSizes {
        for (k, _) in Self::KEYS {
            let v = *over.clone().slot(k).expect("a known key");
            if v.is_some() {
                *self.slot(k).expect("a known key") = v;
            }
        }
        self
    }

    /// The value set for `key` (one of [`EbpfMapSizes::KEYS`]), if any.
    pub fn get(&self, key: &str) -> Option<u32> {
        *self.clone().slot(key)?
    }

    pub fn is_default(&self) -> bool {
        *self == EbpfMapSizes::default()
    }
}

/// How the nftables targets lay the ruleset out. Both give every packet the same fate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NftLayout {
    /// kube-proxy's own objects and names, so that the output diffs against a live node.
    #[default]
    KubeProxy,
    /// Built for the kernel's load costs: no anonymous sets or endpoint chains (docs/targets.md).
    Fast,
}

impl NftLayout {
    /// `kube-proxy` or `fast`.
    pub fn parse(s: &str) -> Option<NftLayout> {
        match s {
            "kube-proxy" => Some(NftLayout::KubeProxy),
            "fast" => Some(NftLayout::Fast),
            _ => None,
        }
    }
    pub fn is_default(&self) -> bool {
        *self == NftLayout::KubeProxy
    }
}

/// kube-proxy's KubeProxyConfiguration, with upstream defaults filled in.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyConfig {
    /// `mode` as written (`iptables` when unset).
    pub mode: String,
    /// `clusterCIDR`, comma-separated in the config: at most one per family.
    #[serde(rename = "clusterCIDRs")]
    pub cluster_cidrs: Vec<Cidr>,
    pub detect_local: DetectLocalMode,
    pub masquerade_all: bool,
    /// The mode's `masqueradeBit` (default 14): `nftables.masqueradeBit` in nftables mode,
    /// `iptables.masqueradeBit` otherwise. The mark is `1 << bit`.
    pub masquerade_bit: u8,
    /// `iptables.localhostNodePorts` (default true).
    pub localhost_node_ports: bool,
    /// `nodePortAddresses`: CIDRs, or the special value `primary`. Empty = all local addresses.
    pub node_port_addresses: Vec<NodePortAddress>,
    /// `ipvs.scheduler` (default `rr`).
    pub ipvs_scheduler: String,
    /// `conntrack.tcpBeLiberal` (0 when unset): kube-proxy leaves out the INVALID drop when set.
    pub conntrack_tcp_be_liberal: bool,
    /// The rest of the `ipvs` section. Left out of the IR's JSON when nothing is set, so
    /// modules of other modes serialise as before.
    #[serde(skip_serializing_if = "IpvsConfig::is_unset")]
    pub ipvs: IpvsConfig,
    /// The `conntrack` section's sysctls (besides `tcpBeLiberal`), with kube-proxy's
    /// defaults. Left out of the IR's JSON when it holds only the defaults.
    #[serde(skip_serializing_if = "ConntrackConfig::is_default")]
    pub conntrack: ConntrackConfig,
}

/// KubeProxyConfiguration's `conntrack` section as kube-proxy applies it at start in every
/// mode (`pkg/proxy/conntrack/sysctls.go`, `SetSysctls`), with the v1alpha1 defaults
/// (`pkg/proxy/apis/config/v1alpha1/defaults.go`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConntrackConfig {
    /// `maxPerCore` (default 32768); 0 leaves `nf_conntrack_max` (and `min`) alone.
    pub max_per_core: u32,
    /// `min` (default 131072): the floor of `maxPerCore` × CPUs.
    pub min: u32,
    /// `tcpEstablishedTimeout` (default 24h), `tcpCloseWaitTimeout` (default 1h),
    /// `udpTimeout`, `udpStreamTimeout` (no default), in whole seconds; 0 = leave it.
    pub tcp_established_timeout: u32,
    pub tcp_close_wait_timeout: u32,
    pub udp_timeout: u32,
    pub udp_stream_timeout: u32,
}

impl Default for ConntrackConfig {
    fn default() -> ConntrackConfig {
        ConntrackConfig {
            max_per_core: 32768,
            min: 131072,
            tcp_established_timeout: 24 * 3600,
            tcp_close_wait_timeout: 3600,
            udp_timeout: 0,
            udp_stream_timeout: 0,
        }
    }
}

impl ConntrackConfig {
    pub fn is_default(&self) -> bool {
        *self == ConntrackConfig::default()
    }
}

/// KubeProxyConfiguration's `ipvs` section (besides `scheduler`), as IPVS mode uses it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IpvsConfig {
    /// `strictARP`: kube-proxy sets `arp_ignore=1` and `arp_announce=2` on all interfaces.
    #[serde(rename = "strictARP")]
    pub strict_arp: bool,
    /// `tcpTimeout`, `tcpFinTimeout`, `udpTimeout` in whole seconds (what `ipvsadm --set`
    /// takes); 0 = unset, the kernel's value is kept.
    pub tcp_timeout: u32,
    pub tcp_fin_timeout: u32,
    pub udp_timeout: u32,
    /// `excludeCIDRs`: virtual servers inside these are never removed by kube-proxy's
    /// cleanup (it does not own them).
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Vec<Cidr>,
}

impl IpvsConfig {
    pub fn is_unset(&self) -> bool {
        *self == IpvsConfig::default()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", content = "value")]
pub enum DetectLocalMode {
    /// Nothing is local: no detector.
    None,
    /// By `clusterCIDR` (the default when clusterCIDR is set; `None` otherwise).
    ClusterCIDR,
    /// By the node's `spec.podCIDRs`.
    NodeCIDR,
    /// `detectLocal.bridgeInterface`.
    BridgeInterface(String),
    /// `detectLocal.interfaceNamePrefix`.
    InterfaceNamePrefix(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum NodePortAddress {
    Cidr(Cidr),
    /// The node's primary IPs (one per family).
    Primary,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ServiceType {
    ClusterIP,
    NodePort,
    LoadBalancer,
    ExternalName,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum TrafficPolicy {
    Cluster,
    Local,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Protocol {
    TCP,
    UDP,
    SCTP,
}

impl Protocol {
    /// Lower case, as iptables, nft and the chain-name hashes write it.
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::TCP => "tcp",
            Protocol::UDP => "udp",
            Protocol::SCTP => "sctp",
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::TCP => "TCP",
            Protocol::UDP => "UDP",
            Protocol::SCTP => "SCTP",
        }
    }
    /// IANA protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::TCP => 6,
            Protocol::UDP => 17,
            Protocol::SCTP => 132,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    pub namespace: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ServiceType,
    /// `clusterIP: None`.
    pub headless: bool,
    /// `spec.clusterIPs` after allocation, primary first. Empty for headless and
    /// ExternalName services, and when `--no-allocate` left them unset.
    #[serde(rename = "clusterIPs")]
    pub cluster_ips: Vec<IpAddr>,
    pub ip_families: Vec<IpFamily>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_name: Option<String>,
    /// In spec order, as kube-proxy keeps them (the order is part of the object, so it
    /// does not depend on file order).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[serde(rename = "externalIPs")]
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip`, in status order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_ingress: Vec<LoadBalancerIngress>,
    /// `spec.loadBalancerSourceRanges` (kube-proxy ignores the annotation
    /// `service.beta.kubernetes.io/load-balancer-source-ranges`, which cloud providers read).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_source_ranges: Vec<Cidr>,
    pub external_traffic_policy: TrafficPolicy,
    pub internal_traffic_policy: TrafficPolicy,
    /// `Some(timeoutSeconds)` when sessionAffinity is ClientIP (default 10800).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_affinity_timeout: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_check_node_port: Option<u16>,
    /// The deprecated `spec.topologyKeys` (seed 000), in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub topology_keys: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_distribution: Option<String>,
    /// The annotation `service.kubernetes.io/topology-aware-hints`, else
    /// `service.kubernetes.io/topology-mode` (the deprecated one wins, as in Cilium's
    /// `getAnnotationTopologyAwareHints`), as written. kube-proxy reads the slices' hints,
    /// never this; the ebpf target's Cilium view does ([`CiliumPort`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_mode: Option<String>,
    /// The label `service.kubernetes.io/service-proxy-name`: the service belongs to another
    /// proxy, and kube-proxy's informers do not see it (its DNS names stay).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_name: Option<String>,
    /// The label `service.kubernetes.io/headless` (the EndpointSlice controller's mark of a
    /// headless service's slices): kube-proxy's informers select
    /// `!service.kubernetes.io/headless` as they select `!…/service-proxy-name`
    /// (`cmd/kube-proxy/app/server.go`, the informer factory's label selector), and
    /// Cilium's watcher does the same, so no proxy sees such a Service, whatever its
    /// cluster IP (its DNS names stay: CoreDNS does not filter on the label).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub headless_label: bool,
    /// `spec.loadBalancerClass`: which load balancer implementation owns the ingress
    /// IPs. kube-proxy ignores it; the ebpf target reads it (Cilium's wildcard entries).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balancer_class: Option<String>,
    /// The Service's `service.cilium.io/*` annotations by key (Cilium's per-service
    /// options: `src-ranges-policy`, `lb-algorithm`, ...), which only the ebpf target
    /// reads; the node pass interprets them into [`CiliumPort`].
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cilium_annotations: BTreeMap<String, String>,
    /// In spec order (port order is part of the Service's identity for users).
    pub ports: Vec<ServicePort>,
    /// A service without ports: its endpoints all the same (port 0), which only DNS
    /// reads (a headless service's A/AAAA records do not depend on ports). Empty when
    /// the service has ports.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub portless_endpoints: Vec<Endpoint>,
    /// A service without ports: the ports its EndpointSlices (or Endpoints) list, sorted
    /// by (name, protocol), each with the endpoints listing it at their slice's number.
    /// Only DNS reads them (CoreDNS's SRV records follow the slices' ports). Empty when
    /// the service has ports.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub portless_slice_ports: Vec<SlicePort>,
    /// Field paths whose values svc-compile allocated (not written by the user),
    /// e.g. `spec.clusterIPs(IPv4)`, `spec.ports[1].nodePort`. Sorted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allocated: Vec<String>,
}

impl Service {
    /// kube-proxy's `ExternallyAccessible`: LoadBalancer, NodePort, or any service with externalIPs.
    pub fn externally_accessible(&self) -> bool {
        matches!(self.kind, ServiceType::NodePort | ServiceType::LoadBalancer)
            || !self.external_ips.is_empty()
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIngress {
    pub ip: IpAddr,
    /// `ipMode: Proxy`: the load balancer proxies, so kube-proxy does not capture the IP.
    pub proxy_mode: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// Empty when the port has no name.
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_port: Option<u16>,
    pub target_port: TargetPort,
    /// Sorted by the string `ip:port` (kube-proxy's order); deduplicated with a
    /// non-terminating endpoint winning over a terminating one.
    pub endpoints: Vec<Endpoint>,
}

/// A port an EndpointSlice lists for a service without ports.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlicePort {
    /// Empty when the port has no name.
    pub name: String,
    pub protocol: Protocol,
    /// Sorted and merged as [`ServicePort::endpoints`]; each at its slice's port number.
    pub endpoints: Vec<Endpoint>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum TargetPort {
    Number(u16),
    Name(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    /// `ip:port` as Go's `net.JoinHostPort` writes it: what the back ends hash and print.
    /// Written once here, shared by every node's view.
    #[serde(skip)]
    pub addr: Arc<str>,
    /// The EndpointSlice endpoint's other addresses, after `ip` (its `addresses[0]`), in
    /// written order, without repeats. kube-proxy reads only the first address; Cilium
    /// makes a backend of every one (`pkg/k8s/endpoints.go`, `ParseEndpointSliceV1`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_addresses: Vec<IpAddr>,
    /// Shared by every endpoint on the node (a few nodes, many endpoints).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<Arc<str>>,
    /// The endpoint's DNS hostname (`<hostname>.<service>.<ns>.svc.<zone>`): the
    /// EndpointSlice endpoint's or Endpoints address's `hostname`, or for a selected Pod
    /// its `spec.hostname` when its `spec.subdomain` is the service's name (the
    /// EndpointSlice controller's rule). Read only by the discovery targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// `hints.forZones[].name`, sorted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hint_zones: Vec<String>,
    /// `hints.forNodes[].name`, sorted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hint_nodes: Vec<String>,
    /// Where it came from: `EndpointSlice ns/name`, `Endpoints ns/name` (mirrored) or `Pod ns/name`.
    pub source: Arc<str>,
    /// The other copies of this `ip:port` (another slice listing it), merged into this
    /// one in resolution order. The node pass serves a node its own copy when this one is
    /// on another node (kube-proxy: a local copy wins, `endpointslicecache.go`).
    #[serde(skip)]
    pub copies: Vec<Endpoint>,
}

impl Endpoint {
    /// This endpoint and its [`copies`](Endpoint::copies): every slice's listing of the
    /// `ip:port` (what CoreDNS and a diff of the slices see).
    pub fn listings(&self) -> impl Iterator<Item = &Endpoint> {
        std::iter::once(self).chain(&self.copies)
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub name: String,
    /// `status.addresses` of type InternalIP then ExternalIP, each in status order.
    pub addresses: Vec<IpAddr>,
    pub labels: BTreeMap<String, String>,
    #[serde(rename = "podCIDRs")]
    pub pod_cidrs: Vec<Cidr>,
    /// `metadata.deletionTimestamp` is set: the node is being deleted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
    /// `spec.taints[].key`, as written.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
}

impl Node {
    /// `topology.kubernetes.io/zone`.
    pub fn zone(&self) -> Option<&str> {
        self.labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str)
    }
}

// ---------------------------------------------------------------------------------------
// Per-node view
// ---------------------------------------------------------------------------------------

/// What one node programs for one family. Produced by `passes::node::node_view`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// The module's node capabilities ([`ClusterConfig::random_fully`],
    /// [`ClusterConfig::nfacct`]), copied for the back ends that honour them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_fully: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nfacct: Option<bool>,
    /// [`ClusterConfig::nft_layout`], copied for the nftables targets.
    #[serde(skip_serializing_if = "NftLayout::is_default")]
    pub nft_layout: NftLayout,
    /// [`ClusterConfig::ebpf_map_sizes`], copied for the ebpf target.
    #[serde(skip_serializing_if = "EbpfMapSizes::is_default")]
    pub ebpf_map_sizes: EbpfMapSizes,
    /// [`ClusterConfig::ebpf_agent`], copied for the ebpf target.
    #[serde(skip_serializing_if = "EbpfAgent::is_default")]
    pub ebpf_agent: EbpfAgent,
    pub node_name: String,
    pub family: IpFamily,
    /// The node's IPs of this family, primary first.
    #[serde(rename = "nodeIPs")]
    pub node_ips: Vec<IpAddr>,
    /// `1 << masqueradeBit`.
    pub masquerade_mark: u32,
    pub masquerade_all: bool,
    /// How "traffic from a local pod" is recognised; `None` = no detector.
    pub local_detector: Option<LocalDetector>,
    /// Where NodePorts are accepted.
    pub node_port_addresses: NodePortAddresses,
    /// Effective localhostNodePorts (always false for IPv6).
    pub localhost_node_ports: bool,
    /// Whether the martian-packet rule (filter KUBE-FIREWALL) is written.
    pub martian_rule: bool,
    /// kube-proxy's large-cluster mode (more than 1000 endpoints on this family).
    pub large_cluster: bool,
    /// Drop INVALID conntrack state in KUBE-FORWARD (false with conntrack.tcpBeLiberal).
    pub drop_invalid: bool,
    /// The service CIDRs of this family (nftables' "unallocated ClusterIP" drop).
    #[serde(rename = "serviceCIDRs")]
    pub service_cidrs: Vec<Cidr>,
    /// One entry per (service, port) that the proxy handles on this family, sorted by
    /// (namespace, name, port name, protocol). Headless and ExternalName services are not here.
    pub ports: Vec<PortView>,
    /// The module's `ipvs.scheduler` and `ipvs` section, copied for the IPVS back end, whose
    /// renderer sees views and not the module. Not in the view's JSON: the module's
    /// `proxy` already shows them.
    #[serde(skip)]
    pub ipvs_scheduler: String,
    #[serde(skip)]
    pub ipvs: IpvsConfig,
    /// The module's `conntrack` section, copied for the node's sysctls (`apply`). Not in
    /// the view's JSON, as `ipvs`.
    #[serde(skip)]
    pub conntrack: ConntrackConfig,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value")]
pub enum LocalDetector {
    /// Source inside this CIDR (clusterCIDR or the node's podCIDR).
    Cidr(Cidr),
    BridgeInterface(String),
    InterfaceNamePrefix(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "ips")]
pub enum NodePortAddresses {
    /// Any local address (`-m addrtype --dst-type LOCAL`).
    All,
    /// Only these node IPs.
    Ips(Vec<IpAddr>),
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PortView {
    pub service: ServiceId,
    pub namespace: String,
    pub name: String,
    /// Empty when the port has no name.
    pub port_name: String,
    pub protocol: Protocol,
    /// kube-proxy's ServicePortName string: `ns/name:port`, or `ns/name` for an unnamed port.
    pub spn: String,
    /// The cluster IP of this family; `None` when unallocated (`--no-allocate`).
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<IpAddr>,
    pub port: u16,
    pub node_port: Option<u16>,
    /// This family's externalIPs, in spec order.
    #[serde(rename = "externalIPs")]
    pub external_ips: Vec<IpAddr>,
    /// This family's LoadBalancer ingress IPs that the proxy captures (ipMode VIP), in status order.
    #[serde(rename = "loadBalancerIPs")]
    pub load_balancer_ips: Vec<IpAddr>,
    /// This family's loadBalancerSourceRanges; empty when one of them is a zero prefix
    /// (`0.0.0.0/0` allows everyone).
    pub source_ranges: Vec<Cidr>,
    /// Some source range contains a node IP (kube-proxy then also accepts `-s lbIP`).
    pub source_ranges_include_node: bool,
    pub health_check_node_port: Option<u16>,
    pub affinity_timeout: Option<u32>,
    pub externally_accessible: bool,
    /// ITP=Local.
    pub internal_local: bool,
    /// ETP=Local on an externally accessible service.
    pub external_local: bool,
    /// Any endpoint anywhere is ready, or serving and terminating — after topologyKeys:
    /// when no key matches this node, the service has no endpoints here (seed 000).
    pub has_endpoints: bool,
    /// kube-proxy's `hasInternalEndpoints`: cluster-IP traffic has an endpoint to go to
    /// (`has_endpoints`, and with ITP=Local a local one). When true, the internal policy
    /// chain's endpoint set (`local_endpoints` with ITP=Local, else `cluster_endpoints`) is
    /// not empty.
    pub has_internal_endpoints: bool,
    /// `hasExternalEndpoints`: the same for external traffic and ETP; false on a port that
    /// is not externally accessible. When true, the external policy chain's endpoint set
    /// is not empty.
    pub has_external_endpoints: bool,
    /// What the filter does with traffic to this port that has no endpoint to go to.
    pub no_endpoints_verdict: NoEndpointsVerdict,
    /// `usesExternalTrafficChain`: the external chain exists (`has_endpoints` on an
    /// externally accessible port). Not tied to `has_external_endpoints`: without them it
    /// still holds the short-circuit rules for pod and host traffic, which go to the
    /// cluster policy chain (so `cluster_endpoints` is then not empty).
    pub uses_external_chain: bool,
    /// Whether the firewall chain (loadBalancerSourceRanges) exists. The modes differ:
    /// iptables needs `has_endpoints` too (its FW chain jumps to the external chain), nftables
    /// builds it whenever there are LoadBalancer IPs and source ranges.
    pub uses_firewall_chain: ByMode<bool>,
    /// Every endpoint of this family, sorted by the string `ip:port`; the sets below index it.
    pub endpoints: Vec<EndpointView>,
    /// Endpoints used for cluster-wide traffic (after topology and the terminating
    /// fallback). Empty when nothing uses them. Indices into `endpoints`, ascending.
    /// Not empty = the cluster policy chain exists (`len(clusterEndpoints) > 0 &&
    /// UsesClusterEndpoints()`).
    pub cluster_endpoints: Vec<u32>,
    /// Endpoints used for node-local traffic. Empty when nothing uses them. Not empty =
    /// the local policy chain exists.
    pub local_endpoints: Vec<u32>,
    /// Why endpoints were filtered, for humans (`topologyKeys: zone`, `hints: zone a`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    /// What Cilium's agent makes of this port on this node, where it reads the objects
    /// otherwise than kube-proxy (the ebpf target's input). Not in the IR's JSON: the
    /// ebpf target's JSON shows what became of it.
    #[serde(skip)]
    pub cilium: CiliumPort,
}

/// One service port as Cilium's load-balancing control plane sees it on one node and
/// family, decided by the node pass so that the ebpf back end only lays it out:
/// - backends: every address of every endpoint (`pkg/k8s/endpoints.go`,
///   `ParseEndpointSliceV1`), each with Cilium's state (`pkg/loadbalancer/reflectors/
///   conversions.go`, `convertEndpoints`); unlike kube-proxy no endpoint is dropped for
///   its conditions, and there is no terminating fallback here (the reconciler counts);
/// - which backends each traffic policy selects (`pkg/loadbalancer/writer/writer.go`,
///   `DefaultSelectBackends`): all of them, or those on this node (an endpoint without a
///   `nodeName` counts as local), narrowed, with `--enable-service-topology`
///   (`ClusterConfig::ebpf_service_topology`), by Cilium's own topology rules
///   ([`CiliumTopology`]), not kube-proxy's;
/// - the per-service settings Cilium reads from the Service (source ranges as written,
///   `service.cilium.io/src-ranges-policy`, the load-balancer class).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CiliumPort {
    /// Sorted by (address, port) as numbers (`sortedBackends` within one state), one per
    /// `ip:port` (the lowest state wins when two endpoints name one address).
    pub backends: Vec<CiliumBackend>,
    /// What a frontend with a Cluster policy selects: every backend. Ascending indices.
    pub cluster: Vec<u32>,
    /// What a frontend with a Local policy selects. Ascending indices.
    pub local: Vec<u32>,
    /// Cilium's traffic distribution for the service and whether it narrowed the
    /// selections on this node; `None` when the agent reads no topology.
    pub topology: Option<CiliumTopology>,
    /// This family's `loadBalancerSourceRanges` as networks, in spec order. Cilium keeps
    /// a zero prefix as an entry (kube-proxy reads it as "no ranges").
    pub source_ranges: Vec<Cidr>,
    /// `service.cilium.io/src-ranges-policy: deny`: the ranges are a deny list.
    pub source_ranges_deny: bool,
    /// Cilium's LB-IPAM owns the load-balancer IPs (no `loadBalancerClass`, LB-IPAM
    /// being the default allocator, or `io.cilium/bgp-control-plane` /
    /// `io.cilium/l2-announcer`): the reconciler's `isWildcardClass`.
    pub lb_ipam_class: bool,
    /// `service.cilium.io/lb-algorithm` as Cilium reads it (`GetLBAlgorithmAnnotation`:
    /// exactly `random` or `maglev`; `None` when absent or anything else). The agent
    /// honours it only with `--bpf-lb-algorithm-annotation`.
    pub lb_algorithm: Option<LbAlgorithm>,
}

/// How Cilium's topology rules (`--enable-service-topology`) treated one port on one node:
/// `pkg/loadbalancer/writer/writer.go`, `DefaultSelectBackends`, with the service's
/// `TrafficDistribution` from `reflectors/conversions.go`, `convertService`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CiliumTopology {
    /// `PreferSameZone` (also `PreferClose` and the topology annotations) or
    /// `PreferSameNode`.
    pub distribution: &'static str,
    /// Why the backends were narrowed or not, for humans (`zone zone-a`, `none for zone
    /// zone-c: every backend`, ...).
    pub note: String,
}

/// One backend of a [`CiliumPort`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CiliumBackend {
    pub ip: IpAddr,
    pub port: u16,
    pub state: BackendState,
    /// The Maglev weight (`convertEndpoints`: `loadbalancer.DefaultBackendWeight`, 100).
    pub weight: u16,
}

/// Cilium's backend states (`pkg/loadbalancer/loadbalancer.go`), in its sort order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BackendState {
    /// `ready` (whatever serving and terminating say).
    Active,
    /// Not ready, terminating and serving: used only when no backend is active.
    Terminating,
    /// Terminating and not serving: kept for its connections, never selected.
    TerminatingNotServing,
    /// Not ready and not terminating: in the backends map, in no service slot.
    Maintenance,
}

impl BackendState {
    /// `convertEndpoints`: the state of an endpoint with these conditions.
    pub fn of(ready: bool, serving: bool, terminating: bool) -> BackendState {
        match (ready, serving, terminating) {
            (true, _, _) => BackendState::Active,
            (false, false, true) => BackendState::TerminatingNotServing,
            (false, true, true) => BackendState::Terminating,
            (false, _, false) => BackendState::Maintenance,
        }
    }
}

impl PortView {
    /// Endpoints some chain dispatches to (cluster ∪ local), ascending.
    pub fn reachable_endpoints(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .cluster_endpoints
            .iter()
            .chain(&self.local_endpoints)
            .copied()
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// The filter's verdict for traffic that has no endpoint to go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum NoEndpointsVerdict {
    /// The service has no usable endpoint anywhere: refuse the connection.
    Reject,
    /// Endpoints exist, but a Local policy leaves none on this node: drop silently.
    Drop,
}

/// A decision that kube-proxy's proxy modes make differently, recorded for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ByMode<T> {
    pub iptables: T,
    pub nftables: T,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointView {
    pub ip: IpAddr,
    pub port: u16,
    /// `ip:port` (`[ip]:port` for IPv6), the IR endpoint's.
    pub addr: Arc<str>,
    /// On this node.
    pub is_local: bool,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

#[cfg(test)]
mod tests {
    use super::EbpfMapSizes;

    #[test]
    fn ebpf_map_sizes_parse_and_override() {
        let s = EbpfMapSizes::parse("services=131072, backends=262144,all=100").unwrap();
        assert_eq!(s.services, Some(131072));
        assert_eq!(s.backends, Some(262144));
        assert_eq!(s.all, Some(100));
        assert_eq!(s.get("rev-nat"), None);
        assert_eq!(EbpfMapSizes::parse("").unwrap(), EbpfMapSizes::default());
        for (bad, why) in [
            ("services", "is not KEY=N"),
            ("services=0", "give a number"),
            ("services=x", "give a number"),
            ("service=1", "unknown map `service`"),
        ] {
            let e = EbpfMapSizes::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let doc = EbpfMapSizes::parse("all=10,services=20").unwrap();
        let flag = EbpfMapSizes::parse("services=30,maglev=5").unwrap();
        let both = doc.overridden_by(&flag);
        assert_eq!(
            (both.all, both.services, both.maglev),
            (Some(10), Some(30), Some(5))
        );
    }
}
