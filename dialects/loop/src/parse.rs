//! Reads the loop dialect's text form. Errors carry line and column; the
//! verifier then checks what was read.

use dlc_core::lex::{Cursor, PResult, ParseError, Scopes, Tok};
use dlc_core::scalar::{BinaryOp, CmpOp, UnaryOp};
use dlc_core::{DType, parse_float};

use crate::ir::{Block, BufferType, Function, IndexExpr, Module, OpKind, Type, Value};

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

/// An op before it is created: kind, operands, result types, regions.
type OpParts = (OpKind, Vec<Value>, Vec<Type>, Vec<Block>);

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

    fn scalar(&mut self) -> PResult<DType> {
        self.dtype()
    }

    fn int_list(&mut self) -> PResult<Vec<usize>> {
        self.expect("[")?;
        let mut v = Vec::new();
        if !self.eat("]") {
            loop {
                v.push(self.usize()?);
                if self.eat("]") {
                    break;
                }
                self.expect(",")?;
            }
        }
        Ok(v)
    }

    /// `<f32[4, 8]>` or `<f32[4, 8], strides = [1, 4]>`, after `buffer`.
    fn buffer_rest(&mut self) -> PResult<BufferType> {
        self.expect("<")?;
        let dtype = self.dtype()?;
        let shape = self.int_list()?;
        let mut ty = BufferType::contiguous(dtype, shape);
        if self.eat(",") {
            if !self.eat_ident("strides") {
                return self.expected("`strides`");
            }
            self.expect("=")?;
            let strides = self.int_list()?;
            if strides.len() != ty.shape.len() {
                return self.error("one stride per dimension");
            }
            ty.strides = strides;
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

    fn index_expr(&mut self) -> PResult<IndexExpr> {
        let mut e = IndexExpr::default();
        let mut sign: i64 = if self.eat("-") { -1 } else { 1 };
        loop {
            let (coeff, var) = match self.peek().clone() {
                Tok::Int(i) => {
                    self.bump();
                    if self.eat("*") {
                        (i, Some(self.value()?))
                    } else {
                        (i, None)
                    }
                }
                Tok::Percent(_) => (1, Some(self.value()?)),
                _ => return self.expected("an index (`%i`, `2*%i`, `%i + 1`)"),
            };
            let Some(c) = coeff.checked_mul(sign) else {
                return self.error("index coefficient overflows");
            };
            match var {
                None => e.constant = e.constant.saturating_add(c),
                Some(v) => match e.terms.iter_mut().find(|(_, w)| *w == v) {
                    Some(t) => t.0 = t.0.saturating_add(c),
                    None => e.terms.push((c, v)),
                },
            }
            sign = if self.eat("+") {
                1
            } else if self.eat("-") {
                -1
            } else {
                break;
            };
        }
        e.terms.retain(|(c, _)| *c != 0);
        Ok(e)
    }

    fn index_list(&mut self) -> PResult<Vec<IndexExpr>> {
        self.expect("[")?;
        let mut v = Vec::new();
        if !self.eat("]") {
            loop {
                v.push(self.index_expr()?);
                if self.eat("]") {
                    break;
                }
                self.expect(",")?;
            }
        }
        Ok(v)
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

    /// The rest of `loop.for` and `loop.parallel` (kept out
    /// of `op`, which recurses through nested blocks).
    #[inline(never)]
    fn loop_op(&mut self, suffix: &str) -> PResult<OpParts> {
        let iv_name = self.name("the loop index `%i`")?;
        self.expect("=")?;
        let lo = self.int()?;
        if !self.eat_ident("to") {
            return self.expected("`to`");
        }
        let hi = self.int()?;
        let step = if suffix == "for" {
            if !self.eat_ident("step") {
                return self.expected("`step`");
            }
            self.int()?
        } else {
            1
        };
        let mut iter_names = Vec::new();
        let mut inits = Vec::new();
        let mut types = Vec::new();
        if suffix == "for" && self.eat_ident("iter") {
            self.expect("(")?;
            loop {
                iter_names.push(self.name("a carried value `%acc`")?);
                self.expect("=")?;
                inits.push(self.value()?);
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
            self.expect("->")?;
            types.push(self.ty()?);
            while self.eat(",") {
                types.push(self.ty()?);
            }
            if types.len() != inits.len() {
                return self.error(format!(
                    "{} carried value(s) but {} type(s)",
                    inits.len(),
                    types.len()
                ));
            }
        }
        self.expect("{")?;
        self.scopes.push();
        let iv = self.f.new_value(Type::Index);
        self.define(iv_name, iv)?;
        let mut args = vec![iv];
        for (n, t) in iter_names.into_iter().zip(&types) {
            let a = self.f.new_value(t.clone());
            self.define(n, a)?;
            args.push(a);
        }
        let body = self.block(args);
        self.scopes.pop();
        let kind = match suffix {
            "for" => OpKind::For { lo, hi, step },
            _ => OpKind::Parallel { lo, hi },
        };
        Ok((kind, inits, types, vec![body?]))
    }

    /// The rest of `loop.matmul` (a function of its own: `op` recurses
    /// through nested blocks, and its frame must stay small).
    #[inline(never)]
    fn matmul(&mut self) -> PResult<OpParts> {
        self.expect("(")?;
        let mut arg_names = vec![self.name("`%i`")?];
        for what in ["`%j`", "`%k`", "`%acc`"] {
            self.expect(",")?;
            arg_names.push(self.name(what)?);
        }
        self.expect(")")?;
        self.expect("=")?;
        self.expect("(")?;
        let m = self.int()?;
        self.expect(",")?;
        let n = self.int()?;
        self.expect(",")?;
        let k = self.int()?;
        self.expect(")")?;
        self.scopes.push();
        let mut args = Vec::new();
        for (i, name) in arg_names.into_iter().enumerate() {
            let t = if i < 3 {
                Type::Index
            } else {
                Type::Scalar(DType::F32)
            };
            let v = self.f.new_value(t);
            self.define(name, v)?;
            args.push(v);
        }
        let acc = args[3];
        let operands = (|| {
            let lhs = self.value()?;
            // The accumulator has the operands' accumulator type.
            if let Type::Buffer(t) = self.f.ty(lhs) {
                self.f.values[acc.0 as usize] = Type::Scalar(t.dtype.accumulator());
            }
            let a = self.index_list()?;
            self.expect("*")?;
            let rhs = self.value()?;
            let b = self.index_list()?;
            self.expect("{")?;
            Ok((lhs, a, rhs, b))
        })();
        let body = operands.and_then(|o| Ok((o, self.block(args)?)));
        self.scopes.pop();
        let ((lhs, a, rhs, b), body) = body?;
        Ok((
            OpKind::Matmul(Box::new(crate::ir::Contraction { m, n, k, a, b })),
            vec![lhs, rhs],
            vec![],
            vec![body],
        ))
    }

    fn op(&mut self) -> PResult<crate::ir::OpId> {
        let mut names = Vec::new();
        if matches!(self.peek(), Tok::Percent(_)) {
            names.push(self.name("a result name")?);
            while self.eat(",") {
                names.push(self.name("a result name")?);
            }
            self.expect("=")?;
        }
        let op_pos = self.pos;
        let opname = self.ident("an op name")?;
        let Some(suffix) = opname.strip_prefix("loop.") else {
            self.pos = op_pos;
            return self.error(format!("`{opname}` is not a loop dialect op"));
        };
        let (kind, operands, result_types, regions) = match suffix {
            "alloc" => {
                self.expect(":")?;
                let t = self.ty()?;
                (OpKind::Alloc, vec![], vec![t], vec![])
            }
            "dealloc" => (OpKind::Dealloc, vec![self.value()?], vec![], vec![]),
            "view" => {
                let b = self.value()?;
                self.expect(":")?;
                let t = self.ty()?;
                (OpKind::View, vec![b], vec![t], vec![])
            }
            "yield" => (OpKind::Yield, self.values()?, vec![], vec![]),
            "return" => (OpKind::Return, vec![], vec![], vec![]),
            "const" => {
                let v = self.number()?;
                self.expect(":")?;
                let d = self.scalar()?;
                (OpKind::Const(v), vec![], vec![Type::Scalar(d)], vec![])
            }
            "select" => {
                let ops = self.values()?;
                self.expect(":")?;
                let d = self.scalar()?;
                (OpKind::Select, ops, vec![Type::Scalar(d)], vec![])
            }
            "cast" => {
                let v = self.value()?;
                self.expect(":")?;
                self.scalar()?;
                if !self.eat_ident("to") {
                    return self.expected("`to`");
                }
                let d = self.scalar()?;
                (OpKind::Cast, vec![v], vec![Type::Scalar(d)], vec![])
            }
            "load" => {
                let b = self.value()?;
                let index = self.index_list()?;
                let pad = if self.eat_ident("pad") {
                    Some(self.number()?)
                } else {
                    None
                };
                self.expect(":")?;
                let d = self.scalar()?;
                (
                    OpKind::Load { index, pad },
                    vec![b],
                    vec![Type::Scalar(d)],
                    vec![],
                )
            }
            "store" => {
                let v = self.value()?;
                self.expect(",")?;
                let b = self.value()?;
                let index = self.index_list()?;
                (OpKind::Store { index }, vec![v, b], vec![], vec![])
            }
            "matmul" => self.matmul()?,
            "for" | "parallel" => self.loop_op(suffix)?,
            other => {
                let ops = self.values()?;
                self.expect(":")?;
                let d = self.scalar()?;
                let kind = if let Some(u) = UnaryOp::from_name(other) {
                    OpKind::Unary(u)
                } else if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == other) {
                    OpKind::Binary(b)
                } else if let Some(c) = CmpOp::ALL.into_iter().find(|c| c.name() == other) {
                    OpKind::Compare(c)
                } else {
                    self.pos = op_pos;
                    return self.error(format!("unknown op `{opname}`"));
                };
                let rt = if matches!(kind, OpKind::Compare(_)) {
                    DType::Bool
                } else {
                    d
                };
                (kind, ops, vec![Type::Scalar(rt)], vec![])
            }
        };
        if names.len() != result_types.len() {
            self.pos = op_pos;
            return self.error(format!(
                "`{opname}` has {} result(s), {} named",
                result_types.len(),
                names.len()
            ));
        }
        let id = self.f.create_op(kind, operands, &result_types, regions);
        let results = self.f.op(id).results.clone();
        for (n, v) in names.into_iter().zip(results) {
            self.define(n, v)?;
        }
        Ok(id)
    }
}
