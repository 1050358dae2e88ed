//! What the user reads, printed in one place for every command: diagnostics (text,
//! colour, JSON, SARIF, GitHub workflow commands, JUnit), a command's product on stdout or
//! in `-o FILE`, the one line of a failure; and the exit code a command's end maps to.
//!
//! Which diagnostics are shown is decided here too: `--min-severity` leaves out the
//! lower ones in every format; without it (or `--verbose`), notes are one summary line
//! per code in text and left out of the other formats.

use crate::cli::{CompileOpts, Format};
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use svc_compiler::codes::Code;
use svc_compiler::diag::{self, Diagnostic, Diagnostics, Notes, Severity};
use svc_compiler::source::{FileId, SourceMap, Span};

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

/// A command's product into `-o FILE` when given, else on stdout.
pub(crate) fn output(path: Option<&str>, text: &str) -> Result<(), Fail> {
    match path {
        Some(p) => std::fs::write(p, text).map_err(|e| Fail(format!("cannot write {p}: {e}"))),
        None => print(text),
    }
}

/// Where and how diagnostics are printed: `--format`, `--color`, `--min-severity`,
/// `--verbose`, and stdout for `check` (the diagnostics are its product), else stderr.
pub(crate) struct Emitter {
    format: Format,
    color: Option<bool>,
    stdout: bool,
    /// `check -o FILE`: the report collected here, written by [`Emitter::finish`].
    file: Option<(String, std::cell::RefCell<String>)>,
    /// The least severe diagnostic shown.
    min: Severity,
    /// Text: notes each, or one line per code.
    notes: Notes,
}

