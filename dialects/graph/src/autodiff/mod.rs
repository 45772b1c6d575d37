//! Reverse-mode automatic differentiation of the graph dialect.
//!
//! [`value_and_grad`] turns a function whose first result is a float scalar
//! into one that also returns that scalar's gradient with respect to chosen
//! parameters. The gradient is ordinary graph ops added after the forward
//! ones (a reverse sweep over the function in topological order, each op's
//! adjoints given by its rule in [`rules`], adjoints of a value used twice
//! summed), so saturation, fusion and every back end apply to it as they
//! do to the forward program. A user operator's adjoints are user operators
//! derived from its expression ([`compute`]).
//!
//! # Checkpoints, rules and documented choices
//!
//! - **Gradient checkpointing.** `checkpoint(f(..))` calls `f$checkpoint`, a copy of `f`
//!   marked `Function::recompute` (not part of the text form). `add_grad_function`
//!   inlines every call but those (`transforms::inline_into`); the sweep gives such a call
//!   the adjoint `f$checkpoint$vjp(barrier(arg, t).., adjoints..)`, a private function
//!   made once per callee (its body again, calls inlined, and the reverse sweep from its
//!   results' adjoints as parameters), where `t` is one element of the call's adjoint as
//!   a scalar. `graph.barrier(x, t)` is `x`, element-wise and inlined by the lowering, but
//!   opaque to saturation and folding: the recomputation reads different values than the
//!   forward pass, so it is not merged with it, and it depends on `t`, so the topological
//!   order that graph -> loop emits in puts it after the adjoint exists. Invariant: the
//!   forward values inside a checkpointed call have no user in the backward pass, so
//!   their buffers are free once the forward pass is done with them. Otherwise the
//!   gradient reads the forward values it needs, and which element-wise ones are held
//!   and which computed again is chosen later, by cost, on the program that will be
//!   compiled: `graph.remat` (`crate::transforms::remat`). A user operator's locals that
//!   its adjoints read are computed by operators of their own (`NAME.tK`); once the
//!   sweep is done, `compute::keep_by_cost` tries each with the forward operator reading
//!   that operator's result (its body rewritten so, one more operand) and keeps it where
//!   the same prices as `graph.remat`'s say (planned cost and `fusion::memory`, for the
//!   x86-64 AVX2 baseline): computed once and held, or computed in both passes.
//!   Invariant: the forward operator's result is unchanged (the same definitions, a
//!   local read instead of computed).
//!
//! - **One rule per op, in one place.** `autodiff/rules.rs::vjp` holds every graph op's
//!   derivative rule, as `infer.rs` holds every typing rule. Element-wise functions take
//!   theirs from `dlc_core::scalar` (`UnaryOp::derivative`, `BinaryOp::partials`: a small
//!   expression over the operands and the result, `Formula`), which the tensor rules and
//!   the derivation of user operators both build (`FormulaBuilder`), so `tanh'` is written
//!   once. A rule reads the result where that saves memory: `relu'` is `r > 0` (the same
//!   mask as `x > 0`, as PyTorch's `threshold_backward`), so a product's epilogue can
//!   add the bias and apply the relu and store only `r`. An op with no rule would be an error naming the op and its source place,
//!   never a zero (every float op has one now; a `prod` reduction inside a user operator
//!   is adjointed by an operator of the others' product, quadratic in the reduced
//!   extent).
//! - **Documented choices.** `max`/`min` (element-wise and reductions) split the adjoint
//!   evenly among ties, as JAX does; `relu'(0) = 0`; `floor`, `ceil`, `round`, `sign` have
//!   derivative 0; `pow`'s exponent derivative takes `log(0)` as 0; `prod` gives each
//!   element the product of the others, exactly, zeros included; integer and bool values
//!   carry no gradient (a cast to a float starts none).

mod compute;
mod rules;

use std::collections::{HashMap, HashSet};

use dlc_core::scalar::{BinaryOp, CmpOp, FormulaBuilder, ReduceKind, UnaryOp};
use dlc_core::{DType, Pass, PassError, SourceLoc, TensorType};
use petgraph::stable_graph::NodeIndex;

use crate::module::{Function, Module, Value, Visibility};
use crate::ops::{ConstValue, Op};

