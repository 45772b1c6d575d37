//! A tile module as an optimized LLVM module for the host, and the
//! artifacts made from it: LLVM IR text, assembly, object files, shared
//! libraries.

use std::collections::HashMap;

use crate::abi::entry_wrapper;
use crate::codegen::profile::Profile;
use crate::codegen::tile::TileIr;
use crate::codegen::{Ir, Sites};
use crate::target;
use crate::{CodegenError, R};
use dlc_core::TargetDesc;
use dlc_runtime::abi::{Signature, Site, Symbols};
use dlc_tile::Module as TModule;
use inkwell::FloatPredicate;
use inkwell::attributes::AttributeLoc;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::TargetMachine;

/// IR that code generation reads: tile IR (`dlc_tile::Module`) scheduled
/// for the host. Every function of it becomes a C-ABI function.
pub trait Program: Sync {
    /// The runtime signature of function `name` (no failure sites).
    fn signature_of(&self, name: &str) -> R<Signature>;
    /// Emits every function, its `SYM.entry` wrapper and its
    /// `SYM.signature` into `module`, with vectors of `target`'s width,
    /// with every kernel launch timed when `profile` (and the table of
    /// launches, `codegen::profile`); returns each function's failure
    /// sites by name.
    #[doc(hidden)]
    fn emit_functions<'ctx>(
        &self,
        ctx: &'ctx Context,
        module: &Module<'ctx>,
        symbols: &Symbols,
        target: &TargetDesc,
        profile: bool,
    ) -> R<HashMap<String, Vec<Site>>>;
}

/// A function emitted under `symbol` with `params` pointer parameters:
/// its entry wrapper and signature global.
fn export<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    func: inkwell::values::FunctionValue<'ctx>,
    symbol: &str,
    params: usize,
    sig: R<Signature>,
    sites: &Sites,
) -> R<Vec<Site>> {
    entry_wrapper(ctx, module, params, func, symbol)?;
    let sites = sites.borrow().clone();
    if let Ok(mut sig) = sig {
        sig.sites = sites.clone();
        let text = ctx.const_string(sig.encode().as_bytes(), true);
        let global = module.add_global(text.get_type(), None, &format!("{symbol}.signature"));
        global.set_initializer(&text);
        global.set_constant(true);
    }
    Ok(sites)
}

/// Function `name` of `functions`.
fn find<'m, I: Ir>(functions: &'m [I::Function], name: &str) -> R<&'m I::Function> {
    functions
        .iter()
        .find(|f| I::name(f) == name)
        .ok_or_else(|| CodegenError::Arguments(format!("no function `@{name}`")))
}

/// [`Program::emit_functions`] for functions of IR `I`.
fn emit_all<'ctx, I: Ir>(
    functions: &[I::Function],
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    symbols: &Symbols,
    target: &TargetDesc,
    profile: bool,
) -> R<HashMap<String, Vec<Site>>> {
    let mut all = HashMap::new();
    let launches = profile.then(Profile::default);
    for f in functions {
        let symbol = symbols.symbol(I::name(f)).map_err(CodegenError::Symbol)?;
        let sites = Sites::default();
        let func = I::emit(
            ctx,
            module,
            f,
            functions,
            symbols,
            &sites,
            target,
            launches.as_ref(),
        )?;
        // The preparer named by its symbol, as a loaded library finds it.
        let sig = I::signature(f).and_then(|mut sig| {
            if let Some(p) = &sig.prepare {
                sig.prepare = Some(symbols.symbol(p).map_err(CodegenError::Symbol)?);
            }
            Ok(sig)
        });
        let sites = export(ctx, module, func, &symbol, I::arity(f), sig, &sites)?;
        all.insert(I::name(f).to_string(), sites);
    }
    if let Some(launches) = &launches {
        crate::codegen::profile::define_table(ctx, module, symbols.prefix(), launches)?;
    }
    Ok(all)
}

impl Program for TModule {
    fn signature_of(&self, name: &str) -> R<Signature> {
        TileIr::signature(find::<TileIr>(&self.functions, name)?)
    }

