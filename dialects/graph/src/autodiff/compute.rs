//! The adjoints of a user operator, derived from its expression.
//!
//! The body is first split so that each definition is element-wise or one
//! reduction of an element-wise expression (`out[i] = tanh(sum[k](..))`
//! becomes `t[i] = sum[k](..)`, `out[i] = tanh(t[i])`; a reduction inside
//! another becomes a local indexed by the outer reduction's variable too).
//! Definitions are then visited last to first, each one's adjoint array
//! already known. For every read `src[A(v, k)]` of an operand or earlier
//! definition, reverse mode through the scalar expression gives the factor
//! `T(v, k)` the read's element receives (`g[v] * b[k, j]` for `a[i, k]` in
//! `sum[k](a[i, k] * b[k, j])`), and the adjoint of `src` is the user
//! operator
//!
//! ```text
//! adj[u] = sum[remaining vars](T(v, k))   where A(v, k) = u
//! ```
//!
//! found by index substitution: each index `A_d = u_d` is solved for one
//! variable with coefficient +-1 (the one with the largest range, so that
//! what is left to sum is smallest: a convolution's input adjoint solves for
//! the output position, not the tap), and every variable not solved for is
//! summed over its range. Where a solved variable may leave its range, a
//! guard keeps the term to the variable's range, unless a factor of the term
//! reads an array whose bounds say the same (a read outside an array gives
//! zero); an index that cannot be solved (`x[2 * i]`, `x[0]`) becomes an
//! equality guard. The guards read constant arrays of ones, so every derived
//! operator is an ordinary `graph.compute`: a product's adjoints are the
//! products `g bᵀ` and `aᵀ g` in index notation, and compile as such.
//!
//! Intermediate definitions the adjoints read are computed by operators of
//! their own; once the gradient is built, [`keep_by_cost`] makes the forward
//! operator read such an operator's result instead of computing the local
//! inside its kernel wherever the cost model prices keeping it cheaper (a
//! softmax's row sums), so the local is computed once and held until the
//! backward pass; elsewhere it is computed in both. Reductions: `sum` and `mean` spread the adjoint;
//! `max` and `min` give it to the elements equal to the result, split evenly
//! among ties; `prod` gives each element the product of the others (an
//! operator of its own over the reduced variables too, so quadratic in the
//! reduced extent; exact with zeros).

use std::collections::HashMap;

use dlc_core::scalar::{BinaryOp, CmpOp, FormulaBuilder, ReduceKind, UnaryOp};
use dlc_core::{DType, TensorType};

use super::Builder;
use crate::compute::{
    Affine, ComputeBody, ElemDef, IndexVar, RangeVar, ScalarExpr, Source, map_sources, rebuild,
};
use crate::module::Value;
use crate::ops::Op;
use petgraph::stable_graph::NodeIndex;

type Grads = Result<Vec<Option<Value>>, String>;

/// The adjoints of the operands `xs` of the operator `body`, given its
/// result `out` (`None`: computed again if a rule needs it) and that
/// result's adjoint `g`.
pub(super) fn vjp(
    b: &mut Builder<'_>,
    body: &ComputeBody,
    xs: &[Value],
    out: Option<Value>,
    g: Value,
    needs: &[bool],
) -> Grads {
    let in_types: Vec<TensorType> = xs.iter().map(|&x| b.ty(x)).collect();
    let mut fresh = max_var(body) + 1;
    let defs = normalize(body, &in_types)?;
    let n = defs.len();
    let mut d = Derivation {
        b,
        name: body.name.clone(),
        xs: xs.to_vec(),
        in_types,
        values: vec![None; n],
        defs,
        extras: Vec::new(),
        fresh: &mut fresh,
    };
    d.values[n - 1] = out;
    // Which definitions lead to an operand that needs an adjoint.
    let mut live = vec![false; n];
    for k in 0..n {
        let mut reads_live = false;
        d.defs[k].expr.visit(&mut |e| {
            if let ScalarExpr::Read { src, .. } = e {
                reads_live |= match *src {
                    Source::Input(i) => {
                        needs.get(i as usize) == Some(&true)
                            && d.in_types[i as usize].dtype.is_float()
                    }
                    Source::Local(j) => live[j as usize],
                };
            }
        });
        live[k] = reads_live && d.defs[k].ty.dtype.is_float();
    }
    let is_live = |s: Source| match s {
        Source::Input(i) => needs.get(i as usize) == Some(&true),
        Source::Local(j) => live[j as usize],
    };
    let mut adj: Vec<Option<Value>> = vec![None; n];
    adj[n - 1] = Some(g);
    let emitted_before: Vec<bool> = d.values.iter().map(Option::is_some).collect();
    let mut grads: Vec<Option<Value>> = vec![None; xs.len()];
    for j in (0..n).rev() {
        let Some(gj) = adj[j] else { continue };
        if !live[j] {
            continue;
        }
        for (src, index, term) in d.terms(j, gj, &is_live)? {
            let v = d.term_op(j, src, &index, term)?;
            let slot = match src {
                Source::Input(i) => &mut grads[i as usize],
                Source::Local(k) => &mut adj[k as usize],
            };
            *slot = Some(match *slot {
                Some(prev) => d.b.binary(BinaryOp::Add, prev, v)?,
                None => v,
            });
        }
    }
    // Each local computed again here may instead be what the forward
    // operator reads (`keep_by_cost` chooses).
    if let Some(forward) = out {
        let made = d.values[..n - 1].iter().zip(&emitted_before).enumerate();
        for (k, (value, &before)) in made {
            if let (false, Some(local)) = (before, *value) {
                let copy = LocalCopy {
                    forward: forward.node,
                    defs: d.defs.clone(),
                    name: body.name.clone(),
                    k,
                    local,
                };
                d.b.locals.push(copy);
            }
        }
    }
    Ok(grads)
}

