//! Tile IR to LLVM IR: the generator every function and outlined kernel
//! is emitted with (values, failure sites, counted loops), [`tile`] for the
//! tile dialect's ops, [`elementwise`] and [`math`] for the operators on
//! scalars and vectors, [`parallel`] for kernels outlined onto the OpenMP
//! runtime.

use std::collections::HashMap;

use crate::{CodegenError, R};
use dlc_core::DType;
use dlc_runtime::abi::Site;
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicMetadataTypeEnum, BasicTypeEnum};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FunctionValue, IntValue, PointerValue,
};
use inkwell::{AddressSpace, IntPredicate};

pub(crate) mod elementwise;
pub(crate) mod gpu;
mod math;
mod parallel;
pub(crate) mod profile;
pub(crate) mod tile;
pub(crate) mod workspace;

/// The IR a generator reads: its functions and values. What does not
/// depend on it (statuses, loops, element-wise operators, outlining onto
/// threads) is shared by every IR's generator.
pub(crate) trait Ir: Sized {
    /// A function of the IR.
    type Function;
    /// An SSA value.
    type Value: Copy + Eq + std::hash::Hash + Ord;
    /// The function's name.
    fn name(f: &Self::Function) -> &str;
    /// Its runtime signature (no failure sites).
    fn signature(f: &Self::Function) -> R<dlc_runtime::abi::Signature>;
    /// How many pointer parameters its C-ABI function takes.
    fn arity(f: &Self::Function) -> usize;
    /// Emits it as the C-ABI function `symbols.symbol(name)`, its failures
    /// numbered among `sites`, with vectors of `target`'s width (`symbols`
    /// names the functions of `all`, its module's, that it calls), its
    /// kernel launches timed among `profile`'s when there is one.
    #[allow(clippy::too_many_arguments)]
    fn emit<'ctx>(
        ctx: &'ctx Context,
        module: &Module<'ctx>,
        f: &Self::Function,
        all: &[Self::Function],
        symbols: &dlc_runtime::abi::Symbols,
        sites: &Sites,
        target: &dlc_core::TargetDesc,
        profile: Option<&profile::Profile>,
    ) -> R<FunctionValue<'ctx>>;
}

/// The C-ABI function `symbol` taking `params` pointers and returning a
/// status: the declaration already made (a caller emitted before it), or a
/// new one.
pub(crate) fn exported_function<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    params: usize,
    symbol: &str,
) -> FunctionValue<'ctx> {
    if let Some(f) = module.get_function(symbol) {
        return f;
    }
    let ptr = ctx.ptr_type(AddressSpace::default());
    let types: Vec<BasicMetadataTypeEnum<'_>> = (0..params).map(|_| ptr.into()).collect();
    module.add_function(
        symbol,
        ctx.i32_type().fn_type(&types, false),
        Some(Linkage::External),
    )
}

/// The least and greatest value of each of a function's loop counters and
/// program ids.
type IndexRanges<I> = HashMap<<I as Ir>::Value, (i64, i64)>;

