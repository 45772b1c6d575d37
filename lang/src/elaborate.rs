//! From AST to graph: name resolution, generic instantiation by shape
//! inference, shape and element-type checking of everything, and the
//! translation of index-notation operators into `graph.compute` bodies.
//!
//! Literals are weakly typed: `x * 2.0` takes `x`'s element type. A literal
//! that meets no tensor becomes [`DEFAULT_FLOAT`] or [`DEFAULT_INT`].

use std::collections::{HashMap, HashSet};

use dlc_core::{DType, TensorType, Verify};
use dlc_graph::compute::{
    Affine, ComputeBody, ElemDef as GElemDef, IndexVar, RangeVar, ScalarExpr, Source,
};
use dlc_graph::infer::infer;
use dlc_graph::ops::{BinaryOp, CmpOp, ConstValue, PoolKind, ReduceKind, UnaryOp};
use dlc_graph::verify::scalar_dtype;
use dlc_graph::{Function, Module, Op, Value, Visibility};

use crate::ast::*;

pub mod builtins;
mod composite;
mod training;
use crate::diag::{Diagnostic, Diagnostics};
use builtins::Call;

/// The element type of a float literal that meets no tensor.
pub const DEFAULT_FLOAT: DType = DType::F32;
/// The element type of an integer literal that meets no tensor.
pub const DEFAULT_INT: DType = DType::I64;

/// How deeply function calls may nest while instantiating.
const MAX_CALL_DEPTH: usize = 64;

/// The bitwise operator or shift called `name` (`bitand`, `shl`).
fn bitwise(name: &str) -> Option<BinaryOp> {
    BinaryOp::ALL
        .into_iter()
        .find(|b| b.is_bitwise() && b.name() == name)
}

type R<T> = Result<T, Diagnostic>;

/// A value during elaboration.
#[derive(Debug, Clone)]
enum EVal {
    Tensor(Value),
    /// A literal not yet given a type: value and whether it was written as a float.
    Lit(f64, bool),
    Tuple(Vec<Value>),
    /// A name whose definition failed (and was reported): using it stops
    /// the statement silently, so one mistake gives one error.
    Poisoned,
}

/// What a call of a user `fn` or `op` is checked against.
struct Signature<'a> {
    what: &'static str,
    name: &'a Ident,
    dims: &'a [Ident],
    params: &'a [Param],
}

struct FnCx {
    f: Function,
    env: HashMap<String, (EVal, Span)>,
    dims: HashMap<String, usize>,
}

struct Elab<'p> {
    fns: HashMap<&'p str, &'p FnDef>,
    ops: HashMap<&'p str, &'p OpDef>,
    module: Module,
    in_progress: Vec<String>,
    /// Generic functions and operators that some call instantiated.
    used: HashSet<String>,
    /// Where byte offsets of the source are, when it came from a file: ops
    /// carry their place.
    lines: Option<dlc_core::LineIndex>,
    /// Further errors of a function whose first error is being returned
    /// (each statement of a function is checked, so a function may have
    /// several); collected after each entry point.
    pending: Vec<Diagnostic>,
}

/// Dimension values for checking a generic function or operator that no
/// entry point calls: distinct primes, large enough that dimension
/// arithmetic such as `N - 1` stays positive.
const PROBE_DIMS: [usize; 12] = [67, 71, 73, 79, 83, 89, 97, 101, 103, 107, 109, 113];

/// Checks a program and builds its graph module: one public function per
/// entry point (a `fn` with a concrete signature) and one private function
/// per instantiation of a generic `fn`, called through `graph.call`.
/// With `lines` (the source's line index), every op written in the source
/// carries its place.
pub fn elaborate(
    program: &Program,
    lines: Option<dlc_core::LineIndex>,
) -> Result<Module, Diagnostics> {
    let mut errors = Vec::new();
    let mut elab = Elab {
        fns: HashMap::new(),
        ops: HashMap::new(),
        module: Module::default(),
        in_progress: vec![],
        used: HashSet::new(),
        pending: Vec::new(),
        lines,
    };
    let mut seen: HashMap<&str, Span> = HashMap::new();
    for item in &program.items {
        let (name, dims, params) = match item {
            Item::Fn(f) => (&f.name, &f.dims, &f.params),
            Item::Op(o) => (&o.name, &o.dims, &o.params),
        };
        if let Some(prev) = seen.get(name.name.as_str()) {
            errors.push(
                Diagnostic::new(
                    format!("`{}` is defined twice", name.name),
                    name.span,
                    "defined again here",
                )
                .with_secondary(*prev, "first defined here"),
            );
            continue;
        }
        if builtins::is_reserved(&name.name) {
            errors.push(Diagnostic::new(
                format!(
                    "`{}` is a built-in function and cannot be redefined",
                    name.name
                ),
                name.span,
                "built-in name",
            ));
            continue;
        }
        seen.insert(&name.name, name.span);
        if let Err(d) = check_modifiers(item) {
            errors.push(d);
            continue;
        }
        if let Err(d) = check_distinct(dims, "dimension parameter").and_then(|_| {
            check_distinct(
                &params.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
                "parameter",
            )
        }) {
            errors.push(d);
            continue;
        }
        match item {
            Item::Fn(f) => {
                elab.fns.insert(&f.name.name, f);
            }
            Item::Op(o) => {
                elab.ops.insert(&o.name.name, o);
            }
        }
    }
    let entries: Vec<&FnDef> = program
        .items
        .iter()
        .filter_map(|i| match i {
            Item::Fn(f) if f.dims.is_empty() && elab.fns.get(f.name.name.as_str()) == Some(&f) => {
                Some(f)
            }
            _ => None,
        })
        .collect();
    if entries.is_empty() && errors.is_empty() {
        let span = match program.items.first() {
            Some(Item::Fn(f)) => f.name.span,
            Some(Item::Op(o)) => o.name.span,
            None => Span::new(0, 0),
        };
        errors.push(
            Diagnostic::new("no entry point: the program has no `fn` with a concrete signature", span, "no entry point")
                .with_note("an entry point is a `fn` without dimension parameters, such as `fn f(x: f32[4]) -> f32[4]`"),
        );
    }
    for def in entries {
        if let Err(d) = elab.ensure_fn(def, &[], None) {
            errors.push(d);
        }
        errors.append(&mut elab.pending);
    }
    if errors.is_empty() {
        errors.extend(elab.check_uncalled(program));
    }
    errors.retain(|d| !d.follow_on);
    // A broken generic function called twice with the same dimensions is
    // reported once (at its first call).
    let mut seen_errors = HashSet::new();
    errors.retain(|d| seen_errors.insert((d.message.clone(), d.primary.0)));
    if !errors.is_empty() {
        return Err(Diagnostics(errors));
    }
    // Entry points first, in source order, then instances.
    let order: HashMap<&str, usize> = program
        .items
        .iter()
        .enumerate()
        .filter_map(|(i, it)| match it {
            Item::Fn(f) => Some((f.name.name.as_str(), i)),
            Item::Op(_) => None,
        })
        .collect();
    let mut module = elab.module;
    module.functions.sort_by_key(|f| {
        (
            f.visibility == Visibility::Private,
            order.get(f.name.as_str()).copied().unwrap_or(usize::MAX),
        )
    });
    if let Err(errs) = module.verify() {
        let msg: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        return Err(Diagnostics(vec![Diagnostic::new(
            format!(
                "internal error: the front end built invalid IR: {}",
                msg.join("; ")
            ),
            Span::new(0, 0),
            "",
        )]));
    }
    Ok(module)
}

/// Checks the words before parameter names: `weight` on a `fn`'s
/// parameters, nothing on an `op`'s.
fn check_modifiers(item: &Item) -> R<()> {
    let (params, is_op) = match item {
        Item::Fn(f) => (&f.params, false),
        Item::Op(o) => (&o.params, true),
    };
    for p in params {
        let Some(m) = &p.modifier else { continue };
        if m.name != "weight" {
            return Err(Diagnostic::new(
                format!("unknown parameter modifier `{}`", m.name),
                m.span,
                "expected `weight` or a parameter name",
            )
            .with_note(
                "`weight x: f32[..]` declares `x` a weight: bound once, read by every call",
            ));
        }
        if is_op {
            return Err(Diagnostic::new(
                format!("`weight` on parameter `{}` of an `op`", p.name.name),
                m.span,
                "only a `fn`'s parameters can be weights",
            )
            .with_note(
                "an `op` is expanded where it is used; mark the weights of the `fn` that uses it",
            ));
        }
    }
    Ok(())
}

fn check_distinct(names: &[Ident], what: &str) -> R<()> {
    let mut seen: HashMap<&str, Span> = HashMap::new();
    for n in names {
        if let Some(prev) = seen.insert(&n.name, n.span) {
            return Err(Diagnostic::new(
                format!("{what} `{}` is declared twice", n.name),
                n.span,
                "declared again here",
            )
            .with_secondary(prev, "first declared here"));
        }
    }
    Ok(())
}

const EXPECTED_DTYPE: &str =
    "expected f16, bf16, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64 or bool";

fn parse_dtype(id: &Ident) -> R<DType> {
    id.name.parse().map_err(|_| {
        Diagnostic::new(
            format!("unknown element type `{}`", id.name),
            id.span,
            EXPECTED_DTYPE,
        )
    })
}

fn eval_dim(d: &DimExpr, dims: &HashMap<String, usize>) -> R<i64> {
    match d {
        DimExpr::Int(v, _) => Ok(*v),
        DimExpr::Name(id) => dims.get(&id.name).map(|&v| v as i64).ok_or_else(|| {
            Diagnostic::new(
                format!("unknown dimension `{}`", id.name),
                id.span,
                "not a dimension parameter",
            )
            .with_note("declare dimension parameters after the name: `fn f[M, N](...)`")
        }),
        DimExpr::Binary(op, a, b, span) => {
            let (x, y) = (eval_dim(a, dims)?, eval_dim(b, dims)?);
            let v = match op {
                DimOp::Add => x.checked_add(y),
                DimOp::Sub => x.checked_sub(y),
                DimOp::Mul => x.checked_mul(y),
            };
            v.ok_or_else(|| Diagnostic::new("dimension arithmetic overflows", *span, "overflow"))
        }
    }
}

fn check_type_size(ty: &TensorType, span: Span) -> R<()> {
    match ty.num_elements().and_then(|n| n.checked_mul(8)) {
        Some(_) => Ok(()),
        None => Err(Diagnostic::new(
            format!("tensor type {ty} has too many elements"),
            span,
            "too large",
        )),
    }
}

fn resolve_type(te: &TypeExpr, dims: &HashMap<String, usize>) -> R<TensorType> {
    let dtype = parse_dtype(&te.dtype)?;
    let mut shape = Vec::new();
    for d in &te.dims {
        let v = eval_dim(d, dims)?;
        if v <= 0 {
            return Err(Diagnostic::new(
                format!("dimension must be positive, got {v}"),
                d.span(),
                "not positive",
            ));
        }
        shape.push(
            usize::try_from(v).map_err(|_| Diagnostic::new("dimension too large", d.span(), ""))?,
        );
    }
    let ty = TensorType::new(dtype, shape);
    check_type_size(&ty, te.span)?;
    Ok(ty)
}

