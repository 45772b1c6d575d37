//! `loop.matmul`: packed operands and a register-tiled micro-kernel, the
//! blocking taken from the host's target description.

use dlc_loop::{IndexExpr, OpId, OpKind, Type, Value};
use inkwell::module::Linkage;
use inkwell::values::{BasicValue, BasicValueEnum, FunctionValue, IntValue, PointerValue};
use inkwell::{AddressSpace, IntPredicate};

use super::Gen;
use super::parallel::free_values;
use crate::{CodegenError, R};

/// The packed product's blocking, in BLIS's names: the host's
/// `TargetDesc::gemm_blocking` for f32 (6, 32, 72, 256 and 16 lanes with
/// AVX-512), so no constant of the kernel is written here.
#[derive(Clone, Copy)]
struct Blocking {
    /// Rows of the micro-kernel's register tile.
    mr: u64,
    /// Lanes of one vector.
    lanes: u64,
    /// Columns of the register tile (whole vectors).
    nr: u64,
    /// Rows of the left operand packed at once (a multiple of `mr`).
    mc: u64,
    /// Depth of the packed blocks.
    kc: u64,
    /// A parallel `loop.matmul` is cut into at least this many units of
    /// work (when it has that many column strips), so threads are balanced.
    units: u64,
}

fn blocking() -> Blocking {
    let g = dlc_core::TargetDesc::host().gemm_blocking(dlc_core::DType::F32);
    Blocking {
        mr: g.mr as u64,
        lanes: g.lanes as u64,
        nr: g.nr as u64,
        mc: g.mc as u64,
        kc: g.kc as u64,
        units: g.min_units as u64,
    }
}

/// `(coefficient of each of `vars`, the rest)` of a buffer offset:
/// `sum_d stride_d * index_d`.
fn split_offset(strides: &[usize], index: &[IndexExpr], vars: &[Value]) -> (Vec<i64>, IndexExpr) {
    let mut coeffs = vec![0i64; vars.len()];
    let mut rest = IndexExpr::default();
    for (e, &s) in index.iter().zip(strides) {
        let s = s as i64;
        rest.constant += s * e.constant;
        for &(c, v) in &e.terms {
            match vars.iter().position(|x| *x == v) {
                Some(p) => coeffs[p] += s * c,
                None => rest.terms.push((s * c, v)),
            }
        }
    }
    (coeffs, rest)
}

