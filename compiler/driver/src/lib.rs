//! The dlc pipeline as a library: read a source file or graph IR, check it,
//! run passes, and execute an entry point. The `dlc` and `dlc-opt` tools are
//! thin layers over this crate, and a `build.rs` calls the same functions.
//!
//! Every failure is a [`DriverError`] whose `Display` is the complete,
//! user-facing message (source diagnostics already rendered with file, line,
//! column and the underlined span).
//!
//! # The pipeline as a call
//!
//! `dlc-driver` is the library that the tools and `build.rs` helpers call. Every error it
//! returns is a `DriverError` that displays as the complete user-facing message
//! (diagnostics rendered with `file:line:col`); it never prints or ends the process.
//! `dlc_driver::compile(&source, &CompileOptions { emit, entries, passes, prefix, target,
//! cpu, header_name }, Some(&dlc_llvm::Llvm))` is `dlc compile` as a call: source or graph
//! IR in, any artifact out (graph/loop/tile text or MLIR generic form, LLVM IR, assembly,
//! object, shared or static library, C header, Rust bindings) as bytes, with each pass's
//! statistics. Headers and bindings need no code generator (their signatures come from
//! the tile IR). `compile` is `prepare` (read, check, run the passes, keep the chosen entry
//! points) then `Prepared::emit`; a caller wanting several artifacts of one module (dlc-build:
//! the static library and its bindings) prepares once and emits each, and tile IR for the
//! code target is lowered once per prepared module.
//!
//! **CPUs.** Machine code is for a named CPU (`CompileOptions::cpu`, `--cpu`): `native`
//! (this machine, every feature LLVM detects; the default of `dlc compile` and the only
//! choice of `dlc run`/`bench`), a level whose code runs on every CPU of it (`x86-64`:
//! SSE2; `x86-64-v2`: SSE4.2; `x86-64-v3`: AVX2, FMA; `x86-64-v4`: AVX-512), or one of 19
//! LLVM CPU names (`dlc_core::LLVM_CPUS`: `haswell`, `skylake-avx512`, `znver4`, ...),
//! each mapped to the level whose vector width and registers schedule its code and
//! passed to LLVM as the CPU. The C header and the Rust bindings say which CPUs the code
//! needs ("Compiled for x86-64-v3: it runs on any x86-64 CPU of that level").
//! `--target aarch64-linux-gnu` cross-compiles objects and static libraries (a shared
//! library would need an Arm linker).
#![deny(missing_docs)]

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use dlc_core::{
    Pass, PassError, PassManager, PassRegistry, PassReport, Pipeline, TensorType, Verify,
    VerifyError,
};
use dlc_graph::interp::{InterpError, Tensor};
use dlc_graph::{Function, Module};
use dlc_runtime::{HostTensor, TensorError, Value, seeded_rng};

pub use dlc_graph::transforms::DEFAULT_PIPELINE;

mod artifact;
pub mod bindings;
mod interface;
mod weights;

pub use interface::{Interface, Param};

pub use artifact::{
    Artifact, Backends, CodeGenerator, Compilation, CompileOptions, MlirConverter, NativeArtifact,
    Prepared, code_target, compile, module_stem, prepare, prepare_with, runs_on, signature,
};

/// Stack for front-end and IR work: deep (but bounded) nesting in user input
/// must end in a diagnostic, not a stack overflow.
const FRONTEND_STACK: usize = 256 << 20;

/// What went wrong, as the user should read it.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// Source diagnostics, rendered.
    #[error("{0}")]
    Source(SourceError),
    /// A file could not be read or written.
    #[error("error: {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The system error.
        source: std::io::Error,
    },
    /// The input is not UTF-8 text.
    #[error("error: {path}:{line}:{column}: the file is not valid UTF-8 (byte 0x{byte:02x})")]
    NotUtf8 {
        /// The file.
        path: String,
        /// 1-based line of the first bad byte.
        line: usize,
        /// 1-based column (in bytes) of the first bad byte.
        column: usize,
        /// The bad byte.
        byte: u8,
    },
    /// Graph IR text that does not parse.
    #[error("error: {path}:{line}:{column}: {message}")]
    IrSyntax {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What was expected.
        message: String,
    },
    /// A pipeline that could not be built or run.
    #[error("error: {0}")]
    Pass(#[from] PassError),
    /// A gradient that could not be built.
    #[error("error: {0}")]
    Grad(#[from] dlc_graph::autodiff::GradError),
    /// A problem with entry points, inputs or outputs.
    #[error("error: {0}")]
    Usage(String),
    /// The interpreter failed.
    #[error("error: {0}")]
    Interp(#[from] InterpError),
    /// A tensor file could not be read or written.
    #[error("error: {0}")]
    Tensor(#[from] TensorError),
    /// Machine code could not be made (the code generator's message).
    #[error("error: {0}")]
    Codegen(String),
    /// An ONNX model could not be imported.
    #[error("error: {path}: {source}")]
    Import {
        /// The model file.
        path: String,
        /// Why.
        source: dlc_onnx::ImportError,
    },
    /// The work thread died (a bug: the front end must not panic).
    #[error("error: internal compiler error: {0}")]
    Internal(String),
    /// Compiled code could not be called.
    #[error("error: {0}")]
    Runtime(#[from] dlc_runtime::RuntimeError),
}

/// Diagnostics of a source text: rendered as the user reads them, and the
/// place of the first (for tools that point at it: an editor, a Python
/// exception).
#[derive(Debug, Clone)]
pub struct SourceError {
    /// Every diagnostic, rendered with file, line, column and the
    /// underlined span.
    pub rendered: String,
    /// The source's name.
    pub file: String,
    /// 1-based line and column of the first diagnostic.
    pub place: Option<(usize, usize)>,
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.rendered)
    }
}

/// A loaded input text.
#[derive(Debug, Clone)]
pub struct SourceText {
    /// The name diagnostics use (`model.dl`, `<stdin>`).
    pub name: String,
    /// The text.
    pub text: String,
    /// Values for `weight` parameters the text declares, by name: each is
    /// bound as a constant when the text is compiled ([`compile_source`]),
    /// so the parameter leaves the signature, or handed back to be bound at
    /// the call ([`compile_source_unbound`]). An imported ONNX model's
    /// initializers travel this way, as binary data beside a short program,
    /// not as literals the front end reads back.
    pub weights: Vec<(String, Vec<f64>)>,
}

/// Checks that `bytes` are UTF-8 and reports the first bad byte's place.
pub fn decode(name: &str, bytes: Vec<u8>) -> Result<SourceText, DriverError> {
    match String::from_utf8(bytes) {
        Ok(text) => Ok(SourceText {
            name: name.to_string(),
            text,
            weights: Vec::new(),
        }),
        Err(e) => {
            let bytes = e.as_bytes();
            let at = e.utf8_error().valid_up_to();
            let before = &bytes[..at];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = at
                - before
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |p| p + 1)
                + 1;
            Err(DriverError::NotUtf8 {
                path: name.to_string(),
                line,
                column,
                byte: bytes[at],
            })
        }
    }
}

/// Reads a file, or standard input for `-`.
pub fn read_input(path: &str) -> Result<SourceText, DriverError> {
    let io = |source| DriverError::Io {
        path: path.to_string(),
        source,
    };
    if path == "-" {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes).map_err(io)?;
        decode("<stdin>", bytes)
    } else {
        decode(path, std::fs::read(path).map_err(io)?)
    }
}

/// Whether a path names an ONNX model (by its extension).
pub fn is_onnx(path: &str) -> bool {
    std::path::Path::new(path)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// Reads a model: dlc source or IR text, or an ONNX model (`.onnx`), which
/// is imported into a dlc program (named after the file, so symbols and
/// diagnostics read `model.onnx`; `dlc import` prints the program).
/// `onnx` gives the shapes of ONNX inputs with symbolic dimensions and the
/// inputs bound to values.
pub fn read_model(path: &str, onnx: &dlc_onnx::Options) -> Result<SourceText, DriverError> {
    if !is_onnx(path) {
        if !onnx.shapes.is_empty() || !onnx.bound.is_empty() {
            return Err(DriverError::Usage(format!(
                "--shape and --bind apply to ONNX models; {path} is dlc source, whose shapes are written in it"
            )));
        }
        return read_input(path);
    }
    Ok(imported_source(path, import_onnx(path, onnx)?))
}

/// An imported ONNX model as source: its program, named `name`, and its
/// weights' values, bound when it is compiled.
pub fn imported_source(name: &str, imported: dlc_onnx::Imported) -> SourceText {
    SourceText {
        name: name.to_string(),
        text: imported.source,
        weights: imported
            .weights
            .into_iter()
            .map(|(var, d)| {
                let values = d.values.into_vec();
                (var, values)
            })
            .collect(),
    }
}

/// Import options from `--shape NAME=[..]` and `--bind NAME=PATH.npy`
/// arguments (a bound input becomes a constant holding the file's tensor).
pub fn onnx_options(shapes: &[String], binds: &[String]) -> Result<dlc_onnx::Options, DriverError> {
    let mut options = dlc_onnx::Options::default();
    for s in shapes {
        options.shapes.push(parse_shape_arg(s)?);
    }
    for b in binds {
        let Some((name, path)) = b.split_once('=') else {
            return Err(DriverError::Usage(format!(
                "--bind takes NAME=PATH.npy, got `{b}`"
            )));
        };
        let t = dlc_runtime::HostTensor::read_npy(Path::new(path), None)?;
        options.bound.push((
            name.to_string(),
            dlc_onnx::Data::new(t.ty.dtype, t.ty.shape.clone(), t.data),
        ));
    }
    Ok(options)
}

/// Imports an ONNX model file.
pub fn import_onnx(
    path: &str,
    options: &dlc_onnx::Options,
) -> Result<dlc_onnx::Imported, DriverError> {
    let bytes = std::fs::read(path).map_err(|source| DriverError::Io {
        path: path.to_string(),
        source,
    })?;
    let options = dlc_onnx::Options {
        model_dir: Some(onnx_model_dir(path)),
        ..options.clone()
    };
    dlc_onnx::import_owned(bytes, &options).map_err(|source| DriverError::Import {
        path: path.to_string(),
        source,
    })
}

/// The directory an ONNX model's external data is read from: the model
/// file's.
pub fn onnx_model_dir(path: &str) -> PathBuf {
    match Path::new(path).parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => ".".into(),
    }
}