/// An integer constant: a literal, a dimension parameter, or `+ - *` of those.
fn const_int(e: &Expr, dims: &HashMap<String, usize>) -> R<i64> {
    let err = || {
        Diagnostic::new(
            "expected an integer constant",
            e.span,
            "not an integer constant",
        )
    };
    let overflow = || Diagnostic::new("integer constant overflows", e.span, "overflow");
    match &e.kind {
        ExprKind::Int(v) => Ok(*v),
        ExprKind::Var(n) => dims.get(n).map(|&d| d as i64).ok_or_else(err),
        ExprKind::Neg(x) => const_int(x, dims)?.checked_neg().ok_or_else(overflow),
        ExprKind::Binary(op @ (BinOp::Add | BinOp::Sub | BinOp::Mul), a, b) => {
            let (x, y) = (const_int(a, dims)?, const_int(b, dims)?);
            match op {
                BinOp::Add => x.checked_add(y),
                BinOp::Sub => x.checked_sub(y),
                _ => x.checked_mul(y),
            }
            .ok_or_else(overflow)
        }
        _ => Err(err()),
    }
}

fn const_ints(e: &Expr, dims: &HashMap<String, usize>) -> R<Vec<(i64, Span)>> {
    match &e.kind {
        ExprKind::List(items) | ExprKind::Tuple(items) => items
            .iter()
            .map(|i| Ok((const_int(i, dims)?, i.span)))
            .collect(),
        _ => Err(Diagnostic::new(
            "expected a list of integers such as `[4, -1]`",
            e.span,
            "not a list of integers",
        )),
    }
}

fn const_int_or_list(e: &Expr, dims: &HashMap<String, usize>) -> R<Vec<(i64, Span)>> {
    match &e.kind {
        ExprKind::List(_) | ExprKind::Tuple(_) => const_ints(e, dims),
        _ => Ok(vec![(const_int(e, dims)?, e.span)]),
    }
}

fn const_float(e: &Expr) -> R<(f64, bool)> {
    match &e.kind {
        ExprKind::Int(v) => Ok((*v as f64, false)),
        ExprKind::Float(v) => Ok((*v, true)),
        ExprKind::Neg(x) => const_float(x).map(|(v, f)| (-v, f)),
        _ => Err(Diagnostic::new(
            "expected a number",
            e.span,
            "not a constant number",
        )),
    }
}

fn const_bool(e: &Expr) -> R<bool> {
    match &e.kind {
        ExprKind::Bool(b) => Ok(*b),
        _ => Err(Diagnostic::new(
            "expected `true` or `false`",
            e.span,
            "not a boolean constant",
        )),
    }
}

fn dtype_arg(e: &Expr) -> R<DType> {
    match &e.kind {
        ExprKind::Var(n) => parse_dtype(&Ident {
            name: n.clone(),
            span: e.span,
        }),
        _ => Err(Diagnostic::new(
            "expected an element type",
            e.span,
            EXPECTED_DTYPE,
        )),
    }
}

fn positive_shape(items: &[(i64, Span)]) -> R<Vec<usize>> {
    items
        .iter()
        .map(|&(v, s)| {
            if v <= 0 {
                Err(Diagnostic::new(
                    format!("dimension must be positive, got {v}"),
                    s,
                    "not positive",
                ))
            } else {
                Ok(v as usize)
            }
        })
        .collect()
}

fn normalize_axis(ax: i64, ty: &TensorType, span: Span) -> R<usize> {
    let rank = ty.rank() as i64;
    if ax < -rank || ax >= rank {
        return Err(Diagnostic::new(
            format!("axis {ax} is out of range for {ty} (rank {rank})"),
            span,
            format!("axis {ax}"),
        ));
    }
    Ok(if ax < 0 {
        (ax + rank) as usize
    } else {
        ax as usize
    })
}

fn normalize_axes(items: &[(i64, Span)], ty: &TensorType) -> R<Vec<usize>> {
    let mut axes = Vec::new();
    for &(a, s) in items {
        let n = normalize_axis(a, ty, s)?;
        if axes.contains(&n) {
            return Err(Diagnostic::new(
                format!("axis {a} is listed twice"),
                s,
                "repeated axis",
            ));
        }
        axes.push(n);
    }
    axes.sort_unstable();
    Ok(axes)
}

fn pair_arg(
    e: Option<&Expr>,
    default: [usize; 2],
    what: &str,
    dims: &HashMap<String, usize>,
) -> R<[usize; 2]> {
    ints_arg(e, default, what, dims)
}

/// A count per spatial axis given as `n` (every axis) or `[n0, n1, ..]`
/// (`N` of them: a stride, a padding), not negative; `default` where none
/// is given.
fn ints_arg<const N: usize>(
    e: Option<&Expr>,
    default: [usize; N],
    what: &str,
    dims: &HashMap<String, usize>,
) -> R<[usize; N]> {
    let Some(e) = e else { return Ok(default) };
    let items = const_int_or_list(e, dims)?;
    let vals: Vec<i64> = match items[..] {
        [(v, _)] => vec![v; N],
        _ => items.iter().map(|(v, _)| *v).collect(),
    };
    let Ok(vals) = <[i64; N]>::try_from(vals) else {
        let (count, form) = match N {
            2 => ("two", "`n` or `[h, w]`"),
            3 => ("three", "`n` or `[t, h, w]`"),
            _ => unreachable!("counts for two or three spatial axes"),
        };
        return Err(Diagnostic::new(
            format!("`{what}` takes one integer or {count}"),
            e.span,
            format!("expected {form}"),
        ));
    };
    if vals.iter().any(|v| *v < 0) {
        return Err(Diagnostic::new(
            format!("`{what}` must not be negative"),
            e.span,
            "negative",
        ));
    }
    Ok(vals.map(|v| v as usize))
}

/// Binds call arguments to parameter names as Python does: positionals in
/// order, then keywords by name.
fn bind<'e>(
    callee: &Ident,
    args: &'e [Arg],
    params: &[&str],
    required: usize,
    span: Span,
) -> R<Vec<Option<&'e Expr>>> {
    let mut slots: Vec<Option<&Expr>> = vec![None; params.len()];
    let mut seen_kw = false;
    for (i, a) in args.iter().enumerate() {
        match &a.name {
            None => {
                if seen_kw {
                    return Err(Diagnostic::new(
                        "positional argument after a keyword argument",
                        a.value.span,
                        "positional",
                    ));
                }
                if i >= params.len() {
                    return Err(Diagnostic::new(
                        format!(
                            "`{}` takes at most {} argument(s), got {}",
                            callee.name,
                            params.len(),
                            args.len()
                        ),
                        a.value.span,
                        "extra argument",
                    ));
                }
                slots[i] = Some(&a.value);
            }
            Some(k) => {
                seen_kw = true;
                let Some(pos) = params.iter().position(|p| *p == k.name) else {
                    return Err(Diagnostic::new(
                        format!(
                            "`{}` has no argument `{}`; it takes: {}",
                            callee.name,
                            k.name,
                            params.join(", ")
                        ),
                        k.span,
                        "unknown argument",
                    ));
                };
                if slots[pos].is_some() {
                    return Err(Diagnostic::new(
                        format!("argument `{}` is given twice", k.name),
                        k.span,
                        "given again",
                    ));
                }
                slots[pos] = Some(&a.value);
            }
        }
    }
    for (i, p) in params.iter().enumerate().take(required) {
        if slots[i].is_none() {
            return Err(Diagnostic::new(
                format!("`{}` needs argument `{p}`", callee.name),
                span,
                format!("missing `{p}`"),
            ));
        }
    }
    Ok(slots)
}

/// A required argument, which [`bind`] has checked is present.
fn req<'e>(a: &[Option<&'e Expr>], i: usize) -> &'e Expr {
    a[i].unwrap_or_else(|| unreachable!("bind checked that required argument {i} is present"))
}

/// The type of `tensor(values, shape, dtype)`: `dtype` by default follows
/// the values as a literal does (`f32` if any is written as a float, `bool`
/// if all are `true`/`false`, else `i64`).
fn dense_type(a: &[Option<&Expr>], dims: &HashMap<String, usize>, span: Span) -> R<TensorType> {
    let shape = match &req(a, 1).kind {
        ExprKind::List(items) if items.is_empty() => Vec::new(),
        _ => positive_shape(&const_ints(req(a, 1), dims)?)?,
    };
    let dtype = match a[2] {
        Some(e) => dtype_arg(e)?,
        None => {
            let items = match &req(a, 0).kind {
                ExprKind::List(items) => items.as_slice(),
                _ => &[],
            };
            let is = |k: fn(&ExprKind) -> bool| items.iter().any(|e| k(&strip_neg(e).kind));
            if !items.is_empty() && items.iter().all(|e| matches!(e.kind, ExprKind::Bool(_))) {
                DType::Bool
            } else {
                literal_dtype(is(|k| matches!(k, ExprKind::Float(_) | ExprKind::Var(_))))
            }
        }
    };
    let ty = TensorType::new(dtype, shape);
    check_type_size(&ty, span)?;
    Ok(ty)
}

fn strip_neg(e: &Expr) -> &Expr {
    match &e.kind {
        ExprKind::Neg(x) => strip_neg(x),
        _ => e,
    }
}

/// The elements of `tensor(values, ...)`, rounded to `dtype`: numbers
/// (`inf` and `nan` for floats), or `true`/`false` for bool.
fn dense_values(e: &Expr, dtype: DType) -> R<Vec<f64>> {
    let ExprKind::List(items) = &e.kind else {
        return Err(Diagnostic::new(
            "tensor: expected a list of numbers such as `[1.0, 2.0]`",
            e.span,
            "not a list",
        ));
    };
    items
        .iter()
        .map(|item| {
            let (v, is_float) = match &item.kind {
                ExprKind::Bool(b) if dtype == DType::Bool => (f64::from(u8::from(*b)), false),
                _ => dense_number(item)?,
            };
            if is_float && !dtype.is_float() {
                return Err(Diagnostic::new(
                    format!("the number `{v}` cannot be a {dtype}"),
                    item.span,
                    "type mismatch",
                ));
            }
            if out_of_range(v, dtype) {
                return Err(Diagnostic::new(
                    format!("{v} does not fit in {dtype}"),
                    item.span,
                    "out of range",
                ));
            }
            Ok(dtype.round(v))
        })
        .collect()
}

/// Whether the number `v` is not a value of `dtype` (an integer outside
/// its range; a bool other than 0 and 1).
fn out_of_range(v: f64, dtype: DType) -> bool {
    match (dtype.int_min(), dtype.int_max()) {
        (Some(lo), Some(hi)) => v < lo || v > hi,
        _ => dtype == DType::Bool && v != 0.0 && v != 1.0,
    }
}

fn dense_number(e: &Expr) -> R<(f64, bool)> {
    match &e.kind {
        ExprKind::Var(n) if n == "inf" => Ok((f64::INFINITY, true)),
        ExprKind::Var(n) if n == "nan" => Ok((f64::NAN, true)),
        ExprKind::Neg(x) => dense_number(x).map(|(v, f)| (-v, f)),
        _ => const_float(e),
    }
}

