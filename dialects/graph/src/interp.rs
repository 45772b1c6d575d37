//! The reference interpreter: the definition of what every dlc program means.
//!
//! Every op computes in f64 (reductions and matrix products accumulate in
//! f64) and rounds its results to its element type, so an `f32` program is
//! evaluated as if each op were exact and then rounded once. Integer ops wrap
//! like two's complement, integer division floors (as Python's `//`) and
//! fails on a zero divisor, and float-to-integer casts truncate toward zero.
//!
//! # In detail
//!
//! `dlc_graph::interp` defines what programs mean. Values are `ndarray::ArrayD<f64>`
//! with an element type; every op computes in f64 (matrix products, convolutions and
//! reductions accumulate in f64) and rounds its result to its element type, so an `f32`
//! program means "each op exact, then rounded once". Integer arithmetic wraps at the
//! type's width, integer division floors and fails on zero, float-to-integer casts
//! truncate toward zero (`DType::round`). f64 holds every element of every type exactly
//! except i64 and u64 values beyond 2^53, which the interpreters round (compiled code
//! computes them exactly).
//! Matrix products and convolutions (im2col) go through ndarray's `dot`, so the
//! interpreter runs the full-size workloads in well under a second or two in release.
//! Tensors larger than 2^29 elements are refused with an error instead of exhausting
//! memory.

use std::collections::HashMap;

use dlc_core::{DType, TensorType};
use ndarray::{ArrayD, ArrayView2, Axis, IxDyn, Slice, Zip, s};
use petgraph::stable_graph::NodeIndex;

use crate::compute::{ComputeBody, ScalarExpr, Source};
use crate::module::{Function, Module};
pub use dlc_core::scalar::{apply_binary, apply_unary};

use crate::ops::{BinaryOp, ConstValue, Op, PoolKind, ReduceKind, UnaryOp};

/// A tensor value: its element type and its elements as f64, each exactly
/// representable in the element type.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Element type.
    pub dtype: DType,
    /// Elements, row-major.
    pub data: ArrayD<f64>,
}

impl Tensor {
    /// A tensor from a type and row-major elements (rounded to the type).
    pub fn from_vec(ty: &TensorType, values: Vec<f64>) -> Result<Tensor> {
        let data = ArrayD::from_shape_vec(IxDyn(&ty.shape), values)
            .map_err(|e| InterpError::Shape(format!("{ty}: {e}")))?;
        Ok(Tensor {
            dtype: ty.dtype,
            data: data.mapv(|x| ty.dtype.round(x)),
        })
    }

    /// The value of a constant of type `ty`.
    pub fn from_const(value: &ConstValue, ty: &TensorType) -> Result<Tensor> {
        let values = match value {
            ConstValue::Splat(x) => {
                let n = ty
                    .num_elements()
                    .filter(|&n| n <= MAX_ELEMENTS)
                    .ok_or_else(|| InterpError::TooLarge(ty.clone()))?;
                vec![*x; n]
            }
            ConstValue::Dense(xs) => xs.to_vec(),
        };
        Tensor::from_vec(ty, values)
    }

    /// The tensor as a constant's value: a splat when every element is the
    /// same (bit for bit).
    pub fn to_const(&self) -> ConstValue {
        let values: Vec<f64> = self.data.iter().copied().collect();
        match values.first() {
            Some(&x) if values.iter().all(|v| v.to_bits() == x.to_bits()) => ConstValue::Splat(x),
            _ => ConstValue::Dense(values.into()),
        }
    }

    /// The tensor's type.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.data.shape().to_vec())
    }
}

/// Why a program could not be run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InterpError {
    /// No function of that name.
    #[error("no function `@{0}` in the module")]
    UnknownFunction(String),
    /// Wrong number of arguments.
    #[error("@{function} takes {expected} argument(s), got {got}")]
    ArgCount {
        /// The function.
        function: String,
        /// Parameters it has.
        expected: usize,
        /// Arguments given.
        got: usize,
    },
    /// An argument of the wrong type.
    #[error("argument {index} (`{name}`) of @{function} must be {expected}, got {got}")]
    ArgType {
        /// The function.
        function: String,
        /// Position of the argument.
        index: usize,
        /// Parameter name.
        name: String,
        /// Parameter type.
        expected: TensorType,
        /// Argument type.
        got: TensorType,
    },
    /// Integer division by zero.
    #[error("integer division by zero at {0}")]
    DivisionByZero(String),
    /// A tensor too large to hold in the interpreter.
    #[error("{0} is too large for the interpreter (limit {MAX_ELEMENTS} elements)")]
    TooLarge(TensorType),
    /// A program whose estimated work exceeds the limit it is run under.
    #[error(
        "{op} would take about {work:.2e} element operations ({total:.2e} for the whole of @{function}), \
         more than the interpreter's limit of {limit:.2e}; --max-work raises the limit"
    )]
    TooMuchWork {
        /// The function.
        function: String,
        /// The costliest op, as `@f graph.compute (rows)`.
        op: String,
        /// Its estimated work.
        work: f64,
        /// The whole function's.
        total: f64,
        /// The limit.
        limit: f64,
    },
    /// A shape inconsistency the verifier should have ruled out.
    #[error("internal shape error: {0}")]
    Shape(String),
}

