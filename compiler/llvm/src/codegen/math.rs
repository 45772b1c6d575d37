//! `exp` and `tanh` on f32 (scalars or vectors) as straight-line code (Cephes' polynomials), so
//! loops that call them vectorize: a call to libm's `expf`/`tanhf` keeps a
//! loop scalar, and LLVM's vector-library mappings stop at 8 lanes and have
//! no `tanh`. Both are within a few ulp of the correctly rounded result.
//! Sigmoid and SiLU, composites, are built here too where `exp` would make
//! 2^n in two factors: their exp needs no subnormal or infinite results.

use inkwell::FloatPredicate;
use inkwell::values::{BasicValue, BasicValueEnum as BV};

use super::elementwise::float2;
use super::{CodegenError, Gen, Ir, R};

/// exp(x) is infinite in f32 above this (it is finite up to 88.72).
const EXP_HI: f64 = 89.0;
/// exp(x) is zero in f32 below this (subnormal from -87.34).
const EXP_LO: f64 = -104.0;
/// The range `sigmoid_f32` and `silu_f32` clamp x to: n = round(-x log2 e)
/// is then within [-126, 128], so 2^n is one factor built in exponent
/// bits, a normal f32 (at x = 87, exp(-x) is 2^-126 and 1 + exp(-x) is 1 in
/// f32) or, for n = 128 (x below -88.38), infinity's bits, an infinite
/// denominator.
const SIGMOID_X_LO: f64 = -89.0;
const SIGMOID_X_HI: f64 = 87.0;
/// 1.5 * 2^23: a float of magnitude below 2^22 added to it rounds to an
/// integer n, held in the sum's low mantissa bits.
const ROUNDER: f64 = 12_582_912.0;

