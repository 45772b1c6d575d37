//! The whole pipeline, from source (or graph IR) to any artifact, as one
//! call: [`compile`] with [`CompileOptions`].
//!
//! Machine code comes from a [`CodeGenerator`] and upstream MLIR from an
//! [`MlirConverter`], which this crate only names: the LLVM crate
//! implements the first (`dlc_llvm::Llvm`) and the MLIR crate the second
//! (`dlc_mlir::Mlir`), so the driver, and every test binary that links it
//! without wanting code, stays free of LLVM and MLIR. Callers hand them in
//! as [`Backends`].

use dlc_core::{PassReport, TargetDesc};
use dlc_graph::{Module, Visibility};
use dlc_runtime::abi::{Signature, Symbols};

use crate::{DriverError, PassOptions, SourceText};

/// What [`compile`] produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Artifact {
    /// Graph dialect text, after the pipeline.
    Graph,
    /// Graph dialect in MLIR's generic operation syntax.
    GraphMlir,
    /// Loop dialect text.
    Loop,
    /// Loop dialect in MLIR's generic operation syntax.
    LoopMlir,
    /// Tile dialect text, scheduled for [`CompileOptions::target`].
    Tile,
    /// Tile dialect in MLIR's generic operation syntax.
    TileMlir,
    /// Machine code: see [`NativeArtifact`].
    Native(NativeArtifact),
    /// A C header declaring the compiled entry points.
    CHeader,
    /// Safe Rust bindings of the compiled entry points (see
    /// [`crate::bindings`]); the program links the static library.
    RustBindings,
    /// The loop level in upstream MLIR dialects (`func`, `memref`, `scf`,
    /// `arith`, `math`), verified by MLIR: needs an [`MlirConverter`].
    Mlir,
    /// The tile level scheduled for [`CompileOptions::target`] in upstream
    /// MLIR dialects (tiles as `tensor`s), verified by MLIR.
    MlirTile,
    /// A GPU module file ([`dlc_runtime::module::GpuModule`]): the PTX,
    /// each entry point's launch plan and signature, and how `dlc-rt`
    /// draws its random inputs; for a GPU target, needs a code generator.
    GpuModule,
}

/// Artifacts made of machine code, which a [`CodeGenerator`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeArtifact {
    /// LLVM IR text, optimized.
    LlvmIr,
    /// Assembly text.
    Assembly,
    /// A relocatable object file.
    Object,
    /// A shared library (linked with the system's C compiler).
    SharedLibrary,
    /// A static library: an `ar` archive of the object file.
    StaticLibrary,
    /// PTX for an NVIDIA GPU target: the kernels, with comments saying
    /// what each entry point launches.
    Ptx,
}

impl Artifact {
    /// Whether the artifact is bytes rather than text.
    pub fn is_binary(self) -> bool {
        matches!(
            self,
            Artifact::GpuModule
                | Artifact::Native(
                    NativeArtifact::Object
                        | NativeArtifact::SharedLibrary
                        | NativeArtifact::StaticLibrary
                )
        )
    }
}

/// A code generator: tile IR scheduled for a CPU, to machine code.
pub trait CodeGenerator {
    /// Emits every function of `module` (entry point `f` exported as
    /// `symbols.symbol(f)`) as `what`, for `target`'s CPU.
    fn emit(
        &self,
        module: &dlc_tile::Module,
        what: NativeArtifact,
        symbols: &Symbols,
        target: &TargetDesc,
    ) -> Result<Vec<u8>, String>;

    /// Compiles every function of `module`, scheduled for GPU `target`, to
    /// PTX and each entry point's launch plan (kernels named after
    /// `symbols`).
    fn gpu_program(
        &self,
        module: &dlc_tile::Module,
        symbols: &Symbols,
        target: &TargetDesc,
    ) -> Result<dlc_runtime::gpu::GpuProgram, String>;
}

/// Converts loop and tile IR to upstream MLIR dialects, verified by MLIR.
pub trait MlirConverter {
    /// The loop module's text in upstream dialects.
    fn convert(&self, module: &dlc_loop::Module) -> Result<String, String>;
    /// The tile module's text in upstream dialects.
    fn convert_tile(&self, module: &dlc_tile::Module) -> Result<String, String>;
}

/// The back ends [`compile`] may call (none: IR and C/Rust declarations
/// only).
#[derive(Clone, Copy, Default)]
pub struct Backends<'a> {
    /// Makes machine code (`dlc_llvm::Llvm`).
    pub codegen: Option<&'a dyn CodeGenerator>,
    /// Writes upstream MLIR (`dlc_mlir::Mlir`).
    pub mlir: Option<&'a dyn MlirConverter>,
}

