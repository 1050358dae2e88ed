//! Source files and locations.
//!
//! A [`Span`] names a file by [`FileId`] and a 1-based line and column (columns count
//! characters, as editors do). Line text for code frames is looked up only when a
//! diagnostic is rendered, through a per-file line index built on the first lookup, so
//! rendering n diagnostics costs one pass over the file plus n lookups.
//!
//! This module knows nothing of diagnostics (`diag` builds on it, not the other way): a
//! file that does not decode is reported as a plain [`DecodeError`], which `diag` turns
//! into SVC015 ([`SourceMap::add_bytes`] lives there).

use serde::Serialize;
use std::sync::{Arc, OnceLock};

/// Index into [`SourceMap::files`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct FileId(pub u32);

/// A location: file, 1-based line and column, and the length in characters of the
/// thing it points at (0 when unknown).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span {
    pub file: FileId,
    pub line: u32,
    pub col: u32,
    pub len: u32,
}

impl Span {
    pub fn new(file: FileId, line: u32, col: u32, len: u32) -> Span {
        Span {
            file,
            line,
            col,
            len,
        }
    }
}

/// One input file: its display name (as the user wrote the path, `<stdin>` for `-`) and text.
#[derive(Clone, Debug)]
pub struct SourceFile {
    pub name: String,
    /// Shared: the agent keeps each file's text between syncs and hands the same text to
    /// every compile ([`SourceMap::add_shared`]).
    pub text: Arc<String>,
    /// [`fingerprint`] of the text; computed on the first [`SourceMap::print`], or given.
    print: OnceLock<(u64, u64)>,
    /// Byte offset of the start of each line; built on the first [`SourceMap::line_text`].
    line_starts: OnceLock<Vec<usize>>,
}

/// A file's fingerprint: two differently seeded SipHash runs over its text (128 bits; a
/// fingerprint, not a defence against someone crafting collisions in their own
/// manifests). What the agent's caches and the apply's inputs key compare files by.
pub fn fingerprint(text: &str) -> (u64, u64) {
    use std::hash::{DefaultHasher, Hasher};
    let run = |seed: u8| {
        let mut h = DefaultHasher::new();
        h.write_u8(seed);
        h.write(text.as_bytes());
        h.finish()
    };
    (run(1), run(2))
}

impl SourceFile {
    fn line_starts(&self) -> &[usize] {
        self.line_starts.get_or_init(|| {
            std::iter::once(0)
                .chain(after_newlines(&self.text))
                .collect()
        })
    }
}

fn after_newlines(text: &str) -> impl Iterator<Item = usize> + '_ {
    text.bytes()
        .enumerate()
        .filter(|(_, b)| *b == b'\n')
        .map(|(i, _)| i + 1)
}

/// Bytes that are not text ([`SourceMap::add_decoded`]): where the first bad byte is, and
/// what the bytes were taken for (e.g. `invalid UTF-8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeError {
    pub span: Span,
    pub what: &'static str,
}

/// Every input file of one compilation. Files keep the order they were added in, but
/// nothing downstream depends on that order: objects are sorted by their identity.
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    pub files: Vec<SourceFile>,
}

impl SourceMap {
    /// Add a file. A lone carriage return becomes a line feed: YAML reads it as a line
    /// break, so lines are counted the same way by the parsers and by code frames (and
    /// the text means the same: YAML normalises line breaks, JSON takes both as space).
    pub fn add(&mut self, name: impl Into<String>, text: impl Into<String>) -> FileId {
        let mut text = text.into();
        if text.contains('\r') {
            text = lone_cr_to_lf(text);
        }
        self.files.push(SourceFile {
            name: name.into(),
            text: Arc::new(text),
            print: OnceLock::new(),
            line_starts: OnceLock::new(),
        });
        FileId(self.files.len() as u32 - 1)
    }

