//! kube-proxy's iptables chain names, written once: the renderer (`document.rs`,
//! `ports.rs`, and IPVS mode through them) declares and fills these chains, the planner
//! owns the per-service ones by their prefixes, `drift` groups by them and `trace` selects
//! a step's lines by them.
//!
//! Invariant: a chain a document declares is a constant here or a name [`PortChains`] or
//! [`SepChain`] builds, so a rename here reaches every reader.

use crate::common::{chain_hash, ChainHash};
use std::fmt;

// The static chains (kube-proxy's names).
pub(crate) const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub(crate) const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub(crate) const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub(crate) const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub(crate) const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub(crate) const KUBE_FORWARD: &str = "KUBE-FORWARD";
pub(crate) const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
pub(crate) const KUBE_FIREWALL: &str = "KUBE-FIREWALL";
pub(crate) const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";
/// The comment of the rule that drops remote traffic to 127.0.0.0/8 (kubelet's rule),
/// written exactly when localhost node ports are on, i.e. when the node needs
/// `route_localnet` (the planner asks for the sysctl by it).
pub(crate) const MARTIAN_COMMENT: &str = "block incoming localnet connections";

// The per-service chains' prefixes; a 16-character hash follows (`common::chain_hash`).
const SVC: &str = "KUBE-SVC-";
const SVL: &str = "KUBE-SVL-";
const EXT: &str = "KUBE-EXT-";
const FW: &str = "KUBE-FW-";
const SEP: &str = "KUBE-SEP-";

/// Every per-service chain's prefix: chains with these names are kube-proxy's (and the
/// planner's) even when no document we remember declared them (kube-proxy deletes them the
/// same way).
pub(crate) const SERVICE_PREFIXES: [&str; 5] = [SVC, SVL, EXT, FW, SEP];

/// Whether `chain` is one of kube-proxy's per-service chains.
pub(crate) fn is_service_chain(chain: &str) -> bool {
    SERVICE_PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// The chains of one service port (`spn` = `namespace/name:port`, `proto` lower case);
/// they share one hash.
pub(crate) struct PortChains {
    /// Cluster traffic policy.
    pub svc: String,
    /// Local traffic policy.
    pub svl: String,
    /// External destinations.
    pub ext: String,
    /// Load-balancer source ranges.
    pub fw: String,
}

impl PortChains {
    pub(crate) fn new(spn: &str, proto: &str) -> PortChains {
        let hash = chain_hash(&[spn, proto]);
        PortChains {
            svc: format!("{SVC}{hash}"),
            svl: format!("{SVL}{hash}"),
            ext: format!("{EXT}{hash}"),
            fw: format!("{FW}{hash}"),
        }
    }
}

/// `KUBE-SEP-<hash>`: one endpoint's chain, hashed from the service port and the
/// endpoint's `ip:port` (IPv6 bracketed); displayed without allocating.
pub(crate) struct SepChain(ChainHash);

impl SepChain {
    pub(crate) fn new(spn: &str, proto: &str, addr: &str) -> SepChain {
        SepChain(chain_hash(&[spn, proto, addr]))
    }
}

impl fmt::Display for SepChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SEP}{}", self.0)
    }
}
