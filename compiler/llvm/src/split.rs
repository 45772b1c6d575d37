//! An LLVM module cut into parts that are optimized and compiled to
//! machine code on threads of their own (LLVM's time is most of a cold
//! compile, and the kernels of a model are independent functions).
//!
//! Every worker builds the whole module in a context of its own (emission
//! is a small share of the time) and keeps the definitions of its part:
//! every other function, and every global that must exist once, becomes a
//! declaration its part's object file refers to, and the JIT links the
//! parts. The partition is computed from the module alone, the largest
//! function first onto the part with the fewest instructions so far, so
//! that every worker computes the same one.
//!
//! # In detail
//!
//! **Compiling on every core** (`split.rs`, `orc.rs`). LLVM's IR passes and machine
//! code generation are most of a cold compile, and a model's kernels are independent
//! functions, so `jit` compiles a module in parts, one per core (at most 8), each on a
//! thread of its own with its own LLVM context. Every worker emits the whole module
//! (emission is a small part of LLVM's time: performance.md) and computes the same partition from it: the
//! functions, largest first, onto the part with the least work so far, a function's
//! work being its instructions with those on vectors counted five times. A worker keeps its part's definitions and turns the rest into declarations
//! of the same name (private definitions it keeps become hidden, so the other parts
//! can name them); globals that must exist once (the workspace caches, the exported
//! signatures) are defined by part 0, private constants by every part that uses them.
//! The host functions (each entry point's: the workspace, frames, kernel launches and
//! statuses, compiled as written, `optnone`) are one more part of their own, whose
//! machine code is generated without optimization (`CodeGenOpt::None`): W7's training
//! step launches 1,107 kernels from one function of 36,000 instructions, on which the
//! greedy register allocator and instruction selection spent 0.8 s of a 1.2 s compile
//! (0.13 s without; the kernels it launches are where the time goes at run time).
//! Each part runs through `default<O3>` and becomes an object file, and ORC's `LLJIT`
//! (through llvm-sys: inkwell wraps only MCJIT, which compiles one module on the
//! calling thread) links the objects in process, resolving the C library, libm and the
//! OpenMP runtime in the process; every entry point is looked up before the compile
//! clock stops. Latency is unchanged (no call crosses from one kernel into another;
//! the host function calls kernels through the OpenMP runtime either way). Object files,
//! assembly and libraries (`emit_native`, `--emit so|lib`) are still one module on
//! one thread: their symbols must not collide with another model's in a static link.
//! If the workers' modules ever disagree (code generation that depends on hash order:
//! W7's workspace was placed in `HashMap` order until this was found, and a test now
//! compiles W7 twice in two processes and compares the bytes), `jit` sees that the
//! parts do not define each function exactly once and compiles the module as one part.

use std::collections::HashMap;

use crate::{CodegenError, R};
use inkwell::GlobalVisibility;
use inkwell::attributes::AttributeLoc;
use inkwell::module::{Linkage, Module};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{FunctionValue, GlobalValue, InstructionValue};

/// Which part defines each function (by name), and how many parts there
/// are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Partition {
    owner: HashMap<String, usize>,
    parts: usize,
    /// Whether part 0 holds the `optnone` functions alone (see
    /// [`Partition::of`]).
    unoptimized_part: bool,
}

