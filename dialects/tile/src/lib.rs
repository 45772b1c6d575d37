//! The tile dialect: loop nests mapped onto a machine.
//!
//! Tile ops live in the loop dialect's IR (`dlc_loop::OpKind::Threads`,
//! `dlc_loop::OpKind::Matmul`), as MLIR dialects share one module, so loop
//! ops stay where no schedule applies, and one printer, parser, verifier and
//! interpreter serve both levels. This crate holds the mapping:
//! [`ConvertLoopToTile`] (`convert-loop-to-tile`)
//! 1. turns each contraction nest (`for i { for j { acc = sum_k a[..] *
//!    b[..]; epilogue(acc) } }` over f32) into `tile.matmul`, whose code
//!    generation packs the operands and runs a register-tiled micro-kernel,
//!    keeping the epilogue (bias, activation, scaling, the store) as loop ops;
//! 2. maps the outermost parallel loop of each top-level nest with enough
//!    iterations onto the runtime's threads (`tile.threads`), or splits a
//!    top-level `tile.matmul`'s rows over threads.
//!
//! Inner loops are left to LLVM's vectorizer (they are unit-stride after
//! lowering); the GPU mapping (grid, blocks, warps, shared memory) will be
//! further schedules of the same ops: see docs/architecture.md.
#![deny(missing_docs)]

use dlc_core::{DType, scalar::BinaryOp};
use dlc_core::{Pass, PassError};
use dlc_loop::{
    Block, Contraction, Function, IndexExpr, Module, OpData, OpId, OpKind, Type, Value,
};

/// Contractions with fewer multiply-adds than this stay loop nests: packing
/// would cost more than it saves.
pub const MIN_MATMUL_MACS: i64 = 16 * 1024;

/// A parallel loop with fewer iterations than this is looked through for a
/// wider one inside before being mapped onto threads.
pub const MIN_THREAD_ITERATIONS: i64 = 8;

/// `convert-loop-to-tile`: contractions to `tile.matmul`, outer parallel
/// loops to `tile.threads`.
#[derive(Debug, Clone, Default)]
pub struct ConvertLoopToTile;

impl Pass<Module> for ConvertLoopToTile {
    fn name(&self) -> &'static str {
        "convert-loop-to-tile"
    }

    fn run(&mut self, m: &mut Module) -> Result<Vec<(&'static str, u64)>, PassError> {
        let (mut matmuls, mut threads) = (0u64, 0u64);
        for f in &mut m.functions {
            let body = f.body.ops.clone();
            f.body.ops = contractions(f, body, &mut matmuls);
            let top = f.body.ops.clone();
            for id in top {
                threads += u64::from(map_threads(f, id));
            }
        }
        Ok(vec![
            ("contractions to tile.matmul", matmuls),
            ("nests mapped onto threads", threads),
        ])
    }
}

/// Rewrites the contraction nests among `ops` (and in their bodies).
fn contractions(f: &mut Function, ops: Vec<OpId>, count: &mut u64) -> Vec<OpId> {
    ops.into_iter()
        .map(|id| {
            if let Some(new) = matmul(f, id) {
                *count += 1;
                return new;
            }
            for r in 0..f.ops[id.0 as usize].regions.len() {
                let inner = f.ops[id.0 as usize].regions[r].ops.clone();
                let inner = contractions(f, inner, count);
                f.ops[id.0 as usize].regions[r].ops = inner;
            }
            id
        })
        .collect()
}

/// A loop `0..hi` by 1 carrying nothing: its extent and body.
fn plain_loop(op: &OpData) -> Option<(i64, &Block)> {
    match op.kind {
        OpKind::For { lo: 0, hi, step: 1 } | OpKind::Parallel { lo: 0, hi }
            if op.operands.is_empty() =>
        {
            Some((hi, &op.regions[0]))
        }
        _ => None,
    }
}

fn uses(index: &[IndexExpr], v: Value) -> bool {
    index.iter().any(|e| e.terms.iter().any(|(_, t)| *t == v))
}

