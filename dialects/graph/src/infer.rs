//! Result types of graph ops from their operand types. The front end calls
//! this to type what it builds (attaching source spans to the errors) and the
//! verifier calls it to check what it reads, so the rules live in one place.

use dlc_core::{DType, TensorType};

use crate::ops::{Op, ReduceKind};

/// Why an op cannot be applied to its operands: a sentence, and a short
/// label to put under the offending source span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InferError {
    /// The main message.
    pub message: String,
    /// A short detail (`1024 vs 512`); may be empty.
    pub label: String,
}

impl InferError {
    fn new(message: impl Into<String>, label: impl Into<String>) -> Self {
        InferError {
            message: message.into(),
            label: label.into(),
        }
    }
}

type Result<T> = std::result::Result<T, InferError>;

fn fmt_types(types: &[&TensorType]) -> String {
    types
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// NumPy broadcasting of several shapes.
pub fn broadcast_shapes(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(out)
}

fn same_dtype(what: &str, types: &[&TensorType]) -> Result<DType> {
    let d = types[0].dtype;
    if let Some(t) = types.iter().find(|t| t.dtype != d) {
        return Err(InferError::new(
            format!("{what}: operand element types differ: {}", fmt_types(types)),
            format!("{d} vs {}", t.dtype),
        ));
    }
    Ok(d)
}

fn broadcast(what: &str, types: &[&TensorType]) -> Result<Vec<usize>> {
    let shapes: Vec<&[usize]> = types.iter().map(|t| t.shape.as_slice()).collect();
    broadcast_shapes(&shapes).ok_or_else(|| {
        InferError::new(
            format!("{what}: shapes do not broadcast: {}", fmt_types(types)),
            "incompatible shapes",
        )
    })
}

fn need_float(what: &str, t: &TensorType) -> Result<()> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(InferError::new(
            format!("{what} needs a floating-point operand, got {t}"),
            format!("{} is not a float type", t.dtype),
        ))
    }
}

fn need_int(what: &str, t: &TensorType) -> Result<()> {
    if t.dtype.is_int() {
        Ok(())
    } else {
        Err(InferError::new(
            format!("{what} needs an integer operand, got {t}"),
            format!("{} is not an integer type", t.dtype),
        ))
    }
}

fn need_numeric(what: &str, t: &TensorType) -> Result<()> {
    if t.dtype.is_numeric() {
        Ok(())
    } else {
        Err(InferError::new(
            format!("{what} needs a numeric operand, got {t}"),
            "bool has no arithmetic",
        ))
    }
}

fn need_rank(what: &str, t: &TensorType, rank: usize) -> Result<()> {
    if t.rank() == rank {
        Ok(())
    } else {
        Err(InferError::new(
            format!("{what} needs a rank-{rank} operand, got {t}"),
            format!("rank {}", t.rank()),
        ))
    }
}

/// Checks that `scatter_add(t, ind, upd)` along `axis` has updates shaped
/// as `gather(t, ind)` would be, of `t`'s type.
fn scattered(
    what: &str,
    t: &TensorType,
    ind: &TensorType,
    upd: &TensorType,
    axis: usize,
) -> Result<()> {
    let shape = gathered_shape(what, t, ind, axis)?;
    if upd.dtype != t.dtype || upd.shape != shape {
        return Err(InferError::new(
            format!(
                "{what} of {t} at indices {ind} takes updates {}, got {upd}",
                TensorType::new(t.dtype, shape)
            ),
            "updates do not fit",
        ));
    }
    Ok(())
}

/// The shape of `gather(t, ind)` along `axis` (and of the updates a
/// `scatter_add` at `ind` takes): `t`'s axes before `axis`, the indices'
/// axes, `t`'s axes after it.
fn gathered_shape(what: &str, t: &TensorType, ind: &TensorType, axis: usize) -> Result<Vec<usize>> {
    check_axes(what, t, &[axis])?;
    if !ind.dtype.is_int() {
        return Err(InferError::new(
            format!("{what} takes integer indices, got {ind}"),
            "not integers",
        ));
    }
    let mut shape = t.shape[..axis].to_vec();
    shape.extend(&ind.shape);
    shape.extend(&t.shape[axis + 1..]);
    Ok(shape)
}

fn check_axes(what: &str, t: &TensorType, axes: &[usize]) -> Result<()> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= t.rank() {
            return Err(InferError::new(
                format!(
                    "{what}: axis {a} is out of range for {t} (rank {})",
                    t.rank()
                ),
                format!("axis {a}"),
            ));
        }
        if i > 0 && axes[i - 1] >= a {
            return Err(InferError::new(
                format!("{what}: axes must be distinct and increasing, got {axes:?}"),
                "repeated axis",
            ));
        }
    }
    Ok(())
}

