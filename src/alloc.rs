//! How mimalloc (the global allocator, `main.rs`) gives memory back to the system.
//!
//! One output (one node): freed memory goes back at once. Parsing frees most of what it
//! built while the passes and the writers allocate theirs, and peak RSS has a budget
//! (10k services as JSON, one node: ~330 MB -> ~290 MB, for a few tens of ms).
//! `--out` with many nodes: mimalloc's default delay. Every node's view is made and
//! dropped on the same threads; giving those pages back each time would fault them in
//! again for the next node (10k services × 100 nodes, nftables: 7–11 s -> 5–6 s).
//! `apply` of nftables: never. It compiles, then plans and loads in the same process; what the compile
//! frees is what planning and recording allocate next, and giving it back only makes the
//! kernel zero those pages again (10k services: 0.3–0.6 s of system time of a ~1.3 s
//! compile, for ~50 MB more peak RSS; apply's budget is 2× compile's peak).
//! `agent`: mimalloc's default delay, so that what a sync freed goes back while the agent
//! waits for the next change instead of staying with a resident process.
//! `MIMALLOC_PURGE_DELAY` in the environment still wins over all of them.

/// `mi_option_purge_delay`: its place in `mi_option_e` of the mimalloc sources that
/// libmimalloc-sys 0.1.49 (pinned in Cargo.toml) builds; the crate exports no constant.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// mimalloc's default purge delay, in milliseconds.
const DEFAULT_DELAY_MS: i64 = 1000;

pub fn purge_at_once() {
    set_delay(0);
}

pub fn purge_later() {
    set_delay(DEFAULT_DELAY_MS);
}

pub fn purge_never() {
    set_delay(-1);
}

fn set_delay(ms: i64) {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: mi_option_set only stores an integer option; any value is valid.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ms as _) }
    }
}

#[cfg(test)]
mod tests {
    use libmimalloc_sys::mi_option_get;

    /// The option numbers around the purge delay still mean what they did: their defaults
    /// (1, 1000, 0) are those of `deprecated_eager_commit_delay`, `purge_delay`,
    /// `use_numa_nodes`. A mimalloc that renumbered them fails here.
    #[test]
    fn purge_delay_is_option_15() {
        // SAFETY: reading options has no preconditions.
        let got = unsafe { [mi_option_get(14), mi_option_get(16)] };
        assert_eq!(got, [1, 0]);
        // No test calls set_delay, so the default is still in place.
        let delay = unsafe { mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert_eq!(delay as i64, super::DEFAULT_DELAY_MS);
    }
}
