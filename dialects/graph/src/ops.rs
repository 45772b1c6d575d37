//! The graph dialect's operations. Each op is declared once here: its name,
//! its attributes (as generic [`Attr`] values), and how it is rebuilt from
//! them; the text printer, the text parser and the MLIR printer all derive
//! from [`Op::name`], [`Op::attrs`] and [`Op::from_parts`].

use dlc_core::attr::{Attr, AttrReader};
pub use dlc_core::scalar::{BinaryOp, CmpOp, ReduceKind, UnaryOp};
use dlc_core::{DType, TensorType};

use crate::compute::ComputeBody;

/// Kind of 2-D pooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// maximum over the window (padding never wins)
    Max,
    /// mean over the window, padding counted (PyTorch's default)
    Avg,
}

/// The value of a constant op: one value repeated, or every element.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstValue {
    /// Every element is this value.
    Splat(f64),
    /// Each element, row-major; shared, so that copies of a function
    /// (passes, saturation, lowering) do not copy a model's weights.
    Dense(std::sync::Arc<[f64]>),
}

/// A graph operation. Operands are the node's incoming edges; what an op
/// needs beyond its operands' types to determine its result types is here.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// The function's `index`-th parameter.
    Param {
        /// Position in the signature.
        index: u32,
    },
    /// A constant tensor of the node's result type.
    Constant(ConstValue),
    /// Element-wise unary function.
    Unary(UnaryOp),
    /// Element-wise binary function with NumPy broadcasting.
    Binary(BinaryOp),
    /// Element-wise comparison with broadcasting, giving `bool`.
    Compare(CmpOp),
    /// `where(cond, a, b)` with broadcasting.
    Select,
    /// Element type conversion.
    Cast {
        /// Target type.
        to: DType,
    },
    /// `numpy.matmul`.
    MatMul,
    /// Reduction over `axes` (sorted, distinct).
    Reduce {
        /// How elements combine.
        kind: ReduceKind,
        /// Reduced axes.
        axes: Vec<usize>,
        /// Whether reduced axes stay with extent 1.
        keepdims: bool,
    },
    /// Softmax along one axis.
    Softmax {
        /// The normalized axis.
        axis: usize,
    },
    /// `(x - mean) / sqrt(var + eps)` over `axes`, without scale and shift.
    LayerNorm {
        /// Normalized axes (sorted, distinct).
        axes: Vec<usize>,
        /// Added to the variance.
        eps: f64,
    },
    /// Same elements, new shape.
    Reshape {
        /// New shape.
        shape: Vec<usize>,
    },
    /// Axis permutation: result axis `i` is operand axis `perm[i]`.
    Transpose {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Joins operands along an axis.
    Concat {
        /// The joined axis.
        axis: usize,
    },
    /// `x[.., start..end, ..]` along one axis.
    Slice {
        /// The sliced axis.
        axis: usize,
        /// First index kept.
        start: usize,
        /// One past the last index kept.
        end: usize,
    },
    /// `gather(x, indices)` along `axis`: result `[x axes before, indices
    /// axes, x axes after]`, each element `x[.., i, ..]` for its index `i`
    /// (an integer tensor read at run time; a negative one counts from the
    /// end, and one outside `-n..n` reads zero). It reads the elements it
    /// gives and no others: an embedding lookup costs the rows it reads.
    Gather {
        /// The indexed axis of `x`.
        axis: usize,
    },
    /// `scatter_add(x, indices, updates)` along `axis`: `x` with each
    /// element of `updates` (shaped as `gather(x, indices)` would be) added
    /// at the position its index names (`numpy.add.at`; repeated indices
    /// all add, a negative index counts from the end and one outside
    /// `-n..n` adds nothing). The adjoint of `gather`: an embedding's
    /// gradient costs the rows it writes.
    ScatterAdd {
        /// The indexed axis of `x`.
        axis: usize,
    },
    /// `numpy.broadcast_to`.
    Broadcast {
        /// Target shape.
        shape: Vec<usize>,
    },
    /// 2-D convolution, NCHW input and OIHW weights.
    Conv2d {
        /// Stride along H and W.
        stride: [usize; 2],
        /// Zero padding along H and W.
        padding: [usize; 2],
        /// Channel groups.
        groups: usize,
        /// Input steps between consecutive kernel taps along H and W (`[1,
        /// 1]`: a dense window; DeepLab's and LR-ASPP's atrous
        /// convolutions take 2 and more).
        dilation: [usize; 2],
    },
    /// 2-D pooling over NCHW.
    Pool2d {
        /// Max or average.
        kind: PoolKind,
        /// Window extent along H and W.
        kernel: [usize; 2],
        /// Stride along H and W.
        stride: [usize; 2],
        /// Padding along H and W.
        padding: [usize; 2],
    },
    /// Inference batch normalization along axis 1:
    /// `(x - mean) / sqrt(var + eps) * gamma + beta`.
    BatchNorm {
        /// Added to the variance.
        eps: f64,
    },
    /// A user-defined operator in index notation.
    Compute(Box<ComputeBody>),
    /// `barrier(x, after)`: the value of `x`, not computed before the
    /// scalar `after` is. Nothing folds or merges through it, so work that
    /// reads it is done again after `after` (a gradient's recomputation
    /// of a checkpointed call), not shared with the same work before.
    Barrier,
    /// A call of another function of the module.
    Call {
        /// The callee's name.
        callee: String,
    },
}

