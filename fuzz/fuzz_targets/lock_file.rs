//! A lock file (`--lock FILE`) beside a fixed cluster: no panic, valid locations, and the
//! lock written back (`--write-lock`) reads as itself: compiling with it allocates the
//! same and writes the same lock again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc_compile_fuzz::compile_with;
use svc_compiler::passes::allocate::write_lock;

fuzz_target!(|data: &[u8]| {
    let (_, comp) = compile_with(data, true);
    if comp.diags.has_errors() {
        return;
    }
    let written = write_lock(&comp.lock);
    let (_, again) = compile_with(written.as_bytes(), true);
    assert!(!again.diags.has_errors(), "the written lock does not read back:\n{written}");
    assert_eq!(write_lock(&again.lock), written, "the lock is not a fixed point");
});