fn literal_dtype(is_float: bool) -> DType {
    if is_float { DEFAULT_FLOAT } else { DEFAULT_INT }
}

impl<'p> Elab<'p> {
    /// Checks generic functions and operators that no entry point calls, at
    /// placeholder dimensions, so that errors in them are reported too. What
    /// the check builds is thrown away.
    fn check_uncalled(&mut self, program: &'p Program) -> Vec<Diagnostic> {
        let mut errors = Vec::new();
        for item in &program.items {
            let (name, dims) = match item {
                Item::Fn(f) if !f.dims.is_empty() => (&f.name, &f.dims),
                Item::Op(o) => (&o.name, &o.dims),
                Item::Fn(_) => continue,
            };
            if self.used.contains(&name.name) || dims.len() > PROBE_DIMS.len() {
                continue;
            }
            let values = &PROBE_DIMS[..dims.len()];
            let binds: Vec<String> = dims
                .iter()
                .zip(values)
                .map(|(d, v)| format!("{}={v}", d.name))
                .collect();
            let note = format!(
                "`{}` is never called, so it was checked with placeholder dimensions {}",
                name.name,
                if binds.is_empty() {
                    "(none)".to_string()
                } else {
                    binds.join(", ")
                }
            );
            let kept = self.module.functions.len();
            let result = match item {
                Item::Fn(f) => self.ensure_fn(f, values, None).map(|_| ()),
                Item::Op(o) => {
                    let env: HashMap<String, usize> = o
                        .dims
                        .iter()
                        .map(|d| d.name.clone())
                        .zip(values.iter().copied())
                        .collect();
                    o.params
                        .iter()
                        .map(|p| resolve_type(&p.ty, &env))
                        .collect::<R<Vec<_>>>()
                        .and_then(|inputs| Ok((inputs, resolve_type(&o.ret, &env)?)))
                        .and_then(|(inputs, out)| build_compute(o, &inputs, &env, out).map(|_| ()))
                }
            };
            self.module.functions.truncate(kept);
            if let Err(d) = result {
                errors.push(d.with_note(note.clone()));
            }
            errors.extend(self.pending.drain(..).map(|d| d.with_note(note.clone())));
        }
        errors
    }

    fn ensure_fn(
        &mut self,
        def: &'p FnDef,
        dims: &[usize],
        call: Option<(Span, String)>,
    ) -> R<String> {
        let name = if def.dims.is_empty() {
            def.name.name.clone()
        } else {
            let mut n = def.name.name.clone();
            for d in dims {
                n.push('$');
                n.push_str(&d.to_string());
            }
            n
        };
        if self.module.function(&name).is_some() {
            return Ok(name);
        }
        if self.in_progress.contains(&name)
            || self
                .in_progress
                .iter()
                .any(|p| p.split('$').next() == Some(&def.name.name))
        {
            let span = call.as_ref().map_or(def.name.span, |c| c.0);
            return Err(Diagnostic::new(
                format!("recursive call of `{}`: a function cannot call itself, directly or through others", def.name.name),
                span,
                "recursive call",
            )
            .with_secondary(def.name.span, format!("`{}` is defined here", def.name.name)));
        }
        if self.in_progress.len() >= MAX_CALL_DEPTH {
            let span = call.as_ref().map_or(def.name.span, |c| c.0);
            return Err(Diagnostic::new(
                format!("function calls nest deeper than {MAX_CALL_DEPTH} levels"),
                span,
                "too deep",
            ));
        }
        let dim_env: HashMap<String, usize> = def
            .dims
            .iter()
            .map(|d| d.name.clone())
            .zip(dims.iter().copied())
            .collect();
        self.in_progress.push(name.clone());
        let visibility = if def.dims.is_empty() {
            Visibility::Public
        } else {
            Visibility::Private
        };
        let r = self.build_fn(def, dim_env, name.clone(), visibility);
        self.in_progress.pop();
        match (r, call) {
            (Ok(()), _) => Ok(name),
            (Err(d), Some((span, what))) if d.primary.0 != span => {
                Err(d.with_secondary(span, what))
            }
            (Err(d), _) => Err(d),
        }
    }

    /// Checks one statement of a function body and adds its ops.
    fn stmt(
        &mut self,
        cx: &mut FnCx,
        stmt: &Stmt,
        returned: &mut Option<(Vec<(EVal, Span)>, Span)>,
    ) -> R<()> {
        match stmt {
            Stmt::Let {
                names,
                tuple,
                value,
                ..
            } => {
                let v = self.expr(cx, value)?;
                let bindings: Vec<(Ident, EVal)> = match (*tuple, v) {
                    (false, v) => vec![(names[0].clone(), v)],
                    (true, EVal::Tuple(vs)) if vs.len() == names.len() => names
                        .iter()
                        .cloned()
                        .zip(vs.into_iter().map(EVal::Tensor))
                        .collect(),
                    (true, EVal::Tuple(vs)) => {
                        return Err(Diagnostic::new(
                            format!(
                                "{} name(s) bound to a tuple of {} value(s)",
                                names.len(),
                                vs.len()
                            ),
                            value.span,
                            format!("{} values", vs.len()),
                        ));
                    }
                    (true, _) => {
                        return Err(Diagnostic::new(
                            "only a tuple can be unpacked",
                            value.span,
                            "not a tuple",
                        ));
                    }
                };
                if names.len() > 1 {
                    check_distinct(names, "name")?;
                }
                // Rebinding a name replaces it for the statements after,
                // as assignment does in Python.
                for (n, v) in bindings {
                    cx.env.insert(n.name.clone(), (v, n.span));
                }
            }
            Stmt::Return { value, span } => {
                let vals = match &value.kind {
                    ExprKind::Tuple(items) => items
                        .iter()
                        .map(|e| Ok((self.expr(cx, e)?, e.span)))
                        .collect::<R<Vec<_>>>()?,
                    _ => match self.expr(cx, value)? {
                        EVal::Tuple(vs) => vs
                            .into_iter()
                            .map(|v| (EVal::Tensor(v), value.span))
                            .collect(),
                        v => vec![(v, value.span)],
                    },
                };
                *returned = Some((vals, *span));
            }
        }
        Ok(())
    }

    fn build_fn(
        &mut self,
        def: &'p FnDef,
        dims: HashMap<String, usize>,
        name: String,
        vis: Visibility,
    ) -> R<()> {
        let mut cx = FnCx {
            f: Function::new(name, vis),
            env: HashMap::new(),
            dims,
        };
        for p in &def.params {
            let ty = resolve_type(&p.ty, &cx.dims)?;
            if p.modifier.is_some() {
                cx.f.weights.insert(cx.f.params.len());
            }
            let v = cx.f.add_param(p.name.name.clone(), ty);
            cx.env
                .insert(p.name.name.clone(), (EVal::Tensor(v), p.name.span));
        }
        let declared: Vec<TensorType> = def
            .ret
            .iter()
            .map(|t| resolve_type(t, &cx.dims))
            .collect::<R<_>>()?;
        let mut returned: Option<(Vec<(EVal, Span)>, Span)> = None;
        let mut failures: Vec<Diagnostic> = Vec::new();
        for stmt in &def.body {
            if let Some((_, rspan)) = &returned {
                let span = match stmt {
                    Stmt::Let { span, .. } | Stmt::Return { span, .. } => *span,
                };
                return Err(
                    Diagnostic::new("statement after `return`", span, "unreachable")
                        .with_secondary(*rspan, "the function returns here"),
                );
            }
            if let Err(d) = self.stmt(&mut cx, stmt, &mut returned) {
                failures.push(d);
                // What the statement defines is poisoned: later uses stop
                // their statements without a second report.
                match stmt {
                    Stmt::Let { names, .. } => {
                        for n in names {
                            cx.env.insert(n.name.clone(), (EVal::Poisoned, n.span));
                        }
                    }
                    Stmt::Return { span, .. } => returned = Some((Vec::new(), *span)),
                }
            }
        }
        failures.retain(|d| !d.follow_on);
        if !failures.is_empty() {
            let first = failures.remove(0);
            self.pending.extend(failures);
            return Err(first);
        }
        let Some((vals, rspan)) = returned else {
            return Err(Diagnostic::new(
                format!("`{}` never returns a value", def.name.name),
                def.name.span,
                "no `return`",
            ));
        };
        if vals.len() != declared.len() {
            return Err(Diagnostic::new(
                format!(
                    "`{}` returns {} value(s) but declares {}",
                    def.name.name,
                    vals.len(),
                    declared.len()
                ),
                rspan,
                format!("{} value(s)", vals.len()),
            ));
        }
        let mut results = Vec::new();
        for (((v, span), want), te) in vals.into_iter().zip(&declared).zip(&def.ret) {
            let v = match v {
                EVal::Lit(x, is_float) if want.rank() == 0 => {
                    self.materialize(&mut cx, x, is_float, want.dtype, span)?
                }
                other => self.as_tensor(&mut cx, other, span)?,
            };
            let got = cx.f.value_type(v).clone();
            if &got != want {
                return Err(Diagnostic::new(
                    format!("`{}` returns {got} where it declares {want}", def.name.name),
                    span,
                    format!("this is {got}"),
                )
                .with_secondary(te.span, "declared here"));
            }
            results.push(v);
        }
        cx.f.results = results;
        self.module.functions.push(cx.f);
        Ok(())
    }

    fn materialize(
        &mut self,
        cx: &mut FnCx,
        x: f64,
        is_float: bool,
        dtype: DType,
        span: Span,
    ) -> R<Value> {
        if is_float && !dtype.is_float() || dtype == DType::Bool {
            return Err(Diagnostic::new(
                format!("the number `{x}` cannot be a {dtype}"),
                span,
                format!("{dtype} expected here"),
            ));
        }
        if out_of_range(x, dtype) {
            return Err(Diagnostic::new(
                format!("{x} does not fit in {dtype}"),
                span,
                "out of range",
            ));
        }
        Ok(cx.f.add_op(
            Op::Constant(ConstValue::Splat(dtype.round(x))),
            &[],
            TensorType::scalar(dtype),
        ))
    }

    fn as_tensor(&mut self, cx: &mut FnCx, v: EVal, span: Span) -> R<Value> {
        match v {
            EVal::Tensor(v) => Ok(v),
            EVal::Lit(x, f) => self.materialize(cx, x, f, literal_dtype(f), span),
            EVal::Tuple(_) => Err(Diagnostic::new(
                "a tuple cannot be used as a tensor",
                span,
                "tuple",
            )),
            EVal::Poisoned => Err(Diagnostic::follow_on(span)),
        }
    }

    fn tensor(&mut self, cx: &mut FnCx, e: &Expr) -> R<Value> {
        let v = self.expr(cx, e)?;
        self.as_tensor(cx, v, e.span)
    }