/// Options of [`compile`]: what `dlc compile` takes on its command line.
#[derive(Debug, Clone)]
pub struct CompileOptions {
    /// What to produce.
    pub emit: Artifact,
    /// Keep only these entry points (all when empty).
    pub entries: Vec<String>,
    /// The graph pipeline to run ([`crate::DEFAULT_PIPELINE`]).
    pub passes: String,
    /// Prefix of exported symbols; by default `dlc_STEM_` for a source named
    /// `STEM.dl` ([`Symbols::for_module`]).
    pub prefix: Option<String>,
    /// The target ([`dlc_core::TARGET_NAMES`]): what tile IR is scheduled
    /// for, and for a cross target (`aarch64-linux-gnu`) what machine code
    /// is made for.
    pub target: String,
    /// The x86-64 CPU machine code is for ([`TargetDesc::for_cpu`]:
    /// `native`, a level `x86-64`, `x86-64-v2/v3/v4`, or an LLVM CPU name).
    pub cpu: String,
    /// Name of the header's include guard (the source's stem by default).
    pub header_name: Option<String>,
    /// On a GPU target, f32 products on tensor cores as TF32 (operands
    /// rounded to 10 mantissa bits): faster, less exact.
    pub tf32: bool,
    /// Build the entry points' `weight` parameters into the artifact as
    /// constants, from a directory of `NAME.npy` or a `.safetensors` file
    /// ([`crate::bind_weights`]): they leave the signatures.
    pub weights: Option<std::path::PathBuf>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            emit: Artifact::Graph,
            entries: Vec::new(),
            passes: crate::DEFAULT_PIPELINE.into(),
            prefix: None,
            target: "host".into(),
            cpu: "native".into(),
            header_name: None,
            tf32: false,
            weights: None,
        }
    }
}

/// What [`compile`] made.
#[derive(Debug)]
pub struct Compilation {
    /// The artifact: UTF-8 text unless [`Artifact::is_binary`].
    pub bytes: Vec<u8>,
    /// Each pass's statistics.
    pub reports: Vec<PassReport>,
    /// The target machine code is for (unused for IR artifacts).
    pub target: TargetDesc,
}

/// The stem of an input's name (`model` for `dir/model.dl`, `stdin` for
/// standard input): what default symbol prefixes are made of.
pub fn module_stem(name: &str) -> String {
    if name == "<stdin>" {
        return "stdin".into();
    }
    std::path::Path::new(name)
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().into_owned())
}

/// The CPU machine code is for: a cross target's own CPU, else the x86-64
/// CPU `cpu` names.
pub fn code_target(target: &str, cpu: &str) -> Result<TargetDesc, DriverError> {
    cpu_of(&TargetDesc::named(target).map_err(DriverError::Usage)?, cpu)
}

/// [`code_target`] of the target `named` describes (a GPU target is its
/// own).
fn cpu_of(named: &TargetDesc, cpu: &str) -> Result<TargetDesc, DriverError> {
    if named.gpu().is_some() {
        if cpu != "native" {
            return Err(DriverError::Usage(format!(
                "--cpu {cpu} is an x86-64 CPU; --target {} compiles for a GPU",
                named.name
            )));
        }
        return Ok(named.clone());
    }
    match named.cpu().and_then(|c| c.triple.as_deref()) {
        Some(triple) if cpu != "native" => Err(DriverError::Usage(format!(
            "--cpu {cpu} is an x86-64 CPU; --target {triple} compiles for its own CPU"
        ))),
        Some(_) => Ok(named.clone()),
        None => TargetDesc::for_cpu(cpu).map_err(DriverError::Usage),
    }
}

/// Which CPUs code compiled for `target` runs on, in words.
pub fn runs_on(target: &TargetDesc) -> String {
    let cpu = target.cpu();
    match (
        cpu.and_then(|c| c.triple.as_deref()),
        cpu.and_then(|c| c.llvm_cpu.as_deref()),
    ) {
        (Some(triple), Some(level)) => format!("{triple} ({level}): any CPU of that target"),
        (None, Some(level)) => format!("{level}: it runs on any x86-64 CPU of that level"),
        _ => "the CPU of the machine that compiled it (`--cpu native`)".into(),
    }
}

