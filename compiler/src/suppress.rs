//! Suppressions: a diagnostic the project chose not to see is taken out before anything
//! is printed, and counted ([`Diagnostics::suppressed`]).
//!
//! - In a manifest, a comment `# svc-compile:ignore SVCnnn[,SVCmmm] [why]` suppresses those
//!   codes on its own line; a comment alone on its line suppresses them on the next line
//!   too (the line below it). A diagnostic is on the line of its location.
//! - The config file's `ignore` suppresses codes everywhere, its `per-path-ignores` in
//!   the files a glob matches ([`crate::project`]).
//!
//! A suppression that took nothing out is itself a warning, SVC022, where it is written:
//! a stale one would otherwise hide the next real finding. Listing SVC022 in `ignore`
//! silences those warnings.

use crate::decode::Sp;
use crate::diag::{Diagnostic, Diagnostics};
use crate::project::PathIgnore;
use crate::source::{FileId, SourceMap, Span};

/// The comment's keyword.
pub const DIRECTIVE: &str = "svc-compile:ignore";

/// The code of a suppression that matched nothing.
pub const UNUSED: &str = "SVC022";

/// What suppresses what in one run.
pub struct Rules<'a> {
    /// The config file's `ignore`.
    pub ignore: &'a [Sp<String>],
    /// The config file's `per-path-ignores`.
    pub per_path: &'a [PathIgnore],
    /// Whether a file's name is matched by a `per-path-ignores` glob (the CLI's globs,
    /// relative to the config file's directory).
    pub path_matches: &'a dyn Fn(FileId, &str) -> bool,
    /// The files whose `# svc-compile:ignore` comments count: the manifests read.
    pub files: &'a [FileId],
    /// Whether a code exists.
    pub known: &'a dyn Fn(&str) -> bool,
}

/// One code of one `# svc-compile:ignore` comment.
struct Inline {
    file: FileId,
    /// The lines it covers: its own, and the next when the comment is alone on its line.
    lines: (u32, u32),
    code: Sp<String>,
    used: bool,
}

/// Take the suppressed diagnostics out of `diags` (counting them), then add an SVC022
/// warning for each suppression that took nothing out, and for comments that name no
/// code or a code that does not exist. True when it added any: `diags` is to be sorted
/// again.
pub fn apply(diags: &mut Diagnostics, sources: &SourceMap, rules: &Rules) -> bool {
    let mut warnings: Vec<Diagnostic> = Vec::new();
    let mut inline: Vec<Inline> = Vec::new();
    for &f in rules.files {
        comments(sources, f, rules.known, &mut inline, &mut warnings);
    }
    let mut global = vec![false; rules.ignore.len()];
    let mut per_path: Vec<Vec<bool>> = rules
        .per_path
        .iter()
        .map(|p| vec![false; p.codes.len()])
        .collect();
    let before = diags.items.len();
    diags.items.retain(|d| {
        let mut hit = false;
        if let Some(s) = d.span {
            for i in inline.iter_mut().filter(|i| {
                i.file == s.file
                    && (i.lines.0 == s.line || i.lines.1 == s.line)
                    && i.code.v == d.code
            }) {
                i.used = true;
                hit = true;
            }
            for (p, used) in rules.per_path.iter().zip(&mut per_path) {
                for (c, u) in p.codes.iter().zip(used.iter_mut()) {
                    if c.v == d.code && (rules.path_matches)(s.file, &p.glob.v) {
                        *u = true;
                        hit = true;
                    }
                }
            }
        }
        for (c, u) in rules.ignore.iter().zip(&mut global) {
            if c.v == d.code {
                *u = true;
                hit = true;
            }
        }
        !hit
    });
    diags.suppressed += before - diags.items.len();

    let unused = |code: &Sp<String>, what: &str| {
        Diagnostic::warning(UNUSED, format!("{what} `{}` matched nothing", code.v))
            .at(code.span)
            .hint("remove it: nothing here has that code any more (or it never had)")
    };
    for i in inline.iter().filter(|i| !i.used) {
        warnings.push(unused(&i.code, "`# svc-compile:ignore`"));
    }
    for (p, used) in rules.per_path.iter().zip(&per_path) {
        for (c, _) in p.codes.iter().zip(used).filter(|(_, u)| !**u) {
            warnings.push(unused(c, &format!("`per-path-ignores` \"{}\":", p.glob.v)));
        }
    }
    // An ignored SVC022 is what silences these warnings: it is never unused itself.
    let quiet = rules.ignore.iter().any(|c| c.v == UNUSED);
    for (c, _) in rules.ignore.iter().zip(&global).filter(|(_, u)| !**u) {
        if c.v != UNUSED {
            warnings.push(unused(c, "`ignore`"));
        }
    }
    if quiet {
        diags.suppressed += warnings.len();
        return false;
    }
    let added = !warnings.is_empty();
    for w in warnings {
        diags.push(w);
    }
    added
}

