use dlc_core::{Pass, PassError, SourceLoc, TensorType};
use petgraph::stable_graph::NodeIndex;

use super::dce::remove_dead_nodes;
use crate::compute::{ComputeBody, ElemDef, Factored};
use crate::interp::{FOLD_WORK_LIMIT, Tensor, eval_op, op_work};
use crate::module::{Function, Module, Value};
use crate::ops::{BinaryOp, ConstValue, Op, UnaryOp};

/// `graph.canonicalize`: folds constants, applies algebraic identities,
/// makes a user operator that computes a built-in op that op
/// ([`crate::compute::ComputeBody::as_conv2d`]) and contracts a sum of
/// three or more factors a pair first ([`crate::compute::ComputeBody::factored`])
/// until nothing changes (or `max_iterations` sweeps); then user operators
/// sharing an element-wise operand read it from one operator, and what
/// became dead is removed. Identities treat `-0.0` and `0.0` as equal (`x +
/// 0 -> x`).
pub struct Canonicalize {
    /// Upper bound on sweeps over each function.
    pub max_iterations: u32,
}

/// Constants larger than this many elements are not folded, so folding never
/// bloats the IR with huge dense literals.
pub const FOLD_LIMIT: usize = 4096;

fn splat(f: &Function, v: Value) -> Option<f64> {
    match &f.body[v.node].op {
        Op::Constant(ConstValue::Splat(x)) => Some(*x),
        Op::Constant(ConstValue::Dense(xs)) => {
            let first = *xs.first()?;
            xs.iter()
                .all(|x| x.to_bits() == first.to_bits())
                .then_some(first)
        }
        _ => None,
    }
}

fn const_tensor(f: &Function, v: Value) -> Option<Tensor> {
    let n = &f.body[v.node];
    match &n.op {
        Op::Constant(value) => Tensor::from_const(value, &n.results[0]).ok(),
        _ => None,
    }
}

fn try_fold(f: &Function, node: NodeIndex) -> Option<Op> {
    let n = &f.body[node];
    if matches!(n.op, Op::Param { .. } | Op::Constant(_) | Op::Call { .. }) || n.results.len() != 1
    {
        return None;
    }
    if n.results[0].num_elements()? > FOLD_LIMIT {
        return None;
    }
    // Operands are materialized to fold; a small result of a huge constant
    // (the sum of a splat) is not worth that memory.
    if f.operands(node).iter().any(|v| {
        f.value_type(*v)
            .num_elements()
            .is_none_or(|e| e > FOLD_LIMIT)
    }) {
        return None;
    }
    // Folding runs the interpreter at compile time: only cheap ops.
    let types: Vec<&TensorType> = f.operands(node).iter().map(|v| f.value_type(*v)).collect();
    if op_work(&n.op, &types, &n.results) > FOLD_WORK_LIMIT {
        return None;
    }
    let inputs: Vec<Tensor> = f
        .operands(node)
        .into_iter()
        .map(|v| const_tensor(f, v))
        .collect::<Option<_>>()?;
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let out = eval_op(&n.op, &refs, &n.results).ok()?.pop()?;
    Some(Op::Constant(out.to_const()))
}

/// What a node simplifies to: an existing value, or a new op on operands.
enum Rewrite {
    Use(Value),
    New(Op, Vec<Value>),
    /// A user operator whose product became an operator of its own
    /// (`ComputeBody::factored`): the product on `operands` (an identical
    /// one already in the function is reused), then `rest` on
    /// `rest_operands` and the product.
    Hoisted {
        product: Box<ComputeBody>,
        operands: Vec<Value>,
        rest: Box<ComputeBody>,
        rest_operands: Vec<Option<Value>>,
    },
    /// `a @ b` for `a: [.., 1, K]` and `b: [K, N]`: a batch of
    /// vector-matrix products sharing the matrix, as one matrix product
    /// `reshape(a, [rows, K]) @ b` reshaped back (the matrix read once, not
    /// once per vector: PyTorch's exported attention projects `[seq, 1, d]`).
    Rows {
        a: Value,
        b: Value,
        rows: usize,
    },
    /// A convolution of `x` by `w` whose outer taps read only padding:
    /// `conv` (its trimmed padding and dilation) by `w`'s taps `taps[axis]`
    /// along the kernel's rows and columns ([`trimmed_taps`]).
    Trimmed {
        conv: Op,
        x: Value,
        w: Value,
        taps: [(usize, usize); 2],
    },
    /// A convolution of `x` by `w` split into the regions of its output
    /// that meet the image through the same taps ([`tap_regions`]): each a
    /// convolution without padding of the slice of `x` it reads, by those
    /// taps of `w`, the regions concatenated back.
    Regions {
        x: Value,
        w: Value,
        runs: [Vec<TapRun>; 2],
    },
}

