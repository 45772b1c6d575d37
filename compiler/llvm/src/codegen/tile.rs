//! Tile IR to LLVM IR for a CPU.
//!
//! The CPU back end compiles tile IR scheduled for the host (`dlc_driver::lower_for_cpu`):
//! `dlc run --backend cpu`, `dlc bench` and every artifact of `dlc compile` (llvm, asm,
//! obj, so, header). It replaced a back end that compiled loop IR (with a hand-built
//! packed product and `loop.threads`), which is gone (docs/performance.md compares the
//! two).
//!
//! - **Workspace.** Every host-level `tile.alloc` of a function lives at an offset of one
//!   workspace, planned first fit over the buffers' lifetimes (a range is free again
//!   after its `tile.dealloc`), so that part is about the function's peak of live
//!   buffers; after it come the scratch regions, one per thread the OpenMP runtime may
//!   run (`omp_get_max_threads()` at the call, 1 without the runtime), each as large as
//!   the largest kernel's scratch. A call takes the workspace the previous call left in a
//!   global cache (an atomic exchange) if its header says it is large enough, else frees
//!   it and allocates one (failing with status 2 at the source place of the largest
//!   buffer), and hands it back on every way out, failures included, freeing one that a
//!   concurrent call left there meanwhile (a preparer, run once per binding, frees its
//!   own instead). A model run many times therefore allocates
//!   and page-faults its memory once: at batch 8 the conv block's 58 MB im2col and panel
//!   buffers were mapped afresh on every call and cost a third of its time. Kernels
//!   allocate nothing, so they cannot fail for memory. The memory stays held between
//!   calls (as in onnxruntime's arena).
//! - **Kernels.** A kernel's grid is flattened and outlined into a function that reads
//!   its inputs from a frame; with at least `min_thread_iterations` programs it runs
//!   through `GOMP_parallel` and each thread takes a contiguous range, else it is called
//!   in place. Kernels with the same fingerprint (`dlc_tile::print::fingerprint`: the
//!   kernel's text with its inputs named by first use, their types, and the source
//!   places of the ops in it that can fail, i.e. integer divisions) share one function,
//!   so the 32 identical steps of W7 and BERT's Q, K and V projections compile once. The CPU keys kernels by `relocatable_fingerprint`, which leaves the
//!   buffers' offsets out when no view inside the kernel moves from its source: its
//!   inputs come as pointers with their offsets applied, so W7's steps, each reading its
//!   own slice of `x`, share their kernels (the GPU passes each buffer's storage and
//!   adds the offsets in the kernel, so it keys them exactly). Every `tile.alloc` inside a kernel (scratch, and on a CPU shared
//!   memory) is at a planned 64-byte-aligned offset of the thread's scratch region of the
//!   workspace (the base comes through the frame, the thread is the OpenMP thread
//!   number): scratch is planned, not allocated per program or per call. A program is one
//!   thread, so `tile.barrier` is a no-op. A failing status (an integer division by
//!   zero) is passed back through the frame.
//! - **Tiles** live in registers as native vectors: each row (every axis but the last
//!   fixed) is cut along the last axis into vectors of at most `lanes(f32)` elements (16
//!   with AVX-512), whatever the element type, so a mask, the data it masks and casts of
//!   it are cut alike. Ops are unrolled over the vectors. A tile of more than 4096 vectors
//!   is refused with an error naming it (the conversion's tiles are within its blocking).
//! - Element-wise ops use `codegen/elementwise.rs` and `math.rs`, written once for
//!   scalars and vectors: integer division fails if any lane's divisor is zero; f32
//!   `exp`/`tanh` are straight-line polynomials.
//! - `tile.load`/`tile.store`: the address is `base + sum_k grad_k * e_k`; a vector whose
//!   lanes are contiguous is one (masked, where a mask or a pad asks) vector access, a
//!   stride-0 one a scalar load and broadcast (masked: one element read where any lane is
//!   on), a 2-axis tile of two rows or more whose rows are adjacent and columns apart,
//!   runs of its rows transposed in registers (`runs_along_columns`; masked, a branch
//!   of plain runs where every lane is on and one of masked runs), other strides a
//!   masked gather or scatter
//!   (without mask registers, a store of every lane a plain store a lane: a one-row
//!   tile's stored across pixel rows),
//!   whose lane pointers are the first lane's pointer offset by a constant vector of
//!   32-bit steps (x86's gathers and scatters take a scalar base and 32-bit indices; built
//!   as integers and cast to pointers, they cost LLVM's `IndVarSimplify` and
//!   `InstCombine` far more time and gave 64-bit gathers of half the lanes). A masked
//!   access by a `tile.mask` of two axes or more addresses the buffer's start in a row
//!   the mask puts outside its limits (one select per row): an all-off access to a page
//!   that is not mapped still costs a microcode assist (`guarded_pointer`). Padded loads
//!   test no index that the ranges of the loop counters and program ids in it
//!   (`dlc_tile::ir::index_ranges`) keep inside the buffer for every lane
//!   (`proven_inside`: a strided convolution's im2col copy away from its borders), and
//!   compare each other index that moves with the lanes as a
//!   vector, and the others once, as scalars (a convolution's padded rows and columns
//!   with channels in the lanes). A 2-axis store into
//!   column-major place (packing either operand of a product) is transposed in registers
//!   and written as contiguous runs; a load of 2 to 4 rows from column-major place (a
//!   bf16 panel's interleaved pair) is one contiguous run per vector of columns, each row
//!   every `rows`-th lane of it (`transposing_load`).
//! - `tile.dot` is one broadcast of `a[m, k]` and one `llvm.fmuladd` per vector of row `k`
//!   of `b` (f16/bf16 widened to f32 first); for the packed schedule's `6x1 . 1x32` product
//!   in a `tile.for` over K this is the BLIS micro-kernel: 12 accumulators in registers,
//!   two loads, six broadcasts and twelve FMAs per step (checked in the assembly; AVX2's
//!   `4x1 . 1x16`: 8 accumulators, two loads, four broadcasts, eight FMAs); the
//!   conversion writes two steps per iteration of the loop (`Packing::unroll`: the
//!   counter and branch once per 24 FMAs; four steps no better), since LLVM's unroller is off (tile IR says what is unrolled).
//!   A `tile.dot` of bf16 two deep into f32, on a target with AVX-512 BF16, is
//!   `vdpbf16ps` instead (`bf16_pair_dot`): each row's pair broadcast as one 32-bit word,
//!   each 16 columns of the two rows of `b` interleaved into pairs, and sixteen sums of
//!   pairs per instruction. The packed panels hold the pairs interleaved already, so
//!   the interleave undoes `transposing_load`'s split and the backend drops both: the
//!   packed bf16 step is eight word broadcasts, two loads and sixteen `vdpbf16ps` per
//!   pair of the depth, no shuffle (`jit.rs::bf16_products_run_as_dot_products_of_pairs`
//!   checks the assembly).
//! - A load whose lanes are 2 to 4 elements apart (a stride-2 window) is one masked load
//!   of the elements they span, only theirs enabled, and a shuffle
//!   (`deinterleaved_load`); farther apart, `llvm.masked.gather`.
//! - `tile.reduce` folds vectors element-wise, then halves a vector with shuffles;
//!   `tile.for` carries every vector of its tiles as a phi.

use std::collections::HashMap;

use dlc_core::scalar::{BinaryOp, ReduceKind};
use dlc_core::{DType, TargetDesc};
use dlc_tile::ir::{UNROLLED_MAX_OPS, UNROLLED_MAX_TRIPS, nested_ops, trips, unrolled_trips};
use dlc_tile::{
    Affine, Block, Function, MAX_DEINTERLEAVED_STEP, OpData, OpId, OpKind, Type, Value,
};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicType, BasicTypeEnum, VectorType};
use inkwell::values::{
    BasicValue, BasicValueEnum as BV, FunctionValue, IntValue, PointerValue, VectorValue,
};
use inkwell::{AddressSpace, IntPredicate};

use super::workspace::{Workspace, collect, kernel_scratch};
use super::{Gen, Ir, Sites, storage_type};
use crate::{CodegenError, R};
use dlc_core::ir::OpDecl;

/// Tile IR (`dlc_tile`).
pub(crate) struct TileIr;

/// f32 lanes of one AVX-512 BF16 dot-product instruction (`vdpbf16ps` on
/// 512 bits: 16 sums of 16 pairs).
const BF16_DOT_LANES: usize = 16;

impl Ir for TileIr {
    type Function = Function;
    type Value = Value;
    fn name(f: &Function) -> &str {
        &f.name
    }
    fn signature(f: &Function) -> R<dlc_runtime::abi::Signature> {
        crate::abi::signature(f)
    }
    fn arity(f: &Function) -> usize {
        f.params.len()
    }
    fn emit<'ctx>(
        ctx: &'ctx Context,
        module: &Module<'ctx>,
        f: &Function,
        all: &[Function],
        symbols: &dlc_runtime::abi::Symbols,
        sites: &Sites,
        target: &TargetDesc,
        profile: Option<&super::profile::Profile>,
    ) -> R<FunctionValue<'ctx>> {
        let symbol = &symbols.symbol(&f.name).map_err(CodegenError::Symbol)?;
        // Tiles are cut into vectors of f32 registers' lanes.
        let lanes = target.lanes(DType::F32);
        if let Some(t) = f.values.iter().find_map(|t| match t {
            Type::Tile(t) if Cut::new(&t.shape, lanes).vectors() > MAX_TILE_VECTORS => Some(t),
            _ => None,
        }) {
            return Err(CodegenError::Unsupported(format!(
                "@{}: {t} is {} vectors of {lanes} lanes; the CPU back end holds a tile in \
                 registers and takes at most {MAX_TILE_VECTORS} vectors",
                f.name,
                Cut::new(&t.shape, lanes).vectors()
            )));
        }
        let params: Vec<Value> = f.params.iter().map(|(_, v)| *v).collect();
        let mut g = Gen::exported(ctx, module, f, &params, symbol, sites)?;
        (g.lanes, g.min_threads, g.min_thread_work, g.min_claim_work) = (
            lanes,
            target.min_thread_iterations(),
            target.min_thread_work(),
            target.min_claim_work(),
        );
        g.bf16_dot = target.cpu().is_some_and(|c| c.avx512_bf16);
        g.mask_registers = target.cpu().is_none_or(|c| c.mask_registers());
        g.profile = profile.cloned();
        g.keep_workspace = !all.iter().any(|p| p.prepare.as_deref() == Some(&f.name));
        let plan = Workspace::plan(f)?;
        g.take_workspace(symbol, &plan)?;
        g.prepared_once(all, symbols)?;
        g.host_block(&f.body)?;
        // The host function only orchestrates (the workspace, frames,
        // kernel calls, the status): LLVM's optimizer and instruction
        // selector spent most of W7's compile on its 32 unrolled steps for
        // no gain at run time, so it is compiled as written (`optnone`,
        // which needs `noinline`); the kernels it calls get the full
        // pipeline.
        for name in ["noinline", "optnone"] {
            let kind = Attribute::get_named_enum_kind_id(name);
            g.func
                .add_attribute(AttributeLoc::Function, ctx.create_enum_attribute(kind, 0));
        }
        Ok(g.func)
    }
}

/// The operator `tile.reduce` of `kind` combines elements with.
pub(super) fn combining(kind: ReduceKind) -> R<BinaryOp> {
    Ok(match kind {
        ReduceKind::Sum => BinaryOp::Add,
        ReduceKind::Prod => BinaryOp::Mul,
        ReduceKind::Max => BinaryOp::Max,
        ReduceKind::Min => BinaryOp::Min,
        ReduceKind::Mean => {
            return Err(CodegenError::Invalid(
                "tile.reduce {kind = mean} (the verifier rejects it)".into(),
            ));
        }
    })
}

/// Bytes before the workspace's buffers: its size, for the next call.
const WORKSPACE_HEADER: u64 = 64;

impl<'ctx> Gen<'ctx, '_, TileIr> {
    /// Takes the exported function `symbol`'s workspace from its cache, or
    /// allocates one, and places every planned buffer in it.
    fn take_workspace(&mut self, symbol: &str, plan: &Workspace) -> R<()> {
        if plan.size == 0 && plan.scratch == 0 {
            return Ok(());
        }
        let i64t = self.ctx.i64_type();
        let ptr = self.ctx.ptr_type(AddressSpace::default());
        let cache = self
            .module
            .add_global(i64t, None, &format!("{symbol}.workspace"));
        cache.set_linkage(inkwell::module::Linkage::Internal);
        cache.set_initializer(&i64t.const_zero());
        let cache = cache.as_pointer_value();
        // Bytes this call needs: the header, the buffers, and a scratch
        // region for each thread the runtime may run.
        let threads = if plan.scratch > 0 {
            self.omp("omp_get_max_threads", 1)?
        } else {
            self.i64c(1)
        };
        // Every part is a multiple of 64 bytes (the scratch per thread too).
        let needed = self.b.build_int_add(
            self.i64c(WORKSPACE_HEADER.saturating_add(plan.size)),
            self.b
                .build_int_mul(threads, self.i64c(plan.scratch), "scratch")?,
            "needed",
        )?;
        let cached = self.b.build_atomicrmw(
            inkwell::AtomicRMWBinOp::Xchg,
            cache,
            i64t.const_zero(),
            inkwell::AtomicOrdering::AcquireRelease,
        )?;
        let cached = self.b.build_int_to_ptr(cached, ptr, "cached")?;
        let check = self.ctx.append_basic_block(self.func, "workspace.check");
        let fresh = self.ctx.append_basic_block(self.func, "workspace.new");
        let ready = self.ctx.append_basic_block(self.func, "workspace.ready");
        self.b
            .build_conditional_branch(self.b.build_is_null(cached, "empty")?, fresh, check)?;
        self.b.position_at_end(check);
        let capacity = self
            .b
            .build_load(i64t, cached, "capacity")?
            .into_int_value();
        let fits = self
            .b
            .build_int_compare(IntPredicate::UGE, capacity, needed, "fits")?;
        self.b.build_conditional_branch(fits, ready, fresh)?;
        self.b.position_at_end(fresh);
        // Too small (the thread count grew) or none: a new one.
        self.release(cached)?;
        self.loc.clone_from(&plan.largest);
        let made = self.heap(needed)?;
        self.loc = None;
        self.b.build_store(made, needed)?;
        let made_in = self
            .b
            .get_insert_block()
            .ok_or_else(|| CodegenError::Llvm("no insertion block".into()))?;
        self.b.build_unconditional_branch(ready)?;
        self.b.position_at_end(ready);
        let block = self.b.build_phi(ptr, "workspace")?;
        block.add_incoming(&[(&cached, check), (&made, made_in)]);
        let block = block.as_basic_value().into_pointer_value();
        let at = |g: &Self, off: u64| -> R<PointerValue<'ctx>> {
            // SAFETY (LLVM IR semantics): the plan keeps every buffer inside
            // the workspace.
            Ok(unsafe {
                g.b.build_in_bounds_gep(
                    g.ctx.i8_type(),
                    block,
                    &[g.i64c(WORKSPACE_HEADER.saturating_add(off))],
                    "buffer",
                )?
            })
        };
        for (&v, &off) in &plan.offsets {
            let p = at(self, off)?;
            self.vals.insert(v, p.into());
        }
        if plan.scratch > 0 {
            self.scratch = Some((at(self, plan.size)?, plan.scratch));
        }
        // From here on, every way out hands the workspace back; failure
        // blocks made before (allocating it) must not.
        self.workspace = Some((cache, block));
        self.fail_blocks.borrow_mut().clear();
        Ok(())
    }
}

