//! Reads the loop dialect's text form, the one generic shape
//! [`crate::print`] writes, driven by each op's declaration in
//! [`crate::ops`]. Errors carry line and column; the verifier then checks
//! what was read.

use dlc_core::attr::Attr;
use dlc_core::lex::{Cursor, PResult, ParseError, Scopes, Tok, bracketed, list_attr};
use dlc_core::parse_float;

use crate::ir::{Block, BufferType, Function, IndexExpr, Module, OpKind, Type, Value};
use crate::ops::{MATMUL_COUNTERS, Operands};

struct Parser {
    c: Cursor,
    f: Function,
    scopes: Scopes<Value>,
}

impl std::ops::Deref for Parser {
    type Target = Cursor;
    fn deref(&self) -> &Cursor {
        &self.c
    }
}

impl std::ops::DerefMut for Parser {
    fn deref_mut(&mut self) -> &mut Cursor {
        &mut self.c
    }
}

/// A term of an index as written: a value, or (in a `loop.matmul`'s
/// indices) one of the op's counters `#k`, which its region defines.
#[derive(Clone, Copy)]
enum Term {
    Value(Value),
    Counter(usize),
}

/// An index before the counters it names are defined.
type Pending = (Vec<(i64, Term)>, i64);

/// Loops nest at most this deep in text; deeper is an error, not a stack
/// overflow, even on a 2 MiB thread stack in an unoptimized build. Lowered
/// programs nest about rank + 3 deep.
pub const MAX_NESTING: usize = 64;