    /// A non-empty list of tensors, the first argument of `what`
    /// (`concat([a, b], axis=0)`).
    fn tensor_list(&mut self, cx: &mut FnCx, list: &Expr, what: &str) -> R<Vec<Value>> {
        let ExprKind::List(items) = &list.kind else {
            return Err(Diagnostic::new(
                format!("{what} takes a list of tensors: `{what}([a, b], axis=0)`"),
                list.span,
                "not a list",
            ));
        };
        if items.is_empty() {
            return Err(Diagnostic::new(
                format!("{what} needs at least one tensor"),
                list.span,
                "empty list",
            ));
        }
        items.iter().map(|e| self.tensor(cx, e)).collect()
    }

    fn ty(cx: &FnCx, v: Value) -> TensorType {
        cx.f.value_type(v).clone()
    }

    fn add(&mut self, cx: &mut FnCx, op: Op, operands: &[Value], span: Span) -> R<Value> {
        let types: Vec<TensorType> = operands.iter().map(|v| Self::ty(cx, *v)).collect();
        let refs: Vec<&TensorType> = types.iter().collect();
        let mut results = infer(&op, &refs).map_err(|e| {
            let label = if e.label.is_empty() {
                "here".to_string()
            } else {
                e.label.clone()
            };
            // Users wrote `+` or `exp(...)`, not graph ops: drop the dialect prefix.
            let message = e
                .message
                .strip_prefix("graph.")
                .map_or(e.message.clone(), str::to_string);
            Diagnostic::new(message, span, label)
        })?;
        for r in &results {
            check_type_size(r, span)?;
        }
        let v = cx.f.add_op(op, operands, results.remove(0));
        cx.f.body[v.node].loc = self.lines.as_ref().map(|l| l.loc(span.start));
        Ok(v)
    }

    /// Two operands of an element-wise op, with literals taking the other's type.
    fn pair(&mut self, cx: &mut FnCx, a: EVal, b: EVal, sa: Span, sb: Span) -> R<(Value, Value)> {
        match (a, b) {
            (EVal::Lit(x, fx), EVal::Tensor(v)) => {
                let d = Self::ty(cx, v).dtype;
                Ok((self.materialize(cx, x, fx, d, sa)?, v))
            }
            (EVal::Tensor(v), EVal::Lit(y, fy)) => {
                let d = Self::ty(cx, v).dtype;
                Ok((v, self.materialize(cx, y, fy, d, sb)?))
            }
            (EVal::Lit(x, fx), EVal::Lit(y, fy)) => {
                let d = literal_dtype(fx || fy);
                Ok((
                    self.materialize(cx, x, fx || fy, d, sa)?,
                    self.materialize(cx, y, fx || fy, d, sb)?,
                ))
            }
            (a, b) => Ok((self.as_tensor(cx, a, sa)?, self.as_tensor(cx, b, sb)?)),
        }
    }

    fn expr(&mut self, cx: &mut FnCx, e: &Expr) -> R<EVal> {
        match &e.kind {
            ExprKind::Int(v) => Ok(EVal::Lit(*v as f64, false)),
            ExprKind::Float(v) => Ok(EVal::Lit(*v, true)),
            ExprKind::Bool(b) => Ok(EVal::Tensor(cx.f.add_op(
                Op::Constant(ConstValue::Splat(f64::from(u8::from(*b)))),
                &[],
                TensorType::scalar(DType::Bool),
            ))),
            ExprKind::Var(n) => match cx.env.get(n) {
                Some((EVal::Poisoned, _)) => Err(Diagnostic::follow_on(e.span)),
                Some((v, _)) => Ok(v.clone()),
                None if cx.dims.contains_key(n) => Ok(EVal::Lit(cx.dims[n] as f64, false)),
                None if self.fns.contains_key(n.as_str())
                    || self.ops.contains_key(n.as_str())
                    || builtins::is_builtin(n) =>
                {
                    Err(Diagnostic::new(
                        format!("`{n}` is a function, not a value; call it: `{n}(...)`"),
                        e.span,
                        "not a value",
                    ))
                }
                None => Err(
                    Diagnostic::new(format!("unknown name `{n}`"), e.span, "not defined")
                        .with_suggestion(
                            n,
                            cx.env.keys().chain(cx.dims.keys()).map(String::as_str),
                        ),
                ),
            },
            ExprKind::Neg(x) => match self.expr(cx, x)? {
                EVal::Lit(v, f) => Ok(EVal::Lit(-v, f)),
                v => {
                    let v = self.as_tensor(cx, v, x.span)?;
                    Ok(EVal::Tensor(self.add(
                        cx,
                        Op::Unary(UnaryOp::Neg),
                        &[v],
                        e.span,
                    )?))
                }
            },
            ExprKind::Binary(op, a, b) => {
                let va = self.expr(cx, a)?;
                let vb = self.expr(cx, b)?;
                if let (EVal::Lit(x, fx), EVal::Lit(y, fy)) = (&va, &vb)
                    && let Some(r) = fold_literals(*op, *x, *fx, *y, *fy, e.span)?
                {
                    return Ok(r);
                }
                let (x, y) = self.pair(cx, va, vb, a.span, b.span)?;
                let gop = match op {
                    BinOp::Add => Op::Binary(BinaryOp::Add),
                    BinOp::Sub => Op::Binary(BinaryOp::Sub),
                    BinOp::Mul => Op::Binary(BinaryOp::Mul),
                    BinOp::Div => Op::Binary(BinaryOp::Div),
                    BinOp::MatMul => Op::MatMul,
                    BinOp::Lt => Op::Compare(CmpOp::Lt),
                    BinOp::Le => Op::Compare(CmpOp::Le),
                    BinOp::Gt => Op::Compare(CmpOp::Gt),
                    BinOp::Ge => Op::Compare(CmpOp::Ge),
                    BinOp::Eq => Op::Compare(CmpOp::Eq),
                    BinOp::Ne => Op::Compare(CmpOp::Ne),
                };
                Ok(EVal::Tensor(self.add(cx, gop, &[x, y], e.span)?))
            }
            ExprKind::Call(f, args) => self.call(cx, f, args, e.span),
            ExprKind::Bracket(name, _, _) => Err(Diagnostic::new(
                format!(
                    "index notation (`{}[...]`) is only allowed in the body of an `op`",
                    name.name
                ),
                e.span,
                "index notation",
            )
            .with_note("define an `op` in index notation and call it here")),
            ExprKind::List(_) => Err(Diagnostic::new(
                "a list is not a tensor; lists are arguments of built-ins such as `concat([a, b])` and `reshape(x, [2, -1])`",
                e.span,
                "list",
            )),
            ExprKind::Tuple(_) => Err(Diagnostic::new(
                "a tuple can only be returned",
                e.span,
                "tuple",
            )),
        }
    }

    fn call(&mut self, cx: &mut FnCx, f: &Ident, args: &[Arg], span: Span) -> R<EVal> {
        if let Some(def) = self.fns.get(f.name.as_str()).copied() {
            return self.call_fn(cx, def, f, args, span);
        }
        if let Some(def) = self.ops.get(f.name.as_str()).copied() {
            return self.call_op(cx, def, f, args, span);
        }
        if let Some(b) = builtins::lookup(&f.name) {
            return self.call_builtin(cx, b, f, args, span);
        }
        let known = self.fns.keys().chain(self.ops.keys()).copied();
        Err(Diagnostic::new(
            format!("unknown function `{}`", f.name),
            f.span,
            "not defined",
        )
        .with_suggestion(&f.name, known.chain(builtins::builtins().map(|b| b.name))))
    }

