//! The `svc-compile` command line: flags, file I/O, rendering diagnostics, exit codes.
//! All compiling happens in `svc_compiler`; all rendering in `svc_targets`.

mod apply;
mod cli;
mod run;

use std::process::ExitCode;

// Parsing builds millions of small values and the node passes make and drop many on
// every thread: mimalloc's thread-local free lists are much faster at that than glibc's
// (10k services as JSON: 0.52 s -> 0.35 s end to end; README "Performance").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay`: its place in `mi_option_e` of the mimalloc sources that
/// libmimalloc-sys 0.1.49 (pinned in Cargo.toml) builds; the crate exports no constant.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed memory goes back to the system at once instead of a second later: parsing frees most
/// of what it built while the passes and the writers allocate theirs, and peak RSS has a
/// budget (10k services, one node: ~330 MB -> ~290 MB, for a few ms).
/// `MIMALLOC_PURGE_DELAY` in the environment still wins.
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: mi_option_set only stores an integer option; any value is valid.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
    }
}

fn main() -> ExitCode {
    tune_allocator();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match cli::parse(&args) {
        Ok(cli::Parsed::Help(text)) => {
            print!("{text}");
            0
        }
        Ok(cli::Parsed::Run(cmd)) => run::run(cmd),
        Ok(cli::Parsed::Gen(cmd)) => run::gen(cmd),
        Err(e) => {
            eprintln!("svc-compile: {e}");
            eprintln!("svc-compile: run `svc-compile --help` for usage");
            2
        }
    };
    ExitCode::from(code)
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
        // This test binary never calls tune_allocator, so the default is still in place.
        assert_eq!(unsafe { mi_option_get(super::MI_OPTION_PURGE_DELAY) }, 1000);
    }
}
