//! The derivative rule of every graph op, in one place: given the op's
//! operands, its result and the adjoint of its result, the adjoint of each
//! operand that needs one. Element-wise functions take their rules from
//! `dlc_core::scalar` ([`UnaryOp::derivative`], [`BinaryOp::partials`]),
//! which the derivation of user operators shares; convolutions and pooling
//! differentiate the user operator that computes them.
//!
//! # Convolutions and pooling
//!
//! - **Convolutions and pooling** differentiate as the user operators computing them
//!   (groups as an axis of their own). A strided window's input adjoint is that of the
//!   stride-1 window at the adjoint dilated with zeros (`rules.rs::dilate`): solving a
//!   strided index would leave every output position to sum over.

use dlc_core::TensorType;
use dlc_core::scalar::{BinaryOp, CmpOp, ReduceKind, UnaryOp};

use super::{Builder, Elem, ElemBuilder, compute};
use crate::compute::{Affine, ComputeBody, ElemDef, IndexVar, RangeVar, ScalarExpr, Source};
use crate::module::Value;
use crate::ops::{Op, PoolKind};

type Grads = Result<Vec<Option<Value>>, String>;

/// The adjoints of `op`'s operands `xs` given the adjoint `g` of its result
/// `out`; `None` where `needs` is false or the adjoint is zero.
pub(super) fn vjp(
    b: &mut Builder<'_>,
    op: &Op,
    xs: &[Value],
    out: Value,
    g: Value,
    needs: &[bool],
) -> Grads {
    let dtype = b.ty(out).dtype;
    let mut grads: Vec<Option<Value>> = vec![None; xs.len()];
    match op {
        Op::Param { .. } | Op::Constant(_) | Op::Compare(_) => {}
        Op::Call { .. } => return Err("calls are inlined before differentiation".into()),
        // The value passes; what it waited for gets nothing.
        Op::Barrier => grads[0] = Some(g),
        // Each read row's adjoint added where it was read from.
        Op::Gather { axis } if needs[0] => {
            let zeros = b.constant(0.0, b.ty(xs[0]));
            grads[0] = Some(b.op(Op::ScatterAdd { axis: *axis }, &[zeros, xs[1], g])?);
        }
        Op::Gather { .. } => {}
        Op::ScatterAdd { axis } => {
            grads[0] = Some(g);
            if needs[2] {
                grads[2] = Some(b.op(Op::Gather { axis: *axis }, &[g, xs[1]])?);
            }
        }
        Op::Unary(u) => {
            let d = u.derivative();
            let mut e = ElemBuilder { b, dtype };
            let d = d.build(
                &mut e,
                &[Elem::Tensor(xs[0]), Elem::Const(0.0), Elem::Tensor(out)],
            )?;
            let adj =
                dlc_core::scalar::FormulaBuilder::fold(&mut e, BinaryOp::Mul, Elem::Tensor(g), d)?;
            if let Elem::Tensor(v) = adj {
                grads[0] = Some(v);
            }
        }
        Op::Binary(op) => {
            let Some(partials) = op.partials() else {
                return Err(format!("{} is integer-only", op.name()));
            };
            for (i, p) in partials.iter().enumerate() {
                if !needs[i] {
                    continue;
                }
                let mut e = ElemBuilder { b, dtype };
                let leaves = [Elem::Tensor(xs[0]), Elem::Tensor(xs[1]), Elem::Tensor(out)];
                let d = p.build(&mut e, &leaves)?;
                let adj = dlc_core::scalar::FormulaBuilder::fold(
                    &mut e,
                    BinaryOp::Mul,
                    Elem::Tensor(g),
                    d,
                )?;
                if let Elem::Tensor(v) = adj {
                    let shape = b.ty(xs[i]).shape;
                    let v = b.broadcast(v, &b.ty(g).shape)?;
                    grads[i] = Some(b.sum_to(v, &shape)?);
                }
            }
        }
        Op::Select => {
            let zero = b.scalar(0.0, dtype);
            for i in 1..3 {
                if needs[i] {
                    let v = if i == 1 {
                        b.select(xs[0], g, zero)?
                    } else {
                        b.select(xs[0], zero, g)?
                    };
                    let shape = b.ty(xs[i]).shape;
                    grads[i] = Some(b.sum_to(v, &shape)?);
                }
            }
        }
        Op::Cast { .. } => {
            let from = b.ty(xs[0]).dtype;
            if from.is_float() {
                grads[0] = Some(b.op(Op::Cast { to: from }, &[g])?);
            }
        }
        Op::MatMul => return matmul(b, xs, g, needs),
        Op::Reduce {
            kind,
            axes,
            keepdims: _,
        } => grads[0] = Some(reduce(b, *kind, axes, xs[0], out, g)?),
        Op::Softmax { axis } => {
            // y (g - sum(g y))
            let gy = b.binary(BinaryOp::Mul, g, out)?;
            let s = b.reduce(ReduceKind::Sum, gy, &[*axis], true)?;
            let d = b.binary(BinaryOp::Sub, g, s)?;
            grads[0] = Some(b.binary(BinaryOp::Mul, out, d)?);
        }
        Op::LayerNorm { axes, eps } => {
            // r (g - mean(g) - y mean(g y)), r = 1 / sqrt(var + eps)
            let x = xs[0];
            let mu = b.reduce(ReduceKind::Mean, x, axes, true)?;
            let d = b.binary(BinaryOp::Sub, x, mu)?;
            let d2 = b.binary(BinaryOp::Mul, d, d)?;
            let var = b.reduce(ReduceKind::Mean, d2, axes, true)?;
            let e = b.scalar(*eps, dtype);
            let ve = b.binary(BinaryOp::Add, var, e)?;
            let r = b.unary(UnaryOp::Rsqrt, ve)?;
            let mg = b.reduce(ReduceKind::Mean, g, axes, true)?;
            let gy = b.binary(BinaryOp::Mul, g, out)?;
            let mgy = b.reduce(ReduceKind::Mean, gy, axes, true)?;
            let ymgy = b.binary(BinaryOp::Mul, out, mgy)?;
            let t = b.binary(BinaryOp::Sub, g, mg)?;
            let t = b.binary(BinaryOp::Sub, t, ymgy)?;
            grads[0] = Some(b.binary(BinaryOp::Mul, r, t)?);
        }
        Op::Reshape { .. } => {
            let shape = b.ty(xs[0]).shape;
            grads[0] = Some(b.reshape(g, &shape)?);
        }
        Op::Transpose { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            grads[0] = Some(b.op(Op::Transpose { perm: inverse }, &[g])?);
        }
        Op::Concat { axis } => {
            let mut start = 0;
            for (i, &x) in xs.iter().enumerate() {
                let len = b.ty(x).shape[*axis];
                if needs[i] {
                    grads[i] = Some(slice(b, g, *axis, start, start + len)?);
                }
                start += len;
            }
        }
        Op::Slice { axis, start, end } => {
            // The adjoint, with zeros where the slice cut.
            let t = b.ty(xs[0]);
            let mut parts = Vec::new();
            for (lo, hi) in [(0, *start), (*start, *end), (*end, t.shape[*axis])] {
                if lo == *start && hi == *end {
                    parts.push(g);
                } else if hi > lo {
                    let mut shape = t.shape.clone();
                    shape[*axis] = hi - lo;
                    parts.push(b.constant(0.0, TensorType::new(t.dtype, shape)));
                }
            }
            grads[0] = Some(b.op(Op::Concat { axis: *axis }, &parts)?);
        }
        Op::Broadcast { .. } => {
            let shape = b.ty(xs[0]).shape;
            grads[0] = Some(b.sum_to(g, &shape)?);
        }
        Op::Conv2d {
            stride,
            padding,
            groups,
            dilation,
        } => {
            let window = [*stride, *padding, *dilation];
            return conv2d(b, xs, out, g, needs, window, *groups);
        }
        Op::Pool2d {
            kind,
            kernel,
            stride,
            padding,
        } => grads[0] = Some(pool2d(b, *kind, *kernel, *stride, *padding, xs[0], out, g)?),
        Op::BatchNorm { eps } => return batchnorm(b, xs, g, needs, *eps),
        Op::Compute(body) => return compute::vjp(b, body, xs, Some(out), g, needs),
    }
    Ok(grads)
}