/// The `# svc-compile:ignore` comments of file `f`: each code in `out`, and a warning for
/// a comment without codes or with a code that does not exist.
fn comments(
    sources: &SourceMap,
    f: FileId,
    known: &dyn Fn(&str) -> bool,
    out: &mut Vec<Inline>,
    warnings: &mut Vec<Diagnostic>,
) {
    let text = &sources.file(f).text;
    for (at, _) in text.match_indices(DIRECTIVE) {
        let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
        let before = &text[line_start..at];
        // A comment: `#` at the line's start or after a blank, then only blanks.
        let Some(hash) = before.rfind('#') else {
            continue;
        };
        let starts_comment = hash == 0 || before[..hash].ends_with([' ', '\t']);
        if !starts_comment || !before[hash + 1..].trim().is_empty() {
            continue;
        }
        let line = text[..at].matches('\n').count() as u32 + 1;
        let col = |byte: usize| text[line_start..byte].chars().count() as u32 + 1;
        let alone = before[..hash].trim().is_empty();
        let lines = (line, if alone { line + 1 } else { line });
        let after = at + DIRECTIVE.len();
        let rest = &text[after..];
        let rest = &rest[..rest.find('\n').unwrap_or(rest.len())];
        let rest = rest.strip_suffix('\r').unwrap_or(rest);
        let codes = codes_of(rest);
        if codes.is_empty() {
            warnings.push(
                Diagnostic::warning(UNUSED, "`# svc-compile:ignore` names no code")
                    .at(Span::new(
                        f,
                        line,
                        col(at),
                        DIRECTIVE.chars().count() as u32,
                    ))
                    .hint("name the codes it suppresses: `# svc-compile:ignore SVC110`"),
            );
        }
        for (offset, code) in codes {
            let span = Span::new(f, line, col(after + offset), code.chars().count() as u32);
            if known(code) {
                out.push(Inline {
                    file: f,
                    lines,
                    code: Sp::new(code.to_string(), span),
                    used: false,
                });
            } else {
                warnings.push(
                    Diagnostic::warning(
                        UNUSED,
                        format!("`# svc-compile:ignore`: `{code}` is not a diagnostic code"),
                    )
                    .at(span)
                    .hint("codes are written SVCnnn; docs/diagnostics.md lists them"),
                );
            }
        }
    }
}

