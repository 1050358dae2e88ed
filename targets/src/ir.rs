//! The `ir` target: the resolved IR as stable JSON.

use crate::{Render, Target};
use svc_compiler::ir::{Module, NodeView};

/// `--target ir`.
pub const TARGET: Target = Target {
    name: "ir",
    about: "the resolved IR as JSON (with --node: plus that node's view)",
    ext: "json",
    render: Render::Cluster(|module, views, _| {
        Ok(vec![crate::File {
            name: "ir.json".into(),
            text: write_string(module, views),
        }])
    }),
    flags: &[],
    planner: None,
    trace: None,
    deprecated: None,
};

/// `--target ir`: the module, and the per-node views when a node was selected.
pub fn write_string(module: &Module, views: &[NodeView]) -> String {
    #[derive(serde::Serialize)]
    struct Out<'a> {
        #[serde(rename = "irVersion")]
        ir_version: u32,
        module: &'a Module,
        #[serde(rename = "nodeViews", skip_serializing_if = "<[_]>::is_empty")]
        node_views: &'a [NodeView],
    }
    let mut s = serde_json::to_string_pretty(&Out {
        ir_version: 1,
        module,
        node_views: views,
    })
    .expect("IR serialises");
    s.push('\n');
    s
}