    /// `value_and_grad(loss(a, b, ..), wrt=[a, b])`: what the call returns,
    /// then the gradient of its first result (a float scalar) with respect
    /// to the arguments named by `wrt` (names passed to the call), in that
    /// order; by default with respect to the callee's weights (every float
    /// parameter when it declares none). The gradient is the function
    /// `graph.grad` derives from the callee, called here.
    pub(super) fn value_and_grad(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let (a, span) = (&c.a, c.span);
        let call = req(a, 0);
        let usage = "write `value_and_grad(loss(x, w), wrt=[w])`";
        let autocast = match a[2] {
            Some(e) => match dtype_arg(e)? {
                d @ (DType::BF16 | DType::F16) => Some(d),
                d => {
                    return Err(Diagnostic::new(
                        format!("`autocast` computes products in bf16 or f16, not {d}"),
                        e.span,
                        "not a narrow float type",
                    ));
                }
            },
            None => None,
        };
        let ExprKind::Call(callee, cargs) = &call.kind else {
            return Err(Diagnostic::new(
                "the first argument of `value_and_grad` must be a call of a `fn`",
                call.span,
                "not a call",
            )
            .with_note(usage));
        };
        let Some(def) = self.fns.get(callee.name.as_str()).copied() else {
            let what = if self.ops.contains_key(callee.name.as_str()) {
                "an `op`; call it from a `fn` and differentiate that"
            } else {
                "not a function defined with `fn`"
            };
            return Err(Diagnostic::new(
                format!(
                    "`value_and_grad` differentiates a `fn`: `{}` is {what}",
                    callee.name
                ),
                callee.span,
                "not a `fn`",
            )
            .with_note(usage));
        };
        let (values, name) = self.instantiate(cx, def, callee, cargs, call.span)?;
        let positions: Vec<usize> = match a[1] {
            None => match self.module.function(&name) {
                Some(g) => dlc_graph::autodiff::default_wrt(g),
                None => vec![],
            },
            Some(list) => {
                let ExprKind::List(items) = &list.kind else {
                    return Err(Diagnostic::new(
                        "`wrt` lists the arguments to differentiate with respect to, by name",
                        list.span,
                        "not a list",
                    )
                    .with_note(usage));
                };
                let mut positions = Vec::new();
                for item in items {
                    let ExprKind::Var(n) = &item.kind else {
                        return Err(Diagnostic::new(
                            "`wrt` names arguments of the call",
                            item.span,
                            "not a name",
                        )
                        .with_note(usage));
                    };
                    let at: Vec<usize> = cargs
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| matches!(&c.value.kind, ExprKind::Var(m) if m == n))
                        .map(|(i, _)| i)
                        .collect();
                    match at[..] {
                        [i] if !positions.contains(&i) => positions.push(i),
                        [_] => {
                            return Err(Diagnostic::new(
                                format!("`{n}` is listed twice in `wrt`"),
                                item.span,
                                "listed again",
                            ));
                        }
                        [] => {
                            return Err(Diagnostic::new(
                                format!(
                                    "`{n}` is not an argument of this call of `{}`",
                                    callee.name
                                ),
                                item.span,
                                "not passed to the call",
                            )
                            .with_secondary(call.span, "the call"));
                        }
                        _ => {
                            return Err(Diagnostic::new(
                                format!(
                                    "`{n}` is passed to `{}` more than once: differentiate a function that takes it once",
                                    callee.name
                                ),
                                item.span,
                                "ambiguous",
                            ));
                        }
                    }
                }
                positions
            }
        };
        let Some(callee_fn) = self.module.function(&name) else {
            return Err(Diagnostic::new(
                format!("`{}` could not be built", callee.name),
                call.span,
                "here",
            ));
        };
        let wrt: Vec<String> = positions
            .iter()
            .map(|&p| callee_fn.params[p].0.clone())
            .collect();
        // The loss scale, of the differentiated result's type (checked to
        // be a float scalar by the derivation).
        let loss_dtype = callee_fn
            .result_types()
            .first()
            .map(|t| t.dtype)
            .filter(|d| d.is_float())
            .unwrap_or(DEFAULT_FLOAT);
        let mut values = values;
        if let Some(e) = a[3] {
            let s = self.positive_scalar(cx, e, loss_dtype, "a loss scale")?;
            values.push(s);
        }
        let options = dlc_graph::autodiff::GradOptions {
            autocast,
            scaled: a[3].is_some(),
        };
        let mut gname = format!("{name}$grad");
        for p in &positions {
            gname.push('$');
            gname.push_str(&p.to_string());
        }
        if let Some(d) = autocast {
            gname.push_str(&format!("${d}"));
        }
        if options.scaled {
            gname.push_str("$scaled");
        }
        if self.module.function(&gname).is_none() {
            dlc_graph::autodiff::add_grad_function_with(
                &mut self.module,
                &name,
                &wrt,
                &gname,
                &options,
            )
            .map_err(|e| {
                let d = Diagnostic::new(
                    format!("cannot differentiate `{}`: {}", callee.name, e.message),
                    call.span,
                    "differentiated here",
                );
                match e.loc {
                    Some(loc) => d.with_note(format!("the op is at {loc}")),
                    None => d,
                }
            })?;
            if let Some(g) = self.module.functions.iter_mut().find(|g| g.name == gname) {
                g.visibility = Visibility::Private;
            }
        }
        let results = self
            .module
            .function(&gname)
            .map(Function::result_types)
            .unwrap_or_default();
        let n = results.len() as u32;
        let node = cx.f.add_node(Op::Call { callee: gname }, &values, results);
        cx.f.body[node].loc = self.lines.as_ref().map(|l| l.loc(span.start));
        Ok(EVal::Tuple(
            (0..n).map(|r| Value { node, result: r }).collect(),
        ))
    }

    /// `checkpoint(f(args))`: what the call returns; a gradient through it
    /// recomputes `f`'s intermediate values from `args` instead of keeping
    /// them (the call is of `f$checkpoint`, a copy of `f` marked
    /// [`Function::recompute`]).
    pub(super) fn checkpoint(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let (a, span) = (&c.a, c.span);
        let call = req(a, 0);
        let usage = "write `checkpoint(block(x, w))` inside the function you differentiate";
        let ExprKind::Call(callee, cargs) = &call.kind else {
            return Err(Diagnostic::new(
                "the argument of `checkpoint` must be a call of a `fn`",
                call.span,
                "not a call",
            )
            .with_note(usage));
        };
        let Some(def) = self.fns.get(callee.name.as_str()).copied() else {
            return Err(Diagnostic::new(
                format!(
                    "`checkpoint` recomputes a `fn`: `{}` is not a function defined with `fn`",
                    callee.name
                ),
                callee.span,
                "not a `fn`",
            )
            .with_note(usage));
        };
        let (values, name) = self.instantiate(cx, def, callee, cargs, call.span)?;
        let marked = format!("{name}$checkpoint");
        if self.module.function(&marked).is_none()
            && let Some(g) = self.module.function(&name)
        {
            let mut g = g.clone();
            g.name.clone_from(&marked);
            g.visibility = Visibility::Private;
            g.recompute = true;
            self.module.functions.push(g);
        }
        Ok(self.emit_call(cx, marked, &values, def.ret_tuple, Some(span)))
    }

    /// Evaluates the arguments of a user `fn` or `op` and infers its dimension parameters.
    fn bind_user(
        &mut self,
        cx: &mut FnCx,
        sig: Signature<'_>,
        args: &[Arg],
        span: Span,
    ) -> R<(Vec<Value>, HashMap<String, usize>)> {
        let Signature {
            what,
            name,
            dims,
            params,
        } = sig;
        if let Some(k) = args.iter().find_map(|a| a.name.as_ref()) {
            return Err(Diagnostic::new(
                format!("{what} `{}` takes positional arguments only", name.name),
                k.span,
                "keyword argument",
            ));
        }
        if args.len() != params.len() {
            return Err(Diagnostic::new(
                format!(
                    "{what} `{}` takes {} argument(s), got {}",
                    name.name,
                    params.len(),
                    args.len()
                ),
                span,
                format!("{} argument(s)", args.len()),
            )
            .with_secondary(name.span, "called here"));
        }
        let dim_names: HashSet<&str> = dims.iter().map(|d| d.name.as_str()).collect();
        let mut env: HashMap<String, usize> = HashMap::new();
        let mut values = Vec::new();
        for (p, a) in params.iter().zip(args) {
            let want_dtype = parse_dtype(&p.ty.dtype)?;
            let v = match self.expr(cx, &a.value)? {
                EVal::Lit(x, f) if p.ty.dims.is_empty() => {
                    self.materialize(cx, x, f, want_dtype, a.value.span)?
                }
                v => self.as_tensor(cx, v, a.value.span)?,
            };
            let got = Self::ty(cx, v);
            let mismatch = |detail: String| {
                Diagnostic::new(
                    format!(
                        "argument `{}` of `{}` must be {}, got {got}",
                        p.name.name,
                        name.name,
                        type_text(&p.ty)
                    ),
                    a.value.span,
                    detail,
                )
                .with_secondary(p.ty.span, "parameter declared here")
            };
            if got.dtype != want_dtype {
                return Err(mismatch(format!("{} vs {want_dtype}", got.dtype)));
            }
            if got.rank() != p.ty.dims.len() {
                return Err(mismatch(format!(
                    "rank {} vs {}",
                    got.rank(),
                    p.ty.dims.len()
                )));
            }
            for (d, &actual) in p.ty.dims.iter().zip(&got.shape) {
                if let DimExpr::Name(id) = d
                    && dim_names.contains(id.name.as_str())
                    && !env.contains_key(&id.name)
                {
                    env.insert(id.name.clone(), actual);
                    continue;
                }
                let want = eval_dim(d, &env).map_err(|e| match dims.iter().find(|p| !env.contains_key(&p.name) && dim_mentions(d, &p.name)) {
                    Some(p) => Diagnostic::new(
                        format!("cannot infer dimension `{}` of `{}`: it must appear alone as a dimension of an earlier parameter", p.name, name.name),
                        d.span(),
                        "inferred only from a bare dimension",
                    )
                    .with_secondary(a.value.span, "in this argument"),
                    None => e,
                })?;
                if want != actual as i64 {
                    let label = match d {
                        DimExpr::Name(id) => format!("{} is {want} here, got {actual}", id.name),
                        _ => format!("{want} vs {actual}"),
                    };
                    return Err(mismatch(label));
                }
            }
            values.push(v);
        }
        if let Some(d) = dims.iter().find(|d| !env.contains_key(&d.name)) {
            return Err(Diagnostic::new(
                format!(
                    "cannot infer dimension `{}` of `{}` from its arguments",
                    d.name, name.name
                ),
                span,
                "in this call",
            )
            .with_secondary(d.span, "declared here"));
        }
        Ok((values, env))
    }

    /// Binds a call of the user `fn` `def` and instantiates it: the
    /// arguments' values and the name of the instance called.
    fn instantiate(
        &mut self,
        cx: &mut FnCx,
        def: &'p FnDef,
        callee: &Ident,
        args: &[Arg],
        span: Span,
    ) -> R<(Vec<Value>, String)> {
        self.used.insert(def.name.name.clone());
        let (values, env) = self.bind_user(
            cx,
            Signature {
                what: "function",
                name: &def.name,
                dims: &def.dims,
                params: &def.params,
            },
            args,
            span,
        )?;
        let dims: Vec<usize> = def.dims.iter().map(|d| env[&d.name]).collect();
        let what = if dims.is_empty() {
            format!("in this call of `{}`", callee.name)
        } else {
            let binds: Vec<String> = def
                .dims
                .iter()
                .zip(&dims)
                .map(|(d, v)| format!("{}={v}", d.name))
                .collect();
            format!(
                "in this call of `{}` with {}",
                callee.name,
                binds.join(", ")
            )
        };
        let name = self.ensure_fn(def, &dims, Some((span, what)))?;
        Ok((values, name))
    }

    fn call_fn(
        &mut self,
        cx: &mut FnCx,
        def: &'p FnDef,
        callee: &Ident,
        args: &[Arg],
        span: Span,
    ) -> R<EVal> {
        let (values, name) = self.instantiate(cx, def, callee, args, span)?;
        Ok(self.emit_call(cx, name, &values, def.ret_tuple, None))
    }

    /// A `graph.call` of the module's function `name` on `values`, marked
    /// with the source place `at` when given: its one result, or a tuple of
    /// them (always a tuple when the `fn` declares a tuple result).
    fn emit_call(
        &self,
        cx: &mut FnCx,
        name: String,
        values: &[Value],
        ret_tuple: bool,
        at: Option<Span>,
    ) -> EVal {
        let results = self
            .module
            .function(&name)
            .map(Function::result_types)
            .unwrap_or_default();
        let n = results.len();
        let node = cx.f.add_node(Op::Call { callee: name }, values, results);
        if let Some(span) = at {
            cx.f.body[node].loc = self.lines.as_ref().map(|l| l.loc(span.start));
        }
        if n == 1 && !ret_tuple {
            EVal::Tensor(Value::of(node))
        } else {
            EVal::Tuple((0..n as u32).map(|r| Value { node, result: r }).collect())
        }
    }

    fn call_op(
        &mut self,
        cx: &mut FnCx,
        def: &'p OpDef,
        callee: &Ident,
        args: &[Arg],
        span: Span,
    ) -> R<EVal> {
        self.used.insert(def.name.name.clone());
        let (values, env) = self.bind_user(
            cx,
            Signature {
                what: "operator",
                name: &def.name,
                dims: &def.dims,
                params: &def.params,
            },
            args,
            span,
        )?;
        let out_ty = resolve_type(&def.ret, &env)?;
        let inputs: Vec<TensorType> = values.iter().map(|v| Self::ty(cx, *v)).collect();
        let body = build_compute(def, &inputs, &env, out_ty).map_err(|d| {
            if d.primary.0 == span {
                d
            } else {
                d.with_secondary(span, format!("in this call of `{}`", callee.name))
            }
        })?;
        Ok(EVal::Tensor(self.add(
            cx,
            Op::Compute(Box::new(body)),
            &values,
            span,
        )?))
    }

    /// `sum`, `mean`, `max`, `min`, `prod`.
    pub(super) fn call_sum(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let a = &c.a;
        let kind = ReduceKind::from_name(c.name())
            .unwrap_or_else(|| unreachable!("the table lists `{}` as a reduction", c.name()));
        if matches!(kind, ReduceKind::Max | ReduceKind::Min)
            && c.args.len() == 2
            && c.args.iter().all(|a| a.name.is_none())
        {
            // `max(a, b)`: the element-wise maximum.
            let b = if kind == ReduceKind::Max {
                BinaryOp::Max
            } else {
                BinaryOp::Min
            };
            return self.elementwise_pair(cx, b, c);
        }
        let (x, ty) = self.first_tensor(cx, c)?;
        let axes = match a[1] {
            Some(e) => normalize_axes(&const_int_or_list(e, &cx.dims)?, &ty)?,
            None => (0..ty.rank()).collect(),
        };
        let keepdims = c.flag(2)?;
        let op = Op::Reduce {
            kind,
            axes,
            keepdims,
        };
        Ok(EVal::Tensor(self.add(cx, op, &[x], c.span)?))
    }

    /// `softmax`.
    pub(super) fn call_softmax(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let t = |v: Value| EVal::Tensor(v);
        let (x, ty) = self.first_tensor(cx, c)?;
        let axis = c.axis(1, &ty, &cx.dims)?;
        Ok(t(self.add(cx, Op::Softmax { axis }, &[x], span)?))
    }

    /// `layernorm`.
    pub(super) fn call_layernorm(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let (x, ty) = self.first_tensor(cx, c)?;
        let axes = match a[1] {
            Some(e) => normalize_axes(&const_int_or_list(e, &cx.dims)?, &ty)?,
            None => vec![c.axis(1, &ty, &cx.dims)?],
        };
        let eps = c.float(2)?;
        Ok(t(self.add(cx, Op::LayerNorm { axes, eps }, &[x], span)?))
    }

    /// `reshape`.
    pub(super) fn call_reshape(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let (x, ty) = self.first_tensor(cx, c)?;
        let items = const_ints(req(a, 1), &cx.dims)?;
        let shape = reshape_target(&items, &ty, req(a, 1).span)?;
        Ok(t(self.add(cx, Op::Reshape { shape }, &[x], span)?))
    }

    /// `transpose`.
    pub(super) fn call_transpose(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let (x, ty) = self.first_tensor(cx, c)?;
        let perm = match a[1] {
            Some(e) => {
                let items = const_ints(e, &cx.dims)?;
                if items.len() != ty.rank() {
                    return Err(Diagnostic::new(
                        format!(
                            "transpose of {ty} needs a permutation of {} axes, got {}",
                            ty.rank(),
                            items.len()
                        ),
                        e.span,
                        "wrong length",
                    ));
                }
                let perm: Vec<usize> = items
                    .iter()
                    .map(|&(v, s)| normalize_axis(v, &ty, s))
                    .collect::<R<_>>()?;
                perm
            }
            None => (0..ty.rank()).rev().collect(),
        };
        Ok(t(self.add(cx, Op::Transpose { perm }, &[x], span)?))
    }

    /// `concat`.
    pub(super) fn call_concat(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let vals = self.tensor_list(cx, req(a, 0), "concat")?;
        let ty = Self::ty(cx, vals[0]);
        let axis = c.axis(1, &ty, &cx.dims)?;
        Ok(t(self.add(cx, Op::Concat { axis }, &vals, span)?))
    }

    /// `slice`.
    pub(super) fn call_slice(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let (x, ty) = self.first_tensor(cx, c)?;
        let axis = c.axis(1, &ty, &cx.dims)?;
        let dim = ty.shape[axis] as i64;
        let fix = |v: i64| if v < 0 { v + dim } else { v };
        let start = fix(c.int(2, &cx.dims)?);
        let end = fix(a[3]
            .map(|e| const_int(e, &cx.dims))
            .transpose()?
            .unwrap_or(dim));
        if !(0 <= start && start < end && end <= dim) {
            return Err(Diagnostic::new(
                format!("slice {start}..{end} is empty or out of range for axis {axis} of {ty}"),
                span,
                format!("axis {axis} has extent {dim}"),
            ));
        }
        let op = Op::Slice {
            axis,
            start: start as usize,
            end: end as usize,
        };
        Ok(t(self.add(cx, op, &[x], span)?))
    }

    /// `broadcast`.
    pub(super) fn call_broadcast(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let x = self.tensor(cx, req(a, 0))?;
        let shape = positive_shape(&const_ints(req(a, 1), &cx.dims)?)?;
        Ok(t(self.add(cx, Op::Broadcast { shape }, &[x], span)?))
    }

    /// `conv2d`.
    pub(super) fn call_conv2d(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let x = self.tensor(cx, req(a, 0))?;
        let w = self.tensor(cx, req(a, 1))?;
        let stride = c.pair(2, &cx.dims)?;
        let padding = c.pair(3, &cx.dims)?;
        let groups = usize::try_from(c.int(4, &cx.dims)?).map_err(|_| {
            Diagnostic::new(
                "groups must be positive",
                a[4].map_or(c.span, |e| e.span),
                "not positive",
            )
        })?;
        let dilation = c.pair(5, &cx.dims)?;
        if dilation.contains(&0) {
            return Err(Diagnostic::new(
                "dilation must be positive",
                a[5].map_or(c.span, |e| e.span),
                "not positive",
            ));
        }
        Ok(t(self.add(
            cx,
            Op::Conv2d {
                stride,
                padding,
                groups,
                dilation,
            },
            &[x, w],
            span,
        )?))
    }

    /// `maxpool2d`, `avgpool2d`.
    pub(super) fn call_maxpool2d(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let x = self.tensor(cx, req(a, 0))?;
        let kernel = pair_arg(a[1], [1, 1], "kernel", &cx.dims)?;
        let stride = pair_arg(a[2], kernel, "stride", &cx.dims)?;
        let padding = c.pair(3, &cx.dims)?;
        let kind = if name == "maxpool2d" {
            PoolKind::Max
        } else {
            PoolKind::Avg
        };
        Ok(t(self.add(
            cx,
            Op::Pool2d {
                kind,
                kernel,
                stride,
                padding,
            },
            &[x],
            span,
        )?))
    }

    /// `batchnorm`.
    pub(super) fn call_batchnorm(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let vals: Vec<Value> = (0..5)
            .map(|i| self.tensor(cx, req(a, i)))
            .collect::<R<_>>()?;
        let eps = c.float(5)?;
        Ok(t(self.add(cx, Op::BatchNorm { eps }, &vals, span)?))
    }

    /// `cast`.
    pub(super) fn call_cast(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let x = self.tensor(cx, req(a, 0))?;
        let to = dtype_arg(req(a, 1))?;
        Ok(t(self.add(cx, Op::Cast { to }, &[x], span)?))
    }

    /// `where`.
    pub(super) fn call_where(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let c = self.tensor(cx, req(a, 0))?;
        let (ea, eb) = (req(a, 1), req(a, 2));
        let (va, vb) = (self.expr(cx, ea)?, self.expr(cx, eb)?);
        let (x, y) = self.pair(cx, va, vb, ea.span, eb.span)?;
        Ok(t(self.add(cx, Op::Select, &[c, x, y], span)?))
    }

    /// `zeros`, `ones`, `full`.
    pub(super) fn call_zeros(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let shape = positive_shape(&const_ints(req(a, 0), &cx.dims)?)?;
        let (value, is_float, dt_arg) = match name {
            "zeros" => (0.0, false, a[1]),
            "ones" => (1.0, false, a[1]),
            _ => {
                let (v, fl) = const_float(req(a, 1))?;
                (v, fl, a[2])
            }
        };
        let dtype = match dt_arg {
            Some(e) => dtype_arg(e)?,
            None if name == "full" => literal_dtype(is_float),
            None => DEFAULT_FLOAT,
        };
        if is_float && !dtype.is_float() {
            return Err(Diagnostic::new(
                format!("the number `{value}` cannot be a {dtype}"),
                span,
                "type mismatch",
            ));
        }
        let ty = TensorType::new(dtype, shape);
        check_type_size(&ty, span)?;
        Ok(t(cx.f.add_op(
            Op::Constant(ConstValue::Splat(dtype.round(value))),
            &[],
            ty,
        )))
    }

    /// `tensor`.
    pub(super) fn call_tensor(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| EVal::Tensor(v);
        let ty = dense_type(a, &cx.dims, span)?;
        let values = dense_values(req(a, 0), ty.dtype)?;
        let n = ty.num_elements().unwrap_or(usize::MAX);
        if values.len() != n {
            return Err(Diagnostic::new(
                format!("tensor: {} values for a {ty} of {n} elements", values.len()),
                req(a, 0).span,
                format!("expected {n} values"),
            ));
        }
        Ok(t(cx.f.add_op(
            Op::Constant(ConstValue::Dense(values.into())),
            &[],
            ty,
        )))
    }
}

