//! Loop IR to LLVM IR: functions, loops, loads and stores, scalar
//! arithmetic ([`math`] for the transcendental functions), parallel loops
//! outlined onto the OpenMP runtime ([`parallel`]) and the packed
//! register-tiled product ([`matmul`]).

use std::collections::HashMap;

use crate::{CodegenError, R};
use dlc_core::DType;
use dlc_core::scalar::{BinaryOp, CmpOp, UnaryOp};
use dlc_loop::{Block, Function, IndexExpr, OpKind, Type, Value};
use dlc_runtime::abi::{STATUS_DIVISION_BY_ZERO, STATUS_OUT_OF_MEMORY, Site};
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicMetadataTypeEnum, BasicTypeEnum};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};

mod math;
mod matmul;
mod parallel;

pub(crate) struct Gen<'ctx, 'f> {
    ctx: &'ctx Context,
    module: &'f Module<'ctx>,
    b: Builder<'ctx>,
    f: &'f Function,
    func: FunctionValue<'ctx>,
    vals: HashMap<Value, BasicValueEnum<'ctx>>,
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

impl<'ctx, 'f> Gen<'ctx, 'f> {
    pub(crate) fn function(
        ctx: &'ctx Context,
        module: &'f Module<'ctx>,
        f: &'f Function,
        symbol: &str,
        sites: &Sites,
    ) -> R<FunctionValue<'ctx>> {
        let ptr = ctx.ptr_type(AddressSpace::default());
        let params: Vec<BasicMetadataTypeEnum<'_>> = f.params.iter().map(|_| ptr.into()).collect();
        let func = module.add_function(
            symbol,
            ctx.i32_type().fn_type(&params, false),
            Some(Linkage::External),
        );
        let entry = ctx.append_basic_block(func, "entry");
        let b = ctx.create_builder();
        b.position_at_end(entry);
        let mut g = Gen {
            ctx,
            module,
            b,
            f,
            func,
            vals: HashMap::new(),
            sites: sites.clone(),
            fail_blocks: Default::default(),
            trap: None,
            loc: None,
            status_slot: None,
        };
        for (i, (_, v)) in f.params.iter().enumerate() {
            let p = func
                .get_nth_param(i as u32)
                .ok_or_else(|| CodegenError::Invalid("missing parameter".into()))?;
            g.vals.insert(*v, p);
        }
        g.block(&f.body)?;
        Ok(func)
    }

    /// The block that leaves the function with a failure of `kind` at the
    /// op being generated (its source place numbered among the function's
    /// sites).
    fn fail_block(&self, kind: i32) -> R<BasicBlock<'ctx>> {
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

