//! Graph to loop: every graph op becomes loop nests over buffers, as the
//! fusion plan (`dlc_graph::fusion::plan`) says.
//!
//! Each entry point becomes a `loop.func` taking the graph parameters and then one
//! output buffer per result (`out0`, ...). Every node gets a plan:
//!
//! - **Inline**: an element-wise op (unary, binary, comparison, `where`, cast, splat
//!   constant, broadcast, transpose, slice, batchnorm) with exactly one user that is also
//!   element-wise is computed where it is read, at the reader's index (producer fusion:
//!   a chain of element-wise ops is one loop nest; broadcasts, transposes and slices are
//!   index maps).
//! - **Stored**: anything else gets a buffer and its own loop nest (outermost loop
//!   `loop.parallel`, and the next ones too while those before have fewer than 8
//!   iterations, up to three and never the innermost: `[1, 64, 56, 56]` is a band of
//!   two, 64 programs; the rest `loop.for`); a product of matrices (batched or not, and
//!   the product of an im2col convolution) is the structured `loop.matmul` inside loops
//!   over its batch dimensions, its epilogue in the op's region. Element-wise ops are stored when they have
//!   several users, are results, or feed an op that reads operands many times (matmul,
//!   reductions, user operators), so nothing expensive is recomputed.
//! - **Epilogue**: an op that produces one value per output index (matmul, reductions,
//!   softmax, layernorm, conv2d, pooling, user operators) whose users all start
//!   element-wise paths of the same shape that meet at one stored node applies them before
//!   storing, and stores that node: `relu(x @ w + b)` is one loop nest, and so is SiLU's
//!   `h * sigmoid(h)` after a product, which reads it twice. Its loop nest is emitted at the
//!   chain end's place in topological order, so the chain's other operands (a bias
//!   computed by another reduction) are ready.
//! - **User operators** (`graph.compute`): each local, then the output, is a loop nest
//!   over its index space, reading operands through their affine indices (zero outside
//!   bounds). A definition that is a contraction, `E(sum[k](a[..] * b[..]))`
//!   (`dlc_graph::compute::ElemDef::contraction`: two operands of one element type whose
//!   indices are affine in the definition's indices and `k`, stay within bounds, and both
//!   read `k`; one reduction; `E` element-wise; a sum over several indices when each spans
//!   a whole axis of both operands, consecutive and in order, read through views that make
//!   those axes one: `sum[k, l](a[i, k, l] * b[k, l, j])` is `[M, K*L] x [K*L, N]`), is the same structured `loop.matmul` a
//!   built-in `@` is, whatever the layout: the columns are its last index and the operand
//!   reading it, the rows the last other index read by the other operand alone, the
//!   remaining indices loops around the product; the operands keep their own index maps
//!   (`a[k, i]` is read as `%a[#2, #0]`, which packing copies from), and `E` is the
//!   epilogue (`tanh(sum + c[j])`). A local that is a contraction and whose only reader
//!   reads it element-wise at its own index (`ComputeBody::sole_elementwise_reader`: `h` in
//!   `out[i, j] = h[i, j] * sigmoid(h[i, j])`) is computed inside that reader's epilogue,
//!   once per element, and never stored. An operand that cannot be read in place (a
//!   convolution's window `g[n, o, y - ky + 1, x - kx + 1]`, a read past its edge, which
//!   gives zero, reduction axes not whole and consecutive) is gathered
//!   (`OperandRead::Gathered`): a nest copies it once into a buffer (the batch indices it
//!   reads, then its own indices and the reduction's in the order that keeps the
//!   source's rows innermost: the group holding the widest index the read's last index
//!   moves along by one goes last, else rows then reduction for `a`, reduction then
//!   columns for `b`; zero outside the operand: im2col for any window), read through a
//!   view whose reduction axes are one (and columns, for several), transposed where the
//!   reduction is last (a weight gradient's `x[n, c, y + ky - 1, xx + kx - 1]` is copied
//!   as `[(c, ky, kx), (n, y, xx)]`, runs along `xx`, not `[(n, y, xx), (c, ky, kx)]`,
//!   runs of 3 along `kx`: packing reads it as it reads `G.Bᵀ`); a copy over `MAX_GATHERED` (2^26) elements is refused
//!   and the definition keeps its scalar loops. When the column operand is gathered (or
//!   reads those indices as whole consecutive axes of its own, in order:
//!   `OperandRead::MergedColumns`, through a view) and the epilogue reads only the sum,
//!   the columns are every trailing index that operand alone reads, stored through a
//!   row-major view of the result (a convolution's weight gradient `out[o, c, ky, kx]`
//!   is one `O x C*9` product; its input gradient, and a 1x1 convolution read in place,
//!   one product per image over its pixels). A gathered column operand that reads its input
//!   through a convolution's window (`x[n, c, s0*y + d0*ky - p0, s1*xx + d1*kx - p1]`
//!   over the reduction `c, ky, kx` and the columns `y, xx`: `ContractionForm::window`,
//!   which reads the indices of the user's expression) is copied as the built-in
//!   convolution's im2col buffer (`im2col_copy`, one emitter for both) and the copy and
//!   the product are an im2col kernel group carrying that window, so the product's
//!   programs read their panels through the window (`loop_to_tile::fused`) and the copy is never made:
//!   a dilated convolution, which no built-in has, takes the built-in's im2col kernel
//!   (one that computes exactly a `conv2d` is that op before lowering: `graph.canonicalize`;
//!   `differential.rs::convolutions_in_index_notation_are_the_builtin_kernel` checks both,
//!   byte for byte against the built-in's tile IR where there is one). Invariant: the loop IR of a user contraction
//!   is a `loop.matmul` like the built-in product's, so the tile conversion sees no
//!   difference between the two. An operand may be any element-wise expression of reads
//!   (a prologue: `relu(a[i, k] - mu[i])`, `cast(h[i, k], f32)`): it is gathered, the
//!   prologue computed once per element in the copy, laid out as its read of the most
//!   elements runs (`a[k, i] * sigmoid(s[k] + t[i])` is copied `[k, i]`, along `a`'s
//!   rows, and the product reads the copy transposed). Not structured: a sum whose body is
//!   not a product of two operands (`sum[k](a[i, k] + b[k, j])` keeps scalar loops).
//! - **Softmax** is three passes over a row: its maximum; the exponentials, summed and,
//!   when the result has an f32 buffer of its own (no epilogue fused after it), stored
//!   there; then each element times the reciprocal of the sum, scaled in place (one
//!   exponential and one multiplication per element, one division per row; with an
//!   epilogue or a narrow type the exponential is computed again where the result is
//!   written).
//! - **View**: a reshape is a `loop.view` of its operand's (contiguous) buffer; a
//!   transpose read only by matrix products is a `loop.view` with permuted strides
//!   (products, and `loop.matmul`'s packing, read through any strides); a slice that is
//!   one run of its operand's storage (every axis before the sliced one has extent 1:
//!   W7's `x[t]`) is a `loop.view` with an offset (`dlc_graph::fusion::slice_is_contiguous`),
//!   read in place where it was copied by a loop nest of its own. Each view's offset
//!   counts from the start of the storage, so a view of a view adds the two. In the
//!   compiled code a view's pointer is its source's moved by the difference of their
//!   offsets, and accesses add only index times stride; the interpreters add the offset
//!   to every access.
//!
//! - **Convolutions as products**: a one-group `conv2d` whose per-image product the host
//!   packs (`TargetDesc::packs_product`: f32, at least 16K multiply-adds) fills an im2col buffer `[N, C*KH*KW, OY*OX]` (zero in the
//!   padding) and is a
//!   product `w [O, C*KH*KW] @ col[n]` stored through a `[N, O, OY*OX]`
//!   view of its result, a `loop.matmul` (on a CPU the tile conversion then copies the
//!   product's panels from the input and makes no im2col buffer, see "im2col read from
//!   the input" in `loop_to_tile::fused`). A 1 x 1 convolution at stride 1 without
//!   padding makes no copy at all: its columns are the input viewed `[N, C, H*W]`; over
//!   few pixels and many channels (`Lowering::pixels_as_rows`) the pixels are the
//!   product's rows instead, `col[n]ᵀ @ wᵀ`, and each register tile is stored transposed
//!   (ResNet-50's last stage: 49 pixels in two vector panels of 32, 77% of the lanes). The
//!   element-wise chain after it (bias, residual, relu, ReLU6's clip) is the product's
//!   epilogue, computed at the product's index `[b, o, y*OX + x]` when everything it
//!   reads spans both spatial axes or neither, read through views of the same `[.., H*W]`
//!   shape (`fusion::flat_epilogue_reads`; a value varying along one spatial axis, a
//!   batchnorm, keeps the chain a nest of its own). Other convolutions are direct loop
//!   nests, whose epilogue is computed at each output row, or, when it has a
//!   long-latency op (SiLU), over each output channel's plane after its rows, through
//!   the same flat views (`Lowering::deferred_epilogue`).
//! - An epilogue chain holds only ops that read their operand at their own index: a
//!   transpose, broadcast or slice of the same shape still moves elements, so it ends
//!   the chain.
//!
//! The plan is `dlc_graph::fusion::plan`, one analysis that the lowering follows and
//! that the equality-saturation cost model prices (its function-level estimate), so the
//! two cannot drift apart. What a kernel reads, where its nest is emitted and which
//! storage a view lives in are the plan's functions too (`kernel_reads`, `kernel_at`,
//! `storage_of`), and so is the memory it needs (`memory`: the peak of live stored
//! values, read by `graph.remat`), and so are the kernel groups (`kernel_groups`): kernels that may run
//! as one. Today that is attention (a product of a softmax of a product), which the
//! lowering keeps alive across the group (see buffer planning) and `convert-loop-to-tile` fuses; the
//! convolution groups (im2col, Winograd) are decided by `conv_as_matmul` and
//! `conv_as_winograd`. Every group reaches the loop IR delimited:
//! `loop.kernel_begin {group = "attention" | "im2col" | "winograd"}` .. `loop.kernel_end`
//! around its nests (graph -> loop brackets the plan's attention groups, and each
//! convolution it lowers through an im2col copy or as Winograd's; a group inside
//! another's span is emitted without bounds, as groups do not nest), and
//! `convert-loop-to-tile` fuses exactly the groups so delimited and nothing else:
//! `row_fusion`, `implicit_im2col` (`fused.rs`) and `winograd_fusion` (`winograd.rs`)
//! read a group's nests and check that they fit the fused schedule, the group running
//! as its nests one by one otherwise (the same nests undelimited run one by one:
//! `tests/tests/passes/convert_loop_to_tile_ungrouped_attention.test`,
//! `..._ungrouped_im2col.test`). An im2col group's window is its attribute, which
//! `implicit_im2col` reads (stride, padding, dilation are never inferred from index
//! coefficients) and checks its copy nest against: a copy that does not read through
//! the group's window runs as written (`convert_loop_to_tile_im2col_wrong_window.test`).
//! Attention's and Winograd's schedules still derive their parameters from the group's
//! nests. The saturation cost model reads the same groups (`CostModel::function_cost`):
//! an attention group a CPU runs as one kernel (both products packed, nothing else
//! reading the scores or their softmax) is priced without two kernel launches, the
//! scores' write and the softmax's read and write.
//!
//! Buffer planning: each intermediate gets its storage just before its loop nest; once
//! the last loop nest that reads it (or a view of it) is emitted, its allocation is free,
//! and a later intermediate of the same element type that fits takes the smallest free
//! allocation as a `loop.view` instead of a new `loop.alloc`. Free allocations are
//! released at the end of the function; results are written straight into the output
//! buffers. (One arena with planned offsets, across element types, is future work.)
//! One exception keeps attention fusable (`convert-loop-to-tile`'s `fused` schedule): for a product
//! whose left operand is a softmax of a product, what the first product's nest reads,
//! and the scores, stay allocated until the second product (BERT's attention output
//! took the storage of its queries, which the fused kernel's programs still read).
//!
//! Dense constants (`tensor(...)` in source, folded constants, an imported model's
//! weights) are `loop.global {value = [..]}` buffers made when the function starts
//! (sharing the graph constant's storage, `ConstValue::Dense`'s `Arc`, not a copy):
//! read-only data homed like parameters, never freed or reused, read in place by every
//! loop nest (a weight matrix is a packed product's operand directly). They stay
//! `tile.global` on the tile level, become one private constant LLVM global of the
//! elements' little-endian bytes (one data array, so a million-element weight costs one
//! constant, not a million stores), and a `memref.global` in upstream MLIR. (Compiled CPU
//! code lowers an entry point's constants as weights first, `dlc_driver::lower_for_code`,
//! so what depends on them alone is prepared once per process.)
//!
//! Reductions and matrix products accumulate in a carried `loop.for` value of the
//! element type's accumulator type (`DType::accumulator`: f32 for f16 and bf16, the type
//! itself otherwise; the graph interpreter accumulates in f64). For f16/bf16 the loads
//! are widened to f32 before multiplying, softmax, layernorm and batchnorm compute in f32
//! throughout, and the result is rounded to the narrow type once, where it is stored: so
//! the loop interpreter and compiled code give the reference's answers where an f16
//! accumulator would stall (2048 + 1 = 2048). f32 programs lower exactly as before (no
//! casts). The differential
//! tests allow a relative error of 1e-4; `--check` uses a tolerance per element type.
//!
//! The interpreters estimate a program's work before running it (`interp::estimate_work`
//! per graph op, `interp::check_work` over loop ops) and refuse programs above a limit
//! (2^34 by default, `dlc run --max-work`); constant folding evaluates only ops under
//! 2^24 (`interp::FOLD_WORK_LIMIT`), so no program hangs the compiler or an
//! interpreter.

use std::collections::{HashMap, HashSet};

use dlc_core::scalar::{BinaryOp, CmpOp, ReduceKind, UnaryOp};
use dlc_core::{DType, TargetDesc, TensorType, Window};
use dlc_graph::compute::{
    Affine, ComputeBody, ContractionForm, ElemDef, IndexVar, OperandRead, ScalarExpr, Source,
    as_read,
};
use dlc_graph::fusion::{KernelGroup, Plan, flat_shape};
use dlc_graph::ops::{ConstValue, Op, PoolKind};
use dlc_graph::{Function as GFunction, Module as GModule};
use dlc_loop::KernelGroup as KernelGroupKind;
use dlc_loop::{BufferType, Builder, Function, IndexExpr, Module, Value};
use petgraph::stable_graph::NodeIndex;

mod winograd;

/// An element-wise nest over `[N, C, H, W]` with rows narrower than this
/// runs over `[N, C, H*W]` where it can (`Lowering::emit_flat_elementwise`):
/// one AVX-512 vector of f32; wider rows fill their vectors already.
const FLAT_WIDTH: usize = 16;

/// Why a graph module could not be lowered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LowerError {
    /// A call is left; `graph.inline` removes them.
    #[error("@{0} still calls @{1}; run graph.inline before lowering")]
    Call(String, String),
    /// The graph is invalid (the verifier rules this out).
    #[error("invalid graph: {0}")]
    Invalid(String),
}

/// Lowers every entry point of a verified, inlined graph module for
/// `target`: its fusion plan (which convolutions are products, and of what
/// kind), how many outer loops are parallel and the Winograd transforms'
/// vector width follow the target, never the machine compiling.
pub fn lower_module(m: &GModule, target: &TargetDesc) -> Result<Module, LowerError> {
    let functions = m
        .entry_points()
        .map(|f| lower_function(f, target))
        .collect::<Result<_, _>>()?;
    Ok(Module { functions })
}

fn contiguous(t: &TensorType) -> BufferType {
    BufferType::contiguous(t.dtype, t.shape.clone())
}

fn ix(v: Value) -> IndexExpr {
    IndexExpr::value(v)
}

fn ix_const(c: i64) -> IndexExpr {
    IndexExpr::constant(c)
}

/// `a * k + b`.
fn ix_axpy(k: i64, a: &IndexExpr, b: &IndexExpr) -> IndexExpr {
    b.plus_scaled(k, a)
}

/// The input position a window reads along one axis: output position `o`
/// at `stride`, tap `t`, `padding` before the first element.
fn window_index(stride: usize, o: &IndexExpr, t: &IndexExpr, padding: usize) -> IndexExpr {
    dilated_index(stride, o, (1, t), padding)
}

/// The input position `stride * o + dilation * t - padding` that output `o`
/// reads through tap `t` of a window `dilation` apart.
fn dilated_index(
    stride: usize,
    o: &IndexExpr,
    (dilation, t): (usize, &IndexExpr),
    padding: usize,
) -> IndexExpr {
    ix_axpy(
        stride as i64,
        o,
        &ix_axpy(dilation as i64, t, &ix_const(-(padding as i64))),
    )
}

/// Maps an index of `dst` (a broadcast result) to `src` (an operand), NumPy
/// style: trailing axes align, and an axis of extent 1 is read at 0.
fn broadcast_index(idx: &[IndexExpr], src: &[usize], dst: &[usize]) -> Vec<IndexExpr> {
    broadcast_axes(idx, src, dst, ix_const(0))
}

/// [`broadcast_index`] for any per-axis value, `fixed` at a broadcast axis.
fn broadcast_axes<T: Clone>(idx: &[T], src: &[usize], dst: &[usize], fixed: T) -> Vec<T> {
    let off = dst.len() - src.len();
    src.iter()
        .enumerate()
        .map(|(i, &d)| {
            if d == 1 && dst[off + i] != 1 {
                fixed.clone()
            } else {
                idx[off + i].clone()
            }
        })
        .collect()
}