impl Partition {
    /// Up to `parts` parts of `module`'s defined functions, balanced by
    /// instruction count: never more parts than functions, at least one.
    /// The functions marked `optnone` (the host functions, which only
    /// orchestrate kernels), when there are others and they weigh at least
    /// a part's share (of `parts + 1`), are one more part of their own, part 0, compiled without optimizing machine code
    /// ([`Partition::unoptimized`]): W7's training step has one host
    /// function of 36,000 instructions (1,107 kernel launches), on which
    /// LLVM's greedy register allocator and instruction selection took 0.8
    /// s of a 1.2 s compile, and 0.13 s without.
    pub(crate) fn of(module: &Module<'_>, parts: usize) -> Partition {
        let (orchestration, rest): (Vec<FunctionValue<'_>>, Vec<FunctionValue<'_>>) =
            defined(module).partition(|f| {
                f.get_enum_attribute(AttributeLoc::Function, optnone())
                    .is_some()
            });
        // Only where they would be a part's worth anyway: a small host
        // function is not worth a thread building the whole module.
        let heavy = orchestration.iter().map(|&f| size(f)).sum::<usize>() * (parts.max(1) + 1)
            >= defined(module).map(size).sum::<usize>();
        if heavy && !orchestration.is_empty() && !rest.is_empty() {
            let mut p = Self::balanced(rest, parts);
            for part in p.owner.values_mut() {
                *part += 1;
            }
            for f in orchestration {
                p.owner.insert(name(f.as_global_value()), 0);
            }
            p.parts += 1;
            p.unoptimized_part = true;
            return p;
        }
        Self::balanced(defined(module).collect(), parts)
    }

    /// Whether part `part` holds only functions compiled as written, whose
    /// machine code is not optimized either.
    pub(crate) fn unoptimized(&self, part: usize) -> bool {
        self.unoptimized_part && part == 0
    }

    /// Up to `parts` parts of `functions`, balanced by instruction count.
    fn balanced(functions: Vec<FunctionValue<'_>>, parts: usize) -> Partition {
        let mut sized: Vec<(usize, String)> = functions
            .into_iter()
            .map(|f| (size(f), name(f.as_global_value())))
            .collect();
        let parts = parts.clamp(1, sized.len().max(1));
        // Largest first; ties by name, so that the order is the module's
        // content and not its iteration order.
        sized.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let mut load = vec![0usize; parts];
        let mut owner = HashMap::new();
        for (size, name) in sized {
            let lightest = (0..parts).min_by_key(|&p| (load[p], p)).unwrap_or(0);
            load[lightest] += size.max(1);
            owner.insert(name, lightest);
        }
        Partition {
            owner,
            parts,
            unoptimized_part: false,
        }
    }

    /// How many parts there are.
    pub(crate) fn parts(&self) -> usize {
        self.parts
    }

    /// The part that defines function `name`, if it is defined.
    #[cfg(test)]
    pub(crate) fn owner(&self, name: &str) -> Option<usize> {
        self.owner.get(name).copied()
    }

    /// Reduces `module` (built as the partition was computed from) to part
    /// `part`: the functions of other parts become declarations, and so do
    /// the globals that must exist once (variables, and constants other
    /// parts may name), which part 0 defines. What stays is visible to the
    /// other parts (hidden from anything outside the link).
    pub(crate) fn keep(&self, module: &Module<'_>, part: usize) -> R<()> {
        if self.parts == 1 {
            return Ok(());
        }
        let functions: Vec<FunctionValue<'_>> = defined(module).collect();
        for f in functions {
            let n = name(f.as_global_value());
            let owner = self.owner.get(&n).copied().ok_or_else(|| {
                CodegenError::Invalid(format!("function `{n}` is not in the partition"))
            })?;
            if owner == part {
                share(f.as_global_value(), f.get_linkage());
            } else {
                declare_function(module, f, &n);
            }
        }
        let once: Vec<GlobalValue<'_>> = module
            .get_globals()
            .filter(|g| {
                g.get_initializer().is_some()
                    && !(g.is_constant()
                        && matches!(g.get_linkage(), Linkage::Private | Linkage::Internal))
            })
            .collect();
        for g in once {
            if part == 0 {
                share(g, g.get_linkage());
            } else {
                declare_global(module, g)?;
            }
        }
        Ok(())
    }
}

/// What an instruction costs LLVM, relative to a scalar one: vector
/// instructions take about 5 times as long through instruction combining,
/// selection and register allocation (W7: 4,154 scalar instructions of its
/// host function took 0.10 s, 4,000 of its kernels, 1,800 of them on
/// vectors, 0.27 s).
fn weight(i: InstructionValue<'_>) -> usize {
    let vector = i.get_type().is_vector_type()
        || (0..i.get_num_operands()).any(|k| {
            i.get_operand(k)
                .and_then(|o| o.value())
                .is_some_and(|v| v.get_type().is_vector_type())
        });
    if vector { 5 } else { 1 }
}

