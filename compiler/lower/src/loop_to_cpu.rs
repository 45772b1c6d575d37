//! `loop.map-cpu`: the mapping of loop IR onto the CPU that the current
//! CPU back end compiles (it reads loop IR, not tile IR, until it is
//! rebuilt on the tile dialect):
//! 1. each contraction nest (`for i { for j { acc = sum_k a[..] * b[..];
//!    epilogue(acc) } }`) becomes the structured `loop.matmul`
//!    ([`raise_contractions`], which `convert-loop-to-tile` shares), and one
//!    of f32 with at least [`TargetDesc::min_packed_macs`] multiply-adds
//!    stays one, so code generation packs its operands and runs a
//!    register-tiled micro-kernel (smaller or other types go back to loops);
//! 2. the outermost parallel loop of each top-level nest with enough
//!    iterations runs on the runtime's threads (`loop.threads`), or a
//!    top-level `loop.matmul` splits its rows over threads.

use dlc_core::{DType, Pass, PassError, TargetDesc, scalar::BinaryOp};
use dlc_loop::{
    Block, Contraction, Function, IndexExpr, Module, OpData, OpId, OpKind, Type, Value,
};

/// `loop.map-cpu`: packed contractions to `loop.matmul`, outer parallel
/// loops to `loop.threads`, for the host CPU.
#[derive(Debug, Clone, Default)]
pub struct MapLoopsToCpu;

impl Pass<Module> for MapLoopsToCpu {
    fn name(&self) -> &'static str {
        "loop.map-cpu"
    }

    fn run(&mut self, m: &mut Module) -> Result<Vec<(&'static str, u64)>, PassError> {
        let target = TargetDesc::host();
        let (mut matmuls, mut threads) = (0u64, 0u64);
        for f in &mut m.functions {
            matmuls += raise_contractions(f, |d, macs| target.packs_product(d, macs));
            let top = f.body.ops.clone();
            let min_iterations = target.min_thread_iterations() as i64;
            for id in top {
                threads += u64::from(map_threads(f, id, min_iterations));
            }
        }
        Ok(vec![
            ("contractions to loop.matmul", matmuls),
            ("nests mapped onto threads", threads),
        ])
    }
}

/// Rewrites each contraction nest of `f` for whose element type and
/// multiply-adds `keep` holds into a structured `loop.matmul`; returns how
/// many. (The lowering from the graph emits products as loop nests of one
/// fixed shape, which this recognizes; see docs/architecture.md.)
pub fn raise_contractions(f: &mut Function, keep: impl Fn(DType, usize) -> bool + Copy) -> u64 {
    let mut count = 0;
    let body = f.body.ops.clone();
    f.body.ops = contractions(f, body, &mut count, keep);
    count
}

/// Rewrites the contraction nests among `ops` (and in their bodies).
fn contractions(
    f: &mut Function,
    ops: Vec<OpId>,
    count: &mut u64,
    keep: impl Fn(DType, usize) -> bool + Copy,
) -> Vec<OpId> {
    ops.into_iter()
        .map(|id| {
            if let Some(new) = matmul(f, id, keep) {
                *count += 1;
                return new;
            }
            for r in 0..f.ops[id.0 as usize].regions.len() {
                let inner = f.ops[id.0 as usize].regions[r].ops.clone();
                let inner = contractions(f, inner, count, keep);
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

/// `loop.matmul` for the nest at `id`, if it is a contraction:
/// `loop i { loop j { %z = 0; %acc = loop.for k iter(%s = %z) { %a = load;
/// %b = load; %p = mul %a, %b; %t = add %s, %p; yield %t }; epilogue } }`.
fn matmul(f: &mut Function, id: OpId, keep: impl Fn(DType, usize) -> bool) -> Option<OpId> {
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
    let macs = usize::try_from(m.saturating_mul(n).saturating_mul(k)).unwrap_or(0);
    if !f32_buffer(a.0) || !f32_buffer(b.0) || !keep(DType::F32, macs) {
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
fn map_threads(f: &mut Function, mut id: OpId, min_iterations: i64) -> bool {
    loop {
        match f.ops[id.0 as usize].kind {
            OpKind::Matmul(_) => {
                if let OpKind::Matmul(c) = &mut f.ops[id.0 as usize].kind {
                    c.parallel = true;
                }
                return true;
            }
            OpKind::Parallel { lo, hi } => {
                if hi - lo < min_iterations
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