fn slice(
    b: &mut Builder<'_>,
    x: Value,
    axis: usize,
    start: usize,
    end: usize,
) -> Result<Value, String> {
    if start == 0 && end == b.ty(x).shape[axis] {
        return Ok(x);
    }
    b.op(Op::Slice { axis, start, end }, &[x])
}

/// The last two axes swapped.
fn swap_last(b: &mut Builder<'_>, x: Value) -> Result<Value, String> {
    let r = b.ty(x).rank();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    b.op(Op::Transpose { perm }, &[x])
}

/// `numpy.matmul`: `ga = g bᵀ`, `gb = aᵀ g`, on the operands promoted to
/// rank 2 and summed over the batch axes they were broadcast along.
fn matmul(b: &mut Builder<'_>, xs: &[Value], g: Value, needs: &[bool]) -> Grads {
    let (ta, tb) = (b.ty(xs[0]), b.ty(xs[1]));
    let a2 = if ta.rank() == 1 {
        b.reshape(xs[0], &[1, ta.shape[0]])?
    } else {
        xs[0]
    };
    let b2 = if tb.rank() == 1 {
        b.reshape(xs[1], &[tb.shape[0], 1])?
    } else {
        xs[1]
    };
    let full = crate::infer::matmul(&b.ty(a2), &b.ty(b2)).map_err(|e| e.message)?;
    let g2 = b.reshape(g, &full.shape)?;
    let mut grads = vec![None, None];
    if needs[0] {
        let bt = swap_last(b, b2)?;
        let ga = b.op(Op::MatMul, &[g2, bt])?;
        let ga = b.sum_to(ga, &b.ty(a2).shape)?;
        grads[0] = Some(b.reshape(ga, &ta.shape)?);
    }
    if needs[1] {
        let at = swap_last(b, a2)?;
        let gb = b.op(Op::MatMul, &[at, g2])?;
        let gb = b.sum_to(gb, &b.ty(b2).shape)?;
        grads[1] = Some(b.reshape(gb, &tb.shape)?);
    }
    Ok(grads)
}