/// The largest tensor (in elements) the interpreter will allocate: 4 GiB of
/// f64. Larger programs are rejected with an error instead of aborting.
pub const MAX_ELEMENTS: usize = 1 << 29;

/// The most work the interpreter takes on in one run unless told otherwise,
/// in estimated element operations (one multiply-add of a product, one
/// element of an element-wise op, one evaluation of a scalar expression node
/// of a user operator): 2^34, about 17 billion, which a matrix product of
/// 2048^3 fits and which takes the interpreter minutes at most.
pub const DEFAULT_WORK_LIMIT: f64 = 17_179_869_184.0;

/// The most work one op may take to be folded into a constant at compile
/// time (`graph.canonicalize`, `graph.saturate`): 2^24 element operations,
/// a few milliseconds. Costlier ops on constants are left to run.
pub const FOLD_WORK_LIMIT: f64 = 16_777_216.0;

type Result<T> = std::result::Result<T, InterpError>;

/// The estimated work of one op (a call excepted: see [`estimate_work`]),
/// in element operations, from its operand and result types.
pub fn op_work(op: &Op, inputs: &[&TensorType], results: &[TensorType]) -> f64 {
    let elements = |t: &TensorType| t.num_elements().map_or(f64::INFINITY, |n| n as f64);
    let out: f64 = results.iter().map(elements).sum();
    let input = |k: usize| inputs.get(k).map_or(1.0, |t| elements(t));
    match op {
        Op::Param { .. } | Op::Call { .. } => 0.0,
        Op::MatMul => {
            out * inputs
                .first()
                .and_then(|t| t.shape.last())
                .map_or(1.0, |&k| k as f64)
        }
        Op::Reduce { .. } => input(0),
        Op::Softmax { .. } | Op::LayerNorm { .. } => 3.0 * input(0),
        Op::Conv2d { .. } => {
            out * inputs.get(1).map_or(1.0, |w| {
                w.shape.iter().skip(1).map(|&d| d as f64).product::<f64>()
            })
        }
        Op::Pool2d { kernel, .. } => out * kernel.iter().map(|&d| d as f64).product::<f64>(),
        Op::Compute(body) => body
            .locals
            .iter()
            .chain([&body.out])
            .map(|def| elements(&def.ty) * scalar_work(&def.expr))
            .sum(),
        _ => out,
    }
}

/// The estimated work of each op of `f` (calls included, as their callee's
/// total), in element operations, as (`@f graph.op`, work).
pub fn estimate_work(module: &Module, f: &Function) -> Vec<(String, f64)> {
    f.body
        .node_indices()
        .map(|n| {
            let node = &f.body[n];
            let work = match &node.op {
                Op::Call { callee } => module.function(callee).map_or(0.0, |g| {
                    estimate_work(module, g).iter().map(|(_, w)| w).sum()
                }),
                op => {
                    let inputs: Vec<&TensorType> =
                        f.operands(n).iter().map(|v| f.value_type(*v)).collect();
                    op_work(op, &inputs, &node.results)
                }
            };
            let name = match &node.op {
                Op::Compute(body) => format!("@{} graph.compute ({})", f.name, body.name),
                op => format!("@{} {}", f.name, op.name()),
            };
            (name, work)
        })
        .collect()
}

/// Scalar expression nodes evaluated for one element of a user operator.
fn scalar_work(e: &ScalarExpr) -> f64 {
    match e {
        ScalarExpr::Const(_) | ScalarExpr::Read { .. } => 1.0,
        ScalarExpr::Unary(_, x) | ScalarExpr::Cast(_, x) => 1.0 + scalar_work(x),
        ScalarExpr::Binary(_, x, y) | ScalarExpr::Compare(_, x, y) => {
            1.0 + scalar_work(x) + scalar_work(y)
        }
        ScalarExpr::Select(c, x, y) => 1.0 + scalar_work(c) + scalar_work(x) + scalar_work(y),
        ScalarExpr::Reduce { vars, body, .. } => {
            let trips: f64 = vars.iter().map(|r| (r.hi - r.lo).max(0) as f64).product();
            1.0 + trips * scalar_work(body)
        }
    }
}