    /// Add a file whose text an earlier [`SourceMap::add_decoded`] of another map made,
    /// with its [`fingerprint`]: shared, neither copied nor hashed again.
    pub fn add_shared(
        &mut self,
        name: impl Into<String>,
        text: Arc<String>,
        print: (u64, u64),
    ) -> FileId {
        self.files.push(SourceFile {
            name: name.into(),
            text,
            print: OnceLock::from(print),
            line_starts: OnceLock::new(),
        });
        FileId(self.files.len() as u32 - 1)
    }

    /// The [`fingerprint`] of a file's text (computed once per map, or given to
    /// [`SourceMap::add_shared`]).
    pub fn print(&self, id: FileId) -> (u64, u64) {
        let f = self.file(id);
        *f.print.get_or_init(|| fingerprint(&f.text))
    }

    /// Add a file read as bytes. UTF-8 (a BOM is dropped) and UTF-16 with a BOM (as
    /// kubectl's file reader decodes it) are text; anything else is an error located at the
    /// first bad byte, and the file holds the text with U+FFFD in its place, for the code frame.
    pub fn add_decoded(
        &mut self,
        name: impl Into<String>,
        bytes: Vec<u8>,
    ) -> (FileId, Option<DecodeError>) {
        let (text, bad) = decode(bytes);
        let id = self.add(name, text);
        let err = bad.map(|(at, what)| {
            let before = &self.file(id).text[..at];
            let line = before.matches('\n').count() as u32 + 1;
            let col = before.rsplit('\n').next().unwrap_or("").chars().count() as u32 + 1;
            DecodeError {
                span: Span::new(id, line, col, 1),
                what,
            }
        });
        (id, err)
    }

    pub fn file(&self, id: FileId) -> &SourceFile {
        &self.files[id.0 as usize]
    }

    pub fn name(&self, id: FileId) -> &str {
        &self.file(id).name
    }

    /// The text of 1-based line `line` of a file, without its line break.
    pub fn line_text(&self, id: FileId, line: u32) -> Option<&str> {
        let file = self.file(id);
        let starts = file.line_starts();
        let i = line.checked_sub(1)? as usize;
        let start = *starts.get(i)?;
        let end = starts.get(i + 1).map_or(file.text.len(), |e| e - 1);
        let l = &file.text[start..end];
        Some(l.strip_suffix('\r').unwrap_or(l))
    }

    /// `file:line:col` of a span.
    pub fn location(&self, span: Span) -> String {
        format!("{}:{}:{}", self.name(span.file), span.line, span.col)
    }
}

/// `text` with every `\r` that no `\n` follows made a `\n` (same length, so byte
/// offsets keep their meaning).
fn lone_cr_to_lf(text: String) -> String {
    let mut bytes = text.into_bytes();
    for i in 0..bytes.len() {
        if bytes[i] == b'\r' && bytes.get(i + 1) != Some(&b'\n') {
            bytes[i] = b'\n';
        }
    }
    // Only one ASCII byte was replaced by another.
    String::from_utf8(bytes).expect("still UTF-8")
}

