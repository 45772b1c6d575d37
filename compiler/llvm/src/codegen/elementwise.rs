//! The element-wise operators of `dlc_core::scalar` (unary, binary,
//! comparisons, casts, constants), emitted on a scalar or on a vector of
//! lanes alike (a tile's row is a native vector; scalars are tile IR's
//! scalar values). Every emitter takes and gives
//! `BasicValueEnum`s that are all scalars or all vectors of one length.

use dlc_core::DType;
use dlc_core::scalar::{BinaryOp, CmpOp, FormulaBuilder, UnaryOp};
use dlc_runtime::abi::STATUS_DIVISION_BY_ZERO;
use inkwell::types::{BasicTypeEnum, VectorType};
use inkwell::values::{BasicValueEnum as BV, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

use super::{Gen, Ir, scalar_type};
use crate::{CodegenError, R};

pub(crate) fn mismatch(what: &str) -> CodegenError {
    CodegenError::Invalid(format!(
        "{what}: operands are not all scalars or all vectors"
    ))
}

/// `b.$m(x, y)` on two scalars of kind `$scalar` (`FloatValue`,
/// `IntValue`) or two vectors.
macro_rules! lanes2 {
    ($g:expr, $m:ident, $x:expr, $y:expr, $scalar:ident) => {
        match ($x, $y) {
            (BV::$scalar(a), BV::$scalar(b)) => BV::from($g.b.$m(a, b, stringify!($m))?),
            (BV::VectorValue(a), BV::VectorValue(b)) => BV::from($g.b.$m(a, b, stringify!($m))?),
            _ => return Err($crate::codegen::elementwise::mismatch(stringify!($m))),
        }
    };
}

/// `b.$m(x, y)` on two floats or two float vectors.
macro_rules! float2 {
    ($g:expr, $m:ident, $x:expr, $y:expr) => {
        $crate::codegen::elementwise::lanes2!($g, $m, $x, $y, FloatValue)
    };
}

/// `b.$m(x, y)` on two integers or two integer vectors.
macro_rules! int2 {
    ($g:expr, $m:ident, $x:expr, $y:expr) => {
        $crate::codegen::elementwise::lanes2!($g, $m, $x, $y, IntValue)
    };
}

/// `b.$m(x, type)`: a conversion of a scalar of kind `$scalar` or a vector
/// of them to `$t` (a scalar type of kind `$into`, widened to `x`'s lanes).
macro_rules! conversion {
    ($g:expr, $m:ident, $x:expr, $t:expr, $scalar:ident, $into:ident) => {{
        let x = $x;
        match (x, $g.like(x, $t)) {
            (BV::$scalar(a), BasicTypeEnum::$into(t)) => BV::from($g.b.$m(a, t, stringify!($m))?),
            (BV::VectorValue(a), BasicTypeEnum::VectorType(t)) => {
                BV::from($g.b.$m(a, t, stringify!($m))?)
            }
            _ => return Err($crate::codegen::elementwise::mismatch(stringify!($m))),
        }
    }};
}

/// A conversion of a float or float vector (see `conversion!`).
macro_rules! convert {
    ($g:expr, $m:ident, $x:expr, $t:expr, $into:ident) => {
        $crate::codegen::elementwise::conversion!($g, $m, $x, $t, FloatValue, $into)
    };
}

/// A conversion of an integer or integer vector (see `conversion!`).
macro_rules! convert_int {
    ($g:expr, $m:ident, $x:expr, $t:expr, $into:ident) => {
        $crate::codegen::elementwise::conversion!($g, $m, $x, $t, IntValue, $into)
    };
}

pub(crate) use {conversion, convert_int, float2, int2, lanes2};

impl<'ctx, I: Ir> Gen<'ctx, '_, I> {
    /// A vector of `n` elements of scalar type `t`.
    pub(super) fn vector_of(&self, t: BasicTypeEnum<'ctx>, n: u32) -> VectorType<'ctx> {
        match t {
            BasicTypeEnum::FloatType(t) => t.vec_type(n),
            BasicTypeEnum::IntType(t) => t.vec_type(n),
            BasicTypeEnum::PointerType(t) => t.vec_type(n),
            BasicTypeEnum::VectorType(v) => v,
            // Tiles hold numbers and booleans only.
            _ => self.ctx.i8_type().vec_type(n),
        }
    }

    /// `t` with `like`'s lanes: `t` itself for a scalar, a vector of `t` as
    /// long as `like` for a vector.
    pub(super) fn like(&self, like: BV<'ctx>, t: BasicTypeEnum<'ctx>) -> BasicTypeEnum<'ctx> {
        match like {
            BV::VectorValue(v) => self.vector_of(t, v.get_type().get_size()).into(),
            _ => t,
        }
    }

    /// A constant `c` of scalar type `t` with `like`'s lanes (a splat).
    pub(super) fn splat_const(&self, like: BV<'ctx>, c: BV<'ctx>) -> BV<'ctx> {
        match like {
            BV::VectorValue(v) => {
                let n = v.get_type().get_size() as usize;
                VectorType::const_vector(&vec![c; n]).into()
            }
            _ => c,
        }
    }

    /// The float constant `v` of `like`'s element type and lanes.
    pub(super) fn fconst_like(&self, like: BV<'ctx>, v: f64) -> BV<'ctx> {
        let t = element_type(like).into_float_type();
        self.splat_const(like, t.const_float(v).into())
    }

    /// The integer constant `v` of `like`'s element type and lanes.
    pub(super) fn int_const_like(&self, like: BV<'ctx>, v: i64) -> BV<'ctx> {
        let t = element_type(like).into_int_type();
        self.splat_const(like, t.const_int(v as u64, true).into())
    }

    /// The f32 constant `v` with `like`'s lanes.
    pub(super) fn f32_like(&self, like: BV<'ctx>, v: f64) -> BV<'ctx> {
        self.splat_const(like, self.ctx.f32_type().const_float(v).into())
    }

    /// A vector of `n` lanes, each scalar `s`.
    pub(super) fn splat(&self, s: BV<'ctx>, n: u32) -> R<BV<'ctx>> {
        let t = self.vector_of(s.get_type(), n);
        let undef = t.get_poison();
        let zero = self.ctx.i32_type().const_zero();
        let one = self.b.build_insert_element(undef, s, zero, "one")?;
        let mask = VectorType::const_vector(&vec![zero; n as usize]);
        Ok(self
            .b
            .build_shuffle_vector(one, undef, mask, "splat")?
            .into())
    }

    /// `select c, x, y` lane by lane (or on scalars).
    pub(super) fn select(&self, c: BV<'ctx>, x: BV<'ctx>, y: BV<'ctx>) -> R<BV<'ctx>> {
        Ok(match c {
            BV::IntValue(c) => self.b.build_select(c, x, y, "sel")?,
            BV::VectorValue(c) => self.b.build_select(c, x, y, "sel")?,
            _ => return Err(mismatch("select")),
        })
    }

    /// `x & y` on booleans.
    pub(super) fn and(&self, x: BV<'ctx>, y: BV<'ctx>) -> R<BV<'ctx>> {
        Ok(int2!(self, build_and, x, y))
    }

    /// Whether any lane of boolean `c` is set, as an i1.
    pub(super) fn any(&self, c: BV<'ctx>) -> R<IntValue<'ctx>> {
        Ok(match c {
            BV::IntValue(c) => c,
            BV::VectorValue(v) => self
                .call("llvm.vector.reduce.or", &[v.get_type().into()], &[v.into()])?
                .into_int_value(),
            _ => return Err(mismatch("any")),
        })
    }

    /// Whether every lane of mask `c` is on (a scalar).
    pub(super) fn every(&self, c: BV<'ctx>) -> R<IntValue<'ctx>> {
        Ok(match c {
            BV::IntValue(c) => c,
            BV::VectorValue(v) => self
                .call(
                    "llvm.vector.reduce.and",
                    &[v.get_type().into()],
                    &[v.into()],
                )?
                .into_int_value(),
            _ => return Err(mismatch("every")),
        })
    }

    /// Computes `op` on 16-bit floats in f32 and rounds back: LLVM lowers
    /// many operations on half and bfloat to library calls that do not exist.
    fn widened(
        &self,
        x: BV<'ctx>,
        op: impl FnOnce(BV<'ctx>) -> R<BV<'ctx>>,
    ) -> R<Option<BV<'ctx>>> {
        let f32t = self.ctx.f32_type();
        let t = element_type(x);
        if t != self.ctx.f16_type().into() && t != self.ctx.bf16_type().into() {
            return Ok(None);
        }
        let wide = convert!(self, build_float_ext, x, f32t.into(), FloatType);
        let r = op(wide)?;
        Ok(Some(convert!(self, build_float_trunc, r, t, FloatType)))
    }

    pub(super) fn float_unary(&self, u: UnaryOp, x: BV<'ctx>) -> R<BV<'ctx>> {
        if !matches!(u, UnaryOp::Neg | UnaryOp::Relu | UnaryOp::Abs)
            && let Some(v) = self.widened(x, |w| self.float_unary(u, w))?
        {
            return Ok(v);
        }
        if !matches!(
            u,
            UnaryOp::Neg
                | UnaryOp::Relu
                | UnaryOp::Abs
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
                | UnaryOp::Reciprocal
                | UnaryOp::Sign
        ) && let Some(refused) = self.gpu_refuses(u.name(), x)
        {
            return Err(refused);
        }
        if !self.is_f64(x) {
            let own = match u {
                UnaryOp::Sigmoid => self.sigmoid_f32(x)?,
                UnaryOp::Silu => self.silu_f32(x)?,
                _ => None,
            };
            if let Some(v) = own {
                return Ok(v);
            }
        }
        if let Some(e) = u.expansion() {
            return e.build(&mut Expand { g: self, like: x }, &[x, x, x]);
        }
        if let Some(v) = self.gpu_unary(u, x)? {
            return Ok(v);
        }
        let ty = x.get_type();
        let c = |v: f64| self.fconst_like(x, v);
        let intr = |name: &str, v: BV<'ctx>| self.call(name, &[ty], &[v]);
        Ok(match u {
            UnaryOp::Neg => match x {
                BV::FloatValue(a) => self.b.build_float_neg(a, "neg")?.into(),
                BV::VectorValue(a) => self.b.build_float_neg(a, "neg")?.into(),
                _ => return Err(mismatch("neg")),
            },
            UnaryOp::Relu => {
                let neg = self.fcmp(FloatPredicate::OLT, x, c(0.0))?;
                self.select(neg, c(0.0), x)?
            }
            UnaryOp::Exp => self.exp(x)?,
            UnaryOp::Log => intr("llvm.log", x)?,
            UnaryOp::Sqrt => intr("llvm.sqrt", x)?,
            UnaryOp::Tanh => self.tanh(x)?,
            UnaryOp::Abs => intr("llvm.fabs", x)?,
            UnaryOp::Floor => intr("llvm.floor", x)?,
            UnaryOp::Ceil => intr("llvm.ceil", x)?,
            UnaryOp::Round => intr("llvm.roundeven", x)?,
            UnaryOp::Sin => intr("llvm.sin", x)?,
            UnaryOp::Cos => intr("llvm.cos", x)?,
            UnaryOp::Erf if self.is_f64(x) => self.libm("erf", x)?,
            UnaryOp::Erf => self.erf_f32(x)?,
            UnaryOp::Rsqrt
            | UnaryOp::Sigmoid
            | UnaryOp::Gelu
            | UnaryOp::Sign
            | UnaryOp::Reciprocal
            | UnaryOp::Silu => unreachable!("{} is a composite", u.name()),
        })
    }

    fn is_f64(&self, x: BV<'ctx>) -> bool {
        element_type(x) == self.ctx.f64_type().into()
    }

    /// `e^x`: the vectorizable polynomial in f32, the C library's in f64.
    fn exp(&self, x: BV<'ctx>) -> R<BV<'ctx>> {
        if self.is_f64(x) {
            self.call("llvm.exp", &[x.get_type()], &[x])
        } else {
            self.exp_f32(x)
        }
    }

    /// `tanh x`: the vectorizable polynomial in f32, the C library's in f64.
    fn tanh(&self, x: BV<'ctx>) -> R<BV<'ctx>> {
        if self.is_f64(x) {
            self.call("llvm.tanh", &[x.get_type()], &[x])
        } else {
            self.tanh_f32(x)
        }
    }

    /// The C library's double function `name` (`erf`), lane by lane on a
    /// vector.
    fn libm(&self, name: &str, x: BV<'ctx>) -> R<BV<'ctx>> {
        let f64t = self.ctx.f64_type();
        let f = self.module.get_function(name).unwrap_or_else(|| {
            self.module
                .add_function(name, f64t.fn_type(&[f64t.into()], false), None)
        });
        let one = |v: BV<'ctx>| -> R<BV<'ctx>> {
            self.b
                .build_call(f, &[v.into()], name)?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| CodegenError::Llvm(format!("{name} gives no value")))
        };
        match x {
            BV::VectorValue(v) => {
                let mut out = v.get_type().get_poison();
                for lane in 0..v.get_type().get_size() {
                    let i = self.ctx.i32_type().const_int(u64::from(lane), false);
                    let e = self.b.build_extract_element(v, i, "lane")?;
                    let r = one(e)?;
                    out = self.b.build_insert_element(out, r, i, "lane")?;
                }
                Ok(out.into())
            }
            other => one(other),
        }
    }

    pub(super) fn int_unary(&self, u: UnaryOp, x: BV<'ctx>, unsigned: bool) -> R<BV<'ctx>> {
        let t = x.get_type();
        let zero = t.const_zero();
        Ok(match u {
            // Unsigned values are their own magnitude.
            UnaryOp::Relu | UnaryOp::Abs if unsigned => x,
            UnaryOp::Sign if unsigned => {
                let nonzero = self.icmp(IntPredicate::NE, x, zero)?;
                convert_int!(self, build_int_z_extend, nonzero, element_type(x), IntType)
            }
            UnaryOp::Neg => int2!(self, build_int_sub, zero, x),
            UnaryOp::Relu => self.call("llvm.smax", &[t], &[x, zero])?,
            UnaryOp::Sign => {
                let one = self.int_const_like(x, 1);
                let minus = self.int_const_like(x, -1);
                let low = self.call("llvm.smin", &[t], &[x, one])?;
                self.call("llvm.smax", &[t], &[low, minus])?
            }
            UnaryOp::Abs => self.call(
                "llvm.abs",
                &[t],
                &[x, self.ctx.bool_type().const_zero().into()],
            )?,
            other => {
                return Err(CodegenError::Invalid(format!(
                    "{} on integers",
                    other.name()
                )));
            }
        })
    }

    /// `max`/`min` on the CPU as the interpreter defines them: `x` where it
    /// is NaN or the greater (lesser), else `y` (so a NaN on either side
    /// propagates). A compare and select x86 does in one `vmaxps`/`vminps`
    /// (`x > y ? x : y`), and a NaN test of `x`: three instructions a
    /// vector where `llvm.maximum`, which also orders -0 below +0, took six
    /// (ReLU6's clip was half of a 1 x 1 convolution's epilogue).
    /// Against a constant `y` that is no NaN (a clip's bound), "`x` is NaN
    /// or the greater" is one unordered compare: ReLU6's upper clip was
    /// four instructions a vector (the NaN test of `x` and the ordered
    /// compare, or-ed, and the blend), now two.
    fn choose(&self, op: BinaryOp, x: BV<'ctx>, y: BV<'ctx>) -> R<BV<'ctx>> {
        if never_nan(y) {
            let wins = if op == BinaryOp::Max {
                FloatPredicate::UGT
            } else {
                FloatPredicate::ULT
            };
            return self.select(self.fcmp(wins, x, y)?, x, y);
        }
        let wins = if op == BinaryOp::Max {
            FloatPredicate::OGT
        } else {
            FloatPredicate::OLT
        };
        let chosen = self.select(self.fcmp(wins, x, y)?, x, y)?;
        self.select(self.fcmp(FloatPredicate::UNO, x, x)?, x, chosen)
    }

    pub(super) fn float_binary(&self, op: BinaryOp, x: BV<'ctx>, y: BV<'ctx>) -> R<BV<'ctx>> {
        let narrow = [self.ctx.f16_type().into(), self.ctx.bf16_type().into()];
        if matches!(op, BinaryOp::Max | BinaryOp::Min | BinaryOp::Pow)
            && narrow.contains(&element_type(x))
        {
            let yw = convert!(
                self,
                build_float_ext,
                y,
                self.ctx.f32_type().into(),
                FloatType
            );
            if let Some(v) = self.widened(x, |xw| self.float_binary(op, xw, yw))? {
                return Ok(v);
            }
        }
        let ty = x.get_type();
        Ok(match op {
            BinaryOp::Add => self.relaxed(float2!(self, build_float_add, x, y))?,
            BinaryOp::Sub => self.relaxed(float2!(self, build_float_sub, x, y))?,
            BinaryOp::Mul => self.relaxed(float2!(self, build_float_mul, x, y))?,
            BinaryOp::Div => float2!(self, build_float_div, x, y),
            BinaryOp::Max | BinaryOp::Min if self.gpu.is_none() => self.choose(op, x, y)?,
            BinaryOp::Max => self.call("llvm.maximum", &[ty], &[x, y])?,
            BinaryOp::Min => self.call("llvm.minimum", &[ty], &[x, y])?,
            BinaryOp::Pow => {
                if let Some(refused) = self.gpu_refuses("pow", x) {
                    return Err(refused);
                }
                match self.gpu_pow(x, y)? {
                    Some(v) => v,
                    None => self.call("llvm.pow", &[ty], &[x, y])?,
                }
            }
            bitwise => {
                return Err(CodegenError::Invalid(format!(
                    "{} on floats",
                    bitwise.name()
                )));
            }
        })
    }

    /// Integer arithmetic: wrapping, and floor division that fails with
    /// status 1 on a zero divisor (in any lane) and wraps on `MIN / -1`, as
    /// the interpreters do.
    pub(super) fn int_binary(
        &self,
        op: BinaryOp,
        x: BV<'ctx>,
        y: BV<'ctx>,
        unsigned: bool,
    ) -> R<BV<'ctx>> {
        let t = x.get_type();
        Ok(match op {
            BinaryOp::Add => int2!(self, build_int_add, x, y),
            BinaryOp::Sub => int2!(self, build_int_sub, x, y),
            BinaryOp::Mul => int2!(self, build_int_mul, x, y),
            BinaryOp::Max if unsigned => self.call("llvm.umax", &[t], &[x, y])?,
            BinaryOp::Min if unsigned => self.call("llvm.umin", &[t], &[x, y])?,
            BinaryOp::Max => self.call("llvm.smax", &[t], &[x, y])?,
            BinaryOp::Min => self.call("llvm.smin", &[t], &[x, y])?,
            BinaryOp::Div => {
                let zero = t.const_zero();
                let ones = int_all_ones(t);
                let divzero = self.icmp(IntPredicate::EQ, y, zero)?;
                let ok = self.ctx.append_basic_block(self.func, "div.ok");
                let fail = self.fail_block(STATUS_DIVISION_BY_ZERO)?;
                self.b
                    .build_conditional_branch(self.any(divzero)?, fail, ok)?;
                self.b.position_at_end(ok);
                if unsigned {
                    // Floor division is truncating division here.
                    return Ok(int2!(self, build_int_unsigned_div, x, y));
                }
                let minus_one = self.icmp(IntPredicate::EQ, y, ones)?;
                let one = int2!(self, build_int_sub, zero, ones);
                let safe = self.select(minus_one, one, y)?;
                let q = int2!(self, build_int_signed_div, x, safe);
                let r = int2!(self, build_int_signed_rem, x, safe);
                let inexact = self.icmp(IntPredicate::NE, r, zero)?;
                let signs = int2!(self, build_xor, r, safe);
                let differ = self.icmp(IntPredicate::SLT, signs, zero)?;
                let adjust = self.and(inexact, differ)?;
                let adjust =
                    convert_int!(self, build_int_z_extend, adjust, element_type(x), IntType);
                let floored = int2!(self, build_int_sub, q, adjust);
                let negated = int2!(self, build_int_sub, zero, x);
                self.select(minus_one, negated, floored)?
            }
            BinaryOp::Pow => return Err(CodegenError::Invalid("pow on integers".into())),
            BinaryOp::BitAnd => int2!(self, build_and, x, y),
            BinaryOp::BitOr => int2!(self, build_or, x, y),
            BinaryOp::BitXor => int2!(self, build_xor, x, y),
            BinaryOp::Shl | BinaryOp::Shr => {
                // LLVM's shifts are poison at or past the width; the
                // interpreters' meaning is every bit shifted out.
                let width = element_type(x).into_int_type().get_bit_width();
                let w = self.int_const_like(x, i64::from(width));
                let past = self.icmp(IntPredicate::UGE, y, w)?;
                let zero = t.const_zero();
                if op == BinaryOp::Shl {
                    let v = int2!(self, build_left_shift, x, y);
                    self.select(past, zero, v)?
                } else if unsigned {
                    let v = self.shift_right(x, y, false)?;
                    self.select(past, zero, v)?
                } else {
                    let last = self.int_const_like(x, i64::from(width) - 1);
                    let s = self.call("llvm.umin", &[t], &[y, last])?;
                    self.shift_right(x, s, true)?
                }
            }
        })
    }

    /// `x >> y`, filling with the sign bit when `arithmetic`.
    fn shift_right(&self, x: BV<'ctx>, y: BV<'ctx>, arithmetic: bool) -> R<BV<'ctx>> {
        Ok(match (x, y) {
            (BV::IntValue(a), BV::IntValue(b)) => {
                self.b.build_right_shift(a, b, arithmetic, "shr")?.into()
            }
            (BV::VectorValue(a), BV::VectorValue(b)) => {
                self.b.build_right_shift(a, b, arithmetic, "shr")?.into()
            }
            _ => return Err(mismatch("shr")),
        })
    }

    pub(super) fn fcmp(&self, p: FloatPredicate, x: BV<'ctx>, y: BV<'ctx>) -> R<BV<'ctx>> {
        Ok(match (x, y) {
            (BV::FloatValue(a), BV::FloatValue(b)) => {
                self.b.build_float_compare(p, a, b, "cmp")?.into()
            }
            (BV::VectorValue(a), BV::VectorValue(b)) => {
                self.b.build_float_compare(p, a, b, "cmp")?.into()
            }
            _ => return Err(mismatch("fcmp")),
        })
    }

    pub(super) fn icmp(&self, p: IntPredicate, x: BV<'ctx>, y: BV<'ctx>) -> R<BV<'ctx>> {
        Ok(match (x, y) {
            (BV::IntValue(a), BV::IntValue(b)) => self.b.build_int_compare(p, a, b, "cmp")?.into(),
            (BV::VectorValue(a), BV::VectorValue(b)) => {
                self.b.build_int_compare(p, a, b, "cmp")?.into()
            }
            _ => return Err(mismatch("icmp")),
        })
    }

    pub(super) fn compare(&self, c: CmpOp, x: BV<'ctx>, y: BV<'ctx>, d: DType) -> R<BV<'ctx>> {
        if d.is_float() {
            let p = match c {
                CmpOp::Lt => FloatPredicate::OLT,
                CmpOp::Le => FloatPredicate::OLE,
                CmpOp::Gt => FloatPredicate::OGT,
                CmpOp::Ge => FloatPredicate::OGE,
                CmpOp::Eq => FloatPredicate::OEQ,
                CmpOp::Ne => FloatPredicate::UNE,
            };
            return self.fcmp(p, x, y);
        }
        let unsigned = d == DType::Bool || d.is_unsigned();
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
        self.icmp(p, x, y)
    }

    /// The element-wise operator `from` -> `to` of the interpreters:
    /// floats to ints saturate, anything to bool is `!= 0`.
    pub(super) fn cast(&self, x: BV<'ctx>, from: DType, to: DType) -> R<BV<'ctx>> {
        let target = scalar_type(self.ctx, to);
        let f32t: BasicTypeEnum<'ctx> = self.ctx.f32_type().into();
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
                    let wide = convert!(self, build_float_cast, x, f32t, FloatType);
                    convert!(self, build_float_cast, wide, target, FloatType)
                }
                (true, false, _, true) => {
                    let z = x.get_type().const_zero();
                    self.fcmp(FloatPredicate::UNE, x, z)?
                }
                (true, false, ..) => {
                    let i64t = self.like(x, self.ctx.i64_type().into());
                    let sat = self.call("llvm.fptosi.sat", &[i64t, x.get_type()], &[x])?;
                    if to == DType::U64 {
                        // Above zero saturating to u64's range, so values
                        // past i64::MAX keep their magnitude.
                        let usat = self.call("llvm.fptoui.sat", &[i64t, x.get_type()], &[x])?;
                        let z = x.get_type().const_zero();
                        let neg = self.fcmp(FloatPredicate::OLT, x, z)?;
                        self.select(neg, sat, usat)?
                    } else if to.size_bytes() == 8 {
                        sat
                    } else {
                        convert_int!(self, build_int_truncate, sat, target, IntType)
                    }
                }
                (false, true, true, _) => {
                    convert_int!(self, build_unsigned_int_to_float, x, target, FloatType)
                }
                (false, true, ..) if from.is_unsigned() => {
                    convert_int!(self, build_unsigned_int_to_float, x, target, FloatType)
                }
                (false, true, ..) => {
                    convert_int!(self, build_signed_int_to_float, x, target, FloatType)
                }
                (false, false, _, true) => {
                    let z = x.get_type().const_zero();
                    self.icmp(IntPredicate::NE, x, z)?
                }
                (false, false, true, _) => {
                    convert_int!(self, build_int_z_extend, x, target, IntType)
                }
                (false, false, ..) => {
                    if from.size_bytes() == to.size_bytes() {
                        // Other signedness, the same bits.
                        x
                    } else if from.size_bytes() > to.size_bytes() {
                        convert_int!(self, build_int_truncate, x, target, IntType)
                    } else if from.is_unsigned() {
                        convert_int!(self, build_int_z_extend, x, target, IntType)
                    } else {
                        convert_int!(self, build_int_s_extend, x, target, IntType)
                    }
                }
            },
        )
    }

    /// The scalar constant `v` of `d`.
    pub(super) fn constant(&self, v: f64, d: DType) -> BV<'ctx> {
        match scalar_type(self.ctx, d) {
            BasicTypeEnum::FloatType(t) => t.const_float(v).into(),
            BasicTypeEnum::IntType(t) if d == DType::Bool => {
                t.const_int(u64::from(v != 0.0), false).into()
            }
            BasicTypeEnum::IntType(t) => t.const_int(d.signless(v) as u64, true).into(),
            other => other.const_zero(),
        }
    }

    /// Unary operator `u` on elements of `d`.
    pub(super) fn unary(&self, u: UnaryOp, x: BV<'ctx>, d: DType) -> R<BV<'ctx>> {
        if d.is_float() {
            self.float_unary(u, x)
        } else {
            self.int_unary(u, x, d.is_unsigned())
        }
    }

    /// Binary operator `op` on elements of `d`.
    pub(super) fn binary(&self, op: BinaryOp, x: BV<'ctx>, y: BV<'ctx>, d: DType) -> R<BV<'ctx>> {
        if d.is_float() {
            self.float_binary(op, x, y)
        } else {
            self.int_binary(op, x, y, d.is_unsigned())
        }
    }
}