/// A local of a user operator that its adjoints compute by an operator of
/// their own (`NAME.tK`): the forward operator may read that operator's
/// result instead of computing the local inside its kernel, so that it is
/// computed once and kept until the backward pass.
pub(crate) struct LocalCopy {
    /// The forward operator.
    forward: NodeIndex,
    /// Its body, normalized (reductions split out as locals).
    defs: Vec<ElemDef>,
    /// Its name.
    name: String,
    /// The local's place among `defs`.
    k: usize,
    /// The operator computing it.
    local: Value,
}

/// The operator `defs` (normalized definitions, the last the output) with
/// local `k` read from operand `operand` instead of computed, and the
/// locals only it read left out.
fn reading_local(defs: &[ElemDef], name: &str, k: usize, operand: u32) -> ComputeBody {
    let n = defs.len();
    let mut live = vec![false; n];
    live[n - 1] = true;
    for j in (0..n).rev() {
        if !live[j] || j == k {
            continue;
        }
        defs[j].expr.visit(&mut |e| {
            if let ScalarExpr::Read {
                src: Source::Local(i),
                ..
            } = e
            {
                live[*i as usize] = true;
            }
        });
    }
    live[k] = false;
    let mut place: Vec<Option<u32>> = vec![None; n];
    let mut kept = 0;
    for j in 0..n - 1 {
        if live[j] {
            place[j] = Some(kept);
            kept += 1;
        }
    }
    let rewrite = |def: &ElemDef| ElemDef {
        vars: def.vars.clone(),
        ty: def.ty.clone(),
        expr: map_sources(&def.expr, &mut |s| match s {
            Source::Local(i) if i as usize == k => Source::Input(operand),
            Source::Local(i) => Source::Local(place[i as usize].unwrap_or(i)),
            s => s,
        }),
    };
    ComputeBody {
        name: name.to_string(),
        locals: (0..n - 1)
            .filter(|&j| live[j])
            .map(|j| rewrite(&defs[j]))
            .collect(),
        out: rewrite(&defs[n - 1]),
    }
}

/// For each local in `copies`, in turn: makes its forward operator read the
/// local's operator (one more operand) where the cost model prices that
/// better than computing it in both (`transforms::remat::Price`, as
/// `graph.remat` prices, for the x86-64 AVX2 baseline, so the gradient is
/// the same program on every machine). Returns how many are kept.
pub(super) fn keep_by_cost(g: &mut crate::module::Function, copies: Vec<LocalCopy>) -> usize {
    use crate::transforms::remat::Price;
    if copies.is_empty() {
        return 0;
    }
    let target = dlc_core::TargetDesc::x86_64_avx2(2);
    let mut price = Price::of(g, &target);
    let mut kept = 0;
    for c in copies {
        if !g.body.contains_node(c.forward) || !g.body.contains_node(c.local.node) {
            continue;
        }
        let operands = g.operands(c.forward);
        let before = g.body[c.forward].op.clone();
        let slot = operands.len() as u32;
        let body = reading_local(&c.defs, &c.name, c.k, slot);
        let mut types: Vec<TensorType> =
            operands.iter().map(|&v| g.value_type(v).clone()).collect();
        types.push(g.value_type(c.local).clone());
        let refs: Vec<&TensorType> = types.iter().collect();
        if crate::verify::check_compute(&body, &refs).is_err() {
            continue;
        }
        g.body[c.forward].op = Op::Compute(Box::new(body));
        let edge = g.body.add_edge(
            c.local.node,
            c.forward,
            crate::module::Use {
                operand: slot,
                result: c.local.result,
            },
        );
        let after = Price::of(g, &target);
        if after.better_than(&price) {
            price = after;
            kept += 1;
        } else {
            g.body.remove_edge(edge);
            g.body[c.forward].op = before;
        }
    }
    kept
}