/// Sum and mean spread the adjoint over the reduced axes; max and min
/// give it to the elements equal to the result, split evenly among ties
/// (as JAX does); prod gives each element the product of the others
/// (exactly, zeros included).
fn reduce(
    b: &mut Builder<'_>,
    kind: ReduceKind,
    axes: &[usize],
    x: Value,
    out: Value,
    g: Value,
) -> Result<Value, String> {
    let t = b.ty(x);
    let dtype = t.dtype;
    let mut kept = t.shape.clone();
    for &a in axes {
        kept[a] = 1;
    }
    let gk = b.reshape(g, &kept)?;
    let share = match kind {
        ReduceKind::Sum => gk,
        ReduceKind::Mean => {
            let count: usize = axes.iter().map(|&a| t.shape[a]).product();
            let c = b.scalar(1.0 / count as f64, dtype);
            b.binary(BinaryOp::Mul, gk, c)?
        }
        ReduceKind::Max | ReduceKind::Min => {
            let yk = b.reshape(out, &kept)?;
            let hit = b.compare(CmpOp::Eq, x, yk)?;
            let mask = b.op(Op::Cast { to: dtype }, &[hit])?;
            let count = b.reduce(ReduceKind::Sum, mask, axes, true)?;
            let each = b.binary(BinaryOp::Div, gk, count)?;
            b.binary(BinaryOp::Mul, mask, each)?
        }
        ReduceKind::Prod => {
            let zero = b.scalar(0.0, dtype);
            let one = b.scalar(1.0, dtype);
            let is_zero = b.compare(CmpOp::Eq, x, zero)?;
            let nonzero = b.select(is_zero, one, x)?;
            let others = b.reduce(ReduceKind::Prod, nonzero, axes, true)?;
            let zf = b.op(Op::Cast { to: dtype }, &[is_zero])?;
            let zeros = b.reduce(ReduceKind::Sum, zf, axes, true)?;
            // An element that is zero gets the product of the others when
            // it is the only zero; any other gets y / x when there is none.
            let one_zero = b.compare(CmpOp::Eq, zeros, one)?;
            let no_zero = b.compare(CmpOp::Eq, zeros, zero)?;
            let at_zero = b.select(one_zero, others, zero)?;
            let quotient = b.binary(BinaryOp::Div, others, nonzero)?;
            let elsewhere = b.select(no_zero, quotient, zero)?;
            let d = b.select(is_zero, at_zero, elsewhere)?;
            b.binary(BinaryOp::Mul, gk, d)?
        }
    };
    b.broadcast(share, &t.shape)
}

