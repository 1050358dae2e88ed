//! Raw bytes → `svc-compile check` (decode, parse, decode objects, validate, allocate):
//! no panic, no hang, bounded memory, and every diagnostic at a valid location.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc_compile_fuzz::check_locations;
use svc_compiler::source::SourceMap;
use svc_compiler::{compile, Options};

fuzz_target!(|data: &[u8]| {
    let mut sources = SourceMap::default();
    let (f, bad) = sources.add_bytes("input.yaml", data.to_vec());
    let opts = Options {
        allocate: true,
        ..Default::default()
    };
    let mut comp = compile(&sources, &[f], &opts);
    comp.diags.items.extend(bad);
    check_locations(&sources, &comp.diags);
});