impl<'ctx> Gen<'ctx, '_, TileIr> {
    /// The buffers `tile.prepared` ops read, computed by the first call
    /// and kept for the process: for each preparer they name (a function
    /// of no inputs), a global `SYM.once` holds the block of its results,
    /// null until a call allocates one, runs the preparer into it and
    /// publishes it (a compare-and-swap: a call that loses the race frees
    /// its own and takes the winner's). Later calls load the pointer.
    fn prepared_once(&mut self, all: &[Function], symbols: &dlc_runtime::abi::Symbols) -> R<()> {
        let f = self.f;
        let mut funcs: Vec<&str> = Vec::new();
        for &id in &f.body.ops {
            if let OpKind::Prepared { func, .. } = &f.op(id).kind
                && !funcs.contains(&func.as_str())
            {
                funcs.push(func);
            }
        }
        for func in funcs {
            let Some(p) = all.iter().find(|g| g.name == func) else {
                return Err(CodegenError::Invalid(format!(
                    "tile.prepared reads @{func}, which is not in the module"
                )));
            };
            let offsets = self.prepare_block(p, symbols)?;
            for &id in &f.body.ops {
                let op = f.op(id);
                if let OpKind::Prepared { func: named, index } = &op.kind
                    && named == func
                {
                    let p = offsets.get(*index).copied().ok_or_else(|| {
                        CodegenError::Invalid(format!("@{func} has no result {index}"))
                    })?;
                    self.vals.insert(op.results[0], p.into());
                }
            }
        }
        Ok(())
    }

    /// Preparer `p`'s results, in the block the process keeps (made by this
    /// call if no call has made it yet).
    fn prepare_block(
        &mut self,
        p: &Function,
        symbols: &dlc_runtime::abi::Symbols,
    ) -> R<Vec<PointerValue<'ctx>>> {
        let psym = symbols.symbol(&p.name).map_err(CodegenError::Symbol)?;
        let ptr = self.ctx.ptr_type(AddressSpace::default());
        let once_name = format!("{psym}.once");
        let once = match self.module.get_global(&once_name) {
            Some(g) => g,
            None => {
                let g = self.module.add_global(ptr, None, &once_name);
                g.set_linkage(inkwell::module::Linkage::Internal);
                g.set_initializer(&ptr.const_null());
                g
            }
        }
        .as_pointer_value();
        let mut offsets = Vec::with_capacity(p.params.len());
        let mut total = 0u64;
        for (_, v) in &p.params {
            offsets.push(total);
            total = total.saturating_add(super::workspace::buffer_bytes(p, *v)?.div_ceil(64) * 64);
        }
        let current = self.b.build_load(ptr, once, "prepared")?;
        let load = current
            .as_instruction_value()
            .ok_or_else(|| CodegenError::Llvm("a load is no instruction".into()))?;
        load.set_atomic_ordering(inkwell::AtomicOrdering::Acquire)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        load.set_alignment(8)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        let current = current.into_pointer_value();
        let entry = self.insert_block()?;
        let make = self.ctx.append_basic_block(self.func, "prepare.new");
        let ready = self.ctx.append_basic_block(self.func, "prepare.ready");
        self.b.build_conditional_branch(
            self.b.build_is_null(current, "unprepared")?,
            make,
            ready,
        )?;
        self.b.position_at_end(make);
        let block = self.heap(self.i64c(total.max(64)))?;
        let at = |g: &Self, off: u64| -> R<PointerValue<'ctx>> {
            // SAFETY (LLVM IR semantics): every offset is inside the block.
            Ok(unsafe {
                g.b.build_in_bounds_gep(g.ctx.i8_type(), block, &[g.i64c(off)], "result")?
            })
        };
        let args: Vec<inkwell::values::BasicMetadataValueEnum<'ctx>> = offsets
            .iter()
            .map(|&o| at(self, o).map(Into::into))
            .collect::<R<_>>()?;
        let preparer = super::exported_function(self.ctx, self.module, p.params.len(), &psym);
        let status = self
            .b
            .build_call(preparer, &args, "status")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::Llvm("a preparer gives no status".into()))?
            .into_int_value();
        let failed = self.ctx.append_basic_block(self.func, "prepare.failed");
        let publish = self.ctx.append_basic_block(self.func, "prepare.publish");
        let ok = self.b.build_int_compare(
            IntPredicate::EQ,
            status,
            self.ctx.i32_type().const_zero(),
            "ok",
        )?;
        self.b.build_conditional_branch(ok, publish, failed)?;
        // The preparer's failure is this function's, of the same kind (its
        // sites are the preparer's, not this function's).
        self.b.position_at_end(failed);
        self.release(block)?;
        let kind = self
            .b
            .build_and(status, self.ctx.i32_type().const_int(0xff, false), "kind")?;
        self.fail_with(kind)?;
        self.b.position_at_end(publish);
        let swapped = self.b.build_cmpxchg(
            once,
            ptr.const_null(),
            block,
            inkwell::AtomicOrdering::AcquireRelease,
            inkwell::AtomicOrdering::Acquire,
        )?;
        let earlier = self
            .b
            .build_extract_value(swapped, 0, "earlier")?
            .into_pointer_value();
        let won = self
            .b
            .build_extract_value(swapped, 1, "won")?
            .into_int_value();
        let lost = self.ctx.append_basic_block(self.func, "prepare.lost");
        self.b.build_conditional_branch(won, ready, lost)?;
        self.b.position_at_end(lost);
        self.release(block)?;
        self.b.build_unconditional_branch(ready)?;
        self.b.position_at_end(ready);
        let phi = self.b.build_phi(ptr, "prepared")?;
        phi.add_incoming(&[(&current, entry), (&block, publish), (&earlier, lost)]);
        let base = phi.as_basic_value().into_pointer_value();
        offsets
            .iter()
            .map(|&o| {
                // SAFETY (LLVM IR semantics): every offset is inside the block.
                Ok(unsafe {
                    self.b.build_in_bounds_gep(
                        self.ctx.i8_type(),
                        base,
                        &[self.i64c(o)],
                        "prepared",
                    )?
                })
            })
            .collect()
    }

    /// The block the builder is in.
    fn insert_block(&self) -> R<inkwell::basic_block::BasicBlock<'ctx>> {
        self.b
            .get_insert_block()
            .ok_or_else(|| CodegenError::Llvm("no insertion block".into()))
    }
}

/// The most vectors one tile value may be cut into: tiles are blocks a
/// program holds in registers (or the stack, when they spill), not tensors.
pub(crate) const MAX_TILE_VECTORS: usize = 4096;

/// How a tile of some shape is cut into vectors.
#[derive(Debug, Clone)]
struct Cut {
    /// The tile's shape (`[1]` for a scalar).
    shape: Vec<usize>,
    /// Lanes of a full vector.
    width: usize,
    /// Vectors per row.
    per_row: usize,
}

impl Cut {
    fn new(shape: &[usize], lanes: usize) -> Cut {
        let shape = if shape.is_empty() {
            vec![1]
        } else {
            shape.to_vec()
        };
        let last = shape[shape.len() - 1];
        let width = lanes.min(last).max(1);
        Cut {
            per_row: last.div_ceil(width),
            shape,
            width,
        }
    }

    fn last(&self) -> usize {
        self.shape[self.shape.len() - 1]
    }

    fn rows(&self) -> usize {
        self.shape[..self.shape.len() - 1].iter().product()
    }

    fn vectors(&self) -> usize {
        self.rows() * self.per_row
    }

    /// Lanes of vector `j` of a row.
    fn lanes(&self, j: usize) -> usize {
        self.width.min(self.last() - j * self.width)
    }

    /// The coordinates of row `r` (every axis but the last).
    fn row_coords(&self, mut r: usize) -> Vec<usize> {
        let lead = &self.shape[..self.shape.len() - 1];
        let mut c = vec![0; lead.len()];
        for k in (0..lead.len()).rev() {
            c[k] = r % lead[k];
            r /= lead[k];
        }
        c
    }

    /// Row index of leading coordinates.
    fn row_of(&self, coords: &[usize]) -> usize {
        let lead = &self.shape[..self.shape.len() - 1];
        coords.iter().zip(lead).fold(0, |acc, (c, d)| acc * d + c)
    }

    /// The vector and lane holding element `flat` (row-major).
    fn locate(&self, flat: usize) -> (usize, u32) {
        let (row, col) = (flat / self.last(), flat % self.last());
        (
            row * self.per_row + col / self.width,
            (col % self.width) as u32,
        )
    }
}

/// The element offset of a row of an access (its leading coordinates
/// `row`) from the access's base: the same for rows along an axis the
/// index does not move with.
fn row_offset(a: &Access<'_>, row: &[usize]) -> i64 {
    row.iter()
        .zip(&a.grad)
        .fold(0i64, |f, (&c, &g)| f.wrapping_add(g.wrapping_mul(c as i64)))
}

/// A buffer access's address: `offset(e) = base + sum_k grad[k] * e_k`
/// in elements, with each dimension's index `index[d](e) = dims[d].0 +
/// sum_k dims[d].1[k] * e_k` kept for bounds checks.
pub(super) struct Access<'ctx> {
    pub(super) pointer: PointerValue<'ctx>,
    pub(super) base: IntValue<'ctx>,
    pub(super) grad: Vec<i64>,
    pub(super) dims: Vec<(IntValue<'ctx>, Vec<i64>, usize)>,
    pub(super) dtype: DType,
}

impl<'ctx, 'f> Gen<'ctx, 'f, TileIr> {
    fn cut(&self, v: Value) -> Cut {
        Cut::new(self.f.ty(v).shape().unwrap_or(&[]), self.lanes)
    }

    pub(super) fn tdtype(&self, v: Value) -> R<DType> {
        match self.f.ty(v) {
            Type::Scalar(d) => Ok(*d),
            Type::Tile(t) => Ok(t.dtype),
            Type::Buffer(b) => Ok(b.dtype),
            Type::Index => Ok(DType::I64),
        }
    }

    pub(super) fn is_tile(&self, v: Value) -> bool {
        matches!(self.f.ty(v), Type::Tile(_))
    }