/// `y = (x - mean) r gamma + beta`, `r = 1 / sqrt(var + eps)`, every
/// statistic broadcast along axis 1.
fn batchnorm(b: &mut Builder<'_>, xs: &[Value], g: Value, needs: &[bool], eps: f64) -> Grads {
    let t = b.ty(xs[0]);
    let mut col = vec![1; t.rank()];
    col[1] = t.shape[1];
    let along: Vec<usize> = (0..t.rank()).filter(|&a| a != 1).collect();
    let [x, mean, var, gamma, _] = xs else {
        return Err("batchnorm takes five operands".into());
    };
    let mean = b.reshape(*mean, &col)?;
    let var = b.reshape(*var, &col)?;
    let gamma = b.reshape(*gamma, &col)?;
    let e = b.scalar(eps, t.dtype);
    let ve = b.binary(BinaryOp::Add, var, e)?;
    let r = b.unary(UnaryOp::Rsqrt, ve)?;
    let d = b.binary(BinaryOp::Sub, *x, mean)?;
    let rg = b.binary(BinaryOp::Mul, r, gamma)?;
    let channel = |b: &mut Builder<'_>, v: Value| -> Result<Value, String> {
        let s = b.reduce(ReduceKind::Sum, v, &along, false)?;
        b.reshape(s, &[t.shape[1]])
    };
    let mut grads = vec![None; 5];
    if needs[0] {
        grads[0] = Some(b.binary(BinaryOp::Mul, g, rg)?);
    }
    if needs[1] {
        let s = channel(b, g)?;
        let rg1 = b.reshape(rg, &[t.shape[1]])?;
        let m = b.binary(BinaryOp::Mul, s, rg1)?;
        grads[1] = Some(b.unary(UnaryOp::Neg, m)?);
    }
    if needs[2] {
        // d/dvar of r = -r^3 / 2
        let gd = b.binary(BinaryOp::Mul, g, d)?;
        let s = channel(b, gd)?;
        let r3 = b.binary(BinaryOp::Mul, r, r)?;
        let r3 = b.binary(BinaryOp::Mul, r3, rg)?;
        let half = b.scalar(-0.5, t.dtype);
        let k = b.binary(BinaryOp::Mul, r3, half)?;
        let k = b.reshape(k, &[t.shape[1]])?;
        grads[2] = Some(b.binary(BinaryOp::Mul, s, k)?);
    }
    if needs[3] {
        let dr = b.binary(BinaryOp::Mul, d, r)?;
        let gdr = b.binary(BinaryOp::Mul, g, dr)?;
        grads[3] = Some(channel(b, gdr)?);
    }
    if needs[4] {
        grads[4] = Some(channel(b, g)?);
    }
    Ok(grads)
}

fn var(i: u32) -> Affine {
    Affine::var(IndexVar(i))
}

/// `stride * out + dilation * tap - pad`: where output `out_var` reads tap
/// `tap` of a window `dilation` apart.
fn window(stride: usize, out_var: u32, (dilation, tap): (usize, u32), pad: usize) -> Affine {
    Affine {
        terms: vec![
            (stride as i64, IndexVar(out_var)),
            (dilation as i64, IndexVar(tap)),
        ],
        constant: -(pad as i64),
    }
}

fn range(v: u32, hi: usize) -> RangeVar {
    RangeVar {
        var: IndexVar(v),
        lo: 0,
        hi: hi as i64,
    }
}

fn read(i: u32, index: Vec<Affine>) -> ScalarExpr {
    ScalarExpr::Read {
        src: Source::Input(i),
        index,
    }
}