/// `tile.matmul` for the nest at `id`, if it is a contraction:
/// `loop i { loop j { %z = 0; %acc = loop.for k iter(%s = %z) { %a = load;
/// %b = load; %p = mul %a, %b; %t = add %s, %p; yield %t }; epilogue } }`.
fn matmul(f: &mut Function, id: OpId) -> Option<OpId> {
    let outer = f.op(id);
    let (m, ibody) = plain_loop(outer)?;
    let [j_id] = ibody.ops.as_slice() else {
        return None;
    };
    let iv = ibody.args[0];
    let (n, jbody) = plain_loop(f.op(*j_id))?;
    let jv = jbody.args[0];
    // The one reduction loop in j's body.
    let reductions: Vec<OpId> = jbody
        .ops
        .iter()
        .copied()
        .filter(|o| matches!(f.op(*o).kind, OpKind::For { .. }))
        .collect();
    let [r_id] = reductions.as_slice() else {
        return None;
    };
    let r = f.op(*r_id);
    let OpKind::For {
        lo: 0,
        hi: k,
        step: 1,
    } = r.kind
    else {
        return None;
    };
    if r.operands.len() != 1 || r.results.len() != 1 {
        return None;
    }
    let init = r.operands[0];
    let zero = jbody.ops.iter().any(|o| {
        let op = f.op(*o);
        matches!(op.kind, OpKind::Const(c) if c == 0.0) && op.results == [init]
    });
    if !zero || *f.ty(init) != Type::Scalar(DType::F32) {
        return None;
    }
    let rbody = &r.regions[0];
    let (kv, carried) = (rbody.args[0], rbody.args[1]);
    let [l1, l2, mul, add, yld] = rbody.ops.as_slice() else {
        return None;
    };
    let (l1, l2, mul, add, yld) = (f.op(*l1), f.op(*l2), f.op(*mul), f.op(*add), f.op(*yld));
    let load = |op: &OpData| match &op.kind {
        OpKind::Load { index, pad: None } => Some((op.operands[0], index.clone(), op.results[0])),
        _ => None,
    };
    let (x, y) = (load(l1)?, load(l2)?);
    let same = |ops: &[Value], a: Value, b: Value| ops == [a, b] || ops == [b, a];
    if !matches!(mul.kind, OpKind::Binary(BinaryOp::Mul))
        || !same(&mul.operands, x.2, y.2)
        || !matches!(add.kind, OpKind::Binary(BinaryOp::Add))
        || !same(&add.operands, carried, mul.results[0])
        || !matches!(yld.kind, OpKind::Yield)
        || yld.operands != add.results
    {
        return None;
    }
    // The left operand is indexed by i (never j), the right by j (never i).
    let (a, b) = if !uses(&x.1, jv) && !uses(&y.1, iv) {
        (x, y)
    } else if !uses(&y.1, jv) && !uses(&x.1, iv) {
        (y, x)
    } else {
        return None;
    };
    let f32_buffer = |v: Value| matches!(f.ty(v), Type::Buffer(t) if t.dtype == DType::F32);
    if !f32_buffer(a.0)
        || !f32_buffer(b.0)
        || m.saturating_mul(n).saturating_mul(k) < MIN_MATMUL_MACS
    {
        return None;
    }
    let acc = r.results[0];
    let epilogue: Vec<OpId> = jbody.ops.iter().copied().filter(|o| o != r_id).collect();
    f.ops.push(OpData {
        kind: OpKind::Matmul(Box::new(Contraction {
            m,
            n,
            k,
            a: a.1,
            b: b.1,
            parallel: false,
        })),
        operands: vec![a.0, b.0],
        results: vec![],
        regions: vec![Block {
            args: vec![iv, jv, kv, acc],
            ops: epilogue,
        }],
        loc: r.loc.clone(),
    });
    Some(OpId(f.ops.len() as u32 - 1))
}

/// Maps the top-level nest at `id` onto threads; whether it did.
fn map_threads(f: &mut Function, mut id: OpId) -> bool {
    loop {
        match f.ops[id.0 as usize].kind {
            OpKind::Matmul(_) => {
                if let OpKind::Matmul(c) = &mut f.ops[id.0 as usize].kind {
                    c.parallel = true;
                }
                return true;
            }
            OpKind::Parallel { lo, hi } => {
                if hi - lo < MIN_THREAD_ITERATIONS
                    && let [inner] = f.ops[id.0 as usize].regions[0].ops.as_slice()
                    && matches!(
                        f.ops[inner.0 as usize].kind,
                        OpKind::Parallel { .. } | OpKind::Matmul(_)
                    )
                {
                    id = *inner;
                    continue;
                }
                f.ops[id.0 as usize].kind = OpKind::Threads { lo, hi };
                return true;
            }
            _ => return false,
        }
    }
}
