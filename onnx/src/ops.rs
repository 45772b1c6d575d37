//! ONNX operators as dlc expressions: each node becomes one `let` of a
//! built-in call or a composition of them, a helper operator in index
//! notation for windows the built-ins do not cover (dilation, asymmetric
//! padding, 1-D and 3-D), or, when all its inputs are known, a constant
//! folded here.

use std::collections::HashMap;

use dlc_core::DType;

use crate::data::{Data, dtype_of, onnx_type_name};
use crate::pb::{AttributeProto, NodeProto, attribute_proto::AttributeType};
use crate::{ImportError, Importer, Val, literal, shape_text, type_text};

/// The node being translated, for its attributes and its errors.
struct Cx<'n> {
    node: &'n NodeProto,
    opset: i64,
}

type R<T> = Result<T, ImportError>;

/// How errors and places name `node`: its name (or its first output's,
/// when unnamed) and its op type (with its domain when not the default
/// one).
pub(crate) fn node_label(node: &NodeProto) -> (String, String) {
    let op = match node.domain() {
        "" | "ai.onnx" => node.op_type().to_string(),
        d => format!("{d}.{}", node.op_type()),
    };
    let name = if !node.name().is_empty() {
        node.name().to_string()
    } else {
        node.output.first().cloned().unwrap_or_default()
    };
    (name, op)
}

impl Cx<'_> {
    fn op(&self) -> &str {
        self.node.op_type()
    }

    fn err(&self, message: impl Into<String>) -> ImportError {
        let (node, op) = node_label(self.node);
        ImportError::Node {
            node,
            op,
            opset: self.opset,
            message: message.into(),
        }
    }

    fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.node.attribute.iter().find(|a| a.name() == name)
    }

    /// Fails on any attribute outside `known`.
    fn allow(&self, known: &[&str]) -> R<()> {
        for a in &self.node.attribute {
            if !known.contains(&a.name()) {
                return Err(self.err(format!("attribute `{}` is not supported", a.name())));
            }
        }
        Ok(())
    }

    fn int(&self, name: &str, default: i64) -> i64 {
        self.attr(name).map_or(default, |a| a.i())
    }

    fn float(&self, name: &str, default: f64) -> f64 {
        self.attr(name).map_or(default, |a| f64::from(a.f()))
    }

    fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attr(name).map(|a| a.ints.clone())
    }

    fn string(&self, name: &str, default: &str) -> String {
        self.attr(name).map_or(default.to_string(), |a| {
            String::from_utf8_lossy(a.s()).into_owned()
        })
    }

    fn axis(&self, axis: i64, rank: usize) -> R<usize> {
        let r = rank as i64;
        if axis < -r || axis >= r {
            return Err(self.err(format!("axis {axis} is out of range for rank {rank}")));
        }
        Ok(if axis < 0 { axis + r } else { axis } as usize)
    }

    fn axes(&self, axes: &[i64], rank: usize) -> R<Vec<usize>> {
        let mut out: Vec<usize> = axes.iter().map(|&a| self.axis(a, rank)).collect::<R<_>>()?;
        out.sort_unstable();
        if out.windows(2).any(|w| w[0] == w[1]) {
            return Err(self.err(format!("axes {axes:?} repeat an axis")));
        }
        Ok(out)
    }

    /// An `epsilon` attribute, which must be a non-negative number.
    fn epsilon(&self, default: f64) -> R<String> {
        let e = self.float("epsilon", default);
        if !(e >= 0.0 && e.is_finite()) {
            return Err(self.err(format!("epsilon {e} must be a non-negative number")));
        }
        Ok(literal(e, DType::F32))
    }

    fn float_input(&self, v: &Val) -> R<()> {
        if v.dtype.is_float() {
            Ok(())
        } else {
            Err(self.err(format!("needs a float input, got {}", v.dtype)))
        }
    }

    /// An input laid out as `(N, C, spatial...)`: rank 3 or more.
    fn spatial_input(&self, rank: usize) -> R<()> {
        if rank < 3 {
            return Err(self.err("needs an input of rank 3 or more (N, C, spatial...)"));
        }
        Ok(())
    }
}

/// NumPy broadcasting of two shapes.
fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let x = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let y = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            match (x, y) {
                _ if x == y => Some(x),
                (1, _) => Some(y),
                (_, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// Element count, saturating (shapes of unchecked attributes may overflow).
fn numel(shape: &[usize]) -> usize {
    shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
}

/// The most elements a value may have (dlc's own bound is lower still).
const MAX_ELEMENTS: usize = 1 << 40;

/// The attributes of a convolution (and of the integer convolutions
/// written as one).
const CONV_ATTRS: [&str; 6] = [
    "auto_pad",
    "dilations",
    "group",
    "kernel_shape",
    "pads",
    "strides",
];

/// `inner` where every coordinate `j` of index tuple `ind[q.., j]` equals
/// `io{j}[pos(j)]` (in index notation), else `otherwise`.
fn tuple_match(
    qs: &[String],
    m: usize,
    pos: impl Fn(usize) -> String,
    inner: String,
    otherwise: &str,
) -> String {
    (0..m).rev().fold(inner, |acc, j| {
        let mut at = qs.to_vec();
        at.push(j.to_string());
        format!(
            "where(ind[{}] == io{j}[{}], {acc}, {otherwise})",
            at.join(", "),
            pos(j)
        )
    })
}

/// A scatter with reduction `add` (`add`) or `none` of updates `eu`
/// (shape `upd_shape`) into `x` (shape `shape`), given `scatter(base,
/// updates)`, a scatter-add into `base`: `add` adds every update, `none`
/// takes the sum of the updates where some index names the element (ONNX
/// leaves repeated indices undefined; a scatter-add of ones counts them)
/// and the data elsewhere.
fn scatter_none_or_add(
    x: &str,
    shape: &[usize],
    upd_shape: &[usize],
    dt: DType,
    eu: &str,
    add: bool,
    scatter: impl Fn(&str, &str) -> String,
) -> String {
    if add {
        return scatter(x, eu);
    }
    let zeros = format!(
        "full({}, {}, dtype={dt})",
        shape_text(shape),
        literal(0.0, dt)
    );
    let ones = format!(
        "full({}, {}, dtype={dt})",
        shape_text(upd_shape),
        literal(1.0, dt)
    );
    format!(
        "where({} > {}, {}, {x})",
        scatter(&zeros, &ones),
        literal(0.0, dt),
        scatter(&zeros, eu)
    )
}

/// The attributes of `cx`'s node named in `keep`.
fn kept_attributes(cx: &Cx<'_>, keep: &[&str]) -> Vec<AttributeProto> {
    cx.node
        .attribute
        .iter()
        .filter(|a| keep.contains(&a.name()))
        .cloned()
        .collect()
}

/// The shape a per-filter parameter `[M]` of weights `[M, C, k...]` takes
/// to broadcast over them: `[M, 1, 1, ...]`.
fn per_filter(weights: &[usize]) -> Vec<usize> {
    let mut s = vec![weights[0]];
    s.extend(std::iter::repeat_n(1, weights.len() - 1));
    s
}

/// A binary element-wise op folded over known operands; none when they
/// differ in type, the result is large, or the op does not fold there.
fn fold_binary_data(cx: &Cx<'_>, op: &str, x: &Data, y: Option<&Data>) -> R<Option<Data>> {
    let Some(y) = y else {
        return Ok(None);
    };
    if x.dtype != y.dtype {
        return Ok(None);
    }
    let Some(shape) = broadcast(&x.shape, &y.shape) else {
        return Err(cx.err("operands do not broadcast"));
    };
    if numel(&shape) > FOLD_LIMIT {
        return Ok(None);
    }
    let (bx, by) = (broadcast_data(x, &shape), broadcast_data(y, &shape));
    let out_type = if matches!(op, "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Mod") {
        x.dtype
    } else {
        DType::Bool
    };
    let mut v = Vec::with_capacity(bx.values.len());
    for (a, b) in bx.values.iter().zip(by.values.iter()) {
        match fold_binary(op, x.dtype, *a, *b) {
            Some(r) => v.push(out_type.round(r)),
            None => return Ok(None),
        }
    }
    Ok(Some(Data::new(out_type, shape, v)))
}

/// `Where` folded over known operands (condition `x`).
fn fold_where(cx: &Cx<'_>, x: &Data, a: Option<&Data>, b: Option<&Data>) -> R<Option<Data>> {
    let (Some(a), Some(b)) = (a, b) else {
        return Ok(None);
    };
    let Some(shape) = broadcast(&x.shape, &a.shape).and_then(|s| broadcast(&s, &b.shape)) else {
        return Err(cx.err("operands do not broadcast"));
    };
    if numel(&shape) > FOLD_LIMIT {
        return Ok(None);
    }
    let (c, a2, b2) = (
        broadcast_data(x, &shape),
        broadcast_data(a, &shape),
        broadcast_data(b, &shape),
    );
    let v = (0..c.values.len())
        .map(|i| {
            if c.values[i] != 0.0 {
                a2.values[i]
            } else {
                b2.values[i]
            }
        })
        .collect();
    Ok(Some(Data::new(a.dtype, shape, v)))
}

/// `Concat` folded over known parts (the first `x`).
fn fold_concat(cx: &Cx<'_>, x: &Data, ds: Vec<Option<Data>>) -> R<Option<Data>> {
    let parts: Option<Vec<Data>> = ds.into_iter().collect();
    let Some(parts) = parts else { return Ok(None) };
    let axis = cx.axis(cx.int("axis", 0), x.shape.len())?;
    let mut shape = x.shape.clone();
    shape[axis] = parts.iter().fold(0usize, |a, p| {
        a.saturating_add(p.shape.get(axis).copied().unwrap_or(0))
    });
    if parts
        .iter()
        .any(|p| p.shape.len() != x.shape.len() || p.dtype != x.dtype)
    {
        return Err(cx.err("inputs differ in rank or element type"));
    }
    let outer = numel(&shape[..axis]);
    let mut v = Vec::new();
    for o in 0..outer {
        for p in &parts {
            let chunk = numel(&p.shape[axis..]);
            v.extend_from_slice(&p.values[o * chunk..(o + 1) * chunk]);
        }
    }
    Ok(Some(Data::new(x.dtype, shape, v)))
}

/// `Gather` folded over known data `x` and indices.
fn fold_gather(cx: &Cx<'_>, x: &Data, ind: Option<Data>) -> R<Option<Data>> {
    let Some(ind) = ind else {
        return Ok(None);
    };
    let axis = cx.axis(cx.int("axis", 0), x.shape.len())?;
    let n = x.shape[axis] as i64;
    let mut idx = Vec::new();
    for &i in &ind.ints() {
        let j = if i < 0 { i + n } else { i };
        if j < 0 || j >= n {
            return Err(cx.err(format!("index {i} is out of range for extent {n}")));
        }
        idx.push(j as usize);
    }
    let mut shape = x.shape[..axis].to_vec();
    shape.extend(&ind.shape);
    shape.extend(&x.shape[axis + 1..]);
    if numel(&shape) > FOLD_LIMIT {
        return Ok(None);
    }
    let st = strides(&x.shape);
    let ir = ind.shape.len();
    let ist = strides(&ind.shape);
    Ok(Some(gather_data(x, shape, |o| {
        let mut flat = 0;
        for a in 0..axis {
            flat += o[a] * st[a];
        }
        let k: usize = (0..ir).map(|b| o[axis + b] * ist[b]).sum();
        flat += idx[k] * st[axis];
        for a in axis + 1..x.shape.len() {
            flat += o[a + ir - 1] * st[a];
        }
        flat
    })))
}

/// Input `ex` of shape `shape` with `stride - 1` zeros between its
/// elements along each spatial axis (a reshape, a concatenation with zeros
/// and a slice per axis), and its shape.
fn zeros_between(
    mut ex: String,
    shape: &[usize],
    strides: &[i64],
    dt: DType,
) -> (String, Vec<usize>) {
    let mut xs = shape.to_vec();
    for (a, &st) in strides.iter().enumerate() {
        let st = st as usize;
        if st == 1 {
            continue;
        }
        let ax = a + 2;
        let len = xs[ax];
        let mut split = xs[..=ax].to_vec();
        split.push(1);
        split.extend(&xs[ax + 1..]);
        let mut zeros = split.clone();
        zeros[ax + 1] = st - 1;
        let mut merged = xs.clone();
        merged[ax] = len * st;
        ex = format!(
            "slice(reshape(concat([reshape({ex}, {}), zeros({}, dtype={dt})], axis={}), {}), axis={ax}, start=0, end={})",
            shape_text(&split),
            shape_text(&zeros),
            ax + 1,
            shape_text(&merged),
            (len - 1) * st + 1
        );
        xs[ax] = (len - 1) * st + 1;
    }
    (ex, xs)
}

/// An activation of a recurrent op: its expression applied to another.
type Activation = Box<dyn Fn(&str) -> String>;

/// The sizes attention's masks are built for: batch, query heads,
/// queries, keys (the past ones included), past keys; the element type.
#[derive(Clone, Copy)]
struct AttentionSizes {
    b: usize,
    hq: usize,
    s: usize,
    l: usize,
    past: usize,
    dt: DType,
}

/// The cell of a recurrent op.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cell {
    Rnn,
    Gru,
    Lstm,
}

/// A recurrent node's sizes and settings, checked.
struct Recurrence {
    cell: Cell,
    /// Gates, and activations per direction.
    gates: usize,
    per: usize,
    seq: usize,
    batch: usize,
    inp: usize,
    dirs: usize,
    /// The hidden size.
    h: usize,
    /// `layout = 1`: batch first.
    batchwise: bool,
    direction: String,
    dt: DType,
    linear_before_reset: bool,
}

/// A recurrent node's operands as expressions: X (sequence first), W, R,
/// the biases, the initial hidden and cell states (sequence first) and
/// the peepholes.
struct RecurrentInputs {
    x: String,
    w: String,
    r: String,
    b: Option<String>,
    h0: Option<String>,
    c0: Option<String>,
    p: Option<String>,
}

/// What each step of one direction reads: R transposed, R's bias, the
/// peepholes (input, output, forget) and the direction's activations.
struct Step<'a> {
    rt: &'a str,
    rb: Option<&'a str>,
    peep: Option<&'a [String; 3]>,
    acts: &'a [Activation],
}

/// A recurrent node's activations, per direction, by name (ONNX's
/// defaults when it names none), with their alpha and beta taken in
/// order from `activation_alpha` and `activation_beta`.
fn activations(cx: &Cx<'_>, rec: &Recurrence) -> R<Vec<Activation>> {
    let names: Vec<String> = match cx.attr("activations") {
        Some(a) => a
            .strings
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
        None => {
            let one: &[&str] = match rec.cell {
                Cell::Rnn => &["Tanh"],
                Cell::Gru => &["Sigmoid", "Tanh"],
                Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
            };
            (0..rec.dirs)
                .flat_map(|_| one.iter().map(|s| s.to_string()))
                .collect()
        }
    };
    if names.len() != rec.per * rec.dirs {
        return Err(cx.err(format!(
            "activations lists {} functions; {} {} needs {}",
            names.len(),
            cx.op(),
            rec.direction,
            rec.per * rec.dirs
        )));
    }
    let floats =
        |name: &str| -> Vec<f32> { cx.attr(name).map(|a| a.floats.clone()).unwrap_or_default() };
    let (alphas, betas) = (floats("activation_alpha"), floats("activation_beta"));
    let (mut ai, mut bi) = (0, 0);
    let dt = rec.dt;
    let mut acts: Vec<Activation> = Vec::new();
    for n in &names {
        let take = |v: &[f32], i: &mut usize, default: f64| {
            let x = v.get(*i).map_or(default, |&a| f64::from(a));
            *i += 1;
            literal(x, dt)
        };
        let f: Activation = match n.to_ascii_lowercase().as_str() {
            "sigmoid" => Box::new(|e: &str| format!("sigmoid({e})")),
            "tanh" => Box::new(|e: &str| format!("tanh({e})")),
            "relu" => Box::new(|e: &str| format!("relu({e})")),
            "softsign" => Box::new(|e: &str| format!("({e}) / (abs({e}) + 1.0)")),
            "softplus" => Box::new(|e: &str| format!("log(exp({e}) + 1.0)")),
            "leakyrelu" => {
                let a = take(&alphas, &mut ai, 0.01);
                Box::new(move |e: &str| format!("where({e} < 0.0, {e} * {a}, {e})"))
            }
            "thresholdedrelu" => {
                let a = take(&alphas, &mut ai, 1.0);
                Box::new(move |e: &str| format!("where({e} > {a}, {e}, 0.0)"))
            }
            "elu" => {
                let a = take(&alphas, &mut ai, 1.0);
                Box::new(move |e: &str| format!("where({e} < 0.0, (exp({e}) - 1.0) * {a}, {e})"))
            }
            "hardsigmoid" => {
                let a = take(&alphas, &mut ai, 0.2);
                let b = take(&betas, &mut bi, 0.5);
                Box::new(move |e: &str| format!("max(min(({e}) * {a} + {b}, 1.0), 0.0)"))
            }
            "affine" => {
                let a = take(&alphas, &mut ai, 1.0);
                let b = take(&betas, &mut bi, 0.0);
                Box::new(move |e: &str| format!("({e}) * {a} + {b}"))
            }
            "scaledtanh" => {
                let a = take(&alphas, &mut ai, 1.0);
                let b = take(&betas, &mut bi, 1.0);
                Box::new(move |e: &str| format!("tanh(({e}) * {b}) * {a}"))
            }
            other => {
                return Err(cx.err(format!("activation `{other}` is not supported")));
            }
        };
        acts.push(f);
    }
    Ok(acts)
}

/// Operators read from models older than [`crate::MIN_OPSET`], each with
/// the oldest opset whose definition of it means what the importer
/// implements (later versions only added element types or attributes the
/// importer checks): the logical operators from 7 (NumPy broadcasting),
/// the integer and quantized ops from their introduction, and what
/// ONNX's own expansion of `DynamicQuantizeLinear` (opset 11) uses.
const OLD_OPSETS: [(&str, i64); 28] = [
    ("DynamicQuantizeLinear", 11),
    ("Not", 1),
    ("Identity", 1),
    ("Cast", 6),
    ("And", 7),
    ("Or", 7),
    ("Xor", 7),
    ("Add", 7),
    ("Sub", 7),
    ("Mul", 7),
    ("Div", 7),
    ("Max", 8),
    ("Min", 8),
    ("MatMul", 9),
    ("Dropout", 7),
    ("Constant", 9),
    ("Shrink", 9),
    // Scatter-9 is ScatterElements without negative indices or reduction.
    ("Scatter", 9),
    ("QuantizeLinear", 10),
    ("DequantizeLinear", 10),
    ("MatMulInteger", 10),
    ("ConvInteger", 10),
    ("QLinearMatMul", 10),
    ("QLinearConv", 10),
    ("Clip", 11),
    ("Round", 11),
    ("ReduceMax", 11),
    ("ReduceMin", 11),
];

/// Attribute values beyond this (pads, strides, kernels) are rejected.
const MAX_ATTR: i64 = 1 << 31;