fn max_var(body: &ComputeBody) -> u32 {
    let mut m = 0;
    for def in body.locals.iter().chain([&body.out]) {
        for v in &def.vars {
            m = m.max(v.0);
        }
        def.expr.visit(&mut |e| match e {
            ScalarExpr::Reduce { vars, .. } => {
                for rv in vars {
                    m = m.max(rv.var.0);
                }
            }
            ScalarExpr::Read { index, .. } => {
                for a in index {
                    for t in &a.terms {
                        m = m.max(t.1.0);
                    }
                }
            }
            _ => {}
        });
    }
    m
}

fn children_mut(e: &mut ScalarExpr) -> Vec<&mut ScalarExpr> {
    match e {
        ScalarExpr::Const(_) | ScalarExpr::Read { .. } => vec![],
        ScalarExpr::Unary(_, a) | ScalarExpr::Cast(_, a) => vec![&mut **a],
        ScalarExpr::Reduce { body, .. } => vec![&mut **body],
        ScalarExpr::Binary(_, a, c) | ScalarExpr::Compare(_, a, c) => vec![&mut **a, &mut **c],
        ScalarExpr::Select(c, a, f) => vec![&mut **c, &mut **a, &mut **f],
    }
}

/// The path to a reduction below the root whose body holds no reduction,
/// with the ranges of the reductions around it (the root's included).
fn inner_reduction(e: &mut ScalarExpr, root: bool) -> Option<(Vec<usize>, Vec<RangeVar>)> {
    let own: Vec<RangeVar> = match e {
        ScalarExpr::Reduce { vars, .. } => vars.clone(),
        _ => vec![],
    };
    let is_reduce = matches!(e, ScalarExpr::Reduce { .. });
    for (i, c) in children_mut(e).into_iter().enumerate() {
        if let Some((mut path, mut around)) = inner_reduction(c, false) {
            path.insert(0, i);
            if is_reduce {
                let mut all = own.clone();
                all.append(&mut around);
                around = all;
            }
            return Some((path, around));
        }
    }
    (is_reduce && !root).then(|| (vec![], vec![]))
}

fn at_path<'a>(e: &'a mut ScalarExpr, path: &[usize]) -> Option<&'a mut ScalarExpr> {
    match path.split_first() {
        None => Some(e),
        Some((&i, rest)) => at_path(children_mut(e).into_iter().nth(i)?, rest),
    }
}