/// Compiles `src` (dlc source or graph IR) to `options.emit`. Machine code
/// needs `backends.codegen`, upstream MLIR `backends.mlir`.
pub fn compile(
    src: &SourceText,
    options: &CompileOptions,
    backends: Backends<'_>,
) -> Result<Compilation, DriverError> {
    let prepared = prepare(src, options)?;
    let bytes = prepared.emit(options.emit, backends)?;
    Ok(Compilation {
        bytes,
        reports: prepared.reports,
        target: prepared.target,
    })
}

/// A module read, checked and through its passes, ready to be emitted as
/// any number of artifacts (a static library and its bindings) without
/// running the front end and the passes again.
pub struct Prepared {
    /// The graph module after the pipeline, with only the chosen entries.
    pub module: Module,
    /// Each pass's statistics.
    pub reports: Vec<PassReport>,
    /// The target machine code is for.
    pub target: TargetDesc,
    /// The target `--target` names (what tile artifacts are scheduled for).
    scheduled: TargetDesc,
    symbols: Symbols,
    source_name: String,
    header_name: Option<String>,
    /// Tile IR scheduled for `target`, made once on first use.
    tiles: std::cell::OnceCell<dlc_tile::Module>,
}

/// Reads `src` and runs `options`' pipeline; the options are checked
/// before any work.
pub fn prepare(src: &SourceText, options: &CompileOptions) -> Result<Prepared, DriverError> {
    prepare_with(src, options, |_| Ok(()))
}

/// [`prepare`], with `edit` run on the module as read, before its weights
/// are bound and its passes run: how a caller adds a function made from
/// the source's (a gradient, `dlc_graph::autodiff::add_grad_function`).
pub fn prepare_with(
    src: &SourceText,
    options: &CompileOptions,
    edit: impl FnOnce(&mut Module) -> Result<(), DriverError>,
) -> Result<Prepared, DriverError> {
    let mut scheduled = TargetDesc::named(&options.target).map_err(DriverError::Usage)?;
    if options.tf32 {
        if scheduled.gpu().is_none() {
            return Err(DriverError::Usage(format!(
                "--tf32 is for GPU targets (sm_80, sm_90), not {}",
                scheduled.name
            )));
        }
        scheduled = scheduled.with_tf32();
    }
    let target = cpu_of(&scheduled, &options.cpu)?;
    let symbols = match &options.prefix {
        Some(p) => Symbols::with_prefix(p).map_err(DriverError::Usage)?,
        None => Symbols::for_module(&module_stem(&src.name)),
    };
    let mut module = crate::load(src)?;
    edit(&mut module)?;
    if let Some(path) = &options.weights {
        crate::bind_weights(&mut module, &options.entries, path)?;
    }
    let passes = PassOptions {
        target: Some(&scheduled),
        ..PassOptions::default()
    };
    let reports = crate::run_passes(&mut module, &options.passes, passes)?;
    keep_entries(&mut module, &options.entries)?;
    Ok(Prepared {
        module,
        reports,
        target,
        scheduled,
        symbols,
        source_name: src.name.clone(),
        header_name: options.header_name.clone(),
        tiles: std::cell::OnceCell::new(),
    })
}

impl Prepared {
    /// Tile IR scheduled for the machine-code target.
    pub fn tiles(&self) -> Result<&dlc_tile::Module, DriverError> {
        if let Some(t) = self.tiles.get() {
            return Ok(t);
        }
        let t = crate::lower_for_code(&self.module, &self.target)?;
        Ok(self.tiles.get_or_init(|| t))
    }