/// Outputs `[out.0, out.1)` along one axis of a convolution, which all
/// meet its image through the taps `[taps.0, taps.1)` (the others read
/// padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TapRun {
    pub out: (usize, usize),
    pub taps: (usize, usize),
}

/// Along one axis of a convolution (an image `size` long, `k` taps, `o`
/// outputs; stride `s`, dilation `d`, padding `p`), the runs of outputs
/// that meet the image through the same taps, in order; `None` where an
/// output meets it through none.
fn tap_runs(size: i64, k: i64, o: i64, s: i64, d: i64, p: i64) -> Option<Vec<TapRun>> {
    let mut runs: Vec<TapRun> = Vec::new();
    for i in 0..o {
        // Output `i`'s tap `t` reads `s i + d t - p`.
        let meets = |t: i64| (0..size).contains(&(s * i + d * t - p));
        let lo = (0..k).find(|&t| meets(t))?;
        let hi = (0..k).rev().find(|&t| meets(t))? + 1;
        let taps = (lo as usize, hi as usize);
        match runs.last_mut() {
            Some(run) if run.taps == taps => run.out.1 += 1,
            _ => runs.push(TapRun {
                out: (i as usize, i as usize + 1),
                taps,
            }),
        }
    }
    Some(runs)
}

/// For a convolution whose window mostly reads padding (DeepLabV3's 3 x 3
/// window 12 apart over a 14 x 14 image: the interior outputs meet the
/// image through the middle tap alone, the edges through two taps, the
/// corners through four; a fifth of the window's multiply-adds), the runs
/// of outputs along its rows and its columns ([`TapRun`]): each pair of a
/// row run and a column run is a region of the output, a convolution
/// without padding of the slice of the image it reads by the taps it
/// meets. `None` unless more than half the multiply-adds read padding,
/// with at most three runs along each axis (a border, an interior and a
/// border: more would be many small products, each reading its own slice
/// of the weights), and more than one region.
pub fn tap_regions(op: &Op, x: &TensorType, w: &TensorType) -> Option<[Vec<TapRun>; 2]> {
    let Op::Conv2d {
        stride,
        padding,
        dilation,
        ..
    } = *op
    else {
        return None;
    };
    let out = crate::infer::infer(op, &[x, w]).ok()?.pop()?;
    let mut runs = [Vec::new(), Vec::new()];
    let (mut met, mut all) = (1, 1);
    for a in 0..2 {
        let k = w.shape[2 + a];
        runs[a] = tap_runs(
            x.shape[2 + a] as i64,
            k as i64,
            out.shape[2 + a] as i64,
            stride[a] as i64,
            dilation[a] as i64,
            padding[a] as i64,
        )?;
        if runs[a].len() > 3 {
            return None;
        }
        met *= runs[a]
            .iter()
            .map(|r| (r.out.1 - r.out.0) * (r.taps.1 - r.taps.0))
            .sum::<usize>();
        all *= out.shape[2 + a] * k;
    }
    (runs[0].len() * runs[1].len() > 1 && 2 * met <= all).then_some(runs)
}

/// `v[.., start..end, ..]` along `axis`, or `v` where that is all of it.
fn sliced(
    f: &mut Function,
    v: Value,
    axis: usize,
    (start, end): (usize, usize),
    loc: &Option<SourceLoc>,
) -> Value {
    let mut t = f.value_type(v).clone();
    if (start, end) == (0, t.shape[axis]) {
        return v;
    }
    t.shape[axis] = end - start;
    let s = f.add_op(Op::Slice { axis, start, end }, &[v], t);
    f.body[s.node].loc = loc.clone();
    s
}

