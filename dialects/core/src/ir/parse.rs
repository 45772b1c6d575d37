//! Reads the text form [`super::print`] writes, for any dialect of the IR
//! core, driven by each op's declaration. Errors carry line and column; the
//! dialect's verifier then checks what was read.

use crate::attr::Attr;
use crate::lex::{Cursor, PResult, ParseError, Scopes, Tok, attr_entries, bracketed, list_attr};
use crate::parse_float;

use super::{Affine, Block, Dialect, Function, Module, OpDecl, OpId, Operands, Region, Value};

/// Regions nest at most this deep in text; deeper is an error, not a stack
/// overflow, even on a 2 MiB thread stack in an unoptimized build (lowered
/// programs nest about rank + 3 deep).
pub const MAX_NESTING: usize = 64;

/// What a dialect adds to the generic parser: its types, and how its ops are
/// rebuilt from what the text says.
pub trait ParseDialect: Dialect {
    /// Whether index lists other than a product's may name tile coordinates
    /// `#k`.
    const AXES: bool;
    /// A buffer type after the word `buffer` (`<f32[4, 8], ..>`).
    fn parse_buffer(c: &mut Cursor) -> PResult<Self::Buffer>;
    /// Any other type (a scalar `f32`, a tile).
    fn parse_value_type(c: &mut Cursor) -> PResult<Self::Type>;
    /// An op of this name with placeholder attributes, whose syntax and
    /// region arguments are the real op's (syntax never depends on attribute
    /// values); `None` for an unknown name.
    fn probe(name: &str) -> Option<Self::Op>;
    /// Rebuilds an op from its name, attributes and index lists.
    fn from_parts(
        name: &str,
        attrs: &[(String, Attr)],
        indices: Vec<Vec<Affine>>,
    ) -> Result<Self::Op, String>;
    /// The types of the arguments of `op`'s region, for operands of these
    /// types.
    fn region_args(op: &Self::Op, operands: &[&Self::Type]) -> Vec<Self::Type>;
}

/// A value's type: `index`, `buffer<..>`, or the dialect's others.
pub fn parse_type<D: ParseDialect>(c: &mut Cursor) -> PResult<D::Type> {
    if c.eat_ident("index") {
        return Ok(D::index_type());
    }
    if c.eat_ident("buffer") {
        return Ok(D::buffer_type(D::parse_buffer(c)?));
    }
    D::parse_value_type(c)
}

/// A buffer's layout after `buffer`: `<f32[4, 8]>`, with any of `, strides =
/// [1, 4]`, `, offset = 8` and the words `word` accepts (a memory space), in
/// any order; `words` says what those are in an error.
pub fn parse_layout(
    c: &mut Cursor,
    words: &str,
    mut word: impl FnMut(&mut Cursor) -> bool,
) -> PResult<crate::Layout> {
    fn dims(c: &mut Cursor) -> PResult<Vec<usize>> {
        let mut v = Vec::new();
        for i in bracketed(c, |c| c.int())? {
            match usize::try_from(i) {
                Ok(d) => v.push(d),
                Err(_) => return c.error("extents and strides must not be negative"),
            }
        }
        Ok(v)
    }
    c.expect("<")?;
    let dtype = c.dtype()?;
    let shape = dims(c)?;
    let mut ty = crate::Layout::contiguous(dtype, shape);
    while c.eat(",") {
        if c.eat_ident("strides") {
            c.expect("=")?;
            let strides = dims(c)?;
            if strides.len() != ty.shape.len() {
                return c.error("one stride per dimension");
            }
            ty.strides = strides;
        } else if c.eat_ident("offset") {
            c.expect("=")?;
            ty.offset = match usize::try_from(c.int()?) {
                Ok(o) => o,
                Err(_) => return c.error("an offset must not be negative"),
            };
        } else if !word(c) {
            return c.expected(&if words.is_empty() {
                "`strides` or `offset`".to_string()
            } else {
                format!("`strides`, `offset`{words}")
            });
        }
    }
    c.expect(">")?;
    Ok(ty)
}

