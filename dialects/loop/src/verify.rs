//! The loop dialect's part of the verifier: the generic one
//! ([`dlc_core::ir::verify`]: SSA, indices over index values, regions,
//! terminators) with each op's typing rule ([`OpKind::check`]), index ranks,
//! the shape of a `loop.matmul`, and kernel groups (closed, not nested, only
//! at the top level). Every problem is reported, each with where it is.

use dlc_core::VerifyError;
use dlc_core::ir::verify::{BlockKind, VerifyDialect};

use crate::ir::{Block, Function, IndexExpr, Loop, Module, OpData, OpId, OpKind, Type, Value};
use crate::ops::MATMUL_COUNTERS;
use dlc_core::ir::OpDecl;

/// Every problem in `m`.
pub fn verify_module(m: &Module) -> Vec<VerifyError> {
    dlc_core::ir::verify::verify_module(m)
}

impl VerifyDialect for Loop {
    type Context = ();

    fn body_context() {}

    fn check_function(f: &Function) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, v) in &f.params {
            match f.ty(*v) {
                Type::Buffer(b) if b.offset != 0 => problems.push(format!(
                    "parameter %{name} has an offset: a parameter is its own storage"
                )),
                Type::Buffer(_) => {}
                _ => problems.push(format!("parameter %{name} is not a buffer")),
            }
        }
        if let Some(p) = &f.prepare {
            problems.push(format!(
                "loop IR has no preparers (`prepare @{p}`): `tile.split-prepare` makes them in tile IR"
            ));
        }
        problems
    }

    fn check_op(f: &Function, id: OpId, _: ()) -> Vec<String> {
        let op = f.op(id);
        let types =
            |vs: &[Value]| -> Vec<Option<&Type>> { vs.iter().map(|v| Some(f.ty(*v))).collect() };
        let ops = types(&op.operands);
        let args = op.regions.first().map_or(vec![], |r| types(&r.args));
        if let Err(e) = op.kind.check(&ops, &types(&op.results), &args) {
            return vec![e];
        }
        let rank = |v: Value| match f.ty(v) {
            Type::Buffer(b) => b.shape.len(),
            _ => 0,
        };
        let mut problems = Vec::new();
        let mut check_rank = |index: &[IndexExpr], rank: usize| {
            if index.len() != rank {
                problems.push(format!("{} indices for a rank-{rank} buffer", index.len()));
            }
        };
        match &op.kind {
            OpKind::Load { index, .. } => check_rank(index, rank(op.operands[0])),
            OpKind::Store { index } => check_rank(index, rank(op.operands[1])),
            OpKind::Matmul(c) => {
                check_rank(&c.a, rank(op.operands[0]));
                check_rank(&c.b, rank(op.operands[1]));
                problems.extend(matmul_shape(f, op, c));
            }
            _ => {}
        }
        problems
    }

    fn region(f: &Function, op: &OpData, _: ()) -> ((), BlockKind<Type>) {
        match op.kind {
            OpKind::For { .. } => (
                (),
                BlockKind::Loop(op.operands.iter().map(|v| f.ty(*v).clone()).collect()),
            ),
            _ => ((), BlockKind::Plain),
        }
    }

    /// Kernel groups: `loop.kernel_begin` .. `loop.kernel_end` in the
    /// function body, closed and not nested.
    fn check_block(f: &Function, b: &Block, kind: &BlockKind<Type>) -> Vec<(Option<OpId>, String)> {
        let mut problems = Vec::new();
        let mut group: Option<OpId> = None;
        for &id in &b.ops {
            let Some(op) = f.ops.get(id.0 as usize) else {
                continue;
            };
            match (&op.kind, kind) {
                (OpKind::KernelBegin(_), BlockKind::Body) if group.is_some() => problems.push((
                    Some(id),
                    "opens a kernel group inside another (groups do not nest)".into(),
                )),
                (OpKind::KernelBegin(_), BlockKind::Body) => group = Some(id),
                (OpKind::KernelEnd, BlockKind::Body) if group.take().is_none() => {
                    problems.push((Some(id), "closes no open kernel group".into()));
                }
                (OpKind::KernelEnd, BlockKind::Body) => {}
                (OpKind::KernelBegin(_) | OpKind::KernelEnd, _) => problems.push((
                    Some(id),
                    "must be in a function body, not in a loop (a kernel group bounds top-level \
                     ops)"
                        .into(),
                )),
                _ => {}
            }
        }
        if let Some(open) = group {
            problems.push((
                Some(open),
                "opens a kernel group that no loop.kernel_end closes".into(),
            ));
        }
        problems
    }
}

/// What makes a `loop.matmul` a matrix product: rows index the left operand
/// only, columns the right one only, and the reduction index nothing but the
/// operands.
fn matmul_shape(f: &Function, op: &OpData, c: &crate::ir::Contraction) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(region) = op
        .regions
        .first()
        .filter(|r| r.args.len() > MATMUL_COUNTERS)
    else {
        return problems;
    };
    let in_terms = |e: &[IndexExpr], v: Value| e.iter().any(|x| x.terms.iter().any(|t| t.1 == v));
    if in_terms(&c.a, region.args[1]) || in_terms(&c.b, region.args[0]) {
        problems.push(
            "indexes its left operand by the column index or its right operand by the row \
             index (a matrix product's left operand is indexed by rows and k, its right one \
             by k and columns)"
                .into(),
        );
    }
    if uses_value(f, region, region.args[2]) {
        problems.push("uses the reduction index outside the operands' indices".into());
    }
    problems
}

/// Whether an op in `b`, or in blocks nested in it, uses `v`.
fn uses_value(f: &Function, b: &Block, v: Value) -> bool {
    b.ops.iter().any(|id| {
        let Some(op) = f.ops.get(id.0 as usize) else {
            return false;
        };
        let in_index =
            |index: &[IndexExpr]| index.iter().any(|e| e.terms.iter().any(|(_, t)| *t == v));
        op.operands.contains(&v)
            || op.kind.indices().into_iter().any(in_index)
            || op.regions.iter().any(|r| uses_value(f, r, v))
    })
}
