//! The node's packet filter through a planner's commands: where they run (the host or
//! `ip netns exec NS`), the node's read, and a document loaded into an empty network
//! namespace to learn the kernel's spelling. Shared by `apply` and `drift`.

use crate::proc::{first_line, run_captured, shell_line};
use crate::Fail;
use std::path::Path;
use svc_targets::plan::Planner;

/// `argv` (with `file` appended) inside the network namespace `netns`, or on the host.
pub fn on_node(netns: Option<&str>, mut argv: Vec<String>, file: Option<&Path>) -> Vec<String> {
    if let Some(f) = file {
        argv.push(f.display().to_string());
    }
    match netns {
        Some(ns) => ["ip", "netns", "exec", ns]
            .iter()
            .map(|s| s.to_string())
            .chain(argv)
            .collect(),
        None => argv,
    }
}

/// The node, as messages name it.
pub fn describe(netns: Option<&str>) -> String {
    match netns {
        Some(ns) => format!("network namespace {ns}"),
        None => "this host".into(),
    }
}

/// The node's current state: `read` (the planner's read command) run on the node. A
/// table that is not there (`Planner::absent`) reads as nothing.
pub fn read_node(
    planner: &dyn Planner,
    read: Vec<String>,
    netns: Option<&str>,
) -> Result<String, Fail> {
    let argv = on_node(netns, read, None);
    let out = run_captured(&argv)?;
    if out.ok {
        Ok(out.stdout)
    } else if planner
        .absent()
        .is_some_and(|absent| out.stderr.contains(absent))
    {
        Ok(String::new())
    } else if let Some(hint) = planner.explain(&out.stderr) {
        Err(Fail(hint))
    } else {
        Err(Fail(format!(
            "cannot read the node's state (`{}`): {}",
            shell_line(&brief(&argv)),
            first_line(&out.stderr)
        )))
    }
}

/// `argv` for a message: a script argument (several lines) is shown as `…`.
fn brief(argv: &[String]) -> Vec<String> {
    argv.iter()
        .map(|a| match a.contains('\n') {
            true => "…".to_string(),
            false => a.clone(),
        })
        .collect()
}

/// Loads the document at `path` into a new, empty network namespace with the planner's
/// `scratch` command and returns what the kernel reads back; `Err(stderr's first line)`
/// when the kernel refuses it.
pub fn load_scratch(scratch: &[String], path: &Path) -> Result<Result<String, String>, Fail> {
    let mut argv = scratch.to_vec();
    argv.push(path.display().to_string());
    let out = run_captured(&argv)?;
    Ok(match out.ok {
        true => Ok(out.stdout),
        false => Err(first_line(&out.stderr)),
    })
}
