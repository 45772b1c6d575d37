//! The cost model extraction minimizes: a roofline per op (arithmetic over
//! peak, bytes over bandwidth, plus a per-kernel overhead) in microseconds,
//! with constants measured from the project's own compiled kernels on this
//! machine (`dlc calibrate`, stored in `dialects/graph/cost-model.json`).
//!
//! It is fusion-aware the way the CPU back end fuses: element-wise ops
//! (including broadcasts, slices, transposes and batchnorm) run inside the
//! loop nest of their consumer or in the epilogue of a product, so they cost
//! their arithmetic and the reads of parameters and constants only, never a
//! kernel launch or a round trip of their result through memory. Reshapes
//! are views. Products, convolutions, reductions, softmax, layernorm,
//! pooling, concatenation and user-defined operators are kernels: each pays
//! the overhead and moves its operands and result through memory. Work that
//! depends only on constants is folded at compile time and costs nothing.
//!
//! # The two models
//!
//! - **Cost model** (`cost.rs`, constants in `dialects/graph/cost-model.json`), in two
//!   forms. The *per-op* model is what extraction minimizes: a roofline per op in
//!   microseconds, `kernel_us + max(flops / peak, bytes / bandwidth)` for kernels
//!   (reductions, softmax, layernorm, pooling, concatenation); a user operator is
//!   priced definition by definition as graph -> loop lowers it (`compute_cost`): a
//!   contraction as the product it becomes (`2 * elements * depth` flops at the
//!   product rate, plus a write and a read of each gathered operand's copy, and no
//!   kernel for a local its reader's epilogue computes), any other definition as scalar
//!   loops (one op per element and reduction step), each stored local a pass over its
//!   buffer (all were priced as one pass over their operands before); products
//!   and convolutions (with their im2col traffic) write their result after the
//!   reduction loop, so its bytes are added outside the `max`, and an f32 product of
//!   16K multiply-adds or more pays for its columns rounded up to the register tile it
//!   runs on: 32 columns (16 with AVX2), or whole vectors for a narrow product (at most `narrow_n` columns)
//!   (W8's 16- and 7-column products). A convolution that runs as Winograd's F(4x4, 3x3) is priced as its 36
//!   products plus a write and a read of the transformed input and products (the
//!   fused kernel keeps those in cache, but they stand for the transforms' gathers,
//!   scatters and arithmetic: priced at the products alone, saturation widened a
//!   24-channel convolution into a 48-channel one to reach the cheaper kernel); it
//!   takes no epilogue. For element-wise ops (broadcasts,
//!   slices, transposes and batchnorm included) only their arithmetic (`elementwise_ns`
//!   per element and op, `transcendental_ns` for exp/log/tanh/sigmoid/gelu, batchnorm
//!   six ops) plus reads of parameters and constants, as if fused. Reshapes are views;
//!   constant-only work up to 2^20 elements costs nothing, because the pass folds it
//!   while rebuilding. The *function-level* model decides whether an extracted
//!   function replaces the original, and is what `--stats` reports: it follows the
//!   lowering's own plan (an element-wise op with one element-wise user is inlined and
//!   costs its arithmetic; otherwise it is stored: a kernel and a pass over memory; a
//!   chain ending an epilogue of a product, reduction, softmax, layernorm or direct
//!   convolution costs only its arithmetic and its other reads; im2col and Winograd
//!   convolutions have no epilogue; transposes read only by products are views). The split exists
//!   because the per-op model alone is wrong where fusion differs from its assumption
//!   (docs/performance.md, "Measurements behind the design").
//!   `dlc calibrate` measures the constants with the project's own compiled kernels on
//!   one thread (a 512^3 product, `x + y` over 8 Mi elements, a Horner chain of 32
//!   multiplies and adds and a chain of 8 tanh/exp against one multiply on in-cache
//!   data, a 4x4 product) and writes the file; it is read at compile time
//!   (`include_str!`). How well it tracks measured time is in docs/performance.md, "Equality saturation".

use std::collections::HashMap;

use crate::fusion::Plan;
use std::sync::OnceLock;

use dlc_core::{TargetDesc, TensorType};
use petgraph::stable_graph::NodeIndex;

use super::lang::Info;
use crate::compute::{ComputeBody, ElemDef, OperandRead, ScalarExpr, Source};
use crate::module::Function;
use crate::ops::{ConstValue, Op, UnaryOp};