    fn emit_functions<'ctx>(
        &self,
        ctx: &'ctx Context,
        module: &Module<'ctx>,
        symbols: &Symbols,
        target: &TargetDesc,
        profile: bool,
    ) -> R<HashMap<String, Vec<Site>>> {
        emit_all::<TileIr>(&self.functions, ctx, module, symbols, target, profile)
    }
}

/// An LLVM module compiled from tile IR, with the target machine
/// it is for.
pub struct Compiled<'ctx> {
    /// The optimized module.
    pub module: Module<'ctx>,
    machine: TargetMachine,
}

/// Compiles tile IR for `target`'s CPU (`TargetDesc::host()`: this
/// machine) and optimizes it (O3); entry point `f` is exported as
/// `symbols.symbol(f)`, every other function is private.
pub fn compile<'ctx, P: Program + ?Sized>(
    ctx: &'ctx Context,
    m: &P,
    symbols: &Symbols,
    target: &TargetDesc,
) -> R<Compiled<'ctx>> {
    let (module, machine, _) = build(ctx, m, symbols, target, false)?;
    optimize(&module, &machine)?;
    Ok(Compiled { module, machine })
}

/// The unoptimized, verified LLVM module of `m` for `target`'s CPU (its
/// kernel launches timed with `profile`), the target machine it is for,
/// and each function's failure sites.
pub(crate) fn build<'ctx, P: Program + ?Sized>(
    ctx: &'ctx Context,
    m: &P,
    symbols: &Symbols,
    target: &TargetDesc,
    profile: bool,
) -> R<(Module<'ctx>, TargetMachine, HashMap<String, Vec<Site>>)> {
    if target.cpu().is_none() {
        return Err(CodegenError::Unsupported(format!(
            "`{}` is not a CPU: this back end compiles for x86-64 CPUs",
            target.name
        )));
    }
    let machine = target::machine(target)?;
    let module = ctx.create_module("dlc");
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    let all_sites = m.emit_functions(ctx, &module, symbols, target, profile)?;
    define_bf16_truncation(ctx, &module)?;
    let attributes = target::function_attributes(target);
    for func in module.get_functions() {
        if func.count_basic_blocks() == 0 {
            continue;
        }
        for (k, v) in &attributes {
            func.add_attribute(AttributeLoc::Function, ctx.create_string_attribute(k, v));
        }
    }
    module
        .verify()
        .map_err(|e| CodegenError::Llvm(format!("generated IR is invalid: {e}")))?;
    Ok((module, machine, all_sites))
}

/// Runs LLVM's O3 pipeline over `module`.
pub(crate) fn optimize(module: &Module<'_>, machine: &TargetMachine) -> R<()> {
    // Tile IR says what is unrolled: a tile is already unrolled into its
    // vectors, and its loops are the schedule's. LLVM's unroller would copy
    // packing and epilogue loops for no measurable speed (within noise on
    // W1..W8) and a third more compile time (ResNet-18: LLVM 0.41 -> 1.83
    // s). Short loops carrying a sum (a window's taps) are written out by
    // the code generator instead (`codegen::tile::unrolled_trips`).
    let options = PassBuilderOptions::create();
    options.set_loop_unrolling(false);
    module
        .run_passes("default<O3>", machine, options)
        .map_err(|e| CodegenError::Llvm(e.to_string()))
}