struct Lowering<'g> {
    g: &'g GFunction,
    /// What the code is for.
    target: &'g TargetDesc,
    b: Builder,
    plan: HashMap<NodeIndex, Plan>,
    /// The buffer holding each stored node (params, stored nodes, views).
    home: HashMap<NodeIndex, Value>,
    /// Values substituted for a node while emitting an epilogue.
    subst: HashMap<NodeIndex, Value>,
    /// While a convolution's product computes its epilogue at the
    /// product's index `[N, O, OY*OX]` (`fusion::flat_epilogue_reads`):
    /// the views of what the chain reads, with their spatial axes made one
    /// (`fusion::flat_shape`), by node.
    flat: Option<HashMap<NodeIndex, Value>>,
    /// Buffers allocated here (the `loop.alloc`, which a node's home may
    /// view), by the node whose storage they are.
    allocated: HashMap<NodeIndex, Value>,
    /// Allocations whose node's lifetime has ended, free for a later node of
    /// the same element type that fits: (alloc, element type, elements).
    free: Vec<(Value, DType, usize)>,
    /// How many outer loops of each open nest are parallel.
    parallel: Vec<usize>,
    /// Nodes that depend on weights and constants alone: their buffers
    /// are computed once by the preparer (see `dlc_tile::transforms::
    /// split_prepare`), so they neither take a freed buffer nor give theirs
    /// to a later node.
    bound: HashSet<NodeIndex>,
    /// Buffers derived from weights alone (bound nodes', and what a
    /// convolution derives from its kernel), released at the end.
    held: Vec<Value>,
    /// Whether a kernel group is open (groups do not nest: a group inside
    /// another's span is emitted without its bounds).
    in_group: bool,
}

/// How many outer loops of a nest over `shape` (every point of which
/// writes its own elements) are `loop.parallel`: the first, and the next
/// while those before have fewer iterations than a CPU thread pool is worth
/// (`TargetDesc::min_thread_iterations`), up to three and never the
/// innermost (which the tile conversion vectorizes). W3's batchnorm at
/// batch 1, `[1, 64, 56, 56]`, runs as 64 programs rather than one.
fn parallel_loops(shape: &[usize], target: &TargetDesc) -> usize {
    let few = target.min_thread_iterations();
    let mut n = 1;
    let mut iterations = shape.first().copied().unwrap_or(1);
    while n < 3 && n + 1 < shape.len() && iterations < few {
        iterations = iterations.saturating_mul(shape[n]);
        n += 1;
    }
    n
}

/// Vectors the middle columns of a padded direct convolution fill at least
/// when it runs them apart from its borders (see
/// [`Lowering::emit_direct_conv`]), each border a vector wide: each row then
/// runs three column loops. AVX2 (Zen 3), a 3 x 3 depthwise convolution
/// with ReLU6, one thread, the least of 1000 calls: 112 x 112 over 32
/// channels (96 middle columns) 0.575 -> 0.144 ms, 90 x 90 over 64 (74) 0.77
/// -> 0.47, 224 -> 112 at stride 2 over 96 7.5 -> 5.9. At first two row
/// tiles (64 columns), as a ragged middle then ended in a masked tile, and 56
/// x 56 was slower split (0.456 -> 0.50 ms); since a ragged vector loop's
/// whole tiles run unmasked and its rest as its own tile (on such CPUs), a
/// middle of one vector is enough: 56 x 56 over 144 (40 middle columns) 0.21
/// -> 0.17-0.20, at stride 2 from 112 over 96 (48) 0.34 -> 0.26-0.28, 28 x 28
/// over 192 (12) 0.086 -> 0.074, at stride 2 from 56 over 144 0.144 ->
/// 0.110-0.126. (Depthwise convolutions strided along their columns have
/// since read a padded copy in phases instead, `Lowering::phase_copy`: no
/// load of theirs is padded.)
const DIRECT_CONV_SPLIT_VECTORS: usize = 1;

/// The widest output rows, in vectors, at which a depthwise convolution at
/// column stride 1 on a CPU without mask registers reads a padded copy of
/// each channel (`Lowering::phase_copy` with one phase) rather than padded
/// loads, when its rows are more than one vector wide. AVX2 (Zen 3), one
/// thread, `dlc bench`, SiLU or ReLU6 after it: 5 x 5 over 14 x 14 x 672
/// 0.288 -> 0.257 ms, 3 x 3 over 14 x 14 x 480 0.099 -> 0.092, over 14 x
/// 14 x 576 0.086 -> 0.076, over 28 x 28 x 192 0.075 -> 0.067; but over 7
/// x 7 (one vector, masked either way) 0.172 -> 0.184 and 0.054 -> 0.060,
/// over 56 x 56 x 144 0.180 -> 0.191 and over 112 x 112 x 32 0.142 ->
/// 0.216 (their middle columns already load unpadded).
const PADDED_COPY_MAX_VECTORS: usize = 4;

/// A direct convolution's epilogue deferred to each channel's plane: its
/// end, its result viewed `[N, O, Y * X]`, and what it reads viewed so.
struct DeferredEpilogue {
    end: NodeIndex,
    out: Value,
    views: HashMap<NodeIndex, Value>,
}

/// A [`Lowering::phase_buffer`]: the buffer, its rows and columns a phase,
/// and what it is a copy of: input `x` at column stride `sx` (its phases),
/// padded by `padding`.
#[derive(Clone, Copy)]
struct PhaseBuffer {
    buf: Value,
    rows: usize,
    cols: usize,
    x: NodeIndex,
    sx: usize,
    padding: [usize; 2],
}

/// How a direct convolution's window reads its input: where it lies, with
/// padded loads or plain ones, or from the phases of a padded copy
/// ([`Lowering::phase_copy`]).
#[derive(Clone, Copy)]
enum ConvRead {
    Padded(bool),
    Phases(Value),
}

/// The ranges of an output axis of `out` positions (each a window of `k`
/// taps `stride` apart over an input axis of `input` with `padding` before
/// it) whose windows reach into the padding, or do not: `(lo, hi, padded)`,
/// in order, none empty, each border at least `border` wide. Without
/// padding, or with no middle left, one range.
fn inside_ranges(
    out: usize,
    (input, k, stride, padding): (usize, usize, usize, usize),
    border: usize,
) -> Vec<(usize, usize, bool)> {
    if padding == 0 {
        return vec![(0, out, false)];
    }
    // Output o's window is stride * o - padding .. + k - 1.
    let lo = padding.div_ceil(stride).max(border).min(out);
    let hi = (input + padding)
        .checked_sub(k)
        .map_or(0, |last| last / stride + 1)
        .min(out.saturating_sub(border))
        .max(lo);
    if lo == hi {
        return vec![(0, out, true)];
    }
    [(0, lo, true), (lo, hi, false), (hi, out, true)]
        .into_iter()
        .filter(|(a, b, _)| a < b)
        .collect()
}

fn lower_function<'g>(g: &'g GFunction, target: &'g TargetDesc) -> Result<Function, LowerError> {
    for n in g.body.node_indices() {
        if let Op::Call { callee } = &g.body[n].op {
            return Err(LowerError::Call(g.name.clone(), callee.clone()));
        }
    }
    let mut b = Builder::new(g.name.clone());
    let mut home = HashMap::new();
    let mut taken: HashSet<String> = HashSet::new();
    for (i, (name, node)) in g.params.iter().enumerate() {
        if g.is_weight(i) {
            b.weight(i);
        }
        let v = b.param(name.clone(), contiguous(&g.body[*node].results[0]));
        home.insert(*node, v);
        taken.insert(name.clone());
    }
    let mut outs = Vec::new();
    for (i, r) in g.results.iter().enumerate() {
        let mut name = format!("out{i}");
        while taken.contains(&name) {
            name.push('_');
        }
        taken.insert(name.clone());
        outs.push(b.output(name, contiguous(g.value_type(*r))));
    }
    let mut l = Lowering {
        g,
        target,
        b,
        plan: HashMap::new(),
        home,
        subst: HashMap::new(),
        flat: None,
        allocated: HashMap::new(),
        free: Vec::new(),
        parallel: Vec::new(),
        bound: dlc_graph::fusion::bound_nodes(g),
        held: Vec::new(),
        in_group: false,
    };
    l.plan_nodes();
    // Dense constants are read-only globals holding their data, homed
    // like parameters (never freed or reused).
    let mut dense: Vec<NodeIndex> = g
        .body
        .node_indices()
        .filter(|&n| matches!(g.body[n].op, Op::Constant(ConstValue::Dense(_))))
        .collect();
    dense.sort();
    for n in dense {
        if let Op::Constant(ConstValue::Dense(values)) = &g.body[n].op {
            let outer = l.b.set_loc(g.body[n].loc.clone());
            let v =
                l.b.global(values.clone(), contiguous(&g.body[n].results[0]));
            l.b.set_loc(outer);
            l.home.insert(n, v);
        }
    }
    // Results get their output buffer as home, unless already homed (a
    // parameter, or a node returned twice): those are copied at the end. A
    // reshape that is a result is copied through a view where it stands.
    let mut copies = Vec::new();
    for (i, r) in g.results.iter().enumerate() {
        match l.home.entry(r.node) {
            std::collections::hash_map::Entry::Occupied(_) => copies.push((r.node, outs[i])),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(outs[i]);
            }
        }
    }
    let order = g.topo_order();
    let mut spans = l.group_spans(&order);
    let last_reader = l.last_readers(&order, &spans);
    // Each kernel group's nests between `loop.kernel_begin` and
    // `loop.kernel_end` (groups that would overlap an earlier one are left
    // out: groups do not nest).
    let mut bounds: HashMap<usize, usize> = HashMap::new();
    spans.sort_by_key(|g| g.first);
    let mut end = None;
    for g in spans {
        if end.is_none_or(|e| g.first > e) && g.first < g.last {
            bounds.insert(g.first, g.last);
            end = Some(g.last);
        }
    }
    let mut closing = None;
    for (k, &n) in order.iter().enumerate() {
        if let Some(&last) = bounds.get(&k) {
            l.b.kernel_begin(KernelGroupKind::Attention);
            l.in_group = true;
            closing = Some(last);
        }
        l.emit_at_position(n)?;
        if closing == Some(k) {
            l.b.kernel_end();
            l.in_group = false;
            closing = None;
        }
        // Sorted: the output must not depend on hash order.
        let mut done: Vec<NodeIndex> = last_reader
            .iter()
            .filter(|(_, last)| **last == k)
            .map(|(node, _)| *node)
            .collect();
        done.sort();
        for node in done {
            if let Some(buf) = l.allocated.get(&node).copied() {
                if l.bound.contains(&node) {
                    l.held.push(buf);
                    continue;
                }
                let t = l.ty(node);
                let elements = t.num_elements().unwrap_or(usize::MAX);
                l.free.push((buf, t.dtype, elements));
            }
        }
    }
    for (node, out) in copies {
        let shape = g.body[node].results[0].shape.clone();
        let idx = l.open_nest(&shape);
        let v = l.value_at(node, &idx);
        l.b.store(v, out, idx);
        l.close_nest(shape.len());
    }
    // Buffers nothing reads after their own loop nest, and the free ones.
    let mut unread: Vec<(NodeIndex, Value)> = l
        .allocated
        .iter()
        .filter(|(node, _)| !last_reader.contains_key(node))
        .map(|(node, buf)| (*node, *buf))
        .collect();
    unread.sort();
    for (_, buf) in unread {
        l.b.dealloc(buf);
    }
    for (buf, _, _) in std::mem::take(&mut l.free) {
        l.b.dealloc(buf);
    }
    for buf in std::mem::take(&mut l.held) {
        l.b.dealloc(buf);
    }
    Ok(l.b.finish())
}

/// A kernel group of the plan placed in the emission order.
struct GroupSpan {
    /// Positions of its first and last kernels.
    first: usize,
    last: usize,
    /// The first product, and what of it the softmax reads.
    scores: NodeIndex,
    read: NodeIndex,
}

