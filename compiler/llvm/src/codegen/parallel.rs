//! Helpers every outlined or shared function uses (constants, counted
//! loops, failure statuses, declarations, heap memory) and outlining: a
//! kernel's body as a function run here or on the OpenMP runtime's
//! threads.

use inkwell::AtomicOrdering;
use inkwell::basic_block::BasicBlock;
use inkwell::module::Linkage;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FunctionValue, IntValue, PhiValue, PointerValue};
use inkwell::{AddressSpace, IntPredicate};

use super::{Gen, Ir};
use crate::{CodegenError, R};

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
    /// next call, freeing the one a concurrent call left there, if any.
    pub(super) fn hand_back_workspace(&self) -> R<()> {
        let Some((cache, p)) = self.workspace else {
            return Ok(());
        };
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

    /// Outlines `body(first, end)` over `lo..hi` into a function taking a
    /// frame that holds `captures` (every value the body uses from outside,
    /// in that order), then `extra`, then a status slot a failure is
    /// recorded in. With `threads`, the function is meant for
    /// `GOMP_parallel`: each thread takes its contiguous chunk of the range;
    /// otherwise it runs the whole range. `body(first, end, thread, extra)`
    /// is told the OpenMP thread number (0 without threads).
    /// [`Self::launch`] calls it.
    pub(super) fn outline(
        &mut self,
        lo: i64,
        hi: i64,
        captures: &[I::Value],
        extra: &[BasicValueEnum<'ctx>],
        threads: bool,
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
            g.bf16_dot,
            g.mask_registers,
        ) = (
            self.lanes,
            self.min_threads,
            self.min_thread_work,
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
        let (tid, nt) = (
            g.omp("omp_get_thread_num", 0)?,
            g.omp("omp_get_num_threads", 1)?,
        );
        let total = (hi - lo).max(0) as u64;
        // Thread `t` of `n` takes `[t * total / n, (t + 1) * total / n)`:
        // where the programs do not split evenly, the later threads take
        // one more. A grid's last program along an axis is the one cut
        // short by the edge (196 pixels are 12 panels of 16 and one of 4),
        // so the thread with one program more also holds the short one:
        // at two threads, 13 such programs split 6 + 6.25, not 7 + 5.25.
        let share = |t: IntValue<'ctx>| -> R<IntValue<'ctx>> {
            let scaled = g.b.build_int_mul(t, g.i64c(total), "scaled")?;
            let part = g.b.build_int_unsigned_div(scaled, nt, "part")?;
            Ok(g.b.build_int_add(lo_v, part, "bound")?)
        };
        let first = share(tid)?;
        let end = share(g.b.build_int_add(tid, g.i64c(1), "next")?)?;
        body(&mut g, first, end, tid, &extra_in)?;
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
    /// values of `captures` and `extra`, runs it on the OpenMP runtime's
    /// threads (`threads`, when the runtime is linked) or here, and fails
    /// with the status it recorded, if any.
    pub(super) fn launch(
        &mut self,
        outlined: FunctionValue<'ctx>,
        captures: &[I::Value],
        extra: &[BasicValueEnum<'ctx>],
        threads: bool,
    ) -> R<()> {
        let (ctx, i64t, i32t) = (self.ctx, self.ctx.i64_type(), self.ctx.i32_type());
        let mut values: Vec<BasicValueEnum<'ctx>> =
            captures.iter().map(|v| self.get(*v)).collect::<R<_>>()?;
        values.extend_from_slice(extra);
        let frame_ty = i64t.array_type(values.len() as u32 + 1);
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
            self.b
                .build_call(
                    helper,
                    &[
                        outlined.as_global_value().as_pointer_value().into(),
                        frame.into(),
                        status_slot.into(),
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
    /// i32 *status)`: clears `*status`, runs `body(frame)` on the OpenMP
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
        let f = self.module.add_function(
            NAME,
            i32t.fn_type(&[ptr.into(), ptr.into(), ptr.into()], false),
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
        let (body, frame, status) = (param(0)?, param(1)?, param(2)?);
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
        b.position_at_end(entry);
        b.build_store(status, i32t.const_zero())?;
        let linked = b.build_is_not_null(gomp.as_global_value().as_pointer_value(), "linked")?;
        b.build_conditional_branch(linked, linked_block, alone)?;
        // The runtime that defines `GOMP_parallel` defines this too.
        b.position_at_end(linked_block);
        let n = b
            .build_call(max_threads, &[], "max_threads")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::Llvm("omp_get_max_threads gives no value".into()))?
            .into_int_value();
        let many = b.build_int_compare(IntPredicate::SGT, n, i32t.const_int(1, false), "many")?;
        b.build_conditional_branch(many, pool, alone)?;
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
