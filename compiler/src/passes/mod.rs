//! Passes, called in a fixed order by [`crate::compile`]: validate → resolve → allocate →
//! lower; then, per node and family, `node`.

pub mod node;
pub mod validate;

use crate::net::Cidr;

/// What kube-apiserver's flags decide, after CLI flags and the ClusterConfig document
/// were merged (flags win).
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--service-cluster-ip-range`: one CIDR per family, primary first. Default 10.96.0.0/12.
    pub service_cidrs: Vec<Cidr>,
    /// `--service-node-port-range`, inclusive. Default 30000-32767.
    pub node_port_range: (u16, u16),
    /// `--cluster-domain`. Default cluster.local.
    pub cluster_domain: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
            node_port_range: (30000, 32767),
            cluster_domain: "cluster.local".into(),
        }
    }
}