/// For a convolution whose outer taps along some axis read only its
/// padding from every output (ASPP's 3 x 3 windows 24 and 36 apart over a
/// 14 x 14 image: only the middle tap meets the image), the convolution by
/// the taps that meet it, `[start, end)` along each axis of the kernel,
/// with the padding that keeps its outputs where they were; `None` where
/// every tap meets the input, or where the taps that do not are not as
/// many on both sides (a symmetric padding could not keep the outputs).
/// Along an axis left one tap wide the dilation is 1, so a window left 1 x 1
/// is a 1 x 1 convolution (a product reading its input in place).
pub fn trimmed_taps(op: &Op, x: &TensorType, w: &TensorType) -> Option<(Op, [(usize, usize); 2])> {
    let Op::Conv2d {
        stride,
        padding,
        groups,
        dilation,
    } = *op
    else {
        return None;
    };
    let out = crate::infer::infer(op, &[x, w]).ok()?.pop()?;
    let mut taps = [(0, 0); 2];
    let (mut new_padding, mut new_dilation) = (padding, dilation);
    for a in 0..2 {
        let (size, k, o) = (
            x.shape[2 + a] as i64,
            w.shape[2 + a] as i64,
            out.shape[2 + a] as i64,
        );
        let (s, d, p) = (stride[a] as i64, dilation[a] as i64, padding[a] as i64);
        // Tap `t` reads `d t - p` up to `s (o - 1) + d t - p`.
        let meets = |t: i64| d * t - p < size && s * (o - 1) + d * t - p >= 0;
        let lo = (0..k).find(|&t| meets(t))?;
        let hi = (0..k).rev().find(|&t| meets(t))? + 1;
        if lo != k - hi || d * lo > p {
            return None;
        }
        taps[a] = (lo as usize, hi as usize);
        new_padding[a] = (p - d * lo) as usize;
        if hi - lo == 1 {
            new_dilation[a] = 1;
        }
    }
    if taps == [(0, w.shape[2]), (0, w.shape[3])] {
        return None;
    }
    let trimmed = Op::Conv2d {
        stride,
        padding: new_padding,
        groups,
        dilation: new_dilation,
    };
    let mut kernel = w.clone();
    for (a, (start, end)) in taps.iter().enumerate() {
        kernel.shape[2 + a] = end - start;
    }
    let same = crate::infer::infer(&trimmed, &[x, &kernel]).ok()? == [out];
    same.then_some((trimmed, taps))
}

