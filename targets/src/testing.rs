//! Test helpers shared by the discovery targets' unit tests.

use svc_compiler::ir::Module;
use svc_compiler::source::SourceMap;

/// Compiles manifests (with allocation) and fails the test on any error diagnostic.
pub fn module(yaml: &str) -> Module {
    let mut sources = SourceMap::default();
    let f = sources.add("t.yaml", yaml);
    let c = svc_compiler::compile(
        &sources,
        &[f],
        &svc_compiler::Options {
            allocate: true,
            ..Default::default()
        },
    );
    assert!(!c.diags.has_errors(), "{:?}", c.diags.items);
    c.module
}
