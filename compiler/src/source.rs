//! Source files and locations.
//!
//! A [`Span`] names a file by [`FileId`] and a 1-based line and column (columns count
//! characters, as editors do). Line text for code frames is looked up only when a
//! diagnostic is rendered.

use serde::Serialize;

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
        let text = &self.file(id).text;
        text.split('\n')
            .nth(line.checked_sub(1)? as usize)
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
    }

    /// `file:line:col` of a span.
    pub fn location(&self, span: Span) -> String {
        format!("{}:{}:{}", self.name(span.file), span.line, span.col)
    }
}