/// Why a gradient could not be built: what, and where in the source.
#[derive(Debug, Clone, PartialEq)]
pub struct GradError {
    /// What is wrong.
    pub message: String,
    /// The op it is about, when it came from source.
    pub loc: Option<SourceLoc>,
}

impl std::fmt::Display for GradError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.loc {
            Some(loc) => write!(f, "{loc}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for GradError {}

fn fail(message: impl Into<String>) -> GradError {
    GradError {
        message: message.into(),
        loc: None,
    }
}

/// The function `name` computing what `f` computes (all of its results,
/// in order) followed by the gradient of `f`'s first result, a float
/// scalar, with respect to each parameter in `wrt` (positions in `f`'s
/// signature, each a float tensor), in that order. `f` must have no calls
/// (run `graph.inline` first). A parameter the result does not depend on
/// gets a zero gradient; an op on the way from a parameter to the result
/// that has no derivative is an error naming it and its source place.
pub fn value_and_grad(f: &Function, wrt: &[usize], name: &str) -> Result<Function, GradError> {
    value_and_grad_with(f, wrt, name, false)
}

/// How [`add_grad_function_with`] derives a gradient.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GradOptions {
    /// Compute the function's products in this narrow float type (bf16 or
    /// f16) first ([`crate::transforms::autocast`]): mixed precision.
    pub autocast: Option<DType>,
    /// Seed the reverse sweep with one more parameter, [`LOSS_SCALE`] (a
    /// scalar of the differentiated result's type, after the function's
    /// own), instead of 1: the gradients are those of the scaled result,
    /// as loss scaling wants, and the result itself is not scaled.
    pub scaled: bool,
}

/// The name of the parameter [`GradOptions::scaled`] adds.
pub const LOSS_SCALE: &str = "__loss_scale";

/// [`value_and_grad`], seeded by a last parameter [`LOSS_SCALE`] when
/// `scaled`.
pub fn value_and_grad_with(
    f: &Function,
    wrt: &[usize],
    name: &str,
    scaled: bool,
) -> Result<Function, GradError> {
    derive(f, wrt, name, scaled, &mut Recompute::default())
}

/// The functions a gradient may call without inlining them
/// ([`Function::recompute`]), and the functions it adds: for each, the
/// vector-Jacobian product `NAME$vjp` that recomputes its body.
#[derive(Default)]
struct Recompute {
    /// The module's functions, where calls are looked up.
    callees: Vec<Function>,
    /// The `$vjp` functions made so far.
    made: Vec<Function>,
}

impl Recompute {
    fn callee(&self, n: &crate::module::Node) -> Option<&Function> {
        match &n.op {
            Op::Call { callee } => self
                .callees
                .iter()
                .find(|g| g.name == *callee && g.recompute),
            _ => None,
        }
    }
}

fn derive(
    f: &Function,
    wrt: &[usize],
    name: &str,
    scaled: bool,
    recompute: &mut Recompute,
) -> Result<Function, GradError> {
    let Some(&loss) = f.results.first() else {
        return Err(fail(format!(
            "@{} returns nothing to differentiate",
            f.name
        )));
    };
    let loss_ty = f.value_type(loss).clone();
    if loss_ty.rank() != 0 || !loss_ty.dtype.is_float() {
        return Err(fail(format!(
            "@{}: the differentiated result must be a float scalar, got {loss_ty}",
            f.name
        )));
    }
    for &p in wrt {
        let Some((pname, node)) = f.params.get(p) else {
            return Err(fail(format!("@{} has no parameter {p}", f.name)));
        };
        let ty = &f.body[*node].results[0];
        if !ty.dtype.is_float() {
            return Err(fail(format!(
                "@{}: parameter `{pname}` is {ty}; only float values have gradients",
                f.name
            )));
        }
    }
    let mut g = f.clone();
    g.name = name.to_string();
    g.visibility = Visibility::Public;
    g.recompute = false;
    let roots: Vec<NodeIndex> = wrt.iter().map(|&p| g.params[p].1).collect();
    let seed = if scaled {
        g.add_param(LOSS_SCALE, loss_ty)
    } else {
        add_constant(&mut g, 1.0, loss_ty)
    };
    let mut locals = Vec::new();
    let adj = sweep(&mut g, &roots, &[(loss, seed)], recompute, &mut locals)?;
    for &p in wrt {
        let grad = param_adjoint(&mut g, &adj, p);
        g.results.push(grad);
    }
    compute::keep_by_cost(&mut g, locals);
    Ok(g)
}

/// The adjoint of parameter `p` of `g`: zeros where nothing reached it.
fn param_adjoint(g: &mut Function, adj: &HashMap<Value, Value>, p: usize) -> Value {
    let v = Value::of(g.params[p].1);
    match adj.get(&v) {
        Some(&a) => a,
        None => {
            let ty = g.value_type(v).clone();
            add_constant(g, 0.0, ty)
        }
    }
}

/// The reverse sweep over `g`: from the adjoints `seeds` (a value, its
/// adjoint) back to every value that depends on one of `roots` and can
/// carry a gradient. A call of a [`Function::recompute`] function is
/// differentiated by a call of its `$vjp` (made once, into `recompute`) on
/// the arguments passed through barriers that wait for the call's adjoint,
/// so that its body is computed again then rather than kept.
fn sweep(
    g: &mut Function,
    roots: &[NodeIndex],
    seeds: &[(Value, Value)],
    recompute: &mut Recompute,
    locals: &mut Vec<compute::LocalCopy>,
) -> Result<HashMap<Value, Value>, GradError> {
    if let Some(n) = g.body.node_indices().find(|&n| {
        matches!(g.body[n].op, Op::Call { .. }) && recompute.callee(&g.body[n]).is_none()
    }) {
        return Err(GradError {
            message: format!(
                "@{} calls another function; inline it first (graph.inline)",
                g.name
            ),
            loc: g.body[n].loc.clone(),
        });
    }
    let order = g.topo_order();
    // Values that depend on a differentiated parameter and can carry a
    // gradient.
    let mut active: HashSet<NodeIndex> = roots.iter().copied().collect();
    for &n in &order {
        if matches!(g.body[n].op, Op::Param { .. }) {
            continue;
        }
        let results = &g.body[n].results;
        let float = if recompute.callee(&g.body[n]).is_some() {
            results.iter().any(|t| t.dtype.is_float())
        } else {
            results.iter().all(|t| t.dtype.is_float())
        };
        if float && g.operands(n).iter().any(|v| active.contains(&v.node)) {
            active.insert(n);
        }
    }
    let mut adj: HashMap<Value, Value> = HashMap::new();
    for &(v, seed) in seeds {
        if active.contains(&v.node) {
            adj.insert(v, seed);
        }
    }
    for &n in order.iter().rev() {
        if !active.contains(&n) || matches!(g.body[n].op, Op::Param { .. }) {
            continue;
        }
        let operands = g.operands(n);
        let needs: Vec<bool> = operands.iter().map(|v| active.contains(&v.node)).collect();
        let loc = g.body[n].loc.clone();
        if let Some(callee) = recompute.callee(&g.body[n]).cloned() {
            let grads = recompute_call(g, n, &callee, &adj, recompute)?;
            let mut b = Builder {
                f: g,
                loc: loc.clone(),
                locals: Vec::new(),
            };
            for (i, grad) in grads.into_iter().enumerate() {
                if let (true, Some(grad)) = (needs[i], grad) {
                    accumulate(&mut b, &mut adj, operands[i], grad).map_err(|message| {
                        GradError {
                            message,
                            loc: loc.clone(),
                        }
                    })?;
                }
            }
            continue;
        }
        let out = Value::of(n);
        let Some(&seed) = adj.get(&out) else { continue };
        let op = g.body[n].op.clone();
        let mut b = Builder {
            f: g,
            loc: loc.clone(),
            locals: Vec::new(),
        };
        let grads =
            rules::vjp(&mut b, &op, &operands, out, seed, &needs).map_err(|message| GradError {
                message: format!("the gradient of {}: {message}", op.name()),
                loc: loc.clone(),
            })?;
        locals.append(&mut b.locals);
        for (i, grad) in grads.into_iter().enumerate() {
            if let (true, Some(grad)) = (needs[i], grad) {
                accumulate(&mut b, &mut adj, operands[i], grad).map_err(|message| GradError {
                    message,
                    loc: loc.clone(),
                })?;
            }
        }
    }
    Ok(adj)
}

/// The adjoints of the arguments of call `n` of the recompute function
/// `callee` (one per argument, `None` for those without one), given the
/// adjoints of its results in `adj`: a call of `callee$vjp` on the
/// arguments, each through a barrier waiting for an element of one of
/// those adjoints, and the adjoints (zeros where a result has none).
fn recompute_call(
    g: &mut Function,
    n: NodeIndex,
    callee: &Function,
    adj: &HashMap<Value, Value>,
    recompute: &mut Recompute,
) -> Result<Vec<Option<Value>>, GradError> {
    let loc = g.body[n].loc.clone();
    let results = g.body[n].results.clone();
    let seeds: Vec<Option<Value>> = (0..results.len() as u32)
        .map(|r| adj.get(&Value { node: n, result: r }).copied())
        .collect();
    let Some(&first) = seeds.iter().flatten().next() else {
        return Ok(vec![None; g.operands(n).len()]);
    };
    let err = |message: String| GradError {
        message,
        loc: loc.clone(),
    };
    // One element of the adjoint, as a scalar: what the barriers wait for.
    let mut b = Builder {
        f: g,
        loc: loc.clone(),
        locals: Vec::new(),
    };
    let token = crate::transforms::scalar_token(b.f, first);
    let mut operands = Vec::new();
    for a in b.f.operands(n) {
        operands.push(b.op(Op::Barrier, &[a, token]).map_err(err)?);
    }
    for (r, seed) in seeds.iter().enumerate() {
        if !results[r].dtype.is_float() {
            continue;
        }
        operands.push(match seed {
            Some(s) => *s,
            None => add_constant(b.f, 0.0, results[r].clone()),
        });
    }
    let vjp = vjp_function(callee, recompute)?;
    let types = vjp.result_types();
    let positions = float_params(callee);
    let call = b.f.add_node(
        Op::Call {
            callee: vjp.name.clone(),
        },
        &operands,
        types,
    );
    b.f.body[call].loc = loc;
    let mut grads = vec![None; callee.params.len()];
    for (k, &p) in positions.iter().enumerate() {
        grads[p] = Some(Value {
            node: call,
            result: k as u32,
        });
    }
    Ok(grads)
}

/// The positions of `f`'s float parameters.
fn float_params(f: &Function) -> Vec<usize> {
    f.param_types()
        .iter()
        .enumerate()
        .filter(|(_, t)| t.dtype.is_float())
        .map(|(i, _)| i)
        .collect()
}

/// `NAME$vjp` of the recompute function `callee` (made on first use): its
/// parameters, then an adjoint for each float result; it computes the body
/// again (calls inlined) and returns the adjoint of each float parameter.
fn vjp_function(callee: &Function, recompute: &mut Recompute) -> Result<Function, GradError> {
    let name = format!("{}$vjp", callee.name);
    if let Some(made) = recompute.made.iter().find(|f| f.name == name) {
        return Ok(made.clone());
    }
    let mut h = callee.clone();
    let everything = |_: &Function| false;
    crate::transforms::inline_into(&mut h, &recompute.callees, &everything).map_err(fail)?;
    h.name.clone_from(&name);
    h.visibility = Visibility::Private;
    h.recompute = false;
    h.weights.clear();
    let mut seeds = Vec::new();
    for (r, v) in h.results.clone().into_iter().enumerate() {
        let ty = h.value_type(v).clone();
        if ty.dtype.is_float() {
            let cot = h.add_param(format!("__adjoint{r}"), ty);
            seeds.push((v, cot));
        }
    }
    let positions = float_params(callee);
    let roots: Vec<NodeIndex> = positions.iter().map(|&p| h.params[p].1).collect();
    // A recomputed body recomputes its operators' locals too.
    let adj = sweep(&mut h, &roots, &seeds, recompute, &mut Vec::new())?;
    h.results = positions
        .iter()
        .map(|&p| param_adjoint(&mut h, &adj, p))
        .collect();
    crate::transforms::remove_dead_nodes(&mut h);
    recompute.made.push(h.clone());
    Ok(h)
}

fn add_constant(f: &mut Function, c: f64, ty: TensorType) -> Value {
    f.add_op(Op::Constant(ConstValue::Splat(c)), &[], ty)
}

fn accumulate(
    b: &mut Builder<'_>,
    adj: &mut HashMap<Value, Value>,
    of: Value,
    grad: Value,
) -> Result<(), String> {
    let sum = match adj.get(&of) {
        Some(&prev) => b.binary(BinaryOp::Add, prev, grad)?,
        None => grad,
    };
    adj.insert(of, sum);
    Ok(())
}

/// Adds ops to the function being differentiated, each typed by
/// [`crate::infer::infer`] and marked with the source place of the op whose
/// rule builds it.
pub(crate) struct Builder<'f> {
    pub(crate) f: &'f mut Function,
    loc: Option<SourceLoc>,
    /// Locals of user operators the rules computed again by operators of
    /// their own ([`compute::LocalCopy`]).
    locals: Vec<compute::LocalCopy>,
}