/// Fails with [`InterpError::TooMuchWork`] when `f`'s estimated work is
/// above `limit`.
pub fn check_work(module: &Module, f: &Function, limit: f64) -> Result<()> {
    let ops = estimate_work(module, f);
    let total: f64 = ops.iter().map(|(_, w)| w).sum();
    if total <= limit {
        return Ok(());
    }
    let (op, work) = ops
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or_default();
    Err(InterpError::TooMuchWork {
        function: f.name.clone(),
        op,
        work,
        total,
        limit,
    })
}

/// Runs function `name` of `module` on `args`, refusing programs whose
/// estimated work is above [`DEFAULT_WORK_LIMIT`].
pub fn run_function(module: &Module, name: &str, args: &[Tensor]) -> Result<Vec<Tensor>> {
    run_function_within(module, name, args, DEFAULT_WORK_LIMIT)
}

/// Runs function `name` of `module` on `args`, refusing programs whose
/// estimated work ([`estimate_work`]) is above `limit`.
pub fn run_function_within(
    module: &Module,
    name: &str,
    args: &[Tensor],
    limit: f64,
) -> Result<Vec<Tensor>> {
    let f = module
        .function(name)
        .ok_or_else(|| InterpError::UnknownFunction(name.into()))?;
    if args.len() != f.params.len() {
        return Err(InterpError::ArgCount {
            function: name.into(),
            expected: f.params.len(),
            got: args.len(),
        });
    }
    for (index, ((pname, node), arg)) in f.params.iter().zip(args).enumerate() {
        let expected = &f.body[*node].results[0];
        if arg.ty() != *expected {
            return Err(InterpError::ArgType {
                function: name.into(),
                index,
                name: pname.clone(),
                expected: expected.clone(),
                got: arg.ty(),
            });
        }
    }
    check_work(module, f, limit)?;
    run_body(module, f, args)
}

fn run_body(module: &Module, f: &Function, args: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut values: HashMap<NodeIndex, Vec<Tensor>> = HashMap::new();
    for node in f.topo_order() {
        let n = &f.body[node];
        let results = match &n.op {
            Op::Param { index } => vec![args[*index as usize].clone()],
            Op::Call { callee } => {
                let inputs = gather(f, &values, node)?;
                let inputs: Vec<Tensor> = inputs.into_iter().cloned().collect();
                // Already counted in the caller's estimate.
                run_function_within(module, callee, &inputs, f64::INFINITY)?
            }
            op => {
                let inputs = gather(f, &values, node)?;
                let what = match &n.loc {
                    Some(loc) => format!("{loc} (@{} {})", f.name, op.name()),
                    None => format!("@{} {}", f.name, op.name()),
                };
                eval_op(op, &inputs, &n.results).map_err(|e| with_location(e, &what))?
            }
        };
        values.insert(node, results);
    }
    f.results
        .iter()
        .map(|v| {
            values
                .get(&v.node)
                .and_then(|r| r.get(v.result as usize))
                .cloned()
                .ok_or_else(|| InterpError::Shape("returned value was not computed".into()))
        })
        .collect()
}

fn with_location(e: InterpError, loc: &str) -> InterpError {
    match e {
        InterpError::DivisionByZero(_) => InterpError::DivisionByZero(loc.into()),
        other => other,
    }
}

fn gather<'a>(
    f: &Function,
    values: &'a HashMap<NodeIndex, Vec<Tensor>>,
    node: NodeIndex,
) -> Result<Vec<&'a Tensor>> {
    f.operands(node)
        .into_iter()
        .map(|v| {
            values
                .get(&v.node)
                .and_then(|r| r.get(v.result as usize))
                .ok_or_else(|| InterpError::Shape("operand used before it is computed".into()))
        })
        .collect()
}

fn check_size(ty: &TensorType) -> Result<()> {
    match ty.num_elements() {
        Some(n) if n <= MAX_ELEMENTS => Ok(()),
        _ => Err(InterpError::TooLarge(ty.clone())),
    }
}

fn finish(ty: &TensorType, data: ArrayD<f64>) -> Result<Tensor> {
    if data.shape() != ty.shape.as_slice() {
        return Err(InterpError::Shape(format!(
            "computed shape {:?}, expected {ty}",
            data.shape()
        )));
    }
    let data = data.mapv(|x| ty.dtype.round(x));
    Ok(Tensor {
        dtype: ty.dtype,
        data: data.as_standard_layout().into_owned(),
    })
}

fn shape_err<E: std::fmt::Display>(e: E) -> InterpError {
    InterpError::Shape(e.to_string())
}

