//! Structure-aware: bytes → a generated cluster (Nodes, KubeProxyConfiguration,
//! ClusterConfig, Services of every type and policy, EndpointSlices, Pods; see
//! `tests/manifests.rs`) → compiled and rendered by every target in `TARGETS`, for every
//! node and family: no panic, and deterministic (the documents in reverse order give
//! byte-identical output). The output's own checkers (`iptables-restore --test`, `nft -c`,
//! ...) run on the same generator in the `checkers` property test.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc_compile_fuzz::manifests::{cluster, Draw};
use svc_compile_fuzz::{compile_docs, render_all_targets};

fuzz_target!(|data: &[u8]| {
    let text = cluster(&mut Draw::new(data));
    let docs: Vec<&str> = text.split("---\n").filter(|d| !d.is_empty()).collect();
    let (_, comp) = compile_docs(&docs);
    let out = render_all_targets(&comp);
    let reversed: Vec<&str> = docs.iter().rev().copied().collect();
    let (_, again) = compile_docs(&reversed);
    assert_eq!(
        comp.diags.items.len(),
        again.diags.items.len(),
        "diagnostics depend on document order:\n{text}"
    );
    let out2 = render_all_targets(&again);
    assert_eq!(out.len(), out2.len(), "outputs depend on document order:\n{text}");
    for ((what, a), (_, b)) in out.iter().zip(&out2) {
        assert!(a == b, "{what} depends on document order:\n{text}");
    }
});
