//! The dlc language front end: a logos lexer, a lalrpop grammar, the AST,
//! and the elaborator that checks names, shapes and element types and turns
//! a program into a graph-dialect module (instantiating generic functions
//! and turning user operators into `graph.compute` ops).
//!
//! Every error is a [`Diagnostic`] with a source span; no input makes this
//! crate panic, overflow its stack or loop forever.
//!
//! # In detail
//!
//! - Lexer: logos. Grammar: lalrpop, with an external lexer and Python's precedence.
//!   Every expression node records its nesting depth; a node deeper than 200 levels is
//!   a syntax error raised inside the grammar action, so neither the parser nor any
//!   later recursive walk can overflow the stack (`((((x))))` 50 000 deep, or
//!   `x + x + ... + x` 100 000 long, are diagnostics). The driver also runs the front end
//!   on a thread with a 256 MiB stack.
//! - Elaboration (`lang/src/elaborate.rs`) resolves names, instantiates generic
//!   functions by unifying parameter types with argument types, checks every shape and
//!   element type through `infer`, and builds the graph module. Each generic function is
//!   instantiated once per tuple of dimension values as a private function named
//!   `name$d1$d2...` (`$` cannot appear in source names, so instances never clash with
//!   user functions), called through `graph.call`; `graph.inline` inlines them.
//!   Concrete functions called from other functions are called the same way.
//! - Diagnostics render through codespan-reporting with ASCII art, in the format of the
//!   language reference: message, `--> FILE:LINE:COL`, the source line, the span
//!   underlined with a label, secondary spans (the declaration a mismatch is against, the
//!   call that instantiated a generic function), and notes. Errors in different
//!   functions are all reported.
#![deny(missing_docs)]

pub mod ast;
mod diag;
mod elaborate;
pub mod lexer;

#[allow(
    clippy::all,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::too_many_lines,
    missing_docs,
    unused_parens,
    rust_2018_idioms
)]
mod grammar {
    include!(concat!(env!("OUT_DIR"), "/grammar.rs"));
}

pub use diag::{Diagnostic, Diagnostics};
pub use elaborate::builtins::{self, is_builtin};
pub use elaborate::{DEFAULT_FLOAT, DEFAULT_INT, elaborate};

use ast::{Program, Span};
use lalrpop_util::ParseError;
use lexer::LexError;

/// An error raised inside the grammar: a lexical error or too deep nesting.
#[derive(Debug, Clone, PartialEq)]
pub enum SyntaxError {
    /// The lexer could not make a token.
    Lex(LexError, Span),
    /// Expressions nest deeper than [`ast::MAX_DEPTH`].
    TooDeep(Span),
}

fn describe_expected(expected: &[String]) -> String {
    let mut items: Vec<String> = expected
        .iter()
        .filter(|e| e.as_str() != "\"unterminated comment\"")
        .map(|e| match e.trim_matches('"') {
            "name" => "a name".to_string(),
            "integer" => "an integer".to_string(),
            "number" => "a number".to_string(),
            other => format!("`{other}`"),
        })
        .collect();
    items.dedup();
    match items.len() {
        0 => String::new(),
        1 => format!("; expected {}", items[0]),
        n if n <= 8 => format!("; expected one of {}", items.join(", ")),
        _ => format!("; expected one of {}, ...", items[..8].join(", ")),
    }
}

fn token_text(src: &str, l: usize, r: usize) -> String {
    src.get(l..r).unwrap_or("?").to_string()
}

/// When the parser stopped at the token starting at `at`, expecting `;`
/// among others, and that token begins a later line than the token before
/// it: the span of that earlier token, which ends a statement lacking its
/// `;`. A missing `;` is reported there, not at the next line's first token.
fn missing_semicolon(src: &str, at: usize, expected: &[String]) -> Option<Span> {
    if !expected.iter().any(|e| e == "\";\"") {
        return None;
    }
    let prev = lexer::tokens(src)
        .filter_map(|t| t.ok().map(|(l, _, r)| Span::new(l, r)))
        .take_while(|s| s.end <= at)
        .last()?;
    src.get(prev.end..at)?.contains('\n').then_some(prev)
}

/// Parses source text into an AST.
pub fn parse(src: &str) -> Result<Program, Diagnostics> {
    let toks =
        lexer::tokens(src).map(|t| t.map_err(|(e, l, r)| SyntaxError::Lex(e, Span::new(l, r))));
    grammar::ProgramParser::new().parse(toks).map_err(|e| {
        let d = match e {
            ParseError::InvalidToken { location } => {
                Diagnostic::new("invalid token", Span::new(location, location + 1), "here")
            }
            ParseError::UnrecognizedEof { location, expected } => Diagnostic::new(
                format!("unexpected end of input{}", describe_expected(&expected)),
                Span::new(location, location),
                "input ends here",
            ),
            ParseError::UnrecognizedToken {
                token: (l, _, _),
                expected,
            } if let Some(prev) = missing_semicolon(src, l, &expected) => Diagnostic::new(
                format!(
                    "expected `;` after `{}`, the end of this statement",
                    token_text(src, prev.start, prev.end)
                ),
                Span::new(prev.end, prev.end),
                "`;` missing here",
            ),
            ParseError::UnrecognizedToken {
                token: (l, _, r),
                expected,
            } => Diagnostic::new(
                format!(
                    "unexpected `{}`{}",
                    token_text(src, l, r),
                    describe_expected(&expected)
                ),
                Span::new(l, r),
                "unexpected here",
            ),
            ParseError::ExtraToken { token: (l, _, r) } => Diagnostic::new(
                format!(
                    "unexpected `{}` after the end of the program",
                    token_text(src, l, r)
                ),
                Span::new(l, r),
                "extra token",
            ),
            ParseError::User {
                error: SyntaxError::TooDeep(span),
            } => Diagnostic::new(
                format!("expression nests deeper than {} levels", ast::MAX_DEPTH),
                span,
                "too deeply nested",
            )
            .with_note("split it into several `let` statements"),
            ParseError::User {
                error: SyntaxError::Lex(kind, span),
            } => {
                let what = match kind {
                    LexError::Invalid => {
                        format!(
                            "unexpected character `{}`",
                            token_text(src, span.start, span.end)
                        )
                    }
                    LexError::IntOverflow => "integer literal does not fit in 64 bits".to_string(),
                    LexError::UnterminatedComment => "`/*` comment is never closed".to_string(),
                };
                Diagnostic::new(what, span, "here")
            }
        };
        Diagnostics(vec![d])
    })
}

/// Parses and elaborates source text into a verified graph module.
pub fn compile_source(src: &str) -> Result<dlc_graph::Module, Diagnostics> {
    let program = parse(src)?;
    elaborate(&program, None)
}

/// [`compile_source`] for the text of file `name`: every op the source
/// writes carries its place (`name:line:column`), which run-time errors name.
pub fn compile_file(name: &str, src: &str) -> Result<dlc_graph::Module, Diagnostics> {
    let program = parse(src)?;
    elaborate(&program, Some(dlc_core::LineIndex::new(name, src)))
}