fn dim_mentions(d: &DimExpr, name: &str) -> bool {
    match d {
        DimExpr::Int(..) => false,
        DimExpr::Name(id) => id.name == name,
        DimExpr::Binary(_, a, b, _) => dim_mentions(a, name) || dim_mentions(b, name),
    }
}

fn type_text(te: &TypeExpr) -> String {
    fn dim(d: &DimExpr) -> String {
        match d {
            DimExpr::Int(v, _) => v.to_string(),
            DimExpr::Name(i) => i.name.clone(),
            DimExpr::Binary(op, a, b, _) => {
                let s = match op {
                    DimOp::Add => "+",
                    DimOp::Sub => "-",
                    DimOp::Mul => "*",
                };
                format!("{} {s} {}", dim(a), dim(b))
            }
        }
    }
    format!(
        "{}[{}]",
        te.dtype.name,
        te.dims.iter().map(dim).collect::<Vec<_>>().join(", ")
    )
}

fn fold_literals(op: BinOp, x: f64, fx: bool, y: f64, fy: bool, span: Span) -> R<Option<EVal>> {
    let is_float = fx || fy;
    let v = match op {
        BinOp::Add => x + y,
        BinOp::Sub => x - y,
        BinOp::Mul => x * y,
        BinOp::Div if is_float => x / y,
        BinOp::Div => {
            if y == 0.0 {
                return Err(Diagnostic::new(
                    "integer division by zero",
                    span,
                    "divides by zero",
                ));
            }
            (x / y).floor()
        }
        _ => return Ok(None),
    };
    Ok(Some(EVal::Lit(v, is_float)))
}

fn reshape_target(items: &[(i64, Span)], ty: &TensorType, span: Span) -> R<Vec<usize>> {
    let total = ty.num_elements().unwrap_or(usize::MAX);
    let mut infer_at = None;
    let mut known: usize = 1;
    for (i, &(v, s)) in items.iter().enumerate() {
        if v == -1 {
            if infer_at.replace(i).is_some() {
                return Err(Diagnostic::new(
                    "reshape: at most one dimension can be -1",
                    s,
                    "second -1",
                ));
            }
        } else if v <= 0 {
            return Err(Diagnostic::new(
                format!("reshape: dimension must be positive or -1, got {v}"),
                s,
                "bad dimension",
            ));
        } else {
            known = known
                .checked_mul(v as usize)
                .ok_or_else(|| Diagnostic::new("reshape: too many elements", s, "overflow"))?;
        }
    }
    let mut shape: Vec<usize> = items.iter().map(|&(v, _)| v.max(0) as usize).collect();
    if let Some(i) = infer_at {
        if !total.is_multiple_of(known) {
            return Err(Diagnostic::new(
                format!(
                    "reshape: cannot infer -1 for {ty}: {total} elements are not a multiple of {known}"
                ),
                span,
                "no whole extent for -1",
            ));
        }
        shape[i] = total / known;
    }
    Ok(shape)
}