/// Evaluates one op (not `graph.param` or `graph.call`) on tensor operands.
pub fn eval_op(op: &Op, inputs: &[&Tensor], results: &[TensorType]) -> Result<Vec<Tensor>> {
    let ty = results
        .first()
        .ok_or_else(|| InterpError::Shape("op has no result".into()))?;
    for r in results {
        check_size(r)?;
    }
    let x = || {
        inputs
            .first()
            .copied()
            .ok_or_else(|| InterpError::Shape("missing operand".into()))
    };
    let out = match op {
        Op::Param { .. } | Op::Call { .. } => {
            return Err(InterpError::Shape(format!(
                "{} is not evaluated alone",
                op.name()
            )));
        }
        Op::Constant(ConstValue::Splat(v)) => ArrayD::from_elem(IxDyn(&ty.shape), *v),
        Op::Constant(ConstValue::Dense(vs)) => {
            ArrayD::from_shape_vec(IxDyn(&ty.shape), vs.to_vec()).map_err(shape_err)?
        }
        Op::Unary(u) => x()?.data.mapv(|v| apply_unary(*u, v)),
        Op::Barrier => x()?.data.clone(),
        Op::Binary(b) => {
            let d = inputs[0].dtype;
            let (a, c) = broadcast2(&inputs[0].data, &inputs[1].data, &ty.shape)?;
            let mut failed = false;
            let out = Zip::from(&a).and(&c).map_collect(|&p, &q| {
                dlc_core::scalar::apply_binary_in(*b, p, q, d).unwrap_or_else(|| {
                    failed = true;
                    0.0
                })
            });
            if failed {
                return Err(InterpError::DivisionByZero(op.name()));
            }
            out
        }
        Op::Compare(c) => {
            let (a, b) = broadcast2(&inputs[0].data, &inputs[1].data, &ty.shape)?;
            Zip::from(&a)
                .and(&b)
                .map_collect(|&p, &q| f64::from(u8::from(c.apply(p, q))))
        }
        Op::Select => {
            let shape = IxDyn(&ty.shape);
            let c = inputs[0]
                .data
                .broadcast(shape.clone())
                .ok_or_else(|| shape_err("select"))?;
            let a = inputs[1]
                .data
                .broadcast(shape.clone())
                .ok_or_else(|| shape_err("select"))?;
            let b = inputs[2]
                .data
                .broadcast(shape)
                .ok_or_else(|| shape_err("select"))?;
            Zip::from(&c)
                .and(&a)
                .and(&b)
                .map_collect(|&c, &a, &b| if c != 0.0 { a } else { b })
        }
        Op::Cast { .. } => x()?.data.clone(),
        Op::MatMul => matmul(&inputs[0].data, &inputs[1].data, &ty.shape)?,
        Op::Reduce { kind, axes, .. } => {
            let mut cur = x()?.data.clone();
            let mut count = 1usize;
            for &ax in axes.iter().rev() {
                count *= cur.shape()[ax];
                cur = cur.fold_axis(Axis(ax), kind.identity(), |&acc, &v| kind.combine(acc, v));
            }
            if *kind == ReduceKind::Mean {
                cur.mapv_inplace(|v| v / count as f64);
            }
            cur.into_shape_with_order(IxDyn(&ty.shape))
                .map_err(shape_err)?
        }
        Op::Softmax { axis } => {
            let mut out = x()?.data.clone();
            for mut lane in out.lanes_mut(Axis(*axis)) {
                let m = lane.fold(f64::NEG_INFINITY, |a, &b| ReduceKind::Max.combine(a, b));
                lane.mapv_inplace(|v| (v - m).exp());
                let s: f64 = lane.sum();
                lane.mapv_inplace(|v| v / s);
            }
            out
        }
        Op::LayerNorm { axes, eps } => {
            let eps = *eps;
            over_axes(&x()?.data, axes, |row| {
                let n = row.len() as f64;
                let mean = row.iter().sum::<f64>() / n;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
                let inv = 1.0 / (var + eps).sqrt();
                row.iter_mut().for_each(|v| *v = (*v - mean) * inv);
            })?
        }
        Op::Reshape { shape } => x()?
            .data
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order(IxDyn(shape))
            .map_err(shape_err)?,
        Op::Transpose { perm } => x()?.data.clone().permuted_axes(IxDyn(perm)),
        Op::Concat { axis } => {
            let views: Vec<_> = inputs.iter().map(|t| t.data.view()).collect();
            ndarray::concatenate(Axis(*axis), &views).map_err(shape_err)?
        }
        Op::Slice { axis, start, end } => x()?
            .data
            .slice_axis(Axis(*axis), Slice::from(*start..*end))
            .to_owned(),
        Op::Gather { axis } => {
            let ind = inputs
                .get(1)
                .ok_or_else(|| InterpError::Shape("gather needs its indices".into()))?;
            gather_rows(&x()?.data, &ind.data, *axis, &ty.shape)
        }
        Op::ScatterAdd { axis } => match inputs {
            [x, ind, upd] => scatter_add(&x.data, &ind.data, &upd.data, *axis),
            _ => {
                return Err(InterpError::Shape(
                    "scatter_add needs data, indices and updates".into(),
                ));
            }
        },
        Op::Broadcast { shape } => x()?
            .data
            .broadcast(IxDyn(shape))
            .ok_or_else(|| shape_err("broadcast"))?
            .to_owned(),
        Op::Conv2d {
            stride,
            padding,
            groups,
            dilation,
        } => conv2d(
            &inputs[0].data,
            &inputs[1].data,
            [*stride, *padding, *dilation],
            *groups,
            &ty.shape,
        )?,
        Op::Pool2d {
            kind,
            kernel,
            stride,
            padding,
        } => pool2d(&x()?.data, *kind, *kernel, *stride, *padding, &ty.shape),
        Op::BatchNorm { eps } => {
            let xd = &inputs[0].data;
            let mut stat_shape = vec![1usize; xd.ndim()];
            stat_shape[1] = xd.shape()[1];
            let stat = |i: usize| -> Result<ArrayD<f64>> {
                inputs[i]
                    .data
                    .clone()
                    .into_shape_with_order(IxDyn(&stat_shape))
                    .map_err(shape_err)
            };
            let (mean, var, gamma, beta) = (stat(1)?, stat(2)?, stat(3)?, stat(4)?);
            let scale = (var.mapv(|v| 1.0 / (v + eps).sqrt())) * &gamma;
            (xd - &mean) * &scale + &beta
        }
        Op::Compute(body) => eval_compute(body, inputs)?,
    };
    Ok(vec![finish(ty, out)?])
}

