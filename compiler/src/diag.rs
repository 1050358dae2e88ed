//! Diagnostics: user mistakes are data.
//!
//! Every stage pushes into a [`Diagnostics`] collection and goes on; nothing stops at the
//! first error. [`Diagnostics::sort`] orders them by location, code and message (and drops
//! exact duplicates) so output is deterministic whatever the order of files, documents or
//! passes. The same renderer serves the CLI and the snapshot tests.
//!
//! `source` does not know this module: bytes that are not text come out of it as a
//! [`DecodeError`], which [`SourceMap::add_bytes`], defined here, reports as SVC015.

use crate::source::{DecodeError, FileId, SourceMap, Span};
use serde::Serialize;
use std::fmt::Write;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
    Note,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        }
    }
}

/// A secondary location, e.g. the other definition of a duplicate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Related {
    pub span: Span,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Stable code such as `SVC101`; listed in `codes.rs` and `passes/validate.rs`.
    pub code: &'static str,
    pub message: String,
    pub span: Option<Span>,
    /// The field path inside the object, e.g. `spec.ports[0].nodePort`.
    pub path: Option<String>,
    /// What to do next.
    pub hint: Option<String>,
    pub related: Vec<Related>,
}

impl Diagnostic {
    pub fn new(severity: Severity, code: &'static str, message: impl Into<String>) -> Self {
        Diagnostic {
            severity,
            code,
            message: message.into(),
            span: None,
            path: None,
            hint: None,
            related: Vec::new(),
        }
    }
    pub fn error(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(Severity::Error, code, message)
    }
    pub fn warning(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(Severity::Warning, code, message)
    }
    pub fn note(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(Severity::Note, code, message)
    }
    pub fn at(mut self, span: Span) -> Self {
        self.span = Some(span);
        self
    }
    pub fn at_opt(mut self, span: Option<Span>) -> Self {
        self.span = span.or(self.span);
        self
    }
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
    pub fn related(mut self, span: Span, message: impl Into<String>) -> Self {
        self.related.push(Related {
            span,
            message: message.into(),
        });
        self
    }
}

/// Most diagnostics one collection keeps. Past it, only how many there were of each
/// severity is counted (and [`Diagnostics::sort`] says so in one SVC018 note), so that a
/// million broken documents cost counters, not a million messages.
pub const MAX_DIAGNOSTICS: usize = 100_000;

#[derive(Clone, Debug, Default)]
pub struct Diagnostics {
    pub items: Vec<Diagnostic>,
    /// Diagnostics not kept past [`MAX_DIAGNOSTICS`], by severity (error, warning, note).
    dropped: [usize; 3],
    /// Diagnostics taken out by a suppression ([`crate::suppress`]): counted for the
    /// summary line, never shown.
    pub suppressed: usize,
}

impl Diagnostics {
    pub fn push(&mut self, d: Diagnostic) {
        if self.items.len() < MAX_DIAGNOSTICS {
            self.items.push(d);
        } else {
            self.dropped[d.severity as usize] += 1;
        }
    }
    pub fn extend(&mut self, other: Diagnostics) {
        for (a, b) in self.dropped.iter_mut().zip(other.dropped) {
            *a += b;
        }
        self.suppressed += other.suppressed;
        let room = MAX_DIAGNOSTICS.saturating_sub(self.items.len());
        let mut rest = other.items;
        if rest.len() > room {
            for d in rest.drain(room..) {
                self.dropped[d.severity as usize] += 1;
            }
        }
        self.items.extend(rest);
    }
    pub fn has_errors(&self) -> bool {
        self.count(Severity::Error) > 0
    }
    /// Kept and dropped ones.
    pub fn count(&self, sev: Severity) -> usize {
        self.items.iter().filter(|d| d.severity == sev).count() + self.dropped[sev as usize]
    }
    /// Keep only diagnostics at least as severe as `min` (`--min-severity`); the others
    /// are not counted either.
    pub fn retain_at_least(&mut self, min: Severity) {
        self.items.retain(|d| d.severity <= min);
        for sev in [Severity::Warning, Severity::Note] {
            if sev > min {
                self.dropped[sev as usize] = 0;
            }
        }
    }
    /// Sort by (file name, line, column, code, message) and drop exact duplicates; when
    /// some were not kept, one SVC018 note at the end says how many.
    pub fn sort(&mut self, sources: &SourceMap) {
        let key = |d: &Diagnostic| {
            (
                d.span.map(|s| sources.name(s.file).to_string()),
                d.span.map(|s| (s.line, s.col)),
                d.code,
                d.message.clone(),
            )
        };
        self.items.retain(|d| d.code != DROPPED_CODE);
        self.items.sort_by_cached_key(key);
        self.items.dedup();
        let [e, w, n] = self.dropped;
        if e + w + n > 0 {
            self.items.push(
                Diagnostic::note(
                    DROPPED_CODE,
                    format!(
                        "{} more diagnostic(s) not shown ({e} error(s), {w} warning(s), {n} note(s)): \
                         at most {MAX_DIAGNOSTICS} are kept",
                        e + w + n
                    ),
                )
                .hint("fix the first ones and run again"),
            );
        }
    }
}