/// Reads `--shape NAME=[d0,d1,...]` (brackets optional, `x` also separates).
pub fn parse_shape_arg(spec: &str) -> Result<(String, Vec<usize>), DriverError> {
    let bad = || {
        DriverError::Usage(format!(
            "--shape takes NAME=[d0,d1,...] with positive dimensions, got `{spec}`"
        ))
    };
    let (name, dims) = spec.rsplit_once('=').ok_or_else(bad)?;
    let dims = dims.trim().trim_start_matches('[').trim_end_matches(']');
    let shape = if dims.trim().is_empty() {
        Vec::new()
    } else {
        dims.split([',', 'x'])
            .map(|d| d.trim().parse::<usize>().ok().filter(|&d| d > 0))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?
    };
    if name.is_empty() {
        return Err(bad());
    }
    Ok((name.to_string(), shape))
}

/// Runs `work` on a thread with a large stack.
fn with_stack<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, DriverError> {
    std::thread::Builder::new()
        .name("dlc-frontend".into())
        .stack_size(FRONTEND_STACK)
        .spawn(work)
        .map_err(|e| DriverError::Internal(format!("cannot start the front-end thread: {e}")))?
        .join()
        .map_err(|_| DriverError::Internal("the front end panicked".into()))
}

/// Parses and checks dlc source into a graph module (calls not yet inlined).
pub fn compile_source(src: &SourceText) -> Result<Module, DriverError> {
    let (name, text) = (src.name.clone(), src.text.clone());
    let mut module = with_stack(move || {
        dlc_lang::compile_file(&name, &text).map_err(|d| {
            DriverError::Source(SourceError {
                rendered: d.render(&name, &text),
                file: name.clone(),
                place: d.first_place(&text),
            })
        })
    })??;
    if is_onnx(&src.name) {
        place_onnx_nodes(&mut module, &src.name, &src.text);
    }
    bind_source_weights(&mut module, src)?;
    Ok(module)
}

/// Names an imported ONNX model's nodes as the places of the ops that
/// come from them (``model.onnx, node `/conv1/Conv` (Conv)``), where the
/// front end gave lines of the program the importer wrote (`text`).
fn place_onnx_nodes(module: &mut Module, file: &str, text: &str) {
    let places: HashMap<u32, std::sync::Arc<str>> = dlc_onnx::node_places(text)
        .into_iter()
        .map(|(line, node)| (line, format!("{file}, {node}").into()))
        .collect();
    for f in &mut module.functions {
        for n in f.body.node_weights_mut() {
            if let Some(loc) = &mut n.loc
                && *loc.file == *file
                && let Some(place) = places.get(&loc.line)
            {
                *loc = dlc_core::SourceLoc {
                    file: place.clone(),
                    line: 0,
                    column: 0,
                };
            }
        }
    }
}

/// Parses and checks `src` like [`compile_source`], but keeps the weights
/// `src` carries (an imported ONNX model's initializers) as `weight`
/// parameters and returns their values, by name, as tensors to bind when
/// the code is called. The CPU back end then prepares them once (packs the
/// kernels, transforms Winograd's) where a constant is compiled into the
/// code and prepared by every call, and the compiled code holds no weights,
/// so it goes through the object cache. `dlc run` and `dlc bench` take this
/// path; `dlc compile` builds the values into its artifact.
pub fn compile_source_unbound(
    src: SourceText,
) -> Result<(Module, Vec<(String, HostTensor)>), DriverError> {
    let SourceText {
        name,
        text,
        weights,
    } = src;
    let module = compile_source(&SourceText {
        name: name.clone(),
        text,
        weights: Vec::new(),
    })?;
    let mut tensors = Vec::with_capacity(weights.len());
    // Each value becomes its tensor in place.
    for (weight, values) in weights {
        let (_, ty) = weight_declarations(&module, &name, &weight, values.len())?;
        let t = HostTensor::new(ty, values)
            .map_err(|e| DriverError::Usage(format!("{name}: weight `{weight}`: {e}")))?;
        tensors.push((weight, t));
    }
    Ok((module, tensors))
}

/// Binds `src.weights` as constants in the functions that declare weight
/// parameters of those names; a value no function takes, or of the wrong
/// size, is an error.
fn bind_source_weights(module: &mut Module, src: &SourceText) -> Result<(), DriverError> {
    for (name, values) in &src.weights {
        let (declared, _) = weight_declarations(module, &src.name, name, values.len())?;
        let values: std::sync::Arc<[f64]> = values.as_slice().into();
        for (f, i) in declared {
            module.functions[f].bind_param(i, std::sync::Arc::clone(&values));
        }
    }
    Ok(())
}

/// The functions of `module` (by index) that declare weight `name`, with
/// its parameter index in each, and its type: an error naming `file` when
/// none does, or when its type does not hold `len` elements.
fn weight_declarations(
    module: &Module,
    file: &str,
    name: &str,
    len: usize,
) -> Result<(Vec<(usize, usize)>, TensorType), DriverError> {
    let mut declared = Vec::new();
    let mut declared_ty = None;
    for (k, f) in module.functions.iter().enumerate() {
        let Some(i) = f
            .params
            .iter()
            .position(|(p, _)| p == name)
            .filter(|&i| f.is_weight(i))
        else {
            continue;
        };
        let ty = f.body[f.params[i].1].results[0].clone();
        if ty.num_elements() != Some(len) {
            return Err(DriverError::Usage(format!(
                "{file}: weight `{name}` is {ty}, its value has {len} elements"
            )));
        }
        declared.push((k, i));
        declared_ty = Some(ty);
    }
    match declared_ty {
        Some(ty) => Ok((declared, ty)),
        None => Err(DriverError::Usage(format!(
            "{file}: no function declares the weight `{name}` a value is given for"
        ))),
    }
}

/// Parses IR text with `parse` and verifies it, on the big-stack thread.
fn parse_ir<M: Verify + Send + 'static>(
    src: &SourceText,
    parse: fn(&str) -> Result<M, dlc_core::lex::ParseError>,
) -> Result<M, DriverError> {
    let src = src.clone();
    with_stack(move || {
        let module = parse(&src.text).map_err(|e| DriverError::IrSyntax {
            path: src.name.clone(),
            line: e.line,
            column: e.column,
            message: e.message,
        })?;
        module
            .verify()
            .map_err(|errors| PassError::Verify { pass: None, errors })?;
        Ok(module)
    })?
}

/// Parses and verifies graph IR text.
pub fn parse_graph(src: &SourceText) -> Result<Module, DriverError> {
    parse_ir(src, dlc_graph::parse_module)
}

/// Parses and verifies loop IR text.
pub fn parse_loop(src: &SourceText) -> Result<dlc_loop::Module, DriverError> {
    parse_ir(src, dlc_loop::parse_module)
}

/// Parses and verifies tile IR text.
pub fn parse_tile(src: &SourceText) -> Result<dlc_tile::Module, DriverError> {
    parse_ir(src, dlc_tile::parse_module)
}

/// What a text holds, judged by its first token: `graph.func` (graph IR),
/// `loop.func` (loop IR), `tile.func` (tile IR), or anything else (dlc
/// source). A `.dl` file is
/// always source.
fn text_level(src: &SourceText) -> Option<&'static str> {
    if src.name.ends_with(".dl") {
        return None;
    }
    let mut rest = src.text.as_str();
    loop {
        rest = rest.trim_start();
        match rest.strip_prefix("//") {
            Some(r) => rest = r.split_once('\n').map_or("", |(_, after)| after),
            None => {
                return ["graph.func", "loop.func", "tile.func"]
                    .into_iter()
                    .find(|k| rest.starts_with(k));
            }
        }
    }
}

