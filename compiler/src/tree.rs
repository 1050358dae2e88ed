//! The located tree: YAML or JSON parsed into plain values that remember where they were.
//!
//! YAML goes through `saphyr-parser`'s event stream (not serde), so every scalar, key,
//! sequence and mapping keeps its line and column. JSON takes a hand-written fast path
//! producing the same tree. Aliases are expanded under a node budget sized from the input,
//! so an alias bomb is a diagnostic, not an out-of-memory.
//!
//! Architecture Invariant: this module knows nothing about Kubernetes.

use crate::diag::{Diagnostic, Diagnostics};
use crate::source::{FileId, Span};
use saphyr_parser::{Event, Parser, ScalarStyle};
use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub span: Span,
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    /// A scalar as written; `plain` is false for quoted and block scalars (YAML) and for
    /// JSON strings, so `"80"` stays a string while `80` can be read as a number.
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<Entry>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub key: String,
    pub key_span: Span,
    pub value: Node,
}

impl Node {
    pub fn kind_name(&self) -> &'static str {
        match &self.value {
            Value::Null => "null",
            Value::Scalar { plain: true, text } if is_plain_number(text) => "number",
            Value::Scalar { plain: true, text } if is_plain_bool(text) => "boolean",
            Value::Scalar { .. } => "string",
            Value::Seq(_) => "list",
            Value::Map(_) => "mapping",
        }
    }
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(es) => es.iter().find(|e| e.key == key).map(|e| &e.value),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }
}

pub fn is_plain_bool(t: &str) -> bool {
    matches!(t, "true" | "false" | "True" | "False" | "TRUE" | "FALSE")
}

pub fn is_plain_number(t: &str) -> bool {
    let t = t.strip_prefix(['-', '+']).unwrap_or(t);
    !t.is_empty()
        && (t.bytes().all(|b| b.is_ascii_digit())
            || (t.parse::<f64>().is_ok() && t.bytes().any(|b| b.is_ascii_digit())))
}

/// One document of one file.
#[derive(Clone, Debug)]
pub struct Document {
    pub file: FileId,
    /// 0-based index of the document inside its file.
    pub index: u32,
    pub root: Node,
}

/// Parse one file. YAML unless it looks like JSON (`{` or `[` first); a JSON file that
/// fails the fast path is retried as YAML, which also accepts JSON, for its diagnostics.
pub fn parse_file(file: FileId, text: &str) -> (Vec<Document>, Diagnostics) {
    let first = text.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
    if first.starts_with('{') || first.starts_with('[') {
        if let Ok(root) = json::parse(file, text) {
            return (
                vec![Document {
                    file,
                    index: 0,
                    root,
                }],
                Diagnostics::default(),
            );
        }
    }
    parse_yaml(file, text)
}

/// Parse a YAML stream. Large streams are split at top-level `---` lines and the pieces
/// parsed in parallel; each piece keeps its real line numbers.
pub fn parse_yaml(file: FileId, text: &str) -> (Vec<Document>, Diagnostics) {
    use rayon::prelude::*;
    const SPLIT_ABOVE: usize = 256 * 1024;
    if text.len() < SPLIT_ABOVE {
        return parse_yaml_piece(file, text, 0);
    }
    let pieces = split_documents(text);
    let results: Vec<_> = pieces
        .par_iter()
        .map(|(line0, piece)| parse_yaml_piece(file, piece, *line0))
        .collect();
    let mut docs = Vec::new();
    let mut diags = Diagnostics::default();
    for (d, g) in results {
        docs.extend(d);
        diags.extend(g);
    }
    for (i, d) in docs.iter_mut().enumerate() {
        d.index = i as u32;
    }
    (docs, diags)
}

/// Split at lines that start with `---` (a document marker at column 0), returning each
/// piece with the 0-based line it starts on. Pieces hold at least ~64 KiB so tiny documents
/// are not parsed one by one.
fn split_documents(text: &str) -> Vec<(u32, &str)> {
    const MIN_PIECE: usize = 64 * 1024;
    let mut out = Vec::new();
    let (mut start, mut start_line, mut line, mut pos) = (0usize, 0u32, 0u32, 0usize);
    for l in text.split_inclusive('\n') {
        let is_marker =
            l.starts_with("---") && l[3..].chars().next().is_none_or(|c| c.is_whitespace());
        if is_marker && pos > start && pos - start >= MIN_PIECE {
            out.push((start_line, &text[start..pos]));
            start = pos;
            start_line = line;
        }
        pos += l.len();
        line += 1;
    }
    if start < text.len() {
        out.push((start_line, &text[start..]));
    }
    out
}

fn span_of(file: FileId, line0: u32, s: &saphyr_parser::Span) -> Span {
    Span::new(
        file,
        s.start.line() as u32 + line0,
        s.start.col() as u32 + 1,
        s.len() as u32,
    )
}

