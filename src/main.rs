//! The `svc-compile` command line: flags, file I/O, rendering diagnostics, exit codes.
//! All compiling happens in `svc_compiler`; all rendering in `svc_targets`; everything
//! done to a node in `svc_node`.
//!
//! Modules, each importing only those after it (no cycle): `main` → the commands (`run`:
//! check, compile, gen; `node`: apply, agent, cleanup,
//! drift; `trace`; `diff`; `migrate`) → `compile` →
//! `config` → `inputs` → `report` → `cli` (plain data: imports nothing of the crate);
//! `alloc` stands alone.

mod alloc;
mod cli;
mod compile;
mod config;
mod diff;
mod inputs;
mod migrate;
mod node;
mod report;
mod run;
mod trace;

use cli::Run;
use report::{exit_code, Fail};
use std::process::ExitCode;

// Parsing builds millions of small values and the node passes make and drop many on
// every thread: mimalloc's thread-local free lists are much faster at that than glibc's
// (docs/performance.md). `alloc.rs` sets when it gives memory back.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    alloc::purge_at_once();
    let args: Vec<String> = std::env::args().skip(1).collect();
    ExitCode::from(run(&args))
}

/// The one dispatch: the command line to its command, the command's end to the exit code.
fn run(args: &[String]) -> u8 {
    let run = match cli::parse(args) {
        Ok(run) => run,
        // A usage error: one line, exit 2.
        Err(e) => return exit_code(Err(Fail(e)), false),
    };
    // drift, diff and migrate: 1 means differences, so input errors are 2.
    let differences = matches!(run, Run::Drift(_) | Run::Diff(_) | Run::Migrate(_));
    let r = match run {
        Run::Print(text) => report::print(&text).map(|()| report::Outcome::Done),
        Run::Check(cmd) => run::check(cmd),
        Run::Compile(cmd) => run::compile(&cmd),
        Run::Gen(cmd) => run::gen(cmd),
        Run::Apply(cmd) => node::apply(&cmd),
        Run::Agent(cmd) => node::agent(&cmd),
        Run::Cleanup(cmd) => node::cleanup(&cmd),
        Run::Drift(cmd) => node::drift(&cmd),
        Run::Trace(cmd) => trace::run(*cmd),
        Run::Diff(cmd) => diff::run(&cmd),
        Run::Migrate(cmd) => migrate::run(&cmd),
    };
    exit_code(r, differences)
}
