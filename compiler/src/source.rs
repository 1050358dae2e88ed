//! Source files and locations.
//!
//! A [`Span`] names a file by [`FileId`] and a 1-based line and column (columns count
//! characters, as editors do). Line text for code frames is looked up only when a
//! diagnostic is rendered, through a per-file line index built on the first lookup, so
//! rendering n diagnostics costs one pass over the file plus n lookups.

use serde::Serialize;
use std::sync::OnceLock;

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
    pub text: String,
    /// Byte offset of the start of each line; built on the first [`SourceMap::line_text`].
    line_starts: OnceLock<Vec<usize>>,
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

/// Every input file of one compilation. Files keep the order they were added in, but
/// nothing downstream depends on that order: objects are sorted by their identity.
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    pub files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn add(&mut self, name: impl Into<String>, text: impl Into<String>) -> FileId {
        self.files.push(SourceFile {
            name: name.into(),
            text: text.into(),
            line_starts: OnceLock::new(),
        });
        FileId(self.files.len() as u32 - 1)
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
}