/// Constants of the roofline model.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// Sustained f32 matrix-product rate, GFLOP/s.
    pub gemm_gflops: f64,
    /// Streaming memory bandwidth, GB/s.
    pub bandwidth_gbs: f64,
    /// Time of one fused arithmetic element-wise op per element, ns.
    pub elementwise_ns: f64,
    /// Time of one fused transcendental op (`exp`, `log`, `tanh`, `sigmoid`,
    /// `gelu`) per element, ns.
    pub transcendental_ns: f64,
    /// Fixed cost of one kernel (loop nest, call, thread start), µs.
    pub kernel_us: f64,
    /// Where the constants came from.
    pub source: String,
}

/// Constant subexpressions up to this many elements are folded at compile
/// time by `graph.saturate` (and cost nothing); larger ones are computed at
/// run time.
pub const WEIGHT_FOLD_LIMIT: usize = 1 << 20;

static CALIBRATED: &str = include_str!("../../../cost-model.json");

impl CostModel {
    /// The model calibrated on the project's machine, from the repository.
    pub fn calibrated() -> &'static CostModel {
        static MODEL: OnceLock<CostModel> = OnceLock::new();
        MODEL.get_or_init(|| {
            CostModel::from_json(CALIBRATED)
                .unwrap_or_else(|e| panic!("dialects/graph/cost-model.json is malformed: {e}"))
        })
    }

    /// Reads the JSON form.
    pub fn from_json(text: &str) -> Result<CostModel, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let num = |k: &str| {
            v.get(k)
                .and_then(serde_json::Value::as_f64)
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| format!("`{k}` must be a positive number"))
        };
        Ok(CostModel {
            gemm_gflops: num("gemm_gflops")?,
            bandwidth_gbs: num("bandwidth_gbs")?,
            elementwise_ns: num("elementwise_ns")?,
            transcendental_ns: num("transcendental_ns")?,
            kernel_us: num("kernel_us")?,
            source: v
                .get("source")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("")
                .to_string(),
        })
    }

    /// The JSON form.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "gemm_gflops": self.gemm_gflops,
            "bandwidth_gbs": self.bandwidth_gbs,
            "elementwise_ns": self.elementwise_ns,
            "transcendental_ns": self.transcendental_ns,
            "kernel_us": self.kernel_us,
            "source": self.source,
        })
        .to_string()
    }

    fn flops_us(&self, flops: f64) -> f64 {
        flops / (self.gemm_gflops * 1e3)
    }

    fn bytes_us(&self, bytes: f64) -> f64 {
        bytes / (self.bandwidth_gbs * 1e3)
    }

    fn ew_us(&self, elements: f64) -> f64 {
        elements * self.elementwise_ns * 1e-3
    }

    /// Arithmetic time of element-wise `op` over `n` elements, µs.
    fn ew_op_us(&self, op: &Op, n: f64) -> f64 {
        match op {
            Op::Unary(
                UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Gelu
                | UnaryOp::Silu
                | UnaryOp::Erf
                | UnaryOp::Sin
                | UnaryOp::Cos,
            ) => n * self.transcendental_ns * 1e-3,
            // subtract, add, square root, divide, multiply, add
            Op::BatchNorm { .. } => self.ew_us(6.0 * n),
            // Lowered as the identity.
            Op::Barrier => 0.0,
            _ => self.ew_us(n),
        }
    }

    /// The cost in µs of `op` producing `out` from `inputs` (a constant
    /// or parameter costs nothing, and so does work on declared weights
    /// alone, which runs once per binding, not per call), compiled for
    /// `target`.
    pub fn op_cost(&self, op: &Op, out: &Info, inputs: &[Info], target: &TargetDesc) -> f64 {
        if out.leaf || out.bound || (out.weights && elements(&out.ty) <= WEIGHT_FOLD_LIMIT as f64) {
            return 0.0;
        }
        let out_bytes = bytes(&out.ty);
        let in_bytes: f64 = inputs.iter().map(|i| bytes(&i.ty)).sum();
        let leaf_bytes: f64 = inputs.iter().filter(|i| i.leaf).map(|i| bytes(&i.ty)).sum();
        let n_out = elements(&out.ty);
        let n_in: f64 = inputs.iter().map(|i| elements(&i.ty)).sum();
        // Products and convolutions write their result after the reduction
        // loop, not overlapped with it.
        let product = |flops: f64| {
            self.kernel_us
                + self.flops_us(flops).max(self.bytes_us(in_bytes))
                + self.bytes_us(out_bytes)
        };
        match op {
            Op::Param { .. } | Op::Constant(_) | Op::Reshape { .. } => 0.0,
            Op::MatMul => {
                let k = inputs
                    .first()
                    .and_then(|a| a.ty.shape.last())
                    .copied()
                    .unwrap_or(1) as f64;
                // A product the target packs (TargetDesc::packs_product)
                // runs on its register tile, `nr` columns wide: narrower
                // products pay for `nr`.
                let matrix = inputs.get(1).is_some_and(|b| b.ty.rank() >= 2);
                let n = if matrix {
                    out.ty.shape.last().copied().unwrap_or(1).max(1) as f64
                } else {
                    1.0
                };
                let tiled = matrix && target.packs_product(out.ty.dtype, (n_out * k) as usize);
                let nr = target
                    .gemm_blocking(out.ty.dtype)
                    .register_tile(n as usize)
                    .1 as f64;
                let n_paid = if tiled { (n / nr).ceil() * nr } else { n };
                product(2.0 * n_out / n * n_paid * k)
            }
            Op::Conv2d {
                stride,
                groups,
                dilation,
                ..
            } if inputs.get(1).is_some_and(|w| {
                crate::ops::conv_is_winograd(*stride, *dilation, *groups, &out.ty, &w.ty, target)
            }) =>
            {
                // Winograd's F(4x4, 3x3): 36 products of `tiles x O`, `C`
                // deep, and the transforms: 36 values per tile and channel
                // in and out, gathered and scattered, priced as a write and
                // a read of each (the fused kernel keeps them in cache, but
                // cheaper prices make saturation widen convolutions to reach
                // this kernel).
                let tiles = crate::ops::winograd_tiles(&out.ty) as f64;
                let (o, c) = (out.ty.shape[1] as f64, inputs[1].ty.shape[1] as f64);
                let transformed = 36.0 * tiles * (c + o) * 4.0;
                3.0 * self.kernel_us
                    + self.flops_us(2.0 * 36.0 * tiles * o * c)
                    + self.bytes_us(in_bytes + 2.0 * transformed + out_bytes)
            }
            Op::Conv2d { groups, .. } => {
                // Each output element is a dot product over C/groups * KH * KW;
                // the CPU back end stages an im2col buffer of that many
                // elements per output pixel.
                let w = inputs.get(1).map(|w| &w.ty.shape);
                let per_out = w.map_or(1.0, |w| w.iter().skip(1).product::<usize>() as f64);
                let o = w.and_then(|w| w.first()).copied().unwrap_or(1).max(1) as f64;
                let im2col = n_out / o * per_out * (*groups as f64) * 4.0;
                self.kernel_us
                    + self
                        .flops_us(2.0 * n_out * per_out)
                        .max(self.bytes_us(in_bytes + 2.0 * im2col))
                    + self.bytes_us(out_bytes)
            }
            Op::Softmax { .. } | Op::LayerNorm { .. } => {
                self.kernel_us
                    + self.bytes_us(in_bytes + out_bytes)
                    + self.ew_us(4.0 * n_in)
                    + n_in * self.transcendental_ns * 1e-3
            }
            Op::Compute(body) => self.compute_cost(body, in_bytes + out_bytes, inputs),
            Op::Reduce { .. } | Op::Pool2d { .. } | Op::Concat { .. } => {
                self.kernel_us + self.bytes_us(in_bytes + out_bytes) + self.ew_us(n_in)
            }
            // Reads the rows it gives (and its indices), not the table.
            Op::Gather { .. } => {
                let indices = inputs.get(1).map_or(0.0, |i| bytes(&i.ty));
                self.kernel_us + self.bytes_us(2.0 * out_bytes + indices)
            }
            // A copy of `x`, then each update read and its row read and
            // written again.
            Op::ScatterAdd { .. } => {
                let updates = inputs.get(2).map_or(0.0, |u| bytes(&u.ty));
                2.0 * self.kernel_us + self.bytes_us(in_bytes + out_bytes + 2.0 * updates)
            }
            Op::Call { .. } => f64::INFINITY,
            // The element-wise ops (`Op::is_elementwise`).
            op => {
                debug_assert!(op.is_elementwise(), "{}", op.name());
                self.ew_op_us(op, n_out) + self.bytes_us(leaf_bytes)
            }
        }
    }
}