/// The note [`Diagnostics::sort`] adds about diagnostics past [`MAX_DIAGNOSTICS`].
const DROPPED_CODE: &str = "SVC018";

/// Render like rustc: `error[SVC101]: message`, `--> file:line:col`, a code frame with a
/// caret under the offending value, the field path and a hint.
pub fn render_text(d: &Diagnostic, sources: &SourceMap) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}[{}]: {}", d.severity.as_str(), d.code, d.message);
    if let Some(span) = d.span {
        frame(&mut out, sources, span, None);
    }
    for r in &d.related {
        frame(&mut out, sources, r.span, Some(&r.message));
    }
    if let Some(p) = &d.path {
        let _ = writeln!(out, "   = field: {p}");
    }
    if let Some(h) = &d.hint {
        let _ = writeln!(out, "   = help: {h}");
    }
    out
}

/// Longest source line a code frame shows whole.
const FRAME_WIDTH: u32 = 120;

fn frame(out: &mut String, sources: &SourceMap, span: Span, label: Option<&str>) {
    let _ = writeln!(out, "  --> {}", sources.location(span));
    if let Some(text) = sources.line_text(span.file, span.line) {
        let gutter = span.line.to_string();
        let pad = " ".repeat(gutter.len());
        // Tabs are shown as spaces (one for one: columns stay), in the shown part only: a
        // line can be as long as the file.
        let chars = text.chars().count() as u32;
        let mut start = span.col.saturating_sub(1).min(chars);
        // A long line (minified JSON) is shown as a window around the column.
        let text = if chars > FRAME_WIDTH {
            let from = start.saturating_sub(FRAME_WIDTH / 3);
            let to = (from + FRAME_WIDTH).min(chars);
            let mut w: String = text
                .chars()
                .skip(from as usize)
                .take((to - from) as usize)
                .collect();
            if to < chars {
                w.push('…');
            }
            if from > 0 {
                w.insert(0, '…');
                start = start - from + 1;
            }
            w
        } else {
            text.to_string()
        };
        let text = text.replace('\t', " ");
        let chars = text.chars().count() as u32;
        let len = span.len.clamp(1, (chars - start).max(1));
        let _ = writeln!(out, "{pad} |");
        let _ = writeln!(out, "{gutter} | {text}");
        let _ = write!(
            out,
            "{pad} | {}{}",
            " ".repeat(start as usize),
            "^".repeat(len as usize)
        );
        match label {
            Some(l) => {
                let _ = writeln!(out, " {l}");
            }
            None => out.push('\n'),
        }
    } else if let Some(l) = label {
        let _ = writeln!(out, "   = note: {l}");
    }
}

/// Render all diagnostics plus a summary line, as the CLI prints them with `--verbose`.
pub fn render_all(diags: &Diagnostics, sources: &SourceMap) -> String {
    render_report(diags, sources, Notes::Each)
}

/// How text shows notes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notes {
    /// Each with its code frame (`--verbose`).
    Each,
    /// One line per code after the errors and warnings ([`note_summary`]): a release
    /// bundle's hundreds of skipped objects are one line.
    Summary,
}

/// The diagnostics ([`render_items`]) and the summary line (when there are errors or
/// warnings), as the CLI prints them.
pub fn render_report(diags: &Diagnostics, sources: &SourceMap, notes: Notes) -> String {
    let mut out = render_items(diags, sources, notes);
    if let Some(line) = summary_line(diags) {
        out += &line;
        out.push('\n');
    }
    out
}

/// `{e} error(s), {w} warning(s)` and, when some were suppressed, `, {s} suppressed`;
/// `None` without errors and warnings.
pub fn summary_line(diags: &Diagnostics) -> Option<String> {
    let (e, w) = (diags.count(Severity::Error), diags.count(Severity::Warning));
    (e + w > 0).then(|| format!("{e} error(s), {w} warning(s){}", suppressed(diags)))
}

/// `, {s} suppressed` when a suppression took some diagnostics out, else nothing.
pub fn suppressed(diags: &Diagnostics) -> String {
    match diags.suppressed {
        0 => String::new(),
        s => format!(", {s} suppressed"),
    }
}