impl Lowering<'_> {
    fn op(&self, n: NodeIndex) -> &Op {
        &self.g.body[n].op
    }

    fn ty(&self, n: NodeIndex) -> &TensorType {
        &self.g.body[n].results[0]
    }

    fn operand(&self, n: NodeIndex, k: usize) -> NodeIndex {
        self.g.operands(n)[k].node
    }

    fn plan_nodes(&mut self) {
        self.plan = dlc_graph::fusion::plan(self.g, self.target);
    }

    /// The kernel whose loop nest is emitted at `p`'s place in topological
    /// order (see [`dlc_graph::fusion::kernel_at`]).
    fn kernel_at(&self, p: NodeIndex) -> Option<NodeIndex> {
        dlc_graph::fusion::kernel_at(&self.plan, p)
    }

    /// The stored nodes a kernel's loop nest reads: its operands and those of
    /// its epilogue chain, looking through inlined nodes.
    fn reads(&self, n: NodeIndex) -> Vec<NodeIndex> {
        dlc_graph::fusion::kernel_reads(self.g, &self.plan, n)
    }

    /// The storage a node's buffer lives in (a view's is its operand's).
    fn storage_of(&self, n: NodeIndex) -> NodeIndex {
        dlc_graph::fusion::storage_of(self.g, &self.plan, n)
    }

    /// For each storage, the position (in `order`) of the last kernel that
    /// reads it.
    /// `spans`: the plan's kernel groups placed in `order`
    /// ([`Self::group_spans`]), in the order their last kernels are emitted.
    fn last_readers(&self, order: &[NodeIndex], spans: &[GroupSpan]) -> HashMap<NodeIndex, usize> {
        let mut last = HashMap::new();
        for (k, &p) in order.iter().enumerate() {
            let Some(kernel) = self.kernel_at(p) else {
                continue;
            };
            for r in self.reads(kernel) {
                last.insert(self.storage_of(r), k);
            }
        }
        // A kernel group may run as one kernel: attention over blocks of
        // rows, whose programs write rows of the second product's result
        // while others still read the first product's operands. What the
        // first product's nest reads, and the scores, stay allocated until
        // the second product, so that their storage is not reused for that
        // result.
        for g in spans {
            for r in self.reads(g.scores).into_iter().chain([g.read]) {
                if let Some(l) = last.get_mut(&self.storage_of(r))
                    && (g.first..g.last).contains(l)
                {
                    *l = g.last;
                }
            }
        }
        last
    }

    /// The plan's kernel groups (`dlc_graph::fusion::kernel_groups`) with
    /// the positions in `order` of their first and last kernels, in the
    /// order their last kernels are emitted.
    fn group_spans(&self, order: &[NodeIndex]) -> Vec<GroupSpan> {
        let mut at: HashMap<NodeIndex, usize> = HashMap::new();
        for (k, &p) in order.iter().enumerate() {
            if let Some(kernel) = self.kernel_at(p) {
                at.insert(kernel, k);
            }
        }
        let mut spans: Vec<GroupSpan> = dlc_graph::fusion::kernel_groups(self.g, &self.plan)
            .into_iter()
            .filter_map(|g| match g {
                KernelGroup::Attention {
                    scores,
                    read,
                    output,
                    ..
                } => Some(GroupSpan {
                    first: *at.get(&scores)?,
                    last: *at.get(&output)?,
                    scores,
                    read,
                }),
            })
            .collect();
        // Stable: groups ending together keep the plan's order.
        spans.sort_by_key(|g| g.last);
        spans
    }

    /// Opens a loop nest over `shape` (the outermost axis parallel) and
    /// returns its indices.
    fn open_nest(&mut self, shape: &[usize]) -> Vec<IndexExpr> {
        let parallel = parallel_loops(shape, self.target);
        self.open_nest_with(shape, parallel)
    }

    /// [`Self::open_nest`] for a nest whose every point runs a reduction
    /// loop: that loop is the innermost, so the nest's own last loop may be
    /// parallel (a row times a matrix, `[1, N]`, is `N` programs, not one).
    fn open_reduction_nest(&mut self, shape: &[usize]) -> Vec<IndexExpr> {
        let mut with_reduction = shape.to_vec();
        with_reduction.push(1);
        let parallel = parallel_loops(&with_reduction, self.target).min(shape.len());
        self.open_nest_with(shape, parallel)
    }

    fn open_nest_with(&mut self, shape: &[usize], parallel: usize) -> Vec<IndexExpr> {
        self.parallel.push(parallel);
        shape
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let iv = if i < parallel {
                    self.b.begin_parallel(0, d as i64)
                } else {
                    self.b.begin_for(0, d as i64, 1, &[]).0
                };
                ix(iv)
            })
            .collect()
    }

    /// [`Self::open_nest`] with axis `inner` of `shape` the innermost
    /// loop (the others in order outside it); the index by axis.
    fn open_nest_inner(&mut self, shape: &[usize], inner: usize) -> Vec<IndexExpr> {
        if inner + 1 >= shape.len() {
            return self.open_nest(shape);
        }
        let order: Vec<usize> = (0..shape.len())
            .filter(|&a| a != inner)
            .chain([inner])
            .collect();
        let permuted: Vec<usize> = order.iter().map(|&a| shape[a]).collect();
        let opened = self.open_nest(&permuted);
        let mut idx = vec![ix_const(0); shape.len()];
        for (e, &a) in opened.into_iter().zip(&order) {
            idx[a] = e;
        }
        idx
    }

    /// The axis of element-wise node `n`'s result its loop nest runs
    /// innermost: the one along which most of the buffers its nest reads
    /// and writes (its inlined operands' and its epilogue's, its store)
    /// move contiguously, the last axis unless more of them move along
    /// another. A sum of 32 transposed weight gradients into an update
    /// (a recurrent network's step) reads 32 buffers down their columns
    /// when run along its own rows: run along its columns, it reads them
    /// along their rows and writes (and reads the weight) across.
    fn innermost_axis(&self, n: NodeIndex) -> usize {
        let rank = self.ty(n).rank();
        if rank < 2 {
            return rank.saturating_sub(1);
        }
        let mut votes = vec![0usize; rank];
        // The store, at the result's index.
        votes[rank - 1] += 1;
        let own: Vec<Option<usize>> = (0..rank).map(Some).collect();
        self.count_reads(n, n, None, &own, &mut votes);
        if let Plan::WithEpilogue(end) = self.plan[&n] {
            // The chain from `n` to `end`, `n` substituted: its other reads.
            self.count_reads(end, end, Some(n), &own, &mut votes);
        }
        // An axis of one element is no loop to vectorize: the last longer
        // one stands in for the trailing ones (which move together with it
        // in a row-major buffer), and none is chosen.
        let shape = &self.ty(n).shape;
        let last = (0..rank).rev().find(|&a| shape[a] > 1).unwrap_or(rank - 1);
        for a in last + 1..rank {
            votes[last] += std::mem::take(&mut votes[a]);
        }
        let best = (0..rank)
            .filter(|&a| shape[a] > 1 || a == last)
            .max_by_key(|&a| (votes[a], a))
            .unwrap_or(last);
        if votes[best] > votes[last] {
            best
        } else {
            last
        }
    }

    /// Adds to `votes` the result axis along which each buffer read in
    /// computing `n` moves along its last axis, `map` giving the result
    /// axis at each of `n`'s axes (none: fixed). `root` is computed, not
    /// read (the nest's own node, or the end of its epilogue); `subst`, the
    /// value an epilogue starts from, is neither.
    fn count_reads(
        &self,
        n: NodeIndex,
        root: NodeIndex,
        subst: Option<NodeIndex>,
        map: &[Option<usize>],
        votes: &mut [usize],
    ) {
        if Some(n) == subst {
            return;
        }
        if n != root && self.plan[&n] != Plan::Inline && self.home.contains_key(&n) {
            if let Some(Some(a)) = map.last() {
                votes[*a] += 1;
            }
            return;
        }
        if n != root && self.plan[&n] != Plan::Inline {
            return;
        }
        let shape = &self.ty(n).shape;
        let operand_map =
            |k: usize| broadcast_axes(map, &self.ty(self.operand(n, k)).shape, shape, None);
        match self.op(n) {
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Cast { .. }
            | Op::Broadcast { .. }
            | Op::Barrier => {
                for k in 0..self.g.operands(n).len() {
                    self.count_reads(self.operand(n, k), root, subst, &operand_map(k), votes);
                }
            }
            Op::Transpose { perm } => {
                let mut src = vec![None; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    src[p] = map[i];
                }
                self.count_reads(self.operand(n, 0), root, subst, &src, votes);
            }
            Op::Slice { .. } => self.count_reads(self.operand(n, 0), root, subst, map, votes),
            Op::BatchNorm { .. } => {
                self.count_reads(self.operand(n, 0), root, subst, map, votes);
                for k in 1..5 {
                    self.count_reads(self.operand(n, k), root, subst, &[map[1]], votes);
                }
            }
            _ => {}
        }
    }

    /// Opens the loops around a product over its batch dimensions (see
    /// [`Self::open_nest`]): with two, both are parallel, so that the tile
    /// conversion makes each a grid axis of the packed product's kernel
    /// (`[B, H, M, N]` attention scores).
    fn open_batch(&mut self, batch: &[usize]) -> Vec<IndexExpr> {
        if batch.len() != 2 {
            return self.open_nest(batch);
        }
        self.parallel.push(2);
        batch
            .iter()
            .map(|&d| ix(self.b.begin_parallel(0, d as i64)))
            .collect()
    }

    fn close_nest(&mut self, rank: usize) {
        let parallel = self.parallel.pop().unwrap_or(1);
        for i in (0..rank).rev() {
            if i < parallel {
                self.b.end_parallel();
            } else {
                self.b.end_for(vec![]);
            }
        }
    }

    /// A product as the structured `loop.matmul`: loops over the `batch`
    /// dimensions (the outermost parallel), then an `m x n` product summed
    /// over `k` of the operands `a` and `b` of element type `dtype`, indexed
    /// by `a.1(batch, i, k)` and `b.1(batch, k, j)`; `epilogue` gets the
    /// result index (`batch ++ [i, j]`) and the sum, rounded to `dtype`.
    #[allow(clippy::type_complexity)]
    fn product(
        &mut self,
        batch: &[usize],
        [m, n, k]: [usize; 3],
        dtype: DType,
        a: (
            Value,
            &dyn Fn(&[IndexExpr], &IndexExpr, &IndexExpr) -> Vec<IndexExpr>,
        ),
        b: (
            Value,
            &dyn Fn(&[IndexExpr], &IndexExpr, &IndexExpr) -> Vec<IndexExpr>,
        ),
        epilogue: &mut dyn FnMut(&mut Self, &[IndexExpr], Value),
    ) {
        let bidx = self.open_batch(batch);
        let [i, j, kk, acc] =
            self.b
                .begin_matmul(m as i64, n as i64, k as i64, dtype.accumulator());
        let (i, j, kk) = (ix(i), ix(j), ix(kk));
        let sum = self.narrow(acc, dtype);
        let mut idx = bidx.clone();
        idx.extend([i.clone(), j.clone()]);
        epilogue(self, &idx, sum);
        let (ai, bi) = ((a.1)(&bidx, &i, &kk), (b.1)(&bidx, &kk, &j));
        self.b.end_matmul(a.0, ai, b.0, bi);
        self.close_nest(batch.len());
    }

    /// Allocates the node's buffer unless it already has one (an output).
    fn ensure_home(&mut self, n: NodeIndex) -> Value {
        if let Some(v) = self.home.get(&n) {
            return *v;
        }
        let ty = contiguous(self.ty(n));
        let need = self.ty(n).num_elements().unwrap_or(usize::MAX);
        // Reuse the smallest free allocation that fits, through a view.
        let bound = self.bound.contains(&n);
        let fit = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, (_, d, cap))| !bound && *d == ty.dtype && *cap >= need)
            .min_by_key(|(_, (_, _, cap))| *cap)
            .map(|(i, _)| i);
        let (root, home) = match fit {
            Some(i) => {
                let (root, _, _) = self.free.swap_remove(i);
                (root, self.b.view(root, ty))
            }
            None => {
                let buf = self.b.alloc(ty);
                (buf, buf)
            }
        };
        self.home.insert(n, home);
        self.allocated.insert(n, root);
        home
    }

    fn emit_at_position(&mut self, p: NodeIndex) -> Result<(), LowerError> {
        let Some(n) = self.kernel_at(p) else {
            return Ok(());
        };
        if matches!(self.op(n), Op::Constant(ConstValue::Dense(_))) {
            return Ok(()); // a global, made when the function starts
        }
        if self.plan[&n] == Plan::View {
            let src = self.operand(n, 0);
            let Some(&buf) = self.home.get(&src) else {
                return Err(LowerError::Invalid(
                    "reshape, transpose or slice of a value with no buffer".into(),
                ));
            };
            let dlc_loop::Type::Buffer(from) = self.b.ty(buf).clone() else {
                return Err(LowerError::Invalid("a view of a non-buffer".into()));
            };
            let ty = match self.op(n) {
                Op::Transpose { perm } => BufferType {
                    dtype: from.dtype,
                    shape: perm.iter().map(|&p| from.shape[p]).collect(),
                    strides: perm.iter().map(|&p| from.strides[p]).collect(),
                    offset: from.offset,
                },
                Op::Slice { axis, start, .. } if from.has_row_major_strides() => {
                    // One run of the storage (`fusion::slice_is_contiguous`):
                    // the axes before `axis` have extent 1, so the slice is
                    // row-major from its first element.
                    let mut t = contiguous(self.ty(n));
                    t.offset = from.offset + start * from.strides[*axis];
                    t
                }
                _ if from.has_row_major_strides() => {
                    let mut t = contiguous(self.ty(n));
                    t.offset = from.offset;
                    t
                }
                _ => {
                    return Err(LowerError::Invalid(format!(
                        "a reshape or slice viewing the strided buffer {from}"
                    )));
                }
            };
            let view = self.b.view(buf, ty);
            if let Some(&out) = self.home.get(&n) {
                // A reshape that is a result: copy through the view.
                let shape = self.ty(n).shape.clone();
                let idx = self.open_nest(&shape);
                let v = self.b.load(view, idx.clone(), None);
                self.b.store(v, out, idx);
                self.close_nest(shape.len());
            } else {
                self.home.insert(n, view);
            }
            return Ok(());
        }
        let target = match self.plan[&n] {
            Plan::WithEpilogue(end) => end,
            _ => n,
        };
        // The kernel's ops (its allocation included) carry its place.
        let outer = self.b.set_loc(self.g.body[n].loc.clone());
        self.ensure_home(target);
        let r = self.emit_kernel(n);
        self.b.set_loc(outer);
        r
    }

    /// Runs `emit` between the bounds of a kernel group (unless one is
    /// open already: groups do not nest).
    fn grouped<T>(&mut self, group: KernelGroupKind, emit: impl FnOnce(&mut Self) -> T) -> T {
        if self.in_group {
            return emit(self);
        }
        self.b.kernel_begin(group);
        self.in_group = true;
        let r = emit(self);
        self.in_group = false;
        self.b.kernel_end();
        r
    }

    /// Whether convolution `n` is lowered as a matrix product over an im2col
    /// buffer (which the tile dialect turns into a packed `loop.matmul`):
    /// f32, one group or groups of several input channels
    /// (`dlc_graph::ops::conv_is_im2col_product`), and at least 16K
    /// multiply-adds per image, the size at which `convert-loop-to-tile`
    /// maps a product.
    fn conv_as_matmul(&self, n: NodeIndex) -> bool {
        dlc_graph::fusion::conv_as_matmul(self.g, n, self.target)
    }

    /// Convolution `n` as `out[b] (viewed [O, Y*X]) = w (viewed [O, C*KH*KW])
    /// @ col[b]` (with `G` groups, `out[b, g] (viewed [O/G, Y*X]) = w[g]
    /// (viewed [O/G, C/G*KH*KW]) @ col[b, g]`, a product per image and
    /// group: before, a grouped convolution was a loop nest per output
    /// element, ResNeXt-50's 3 x 3 of 32 groups over 14 x 14 6.5 ms against
    /// 0.5-0.8 so on Zen 3), where `col[b, (c, ky, kx), (y, x)]` holds the input element
    /// each kernel tap reads (zero in the padding): an im2col buffer, or,
    /// for a 1 x 1 window at stride 1 without padding, the input itself
    /// viewed `[N, C, Y*X]` (the copy would be the identity). Its epilogue,
    /// if the plan gives it one, is computed at the product's index `[b, o,
    /// y*X + x]`, reading what it reads through views of the same shape
    /// (`fusion::flat_epilogue_reads`).
    fn conv_im2col(&mut self, n: NodeIndex, window: &Window) -> Result<(), LowerError> {
        let ty = self.ty(n).clone();
        let (x, w) = (self.operand(n, 0), self.operand(n, 1));
        let (xbuf, wbuf) = (self.home[&x], self.home[&w]);
        let wsh = self.ty(w).shape.clone();
        let (c, kh, kw) = (self.ty(x).shape[1], wsh[2], wsh[3]);
        let groups = c / wsh[1];
        // Per group: `og` output channels from `wsh[1]` input channels.
        let og = wsh[0] / groups;
        let (batch, oy, ox) = (ty.shape[0], ty.shape[2], ty.shape[3]);
        let (q, p) = (wsh[1] * kh * kw, oy * ox);
        let (col, copied) = match self.row_major_view(xbuf, &[batch, c, p]) {
            Some(v) if reads_in_place(window) => (v, false),
            _ => (
                self.im2col_copy(xbuf, window, [batch, c], [oy, ox], ty.dtype),
                true,
            ),
        };
        // A group's rows of the im2col buffer (or of the input) are
        // consecutive, `q` of them, as are its weights' and its output's
        // channels: each group is a product of its own. The products'
        // batch axes, `lead`: the image, the group, or both.
        let lead = match (batch, groups) {
            (_, 1) => vec![batch],
            (1, _) => vec![groups],
            _ => vec![batch, groups],
        };
        let grouped = |shape: &[usize]| -> Vec<usize> {
            if groups == 1 {
                return shape.to_vec();
            }
            let mut s = lead.clone();
            s.extend_from_slice(&shape[shape.len() - 2..]);
            s
        };
        let copy = col;
        let col = match groups {
            1 => col,
            _ => self
                .row_major_view(col, &grouped(&[batch, q, p]))
                .ok_or_else(|| {
                    LowerError::Invalid("a grouped convolution's input is not row-major".into())
                })?,
        };
        let wshape = if groups == 1 {
            vec![og, q]
        } else {
            vec![groups, og, q]
        };
        let wv = self
            .b
            .view(wbuf, contiguous(&TensorType::new(ty.dtype, wshape)));
        let (end, views) = match self.plan[&n] {
            Plan::WithEpilogue(end) => {
                let reads = dlc_graph::fusion::flat_epilogue_reads(self.g, &self.plan, n, end)
                    .ok_or_else(|| {
                        LowerError::Invalid(
                            "a convolution's epilogue that its product cannot compute".into(),
                        )
                    })?;
                let mut views = HashMap::new();
                for r in reads {
                    let shape = flat_shape(&self.ty(r).shape);
                    let home = self.home.get(&r).copied();
                    let view = home.and_then(|b| self.row_major_view(b, &shape));
                    let view = view.ok_or_else(|| {
                        LowerError::Invalid(
                            "a convolution's epilogue reads a value with no row-major buffer"
                                .into(),
                        )
                    })?;
                    views.insert(r, view);
                }
                (end, Some(views))
            }
            _ => (n, None),
        };
        let ov = self
            .row_major_view(self.home[&end], &grouped(&[batch, og, p]))
            .ok_or_else(|| LowerError::Invalid("a convolution's result is not row-major".into()))?;
        // Few pixels and many channels: the pixels are the product's rows
        // and the channels its columns (`col[b]ᵀ @ wᵀ`, the register tile
        // stored transposed), where the pixels as columns would pad the
        // vector panels (49 pixels in two panels of 32); an im2col buffer
        // too (ResNet's strided convolutions into 7 x 7: 1024 -> 2048
        // channels 2.5 -> 2.2-2.3 ms, ResNet-18 2% faster), though its
        // copy is then not made by the product's programs.
        // A value read per channel and pixel (`[.., C, H, W]`, right-aligned).
        let residual = views.as_ref().is_some_and(|v| {
            v.keys().any(|r| {
                let s = &self.ty(*r).shape;
                let channels = s.len().checked_sub(3).map_or(1, |c| s[c]);
                channels > 1 && s.iter().rev().take(2).product::<usize>() > 1
            })
        });
        let swap = self.pixels_as_rows([og, p, q], ty.dtype, residual);
        type Read<'r> = &'r dyn Fn(&[IndexExpr], &IndexExpr, &IndexExpr) -> Vec<IndexExpr>;
        // The batch index (`lead`'s: `[b]`, `[g]` or `[b, g]`) followed by
        // two more.
        let at = |b: &[IndexExpr], i: &IndexExpr, j: &IndexExpr| {
            let mut v = b.to_vec();
            v.extend([i.clone(), j.clone()]);
            v
        };
        // The weights' index: the group's, if any.
        let group = |b: &[IndexExpr]| -> Vec<IndexExpr> {
            b.last()
                .filter(|_| groups > 1)
                .cloned()
                .into_iter()
                .collect()
        };
        let weight_rows: Read<'_> = &|b, oc, r| at(&group(b), oc, r);
        let weight_columns: Read<'_> = &|b, r, oc| at(&group(b), oc, r);
        let pixel_columns: Read<'_> = &at;
        let pixel_rows: Read<'_> = &|b, pos, r| at(b, r, pos);
        let (sizes, a, b) = if swap {
            ([p, og, q], (col, pixel_rows), (wv, weight_columns))
        } else {
            ([og, p, q], (wv, weight_rows), (col, pixel_columns))
        };
        self.product(&lead, sizes, ty.dtype, a, b, &mut |l, idx, acc| {
            // The result's index (`lead`'s, then `[o, y*X + x]`): the
            // product's, or its transpose.
            let r = idx.len();
            let mut idx = idx.to_vec();
            if swap {
                idx.swap(r - 2, r - 1);
            }
            let v = match &views {
                Some(views) => {
                    l.subst.insert(n, acc);
                    l.flat = Some(views.clone());
                    // The epilogue reads at `[b, g * og + o, y*X + x]`.
                    let flat = match idx.len() {
                        3 if groups == 1 => idx.clone(),
                        3 => vec![
                            ix_const(0),
                            ix_axpy(og as i64, &idx[0], &idx[1]),
                            idx[2].clone(),
                        ],
                        _ => vec![
                            idx[0].clone(),
                            ix_axpy(og as i64, &idx[1], &idx[2]),
                            idx[3].clone(),
                        ],
                    };
                    let v = l.compute_at(end, &flat);
                    l.flat = None;
                    l.subst.remove(&n);
                    v
                }
                None => acc,
            };
            l.b.store(v, ov, idx)
        });
        if copied {
            self.b.dealloc(copy);
        }
        Ok(())
    }

    /// Whether an `o x p` product (`p` the pixels) `q` deep should run as
    /// `p x o`: its pixels leave at least a tenth of the vector panels
    /// empty (49 pixels in two panels of 32), the other orientation pads
    /// the register tiles at least a tenth less, and it is deep enough and
    /// wide enough to pay for storing its tiles transposed
    /// (`GemmBlocking::pixel_rows_min`, the target's). With an epilogue
    /// that reads a value per pixel and channel (a residual), which the
    /// transposed tiles read a lane per channel, at least a fifth: Zen 5,
    /// one thread then two, ResNet-50's 256 -> 1024 over 14 x 14 with its
    /// residual (196 pixels in 224) 0.494 -> 0.432 ms, 0.278 -> 0.257 as
    /// columns (without the residual 0.436 and 0.433 either way), where
    /// 512 -> 2048 over 7 x 7 with it stays rows (0.451 against 0.487).
    /// So on Zen 4 (one full-width FMA unit), since deep products read
    /// their pixels in place (`packed.rs`'s `columns_in_place`: no kernel
    /// packing them, one thread alone): node by node in the models (`dlc
    /// bench --profile`, four alternated rounds), EfficientNet-B0's 1152 ->
    /// 192 over 7 x 7 with a residual 0.27 -> 0.24 ms at one thread, 0.14
    /// -> 0.115 at two; MobileNetV2's 960 -> 160 0.187 -> 0.152 and 0.105
    /// -> 0.090; ResNet-50's 512 -> 2048 1.19-1.21 -> 1.15-1.18 (one
    /// thread). Pixels that would pad more than a fifth of the columns the
    /// product runs (`GemmBlocking::padded_columns`, its half-panel tile
    /// counted) take the rows from the shallower and narrower products of
    /// `GemmBlocking::few_pixel_rows_min` (Zen 4's 96 -> 576 over 7 x 7).
    /// The panels of `pixel_rows_min`'s test are the blocking's, against
    /// which its figures were measured (counting Zen 4's half-panel tile
    /// there, ResNet-50's 1024 -> 256s over 14 x 14 left the pixel rows
    /// and the model took 0.5% more at one thread, 1.7% at two).
    fn pixels_as_rows(&self, [o, p, q]: [usize; 3], dtype: DType, residual: bool) -> bool {
        if self.target.cpu().is_none() {
            return false;
        }
        let g = self.target.gemm_blocking(dtype);
        let padded = |rows: usize, cols: usize| {
            let (mr, nr) = g.register_tile(cols);
            rows.div_ceil(mr) * mr * cols.div_ceil(nr) * nr
        };
        let (d, c) = g.few_pixel_rows_min;
        let few_pixels = g.padded_columns(p) * 4 > p * 5 && q >= d && o >= c;
        let deep_and_wide = g.pixel_rows_min.iter().any(|&(d, c)| q >= d && o >= c);
        let (part, whole) = if residual { (4, 5) } else { (9, 10) };
        let (_, nr) = g.register_tile(p);
        let pads = p.next_multiple_of(nr) * part > p * whole;
        (few_pixels || deep_and_wide && pads) && padded(p, o) * 10 < padded(o, p) * 9
    }

    /// Whether `buf`'s elements are laid out row-major, as many as `shape`
    /// holds: whether [`Self::row_major_view`] gives a view.
    fn is_row_major(&self, buf: Value, shape: &[usize]) -> bool {
        match self.b.ty(buf) {
            dlc_loop::Type::Buffer(from) => {
                from.has_row_major_strides()
                    && from.shape.iter().product::<usize>() == shape.iter().product::<usize>()
            }
            _ => false,
        }
    }

    /// A row-major view of `buf` as `shape` (as many elements), or `None`
    /// when `buf`'s elements are not laid out row-major.
    fn row_major_view(&mut self, buf: Value, shape: &[usize]) -> Option<Value> {
        if !self.is_row_major(buf, shape) {
            return None;
        }
        let dlc_loop::Type::Buffer(from) = self.b.ty(buf).clone() else {
            return None;
        };
        let mut t = contiguous(&TensorType::new(from.dtype, shape.to_vec()));
        t.offset = from.offset;
        Some(self.b.view(buf, t))
    }

    /// The im2col buffer of `input` through `window` (the layout of a
    /// [`KernelGroupKind::Im2col`] group): `col[n, (c * KH + ky) * KW + kx,
    /// y * OX + x]` = `input[n, c, iy, ix]` where output `(y, x)` and tap
    /// `(ky, kx)` read, zero outside, for `[n, c] < sizes` and `[y, x] <
    /// out`. Channels are the outermost loop: the parallel loop has work
    /// even at batch 1.
    fn im2col_copy(
        &mut self,
        input: Value,
        window: &Window,
        [batch, c]: [usize; 2],
        [oy, ox]: [usize; 2],
        dtype: DType,
    ) -> Value {
        let [kh, kw] = window.kernel.map(|k| k as usize);
        let col = self.b.alloc(contiguous(&TensorType::new(
            dtype,
            vec![batch, c * kh * kw, oy * ox],
        )));
        let ivs = self.open_nest(&[c, batch, kh, kw, oy, ox]);
        let (ci, nb, ky, kx, y, xx) = (&ivs[0], &ivs[1], &ivs[2], &ivs[3], &ivs[4], &ivs[5]);
        let at = |a: usize, out: &IndexExpr, tap: &IndexExpr| {
            let tap = ix_axpy(window.dilation[a], tap, &ix_const(-window.padding[a]));
            ix_axpy(window.stride[a], out, &tap)
        };
        let v = self.b.load(
            input,
            vec![nb.clone(), ci.clone(), at(0, y, ky), at(1, xx, kx)],
            Some(0.0),
        );
        let row = ix_axpy((kh * kw) as i64, ci, &ix_axpy(kw as i64, ky, kx));
        let colx = ix_axpy(ox as i64, y, xx);
        self.b.store(v, col, vec![nb.clone(), row, colx]);
        self.close_nest(6);
        col
    }

    /// Stores the value `v` of node `n` at `idx`, applying its epilogue.
    fn sink(&mut self, n: NodeIndex, idx: &[IndexExpr], v: Value) {
        match self.plan[&n] {
            Plan::WithEpilogue(end) => {
                self.subst.insert(n, v);
                let w = self.compute_at(end, idx);
                self.subst.remove(&n);
                let buf = self.home[&end];
                self.b.store(w, buf, idx.to_vec());
            }
            _ => {
                let buf = self.home[&n];
                self.b.store(v, buf, idx.to_vec());
            }
        }
    }

    /// The value of node `n` at `idx`: substituted, loaded, or computed.
    fn value_at(&mut self, n: NodeIndex, idx: &[IndexExpr]) -> Value {
        if let Some(v) = self.subst.get(&n) {
            return *v;
        }
        if self.plan[&n] != Plan::Inline
            && let Some(&buf) = self.home.get(&n)
        {
            let buf = match &self.flat {
                Some(views) => views.get(&n).copied().unwrap_or(buf),
                None => buf,
            };
            return self.b.load(buf, idx.to_vec(), None);
        }
        self.compute_at(n, idx)
    }

    fn operand_at(&mut self, n: NodeIndex, k: usize, idx: &[IndexExpr]) -> Value {
        let o = self.operand(n, k);
        let (from, to) = (self.ty(o).shape.clone(), self.ty(n).shape.clone());
        let mapped = match self.flat {
            Some(_) => broadcast_index(idx, &flat_shape(&from), &flat_shape(&to)),
            None => broadcast_index(idx, &from, &to),
        };
        self.value_at(o, &mapped)
    }

    /// Computes an element-wise node at `idx` from its operands; its ops
    /// carry its source place.
    fn compute_at(&mut self, n: NodeIndex, idx: &[IndexExpr]) -> Value {
        let outer = self.b.set_loc(self.g.body[n].loc.clone());
        let v = self.compute_node_at(n, idx);
        self.b.set_loc(outer);
        v
    }

    fn compute_node_at(&mut self, n: NodeIndex, idx: &[IndexExpr]) -> Value {
        let dtype = self.ty(n).dtype;
        match self.op(n).clone() {
            Op::Constant(ConstValue::Splat(v)) => self.b.constant(v, dtype),
            Op::Unary(u) => {
                let x = self.operand_at(n, 0, idx);
                self.b.unary(u, x)
            }
            Op::Binary(op) => {
                let x = self.operand_at(n, 0, idx);
                let y = self.operand_at(n, 1, idx);
                self.b.binary(op, x, y)
            }
            Op::Compare(c) => {
                let x = self.operand_at(n, 0, idx);
                let y = self.operand_at(n, 1, idx);
                self.b.compare(c, x, y)
            }
            Op::Select => {
                let c = self.operand_at(n, 0, idx);
                let x = self.operand_at(n, 1, idx);
                let y = self.operand_at(n, 2, idx);
                self.b.select(c, x, y)
            }
            Op::Cast { to } => {
                let x = self.operand_at(n, 0, idx);
                self.b.cast(x, to)
            }
            // What it waits for is ordered before it by the graph's order;
            // its value is the operand's.
            Op::Broadcast { .. } | Op::Barrier => self.operand_at(n, 0, idx),
            Op::Transpose { perm } => {
                let mut src = vec![ix_const(0); perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    src[p] = idx[i].clone();
                }
                let o = self.operand(n, 0);
                self.value_at(o, &src)
            }
            Op::Slice { axis, start, .. } => {
                let mut src = idx.to_vec();
                src[axis] = ix_axpy(1, &idx[axis], &ix_const(start as i64));
                let o = self.operand(n, 0);
                self.value_at(o, &src)
            }
            Op::BatchNorm { eps } => {
                // f16/bf16: computed in f32, rounded once.
                let x = self.operand_at(n, 0, idx);
                let x = self.widen(x);
                let c = [idx[1].clone()];
                let stat = |l: &mut Self, k: usize| {
                    let o = l.operand(n, k);
                    let v = l.value_at(o, &c);
                    l.widen(v)
                };
                let (mean, var, gamma, beta) =
                    (stat(self, 1), stat(self, 2), stat(self, 3), stat(self, 4));
                let e = self.b.constant(eps, dtype.accumulator());
                let ve = self.b.binary(BinaryOp::Add, var, e);
                let inv = self.b.unary(UnaryOp::Rsqrt, ve);
                let scale = self.b.binary(BinaryOp::Mul, inv, gamma);
                let centered = self.b.binary(BinaryOp::Sub, x, mean);
                let scaled = self.b.binary(BinaryOp::Mul, centered, scale);
                let y = self.b.binary(BinaryOp::Add, scaled, beta);
                self.narrow(y, dtype)
            }
            // Stored nodes are read from their buffers; `value_at` only gets
            // here for element-wise ops.
            other => unreachable!("{} is not computed at an index", other.name()),
        }
    }

    fn reduce_identity(kind: ReduceKind, d: DType) -> f64 {
        kind.identity_in(d)
    }

    fn combine(&mut self, kind: ReduceKind, acc: Value, x: Value) -> Value {
        let op = match kind {
            ReduceKind::Sum | ReduceKind::Mean => BinaryOp::Add,
            ReduceKind::Max => BinaryOp::Max,
            ReduceKind::Min => BinaryOp::Min,
            ReduceKind::Prod => BinaryOp::Mul,
        };
        self.b.binary(op, acc, x)
    }

    /// `v` in the accumulator type of its element type: f16 and bf16 values
    /// become f32 (exactly), others are returned as they are.
    fn widen(&mut self, v: Value) -> Value {
        match *self.b.ty(v) {
            dlc_loop::Type::Scalar(d) if d.is_narrow_float() => self.b.cast(v, d.accumulator()),
            _ => v,
        }
    }

    /// `v`, computed in an accumulator type, rounded once to `d`.
    fn narrow(&mut self, v: Value, d: DType) -> Value {
        match *self.b.ty(v) {
            dlc_loop::Type::Scalar(from) if from != d => self.b.cast(v, d),
            _ => v,
        }
    }

    /// Reduces over `ranges` with `kind`; `body` gives the element at the
    /// reduction indices. The reduction of `dtype` values runs in
    /// `dtype.accumulator()` (f32 for f16/bf16), and so does the result:
    /// the caller rounds it to `dtype` with [`Self::narrow`] once it is done
    /// computing with it.
    fn reduce_loops(
        &mut self,
        kind: ReduceKind,
        dtype: DType,
        ranges: &[(i64, i64)],
        body: &mut dyn FnMut(&mut Self, &[IndexExpr]) -> Value,
    ) -> Value {
        let dtype = dtype.accumulator();
        let init = self.b.constant(Self::reduce_identity(kind, dtype), dtype);
        self.reduce_loops_from(kind, dtype, init, ranges, body)
    }

    /// [`Self::reduce_loops`] starting from `init`, of accumulator type
    /// `dtype`, rather than from the reduction's identity.
    fn reduce_loops_from(
        &mut self,
        kind: ReduceKind,
        dtype: DType,
        init: Value,
        ranges: &[(i64, i64)],
        body: &mut dyn FnMut(&mut Self, &[IndexExpr]) -> Value,
    ) -> Value {
        let mut ivs = Vec::new();
        let mut carried = init;
        for &(lo, hi) in ranges {
            let (iv, c) = self.b.begin_for(lo, hi, 1, &[carried]);
            ivs.push(ix(iv));
            carried = c[0];
        }
        let x = body(self, &ivs);
        let x = self.widen(x);
        let mut next = self.combine(kind, carried, x);
        for _ in ranges {
            next = self.b.end_for(vec![next])[0];
        }
        if kind == ReduceKind::Mean {
            let count: i64 = ranges.iter().map(|(lo, hi)| hi - lo).product();
            let c = self.b.constant(count as f64, dtype);
            next = self.b.binary(BinaryOp::Div, next, c);
        }
        next
    }

    fn emit_kernel(&mut self, n: NodeIndex) -> Result<(), LowerError> {
        match self.op(n).clone() {
            op if op.is_elementwise() && self.emit_flat_elementwise(n) => {}
            op if op.is_elementwise() => {
                let ty = self.ty(n).clone();
                let inner = self.innermost_axis(n);
                let idx = self.open_nest_inner(&ty.shape, inner);
                let v = self.compute_at(n, &idx);
                self.sink(n, &idx, v);
                self.close_nest(ty.rank());
            }
            Op::MatMul
                if self.ty(self.operand(n, 0)).rank() >= 2
                    && self.ty(self.operand(n, 1)).rank() >= 2
                    && self.row_by_matrix(n).is_none() =>
            {
                self.emit_batched_matmul(n)
            }
            Op::MatMul => self.emit_vector_product(n),
            Op::Reduce {
                kind,
                axes,
                keepdims,
            } => self.emit_reduce(n, kind, &axes, keepdims),
            Op::Softmax { axis } => self.emit_softmax(n, axis),
            Op::LayerNorm { axes, eps } => self.emit_layernorm(n, &axes, eps),
            Op::Conv2d { padding, .. }
                if dlc_graph::fusion::conv_as_winograd(self.g, n, self.target) =>
            {
                self.grouped(KernelGroupKind::Winograd, |l| l.conv_winograd(n, padding));
            }
            Op::Conv2d {
                stride,
                padding,
                dilation,
                ..
            } if self.conv_as_matmul(n)
                && matches!(self.b.ty(self.home[&self.operand(n, 1)]), dlc_loop::Type::Buffer(t) if t.is_contiguous()) =>
            {
                let kernel = self.ty(self.operand(n, 1)).shape[2..].to_vec();
                let window = conv_window([kernel[0], kernel[1]], &stride, &padding, dilation);
                if reads_in_place(&window) {
                    self.conv_im2col(n, &window)?;
                } else {
                    self.grouped(KernelGroupKind::Im2col(window), |l| {
                        l.conv_im2col(n, &window)
                    })?;
                }
            }
            // A 1 x 1 window reads one tap, whatever its dilation.
            Op::Conv2d {
                padding, groups: 1, ..
            } if dlc_graph::ops::conv_is_pixel(self.ty(n), self.ty(self.operand(n, 1))) => {
                self.emit_pixel_conv(n, padding)
            }
            Op::Conv2d {
                stride,
                padding,
                groups,
                dilation,
            } => self.emit_direct_conv(n, [stride, padding, dilation], groups),
            Op::Pool2d {
                kind: PoolKind::Max,
                kernel,
                stride,
                padding,
            } if kernel[0] > 1 && kernel[1] > 1 => {
                self.emit_separable_max_pool(n, kernel, stride, padding)
            }
            Op::Pool2d {
                kind,
                kernel,
                stride,
                padding,
            } => self.emit_pool(n, kind, kernel, stride, padding),
            Op::Concat { axis } => self.emit_concat(n, axis),
            Op::Gather { axis } => self.emit_gather(n, axis),
            Op::ScatterAdd { axis } => self.emit_scatter_add(n, axis),
            Op::Compute(body) => self.emit_compute(n, &body)?,
            other => {
                return Err(LowerError::Invalid(format!(
                    "{} has no loop nest",
                    other.name()
                )));
            }
        }
        Ok(())
    }

    /// A product of operands of rank 2 or more (batched, broadcasting
    /// their batch axes): [`Self::product`].
    fn emit_batched_matmul(&mut self, n: NodeIndex) {
        let ty = self.ty(n).clone();
        let dtype = ty.dtype;
        let (a, bn) = (self.operand(n, 0), self.operand(n, 1));
        let (ash, bsh) = (self.ty(a).shape.clone(), self.ty(bn).shape.clone());
        let nb = ty.rank() - 2;
        let batch_shape: Vec<usize> = ty.shape[..nb].to_vec();
        let (m, k, cols) = (ash[ash.len() - 2], ash[ash.len() - 1], bsh[bsh.len() - 1]);
        let (abuf, bbuf) = (self.home[&a], self.home[&bn]);
        self.product(
            &batch_shape,
            [m, cols, k],
            dtype,
            (abuf, &|batch, i, kk| {
                let mut v = broadcast_index(batch, &ash[..ash.len() - 2], &batch_shape);
                v.extend([i.clone(), kk.clone()]);
                v
            }),
            (bbuf, &|batch, kk, j| {
                let mut v = broadcast_index(batch, &bsh[..bsh.len() - 2], &batch_shape);
                v.extend([kk.clone(), j.clone()]);
                v
            }),
            &mut |l, idx, acc| l.sink(n, idx, acc),
        );
    }

    /// A product with a vector operand (rank 1): a sum per result element.
    /// For a product of one row by a matrix (`[1, K] @ [K, N]`, no batch;
    /// a linear layer or classifier at batch 1): whether the matrix's
    /// columns are contiguous along the depth (`Some(true)`: `x @
    /// transpose(w)`, a dot product of the row with each of `w`'s rows, one
    /// program per column) or its rows are (`Some(false)`: a weight stored
    /// `[K, N]`, tiles of columns each summing the matrix's rows scaled by
    /// the row's elements, see `loop_to_tile::vectorize`'s
    /// `vectorizable_outside`). Either reads the matrix once from start to
    /// end, where a packed product would copy every slice of it into panels
    /// to multiply them by one row (MobileNetV2's, V3's and EfficientNet's
    /// classifiers spent 6-15% of the network there).
    fn row_by_matrix(&self, n: NodeIndex) -> Option<bool> {
        let (a, b) = (self.operand(n, 0), self.operand(n, 1));
        let (ash, bsh) = (&self.ty(a).shape, &self.ty(b).shape);
        if ash.len() != 2 || bsh.len() != 2 || ash[0] != 1 || bsh[1] < 2 {
            return None;
        }
        match self.home.get(&b).map(|v| self.b.ty(*v)) {
            Some(dlc_loop::Type::Buffer(t)) if t.strides.first() == Some(&1) => Some(true),
            Some(dlc_loop::Type::Buffer(t)) if t.strides.get(1) == Some(&1) => Some(false),
            _ => None,
        }
    }

    fn emit_vector_product(&mut self, n: NodeIndex) {
        let ty = self.ty(n).clone();
        let dtype = ty.dtype;
        let (a, bn) = (self.operand(n, 0), self.operand(n, 1));
        let (ash, bsh) = (self.ty(a).shape.clone(), self.ty(bn).shape.clone());
        let k = ash[ash.len() - 1];
        let nb = ty.rank() - usize::from(ash.len() > 1) - usize::from(bsh.len() > 1);
        // Dot products along the depth run one per program; a row by a
        // matrix stored `[K, N]` keeps its columns a loop, made of tiles,
        // in chunks that are programs of their own on a CPU.
        // A matrix of weights alone is read from a copy whose chunks are
        // contiguous (`chunked_columns`), made once by the preparer.
        let chunks = match self.row_by_matrix(n) {
            Some(false) => Some(self.column_chunks(n)),
            _ => None,
        };
        let (idx, loops, chunked) = match chunks {
            Some(Some(chunks)) => {
                let copy = self.fixed(bn).then(|| self.chunked_columns(bn, chunks));
                let (idx, at) = self.open_column_chunks(ty.shape[1], chunks);
                (idx, 3, copy.map(|c| (c, at)))
            }
            Some(None) => (self.open_nest(&ty.shape), ty.rank(), None),
            None => (self.open_reduction_nest(&ty.shape), ty.rank(), None),
        };
        let batch = &idx[..nb];
        let m_pos = nb;
        let n_pos = nb + usize::from(ash.len() > 1);
        let abuf = self.home[&a];
        let bbuf = chunked.as_ref().map_or(self.home[&bn], |(c, _)| *c);
        let batch_shape: Vec<usize> = ty.shape[..nb].to_vec();
        let a_batch = if ash.len() > 2 {
            broadcast_index(batch, &ash[..ash.len() - 2], &batch_shape)
        } else {
            vec![]
        };
        let b_batch = if bsh.len() > 2 {
            broadcast_index(batch, &bsh[..bsh.len() - 2], &batch_shape)
        } else {
            vec![]
        };
        let idx2 = idx.clone();
        let acc = self.reduce_loops(ReduceKind::Sum, dtype, &[(0, k as i64)], &mut |l, kk| {
            let mut ai = a_batch.clone();
            if ash.len() > 1 {
                ai.push(idx2[m_pos].clone());
            }
            ai.push(kk[0].clone());
            let bi = match &chunked {
                Some((_, [chunk, column])) => vec![chunk.clone(), kk[0].clone(), column.clone()],
                None => {
                    let mut bi = b_batch.clone();
                    bi.push(kk[0].clone());
                    if bsh.len() > 1 {
                        bi.push(idx2[n_pos].clone());
                    }
                    bi
                }
            };
            let x = l.b.load(abuf, ai, None);
            let y = l.b.load(bbuf, bi, None);
            let (x, y) = (l.widen(x), l.widen(y));
            l.b.binary(BinaryOp::Mul, x, y)
        });
        let acc = self.narrow(acc, dtype);
        self.sink(n, &idx, acc);
        self.close_nest(loops);
    }

    /// Programs a row by a matrix stored `[K, N]` (`row_by_matrix`) takes
    /// its `N` columns in on a CPU: the fewest from
    /// [`TargetDesc::min_thread_iterations`] up that divide the columns
    /// into whole vectors (1000 columns: 25 programs of 40), or else into
    /// at least a vector each. As one program, a classifier's product
    /// (MobileNetV3-small's `[1, 1024] @ [1024, 1000]`, 4 MB read once)
    /// ran on one thread however many there were.
    fn column_chunks(&self, n: NodeIndex) -> Option<usize> {
        let columns = *self.ty(n).shape.last()?;
        let lanes = self.target.lanes(self.ty(n).dtype);
        let least = self.target.min_thread_iterations();
        self.target.cpu()?;
        let fits = |p: &usize, whole: bool| {
            columns.is_multiple_of(*p)
                && columns / p >= lanes
                && (!whole || (columns / p).is_multiple_of(lanes))
        };
        let range = least..=4 * least;
        range
            .clone()
            .find(|p| fits(p, true))
            .or_else(|| range.into_iter().find(|p| fits(p, false)))
    }

    /// The loops of a row by a matrix's `columns` in `chunks` programs:
    /// parallel over the row and the chunks, then the chunk's columns.
    /// Returns the result's index `[0, chunk * width + column]` and `[chunk,
    /// column]`; three loops to close.
    fn open_column_chunks(
        &mut self,
        columns: usize,
        chunks: usize,
    ) -> (Vec<IndexExpr>, [IndexExpr; 2]) {
        self.parallel.push(2);
        let row = ix(self.b.begin_parallel(0, 1));
        let chunk = ix(self.b.begin_parallel(0, chunks as i64));
        let width = columns / chunks;
        let column = ix(self.b.begin_for(0, width as i64, 1, &[]).0);
        let at = ix_axpy(width as i64, &chunk, &column);
        (vec![row, at], [chunk, column])
    }

    /// Whether node `n` is a weight, a constant, or computed from those
    /// alone.
    fn fixed(&self, n: NodeIndex) -> bool {
        self.bound.contains(&n)
            || match &self.g.body[n].op {
                Op::Param { index } => self.g.is_weight(*index as usize),
                Op::Constant(_) => true,
                _ => false,
            }
    }

    /// A copy of matrix `b` (`[K, N]`, of weights alone) as `[chunks, K, N /
    /// chunks]`: each of a row by a matrix's chunks of columns
    /// (`column_chunks`) is contiguous, where in place each of its rows is a
    /// few lines of a different page. The preparer makes it once
    /// (`dlc_tile::transforms::split_prepare`). MobileNetV3-small's
    /// classifier read its 4 MB in chunks of 40 columns, 160 bytes of each
    /// 4000-byte row.
    fn chunked_columns(&mut self, b: NodeIndex, chunks: usize) -> Value {
        let t = self.ty(b).clone();
        let (k, width) = (t.shape[0], t.shape[1] / chunks);
        let shape = [chunks, k, width];
        let buf = self
            .b
            .alloc(contiguous(&TensorType::new(t.dtype, shape.to_vec())));
        let idx = self.open_nest(&shape);
        let at = ix_axpy(width as i64, &idx[0], &idx[2]);
        let v = self.b.load(self.home[&b], vec![idx[1].clone(), at], None);
        self.b.store(v, buf, idx);
        self.close_nest(shape.len());
        self.held.push(buf);
        buf
    }

    /// A reduction over `axes`, per result element. Over trailing axes of
    /// a row-major operand, one loop over their elements as one row (a
    /// global average pool: a channel's 14 x 14 pixels were 14 rows of 14,
    /// each summed across its lanes, 2.3x onnxruntime's time).
    fn emit_reduce(&mut self, n: NodeIndex, kind: ReduceKind, axes: &[usize], keepdims: bool) {
        let ty = self.ty(n).clone();
        let dtype = ty.dtype;
        let x = self.operand(n, 0);
        let xsh = self.ty(x).shape.clone();
        let xbuf = self.home[&x];
        let rank = xsh.len();
        let mut sorted = axes.to_vec();
        sorted.sort_unstable();
        let trailing = sorted.len() > 1 && sorted.iter().copied().eq(rank - sorted.len()..rank);
        if trailing {
            let outer = rank - sorted.len();
            let mut flat = xsh[..outer].to_vec();
            flat.push(xsh[outer..].iter().product());
            if let Some(view) = self.row_major_view(xbuf, &flat) {
                let idx = self.open_nest(&ty.shape);
                let lead = idx[..outer].to_vec();
                let v = self.reduce_loops(kind, dtype, &[(0, flat[outer] as i64)], &mut |l, r| {
                    let mut xi = lead.clone();
                    xi.push(r[0].clone());
                    l.b.load(view, xi, None)
                });
                let v = self.narrow(v, dtype);
                self.sink(n, &idx, v);
                self.close_nest(ty.rank());
                return;
            }
        }
        let idx = self.open_nest(&ty.shape);
        let ranges: Vec<(i64, i64)> = axes.iter().map(|&a| (0, xsh[a] as i64)).collect();
        let idx2 = idx.clone();
        let v = self.reduce_loops(kind, dtype, &ranges, &mut |l, r| {
            let mut xi = Vec::new();
            let (mut out_pos, mut red_pos) = (0, 0);
            for axis in 0..xsh.len() {
                if axes.contains(&axis) {
                    xi.push(r[red_pos].clone());
                    red_pos += 1;
                    if keepdims {
                        out_pos += 1;
                    }
                } else {
                    xi.push(idx2[out_pos].clone());
                    out_pos += 1;
                }
            }
            l.b.load(xbuf, xi, None)
        });
        let v = self.narrow(v, dtype);
        self.sink(n, &idx, v);
        self.close_nest(ty.rank());
    }

    /// Softmax along `axis`: the maximum, the sum of exponentials, then
    /// each element, per row.
    fn emit_softmax(&mut self, n: NodeIndex, axis: usize) {
        let ty = self.ty(n).clone();
        let dtype = ty.dtype;
        let x = self.operand(n, 0);
        let xbuf = self.home[&x];
        let mut outer = ty.shape.clone();
        let extent = outer.remove(axis) as i64;
        let oidx = self.open_nest(&outer);
        let full = |j: &IndexExpr| {
            let mut v = oidx.clone();
            v.insert(axis, j.clone());
            v
        };
        // f16/bf16: computed in f32 throughout, rounded once.
        let m = self.reduce_loops(ReduceKind::Max, dtype, &[(0, extent)], &mut |l, j| {
            l.b.load(xbuf, full(&j[0]), None)
        });
        // With a result buffer of its own in f32, the exponentials
        // are stored there as they are summed and scaled in place
        // (one exponential per element, not two); otherwise they
        // are computed again where the result is written.
        let own = match self.plan[&n] {
            Plan::WithEpilogue(_) => None,
            _ if dtype == dtype.accumulator() => self.home.get(&n).copied(),
            _ => None,
        };
        let s = self.reduce_loops(ReduceKind::Sum, dtype, &[(0, extent)], &mut |l, j| {
            let xv = l.b.load(xbuf, full(&j[0]), None);
            let xv = l.widen(xv);
            let d = l.b.binary(BinaryOp::Sub, xv, m);
            let e = l.b.unary(UnaryOp::Exp, d);
            if let Some(buf) = own {
                l.b.store(e, buf, full(&j[0]));
            }
            e
        });
        // One division per row, a multiplication per element (a
        // vector division costs as much as the exponential).
        let one = self.b.constant(1.0, dtype.accumulator());
        let inv = self.b.binary(BinaryOp::Div, one, s);
        let (j, _) = self.b.begin_for(0, extent, 1, &[]);
        let at = full(&ix(j));
        let e = match own {
            Some(buf) => self.b.load(buf, at.clone(), None),
            None => {
                let xv = self.b.load(xbuf, at.clone(), None);
                let xv = self.widen(xv);
                let d = self.b.binary(BinaryOp::Sub, xv, m);
                self.b.unary(UnaryOp::Exp, d)
            }
        };
        let v = self.b.binary(BinaryOp::Mul, e, inv);
        let v = self.narrow(v, dtype);
        self.sink(n, &at, v);
        self.b.end_for(vec![]);
        self.close_nest(outer.len());
    }

    /// Layer normalization over `axes`: the mean, the variance, then each
    /// element, per row.
    fn emit_layernorm(&mut self, n: NodeIndex, axes: &[usize], eps: f64) {
        let ty = self.ty(n).clone();
        let dtype = ty.dtype;
        let x = self.operand(n, 0);
        let xbuf = self.home[&x];
        let outer: Vec<usize> = (0..ty.rank())
            .filter(|a| !axes.contains(a))
            .map(|a| ty.shape[a])
            .collect();
        let ranges: Vec<(i64, i64)> = axes.iter().map(|&a| (0, ty.shape[a] as i64)).collect();
        let oidx = self.open_nest(&outer);
        let rank = ty.rank();
        let full = |inner: &[IndexExpr]| {
            let (mut o, mut i) = (0, 0);
            (0..rank)
                .map(|a| {
                    if axes.contains(&a) {
                        i += 1;
                        inner[i - 1].clone()
                    } else {
                        o += 1;
                        oidx[o - 1].clone()
                    }
                })
                .collect::<Vec<_>>()
        };
        let mean = self.reduce_loops(ReduceKind::Mean, dtype, &ranges, &mut |l, r| {
            l.b.load(xbuf, full(r), None)
        });
        let var = self.reduce_loops(ReduceKind::Mean, dtype, &ranges, &mut |l, r| {
            let xv = l.b.load(xbuf, full(r), None);
            let xv = l.widen(xv);
            let d = l.b.binary(BinaryOp::Sub, xv, mean);
            l.b.binary(BinaryOp::Mul, d, d)
        });
        let e = self.b.constant(eps, dtype.accumulator());
        let ve = self.b.binary(BinaryOp::Add, var, e);
        let inv = self.b.unary(UnaryOp::Rsqrt, ve);
        let mut inner = Vec::new();
        for &(lo, hi) in &ranges {
            inner.push(ix(self.b.begin_for(lo, hi, 1, &[]).0));
        }
        let at = full(&inner);
        let xv = self.b.load(xbuf, at.clone(), None);
        let xv = self.widen(xv);
        let d = self.b.binary(BinaryOp::Sub, xv, mean);
        let v = self.b.binary(BinaryOp::Mul, d, inv);
        let v = self.narrow(v, dtype);
        self.sink(n, &at, v);
        for _ in &ranges {
            self.b.end_for(vec![]);
        }
        self.close_nest(outer.len());
    }

    /// An element-wise node over small images (`[N, C, H, W]`, rows
    /// narrower than `FLAT_WIDTH`) whose nest and epilogue read only values
    /// spanning both of the image's axes or neither
    /// (`fusion::flat_elementwise_reads`), all laid out row-major: its nest
    /// runs over `[N, C, H*W]`, reading and writing through views of that
    /// shape, so a 7 x 7 image is one row of 49 lanes (and what is computed
    /// per channel, a squeeze-excite gate's sigmoid, once per channel)
    /// rather than seven rows of 7. Returns whether it did.
    fn emit_flat_elementwise(&mut self, n: NodeIndex) -> bool {
        let ty = self.ty(n).clone();
        let [_, _, h, w] = ty.shape[..] else {
            return false;
        };
        // Over single pixels (a squeeze-excite scale folded into `[O, C, 1,
        // 1]` weights) the flat nest's innermost loop would be one pixel;
        // the nest along the channels vectorizes.
        if w >= FLAT_WIDTH || h * w == 1 {
            return false;
        }
        let end = match self.plan[&n] {
            Plan::WithEpilogue(end) => end,
            _ => n,
        };
        let Some(reads) = dlc_graph::fusion::flat_elementwise_reads(self.g, &self.plan, n, end)
        else {
            return false;
        };
        let flat = flat_shape(&ty.shape);
        let Some((views, out)) = self.flat_views(reads, end, &flat) else {
            return false;
        };
        let idx = self.open_nest(&flat);
        self.flat = Some(views);
        let v = self.compute_at(n, &idx);
        let v = if end == n {
            v
        } else {
            self.subst.insert(n, v);
            let w = self.compute_at(end, &idx);
            self.subst.remove(&n);
            w
        };
        self.flat = None;
        self.b.store(v, out, idx);
        self.close_nest(flat.len());
        true
    }

    /// A pixel convolution (`dlc_graph::ops::conv_is_pixel`): per image
    /// and output channel, the dot product of the channel's weights with
    /// the input's channels at the window's one tap (the image's first
    /// pixel, or padding), vectorized along the channels, one per program,
    /// as a row by a matrix is. As a product it was a `[O, C] @ [C, 1]`
    /// whose tiles ran along the rows, each lane reading a row of the
    /// weights `C` floats from the next: 13 us for MobileNetV3's `576 x
    /// 144`, 3.7 as dot products.
    fn emit_pixel_conv(&mut self, n: NodeIndex, padding: [usize; 2]) {
        let ty = self.ty(n).clone();
        let dtype = ty.dtype;
        let (x, w) = (self.operand(n, 0), self.operand(n, 1));
        let (xbuf, wbuf) = (self.home[&x], self.home[&w]);
        let c = self.ty(w).shape[1];
        let idx = self.open_reduction_nest(&ty.shape);
        let (nb, o) = (idx[0].clone(), idx[1].clone());
        let tap = [-(padding[0] as i64), -(padding[1] as i64)];
        let pad = (padding != [0, 0]).then_some(0.0);
        let acc = self.reduce_loops(ReduceKind::Sum, dtype, &[(0, c as i64)], &mut |l, r| {
            let xv = l.b.load(
                xbuf,
                vec![nb.clone(), r[0].clone(), ix_const(tap[0]), ix_const(tap[1])],
                pad,
            );
            let wv = l.b.load(
                wbuf,
                vec![o.clone(), r[0].clone(), ix_const(0), ix_const(0)],
                None,
            );
            let (xv, wv) = (l.widen(xv), l.widen(wv));
            l.b.binary(BinaryOp::Mul, xv, wv)
        });
        let acc = self.narrow(acc, dtype);
        self.sink(n, &idx, acc);
        self.close_nest(ty.rank());
    }

    /// A convolution neither Winograd nor im2col takes: a sum over input
    /// channels and the window per output element. On a CPU without mask
    /// registers, a padded one whose middle columns fill at least
    /// [`DIRECT_CONV_SPLIT_VECTORS`] vectors runs each output axis in up to
    /// three ranges (see [`inside_ranges`]): the window of an output in the
    /// middle ranges of both axes lies in the input, and its loads are plain
    /// ones; only the borders' are padded (a padded load is a bounds test
    /// per lane, which AVX2 makes comparing four 64-bit lanes at a time).
    /// On a CPU, a depthwise convolution strided along its columns reads
    /// each channel through a padded copy split into the stride's phases
    /// (see [`Self::phase_copy`]), so that no load of its window is padded
    /// or strided. `[stride, padding, dilation]` are the window's; a window
    /// dilated along its columns takes the phases only at stride 1 there.
    fn emit_direct_conv(
        &mut self,
        n: NodeIndex,
        [stride, padding, dilation]: [[usize; 2]; 3],
        groups: usize,
    ) {
        let ty = self.ty(n).clone();
        let x = self.operand(n, 0);
        let (xs, ws) = (
            self.ty(x).shape.clone(),
            self.ty(self.operand(n, 1)).shape.clone(),
        );
        let og = ws[0] / groups;
        // The input positions a window spans along each axis.
        let span: [usize; 2] = std::array::from_fn(|a| dilation[a] * (ws[2 + a] - 1) + 1);
        // Loops n, g, o-in-group, y, x so that o = g * og + oi stays affine.
        let shape = [ty.shape[0], groups, og, ty.shape[2], ty.shape[3]];
        let parallel = parallel_loops(&shape, self.target);
        let lanes = self.target.lanes(DType::F32);
        let padded_copy = self.target.cpu().is_some_and(|c| !c.mask_registers())
            && stride[1] == 1
            && padding[1] > 0
            && (lanes + 1..=PADDED_COPY_MAX_VECTORS * lanes).contains(&ty.shape[3]);
        let phased = self.target.cpu().is_some()
            && (stride[1] > 1 || padded_copy)
            && (stride[1] == 1 || dilation[1] == 1)
            && ws[3] > 1
            && ws[1] == 1
            && og == 1
            && ws[0] == xs[1];
        let whole = |a: usize| vec![(0, shape[3 + a], padding[a] > 0 && !phased)];
        let mut ranges: [Vec<(usize, usize, bool)>; 2] = [whole(0), whole(1)];
        if !phased && self.target.cpu().is_some_and(|c| !c.mask_registers()) {
            // The border columns at least a vector wide, so that they too
            // run as tiles of columns (a lone column would be a tile of
            // its window's taps, reduced).
            let split: [_; 2] = std::array::from_fn(|a| {
                let border = if a == 1 { lanes } else { 1 };
                let geometry = (xs[2 + a], span[a], stride[a], padding[a]);
                inside_ranges(shape[3 + a], geometry, border)
            });
            let inner = split[1].iter().find(|r| !r.2).map_or(0, |r| r.1 - r.0);
            if inner >= DIRECT_CONV_SPLIT_VECTORS * lanes {
                ranges = split;
            }
        }
        let deferred = self.deferred_epilogue(n);
        let phases = phased.then(|| {
            let geometry = [0, 1].map(|a| (span[a], stride[a]));
            self.phase_buffer(x, geometry, padding, [shape[3], shape[4]])
        });
        self.parallel.push(parallel);
        let outer: Vec<IndexExpr> = (0..3)
            .map(|i| {
                ix(if i < parallel {
                    self.b.begin_parallel(0, shape[i] as i64)
                } else {
                    self.b.begin_for(0, shape[i] as i64, 1, &[]).0
                })
            })
            .collect();
        let raw = deferred.as_ref().map(|d| self.home[&d.end]);
        // A channel's copy past the L1 is copied a few rows at a time, just
        // before the output row that first reads them (`rolling`), where
        // every such row lies in the input: copied whole, its first rows
        // were out of the L1 before its windows read them.
        let lead = span[0].saturating_sub(stride[0]);
        let elem = self.ty(x).dtype.size_bytes();
        let rolling = phases.filter(|p| {
            let bytes = p.rows * stride[1] * p.cols * elem;
            self.target.cpu().is_some_and(|c| bytes > c.l1_bytes)
                && span[0] >= stride[0]
                && lead >= padding[0]
                && p.rows <= xs[2] + padding[0]
        });
        if let Some(buf) = phases {
            let rows = if rolling.is_some() { lead } else { buf.rows };
            self.phase_copy(buf, [&outer[0], &outer[1]], 0..rows);
        }
        for &(ylo, yhi, ypad) in &ranges[0] {
            let oy = ix(self.b.begin_for(ylo as i64, yhi as i64, 1, &[]).0);
            if let Some(buf) = rolling {
                for t in 0..stride[0] {
                    let r = ix_axpy(stride[0] as i64, &oy, &ix_const((lead + t) as i64));
                    let at = [&outer[0], &outer[1]];
                    self.phase_copy_row(buf, at, &r, true);
                }
            }
            for &(xlo, xhi, xpad) in &ranges[1] {
                let ox = ix(self.b.begin_for(xlo as i64, xhi as i64, 1, &[]).0);
                let at = [&outer[0], &outer[1], &outer[2], &oy, &ox];
                let read = match phases {
                    Some(p) => ConvRead::Phases(p.buf),
                    None => ConvRead::Padded(ypad || xpad),
                };
                self.direct_conv_at(n, at, [stride, padding, dilation], read, raw);
                self.b.end_for(vec![]);
            }
            self.b.end_for(vec![]);
        }
        if let Some(d) = deferred {
            // The epilogue over the channel's plane just written, as one
            // row of its pixels.
            let oc = ix_axpy(og as i64, &outer[1], &outer[2]);
            let pixels = ty.shape[2] * ty.shape[3];
            let p = ix(self.b.begin_for(0, pixels as i64, 1, &[]).0);
            let idx = vec![outer[0].clone(), oc, p];
            let v = self.b.load(d.out, idx.clone(), None);
            self.flat = Some(d.views);
            self.subst.insert(n, v);
            let w = self.compute_at(d.end, &idx);
            self.subst.remove(&n);
            self.flat = None;
            self.b.store(w, d.out, idx);
            self.b.end_for(vec![]);
        }
        self.close_nest(3);
    }

    /// The buffer a depthwise convolution strided along its columns reads
    /// input `x` through (`geometry`: each spatial axis's taps and stride;
    /// `padding`: the input's; `out`: the result's extents): `[N, C, rows,
    /// stride, columns]`, each channel's rows split into the column stride's
    /// phases, padded (filled by [`Self::phase_copy`]). Row `stride * oy + ky` of phase `kx %
    /// stride` from column `ox + kx / stride` is then tap `(ky, kx)` of
    /// output `(oy, ox)`: a window's loads are plain vectors along the
    /// output's columns, where each was a padded load of lanes `stride`
    /// apart (on AVX2, for a 5 x 5 window at stride 2, four masked loads and
    /// four shuffles per tap).
    fn phase_buffer(
        &mut self,
        x: NodeIndex,
        [(kh, sy), (kw, sx)]: [(usize, usize); 2],
        padding: [usize; 2],
        out: [usize; 2],
    ) -> PhaseBuffer {
        let xt = self.ty(x).clone();
        let rows = (out[0] - 1) * sy + kh;
        let cols = out[1] + (kw - 1) / sx;
        // Each phase's row is held in whole vectors (the columns past `cols`
        // never written nor used), so that a window's row whose width is
        // not a whole number of vectors loads its last one whole (the tile
        // codegen's `widened_loads`) and takes its taps from whole vectors:
        // a row of 30 of a 5 x 5 window into 28 columns was loaded as 16,
        // 8, 4 and 2 lanes and its taps rebuilt from them by some forty
        // shuffles a row, against six (5 x 5 at stride 2 over 56 x 56 x 144
        // 0.25 -> 0.19 ms; 3 x 3 into 14 x 14 x 240 0.071 -> 0.057).
        let stored = cols.next_multiple_of(self.target.lanes(xt.dtype));
        let buf = self.b.alloc(contiguous(&TensorType::new(
            xt.dtype,
            vec![xt.shape[0], xt.shape[1], rows, sx, stored],
        )));
        PhaseBuffer {
            buf,
            rows,
            cols,
            x,
            sx,
            padding,
        }
    }

    /// Fills `rows` of channel `c` of image `nb` of `buf`, a
    /// [`Self::phase_buffer`] of `x` at column stride `sx`: element `[nb, c,
    /// r, p, j]` is the input at row `r - padding[0]` and column
    /// `sx * j + p - padding[1]`, zero outside. Run in the convolution's
    /// loop over the channels, just before the channel's windows, so that
    /// it stays in cache for them; a copy past the L1 is filled a few rows
    /// at a time in the loop over output rows instead
    /// ([`Self::phase_copy_row`], before the first output row that reads
    /// them: 3 x 3 at stride 2 over 112 x 112 x 96, 0.250 -> 0.234 ms
    /// alone, 0.48 -> 0.33-0.39 ms in MobileNetV2 by `perf`, where its input
    /// comes from L3).
    /// The rows of padding are stored zeros, and each phase is a loop of
    /// its own, so that the rows between load with no bounds test on the
    /// row (one loop over the phases tested both on every row: two thirds
    /// of a 5 x 5 stride-2 convolution's time was its copy); each phase's
    /// columns inside the input are a loop of plain loads and those
    /// outside stored zeros (a padded load of the row was masked loads of
    /// all of it at stride 2: 3 x 3 over 56 x 56 x 144 at stride 2 0.098 ->
    /// 0.088 ms, EfficientNet-B0 2% faster).
    fn phase_copy(&mut self, buf: PhaseBuffer, at: [&IndexExpr; 2], rows: std::ops::Range<usize>) {
        let (height, padding) = (self.ty(buf.x).shape[2], buf.padding);
        let inside = padding[0].clamp(rows.start, rows.end)
            ..(height + padding[0]).clamp(rows.start, rows.end);
        let bands = [
            (rows.start, inside.start, false),
            (inside.start, inside.end, true),
            (inside.end, rows.end, false),
        ];
        for (lo, hi, read) in bands {
            if lo >= hi {
                continue;
            }
            let r = ix(self.b.begin_for(lo as i64, hi as i64, 1, &[]).0);
            self.phase_copy_row(buf, at, &r, read);
            self.b.end_for(vec![]);
        }
    }

    /// Row `r` of channel `c` of image `nb` of `buf` (see
    /// [`Self::phase_copy`]): each phase's columns inside the input loaded
    /// where `read` (the row lies in the input), zeros elsewhere.
    fn phase_copy_row(
        &mut self,
        PhaseBuffer {
            buf,
            cols,
            x,
            sx,
            padding,
            ..
        }: PhaseBuffer,
        [nb, c]: [&IndexExpr; 2],
        r: &IndexExpr,
        read: bool,
    ) {
        let xbuf = self.home[&x];
        let xt = self.ty(x);
        let (width, dtype) = (xt.shape[3], xt.dtype);
        for p in 0..sx {
            // The columns of phase `p` inside the input, read with plain
            // loads; those before and after are zeros (a padded load tested
            // every lane of the row: masked loads of the whole row at
            // stride 2).
            let (first, last) = (p as i64 - padding[1] as i64, width as i64 - 1);
            let inside = if read {
                let lo = (first.min(0).unsigned_abs().div_ceil(sx as u64) as i64).min(cols as i64);
                let hi = if last < first {
                    lo
                } else {
                    ((last - first) / sx as i64 + 1).clamp(lo, cols as i64)
                };
                lo..hi
            } else {
                0..0
            };
            let parts = [
                (0, inside.start, false),
                (inside.start, inside.end, true),
                (inside.end, cols as i64, false),
            ];
            for (jlo, jhi, load) in parts {
                if jlo >= jhi {
                    continue;
                }
                let j = ix(self.b.begin_for(jlo, jhi, 1, &[]).0);
                let v = if load {
                    let iy = ix_axpy(1, r, &ix_const(-(padding[0] as i64)));
                    let ixx = ix_axpy(sx as i64, &j, &ix_const(first));
                    self.b
                        .load(xbuf, vec![nb.clone(), c.clone(), iy, ixx], None)
                } else {
                    self.b.constant(0.0, dtype)
                };
                let at = vec![nb.clone(), c.clone(), r.clone(), ix_const(p as i64), j];
                self.b.store(v, buf, at);
                self.b.end_for(vec![]);
            }
        }
    }

    /// Whether direct convolution `n` computes its epilogue after each
    /// output channel's plane rather than at each output row: where the
    /// epilogue has a long chain of dependent instructions (a sigmoid's
    /// range reduction, polynomial, scaling and division:
    /// `UnaryOp::is_long_latency`), at a row it is a few vectors that the
    /// next row's window waits behind, while over the plane (just written,
    /// in cache) it is a loop of independent vectors. A short epilogue
    /// (ReLU6) stays at the row: a second pass over the plane cost more than
    /// it saved. Returns the epilogue's end, its result viewed `[N, O, Y *
    /// X]` and what it reads viewed so (`fusion::flat_epilogue_reads`).
    fn deferred_epilogue(&mut self, n: NodeIndex) -> Option<DeferredEpilogue> {
        let Plan::WithEpilogue(end) = self.plan[&n] else {
            return None;
        };
        let ty = self.ty(n).clone();
        if self.target.cpu().is_none()
            || self.ty(end).dtype != ty.dtype
            || !self.long_latency_between(n, end)
        {
            return None;
        }
        let reads = dlc_graph::fusion::flat_epilogue_reads(self.g, &self.plan, n, end)?;
        let (views, out) = self.flat_views(reads, end, &flat_shape(&ty.shape))?;
        Some(DeferredEpilogue { end, out, views })
    }

    /// Row-major views of what `reads` hold and of `end`'s result, with
    /// their spatial axes made one (`flat_shape`; `flat` is the result's),
    /// or `None` where one is not laid out row-major. Every buffer is checked
    /// before any view is made, so that a nest that cannot run flat leaves
    /// no unused views behind.
    fn flat_views(
        &mut self,
        reads: impl IntoIterator<Item = NodeIndex>,
        end: NodeIndex,
        flat: &[usize],
    ) -> Option<(HashMap<NodeIndex, Value>, Value)> {
        let mut buffers = Vec::new();
        for r in reads {
            buffers.push((r, *self.home.get(&r)?, flat_shape(&self.ty(r).shape)));
        }
        let result = self.home[&end];
        if !self.is_row_major(result, flat)
            || !buffers
                .iter()
                .all(|(_, b, shape)| self.is_row_major(*b, shape))
        {
            return None;
        }
        let mut views = HashMap::new();
        for (r, b, shape) in buffers {
            views.insert(r, self.row_major_view(b, &shape)?);
        }
        Some((views, self.row_major_view(result, flat)?))
    }

    /// Whether an op of the epilogue from `n` to `end` (the nodes computed
    /// at its index, not those it reads from memory) is long-latency.
    fn long_latency_between(&self, n: NodeIndex, end: NodeIndex) -> bool {
        let mut stack = vec![end];
        let mut seen = std::collections::HashSet::new();
        while let Some(v) = stack.pop() {
            if v == n || !seen.insert(v) {
                continue;
            }
            if v != end && self.plan[&v] != Plan::Inline && self.home.contains_key(&v) {
                continue;
            }
            match self.op(v) {
                Op::Unary(u) if u.is_long_latency() => return true,
                Op::Binary(b) if b.is_long_latency() => return true,
                _ => {}
            }
            stack.extend(self.g.operands(v).iter().map(|o| o.node));
        }
        false
    }

    /// The body of a direct convolution's nest at output `[nb, g, oi, oy,
    /// ox]` (output channel `g * og + oi`): its sum, its epilogue and its
    /// store, the input read as `read` says.
    fn direct_conv_at(
        &mut self,
        n: NodeIndex,
        [nb, g, oi, oy, ox]: [&IndexExpr; 5],
        [stride, padding, dilation]: [[usize; 2]; 3],
        read: ConvRead,
        raw: Option<Value>,
    ) {
        let dtype = self.ty(n).dtype;
        let (x, w) = (self.operand(n, 0), self.operand(n, 1));
        let (xbuf, wbuf) = (self.home[&x], self.home[&w]);
        let wsh = self.ty(w).shape.clone();
        let (cg, kh, kw) = (wsh[1], wsh[2], wsh[3]);
        let og = self.ty(n).shape[1] / (self.ty(x).shape[1] / cg);
        let oc = ix_axpy(og as i64, g, oi);
        let (nb2, g2, oy2, ox2, oc2) = (nb.clone(), g.clone(), oy.clone(), ox.clone(), oc.clone());
        let pad = match read {
            ConvRead::Phases(phases) => {
                let at = [nb, g, oy, ox, &oc];
                let window = [stride, dilation];
                let acc = self.phased_window([phases, wbuf], at, window, [kh, kw], dtype);
                self.store_conv(n, [nb, &oc, oy, ox], acc, raw);
                return;
            }
            ConvRead::Padded(padded) => padded.then_some(0.0),
        };
        let tap = move |l: &mut Self, c: &IndexExpr, ky: &IndexExpr, kx: &IndexExpr| {
            let xc = ix_axpy(cg as i64, &g2, c);
            let iy = dilated_index(stride[0], &oy2, (dilation[0], ky), padding[0]);
            let ixx = dilated_index(stride[1], &ox2, (dilation[1], kx), padding[1]);
            let xv = l.b.load(xbuf, vec![nb2.clone(), xc, iy, ixx], pad);
            let wv = l.b.load(
                wbuf,
                vec![oc2.clone(), c.clone(), ky.clone(), kx.clone()],
                None,
            );
            let (xv, wv) = (l.widen(xv), l.widen(wv));
            l.b.binary(BinaryOp::Mul, xv, wv)
        };
        // A window wider than one column sums each of its rows on its own,
        // from zero, and then the rows' sums: one chain of multiply-adds
        // through the whole window waited on each one's latency (a 5 x 5
        // depthwise window over a 7-wide row: 25 dependent FMAs a row).
        let acc = if kw > 1 {
            let outer = [(0, cg as i64), (0, kh as i64)];
            self.reduce_loops(ReduceKind::Sum, dtype, &outer, &mut |l, r| {
                let (c, ky) = (r[0].clone(), r[1].clone());
                l.reduce_loops(ReduceKind::Sum, dtype, &[(0, kw as i64)], &mut |l, r| {
                    tap(l, &c, &ky, &r[0])
                })
            })
        } else {
            let ranges = [(0, cg as i64), (0, kh as i64), (0, kw as i64)];
            self.reduce_loops(ReduceKind::Sum, dtype, &ranges, &mut |l, r| {
                tap(l, &r[0], &r[1], &r[2])
            })
        };
        self.store_conv(n, [nb, &oc, oy, ox], acc, raw);
    }

    /// Stores direct convolution `n`'s sum `acc` at output `[nb, oc, oy,
    /// ox]`, rounded to its type: with its epilogue, or as it is into `raw`
    /// where the epilogue runs after (`deferred_epilogue`).
    fn store_conv(&mut self, n: NodeIndex, at: [&IndexExpr; 4], acc: Value, raw: Option<Value>) {
        let acc = self.narrow(acc, self.ty(n).dtype);
        let at: Vec<IndexExpr> = at.into_iter().cloned().collect();
        match raw {
            Some(buf) => self.b.store(acc, buf, at),
            None => self.sink(n, &at, acc),
        }
    }

    /// The sum of a depthwise window at output `(oy, ox)` of channel `c`
    /// read from its [`Self::phase_copy`]: each row's taps in one loop per
    /// phase (taps `p, p + stride, ..` of row `ky` are phase `p` of copy row
    /// `stride * oy + ky` from column `ox`), each row summed from zero as
    /// `direct_conv_at` sums them (its phases one sum), then the rows. A
    /// window dilated along its columns (at stride 1 there, one phase)
    /// reads its taps `dilation[1]` columns apart, and along its rows
    /// `dilation[0]` rows apart.
    fn phased_window(
        &mut self,
        [phases, wbuf]: [Value; 2],
        [nb, c, oy, ox, oc]: [&IndexExpr; 5],
        [stride, dilation]: [[usize; 2]; 2],
        [kh, kw]: [usize; 2],
        dtype: DType,
    ) -> Value {
        let (nb, c, oy, ox, oc) = (nb.clone(), c.clone(), oy.clone(), ox.clone(), oc.clone());
        self.reduce_loops(ReduceKind::Sum, dtype, &[(0, kh as i64)], &mut |l, r| {
            let ky = r[0].clone();
            let row = dilated_index(stride[0], &oy, (dilation[0], &ky), 0);
            let phase = |l: &mut Self, p: usize, from: Value| {
                let taps = (kw - p).div_ceil(stride[1]) as i64;
                let acc = dtype.accumulator();
                l.reduce_loops_from(ReduceKind::Sum, acc, from, &[(0, taps)], &mut |l, a| {
                    let col = ix_axpy(dilation[1] as i64, &a[0], &ox);
                    let kx = ix_axpy(stride[1] as i64, &a[0], &ix_const(p as i64));
                    let xv = l.b.load(
                        phases,
                        vec![nb.clone(), c.clone(), row.clone(), ix_const(p as i64), col],
                        None,
                    );
                    let wv =
                        l.b.load(wbuf, vec![oc.clone(), ix_const(0), ky.clone(), kx], None);
                    let (xv, wv) = (l.widen(xv), l.widen(wv));
                    l.b.binary(BinaryOp::Mul, xv, wv)
                })
            };
            // The row's phases one after the other in one sum (a sum of
            // each from zero, added, was an addition a phase for nothing:
            // 3 x 3 at stride 2 over 56 x 56 x 144 0.085 -> 0.082 ms).
            let zero = l.b.constant(0.0, dtype.accumulator());
            let mut sum = zero;
            for p in 0..stride[1].min(kw) {
                sum = phase(l, p, sum);
            }
            sum
        })
    }

    /// Max or average pooling over each window (a max pool whose window
    /// spans rows and columns is [`Self::emit_separable_max_pool`]'s).
    fn emit_pool(
        &mut self,
        n: NodeIndex,
        kind: PoolKind,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) {
        let ty = self.ty(n).clone();
        let dtype = ty.dtype;
        let x = self.operand(n, 0);
        let xbuf = self.home[&x];
        let idx = self.open_nest(&ty.shape);
        let (rk, pad) = match kind {
            PoolKind::Max => (ReduceKind::Max, f64::NEG_INFINITY),
            PoolKind::Avg => (ReduceKind::Mean, 0.0),
        };
        let idx2 = idx.clone();
        let ranges = [(0, kernel[0] as i64), (0, kernel[1] as i64)];
        let v = self.reduce_loops(rk, dtype, &ranges, &mut |l, r| {
            let iy = window_index(stride[0], &idx2[2], &r[0], padding[0]);
            let ixx = window_index(stride[1], &idx2[3], &r[1], padding[1]);
            l.b.load(
                xbuf,
                vec![idx2[0].clone(), idx2[1].clone(), iy, ixx],
                Some(pad),
            )
        });
        let v = self.narrow(v, dtype);
        self.sink(n, &idx, v);
        self.close_nest(4);
    }

    /// A max pool as two: the maximum over the window's rows at every
    /// column of the input and of its padding (`[N, C, OH, W + 2 PW]`,
    /// read along its rows), then over the window's columns of that,
    /// unpadded. The same values as one window (a maximum is associative,
    /// NaN included, and the padding is -inf either way), in `kh + kw`
    /// loads an element instead of `kh kw`, the first pass's contiguous:
    /// ResNet's 3 x 3 stride-2 pool read nine stride-2 rows, each lane
    /// tested against the padding (2.5 times onnxruntime's time).
    fn emit_separable_max_pool(
        &mut self,
        n: NodeIndex,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) {
        let ty = self.ty(n).clone();
        let dtype = ty.dtype;
        let x = self.operand(n, 0);
        let xbuf = self.home[&x];
        // The input's columns and the padding either side (-inf, as a
        // padded load reads it), so that the second pass reads no padding.
        let width = self.ty(x).shape[3] + 2 * padding[1];
        let rows_shape = vec![ty.shape[0], ty.shape[1], ty.shape[2], width];
        let rows = self
            .b
            .alloc(contiguous(&TensorType::new(dtype, rows_shape.clone())));
        // Both passes in one nest over the images and channels: a
        // channel's rows are then only its program's (each program's own
        // scratch, in its L1), where as a buffer of their own passed
        // between two kernels they went out to the L2 and beyond (ResNet's
        // 64 x 112 x 112 max pool: 1.6 MB, 2.2x onnxruntime's time at one
        // thread, 3x at two).
        let parallel = parallel_loops(&rows_shape, self.target).min(2);
        let outer = self.open_nest_with(&rows_shape[..2], parallel);
        let plane = |l: &mut Self, extents: [usize; 2]| -> Vec<IndexExpr> {
            let mut at = outer.clone();
            for e in extents {
                at.push(ix(l.b.begin_for(0, e as i64, 1, &[]).0));
            }
            at
        };
        let idx = plane(self, [rows_shape[2], rows_shape[3]]);
        let at = idx.clone();
        let v = self.reduce_loops(
            ReduceKind::Max,
            dtype,
            &[(0, kernel[0] as i64)],
            &mut |l, r| {
                let iy = window_index(stride[0], &at[2], &r[0], padding[0]);
                let ix = ix_axpy(1, &at[3], &ix_const(-(padding[1] as i64)));
                l.b.load(
                    xbuf,
                    vec![at[0].clone(), at[1].clone(), iy, ix],
                    Some(f64::NEG_INFINITY),
                )
            },
        );
        let v = self.narrow(v, dtype);
        self.b.store(v, rows, idx);
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        let idx = plane(self, [ty.shape[2], ty.shape[3]]);
        let at = idx.clone();
        let v = self.reduce_loops(
            ReduceKind::Max,
            dtype,
            &[(0, kernel[1] as i64)],
            &mut |l, r| {
                let ix = ix_axpy(stride[1] as i64, &at[3], &r[0]);
                l.b.load(
                    rows,
                    vec![at[0].clone(), at[1].clone(), at[2].clone(), ix],
                    None,
                )
            },
        );
        let v = self.narrow(v, dtype);
        self.sink(n, &idx, v);
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        self.close_nest(2);
        self.b.dealloc(rows);
    }

    /// A concatenation: each operand stored at its offset along `axis`.
    fn emit_concat(&mut self, n: NodeIndex, axis: usize) {
        let buf = self.home[&n];
        let mut offset = 0i64;
        for k in 0..self.g.operands(n).len() {
            let o = self.operand(n, k);
            let shape = self.ty(o).shape.clone();
            let idx = self.open_nest(&shape);
            let v = self.value_at(o, &idx);
            let mut at = idx.clone();
            at[axis] = ix_axpy(1, &idx[axis], &ix_const(offset));
            self.b.store(v, buf, at);
            self.close_nest(shape.len());
            offset += shape[axis] as i64;
        }
    }

    /// `gather(x, ind, axis)`: loops over the result's axes up to the
    /// indices' last (`[x axes before, indices axes]`), in whose body the
    /// index is loaded, counted from the end when negative and cast to an
    /// `index` (`loop.cast %i : index`); then loops over `x`'s axes after
    /// `axis`, each element a load of `x` at that row, zero outside
    /// (`pad = 0`: an index out of range reads zero). So the innermost loop
    /// reads a contiguous run of a row (an embedding's), which the tile
    /// conversion vectorizes. With no axis before the index (a scalar index
    /// into axis 0) the index is computed inside the innermost loop.
    fn emit_gather(&mut self, n: NodeIndex, axis: usize) {
        let ty = self.ty(n).clone();
        let (x, ind) = (self.operand(n, 0), self.operand(n, 1));
        let (tx, ti) = (self.ty(x).clone(), self.ty(ind).clone());
        let outer = axis + ti.rank();
        let inside = outer == 0;
        let (split, rest) = if inside {
            (ty.rank(), 0)
        } else {
            (outer, ty.rank() - outer)
        };
        let mut idx = self.open_nest(&ty.shape[..split]);
        let row = |l: &mut Self, idx: &[IndexExpr]| {
            let i = l.value_at(ind, &idx[axis..outer]);
            let zero = l.b.constant(0.0, ti.dtype);
            let negative = l.b.compare(dlc_core::scalar::CmpOp::Lt, i, zero);
            let extent = l.b.constant(tx.shape[axis] as f64, ti.dtype);
            let wrapped = l.b.binary(BinaryOp::Add, i, extent);
            let i = l.b.select(negative, wrapped, i);
            l.b.index_of(i)
        };
        let r = if inside { None } else { Some(row(self, &idx)) };
        for &d in &ty.shape[split..] {
            idx.push(ix(self.b.begin_for(0, d as i64, 1, &[]).0));
        }
        let r = r.unwrap_or_else(|| row(self, &idx));
        let mut at: Vec<IndexExpr> = idx[..axis].to_vec();
        at.push(ix(r));
        at.extend(idx[outer..].iter().cloned());
        let xbuf = self.home[&x];
        let v = self.b.load(xbuf, at, Some(0.0));
        self.sink(n, &idx, v);
        for _ in 0..rest {
            self.b.end_for(vec![]);
        }
        self.close_nest(split);
    }

    /// `scatter_add`: `x` copied into the result, then a second nest adds
    /// each update at its row: parallel over the axes before `axis`, the
    /// indices' axes counted `loop.for`s in order (so repeated indices add
    /// in turn, never at once), the axes after `axis` innermost. An index
    /// outside the axis (after counting a negative one from the end) adds
    /// zero to row 0, so every store stays inside the buffer.
    fn emit_scatter_add(&mut self, n: NodeIndex, axis: usize) {
        let ty = self.ty(n).clone();
        let (ind, upd) = (self.operand(n, 1), self.operand(n, 2));
        let (ti, tu) = (self.ty(ind).clone(), self.ty(upd).clone());
        let buf = self.home[&n];
        let idx = self.open_nest(&ty.shape);
        let v = self.operand_at(n, 0, &idx);
        self.b.store(v, buf, idx);
        self.close_nest(ty.rank());
        let extent = ty.shape[axis];
        if extent == 0 || tu.shape.contains(&0) {
            return;
        }
        let q = ti.rank();
        let mut at = self.open_nest(&ty.shape[..axis]);
        let mut u_at = at.clone();
        for &d in &ti.shape {
            u_at.push(ix(self.b.begin_for(0, d as i64, 1, &[]).0));
        }
        let i = self.value_at(ind, &u_at[axis..]);
        let zero = self.b.constant(0.0, ti.dtype);
        let negative = self.b.compare(CmpOp::Lt, i, zero);
        let n_i = self.b.constant(extent as f64, ti.dtype);
        let wrapped = self.b.binary(BinaryOp::Add, i, n_i);
        let i = self.b.select(negative, wrapped, i);
        let above = self.b.compare(CmpOp::Ge, i, zero);
        let below = self.b.compare(CmpOp::Lt, i, n_i);
        let i = self.b.select(above, i, zero);
        let i = self.b.select(below, i, zero);
        at.push(ix(self.b.index_of(i)));
        for &d in &ty.shape[axis + 1..] {
            let c = ix(self.b.begin_for(0, d as i64, 1, &[]).0);
            at.push(c.clone());
            u_at.push(c);
        }
        let u = self.value_at(upd, &u_at);
        let none = self.b.constant(0.0, ty.dtype);
        let u = self.b.select(above, u, none);
        let u = self.b.select(below, u, none);
        let old = self.b.load(buf, at.clone(), None);
        let sum = self.b.binary(BinaryOp::Add, old, u);
        self.b.store(sum, buf, at);
        for _ in 0..q + ty.rank() - axis - 1 {
            self.b.end_for(vec![]);
        }
        self.close_nest(axis);
    }

    /// A user operator: each local, then the output, as a loop nest over its
    /// index space. A definition that is a contraction
    /// ([`ElemDef::contraction`]) is a structured `loop.matmul` with its
    /// epilogue; a local whose only reader is element-wise at its own index
    /// ([`ComputeBody::sole_elementwise_reader`]) is computed inside that
    /// reader's epilogue instead of being stored.
    fn emit_compute(&mut self, n: NodeIndex, body: &ComputeBody) -> Result<(), LowerError> {
        let inputs: Vec<NodeIndex> = self.g.operands(n).iter().map(|v| v.node).collect();
        let input_types: Vec<TensorType> = inputs.iter().map(|i| self.ty(*i).clone()).collect();
        let input_bufs: Vec<Value> = inputs.iter().map(|i| self.home[i]).collect();
        let defs: Vec<&ElemDef> = body.locals.iter().chain([&body.out]).collect();
        let type_of = |s: Source| match s {
            Source::Input(i) => input_types.get(i as usize),
            Source::Local(i) => body.locals.get(i as usize).map(|d| &d.ty),
        };
        // Columns over several variables where the result is a row-major
        // array of its own: a local no reader computes in its epilogue, or
        // an output stored as it is.
        let out_merges = !matches!(self.plan[&n], Plan::WithEpilogue(_))
            && self.home.get(&n).is_some_and(
                |h| matches!(self.b.ty(*h), dlc_loop::Type::Buffer(t) if t.has_row_major_strides()),
            );
        // A product whose epilogue would keep its columns to its last
        // variable alone, fewer than a vector holds, while merged they
        // are many (a 3x3 convolution's weight gradient feeding its
        // optimizer update: 3 columns against 576) is computed into a
        // buffer of its own with its columns merged, and the epilogue is a
        // pass of its own after it: one more pass over a result that is
        // small exactly when its last extent is (W3's training step: each
        // weight gradient 7x faster).
        let staged = !out_merges
            && matches!(self.plan[&n], Plan::WithEpilogue(_))
            && body.locals.is_empty()
            && match (
                body.out.contraction(&type_of, false),
                body.out.contraction(&type_of, true),
            ) {
                (Some(alone), Some(merged)) => {
                    let cols = body.out.ty.shape[alone.n..].iter().product::<usize>();
                    let lanes = match self.target.gpu() {
                        Some(g) => g.warp_size,
                        None => self.target.lanes(body.out.ty.dtype),
                    };
                    alone.columns == 1 && merged.columns > 1 && cols < lanes
                }
                _ => false,
            };
        let out_merges = out_merges || staged;
        let readers: Vec<Option<usize>> = (0..body.locals.len())
            .map(|t| body.sole_elementwise_reader(t))
            .collect();
        let forms: Vec<Option<ContractionForm<'_>>> = defs
            .iter()
            .enumerate()
            .map(|(k, d)| {
                let merge = readers.get(k).map_or(out_merges, Option::is_none);
                d.contraction(&type_of, merge)
            })
            .collect();
        // Contraction locals computed in their reader's epilogue.
        let mut fused_into: HashMap<usize, usize> = HashMap::new();
        for (t, form) in forms.iter().enumerate().take(body.locals.len()) {
            if form.is_some()
                && let Some(d) = readers[t]
            {
                fused_into.insert(d, t);
            }
        }
        let mut local_bufs: Vec<Option<Value>> = Vec::new();
        for (k, def) in defs.iter().enumerate() {
            let is_out = k == body.locals.len();
            if !is_out && fused_into.values().any(|&t| t == k) {
                local_bufs.push(None);
                continue;
            }
            let buf = if is_out && !staged {
                None
            } else {
                Some(self.b.alloc(contiguous(&def.ty)))
            };
            let cx = ScalarCx {
                inputs: &input_bufs,
                input_types: &input_types,
                locals: &local_bufs,
                defs: &body.locals[..k.min(body.locals.len())],
                hole: None,
                fused: None,
            };
            // Where the result goes: its own buffer, or the node's value
            // (through its epilogue chain, if any).
            let dest = buf.or_else(|| self.home.get(&n).copied());
            let store = |l: &mut Self, idx: &[IndexExpr], v: Value| match buf {
                Some(buf) => l.b.store(v, buf, idx.to_vec()),
                None => l.sink(n, idx, v),
            };
            let fused = fused_into
                .get(&k)
                .and_then(|&t| Some((t, forms[t].as_ref()?)));
            if let Some((t, form)) = fused {
                self.emit_contraction(&cx, form, defs[t], Some((t, def)), &store, dest)?;
            } else if let Some(form) = &forms[k] {
                self.emit_contraction(&cx, form, def, None, &store, dest)?;
            } else {
                let idx = self.open_nest(&def.ty.shape);
                let env: HashMap<IndexVar, IndexExpr> =
                    def.vars.iter().copied().zip(idx.iter().cloned()).collect();
                let v = self.scalar(&cx, &def.expr, def.ty.dtype, &env)?;
                store(self, &idx, v);
                self.close_nest(def.ty.rank());
            }
            if let (true, Some(buf)) = (is_out && staged, buf) {
                // The epilogue over the staged result.
                let idx = self.open_nest(&def.ty.shape);
                let v = self.b.load(buf, idx.clone(), None);
                self.sink(n, &idx, v);
                self.close_nest(def.ty.rank());
            }
            local_bufs.push(buf);
        }
        for buf in local_bufs.into_iter().flatten() {
            self.b.dealloc(buf);
        }
        Ok(())
    }

    /// Definition `def`, a contraction of the form `form`, as a
    /// `loop.matmul` inside loops over its batch variables; its epilogue
    /// computes `def` from each sum and, when `reader` is `(t, d)` (`def` is
    /// local `t`, read element-wise by `d` alone), `d` from that, and
    /// `store`s the result at its index; with columns over several
    /// variables, stores it into a view of `dest` (a row-major buffer)
    /// whose column axes are one.
    fn emit_contraction(
        &mut self,
        cx: &ScalarCx<'_>,
        form: &ContractionForm<'_>,
        def: &ElemDef,
        reader: Option<(usize, &ElemDef)>,
        store: &dyn Fn(&mut Self, &[IndexExpr], Value),
        dest: Option<Value>,
    ) -> Result<(), LowerError> {
        let shape = &def.ty.shape;
        // `def`'s typing context: a local fused into its reader sees the
        // locals before it, not the reader's.
        let own_defs = match reader {
            Some((t, _)) => &cx.defs[..t],
            None => cx.defs,
        };
        let inputs: Vec<&TensorType> = cx.input_types.iter().collect();
        let dtype = dlc_graph::verify::scalar_dtype(form.sum, &inputs, own_defs)
            .map_err(LowerError::Invalid)?
            .unwrap_or(def.ty.dtype);
        // A convolution's window: its gathered copy is an im2col buffer,
        // and the copy and the product one kernel group.
        let window = form.window(def, &|s| match s {
            Source::Input(i) => cx.input_types.get(i as usize),
            Source::Local(i) => own_defs.get(i as usize).map(|d| &d.ty),
        });
        if let Some(w) = window
            && !self.in_group
        {
            return self.grouped(KernelGroupKind::Im2col(w), |l| {
                l.emit_contraction(cx, form, def, reader, store, dest)
            });
        }
        // The operands as the product reads them: in place, through a view
        // whose reduced axes are one, or gathered into a copy (computing a
        // prologue, if any, once per element copied).
        let buffer = |s: Source| match s {
            Source::Input(i) => cx.inputs.get(i as usize).copied(),
            Source::Local(i) => cx.locals.get(i as usize).copied().flatten(),
        };
        let own_cx = ScalarCx {
            defs: own_defs,
            ..*cx
        };
        let mut operands = Vec::new();
        let mut gathered = Vec::new();
        // Per side, whether its gathered copy holds the depth last (see
        // `gather`).
        let mut depth_last = [false; 2];
        for (side, (operand, mode)) in [form.a, form.b].into_iter().zip(form.reads).enumerate() {
            let read = || {
                as_read(operand)
                    .and_then(|(src, _)| buffer(src))
                    .ok_or_else(|| {
                        LowerError::Invalid("a contraction reads a local that is not stored".into())
                    })
            };
            operands.push(match mode {
                OperandRead::InPlace => read()?,
                OperandRead::Merged(d) => self.merged_view(read()?, d, form.k.len())?,
                OperandRead::MergedColumns(d) => self.merged_view(read()?, d, form.columns)?,
                OperandRead::Gathered => {
                    let (copy, view) = match window {
                        Some(w) if side == 1 => {
                            let batch = gathered_batch(form, def, 1).next().ok_or_else(|| {
                                LowerError::Invalid("a window with no batch".into())
                            })?;
                            let col = self.im2col_copy(
                                read()?,
                                &w,
                                [def.ty.shape[batch], form.k[0].hi as usize],
                                [def.ty.shape[form.n], def.ty.shape[form.n + 1]],
                                dtype,
                            );
                            (col, col)
                        }
                        _ => {
                            let (copy, view, last) =
                                self.gather(&own_cx, form, def, side, dtype)?;
                            depth_last[side] = last;
                            (copy, view)
                        }
                    };
                    gathered.push(copy);
                    view
                }
            });
        }
        let (abuf, bbuf) = (operands[0], operands[1]);
        let depth: i64 = form.k.iter().map(|k| k.hi - k.lo).product();
        let columns: usize = shape[form.n..].iter().product();
        let merged_dest = match (form.columns, dest) {
            (1, _) => None,
            (_, Some(dest)) => Some(self.merged_view(dest, form.n, form.columns)?),
            (_, None) => {
                return Err(LowerError::Invalid(
                    "a contraction over several column variables with no buffer to store".into(),
                ));
            }
        };
        let batch_shape: Vec<usize> = form.batch.iter().map(|&p| shape[p]).collect();
        let bidx = self.open_batch(&batch_shape);
        let [i, j, kk, acc] = self.b.begin_matmul(
            shape[form.m] as i64,
            columns as i64,
            depth,
            dtype.accumulator(),
        );
        let mut idx = vec![ix_const(0); shape.len()];
        for (&p, e) in form.batch.iter().zip(&bidx) {
            idx[p] = e.clone();
        }
        idx[form.m] = ix(i);
        idx[form.n] = ix(j);
        let at = |vars: &[IndexVar]| -> HashMap<IndexVar, IndexExpr> {
            vars.iter().copied().zip(idx.iter().cloned()).collect()
        };
        let mut env = at(&def.vars);
        // The epilogue: `def` (and its reader) from the sum.
        let sum = self.narrow(acc, dtype);
        let own = ScalarCx {
            defs: own_defs,
            hole: Some((form.sum, sum)),
            ..*cx
        };
        let mut v = self.scalar(&own, &def.expr, def.ty.dtype, &env)?;
        if let Some((t, d)) = reader {
            let after = ScalarCx {
                fused: Some((t as u32, v)),
                ..*cx
            };
            v = self.scalar(&after, &d.expr, d.ty.dtype, &at(&d.vars))?;
        }
        match merged_dest {
            Some(view) => {
                let mut at = idx[..form.n].to_vec();
                at.push(ix(j));
                self.b.store(v, view, at);
            }
            None => store(self, &idx, v),
        }
        // The operands' indices, over the batch loops and the counters.
        let r = form.k.len();
        let mut index = |side: usize| -> Vec<IndexExpr> {
            let operand = if side == 0 { form.a } else { form.b };
            let read = as_read(operand).map_or(&[][..], |r| r.1);
            match form.reads[side] {
                OperandRead::InPlace => {
                    let k = &form.k[0];
                    env.insert(k.var, ix_axpy(1, &ix(kk), &ix_const(k.lo)));
                    read.iter().map(|e| affine_to_index(e, &env)).collect()
                }
                OperandRead::Merged(d) => {
                    let mut out: Vec<IndexExpr> =
                        read[..d].iter().map(|e| affine_to_index(e, &env)).collect();
                    out.push(ix(kk));
                    out.extend(read[d + r..].iter().map(|e| affine_to_index(e, &env)));
                    out
                }
                OperandRead::MergedColumns(d) => {
                    let k = &form.k[0];
                    env.insert(k.var, ix_axpy(1, &ix(kk), &ix_const(k.lo)));
                    let mut out: Vec<IndexExpr> =
                        read[..d].iter().map(|e| affine_to_index(e, &env)).collect();
                    out.push(ix(j));
                    out.extend(
                        read[d + form.columns..]
                            .iter()
                            .map(|e| affine_to_index(e, &env)),
                    );
                    out
                }
                OperandRead::Gathered => {
                    let mut out: Vec<IndexExpr> = gathered_batch(form, def, side)
                        .map(|p| idx[p].clone())
                        .collect();
                    let own = ix(if side == 0 { i } else { j });
                    out.extend(if depth_last[side] {
                        [own, ix(kk)]
                    } else {
                        [ix(kk), own]
                    });
                    out
                }
            }
        };
        let (ai, bi) = (index(0), index(1));
        self.b.end_matmul(abuf, ai, bbuf, bi);
        self.close_nest(batch_shape.len());
        for copy in gathered {
            self.b.dealloc(copy);
        }
        Ok(())
    }

    /// Operand `side` (0: `a`, 1: `b`) of contraction `form` of `def`, of
    /// element type `dtype`, computed (its prologue evaluated in `cx`) into
    /// a new buffer: the batch variables it reads, then its own variables
    /// (`a`'s row, `b`'s columns) and the reduction variables, zero where a
    /// read falls outside its operand (an im2col copy, for any window).
    /// Whichever of the two groups holds the variable along which the
    /// operand's read (of a prologue, its read of the most elements) moves
    /// through its source's rows (the widest such, in its last index) goes
    /// last, so that the copy moves whole runs of the source
    /// rather than a few elements at a time (a convolution's weight
    /// gradient reads `x[n, c, y + ky - 1, xx + kx - 1]` over the depth
    /// `(n, y, xx)`: runs of 28 along `xx`, not 3 along `kx`); otherwise `a`
    /// is `[rows, depth]` and `b` `[depth, columns]`, as the product reads
    /// them best. Returns the copy, a view of it whose reduction axes are
    /// one (and columns, for several), and whether the depth is last.
    fn gather(
        &mut self,
        cx: &ScalarCx<'_>,
        form: &ContractionForm<'_>,
        def: &ElemDef,
        side: usize,
        dtype: DType,
    ) -> Result<(Value, Value, bool), LowerError> {
        let (operand, own) = if side == 0 {
            (form.a, form.m)
        } else {
            (form.b, form.n)
        };
        let batch: Vec<usize> = gathered_batch(form, def, side).collect();
        let mut vars: Vec<(IndexVar, usize, i64)> = batch
            .iter()
            .map(|&p| (def.vars[p], def.ty.shape[p], 0))
            .collect();
        let reduced = form.k.iter().map(|k| (k.var, (k.hi - k.lo) as usize, k.lo));
        let own: Vec<(IndexVar, usize, i64)> = if side == 0 {
            vec![(def.vars[own], def.ty.shape[own], 0)]
        } else {
            (own..def.vars.len())
                .map(|p| (def.vars[p], def.ty.shape[p], 0))
                .collect()
        };
        let reduced: Vec<(IndexVar, usize, i64)> = reduced.collect();
        // The variable a read's innermost index moves along by one element
        // (the widest, if any): the operand's own read or, for a prologue,
        // its read of the most elements (`a[k, i]` in `a[k, i] * sigmoid(s[k]
        // + t[i])`, not `s[k]`).
        let elements = |src: &Source| -> usize {
            match src {
                Source::Input(i) => cx.input_types.get(*i as usize),
                Source::Local(i) => cx.defs.get(*i as usize).map(|d| &d.ty),
            }
            .map_or(0, |t| t.shape.iter().product())
        };
        let mut widest: Option<(&Source, &[Affine])> = None;
        operand.visit(&mut |e| {
            if let ScalarExpr::Read { src, index } = e
                && widest.is_none_or(|(w, _)| elements(src) > elements(w))
            {
                widest = Some((src, index));
            }
        });
        let innermost = widest.and_then(|(_, index)| index.last()).and_then(|e| {
            e.terms
                .iter()
                .filter(|t| t.0.abs() == 1)
                .filter_map(|t| {
                    let extent = own.iter().chain(&reduced).find(|g| g.0 == t.1)?.1;
                    Some((extent, t.1))
                })
                .max_by_key(|(x, _)| *x)
                .map(|(_, v)| v)
        });
        let holds = |group: &[(IndexVar, usize, i64)]| {
            innermost.is_some_and(|v| group.iter().any(|g| g.0 == v))
        };
        let depth_last = if side == 0 {
            !holds(&own)
        } else {
            holds(&reduced)
        };
        let (own_len, k_len) = (own.len(), reduced.len());
        // Where the copy's own and reduction axes start, after its own are
        // merged into one.
        let (first_own, first_k) = if depth_last {
            vars.extend(own);
            vars.extend(reduced);
            (batch.len(), batch.len() + 1)
        } else {
            vars.extend(reduced);
            vars.extend(own);
            (batch.len() + k_len, batch.len())
        };
        let dims: Vec<usize> = vars.iter().map(|v| v.1).collect();
        let copy = self
            .b
            .alloc(contiguous(&TensorType::new(dtype, dims.clone())));
        let idx = self.open_nest(&dims);
        let env: HashMap<IndexVar, IndexExpr> = vars
            .iter()
            .zip(&idx)
            .map(|(&(v, _, lo), e)| (v, ix_axpy(1, e, &ix_const(lo))))
            .collect();
        let v = self.scalar(cx, operand, dtype, &env)?;
        self.b.store(v, copy, idx);
        self.close_nest(dims.len());
        // Columns merged first: they may come before the depth.
        let mut view = copy;
        if own_len > 1 {
            view = self.merged_view(view, first_own, own_len)?;
        }
        view = self.merged_view(view, first_k, k_len)?;
        Ok((copy, view, depth_last))
    }

    /// `buf` seen with its axes `d..d + r` as one (their extents' product):
    /// a view, since the axes are consecutive in row-major order (a user
    /// operator's operands and locals are row-major buffers).
    fn merged_view(&mut self, buf: Value, d: usize, r: usize) -> Result<Value, LowerError> {
        let dlc_loop::Type::Buffer(t) = self.b.ty(buf).clone() else {
            return Err(LowerError::Invalid("a contraction of a non-buffer".into()));
        };
        let rows = d + r <= t.shape.len()
            && (d..d + r - 1).all(|a| t.strides[a] == t.strides[a + 1] * t.shape[a + 1]);
        if !rows {
            return Err(LowerError::Invalid(format!(
                "axes {d}..{} of {t} are not one run of its storage",
                d + r
            )));
        }
        let mut view = t.clone();
        let extent = t.shape[d..d + r].iter().product();
        view.shape.splice(d..d + r, [extent]);
        view.strides.splice(d..d + r, [t.strides[d + r - 1]]);
        Ok(self.b.view(buf, view))
    }

    /// Lowers a scalar expression of a compute body. A bare number takes the
    /// type of what it meets (`ctx`), as in the graph interpreter.
    fn scalar(
        &mut self,
        cx: &ScalarCx<'_>,
        e: &ScalarExpr,
        ctx: DType,
        env: &HashMap<IndexVar, IndexExpr>,
    ) -> Result<Value, LowerError> {
        let dt = |x: &ScalarExpr| -> Result<Option<DType>, LowerError> {
            let refs: Vec<&TensorType> = cx.input_types.iter().collect();
            dlc_graph::verify::scalar_dtype(x, &refs, cx.defs).map_err(LowerError::Invalid)
        };
        if let Some((node, v)) = cx.hole
            && std::ptr::eq(node, e)
        {
            return Ok(v);
        }
        if let (Some((f, v)), ScalarExpr::Read { src, .. }) = (cx.fused, e)
            && *src == Source::Local(f)
        {
            return Ok(v);
        }
        Ok(match e {
            ScalarExpr::Const(v) => self.b.constant(*v, ctx),
            ScalarExpr::Read { src, index } => {
                let buf = match src {
                    Source::Input(i) => cx.inputs[*i as usize],
                    Source::Local(i) => cx.locals[*i as usize].ok_or_else(|| {
                        LowerError::Invalid(format!("{src} is read but not stored"))
                    })?,
                };
                let idx = index.iter().map(|a| affine_to_index(a, env)).collect();
                self.b.load(buf, idx, Some(0.0))
            }
            ScalarExpr::Unary(u, x) => {
                let d = dt(x)?.unwrap_or(ctx);
                let v = self.scalar(cx, x, d, env)?;
                self.b.unary(*u, v)
            }
            ScalarExpr::Binary(op, x, y) => {
                let d = dt(x)?.or(dt(y)?).unwrap_or(ctx);
                let (a, b) = (self.scalar(cx, x, d, env)?, self.scalar(cx, y, d, env)?);
                self.b.binary(*op, a, b)
            }
            ScalarExpr::Compare(c, x, y) => {
                let d = dt(x)?.or(dt(y)?).unwrap_or(ctx);
                let (a, b) = (self.scalar(cx, x, d, env)?, self.scalar(cx, y, d, env)?);
                self.b.compare(*c, a, b)
            }
            ScalarExpr::Select(c, x, y) => {
                let cv = self.scalar(cx, c, DType::Bool, env)?;
                let d = dt(x)?.or(dt(y)?).unwrap_or(ctx);
                let (a, b) = (self.scalar(cx, x, d, env)?, self.scalar(cx, y, d, env)?);
                self.b.select(cv, a, b)
            }
            ScalarExpr::Cast(to, x) => {
                let d = dt(x)?.unwrap_or(*to);
                let v = self.scalar(cx, x, d, env)?;
                self.b.cast(v, *to)
            }
            ScalarExpr::Reduce { kind, vars, body } => {
                let d = dt(body)?.unwrap_or(ctx);
                let ranges: Vec<(i64, i64)> = vars.iter().map(|r| (r.lo, r.hi)).collect();
                let mut failure = None;
                let v = self.reduce_loops(*kind, d, &ranges, &mut |l, ivs| {
                    let mut inner = env.clone();
                    for (r, iv) in vars.iter().zip(ivs) {
                        inner.insert(r.var, iv.clone());
                    }
                    match l.scalar(cx, body, d, &inner) {
                        Ok(v) => v,
                        Err(err) => {
                            failure = Some(err);
                            l.b.constant(0.0, d)
                        }
                    }
                });
                if let Some(err) = failure {
                    return Err(err);
                }
                self.narrow(v, d)
            }
        })
    }
}

