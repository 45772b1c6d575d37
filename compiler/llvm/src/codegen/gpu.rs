//! Tile IR to LLVM IR for NVIDIA GPUs (NVPTX), and the same kernels for
//! an emulator that runs them on CPU threads (how they are tested on
//! machines without a GPU).
//!
//! Tile IR scheduled for `sm_80` or `sm_90` (`--target`) compiles through LLVM's NVPTX
//! back end to PTX (`dlc compile --emit ptx --target sm_90`, `dlc_llvm::compile_gpu`);
//! the runtime loads the PTX through the CUDA driver and runs it (`dlc run|bench
//! --backend gpu`).
//!
//! - **Kernels.** Each `tile.kernel` becomes a PTX kernel (LLVM's `ptx_kernel` calling
//!   convention, `nvvm.maxntid` = the block size) taking one pointer per buffer it reads
//!   or writes and, last, the address of an int32 status word. The grid is flattened to
//!   one dimension (`blockIdx.x`; program ids are recovered by division, so no grid limit
//!   of the y/z axes applies) and each block runs one program with
//!   `TargetDesc::program_threads()` threads (eight warps: 256). Kernels with the same
//!   fingerprint are emitted once, as on the CPU. The host's part is not code: for each
//!   entry point a `dlc_runtime::gpu::GpuFunction` lists the buffers (parameters, the
//!   workspace, constant data) and the launches in order, with grid, block size, dynamic
//!   shared memory and arguments; `--emit ptx` prints it as comments above the kernels.
//! - **Layout.** A tile's type says how the block's threads hold it (`dlc_tile::Layout`).
//!   In the flat layout, every tile but a loop's tensor-core accumulator, element `e`
//!   (its row-major position) belongs to thread `e mod 256`, which holds elements `t, t +
//!   256, ...` as scalars (a 64x64 accumulator is 16 per thread). Tiles of one shape are
//!   laid out alike, so element-wise ops, masks, casts and `tile.for`'s carried values are
//!   per thread; consecutive threads hold consecutive elements of a row, so loads and
//!   stores of rows are coalesced; a reshape or a new axis moves nothing. Scalars and
//!   indices are computed by every thread alike. Ops that move elements between threads go
//!   through a staging area of shared memory between two barriers: `tile.trans` and
//!   `tile.broadcast` write their operand there and read it back permuted, `tile.reduce`
//!   combines each of a thread's results along the axis from there (a whole f32 or i32
//!   tile reduced to a scalar, as a row's max and sum in softmax and layernorm, instead
//!   folds each thread's elements, then each warp's with five butterfly shuffles, then the
//!   eight warps' partial results through shared memory), and `tile.dot` reads both
//!   operands from shared memory and each thread accumulates its own elements of the
//!   result over the depth with `fma`. An operand the program has just loaded whole from
//!   a shared buffer (the GPU schedule's staged blocks), with nothing stored in between,
//!   is read there in place; any other is staged first (as the accumulator's type). A tile of more than 256 elements
//!   per thread is refused with its type named.
//! - **Tensor cores.** Which products run on them is in the tile IR: the pass
//!   `tile.tensor-cores` (in the GPU pipeline) marks a `tile.dot` of f16 or bf16 operands
//!   into an f32 accumulator, in whole 16 x 8 x 16 steps (the GPU schedule's 64 x 64 x 32
//!   blocks are), `{mma = [16, 8, 16]}`, and the generator obeys the mark (refusing one
//!   the target or the generator has no instruction for). Such a product runs on
//!   `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.f32`: operands the program has
//!   just loaded whole from a shared buffer are read there in place, at the pitch of the
//!   buffer's rows (`tile.shared-layouts`, in the GPU pipeline, pads them so a warp's
//!   fragment reads hit no bank twice); others are staged, the left operand row-major,
//!   the right one transposed (a fragment register's two elements are then adjacent),
//!   and a flat accumulator as f32. The warps share the result's 16 x 8 tiles as a
//!   grid, each taking a block of them (a 64 x 64 block: 2 x 4 warps of 2 x 2 tiles),
//!   the grid that reads the fewest fragment bytes per step (`dlc_tile::MmaGrid`, which
//!   an `#mma<r, c>` accumulator's type names); where no grid
//!   divides the tiles, in turn (warps step together: one past the last tile computes a
//!   tile it does not store, so every `mma.sync` runs on whole warps). A warp loads its
//!   accumulator fragment,
//!   runs one `mma.sync` per 16-deep step on fragments read as 32-bit words in the PTX
//!   ISA's layouts (groupID = lane / 4, threadID_in_group = lane % 4), and stores the
//!   fragment back, from where each thread reads its elements. An accumulator in the
//!   `#mma<r, c>` layout is those fragments themselves (four f32 per lane per 16 x 8
//!   tile, dealt by the type's grid, which the generator checks against the program's
//!   warps): `tile.mma-accumulators` (in the GPU pipeline) carries a
//!   depth loop's accumulator so, with one `tile.convert_layout` before the loop and one
//!   after (each through the staging area), so the products in the loop neither stage it
//!   nor read it back; one loop over the depth then carries all of a warp's tiles, and
//!   each step reads a fragment once for every tile of the warp that shares its rows
//!   (left) or columns (right): two left and two right fragments per step for the four
//!   tiles of a 64 x 64 block's warp. f32 products keep the FMA
//!   path unless TF32 is asked for (`--tf32`, `CompileOptions::tf32`,
//!   `TargetDesc::with_tf32`, which adds f32's `m16n8k8` shape to the target's tensor-core
//!   shapes): then they run on `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`, the
//!   operands rounded to TF32 (`cvt.rna.tf32.f32`), and `--check` compares f32 results at
//!   TF32's precision (f16's tolerance, `TF32_TOLERANCE`). Which shapes exist is read from
//!   the target description (`GpuDesc::mma`), not written in the generator.
//! - **Barriers for global memory.** A program run by many threads can read an address
//!   another thread wrote. The pass `tile.insert-barriers`, which GPU targets run
//!   after `convert-loop-to-tile` (so `--emit tile --target sm_90` shows
//!   them and the tile interpreter runs them), puts a `tile.barrier` before every access
//!   that may touch, from another thread, an address written since the last barrier (or
//!   write one read since): accesses by the same pattern (buffer layout, tile shape,
//!   index) are by the thread that owns the element whenever the address is a one-to-one
//!   function of the element and of the loop counters that differ (checked per
//!   dimension, as a mixed-radix number), loops are analysed to a fixed point, and scalar
//!   accesses (every thread's) are ordered unless each dynamic instance writes its own
//!   address. On every example it adds nothing beyond the conversion's own staging
//!   barriers; its tests show where it must (a reversed read, overlapping iterations, a
//!   scalar rewritten each iteration).
//! - **Memory.** A kernel's shared and scratch buffers and then the staging area are at
//!   planned offsets of the block's dynamic shared memory (`extern .shared dlc_shared[]`;
//!   generic pointers derived from it become `ld.shared`/`st.shared` after LLVM's address
//!   space inference); the runtime raises a kernel's dynamic shared-memory limit when it
//!   needs more than 48 KB, and a kernel needing more than the target offers is refused.
//!   Intermediates live at offsets of one device workspace planned first fit over their
//!   lifetimes, as on the CPU; constant tensors are copied once when an entry point is
//!   prepared.
//! - **Asynchronous copies.** A `tile.store` into shared memory of a tile just loaded
//!   from global memory and used nowhere else (the schedule's operand copies), padded
//!   with zeros if at all, from a buffer nothing in the function writes, becomes
//!   `cp.async` with a source size (elements the load's mask or bounds turn off are
//!   zero-filled): the copy does not pass through registers and runs while the product
//!   on the other slot computes. `tile.copy-layouts` (in the GPU pipeline) lays such a
//!   tile and its mask out as `#blocked<v>` (`dlc_tile::Layout::Blocked`: thread `t`
//!   holds runs `t, t + 256, ..` of `v` consecutive elements, 16 bytes of them, the
//!   target's `GpuDesc::async_copy_bytes`): a run contiguous in both buffers is one
//!   `cp.async.cg` of 16 bytes where both ends are 16-byte aligned and it is wholly on
//!   (or wholly off: zeros), else it is copied element by element (4- and 8-byte
//!   elements by `cp.async.ca`, 16-bit ones through registers, as every copy of a
//!   flat tile of 16-bit elements is). A thread waits for its copies
//!   (`cp.async.wait_all`) before a barrier, before reading a shared buffer it copied
//!   into (not another slot of it), and at the end of a loop iteration and of the
//!   kernel.
//! - **Failures.** An integer division by zero stores its status (kind and source place,
//!   as on the CPU) in the status word and divides by one, so every thread still reaches
//!   every barrier; the runtime reads the word after the last kernel and reports
//!   `integer division by zero at model.dl:3:13`.
//! - **Math.** f32 `exp`, `tanh`, `erf` (and so sigmoid, GELU, softmax) are the same
//!   straight-line polynomials as on the CPU; `log`, `sin`, `cos` and `pow` use the
//!   hardware's approximations (`lg2.approx`, `ex2.approx`, `sin.approx` and
//!   `cos.approx` after reducing the argument to [-pi, pi]; `pow` as `2^(y log2|x|)` with
//!   the sign of odd integer powers of negative bases, NaN for fractional ones, 1 for
//!   `y = 0` or `x = 1`). f16/bf16 compute in f32. Transcendental functions of f64 would
//!   need a C library a GPU does not have: they are refused with a message naming the
//!   function (LLVM would otherwise stop the process on a missing libcall).
//! - **The emulator** (`dlc_llvm::emulate`, `dlc run --backend gpu-emulator`) compiles the
//!   very same kernels for this CPU with the thread index, block index, barrier, shared
//!   memory and the four hardware approximations as calls into the runtime: each launch
//!   runs one CPU thread per GPU thread (a `std::sync::Barrier` as `bar.sync`, shared
//!   memory filled with NaN bytes so unwritten staging shows), blocks one after another.
//!   It is slow and meant for small programs: it checks the mapping (layouts, masks,
//!   staging, barriers, the status word, the launch plan) against the graph interpreter on
//!   machines without a GPU. Removing the barrier before a reduction's staging read makes
//!   the differential tests fail on it. Warp shuffles and `mma.sync` are emulated as the
//!   warp-wide operations they are: every lane's registers are exchanged (a block
//!   barrier stands for the warp's synchronization, since the generated code runs them
//!   on whole blocks) and each lane computes its result from the PTX ISA's fragment
//!   layouts, so a fragment register read from the wrong row fails the tests. Every entry
//!   point of W1..W8 at full size passes `dlc run --backend gpu-emulator --random-inputs 0
//!   --check`.
//! - **What is not built yet** (the GPU's speed, issue 11's second half): `wgmma` on
//!   sm_90 (f16/bf16, and TF32 on request, use `mma.sync`; f32 the FMA path);
//!   a deeper copy pipeline than two slots; TF32's right operand is read from shared
//!   memory word by word (`ldmatrix.trans` moves 16-bit elements);
//!   a product of one depth slice also computes a second, all-zero one (the two-stage
//!   loop's rounding);
//!   reductions along one axis of a 2-D tile combine from shared memory rather than with
//!   warp shuffles. Every kernel has run correctly on an H200 (the GPU check, docs/testing.md); its
//!   speed against cuBLAS and PyTorch, the profile of each kernel that misses the bar and
//!   what would close it are in performance.md, "On a GPU".

use std::collections::HashMap;

use dlc_core::scalar::{BinaryOp, ReduceKind};
use dlc_core::{DType, TargetDesc};
use dlc_runtime::abi::{STATUS_DIVISION_BY_ZERO, Signature};
use dlc_runtime::gpu::{DeviceBuffer, GpuFunction, Launch};
use dlc_tile::{Affine, Function, Layout, MmaGrid, OpData, OpKind, Type, Value};
use inkwell::attributes::AttributeLoc;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{BasicValueEnum as BV, FunctionValue, IntValue, PointerValue};
use inkwell::{AddressSpace, IntPredicate};

use super::workspace::{Workspace, collect, kernel_scratch};
use super::{Gen, Sites, storage_type};
use crate::{CodegenError, R};
use dlc_core::ir::OpDecl;

/// How a kernel reaches its thread and block indices, barriers and shared
/// memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// NVVM's special registers and intrinsics, for PTX.
    Nvptx,
    /// Calls of the emulator's functions ([`EMULATOR_HOOKS`]).
    Emulated,
}

/// What emulated kernels call: the thread's index in its block, the
/// block's index, a barrier of the block's threads, the block's shared
/// memory; then the f32 functions a GPU approximates in hardware (`log2`,
/// `2^x`, `sin` and `cos` on a reduced range), standing for
/// [`HARDWARE_MATH`]; then the warp's butterfly shuffle, `mma.sync`,
/// `cp.async` and `ldmatrix`.
pub(crate) const EMULATOR_HOOKS: [&str; 12] = [
    "dlc_emu_thread",
    "dlc_emu_block",
    "dlc_emu_barrier",
    "dlc_emu_shared",
    "dlc_emu_lg2",
    "dlc_emu_ex2",
    "dlc_emu_sin",
    "dlc_emu_cos",
    "dlc_emu_shfl_bfly",
    "dlc_emu_mma",
    "dlc_emu_cp_async",
    "dlc_emu_ldmatrix",
];

/// Threads of a warp, which exchange registers with shuffles.
const WARP: usize = 32;

/// Rounds in which the warps of a `threads`-thread program take the
/// 16 x 8 tiles of an `m x n` tensor-core accumulator, one each per round.
fn mma_rounds(m: usize, n: usize, threads: usize) -> usize {
    ((m / 16) * (n / 8)).div_ceil((threads / WARP).max(1))
}

/// The 16 x 8 tile (row and column of tiles) warp `warp` of `warps` takes
/// in round `round` of an `m x n` accumulator: `grid`'s ([`MmaGrid::tile`]),
/// else tile `round * warps + warp` (in turns), the last one for a warp
/// past it ([`Gen::mma_tile`] computes the same in the kernel).
fn mma_tile_of(
    grid: Option<MmaGrid>,
    round: usize,
    warp: usize,
    warps: usize,
    m: usize,
    n: usize,
) -> (usize, usize) {
    match grid {
        Some(g) => g.tile(round, warp, m, n),
        None => {
            let tiles = (m / 16) * (n / 8);
            let q = (round * warps + warp).min(tiles - 1);
            (q / (n / 8), q % (n / 8))
        }
    }
}