impl Builder<'_> {
    pub(crate) fn ty(&self, v: Value) -> TensorType {
        self.f.value_type(v).clone()
    }

    pub(crate) fn op(&mut self, op: Op, xs: &[Value]) -> Result<Value, String> {
        let types: Vec<TensorType> = xs.iter().map(|&v| self.ty(v)).collect();
        let refs: Vec<&TensorType> = types.iter().collect();
        let result = match &op {
            Op::Compute(body) => {
                crate::verify::check_compute(body, &refs)
                    .map_err(|m| format!("derived operator `{}`: {m}", body.name))?;
                body.out.ty.clone()
            }
            _ => {
                let mut r = crate::infer::infer(&op, &refs).map_err(|e| e.message)?;
                r.remove(0)
            }
        };
        let v = self.f.add_op(op, xs, result);
        self.f.body[v.node].loc = self.loc.clone();
        Ok(v)
    }

    pub(crate) fn constant(&mut self, c: f64, ty: TensorType) -> Value {
        let v = add_constant(self.f, c, ty);
        self.f.body[v.node].loc = self.loc.clone();
        v
    }

    pub(crate) fn scalar(&mut self, c: f64, dtype: DType) -> Value {
        self.constant(c, TensorType::new(dtype, vec![]))
    }

    pub(crate) fn binary(&mut self, b: BinaryOp, x: Value, y: Value) -> Result<Value, String> {
        self.op(Op::Binary(b), &[x, y])
    }

    pub(crate) fn unary(&mut self, u: UnaryOp, x: Value) -> Result<Value, String> {
        self.op(Op::Unary(u), &[x])
    }

    pub(crate) fn reshape(&mut self, x: Value, shape: &[usize]) -> Result<Value, String> {
        if self.ty(x).shape == shape {
            return Ok(x);
        }
        self.op(
            Op::Reshape {
                shape: shape.to_vec(),
            },
            &[x],
        )
    }

    pub(crate) fn reduce(
        &mut self,
        kind: ReduceKind,
        x: Value,
        axes: &[usize],
        keepdims: bool,
    ) -> Result<Value, String> {
        if axes.is_empty() {
            return Ok(x);
        }
        self.op(
            Op::Reduce {
                kind,
                axes: axes.to_vec(),
                keepdims,
            },
            &[x],
        )
    }

    pub(crate) fn select(&mut self, c: Value, t: Value, e: Value) -> Result<Value, String> {
        self.op(Op::Select, &[c, t, e])
    }

    pub(crate) fn compare(&mut self, c: CmpOp, x: Value, y: Value) -> Result<Value, String> {
        self.op(Op::Compare(c), &[x, y])
    }

    pub(crate) fn broadcast(&mut self, x: Value, shape: &[usize]) -> Result<Value, String> {
        if self.ty(x).shape == shape {
            return Ok(x);
        }
        self.op(
            Op::Broadcast {
                shape: shape.to_vec(),
            },
            &[x],
        )
    }

    /// `x` summed down to `shape`, which it was broadcast from: the adjoint
    /// of a broadcast.
    pub(crate) fn sum_to(&mut self, x: Value, shape: &[usize]) -> Result<Value, String> {
        let have = self.ty(x).shape;
        if have == shape {
            return Ok(x);
        }
        let lead = have.len() - shape.len();
        let axes: Vec<usize> = (0..have.len())
            .filter(|&a| a < lead || (shape[a - lead] == 1 && have[a] != 1))
            .collect();
        let summed = self.reduce(ReduceKind::Sum, x, &axes, true)?;
        self.reshape(summed, shape)
    }
}

