//! Scalars longer than [`MAX_SCALAR_BYTES`] found before any parser copies them (SVC023),
//! so that no input costs more than about its own size in memory. The scan reads lines,
//! not YAML: it answers only where the text's layout alone proves one scalar that long,
//! and otherwise nothing (the parsers then check every scalar they build, after copying
//! it). Two layouts prove it:
//! - on one line, a run with no separator in it (`: `, `- `, `,`, brackets, braces, a
//!   comment), or a quoted scalar from its quote to its closing one, longer than the
//!   limit: one token;
//! - a scalar that starts on a line (after a key's `: ` or an item's `- `: plain, quoted
//!   or a block scalar's `|`/`>`) and the lines after it indented deeper than where that
//!   key or item starts: YAML's block structure makes them all part of it, and their text
//!   without indentation is at most its length.

use super::MAX_SCALAR_BYTES;
use crate::source::{FileId, Span};

/// Where a scalar longer than the limit starts, when the layout proves one (see above).
pub(super) fn scalar(file: FileId, text: &str, line0: u32) -> Option<Span> {
    if text.len() <= MAX_SCALAR_BYTES {
        return None;
    }
    // The scalar being followed over its lines: where it starts, the column its lines
    // must be deeper than, whether a comment line ends it (plain), and its text so far.
    let mut open: Option<(Span, usize, bool, usize)> = None;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let line = line.trim_end_matches(['\n', '\r']);
        let n = line0 + n as u32 + 1;
        let body = line.trim_start_matches(' ');
        let indent = line.len() - body.len();
        if let Some((at, parent, plain, seen)) = &mut open {
            if body.is_empty() {
                continue;
            }
            if indent > *parent && !(*plain && body.starts_with('#')) {
                *seen += body.trim_end().len();
                if *seen > MAX_SCALAR_BYTES {
                    return Some(*at);
                }
                continue;
            }
            open = None;
        }
        if line.len() > MAX_SCALAR_BYTES {
            if let Some(col) = long_run(line) {
                return Some(span(file, n, line, col));
            }
        }
        if let Some((col, plain, seen)) = starts_scalar(line, indent) {
            let at = span(file, n, line, col);
            if seen > MAX_SCALAR_BYTES {
                return Some(at);
            }
            open = Some((at, indent_of_node(line, indent), plain, seen));
        }
    }
    None
}

fn span(file: FileId, line: u32, text: &str, byte: usize) -> Span {
    Span::new(file, line, text[..byte].chars().count() as u32 + 1, 1)
}

/// The column (byte) where the line's node starts, after its items' `- `.
fn indent_of_node(line: &str, indent: usize) -> usize {
    let b = line.as_bytes();
    let mut i = indent;
    while b.get(i) == Some(&b'-') && matches!(b.get(i + 1), None | Some(b' ')) {
        i += 1;
        while b.get(i) == Some(&b' ') {
            i += 1;
        }
    }
    i
}

/// A scalar that starts on this line and may go on over the next ones: its byte column,
/// whether it is plain (a comment line ends it), and the length of its text on this line.
/// `None`: the line starts no such scalar (a key whose value is on the next lines, a flow
/// collection, an alias, a comment, a document marker).
fn starts_scalar(line: &str, indent: usize) -> Option<(usize, bool, usize)> {
    let b = line.as_bytes();
    if matches!(b.get(indent), None | Some(b'#' | b'%'))
        || line[indent..].starts_with("---")
        || line[indent..].starts_with("...")
    {
        return None;
    }
    let node = indent_of_node(line, indent);
    // A key (quoted or plain) and its `:`; else the node is the value itself.
    let mut v = node;
    let key_end = match b.get(node) {
        Some(&q @ (b'"' | b'\'')) => quoted_end(b, node, q).map(|e| e + 1),
        _ => Some(node),
    };
    if let Some(k) = key_end {
        let colon =
            (k..b.len()).find(|&i| b[i] == b':' && matches!(b.get(i + 1), None | Some(b' ')));
        if let Some(c) = colon {
            v = c + 1;
        }
    }
    // Anchors and tags before the value.
    loop {
        while b.get(v) == Some(&b' ') {
            v += 1;
        }
        match b.get(v) {
            Some(b'&' | b'!') => {
                while b.get(v).is_some_and(|&c| c != b' ') {
                    v += 1;
                }
            }
            _ => break,
        }
    }
    match *b.get(v)? {
        b'#' | b'[' | b'{' | b'*' | b'?' => None,
        b'|' | b'>' => Some((v, false, 0)),
        q @ (b'"' | b'\'') => match quoted_end(b, v, q) {
            // Closed on this line: nothing follows it.
            Some(e) if e + 1 - v > MAX_SCALAR_BYTES + 2 => Some((v, false, e + 1 - v)),
            Some(_) => None,
            None => Some((v, false, line.len() - v)),
        },
        _ => {
            let end = comment_start(&b[v..]).map_or(line.len(), |c| v + c);
            Some((v, true, line[v..end].trim_end().len()))
        }
    }
}