fn broadcast2(
    a: &ArrayD<f64>,
    b: &ArrayD<f64>,
    shape: &[usize],
) -> Result<(ArrayD<f64>, ArrayD<f64>)> {
    let a = a
        .broadcast(IxDyn(shape))
        .ok_or_else(|| shape_err("broadcast"))?
        .to_owned();
    let b = b
        .broadcast(IxDyn(shape))
        .ok_or_else(|| shape_err("broadcast"))?
        .to_owned();
    Ok((a, b))
}

/// Applies `f` to each group of elements that share all indices off `axes`.
fn over_axes(
    x: &ArrayD<f64>,
    axes: &[usize],
    mut f: impl FnMut(&mut [f64]),
) -> Result<ArrayD<f64>> {
    let rank = x.ndim();
    let mut perm: Vec<usize> = (0..rank).filter(|a| !axes.contains(a)).collect();
    perm.extend_from_slice(axes);
    let moved = x
        .clone()
        .permuted_axes(IxDyn(&perm))
        .as_standard_layout()
        .into_owned();
    let moved_shape = moved.shape().to_vec();
    let inner: usize = axes.iter().map(|&a| x.shape()[a]).product();
    let mut flat = moved.into_raw_vec_and_offset().0;
    if inner > 0 {
        for row in flat.chunks_mut(inner) {
            f(row);
        }
    }
    let moved = ArrayD::from_shape_vec(IxDyn(&moved_shape), flat).map_err(shape_err)?;
    let mut inverse = vec![0; rank];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    Ok(moved.permuted_axes(IxDyn(&inverse)))
}

/// Index `i` (an element of a gather's or scatter's indices) as a position
/// along an axis of extent `n`: a negative one counted from the end, `None`
/// outside the axis.
fn position(i: f64, n: usize) -> Option<usize> {
    let n = n as f64;
    let i = if i < 0.0 { i + n } else { i };
    (0.0..n).contains(&i).then_some(i as usize)
}

/// Where `at` (an index of a gather's result, or of a scatter's updates)
/// reads or writes in `x`: its own coordinates with the indices' ones
/// replaced by the index they hold at `axis`.
fn indexed_at(x: &[usize], ind: &ArrayD<f64>, axis: usize, at: &[usize]) -> Option<Vec<usize>> {
    let q = ind.ndim();
    let i = position(ind[&at[axis..axis + q]], x[axis])?;
    let mut to: Vec<usize> = at[..axis].to_vec();
    to.push(i);
    to.extend(&at[axis + q..]);
    Some(to)
}

/// `gather(x, ind)` along `axis`, of shape `shape`: an index outside the
/// axis reads zero.
fn gather_rows(x: &ArrayD<f64>, ind: &ArrayD<f64>, axis: usize, shape: &[usize]) -> ArrayD<f64> {
    ArrayD::from_shape_fn(IxDyn(shape), |idx| {
        indexed_at(x.shape(), ind, axis, ndarray::Dimension::slice(&idx))
            .map_or(0.0, |at| x[at.as_slice()])
    })
}