/// Elements of `d` read through `index`, which maps a row-major position of
/// `shape` to a position of `d`.
fn gather_data(d: &Data, shape: Vec<usize>, index: impl Fn(&[usize]) -> usize) -> Data {
    let n = numel(&shape);
    let mut idx = vec![0usize; shape.len()];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(d.values[index(&idx)]);
        for ax in (0..shape.len()).rev() {
            idx[ax] += 1;
            if idx[ax] < shape[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
    Data::new(d.dtype, shape, out)
}

/// A `Transpose` node's `perm` for an input of rank `r` (reversed axes
/// without one).
fn transpose_perm(cx: &Cx<'_>, r: usize) -> R<Vec<usize>> {
    Ok(match cx.ints("perm") {
        Some(p) => {
            let p: Vec<usize> = p.iter().map(|&a| cx.axis(a, r)).collect::<R<_>>()?;
            let mut sorted = p.clone();
            sorted.sort_unstable();
            if sorted != (0..r).collect::<Vec<_>>() {
                return Err(cx.err(format!("perm {p:?} is not a permutation of 0..{r}")));
            }
            p
        }
        None => (0..r).rev().collect(),
    })
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// `d` broadcast to `shape`.
fn broadcast_data(d: &Data, shape: &[usize]) -> Data {
    let st = strides(&d.shape);
    let off = shape.len() - d.shape.len();
    gather_data(d, shape.to_vec(), |idx| {
        (0..d.shape.len())
            .map(|a| {
                if d.shape[a] == 1 {
                    0
                } else {
                    idx[a + off] * st[a]
                }
            })
            .sum()
    })
}

/// Folds are only done on small tensors (shape arithmetic), not weights.
const FOLD_LIMIT: usize = 1 << 16;

/// The numeric semantics of a folded element-wise binary op.
fn fold_binary(op: &str, dtype: DType, a: f64, b: f64) -> Option<f64> {
    let int = !dtype.is_float();
    Some(match op {
        "Add" => a + b,
        "Sub" => a - b,
        "Mul" => a * b,
        "Div" if int => {
            if b == 0.0 {
                return None;
            }
            (a / b).trunc()
        }
        "Div" => a / b,
        "Max" => a.max(b),
        "Min" => a.min(b),
        // fmod = 0: the sign of the divisor (Python's %).
        "Mod" => {
            if b == 0.0 {
                return None;
            }
            a - (a / b).floor() * b
        }
        "Equal" => f64::from(u8::from(a == b)),
        "Less" => f64::from(u8::from(a < b)),
        "Greater" => f64::from(u8::from(a > b)),
        "LessOrEqual" => f64::from(u8::from(a <= b)),
        "GreaterOrEqual" => f64::from(u8::from(a >= b)),
        "And" => f64::from(u8::from(a != 0.0 && b != 0.0)),
        "Or" => f64::from(u8::from(a != 0.0 || b != 0.0)),
        _ => return None,
    })
}

/// Output extent of a window op along one axis.
fn window_extent(input: usize, k: usize, s: usize, d: usize, pb: i64, pe: i64, ceil: bool) -> i64 {
    let span = (input as i64) + pb + pe - (d as i64) * (k as i64 - 1) - 1;
    if span < 0 {
        return 0;
    }
    let s = s as i64;
    let mut out = if ceil {
        (span + s - 1) / s + 1
    } else {
        span / s + 1
    };
    // A window may not start in the end padding (ceil mode).
    if ceil && (out - 1) * s >= input as i64 + pb {
        out -= 1;
    }
    out
}

/// The affine index `s * y + d * k - p` as text.
fn window_index(y: &str, k: &str, s: usize, d: usize, p: i64) -> String {
    let mut t = if s == 1 {
        y.to_string()
    } else {
        format!("{s} * {y}")
    };
    if d == 1 {
        t.push_str(&format!(" + {k}"));
    } else {
        t.push_str(&format!(" + {d} * {k}"));
    }
    if p > 0 {
        t.push_str(&format!(" - {p}"));
    } else if p < 0 {
        t.push_str(&format!(" + {}", -p));
    }
    t
}

/// Window geometry of Conv and the pooling ops.
struct Window {
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    begin: Vec<i64>,
    end: Vec<i64>,
    out: Vec<usize>,
}

impl Importer {
    fn input(&self, cx: &Cx<'_>, i: usize) -> Option<Val> {
        let name = cx.node.input.get(i).filter(|n| !n.is_empty())?;
        self.vals.get(name).cloned()
    }

    fn need(&self, cx: &Cx<'_>, i: usize) -> R<Val> {
        match cx.node.input.get(i).filter(|n| !n.is_empty()) {
            None => Err(cx.err(format!("input {i} is required"))),
            Some(name) => {
                self.vals.get(name).cloned().ok_or_else(|| {
                    cx.err(format!("input `{name}` is not defined before this node"))
                })
            }
        }
    }

    /// Input `i`, if given, must have `dtype` and broadcast to `target`
    /// without changing it (`exact`: have exactly that shape).
    fn check_operand(
        &self,
        cx: &Cx<'_>,
        i: usize,
        dtype: DType,
        target: &[usize],
        exact: bool,
    ) -> R<()> {
        let Some(v) = self.input(cx, i) else {
            return Ok(());
        };
        let fits = if exact {
            v.shape == target
        } else {
            broadcast(&v.shape, target).as_deref() == Some(target)
        };
        if v.dtype != dtype || !fits {
            return Err(cx.err(format!(
                "input {i} is {}; it must be {dtype} {} {}",
                type_text(v.dtype, &v.shape),
                if exact { "of shape" } else { "broadcasting to" },
                shape_text(target)
            )));
        }
        Ok(())
    }

    /// The dlc expression of input `i`. An empty tensor has none: it may
    /// only feed the shape arithmetic folded at import.
    fn e(&mut self, cx: &Cx<'_>, i: usize) -> R<String> {
        let v = self.need(cx, i)?;
        if v.shape.contains(&0) {
            return Err(cx.err(format!(
                "input {i} is empty ({}); dlc tensors have positive extents, so an empty \
                 tensor may only feed shape computations the importer folds",
                type_text(v.dtype, &v.shape)
            )));
        }
        self.var_of(&cx.node.input[i])
    }

    /// Input `i`'s elements, which must be known at import time.
    fn ints_input(&self, cx: &Cx<'_>, i: usize, what: &str) -> R<Option<Vec<i64>>> {
        match self.input(cx, i) {
            None => Ok(None),
            Some(v) => match v.data {
                Some(d) => Ok(Some(d.ints())),
                None => Err(cx.err(format!(
                    "{what} (input {i}) must be a constant; dlc shapes are static"
                ))),
            },
        }
    }

    fn bind(
        &mut self,
        cx: &Cx<'_>,
        k: usize,
        expr: String,
        dtype: DType,
        shape: Vec<usize>,
    ) -> R<()> {
        let Some(out) = cx.node.output.get(k).filter(|o| !o.is_empty()).cloned() else {
            return Ok(());
        };
        if shape.contains(&0) {
            return Err(cx.err(format!(
                "its result {} has no elements; dlc tensors have positive extents",
                shape_text(&shape)
            )));
        }
        if numel(&shape) > MAX_ELEMENTS {
            return Err(cx.err(format!("its result {} is too large", shape_text(&shape))));
        }
        let var = self.fresh(&out);
        self.lines.push(format!("let {var} = {expr};"));
        self.vals.insert(
            out,
            Val {
                dtype,
                shape,
                var: Some(var),
                data: None,
            },
        );
        Ok(())
    }

    fn bind_data(&mut self, cx: &Cx<'_>, k: usize, d: Data) -> R<()> {
        let Some(out) = cx.node.output.get(k).filter(|o| !o.is_empty()).cloned() else {
            return Ok(());
        };
        self.vals.insert(
            out,
            Val {
                dtype: d.dtype,
                shape: d.shape.clone(),
                var: None,
                data: Some(d),
            },
        );
        Ok(())
    }

    /// Output `k` is the same value as `v`.
    fn alias(&mut self, cx: &Cx<'_>, k: usize, v: Val) {
        if let Some(out) = cx.node.output.get(k).filter(|o| !o.is_empty()) {
            self.vals.insert(out.clone(), v);
        }
    }

    /// Translates one node.
    pub(crate) fn node(&mut self, node: &NodeProto) -> R<()> {
        let cx = Cx {
            node,
            opset: self.opset,
        };
        if self.opset < crate::MIN_OPSET
            && !OLD_OPSETS
                .iter()
                .any(|&(op, since)| op == node.op_type() && self.opset >= since)
        {
            return Err(cx.err(format!(
                "this operator is not supported at opset {} (dlc reads it, if at all, from \
                 opset {m} on; convert the model with \
                 onnx.version_converter.convert_version(model, {m}))",
                self.opset,
                m = crate::MIN_OPSET
            )));
        }
        self.translate(&cx)
    }

    /// A node rewritten as node `op` of `inputs` (ONNX names, the importer's
    /// own from [`Self::define`] included) with the same outputs and the
    /// attributes named in `keep`.
    fn rewrite(&mut self, cx: &Cx<'_>, op: &str, inputs: Vec<String>, keep: &[&str]) -> R<()> {
        let attrs = kept_attributes(cx, keep);
        self.translate_as(cx, op, inputs, cx.node.output.clone(), attrs)
    }

    /// Translates node `op` of `inputs` and `attrs` giving `outputs`, named
    /// and placed as `cx`'s node, at the opset the importer implements.
    fn translate_as(
        &mut self,
        cx: &Cx<'_>,
        op: &str,
        inputs: Vec<String>,
        outputs: Vec<String>,
        attrs: Vec<AttributeProto>,
    ) -> R<()> {
        let node = NodeProto {
            op_type: Some(op.into()),
            input: inputs,
            output: outputs,
            attribute: attrs,
            ..cx.node.clone()
        };
        self.translate(&Cx {
            node: &node,
            opset: crate::MIN_OPSET.max(cx.opset),
        })
    }

    /// Node `op` of `inputs` with `attrs`, translated on its own into a
    /// value of the importer's (for a step of a composition that is an
    /// ONNX op); returns that value's name.
    fn sub_node(
        &mut self,
        cx: &Cx<'_>,
        op: &str,
        inputs: Vec<String>,
        attrs: Vec<AttributeProto>,
    ) -> R<String> {
        // A fresh identifier: unique even when the node folds and writes
        // no line.
        let out = format!("\u{0}{}", self.fresh(op));
        self.translate_as(cx, op, inputs, vec![out.clone()], attrs)?;
        Ok(out)
    }

    /// A value of the importer's own, `let` to `expr`, under a name no ONNX
    /// value has; returns that name, for [`Self::rewrite`].
    fn define(&mut self, hint: &str, expr: String, dtype: DType, shape: Vec<usize>) -> String {
        let var = self.fresh(hint);
        self.lines.push(format!("let {var} = {expr};"));
        let name = format!("\u{0}{var}");
        self.vals.insert(
            name.clone(),
            Val {
                dtype,
                shape,
                var: Some(var),
                data: None,
            },
        );
        name
    }

    fn translate(&mut self, cx: &Cx<'_>) -> R<()> {
        let node = cx.node;
        match node.domain() {
            "" | "ai.onnx" => {}
            d => return Err(cx.err(format!("operators of domain `{d}` are not supported"))),
        }
        if let Some(g) = node
            .attribute
            .iter()
            .find(|a| a.r#type() == AttributeType::Graph || a.g.is_some())
        {
            return Err(cx.err(format!(
                "attribute `{}` is a subgraph; control flow (If, Loop, Scan) is not supported",
                g.name()
            )));
        }
        if self.try_fold(cx)? {
            return Ok(());
        }
        let op = node.op_type().to_string();
        match op.as_str() {
            "Identity" | "Dropout" => self.identity(cx),
            "Abs" | "Neg" | "Relu" | "Exp" | "Log" | "Sqrt" | "Tanh" | "Sigmoid" | "Floor"
            | "Ceil" | "Round" | "Sign" | "Reciprocal" | "Sin" | "Cos" | "Erf" => self.unary(cx),
            "Tan" | "Sinh" | "Cosh" | "Asinh" | "Acosh" | "Atanh" | "Shrink"
            | "LpNormalization" | "Hardmax" => self.composite(cx),
            "ArgMax" | "ArgMin" => self.arg_extreme(cx),
            "TopK" => self.top_k(cx),
            "Trilu" => self.trilu(cx),
            "OneHot" => self.one_hot(cx),
            "CumSum" | "CumProd" => self.cumsum(cx),
            "Einsum" => self.einsum(cx),
            "CenterCropPad" => self.center_crop_pad(cx),
            "RNN" | "GRU" | "LSTM" => self.recurrent(cx),
            "EyeLike" => self.eye_like(cx),
            "DFT" => self.dft(cx),
            "LRN" => self.lrn(cx),
            "MeanVarianceNormalization" => {
                cx.allow(&["axes"])?;
                let x = self.need(cx, 0)?;
                cx.float_input(&x)?;
                let r = x.shape.len();
                if r == 0 {
                    return Err(cx.err("needs an input of rank 1 or more"));
                }
                let axes: Vec<usize> = match cx.ints("axes") {
                    Some(a) => a.iter().map(|&a| cx.axis(a, r)).collect::<R<_>>()?,
                    None if r == 4 => vec![0, 2, 3],
                    None => return Err(cx.err("axes are required for a input not of rank 4")),
                };
                let ex = self.e(cx, 0)?;
                let list: Vec<String> = axes.iter().map(ToString::to_string).collect();
                let args = format!("axis=[{}], keepdims=true", list.join(", "));
                let (m, sd) = (self.fresh("mean"), self.fresh("std"));
                self.lines.push(format!("let {m} = mean({ex}, {args});"));
                self.lines.push(format!(
                    "let {sd} = sqrt(mean({ex} * {ex}, {args}) - {m} * {m});"
                ));
                let eps = literal(1e-9, x.dtype);
                self.bind(
                    cx,
                    0,
                    format!("({ex} - {m}) / ({sd} + {eps})"),
                    x.dtype,
                    x.shape,
                )
            }
            "SwiGLU" => {
                cx.allow(&["alpha"])?;
                let (a, b) = (self.need(cx, 0)?, self.need(cx, 1)?);
                cx.float_input(&a)?;
                if a.shape != b.shape || a.dtype != b.dtype {
                    return Err(cx.err("A and B must have one shape and type"));
                }
                let alpha = literal(cx.float("alpha", 1.0), a.dtype);
                let (ea, eb) = (self.e(cx, 0)?, self.e(cx, 1)?);
                let expr = format!("{ea} * sigmoid({ea} * {alpha}) * {eb}");
                self.bind(cx, 0, expr, a.dtype, a.shape)
            }
            "RotaryEmbedding" => self.rotary(cx),
            "ScatterElements" | "Scatter" => self.scatter_elements(cx),
            "ScatterND" => self.scatter_nd(cx),
            "TensorScatter" => self.tensor_scatter(cx),
            "GatherND" => self.gather_nd(cx),
            "Mod" => self.modulo(cx),
            "DepthToSpace" | "SpaceToDepth" => self.depth_space(cx),
            "LeakyRelu" | "Elu" | "Selu" | "Celu" | "Softplus" | "Softsign" | "HardSigmoid"
            | "HardSwish" | "Mish" | "ThresholdedRelu" | "Gelu" | "IsNaN" | "IsInf" | "Not"
            | "Swish" => self.activation(cx),
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "Greater"
            | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" | "PRelu" => self.binary(cx),
            "Max" | "Min" | "Sum" | "Mean" => self.variadic(cx),
            "Clip" => self.clip(cx),
            "Where" => {
                cx.allow(&[])?;
                let (c, a, b) = (self.need(cx, 0)?, self.need(cx, 1)?, self.need(cx, 2)?);
                if c.dtype != DType::Bool || a.dtype != b.dtype {
                    return Err(cx.err(format!(
                        "needs a bool condition and two operands of one type, got {}, {} and {}",
                        c.dtype, a.dtype, b.dtype
                    )));
                }
                let shape = broadcast(&c.shape, &a.shape)
                    .and_then(|s| broadcast(&s, &b.shape))
                    .ok_or_else(|| cx.err("operands do not broadcast"))?;
                let (ec, ea, eb) = (self.e(cx, 0)?, self.e(cx, 1)?, self.e(cx, 2)?);
                self.bind(cx, 0, format!("where({ec}, {ea}, {eb})"), a.dtype, shape)
            }
            "Cast" | "CastLike" => self.cast(cx),
            "MatMul" => self.matmul(cx),
            "Gemm" => self.gemm(cx),
            "Softmax" | "LogSoftmax" => self.softmax(cx),
            "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1"
            | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => {
                self.reduce(cx)
            }
            "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => self.reshape(cx),
            "Transpose" => self.transpose(cx),
            "Concat" => self.concat(cx),
            "Slice" => self.slice(cx),
            "Split" => self.split(cx),
            "Expand" => self.expand(cx),
            "Tile" => self.tile(cx),
            "Gather" => self.gather(cx),
            "GatherElements" => self.gather_elements(cx),
            "RMSNormalization" => self.rms_norm(cx),
            "BatchNormalization" => self.batchnorm(cx),
            "LayerNormalization" | "InstanceNormalization" | "GroupNormalization" => {
                self.normalization(cx)
            }
            "Conv" => self.conv(cx),
            "ConvTranspose" => self.conv_transpose(cx),
            "Attention" => self.attention(cx),
            "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => self.loss(cx),
            "MaxPool" | "AveragePool" | "LpPool" => self.pool(cx),
            "GlobalAveragePool" | "GlobalMaxPool" => {
                cx.allow(&[])?;
                let x = self.need(cx, 0)?;
                cx.spatial_input(x.shape.len())?;
                let ex = self.e(cx, 0)?;
                let axes: Vec<String> = (2..x.shape.len()).map(|a| a.to_string()).collect();
                let f = if op == "GlobalMaxPool" { "max" } else { "mean" };
                if f == "mean" {
                    cx.float_input(&x)?;
                }
                let mut shape = x.shape.clone();
                shape[2..].iter_mut().for_each(|d| *d = 1);
                self.bind(
                    cx,
                    0,
                    format!("{f}({ex}, axis=[{}], keepdims=true)", axes.join(", ")),
                    x.dtype,
                    shape,
                )
            }
            "Pad" => self.pad(cx),
            "Resize" => self.resize(cx),
            "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" | "BitShift" | "BitwiseNot" => {
                self.bitwise(cx)
            }
            "QuantizeLinear" => self.quantize(cx),
            "DynamicQuantizeLinear" => self.dynamic_quantize(cx),
            "MatMulInteger" | "ConvInteger" => self.integer_product(cx),
            "QLinearMatMul" | "QLinearConv" => self.qlinear_product(cx),
            "DequantizeLinear" => self.dequantize(cx),
            _ => Err(cx.err("this operator is not supported yet")),
        }
    }

    /// Folds nodes whose inputs are all known and small (shape arithmetic).
    fn try_fold(&mut self, cx: &Cx<'_>) -> R<bool> {
        let folded = match self.fold_source(cx)? {
            Some(d) => Some(d),
            None => self.fold_known(cx)?,
        };
        match folded {
            Some(d) => {
                self.bind_data(cx, 0, d)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The nodes that fold whatever their inputs: constants, shapes,
    /// sizes, ranges; none for any other node.
    fn fold_source(&mut self, cx: &Cx<'_>) -> R<Option<Data>> {
        Ok(Some(match cx.op() {
            "Constant" => {
                let a = cx
                    .node
                    .attribute
                    .first()
                    .ok_or_else(|| cx.err("has no value"))?;
                match a.name() {
                    "value" => {
                        let t =
                            a.t.as_ref()
                                .ok_or_else(|| cx.err("`value` holds no tensor"))?;
                        crate::data::decode(t, self.model_dir.as_deref()).map_err(|m| cx.err(m))?
                    }
                    "value_float" => Data::new(DType::F32, vec![], vec![f64::from(a.f())]),
                    "value_floats" if !a.floats.is_empty() => Data::new(
                        DType::F32,
                        vec![a.floats.len()],
                        a.floats.iter().map(|&v| f64::from(v)).collect(),
                    ),
                    "value_int" => Data::new(DType::I64, vec![], vec![a.i() as f64]),
                    "value_ints" if !a.ints.is_empty() => Data::new(
                        DType::I64,
                        vec![a.ints.len()],
                        a.ints.iter().map(|&v| v as f64).collect(),
                    ),
                    other => return Err(cx.err(format!("attribute `{other}` is not supported"))),
                }
            }
            "Shape" => {
                cx.allow(&["start", "end"])?;
                let x = self.need(cx, 0)?;
                let r = x.shape.len() as i64;
                let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let (s, e) = (clamp(cx.int("start", 0)), clamp(cx.int("end", r)));
                // An empty slice is fine: it only feeds shape arithmetic.
                let dims: Vec<f64> = x.shape[s..e.max(s)].iter().map(|&d| d as f64).collect();
                Data::new(DType::I64, vec![dims.len()], dims)
            }
            "Size" => {
                let x = self.need(cx, 0)?;
                Data::new(DType::I64, vec![], vec![numel(&x.shape) as f64])
            }
            "ConstantOfShape" => {
                let shape = self
                    .ints_input(cx, 0, "the shape")?
                    .ok_or_else(|| cx.err("input 0 is required"))?;
                if shape.iter().any(|&d| d < 0) {
                    return Err(cx.err(format!("shape {shape:?} has a negative dimension")));
                }
                let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
                let fill = match cx.attr("value").and_then(|a| a.t.as_ref()) {
                    Some(t) => {
                        crate::data::decode(t, self.model_dir.as_deref()).map_err(|m| cx.err(m))?
                    }
                    None => Data::new(DType::F32, vec![1], vec![0.0]),
                };
                if fill.values.len() != 1 {
                    return Err(cx.err(format!(
                        "value holds {} elements; it must hold one",
                        fill.values.len()
                    )));
                }
                let n = numel(&shape);
                if n > 1 << 28 {
                    return Err(cx.err("the result is too large"));
                }
                Data::new(fill.dtype, shape, vec![fill.values[0]; n])
            }
            "Range" => {
                let vals: Vec<Option<Val>> = (0..3).map(|i| self.input(cx, i)).collect();
                let ds: Option<Vec<Data>> = vals.iter().map(|v| v.as_ref()?.data.clone()).collect();
                let Some(ds) = ds else {
                    return Err(
                        cx.err("start, limit and delta must be constants; dlc shapes are static")
                    );
                };
                if let Some(i) = ds.iter().position(|d| d.values.len() != 1) {
                    return Err(cx.err(format!(
                        "input {i} holds {} elements; start, limit and delta are scalars",
                        ds[i].values.len()
                    )));
                }
                let (start, limit, delta) = (ds[0].values[0], ds[1].values[0], ds[2].values[0]);
                if delta == 0.0 {
                    return Err(cx.err("delta is zero"));
                }
                let n = ((limit - start) / delta).ceil().max(0.0) as usize;
                if n > FOLD_LIMIT * 16 {
                    return Err(cx.err(format!("the range has {n} elements")));
                }
                let dtype = ds[0].dtype;
                let v = (0..n)
                    .map(|i| dtype.round(start + i as f64 * delta))
                    .collect();
                Data::new(dtype, vec![n], v)
            }
            _ => return Ok(None),
        }))
    }

    /// The nodes that fold when every input is known and small: none when
    /// one is not, or the node does not fold.
    fn fold_known(&mut self, cx: &Cx<'_>) -> R<Option<Data>> {
        let op = cx.op();
        // The rest fold only when every input is known and small.
        let inputs: Vec<Option<Val>> = (0..cx.node.input.len())
            .map(|i| self.input(cx, i))
            .collect();
        if inputs.is_empty() {
            return Ok(None);
        }
        let mut ds = Vec::new();
        for v in &inputs {
            match v {
                Some(Val { data: Some(d), .. }) if d.len() <= FOLD_LIMIT => {
                    ds.push(Some(d.clone()))
                }
                None => ds.push(None),
                _ => return Ok(None),
            }
        }
        let Some(x) = ds[0].clone() else {
            return Ok(None);
        };
        Ok(match op {
            "Identity" => Some(x),
            "Cast" => {
                let to = dtype_of(cx.int("to", 0) as i32);
                to.map(|t| {
                    Data::new(
                        t,
                        x.shape.clone(),
                        x.values
                            .iter()
                            .map(|&v| cast_value(v, x.dtype, t))
                            .collect(),
                    )
                })
            }
            "Neg" => Some(Data::new(
                x.dtype,
                x.shape.clone(),
                x.values.iter().map(|v| -v).collect(),
            )),
            "Not" => Some(Data::new(
                x.dtype,
                x.shape.clone(),
                x.values
                    .iter()
                    .map(|&v| f64::from(u8::from(v == 0.0)))
                    .collect(),
            )),
            "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Mod" | "Equal" | "Less"
            | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or"
                if ds.len() == 2 && !(op == "Mod" && cx.int("fmod", 0) != 0) =>
            {
                fold_binary_data(cx, op, &x, ds[1].as_ref())?
            }
            "Where" if ds.len() == 3 => fold_where(cx, &x, ds[1].as_ref(), ds[2].as_ref())?,
            "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
                let shape = self.reshape_target(cx)?;
                Some(Data { shape, ..x })
            }
            "Concat" => fold_concat(cx, &x, ds)?,
            "Gather" => fold_gather(cx, &x, ds.get(1).cloned().flatten())?,
            "Transpose" => {
                // Output element `o` is input element `i` with `i[perm[a]] =
                // o[a]` (Swin's window padding transposes its pads).
                let perm = transpose_perm(cx, x.shape.len())?;
                let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
                let st = strides(&x.shape);
                Some(gather_data(&x, shape, |o| {
                    o.iter().zip(&perm).map(|(&i, &p)| i * st[p]).sum()
                }))
            }
            "Slice" => {
                let spec = self.slice_spec(cx, &x.shape)?;
                let st = strides(&x.shape);
                let shape: Vec<usize> = spec.iter().map(|s| s.2).collect();
                Some(gather_data(&x, shape, |o| {
                    (0..o.len())
                        .map(|a| ((spec[a].0 + spec[a].1 * o[a] as i64) as usize) * st[a])
                        .sum()
                }))
            }
            _ => None,
        })
    }

    fn identity(&mut self, cx: &Cx<'_>) -> R<()> {
        let x = self.need(cx, 0)?;
        if cx.op() == "Dropout" {
            // Before opset 12 the ratio is an attribute (and there is no
            // training mode).
            cx.allow(if cx.opset < 12 {
                &["seed", "ratio"]
            } else {
                &["seed"]
            })?;
            let constant = |v: Option<Val>, default: f64| match v {
                None => Some(default),
                Some(v) => v.data.and_then(|d| d.values.first().copied()),
            };
            let training = constant(self.input(cx, 2), 0.0);
            let ratio = constant(self.input(cx, 1), 0.5);
            // Training with ratio 0 drops nothing; any other training
            // drops at random.
            if training != Some(0.0) && ratio != Some(0.0) {
                return Err(cx.err(
                    "training_mode must be a constant false (or the ratio a constant 0); dlc runs inference",
                ));
            }
            if cx.node.output.get(1).is_some_and(|o| !o.is_empty()) {
                let n = numel(&x.shape);
                self.bind_data(cx, 1, Data::new(DType::Bool, x.shape.clone(), vec![1.0; n]))?;
            }
        }
        self.alias(cx, 0, x);
        Ok(())
    }

    fn unary(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[])?;
        let x = self.need(cx, 0)?;
        // ONNX's name, lower-cased, is the language's built-in (and the
        // scalar op's name, which says whether it takes integers).
        let f = cx.op().to_ascii_lowercase();
        let Some(u) = dlc_core::scalar::UnaryOp::from_name(&f) else {
            return Err(cx.err("has no element-wise built-in of that name"));
        };
        if !u.accepts_int() {
            cx.float_input(&x)?;
        } else if x.dtype == DType::Bool {
            return Err(cx.err("is not defined on bool"));
        }
        let ex = self.e(cx, 0)?;
        let expr = if f == "neg" {
            format!("-{ex}")
        } else {
            format!("{f}({ex})")
        };
        self.bind(cx, 0, expr, x.dtype, x.shape)
    }

    /// Activations written as compositions of built-ins.
    fn activation(&mut self, cx: &Cx<'_>) -> R<()> {
        let x = self.need(cx, 0)?;
        let op = cx.op();
        if op == "Not" {
            cx.allow(&[])?;
            if x.dtype != DType::Bool {
                return Err(cx.err("needs a bool input"));
            }
            let ex = self.e(cx, 0)?;
            return self.bind(cx, 0, format!("{ex} == false"), DType::Bool, x.shape);
        }
        cx.float_input(&x)?;
        let dt = x.dtype;
        let l = |v: f64| literal(v, dt);
        let ex = self.e(cx, 0)?;
        let (expr, out) = match op {
            "LeakyRelu" => {
                cx.allow(&["alpha"])?;
                let a = cx.float("alpha", 0.01);
                (format!("where({ex} < 0.0, {ex} * {}, {ex})", l(a)), dt)
            }
            "Elu" => {
                cx.allow(&["alpha"])?;
                let a = cx.float("alpha", 1.0);
                (
                    format!("where({ex} < 0.0, (exp({ex}) - 1.0) * {}, {ex})", l(a)),
                    dt,
                )
            }
            "Celu" => {
                cx.allow(&["alpha"])?;
                let a = cx.float("alpha", 1.0);
                (
                    format!(
                        "max({ex}, 0.0) + min((exp({ex} / {a}) - 1.0) * {a}, 0.0)",
                        a = l(a)
                    ),
                    dt,
                )
            }
            "Selu" => {
                cx.allow(&["alpha", "gamma"])?;
                let a = cx.float("alpha", 1.673_263_192_176_818_8);
                let g = cx.float("gamma", 1.050_701_022_148_132_3);
                (
                    format!(
                        "where({ex} <= 0.0, (exp({ex}) * {a} - {a}) * {g}, {ex} * {g})",
                        a = l(a),
                        g = l(g)
                    ),
                    dt,
                )
            }
            "Softplus" => {
                cx.allow(&[])?;
                (format!("log(exp({ex}) + 1.0)"), dt)
            }
            "Softsign" => {
                cx.allow(&[])?;
                (format!("{ex} / (abs({ex}) + 1.0)"), dt)
            }
            "HardSigmoid" => {
                cx.allow(&["alpha", "beta"])?;
                let (a, b) = (cx.float("alpha", 0.2), cx.float("beta", 0.5));
                (
                    format!("max(min({ex} * {} + {}, 1.0), 0.0)", l(a), l(b)),
                    dt,
                )
            }
            "HardSwish" => {
                cx.allow(&[])?;
                (
                    format!("{ex} * max(min({ex} * {} + 0.5, 1.0), 0.0)", l(1.0 / 6.0)),
                    dt,
                )
            }
            "Mish" => {
                cx.allow(&[])?;
                (format!("{ex} * tanh(log(exp({ex}) + 1.0))"), dt)
            }
            "Swish" => {
                cx.allow(&["alpha"])?;
                let a = cx.float("alpha", 1.0);
                (format!("{ex} * sigmoid({ex} * {})", l(a)), dt)
            }
            "ThresholdedRelu" => {
                cx.allow(&["alpha"])?;
                let a = cx.float("alpha", 1.0);
                (format!("where({ex} > {}, {ex}, 0.0)", l(a)), dt)
            }
            "Gelu" => {
                cx.allow(&["approximate"])?;
                match cx.string("approximate", "none").as_str() {
                    "tanh" => (format!("gelu({ex})"), dt),
                    "none" => (
                        format!(
                            "{ex} * 0.5 * (erf({ex} * {}) + 1.0)",
                            l(std::f64::consts::FRAC_1_SQRT_2)
                        ),
                        dt,
                    ),
                    other => return Err(cx.err(format!("approximate `{other}` is not supported"))),
                }
            }
            "IsNaN" => {
                cx.allow(&[])?;
                (format!("{ex} != {ex}"), DType::Bool)
            }
            "IsInf" => {
                cx.allow(&["detect_negative", "detect_positive"])?;
                let (neg, pos) = (
                    cx.int("detect_negative", 1) != 0,
                    cx.int("detect_positive", 1) != 0,
                );
                let inf = literal(f64::INFINITY, dt);
                let e = match (neg, pos) {
                    (true, true) => format!("abs({ex}) == {inf}"),
                    (false, true) => format!("{ex} == {inf}"),
                    (true, false) => format!("{ex} == -{inf}"),
                    (false, false) => format!("abs({ex}) < -1.0"),
                };
                (e, DType::Bool)
            }
            _ => return Err(cx.err("this operator is not supported yet")),
        };
        self.bind(cx, 0, expr, out, x.shape)
    }

    fn binary(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[])?;
        let (a, b) = (self.need(cx, 0)?, self.need(cx, 1)?);
        let op = cx.op();
        let shape = broadcast(&a.shape, &b.shape).ok_or_else(|| {
            cx.err(format!(
                "shapes {} and {} do not broadcast",
                shape_text(&a.shape),
                shape_text(&b.shape)
            ))
        })?;
        let (ea, mut eb) = (self.e(cx, 0)?, self.e(cx, 1)?);
        if op == "Pow" {
            if !a.dtype.is_int() {
                cx.float_input(&a)?;
            }
            if b.dtype == DType::Bool {
                return Err(cx.err("the exponent cannot be bool"));
            }
            if a.dtype.is_int() {
                // Integer powers in f64 (exact for every result an i32
                // holds), truncated back to the base's type.
                let expr = format!("cast(pow(cast({ea}, f64), cast({eb}, f64)), {})", a.dtype);
                return self.bind(cx, 0, expr, a.dtype, shape);
            }
            if b.dtype != a.dtype {
                eb = format!("cast({eb}, {})", a.dtype);
            }
            return self.bind(cx, 0, format!("pow({ea}, {eb})"), a.dtype, shape);
        }
        if a.dtype != b.dtype {
            return Err(cx.err(format!(
                "operands differ in element type: {} and {}",
                a.dtype, b.dtype
            )));
        }
        let logical = matches!(op, "And" | "Or" | "Xor");
        if logical != (a.dtype == DType::Bool) {
            return Err(cx.err(format!("is not defined on {}", a.dtype)));
        }
        let (expr, dt) = match op {
            "Add" => (format!("{ea} + {eb}"), a.dtype),
            "Sub" => (format!("{ea} - {eb}"), a.dtype),
            "Mul" => (format!("{ea} * {eb}"), a.dtype),
            "Div" if a.dtype.is_float() => (format!("{ea} / {eb}"), a.dtype),
            // ONNX integer division truncates; dlc's floors.
            "Div" => (
                format!(
                    "where({ea} - {ea} / {eb} * {eb} == 0, {ea} / {eb}, where(({ea} < 0) == ({eb} < 0), {ea} / {eb}, {ea} / {eb} + 1))"
                ),
                a.dtype,
            ),
            "PRelu" => (format!("where({ea} < 0.0, {ea} * {eb}, {ea})"), a.dtype),
            "Equal" => (format!("{ea} == {eb}"), DType::Bool),
            "Less" => (format!("{ea} < {eb}"), DType::Bool),
            "Greater" => (format!("{ea} > {eb}"), DType::Bool),
            "LessOrEqual" => (format!("{ea} <= {eb}"), DType::Bool),
            "GreaterOrEqual" => (format!("{ea} >= {eb}"), DType::Bool),
            "And" => (format!("where({ea}, {eb}, false)"), DType::Bool),
            "Or" => (format!("where({ea}, true, {eb})"), DType::Bool),
            "Xor" => (format!("{ea} != {eb}"), DType::Bool),
            _ => return Err(cx.err("this operator is not supported yet")),
        };
        if op == "PRelu" {
            cx.float_input(&a)?;
            if shape != a.shape {
                return Err(cx.err("the slope must broadcast to the input's shape"));
            }
        }
        if a.dtype == DType::Bool && !logical && !matches!(op, "Equal") {
            return Err(cx.err("is not defined on bool"));
        }
        self.bind(cx, 0, expr, dt, shape)
    }

    /// The bitwise operators and shifts of integers.
    fn bitwise(&mut self, cx: &Cx<'_>) -> R<()> {
        let op = cx.op();
        cx.allow(if op == "BitShift" {
            &["direction"]
        } else {
            &[]
        })?;
        let a = self.need(cx, 0)?;
        if !a.dtype.is_int() {
            return Err(cx.err(format!("is not defined on {}", a.dtype)));
        }
        let ea = self.e(cx, 0)?;
        if op == "BitwiseNot" {
            // Exclusive or with all ones: -1 in a signed type, the maximum
            // in an unsigned one (u64's has no literal: -1 cast to it).
            let ones = match a.dtype {
                DType::U64 => "cast(-1, u64)".to_string(),
                d if d.is_unsigned() => literal(d.int_max().unwrap_or(0.0), d),
                _ => "-1".to_string(),
            };
            return self.bind(cx, 0, format!("bitxor({ea}, {ones})"), a.dtype, a.shape);
        }
        let b = self.need(cx, 1)?;
        if b.dtype != a.dtype {
            return Err(cx.err(format!(
                "operands differ in element type: {} and {}",
                a.dtype, b.dtype
            )));
        }
        let shape = broadcast(&a.shape, &b.shape).ok_or_else(|| {
            cx.err(format!(
                "shapes {} and {} do not broadcast",
                shape_text(&a.shape),
                shape_text(&b.shape)
            ))
        })?;
        let f = match op {
            "BitwiseAnd" => "bitand",
            "BitwiseOr" => "bitor",
            "BitwiseXor" => "bitxor",
            _ => match cx.string("direction", "").as_str() {
                "LEFT" => "shl",
                "RIGHT" => "shr",
                other => {
                    return Err(cx.err(format!(
                        "direction `{other}` is not supported (LEFT or RIGHT)"
                    )));
                }
            },
        };
        let eb = self.e(cx, 1)?;
        self.bind(cx, 0, format!("{f}({ea}, {eb})"), a.dtype, shape)
    }

    fn variadic(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[])?;
        let n = cx.node.input.len();
        if n == 0 {
            return Err(cx.err("needs at least one input"));
        }
        let first = self.need(cx, 0)?;
        let mut shape = first.shape.clone();
        let mut expr = self.e(cx, 0)?;
        for i in 1..n {
            let v = self.need(cx, i)?;
            if v.dtype != first.dtype {
                return Err(cx.err("inputs differ in element type"));
            }
            shape = broadcast(&shape, &v.shape).ok_or_else(|| cx.err("inputs do not broadcast"))?;
            let ev = self.e(cx, i)?;
            expr = match cx.op() {
                "Max" => format!("max({expr}, {ev})"),
                "Min" => format!("min({expr}, {ev})"),
                _ => format!("{expr} + {ev}"),
            };
        }
        if cx.op() == "Mean" {
            cx.float_input(&first)?;
            expr = format!("({expr}) / {}", literal(n as f64, first.dtype));
        }
        if first.dtype == DType::Bool {
            return Err(cx.err("is not defined on bool"));
        }
        if n == 1 && shape == first.shape {
            self.alias(cx, 0, first);
            return Ok(());
        }
        self.bind(cx, 0, expr, first.dtype, shape)
    }

    fn clip(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[])?;
        let x = self.need(cx, 0)?;
        if x.dtype == DType::Bool {
            return Err(cx.err("is not defined on bool"));
        }
        self.check_operand(cx, 1, x.dtype, &[], true)?;
        self.check_operand(cx, 2, x.dtype, &[], true)?;
        let mut expr = self.e(cx, 0)?;
        if let Some(lo) = self.input(cx, 1) {
            if !lo.shape.is_empty() {
                return Err(cx.err("min must be a scalar"));
            }
            let e = self.e(cx, 1)?;
            expr = format!("max({expr}, {e})");
        }
        if let Some(hi) = self.input(cx, 2) {
            if !hi.shape.is_empty() {
                return Err(cx.err("max must be a scalar"));
            }
            let e = self.e(cx, 2)?;
            expr = format!("min({expr}, {e})");
        }
        self.bind(cx, 0, expr, x.dtype, x.shape)
    }

    /// A scale or zero point (input `i`) of a (de)quantization of `x`, as
    /// an expression that broadcasts to `x`: per tensor (one element), per
    /// axis (one per element of `axis`) or per block (`x`'s shape with
    /// `axis` cut into blocks of `block` elements).
    fn quant_param(&mut self, cx: &Cx<'_>, i: usize, x: &Val, block: usize) -> R<String> {
        let p = self.need(cx, i)?;
        let e = self.e(cx, i)?;
        let r = x.shape.len();
        if numel(&p.shape) == 1 && p.shape.len() <= 1 && block == 0 {
            return Ok(format!("reshape({e}, [])"));
        }
        let axis = cx.axis(cx.int("axis", 1), r)?;
        let n = x.shape[axis];
        if block == 0 {
            if p.shape != [n] {
                return Err(cx.err(format!(
                    "input {i} has shape {}; per-axis parameters along axis {axis} have shape [{n}]",
                    shape_text(&p.shape)
                )));
            }
            let mut s = vec![n];
            s.extend(std::iter::repeat_n(1, r - axis - 1));
            return Ok(format!("reshape({e}, {})", shape_text(&s)));
        }
        let blocks = n.div_ceil(block);
        let mut want = x.shape.clone();
        want[axis] = blocks;
        if p.shape != want {
            return Err(cx.err(format!(
                "input {i} has shape {}; blocks of {block} along axis {axis} need {}",
                shape_text(&p.shape),
                shape_text(&want)
            )));
        }
        // Each block's parameter repeated over the block, cut to `n`.
        let mut split = want.clone();
        split.insert(axis + 1, 1);
        let mut wide = split.clone();
        wide[axis + 1] = block;
        let mut joined = want;
        joined[axis] = blocks * block;
        let mut expr = format!(
            "reshape(broadcast(reshape({e}, {}), {}), {})",
            shape_text(&split),
            shape_text(&wide),
            shape_text(&joined)
        );
        if blocks * block != n {
            expr = format!("slice({expr}, axis={axis}, start=0, end={n})");
        }
        Ok(expr)
    }

    /// The `block_size` attribute (0 for per-tensor and per-axis).
    fn quant_block(cx: &Cx<'_>) -> R<usize> {
        let b = cx.int("block_size", 0);
        if !(0..=MAX_ATTR).contains(&b) {
            return Err(cx.err(format!("block_size = {b} is not supported")));
        }
        Ok(b as usize)
    }

    /// `DynamicQuantizeLinear`: u8 quantization of `x` with the scale and
    /// zero point that map its range (widened to hold 0) onto 0..255.
    fn dynamic_quantize(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[])?;
        let x = self.need(cx, 0)?;
        if x.dtype != DType::F32 {
            return Err(cx.err(format!("input 0 is {}; it must be f32", x.dtype)));
        }
        let ex = self.e(cx, 0)?;
        let hi = self.fresh("range_max");
        let lo = self.fresh("range_min");
        let sc = self.fresh("scale");
        let zp = self.fresh("zero_point");
        self.lines.push(format!("let {hi} = max(max({ex}), 0.0);"));
        self.lines.push(format!("let {lo} = min(min({ex}), 0.0);"));
        self.lines.push(format!(
            "let {sc} = where({hi} == {lo}, 1.0, {hi} - {lo}) / 255.0;"
        ));
        self.lines.push(format!(
            "let {zp} = round(min(max(0.0 - {lo} / {sc}, 0.0), 255.0));"
        ));
        self.bind(
            cx,
            0,
            format!("cast(min(max(round({ex} / {sc}) + {zp}, 0.0), 255.0), u8)"),
            DType::U8,
            x.shape,
        )?;
        self.bind(cx, 1, sc, DType::F32, vec![])?;
        self.bind(cx, 2, format!("cast({zp}, u8)"), DType::U8, vec![])
    }

    /// An input of an integer product minus its zero point, in i32 (a zero
    /// point per row of a matrix `[M]` or per filter `[M]` is reshaped to
    /// `per`, so it broadcasts). Returns the importer's name for it.
    fn centered(&mut self, cx: &Cx<'_>, i: usize, z: usize, per: &[usize]) -> R<String> {
        let v = self.need(cx, i)?;
        if !matches!(v.dtype, DType::I8 | DType::U8) {
            return Err(cx.err(format!("input {i} is {}; it must be i8 or u8", v.dtype)));
        }
        let mut expr = format!("cast({}, i32)", self.e(cx, i)?);
        if let Some(zp) = self.input(cx, z) {
            if zp.dtype != v.dtype {
                return Err(cx.err(format!(
                    "the zero point (input {z}) is {}, its operand {}",
                    zp.dtype, v.dtype
                )));
            }
            let ez = self.e(cx, z)?;
            let ez = if numel(&zp.shape) == 1 {
                format!("reshape({ez}, [])")
            } else if per.first().is_some_and(|&m| zp.shape == [m]) {
                format!("reshape({ez}, {})", shape_text(per))
            } else if zp.shape.len() == 1 && v.shape.last() == zp.shape.first() {
                ez
            } else {
                return Err(cx.err(format!(
                    "zero point (input {z}) of shape {} does not fit its operand {}",
                    shape_text(&zp.shape),
                    shape_text(&v.shape)
                )));
            };
            expr = format!("{expr} - cast({ez}, i32)");
        }
        Ok(self.define("centered", expr, DType::I32, v.shape))
    }

    /// `MatMulInteger` and `ConvInteger`: the product of the operands
    /// minus their zero points, exact in i32.
    fn integer_product(&mut self, cx: &Cx<'_>) -> R<()> {
        let conv = cx.op() == "ConvInteger";
        let attrs: &[&str] = if conv { &CONV_ATTRS } else { &[] };
        cx.allow(attrs)?;
        let (a, b) = (self.need(cx, 0)?, self.need(cx, 1)?);
        if a.shape.is_empty() || b.shape.is_empty() {
            return Err(cx.err("the operands must not be scalars"));
        }
        // A per-row zero point of A (`[M]`, M its second-to-last extent),
        // a per-filter one of W (`[M]` over `[M, C, k...]`).
        let per_a: Vec<usize> = if conv || a.shape.len() < 2 {
            vec![]
        } else {
            vec![a.shape[a.shape.len() - 2], 1]
        };
        let per_b: Vec<usize> = if conv { per_filter(&b.shape) } else { vec![] };
        let ea = self.centered(cx, 0, 2, &per_a)?;
        let eb = self.centered(cx, 1, 3, &per_b)?;
        self.rewrite(
            cx,
            if conv { "Conv" } else { "MatMul" },
            vec![ea, eb],
            attrs,
        )
    }

    /// `QLinearMatMul` and `QLinearConv`: the integer product of the
    /// operands minus their zero points, scaled by `a_scale * b_scale /
    /// y_scale` in f64 (as ONNX's reference promotes it), rounded to even,
    /// plus the output's zero point, saturated to its type.
    fn qlinear_product(&mut self, cx: &Cx<'_>) -> R<()> {
        let conv = cx.op() == "QLinearConv";
        let attrs: &[&str] = if conv { &CONV_ATTRS } else { &[] };
        cx.allow(attrs)?;
        let (a, b) = (self.need(cx, 0)?, self.need(cx, 3)?);
        if a.shape.is_empty() || b.shape.is_empty() {
            return Err(cx.err("the operands must not be scalars"));
        }
        let per_b: Vec<usize> = if conv { per_filter(&b.shape) } else { vec![] };
        let ea = self.centered(cx, 0, 2, &[])?;
        let eb = self.centered(cx, 3, 5, &per_b)?;
        let mut inputs = vec![ea, eb];
        if conv && let Some(bias) = self.input(cx, 8) {
            if bias.dtype != DType::I32 {
                return Err(cx.err(format!("the bias is {}; it must be i32", bias.dtype)));
            }
            inputs.push(cx.node.input[8].clone());
        }
        // The product, as a node of its own whose output is ours.
        let product = self.sub_node(
            cx,
            if conv { "Conv" } else { "MatMul" },
            inputs,
            kept_attributes(cx, attrs),
        )?;
        let p = self
            .vals
            .get(&product)
            .cloned()
            .ok_or_else(|| cx.err("no product"))?;
        let ep = self.var_of(&product)?;
        // Scales: per tensor, or per filter (`[M]`) for the weights of a
        // convolution.
        let st = self.need(cx, 1)?.dtype;
        cx.float_input(&self.need(cx, 1)?)?;
        let mut scale = |i: usize, per: &[usize]| -> R<String> {
            let s = self.need(cx, i)?;
            if s.dtype != st {
                return Err(cx.err(format!(
                    "scale (input {i}) is {}, input 1 {st}; they must be of one type",
                    s.dtype
                )));
            }
            let e = self.e(cx, i)?;
            if numel(&s.shape) == 1 {
                Ok(format!("reshape({e}, [])"))
            } else if per.first().is_some_and(|&m| s.shape == [m]) {
                Ok(format!("reshape({e}, {})", shape_text(per)))
            } else {
                Err(cx.err(format!(
                    "scale (input {i}) of shape {} is not supported (per tensor{})",
                    shape_text(&s.shape),
                    if conv { " or per filter" } else { "" }
                )))
            }
        };
        let (sa, sb, sy) = (scale(1, &[])?, scale(4, &per_b)?, scale(6, &[])?);
        let out = match self.input(cx, 7) {
            Some(z) => z.dtype,
            None => a.dtype,
        };
        let (Some(lo), Some(hi)) = (out.int_min(), out.int_max()) else {
            return Err(cx.err(format!("output type {out} is not an integer")));
        };
        let mut v = format!("cast({ep}, f64) * cast({sa} * {sb} / {sy}, f64)");
        if self.input(cx, 7).is_some() {
            let ez = self.e(cx, 7)?;
            v = format!("{v} + cast(reshape({ez}, []), f64)");
        }
        let w = DType::F64;
        self.bind(
            cx,
            0,
            format!(
                "cast(round(min(max({v}, {}), {})), {out})",
                literal(lo, w),
                literal(hi, w)
            ),
            out,
            p.shape,
        )
    }

    /// `DequantizeLinear`: `(x - zero_point) * scale`, in f32 and rounded
    /// once to the scale's type.
    fn dequantize(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis", "block_size", "output_dtype"])?;
        let x = self.need(cx, 0)?;
        let scale = self.need(cx, 1)?;
        if !x.dtype.is_int() {
            return Err(cx.err(format!("input 0 is {}; dlc dequantizes integers", x.dtype)));
        }
        cx.float_input(&scale)?;
        let out = match cx.int("output_dtype", 0) as i32 {
            0 => scale.dtype,
            code => dtype_of(code)
                .filter(|&d| d == scale.dtype)
                .ok_or_else(|| {
                    cx.err(format!(
                        "output_dtype {} differs from the scale's type {}",
                        onnx_type_name(code),
                        scale.dtype
                    ))
                })?,
        };
        let block = Self::quant_block(cx)?;
        let w = DType::F32;
        let ex = self.e(cx, 0)?;
        let es = self.quant_param(cx, 1, &x, block)?;
        let mut v = format!("cast({ex}, {w})");
        if let Some(zp) = self.input(cx, 2) {
            if zp.dtype != x.dtype {
                return Err(cx.err(format!(
                    "the zero point is {}, the input {}",
                    zp.dtype, x.dtype
                )));
            }
            let ez = self.quant_param(cx, 2, &x, block)?;
            v = format!("({v} - cast({ez}, {w}))");
        }
        let scaled = if scale.dtype == w {
            format!("{v} * {es}")
        } else {
            format!("{v} * cast({es}, {w})")
        };
        let expr = if out == w {
            scaled
        } else {
            format!("cast({scaled}, {out})")
        };
        self.bind(cx, 0, expr, out, x.shape)
    }

    /// `QuantizeLinear`: `saturate(round(x / scale) + zero_point)`, ties
    /// to even, to the range of the zero point's type (u8 without one).
    fn quantize(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[
            "axis",
            "block_size",
            "output_dtype",
            "precision",
            "saturate",
        ])?;
        let x = self.need(cx, 0)?;
        let scale = self.need(cx, 1)?;
        cx.float_input(&scale)?;
        if !(x.dtype.is_float() || x.dtype == DType::I32) {
            return Err(cx.err(format!("input 0 is {}; it must be a float or i32", x.dtype)));
        }
        let zp = self.input(cx, 2);
        let named = match cx.int("output_dtype", 0) as i32 {
            0 => None,
            code => Some(dtype_of(code).ok_or_else(|| {
                cx.err(format!(
                    "output_dtype {} is not supported ({})",
                    onnx_type_name(code),
                    crate::data::SUPPORTED_TYPES
                ))
            })?),
        };
        let out = match (&zp, named) {
            (Some(z), Some(d)) if z.dtype != d => {
                return Err(cx.err(format!(
                    "output_dtype {d} differs from the zero point's type {}",
                    z.dtype
                )));
            }
            (Some(z), _) => z.dtype,
            (None, Some(d)) => d,
            (None, None) => DType::U8,
        };
        let (Some(lo), Some(hi)) = (out.int_min(), out.int_max()) else {
            return Err(cx.err(format!(
                "quantizing to {out} is not supported (integers only)"
            )));
        };
        // The division is in the scale's type (or `precision`'s), as ONNX
        // defines it; the rest in f32, which holds every sum exactly.
        let div = match cx.int("precision", 0) as i32 {
            0 => scale.dtype,
            code => dtype_of(code).filter(|d| d.is_float()).ok_or_else(|| {
                cx.err(format!(
                    "precision {} is not supported",
                    onnx_type_name(code)
                ))
            })?,
        };
        let block = Self::quant_block(cx)?;
        let ex = self.e(cx, 0)?;
        let es = self.quant_param(cx, 1, &x, block)?;
        let as_div = |e: String, d: DType| {
            if d == div {
                e
            } else {
                format!("cast({e}, {div})")
            }
        };
        let w = DType::F32;
        let q = format!(
            "round({} / {})",
            as_div(ex, x.dtype),
            as_div(es, scale.dtype)
        );
        let mut v = if div == w {
            q
        } else {
            format!("cast({q}, {w})")
        };
        if let Some(z) = &zp {
            if z.dtype != out {
                return Err(cx.err("the zero point's type is not the output's"));
            }
            let ez = self.quant_param(cx, 2, &x, block)?;
            v = format!("{v} + cast({ez}, {w})");
        }
        let expr = format!(
            "cast(min(max({v}, {}), {}), {out})",
            literal(lo, w),
            literal(hi, w)
        );
        self.bind(cx, 0, expr, out, x.shape)
    }

    fn cast(&mut self, cx: &Cx<'_>) -> R<()> {
        let x = self.need(cx, 0)?;
        let to = if cx.op() == "CastLike" {
            cx.allow(&["saturate"])?;
            self.need(cx, 1)?.dtype
        } else {
            cx.allow(&["to", "saturate", "round_mode"])?;
            let code = cx.int("to", 0) as i32;
            dtype_of(code).ok_or_else(|| {
                cx.err(format!(
                    "element type {} is not supported ({})",
                    onnx_type_name(code),
                    crate::data::SUPPORTED_TYPES
                ))
            })?
        };
        if to == x.dtype {
            self.alias(cx, 0, x);
            return Ok(());
        }
        let ex = self.e(cx, 0)?;
        self.bind(cx, 0, format!("cast({ex}, {to})"), to, x.shape)
    }

    fn matmul(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[])?;
        let (a, b) = (self.need(cx, 0)?, self.need(cx, 1)?);
        if a.dtype != b.dtype || a.dtype == DType::Bool {
            return Err(cx.err(format!("operands are {} and {}", a.dtype, b.dtype)));
        }
        if a.shape.is_empty() || b.shape.is_empty() {
            return Err(cx.err("the operands must not be scalars"));
        }
        let (mut sa, mut sb) = (a.shape.clone(), b.shape.clone());
        let (va, vb) = (sa.len() == 1, sb.len() == 1);
        if va {
            sa.insert(0, 1);
        }
        if vb {
            sb.push(1);
        }
        let (ra, rb) = (sa.len(), sb.len());
        if sa[ra - 1] != sb[rb - 2] {
            return Err(cx.err(format!(
                "inner dimensions differ: {} @ {}",
                shape_text(&a.shape),
                shape_text(&b.shape)
            )));
        }
        let mut shape = broadcast(&sa[..ra - 2], &sb[..rb - 2])
            .ok_or_else(|| cx.err("batch dimensions do not broadcast"))?;
        if !va {
            shape.push(sa[ra - 2]);
        }
        if !vb {
            shape.push(sb[rb - 1]);
        }
        let (ea, eb) = (self.e(cx, 0)?, self.e(cx, 1)?);
        self.bind(cx, 0, format!("{ea} @ {eb}"), a.dtype, shape)
    }

    fn gemm(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["alpha", "beta", "transA", "transB"])?;
        let (a, b) = (self.need(cx, 0)?, self.need(cx, 1)?);
        if a.shape.len() != 2 || b.shape.len() != 2 {
            return Err(cx.err("A and B must be matrices"));
        }
        cx.float_input(&a)?;
        let (ta, tb) = (cx.int("transA", 0) != 0, cx.int("transB", 0) != 0);
        let (m, k) = if ta {
            (a.shape[1], a.shape[0])
        } else {
            (a.shape[0], a.shape[1])
        };
        let (k2, n) = if tb {
            (b.shape[1], b.shape[0])
        } else {
            (b.shape[0], b.shape[1])
        };
        if k != k2 {
            return Err(cx.err(format!("inner dimensions differ: {k} and {k2}")));
        }
        let (mut ea, mut eb) = (self.e(cx, 0)?, self.e(cx, 1)?);
        if ta {
            ea = format!("transpose({ea})");
        }
        if tb {
            eb = format!("transpose({eb})");
        }
        let (alpha, beta) = (cx.float("alpha", 1.0), cx.float("beta", 1.0));
        let mut expr = format!("{ea} @ {eb}");
        if alpha != 1.0 {
            expr = format!("({expr}) * {}", literal(alpha, a.dtype));
        }
        if let Some(c) = self.input(cx, 2) {
            if c.dtype != a.dtype || broadcast(&c.shape, &[m, n]).as_deref() != Some(&[m, n][..]) {
                return Err(cx.err(format!(
                    "C {} does not broadcast to [{m}, {n}]",
                    shape_text(&c.shape)
                )));
            }
            let ec = self.e(cx, 2)?;
            if beta == 1.0 {
                expr = format!("{expr} + {ec}");
            } else if beta != 0.0 {
                expr = format!("{expr} + {ec} * {}", literal(beta, a.dtype));
            }
        }
        self.bind(cx, 0, expr, a.dtype, vec![m, n])
    }

    fn softmax(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis"])?;
        let x = self.need(cx, 0)?;
        cx.float_input(&x)?;
        let axis = cx.axis(cx.int("axis", -1), x.shape.len())?;
        let ex = self.e(cx, 0)?;
        let expr = if cx.op() == "Softmax" {
            format!("softmax({ex}, axis={axis})")
        } else {
            let m = self.fresh("max");
            self.lines
                .push(format!("let {m} = max({ex}, axis={axis}, keepdims=true);"));
            format!("{ex} - {m} - log(sum(exp({ex} - {m}), axis={axis}, keepdims=true))")
        };
        self.bind(cx, 0, expr, x.dtype, x.shape)
    }

    fn reduce(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axes", "keepdims", "noop_with_empty_axes"])?;
        let x = self.need(cx, 0)?;
        let op = cx.op();
        let axes_input = op == "ReduceSum" || cx.opset >= 18;
        let axes = if axes_input {
            if cx.attr("axes").is_some() {
                return Err(cx.err("attribute `axes` is an input from this opset on"));
            }
            self.ints_input(cx, 1, "axes")?
        } else {
            cx.ints("axes")
        };
        let axes = match axes {
            Some(a) if !a.is_empty() => cx.axes(&a, x.shape.len())?,
            _ if cx.int("noop_with_empty_axes", 0) != 0 => {
                self.alias(cx, 0, x);
                return Ok(());
            }
            _ => (0..x.shape.len()).collect(),
        };
        let keep = cx.int("keepdims", 1) != 0;
        let mut shape = Vec::new();
        for (i, &d) in x.shape.iter().enumerate() {
            if !axes.contains(&i) {
                shape.push(d);
            } else if keep {
                shape.push(1);
            }
        }
        let list: Vec<String> = axes.iter().map(ToString::to_string).collect();
        let args = format!("axis=[{}], keepdims={keep}", list.join(", "));
        // Max and min of bools: any and all, through u8.
        if x.dtype == DType::Bool && matches!(op, "ReduceMax" | "ReduceMin") {
            let f = if op == "ReduceMax" { "max" } else { "min" };
            let ex = self.e(cx, 0)?;
            let expr = format!("cast({f}(cast({ex}, u8), {args}), bool)");
            return self.bind(cx, 0, expr, DType::Bool, shape);
        }
        if !matches!(op, "ReduceMax" | "ReduceMin" | "ReduceSum" | "ReduceProd") {
            cx.float_input(&x)?;
        } else if x.dtype == DType::Bool {
            return Err(cx.err("is not defined on bool"));
        }
        let ex = self.e(cx, 0)?;
        let expr = match op {
            "ReduceSum" => format!("sum({ex}, {args})"),
            "ReduceMean" => format!("mean({ex}, {args})"),
            "ReduceMax" => format!("max({ex}, {args})"),
            "ReduceMin" => format!("min({ex}, {args})"),
            "ReduceProd" => format!("prod({ex}, {args})"),
            "ReduceL1" => format!("sum(abs({ex}), {args})"),
            "ReduceL2" => format!("sqrt(sum({ex} * {ex}, {args}))"),
            "ReduceSumSquare" => format!("sum({ex} * {ex}, {args})"),
            "ReduceLogSum" => format!("log(sum({ex}, {args}))"),
            _ => format!("log(sum(exp({ex}), {args}))"),
        };
        self.bind(cx, 0, expr, x.dtype, shape)
    }

    /// The result shape of Reshape, Flatten, Squeeze and Unsqueeze.
    fn reshape_target(&self, cx: &Cx<'_>) -> R<Vec<usize>> {
        let x = self.need(cx, 0)?;
        let r = x.shape.len();
        match cx.op() {
            "Reshape" => {
                cx.allow(&["allowzero"])?;
                let spec = self
                    .ints_input(cx, 1, "the shape")?
                    .ok_or_else(|| cx.err("input 1 (shape) is required"))?;
                let allowzero = cx.int("allowzero", 0) != 0;
                let mut out = Vec::with_capacity(spec.len());
                let mut infer = None;
                for (i, &d) in spec.iter().enumerate() {
                    match d {
                        -1 if infer.is_none() => {
                            infer = Some(i);
                            out.push(1);
                        }
                        0 if !allowzero => out.push(*x.shape.get(i).ok_or_else(|| {
                            cx.err(format!(
                                "shape {spec:?}: 0 at axis {i} has no input extent to copy"
                            ))
                        })?),
                        d if d > 0 => out.push(d as usize),
                        _ => return Err(cx.err(format!("shape {spec:?} is not a valid target"))),
                    }
                }
                let total = numel(&x.shape);
                if let Some(i) = infer {
                    let known = numel(&out);
                    if known == 0 || !total.is_multiple_of(known) {
                        return Err(cx.err(format!(
                            "cannot reshape {} to {spec:?}",
                            shape_text(&x.shape)
                        )));
                    }
                    out[i] = total / known;
                }
                if numel(&out) != total {
                    return Err(cx.err(format!(
                        "cannot reshape {} to {spec:?}",
                        shape_text(&x.shape)
                    )));
                }
                Ok(out)
            }
            "Flatten" => {
                cx.allow(&["axis"])?;
                let a = cx.int("axis", 1);
                let a = if a < 0 { a + r as i64 } else { a };
                if a < 0 || a > r as i64 {
                    return Err(cx.err(format!("axis {a} is out of range for rank {r}")));
                }
                let a = a as usize;
                Ok(vec![numel(&x.shape[..a]), numel(&x.shape[a..])])
            }
            "Squeeze" => {
                cx.allow(&[])?;
                let axes = match self.ints_input(cx, 1, "axes")? {
                    Some(a) => cx.axes(&a, r)?,
                    None => (0..r).filter(|&i| x.shape[i] == 1).collect(),
                };
                if let Some(&a) = axes.iter().find(|&&a| x.shape[a] != 1) {
                    return Err(cx.err(format!("axis {a} has extent {}, not 1", x.shape[a])));
                }
                Ok((0..r)
                    .filter(|i| !axes.contains(i))
                    .map(|i| x.shape[i])
                    .collect())
            }
            _ => {
                cx.allow(&[])?;
                let spec = self
                    .ints_input(cx, 1, "axes")?
                    .ok_or_else(|| cx.err("input 1 (axes) is required"))?;
                let axes = cx.axes(&spec, r + spec.len())?;
                let mut rest = x.shape.iter();
                Ok((0..r + axes.len())
                    .map(|i| {
                        if axes.contains(&i) {
                            1
                        } else {
                            *rest.next().unwrap_or(&1)
                        }
                    })
                    .collect())
            }
        }
    }

    fn reshape(&mut self, cx: &Cx<'_>) -> R<()> {
        let x = self.need(cx, 0)?;
        let shape = self.reshape_target(cx)?;
        if shape == x.shape {
            self.alias(cx, 0, x);
            return Ok(());
        }
        let ex = self.e(cx, 0)?;
        self.bind(
            cx,
            0,
            format!("reshape({ex}, {})", shape_text(&shape)),
            x.dtype,
            shape,
        )
    }

    fn transpose(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["perm"])?;
        let x = self.need(cx, 0)?;
        let perm = transpose_perm(cx, x.shape.len())?;
        let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
        let ex = self.e(cx, 0)?;
        let list: Vec<String> = perm.iter().map(ToString::to_string).collect();
        self.bind(
            cx,
            0,
            format!("transpose({ex}, [{}])", list.join(", ")),
            x.dtype,
            shape,
        )
    }

    fn concat(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis"])?;
        let first = self.need(cx, 0)?;
        let axis = cx.axis(cx.int("axis", 0), first.shape.len())?;
        let mut shape = first.shape.clone();
        shape[axis] = 0;
        let mut parts = Vec::new();
        for i in 0..cx.node.input.len() {
            let v = self.need(cx, i)?;
            let same = v.shape.len() == first.shape.len()
                && (0..v.shape.len()).all(|a| a == axis || v.shape[a] == first.shape[a]);
            if !same || v.dtype != first.dtype {
                return Err(cx.err(format!(
                    "input {i} ({}) does not fit input 0 ({}) along axis {axis}",
                    type_text(v.dtype, &v.shape),
                    type_text(first.dtype, &first.shape)
                )));
            }
            shape[axis] = shape[axis].saturating_add(v.shape[axis]);
            // An empty part adds nothing (exporters concatenate empty
            // shape slices).
            if v.shape[axis] == 0 {
                continue;
            }
            parts.push((i, self.e(cx, i)?));
        }
        if let [(i, _)] = parts[..] {
            let only = self.need(cx, i)?;
            self.alias(cx, 0, only);
            return Ok(());
        }
        let parts: Vec<String> = parts.into_iter().map(|(_, e)| e).collect();
        self.bind(
            cx,
            0,
            format!("concat([{}], axis={axis})", parts.join(", ")),
            first.dtype,
            shape,
        )
    }

    /// Per axis: first index, step, extent.
    fn slice_spec(&self, cx: &Cx<'_>, shape: &[usize]) -> R<Vec<(i64, i64, usize)>> {
        cx.allow(&[])?;
        let starts = self
            .ints_input(cx, 1, "starts")?
            .ok_or_else(|| cx.err("starts are required"))?;
        let ends = self
            .ints_input(cx, 2, "ends")?
            .ok_or_else(|| cx.err("ends are required"))?;
        let r = shape.len();
        let axes = match self.ints_input(cx, 3, "axes")? {
            Some(a) => a.iter().map(|&a| cx.axis(a, r)).collect::<R<Vec<_>>>()?,
            None if starts.len() > r => {
                return Err(cx.err(format!("{} starts for an input of rank {r}", starts.len())));
            }
            None => (0..starts.len()).collect(),
        };
        let steps = self
            .ints_input(cx, 4, "steps")?
            .unwrap_or_else(|| vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(cx.err("starts, ends, axes and steps differ in length"));
        }
        let mut spec: Vec<(i64, i64, usize)> = shape.iter().map(|&d| (0, 1, d)).collect();
        for (j, &a) in axes.iter().enumerate() {
            let d = shape[a] as i64;
            let step = steps[j];
            if step == 0 {
                return Err(cx.err("a step is zero"));
            }
            let (d, step) = (i128::from(d), i128::from(step));
            let norm = |v: i64| {
                if v < 0 {
                    i128::from(v) + d
                } else {
                    i128::from(v)
                }
            };
            let (s, e) = (norm(starts[j]), norm(ends[j]));
            let (s, e) = if step > 0 {
                (s.clamp(0, d), e.clamp(0, d))
            } else {
                (s.clamp(-1, d - 1), e.clamp(-1, d - 1))
            };
            let n = if step > 0 {
                (e - s + step - 1).max(0) / step
            } else {
                (s - e - step - 1).max(0) / -step
            };
            let (s, step) = (
                s as i64,
                step.clamp(-i128::from(MAX_ATTR), i128::from(MAX_ATTR)) as i64,
            );
            spec[a] = (s, step, n as usize);
        }
        Ok(spec)
    }

    fn slice(&mut self, cx: &Cx<'_>) -> R<()> {
        let x = self.need(cx, 0)?;
        let spec = self.slice_spec(cx, &x.shape)?;
        let shape: Vec<usize> = spec.iter().map(|s| s.2).collect();
        // An empty slice of a known tensor folds (shape arithmetic); of a
        // tensor known only at run time it would be an empty tensor.
        if let Some(a) = shape.iter().position(|&n| n == 0) {
            return Err(cx.err(format!(
                "the slice of axis {a} is empty; dlc tensors have positive extents"
            )));
        }
        let mut expr = self.e(cx, 0)?;
        if spec.iter().all(|s| s.1 == 1) {
            for (a, &(s, _, n)) in spec.iter().enumerate() {
                if n != x.shape[a] {
                    expr = format!("slice({expr}, axis={a}, start={s}, end={})", s + n as i64);
                }
            }
            if expr == self.var_of(&cx.node.input[0])? {
                self.alias(cx, 0, x);
                return Ok(());
            }
            return self.bind(cx, 0, expr, x.dtype, shape);
        }
        // Strided or reversed: a helper operator reading x[start + step * i].
        let idx: Vec<String> = (0..shape.len()).map(|a| format!("i{a}")).collect();
        let reads: Vec<String> = spec
            .iter()
            .enumerate()
            .map(|(a, &(s, st, _))| {
                let mut t = if st == 1 {
                    format!("i{a}")
                } else {
                    format!("{st} * i{a}")
                };
                if s != 0 {
                    t = format!("{t} + {s}");
                }
                t
            })
            .collect();
        let name = self.fresh("strided_slice");
        self.ops.push(format!(
            "op {name}(x: {}) -> {} {{\n    out[{}] = x[{}];\n}}",
            type_text(x.dtype, &x.shape),
            type_text(x.dtype, &shape),
            idx.join(", "),
            reads.join(", ")
        ));
        self.bind(cx, 0, format!("{name}({expr})"), x.dtype, shape)
    }

    fn split(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis", "num_outputs"])?;
        let x = self.need(cx, 0)?;
        let axis = cx.axis(cx.int("axis", 0), x.shape.len())?;
        let d = x.shape[axis];
        let outs = cx.node.output.len();
        let sizes: Vec<usize> = match self.ints_input(cx, 1, "split")? {
            Some(s) => s.iter().map(|&v| v.max(0) as usize).collect(),
            None => {
                let n = cx.int("num_outputs", outs as i64);
                if n != outs as i64 {
                    return Err(cx.err(format!("num_outputs {n} differs from the {outs} outputs")));
                }
                let n = outs.max(1);
                let chunk = d.div_ceil(n);
                (0..n)
                    .map(|i| chunk.min(d.saturating_sub(i * chunk)))
                    .collect()
            }
        };
        if sizes.iter().sum::<usize>() != d || sizes.len() != outs {
            return Err(cx.err(format!(
                "split sizes {sizes:?} do not cover extent {d} in {outs} outputs"
            )));
        }
        let ex = self.e(cx, 0)?;
        let mut start = 0;
        for (k, &n) in sizes.iter().enumerate() {
            let mut shape = x.shape.clone();
            shape[axis] = n;
            self.bind(
                cx,
                k,
                format!("slice({ex}, axis={axis}, start={start}, end={})", start + n),
                x.dtype,
                shape,
            )?;
            start += n;
        }
        Ok(())
    }

    fn expand(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[])?;
        let x = self.need(cx, 0)?;
        let spec = self
            .ints_input(cx, 1, "the shape")?
            .ok_or_else(|| cx.err("input 1 (shape) is required"))?;
        let spec: Vec<usize> = spec.iter().map(|&d| d.max(0) as usize).collect();
        let shape = broadcast(&x.shape, &spec).ok_or_else(|| {
            cx.err(format!(
                "{} does not broadcast to {spec:?}",
                shape_text(&x.shape)
            ))
        })?;
        if shape == x.shape {
            self.alias(cx, 0, x);
            return Ok(());
        }
        let ex = self.e(cx, 0)?;
        self.bind(
            cx,
            0,
            format!("broadcast({ex}, {})", shape_text(&shape)),
            x.dtype,
            shape,
        )
    }

    fn tile(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[])?;
        let x = self.need(cx, 0)?;
        let reps = self
            .ints_input(cx, 1, "repeats")?
            .ok_or_else(|| cx.err("input 1 (repeats) is required"))?;
        if reps.len() != x.shape.len() || reps.iter().any(|&r| !(1..=1024).contains(&r)) {
            return Err(cx.err(format!(
                "repeats {reps:?} must be one per axis, each from 1 to 1024"
            )));
        }
        let mut expr = self.e(cx, 0)?;
        let mut shape = x.shape.clone();
        for (a, &r) in reps.iter().enumerate() {
            if r > 1 {
                let parts = vec![expr.clone(); r as usize];
                expr = format!("concat([{}], axis={a})", parts.join(", "));
                shape[a] = shape[a].saturating_mul(r as usize);
            }
        }
        self.bind(cx, 0, expr, x.dtype, shape)
    }

    fn gather(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis"])?;
        let x = self.need(cx, 0)?;
        let axis = cx.axis(cx.int("axis", 0), x.shape.len())?;
        let Some(ind) = self.ints_input(cx, 1, "indices").ok().flatten() else {
            return self.gather_dynamic(cx, &x, axis);
        };
        let ishape = self.need(cx, 1)?.shape;
        let n = x.shape[axis] as i64;
        let ex = self.e(cx, 0)?;
        let mut parts = Vec::new();
        for &i in &ind {
            let j = if i < 0 { i + n } else { i };
            if j < 0 || j >= n {
                return Err(cx.err(format!("index {i} is out of range for extent {n}")));
            }
            parts.push(format!(
                "slice({ex}, axis={axis}, start={j}, end={})",
                j + 1
            ));
        }
        let mut shape = x.shape[..axis].to_vec();
        shape.extend(&ishape);
        shape.extend(&x.shape[axis + 1..]);
        let joined = if parts.len() == 1 {
            parts.remove(0)
        } else {
            format!("concat([{}], axis={axis})", parts.join(", "))
        };
        self.bind(
            cx,
            0,
            format!("reshape({joined}, {})", shape_text(&shape)),
            x.dtype,
            shape,
        )
    }

    /// Gather with run-time indices: the language's `gather` (the graph op
    /// `gather`), which reads only the elements it gives; a negative index
    /// counts from the end and one out of range reads zero (ONNX leaves it
    /// undefined).
    fn gather_dynamic(&mut self, cx: &Cx<'_>, x: &Val, axis: usize) -> R<()> {
        if x.dtype == DType::Bool {
            return Err(cx.err("a gather of bool with run-time indices is not supported"));
        }
        let ind = self.need(cx, 1)?;
        if !matches!(ind.dtype, DType::I32 | DType::I64) {
            return Err(cx.err(format!("indices must be i32 or i64, got {}", ind.dtype)));
        }
        let mut shape = x.shape[..axis].to_vec();
        shape.extend(&ind.shape);
        shape.extend(&x.shape[axis + 1..]);
        let (ex, ei) = (self.e(cx, 0)?, self.e(cx, 1)?);
        self.bind(
            cx,
            0,
            format!("gather({ex}, {ei}, axis={axis})"),
            x.dtype,
            shape,
        )
    }

    /// `GatherElements`: the language's `gather_elements` (a gather of
    /// the flattened data at each index's flat position).
    fn gather_elements(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis"])?;
        let (x, ind) = (self.need(cx, 0)?, self.need(cx, 1)?);
        let r = x.shape.len();
        let axis = cx.axis(cx.int("axis", 0), r)?;
        if ind.shape.len() != r || (0..r).any(|a| a != axis && ind.shape[a] > x.shape[a]) {
            return Err(cx.err(format!(
                "indices {} do not fit data {}",
                shape_text(&ind.shape),
                shape_text(&x.shape)
            )));
        }
        if x.dtype == DType::Bool {
            return Err(cx.err("a gather of bool with run-time indices is not supported"));
        }
        if !matches!(ind.dtype, DType::I32 | DType::I64) {
            return Err(cx.err(format!("indices must be i32 or i64, got {}", ind.dtype)));
        }
        let (ex, ei) = (self.e(cx, 0)?, self.e(cx, 1)?);
        self.bind(
            cx,
            0,
            format!("gather_elements({ex}, {ei}, axis={axis})"),
            x.dtype,
            ind.shape,
        )
    }

    fn rms_norm(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis", "epsilon", "stash_type"])?;
        let x = self.need(cx, 0)?;
        cx.float_input(&x)?;
        let r = x.shape.len();
        let a = cx.axis(cx.int("axis", -1), r)?;
        let axes: Vec<String> = (a..r).map(|i| i.to_string()).collect();
        let eps = cx.epsilon(1e-5)?;
        self.need(cx, 1)?;
        self.check_operand(cx, 1, x.dtype, &x.shape, false)?;
        let (ex, es) = (self.e(cx, 0)?, self.e(cx, 1)?);
        let expr = format!(
            "{ex} * rsqrt(mean({ex} * {ex}, axis=[{}], keepdims=true) + {eps}) * {es}",
            axes.join(", ")
        );
        self.bind(cx, 0, expr, x.dtype, x.shape)
    }

    fn batchnorm(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["epsilon", "momentum", "training_mode"])?;
        if cx.int("training_mode", 0) != 0 || cx.node.output.iter().skip(1).any(|o| !o.is_empty()) {
            return Err(cx.err("training mode (running statistics as outputs) is not supported; dlc runs inference"));
        }
        let x = self.need(cx, 0)?;
        cx.float_input(&x)?;
        if x.shape.len() < 2 {
            return Err(cx.err("needs an input of rank 2 or more"));
        }
        for i in 1..5 {
            self.need(cx, i)?;
            self.check_operand(cx, i, x.dtype, &[x.shape[1]], true)?;
        }
        let e: Vec<String> = (0..5).map(|i| self.e(cx, i)).collect::<R<_>>()?;
        let eps = cx.epsilon(1e-5)?;
        self.bind(
            cx,
            0,
            format!(
                "batchnorm({}, {}, {}, {}, {}, eps={eps})",
                e[0], e[3], e[4], e[1], e[2]
            ),
            x.dtype,
            x.shape,
        )
    }

    fn normalization(&mut self, cx: &Cx<'_>) -> R<()> {
        let x = self.need(cx, 0)?;
        cx.float_input(&x)?;
        let r = x.shape.len();
        if r < 2 {
            return Err(cx.err("needs an input of rank 2 or more"));
        }
        let per: Vec<usize> = match cx.op() {
            "LayerNormalization" => x.shape.clone(),
            "GroupNormalization" if cx.opset < 21 => {
                vec![cx.int("num_groups", 1).clamp(1, MAX_ATTR) as usize]
            }
            _ => vec![x.shape[1]],
        };
        let exact = cx.op() != "LayerNormalization";
        self.need(cx, 1)?;
        for i in 1..3 {
            self.check_operand(cx, i, x.dtype, &per, exact)?;
        }
        let ex = self.e(cx, 0)?;
        let es = self.e(cx, 1)?;
        let eb = match self.input(cx, 2) {
            Some(_) => Some(self.e(cx, 2)?),
            None => None,
        };
        let channel = |e: &str, c: usize| {
            let mut s = vec![c];
            s.extend(std::iter::repeat_n(1, r - 2));
            format!("reshape({e}, {})", shape_text(&s))
        };
        let expr = match cx.op() {
            "LayerNormalization" => {
                cx.allow(&["axis", "epsilon", "stash_type"])?;
                let axis = cx.axis(cx.int("axis", -1), r)?;
                let axes: Vec<String> = (axis..r).map(|a| a.to_string()).collect();
                let eps = cx.epsilon(1e-5)?;
                // The optional Mean and InvStdDev outputs, kept dimensions.
                let mut stat = x.shape.clone();
                stat[axis..].iter_mut().for_each(|d| *d = 1);
                let list = axes.join(", ");
                if cx.node.output.get(1).is_some_and(|o| !o.is_empty())
                    || cx.node.output.get(2).is_some_and(|o| !o.is_empty())
                {
                    let m = format!("mean({ex}, axis=[{list}], keepdims=true)");
                    self.bind(cx, 1, m.clone(), x.dtype, stat.clone())?;
                    let var =
                        format!("mean(({ex} - {m}) * ({ex} - {m}), axis=[{list}], keepdims=true)");
                    self.bind(cx, 2, format!("rsqrt({var} + {eps})"), x.dtype, stat)?;
                }
                let mut e = format!(
                    "layernorm({ex}, axis=[{}], eps={eps}) * {es}",
                    axes.join(", ")
                );
                if let Some(b) = eb {
                    e = format!("{e} + {b}");
                }
                e
            }
            "InstanceNormalization" => {
                cx.allow(&["epsilon"])?;
                cx.spatial_input(r)?;
                let axes: Vec<String> = (2..r).map(|a| a.to_string()).collect();
                let eps = cx.epsilon(1e-5)?;
                let b = eb.ok_or_else(|| cx.err("input 2 (B) is required"))?;
                format!(
                    "layernorm({ex}, axis=[{}], eps={eps}) * {} + {}",
                    axes.join(", "),
                    channel(&es, x.shape[1]),
                    channel(&b, x.shape[1])
                )
            }
            _ => {
                cx.allow(&["epsilon", "num_groups", "stash_type"])?;
                cx.spatial_input(r)?;
                let g = cx.int("num_groups", 0);
                let c = x.shape[1];
                if g < 1 || c % g as usize != 0 {
                    return Err(cx.err(format!("num_groups {g} does not divide {c} channels")));
                }
                let g = g as usize;
                let eps = cx.epsilon(1e-5)?;
                let b = eb.ok_or_else(|| cx.err("input 2 (bias) is required"))?;
                let grouped = [x.shape[0], g, numel(&x.shape[1..]) / g];
                let normed = format!(
                    "reshape(layernorm(reshape({ex}, {}), axis=2, eps={eps}), {})",
                    shape_text(&grouped),
                    shape_text(&x.shape)
                );
                if cx.opset >= 21 {
                    format!("{normed} * {} + {}", channel(&es, c), channel(&b, c))
                } else {
                    // Opset 18: scale and bias per group.
                    let mut per = vec![x.shape[0], g, c / g];
                    per.extend(&x.shape[2..]);
                    let mut gs = vec![g, 1];
                    gs.extend(std::iter::repeat_n(1, r - 2));
                    format!(
                        "reshape(reshape({normed}, {}) * reshape({es}, {gs}) + reshape({b}, {gs}), {})",
                        shape_text(&per),
                        shape_text(&x.shape),
                        gs = shape_text(&gs)
                    )
                }
            }
        };
        self.bind(cx, 0, expr, x.dtype, x.shape)
    }

    /// Kernel, strides, dilations and padding of a window op over `x`.
    fn window(&self, cx: &Cx<'_>, x: &Val, kernel: Vec<usize>) -> R<Window> {
        let s = kernel.len();
        if x.shape.len() != s + 2 {
            return Err(cx.err(format!(
                "a {s}-D window needs an input of rank {} (N, C, spatial...), got {}",
                s + 2,
                shape_text(&x.shape)
            )));
        }
        let list = |name: &str| -> R<Vec<usize>> {
            match cx.ints(name) {
                None => Ok(vec![1; s]),
                Some(v) if v.len() == s && v.iter().all(|&d| (1..=MAX_ATTR).contains(&d)) => {
                    Ok(v.iter().map(|&d| d as usize).collect())
                }
                Some(v) => Err(cx.err(format!("`{name}` {v:?} needs {s} positive values"))),
            }
        };
        let (strides, dilations) = (list("strides")?, list("dilations")?);
        let ceil = cx.int("ceil_mode", 0) != 0;
        let spatial = &x.shape[2..];
        let (mut begin, mut end) = (vec![0i64; s], vec![0i64; s]);
        match cx.string("auto_pad", "NOTSET").as_str() {
            "NOTSET" => {
                if let Some(p) = cx.ints("pads") {
                    if p.len() != 2 * s || p.iter().any(|v| v.abs() > MAX_ATTR) {
                        return Err(cx.err(format!("`pads` {p:?} needs {} values", 2 * s)));
                    }
                    begin.copy_from_slice(&p[..s]);
                    end.copy_from_slice(&p[s..]);
                }
            }
            "VALID" => {}
            mode @ ("SAME_UPPER" | "SAME_LOWER") => {
                for a in 0..s {
                    let out = spatial[a].div_ceil(strides[a]);
                    let need = (out - 1) * strides[a] + dilations[a] * (kernel[a] - 1) + 1;
                    let total = need.saturating_sub(spatial[a]) as i64;
                    let small = total / 2;
                    (begin[a], end[a]) = if mode == "SAME_UPPER" {
                        (small, total - small)
                    } else {
                        (total - small, small)
                    };
                }
            }
            other => return Err(cx.err(format!("auto_pad `{other}` is not valid"))),
        }
        let mut out = Vec::with_capacity(s);
        for a in 0..s {
            let e = window_extent(
                spatial[a],
                kernel[a],
                strides[a],
                dilations[a],
                begin[a],
                end[a],
                ceil,
            );
            if e < 1 {
                return Err(cx.err(format!("the window does not fit spatial axis {a}")));
            }
            out.push(e as usize);
        }
        Ok(Window {
            kernel,
            strides,
            dilations,
            begin,
            end,
            out,
        })
    }

    fn conv(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&CONV_ATTRS)?;
        let (x, w) = (self.need(cx, 0)?, self.need(cx, 1)?);
        // i32 for the integer convolutions written as this one.
        if x.dtype != DType::I32 {
            cx.float_input(&x)?;
        }
        cx.spatial_input(x.shape.len())?;
        if w.shape.len() != x.shape.len() || w.dtype != x.dtype {
            return Err(cx.err(format!(
                "weights {} do not fit input {}",
                type_text(w.dtype, &w.shape),
                type_text(x.dtype, &x.shape)
            )));
        }
        let g = cx.int("group", 1).clamp(1, MAX_ATTR) as usize;
        let (n, c) = (x.shape[0], x.shape[1]);
        let (o, cg) = (w.shape[0], w.shape[1]);
        if c % g != 0 || o % g != 0 || cg.checked_mul(g) != Some(c) {
            return Err(cx.err(format!(
                "{c} input channels, {o} filters of {cg} channels and {g} groups do not fit"
            )));
        }
        let win = self.window(cx, &x, w.shape[2..].to_vec())?;
        let mut out_shape = vec![n, o];
        out_shape.extend(&win.out);
        let (ex, ew) = (self.e(cx, 0)?, self.e(cx, 1)?);
        let symmetric = win.begin == win.end && win.begin.iter().all(|&p| p >= 0);
        let rank = win.kernel.len();
        let mut expr = if (rank == 2 || rank == 3) && symmetric && x.dtype.is_float() {
            let list = |v: &[usize]| {
                let items: Vec<String> = v.iter().map(usize::to_string).collect();
                format!("[{}]", items.join(", "))
            };
            let d = &win.dilations;
            let dilation = if d.iter().all(|&d| d == 1) {
                String::new()
            } else {
                format!(", dilation={}", list(d))
            };
            format!(
                "conv{rank}d({ex}, {ew}, stride={}, padding={}, groups={g}{dilation})",
                list(&win.strides),
                list(&win.begin.iter().map(|&p| p as usize).collect::<Vec<_>>())
            )
        } else {
            self.conv_op(&x, &w, g, &win, &ex, &ew)
        };
        if let Some(b) = self.input(cx, 2) {
            if b.shape != [o] || b.dtype != x.dtype {
                return Err(cx.err(format!(
                    "bias {} must be {}",
                    type_text(b.dtype, &b.shape),
                    type_text(x.dtype, &[o])
                )));
            }
            let eb = self.e(cx, 2)?;
            let mut bs = vec![o];
            bs.extend(std::iter::repeat_n(1, win.kernel.len()));
            expr = format!("{expr} + reshape({eb}, {})", shape_text(&bs));
        }
        self.bind(cx, 0, expr, x.dtype, out_shape)
    }

    /// ConvTranspose as a convolution: the input with `stride - 1` zeros
    /// between its elements (a reshape, a concatenation with zeros and a
    /// slice per axis), padded by `dilation * (kernel - 1)` less the pads,
    /// against the weights flipped and with input and output channels
    /// swapped per group (computed here: the weights must be constants).
    fn conv_transpose(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[
            "auto_pad",
            "dilations",
            "group",
            "kernel_shape",
            "output_padding",
            "output_shape",
            "pads",
            "strides",
        ])?;
        let (x, w) = (self.need(cx, 0)?, self.need(cx, 1)?);
        cx.float_input(&x)?;
        let r = x.shape.len();
        if r < 3 || w.shape.len() != r || w.dtype != x.dtype {
            return Err(cx.err(format!(
                "weights {} do not fit input {}",
                type_text(w.dtype, &w.shape),
                type_text(x.dtype, &x.shape)
            )));
        }
        let sp = r - 2;
        let g = cx.int("group", 1).clamp(1, MAX_ATTR) as usize;
        let (n, c) = (x.shape[0], x.shape[1]);
        if w.shape[0] != c || c % g != 0 {
            return Err(cx.err(format!(
                "{c} input channels do not fit weights {} in {g} groups",
                shape_text(&w.shape)
            )));
        }
        let (cg, og) = (c / g, w.shape[1]);
        let o = og * g;
        let kernel = w.shape[2..].to_vec();
        let list = |name: &str, default: i64| -> R<Vec<i64>> {
            match cx.ints(name) {
                None => Ok(vec![default; sp]),
                Some(v) if v.len() == sp && v.iter().all(|d| (0..=MAX_ATTR).contains(d)) => Ok(v),
                Some(v) => Err(cx.err(format!("`{name}` {v:?} needs {sp} values"))),
            }
        };
        let (strides, dil, outpad) = (
            list("strides", 1)?,
            list("dilations", 1)?,
            list("output_padding", 0)?,
        );
        if strides.iter().chain(&dil).any(|&v| v < 1) {
            return Err(cx.err("strides and dilations must be positive"));
        }
        let (mut begin, mut end) = (vec![0i64; sp], vec![0i64; sp]);
        let auto = cx.string("auto_pad", "NOTSET");
        let natural: Vec<i64> = (0..sp)
            .map(|a| {
                strides[a] * (x.shape[a + 2] as i64 - 1)
                    + outpad[a]
                    + (kernel[a] as i64 - 1) * dil[a]
                    + 1
            })
            .collect();
        let target: Option<Vec<i64>> = match cx.ints("output_shape") {
            Some(v) if v.len() == sp => Some(v),
            Some(v) if v.len() == r => Some(v[2..].to_vec()),
            Some(v) => return Err(cx.err(format!("`output_shape` {v:?} needs {sp} values"))),
            None if auto.starts_with("SAME") => Some(
                (0..sp)
                    .map(|a| x.shape[a + 2] as i64 * strides[a])
                    .collect(),
            ),
            None => None,
        };
        if let Some(p) = cx.ints("pads") {
            if p.len() != 2 * sp || p.iter().any(|v| v.abs() > MAX_ATTR) {
                return Err(cx.err(format!("`pads` {p:?} needs {} values", 2 * sp)));
            }
            begin.copy_from_slice(&p[..sp]);
            end.copy_from_slice(&p[sp..]);
        }
        if let Some(t) = target {
            for a in 0..sp {
                if t[a] < 1 || t[a] > MAX_ATTR {
                    return Err(cx.err(format!("output extent {} is not valid", t[a])));
                }
                if auto.starts_with("SAME") {
                    // As ONNX's reference: the padding split, floor halves.
                    let total = natural[a] - t[a];
                    let half = total.div_euclid(2);
                    (begin[a], end[a]) = if auto == "SAME_UPPER" {
                        (half, total - half)
                    } else {
                        (total - half, half)
                    };
                } else {
                    // The result placed at the origin of an output of that
                    // extent: zeros after it, or cut.
                    end[a] = natural[a] - begin[a] - t[a];
                }
            }
        }
        // The input with zeros between its elements.
        let dt = x.dtype;
        let ex = self.e(cx, 0)?;
        let (ex, xs) = zeros_between(ex, &x.shape, &strides, dt);
        // The weights with input and output channels swapped per group,
        // [O, C/g, k...], and every spatial axis reversed.
        let ew = self.e(cx, 1)?;
        let mut grouped = vec![g, cg, og];
        grouped.extend(&kernel);
        let mut perm = vec![0usize, 2, 1];
        perm.extend(3..3 + sp);
        let mut ws = vec![o, cg];
        ws.extend(&kernel);
        let perm_text: Vec<String> = perm.iter().map(ToString::to_string).collect();
        let swapped = format!(
            "reshape(transpose(reshape({ew}, {}), [{}]), {})",
            shape_text(&grouped),
            perm_text.join(", "),
            shape_text(&ws)
        );
        let idx: Vec<String> = (0..r).map(|i| format!("i{i}")).collect();
        let mut read = idx.clone();
        for a in 0..sp {
            read[a + 2] = format!("{} - i{}", kernel[a] - 1, a + 2);
        }
        let flip = self.fresh("flip");
        self.ops.push(format!(
            "op {flip}(w: {t}) -> {t} {{\n    out[{}] = w[{}];\n}}",
            idx.join(", "),
            read.join(", "),
            t = type_text(dt, &ws)
        ));
        let wv = self.fresh("flipped");
        self.lines.push(format!("let {wv} = {flip}({swapped});"));
        let mut out = Vec::with_capacity(sp);
        let (mut wb, mut we) = (vec![0i64; sp], vec![0i64; sp]);
        for a in 0..sp {
            let full = dil[a] * (kernel[a] as i64 - 1);
            wb[a] = full - begin[a];
            we[a] = full - end[a] + outpad[a];
            let e = window_extent(
                xs[a + 2],
                kernel[a],
                1,
                dil[a] as usize,
                wb[a],
                we[a],
                false,
            );
            if e < 1 {
                return Err(cx.err(format!("the output of spatial axis {a} would be empty")));
            }
            out.push(e as usize);
        }
        let win = Window {
            kernel: kernel.clone(),
            strides: vec![1; sp],
            dilations: dil.iter().map(|&d| d as usize).collect(),
            begin: wb,
            end: we,
            out: out.clone(),
        };
        let xv = Val {
            dtype: dt,
            shape: xs,
            var: None,
            data: None,
        };
        let wval = Val {
            dtype: dt,
            shape: ws,
            var: None,
            data: None,
        };
        let mut expr = self.conv_op(&xv, &wval, g, &win, &ex, &wv);
        if let Some(b) = self.input(cx, 2) {
            if b.shape != [o] || b.dtype != x.dtype {
                return Err(cx.err(format!(
                    "bias {} must be {}",
                    type_text(b.dtype, &b.shape),
                    type_text(x.dtype, &[o])
                )));
            }
            let eb = self.e(cx, 2)?;
            let mut bs = vec![o];
            bs.extend(std::iter::repeat_n(1, sp));
            expr = format!("{expr} + reshape({eb}, {})", shape_text(&bs));
        }
        let mut shape = vec![n, o];
        shape.extend(out);
        self.bind(cx, 0, expr, dt, shape)
    }

    /// Attention (opset 23): heads split from 3-D inputs, the past keys and
    /// values prepended, key and value heads repeated for grouped queries,
    /// both sides scaled by sqrt(scale), softcap, the mask and the causal
    /// bias added, softmax (a fully masked row gives zeros), times V.
    fn attention(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[
            "is_causal",
            "kv_num_heads",
            "q_num_heads",
            "qk_matmul_output_mode",
            "scale",
            "softcap",
            "softmax_precision",
            "left_window_size",
            "right_window_size",
        ])?;
        let (q, k, v) = (self.need(cx, 0)?, self.need(cx, 1)?, self.need(cx, 2)?);
        cx.float_input(&q)?;
        let dt = q.dtype;
        let r = q.shape.len();
        if !(r == 3 || r == 4)
            || k.shape.len() != r
            || v.shape.len() != r
            || k.dtype != dt
            || v.dtype != dt
        {
            return Err(cx.err("Q, K and V must be 3-D or 4-D tensors of one element type"));
        }
        let (mut eq, mut ek, mut ev) = (self.e(cx, 0)?, self.e(cx, 1)?, self.e(cx, 2)?);
        let b = q.shape[0];
        // [B, heads, sequence, head size] for each.
        let (qs, mut ks, mut vs) = if r == 3 {
            let (hq, hk) = (cx.int("q_num_heads", 0), cx.int("kv_num_heads", 0));
            if hq < 1 || hk < 1 {
                return Err(cx.err("3-D inputs need q_num_heads and kv_num_heads"));
            }
            let (hq, hk) = (hq as usize, hk as usize);
            let split = |e: &str, shape: &[usize], h: usize| -> R<(String, Vec<usize>)> {
                if !shape[2].is_multiple_of(h) {
                    return Err(cx.err(format!(
                        "hidden size {} is not a multiple of {h} heads",
                        shape[2]
                    )));
                }
                let inner = [shape[0], shape[1], h, shape[2] / h];
                Ok((
                    format!(
                        "transpose(reshape({e}, {}), [0, 2, 1, 3])",
                        shape_text(&inner)
                    ),
                    vec![shape[0], h, shape[1], shape[2] / h],
                ))
            };
            let (a, qs) = split(&eq, &q.shape, hq)?;
            let (bk, ks) = split(&ek, &k.shape, hk)?;
            let (c, vs) = split(&ev, &v.shape, hk)?;
            (eq, ek, ev) = (a, bk, c);
            (qs, ks, vs)
        } else {
            (q.shape.clone(), k.shape.clone(), v.shape.clone())
        };
        let (hq, s, d) = (qs[1], qs[2], qs[3]);
        if ks[0] != b || vs[0] != b || ks[1] != vs[1] || ks[3] != d || ks[2] != vs[2] {
            return Err(cx.err("Q, K and V do not fit one another"));
        }
        // The past keys and values go first; the results are the present ones.
        let mut past = 0;
        if let (Some(pk), Some(pv)) = (self.input(cx, 4), self.input(cx, 5)) {
            if pk.shape.len() != 4
                || pk.shape[..2] != ks[..2]
                || pk.shape[3] != ks[3]
                || pv.shape[..2] != vs[..2]
                || pv.shape[3] != vs[3]
                || pk.shape[2] != pv.shape[2]
            {
                return Err(cx.err("past_key and past_value do not fit K and V"));
            }
            past = pk.shape[2];
            let (epk, epv) = (self.e(cx, 4)?, self.e(cx, 5)?);
            ek = format!("concat([{epk}, {ek}], axis=2)");
            ev = format!("concat([{epv}, {ev}], axis=2)");
            ks[2] += past;
            vs[2] += past;
        } else if self.input(cx, 4).is_some() || self.input(cx, 5).is_some() {
            return Err(cx.err("past_key and past_value come together"));
        }
        // Keys past nonpad_kv_seqlen[b] are padding (a static cache); the
        // causal and window masks then end at that length, per batch.
        let nonpad = match self.input(cx, 6) {
            Some(n) => {
                if past > 0 {
                    return Err(cx.err("nonpad_kv_seqlen cannot come with past_key"));
                }
                if n.dtype != DType::I64 || n.shape != [b] {
                    return Err(cx.err(format!(
                        "nonpad_kv_seqlen is {}; it must be i64[{b}]",
                        type_text(n.dtype, &n.shape)
                    )));
                }
                Some(format!("reshape({}, [{b}, 1, 1, 1])", self.e(cx, 6)?))
            }
            None => None,
        };
        let kname = self.fresh("keys");
        self.lines.push(format!("let {kname} = {ek};"));
        let vname = self.fresh("values");
        self.lines.push(format!("let {vname} = {ev};"));
        self.bind(cx, 1, kname.clone(), dt, ks.clone())?;
        self.bind(cx, 2, vname.clone(), dt, vs.clone())?;
        let l = ks[2];
        // Grouped queries: each key and value head serves hq / hk query heads.
        let hk = ks[1];
        let (mut ek, mut ev) = (kname, vname);
        if hq != hk {
            if !hq.is_multiple_of(hk) {
                return Err(cx.err(format!(
                    "{hq} query heads are not a multiple of {hk} key heads"
                )));
            }
            let reps = hq / hk;
            let rep = |e: &str, sh: &[usize]| {
                format!(
                    "reshape(broadcast(reshape({e}, {}), {}), {})",
                    shape_text(&[b, hk, 1, sh[2], sh[3]]),
                    shape_text(&[b, hk, reps, sh[2], sh[3]]),
                    shape_text(&[b, hq, sh[2], sh[3]])
                )
            };
            (ek, ev) = (rep(&ek, &ks), rep(&ev, &vs));
        }
        let scale = match cx.attr("scale") {
            Some(a) => f64::from(a.f()),
            None => 1.0 / (d as f64).sqrt(),
        };
        let sq = literal(scale.sqrt(), dt);
        let mut scores = format!("({eq} * {sq}) @ transpose({ek} * {sq}, [0, 1, 3, 2])");
        let softcap = cx.float("softcap", 0.0);
        if softcap > 0.0 {
            scores = format!("tanh(({scores}) / {c}) * {c}", c = literal(softcap, dt));
        }
        let sname = self.fresh("scores");
        self.lines.push(format!("let {sname} = {scores};"));
        let ninf = literal(f64::NEG_INFINITY, dt);
        let sizes = AttentionSizes {
            b,
            hq,
            s,
            l,
            past,
            dt,
        };
        let mut bias = self.attention_bias(cx, &sizes, nonpad.as_deref())?;
        let with_bias = match &bias {
            Some(bv) => {
                let bname = self.fresh("bias");
                self.lines.push(format!("let {bname} = {bv};"));
                bias = Some(bname.clone());
                let w = self.fresh("biased");
                self.lines.push(format!("let {w} = {sname} + {bname};"));
                w
            }
            None => sname.clone(),
        };
        let mut probs = format!("softmax({with_bias}, axis=-1)");
        if let Some(bname) = &bias {
            // A row whose every key is masked attends to nothing.
            probs = format!("where(max({bname}, axis=-1, keepdims=true) == {ninf}, 0.0, {probs})");
        }
        let pname = self.fresh("probs");
        self.lines.push(format!("let {pname} = {probs};"));
        let sshape = vec![b, hq, s, l];
        let qk = match cx.int("qk_matmul_output_mode", 0) {
            0 | 1 => sname,
            2 => with_bias,
            3 => pname.clone(),
            m => return Err(cx.err(format!("qk_matmul_output_mode {m} is not valid"))),
        };
        self.bind(cx, 3, qk, dt, sshape)?;
        let dv = vs[3];
        let mut y = format!("{pname} @ {ev}");
        let mut shape = vec![b, hq, s, dv];
        if r == 3 {
            shape = vec![b, s, hq * dv];
            y = format!(
                "reshape(transpose({y}, [0, 2, 1, 3]), {})",
                shape_text(&shape)
            );
        }
        self.bind(cx, 0, y, dt, shape)
    }

    /// Attention's bias on the scores: the mask input (padded to the keys'
    /// length), the causal mask, the sliding window and the padding past
    /// `nonpad_kv_seqlen` (the expression of it, shaped `[B, 1, 1, 1]`),
    /// added; none when there is none of them.
    fn attention_bias(
        &mut self,
        cx: &Cx<'_>,
        z: &AttentionSizes,
        nonpad: Option<&str>,
    ) -> R<Option<String>> {
        let AttentionSizes { s, l, past, dt, .. } = *z;
        let ninf = literal(f64::NEG_INFINITY, dt);
        let mut bias = match self.input(cx, 3) {
            Some(m) => Some(self.attention_mask(cx, z, &m)?),
            None => None,
        };
        // With a per-batch key length the masks are computed from iotas over
        // the queries and the keys, query i being at position i + offset.
        let positions = match nonpad {
            Some(n) => {
                let qi = self.iota(&[1, 1, s, 1], 2, DType::I64);
                let kj = self.iota(&[1, 1, 1, l], 3, DType::I64);
                let off = self.fresh("offset");
                self.lines.push(format!("let {off} = {n} - {s};"));
                Some((qi, kj, off))
            }
            None => None,
        };
        let add = |bias: &mut Option<String>, term: String| {
            *bias = Some(match bias.take() {
                Some(b) => format!("{b} + {term}"),
                None => term,
            });
        };
        if cx.int("is_causal", 0) != 0
            && let Some((qi, kj, off)) = &positions
        {
            add(
                &mut bias,
                format!("where({kj} <= {qi} + {off}, 0.0, {ninf})"),
            );
        } else if cx.int("is_causal", 0) != 0 {
            let allowed: Vec<f64> = (0..s * l)
                .map(|p| f64::from(u8::from((p % l) as i64 <= (p / l) as i64 + past as i64)))
                .collect();
            let mask = self.fresh("causal");
            self.lines.push(format!(
                "let {mask} = {};",
                crate::constant_text(&Data::new(DType::Bool, vec![s, l], allowed))
            ));
            add(&mut bias, format!("where({mask}, 0.0, {ninf})"));
        }
        // A sliding window: query i (at position past + i) sees keys within
        // left before and right after it (-1: unbounded).
        let (left, right) = (
            cx.int("left_window_size", -1),
            cx.int("right_window_size", -1),
        );
        if left < -1 || right < -1 {
            return Err(cx.err("window sizes must be -1 or non-negative"));
        }
        if (left >= 0 || right >= 0)
            && let Some((qi, kj, off)) = &positions
        {
            let diff = format!("({qi} + {off} - {kj})");
            let mut inside = Vec::new();
            if left >= 0 {
                inside.push(format!("where({diff} <= {left}, 0.0, {ninf})"));
            }
            if right >= 0 {
                inside.push(format!("where(0 - {diff} <= {right}, 0.0, {ninf})"));
            }
            add(&mut bias, inside.join(" + "));
        } else if left >= 0 || right >= 0 {
            let allowed: Vec<f64> = (0..s * l)
                .map(|p| {
                    let diff = (p / l) as i64 + past as i64 - (p % l) as i64;
                    f64::from(u8::from(
                        (left < 0 || diff <= left) && (right < 0 || -diff <= right),
                    ))
                })
                .collect();
            let mask = self.fresh("window");
            self.lines.push(format!(
                "let {mask} = {};",
                crate::constant_text(&Data::new(DType::Bool, vec![s, l], allowed))
            ));
            add(&mut bias, format!("where({mask}, 0.0, {ninf})"));
        }
        if let (Some(n), Some((_, kj, _))) = (nonpad, &positions) {
            add(&mut bias, format!("where({kj} < {n}, 0.0, {ninf})"));
        }
        Ok(bias)
    }

    /// Attention's mask input as a bias: padded to the keys' length (a
    /// padded key is masked), checked to broadcast to the scores, a
    /// boolean mask made 0 or -inf.
    fn attention_mask(&mut self, cx: &Cx<'_>, z: &AttentionSizes, m: &Val) -> R<String> {
        let AttentionSizes {
            b, hq, s, l, dt, ..
        } = *z;
        let ninf = literal(f64::NEG_INFINITY, dt);
        let mut em = self.e(cx, 3)?;
        let ml = *m
            .shape
            .last()
            .ok_or_else(|| cx.err("the mask must have a key axis"))?;
        if ml > l {
            return Err(cx.err(format!("the mask covers {ml} keys, there are {l}")));
        }
        if ml < l {
            let mut pad_shape = m.shape.clone();
            *pad_shape.last_mut().unwrap_or(&mut 0) = l - ml;
            let fill = if m.dtype == DType::Bool {
                crate::constant_text(&Data::new(
                    DType::Bool,
                    pad_shape.clone(),
                    vec![0.0; numel(&pad_shape)],
                ))
            } else {
                format!("broadcast({ninf}, {})", shape_text(&pad_shape))
            };
            em = format!("concat([{em}, {fill}], axis={})", m.shape.len() - 1);
        }
        let mut padded = m.shape.clone();
        if let Some(last) = padded.last_mut() {
            *last = l;
        }
        let full = [b, hq, s, l];
        if broadcast(&padded, &full).as_deref() != Some(&full[..]) {
            return Err(cx.err(format!(
                "the mask {} does not broadcast to {}",
                shape_text(&m.shape),
                shape_text(&full)
            )));
        }
        Ok(if m.dtype == DType::Bool {
            format!("where({em}, 0.0, {ninf})")
        } else if m.dtype == dt {
            em
        } else {
            return Err(cx.err(format!(
                "the mask is {}; bool or {dt} are supported",
                m.dtype
            )));
        })
    }

    /// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (the NLL of
    /// log_softmax over axis 1): the target class selected by comparing the
    /// labels with a constant iota over the classes, weighted, ignored
    /// labels contributing nothing; `mean` divides by the weights of the
    /// labels kept.
    fn loss(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["reduction", "ignore_index"])?;
        let (x, t) = (self.need(cx, 0)?, self.need(cx, 1)?);
        cx.float_input(&x)?;
        let dt = x.dtype;
        let r = x.shape.len();
        if r < 2
            || t.shape.len() != r - 1
            || t.shape[0] != x.shape[0]
            || t.shape[1..] != x.shape[2..]
        {
            return Err(cx.err(format!(
                "labels {} do not fit scores {}",
                shape_text(&t.shape),
                shape_text(&x.shape)
            )));
        }
        if !matches!(t.dtype, DType::I32 | DType::I64) {
            return Err(cx.err(format!("labels must be i32 or i64, got {}", t.dtype)));
        }
        let c = x.shape[1];
        let mut ex = self.e(cx, 0)?;
        if cx.op() == "SoftmaxCrossEntropyLoss" {
            let lp = self.fresh("log_prob");
            let m = self.fresh("max");
            self.lines
                .push(format!("let {m} = max({ex}, axis=1, keepdims=true);"));
            self.lines.push(format!(
                "let {lp} = {ex} - {m} - log(sum(exp({ex} - {m}), axis=1, keepdims=true));"
            ));
            self.bind(cx, 1, lp.clone(), dt, x.shape.clone())?;
            ex = lp;
        }
        let et = self.e(cx, 1)?;
        let et = if t.dtype == DType::I64 {
            et
        } else {
            format!("cast({et}, i64)")
        };
        let mut expanded = t.shape.clone();
        expanded.insert(1, 1);
        let labels = self.fresh("labels");
        self.lines.push(format!(
            "let {labels} = reshape({et}, {});",
            shape_text(&expanded)
        ));
        let iota = self.iota(&x.shape, 1, DType::I64);
        let hot = self.fresh("target");
        self.lines.push(format!("let {hot} = {labels} == {iota};"));
        let zero = literal(0.0, dt);
        let picked = format!("sum(where({hot}, {ex}, {zero}), axis=1)");
        let weight = match self.input(cx, 2) {
            Some(w) => {
                if w.shape != [c] || w.dtype != dt {
                    return Err(cx.err(format!(
                        "weights {} must be {}",
                        type_text(w.dtype, &w.shape),
                        type_text(dt, &[c])
                    )));
                }
                let ew = self.e(cx, 2)?;
                let mut ws = vec![1; r];
                ws[1] = c;
                Some(format!(
                    "sum(where({hot}, reshape({ew}, {}), {zero}), axis=1)",
                    shape_text(&ws)
                ))
            }
            None => None,
        };
        let kept = cx
            .attr("ignore_index")
            .map(|a| format!("{et} != {}", a.i()));
        let wname = self.fresh("weight");
        let one = literal(1.0, dt);
        let w = match (&weight, &kept) {
            (Some(w), Some(k)) => format!("where({k}, {w}, {zero})"),
            (Some(w), None) => w.clone(),
            (None, Some(k)) => format!("where({k}, {one}, {zero})"),
            (None, None) => format!("full({}, 1.0, dtype={dt})", shape_text(&t.shape)),
        };
        self.lines.push(format!("let {wname} = {w};"));
        let lname = self.fresh("loss");
        self.lines
            .push(format!("let {lname} = -{picked} * {wname};"));
        let (expr, shape) = match cx.string("reduction", "mean").as_str() {
            "none" => (lname, t.shape.clone()),
            "sum" => (format!("sum({lname})"), vec![]),
            "mean" => (format!("sum({lname}) / sum({wname})"), vec![]),
            other => return Err(cx.err(format!("reduction `{other}` is not valid"))),
        };
        self.bind(cx, 0, expr, dt, shape)
    }

    /// A convolution the built-in does not cover, as an operator in index
    /// notation over grouped views: `x: [N, G, C/G, spatial]`,
    /// `w: [G, O/G, C/G, kernel]`.
    fn conv_op(&mut self, x: &Val, w: &Val, g: usize, win: &Window, ex: &str, ew: &str) -> String {
        let s = win.kernel.len();
        let (n, c, o) = (x.shape[0], x.shape[1], w.shape[0]);
        let mut xs = vec![n, g, c / g];
        xs.extend(&x.shape[2..]);
        let mut ws = vec![g, o / g, c / g];
        ws.extend(&win.kernel);
        let mut os = vec![n, g, o / g];
        os.extend(&win.out);
        let ys: Vec<String> = (0..s).map(|a| format!("y{a}")).collect();
        let ks: Vec<String> = (0..s).map(|a| format!("k{a}")).collect();
        let reads: Vec<String> = (0..s)
            .map(|a| {
                window_index(
                    &ys[a],
                    &ks[a],
                    win.strides[a],
                    win.dilations[a],
                    win.begin[a],
                )
            })
            .collect();
        let name = self.fresh("conv");
        self.ops.push(format!(
            "op {name}(inp: {}, wt: {}) -> {} {{\n    out[n, g, o, {y}] = sum[c, {k}](inp[n, g, c, {r}] * wt[g, o, c, {k}]);\n}}",
            type_text(x.dtype, &xs),
            type_text(w.dtype, &ws),
            type_text(x.dtype, &os),
            y = ys.join(", "),
            k = ks.join(", "),
            r = reads.join(", ")
        ));
        let mut out = vec![n, o];
        out.extend(&win.out);
        format!(
            "reshape({name}(reshape({ex}, {}), reshape({ew}, {})), {})",
            shape_text(&xs),
            shape_text(&ws),
            shape_text(&out)
        )
    }

    fn pool(&mut self, cx: &Cx<'_>) -> R<()> {
        let max = cx.op() == "MaxPool";
        if max {
            cx.allow(&[
                "auto_pad",
                "ceil_mode",
                "dilations",
                "kernel_shape",
                "pads",
                "storage_order",
                "strides",
            ])?;
        } else if cx.op() == "LpPool" {
            cx.allow(&[
                "auto_pad",
                "ceil_mode",
                "dilations",
                "kernel_shape",
                "p",
                "pads",
                "strides",
            ])?;
        } else {
            cx.allow(&[
                "auto_pad",
                "ceil_mode",
                "count_include_pad",
                "dilations",
                "kernel_shape",
                "pads",
                "strides",
            ])?;
        }
        let lp = cx.op() == "LpPool";
        let x = self.need(cx, 0)?;
        if !(max && x.dtype.is_int()) {
            cx.float_input(&x)?;
        }
        let kernel: Vec<usize> = cx
            .ints("kernel_shape")
            .ok_or_else(|| cx.err("`kernel_shape` is required"))?
            .iter()
            .map(|&k| k.clamp(1, MAX_ATTR) as usize)
            .collect();
        let win = self.window(cx, &x, kernel)?;
        let include_pad = cx.int("count_include_pad", 0) != 0;
        let mut out_shape = x.shape[..2].to_vec();
        out_shape.extend(&win.out);
        let ex = self.e(cx, 0)?;
        let symmetric = win.begin == win.end && win.begin.iter().all(|&p| p >= 0);
        let indices = max && cx.node.output.get(1).is_some_and(|o| !o.is_empty());
        let plain = win.kernel.len() == 2
            && !indices
            && x.dtype.is_float()
            && symmetric
            && win.dilations == [1, 1]
            && cx.int("ceil_mode", 0) == 0
            && !lp
            && (max || include_pad || win.begin == [0, 0]);
        if plain {
            let f = if max { "maxpool2d" } else { "avgpool2d" };
            let expr = format!(
                "{f}({ex}, kernel=[{}, {}], stride=[{}, {}], padding=[{}, {}])",
                win.kernel[0],
                win.kernel[1],
                win.strides[0],
                win.strides[1],
                win.begin[0],
                win.begin[1]
            );
            return self.bind(cx, 0, expr, x.dtype, out_shape);
        }
        // A helper operator with a mask of ones: where the mask reads zero
        // (outside the input, or outside the padded input for an average
        // that counts padding) the element is not part of the window.
        let s = win.kernel.len();
        let ys: Vec<String> = (0..s).map(|a| format!("y{a}")).collect();
        let ks: Vec<String> = (0..s).map(|a| format!("k{a}")).collect();
        let ranges: Vec<String> = (0..s)
            .map(|a| format!("k{a} in 0..{}", win.kernel[a]))
            .collect();
        let reads: Vec<String> = (0..s)
            .map(|a| {
                window_index(
                    &ys[a],
                    &ks[a],
                    win.strides[a],
                    win.dilations[a],
                    win.begin[a],
                )
            })
            .collect();
        let (mask_shape, mask_reads): (Vec<usize>, Vec<String>) = if !max && include_pad {
            (
                (0..s)
                    .map(|a| (x.shape[a + 2] as i64 + win.begin[a] + win.end[a]) as usize)
                    .collect(),
                (0..s)
                    .map(|a| window_index(&ys[a], &ks[a], win.strides[a], win.dilations[a], 0))
                    .collect(),
            )
        } else {
            (x.shape[2..].to_vec(), reads.clone())
        };
        let name = self.fresh(if max { "maxpool" } else { "avgpool" });
        let (dt, y, r, m, k) = (
            x.dtype,
            ys.join(", "),
            reads.join(", "),
            mask_reads.join(", "),
            ranges.join(", "),
        );
        let body = if max {
            let lowest = extreme(dt, false);
            format!("max[{k}](where(m[{m}] > 0.5, inp[n, c, {r}], {lowest}))")
        } else if lp {
            // (sum of |x|^p over the window)^(1/p); padding adds zeros.
            let p = cx.int("p", 2);
            if !(1..=64).contains(&p) {
                return Err(cx.err(format!("p = {p} is not supported (1 to 64)")));
            }
            format!(
                "pow(sum[{k}](pow(abs(inp[n, c, {r}]), {})), {})",
                literal(p as f64, dt),
                literal(1.0 / p as f64, dt)
            )
        } else {
            format!("sum[{k}](inp[n, c, {r}]) / sum[{k}](m[{m}])")
        };
        // The mask is of the input's float type (an average divides by its
        // sum), f32 for an integer max.
        let md = if dt.is_float() { dt } else { DType::F32 };
        self.ops.push(format!(
            "op {name}(inp: {}, m: {}) -> {} {{\n    out[n, c, {y}] = {body};\n}}",
            type_text(dt, &x.shape),
            type_text(md, &mask_shape),
            type_text(dt, &out_shape),
        ));
        let ones = format!("full({}, 1.0, dtype={md})", shape_text(&mask_shape));
        let pooled = self.fresh("pooled");
        self.lines
            .push(format!("let {pooled} = {name}({ex}, {ones});"));
        self.bind(cx, 0, pooled.clone(), dt, out_shape.clone())?;
        if !indices {
            return Ok(());
        }
        // The flat index (row-major) of the first maximum in the window:
        // the least index whose element equals the maximum.
        let total = numel(&x.shape);
        if total > 1 << 22 {
            return Err(cx.err("the Indices output of an input this large is not supported"));
        }
        let flat = self.fresh("flat");
        self.lines.push(format!(
            "let {flat} = {};",
            crate::constant_text(&Data::new(
                DType::I64,
                x.shape.clone(),
                (0..total).map(|i| i as f64).collect()
            ))
        ));
        let none = total.to_string();
        let argmax = self.fresh("maxpool_indices");
        self.ops.push(format!(
            "op {argmax}(inp: {}, m: {}, mx: {}, f: {}) -> {} {{\n    out[n, c, {y}] = min[{k}](where(m[{m}] > 0.5, where(inp[n, c, {r}] == mx[n, c, {y}], f[n, c, {r}], {none}), {none}));\n}}",
            type_text(dt, &x.shape),
            type_text(md, &mask_shape),
            type_text(dt, &out_shape),
            type_text(DType::I64, &x.shape),
            type_text(DType::I64, &out_shape),
        ));
        let mut idx = format!("{argmax}({ex}, {ones}, {pooled}, {flat})");
        if cx.int("storage_order", 0) != 0 {
            // Column-major over the spatial axes (2-D): h + w * H.
            let [_, _, h, w] = x.shape[..] else {
                return Err(cx.err("storage_order 1 is supported for 2-D pooling"));
            };
            let i = self.fresh("row_major");
            self.lines.push(format!("let {i} = {idx};"));
            let (plane, q) = (h * w, self.fresh("plane"));
            self.lines.push(format!("let {q} = {i} / {plane};"));
            let rem = format!("({i} - {q} * {plane})");
            idx = format!("{q} * {plane} + ({rem} - {rem} / {w} * {w}) * {h} + {rem} / {w}");
        }
        self.bind(cx, 1, idx, DType::I64, out_shape)
    }

    /// Element-wise functions written through others.
    fn composite(&mut self, cx: &Cx<'_>) -> R<()> {
        let x = self.need(cx, 0)?;
        cx.float_input(&x)?;
        let dt = x.dtype;
        let l = |v: f64| literal(v, dt);
        let ex = self.e(cx, 0)?;
        let r = x.shape.len();
        let expr = match cx.op() {
            "Tan" => {
                cx.allow(&[])?;
                format!("sin({ex}) / cos({ex})")
            }
            "Sinh" => {
                cx.allow(&[])?;
                format!("(exp({ex}) - exp(-{ex})) * 0.5")
            }
            "Cosh" => {
                cx.allow(&[])?;
                format!("(exp({ex}) + exp(-{ex})) * 0.5")
            }
            "Asinh" => {
                cx.allow(&[])?;
                format!("log({ex} + sqrt({ex} * {ex} + 1.0))")
            }
            "Acosh" => {
                cx.allow(&[])?;
                format!("log({ex} + sqrt({ex} * {ex} - 1.0))")
            }
            "Atanh" => {
                cx.allow(&[])?;
                format!("log((1.0 + {ex}) / (1.0 - {ex})) * 0.5")
            }
            "Shrink" => {
                cx.allow(&["bias", "lambd"])?;
                let (b, lam) = (cx.float("bias", 0.0), cx.float("lambd", 0.5));
                format!(
                    "where({ex} < -{lam}, {ex} + {b}, where({ex} > {lam}, {ex} - {b}, 0.0))",
                    lam = l(lam),
                    b = l(b)
                )
            }
            "LpNormalization" => {
                cx.allow(&["axis", "p"])?;
                let a = cx.axis(cx.int("axis", -1), r)?;
                match cx.int("p", 2) {
                    // Where the norm is zero the result is zero (ONNX's reference).
                    p @ (1 | 2) => {
                        let norm = self.fresh("norm");
                        let n = if p == 1 {
                            format!("sum(abs({ex}), axis={a}, keepdims=true)")
                        } else {
                            format!("sqrt(sum({ex} * {ex}, axis={a}, keepdims=true))")
                        };
                        self.lines.push(format!("let {norm} = {n};"));
                        format!("where({norm} == 0.0, 0.0, {ex} / {norm})")
                    }
                    p => return Err(cx.err(format!("p = {p} is not supported (1 and 2 are)"))),
                }
            }
            _ => {
                // Hardmax: one at the first maximum along the axis.
                cx.allow(&["axis"])?;
                let a = cx.axis(cx.int("axis", -1), r)?;
                let first = self.first_index(&ex, &x.shape, a, true, false)?;
                let iota = self.iota(&x.shape, a, DType::I64);
                format!("cast({iota} == {first}, {dt})")
            }
        };
        self.bind(cx, 0, expr, dt, x.shape)
    }

    /// A constant holding each position's index along `axis`, shaped to
    /// broadcast against `shape` (extent 1 on every other axis).
    fn iota(&mut self, shape: &[usize], axis: usize, dtype: DType) -> String {
        let n = shape[axis];
        let mut s = vec![1; shape.len()];
        s[axis] = n;
        let d = Data::new(dtype, s, (0..n).map(|i| i as f64).collect());
        let name = self.fresh("iota");
        self.lines
            .push(format!("let {name} = {};", crate::constant_text(&d)));
        name
    }

    /// The index (i64, keeping the reduced axis) of the first (or last)
    /// maximum (or minimum) of `ex` along `axis`.
    fn first_index(
        &mut self,
        ex: &str,
        shape: &[usize],
        axis: usize,
        max: bool,
        last: bool,
    ) -> R<String> {
        let iota = self.iota(shape, axis, DType::I64);
        let f = if max { "max" } else { "min" };
        let m = self.fresh(f);
        self.lines
            .push(format!("let {m} = {f}({ex}, axis={axis}, keepdims=true);"));
        let n = shape[axis] as i64;
        Ok(if last {
            format!("max(where({ex} == {m}, {iota}, -1), axis={axis}, keepdims=true)")
        } else {
            format!("min(where({ex} == {m}, {iota}, {n}), axis={axis}, keepdims=true)")
        })
    }

    fn arg_extreme(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis", "keepdims", "select_last_index"])?;
        let x = self.need(cx, 0)?;
        if x.dtype == DType::Bool {
            return Err(cx.err("is not defined on bool"));
        }
        let a = cx.axis(cx.int("axis", 0), x.shape.len())?;
        let keep = cx.int("keepdims", 1) != 0;
        let last = cx.int("select_last_index", 0) != 0;
        let ex = self.e(cx, 0)?;
        let mut expr = self.first_index(&ex, &x.shape, a, cx.op() == "ArgMax", last)?;
        let mut shape = x.shape.clone();
        shape[a] = 1;
        if !keep {
            shape.remove(a);
            expr = format!("reshape({expr}, {})", shape_text(&shape));
        }
        self.bind(cx, 0, expr, DType::I64, shape)
    }

    /// TopK with a constant k (at most 64): k rounds of taking the
    /// extreme along the axis and its first index, then masking that
    /// position out; values and indices are concatenated in order (sorted,
    /// ties by the smaller index, as ONNX's reference).
    fn top_k(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis", "largest", "sorted"])?;
        let x = self.need(cx, 0)?;
        if x.dtype == DType::Bool {
            return Err(cx.err("is not defined on bool"));
        }
        let k = self
            .ints_input(cx, 1, "k")?
            .and_then(|v| v.first().copied())
            .ok_or_else(|| cx.err("input 1 (k) is required"))?;
        let a = cx.axis(cx.int("axis", -1), x.shape.len())?;
        let n = x.shape[a];
        if k < 1 || k as usize > n || k > 64 {
            return Err(cx.err(format!("k = {k} is not supported (1 to min(64, {n}))")));
        }
        let largest = cx.int("largest", 1) != 0;
        let dt = x.dtype;
        // What a taken position becomes, so that it is never taken again.
        let gone = match (dt.is_float(), largest) {
            (true, true) => literal(f64::NEG_INFINITY, dt),
            (true, false) => literal(f64::INFINITY, dt),
            (false, _) => extreme(dt, !largest),
        };
        let iota = self.iota(&x.shape, a, DType::I64);
        let f = if largest { "max" } else { "min" };
        let mut cur = self.e(cx, 0)?;
        let (mut values, mut indices) = (Vec::new(), Vec::new());
        for j in 0..k {
            let m = self.fresh("top");
            self.lines
                .push(format!("let {m} = {f}({cur}, axis={a}, keepdims=true);"));
            let i = self.fresh("top_index");
            self.lines.push(format!(
                "let {i} = min(where({cur} == {m}, {iota}, {n}), axis={a}, keepdims=true);"
            ));
            values.push(m);
            indices.push(i.clone());
            if j + 1 < k {
                let next = self.fresh("rest");
                self.lines
                    .push(format!("let {next} = where({iota} == {i}, {gone}, {cur});"));
                cur = next;
            }
        }
        let mut shape = x.shape.clone();
        shape[a] = k as usize;
        let join = |v: &[String]| {
            if v.len() == 1 {
                v[0].clone()
            } else {
                format!("concat([{}], axis={a})", v.join(", "))
            }
        };
        self.bind(cx, 0, join(&values), dt, shape.clone())?;
        self.bind(cx, 1, join(&indices), DType::I64, shape)
    }

    fn trilu(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["upper"])?;
        let x = self.need(cx, 0)?;
        let r = x.shape.len();
        if r < 2 {
            return Err(cx.err("needs an input of rank 2 or more"));
        }
        let k = match self.ints_input(cx, 1, "k")? {
            Some(v) => *v.first().ok_or_else(|| cx.err("k is empty"))?,
            None => 0,
        };
        let upper = cx.int("upper", 1) != 0;
        let (n, m) = (x.shape[r - 2], x.shape[r - 1]);
        // The kept positions as a constant mask over the last two axes.
        let keep: Vec<f64> = (0..n * m)
            .map(|p| {
                let (i, j) = ((p / m) as i64, (p % m) as i64);
                f64::from(u8::from(if upper { j - i >= k } else { j - i <= k }))
            })
            .collect();
        let mask = self.fresh("mask");
        let d = Data::new(DType::Bool, vec![n, m], keep);
        self.lines
            .push(format!("let {mask} = {};", crate::constant_text(&d)));
        let ex = self.e(cx, 0)?;
        let zero = if x.dtype == DType::Bool {
            "false".to_string()
        } else {
            literal(0.0, x.dtype)
        };
        self.bind(
            cx,
            0,
            format!("where({mask}, {ex}, {zero})"),
            x.dtype,
            x.shape,
        )
    }

    fn one_hot(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis"])?;
        let ind = self.need(cx, 0)?;
        let depth = self
            .input(cx, 1)
            .and_then(|v| v.data)
            .ok_or_else(|| cx.err("depth (input 1) must be a constant; dlc shapes are static"))?;
        let depth = *depth
            .values
            .first()
            .ok_or_else(|| cx.err("depth (input 1) is empty"))?;
        if !(depth >= 1.0 && depth <= (1u64 << 24) as f64) {
            return Err(cx.err(format!("depth {depth} must be a positive count")));
        }
        let depth = depth as usize;
        let values = self.need(cx, 2)?;
        if values.shape != [2] {
            return Err(cx.err("values must hold [off, on]"));
        }
        let r = ind.shape.len() + 1;
        let a = cx.axis(cx.int("axis", -1), r)?;
        let mut shape = ind.shape.clone();
        shape.insert(a, depth);
        let mut expanded = ind.shape.clone();
        expanded.insert(a, 1);
        let (ei, ev) = (self.e(cx, 0)?, self.e(cx, 2)?);
        // Indices as i64 (floats truncate), negative ones counted from the end.
        let idx = if ind.dtype == DType::I64 {
            ei
        } else {
            format!("cast({ei}, i64)")
        };
        let idx = format!("reshape({idx}, {})", shape_text(&expanded));
        let norm = self.fresh("index");
        self.lines.push(format!(
            "let {norm} = where({idx} < 0, {idx} + {depth}, {idx});"
        ));
        let iota = self.iota(&shape, a, DType::I64);
        let vd = values.dtype;
        let (off, on) = (
            format!("slice({ev}, axis=0, start=0, end=1)"),
            format!("slice({ev}, axis=0, start=1, end=2)"),
        );
        self.bind(
            cx,
            0,
            format!("where({norm} == {iota}, {on}, {off})"),
            vd,
            shape,
        )
    }

    fn cumsum(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["exclusive", "reverse"])?;
        let x = self.need(cx, 0)?;
        if x.dtype == DType::Bool {
            return Err(cx.err("is not defined on bool"));
        }
        let axis = self
            .ints_input(cx, 1, "axis")?
            .and_then(|v| v.first().copied())
            .ok_or_else(|| cx.err("input 1 (axis) is required"))?;
        let a = cx.axis(axis, x.shape.len())?;
        let n = x.shape[a];
        let prod = cx.op() == "CumProd";
        if n > 4096 {
            return Err(cx.err(format!(
                "a running {} over {n} elements is not supported (at most 4096)",
                if prod { "product" } else { "sum" }
            )));
        }
        let (excl, rev) = (cx.int("exclusive", 0) != 0, cx.int("reverse", 0) != 0);
        // out[.., i, ..] = sum (product) over k of x[.., k, ..] where m[k,
        // i] marks the k that position i takes (a where, not a product
        // with the mask, so an infinity outside the prefix is not a NaN).
        let m: Vec<f64> = (0..n * n)
            .map(|p| {
                let (k, i) = (p / n, p % n);
                let inside = match (rev, excl) {
                    (false, false) => k <= i,
                    (false, true) => k < i,
                    (true, false) => k >= i,
                    (true, true) => k > i,
                };
                f64::from(u8::from(inside))
            })
            .collect();
        let dt = x.dtype;
        let mask = self.fresh("prefix");
        self.lines.push(format!(
            "let {mask} = {};",
            crate::constant_text(&Data::new(dt, vec![n, n], m))
        ));
        let idx: Vec<String> = (0..x.shape.len()).map(|i| format!("i{i}")).collect();
        let mut read = idx.clone();
        read[a] = "k".into();
        let name = self.fresh(if prod { "cumprod" } else { "cumsum" });
        let (f, unit) = if prod { ("prod", 1.0) } else { ("sum", 0.0) };
        self.ops.push(format!(
            "op {name}(x: {t}, m: {mt}) -> {t} {{\n    out[{}] = {f}[k](where(m[k, i{a}] > {zero}, x[{}], {unit}));\n}}",
            idx.join(", "),
            read.join(", "),
            t = type_text(dt, &x.shape),
            mt = type_text(dt, &[n, n]),
            zero = literal(0.0, dt),
            unit = literal(unit, dt),
        ));
        let ex = self.e(cx, 0)?;
        self.bind(cx, 0, format!("{name}({ex}, {mask})"), dt, x.shape)
    }

    /// `RNN`, `GRU` and `LSTM`, unrolled over the (static) sequence: the
    /// input projection of every step as one product, then per step the
    /// recurrent product and the gates, in each direction; the outputs
    /// stacked. Follows ONNX's definitions (gate orders z, r, h and i, o,
    /// f, c; `linear_before_reset`; peepholes; `layout`).
    fn recurrent(&mut self, cx: &Cx<'_>) -> R<()> {
        let rec = self.recurrence(cx)?;
        let acts = activations(cx, &rec)?;
        let (dt, batch, h) = (rec.dt, rec.batch, rec.h);
        let transposed = |e: String| {
            if rec.batchwise {
                format!("transpose({e}, [1, 0, 2])")
            } else {
                e
            }
        };
        let optional = |me: &mut Self, i: usize| -> R<Option<String>> {
            match me.input(cx, i) {
                Some(_) => me.e(cx, i).map(Some),
                None => Ok(None),
            }
        };
        let lstm = rec.cell == Cell::Lstm;
        // In the operands' order: each names its constant on first use.
        let x = transposed(self.e(cx, 0)?);
        let (w, r, b) = (self.e(cx, 1)?, self.e(cx, 2)?, optional(self, 3)?);
        let h0 = optional(self, 5)?.map(transposed);
        let c0 = if lstm { optional(self, 6)? } else { None };
        let p = if lstm { optional(self, 7)? } else { None };
        let inputs = RecurrentInputs {
            x,
            w,
            r,
            b,
            h0,
            c0: c0.map(transposed),
            p,
        };
        let (mut ys, mut hs, mut cs) = (Vec::new(), Vec::new(), Vec::new());
        for d in 0..rec.dirs {
            let acts = &acts[d * rec.per..(d + 1) * rec.per];
            let (y, hn, cn) = self.recurrent_direction(cx, &rec, &inputs, acts, d)?;
            ys.push(y);
            hs.push(format!("reshape({hn}, [1, {batch}, {h}])"));
            cs.push(format!("reshape({cn}, [1, {batch}, {h}])"));
        }
        let join = |v: &[String], axis: usize| {
            if v.len() == 1 {
                v[0].clone()
            } else {
                format!("concat([{}], axis={axis})", v.join(", "))
            }
        };
        let (mut y, mut yh, mut yc) = (join(&ys, 1), join(&hs, 0), join(&cs, 0));
        let (seq, dirs) = (rec.seq, rec.dirs);
        let mut y_shape = vec![seq, dirs, batch, h];
        let mut s_shape = vec![dirs, batch, h];
        if rec.batchwise {
            y = format!("transpose({y}, [2, 0, 1, 3])");
            yh = format!("transpose({yh}, [1, 0, 2])");
            yc = format!("transpose({yc}, [1, 0, 2])");
            y_shape = vec![batch, seq, dirs, h];
            s_shape = vec![batch, dirs, h];
        }
        self.bind(cx, 0, y, dt, y_shape)?;
        self.bind(cx, 1, yh, dt, s_shape.clone())?;
        if lstm {
            self.bind(cx, 2, yc, dt, s_shape)?;
        }
        Ok(())
    }

    /// A recurrent node's attributes and operands, checked against each
    /// other.
    fn recurrence(&self, cx: &Cx<'_>) -> R<Recurrence> {
        let op = cx.op();
        let cell = match op {
            "LSTM" => Cell::Lstm,
            "GRU" => Cell::Gru,
            _ => Cell::Rnn,
        };
        let mut attrs = vec![
            "activation_alpha",
            "activation_beta",
            "activations",
            "clip",
            "direction",
            "hidden_size",
            "layout",
        ];
        match cell {
            Cell::Gru => attrs.push("linear_before_reset"),
            Cell::Lstm => attrs.push("input_forget"),
            Cell::Rnn => {}
        }
        cx.allow(&attrs)?;
        if cx.attr("clip").is_some() {
            return Err(cx.err("clip is not supported"));
        }
        if cx.int("input_forget", 0) != 0 {
            return Err(cx.err("input_forget is not supported"));
        }
        let (gates, per) = match cell {
            Cell::Lstm => (4, 3),
            Cell::Gru => (3, 2),
            Cell::Rnn => (1, 1),
        };
        let (x, w, r) = (self.need(cx, 0)?, self.need(cx, 1)?, self.need(cx, 2)?);
        cx.float_input(&x)?;
        let dt = x.dtype;
        let batchwise = cx.int("layout", 0) != 0;
        if x.shape.len() != 3 || w.shape.len() != 3 || r.shape.len() != 3 {
            return Err(cx.err("X, W and R must be 3-D"));
        }
        let (seq, batch, inp) = if batchwise {
            (x.shape[1], x.shape[0], x.shape[2])
        } else {
            (x.shape[0], x.shape[1], x.shape[2])
        };
        let dirs = w.shape[0];
        let h = r.shape[2];
        let direction = cx.string("direction", "forward");
        let expected = match direction.as_str() {
            "forward" | "reverse" => 1,
            "bidirectional" => 2,
            other => return Err(cx.err(format!("direction `{other}` is not valid"))),
        };
        if dirs != expected
            || w.shape != [dirs, gates * h, inp]
            || r.shape != [dirs, gates * h, h]
            || w.dtype != dt
            || r.dtype != dt
            || cx
                .attr("hidden_size")
                .is_some_and(|_| cx.int("hidden_size", 0) != h as i64)
        {
            return Err(cx.err(format!(
                "W {} and R {} do not fit X {} ({direction}, {gates} gates of hidden size {h})",
                type_text(w.dtype, &w.shape),
                type_text(r.dtype, &r.shape),
                type_text(x.dtype, &x.shape)
            )));
        }
        self.check_operand(cx, 3, dt, &[dirs, 2 * gates * h], true)?;
        if let Some(lens) = self.input(cx, 4) {
            let full = lens
                .data
                .as_ref()
                .is_some_and(|d| d.values.iter().all(|&v| v == seq as f64));
            if !full {
                return Err(cx.err(format!(
                    "sequence_lens must be a constant whose every element is the sequence \
                     length {seq} (shorter sequences are not supported)"
                )));
            }
        }
        let state_shape = if batchwise {
            [batch, dirs, h]
        } else {
            [dirs, batch, h]
        };
        self.check_operand(cx, 5, dt, &state_shape, true)?;
        if cell == Cell::Lstm {
            self.check_operand(cx, 6, dt, &state_shape, true)?;
            self.check_operand(cx, 7, dt, &[dirs, 3 * h], true)?;
        }
        Ok(Recurrence {
            cell,
            gates,
            per,
            seq,
            batch,
            inp,
            dirs,
            h,
            batchwise,
            direction,
            dt,
            linear_before_reset: cell == Cell::Gru && cx.int("linear_before_reset", 0) != 0,
        })
    }

    /// One direction `d` of a recurrent node: the input projection of
    /// every step at once, then the steps. Returns the stacked outputs
    /// and the last hidden (and, for an LSTM, cell) state.
    fn recurrent_direction(
        &mut self,
        cx: &Cx<'_>,
        rec: &Recurrence,
        inputs: &RecurrentInputs,
        acts: &[Activation],
        d: usize,
    ) -> R<(String, String, String)> {
        let (seq, batch, inp, h) = (rec.seq, rec.batch, rec.inp, rec.h);
        let gh = rec.gates * h;
        let pick = |e: &str, shape: &str| {
            format!(
                "reshape(slice({e}, axis=0, start={d}, end={}), {shape})",
                d + 1
            )
        };
        // The input projection of every step at once, with W's bias.
        let mut xw = format!(
            "reshape(reshape({}, [{}, {inp}]) @ transpose({}), [{seq}, {batch}, {gh}])",
            inputs.x,
            seq * batch,
            pick(&inputs.w, &format!("[{gh}, {inp}]"))
        );
        if let Some(b) = &inputs.b {
            xw = format!(
                "{xw} + slice({}, axis=0, start=0, end={gh})",
                pick(b, &format!("[{}]", 2 * gh))
            );
        }
        let xw_name = self.fresh("xw");
        self.lines.push(format!("let {xw_name} = {xw};"));
        let rt = self.fresh("rt");
        self.lines.push(format!(
            "let {rt} = transpose({});",
            pick(&inputs.r, &format!("[{gh}, {h}]"))
        ));
        let rb = inputs.b.as_ref().map(|b| {
            let n = self.fresh("rb");
            self.lines.push(format!(
                "let {n} = slice({}, axis=0, start={gh}, end={});",
                pick(b, &format!("[{}]", 2 * gh)),
                2 * gh
            ));
            n
        });
        let peep: Option<[String; 3]> = inputs.p.as_ref().map(|p| {
            let n = self.fresh("peep");
            self.lines
                .push(format!("let {n} = {};", pick(p, &format!("[{}]", 3 * h))));
            [0, 1, 2].map(|k| format!("slice({n}, axis=0, start={}, end={})", k * h, (k + 1) * h))
        });
        let zeros = format!(
            "full([{batch}, {h}], {}, dtype={})",
            literal(0.0, rec.dt),
            rec.dt
        );
        let start = |s: &Option<String>| match s {
            Some(e) => pick(e, &format!("[{batch}, {h}]")),
            None => zeros.clone(),
        };
        let (mut hcur, mut ccur) = (start(&inputs.h0), start(&inputs.c0));
        let step = Step {
            rt: &rt,
            rb: rb.as_deref(),
            peep: peep.as_ref(),
            acts,
        };
        let reverse = rec.direction == "reverse" || d == 1;
        let mut outs = vec![String::new(); seq];
        for s in 0..seq {
            let t = if reverse { seq - 1 - s } else { s };
            let xt = format!(
                "reshape(slice({xw_name}, axis=0, start={t}, end={}), [{batch}, {gh}])",
                t + 1
            );
            let (hn, cn) = self.recurrent_step(cx, rec, &step, &xt, &hcur, &ccur)?;
            outs[t] = format!("reshape({hn}, [1, 1, {batch}, {h}])");
            (hcur, ccur) = (hn, cn);
        }
        let y = format!("concat([{}], axis=0)", outs.join(", "));
        Ok((y, hcur, ccur))
    }

    /// One step of a recurrent cell from input projection `xt`, hidden
    /// state `hcur` and cell state `ccur`: the new hidden and cell state.
    fn recurrent_step(
        &mut self,
        cx: &Cx<'_>,
        rec: &Recurrence,
        step: &Step<'_>,
        xt: &str,
        hcur: &str,
        ccur: &str,
    ) -> R<(String, String)> {
        let (h, gh, rt) = (rec.h, rec.gates * rec.h, step.rt);
        let part =
            |e: &str, k: usize| format!("slice({e}, axis=1, start={}, end={})", k * h, (k + 1) * h);
        let with_rb = |e: String, lo: usize, hi: usize| match step.rb {
            Some(b) => format!("{e} + slice({b}, axis=0, start={lo}, end={hi})"),
            None => e,
        };
        let act = |k: usize| {
            step.acts
                .get(k)
                .ok_or_else(|| cx.err(format!("{} needs {} activations", cx.op(), rec.per)))
        };
        let f = act(0)?;
        let hn = self.fresh("h");
        match rec.cell {
            Cell::Gru => {
                let g = act(1)?;
                // z and r from the first 2h columns of R.
                let zr = self.fresh("zr");
                let rzr = format!("slice({rt}, axis=1, start=0, end={})", 2 * h);
                let pre = with_rb(
                    format!(
                        "slice({xt}, axis=1, start=0, end={}) + {hcur} @ {rzr}",
                        2 * h
                    ),
                    0,
                    2 * h,
                );
                self.lines.push(format!("let {zr} = {};", f(&pre)));
                let (z, rg) = (part(&zr, 0), part(&zr, 1));
                let rh = format!("slice({rt}, axis=1, start={}, end={gh})", 2 * h);
                let xh = part(xt, 2);
                let cand = if rec.linear_before_reset {
                    format!(
                        "{xh} + {rg} * ({})",
                        with_rb(format!("{hcur} @ {rh}"), 2 * h, gh)
                    )
                } else {
                    with_rb(format!("{xh} + ({rg} * {hcur}) @ {rh}"), 2 * h, gh)
                };
                let hc = self.fresh("cand");
                self.lines.push(format!("let {hc} = {};", g(&cand)));
                self.lines
                    .push(format!("let {hn} = (1.0 - {z}) * {hc} + {z} * {hcur};"));
                Ok((hn, ccur.to_string()))
            }
            Cell::Lstm => {
                let (g, hf) = (act(1)?, act(2)?);
                let gs = self.fresh("gates");
                self.lines.push(format!(
                    "let {gs} = {};",
                    with_rb(format!("{xt} + {hcur} @ {rt}"), 0, gh)
                ));
                let with_peep = |e: String, k: usize, c: &str| match step.peep {
                    Some(p) => format!("{e} + {} * {c}", p[k]),
                    None => e,
                };
                let (ig, og, fg, cg) = (part(&gs, 0), part(&gs, 1), part(&gs, 2), part(&gs, 3));
                let cn = self.fresh("c");
                let i_ = f(&with_peep(ig, 0, ccur));
                let f_ = f(&with_peep(fg, 2, ccur));
                self.lines
                    .push(format!("let {cn} = {f_} * {ccur} + {i_} * {};", g(&cg)));
                let o_ = f(&with_peep(og, 1, &cn));
                self.lines.push(format!("let {hn} = {o_} * {};", hf(&cn)));
                Ok((hn, cn))
            }
            Cell::Rnn => {
                let pre = with_rb(format!("{xt} + {hcur} @ {rt}"), 0, h);
                self.lines.push(format!("let {hn} = {};", f(&pre)));
                Ok((hn, ccur.to_string()))
            }
        }
    }

    /// `DFT` as products with constant cosine and sine matrices along the
    /// signal axis (moved last): forward, inverse (divided by the length),
    /// one-sided (the first `L/2 + 1` bins) and its inverse (a real signal
    /// from a Hermitian half spectrum, as `numpy.fft.irfft`); `dft_length`
    /// truncates or zero-pads the signal.
    fn dft(&mut self, cx: &Cx<'_>) -> R<()> {
        let attr_axis = cx.opset < 20;
        cx.allow(if attr_axis {
            &["axis", "inverse", "onesided"]
        } else {
            &["inverse", "onesided"]
        })?;
        let x = self.need(cx, 0)?;
        cx.float_input(&x)?;
        let r = x.shape.len();
        let c = *x.shape.last().unwrap_or(&0);
        if r < 2 || !(c == 1 || c == 2) {
            return Err(cx.err("the input must end in an axis of 1 (real) or 2 (complex)"));
        }
        let axis = if attr_axis {
            cx.int("axis", 1)
        } else {
            match self.ints_input(cx, 2, "axis")? {
                Some(v) => *v.first().ok_or_else(|| cx.err("axis is empty"))?,
                None => -2,
            }
        };
        let a = cx.axis(axis, r)?;
        if a == r - 1 {
            return Err(cx.err("the signal axis cannot be the last (real, imaginary) axis"));
        }
        let (inverse, onesided) = (cx.int("inverse", 0) != 0, cx.int("onesided", 0) != 0);
        let n = x.shape[a];
        let len = match self.ints_input(cx, 1, "dft_length")? {
            Some(v) => *v.first().ok_or_else(|| cx.err("dft_length is empty"))?,
            None if inverse && onesided => 2 * (n as i64 - 1),
            None => n as i64,
        };
        if !(1..=4096).contains(&len) || n > 4096 {
            return Err(cx.err(format!("a length of {len} is not supported (1 to 4096)")));
        }
        let l = len as usize;
        let dt = x.dtype;
        let tau = 2.0 * std::f64::consts::PI;
        // Matrices [n, m]: row k is input bin k, column j output bin j.
        let (m, cos, sin): (usize, Vec<f64>, Vec<f64>) = if inverse && onesided {
            let half = l / 2 + 1;
            let mut cm = vec![0.0; n * l];
            let mut sm = vec![0.0; n * l];
            for k in 0..n.min(half) {
                // Every bin but 0 (and L/2, L even) stands for its mirror too.
                let edge = k == 0 || (l.is_multiple_of(2) && k == l / 2);
                let w = if edge { 1.0 } else { 2.0 } / l as f64;
                for t in 0..l {
                    let th = tau * ((k * t) % l) as f64 / l as f64;
                    cm[k * l + t] = w * th.cos();
                    sm[k * l + t] = if edge { 0.0 } else { -w * th.sin() };
                }
            }
            (l, cm, sm)
        } else {
            let m = if onesided { l / 2 + 1 } else { l };
            let scale = if inverse { 1.0 / l as f64 } else { 1.0 };
            let mut cm = vec![0.0; n * m];
            let mut sm = vec![0.0; n * m];
            for k in 0..n.min(l) {
                for j in 0..m {
                    let th = tau * ((k * j) % l) as f64 / l as f64;
                    cm[k * m + j] = scale * th.cos();
                    sm[k * m + j] = scale * th.sin();
                }
            }
            (m, cm, sm)
        };
        // In f64, rounded once at the end: the cancellations of an inverse
        // transform leave f32 round-off otherwise.
        let w = DType::F64;
        let cname = self.fresh("dft_cos");
        self.lines.push(format!(
            "let {cname} = {};",
            crate::constant_text(&Data::new(w, vec![n, m], cos))
        ));
        let sname = self.fresh("dft_sin");
        self.lines.push(format!(
            "let {sname} = {};",
            crate::constant_text(&Data::new(w, vec![n, m], sin))
        ));
        // The real and imaginary parts, the signal axis last.
        let ex = self.e(cx, 0)?;
        let mut perm: Vec<usize> = (0..r - 1).filter(|&i| i != a).collect();
        perm.push(a);
        let mut inv = vec![0; r - 1];
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        let perm_t = |v: &[usize]| {
            format!(
                "[{}]",
                v.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let mut flat = x.shape[..r - 1].to_vec();
        let part = |k: usize| {
            format!(
                "transpose(reshape(cast(slice({ex}, axis={}, start={k}, end={}), f64), {}), {})",
                r - 1,
                k + 1,
                shape_text(&flat),
                perm_t(&perm)
            )
        };
        let xr = self.fresh("re");
        self.lines.push(format!("let {xr} = {};", part(0)));
        let xi = if c == 2 {
            let xi = self.fresh("im");
            self.lines.push(format!("let {xi} = {};", part(1)));
            Some(xi)
        } else {
            None
        };
        let prod = |e: &str, mat: &str| format!("{e} @ {mat}");
        // (re, im) of the result, each [..., m] with the signal axis last.
        let (re, im) = match (&xi, inverse) {
            (None, false) => (prod(&xr, &cname), Some(format!("-({})", prod(&xr, &sname)))),
            (None, true) => (prod(&xr, &cname), Some(prod(&xr, &sname))),
            (Some(xi), false) => (
                format!("{} + {}", prod(&xr, &cname), prod(xi, &sname)),
                Some(format!("{} - {}", prod(xi, &cname), prod(&xr, &sname))),
            ),
            (Some(xi), true) if onesided => (
                format!("{} + {}", prod(&xr, &cname), prod(xi, &sname)),
                None,
            ),
            (Some(xi), true) => (
                format!("{} - {}", prod(&xr, &cname), prod(xi, &sname)),
                Some(format!("{} + {}", prod(xi, &cname), prod(&xr, &sname))),
            ),
        };
        let (re, im) = if inverse && onesided && xi.is_none() {
            (prod(&xr, &cname), None)
        } else {
            (re, im)
        };
        flat[a] = m;
        let mut moved: Vec<usize> = perm.iter().map(|&p| flat[p]).collect();
        moved.push(1);
        let mut back = inv.clone();
        back.push(r - 1);
        let restore = |e: &str| {
            format!(
                "transpose(reshape({e}, {}), {})",
                shape_text(&moved),
                perm_t(&back)
            )
        };
        let out = match im {
            Some(im) => format!(
                "cast(concat([{}, {}], axis={}), {dt})",
                restore(&re),
                restore(&im),
                r - 1
            ),
            None => format!("cast({}, {dt})", restore(&re)),
        };
        let mut shape = flat;
        shape.push(if inverse && onesided { 1 } else { 2 });
        self.bind(cx, 0, out, dt, shape)
    }

    /// `RotaryEmbedding`: each head's first `rotary_embedding_dim`
    /// features rotated pairwise (halves, or even/odd when interleaved) by
    /// the cached cosines and sines of each position (gathered by
    /// `position_ids` when given); the rest pass through.
    fn rotary(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["interleaved", "num_heads", "rotary_embedding_dim"])?;
        let x = self.need(cx, 0)?;
        cx.float_input(&x)?;
        let dt = x.dtype;
        let (b, s, h, d) = match x.shape[..] {
            [b, s, hidden] => {
                let h = cx.int("num_heads", 0);
                if h < 1 || hidden % h as usize != 0 {
                    return Err(cx.err("a 3-D input needs num_heads dividing its hidden size"));
                }
                (b, s, h as usize, hidden / h as usize)
            }
            [b, h, s, d] => (b, s, h, d),
            _ => return Err(cx.err("the input must be 3-D or 4-D")),
        };
        let rot = match cx.int("rotary_embedding_dim", 0) {
            0 => d,
            r if r > 0 && r as usize <= d && r % 2 == 0 => r as usize,
            r => {
                return Err(cx.err(format!(
                    "rotary_embedding_dim = {r} does not fit heads of {d}"
                )));
            }
        };
        let half = rot / 2;
        let ex = self.e(cx, 0)?;
        let x4 = if x.shape.len() == 3 {
            format!("reshape({ex}, [{b}, {s}, {h}, {d}])")
        } else {
            format!("transpose({ex}, [0, 2, 1, 3])")
        };
        let xn = self.fresh("x");
        self.lines.push(format!("let {xn} = {x4};"));
        let mut cache = |i: usize| -> R<String> {
            let c = self.need(cx, i)?;
            let name = if self.input(cx, 3).is_some() {
                let pos = cx.node.input[3].clone();
                let axis = AttributeProto {
                    name: Some("axis".into()),
                    i: Some(0),
                    r#type: Some(AttributeType::Int as i32),
                    ..Default::default()
                };
                self.sub_node(
                    cx,
                    "Gather",
                    vec![cx.node.input[i].clone(), pos],
                    vec![axis],
                )?
            } else {
                cx.node.input[i].clone()
            };
            let v = self
                .vals
                .get(&name)
                .cloned()
                .ok_or_else(|| cx.err("no cache"))?;
            if v.shape != [b, s, half] || c.dtype != dt {
                return Err(cx.err(format!(
                    "the cos/sin cache gives {} per position; it must be {}",
                    type_text(v.dtype, &v.shape),
                    type_text(dt, &[b, s, half])
                )));
            }
            let e = self.var_of(&name)?;
            Ok(format!("reshape({e}, [{b}, {s}, 1, {half}])"))
        };
        let (cos, sin) = (cache(1)?, cache(2)?);
        let (cn, sn) = (self.fresh("cos"), self.fresh("sin"));
        self.lines.push(format!("let {cn} = {cos};"));
        self.lines.push(format!("let {sn} = {sin};"));
        let xr = format!("slice({xn}, axis=3, start=0, end={rot})");
        let interleaved = cx.int("interleaved", 0) != 0;
        let (x1, x2) = if interleaved {
            let pairs = format!("reshape({xr}, [{b}, {s}, {h}, {half}, 2])");
            let pick = |k: usize| {
                format!(
                    "reshape(slice({pairs}, axis=4, start={k}, end={}), [{b}, {s}, {h}, {half}])",
                    k + 1
                )
            };
            (pick(0), pick(1))
        } else {
            (
                format!("slice({xr}, axis=3, start=0, end={half})"),
                format!("slice({xr}, axis=3, start={half}, end={rot})"),
            )
        };
        let (n1, n2) = (self.fresh("x1"), self.fresh("x2"));
        self.lines.push(format!("let {n1} = {x1};"));
        self.lines.push(format!("let {n2} = {x2};"));
        let real = format!("{cn} * {n1} - {sn} * {n2}");
        let imag = format!("{sn} * {n1} + {cn} * {n2}");
        let mut out = if interleaved {
            let five = format!("[{b}, {s}, {h}, {half}, 1]");
            format!(
                "reshape(concat([reshape({real}, {five}), reshape({imag}, {five})], axis=4), [{b}, {s}, {h}, {rot}])"
            )
        } else {
            format!("concat([{real}, {imag}], axis=3)")
        };
        if rot < d {
            out = format!("concat([{out}, slice({xn}, axis=3, start={rot}, end={d})], axis=3)");
        }
        let out = if x.shape.len() == 3 {
            format!("reshape({out}, {})", shape_text(&x.shape))
        } else {
            format!("transpose({out}, [0, 2, 1, 3])")
        };
        self.bind(cx, 0, out, dt, x.shape)
    }

    /// `LRN`: each element over `(bias + alpha / size * s)^beta`, `s` the
    /// sum of squares over `size` channels around it (an operator in index
    /// notation; channels past the edges read zero).
    fn lrn(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["alpha", "beta", "bias", "size"])?;
        let x = self.need(cx, 0)?;
        cx.float_input(&x)?;
        let r = x.shape.len();
        cx.spatial_input(r)?;
        let size = cx.int("size", 0);
        if !(1..=4096).contains(&size) {
            return Err(cx.err(format!("size = {size} is not supported")));
        }
        let dt = x.dtype;
        let l = |v: f64| literal(v, dt);
        let lo = (size - 1) / 2;
        let scale = l(cx.float("alpha", 1e-4) / size as f64);
        let (beta, bias) = (l(cx.float("beta", 0.75)), l(cx.float("bias", 1.0)));
        let idx: Vec<String> = (0..r).map(|a| format!("i{a}")).collect();
        let mut near = idx.clone();
        near[1] = if lo == 0 {
            "i1 + k".into()
        } else {
            format!("i1 + k - {lo}")
        };
        let name = self.fresh("lrn");
        self.ops.push(format!(
            "op {name}(x: {t}) -> {t} {{\n    let sq[{i}] = x[{i}] * x[{i}];\n    out[{i}] = x[{i}] / pow({bias} + {scale} * sum[k in 0..{size}](sq[{n}]), {beta});\n}}",
            t = type_text(dt, &x.shape),
            i = idx.join(", "),
            n = near.join(", "),
        ));
        let ex = self.e(cx, 0)?;
        self.bind(cx, 0, format!("{name}({ex})"), dt, x.shape)
    }

    /// `EyeLike`: a constant with ones on diagonal `k`.
    fn eye_like(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["dtype", "k"])?;
        let x = self.need(cx, 0)?;
        if x.shape.len() != 2 {
            return Err(cx.err("needs a 2-D input"));
        }
        let dt = match cx.attr("dtype") {
            Some(a) => dtype_of(a.i() as i32).ok_or_else(|| {
                cx.err(format!(
                    "element type {} is not supported",
                    onnx_type_name(a.i() as i32)
                ))
            })?,
            None => x.dtype,
        };
        let k = cx.int("k", 0);
        let (n, m) = (x.shape[0], x.shape[1]);
        let values = (0..n * m)
            .map(|p| f64::from(u8::from((p % m) as i64 - (p / m) as i64 == k)))
            .collect();
        self.bind_data(cx, 0, Data::new(dt, x.shape.clone(), values))
    }

    /// The indices (input `i`) of a scatter or gather as i64 with negative
    /// ones counted from the end of an axis of extent `n` (for GatherND and
    /// ScatterND, whose last axis indexes several axes, per column: `dims`).
    fn indices_input(&mut self, cx: &Cx<'_>, i: usize, dims: &[usize]) -> R<String> {
        let ind = self.need(cx, i)?;
        if !matches!(ind.dtype, DType::I32 | DType::I64) {
            return Err(cx.err(format!("indices must be i32 or i64, got {}", ind.dtype)));
        }
        let mut e = self.e(cx, i)?;
        if ind.dtype != DType::I64 {
            e = format!("cast({e}, i64)");
        }
        // The extents to add to a negative index, broadcast along the last
        // axis (one per column) or a scalar.
        let ext = if dims.len() == 1 {
            dims[0].to_string()
        } else {
            crate::constant_text(&Data::new(
                DType::I64,
                vec![dims.len()],
                dims.iter().map(|&d| d as f64).collect(),
            ))
        };
        let name = self.fresh("indices");
        self.lines
            .push(format!("let {name} = where({e} < 0, {e} + {ext}, {e});"));
        Ok(name)
    }

    /// The position, in the first `k` axes of `shape` taken as one, of
    /// each index tuple: `columns` are the i64 expressions (negative ones
    /// already counted from the end) of the tuple's coordinates, each with
    /// the axis of `shape` it indexes, and `iotas` the axes of the indices
    /// (of rank `rank`) that are coordinates of their own, each with its
    /// axis of `shape` and its extent. A tuple with a coordinate outside its axis gets the
    /// extent of the whole, which `gather` reads as zero and `scatter_add`
    /// adds nowhere.
    fn flat_positions(
        &mut self,
        shape: &[usize],
        k: usize,
        columns: &[(String, usize)],
        iotas: &[(usize, usize, usize)],
        rank: usize,
    ) -> String {
        let stride = |a: usize| shape[a + 1..k].iter().product::<usize>();
        let mut terms: Vec<String> = columns
            .iter()
            .map(|(e, a)| format!("{e} * {}", stride(*a)))
            .collect();
        let mut inside: Vec<String> = columns
            .iter()
            .map(|(e, a)| format!("logical_and({e} >= 0, {e} < {})", shape[*a]))
            .collect();
        for &(q, a, n) in iotas {
            let mut at = vec![1; rank];
            at[q] = n;
            let iota = self.iota(&at, q, DType::I64);
            terms.push(format!("{iota} * {}", stride(a)));
        }
        let whole: usize = shape[..k].iter().product();
        let first = inside.remove(0);
        let inside = inside
            .into_iter()
            .fold(first, |acc, c| format!("logical_and({acc}, {c})"));
        let name = self.fresh("positions");
        self.lines.push(format!(
            "let {name} = where({inside}, {}, {whole});",
            terms.join(" + ")
        ));
        name
    }

    /// A scatter with reduction `add` (`add`) or `none` as `scatter_add`
    /// on `x` flattened to `[P, rest..]` (`P` its first `k` axes) at
    /// `positions`, the updates of shape `index_shape` and `rest`
    /// ([`scatter_none_or_add`]).
    #[allow(clippy::too_many_arguments)]
    fn scatter_as_add(
        &mut self,
        ex: &str,
        shape: &[usize],
        k: usize,
        dt: DType,
        positions: &str,
        index_shape: &[usize],
        eu: &str,
        add: bool,
    ) -> String {
        let mut flat = vec![shape[..k].iter().product::<usize>()];
        flat.extend(&shape[k..]);
        let mut upd_shape = index_shape.to_vec();
        upd_shape.extend(&shape[k..]);
        let fx = format!("reshape({ex}, {})", shape_text(&flat));
        let sum = scatter_none_or_add(&fx, &flat, &upd_shape, dt, eu, add, |base, u| {
            format!("scatter_add({base}, {positions}, {u})")
        });
        format!("reshape({sum}, {})", shape_text(shape))
    }

    /// `ScatterElements`: each output element is the update whose index
    /// (along `axis`, the other coordinates equal) names it, or the data
    /// where none does; with a reduction, the data combined with every
    /// such update. In index notation against an iota over the axis and a
    /// mask of ones (an index read past the indices' extents is no index).
    fn scatter_elements(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis", "reduction"])?;
        let (x, ind, upd) = (self.need(cx, 0)?, self.need(cx, 1)?, self.need(cx, 2)?);
        let r = x.shape.len();
        if r == 0 {
            return Err(cx.err("needs data of rank 1 or more"));
        }
        let axis = cx.axis(cx.int("axis", 0), r)?;
        if ind.shape != upd.shape
            || ind.shape.len() != r
            || (0..r).any(|a| ind.shape[a] > x.shape[a])
            || upd.dtype != x.dtype
        {
            return Err(cx.err(format!(
                "indices {} and updates {} do not fit data {}",
                shape_text(&ind.shape),
                type_text(upd.dtype, &upd.shape),
                type_text(x.dtype, &x.shape)
            )));
        }
        if x.dtype == DType::Bool {
            return Err(cx.err("a scatter of bool is not supported"));
        }
        let dt = x.dtype;
        let n = x.shape[axis];
        let ei = self.indices_input(cx, 1, &[n])?;
        let reduction = cx.string("reduction", "none");
        if matches!(reduction.as_str(), "none" | "add") {
            // The language's `scatter_add_elements`.
            let (ex, eu) = (self.e(cx, 0)?, self.e(cx, 2)?);
            let add = reduction == "add";
            let e = scatter_none_or_add(&ex, &x.shape, &ind.shape, dt, &eu, add, |base, u| {
                format!("scatter_add_elements({base}, {ei}, {u}, axis={axis})")
            });
            return self.bind(cx, 0, e, dt, x.shape);
        }
        let iota = self.iota(&[n], 0, DType::I64);
        let o: Vec<String> = (0..r).map(|a| format!("i{a}")).collect();
        let mut q = o.clone();
        q[axis] = "k".into();
        let (o, q) = (o.join(", "), q.join(", "));
        let hit = format!("ind[{q}] == io[i{axis}]");
        let zero = literal(0.0, dt);
        let found = format!("sum[k](where({hit}, m[{q}], {zero}))");
        let body = match reduction.as_str() {
            "none" => {
                format!("where({found} > {zero}, sum[k](where({hit}, u[{q}], {zero})), x[{o}])")
            }
            "add" => format!("x[{o}] + sum[k](where({hit}, u[{q}], {zero}))"),
            "mul" => format!(
                "x[{o}] * prod[k](where({hit}, u[{q}], {}))",
                literal(1.0, dt)
            ),
            "max" | "min" => format!(
                "where({found} > {zero}, {reduction}(x[{o}], {reduction}[k](where({hit}, u[{q}], {}))), x[{o}])",
                extreme(dt, reduction == "min")
            ),
            other => return Err(cx.err(format!("reduction `{other}` is not supported"))),
        };
        let name = self.fresh("scatter_elements");
        self.ops.push(format!(
            "op {name}(x: {xt}, ind: {it}, u: {ut}, m: {ut}, io: {iot}) -> {xt} {{\n    out[{o}] = {body};\n}}",
            xt = type_text(dt, &x.shape),
            it = type_text(DType::I64, &ind.shape),
            ut = type_text(dt, &upd.shape),
            iot = type_text(DType::I64, &[n]),
        ));
        let (ex, eu) = (self.e(cx, 0)?, self.e(cx, 2)?);
        let ones = format!(
            "full({}, {}, dtype={dt})",
            shape_text(&upd.shape),
            literal(1.0, dt)
        );
        self.bind(
            cx,
            0,
            format!("{name}({ex}, {ei}, {eu}, {ones}, {iota})"),
            dt,
            x.shape,
        )
    }

    /// `TensorScatter` (a key-value cache's update): update row `j` of
    /// batch `b` is written at `write_indices[b] + j` along `axis` (modulo
    /// the axis's extent in `circular` mode; past its end in `linear` mode,
    /// nowhere), as a scatter (`none`) of the cache flattened over its axes
    /// up to `axis`.
    fn tensor_scatter(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axis", "mode"])?;
        let (x, upd) = (self.need(cx, 0)?, self.need(cx, 1)?);
        let r = x.shape.len();
        if r < 2 {
            return Err(cx.err("the cache needs a batch axis and a sequence axis"));
        }
        let axis = cx.axis(cx.int("axis", -2), r)?;
        if axis == 0 {
            return Err(cx.err("axis 0 is the batch axis; the sequence axis follows it"));
        }
        let fits = upd.shape.len() == r
            && (0..r).all(|a| match a == axis {
                true => upd.shape[a] <= x.shape[a],
                false => upd.shape[a] == x.shape[a],
            });
        if !fits || upd.dtype != x.dtype || x.dtype == DType::Bool {
            return Err(cx.err(format!(
                "update {} does not fit cache {} along axis {axis}",
                type_text(upd.dtype, &upd.shape),
                type_text(x.dtype, &x.shape)
            )));
        }
        let circular = match cx.string("mode", "linear").as_str() {
            "linear" => false,
            "circular" => true,
            other => return Err(cx.err(format!("mode `{other}` is not supported"))),
        };
        let (dt, rank, extent) = (x.dtype, axis + 1, x.shape[axis]);
        let mut at_shape = vec![1; rank];
        at_shape[axis] = upd.shape[axis];
        let j = self.iota(&at_shape, axis, DType::I64);
        let mut at = j;
        if let Some(w) = self.input(cx, 2) {
            if !matches!(w.dtype, DType::I32 | DType::I64) || w.shape != [x.shape[0]] {
                return Err(cx.err(format!(
                    "write_indices {} must be i32 or i64 of shape [{}]",
                    type_text(w.dtype, &w.shape),
                    x.shape[0]
                )));
            }
            let mut b_shape = vec![1; rank];
            b_shape[0] = x.shape[0];
            let ew = self.e(cx, 2)?;
            at = format!("reshape(cast({ew}, i64), {}) + {at}", shape_text(&b_shape));
        }
        let name = self.fresh("rows");
        self.lines.push(format!("let {name} = {at};"));
        let mut at = name;
        if circular {
            let name = self.fresh("rows");
            self.lines
                .push(format!("let {name} = {at} - {at} / {extent} * {extent};"));
            at = name;
        }
        let iotas: Vec<(usize, usize, usize)> = (0..axis)
            .filter(|&a| x.shape[a] > 1)
            .map(|a| (a, a, x.shape[a]))
            .collect();
        let positions = self.flat_positions(&x.shape, rank, &[(at, axis)], &iotas, rank);
        let (ex, eu) = (self.e(cx, 0)?, self.e(cx, 1)?);
        let e = self.scatter_as_add(
            &ex,
            &x.shape,
            rank,
            dt,
            &positions,
            &upd.shape[..rank],
            &eu,
            false,
        );
        self.bind(cx, 0, e, dt, x.shape)
    }

    /// Constant iotas over the axes an index tuple names (`extents`), and
    /// the helper operator's parameters `io0: i64[..], ...` that take them.
    fn tuple_iotas(&mut self, extents: &[usize]) -> (Vec<String>, Vec<String>) {
        extents
            .iter()
            .enumerate()
            .map(|(j, &n)| {
                let iota = self.iota(&[n], 0, DType::I64);
                (iota, format!("io{j}: {}", type_text(DType::I64, &[n])))
            })
            .unzip()
    }

    /// The columns of index tuples `ei` (shape `shape`, the tuple along
    /// the last axis) as expressions of the other axes, each with the axis
    /// it indexes (the tuple's `j`th coordinate indexes axis `first + j`).
    fn tuple_columns(&self, ei: &str, shape: &[usize], first: usize) -> Vec<(String, usize)> {
        let (last, m) = (shape.len() - 1, shape[shape.len() - 1]);
        let q = shape_text(&shape[..last]);
        (0..m)
            .map(|j| {
                let e = format!(
                    "reshape(slice({ei}, axis={last}, start={j}, end={}), {q})",
                    j + 1
                );
                (e, first + j)
            })
            .collect()
    }

    /// `ScatterND` with reduction `none` or `add`: a `scatter_add` of the
    /// data with its indexed axes flattened at each tuple's position; with
    /// `mul`, `max` or `min`, an update slice goes where its index tuple (the last
    /// axis of the indices) names the leading coordinates of the output.
    fn scatter_nd(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["reduction"])?;
        let (x, ind, upd) = (self.need(cx, 0)?, self.need(cx, 1)?, self.need(cx, 2)?);
        let (r, qr) = (x.shape.len(), ind.shape.len());
        let m = *ind.shape.last().unwrap_or(&0);
        if qr == 0 || m == 0 || m > r {
            return Err(cx.err("indices must end in an axis of 1 to rank(data) coordinates"));
        }
        let mut want = ind.shape[..qr - 1].to_vec();
        want.extend(&x.shape[m..]);
        if upd.shape != want || upd.dtype != x.dtype || x.dtype == DType::Bool {
            return Err(cx.err(format!(
                "updates {} do not fit data {} and indices {} (they must be {})",
                type_text(upd.dtype, &upd.shape),
                type_text(x.dtype, &x.shape),
                shape_text(&ind.shape),
                type_text(x.dtype, &want)
            )));
        }
        let dt = x.dtype;
        let ei = self.indices_input(cx, 1, &x.shape[..m])?;
        let reduction = cx.string("reduction", "none");
        if matches!(reduction.as_str(), "none" | "add") {
            let columns = self.tuple_columns(&ei, &ind.shape, 0);
            let at = self.flat_positions(&x.shape, m, &columns, &[], qr - 1);
            let (ex, eu) = (self.e(cx, 0)?, self.e(cx, 2)?);
            let index_shape = &ind.shape[..qr - 1];
            let add = reduction == "add";
            let e = self.scatter_as_add(&ex, &x.shape, m, dt, &at, index_shape, &eu, add);
            return self.bind(cx, 0, e, dt, x.shape);
        }
        let (iotas, io_params) = self.tuple_iotas(&x.shape[..m]);
        let o: Vec<String> = (0..r).map(|a| format!("i{a}")).collect();
        let qs: Vec<String> = (0..qr - 1).map(|a| format!("q{a}")).collect();
        let zero = literal(0.0, dt);
        // Every coordinate of index tuple q equal to the output's.
        let wrap = |inner: String, otherwise: &str| {
            tuple_match(&qs, m, |j| format!("i{j}"), inner, otherwise)
        };
        let mut u_at = qs.clone();
        u_at.extend(o[m..].iter().cloned());
        let (u_at, o_s) = (u_at.join(", "), o.join(", "));
        let mut m_at = qs.clone();
        m_at.push("0".into());
        let q_list = qs.join(", ");
        let over = |f: &str, body: String| {
            if qs.is_empty() {
                body
            } else {
                format!("{f}[{q_list}]({body})")
            }
        };
        let found = over("sum", wrap(format!("m[{}]", m_at.join(", ")), &zero));
        let combined = |f: &str, unit: &str| over(f, wrap(format!("u[{u_at}]"), unit));
        let body = match reduction.as_str() {
            "none" => format!(
                "where({found} > {zero}, {}, x[{o_s}])",
                combined("sum", &zero)
            ),
            "add" => format!("x[{o_s}] + {}", combined("sum", &zero)),
            "mul" => format!("x[{o_s}] * {}", combined("prod", &literal(1.0, dt))),
            "max" | "min" => format!(
                "where({found} > {zero}, {reduction}(x[{o_s}], {}), x[{o_s}])",
                combined(&reduction, &extreme(dt, reduction == "min"))
            ),
            other => return Err(cx.err(format!("reduction `{other}` is not supported"))),
        };
        let name = self.fresh("scatter_nd");
        self.ops.push(format!(
            "op {name}(x: {xt}, ind: {it}, u: {ut}, m: {it_f}, {}) -> {xt} {{\n    out[{o_s}] = {body};\n}}",
            io_params.join(", "),
            xt = type_text(dt, &x.shape),
            it = type_text(DType::I64, &ind.shape),
            ut = type_text(dt, &upd.shape),
            it_f = type_text(dt, &ind.shape),
        ));
        let (ex, eu) = (self.e(cx, 0)?, self.e(cx, 2)?);
        let ones = format!(
            "full({}, {}, dtype={dt})",
            shape_text(&ind.shape),
            literal(1.0, dt)
        );
        self.bind(
            cx,
            0,
            format!("{name}({ex}, {ei}, {eu}, {ones}, {})", iotas.join(", ")),
            dt,
            x.shape,
        )
    }

    /// `GatherND`: each index tuple (the last axis of the indices) selects
    /// a slice of the data, after `batch_dims` shared leading axes: a
    /// `gather` of the data with its batch and indexed axes flattened at
    /// each tuple's position.
    fn gather_nd(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["batch_dims"])?;
        let (x, ind) = (self.need(cx, 0)?, self.need(cx, 1)?);
        let (r, qr) = (x.shape.len(), ind.shape.len());
        let bd = cx.int("batch_dims", 0);
        let m = *ind.shape.last().unwrap_or(&0);
        if bd < 0 || bd as usize >= qr.min(r) {
            return Err(cx.err(format!("batch_dims = {bd} does not fit")));
        }
        let bd = bd as usize;
        if m == 0 || bd + m > r || ind.shape[..bd] != x.shape[..bd] || x.dtype == DType::Bool {
            return Err(cx.err(format!(
                "indices {} do not fit data {}",
                shape_text(&ind.shape),
                type_text(x.dtype, &x.shape)
            )));
        }
        let dt = x.dtype;
        let ei = self.indices_input(cx, 1, &x.shape[bd..bd + m])?;
        let columns = self.tuple_columns(&ei, &ind.shape, bd);
        let iotas: Vec<(usize, usize, usize)> = (0..bd)
            .filter(|&b| ind.shape[b] > 1)
            .map(|b| (b, b, ind.shape[b]))
            .collect();
        let k = bd + m;
        let at = self.flat_positions(&x.shape, k, &columns, &iotas, qr - 1);
        let mut flat = vec![x.shape[..k].iter().product::<usize>()];
        flat.extend(&x.shape[k..]);
        let mut shape = ind.shape[..qr - 1].to_vec();
        shape.extend(&x.shape[k..]);
        let ex = self.e(cx, 0)?;
        self.bind(
            cx,
            0,
            format!("gather(reshape({ex}, {}), {at}, axis=0)", shape_text(&flat)),
            dt,
            shape,
        )
    }

    /// `CenterCropPad`: each listed axis cut to its centre or padded with
    /// zeros around it (the odd element going to the end), as slices and
    /// concatenations.
    fn center_crop_pad(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["axes"])?;
        let x = self.need(cx, 0)?;
        let r = x.shape.len();
        let target = self
            .ints_input(cx, 1, "shape")?
            .ok_or_else(|| cx.err("input 1 (shape) is required"))?;
        let axes: Vec<usize> = match cx.ints("axes") {
            Some(a) => a.iter().map(|&a| cx.axis(a, r)).collect::<R<_>>()?,
            None => (0..r).collect(),
        };
        if target.len() != axes.len() {
            return Err(cx.err(format!(
                "shape has {} extents for {} axes",
                target.len(),
                axes.len()
            )));
        }
        let mut expr = self.e(cx, 0)?;
        let mut shape = x.shape.clone();
        for (&a, &t) in axes.iter().zip(&target) {
            if !(1..=MAX_ATTR).contains(&t) {
                return Err(cx.err(format!("extent {t} is not supported")));
            }
            let (t, d) = (t as usize, shape[a]);
            if t < d {
                let start = (d - t) / 2;
                expr = format!("slice({expr}, axis={a}, start={start}, end={})", start + t);
            } else if t > d {
                let before = (t - d) / 2;
                let after = t - d - before;
                let zeros = |n: usize| {
                    let mut z = shape.clone();
                    z[a] = n;
                    format!(
                        "full({}, {}, dtype={})",
                        shape_text(&z),
                        literal(0.0, x.dtype),
                        x.dtype
                    )
                };
                let mut parts = Vec::new();
                if before > 0 {
                    parts.push(zeros(before));
                }
                parts.push(expr);
                parts.push(zeros(after));
                expr = format!("concat([{}], axis={a})", parts.join(", "));
            }
            shape[a] = t;
        }
        self.bind(cx, 0, expr, x.dtype, shape)
    }

    /// `Einsum` as an operator in index notation: one index per label, a
    /// sum over the labels the output lacks. An ellipsis stands for the
    /// leading axes, aligned right and broadcast across operands (an axis
    /// of extent 1 reads index 0).
    fn einsum(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["equation"])?;
        let eq: String = cx
            .string("equation", "")
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq.as_str(), None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        let n = cx.node.input.len();
        if terms.len() != n {
            return Err(cx.err(format!(
                "equation `{eq}` has {} operands, the node {n}",
                terms.len()
            )));
        }
        let vals: Vec<Val> = (0..n).map(|i| self.need(cx, i)).collect::<R<_>>()?;
        let dt = vals[0].dtype;
        if vals.iter().any(|v| v.dtype != dt) || dt == DType::Bool {
            return Err(cx.err("needs operands of one numeric type"));
        }
        // Labels: a letter, or the j-th axis of the ellipsis (from the left
        // of the widest one).
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        enum L {
            Letter(char),
            Ell(usize),
        }
        let letters = |t: &str| -> R<Vec<char>> {
            let t = t.replace("...", "");
            if let Some(c) = t.chars().find(|c| !c.is_ascii_alphabetic()) {
                return Err(cx.err(format!("equation `{eq}`: `{c}` is not a label")));
            }
            Ok(t.chars().collect())
        };
        let mut ell = 0;
        for (t, v) in terms.iter().zip(&vals) {
            let k = letters(t)?.len();
            if t.contains("...") {
                if v.shape.len() < k {
                    return Err(cx.err(format!("equation `{eq}` does not fit the operands' ranks")));
                }
                ell = ell.max(v.shape.len() - k);
            }
        }
        let expand = |t: &str, rank: Option<usize>| -> R<Vec<L>> {
            let mut out = Vec::new();
            let (before, after) = match t.split_once("...") {
                Some((b, a)) => (b, Some(a)),
                None => (t, None),
            };
            out.extend(letters(before)?.into_iter().map(L::Letter));
            if let Some(a) = after {
                let e = match rank {
                    Some(r) => r - letters(t)?.len(),
                    None => ell,
                };
                out.extend((ell - e..ell).map(L::Ell));
                out.extend(letters(a)?.into_iter().map(L::Letter));
            }
            Ok(out)
        };
        let mut ins = Vec::with_capacity(n);
        let mut extent: HashMap<L, usize> = HashMap::new();
        let mut count: HashMap<L, usize> = HashMap::new();
        for (t, v) in terms.iter().zip(&vals) {
            let labels = expand(t, Some(v.shape.len()))?;
            if labels.len() != v.shape.len() {
                return Err(cx.err(format!(
                    "equation `{eq}`: term `{t}` does not fit an operand of rank {}",
                    v.shape.len()
                )));
            }
            for (l, &d) in labels.iter().zip(&v.shape) {
                *count.entry(*l).or_default() += 1;
                let e = extent.entry(*l).or_insert(d);
                if *e == 1 {
                    *e = d;
                } else if d != 1 && d != *e {
                    return Err(cx.err(format!("equation `{eq}`: a label has extents {e} and {d}")));
                }
            }
            ins.push(labels);
        }
        let out: Vec<L> = match rhs {
            Some(r) => expand(r, None)?,
            None => {
                let mut once: Vec<char> = count
                    .iter()
                    .filter_map(|(l, &c)| match l {
                        L::Letter(ch) if c == 1 => Some(*ch),
                        _ => None,
                    })
                    .collect();
                once.sort_unstable();
                (0..ell)
                    .map(L::Ell)
                    .chain(once.into_iter().map(L::Letter))
                    .collect()
            }
        };
        for (i, l) in out.iter().enumerate() {
            if !extent.contains_key(l) || out[..i].contains(l) {
                return Err(cx.err(format!(
                    "equation `{eq}`: the output's labels must be distinct labels of the operands"
                )));
            }
        }
        let name_of = |l: &L| match l {
            L::Letter(c) if c.is_ascii_lowercase() => format!("i{c}"),
            L::Letter(c) => format!("u{}", c.to_ascii_lowercase()),
            L::Ell(j) => format!("e{j}"),
        };
        let mut summed: Vec<L> = Vec::new();
        for labels in &ins {
            for l in labels {
                if !out.contains(l) && !summed.contains(l) {
                    summed.push(*l);
                }
            }
        }
        let reads: Vec<String> = ins
            .iter()
            .zip(&vals)
            .enumerate()
            .map(|(k, (labels, v))| {
                let idx: Vec<String> = labels
                    .iter()
                    .zip(&v.shape)
                    .map(|(l, &d)| {
                        if d == 1 && extent[l] != 1 {
                            "0".to_string()
                        } else {
                            name_of(l)
                        }
                    })
                    .collect();
                format!("x{k}[{}]", idx.join(", "))
            })
            .collect();
        let product = reads.join(" * ");
        let body = if summed.is_empty() {
            product
        } else {
            let ranges: Vec<String> = summed
                .iter()
                .map(|l| format!("{} in 0..{}", name_of(l), extent[l]))
                .collect();
            format!("sum[{}]({product})", ranges.join(", "))
        };
        let out_shape: Vec<usize> = out.iter().map(|l| extent[l]).collect();
        let params: Vec<String> = vals
            .iter()
            .enumerate()
            .map(|(k, v)| format!("x{k}: {}", type_text(dt, &v.shape)))
            .collect();
        let name = self.fresh("einsum");
        self.ops.push(format!(
            "op {name}({}) -> {} {{\n    out[{}] = {body};\n}}",
            params.join(", "),
            type_text(dt, &out_shape),
            out.iter().map(name_of).collect::<Vec<_>>().join(", ")
        ));
        let args: Vec<String> = (0..n).map(|i| self.e(cx, i)).collect::<R<_>>()?;
        self.bind(cx, 0, format!("{name}({})", args.join(", ")), dt, out_shape)
    }

    fn modulo(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["fmod"])?;
        let (a, b) = (self.need(cx, 0)?, self.need(cx, 1)?);
        if a.dtype != b.dtype || a.dtype == DType::Bool {
            return Err(cx.err(format!("operands are {} and {}", a.dtype, b.dtype)));
        }
        let shape =
            broadcast(&a.shape, &b.shape).ok_or_else(|| cx.err("operands do not broadcast"))?;
        let (ea, eb) = (self.e(cx, 0)?, self.e(cx, 1)?);
        let fmod = cx.int("fmod", 0) != 0;
        let expr = match (a.dtype.is_float(), fmod) {
            // The sign of the dividend: a - trunc(a / b) * b.
            (true, true) => format!(
                "{ea} - where({ea} / {eb} < 0.0, ceil({ea} / {eb}), floor({ea} / {eb})) * {eb}"
            ),
            // The sign of the divisor, as Python's % (opset 28 on floats);
            // a finite dividend over an infinite divisor is itself, or the
            // divisor where their signs differ (NumPy's np.mod).
            (true, false) => {
                let inf = literal(f64::INFINITY, a.dtype);
                format!(
                    "where(abs({eb}) == {inf}, where(abs({ea}) < {inf}, where({ea} * {eb} < 0.0, {eb}, {ea}), {ea} - {ea}), {ea} - floor({ea} / {eb}) * {eb})"
                )
            }
            // The sign of the divisor: dlc's integer division floors.
            (false, false) => format!("{ea} - {ea} / {eb} * {eb}"),
            (false, true) => format!(
                "{ea} - where({ea} - {ea} / {eb} * {eb} == 0, {ea} / {eb}, where(({ea} < 0) == ({eb} < 0), {ea} / {eb}, {ea} / {eb} + 1)) * {eb}"
            ),
        };
        self.bind(cx, 0, expr, a.dtype, shape)
    }

    fn depth_space(&mut self, cx: &Cx<'_>) -> R<()> {
        let x = self.need(cx, 0)?;
        if x.shape.len() != 4 {
            return Err(cx.err("needs an NCHW input"));
        }
        let b = cx.int("blocksize", 0);
        if !(1..=1024).contains(&b) {
            return Err(cx.err(format!("blocksize {b} must be from 1 to 1024")));
        }
        let b = b as usize;
        let [n, c, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
        let ex = self.e(cx, 0)?;
        let (expr, shape) = if cx.op() == "DepthToSpace" {
            cx.allow(&["blocksize", "mode"])?;
            if c % (b * b) != 0 {
                return Err(cx.err(format!("{c} channels are not a multiple of {}", b * b)));
            }
            let cc = c / (b * b);
            let (split, perm) = match cx.string("mode", "DCR").as_str() {
                "DCR" => (vec![n, b, b, cc, h, w], "[0, 3, 4, 1, 5, 2]"),
                "CRD" => (vec![n, cc, b, b, h, w], "[0, 1, 4, 2, 5, 3]"),
                other => return Err(cx.err(format!("mode `{other}` is not valid"))),
            };
            let out = vec![n, cc, h * b, w * b];
            (
                format!(
                    "reshape(transpose(reshape({ex}, {}), {perm}), {})",
                    shape_text(&split),
                    shape_text(&out)
                ),
                out,
            )
        } else {
            cx.allow(&["blocksize"])?;
            if h % b != 0 || w % b != 0 {
                return Err(cx.err(format!("{h}x{w} is not a multiple of the block {b}")));
            }
            let split = vec![n, c, h / b, b, w / b, b];
            let out = vec![n, c * b * b, h / b, w / b];
            (
                format!(
                    "reshape(transpose(reshape({ex}, {}), [0, 3, 5, 1, 2, 4]), {})",
                    shape_text(&split),
                    shape_text(&out)
                ),
                out,
            )
        };
        self.bind(cx, 0, expr, x.dtype, shape)
    }

    /// Resize with static scales or sizes: per resized axis, a product
    /// with a constant interpolation matrix computed here (separable, as
    /// ONNX defines it), in index notation.
    fn resize(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&[
            "mode",
            "coordinate_transformation_mode",
            "nearest_mode",
            "cubic_coeff_a",
            "exclude_outside",
            "extrapolation_value",
            "antialias",
            "axes",
            "keep_aspect_ratio_policy",
        ])?;
        let policy = cx.string("keep_aspect_ratio_policy", "stretch");
        if !matches!(policy.as_str(), "stretch" | "not_larger" | "not_smaller") {
            return Err(cx.err(format!("keep_aspect_ratio_policy `{policy}` is not valid")));
        }
        let x = self.need(cx, 0)?;
        cx.float_input(&x)?;
        let r = x.shape.len();
        let axes: Vec<usize> = match cx.ints("axes") {
            Some(a) => a.iter().map(|&a| cx.axis(a, r)).collect::<R<_>>()?,
            None => (0..r).collect(),
        };
        let floats = |i: usize, what: &str| -> R<Option<Vec<f64>>> {
            match self.input(cx, i) {
                None => Ok(None),
                Some(v) => match v.data {
                    Some(d) => Ok(Some(d.values.to_vec())),
                    None => Err(cx.err(format!(
                        "{what} (input {i}) must be a constant; dlc shapes are static"
                    ))),
                },
            }
        };
        let roi = floats(1, "roi")?.unwrap_or_default();
        let scales = floats(2, "scales")?.filter(|s| !s.is_empty());
        let sizes = floats(3, "sizes")?.filter(|s| !s.is_empty());
        let (mut scale, mut out) = (vec![1.0; r], x.shape.clone());
        match (scales, sizes) {
            (Some(s), None) if s.len() == axes.len() => {
                for (&a, &v) in axes.iter().zip(&s) {
                    if !(v > 0.0 && v.is_finite()) {
                        return Err(cx.err(format!("scale {v} must be positive")));
                    }
                    scale[a] = v;
                    out[a] = (x.shape[a] as f64 * v).floor() as usize;
                }
            }
            (None, Some(s)) if s.len() == axes.len() => {
                for (&a, &v) in axes.iter().zip(&s) {
                    if !(v >= 1.0 && v <= (1u64 << 24) as f64) {
                        return Err(cx.err(format!("size {v} must be a positive count")));
                    }
                    out[a] = v as usize;
                    scale[a] = v / x.shape[a] as f64;
                }
                // One scale for every resized axis, the largest that fits
                // the sizes (or the smallest that covers them).
                if policy != "stretch" {
                    let ratios = axes.iter().map(|&a| scale[a]);
                    let one = if policy == "not_larger" {
                        ratios.fold(f64::INFINITY, f64::min)
                    } else {
                        ratios.fold(0.0, f64::max)
                    };
                    for &a in &axes {
                        scale[a] = one;
                        out[a] = ((one * x.shape[a] as f64).round_ties_even() as usize).max(1);
                    }
                }
            }
            _ => return Err(cx.err("needs either scales or sizes, one per resized axis")),
        }
        let interp = |a: usize| Interp {
            mode: "",
            transform: "",
            nearest: "",
            cubic_a: cx.float("cubic_coeff_a", -0.75),
            exclude_outside: cx.int("exclude_outside", 0) != 0,
            antialias: cx.int("antialias", 0) != 0,
            roi: match axes.iter().position(|&b| b == a) {
                Some(i) if roi.len() == 2 * axes.len() => (roi[i], roi[i + axes.len()]),
                _ => (0.0, 1.0),
            },
            extrapolation: cx.float("extrapolation_value", 0.0),
        };
        if cx.int("antialias", 0) != 0 && cx.string("mode", "nearest") == "nearest" {
            return Err(cx.err("antialias is defined for the linear and cubic modes only"));
        }
        let (mode, transform, nearest) = (
            cx.string("mode", "nearest"),
            cx.string("coordinate_transformation_mode", "half_pixel"),
            cx.string("nearest_mode", "round_prefer_floor"),
        );
        let dt = x.dtype;
        let mut expr = self.e(cx, 0)?;
        let mut shape = x.shape.clone();
        for a in 0..r {
            if out[a] == x.shape[a] && scale[a] == 1.0 {
                continue;
            }
            if out[a] == 0 || out[a].saturating_mul(x.shape[a]) > 1 << 24 {
                return Err(cx.err(format!(
                    "resizing axis {a} from {} to {} is not supported",
                    x.shape[a], out[a]
                )));
            }
            let it = Interp {
                mode: &mode,
                transform: &transform,
                nearest: &nearest,
                ..interp(a)
            };
            let (w, b) = it
                .weights(x.shape[a], out[a], scale[a])
                .map_err(|m| cx.err(m))?;
            let wv = self.fresh("resize_w");
            self.lines.push(format!(
                "let {wv} = {};",
                crate::constant_text(&Data::new(dt, vec![out[a], x.shape[a]], w))
            ));
            let mut next = shape.clone();
            next[a] = out[a];
            let idx: Vec<String> = (0..r).map(|i| format!("i{i}")).collect();
            let mut read = idx.clone();
            read[a] = "k".into();
            let name = self.fresh("resize");
            self.ops.push(format!(
                "op {name}(x: {}, w: {}) -> {} {{\n    out[{}] = sum[k](x[{}] * w[i{a}, k]);\n}}",
                type_text(dt, &shape),
                type_text(dt, &[out[a], x.shape[a]]),
                type_text(dt, &next),
                idx.join(", "),
                read.join(", "),
            ));
            expr = format!("{name}({expr}, {wv})");
            if b.iter().any(|&v| v != 0.0) {
                let mut bs = vec![1; r];
                bs[a] = out[a];
                let bv = self.fresh("resize_b");
                self.lines.push(format!(
                    "let {bv} = {};",
                    crate::constant_text(&Data::new(dt, bs, b))
                ));
                expr = format!("{expr} + {bv}");
            }
            shape = next;
        }
        if shape == x.shape {
            self.alias(cx, 0, x);
            return Ok(());
        }
        self.bind(cx, 0, expr, dt, shape)
    }

    /// Reflect, edge and wrap padding: per axis, a concatenation of
    /// one-element slices of the input (the positions the mode copies) on
    /// each side; negative pads cut.
    fn pad_by_copies(
        &mut self,
        cx: &Cx<'_>,
        x: &Val,
        mode: &str,
        begin: &[i64],
        end: &[i64],
        shape: Vec<usize>,
    ) -> R<()> {
        let mut expr = self.e(cx, 0)?;
        for a in 0..x.shape.len() {
            let n = x.shape[a] as i64;
            let (b, e) = (begin[a], end[a]);
            if b == 0 && e == 0 {
                continue;
            }
            if mode == "reflect" && (b.max(e) >= n) {
                return Err(cx.err(format!(
                    "reflect padding of {} on an axis of {n} is not supported",
                    b.max(e)
                )));
            }
            if b.max(e) > 4096 {
                return Err(cx.err("padding by more than 4096 is not supported"));
            }
            // The source position of padded position p (p < 0 before, p >= n after).
            let source = |p: i64| -> i64 {
                match mode {
                    "edge" => p.clamp(0, n - 1),
                    "wrap" => p.rem_euclid(n),
                    _ => {
                        if p < 0 {
                            -p
                        } else {
                            2 * (n - 1) - p
                        }
                    }
                }
            };
            let one = |p: i64, ex: &str| format!("slice({ex}, axis={a}, start={p}, end={})", p + 1);
            let mut parts: Vec<String> = (-b.max(0)..0).map(|p| one(source(p), &expr)).collect();
            let (lo, hi) = ((-b).max(0), n - (-e).max(0));
            if hi <= lo {
                return Err(cx.err(format!("axis {a} would have no elements")));
            }
            parts.push(if lo == 0 && hi == n {
                expr.clone()
            } else {
                format!("slice({expr}, axis={a}, start={lo}, end={hi})")
            });
            parts.extend((n..n + e.max(0)).map(|p| one(source(p), &expr)));
            expr = if parts.len() == 1 {
                parts.remove(0)
            } else {
                // Named, so the copies share one value.
                let var = self.fresh("padded");
                let joined = format!("concat([{}], axis={a})", parts.join(", "));
                self.lines.push(format!("let {var} = {joined};"));
                var
            };
        }
        self.bind(cx, 0, expr, x.dtype, shape)
    }

    fn pad(&mut self, cx: &Cx<'_>) -> R<()> {
        cx.allow(&["mode"])?;
        let x = self.need(cx, 0)?;
        let mode = cx.string("mode", "constant");
        if !matches!(mode.as_str(), "constant" | "reflect" | "edge" | "wrap") {
            return Err(cx.err(format!("mode `{mode}` is not valid")));
        }
        let pads = self
            .ints_input(cx, 1, "pads")?
            .ok_or_else(|| cx.err("input 1 (pads) is required"))?;
        let r = x.shape.len();
        let axes = match self.ints_input(cx, 3, "axes")? {
            Some(a) => a.iter().map(|&a| cx.axis(a, r)).collect::<R<Vec<_>>>()?,
            None => (0..r).collect(),
        };
        if pads.len() != 2 * axes.len() || pads.iter().any(|p| p.abs() > MAX_ATTR) {
            return Err(cx.err(format!("pads {pads:?} need {} values", 2 * axes.len())));
        }
        let (mut begin, mut end) = (vec![0i64; r], vec![0i64; r]);
        for (j, &a) in axes.iter().enumerate() {
            begin[a] = pads[j];
            end[a] = pads[j + axes.len()];
        }
        let mut shape = Vec::with_capacity(r);
        for a in 0..r {
            let d = x.shape[a] as i64 + begin[a] + end[a];
            if d < 1 {
                return Err(cx.err(format!("axis {a} would have extent {d}")));
            }
            shape.push(d as usize);
        }
        let dt = x.dtype;
        if mode != "constant" {
            return self.pad_by_copies(cx, &x, &mode, &begin, &end, shape);
        }
        // The value: a literal when known, else the (scalar) operand.
        let value = match self.input(cx, 2) {
            None => None,
            Some(v) if v.dtype != dt || numel(&v.shape) != 1 => {
                return Err(cx.err(format!(
                    "constant_value is {}; it must be one {dt}",
                    type_text(v.dtype, &v.shape)
                )));
            }
            Some(v) => match v.data {
                Some(d) if d.values[0] != 0.0 || !d.values[0].is_finite() => {
                    Some(literal(d.values[0], dt))
                }
                Some(_) => None,
                None => Some(format!("reshape({}, [])", self.e(cx, 2)?)),
            },
        };
        let idx: Vec<String> = (0..r).map(|a| format!("i{a}")).collect();
        let reads: Vec<String> = (0..r)
            .map(|a| match begin[a] {
                0 => format!("i{a}"),
                p if p > 0 => format!("i{a} - {p}"),
                p => format!("i{a} + {}", -p),
            })
            .collect();
        let name = self.fresh("pad");
        let ex = self.e(cx, 0)?;
        let (i, rd) = (idx.join(", "), reads.join(", "));
        let (params, body, call) = match value {
            None => (
                format!("x: {}", type_text(dt, &x.shape)),
                format!("x[{rd}]"),
                format!("{name}({ex})"),
            ),
            Some(v) => {
                // Outside the input, the mask of ones reads zero.
                if dt == DType::Bool {
                    return Err(cx.err("a non-zero constant on bool is not supported"));
                }
                let one = literal(1.0, dt);
                // The value is an operand: a literal in the body could not
                // spell an infinity or NaN.
                (
                    format!(
                        "x: {}, m: {}, c: {dt}",
                        type_text(dt, &x.shape),
                        type_text(dt, &x.shape)
                    ),
                    format!("where(m[{rd}] == {one}, x[{rd}], c)"),
                    format!(
                        "{name}({ex}, full({}, {one}, dtype={dt}), {v})",
                        shape_text(&x.shape),
                    ),
                )
            }
        };
        self.ops.push(format!(
            "op {name}({params}) -> {} {{\n    out[{i}] = {body};\n}}",
            type_text(dt, &shape)
        ));
        self.bind(cx, 0, call, dt, shape)
    }
}

