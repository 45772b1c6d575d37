//! Reads the graph dialect's text form (see [`crate::print`]). Errors carry
//! the line and column of the offending token. The parser builds what the
//! text says; the verifier then checks that it makes sense.

use std::collections::HashMap;

use dlc_core::attr::Attr;
pub use dlc_core::lex::ParseError;
use dlc_core::lex::{Cursor, PResult, Tok, attr_entries, list_attr};
use dlc_core::{DType, TensorType, parse_float};
use petgraph::stable_graph::NodeIndex;

use crate::compute::{Affine, ComputeBody, ElemDef, IndexVar, RangeVar, ScalarExpr, Source};
use crate::module::{Function, Module, Value, Visibility};
use crate::ops::{BinaryOp, CmpOp, Op, ReduceKind, UnaryOp};

/// A number as written: an integer stays exact.
#[derive(Clone, Copy)]
enum Number {
    /// Written without `.` or exponent.
    Int(i64),
    /// Written with `.`, an exponent, `inf` or `nan`.
    Float(f64),
}

impl Number {
    fn as_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }
}

struct Parser {
    cursor: Cursor,
    depth: u32,
}

impl std::ops::Deref for Parser {
    type Target = Cursor;
    fn deref(&self) -> &Cursor {
        &self.cursor
    }
}

impl AsMut<Cursor> for Parser {
    fn as_mut(&mut self) -> &mut Cursor {
        &mut self.cursor
    }
}

impl std::ops::DerefMut for Parser {
    fn deref_mut(&mut self) -> &mut Cursor {
        &mut self.cursor
    }
}

/// Deepest scalar-expression nesting accepted in a compute body; deeper text
/// is an error, never a stack overflow.
pub const MAX_EXPR_DEPTH: u32 = 256;

/// Parses a whole module.
pub fn parse_module(text: &str) -> Result<Module, ParseError> {
    let mut p = Parser {
        cursor: Cursor::new(text)?,
        depth: 0,
    };
    let mut module = Module::default();
    while p.peek() != &Tok::Eof {
        module.functions.push(p.function()?);
    }
    Ok(module)
}

impl Parser {
    fn tensor_type(&mut self) -> PResult<TensorType> {
        let dtype = self.dtype()?;
        self.expect("[")?;
        let mut shape = Vec::new();
        if !self.eat("]") {
            loop {
                shape.push(self.usize()?);
                if self.eat("]") {
                    break;
                }
                self.expect(",")?;
            }
        }
        Ok(TensorType::new(dtype, shape))
    }

