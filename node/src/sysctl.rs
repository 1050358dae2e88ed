//! The node's sysctls a back end needs (`Planner::sysctls`), read and written under
//! `/proc/sys/net` from a thread inside the node's network namespace (the `net` sysctls
//! are per namespace: the file a thread opens is its own namespace's), so no process runs
//! and an apply that finds them set writes nothing.

use crate::netns;
use crate::Fail;
use std::fs;
use std::path::Path;

/// Writes each `(key, value)` (below `/proc/sys/net/`) whose value differs in the network
/// namespace `netns` (or this host's); returns the keys it changed, as `sysctl` names them
/// (`net.ipv4.conf.all.route_localnet=1`).
pub(crate) fn ensure<K: AsRef<str> + Sync, V: AsRef<str> + Sync>(
    netns: Option<&str>,
    wanted: &[(K, V)],
) -> Result<Vec<String>, Fail> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let name = |(k, v): &(K, V)| format!("net.{}={}", k.as_ref().replace('/', "."), v.as_ref());
    netns::in_named(netns, || {
        let mut changed = Vec::new();
        for kv in wanted {
            let (key, value) = (kv.0.as_ref(), kv.1.as_ref());
            let path = Path::new("/proc/sys/net").join(key);
            if fs::read_to_string(&path)?.trim() != value {
                fs::write(&path, value)?;
                changed.push(name(kv));
            }
        }
        Ok(changed)
    })
    .map_err(|e| {
        Fail(format!(
            "cannot set the sysctls the rules need ({}): {e}",
            wanted.iter().map(name).collect::<Vec<_>>().join(", ")
        ))
    })
}

/// KubeProxyConfiguration's conntrack settings (`svc_targets::plan::sysctls`): the timeouts
/// in the node's namespace; `nf_conntrack_max` and the hash table only on the host, since
/// a `--netns` namespace stands for the node but shares the host's table. Returns what it
/// changed, and what it left (said once by the caller).
pub(crate) fn ensure_conntrack(
    netns: Option<&str>,
    wanted: &svc_targets::plan::sysctls::Conntrack,
) -> Result<(Vec<String>, Option<String>), Fail> {
    use svc_targets::plan::sysctls::{hashsize, CONNTRACK_MAX, HASHSIZE};
    let mut changed = ensure(netns, &wanted.per_netns)?;
    let Some(max) = wanted.host else {
        return Ok((changed, None));
    };
    if netns.is_some() {
        return Ok((
            changed,
            Some(format!(
                "net.netfilter.nf_conntrack_max={max} is the host's: not set for a --netns node"
            )),
        ));
    }
    changed.extend(ensure(None, &[(CONNTRACK_MAX, max.to_string())])?);
    let current = fs::read_to_string(HASHSIZE)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(size) = current.and_then(|c| hashsize(max, c)) {
        fs::write(HASHSIZE, size.to_string()).map_err(|e| {
            Fail(format!(
                "cannot raise the conntrack hash table ({HASHSIZE}) to {size}: {e}"
            ))
        })?;
        changed.push(format!("{HASHSIZE}={size}"));
    }
    Ok((changed, None))
}

/// The CPUs the kernel has online (kube-proxy's count for `maxPerCore`).
pub(crate) fn cpus() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u64::try_from(n).unwrap_or(1).max(1)
}