fn ints(v: &[usize]) -> Attr {
    Attr::Ints(v.iter().map(|&x| x as i64).collect())
}

fn pair(v: [usize; 2]) -> Attr {
    ints(&v)
}

impl Op {
    /// The op's full name (`graph.matmul`).
    pub fn name(&self) -> String {
        let suffix: &str = match self {
            Op::Param { .. } => "param",
            Op::Constant(_) => "constant",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Compare(c) => c.name(),
            Op::Select => "select",
            Op::Barrier => "barrier",
            Op::Cast { .. } => "cast",
            Op::MatMul => "matmul",
            Op::Reduce { kind, .. } => kind.name(),
            Op::Softmax { .. } => "softmax",
            Op::LayerNorm { .. } => "layernorm",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Concat { .. } => "concat",
            Op::Slice { .. } => "slice",
            Op::Gather { .. } => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Broadcast { .. } => "broadcast",
            Op::Conv2d { .. } => "conv2d",
            Op::Pool2d {
                kind: PoolKind::Max,
                ..
            } => "maxpool2d",
            Op::Pool2d {
                kind: PoolKind::Avg,
                ..
            } => "avgpool2d",
            Op::BatchNorm { .. } => "batchnorm",
            Op::Compute(_) => "compute",
            Op::Call { .. } => "call",
        };
        format!("graph.{suffix}")
    }

    /// The attributes the text forms print, in print order. The compute body
    /// and the callee have text forms of their own and are not listed.
    pub fn attrs(&self) -> Vec<(&'static str, Attr)> {
        match self {
            Op::Param { index } => vec![("index", Attr::Int(i64::from(*index)))],
            Op::Constant(ConstValue::Splat(v)) => vec![("value", Attr::Float(*v))],
            Op::Constant(ConstValue::Dense(vs)) => {
                vec![("value", Attr::Floats(vs.iter().copied().collect()))]
            }
            Op::Cast { to } => vec![("to", Attr::Type(*to))],
            Op::Reduce { axes, keepdims, .. } => {
                vec![("axes", ints(axes)), ("keepdims", Attr::Bool(*keepdims))]
            }
            Op::Softmax { axis } => vec![("axis", Attr::Int(*axis as i64))],
            Op::LayerNorm { axes, eps } => vec![("axes", ints(axes)), ("eps", Attr::Float(*eps))],
            Op::Reshape { shape } | Op::Broadcast { shape } => vec![("shape", ints(shape))],
            Op::Transpose { perm } => vec![("perm", ints(perm))],
            Op::Concat { axis } | Op::Gather { axis } | Op::ScatterAdd { axis } => {
                vec![("axis", Attr::Int(*axis as i64))]
            }
            Op::Slice { axis, start, end } => vec![
                ("axis", Attr::Int(*axis as i64)),
                ("start", Attr::Int(*start as i64)),
                ("end", Attr::Int(*end as i64)),
            ],
            Op::Conv2d {
                stride,
                padding,
                groups,
                dilation,
            } => {
                let mut attrs = vec![
                    ("stride", pair(*stride)),
                    ("padding", pair(*padding)),
                    ("groups", Attr::Int(*groups as i64)),
                ];
                // Printed only where it is not the dense window's.
                if *dilation != [1, 1] {
                    attrs.push(("dilation", pair(*dilation)));
                }
                attrs
            }
            Op::Pool2d {
                kernel,
                stride,
                padding,
                ..
            } => vec![
                ("kernel", pair(*kernel)),
                ("stride", pair(*stride)),
                ("padding", pair(*padding)),
            ],
            Op::BatchNorm { eps } => vec![("eps", Attr::Float(*eps))],
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Barrier
            | Op::MatMul
            | Op::Compute(_)
            | Op::Call { .. } => vec![],
        }
    }