/// How Resize maps and weighs positions along one axis.
struct Interp<'a> {
    mode: &'a str,
    transform: &'a str,
    nearest: &'a str,
    cubic_a: f64,
    exclude_outside: bool,
    /// Whether a downsampling linear or cubic filter is widened by the
    /// inverse of the scale (antialiasing).
    antialias: bool,
    /// The region of interest on this axis (tf_crop_and_resize).
    roi: (f64, f64),
    extrapolation: f64,
}

impl Interp<'_> {
    /// The resize of one axis as `out = w @ in + b`: `w` is
    /// `[output, input]` row-major, `b` is non-zero only where
    /// tf_crop_and_resize extrapolates. Follows ONNX's reference
    /// (`_interpolate_1d_with_x`): the source coordinate by the
    /// transformation mode, the tap weights by the mode, edge-clamped
    /// neighbours, `exclude_outside` renormalizing.
    fn weights(
        &self,
        input: usize,
        output: usize,
        scale: f64,
    ) -> Result<(Vec<f64>, Vec<f64>), String> {
        let (li, lo) = (input as f64, scale * input as f64);
        let mut w = vec![0.0; output * input];
        let mut b = vec![0.0; output];
        for j in 0..output {
            let y = j as f64;
            let x = match self.transform {
                "align_corners" if lo == 1.0 => 0.0,
                "align_corners" => y * (li - 1.0) / (lo - 1.0),
                "asymmetric" => y / scale,
                "tf_crop_and_resize" => {
                    let (r0, r1) = self.roi;
                    let x = if lo == 1.0 {
                        (r1 - r0) * (li - 1.0) / 2.0
                    } else {
                        y * (r1 - r0) * (li - 1.0) / (lo - 1.0)
                    } + r0 * (li - 1.0);
                    if x < 0.0 || x > li - 1.0 {
                        b[j] = self.extrapolation;
                        continue;
                    }
                    x
                }
                "pytorch_half_pixel" if lo == 1.0 => -0.5,
                "pytorch_half_pixel" | "half_pixel" => (y + 0.5) / scale - 0.5,
                "half_pixel_symmetric" => {
                    let offset = li / 2.0 * (1.0 - output as f64 / lo);
                    offset + (y + 0.5) / scale - 0.5
                }
                other => {
                    return Err(format!(
                        "coordinate_transformation_mode `{other}` is not valid"
                    ));
                }
            };
            let xi = x.floor();
            let ratio = if x == xi { 1.0 } else { x - xi };
            let mut coeffs: Vec<f64> = match self.mode {
                "nearest" => {
                    let up = if ratio == 1.0 {
                        true
                    } else {
                        match self.nearest {
                            "round_prefer_floor" => ratio > 0.5,
                            "round_prefer_ceil" => ratio >= 0.5,
                            "floor" => false,
                            "ceil" => true,
                            other => return Err(format!("nearest_mode `{other}` is not valid")),
                        }
                    };
                    vec![f64::from(u8::from(!up)), f64::from(u8::from(up))]
                }
                "linear" | "cubic" if self.antialias => {
                    // ONNX's reference: the kernel stretched by 1 / scale
                    // when downsampling, its taps normalized.
                    let s = scale.min(1.0);
                    let taps: Vec<f64> = if self.mode == "linear" {
                        let start = (-1.0 / s).floor() as i64 + 1;
                        (start..start + 2 - 2 * start)
                            .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
                            .collect()
                    } else {
                        let a = self.cubic_a;
                        let start = (-2.0 / s).floor() as i64 + 1;
                        (start..2 - start)
                            .map(|i| {
                                let x = (s * (i as f64 - ratio)).abs();
                                let (x2, x3) = (x * x, x * x * x);
                                if x <= 1.0 {
                                    (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
                                } else if x < 2.0 {
                                    a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
                                } else {
                                    0.0
                                }
                            })
                            .collect()
                    };
                    let total: f64 = taps.iter().sum();
                    taps.into_iter().map(|t| t / total).collect()
                }
                "linear" => vec![1.0 - ratio, ratio],
                "cubic" => {
                    let a = self.cubic_a;
                    let (r, q) = (ratio, 1.0 - ratio);
                    vec![
                        ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                        ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                        ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                        ((a * (q + 1.0) - 5.0 * a) * (q + 1.0) + 8.0 * a) * (q + 1.0) - 4.0 * a,
                    ]
                }
                other => return Err(format!("mode `{other}` is not valid")),
            };
            // The n nearest positions to x, the smaller first on a tie,
            // in ascending order (they may lie outside the input).
            let n = coeffs.len() as i64;
            let mut near: Vec<i64> = ((xi as i64 - n)..=(xi as i64 + n + 1)).collect();
            near.sort_by(|a, c| {
                let (da, dc) = ((x - *a as f64).abs(), (x - *c as f64).abs());
                da.total_cmp(&dc).then(a.cmp(c))
            });
            near.truncate(coeffs.len());
            near.sort_unstable();
            if self.exclude_outside {
                for (c, &i) in coeffs.iter_mut().zip(&near) {
                    if i < 0 || i >= input as i64 {
                        *c = 0.0;
                    }
                }
                let total: f64 = coeffs.iter().sum();
                if total != 0.0 {
                    coeffs.iter_mut().for_each(|c| *c /= total);
                }
            }
            for (c, &i) in coeffs.iter().zip(&near) {
                let k = i.clamp(0, input as i64 - 1) as usize;
                w[j * input + k] += c;
            }
        }
        Ok((w, b))
    }
}