impl<'ctx> Gen<'ctx, '_> {
    /// Runs `body(p0, kc, offset)` for each KC-deep panel of a depth `k`:
    /// its first row, its depth (KC, or less for the last), and where it
    /// starts in a packed right operand `npad` columns wide.
    fn k_panels(
        &mut self,
        k: IntValue<'ctx>,
        npad: IntValue<'ctx>,
        body: impl FnOnce(&mut Self, IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        let bl = blocking();
        let kc_max = self.i64c(bl.kc);
        let panels = self.b.build_int_unsigned_div(
            self.b.build_int_add(k, self.i64c(bl.kc - 1), "up")?,
            kc_max,
            "panels",
        )?;
        self.counted(self.i64c(0), panels, |g, pb| {
            let p0 = g.b.build_int_mul(pb, kc_max, "p0")?;
            let kc = g.min(kc_max, g.b.build_int_sub(k, p0, "kleft")?)?;
            let offset = g.b.build_int_mul(p0, npad, "panel")?;
            body(g, p0, kc, offset)
        })
    }

    /// `dlc.sgemm.pack_b(b, base, sk, sn, k, n, npad, dst)`: the right
    /// operand (element `(p, j)` at `b[base + p*sk + j*sn]`) as KC-deep panels
    /// of NR-column strips, each strip row by row, zero past column `n`.
    fn pack_b(&self) -> R<FunctionValue<'ctx>> {
        let bl = blocking();
        let (i64t, ptr) = (
            self.ctx.i64_type(),
            self.ctx.ptr_type(AddressSpace::default()),
        );
        let c64 = move |v: u64| i64t.const_int(v, false);
        self.helper(
            "dlc.sgemm.pack_b",
            &[
                ptr.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
                ptr.into(),
            ],
            |g, args| {
                let [b, base, sk, sn, k, n, npad, dst] = args else {
                    return Err(CodegenError::Invalid("pack_b parameters".into()));
                };
                let (b, dst) = (b.into_pointer_value(), dst.into_pointer_value());
                let [base, sk, sn, k, n, npad] =
                    [base, sk, sn, k, n, npad].map(|v| v.into_int_value());
                let strips = g.b.build_int_unsigned_div(npad, c64(bl.nr), "strips")?;
                let last = g.b.build_int_sub(n, c64(1), "last")?;
                g.k_panels(k, npad, |g, p0, kc, panel| {
                    g.counted(c64(0), strips, |g, jp| {
                        g.counted(c64(0), kc, |g, p| {
                            let row = g.b.build_int_add(p0, p, "row")?;
                            let roff =
                                g.b.build_int_add(base, g.b.build_int_mul(row, sk, "rs")?, "roff")?;
                            let at =
                                g.b.build_int_add(g.b.build_int_mul(jp, kc, "jpk")?, p, "at")?;
                            let at = g.b.build_int_add(
                                panel,
                                g.b.build_int_mul(at, c64(bl.nr), "s")?,
                                "at",
                            )?;
                            // A whole strip of a row-major operand is one copy.
                            let j0 = g.b.build_int_mul(jp, c64(bl.nr), "j0")?;
                            let whole = g.b.build_and(
                                g.b.build_int_compare(IntPredicate::EQ, sn, c64(1), "unit")?,
                                g.b.build_int_compare(
                                    IntPredicate::SLE,
                                    g.b.build_int_add(j0, c64(bl.nr), "j1")?,
                                    n,
                                    "fits",
                                )?,
                                "whole",
                            )?;
                            let copy = g.ctx.append_basic_block(g.func, "pack.copy");
                            let each = g.ctx.append_basic_block(g.func, "pack.each");
                            let done = g.ctx.append_basic_block(g.func, "pack.done");
                            g.b.build_conditional_branch(whole, copy, each)?;
                            g.b.position_at_end(copy);
                            let src = g.f32_at(b, g.b.build_int_add(roff, j0, "src")?)?;
                            g.b.build_memcpy(g.f32_at(dst, at)?, 4, src, 4, c64(bl.nr * 4))
                                .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                            g.b.build_unconditional_branch(done)?;
                            g.b.position_at_end(each);
                            g.counted(c64(0), c64(bl.nr), |g, jj| {
                                let j = g.b.build_int_add(
                                    g.b.build_int_mul(jp, c64(bl.nr), "j0")?,
                                    jj,
                                    "j",
                                )?;
                                let inside =
                                    g.b.build_int_compare(IntPredicate::SLT, j, n, "in")?;
                                let jc = g.min(j, last)?;
                                let off = g.b.build_int_add(
                                    roff,
                                    g.b.build_int_mul(jc, sn, "cs")?,
                                    "off",
                                )?;
                                let x = g.b.build_load(g.ctx.f32_type(), g.f32_at(b, off)?, "b")?;
                                let zero = g.ctx.f32_type().const_zero().into();
                                let x = g.b.build_select(inside, x, zero, "b")?;
                                let d = g.b.build_int_add(at, jj, "d")?;
                                g.b.build_store(g.f32_at(dst, d)?, x)?;
                                Ok(())
                            })?;
                            g.b.build_unconditional_branch(done)?;
                            g.b.position_at_end(done);
                            Ok(())
                        })
                    })
                })
            },
        )
    }

    /// `dlc.sgemm.block(a, base, si, sk, i0, mc, k, npad, bpack, apack, c)`:
    /// `c[MC x npad] += a[i0 .. i0 + mc, ..] * b` for the packed `b`, one
    /// KC-deep panel at a time: the rows' slice of the left operand (element
    /// `(i, p)` at `a[base + i*si + p*sk]`) is packed into MR-row strips, and
    /// the micro-kernel runs on every pair of strips.
    fn gemm_block(&self) -> R<FunctionValue<'ctx>> {
        let bl = blocking();
        let (i64t, ptr) = (
            self.ctx.i64_type(),
            self.ctx.ptr_type(AddressSpace::default()),
        );
        let c64 = move |v: u64| i64t.const_int(v, false);
        let kernel = self.micro_kernel()?;
        self.helper(
            "dlc.sgemm.block",
            &[
                ptr.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
                ptr.into(),
                ptr.into(),
                ptr.into(),
                i64t.into(),
                i64t.into(),
                i64t.into(),
            ],
            |g, args| {
                let [
                    a,
                    base,
                    si,
                    sk,
                    i0,
                    mc,
                    k,
                    npad,
                    bpack,
                    apack,
                    cblock,
                    js,
                    je,
                    ldc,
                ] = args
                else {
                    return Err(CodegenError::Invalid("gemm_block parameters".into()));
                };
                let [a, bpack, apack, cblock] =
                    [a, bpack, apack, cblock].map(|v| v.into_pointer_value());
                let [base, si, sk, i0, mc, k, npad, js, je, ldc] =
                    [base, si, sk, i0, mc, k, npad, js, je, ldc].map(|v| v.into_int_value());
                let row_strips = g.b.build_int_unsigned_div(
                    g.b.build_int_add(mc, c64(bl.mr - 1), "up")?,
                    c64(bl.mr),
                    "rows",
                )?;
                let last = g.b.build_int_sub(mc, c64(1), "last")?;
                g.k_panels(k, npad, |g, p0, kc, bpanel| {
                    // Left operand: strip by strip, column by column, the
                    // MR rows side by side (an interleaving store, which
                    // vectorizes). Rows past mc repeat the last row: their
                    // results land in the block's padding, never read.
                    g.counted(c64(0), row_strips, |g, strip| {
                        let mut roffs = Vec::new();
                        for r in 0..bl.mr {
                            let i = g.b.build_int_add(
                                g.b.build_int_mul(strip, c64(bl.mr), "s0")?,
                                c64(r),
                                "i",
                            )?;
                            let row = g.b.build_int_add(i0, g.min(i, last)?, "row")?;
                            roffs.push(g.b.build_int_add(
                                base,
                                g.b.build_int_mul(row, si, "rs")?,
                                "roff",
                            )?);
                        }
                        let sbase = g.b.build_int_mul(
                            g.b.build_int_mul(strip, kc, "sk")?,
                            c64(bl.mr),
                            "sb",
                        )?;
                        g.counted(c64(0), kc, |g, p| {
                            let coff =
                                g.b.build_int_mul(g.b.build_int_add(p0, p, "col")?, sk, "cs")?;
                            let d0 = g.b.build_int_add(
                                sbase,
                                g.b.build_int_mul(p, c64(bl.mr), "pm")?,
                                "d0",
                            )?;
                            for (r, roff) in roffs.iter().enumerate() {
                                let off = g.b.build_int_add(*roff, coff, "off")?;
                                let x = g.b.build_load(g.ctx.f32_type(), g.f32_at(a, off)?, "a")?;
                                let d = g.b.build_int_add(d0, c64(r as u64), "d")?;
                                g.b.build_store(g.f32_at(apack, d)?, x)?;
                            }
                            Ok(())
                        })
                    })?;
                    g.counted(js, je, |g, jp| {
                        g.counted(c64(0), row_strips, |g, ip| {
                            let a_at = g.b.build_int_mul(
                                g.b.build_int_mul(ip, kc, "ik")?,
                                c64(bl.mr),
                                "aat",
                            )?;
                            let b_at = g.b.build_int_mul(
                                g.b.build_int_mul(jp, kc, "jk")?,
                                c64(bl.nr),
                                "bat",
                            )?;
                            let b_at = g.b.build_int_add(bpanel, b_at, "bat")?;
                            let c_at = g.b.build_int_add(
                                g.b.build_int_mul(
                                    g.b.build_int_mul(ip, c64(bl.mr), "ir")?,
                                    ldc,
                                    "cr",
                                )?,
                                g.b.build_int_mul(
                                    g.b.build_int_sub(jp, js, "jrel")?,
                                    c64(bl.nr),
                                    "cc",
                                )?,
                                "cat",
                            )?;
                            g.b.build_call(
                                kernel,
                                &[
                                    kc.into(),
                                    g.f32_at(apack, a_at)?.into(),
                                    g.f32_at(bpack, b_at)?.into(),
                                    g.f32_at(cblock, c_at)?.into(),
                                    ldc.into(),
                                ],
                                "",
                            )?;
                            Ok(())
                        })
                    })
                })
            },
        )
    }

    /// `loop.matmul`: the right operand is packed once (`dlc.sgemm.pack_b`);
    /// each block of MC rows (over threads when `parallel`) is multiplied
    /// into a zeroed block, rows padded to MR and columns to NR
    /// (`dlc.sgemm.block`); then the epilogue runs on the block's elements.
    /// The packing and blocking code is shared by every matmul of the module.
    pub(super) fn matmul(&mut self, id: OpId) -> R<()> {
        let bl = blocking();
        let f = self.f;
        let op = f.op(id);
        let OpKind::Matmul(c) = &op.kind else {
            return Err(CodegenError::Invalid("not a loop.matmul".into()));
        };
        let dlc_loop::Contraction {
            m,
            n,
            k,
            a,
            b,
            parallel,
        } = &**c;
        let (m, n, k) = (*m as u64, *n as u64, *k as u64);
        let region = &op.regions[0];
        let [iv, jv, kv, acc] = region.args[..] else {
            return Err(CodegenError::Invalid("loop.matmul body arguments".into()));
        };
        let strides = |v: Value| match f.ty(v) {
            Type::Buffer(t) => Ok(t.strides.clone()),
            _ => Err(CodegenError::Invalid("loop.matmul of a non-buffer".into())),
        };
        let (a_coef, a_rest) = split_offset(&strides(op.operands[0])?, a, &[iv, kv]);
        let (b_coef, b_rest) = split_offset(&strides(op.operands[1])?, b, &[kv, jv]);
        let npad = n.div_ceil(bl.nr) * bl.nr;
        let blocks = m.div_ceil(bl.mc);
        let i64t = self.ctx.i64_type();
        let c64 = move |v: u64| i64t.const_int(v, false);
        let s64 = move |v: i64| i64t.const_int(v as u64, true);
        let bpack = self.heap(k.div_ceil(bl.kc) * bl.kc * npad * 4, false)?;
        let pack_b = self.pack_b()?;
        let bbase = self.index(&b_rest)?;
        self.b.build_call(
            pack_b,
            &[
                self.get(op.operands[1])?.into(),
                bbase.into(),
                s64(b_coef[0]).into(),
                s64(b_coef[1]).into(),
                c64(k).into(),
                c64(n).into(),
                c64(npad).into(),
                bpack.into(),
            ],
            "",
        )?;
        let gemm_block = self.gemm_block()?;
        // Units of work: a block of MC rows by a chunk of NR-column strips;
        // the columns are split when there are few row blocks, so that even
        // a product with one row block keeps every thread busy.
        let strips = npad / bl.nr;
        let per_chunk = if *parallel {
            strips.div_ceil(bl.units.div_ceil(blocks).clamp(1, strips))
        } else {
            strips
        };
        let chunks = strips.div_ceil(per_chunk);
        let ldc = per_chunk * bl.nr;
        let body = move |g: &mut Gen<'ctx, '_>,
                         unit: IntValue<'ctx>,
                         extra: &[BasicValueEnum<'ctx>]|
              -> R<()> {
            let block = g.b.build_int_unsigned_div(unit, c64(chunks), "block")?;
            let chunk = g.b.build_int_unsigned_rem(unit, c64(chunks), "chunk")?;
            let js = g.b.build_int_mul(chunk, c64(per_chunk), "js")?;
            let je = g.min(g.b.build_int_add(js, c64(per_chunk), "je")?, c64(strips))?;
            let j0 = g.b.build_int_mul(js, c64(bl.nr), "j0")?;
            let width = g.b.build_int_sub(
                g.min(g.b.build_int_mul(je, c64(bl.nr), "jn")?, c64(n))?,
                j0,
                "width",
            )?;
            let bpack = extra
                .first()
                .ok_or_else(|| CodegenError::Invalid("packed operand not passed".into()))?
                .into_pointer_value();
            let abase = g.index(&a_rest)?;
            let i0 = g.b.build_int_mul(block, c64(bl.mc), "i0")?;
            let mc = g.min(c64(bl.mc), g.b.build_int_sub(c64(m), i0, "left")?)?;
            let cblock = g.heap(bl.mc * ldc * 4, true)?;
            let apack = g.heap(bl.mc * bl.kc * 4, false)?;
            g.b.build_call(
                gemm_block,
                &[
                    g.get(op.operands[0])?.into(),
                    abase.into(),
                    s64(a_coef[0]).into(),
                    s64(a_coef[1]).into(),
                    i0.into(),
                    mc.into(),
                    c64(k).into(),
                    c64(npad).into(),
                    bpack.into(),
                    apack.into(),
                    cblock.into(),
                    js.into(),
                    je.into(),
                    c64(ldc).into(),
                ],
                "",
            )?;
            g.release(apack)?;
            // The epilogue, element by element.
            g.counted(c64(0), mc, |g, ii| {
                g.vals.insert(iv, g.b.build_int_add(i0, ii, "i")?.into());
                let crow = g.b.build_int_mul(ii, c64(ldc), "crow")?;
                g.counted(c64(0), width, |g, jj| {
                    g.vals.insert(jv, g.b.build_int_add(j0, jj, "j")?.into());
                    g.vals.insert(kv, c64(0).into());
                    let at = g.b.build_int_add(crow, jj, "cat")?;
                    let sum =
                        g.b.build_load(g.ctx.f32_type(), g.f32_at(cblock, at)?, "acc")?;
                    g.vals.insert(acc, sum);
                    g.block(region).map(|_| ())
                })
            })?;
            g.release(cblock)
        };
        if *parallel {
            let captures = free_values(f, &[id]);
            self.parallel_for(
                0,
                (blocks * chunks) as i64,
                &captures,
                &[bpack.into()],
                body,
            )?;
        } else {
            self.counted(self.i64c(0), self.i64c(blocks * chunks), |g, i| {
                body(g, i, &[bpack.into()])
            })?;
        }
        self.release(bpack)
    }

    /// `dlc.sgemm.6x32(kc, a, b, c, ldc)`: `c[MR x NR] += a * b` over `kc`
    /// steps, `a` packed `kc x MR`, `b` packed `kc x NR`, `c` with row
    /// stride `ldc`; the register tile is `MR x NR / LANES` vectors.
    fn micro_kernel(&self) -> R<FunctionValue<'ctx>> {
        let bl = blocking();
        let name = format!("dlc.sgemm.{}x{}", bl.mr, bl.nr);
        if let Some(k) = self.module.get_function(&name) {
            return Ok(k);
        }
        let ctx = self.ctx;
        let (i64t, f32t, ptr) = (
            ctx.i64_type(),
            ctx.f32_type(),
            ctx.ptr_type(AddressSpace::default()),
        );
        let vec = f32t.vec_type(bl.lanes as u32);
        let kernel = self.module.add_function(
            &name,
            ctx.void_type().fn_type(
                &[i64t.into(), ptr.into(), ptr.into(), ptr.into(), i64t.into()],
                false,
            ),
            Some(Linkage::Private),
        );
        let param = |i: u32| {
            kernel
                .get_nth_param(i)
                .ok_or_else(|| CodegenError::Invalid("micro-kernel parameter".into()))
        };
        let (kc, a, b, c, ldc) = (
            param(0)?.into_int_value(),
            param(1)?.into_pointer_value(),
            param(2)?.into_pointer_value(),
            param(3)?.into_pointer_value(),
            param(4)?.into_int_value(),
        );
        let bld = ctx.create_builder();
        let entry = ctx.append_basic_block(kernel, "entry");
        let body = ctx.append_basic_block(kernel, "k");
        let exit = ctx.append_basic_block(kernel, "store");
        bld.position_at_end(entry);
        bld.build_unconditional_branch(body)?;
        bld.position_at_end(body);
        let p = bld.build_phi(i64t, "p")?;
        p.add_incoming(&[(&i64t.const_zero(), entry)]);
        let pv = p.as_basic_value().into_int_value();
        let nv = (bl.nr / bl.lanes) as usize;
        let mut phis = Vec::new();
        for _ in 0..bl.mr as usize * nv {
            let phi = bld.build_phi(vec, "c")?;
            phi.add_incoming(&[(&vec.const_zero(), entry)]);
            phis.push(phi);
        }
        let at = |base: PointerValue<'ctx>, off: IntValue<'ctx>| {
            // SAFETY (LLVM IR semantics): within the packed panels and the
            // padded result block the caller passes.
            unsafe { bld.build_in_bounds_gep(f32t, base, &[off], "at") }
        };
        let fma = inkwell::intrinsics::Intrinsic::find("llvm.fma")
            .and_then(|i| i.get_declaration(self.module, &[vec.into()]))
            .ok_or_else(|| CodegenError::Llvm("no llvm.fma".into()))?;
        let boff = bld.build_int_mul(pv, i64t.const_int(bl.nr, false), "boff")?;
        let mut bvecs = Vec::new();
        for v in 0..nv {
            let off = bld.build_int_add(boff, i64t.const_int(v as u64 * bl.lanes, false), "bo")?;
            let ld = bld.build_load(vec, at(b, off)?, "bv")?;
            ld.as_instruction_value()
                .map(|i| i.set_alignment(4))
                .transpose()
                .map_err(|e| CodegenError::Llvm(e.to_string()))?;
            bvecs.push(ld);
        }
        let aoff = bld.build_int_mul(pv, i64t.const_int(bl.mr, false), "aoff")?;
        let mut next = Vec::new();
        for r in 0..bl.mr as usize {
            let off = bld.build_int_add(aoff, i64t.const_int(r as u64, false), "ao")?;
            let x = bld.build_load(f32t, at(a, off)?, "a")?;
            let one = bld.build_insert_element(vec.get_poison(), x, i64t.const_zero(), "a1")?;
            let splat = bld.build_shuffle_vector(
                one,
                vec.get_poison(),
                ctx.i32_type().vec_type(bl.lanes as u32).const_zero(),
                "splat",
            )?;
            for v in 0..nv {
                let acc = phis[r * nv + v].as_basic_value();
                let r = bld
                    .build_call(fma, &[splat.into(), bvecs[v].into(), acc.into()], "fma")?
                    .try_as_basic_value()
                    .basic()
                    .ok_or_else(|| CodegenError::Llvm("fma gives no value".into()))?;
                next.push(r);
            }
        }
        let p1 = bld.build_int_add(pv, i64t.const_int(1, false), "p1")?;
        p.add_incoming(&[(&p1, body)]);
        for (phi, v) in phis.iter().zip(&next) {
            phi.add_incoming(&[(v, body)]);
        }
        let more = bld.build_int_compare(IntPredicate::SLT, p1, kc, "more")?;
        bld.build_conditional_branch(more, body, exit)?;
        bld.position_at_end(exit);
        for r in 0..bl.mr as usize {
            let row = bld.build_int_mul(ldc, i64t.const_int(r as u64, false), "row")?;
            for v in 0..nv {
                let off =
                    bld.build_int_add(row, i64t.const_int(v as u64 * bl.lanes, false), "co")?;
                let cp = at(c, off)?;
                let old = bld.build_load(vec, cp, "old")?;
                old.as_instruction_value()
                    .map(|i| i.set_alignment(4))
                    .transpose()
                    .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                let sum = bld.build_float_add(
                    old.into_vector_value(),
                    next[r * nv + v].into_vector_value(),
                    "sum",
                )?;
                bld.build_store(cp, sum)?
                    .set_alignment(4)
                    .map_err(|e| CodegenError::Llvm(e.to_string()))?;
            }
        }
        bld.build_return(None)?;
        Ok(kernel)
    }
}
