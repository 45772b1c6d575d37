//! Loop IR to LLVM IR: functions, loops, loads and stores, scalar
//! arithmetic ([`math`] for the transcendental functions), parallel loops
//! outlined onto the OpenMP runtime ([`parallel`]) and the packed
//! register-tiled product ([`matmul`]).

use std::collections::HashMap;

use crate::{CodegenError, R};
use dlc_core::DType;
use dlc_loop::{Block, Function, IndexExpr, OpKind, Type, Value};
use dlc_runtime::abi::{STATUS_OUT_OF_MEMORY, Site};
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
mod math;
mod matmul;
mod parallel;
pub(crate) mod tile;

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
    /// Emits it as the C-ABI function `symbol`, its failures numbered
    /// among `sites`.
    fn emit<'ctx>(
        ctx: &'ctx Context,
        module: &Module<'ctx>,
        f: &Self::Function,
        symbol: &str,
        sites: &Sites,
    ) -> R<FunctionValue<'ctx>>;
}

/// Loop IR (`dlc_loop`).
pub(crate) struct LoopIr;

impl Ir for LoopIr {
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
        symbol: &str,
        sites: &Sites,
    ) -> R<FunctionValue<'ctx>> {
        let params: Vec<Value> = f.params.iter().map(|(_, v)| *v).collect();
        let mut g = Gen::exported(ctx, module, f, &params, symbol, sites)?;
        g.block(&f.body)?;
        Ok(g.func)
    }
}

pub(crate) struct Gen<'ctx, 'f, I: Ir = LoopIr> {
    ctx: &'ctx Context,
    module: &'f Module<'ctx>,
    b: Builder<'ctx>,
    f: &'f I::Function,
    func: FunctionValue<'ctx>,
    vals: HashMap<I::Value, BasicValueEnum<'ctx>>,
    /// Tile IR only: each tile value's vectors (see [`tile`]).
    chunks: HashMap<I::Value, Vec<BasicValueEnum<'ctx>>>,
    /// The failure sites of the exported function being generated (its
    /// outlined bodies share them).
    sites: Sites,
    /// This LLVM function's block leaving with each status.
    fail_blocks: std::cell::RefCell<HashMap<i32, BasicBlock<'ctx>>>,
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
    /// back on every way out (see `tile::Workspace`).
    workspace: Option<(PointerValue<'ctx>, PointerValue<'ctx>)>,
}

/// The places where an exported function can fail, in the order their
/// statuses number them: status `kind | (k + 1) << 8` is a failure of kind
/// `kind` at site `k` (see `dlc_runtime::abi`).
pub(crate) type Sites = std::rc::Rc<std::cell::RefCell<Vec<Site>>>;