/// LLVM rounds f32 to bfloat with a call to `__truncsfbf2` on CPUs without
/// AVX512-BF16, and the libgcc of GCC 12 (Debian 12) has no such function:
/// each module carries its own (weak, hidden: a real one wins), rounding to
/// nearest even and keeping NaNs quiet.
pub(crate) fn define_bf16_truncation<'ctx>(ctx: &'ctx Context, module: &Module<'ctx>) -> R<()> {
    let (f32t, i32t) = (ctx.f32_type(), ctx.i32_type());
    let f = module.add_function(
        "__truncsfbf2",
        ctx.bf16_type().fn_type(&[f32t.into()], false),
        Some(Linkage::WeakAny),
    );
    f.as_global_value()
        .set_visibility(inkwell::GlobalVisibility::Hidden);
    let b = ctx.create_builder();
    b.position_at_end(ctx.append_basic_block(f, "entry"));
    let x = f
        .get_first_param()
        .ok_or_else(|| CodegenError::Invalid("__truncsfbf2 without parameter".into()))?
        .into_float_value();
    let bits = b.build_bit_cast(x, i32t, "bits")?.into_int_value();
    let c = |v: u64| i32t.const_int(v, false);
    let high = b.build_right_shift(bits, c(16), false, "high")?;
    let lsb = b.build_and(high, c(1), "lsb")?;
    let bias = b.build_int_add(lsb, c(0x7fff), "bias")?;
    let rounded = b.build_int_add(bits, bias, "rounded")?;
    let rounded = b.build_right_shift(rounded, c(16), false, "rounded")?;
    let quiet = b.build_or(high, c(0x40), "quiet")?;
    let nan = b.build_float_compare(FloatPredicate::UNO, x, x, "nan")?;
    let r = b.build_select(nan, quiet, rounded, "r")?.into_int_value();
    let r = b.build_int_truncate(r, ctx.i16_type(), "r16")?;
    let r = b.build_bit_cast(r, ctx.bf16_type(), "bf")?;
    b.build_return(Some(&r))?;
    Ok(())
}

impl Compiled<'_> {
    /// The target machine the module was compiled for.
    pub fn machine(&self) -> &TargetMachine {
        &self.machine
    }
}

/// The optimized LLVM IR of a module for `target`, as text.
pub fn emit_llvm_ir<P: Program + ?Sized>(
    m: &P,
    symbols: &Symbols,
    target: &TargetDesc,
) -> R<String> {
    let ctx = Context::create();
    let c = compile(&ctx, m, symbols, target)?;
    Ok(c.module.print_to_string().to_string())
}

/// Native assembly (`asm`) or an object file for `target`.
pub fn emit_native<P: Program + ?Sized>(
    m: &P,
    object: bool,
    symbols: &Symbols,
    target: &TargetDesc,
) -> R<Vec<u8>> {
    let ctx = Context::create();
    let c = compile(&ctx, m, symbols, target)?;
    let kind = if object {
        inkwell::targets::FileType::Object
    } else {
        inkwell::targets::FileType::Assembly
    };
    let buf = c
        .machine
        .write_to_memory_buffer(&c.module, kind)
        .map_err(|e| CodegenError::Llvm(e.to_string()))?;
    Ok(buf.as_slice().to_vec())
}

/// Links a module into a shared library at `path` with the system's C
/// compiler (`$CC`, else `cc`), against libm and the OpenMP runtime.
pub fn emit_shared_library<P: Program + ?Sized>(
    m: &P,
    path: &std::path::Path,
    symbols: &Symbols,
    target: &TargetDesc,
) -> R<()> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    with_object(m, symbols, target, |obj| {
        run_tool(
            std::process::Command::new(&cc)
                .arg("-shared")
                .arg("-o")
                .arg(path)
                .arg(obj)
                // The library needs the OpenMP runtime even though it only
                // refers to it weakly (a program that links it itself may
                // run without it): `--as-needed`, the default of Debian's
                // and Ubuntu's linkers, would drop it, and a process that
                // loads the library without OpenMP of its own (Python's
                // ctypes) would run every kernel on one thread.
                .args([
                    "-lm",
                    "-Wl,--push-state,--no-as-needed",
                    "-lgomp",
                    "-Wl,--pop-state",
                ]),
            &format!("the C compiler `{cc}` (`-shared`)"),
        )
    })
}