enum Frame {
    Seq(Span, Vec<Node>, usize),
    Map(Span, Vec<Entry>, Option<(String, Span)>, usize),
}

fn parse_yaml_piece(file: FileId, text: &str, line0: u32) -> (Vec<Document>, Diagnostics) {
    let mut diags = Diagnostics::default();
    let mut docs = Vec::new();
    // Alias expansion budget: generous for real manifests, finite for bombs.
    let budget: usize = 100_000 + text.len() * 4;
    let mut nodes_made: usize = 0;
    let mut anchors: HashMap<usize, Node> = HashMap::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut doc_index = 0u32;
    let mut root: Option<Node> = None;
    let mut parser = Parser::new_from_str(text);

    // Attach a finished node to its parent, or make it the document root.
    fn attach(
        stack: &mut [Frame],
        root: &mut Option<Node>,
        node: Node,
        anchor: usize,
        anchors: &mut HashMap<usize, Node>,
        diags: &mut Diagnostics,
    ) {
        if anchor != 0 {
            anchors.insert(anchor, node.clone());
        }
        match stack.last_mut() {
            None => *root = Some(node),
            Some(Frame::Seq(_, items, _)) => items.push(node),
            Some(Frame::Map(_, entries, pending, _)) => match pending.take() {
                None => {
                    let key = match &node.value {
                        Value::Scalar { text, .. } => text.clone(),
                        Value::Null => String::new(),
                        _ => {
                            diags.push(
                                Diagnostic::error(
                                    "SVC001",
                                    "mapping keys must be plain strings, not lists or mappings",
                                )
                                .at(node.span),
                            );
                            String::new()
                        }
                    };
                    *pending = Some((key, node.span));
                }
                Some((key, key_span)) => entries.push(Entry {
                    key,
                    key_span,
                    value: node,
                }),
            },
        }
    }

    loop {
        let (ev, sp) =
            match parser.next_event() {
                None => break,
                Some(Ok(x)) => x,
                Some(Err(e)) => {
                    let m = e.marker();
                    diags.push(
                    Diagnostic::error("SVC001", format!("invalid YAML: {}", e.info()))
                        .at(Span::new(file, m.line() as u32 + line0, m.col() as u32 + 1, 1))
                        .hint("fix the YAML syntax; nothing after this point in the file was read"),
                );
                    break;
                }
            };
        let span = span_of(file, line0, &sp);
        match ev {
            Event::StreamStart | Event::StreamEnd | Event::Nothing => {}
            Event::DocumentStart(_) => {
                root = None;
                stack.clear();
            }
            Event::DocumentEnd => {
                // Empty documents (a trailing `---`) are common and carry nothing.
                if let Some(r) = root.take().filter(|r| r.value != Value::Null) {
                    docs.push(Document {
                        file,
                        index: doc_index,
                        root: r,
                    });
                }
                doc_index += 1;
            }
            Event::Scalar(text, style, anchor, tag) => {
                nodes_made += 1;
                let plain =
                    style == ScalarStyle::Plain && tag.as_ref().is_none_or(|t| t.suffix != "str");
                let value = if plain && matches!(&*text, "" | "~" | "null" | "Null" | "NULL") {
                    Value::Null
                } else {
                    Value::Scalar {
                        text: text.into_owned(),
                        plain,
                    }
                };
                attach(
                    &mut stack,
                    &mut root,
                    Node { span, value },
                    anchor,
                    &mut anchors,
                    &mut diags,
                );
            }
            Event::SequenceStart(anchor, _) => {
                nodes_made += 1;
                stack.push(Frame::Seq(Span { len: 1, ..span }, Vec::new(), anchor));
            }
            Event::MappingStart(anchor, _) => {
                nodes_made += 1;
                stack.push(Frame::Map(
                    Span { len: 1, ..span },
                    Vec::new(),
                    None,
                    anchor,
                ));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor) = match stack.pop() {
                    Some(Frame::Seq(s, items, a)) => (
                        Node {
                            span: s,
                            value: Value::Seq(items),
                        },
                        a,
                    ),
                    Some(Frame::Map(s, entries, _, a)) => (
                        Node {
                            span: s,
                            value: Value::Map(entries),
                        },
                        a,
                    ),
                    None => continue,
                };
                attach(
                    &mut stack,
                    &mut root,
                    node,
                    anchor,
                    &mut anchors,
                    &mut diags,
                );
            }
            Event::Alias(id) => {
                let Some(target) = anchors.get(&id).cloned() else {
                    diags.push(Diagnostic::error("SVC001", "alias to an unknown anchor").at(span));
                    continue;
                };
                nodes_made += count_nodes(&target);
                if nodes_made > budget {
                    diags.push(
                        Diagnostic::error(
                            "SVC002",
                            format!(
                                "alias expansion exceeds the budget of {budget} nodes for this file"
                            ),
                        )
                        .at(span)
                        .hint("this looks like an alias bomb; write the values out or use fewer nested aliases"),
                    );
                    return (docs, diags);
                }
                let node = Node { span, ..target };
                attach(&mut stack, &mut root, node, 0, &mut anchors, &mut diags);
            }
        }
    }
    (docs, diags)
}