/// The body's definitions, each element-wise or one reduction of an
/// element-wise expression; reads of the body's locals renumbered.
fn normalize(body: &ComputeBody, in_types: &[TensorType]) -> Result<Vec<ElemDef>, String> {
    let mut defs: Vec<ElemDef> = Vec::new();
    let mut renumber: Vec<u32> = Vec::new();
    for def in body.locals.iter().chain([&body.out]) {
        let mut expr = map_sources(&def.expr, &mut |s| match s {
            Source::Local(i) => Source::Local(renumber[i as usize]),
            s => s,
        });
        while let Some((path, around)) = inner_reduction(&mut expr, true) {
            let r =
                at_path(&mut expr, &path).ok_or("internal: a reduction's path leads nowhere")?;
            let mut used: Vec<IndexVar> = Vec::new();
            r.visit(&mut |e| {
                if let ScalarExpr::Read { index, .. } = e {
                    for a in index {
                        for t in &a.terms {
                            if !used.contains(&t.1) {
                                used.push(t.1);
                            }
                        }
                    }
                }
            });
            // Its free variables: the definition's, then the reductions'
            // around it, each from 0.
            let mut vars = Vec::new();
            let mut shape = Vec::new();
            let mut shift = HashMap::new();
            for (p, v) in def.vars.iter().enumerate() {
                if used.contains(v) {
                    vars.push(*v);
                    shape.push(def.ty.shape[p]);
                }
            }
            for rv in &around {
                if used.contains(&rv.var) {
                    if rv.hi <= rv.lo {
                        return Err(format!("the reduction over {} is empty", rv.var));
                    }
                    vars.push(rv.var);
                    shape.push((rv.hi - rv.lo) as usize);
                    if rv.lo != 0 {
                        shift.insert(
                            rv.var,
                            Affine {
                                terms: vec![(1, rv.var)],
                                constant: rv.lo,
                            },
                        );
                    }
                }
            }
            let dtype =
                crate::verify::scalar_dtype(r, &refs(in_types), &defs)?.unwrap_or(def.ty.dtype);
            let local = ElemDef {
                vars: vars.clone(),
                ty: TensorType::new(dtype, shape),
                expr: substitute(r, &shift),
            };
            let index = vars
                .iter()
                .map(|v| {
                    let lo = around.iter().find(|rv| rv.var == *v).map_or(0, |rv| rv.lo);
                    Affine {
                        terms: vec![(1, *v)],
                        constant: -lo,
                    }
                })
                .collect();
            *r = ScalarExpr::Read {
                src: Source::Local(defs.len() as u32),
                index,
            };
            defs.push(local);
        }
        renumber.push(defs.len() as u32);
        defs.push(ElemDef {
            vars: def.vars.clone(),
            ty: def.ty.clone(),
            expr,
        });
    }
    Ok(defs)
}

fn refs(types: &[TensorType]) -> Vec<&TensorType> {
    types.iter().collect()
}

/// `e` with each index variable in `sigma` replaced by its affine value.
fn substitute(e: &ScalarExpr, sigma: &HashMap<IndexVar, Affine>) -> ScalarExpr {
    rebuild(e, &mut |e| match e {
        ScalarExpr::Read { src, index } => Some(ScalarExpr::Read {
            src: *src,
            index: index.iter().map(|a| subst(a, sigma)).collect(),
        }),
        _ => None,
    })
}

fn combine(terms: impl IntoIterator<Item = (i64, IndexVar)>, constant: i64) -> Affine {
    let mut out: Vec<(i64, IndexVar)> = Vec::new();
    for (c, v) in terms {
        match out.iter_mut().find(|t| t.1 == v) {
            Some(t) => t.0 += c,
            None => out.push((c, v)),
        }
    }
    out.retain(|t| t.0 != 0);
    Affine {
        terms: out,
        constant,
    }
}

fn subst(a: &Affine, sigma: &HashMap<IndexVar, Affine>) -> Affine {
    let mut terms = Vec::new();
    let mut constant = a.constant;
    for &(c, v) in &a.terms {
        match sigma.get(&v) {
            Some(s) => {
                terms.extend(s.terms.iter().map(|&(d, w)| (c * d, w)));
                constant += c * s.constant;
            }
            None => terms.push((c, v)),
        }
    }
    combine(terms, constant)
}

/// `a + k b`.
fn add_scaled(a: &Affine, k: i64, b: &Affine) -> Affine {
    combine(
        a.terms
            .iter()
            .copied()
            .chain(b.terms.iter().map(|&(c, v)| (k * c, v))),
        a.constant + k * b.constant,
    )
}

/// Builds scalar expressions from derivative rules, folding what is
/// constant so that a product's adjoint stays a product (`g * b`, not
/// `(g * 1) * b`).
struct Scalar;

impl FormulaBuilder for Scalar {
    type Value = ScalarExpr;
    type Error = String;

    fn constant(&mut self, c: f64) -> Result<ScalarExpr, String> {
        Ok(ScalarExpr::Const(c))
    }

    fn unary(&mut self, u: UnaryOp, a: ScalarExpr) -> Result<ScalarExpr, String> {
        Ok(ScalarExpr::Unary(u, Box::new(a)))
    }

    fn binary(&mut self, op: BinaryOp, x: ScalarExpr, y: ScalarExpr) -> Result<ScalarExpr, String> {
        Ok(ScalarExpr::Binary(op, Box::new(x), Box::new(y)))
    }

    fn as_const(&self, v: &ScalarExpr) -> Option<f64> {
        match v {
            ScalarExpr::Const(c) => Some(*c),
            _ => None,
        }
    }