    fn get(&self, v: Value) -> R<BasicValueEnum<'ctx>> {
        self.vals.get(&v).copied().ok_or_else(|| {
            CodegenError::Invalid(format!("value {} used before it is defined", v.0))
        })
    }

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

    fn call(
        &self,
        name: &str,
        types: &[BasicTypeEnum<'ctx>],
        args: &[BasicValueEnum<'ctx>],
    ) -> R<BasicValueEnum<'ctx>> {
        let decl = Intrinsic::find(name)
            .and_then(|i| i.get_declaration(self.module, types))
            .ok_or_else(|| CodegenError::Llvm(format!("no intrinsic {name}")))?;
        let args: Vec<BasicMetadataValueEnum<'ctx>> = args.iter().map(|a| (*a).into()).collect();
        self.b
            .build_call(decl, &args, "call")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::Llvm(format!("{name} gives no value")))
    }

    /// Computes `op` on a 16-bit float in f32 and rounds back: LLVM lowers
    /// many operations on half and bfloat to library calls that do not exist.
    fn widened(
        &self,
        x: FloatValue<'ctx>,
        op: impl FnOnce(FloatValue<'ctx>) -> R<FloatValue<'ctx>>,
    ) -> R<Option<FloatValue<'ctx>>> {
        let f32t = self.ctx.f32_type();
        if x.get_type() == f32t {
            return Ok(None);
        }
        let wide = self.b.build_float_ext(x, f32t, "wide")?;
        let r = op(wide)?;
        Ok(Some(self.b.build_float_trunc(r, x.get_type(), "narrow")?))
    }

    fn float_unary(&self, u: UnaryOp, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        if !matches!(u, UnaryOp::Neg | UnaryOp::Relu | UnaryOp::Abs)
            && let Some(v) = self.widened(x, |w| self.float_unary(u, w))?
        {
            return Ok(v);
        }
        let t = x.get_type();
        let ty: BasicTypeEnum<'ctx> = t.into();
        let one = t.const_float(1.0);
        let intr = |name: &str, v: FloatValue<'ctx>| -> R<FloatValue<'ctx>> {
            Ok(self.call(name, &[ty], &[v.into()])?.into_float_value())
        };
        Ok(match u {
            UnaryOp::Neg => self.b.build_float_neg(x, "neg")?,
            UnaryOp::Relu => {
                let neg =
                    self.b
                        .build_float_compare(FloatPredicate::OLT, x, t.const_zero(), "isneg")?;
                self.b
                    .build_select(neg, t.const_zero(), x, "relu")?
                    .into_float_value()
            }
            UnaryOp::Exp if t == self.ctx.f32_type() => self.exp_f32(x)?,
            UnaryOp::Exp => intr("llvm.exp", x)?,
            UnaryOp::Log => intr("llvm.log", x)?,
            UnaryOp::Sqrt => intr("llvm.sqrt", x)?,
            UnaryOp::Rsqrt => {
                let s = intr("llvm.sqrt", x)?;
                self.b.build_float_div(one, s, "rsqrt")?
            }
            UnaryOp::Tanh => self.tanh_f32(x)?,
            UnaryOp::Sigmoid => {
                let n = self.b.build_float_neg(x, "negx")?;
                let e = self.exp_f32(n)?;
                let d = self.b.build_float_add(one, e, "den")?;
                self.b.build_float_div(one, d, "sigmoid")?
            }
            UnaryOp::Gelu => {
                let c = t.const_float((2.0 / std::f64::consts::PI).sqrt());
                let x3 = self
                    .b
                    .build_float_mul(self.b.build_float_mul(x, x, "x2")?, x, "x3")?;
                let inner = self.b.build_float_add(
                    x,
                    self.b.build_float_mul(t.const_float(0.044715), x3, "cx3")?,
                    "inner",
                )?;
                let th = self.tanh_f32(self.b.build_float_mul(c, inner, "arg")?)?;
                let half_x = self.b.build_float_mul(t.const_float(0.5), x, "halfx")?;
                self.b
                    .build_float_mul(half_x, self.b.build_float_add(one, th, "onep")?, "gelu")?
            }
            UnaryOp::Abs => intr("llvm.fabs", x)?,
        })
    }

    fn int_unary(&self, u: UnaryOp, x: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let t = x.get_type();
        Ok(match u {
            UnaryOp::Neg => self.b.build_int_neg(x, "neg")?,
            UnaryOp::Relu => self
                .call("llvm.smax", &[t.into()], &[x.into(), t.const_zero().into()])?
                .into_int_value(),
            UnaryOp::Abs => self
                .call(
                    "llvm.abs",
                    &[t.into()],
                    &[x.into(), self.ctx.bool_type().const_zero().into()],
                )?
                .into_int_value(),
            other => {
                return Err(CodegenError::Invalid(format!(
                    "{} on integers",
                    other.name()
                )));
            }
        })
    }

    fn float_binary(
        &self,
        op: BinaryOp,
        x: FloatValue<'ctx>,
        y: FloatValue<'ctx>,
    ) -> R<FloatValue<'ctx>> {
        if matches!(op, BinaryOp::Max | BinaryOp::Min | BinaryOp::Pow)
            && x.get_type() != self.ctx.f32_type()
        {
            let yw = self.b.build_float_ext(y, self.ctx.f32_type(), "widey")?;
            if let Some(v) = self.widened(x, |xw| self.float_binary(op, xw, yw))? {
                return Ok(v);
            }
        }
        let ty: BasicTypeEnum<'ctx> = x.get_type().into();
        Ok(match op {
            BinaryOp::Add => self.relaxed(self.b.build_float_add(x, y, "add")?)?,
            BinaryOp::Sub => self.relaxed(self.b.build_float_sub(x, y, "sub")?)?,
            BinaryOp::Mul => self.relaxed(self.b.build_float_mul(x, y, "mul")?)?,
            BinaryOp::Div => self.b.build_float_div(x, y, "div")?,
            BinaryOp::Max => self
                .call("llvm.maximum", &[ty], &[x.into(), y.into()])?
                .into_float_value(),
            BinaryOp::Min => self
                .call("llvm.minimum", &[ty], &[x.into(), y.into()])?
                .into_float_value(),
            BinaryOp::Pow => self
                .call("llvm.pow", &[ty], &[x.into(), y.into()])?
                .into_float_value(),
        })
    }

    /// Integer arithmetic: wrapping, and floor division that fails (status
    /// 1) on a zero divisor and wraps on `MIN / -1`, as the interpreters do.
    fn int_binary(&self, op: BinaryOp, x: IntValue<'ctx>, y: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let t = x.get_type();
        Ok(match op {
            BinaryOp::Add => self.b.build_int_add(x, y, "add")?,
            BinaryOp::Sub => self.b.build_int_sub(x, y, "sub")?,
            BinaryOp::Mul => self.b.build_int_mul(x, y, "mul")?,
            BinaryOp::Max => self
                .call("llvm.smax", &[t.into()], &[x.into(), y.into()])?
                .into_int_value(),
            BinaryOp::Min => self
                .call("llvm.smin", &[t.into()], &[x.into(), y.into()])?
                .into_int_value(),
            BinaryOp::Div => {
                let zero =
                    self.b
                        .build_int_compare(IntPredicate::EQ, y, t.const_zero(), "divzero")?;
                let ok = self.ctx.append_basic_block(self.func, "div.ok");
                let fail = self.fail_block(STATUS_DIVISION_BY_ZERO)?;
                self.b.build_conditional_branch(zero, fail, ok)?;
                self.b.position_at_end(ok);
                let minus_one = self.b.build_int_compare(
                    IntPredicate::EQ,
                    y,
                    t.const_all_ones(),
                    "byminus1",
                )?;
                let safe = self
                    .b
                    .build_select(minus_one, t.const_int(1, false), y, "safe")?
                    .into_int_value();
                let q = self.b.build_int_signed_div(x, safe, "q")?;
                let r = self.b.build_int_signed_rem(x, safe, "r")?;
                let inexact =
                    self.b
                        .build_int_compare(IntPredicate::NE, r, t.const_zero(), "inexact")?;
                let signs = self.b.build_xor(r, safe, "signs")?;
                let differ =
                    self.b
                        .build_int_compare(IntPredicate::SLT, signs, t.const_zero(), "differ")?;
                let adjust = self.b.build_and(inexact, differ, "adjust")?;
                let floored = self.b.build_int_sub(
                    q,
                    self.b.build_int_z_extend(adjust, t, "one")?,
                    "floor",
                )?;
                let negated = self.b.build_int_neg(x, "negx")?;
                self.b
                    .build_select(minus_one, negated, floored, "div")?
                    .into_int_value()
            }
            BinaryOp::Pow => return Err(CodegenError::Invalid("pow on integers".into())),
        })
    }

    fn compare(
        &self,
        c: CmpOp,
        x: BasicValueEnum<'ctx>,
        y: BasicValueEnum<'ctx>,
        d: DType,
    ) -> R<IntValue<'ctx>> {
        if d.is_float() {
            let p = match c {
                CmpOp::Lt => FloatPredicate::OLT,
                CmpOp::Le => FloatPredicate::OLE,
                CmpOp::Gt => FloatPredicate::OGT,
                CmpOp::Ge => FloatPredicate::OGE,
                CmpOp::Eq => FloatPredicate::OEQ,
                CmpOp::Ne => FloatPredicate::UNE,
            };
            return Ok(self.b.build_float_compare(
                p,
                x.into_float_value(),
                y.into_float_value(),
                "cmp",
            )?);
        }
        let unsigned = d == DType::Bool;
        let p = match (c, unsigned) {
            (CmpOp::Lt, false) => IntPredicate::SLT,
            (CmpOp::Le, false) => IntPredicate::SLE,
            (CmpOp::Gt, false) => IntPredicate::SGT,
            (CmpOp::Ge, false) => IntPredicate::SGE,
            (CmpOp::Lt, true) => IntPredicate::ULT,
            (CmpOp::Le, true) => IntPredicate::ULE,
            (CmpOp::Gt, true) => IntPredicate::UGT,
            (CmpOp::Ge, true) => IntPredicate::UGE,
            (CmpOp::Eq, _) => IntPredicate::EQ,
            (CmpOp::Ne, _) => IntPredicate::NE,
        };
        Ok(self
            .b
            .build_int_compare(p, x.into_int_value(), y.into_int_value(), "cmp")?)
    }

    fn cast(&self, x: BasicValueEnum<'ctx>, from: DType, to: DType) -> R<BasicValueEnum<'ctx>> {
        let target = scalar_type(self.ctx, to);
        Ok(
            match (
                from.is_float(),
                to.is_float(),
                from == DType::Bool,
                to == DType::Bool,
            ) {
                _ if from == to => x,
                (true, true, ..) => {
                    // f16 <-> bf16 go through f32; LLVM has no direct cast.
                    let wide = self.b.build_float_cast(
                        x.into_float_value(),
                        self.ctx.f32_type(),
                        "wide",
                    )?;
                    self.b
                        .build_float_cast(wide, target.into_float_type(), "fcast")?
                        .into()
                }
                (true, false, _, true) => {
                    let z = x.into_float_value().get_type().const_zero();
                    self.b
                        .build_float_compare(
                            FloatPredicate::UNE,
                            x.into_float_value(),
                            z,
                            "tobool",
                        )?
                        .into()
                }
                (true, false, ..) => {
                    let i64t = self.ctx.i64_type();
                    let sat = self
                        .call("llvm.fptosi.sat", &[i64t.into(), x.get_type()], &[x])?
                        .into_int_value();
                    self.b
                        .build_int_truncate_or_bit_cast(sat, target.into_int_type(), "toint")?
                        .into()
                }
                (false, true, true, _) => self
                    .b
                    .build_unsigned_int_to_float(
                        x.into_int_value(),
                        target.into_float_type(),
                        "fromb",
                    )?
                    .into(),
                (false, true, ..) => self
                    .b
                    .build_signed_int_to_float(
                        x.into_int_value(),
                        target.into_float_type(),
                        "fromi",
                    )?
                    .into(),
                (false, false, _, true) => {
                    let z = x.into_int_value().get_type().const_zero();
                    self.b
                        .build_int_compare(IntPredicate::NE, x.into_int_value(), z, "tobool")?
                        .into()
                }
                (false, false, true, _) => self
                    .b
                    .build_int_z_extend(x.into_int_value(), target.into_int_type(), "zext")?
                    .into(),
                (false, false, ..) => self
                    .b
                    .build_int_cast_sign_flag(
                        x.into_int_value(),
                        target.into_int_type(),
                        true,
                        "icast",
                    )?
                    .into(),
            },
        )
    }

    fn constant(&self, v: f64, d: DType) -> BasicValueEnum<'ctx> {
        match scalar_type(self.ctx, d) {
            BasicTypeEnum::FloatType(t) => t.const_float(v).into(),
            BasicTypeEnum::IntType(t) if d == DType::Bool => {
                t.const_int(u64::from(v != 0.0), false).into()
            }
            BasicTypeEnum::IntType(t) => t.const_int(v as i64 as u64, true).into(),
            other => other.const_zero(),
        }
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
                    let v: BasicValueEnum<'ctx> = if self.dtype(operand(0)?).is_float() {
                        self.float_unary(*u, x.into_float_value())?.into()
                    } else {
                        self.int_unary(*u, x.into_int_value())?.into()
                    };
                    self.scalar_result(op, v);
                }
                OpKind::Binary(bop) => {
                    let (x, y) = (self.get(operand(0)?)?, self.get(operand(1)?)?);
                    let v: BasicValueEnum<'ctx> = if self.dtype(operand(0)?).is_float() {
                        self.float_binary(*bop, x.into_float_value(), y.into_float_value())?
                            .into()
                    } else {
                        self.int_binary(*bop, x.into_int_value(), y.into_int_value())?
                            .into()
                    };
                    self.scalar_result(op, v);
                }
                OpKind::Compare(c) => {
                    let (x, y) = (self.get(operand(0)?)?, self.get(operand(1)?)?);
                    let v = self.compare(*c, x, y, self.dtype(operand(0)?))?;
                    self.scalar_result(op, v.into());
                }
                OpKind::Select => {
                    let c = self.get(operand(0)?)?.into_int_value();
                    let (x, y) = (self.get(operand(1)?)?, self.get(operand(2)?)?);
                    let v = self.b.build_select(c, x, y, "sel")?;
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
