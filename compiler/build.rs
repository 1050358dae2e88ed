//! The diagnostic codes as data (`codes::CODES`), made from the tables that document them:
//! the `//! | SVCnnn | severity | meaning |` lines of `src/codes.rs` and
//! `src/passes/validate.rs`. The tables stay the one place a code is described; SARIF's
//! rules, `docs/diagnostics.md` and the check of suppressions read the data made here.

use std::fmt::Write;
use std::path::PathBuf;

const TABLES: &[&str] = &["src/codes.rs", "src/passes/validate.rs"];

fn main() {
    let mut rows: Vec<(String, String, String)> = Vec::new();
    for table in TABLES {
        println!("cargo:rerun-if-changed={table}");
        let text = std::fs::read_to_string(table).unwrap_or_else(|e| panic!("{table}: {e}"));
        for line in text.lines() {
            let Some(row) = line.strip_prefix("//! | SVC") else {
                continue;
            };
            let cells: Vec<&str> = row.split(" | ").map(str::trim).collect();
            let [code, severity, meaning] = cells[..] else {
                panic!("{table}: a code's row has three cells: {line}");
            };
            let meaning = meaning.strip_suffix('|').unwrap_or(meaning).trim_end();
            let severity = match severity {
                "error" => "Error",
                "warning" => "Warning",
                "note" => "Note",
                s => panic!("{table}: severity `{s}` in {line}"),
            };
            rows.push((format!("SVC{code}"), severity.into(), meaning.into()));
        }
    }
    rows.sort();
    if let Some(w) = rows.windows(2).find(|w| w[0].0 == w[1].0) {
        panic!("{} is in the tables twice", w[0].0);
    }
    let mut out =
        String::from("/// Every code of this crate, sorted (made by build.rs from the tables).\n");
    out += "pub static CODES: &[Code] = &[\n";
    for (code, severity, meaning) in &rows {
        let _ = writeln!(
            out,
            "    Code {{ code: {code:?}, severity: Severity::{severity}, summary: {meaning:?} }},"
        );
    }
    out += "];\n";
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(dir.join("codes.rs"), out).expect("OUT_DIR is writable");
}