/// Each diagnostic rendered, without [`render_report`]'s summary line; with
/// [`Notes::Summary`], errors and warnings each, then the notes' summary.
pub fn render_items(diags: &Diagnostics, sources: &SourceMap, notes: Notes) -> String {
    let mut out = String::new();
    for d in &diags.items {
        if notes == Notes::Summary && d.severity == Severity::Note {
            continue;
        }
        out.push_str(&render_text(d, sources));
        out.push('\n');
    }
    if notes == Notes::Summary {
        for line in note_summary(diags, sources) {
            out += &line;
            out.push('\n');
        }
    }
    out
}

/// The notes in one line per code, in code order: a note alone as its message and
/// location; several as their count and what the code means (skipped objects, SVC008,
/// counted by kind), and that `--verbose` shows each.
pub fn note_summary(diags: &Diagnostics, sources: &SourceMap) -> Vec<String> {
    let mut by_code: std::collections::BTreeMap<&str, Vec<&Diagnostic>> = Default::default();
    for d in diags.items.iter().filter(|d| d.severity == Severity::Note) {
        by_code.entry(d.code).or_default().push(d);
    }
    by_code
        .into_iter()
        .map(|(code, notes)| match notes[..] {
            [d] => {
                let mut line = format!("note[{code}]: {}", d.message);
                if let Some(s) = d.span {
                    line += &format!(" ({})", sources.location(s));
                }
                if let Some(h) = &d.hint {
                    line += &format!("; help: {h}");
                }
                line
            }
            _ => {
                let what = crate::codes::find(code).map_or("", |c| c.summary);
                let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
                for d in &notes {
                    if let Some(k) = crate::k8s::skipped_kind(d) {
                        *kinds.entry(k).or_default() += 1;
                    }
                }
                let kinds = match kinds.len() {
                    0 => String::new(),
                    _ => {
                        let each: Vec<String> =
                            kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
                        format!(" ({})", each.join(", "))
                    }
                };
                format!(
                    "note[{code}]: {} notes: {what}{kinds}; --verbose shows each",
                    notes.len()
                )
            }
        })
        .collect()
}

/// [`render_all`]'s text with ANSI colours, for a terminal (`--color`): the severity and
/// code, the location arrows, the carets, the field and help lines, the summary. Only
/// ever applied on top of the plain text, so the plain text (snapshots, pipes, files) never
/// changes; source lines in code frames (`N | …`) are left as they are.
pub fn colorize(text: &str) -> String {
    const RESET: &str = "\x1b[0m";
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for line in text.split_inclusive('\n') {
        let (body, nl) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        let header = [
            (Severity::Error, "\x1b[1;31m"),
            (Severity::Warning, "\x1b[1;33m"),
            (Severity::Note, "\x1b[1;36m"),
        ]
        .into_iter()
        .find_map(|(sev, c)| {
            let rest = body.strip_prefix(sev.as_str())?.strip_prefix('[')?;
            let (code, msg) = rest.split_once("]: ")?;
            Some(format!(
                "{c}{}[{code}]{RESET}\x1b[1m: {msg}{RESET}",
                sev.as_str()
            ))
        });
        let trimmed = body.trim_start();
        let colored = if let Some(h) = header {
            h
        } else if let Some(loc) = body.strip_prefix("  --> ") {
            format!("  \x1b[1;34m-->{RESET} {loc}")
        } else if body.starts_with(' ')
            && trimmed.starts_with('|')
            && trimmed[1..].trim_start().starts_with('^')
        {
            // A caret line: `   |     ^^^^ label`.
            let (pad, rest) = body.split_at(body.len() - trimmed.len());
            let after = &rest[1..];
            let spaces = after.len() - after.trim_start().len();
            let (lead, marks) = after.split_at(spaces);
            let carets = marks.len() - marks.trim_start_matches('^').len();
            let (carets, label) = marks.split_at(carets);
            format!("{pad}\x1b[1;34m|{RESET}{lead}\x1b[1;31m{carets}{RESET}{label}")
        } else if let Some(rest) = body.strip_prefix("   = ") {
            match rest.split_once(": ") {
                Some((k, v)) => format!("   \x1b[1;34m= {k}:{RESET} {v}"),
                None => body.to_string(),
            }
        } else if summary_line_shape(body) {
            format!("\x1b[1m{body}{RESET}")
        } else {
            body.to_string()
        };
        out.push_str(&colored);
        out.push_str(nl);
    }
    out
}

/// `{e} error(s), {w} warning(s)` with or without `, {s} suppressed`.
fn summary_line_shape(body: &str) -> bool {
    let body = match body.rsplit_once(", ") {
        Some((head, tail)) if tail.ends_with(" suppressed") => head,
        _ => body,
    };
    body.ends_with(" warning(s)") && body.contains(" error(s), ")
}

/// The JSON form of one diagnostic (`--format json`).
#[derive(Serialize)]
pub struct JsonDiagnostic<'a> {
    pub severity: Severity,
    pub code: &'a str,
    pub message: &'a str,
    pub file: Option<&'a str>,
    pub line: Option<u32>,
    pub column: Option<u32>,
    pub path: Option<&'a str>,
    pub hint: Option<&'a str>,
    pub related: Vec<JsonRelated<'a>>,
}