impl Emitter {
    /// Diagnostics on stderr, beside a command's product.
    pub fn new(opts: &CompileOpts) -> Emitter {
        let (min, notes) = shown(opts.format, opts.min_severity, opts.verbose);
        Emitter {
            format: opts.format,
            color: opts.color,
            stdout: false,
            file: None,
            min,
            notes,
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
            None => Emitter {
                stdout: true,
                ..Emitter::new(opts)
            },
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

    /// Text on stderr, coloured as `--color` says (`diff`, a config file's errors).
    pub fn text(color: Option<bool>) -> Emitter {
        let (min, notes) = shown(Format::Text, None, false);
        Emitter {
            format: Format::Text,
            color,
            stdout: false,
            file: None,
            min,
            notes,
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
    pub fn diagnostics(&self, diags: &Diagnostics, sources: &SourceMap) {
        self.emit(diags, sources, None);
    }

    /// `check`'s report: its diagnostics (JUnit: a test case per file of `files`, the
    /// manifests read) and, in text, a last line for a run without errors:
    /// `ok: {files} file(s) checked, {n} warning(s)` (standing for the renderer's
    /// summary line, so that warnings are counted once), with `, {s} suppressed` when a
    /// suppression took some out.
    pub fn checked(&self, diags: &Diagnostics, sources: &SourceMap, files: &[FileId]) {
        self.emit(diags, sources, Some(files));
    }

    fn emit(&self, all: &Diagnostics, sources: &SourceMap, files: Option<&[FileId]>) {
        // Only what is shown, copied only when something is left out.
        let filtered;
        let diags = if all.items.iter().any(|d| d.severity > self.min) {
            let mut d = all.clone();
            d.retain_at_least(self.min);
            filtered = d;
            &filtered
        } else {
            all
        };
        match self.format {
            Format::Json => {
                let items: Vec<_> = diags
                    .items
                    .iter()
                    .map(|d| diag::to_json(d, sources))
                    .collect();
                let text = serde_json::to_string_pretty(&items).expect("diagnostics serialise");
                self.write(&(text + "\n"));
            }
            Format::Sarif => {
                let root = std::env::current_dir().ok();
                let value = sarif(diags, sources, root.as_deref());
                let text = serde_json::to_string_pretty(&value).expect("diagnostics serialise");
                self.write(&(text + "\n"));
            }
            Format::Github => self.write(&github(diags, sources)),
            Format::Junit => self.write(&junit(diags, all, sources, files.unwrap_or(&[]))),
            Format::Text => {
                let mut text = diag::render_items(diags, sources, self.notes);
                match files {
                    Some(files) if !diags.has_errors() => {
                        let _ = writeln!(
                            text,
                            "ok: {} file(s) checked, {} warning(s){}",
                            files.len(),
                            diags.count(Severity::Warning),
                            diag::suppressed(diags)
                        );
                    }
                    _ => {
                        if let Some(line) = diag::summary_line(diags) {
                            text += &line;
                            text.push('\n');
                        }
                    }
                }
                self.write_text(&text);
            }
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

    /// A line of its own before diagnostics (`diff`: which revision they are of).
    pub fn line(&self, text: &str) {
        self.write(&format!("svc-compile: {text}\n"));
    }
}

/// The least severe diagnostic shown and how text shows notes: `--min-severity` decides
/// where given; else text shows every diagnostic with notes summarised (each with
/// `--verbose`), and the other formats leave notes out (`--verbose` keeps them).
fn shown(format: Format, min: Option<Severity>, verbose: bool) -> (Severity, Notes) {
    let notes = match verbose || min == Some(Severity::Note) {
        true => Notes::Each,
        false => Notes::Summary,
    };
    let default = match (format, verbose) {
        (Format::Text, _) | (_, true) => Severity::Note,
        _ => Severity::Warning,
    };
    (min.unwrap_or(default), notes)
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
fn github(diags: &Diagnostics, sources: &SourceMap) -> String {
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
            props.push(format!("endColumn={}", end_column(s)));
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

/// The column after a span's last character (SARIF's and GitHub's `endColumn`).
fn end_column(s: Span) -> u32 {
    s.col + s.len.max(1)
}

/// A code's row: the compiler's table or the back ends' ([`svc_targets::CODES`]).
pub(crate) fn code_info(code: &str) -> Option<&'static Code> {
    svc_compiler::codes::find(code).or_else(|| svc_targets::CODES.iter().find(|c| c.code == code))
}

/// Where a code is documented: its heading in docs/diagnostics.md, at the released
/// version's tag of the repository (Cargo.toml's `repository`).
pub(crate) fn help_uri(code: &str) -> String {
    format!(
        "{}/blob/v{}/docs/diagnostics.md#{}",
        env!("CARGO_PKG_REPOSITORY"),
        env!("CARGO_PKG_VERSION"),
        code.to_ascii_lowercase()
    )
}

fn level(s: Severity) -> &'static str {
    match s {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Note => "note",
    }
}

/// SARIF 2.1.0 as GitHub code scanning reads it: a rule per code shown (its table's
/// description, where it is documented, its default level), a result per diagnostic
/// with its region (start and end; columns count characters) and related locations;
/// paths relative to `%SRCROOT%`, the working directory (`root`). Code scanning refuses
/// a whole file for one result without a location, so a diagnostic about the whole run
/// (SVC401: no such node) is placed at the first input's first line, and says so.
fn sarif(diags: &Diagnostics, sources: &SourceMap, root: Option<&Path>) -> serde_json::Value {
    use serde_json::json;
    let mut codes: Vec<&str> = diags.items.iter().map(|d| d.code).collect();
    codes.sort_unstable();
    codes.dedup();
    let rules: Vec<_> = codes.iter().map(|c| rule(c)).collect();
    let location = |span: Span| {
        json!({
            "artifactLocation": artifact(sources.name(span.file), root),
            "region": {
                "startLine": span.line,
                "startColumn": span.col,
                "endLine": span.line,
                "endColumn": end_column(span),
            }
        })
    };
    let first_input = (!sources.files.is_empty()).then(|| Span::new(FileId(0), 1, 1, 1));
    let results: Vec<_> = diags
        .items
        .iter()
        .map(|d| {
            let mut text = d.message.clone();
            if d.span.is_none() && first_input.is_some() {
                text += " (about the whole input, not this line)";
            }
            let extra: Vec<String> = [
                d.path.as_ref().map(|p| format!("field: {p}")),
                d.hint.as_ref().map(|h| format!("help: {h}")),
            ]
            .into_iter()
            .flatten()
            .collect();
            if !extra.is_empty() {
                text += &format!(" ({})", extra.join("; "));
            }
            let mut r = json!({
                "ruleId": d.code,
                "ruleIndex": codes.binary_search(&d.code).expect("a rule per code"),
                "level": level(d.severity),
                "message": {"text": text},
                "locations": d.span.or(first_input).map(|s| json!({"physicalLocation": location(s)})).into_iter().collect::<Vec<_>>(),
            });
            if !d.related.is_empty() {
                r["relatedLocations"] = d
                    .related
                    .iter()
                    .enumerate()
                    .map(|(i, rel)| {
                        json!({
                            "id": i + 1,
                            "physicalLocation": location(rel.span),
                            "message": {"text": rel.message},
                        })
                    })
                    .collect();
            }
            r
        })
        .collect();
    let mut run = json!({
        "tool": {"driver": {
            "name": "svc-compile",
            "version": env!("CARGO_PKG_VERSION"),
            "semanticVersion": env!("CARGO_PKG_VERSION"),
            "informationUri": env!("CARGO_PKG_REPOSITORY"),
            "rules": rules,
        }},
        "columnKind": "unicodeCodePoints",
        "results": results,
    });
    if let Some(root) = root {
        run["originalUriBaseIds"] = json!({SRCROOT: {"uri": dir_uri(root)}});
    }
    json!({
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [run]
    })
}

/// The base the artifacts' relative URIs are relative to: the working directory.
const SRCROOT: &str = "%SRCROOT%";

/// A code's reporting descriptor, from its table's row.
fn rule(code: &str) -> serde_json::Value {
    use serde_json::json;
    let info = code_info(code);
    let summary = info.map_or(code, |c| c.summary);
    let plain = summary.replace('`', "");
    let severity = info.map_or(Severity::Error, |c| c.severity);
    let uri = help_uri(code);
    let more = format!(
        "Reported as {} by default. Suppress it on one line with `# svc-compile:ignore {code}` \
         (on the line, or alone on the line above), or for files or the whole project in \
         .svc-compile.yaml (`per-path-ignores`, `ignore`).",
        level(severity)
    );
    json!({
        "id": code,
        "name": code,
        "shortDescription": {"text": plain},
        "fullDescription": {"text": format!("{plain}. {}", more.replace('`', "")), "markdown": format!("{summary}. {more}")},
        "helpUri": uri,
        "help": {
            "text": format!("{plain}. {} See {uri}", more.replace('`', "")),
            "markdown": format!("{summary}. {more} See [{code}]({uri})."),
        },
        "defaultConfiguration": {"level": level(severity)},
    })
}

/// An artifact's location: relative to [`SRCROOT`] when the file is under the working
/// directory, else an absolute `file:` URI; every other byte percent-encoded.
fn artifact(name: &str, root: Option<&Path>) -> serde_json::Value {
    use serde_json::json;
    let path = Path::new(name);
    let relative = |p: &Path| -> Option<String> {
        let parts: Vec<String> = p
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .map(|c| match c {
                std::path::Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect::<Option<_>>()?;
        (!parts.is_empty()).then(|| parts.join("/"))
    };
    let under_root = match (path.is_absolute(), root) {
        (true, Some(r)) => path.strip_prefix(r).ok().and_then(relative),
        (false, _) => relative(path),
        _ => None,
    };
    match under_root {
        Some(rel) => json!({"uri": encode(&rel), "uriBaseId": SRCROOT}),
        None => {
            let abs: PathBuf = match root {
                Some(r) if !path.is_absolute() => r.join(path),
                _ => path.to_path_buf(),
            };
            match abs.is_absolute() {
                true => json!({"uri": format!("file://{}", encode(&abs.to_string_lossy()))}),
                // `<stdin>`: a name, not a path.
                false => json!({"uri": encode(name)}),
            }
        }
    }
}

/// `file:///dir/` for the working directory, as `originalUriBaseIds` wants it (with the
/// trailing slash).
fn dir_uri(dir: &Path) -> String {
    let s = dir.to_string_lossy();
    let s = s.strip_suffix('/').unwrap_or(&s);
    format!("file://{}/", encode(s))
}

/// Percent-encoding of a path for a URI: unreserved characters, `/` and the sub-delims
/// a path may hold stay; every other byte is `%XX`.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(b as char)
            }
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b':'
            | b'@' => out.push(b as char),
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// JUnit XML as kubeconform and conftest write it for CI test reports: one test case per
/// file read (`files`), failed by its errors (one `<failure>`, every error in its text),
/// its warnings (and notes, when shown) in `<system-out>`, as kubeconform fails only what
/// is invalid; a kustomize patch or Helm template that was not read (SVC017, SVC024, found
/// in `all`) is skipped;
/// diagnostics without a file are a test case of their own, `svc-compile`.
fn junit(diags: &Diagnostics, all: &Diagnostics, sources: &SourceMap, files: &[FileId]) -> String {
    struct Case<'a> {
        name: String,
        errors: Vec<&'a Diagnostic>,
        others: Vec<&'a Diagnostic>,
        skipped: Option<&'a str>,
    }
    let case = |name: String| Case {
        name,
        errors: Vec::new(),
        others: Vec::new(),
        skipped: None,
    };
    let mut cases: Vec<(Option<FileId>, Case)> = files
        .iter()
        .map(|&f| (Some(f), case(sources.name(f).to_string())))
        .collect();
    for d in all
        .items
        .iter()
        .filter(|d| matches!(d.code, "SVC017" | "SVC024"))
    {
        if let Some(s) = d.span {
            let mut c = case(sources.name(s.file).to_string());
            c.skipped = Some(&d.message);
            cases.push((Some(s.file), c));
        }
    }
    for d in &diags.items {
        let file = d.span.map(|s| s.file);
        let at = match cases.iter().position(|(f, _)| *f == file) {
            Some(i) => i,
            None => {
                let name = match file {
                    Some(f) => sources.name(f).to_string(),
                    None => "svc-compile".to_string(),
                };
                cases.push((file, case(name)));
                cases.len() - 1
            }
        };
        let c = &mut cases[at].1;
        match d.severity {
            Severity::Error => c.errors.push(d),
            _ if c.skipped.is_some() => {}
            _ => c.others.push(d),
        }
    }
    cases.sort_by(|a, b| a.1.name.cmp(&b.1.name));
    let line = |d: &Diagnostic| {
        let mut l = format!("{}[{}]: {}", level(d.severity), d.code, d.message);
        if let Some(s) = d.span {
            l = format!("{}: {l}", sources.location(s));
        }
        if let Some(p) = &d.path {
            let _ = write!(l, " (field: {p})");
        }
        if let Some(h) = &d.hint {
            let _ = write!(l, " (help: {h})");
        }
        l
    };
    let tests = cases.len();
    let failures = cases.iter().filter(|(_, c)| !c.errors.is_empty()).count();
    let skipped = cases.iter().filter(|(_, c)| c.skipped.is_some()).count();
    let counts =
        format!("tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\"");
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(out, "<testsuites name=\"svc-compile\" {counts}>");
    let _ = writeln!(out, "  <testsuite name=\"svc-compile check\" {counts}>");
    for (_, c) in &cases {
        let _ = write!(
            out,
            "    <testcase name=\"{}\" classname=\"svc-compile\"",
            xml(&c.name, true)
        );
        if c.errors.is_empty() && c.others.is_empty() && c.skipped.is_none() {
            out += "/>\n";
            continue;
        }
        out += ">\n";
        if let Some(why) = c.skipped {
            let _ = writeln!(out, "      <skipped message=\"{}\"/>", xml(why, true));
        }
        if let Some(first) = c.errors.first() {
            let text: Vec<String> = c.errors.iter().map(|d| line(d)).collect();
            let _ = writeln!(
                out,
                "      <failure message=\"{}\" type=\"{}\">{}</failure>",
                xml(
                    &format!("{} error(s): {}", c.errors.len(), first.message),
                    true
                ),
                first.code,
                xml(&text.join("\n"), false)
            );
        }
        if !c.others.is_empty() {
            let text: Vec<String> = c.others.iter().map(|d| line(d)).collect();
            let _ = writeln!(
                out,
                "      <system-out>{}</system-out>",
                xml(&text.join("\n"), false)
            );
        }
        out += "    </testcase>\n";
    }
    out += "  </testsuite>\n</testsuites>\n";
    out
}

/// Text for XML: `&`, `<`, `>` escaped, and in attributes (`attr`) also quotes and
/// line breaks (which attribute normalisation would turn into blanks); characters XML 1.0
/// cannot hold become U+FFFD.
fn xml(s: &str, attr: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out += "&amp;",
            '<' => out += "&lt;",
            '>' => out += "&gt;",
            '"' if attr => out += "&quot;",
            '\'' if attr => out += "&apos;",
            '\n' if attr => out += "&#10;",
            '\r' => out += "&#13;",
            '\t' if attr => out += "&#9;",
            '\t' | '\n' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_what_it_must() {
        assert_eq!(
            xml("a<b>&\"c'\n\t\u{1}", true),
            "a&lt;b&gt;&amp;&quot;c&apos;&#10;&#9;\u{FFFD}"
        );
        assert_eq!(xml("a<b>&\"c'\n", false), "a&lt;b&gt;&amp;\"c'\n");
    }

    #[test]
    fn artifacts_are_relative_to_the_working_directory() {
        let root = Path::new("/work/repo");
        let uri = |n: &str| artifact(n, Some(root));
        assert_eq!(uri("a/b.yaml")["uri"], "a/b.yaml");
        assert_eq!(uri("./a/b.yaml")["uriBaseId"], SRCROOT);
        assert_eq!(uri("/work/repo/a b.yaml")["uri"], "a%20b.yaml");
        assert_eq!(uri("/elsewhere/x.yaml")["uri"], "file:///elsewhere/x.yaml");
        assert!(uri("/elsewhere/x.yaml").get("uriBaseId").is_none());
        assert_eq!(uri("../x.yaml")["uri"], "file:///work/repo/../x.yaml");
        assert_eq!(uri("<stdin>")["uri"], "%3Cstdin%3E");
        assert_eq!(dir_uri(root), "file:///work/repo/");
    }
}