/// For each round of an `m x n` accumulator, which earlier round's left
/// and right fragments it can read: the first round that gives every warp
/// the same rows of tiles (columns, for the right one), so a warp reads
/// each fragment once per step of the depth however many of its tiles
/// use it.
fn mma_sharing(grid: Option<MmaGrid>, m: usize, n: usize, threads: usize) -> Vec<(usize, usize)> {
    let warps = (threads / WARP).max(1);
    let of = |round: usize| -> (Vec<usize>, Vec<usize>) {
        (0..warps)
            .map(|w| mma_tile_of(grid, round, w, warps, m, n))
            .unzip()
    };
    let all: Vec<_> = (0..mma_rounds(m, n, threads)).map(of).collect();
    all.iter()
        .map(|(rows, cols)| {
            (
                all.iter().position(|(r, _)| r == rows).unwrap_or(0),
                all.iter().position(|(_, c)| c == cols).unwrap_or(0),
            )
        })
        .collect()
}

/// NVVM's approximations (PTX `lg2.approx`, `ex2.approx`, `sin.approx`,
/// `cos.approx`), in the order of the last four [`EMULATOR_HOOKS`], and
/// whether each is overloaded on its type.
const HARDWARE_MATH: [(&str, bool); 4] = [
    ("llvm.nvvm.lg2.approx.f", false),
    ("llvm.nvvm.ex2.approx", true),
    ("llvm.nvvm.sin.approx.f", false),
    ("llvm.nvvm.cos.approx.f", false),
];

/// The most elements of one tile a thread holds: tiles are blocks a
/// program keeps in registers.
const MAX_PER_THREAD: usize = 256;

/// The block's threads, while a kernel is generated.
pub(crate) struct Threads<'ctx> {
    /// How many run each program.
    count: usize,
    /// This thread's index (i64).
    tid: IntValue<'ctx>,
    /// The block's shared memory (a generic pointer).
    shared: PointerValue<'ctx>,
    /// Byte offset of the staging area in it.
    staging: u64,
    /// The status word.
    status: PointerValue<'ctx>,
    flavor: Flavor,
    /// The target's tensor-core shapes per operand type.
    mma: Vec<(DType, [usize; 3])>,
    /// The shared buffers (and indices) asynchronous copies were issued
    /// into since the last wait.
    copying: std::cell::RefCell<Vec<(Value, Vec<Affine>)>>,
}

/// The kernels of tile function `f` emitted into `module` (named after
/// `symbol`), and how the host runs them.
pub(crate) fn emit_function<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    f: &Function,
    symbol: &str,
    target: &TargetDesc,
    flavor: Flavor,
) -> R<GpuFunction> {
    let gpu = target
        .gpu()
        .ok_or_else(|| CodegenError::Unsupported(format!("{} is not a GPU target", target.name)))?;
    let threads = target.program_threads();
    for v in f.values.iter() {
        if let Type::Tile(t) = v
            && t.len().div_ceil(threads) > MAX_PER_THREAD
        {
            return Err(CodegenError::Unsupported(format!(
                "@{}: {t} is {} elements per thread of {threads}; the GPU back end holds a tile \
                 in registers and takes at most {MAX_PER_THREAD}",
                f.name,
                t.len().div_ceil(threads)
            )));
        }
    }
    let plan = Workspace::plan(f)?;
    let mut buffers: Vec<DeviceBuffer> = Vec::new();
    let mut index: HashMap<Value, usize> = HashMap::new();
    for (i, (_, v)) in f.params.iter().enumerate() {
        index.insert(*v, buffers.len());
        buffers.push(DeviceBuffer::Param(i));
    }
    let sites = Sites::default();
    let mut kernels: HashMap<String, (String, u32)> = HashMap::new();
    let mut launches = Vec::new();
    for &id in &f.body.ops {
        let op = f.op(id);
        match &op.kind {
            OpKind::Alloc => {
                let v = op.results[0];
                let off = plan.offsets.get(&v).copied().ok_or_else(|| {
                    CodegenError::Invalid("a buffer the workspace plan missed".into())
                })?;
                index.insert(v, buffers.len());
                buffers.push(DeviceBuffer::Workspace(off));
            }
            OpKind::Global(values) => {
                let Type::Buffer(t) = f.ty(op.results[0]) else {
                    return Err(CodegenError::Invalid("tile.global of a non-buffer".into()));
                };
                let bytes = t.dtype.to_le_bytes_all(values.iter());
                index.insert(op.results[0], buffers.len());
                buffers.push(DeviceBuffer::Constant(bytes));
            }
            OpKind::View => {
                let base = *index
                    .get(&op.operands[0])
                    .ok_or_else(|| CodegenError::Invalid("a view of an unknown buffer".into()))?;
                index.insert(op.results[0], base);
            }
            OpKind::Kernel { grid, .. } => {
                let blocks = grid.iter().product::<usize>();
                if blocks == 0 {
                    continue;
                }
                let blocks = u32::try_from(blocks)
                    .ok()
                    .filter(|b| *b < i32::MAX as u32)
                    .ok_or_else(|| {
                        CodegenError::Unsupported(format!(
                            "@{}: a kernel of {blocks} programs (a GPU grid takes fewer than 2^31)",
                            f.name
                        ))
                    })?;
                let (key, inputs) = dlc_tile::print::fingerprint(f, id);
                let (name, shared) = match kernels.get(&key) {
                    Some(k) => k.clone(),
                    None => {
                        let name = format!("{symbol}_k{}", kernels.len());
                        let shared = kernel(
                            ctx,
                            module,
                            f,
                            &op.regions[0],
                            grid,
                            &inputs,
                            &name,
                            &sites,
                            threads,
                            flavor,
                            &gpu.mma,
                        )?;
                        if shared > gpu.shared_memory_per_block as u64 {
                            return Err(CodegenError::Unsupported(format!(
                                "@{}: a kernel needs {shared} bytes of shared memory; {} offers {} \
                                 per block",
                                f.name, target.name, gpu.shared_memory_per_block
                            )));
                        }
                        kernels.insert(key, (name.clone(), shared as u32));
                        (name, shared as u32)
                    }
                };
                let args = inputs
                    .iter()
                    .map(|v| {
                        index.get(v).copied().ok_or_else(|| {
                            CodegenError::Invalid("a kernel reads an unknown buffer".into())
                        })
                    })
                    .collect::<R<Vec<_>>>()?;
                launches.push(Launch {
                    kernel: name,
                    blocks,
                    threads: threads as u32,
                    shared_bytes: shared,
                    args,
                });
            }
            OpKind::Dealloc | OpKind::Return => {}
            OpKind::Prepared { func, .. } => {
                return Err(CodegenError::Unsupported(format!(
                    "@{}: tile.prepared (buffers @{func} prepares once per process): GPU entry \
                     points have no preparer",
                    f.name
                )));
            }
            other => {
                return Err(CodegenError::Invalid(format!(
                    "{} outside a kernel",
                    other.name()
                )));
            }
        }
    }
    let mut signature: Signature = crate::abi::signature(f)?;
    signature.name.clone_from(&f.name);
    signature.sites = sites.borrow().clone();
    Ok(GpuFunction {
        signature,
        workspace: plan.size,
        buffers,
        launches,
    })
}

/// Bytes the staging area of a kernel body run by `threads` threads
/// needs: the largest operand of a move between threads, two operands for
/// a product, a slot per warp for a reduction.
fn staging_bytes(
    f: &Function,
    ops: &[dlc_tile::OpId],
    threads: usize,
    mma: &[(DType, [usize; 3])],
) -> R<u64> {
    let bytes = |v: Value| -> u64 {
        match f.ty(v) {
            Type::Tile(t) => (t.len() * stage_size(t.dtype)) as u64,
            _ => 0,
        }
    };
    let mut most = 0;
    for &id in ops {
        let op = f.op(id);
        let need = match op.kind {
            OpKind::Trans { .. }
            | OpKind::Slice { .. }
            | OpKind::Broadcast
            | OpKind::ConvertLayout => bytes(op.operands[0]),
            OpKind::Reduce { .. } => bytes(op.operands[0]).max((threads.div_ceil(WARP) * 8) as u64),
            OpKind::Dot { .. } => match tensor_core_dot(f, op, threads, mma)? {
                Some(_) if !mma_stages(f, op) => 0,
                Some(t) => t.regions().2 + (t.m * t.n * 4) as u64,
                None => {
                    // Operands read in place take no staging.
                    let acc = f.ty(op.operands[2]).dtype().unwrap_or(DType::F32);
                    let n = |v: Value| match in_shared(f, v, op.results[0]) {
                        Some(_) => 0,
                        None => f.ty(v).shape().map_or(0, |s| s.iter().product::<usize>()),
                    };
                    ((n(op.operands[0]) + n(op.operands[1])) * stage_size(acc)) as u64
                }
            },
            _ => 0,
        };
        most = most.max(need);
        for r in &op.regions {
            most = most.max(staging_bytes(f, &r.ops, threads, mma)?);
        }
    }
    Ok(most)
}

/// A `tile.dot` on tensor cores: its sizes, operand type and the
/// instruction's depth.
#[derive(Debug, Clone, Copy)]
struct TensorCoreDot {
    m: usize,
    n: usize,
    k: usize,
    /// The operands' type: f16, bf16, or f32 (as TF32).
    d: DType,
    /// Depth of one `mma.sync` (16, or 8 for TF32).
    step: usize,
}

impl TensorCoreDot {
    /// Bytes of one staged operand element.
    fn size(self) -> usize {
        if self.d == DType::F32 { 4 } else { 2 }
    }

    /// Byte offsets of the staged operands: the left one (row-major) at
    /// 0, the right one transposed (a fragment register's two 16-bit
    /// elements are then adjacent) at the first, the f32 accumulator at
    /// the second.
    fn regions(self) -> (u64, u64, u64) {
        let b = ((self.m * self.k * self.size()) as u64).div_ceil(16) * 16;
        let c = (b + (self.k * self.n * self.size()) as u64).div_ceil(16) * 16;
        (0, b, c)
    }
}

/// The tensor-core form of a `tile.dot` that `tile.tensor-cores` marked
/// (`mma = [m, n, k]`), if it is: an instruction this generator has
/// (m16n8k16 for f16 and bf16, m16n8k8 for f32 as TF32), of the target
/// (`GpuDesc::mma`; f32 only when TF32 was asked for), in programs of
/// whole warps. A mark that is not is refused, not ignored.
fn tensor_core_dot(
    f: &Function,
    op: &OpData,
    threads: usize,
    mma: &[(DType, [usize; 3])],
) -> R<Option<TensorCoreDot>> {
    let OpKind::Dot {
        mma: Some(shape @ [_, _, mk]),
    } = op.kind
    else {
        return Ok(None);
    };
    let (a, b) = (f.ty(op.operands[0]), f.ty(op.operands[1]));
    let (Some(d), Some(sa), Some(sb)) = (a.dtype(), a.shape(), b.shape()) else {
        return Err(CodegenError::Invalid("tile.dot of non-tiles".into()));
    };
    let (m, k, n) = (sa[0], sa[1], sb[1]);
    let known = matches!(
        (d, shape),
        (DType::F16 | DType::BF16, [16, 8, 16]) | (DType::F32, [16, 8, 8])
    );
    if !known || !mma.contains(&(d, shape)) || !threads.is_multiple_of(WARP) {
        return Err(CodegenError::Unsupported(format!(
            "tile.dot {{mma = {shape:?}}} of {d}: not a tensor-core instruction of this target \
             (it has {mma:?}) and this generator (m16n8k16 for f16 and bf16, m16n8k8 for f32 as \
             TF32) in programs of whole warps; `tile.tensor-cores` marks the ones that are"
        )));
    }
    // The typing rule checked the rest (whole steps, an f32 accumulator).
    Ok(Some(TensorCoreDot {
        m,
        n,
        k,
        d,
        step: mk,
    }))
}

/// Where in shared memory tile `v` was loaded from whole (row-major, as
/// its own shape: all of a contiguous buffer, or one slot of it at
/// constant leading indices; unmasked) just before `user` in the same
/// block, with nothing stored, looped over or waited at in between: the
/// buffer and the element offset of the slot. A product can read `v`'s
/// elements there instead of staging them again (the GPU schedule's
/// operand blocks are such loads).
fn in_shared(f: &Function, v: Value, user: Value) -> Option<InShared> {
    let defining = |x: Value| f.ops.iter().position(|o| o.results.contains(&x));
    let (load, used) = (defining(v)?, defining(user)?);
    let op = &f.ops[load];
    let OpKind::Load { index, pad: None } = &op.kind else {
        return None;
    };
    let Type::Buffer(buf) = f.ty(op.operands[0]) else {
        return None;
    };
    let shape = f.ty(v).shape()?;
    let lead = buf.shape.len().checked_sub(shape.len())?;
    // Row-major, or (a 2-axis tile) rows at a pitch (`tile.shared-layouts`).
    let pitch = match buf.row_pitch() {
        Some(p) if buf.is_contiguous() || shape.len() == 2 => p,
        _ if buf.is_contiguous() => *shape.last()?,
        _ => return None,
    };
    let whole = op.operands.len() == 1
        && buf.space == dlc_tile::Space::Shared
        && buf.shape[lead..] == *shape
        && index[..lead].iter().all(Affine::is_constant)
        && index[lead..]
            .iter()
            .enumerate()
            .all(|(k, e)| e.terms.is_empty() && e.constant == 0 && e.axes == [(1, k)]);
    if !whole {
        return None;
    }
    let mut blocks = vec![&f.body];
    blocks.extend(f.ops.iter().flat_map(|o| o.regions.iter()));
    let block = blocks
        .into_iter()
        .find(|b| b.ops.contains(&dlc_tile::OpId(used as u32)))?;
    let at = |i: usize| block.ops.iter().position(|o| o.0 as usize == i);
    let (from, to) = (at(load)?, at(used)?);
    let quiet = from < to
        && block.ops[from + 1..to].iter().all(|o| {
            !matches!(
                f.op(*o).kind,
                OpKind::Store { .. } | OpKind::For { .. } | OpKind::Barrier
            )
        });
    if !quiet {
        return None;
    }
    let first = index[..lead]
        .iter()
        .zip(&buf.strides)
        .map(|(e, &s)| e.constant * s as i64)
        .sum();
    Some(InShared {
        buffer: op.operands[0],
        first,
        pitch,
    })
}

