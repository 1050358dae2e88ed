//! What the user reads: diagnostics (text, JSON, SARIF) and the one line of a failure.

use crate::cli::{Command, Format};
use std::io::{IsTerminal, Write};
use svc_compiler::diag::{self, Severity};
use svc_compiler::source::SourceMap;

/// A tool failure (exit 2): one line that says what to do.
pub(crate) use svc_node::Fail;

/// The exit code of a command's result, with a failure printed.
pub(crate) fn exit_code(r: Result<u8, Fail>) -> u8 {
    match r {
        Ok(code) => code,
        Err(Fail(msg)) => {
            eprintln!("svc-compile: {msg}");
            2
        }
    }
}

/// Prints `diags`; `check` ends a run without errors with `ok: {checked} file(s) checked`.
pub(crate) fn print_diagnostics(
    cmd: &Command,
    diags: &diag::Diagnostics,
    sources: &SourceMap,
    checked: usize,
) {
    match cmd.format {
        Format::Json | Format::Sarif => {
            let items: Vec<_> = diags
                .items
                .iter()
                .map(|d| diag::to_json(d, sources))
                .collect();
            let value = if cmd.format == Format::Sarif {
                sarif(&items)
            } else {
                serde_json::to_value(&items).expect("diagnostics serialise")
            };
            let text = serde_json::to_string_pretty(&value).expect("diagnostics serialise");
            // `check --format json` is the product: stdout. Otherwise stderr.
            if cmd.check {
                let _ = writeln!(std::io::stdout(), "{text}");
            } else {
                eprintln!("{text}");
            }
        }
        Format::Text => {
            let text = diag::render_all(diags, sources);
            // Where the text goes decides `--color auto`.
            let terminal = if cmd.check {
                std::io::stdout().is_terminal()
            } else {
                std::io::stderr().is_terminal()
            };
            let text = if colour(cmd.color, terminal) {
                diag::colorize(&text)
            } else {
                text
            };
            if cmd.check {
                let _ = write!(std::io::stdout(), "{text}");
                if !diags.has_errors() {
                    let _ = writeln!(
                        std::io::stdout(),
                        "ok: {} file(s) checked, {} warning(s)",
                        checked,
                        diags.count(Severity::Warning)
                    );
                }
            } else {
                eprint!("{text}");
            }
        }
    }
}

/// Whether to colour: `--color always|never` decide; `auto` colours a terminal unless
/// `NO_COLOR` is set to anything but the empty string (https://no-color.org).
fn colour(flag: Option<bool>, terminal: bool) -> bool {
    flag.unwrap_or_else(|| terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()))
}

/// SARIF 2.1.0, for code-scanning tools in CI.
fn sarif(items: &[diag::JsonDiagnostic]) -> serde_json::Value {
    use serde_json::json;
    let mut rules: Vec<&str> = items.iter().map(|d| d.code).collect();
    rules.sort_unstable();
    rules.dedup();
    let results: Vec<_> = items
        .iter()
        .map(|d| {
            let level = match d.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
                Severity::Note => "note",
            };
            let text = match d.hint {
                Some(h) => format!("{} (help: {h})", d.message),
                None => d.message.to_string(),
            };
            let locations: Vec<_> = d
                .file
                .map(|f| {
                    json!({"physicalLocation": {
                        "artifactLocation": {"uri": f},
                        "region": {"startLine": d.line, "startColumn": d.column}
                    }})
                })
                .into_iter()
                .collect();
            json!({"ruleId": d.code, "level": level, "message": {"text": text}, "locations": locations})
        })
        .collect();
    json!({
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{
            "tool": {"driver": {
                "name": "svc-compile",
                "version": env!("CARGO_PKG_VERSION"),
                "rules": rules.iter().map(|r| json!({"id": r})).collect::<Vec<_>>()
            }},
            "results": results
        }]
    })
}