/// Parses a whole module.
pub fn parse_module(text: &str) -> Result<Module, ParseError> {
    let mut p = Parser {
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

impl Parser {
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

    fn values(&mut self) -> PResult<Vec<Value>> {
        let mut vs = Vec::new();
        if matches!(self.peek(), Tok::Percent(_)) {
            vs.push(self.value()?);
            while self.eat(",") {
                vs.push(self.value()?);
            }
        }
        Ok(vs)
    }

    fn ty(&mut self) -> PResult<Type> {
        if self.eat_ident("index") {
            return Ok(Type::Index);
        }
        if self.eat_ident("buffer") {
            return Ok(Type::Buffer(self.buffer_rest()?));
        }
        Ok(Type::Scalar(self.dtype()?))
    }

    fn int_list(&mut self) -> PResult<Vec<usize>> {
        bracketed(self, |p| p.usize())
    }

    /// `<f32[4, 8]>`, `<f32[4, 8], strides = [1, 4]>`, `<f32[4], offset =
    /// 8>` (strides before the offset), after `buffer`.
    fn buffer_rest(&mut self) -> PResult<BufferType> {
        self.expect("<")?;
        let dtype = self.dtype()?;
        let shape = self.int_list()?;
        let mut ty = BufferType::contiguous(dtype, shape);
        let mut offset = false;
        while self.eat(",") {
            if !offset && self.eat_ident("strides") {
                self.expect("=")?;
                let strides = self.int_list()?;
                if strides.len() != ty.shape.len() {
                    return self.error("one stride per dimension");
                }
                ty.strides = strides;
            } else if !offset && self.eat_ident("offset") {
                self.expect("=")?;
                ty.offset = self.usize()?;
                offset = true;
            } else {
                return self.expected(if offset {
                    "`>`"
                } else {
                    "`strides` or `offset`"
                });
            }
        }
        self.expect(">")?;
        Ok(ty)
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

    /// `%i`, `2*%i`, `-%j + 4`; with `counters`, also `#0`..`#2`.
    fn index_expr(&mut self, counters: bool) -> PResult<Pending> {
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

    fn term(&mut self, counters: bool) -> PResult<Term> {
        let at = self.pos;
        if !self.eat("#") {
            return Ok(Term::Value(self.value()?));
        }
        match self.bump() {
            Tok::Int(k) if counters && (0..MATMUL_COUNTERS as i64).contains(&k) => {
                Ok(Term::Counter(k as usize))
            }
            _ => {
                self.pos = at;
                if counters {
                    self.expected("a counter `#0` (row), `#1` (column) or `#2` (depth)")
                } else {
                    self.error(
                        "`#k` names a counter of `loop.matmul`, whose indices alone use them",
                    )
                }
            }
        }
    }

    fn index_list(&mut self, counters: bool) -> PResult<Vec<Pending>> {
        bracketed(self, |p| p.index_expr(counters))
    }

    fn attr(&mut self) -> PResult<Attr> {
        match self.peek().clone() {
            Tok::Punct("[") => list_attr(self, Self::number),
            Tok::Str(s) => {
                self.bump();
                Ok(Attr::Str(s))
            }
            Tok::Int(_) => Ok(Attr::Int(self.int()?)),
            Tok::Punct("-") if matches!(self.peek_at(1), Tok::Int(_)) => Ok(Attr::Int(self.int()?)),
            _ => Ok(Attr::Float(self.number()?)),
        }
    }

    fn function(&mut self) -> PResult<Function> {
        if !self.eat_ident("loop.func") {
            return self.expected("`loop.func`");
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
                let ty = self.buffer_rest()?;
                let v = self.f.add_param(pname.clone(), ty);
                self.define(pname, v)?;
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
        }
        self.expect("{")?;
        self.f.body = self.block(vec![])?;
        Ok(std::mem::take(&mut self.f))
    }

    /// Ops up to the closing `}`; `args` are the block's arguments, already
    /// defined in a new scope by the caller.
    fn block(&mut self, args: Vec<Value>) -> PResult<Block> {
        if self.scopes.depth() > MAX_NESTING {
            return self.error(format!("loops nest deeper than {MAX_NESTING} levels"));
        }
        let mut ops = Vec::new();
        while !self.eat("}") {
            ops.push(self.op()?);
        }
        Ok(Block { args, ops })
    }

    fn op(&mut self) -> PResult<crate::ir::OpId> {
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
        if !name.starts_with("loop.") {
            return Err(at_name(format!("`{name}` is not a loop dialect op")));
        }
        let probe =
            crate::ops::probe(&name).ok_or_else(|| at_name(format!("unknown op `{name}`")))?;
        let syn = probe.syntax();
        let mut operands = Vec::new();
        let mut indices = Vec::new();
        match syn.operands {
            Operands::Fixed(0) => {}
            Operands::Fixed(_) | Operands::Variadic => operands = self.values()?,
            Operands::Indexed { before } => {
                for _ in 0..before {
                    operands.push(self.value()?);
                    self.expect(",")?;
                }
                operands.push(self.value()?);
                indices.push(self.index_list(false)?);
            }
            Operands::Product => {
                operands.push(self.value()?);
                indices.push(self.index_list(true)?);
                self.expect(",")?;
                operands.push(self.value()?);
                indices.push(self.index_list(true)?);
            }
        }
        let mut attrs = Vec::new();
        if matches!(self.peek(), Tok::Punct("{"))
            && matches!(self.peek_at(1), Tok::Ident(_))
            && matches!(self.peek_at(2), Tok::Punct("="))
        {
            self.bump();
            loop {
                let key = self.ident("an attribute name")?;
                self.expect("=")?;
                attrs.push((key, self.attr()?));
                if self.eat("}") {
                    break;
                }
                self.expect(",")?;
            }
        }
        // The region: `(%i, ..) { .. }`, its arguments typed by the op.
        let mut regions = Vec::new();
        if syn.region {
            let types = {
                let operand_types: Vec<&Type> = operands.iter().map(|v| self.f.ty(*v)).collect();
                probe.region_args(&operand_types)
            };
            self.expect("(")?;
            let mut names = Vec::new();
            if !self.eat(")") {
                loop {
                    names.push(self.name("a region argument `%name`")?);
                    if self.eat(")") {
                        break;
                    }
                    self.expect(",")?;
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
            self.scopes.push();
            let mut args = Vec::new();
            for (n, t) in names.into_iter().zip(types) {
                let v = self.f.new_value(t);
                self.define(n, v)?;
                args.push(v);
            }
            let body = self.block(args);
            self.scopes.pop();
            regions.push(body?);
        }
        let counters: &[Value] = regions.first().map_or(&[], |r: &Block| &r.args);
        let indices: Vec<Vec<IndexExpr>> = indices
            .into_iter()
            .map(|list| list.into_iter().map(|e| resolve(e, counters)).collect())
            .collect();
        let kind = OpKind::from_parts(&name, &attrs, indices).map_err(at_name)?;
        let mut result_types = Vec::new();
        if self.eat(":") {
            result_types.push(self.ty()?);
            while self.eat(",") {
                result_types.push(self.ty()?);
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
fn resolve((terms, constant): Pending, counters: &[Value]) -> IndexExpr {
    let mut e = IndexExpr {
        terms: Vec::new(),
        constant,
    };
    for (c, t) in terms {
        let v = match t {
            Term::Value(v) => v,
            // The parser checks `k` against the counters' number.
            Term::Counter(k) => counters.get(k).copied().unwrap_or(Value(0)),
        };
        match e.terms.iter_mut().find(|(_, w)| *w == v) {
            Some(t) => t.0 = t.0.saturating_add(c),
            None => e.terms.push((c, v)),
        }
    }
    e.terms.retain(|(c, _)| *c != 0);
    e
}