pub(crate) struct Gen<'ctx, 'f, I: Ir = tile::TileIr> {
    ctx: &'ctx Context,
    module: &'f Module<'ctx>,
    b: Builder<'ctx>,
    f: &'f I::Function,
    func: FunctionValue<'ctx>,
    vals: HashMap<I::Value, BasicValueEnum<'ctx>>,
    /// Tile IR only: each tile value's vectors (see [`tile`]).
    chunks: HashMap<I::Value, Vec<BasicValueEnum<'ctx>>>,
    /// Tile IR only: for each `tile.mask` of two axes or more, whether each
    /// of its rows is inside the limits (a scalar), which a masked access
    /// by that mask tests to keep its address in the buffer (see
    /// `tile::Gen::guarded_pointer`).
    row_guards: HashMap<I::Value, Vec<inkwell::values::IntValue<'ctx>>>,
    /// Tile IR only: the range of each loop counter and program id of the
    /// function (`dlc_tile::ir::index_ranges`), computed when first asked
    /// and shared with the bodies outlined from it.
    index_ranges: std::rc::Rc<std::cell::OnceCell<IndexRanges<I>>>,
    /// The failure sites of the exported function being generated (its
    /// outlined bodies share them).
    sites: Sites,
    /// This LLVM function's block leaving with each status.
    fail_blocks: std::cell::RefCell<HashMap<i32, BasicBlock<'ctx>>>,
    /// The block every failed kernel launch of this LLVM function leaves
    /// through, with the phi of the failing status (see
    /// `parallel::launch`).
    launch_fail: std::cell::RefCell<Option<(BasicBlock<'ctx>, inkwell::values::PhiValue<'ctx>)>>,
    /// The words this LLVM function's kernel launches hand out their
    /// programs from, one per thread (see `parallel::launch`), allocated
    /// once in its entry block.
    claims: std::cell::Cell<Option<inkwell::values::PointerValue<'ctx>>>,
    /// In helpers that cannot fail: the block every failure branches to
    /// (unreachable).
    trap: Option<BasicBlock<'ctx>>,
    /// The source place of the op being generated.
    loc: Option<dlc_core::SourceLoc>,
    /// Where a failing status goes: `None` in a function that returns it,
    /// the shared slot in a function outlined for threads.
    status_slot: Option<PointerValue<'ctx>>,
    /// Tile IR only: the function each kernel was outlined into, by the
    /// kernel's fingerprint (`dlc_tile::print::fingerprint`), so that
    /// kernels doing the same thing to their inputs are emitted once.
    kernels: HashMap<String, FunctionValue<'ctx>>,
    /// Tile IR only, in an exported function: the global caching its
    /// workspace between calls and the workspace this call holds, handed
    /// back on every way out (see `workspace::Workspace`).
    workspace: Option<(PointerValue<'ctx>, PointerValue<'ctx>)>,
    /// Whether the workspace goes back to its cache for the next call
    /// (else it is freed): not a preparer's, which runs once per binding of
    /// the weights and would keep its intermediates' memory for the process.
    keep_workspace: bool,
    /// Tile IR only, in an exported function: where the workspace's
    /// per-thread scratch regions start, and the bytes of one.
    scratch: Option<(PointerValue<'ctx>, u64)>,
    /// Lanes of one vector (of f32) on the target, the fewest programs a
    /// kernel spreads over threads, and the element operations from which
    /// a kernel of fewer (but two or more) programs does too.
    lanes: usize,
    min_threads: usize,
    min_thread_work: f64,
    /// The element operations from which a kernel on threads hands its
    /// programs out as threads come free (`TargetDesc::min_claim_work`).
    min_claim_work: f64,
    /// Whether the target has AVX-512 BF16's dot products of bf16 pairs
    /// (`CpuDesc::avx512_bf16`), which a `tile.dot` of bf16 two deep runs as.
    bf16_dot: bool,
    /// Whether the target's masks are predicate registers
    /// (`CpuDesc::mask_registers`; true off the CPU): where not, a masked
    /// store whose lanes are all on is a plain one at run time (see
    /// `tile::Gen::store`).
    mask_registers: bool,
    /// In a GPU kernel: the block's threads (see [`gpu`]).
    gpu: Option<gpu::Threads<'ctx>>,
    /// In a host function of a profiled module: the module's launches,
    /// which this one's are timed among (see [`profile`]).
    profile: Option<profile::Profile>,
}

/// The places where an exported function can fail, in the order their
/// statuses number them: status `kind | (k + 1) << 8` is a failure of kind
/// `kind` at site `k` (see `dlc_runtime::abi`).
pub(crate) type Sites = std::rc::Rc<std::cell::RefCell<Vec<Site>>>;

fn storage_type(ctx: &Context, d: DType) -> BasicTypeEnum<'_> {
    match d {
        DType::F32 => ctx.f32_type().into(),
        DType::F64 => ctx.f64_type().into(),
        DType::F16 => ctx.f16_type().into(),
        DType::BF16 => ctx.bf16_type().into(),
        DType::I8 | DType::U8 | DType::Bool => ctx.i8_type().into(),
        DType::I16 | DType::U16 => ctx.i16_type().into(),
        DType::I32 | DType::U32 => ctx.i32_type().into(),
        DType::I64 | DType::U64 => ctx.i64_type().into(),
    }
}