/// `scatter_add(x, ind, upd)` along `axis`: each update added in turn; one
/// at an index outside the axis adds nowhere.
fn scatter_add(x: &ArrayD<f64>, ind: &ArrayD<f64>, upd: &ArrayD<f64>, axis: usize) -> ArrayD<f64> {
    let mut out = x.clone();
    for (idx, &u) in upd.indexed_iter() {
        if let Some(at) = indexed_at(x.shape(), ind, axis, ndarray::Dimension::slice(&idx)) {
            out[at.as_slice()] += u;
        }
    }
    out
}

fn matmul(a: &ArrayD<f64>, b: &ArrayD<f64>, out_shape: &[usize]) -> Result<ArrayD<f64>> {
    let mut a_shape = a.shape().to_vec();
    let mut b_shape = b.shape().to_vec();
    if a_shape.len() == 1 {
        a_shape.insert(0, 1);
    }
    if b_shape.len() == 1 {
        b_shape.push(1);
    }
    let (m, k) = (a_shape[a_shape.len() - 2], a_shape[a_shape.len() - 1]);
    let n = b_shape[b_shape.len() - 1];
    let batch = crate::infer::broadcast_shapes(&[
        &a_shape[..a_shape.len() - 2],
        &b_shape[..b_shape.len() - 2],
    ])
    .ok_or_else(|| shape_err("matmul batch"))?;
    let nbatch: usize = batch.iter().product();
    let full =
        |shape: &[usize], rows: usize, cols: usize, x: &ArrayD<f64>| -> Result<ArrayD<f64>> {
            let x = x
                .clone()
                .into_shape_with_order(IxDyn(shape))
                .map_err(shape_err)?;
            let mut target = batch.clone();
            target.extend([rows, cols]);
            let owned = x
                .broadcast(IxDyn(&target))
                .ok_or_else(|| shape_err("matmul"))?
                .to_owned();
            owned
                .into_shape_with_order(IxDyn(&[nbatch, rows, cols]))
                .map_err(shape_err)
        };
    let a3 = full(&a_shape, m, k, a)?;
    let b3 = full(&b_shape, k, n, b)?;
    let mut out = ndarray::Array3::<f64>::zeros((nbatch, m, n));
    for i in 0..nbatch {
        let av: ArrayView2<'_, f64> = a3
            .index_axis(Axis(0), i)
            .into_dimensionality()
            .map_err(shape_err)?;
        let bv: ArrayView2<'_, f64> = b3
            .index_axis(Axis(0), i)
            .into_dimensionality()
            .map_err(shape_err)?;
        out.slice_mut(s![i, .., ..]).assign(&av.dot(&bv));
    }
    out.into_dyn()
        .into_shape_with_order(IxDyn(out_shape))
        .map_err(shape_err)
}

/// `[stride, padding, dilation]`: the window's, along H and W.
fn conv2d(
    x: &ArrayD<f64>,
    w: &ArrayD<f64>,
    [stride, padding, dilation]: [[usize; 2]; 3],
    groups: usize,
    out_shape: &[usize],
) -> Result<ArrayD<f64>> {
    let (n, h, wd) = (x.shape()[0], x.shape()[2], x.shape()[3]);
    let (o, cg, kh, kw) = (w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]);
    let (oh, ow) = (out_shape[2], out_shape[3]);
    let og = o / groups;
    let wmat = w
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order((o, cg * kh * kw))
        .map_err(shape_err)?;
    let mut out = ndarray::Array4::<f64>::zeros((n, o, oh, ow));
    let mut col = ndarray::Array2::<f64>::zeros((cg * kh * kw, oh * ow));
    for b in 0..n {
        for g in 0..groups {
            col.fill(0.0);
            for ci in 0..cg {
                let chan = x.index_axis(Axis(0), b);
                let chan = chan.index_axis(Axis(0), g * cg + ci);
                for ky in 0..kh {
                    for kx in 0..kw {
                        let row = (ci * kh + ky) * kw + kx;
                        for y in 0..oh {
                            let iy =
                                (y * stride[0] + ky * dilation[0]) as isize - padding[0] as isize;
                            if iy < 0 || iy >= h as isize {
                                continue;
                            }
                            for xo in 0..ow {
                                let ix = (xo * stride[1] + kx * dilation[1]) as isize
                                    - padding[1] as isize;
                                if ix >= 0 && ix < wd as isize {
                                    col[[row, y * ow + xo]] = chan[[iy as usize, ix as usize]];
                                }
                            }
                        }
                    }
                }
            }
            let wg = wmat.slice(s![g * og..(g + 1) * og, ..]);
            let res = wg.dot(&col);
            let res = res.into_shape_with_order((og, oh, ow)).map_err(shape_err)?;
            out.slice_mut(s![b, g * og..(g + 1) * og, .., ..])
                .assign(&res);
        }
    }
    Ok(out.into_dyn())
}