/// What function `f` costs LLVM: its instructions by [`weight`].
fn size(f: FunctionValue<'_>) -> usize {
    f.get_basic_block_iter()
        .flat_map(|b| b.get_instructions())
        .map(weight)
        .sum()
}

/// LLVM's `optnone` attribute.
fn optnone() -> u32 {
    inkwell::attributes::Attribute::get_named_enum_kind_id("optnone")
}

/// The functions `module` defines.
fn defined<'ctx>(module: &Module<'ctx>) -> impl Iterator<Item = FunctionValue<'ctx>> {
    module
        .get_functions()
        .filter(|f| f.count_basic_blocks() > 0)
}

fn name(g: GlobalValue<'_>) -> String {
    g.get_name().to_string_lossy().into_owned()
}

/// A private definition made nameable from the other parts of the link.
fn share(g: GlobalValue<'_>, linkage: Linkage) {
    if matches!(linkage, Linkage::Private | Linkage::Internal) {
        g.set_linkage(Linkage::External);
        g.set_visibility(GlobalVisibility::Hidden);
    }
}

/// Replaces definition `f` by a declaration of the same name and type.
fn declare_function<'ctx>(module: &Module<'ctx>, f: FunctionValue<'ctx>, name: &str) {
    f.as_global_value().set_name(&format!("{name}.elsewhere"));
    let decl = module.add_function(name, f.get_type(), Some(Linkage::External));
    f.replace_all_uses_with(decl);
    // SAFETY: every use now refers to `decl`; nothing refers to `f`.
    unsafe { f.delete() };
}