fn arity(what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(InferError::new(
            format!("{what} takes {want} operand(s), got {got}"),
            format!("{got} operand(s)"),
        ))
    }
}

fn window_out(what: &str, size: usize, kernel: usize, stride: usize, pad: usize) -> Result<usize> {
    if stride == 0 {
        return Err(InferError::new(
            format!("{what}: stride must be positive"),
            "stride 0",
        ));
    }
    let Some(padded) = pad.checked_mul(2).and_then(|p| p.checked_add(size)) else {
        return Err(InferError::new(
            format!("{what}: padding {pad} is too large"),
            "padding overflows",
        ));
    };
    if kernel == 0 || padded < kernel {
        return Err(InferError::new(
            format!("{what}: window {kernel} does not fit input extent {size} with padding {pad}"),
            format!("window {kernel} > {padded}"),
        ));
    }
    Ok((padded - kernel) / stride + 1)
}

/// The result types of `op` applied to operands of types `inputs`.
///
/// `graph.param`, `graph.constant` and `graph.call` take their types from
/// context (the signature, the node, the callee) and are rejected here.
pub fn infer(op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>> {
    let name = op.name();
    let what = name.as_str();
    let one = |t: TensorType| Ok(vec![t]);
    match op {
        Op::Param { .. } | Op::Constant(_) | Op::Call { .. } => Err(InferError::new(
            format!("{what} takes its type from context"),
            "",
        )),
        Op::Unary(u) => {
            arity(what, inputs.len(), 1)?;
            if u.accepts_int() {
                need_numeric(what, inputs[0])?;
            } else {
                need_float(what, inputs[0])?;
            }
            one(inputs[0].clone())
        }
        Op::Binary(b) => {
            arity(what, inputs.len(), 2)?;
            let d = same_dtype(what, inputs)?;
            if !b.accepts_float() {
                need_int(what, inputs[0])?;
            } else if b.accepts_int() {
                need_numeric(what, inputs[0])?;
            } else {
                need_float(what, inputs[0])?;
            }
            one(TensorType::new(d, broadcast(what, inputs)?))
        }
        Op::Compare(_) => {
            arity(what, inputs.len(), 2)?;
            same_dtype(what, inputs)?;
            one(TensorType::new(DType::Bool, broadcast(what, inputs)?))
        }
        Op::Barrier => {
            arity(what, inputs.len(), 2)?;
            if inputs[1].rank() != 0 {
                return Err(InferError::new(
                    format!("barrier: what it waits for is a scalar, got {}", inputs[1]),
                    "not a scalar",
                ));
            }
            one(inputs[0].clone())
        }
        Op::Select => {
            arity(what, inputs.len(), 3)?;
            if inputs[0].dtype != DType::Bool {
                return Err(InferError::new(
                    format!("where: the condition must be bool, got {}", inputs[0]),
                    "not bool",
                ));
            }
            let d = same_dtype(what, &inputs[1..])?;
            one(TensorType::new(d, broadcast(what, inputs)?))
        }
        Op::Cast { to } => {
            arity(what, inputs.len(), 1)?;
            one(TensorType::new(*to, inputs[0].shape.clone()))
        }
        Op::MatMul => {
            arity(what, inputs.len(), 2)?;
            matmul(inputs[0], inputs[1]).map(|t| vec![t])
        }
        Op::Reduce {
            kind,
            axes,
            keepdims,
        } => {
            arity(what, inputs.len(), 1)?;
            let t = inputs[0];
            if *kind == ReduceKind::Mean {
                need_float(what, t)?;
            } else {
                need_numeric(what, t)?;
            }
            check_axes(what, t, axes)?;
            let mut shape = Vec::new();
            for (i, &d) in t.shape.iter().enumerate() {
                if !axes.contains(&i) {
                    shape.push(d);
                } else if *keepdims {
                    shape.push(1);
                }
            }
            one(TensorType::new(t.dtype, shape))
        }
        Op::Softmax { axis } => {
            arity(what, inputs.len(), 1)?;
            need_float(what, inputs[0])?;
            check_axes(what, inputs[0], &[*axis])?;
            one(inputs[0].clone())
        }
        Op::LayerNorm { axes, eps } => {
            arity(what, inputs.len(), 1)?;
            need_float(what, inputs[0])?;
            check_axes(what, inputs[0], axes)?;
            if eps.is_nan() || *eps < 0.0 {
                return Err(InferError::new(
                    format!("{what}: eps must be >= 0"),
                    "bad eps",
                ));
            }
            one(inputs[0].clone())
        }
        Op::Reshape { shape } => {
            arity(what, inputs.len(), 1)?;
            reshape(inputs[0], shape).map(|t| vec![t])
        }
        Op::Transpose { perm } => {
            arity(what, inputs.len(), 1)?;
            let t = inputs[0];
            let mut sorted = perm.clone();
            sorted.sort_unstable();
            if sorted != (0..t.rank()).collect::<Vec<_>>() {
                return Err(InferError::new(
                    format!("transpose: {perm:?} is not a permutation of the axes of {t}"),
                    "not a permutation",
                ));
            }
            one(TensorType::new(
                t.dtype,
                perm.iter().map(|&p| t.shape[p]).collect(),
            ))
        }
        Op::Concat { axis } => concat(inputs, *axis).map(|t| vec![t]),
        Op::Slice { axis, start, end } => {
            arity(what, inputs.len(), 1)?;
            let t = inputs[0];
            check_axes(what, t, &[*axis])?;
            if start >= end || *end > t.shape[*axis] {
                return Err(InferError::new(
                    format!("slice {start}..{end} is empty or out of range for axis {axis} of {t}"),
                    format!("axis {axis} has extent {}", t.shape[*axis]),
                ));
            }
            let mut shape = t.shape.clone();
            shape[*axis] = end - start;
            one(TensorType::new(t.dtype, shape))
        }
        Op::Gather { axis } => {
            arity(what, inputs.len(), 2)?;
            let shape = gathered_shape(what, inputs[0], inputs[1], *axis)?;
            one(TensorType::new(inputs[0].dtype, shape))
        }
        Op::ScatterAdd { axis } => {
            arity(what, inputs.len(), 3)?;
            scattered(what, inputs[0], inputs[1], inputs[2], *axis)?;
            one(inputs[0].clone())
        }
        Op::Broadcast { shape } => {
            arity(what, inputs.len(), 1)?;
            let t = inputs[0];
            let ok = shape.len() >= t.rank()
                && t.shape
                    .iter()
                    .zip(&shape[shape.len() - t.rank()..])
                    .all(|(a, b)| a == b || *a == 1);
            if !ok {
                return Err(InferError::new(
                    format!("cannot broadcast {t} to shape {shape:?}"),
                    "incompatible shape",
                ));
            }
            one(TensorType::new(t.dtype, shape.clone()))
        }
        Op::Conv2d {
            stride,
            padding,
            groups,
            dilation,
        } => conv2d(inputs, *stride, *padding, *groups, *dilation).map(|t| vec![t]),
        Op::Pool2d {
            kernel,
            stride,
            padding,
            ..
        } => {
            arity(what, inputs.len(), 1)?;
            let x = inputs[0];
            need_rank(what, x, 4)?;
            need_numeric(what, x)?;
            let oh = window_out(what, x.shape[2], kernel[0], stride[0], padding[0])?;
            let ow = window_out(what, x.shape[3], kernel[1], stride[1], padding[1])?;
            one(TensorType::new(
                x.dtype,
                vec![x.shape[0], x.shape[1], oh, ow],
            ))
        }
        Op::BatchNorm { .. } => batchnorm(inputs).map(|t| vec![t]),
        Op::Compute(body) => {
            crate::verify::check_compute(body, inputs)
                .map_err(|m| InferError::new(format!("graph.compute `{}`: {m}", body.name), ""))?;
            one(body.out.ty.clone())
        }
    }
}

/// `reshape` typing: the number of elements stays.
fn reshape(t: &TensorType, shape: &[usize]) -> Result<TensorType> {
    let target = TensorType::new(t.dtype, shape.to_vec());
    if target.num_elements() != t.num_elements() {
        return Err(InferError::new(
            format!("reshape changes the number of elements: {t} to {target}"),
            format!(
                "{} vs {} elements",
                t.num_elements().unwrap_or(usize::MAX),
                target
                    .num_elements()
                    .map_or("too many".into(), |n| n.to_string())
            ),
        ));
    }
    Ok(target)
}

/// `concat` typing: one element type, shapes that differ only along `axis`.
fn concat(inputs: &[&TensorType], axis: usize) -> Result<TensorType> {
    let what = "concat";
    if inputs.is_empty() {
        return Err(InferError::new(
            "concat needs at least one operand",
            "empty list",
        ));
    }
    let d = same_dtype(what, inputs)?;
    let first = inputs[0];
    check_axes(what, first, &[axis])?;
    let mut shape = first.shape.clone();
    for t in &inputs[1..] {
        let compatible = t.rank() == first.rank()
            && t.shape
                .iter()
                .zip(&first.shape)
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !compatible {
            return Err(InferError::new(
                format!(
                    "concat along axis {axis}: shapes differ off that axis: {}",
                    fmt_types(inputs)
                ),
                format!("{first} vs {t}"),
            ));
        }
        shape[axis] = shape[axis]
            .checked_add(t.shape[axis])
            .ok_or_else(|| InferError::new("concat: the joined extent overflows", "too large"))?;
    }
    Ok(TensorType::new(d, shape))
}

/// `conv2d` typing: NCHW input, OIHW weights in `groups` groups.
fn conv2d(
    inputs: &[&TensorType],
    stride: [usize; 2],
    padding: [usize; 2],
    groups: usize,
    dilation: [usize; 2],
) -> Result<TensorType> {
    let what = "conv2d";
    arity(what, inputs.len(), 2)?;
    let (x, w) = (inputs[0], inputs[1]);
    need_rank("conv2d input", x, 4)?;
    need_rank("conv2d weight", w, 4)?;
    let d = same_dtype(what, inputs)?;
    need_float(what, x)?;
    let (c, o) = (x.shape[1], w.shape[0]);
    if groups == 0 || c % groups != 0 || o % groups != 0 {
        return Err(InferError::new(
            format!(
                "conv2d: groups={groups} must divide the input channels ({c}) and output channels ({o})"
            ),
            format!("groups={groups}"),
        ));
    }
    if w.shape[1] != c / groups {
        return Err(InferError::new(
            format!(
                "conv2d: weight {w} needs {} input channels per group, input {x} has {} per group",
                w.shape[1],
                c / groups
            ),
            format!("{} vs {}", w.shape[1], c / groups),
        ));
    }
    // A dilated window spans `dilation * (kernel - 1) + 1` input positions.
    let mut span = [0; 2];
    for a in 0..2 {
        let k = w.shape[2 + a];
        span[a] = match dilation[a] {
            0 => {
                return Err(InferError::new(
                    format!("{what}: dilation must be positive"),
                    "dilation 0",
                ));
            }
            d => d
                .checked_mul(k.saturating_sub(1))
                .and_then(|s| s.checked_add(usize::from(k > 0)))
                .ok_or_else(|| {
                    InferError::new(
                        format!("{what}: dilation {d} is too large"),
                        "dilation overflows",
                    )
                })?,
        };
    }
    let oh = window_out(what, x.shape[2], span[0], stride[0], padding[0])?;
    let ow = window_out(what, x.shape[3], span[1], stride[1], padding[1])?;
    Ok(TensorType::new(d, vec![x.shape[0], o, oh, ow]))
}

/// `batchnorm` typing: an input of rank 2 or more, and per-channel
/// statistics.
fn batchnorm(inputs: &[&TensorType]) -> Result<TensorType> {
    let what = "batchnorm";
    arity(what, inputs.len(), 5)?;
    let x = inputs[0];
    let d = same_dtype(what, inputs)?;
    need_float(what, x)?;
    if x.rank() < 2 {
        return Err(InferError::new(
            format!("batchnorm needs an input of rank >= 2 (N, C, ...), got {x}"),
            format!("rank {}", x.rank()),
        ));
    }
    for t in &inputs[1..] {
        if t.shape != [x.shape[1]] {
            return Err(InferError::new(
                format!(
                    "batchnorm statistics must have shape [{}] (the channels of {x}), got {t}",
                    x.shape[1]
                ),
                format!("{t}"),
            ));
        }
    }
    Ok(TensorType::new(d, x.shape.clone()))
}

/// `numpy.matmul` typing, with 1-D operands promoted and the promoted axis
/// dropped from the result.
pub fn matmul(a: &TensorType, b: &TensorType) -> Result<TensorType> {
    let d = same_dtype("matmul", &[a, b])?;
    need_numeric("matmul", a)?;
    if a.rank() == 0 || b.rank() == 0 {
        return Err(InferError::new(
            format!("matmul operands must have rank >= 1: {a} @ {b}"),
            "scalar operand",
        ));
    }
    let a_shape = if a.rank() == 1 {
        vec![1, a.shape[0]]
    } else {
        a.shape.clone()
    };
    let b_shape = if b.rank() == 1 {
        vec![b.shape[0], 1]
    } else {
        b.shape.clone()
    };
    let (m, k) = (a_shape[a_shape.len() - 2], a_shape[a_shape.len() - 1]);
    let (k2, n) = (b_shape[b_shape.len() - 2], b_shape[b_shape.len() - 1]);
    if k != k2 {
        return Err(InferError::new(
            format!("matmul inner dimensions differ: {a} @ {b}"),
            format!("{k} vs {k2}"),
        ));
    }
    let batch = broadcast_shapes(&[&a_shape[..a_shape.len() - 2], &b_shape[..b_shape.len() - 2]])
        .ok_or_else(|| {
        InferError::new(
            format!("matmul batch dimensions do not broadcast: {a} @ {b}"),
            "incompatible batch shapes",
        )
    })?;
    let mut shape = batch;
    if a.rank() > 1 {
        shape.push(m);
    }
    if b.rank() > 1 {
        shape.push(n);
    }
    Ok(TensorType::new(d, shape))
}
