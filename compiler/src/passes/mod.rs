//! Passes, called in a fixed order by [`crate::compile`]: validate → resolve → allocate →
//! lower; then, per node and family, `node`.

pub mod allocate;
pub mod infer;
pub mod lower;
pub mod node;
pub mod resolve;
pub mod validate;

use crate::net::Cidr;

/// What kube-apiserver's flags decide, after CLI flags and the ClusterConfig document
/// were merged (flags win).
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--service-cluster-ip-range`: one CIDR per family, primary first. Default 10.96.0.0/12,
    /// kubeadm's (kube-apiserver's own is 10.0.0.0/24, deprecated; docs/config.md,
    /// "The service range"); under `--no-allocate` without a range, inferred from the input.
    pub service_cidrs: Vec<Cidr>,
    /// `--service-node-port-range`, inclusive. Default 30000-32767.
    pub node_port_range: (u16, u16),
    /// `--cluster-domain`. Default cluster.local.
    pub cluster_domain: String,
    /// `--random-fully` / `randomFully`, `--nfacct` / `nfacct`: node capabilities kube-proxy
    /// detects at runtime. `None` = each back end's default.
    pub random_fully: Option<bool>,
    pub nfacct: Option<bool>,
    /// `--nft-layout` / `nftLayout`.
    pub nft_layout: crate::ir::NftLayout,
    /// `--topology-keys` / `topologyKeys`.
    pub topology_keys: crate::ir::TopologyKeys,
    /// `dnsRecords` (the `dns` target's `--dns-records` wins over it).
    pub dns_records: crate::ir::DnsRecords,
    /// `ebpfMapSizes` (the ebpf target's `--map-sizes` overrides it key by key).
    pub ebpf_map_sizes: crate::ir::EbpfMapSizes,
    /// `ebpfLbAlgorithm`, ... (the ebpf target's flags override each one).
    pub ebpf_agent: crate::ir::EbpfAgent,
    /// `ebpfServiceTopology` (Cilium's `--enable-service-topology`).
    pub ebpf_service_topology: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
            node_port_range: (30000, 32767),
            cluster_domain: "cluster.local".into(),
            random_fully: None,
            nfacct: None,
            nft_layout: Default::default(),
            topology_keys: Default::default(),
            dns_records: Default::default(),
            ebpf_map_sizes: Default::default(),
            ebpf_agent: Default::default(),
            ebpf_service_topology: false,
        }
    }
}

/// Parse `--service-cluster-ip-range` (comma-separated, at most one range per family).
pub fn parse_service_cidrs(s: &str) -> Result<Vec<Cidr>, String> {
    let v: Vec<Cidr> = s
        .split(',')
        .map(|c| c.trim().parse::<Cidr>().map(|c| c.network()))
        .collect::<Result<_, _>>()?;
    if v.is_empty() || v.len() > 2 || (v.len() == 2 && v[0].family() == v[1].family()) {
        return Err(format!(
            "`{s}` must be one range, or two of different families"
        ));
    }
    Ok(v)
}

/// Parse `--service-node-port-range` (`30000-32767`, or `30000+2768`).
pub fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("`{s}` is not a port range such as 30000-32767");
    let (lo, hi) = if let Some((a, b)) = s.split_once('-') {
        (
            a.trim().parse::<u16>().map_err(|_| bad())?,
            b.trim().parse::<u16>().map_err(|_| bad())?,
        )
    } else if let Some((a, n)) = s.split_once('+') {
        let lo = a.trim().parse::<u16>().map_err(|_| bad())?;
        let n = n.trim().parse::<u16>().map_err(|_| bad())?;
        (lo, lo.checked_add(n).ok_or_else(bad)?)
    } else {
        return Err(bad());
    };
    if lo == 0 || lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}
