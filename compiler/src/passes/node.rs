//! Per-node pass: what one node's proxy programs for one family.

use crate::diag::Diagnostic;
use crate::ir::{Module, NodeView};
use crate::net::IpFamily;
use std::net::IpAddr;

/// Which node to compile for: a Node object's name, plus `--node-ip` addresses used when
/// there is no Node manifest (or added to its addresses).
#[derive(Clone, Debug, Default)]
pub struct NodeSelection {
    pub name: String,
    pub ips: Vec<IpAddr>,
}

/// Compute the view of `sel` for `family`. Errors (unknown node without `--node-ip`) are
/// returned as a diagnostic.
pub fn node_view(
    _module: &Module,
    _sel: &NodeSelection,
    _family: IpFamily,
) -> Result<NodeView, Diagnostic> {
    todo!("passes::node")
}
