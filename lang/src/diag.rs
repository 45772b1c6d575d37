//! Source diagnostics: a message, a primary span with a label, secondary
//! spans, and notes, rendered as `FILE:LINE:COL` with the source line and the
//! span underlined.

use codespan_reporting::diagnostic::{Diagnostic as CsDiagnostic, Label};
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::{self, Chars, Config};

use crate::ast::Span;

/// One error about the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The main message.
    pub message: String,
    /// Where, and a short label under it.
    pub primary: (Span, String),
    /// Other places that explain the error.
    pub secondary: Vec<(Span, String)>,
    /// Extra sentences.
    pub notes: Vec<String>,
    /// An error that follows from one already reported (a use of a name
    /// whose definition failed): it stops the statement but is not shown.
    pub follow_on: bool,
}

impl Diagnostic {
    /// An error at `span` with a label.
    pub fn new(message: impl Into<String>, span: Span, label: impl Into<String>) -> Self {
        Diagnostic {
            message: message.into(),
            primary: (span, label.into()),
            secondary: vec![],
            notes: vec![],
            follow_on: false,
        }
    }

    /// A [follow-on](Diagnostic::follow_on) error at `span`.
    pub fn follow_on(span: Span) -> Self {
        Diagnostic {
            follow_on: true,
            ..Diagnostic::new("follows from an earlier error", span, "")
        }
    }

    /// Adds "did you mean `x`?" when one of `candidates` is close to `name`
    /// (Jaro-Winkler similarity of at least 0.8, the closest one).
    pub fn with_suggestion<'a>(
        self,
        name: &str,
        candidates: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let best = candidates
            .into_iter()
            .filter(|c| *c != name)
            .map(|c| (strsim::jaro_winkler(name, c), c))
            .filter(|(score, _)| *score >= 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0).then_with(|| b.1.cmp(a.1)));
        match best {
            Some((_, c)) => self.with_note(format!("did you mean `{c}`?")),
            None => self,
        }
    }

    /// Adds a secondary span.
    pub fn with_secondary(mut self, span: Span, label: impl Into<String>) -> Self {
        self.secondary.push((span, label.into()));
        self
    }

    /// Adds a note.
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }
}

/// Every error found in one source file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} error(s) in the source", .0.len())]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// The 1-based line and column (in characters) of the first shown
    /// diagnostic's primary span in `source`: where an editor or a Python
    /// exception points.
    pub fn first_place(&self, source: &str) -> Option<(usize, usize)> {
        let d = self.0.iter().find(|d| !d.follow_on).or(self.0.first())?;
        let mut at = d.primary.0.start.min(source.len());
        while !source.is_char_boundary(at) {
            at -= 1;
        }
        let before = &source[..at];
        let line_start = before.rfind('\n').map_or(0, |p| p + 1);
        let line = before.matches('\n').count() + 1;
        Some((line, before[line_start..].chars().count() + 1))
    }

    /// Renders every diagnostic against the source text, without colour.
    pub fn render(&self, file_name: &str, source: &str) -> String {
        let file = SimpleFile::new(file_name, source);
        let config = Config {
            chars: Chars::ascii(),
            ..Config::default()
        };
        let mut out = String::new();
        for d in &self.0 {
            let clamp = |s: Span| {
                s.start.min(source.len())..s.end.min(source.len()).max(s.start.min(source.len()))
            };
            let mut labels =
                vec![Label::primary((), clamp(d.primary.0)).with_message(&d.primary.1)];
            for (span, label) in &d.secondary {
                labels.push(Label::secondary((), clamp(*span)).with_message(label));
            }
            let cs = CsDiagnostic::error()
                .with_message(&d.message)
                .with_labels(labels)
                .with_notes(d.notes.clone());
            match term::emit_into_string(&config, &file, &cs) {
                Ok(s) => out.push_str(&s),
                Err(e) => out.push_str(&format!("error: {} (could not render: {e})\n", d.message)),
            }
        }
        out
    }
}
