//! Helpers every outlined or shared function uses (constants, counted
//! loops, failure statuses, declarations, heap memory) and outlining: a
//! kernel's body as a function run here or on the OpenMP runtime's
//! threads.

use inkwell::AtomicOrdering;
use inkwell::basic_block::BasicBlock;
use inkwell::module::Linkage;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{
    BasicValue, BasicValueEnum, FunctionValue, IntValue, PhiValue, PointerValue,
};
use inkwell::{AddressSpace, IntPredicate};

use super::{Gen, Ir};
use crate::{CodegenError, R};

/// How many threads a kernel launch hands out its programs to from words
/// of their own (see [`Gen::outline`]); threads past them only take
/// programs from those words. A word is a 64-byte line of its own.
const CLAIM_WORDS: u64 = 16;
/// `i64`s from one thread's word to the next (64 bytes).
const CLAIM_STRIDE: u64 = 8;

/// Slot `i` (of 8 bytes) of an outlined function's frame.
fn frame_slot<'ctx, I: Ir>(
    g: &Gen<'ctx, '_, I>,
    frame: PointerValue<'ctx>,
    i: usize,
) -> R<PointerValue<'ctx>> {
    // SAFETY (LLVM IR semantics): i is within the frame array.
    Ok(unsafe {
        g.b.build_in_bounds_gep(g.ctx.i64_type(), frame, &[g.i64c(i as u64)], "slot")?
    })
}

