//! The lexer and token cursor shared by the IR text parsers of every
//! dialect. Tokens carry their 1-based line and column, so every parse
//! error points at the offending token.

use crate::DType;

/// A syntax error in graph IR text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{column}: {message}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub column: usize,
    /// What was expected.
    pub message: String,
}

/// A token of IR text.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Tok {
    Ident(String),
    Percent(String),
    At(String),
    Int(i64),
    Float(f64),
    Str(String),
    Punct(&'static str),
    Eof,
}

impl Tok {
    /// How the token reads in an error message.
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Percent(s) => format!("`%{s}`"),
            Tok::At(s) => format!("`@{s}`"),
            Tok::Int(i) => format!("`{i}`"),
            Tok::Float(f) => format!("`{f}`"),
            Tok::Str(s) => format!("{s:?}"),
            Tok::Punct(p) => format!("`{p}`"),
            Tok::Eof => "end of input".into(),
        }
    }
}

const PUNCTS: [&str; 22] = [
    "->", "..", "<=", ">=", "==", "!=", "=", ":", ",", "(", ")", "[", "]", "{", "}", "*", "+", "-",
    "/", "<", ">", "#",
];

/// Tokens with their 1-based line and column.
pub fn lex(text: &str) -> Result<Vec<(Tok, usize, usize)>, ParseError> {
    let chars: Vec<char> = text.chars().collect();
    let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
    let mut toks = Vec::new();
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$');
    while i < chars.len() {
        let c = chars[i];
        let (tl, tc) = (line, col);
        let err = |message: String| ParseError {
            line: tl,
            column: tc,
            message,
        };
        if c == '\n' {
            i += 1;
            line += 1;
            col = 1;
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            col += 1;
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        let start = i;
        let tok = if c.is_ascii_alphabetic() || c == '_' {
            while i < chars.len() && name_char(chars[i]) {
                i += 1;
            }
            // `0..64` must not swallow the dots; names never end in `..`.
            let s: String = chars[start..i].iter().collect();
            Tok::Ident(s)
        } else if c == '%' || c == '@' {
            i += 1;
            while i < chars.len() && name_char(chars[i]) {
                i += 1;
            }
            if i == start + 1 {
                return Err(err(format!("expected a name after `{c}`")));
            }
            let s: String = chars[start + 1..i].iter().collect();
            if c == '%' {
                Tok::Percent(s)
            } else {
                Tok::At(s)
            }
        } else if c.is_ascii_digit() {
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let mut is_float = false;
            if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
                is_float = true;
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let mut j = i + 1;
                if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    is_float = true;
                    i = j;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            let s: String = chars[start..i].iter().collect();
            if is_float {
                Tok::Float(s.parse().map_err(|_| err(format!("bad number `{s}`")))?)
            } else {
                Tok::Int(
                    s.parse()
                        .map_err(|_| err(format!("integer `{s}` is too large")))?,
                )
            }
        } else if c == '"' {
            i += 1;
            let mut s = String::new();
            loop {
                match chars.get(i) {
                    None | Some('\n') => return Err(err("unterminated string".into())),
                    Some('"') => {
                        i += 1;
                        break;
                    }
                    // The escapes Rust's `{:?}` writes (printers quote
                    // strings with it), so printed text reads back the
                    // same; a backslash before anything else is itself.
                    Some('\\') => match chars.get(i + 1) {
                        Some(&e @ ('"' | '\\' | '\'')) => {
                            s.push(e);
                            i += 2;
                        }
                        Some('0') => {
                            s.push('\0');
                            i += 2;
                        }
                        Some('n') => {
                            s.push('\n');
                            i += 2;
                        }
                        Some('r') => {
                            s.push('\r');
                            i += 2;
                        }
                        Some('t') => {
                            s.push('\t');
                            i += 2;
                        }
                        Some('u') if chars.get(i + 2) == Some(&'{') => {
                            let close = chars[i + 3..]
                                .iter()
                                .position(|c| *c == '}')
                                .map(|p| i + 3 + p);
                            let code = close.and_then(|close| {
                                let hex: String = chars[i + 3..close].iter().collect();
                                u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32)
                            });
                            match (close, code) {
                                (Some(close), Some(c)) => {
                                    s.push(c);
                                    i = close + 1;
                                }
                                _ => return Err(err("invalid `\\u{..}` escape".into())),
                            }
                        }
                        _ => {
                            s.push('\\');
                            i += 1;
                        }
                    },
                    Some(&ch) => {
                        s.push(ch);
                        i += 1;
                    }
                }
            }
            Tok::Str(s)
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            match PUNCTS.iter().find(|p| rest.starts_with(**p)) {
                Some(p) => {
                    i += p.len();
                    Tok::Punct(p)
                }
                None => return Err(err(format!("unexpected character `{c}`"))),
            }
        };
        col += i - start;
        toks.push((tok, tl, tc));
    }
    toks.push((Tok::Eof, line, col));
    Ok(toks)
}