/// The codes after the keyword, with their byte offsets: a list separated by commas (with
/// or without blanks after them), starting after blanks; the first word not part of it
/// starts the reason.
fn codes_of(rest: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let bytes = rest.as_bytes();
    let mut i = 0;
    if !rest.starts_with([' ', '\t']) {
        return out;
    }
    loop {
        while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
            i += 1;
        }
        let start = i;
        while i < bytes.len() && !matches!(bytes[i], b' ' | b'\t' | b',') {
            i += 1;
        }
        if start == i {
            break;
        }
        out.push((start, &rest[start..i]));
        if i < bytes.len() && bytes[i] == b',' {
            i += 1;
            continue;
        }
        // A code ends the list unless a comma follows it (blanks before the comma are fine).
        let mut j = i;
        while j < bytes.len() && (bytes[j] == b' ' || bytes[j] == b'\t') {
            j += 1;
        }
        if j < bytes.len() && bytes[j] == b',' {
            i = j + 1;
            continue;
        }
        break;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_ends_at_the_first_word_without_a_comma() {
        let offsets = |s: &str| -> Vec<(usize, String)> {
            codes_of(s)
                .into_iter()
                .map(|(o, c)| (o, c.to_string()))
                .collect()
        };
        assert_eq!(offsets(" SVC110"), [(1, "SVC110".to_string())]);
        assert_eq!(
            offsets(" SVC110,SVC116 because"),
            [(1, "SVC110".to_string()), (8, "SVC116".to_string())]
        );
        assert_eq!(
            offsets(" SVC110, SVC116 , SVC003 why"),
            [
                (1, "SVC110".to_string()),
                (9, "SVC116".to_string()),
                (18, "SVC003".to_string())
            ]
        );
        assert_eq!(offsets(""), []);
        assert_eq!(offsets("SVC110"), []);
    }

    fn run(text: &str, diags: Vec<Diagnostic>, ignore: &[&str]) -> (Vec<String>, usize) {
        let mut sources = SourceMap::default();
        let f = sources.add("a.yaml", text.to_string());
        let mut d = Diagnostics::default();
        for x in diags {
            d.push(x);
        }
        let ignore: Vec<Sp<String>> = ignore
            .iter()
            .map(|c| Sp::new(c.to_string(), Span::new(FileId(9), 1, 1, 6)))
            .collect();
        let known = |c: &str| crate::codes::find(c).is_some();
        let _ = apply(
            &mut d,
            &sources,
            &Rules {
                ignore: &ignore,
                per_path: &[],
                path_matches: &|_, _| false,
                files: &[f],
                known: &known,
            },
        );
        let shown = d
            .items
            .iter()
            .map(|d| {
                let s = d.span.unwrap();
                format!("{}@{}:{}", d.code, s.line, s.col)
            })
            .collect();
        (shown, d.suppressed)
    }

    #[test]
    fn comments_cover_their_line_or_the_next() {
        let text = "a: 1 # svc-compile:ignore SVC110\n# svc-compile:ignore SVC116 checked by hand\nb: 2\nc: 3 # not svc-compile:ignore SVC004\nd: \"# svc-compile:ignore SVC004\"\n";
        let at = |line, code| Diagnostic::error(code, "x").at(Span::new(FileId(0), line, 1, 1));
        let (shown, n) = run(
            text,
            vec![
                at(1, "SVC110"),
                at(2, "SVC110"),
                at(3, "SVC116"),
                at(4, "SVC004"),
                at(5, "SVC004"),
            ],
            &[],
        );
        // Line 2's SVC110 is not covered (a trailing comment covers its own line only);
        // line 4's comment does not start with the keyword; line 5's `#` is in a string.
        assert_eq!(shown, ["SVC110@2:1", "SVC004@4:1", "SVC004@5:1"]);
        assert_eq!(n, 2);
    }

    #[test]
    fn unused_and_unknown_codes_are_warnings_where_written() {
        let text = "a: 1 # svc-compile:ignore SVC110,SVC999\nb: 2 # svc-compile:ignore\n";
        let (shown, n) = run(text, vec![], &["SVC008"]);
        assert_eq!(
            shown,
            ["SVC022@1:34", "SVC022@2:8", "SVC022@1:27", "SVC022@1:1"],
        );
        assert_eq!(n, 0);
        // An ignored SVC022 silences them (counted as suppressed), and is not unused.
        let (shown, n) = run(text, vec![], &["SVC008", "SVC022"]);
        assert_eq!(shown, Vec::<String>::new());
        assert_eq!(n, 4);
    }
}