    /// A value's vectors: a tile's, or a scalar as one 1-lane vector.
    fn vectors(&self, v: Value) -> R<Vec<BV<'ctx>>> {
        if let Some(c) = self.chunks.get(&v) {
            return Ok(c.clone());
        }
        let s = self.get(v)?;
        Ok(vec![self.splat(s, 1)?])
    }

    /// Defines `v` from vectors cut as [`Self::cut`] says (a scalar from
    /// its one 1-lane vector).
    fn define(&mut self, v: Value, vectors: Vec<BV<'ctx>>) -> R<()> {
        if self.is_tile(v) {
            self.chunks.insert(v, vectors);
        } else {
            let one = vectors
                .first()
                .copied()
                .ok_or_else(|| CodegenError::Invalid("a scalar without a value".into()))?;
            let s = self.lane(one, 0)?;
            self.vals.insert(v, s);
        }
        Ok(())
    }

    fn lane(&self, v: BV<'ctx>, k: u32) -> R<BV<'ctx>> {
        Ok(self.b.build_extract_element(
            v.into_vector_value(),
            self.ctx.i32_type().const_int(u64::from(k), false),
            "lane",
        )?)
    }

    /// The vector whose lane `i` is lane `lanes[i]` of `v`.
    fn permute(
        &self,
        v: VectorValue<'ctx>,
        lanes: impl IntoIterator<Item = u32>,
        name: &str,
    ) -> R<VectorValue<'ctx>> {
        let i32t = self.ctx.i32_type();
        let mask: Vec<_> = lanes
            .into_iter()
            .map(|k| i32t.const_int(u64::from(k), false))
            .collect();
        Ok(self.b.build_shuffle_vector(
            v,
            v.get_type().get_poison(),
            VectorType::const_vector(&mask),
            name,
        )?)
    }

    /// Lane `k` of vector `v` repeated `n` times.
    fn broadcast_lane(&self, v: BV<'ctx>, k: u32, n: usize) -> R<BV<'ctx>> {
        Ok(self
            .permute(v.into_vector_value(), std::iter::repeat_n(k, n), "bcast")?
            .into())
    }

    /// Lanes `from..from + n` of `v`.
    fn sub_vector(&self, v: VectorValue<'ctx>, from: u32, n: u32) -> R<VectorValue<'ctx>> {
        self.permute(v, from..from + n, "part")
    }

    /// Vectors cut as `cut` from scalars in row-major order.
    fn vectors_of_scalars(&self, cut: &Cut, scalars: &[BV<'ctx>]) -> R<Vec<BV<'ctx>>> {
        let mut out = Vec::with_capacity(cut.vectors());
        let i32t = self.ctx.i32_type();
        for r in 0..cut.rows() {
            for j in 0..cut.per_row {
                let n = cut.lanes(j);
                let first = scalars[r * cut.last() + j * cut.width];
                let mut v = self.vector_of(first.get_type(), n as u32).get_poison();
                for k in 0..n {
                    v = self.b.build_insert_element(
                        v,
                        scalars[r * cut.last() + j * cut.width + k],
                        i32t.const_int(k as u64, false),
                        "ins",
                    )?;
                }
                out.push(v.into());
            }
        }
        Ok(out)
    }

    fn const_vector(&self, c: BV<'ctx>, n: usize) -> BV<'ctx> {
        VectorType::const_vector(&vec![c; n]).into()
    }

    pub(super) fn index_value(&self, v: Value) -> R<IntValue<'ctx>> {
        Ok(self.get(v)?.into_int_value())
    }

    /// The part of an affine expression without tile coordinates.
    pub(super) fn affine_base(&self, e: &Affine) -> R<IntValue<'ctx>> {
        let i64t = self.ctx.i64_type();
        let mut acc = i64t.const_int(e.constant as u64, true);
        for &(c, v) in &e.terms {
            let iv = self.index_value(v)?;
            let term = self
                .b
                .build_int_mul(iv, i64t.const_int(c as u64, true), "term")?;
            acc = self.b.build_int_add(acc, term, "idx")?;
        }
        Ok(acc)
    }

    pub(super) fn access(&self, buf: Value, index: &[Affine], rank: usize) -> R<Access<'ctx>> {
        let Type::Buffer(t) = self.f.ty(buf) else {
            return Err(CodegenError::Invalid("an access to a non-buffer".into()));
        };
        let i64t = self.ctx.i64_type();
        let mut base = i64t.const_zero();
        let mut grad = vec![0i64; rank.max(1)];
        let mut dims = Vec::with_capacity(index.len());
        for ((e, &stride), &extent) in index.iter().zip(&t.strides).zip(&t.shape) {
            let b = self.affine_base(e)?;
            let scaled = self
                .b
                .build_int_mul(b, i64t.const_int(stride as u64, false), "off")?;
            base = self.b.build_int_add(base, scaled, "off")?;
            let mut coeffs = vec![0i64; rank.max(1)];
            for &(c, k) in &e.axes {
                if k < coeffs.len() {
                    coeffs[k] = coeffs[k].wrapping_add(c);
                    grad[k] = grad[k].wrapping_add(c.wrapping_mul(stride as i64));
                }
            }
            dims.push((b, coeffs, extent));
        }
        Ok(Access {
            pointer: self.get(buf)?.into_pointer_value(),
            base,
            grad,
            dims,
            dtype: t.dtype,
        })
    }

    /// Vector `j` of row `row` of an access: the element offset of its
    /// first lane and the step between lanes.
    fn place(
        &self,
        a: &Access<'ctx>,
        cut: &Cut,
        row: &[usize],
        j: usize,
    ) -> R<(IntValue<'ctx>, i64)> {
        let last = cut.shape.len() - 1;
        let fixed =
            row_offset(a, row).wrapping_add(a.grad[last].wrapping_mul((j * cut.width) as i64));
        let off = self.b.build_int_add(
            a.base,
            self.ctx.i64_type().const_int(fixed as u64, true),
            "at",
        )?;
        // One lane has no step: a scalar access.
        let step = if cut.lanes(j) == 1 { 1 } else { a.grad[last] };
        Ok((off, step))
    }

    /// Which lanes of vector `j` of row `row` index inside the buffer. An
    /// index that is the same in every lane is compared once, as a scalar
    /// (a convolution's padded rows and columns, with channels in the
    /// lanes), and only the indices that move with the lanes as vectors;
    /// the dimensions `proven` inside (`proven_inside`) not at all.
    fn in_bounds(
        &self,
        a: &Access<'ctx>,
        cut: &Cut,
        row: &[usize],
        j: usize,
        proven: &[bool],
    ) -> R<BV<'ctx>> {
        let i64t = self.ctx.i64_type();
        let last = cut.shape.len() - 1;
        let n = cut.lanes(j);
        let mut lanes: Option<BV<'ctx>> = None;
        let mut uniform: Option<IntValue<'ctx>> = None;
        for (d, (b, coeffs, extent)) in a.dims.iter().enumerate() {
            if proven.get(d).copied().unwrap_or(false) {
                continue;
            }
            let mut fixed: i64 = 0;
            for (k, &c) in row.iter().enumerate() {
                fixed = fixed.wrapping_add(coeffs[k].wrapping_mul(c as i64));
            }
            fixed = fixed.wrapping_add(coeffs[last].wrapping_mul((j * cut.width) as i64));
            let first = self
                .b
                .build_int_add(*b, i64t.const_int(fixed as u64, true), "i")?;
            let limit = i64t.const_int(*extent as u64, false);
            if coeffs[last] == 0 {
                let inside = self
                    .b
                    .build_int_compare(IntPredicate::ULT, first, limit, "in")?;
                uniform = Some(match uniform {
                    None => inside,
                    Some(prev) => self.b.build_and(prev, inside, "in")?,
                });
                continue;
            }
            let steps: Vec<_> = (0..n)
                .map(|k| i64t.const_int(coeffs[last].wrapping_mul(k as i64) as u64, true))
                .collect();
            let idx = super::elementwise::int2!(
                self,
                build_int_add,
                self.splat(first.into(), n as u32)?,
                BV::from(VectorType::const_vector(&steps))
            );
            let inside = self.icmp(IntPredicate::ULT, idx, self.const_vector(limit.into(), n))?;
            lanes = Some(match lanes {
                None => inside,
                Some(prev) => self.and(prev, inside)?,
            });
        }
        let uniform = uniform
            .map(|u| self.splat(u.into(), n as u32))
            .transpose()?;
        Ok(match (lanes, uniform) {
            (Some(l), Some(u)) => self.and(l, u)?,
            (Some(m), None) | (None, Some(m)) => m,
            (None, None) => self.all_on(n),
        })
    }

    /// Which dimensions of an access at `index` by a tile of `shape` stay
    /// inside the buffer's `extents` for every value its loop counters and
    /// program ids take (`dlc_tile::ir::index_ranges`) and every lane: a
    /// padded load tests only the others (the middle panels of a strided
    /// convolution's im2col copy, whose columns never reach the padding).
    fn proven_inside(&self, index: &[Affine], shape: &[usize], extents: &[usize]) -> Vec<bool> {
        index
            .iter()
            .zip(extents)
            .map(|(e, &extent)| {
                self.affine_bounds(e, shape)
                    .is_some_and(|(lo, hi)| lo >= 0 && hi < extent as i64)
            })
            .collect()
    }

    /// The least and greatest values `e` takes over every value its loop
    /// counters and program ids take (`dlc_tile::ir::index_ranges`) and
    /// every lane of a tile of `shape`; `None` where a term's range is not
    /// known (a value computed in the kernel).
    fn affine_bounds(&self, e: &Affine, shape: &[usize]) -> Option<(i64, i64)> {
        let ranges = self
            .index_ranges
            .get_or_init(|| dlc_tile::ir::index_ranges(self.f));
        let span = |c: i64, lo: i64, hi: i64| {
            let (x, y) = (c.saturating_mul(lo), c.saturating_mul(hi));
            (x.min(y), x.max(y))
        };
        let (mut lo, mut hi) = (e.constant, e.constant);
        for &(c, v) in &e.terms {
            let &(a, b) = ranges.get(&v)?;
            let (x, y) = span(c, a, b);
            (lo, hi) = (lo.saturating_add(x), hi.saturating_add(y));
        }
        for &(c, k) in &e.axes {
            let last = shape.get(k).map_or(0, |&n| n as i64 - 1);
            let (x, y) = span(c, 0, last);
            (lo, hi) = (lo.saturating_add(x), hi.saturating_add(y));
        }
        Some((lo, hi))
    }

    /// Pointers to `n` elements `step` apart from element `off`: the
    /// pointer to element `off`, offset by a constant vector of lane steps
    /// (32-bit where they fit, which x86 gathers and scatters take with a
    /// scalar base). Computed as integers and cast back, W3's 36 gathers
    /// per Winograd input tile took LLVM's `IndVarSimplify` and
    /// `InstCombine` 53 ms against 16, and 64-bit lane offsets halve
    /// the lanes of each gather instruction.
    fn lane_pointers(
        &self,
        a: &Access<'ctx>,
        off: IntValue<'ctx>,
        step: i64,
        n: usize,
    ) -> R<VectorValue<'ctx>> {
        use inkwell::types::AsTypeRef;
        use inkwell::values::AsValueRef;
        let first = self.element_pointer(a, off)?;
        let reach = step.unsigned_abs().saturating_mul(n as u64);
        let it = if reach < 1 << 31 {
            self.ctx.i32_type()
        } else {
            self.ctx.i64_type()
        };
        let steps: Vec<_> = (0..n)
            .map(|k| it.const_int(step.wrapping_mul(k as i64) as u64, true))
            .collect();
        let mut indices = [VectorType::const_vector(&steps).as_value_ref()];
        // SAFETY: the builder is positioned (it emitted `first` above), the
        // element type, base pointer and index are values of this context,
        // and a GEP of a pointer by one vector of integer indices is valid
        // IR (a vector of pointers). inkwell's `build_gep` takes scalar
        // indices only. Not `inbounds`, as in `element_pointer`.
        let ptrs = unsafe {
            VectorValue::new(llvm_sys::core::LLVMBuildGEP2(
                self.b.as_mut_ptr(),
                storage_type(self.ctx, a.dtype).as_type_ref(),
                first.as_value_ref(),
                indices.as_mut_ptr(),
                1,
                c"ptrs".as_ptr(),
            ))
        };
        Ok(ptrs)
    }

    pub(super) fn element_pointer(
        &self,
        a: &Access<'ctx>,
        off: IntValue<'ctx>,
    ) -> R<PointerValue<'ctx>> {
        // Not `inbounds`: a masked or padded access may start outside.
        // SAFETY (LLVM IR semantics): a plain GEP is defined for any offset;
        // only the lanes that are accessed must be inside the buffer.
        Ok(unsafe {
            self.b
                .build_gep(storage_type(self.ctx, a.dtype), a.pointer, &[off], "elt")?
        })
    }

    /// `p`, the address of a masked access's vector in row `row` of its
    /// tile, or the buffer's own start where the mask (a `tile.mask`) says
    /// that the row is outside its limits. Nothing is read or written
    /// through a mask that is all off, but its address is still
    /// translated, and where it falls on a page that is not mapped (or
    /// mapped and not yet touched) Zen 4 takes a microcode assist of some
    /// 400 cycles per access: the rows of a product's edge block past the
    /// operand's last row are such accesses (rows 32-35 of a 36-row block
    /// of a `[32, 8192]` operand lie 1 MB past its start, beyond the
    /// allocation), and made a product of that operand 3.3x slower
    /// (docs/performance.md). The test is one scalar comparison per row,
    /// made once by the mask; a vector's own lanes past a row's end stay
    /// next to the row.
    fn guarded_pointer(
        &self,
        a: &Access<'ctx>,
        off: IntValue<'ctx>,
        mask: Option<Value>,
        row: usize,
        row_start: &mut Option<(PointerValue<'ctx>, IntValue<'ctx>)>,
    ) -> R<PointerValue<'ctx>> {
        let guard = mask
            .and_then(|m| self.row_guards.get(&m)?.get(row).copied())
            .filter(|g| g.get_zero_extended_constant() != Some(1));
        let Some(guard) = guard else {
            return self.element_pointer(a, off);
        };
        // One select per row, its other vectors at their distance from
        // the first: the selected pointer is then one register rather than
        // one per vector (a select per vector cost u2's gated product 5%).
        if let Some((start, start_off)) = *row_start {
            let d = self.b.build_int_sub(off, start_off, "d")?;
            // SAFETY (LLVM IR semantics): a plain GEP is defined for any
            // offset, as in `element_pointer`.
            return Ok(unsafe {
                self.b
                    .build_gep(storage_type(self.ctx, a.dtype), start, &[d], "guarded")?
            });
        }
        let p = self.element_pointer(a, off)?;
        let start = self
            .b
            .build_select(guard, p, a.pointer, "guarded")?
            .into_pointer_value();
        *row_start = Some((start, off));
        Ok(start)
    }

    fn alignment(&self, d: DType) -> u32 {
        d.size_bytes() as u32
    }

    /// The vectors of the mask operand at `at`, if there is one and some
    /// lane of it may be off (a `tile.mask` proven on everywhere is
    /// constants all on: its loads and stores are plain ones).
    fn mask_of(&self, op: &OpData, at: usize) -> R<Option<Vec<BV<'ctx>>>> {
        let mask = op.operands.get(at).map(|&m| self.vectors(m)).transpose()?;
        Ok(mask.filter(|m| {
            !m.iter().all(|&v| match v {
                BV::VectorValue(v) => v == self.all_on(v.get_type().get_size() as usize),
                BV::IntValue(i) => i.get_zero_extended_constant() == Some(1),
                _ => false,
            })
        }))
    }

    /// `n` lanes all on.
    fn all_on(&self, n: usize) -> BV<'ctx> {
        self.const_vector(self.ctx.bool_type().const_int(1, false).into(), n)
    }

    /// `tile.load`.
    fn load(&mut self, op: &OpData, index: &[Affine], pad: Option<f64>) -> R<()> {
        let r = op.results[0];
        let cut = self.cut(r);
        let a = self.access(op.operands[0], index, cut.shape.len())?;
        let store_t = storage_type(self.ctx, a.dtype);
        let mask = self.mask_of(op, 1)?;
        let mask_op = op.operands.get(1).copied();
        if mask.is_none()
            && pad.is_none()
            && let Some(out) = self.transposing_load(&a, &cut)?
        {
            return self.define(r, out);
        }
        if pad.is_none()
            && let Some(out) = self.strided_transposing_load(&a, &cut, mask.as_deref())?
        {
            return self.define(r, out);
        }
        let proven = match (pad, self.f.ty(op.operands[0])) {
            (Some(_), Type::Buffer(t)) => self.proven_inside(index, &cut.shape, &t.shape),
            _ => Vec::new(),
        };
        // Whether any dimension is left to test; the pad stays what lanes
        // off in the mask read.
        let tested = pad.is_some() && !proven.iter().all(|&p| p);
        let widened = self.widened_loads(op, index, &cut, mask.is_some() || tested);
        let mut out = Vec::with_capacity(cut.vectors());
        for row in 0..cut.rows() {
            let mut row_start = None;
            let rc = cut.row_coords(row);
            for j in 0..cut.per_row {
                let n = cut.lanes(j);
                let (off, step) = self.place(&a, &cut, &rc, j)?;
                let mut on = mask.as_ref().map(|m| m[row * cut.per_row + j]);
                if tested {
                    let inside = self.in_bounds(&a, &cut, &rc, j, &proven)?;
                    on = Some(match on {
                        Some(m) => self.and(m, inside)?,
                        None => inside,
                    });
                }
                let vt = self.vector_of(store_t, n as u32);
                let passthru: BV<'ctx> = match pad {
                    Some(p) => {
                        let c = self.constant(p, a.dtype);
                        let c = if a.dtype == DType::Bool {
                            self.ctx
                                .i8_type()
                                .const_int(u64::from(p != 0.0), false)
                                .into()
                        } else {
                            c
                        };
                        self.const_vector(c, n)
                    }
                    None => vt.const_zero().into(),
                };
                let raw: BV<'ctx> = match (step, on) {
                    (0, None) => {
                        let p = self.element_pointer(&a, off)?;
                        let s = self.b.build_load(store_t, p, "ld")?;
                        self.splat(s, n as u32)?
                    }
                    (0, Some(m)) => {
                        // Every lane's element is one: read once where any
                        // lane is on (a one-element masked load, so nothing
                        // is touched when none is), broadcast, and the pad
                        // where lanes are off. A product's epilogue reads
                        // its bias so, per row of a register tile under a
                        // mask of the block's edges: as a gather it was a
                        // quarter of a 1 x 1 convolution's time.
                        let p = self.guarded_pointer(&a, off, mask_op, row, &mut row_start)?;
                        let one = self.vector_of(store_t, 1);
                        let any = self.splat(self.any(m)?.into(), 1)?;
                        let first = self.b.build_extract_element(
                            passthru.into_vector_value(),
                            self.ctx.i32_type().const_zero(),
                            "pad",
                        )?;
                        let pass = self.splat(first, 1)?;
                        let l = self.call(
                            "llvm.masked.load",
                            &[one.into(), p.get_type().into()],
                            &[p.into(), any, pass],
                        )?;
                        let s = self.b.build_extract_element(
                            l.into_vector_value(),
                            self.ctx.i32_type().const_zero(),
                            "ld",
                        )?;
                        let v = self.splat(s, n as u32)?;
                        self.select(m, v, passthru)?
                    }
                    (1, None) => {
                        let p = self.element_pointer(&a, off)?;
                        match widened[j] {
                            Some(w) => {
                                let l = self.b.build_load(
                                    self.vector_of(store_t, w as u32),
                                    p,
                                    "ld",
                                )?;
                                set_alignment(l, self.alignment(a.dtype))?;
                                self.permute(l.into_vector_value(), 0..n as u32, "narrow")?
                                    .into()
                            }
                            None => {
                                let l = self.b.build_load(vt, p, "ld")?;
                                set_alignment(l, self.alignment(a.dtype))?;
                                l
                            }
                        }
                    }
                    (1, Some(m)) => {
                        let p = self.guarded_pointer(&a, off, mask_op, row, &mut row_start)?;
                        self.call(
                            "llvm.masked.load",
                            &[vt.into(), p.get_type().into()],
                            &[p.into(), m, passthru],
                        )?
                    }
                    (2..=MAX_DEINTERLEAVED_STEP, m) => {
                        let p = self.guarded_pointer(&a, off, mask_op, row, &mut row_start)?;
                        self.deinterleaved_load(&a, p, step as usize, n, m, passthru)?
                    }
                    (_, m) => {
                        let ptrs = self.lane_pointers(&a, off, step, n)?;
                        let m = m.unwrap_or_else(|| self.all_on(n));
                        self.call(
                            "llvm.masked.gather",
                            &[vt.into(), ptrs.get_type().into()],
                            &[ptrs.into(), m, passthru],
                        )?
                    }
                };
                let v = if a.dtype == DType::Bool {
                    let z = vt.const_zero();
                    self.icmp(IntPredicate::NE, raw, z.into())?
                } else {
                    raw
                };
                out.push(v);
            }
        }
        self.define(r, out)
    }

    /// For each vector of a row of a load's tile, the wider vector it is
    /// read as, where its lanes are not a power of two and the elements up
    /// to the next power of two (at most a native vector) are proven inside
    /// the buffer for every row: `None` otherwise, and for a masked or
    /// tested load. LLVM splits a 7-lane load into loads of 4, 2 and 1 (a
    /// 7 x 7 image's rows); one 8-lane load, its last lane dropped, is one
    /// instruction.
    fn widened_loads(
        &self,
        op: &OpData,
        index: &[Affine],
        cut: &Cut,
        masked: bool,
    ) -> Vec<Option<usize>> {
        let Type::Buffer(t) = self.f.ty(op.operands[0]) else {
            return vec![None; cut.per_row];
        };
        (0..cut.per_row)
            .map(|j| {
                let n = cut.lanes(j);
                let w = n.next_power_of_two();
                if masked || n < 2 || w == n || w > self.lanes {
                    return None;
                }
                let mut shape = cut.shape.clone();
                let last = shape.len() - 1;
                shape[last] = j * cut.width + w;
                self.proven_inside(index, &shape, &t.shape)
                    .iter()
                    .all(|&p| p)
                    .then_some(w)
            })
            .collect()
    }

    /// `tile.prefetch`: every 64-byte line a load of the tile would read,
    /// fetched for reading into cache level `level` (`llvm.prefetch`,
    /// locality 3 for the first level, 2 for the second, 1 for the
    /// third: x86's `prefetcht0`, `t1`, `t2`): along a contiguous row, from its first
    /// element every line's worth and its last (a row not aligned to a line
    /// spans one more); along any other stride, each element's; rows at
    /// the same address once. The addresses are plain offsets, never
    /// dereferenced: outside the buffer they are no error (x86's and
    /// AArch64's prefetches do not fault).
    fn prefetch(&mut self, op: &OpData, index: &[Affine], shape: &[usize], level: usize) -> R<()> {
        let cut = Cut::new(shape, self.lanes);
        let a = self.access(op.operands[0], index, cut.shape.len())?;
        let (n, step) = (cut.last(), a.grad[cut.shape.len() - 1]);
        let per_line = (64 / a.dtype.size_bytes().max(1)).max(1);
        let mut lanes: Vec<usize> = match step {
            0 => vec![0],
            1 => (0..n).step_by(per_line).chain([n - 1]).collect(),
            _ => (0..n).collect(),
        };
        lanes.dedup();
        let i32t = self.ctx.i32_type();
        let i64t = self.ctx.i64_type();
        // Rows at the same offset (along an axis the index does not move
        // with) are prefetched once.
        let mut seen = std::collections::HashSet::new();
        for row in 0..cut.rows() {
            let coords = cut.row_coords(row);
            if !seen.insert(row_offset(&a, &coords)) {
                continue;
            }
            let (start, _) = self.place(&a, &cut, &coords, 0)?;
            for &e in &lanes {
                let delta = i64t.const_int((e as i64).wrapping_mul(step) as u64, true);
                let off = self.b.build_int_add(start, delta, "pf")?;
                let p = self.element_pointer(&a, off)?;
                self.call_void(
                    "llvm.prefetch",
                    &[p.get_type().into()],
                    &[
                        p.into(),
                        i32t.const_zero().into(),
                        i32t.const_int(4 - level.clamp(1, 3) as u64, false).into(),
                        i32t.const_int(1, false).into(),
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// `n` elements `step` apart from element `off` (lanes off in `mask`
    /// read `passthru`): one masked load of the `n * step` elements they
    /// span, only the wanted ones enabled (so nothing outside the lanes'
    /// own elements is touched), and a shuffle keeping every `step`-th: how
    /// a stride-2 window (a strided convolution's im2col copy or panels) is
    /// read, rather than by `llvm.masked.gather`, which x86 runs about an
    /// element at a time (measured in docs/performance.md).
    fn deinterleaved_load(
        &self,
        a: &Access<'ctx>,
        p: PointerValue<'ctx>,
        step: usize,
        n: usize,
        mask: Option<BV<'ctx>>,
        passthru: BV<'ctx>,
    ) -> R<BV<'ctx>> {
        let store_t = storage_type(self.ctx, a.dtype);
        let (step32, wide) = (step as u32, (n * step) as u32);
        if mask.is_none() && step == 2 && n >= 2 {
            // Every lane on, two apart: the 2n - 1 elements from the first
            // lane's to the last's as two plain loads of n overlapping in
            // one (the second ends at the last lane's element, so nothing
            // past it is read), and one shuffle.
            let vt = self.vector_of(store_t, n as u32);
            let first = self.b.build_load(vt, p, "even.lo")?;
            set_alignment(first, self.alignment(a.dtype))?;
            // SAFETY (LLVM IR semantics): a GEP inside the span the lanes
            // read, as in `element_pointer`.
            let q = unsafe {
                self.b.build_gep(
                    store_t,
                    p,
                    &[self.ctx.i64_type().const_int(n as u64 - 1, false)],
                    "even.hi",
                )?
            };
            let second = self.b.build_load(vt, q, "even.hi")?;
            set_alignment(second, self.alignment(a.dtype))?;
            let n32 = n as u32;
            let pick: Vec<_> = (0..n32)
                .map(|k| {
                    let e = 2 * k;
                    let lane = if e < n32 { e } else { n32 + e - (n32 - 1) };
                    self.ctx.i32_type().const_int(u64::from(lane), false)
                })
                .collect();
            return Ok(self
                .b
                .build_shuffle_vector(
                    first.into_vector_value(),
                    second.into_vector_value(),
                    VectorType::const_vector(&pick),
                    "deinterleave",
                )?
                .into());
        }
        let wvt = self.vector_of(store_t, wide);
        // Wide lane `w` stands for lane `w / step`, and is read where it is
        // lane `w / step`'s own element.
        let spread = || (0..wide).map(|w| w / step32);
        let bool_t = self.ctx.bool_type();
        let own: Vec<_> = (0..wide)
            .map(|w| bool_t.const_int(u64::from(w % step32 == 0), false))
            .collect();
        let own: BV<'ctx> = VectorType::const_vector(&own).into();
        let wide_mask = match mask {
            None => own,
            Some(m) => {
                // Spread as 32-bit lanes: LLVM's x86 back end shuffled a
                // `<5 x i1>` mask wrongly on AVX2.
                let m = m.into_vector_value();
                let i32v = self.ctx.i32_type().vec_type(m.get_type().get_size());
                let wide32 = self.b.build_int_s_extend(m, i32v, "mask32")?;
                let spread32 = self.permute(wide32, spread(), "spread")?;
                let zero = spread32.get_type().const_zero();
                let m = self.icmp(IntPredicate::NE, spread32.into(), zero.into())?;
                self.and(m, own)?
            }
        };
        let wide_pt = self.permute(passthru.into_vector_value(), spread(), "widepad")?;
        let loaded = self
            .call(
                "llvm.masked.load",
                &[wvt.into(), p.get_type().into()],
                &[p.into(), wide_mask, wide_pt.into()],
            )?
            .into_vector_value();
        Ok(self
            .permute(loaded, (0..n as u32).map(|k| k * step32), "deinterleave")?
            .into())
    }

    /// `tile.store`. Where the target has no mask registers
    /// (`CpuDesc::mask_registers`), a masked store whose lanes are all on
    /// (most of a product epilogue's, over whole blocks) takes a branch of
    /// plain stores; only a partial one is masked. So does a masked store
    /// of runs along the columns (`runs_along_columns`) on any target: with
    /// mask registers it was a scatter per row, which Zen 4 runs slowly (a
    /// `6 x 32` register tile of a 1 x 1 convolution over 14 x 14 pixels,
    /// computed with the pixels as rows, stored as 12 sixteen-lane
    /// scatters: a tenth of its product's time); its partial branch stores
    /// the runs under the mask transposed.
    fn store(&mut self, op: &OpData, index: &[Affine]) -> R<()> {
        let v = op.operands[0];
        let cut = self.cut(v);
        let a = self.access(op.operands[1], index, cut.shape.len())?;
        let data = self.vectors(v)?;
        let mask = self.mask_of(op, 2)?;
        let mask_op = op.operands.get(2).copied();
        let Some(mask) = mask else {
            if self.transposing_store(&a, &cut, &data)?
                || self.strided_transposing_store(&a, &cut, &data, None)?
            {
                return Ok(());
            }
            return self.store_vectors(&a, &cut, &data, None, None);
        };
        if self.mask_registers && !self.runs_along_columns(&a, &cut) {
            return self.store_vectors(&a, &cut, &data, Some(&mask), mask_op);
        }
        let mut all = self.ctx.bool_type().const_int(1, false);
        for m in &mask {
            let on = self.every(*m)?;
            all = self.b.build_and(all, on, "mask.all")?;
        }
        let full = self.ctx.append_basic_block(self.func, "store.full");
        let part = self.ctx.append_basic_block(self.func, "store.part");
        let join = self.ctx.append_basic_block(self.func, "store.join");
        self.b.build_conditional_branch(all, full, part)?;
        self.b.position_at_end(full);
        if !self.strided_transposing_store(&a, &cut, &data, None)? {
            self.store_vectors(&a, &cut, &data, None, None)?;
        }
        self.b.build_unconditional_branch(join)?;
        self.b.position_at_end(part);
        if !self.strided_transposing_store(&a, &cut, &data, Some(&mask))? {
            self.store_vectors(&a, &cut, &data, Some(&mask), mask_op)?;
        }
        self.b.build_unconditional_branch(join)?;
        self.b.position_at_end(join);
        Ok(())
    }

    /// The stores of `tile.store`'s vectors `data` through access `a`,
    /// under `mask` (the mask operand `mask_op`'s vectors) if there is one.
    fn store_vectors(
        &mut self,
        a: &Access<'ctx>,
        cut: &Cut,
        data: &[BV<'ctx>],
        mask: Option<&[BV<'ctx>]>,
        mask_op: Option<Value>,
    ) -> R<()> {
        for row in 0..cut.rows() {
            let mut row_start = None;
            let rc = cut.row_coords(row);
            for j in 0..cut.per_row {
                let n = cut.lanes(j);
                let (off, step) = self.place(a, cut, &rc, j)?;
                let on = mask.map(|m| m[row * cut.per_row + j]);
                let mut x = data[row * cut.per_row + j];
                if a.dtype == DType::Bool {
                    x = super::elementwise::convert_int!(
                        self,
                        build_int_z_extend,
                        x,
                        self.ctx.i8_type().into(),
                        IntType
                    );
                }
                match (step, on) {
                    (1, None) => {
                        let p = self.element_pointer(a, off)?;
                        let s = self.b.build_store(p, x)?;
                        s.set_alignment(self.alignment(a.dtype))
                            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                    }
                    (1, Some(m)) => {
                        let p = self.guarded_pointer(a, off, mask_op, row, &mut row_start)?;
                        self.call_void(
                            "llvm.masked.store",
                            &[x.get_type(), p.get_type().into()],
                            &[x, p.into(), m],
                        )?;
                    }
                    (_, None) if !self.mask_registers && x.is_vector_value() => {
                        // Without mask registers a scatter is a branch and
                        // a store a lane: every lane on, a plain store of
                        // each. (As a scatter of every lane, LLVM made it
                        // and the masked store's partial branch one
                        // scatter under a select of their masks, a branch
                        // a lane: a one-row register tile's epilogue
                        // stored across pixel rows.)
                        let x = x.into_vector_value();
                        for k in 0..n {
                            let d = off
                                .get_type()
                                .const_int(step.wrapping_mul(k as i64) as u64, true);
                            let p =
                                self.element_pointer(a, self.b.build_int_add(off, d, "lane")?)?;
                            let lane = self.ctx.i32_type().const_int(k as u64, false);
                            let e = self.b.build_extract_element(x, lane, "lane")?;
                            let s = self.b.build_store(p, e)?;
                            s.set_alignment(self.alignment(a.dtype))
                                .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                        }
                    }
                    (_, m) => {
                        let ptrs = self.lane_pointers(a, off, step, n)?;
                        let m = m.unwrap_or_else(|| self.all_on(n));
                        self.call_void(
                            "llvm.masked.scatter",
                            &[x.get_type(), ptrs.get_type().into()],
                            &[x, ptrs.into(), m],
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A load of a 2-axis tile of a few rows (at most
    /// `MAX_DEINTERLEAVED_STEP`) and vectors of two lanes or more from
    /// column-major place (`offset = r + c *
    /// rows`, as bf16 panels hold pairs of the depth): each vector of
    /// columns is one contiguous run of `rows * lanes` elements, each row
    /// every `rows`-th of it, rather than a wide load per row. A shuffle
    /// that interleaves the rows again (the bf16 pair dot's) then cancels
    /// out. `None` where the load is not of that form.
    fn transposing_load(&self, a: &Access<'ctx>, cut: &Cut) -> R<Option<Vec<BV<'ctx>>>> {
        let rows = cut.shape.first().copied().unwrap_or(0);
        if cut.shape.len() != 2
            || !(2..=MAX_DEINTERLEAVED_STEP as usize).contains(&rows)
            || a.dtype == DType::Bool
            || a.grad[0] != 1
            || a.grad[1] != rows as i64
            || cut.last() < 2
        {
            return Ok(None);
        }
        let store_t = storage_type(self.ctx, a.dtype);
        let runs = (0..cut.per_row)
            .map(|j| {
                let n = cut.lanes(j);
                let (off, _) = self.place(a, cut, &[0], j)?;
                let p = self.element_pointer(a, off)?;
                let run =
                    self.b
                        .build_load(self.vector_of(store_t, (rows * n) as u32), p, "run")?;
                set_alignment(run, self.alignment(a.dtype))?;
                Ok((run.into_vector_value(), n as u32))
            })
            .collect::<R<Vec<_>>>()?;
        let rows32 = rows as u32;
        let mut out = Vec::with_capacity(cut.vectors());
        for r in 0..rows32 {
            for &(run, n) in &runs {
                out.push(
                    self.permute(run, (0..n).map(|c| c * rows32 + r), "row")?
                        .into(),
                );
            }
        }
        Ok(Some(out))
    }

    /// A store of a 2-axis tile into column-major place (`offset = r + c *
    /// rows`, as packing the left operand of a product does): each vector
    /// of columns is transposed in registers across the rows and written as
    /// one contiguous run, instead of being scattered. Returns whether the
    /// store was of that form.
    fn transposing_store(&self, a: &Access<'ctx>, cut: &Cut, data: &[BV<'ctx>]) -> R<bool> {
        let rows = cut.shape[0];
        if cut.shape.len() != 2 || rows < 2 || a.dtype == DType::Bool {
            return Ok(false);
        }
        if a.grad[0] != 1 || a.grad[1] != rows as i64 || cut.last() < 2 {
            return Ok(false);
        }
        let i32t = self.ctx.i32_type();
        for j in 0..cut.per_row {
            let n = cut.lanes(j);
            if n >= 2 && n.is_power_of_two() && rows.is_multiple_of(n) {
                // Square blocks of n rows, each transposed in registers:
                // column c of rows rb.. is the run at (rb, c).
                for rb in (0..rows).step_by(n) {
                    let mut block: Vec<VectorValue<'ctx>> = (rb..rb + n)
                        .map(|r| data[r * cut.per_row + j].into_vector_value())
                        .collect();
                    self.transpose_square(&mut block)?;
                    let (off, _) = self.place(a, cut, &[rb], j)?;
                    for (c, run) in block.into_iter().enumerate() {
                        let p = self.column_run(a, off, c)?;
                        let st = self.b.build_store(p, run)?;
                        st.set_alignment(self.alignment(a.dtype))
                            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                    }
                }
                continue;
            }
            let parts: Vec<BV<'ctx>> = (0..rows).map(|r| data[r * cut.per_row + j]).collect();
            let (whole, lanes) = self.concat(&parts)?;
            // Element (r, c) goes to place c * rows + r of the run.
            let mask: Vec<_> = (0..n)
                .flat_map(|c| (0..rows).map(move |r| (r, c)))
                .map(|(r, c)| i32t.const_int(u64::from(lanes[r] + c as u32), false))
                .collect();
            let run = self.b.build_shuffle_vector(
                whole,
                whole.get_type().get_poison(),
                VectorType::const_vector(&mask),
                "transposed",
            )?;
            let (off, _) = self.place(a, cut, &[0], j)?;
            let p = self.element_pointer(a, off)?;
            let st = self.b.build_store(p, run)?;
            st.set_alignment(self.alignment(a.dtype))
                .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        }
        Ok(true)
    }

    /// Whether a 2-axis access is one whose rows are adjacent in memory and
    /// whose columns are at least `rows` and more than
    /// `MAX_DEINTERLEAVED_STEP` apart (`offset = r + c * stride`: a product
    /// computed with the pixels as its rows, its result and what its
    /// epilogue reads laid out `[channels, pixels]`). Such a tile is moved
    /// as runs along its columns, transposed in registers
    /// (`strided_transposing_load`, `strided_transposing_store`), not
    /// gathered and scattered: without mask registers (AVX2) LLVM cuts a
    /// gather or scatter into a branch and a scalar access per lane, and
    /// Zen 4 runs its gather and scatter instructions slowly (a 6 x 32
    /// tile's store was 24 eight-lane scatters).
    fn runs_along_columns(&self, a: &Access<'ctx>, cut: &Cut) -> bool {
        let rows = cut.shape[0];
        cut.shape.len() == 2
            && rows >= 2
            && a.dtype != DType::Bool
            && a.grad[0] == 1
            && a.grad[1] >= rows as i64
            && a.grad[1] > MAX_DEINTERLEAVED_STEP
            && cut.last() >= 2
    }

    /// `v` widened to `lanes` lanes, the new ones poison.
    fn padded_lanes(&self, v: VectorValue<'ctx>, lanes: usize) -> R<VectorValue<'ctx>> {
        let i32t = self.ctx.i32_type();
        let n = v.get_type().get_size() as usize;
        let mask: Vec<_> = (0..lanes)
            .map(|k| {
                if k < n {
                    i32t.const_int(k as u64, false)
                } else {
                    i32t.get_poison()
                }
            })
            .collect();
        Ok(self.b.build_shuffle_vector(
            v,
            v.get_type().get_poison(),
            VectorType::const_vector(&mask),
            "widen",
        )?)
    }

    /// `vectors` (at most `side` of at most `side` lanes, `side` a power of
    /// two) widened and padded to a `side x side` square (poison) and
    /// transposed: lane `r` of vector `c` is lane `c` of `vectors[r]`.
    fn transposed_square(
        &self,
        vectors: impl IntoIterator<Item = VectorValue<'ctx>>,
        side: usize,
    ) -> R<Vec<VectorValue<'ctx>>> {
        let mut block = Vec::with_capacity(side);
        for v in vectors {
            block.push(self.padded_lanes(v, side)?);
        }
        let Some(first) = block.first() else {
            return Err(CodegenError::Invalid(
                "a transposition of no vectors".into(),
            ));
        };
        let pad = first.get_type().get_poison();
        block.resize(side, pad);
        self.transpose_square(&mut block)?;
        Ok(block)
    }

    /// Rows `rb..rb + k` of vector `j` of a mask, transposed as
    /// [`Self::transposed_square`] does (as 32-bit lanes, as
    /// `deinterleaved_load` spreads its mask: shuffles of `i1` vectors were
    /// lowered wrongly).
    fn transposed_mask(
        &self,
        mask: &[BV<'ctx>],
        cut: &Cut,
        j: usize,
        (rb, k, side): (usize, usize, usize),
    ) -> R<Vec<VectorValue<'ctx>>> {
        let mut wide = Vec::with_capacity(k);
        for r in rb..rb + k {
            let m = mask[r * cut.per_row + j].into_vector_value();
            let t = self.ctx.i32_type().vec_type(m.get_type().get_size());
            wide.push(self.b.build_int_s_extend(m, t, "mask32")?);
        }
        self.transposed_square(wide, side)
    }

    /// Lanes `0..k` of a transposed mask's vector `c`, as a mask.
    fn mask_run(&self, on: &[VectorValue<'ctx>], c: usize, k: usize) -> R<BV<'ctx>> {
        let m32 = self.sub_vector(on[c], 0, k as u32)?;
        let zero = m32.get_type().const_zero();
        self.icmp(IntPredicate::NE, m32.into(), zero.into())
    }

    /// The pointer to column `c`'s run of a 2-axis access whose first
    /// column starts at element `off`.
    fn column_run(&self, a: &Access<'ctx>, off: IntValue<'ctx>, c: usize) -> R<PointerValue<'ctx>> {
        let at = self.b.build_int_add(
            off,
            self.ctx
                .i64_type()
                .const_int(a.grad[1].wrapping_mul(c as i64) as u64, true),
            "run",
        )?;
        self.element_pointer(a, at)
    }

    /// A load of a tile [`Self::runs_along_columns`] accepts (lanes off in
    /// `mask` read zero): each vector of columns is read a square block of
    /// rows at a time, one run of the block's rows per column (masked by the
    /// mask transposed, where there is one), and transposed in registers.
    /// `None` where the load is not of that form.
    fn strided_transposing_load(
        &self,
        a: &Access<'ctx>,
        cut: &Cut,
        mask: Option<&[BV<'ctx>]>,
    ) -> R<Option<Vec<BV<'ctx>>>> {
        if !self.runs_along_columns(a, cut) {
            return Ok(None);
        }
        let rows = cut.shape[0];
        let store_t = storage_type(self.ctx, a.dtype);
        let mut out: Vec<Option<BV<'ctx>>> = vec![None; cut.vectors()];
        for j in 0..cut.per_row {
            let n = cut.lanes(j);
            let side = n.next_power_of_two();
            for rb in (0..rows).step_by(side) {
                let k = side.min(rows - rb);
                let on = mask
                    .map(|m| self.transposed_mask(m, cut, j, (rb, k, side)))
                    .transpose()?;
                let (off, _) = self.place(a, cut, &[rb], j)?;
                let vt = self.vector_of(store_t, k as u32);
                let mut columns = Vec::with_capacity(n);
                for c in 0..n {
                    let p = self.column_run(a, off, c)?;
                    let run = match &on {
                        None => {
                            let l = self.b.build_load(vt, p, "run")?;
                            set_alignment(l, self.alignment(a.dtype))?;
                            l
                        }
                        Some(on) => self.call(
                            "llvm.masked.load",
                            &[vt.into(), p.get_type().into()],
                            &[p.into(), self.mask_run(on, c, k)?, vt.const_zero().into()],
                        )?,
                    };
                    columns.push(run.into_vector_value());
                }
                let square = self.transposed_square(columns, side)?;
                for (r, v) in square.into_iter().take(k).enumerate() {
                    out[(rb + r) * cut.per_row + j] = Some(self.sub_vector(v, 0, n as u32)?.into());
                }
            }
        }
        out.into_iter()
            .map(|v| v.ok_or_else(|| CodegenError::Invalid("a vector not loaded".into())))
            .collect::<R<Vec<_>>>()
            .map(Some)
    }

    /// A store of a tile [`Self::runs_along_columns`] accepts: each vector
    /// of columns is transposed in registers a square block of rows at a
    /// time, and each column written as one run of the block's rows (masked
    /// by the mask transposed alike, where there is one). Returns whether
    /// the store was of that form.
    fn strided_transposing_store(
        &self,
        a: &Access<'ctx>,
        cut: &Cut,
        data: &[BV<'ctx>],
        mask: Option<&[BV<'ctx>]>,
    ) -> R<bool> {
        if !self.runs_along_columns(a, cut) {
            return Ok(false);
        }
        let rows = cut.shape[0];
        for j in 0..cut.per_row {
            let n = cut.lanes(j);
            let side = n.next_power_of_two();
            for rb in (0..rows).step_by(side) {
                let k = side.min(rows - rb);
                let values = self.transposed_square(
                    (rb..rb + k).map(|r| data[r * cut.per_row + j].into_vector_value()),
                    side,
                )?;
                let on = mask
                    .map(|m| self.transposed_mask(m, cut, j, (rb, k, side)))
                    .transpose()?;
                let (off, _) = self.place(a, cut, &[rb], j)?;
                for (c, &column) in values.iter().enumerate().take(n) {
                    let run = self.sub_vector(column, 0, k as u32)?;
                    let p = self.column_run(a, off, c)?;
                    match &on {
                        None => {
                            let st = self.b.build_store(p, run)?;
                            st.set_alignment(self.alignment(a.dtype))
                                .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                        }
                        Some(on) => {
                            self.call_void(
                                "llvm.masked.store",
                                &[run.get_type().into(), p.get_type().into()],
                                &[run.into(), p.into(), self.mask_run(on, c, k)?],
                            )?;
                        }
                    }
                }
            }
        }
        Ok(true)
    }

    /// Transposes `n` vectors of `n` lanes (`n` a power of two) in place:
    /// afterwards lane `c` of vector `r` holds what lane `r` of vector `c`
    /// held. `log2 n` stages, each swapping the off-diagonal blocks of
    /// every `2b x 2b` block with two-vector shuffles (`n log2 n` shuffles,
    /// one permute instruction each), rather than one wide shuffle LLVM
    /// lowers lane by lane.
    fn transpose_square(&self, v: &mut [VectorValue<'ctx>]) -> R<()> {
        let n = v.len();
        let i32t = self.ctx.i32_type();
        let mask = |f: &dyn Fn(usize) -> usize| {
            let lanes: Vec<_> = (0..n).map(|l| i32t.const_int(f(l) as u64, false)).collect();
            VectorType::const_vector(&lanes)
        };
        let mut b = n / 2;
        while b >= 1 {
            let lo = mask(&|l| if l & b == 0 { l } else { n + l - b });
            let hi = mask(&|l| if l & b == 0 { l + b } else { n + l });
            for i in (0..n).filter(|i| i & b == 0) {
                let (x, y) = (v[i], v[i + b]);
                v[i] = self.b.build_shuffle_vector(x, y, lo, "tlo")?;
                v[i + b] = self.b.build_shuffle_vector(x, y, hi, "thi")?;
            }
            b /= 2;
        }
        Ok(())
    }

    /// The vectors side by side in one vector; returns it and where each
    /// part's first lane is.
    fn concat(&self, parts: &[BV<'ctx>]) -> R<(VectorValue<'ctx>, Vec<u32>)> {
        let i32t = self.ctx.i32_type();
        // (vector, where each original part starts in it)
        let mut level: Vec<(VectorValue<'ctx>, Vec<(usize, u32)>)> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| (p.into_vector_value(), vec![(i, 0)]))
            .collect();
        while level.len() > 1 {
            let mut next = Vec::with_capacity(level.len().div_ceil(2));
            let mut it = level.into_iter();
            while let Some((x, px)) = it.next() {
                let Some((y, py)) = it.next() else {
                    next.push((x, px));
                    break;
                };
                let (nx, ny) = (x.get_type().get_size(), y.get_type().get_size());
                let wide = nx.max(ny);
                let widen = |v: VectorValue<'ctx>, n: u32| -> R<VectorValue<'ctx>> {
                    if n == wide {
                        return Ok(v);
                    }
                    self.padded_lanes(v, wide as usize)
                };
                let (x, y) = (widen(x, nx)?, widen(y, ny)?);
                let mask: Vec<_> = (0..2 * wide)
                    .map(|k| i32t.const_int(u64::from(k), false))
                    .collect();
                let both =
                    self.b
                        .build_shuffle_vector(x, y, VectorType::const_vector(&mask), "concat")?;
                let mut at = px;
                at.extend(py.into_iter().map(|(i, o)| (i, o + wide)));
                next.push((both, at));
            }
            level = next;
        }
        let (v, at) = level
            .pop()
            .ok_or_else(|| CodegenError::Invalid("nothing to concatenate".into()))?;
        let mut starts = vec![0; parts.len()];
        for (i, o) in at {
            starts[i] = o;
        }
        Ok((v, starts))
    }

    /// `tile.mask`: element `e` is on when `e_k < limit_k` on every axis.
    fn mask(&mut self, op: &OpData, limits: &[Affine]) -> R<()> {
        let r = op.results[0];
        let cut = self.cut(r);
        let i64t = self.ctx.i64_type();
        // An axis whose limit is at least the tile's extent wherever the
        // kernel runs (a product's epilogue over whole register tiles) is
        // on everywhere: its lanes are constants, so a store under the mask
        // is a plain one, with no per-tile compares and no test of the row.
        let always = limits
            .iter()
            .zip(&cut.shape)
            .map(|(l, &n)| {
                l.axes.is_empty()
                    && self
                        .affine_bounds(l, &cut.shape)
                        .is_some_and(|(lo, _)| lo >= n as i64)
            })
            .collect::<Vec<_>>();
        let everywhere = always.iter().all(|&a| a);
        let limits = limits
            .iter()
            .map(|l| self.affine_base(l))
            .collect::<R<Vec<_>>>()?;
        let last = cut.shape.len() - 1;
        let mut out = Vec::with_capacity(cut.vectors());
        let mut guards = Vec::with_capacity(cut.rows());
        for row in 0..cut.rows() {
            let rc = cut.row_coords(row);
            let mut row_on = self.ctx.bool_type().const_int(1, false);
            for (k, &c) in rc.iter().enumerate() {
                if always[k] {
                    continue;
                }
                let on = self.b.build_int_compare(
                    IntPredicate::SLT,
                    i64t.const_int(c as u64, false),
                    limits[k],
                    "on",
                )?;
                row_on = self.b.build_and(row_on, on, "on")?;
            }
            guards.push(row_on);
            for j in 0..cut.per_row {
                let n = cut.lanes(j);
                if everywhere {
                    out.push(self.all_on(n));
                    continue;
                }
                if always[last] {
                    out.push(self.splat(row_on.into(), n as u32)?);
                    continue;
                }
                let cols: Vec<_> = (0..n)
                    .map(|k| i64t.const_int((j * cut.width + k) as u64, false))
                    .collect();
                let lim = self.splat(limits[last].into(), n as u32)?;
                let cols_on = self.icmp(
                    IntPredicate::SLT,
                    VectorType::const_vector(&cols).into(),
                    lim,
                )?;
                let rows_on = self.splat(row_on.into(), n as u32)?;
                out.push(self.and(cols_on, rows_on)?);
            }
        }
        if last > 0 {
            self.row_guards.insert(r, guards);
        }
        self.define(r, out)
    }

    /// `tile.broadcast`.
    fn broadcast(&mut self, op: &OpData) -> R<()> {
        let (x, r) = (op.operands[0], op.results[0]);
        let (from, to) = (self.cut(x), self.cut(r));
        let src = self.vectors(x)?;
        let mut out = Vec::with_capacity(to.vectors());
        for row in 0..to.rows() {
            let rc = to.row_coords(row);
            let src_rc: Vec<usize> = rc
                .iter()
                .zip(&from.shape)
                .map(|(&c, &d)| if d == 1 { 0 } else { c })
                .collect();
            let src_row = from.row_of(&src_rc);
            for j in 0..to.per_row {
                out.push(if from.last() == to.last() {
                    src[src_row * from.per_row + j]
                } else {
                    self.broadcast_lane(src[src_row * from.per_row], 0, to.lanes(j))?
                });
            }
        }
        self.define(r, out)
    }

    /// `tile.reshape`, `tile.expand_dims`, `tile.trans`: element `e` of the
    /// result is element `source(e)` (flat, row-major) of the operand.
    fn rearrange(&mut self, op: &OpData, source: impl Fn(usize) -> usize) -> R<()> {
        let (x, r) = (op.operands[0], op.results[0]);
        let (from, to) = (self.cut(x), self.cut(r));
        let src = self.vectors(x)?;
        let n = to.rows() * to.last();
        if (0..n).all(|e| source(e) == e) && from.last() == to.last() {
            return self.define(r, src);
        }
        let scalars = (0..n)
            .map(|e| {
                let (v, k) = from.locate(source(e));
                self.lane(src[v], k)
            })
            .collect::<R<Vec<_>>>()?;
        let out = self.vectors_of_scalars(&to, &scalars)?;
        self.define(r, out)
    }

    /// `tile.slice`: at constant offsets (a window's taps in a loop written
    /// out), each result vector is at most two of the operand's run
    /// together and shifted, one shuffle (`valignd` on x86), and an
    /// operand vector itself where they line up; at offsets known only at
    /// run time, the elements go through a copy on the stack.
    fn slice(&mut self, op: &OpData, offsets: &[Affine]) -> R<()> {
        let (x, r) = (op.operands[0], op.results[0]);
        let (from, to) = (self.cut(x), self.cut(r));
        let src = self.vectors(x)?;
        let at = offsets
            .iter()
            .map(|e| self.affine_base(e))
            .collect::<R<Vec<_>>>()?;
        let constant: Option<Vec<usize>> = at
            .iter()
            .map(|v| v.get_sign_extended_constant().map(|c| c.max(0) as usize))
            .collect();
        let Some(at) = constant else {
            return self.slice_at_run_time(op, &from, &to, &src, &at);
        };
        if offsets.is_empty() {
            return self.define(r, src);
        }
        let outside = || CodegenError::Invalid(format!("tile.slice at {at:?} outside its operand"));
        let i32t = self.ctx.i32_type();
        let last = at.len() - 1;
        let mut out = Vec::with_capacity(to.vectors());
        for row in 0..to.rows() {
            let mut c = to.row_coords(row);
            c.iter_mut().zip(&at).for_each(|(c, o)| *c += o);
            let first = from.row_of(&c) * from.per_row;
            for j in 0..to.per_row {
                let n = to.lanes(j);
                let col = at[last] + j * to.width;
                let (a, lane) = (col / from.width, col % from.width);
                let part = |i: usize| -> R<VectorValue<'ctx>> {
                    Ok(src.get(first + i).ok_or_else(outside)?.into_vector_value())
                };
                let v = part(a)?;
                let held = from.lanes(a);
                if lane == 0 && n == held {
                    out.push(v.into());
                } else if lane + n <= held {
                    out.push(self.sub_vector(v, lane as u32, n as u32)?.into());
                } else {
                    let (w, next) = (v.get_type().get_size(), part(a + 1)?);
                    let next = match next.get_type().get_size() == w {
                        true => next,
                        false => self.padded_lanes(next, w as usize)?,
                    };
                    let mask: Vec<_> = (lane..lane + n)
                        .map(|k| i32t.const_int(k as u64, false))
                        .collect();
                    let both = VectorType::const_vector(&mask);
                    out.push(self.b.build_shuffle_vector(v, next, both, "window")?.into());
                }
            }
        }
        self.define(r, out)
    }

    /// [`Self::slice`] at offsets `at` known only at run time: the
    /// operand's elements stored to the stack, the result's loaded back.
    fn slice_at_run_time(
        &mut self,
        op: &OpData,
        from: &Cut,
        to: &Cut,
        src: &[BV<'ctx>],
        at: &[IntValue<'ctx>],
    ) -> R<()> {
        let d = self.tdtype(op.operands[0])?;
        let (st, i64t) = (storage_type(self.ctx, d), self.ctx.i64_type());
        let len = from.rows() * from.last();
        let copy = self.entry_alloca(BasicType::array_type(&st, len as u32).into(), "slice")?;
        let element = |g: &Self, i: IntValue<'ctx>| -> R<PointerValue<'ctx>> {
            // SAFETY (LLVM IR semantics): an index inside the copy, the
            // offsets clamped to where the result fits.
            Ok(unsafe { g.b.build_in_bounds_gep(st, copy, &[i], "elt")? })
        };
        for e in 0..len {
            let (v, k) = from.locate(e);
            let mut s = self.lane(src[v], k)?;
            if d == DType::Bool {
                s = self
                    .b
                    .build_int_z_extend(s.into_int_value(), st.into_int_type(), "byte")?
                    .into();
            }
            self.b.build_store(element(self, self.i64c(e as u64))?, s)?;
        }
        // Each offset clamped to where the result fits: a slice reaching
        // past its operand reads its last elements, never past the copy.
        let mut start = i64t.const_zero();
        for (k, &o) in at.iter().enumerate() {
            let room = self.i64c((from.shape[k] - to.shape[k]) as u64);
            let t = [i64t.into()];
            let o = self.call("llvm.smax", &t, &[o.into(), i64t.const_zero().into()])?;
            let o = self.call("llvm.smin", &t, &[o, room.into()])?;
            let dim = self.i64c(from.shape[k] as u64);
            start = self.b.build_int_mul(start, dim, "stride")?;
            start = self.b.build_int_add(start, o.into_int_value(), "start")?;
        }
        let mut scalars = Vec::with_capacity(to.rows() * to.last());
        for e in 0..to.rows() * to.last() {
            let (row, col) = (e / to.last(), e % to.last());
            let flat = from.row_of(&to.row_coords(row)) * from.last() + col;
            let i = self.b.build_int_add(start, self.i64c(flat as u64), "at")?;
            let mut s = self.b.build_load(st, element(self, i)?, "elt")?;
            if d == DType::Bool {
                s = self
                    .b
                    .build_int_truncate(s.into_int_value(), self.ctx.bool_type(), "bit")?
                    .into();
            }
            scalars.push(s);
        }
        let out = self.vectors_of_scalars(to, &scalars)?;
        self.define(op.results[0], out)
    }

    /// `tile.dot`: `acc + a @ b`, one broadcast of `a[m, k]` and one
    /// multiply-add per vector of row `k` of `b`.
    fn dot(&mut self, op: &OpData) -> R<()> {
        let (a, b, acc, r) = (
            op.operands[0],
            op.operands[1],
            op.operands[2],
            op.results[0],
        );
        let (ca, cb) = (self.cut(a), self.cut(b));
        let (m, k) = (ca.shape[0], ca.shape[1]);
        let d = self.tdtype(a)?;
        let acc_d = self.tdtype(acc)?;
        let (va, vb) = (self.vectors(a)?, self.vectors(b)?);
        let mut out = self.vectors(acc)?;
        if self.bf16_dot
            && d == DType::BF16
            && acc_d == DType::F32
            && k == 2
            && (0..cb.per_row).all(|j| cb.lanes(j) % BF16_DOT_LANES == 0)
        {
            return self.bf16_pair_dot(op, &ca, &cb, &va, &vb, out);
        }
        let widen = |g: &Self, v: BV<'ctx>| -> R<BV<'ctx>> {
            if d == acc_d {
                Ok(v)
            } else {
                g.cast(v, d, acc_d)
            }
        };
        let mut rows_b: Vec<Vec<BV<'ctx>>> = Vec::with_capacity(k);
        for p in 0..k {
            rows_b.push(
                (0..cb.per_row)
                    .map(|j| widen(self, vb[p * cb.per_row + j]))
                    .collect::<R<Vec<_>>>()?,
            );
        }
        for (p, row_b) in rows_b.iter().enumerate() {
            for i in 0..m {
                let (v, lane) = ca.locate(i * k + p);
                let mut splats: HashMap<usize, BV<'ctx>> = HashMap::new();
                for (j, &bj) in row_b.iter().enumerate() {
                    let n = cb.lanes(j);
                    let s = match splats.get(&n) {
                        Some(s) => *s,
                        None => {
                            let s = widen(self, self.broadcast_lane(va[v], lane, n)?)?;
                            splats.insert(n, s);
                            s
                        }
                    };
                    let slot = i * cb.per_row + j;
                    out[slot] = if acc_d.is_float() {
                        self.call("llvm.fmuladd", &[bj.get_type()], &[s, bj, out[slot]])?
                    } else {
                        let prod = self.binary(BinaryOp::Mul, s, bj, acc_d)?;
                        self.binary(BinaryOp::Add, out[slot], prod, acc_d)?
                    };
                }
            }
        }
        self.define(r, out)
    }

    /// `tile.dot` of an `m x 2` by a `2 x n` tile of bf16 into f32 (`n` a
    /// multiple of 16) as AVX-512 BF16 dot products of pairs: for each row,
    /// its pair is one 32-bit word broadcast to every lane, and each 16
    /// columns of the right operand's two rows are interleaved into 16
    /// pairs (`vdpbf16ps` adds `a0 * b0 + a1 * b1` to each f32 lane, the
    /// products exact, with round-to-nearest-even sums and denormals read
    /// and written as zero).
    fn bf16_pair_dot(
        &mut self,
        op: &OpData,
        ca: &Cut,
        cb: &Cut,
        va: &[BV<'ctx>],
        vb: &[BV<'ctx>],
        mut out: Vec<BV<'ctx>>,
    ) -> R<()> {
        let i32t = self.ctx.i32_type();
        let half = BF16_DOT_LANES as u32;
        let pair_t = self.ctx.bf16_type().vec_type(2 * half);
        // Each row's pair as a word in every lane.
        let mut rows = Vec::with_capacity(ca.shape[0]);
        for i in 0..ca.shape[0] {
            let mut pair = self.ctx.bf16_type().vec_type(2).get_poison();
            for slot in 0..2 {
                let (v, l) = ca.locate(2 * i + slot);
                let x = self.lane(va[v], l)?;
                pair = self.b.build_insert_element(
                    pair,
                    x,
                    i32t.const_int(slot as u64, false),
                    "pair",
                )?;
            }
            let word = self.b.build_bit_cast(pair, i32t, "word")?;
            let words = self.splat(word, half)?;
            rows.push(self.b.build_bit_cast(words, pair_t, "pairs")?);
        }
        for j in 0..cb.per_row {
            let n = cb.lanes(j) as u32;
            let (b0, b1) = (
                vb[j].into_vector_value(),
                vb[cb.per_row + j].into_vector_value(),
            );
            // Each 16 columns of both rows of `b`, as 16 pairs.
            let pairs = (0..n / half)
                .map(|h| {
                    let mask: Vec<_> = (h * half..(h + 1) * half)
                        .flat_map(|c| [c, n + c])
                        .map(|k| i32t.const_int(u64::from(k), false))
                        .collect();
                    self.b
                        .build_shuffle_vector(b0, b1, VectorType::const_vector(&mask), "bpairs")
                })
                .collect::<Result<Vec<_>, _>>()?;
            for (i, &row) in rows.iter().enumerate() {
                let slot = i * cb.per_row + j;
                let acc = out[slot].into_vector_value();
                let sums = pairs
                    .iter()
                    .enumerate()
                    .map(|(h, &p)| {
                        let part = self.sub_vector(acc, h as u32 * half, half)?;
                        self.call(
                            "llvm.x86.avx512bf16.dpbf16ps.512",
                            &[],
                            &[part.into(), row, p.into()],
                        )
                    })
                    .collect::<R<Vec<_>>>()?;
                out[slot] = self.concat(&sums)?.0.into();
            }
        }
        self.define(op.results[0], out)
    }

    /// A vector folded to one element with `op`.
    fn horizontal(&self, v: BV<'ctx>, op: BinaryOp, d: DType) -> R<BV<'ctx>> {
        let mut v = v.into_vector_value();
        let mut leftover: Vec<BV<'ctx>> = Vec::new();
        let mut n = v.get_type().get_size();
        while n > 1 {
            if n % 2 == 1 {
                leftover.push(self.lane(v.into(), n - 1)?);
                n -= 1;
                v = self.sub_vector(v, 0, n)?;
                continue;
            }
            let lo = self.sub_vector(v, 0, n / 2)?;
            let hi = self.sub_vector(v, n / 2, n / 2)?;
            v = self
                .binary(op, lo.into(), hi.into(), d)?
                .into_vector_value();
            n /= 2;
        }
        let mut s = self.lane(v.into(), 0)?;
        for x in leftover {
            s = self.binary(op, s, x, d)?;
        }
        Ok(s)
    }

    /// `tile.reduce`.
    fn reduce(&mut self, op: &OpData, kind: ReduceKind, axis: usize) -> R<()> {
        let (x, r) = (op.operands[0], op.results[0]);
        let d = self.tdtype(x)?;
        let bop = combining(kind)?;
        let from = self.cut(x);
        let src = self.vectors(x)?;
        let last = from.shape.len() - 1;
        if axis == last {
            // Each row folds to one element.
            let mut scalars = Vec::with_capacity(from.rows());
            for row in 0..from.rows() {
                let vs = &src[row * from.per_row..(row + 1) * from.per_row];
                let full = vs.len() - usize::from(from.lanes(vs.len() - 1) != from.width);
                let mut acc: Option<BV<'ctx>> = None;
                for &v in &vs[..full] {
                    acc = Some(match acc {
                        None => v,
                        Some(a) => self.binary(bop, a, v, d)?,
                    });
                }
                let mut s = match acc {
                    Some(a) => Some(self.horizontal(a, bop, d)?),
                    None => None,
                };
                for &v in &vs[full..] {
                    let h = self.horizontal(v, bop, d)?;
                    s = Some(match s {
                        None => h,
                        Some(a) => self.binary(bop, a, h, d)?,
                    });
                }
                scalars.push(
                    s.ok_or_else(|| CodegenError::Invalid("a reduction of no elements".into()))?,
                );
            }
            if self.is_tile(r) {
                let out = self.vectors_of_scalars(&self.cut(r), &scalars)?;
                self.chunks.insert(r, out);
            } else {
                self.vals.insert(r, scalars[0]);
            }
            return Ok(());
        }
        let to = self.cut(r);
        let mut out = Vec::with_capacity(to.vectors());
        for row in 0..to.rows() {
            let rc = to.row_coords(row);
            for j in 0..to.per_row {
                let mut acc: Option<BV<'ctx>> = None;
                for t in 0..from.shape[axis] {
                    let mut src_rc = rc.clone();
                    src_rc.insert(axis, t);
                    let v = src[from.row_of(&src_rc) * from.per_row + j];
                    acc = Some(match acc {
                        None => v,
                        Some(a) => self.binary(bop, a, v, d)?,
                    });
                }
                out.push(
                    acc.ok_or_else(|| CodegenError::Invalid("a reduction of no elements".into()))?,
                );
            }
        }
        self.define(r, out)
    }

    /// An element-wise op on scalars or on tiles vector by vector (on a
    /// GPU, element by element of each thread; `f` is told which elements
    /// exist where a thread holds fewer, and never on a CPU).
    fn elementwise(
        &mut self,
        op: &OpData,
        f: impl Fn(&Self, &[BV<'ctx>], Option<IntValue<'ctx>>) -> R<BV<'ctx>>,
    ) -> R<()> {
        if self.gpu.is_some() {
            return self.gpu_elementwise(op, f);
        }
        let r = op.results[0];
        if !self.is_tile(r) {
            let args = op
                .operands
                .iter()
                .map(|v| self.get(*v))
                .collect::<R<Vec<_>>>()?;
            let v = f(self, &args, None)?;
            self.vals.insert(r, v);
            return Ok(());
        }
        let args = op
            .operands
            .iter()
            .map(|v| self.vectors(*v))
            .collect::<R<Vec<_>>>()?;
        let n = self.cut(r).vectors();
        let mut out = Vec::with_capacity(n);
        for j in 0..n {
            let xs: Vec<BV<'ctx>> = args.iter().map(|a| a[j]).collect();
            out.push(f(self, &xs, None)?);
        }
        self.chunks.insert(r, out);
        Ok(())
    }

    /// A value's registers as a flat list (a tile's vectors, or on a GPU
    /// this thread's elements; else itself).
    pub(super) fn flatten(&self, v: Value) -> R<Vec<BV<'ctx>>> {
        if self.is_tile(v) {
            self.chunks
                .get(&v)
                .cloned()
                .ok_or_else(|| CodegenError::Invalid("a tile is used before it is defined".into()))
        } else {
            Ok(vec![self.get(v)?])
        }
    }

    /// Binds `values` to what [`Self::flatten`] gave.
    fn unflatten(&mut self, values: &[Value], flat: &[BV<'ctx>]) -> R<()> {
        let mut at = 0;
        for &v in values {
            let n = match (self.is_tile(v), self.gpu.is_some()) {
                (false, _) => 1,
                (true, true) => self.per_thread(v)?,
                (true, false) => self.cut(v).vectors(),
            };
            let part = flat
                .get(at..at + n)
                .ok_or_else(|| CodegenError::Invalid("tile.for carries too few values".into()))?;
            if self.is_tile(v) {
                self.chunks.insert(v, part.to_vec());
            } else {
                self.vals.insert(v, part[0]);
            }
            at += n;
        }
        Ok(())
    }

    /// The function body: buffers and kernels.
    fn host_block(&mut self, blk: &Block) -> R<()> {
        for &id in &blk.ops {
            let f = self.f;
            let op = f.op(id);
            self.loc.clone_from(&op.loc);
            match &op.kind {
                // Placed in the workspace, or prepared, when the function
                // starts.
                OpKind::Alloc | OpKind::Dealloc | OpKind::Prepared { .. } => {}
                OpKind::Global(values) => {
                    let p = self.constant_data(op.results[0], values)?;
                    self.vals.insert(op.results[0], p.into());
                }
                OpKind::View => self.view(op)?,
                OpKind::Kernel { grid, .. } => self.launch_kernel(id, grid)?,
                OpKind::Return => {
                    self.hand_back_workspace()?;
                    self.b
                        .build_return(Some(&self.ctx.i32_type().const_zero()))?;
                }
                other => {
                    return Err(CodegenError::Invalid(format!(
                        "{} outside a kernel",
                        other.name()
                    )));
                }
            }
        }
        Ok(())
    }

    /// `tile.view`: the view's pointer is its source's, moved by the
    /// difference of their offsets (a slice along an outer axis); accesses
    /// through either add only index times stride to their pointer.
    pub(super) fn view(&mut self, op: &OpData) -> R<()> {
        let (src, view) = (op.operands[0], op.results[0]);
        let p = self.get(src)?;
        let (Type::Buffer(s), Type::Buffer(v)) = (self.f.ty(src), self.f.ty(view)) else {
            return Err(CodegenError::Invalid("a view of a non-buffer".into()));
        };
        let p = match v.offset.checked_sub(s.offset) {
            Some(d) => self.elements_on(p, v.dtype, d)?,
            None => {
                return Err(CodegenError::Invalid(format!(
                    "a view {v} of {s} starts before it"
                )));
            }
        };
        self.vals.insert(view, p);
        Ok(())
    }

    /// Pointer `p` moved `n` elements of type `d` on (where a view with an
    /// offset starts); `p` itself when `n` is 0.
    pub(super) fn elements_on(&self, p: BV<'ctx>, d: DType, n: usize) -> R<BV<'ctx>> {
        if n == 0 {
            return Ok(p);
        }
        // SAFETY (LLVM IR semantics): the verifiers keep a view inside its
        // storage.
        let q = unsafe {
            self.b.build_in_bounds_gep(
                storage_type(self.ctx, d),
                p.into_pointer_value(),
                &[self.i64c(n as u64)],
                "view",
            )?
        };
        Ok(q.into())
    }

    /// A private constant global holding a `tile.global`'s elements in
    /// their storage type's little-endian bytes (one LLVM data array,
    /// however many elements), aligned as every buffer is.
    pub(super) fn constant_data(&self, v: Value, values: &[f64]) -> R<PointerValue<'ctx>> {
        let Type::Buffer(t) = self.f.ty(v) else {
            return Err(CodegenError::Invalid("tile.global of a non-buffer".into()));
        };
        let bytes = t.dtype.to_le_bytes_all(values);
        let data = self.ctx.const_string(&bytes, false);
        let g = self.module.add_global(data.get_type(), None, "dlc.const");
        g.set_initializer(&data);
        g.set_constant(true);
        g.set_linkage(Linkage::Private);
        g.set_unnamed_addr(true);
        g.set_alignment(64);
        Ok(g.as_pointer_value())
    }

    /// `tile.kernel`: the grid's programs, over threads when there are
    /// enough of them, with scratch memory allocated once per thread; the
    /// function they were outlined into (`None` for an empty grid).
    pub(super) fn kernel(&mut self, id: OpId, grid: &[usize]) -> R<Option<FunctionValue<'ctx>>> {
        let f = self.f;
        let op = f.op(id);
        let body = &op.regions[0];
        let total = grid.iter().product::<usize>();
        if total == 0 {
            return Ok(None);
        }
        // Scratch (and, on a CPU, shared) buffers in the thread's scratch
        // region of the workspace; program ids read by the body.
        let (allocs, bytes) = kernel_scratch(f, body)?;
        let mut pids = Vec::new();
        collect(f, &body.ops, &mut Vec::new(), &mut pids);
        // Inputs are passed as pointers with their offsets applied (see
        // `view`), so kernels that differ only in those share one function.
        let (key, inputs) = dlc_tile::print::relocatable_fingerprint(f, id);
        // Enough programs, or few heavy ones (a Winograd convolution over
        // 14 x 14 is two to four).
        let work = dlc_tile::ir::op_work(f, id);
        let threads = total >= self.min_threads || (total >= 2 && work >= self.min_thread_work);
        // Heavy kernels' programs are claimed by the threads as they come
        // free (`Gen::outline`), where a claim word's halves hold them.
        let claims = threads && work >= self.min_claim_work && total < 1 << 31;
        let claimed = claims.then_some(total as u64);
        let region = match (bytes, self.scratch) {
            (0, _) => None,
            (_, Some(region)) => Some(region),
            (_, None) => {
                return Err(CodegenError::Invalid(
                    "a kernel's scratch memory was not planned".into(),
                ));
            }
        };
        let extra: Vec<BV<'ctx>> = region.iter().map(|(p, _)| (*p).into()).collect();
        if let Some(&outlined) = self.kernels.get(&key) {
            self.launch(outlined, &inputs, &extra, threads, claimed)?;
            return Ok(Some(outlined));
        }
        let grid = grid.to_vec();
        let stride = region.map_or(0, |(_, stride)| stride);
        let run = move |g: &mut Gen<'ctx, '_, TileIr>,
                        first: IntValue<'ctx>,
                        end: IntValue<'ctx>,
                        thread: IntValue<'ctx>,
                        extra: &[BV<'ctx>]|
              -> R<()> {
            if let Some(base) = extra.first() {
                let at = g.b.build_int_mul(thread, g.i64c(stride), "region")?;
                for &(v, off) in &allocs {
                    let at = g.b.build_int_add(at, g.i64c(off), "at")?;
                    // SAFETY (LLVM IR semantics): the workspace holds a
                    // region of `stride` bytes for every thread.
                    let p = unsafe {
                        g.b.build_in_bounds_gep(
                            g.ctx.i8_type(),
                            base.into_pointer_value(),
                            &[at],
                            "scratch",
                        )?
                    };
                    g.vals.insert(v, p.into());
                }
            }
            g.counted(first, end, |g, i| {
                let mut rest = i;
                let mut ids = vec![g.i64c(0); grid.len()];
                for axis in (0..grid.len()).rev() {
                    let n = g.i64c(grid[axis] as u64);
                    ids[axis] = g.b.build_int_signed_rem(rest, n, "pid")?;
                    rest = g.b.build_int_signed_div(rest, n, "rest")?;
                }
                for &(v, axis) in &pids {
                    g.vals.insert(v, ids[axis].into());
                }
                g.program_block(body).map(|_| ())
            })
        };
        let outlined = self.outline(0..total as i64, &inputs, &extra, threads, claims, run)?;
        self.kernels.insert(key, outlined);
        self.launch(outlined, &inputs, &extra, threads, claimed)?;
        Ok(Some(outlined))
    }

    /// A kernel body or loop body; returns the values its `tile.yield`
    /// passes on, flattened. The ops whose code depends on how a tile is laid
    /// out go to the target's own match ([`Gen::cpu_program_op`], or
    /// `gpu_program_op` in the GPU generator); the element-wise ops, views and
    /// loops are written once for both.
    pub(super) fn program_block(&mut self, blk: &Block) -> R<Vec<BV<'ctx>>> {
        let f = self.f;
        for &id in &blk.ops {
            let op = f.op(id);
            self.loc.clone_from(&op.loc);
            let done = if self.gpu.is_some() {
                self.gpu_program_op(op)?
            } else {
                self.cpu_program_op(op)?
            };
            if done {
                continue;
            }
            match &op.kind {
                // Planned when the kernel starts.
                OpKind::Alloc | OpKind::ProgramId { .. } => {}
                OpKind::View => self.view(op)?,
                OpKind::Unary(u) => {
                    let d = self.tdtype(op.operands[0])?;
                    self.elementwise(op, |g, x, _| g.unary(*u, x[0], d))?;
                }
                OpKind::Binary(bop) => {
                    let d = self.tdtype(op.operands[0])?;
                    self.elementwise(op, |g, x, present| {
                        g.gpu_binary(*bop, x[0], x[1], d, present)
                    })?;
                }
                OpKind::Compare(c) => {
                    let d = self.tdtype(op.operands[0])?;
                    self.elementwise(op, |g, x, _| g.compare(*c, x[0], x[1], d))?;
                }
                OpKind::Select => self.elementwise(op, |g, x, _| g.select(x[0], x[1], x[2]))?,
                OpKind::Cast => {
                    let (from, to) = (self.tdtype(op.operands[0])?, self.tdtype(op.results[0])?);
                    self.elementwise(op, |g, x, _| g.cast(x[0], from, to))?;
                }
                OpKind::For { lo, hi, step } => {
                    let body = &op.regions[0];
                    let mut inits = Vec::new();
                    for v in &op.operands {
                        inits.extend(self.flatten(*v)?);
                    }
                    let i64t = self.ctx.i64_type();
                    // Written out on a CPU only.
                    let written_out = match (&self.gpu, inits.is_empty()) {
                        (Some(_), _) => None,
                        (None, true) => unrolled_rows(self.f, *lo, *hi, *step, body, self.lanes),
                        (None, false) => unrolled_trips(self.f, *lo, *hi, *step, body),
                    };
                    if let Some(trips) = written_out {
                        let mut carried = inits;
                        for k in 0..trips {
                            let i = i64t.const_int((*lo + k * (*step).max(1)) as u64, true);
                            self.vals.insert(body.args[0], i.into());
                            self.unflatten(&body.args[1..], &carried)?;
                            carried = self.program_block(body)?;
                        }
                        self.unflatten(&op.results, &carried)?;
                        continue;
                    }
                    // A GPU thread's copies in flight finish before the
                    // loop and by the end of each iteration.
                    if self.gpu.is_some() {
                        self.wait_copies()?;
                    }
                    let finals = self.counted_carrying(
                        i64t.const_int(*lo as u64, true),
                        i64t.const_int(*hi as u64, true),
                        (*step).max(1),
                        &inits,
                        |g, i, carried| {
                            g.vals.insert(body.args[0], i.into());
                            g.unflatten(&body.args[1..], carried)?;
                            let next = g.program_block(body)?;
                            if g.gpu.is_some() {
                                g.wait_copies()?;
                            }
                            Ok(next)
                        },
                    )?;
                    self.unflatten(&op.results, &finals)?;
                }
                OpKind::Yield => {
                    let mut out = Vec::new();
                    for v in &op.operands {
                        out.extend(self.flatten(*v)?);
                    }
                    return Ok(out);
                }
                other => {
                    return Err(CodegenError::Invalid(format!(
                        "{} inside a kernel",
                        other.name()
                    )));
                }
            }
        }
        Ok(vec![])
    }

    /// A program op whose code on a CPU depends on tiles being cut into
    /// native vectors; `false` for the ops [`Gen::program_block`] handles
    /// for both targets.
    fn cpu_program_op(&mut self, op: &OpData) -> R<bool> {
        match &op.kind {
            // A program is one thread.
            OpKind::Barrier => {}
            OpKind::Const(c) => {
                let r = op.results[0];
                let d = self.tdtype(r)?;
                let s = self.constant(*c, d);
                if self.is_tile(r) {
                    let cut = self.cut(r);
                    let out = (0..cut.vectors())
                        .map(|j| self.const_vector(s, cut.lanes(j % cut.per_row)))
                        .collect();
                    self.chunks.insert(r, out);
                } else {
                    self.vals.insert(r, s);
                }
            }
            OpKind::Splat => {
                let r = op.results[0];
                let s = self.get(op.operands[0])?;
                let cut = self.cut(r);
                let mut by_width: HashMap<usize, BV<'ctx>> = HashMap::new();
                let mut out = Vec::with_capacity(cut.vectors());
                for j in 0..cut.vectors() {
                    let n = cut.lanes(j % cut.per_row);
                    let v = match by_width.get(&n) {
                        Some(v) => *v,
                        None => {
                            let v = self.splat(s, n as u32)?;
                            by_width.insert(n, v);
                            v
                        }
                    };
                    out.push(v);
                }
                self.define(r, out)?;
            }
            OpKind::Load { index, pad } => self.load(op, index, *pad)?,
            OpKind::Store { index } => self.store(op, index)?,
            OpKind::Prefetch {
                index,
                shape,
                level,
            } => self.prefetch(op, index, shape, *level)?,
            OpKind::Mask { limits } => self.mask(op, limits)?,
            OpKind::Broadcast => self.broadcast(op)?,
            // One thread holds a whole tile, whatever its layout.
            OpKind::Reshape | OpKind::ExpandDims { .. } | OpKind::ConvertLayout => {
                self.rearrange(op, |e| e)?
            }
            OpKind::Trans { perm } => {
                let from = self.cut(op.operands[0]).shape;
                let to = self.cut(op.results[0]).shape;
                let perm = perm.clone();
                self.rearrange(op, move |e| {
                    let mut c = vec![0; to.len()];
                    let mut rest = e;
                    for k in (0..to.len()).rev() {
                        c[k] = rest % to[k];
                        rest /= to[k];
                    }
                    let mut src = vec![0; from.len()];
                    for (i, &p) in perm.iter().enumerate() {
                        src[p] = c[i];
                    }
                    src.iter().zip(&from).fold(0, |acc, (c, d)| acc * d + c)
                })?;
            }
            OpKind::Slice { offsets } => self.slice(op, offsets)?,
            OpKind::Dot { .. } => self.dot(op)?,
            OpKind::Reduce { kind, axis } => self.reduce(op, *kind, *axis)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// The most ops (counted through nested loops' bodies) the copies of an
/// unrolled loop of rows may hold together.
const UNROLLED_ROWS_MAX_OPS: usize = 2048;

/// How many iterations a `tile.for` carrying no values is written out as
/// (at most `UNROLLED_MAX_TRIPS`):
/// - the rows of a small plane whose body sums a window written out
///   ([`unrolled_trips`]) into at most one vector of `lanes`, a depthwise
///   convolution's or a pool's over 7 x 7 (`UNROLLED_ROWS_MAX_OPS` in all).
///   Each row's taps are one chain of dependent multiply-adds and its
///   padded loads' row masks were computed in the loop; written out, the
///   rows' chains interleave and the masks are constants (the weights are
///   still broadcast for each row: LLVM cannot move those loads past the
///   stores to the output, which may alias them as far as it knows). Zen
///   3, one thread, 7 x 7 planes: 3 x 3 over 960 channels 0.054 -> 0.037
///   ms, 5 x 5 over 1152 with SiLU 0.172 -> 0.120, over 576 with hardswish
///   0.085 -> 0.052. Not wider sums, which are chains side by side already
///   (the three 32-column tiles of a 112-column row: 0.141 -> 0.145 ms
///   written out), nor 14 rows (5 x 5 over 14 x 14 x 672: 0.259 ->
///   0.291);
/// - a short loop whose body reads a padded load at an index that moves
///   with its counter (an im2col copy's window taps; `UNROLLED_MAX_OPS` in
///   all, as a carried loop's): written out, each copy's bounds are tested
///   against constants. MobileNetV3-small's stem (3 x 3 at stride 2 into 16
///   channels) 0.270 -> 0.233 ms in the model. With the budget of rows
///   instead, ResNet-18's strided and 7 x 7 im2col copies were written out
///   too and its compile took 7.1 s rather than 2.6.
fn unrolled_rows(
    f: &Function,
    lo: i64,
    hi: i64,
    step: i64,
    body: &Block,
    lanes: usize,
) -> Option<i64> {
    let narrow = |v: &Value| {
        f.ty(*v)
            .shape()
            .is_none_or(|s| s.iter().product::<usize>() <= lanes)
    };
    let sums_written_out_window = || {
        any_op(f, body, &|op| match op.kind {
            OpKind::For { lo, hi, step } => {
                !op.operands.is_empty()
                    && op.operands.iter().all(narrow)
                    && unrolled_trips(f, lo, hi, step, &op.regions[0]).is_some()
            }
            _ => false,
        })
    };
    let counter = body.args[0];
    let reads_padded_along = || {
        any_op(f, body, &|op| {
            matches!(&op.kind, OpKind::Load { index, pad: Some(_) }
                if index.iter().any(|e| e.coefficient(counter) != 0))
        })
    };
    let trips = trips(lo, hi, step);
    let size = trips as usize * nested_ops(f, body);
    (trips > 1
        && trips <= UNROLLED_MAX_TRIPS
        && ((size <= UNROLLED_ROWS_MAX_OPS && sums_written_out_window())
            || (size <= UNROLLED_MAX_OPS && reads_padded_along())))
    .then_some(trips)
}

/// Whether `hit` holds for an op of `blk` or of a region nested in it.
fn any_op(f: &Function, blk: &Block, hit: &dyn Fn(&OpData) -> bool) -> bool {
    blk.ops.iter().any(|&id| {
        let op = f.op(id);
        hit(op) || op.regions.iter().any(|r| any_op(f, r, hit))
    })
}

fn set_alignment(v: BV<'_>, align: u32) -> R<()> {
    if let Some(i) = inkwell::values::BasicValue::as_instruction_value(&v) {
        i.set_alignment(align)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
    }
    Ok(())
}