/// A result of parsing.
pub type PResult<T> = Result<T, ParseError>;

/// The value names in scope while a function is parsed: names defined in
/// enclosing blocks are visible, and a name is defined once per function
/// scope chain.
#[derive(Debug, Clone)]
pub struct Scopes<V> {
    scopes: Vec<std::collections::HashMap<String, V>>,
}

impl<V: Copy> Default for Scopes<V> {
    fn default() -> Self {
        Scopes {
            scopes: vec![std::collections::HashMap::new()],
        }
    }
}

impl<V: Copy> Scopes<V> {
    /// Opens a nested scope (a block).
    pub fn push(&mut self) {
        self.scopes.push(std::collections::HashMap::new());
    }

    /// Closes the innermost scope.
    pub fn pop(&mut self) {
        self.scopes.pop();
    }

    /// How many scopes are open.
    pub fn depth(&self) -> usize {
        self.scopes.len()
    }

    /// The value `%name` stands for here.
    pub fn lookup(&self, name: &str) -> Option<V> {
        self.scopes.iter().rev().find_map(|s| s.get(name).copied())
    }

    /// Defines `%name` in the innermost scope; an error at `c`'s token if it
    /// is already visible.
    pub fn define(&mut self, c: &Cursor, name: String, v: V) -> PResult<()> {
        if self.lookup(&name).is_some() {
            return c.error(format!("`%{name}` is defined twice"));
        }
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name, v);
        }
        Ok(())
    }

    /// Consumes a use of a value: `%name`, or `%name#k` (result `k` of an op
    /// whose results are defined as a group).
    pub fn value(&self, c: &mut Cursor) -> PResult<V> {
        let Tok::Percent(n) = c.peek().clone() else {
            return c.expected("a value `%name`");
        };
        if let (Tok::Punct("#"), Tok::Int(k)) = (c.peek_at(1).clone(), c.peek_at(2).clone()) {
            let group = format!("{n}#{k}");
            return match self.lookup(&group) {
                Some(v) => {
                    c.bump();
                    c.bump();
                    c.bump();
                    Ok(v)
                }
                None => c.error(format!("`%{group}` is not defined here")),
            };
        }
        match self.lookup(&n) {
            Some(v) => {
                c.bump();
                Ok(v)
            }
            None => c.error(format!("`%{n}` is not defined here")),
        }
    }
}

/// A position in a token list, with the helpers recursive-descent parsers use.
pub struct Cursor {
    /// The tokens, ending with [`Tok::Eof`].
    pub toks: Vec<(Tok, usize, usize)>,
    /// Index of the next token.
    pub pos: usize,
}

impl Cursor {
    /// Lexes `text`.
    pub fn new(text: &str) -> PResult<Cursor> {
        Ok(Cursor {
            toks: lex(text)?,
            pos: 0,
        })
    }

    /// The next token, not consumed.
    pub fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }

    /// The token `k` places ahead.
    pub fn peek_at(&self, k: usize) -> &Tok {
        &self.toks[(self.pos + k).min(self.toks.len() - 1)].0
    }

    /// Consumes and returns the next token (the end stays put).
    pub fn bump(&mut self) -> Tok {
        let t = self.toks[self.pos].0.clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    /// An error at the next token.
    pub fn error<T>(&self, message: impl Into<String>) -> PResult<T> {
        let (_, line, column) = &self.toks[self.pos];
        Err(ParseError {
            line: *line,
            column: *column,
            message: message.into(),
        })
    }

    /// `expected WHAT, found TOKEN` at the next token.
    pub fn expected<T>(&self, what: &str) -> PResult<T> {
        self.error(format!("expected {what}, found {}", self.peek().describe()))
    }

    /// Consumes punctuation `p` if it is next.
    pub fn eat(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Tok::Punct(q) if *q == p) {
            self.bump();
            true
        } else {
            false
        }
    }

    /// Consumes punctuation `p`, or fails.
    pub fn expect(&mut self, p: &str) -> PResult<()> {
        if self.eat(p) {
            Ok(())
        } else {
            self.expected(&format!("`{p}`"))
        }
    }

    /// Consumes the word `word` if it is next.
    pub fn eat_ident(&mut self, word: &str) -> bool {
        if matches!(self.peek(), Tok::Ident(s) if s == word) {
            self.bump();
            true
        } else {
            false
        }
    }

    /// Consumes a value name `%name` (where one is defined).
    pub fn percent(&mut self, what: &str) -> PResult<String> {
        match self.peek().clone() {
            Tok::Percent(n) => {
                self.bump();
                Ok(n)
            }
            _ => self.expected(what),
        }
    }

    /// Consumes a name.
    pub fn ident(&mut self, what: &str) -> PResult<String> {
        match self.peek().clone() {
            Tok::Ident(s) => {
                self.bump();
                Ok(s)
            }
            _ => self.expected(what),
        }
    }

    /// Consumes an integer, with an optional leading `-`.
    pub fn int(&mut self) -> PResult<i64> {
        let neg = self.eat("-");
        match self.peek().clone() {
            Tok::Int(i) => {
                self.bump();
                Ok(if neg { -i } else { i })
            }
            _ => self.expected("an integer"),
        }
    }

    /// Consumes a non-negative integer.
    pub fn usize(&mut self) -> PResult<usize> {
        match self.peek().clone() {
            Tok::Int(i) => {
                self.bump();
                usize::try_from(i).or_else(|_| self.error("value too large"))
            }
            _ => self.expected("a non-negative integer"),
        }
    }

    /// Consumes an element type name.
    pub fn dtype(&mut self) -> PResult<DType> {
        match self.peek().clone() {
            Tok::Ident(s) => match s.parse() {
                Ok(d) => {
                    self.bump();
                    Ok(d)
                }
                Err(_) => self.expected("an element type"),
            },
            _ => self.expected("an element type"),
        }
    }
}