/// Parses a whole module.
pub fn parse_module<D: ParseDialect>(text: &str) -> Result<Module<D>, ParseError> {
    let mut p = Parser::<D> {
        c: Cursor::new(text)?,
        f: Function::default(),
        scopes: Scopes::default(),
    };
    let mut module = Module::default();
    while p.peek() != &Tok::Eof {
        module.functions.push(p.function()?);
    }
    Ok(module)
}

struct Parser<D: Dialect> {
    c: Cursor,
    f: Function<D>,
    scopes: Scopes<Value>,
}

impl<D: Dialect> std::ops::Deref for Parser<D> {
    type Target = Cursor;
    fn deref(&self) -> &Cursor {
        &self.c
    }
}

impl<D: Dialect> std::ops::DerefMut for Parser<D> {
    fn deref_mut(&mut self) -> &mut Cursor {
        &mut self.c
    }
}

impl<D: Dialect> AsMut<Cursor> for Parser<D> {
    fn as_mut(&mut self) -> &mut Cursor {
        &mut self.c
    }
}

/// A term of an index as written: a value, a tile coordinate `#k`, or (in a
/// product's indices) one of the op's counters `#k`, which its region
/// defines after the indices are read.
#[derive(Clone, Copy)]
enum Term {
    Value(Value),
    Axis(usize),
    Counter(usize),
}

/// An index before the counters it names are defined.
type Pending = (Vec<(i64, Term)>, i64);

impl<D: ParseDialect> Parser<D> {
    /// Defines `%name` in the innermost scope.
    fn define(&mut self, name: String, v: Value) -> PResult<()> {
        self.scopes.define(&self.c, name, v)
    }

    fn name(&mut self, what: &str) -> PResult<String> {
        self.c.percent(what)
    }

    fn value(&mut self) -> PResult<Value> {
        self.scopes.value(&mut self.c)
    }

    fn number(&mut self) -> PResult<f64> {
        let neg = self.eat("-");
        let v = match self.bump() {
            Tok::Int(i) => i as f64,
            Tok::Float(v) => v,
            Tok::Ident(s) if s == "true" => 1.0,
            Tok::Ident(s) if s == "false" => 0.0,
            Tok::Ident(s) if s == "inf" || s == "nan" => parse_float(&s).unwrap_or(f64::NAN),
            _ => {
                self.pos -= 1;
                return self.expected("a number");
            }
        };
        Ok(if neg { -v } else { v })
    }

    fn attr(&mut self) -> PResult<Attr> {
        match self.peek().clone() {
            Tok::Punct("[") => list_attr(self, Self::number),
            Tok::Str(s) => {
                self.bump();
                Ok(Attr::Str(s))
            }
            Tok::Ident(s) if !matches!(s.as_str(), "inf" | "nan" | "true" | "false") => {
                self.bump();
                Ok(Attr::Word(s))
            }
            Tok::Int(_) => Ok(Attr::Int(self.int()?)),
            Tok::Punct("-") if matches!(self.peek_at(1), Tok::Int(_)) => Ok(Attr::Int(self.int()?)),
            _ => Ok(Attr::Float(self.number()?)),
        }
    }

    /// `%i`, `2*%i`, `#1`, `3*#0`, `-%j + 4`; `#k` is one of `counters`
    /// counters where there are some, else a tile coordinate where the
    /// dialect has them.
    fn index_expr(&mut self, counters: usize) -> PResult<Pending> {
        let (mut terms, mut constant): Pending = (Vec::new(), 0);
        let mut sign: i64 = if self.eat("-") { -1 } else { 1 };
        loop {
            let (coeff, term) = match self.peek().clone() {
                Tok::Int(i) => {
                    self.bump();
                    if self.eat("*") {
                        (i, Some(self.term(counters)?))
                    } else {
                        (i, None)
                    }
                }
                Tok::Percent(_) | Tok::Punct("#") => (1, Some(self.term(counters)?)),
                _ => return self.expected("an index (`%i`, `2*%i`, `%i + 1`)"),
            };
            let Some(c) = coeff.checked_mul(sign) else {
                return self.error("index coefficient overflows");
            };
            match term {
                None => constant = constant.saturating_add(c),
                Some(t) => terms.push((c, t)),
            }
            sign = if self.eat("+") {
                1
            } else if self.eat("-") {
                -1
            } else {
                break;
            };
        }
        Ok((terms, constant))
    }

