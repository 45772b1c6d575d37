//! Places in source files, which ops carry from the front end down to
//! compiled code so that run-time errors can name them.

use std::fmt;
use std::sync::Arc;

/// A place in a source file: `file:line:column`, 1-based, the column
/// counted in characters. Line 0 is a place that is no line of a text the
/// user has, named by `file` alone (an imported ONNX model's node:
/// ``model.onnx, node `/conv1/Conv` (Conv)``).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceLoc {
    /// The file's name as the user gave it (`model.dl`, `<stdin>`).
    pub file: Arc<str>,
    /// Line.
    pub line: u32,
    /// Column.
    pub column: u32,
}

impl fmt::Display for SourceLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.file)
        } else {
            write!(f, "{}:{}:{}", self.file, self.line, self.column)
        }
    }
}

/// Turns byte offsets of one text into [`SourceLoc`]s.
#[derive(Debug, Clone)]
pub struct LineIndex {
    file: Arc<str>,
    text: Arc<str>,
    /// Byte offset where each line starts.
    starts: Vec<usize>,
}

impl LineIndex {
    /// The index of `text`, read from `file`.
    pub fn new(file: &str, text: &str) -> LineIndex {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex {
            file: file.into(),
            text: text.into(),
            starts,
        }
    }

    /// The place of byte `offset` (clamped to the text).
    pub fn loc(&self, offset: usize) -> SourceLoc {
        let offset = offset.min(self.text.len());
        let line = self.starts.partition_point(|&s| s <= offset).max(1);
        let start = self.starts[line - 1];
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count())
            + 1;
        SourceLoc {
            file: self.file.clone(),
            line: u32::try_from(line).unwrap_or(u32::MAX),
            column: u32::try_from(column).unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_become_lines_and_character_columns() {
        let ix = LineIndex::new("m.dl", "ab\n\u{e9}x\n\nz");
        assert_eq!(ix.loc(0).to_string(), "m.dl:1:1");
        assert_eq!(ix.loc(2).to_string(), "m.dl:1:3");
        assert_eq!(ix.loc(3).to_string(), "m.dl:2:1");
        assert_eq!(ix.loc(5).to_string(), "m.dl:2:2");
        assert_eq!(ix.loc(8).to_string(), "m.dl:4:1");
        assert_eq!(ix.loc(99).to_string(), "m.dl:4:2");
    }
}