    fn select(
        &mut self,
        cmp: CmpOp,
        a: ScalarExpr,
        b: ScalarExpr,
        t: ScalarExpr,
        e: ScalarExpr,
    ) -> Result<ScalarExpr, String> {
        Ok(ScalarExpr::Select(
            Box::new(ScalarExpr::Compare(cmp, Box::new(a), Box::new(b))),
            Box::new(t),
            Box::new(e),
        ))
    }
}

fn mul(x: ScalarExpr, y: ScalarExpr) -> Result<ScalarExpr, String> {
    Scalar.fold(BinaryOp::Mul, x, y)
}

fn zero_unless(cond: &ScalarExpr, t: ScalarExpr, keep_then: bool) -> ScalarExpr {
    let zero = ScalarExpr::Const(0.0);
    let (a, b) = if keep_then { (t, zero) } else { (zero, t) };
    ScalarExpr::Select(Box::new(cond.clone()), Box::new(a), Box::new(b))
}

fn reads_any(e: &ScalarExpr, live: &dyn Fn(Source) -> bool) -> bool {
    let mut found = false;
    e.visit(&mut |x| {
        if let ScalarExpr::Read { src, .. } = x {
            found |= live(*src);
        }
    });
    found
}

/// The factors of a product of reads and numbers, or `None` if `e` is
/// anything else.
fn monomial(e: &ScalarExpr) -> Option<Vec<&ScalarExpr>> {
    match e {
        ScalarExpr::Read { .. } | ScalarExpr::Const(_) => Some(vec![e]),
        ScalarExpr::Binary(BinaryOp::Mul, a, b) => {
            let mut f = monomial(a)?;
            f.extend(monomial(b)?);
            Some(f)
        }
        _ => None,
    }
}

struct Derivation<'a, 'f> {
    b: &'a mut Builder<'f>,
    name: String,
    xs: Vec<Value>,
    in_types: Vec<TensorType>,
    defs: Vec<ElemDef>,
    values: Vec<Option<Value>>,
    /// Values the derived operators read besides the operands (adjoints,
    /// results, counts, guards): `Source::Input(xs.len() + i)`.
    extras: Vec<Value>,
    fresh: &'a mut u32,
}

type Term = (Source, Vec<Affine>, ScalarExpr);

impl Derivation<'_, '_> {
    fn extra(&mut self, v: Value) -> Source {
        let i = match self.extras.iter().position(|&e| e == v) {
            Some(i) => i,
            None => {
                self.extras.push(v);
                self.extras.len() - 1
            }
        };
        Source::Input((self.xs.len() + i) as u32)
    }

    fn source_type(&self, s: Source) -> TensorType {
        match s {
            Source::Input(i) if (i as usize) < self.xs.len() => self.in_types[i as usize].clone(),
            Source::Input(i) => self.b.ty(self.extras[i as usize - self.xs.len()]),
            Source::Local(k) => self.defs[k as usize].ty.clone(),
        }
    }

    /// The value of definition `k`, computed by an operator of its own the
    /// first time it is asked for.
    fn value(&mut self, k: usize) -> Result<Value, String> {
        if let Some(v) = self.values[k] {
            return Ok(v);
        }
        let def = self.defs[k].clone();
        let v = self.emit(&format!("{}.t{k}", self.name), def.vars, def.ty, &def.expr)?;
        self.values[k] = Some(v);
        Ok(v)
    }

    /// Adds the operator `out[vars] = expr`, its sources made operands.
    fn emit(
        &mut self,
        name: &str,
        vars: Vec<IndexVar>,
        ty: TensorType,
        expr: &ScalarExpr,
    ) -> Result<Value, String> {
        let mut sources: Vec<Source> = Vec::new();
        expr.visit(&mut |e| {
            if let ScalarExpr::Read { src, .. } = e
                && !sources.contains(src)
            {
                sources.push(*src);
            }
        });
        let mut operands: Vec<Value> = Vec::new();
        let mut slot: HashMap<Source, u32> = HashMap::new();
        for s in sources {
            let v = match s {
                Source::Input(i) if (i as usize) < self.xs.len() => self.xs[i as usize],
                Source::Input(i) => self.extras[i as usize - self.xs.len()],
                Source::Local(k) => self.value(k as usize)?,
            };
            let at = match operands.iter().position(|&o| o == v) {
                Some(p) => p,
                None => {
                    operands.push(v);
                    operands.len() - 1
                }
            };
            slot.insert(s, at as u32);
        }
        let expr = map_sources(expr, &mut |s| Source::Input(slot[&s]));
        let body = ComputeBody {
            name: name.to_string(),
            locals: vec![],
            out: ElemDef { vars, ty, expr },
        };
        self.b.op(Op::Compute(Box::new(body)), &operands)
    }