/// Where [`in_shared`] finds a tile: its buffer, the element offset of its
/// slot, and the distance in elements between its rows there.
struct InShared {
    buffer: Value,
    first: i64,
    pitch: usize,
}

/// Whether tensor-core product `op` goes through the staging area: an
/// operand not read in place ([`in_shared`]) or an accumulator not held in
/// fragments (`#mma`).
fn mma_stages(f: &Function, op: &OpData) -> bool {
    !matches!(f.ty(op.operands[2]), Type::Tile(t) if matches!(t.layout, Layout::Mma(_)))
        || op.operands[..2]
            .iter()
            .any(|&v| in_shared(f, v, op.results[0]).is_none())
}

/// Bytes one staged element of type `d` takes (bool as a byte).
fn stage_size(d: DType) -> usize {
    d.size_bytes().max(1)
}

/// Emits one kernel: `void name(T0 *b0, .., int32_t *status)`; returns
/// the bytes of shared memory it needs.
#[allow(clippy::too_many_arguments)]
fn kernel<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    f: &Function,
    body: &dlc_tile::Block,
    grid: &[usize],
    inputs: &[Value],
    name: &str,
    sites: &Sites,
    threads: usize,
    flavor: Flavor,
    mma: &[(DType, [usize; 3])],
) -> R<u64> {
    let ptr = ctx.ptr_type(AddressSpace::default());
    let params: Vec<BasicMetadataTypeEnum<'ctx>> = (0..=inputs.len()).map(|_| ptr.into()).collect();
    let func = module.add_function(
        name,
        ctx.void_type().fn_type(&params, false),
        Some(Linkage::External),
    );
    if flavor == Flavor::Nvptx {
        // LLVM's `ptx_kernel` calling convention.
        func.set_call_conventions(71);
        func.add_attribute(
            AttributeLoc::Function,
            ctx.create_string_attribute("nvvm.maxntid", &threads.to_string()),
        );
    }
    let mut g = Gen::within(ctx, module, f, func, sites);
    let entry = ctx.append_basic_block(func, "entry");
    let trap = ctx.append_basic_block(func, "unreachable");
    g.b.position_at_end(trap);
    g.b.build_unreachable()?;
    g.b.position_at_end(entry);
    // Failures are recorded, not branched to (see `gpu_binary`).
    g.trap = Some(trap);
    for (p, v) in func.get_param_iter().zip(inputs) {
        // A buffer parameter points at its storage (views of a buffer are
        // passed as the buffer itself): a view with an offset starts there.
        let p = match f.ty(*v) {
            Type::Buffer(t) => g.elements_on(p, t.dtype, t.offset)?,
            _ => p,
        };
        g.vals.insert(*v, p);
    }
    let status = func
        .get_nth_param(inputs.len() as u32)
        .ok_or_else(|| CodegenError::Llvm("no status parameter".into()))?
        .into_pointer_value();
    let i64t = ctx.i64_type();
    let tid = g.hook(flavor, "llvm.nvvm.read.ptx.sreg.tid.x", EMULATOR_HOOKS[0])?;
    let block = g.hook(flavor, "llvm.nvvm.read.ptx.sreg.ctaid.x", EMULATOR_HOOKS[1])?;
    let tid = g.b.build_int_z_extend(tid, i64t, "tid")?;
    let block = g.b.build_int_z_extend(block, i64t, "block")?;
    let shared = match flavor {
        Flavor::Nvptx => {
            let global = module.get_global("dlc_shared").unwrap_or_else(|| {
                let t = ctx.i8_type().array_type(0);
                let gl = module.add_global(t, Some(AddressSpace::from(3u16)), "dlc_shared");
                gl.set_linkage(Linkage::External);
                gl.set_alignment(64);
                gl
            });
            g.b.build_address_space_cast(global.as_pointer_value(), ptr, "shared")?
        }
        Flavor::Emulated => {
            let decl = g.declare(EMULATOR_HOOKS[3], ptr.fn_type(&[], false));
            g.b.build_call(decl, &[], "shared")?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| CodegenError::Llvm("no shared memory".into()))?
                .into_pointer_value()
        }
    };
    // Program ids from the flattened block index, the last axis fastest.
    let mut pids = Vec::new();
    let mut allocs = Vec::new();
    collect(f, &body.ops, &mut allocs, &mut pids);
    let mut ids = vec![i64t.const_zero(); grid.len()];
    let mut rest = block;
    for axis in (0..grid.len()).rev() {
        let n = i64t.const_int(grid[axis] as u64, false);
        ids[axis] = g.b.build_int_unsigned_rem(rest, n, "pid")?;
        rest = g.b.build_int_unsigned_div(rest, n, "rest")?;
    }
    for (v, axis) in pids {
        g.vals.insert(v, ids[axis].into());
    }
    let (placed, bytes) = kernel_scratch(f, body)?;
    for (v, off) in placed {
        let p = g.byte_pointer(shared, i64t.const_int(off, false))?;
        g.vals.insert(v, p.into());
    }
    let staging = bytes.div_ceil(64) * 64;
    let mma = mma.to_vec();
    g.gpu = Some(Threads {
        count: threads,
        tid,
        shared,
        staging,
        status,
        flavor,
        mma: mma.clone(),
        copying: std::cell::RefCell::new(Vec::new()),
    });
    g.program_block(body)?;
    g.wait_copies()?;
    g.b.build_return(None)?;
    Ok(staging + staging_bytes(f, &body.ops, threads, &mma)?)
}

/// f32 functions a GPU has no library for, from its hardware
/// approximations; f64 ones are refused (a GPU has no C library, and
/// they are not built here yet).
impl<'ctx, I: super::Ir> Gen<'ctx, '_, I> {
    /// `Some(error)` for a transcendental function of f64 in a GPU kernel.
    pub(super) fn gpu_refuses(&self, what: &str, x: BV<'ctx>) -> Option<CodegenError> {
        let f64t: inkwell::types::BasicTypeEnum<'ctx> = self.ctx.f64_type().into();
        (self.gpu.is_some() && super::elementwise::element_type(x) == f64t).then(|| {
            CodegenError::Unsupported(format!(
                "the GPU back end does not build {what} of f64 yet (a GPU has no C library to \
                 call; f32 works)"
            ))
        })
    }

    /// Hardware approximation `k` (of [`HARDWARE_MATH`]) of f32 `x`.
    fn hardware(&self, k: usize, x: BV<'ctx>) -> R<BV<'ctx>> {
        let Some(th) = &self.gpu else {
            return Err(CodegenError::Invalid("GPU math outside a kernel".into()));
        };
        match th.flavor {
            Flavor::Nvptx => {
                let (name, overloaded) = HARDWARE_MATH[k];
                let types = [self.ctx.f32_type().into()];
                self.call(name, if overloaded { &types[..] } else { &[] }, &[x])
            }
            Flavor::Emulated => {
                let f32t = self.ctx.f32_type();
                let decl = self.declare(EMULATOR_HOOKS[4 + k], f32t.fn_type(&[f32t.into()], false));
                self.b
                    .build_call(decl, &[x.into()], "hw")?
                    .try_as_basic_value()
                    .basic()
                    .ok_or_else(|| CodegenError::Llvm("no value".into()))
            }
        }
    }

    /// On a GPU: `log`, `sin` and `cos` of f32 from the hardware (sine and
    /// cosine after reducing the argument to [-pi, pi] in two steps);
    /// `None` elsewhere.
    pub(super) fn gpu_unary(
        &self,
        u: dlc_core::scalar::UnaryOp,
        x: BV<'ctx>,
    ) -> R<Option<BV<'ctx>>> {
        use dlc_core::scalar::UnaryOp;
        if self.gpu.is_none() {
            return Ok(None);
        }
        let f = |v: f64| -> BV<'ctx> { self.ctx.f32_type().const_float(v).into() };
        let mul = |a: BV<'ctx>, b: BV<'ctx>| -> R<BV<'ctx>> {
            Ok(self
                .b
                .build_float_mul(a.into_float_value(), b.into_float_value(), "m")?
                .into())
        };
        Ok(Some(match u {
            UnaryOp::Log => mul(self.hardware(0, x)?, f(std::f64::consts::LN_2))?,
            UnaryOp::Sin | UnaryOp::Cos => {
                // x - 2 pi n, with 2 pi split into a part exact in f32
                // times small n and the rest.
                let n = self.call(
                    "llvm.roundeven",
                    &[x.get_type()],
                    &[mul(x, f(1.0 / std::f64::consts::TAU))?],
                )?;
                let hi = 6.28125;
                let r = self.b.build_float_sub(
                    x.into_float_value(),
                    mul(n, f(hi))?.into_float_value(),
                    "r",
                )?;
                let r = self.b.build_float_sub(
                    r,
                    mul(n, f(std::f64::consts::TAU - hi))?.into_float_value(),
                    "r",
                )?;
                self.hardware(if u == UnaryOp::Sin { 2 } else { 3 }, r.into())?
            }
            _ => return Ok(None),
        }))
    }

    /// On a GPU: `x^y` of f32 as `2^(y log2 |x|)`, with the sign of an odd
    /// integer power of a negative base, NaN for a fractional one, and 1
    /// for `y = 0` or `x = 1`; `None` elsewhere.
    pub(super) fn gpu_pow(&self, x: BV<'ctx>, y: BV<'ctx>) -> R<Option<BV<'ctx>>> {
        if self.gpu.is_none() {
            return Ok(None);
        }
        use inkwell::FloatPredicate as P;
        let t = self.ctx.f32_type();
        let (xf, yf) = (x.into_float_value(), y.into_float_value());
        let ax = self.call("llvm.fabs", &[t.into()], &[x])?;
        let l = self.hardware(0, ax)?;
        let e = self.b.build_float_mul(yf, l.into_float_value(), "e")?;
        let r = self.hardware(1, e.into())?.into_float_value();
        let fl = self
            .call("llvm.floor", &[t.into()], &[y])?
            .into_float_value();
        let integer = self.b.build_float_compare(P::OEQ, fl, yf, "int")?;
        let half = self.b.build_float_mul(yf, t.const_float(0.5), "half")?;
        let hf = self
            .call("llvm.floor", &[t.into()], &[half.into()])?
            .into_float_value();
        let even = self.b.build_float_compare(P::OEQ, hf, half, "even")?;
        let odd = self
            .b
            .build_and(integer, self.b.build_not(even, "odd")?, "odd")?;
        let neg = self
            .b
            .build_float_compare(P::OLT, xf, t.const_zero(), "neg")?;
        let nr = self.b.build_float_neg(r, "nr")?;
        let signed = self.b.build_select(odd, nr, r, "signed")?;
        let nan = t.const_float(f64::NAN);
        let of_neg = self.b.build_select(integer, signed, nan.into(), "ofneg")?;
        let r = self.b.build_select(neg, of_neg, r.into(), "pow")?;
        let y0 = self
            .b
            .build_float_compare(P::OEQ, yf, t.const_zero(), "y0")?;
        let x1 = self
            .b
            .build_float_compare(P::OEQ, xf, t.const_float(1.0), "x1")?;
        let one = self.b.build_or(y0, x1, "one")?;
        Ok(Some(self.b.build_select(
            one,
            t.const_float(1.0).into(),
            r,
            "pow",
        )?))
    }
}