    /// The module as `what`: UTF-8 text unless [`Artifact::is_binary`].
    pub fn emit(&self, what: Artifact, backends: Backends<'_>) -> Result<Vec<u8>, DriverError> {
        let module = &self.module;
        let text = |s: String| Ok(s.into_bytes());
        match what {
            Artifact::Graph => text(dlc_graph::print_module(module)),
            Artifact::GraphMlir => text(dlc_graph::print_mlir_generic(module)),
            Artifact::Loop => text(dlc_loop::print_module(&crate::lower_to_loops(
                module,
                &self.scheduled,
            )?)),
            Artifact::LoopMlir => text(dlc_loop::print_mlir_generic(&crate::lower_to_loops(
                module,
                &self.scheduled,
            )?)),
            // What compiled code runs (constants prepared once).
            Artifact::Tile | Artifact::TileMlir => {
                let tiled = crate::lower_for_code(module, &self.scheduled)?;
                text(if what == Artifact::Tile {
                    dlc_tile::print_module(&tiled)
                } else {
                    dlc_tile::print_mlir_generic(&tiled)
                })
            }
            Artifact::CHeader => {
                let sigs = signatures(self.tiles()?, &self.symbols)?;
                let sigs: Vec<Signature> = sigs.into_iter().map(|(_, s)| s).collect();
                let guard = self
                    .header_name
                    .clone()
                    .unwrap_or_else(|| module_stem(&self.source_name));
                text(dlc_runtime::abi::c_header(
                    &guard,
                    &sigs,
                    &runs_on(&self.target),
                ))
            }
            Artifact::RustBindings => {
                let sigs = signatures(self.tiles()?, &self.symbols)?;
                text(crate::bindings::rust_bindings(
                    &self.source_name,
                    &sigs,
                    &runs_on(&self.target),
                ))
            }
            Artifact::Mlir | Artifact::MlirTile => {
                let Some(mlir) = backends.mlir else {
                    return Err(DriverError::Usage(
                        "upstream MLIR needs an MLIR converter (dlc_mlir::Mlir); none was given"
                            .into(),
                    ));
                };
                let text = if what == Artifact::Mlir {
                    mlir.convert(&crate::lower_to_loops(module, &self.scheduled)?)
                } else {
                    mlir.convert_tile(&crate::lower_for_tile(module, &self.scheduled)?)
                };
                text.map(String::into_bytes).map_err(DriverError::Codegen)
            }
            Artifact::GpuModule => {
                let Some(gpu) = self.target.gpu() else {
                    return Err(DriverError::Usage(format!(
                        "a GPU module is compiled for a GPU target (--target sm_80 or sm_90), \
                         not {}",
                        self.target.name
                    )));
                };
                let Some(codegen) = backends.codegen else {
                    return Err(DriverError::Usage(
                        "a GPU module needs a code generator (dlc_llvm::Llvm); none was given"
                            .into(),
                    ));
                };
                let program = codegen
                    .gpu_program(self.tiles()?, &self.symbols, &self.target)
                    .map_err(DriverError::Codegen)?;
                let tf32 = self.target.tf32();
                let entries = program
                    .functions
                    .iter()
                    .map(|f| {
                        let g = module
                            .functions
                            .iter()
                            .find(|g| g.name == f.signature.name)
                            .ok_or_else(|| {
                                DriverError::Codegen(format!(
                                    "entry point `{}` has no graph function",
                                    f.signature.name
                                ))
                            })?;
                        Ok(dlc_runtime::module::EntryInfo {
                            random: crate::random_ranges(g),
                            tolerances: crate::check_tolerances_with(g, tf32),
                        })
                    })
                    .collect::<Result<Vec<_>, DriverError>>()?;
                Ok(dlc_runtime::module::GpuModule {
                    target: self.target.name.clone(),
                    capability: gpu.compute_capability,
                    tf32,
                    program,
                    entries,
                }
                .to_bytes())
            }
            Artifact::Native(native) => {
                let Some(codegen) = backends.codegen else {
                    return Err(DriverError::Usage(
                        "machine code needs a code generator (dlc_llvm::Llvm); none was given"
                            .into(),
                    ));
                };
                if let (NativeArtifact::SharedLibrary, Some(triple)) =
                    (native, self.target.cpu().and_then(|c| c.triple.as_deref()))
                {
                    return Err(DriverError::Usage(format!(
                        "a shared library is linked with this machine's C compiler, which cannot \
                         link for {triple}: make an object file or a static library and link it \
                         with a toolchain for it"
                    )));
                }
                codegen
                    .emit(self.tiles()?, native, &self.symbols, &self.target)
                    .map_err(DriverError::Codegen)
            }
        }
    }
}

/// Keeps only the entry points named in `entries` (and private functions)
/// when it is not empty; each must exist.
pub(crate) fn keep_entries(module: &mut Module, entries: &[String]) -> Result<(), DriverError> {
    if entries.is_empty() {
        return Ok(());
    }
    for name in entries {
        crate::select_entry(module, Some(name))?;
    }
    module
        .functions
        .retain(|f| entries.contains(&f.name) || f.visibility == Visibility::Private);
    Ok(())
}