fn scalar_type(ctx: &Context, d: DType) -> BasicTypeEnum<'_> {
    match d {
        DType::Bool => ctx.bool_type().into(),
        other => storage_type(ctx, other),
    }
}

impl<'ctx, 'f, I: Ir> Gen<'ctx, 'f, I> {
    /// A generator for `func`, an LLVM function emitted for (part of) `f`.
    pub(super) fn within(
        ctx: &'ctx Context,
        module: &'f Module<'ctx>,
        f: &'f I::Function,
        func: FunctionValue<'ctx>,
        sites: &Sites,
    ) -> Self {
        Gen {
            ctx,
            module,
            b: ctx.create_builder(),
            f,
            func,
            vals: HashMap::new(),
            chunks: HashMap::new(),
            row_guards: HashMap::new(),
            index_ranges: Default::default(),
            sites: sites.clone(),
            fail_blocks: Default::default(),
            launch_fail: Default::default(),
            claims: Default::default(),
            trap: None,
            loc: None,
            status_slot: None,
            kernels: HashMap::new(),
            workspace: None,
            keep_workspace: true,
            scratch: None,
            lanes: dlc_core::TargetDesc::host().lanes(DType::F32),
            min_threads: dlc_core::TargetDesc::host().min_thread_iterations(),
            min_thread_work: dlc_core::TargetDesc::host().min_thread_work(),
            min_claim_work: dlc_core::TargetDesc::host().min_claim_work(),
            bf16_dot: false,
            mask_registers: true,
            gpu: None,
            profile: None,
        }
    }

    /// A generator placed in the entry block of a new C-ABI function
    /// `symbol` for `f`: `int32_t symbol(void *p0, ...)`, one pointer per
    /// value of `params`, which are bound to them.
    pub(super) fn exported(
        ctx: &'ctx Context,
        module: &'f Module<'ctx>,
        f: &'f I::Function,
        params: &[I::Value],
        symbol: &str,
        sites: &Sites,
    ) -> R<Self> {
        let func = exported_function(ctx, module, params.len(), symbol);
        let g = Gen::within(ctx, module, f, func, sites);
        g.b.position_at_end(ctx.append_basic_block(func, "entry"));
        let mut g = g;
        for (p, v) in func.get_param_iter().zip(params) {
            g.vals.insert(*v, p);
        }
        Ok(g)
    }