/// The least (or with `high` the greatest) finite value of `dt` as a dlc
/// expression.
fn extreme(dt: DType, high: bool) -> String {
    let v = match (dt, high) {
        (DType::F64, _) => f64::MAX,
        (DType::F32, _) => f64::from(f32::MAX),
        (DType::F16, _) => half::f16::MAX.to_f64(),
        (DType::BF16, _) => half::bf16::MAX.to_f64(),
        // i64::MIN has no literal (its magnitude does not fit), nor has
        // u64::MAX an f64 one.
        (DType::I64, false) => return format!("({} - 1)", i64::MIN + 1),
        (DType::I64, true) => return i64::MAX.to_string(),
        (DType::U64, true) => return "cast(-1, u64)".into(),
        (DType::Bool, _) => return (if high { "true" } else { "false" }).into(),
        (d, false) => return literal(d.int_min().unwrap_or(0.0), d),
        (d, true) => return literal(d.int_max().unwrap_or(0.0), d),
    };
    literal(if high { v } else { -v }, dt)
}

/// ONNX Cast of one element.
fn cast_value(v: f64, from: DType, to: DType) -> f64 {
    if from.is_float() && !to.is_float() && to != DType::Bool {
        to.round(v.trunc())
    } else {
        to.round(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_broadcast_as_numpy() {
        assert_eq!(broadcast(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast(&[], &[5]), Some(vec![5]));
        assert_eq!(broadcast(&[2], &[3]), None);
    }

    #[test]
    fn window_extents_follow_onnx() {
        // 5 wide, kernel 2, stride 2: floor gives 2, ceil 3.
        assert_eq!(window_extent(5, 2, 2, 1, 0, 0, false), 2);
        assert_eq!(window_extent(5, 2, 2, 1, 0, 0, true), 3);
        // A last window starting in the end padding is dropped.
        assert_eq!(window_extent(4, 3, 2, 1, 1, 1, true), 3);
        assert_eq!(window_extent(4, 2, 2, 1, 0, 1, true), 2);
        assert_eq!(window_extent(32, 3, 1, 2, 0, 0, false), 28);
    }

    #[test]
    fn window_indices_read_as_written() {
        assert_eq!(window_index("y0", "k0", 1, 1, 1), "y0 + k0 - 1");
        assert_eq!(window_index("y0", "k0", 2, 3, -1), "2 * y0 + 3 * k0 + 1");
    }
}
