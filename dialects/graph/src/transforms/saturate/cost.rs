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

use std::sync::OnceLock;

use dlc_core::TensorType;

use super::lang::Info;
use crate::ops::Op;

/// Constants of the roofline model.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// Sustained f32 matrix-product rate, GFLOP/s.
    pub gemm_gflops: f64,
    /// Streaming memory bandwidth, GB/s.
    pub bandwidth_gbs: f64,
    /// Time of one fused element-wise op per element, ns.
    pub elementwise_ns: f64,
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

    /// The cost in µs of `op` producing `out` from `inputs` (a constant
    /// or parameter costs nothing).
    pub fn op_cost(&self, op: &Op, out: &Info, inputs: &[Info]) -> f64 {
        if out.leaf || (out.weights && elements(&out.ty) <= WEIGHT_FOLD_LIMIT as f64) {
            return 0.0;
        }
        let out_bytes = bytes(&out.ty);
        let in_bytes: f64 = inputs.iter().map(|i| bytes(&i.ty)).sum();
        let leaf_bytes: f64 = inputs.iter().filter(|i| i.leaf).map(|i| bytes(&i.ty)).sum();
        let n_out = elements(&out.ty);
        let n_in: f64 = inputs.iter().map(|i| elements(&i.ty)).sum();
        let kernel = |flops: f64, bytes: f64| {
            self.kernel_us + self.flops_us(flops).max(self.bytes_us(bytes))
        };
        match op {
            Op::Param { .. } | Op::Constant(_) | Op::Reshape { .. } => 0.0,
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Cast { .. }
            | Op::Broadcast { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. } => self.ew_us(n_out) + self.bytes_us(leaf_bytes),
            // subtract, add, square root, divide, multiply, add
            Op::BatchNorm { .. } => self.ew_us(6.0 * n_out) + self.bytes_us(leaf_bytes),
            Op::MatMul => {
                let k = inputs
                    .first()
                    .and_then(|a| a.ty.shape.last())
                    .copied()
                    .unwrap_or(1) as f64;
                kernel(2.0 * n_out * k, in_bytes + out_bytes)
            }
            Op::Conv2d { groups, .. } => {
                // Each output element is a dot product over C/groups * KH * KW;
                // the CPU back end stages an im2col buffer of that many
                // elements per output pixel.
                let w = inputs.get(1).map(|w| &w.ty.shape);
                let per_out = w.map_or(1.0, |w| w.iter().skip(1).product::<usize>() as f64);
                let o = w.and_then(|w| w.first()).copied().unwrap_or(1).max(1) as f64;
                let im2col = n_out / o * per_out * (*groups as f64) * 4.0;
                kernel(2.0 * n_out * per_out, in_bytes + out_bytes + 2.0 * im2col)
            }
            Op::Softmax { .. } | Op::LayerNorm { .. } => {
                self.kernel_us + self.bytes_us(in_bytes + out_bytes) + self.ew_us(5.0 * n_in)
            }
            Op::Reduce { .. } | Op::Pool2d { .. } | Op::Concat { .. } | Op::Compute(_) => {
                self.kernel_us + self.bytes_us(in_bytes + out_bytes) + self.ew_us(n_in)
            }
            Op::Call { .. } => f64::INFINITY,
        }
    }
}

fn elements(t: &TensorType) -> f64 {
    t.num_elements().map_or(f64::INFINITY, |n| n as f64)
}

fn bytes(t: &TensorType) -> f64 {
    elements(t) * t.dtype.size_bytes() as f64
}
