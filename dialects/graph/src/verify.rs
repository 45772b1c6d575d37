//! The verifier: every invariant of a graph module, each violation reported
//! with the text-form name of where it is.

use std::collections::{HashMap, HashSet};

use dlc_core::{DType, TensorType, Verify, VerifyError};
use petgraph::Direction;
use petgraph::visit::EdgeRef;

use crate::compute::{ComputeBody, ElemDef, IndexVar, ScalarExpr, Source};
use crate::infer::infer;
use crate::module::{Function, Module};
use crate::ops::{ConstValue, Op, ReduceKind};
use crate::print::node_names;

impl Verify for Module {
    fn verify(&self) -> Result<(), Vec<VerifyError>> {
        let errors = verify_module(self);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// Every problem in `module`.
pub fn verify_module(module: &Module) -> Vec<VerifyError> {
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    for f in &module.functions {
        if !seen.insert(f.name.as_str()) {
            errors.push(VerifyError {
                location: format!("@{}", f.name),
                message: "function defined twice".into(),
            });
        }
        verify_function(module, f, &mut errors);
    }
    check_recursion(module, &mut errors);
    errors
}

fn verify_function(module: &Module, f: &Function, errors: &mut Vec<VerifyError>) {
    let fname = format!("@{}", f.name);
    let mut err =
        |location: String, message: String| errors.push(VerifyError { location, message });
    if petgraph::algo::is_cyclic_directed(&f.body) {
        err(fname.clone(), "the op graph has a cycle".into());
        return;
    }
    let names = node_names(f);
    let name_of = |n| {
        names
            .get(&n)
            .cloned()
            .unwrap_or_else(|| format!("{fname}:{n:?}"))
    };
    let mut param_nodes = HashSet::new();
    let mut param_names = HashSet::new();
    for (i, (pname, node)) in f.params.iter().enumerate() {
        if !param_names.insert(pname.as_str()) {
            err(
                format!("{fname}(%{pname})"),
                "parameter name used twice".into(),
            );
        }
        match f.body.node_weight(*node) {
            Some(n) if n.op == Op::Param { index: i as u32 } && n.results.len() == 1 => {
                param_nodes.insert(*node);
            }
            _ => err(
                format!("{fname}(%{pname})"),
                format!("is not graph.param {i}"),
            ),
        }
    }
    if let Some(w) = f.weights.iter().find(|&&w| w >= f.params.len()) {
        err(fname.clone(), format!("weight {w} is not a parameter"));
    }
    for node in f.body.node_indices() {
        let n = &f.body[node];
        let loc = name_of(node);
        if matches!(n.op, Op::Param { .. }) {
            if !param_nodes.contains(&node) {
                err(
                    loc,
                    "graph.param that is not a parameter of the function".into(),
                );
            }
            continue;
        }
        let mut slots: Vec<u32> = f
            .body
            .edges_directed(node, Direction::Incoming)
            .map(|e| e.weight().operand)
            .collect();
        slots.sort_unstable();
        if slots.iter().enumerate().any(|(i, &s)| s as usize != i) {
            err(
                loc.clone(),
                format!("operand slots are not 0..{}: {slots:?}", slots.len()),
            );
            continue;
        }
        let mut bad_use = false;
        for e in f.body.edges_directed(node, Direction::Incoming) {
            if e.weight().result as usize >= f.body[e.source()].results.len() {
                err(
                    loc.clone(),
                    format!("uses a result that {} lacks", name_of(e.source())),
                );
                bad_use = true;
            }
        }
        if bad_use {
            continue;
        }
        let operands = f.operands(node);
        let types: Vec<&TensorType> = operands.iter().map(|v| f.value_type(*v)).collect();
        match &n.op {
            Op::Constant(value) => {
                if !operands.is_empty() || n.results.len() != 1 {
                    err(
                        loc,
                        "graph.constant takes no operands and has one result".into(),
                    );
                    continue;
                }
                if let ConstValue::Dense(vs) = value
                    && Some(vs.len()) != n.results[0].num_elements()
                {
                    err(
                        loc,
                        format!("{} values for type {}", vs.len(), n.results[0]),
                    );
                }
            }
            Op::Call { callee } => match module.function(callee) {
                None => err(loc, format!("calls unknown function @{callee}")),
                Some(g) => {
                    let want = g.param_types();
                    if want.iter().collect::<Vec<_>>() != types {
                        err(
                            loc.clone(),
                            format!(
                                "arguments ({}) do not match @{callee}'s parameters ({})",
                                join(&types),
                                join(&want.iter().collect::<Vec<_>>())
                            ),
                        );
                    }
                    if g.result_types() != n.results {
                        err(loc, format!("result types do not match @{callee}'s"));
                    }
                }
            },
            op => match infer(op, &types) {
                Ok(expected) if expected == n.results => {}
                Ok(expected) => err(
                    loc,
                    format!(
                        "result type {} does not match the inferred {}",
                        join(&n.results.iter().collect::<Vec<_>>()),
                        join(&expected.iter().collect::<Vec<_>>())
                    ),
                ),
                Err(e) => err(loc, e.message),
            },
        }
    }
    if f.results.is_empty() {
        err(fname.clone(), "returns nothing".into());
    }
    for r in &f.results {
        let ok = f
            .body
            .node_weight(r.node)
            .is_some_and(|n| (r.result as usize) < n.results.len());
        if !ok {
            err(fname.clone(), "returns a value that does not exist".into());
        }
    }
}

fn join(types: &[&TensorType]) -> String {
    types
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn check_recursion(module: &Module, errors: &mut Vec<VerifyError>) {
    let callees: HashMap<&str, Vec<&str>> = module
        .functions
        .iter()
        .map(|f| {
            let cs = f
                .body
                .node_weights()
                .filter_map(|n| match &n.op {
                    Op::Call { callee } => Some(callee.as_str()),
                    _ => None,
                })
                .collect();
            (f.name.as_str(), cs)
        })
        .collect();
    for f in &module.functions {
        // Depth-first search for a path back to f.
        let mut stack = vec![f.name.as_str()];
        let mut visited = HashSet::new();
        while let Some(g) = stack.pop() {
            for &c in callees.get(g).map(Vec::as_slice).unwrap_or(&[]) {
                if c == f.name {
                    errors.push(VerifyError {
                        location: format!("@{}", f.name),
                        message: "is recursive (calls itself, directly or not)".into(),
                    });
                    stack.clear();
                    break;
                }
                if visited.insert(c) {
                    stack.push(c);
                }
            }
        }
    }
}

struct ComputeCtx<'a> {
    inputs: &'a [&'a TensorType],
    locals: &'a [ElemDef],
    bound: Vec<IndexVar>,
    check_bound: bool,
}

/// The element type of a scalar expression over operands `inputs` and
/// `locals` (`None` for a bare number, whose type adapts to its context).
/// Variable binding is not checked here; [`check_compute`] does that.
pub fn scalar_dtype(
    e: &ScalarExpr,
    inputs: &[&TensorType],
    locals: &[ElemDef],
) -> Result<Option<DType>, String> {
    let mut ctx = ComputeCtx {
        inputs,
        locals,
        bound: Vec::new(),
        check_bound: false,
    };
    expr_dtype(e, &mut ctx)
}

/// Checks a compute body against its operand types: variables bound once and
/// in scope, reads of the right rank, locals read only after they are
/// defined, and consistent element types.
pub fn check_compute(body: &ComputeBody, inputs: &[&TensorType]) -> Result<(), String> {
    let defs = body
        .locals
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("t{i}"), d, i));
    let out = std::iter::once(("out".to_string(), &body.out, body.locals.len()));
    for (name, def, visible) in defs.chain(out) {
        if def.vars.len() != def.ty.rank() {
            return Err(format!(
                "{name} has {} indices for type {}",
                def.vars.len(),
                def.ty
            ));
        }
        let mut ctx = ComputeCtx {
            inputs,
            locals: &body.locals[..visible],
            bound: Vec::new(),
            check_bound: true,
        };
        for v in &def.vars {
            if ctx.bound.contains(v) {
                return Err(format!("{name}: index {v} is bound twice"));
            }
            ctx.bound.push(*v);
        }
        let dtype = expr_dtype(&def.expr, &mut ctx).map_err(|m| format!("{name}: {m}"))?;
        match dtype {
            Some(d) if d != def.ty.dtype => {
                return Err(format!(
                    "{name} is declared {} but computes {d}",
                    def.ty.dtype
                ));
            }
            None if !def.ty.dtype.is_numeric() => {
                return Err(format!("{name}: a number cannot be a bool"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The element type of a scalar expression; `None` for a bare number, whose
/// type adapts to its context.
fn expr_dtype(e: &ScalarExpr, ctx: &mut ComputeCtx<'_>) -> Result<Option<DType>, String> {
    let unify = |a: Option<DType>, b: Option<DType>| match (a, b) {
        (Some(x), Some(y)) if x != y => Err(format!("element types differ: {x} vs {y}")),
        (Some(x), _) | (_, Some(x)) => Ok(Some(x)),
        (None, None) => Ok(None),
    };
    match e {
        ScalarExpr::Const(_) => Ok(None),
        ScalarExpr::Read { src, index } => {
            let ty = match src {
                Source::Input(i) => ctx.inputs.get(*i as usize).copied(),
                Source::Local(i) => ctx.locals.get(*i as usize).map(|d| &d.ty),
            }
            .ok_or_else(|| format!("{src} is not defined here"))?;
            if index.len() != ty.rank() {
                return Err(format!(
                    "{src} has rank {} but is read with {} indices",
                    ty.rank(),
                    index.len()
                ));
            }
            for a in index {
                if let Some((_, v)) = a
                    .terms
                    .iter()
                    .find(|(_, v)| ctx.check_bound && !ctx.bound.contains(v))
                {
                    return Err(format!("index {v} is not bound"));
                }
            }
            Ok(Some(ty.dtype))
        }
        ScalarExpr::Unary(u, x) => {
            let d = expr_dtype(x, ctx)?;
            match d {
                Some(d) if !d.is_numeric() => Err(format!("{} of bool", u.name())),
                Some(d) if !d.is_float() && !u.accepts_int() => {
                    Err(format!("{} needs a float operand, got {d}", u.name()))
                }
                _ => Ok(d),
            }
        }
        ScalarExpr::Binary(b, x, y) => {
            let d = unify(expr_dtype(x, ctx)?, expr_dtype(y, ctx)?)?;
            match d {
                Some(DType::Bool) => Err(format!("{} of bool", b.name())),
                Some(d) if !d.is_float() && !b.accepts_int() => {
                    Err(format!("{} needs float operands, got {d}", b.name()))
                }
                Some(d) if !b.accepts(d) => {
                    Err(format!("{} needs integer operands, got {d}", b.name()))
                }
                _ => Ok(d),
            }
        }
        ScalarExpr::Compare(_, x, y) => {
            unify(expr_dtype(x, ctx)?, expr_dtype(y, ctx)?)?;
            Ok(Some(DType::Bool))
        }
        ScalarExpr::Select(c, x, y) => {
            if expr_dtype(c, ctx)? != Some(DType::Bool) {
                return Err("the condition of where must be bool".into());
            }
            unify(expr_dtype(x, ctx)?, expr_dtype(y, ctx)?)
        }
        ScalarExpr::Cast(to, x) => {
            expr_dtype(x, ctx)?;
            Ok(Some(*to))
        }
        ScalarExpr::Reduce { kind, vars, body } => {
            let depth = ctx.bound.len();
            for rv in vars {
                if ctx.bound.contains(&rv.var) {
                    return Err(format!("index {} is bound twice", rv.var));
                }
                if rv.lo > rv.hi {
                    return Err(format!(
                        "range {}..{} of {} is reversed",
                        rv.lo, rv.hi, rv.var
                    ));
                }
                ctx.bound.push(rv.var);
            }
            let d = expr_dtype(body, ctx);
            ctx.bound.truncate(depth);
            let d = d?;
            match d {
                Some(DType::Bool) => Err(format!("{} of bool", kind.name())),
                Some(d) if *kind == ReduceKind::Mean && !d.is_float() => {
                    Err(format!("mean needs a float operand, got {d}"))
                }
                _ => Ok(d),
            }
        }
    }
}
