//! The lexer: logos turns source text into tokens with byte spans.

use logos::Logos;

/// Why the lexer stopped.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum LexError {
    /// A character that starts no token.
    #[default]
    Invalid,
    /// An integer literal that does not fit in 64 bits.
    IntOverflow,
    /// A `/*` comment that never ends.
    UnterminatedComment,
}

/// A token of the dlc language.
#[derive(Logos, Debug, Clone, PartialEq)]
#[logos(skip r"[ \t\r\n\f]+")]
#[logos(skip(r"//[^\n]*", allow_greedy = true))]
#[logos(skip r"/\*([^*]|\*+[^*/])*\*+/")]
#[logos(error = LexError)]
#[allow(missing_docs)]
pub enum Tok {
    #[token("fn")]
    Fn,
    #[token("op")]
    Op,
    #[token("let")]
    Let,
    #[token("return")]
    Return,
    #[token("in")]
    In,
    #[token("true")]
    True,
    #[token("false")]
    False,
    #[regex("[A-Za-z_][A-Za-z0-9_]*", |lex| lex.slice().to_string())]
    Ident(String),
    #[regex("[0-9]+", |lex| lex.slice().parse::<i64>().map_err(|_| LexError::IntOverflow))]
    Int(i64),
    #[regex(r"[0-9]+\.[0-9]+([eE][+-]?[0-9]+)?", |lex| lex.slice().parse::<f64>().ok())]
    #[regex(r"[0-9]+[eE][+-]?[0-9]+", |lex| lex.slice().parse::<f64>().ok())]
    #[regex(r"\.[0-9]+([eE][+-]?[0-9]+)?", |lex| lex.slice().parse::<f64>().ok())]
    Float(f64),
    #[token("/*", callback = unterminated_comment)]
    UnterminatedComment,
    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
    #[token(",")]
    Comma,
    #[token(";")]
    Semi,
    #[token(":")]
    Colon,
    #[token("=")]
    Assign,
    #[token("->")]
    Arrow,
    #[token("..")]
    DotDot,
    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("*")]
    Star,
    #[token("/")]
    Slash,
    #[token("@")]
    At,
    #[token("<")]
    Lt,
    #[token("<=")]
    Le,
    #[token(">")]
    Gt,
    #[token(">=")]
    Ge,
    #[token("==")]
    EqEq,
    #[token("!=")]
    Ne,
}

fn unterminated_comment(_: &mut logos::Lexer<'_, Tok>) -> Result<(), LexError> {
    Err(LexError::UnterminatedComment)
}

/// A token stream with byte offsets, in the shape lalrpop expects.
pub fn tokens(
    src: &str,
) -> impl Iterator<Item = Result<(usize, Tok, usize), (LexError, usize, usize)>> + '_ {
    Tok::lexer(src).spanned().map(|(tok, span)| match tok {
        Ok(t) => Ok((span.start, t, span.end)),
        Err(e) => Err((e, span.start, span.end)),
    })
}