    /// Every read in definition `j` of a source that needs an adjoint, with
    /// the factor its element receives given the definition's adjoint `g`.
    fn terms(
        &mut self,
        j: usize,
        g: Value,
        live: &dyn Fn(Source) -> bool,
    ) -> Result<Vec<Term>, String> {
        let def = self.defs[j].clone();
        let here: Vec<Affine> = def.vars.iter().map(|&v| Affine::var(v)).collect();
        let gsrc = self.extra(g);
        let seed = ScalarExpr::Read {
            src: gsrc,
            index: here.clone(),
        };
        let mut out = Vec::new();
        match &def.expr {
            ScalarExpr::Reduce { kind, vars, body } => {
                let seed = match kind {
                    ReduceKind::Sum => seed,
                    ReduceKind::Mean => {
                        let count: i64 = vars.iter().map(|rv| rv.hi - rv.lo).product();
                        Scalar.fold(BinaryOp::Div, seed, ScalarExpr::Const(count as f64))?
                    }
                    ReduceKind::Max | ReduceKind::Min => {
                        let result = self.value(j)?;
                        let rsrc = self.extra(result);
                        let hit = ScalarExpr::Compare(
                            CmpOp::Eq,
                            body.clone(),
                            Box::new(ScalarExpr::Read {
                                src: rsrc,
                                index: here.clone(),
                            }),
                        );
                        let counted = ScalarExpr::Reduce {
                            kind: ReduceKind::Sum,
                            vars: vars.clone(),
                            body: Box::new(zero_unless(&hit, ScalarExpr::Const(1.0), true)),
                        };
                        let name = format!("{}.ties{j}", self.name);
                        let count = self.emit(&name, def.vars.clone(), def.ty.clone(), &counted)?;
                        let csrc = self.extra(count);
                        let share = ScalarExpr::Binary(
                            BinaryOp::Div,
                            Box::new(seed),
                            Box::new(ScalarExpr::Read {
                                src: csrc,
                                index: here.clone(),
                            }),
                        );
                        zero_unless(&hit, share, true)
                    }
                    ReduceKind::Prod => {
                        // Each element gets the product of the others
                        // (exact with zeros, as JAX's rule): an operator over
                        // the definition's space and the reduced variables,
                        // `others[v, k] = prod[k'](k' == k ? 1 : body(v, k'))`,
                        // work quadratic in the reduced extent.
                        let others = self.others_product(j, vars, body)?;
                        let osrc = self.extra(others);
                        let mut index = here.clone();
                        index.extend(vars.iter().map(|rv| Affine {
                            terms: vec![(1, rv.var)],
                            constant: -rv.lo,
                        }));
                        mul(seed, ScalarExpr::Read { src: osrc, index })?
                    }
                };
                self.walk(body, seed, live, &mut out)?;
            }
            e => self.walk(e, seed, live, &mut out)?,
        }
        Ok(out)
    }

    /// For definition `j`, `out[v] = prod[vars](body)`: the operator
    /// `others[v, k - lo] = prod[k'](where(k' == k, 1, body(v, k')))` over
    /// the definition's space and the reduced variables `k`, each
    /// equality a read of a one-element array of ones at `k' - k`.
    fn others_product(
        &mut self,
        j: usize,
        vars: &[RangeVar],
        body: &ScalarExpr,
    ) -> Result<Value, String> {
        let def = self.defs[j].clone();
        let dtype = def.ty.dtype;
        let fresh = |this: &mut Self| {
            let v = IndexVar(*this.fresh);
            *this.fresh += 1;
            v
        };
        let mut out_vars = def.vars.clone();
        let mut shape = def.ty.shape.clone();
        let mut inner = Vec::new();
        let mut rename: HashMap<IndexVar, Affine> = HashMap::new();
        let mut same: Option<ScalarExpr> = None;
        for rv in vars {
            // k - lo is the output's index; k' the inner reduction's variable.
            let k = fresh(self);
            let k2 = fresh(self);
            out_vars.push(k);
            shape.push((rv.hi - rv.lo) as usize);
            inner.push(RangeVar { var: k2, ..*rv });
            rename.insert(rv.var, Affine::var(k2));
            let ones = self.b.constant(1.0, TensorType::new(dtype, vec![1]));
            // k' - (k + lo): zero exactly where k' is this k.
            let at = Affine {
                terms: vec![(1, k2), (-1, k)],
                constant: -rv.lo,
            };
            let eq = ScalarExpr::Read {
                src: self.extra(ones),
                index: vec![at],
            };
            same = Some(match same {
                Some(s) => mul(s, eq)?,
                None => eq,
            });
        }
        let same = same.ok_or("internal: a `prod` over no variables")?;
        let is_same =
            ScalarExpr::Compare(CmpOp::Ne, Box::new(same), Box::new(ScalarExpr::Const(0.0)));
        let factor = ScalarExpr::Select(
            Box::new(is_same),
            Box::new(ScalarExpr::Const(1.0)),
            Box::new(substitute(body, &rename)),
        );
        let expr = ScalarExpr::Reduce {
            kind: ReduceKind::Prod,
            vars: inner,
            body: Box::new(factor),
        };
        let name = format!("{}.others{j}", self.name);
        self.emit(&name, out_vars, TensorType::new(dtype, shape), &expr)
    }