fn simplify(f: &Function, node: NodeIndex) -> Option<Rewrite> {
    let n = &f.body[node];
    let ty: &TensorType = n.results.first()?;
    let ops = f.operands(node);
    let same_type = |v: Value| f.value_type(v) == ty;
    let is = |v: Value, c: f64| splat(f, v) == Some(c);
    let producer = |v: Value| &f.body[v.node].op;
    match &n.op {
        Op::Binary(b) => {
            let (x, y) = (ops[0], ops[1]);
            let keep_x = match b {
                BinaryOp::Add => is(y, 0.0),
                BinaryOp::Sub => is(y, 0.0),
                BinaryOp::Mul | BinaryOp::Div => is(y, 1.0),
                _ => false,
            };
            let keep_y = match b {
                BinaryOp::Add => is(x, 0.0),
                BinaryOp::Mul => is(x, 1.0),
                _ => false,
            };
            if keep_x && same_type(x) {
                Some(Rewrite::Use(x))
            } else if keep_y && same_type(y) {
                Some(Rewrite::Use(y))
            } else {
                None
            }
        }
        Op::Unary(UnaryOp::Neg) => match producer(ops[0]) {
            Op::Unary(UnaryOp::Neg) => Some(Rewrite::Use(f.operands(ops[0].node)[0])),
            _ => None,
        },
        Op::Transpose { perm } => {
            if perm.iter().enumerate().all(|(i, &p)| i == p) {
                return Some(Rewrite::Use(ops[0]));
            }
            // Moving only axes of extent 1 keeps the elements' order: a
            // reshape, which is a view.
            let src = &f.value_type(ops[0]).shape;
            let moved: Vec<usize> = perm.iter().copied().filter(|&p| src[p] != 1).collect();
            if moved.is_sorted() {
                return Some(Rewrite::New(
                    Op::Reshape {
                        shape: ty.shape.clone(),
                    },
                    vec![ops[0]],
                ));
            }
            match producer(ops[0]) {
                Op::Transpose { perm: inner } => {
                    let composed: Vec<usize> = perm.iter().map(|&p| inner[p]).collect();
                    let x = f.operands(ops[0].node)[0];
                    if composed.iter().enumerate().all(|(i, &p)| i == p) {
                        Some(Rewrite::Use(x))
                    } else {
                        Some(Rewrite::New(Op::Transpose { perm: composed }, vec![x]))
                    }
                }
                _ => None,
            }
        }
        Op::MatMul => {
            let (ta, tb) = (f.value_type(ops[0]), f.value_type(ops[1]));
            let r = ta.rank();
            let rows: usize = ta.shape[..r.saturating_sub(2)].iter().product();
            (r >= 3 && tb.rank() == 2 && ta.shape[r - 2] == 1 && rows > 1).then_some(
                Rewrite::Rows {
                    a: ops[0],
                    b: ops[1],
                    rows,
                },
            )
        }
        Op::Reshape { shape } => {
            if same_type(ops[0]) {
                return Some(Rewrite::Use(ops[0]));
            }
            match producer(ops[0]) {
                Op::Reshape { .. } => {
                    let x = f.operands(ops[0].node)[0];
                    if f.value_type(x) == ty {
                        Some(Rewrite::Use(x))
                    } else {
                        Some(Rewrite::New(
                            Op::Reshape {
                                shape: shape.clone(),
                            },
                            vec![x],
                        ))
                    }
                }
                _ => None,
            }
        }
        Op::Broadcast { .. } | Op::Cast { .. } | Op::Slice { .. } | Op::Concat { .. }
            if ops.len() == 1 && same_type(ops[0]) =>
        {
            Some(Rewrite::Use(ops[0]))
        }
        Op::Reduce { axes, .. } if axes.is_empty() && same_type(ops[0]) => {
            Some(Rewrite::Use(ops[0]))
        }
        Op::Conv2d { .. } => {
            let (x, w) = (ops[0], ops[1]);
            let (xt, wt) = (f.value_type(x), f.value_type(w));
            if let Some((conv, taps)) = trimmed_taps(&n.op, xt, wt) {
                return Some(Rewrite::Trimmed { conv, x, w, taps });
            }
            let runs = tap_regions(&n.op, xt, wt)?;
            Some(Rewrite::Regions { x, w, runs })
        }
        // A user operator that is a built-in one (a convolution written in
        // index notation) becomes it.
        Op::Compute(body) => {
            let types: Vec<&TensorType> = ops.iter().map(|v| f.value_type(*v)).collect();
            if let Some((op, [x, w])) = body.as_conv2d(&types) {
                return Some(Rewrite::New(op, vec![ops[x], ops[w]]));
            }
            // A sum of three or more factors: two contracted first, into a
            // local or an operator of their own.
            match body.factored(&types)? {
                Factored::Local(body) => {
                    Some(Rewrite::New(Op::Compute(Box::new(body)), ops.to_vec()))
                }
                Factored::Hoisted {
                    product,
                    operands,
                    rest,
                    rest_operands,
                } => Some(Rewrite::Hoisted {
                    product: Box::new(product),
                    operands: operands.iter().map(|&i| ops[i as usize]).collect(),
                    rest: Box::new(rest),
                    rest_operands: rest_operands
                        .iter()
                        .map(|i| i.map(|i| ops[i as usize]))
                        .collect(),
                }),
            }
        }
        _ => None,
    }
}

/// `parts` concatenated along `axis` (the one part itself where there is one).
fn joined(f: &mut Function, parts: Vec<Value>, axis: usize, loc: &Option<SourceLoc>) -> Value {
    if let [one] = parts[..] {
        return one;
    }
    let mut t = f.value_type(parts[0]).clone();
    t.shape[axis] = parts.iter().map(|&p| f.value_type(p).shape[axis]).sum();
    let v = f.add_op(Op::Concat { axis }, &parts, t);
    f.body[v.node].loc = loc.clone();
    v
}

