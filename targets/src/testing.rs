//! What the crate's unit tests share: snapshots of exact output, and the skip rule of the
//! tests that load rulesets into a throwaway network namespace. The IR they render comes
//! from `svc_compiler::testing`.

/// Checks `text` against the snapshot `targets/snapshots/<name>.snap` (review changes with
/// `cargo insta review`). One directory whatever the source layout, so that moving a test
/// never orphans its snapshot.
pub fn snapshot(name: &str, text: &str) {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s.bind(|| insta::assert_snapshot!(name, text));
}

// Kernel tests skip where a namespace cannot be made (not root, a tool missing), unless
// `SVC_KERNEL=require` (set by CI), which turns every skip into a failure. The
// integration tests' `tests/kernel/lab.rs` reads the variable the same way.

/// Skips the kernel test `test` because of `why` (prints `skipped: …`), or panics when
/// `SVC_KERNEL=require`.
pub fn skip(test: &str, why: &str) {
    let value = std::env::var("SVC_KERNEL").ok();
    if required(value.as_deref()) {
        panic!("{test}: {why}, and SVC_KERNEL=require forbids skipping kernel tests");
    }
    println!("skipped: {test}: {why}");
}

/// Unset or empty: skip; `require`: fail. Anything else is a typo, not a quiet default.
fn required(value: Option<&str>) -> bool {
    match value {
        None | Some("") => false,
        Some("require") => true,
        Some(other) => panic!("SVC_KERNEL={other:?}: the only value is `require`"),
    }
}

#[test]
fn svc_kernel_values() {
    assert!(!required(None));
    assert!(!required(Some("")));
    assert!(required(Some("require")));
    assert!(std::panic::catch_unwind(|| required(Some("yes"))).is_err());
}
