//! A fast path for the YAML manifests are written in: block mappings and sequences of
//! one-line scalars (plain, single- or double-quoted), literal block scalars (`|`, `|-`,
//! `|+`: kubectl's last-applied annotations, ConfigMaps) and one-line flow collections,
//! with comments and `---` between documents. It gives the tree, spans and document
//! numbering that [`super::parse_yaml_strict`] gives from saphyr's events (saphyr reads
//! ~20 MB/s; this, several times that), or `None` as soon as the text leaves that subset:
//! anchors, aliases, tags, folded scalars, multi-line plain and quoted scalars and flow
//! collections, `?` keys, directives, `...`, tabs, carriage returns, non-ASCII text, and
//! anything saphyr would refuse. The caller then parses the piece with saphyr, so what
//! this path accepts is a question of speed only; that it gives the same tree where it
//! answers is tested against saphyr (`fast_yaml_agrees_with_saphyr*`).

use super::{is_null, merge_keys, Document, Entry, Node, Value};
use crate::source::{FileId, Span};

/// Deeper nesting is left to the saphyr path (and its diagnostic).
const MAX_DEPTH: usize = 48;
/// saphyr refuses implicit keys longer than 1024 characters.
const MAX_KEY: usize = 1000;

/// `text` is a piece of a file whose first line is line `line0 + 1`. `Err(Some(at))`: a
/// block scalar at `at` is longer than [`super::MAX_SCALAR_BYTES`] (SVC023; nothing of it
/// was copied); `Err(None)`: left to saphyr.
pub(super) fn parse(file: FileId, text: &str, line0: u32) -> Result<Vec<Document>, Option<Span>> {
    if !text.is_ascii() || text.bytes().any(|b| b == b'\t' || b == b'\r') {
        return Err(None);
    }
    let mut p = P {
        text: text.as_bytes(),
        lines: Vec::new(),
        file,
        line0,
        depth: 0,
        too_long: std::cell::Cell::new(None),
    };
    match documents(&mut p, text) {
        Some(docs) => Ok(docs),
        None => Err(p.too_long.get()),
    }
}

fn documents(p: &mut P<'_>, text: &str) -> Option<Vec<Document>> {
    let file = p.file;
    // Lines, without the empty one after a last line break.
    let mut start = 0;
    for l in text.split_inclusive('\n') {
        let body = l.strip_suffix('\n').unwrap_or(l);
        p.lines.push((start, start + body.len()));
        start += l.len();
    }
    let mut docs = Vec::new();
    let mut index = 0u32;
    // Whether a document is open: content before the first `---`, or any `---`.
    let mut open = false;
    let mut root: Option<Node> = None;
    // Whether the open document has its node (a null one is not kept).
    let mut seen = false;
    let mut li = 0;
    while li < p.lines.len() {
        let line = p.line(li);
        if line.starts_with(b"---") {
            if line[3..].iter().any(|&b| b != b' ') {
                return None;
            }
            if open {
                if let Some(r) = root.take() {
                    docs.push(Document {
                        file,
                        index,
                        root: r,
                    });
                }
                index += 1;
            }
            open = true;
            seen = false;
            li += 1;
            continue;
        }
        if line.starts_with(b"...") || line.starts_with(b"%") {
            return None;
        }
        let Some(col) = p.content(li) else {
            li += 1;
            continue;
        };
        // A second node in one document.
        if seen {
            return None;
        }
        open = true;
        seen = true;
        let (node, next) = p.block(li, col, None)?;
        root = Some(node).filter(|n| n.value != Value::Null);
        li = next;
    }
    if let Some(r) = root {
        docs.push(Document {
            file,
            index,
            root: r,
        });
    }
    Some(docs)
}

struct P<'a> {
    text: &'a [u8],
    /// Each line's byte range, without its newline.
    lines: Vec<(usize, usize)>,
    file: FileId,
    line0: u32,
    depth: usize,
    /// Where a block scalar too long to read starts (see [`parse`]).
    too_long: std::cell::Cell<Option<Span>>,
}