fn canonicalize_function(f: &mut Function, max_iterations: u32) -> (u64, u64) {
    let (mut folded, mut simplified) = (0, 0);
    for _ in 0..max_iterations {
        let mut changed = false;
        for node in f.topo_order() {
            if !f.body.contains_node(node)
                || f.users(node).is_empty() && !f.results.iter().any(|r| r.node == node)
            {
                continue;
            }
            if let Some(op) = try_fold(f, node) {
                let ty = f.body[node].results.clone();
                let new = f.add_node(op, &[], ty);
                f.replace_all_uses(Value::of(node), Value::of(new));
                folded += 1;
                changed = true;
                continue;
            }
            if let Some(rw) = simplify(f, node) {
                let to = match rw {
                    Rewrite::Use(v) => v,
                    Rewrite::New(op, operands) => {
                        let ty = f.body[node].results.clone();
                        let loc = f.body[node].loc.clone();
                        let new = f.add_node(op, &operands, ty);
                        f.body[new].loc = loc;
                        Value::of(new)
                    }
                    Rewrite::Hoisted {
                        product,
                        operands,
                        rest,
                        rest_operands,
                    } => {
                        let loc = f.body[node].loc.clone();
                        let ty = product.out.ty.clone();
                        let same = f.body.node_indices().find(|&m| {
                            matches!(&f.body[m].op, Op::Compute(b) if b.same_as(&product))
                                && f.operands(m) == operands
                                && f.body[m].results == [ty.clone()]
                        });
                        let product = match same {
                            Some(m) => Value::of(m),
                            None => {
                                let p = f.add_op(Op::Compute(product), &operands, ty);
                                f.body[p.node].loc = loc.clone();
                                p
                            }
                        };
                        let rest_operands: Vec<Value> =
                            rest_operands.iter().map(|v| v.unwrap_or(product)).collect();
                        let ty = f.body[node].results.clone();
                        let new = f.add_node(Op::Compute(rest), &rest_operands, ty);
                        f.body[new].loc = loc;
                        Value::of(new)
                    }
                    Rewrite::Rows { a, b, rows } => {
                        let ty = f.body[node].results[0].clone();
                        let loc = f.body[node].loc.clone();
                        let (k, n) = (f.value_type(b).shape[0], f.value_type(b).shape[1]);
                        let d = ty.dtype;
                        let flat = f.add_op(
                            Op::Reshape {
                                shape: vec![rows, k],
                            },
                            &[a],
                            TensorType::new(f.value_type(a).dtype, vec![rows, k]),
                        );
                        let product =
                            f.add_op(Op::MatMul, &[flat, b], TensorType::new(d, vec![rows, n]));
                        let back = f.add_op(
                            Op::Reshape {
                                shape: ty.shape.clone(),
                            },
                            &[product],
                            ty,
                        );
                        for v in [flat, product, back] {
                            f.body[v.node].loc = loc.clone();
                        }
                        back
                    }
                    Rewrite::Trimmed { conv, x, w, taps } => {
                        let loc = f.body[node].loc.clone();
                        let mut kernel = w;
                        for (a, taps) in taps.into_iter().enumerate() {
                            kernel = sliced(f, kernel, 2 + a, taps, &loc);
                        }
                        let ty = f.body[node].results.clone();
                        let new = f.add_node(conv, &[x, kernel], ty);
                        f.body[new].loc = loc;
                        Value::of(new)
                    }
                    Rewrite::Regions { x, w, runs } => {
                        let loc = f.body[node].loc.clone();
                        let ty = f.body[node].results[0].clone();
                        let Op::Conv2d {
                            stride,
                            padding,
                            groups,
                            dilation,
                        } = f.body[node].op
                        else {
                            unreachable!("regions of a convolution")
                        };
                        // The first index of the image that output `run.out.0`'s
                        // tap `run.taps.0` reads along `a`, and one past the last.
                        let read = |a: usize, run: &TapRun| {
                            let (s, d, p) = (stride[a], dilation[a], padding[a]);
                            let first = s * run.out.0 + d * run.taps.0 - p;
                            (first, s * (run.out.1 - 1) + d * (run.taps.1 - 1) - p + 1)
                        };
                        let mut bands = Vec::new();
                        for row in &runs[0] {
                            let (x_rows, w_rows) = (
                                sliced(f, x, 2, read(0, row), &loc),
                                sliced(f, w, 2, row.taps, &loc),
                            );
                            let mut pieces = Vec::new();
                            for col in &runs[1] {
                                let input = sliced(f, x_rows, 3, read(1, col), &loc);
                                let kernel = sliced(f, w_rows, 3, col.taps, &loc);
                                let mut dilation = dilation;
                                for (a, run) in [row, col].into_iter().enumerate() {
                                    if run.taps.1 - run.taps.0 == 1 {
                                        dilation[a] = 1;
                                    }
                                }
                                let conv = Op::Conv2d {
                                    stride,
                                    padding: [0, 0],
                                    groups,
                                    dilation,
                                };
                                let mut t = ty.clone();
                                t.shape[2] = row.out.1 - row.out.0;
                                t.shape[3] = col.out.1 - col.out.0;
                                let piece = f.add_op(conv, &[input, kernel], t);
                                f.body[piece.node].loc = loc.clone();
                                pieces.push(piece);
                            }
                            bands.push(joined(f, pieces, 3, &loc));
                        }
                        joined(f, bands, 2, &loc)
                    }
                };
                f.replace_all_uses(Value::of(node), to);
                simplified += 1;
                changed = true;
            }
        }
        remove_dead_nodes(f);
        if !changed {
            break;
        }
    }
    let shared = share_elementwise_operands(f);
    if shared > 0 {
        remove_dead_nodes(f);
    }
    (folded, simplified + shared)
}