fn count_nodes(n: &Node) -> usize {
    1 + match &n.value {
        Value::Seq(items) => items.iter().map(count_nodes).sum(),
        Value::Map(es) => es.iter().map(|e| 1 + count_nodes(&e.value)).sum(),
        _ => 0,
    }
}

/// A JSON parser producing the located tree. Fast path for `kubectl get -o json`.
pub mod json {
    use super::{Entry, Node, Value};
    use crate::source::{FileId, Span};

    pub struct Error;

    struct P<'a> {
        b: &'a [u8],
        i: usize,
        line: u32,
        line_start: usize,
        file: FileId,
        depth: u32,
    }

    pub fn parse(file: FileId, text: &str) -> Result<Node, Error> {
        let mut p = P {
            b: text.as_bytes(),
            i: 0,
            line: 1,
            line_start: 0,
            file,
            depth: 0,
        };
        if p.b.starts_with("\u{feff}".as_bytes()) {
            p.i = 3;
            p.line_start = 3;
        }
        p.ws();
        let v = p.value()?;
        p.ws();
        if p.i != p.b.len() {
            return Err(Error);
        }
        Ok(v)
    }

    impl P<'_> {
        fn ws(&mut self) {
            while let Some(&c) = self.b.get(self.i) {
                match c {
                    b'\n' => {
                        self.i += 1;
                        self.line += 1;
                        self.line_start = self.i;
                    }
                    b' ' | b'\t' | b'\r' => self.i += 1,
                    _ => break,
                }
            }
        }
        fn span(&self, start: usize, end: usize) -> Span {
            // Columns count characters: count UTF-8 lead bytes since the line start.
            let col = self.b[self.line_start..start]
                .iter()
                .filter(|&&c| (c & 0xC0) != 0x80)
                .count() as u32
                + 1;
            let len = self.b[start..end]
                .iter()
                .filter(|&&c| (c & 0xC0) != 0x80)
                .count() as u32;
            Span::new(self.file, self.line, col, len.max(1))
        }
        fn value(&mut self) -> Result<Node, Error> {
            self.depth += 1;
            if self.depth > 512 {
                return Err(Error);
            }
            let start = self.i;
            let r = match self.b.get(self.i).ok_or(Error)? {
                b'{' => {
                    let span = self.span(start, start + 1);
                    self.i += 1;
                    let mut entries = Vec::new();
                    self.ws();
                    if self.b.get(self.i) == Some(&b'}') {
                        self.i += 1;
                    } else {
                        loop {
                            self.ws();
                            let ks = self.i;
                            let key = self.string()?;
                            let key_span = self.span(ks, self.i);
                            self.ws();
                            if self.b.get(self.i) != Some(&b':') {
                                return Err(Error);
                            }
                            self.i += 1;
                            self.ws();
                            let value = self.value()?;
                            entries.push(Entry {
                                key,
                                key_span,
                                value,
                            });
                            self.ws();
                            match self.b.get(self.i) {
                                Some(b',') => self.i += 1,
                                Some(b'}') => {
                                    self.i += 1;
                                    break;
                                }
                                _ => return Err(Error),
                            }
                        }
                    }
                    Node {
                        span,
                        value: Value::Map(entries),
                    }
                }
                b'[' => {
                    let span = self.span(start, start + 1);
                    self.i += 1;
                    let mut items = Vec::new();
                    self.ws();
                    if self.b.get(self.i) == Some(&b']') {
                        self.i += 1;
                    } else {
                        loop {
                            self.ws();
                            items.push(self.value()?);
                            self.ws();
                            match self.b.get(self.i) {
                                Some(b',') => self.i += 1,
                                Some(b']') => {
                                    self.i += 1;
                                    break;
                                }
                                _ => return Err(Error),
                            }
                        }
                    }
                    Node {
                        span,
                        value: Value::Seq(items),
                    }
                }
                b'"' => {
                    let text = self.string()?;
                    Node {
                        span: self.span(start, self.i),
                        value: Value::Scalar { text, plain: false },
                    }
                }
                _ => {
                    while let Some(&c) = self.b.get(self.i) {
                        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.') {
                            self.i += 1;
                        } else {
                            break;
                        }
                    }
                    let text = std::str::from_utf8(&self.b[start..self.i]).map_err(|_| Error)?;
                    let span = self.span(start, self.i);
                    match text {
                        "null" => Node {
                            span,
                            value: Value::Null,
                        },
                        "true" | "false" => Node {
                            span,
                            value: Value::Scalar {
                                text: text.to_string(),
                                plain: true,
                            },
                        },
                        t if !t.is_empty() && t.parse::<f64>().is_ok() => Node {
                            span,
                            value: Value::Scalar {
                                text: t.to_string(),
                                plain: true,
                            },
                        },
                        _ => return Err(Error),
                    }
                }
            };
            self.depth -= 1;
            Ok(r)
        }
        fn string(&mut self) -> Result<String, Error> {
            if self.b.get(self.i) != Some(&b'"') {
                return Err(Error);
            }
            self.i += 1;
            let mut out = String::new();
            loop {
                let run_start = self.i;
                while let Some(&c) = self.b.get(self.i) {
                    if c == b'"' || c == b'\\' || c < 0x20 {
                        break;
                    }
                    self.i += 1;
                }
                out.push_str(std::str::from_utf8(&self.b[run_start..self.i]).map_err(|_| Error)?);
                match self.b.get(self.i) {
                    Some(b'"') => {
                        self.i += 1;
                        return Ok(out);
                    }
                    Some(b'\\') => {
                        self.i += 1;
                        let c = *self.b.get(self.i).ok_or(Error)?;
                        self.i += 1;
                        match c {
                            b'"' => out.push('"'),
                            b'\\' => out.push('\\'),
                            b'/' => out.push('/'),
                            b'b' => out.push('\u{8}'),
                            b'f' => out.push('\u{c}'),
                            b'n' => out.push('\n'),
                            b'r' => out.push('\r'),
                            b't' => out.push('\t'),
                            b'u' => {
                                let mut cp = self.hex4()?;
                                if (0xD800..0xDC00).contains(&cp) {
                                    if self.b.get(self.i..self.i + 2) != Some(b"\\u") {
                                        return Err(Error);
                                    }
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    cp = 0x10000
                                        + ((cp - 0xD800) << 10)
                                        + (lo.wrapping_sub(0xDC00) & 0x3FF);
                                }
                                out.push(char::from_u32(cp).ok_or(Error)?);
                            }
                            _ => return Err(Error),
                        }
                    }
                    _ => return Err(Error),
                }
            }
        }
        fn hex4(&mut self) -> Result<u32, Error> {
            let s = self.b.get(self.i..self.i + 4).ok_or(Error)?;
            self.i += 4;
            u32::from_str_radix(std::str::from_utf8(s).map_err(|_| Error)?, 16).map_err(|_| Error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Node {
        let (docs, d) = parse_file(FileId(0), text);
        assert!(d.items.is_empty(), "{:?}", d.items);
        docs.into_iter().next().unwrap().root
    }

    #[test]
    fn yaml_locations() {
        let n = one("kind: Service\nspec:\n  ports:\n  - port: 80\n    nodePort: 40000\n");
        let np = n.get("spec").unwrap().get("ports").unwrap();
        let Value::Seq(items) = &np.value else {
            panic!()
        };
        let v = items[0].get("nodePort").unwrap();
        assert_eq!((v.span.line, v.span.col, v.span.len), (5, 15, 5));
        assert_eq!(v.as_str(), Some("40000"));
    }

    #[test]
    fn json_locations_match_yaml_shape() {
        let n = one("{\"kind\": \"Service\",\n \"spec\": {\"ports\": [{\"port\": 80}]}}");
        let p = &n.get("spec").unwrap().get("ports").unwrap();
        let Value::Seq(items) = &p.value else {
            panic!()
        };
        let port = items[0].get("port").unwrap();
        assert_eq!((port.span.line, port.span.col), (2, 30));
        assert_eq!(
            port.value,
            Value::Scalar {
                text: "80".into(),
                plain: true
            }
        );
    }

    #[test]
    fn multi_document_and_quoted() {
        let (docs, _) = parse_file(FileId(0), "a: '80'\n---\nb: 80\n---\n");
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].root.get("b").unwrap().kind_name(), "number");
        assert_eq!(docs[0].root.get("a").unwrap().kind_name(), "string");
    }

    #[test]
    fn alias_bomb_is_a_diagnostic() {
        let mut s = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            s.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let (_, d) = parse_file(FileId(0), &s);
        assert_eq!(d.items[0].code, "SVC002");
    }

    #[test]
    fn split_keeps_line_numbers() {
        let mut s = String::new();
        for i in 0..6000 {
            s.push_str(&format!("---\nkind: Service\nmetadata:\n  name: s{i}\n"));
        }
        let (docs, d) = parse_yaml(FileId(0), &s);
        assert!(d.items.is_empty());
        assert_eq!(docs.len(), 6000);
        let last = &docs[5999].root;
        assert_eq!(last.get("kind").unwrap().span.line, 5999 * 4 + 2);
        assert_eq!(docs[5999].index, 5999);
    }
}
