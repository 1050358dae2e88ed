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
pub(crate) fn ensure(netns: Option<&str>, wanted: &[(&str, &str)]) -> Result<Vec<String>, Fail> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let name = |(k, v): &(&str, &str)| format!("net.{}={v}", k.replace('/', "."));
    netns::in_named(netns, || {
        let mut changed = Vec::new();
        for (key, value) in wanted {
            let path = Path::new("/proc/sys/net").join(key);
            if fs::read_to_string(&path)?.trim() != *value {
                fs::write(&path, value)?;
                changed.push(name(&(key, value)));
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