/// `[item, item, ..]` (possibly empty) read by `item` from a [`Cursor`] or a
/// parser around one: the list syntax of every IR text form.
pub fn bracketed<P, T>(p: &mut P, mut item: impl FnMut(&mut P) -> PResult<T>) -> PResult<Vec<T>>
where
    P: AsMut<Cursor>,
{
    p.as_mut().expect("[")?;
    let mut v = Vec::new();
    if !p.as_mut().eat("]") {
        loop {
            v.push(item(p)?);
            if p.as_mut().eat("]") {
                break;
            }
            p.as_mut().expect(",")?;
        }
    }
    Ok(v)
}

/// The entries of an attribute dictionary after its `{`, through its `}`:
/// `}` alone, or `key = value, .. }` with each value read by `attr`. The
/// attribute syntax of every IR text form.
pub fn attr_entries<P, A>(
    p: &mut P,
    mut attr: impl FnMut(&mut P) -> PResult<A>,
) -> PResult<Vec<(String, A)>>
where
    P: AsMut<Cursor>,
{
    let mut attrs = Vec::new();
    if p.as_mut().eat("}") {
        return Ok(attrs);
    }
    loop {
        let key = p.as_mut().ident("an attribute name")?;
        p.as_mut().expect("=")?;
        attrs.push((key, attr(p)?));
        if p.as_mut().eat("}") {
            return Ok(attrs);
        }
        p.as_mut().expect(",")?;
    }
}

impl AsMut<Cursor> for Cursor {
    fn as_mut(&mut self) -> &mut Cursor {
        self
    }
}

/// A list attribute, `[1, 0]` or `[1.5, -inf, 2]`, from a parser that is a
/// [`Cursor`] underneath, reading non-integers with its own `number`:
/// integers stay exact ([`crate::attr::Attr::Ints`]); a list with any other
/// number is a list of numbers ([`crate::attr::Attr::Floats`]).
pub fn list_attr<P>(
    p: &mut P,
    mut number: impl FnMut(&mut P) -> PResult<f64>,
) -> PResult<crate::attr::Attr>
where
    P: AsMut<Cursor>,
{
    let items = bracketed(p, |p| {
        let c = p.as_mut();
        let int = matches!(c.peek(), Tok::Int(_))
            || (matches!(c.peek(), Tok::Punct("-")) && matches!(c.peek_at(1), Tok::Int(_)));
        if int {
            c.int().map(|i| (Some(i), i as f64))
        } else {
            number(p).map(|v| (None, v))
        }
    })?;
    Ok(if items.iter().all(|(i, _)| i.is_some()) {
        crate::attr::Attr::Ints(items.iter().filter_map(|(i, _)| *i).collect())
    } else {
        crate::attr::Attr::Floats(items.iter().map(|(_, v)| *v).collect())
    })
}

#[cfg(test)]
mod tests {
    use super::{Cursor, Tok};

    /// Strings printed with `{:?}` (as every dialect's printer quotes them)
    /// read back as themselves, control characters included.
    #[test]
    fn quoted_strings_read_back_what_debug_wrote() {
        for s in [
            "plain",
            "a\0b",
            "tab\there\nnew\rret",
            "q\"uote'",
            "back\\slash",
            "\u{7f}\u{1b}é",
        ] {
            let text = format!("{s:?}");
            let c = Cursor::new(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(c.toks[0].0, Tok::Str(s.to_string()), "{text}");
        }
        // A backslash before anything else is kept; a broken `\u` is an error.
        let c = Cursor::new(r#""a\qb""#).unwrap();
        assert_eq!(c.toks[0].0, Tok::Str(r"a\qb".to_string()));
        assert!(Cursor::new(r#""\u{zz}""#).is_err());
        assert!(Cursor::new(r#""\u{"#).is_err());
    }
}