    fn dtype(&self, e: &ScalarExpr) -> Result<Option<DType>, String> {
        crate::verify::scalar_dtype(e, &refs(&self.in_types), &self.defs)
    }

    /// Reverse mode through `e`, whose adjoint is `adj`.
    fn walk(
        &self,
        e: &ScalarExpr,
        adj: ScalarExpr,
        live: &dyn Fn(Source) -> bool,
        out: &mut Vec<Term>,
    ) -> Result<(), String> {
        if !reads_any(e, live) || !self.dtype(e)?.is_some_and(|d| d.is_float()) {
            return Ok(());
        }
        match e {
            ScalarExpr::Const(_) | ScalarExpr::Compare(..) => {}
            ScalarExpr::Read { src, index } => out.push((*src, index.clone(), adj)),
            ScalarExpr::Unary(u, a) => {
                let leaves = [(**a).clone(), ScalarExpr::Const(0.0), e.clone()];
                let d = u.derivative().build(&mut Scalar, &leaves)?;
                self.walk(a, mul(adj, d)?, live, out)?;
            }
            ScalarExpr::Binary(op, a, c) => {
                let partials = op
                    .partials()
                    .ok_or_else(|| format!("{} has no derivative", op.name()))?;
                let leaves = [(**a).clone(), (**c).clone(), e.clone()];
                for (x, p) in [a, c].into_iter().zip(partials) {
                    let d = p.build(&mut Scalar, &leaves)?;
                    self.walk(x, mul(adj.clone(), d)?, live, out)?;
                }
            }
            ScalarExpr::Select(c, a, f) => {
                self.walk(a, zero_unless(c, adj.clone(), true), live, out)?;
                self.walk(f, zero_unless(c, adj, false), live, out)?;
            }
            ScalarExpr::Cast(_, a) => {
                if let Some(from) = self.dtype(a)?.filter(|d| d.is_float()) {
                    self.walk(a, ScalarExpr::Cast(from, Box::new(adj)), live, out)?;
                }
            }
            ScalarExpr::Reduce { .. } => {
                return Err("internal: a nested reduction survived normalization".into());
            }
        }
        Ok(())
    }