/// The element type of a scalar or vector value.
pub(super) fn element_type(x: BV<'_>) -> BasicTypeEnum<'_> {
    match x {
        BV::VectorValue(v) => v.get_type().get_element_type(),
        other => other.get_type(),
    }
}

/// Builds a composite function's [`UnaryOp::expansion`] on floats shaped
/// like `like`: arithmetic exactly as written (without the reassociation
/// `float_binary` allows user arithmetic), as the interpreters evaluate it.
struct Expand<'g, 'ctx, 'm, I: Ir> {
    g: &'g Gen<'ctx, 'm, I>,
    like: BV<'ctx>,
}

impl<'ctx, I: Ir> FormulaBuilder for Expand<'_, 'ctx, '_, I> {
    type Value = BV<'ctx>;
    type Error = CodegenError;

    fn constant(&mut self, c: f64) -> R<BV<'ctx>> {
        Ok(self.g.fconst_like(self.like, c))
    }

    fn unary(&mut self, u: UnaryOp, a: BV<'ctx>) -> R<BV<'ctx>> {
        self.g.float_unary(u, a)
    }

    fn binary(&mut self, op: BinaryOp, x: BV<'ctx>, y: BV<'ctx>) -> R<BV<'ctx>> {
        let g = self.g;
        Ok(match op {
            BinaryOp::Add => float2!(g, build_float_add, x, y),
            BinaryOp::Sub => float2!(g, build_float_sub, x, y),
            BinaryOp::Mul => float2!(g, build_float_mul, x, y),
            BinaryOp::Div => float2!(g, build_float_div, x, y),
            other => g.float_binary(other, x, y)?,
        })
    }

    fn select(
        &mut self,
        cmp: CmpOp,
        a: BV<'ctx>,
        b: BV<'ctx>,
        t: BV<'ctx>,
        e: BV<'ctx>,
    ) -> R<BV<'ctx>> {
        // Any float type: `compare` reads only that the operands are floats.
        let c = self.g.compare(cmp, a, b, DType::F32)?;
        self.g.select(c, t, e)
    }

    /// Nothing is folded: an expansion's constants are its own.
    fn as_const(&self, _: &BV<'ctx>) -> Option<f64> {
        None
    }
}