/// Bytes to text: the text and, when they are not valid, the byte offset in the text of the
/// first replacement character and what was wrong.
fn decode(bytes: Vec<u8>) -> (String, Option<(usize, &'static str)>) {
    let utf16 = match bytes.get(..2) {
        Some([0xFF, 0xFE]) => Some(u16::from_le_bytes as fn([u8; 2]) -> u16),
        Some([0xFE, 0xFF]) => Some(u16::from_be_bytes as fn([u8; 2]) -> u16),
        _ => None,
    };
    if let Some(unit) = utf16 {
        let units: Vec<u16> = bytes[2..]
            .chunks(2)
            .map(|c| unit([c[0], c.get(1).copied().unwrap_or(0)]))
            .collect();
        let mut text = String::with_capacity(units.len());
        let mut bad = (bytes.len() % 2 == 1).then_some("a UTF-16 file of an odd number of bytes");
        let mut at = None;
        for c in char::decode_utf16(units) {
            match c {
                Ok(c) => text.push(c),
                Err(_) => {
                    at.get_or_insert(text.len());
                    bad.get_or_insert("invalid UTF-16 (an unpaired surrogate)");
                    text.push(char::REPLACEMENT_CHARACTER);
                }
            }
        }
        // An odd byte count: at the last character (which may take several bytes).
        let at = at.unwrap_or_else(|| text.char_indices().last().map_or(0, |(i, _)| i));
        return (text, bad.map(|b| (at, b)));
    }
    let bytes = match bytes.strip_prefix(b"\xEF\xBB\xBF") {
        Some(rest) => rest.to_vec(),
        None => bytes,
    };
    match String::from_utf8(bytes) {
        Ok(text) => (text, None),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
            (text, Some((at, "invalid UTF-8")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_text_matches_splitting_the_text() {
        for text in ["", "a", "a\n", "a\r\nbb\n\nccc", "\n\n", "x\ny"] {
            let mut m = SourceMap::default();
            let f = m.add("f", text);
            let want: Vec<&str> = text
                .split('\n')
                .map(|l| l.strip_suffix('\r').unwrap_or(l))
                .collect();
            for line in 0..want.len() as u32 + 2 {
                let expect = line
                    .checked_sub(1)
                    .and_then(|i| want.get(i as usize).copied());
                assert_eq!(m.line_text(f, line), expect, "{text:?} line {line}");
            }
        }
    }

    /// Found by fuzzing (`check_bytes`): YAML breaks lines at a lone `\r`, so the parser
    /// and the code frames must count lines alike.
    #[test]
    fn a_lone_carriage_return_is_a_line_break() {
        let mut m = SourceMap::default();
        let f = m.add("f", "a: 1\rb: 2\r\r\nc: 3\r");
        assert_eq!(m.file(f).text.as_str(), "a: 1\nb: 2\n\r\nc: 3\n");
        assert_eq!(m.line_text(f, 2), Some("b: 2"));
        assert_eq!(m.line_text(f, 3), Some(""));
        assert_eq!(m.line_text(f, 4), Some("c: 3"));
        let (docs, d) = crate::tree::parse_file(f, &m.file(f).text);
        assert!(d.items.is_empty());
        let line = |k| docs[0].root.get(k).map(|n| n.span.line);
        assert_eq!((line("b"), line("c")), (Some(2), Some(4)));
    }

    /// Found by fuzzing (`lock_file`): a UTF-16 file of an odd number of bytes whose last
    /// character takes several bytes in UTF-8 was located inside that character (a panic).
    #[test]
    fn odd_utf16_ending_in_a_wide_character() {
        let mut bytes = vec![0xFF, 0xFE];
        bytes.extend("a\u{6900}".encode_utf16().flat_map(u16::to_le_bytes));
        bytes.push(0xE9); // with the padding: U+00E9, two bytes in UTF-8
        let mut m = SourceMap::default();
        let (f, d) = m.add_decoded("odd", bytes);
        let chars = m.file(f).text.chars().count() as u32;
        let s = d.expect("odd UTF-16").span;
        assert_eq!((s.line, s.col), (1, chars));
    }

    #[test]
    fn bytes_become_text_or_a_located_error() {
        let mut m = SourceMap::default();
        let (f, d) = m.add_decoded("ok", b"\xEF\xBB\xBFa: 1\n".to_vec());
        assert_eq!((m.file(f).text.as_str(), d), ("a: 1\n", None));
        let utf16: Vec<u8> = [0xFF, 0xFE]
            .into_iter()
            .chain("k: \u{e9}\n".encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        let (f, d) = m.add_decoded("le", utf16);
        assert_eq!((m.file(f).text.as_str(), d), ("k: \u{e9}\n", None));
        let (f, d) = m.add_decoded("bad", b"a: 1\nbb: x\xFFy\n".to_vec());
        let d = d.expect("invalid UTF-8");
        assert_eq!(d.span, Span::new(f, 2, 6, 1));
        let odd = vec![0xFE, 0xFF, 0, b'a', 0];
        let (_, d) = m.add_decoded("odd", odd);
        assert_eq!(d.map(|e| (e.span.line, e.span.col)), Some((1, 2)));
    }
}
