//! Automatic mixed precision: a function's products computed in a narrow
//! float type (bf16 or f16) while the values they read and everything
//! precision-sensitive stay f32, as PyTorch's `torch.autocast` does.
//!
//! The policy, op by op, for values whose type in the original function
//! is f32 (f64 and the narrow types are left as they are):
//! - products (`graph.matmul`, `graph.conv2d`) read their f32 operands
//!   cast to the narrow type and produce it (accumulating in f32, as every
//!   back end does for narrow products);
//! - reductions, softmax, layernorm, batchnorm, `exp`, `log`, `sqrt`,
//!   `rsqrt`, `reciprocal`, `pow`, user operators and calls run on their
//!   original types: a narrow operand is cast back up;
//! - every other op (element-wise, comparisons, `where`, shapes, pooling)
//!   runs in the narrow type when each of its float operands that is not a
//!   constant is narrow (constants follow, as a Python scalar does in
//!   PyTorch), and on the original types otherwise;
//! - the results are cast back to their original types, so the function
//!   keeps its signature: f32 weights (the master copy an optimizer
//!   updates) in, an f32 loss out.
//!
//! The gradient of the result (`graph.grad`) flows through the casts: each
//! narrow op's adjoint is narrow too, and a weight's gradient is f32.
//!
//! # Where it applies
//!
//! - Mixed precision is a graph transform, `transforms::autocast` (PyTorch's autocast
//!   policy: products narrow, precision-sensitive ops on their f32 types, the rest narrow
//!   only when every non-constant float operand is), applied to the inlined callee before
//!   it is differentiated (`GradOptions::autocast`, `value_and_grad(.., autocast=bf16)`,
//!   `graph.grad{autocast=bf16}`): the backward pass differentiates the casts, so each
//!   narrow op's adjoint is narrow and an f32 weight's gradient f32. Loss scaling
//!   (`GradOptions::scaled`, `scale=s`) seeds the reverse sweep with one more parameter,
//!   `__loss_scale`, instead of the constant 1. Invariant: the transformed function has
//!   the original's signature, so the caller sees no cast.

use std::collections::HashMap;

use dlc_core::scalar::{BinaryOp, UnaryOp};
use dlc_core::{DType, TensorType};

use crate::module::{Function, Value};
use crate::ops::Op;

/// How an op treats narrowed operands.
enum Policy {
    /// Computes in the narrow type.
    Narrow,
    /// Computes on its original operand types.
    Original,
    /// Narrow when its non-constant float operands all are.
    Follow,
}

fn policy(op: &Op) -> Policy {
    match op {
        Op::MatMul | Op::Conv2d { .. } => Policy::Narrow,
        Op::Reduce { .. }
        | Op::ScatterAdd { .. }
        | Op::Softmax { .. }
        | Op::LayerNorm { .. }
        | Op::BatchNorm { .. }
        | Op::Compute(_)
        | Op::Call { .. }
        | Op::Barrier
        | Op::Param { .. }
        | Op::Constant(_)
        | Op::Cast { .. }
        | Op::Binary(BinaryOp::Pow)
        | Op::Unary(
            UnaryOp::Exp | UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Reciprocal,
        ) => Policy::Original,
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Concat { .. }
        | Op::Slice { .. }
        | Op::Gather { .. }
        | Op::Broadcast { .. }
        | Op::Pool2d { .. } => Policy::Follow,
    }
}

/// `f` with its products computed in `narrow` (bf16 or f16) by the policy
/// above, named `name`. `f` keeps its parameters, weights and result types.
pub fn autocast(f: &Function, narrow: DType, name: &str) -> Result<Function, String> {
    if !matches!(narrow, DType::BF16 | DType::F16) {
        return Err(format!("autocast computes in bf16 or f16, not {narrow}"));
    }
    let mut g = Function::new(name, f.visibility);
    g.weights = f.weights.clone();
    let mut map: HashMap<Value, Value> = HashMap::new();
    for (pname, node) in &f.params {
        let v = g.add_param(pname.clone(), f.body[*node].results[0].clone());
        g.body[v.node].loc = f.body[*node].loc.clone();
        map.insert(Value::of(*node), v);
    }
    // Casts made so far, so that a value read narrow by several products is
    // cast once.
    let mut casts: HashMap<(Value, DType), Value> = HashMap::new();
    let mut cast = |g: &mut Function, v: Value, to: DType| -> Value {
        let ty = g.value_type(v);
        if ty.dtype == to {
            return v;
        }
        let ty = TensorType::new(to, ty.shape.clone());
        *casts
            .entry((v, to))
            .or_insert_with(|| g.add_op(Op::Cast { to }, &[v], ty))
    };
    for n in f.topo_order() {
        let node = &f.body[n];
        if matches!(node.op, Op::Param { .. }) {
            continue;
        }
        let old = f.operands(n);
        let narrowable = |v: &Value| f.value_type(*v).dtype == DType::F32;
        let operands: Vec<Value> = match policy(&node.op) {
            Policy::Narrow => old
                .iter()
                .map(|v| {
                    let now = map[v];
                    if narrowable(v) {
                        cast(&mut g, now, narrow)
                    } else {
                        now
                    }
                })
                .collect(),
            policy => {
                // The float operands that decide: all but constants.
                let mut strong = old.iter().filter(|v| {
                    f.value_type(**v).dtype.is_float()
                        && !matches!(f.body[v.node].op, Op::Constant(_))
                });
                let follow = matches!(policy, Policy::Follow)
                    && strong.clone().next().is_some()
                    && strong.all(|v| narrowable(v) && g.value_type(map[v]).dtype == narrow);
                old.iter()
                    .map(|v| {
                        let now = map[v];
                        let want = if follow && narrowable(v) {
                            narrow
                        } else {
                            f.value_type(*v).dtype
                        };
                        cast(&mut g, now, want)
                    })
                    .collect()
            }
        };
        let results = match &node.op {
            Op::Compute(_) | Op::Call { .. } | Op::Constant(_) => node.results.clone(),
            op => {
                let types: Vec<TensorType> =
                    operands.iter().map(|&v| g.value_type(v).clone()).collect();
                let refs: Vec<&TensorType> = types.iter().collect();
                crate::infer::infer(op, &refs)
                    .map_err(|e| format!("autocast of {}: {}", op.name(), e.message))?
            }
        };
        let m = g.add_node(node.op.clone(), &operands, results);
        g.body[m].loc = node.loc.clone();
        for r in 0..node.results.len() as u32 {
            map.insert(Value { node: n, result: r }, Value { node: m, result: r });
        }
    }
    g.results = f
        .results
        .iter()
        .map(|v| {
            let want = f.value_type(*v).dtype;
            cast(&mut g, map[v], want)
        })
        .collect();
    Ok(g)
}