// ---------------------------------------------------------------------------
// Index notation

struct OpCx<'a> {
    def: &'a OpDef,
    inputs: &'a [TensorType],
    dims: &'a HashMap<String, usize>,
    locals: HashMap<String, (u32, Span)>,
    local_defs: Vec<GElemDef>,
    scope: Vec<(String, IndexVar)>,
    next_var: u32,
    /// Reduction variables whose range is to be inferred: name and span.
    pending: HashMap<IndexVar, (String, Span)>,
}

/// Marks a reduction range not written in the source, filled in by inference.
const INFER: i64 = i64::MIN;

fn build_compute(
    def: &OpDef,
    inputs: &[TensorType],
    dims: &HashMap<String, usize>,
    out_ty: TensorType,
) -> R<ComputeBody> {
    let Some(last) = def.defs.last() else {
        return Err(Diagnostic::new(
            format!("operator `{}` defines no `out[...]`", def.name.name),
            def.name.span,
            "no output",
        ));
    };
    let mut cx = OpCx {
        def,
        inputs,
        dims,
        locals: HashMap::new(),
        local_defs: Vec::new(),
        scope: Vec::new(),
        next_var: 0,
        pending: HashMap::new(),
    };
    let mut out = None;
    for d in &def.defs {
        if !d.is_let && d.name.name != "out" {
            return Err(Diagnostic::new(
                format!(
                    "only `out[...]` is defined without `let`; write `let {}[...] = ...;`",
                    d.name.name
                ),
                d.name.span,
                "missing `let`",
            ));
        }
        if !d.is_let && !std::ptr::eq(d, last) {
            return Err(Diagnostic::new(
                "`out` must be the last definition of an operator",
                d.span,
                "not last",
            )
            .with_secondary(last.span, "this comes after it"));
        }
        if d.is_let {
            let n = &d.name.name;
            let clash = n == "out"
                || cx.locals.contains_key(n)
                || def.params.iter().any(|p| &p.name.name == n)
                || dims.contains_key(n);
            if clash {
                return Err(Diagnostic::new(
                    format!("`{n}` is already defined in `{}`", def.name.name),
                    d.name.span,
                    "defined again",
                ));
            }
        }
        let mut vars = Vec::new();
        cx.scope.clear();
        for idx in &d.indices {
            if cx.scope.iter().any(|(n, _)| *n == idx.name) {
                return Err(Diagnostic::new(
                    format!("index `{}` is listed twice", idx.name),
                    idx.span,
                    "repeated index",
                ));
            }
            if cx.is_name(&idx.name) {
                return Err(Diagnostic::new(
                    format!(
                        "index `{}` has the name of an operand, local or dimension",
                        idx.name
                    ),
                    idx.span,
                    "name already used",
                ));
            }
            let v = IndexVar(cx.next_var);
            cx.next_var += 1;
            cx.scope.push((idx.name.clone(), v));
            vars.push(v);
        }
        let mut expr = cx.scalar(&d.value)?;
        cx.fill_pending(&mut expr)?;
        if d.is_let {
            let mut shape = Vec::new();
            for (idx, v) in d.indices.iter().zip(&vars) {
                let ext = cx.extent_of(*v, &expr, &idx.name)?.ok_or_else(|| {
                    Diagnostic::new(
                        format!(
                            "cannot infer the range of index `{}` of `{}`",
                            idx.name, d.name.name
                        ),
                        idx.span,
                        "no operand is indexed directly by it",
                    )
                    .with_note(format!(
                        "index an operand with it directly, as in `x[{}, j]`",
                        idx.name
                    ))
                })?;
                shape.push(ext);
            }
            let dtype = cx.def_dtype(&expr, d.span)?.unwrap_or(out_ty.dtype);
            let ty = TensorType::new(dtype, shape);
            cx.locals.insert(
                d.name.name.clone(),
                (cx.local_defs.len() as u32, d.name.span),
            );
            cx.local_defs.push(GElemDef { vars, ty, expr });
        } else {
            if vars.len() != out_ty.rank() {
                return Err(Diagnostic::new(
                    format!(
                        "`out` has {} index(es) but the result type {out_ty} has rank {}",
                        vars.len(),
                        out_ty.rank()
                    ),
                    d.span,
                    "wrong number of indices",
                )
                .with_secondary(def.ret.span, "result type declared here"));
            }
            if let Some(dt) = cx.def_dtype(&expr, d.span)?
                && dt != out_ty.dtype
            {
                return Err(Diagnostic::new(
                    format!(
                        "`out` computes {dt} but `{}` returns {out_ty}",
                        def.name.name
                    ),
                    d.span,
                    format!("{dt} value"),
                )
                .with_secondary(def.ret.span, "result type declared here"));
            }
            out = Some(GElemDef {
                vars,
                ty: out_ty.clone(),
                expr,
            });
        }
    }
    let Some(out) = out else {
        return Err(Diagnostic::new(
            format!("operator `{}` defines no `out[...]`", def.name.name),
            def.name.span,
            "no output",
        ));
    };
    Ok(ComputeBody {
        name: def.name.name.clone(),
        locals: cx.local_defs,
        out,
    })
}