/// Whether a convolution through `window` reads each input element once,
/// where its output is (a 1 x 1 kernel at stride 1, unpadded): its im2col
/// buffer would be the input.
fn reads_in_place(window: &Window) -> bool {
    window.kernel == [1, 1]
        && window.stride == [1, 1]
        && window.padding == [0, 0]
        && window.dilation == [1, 1]
}

/// The window of a convolution with kernel `[KH, KW]`, `stride`,
/// `padding` and `dilation` (one per spatial axis).
fn conv_window(
    kernel: [usize; 2],
    stride: &[usize],
    padding: &[usize],
    dilation: [usize; 2],
) -> Window {
    Window {
        kernel: kernel.map(|k| k as i64),
        stride: [stride[0] as i64, stride[1] as i64],
        padding: [padding[0] as i64, padding[1] as i64],
        dilation: dilation.map(|d| d as i64),
    }
}

/// The positions (in `def`'s variables) of the batch variables operand
/// `side` of `form` reads, in order: the leading axes of its gathered copy.
fn gathered_batch<'f>(
    form: &'f ContractionForm<'_>,
    def: &'f ElemDef,
    side: usize,
) -> impl Iterator<Item = usize> + 'f {
    let operand = if side == 0 { form.a } else { form.b };
    form.batch
        .iter()
        .copied()
        .filter(move |&p| dlc_graph::compute::reads(operand, def.vars[p]))
}

#[derive(Clone, Copy)]
struct ScalarCx<'a> {
    inputs: &'a [Value],
    input_types: &'a [TensorType],
    /// Each local's buffer; `None` for one computed in its reader's epilogue.
    locals: &'a [Option<Value>],
    /// The definitions the expression may read (typing).
    defs: &'a [ElemDef],
    /// A node of the expression whose value is already computed (the sum of
    /// a contraction, in its epilogue).
    hole: Option<(&'a ScalarExpr, Value)>,
    /// A local's value at the expression's own index (a local computed in
    /// its reader's epilogue).
    fused: Option<(u32, Value)>,
}

fn affine_to_index(a: &Affine, env: &HashMap<IndexVar, IndexExpr>) -> IndexExpr {
    let mut out = ix_const(a.constant);
    for (c, v) in &a.terms {
        if let Some(e) = env.get(v) {
            out = ix_axpy(*c, e, &out);
        }
    }
    out
}
