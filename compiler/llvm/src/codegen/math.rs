//! `exp` and `tanh` on f32 as straight-line code (Cephes' polynomials), so
//! loops that call them vectorize: a call to libm's `expf`/`tanhf` keeps a
//! loop scalar, and LLVM's vector-library mappings stop at 8 lanes and have
//! no `tanh`. Both are within a few ulp of the correctly rounded result.

use inkwell::FloatPredicate;
use inkwell::values::{BasicValue, FloatValue};

use super::{CodegenError, Gen, R};

/// Largest x with exp(x) finite in f32.
const EXP_HI: f64 = 88.722_831_726_074_22;
/// Below this, exp(x) is subnormal or zero in f32: computed as 0.
const EXP_LO: f64 = -87.336_544_750_553_1;

impl<'ctx> Gen<'ctx, '_> {
    fn fconst(&self, v: f64) -> FloatValue<'ctx> {
        self.ctx.f32_type().const_float(v)
    }

    /// `a * b + c`, contractible to an FMA.
    fn mul_add(
        &self,
        a: FloatValue<'ctx>,
        b: FloatValue<'ctx>,
        c: FloatValue<'ctx>,
    ) -> R<FloatValue<'ctx>> {
        let m = self.relaxed(self.b.build_float_mul(a, b, "m")?)?;
        self.relaxed(self.b.build_float_add(m, c, "ma")?)
    }

    /// Evaluates the polynomial with coefficients `cs` (highest degree first)
    /// at `x` by Horner's rule.
    fn horner(&self, x: FloatValue<'ctx>, cs: &[f64]) -> R<FloatValue<'ctx>> {
        let mut p = self.fconst(cs[0]);
        for &c in &cs[1..] {
            p = self.mul_add(p, x, self.fconst(c))?;
        }
        Ok(p)
    }

    /// exp(x) for f32: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a
    /// degree-7 polynomial, times 2^n built in the exponent bits.
    pub(super) fn exp_f32(&self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let (f32t, i32t) = (self.ctx.f32_type(), self.ctx.i32_type());
        let xc = self.clamp(x, EXP_LO, EXP_HI)?;
        let n = self
            .b
            .build_float_mul(xc, self.fconst(std::f64::consts::LOG2_E), "xlog2e")?;
        let n = self
            .call("llvm.roundeven", &[f32t.into()], &[n.into()])?
            .into_float_value();
        // ln 2 in two parts, so n * hi is exact.
        let r = self.mul_add(n, self.fconst(-0.693_359_375), xc)?;
        let r = self.mul_add(n, self.fconst(2.121_944_400_546_905_8e-4), r)?;
        let p = self.horner(
            r,
            &[
                1.987_569_150_0e-4,
                1.398_199_950_7e-3,
                8.333_451_907_3e-3,
                4.166_579_589_4e-2,
                1.666_666_545_9e-1,
                5.000_000_120_1e-1,
            ],
        )?;
        let r2 = self.b.build_float_mul(r, r, "r2")?;
        let y = self.mul_add(p, r2, r)?;
        let y = self.b.build_float_add(y, self.fconst(1.0), "y")?;
        let ni = self.b.build_float_to_signed_int(n, i32t, "n")?;
        let bits = self.b.build_left_shift(
            self.b
                .build_int_add(ni, i32t.const_int(127, false), "biased")?,
            i32t.const_int(23, false),
            "bits",
        )?;
        let scale = self
            .b
            .build_bit_cast(bits, f32t, "scale")?
            .into_float_value();
        let v = self.b.build_float_mul(y, scale, "exp")?;
        // Above the range: inf; below: 0; NaN stays NaN.
        let over =
            self.b
                .build_float_compare(FloatPredicate::OGT, x, self.fconst(EXP_HI), "over")?;
        let under =
            self.b
                .build_float_compare(FloatPredicate::OLT, x, self.fconst(EXP_LO), "under")?;
        let nan = self
            .b
            .build_float_compare(FloatPredicate::UNO, x, x, "nan")?;
        let v = self
            .b
            .build_select(over, self.fconst(f64::INFINITY), v, "v")?
            .into_float_value();
        let v = self
            .b
            .build_select(under, self.fconst(0.0), v, "v")?
            .into_float_value();
        Ok(self.b.build_select(nan, x, v, "exp")?.into_float_value())
    }

    /// tanh(x) for f32: an odd polynomial below |x| = 0.625, else
    /// 1 - 2 / (exp(2|x|) + 1) with x's sign.
    pub(super) fn tanh_f32(&self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let f32t = self.ctx.f32_type();
        let ax = self
            .call("llvm.fabs", &[f32t.into()], &[x.into()])?
            .into_float_value();
        let z = self.b.build_float_mul(x, x, "z")?;
        let p = self.horner(
            z,
            &[
                -5.704_988_727_45e-3,
                2.063_908_879_54e-2,
                -5.373_971_555_31e-2,
                1.333_144_220_36e-1,
                -3.333_328_194_22e-1,
            ],
        )?;
        let small = self.mul_add(self.b.build_float_mul(p, z, "pz")?, x, x)?;
        // exp(2|x|) overflows to inf for large |x|, giving exactly 1.
        let e = self.exp_f32(self.b.build_float_mul(ax, self.fconst(2.0), "2ax")?)?;
        let den = self.b.build_float_add(e, self.fconst(1.0), "den")?;
        let q = self.b.build_float_div(self.fconst(2.0), den, "q")?;
        let large = self.b.build_float_sub(self.fconst(1.0), q, "large")?;
        let large = self
            .call("llvm.copysign", &[f32t.into()], &[large.into(), x.into()])?
            .into_float_value();
        let is_small =
            self.b
                .build_float_compare(FloatPredicate::OLT, ax, self.fconst(0.625), "small")?;
        // NaN fails the comparison and takes the large path, which keeps it.
        Ok(self
            .b
            .build_select(is_small, small, large, "tanh")?
            .into_float_value())
    }

    /// `x` limited to `[lo, hi]` (NaN passes through as some value; callers
    /// select NaN back in).
    fn clamp(&self, x: FloatValue<'ctx>, lo: f64, hi: f64) -> R<FloatValue<'ctx>> {
        let f32t = self.ctx.f32_type();
        let v = self
            .call(
                "llvm.maxnum",
                &[f32t.into()],
                &[x.into(), self.fconst(lo).into()],
            )?
            .into_float_value();
        Ok(self
            .call(
                "llvm.minnum",
                &[f32t.into()],
                &[v.into(), self.fconst(hi).into()],
            )?
            .into_float_value())
    }

    /// Marks a float add, subtract or multiply as reassociable and
    /// contractible, so reductions over it vectorize and multiply-adds fuse.
    pub(super) fn relaxed(&self, v: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        use inkwell::values::FastMathFlags;
        if let Some(i) = v.as_instruction_value() {
            i.set_fast_math_flags(FastMathFlags::AllowReassoc | FastMathFlags::AllowContract)
                .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        }
        Ok(v)
    }
}
