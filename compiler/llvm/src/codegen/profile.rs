//! Kernel launches timed in the code (`JitOptions::profile`, `dlc bench
//! --profile`): each launch of a profiled module's host functions reads
//! the monotonic clock (`clock_gettime`, through the vDSO: tens of
//! nanoseconds) before and after the kernel and adds the nanoseconds and
//! one call to the launch's own counters, `{ns, calls}` (atomically: calls
//! of one function on several threads each add their own). The module
//! exports a table of its launches, `PREFIX.profile` (a name no entry
//! point can have): the number of launches, then for each a pointer to its
//! name (the C string `place|kernel|programs`: the op's source place, the
//! outlined function's name, the grid's programs) and to its counters,
//! which [`crate::Jit::profile`] reads and [`crate::Jit::reset_profile`]
//! zeroes. A kernel on the OpenMP runtime's threads is timed from its
//! launch to the return of its last thread, as the caller waits for it.

use std::cell::RefCell;
use std::rc::Rc;

use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::values::{BasicValue, IntValue};
use inkwell::{AddressSpace, AtomicOrdering, AtomicRMWBinOp};

use super::Gen;
use super::tile::TileIr;
use crate::{CodegenError, R};

/// The launches of a module being profiled, in the order their counters
/// are numbered: each one's name (see the module's documentation).
#[derive(Clone, Default)]
pub(crate) struct Profile(Rc<RefCell<Vec<String>>>);

/// `clock_gettime`'s clock that never jumps (Linux's number, on every
/// architecture).
const CLOCK_MONOTONIC: u64 = 1;

/// The symbol of a module's table of launches.
pub(crate) fn table_symbol(prefix: &str) -> String {
    format!("{prefix}.profile")
}

/// The global of launch `k`'s counters.
fn counters_name(k: usize) -> String {
    format!("dlc.profile.{k}")
}

impl<'ctx> Gen<'ctx, '_, TileIr> {
    /// Kernel op `id` over `grid`, timed into counters of its own when the
    /// module is profiled.
    pub(super) fn launch_kernel(&mut self, id: dlc_tile::OpId, grid: &[usize]) -> R<()> {
        let Some(profile) = self.profile.clone() else {
            return self.kernel(id, grid).map(|_| ());
        };
        let before = self.clock()?;
        let k = profile.0.borrow().len();
        let i64t = self.ctx.i64_type();
        let counters = self
            .module
            .add_global(i64t.array_type(2), None, &counters_name(k));
        counters.set_initializer(&i64t.array_type(2).const_zero());
        counters.set_linkage(Linkage::Internal);
        let place = self
            .loc
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let programs = grid.iter().product::<usize>();
        let kernel = self
            .kernel(id, grid)?
            .map(|f| f.get_name().to_string_lossy().into_owned())
            .unwrap_or_default();
        let after = self.clock()?;
        let ns = self.b.build_int_sub(after, before, "ns")?;
        let slot = |i: u64| -> R<_> {
            // SAFETY (LLVM IR semantics): in bounds of the `[2 x i64]`.
            Ok(unsafe {
                self.b.build_in_bounds_gep(
                    i64t.array_type(2),
                    counters.as_pointer_value(),
                    &[self.i64c(0), self.i64c(i)],
                    "counter",
                )?
            })
        };
        for (i, add) in [(0, ns), (1, self.i64c(1))] {
            self.b.build_atomicrmw(
                AtomicRMWBinOp::Add,
                slot(i)?,
                add,
                AtomicOrdering::Monotonic,
            )?;
        }
        profile
            .0
            .borrow_mut()
            .push(format!("{place}|{kernel}|{programs}"));
        Ok(())
    }

    /// The monotonic clock, in nanoseconds.
    fn clock(&self) -> R<IntValue<'ctx>> {
        let (ctx, i64t) = (self.ctx, self.ctx.i64_type());
        let ptr = ctx.ptr_type(AddressSpace::default());
        let timespec = ctx.struct_type(&[i64t.into(), i64t.into()], false);
        let gettime = self.declare(
            "clock_gettime",
            ctx.i32_type()
                .fn_type(&[ctx.i32_type().into(), ptr.into()], false),
        );
        // In the entry block, so that a function of many launches does not
        // grow the stack.
        let ts = self.entry_alloca(timespec.into(), "timespec")?;
        let clock = ctx.i32_type().const_int(CLOCK_MONOTONIC, false);
        // It cannot fail for this clock.
        self.b.build_call(gettime, &[clock.into(), ts.into()], "")?;
        let field = |i: u32, name: &str| -> R<IntValue<'ctx>> {
            let p = self.b.build_struct_gep(timespec, ts, i, name)?;
            Ok(self.b.build_load(i64t, p, name)?.into_int_value())
        };
        let (s, ns) = (field(0, "s")?, field(1, "ns")?);
        let s = self.b.build_int_mul(s, self.i64c(1_000_000_000), "s_ns")?;
        Ok(self.b.build_int_add(s, ns, "now")?)
    }
}

/// Defines `module`'s table of launches, `table_symbol(prefix)`, from
/// `profile`'s (after every function is emitted).
pub(crate) fn define_table<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    prefix: &str,
    profile: &Profile,
) -> R<()> {
    let sites = profile.0.borrow();
    let (i64t, ptr) = (ctx.i64_type(), ctx.ptr_type(AddressSpace::default()));
    let entry = ctx.struct_type(&[ptr.into(), ptr.into()], false);
    let entries: Vec<_> = sites
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let text = ctx.const_string(name.as_bytes(), true);
            let g = module.add_global(text.get_type(), None, "dlc.profile.name");
            g.set_initializer(&text);
            g.set_constant(true);
            g.set_linkage(Linkage::Private);
            let counters = module.get_global(&counters_name(k)).ok_or_else(|| {
                CodegenError::Invalid(format!("launch {k}'s counters are not in the module"))
            })?;
            Ok(entry.const_named_struct(&[
                g.as_pointer_value().as_basic_value_enum(),
                counters.as_pointer_value().as_basic_value_enum(),
            ]))
        })
        .collect::<R<_>>()?;
    let count = i64t.const_int(sites.len() as u64, false);
    let table = ctx.const_struct(
        &[
            count.into(),
            entry.const_array(&entries).as_basic_value_enum(),
        ],
        false,
    );
    let g = module.add_global(table.get_type(), None, &table_symbol(prefix));
    g.set_initializer(&table);
    g.set_constant(true);
    Ok(())
}
