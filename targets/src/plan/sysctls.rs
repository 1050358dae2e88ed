//! The conntrack sysctls kube-proxy sets at start in every mode, from KubeProxyConfiguration's
//! `conntrack` section (`pkg/proxy/conntrack/sysctls.go`, `SetSysctls`), as a pure list
//! (`svc_node`'s apply) writes where the node's value differs:
//! - `maxPerCore` × CPUs, or `min` when that is more, as `nf_conntrack_max` (nothing when
//!   `maxPerCore` is 0), and the conntrack hash table raised to a quarter of it when smaller
//!   (`/sys/module/nf_conntrack/parameters/hashsize`). Both belong to the host (the kernel
//!   lets only the first network namespace write `nf_conntrack_max`): [`Conntrack::host`];
//! - the timeouts above 0 (`tcpEstablishedTimeout`, `tcpCloseWaitTimeout`, `udpTimeout`,
//!   `udpStreamTimeout`), per network namespace: [`Conntrack::per_netns`].
//!
//! `tcpBeLiberal` is not here: kube-proxy only reads `nf_conntrack_tcp_be_liberal` (the
//! INVALID drop is left out when it is set; see `ir::ProxyConfig`).

use svc_compiler::ir::ConntrackConfig;

/// What to write, keys below `/proc/sys/net/`.
#[derive(Debug, PartialEq, Eq)]
pub struct Conntrack {
    pub per_netns: Vec<(&'static str, String)>,
    /// `nf_conntrack_max` (the hash table follows it), for the host only.
    pub host: Option<u64>,
}

pub const CONNTRACK_MAX: &str = "netfilter/nf_conntrack_max";
/// The hash table's size: a module parameter, not a sysctl.
pub const HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";

/// The settings for a node with `cpus` CPUs.
pub fn conntrack(c: &ConntrackConfig, cpus: u64) -> Conntrack {
    let host =
        (c.max_per_core > 0).then(|| (u64::from(c.max_per_core) * cpus).max(u64::from(c.min)));
    let per_netns = [
        (
            "netfilter/nf_conntrack_tcp_timeout_established",
            c.tcp_established_timeout,
        ),
        (
            "netfilter/nf_conntrack_tcp_timeout_close_wait",
            c.tcp_close_wait_timeout,
        ),
        ("netfilter/nf_conntrack_udp_timeout", c.udp_timeout),
        (
            "netfilter/nf_conntrack_udp_timeout_stream",
            c.udp_stream_timeout,
        ),
    ]
    .into_iter()
    .filter(|(_, v)| *v > 0)
    .map(|(k, v)| (k, v.to_string()))
    .collect();
    Conntrack { per_netns, host }
}

/// The hash table size for `max` entries when the node's `current` is smaller (kube-proxy
/// only ever raises it).
pub fn hashsize(max: u64, current: u64) -> Option<u64> {
    (current < max / 4).then_some(max / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxys_defaults_and_its_rules() {
        let d = ConntrackConfig::default();
        // 32768 × 2 CPUs is under min: min wins; 32768 × 8 is over it.
        assert_eq!(conntrack(&d, 2).host, Some(131072));
        assert_eq!(conntrack(&d, 8).host, Some(262144));
        assert_eq!(
            conntrack(&d, 2).per_netns,
            [
                (
                    "netfilter/nf_conntrack_tcp_timeout_established",
                    "86400".to_string()
                ),
                (
                    "netfilter/nf_conntrack_tcp_timeout_close_wait",
                    "3600".to_string()
                ),
            ]
        );
        // maxPerCore 0 leaves the table alone, min too; udp timeouts when given.
        let c = ConntrackConfig {
            max_per_core: 0,
            udp_timeout: 30,
            tcp_established_timeout: 0,
            ..d
        };
        let s = conntrack(&c, 64);
        assert_eq!(s.host, None);
        assert_eq!(
            s.per_netns.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            [
                "netfilter/nf_conntrack_tcp_timeout_close_wait",
                "netfilter/nf_conntrack_udp_timeout"
            ]
        );
        assert_eq!(hashsize(131072, 16384), Some(32768));
        assert_eq!(hashsize(131072, 65536), None);
    }
}
