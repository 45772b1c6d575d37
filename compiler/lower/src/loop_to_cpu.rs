//! `loop.map-cpu`: the mapping of loop IR onto the CPU that the current
//! CPU back end compiles (it reads loop IR, not tile IR, until it is
//! rebuilt on the tile dialect):
//! 1. a structured product (`loop.matmul`, as the lowering emits every
//!    matrix product) that the host packs (`TargetDesc::packs_product`: f32
//!    with at least 16K multiply-adds) stays one, so code generation packs
//!    its operands and runs a register-tiled micro-kernel; others become the
//!    loop nest they mean, which LLVM vectorizes;
//! 2. the outermost parallel loop of each top-level nest with enough
//!    iterations runs on the runtime's threads (`loop.threads`), or a
//!    top-level `loop.matmul` splits its rows over threads.

use dlc_core::{DType, Pass, PassError, TargetDesc, scalar::BinaryOp};
use dlc_loop::{Block, Function, IndexExpr, Module, OpData, OpId, OpKind, Type, Value};

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
            matmuls += expand_unpacked(f, target);
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

/// Expands each `loop.matmul` of `f` that the host does not pack (not f32,
/// or too few multiply-adds) into the loop nest it means; returns how many
/// products stay packed.
fn expand_unpacked(f: &mut Function, target: &TargetDesc) -> u64 {
    let mut packed = 0;
    let body = std::mem::take(&mut f.body);
    f.body = expand_in(f, body, target, &mut packed);
    packed
}

fn expand_in(f: &mut Function, mut b: Block, target: &TargetDesc, packed: &mut u64) -> Block {
    for slot in 0..b.ops.len() {
        let id = b.ops[slot];
        let regions = std::mem::take(&mut f.ops[id.0 as usize].regions);
        f.ops[id.0 as usize].regions = regions
            .into_iter()
            .map(|r| expand_in(f, r, target, packed))
            .collect();
        let OpKind::Matmul(c) = &f.ops[id.0 as usize].kind else {
            continue;
        };
        let dtype = match f.ty(f.ops[id.0 as usize].operands[0]) {
            Type::Buffer(t) => t.dtype,
            _ => continue,
        };
        let macs = usize::try_from(c.m.saturating_mul(c.n).saturating_mul(c.k)).unwrap_or(0);
        if target.packs_product(dtype, macs) {
            *packed += 1;
        } else {
            b.ops[slot] = expand(f, id);
        }
    }
    b
}

/// The loop nest a `loop.matmul` means: `parallel i { for j { %acc = for k
/// iter(0) { a * b + .. }; epilogue } }`, products computed in the
/// accumulator type. The epilogue's `%acc` becomes the `k` loop's result.
fn expand(f: &mut Function, id: OpId) -> OpId {
    let op = f.ops[id.0 as usize].clone();
    let OpKind::Matmul(c) = &op.kind else {
        return id;
    };
    let region = &op.regions[0];
    let (iv, jv, kv, accv) = (
        region.args[0],
        region.args[1],
        region.args[2],
        region.args[3],
    );
    let acc_t = f.ty(accv).clone();
    let acc_d = match acc_t {
        Type::Scalar(d) => d,
        _ => DType::F32,
    };
    let loc = op.loc.clone();
    let make = |f: &mut Function,
                kind: OpKind,
                operands: Vec<Value>,
                results: &[Type],
                regions: Vec<Block>| {
        let id = f.create_op(kind, operands, results, regions);
        f.ops[id.0 as usize].loc = loc.clone();
        id
    };
    let zero = make(
        f,
        OpKind::Const(0.0),
        vec![],
        std::slice::from_ref(&acc_t),
        vec![],
    );
    let init = f.op(zero).results[0];
    let carried = f.new_value(acc_t.clone());
    let mut k_ops = vec![];
    let operand = |f: &mut Function, buf: Value, index: &[IndexExpr], k_ops: &mut Vec<OpId>| {
        let d = match f.ty(buf) {
            Type::Buffer(t) => t.dtype,
            _ => acc_d,
        };
        let load = make(
            f,
            OpKind::Load {
                index: index.to_vec(),
                pad: None,
            },
            vec![buf],
            &[Type::Scalar(d)],
            vec![],
        );
        k_ops.push(load);
        let mut v = f.op(load).results[0];
        if d != acc_d {
            let cast = make(
                f,
                OpKind::Cast,
                vec![v],
                std::slice::from_ref(&acc_t),
                vec![],
            );
            k_ops.push(cast);
            v = f.op(cast).results[0];
        }
        v
    };
    let x = operand(f, op.operands[0], &c.a, &mut k_ops);
    let y = operand(f, op.operands[1], &c.b, &mut k_ops);
    let mul = make(
        f,
        OpKind::Binary(BinaryOp::Mul),
        vec![x, y],
        std::slice::from_ref(&acc_t),
        vec![],
    );
    let p = f.op(mul).results[0];
    let add = make(
        f,
        OpKind::Binary(BinaryOp::Add),
        vec![carried, p],
        std::slice::from_ref(&acc_t),
        vec![],
    );
    let next = f.op(add).results[0];
    let yld = make(f, OpKind::Yield, vec![next], &[], vec![]);
    k_ops.extend([mul, add, yld]);
    // The k loop defines the epilogue's accumulator.
    f.ops.push(OpData {
        kind: OpKind::For {
            lo: 0,
            hi: c.k,
            step: 1,
        },
        operands: vec![init],
        results: vec![accv],
        regions: vec![Block {
            args: vec![kv, carried],
            ops: k_ops,
        }],
        loc: op.loc.clone(),
    });
    let k_loop = OpId(f.ops.len() as u32 - 1);
    let mut j_ops = vec![zero, k_loop];
    j_ops.extend(region.ops.iter().copied());
    let j_loop = make(
        f,
        OpKind::For {
            lo: 0,
            hi: c.n,
            step: 1,
        },
        vec![],
        &[],
        vec![Block {
            args: vec![jv],
            ops: j_ops,
        }],
    );
    make(
        f,
        OpKind::Parallel { lo: 0, hi: c.m },
        vec![],
        &[],
        vec![Block {
            args: vec![iv],
            ops: vec![j_loop],
        }],
    )
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