/// Whether a plain scalar cannot start at `at` of `l` (or starts what this path leaves
/// to saphyr): an indicator, but `-` followed by a character that is neither a space nor
/// a flow indicator (`-1`).
fn bad_start(l: &[u8], at: usize) -> bool {
    match l[at] {
        b'-' => l
            .get(at + 1)
            .is_none_or(|&b| matches!(b, b' ' | b',' | b'[' | b']' | b'{' | b'}')),
        b => matches!(
            b,
            b'?' | b':'
                | b','
                | b'['
                | b']'
                | b'{'
                | b'}'
                | b'#'
                | b'&'
                | b'*'
                | b'!'
                | b'|'
                | b'>'
                | b'\''
                | b'"'
                | b'%'
                | b'@'
                | b'`'
        ),
    }
}

impl<'a> P<'a> {
    fn line(&self, li: usize) -> &'a [u8] {
        let (s, e) = self.lines[li];
        &self.text[s..e]
    }

    /// The column of the first character of line `li` that is not a space, unless the line
    /// is blank or a comment.
    fn content(&self, li: usize) -> Option<usize> {
        let l = self.line(li);
        let col = l.iter().position(|&b| b != b' ')?;
        (l[col] != b'#').then_some(col)
    }

    /// The next line at or after `li` with content, and its column.
    fn next_content(&self, mut li: usize) -> Option<(usize, usize)> {
        while li < self.lines.len() {
            let l = self.line(li);
            if l.starts_with(b"---") || l.starts_with(b"...") {
                return None;
            }
            if let Some(c) = self.content(li) {
                return Some((li, c));
            }
            li += 1;
        }
        None
    }

    fn span(&self, li: usize, col: usize, len: usize) -> Span {
        Span::new(
            self.file,
            self.line0 + li as u32 + 1,
            col as u32 + 1,
            len as u32,
        )
    }

    /// The first column at or after `col` of line `li` that is not a space.
    fn skip_spaces(&self, li: usize, col: usize) -> usize {
        let l = self.line(li);
        col + l[col.min(l.len())..]
            .iter()
            .take_while(|&&b| b == b' ')
            .count()
    }

    /// Whether the rest of line `li` from `col` is blank or a comment.
    fn rest_is_empty(&self, li: usize, col: usize) -> bool {
        let l = self.line(li);
        let i = self.skip_spaces(li, col);
        i >= l.len() || (l[i] == b'#' && (i == 0 || l[i - 1] == b' '))
    }

    /// Whether a block sequence entry starts at (`li`, `col`): `-` then a space or the end.
    fn is_dash(&self, li: usize, col: usize) -> bool {
        let l = self.line(li);
        l.get(col) == Some(&b'-') && l.get(col + 1).is_none_or(|&b| b == b' ')
    }

    /// The block node that starts at (`li`, `col`) and every line after it that belongs
    /// to it; the line after it. `indent`: the column of the mapping or sequence it is
    /// the value or item of (its lines must be further right), `None` at the root.
    fn block(&mut self, li: usize, col: usize, indent: Option<usize>) -> Option<(Node, usize)> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        let out = if self.is_dash(li, col) {
            self.sequence(li, col, indent == Some(col))
        } else if self.line(li)[col] == b'|' {
            self.literal(li, col, indent?)
        } else if self.key_end(li, col).is_some() {
            self.mapping(li, col)
        } else {
            // A scalar or flow collection alone: the rest of its line is empty, and no
            // line after it belongs to it (a more indented one would continue a plain
            // scalar, which saphyr folds).
            let (node, end) = self.inline(li, col)?;
            if !self.rest_is_empty(li, end) {
                return None;
            }
            match self.next_content(li + 1) {
                Some((_, c)) if indent.is_none_or(|i| c > i) => return None,
                _ => Some((node, self.skip_blank(li + 1))),
            }
        };
        self.depth -= 1;
        let (node, next) = out?;
        Some((node, self.skip_blank(next)))
    }

    /// `li` or the first line after it with content (or a document marker).
    fn skip_blank(&self, li: usize) -> usize {
        match self.next_content(li) {
            Some((l, _)) => l,
            None => {
                // At a marker or the end: the first line that is one.
                let mut l = li;
                while l < self.lines.len() && self.content(l).is_none() {
                    let t = self.line(l);
                    if t.starts_with(b"---") || t.starts_with(b"...") {
                        break;
                    }
                    l += 1;
                }
                l
            }
        }
    }

    /// If a mapping key starts at (`li`, `col`): the column of its `:` and the key.
    fn key_end(&self, li: usize, col: usize) -> Option<(usize, Node)> {
        let l = self.line(li);
        let (key, end) = match l.get(col)? {
            b'\'' | b'"' => self.quoted(li, col)?,
            _ if bad_start(l, col) => return None,
            _ => {
                // A plain key runs to `: ` or `:` at the end of the line.
                let mut i = col;
                loop {
                    match l.get(i) {
                        None => return None,
                        Some(b':') if l.get(i + 1).is_none_or(|&b| b == b' ') => break,
                        Some(b'#') if l[i - 1] == b' ' => return None,
                        _ => i += 1,
                    }
                }
                let mut e = i;
                while e > col && l[e - 1] == b' ' {
                    e -= 1;
                }
                let text = std::str::from_utf8(&l[col..e]).ok()?;
                (self.plain(li, col, text), e)
            }
        };
        let mut i = end;
        while l.get(i) == Some(&b' ') {
            i += 1;
        }
        if l.get(i) != Some(&b':') || l.get(i + 1).is_some_and(|&b| b != b' ') {
            return None;
        }
        // saphyr measures from the key's start to its `:`, spaces before it included.
        if i - col > MAX_KEY {
            return None;
        }
        Some((i, key))
    }

    /// A plain scalar's node.
    fn plain(&self, li: usize, col: usize, text: &str) -> Node {
        let span = self.span(li, col, text.len());
        let value = match is_null(text) {
            true => Value::Null,
            false => Value::Scalar {
                text: text.to_string(),
                plain: true,
            },
        };
        Node { span, value }
    }

    /// The block mapping whose first key is at (`li`, `col`).
    fn mapping(&mut self, mut li: usize, col: usize) -> Option<(Node, usize)> {
        let span = self.span(li, col, 1);
        let mut entries = Vec::new();
        loop {
            let (colon, key) = self.key_end(li, col)?;
            let key_span = key.span;
            let key = match key.value {
                Value::Scalar { text, .. } => text,
                Value::Null => String::new(),
                _ => return None,
            };
            let (value, next) = if self.rest_is_empty(li, colon + 1) {
                match self.next_content(li + 1) {
                    // A nested block, or a sequence written at the key's column.
                    Some((n, c)) if c > col || (c == col && self.is_dash(n, c)) => {
                        self.block(n, c, Some(col))?
                    }
                    _ => {
                        // Nothing: null, located at the `:` (as saphyr's empty scalar).
                        let node = Node {
                            span: self.span(li, colon, 0),
                            value: Value::Null,
                        };
                        (node, self.skip_blank(li + 1))
                    }
                }
            } else {
                let c = self.skip_spaces(li, colon + 1);
                if self.line(li)[c] == b'|' {
                    self.literal(li, c, col)?
                } else {
                    let (node, end) = self.inline(li, c)?;
                    if !self.rest_is_empty(li, end) {
                        return None;
                    }
                    (node, self.skip_blank(li + 1))
                }
            };
            entries.push(Entry {
                key,
                key_span,
                value,
            });
            match self.next_content(next) {
                Some((n, c)) if c == col && !self.is_dash(n, c) => li = n,
                Some((_, c)) if c > col => return None,
                _ => {
                    let node = Node {
                        span,
                        value: Value::Map(merge_keys(entries)),
                    };
                    return Some((node, next));
                }
            }
        }
    }

    /// The block sequence whose first `-` is at (`li`, `col`); `indentless`: written at
    /// the column of the key it is the value of, where saphyr places the sequence at its
    /// first item instead of its first `-`.
    fn sequence(&mut self, mut li: usize, col: usize, indentless: bool) -> Option<(Node, usize)> {
        let span = match indentless {
            false => self.span(li, col, 1),
            true => {
                if self.rest_is_empty(li, col + 1) {
                    return None;
                }
                self.span(li, self.skip_spaces(li, col + 1), 1)
            }
        };
        let mut items = Vec::new();
        loop {
            let (item, next) = if self.rest_is_empty(li, col + 1) {
                match self.next_content(li + 1) {
                    Some((n, c)) if c > col => self.block(n, c, Some(col))?,
                    // An empty item: left to saphyr.
                    _ => return None,
                }
            } else {
                // The item's own lines are those right of the `-`.
                self.block(li, self.skip_spaces(li, col + 1), Some(col))?
            };
            items.push(item);
            match self.next_content(next) {
                Some((n, c)) if c == col && self.is_dash(n, c) => li = n,
                Some((_, c)) if c > col => return None,
                _ => {
                    let node = Node {
                        span,
                        value: Value::Seq(items),
                    };
                    return Some((node, next));
                }
            }
        }
    }

    /// A literal block scalar (`|`, `|-`, `|+`) whose indicator is at (`li`, `col`), the
    /// value or item of a mapping or sequence at column `parent`; the line after it. Its
    /// lines are the ones indented as its first (more than `parent`), and empty lines;
    /// saphyr places it at its first line's text and makes it run to the first character
    /// of the line that ends it. Declined: an indentation indicator, leading empty lines,
    /// lines of spaces, and an end at a comment.
    fn literal(&self, li: usize, col: usize, parent: usize) -> Option<(Node, usize)> {
        let l = self.line(li);
        let (chomp, after) = match l.get(col + 1) {
            Some(&c @ (b'-' | b'+')) => (c, col + 2),
            _ => (b' ', col + 1),
        };
        if l.get(after).is_some_and(|&b| b != b' ') || !self.rest_is_empty(li, after) {
            return None;
        }
        let first = li + 1;
        if first >= self.lines.len() {
            return None;
        }
        let indent = self.content(first).filter(|&c| c > parent)?;
        let mut lines: Vec<&[u8]> = Vec::new();
        let mut n = first;
        let end = loop {
            let Some(&(start, stop)) = self.lines.get(n) else {
                break self.text.len();
            };
            let t = &self.text[start..stop];
            if t.is_empty() {
                lines.push(t);
                n += 1;
                continue;
            }
            let spaces = t.iter().take_while(|&&b| b == b' ').count();
            if spaces == t.len() {
                return None;
            }
            if spaces < indent {
                // A comment or a marker there: left to saphyr.
                if t[spaces] == b'#' || t.starts_with(b"---") || t.starts_with(b"...") {
                    return None;
                }
                break start + spaces;
            }
            lines.push(&t[indent..]);
            n += 1;
        };
        let trailing = lines.iter().rev().take_while(|t| t.is_empty()).count();
        let body = &lines[..lines.len() - trailing];
        // A block scalar too long to read (SVC023), said before it is copied.
        if body.iter().map(|t| t.len() + 1).sum::<usize>() > super::MAX_SCALAR_BYTES {
            self.too_long.set(Some(self.span(first, indent, 1)));
            return None;
        }
        let mut text = String::new();
        for (i, t) in body.iter().enumerate() {
            if i > 0 {
                text.push('\n');
            }
            text.push_str(std::str::from_utf8(t).ok()?);
        }
        match chomp {
            b'-' => {}
            b'+' => {
                text.push('\n');
                text.extend(std::iter::repeat_n('\n', trailing));
            }
            _ => text.push('\n'),
        }
        let from = self.lines[first].0 + indent;
        let node = Node {
            span: self.span(first, indent, end - from),
            value: Value::Scalar { text, plain: false },
        };
        Some((node, self.skip_blank(n)))
    }

    /// A scalar or a flow collection on one line, at (`li`, `col`), in block context; the
    /// column after it.
    fn inline(&mut self, li: usize, col: usize) -> Option<(Node, usize)> {
        self.on_line(li, col, false)
    }

    /// A scalar or a flow collection at (`li`, `col`), inside a flow collection (`in_flow`)
    /// or not; the column after it. A plain scalar ends at a comment or the end of the line,
    /// and inside a flow collection also at `,`, a bracket or a `:` before a space or one of
    /// those; `: ` in a block scalar, and a comment inside a flow collection, are left to
    /// saphyr.
    fn on_line(&mut self, li: usize, col: usize, in_flow: bool) -> Option<(Node, usize)> {
        let l = self.line(li);
        match *l.get(col)? {
            b'[' | b'{' => self.flow(li, col),
            b'\'' | b'"' => self.quoted(li, col),
            _ if bad_start(l, col) => None,
            _ => {
                let flow_end = |b: u8| matches!(b, b',' | b'[' | b']' | b'{' | b'}');
                let mut i = col;
                let mut end = col;
                while i < l.len() {
                    match l[i] {
                        b if in_flow && flow_end(b) => break,
                        b':' if l
                            .get(i + 1)
                            .is_none_or(|&b| b == b' ' || (in_flow && flow_end(b))) =>
                        {
                            if in_flow {
                                break;
                            }
                            return None;
                        }
                        b'#' if l[i - 1] == b' ' => {
                            if in_flow {
                                return None;
                            }
                            break;
                        }
                        b' ' => {}
                        _ => end = i + 1,
                    }
                    i += 1;
                }
                if end - col > super::MAX_SCALAR_BYTES {
                    self.too_long.set(Some(self.span(li, col, 1)));
                    return None;
                }
                let text = std::str::from_utf8(&l[col..end]).ok()?;
                Some((self.plain(li, col, text), end))
            }
        }
    }

    /// A quoted scalar at (`li`, `col`) that ends on its line; the column after it.
    fn quoted(&self, li: usize, col: usize) -> Option<(Node, usize)> {
        let l = self.line(li);
        let q = l[col];
        let mut text = String::new();
        let mut i = col + 1;
        loop {
            if text.len() > super::MAX_SCALAR_BYTES {
                self.too_long.set(Some(self.span(li, col, 1)));
                return None;
            }
            let b = *l.get(i)?;
            match (q, b) {
                (b'\'', b'\'') if l.get(i + 1) == Some(&b'\'') => {
                    text.push('\'');
                    i += 2;
                }
                (b'\'', b'\'') | (b'"', b'"') => break,
                (b'"', b'\\') => {
                    text.push(match *l.get(i + 1)? {
                        b'\\' => '\\',
                        b'"' => '"',
                        b'/' => '/',
                        b'n' => '\n',
                        b't' => '\t',
                        _ => return None,
                    });
                    i += 2;
                }
                _ => {
                    text.push(b as char);
                    i += 1;
                }
            }
        }
        let end = i + 1;
        let node = Node {
            span: self.span(li, col, end - col),
            value: Value::Scalar { text, plain: false },
        };
        Some((node, end))
    }

    /// A flow collection that opens at (`li`, `col`) and closes on the same line; the
    /// column after it.
    fn flow(&mut self, li: usize, col: usize) -> Option<(Node, usize)> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        let l = self.line(li);
        let map = l[col] == b'{';
        let close = if map { b'}' } else { b']' };
        let span = self.span(li, col, 1);
        let mut i = col + 1;
        let skip = |i: &mut usize| {
            while l.get(*i) == Some(&b' ') {
                *i += 1;
            }
        };
        let mut items = Vec::new();
        let mut entries = Vec::new();
        skip(&mut i);
        if l.get(i) != Some(&close) {
            loop {
                let (node, end) = self.on_line(li, i, true)?;
                i = end;
                skip(&mut i);
                if map {
                    // `key: value`; a key alone is left to saphyr.
                    if l.get(i) != Some(&b':') {
                        return None;
                    }
                    i += 1;
                    skip(&mut i);
                    let (value, end) = self.on_line(li, i, true)?;
                    let key_span = node.span;
                    let key = match node.value {
                        Value::Scalar { text, .. } => text,
                        _ => return None,
                    };
                    entries.push(Entry {
                        key,
                        key_span,
                        value,
                    });
                    i = end;
                } else {
                    if l.get(i) == Some(&b':') {
                        return None;
                    }
                    items.push(node);
                }
                skip(&mut i);
                match l.get(i) {
                    Some(b',') => {
                        i += 1;
                        skip(&mut i);
                        // A trailing comma: left to saphyr.
                        if matches!(l.get(i), Some(b']' | b'}')) {
                            return None;
                        }
                    }
                    Some(&b) if b == close => break,
                    _ => return None,
                }
            }
        }
        self.depth -= 1;
        let value = match map {
            true => Value::Map(merge_keys(entries)),
            false => Value::Seq(items),
        };
        Some((Node { span, value }, i + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_yaml_strict;
    use super::*;

    /// `None` when the fast path declines; else whether it agrees with saphyr (which must
    /// then find no error), panicking with both trees if not.
    fn agrees(text: &str) -> Option<()> {
        let fast = parse(FileId(0), text, 3).ok()?;
        let (slow, diags) = parse_yaml_strict(FileId(0), text, 3, usize::MAX);
        assert!(
            diags.items.is_empty(),
            "the fast path took what saphyr refuses: {:?}\n{text}",
            diags.items
        );
        let key = |d: &[Document]| -> Vec<(u32, Node)> {
            d.iter().map(|d| (d.index, d.root.clone())).collect()
        };
        assert_eq!(key(&fast), key(&slow), "\n{text}");
        Some(())
    }

    fn yaml_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                yaml_files(&p, out);
            } else if p
                .extension()
                .is_some_and(|x| x == "yaml" || x == "yml" || x == "snap")
            {
                out.push(p);
            }
        }
    }

    /// Every YAML file of the repository's tests and examples (and the snapshots, YAML
    /// themselves): where the fast path answers, it is saphyr's answer; and it answers for
    /// most of them.
    #[test]
    fn fast_yaml_agrees_with_saphyr_on_the_repository() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for d in ["golden", "examples", "tests"] {
            yaml_files(&root.join(d), &mut files);
        }
        let (mut fast, mut all) = (0, 0);
        for f in &files {
            let Ok(text) = std::fs::read_to_string(f) else {
                continue;
            };
            let yaml = f.extension().is_some_and(|x| x != "snap");
            all += usize::from(yaml);
            if agrees(&text).is_some() {
                fast += usize::from(yaml);
            } else if yaml && std::env::var_os("FAST_YAML_DECLINED").is_some() {
                eprintln!("declined: {}", f.display());
            }
        }
        // 181 of 185 when written: the others have anchors, a CR, or errors (they are
        // error cases).
        assert!(all > 150, "{all} files");
        assert!(
            fast * 20 > all * 19,
            "the fast path took {fast} of {all} files"
        );
    }

    /// The generator's clusters, in both YAML forms.
    #[test]
    fn fast_yaml_agrees_with_saphyr_on_generated_clusters() {
        use crate::synth::{generate, Format, Shape};
        for (services, endpoints, nodes, seed) in [(30, 3, 4, 1), (7, 120, 2, 9), (1, 0, 1, 3)] {
            for format in [Format::YamlList, Format::YamlStream] {
                let shape = Shape {
                    services,
                    endpoints,
                    nodes,
                    seed,
                };
                let text = generate(&shape, format);
                assert!(agrees(&text).is_some(), "{format:?} declined");
            }
        }
    }

    #[test]
    fn fast_yaml_agrees_with_saphyr_on_the_edges_it_takes_and_declines_the_rest() {
        let taken = [
            "apiVersion: v1\nkind: Service\nmetadata: {name: svc-0, namespace: \"bench\"}\n",
            "spec:\n  type: 'ClusterIP'\n  clusterIP: 10.96.0.1   # comment\n  ports:\n  - {name: http, port: 80, targetPort: 8080}\n  - name: x\n    port: 81\n  list:\n    - a\n    - b: c\n  empty: {}\n  e2: []\n  flow: [a, \"b\", {c: d}]\n---\nkind: X\n",
            "# lead comment\n---\na:\nb: ~\nc: null\nd:\n  - - x\n    - y\n  -\n    k: v\ne: \"a: b\"\n'f g': h i j\nurl: http://x:80/y\nn: -1\nm: [ a , b ]\nz: {x: {y: [1]}}\nq: \"x\\ty\\\"z\"\n\nw: x   \n---\n",
            "---\n---\na: 1\n---\n\n---\nb: [-1, x]\n",
            "a:\n- 1\n- 2\nb: 'it''s'\n",
            "  indented: root\n  second: x\n",
            "- a\n- b\n",
            "plain\n",
            "a: {}\n",
            "k: v # c\n# c\n\n  # c\nl: w\n",
            "a: x:y\nb: \"\"\nc: ''\nd: 'a\"b'\n",
            "<<: {a: 1}\nb: 2\n",
            "key with spaces: value with spaces\n",
            "a:\n  b:\n    c:\n      - d: e\n        f: g\n      - h\n",
            "- - - a\n",
            "{a: 1}\n",
            "[1, 2]\n",
            "a: |\n  {\"x\": 1}\n  second # not comment\n\n  after blank\nb: |-\n    two\n     three\nc:\n  d: |+\n    keep\n\n  e: x\nf: | # c\n  y\n",
            "- |-\n  x\n- |\n   y\n\n\n- z\n",
            "a: |\n  text\n",
            "a: |+\n  text\n\n",
            "a: |\n  x\nb: c",
        ];
        for t in taken {
            assert!(agrees(t).is_some(), "declined {t:?}");
        }
        // Found by review: a literal scalar's indicator on a last line without a line
        // break read past the text (saphyr: an empty string).
        for t in ["a: |", "- |-", "a:\n  b: |"] {
            assert!(parse(FileId(0), t, 0).is_err(), "took {t:?}");
        }
        // saphyr's key length counts the spaces before the `:`.
        let long = format!("{}{}: v\n", "k".repeat(990), " ".repeat(30));
        assert!(parse(FileId(0), &long, 0).is_err());
        // Not taken: left to saphyr whatever it makes of them.
        let declined = [
            "a: &x 1\nb: *x\n",
            "a: !!str 1\n",
            "a: >\n  text\n",
            "a: |2\n  text\n",
            "a: b\n...\n",
            "a: |\n\n  text\n",
            "a: |\n  text\n# c\n",
            "a: |\n  # text\n",
            "a: |\n  text\n   \n",
            "a: |\n  text\n---\n",
            "|\n  text\n",
            "a: multi\n  line\n",
            "a: [1,\n  2]\n",
            "? a\n: b\n",
            "%YAML 1.2\n---\na: 1\n",
            "a:\tb\n",
            "a: b\r\n",
            "a: é\n",
            "a: \"\\u0041\"\n",
            "a: 1\n b: 2\n",
            "- a\nb: c\n",
            "a: b: c\n",
            "a: [1, 2, ]\n",
            "a: {b}\n",
            "-\n- a\n",
            "a: \"x\n  y\"\n",
        ];
        for t in declined {
            assert!(parse(FileId(0), t, 0).is_err(), "took {t:?}");
        }
    }

    /// Random manifests-like texts from a small grammar with constructs on both sides of
    /// the subset: where the fast path answers, saphyr answers the same.
    #[test]
    fn fast_yaml_agrees_with_saphyr_on_random_texts() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        const SCALARS: [&str; 16] = [
            "x",
            "80",
            "-1",
            "~",
            "null",
            "a b",
            "'q'",
            "\"d\"",
            "'it''s'",
            "\"e\\\"s\"",
            "http://a:1",
            "a:b",
            "true",
            "''",
            "\"\"",
            "x # c",
        ];
        let mut taken = 0;
        // More with FAST_YAML_ROUNDS (200000 ran clean when this was written).
        let rounds = std::env::var("FAST_YAML_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(3000);
        for _ in 0..rounds {
            let mut t = String::new();
            let docs = 1 + next(3);
            for d in 0..docs {
                if d > 0 || next(3) == 0 {
                    t.push_str("---\n");
                }
                gen_block(&mut next, &mut t, 0, 0, &SCALARS);
            }
            if agrees(&t).is_some() {
                taken += 1;
            }
            // And without its last line break (a file's last line need not have one).
            agrees(t.trim_end_matches('\n'));
        }
        assert!(taken > 1000, "{taken}");
    }

    fn gen_block(
        next: &mut impl FnMut(u64) -> u64,
        t: &mut String,
        indent: usize,
        depth: usize,
        scalars: &[&str],
    ) {
        let pad = " ".repeat(indent);
        let n = 1 + next(3) as usize;
        let seq = next(3) == 0;
        for i in 0..n {
            if next(8) == 0 {
                t.push_str(&format!("{pad}# comment\n"));
            }
            if next(10) == 0 {
                t.push('\n');
            }
            let head = if seq {
                format!("{pad}- ")
            } else {
                format!("{pad}k{i}{}:", ["", "", " ", "x y"][next(4) as usize])
            };
            t.push_str(&head);
            match (next(6), depth < 3) {
                (0, true) => {
                    t.push('\n');
                    let more = indent + [0, 2, 4][next(3) as usize] + usize::from(seq) * 2;
                    gen_block(next, t, more, depth + 1, scalars);
                }
                (1, _) => {
                    let flow = [
                        "{a: 1, b: [x, y]}",
                        "[]",
                        "{}",
                        "[a, {b: c}]",
                        "{a: b",
                        "[1, ]",
                    ];
                    t.push_str(&format!(" {}\n", flow[next(6) as usize]));
                }
                (2, _) => t.push('\n'),
                (3, _) if next(2) == 0 => {
                    let head = ["|", "|-", "|+", "|2", "| # c"][next(5) as usize];
                    let body = " ".repeat(indent + 2 + 2 * usize::from(seq));
                    t.push_str(&format!(" {head}\n{body}line one\n\n{body}  two # x\n"));
                    if next(2) == 0 {
                        t.push('\n');
                    }
                }
                _ => {
                    let s = scalars[next(scalars.len() as u64) as usize];
                    t.push_str(&format!(" {s}\n"));
                }
            }
        }
    }
}