/// A value built by a derivative rule on tensors: a number not yet
/// materialized (so `g * 1` is `g` and `g * 0` is nothing), or a tensor.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Elem {
    Const(f64),
    Tensor(Value),
}

/// Builds [`dlc_core::scalar::Formula`] rules from tensors of one element
/// type, broadcasting as the graph's element-wise ops do.
pub(crate) struct ElemBuilder<'a, 'f> {
    pub(crate) b: &'a mut Builder<'f>,
    pub(crate) dtype: DType,
}

impl ElemBuilder<'_, '_> {
    pub(crate) fn tensor(&mut self, e: Elem) -> Value {
        match e {
            Elem::Tensor(v) => v,
            Elem::Const(c) => self.b.scalar(c, self.dtype),
        }
    }
}

impl FormulaBuilder for ElemBuilder<'_, '_> {
    type Value = Elem;
    type Error = String;

    fn constant(&mut self, c: f64) -> Result<Elem, String> {
        Ok(Elem::Const(c))
    }

    fn unary(&mut self, u: UnaryOp, a: Elem) -> Result<Elem, String> {
        let a = self.tensor(a);
        Ok(Elem::Tensor(self.b.unary(u, a)?))
    }

    fn binary(&mut self, op: BinaryOp, x: Elem, y: Elem) -> Result<Elem, String> {
        let (x, y) = (self.tensor(x), self.tensor(y));
        Ok(Elem::Tensor(self.b.binary(op, x, y)?))
    }