/// Whether a text is graph IR rather than dlc source.
pub fn is_graph_ir(src: &SourceText) -> bool {
    text_level(src) == Some("graph.func")
}

/// Loads source or graph IR, whichever the text is.
pub fn load(src: &SourceText) -> Result<Module, DriverError> {
    if is_graph_ir(src) {
        parse_graph(src)
    } else {
        compile_source(src)
    }
}

/// A module at any level of the compiler.
#[derive(Debug, Clone)]
pub enum Ir {
    /// The graph dialect.
    Graph(Module),
    /// The loop dialect.
    Loop(dlc_loop::Module),
    /// The tile dialect.
    Tile(dlc_tile::Module),
}

impl Ir {
    /// The level's name, as error messages say it.
    pub fn level(&self) -> &'static str {
        match self {
            Ir::Graph(_) => "graph",
            Ir::Loop(_) => "loop",
            Ir::Tile(_) => "tile",
        }
    }

    /// The text form.
    pub fn print(&self) -> String {
        match self {
            Ir::Graph(m) => dlc_graph::print_module(m),
            Ir::Loop(m) => dlc_loop::print_module(m),
            Ir::Tile(m) => dlc_tile::print_module(m),
        }
    }

    /// MLIR's generic operation syntax.
    pub fn print_mlir_generic(&self) -> String {
        match self {
            Ir::Graph(m) => dlc_graph::print_mlir_generic(m),
            Ir::Loop(m) => dlc_loop::print_mlir_generic(m),
            Ir::Tile(m) => dlc_tile::print_mlir_generic(m),
        }
    }
}

impl Verify for Ir {
    fn verify(&self) -> Result<(), Vec<VerifyError>> {
        match self {
            Ir::Graph(m) => m.verify(),
            Ir::Loop(m) => m.verify(),
            Ir::Tile(m) => m.verify(),
        }
    }
}

/// Loads dlc source, graph IR, loop IR or tile IR, whichever the text is.
pub fn load_ir(src: &SourceText) -> Result<Ir, DriverError> {
    match text_level(src) {
        Some("loop.func") => Ok(Ir::Loop(parse_loop(src)?)),
        Some("tile.func") => Ok(Ir::Tile(parse_tile(src)?)),
        Some(_) => Ok(Ir::Graph(parse_graph(src)?)),
        None => Ok(Ir::Graph(compile_source(src)?)),
    }
}

/// A level's module as [`Ir`] holds it.
trait Level {
    /// The level's name in messages.
    const NAME: &'static str;
    /// The module, when `ir` is of this level.
    fn within(ir: &mut Ir) -> Option<&mut Self>;
}

impl Level for Module {
    const NAME: &'static str = "graph";
    fn within(ir: &mut Ir) -> Option<&mut Self> {
        match ir {
            Ir::Graph(m) => Some(m),
            _ => None,
        }
    }
}

impl Level for dlc_tile::Module {
    const NAME: &'static str = "tile";
    fn within(ir: &mut Ir) -> Option<&mut Self> {
        match ir {
            Ir::Tile(m) => Some(m),
            _ => None,
        }
    }
}

/// A pass of one level run on [`Ir`]: it refuses other levels.
struct OnLevel<M>(Box<dyn Pass<M>>);

impl<M: Level> Pass<Ir> for OnLevel<M> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn run(&mut self, ir: &mut Ir) -> Result<Vec<(&'static str, u64)>, PassError> {
        if let Some(m) = M::within(ir) {
            return self.0.run(m);
        }
        Err(wrong_level(self.0.name(), M::NAME, ir))
    }
}

/// A pass given IR of another level than the one it transforms.
fn wrong_level(pass: &str, expected: &str, got: &Ir) -> PassError {
    PassError::Failed {
        pass: pass.into(),
        message: format!("expects {expected} IR, got {} IR", got.level()),
    }
}

/// `convert-graph-to-loop`: lowers every entry point to the loop dialect.
struct ConvertGraphToLoop(dlc_core::TargetDesc);

impl Pass<Ir> for ConvertGraphToLoop {
    fn name(&self) -> &'static str {
        "convert-graph-to-loop"
    }

    fn run(&mut self, ir: &mut Ir) -> Result<Vec<(&'static str, u64)>, PassError> {
        let fail = |message: String| PassError::Failed {
            pass: "convert-graph-to-loop".into(),
            message,
        };
        let Ir::Graph(m) = ir else {
            return Err(wrong_level(self.name(), "graph", ir));
        };
        let lowered = dlc_lower::lower_module(m, &self.0).map_err(|e| fail(e.to_string()))?;
        let ops: usize = lowered.functions.iter().map(|f| f.ops.len()).sum();
        *ir = Ir::Loop(lowered);
        Ok(vec![("loop ops created", ops as u64)])
    }
}

/// `convert-loop-to-tile{target=NAME,...}`: schedules every loop nest as
/// tile kernels with a target's schedule parameters (or overridden ones).
struct ConvertLoopToTile(dlc_lower::ScheduleParams);

impl Pass<Ir> for ConvertLoopToTile {
    fn name(&self) -> &'static str {
        "convert-loop-to-tile"
    }

    fn run(&mut self, ir: &mut Ir) -> Result<Vec<(&'static str, u64)>, PassError> {
        let fail = |message: String| PassError::Failed {
            pass: "convert-loop-to-tile".into(),
            message,
        };
        let Ir::Loop(m) = ir else {
            return Err(wrong_level(self.name(), "loop", ir));
        };
        let tiled = dlc_lower::schedule_module(m, &self.0).map_err(|e| fail(e.to_string()))?;
        let kernels = tiled
            .functions
            .iter()
            .flat_map(|f| &f.ops)
            .filter(|o| matches!(o.kind, dlc_tile::OpKind::Kernel { .. }))
            .count();
        *ir = Ir::Tile(tiled);
        Ok(vec![("kernels created", kernels as u64)])
    }
}

/// Lowers a graph module to loop nests over buffers, for `target`.
pub fn lower_to_loops(
    module: &Module,
    target: &dlc_core::TargetDesc,
) -> Result<dlc_loop::Module, DriverError> {
    dlc_lower::lower_module(module, target).map_err(|e| DriverError::Usage(e.to_string()))
}

/// Lowers a graph module and schedules it as tile kernels for this CPU:
/// what the LLVM back end compiles ([`lower_for_code`]: constants prepared
/// once per process).
pub fn lower_for_cpu(module: &Module) -> Result<dlc_tile::Module, DriverError> {
    lower_for_code(module, dlc_core::TargetDesc::host())
}

/// Lowers a graph module to loops and schedules them as tile kernels for
/// `target` (verifying each level).
pub fn lower_for_tile(
    module: &Module,
    target: &dlc_core::TargetDesc,
) -> Result<dlc_tile::Module, DriverError> {
    let mut ir = Ir::Loop(lower_to_loops(module, target)?);
    let params = dlc_lower::ScheduleParams::for_target(target);
    let tile_pipeline = Pipeline::parse(params.tile_pipeline())?;
    let mut passes: Vec<Box<dyn Pass<Ir>>> = vec![Box::new(ConvertLoopToTile(params))];
    passes.extend(registry_for(target).build(&tile_pipeline)?);
    PassManager::new(passes).run(&mut ir)?;
    match ir {
        Ir::Tile(m) => Ok(m),
        other => Err(DriverError::Usage(format!(
            "expected tile IR, got {} IR",
            other.level()
        ))),
    }
}

/// Lowers a graph module for compiled code on `target`: [`lower_for_tile`],
/// except that on a CPU the dense constants of the entry points are lowered
/// as weights (`Function::lift_constants`) and then built back in
/// (`dlc_tile::transforms::bind_weights`), so that work on constants alone
/// (packing a constant matrix into panels, transforming a Winograd
/// convolution's filters) runs once, on the first call, and is kept for the
/// process, where a constant compiled into a kernel is prepared again by
/// every call. What compiled code runs, and the tile IR `--emit tile`
/// prints.
pub fn lower_for_code(
    module: &Module,
    target: &dlc_core::TargetDesc,
) -> Result<dlc_tile::Module, DriverError> {
    let dense = |f: &Function| {
        f.visibility == dlc_graph::Visibility::Public
            && f.body.node_weights().any(|n| {
                matches!(
                    n.op,
                    dlc_graph::Op::Constant(dlc_graph::ops::ConstValue::Dense(_))
                )
            })
    };
    if target.cpu().is_none() || !module.functions.iter().any(dense) {
        return lower_for_tile(module, target);
    }
    let mut lifted = module.clone();
    let mut values = Vec::new();
    for f in &mut lifted.functions {
        if f.visibility == dlc_graph::Visibility::Public {
            let constants = f.lift_constants();
            if !constants.is_empty() {
                values.push((f.name.clone(), constants));
            }
        }
    }
    let mut tiled = lower_for_tile(&lifted, target)?;
    for (name, constants) in values {
        let constants: HashMap<String, std::sync::Arc<[f64]>> = constants.into_iter().collect();
        dlc_tile::transforms::bind_weights(&mut tiled, &name, |w| constants.get(w).cloned())
            .map_err(DriverError::Internal)?;
    }
    tiled.verify().map_err(|errors| PassError::Verify {
        pass: Some("constants built back in".into()),
        errors,
    })?;
    Ok(tiled)
}