impl<'ctx, I: Ir> Gen<'ctx, '_, I> {
    pub(super) fn i64c(&self, v: u64) -> IntValue<'ctx> {
        self.ctx.i64_type().const_int(v, false)
    }

    /// A loop `lo..hi` by 1 around what `body` emits.
    pub(super) fn counted(
        &mut self,
        lo: IntValue<'ctx>,
        hi: IntValue<'ctx>,
        body: impl FnOnce(&mut Self, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        self.counted_carrying(lo, hi, 1, &[], |g, i, _| body(g, i).map(|()| vec![]))
            .map(|_| ())
    }

    /// Leaves the function with `status` (nonzero): returns it, or, in a
    /// function outlined for threads, records it and returns.
    pub(super) fn fail_with(&self, status: IntValue<'ctx>) -> R<()> {
        match self.status_slot {
            None => {
                self.hand_back_workspace()?;
                self.b.build_return(Some(&status))?;
            }
            Some(slot) => {
                let st = self.b.build_store(slot, status)?;
                st.set_atomic_ordering(AtomicOrdering::Monotonic)
                    .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                st.set_alignment(4)
                    .map_err(|e| CodegenError::Llvm(e.to_string()))?;
                self.b.build_return(None)?;
            }
        }
        Ok(())
    }

    /// In a function holding a workspace: puts it back in its cache for the
    /// next call, freeing the one a concurrent call left there, if any (a
    /// preparer frees its own).
    pub(super) fn hand_back_workspace(&self) -> R<()> {
        let Some((cache, p)) = self.workspace else {
            return Ok(());
        };
        if !self.keep_workspace {
            return self.release(p);
        }
        let i64t = self.ctx.i64_type();
        let mine = self.b.build_ptr_to_int(p, i64t, "mine")?;
        let old = self.b.build_atomicrmw(
            inkwell::AtomicRMWBinOp::Xchg,
            cache,
            mine,
            AtomicOrdering::AcquireRelease,
        )?;
        let old = self.b.build_int_to_ptr(
            old,
            self.ctx.ptr_type(AddressSpace::default()),
            "displaced",
        )?;
        // free(NULL) does nothing.
        self.release(old)
    }

    pub(super) fn declare(
        &self,
        name: &str,
        ty: inkwell::types::FunctionType<'ctx>,
    ) -> FunctionValue<'ctx> {
        self.module
            .get_function(name)
            .unwrap_or_else(|| self.module.add_function(name, ty, Some(Linkage::External)))
    }

    /// A weak declaration: the symbol is null at run time when nothing
    /// linked defines it (an object file linked without `-lgomp`).
    pub(super) fn declare_weak(
        &self,
        name: &str,
        ty: inkwell::types::FunctionType<'ctx>,
    ) -> FunctionValue<'ctx> {
        self.module.get_function(name).unwrap_or_else(|| {
            self.module
                .add_function(name, ty, Some(Linkage::ExternalWeak))
        })
    }

    /// Whether weakly declared `f` was linked, as an i1.
    pub(super) fn linked(&self, f: FunctionValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self
            .b
            .build_is_not_null(f.as_global_value().as_pointer_value(), "linked")?)
    }

    /// `bytes` (a multiple of 64) aligned to a cache line (`aligned_alloc`:
    /// vector loads of packed panels never straddle two lines), failing
    /// with status 2.
    pub(super) fn heap(&self, bytes: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        let (i64t, ptr) = (
            self.ctx.i64_type(),
            self.ctx.ptr_type(AddressSpace::default()),
        );
        let alloc = self.declare(
            "aligned_alloc",
            ptr.fn_type(&[i64t.into(), i64t.into()], false),
        );
        let p = self
            .b
            .build_call(alloc, &[self.i64c(64).into(), bytes.into()], "block")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::Llvm("malloc gives no value".into()))?
            .into_pointer_value();
        let null = self.b.build_is_null(p, "isnull")?;
        let ok = self.ctx.append_basic_block(self.func, "alloc.ok");
        let fail = self.fail_block(dlc_runtime::abi::STATUS_OUT_OF_MEMORY)?;
        self.b.build_conditional_branch(null, fail, ok)?;
        self.b.position_at_end(ok);
        Ok(p)
    }

    pub(super) fn release(&self, p: PointerValue<'ctx>) -> R<()> {
        let ptr = self.ctx.ptr_type(AddressSpace::default());
        let free = self.declare("free", self.ctx.void_type().fn_type(&[ptr.into()], false));
        self.b.build_call(free, &[p.into()], "")?;
        Ok(())
    }

    /// Outlines `body(first, end)` over the range `lo..hi` into a function
    /// taking a frame that holds `captures` (every value the body uses from
    /// outside, in that order), then `extra`, then a status slot a failure
    /// is recorded in, then (with `threads`) the claim words `launch`
    /// filled. With `threads`, the function is meant for `GOMP_parallel`:
    /// each thread runs the programs of its share of the range, and with
    /// `claims` then takes those left in the others'; otherwise it runs the
    /// whole range. `body(first, end, thread, extra)` is told the OpenMP
    /// thread number (0 without threads). [`Self::launch`] calls it.
    pub(super) fn outline(
        &mut self,
        std::ops::Range { start: lo, end: hi }: std::ops::Range<i64>,
        captures: &[I::Value],
        extra: &[BasicValueEnum<'ctx>],
        threads: bool,
        claims: bool,
        body: impl FnOnce(
            &mut Gen<'ctx, '_, I>,
            IntValue<'ctx>,
            IntValue<'ctx>,
            IntValue<'ctx>,
            &[BasicValueEnum<'ctx>],
        ) -> R<()>,
    ) -> R<FunctionValue<'ctx>> {
        let (ctx, i64t) = (self.ctx, self.ctx.i64_type());
        let ptr = ctx.ptr_type(AddressSpace::default());
        let mut slots: Vec<(Option<I::Value>, BasicTypeEnum<'ctx>)> = captures
            .iter()
            .map(|v| Ok((Some(*v), self.get(*v)?.get_type())))
            .collect::<R<_>>()?;
        slots.extend(extra.iter().map(|v| (None, v.get_type())));
        // Named after the source line it computes (`step.threads12.L9C5`,
        // line 9, column 5), or the place it names when it is no line (an
        // imported ONNX node: `main_graph.threads12.node_features_9_Conv`),
        // so that a profile of compiled code reads as the program: every
        // kernel of a gradient is at its forward op's place. Internal, not
        // private: a local symbol, which an object file and a shared
        // library keep, so that `perf` on them names it.
        let place = self.loc.as_ref().map(place_suffix).unwrap_or_default();
        let outlined = self.module.add_function(
            &format!(
                "{}.{}{}{place}",
                I::name(self.f),
                if threads { "threads" } else { "kernel" },
                self.module.get_functions().count()
            ),
            ctx.void_type().fn_type(&[ptr.into()], false),
            Some(Linkage::Internal),
        );
        let start = ctx.append_basic_block(outlined, "entry");
        let mut g = Gen::within(ctx, self.module, self.f, outlined, &self.sites);
        g.loc.clone_from(&self.loc);
        g.index_ranges = self.index_ranges.clone();
        (
            g.lanes,
            g.min_threads,
            g.min_thread_work,
            g.min_claim_work,
            g.bf16_dot,
            g.mask_registers,
        ) = (
            self.lanes,
            self.min_threads,
            self.min_thread_work,
            self.min_claim_work,
            self.bf16_dot,
            self.mask_registers,
        );
        g.b.position_at_end(start);
        let frame_in = outlined
            .get_first_param()
            .ok_or_else(|| CodegenError::Invalid("outlined body without frame".into()))?
            .into_pointer_value();
        g.status_slot = Some(frame_slot(&g, frame_in, slots.len())?);
        let mut extra_in = Vec::new();
        for (i, (v, ty)) in slots.iter().enumerate() {
            let loaded =
                g.b.build_load(*ty, frame_slot(&g, frame_in, i)?, "captured")?;
            match v {
                Some(v) => {
                    g.vals.insert(*v, loaded);
                }
                None => extra_in.push(loaded),
            }
        }
        let (lo_v, hi_v) = (
            i64t.const_int(lo as u64, true),
            i64t.const_int(hi as u64, true),
        );
        if !threads {
            let zero = g.i64c(0);
            body(&mut g, lo_v, hi_v, zero, &extra_in)?;
            g.b.build_return(None)?;
            return Ok(outlined);
        }
        let tid = g.omp("omp_get_thread_num", 0)?;
        let total = (hi - lo).max(0) as u64;
        if claims && total >= 1 << 31 {
            return Err(CodegenError::Invalid(format!(
                "{total} programs are too many for a claim word's halves"
            )));
        }
        if !claims {
            // Thread `t` of `n` takes `[t * total / n, (t + 1) * total / n)`
            // (where the programs do not split evenly, the later threads
            // take one more, and with it the grid's last, short, program).
            let nt = g.omp("omp_get_num_threads", 1)?;
            let share = |t: IntValue<'ctx>| -> R<IntValue<'ctx>> {
                let scaled = g.b.build_int_mul(t, g.i64c(total), "scaled")?;
                let part = g.b.build_int_unsigned_div(scaled, nt, "part")?;
                Ok(g.b.build_int_add(lo_v, part, "bound")?)
            };
            let first = share(tid)?;
            let end = share(g.b.build_int_add(tid, g.i64c(1), "next")?)?;
            body(&mut g, first, end, tid, &extra_in)?;
            g.b.build_return(None)?;
            return Ok(outlined);
        }
        // The programs are handed out from the claim words `launch` filled
        // (word `t` of `n`: the range `[t * total / n, (t + 1) * total / n)`
        // as `next | end << 32`): a thread takes its own word's programs
        // from the front, in order, then those left in the others' from the
        // back, one compare-exchange a program. Quiet, each thread runs its
        // share as a fixed split would (the same rows of an operand; where
        // the programs do not split evenly the later words hold one more,
        // and with it the grid's last, short, program); a thread held up
        // (another process on its core) leaves the end of its share to
        // those that are free instead of holding the kernel until it
        // returns.
        let words =
            g.b.build_load(
                ctx.ptr_type(AddressSpace::default()),
                frame_slot(&g, frame_in, slots.len() + 1)?,
                "claims",
            )?
            .into_pointer_value();
        // How many words `launch` filled: a team may have more threads
        // (those past `CLAIM_WORDS`) or fewer than words.
        // SAFETY (LLVM IR semantics): the count follows the words.
        let count_at = unsafe {
            g.b.build_in_bounds_gep(i64t, words, &[g.i64c(CLAIM_WORDS * CLAIM_STRIDE)], "owners")?
        };
        let owners = g.b.build_load(i64t, count_at, "owners")?.into_int_value();
        let scan = ctx.append_basic_block(outlined, "claim.scan");
        let try_claim = ctx.append_basic_block(outlined, "claim.try");
        let open = ctx.append_basic_block(outlined, "claim.open");
        let claimed = ctx.append_basic_block(outlined, "claimed");
        let next_word = ctx.append_basic_block(outlined, "claim.next");
        let done = ctx.append_basic_block(outlined, "all.claimed");
        let entry_end =
            g.b.get_insert_block()
                .ok_or_else(|| CodegenError::Llvm("no insertion block".into()))?;
        g.b.build_unconditional_branch(scan)?;
        g.b.position_at_end(scan);
        let k = g.b.build_phi(i64t, "k")?;
        k.add_incoming(&[(&g.i64c(0), entry_end)]);
        let kv = k.as_basic_value().into_int_value();
        let more =
            g.b.build_int_compare(IntPredicate::ULT, kv, owners, "more")?;
        let at = g.b.build_int_add(tid, kv, "at")?;
        let v = g.b.build_int_unsigned_rem(at, owners, "word")?;
        let own = g.b.build_int_compare(IntPredicate::EQ, v, tid, "own")?;
        let offset = g.b.build_int_mul(v, g.i64c(CLAIM_STRIDE), "offset")?;
        // SAFETY (LLVM IR semantics): `v` < owners <= CLAIM_WORDS.
        let word = unsafe { g.b.build_in_bounds_gep(i64t, words, &[offset], "word")? };
        g.b.build_conditional_branch(more, try_claim, done)?;
        g.b.position_at_end(try_claim);
        let w = g.b.build_load(i64t, word, "w")?;
        let load = w
            .as_instruction_value()
            .ok_or_else(|| CodegenError::Llvm("a load is no instruction".into()))?;
        load.set_atomic_ordering(AtomicOrdering::Monotonic)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        load.set_alignment(8)
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        let w = w.into_int_value();
        let next = g.b.build_and(w, g.i64c(u32::MAX as u64), "next")?;
        let end = g.b.build_right_shift(w, g.i64c(32), false, "end")?;
        let left =
            g.b.build_int_compare(IntPredicate::ULT, next, end, "left")?;
        g.b.build_conditional_branch(left, open, next_word)?;
        g.b.position_at_end(open);
        let front = g.b.build_int_add(w, g.i64c(1), "front")?;
        let back = g.b.build_int_sub(w, g.i64c(1 << 32), "back")?;
        let taken =
            g.b.build_select(own, front, back, "taken")?
                .into_int_value();
        let last = g.b.build_int_sub(end, g.i64c(1), "last")?;
        let program =
            g.b.build_select(own, next, last, "program")?
                .into_int_value();
        let swapped = g.b.build_cmpxchg(
            word,
            w,
            taken,
            AtomicOrdering::Monotonic,
            AtomicOrdering::Monotonic,
        )?;
        let won = g.b.build_extract_value(swapped, 1, "won")?.into_int_value();
        g.b.build_conditional_branch(won, claimed, try_claim)?;
        g.b.position_at_end(claimed);
        let first = g.b.build_int_add(lo_v, program, "first")?;
        let end = g.b.build_int_add(first, g.i64c(1), "end")?;
        body(&mut g, first, end, tid, &extra_in)?;
        g.b.build_unconditional_branch(try_claim)?;
        g.b.position_at_end(next_word);
        let k1 = g.b.build_int_add(kv, g.i64c(1), "k")?;
        k.add_incoming(&[(&k1, next_word)]);
        g.b.build_unconditional_branch(scan)?;
        g.b.position_at_end(done);
        g.b.build_return(None)?;
        Ok(outlined)
    }

    /// `name()` of the OpenMP runtime (`omp_get_thread_num`, ...) as an
    /// i64, or `alone` when the runtime is not linked (thread 0 of 1).
    pub(super) fn omp(&self, name: &str, alone: u64) -> R<IntValue<'ctx>> {
        let i64t = self.ctx.i64_type();
        let f = self.declare_weak(name, self.ctx.i32_type().fn_type(&[], false));
        let here = self
            .b
            .get_insert_block()
            .ok_or_else(|| CodegenError::Llvm("no insertion block".into()))?;
        let call = self.ctx.append_basic_block(self.func, "omp.call");
        let join = self.ctx.append_basic_block(self.func, "omp.join");
        self.b
            .build_conditional_branch(self.linked(f)?, call, join)?;
        self.b.position_at_end(call);
        let r = self
            .b
            .build_call(f, &[], "omp")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::Llvm("omp call gives no value".into()))?;
        let r = self.b.build_int_s_extend(r.into_int_value(), i64t, "n")?;
        self.b.build_unconditional_branch(join)?;
        self.b.position_at_end(join);
        let phi = self.b.build_phi(i64t, "n")?;
        phi.add_incoming(&[(&r, call), (&self.i64c(alone), here)]);
        Ok(phi.as_basic_value().into_int_value())
    }

    /// A stack slot of type `ty` allocated in the function's entry block
    /// (once, however often the code asking for it runs); the builder
    /// stays where it was.
    pub(super) fn entry_alloca(
        &self,
        ty: BasicTypeEnum<'ctx>,
        name: &str,
    ) -> R<PointerValue<'ctx>> {
        let here = self
            .b
            .get_insert_block()
            .ok_or_else(|| CodegenError::Llvm("no insertion block".into()))?;
        let entry = self
            .func
            .get_first_basic_block()
            .ok_or_else(|| CodegenError::Llvm("function without entry".into()))?;
        match entry.get_first_instruction() {
            Some(i) => self.b.position_before(&i),
            None => self.b.position_at_end(entry),
        }
        let slot = self.b.build_alloca(ty, name)?;
        self.b.position_at_end(here);
        Ok(slot)
    }

    /// Calls a function [`Self::outline`] made: fills its frame with the
    /// values of `captures` and `extra` (and, where it claims its
    /// `claims` programs, the function's claim words, one set in its entry
    /// block for every launch, which run one after another), runs it on
    /// the OpenMP runtime's threads (`threads`, when the runtime is linked)
    /// or here, and fails with the status it recorded, if any.
    pub(super) fn launch(
        &mut self,
        outlined: FunctionValue<'ctx>,
        captures: &[I::Value],
        extra: &[BasicValueEnum<'ctx>],
        threads: bool,
        claims: Option<u64>,
    ) -> R<()> {
        let (ctx, i64t, i32t) = (self.ctx, self.ctx.i64_type(), self.ctx.i32_type());
        let mut values: Vec<BasicValueEnum<'ctx>> =
            captures.iter().map(|v| self.get(*v)).collect::<R<_>>()?;
        values.extend_from_slice(extra);
        // The values, the status and, on threads, the claim words.
        let frame_ty = i64t.array_type(values.len() as u32 + 2);
        // The frame lives in the entry block, so a nest of these does not
        // grow the stack.
        let frame = self.entry_alloca(frame_ty.into(), "frame")?;
        for (i, v) in values.iter().enumerate() {
            self.b.build_store(frame_slot(self, frame, i)?, *v)?;
        }
        let status_slot = frame_slot(self, frame, values.len())?;
        let status = if threads {
            // Run on the OpenMP runtime's threads when it is linked, else
            // here: one call to the module's helper, so that a host
            // function launching a thousand kernels is not a thousand
            // copies of it (W7's step: 36,000 instructions).
            let helper = self.parallel_helper()?;
            // No words (a null pointer) for a kernel in fixed shares.
            let (words, programs) = match claims {
                None => (ctx.ptr_type(AddressSpace::default()).const_null(), 0),
                Some(programs) => {
                    let words = match self.claims.get() {
                        Some(words) => words,
                        None => {
                            let words = self.entry_alloca(
                                i64t.array_type((CLAIM_WORDS * CLAIM_STRIDE + 1) as u32)
                                    .into(),
                                "claims",
                            )?;
                            self.claims.set(Some(words));
                            words
                        }
                    };
                    self.b
                        .build_store(frame_slot(self, frame, values.len() + 1)?, words)?;
                    (words, programs)
                }
            };
            self.b
                .build_call(
                    helper,
                    &[
                        outlined.as_global_value().as_pointer_value().into(),
                        frame.into(),
                        status_slot.into(),
                        words.into(),
                        self.i64c(programs).into(),
                    ],
                    "status",
                )?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| CodegenError::Llvm("the launch helper gives no status".into()))?
                .into_int_value()
        } else {
            self.b.build_store(status_slot, i32t.const_zero())?;
            self.b.build_call(outlined, &[frame.into()], "")?;
            self.b
                .build_load(i32t, status_slot, "status")?
                .into_int_value()
        };
        let failed =
            self.b
                .build_int_compare(IntPredicate::NE, status, i32t.const_zero(), "failed")?;
        // Every launch of this function fails through one block.
        let (fail, phi) = self.launch_failure()?;
        let here = self
            .b
            .get_insert_block()
            .ok_or_else(|| CodegenError::Llvm("no insertion block".into()))?;
        phi.add_incoming(&[(&status, here)]);
        let ok = ctx.append_basic_block(self.func, "threads.ok");
        self.b.build_conditional_branch(failed, fail, ok)?;
        self.b.position_at_end(ok);
        Ok(())
    }

    /// The block every failed launch of this function leaves through, and
    /// the phi of its status (each launch adds its own).
    fn launch_failure(&self) -> R<(BasicBlock<'ctx>, PhiValue<'ctx>)> {
        if let Some(made) = *self.launch_fail.borrow() {
            return Ok(made);
        }
        let here = self.b.get_insert_block();
        let block = self.ctx.append_basic_block(self.func, "threads.failed");
        self.b.position_at_end(block);
        let phi = self.b.build_phi(self.ctx.i32_type(), "failed.status")?;
        self.fail_with(phi.as_basic_value().into_int_value())?;
        if let Some(here) = here {
            self.b.position_at_end(here);
        }
        *self.launch_fail.borrow_mut() = Some((block, phi));
        Ok((block, phi))
    }

    /// The module's `i32 dlc.parallel(void (*body)(void *), void *frame,
    /// i32 *status, i64 *words, i64 programs)`: clears `*status`, fills the
    /// claim words unless `words` is null (a kernel in fixed shares): word
    /// `t` of the `n` threads it asks for, at most `CLAIM_WORDS`, the share
    /// `[t * programs / n, (t + 1) * programs / n)` as `next | end << 32`
    /// (where the programs do not split evenly the later words hold one
    /// more, and with it the grid's last, short one), then `n` after the
    /// words; runs `body(frame)` on the OpenMP
    /// runtime's threads (`GOMP_parallel`) when it is linked and may run
    /// more than one (`omp_get_max_threads()`), else on this one, and
    /// returns `*status`. At one thread `GOMP_parallel` still starts a team
    /// of one, about 0.7 us a kernel on Zen 3: MobileNetV3-small's 80
    /// launches were 2.6% of its call.
    fn parallel_helper(&self) -> R<FunctionValue<'ctx>> {
        const NAME: &str = "dlc.parallel";
        if let Some(f) = self.module.get_function(NAME) {
            return Ok(f);
        }
        let (ctx, i32t) = (self.ctx, self.ctx.i32_type());
        let ptr = ctx.ptr_type(AddressSpace::default());
        let i64t = ctx.i64_type();
        let f = self.module.add_function(
            NAME,
            i32t.fn_type(
                &[ptr.into(), ptr.into(), ptr.into(), ptr.into(), i64t.into()],
                false,
            ),
            Some(Linkage::Private),
        );
        let kind = inkwell::attributes::Attribute::get_named_enum_kind_id("noinline");
        f.add_attribute(
            inkwell::attributes::AttributeLoc::Function,
            ctx.create_enum_attribute(kind, 0),
        );
        let param = |i: u32| -> R<PointerValue<'ctx>> {
            Ok(f.get_nth_param(i)
                .ok_or_else(|| CodegenError::Llvm("launch helper without parameters".into()))?
                .into_pointer_value())
        };
        let (body, frame, status, words) = (param(0)?, param(1)?, param(2)?, param(3)?);
        let programs = f
            .get_nth_param(4)
            .ok_or_else(|| CodegenError::Llvm("launch helper without parameters".into()))?
            .into_int_value();
        let gomp = self.declare_weak(
            "GOMP_parallel",
            ctx.void_type()
                .fn_type(&[ptr.into(), ptr.into(), i32t.into(), i32t.into()], false),
        );
        let max_threads = self.declare_weak("omp_get_max_threads", i32t.fn_type(&[], false));
        let b = ctx.create_builder();
        let entry = ctx.append_basic_block(f, "entry");
        let linked_block = ctx.append_basic_block(f, "linked");
        let pool = ctx.append_basic_block(f, "pool");
        let alone = ctx.append_basic_block(f, "alone");
        let joined = ctx.append_basic_block(f, "joined");
        let fill = ctx.append_basic_block(f, "fill");
        let fill_word = ctx.append_basic_block(f, "fill.word");
        let filled = ctx.append_basic_block(f, "filled");
        let start = ctx.append_basic_block(f, "start");
        let c64 = |v: u64| i64t.const_int(v, false);
        b.position_at_end(entry);
        b.build_store(status, i32t.const_zero())?;
        let linked = b.build_is_not_null(gomp.as_global_value().as_pointer_value(), "linked")?;
        b.build_conditional_branch(linked, linked_block, fill)?;
        // The runtime that defines `GOMP_parallel` defines this too.
        b.position_at_end(linked_block);
        let n = b
            .build_call(max_threads, &[], "max_threads")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::Llvm("omp_get_max_threads gives no value".into()))?
            .into_int_value();
        let many = b.build_int_compare(IntPredicate::SGT, n, i32t.const_int(1, false), "many")?;
        let n = b.build_int_s_extend(n, i64t, "n")?;
        let capped = b.build_int_compare(IntPredicate::UGT, n, c64(CLAIM_WORDS), "capped")?;
        let n = b
            .build_select(capped, c64(CLAIM_WORDS), n, "n")?
            .into_int_value();
        let n = b.build_select(many, n, c64(1), "n")?.into_int_value();
        b.build_unconditional_branch(fill)?;
        // Word `t` of the `n` the team's threads own: `[t * programs / n,
        // (t + 1) * programs / n)` as `next | end << 32`.
        b.position_at_end(fill);
        let owners = b.build_phi(i64t, "owners")?;
        owners.add_incoming(&[(&c64(1), entry), (&n, linked_block)]);
        let on_pool = b.build_phi(ctx.bool_type(), "on_pool")?;
        on_pool.add_incoming(&[
            (&ctx.bool_type().const_zero(), entry),
            (&many, linked_block),
        ]);
        let (owners, on_pool) = (
            owners.as_basic_value().into_int_value(),
            on_pool.as_basic_value().into_int_value(),
        );
        let wanted = b.build_is_not_null(words, "wanted")?;
        b.build_conditional_branch(wanted, fill_word, start)?;
        b.position_at_end(fill_word);
        let t = b.build_phi(i64t, "t")?;
        t.add_incoming(&[(&c64(0), fill)]);
        let tv = t.as_basic_value().into_int_value();
        let share = |t: IntValue<'ctx>| -> R<IntValue<'ctx>> {
            let scaled = b.build_int_mul(t, programs, "scaled")?;
            Ok(b.build_int_unsigned_div(scaled, owners, "bound")?)
        };
        let first = share(tv)?;
        let next_t = b.build_int_add(tv, c64(1), "next")?;
        let end = share(next_t)?;
        let range = b.build_or(first, b.build_left_shift(end, c64(32), "end")?, "range")?;
        let offset = b.build_int_mul(tv, c64(CLAIM_STRIDE), "offset")?;
        // SAFETY (LLVM IR semantics): `t` < owners <= CLAIM_WORDS.
        let word = unsafe { b.build_in_bounds_gep(i64t, words, &[offset], "word")? };
        b.build_store(word, range)?;
        t.add_incoming(&[(&next_t, fill_word)]);
        let again = b.build_int_compare(IntPredicate::ULT, next_t, owners, "again")?;
        b.build_conditional_branch(again, fill_word, filled)?;
        b.position_at_end(filled);
        // SAFETY (LLVM IR semantics): the count follows the words.
        let count_at = unsafe {
            b.build_in_bounds_gep(i64t, words, &[c64(CLAIM_WORDS * CLAIM_STRIDE)], "owners")?
        };
        b.build_store(count_at, owners)?;
        b.build_unconditional_branch(start)?;
        b.position_at_end(start);
        b.build_conditional_branch(on_pool, pool, alone)?;
        b.position_at_end(pool);
        b.build_call(
            gomp,
            &[
                body.into(),
                frame.into(),
                i32t.const_zero().into(),
                i32t.const_zero().into(),
            ],
            "",
        )?;
        b.build_unconditional_branch(joined)?;
        b.position_at_end(alone);
        b.build_indirect_call(
            ctx.void_type().fn_type(&[ptr.into()], false),
            body,
            &[frame.into()],
            "",
        )?;
        b.build_unconditional_branch(joined)?;
        b.position_at_end(joined);
        let result = b.build_load(i32t, status, "status")?;
        b.build_return(Some(&result))?;
        Ok(f)
    }
}

