//! The `svc-compile` command line: flags, file I/O, rendering diagnostics, exit codes.
//! All compiling happens in `svc_compiler`; all rendering in `svc_targets`.

mod apply;
mod cli;
mod run;

use std::process::ExitCode;

fn main() -> ExitCode {
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