impl<'ctx, I: Ir> Gen<'ctx, '_, I> {
    /// `a * b + c`, contractible to an FMA.
    fn mul_add(&self, a: BV<'ctx>, b: BV<'ctx>, c: BV<'ctx>) -> R<BV<'ctx>> {
        let m = self.relaxed(float2!(self, build_float_mul, a, b))?;
        self.relaxed(float2!(self, build_float_add, m, c))
    }

    /// Evaluates the polynomial with coefficients `cs` (highest degree first)
    /// at `x` by Horner's rule.
    fn horner(&self, x: BV<'ctx>, cs: &[f64]) -> R<BV<'ctx>> {
        let mut p = self.f32_like(x, cs[0]);
        for &c in &cs[1..] {
            p = self.mul_add(p, x, self.f32_like(x, c))?;
        }
        Ok(p)
    }

    /// exp(x) for f32 (or f32 lanes): x = n ln2 + r with |r| <= ln2 / 2,
    /// exp(r) by a degree-7 polynomial, times 2^n. x is first clamped to
    /// [-104, 89], beyond which exp is 0 or inf in f32, and 2^n is applied
    /// so that the product rounds to a subnormal, zero or infinity as the
    /// exact one would: on a vector of AVX-512's 16 lanes by `vscalefps`,
    /// elsewhere as two factors 2^(n/2) and 2^(n - n/2) built in the
    /// exponent bits (one factor would not reach 2^128: exp(88.5), finite,
    /// came out infinite that way). NaN stays NaN.
    ///
    /// n = round(x log2 e) comes from adding and subtracting 1.5 * 2^23
    /// (`ROUNDER`), whose sum's low mantissa bits are n itself: no
    /// `roundeven` and no float-to-integer conversion, which is poison on
    /// NaN and so needed a select of NaN back in. Where the clamp keeps NaN
    /// (x86) it flows through as NaN and no select is made.
    pub(super) fn exp_f32(&self, x: BV<'ctx>) -> R<BV<'ctx>> {
        let xc = self.clamp(x, EXP_LO, EXP_HI)?;
        let (t, n, r) = self.exp_range(xc, false)?;
        let y = self.exp_reduced(r)?;
        if self.scalef(x) {
            let all = self.ctx.i16_type().const_all_ones();
            // _MM_FROUND_CUR_DIRECTION: the current rounding mode.
            let rounding = self.ctx.i32_type().const_int(4, false);
            // NaN went through the clamp (x86's keeps it) and the
            // polynomial, and `vscalefps` keeps it.
            return self.call(
                "llvm.x86.avx512.mask.scalef.ps.512",
                &[],
                &[y, n, y, all.into(), rounding.into()],
            );
        }
        let i32t = self.ctx.i32_type();
        let int_ty = self.like(x, i32t.into());
        let i32c = |v: u64| self.splat_const(x, i32t.const_int(v, false).into());
        let t_bits = self.b.build_bit_cast(t, int_ty, "t_bits")?;
        // n + 127, the biased exponent of 2^n: t's bits are ROUNDER's plus n.
        let rounder_bits = u64::from((ROUNDER as f32).to_bits());
        let ni = super::elementwise::int2!(self, build_int_sub, t_bits, i32c(rounder_bits));
        let half = super::elementwise::int2!(self, build_int_signed_div, ni, i32c(2));
        let rest = super::elementwise::int2!(self, build_int_sub, ni, half);
        let mut v = y;
        for e in [half, rest] {
            let biased = super::elementwise::int2!(self, build_int_add, e, i32c(127));
            let bits = super::elementwise::int2!(self, build_left_shift, biased, i32c(23));
            let scale = self
                .b
                .build_bit_cast(bits, x.get_type(), "scale")?
                .as_basic_value_enum();
            v = float2!(self, build_float_mul, v, scale);
        }
        if self.clamp_keeps_nan() {
            // NaN went through as NaN: NaN times any scale is NaN.
            return Ok(v);
        }
        let nan = self.fcmp(FloatPredicate::UNO, x, x)?;
        self.select(nan, x, v)
    }

    /// Whether `exp_f32` scales `x` by `vscalefps` (a vector of 16 f32
    /// lanes: a CPU of 512-bit vectors, which among the targets only
    /// x86-64 with AVX-512 is).
    fn scalef(&self, x: BV<'ctx>) -> bool {
        self.gpu.is_none()
            && self.lanes == 16
            && x.is_vector_value()
            && x.into_vector_value().get_type().get_size() == 16
    }

    /// The range reduction of exp(x), or of exp(-x) where `negated`: n =
    /// round(±x log2 e) and r = ±x - n ln 2, with t = ±x log2 e + ROUNDER,
    /// whose low mantissa bits hold n. t is one `llvm.fmuladd` where the
    /// target has multiply-adds (rounded once, and never reassociated, as a
    /// `relaxed` add could be with the subtraction of `ROUNDER` that
    /// follows, which would lose the rounding); ln 2 is in two parts, so n
    /// times the first is exact, and -x is never formed: the first part's
    /// product minus x contracts to one negated multiply-subtract.
    fn exp_range(&self, x: BV<'ctx>, negated: bool) -> R<(BV<'ctx>, BV<'ctx>, BV<'ctx>)> {
        let c = |v: f64| self.f32_like(x, v);
        let log2e = std::f64::consts::LOG2_E;
        let t = self.call(
            "llvm.fmuladd",
            &[x.get_type()],
            &[x, c(if negated { -log2e } else { log2e }), c(ROUNDER)],
        )?;
        let n = float2!(self, build_float_sub, t, c(ROUNDER));
        let m = self.relaxed(float2!(self, build_float_mul, n, c(-0.693_359_375)))?;
        let r = if negated {
            self.relaxed(float2!(self, build_float_sub, m, x))?
        } else {
            self.relaxed(float2!(self, build_float_add, m, x))?
        };
        let r = self.mul_add(n, c(2.121_944_400_546_905_8e-4), r)?;
        Ok((t, n, r))
    }

    /// exp(r) for |r| <= ln 2 / 2: 1 + r + r^2 (c0 + c1 r + ... + c5 r^5),
    /// the inner polynomial by Estrin's scheme, (c0 + c1 r) + r^2 (c2 + c3
    /// r) + r^4 (c4 + c5 r), and 1 + r added beside it: three multiply-adds
    /// deep after r^2 instead of Horner's five and an add, for exp is
    /// latency-bound where a vector's chain is long.
    fn exp_reduced(&self, r: BV<'ctx>) -> R<BV<'ctx>> {
        let c = |v: f64| self.f32_like(r, v);
        let r2 = float2!(self, build_float_mul, r, r);
        let p01 = self.mul_add(c(1.666_666_545_9e-1), r, c(5.000_000_120_1e-1))?;
        let p23 = self.mul_add(c(8.333_451_907_3e-3), r, c(4.166_579_589_4e-2))?;
        let p45 = self.mul_add(c(1.987_569_150_0e-4), r, c(1.398_199_950_7e-3))?;
        let high = self.mul_add(p45, r2, p23)?;
        let p = self.mul_add(high, r2, p01)?;
        let one_plus_r = float2!(self, build_float_add, r, c(1.0));
        self.mul_add(p, r2, one_plus_r)
    }

    /// sigmoid(x) = 1 / (1 + exp(-x)) for f32 (or f32 lanes), as its
    /// expansion writes it, with `one_plus_exp_neg`'s denominator: above
    /// x = 87 sigmoid is 1 in f32 either way, and below -88.38 it is 0
    /// where the exact value is a subnormal (at most 3.8e-39) or zero.
    /// `None` where `exp_f32` scales by `vscalefps` (AVX-512) or on a GPU.
    pub(super) fn sigmoid_f32(&self, x: BV<'ctx>) -> R<Option<BV<'ctx>>> {
        let Some(den) = self.one_plus_exp_neg(x)? else {
            return Ok(None);
        };
        Ok(Some(float2!(
            self,
            build_float_div,
            self.f32_like(x, 1.0),
            den
        )))
    }

    /// silu(x) = x / (1 + exp(-x)) for f32 (or f32 lanes), with
    /// `one_plus_exp_neg`'s denominator: one division where the expansion's
    /// x * sigmoid(x) is a division and a product. Below x = -88.38 the
    /// denominator is infinite and silu is -0, where the exact value is at
    /// most 4e-37 in magnitude (PyTorch's is -0 from -88.72); NaN at -inf as
    /// the expansion's. `None` where `sigmoid_f32` is.
    pub(super) fn silu_f32(&self, x: BV<'ctx>) -> R<Option<BV<'ctx>>> {
        let Some(den) = self.one_plus_exp_neg(x)? else {
            return Ok(None);
        };
        Ok(Some(float2!(self, build_float_div, x, den)))
    }

    /// 1 + exp(-x) on x clamped to [`SIGMOID_X_LO`, `SIGMOID_X_HI`], for
    /// sigmoid and SiLU, whose chains are long (an epilogue's SiLU was a
    /// fifth of EfficientNet-B0's expansions): n = round(-x log2 e) by one
    /// multiply-add, r = -x - n ln 2 without negating x, 2^n one factor
    /// from the rounded sum's bits shifted into the exponent (infinity's
    /// bits at n = 128), and 1 + exp(r) 2^n one multiply-add. `None` on
    /// AVX-512 (`vscalefps` makes exp's 2^n there) and GPUs.
    fn one_plus_exp_neg(&self, x: BV<'ctx>) -> R<Option<BV<'ctx>>> {
        if self.gpu.is_some() || self.scalef(x) {
            return Ok(None);
        }
        let c = |v: f64| self.f32_like(x, v);
        let xc = self.clamp(x, SIGMOID_X_LO, SIGMOID_X_HI)?;
        let (t, _, r) = self.exp_range(xc, true)?;
        let y = self.exp_reduced(r)?;
        // t's bits are ROUNDER's plus n, and ROUNDER's shifted by 23 are 0:
        // (n + 127) << 23, 2^n's bits, is t's bits shifted plus 127 << 23.
        let i32t = self.ctx.i32_type();
        let int_ty = self.like(x, i32t.into());
        let i32c = |v: u64| self.splat_const(x, i32t.const_int(v, false).into());
        let t_bits = self.b.build_bit_cast(t, int_ty, "t_bits")?;
        let shifted = super::elementwise::int2!(self, build_left_shift, t_bits, i32c(23));
        let bits = super::elementwise::int2!(self, build_int_add, shifted, i32c(127 << 23));
        let scale = self
            .b
            .build_bit_cast(bits, x.get_type(), "scale")?
            .as_basic_value_enum();
        let den = self.mul_add(y, scale, c(1.0))?;
        if self.clamp_keeps_nan() {
            return Ok(Some(den));
        }
        // The clamp made NaN a number: NaN's denominator is NaN.
        let nan = self.fcmp(FloatPredicate::UNO, x, x)?;
        Ok(Some(self.select(nan, x, den)?))
    }

    /// tanh(x) for f32 (or f32 lanes): an odd polynomial below |x| = 0.625,
    /// else 1 - 2 / (exp(2|x|) + 1) with x's sign.
    pub(super) fn tanh_f32(&self, x: BV<'ctx>) -> R<BV<'ctx>> {
        let c = |v: f64| self.f32_like(x, v);
        let ax = self.call("llvm.fabs", &[x.get_type()], &[x])?;
        let z = float2!(self, build_float_mul, x, x);
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
        let pz = float2!(self, build_float_mul, p, z);
        let small = self.mul_add(pz, x, x)?;
        // exp(2|x|) overflows to inf for large |x|, giving exactly 1.
        let e = self.exp_f32(float2!(self, build_float_mul, ax, c(2.0)))?;
        let den = float2!(self, build_float_add, e, c(1.0));
        let q = float2!(self, build_float_div, c(2.0), den);
        let large = float2!(self, build_float_sub, c(1.0), q);
        let large = self.call("llvm.copysign", &[x.get_type()], &[large, x])?;
        let is_small = self.fcmp(FloatPredicate::OLT, ax, c(0.625))?;
        // NaN fails the comparison and takes the large path, which keeps it.
        self.select(is_small, small, large)
    }

    /// erf(x) for f32 (or f32 lanes): x times an odd rational function of
    /// x², on x clamped to [-4, 4] (erf is 1 to f32 precision beyond), with
    /// Eigen's coefficients (`generic_fast_erf_float`); NaN stays NaN.
    pub(super) fn erf_f32(&self, x: BV<'ctx>) -> R<BV<'ctx>> {
        let xc = self.clamp(x, -4.0, 4.0)?;
        let x2 = float2!(self, build_float_mul, xc, xc);
        let p = self.horner(
            x2,
            &[
                -2.726_142_258_013_06e-10,
                2.770_681_424_959_02e-8,
                -2.101_024_020_825_08e-6,
                -5.692_506_394_623_46e-5,
                -7.349_906_303_268_55e-4,
                -2.954_599_808_540_25e-3,
                -1.609_603_332_624_15e-2,
            ],
        )?;
        let q = self.horner(
            x2,
            &[
                -1.456_607_184_649_96e-5,
                -2.133_740_552_789_05e-4,
                -1.682_826_974_382_03e-3,
                -7.373_329_167_204_68e-3,
                -1.426_473_905_141_89e-2,
            ],
        )?;
        let px = float2!(self, build_float_mul, xc, p);
        let v = float2!(self, build_float_div, px, q);
        if self.clamp_keeps_nan() {
            return Ok(v);
        }
        let nan = self.fcmp(FloatPredicate::UNO, x, x)?;
        self.select(nan, x, v)
    }

    /// Whether [`Gen::clamp`] keeps NaN (else callers select it back in).
    fn clamp_keeps_nan(&self) -> bool {
        self.gpu.is_none()
            && self
                .module
                .get_triple()
                .as_str()
                .to_bytes()
                .starts_with(b"x86_64")
    }

    /// `x` limited to `[lo, hi]`. On x86 each bound is a compare and a
    /// select that NaN fails, one `vmaxps` or `vminps` (whose operand order
    /// keeps NaN), where `maxnum`/`minnum` (which must turn NaN into the
    /// bound) take three instructions each; elsewhere (one instruction on
    /// a GPU or an Arm CPU) `maxnum`/`minnum`, and NaN comes out a number.
    fn clamp(&self, x: BV<'ctx>, lo: f64, hi: f64) -> R<BV<'ctx>> {
        let (lo, hi) = (self.f32_like(x, lo), self.f32_like(x, hi));
        if !self.clamp_keeps_nan() {
            let v = self.call("llvm.maxnum", &[x.get_type()], &[x, lo])?;
            return self.call("llvm.minnum", &[x.get_type()], &[v, hi]);
        }
        let below = self.fcmp(FloatPredicate::OLT, x, lo)?;
        let v = self.select(below, lo, x)?;
        let above = self.fcmp(FloatPredicate::OGT, v, hi)?;
        self.select(above, hi, v)
    }

    /// Marks a float add, subtract or multiply as reassociable and
    /// contractible, so reductions over it vectorize and multiply-adds fuse.
    pub(super) fn relaxed(&self, v: BV<'ctx>) -> R<BV<'ctx>> {
        use inkwell::values::FastMathFlags;
        if let Some(i) = v.as_instruction_value() {
            i.set_fast_math_flags(FastMathFlags::AllowReassoc | FastMathFlags::AllowContract)
                .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        }
        Ok(v)
    }
}
