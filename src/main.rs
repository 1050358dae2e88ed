//! The `svc-compile` command line: flags, file I/O, rendering diagnostics, exit codes.
//! All compiling happens in `svc_compiler`; all rendering in `svc_targets`.

mod alloc;
mod cli;
mod compile;
mod diff;
mod inputs;
mod node;
mod report;
mod run;
mod trace;

use std::process::ExitCode;

// Parsing builds millions of small values and the node passes make and drop many on
// every thread: mimalloc's thread-local free lists are much faster at that than glibc's
// (README "Performance"). `alloc.rs` sets when it gives memory back.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    alloc::purge_at_once();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match cli::parse(&args) {
        Ok(cli::Parsed::Print(text)) => {
            // A closed pipe (`| head`) is not an error.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
            0
        }
        Ok(cli::Parsed::Run(cmd)) if cmd.apply.is_some() => node::apply(&cmd),
        Ok(cli::Parsed::Run(cmd)) if cmd.drift.is_some() => node::drift(&cmd),
        Ok(cli::Parsed::Run(cmd)) => run::run(*cmd),
        Ok(cli::Parsed::Gen(cmd)) => run::gen(cmd),
        Ok(cli::Parsed::Diff(flags)) => diff::run(&flags),
        Ok(cli::Parsed::Trace(cmd, flags)) => trace::run(&cmd, flags),
        Err(e) => {
            eprintln!("svc-compile: {e}");
            eprintln!("svc-compile: run `svc-compile --help` for usage");
            2
        }
    };
    ExitCode::from(code)
}