/// Every pass of every level, and the conversions between levels.
pub fn registry() -> PassRegistry<Ir> {
    registry_for(dlc_core::TargetDesc::host())
}

/// [`registry`], the graph passes that price compiled code pricing it for
/// `target` unless their options name another.
fn registry_for(target: &dlc_core::TargetDesc) -> PassRegistry<Ir> {
    let mut r = dlc_graph::transforms::registry_for(target)
        .lift(|p| Box::new(OnLevel(p)) as Box<dyn Pass<Ir>>);
    r.extend(
        dlc_tile::transforms::registry_for(target)
            .lift(|p| Box::new(OnLevel(p)) as Box<dyn Pass<Ir>>),
    );
    r.register(
        "convert-graph-to-loop",
        "lowers the graph dialect to loop nests over buffers (with fusion and buffer lifetimes) \
         for `target` (host, x86-64-avx512, x86-64-avx2, aarch64-linux-gnu, sm_80, sm_90; default \
         host)",
        |o| {
            o.expect_only(&["target"])?;
            let name: String = o.get("target", "host".to_string())?;
            let target =
                dlc_core::TargetDesc::named(&name).map_err(|message| PassError::BadOption {
                    pass: "convert-graph-to-loop".into(),
                    message,
                })?;
            Ok(Box::new(ConvertGraphToLoop(target)))
        },
    );
    r.register(
        "convert-loop-to-tile",
        "schedules each loop nest as tile kernels (grid, tiles, tile.dot, tile.reduce) for \
         `target` (host, x86-64-avx512, x86-64-avx2, aarch64-linux-gnu, sm_80, sm_90; default host); `vector=N` \
         (iterations per tile of an innermost loop), `column_strips=N` (tiles side by side in \
         a program of a sum down columns), `dot=MxNxK` (blocks of a product) and \
         `packed=false` (no packed products) override the target's schedule",
        |o| {
            o.expect_only(&["target", "vector", "column_strips", "dot", "packed"])?;
            let fail = |message: String| PassError::BadOption {
                pass: "convert-loop-to-tile".into(),
                message,
            };
            let name: String = o.get("target", "host".to_string())?;
            let target = dlc_core::TargetDesc::named(&name).map_err(fail)?;
            let mut params = dlc_lower::ScheduleParams::for_target(&target);
            params.vector = o.get("vector", params.vector)?;
            params.column_strips = o.get("column_strips", params.column_strips)?;
            let dot: String = o.get("dot", String::new())?;
            if !dot.is_empty() {
                let sizes: Vec<usize> = dot.split('x').filter_map(|d| d.parse().ok()).collect();
                match sizes.as_slice() {
                    [m, n, k] => params.dot = [*m, *n, *k],
                    _ => return Err(fail(format!("dot takes MxNxK (three sizes), got `{dot}`"))),
                }
            }
            if !o.get("packed", true)? {
                params.packed = None;
            }
            params.validate().map_err(fail)?;
            Ok(Box::new(ConvertLoopToTile(params)))
        },
    );
    r
}

/// Runs a textual pipeline over a module at any level.
pub fn run_pipeline(
    ir: &mut Ir,
    pipeline: &str,
    options: PassOptions<'_>,
) -> Result<Vec<PassReport>, DriverError> {
    let pipeline = Pipeline::parse(pipeline)?;
    let target = options.target.unwrap_or(dlc_core::TargetDesc::host());
    let passes = registry_for(target).build(&pipeline)?;
    let mut manager = PassManager::new(passes);
    if let Some(out) = options.print_after_all {
        manager = manager.after_each_pass(move |name, ir: &Ir| {
            let _ = writeln!(out, "// -----// IR after {name} //----- //\n{}", ir.print());
        });
    }
    Ok(manager.run(ir)?)
}

/// Options for [`run_passes`].
#[derive(Default)]
pub struct PassOptions<'a> {
    /// Where to print the IR after each pass (`--print-after-all`).
    pub print_after_all: Option<&'a mut dyn Write>,
    /// What the passes that price compiled code (`graph.saturate`) price
    /// it for, unless a pass's options name a target; `None`: this
    /// machine (the driver's default).
    pub target: Option<&'a dlc_core::TargetDesc>,
}

/// Runs a textual pipeline over `module`, verifying before and after each pass.
pub fn run_passes(
    module: &mut Module,
    pipeline: &str,
    options: PassOptions<'_>,
) -> Result<Vec<PassReport>, DriverError> {
    let pipeline = Pipeline::parse(pipeline)?;
    let target = options.target.unwrap_or(dlc_core::TargetDesc::host());
    let passes = dlc_graph::transforms::registry_for(target).build(&pipeline)?;
    let mut manager = PassManager::new(passes);
    if let Some(out) = options.print_after_all {
        manager = manager.after_each_pass(move |name, ir: &Module| {
            let _ = writeln!(out, "// -----// IR after {name} //----- //\n{ir}");
        });
    }
    Ok(manager.run(module)?)
}

/// The entry point named `entry`, or the only one when `entry` is `None`.
pub fn select_entry<'m>(
    module: &'m Module,
    entry: Option<&str>,
) -> Result<&'m Function, DriverError> {
    let names: Vec<&str> = module.entry_points().map(|f| f.name.as_str()).collect();
    match entry {
        Some(name) => module
            .entry_points()
            .find(|f| f.name == name)
            .ok_or_else(|| {
                DriverError::Usage(format!(
                    "no entry point `{name}`; entry points: {}",
                    names.join(", ")
                ))
            }),
        None => match names.as_slice() {
            [_] => module
                .entry_points()
                .next()
                .ok_or_else(|| DriverError::Usage("no entry point".into())),
            [] => Err(DriverError::Usage("the module has no entry point".into())),
            _ => Err(DriverError::Usage(format!(
                "the module has {} entry points; choose one with --entry: {}",
                names.len(),
                names.join(", ")
            ))),
        },
    }
}

/// The module with one entry point, `entry` (or the only one), and the
/// private functions: what `dlc run` and `dlc bench` lower and compile, so
/// that running one entry point of a file does not compile the others (W1's
/// and W3's files hold two sizes each: compiling both doubled their compile
/// time).
pub fn only_entry(module: &Module, entry: Option<&str>) -> Result<Module, DriverError> {
    let name = select_entry(module, entry)?.name.clone();
    only_entries(module, &[name])
}

/// `module` with only the entry points `names` (each must be one) and the
/// private functions.
pub fn only_entries(module: &Module, names: &[String]) -> Result<Module, DriverError> {
    let mut only = module.clone();
    artifact::keep_entries(&mut only, names)?;
    Ok(only)
}

/// Builds the arguments of `f` from `.npy` files named by parameter, and
/// random tensors (from `seed`) for parameters not named, if a seed is given.
pub fn prepare_inputs(
    f: &Function,
    files: &[(String, PathBuf)],
    seed: Option<u64>,
) -> Result<Vec<HostTensor>, DriverError> {
    prepare_inputs_with(&Interface::of(f), files, Vec::new(), seed)
}

/// [`prepare_inputs`] with some arguments given as tensors (`--weights`, an
/// imported model's weights), which become arguments without a copy.
pub fn prepare_inputs_with(
    f: &Interface,
    files: &[(String, PathBuf)],
    tensors: Vec<(String, HostTensor)>,
    seed: Option<u64>,
) -> Result<Vec<HostTensor>, DriverError> {
    let given = tensors
        .into_iter()
        .map(|(n, t)| (n, Value::Host(t)))
        .collect();
    prepare_values(f, files, given, seed)?
        .into_iter()
        .map(|v| v.into_host().map_err(DriverError::from))
        .collect()
}