    fn as_const(&self, v: &Elem) -> Option<f64> {
        match v {
            Elem::Const(c) => Some(*c),
            Elem::Tensor(_) => None,
        }
    }

    fn select(&mut self, cmp: CmpOp, a: Elem, b: Elem, t: Elem, e: Elem) -> Result<Elem, String> {
        let (a, b) = (self.tensor(a), self.tensor(b));
        let c = self.b.compare(cmp, a, b)?;
        let (t, e) = (self.tensor(t), self.tensor(e));
        Ok(Elem::Tensor(self.b.select(c, t, e)?))
    }
}

/// `graph.grad`: adds to the module the function `name` (default
/// `ENTRY_grad`) returning what `entry` returns and the gradient of its
/// first result with respect to the parameters `wrt` (names joined by `+`;
/// default: the entry's weights, or every float parameter if it has none).
/// Calls in the entry are inlined first.
pub struct Grad {
    /// The function differentiated.
    pub entry: String,
    /// Parameter names; empty for the default.
    pub wrt: Vec<String>,
    /// The new function's name; empty for `ENTRY_grad`.
    pub name: String,
    /// Mixed precision and loss scaling (`autocast=bf16`, `scaled=true`).
    pub options: GradOptions,
}

impl Grad {
    /// Builds the pass from `entry=F,wrt=a+b,name=G,autocast=bf16,scaled=true`.
    pub fn from_options(o: &dlc_core::PassOptions) -> Result<Grad, PassError> {
        o.expect_only(&["entry", "wrt", "name", "autocast", "scaled"])?;
        let entry: String = o.get("entry", String::new())?;
        if entry.is_empty() {
            return Err(PassError::BadOption {
                pass: "graph.grad".into(),
                message: "option `entry` (the function to differentiate) is required".into(),
            });
        }
        let wrt: String = o.get("wrt", String::new())?;
        Ok(Grad {
            entry,
            wrt: wrt
                .split('+')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            name: o.get("name", String::new())?,
            options: GradOptions {
                autocast: match o.get("autocast", String::new())?.as_str() {
                    "" => None,
                    "bf16" => Some(DType::BF16),
                    "f16" => Some(DType::F16),
                    other => {
                        return Err(PassError::BadOption {
                            pass: "graph.grad".into(),
                            message: format!("`autocast` is bf16 or f16, not `{other}`"),
                        });
                    }
                },
                scaled: o.get("scaled", false)?,
            },
        })
    }
}