/// All ones (-1) of an integer or integer vector type.
fn int_all_ones(t: BasicTypeEnum<'_>) -> BV<'_> {
    match t {
        BasicTypeEnum::VectorType(v) => {
            let one = v.get_element_type().into_int_type().const_all_ones();
            VectorType::const_vector(&vec![one; v.get_size() as usize]).into()
        }
        other => other.into_int_type().const_all_ones().into(),
    }
}

/// Whether `v` is a float constant (or a vector of them) none of whose
/// lanes is a NaN; anything else (computed, loaded) may be.
fn never_nan(v: BV<'_>) -> bool {
    use inkwell::values::AsValueRef;
    use llvm_sys::core::{
        LLVMConstRealGetDouble, LLVMGetAggregateElement, LLVMIsAConstant, LLVMIsAConstantFP,
    };
    use llvm_sys::prelude::LLVMValueRef;
    // SAFETY: each call takes a value of the live context `v` belongs to;
    // `LLVMGetAggregateElement` answers null for what it cannot split, and
    // `LLVMConstRealGetDouble` is called only on a `ConstantFP`.
    unsafe {
        let number = |c: LLVMValueRef| {
            if c.is_null() || LLVMIsAConstantFP(c).is_null() {
                return false;
            }
            let mut lossy = 0;
            !LLVMConstRealGetDouble(c, &mut lossy).is_nan()
        };
        match v {
            BV::FloatValue(f) => number(f.as_value_ref()),
            BV::VectorValue(f) => {
                let c = f.as_value_ref();
                !LLVMIsAConstant(c).is_null()
                    && (0..f.get_type().get_size()).all(|i| number(LLVMGetAggregateElement(c, i)))
            }
            _ => false,
        }
    }
}