fn pool2d(
    x: &ArrayD<f64>,
    kind: PoolKind,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    out_shape: &[usize],
) -> ArrayD<f64> {
    let (h, w) = (x.shape()[2] as isize, x.shape()[3] as isize);
    ArrayD::from_shape_fn(IxDyn(out_shape), |ix| {
        let (b, c, y, xo) = (ix[0], ix[1], ix[2], ix[3]);
        let mut acc = match kind {
            PoolKind::Max => f64::NEG_INFINITY,
            PoolKind::Avg => 0.0,
        };
        for ky in 0..kernel[0] {
            for kx in 0..kernel[1] {
                let iy = (y * stride[0] + ky) as isize - padding[0] as isize;
                let ixx = (xo * stride[1] + kx) as isize - padding[1] as isize;
                if iy < 0 || iy >= h || ixx < 0 || ixx >= w {
                    continue;
                }
                let v = x[[b, c, iy as usize, ixx as usize]];
                acc = match kind {
                    PoolKind::Max => ReduceKind::Max.combine(acc, v),
                    PoolKind::Avg => acc + v,
                };
            }
        }
        match kind {
            PoolKind::Max => acc,
            PoolKind::Avg => acc / (kernel[0] * kernel[1]) as f64,
        }
    })
}

/// A scalar expression with every element type resolved, so evaluation
/// needs no type inference per point.
enum Eval {
    Const(f64),
    Read {
        src: Source,
        index: Vec<crate::compute::Affine>,
    },
    Unary(UnaryOp, Box<Eval>, DType),
    Binary(BinaryOp, Box<Eval>, Box<Eval>, DType),
    Compare(crate::ops::CmpOp, Box<Eval>, Box<Eval>),
    Select(Box<Eval>, Box<Eval>, Box<Eval>),
    Cast(DType, Box<Eval>),
    Reduce {
        kind: ReduceKind,
        vars: Vec<crate::compute::RangeVar>,
        body: Box<Eval>,
        dtype: DType,
    },
}

/// Lowers `e` given the element types of operands and locals. A bare number
/// takes the type of what it meets (`ctx`).
fn resolve(e: &ScalarExpr, types: &dyn Fn(Source) -> DType, ctx: DType) -> (Eval, Option<DType>) {
    match e {
        ScalarExpr::Const(v) => (Eval::Const(*v), None),
        ScalarExpr::Read { src, index } => (
            Eval::Read {
                src: *src,
                index: index.clone(),
            },
            Some(types(*src)),
        ),
        ScalarExpr::Unary(u, x) => {
            let (x, d) = resolve(x, types, ctx);
            let d = d.unwrap_or(ctx);
            (Eval::Unary(*u, Box::new(x), d), Some(d))
        }
        ScalarExpr::Binary(b, x, y) => {
            let (dx, dy) = (resolve(x, types, ctx).1, resolve(y, types, ctx).1);
            let d = dx.or(dy);
            let c = d.unwrap_or(ctx);
            let (x, _) = resolve(x, types, c);
            let (y, _) = resolve(y, types, c);
            (Eval::Binary(*b, Box::new(x), Box::new(y), c), d)
        }
        ScalarExpr::Compare(op, x, y) => {
            let d = resolve(x, types, ctx)
                .1
                .or(resolve(y, types, ctx).1)
                .unwrap_or(ctx);
            let (x, _) = resolve(x, types, d);
            let (y, _) = resolve(y, types, d);
            (
                Eval::Compare(*op, Box::new(x), Box::new(y)),
                Some(DType::Bool),
            )
        }
        ScalarExpr::Select(c, x, y) => {
            let (c, _) = resolve(c, types, DType::Bool);
            let d = resolve(x, types, ctx).1.or(resolve(y, types, ctx).1);
            let (x, _) = resolve(x, types, d.unwrap_or(ctx));
            let (y, _) = resolve(y, types, d.unwrap_or(ctx));
            (Eval::Select(Box::new(c), Box::new(x), Box::new(y)), d)
        }
        ScalarExpr::Cast(to, x) => {
            let (x, _) = resolve(x, types, *to);
            (Eval::Cast(*to, Box::new(x)), Some(*to))
        }
        ScalarExpr::Reduce { kind, vars, body } => {
            let (b, d) = resolve(body, types, ctx);
            let dtype = d.unwrap_or(ctx);
            (
                Eval::Reduce {
                    kind: *kind,
                    vars: vars.clone(),
                    body: Box::new(b),
                    dtype,
                },
                d,
            )
        }
    }
}

struct Scope<'a> {
    inputs: &'a [&'a Tensor],
    locals: &'a [ArrayD<f64>],
}