    /// Rebuilds an op from its name and attributes (not `param`, `compute`
    /// or `call`, which the parser builds from their own syntax).
    pub fn from_parts(name: &str, attrs: &[(String, Attr)]) -> Result<Op, String> {
        let suffix = name
            .strip_prefix("graph.")
            .ok_or_else(|| format!("`{name}` is not a graph dialect op"))?;
        let mut a = AttrReader::new(name, attrs);
        let op = if let Some(u) = UnaryOp::from_name(suffix) {
            Op::Unary(u)
        } else if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == suffix) {
            Op::Binary(b)
        } else if let Some(c) = CmpOp::ALL.into_iter().find(|c| c.name() == suffix) {
            Op::Compare(c)
        } else if let Some(kind) = ReduceKind::from_name(suffix) {
            Op::Reduce {
                kind,
                axes: a.usizes("axes")?,
                keepdims: a.bool("keepdims")?,
            }
        } else {
            match suffix {
                "constant" => Op::Constant(match a.get("value")? {
                    Attr::Float(v) => ConstValue::Splat(*v),
                    Attr::Int(i) => ConstValue::Splat(*i as f64),
                    Attr::Ints(_) | Attr::Floats(_) => ConstValue::Dense(a.floats("value")?),
                    _ => return Err(format!("`{name}`: `value` must be a number or a list")),
                }),
                "select" => Op::Select,
                "barrier" => Op::Barrier,
                "cast" => Op::Cast { to: a.dtype("to")? },
                "matmul" => Op::MatMul,
                "softmax" => Op::Softmax {
                    axis: a.usize("axis")?,
                },
                "layernorm" => Op::LayerNorm {
                    axes: a.usizes("axes")?,
                    eps: a.float("eps")?,
                },
                "reshape" => Op::Reshape {
                    shape: a.usizes("shape")?,
                },
                "broadcast" => Op::Broadcast {
                    shape: a.usizes("shape")?,
                },
                "transpose" => Op::Transpose {
                    perm: a.usizes("perm")?,
                },
                "concat" => Op::Concat {
                    axis: a.usize("axis")?,
                },
                "gather" => Op::Gather {
                    axis: a.usize("axis")?,
                },
                "scatter_add" => Op::ScatterAdd {
                    axis: a.usize("axis")?,
                },
                "slice" => Op::Slice {
                    axis: a.usize("axis")?,
                    start: a.usize("start")?,
                    end: a.usize("end")?,
                },
                "conv2d" => Op::Conv2d {
                    stride: a.sizes::<2>("stride")?,
                    padding: a.sizes::<2>("padding")?,
                    groups: a.usize("groups")?,
                    dilation: if a.has("dilation") {
                        a.sizes::<2>("dilation")?
                    } else {
                        [1, 1]
                    },
                },
                "maxpool2d" | "avgpool2d" => Op::Pool2d {
                    kind: if suffix == "maxpool2d" {
                        PoolKind::Max
                    } else {
                        PoolKind::Avg
                    },
                    kernel: a.sizes::<2>("kernel")?,
                    stride: a.sizes::<2>("stride")?,
                    padding: a.sizes::<2>("padding")?,
                },
                "batchnorm" => Op::BatchNorm {
                    eps: a.float("eps")?,
                },
                _ => return Err(format!("unknown op `{name}`")),
            }
        };
        a.finish()?;
        Ok(op)
    }
}

impl Op {
    /// Whether the op computes each result element from operand elements
    /// alone (so the CPU back end inlines it into an element-wise user or a
    /// product's epilogue): arithmetic, comparisons, selects, casts, splat
    /// constants, broadcasts, transposes, slices, batchnorm and barriers.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_)
                | Op::Binary(_)
                | Op::Compare(_)
                | Op::Select
                | Op::Cast { .. }
                | Op::Constant(ConstValue::Splat(_))
                | Op::Broadcast { .. }
                | Op::Transpose { .. }
                | Op::Slice { .. }
                | Op::BatchNorm { .. }
                | Op::Barrier
        )
    }

    /// Element-wise ops that read each operand at their own index: an
    /// epilogue chain may only hold these (a transpose, broadcast or slice of
    /// the same shape still moves elements).
    pub fn is_pointwise(&self) -> bool {
        self.is_elementwise()
            && !matches!(
                self,
                Op::Broadcast { .. } | Op::Transpose { .. } | Op::Slice { .. }
            )
    }
}

