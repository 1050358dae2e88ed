//! What the user reads, printed in one place for every command: diagnostics (text,
//! colour, JSON, SARIF), a command's product on stdout, the one line of a failure; and
//! the exit code a command's end maps to.

use crate::cli::{CompileOpts, Format};
use std::io::{IsTerminal, Write};
use svc_compiler::diag::{self, Severity};
use svc_compiler::source::SourceMap;

/// A failure (exit 2): one line that says what to do.
pub(crate) use svc_node::Fail;

/// How a command ended, short of a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Done,
    /// The input has errors (printed).
    InputErrors,
    /// drift and diff: the report shows differences (printed).
    Differs,
}

/// The exit code, decided here for every command: 0 done; 1 input errors, or (where
/// `differences` says 1 means differences: drift, diff) differences; 2 a failure (printed
/// now), and input errors where 1 means differences (a broken input must never read as a
/// reviewable change).
pub(crate) fn exit_code(r: Result<Outcome, Fail>, differences: bool) -> u8 {
    match r {
        Ok(Outcome::Done) => 0,
        Ok(Outcome::Differs) => 1,
        Ok(Outcome::InputErrors) if differences => 2,
        Ok(Outcome::InputErrors) => 1,
        Err(Fail(msg)) => {
            eprintln!("svc-compile: {msg}");
            2
        }
    }
}

/// A command's product on stdout. A closed pipe (`| head`) is not an error.
pub(crate) fn print(text: &str) -> Result<(), Fail> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Fail(format!("cannot write output: {e}")))
        }
        _ => Ok(()),
    }
}

/// Where and how diagnostics are printed: `--format`, `--color`, and stdout for `check`
/// (the diagnostics are its product), else stderr.
pub(crate) struct Emitter {
    format: Format,
    color: Option<bool>,
    stdout: bool,
    /// `check -o FILE`: the report collected here, written by [`Emitter::finish`].
    file: Option<(String, std::cell::RefCell<String>)>,
}

impl Emitter {
    /// Diagnostics on stderr, beside a command's product.
    pub fn new(opts: &CompileOpts) -> Emitter {
        Emitter {
            format: opts.format,
            color: opts.color,
            stdout: false,
            file: None,
        }
    }

    /// The report as the product (`check`), into `path` when given (`-o FILE`: written by
    /// [`Emitter::finish`], never coloured), else on stdout.
    pub fn report(opts: &CompileOpts, path: Option<&str>) -> Emitter {
        match path {
            Some(p) => Emitter {
                color: Some(false),
                file: Some((p.to_string(), Default::default())),
                ..Emitter::new(opts)
            },
            None => Emitter::product(opts),
        }
    }

    /// Writes the report to its file, if it has one.
    pub fn finish(self) -> Result<(), Fail> {
        match self.file {
            Some((path, text)) => std::fs::write(&path, text.into_inner())
                .map_err(|e| Fail(format!("cannot write {path}: {e}"))),
            None => Ok(()),
        }
    }

    /// Diagnostics as the product (`check`): stdout.
    pub fn product(opts: &CompileOpts) -> Emitter {
        Emitter {
            stdout: true,
            ..Emitter::new(opts)
        }
    }

    /// Text on stderr, coloured as `--color` says (`diff`).
    pub fn text(color: Option<bool>) -> Emitter {
        Emitter {
            format: Format::Text,
            color,
            stdout: false,
            file: None,
        }
    }

    fn write(&self, text: &str) {
        if let Some((_, buf)) = &self.file {
            buf.borrow_mut().push_str(text);
        } else if self.stdout {
            let _ = write!(std::io::stdout(), "{text}");
        } else {
            eprint!("{text}");
        }
    }

    /// `diags`, sorted as they are, in the format asked for.
    pub fn diagnostics(&self, diags: &diag::Diagnostics, sources: &SourceMap) {
        match self.format {
            Format::Json | Format::Sarif => {
                let items: Vec<_> = diags
                    .items
                    .iter()
                    .map(|d| diag::to_json(d, sources))
                    .collect();
                let value = if self.format == Format::Sarif {
                    sarif(&items)
                } else {
                    serde_json::to_value(&items).expect("diagnostics serialise")
                };
                let text = serde_json::to_string_pretty(&value).expect("diagnostics serialise");
                self.write(&(text + "\n"));
            }
            Format::Github => self.write(&github(diags, sources)),
            Format::Text => self.write_text(&diag::render_all(diags, sources)),
        }
    }

    /// Rendered diagnostics, coloured where `--color` and the destination say.
    fn write_text(&self, text: &str) {
        // Where the text goes decides `--color auto`.
        let terminal = if self.stdout {
            std::io::stdout().is_terminal()
        } else {
            std::io::stderr().is_terminal()
        };
        if self.file.is_none() && colour(self.color, terminal) {
            self.write(&diag::colorize(text));
        } else {
            self.write(text);
        }
    }

    /// `check`'s diagnostics, and in text a last line for a run without errors:
    /// `ok: {checked} file(s) checked, {n} warning(s)`.
    /// The `ok:` line stands for the renderer's summary line (warnings counted once).
    pub fn checked(&self, diags: &diag::Diagnostics, sources: &SourceMap, checked: usize) {
        if self.format != Format::Text || diags.has_errors() {
            return self.diagnostics(diags, sources);
        }
        let warnings = diags.count(Severity::Warning);
        let mut text = diag::render_items(diags, sources);
        text += &format!("ok: {checked} file(s) checked, {warnings} warning(s)\n");
        self.write_text(&text);
    }

    /// A line of its own before diagnostics (`diff`: which revision they are of).
    pub fn line(&self, text: &str) {
        self.write(&format!("svc-compile: {text}\n"));
    }
}

/// Whether to colour: `--color always|never` decide; `auto` colours a terminal unless
/// `NO_COLOR` is set to anything but the empty string (https://no-color.org).
fn colour(flag: Option<bool>, terminal: bool) -> bool {
    flag.unwrap_or_else(|| terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()))
}

/// GitHub Actions workflow commands, one per diagnostic: `::error file=F,line=L,col=C,
/// endLine=L,endColumn=E,title=SVCnnn::message` (notes as `::notice`), which annotate the
/// lines of a pull request. Data is escaped as the runner reads it (`%`, CR, LF), and
/// properties also `:` and `,`.
fn github(diags: &diag::Diagnostics, sources: &SourceMap) -> String {
    fn data(s: &str) -> String {
        s.replace('%', "%25")
            .replace('\r', "%0D")
            .replace('\n', "%0A")
    }
    fn property(s: &str) -> String {
        data(s).replace(':', "%3A").replace(',', "%2C")
    }
    let mut out = String::new();
    for d in &diags.items {
        let level = match d.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "notice",
        };
        let mut props = Vec::new();
        if let Some(s) = d.span {
            props.push(format!("file={}", property(sources.name(s.file))));
            props.push(format!("line={}", s.line));
            props.push(format!("col={}", s.col));
            props.push(format!("endLine={}", s.line));
            props.push(format!("endColumn={}", s.col + s.len.max(1)));
        }
        props.push(format!("title={}", property(d.code)));
        let message = match &d.hint {
            Some(h) => format!("{}\nhelp: {h}", d.message),
            None => d.message.clone(),
        };
        out += &format!("::{level} {}::{}\n", props.join(","), data(&message));
    }
    out
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
