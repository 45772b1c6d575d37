//! Reads the tile dialect's text form, the one generic shape
//! [`crate::print`] writes, driven by each op's declared syntax. Errors
//! carry line and column; the verifier then checks what was read.

use dlc_core::lex::{Cursor, PResult, ParseError, Scopes, Tok, bracketed, list_attr};
use dlc_core::{DType, parse_float};

use crate::ir::{Affine, Block, BufferType, Function, Module, Space, TileType, Type, Value};
use crate::ops::{Attr, OpKind, Operands};

/// Regions nest at most this deep in text; deeper is an error, not a stack
/// overflow.
pub const MAX_NESTING: usize = 64;

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

    fn int_list(&mut self) -> PResult<Vec<i64>> {
        bracketed(self, |p| p.int())
    }

    fn dims(&mut self) -> PResult<Vec<usize>> {
        let mut v = Vec::new();
        for i in self.int_list()? {
            match usize::try_from(i) {
                Ok(d) => v.push(d),
                Err(_) => return self.error("extents and strides must not be negative"),
            }
        }
        Ok(v)
    }

    fn ty(&mut self) -> PResult<Type> {
        if self.eat_ident("index") {
            return Ok(Type::Index);
        }
        if self.eat_ident("buffer") {
            return Ok(Type::Buffer(self.buffer_rest()?));
        }
        if self.eat_ident("tile") {
            return Ok(Type::Tile(self.tile_rest()?));
        }
        Ok(Type::Scalar(self.dtype()?))
    }

    /// `<64x32xf32>` after `tile`: the lexer reads `64` and then the name
    /// `x32xf32`.
    fn tile_rest(&mut self) -> PResult<TileType> {
        self.expect("<")?;
        let mut shape = Vec::new();
        match self.bump() {
            Tok::Int(i) if i > 0 => shape.push(i as usize),
            _ => {
                self.pos -= 1;
                return self.expected("a tile shape `64x32xf32`");
            }
        }
        let rest = match self.bump() {
            Tok::Ident(s) if s.starts_with('x') => s,
            _ => {
                self.pos -= 1;
                return self.expected("`x` and the next extent or the element type");
            }
        };
        let mut parts: Vec<&str> = rest[1..].split('x').collect();
        let dtype = parts.pop().unwrap_or_default();
        for p in parts {
            match p.parse::<usize>() {
                Ok(d) if d > 0 => shape.push(d),
                _ => {
                    self.pos -= 1;
                    return self.error(format!("`{p}` is not a positive tile extent"));
                }
            }
        }
        let dtype: DType = match dtype.parse() {
            Ok(d) => d,
            Err(_) => {
                self.pos -= 1;
                return self.error(format!("`{dtype}` is not an element type"));
            }
        };
        let len = shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d));
        if len.is_none_or(|n| n > crate::ir::MAX_TILE_ELEMENTS) {
            return self.error(format!(
                "a tile has at most {} elements",
                crate::ir::MAX_TILE_ELEMENTS
            ));
        }
        self.expect(">")?;
        Ok(TileType::new(dtype, shape))
    }

    /// `<f32[4, 8]>`, `<f32[4, 8], strides = [1, 4]>`, `<f32[4], offset =
    /// 8>`, `<f32[4], shared>`.
    fn buffer_rest(&mut self) -> PResult<BufferType> {
        self.expect("<")?;
        let dtype = self.dtype()?;
        let shape = self.dims()?;
        let mut ty = BufferType::contiguous(dtype, shape, Space::Global);
        while self.eat(",") {
            if self.eat_ident("strides") {
                self.expect("=")?;
                let strides = self.dims()?;
                if strides.len() != ty.shape.len() {
                    return self.error("one stride per dimension");
                }
                ty.strides = strides;
            } else if self.eat_ident("offset") {
                self.expect("=")?;
                ty.offset = match usize::try_from(self.int()?) {
                    Ok(o) => o,
                    Err(_) => return self.error("an offset must not be negative"),
                };
            } else if let Some(space) = Space::ALL.into_iter().find(|s| self.eat_ident(s.name())) {
                ty.space = space;
            } else {
                return self
                    .expected("`strides`, `offset` or a memory space (`scratch`, `shared`)");
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
            Tok::Ident(s) if s == "inf" || s == "nan" => parse_float(&s).unwrap_or(f64::NAN),
            _ => {
                self.pos -= 1;
                return self.expected("a number");
            }
        };
        Ok(if neg { -v } else { v })
    }

    /// `%i`, `2*%i`, `#1`, `3*#0`, `-%j + 4`.
    fn affine(&mut self) -> PResult<Affine> {
        let mut e = Affine::default();
        let mut sign: i64 = if self.eat("-") { -1 } else { 1 };
        loop {
            let coeff = match self.peek().clone() {
                Tok::Int(i) => {
                    self.bump();
                    if !self.eat("*") {
                        e = e.plus_scaled(sign, &Affine::constant(i));
                        None
                    } else {
                        Some(i)
                    }
                }
                Tok::Percent(_) | Tok::Punct("#") => Some(1),
                _ => return self.expected("an index (`%i`, `2*%i`, `#0`, `%i + 1`)"),
            };
            if let Some(c) = coeff {
                let Some(c) = c.checked_mul(sign) else {
                    return self.error("index coefficient overflows");
                };
                let term = if self.eat("#") {
                    match self.bump() {
                        Tok::Int(k) if (0..16).contains(&k) => Affine::axis(k as usize),
                        _ => {
                            self.pos -= 1;
                            return self.expected("a tile axis number after `#`");
                        }
                    }
                } else {
                    Affine::value(self.value()?)
                };
                e = e.plus_scaled(c, &term);
            }
            sign = if self.eat("+") {
                1
            } else if self.eat("-") {
                -1
            } else {
                break;
            };
        }
        Ok(e)
    }

    fn index_list(&mut self) -> PResult<Vec<Affine>> {
        bracketed(self, Self::affine)
    }

    fn attr(&mut self) -> PResult<Attr> {
        match self.peek().clone() {
            Tok::Punct("[") => list_attr(self, Self::number),
            Tok::Str(s) => {
                self.bump();
                Ok(Attr::Str(s))
            }
            Tok::Ident(s) if s != "inf" && s != "nan" => {
                self.bump();
                Ok(Attr::Word(s))
            }
            Tok::Int(_) => Ok(Attr::Int(self.int()?)),
            Tok::Punct("-") if matches!(self.peek_at(1), Tok::Int(_)) => Ok(Attr::Int(self.int()?)),
            _ => Ok(Attr::Float(self.number()?)),
        }
    }

    fn function(&mut self) -> PResult<Function> {
        if !self.eat_ident("tile.func") {
            return self.expected("`tile.func`");
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
    fn block(&mut self, args: Vec<(String, Type)>) -> PResult<Block> {
        if self.scopes.depth() > MAX_NESTING {
            return self.error(format!("regions nest more than {MAX_NESTING} deep"));
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

    fn op(&mut self) -> PResult<crate::OpId> {
        // Results: `%r =` or `%r:n =`.
        let mut result_names: Vec<String> = Vec::new();
        let mut group = None;
        if matches!(self.peek(), Tok::Percent(_)) {
            let n = self.name("a result")?;
            if self.eat(":") {
                let k = self.usize()?;
                group = Some((n, k));
            } else {
                result_names.push(n);
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
        // The kind's syntax, from a probe kind of the same name: attributes
        // come after the operands, so the real kind is built afterwards.
        let probe = probe_kind(&name).ok_or_else(|| at_name(format!("unknown op `{name}`")))?;
        let syn = probe.syntax();
        let mut operands = Vec::new();
        let mut index = None;
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
            Operands::Indexed { before } => {
                for _ in 0..before {
                    operands.push(self.value()?);
                    self.expect(",")?;
                }
                operands.push(self.value()?);
                index = Some(self.index_list()?);
                if self.eat_ident("mask") {
                    operands.push(self.value()?);
                }
            }
            Operands::Limits => index = Some(self.index_list()?),
        }
        let mut attrs = Vec::new();
        if matches!(self.peek(), Tok::Punct("{")) && !self.region_follows(syn.region) {
            self.bump();
            if !self.eat("}") {
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
        }
        let kind = OpKind::from_parts(&name, &attrs, index).map_err(at_name)?;
        // Region: `(%i, %c) { .. }` or `{ .. }`. Its argument types come
        // from the op: a loop's counter is an index, its carried values
        // have the types of the initial values.
        let mut regions = Vec::new();
        if let Some(with_args) = syn.region {
            let mut names = Vec::new();
            if with_args {
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
            let mut types = vec![Type::Index];
            types.extend(operands.iter().map(|v| self.f.ty(*v).clone()));
            if names.len() != types.len() && with_args {
                return self.error(format!(
                    "`{name}` has {} region arguments (the counter and one per carried value), got {}",
                    types.len(),
                    names.len()
                ));
            }
            self.expect("{")?;
            regions.push(self.block(names.into_iter().zip(types).collect())?);
        }
        let mut result_types = Vec::new();
        if self.eat(":") {
            result_types.push(self.ty()?);
            while self.eat(",") {
                result_types.push(self.ty()?);
            }
        }
        match &group {
            Some((n, k)) => {
                if result_types.len() != *k {
                    return self.error(format!(
                        "`%{n}:{k}` names {k} results, but {} types follow",
                        result_types.len()
                    ));
                }
            }
            None => {
                if result_types.len() != result_names.len() {
                    return self.error(format!(
                        "`{name}` has {} results and {} result types",
                        result_names.len(),
                        result_types.len()
                    ));
                }
            }
        }
        let id = self.f.create_op(kind, operands, &result_types, regions);
        let results = self.f.ops[id.0 as usize].results.clone();
        match group {
            Some((n, _)) => {
                for (k, v) in results.into_iter().enumerate() {
                    self.define(format!("{n}#{k}"), v)?;
                }
            }
            None => {
                for (n, v) in result_names.into_iter().zip(results) {
                    self.define(n, v)?;
                }
            }
        }
        Ok(id)
    }

    /// Whether the `{` ahead opens a region rather than attributes: it does
    /// when the op has a region without arguments and the braces do not
    /// start `name =`.
    fn region_follows(&self, region: Option<bool>) -> bool {
        region == Some(false)
            && !(matches!(self.peek_at(1), Tok::Ident(_))
                && matches!(self.peek_at(2), Tok::Punct("=")))
    }
}

/// A kind with the given name and placeholder attributes, whose syntax is
/// the real kind's (syntax never depends on attribute values).
fn probe_kind(name: &str) -> Option<OpKind> {
    let suffix = name.strip_prefix("tile.")?;
    let placeholder = match suffix {
        "load" => OpKind::Load {
            index: vec![],
            pad: None,
        },
        "store" => OpKind::Store { index: vec![] },
        "mask" => OpKind::Mask { limits: vec![] },
        "kernel" => OpKind::Kernel {
            grid: vec![],
            schedule: crate::ir::Schedule::Serial { vector: 1 },
        },
        "for" => OpKind::For {
            lo: 0,
            hi: 0,
            step: 1,
        },
        _ => {
            let attrs: Vec<(String, Attr)> = match suffix {
                "program_id" | "expand_dims" => vec![("axis".into(), Attr::Int(0))],
                "const" => vec![("value".into(), Attr::Float(0.0))],
                "global" => vec![("value".into(), Attr::Ints(vec![]))],
                "trans" => vec![("perm".into(), Attr::Ints(vec![]))],
                "reduce" => vec![
                    ("kind".into(), Attr::Word("sum".into())),
                    ("axis".into(), Attr::Int(0)),
                ],
                _ => vec![],
            };
            return OpKind::from_parts(name, &attrs, None).ok();
        }
    };
    Some(placeholder)
}