/// The output tile of the Winograd convolution `F(4x4, 3x3)`: each 6 x 6
/// patch of the input gives a 4 x 4 block of the output.
pub const WINOGRAD_TILE: usize = 4;

/// The CPU back end's rule for computing a convolution as Winograd's
/// `F(4x4, 3x3)` (see `compiler/lower`'s `winograd` module): f32, one
/// group, 3 x 3 kernels at stride 1, at least 16 input and 16 output
/// channels (each of the 36 products is `tiles x O`, `C` deep), products
/// `target` packs, and tiles that fit the image ([`winograd_fits`]). It
/// takes a quarter of the direct product's multiply-adds (36 per input
/// channel for 16 outputs, against 9 for each), plus the transforms.
pub fn conv_is_winograd(
    stride: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    out: &TensorType,
    w: &TensorType,
    target: &dlc_core::TargetDesc,
) -> bool {
    if out.rank() != 4 || w.rank() != 4 {
        return false;
    }
    let (o, c) = (w.shape[0], w.shape[1]);
    groups == 1
        && stride == [1, 1]
        && dilation == [1, 1]
        && w.shape[2..] == [3, 3]
        && out.dtype == DType::F32
        && winograd_fits([out.shape[2], out.shape[3]])
        && winograd_pays([out.shape[2], out.shape[3]], target)
        && c >= 16
        && o >= 16
        && target.packs_product(DType::F32, winograd_tiles(out) * o * c)
}

/// Whether an image of `extents` output rows and columns is worth 4 x 4
/// tiles: at least two along each axis, and tiles at least half filled
/// (tiles past the edge are computed whole, on zeros, and cropped). Each
/// of the 36 products reads all of the transformed kernel, four times the
/// kernel's size, for as many rows as there are tiles, so few tiles do not
/// pay for it. Measured on Zen 4 (one thread, `dlc bench`, against the
/// im2col product): 14 x 14 over 256 channels 2.58 -> 0.84 ms, 7 x 7 over
/// 256 0.71 -> 0.39 and over 512 3.0 -> 2.6, 6 x 6 over 256 0.74 -> 0.41;
/// but 5 x 5 (a 39% fill) 0.36 -> 0.39, one tile (3 x 3 over 512) 0.67 ->
/// 1.35, four images of one tile each 0.68 -> 0.73.
pub fn winograd_fits(extents: [usize; 2]) -> bool {
    let t = WINOGRAD_TILE;
    let tiles = winograd_tile_grid(extents);
    tiles.iter().all(|&n| n >= 2) && 2 * extents[0] * extents[1] >= tiles[0] * tiles[1] * t * t
}

/// The 4 x 4 tiles along each axis of an image of `extents` outputs, the
/// last ones overhanging it where an extent is not a multiple of 4.
fn winograd_tile_grid(extents: [usize; 2]) -> [usize; 2] {
    extents.map(|e| e.div_ceil(WINOGRAD_TILE))
}

/// Whether on `target` the multiply-adds Winograd saves on an image of
/// `extents` outputs pay for the bytes of its transformed kernel, 36
/// values for each pair of channels where the kernel has 9, which in a
/// model come from memory on every call (each layer's weights are read
/// once and evicted by the next layers'). Per pair of channels, `P`
/// outputs in `T` tiles save `9 P - 36 T` multiply-adds, done at about
/// half the core's peak (`CpuDesc::macs_per_cycle`), for `27 x 4` more
/// bytes at `CpuDesc::memory_bytes_per_cycle`. On a 2.6 GHz Xeon
/// (Emerald Rapids: 32 multiply-adds and 4 bytes of memory a cycle, so
/// 432 must be saved; one thread, a chain of three or six convolutions,
/// alternated): 7 x 7 over 512 channels (297 saved) took 4.9 ms a
/// convolution as Winograd and 2.9 as an im2col product; 14 x 14 over 256
/// (1188) 2.2 against 3.2. On Zen 2 to 4 (16 and 5) 173 must be saved: 7
/// x 7 and 6 x 6 images stay Winograd's, as measured there (see
/// [`winograd_fits`]); on Zen 5 (32 and 5) 346, and a chain of three 7 x 7
/// x 512 convolutions took 4.5 ms either way at one thread, 3.4-3.6 as
/// Winograd's against 2.2-2.3 as im2col products at two (two cores share
/// the memory the transformed kernels come from). A GPU target is not
/// limited here.
pub fn winograd_pays(extents: [usize; 2], target: &dlc_core::TargetDesc) -> bool {
    let Some(cpu) = target.cpu() else {
        return true;
    };
    let outputs = extents[0] * extents[1];
    let [rows, cols] = winograd_tile_grid(extents);
    let tiles = rows * cols;
    let saved = (9 * outputs).saturating_sub(36 * tiles);
    2 * saved * cpu.memory_bytes_per_cycle >= 27 * 4 * cpu.macs_per_cycle()
}