/// The adjoint `g` (N, C, OH, OW) of a window op of stride `stride` as
/// the adjoint of the same op at stride 1, whose output has spatial extents
/// `full`: `g[.., y, x]` at `[.., s0 y, s1 x]`, zero between. The input
/// adjoint of a strided window is then that of a stride-1 window, in which
/// each index solves for the output position; solving a strided index
/// instead leaves the output positions to sum over (quadratic work).
fn dilate(
    b: &mut Builder<'_>,
    g: Value,
    stride: [usize; 2],
    full: [usize; 2],
) -> Result<Value, String> {
    let t = b.ty(g);
    let (n, c, oh, ow) = (t.shape[0], t.shape[1], t.shape[2], t.shape[3]);
    let [s0, s1] = stride;
    let mut v = b.reshape(g, &[n, c, oh, 1, ow, 1])?;
    if s0 > 1 {
        let z = b.constant(0.0, TensorType::new(t.dtype, vec![n, c, oh, s0 - 1, ow, 1]));
        v = b.op(Op::Concat { axis: 3 }, &[v, z])?;
    }
    if s1 > 1 {
        let z = b.constant(
            0.0,
            TensorType::new(t.dtype, vec![n, c, oh, s0, ow, s1 - 1]),
        );
        v = b.op(Op::Concat { axis: 5 }, &[v, z])?;
    }
    let v = b.reshape(v, &[n, c, oh * s0, ow * s1])?;
    let v = slice(b, v, 2, 0, full[0])?;
    slice(b, v, 3, 0, full[1])
}

/// The spatial extents of a window op's output at stride 1.
fn full_extents(x: &TensorType, kernel: [usize; 2], padding: [usize; 2]) -> [usize; 2] {
    [0, 1].map(|a| x.shape[2 + a] + 2 * padding[a] + 1 - kernel[a])
}

/// A convolution differentiates as the user operator computing it: per
/// group, `out[n, g, o, y, x] = sum[c, ky, kx](x[n, g, c, s0 y + d0 ky -
/// p0, s1 x + d1 kx - p1] * w[g, o, c, ky, kx])` (without the group axis
/// when there is one group). The input adjoint of a strided convolution is
/// that of the stride-1 one at the dilated adjoint ([`dilate`]).
/// `[stride, padding, dilation]` are the window's.
fn conv2d(
    b: &mut Builder<'_>,
    xs: &[Value],
    out: Value,
    g: Value,
    needs: &[bool],
    [stride, padding, dilation]: [[usize; 2]; 3],
    groups: usize,
) -> Grads {
    let (tx, tw, to) = (b.ty(xs[0]), b.ty(xs[1]), b.ty(out));
    let (n, c, h, w) = (tx.shape[0], tx.shape[1], tx.shape[2], tx.shape[3]);
    let (o, kh, kw) = (tw.shape[0], tw.shape[2], tw.shape[3]);
    let (cg, og) = (c / groups, o / groups);
    let grouped = groups > 1;
    let (x_shape, w_shape) = if grouped {
        (vec![n, groups, cg, h, w], vec![groups, og, cg, kh, kw])
    } else {
        (tx.shape.clone(), tw.shape.clone())
    };
    let out_shape = |oh: usize, ow: usize| {
        if grouped {
            vec![n, groups, og, oh, ow]
        } else {
            vec![n, o, oh, ow]
        }
    };
    // Variables: n g o y x | c ky kx (g absent for one group).
    let body = |stride: [usize; 2], oh: usize, ow: usize| {
        let (vn, vg, vo, vy, vx, vc, vky, vkx) = (0, 1, 2, 3, 4, 5, 6, 7);
        let mut x_index = vec![var(vn)];
        let mut w_index = vec![];
        let mut out_vars = vec![IndexVar(vn)];
        if grouped {
            x_index.push(var(vg));
            w_index.push(var(vg));
            out_vars.push(IndexVar(vg));
        }
        x_index.extend([
            var(vc),
            window(stride[0], vy, (dilation[0], vky), padding[0]),
            window(stride[1], vx, (dilation[1], vkx), padding[1]),
        ]);
        w_index.extend([var(vo), var(vc), var(vky), var(vkx)]);
        out_vars.extend([IndexVar(vo), IndexVar(vy), IndexVar(vx)]);
        ComputeBody {
            name: "conv2d".into(),
            locals: vec![],
            out: ElemDef {
                vars: out_vars,
                ty: TensorType::new(to.dtype, out_shape(oh, ow)),
                expr: ScalarExpr::Reduce {
                    kind: ReduceKind::Sum,
                    vars: vec![range(vc, cg), range(vky, kh), range(vkx, kw)],
                    body: Box::new(ScalarExpr::Binary(
                        BinaryOp::Mul,
                        Box::new(read(0, x_index)),
                        Box::new(read(1, w_index)),
                    )),
                },
            },
        }
    };
    let xr = b.reshape(xs[0], &x_shape)?;
    let wr = b.reshape(xs[1], &w_shape)?;
    let (oh, ow) = (to.shape[2], to.shape[3]);
    let gr = b.reshape(g, &out_shape(oh, ow))?;
    let mut grads = vec![None, None];
    if stride != [1, 1] && needs[0] {
        // The window spans `dilation * (kernel - 1) + 1` positions.
        let span = [(kh, dilation[0]), (kw, dilation[1])].map(|(k, d)| d * (k - 1) + 1);
        let full = full_extents(&tx, span, padding);
        let gd = dilate(b, g, stride, full)?;
        let gd = b.reshape(gd, &out_shape(full[0], full[1]))?;
        let dense = body([1, 1], full[0], full[1]);
        grads[0] = compute::vjp(b, &dense, &[xr, wr], None, gd, &[true, false])?[0];
    }
    let rest = [needs[0] && grads[0].is_none(), needs[1]];
    let strided = compute::vjp(b, &body(stride, oh, ow), &[xr, wr], None, gr, &rest)?;
    for (i, v) in strided.into_iter().enumerate() {
        if rest[i] {
            grads[i] = v;
        }
    }
    let shapes = [tx.shape, tw.shape];
    grads
        .into_iter()
        .zip(shapes)
        .map(|(gr, shape)| gr.map(|v| b.reshape(v, &shape)).transpose())
        .collect()
}