/// Writes a module as a static library (an `ar` archive of its object
/// file, with a symbol index) at `path`, with the system's archiver
/// (`$AR`, else `ar`, from binutils). A program linking it also links
/// `-lm`, and `-lgomp` for kernels on threads (without it they run on the
/// calling thread).
pub fn emit_static_library<P: Program + ?Sized>(
    m: &P,
    path: &std::path::Path,
    symbols: &Symbols,
    target: &TargetDesc,
) -> R<()> {
    let ar = std::env::var("AR").unwrap_or_else(|_| "ar".into());
    // `ar r` adds to an archive that exists: start from none.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(CodegenError::Link(format!("{}: {e}", path.display()))),
    }
    with_object(m, symbols, target, |obj| {
        run_tool(
            std::process::Command::new(&ar)
                .arg("rcsD")
                .arg(path)
                .arg(obj),
            &format!("the archiver `{ar}`"),
        )
    })
}

/// Runs `f` on the module's object file, written to a fresh temporary
/// directory removed afterwards.
fn with_object<P: Program + ?Sized>(
    m: &P,
    symbols: &Symbols,
    target: &TargetDesc,
    f: impl FnOnce(&std::path::Path) -> R<()>,
) -> R<()> {
    let object = emit_native(m, true, symbols, target)?;
    let dir = scratch_dir()?;
    let obj = dir.join("module.o");
    let result = std::fs::write(&obj, &object)
        .map_err(|e| CodegenError::Link(format!("{}: {e}", obj.display())))
        .and_then(|()| f(&obj));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A fresh temporary directory (the caller removes it).
fn scratch_dir() -> R<std::path::PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "dlc-link-{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| CodegenError::Link(format!("{}: {e}", dir.display())))?;
    Ok(dir)
}

/// Runs a linking tool, its failure (or absence) as a link error naming it.
fn run_tool(cmd: &mut std::process::Command, what: &str) -> R<()> {
    let out = cmd
        .output()
        .map_err(|e| CodegenError::Link(format!("cannot run {what}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(CodegenError::Link(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The LLVM back end as the driver's code generator: what
/// `dlc_driver::compile` calls for machine code.
#[derive(Debug, Clone, Copy, Default)]
pub struct Llvm;

impl dlc_driver::CodeGenerator for Llvm {
    fn gpu_program(
        &self,
        module: &TModule,
        symbols: &Symbols,
        target: &TargetDesc,
    ) -> Result<dlc_runtime::gpu::GpuProgram, String> {
        crate::gpu::compile_gpu(module, symbols, target).map_err(|e| e.to_string())
    }

    fn emit(
        &self,
        module: &TModule,
        what: dlc_driver::NativeArtifact,
        symbols: &Symbols,
        target: &TargetDesc,
    ) -> Result<Vec<u8>, String> {
        use dlc_driver::NativeArtifact as A;
        let library = |link: fn(&TModule, &std::path::Path, &Symbols, &TargetDesc) -> R<()>| {
            let dir = scratch_dir()?;
            let path = dir.join("library");
            let result = link(module, &path, symbols, target).and_then(|()| {
                std::fs::read(&path)
                    .map_err(|e| CodegenError::Link(format!("{}: {e}", path.display())))
            });
            let _ = std::fs::remove_dir_all(&dir);
            result
        };
        if target.gpu().is_some() != (what == A::Ptx) {
            return Err(if what == A::Ptx {
                format!(
                    "PTX is made for a GPU target (--target sm_80 or sm_90), not {}",
                    target.name
                )
            } else {
                format!(
                    "{} compiles to PTX (--emit ptx); --emit llvm, asm, obj, so and lib are for CPUs",
                    target.name
                )
            });
        }
        match what {
            A::Ptx => crate::gpu::compile_gpu(module, symbols, target).map(|p| p.ptx.into_bytes()),
            A::LlvmIr => emit_llvm_ir(module, symbols, target).map(String::into_bytes),
            A::Assembly => emit_native(module, false, symbols, target),
            A::Object => emit_native(module, true, symbols, target),
            A::SharedLibrary => library(emit_shared_library::<TModule>),
            A::StaticLibrary => library(emit_static_library::<TModule>),
        }
        .map_err(|e| e.to_string())
    }
}