    /// The operator adding up, for each element `u` of `src`, the term `t`
    /// over every point of definition `j`'s space that reads `src` at `u`
    /// through `index`.
    fn term_op(
        &mut self,
        j: usize,
        src: Source,
        index: &[Affine],
        t: ScalarExpr,
    ) -> Result<Value, String> {
        let def = self.defs[j].clone();
        let mut ranges: Vec<RangeVar> = def
            .vars
            .iter()
            .zip(&def.ty.shape)
            .map(|(&var, &n)| RangeVar {
                var,
                lo: 0,
                hi: n as i64,
            })
            .collect();
        if let ScalarExpr::Reduce { vars, .. } = &def.expr {
            ranges.extend(vars.iter().copied());
        }
        let ty = self.source_type(src);
        let u: Vec<IndexVar> = (0..ty.rank() as u32)
            .map(|d| IndexVar(*self.fresh + d))
            .collect();
        *self.fresh += ty.rank() as u32;
        // Solve index[d] = u[d] for one variable each.
        let mut sigma: HashMap<IndexVar, Affine> = HashMap::new();
        let mut equal: Vec<Affine> = Vec::new();
        for (d, a) in index.iter().enumerate() {
            let e = add_scaled(&subst(a, &sigma), -1, &Affine::var(u[d]));
            let pick = e
                .terms
                .iter()
                .filter(|(c, v)| c.abs() == 1 && !u.contains(v))
                .filter_map(|&(c, v)| {
                    let rv = ranges.iter().find(|r| r.var == v)?;
                    Some((rv.hi - rv.lo, c, v))
                })
                .max_by_key(|p| p.0);
            match pick {
                Some((_, c, w)) => {
                    // c w + rest = 0  =>  w = -rest / c
                    let rest = add_scaled(&e, -c, &Affine::var(w));
                    let sol = add_scaled(&Affine::default(), -c, &rest);
                    let one = HashMap::from([(w, sol.clone())]);
                    for s in sigma.values_mut() {
                        *s = subst(s, &one);
                    }
                    sigma.insert(w, sol);
                }
                None => equal.push(e),
            }
        }
        let equal: Vec<Affine> = equal.iter().map(|e| subst(e, &sigma)).collect();
        let remaining: Vec<RangeVar> = ranges
            .iter()
            .filter(|r| !sigma.contains_key(&r.var))
            .copied()
            .collect();
        let t = substitute(&t, &sigma);
        // The interval an affine expression of u and the remaining
        // variables spans.
        let span = |a: &Affine| -> (i64, i64) {
            let (mut lo, mut hi) = (a.constant, a.constant);
            for &(c, v) in &a.terms {
                let (vlo, vhi) = match u.iter().position(|x| *x == v) {
                    Some(d) => (0, ty.shape[d] as i64 - 1),
                    None => match remaining.iter().find(|r| r.var == v) {
                        Some(r) => (r.lo, r.hi - 1),
                        None => (i64::MIN / 4, i64::MAX / 4),
                    },
                };
                lo += (c * vlo).min(c * vhi);
                hi += (c * vlo).max(c * vhi);
            }
            (lo, hi)
        };
        let factors: Option<Vec<ScalarExpr>> =
            monomial(&t).map(|f| f.into_iter().cloned().collect());
        // Whether a factor read's bounds are the range [lo, hi) of `s`.
        let implied = |s: &Affine, lo: i64, hi: i64, this: &Self| -> bool {
            factors.iter().flatten().any(|f| match f {
                ScalarExpr::Read { src, index } => {
                    let shape = this.source_type(*src).shape;
                    index.iter().zip(&shape).any(|(e, &n)| {
                        let diff = add_scaled(e, -1, s);
                        diff.terms.is_empty()
                            && lo + diff.constant == 0
                            && hi + diff.constant == n as i64
                    })
                }
                _ => false,
            })
        };
        let mut guards: Vec<ScalarExpr> = Vec::new();
        let mut vars_solved: Vec<(&IndexVar, &Affine)> = sigma.iter().collect();
        vars_solved.sort_by_key(|(v, _)| v.0);
        for (w, s) in vars_solved {
            let Some(r) = ranges.iter().find(|r| r.var == *w) else {
                continue;
            };
            let (lo, hi) = span(s);
            if (lo >= r.lo && hi < r.hi) || implied(s, r.lo, r.hi, self) {
                continue;
            }
            let n = (r.hi - r.lo) as usize;
            let ones = self.b.constant(1.0, TensorType::new(ty.dtype, vec![n]));
            guards.push(ScalarExpr::Read {
                src: self.extra(ones),
                index: vec![add_scaled(
                    s,
                    -r.lo,
                    &Affine {
                        terms: vec![],
                        constant: 1,
                    },
                )],
            });
        }
        for e in equal {
            let ones = self.b.constant(1.0, TensorType::new(ty.dtype, vec![1]));
            guards.push(ScalarExpr::Read {
                src: self.extra(ones),
                index: vec![e],
            });
        }
        let mut guarded = t;
        if !guards.is_empty() {
            let mut all = guards.remove(0);
            for gd in guards {
                all = mul(all, gd)?;
            }
            guarded = if factors.is_some() {
                mul(guarded, all)?
            } else {
                let inside =
                    ScalarExpr::Compare(CmpOp::Ne, Box::new(all), Box::new(ScalarExpr::Const(0.0)));
                zero_unless(&inside, guarded, true)
            };
        }
        let expr = if remaining.is_empty() {
            guarded
        } else {
            ScalarExpr::Reduce {
                kind: ReduceKind::Sum,
                vars: remaining,
                body: Box::new(guarded),
            }
        };
        let name = format!("{}.grad", self.name);
        self.emit(&name, u, ty, &expr)
    }
}