impl CostModel {
    /// A user operator as graph -> loop lowers it: each definition (locals,
    /// then the result) is a loop nest, except a contraction local that its
    /// one element-wise reader computes in its epilogue. A contraction
    /// (`ElemDef::contraction`) is the structured product: priced as one,
    /// `2 * elements * depth` flops at the product rate (or the bytes it
    /// reads, when that takes longer), plus a write and a read of each
    /// gathered operand's copy; any other definition runs as scalar loops,
    /// one fused op per element and step of its reductions. `io_bytes`: the
    /// operator's operands and result; each stored local adds a write and a
    /// read of its buffer.
    fn compute_cost(&self, body: &ComputeBody, io_bytes: f64, inputs: &[Info]) -> f64 {
        let type_of = |s: Source| match s {
            Source::Input(i) => inputs.get(i as usize).map(|x| &x.ty),
            Source::Local(i) => body.locals.get(i as usize).map(|d| &d.ty),
        };
        let defs: Vec<&ElemDef> = body.locals.iter().chain([&body.out]).collect();
        let mut total = self.bytes_us(io_bytes);
        for (k, def) in defs.iter().enumerate() {
            let is_local = k < body.locals.len();
            let form = def.contraction(&type_of, false);
            let fused = is_local && form.is_some() && body.sole_elementwise_reader(k).is_some();
            if is_local && !fused {
                total += self.bytes_us(2.0 * bytes(&def.ty));
            }
            if !fused {
                total += self.kernel_us;
            }
            let n = elements(&def.ty);
            // Steps of every reduction in the definition, per element.
            let mut steps = 0.0;
            def.expr.visit(&mut |x| {
                if let ScalarExpr::Reduce { vars, .. } = x {
                    steps += vars
                        .iter()
                        .map(|v| (v.hi - v.lo).max(0) as f64)
                        .product::<f64>();
                }
            });
            total += match form {
                Some(c) => {
                    let depth: f64 = c.k.iter().map(|v| (v.hi - v.lo).max(0) as f64).product();
                    let extent =
                        |at: usize| def.ty.shape.get(at).copied().unwrap_or(1).max(1) as f64;
                    let columns: f64 = (c.n..c.n + c.columns).map(extent).product();
                    let size = def.ty.dtype.size_bytes() as f64;
                    let gathered: f64 = [
                        (c.reads[0], n / columns * depth),
                        (c.reads[1], n / extent(c.m) * depth),
                    ]
                    .iter()
                    .filter(|(r, _)| *r == OperandRead::Gathered)
                    .map(|(_, e)| 2.0 * e * size)
                    .sum();
                    // The epilogue: one fused op per element.
                    self.flops_us(2.0 * n * depth).max(self.bytes_us(io_bytes))
                        + self.bytes_us(gathered)
                        + self.ew_us(n)
                }
                None => self.ew_us(n * steps.max(1.0)),
            };
        }
        total
    }