/// Replaces global definition `g` by a declaration of the same name and
/// type.
fn declare_global<'ctx>(module: &Module<'ctx>, g: GlobalValue<'ctx>) -> R<()> {
    let n = name(g);
    let ty = BasicTypeEnum::try_from(g.get_value_type())
        .map_err(|()| CodegenError::Invalid(format!("global `{n}` of a non-basic type")))?;
    g.set_name(&format!("{n}.elsewhere"));
    let decl = module.add_global(ty, None, &n);
    decl.set_linkage(Linkage::External);
    decl.set_constant(g.is_constant());
    g.as_pointer_value()
        .replace_all_uses_with(decl.as_pointer_value());
    // SAFETY: every use now refers to `decl`; nothing refers to `g`.
    unsafe { g.delete() };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use inkwell::context::Context;

    /// A module of `sizes.len()` functions, function `f{i}` of
    /// `sizes[i]` additions, each calling the next, and a global variable
    /// the first one writes.
    fn module<'ctx>(ctx: &'ctx Context, sizes: &[usize]) -> Module<'ctx> {
        let m = ctx.create_module("split");
        let i64t = ctx.i64_type();
        let counter = m.add_global(i64t, None, "counter");
        counter.set_linkage(Linkage::Internal);
        counter.set_initializer(&i64t.const_zero());
        let fns: Vec<FunctionValue<'_>> = (0..sizes.len())
            .map(|i| {
                m.add_function(
                    &format!("f{i}"),
                    i64t.fn_type(&[i64t.into()], false),
                    Some(Linkage::Private),
                )
            })
            .collect();
        let b = ctx.create_builder();
        for (i, (&f, &n)) in fns.iter().zip(sizes).enumerate() {
            b.position_at_end(ctx.append_basic_block(f, "entry"));
            let mut x = f.get_first_param().unwrap().into_int_value();
            for k in 0..n {
                x = b
                    .build_int_add(x, i64t.const_int(k as u64 + 1, false), "x")
                    .unwrap();
            }
            if i == 0 {
                b.build_store(counter.as_pointer_value(), x).unwrap();
            }
            if let Some(&next) = fns.get(i + 1) {
                x = b
                    .build_call(next, &[x.into()], "next")
                    .unwrap()
                    .try_as_basic_value()
                    .basic()
                    .unwrap()
                    .into_int_value();
            }
            b.build_return(Some(&x)).unwrap();
        }
        m.verify().unwrap();
        m
    }

    #[test]
    fn parts_are_balanced_and_never_more_than_the_functions() {
        let ctx = Context::create();
        let m = module(&ctx, &[100, 45, 40, 10]);
        let p = Partition::of(&m, 2);
        assert_eq!(p.parts(), 2);
        // 100 alone against 45 + 40 + 10 (sizes count calls, stores and
        // returns too: 103 against 100).
        assert_eq!(p.owner("f0"), Some(0));
        assert_eq!([p.owner("f1"), p.owner("f2"), p.owner("f3")], [Some(1); 3]);
        assert_eq!(Partition::of(&m, 16).parts(), 4);
        assert_eq!(Partition::of(&m, 0).parts(), 1);
    }

    #[test]
    fn optnone_functions_are_a_part_of_their_own() {
        let ctx = Context::create();
        let m = module(&ctx, &[100, 45, 40, 10]);
        let f0 = m.get_function("f0").unwrap();
        for a in ["noinline", "optnone"] {
            let kind = inkwell::attributes::Attribute::get_named_enum_kind_id(a);
            f0.add_attribute(AttributeLoc::Function, ctx.create_enum_attribute(kind, 0));
        }
        // The host function alone in part 0, unoptimized; the others
        // balanced over the parts asked for, after it.
        let p = Partition::of(&m, 2);
        assert_eq!(p.parts(), 3);
        assert_eq!(p.owner("f0"), Some(0));
        assert!(p.unoptimized(0) && !p.unoptimized(1) && !p.unoptimized(2));
        assert_eq!(
            [p.owner("f1"), p.owner("f2"), p.owner("f3")],
            [Some(1), Some(2), Some(2)]
        );
        // On one core too: two parts.
        let p = Partition::of(&m, 1);
        assert_eq!(
            (p.parts(), p.owner("f0"), p.owner("f3")),
            (2, Some(0), Some(1))
        );
        // Nothing is unoptimized where every function is optnone or none is,
        // or where the optnone ones weigh less than a part's share.
        assert!(!Partition::of(&module(&ctx, &[5, 5]), 2).unoptimized(0));
        let m = module(&ctx, &[100, 45, 40, 10]);
        let f3 = m.get_function("f3").unwrap();
        let kind = inkwell::attributes::Attribute::get_named_enum_kind_id("optnone");
        f3.add_attribute(AttributeLoc::Function, ctx.create_enum_attribute(kind, 0));
        let p = Partition::of(&m, 2);
        assert!(p.parts() == 2 && !p.unoptimized(0), "{p:?}");
    }

    #[test]
    fn each_function_and_variable_is_defined_by_exactly_one_part() {
        let sizes = [30, 20, 20, 5, 1];
        let mut defined_by = HashMap::<String, Vec<usize>>::new();
        for part in 0..3 {
            let ctx = Context::create();
            let m = module(&ctx, &sizes);
            let p = Partition::of(&m, 3);
            p.keep(&m, part).unwrap();
            m.verify().unwrap();
            for f in m.get_functions() {
                let n = name(f.as_global_value());
                assert!(!n.ends_with(".elsewhere"), "{n} left behind");
                if f.count_basic_blocks() > 0 {
                    assert_eq!(f.get_linkage(), Linkage::External);
                    defined_by.entry(n).or_default().push(part);
                }
            }
            for g in m.get_globals() {
                if g.get_initializer().is_some() {
                    defined_by.entry(name(g)).or_default().push(part);
                }
            }
            // Calls into other parts go to declarations of the same name.
            for i in 0..sizes.len() {
                assert!(m.get_function(&format!("f{i}")).is_some());
            }
        }
        let mut names: Vec<_> = defined_by.keys().cloned().collect();
        names.sort();
        assert_eq!(names, ["counter", "f0", "f1", "f2", "f3", "f4"]);
        for (n, parts) in defined_by {
            assert_eq!(parts.len(), 1, "{n} defined by parts {parts:?}");
        }
    }
}