/// A kernel's name's suffix for its source place: `.L9C5` for line 9,
/// column 5; for a place that is no line (line 0: an imported ONNX
/// model's ``model.onnx, node `/features/9/Conv` (Conv)``), what follows
/// its file's name, letters and digits kept and the rest `_`, at most 48
/// characters (`.node_features_9_Conv_Conv`). A longer one keeps its first
/// word and its end, where an exporter's path names the layer and the op:
/// `/features/features.6/features.6.1/block/block.1/block.1.0/Conv` is
/// `.node_6_1_block_block_1_block_1_0_Conv_Conv`, where its first 48
/// characters were the same for every layer of the block.
fn place_suffix(loc: &dlc_core::SourceLoc) -> String {
    if loc.line > 0 {
        return format!(".L{}C{}", loc.line, loc.column);
    }
    let what = loc.file.split_once(", ").map_or(&*loc.file, |(_, w)| w);
    let mut name = String::new();
    for c in what.chars() {
        let c = if c.is_ascii_alphanumeric() { c } else { '_' };
        // Runs of `_` are one.
        if c != '_' || !name.ends_with('_') {
            name.push(c);
        }
    }
    const MOST: usize = 48;
    // ASCII: every other character became `_`.
    let name = name.trim_matches('_');
    let name = match name.split_once('_') {
        Some((head, _)) if name.len() > MOST && head.len() < MOST / 2 => {
            let from = name.len() - (MOST - head.len() - 1);
            // From a word's start.
            let tail = match name[from - 1..].find('_') {
                Some(0) | None => &name[from..],
                Some(i) => &name[from - 1 + i..],
            };
            format!("{head}_{}", tail.trim_start_matches('_'))
        }
        _ => name[name.len().saturating_sub(MOST)..].to_string(),
    };
    if name.is_empty() {
        String::new()
    } else {
        format!(".{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::place_suffix;
    use dlc_core::SourceLoc;

    fn at(file: &str, line: u32) -> SourceLoc {
        SourceLoc {
            file: file.into(),
            line,
            column: 5,
        }
    }

    #[test]
    fn kernels_are_named_after_their_place() {
        assert_eq!(place_suffix(&at("model.dl", 9)), ".L9C5");
        assert_eq!(
            place_suffix(&at("model.onnx, node `/features/9/Conv` (Conv)", 0)),
            ".node_features_9_Conv_Conv"
        );
        // Every layer of a block shared its first 48 characters.
        let layer = |l: &str| {
            place_suffix(&at(
                &format!(
                    "model.onnx, node `/features/features.6/features.6.1/block/{l}/Conv` (Conv)"
                ),
                0,
            ))
        };
        assert_eq!(
            layer("block.1/block.1.0"),
            ".node_6_1_block_block_1_block_1_0_Conv_Conv"
        );
        assert_ne!(layer("block.1/block.1.0"), layer("block.3/block.3.0"));
        assert!(layer("block.1/block.1.0").len() <= 49);
    }
}