    /// The cost in µs of a whole function as the CPU back end compiles it:
    /// the lowering's own fusion plan is followed, so an element-wise op
    /// costs a pass over memory exactly when it is stored (several users, or
    /// a user that is not element-wise), nothing beyond its arithmetic when
    /// it is inlined into its user, and nothing beyond its arithmetic and
    /// the reads of its other operands when it ends the epilogue of a
    /// product (convolutions computed through im2col have no epilogue, as in
    /// the back end). Extraction minimizes the local per-op model; this one
    /// decides whether the result replaces the function and is what
    /// `--stats` reports.
    pub fn function_cost(&self, f: &Function, target: &TargetDesc) -> f64 {
        // What the lowering will do with each node: one analysis for both.
        self.planned_cost(f, &crate::fusion::plan(f, target), target)
    }

    /// [`CostModel::function_cost`] of `f` under its fusion plan `plan`
    /// (`fusion::plan(f, target)`), for a caller that reads the plan too.
    pub fn planned_cost(
        &self,
        f: &Function,
        plan: &HashMap<NodeIndex, Plan>,
        target: &TargetDesc,
    ) -> f64 {
        let bound = crate::fusion::bound_nodes(f);
        let order = f.topo_order();
        // The arithmetic of an element-wise tree and the bytes of what it
        // reads from memory (operands that are not inlined into it).
        fn tree(
            m: &CostModel,
            f: &Function,
            plan: &HashMap<NodeIndex, Plan>,
            n: NodeIndex,
            skip: Option<NodeIndex>,
        ) -> (f64, f64) {
            let node = &f.body[n];
            let mut compute = m.ew_op_us(&node.op, elements(&node.results[0]));
            let mut read = 0.0;
            for v in f.operands(n) {
                if Some(v.node) == skip {
                    continue;
                }
                match plan[&v.node] {
                    Plan::Inline => {
                        let (c, r) = tree(m, f, plan, v.node, skip);
                        compute += c;
                        read += r;
                    }
                    _ if matches!(f.body[v.node].op, Op::Constant(ConstValue::Splat(_))) => {}
                    _ => read += bytes(f.value_type(v)),
                }
            }
            (compute, read)
        }
        let mut total = 0.0;
        for &n in &order {
            let node = &f.body[n];
            let out = &node.results[0];
            total += match plan[&n] {
                // Views and parameters cost nothing; nor do constants, which
                // are folded or filled once.
                Plan::Param | Plan::View | Plan::Inline => 0.0,
                // Computed by the preparer, once per binding of the weights.
                _ if bound.contains(&n) => 0.0,
                _ if matches!(node.op, Op::Constant(_)) => 0.0,
                Plan::Stored if node.op.is_elementwise() => {
                    let (compute, read) = tree(self, f, plan, n, None);
                    self.kernel_us + compute.max(self.bytes_us(read + bytes(out)))
                }
                Plan::EpilogueOf(_) => {
                    // The anchor's result arrives in registers.
                    let (compute, read) = tree(self, f, plan, n, None);
                    let anchor_bytes = bytes(out);
                    compute.max(self.bytes_us((read - anchor_bytes).max(0.0)))
                }
                Plan::Stored | Plan::WithEpilogue(_) => {
                    let inputs: Vec<Info> = f
                        .operands(n)
                        .iter()
                        .map(|v| Info {
                            ty: f.value_type(*v).clone(),
                            weights: false,
                            leaf: false,
                            bound: false,
                        })
                        .collect();
                    let own = Info {
                        ty: out.clone(),
                        weights: false,
                        leaf: false,
                        bound: false,
                    };
                    self.op_cost(&node.op, &own, &inputs, target)
                }
            };
        }
        total - self.fused_groups_saving(f, plan, target)
    }