fn storage_type(ctx: &Context, d: DType) -> BasicTypeEnum<'_> {
    match d {
        DType::F32 => ctx.f32_type().into(),
        DType::F16 => ctx.f16_type().into(),
        DType::BF16 => ctx.bf16_type().into(),
        DType::I32 => ctx.i32_type().into(),
        DType::I64 => ctx.i64_type().into(),
        DType::Bool => ctx.i8_type().into(),
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
            sites: sites.clone(),
            fail_blocks: Default::default(),
            trap: None,
            loc: None,
            status_slot: None,
            kernels: HashMap::new(),
            workspace: None,
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
        let ptr = ctx.ptr_type(AddressSpace::default());
        let types: Vec<BasicMetadataTypeEnum<'_>> = params.iter().map(|_| ptr.into()).collect();
        let func = module.add_function(
            symbol,
            ctx.i32_type().fn_type(&types, false),
            Some(Linkage::External),
        );
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
        let status = kind
            | i32::try_from(site)
                .ok()
                .filter(|s| *s < 1 << 23)
                .unwrap_or(0)
                << 8;
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

impl<'ctx, 'f> Gen<'ctx, 'f> {
    fn dtype(&self, v: Value) -> DType {
        match self.f.ty(v) {
            Type::Scalar(d) => *d,
            Type::Buffer(b) => b.dtype,
            Type::Index => DType::I64,
        }
    }

    fn index(&self, e: &IndexExpr) -> R<IntValue<'ctx>> {
        let i64t = self.ctx.i64_type();
        let mut acc = i64t.const_int(e.constant as u64, true);
        for (c, v) in &e.terms {
            let iv = self.get(*v)?.into_int_value();
            let term = self
                .b
                .build_int_mul(iv, i64t.const_int(*c as u64, true), "term")?;
            acc = self.b.build_int_add(acc, term, "idx")?;
        }
        Ok(acc)
    }

    /// The element pointer of `buf[index]`, and (when `checked`) whether the
    /// index is in bounds; an out-of-bounds index is replaced by offset 0.
    fn address(
        &self,
        buf: Value,
        index: &[IndexExpr],
        checked: bool,
    ) -> R<(PointerValue<'ctx>, Option<IntValue<'ctx>>)> {
        let Type::Buffer(t) = self.f.ty(buf) else {
            return Err(CodegenError::Invalid("load from a non-buffer".into()));
        };
        let i64t = self.ctx.i64_type();
        let mut offset = i64t.const_zero();
        let mut inside: Option<IntValue<'ctx>> = None;
        for ((e, &d), &s) in index.iter().zip(&t.shape).zip(&t.strides) {
            let i = self.index(e)?;
            if checked {
                let ok = self.b.build_int_compare(
                    IntPredicate::ULT,
                    i,
                    i64t.const_int(d as u64, false),
                    "inb",
                )?;
                inside = Some(match inside {
                    None => ok,
                    Some(prev) => self.b.build_and(prev, ok, "inb")?,
                });
            }
            let scaled = self
                .b
                .build_int_mul(i, i64t.const_int(s as u64, false), "off")?;
            offset = self.b.build_int_add(offset, scaled, "off")?;
        }
        if let Some(ok) = inside {
            offset = self
                .b
                .build_select(ok, offset, i64t.const_zero(), "safe")?
                .into_int_value();
        }
        let base = self.get(buf)?.into_pointer_value();
        // SAFETY (LLVM IR semantics): the offset is within the buffer's storage:
        // checked above, or guaranteed by the lowering for unpadded accesses.
        let p = unsafe {
            self.b
                .build_in_bounds_gep(storage_type(self.ctx, t.dtype), base, &[offset], "elt")?
        };
        Ok((p, inside))
    }

    fn scalar_result(&mut self, op: &dlc_loop::OpData, v: BasicValueEnum<'ctx>) {
        if let Some(r) = op.results.first() {
            self.vals.insert(*r, v);
        }
    }

    /// Emits a block; returns the values its `loop.yield` passes on.
    fn block(&mut self, blk: &Block) -> R<Vec<BasicValueEnum<'ctx>>> {
        for &id in &blk.ops {
            let op = self.f.op(id);
            self.loc.clone_from(&op.loc);
            let operand = |k: usize| {
                op.operands.get(k).copied().ok_or_else(|| {
                    CodegenError::Invalid(format!("{} lacks operand {k}", op.kind.name()))
                })
            };
            match &op.kind {
                OpKind::Alloc => {
                    let Type::Buffer(t) = self.f.ty(op.results[0]) else {
                        return Err(CodegenError::Invalid("alloc of a non-buffer".into()));
                    };
                    let bytes = t
                        .storage_len()
                        .unwrap_or(usize::MAX)
                        .saturating_mul(t.dtype.size_bytes())
                        .max(1);
                    let i64t = self.ctx.i64_type();
                    let ptr = self.ctx.ptr_type(AddressSpace::default());
                    let malloc = self.module.get_function("malloc").unwrap_or_else(|| {
                        self.module.add_function(
                            "malloc",
                            ptr.fn_type(&[i64t.into()], false),
                            Some(Linkage::External),
                        )
                    });
                    let p = self
                        .b
                        .build_call(malloc, &[i64t.const_int(bytes as u64, false).into()], "buf")?
                        .try_as_basic_value()
                        .basic()
                        .ok_or_else(|| CodegenError::Llvm("malloc gives no value".into()))?;
                    let null = self.b.build_is_null(p.into_pointer_value(), "isnull")?;
                    let ok = self.ctx.append_basic_block(self.func, "alloc.ok");
                    let fail = self.fail_block(STATUS_OUT_OF_MEMORY)?;
                    self.b.build_conditional_branch(null, fail, ok)?;
                    self.b.position_at_end(ok);
                    self.scalar_result(op, p);
                }
                OpKind::Dealloc => {
                    let ptr = self.ctx.ptr_type(AddressSpace::default());
                    let free = self.module.get_function("free").unwrap_or_else(|| {
                        self.module.add_function(
                            "free",
                            self.ctx.void_type().fn_type(&[ptr.into()], false),
                            Some(Linkage::External),
                        )
                    });
                    let p = self.get(operand(0)?)?;
                    self.b.build_call(free, &[p.into()], "")?;
                }
                OpKind::View => {
                    let p = self.get(operand(0)?)?;
                    self.scalar_result(op, p);
                }
                OpKind::Const(v) => {
                    let c = self.constant(*v, self.dtype(op.results[0]));
                    self.scalar_result(op, c);
                }
                OpKind::Unary(u) => {
                    let x = self.get(operand(0)?)?;
                    let v = self.unary(*u, x, self.dtype(operand(0)?))?;
                    self.scalar_result(op, v);
                }
                OpKind::Binary(bop) => {
                    let (x, y) = (self.get(operand(0)?)?, self.get(operand(1)?)?);
                    let v = self.binary(*bop, x, y, self.dtype(operand(0)?))?;
                    self.scalar_result(op, v);
                }
                OpKind::Compare(c) => {
                    let (x, y) = (self.get(operand(0)?)?, self.get(operand(1)?)?);
                    let v = self.compare(*c, x, y, self.dtype(operand(0)?))?;
                    self.scalar_result(op, v);
                }
                OpKind::Select => {
                    let c = self.get(operand(0)?)?;
                    let (x, y) = (self.get(operand(1)?)?, self.get(operand(2)?)?);
                    let v = self.select(c, x, y)?;
                    self.scalar_result(op, v);
                }
                OpKind::Cast => {
                    let x = self.get(operand(0)?)?;
                    let v = self.cast(x, self.dtype(operand(0)?), self.dtype(op.results[0]))?;
                    self.scalar_result(op, v);
                }
                OpKind::Load { index, pad } => {
                    let buf = operand(0)?;
                    let d = self.dtype(buf);
                    let (p, inside) = self.address(buf, index, pad.is_some())?;
                    let raw = self.b.build_load(storage_type(self.ctx, d), p, "ld")?;
                    let mut v = if d == DType::Bool {
                        let z = self.ctx.i8_type().const_zero();
                        self.b
                            .build_int_compare(IntPredicate::NE, raw.into_int_value(), z, "b")?
                            .into()
                    } else {
                        raw
                    };
                    if let (Some(pad), Some(ok)) = (pad, inside) {
                        v = self
                            .b
                            .build_select(ok, v, self.constant(*pad, d), "padded")?;
                    }
                    self.scalar_result(op, v);
                }
                OpKind::Store { index } => {
                    let (val, buf) = (operand(0)?, operand(1)?);
                    let d = self.dtype(buf);
                    let (p, _) = self.address(buf, index, false)?;
                    let mut v = self.get(val)?;
                    if d == DType::Bool {
                        v = self
                            .b
                            .build_int_z_extend(v.into_int_value(), self.ctx.i8_type(), "byte")?
                            .into();
                    }
                    self.b.build_store(p, v)?;
                }
                OpKind::For { lo, hi, step } => {
                    let results = self.emit_loop(op, *lo, *hi, *step)?;
                    for (r, v) in op.results.iter().zip(results) {
                        self.vals.insert(*r, v);
                    }
                }
                OpKind::Parallel { lo, hi } => {
                    // Not mapped onto threads (convert-loop-to-tile does
                    // that): iterations run in order.
                    self.emit_loop(op, *lo, *hi, 1)?;
                }
                OpKind::Threads { lo, hi } => self.threads(id, *lo, *hi)?,
                OpKind::Matmul(_) => self.matmul(id)?,
                OpKind::Yield => {
                    return op.operands.iter().map(|v| self.get(*v)).collect();
                }
                OpKind::Return => {
                    self.b
                        .build_return(Some(&self.ctx.i32_type().const_zero()))?;
                }
            }
        }
        Ok(vec![])
    }

    /// A loop op's counted loop: the body region gets the index and the
    /// carried values; returns their final values.
    fn emit_loop(
        &mut self,
        op: &dlc_loop::OpData,
        lo: i64,
        hi: i64,
        step: i64,
    ) -> R<Vec<BasicValueEnum<'ctx>>> {
        let i64t = self.ctx.i64_type();
        let body = &op.regions[0];
        let inits = op
            .operands
            .iter()
            .map(|v| self.get(*v))
            .collect::<R<Vec<_>>>()?;
        self.counted_carrying(
            i64t.const_int(lo as u64, true),
            i64t.const_int(hi as u64, true),
            step,
            &inits,
            |g, i, carried| {
                g.vals.insert(body.args[0], i.into());
                for (a, v) in body.args[1..].iter().zip(carried) {
                    g.vals.insert(*a, *v);
                }
                g.block(body)
            },
        )
    }
}