    /// The block that leaves the function with a failure of `kind` at the
    /// op being generated (its source place numbered among the function's
    /// sites).
    pub(super) fn fail_block(&self, kind: i32) -> R<BasicBlock<'ctx>> {
        if let Some(trap) = self.trap {
            return Ok(trap);
        }
        let status = self.status_of(kind);
        if let Some(b) = self.fail_blocks.borrow().get(&status) {
            return Ok(*b);
        }
        let here = self.b.get_insert_block();
        let block = self.ctx.append_basic_block(self.func, "fail");
        self.b.position_at_end(block);
        self.fail_with(self.ctx.i32_type().const_int(status as u64, false))?;
        if let Some(here) = here {
            self.b.position_at_end(here);
        }
        self.fail_blocks.borrow_mut().insert(status, block);
        Ok(block)
    }

    /// The status of a failure of `kind` at the op being generated: its
    /// source place numbered among the function's sites.
    pub(super) fn status_of(&self, kind: i32) -> i32 {
        let site = {
            let mut sites = self.sites.borrow_mut();
            let this = Site {
                kind,
                loc: self.loc.clone(),
            };
            match sites.iter().position(|s| *s == this) {
                Some(k) => k + 1,
                None => {
                    sites.push(this);
                    sites.len()
                }
            }
        };
        // Statuses are i32: past 2^23 sites, the place is left unknown.
        kind | i32::try_from(site)
            .ok()
            .filter(|s| *s < 1 << 23)
            .unwrap_or(0)
            << 8
    }

    fn get(&self, v: I::Value) -> R<BasicValueEnum<'ctx>> {
        self.vals.get(&v).copied().ok_or_else(|| {
            CodegenError::Invalid("a value is used before it is defined".to_string())
        })
    }

    /// A call of intrinsic `name` overloaded on `types`.
    fn intrinsic(
        &self,
        name: &str,
        types: &[BasicTypeEnum<'ctx>],
        args: &[BasicValueEnum<'ctx>],
    ) -> R<inkwell::values::CallSiteValue<'ctx>> {
        let decl = Intrinsic::find(name)
            .and_then(|i| i.get_declaration(self.module, types))
            .ok_or_else(|| CodegenError::Llvm(format!("no intrinsic {name}")))?;
        let args: Vec<BasicMetadataValueEnum<'ctx>> = args.iter().map(|a| (*a).into()).collect();
        Ok(self.b.build_call(decl, &args, "call")?)
    }

    /// The value of intrinsic `name` overloaded on `types`.
    pub(super) fn call(
        &self,
        name: &str,
        types: &[BasicTypeEnum<'ctx>],
        args: &[BasicValueEnum<'ctx>],
    ) -> R<BasicValueEnum<'ctx>> {
        self.intrinsic(name, types, args)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::Llvm(format!("{name} gives no value")))
    }

    /// Intrinsic `name`, which gives nothing (a masked store).
    pub(super) fn call_void(
        &self,
        name: &str,
        types: &[BasicTypeEnum<'ctx>],
        args: &[BasicValueEnum<'ctx>],
    ) -> R<()> {
        self.intrinsic(name, types, args).map(|_| ())
    }

    /// A loop `lo..hi` by `step` carrying `inits` from one iteration to the
    /// next: `body` gets the index and the carried values and gives the next
    /// ones; returns the final values.
    fn counted_carrying(
        &mut self,
        lo: IntValue<'ctx>,
        hi: IntValue<'ctx>,
        step: i64,
        inits: &[BasicValueEnum<'ctx>],
        body: impl FnOnce(
            &mut Self,
            IntValue<'ctx>,
            &[BasicValueEnum<'ctx>],
        ) -> R<Vec<BasicValueEnum<'ctx>>>,
    ) -> R<Vec<BasicValueEnum<'ctx>>> {
        let i64t = self.ctx.i64_type();
        let pre = self
            .b
            .get_insert_block()
            .ok_or_else(|| CodegenError::Llvm("no insertion block".into()))?;
        let header = self.ctx.append_basic_block(self.func, "loop.header");
        let body_bb = self.ctx.append_basic_block(self.func, "loop.body");
        let exit = self.ctx.append_basic_block(self.func, "loop.exit");
        self.b.build_unconditional_branch(header)?;
        self.b.position_at_end(header);
        let iv = self.b.build_phi(i64t, "i")?;
        iv.add_incoming(&[(&lo, pre)]);
        let mut carried = Vec::new();
        for v in inits {
            let phi = self.b.build_phi(v.get_type(), "carried")?;
            phi.add_incoming(&[(v, pre)]);
            carried.push(phi);
        }
        let i = iv.as_basic_value().into_int_value();
        let more = self.b.build_int_compare(IntPredicate::SLT, i, hi, "more")?;
        self.b.build_conditional_branch(more, body_bb, exit)?;
        self.b.position_at_end(body_bb);
        let current: Vec<BasicValueEnum<'ctx>> =
            carried.iter().map(|p| p.as_basic_value()).collect();
        let next = body(self, i, &current)?;
        let latch = self
            .b
            .get_insert_block()
            .ok_or_else(|| CodegenError::Llvm("no insertion block".into()))?;
        let inc = self
            .b
            .build_int_add(i, i64t.const_int(step as u64, true), "next")?;
        iv.add_incoming(&[(&inc, latch)]);
        for (phi, v) in carried.iter().zip(&next) {
            phi.add_incoming(&[(v, latch)]);
        }
        self.b.build_unconditional_branch(header)?;
        self.b.position_at_end(exit);
        Ok(current)
    }
}