impl<'ctx> Gen<'ctx, '_, super::tile::TileIr> {
    fn threads(&self) -> R<&Threads<'ctx>> {
        self.gpu
            .as_ref()
            .ok_or_else(|| CodegenError::Invalid("GPU code outside a kernel".into()))
    }

    /// A 32-bit index from NVVM special register `nvvm`, or from the
    /// emulator's function `emulated`.
    fn hook(&self, flavor: Flavor, nvvm: &str, emulated: &str) -> R<IntValue<'ctx>> {
        let i32t = self.ctx.i32_type();
        let v = match flavor {
            Flavor::Nvptx => self.call(nvvm, &[], &[])?,
            Flavor::Emulated => {
                let decl = self.declare(emulated, i32t.fn_type(&[], false));
                self.b
                    .build_call(decl, &[], "hook")?
                    .try_as_basic_value()
                    .basic()
                    .ok_or_else(|| CodegenError::Llvm(format!("{emulated} gives no value")))?
            }
        };
        Ok(v.into_int_value())
    }

    /// A program op whose code on a GPU depends on tiles being spread over
    /// the block's threads; `false` for the ops `program_block` handles for
    /// both targets.
    pub(super) fn gpu_program_op(&mut self, op: &OpData) -> R<bool> {
        match &op.kind {
            OpKind::Barrier => self.barrier()?,
            OpKind::Const(c) => {
                let r = op.results[0];
                let s = self.constant(*c, self.tdtype(r)?);
                let n = if self.is_tile(r) {
                    self.per_thread(r)?
                } else {
                    1
                };
                self.set(r, vec![s; n])?;
            }
            OpKind::Splat => {
                let r = op.results[0];
                let s = self.get(op.operands[0])?;
                let n = self.per_thread(r)?;
                self.set(r, vec![s; n])?;
            }
            OpKind::Load { index, pad } => self.gpu_load(op, index, *pad)?,
            OpKind::Store { index } => self.gpu_store(op, index)?,
            // A CPU's hint: a GPU's loads are scheduled by its own copies.
            OpKind::Prefetch { .. } => {}
            OpKind::Mask { limits } => self.gpu_mask(op, limits)?,
            // Every element stays in its thread (row-major order is kept);
            // moves go through shared memory.
            OpKind::Reshape | OpKind::ExpandDims { .. } => {
                let x = self.flatten(op.operands[0])?;
                self.set(op.results[0], x)?;
            }
            OpKind::Broadcast => {
                let from = self.f.ty(op.operands[0]).shape().unwrap_or(&[]).to_vec();
                self.gpu_move(op, |g, c| {
                    let src: Vec<IntValue<'ctx>> = c
                        .iter()
                        .zip(&from)
                        .map(|(&ck, &n)| if n == 1 { g.i64v(0) } else { ck })
                        .collect();
                    g.position_of(&src, &from)
                })?;
            }
            OpKind::Trans { perm } => {
                let from = self.f.ty(op.operands[0]).shape().unwrap_or(&[]).to_vec();
                let perm = perm.clone();
                self.gpu_move(op, |g, c| {
                    let mut src = vec![g.i64v(0); from.len()];
                    for (i, &p) in perm.iter().enumerate() {
                        src[p] = c[i];
                    }
                    g.position_of(&src, &from)
                })?;
            }
            OpKind::Slice { offsets } => {
                let from = self.f.ty(op.operands[0]).shape().unwrap_or(&[]).to_vec();
                let at = offsets
                    .iter()
                    .map(|e| self.affine_base(e))
                    .collect::<R<Vec<_>>>()?;
                self.gpu_move(op, |g, c| {
                    let src = c
                        .iter()
                        .zip(&at)
                        .map(|(&ck, &o)| Ok(g.b.build_int_add(ck, o, "at")?))
                        .collect::<R<Vec<_>>>()?;
                    g.position_of(&src, &from)
                })?;
            }
            OpKind::Dot { .. } => self.gpu_dot(op)?,
            OpKind::ConvertLayout => self.convert_layout(op)?,
            OpKind::Reduce { kind, axis } => self.gpu_reduce(op, *kind, *axis)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Every thread of the block arrives before any goes on; memory written
    /// before is visible after.
    pub(super) fn barrier(&self) -> R<()> {
        self.wait_copies()?;
        match self.threads()?.flavor {
            Flavor::Nvptx => self.call_void(
                "llvm.nvvm.barrier.cta.sync.aligned.all",
                &[],
                &[self.ctx.i32_type().const_zero().into()],
            ),
            Flavor::Emulated => {
                let decl =
                    self.declare(EMULATOR_HOOKS[2], self.ctx.void_type().fn_type(&[], false));
                self.b.build_call(decl, &[], "")?;
                Ok(())
            }
        }
    }

    /// Waits for this thread's asynchronous copies, if any are in flight
    /// (before a barrier, a read of shared memory, the end of a loop
    /// iteration or of the kernel).
    pub(super) fn wait_copies(&self) -> R<()> {
        let th = self.threads()?;
        if std::mem::take(&mut *th.copying.borrow_mut()).is_empty() {
            return Ok(());
        }
        match th.flavor {
            Flavor::Nvptx => self.call_void("llvm.nvvm.cp.async.wait.all", &[], &[]),
            // The emulator's copies are done when issued.
            Flavor::Emulated => Ok(()),
        }
    }

    /// `tile.store` of a tile just loaded from global memory into shared
    /// memory, the loaded tile used nowhere else, padded with zeros if at
    /// all: each thread's elements are copied by `cp.async` without passing
    /// through registers (elements the load's mask or bounds turn off are
    /// filled with zeros). In the flat layout a copy is an element of 4 or 8
    /// bytes; in `#blocked<v>` a thread's run of `v` elements contiguous in
    /// both buffers is one copy of 16 bytes where it is aligned and wholly
    /// on or off, else element by element (16-bit ones through registers).
    /// Returns whether it was.
    fn async_copy(&mut self, op: &OpData, index: &[Affine]) -> R<bool> {
        let f = self.f;
        let (v, dst) = (op.operands[0], op.operands[1]);
        let Some(load) = f.ops.iter().find(|o| o.results.first() == Some(&v)) else {
            return Ok(false);
        };
        let OpKind::Load { index: from, pad } = &load.kind else {
            return Ok(false);
        };
        let space = |b: Value| match f.ty(b) {
            Type::Buffer(t) => Some((t.space, t.dtype)),
            _ => None,
        };
        let (Some((dlc_tile::Space::Global, d)), Some((dlc_tile::Space::Shared, _))) =
            (space(load.operands[0]), space(dst))
        else {
            return Ok(false);
        };
        let uses = f.ops.iter().filter(|o| o.operands.contains(&v)).count();
        // The copy reads its source later: nothing in the function may
        // write the source buffer (or a view of it).
        let source = f.root_buffer(load.operands[0]);
        let written = f.ops.iter().any(|o| {
            matches!(o.kind, OpKind::Store { .. }) && f.root_buffer(o.operands[1]) == source
        });
        if written || op.operands.len() != 2 || uses != 1 || pad.is_some_and(|p| p != 0.0) {
            return Ok(false);
        }
        let shape = f.ty(v).shape().unwrap_or(&[]).to_vec();
        let src = self.access(load.operands[0], from, shape.len())?;
        let to = self.access(dst, index, shape.len())?;
        let size = d.size_bytes();
        let run = match f.ty(v) {
            Type::Tile(t) => match t.layout {
                Layout::Blocked(w)
                    if w * size == 16
                        && src.grad.last() == Some(&1)
                        && to.grad.last() == Some(&1)
                        && shape.last().is_some_and(|n| n % w == 0) =>
                {
                    w
                }
                _ => 1,
            },
            _ => 1,
        };
        if run == 1 && !matches!(size, 4 | 8) {
            return Ok(false);
        }
        let len: usize = shape.iter().product();
        let mask = match load.operands.get(1) {
            Some(&m) => Some(self.flatten(m)?),
            None => None,
        };
        let i32t = self.ctx.i32_type();
        let n = self.per_thread(v)?;
        for j0 in (0..n).step_by(run) {
            // Each element's source and destination, and whether it is on.
            let mut elements = Vec::with_capacity(run);
            for j in j0..j0 + run {
                let e = self.element(v, j)?;
                let c = self.coordinates(e, &shape)?;
                let (off, inside) = self.locate(&src, &c, pad.is_some())?;
                let on = self.and_maybe(mask.as_ref().map(|m| m[j].into_int_value()), inside)?;
                let (doff, _) = self.locate(&to, &c, false)?;
                elements.push((self.element_at(&src, off)?, self.element_at(&to, doff)?, on));
            }
            // A run lies in one row (whole runs per row): it is there or not.
            let present = self.present_of(v, j0, len)?;
            self.when(present, |g| {
                if run == 1 {
                    let (from_p, to_p, on) = elements[0];
                    return g.copy_element(from_p, to_p, on, &src, d);
                }
                let ons: Vec<IntValue<'ctx>> = elements.iter().filter_map(|e| e.2).collect();
                let (all, none) = match ons.split_first() {
                    None => (None, None),
                    Some((&first, rest)) => {
                        let (mut all, mut any) = (first, first);
                        for &o in rest {
                            all = g.b.build_and(all, o, "all")?;
                            any = g.b.build_or(any, o, "any")?;
                        }
                        (Some(all), Some(g.b.build_not(any, "none")?))
                    }
                };
                let (from0, to0, _) = elements[0];
                let i64t = g.ctx.i64_type();
                let a = g.b.build_ptr_to_int(from0, i64t, "a")?;
                let b = g.b.build_ptr_to_int(to0, i64t, "b")?;
                let ab = g.b.build_or(a, b, "ab")?;
                let ab = g.b.build_and(ab, g.i64v(15), "ab")?;
                let aligned =
                    g.b.build_int_compare(IntPredicate::EQ, ab, g.i64v(0), "aligned")?;
                // Wholly on copies 16 bytes, wholly off fills 16 bytes with
                // zeros; either way both ends are 16-byte aligned.
                let whole = g.and_maybe(Some(aligned), all)?.unwrap_or(aligned);
                let wide = match none {
                    Some(none) => {
                        let none = g.b.build_and(none, aligned, "none")?;
                        g.b.build_or(whole, none, "wide")?
                    }
                    None => whole,
                };
                g.when(Some(wide), |g| {
                    let from = g.b.build_select(whole, from0, src.pointer, "src")?;
                    let bytes = g.b.build_select(
                        whole,
                        i32t.const_int(16, false),
                        i32t.const_zero(),
                        "bytes",
                    )?;
                    g.cp_async(to0, from.into_pointer_value(), 16, bytes.into_int_value())
                })?;
                let narrow = g.b.build_not(wide, "narrow")?;
                g.when(Some(narrow), |g| {
                    for &(from_p, to_p, on) in &elements {
                        g.copy_element(from_p, to_p, on, &src, d)?;
                    }
                    Ok(())
                })
            })?;
        }
        self.threads()?
            .copying
            .borrow_mut()
            .push((dst, index.to_vec()));
        Ok(true)
    }

    /// One element of a copy into shared memory, zero where `on` is false:
    /// by `cp.async` for 4 and 8 bytes, through registers otherwise.
    fn copy_element(
        &self,
        from_p: PointerValue<'ctx>,
        to_p: PointerValue<'ctx>,
        on: Option<IntValue<'ctx>>,
        src: &super::tile::Access<'ctx>,
        d: DType,
    ) -> R<()> {
        let (i32t, size) = (self.ctx.i32_type(), d.size_bytes() as u64);
        // An element turned off reads nothing (zero bytes from the
        // buffer's start) and is filled with zeros.
        let from_p = match on {
            Some(on) => self
                .b
                .build_select(on, from_p, src.pointer, "src")?
                .into_pointer_value(),
            None => from_p,
        };
        if !matches!(size, 4 | 8) {
            let x = self.load_element(from_p, d)?;
            let x = match on {
                Some(on) => self.b.build_select(on, x, self.constant(0.0, d), "x")?,
                None => x,
            };
            return self.store_element(to_p, x, d);
        }
        let bytes = match on {
            None => i32t.const_int(size, false),
            Some(on) => self
                .b
                .build_select(on, i32t.const_int(size, false), i32t.const_zero(), "bytes")?
                .into_int_value(),
        };
        self.cp_async(to_p, from_p, size, bytes)
    }

    /// `cp.async` of `size` bytes (4, 8 or 16) from global `from_p` to
    /// shared `to_p`, `bytes` of them read and the rest zeros.
    fn cp_async(
        &self,
        to_p: PointerValue<'ctx>,
        from_p: PointerValue<'ctx>,
        size: u64,
        bytes: IntValue<'ctx>,
    ) -> R<()> {
        let i32t = self.ctx.i32_type();
        match self.threads()?.flavor {
            Flavor::Nvptx => {
                let shared = self.ctx.ptr_type(AddressSpace::from(3u16));
                let global = self.ctx.ptr_type(AddressSpace::from(1u16));
                let to_s = self.b.build_address_space_cast(to_p, shared, "dst")?;
                let from_g = self.b.build_address_space_cast(from_p, global, "src")?;
                // 16 bytes bypass L1 (`.cg`), as operand blocks are read once.
                let cache = if size == 16 { "cg" } else { "ca" };
                self.call_void(
                    &format!("llvm.nvvm.cp.async.{cache}.shared.global.{size}.s"),
                    &[],
                    &[to_s.into(), from_g.into(), bytes.into()],
                )
            }
            Flavor::Emulated => {
                let ptr = self.ctx.ptr_type(AddressSpace::default());
                let decl = self.declare(
                    EMULATOR_HOOKS[10],
                    self.ctx
                        .void_type()
                        .fn_type(&[ptr.into(), ptr.into(), i32t.into(), i32t.into()], false),
                );
                self.b.build_call(
                    decl,
                    &[
                        to_p.into(),
                        from_p.into(),
                        i32t.const_int(size, false).into(),
                        bytes.into(),
                    ],
                    "",
                )?;
                Ok(())
            }
        }
    }

    fn byte_pointer(&self, base: PointerValue<'ctx>, off: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        // SAFETY (LLVM IR semantics): offsets are planned inside the memory.
        Ok(unsafe {
            self.b
                .build_in_bounds_gep(self.ctx.i8_type(), base, &[off], "at")?
        })
    }

    pub(super) fn i64v(&self, v: i64) -> IntValue<'ctx> {
        self.ctx.i64_type().const_int(v as u64, true)
    }

    /// Elements of tile `v` each thread holds: in the flat layout its
    /// share, in `#mma` four per 16 x 8 tile of each round of the warps, in
    /// `#blocked<w>` its runs of `w`.
    pub(super) fn per_thread(&self, v: Value) -> R<usize> {
        let count = self.threads()?.count;
        match self.f.ty(v) {
            Type::Tile(t) if matches!(t.layout, Layout::Mma(_)) => {
                Ok(4 * mma_rounds(t.shape[0], t.shape[1], count))
            }
            Type::Tile(t) if let Layout::Blocked(w) = t.layout => {
                Ok(t.len().div_ceil(count * w) * w)
            }
            t => Ok(t
                .shape()
                .unwrap_or(&[])
                .iter()
                .product::<usize>()
                .div_ceil(count)),
        }
    }

    /// The row-major position of element `j` of this thread: `t + T j`.
    fn position(&self, j: usize) -> R<IntValue<'ctx>> {
        let th = self.threads()?;
        Ok(self
            .b
            .build_int_add(th.tid, self.i64v((th.count * j) as i64), "e")?)
    }

    /// The row-major position of this thread's element `j` of tile `v`:
    /// [`Gen::position`] in the flat layout; in `#blocked<w>` element `j %
    /// w` of the thread's run `j / w`, run `(j / w) T + t` of the tile.
    fn element(&self, v: Value, j: usize) -> R<IntValue<'ctx>> {
        match self.f.ty(v) {
            Type::Tile(t) if let Layout::Blocked(w) = t.layout => {
                let th = self.threads()?;
                let run =
                    self.b
                        .build_int_add(th.tid, self.i64v(((j / w) * th.count) as i64), "run")?;
                let e = self.b.build_int_mul(run, self.i64v(w as i64), "e")?;
                Ok(self.b.build_int_add(e, self.i64v((j % w) as i64), "e")?)
            }
            _ => self.position(j),
        }
    }

    /// Whether this thread's element `j` of tile `v` ([`Gen::element`])
    /// exists in its `len` elements: `None` when it does for every thread.
    fn present_of(&self, v: Value, j: usize, len: usize) -> R<Option<IntValue<'ctx>>> {
        match self.f.ty(v) {
            Type::Tile(t) if let Layout::Blocked(w) = t.layout => {
                let count = self.threads()?.count;
                if (j / w + 1) * count * w <= len {
                    return Ok(None);
                }
                let e = self.element(v, j)?;
                Ok(Some(self.b.build_int_compare(
                    IntPredicate::ULT,
                    e,
                    self.i64v(len as i64),
                    "present",
                )?))
            }
            _ => self.present(j, len),
        }
    }

    /// Whether element `j` of this thread exists in a tile of `len`
    /// elements: `None` when it does for every thread.
    fn present(&self, j: usize, len: usize) -> R<Option<IntValue<'ctx>>> {
        let count = self.threads()?.count;
        if (j + 1) * count <= len {
            return Ok(None);
        }
        let e = self.position(j)?;
        Ok(Some(self.b.build_int_compare(
            IntPredicate::ULT,
            e,
            self.i64v(len as i64),
            "present",
        )?))
    }

    /// The coordinates of row-major position `e` in `shape`.
    fn coordinates(&self, e: IntValue<'ctx>, shape: &[usize]) -> R<Vec<IntValue<'ctx>>> {
        let mut c = vec![self.i64v(0); shape.len()];
        let mut rest = e;
        for k in (0..shape.len()).rev() {
            let n = self.i64v(shape[k] as i64);
            if k == 0 {
                c[k] = rest;
            } else {
                c[k] = self.b.build_int_unsigned_rem(rest, n, "c")?;
                rest = self.b.build_int_unsigned_div(rest, n, "rest")?;
            }
        }
        Ok(c)
    }

    /// The row-major position of coordinates `c` in `shape`.
    pub(super) fn position_of(&self, c: &[IntValue<'ctx>], shape: &[usize]) -> R<IntValue<'ctx>> {
        let mut e = self.i64v(0);
        for (k, &ck) in c.iter().enumerate() {
            e = self.b.build_int_mul(e, self.i64v(shape[k] as i64), "e")?;
            e = self.b.build_int_add(e, ck, "e")?;
        }
        Ok(e)
    }

    fn and_maybe(
        &self,
        a: Option<IntValue<'ctx>>,
        b: Option<IntValue<'ctx>>,
    ) -> R<Option<IntValue<'ctx>>> {
        Ok(match (a, b) {
            (Some(a), Some(b)) => Some(self.b.build_and(a, b, "on")?),
            (a, None) => a,
            (None, b) => b,
        })
    }

    /// Emits `body` where `cond` holds (always when `None`).
    fn when(
        &mut self,
        cond: Option<IntValue<'ctx>>,
        body: impl FnOnce(&mut Self) -> R<()>,
    ) -> R<()> {
        let Some(cond) = cond else {
            return body(self);
        };
        let then = self.ctx.append_basic_block(self.func, "then");
        let done = self.ctx.append_basic_block(self.func, "done");
        self.b.build_conditional_branch(cond, then, done)?;
        self.b.position_at_end(then);
        body(self)?;
        self.b.build_unconditional_branch(done)?;
        self.b.position_at_end(done);
        Ok(())
    }

    pub(super) fn set(&mut self, v: Value, elements: Vec<BV<'ctx>>) -> R<()> {
        if self.is_tile(v) {
            self.chunks.insert(v, elements);
        } else {
            let s = elements
                .first()
                .copied()
                .ok_or_else(|| CodegenError::Invalid("a scalar without a value".into()))?;
            self.vals.insert(v, s);
        }
        Ok(())
    }

    /// A binary op, where an integer division by zero records its status
    /// (for elements that exist) and divides by one.
    pub(super) fn gpu_binary(
        &self,
        op: BinaryOp,
        x: BV<'ctx>,
        y: BV<'ctx>,
        d: DType,
        present: Option<IntValue<'ctx>>,
    ) -> R<BV<'ctx>> {
        if self.gpu.is_none() || op != BinaryOp::Div || d.is_float() {
            return self.binary(op, x, y, d);
        }
        let t = y.into_int_value().get_type();
        let zero = self.b.build_int_compare(
            IntPredicate::EQ,
            y.into_int_value(),
            t.const_zero(),
            "zero",
        )?;
        let failed = match present {
            Some(p) => self.b.build_and(zero, p, "failed")?,
            None => zero,
        };
        let status = self.threads()?.status;
        let code = self
            .ctx
            .i32_type()
            .const_int(self.status_of(STATUS_DIVISION_BY_ZERO) as u64, false);
        let old = self.b.build_load(self.ctx.i32_type(), status, "old")?;
        let new = self.b.build_select(failed, code.into(), old, "status")?;
        // Every thread writes the word back; one failing is enough.
        let then = self.ctx.append_basic_block(self.func, "div.fail");
        let done = self.ctx.append_basic_block(self.func, "div.ok");
        self.b.build_conditional_branch(failed, then, done)?;
        self.b.position_at_end(then);
        self.b.build_store(status, new)?;
        self.b.build_unconditional_branch(done)?;
        self.b.position_at_end(done);
        let safe =
            self.b
                .build_select(zero, t.const_int(1, false), y.into_int_value(), "divisor")?;
        self.binary(op, x, safe, d)
    }

    /// An element-wise op, element by element of this thread.
    pub(super) fn gpu_elementwise(
        &mut self,
        op: &OpData,
        f: impl Fn(&Self, &[BV<'ctx>], Option<IntValue<'ctx>>) -> R<BV<'ctx>>,
    ) -> R<()> {
        let r = op.results[0];
        let args = op
            .operands
            .iter()
            .map(|v| self.flatten(*v))
            .collect::<R<Vec<_>>>()?;
        let len: usize = self.f.ty(r).shape().unwrap_or(&[]).iter().product();
        let n = if self.is_tile(r) {
            self.per_thread(r)?
        } else {
            1
        };
        let mut out = Vec::with_capacity(n);
        for j in 0..n {
            let xs: Vec<BV<'ctx>> = args.iter().map(|a| a[j.min(a.len() - 1)]).collect();
            let present = if self.is_tile(r) {
                self.present(j, len)?
            } else {
                None
            };
            out.push(f(self, &xs, present)?);
        }
        self.set(r, out)
    }

    /// The address of element offset `off` (in elements) of an access.
    fn element_at(
        &self,
        a: &super::tile::Access<'ctx>,
        off: IntValue<'ctx>,
    ) -> R<PointerValue<'ctx>> {
        self.element_pointer(a, off)
    }

    /// Offset (elements) of an access at tile coordinates `c`, and whether
    /// every dimension's index is inside the buffer.
    fn locate(
        &self,
        a: &super::tile::Access<'ctx>,
        c: &[IntValue<'ctx>],
        check: bool,
    ) -> R<(IntValue<'ctx>, Option<IntValue<'ctx>>)> {
        let mut off = a.base;
        for (k, &ck) in c.iter().enumerate() {
            if a.grad[k] != 0 {
                let t = self.b.build_int_mul(ck, self.i64v(a.grad[k]), "t")?;
                off = self.b.build_int_add(off, t, "off")?;
            }
        }
        let mut inside = None;
        if check {
            for (b, coeffs, extent) in &a.dims {
                let mut idx = *b;
                for (k, &ck) in c.iter().enumerate() {
                    if coeffs.get(k).copied().unwrap_or(0) != 0 {
                        let t = self.b.build_int_mul(ck, self.i64v(coeffs[k]), "t")?;
                        idx = self.b.build_int_add(idx, t, "idx")?;
                    }
                }
                let ok = self.b.build_int_compare(
                    IntPredicate::ULT,
                    idx,
                    self.i64v(*extent as i64),
                    "inside",
                )?;
                inside = self.and_maybe(inside, Some(ok))?;
            }
        }
        Ok((off, inside))
    }

    /// Loads one element of type `d` from `p` (bool stored as a byte).
    fn load_element(&self, p: PointerValue<'ctx>, d: DType) -> R<BV<'ctx>> {
        let raw = self.b.build_load(storage_type(self.ctx, d), p, "ld")?;
        if d == DType::Bool {
            let i8t = self.ctx.i8_type();
            return Ok(self
                .b
                .build_int_compare(
                    IntPredicate::NE,
                    raw.into_int_value(),
                    i8t.const_zero(),
                    "b",
                )?
                .into());
        }
        Ok(raw)
    }

    /// Stores one element of type `d` to `p` (bool as a byte).
    fn store_element(&self, p: PointerValue<'ctx>, v: BV<'ctx>, d: DType) -> R<()> {
        let v: BV<'ctx> = if d == DType::Bool {
            self.b
                .build_int_z_extend(v.into_int_value(), self.ctx.i8_type(), "byte")?
                .into()
        } else {
            v
        };
        self.b.build_store(p, v)?;
        Ok(())
    }

    /// `tile.load` (or a scalar load).
    pub(super) fn gpu_load(&mut self, op: &OpData, index: &[Affine], pad: Option<f64>) -> R<()> {
        // A read of shared memory waits for this thread's copies into it,
        // unless they all went to another slot (a constant index that
        // differs along some dimension).
        let buf = op.operands[0];
        let pending = self
            .threads()?
            .copying
            .borrow()
            .iter()
            .any(|(b, at)| *b == buf && !Affine::constants_differ(at, index));
        if pending {
            self.wait_copies()?;
        }
        let r = op.results[0];
        let shape = self.f.ty(r).shape().unwrap_or(&[]).to_vec();
        let a = self.access(op.operands[0], index, shape.len())?;
        let d = a.dtype;
        let mask = match op.operands.get(1) {
            Some(&m) => Some(self.flatten(m)?),
            None => None,
        };
        let len: usize = shape.iter().product();
        let n = if shape.is_empty() {
            1
        } else {
            self.per_thread(r)?
        };
        let fill = self.constant(pad.unwrap_or(0.0), d);
        let mut out = Vec::with_capacity(n);
        for j in 0..n {
            let (c, present) = if shape.is_empty() {
                (vec![], None)
            } else {
                let e = self.element(r, j)?;
                (self.coordinates(e, &shape)?, self.present_of(r, j, len)?)
            };
            let (off, inside) = self.locate(&a, &c, pad.is_some())?;
            let masked = mask.as_ref().map(|m| m[j].into_int_value());
            let on = self.and_maybe(present, masked)?;
            let on = self.and_maybe(on, inside)?;
            let p = self.element_at(&a, off)?;
            let v = match on {
                None => self.load_element(p, d)?,
                Some(on) => {
                    // Elements that are off read the buffer's first one
                    // (always there) and are replaced by the pad.
                    let p = self
                        .b
                        .build_select(on, p, a.pointer, "p")?
                        .into_pointer_value();
                    let v = self.load_element(p, d)?;
                    self.b.build_select(on, v, fill, "v")?
                }
            };
            out.push(v);
        }
        self.set(r, out)
    }

    /// `tile.store` (or a scalar store: every thread writes the same value).
    pub(super) fn gpu_store(&mut self, op: &OpData, index: &[Affine]) -> R<()> {
        if self.async_copy(op, index)? {
            return Ok(());
        }
        let v = op.operands[0];
        let shape = self.f.ty(v).shape().unwrap_or(&[]).to_vec();
        let a = self.access(op.operands[1], index, shape.len())?;
        let d = a.dtype;
        let data = self.flatten(v)?;
        let mask = match op.operands.get(2) {
            Some(&m) => Some(self.flatten(m)?),
            None => None,
        };
        let len: usize = shape.iter().product();
        for (j, &x) in data.iter().enumerate() {
            let (c, present) = if shape.is_empty() {
                (vec![], None)
            } else {
                let e = self.element(v, j)?;
                (self.coordinates(e, &shape)?, self.present_of(v, j, len)?)
            };
            let (off, _) = self.locate(&a, &c, false)?;
            let masked = mask.as_ref().map(|m| m[j].into_int_value());
            let on = self.and_maybe(present, masked)?;
            let p = self.element_at(&a, off)?;
            self.when(on, |g| g.store_element(p, x, d))?;
        }
        Ok(())
    }

    /// `tile.mask`.
    pub(super) fn gpu_mask(&mut self, op: &OpData, limits: &[Affine]) -> R<()> {
        let r = op.results[0];
        let shape = self.f.ty(r).shape().unwrap_or(&[]).to_vec();
        let limits = limits
            .iter()
            .map(|l| self.affine_base(l))
            .collect::<R<Vec<_>>>()?;
        let mut out = Vec::new();
        for j in 0..self.per_thread(r)? {
            let e = self.element(r, j)?;
            let c = self.coordinates(e, &shape)?;
            let mut on = self.ctx.bool_type().const_int(1, false);
            for (ck, l) in c.iter().zip(&limits) {
                let below = self
                    .b
                    .build_int_compare(IntPredicate::SLT, *ck, *l, "below")?;
                on = self.b.build_and(on, below, "on")?;
            }
            out.push(on.into());
        }
        self.set(r, out)
    }

    /// A pointer to element `e` of the staging area, staged as `d`.
    fn staged(&self, e: IntValue<'ctx>, d: DType, first: u64) -> R<PointerValue<'ctx>> {
        let th = self.threads()?;
        let base = self.byte_pointer(th.shared, self.i64v((th.staging + first) as i64))?;
        // SAFETY (LLVM IR semantics): the staging area holds the operand.
        Ok(unsafe {
            self.b
                .build_in_bounds_gep(storage_type(self.ctx, d), base, &[e], "staged")?
        })
    }

    /// Writes tile `v` (as type `d`) to the staging area from byte `first`,
    /// each thread its own elements.
    fn stage(&mut self, v: Value, d: DType, first: u64) -> R<()> {
        self.stage_as(v, d, first, false)
    }

    /// [`Self::stage`], of a matrix transposed when `transposed`.
    fn stage_as(&mut self, v: Value, d: DType, first: u64, transposed: bool) -> R<()> {
        let from = self.tdtype(v)?;
        let shape = self.f.ty(v).shape().unwrap_or(&[]).to_vec();
        let len: usize = shape.iter().product();
        let xs = self.flatten(v)?;
        for (j, &x) in xs.iter().enumerate() {
            let present = self.present(j, len)?;
            let x = if from == d { x } else { self.cast(x, from, d)? };
            let mut e = self.position(j)?;
            if transposed {
                let c = self.coordinates(e, &shape)?;
                e = self.position_of(&[c[1], c[0]], &[shape[1], shape[0]])?;
            }
            self.when(present, |g| {
                let p = g.staged(e, d, first)?;
                g.store_element(p, x, d)
            })?;
        }
        Ok(())
    }

    /// `tile.trans` and `tile.broadcast`: result element at coordinates
    /// `c` is operand element `source(c)`, moved through shared memory.
    pub(super) fn gpu_move(
        &mut self,
        op: &OpData,
        source: impl Fn(&Self, &[IntValue<'ctx>]) -> R<IntValue<'ctx>>,
    ) -> R<()> {
        let (x, r) = (op.operands[0], op.results[0]);
        let d = self.tdtype(x)?;
        let shape = self.f.ty(r).shape().unwrap_or(&[]).to_vec();
        let len: usize = shape.iter().product();
        self.barrier()?;
        self.stage(x, d, 0)?;
        self.barrier()?;
        let mut out = Vec::new();
        for j in 0..self.per_thread(r)? {
            let e = self.position(j)?;
            let c = self.coordinates(e, &shape)?;
            let src = source(self, &c)?;
            let src = match self.present(j, len)? {
                Some(p) => self
                    .b
                    .build_select(p, src, self.i64v(0), "src")?
                    .into_int_value(),
                None => src,
            };
            let p = self.staged(src, d, 0)?;
            out.push(self.load_element(p, d)?);
        }
        self.set(r, out)
    }

    /// Every lane of the warp gets `x` (an i32) of lane `lane ^ mask`.
    fn shuffle_xor(&self, x: IntValue<'ctx>, mask: u32) -> R<IntValue<'ctx>> {
        let i32t = self.ctx.i32_type();
        let m = i32t.const_int(u64::from(mask), false);
        let v = match self.threads()?.flavor {
            Flavor::Nvptx => self.call(
                "llvm.nvvm.shfl.sync.bfly.i32",
                &[],
                &[
                    i32t.const_all_ones().into(),
                    x.into(),
                    m.into(),
                    i32t.const_int(31, false).into(),
                ],
            )?,
            Flavor::Emulated => {
                let decl = self.declare(
                    EMULATOR_HOOKS[8],
                    i32t.fn_type(&[i32t.into(), i32t.into()], false),
                );
                self.b
                    .build_call(decl, &[x.into(), m.into()], "shfl")?
                    .try_as_basic_value()
                    .basic()
                    .ok_or_else(|| CodegenError::Llvm("no value".into()))?
            }
        };
        Ok(v.into_int_value())
    }

    /// A whole f32 or i32 tile `x` combined with `bop` into a scalar every
    /// thread holds: each thread folds its elements (the identity where it
    /// has none), each warp folds its threads' with butterfly shuffles, and
    /// the warps' results meet in shared memory.
    fn warp_reduce(&mut self, x: Value, bop: BinaryOp, identity: f64, d: DType) -> R<BV<'ctx>> {
        let len: usize = self.f.ty(x).shape().unwrap_or(&[]).iter().product();
        let xs = self.flatten(x)?;
        let none = self.constant(identity, d);
        let mut acc: Option<BV<'ctx>> = None;
        for (j, &v) in xs.iter().enumerate() {
            let v = match self.present(j, len)? {
                Some(p) => self.b.build_select(p, v, none, "v")?,
                None => v,
            };
            acc = Some(match acc {
                None => v,
                Some(a) => self.binary(bop, a, v, d)?,
            });
        }
        let mut acc = acc.unwrap_or(none);
        let i32t = self.ctx.i32_type();
        let mut mask = WARP as u32 / 2;
        while mask > 0 {
            let bits = if d == DType::F32 {
                self.b.build_bit_cast(acc, i32t, "bits")?.into_int_value()
            } else {
                acc.into_int_value()
            };
            let other = self.shuffle_xor(bits, mask)?;
            let other: BV<'ctx> = if d == DType::F32 {
                self.b.build_bit_cast(other, self.ctx.f32_type(), "other")?
            } else {
                other.into()
            };
            acc = self.binary(bop, acc, other, d)?;
            mask /= 2;
        }
        let (tid, warps) = {
            let th = self.threads()?;
            (th.tid, th.count / WARP)
        };
        let lane = self.b.build_and(tid, self.i64v(WARP as i64 - 1), "lane")?;
        let warp = self
            .b
            .build_int_unsigned_div(tid, self.i64v(WARP as i64), "warp")?;
        let first = self
            .b
            .build_int_compare(IntPredicate::EQ, lane, self.i64v(0), "first")?;
        self.barrier()?;
        let slot = self.staged(warp, d, 0)?;
        self.when(Some(first), |g| g.store_element(slot, acc, d))?;
        self.barrier()?;
        let mut total = self.load_element(self.staged(self.i64v(0), d, 0)?, d)?;
        for w in 1..warps {
            let v = self.load_element(self.staged(self.i64v(w as i64), d, 0)?, d)?;
            total = self.binary(bop, total, v, d)?;
        }
        self.barrier()?;
        Ok(total)
    }

    /// `tile.reduce`: each thread combines, for each of its result
    /// elements, the operand's elements along the axis from shared memory.
    pub(super) fn gpu_reduce(&mut self, op: &OpData, kind: ReduceKind, axis: usize) -> R<()> {
        let (x, r) = (op.operands[0], op.results[0]);
        let d = self.tdtype(x)?;
        let bop = super::tile::combining(kind)?;
        let from = self.f.ty(x).shape().unwrap_or(&[]).to_vec();
        let to = self.f.ty(r).shape().unwrap_or(&[]).to_vec();
        let identity = match (kind, d) {
            (ReduceKind::Sum, _) => Some(0.0),
            (ReduceKind::Prod, _) => Some(1.0),
            (ReduceKind::Max, DType::F32) => Some(f64::NEG_INFINITY),
            (ReduceKind::Min, DType::F32) => Some(f64::INFINITY),
            (ReduceKind::Max, _) => d.int_min(),
            (ReduceKind::Min, _) => d.int_max(),
            (ReduceKind::Mean, _) => None,
        };
        if let Some(identity) = identity
            && to.is_empty()
            && matches!(d, DType::F32 | DType::I32)
            && self.threads()?.count.is_multiple_of(WARP)
        {
            let v = self.warp_reduce(x, bop, identity, d)?;
            return self.set(r, vec![v]);
        }
        let extent = from[axis];
        let stride: usize = from[axis + 1..].iter().product();
        self.barrier()?;
        self.stage(x, d, 0)?;
        self.barrier()?;
        let (n, len) = if to.is_empty() {
            (1, 1)
        } else {
            (self.per_thread(r)?, to.iter().product::<usize>())
        };
        let mut out = Vec::with_capacity(n);
        for j in 0..n {
            let c = if to.is_empty() {
                vec![]
            } else {
                let e = self.position(j)?;
                self.coordinates(e, &to)?
            };
            let mut full = c.clone();
            full.insert(axis, self.i64v(0));
            let mut first = self.position_of(&full, &from)?;
            if !to.is_empty()
                && let Some(p) = self.present(j, len)?
            {
                first = self
                    .b
                    .build_select(p, first, self.i64v(0), "first")?
                    .into_int_value();
            }
            let init = self.load_element(self.staged(first, d, 0)?, d)?;
            let acc = self.counted_carrying(
                self.i64v(1),
                self.i64v(extent as i64),
                1,
                &[init],
                |g, t, acc| {
                    let step = g.b.build_int_mul(t, g.i64v(stride as i64), "step")?;
                    let at = g.b.build_int_add(first, step, "at")?;
                    let v = g.load_element(g.staged(at, d, 0)?, d)?;
                    Ok(vec![g.binary(bop, acc[0], v, d)?])
                },
            )?;
            out.push(acc[0]);
        }
        self.barrier()?;
        self.set(r, out)
    }

    /// `tile.dot`: both operands staged in shared memory (as the
    /// accumulator's type), each thread accumulating its elements of the
    /// result over the depth.
    pub(super) fn gpu_dot(&mut self, op: &OpData) -> R<()> {
        let (a, b, acc, r) = (
            op.operands[0],
            op.operands[1],
            op.operands[2],
            op.results[0],
        );
        let th = self.threads()?;
        if let Some(t) = tensor_core_dot(self.f, op, th.count, &th.mma)? {
            return self.mma_dot(op, t);
        }
        if matches!(self.f.ty(acc), Type::Tile(x) if x.layout != Layout::Flat) {
            return Err(CodegenError::Invalid(
                "a tile.dot without a tensor-core mark on an #mma accumulator".into(),
            ));
        }
        let sa = self.f.ty(a).shape().unwrap_or(&[]).to_vec();
        let sb = self.f.ty(b).shape().unwrap_or(&[]).to_vec();
        let (m, k, n) = (sa[0], sa[1], sb[1]);
        let acc_d = self.tdtype(acc)?;
        let d = self.tdtype(a)?;
        let (src_a, src_b) = (self.loaded_from_shared(a, r), self.loaded_from_shared(b, r));
        // Rows in place are at their buffer's pitch, staged ones row-major.
        let pitch_a = src_a.as_ref().map_or(k, |s| s.pitch);
        let pitch_b = src_b.as_ref().map_or(n, |s| s.pitch);
        // A staged right operand follows a staged left one.
        let b_first = if src_a.is_some() {
            0
        } else {
            (m * k * stage_size(acc_d)) as u64
        };
        if src_a.is_none() || src_b.is_none() {
            self.barrier()?;
            if src_a.is_none() {
                self.stage(a, acc_d, 0)?;
            }
            if src_b.is_none() {
                self.stage(b, acc_d, b_first)?;
            }
            self.barrier()?;
        }
        let init = self.flatten(acc)?;
        let mut rows = Vec::with_capacity(init.len());
        let mut cols = Vec::with_capacity(init.len());
        for j in 0..init.len() {
            let e = self.position(j)?;
            let e = match self.present(j, m * n)? {
                Some(p) => self
                    .b
                    .build_select(p, e, self.i64v(0), "e")?
                    .into_int_value(),
                None => e,
            };
            let nn = self.i64v(n as i64);
            rows.push(self.b.build_int_unsigned_div(e, nn, "row")?);
            cols.push(self.b.build_int_unsigned_rem(e, nn, "col")?);
        }
        let out =
            self.counted_carrying(self.i64v(0), self.i64v(k as i64), 1, &init, |g, p, accs| {
                let mut next = Vec::with_capacity(accs.len());
                for (j, &s) in accs.iter().enumerate() {
                    let ra = g.b.build_int_mul(rows[j], g.i64v(pitch_a as i64), "ra")?;
                    let ia = g.b.build_int_add(ra, p, "ia")?;
                    let rb = g.b.build_int_mul(p, g.i64v(pitch_b as i64), "rb")?;
                    let ib = g.b.build_int_add(rb, cols[j], "ib")?;
                    let x = g.operand_element(src_a, d, ia, acc_d, 0)?;
                    let y = g.operand_element(src_b, d, ib, acc_d, b_first)?;
                    next.push(if acc_d.is_float() {
                        g.call("llvm.fmuladd", &[x.get_type()], &[x, y, s])?
                    } else {
                        let prod = g.binary(BinaryOp::Mul, x, y, acc_d)?;
                        g.binary(BinaryOp::Add, s, prod, acc_d)?
                    });
                }
                Ok(next)
            })?;
        if src_a.is_none() || src_b.is_none() {
            self.barrier()?;
        }
        self.set(r, out)
    }

    /// [`in_shared`]'s place as a pointer.
    fn loaded_from_shared(&self, v: Value, user: Value) -> Option<InPlace<'ctx>> {
        let at = in_shared(self.f, v, user)?;
        let Type::Buffer(t) = self.f.ty(at.buffer) else {
            return None;
        };
        let base = self.get(at.buffer).ok()?.into_pointer_value();
        // SAFETY (LLVM IR semantics): the slot is inside the buffer.
        let slot = unsafe {
            self.b
                .build_in_bounds_gep(
                    storage_type(self.ctx, t.dtype),
                    base,
                    &[self.i64v(at.first)],
                    "slot",
                )
                .ok()?
        };
        // Shared buffers start 64-byte aligned (the plan's offsets).
        let size = t.dtype.size_bytes();
        Some(InPlace {
            slot,
            pitch: at.pitch,
            aligned: (at.first as usize * size).is_multiple_of(16)
                && (at.pitch * size).is_multiple_of(16),
        })
    }

    /// Element `e` of a product's operand of type `d`, read as `to`: from
    /// the shared buffer it is in (`e` counted at its pitch), else from the
    /// staging area at byte `first` (`e` row-major, staged as `to`).
    fn operand_element(
        &self,
        src: Option<InPlace<'ctx>>,
        d: DType,
        e: IntValue<'ctx>,
        to: DType,
        first: u64,
    ) -> R<BV<'ctx>> {
        match src {
            Some(InPlace { slot: base, .. }) => {
                // SAFETY (LLVM IR semantics): `e` is inside the tile the
                // buffer holds.
                let p = unsafe {
                    self.b
                        .build_in_bounds_gep(storage_type(self.ctx, d), base, &[e], "opnd")?
                };
                let x = self.load_element(p, d)?;
                if d == to { Ok(x) } else { self.cast(x, d, to) }
            }
            None => self.load_element(self.staged(e, to, first)?, to),
        }
    }

    /// A 32-bit word of the staging area at byte `off`.
    fn staged_word(&self, off: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let th = self.threads()?;
        let at = self
            .b
            .build_int_add(off, self.i64v(th.staging as i64), "at")?;
        self.word_at(th.shared, at)
    }

    /// The 32-bit word at byte `off` of `base`.
    fn word_at(&self, base: PointerValue<'ctx>, off: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let p = self.byte_pointer(base, off)?;
        Ok(self
            .b
            .build_load(self.ctx.i32_type(), p, "word")?
            .into_int_value())
    }

    /// `d = a b + c` for one 16 x 8 x 16 step of a warp: `mma.sync` on
    /// tensor cores (f16 or bf16 fragments in 32-bit registers, f32
    /// accumulators), or the emulator's warp-wide equivalent.
    fn mma(
        &self,
        d: DType,
        a: &[IntValue<'ctx>],
        b: &[IntValue<'ctx>],
        c: &[BV<'ctx>],
    ) -> R<Vec<BV<'ctx>>> {
        let f32t = self.ctx.f32_type();
        let i32t = self.ctx.i32_type();
        match self.threads()?.flavor {
            Flavor::Nvptx => {
                let half2 = self.ctx.f16_type().vec_type(2);
                let mut args: Vec<BV<'ctx>> = Vec::with_capacity(10);
                for &r in a.iter().chain(b) {
                    args.push(match d {
                        DType::F16 => self.b.build_bit_cast(r, half2, "h2")?,
                        // f32 to TF32, rounding to nearest (ties away).
                        DType::F32 => {
                            let x = self.b.build_bit_cast(r, f32t, "x")?;
                            self.call("llvm.nvvm.f2tf32.rna", &[], &[x])?
                        }
                        _ => r.into(),
                    });
                }
                args.extend_from_slice(c);
                let name = match d {
                    DType::F16 => "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
                    DType::F32 => "llvm.nvvm.mma.m16n8k8.row.col.tf32",
                    _ => "llvm.nvvm.mma.m16n8k16.row.col.bf16",
                };
                let r = self.call(name, &[], &args)?.into_struct_value();
                (0..4)
                    .map(|i| Ok(self.b.build_extract_value(r, i, "d")?))
                    .collect()
            }
            Flavor::Emulated => {
                let ptr = self.ctx.ptr_type(AddressSpace::default());
                let mut params: Vec<BasicMetadataTypeEnum<'ctx>> = vec![i32t.into(); 7];
                params.extend([BasicMetadataTypeEnum::from(f32t); 4]);
                params.push(ptr.into());
                let decl = self.declare(
                    EMULATOR_HOOKS[9],
                    self.ctx.void_type().fn_type(&params, false),
                );
                let out = self
                    .b
                    .build_array_alloca(f32t, i32t.const_int(4, false), "d")?;
                let kind = i32t.const_int(
                    match d {
                        DType::F16 => 0,
                        DType::BF16 => 1,
                        _ => 2,
                    },
                    false,
                );
                let mut args: Vec<inkwell::values::BasicMetadataValueEnum<'ctx>> =
                    vec![kind.into()];
                args.extend(
                    a.iter()
                        .chain(b)
                        .map(|&r| inkwell::values::BasicMetadataValueEnum::from(r)),
                );
                args.extend(
                    c.iter()
                        .map(|&v| inkwell::values::BasicMetadataValueEnum::from(v)),
                );
                args.push(out.into());
                self.b.build_call(decl, &args, "")?;
                (0..4)
                    .map(|i| {
                        // SAFETY (LLVM IR semantics): `out` holds four floats.
                        let p = unsafe {
                            self.b
                                .build_in_bounds_gep(f32t, out, &[self.i64v(i)], "di")?
                        };
                        Ok(self.b.build_load(f32t, p, "d")?)
                    })
                    .collect()
            }
        }
    }

    /// `ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16` for this
    /// lane's warp: `row` is the 16-byte row of matrix `lane / 8` this lane
    /// gives (its row `lane % 8`); the words this lane receives, one per
    /// matrix (row `lane / 4`, 16-bit elements `2 (lane % 4)` and the next;
    /// transposed: those rows of column `lane / 4`, low half first).
    fn ldmatrix(&self, row: PointerValue<'ctx>, count: u32, trans: bool) -> R<Vec<IntValue<'ctx>>> {
        let i32t = self.ctx.i32_type();
        match self.threads()?.flavor {
            Flavor::Nvptx => {
                let shared = self.ctx.ptr_type(AddressSpace::from(3u16));
                let p = self.b.build_address_space_cast(row, shared, "row")?;
                let name = format!(
                    "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{count}{}.b16",
                    if trans { ".trans" } else { "" }
                );
                // Overloaded on the pointer's address space (`.p3`).
                let r = self
                    .call(&name, &[shared.into()], &[p.into()])?
                    .into_struct_value();
                (0..count)
                    .map(|i| Ok(self.b.build_extract_value(r, i, "m")?.into_int_value()))
                    .collect()
            }
            Flavor::Emulated => {
                let ptr = self.ctx.ptr_type(AddressSpace::default());
                let decl = self.declare(
                    EMULATOR_HOOKS[11],
                    self.ctx
                        .void_type()
                        .fn_type(&[ptr.into(), i32t.into(), i32t.into(), ptr.into()], false),
                );
                let out = self
                    .b
                    .build_array_alloca(i32t, i32t.const_int(4, false), "m")?;
                let args = [
                    row.into(),
                    i32t.const_int(count.into(), false).into(),
                    i32t.const_int(trans.into(), false).into(),
                    out.into(),
                ];
                self.b.build_call(decl, &args, "")?;
                (0..count)
                    .map(|i| {
                        // SAFETY (LLVM IR semantics): `out` holds four words.
                        let p = unsafe {
                            self.b
                                .build_in_bounds_gep(i32t, out, &[self.i64v(i.into())], "mi")?
                        };
                        Ok(self.b.build_load(i32t, p, "m")?.into_int_value())
                    })
                    .collect()
            }
        }
    }

    /// `tile.dot` on tensor cores: the operands staged in shared memory
    /// (the right one transposed) unless read in place; each warp takes
    /// 16 x 8 tiles of the result in turn (all warps step together, a warp
    /// past the last tile computing one it does not keep, so every
    /// `mma.sync` is run by whole warps) and runs one `mma.sync` per step
    /// of the depth with fragments read as 32-bit words. An accumulator in
    /// the `#mma` layout is in those fragments already, and so is the
    /// result; a flat one goes through the staging area: each warp loads
    /// its fragment there and stores it back, then each thread reads its
    /// elements of the result.
    fn mma_dot(&mut self, op: &OpData, t: TensorCoreDot) -> R<()> {
        let (a, b, acc, r) = (
            op.operands[0],
            op.operands[1],
            op.operands[2],
            op.results[0],
        );
        let (a_at, b_at, c_at) = t.regions();
        let src = MmaOperands {
            a: self.loaded_from_shared(a, r),
            b: self.loaded_from_shared(b, r),
            a_at,
            b_at,
        };
        let held = self.grid_of(acc)?;
        let in_fragments = held.is_some();
        // A flat accumulator's tiles go to the warps as the best grid has
        // them, else in turns: a choice inside this product alone.
        let warps = self.threads()?.count / WARP;
        let grid = held.or_else(|| MmaGrid::choose(t.m, t.n, warps));
        let staged = mma_stages(self.f, op);
        if !staged && (src.a.is_none() || src.b.is_none()) {
            return Err(CodegenError::Invalid(
                "a tensor-core operand in shared memory has no address".into(),
            ));
        }
        if staged {
            self.barrier()?;
        }
        if src.a.is_none() {
            self.stage_as(a, t.d, a_at, false)?;
        }
        if src.b.is_none() {
            self.stage_as(b, t.d, b_at, true)?;
        }
        if !in_fragments {
            self.stage(acc, DType::F32, c_at)?;
        }
        if staged {
            self.barrier()?;
        }
        let lane = self.mma_lane()?;
        let rounds = mma_rounds(t.m, t.n, self.threads()?.count);
        if in_fragments {
            let c = self.flatten(acc)?;
            let sharing = mma_sharing(grid, t.m, t.n, self.threads()?.count);
            let mut tiles = Vec::with_capacity(rounds);
            for (round, &(a, b)) in sharing.iter().enumerate() {
                let (_, row0, col0) =
                    self.mma_tile(&lane, grid, self.i64v(round as i64), t.m, t.n)?;
                tiles.push(MmaTile { row0, col0, a, b });
            }
            let out = self.mma_steps(t, &lane, &tiles, &c[..4 * rounds], &src)?;
            if staged {
                // Nothing stages again before every warp has read.
                self.barrier()?;
            }
            return self.set(r, out);
        }
        let f32t = self.ctx.f32_type();
        self.counted(self.i64v(0), self.i64v(rounds as i64), |g, round| {
            let (active, row0, col0) = g.mma_tile(&lane, grid, round, t.m, t.n)?;
            let mut c_ptrs = Vec::with_capacity(4);
            for i in 0..4 {
                let e = g.fragment_position(&lane, row0, col0, i, t.n)?;
                c_ptrs.push(g.staged(e, DType::F32, c_at)?);
            }
            let c = c_ptrs
                .iter()
                .map(|&p| Ok(g.b.build_load(f32t, p, "c")?))
                .collect::<R<Vec<_>>>()?;
            let tile = MmaTile {
                row0,
                col0,
                a: 0,
                b: 0,
            };
            let done = g.mma_steps(t, &lane, &[tile], &c, &src)?;
            g.when(Some(active), |g| {
                for (p, v) in c_ptrs.iter().zip(&done) {
                    g.b.build_store(*p, *v)?;
                }
                Ok(())
            })
        })?;
        self.barrier()?;
        let out = self.read_staged(r, DType::F32, c_at)?;
        self.barrier()?;
        self.set(r, out)
    }

    /// This thread's place among `mma.sync`'s lanes: its warp, its group
    /// (lane / 4) and its member of the group (lane % 4).
    fn mma_lane(&self) -> R<MmaLane<'ctx>> {
        let tid = self.threads()?.tid;
        let warp = self
            .b
            .build_int_unsigned_div(tid, self.i64v(WARP as i64), "warp")?;
        let lane = self.b.build_and(tid, self.i64v(WARP as i64 - 1), "lane")?;
        let group = self
            .b
            .build_right_shift(lane, self.i64v(2), false, "group")?;
        let member = self.b.build_and(lane, self.i64v(3), "member")?;
        Ok(MmaLane {
            warp,
            group,
            member,
        })
    }

    /// The 16 x 8 tile of an `m x n` accumulator this warp takes in round
    /// `round` (`grid`'s, else in turns): whether it is one (a warp past the last tile
    /// takes the last again, and keeps nothing of it), its first row and
    /// its first column.
    fn mma_tile(
        &self,
        lane: &MmaLane<'ctx>,
        grid: Option<MmaGrid>,
        round: IntValue<'ctx>,
        m: usize,
        n: usize,
    ) -> R<(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)> {
        let warps = self.threads()?.count / WARP;
        if let Some(grid) = grid {
            let (cols, (rows_each, cols_each)) = (grid.cols, grid.block(m, n));
            let at =
                |warp_part: IntValue<'ctx>, each: usize, round_part: IntValue<'ctx>, size: i64| {
                    let t = self
                        .b
                        .build_int_mul(warp_part, self.i64v(each as i64), "t")?;
                    let t = self.b.build_int_add(t, round_part, "t")?;
                    R::Ok(self.b.build_int_mul(t, self.i64v(size), "at")?)
                };
            let (c, e) = (self.i64v(cols as i64), self.i64v(cols_each as i64));
            let wr = self.b.build_int_unsigned_div(lane.warp, c, "wr")?;
            let wc = self.b.build_int_unsigned_rem(lane.warp, c, "wc")?;
            let rr = self.b.build_int_unsigned_div(round, e, "rr")?;
            let rc = self.b.build_int_unsigned_rem(round, e, "rc")?;
            let every = self.ctx.bool_type().const_int(1, false);
            return Ok((every, at(wr, rows_each, rr, 16)?, at(wc, cols_each, rc, 8)?));
        }
        let tiles = (m / 16) * (n / 8);
        let q = self.b.build_int_mul(round, self.i64v(warps as i64), "q")?;
        let q = self.b.build_int_add(q, lane.warp, "q")?;
        let active =
            self.b
                .build_int_compare(IntPredicate::ULT, q, self.i64v(tiles as i64), "active")?;
        let q = self
            .b
            .build_select(active, q, self.i64v(tiles as i64 - 1), "q")?
            .into_int_value();
        let per_row = self.i64v((n / 8) as i64);
        let tm = self.b.build_int_unsigned_div(q, per_row, "tm")?;
        let tn = self.b.build_int_unsigned_rem(q, per_row, "tn")?;
        let row0 = self.b.build_int_mul(tm, self.i64v(16), "row0")?;
        let col0 = self.b.build_int_mul(tn, self.i64v(8), "col0")?;
        Ok((active, row0, col0))
    }

    /// The row-major position in an `n`-column accumulator of this lane's
    /// fragment element `i` of the tile at `row0`, `col0`: row group (+8
    /// for i >= 2), column 2 member + i % 2.
    fn fragment_position(
        &self,
        lane: &MmaLane<'ctx>,
        row0: IntValue<'ctx>,
        col0: IntValue<'ctx>,
        i: i64,
        n: usize,
    ) -> R<IntValue<'ctx>> {
        let row = self.b.build_int_add(row0, lane.group, "row")?;
        let row = self
            .b
            .build_int_add(row, self.i64v(if i >= 2 { 8 } else { 0 }), "row")?;
        let member2 = self.b.build_int_mul(lane.member, self.i64v(2), "member2")?;
        let col = self.b.build_int_add(col0, member2, "col")?;
        let col = self.b.build_int_add(col, self.i64v(i & 1), "col")?;
        let row = self.b.build_int_mul(row, self.i64v(n as i64), "e")?;
        Ok(self.b.build_int_add(row, col, "e")?)
    }

    /// The steps over the depth of a tensor-core product for this warp's
    /// 16 x 8 `tiles`, from their accumulator fragments `c` (four values
    /// each): the new fragments. Each step reads a fragment once for all
    /// the tiles that share it (`MmaTile::a`, `MmaTile::b`).
    fn mma_steps(
        &mut self,
        t: TensorCoreDot,
        lane: &MmaLane<'ctx>,
        tiles: &[MmaTile<'ctx>],
        c: &[BV<'ctx>],
        src: &MmaOperands<'ctx>,
    ) -> R<Vec<BV<'ctx>>> {
        let steps = (t.k / t.step) as i64;
        self.counted_carrying(self.i64v(0), self.i64v(steps), 1, c, |g, kk, c| {
            let k0 = g.b.build_int_mul(kk, g.i64v(t.step as i64), "k0")?;
            // Tile i's fragments, read where no earlier tile's serve.
            let mut left: Vec<Vec<IntValue<'ctx>>> = Vec::with_capacity(tiles.len());
            let mut right: Vec<Vec<IntValue<'ctx>>> = Vec::with_capacity(tiles.len());
            let mut out = Vec::with_capacity(c.len());
            for (i, (tile, c)) in tiles.iter().zip(c.chunks(4)).enumerate() {
                left.push(match tile.a {
                    a if a < i => left[a].clone(),
                    _ => g.a_fragment(t, lane, tile.row0, k0, src)?,
                });
                right.push(match tile.b {
                    b if b < i => right[b].clone(),
                    _ => g.b_fragment(t, lane, tile.col0, k0, src)?,
                });
                out.extend(g.mma(t.d, &left[i], &right[i], c)?);
            }
            Ok(out)
        })
    }

    /// The depth of this lane's first element of a fragment register in
    /// a step from `k0`: two 16-bit elements or one TF32 per member.
    fn member_depth(
        &self,
        t: TensorCoreDot,
        lane: &MmaLane<'ctx>,
        k0: IntValue<'ctx>,
    ) -> R<IntValue<'ctx>> {
        let pair = if t.d == DType::F32 { 1 } else { 2 };
        let m = self
            .b
            .build_int_mul(lane.member, self.i64v(pair), "member_k")?;
        Ok(self.b.build_int_add(k0, m, "k")?)
    }

    /// This lane's four registers of the left operand's fragment for rows
    /// `row0..row0 + 16` of the step at depth `k0`: register r is row
    /// group (+8 when r is odd), depth k0 + the member's (+ half a step
    /// when r >= 2), two 16-bit elements adjacent along the depth or one
    /// TF32. Rows in place on 16-byte boundaries are read by one
    /// `ldmatrix.x4`, its matrix r being register r's 8 x 16 bytes (lane
    /// 8 r + i gives row i of it): the fragment's layout is `ldmatrix`'s,
    /// a TF32 taken as two 16-bit halves.
    fn a_fragment(
        &self,
        t: TensorCoreDot,
        lane: &MmaLane<'ctx>,
        row0: IntValue<'ctx>,
        k0: IntValue<'ctx>,
        src: &MmaOperands<'ctx>,
    ) -> R<Vec<IntValue<'ctx>>> {
        let (size, half) = (t.size() as i64, (t.step / 2) as i64);
        let pitch = src.a.map_or(t.k, |s| s.pitch) as i64;
        let at = |row: IntValue<'ctx>, col: IntValue<'ctx>| -> R<IntValue<'ctx>> {
            let e = self.b.build_int_mul(row, self.i64v(pitch), "e")?;
            let e = self.b.build_int_add(e, col, "e")?;
            Ok(self.b.build_int_mul(e, self.i64v(size), "off")?)
        };
        if let Some(s) = src.a.filter(|s| s.aligned) {
            // Lane l: matrix l / 8 = group / 2, its row l % 8.
            let matrix = self
                .b
                .build_right_shift(lane.group, self.i64v(1), false, "mi")?;
            let odd = self.b.build_and(lane.group, self.i64v(1), "odd")?;
            let r = self.b.build_int_mul(odd, self.i64v(4), "r")?;
            let r = self.b.build_int_add(r, lane.member, "r")?;
            let low = self.b.build_and(matrix, self.i64v(1), "low")?;
            let row = self.b.build_int_mul(low, self.i64v(8), "row")?;
            let row = self.b.build_int_add(row, r, "row")?;
            let row = self.b.build_int_add(row0, row, "row")?;
            let deep = self
                .b
                .build_right_shift(matrix, self.i64v(1), false, "deep")?;
            let col = self.b.build_int_mul(deep, self.i64v(half), "col")?;
            let col = self.b.build_int_add(k0, col, "col")?;
            return self.ldmatrix(self.byte_pointer(s.slot, at(row, col)?)?, 4, false);
        }
        let k = self.member_depth(t, lane, k0)?;
        let mut ra = Vec::with_capacity(4);
        for reg in 0..4i64 {
            let row = self.b.build_int_add(row0, lane.group, "ar")?;
            let row = self.b.build_int_add(row, self.i64v((reg & 1) * 8), "ar")?;
            let col = self
                .b
                .build_int_add(k, self.i64v((reg >> 1) * half), "ac")?;
            let off = at(row, col)?;
            ra.push(match src.a {
                // Row-major in place: the pair is adjacent too.
                Some(s) => self.word_at(s.slot, off)?,
                None => {
                    let off = self
                        .b
                        .build_int_add(off, self.i64v(src.a_at as i64), "off")?;
                    self.staged_word(off)?
                }
            });
        }
        Ok(ra)
    }

    /// This lane's two registers of the right operand's fragment for
    /// columns `col0..col0 + 8` of the step at depth `k0`: register r is
    /// column group, depth k0 + the member's (+ half a step for r = 1):
    /// two rows in place (16-bit elements packed low then high), adjacent
    /// in the transposed staged copy. 16-bit rows in place on 16-byte
    /// boundaries are read by one `ldmatrix.x2.trans` (lane i < 16 gives
    /// depth k0 + i of the eight columns).
    fn b_fragment(
        &self,
        t: TensorCoreDot,
        lane: &MmaLane<'ctx>,
        col0: IntValue<'ctx>,
        k0: IntValue<'ctx>,
        src: &MmaOperands<'ctx>,
    ) -> R<Vec<IntValue<'ctx>>> {
        let (size, half) = (t.size() as i64, (t.step / 2) as i64);
        if let Some(s) = src.b.filter(|s| s.aligned && t.d != DType::F32) {
            // Lane l (and l + 16, whose address goes unread): depth l % 16.
            let l = self.b.build_int_mul(lane.group, self.i64v(4), "l")?;
            let l = self.b.build_int_add(l, lane.member, "l")?;
            let l = self.b.build_and(l, self.i64v(15), "l")?;
            let depth = self.b.build_int_add(k0, l, "bk")?;
            let e = self
                .b
                .build_int_mul(depth, self.i64v(s.pitch as i64), "e")?;
            let e = self.b.build_int_add(e, col0, "e")?;
            let off = self.b.build_int_mul(e, self.i64v(size), "off")?;
            return self.ldmatrix(self.byte_pointer(s.slot, off)?, 2, true);
        }
        let k0 = self.member_depth(t, lane, k0)?;
        let col = self.b.build_int_add(col0, lane.group, "bn")?;
        let mut rb = Vec::with_capacity(2);
        for reg in 0..2i64 {
            let depth = self.b.build_int_add(k0, self.i64v(reg * half), "bk")?;
            rb.push(match src.b {
                Some(s) => {
                    let word = |depth: IntValue<'ctx>| -> R<IntValue<'ctx>> {
                        let e = self
                            .b
                            .build_int_mul(depth, self.i64v(s.pitch as i64), "e")?;
                        let e = self.b.build_int_add(e, col, "e")?;
                        let off = self.b.build_int_mul(e, self.i64v(size), "off")?;
                        if t.d == DType::F32 {
                            return self.word_at(s.slot, off);
                        }
                        let p = self.byte_pointer(s.slot, off)?;
                        let h = self
                            .b
                            .build_load(self.ctx.i16_type(), p, "h")?
                            .into_int_value();
                        Ok(self.b.build_int_z_extend(h, self.ctx.i32_type(), "h")?)
                    };
                    if t.d == DType::F32 {
                        word(depth)?
                    } else {
                        let lo = word(depth)?;
                        let next = self.b.build_int_add(depth, self.i64v(1), "bk")?;
                        let hi = word(next)?;
                        let hi = self.b.build_left_shift(
                            hi,
                            self.ctx.i32_type().const_int(16, false),
                            "hi",
                        )?;
                        self.b.build_or(lo, hi, "pair")?
                    }
                }
                None => {
                    let e = self.position_of(&[col, depth], &[t.n, t.k])?;
                    let off = self.b.build_int_mul(e, self.i64v(size), "off")?;
                    let off = self
                        .b
                        .build_int_add(off, self.i64v(src.b_at as i64), "off")?;
                    self.staged_word(off)?
                }
            });
        }
        Ok(rb)
    }

    /// Each thread's elements of tile `r` (flat layout), read from the
    /// staging area from byte `first`, where they are row-major as `d`.
    fn read_staged(&self, r: Value, d: DType, first: u64) -> R<Vec<BV<'ctx>>> {
        let len: usize = self.f.ty(r).shape().unwrap_or(&[]).iter().product();
        let mut out = Vec::new();
        for j in 0..self.per_thread(r)? {
            let e = self.position(j)?;
            let e = match self.present(j, len)? {
                Some(p) => self
                    .b
                    .build_select(p, e, self.i64v(0), "e")?
                    .into_int_value(),
                None => e,
            };
            out.push(self.load_element(self.staged(e, d, first)?, d)?);
        }
        Ok(out)
    }

    /// `tile.convert_layout`: between the flat layout and `#mma` grids,
    /// through the staging area (row-major f32) between barriers: each
    /// thread writes its elements as the operand's layout has them and
    /// reads its elements as the result's has them.
    fn convert_layout(&mut self, op: &OpData) -> R<()> {
        let (x, r) = (op.operands[0], op.results[0]);
        let layout = |v: Value| match self.f.ty(v) {
            Type::Tile(t) => Some((t.layout, t.shape.clone())),
            _ => None,
        };
        let (Some((from, shape)), Some((to, _))) = (layout(x), layout(r)) else {
            return Err(CodegenError::Invalid(
                "tile.convert_layout of a non-tile".into(),
            ));
        };
        let xs = self.flatten(x)?;
        if from == to {
            return self.set(r, xs);
        }
        let (from, to) = (self.grid_of(x)?, self.grid_of(r)?);
        self.barrier()?;
        match from {
            Some(grid) => {
                let (m, n) = (shape[0], shape[1]);
                let lane = self.mma_lane()?;
                let rounds = mma_rounds(m, n, self.threads()?.count);
                for (round, c) in xs.chunks(4).enumerate().take(rounds) {
                    let (active, row0, col0) =
                        self.mma_tile(&lane, Some(grid), self.i64v(round as i64), m, n)?;
                    for (i, &v) in c.iter().enumerate() {
                        let e = self.fragment_position(&lane, row0, col0, i as i64, n)?;
                        self.when(Some(active), |g| {
                            g.store_element(g.staged(e, DType::F32, 0)?, v, DType::F32)
                        })?;
                    }
                }
            }
            None => self.stage(x, DType::F32, 0)?,
        }
        self.barrier()?;
        let out = match to {
            Some(grid) => {
                let (m, n) = (shape[0], shape[1]);
                let lane = self.mma_lane()?;
                let rounds = mma_rounds(m, n, self.threads()?.count);
                let mut out = Vec::with_capacity(4 * rounds);
                for round in 0..rounds {
                    let (_, row0, col0) =
                        self.mma_tile(&lane, Some(grid), self.i64v(round as i64), m, n)?;
                    for i in 0..4 {
                        let e = self.fragment_position(&lane, row0, col0, i, n)?;
                        out.push(self.load_element(self.staged(e, DType::F32, 0)?, DType::F32)?);
                    }
                }
                out
            }
            None => self.read_staged(r, DType::F32, 0)?,
        };
        self.barrier()?;
        self.set(r, out)
    }

    /// The grid of warps of tile `v` in the `#mma` layout (`None` in the
    /// flat one), checked against this program: as many warps as it has,
    /// dealing the tile's 16 x 8 tiles evenly.
    fn grid_of(&self, v: Value) -> R<Option<MmaGrid>> {
        let Type::Tile(t) = self.f.ty(v) else {
            return Ok(None);
        };
        let Layout::Mma(g) = t.layout else {
            return Ok(None);
        };
        let warps = self.threads()?.count / WARP;
        if g.rows * g.cols != warps || !g.divides(t.shape[0], t.shape[1]) {
            return Err(CodegenError::Invalid(format!(
                "{t}: a program of {warps} warps cannot hold it (a grid of {warps} warps \
                 dealing its 16 x 8 tiles evenly can)"
            )));
        }
        Ok(Some(g))
    }
}