    fn term(&mut self, counters: usize) -> PResult<Term> {
        let at = self.pos;
        if !self.eat("#") {
            return Ok(Term::Value(self.value()?));
        }
        match self.bump() {
            Tok::Int(k) if counters > 0 && (0..counters as i64).contains(&k) => {
                Ok(Term::Counter(k as usize))
            }
            Tok::Int(k) if counters == 0 && D::AXES && (0..16).contains(&k) => {
                Ok(Term::Axis(k as usize))
            }
            _ => {
                self.pos = at;
                if counters > 0 {
                    self.expected(&format!(
                        "one of the op's counters `#0`..`#{}`",
                        counters - 1
                    ))
                } else if D::AXES {
                    self.expected("a tile axis number after `#`")
                } else {
                    self.error("`#k` names a counter of a product, whose indices alone use them")
                }
            }
        }
    }

    fn index_list(&mut self, counters: usize) -> PResult<Vec<Pending>> {
        bracketed(self, |p| p.index_expr(counters))
    }

    fn function(&mut self) -> PResult<Function<D>> {
        let keyword = format!("{}.func", D::NAME);
        if !self.eat_ident(&keyword) {
            return self.expected(&format!("`{keyword}`"));
        }
        let name = match self.bump() {
            Tok::At(n) => n,
            _ => {
                self.pos -= 1;
                return self.expected("a function name `@name`");
            }
        };
        self.f = Function::new(name);
        self.scopes = Scopes::default();
        self.expect("(")?;
        if !self.eat(")") {
            loop {
                let output = self.eat_ident("out");
                if !output && self.f.outputs > 0 {
                    return self.expected("`out`: results follow the inputs");
                }
                self.f.outputs += usize::from(output);
                if !output && self.eat_ident("weight") {
                    self.f.weights.insert(self.f.params.len());
                }
                let pname = self.name("a parameter `%name`")?;
                self.expect(":")?;
                if !self.eat_ident("buffer") {
                    return self.expected("a buffer type `buffer<f32[...]>`");
                }
                let ty = D::parse_buffer(&mut self.c)?;
                let v = self.f.add_param(pname.clone(), ty);
                self.define(pname, v)?;
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
        }
        if self.eat_ident("prepare") {
            match self.bump() {
                Tok::At(n) => self.f.prepare = Some(n),
                _ => {
                    self.pos -= 1;
                    return self.expected("the preparing function's name `@name`");
                }
            }
        }
        self.expect("{")?;
        self.f.body = self.block(vec![])?;
        Ok(std::mem::take(&mut self.f))
    }

    /// Ops up to the closing `}` (consumed), in a new scope holding `args`.
    fn block(&mut self, args: Vec<(String, D::Type)>) -> PResult<Block> {
        if self.scopes.depth() > MAX_NESTING {
            return self.error(format!("regions nest deeper than {MAX_NESTING} levels"));
        }
        self.scopes.push();
        let mut block = Block::default();
        for (n, t) in args {
            let v = self.f.new_value(t);
            self.define(n, v)?;
            block.args.push(v);
        }
        while !self.eat("}") {
            if self.peek() == &Tok::Eof {
                self.scopes.pop();
                return self.expected("`}`");
            }
            block.ops.push(self.op()?);
        }
        self.scopes.pop();
        Ok(block)
    }

    fn op(&mut self) -> PResult<OpId> {
        // Results: `%r =`, or `%r:n =` for several.
        let mut result_name = None;
        let mut group = None;
        if matches!(self.peek(), Tok::Percent(_)) {
            let n = self.name("a result name")?;
            if self.eat(":") {
                group = Some((n, self.usize()?));
            } else {
                result_name = Some(n);
            }
            self.expect("=")?;
        }
        let (name_line, name_col) = (self.toks[self.pos].1, self.toks[self.pos].2);
        let name = self.ident("an op name")?;
        let at_name = |message: String| ParseError {
            line: name_line,
            column: name_col,
            message,
        };
        if !name.starts_with(&format!("{}.", D::NAME)) {
            return Err(at_name(format!("`{name}` is not a {} dialect op", D::NAME)));
        }
        let probe = D::probe(&name).ok_or_else(|| at_name(format!("unknown op `{name}`")))?;
        let syn = probe.syntax();
        let mut operands = Vec::new();
        let mut indices = Vec::new();
        match syn.operands {
            Operands::Fixed(0) => {}
            Operands::Fixed(_) | Operands::Variadic => {
                if matches!(self.peek(), Tok::Percent(_)) {
                    operands.push(self.value()?);
                    while self.eat(",") {
                        operands.push(self.value()?);
                    }
                }
            }
            Operands::Indexed { before, mask } => {
                for _ in 0..before {
                    operands.push(self.value()?);
                    self.expect(",")?;
                }
                operands.push(self.value()?);
                indices.push(self.index_list(0)?);
                if mask && self.eat_ident("mask") {
                    operands.push(self.value()?);
                }
            }
            Operands::Product { counters } => {
                operands.push(self.value()?);
                indices.push(self.index_list(counters)?);
                self.expect(",")?;
                operands.push(self.value()?);
                indices.push(self.index_list(counters)?);
            }
            Operands::Limits => indices.push(self.index_list(0)?),
        }
        let mut attrs = Vec::new();
        let attrs_follow =
            matches!(self.peek_at(1), Tok::Ident(_)) && matches!(self.peek_at(2), Tok::Punct("="));
        if matches!(self.peek(), Tok::Punct("{")) && (attrs_follow || syn.region != Region::Bare) {
            self.bump();
            attrs = attr_entries(self, Self::attr)?;
        }
        // The region: `(%i, ..) { .. }` or `{ .. }`, its arguments typed by
        // the op.
        let mut regions = Vec::new();
        if syn.region != Region::None {
            let types = {
                let operand_types: Vec<&D::Type> = operands.iter().map(|v| self.f.ty(*v)).collect();
                D::region_args(&probe, &operand_types)
            };
            let mut names = Vec::new();
            if syn.region == Region::WithArgs {
                self.expect("(")?;
                if !self.eat(")") {
                    loop {
                        names.push(self.name("a region argument `%name`")?);
                        if self.eat(")") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
            }
            if names.len() != types.len() {
                return Err(at_name(format!(
                    "`{name}` has {} region arguments, got {}",
                    types.len(),
                    names.len()
                )));
            }
            self.expect("{")?;
            regions.push(self.block(names.into_iter().zip(types).collect())?);
        }
        let counters: &[Value] = regions.first().map_or(&[], |r: &Block| &r.args);
        let indices: Vec<Vec<Affine>> = indices
            .into_iter()
            .map(|list| list.into_iter().map(|e| resolve(e, counters)).collect())
            .collect();
        let kind = D::from_parts(&name, &attrs, indices).map_err(at_name)?;
        let mut result_types = Vec::new();
        if self.eat(":") {
            result_types.push(parse_type::<D>(&mut self.c)?);
            while self.eat(",") {
                result_types.push(parse_type::<D>(&mut self.c)?);
            }
        }
        let named = match &group {
            Some((_, k)) => *k,
            None => usize::from(result_name.is_some()),
        };
        if named != result_types.len() {
            return Err(at_name(format!(
                "`{name}` names {named} result(s), but {} type(s) follow",
                result_types.len()
            )));
        }
        let id = self.f.create_op(kind, operands, &result_types, regions);
        let results = self.f.op(id).results.clone();
        match (group, result_name) {
            (Some((n, _)), _) => {
                for (k, v) in results.into_iter().enumerate() {
                    self.define(format!("{n}#{k}"), v)?;
                }
            }
            (None, Some(n)) => {
                for v in results {
                    self.define(n.clone(), v)?;
                }
            }
            (None, None) => {}
        }
        Ok(id)
    }
}

/// An index with its counters replaced by the values that define them.
fn resolve((terms, constant): Pending, counters: &[Value]) -> Affine {
    let mut e = Affine::constant(constant);
    for (c, t) in terms {
        let term = match t {
            Term::Value(v) => Affine::value(v),
            Term::Axis(k) => Affine::axis(k),
            // The parser checks `k` against the counters' number.
            Term::Counter(k) => Affine::value(counters.get(k).copied().unwrap_or(Value(0))),
        };
        e = e.plus_scaled(c, &term);
    }
    e
}