    /// What the plan's kernel groups save over their kernels priced one by
    /// one: an attention group whose products the CPU packs, and whose
    /// scores and softmax nothing else reads, runs as one kernel over
    /// blocks of rows (`convert-loop-to-tile`'s fused schedule), the scores
    /// and their softmax held in each program's scratch: two kernel
    /// launches, the scores' write, and the softmax's read and write are
    /// not paid. (The second product's read of the softmax is left in its
    /// price, where it is under the maximum with its arithmetic.)
    fn fused_groups_saving(
        &self,
        f: &Function,
        plan: &HashMap<NodeIndex, Plan>,
        target: &TargetDesc,
    ) -> f64 {
        if target.cpu().is_none() {
            return 0.0;
        }
        let alone = |n: NodeIndex| f.users(n).len() == 1 && !f.results.iter().any(|r| r.node == n);
        let packed = |n: NodeIndex| {
            let out = &f.body[n].results[0];
            let k = f
                .operands(n)
                .first()
                .and_then(|a| f.value_type(*a).shape.last().copied())
                .unwrap_or(1);
            target.packs_product(out.dtype, (elements(out) as usize).saturating_mul(k))
        };
        crate::fusion::kernel_groups(f, plan)
            .into_iter()
            .map(|g| {
                let crate::fusion::KernelGroup::Attention {
                    scores,
                    read,
                    softmax,
                    output,
                } = g;
                if !(alone(read) && alone(softmax) && packed(scores) && packed(output)) {
                    return 0.0;
                }
                let (s, p) = (
                    bytes(&f.body[read].results[0]),
                    bytes(&f.body[softmax].results[0]),
                );
                2.0 * self.kernel_us + self.bytes_us(2.0 * s + p)
            })
            .sum()
    }
}

fn elements(t: &TensorType) -> f64 {
    t.num_elements().map_or(f64::INFINITY, |n| n as f64)
}

fn bytes(t: &TensorType) -> f64 {
    elements(t) * t.dtype.size_bytes() as f64
}