#[derive(Serialize)]
pub struct JsonRelated<'a> {
    pub file: &'a str,
    pub line: u32,
    pub column: u32,
    pub message: &'a str,
}

pub fn to_json<'a>(d: &'a Diagnostic, sources: &'a SourceMap) -> JsonDiagnostic<'a> {
    JsonDiagnostic {
        severity: d.severity,
        code: d.code,
        message: &d.message,
        file: d.span.map(|s| sources.name(s.file)),
        line: d.span.map(|s| s.line),
        column: d.span.map(|s| s.col),
        path: d.path.as_deref(),
        hint: d.hint.as_deref(),
        related: d
            .related
            .iter()
            .map(|r| JsonRelated {
                file: sources.name(r.span.file),
                line: r.span.line,
                column: r.span.col,
                message: &r.message,
            })
            .collect(),
    }
}

impl SourceMap {
    /// [`SourceMap::add_decoded`], with bytes that are not text as diagnostic SVC015 (the
    /// file is added all the same, for the code frame).
    pub fn add_bytes(
        &mut self,
        name: impl Into<String>,
        bytes: Vec<u8>,
    ) -> (FileId, Option<Diagnostic>) {
        let (id, err) = self.add_decoded(name, bytes);
        (id, err.map(Diagnostic::from))
    }
}

impl From<DecodeError> for Diagnostic {
    fn from(e: DecodeError) -> Diagnostic {
        Diagnostic::error("SVC015", format!("{}: the file was not read", e.what))
            .at(e.span)
            .hint("save the file as UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes that are not text are SVC015, located at the first bad byte; text is no
    /// diagnostic.
    #[test]
    fn undecodable_bytes_are_svc015() {
        let mut m = SourceMap::default();
        let (_, d) = m.add_bytes("ok", b"a: 1\n".to_vec());
        assert!(d.is_none());
        let (f, d) = m.add_bytes("bad", b"a: 1\nbb: x\xFFy\n".to_vec());
        let d = d.expect("invalid UTF-8");
        assert_eq!((d.code, d.span), ("SVC015", Some(Span::new(f, 2, 6, 1))));
        assert_eq!(d.hint.as_deref(), Some("save the file as UTF-8"));
    }

    /// Colour adds escapes and nothing else: without them the text is the plain text; the
    /// source line of a code frame is never coloured, even when it looks like a header.
    #[test]
    fn colour_only_adds_escapes() {
        let mut sources = SourceMap::default();
        let f = sources.add("svc.yaml", "error[SVC999]: not a header\n".to_string());
        let mut diags = Diagnostics::default();
        diags.push(
            Diagnostic::error("SVC116", "bad port")
                .at(Span::new(f, 1, 1, 5))
                .path("spec.ports[0]")
                .hint("use 1-65535"),
        );
        diags.push(Diagnostic::warning("SVC201", "odd"));
        let plain = render_all(&diags, &sources);
        let colored = colorize(&plain);
        assert_ne!(colored, plain);
        let mut stripped = String::new();
        let mut chars = colored.chars();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                for d in chars.by_ref() {
                    if d == 'm' {
                        break;
                    }
                }
            } else {
                stripped.push(c);
            }
        }
        assert_eq!(stripped, plain);
        assert!(
            colored.starts_with("\x1b[1;31merror[SVC116]"),
            "{colored:?}"
        );
        assert!(colored.contains("\x1b[1;33mwarning[SVC201]"), "{colored:?}");
        assert!(colored.contains("\x1b[1;31m^^^^^"), "{colored:?}");
        assert!(
            colored.contains("1 | error[SVC999]: not a header\n"),
            "{colored:?}"
        );
    }

    #[test]
    fn long_lines_are_windowed_around_the_column() {
        let mut sources = SourceMap::default();
        let line = format!(
            "{}\"nodePort\": 40000{}",
            "x".repeat(5000),
            "y".repeat(5000)
        );
        let f = sources.add("min.json", line);
        let d = Diagnostic::error("SVC116", "bad").at(Span::new(FileId(0), 1, 5013, 5));
        let text = render_text(&d, &sources);
        assert!(text.len() < 600, "{text}");
        let lines: Vec<&str> = text.lines().collect();
        let src = lines.iter().find(|l| l.starts_with("1 | ")).unwrap();
        let caret = lines.iter().find(|l| l.contains('^')).unwrap();
        let at = caret.chars().position(|c| c == '^').unwrap();
        let under: String = src.chars().skip(at).take(5).collect();
        assert_eq!(under, "40000", "{text}");
        let _ = f;
    }
}