impl OpCx<'_> {
    fn is_name(&self, n: &str) -> bool {
        self.locals.contains_key(n)
            || self.def.params.iter().any(|p| p.name.name == n)
            || self.dims.contains_key(n)
    }

    fn def_dtype(&self, expr: &ScalarExpr, span: Span) -> R<Option<DType>> {
        let refs: Vec<&TensorType> = self.inputs.iter().collect();
        scalar_dtype(expr, &refs, &self.local_defs)
            .map_err(|m| Diagnostic::new(m, span, "in this definition"))
    }

    fn source(&self, name: &Ident) -> R<(Source, &TensorType)> {
        if let Some(i) = self
            .def
            .params
            .iter()
            .position(|p| p.name.name == name.name)
        {
            return Ok((Source::Input(i as u32), &self.inputs[i]));
        }
        if let Some((i, _)) = self.locals.get(&name.name) {
            return Ok((Source::Local(*i), &self.local_defs[*i as usize].ty));
        }
        if name.name == "out" {
            return Err(Diagnostic::new(
                "`out` cannot be read; define a local with `let`",
                name.span,
                "not readable",
            ));
        }
        Err(Diagnostic::new(
            format!("unknown operand or local `{}`", name.name),
            name.span,
            "not defined",
        )
        .with_suggestion(
            &name.name,
            self.locals
                .keys()
                .map(String::as_str)
                .chain(self.def.params.iter().map(|p| p.name.name.as_str())),
        ))
    }

    fn var(&self, n: &str) -> Option<IndexVar> {
        self.scope
            .iter()
            .rev()
            .find(|(m, _)| m == n)
            .map(|(_, v)| *v)
    }

    fn scalar(&mut self, e: &Expr) -> R<ScalarExpr> {
        let bx = Box::new;
        match &e.kind {
            ExprKind::Int(v) => Ok(ScalarExpr::Const(*v as f64)),
            ExprKind::Float(v) => Ok(ScalarExpr::Const(*v)),
            ExprKind::Bool(_) => Err(Diagnostic::new(
                "booleans cannot be written in index notation; use a comparison",
                e.span,
                "boolean literal",
            )),
            ExprKind::Var(n) => {
                if self.var(n).is_some() {
                    return Err(Diagnostic::new(
                        format!("index `{n}` cannot be used as a value"),
                        e.span,
                        "index used as a value",
                    ));
                }
                if let Some(d) = self.dims.get(n) {
                    return Ok(ScalarExpr::Const(*d as f64));
                }
                let id = Ident {
                    name: n.clone(),
                    span: e.span,
                };
                let (src, ty) = self.source(&id)?;
                if ty.rank() != 0 {
                    return Err(Diagnostic::new(
                        format!("`{n}` is {ty}; index it, as in `{n}[i, ...]`"),
                        e.span,
                        "needs indices",
                    ));
                }
                Ok(ScalarExpr::Read { src, index: vec![] })
            }
            ExprKind::Neg(x) => Ok(match self.scalar(x)? {
                ScalarExpr::Const(v) => ScalarExpr::Const(-v),
                s => ScalarExpr::Unary(UnaryOp::Neg, bx(s)),
            }),
            ExprKind::Binary(op, a, b) => {
                if *op == BinOp::MatMul {
                    return Err(Diagnostic::new(
                        "`@` is not available in index notation; write the sum, as in `sum[k](a[i, k] * b[k, j])`",
                        e.span,
                        "matrix product",
                    ));
                }
                let (x, y) = (self.scalar(a)?, self.scalar(b)?);
                let bin =
                    |b: BinaryOp| ScalarExpr::Binary(b, Box::new(x.clone()), Box::new(y.clone()));
                let cmp =
                    |c: CmpOp| ScalarExpr::Compare(c, Box::new(x.clone()), Box::new(y.clone()));
                Ok(match op {
                    BinOp::Add => bin(BinaryOp::Add),
                    BinOp::Sub => bin(BinaryOp::Sub),
                    BinOp::Mul => bin(BinaryOp::Mul),
                    BinOp::Div => bin(BinaryOp::Div),
                    BinOp::Lt => cmp(CmpOp::Lt),
                    BinOp::Le => cmp(CmpOp::Le),
                    BinOp::Gt => cmp(CmpOp::Gt),
                    BinOp::Ge => cmp(CmpOp::Ge),
                    BinOp::Eq => cmp(CmpOp::Eq),
                    BinOp::Ne => cmp(CmpOp::Ne),
                    BinOp::MatMul => unreachable!("rejected above"),
                })
            }
            ExprKind::Call(f, args) => self.scalar_call(e, f, args),
            ExprKind::Bracket(name, items, None) => {
                let (src, ty) = self.source(name)?;
                let rank = ty.rank();
                if items.len() != rank {
                    return Err(Diagnostic::new(
                        format!(
                            "`{}` has rank {rank} but is indexed with {} index(es)",
                            name.name,
                            items.len()
                        ),
                        e.span,
                        format!("{} index(es)", items.len()),
                    ));
                }
                let index = items
                    .iter()
                    .map(|it| match it {
                        BracketItem::Expr(x) => self.affine(x),
                        BracketItem::Range(v, _, _) => Err(Diagnostic::new(
                            "`in` ranges belong to reductions",
                            v.span,
                            "range in an index",
                        )),
                    })
                    .collect::<R<Vec<_>>>()?;
                Ok(ScalarExpr::Read { src, index })
            }
            ExprKind::Bracket(name, items, Some(body)) => self.scalar_reduce(name, items, body),
            ExprKind::List(_) | ExprKind::Tuple(_) => Err(Diagnostic::new(
                "lists and tuples are not scalar values",
                e.span,
                "not a scalar",
            )),
        }
    }

    /// A call in index notation: an element-wise function of scalars.
    fn scalar_call(&mut self, e: &Expr, f: &Ident, args: &[Arg]) -> R<ScalarExpr> {
        let bx = Box::new;
        if let Some(k) = args.iter().find_map(|a| a.name.as_ref()) {
            return Err(Diagnostic::new(
                "keyword arguments are not allowed in index notation",
                k.span,
                "keyword",
            ));
        }
        let n = f.name.as_str();
        let arity = |want: usize| -> R<()> {
            if args.len() == want {
                Ok(())
            } else {
                Err(Diagnostic::new(
                    format!("`{n}` takes {want} argument(s) here, got {}", args.len()),
                    e.span,
                    "wrong number of arguments",
                ))
            }
        };
        if let Some(u) = UnaryOp::from_name(n).filter(|u| *u != UnaryOp::Neg) {
            arity(1)?;
            return Ok(ScalarExpr::Unary(u, bx(self.scalar(&args[0].value)?)));
        }
        let b = match n {
            "max" => Some(BinaryOp::Max),
            "min" => Some(BinaryOp::Min),
            "pow" => Some(BinaryOp::Pow),
            _ => bitwise(n),
        };
        if let Some(b) = b {
            arity(2)?;
            return Ok(ScalarExpr::Binary(
                b,
                bx(self.scalar(&args[0].value)?),
                bx(self.scalar(&args[1].value)?),
            ));
        }
        match n {
            "where" => {
                arity(3)?;
                Ok(ScalarExpr::Select(
                    bx(self.scalar(&args[0].value)?),
                    bx(self.scalar(&args[1].value)?),
                    bx(self.scalar(&args[2].value)?),
                ))
            }
            "cast" => {
                arity(2)?;
                Ok(ScalarExpr::Cast(
                    dtype_arg(&args[1].value)?,
                    bx(self.scalar(&args[0].value)?),
                ))
            }
            "sum" | "mean" | "prod" => Err(Diagnostic::new(
                format!("in index notation a reduction binds its indices: `{n}[k](...)`"),
                e.span,
                "reduction without indices",
            )),
            _ => Err(Diagnostic::new(
                format!("`{n}` cannot be used in index notation"),
                f.span,
                "not an element-wise function",
            )),
        }
    }

    /// A reduction in index notation, `sum[k](...)` or `max[k in 0..K](...)`:
    /// its indices are bound in its body, their ranges given or inferred.
    fn scalar_reduce(&mut self, name: &Ident, items: &[BracketItem], body: &Expr) -> R<ScalarExpr> {
        let kind = match name.name.as_str() {
            "sum" => ReduceKind::Sum,
            "max" => ReduceKind::Max,
            "min" => ReduceKind::Min,
            "prod" => ReduceKind::Prod,
            "mean" => ReduceKind::Mean,
            other => {
                return Err(Diagnostic::new(
                    format!(
                        "`{other}[...](...)` is not a reduction; reductions are sum, max, min, prod and mean"
                    ),
                    name.span,
                    "not a reduction",
                ));
            }
        };
        let depth = self.scope.len();
        let mut vars = Vec::new();
        for it in items {
            let (id, range) = match it {
                BracketItem::Expr(Expr {
                    kind: ExprKind::Var(n),
                    span,
                    ..
                }) => (
                    Ident {
                        name: n.clone(),
                        span: *span,
                    },
                    None,
                ),
                BracketItem::Range(id, lo, hi) => (
                    id.clone(),
                    Some((self.const_index(lo)?, self.const_index(hi)?)),
                ),
                BracketItem::Expr(x) => {
                    return Err(Diagnostic::new(
                        "expected a reduction index such as `k` or `k in 0..K`",
                        x.span,
                        "not an index",
                    ));
                }
            };
            if self.var(&id.name).is_some() || self.is_name(&id.name) {
                self.scope.truncate(depth);
                return Err(Diagnostic::new(
                    format!("index `{}` is already bound", id.name),
                    id.span,
                    "bound again",
                ));
            }
            let v = IndexVar(self.next_var);
            self.next_var += 1;
            self.scope.push((id.name.clone(), v));
            match range {
                Some((lo, hi)) => {
                    if lo > hi {
                        self.scope.truncate(depth);
                        return Err(Diagnostic::new(
                            format!("range {lo}..{hi} of `{}` is reversed", id.name),
                            id.span,
                            "reversed range",
                        ));
                    }
                    vars.push(RangeVar { var: v, lo, hi });
                }
                None => {
                    self.pending.insert(v, (id.name.clone(), id.span));
                    vars.push(RangeVar {
                        var: v,
                        lo: 0,
                        hi: INFER,
                    });
                }
            }
        }
        let b = self.scalar(body);
        self.scope.truncate(depth);
        Ok(ScalarExpr::Reduce {
            kind,
            vars,
            body: Box::new(b?),
        })
    }

    fn const_index(&self, e: &Expr) -> R<i64> {
        let a = self.affine(e)?;
        if a.terms.is_empty() {
            Ok(a.constant)
        } else {
            Err(Diagnostic::new(
                "a reduction range must be constant (integers and dimensions)",
                e.span,
                "not constant",
            ))
        }
    }

    fn affine(&self, e: &Expr) -> R<Affine> {
        let overflow = || Diagnostic::new("index arithmetic overflows", e.span, "overflow");
        match &e.kind {
            ExprKind::Int(v) => Ok(Affine {
                terms: vec![],
                constant: *v,
            }),
            ExprKind::Var(n) => {
                if let Some(v) = self.var(n) {
                    return Ok(Affine::var(v));
                }
                if let Some(d) = self.dims.get(n) {
                    return Ok(Affine {
                        terms: vec![],
                        constant: *d as i64,
                    });
                }
                if self.is_name(n) {
                    return Err(Diagnostic::new(
                        format!("`{n}` is a tensor and cannot appear in an index"),
                        e.span,
                        "not an index",
                    ));
                }
                Err(Diagnostic::new(format!("index `{n}` is not bound"), e.span, "unbound index")
                    .with_note(format!("bind it on the left (`out[{n}, ...]`) or with a reduction such as `sum[{n}](...)`")))
            }
            ExprKind::Neg(x) => {
                let a = self.affine(x)?;
                scale(&a, -1).ok_or_else(overflow)
            }
            ExprKind::Binary(op @ (BinOp::Add | BinOp::Sub), x, y) => {
                let (a, b) = (self.affine(x)?, self.affine(y)?);
                let b = if *op == BinOp::Sub {
                    scale(&b, -1).ok_or_else(overflow)?
                } else {
                    b
                };
                let mut terms = a.terms.clone();
                for (c, v) in b.terms {
                    match terms.iter_mut().find(|(_, w)| *w == v) {
                        Some(t) => t.0 = t.0.checked_add(c).ok_or_else(overflow)?,
                        None => terms.push((c, v)),
                    }
                }
                terms.retain(|(c, _)| *c != 0);
                Ok(Affine {
                    terms,
                    constant: a.constant.checked_add(b.constant).ok_or_else(overflow)?,
                })
            }
            ExprKind::Binary(BinOp::Mul, x, y) => {
                let (a, b) = (self.affine(x)?, self.affine(y)?);
                match (a.terms.is_empty(), b.terms.is_empty()) {
                    (true, _) => scale(&b, a.constant).ok_or_else(overflow),
                    (_, true) => scale(&a, b.constant).ok_or_else(overflow),
                    _ => Err(Diagnostic::new(
                        "index expressions must be affine: this multiplies two indices",
                        e.span,
                        "not affine",
                    )),
                }
            }
            _ => Err(Diagnostic::new(
                "index expressions must be affine (`i`, `2 * i`, `y + ky - 1`)",
                e.span,
                "not affine",
            )),
        }
    }

    /// The extent of `v` from the operands and locals it indexes directly.
    fn extent_of(&self, v: IndexVar, expr: &ScalarExpr, name: &str) -> R<Option<usize>> {
        let mut found: Option<(usize, Source)> = None;
        let mut conflict = None;
        expr.visit(&mut |e| {
            if let ScalarExpr::Read { src, index } = e {
                let ty = match src {
                    Source::Input(i) => &self.inputs[*i as usize],
                    Source::Local(i) => &self.local_defs[*i as usize].ty,
                };
                for (p, a) in index.iter().enumerate() {
                    if a.as_var() == Some(v) {
                        match found {
                            None => found = Some((ty.shape[p], *src)),
                            Some((ext, s)) if ext != ty.shape[p] && conflict.is_none() => {
                                conflict = Some((ext, s, ty.shape[p], *src))
                            }
                            _ => {}
                        }
                    }
                }
            }
        });
        if let Some((a, sa, b, sb)) = conflict {
            let span = self.pending.get(&v).map_or(self.def.span, |p| p.1);
            return Err(Diagnostic::new(
                format!(
                    "index `{name}` ranges over {a} in {} but over {b} in {}",
                    self.src_name(sa),
                    self.src_name(sb)
                ),
                span,
                "ambiguous range",
            )
            .with_note(format!("give it a range explicitly: `{name} in 0..N`")));
        }
        Ok(found.map(|(e, _)| e))
    }

    fn src_name(&self, s: Source) -> String {
        match s {
            Source::Input(i) => format!("`{}`", self.def.params[i as usize].name.name),
            Source::Local(i) => self
                .locals
                .iter()
                .find(|(_, (j, _))| *j == i)
                .map_or_else(|| "a local".to_string(), |(n, _)| format!("`{n}`")),
        }
    }

    /// Infers the ranges of reduction indices written without one.
    fn fill_pending(&self, e: &mut ScalarExpr) -> R<()> {
        match e {
            ScalarExpr::Const(_) | ScalarExpr::Read { .. } => Ok(()),
            ScalarExpr::Unary(_, x) | ScalarExpr::Cast(_, x) => self.fill_pending(x),
            ScalarExpr::Binary(_, a, b) | ScalarExpr::Compare(_, a, b) => {
                self.fill_pending(a)?;
                self.fill_pending(b)
            }
            ScalarExpr::Select(c, a, b) => {
                self.fill_pending(c)?;
                self.fill_pending(a)?;
                self.fill_pending(b)
            }
            ScalarExpr::Reduce { vars, body, .. } => {
                self.fill_pending(body)?;
                for rv in vars.iter_mut().filter(|rv| rv.hi == INFER) {
                    let (name, span) = self.pending.get(&rv.var).cloned().unwrap_or_default();
                    let ext = self.extent_of(rv.var, body, &name)?.ok_or_else(|| {
                        Diagnostic::new(format!("cannot infer the range of reduction index `{name}`"), span, "no operand is indexed directly by it")
                            .with_note(format!("index an operand with it directly, or give it a range: `{name} in 0..N`"))
                    })?;
                    rv.lo = 0;
                    rv.hi = ext as i64;
                }
                Ok(())
            }
        }
    }
}

fn scale(a: &Affine, k: i64) -> Option<Affine> {
    if k == 0 {
        return Some(Affine::default());
    }
    Some(Affine {
        terms: a
            .terms
            .iter()
            .map(|(c, v)| c.checked_mul(k).map(|c| (c, *v)))
            .collect::<Option<_>>()?,
        constant: a.constant.checked_mul(k)?,
    })
}