/// Every function's name and C signature, the signature named by its
/// exported symbol.
fn signatures(
    m: &dlc_tile::Module,
    symbols: &Symbols,
) -> Result<Vec<(String, Signature)>, DriverError> {
    // Preparers of constants are the code's own business: it runs them.
    let internal: std::collections::HashSet<&str> = m
        .functions
        .iter()
        .flat_map(|f| f.body.ops.iter().map(move |&id| &f.op(id).kind))
        .filter_map(|k| match k {
            dlc_tile::OpKind::Prepared { func, .. } => Some(func.as_str()),
            _ => None,
        })
        .collect();
    m.functions
        .iter()
        .filter(|f| !internal.contains(f.name.as_str()))
        .map(|f| {
            let mut sig = signature(f).map_err(DriverError::Usage)?;
            sig.name = symbols.symbol(&f.name).map_err(DriverError::Usage)?;
            if let Some(p) = &sig.prepare {
                sig.prepare = Some(symbols.symbol(p).map_err(DriverError::Usage)?);
            }
            Ok((f.name.clone(), sig))
        })
        .collect()
}

/// The C signature of a tile function (no failure sites): its parameters,
/// inputs then results, each a contiguous tensor.
pub fn signature(f: &dlc_tile::Function) -> Result<Signature, String> {
    let first_output = f.params.len() - f.outputs.min(f.params.len());
    let params = f
        .params
        .iter()
        .enumerate()
        .map(|(i, (name, v))| {
            let dlc_tile::Type::Buffer(t) = f.ty(*v) else {
                return Err(format!("parameter %{name} of @{} is not a buffer", f.name));
            };
            if !t.layout.is_contiguous() {
                return Err(format!(
                    "parameter %{name} of @{} ({}) is strided; only row-major parameters can be \
                     passed through the C ABI",
                    f.name, t.layout
                ));
            }
            Ok(dlc_runtime::Param {
                name: name.to_string(),
                ty: dlc_core::TensorType::new(t.layout.dtype, t.layout.shape.clone()),
                output: i >= first_output,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Signature {
        name: f.name.clone(),
        params,
        sites: Vec::new(),
        prepare: f.prepare.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src() -> SourceText {
        SourceText {
            name: "dir/my model.dl".into(),
            text: "fn f(x: f32[2, 3]) -> f32[2, 3] { return x * 2.0; }\n\
                   fn g(n: i32[]) -> i32[] { return n + 1; }\n"
                .into(),
            weights: Vec::new(),
        }
    }

    fn compile_to(emit: Artifact, change: impl FnOnce(&mut CompileOptions)) -> String {
        let mut options = CompileOptions {
            emit,
            ..CompileOptions::default()
        };
        change(&mut options);
        let done = compile(&src(), &options, Backends::default()).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8(done.bytes).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn headers_and_bindings_need_no_code_generator() {
        let h = compile_to(Artifact::CHeader, |o| o.cpu = "x86-64-v3".into());
        assert!(
            h.contains("int32_t dlc_my_model_f(const float *x, float *"),
            "{h}"
        );
        assert!(h.contains("#ifndef DLC_MY_MODEL_H"), "{h}");
        assert!(h.contains("Compiled for x86-64-v3"), "{h}");
        let rs = compile_to(Artifact::RustBindings, |o| o.prefix = Some("p_".into()));
        assert!(rs.contains("#[link_name = \"p_g\"]"), "{rs}");
        assert!(
            rs.contains("pub fn g(n: i32) -> Result<i32, Error> {"),
            "{rs}"
        );
    }

    #[test]
    fn entries_keep_only_the_named_entry_points() {
        let g = compile_to(Artifact::Graph, |o| o.entries = vec!["g".into()]);
        assert!(g.contains("@g") && !g.contains("@f("), "{g}");
        let options = CompileOptions {
            entries: vec!["h".into()],
            ..CompileOptions::default()
        };
        let e = compile(&src(), &options, Backends::default())
            .map(|_| ())
            .unwrap_err();
        assert!(e.to_string().contains("`h`"), "{e}");
    }

    #[test]
    fn machine_code_without_a_code_generator_is_an_error() {
        let options = CompileOptions {
            emit: Artifact::Native(NativeArtifact::Object),
            ..CompileOptions::default()
        };
        let e = compile(&src(), &options, Backends::default())
            .map(|_| ())
            .unwrap_err();
        assert!(e.to_string().contains("needs a code generator"), "{e}");
        let options = CompileOptions {
            emit: Artifact::Mlir,
            ..CompileOptions::default()
        };
        let e = compile(&src(), &options, Backends::default())
            .map(|_| ())
            .unwrap_err();
        assert!(e.to_string().contains("needs an MLIR converter"), "{e}");
        let options = CompileOptions {
            cpu: "pentium9".into(),
            ..CompileOptions::default()
        };
        let e = compile(&src(), &options, Backends::default())
            .map(|_| ())
            .unwrap_err();
        assert!(e.to_string().contains("unknown CPU `pentium9`"), "{e}");
    }
}