    fn function(&mut self) -> PResult<Function> {
        if !self.eat_ident("graph.func") {
            return self.expected("`graph.func`");
        }
        let visibility = if self.eat_ident("private") {
            Visibility::Private
        } else {
            Visibility::Public
        };
        let name = match self.bump() {
            Tok::At(n) => n,
            _ => {
                self.pos -= 1;
                return self.expected("a function name `@name`");
            }
        };
        let mut f = Function::new(name, visibility);
        let mut scope: HashMap<String, NodeIndex> = HashMap::new();
        self.expect("(")?;
        if !self.eat(")") {
            loop {
                let weight = self.eat_ident("weight");
                let pname = match self.peek().clone() {
                    Tok::Percent(n) => n,
                    _ => return self.expected("a parameter `%name` (or `weight %name`)"),
                };
                if scope.contains_key(&pname) {
                    return self.error(format!("`%{pname}` is defined twice"));
                }
                self.bump();
                self.expect(":")?;
                let ty = self.tensor_type()?;
                if weight {
                    f.weights.insert(f.params.len());
                }
                let v = f.add_param(pname.clone(), ty);
                scope.insert(pname, v.node);
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
        }
        self.expect("->")?;
        let declared = if self.eat("(") {
            let mut ts = Vec::new();
            loop {
                ts.push(self.tensor_type()?);
                if self.eat(")") {
                    break;
                }
                self.expect(",")?;
            }
            ts
        } else {
            vec![self.tensor_type()?]
        };
        self.expect("{")?;
        loop {
            if self.eat_ident("graph.return") {
                let ret_pos = self.pos;
                let mut results = vec![self.value(&f, &scope)?];
                while self.eat(",") {
                    results.push(self.value(&f, &scope)?);
                }
                f.results = results;
                if f.result_types() != declared {
                    let (_, line, column) = self.toks[ret_pos];
                    return Err(ParseError {
                        line,
                        column,
                        message: "returned types differ from the declared result types".into(),
                    });
                }
                self.expect("}")?;
                return Ok(f);
            }
            self.statement(&mut f, &mut scope)?;
        }
    }

    fn value(&mut self, f: &Function, scope: &HashMap<String, NodeIndex>) -> PResult<Value> {
        let name = match self.peek().clone() {
            Tok::Percent(n) => n,
            _ => return self.expected("a value `%name`"),
        };
        let Some(&node) = scope.get(&name) else {
            return self.error(format!("`%{name}` is not defined before this use"));
        };
        self.bump();
        let count = f.body[node].results.len();
        if self.eat("#") {
            let r = self.usize()?;
            if r >= count {
                return self.error(format!("`%{name}` has {count} result(s)"));
            }
            Ok(Value {
                node,
                result: r as u32,
            })
        } else if count != 1 {
            self.error(format!(
                "`%{name}` has {count} results: name one as `%{name}#N`"
            ))
        } else {
            Ok(Value::of(node))
        }
    }

    fn value_list(
        &mut self,
        f: &Function,
        scope: &HashMap<String, NodeIndex>,
    ) -> PResult<Vec<Value>> {
        let mut vs = Vec::new();
        if matches!(self.peek(), Tok::Percent(_)) {
            vs.push(self.value(f, scope)?);
            while self.eat(",") {
                vs.push(self.value(f, scope)?);
            }
        }
        Ok(vs)
    }

    fn statement(
        &mut self,
        f: &mut Function,
        scope: &mut HashMap<String, NodeIndex>,
    ) -> PResult<()> {
        let rname = match self.peek().clone() {
            Tok::Percent(n) => n,
            _ => return self.expected("an op `%name = ...` or `graph.return`"),
        };
        if scope.contains_key(&rname) {
            return self.error(format!("`%{rname}` is defined twice"));
        }
        self.bump();
        let count = if self.eat(":") { self.usize()? } else { 1 };
        self.expect("=")?;
        let op_pos = self.pos;
        let opname = self.ident("an op name")?;
        let (op, operands) = match opname.as_str() {
            "graph.call" => {
                let callee = match self.bump() {
                    Tok::At(c) => c,
                    _ => {
                        self.pos -= 1;
                        return self.expected("a callee `@name`");
                    }
                };
                self.expect("(")?;
                let args = self.value_list(f, scope)?;
                self.expect(")")?;
                (Op::Call { callee }, args)
            }
            "graph.compute" => {
                let name = match self.bump() {
                    Tok::Str(s) => s,
                    _ => {
                        self.pos -= 1;
                        return self.expected("the operator's name as a string");
                    }
                };
                let args = self.value_list(f, scope)?;
                self.expect("{")?;
                let body = self.compute_body(name)?;
                (Op::Compute(Box::new(body)), args)
            }
            "graph.param" => return self.error("graph.param appears only as a function parameter"),
            _ => {
                let args = self.value_list(f, scope)?;
                let attrs = if self.eat("{") {
                    attr_entries(self, Self::attr)?
                } else {
                    Vec::new()
                };
                match Op::from_parts(&opname, &attrs) {
                    Ok(op) => (op, args),
                    Err(m) => {
                        self.pos = op_pos;
                        return self.error(m);
                    }
                }
            }
        };
        self.expect(":")?;
        let mut types = vec![self.tensor_type()?];
        while self.eat(",") {
            types.push(self.tensor_type()?);
        }
        if types.len() != count {
            return self.error(format!(
                "{count} result(s) named but {} type(s) given",
                types.len()
            ));
        }
        let node = f.add_node(op, &operands, types);
        scope.insert(rname, node);
        Ok(())
    }

    fn number(&mut self) -> PResult<Number> {
        let neg = self.eat("-");
        let n = match self.bump() {
            Tok::Int(i) => Number::Int(i),
            Tok::Float(v) => Number::Float(v),
            Tok::Ident(s) if s == "inf" || s == "nan" => {
                Number::Float(parse_float(&s).unwrap_or(f64::NAN))
            }
            _ => {
                self.pos -= 1;
                return self.expected("a number");
            }
        };
        Ok(match (neg, n) {
            (false, n) => n,
            (true, Number::Int(i)) => Number::Int(-i),
            (true, Number::Float(v)) => Number::Float(-v),
        })
    }

    fn attr(&mut self) -> PResult<Attr> {
        match self.peek().clone() {
            Tok::Ident(s) if s == "true" || s == "false" => {
                self.bump();
                Ok(Attr::Bool(s == "true"))
            }
            Tok::Ident(s) if s.parse::<DType>().is_ok() => Ok(Attr::Type(self.dtype()?)),
            Tok::Punct("[") => list_attr(self, |p| p.number().map(Number::as_f64)),
            _ => Ok(match self.number()? {
                Number::Int(i) => Attr::Int(i),
                Number::Float(v) => Attr::Float(v),
            }),
        }
    }

    fn index_var(&mut self) -> PResult<IndexVar> {
        match self.peek().clone() {
            Tok::Ident(s) => match s.strip_prefix('d').and_then(|n| n.parse::<u32>().ok()) {
                Some(n) => {
                    self.bump();
                    Ok(IndexVar(n))
                }
                None => self.expected("an index variable `dN`"),
            },
            _ => self.expected("an index variable `dN`"),
        }
    }

    fn var_list(&mut self) -> PResult<Vec<IndexVar>> {
        self.expect("[")?;
        let mut vars = Vec::new();
        if !self.eat("]") {
            loop {
                vars.push(self.index_var()?);
                if self.eat("]") {
                    break;
                }
                self.expect(",")?;
            }
        }
        Ok(vars)
    }

    fn compute_body(&mut self, name: String) -> PResult<ComputeBody> {
        let mut locals = Vec::new();
        loop {
            if self.eat_ident("let") {
                let local = self.ident("a local name `tN`")?;
                if local != format!("t{}", locals.len()) {
                    self.pos -= 1;
                    return self.error(format!("expected local `t{}`", locals.len()));
                }
                let vars = self.var_list()?;
                self.expect(":")?;
                let ty = self.tensor_type()?;
                self.expect("=")?;
                let expr = self.sexpr(0)?;
                locals.push(ElemDef { vars, ty, expr });
            } else if self.eat_ident("out") {
                let vars = self.var_list()?;
                self.expect("=")?;
                let expr = self.sexpr(0)?;
                self.expect("}")?;
                // The output type is the op's result type, read after the body.
                let ty = self.peek_result_type()?;
                return Ok(ComputeBody {
                    name,
                    locals,
                    out: ElemDef { vars, ty, expr },
                });
            } else {
                return self.expected("`let` or `out`");
            }
        }
    }

    /// Looks ahead at `: TYPE` after a compute body without consuming it.
    fn peek_result_type(&mut self) -> PResult<TensorType> {
        let save = self.pos;
        self.expect(":")?;
        let ty = self.tensor_type();
        self.pos = save;
        ty
    }

    /// Scalar expressions by precedence level: 0 comparisons, 1 `+ -`,
    /// 2 `* /`, 3 unary and atoms.
    fn sexpr(&mut self, level: u8) -> PResult<ScalarExpr> {
        self.depth += 1;
        let r = if self.depth > MAX_EXPR_DEPTH {
            self.error(format!(
                "expression nests deeper than {MAX_EXPR_DEPTH} levels"
            ))
        } else {
            self.sexpr_level(level)
        };
        self.depth -= 1;
        r
    }

    fn sexpr_level(&mut self, level: u8) -> PResult<ScalarExpr> {
        if level == 3 {
            return self.satom();
        }
        let mut lhs = self.sexpr(level + 1)?;
        loop {
            let op = match (level, self.peek()) {
                (0, Tok::Punct(p)) => CmpOp::ALL.into_iter().find(|c| c.symbol() == *p).map(Err),
                (1, Tok::Punct("+")) => Some(Ok(BinaryOp::Add)),
                (1, Tok::Punct("-")) => Some(Ok(BinaryOp::Sub)),
                (2, Tok::Punct("*")) => Some(Ok(BinaryOp::Mul)),
                (2, Tok::Punct("/")) => Some(Ok(BinaryOp::Div)),
                _ => None,
            };
            let Some(op) = op else { return Ok(lhs) };
            self.bump();
            let rhs = self.sexpr(level + 1)?;
            lhs = match op {
                Ok(b) => ScalarExpr::Binary(b, Box::new(lhs), Box::new(rhs)),
                Err(c) => ScalarExpr::Compare(c, Box::new(lhs), Box::new(rhs)),
            };
        }
    }

    fn args(&mut self, n: usize) -> PResult<Vec<ScalarExpr>> {
        self.expect("(")?;
        let mut args = vec![self.sexpr(0)?];
        for _ in 1..n {
            self.expect(",")?;
            args.push(self.sexpr(0)?);
        }
        self.expect(")")?;
        Ok(args)
    }

    fn satom(&mut self) -> PResult<ScalarExpr> {
        match self.peek().clone() {
            Tok::Punct("-") => {
                if matches!(self.peek_at(1), Tok::Int(_) | Tok::Float(_)) {
                    return Ok(ScalarExpr::Const(self.number()?.as_f64()));
                }
                self.bump();
                Ok(ScalarExpr::Unary(UnaryOp::Neg, Box::new(self.sexpr(3)?)))
            }
            Tok::Int(_) | Tok::Float(_) => Ok(ScalarExpr::Const(self.number()?.as_f64())),
            Tok::Punct("(") => {
                self.bump();
                let e = self.sexpr(0)?;
                self.expect(")")?;
                Ok(e)
            }
            Tok::Ident(s) => {
                if s == "inf" || s == "nan" {
                    return Ok(ScalarExpr::Const(self.number()?.as_f64()));
                }
                self.bump();
                let src = s
                    .strip_prefix("in")
                    .and_then(|n| n.parse().ok())
                    .map(Source::Input)
                    .or_else(|| {
                        s.strip_prefix('t')
                            .and_then(|n| n.parse().ok())
                            .map(Source::Local)
                    });
                if let Some(src) = src {
                    self.expect("[")?;
                    let mut index = Vec::new();
                    if !self.eat("]") {
                        loop {
                            index.push(self.affine()?);
                            if self.eat("]") {
                                break;
                            }
                            self.expect(",")?;
                        }
                    }
                    return Ok(ScalarExpr::Read { src, index });
                }
                if let Some(kind) = ReduceKind::from_name(&s)
                    && matches!(self.peek(), Tok::Punct("["))
                {
                    self.bump();
                    let mut vars = Vec::new();
                    loop {
                        let var = self.index_var()?;
                        if !self.eat_ident("in") {
                            return self.expected("`in`");
                        }
                        let lo = self.int()?;
                        self.expect("..")?;
                        let hi = self.int()?;
                        vars.push(RangeVar { var, lo, hi });
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                    }
                    let body = self.args(1)?.remove(0);
                    return Ok(ScalarExpr::Reduce {
                        kind,
                        vars,
                        body: Box::new(body),
                    });
                }
                if let Some(u) = UnaryOp::from_name(&s) {
                    let a = self.args(1)?.remove(0);
                    return Ok(ScalarExpr::Unary(u, Box::new(a)));
                }
                if let Some(b) = BinaryOp::ALL
                    .into_iter()
                    .find(|b| b.function_name() == Some(s.as_str()))
                {
                    let mut a = self.args(2)?;
                    let r = a.remove(1);
                    return Ok(ScalarExpr::Binary(b, Box::new(a.remove(0)), Box::new(r)));
                }
                match s.as_str() {
                    "where" => {
                        let mut a = self.args(3)?;
                        let (c, x, y) = (a.remove(0), a.remove(0), a.remove(0));
                        Ok(ScalarExpr::Select(Box::new(c), Box::new(x), Box::new(y)))
                    }
                    "cast" => {
                        self.expect("(")?;
                        let e = self.sexpr(0)?;
                        self.expect(",")?;
                        let t = self.dtype()?;
                        self.expect(")")?;
                        Ok(ScalarExpr::Cast(t, Box::new(e)))
                    }
                    _ => {
                        self.pos -= 1;
                        self.error(format!("unknown name `{s}` in a compute body"))
                    }
                }
            }
            _ => self.expected("a scalar expression"),
        }
    }

    fn affine(&mut self) -> PResult<Affine> {
        let mut terms: Vec<(i64, IndexVar)> = Vec::new();
        let mut constant = 0i64;
        let mut sign = if self.eat("-") { -1 } else { 1 };
        loop {
            let (coeff, var) = match self.peek().clone() {
                Tok::Int(i) => {
                    self.bump();
                    if self.eat("*") {
                        (i, Some(self.index_var()?))
                    } else {
                        (i, None)
                    }
                }
                Tok::Ident(_) => (1, Some(self.index_var()?)),
                _ => return self.expected("an affine index (`d0`, `2*d1`, `d0 + 1`)"),
            };
            let Some(c) = coeff.checked_mul(sign) else {
                return self.error("index coefficient overflows");
            };
            match var {
                None => constant = constant.saturating_add(c),
                Some(v) => match terms.iter_mut().find(|(_, w)| *w == v) {
                    Some(t) => t.0 = t.0.saturating_add(c),
                    None => terms.push((c, v)),
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
        terms.retain(|(c, _)| *c != 0);
        Ok(Affine { terms, constant })
    }
}