/// This thread's place among `mma.sync`'s lanes.
struct MmaLane<'ctx> {
    warp: IntValue<'ctx>,
    group: IntValue<'ctx>,
    member: IntValue<'ctx>,
}

/// Where a tensor-core product reads its operands: in place in a shared
/// buffer (a pointer), or staged at these byte offsets of the staging area.
struct MmaOperands<'ctx> {
    a: Option<InPlace<'ctx>>,
    b: Option<InPlace<'ctx>>,
    a_at: u64,
    b_at: u64,
}

/// A 16 x 8 tile of a tensor-core accumulator a warp computes: its first
/// row and column, and the tiles whose left and right fragments it reads
/// (its own index, or an earlier tile's that reads the same).
#[derive(Clone, Copy)]
struct MmaTile<'ctx> {
    row0: IntValue<'ctx>,
    col0: IntValue<'ctx>,
    a: usize,
    b: usize,
}

/// An operand read where it lies in shared memory: its first element and
/// the distance in elements between its rows.
#[derive(Clone, Copy)]
struct InPlace<'ctx> {
    slot: PointerValue<'ctx>,
    pitch: usize,
    /// Whether the slot and every row start on a 16-byte boundary (as
    /// `ldmatrix` reads them).
    aligned: bool,
}

/// The external functions `module` calls that nothing will define: on a
/// GPU there is no C library, so each is something the GPU back end does
/// not build yet.
pub(crate) fn undefined_calls(module: &Module<'_>) -> Vec<String> {
    let mut names = Vec::new();
    let mut f: Option<FunctionValue<'_>> = module.get_first_function();
    while let Some(func) = f {
        let name = func.get_name().to_string_lossy().into_owned();
        if func.count_basic_blocks() == 0
            && !name.starts_with("llvm.")
            && !EMULATOR_HOOKS.contains(&name.as_str())
        {
            names.push(name);
        }
        f = func.get_next_function();
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64 x 64 block's 32 tiles go to a 2 x 4 grid of warps (2 x 2 tiles
    /// each: two left and two right fragments a step, not four and one);
    /// a grid's rounds give every tile to exactly one warp, and turns give
    /// every tile to at least one where no grid divides them.
    #[test]
    fn warps_take_blocks_of_tiles() {
        assert_eq!(
            MmaGrid::choose(64, 64, 8),
            Some(MmaGrid { rows: 2, cols: 4 })
        );
        assert_eq!(MmaGrid::choose(16, 24, 8), None);
        for (m, n) in [(64, 64), (48, 64), (128, 64), (32, 128), (16, 24), (80, 40)] {
            let warps = 8;
            let grid = MmaGrid::choose(m, n, warps);
            let mut taken = vec![0; (m / 16) * (n / 8)];
            for round in 0..mma_rounds(m, n, warps * WARP) {
                for warp in 0..warps {
                    let (tm, tn) = mma_tile_of(grid, round, warp, warps, m, n);
                    taken[tm * (n / 8) + tn] += 1;
                }
            }
            match grid {
                Some(_) => assert!(taken.iter().all(|&t| t == 1), "{m}x{n}"),
                None => assert!(taken.iter().all(|&t| t >= 1), "{m}x{n}"),
            }
        }
    }
}