/// Pooling differentiates as the user operator computing it: average
/// pooling `sum[ky, kx](x[n, c, s0 y + ky - p0, ..] / (kh kw))` (padding
/// counted); max pooling `max[ky, kx](where(inside[..] != 0, x[..], -inf))`
/// with `inside` ones over the image, so that padding never wins and ties
/// among the window's elements split the adjoint. A strided window's
/// adjoint is that of the stride-1 window at the dilated adjoint
/// ([`dilate`]): the stride-1 pooling at every `s`-th position is the
/// strided one.
#[allow(clippy::too_many_arguments)]
fn pool2d(
    b: &mut Builder<'_>,
    kind: PoolKind,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    x: Value,
    out: Value,
    g: Value,
) -> Result<Value, String> {
    let tx = b.ty(x);
    let full = full_extents(&tx, kernel, padding);
    let (g, out, oh, ow) = if stride == [1, 1] {
        (g, Some(out), full[0], full[1])
    } else {
        (dilate(b, g, stride, full)?, None, full[0], full[1])
    };
    let (vn, vc, vy, vx, vky, vkx) = (0, 1, 2, 3, 4, 5);
    let rows = window(1, vy, (1, vky), padding[0]);
    let cols = window(1, vx, (1, vkx), padding[1]);
    let at = read(0, vec![var(vn), var(vc), rows.clone(), cols.clone()]);
    let (kind, elem, inputs) = match kind {
        PoolKind::Avg => {
            let area = (kernel[0] * kernel[1]) as f64;
            let e = ScalarExpr::Binary(
                BinaryOp::Div,
                Box::new(at),
                Box::new(ScalarExpr::Const(area)),
            );
            (ReduceKind::Sum, e, vec![x])
        }
        PoolKind::Max => {
            let inside = b.constant(1.0, TensorType::new(tx.dtype, tx.shape[2..].to_vec()));
            let cond = ScalarExpr::Compare(
                CmpOp::Ne,
                Box::new(read(1, vec![rows, cols])),
                Box::new(ScalarExpr::Const(0.0)),
            );
            let e = ScalarExpr::Select(
                Box::new(cond),
                Box::new(at),
                Box::new(ScalarExpr::Const(f64::NEG_INFINITY)),
            );
            (ReduceKind::Max, e, vec![x, inside])
        }
    };
    let body = ComputeBody {
        name: "pool2d".into(),
        locals: vec![],
        out: ElemDef {
            vars: [vn, vc, vy, vx].map(IndexVar).to_vec(),
            ty: TensorType::new(tx.dtype, vec![tx.shape[0], tx.shape[1], oh, ow]),
            expr: ScalarExpr::Reduce {
                kind,
                vars: vec![range(vky, kernel[0]), range(vkx, kernel[1])],
                body: Box::new(elem),
            },
        },
    };
    let needs: Vec<bool> = (0..inputs.len()).map(|i| i == 0).collect();
    let grads = compute::vjp(b, &body, &inputs, out, g, &needs)?;
    match grads.into_iter().next().flatten() {
        Some(v) => Ok(v),
        None => Ok(b.constant(0.0, tx)),
    }
}