fn read(
    arr: &ArrayD<f64>,
    index: &[crate::compute::Affine],
    env: &[i64],
    ix: &mut Vec<usize>,
) -> f64 {
    ix.clear();
    for (a, &dim) in index.iter().zip(arr.shape()) {
        let i = a.eval(env);
        if i < 0 || i as u64 >= dim as u64 {
            return 0.0;
        }
        ix.push(i as usize);
    }
    arr[ix.as_slice()]
}

fn eval_scalar(e: &Eval, env: &mut [i64], scope: &Scope<'_>, ix: &mut Vec<usize>) -> Option<f64> {
    Some(match e {
        Eval::Const(v) => *v,
        Eval::Read { src, index } => match src {
            Source::Input(i) => read(&scope.inputs[*i as usize].data, index, env, ix),
            Source::Local(i) => read(&scope.locals[*i as usize], index, env, ix),
        },
        Eval::Unary(u, x, d) => d.round(apply_unary(*u, eval_scalar(x, env, scope, ix)?)),
        Eval::Binary(b, x, y, d) => {
            let (p, q) = (
                eval_scalar(x, env, scope, ix)?,
                eval_scalar(y, env, scope, ix)?,
            );
            d.round(dlc_core::scalar::apply_binary_in(
                *b,
                d.round(p),
                d.round(q),
                *d,
            )?)
        }
        Eval::Compare(c, x, y) => {
            let (p, q) = (
                eval_scalar(x, env, scope, ix)?,
                eval_scalar(y, env, scope, ix)?,
            );
            f64::from(u8::from(c.apply(p, q)))
        }
        Eval::Select(c, x, y) => {
            if eval_scalar(c, env, scope, ix)? != 0.0 {
                eval_scalar(x, env, scope, ix)?
            } else {
                eval_scalar(y, env, scope, ix)?
            }
        }
        Eval::Cast(to, x) => to.round(eval_scalar(x, env, scope, ix)?),
        Eval::Reduce {
            kind,
            vars,
            body,
            dtype,
        } => {
            let mut acc = kind.identity();
            let mut count = 0u64;
            reduce_rec(vars, env, &mut |env| {
                let v = eval_scalar(body, env, scope, &mut Vec::new())?;
                acc = kind.combine(acc, v);
                count += 1;
                Some(())
            })?;
            if *kind == ReduceKind::Mean && count > 0 {
                acc /= count as f64;
            }
            dtype.round(acc)
        }
    })
}

fn reduce_rec(
    vars: &[crate::compute::RangeVar],
    env: &mut [i64],
    f: &mut dyn FnMut(&mut [i64]) -> Option<()>,
) -> Option<()> {
    match vars.split_first() {
        None => f(env),
        Some((rv, rest)) => {
            for i in rv.lo..rv.hi {
                env[rv.var.0 as usize] = i;
                reduce_rec(rest, env, f)?;
            }
            Some(())
        }
    }
}

fn eval_compute(body: &ComputeBody, inputs: &[&Tensor]) -> Result<ArrayD<f64>> {
    let mut max_var = 0u32;
    let defs: Vec<&crate::compute::ElemDef> = body.locals.iter().chain([&body.out]).collect();
    for d in &defs {
        for v in &d.vars {
            max_var = max_var.max(v.0);
        }
        d.expr.visit(&mut |e| {
            if let ScalarExpr::Reduce { vars, .. } = e {
                for rv in vars {
                    max_var = max_var.max(rv.var.0);
                }
            }
        });
    }
    let mut env = vec![0i64; max_var as usize + 1];
    let mut locals: Vec<ArrayD<f64>> = Vec::new();
    for def in defs {
        check_size(&def.ty)?;
        let local_types: Vec<DType> = body.locals.iter().map(|l| l.ty.dtype).collect();
        let types = |s: Source| match s {
            Source::Input(i) => inputs[i as usize].dtype,
            Source::Local(i) => local_types[i as usize],
        };
        let (expr, _) = resolve(&def.expr, &types, def.ty.dtype);
        let mut arr = ArrayD::<f64>::zeros(IxDyn(&def.ty.shape));
        let scope = Scope {
            inputs,
            locals: &locals,
        };
        let mut ix = Vec::new();
        for (idx, slot) in arr.indexed_iter_mut() {
            for (k, v) in def.vars.iter().enumerate() {
                env[v.0 as usize] = idx[k] as i64;
            }
            let value = eval_scalar(&expr, &mut env, &scope, &mut ix).ok_or_else(|| {
                InterpError::DivisionByZero(format!("graph.compute `{}`", body.name))
            })?;
            *slot = def.ty.dtype.round(value);
        }
        locals.push(arr);
    }
    locals
        .pop()
        .ok_or_else(|| InterpError::Shape("compute body without output".into()))
}
