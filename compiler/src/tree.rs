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

mod fast_yaml;
mod long;

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
            Value::Scalar { plain: true, text } if is_yaml11_bool(text) => "boolean",
            Value::Scalar { .. } => "string",
            Value::Seq(_) => "list",
            Value::Map(_) => "mapping",
        }
    }
    /// The value of `key`; its last, where a mapping repeats it (as kubectl keeps it).
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(es) => es.iter().rev().find(|e| e.key == key).map(|e| &e.value),
            _ => None,
        }
    }
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        match &mut self.value {
            Value::Map(es) => es
                .iter_mut()
                .rev()
                .find(|e| e.key == key)
                .map(|e| &mut e.value),
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

/// A plain scalar kubectl reads as a boolean: its YAML library (go-yaml v2) follows YAML
/// 1.1, where `yes`, `no`, `on`, `off`, `y` and `n` are booleans too.
pub fn is_yaml11_bool(t: &str) -> bool {
    is_plain_bool(t) || yaml11_bool(t).is_some()
}

/// The value of a YAML 1.1 boolean spelled otherwise than true/false.
pub fn yaml11_bool(t: &str) -> Option<bool> {
    match t {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

pub fn is_plain_number(t: &str) -> bool {
    let t = t.strip_prefix(['-', '+']).unwrap_or(t);
    !t.is_empty()
        && (t.bytes().all(|b| b.is_ascii_digit())
            || (t.parse::<f64>().is_ok() && t.bytes().any(|b| b.is_ascii_digit())))
}

/// The first template marker of a text, outside comments: `{{` (Helm, Go templates),
/// `${NAME` (envsubst, shell) or `{NAME}` in capitals (a placeholder a script fills in),
/// with which kind of template it suggests.
pub fn template_marker(file: FileId, text: &str) -> Option<(Span, &'static str)> {
    for (i, line) in text.split('\n').enumerate() {
        let code = match line.trim_start().starts_with('#') {
            true => continue,
            false => line,
        };
        let helm = code.find("{{");
        let env = code.match_indices("${").map(|(j, _)| j).find(|&j| {
            code[j + 2..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        });
        // `{SERVICE_IP_PREFIX}`: an upper-case placeholder a script fills in (sed).
        let placeholder = code.match_indices('{').map(|(j, _)| j).find(|&j| {
            let name: &str = code[j + 1..].split('}').next().unwrap_or("");
            code[j + 1..].contains('}')
                && name.len() >= 2
                && name.starts_with(|c: char| c.is_ascii_uppercase())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        });
        let first = [
            (helm, "Helm"),
            (env, "envsubst"),
            (placeholder, "placeholder"),
        ]
        .into_iter()
        .filter_map(|(at, what)| Some((at?, what)))
        .min_by_key(|(at, _)| *at);
        let Some((at, what)) = first else { continue };
        let len = match what {
            "placeholder" => 1,
            _ => 2,
        };
        let col = code[..at].chars().count() as u32 + 1;
        return Some((Span::new(file, i as u32 + 1, col, len), what));
    }
    None
}

/// One document of one file.
#[derive(Clone, Debug)]
pub struct Document {
    pub file: FileId,
    /// 0-based index of the document inside its file.
    pub index: u32,
    pub root: Node,
}

/// One piece of a parsed file, handed to the callback of [`parse_each`].
pub enum Part<'a> {
    /// The root of a whole document.
    Document(Node),
    /// Consecutive items of the top-level `items` sequence of a large document (a
    /// `kind: List` dump): items `first..first + items.len()`. That document itself comes
    /// as a [`Part::Document`] first, with `items` empty; `list` is it.
    Items {
        list: &'a Node,
        first: usize,
        items: Vec<Node>,
    },
}

/// Parse one file into complete documents. YAML unless it looks like JSON (`{` or `[`
/// first); a JSON file that fails the fast path is retried as YAML, which also accepts
/// JSON, for its diagnostics. Large files are parsed in parallel (see [`parse_each`]).
pub fn parse_file(file: FileId, text: &str) -> (Vec<Document>, Diagnostics) {
    if !looks_like_json(text) && text.len() < SPLIT_ABOVE {
        // Small streams keep the serial numbering, empty documents included.
        return parse_yaml_piece(file, text, 0, default_budget(text));
    }
    let (parts, diags) = parse_each(file, text, Whole::from);
    (Whole::assemble(file, parts), diags)
}

/// [`Part`]s put back together into documents.
enum Whole {
    Doc(Node),
    Items(Vec<Node>),
}

impl Whole {
    fn from(part: Part<'_>) -> Whole {
        match part {
            Part::Document(root) => Whole::Doc(root),
            Part::Items { items, .. } => Whole::Items(items),
        }
    }
    fn assemble(file: FileId, parts: Vec<Whole>) -> Vec<Document> {
        let mut roots: Vec<Node> = Vec::new();
        for part in parts {
            match part {
                Whole::Doc(root) => roots.push(root),
                Whole::Items(mut items) => {
                    // Items always follow the document they belong to.
                    let list = roots.last_mut().expect("items follow their list");
                    if let Some(Value::Seq(all)) = list.get_mut("items").map(|n| &mut n.value) {
                        all.append(&mut items);
                    }
                }
            }
        }
        roots
            .into_iter()
            .enumerate()
            .map(|(i, root)| Document {
                file,
                index: i as u32,
                root,
            })
            .collect()
    }
}

/// Parse one file and call `f` on each of its parts, in parallel where the file is large:
/// a YAML stream is split at top-level `---` lines, and a large document whose top-level
/// `items:` sequence is written at column 0 (what `kubectl get -o yaml` prints) is split
/// between items; a JSON file's `items` are handed out in chunks. Each piece keeps its real
/// line numbers, and the results come back in input order, so the callback sees the same
/// objects in the same order as a serial parse would give. The callback runs on the thread
/// that parsed the piece, so each piece's tree can be dropped as soon as it is used.
pub fn parse_each<T: Send>(
    file: FileId,
    text: &str,
    f: impl Fn(Part<'_>) -> T + Sync,
) -> (Vec<T>, Diagnostics) {
    if looks_like_json(text) {
        if text.len() >= SPLIT_ABOVE {
            if let Some(out) = json_each_split(file, text, &f) {
                return (out, Diagnostics::default());
            }
        }
        match json::parse(file, text) {
            Ok(root) => return (each_json(root, &f), Diagnostics::default()),
            Err(json::Error(Some(at))) => return (Vec::new(), long_scalar(at, None)),
            Err(json::Error(None)) => {}
        }
    }
    yaml_each(file, text, f)
}

/// A large JSON document's `items` parsed in parallel runs, each handed to `f` as soon as
/// it is parsed; `None` (parse it whole) when the split or any run fails.
fn json_each_split<T: Send>(
    file: FileId,
    text: &str,
    f: &(impl Fn(Part<'_>) -> T + Sync),
) -> Option<Vec<T>> {
    use rayon::prelude::*;
    let split = json::split_items(text, MIN_PIECE).filter(|s| s.runs.len() > 1)?;
    let shell = json::parse_shell(file, text, &split).ok()?;
    let runs: Vec<Option<T>> = (0..split.runs.len())
        .into_par_iter()
        .map(|k| {
            let items = json::parse_run(file, text, &split, k).ok()?;
            Some(f(Part::Items {
                list: &shell,
                first: split.runs[k].1,
                items,
            }))
        })
        .collect();
    if runs.iter().any(Option::is_none) {
        return None;
    }
    let mut out = vec![f(Part::Document(shell.clone()))];
    out.extend(runs.into_iter().flatten());
    Some(out)
}

fn yaml_each<T: Send>(
    file: FileId,
    text: &str,
    f: impl Fn(Part<'_>) -> T + Sync,
) -> (Vec<T>, Diagnostics) {
    use rayon::prelude::*;
    let results: Vec<(Vec<T>, Diagnostics)> = plan(text)
        .par_iter()
        .map(|job| match job {
            Job::Documents { line0, text } => {
                let (docs, diags) = parse_yaml_piece(file, text, *line0, default_budget(text));
                let out = docs
                    .into_iter()
                    .map(|d| f(Part::Document(d.root)))
                    .collect();
                (out, diags)
            }
            Job::List(split) => each_list(file, split, &f),
        })
        .collect();
    let mut out = Vec::new();
    let mut diags = Diagnostics::default();
    for (r, d) in results {
        out.extend(r);
        diags.extend(d);
    }
    (out, diags)
}

/// Parse a YAML stream into complete documents, large streams in parallel.
pub fn parse_yaml(file: FileId, text: &str) -> (Vec<Document>, Diagnostics) {
    if text.len() < SPLIT_ABOVE {
        return parse_yaml_piece(file, text, 0, default_budget(text));
    }
    let (parts, diags) = yaml_each(file, text, Whole::from);
    (Whole::assemble(file, parts), diags)
}

fn looks_like_json(text: &str) -> bool {
    let first = text.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
    first.starts_with('{') || first.starts_with('[')
}

/// Streams below this size are parsed in one piece.
const SPLIT_ABOVE: usize = 256 * 1024;
/// Pieces hold at least this much, so tiny documents are not parsed one by one.
const MIN_PIECE: usize = 64 * 1024;
/// JSON list items are decoded this many at a time.
const JSON_CHUNK: usize = 256;

/// Most documents one YAML file may hold: many times a cluster at Kubernetes' tested limits
/// (10k services, their EndpointSlices and 5k nodes are some 30k documents). Each document
/// costs memory until the whole file is read (about 1.3 KB for one that is not even an
/// object), so a million are refused before parsing (see [`too_many_documents`]).
pub const MAX_DOCUMENTS: usize = 250_000;

/// SVC019 when `text` has more than [`MAX_DOCUMENTS`] top-level `---` markers, located at
/// the first one past the limit. A marker is `---` at the start of a line followed by a
/// space, a tab or the end of the line (inside a block scalar it still ends the document).
pub fn too_many_documents(file: FileId, text: &str) -> Option<Diagnostic> {
    let bytes = text.as_bytes();
    let mut seen = 0;
    let mut line = 1u32;
    let mut at = 0;
    while at < bytes.len() {
        let end = bytes[at..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(bytes.len(), |i| at + i);
        let l = &bytes[at..end];
        if l.starts_with(b"---") && matches!(l.get(3), None | Some(b' ' | b'\t' | b'\r')) {
            seen += 1;
            if seen > MAX_DOCUMENTS {
                return Some(
                    Diagnostic::error(
                        "SVC019",
                        format!("more than {MAX_DOCUMENTS} documents in one file; the file was not read"),
                    )
                    .at(Span::new(file, line, 1, 3))
                    .hint("split it, or leave out what svc-compile does not read"),
                );
            }
        }
        line += 1;
        at = end + 1;
    }
    None
}

/// Deepest nesting of lists and mappings a YAML file may have (JSON's parser has the same
/// limit): the tree's recursive walks (decoding, dropping) then stay far from the end of a
/// thread's stack, whatever the input.
pub const MAX_DEPTH: usize = 512;

/// The longest scalar read: the API server refuses a request body over 3 MiB
/// (`MaxRequestBodyBytes: 3 * 1024 * 1024` in k8s.io/apiserver `server.NewConfig`), so no
/// object it stores holds a longer one. A longer scalar is SVC023, and it is dropped at
/// once: never copied into the tree (plain scalars are read in place), never matched
/// against names for "did you mean".
pub const MAX_SCALAR_BYTES: usize = 3 * 1024 * 1024;

/// Alias expansion budget: generous for real manifests, finite for bombs.
fn default_budget(text: &str) -> usize {
    100_000 + text.len() * 4
}

/// A unit of parallel parsing.
enum Job<'a> {
    /// Whole documents, the first starting on 0-based line `line0`.
    Documents { line0: u32, text: &'a str },
    /// One large document with a column-0 `items:` sequence.
    List(ListSplit<'a>),
}

/// A document cut into its shell (the lines before and after the items) and runs of items.
struct ListSplit<'a> {
    whole: (u32, &'a str),
    head: (u32, &'a str),
    tail: (u32, &'a str),
    /// (0-based line, index of the first item, text): each starts with a `-` at column 0,
    /// except the first, which starts with the `items:` line.
    chunks: Vec<(u32, usize, &'a str)>,
    items: usize,
}

/// Lines of `text` with their byte offset and 0-based line number (plus `line0`).
fn lines(text: &str, line0: u32) -> impl Iterator<Item = (usize, u32, &str)> {
    text.split_inclusive('\n')
        .scan((0usize, line0), |(pos, line), l| {
            let r = (*pos, *line, l);
            *pos += l.len();
            *line += 1;
            Some(r)
        })
}

fn is_document_marker(l: &str) -> bool {
    l.starts_with("---") && l[3..].chars().next().is_none_or(|c| c.is_whitespace())
}

/// Cut a stream into jobs: runs of whole documents of at least [`MIN_PIECE`], and large
/// documents with a column-0 `items:` sequence split between items. Small streams are one job.
fn plan(text: &str) -> Vec<Job<'_>> {
    if text.len() < SPLIT_ABOVE {
        return vec![Job::Documents { line0: 0, text }];
    }
    // Documents: (start, first line), each starting at a `---` line (or the stream start).
    let mut docs: Vec<(usize, u32)> = vec![(0, 0)];
    docs.extend(
        lines(text, 0)
            .filter(|&(pos, _, l)| pos > 0 && is_document_marker(l))
            .map(|(pos, line, _)| (pos, line)),
    );
    let mut jobs = Vec::new();
    let (mut group, mut group_line) = (0usize, 0u32);
    for (k, &(start, line)) in docs.iter().enumerate() {
        let end = docs.get(k + 1).map_or(text.len(), |d| d.0);
        let doc = &text[start..end];
        if doc.len() >= SPLIT_ABOVE {
            if let Some(split) = split_list(doc, line) {
                if group < start {
                    jobs.push(Job::Documents {
                        line0: group_line,
                        text: &text[group..start],
                    });
                }
                jobs.push(Job::List(split));
                (group, group_line) = (end, docs.get(k + 1).map_or(0, |d| d.1));
                continue;
            }
        }
        if end - group >= MIN_PIECE {
            jobs.push(Job::Documents {
                line0: group_line,
                text: &text[group..end],
            });
            (group, group_line) = (end, docs.get(k + 1).map_or(0, |d| d.1));
        }
    }
    if group < text.len() {
        jobs.push(Job::Documents {
            line0: group_line,
            text: &text[group..],
        });
    }
    jobs
}

/// Find a column-0 `items:` line followed by column-0 `- ` items and cut between items.
/// Inside such a sequence, every line of an item is indented, blank or a comment, so a line
/// starting with `-` begins an item. (A multi-line quoted scalar could break that rule; the
/// piece that cut it then fails to parse, and the document is parsed whole.)
fn split_list(doc: &str, line0: u32) -> Option<ListSplit<'_>> {
    let mut it = lines(doc, line0);
    let (key, key_line, body) = it
        .by_ref()
        .find(|(_, _, l)| l.trim_end() == "items:")
        .map(|(pos, line, l)| (pos, line, pos + l.len()))?;
    let is_item =
        |l: &str| l.starts_with('-') && l[1..].chars().next().is_none_or(char::is_whitespace);
    let mut chunks: Vec<(u32, usize, &str)> = Vec::new();
    // The first run keeps the `items:` line: a sequence under a key is located differently
    // from one at the root, and this way it is parsed exactly as in the whole document.
    let (mut chunk, mut chunk_line, mut chunk_first) = (key, key_line, 0usize);
    let mut items = 0usize;
    let (mut end, mut tail_line) = (doc.len(), 0);
    for (pos, line, l) in it {
        if is_item(l) {
            if pos == body {
                // The sequence starts right here.
            } else if pos - chunk >= MIN_PIECE {
                chunks.push((chunk_line, chunk_first, &doc[chunk..pos]));
                (chunk, chunk_line, chunk_first) = (pos, line, items);
            }
            items += 1;
        } else if pos == body
            || !(l.starts_with([' ', '#']) || l.trim_start_matches([' ', '\t', '\r']) == "\n")
        {
            // Not a sequence of items (the first line must be one), or its end.
            if pos == body {
                return None;
            }
            (end, tail_line) = (pos, line);
            break;
        }
    }
    chunks.push((chunk_line, chunk_first, &doc[chunk..end]));
    (chunks.len() > 1).then_some(ListSplit {
        whole: (line0, doc),
        head: (line0, &doc[..body]),
        tail: (tail_line, &doc[end..]),
        chunks,
        items,
    })
}

/// Parse a split list: the shell first, then the runs of items in parallel, each handed to
/// `f` as soon as it is parsed. Anything unexpected (a syntax error, an alias across pieces,
/// an item count that differs from the lines) parses the document whole instead, so
/// diagnostics are exactly those of a serial parse.
fn each_list<T: Send>(
    file: FileId,
    split: &ListSplit<'_>,
    f: &(impl Fn(Part<'_>) -> T + Sync),
) -> (Vec<T>, Diagnostics) {
    use rayon::prelude::*;
    let whole = || {
        let (line0, text) = split.whole;
        let (docs, diags) = parse_yaml_piece(file, text, line0, default_budget(text));
        let out = docs
            .into_iter()
            .map(|d| f(Part::Document(d.root)))
            .collect();
        (out, diags)
    };
    let total = split.whole.1.len().max(1);
    let budget = default_budget(split.whole.1);
    let parse_chunk = |k: usize| -> Option<(Span, Vec<Node>)> {
        let (line0, first, text) = split.chunks[k];
        let share = budget * text.len() / total + 1;
        let (docs, diags) = parse_yaml_piece(file, text, line0, share);
        let [doc] = <[Document; 1]>::try_from(docs).ok()?;
        let seq = match doc.root.value {
            Value::Map(entries) if k == 0 => {
                let [entry] = <[Entry; 1]>::try_from(entries).ok()?;
                entry.value
            }
            _ => doc.root,
        };
        let Value::Seq(items) = seq.value else {
            return None;
        };
        let next = split.chunks.get(k + 1).map_or(split.items, |c| c.1);
        (diags.items.is_empty() && items.len() == next - first).then_some((seq.span, items))
    };
    // The first run also tells where the sequence starts, which the shell needs.
    let Some((items_span, first_items)) = parse_chunk(0) else {
        return whole();
    };
    let Some(shell) = list_shell(file, split, items_span) else {
        return whole();
    };
    let part = |first, items| Part::Items {
        list: &shell,
        first,
        items,
    };
    let rest: Vec<Option<T>> = (1..split.chunks.len())
        .into_par_iter()
        .map(|k| parse_chunk(k).map(|(_, items)| f(part(split.chunks[k].1, items))))
        .collect();
    if rest.iter().any(Option::is_none) {
        return whole();
    }
    let mut out = vec![f(Part::Document(shell.clone())), f(part(0, first_items))];
    out.extend(rest.into_iter().flatten());
    (out, Diagnostics::default())
}

/// The document without its items: the head (up to `items:`) and the tail parsed apart and
/// joined, `items` an empty sequence at `items_span`.
fn list_shell(file: FileId, split: &ListSplit<'_>, items_span: Span) -> Option<Node> {
    let one = |(line0, text): (u32, &str)| -> Option<Option<Node>> {
        let (mut docs, diags) = parse_yaml_piece(file, text, line0, default_budget(text));
        if !diags.items.is_empty() || docs.len() > 1 {
            return None;
        }
        Some(docs.pop().map(|d| d.root))
    };
    let mut head = one(split.head)??;
    let tail = one(split.tail)?;
    let Value::Map(entries) = &mut head.value else {
        return None;
    };
    let items = entries.last_mut().filter(|e| e.key == "items")?;
    if items.value.value != Value::Null {
        return None;
    }
    items.value = Node {
        span: items_span,
        value: Value::Seq(Vec::new()),
    };
    match tail.map(|t| t.value) {
        None => {}
        Some(Value::Map(more)) => entries.extend(more),
        Some(_) => return None,
    }
    Some(head)
}

/// A parsed JSON file: a large top-level `items` array is handed out in chunks, in parallel.
fn each_json<T: Send>(mut root: Node, f: &(impl Fn(Part<'_>) -> T + Sync)) -> Vec<T> {
    use rayon::prelude::*;
    let items = match root.get_mut("items").map(|n| &mut n.value) {
        Some(Value::Seq(items)) if items.len() > JSON_CHUNK => std::mem::take(items),
        _ => return vec![f(Part::Document(root))],
    };
    let mut chunks: Vec<(usize, Vec<Node>)> = Vec::new();
    let mut rest = items.into_iter();
    loop {
        let chunk: Vec<Node> = rest.by_ref().take(JSON_CHUNK).collect();
        if chunk.is_empty() {
            break;
        }
        chunks.push((chunks.len() * JSON_CHUNK, chunk));
    }
    let shell = root;
    let mut out = vec![f(Part::Document(shell.clone()))];
    out.par_extend(chunks.into_par_iter().map(|(first, items)| {
        f(Part::Items {
            list: &shell,
            first,
            items,
        })
    }));
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

/// Where the parser stopped, as a span inside `text` (a piece starting at line `line0 + 1`):
/// past the end of the last line (an error found at the end of the input) is the end of
/// that line. Found by fuzzing (`lock_file`): the location named a line the file did not have.
fn error_span(file: FileId, text: &str, line0: u32, line: usize, col: usize) -> Span {
    let lines: Vec<&str> = text.split('\n').collect();
    let (line, col) = match lines.get(line.wrapping_sub(1)) {
        Some(l) => (line, col.min(l.trim_end_matches('\r').chars().count())),
        None => {
            let last = lines.last().copied().unwrap_or("");
            (lines.len(), last.trim_end_matches('\r').chars().count())
        }
    };
    Span::new(file, line as u32 + line0, col as u32 + 1, 1)
}

enum Frame {
    Seq(Span, Vec<Node>, usize),
    Map(Span, Vec<Entry>, Option<(String, Span)>, usize),
}

/// Parse a piece of YAML. Where saphyr stops at an indentation kubectl's go-yaml does not
/// check, indent the lines it refused and parse again:
/// - a flow collection's line written at or left of its block's indentation (a closing
///   `]` under its key: PyYAML and go-yaml accept it, YAML 1.2 does not);
/// - a quoted scalar's continuation lines at or left of its key's indentation (go-yaml's
///   `yaml_parser_scan_flow_scalar` checks no indentation inside a quoted scalar, only for
///   a document marker at column 0 and the end of the input).
///
/// Leading blanks of a quoted scalar's continuation line are folded away, so indenting
/// them leaves its value as written. Nodes and diagnostics on re-indented lines get their
/// written columns back, and a re-indented quoted scalar its written length.
fn parse_yaml_piece(
    file: FileId,
    text: &str,
    line0: u32,
    budget: usize,
) -> (Vec<Document>, Diagnostics) {
    if let Some(at) = long::scalar(file, text, line0) {
        return (Vec::new(), long_scalar(at, None));
    }
    match fast_yaml::parse(file, text, line0) {
        Ok(docs) => return (docs, Diagnostics::default()),
        Err(Some(at)) => return (Vec::new(), long_scalar(at, None)),
        Err(None) => {}
    }
    let out = parse_yaml_strict(file, text, line0, budget);
    if indentation_stop(&out.1, line0).is_none() {
        return out;
    }
    // A release bundle's CRDs can hold hundreds of such scalars: all that a rough scan
    // finds are mended at once, which stands only if each turns out to be a quoted scalar
    // in the parse; otherwise one at a time, as saphyr reports them.
    if let Some(out) = mend(file, text, line0, budget, out, true) {
        return out;
    }
    let out = parse_yaml_strict(file, text, line0, budget);
    mend(file, text, line0, budget, out, false)
        .unwrap_or_else(|| parse_yaml_strict(file, text, line0, budget))
}

/// The re-parses of [`parse_yaml_piece`], from its first parse `out`. With `batch`, the
/// first quoted scalar saphyr refuses has every quoted scalar of the rough scan mended with
/// it. Every scalar mended that saphyr did not report itself (those of the batch, and
/// the one around a tab) must be a quoted scalar of the result, else the answer is `None`.
fn mend(
    file: FileId,
    text: &str,
    line0: u32,
    budget: usize,
    mut out: (Vec<Document>, Diagnostics),
    mut batch: bool,
) -> Option<(Vec<Document>, Diagnostics)> {
    let mut fixed: Option<String> = None;
    // Spaces added at the start of a line (its 1-based line in the file).
    let mut shifts: HashMap<u32, u32> = HashMap::new();
    // Quoted scalars mended: their start as written (1-based line and column) and the
    // 1-based line of their closing quote.
    let mut scalars: HashMap<(u32, u32), u32> = HashMap::new();
    let mut batched: Vec<(u32, u32)> = Vec::new();
    for _ in 0..MAX_REINDENTS {
        let Some(stop) = indentation_stop(&out.1, line0) else {
            break;
        };
        let current = fixed.as_deref().unwrap_or(text);
        // (0-based line of the piece, spaces to add at its start)
        let mut add: std::collections::BTreeMap<u32, usize> = Default::default();
        match stop {
            Stop::Flow(line) => {
                let Some((_, n)) = flow_reindent(current, line) else {
                    break;
                };
                add.insert(line, n);
            }
            Stop::Quoted(..) | Stop::QuotedTab(_) => {
                let all: Vec<&str> = current.split_inclusive('\n').collect();
                // Where saphyr stopped: a scalar's start, or a tab inside one, whose start
                // the rough scan gives (and the parse must then confirm).
                let reported = match stop {
                    Stop::Quoted(line, col) => Some((line, col)),
                    _ => None,
                };
                let mut starts: Vec<(u32, u32)> = reported.into_iter().collect();
                if batch || reported.is_none() {
                    let rough = quoted_starts(current).into_iter();
                    starts.extend(rough.filter(|&s| Some(s) != reported).filter(|&(l, c)| {
                        let Stop::QuotedTab(tab) = stop else {
                            return true;
                        };
                        l < tab && quoted_padding(&all, l, c).is_some_and(|(_, end)| end >= tab)
                    }));
                    batch = false;
                }
                for (l, c) in starts {
                    let Some((lines, end)) = quoted_padding(&all, l, c) else {
                        continue;
                    };
                    if lines.is_empty() {
                        continue;
                    }
                    let file_line = line0 + l + 1;
                    let shift = shifts.get(&file_line).copied().unwrap_or(0);
                    let written = (file_line, (c + 1).saturating_sub(shift));
                    scalars.insert(written, line0 + end + 1);
                    if Some((l, c)) != reported {
                        batched.push(written);
                    }
                    for (pl, n) in lines {
                        let e = add.entry(pl).or_default();
                        *e = (*e).max(n);
                    }
                }
                if add.is_empty() {
                    break;
                }
            }
        }
        let mut next = String::with_capacity(current.len() + add.values().sum::<usize>());
        let mut lines = current.split_inclusive('\n').enumerate();
        for (i, l) in lines.by_ref() {
            if let Some(&n) = add.get(&(i as u32)) {
                next.extend(std::iter::repeat_n(' ', n));
                *shifts.entry(line0 + i as u32 + 1).or_default() += n as u32;
            }
            next.push_str(l);
        }
        out = parse_yaml_strict(file, &next, line0, budget);
        fixed = Some(next);
    }
    if shifts.is_empty() {
        return Some(out);
    }
    let back = |s: &mut Span| {
        if let Some(&add) = shifts.get(&s.line) {
            s.col = s.col.saturating_sub(add).max(1);
        }
    };
    for d in &mut out.0 {
        unshift(&mut d.root, &back);
    }
    for d in &mut out.1.items {
        d.span.as_mut().map(back);
        d.related.iter_mut().for_each(|r| back(&mut r.span));
    }
    // Each mended scalar: its length as written; those of the batch must all be found.
    let mut found: std::collections::HashSet<(u32, u32)> = Default::default();
    let inserted = |from: u32, to: u32| -> u32 {
        (from + 1..=to)
            .map(|l| shifts.get(&l).copied().unwrap_or(0))
            .sum()
    };
    let mut fix = |n: &mut Node| {
        if let Value::Scalar { plain: false, .. } = n.value {
            if let Some(&end) = scalars.get(&(n.span.line, n.span.col)) {
                n.span.len = n.span.len.saturating_sub(inserted(n.span.line, end));
                found.insert((n.span.line, n.span.col));
            }
        }
    };
    for d in &mut out.0 {
        each_node(&mut d.root, &mut fix);
    }
    batched.iter().all(|s| found.contains(s)).then_some(out)
}

fn each_node(n: &mut Node, f: &mut impl FnMut(&mut Node)) {
    f(n);
    match &mut n.value {
        Value::Seq(items) => items.iter_mut().for_each(|i| each_node(i, f)),
        Value::Map(es) => es.iter_mut().for_each(|e| each_node(&mut e.value, f)),
        _ => {}
    }
}

/// At most this many re-parses of one piece.
const MAX_REINDENTS: usize = 64;

/// Where saphyr stopped at an indentation: a flow collection's line, the start of a
/// quoted scalar, or the line of a tab a quoted scalar's continuation line starts with
/// (0-based, in the piece; the column in characters).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stop {
    Flow(u32),
    Quoted(u32, u32),
    QuotedTab(u32),
}

/// How the parse ended, if at an indentation [`parse_yaml_piece`] may mend.
fn indentation_stop(diags: &Diagnostics, line0: u32) -> Option<Stop> {
    // saphyr says "tab cannot be used as indentation" inside a quoted scalar only.
    let d = diags.items.iter().find(|d| {
        d.code == "SVC001"
            && (d.message.starts_with("invalid YAML: invalid indentation")
                || d.message == "invalid YAML: tab cannot be used as indentation")
    })?;
    let s = d.span?;
    let line = s.line - 1 - line0;
    Some(match d.message.as_str() {
        "invalid YAML: invalid indentation in quoted scalar" => Stop::Quoted(line, s.col - 1),
        "invalid YAML: tab cannot be used as indentation" => Stop::QuotedTab(line),
        _ => Stop::Flow(line),
    })
}

/// The quoted scalar whose opening quote is at 0-based `line` and character `col` of
/// `text`: the continuation lines to indent (0-based line, spaces) so that each starts
/// right of the opening quote (saphyr asks for more than its key's indentation; the quote
/// is further right than any indentation saphyr asks for), and the line of its closing
/// quote. A line of blanks only is left as it is (saphyr does not check it); a document
/// marker at column 0 ends the scan (go-yaml refuses it, and so does saphyr). `None` when
/// no quoted scalar starts there or it does not end.
fn quoted_padding(lines: &[&str], line: u32, col: u32) -> Option<(Vec<(u32, usize)>, u32)> {
    let mut lines = lines.iter().enumerate().skip(line as usize);
    let (_, first) = lines.next()?;
    let at = first.char_indices().nth(col as usize)?.0;
    let quote = first[at..]
        .chars()
        .next()
        .filter(|&q| q == '\'' || q == '"')?;
    let target = col as usize;
    // The rest of a line after the opening quote or a line's leading blanks: whether the
    // scalar ends on it. An escaped line break (`\` last) continues on the next line.
    let closes = |rest: &str| -> bool {
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\'' if quote == '\'' => {
                    if chars.peek() == Some(&'\'') {
                        chars.next();
                    } else {
                        return true;
                    }
                }
                '"' if quote == '"' => return true,
                '\\' if quote == '"' => {
                    chars.next();
                }
                _ => {}
            }
        }
        false
    };
    if closes(&first[at + 1..]) {
        return Some((Vec::new(), line));
    }
    let mut pad = Vec::new();
    for (i, l) in lines {
        let body = l.trim_end_matches(['\n', '\r']);
        let content = body.trim_start_matches([' ', '\t']);
        if content.is_empty() {
            continue;
        }
        if is_document_marker(body)
            || body.starts_with("...") && body[3..].chars().next().is_none_or(char::is_whitespace)
        {
            // Where saphyr then stops, as go-yaml does.
            return Some((pad, i as u32));
        }
        let leading = &body[..body.len() - content.len()];
        let indent = leading.chars().count();
        if leading.contains('\t') {
            pad.push((i as u32, target));
        } else if indent < target {
            pad.push((i as u32, target - indent));
        }
        if closes(content) {
            return Some((pad, i as u32));
        }
    }
    None
}

/// The quoted scalars of `text` that go on past their line, by a rough scan: 0-based line
/// and character column of each opening quote. A quote counts where a node starts: after
/// `key: `, a sequence's `- `, `[`, `{` or `,`; not inside words or plain scalars (`a
/// "b` in a description), comments or block scalars. A line that starts with a quote
/// (a quoted key, or a plain or flow scalar going on) starts none that goes on. Rough all
/// the same, which is why [`mend`] checks each against the parse.
fn quoted_starts(text: &str) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let all: Vec<&str> = text.split_inclusive('\n').collect();
    let mut block_scalar: Option<usize> = None;
    let mut i = 0;
    'lines: while i < all.len() {
        let l = all[i];
        let line = i as u32;
        i += 1;
        let indent = l.len() - l.trim_start_matches(' ').len();
        let content = l.trim();
        if let Some(b) = block_scalar {
            if content.is_empty() || indent > b {
                continue;
            }
            block_scalar = None;
        }
        if is_document_marker(l) {
            continue;
        }
        let chars: Vec<char> = l.trim_end_matches(['\n', '\r']).chars().collect();
        let blank_after = |k: usize| chars.get(k + 1).is_none_or(|c| *c == ' ' || *c == '\t');
        // Whether a node may start here; `None` at the line's start.
        let mut node: Option<bool> = None;
        let mut k = 0;
        while k < chars.len() {
            let c = chars[k];
            match c {
                ' ' | '\t' => {}
                '#' if k == 0 || matches!(chars[k - 1], ' ' | '\t') => break,
                '\'' | '"' if node != Some(false) => {
                    let Some((_, end)) = quoted_padding(&all, line, k as u32) else {
                        // It does not end: saphyr's error stands.
                        return out;
                    };
                    if end != line {
                        if node == Some(true) {
                            out.push((line, k as u32));
                            i = end as usize + 1;
                        }
                        continue 'lines;
                    }
                    // Past its closing quote.
                    k += 1;
                    while k < chars.len() {
                        match chars[k] {
                            '\\' if c == '"' => k += 1,
                            '\'' if c == '\'' && chars.get(k + 1) == Some(&'\'') => k += 1,
                            q if q == c => break,
                            _ => {}
                        }
                        k += 1;
                    }
                    node = Some(false);
                }
                '-' | '?' if node != Some(false) && blank_after(k) => node = Some(true),
                ':' if blank_after(k) => node = Some(true),
                '[' | '{' | ',' => node = Some(true),
                _ => node = Some(false),
            }
            k += 1;
        }
        let value = content
            .rsplit_once(": ")
            .map(|(_, v)| v)
            .or_else(|| content.strip_prefix("- "))
            .unwrap_or(content);
        if (value.starts_with('|') || value.starts_with('>'))
            && value[1..]
                .chars()
                .all(|c| matches!(c, '+' | '-' | '0'..='9'))
        {
            block_scalar = Some(indent);
        }
    }
    out
}

/// If 0-based `line` of `text` lies inside a flow collection (`[`/`{` still open), the
/// byte offset of its start and how many spaces put it two columns right of the line that
/// opened the innermost collection. A rough scan: quoted strings, comments and block
/// scalars are skipped; it only decides whether a parse that failed is tried again.
fn flow_reindent(text: &str, line: u32) -> Option<(usize, usize)> {
    let mut open: Vec<usize> = Vec::new(); // indentation of the line of each open bracket
    let mut block_scalar: Option<usize> = None;
    let mut offset = 0;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        let indent = l.len() - l.trim_start_matches(' ').len();
        let content = l.trim();
        if i as u32 == line {
            let want = open.last()? + 2;
            return (want > indent).then_some((offset, want - indent));
        }
        offset += l.len();
        if let Some(b) = block_scalar {
            if content.is_empty() || indent > b {
                continue;
            }
            block_scalar = None;
        }
        if is_document_marker(l) {
            open.clear();
            continue;
        }
        let mut quote: Option<char> = None;
        let mut prev = ' ';
        let mut chars = content.chars().peekable();
        while let Some(c) = chars.next() {
            match quote {
                Some('"') if c == '\\' => {
                    chars.next();
                }
                Some(q) if c == q => {
                    if q == '\'' && chars.peek() == Some(&'\'') {
                        chars.next();
                    } else {
                        quote = None;
                    }
                }
                Some(_) => {}
                None => match c {
                    '#' if prev == ' ' => break,
                    '\'' | '"' if matches!(prev, ' ' | ':' | '-' | '[' | '{' | ',') => {
                        quote = Some(c)
                    }
                    '[' | '{' => open.push(indent),
                    ']' | '}' => {
                        open.pop();
                    }
                    _ => {}
                },
            }
            prev = c;
        }
        let value = content
            .rsplit_once(": ")
            .map(|(_, v)| v)
            .or_else(|| content.strip_prefix("- "))
            .unwrap_or(content);
        if open.is_empty()
            && (value.starts_with('|') || value.starts_with('>'))
            && value[1..]
                .chars()
                .all(|c| matches!(c, '+' | '-' | '0'..='9'))
        {
            block_scalar = Some(indent);
        }
    }
    None
}

fn unshift(n: &mut Node, back: &impl Fn(&mut Span)) {
    back(&mut n.span);
    match &mut n.value {
        Value::Seq(items) => items.iter_mut().for_each(|i| unshift(i, back)),
        Value::Map(es) => es.iter_mut().for_each(|e| {
            back(&mut e.key_span);
            unshift(&mut e.value, back)
        }),
        _ => {}
    }
}

fn parse_yaml_strict(
    file: FileId,
    text: &str,
    line0: u32,
    budget: usize,
) -> (Vec<Document>, Diagnostics) {
    let mut diags = Diagnostics::default();
    let mut docs = Vec::new();
    let mut nodes_made: usize = 0;
    let mut anchors: HashMap<usize, Node> = HashMap::new();
    // Anchors of the documents before this one. saphyr's event stream keeps them across
    // `---`; kubectl's go-yaml does not (its `parser.document` starts an empty anchor map),
    // and kubectl splits the stream into documents before parsing anyway.
    let mut earlier: HashMap<usize, Span> = HashMap::new();
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
                    let span = node.span;
                    let key = match node.value {
                        Value::Scalar { text, .. } => text,
                        Value::Null => String::new(),
                        _ => {
                            diags.push(
                                Diagnostic::error(
                                    "SVC001",
                                    "mapping keys must be plain strings, not lists or mappings",
                                )
                                .at(span),
                            );
                            String::new()
                        }
                    };
                    *pending = Some((key, span));
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
        let (ev, sp) = match parser.next_event() {
            None => break,
            Some(Ok(x)) => x,
            Some(Err(e)) => {
                let m = e.marker();
                diags.push(
                    Diagnostic::error("SVC001", format!("invalid YAML: {}", e.info()))
                        .at(error_span(file, text, line0, m.line(), m.col()))
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
                earlier.extend(anchors.drain().map(|(id, n)| (id, n.span)));
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
            Event::Scalar(text, _, _, _) if text.len() > MAX_SCALAR_BYTES => {
                diags.extend(long_scalar(span, Some(text.len())));
                return (docs, diags);
            }
            Event::Scalar(text, style, anchor, tag) => {
                nodes_made += 1;
                let plain =
                    style == ScalarStyle::Plain && tag.as_ref().is_none_or(|t| t.suffix != "str");
                let value = if plain && is_null(&text) {
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
            Event::SequenceStart(..) | Event::MappingStart(..) if stack.len() >= MAX_DEPTH => {
                diags.push(
                    Diagnostic::error(
                        "SVC001",
                        format!("invalid YAML: nesting deeper than {MAX_DEPTH} levels"),
                    )
                    .at(span)
                    .hint("nothing after this point in the file was read; Kubernetes objects nest a few levels deep"),
                );
                return (docs, diags);
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
                            value: Value::Map(merge_keys(entries)),
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
                if let Some(&defined) = earlier.get(&id) {
                    let name = alias_name(text, &sp);
                    diags.push(
                        Diagnostic::error(
                            "SVC001",
                            format!("invalid YAML: alias `*{name}` names an anchor defined in an earlier document; anchors belong to the document that defines them"),
                        )
                        .at(span)
                        .related(defined, format!("`&{name}` is defined here, in an earlier document"))
                        .hint(format!("kubectl parses each document on its own and refuses this one (unknown anchor '{name}' referenced); define `&{name}` again in this document or write the value out; nothing after this point in the file was read")),
                    );
                    return (docs, diags);
                }
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

/// SVC023 for the scalar starting at `at` (`bytes` long, when the parser knows).
fn long_scalar(at: Span, bytes: Option<usize>) -> Diagnostics {
    let size = match bytes {
        Some(n) => format!("a scalar of {n} bytes"),
        None => "a scalar".to_string(),
    };
    let mut d = Diagnostics::default();
    d.push(
        Diagnostic::error(
            "SVC023",
            format!("{size} longer than the API server takes a whole object ({MAX_SCALAR_BYTES} bytes); the rest of the file was not read"),
        )
        .at(Span { len: 1, ..at })
        .hint("no cluster can hold this object (the API server refuses request bodies over 3 MiB); remove or shorten the value"),
    );
    d
}

/// The name an alias event's span (`*name`) writes, for messages.
fn alias_name(text: &str, sp: &saphyr_parser::Span) -> String {
    text.chars()
        .skip(sp.start.index())
        .take(sp.len())
        .collect::<String>()
        .trim_start_matches('*')
        .to_string()
}

/// Whether a plain scalar is YAML's null (both YAML paths read it so).
fn is_null(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

/// YAML 1.1 merge keys (`<<: *base`, `<<: [*a, *b]`), which kubectl's go-yaml applies:
/// the merged mappings' entries are added unless the mapping writes the key itself (or an
/// earlier merged mapping has it). A `<<` whose value is no mapping stays an entry.
fn merge_keys(entries: Vec<Entry>) -> Vec<Entry> {
    if !entries.iter().any(|e| e.key == "<<") {
        return entries;
    }
    let mut own: Vec<Entry> = Vec::with_capacity(entries.len());
    let mut merged: Vec<Entry> = Vec::new();
    for e in entries {
        match (e.key == "<<", e.value.value) {
            (true, Value::Map(es)) => merged.extend(es),
            (true, Value::Seq(items)) if items.iter().all(|i| matches!(i.value, Value::Map(_))) => {
                for i in items {
                    if let Value::Map(es) = i.value {
                        merged.extend(es);
                    }
                }
            }
            (_, value) => own.push(Entry {
                value: Node {
                    span: e.value.span,
                    value,
                },
                ..e
            }),
        }
    }
    let mut keys: std::collections::HashSet<String> = own.iter().map(|e| e.key.clone()).collect();
    for e in merged {
        if keys.insert(e.key.clone()) {
            own.push(e);
        }
    }
    own
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
    use std::cell::Cell;

    /// Not JSON this parser reads (the caller parses it as YAML), or, with the span, a string
    /// longer than [`super::MAX_SCALAR_BYTES`] (SVC023, nothing copied).
    pub struct Error(pub Option<Span>);

    struct P<'a> {
        b: &'a [u8],
        i: usize,
        line: u32,
        line_start: usize,
        file: FileId,
        depth: u32,
        /// The column (in characters) at byte `.0` of the current line, so that spans on a
        /// long line are not counted from its start each time.
        col: Cell<(usize, u32)>,
        /// The `items` array that [`parse_shell`] leaves out: its `[` and `]`.
        skip: Option<(Pos, Pos)>,
    }

    /// A byte position with its line, to start a parser there.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Pos {
        i: usize,
        line: u32,
        line_start: usize,
    }

    impl<'a> P<'a> {
        fn at(file: FileId, b: &'a [u8], pos: Pos) -> P<'a> {
            P {
                b,
                i: pos.i,
                line: pos.line,
                line_start: pos.line_start,
                file,
                depth: 0,
                col: Cell::new((pos.line_start, 0)),
                skip: None,
            }
        }
    }

    fn start(text: &str) -> Pos {
        // Columns count from after a byte-order mark.
        let bom = if text.starts_with('\u{feff}') { 3 } else { 0 };
        Pos {
            i: bom,
            line: 1,
            line_start: bom,
        }
    }

    pub fn parse(file: FileId, text: &str) -> Result<Node, Error> {
        P::at(file, text.as_bytes(), start(text)).whole()
    }

    /// Where the elements of a large document's top-level `items` array are: found by a
    /// quick scan (strings skipped, brackets counted), so that runs of items can be parsed
    /// in parallel.
    pub struct ItemsSplit {
        /// The array's `[` and `]`.
        open: Pos,
        close: Pos,
        /// Where each run of items starts, and the index of its first item.
        pub runs: Vec<(Pos, usize)>,
        pub items: usize,
    }

    /// Find the top-level `items` array and cut it into runs of about `run` bytes. `None`
    /// when there is no such array or the text is not well-formed enough to tell.
    pub fn split_items(text: &str, run: usize) -> Option<ItemsSplit> {
        let b = text.as_bytes();
        let start = start(text);
        // Lines are counted only where a position is kept, from the last one kept.
        let mut lines = Lines {
            b,
            at: start.i,
            line: 1,
            // Columns count from after a byte-order mark.
            line_start: start.line_start,
        };
        let mut i = start.i;
        let mut depth = 0u32;
        let mut open: Option<Pos> = None;
        let mut runs: Vec<(Pos, usize)> = Vec::new();
        let mut items = 0usize;
        // Starts an item at the first non-blank byte from `i` (after `[` or a `,`).
        let item_at =
            |i: usize, lines: &mut Lines, runs: &mut Vec<(Pos, usize)>, items: &mut usize| {
                let j = i + b[i..].iter().position(|c| !c.is_ascii_whitespace())?;
                if b[j] != b']' {
                    if runs.last().is_none_or(|r| j - r.0.i >= run) {
                        runs.push((lines.pos(j), *items));
                    }
                    *items += 1;
                }
                Some(())
            };
        loop {
            // Only these bytes matter. The rest is mostly indentation: skipped eight
            // spaces at a time.
            const SPACES: u64 = u64::from_ne_bytes([b' '; 8]);
            loop {
                let c = *b.get(i)?;
                if matches!(c, b'"' | b'{' | b'}' | b'[' | b']' | b',') {
                    break;
                }
                let word = b
                    .get(i..i + 8)
                    .map(|w| u64::from_ne_bytes(w.try_into().unwrap()));
                i += if word == Some(SPACES) { 8 } else { 1 };
            }
            match b[i] {
                b'"' => {
                    let from = i + 1;
                    i = from;
                    loop {
                        i += memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
                        if b[i] == b'\\' {
                            i += 2;
                        } else {
                            break;
                        }
                    }
                    // A key `"items"` of the root object, followed by `: [`, opens the array.
                    if depth == 1 && open.is_none() && &b[from..i] == b"items" {
                        let mut j = i + 1;
                        let blank = |j: &mut usize| {
                            while b.get(*j).is_some_and(|c| c.is_ascii_whitespace()) {
                                *j += 1;
                            }
                        };
                        blank(&mut j);
                        if b.get(j) == Some(&b':') {
                            j += 1;
                            blank(&mut j);
                            if b.get(j) == Some(&b'[') {
                                open = Some(lines.pos(j));
                                depth = 2;
                                item_at(j + 1, &mut lines, &mut runs, &mut items)?;
                                i = j;
                            }
                        }
                    }
                }
                b',' if depth == 2 && open.is_some() => {
                    item_at(i + 1, &mut lines, &mut runs, &mut items)?;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth = depth.checked_sub(1)?;
                    if let (1, Some(open)) = (depth, open) {
                        let close = lines.pos(i);
                        return Some(ItemsSplit {
                            open,
                            close,
                            runs,
                            items,
                        });
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }

    /// Line numbers of increasing positions, counted on from the last one asked for.
    struct Lines<'a> {
        b: &'a [u8],
        at: usize,
        line: u32,
        line_start: usize,
    }

    impl Lines<'_> {
        fn pos(&mut self, i: usize) -> Pos {
            let seg = &self.b[self.at..i];
            if let Some(k) = memchr::memrchr(b'\n', seg) {
                self.line += memchr::memchr_iter(b'\n', seg).count() as u32;
                self.line_start = self.at + k + 1;
            }
            self.at = i;
            Pos {
                i,
                line: self.line,
                line_start: self.line_start,
            }
        }
    }

    /// The document with its `items` array empty (located at its `[`).
    pub fn parse_shell(file: FileId, text: &str, split: &ItemsSplit) -> Result<Node, Error> {
        let mut p = P::at(file, text.as_bytes(), start(text));
        p.skip = Some((split.open, split.close));
        p.whole()
    }

    /// The items of run `k`: values separated by commas, up to the next run or the `]`.
    pub fn parse_run(
        file: FileId,
        text: &str,
        split: &ItemsSplit,
        k: usize,
    ) -> Result<Vec<Node>, Error> {
        let (from, first) = split.runs[k];
        let end = split.runs.get(k + 1).map_or(split.items, |r| r.1);
        let mut p = P::at(file, text.as_bytes(), from);
        // As deep as in the whole document: inside the root and the array.
        p.depth = 2;
        let mut items = Vec::with_capacity(end - first);
        loop {
            items.push(p.value()?);
            p.ws();
            match p.b.get(p.i) {
                Some(b',') if items.len() < end - first => {
                    p.i += 1;
                    p.ws();
                }
                Some(b',') if split.runs.get(k + 1).is_some() => return Ok(items),
                Some(b']') if p.i == split.close.i && items.len() == end - first => {
                    return Ok(items)
                }
                _ => return Err(Error(None)),
            }
        }
    }

    impl P<'_> {
        /// One value and nothing after it but whitespace.
        fn whole(mut self) -> Result<Node, Error> {
            self.ws();
            let v = self.value()?;
            self.ws();
            if self.i != self.b.len() {
                return Err(Error(None));
            }
            Ok(v)
        }

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
            // Columns count characters: UTF-8 lead bytes since the line start, counted on
            // from the last span on this line.
            let chars = |b: &[u8]| b.iter().filter(|&&c| (c & 0xC0) != 0x80).count() as u32;
            let (at, col) = self.col.get();
            let col = if at >= self.line_start && at <= start {
                col + chars(&self.b[at..start])
            } else {
                chars(&self.b[self.line_start..start])
            };
            self.col.set((start, col));
            let len = chars(&self.b[start..end]);
            Span::new(self.file, self.line, col + 1, len.max(1))
        }
        fn value(&mut self) -> Result<Node, Error> {
            self.depth += 1;
            if self.depth as usize > super::MAX_DEPTH {
                return Err(Error(None));
            }
            let start = self.i;
            let r = match self.b.get(self.i).ok_or(Error(None))? {
                b'[' if self.skip.is_some_and(|(open, _)| open.i == start) => {
                    let (_, close) = self.skip.expect("checked");
                    let span = self.span(start, start + 1);
                    (self.i, self.line, self.line_start) =
                        (close.i + 1, close.line, close.line_start);
                    Node {
                        span,
                        value: Value::Seq(Vec::new()),
                    }
                }
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
                                return Err(Error(None));
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
                                _ => return Err(Error(None)),
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
                                _ => return Err(Error(None)),
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
                    let text =
                        std::str::from_utf8(&self.b[start..self.i]).map_err(|_| Error(None))?;
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
                        _ => return Err(Error(None)),
                    }
                }
            };
            self.depth -= 1;
            Ok(r)
        }
        fn string(&mut self) -> Result<String, Error> {
            if self.b.get(self.i) != Some(&b'"') {
                return Err(Error(None));
            }
            let start = self.i;
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
                if out.len() + (self.i - run_start) > super::MAX_SCALAR_BYTES {
                    return Err(Error(Some(self.span(start, start + 1))));
                }
                out.push_str(
                    std::str::from_utf8(&self.b[run_start..self.i]).map_err(|_| Error(None))?,
                );
                match self.b.get(self.i) {
                    Some(b'"') => {
                        self.i += 1;
                        return Ok(out);
                    }
                    Some(b'\\') => {
                        self.i += 1;
                        let c = *self.b.get(self.i).ok_or(Error(None))?;
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
                                        return Err(Error(None));
                                    }
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    cp = 0x10000
                                        + ((cp - 0xD800) << 10)
                                        + (lo.wrapping_sub(0xDC00) & 0x3FF);
                                }
                                out.push(char::from_u32(cp).ok_or(Error(None))?);
                            }
                            _ => return Err(Error(None)),
                        }
                    }
                    _ => return Err(Error(None)),
                }
            }
        }
        fn hex4(&mut self) -> Result<u32, Error> {
            let s = self.b.get(self.i..self.i + 4).ok_or(Error(None))?;
            self.i += 4;
            u32::from_str_radix(std::str::from_utf8(s).map_err(|_| Error(None))?, 16)
                .map_err(|_| Error(None))
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

    /// Found by fuzzing (`lock_file`): an error at the end of a file whose last line has no
    /// line break was located on the line after it, which the file does not have.
    #[test]
    fn an_error_at_the_end_is_located_inside_the_file() {
        let mut text = String::from("services:\n- service: a/b\n  clusterIPs: [x]\n");
        text.push_str(&"\u{1}".repeat(50));
        let (_, d) = parse_file(FileId(0), &text);
        let s = d.items[0].span.expect("located");
        assert_eq!((d.items[0].code, s.line, s.col), ("SVC001", 4, 51));
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
    fn merge_keys_add_what_the_mapping_does_not_write() {
        let n = one("a: &a {x: 1, y: 2}\nb: &b {y: 3, z: 4}\nc:\n  <<: [*a, *b]\n  x: 0\n");
        let c = n.get("c").unwrap();
        let keys: Vec<(&str, &str)> = match &c.value {
            Value::Map(es) => es
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str().unwrap()))
                .collect(),
            _ => panic!("{c:?}"),
        };
        assert_eq!(keys, [("x", "0"), ("y", "2"), ("z", "4")]);
        // A merged entry keeps the span where it was written (line 1).
        match &c.value {
            Value::Map(es) => assert_eq!(es[1].key_span.line, 1),
            _ => unreachable!(),
        }
        let single = one("base: &b {p: 1}\nd:\n  <<: *b\n");
        assert_eq!(
            single.get("d").unwrap().get("p").unwrap().as_str(),
            Some("1")
        );
    }

    #[test]
    fn flow_lines_left_of_their_key_are_read_as_kubectl_does() {
        let text = "a:\n  b: [\n    1,\n  ]\n  c: [x,\ny]\nd: 2\n";
        let (docs, d) = parse_yaml_piece(FileId(0), text, 0, usize::MAX);
        assert!(d.items.is_empty(), "{d:?}");
        let a = docs[0].root.get("a").unwrap();
        let c = a.get("c").unwrap();
        match &c.value {
            Value::Seq(items) => {
                assert_eq!(items[1].as_str(), Some("y"));
                // Written at line 6, column 1; read at a shifted column.
                assert_eq!((items[1].span.line, items[1].span.col), (6, 1));
            }
            _ => panic!("{c:?}"),
        }
        assert_eq!(docs[0].root.get("d").unwrap().as_str(), Some("2"));
        // A block mapping written left of its place is still an error.
        let (_, d) = parse_yaml_piece(FileId(0), "a:\n    b: 1\n  c: 2\n", 0, usize::MAX);
        assert_eq!(d.items.len(), 1, "{d:?}");
    }

    /// go-yaml's scanner checks no indentation inside a quoted scalar (only a document
    /// marker at column 0), so kubectl reads continuation lines at, or left of, their key's
    /// indentation; saphyr refuses them. Read as kubectl reads them: the same values as
    /// with the lines indented further, at the columns and lengths written.
    #[test]
    fn quoted_scalars_continued_left_of_their_place_are_read_as_kubectl_does() {
        let text = "a:\n  d: 'one\n  two'\n  e: \"three\n  \\\"four\"\n  f: 'x\n\n left'\n  g:\n  - 'p\n  q'\n  h: \"\\\n    tab\n\t r\"\n  i: 1\n";
        let (docs, d) = parse_yaml_piece(FileId(0), text, 0, usize::MAX);
        assert!(d.items.is_empty(), "{d:?}");
        let a = docs[0].root.get("a").unwrap();
        let value = |k: &str| a.get(k).unwrap().as_str().unwrap().to_string();
        assert_eq!(value("d"), "one two");
        assert_eq!(value("e"), "three \"four");
        assert_eq!(value("f"), "x\nleft");
        assert_eq!(value("h"), "tab r");
        assert_eq!(value("i"), "1");
        match &a.get("g").unwrap().value {
            Value::Seq(items) => assert_eq!(items[0].as_str(), Some("p q")),
            g => panic!("{g:?}"),
        }
        // Where and how long each is written: `'one` + line break + `  two'`.
        let d_span = a.get("d").unwrap().span;
        assert_eq!((d_span.line, d_span.col, d_span.len), (2, 6, 11));
        let f_span = a.get("f").unwrap().span;
        assert_eq!((f_span.line, f_span.col, f_span.len), (6, 6, 10));
        // Mended one at a time, as saphyr reports them (a tab at the start of a line
        // included), it is the same tree.
        let first = parse_yaml_strict(FileId(0), text, 0, usize::MAX);
        let (one_by_one, d) = mend(FileId(0), text, 0, usize::MAX, first, false).unwrap();
        assert!(d.items.is_empty(), "{d:?}");
        assert_eq!(diff(&one_by_one[0].root, &docs[0].root, ""), None);
        // The same text with every continuation line indented further (as YAML 1.2 asks)
        // gives the same values.
        let deeper = "a:\n  d: 'one\n     two'\n  e: \"three\n     \\\"four\"\n  f: 'x\n\n     left'\n  g:\n  - 'p\n     q'\n  h: \"\\\n    tab\n     r\"\n  i: 1\n";
        let (same, d) = parse_yaml_piece(FileId(0), deeper, 0, usize::MAX);
        assert!(d.items.is_empty(), "{d:?}");
        let b = same[0].root.get("a").unwrap();
        for k in ["d", "e", "f", "h", "i"] {
            assert_eq!(b.get(k).unwrap().value, a.get(k).unwrap().value, "{k}");
        }
        // A document marker at column 0 ends the scalar for go-yaml and saphyr alike.
        let text = "a:\n  d: 'one\n  two\n---\n  three'\n";
        let (_, d) = parse_yaml_piece(FileId(0), text, 0, usize::MAX);
        assert_eq!(d.items.len(), 1, "{d:?}");
        assert!(d.items[0].message.contains("document indicator"), "{d:?}");
    }

    /// The rough scan can take a quote inside a plain scalar for a quoted scalar; mending
    /// all at once then gives a tree without it, and the scalars are mended one at a time
    /// as saphyr reports them.
    #[test]
    fn a_quote_inside_a_plain_scalar_is_not_mended() {
        // `b` is a plain scalar going on over two lines, one starting with `- "`; indenting
        // the line after it as if a quoted scalar went on would join `c` to it.
        let text = "a:\n  b: see\n    - \"this\n  c: x\"\n  d: 'one\n  two'\n";
        assert_eq!(quoted_starts(text), [(2, 6), (4, 5)]);
        let first = parse_yaml_strict(FileId(0), text, 0, usize::MAX);
        assert!(mend(FileId(0), text, 0, usize::MAX, first, true).is_none());
        let (docs, d) = parse_yaml_piece(FileId(0), text, 0, usize::MAX);
        assert!(d.items.is_empty(), "{d:?}");
        let a = docs[0].root.get("a").unwrap();
        assert_eq!(a.get("b").unwrap().as_str(), Some("see - \"this"));
        assert_eq!(a.get("c").unwrap().as_str(), Some("x\""));
        assert_eq!(a.get("d").unwrap().as_str(), Some("one two"));
    }

    /// A release bundle's CRD holds hundreds of such scalars: more than one re-parse per
    /// scalar would allow. They are mended at once, in every piece of a split file.
    #[test]
    fn many_quoted_scalars_are_mended_at_once() {
        let mut text = String::from("kind: List\nitems:\n");
        for i in 0..20_000 {
            text.push_str(&format!(
                "- name: item-{i}\n  description: 'the {i}th\n  item, \"quoted\" here'\n"
            ));
        }
        assert!(text.len() > SPLIT_ABOVE);
        let (serial, d0) = parse_yaml_piece(FileId(0), &text, 0, usize::MAX);
        assert!(d0.items.is_empty(), "{:?}", d0.items.first());
        let (parallel, d1) = parse_file(FileId(0), &text);
        assert!(d1.items.is_empty(), "{:?}", d1.items.first());
        assert_eq!(diff(&serial[0].root, &parallel[0].root, ""), None);
        let items = serial[0].root.get("items").unwrap();
        let Value::Seq(items) = &items.value else {
            panic!()
        };
        assert_eq!(items.len(), 20_000);
        assert_eq!(
            items[19_999].get("description").unwrap().as_str(),
            Some("the 19999th item, \"quoted\" here")
        );
    }

    /// kubectl parses each document on its own: an anchor of one document is unknown in
    /// the next (go-yaml's `parser.document` starts an empty anchor map).
    #[test]
    fn anchors_belong_to_their_document() {
        let (docs, d) = parse_file(
            FileId(0),
            "a: &x 1\nb: *x\n---\nc: &y 2\n---\nd: *y\ne: 3\n",
        );
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].root.get("b").unwrap().as_str(), Some("1"));
        assert_eq!(d.items.len(), 1, "{d:?}");
        let e = &d.items[0];
        assert_eq!(e.code, "SVC001");
        assert!(
            e.message.contains("`*y`") && e.message.contains("earlier document"),
            "{e:?}"
        );
        let at = e.span.unwrap();
        assert_eq!((at.line, at.col), (6, 4));
        assert_eq!(e.related[0].span.line, 4);
        // An anchor defined again in the later document is that document's.
        let (docs, d) = parse_file(FileId(0), "a: &x 1\n---\nb: &x 2\nc: *x\n");
        assert!(d.items.is_empty(), "{d:?}");
        assert_eq!(docs[1].root.get("c").unwrap().as_str(), Some("2"));
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

    /// The first difference between two trees, for a readable failure.
    fn diff(a: &Node, b: &Node, path: &str) -> Option<String> {
        if a.span != b.span {
            return Some(format!("{path}: span {:?} vs {:?}", a.span, b.span));
        }
        match (&a.value, &b.value) {
            (Value::Map(x), Value::Map(y)) => {
                for (e, f) in x.iter().zip(y) {
                    if e.key != f.key || e.key_span != f.key_span {
                        return Some(format!(
                            "{path}: key {} {:?} vs {} {:?}",
                            e.key, e.key_span, f.key, f.key_span
                        ));
                    }
                    if let Some(d) = diff(&e.value, &f.value, &format!("{path}.{}", e.key)) {
                        return Some(d);
                    }
                }
                (x.len() != y.len()).then(|| format!("{path}: {} vs {} entries", x.len(), y.len()))
            }
            (Value::Seq(x), Value::Seq(y)) => {
                for (i, (e, f)) in x.iter().zip(y).enumerate() {
                    if let Some(d) = diff(e, f, &format!("{path}[{i}]")) {
                        return Some(d);
                    }
                }
                (x.len() != y.len()).then(|| format!("{path}: {} vs {} items", x.len(), y.len()))
            }
            (x, y) => (x != y).then(|| format!("{path}: {x:?} vs {y:?}")),
        }
    }

    /// The parallel split gives the tree a serial parse gives, spans included.
    #[test]
    fn list_split_matches_serial_parse() {
        use crate::synth::{generate, Format, Shape};
        let shape = Shape {
            services: 400,
            endpoints: 10,
            nodes: 5,
            seed: 3,
        };
        let text = generate(&shape, Format::YamlList);
        assert!(matches!(plan(&text)[0], Job::List(_)));
        let (serial, d) = parse_yaml_piece(FileId(0), &text, 0, usize::MAX);
        assert!(d.items.is_empty());
        let (parallel, d) = parse_file(FileId(0), &text);
        assert!(d.items.is_empty());
        assert_eq!(serial.len(), 1);
        assert_eq!(diff(&serial[0].root, &parallel[0].root, ""), None);
        // A list after other documents, with comments and blank lines between items.
        let text2 = format!(
            "kind: A\n---\n{}",
            text.replace(
                "\n- apiVersion: v1\n  kind: Node",
                "\n\n# a node\n- apiVersion: v1\n  kind: Node"
            )
        );
        let (serial, _) = parse_yaml_piece(FileId(0), &text2, 0, usize::MAX);
        let (parallel, d) = parse_file(FileId(0), &text2);
        assert!(d.items.is_empty());
        assert_eq!(parallel.len(), 2);
        assert_eq!(diff(&serial[1].root, &parallel[1].root, ""), None);
    }

    /// A split that cuts through something (here a multi-line quoted scalar, with content
    /// after it that neither saphyr nor go-yaml accepts) falls back to the serial parse:
    /// same tree, same diagnostics.
    #[test]
    fn list_split_falls_back_when_a_piece_fails() {
        let mut s = String::from("apiVersion: v1\nkind: List\nitems:\n");
        for i in 0..8000 {
            s.push_str(&format!("- name: item-{i}\n  note: 'x{i}'\n"));
            if i == 4000 {
                s.push_str("- note: \"multi\n- line\" x\n");
            }
        }
        s.push_str("metadata: {}\n");
        let (serial, d0) = parse_yaml_piece(FileId(0), &s, 0, usize::MAX);
        let (parallel, d1) = parse_file(FileId(0), &s);
        assert!(!d0.items.is_empty());
        assert_eq!(d0.items, d1.items);
        assert_eq!(serial.len(), parallel.len());
    }

    #[test]
    fn json_items_come_in_chunks() {
        use crate::synth::{generate, Format, Shape};
        let shape = Shape {
            services: 300,
            endpoints: 10,
            nodes: 5,
            seed: 3,
        };
        let text = generate(&shape, Format::Json);
        let (parts, _) = parse_each(FileId(0), &text, |p| match p {
            Part::Document(root) => (0, root.get("items").map(|i| i.span)),
            Part::Items { first, items, .. } => (first + items.len(), None),
        });
        assert!(parts.len() > 2);
        assert_eq!(parts.last().unwrap().0, 300 + 300 + 5 + 2);
        let (whole, _) = parse_file(FileId(0), &text);
        assert!(whole[0].root == json::parse(FileId(0), &text).ok().unwrap());
    }

    /// The parallel JSON split gives the tree the whole parse gives, spans included; with
    /// pretty-printed and minified input.
    #[test]
    fn json_split_matches_whole_parse() {
        use crate::synth::{generate, Format, Shape};
        let shape = Shape {
            services: 600,
            endpoints: 10,
            nodes: 5,
            seed: 3,
        };
        let pretty = generate(&shape, Format::Json);
        let minified: String = pretty
            .lines()
            .map(|l| l.trim_start().replace("\": ", "\":"))
            .collect();
        let bom = format!("\u{feff}{minified}");
        for text in [pretty, minified, bom] {
            let split = json::split_items(&text, MIN_PIECE).unwrap();
            assert!(split.runs.len() > 2);
            let whole = json::parse(FileId(0), &text).ok().unwrap();
            let (parsed, d) = parse_file(FileId(0), &text);
            assert!(d.items.is_empty());
            assert_eq!(diff(&whole, &parsed[0].root, ""), None);
        }
        // A broken run falls back to the whole parse (and its YAML diagnostics).
        let mut text = generate(&shape, Format::Json);
        let at = text.len() / 2;
        text.insert(at, '}');
        let (_, d) = parse_file(FileId(0), &text);
        assert!(!d.items.is_empty());
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