/// [`prepare_inputs_with`] with the given arguments as [`Value`]s (an
/// imported model's weights as the file's bytes), which become arguments
/// as they are.
pub fn prepare_values(
    f: &Interface,
    files: &[(String, PathBuf)],
    given: Vec<(String, Value)>,
    seed: Option<u64>,
) -> Result<Vec<Value>, DriverError> {
    let mut inputs: Vec<Option<Value>> = Vec::with_capacity(f.params.len());
    // `each_input` checks the given values and calls back once per
    // parameter, in order.
    each_input(f, files, &given, seed, |ty, elements| {
        let name = &f.params[inputs.len()].name;
        if given.iter().any(|(n, _)| n == name) {
            inputs.push(None);
        } else {
            let Elements::Values(values) = elements else {
                return Err(DriverError::Internal(format!(
                    "argument `{name}` was read as bytes"
                )));
            };
            let t = HostTensor::new(ty.clone(), values.collect())
                .map_err(|e| DriverError::Usage(e.to_string()))?;
            inputs.push(Some(Value::Host(t)));
        }
        Ok(())
    })?;
    let mut given: HashMap<String, Value> = given.into_iter().collect();
    inputs
        .into_iter()
        .zip(&f.params)
        .map(|(t, Param { name, .. })| {
            t.or_else(|| given.remove(name)).ok_or_else(|| {
                DriverError::Internal(format!("argument `{name}` was checked but not kept"))
            })
        })
        .collect()
}