/// User operators with the same element-wise operand of their sums
/// (`ComputeBody::elementwise_operand`, over the same values) read it from
/// one operator computing it: a gated aggregation's gate, `a[i, j] *
/// sigmoid(s[i] + t[j])`, is computed once for the forward pass and its
/// gradient, not once in each. Returns how many operators now read a shared operand.
fn share_elementwise_operands(f: &mut Function) -> u64 {
    let operand = |f: &Function, node: NodeIndex| -> Option<(ElemDef, Vec<Value>)> {
        let Op::Compute(body) = &f.body[node].op else {
            return None;
        };
        let ops = f.operands(node);
        let types: Vec<&TensorType> = ops.iter().map(|v| f.value_type(*v)).collect();
        let e = body.elementwise_operand(&types)?;
        let values = e.operands.iter().map(|&i| ops[i as usize]).collect();
        Some((e.def, values))
    };
    let found: Vec<(NodeIndex, ElemDef, Vec<Value>)> = f
        .topo_order()
        .into_iter()
        .filter_map(|n| operand(f, n).map(|(d, v)| (n, d, v)))
        .collect();
    let mut shared = 0;
    let mut done = vec![false; found.len()];
    for i in 0..found.len() {
        let group: Vec<usize> = (i..found.len())
            .filter(|&j| !done[j] && found[j].1 == found[i].1 && found[j].2 == found[i].2)
            .collect();
        if group.len() < 2 {
            continue;
        }
        let (first, def, values) = &found[i];
        let Op::Compute(body) = &f.body[*first].op else {
            continue;
        };
        let loc = f.body[*first].loc.clone();
        let once = ComputeBody {
            name: body.name.clone(),
            locals: Vec::new(),
            out: def.clone(),
        };
        let ty = def.ty.clone();
        let g = f.add_op(Op::Compute(Box::new(once)), values, ty);
        f.body[g.node].loc = loc;
        for j in group {
            done[j] = true;
            let node = found[j].0;
            let Op::Compute(body) = &f.body[node].op else {
                continue;
            };
            let mut ops = f.operands(node);
            let types: Vec<&TensorType> = ops.iter().map(|v| f.value_type(*v)).collect();
            let Some(e) = body.elementwise_operand(&types) else {
                continue;
            };
            let (rest, read) = body
                .reading_operand(&e, ops.len() as u32)
                .reading_only_what_it_reads();
            ops.push(g);
            let ops: Vec<Value> = read.iter().map(|&r| ops[r as usize]).collect();
            let (ty, loc) = (f.body[node].results.clone(), f.body[node].loc.clone());
            let new = f.add_node(Op::Compute(Box::new(rest)), &ops, ty);
            f.body[new].loc = loc;
            f.replace_all_uses(Value::of(node), Value::of(new));
            shared += 1;
        }
    }
    shared
}

impl Pass<Module> for Canonicalize {
    fn name(&self) -> &'static str {
        "graph.canonicalize"
    }

    fn run(&mut self, m: &mut Module) -> Result<Vec<(&'static str, u64)>, PassError> {
        let (mut folded, mut simplified) = (0, 0);
        for f in &mut m.functions {
            let (a, b) = canonicalize_function(f, self.max_iterations);
            folded += a;
            simplified += b;
        }
        Ok(vec![
            ("constants folded", folded),
            ("identities applied", simplified),
        ])
    }
}
