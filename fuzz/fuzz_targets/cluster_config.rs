//! A ClusterConfig (or any document) beside a fixed cluster whose services are allocated:
//! no panic, valid locations, and when it compiles, every node view renders through the
//! iptables and nftables back ends.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc_compile_fuzz::{compile_with, render_all_targets};

fuzz_target!(|data: &[u8]| {
    let (_, comp) = compile_with(data, false);
    if !comp.diags.has_errors() {
        render_all_targets(&comp);
    }
});