/// An argument's elements as [`each_input`] hands them on: values (read,
/// drawn or given as `f64`s), or a given tensor's bytes as stored.
pub enum Elements<'a> {
    /// Values in row-major order.
    Values(&'a mut dyn Iterator<Item = f64>),
    /// Little-endian bytes of the parameter's element type.
    Bytes(&'a [u8]),
}

/// [`prepare_inputs`] one argument at a time, in order, as its type and its
/// elements: `each` takes the elements as they are drawn (or read), so that
/// a caller laying them out for compiled code never holds a tensor as
/// `f64`s, nor all of them twice.
pub fn each_input(
    f: &Interface,
    files: &[(String, PathBuf)],
    tensors: &[(String, Value)],
    seed: Option<u64>,
    mut each: impl FnMut(&TensorType, Elements<'_>) -> Result<(), DriverError>,
) -> Result<(), DriverError> {
    let params: Vec<(&str, &TensorType)> =
        f.params.iter().map(|p| (p.name.as_str(), &p.ty)).collect();
    enum Given<'a> {
        File(&'a Path),
        Tensor(&'a Value),
    }
    let given_files = files.iter().map(|(n, p)| (n, Given::File(p)));
    let given_tensors = tensors.iter().map(|(n, t)| (n, Given::Tensor(t)));
    let mut given: HashMap<&str, Given<'_>> = HashMap::new();
    for (name, what) in given_files.chain(given_tensors) {
        if !params.iter().any(|(p, _)| p == name) {
            let all: Vec<&str> = params.iter().map(|(p, _)| *p).collect();
            return Err(DriverError::Usage(format!(
                "`{}` has no parameter `{name}`; its parameters: {}",
                f.name,
                all.join(", ")
            )));
        }
        if given.insert(name.as_str(), what).is_some() {
            return Err(DriverError::Usage(format!("input `{name}` is given twice")));
        }
    }
    let missing: Vec<&str> = params
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| !given.contains_key(p))
        .collect();
    if seed.is_none() && !missing.is_empty() {
        return Err(DriverError::Usage(format!(
            "missing input(s) for `{}`: {}; pass --input NAME=FILE.npy for each, or --random-inputs SEED",
            f.name,
            missing.join(", ")
        )));
    }
    for (name, ty) in &params {
        if ty
            .num_elements()
            .is_none_or(|n| n > dlc_graph::interp::MAX_ELEMENTS)
        {
            return Err(DriverError::Usage(format!(
                "input `{name}` ({ty}) has more elements than dlc holds in memory (limit {})",
                dlc_graph::interp::MAX_ELEMENTS
            )));
        }
    }
    let mut rng = seeded_rng(seed.unwrap_or(0));
    // Parameters after the last one drawn for are not drawn for at all: no
    // value drawn after it is used (an imported model's weights, bound,
    // are most of its elements and come last).
    let last_drawn = params.iter().rposition(|(p, _)| !given.contains_key(p));
    for (k, (name, ty)) in params.iter().enumerate() {
        // Draw for every parameter before it, so a parameter's random value
        // does not depend on which others were given.
        let range = f.params[k].range;
        let random =
            (last_drawn >= Some(k)).then(|| HostTensor::random_values_in(ty, range, &mut rng));
        let read;
        let (t, from) = match (given.get(name), random) {
            (Some(Given::File(path)), random) => {
                random.into_iter().flatten().for_each(drop);
                read = Value::Host(HostTensor::read_npy(path, Some(ty.dtype))?);
                (&read, format!(" from {}", path.display()))
            }
            (Some(Given::Tensor(t)), random) => {
                random.into_iter().flatten().for_each(drop);
                (*t, String::new())
            }
            // Not given: drawn for, by `last_drawn`'s definition.
            (None, random) => {
                each(ty, Elements::Values(&mut random.into_iter().flatten()))?;
                continue;
            }
        };
        if t.ty() != *ty {
            return Err(DriverError::Usage(format!(
                "input `{name}` must be {ty}, got {}{from}",
                t.ty()
            )));
        }
        match t {
            Value::Host(t) => each(ty, Elements::Values(&mut t.data.iter().copied()))?,
            Value::Raw(t) => each(ty, Elements::Bytes(t.bytes()))?,
        }
    }
    Ok(())
}

pub use dlc_graph::interp::DEFAULT_WORK_LIMIT;
pub use weights::{
    SafeTensorsFile, TensorBytes, WeightSource, bind_weights, read_safetensors, read_weights,
    safetensors_dtype, write_safetensors, write_safetensors_bytes,
};

pub use dlc_runtime::RandomRange;
pub use dlc_runtime::check::{
    GRADIENT_SCALE_FLOOR, ResultCheck, TF32_TOLERANCE, check_results, check_results_with_floors,
    check_tolerance, gradient_floors,
};

/// For each parameter of `f`, how its random values are drawn, from the ops
/// that read it (directly or through reshapes, transposes, broadcasts,
/// slices, concatenations, products by anything, quotients by anything,
/// and sums with a constant, as a batchnorm folded into convolution weights
/// leaves them, or with a value never negative, as Adam's second moment is
/// updated): [`RandomRange::Positive`] for a batchnorm
/// variance, the operand of `sqrt`, `rsqrt` or `log` and the base of
/// `pow`; [`RandomRange::Weight`] for the right operand of a matrix product
/// (fan-in: the contraction length) and the weights of a convolution
/// (fan-in: input channels per group times the kernel's size);
/// [`RandomRange::Unit`] otherwise.
pub fn random_ranges(f: &Function) -> Vec<RandomRange> {
    use dlc_core::scalar::{BinaryOp, UnaryOp};
    use dlc_graph::Op;
    let range = |node: petgraph::stable_graph::NodeIndex| {
        let mut found = RandomRange::Unit;
        let mut stack = vec![node];
        let mut seen = std::collections::HashSet::new();
        while let Some(n) = stack.pop() {
            if !seen.insert(n) {
                continue;
            }
            for u in f.body.neighbors_directed(n, petgraph::Direction::Outgoing) {
                let operands = f.operands(u);
                let at = |k: usize| operands.get(k).is_some_and(|v| v.node == n);
                match &f.body[u].op {
                    Op::Unary(UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Log) => {
                        return RandomRange::Positive;
                    }
                    Op::BatchNorm { .. } if at(2) => return RandomRange::Positive,
                    Op::Binary(BinaryOp::Pow) if at(0) => return RandomRange::Positive,
                    Op::MatMul if at(1) => {
                        let k = operands
                            .first()
                            .and_then(|a| f.value_type(*a).shape.last().copied())
                            .unwrap_or(1);
                        found = RandomRange::Weight(1.0 / (k.max(1) as f64).sqrt());
                    }
                    Op::Conv2d { .. } if at(1) => {
                        let fan_in: usize =
                            f.value_type(operands[1]).shape.iter().skip(1).product();
                        found = RandomRange::Weight(1.0 / (fan_in.max(1) as f64).sqrt());
                    }
                    Op::Reshape { .. }
                    | Op::Transpose { .. }
                    | Op::Broadcast { .. }
                    | Op::Slice { .. }
                    | Op::Concat { .. } => stack.push(u),
                    // What optimization makes of a batchnorm folded into a
                    // convolution's weights: `sqrt(v + eps)`, and the
                    // weights scaled per channel (`w * (g / sqrt(..))`).
                    // And Adam's second moment: `b2 v + (1 - b2) g^2`, then
                    // divided by its bias correction, then `sqrt`.
                    Op::Binary(BinaryOp::Add)
                        if operands.iter().any(|v| v.node != n && nonnegative(f, *v)) =>
                    {
                        stack.push(u)
                    }
                    Op::Binary(BinaryOp::Mul) => stack.push(u),
                    Op::Binary(BinaryOp::Div) if at(0) => stack.push(u),
                    _ => {}
                }
            }
        }
        found
    };
    f.params.iter().map(|(_, n)| range(*n)).collect()
}

/// Whether `v` is a constant or never negative by its form (`x * x`, an
/// `exp`, an `abs`, products and sums of such, looked for 8 ops deep):
/// adding it keeps a value that must be positive so.
fn nonnegative(f: &Function, v: dlc_graph::Value) -> bool {
    nonnegative_within(f, v, 8)
}

fn nonnegative_within(f: &Function, v: dlc_graph::Value, depth: u32) -> bool {
    use dlc_core::scalar::{BinaryOp, UnaryOp};
    use dlc_graph::Op;
    let operands = f.operands(v.node);
    match &f.body[v.node].op {
        Op::Constant(_) => true,
        Op::Unary(
            UnaryOp::Abs | UnaryOp::Exp | UnaryOp::Sqrt | UnaryOp::Relu | UnaryOp::Sigmoid,
        ) => true,
        Op::Binary(BinaryOp::Mul) if operands.len() == 2 && operands[0] == operands[1] => true,
        Op::Binary(BinaryOp::Mul | BinaryOp::Add) if depth > 0 => operands
            .iter()
            .all(|o| nonnegative_within(f, *o, depth - 1)),
        _ => false,
    }
}

/// Writes inputs as `DIR/NAME.npy`, one file per parameter of `f` but those
/// named in `except` (weights the model carried, which are not inputs).
pub fn save_inputs(
    dir: &Path,
    f: &Interface,
    inputs: &[Value],
    except: &[String],
) -> Result<Vec<PathBuf>, DriverError> {
    create_dir(dir)?;
    f.params
        .iter()
        .zip(inputs)
        .filter(|(p, _)| !except.contains(&p.name))
        .map(|(Param { name, .. }, v)| {
            let path = dir.join(format!("{name}.npy"));
            match v {
                Value::Host(t) => t.write_npy(&path)?,
                Value::Raw(t) => t.to_host()?.write_npy(&path)?,
            }
            Ok(path)
        })
        .collect()
}

fn dir_error(dir: &Path) -> impl Fn(std::io::Error) -> DriverError + '_ {
    move |source| DriverError::Io {
        path: dir.display().to_string(),
        source,
    }
}

/// Creates `dir` if needed (writing a file in it reports any other problem).
fn create_dir(dir: &Path) -> Result<(), DriverError> {
    std::fs::create_dir_all(dir).map_err(dir_error(dir))
}

/// Creates `dir` if needed and checks that files can be written in it, so
/// that a run does not fail only after its work is done.
pub fn ensure_writable_dir(dir: &Path) -> Result<(), DriverError> {
    let io = dir_error(dir);
    create_dir(dir)?;
    let probe = dir.join(format!(".dlc-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(&io)?;
    std::fs::remove_file(&probe).map_err(io)
}

/// Runs entry point `f` of `module` on the reference interpreter, within
/// [`DEFAULT_WORK_LIMIT`].
pub fn interpret(
    module: &Module,
    f: &Function,
    inputs: &[HostTensor],
) -> Result<Vec<HostTensor>, DriverError> {
    interpret_within(module, f, inputs, DEFAULT_WORK_LIMIT)
}

/// Runs entry point `f` of `module` on the reference interpreter, refusing
/// (before running anything) a program whose estimated work is above
/// `limit` element operations.
pub fn interpret_within(
    module: &Module,
    f: &Function,
    inputs: &[HostTensor],
    limit: f64,
) -> Result<Vec<HostTensor>, DriverError> {
    let args: Vec<Tensor> = inputs
        .iter()
        .map(|h| Tensor::from_vec(&h.ty, h.data.clone()))
        .collect::<Result<_, _>>()?;
    let outputs = dlc_graph::interp::run_function_within(module, &f.name, &args, limit)?;
    outputs
        .into_iter()
        .map(|t| {
            let ty = t.ty();
            let data = t.data.iter().copied().collect();
            Ok(HostTensor::new(ty, data)?)
        })
        .collect()
}

/// Lowers the graph module to loops and runs entry point `f` on the loop
/// interpreter, within [`DEFAULT_WORK_LIMIT`].
pub fn interpret_loops(
    module: &Module,
    f: &Function,
    inputs: &[HostTensor],
) -> Result<Vec<HostTensor>, DriverError> {
    interpret_loops_within(module, f, inputs, DEFAULT_WORK_LIMIT)
}

/// [`interpret_loops`] refusing, before running anything, a program whose
/// estimated work is above `limit` (as the graph interpreter estimates it,
/// naming the graph op; then as the loop interpreter counts its ops).
pub fn interpret_loops_within(
    module: &Module,
    f: &Function,
    inputs: &[HostTensor],
    limit: f64,
) -> Result<Vec<HostTensor>, DriverError> {
    dlc_graph::interp::check_work(module, f, limit)?;
    let lowered = dlc_lower::lower_module(module, dlc_core::TargetDesc::host())
        .map_err(|e| DriverError::Usage(e.to_string()))?;
    interpret_lowered_within(&lowered, f, inputs, limit)
}

/// Runs entry point `f`, lowered to loop (or tile) IR in `lowered`, on the
/// loop interpreter, within [`DEFAULT_WORK_LIMIT`].
pub fn interpret_lowered(
    lowered: &dlc_loop::Module,
    f: &Function,
    inputs: &[HostTensor],
) -> Result<Vec<HostTensor>, DriverError> {
    interpret_lowered_within(lowered, f, inputs, DEFAULT_WORK_LIMIT)
}

/// [`interpret_lowered`] under a work limit of `limit` executed loop ops.
pub fn interpret_lowered_within(
    lowered: &dlc_loop::Module,
    f: &Function,
    inputs: &[HostTensor],
    limit: f64,
) -> Result<Vec<HostTensor>, DriverError> {
    use dlc_loop::interp::{Buffer, run_function_within};
    interpret_buffers(&f.result_types(), inputs, "loop interpreter", |buffers| {
        let mut args: Vec<Buffer> = buffers
            .into_iter()
            .map(|(t, data)| Buffer {
                ty: dlc_loop::BufferType::contiguous(t.dtype, t.shape),
                data,
            })
            .collect();
        run_function_within(lowered, &f.name, &mut args, limit).map_err(|e| e.to_string())?;
        Ok(args.into_iter().map(|b| b.data).collect())
    })
}

/// Runs entry point `f`, scheduled as tile IR in `tiled`, on the tile
/// interpreter, under a work limit of `limit` element operations.
pub fn interpret_tile_within(
    tiled: &dlc_tile::Module,
    f: &Function,
    inputs: &[HostTensor],
    limit: f64,
) -> Result<Vec<HostTensor>, DriverError> {
    use dlc_tile::interp::{Buffer, run_function_within};
    // A function with a preparer: the preparer runs first, on the weights.
    call_prepared(tiled, &f.name, inputs, |name, inputs| {
        let g = tiled
            .functions
            .iter()
            .find(|g| g.name == name)
            .ok_or_else(|| DriverError::Usage(format!("no function @{name}")))?;
        let results = g
            .results()
            .iter()
            .map(|(n, v)| match g.ty(*v) {
                dlc_tile::Type::Buffer(b) => Ok(TensorType::new(b.dtype, b.shape.clone())),
                _ => Err(DriverError::Usage(format!(
                    "%{n} of @{name} is not a buffer"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        interpret_buffers(&results, inputs, "tile interpreter", |buffers| {
            let mut args: Vec<Buffer> = buffers
                .into_iter()
                .map(|(t, data)| Buffer {
                    ty: dlc_tile::BufferType::contiguous(t.dtype, t.shape, dlc_tile::Space::Global),
                    data,
                })
                .collect();
            run_function_within(tiled, name, &mut args, limit).map_err(|e| e.to_string())?;
            Ok(args.into_iter().map(|b| b.data).collect())
        })
    })
}

/// Calls function `name` of `tiled` on `inputs` through `run` (which runs
/// one function on all of its inputs); when `name` has a preparer, `inputs`
/// leave out the prepared inputs and `run` runs the preparer first.
pub fn call_prepared(
    tiled: &dlc_tile::Module,
    name: &str,
    inputs: &[HostTensor],
    run: impl Fn(&str, &[HostTensor]) -> Result<Vec<HostTensor>, DriverError>,
) -> Result<Vec<HostTensor>, DriverError> {
    let find = |n: &str| {
        tiled
            .functions
            .iter()
            .find(|f| f.name == n)
            .ok_or_else(|| DriverError::Usage(format!("no function @{n}")))
    };
    let main = find(name)?;
    let Some(p) = &main.prepare else {
        return run(name, inputs);
    };
    let sig = |f: &dlc_tile::Function| signature(f).map_err(DriverError::Usage);
    let binding = dlc_runtime::PrepareBinding::new(&sig(main)?, &sig(find(p)?)?)?;
    let all = binding.inputs(inputs, |weights| run(p, weights))?;
    run(name, &all)
}

/// Runs an interpreter of a lowered level over contiguous buffers: `run`
/// gets one `(type, elements)` per parameter (the inputs, then results of
/// types `result_types` filled with zeros) and gives back every buffer's elements after
/// the run; the results are read from the trailing ones.
fn interpret_buffers(
    result_types: &[TensorType],
    inputs: &[HostTensor],
    interpreter: &str,
    run: impl FnOnce(Vec<(TensorType, Vec<f64>)>) -> Result<Vec<Vec<f64>>, String>,
) -> Result<Vec<HostTensor>, DriverError> {
    let mut buffers: Vec<(TensorType, Vec<f64>)> = inputs
        .iter()
        .map(|t| (t.ty.clone(), t.data.clone()))
        .collect();
    for t in result_types {
        match t.num_elements() {
            Some(n) if n <= dlc_tile::interp::MAX_ELEMENTS => {
                buffers.push((t.clone(), vec![0.0; n]));
            }
            _ => {
                return Err(DriverError::Usage(format!(
                    "{interpreter}: result {t} is too large for the interpreter"
                )));
            }
        }
    }
    let mut out = run(buffers).map_err(|e| DriverError::Usage(format!("{interpreter}: {e}")))?;
    out.drain(..inputs.len());
    out.into_iter()
        .zip(result_types)
        .map(|(data, ty)| Ok(HostTensor::new(ty.clone(), data)?))
        .collect()
}

/// The largest relative error (max-abs difference over max-abs of the
/// reference) between two lists of results, or an error when their types
/// differ.
pub fn max_relative_error(
    got: &[HostTensor],
    reference: &[HostTensor],
) -> Result<f64, DriverError> {
    let mut worst = 0f64;
    for (i, (g, r)) in got.iter().zip(reference).enumerate() {
        if g.ty != r.ty {
            return Err(DriverError::Usage(format!(
                "result {i} is {} but the reference is {}",
                g.ty, r.ty
            )));
        }
        let scale = r.data.iter().fold(0f64, |a, x| a.max(x.abs()));
        let diff = g.data.iter().zip(&r.data).fold(0f64, |a, (x, y)| {
            if x.is_nan() && y.is_nan() {
                a
            } else if x.is_nan() || y.is_nan() {
                f64::INFINITY
            } else {
                a.max((x - y).abs())
            }
        });
        let rel = if scale > 0.0 { diff / scale } else { diff };
        worst = worst.max(rel);
    }
    Ok(worst)
}

/// [`check_tolerances`] of `f`, with f32 results at TF32's precision when
/// `tf32` (products on tensor cores as TF32).
pub fn check_tolerances_with(f: &Function, tf32: bool) -> Vec<f64> {
    let mut t = check_tolerances(f);
    if tf32 {
        for (tol, ty) in t.iter_mut().zip(f.result_types()) {
            if ty.dtype == dlc_core::DType::F32 {
                *tol = tol.max(TF32_TOLERANCE);
            }
        }
    }
    t
}

/// The tolerance of each result of `f` (see [`check_tolerance`]): its own
/// type's, or the loosest of the float types the function computes in,
/// since a result computed from f16 values is only as exact as f16 (an
/// integer result cast from floats included).
pub fn check_tolerances(f: &Function) -> Vec<f64> {
    let loosest = f
        .body
        .node_indices()
        .flat_map(|n| f.body[n].results.iter().map(|t| check_tolerance(t.dtype)))
        .fold(0f64, f64::max);
    f.result_types()
        .iter()
        .map(|t| check_tolerance(t.dtype).max(loosest))
        .collect()
}

/// Writes outputs as `DIR/out0.npy`, `DIR/out1.npy`, ... in return order.
pub fn save_outputs(dir: &Path, outputs: &[HostTensor]) -> Result<Vec<PathBuf>, DriverError> {
    let named: Vec<(String, &HostTensor)> = outputs
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("out{i}"), t))
        .collect();
    save_named_outputs(dir, &named)
}

/// File stems for outputs named `names` (an ONNX model's output names):
/// each name with every character but ASCII letters, digits, `-`, `_` and
/// a `.` not first replaced by `_` (no name leaves the directory or hides
/// in it), `out{i}` for one that is empty, and `_2`, `_3`, ... added to a
/// stem already taken.
pub fn output_file_stems(names: &[&str]) -> Vec<String> {
    let mut taken = std::collections::HashSet::new();
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut stem: String = name
                .chars()
                .enumerate()
                .map(|(k, c)| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' || (c == '.' && k > 0) {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            if stem.is_empty() {
                stem = format!("out{i}");
            }
            let base = stem.clone();
            let mut k = 2;
            while !taken.insert(stem.clone()) {
                stem = format!("{base}_{k}");
                k += 1;
            }
            stem
        })
        .collect()
}

/// Writes each tensor as `DIR/NAME.npy`.
pub fn save_named_outputs(
    dir: &Path,
    outputs: &[(String, &HostTensor)],
) -> Result<Vec<PathBuf>, DriverError> {
    create_dir(dir)?;
    outputs
        .iter()
        .map(|(name, t)| {
            let path = dir.join(format!("{name}.npy"));
            t.write_npy(&path)?;
            Ok(path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlc_core::DType;

    fn t(data: &[f64]) -> HostTensor {
        HostTensor::new(TensorType::new(DType::F32, vec![data.len()]), data.to_vec())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn check(got: &[f64], want: &[f64]) -> ResultCheck {
        let mut c = check_results(&[t(got)], &[t(want)], &[1e-4]).unwrap_or_else(|e| panic!("{e}"));
        c.remove(0)
    }

    /// A gradient that is zero in real arithmetic is rounding noise on both
    /// sides: compared on a hundredth of the largest gradient's scale it
    /// passes, while a real error in a small gradient still fails; the
    /// value before the gradients keeps its own scale.
    #[test]
    fn gradients_are_compared_on_the_scale_of_the_largest() {
        let reference = [t(&[2.0]), t(&[0.5, -0.5]), t(&[3e-9, -1e-9])];
        let got = [t(&[2.0]), t(&[0.5, -0.5]), t(&[-2e-9, 2e-9])];
        let tolerances = [1e-4; 3];
        assert!(!check_results(&got, &reference, &tolerances).unwrap()[2].passed());
        let floors = gradient_floors(&reference, 1);
        assert_eq!(
            floors,
            [0.0, GRADIENT_SCALE_FLOOR * 0.5, GRADIENT_SCALE_FLOOR * 0.5]
        );
        let checks = check_results_with_floors(&got, &reference, &tolerances, &floors).unwrap();
        assert!(checks.iter().all(ResultCheck::passed), "{checks:?}");
        // Off by 1e-6: 2e-4 of the scale 5e-3, beyond f32's tolerance.
        let got = [t(&[2.0]), t(&[0.5, -0.5]), t(&[3e-9 + 1e-6, -1e-9])];
        let checks = check_results_with_floors(&got, &reference, &tolerances, &floors).unwrap();
        assert!(!checks[2].passed(), "{:?}", checks[2]);
    }

    /// Weights built in as constants compute what the same weights bound
    /// as arguments compute, and leave the signature (the others move up);
    /// a weight read through a callee is found by the entry's name for it.
    #[test]
    fn weights_built_in_compute_what_weights_bound_compute() {
        let src = SourceText {
            name: "t.dl".into(),
            text: "fn layer(h: f32[4, 3], w: f32[3, 3]) -> f32[4, 3] { return tanh(h @ w); }
                   fn f(weight w1: f32[3, 3], x: f32[4, 3], weight b: f32[3], s: f32) -> f32[4, 3] {
                       return layer(x, w1) * s + b;
                   }"
            .into(),
            weights: Vec::new(),
        };
        let m = compile_source(&src).unwrap_or_else(|e| panic!("{e}"));
        let dir = std::env::temp_dir().join(format!("dlc-bind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = m.function("f").unwrap();
        let args = prepare_inputs(f, &[], Some(4)).unwrap_or_else(|e| panic!("{e}"));
        args[0].write_npy(&dir.join("w1.npy")).unwrap();
        args[2].write_npy(&dir.join("b.npy")).unwrap();
        let want = interpret(&m, f, &args).unwrap_or_else(|e| panic!("{e}"));

        let mut bound = m.clone();
        assert_eq!(bind_weights(&mut bound, &[], &dir).unwrap(), 2);
        let g = bound.function("f").unwrap();
        let names: Vec<&str> = g.params.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x", "s"]);
        assert!(g.weights.is_empty());
        assert_eq!(dlc_graph::verify::verify_module(&bound), []);
        let got = interpret(&bound, g, &[args[1].clone(), args[3].clone()])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, want);

        // A weight of the wrong type is refused by name.
        HostTensor::new(TensorType::new(DType::F32, vec![3]), vec![0.0; 3])
            .unwrap()
            .write_npy(&dir.join("w1.npy"))
            .unwrap();
        let e = bind_weights(&mut m.clone(), &[], &dir)
            .unwrap_err()
            .to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.contains("`w1` is f32[3, 3], but"), "{e}");
    }

    #[test]
    fn output_names_become_file_stems_inside_the_directory() {
        assert_eq!(
            output_file_stems(&[
                "logits",
                "../x",
                "/enc/Add_output_0",
                "",
                "a b",
                "logits",
                ".hidden"
            ]),
            [
                "logits",
                "_._x",
                "_enc_Add_output_0",
                "out3",
                "a_b",
                "logits_2",
                "_hidden"
            ]
        );
    }

    /// `f(x, weight w, weight b) = x * w + b`, carrying `weights`.
    fn weighted(weights: Vec<(&str, Vec<f64>)>) -> SourceText {
        SourceText {
            name: "m.dl".into(),
            text:
                "fn f(x: f32[2], weight w: f32[2], weight b: f32[]) -> f32[2] { return x * w + b; }"
                    .into(),
            weights: weights
                .into_iter()
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
        }
    }

    /// Weights carried with a source are bound as constants when it is
    /// compiled (an imported ONNX model's); a value no weight takes, or of
    /// the wrong size, is an error.
    #[test]
    fn source_weights_are_bound_when_compiled() {
        let m = compile_source(&weighted(vec![("w", vec![2.0, 3.0])])).unwrap();
        let f = m.function("f").unwrap();
        let names: Vec<&str> = f.params.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x", "b"]);
        assert_eq!(f.weights.len(), 1);
        let x = HostTensor::new(TensorType::new(DType::F32, vec![2]), vec![1.0, 2.0]).unwrap();
        let b = HostTensor::new(TensorType::new(DType::F32, vec![]), vec![0.5]).unwrap();
        let y = interpret(&m, f, &[x, b]).unwrap();
        assert_eq!(y[0].data, [2.5, 6.5]);
        let e = compile_source(&weighted(vec![("v", vec![1.0, 2.0])]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "error: m.dl: no function declares the weight `v` a value is given for"
        );
        let e = compile_source(&weighted(vec![("w", vec![1.0])]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "error: m.dl: weight `w` is f32[2], its value has 1 elements"
        );
    }

    /// `compile_source_unbound` leaves carried weights as parameters and
    /// returns their values, which compute what the constants do.
    #[test]
    fn carried_weights_can_stay_parameters() {
        let (m, carried) =
            compile_source_unbound(weighted(vec![("w", vec![2.0, 3.0]), ("b", vec![0.5])]))
                .unwrap();
        let f = m.function("f").unwrap();
        let names: Vec<&str> = f.params.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x", "w", "b"]);
        assert_eq!(f.weights.len(), 2);
        let carried_names: Vec<&str> = carried.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(carried_names, ["w", "b"]);
        assert_eq!(carried[0].1.ty, TensorType::new(DType::F32, vec![2]));
        assert_eq!(carried[1].1.ty, TensorType::new(DType::F32, vec![]));
        let x = HostTensor::new(TensorType::new(DType::F32, vec![2]), vec![1.0, 2.0]).unwrap();
        let files = [];
        let args = prepare_inputs_with(
            &f.into(),
            &files,
            [vec![("x".into(), x)], carried].concat(),
            None,
        )
        .unwrap();
        let y = interpret(&m, f, &args).unwrap();
        assert_eq!(y[0].data, [2.5, 6.5]);
        // A value of the wrong size is the same error as when bound.
        let e = compile_source_unbound(weighted(vec![("w", vec![1.0])]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "error: m.dl: weight `w` is f32[2], its value has 1 elements"
        );
    }

    /// Inputs drawn at random are the same whether or not later parameters
    /// are given (and the given ones are not drawn for at all).
    #[test]
    fn random_inputs_do_not_depend_on_later_given_ones() {
        let m = compile_source(&SourceText {
            name: "m.dl".into(),
            text: "fn f(x: f32[2], y: f32[2], weight w: f32[2]) -> f32[2] { return y * w + x; }"
                .into(),
            weights: Vec::new(),
        })
        .unwrap();
        let f = m.function("f").unwrap();
        let w = HostTensor::new(TensorType::new(DType::F32, vec![2]), vec![4.0, 5.0]).unwrap();
        let drawn = prepare_inputs_with(&f.into(), &[], Vec::new(), Some(7)).unwrap();
        let given =
            prepare_inputs_with(&f.into(), &[], vec![("w".into(), w.clone())], Some(7)).unwrap();
        assert_eq!(given[0], drawn[0]);
        assert_eq!(given[1], drawn[1]);
        assert_eq!(given[2], w);
        assert_ne!(drawn[2], w);
    }

    /// `dlc run` and `dlc bench` lower and compile the entry point they run
    /// and nothing else of the file.
    #[test]
    fn only_the_chosen_entry_point_is_lowered() {
        let mut m = compile_source(&SourceText {
            name: "t.dl".into(),
            text: "fn small(x: f32[4]) -> f32[4] { return x * 2.0; }
                   fn big(x: f32[512, 512], y: f32[512, 512]) -> f32[512, 512] { return x @ y; }"
                .into(),
            weights: Vec::new(),
        })
        .unwrap_or_else(|e| panic!("{e}"));
        run_passes(&mut m, DEFAULT_PIPELINE, PassOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let only = only_entry(&m, Some("small")).unwrap_or_else(|e| panic!("{e}"));
        let entries: Vec<&str> = only.entry_points().map(|f| f.name.as_str()).collect();
        assert_eq!(entries, ["small"]);
        let tiles = lower_for_cpu(&only).unwrap_or_else(|e| panic!("{e}"));
        let text = dlc_tile::print_module(&tiles);
        assert!(text.contains("@small") && !text.contains("@big"), "{text}");
        assert!(
            only_entry(&m, None).is_err(),
            "two entry points need one chosen"
        );
        assert!(only_entry(&m, Some("nope")).is_err());
    }

    /// A batchnorm folded into a convolution's declared weights leaves
    /// `sqrt(v + eps)` and `w * scale`: the variance is still drawn
    /// positive and the weights still scaled by their fan-in.
    #[test]
    fn random_ranges_survive_batchnorm_folding() {
        let mut m = compile_source(&SourceText {
            name: "t.dl".into(),
            text: "fn f(x: f32[1, 2, 6, 6], weight w: f32[4, 2, 3, 3], weight m: f32[4],
                        weight v: f32[4], weight g: f32[4], weight b: f32[4]) -> f32[1, 4, 6, 6] {
                       return batchnorm(conv2d(x, w, padding=1), m, v, g, b, eps=1e-5);
                   }"
            .into(),
            weights: Vec::new(),
        })
        .unwrap_or_else(|e| panic!("{e}"));
        run_passes(&mut m, DEFAULT_PIPELINE, PassOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let f = select_entry(&m, None).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            !m.functions
                .iter()
                .flat_map(|f| f.body.node_weights())
                .any(|n| matches!(n.op, dlc_graph::Op::BatchNorm { .. })),
            "the batchnorm should be folded"
        );
        let ranges = random_ranges(f);
        assert_eq!(ranges[1], RandomRange::Weight(1.0 / 18f64.sqrt()));
        assert_eq!(ranges[3], RandomRange::Positive);
        assert_eq!(ranges[0], RandomRange::Unit);
    }

    #[test]
    fn checks_compare_within_the_tolerance_of_the_type() {
        assert_eq!(check_tolerance(DType::F32), 1e-4);
        assert_eq!(check_tolerance(DType::F16), 1.0 / 256.0);
        assert_eq!(check_tolerance(DType::BF16), 1.0 / 32.0);
        assert_eq!(check_tolerance(DType::I32), 0.0);
        let c = check(&[1.0, 2.00005], &[1.0, 2.0]);
        assert!(c.passed(), "{c}");
        assert!((c.relative_error - 2.5e-5).abs() < 1e-7, "{c}");
        assert!(!check(&[1.0, 2.001], &[1.0, 2.0]).passed());
    }

    #[test]
    fn nan_and_infinity_must_be_in_the_same_places() {
        // A NaN or infinity where the reference is finite, or the reverse.
        for (got, want) in [
            (f64::NAN, 1.0),
            (1.0, f64::NAN),
            (f64::INFINITY, 1.0),
            (1.0, f64::NEG_INFINITY),
            (f64::INFINITY, f64::NEG_INFINITY),
            (f64::NAN, f64::INFINITY),
        ] {
            let c = check(&[0.5, got], &[0.5, want]);
            assert!(!c.passed(), "{got} vs {want}: {c}");
            assert!(c.to_string().contains("element 1 is"), "{c}");
        }
        // The same non-finite values are equal, and said.
        let c = check(
            &[f64::INFINITY, f64::NAN, 1.0],
            &[f64::INFINITY, f64::NAN, 1.0],
        );
        assert!(c.passed(), "{c}");
        assert_eq!(c.nan_in_both, 1);
        assert!(
            c.to_string().contains("1 element(s) are NaN in both"),
            "{c}"
        );
        let c = check(&[f64::NAN, f64::NAN], &[f64::NAN, f64::NAN]);
        assert!(c.all_nan());
        assert!(
            c.to_string()
                .contains("every element is NaN in both results, so nothing was compared"),
            "{c}"
        );
    }
}