/// Where `# ` starts a comment in a plain scalar's line (after a space).
fn comment_start(b: &[u8]) -> Option<usize> {
    (1..b.len()).find(|&i| b[i] == b'#' && b[i - 1] == b' ')
}

/// The closing quote of the quoted scalar opened at `at`, if on this line.
fn quoted_end(b: &[u8], at: usize, q: u8) -> Option<usize> {
    let mut i = at + 1;
    while i < b.len() {
        match b[i] {
            b'\\' if q == b'"' => i += 2,
            c if c == q => {
                if q == b'\'' && b.get(i + 1) == Some(&b'\'') {
                    i += 2;
                } else {
                    return Some(i);
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// On a line longer than the limit: the byte column of a token longer than it (a run
/// without separators, or a quoted scalar), if any.
fn long_run(line: &str) -> Option<usize> {
    let b = line.as_bytes();
    let mut i = b.iter().take_while(|&&c| c == b' ').count();
    let mut run = i;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == b'#' && (i == 0 || b[i - 1] == b' ') {
            return None; // a comment to the end of the line
        }
        if i == run && matches!(c, b'"' | b'\'') {
            let end = quoted_end(b, i, c).unwrap_or(b.len());
            if end - i > MAX_SCALAR_BYTES + 1 {
                return Some(i);
            }
            i = end + 1;
            run = i;
            continue;
        }
        let cut = matches!(c, b',' | b'[' | b']' | b'{' | b'}' | b' ' | b'\t')
            || (matches!(c, b':' | b'-') && matches!(next, None | Some(b' ')));
        if cut {
            run = i + 1;
        } else if i + 1 - run > MAX_SCALAR_BYTES {
            return Some(run);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{scalar, MAX_SCALAR_BYTES};
    use crate::source::FileId;

    fn at(text: &str) -> Option<(u32, u32)> {
        scalar(FileId(0), text, 0).map(|s| (s.line, s.col))
    }

    #[test]
    fn one_line_tokens() {
        let long = "x".repeat(MAX_SCALAR_BYTES + 10);
        assert_eq!(at(&format!("a: b\nkey: {long}\n")), Some((2, 6)));
        assert_eq!(at(&format!("- \"{long}\"\n")), Some((1, 3)));
        // Separators inside quotes do not cut a quoted scalar.
        let commas = "x,".repeat(MAX_SCALAR_BYTES / 2 + 10);
        assert_eq!(at(&format!("k: '{commas}'\n")), Some((1, 4)));
        assert_eq!(at(&format!("{{\"a\": \"{commas}\"}}\n")), Some((1, 7)));
        // Many short tokens on one line; a long comment: nothing.
        let flow = format!("k: [{}]\n", "ab, ".repeat(MAX_SCALAR_BYTES / 3));
        assert_eq!(at(&flow), None);
        assert_eq!(at(&format!("a: b # {long}\n")), None);
        assert_eq!(at(&format!("# {long}\n")), None);
    }

    #[test]
    fn scalars_over_lines() {
        let lines = |indent: &str, n: usize| format!("{indent}{}\n", "y".repeat(99)).repeat(n);
        let n = MAX_SCALAR_BYTES / 99 + 2;
        // Literal, folded, plain and quoted scalars whose lines are deeper than their key.
        assert_eq!(at(&format!("a: 1\nk: |\n{}", lines("  ", n))), Some((2, 4)));
        assert_eq!(at(&format!("- k: >-\n{}", lines("    ", n))), Some((1, 6)));
        assert_eq!(at(&format!("k: start\n{}", lines("  ", n))), Some((1, 4)));
        assert_eq!(at(&format!("k: \"start\n{}", lines(" ", n))), Some((1, 4)));
        // Just under the limit: nothing.
        assert_eq!(at(&format!("k: |\n{}", lines("  ", n - 3))), None);
        // Lines at the key's depth end it; a nested mapping is no scalar.
        let siblings = format!(
            "k: |\n{}",
            format!("  y\nk{}: v\n", "z".repeat(99)).repeat(n)
        );
        assert_eq!(at(&siblings), None);
        assert_eq!(
            at(&format!("k:\n{}", lines("  ", n).replace("  y", "  a: y"))),
            None
        );
        assert_eq!(
            at(&format!(
                "k: &anchor\n{}",
                lines("  ", n).replace("  y", "  a: y")
            )),
            None
        );
        // A comment line ends a plain scalar.
        let plain = format!(
            "k: v\n{}",
            format!("  # c\n  {}\n", "y".repeat(99)).repeat(n)
        );
        assert_eq!(at(&plain), None);
    }
}