/// The 4 x 4 output tiles of an NCHW result `out`, the last ones along each
/// axis overhanging it where its extent is not a multiple of 4: the rows
/// of each of a Winograd convolution's 36 products.
pub fn winograd_tiles(out: &TensorType) -> usize {
    let [rows, cols] = winograd_tile_grid([out.shape[2], out.shape[3]]);
    out.shape[0] * rows * cols
}

/// The CPU back end's rule for a convolution with result type `out` and
/// weights `w`: one group, or groups of more than one input channel (a
/// product per group: ResNeXt's 32 groups of 4 to 32 channels, RegNet's of
/// 8 or more; a depthwise convolution's one channel a group keeps its
/// direct loops), and a product per image that `target` runs on its packed
/// kernel (`TargetDesc::packs_product`) make it a product over an im2col
/// buffer (which has no epilogue), unless it is a pixel convolution
/// ([`conv_is_pixel`]).
pub fn conv_is_im2col_product(
    groups: usize,
    out: &TensorType,
    w: &TensorType,
    target: &dlc_core::TargetDesc,
) -> bool {
    let macs = out
        .shape
        .iter()
        .skip(1)
        .chain(w.shape.iter().skip(1))
        .product::<usize>();
    let grouped = groups == 1 || w.shape.get(1).is_some_and(|&c| c > 1);
    grouped && !conv_is_pixel(out, w) && target.packs_product(out.dtype, macs)
}

/// Whether a convolution with result type `out` and weights `w` computes
/// one pixel per image through a 1 x 1 window (a squeeze-excite block's
/// fully connected layers on `[N, C, 1, 1]`): each output channel is then
/// a dot product of its weights with the input's channels, which lowering
/// runs as a row by a matrix is, along the depth, rather than as a product
/// with one useful column in every register tile.
pub fn conv_is_pixel(out: &TensorType, w: &TensorType) -> bool {
    out.shape.get(2..) == Some(&[1, 1][..]) && w.shape.get(2..) == Some(&[1, 1][..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlc_core::TargetDesc;

    /// Winograd's transformed kernel, four times the kernel's bytes, is
    /// read from memory on every call in a model: on Intel's server cores
    /// (the AVX-512 description: 32 multiply-adds and 4 bytes of memory a
    /// cycle) the 4 x 4 tiles of a 7 x 7 or 6 x 6 image do not save enough
    /// multiply-adds to pay for it and the convolution is an im2col
    /// product; on Zen cores (16 and 8) and a GPU they stay Winograd's.
    #[test]
    fn winograd_pays_where_the_work_it_saves_outlasts_its_kernels_bytes() {
        let avx512 = TargetDesc::x86_64_avx512(2);
        let avx2 = TargetDesc::x86_64_avx2(2);
        let zen4 = TargetDesc::for_cpu("znver4").expect("a known CPU");
        let zen5 = TargetDesc::for_cpu("znver5").expect("a known CPU");
        let sm90 = TargetDesc::sm_90();
        // 32 multiply-adds a cycle (Intel's, Zen 5's) against 16 (Zen 2 to 4).
        for (extent, fast) in [(6, false), (7, false), (8, true), (14, true), (28, true)] {
            for fast_core in [&avx512, &zen5] {
                assert_eq!(winograd_pays([extent, extent], fast_core), fast, "{extent}");
            }
            for slower_or_gpu in [&avx2, &zen4, &sm90] {
                assert!(winograd_pays([extent, extent], slower_or_gpu), "{extent}");
            }
        }
        // ResNet's last stage: 512 channels over 7 x 7.
        let out = TensorType::new(DType::F32, vec![1, 512, 7, 7]);
        let w = TensorType::new(DType::F32, vec![512, 512, 3, 3]);
        assert!(!conv_is_winograd([1, 1], [1, 1], 1, &out, &w, &avx512));
        assert!(!conv_is_winograd([1, 1], [1, 1], 1, &out, &w, &zen5));
        assert!(conv_is_winograd([1, 1], [1, 1], 1, &out, &w, &zen4));
        let out = TensorType::new(DType::F32, vec![1, 256, 14, 14]);
        let w = TensorType::new(DType::F32, vec![256, 256, 3, 3]);
        assert!(conv_is_winograd([1, 1], [1, 1], 1, &out, &w, &avx512));
    }
}