/// The parameters differentiated by default: `f`'s weights, or every float
/// parameter when it declares none.
pub fn default_wrt(f: &Function) -> Vec<usize> {
    if !f.weights.is_empty() {
        return f.weights.iter().copied().collect();
    }
    float_params(f)
}

/// Adds `value_and_grad` of `entry` to `m` under `name`, inlining `entry`'s
/// calls first; `wrt` names parameters (empty: [`default_wrt`]). Returns
/// the positions differentiated.
pub fn add_grad_function(
    m: &mut Module,
    entry: &str,
    wrt: &[String],
    name: &str,
) -> Result<Vec<usize>, GradError> {
    add_grad_function_with(m, entry, wrt, name, &GradOptions::default())
}

/// [`add_grad_function`] as `options` say.
pub fn add_grad_function_with(
    m: &mut Module,
    entry: &str,
    wrt: &[String],
    name: &str,
    options: &GradOptions,
) -> Result<Vec<usize>, GradError> {
    if m.function(name).is_some() {
        return Err(fail(format!("the module already has a function @{name}")));
    }
    let Some(f) = m.function(entry) else {
        return Err(fail(format!("no function @{entry} in the module")));
    };
    let mut f = f.clone();
    // Calls of recompute functions stay calls: their gradient computes
    // them again.
    let keep = |c: &Function| c.recompute;
    crate::transforms::inline_into(&mut f, &m.functions, &keep).map_err(fail)?;
    let positions = if wrt.is_empty() {
        default_wrt(&f)
    } else {
        wrt.iter()
            .map(|w| {
                f.params.iter().position(|(n, _)| n == w).ok_or_else(|| {
                    let names: Vec<&str> = f.params.iter().map(|(n, _)| n.as_str()).collect();
                    fail(format!(
                        "@{entry} has no parameter `{w}`; its parameters: {}",
                        names.join(", ")
                    ))
                })
            })
            .collect::<Result<_, _>>()?
    };
    if positions.is_empty() {
        return Err(fail(format!(
            "@{entry} has no float parameter to differentiate"
        )));
    }
    let mut callees = m.functions.clone();
    let mut added = Vec::new();
    if let Some(narrow) = options.autocast {
        f = crate::transforms::autocast(&f, narrow, &f.name).map_err(fail)?;
        // A checkpointed call computes in the narrow type too: its callee,
        // calls inlined and autocast, under a name of its own.
        let calls: Vec<NodeIndex> = f.body.node_indices().collect();
        for n in calls {
            let Op::Call { callee } = &f.body[n].op else {
                continue;
            };
            let narrowed = format!("{callee}${narrow}");
            if !callees.iter().any(|g| g.name == narrowed) {
                let mut h = callees
                    .iter()
                    .find(|g| g.name == *callee)
                    .ok_or_else(|| fail(format!("call of unknown function @{callee}")))?
                    .clone();
                crate::transforms::inline_into(&mut h, &callees, &|_| false).map_err(fail)?;
                let mut h = crate::transforms::autocast(&h, narrow, &narrowed).map_err(fail)?;
                h.recompute = true;
                h.visibility = Visibility::Private;
                callees.push(h.clone());
                added.push(h);
            }
            f.body[n].op = Op::Call { callee: narrowed };
        }
    }
    let mut recompute = Recompute {
        callees,
        made: Vec::new(),
    };
    let g = derive(&f, &positions, name, options.scaled, &mut recompute)?;
    m.functions.push(g);
    m.functions.extend(added);
    for h in recompute.made {
        if m.function(&h.name).is_none() {
            m.functions.push(h);
        }
    }
    Ok(positions)
}

impl Pass<Module> for Grad {
    fn name(&self) -> &'static str {
        "graph.grad"
    }

    fn run(&mut self, m: &mut Module) -> Result<Vec<(&'static str, u64)>, PassError> {
        let name = if self.name.is_empty() {
            format!("{}_grad", self.entry)
        } else {
            self.name.clone()
        };
        add_grad_function_with(m, &self.entry, &self.wrt, &name, &self.options).map_err(|e| {
            PassError::Failed {
                pass: "graph.grad".into(),
                message: e.to_string(),
            }
        })?;
        let ops = m.function(&name).map_or(0, Function::num_ops);
        Ok(vec![("ops", ops as u64)])
    }
}
