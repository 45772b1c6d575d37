//! `dlc`: check, compile, run and benchmark models written in the dlc
//! language.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use dlc_driver::Elements;
use dlc_driver::{
    Artifact, CompileOptions, DEFAULT_PIPELINE, DEFAULT_WORK_LIMIT, DriverError, NativeArtifact,
    PassOptions, compile_source, interpret_loops_within, interpret_within, prepare_inputs,
    read_model, run_passes, save_outputs, select_entry,
};
use dlc_runtime::{HostTensor, Value};

mod distributed;
mod phases;
mod program;
mod train;

#[derive(Parser)]
#[command(name = "dlc", version, about = "The dlc deep-learning compiler")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Emit {
    /// Graph dialect text.
    Graph,
    /// Graph dialect in MLIR's generic operation syntax.
    GraphMlir,
    /// Loop dialect text.
    Loop,
    /// Loop dialect in MLIR's generic operation syntax.
    LoopMlir,
    /// The loop level in upstream MLIR dialects (func, memref, scf, arith,
    /// math), verified by MLIR: `mlir-opt` reads it as is.
    Mlir,
    /// The tile level scheduled for `--target` in upstream MLIR (tiles as
    /// tensors; also scf.parallel over the grid, memref, arith, math).
    MlirTile,
    /// Tile dialect text (kernels scheduled for `--target`).
    Tile,
    /// Tile dialect in MLIR's generic operation syntax.
    TileMlir,
    /// LLVM IR.
    Llvm,
    /// Assembly.
    Asm,
    /// Object file.
    Obj,
    /// Shared library.
    So,
    /// Static library (an `ar` archive of the object file); link it with
    /// `-lm`, and `-lgomp` for threads.
    Lib,
    /// C header for the compiled entry points.
    Header,
    /// Safe Rust bindings for the compiled entry points (`ndarray` tensors,
    /// `Result` errors), to `include!` in a program linking the static
    /// library.
    Rust,
    /// PTX for an NVIDIA GPU (`--target sm_80` or `sm_90`), with comments
    /// saying which kernels each entry point launches, with what grid.
    Ptx,
    /// A GPU module file (`--target sm_80` or `sm_90`, `-o model.dlcm`):
    /// the PTX, each entry point's launch plan and signature, in one
    /// checksummed file that `dlc-rt` runs with no compiler present.
    GpuModule,
}

impl Emit {
    fn artifact(self) -> Artifact {
        match self {
            Emit::Graph => Artifact::Graph,
            Emit::GraphMlir => Artifact::GraphMlir,
            Emit::Loop => Artifact::Loop,
            Emit::LoopMlir => Artifact::LoopMlir,
            Emit::Mlir => Artifact::Mlir,
            Emit::MlirTile => Artifact::MlirTile,
            Emit::Tile => Artifact::Tile,
            Emit::TileMlir => Artifact::TileMlir,
            Emit::Llvm => Artifact::Native(NativeArtifact::LlvmIr),
            Emit::Asm => Artifact::Native(NativeArtifact::Assembly),
            Emit::Obj => Artifact::Native(NativeArtifact::Object),
            Emit::So => Artifact::Native(NativeArtifact::SharedLibrary),
            Emit::Lib => Artifact::Native(NativeArtifact::StaticLibrary),
            Emit::Header => Artifact::CHeader,
            Emit::Rust => Artifact::RustBindings,
            Emit::Ptx => Artifact::Native(NativeArtifact::Ptx),
            Emit::GpuModule => Artifact::GpuModule,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// The reference interpreter of the graph dialect.
    Interp,
    /// The program lowered to loop nests, run by the loop interpreter.
    Loop,
    /// The program scheduled as tile kernels for `--target`, run by the
    /// tile interpreter.
    Tile,
    /// Compiled native code for this CPU (from tile IR scheduled for the
    /// host).
    Cpu,
    /// Compiled code for an NVIDIA GPU (GPU 0, through the CUDA driver):
    /// PTX for the device's compute capability (sm_80 or sm_90 class).
    Gpu,
    /// The GPU's kernels (scheduled for `--target`, sm_90 unless another GPU
    /// is named) run on this CPU by an emulator, one CPU thread per GPU
    /// thread: slow, for checking GPU code on machines without one.
    GpuEmulator,
    /// The loop nests in upstream MLIR, lowered by MLIR's own passes and
    /// run by its execution engine: a second, independent CPU back end to
    /// cross-check `cpu` (scalar and sequential, not fast).
    Mlir,
    /// The tile kernels scheduled for this CPU in upstream MLIR, bufferized
    /// and lowered by MLIR and run by its execution engine: a cross-check of
    /// the schedules `cpu` compiles.
    MlirTile,
}

/// How an ONNX model is imported.
#[derive(clap::Args)]
struct OnnxArgs {
    /// The shape of an ONNX input with symbolic dimensions, as
    /// NAME=[d0,d1,...]; repeat for each such input.
    #[arg(long = "shape", value_name = "NAME=[..]")]
    shape: Vec<String>,
    /// Bind an ONNX input to a tensor (NAME=PATH.npy): it becomes a
    /// constant of the program, as an input that sets a shape must be.
    #[arg(long = "bind", value_name = "NAME=PATH")]
    bind: Vec<String>,
}

impl OnnxArgs {
    fn options(&self) -> Result<dlc_onnx::Options, DriverError> {
        dlc_driver::onnx_options(&self.shape, &self.bind)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Parse and check a model; report every error found.
    Check {
        /// The `.dl` file (`-` for standard input) or `.onnx` model.
        file: String,
        #[command(flatten)]
        onnx: OnnxArgs,
    },
    /// List the language's built-in functions with their parameters (the
    /// index at the end of docs/language.md), as Markdown.
    Builtins,
    /// Import an ONNX model as a dlc program: its large initializers become
    /// `weight` parameters, their values written to a safetensors file
    /// beside the program (give it to run, bench and compile with --weights)
    Import {
        /// The `.onnx` model.
        file: String,
        /// Output file (`-` for standard output).
        #[arg(short, long, default_value = "-")]
        output: String,
        /// Where the weights go (default: the output file with the extension
        /// `.safetensors`; required when the program goes to standard output
        /// and has weights)
        #[arg(long, value_name = "PATH")]
        weights_out: Option<String>,
        /// Write every initializer into the program as a literal (a
        /// self-contained program, slow to read for a large model)
        #[arg(long, conflicts_with = "weights_out")]
        inline_weights: bool,
        #[command(flatten)]
        onnx: OnnxArgs,
    },
    /// Compile a model to the chosen artifact.
    Compile(CompileArgs),
    /// Run an entry point of a model.
    Run(RunArgs),
    /// Differentiate an entry point whose first result is a float scalar:
    /// run it and the gradient of that result with respect to parameters.
    Grad(GradArgs),
    /// Train the weights of a loss function on a data set: its `weight`
    /// parameters, each epoch over the data shuffled and cut into batches.
    Train {
        #[command(flatten)]
        args: train::TrainArgs,
    },
    /// Measure compile time and steady-state latency of an entry point
    /// compiled for this CPU (random inputs from seed 0).
    Bench {
        /// The `.dl` file or `.onnx` model.
        file: String,
        #[command(flatten)]
        onnx: OnnxArgs,

        /// Entry point to measure; may be left out when there is only one.
        #[arg(long)]
        entry: Option<String>,
        /// Threads parallel loops run on (0: one per core). At two or more
        /// it also says how long a cache line takes between two threads
        /// and back after the runs: the placement of the cores they ran on.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Timed runs (at least 20 for reported figures).
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Untimed warm-up runs before them.
        #[arg(long, default_value_t = 3)]
        warmup: usize,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Graph pipeline to run before lowering (compare with and without
        /// `graph.saturate` in one run).
        #[arg(long, default_value = DEFAULT_PIPELINE)]
        passes: String,
        /// Where to run it: `cpu` (this CPU) or `gpu` (GPU 0).
        #[arg(long, value_enum, default_value = "cpu")]
        backend: Backend,
        /// With `--backend gpu`: f32 products on tensor cores as TF32.
        #[arg(long)]
        tf32: bool,
        /// With `--backend cpu`: take compiled kernels from the object cache
        /// and store them there, as `dlc run` does (by default the compile
        /// is a cold one, and nothing is read or written).
        #[arg(long)]
        cache: bool,
        /// Bind the `weight` parameters from PATH (a directory of NAME.npy
        /// or a .safetensors file, as `dlc run --weights`) instead of
        /// drawing them at random.
        #[arg(long, value_name = "PATH")]
        weights: Option<PathBuf>,
        /// With `--backend cpu`: time every kernel launch of the timed runs
        /// (code compiled with a clock read before and after each launch)
        /// and list the kernels by the time spent in them, each with the
        /// place of the op it computes.
        #[arg(long)]
        profile: bool,
    },
    /// Measure this machine with the project's own compiled kernels (one
    /// thread) and write the constants of the cost model `graph.saturate`
    /// extracts by.
    Calibrate {
        /// Where to write the model (`-` for standard output). By default
        /// the cost model of the source tree (`dialects/graph/cost-model.json`)
        /// when run at the root of dlc's repository, `dlc-cost-model.json` in
        /// the current directory elsewhere. The compiler uses the model it was
        /// built with: copy the file into the source tree and rebuild.
        #[arg(short, long)]
        output: Option<String>,
        /// Timed runs per kernel.
        #[arg(long, default_value_t = 30)]
        runs: usize,
    },
}

/// What `dlc compile` was asked for.
#[derive(clap::Args)]
struct CompileArgs {
    /// The `.dl` file (`-` for standard input) or `.onnx` model.
    file: String,
    #[command(flatten)]
    onnx: OnnxArgs,

    /// Keep only this entry point.
    #[arg(long)]
    entry: Option<String>,
    /// What to produce.
    #[arg(long, value_enum, default_value = "graph")]
    emit: Emit,
    /// Output file (`-` for standard output, which `--emit so|lib` refuse:
    /// libraries are written to a file).
    #[arg(short, long, default_value = "-")]
    output: String,
    /// Graph pipeline to run.
    #[arg(long, default_value = DEFAULT_PIPELINE)]
    passes: String,
    /// Print each pass's statistics (to standard error): for
    /// `graph.saturate`, the stop reason, e-graph size, time and
    /// estimated cost before and after.
    #[arg(long)]
    stats: bool,
    /// Prefix of the exported symbols (llvm, asm, obj, so, lib, header):
    /// entry point `f` of `model.dl` is `dlc_model_f` by default.
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
    /// The target tile IR is scheduled for (`--emit tile|tile-mlir`):
    /// host, x86-64-avx512, x86-64-avx2, aarch64-linux-gnu, sm_80 or
    /// sm_90; `aarch64-linux-gnu` also cross-compiles the artifacts
    /// (llvm, asm, obj, lib, header) for 64-bit Arm Linux.
    #[arg(long, default_value = "host")]
    target: String,
    /// The x86-64 CPU compiled code is for (llvm, asm, obj, so, lib,
    /// header, rust): `native` (this machine, every feature it has), a
    /// level whose code runs on any CPU of it: `x86-64` (SSE2),
    /// `x86-64-v2` (SSE4.2), `x86-64-v3` (AVX2, FMA), `x86-64-v4`
    /// (AVX-512); or an LLVM CPU name (`haswell`, `skylake-avx512`,
    /// `znver4`, ...: code tuned for that CPU, needing its instructions).
    #[arg(long, default_value = "native")]
    cpu: String,
    /// For a GPU target: f32 products on tensor cores as TF32 (operands
    /// rounded to 10 mantissa bits; faster, less exact).
    #[arg(long)]
    tf32: bool,
    /// Build the entry points' `weight` parameters into the artifact as
    /// constants (they leave its signatures), from PATH: a directory of
    /// NAME.npy (what `dlc train --save-weights` writes) or a
    /// .safetensors file (tensors NAME or weight.NAME).
    #[arg(long, value_name = "PATH")]
    weights: Option<PathBuf>,
}

/// What `dlc run` was asked for.
#[derive(clap::Args)]
struct RunArgs {
    /// The `.dl` file (`-` for standard input) or `.onnx` model.
    file: String,
    #[command(flatten)]
    onnx: OnnxArgs,

    /// Entry point to run; may be left out when there is only one.
    #[arg(long)]
    entry: Option<String>,
    #[command(flatten)]
    exec: ExecArgs,
    /// Write the results as DIR/out0.npy, DIR/out1.npy, ... in return order
    /// (an ONNX model's as DIR/NAME.npy, by its output names)
    #[arg(long, value_name = "DIR")]
    save_outputs: Option<PathBuf>,
    /// Write the inputs the run used as DIR/NAME.npy, one per parameter
    /// (to reproduce a run made with --random-inputs).
    #[arg(long, value_name = "DIR")]
    save_inputs: Option<PathBuf>,
    /// Bind the entry point's `weight` parameters from PATH: a directory
    /// of NAME.npy (what `dlc train --save-weights` writes) or a
    /// .safetensors file (tensors NAME or weight.NAME, as `dlc train`'s
    /// checkpoint has them); --input still overrides one.
    #[arg(long, value_name = "PATH")]
    weights: Option<PathBuf>,
    /// With `--backend gpu` or `gpu-emulator`: f32 products on tensor
    /// cores as TF32 (operands rounded to 10 mantissa bits); `--check`
    /// then compares f32 results at TF32's precision.
    #[arg(long)]
    tf32: bool,
}

/// What `dlc grad` was asked for.
#[derive(clap::Args)]
struct GradArgs {
    /// The `.dl` file (`-` for standard input).
    file: String,
    /// Entry point to differentiate; may be left out when there is only one.
    #[arg(long)]
    entry: Option<String>,
    /// Parameters to differentiate with respect to, comma separated
    /// (default: the entry point's weights, or every float parameter
    /// when it declares none).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    wrt: Vec<String>,
    #[command(flatten)]
    exec: ExecArgs,
    /// Write the results as DIR/out0.npy (the value; out1.npy, ... for
    /// further results of the entry point) and DIR/grad_NAME.npy, one
    /// per differentiated parameter.
    #[arg(long, value_name = "DIR")]
    save_outputs: Option<PathBuf>,
}

/// Tile IR scheduled for this CPU: what the CPU back end compiles.
fn cpu_tiles(module: &dlc_graph::Module) -> Result<dlc_tile::Module, DriverError> {
    dlc_driver::lower_for_cpu(module)
}

/// Tile IR scheduled for the target named `target`.
fn tiled(module: &dlc_graph::Module, target: &str) -> Result<dlc_tile::Module, DriverError> {
    let target = dlc_core::TargetDesc::named(target).map_err(DriverError::Usage)?;
    dlc_driver::lower_for_tile(module, &target)
}

fn codegen(e: dlc_llvm::CodegenError) -> DriverError {
    DriverError::Usage(e.to_string())
}

/// Compiles entry point `f` of `module` for this CPU through LLVM and calls
/// it in process on `inputs` (see [`call_jit`]).
fn run_cpu<T: dlc_runtime::Input>(
    module: &dlc_graph::Module,
    f: &dlc_graph::Function,
    inputs: Vec<T>,
    options: &dlc_llvm::JitOptions,
) -> Result<Vec<HostTensor>, DriverError> {
    let lowered = cpu_tiles(module)?;
    let jit = dlc_llvm::compile_in_process(&lowered, options).map_err(codegen)?;
    call_jit(&jit, &f.name, inputs)
}

/// Calls function `name` of `jit` on `inputs`, each laid out and then
/// dropped (an owned one freed) before the next.
fn call_jit<T: dlc_runtime::Input>(
    jit: &dlc_llvm::Jit,
    name: &str,
    inputs: Vec<T>,
) -> Result<Vec<HostTensor>, DriverError> {
    let kernel = jit.kernel(name).map_err(codegen)?;
    // The compiler's pages are not needed by the call.
    dlc_runtime::release_code_pages();
    kernel.call_each(inputs).map_err(runtime)
}

/// An entry point ready to run: compiled for this CPU (from the program
/// cache or not), or a graph for another back end or `--check`.
enum Compiled {
    Cpu(dlc_llvm::Jit),
    Graph(dlc_graph::Module),
}

fn runtime(e: dlc_runtime::RuntimeError) -> DriverError {
    DriverError::Usage(e.to_string())
}

/// The GPU target for a device of compute capability `cc`: sm_80 for
/// Ampere and Ada (8.x), sm_90 for Hopper and newer (the driver compiles
/// sm_90 PTX for later devices).
fn gpu_target((major, minor): (i32, i32)) -> Result<dlc_core::TargetDesc, DriverError> {
    match major {
        8 => Ok(dlc_core::TargetDesc::sm_80()),
        m if m >= 9 => Ok(dlc_core::TargetDesc::sm_90()),
        _ => Err(DriverError::Usage(format!(
            "the GPU has compute capability {major}.{minor}; dlc compiles for 8.0 (sm_80) and newer"
        ))),
    }
}

/// GPU 0 with `module` compiled (f32 products as TF32 when `tf32`) and
/// loaded for it: the device, the program, and the device in words.
fn gpu_program(
    module: &dlc_graph::Module,
    tf32: bool,
) -> Result<
    (
        dlc_runtime::cuda::Cuda,
        dlc_runtime::gpu::GpuProgram,
        String,
    ),
    DriverError,
> {
    let mut cuda = dlc_runtime::cuda::Cuda::open().map_err(runtime)?;
    let (name, cc) = cuda.describe().map_err(runtime)?;
    let mut target = gpu_target(cc)?;
    if tf32 {
        target = target.with_tf32();
    }
    let tiles = dlc_driver::lower_for_tile(module, &target)?;
    let symbols = dlc_runtime::abi::Symbols::with_prefix("dlc_").map_err(DriverError::Usage)?;
    let program = dlc_llvm::compile_gpu(&tiles, &symbols, &target).map_err(codegen)?;
    cuda.load(&program).map_err(runtime)?;
    let tf32 = if tf32 { ", TF32" } else { "" };
    Ok((cuda, program, format!("{name}, {}{tf32}", target.name)))
}

/// Compiles the entry point for GPU 0 and runs it there.
fn run_gpu(
    module: &dlc_graph::Module,
    f: &dlc_graph::Function,
    inputs: &[HostTensor],
    tf32: bool,
) -> Result<Vec<HostTensor>, DriverError> {
    let (mut cuda, program, _) = gpu_program(module, tf32)?;
    let function = program.function(&f.name).map_err(runtime)?;
    let mut prepared = dlc_runtime::gpu::Prepared::new(&mut cuda, function).map_err(runtime)?;
    prepared.call(&mut cuda, inputs).map_err(runtime)
}

/// Runs the entry point's GPU kernels (for the GPU `target` names, sm_90
/// for `host`) on the emulator.
fn run_emulated(
    module: &dlc_graph::Module,
    f: &dlc_graph::Function,
    inputs: &[HostTensor],
    target: &str,
    tf32: bool,
) -> Result<Vec<HostTensor>, DriverError> {
    let mut target = match target {
        "host" => dlc_core::TargetDesc::sm_90(),
        other => dlc_core::TargetDesc::named(other).map_err(DriverError::Usage)?,
    };
    if tf32 {
        target = target.with_tf32();
    }
    if target.gpu().is_none() {
        return Err(DriverError::Usage(format!(
            "--backend gpu-emulator runs GPU code: --target sm_80 or sm_90, not {}",
            target.name
        )));
    }
    let tiles = dlc_driver::lower_for_tile(module, &target)?;
    dlc_llvm::emulate(&tiles, &target, |emu| {
        emu.call(&f.name, inputs)
            .map_err(|e| dlc_llvm::CodegenError::Arguments(e.to_string()))
    })
    .map_err(codegen)
}

/// `dlc bench --backend gpu`: compile (lowering, PTX, loading it) and the
/// latency of repeated calls on GPU 0, inputs copied in once; a call is
/// every kernel launch and the wait for the last (and the status word's
/// round trip).
fn time_gpu_calls(
    module: &dlc_graph::Module,
    f: &dlc_graph::Function,
    weights: &[(String, Value)],
    Timing { runs, warmup }: Timing,
    tf32: bool,
) -> Result<(std::time::Duration, Vec<f64>, String), DriverError> {
    let start = std::time::Instant::now();
    let (mut cuda, program, device) = gpu_program(module, tf32)?;
    let compile = start.elapsed();
    let inputs = dlc_driver::prepare_values(&f.into(), &[], weights.to_vec(), Some(0))?
        .into_iter()
        .map(Value::into_host)
        .collect::<Result<Vec<_>, _>>()?;
    let function = program.function(&f.name).map_err(runtime)?;
    let mut call = dlc_runtime::gpu::Prepared::new(&mut cuda, function).map_err(runtime)?;
    call.bind(&mut cuda, &inputs).map_err(runtime)?;
    let ms = call.time_runs(&mut cuda, warmup, runs).map_err(runtime)?;
    Ok((compile, ms, device))
}

/// How `dlc bench` times calls: timed runs after untimed warm-up ones.
struct Timing {
    runs: usize,
    warmup: usize,
}

/// `dlc bench`: cold compile time (source to callable code) and the
/// latency of repeated calls, on the weights from `weights` where given
/// and random inputs (seed 0) otherwise.
#[allow(clippy::too_many_arguments)]
fn bench(
    file: &str,
    onnx: &dlc_onnx::Options,
    entry: Option<&str>,
    threads: usize,
    Timing { runs, warmup }: Timing,
    json: bool,
    passes: &str,
    backend: Backend,
    Measure {
        tf32,
        cache,
        profile,
    }: Measure,
    weights: Option<&std::path::Path>,
) -> Result<(), DriverError> {
    if tf32 && backend != Backend::Gpu {
        return Err(DriverError::Usage("--tf32 is for --backend gpu".into()));
    }
    if cache && backend != Backend::Cpu {
        return Err(DriverError::Usage(
            "--cache is for --backend cpu (the object cache holds CPU code)".into(),
        ));
    }
    if profile && backend != Backend::Cpu {
        return Err(DriverError::Usage(
            "--profile is for --backend cpu (GPU kernels are not timed yet)".into(),
        ));
    }
    if profile && cache {
        return Err(DriverError::Usage(
            "--profile compiles code of its own, with every launch timed: it neither takes nor \
             stores programs in the cache (leave out --cache)"
                .into(),
        ));
    }
    if !matches!(backend, Backend::Cpu | Backend::Gpu) {
        return Err(DriverError::Usage(
            "dlc bench measures compiled code: --backend cpu or gpu".into(),
        ));
    }
    if runs == 0 {
        return Err(DriverError::Usage("--runs must be at least 1".into()));
    }
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    dlc_runtime::set_num_threads(threads).map_err(|e| DriverError::Usage(e.to_string()))?;
    let start = std::time::Instant::now();
    let mut phases = phases::Phases::new(file);
    phases.reading();
    // An ONNX model compiled for this CPU is read by `compile_onnx_for_cpu`.
    let onnx_cpu = dlc_driver::is_onnx(file) && backend == Backend::Cpu;
    let src = if onnx_cpu {
        None
    } else {
        Some(read_model(file, onnx)?)
    };
    let weights_from = if onnx_cpu || src.as_ref().is_some_and(|s| !s.weights.is_empty()) {
        "the model's weights and random other inputs"
    } else if weights.is_some() {
        "weights from --weights and random other inputs"
    } else {
        "random inputs drawn and"
    };
    let (front, llvm, ms, bind, device, parts, name, whole, launches) = if backend == Backend::Gpu
        && let Some(src) = src
    {
        phases.set("checking");
        let (mut module, carried) = dlc_driver::compile_source_unbound(src)?;
        let carried = carried
            .into_iter()
            .map(|(n, t)| (n, Value::Host(t)))
            .collect();
        phases.set("optimizing");
        run_passes(&mut module, passes, PassOptions::default())?;
        // Cleared before anything is timed.
        phases.done();
        let module = dlc_driver::only_entry(&module, entry)?;
        let f = select_entry(&module, None)?;
        // Reading the weights is not compiling: its time is left out.
        let reading = std::time::Instant::now();
        let bound = weights_to_bind(&f.into(), file, carried, weights, &[])?.tensors;
        let front = start.elapsed() - reading.elapsed();
        let (codegen, ms, device) =
            time_gpu_calls(&module, f, &bound, Timing { runs, warmup }, tf32)?;
        let name = f.name.clone();
        (
            front,
            codegen,
            ms,
            None,
            Some(device),
            None,
            name,
            false,
            None,
        )
    } else {
        let cache = if cache {
            Some(dlc_llvm::ObjectCache::for_user().ok_or_else(|| {
                DriverError::Usage(
                    "--cache: no cache directory (set DLC_CACHE_DIR, XDG_CACHE_HOME or HOME)"
                        .into(),
                )
            })?)
        } else {
            None
        };
        let how = program::Compile {
            entry,
            passes,
            priced: dlc_core::TargetDesc::host(),
            cache: cache.as_ref(),
            profile,
        };
        let reading = start.elapsed();
        let p = match src {
            Some(src) => program::compile_for_cpu(src, &how, &phases)?,
            None => program::compile_onnx_for_cpu(file, onnx, &how, &phases)?.program,
        };
        // Cleared before anything is timed.
        phases.done();
        let front = reading + p.front;
        let bound = weights_to_bind(&p.interface, file, p.carried, weights, &[])?.tensors;
        let t = time_calls(&p.jit, &p.interface, &bound, Timing { runs, warmup })?;
        let parts = p.jit.parts();
        let llvm = p.jit.compile_time();
        (
            front,
            llvm,
            t.ms,
            Some(t.bind),
            None,
            Some(parts),
            p.interface.name,
            p.cached,
            t.launches,
        )
    };
    let (median, min, max) = (median(&ms), ms[0], ms[ms.len() - 1]);
    let round_trip = (device.is_none() && threads >= 2)
        .then(round_trip_ns)
        .flatten();
    let compile = front + llvm;
    if json {
        let report = serde_json::json!({
            "file": file,
            "entry": name,
            "threads": threads,
            "compile_s": compile.as_secs_f64(),
            "frontend_s": front.as_secs_f64(),
            "llvm_s": llvm.as_secs_f64(),
            "bind_ms": bind.map(|b| b.as_secs_f64() * 1e3),
            "llvm_parts": parts.map(|p| p.0),
            "cached_parts": parts.map(|p| p.1),
            "cached_program": whole,
            "median_ms": median,
            "min_ms": min,
            "max_ms": max,
            "runs": runs,
            "warmup": warmup,
            "core_round_trip_ns": round_trip,
            "backend": if device.is_some() { "gpu" } else { "cpu" },
            "device": device,
            "profile": launches.as_ref().map(|l| profile_json(l, runs)),
        });
        dlc_cli::outln!("{report}");
    } else {
        match &device {
            Some(d) => dlc_cli::outln!("{} ({file}), GPU: {d}", name),
            None => dlc_cli::outln!(
                "{} ({file}), {threads} thread{}",
                name,
                if threads == 1 { "" } else { "s" }
            ),
        }
        let cached = match parts {
            Some((n, _)) if whole => format!(", the program and its {n} parts from the cache"),
            Some((n, c)) if cache => format!(", {c} of {n} parts from the cache"),
            _ => String::new(),
        };
        dlc_cli::outln!(
            "  compile: {:.3} s ({} {:.3} s, {} {:.3} s{cached})",
            compile.as_secs_f64(),
            if device.is_some() {
                "front end"
            } else {
                "front end and lowering"
            },
            front.as_secs_f64(),
            if device.is_some() {
                "lowering, LLVM and loading"
            } else {
                "LLVM"
            },
            llvm.as_secs_f64()
        );
        if let Some(b) = bind {
            dlc_cli::outln!(
                "  bind: {:.3} ms ({} laid out one at a time, once; declared weights prepared once)",
                b.as_secs_f64() * 1e3,
                weights_from
            );
        }
        dlc_cli::outln!(
            "  latency: median {median:.3} ms, min {min:.3} ms, max {max:.3} ms over {runs} runs ({warmup} warm-up)"
        );
        if let Some(ns) = round_trip {
            dlc_cli::outln!(
                "  cores: a cache line passes between two threads and back in {ns:.0} ns (after the runs; several hundred ns: their cores share no cache, and what the threads share crosses slowly)"
            );
        }
        if let Some(launches) = &launches {
            print_profile(file, launches, runs, ms.iter().sum::<f64>() / runs as f64);
        }
    }
    Ok(())
}

/// `dlc bench`'s round trip of a cache line between two threads, ns
/// (`dlc_cli::core_round_trip`), right after the runs: the placement they
/// ran in (on a virtual machine it changes over minutes). Measured once
/// the OpenMP threads have stopped spinning for work (libgomp's spin
/// count: under a millisecond), which would take the cores from the two
/// threads measuring.
fn round_trip_ns() -> Option<f64> {
    std::thread::sleep(std::time::Duration::from_millis(50));
    dlc_cli::core_round_trip(20_000).map(|t| t.as_secs_f64() * 1e9)
}

/// How `dlc bench` measures, past where it runs.
struct Measure {
    /// `--tf32`.
    tf32: bool,
    /// `--cache`.
    cache: bool,
    /// `--profile`.
    profile: bool,
}

/// A kernel launch over `dlc bench --profile`'s timed runs.
struct LaunchTimes {
    /// What the code counted, summed over the runs.
    total: dlc_llvm::Launch,
    /// Its time in each run, ms.
    ms: Vec<f64>,
}

impl LaunchTimes {
    /// The median of its runs' times, ms: what a row is ranked by (a run
    /// that another process slowed moves a mean, on a busy machine by
    /// more than the differences between kernels).
    fn median_ms(&self) -> f64 {
        let mut ms = self.ms.clone();
        ms.sort_by(f64::total_cmp);
        median(&ms)
    }

    /// The mean of its runs' times, ms.
    fn mean_ms(&self) -> f64 {
        self.total.ns as f64 / 1e6 / self.ms.len().max(1) as f64
    }
}

/// Adds the launches of one run (`run`, the counters since they were
/// zeroed) to `times`, which it starts on the first.
fn add_run(times: &mut Vec<LaunchTimes>, run: Vec<dlc_llvm::Launch>) {
    if times.is_empty() {
        times.extend(run.into_iter().map(|l| LaunchTimes {
            ms: vec![l.ns as f64 / 1e6],
            total: l,
        }));
        return;
    }
    for (t, l) in times.iter_mut().zip(run) {
        t.ms.push(l.ns as f64 / 1e6);
        t.total.ns += l.ns;
        t.total.calls += l.calls;
    }
}

/// The kernel launches of `--profile` that ran, the longest first (by
/// their median).
fn profile_rows(launches: &[LaunchTimes]) -> Vec<(&LaunchTimes, f64)> {
    let mut rows: Vec<(&LaunchTimes, f64)> = launches
        .iter()
        .filter(|l| l.total.calls > 0)
        .map(|l| (l, l.median_ms()))
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows
}

/// The launches shown in `dlc bench --profile`'s text; the rest are summed.
const PROFILE_ROWS: usize = 30;

/// `dlc bench --profile`'s table: the time in each launch in a run (the
/// median of the runs, the longest first, and the mean), the mean's share
/// of the mean latency `mean_ms`, its calls a run and programs, and the
/// op's place and the kernel's function. An imported model's nodes are
/// named without the file's name (`file`'s, every one).
fn print_profile(file: &str, launches: &[LaunchTimes], runs: usize, mean_ms: f64) {
    let rows = profile_rows(launches);
    let inside: f64 = rows.iter().map(|(l, _)| l.mean_ms()).sum();
    let calls: u64 = rows.iter().map(|(l, _)| l.total.calls).sum();
    dlc_cli::outln!(
        "  profile: {} kernel launches a run, {inside:.3} ms of the mean {mean_ms:.3} ms ({:.1}%) \
         inside them (a kernel on threads until its last thread returns):",
        calls as f64 / runs as f64,
        100.0 * inside / mean_ms
    );
    dlc_cli::outln!("    median    mean      %  calls  programs  place (kernel)");
    for (l, median) in rows.iter().take(PROFILE_ROWS) {
        let place = if l.total.place.is_empty() {
            "no place"
        } else {
            l.total
                .place
                .strip_prefix(&format!("{file}, "))
                .unwrap_or(&l.total.place)
        };
        dlc_cli::outln!(
            "    {median:>6.3}  {:>6.3} {:>6.2} {:>6} {:>9}  {place} ({})",
            l.mean_ms(),
            100.0 * l.mean_ms() / mean_ms,
            l.total.calls as f64 / runs as f64,
            l.total.programs,
            l.total.kernel
        );
    }
    if rows.len() > PROFILE_ROWS {
        let rest = &rows[PROFILE_ROWS..];
        let median: f64 = rest.iter().map(|(_, m)| m).sum();
        let mean: f64 = rest.iter().map(|(l, _)| l.mean_ms()).sum();
        dlc_cli::outln!(
            "    {median:>6.3}  {mean:>6.3} {:>6.2}  in the other {} launches (--json lists every one)",
            100.0 * mean / mean_ms,
            rows.len() - PROFILE_ROWS
        );
    }
}

/// `--profile`'s launches in `--json`: every one that ran, the longest
/// first, its time (median and mean) and calls a run.
fn profile_json(launches: &[LaunchTimes], runs: usize) -> serde_json::Value {
    profile_rows(launches)
        .into_iter()
        .map(|(l, median)| {
            serde_json::json!({
                "place": l.total.place,
                "kernel": l.total.kernel,
                "programs": l.total.programs,
                "calls_per_run": l.total.calls as f64 / runs as f64,
                "median_ms": median,
                "mean_ms": l.mean_ms(),
            })
        })
        .collect()
}

/// The values `dlc run` and `dlc bench` bind to weight parameters.
struct Bound {
    /// Each weight's value, by parameter name.
    tensors: Vec<(String, Value)>,
    /// The names of those the model carried (an imported model's
    /// initializers), which are not inputs.
    carried: Vec<String>,
}

/// The values bound to `f`'s weights: those `file` carried (`carried`, from
/// [`dlc_driver::compile_source_unbound`]) or those `--weights` gives,
/// except the parameters given as inputs (`given`).
fn weights_to_bind(
    f: &dlc_driver::Interface,
    file: &str,
    carried: Vec<(String, Value)>,
    weights: Option<&std::path::Path>,
    given: &[String],
) -> Result<Bound, DriverError> {
    match weights {
        Some(_) if !carried.is_empty() => Err(DriverError::Usage(format!(
            "--weights: {file} carries its weights (an ONNX model's initializers); --weights binds \
             those of dlc source"
        ))),
        Some(path) => Ok(Bound {
            tensors: dlc_driver::read_weights(f, path, given)?
                .into_iter()
                .map(|(n, t)| (n, Value::Host(t)))
                .collect(),
            carried: Vec::new(),
        }),
        None => {
            // Those of another entry point, and those given as inputs, are
            // not bound.
            let tensors: Vec<(String, Value)> = carried
                .into_iter()
                .filter(|(name, _)| {
                    f.params.iter().any(|p| &p.name == name) && !given.contains(name)
                })
                .collect();
            let carried = tensors.iter().map(|(n, _)| n.clone()).collect();
            Ok(Bound { tensors, carried })
        }
    }
}

/// What [`time_calls`] measured.
struct Timed {
    /// Binding the inputs, the preparer's run included.
    bind: std::time::Duration,
    /// The calls' times in ms, sorted.
    ms: Vec<f64>,
    /// Of a profiled module, its kernel launches over the timed calls.
    launches: Option<Vec<LaunchTimes>>,
}

/// Times `runs` calls of `f` (compiled in `jit`) on `weights` and random
/// inputs (seed 0) after `warmup` untimed ones.
fn time_calls(
    jit: &dlc_llvm::Jit,
    f: &dlc_driver::Interface,
    weights: &[(String, Value)],
    Timing { runs, warmup }: Timing,
) -> Result<Timed, DriverError> {
    let kernel = jit.kernel(&f.name).map_err(codegen)?;
    // The compiler's pages are not needed by the calls (W1 2048 141 ->
    // 79 MiB at its peak).
    dlc_runtime::release_code_pages();
    // The inputs are drawn one element at a time and written into
    // their buffers as they come, so that the process never holds them
    // twice (nor as f64s): its peak memory is what a run needs.
    let t = std::time::Instant::now();
    let mut binder = kernel.binder();
    dlc_driver::each_input(f, &[], weights, Some(0), |ty, elements| {
        match elements {
            Elements::Values(values) => binder.push_values(ty, values),
            Elements::Bytes(bytes) => binder.push_bytes(ty, bytes),
        }
        .map_err(|e| DriverError::Usage(e.to_string()))
    })?;
    let mut call = binder.finish().map_err(runtime)?;
    let bind = t.elapsed();
    for _ in 0..warmup {
        call.run().map_err(runtime)?;
    }
    // The timed calls' launches only (the preparer's ran at the bind),
    // each run's read and zeroed after it, outside its time.
    let profiled = jit.profiled();
    if profiled {
        jit.reset_profile().map_err(codegen)?;
    }
    let mut launches = Vec::new();
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = std::time::Instant::now();
        call.run().map_err(runtime)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        if profiled {
            add_run(&mut launches, jit.profile().map_err(codegen)?);
            jit.reset_profile().map_err(codegen)?;
        }
    }
    ms.sort_by(f64::total_cmp);
    let launches = profiled.then_some(launches);
    Ok(Timed { bind, ms, launches })
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Median time in µs of one call of the only entry point of `src`.
fn time_source(src: &str, runs: usize) -> Result<f64, DriverError> {
    let mut module = compile_source(&dlc_driver::SourceText {
        name: "<calibrate>".into(),
        text: src.into(),
        weights: Vec::new(),
    })?;
    run_passes(&mut module, DEFAULT_PIPELINE, PassOptions::default())?;
    let f = select_entry(&module, None)?;
    let lowered = cpu_tiles(&module)?;
    let jit = dlc_llvm::compile_in_process(&lowered, &dlc_llvm::JitOptions::default())
        .map_err(codegen)?;
    let timed = time_calls(&jit, &f.into(), &[], Timing { runs, warmup: 3 })?;
    Ok(median(&timed.ms) * 1e3)
}

/// `dlc calibrate`: the cost model's constants from timings of compiled
/// kernels on one thread. Peak: a 512^3 product. Bandwidth: `x + y` over
/// 8 Mi elements (two reads, one write). Element-wise ops: the extra time
/// per element of a chain of 32 fused multiplies and adds, and of 8 tanh and
/// exp, over one multiply, on data that stays in cache. Kernel overhead: a
/// 4x4 product.
fn calibrate(output: &str, runs: usize) -> Result<(), DriverError> {
    if runs == 0 {
        return Err(DriverError::Usage("--runs must be at least 1".into()));
    }
    // The output must be writable before minutes of measuring.
    if output != "-" {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(output)
            .map_err(|source| DriverError::Io {
                path: output.into(),
                source,
            })?;
    }
    dlc_runtime::set_num_threads(1).map_err(|e| DriverError::Usage(e.to_string()))?;
    let gemm = time_source(
        "fn k(a: f32[512, 512], b: f32[512, 512]) -> f32[512, 512] { return a @ b; }",
        runs,
    )?;
    let n = 8 << 20;
    let stream = time_source(
        &format!("fn k(x: f32[{n}], y: f32[{n}]) -> f32[{n}] {{ return x + y; }}"),
        runs,
    )?;
    // Element-wise chains over data that stays in cache: the extra time
    // per element and op over a single op. The arithmetic chain is a
    // polynomial in x (Horner form), which reassociation cannot fold.
    let e = 64 << 10;
    let one = time_source(
        &format!("fn k(x: f32[{e}]) -> f32[{e}] {{ return x * 1.5; }}"),
        runs,
    )?;
    let arith_ops = 32;
    let arith_chain =
        (0..arith_ops / 2).fold("x".to_string(), |acc, _| format!("({acc}) * x + 0.25"));
    let arith = time_source(
        &format!("fn k(x: f32[{e}]) -> f32[{e}] {{ return {arith_chain}; }}"),
        runs,
    )?;
    let trans_ops = 8;
    let trans_chain = (0..trans_ops).fold("x".to_string(), |acc, i| {
        if i % 2 == 0 {
            format!("tanh({acc})")
        } else {
            format!("exp({acc})")
        }
    });
    let trans = time_source(
        &format!("fn k(x: f32[{e}]) -> f32[{e}] {{ return {trans_chain}; }}"),
        runs,
    )?;
    let per =
        |t: f64, ops: usize| ((t - one).max(0.0) * 1e3 / (e as f64 * (ops - 1) as f64)).max(1e-3);
    let tiny = time_source(
        "fn k(a: f32[4, 4], b: f32[4, 4]) -> f32[4, 4] { return a @ b; }",
        runs,
    )?;
    let model = dlc_graph::transforms::saturate::cost::CostModel {
        gemm_gflops: 2.0 * 512f64.powi(3) / (gemm * 1e3),
        bandwidth_gbs: 3.0 * 4.0 * n as f64 / (stream * 1e3),
        elementwise_ns: per(arith, arith_ops),
        transcendental_ns: per(trans, trans_ops),
        kernel_us: tiny.max(1e-3),
        source: format!(
            "dlc calibrate --runs {runs}: 512^3 product {gemm:.1} us, x+y over {n} elements {stream:.1} us, \
             {arith_ops} fused multiply/add ops over {e} elements {arith:.1} us and {trans_ops} tanh/exp \
             {trans:.1} us vs one multiply {one:.1} us, 4x4 product {tiny:.2} us"
        ),
    };
    let text = format!("{}\n", model.to_json());
    if output == "-" {
        dlc_cli::out!("{text}");
    } else {
        std::fs::write(output, text).map_err(|source| DriverError::Io {
            path: output.into(),
            source,
        })?;
    }
    Ok(())
}

/// One line about a result: its type, its first elements, and its range
/// (floats with six decimals, integers as integers, booleans as `true` and
/// `false` with a count of each).
fn summary(t: &HostTensor) -> String {
    use dlc_core::DType;
    let n = t.data.len();
    let dtype = t.ty.dtype;
    let show = |v: f64| match dtype {
        DType::Bool => (v != 0.0).to_string(),
        // f64 prints integral values without a fraction, u64's whole
        // range included.
        d if d.is_int() => format!("{v}"),
        _ => format!("{v:.6}"),
    };
    let shown: Vec<String> = t.data.iter().take(6).map(|&v| show(v)).collect();
    let more = if n > 6 { ", ..." } else { "" };
    let head = format!("{} = [{}{more}]", t.ty, shown.join(", "));
    if dtype == DType::Bool {
        let trues = t.data.iter().filter(|&&v| v != 0.0).count();
        return format!("{head}  {trues} true, {} false", n - trues);
    }
    let (mut lo, mut hi, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    for &v in &t.data {
        lo = lo.min(v);
        hi = hi.max(v);
        sum += v;
    }
    format!(
        "{head}  min {} max {} mean {:.6}",
        show(lo),
        show(hi),
        sum / n.max(1) as f64
    )
}

fn run(cli: Cli) -> Result<(), DriverError> {
    // A `DLC_CPU` that cannot stand for this machine is reported before
    // anything reads `native`.
    dlc_core::TargetDesc::check_cpu_env().map_err(DriverError::Usage)?;
    match cli.command {
        Command::Builtins => {
            print!("{}", dlc_lang::builtins::markdown());
            Ok(())
        }
        Command::Check { file, onnx } => {
            let src = read_model(&file, &onnx.options()?)?;
            let module = compile_source(&src)?;
            let entries: Vec<&str> = module.entry_points().map(|f| f.name.as_str()).collect();
            dlc_cli::outln!(
                "{}: ok ({} entry point(s): {})",
                src.name,
                entries.len(),
                entries.join(", ")
            );
            Ok(())
        }
        Command::Compile(args) => compile_command(args),
        Command::Run(args) => run_command(args),
        Command::Grad(args) => grad_command(args),
        Command::Train { args } => train::train(&args),
        Command::Bench {
            file,
            entry,
            threads,
            runs,
            warmup,
            json,
            passes,
            onnx,
            backend,
            tf32,
            cache,
            weights,
            profile,
        } => bench(
            &file,
            &onnx.options()?,
            entry.as_deref(),
            threads,
            Timing { runs, warmup },
            json,
            &passes,
            backend,
            Measure {
                tf32,
                cache,
                profile,
            },
            weights.as_deref(),
        ),
        Command::Import {
            file,
            output,
            weights_out,
            inline_weights,
            onnx,
        } => import_command(&file, &output, weights_out, inline_weights, &onnx),
        Command::Calibrate { output, runs } => {
            let output = output.unwrap_or_else(|| {
                let tree = "dialects/graph/cost-model.json";
                if std::path::Path::new(tree).is_file() {
                    tree.into()
                } else {
                    "dlc-cost-model.json".into()
                }
            });
            calibrate(&output, runs)
        }
    }
}

/// `dlc import`: the program to `output`, its weights to `weights_out` (by
/// default beside the program).
fn import_command(
    file: &str,
    output: &str,
    weights_out: Option<String>,
    inline_weights: bool,
    onnx: &OnnxArgs,
) -> Result<(), DriverError> {
    let options = dlc_onnx::Options {
        inline_weights,
        ..onnx.options()?
    };
    let imported = dlc_driver::import_onnx(file, &options)?;
    let mut text = imported.source;
    if !imported.weights.is_empty() {
        let path = match (weights_out, output) {
            (Some(p), _) => p,
            (None, "-") => {
                return Err(DriverError::Usage(format!(
                    "{file} has {} weights: give -o FILE (they go to FILE.safetensors), \
                     --weights-out PATH, or --inline-weights",
                    imported.weights.len()
                )));
            }
            (None, out) => Path::new(out)
                .with_extension("safetensors")
                .display()
                .to_string(),
        };
        // An initializer's bytes as the model stores them (never decoded),
        // a folded constant's encoded as the file is written.
        let tensors = imported
            .weights
            .iter()
            .map(|(name, d)| {
                let ty = dlc_core::TensorType::new(d.dtype, d.shape.clone());
                let bytes = match &d.stored {
                    Some(s) => dlc_driver::TensorBytes::Stored(ty, &s.bytes),
                    None => dlc_driver::TensorBytes::Made(
                        ty,
                        Box::new(|| d.dtype.to_le_bytes_all(d.values.iter())),
                    ),
                };
                (name.clone(), bytes)
            })
            .collect::<Vec<_>>();
        let count = tensors.len();
        dlc_driver::write_safetensors_bytes(Path::new(&path), tensors, Default::default())?;
        // The program says where its weights are, after its first line.
        let at = text.find('\n').map_or(text.len(), |i| i + 1);
        text.insert_str(
            at,
            &format!(
                "// Its {count} weights are in {path} (dlc run|bench|compile --weights {path}).\n",
            ),
        );
    }
    if output == "-" {
        dlc_cli::write_stdout_bytes(text.as_bytes()).map_err(|source| DriverError::Io {
            path: "<stdout>".into(),
            source,
        })
    } else {
        std::fs::write(output, text).map_err(|source| DriverError::Io {
            path: output.to_string(),
            source,
        })
    }
}

/// `dlc compile`.
fn compile_command(args: CompileArgs) -> Result<(), DriverError> {
    let CompileArgs {
        file,
        entry,
        emit,
        output,
        passes,
        stats,
        prefix,
        target,
        cpu,
        onnx,
        tf32,
        weights,
    } = args;
    let artifact = emit.artifact();
    if artifact.is_binary() && output == "-" && emit != Emit::Obj {
        return Err(DriverError::Usage(format!(
            "--emit {} writes a binary file: give -o FILE",
            emit.to_possible_value()
                .map_or("?".into(), |v| v.get_name().to_string())
        )));
    }
    let options = CompileOptions {
        emit: artifact,
        entries: entry.into_iter().collect(),
        passes,
        prefix,
        target,
        cpu,
        header_name: (output != "-").then(|| dlc_driver::module_stem(&output)),
        tf32,
        weights,
    };
    let mut phases = phases::Phases::new(&file);
    phases.reading();
    let src = read_model(&file, &onnx.options()?)?;
    phases.set("compiling");
    let done = dlc_driver::compile(
        &src,
        &options,
        dlc_driver::Backends {
            codegen: Some(&dlc_llvm::Llvm),
            mlir: Some(&dlc_mlir::Mlir),
        },
    )?;
    phases.done();
    if stats {
        dlc_cli::print_stats(&done.reports);
    }
    if output == "-" {
        dlc_cli::write_stdout_bytes(&done.bytes).map_err(|source| DriverError::Io {
            path: "<stdout>".into(),
            source,
        })
    } else {
        std::fs::write(&output, &done.bytes).map_err(|source| DriverError::Io {
            path: output.clone(),
            source,
        })
    }
}

/// `dlc run`.
fn run_command(args: RunArgs) -> Result<(), DriverError> {
    let RunArgs {
        file,
        entry,
        exec,
        save_outputs: save,
        save_inputs,
        weights,
        onnx,
        tf32,
    } = args;
    if tf32 && !matches!(exec.backend, Backend::Gpu | Backend::GpuEmulator) {
        return Err(DriverError::Usage(
            "--tf32 is for --backend gpu and gpu-emulator".into(),
        ));
    }
    // Where results go is checked before any work is done.
    for dir in [&save, &save_inputs].into_iter().flatten() {
        dlc_driver::ensure_writable_dir(dir)?;
    }
    let mut files = exec.input_files()?;
    let onnx = onnx.options()?;
    let mut phases = phases::Phases::new(&file);
    // An ONNX model's inputs and outputs, as it names them.
    let mut onnx_names = None;
    // Compiled for this CPU and nothing to compare with: the program
    // cache may hold the whole program.
    let compiled = if exec.backend == Backend::Cpu && !exec.check {
        let cache = (!exec.no_cache)
            .then(dlc_llvm::ObjectCache::for_user)
            .flatten();
        let priced = exec.priced()?;
        let how = program::Compile {
            entry: entry.as_deref(),
            passes: &exec.passes,
            priced: &priced,
            cache: cache.as_ref(),
            profile: false,
        };
        let p = if dlc_driver::is_onnx(&file) {
            let p = program::compile_onnx_for_cpu(&file, &onnx, &how, &phases)?;
            onnx_names = Some((p.inputs, p.outputs));
            p.program
        } else {
            program::compile_for_cpu(read_model(&file, &onnx)?, &how, &phases)?
        };
        (Compiled::Cpu(p.jit), p.interface, p.carried)
    } else {
        let src = if dlc_driver::is_onnx(&file) {
            phases.set("importing");
            let imported = dlc_driver::import_onnx(&file, &onnx)?;
            let outputs = imported.outputs.iter().map(|(o, _)| o.clone()).collect();
            onnx_names = Some((imported.inputs.clone(), outputs));
            dlc_driver::imported_source(&file, imported)
        } else {
            read_model(&file, &onnx)?
        };
        phases.set("checking");
        // An imported model's weights are bound at the call, not compiled in.
        let (mut module, carried) = dlc_driver::compile_source_unbound(src)?;
        phases.set("optimizing");
        exec.run_passes(&mut module)?;
        let module = dlc_driver::only_entry(&module, entry.as_deref())?;
        let interface = dlc_driver::Interface::of(select_entry(&module, None)?);
        let carried = carried
            .into_iter()
            .map(|(n, t)| (n, Value::Host(t)))
            .collect();
        (Compiled::Graph(module), interface, carried)
    };
    // Inputs may be named as the ONNX model names them, and its outputs
    // are saved under its names for them.
    let mut output_names = None;
    if let Some((inputs, outputs)) = onnx_names {
        for (name, _) in &mut files {
            if let Some((_, var)) = inputs.iter().find(|(o, _)| o == name) {
                name.clone_from(var);
            }
        }
        let names: Vec<&str> = outputs.iter().map(String::as_str).collect();
        output_names = Some(dlc_driver::output_file_stems(&names));
    }
    let (compiled, f, carried) = compiled;
    let f = &f;
    let named: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    let bound = weights_to_bind(f, &file, carried, weights.as_deref(), &named)?;
    let args = dlc_driver::prepare_values(f, &files, bound.tensors, exec.random_inputs)?;
    if let Some(dir) = &save_inputs {
        for path in dlc_driver::save_inputs(dir, f, &args, &bound.carried)? {
            dlc_cli::outln!("wrote {}", path.display());
        }
    }
    let outputs = match &compiled {
        Compiled::Cpu(jit) => {
            phases.set("running");
            call_jit(jit, &f.name, args)?
        }
        Compiled::Graph(module) => {
            phases.set("compiling and running");
            let args = args
                .into_iter()
                .map(Value::into_host)
                .collect::<Result<Vec<_>, _>>()?;
            execute(module, select_entry(module, None)?, args, &exec, tf32, None)?
        }
    };
    phases.done();
    for (i, t) in outputs.iter().enumerate() {
        dlc_cli::outln!("out{i}: {}", summary(t));
    }
    if let Some(dir) = save {
        let paths = match output_names {
            Some(names) => {
                let named: Vec<(String, &HostTensor)> = names.into_iter().zip(&outputs).collect();
                dlc_driver::save_named_outputs(&dir, &named)?
            }
            None => save_outputs(&dir, &outputs)?,
        };
        for path in paths {
            dlc_cli::outln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// `dlc grad`.
fn grad_command(args: GradArgs) -> Result<(), DriverError> {
    let GradArgs {
        file,
        entry,
        wrt,
        exec,
        save_outputs: save,
    } = args;
    if let Some(dir) = &save {
        dlc_driver::ensure_writable_dir(dir)?;
    }
    let files = exec.input_files()?;
    let src = read_model(&file, &dlc_onnx::Options::default())?;
    let mut module = compile_source(&src)?;
    let entry = select_entry(&module, entry.as_deref())?.name.clone();
    let name = format!("{entry}_grad");
    let positions = dlc_graph::autodiff::add_grad_function(&mut module, &entry, &wrt, &name)?;
    exec.run_passes(&mut module)?;
    let module = dlc_driver::only_entry(&module, Some(&name))?;
    let f = select_entry(&module, None)?;
    let args = prepare_inputs(f, &files, exec.random_inputs)?;
    let values = f.results.len() - positions.len();
    let names: Vec<String> = (0..values)
        .map(|i| format!("out{i}"))
        .chain(positions.iter().map(|&p| format!("grad_{}", f.params[p].0)))
        .collect();
    let outputs = execute(&module, f, args, &exec, false, Some((values, &names)))?;
    for (n, t) in names.iter().zip(&outputs) {
        dlc_cli::outln!("{n}: {}", summary(t));
    }
    if let Some(dir) = save {
        let named: Vec<(String, &HostTensor)> = names.into_iter().zip(&outputs).collect();
        for path in dlc_driver::save_named_outputs(&dir, &named)? {
            dlc_cli::outln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// `--input NAME=PATH` arguments, split.
fn input_files(inputs: &[String]) -> Result<Vec<(String, PathBuf)>, DriverError> {
    inputs
        .iter()
        .map(|spec| match spec.split_once('=') {
            Some((name, path)) => Ok((name.to_string(), PathBuf::from(path))),
            None => Err(DriverError::Usage(format!(
                "--input takes NAME=PATH.npy, got `{spec}`"
            ))),
        })
        .collect()
}

/// What `dlc run` and `dlc grad` share: the inputs, the pipeline, and how
/// the compiled entry point runs and is checked.
#[derive(clap::Args)]
struct ExecArgs {
    /// Where to run it.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: Backend,
    /// An input as NAME=PATH.npy; repeat for each parameter.
    #[arg(long = "input", value_name = "NAME=PATH")]
    inputs: Vec<String>,
    /// Fill the inputs not given with random values from this seed.
    #[arg(long, value_name = "SEED")]
    random_inputs: Option<u64>,
    /// Graph pipeline to run before executing (`dlc grad`: on the
    /// differentiated program).
    #[arg(long, default_value = DEFAULT_PIPELINE)]
    passes: String,
    /// Also run the reference interpreter and fail unless every result
    /// (`dlc grad`: the value and every gradient) matches it: relative to
    /// the result's largest magnitude within 1e-4 for f32, 4 ulps for f16
    /// (2^-8) and bf16 (2^-5), exactly for integers and bool; NaN and
    /// infinity in the same places.
    #[arg(long)]
    check: bool,
    /// The most work the interpreters (`--backend interp|loop`, and the
    /// reference of `--check`) take on, in estimated element operations;
    /// a program above it is refused before it runs.
    #[arg(long, value_name = "OPS", default_value_t = DEFAULT_WORK_LIMIT)]
    max_work: f64,
    /// The target `--backend tile` schedules for: host, x86-64-avx512,
    /// x86-64-avx2, aarch64-linux-gnu, sm_80 or sm_90.
    #[arg(long, default_value = "host")]
    target: String,
    /// With `--backend cpu`: compile every kernel, neither reading nor
    /// writing the object cache (`$DLC_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/dlc` or `~/.cache/dlc`; safe to delete).
    #[arg(long)]
    no_cache: bool,
}

impl ExecArgs {
    /// The `--input` files, after checking `--max-work`: what is checked
    /// before any work.
    fn input_files(&self) -> Result<Vec<(String, PathBuf)>, DriverError> {
        if self.max_work.is_nan() || self.max_work <= 0.0 {
            return Err(DriverError::Usage(format!(
                "--max-work must be a positive number of operations, got {}",
                self.max_work
            )));
        }
        input_files(&self.inputs)
    }

    /// The target the passes price the graph for: `--target`'s kernels.
    fn priced(&self) -> Result<dlc_core::TargetDesc, DriverError> {
        dlc_core::TargetDesc::named(&self.target).map_err(DriverError::Usage)
    }

    /// Runs `--passes` on `module`, the graph priced for what it runs on:
    /// `--target`'s kernels.
    fn run_passes(&self, module: &mut dlc_graph::Module) -> Result<(), DriverError> {
        let priced = self.priced()?;
        let options = PassOptions {
            target: Some(&priced),
            ..PassOptions::default()
        };
        run_passes(module, &self.passes, options)?;
        Ok(())
    }
}

/// Runs entry point `f` of `module` on `args` as `exec` says (f32
/// products as TF32 when `tf32`); with
/// `--check`, compares every result with the reference interpreter's and
/// fails unless they agree. With `gradients`, the results from its first
/// on are gradients of one value, each compared on the scale of the
/// largest of them at least (`gradient_floors`), and every result is
/// called by its name there (`out0`, `grad_w`, ...).
fn execute(
    module: &dlc_graph::Module,
    f: &dlc_graph::Function,
    args: Vec<HostTensor>,
    exec: &ExecArgs,
    tf32: bool,
    gradients: Option<(usize, &[String])>,
) -> Result<Vec<HostTensor>, DriverError> {
    let ExecArgs {
        backend,
        check,
        max_work,
        ref target,
        no_cache,
        ..
    } = *exec;
    // Compiled code has no work limit: with --check, the reference
    // refuses what it cannot finish before the compiled code starts.
    if check
        && matches!(
            backend,
            Backend::Cpu | Backend::Mlir | Backend::MlirTile | Backend::Gpu | Backend::GpuEmulator
        )
    {
        dlc_graph::interp::check_work(module, f, max_work)?;
    }
    let cpu_options = || dlc_llvm::JitOptions {
        cache: (!no_cache).then(dlc_llvm::ObjectCache::for_user).flatten(),
        profile: false,
    };
    if matches!(backend, Backend::Cpu) && !check {
        // Nothing compares with the arguments: each is dropped once laid
        // out (an imported model's weights are most of its memory).
        return run_cpu(module, f, args, &cpu_options());
    }
    let args = &args[..];
    let outputs = match backend {
        Backend::Loop => interpret_loops_within(module, f, args, max_work)?,
        Backend::Tile => {
            dlc_graph::interp::check_work(module, f, max_work)?;
            let tiled = tiled(module, target)?;
            dlc_driver::interpret_tile_within(&tiled, f, args, max_work)?
        }
        Backend::Cpu => run_cpu(module, f, args.iter().collect(), &cpu_options())?,
        Backend::Gpu => run_gpu(module, f, args, tf32)?,
        Backend::GpuEmulator => run_emulated(module, f, args, target, tf32)?,
        Backend::Mlir => {
            let loops = dlc_driver::lower_to_loops(module, dlc_core::TargetDesc::host())?;
            dlc_mlir::run(&loops, &f.name, args).map_err(|e| DriverError::Codegen(e.to_string()))?
        }
        Backend::MlirTile => {
            // Constants stay in the kernels: MLIR has no `tile.prepared`.
            let tiles = dlc_driver::lower_for_tile(module, dlc_core::TargetDesc::host())?;
            dlc_driver::call_prepared(&tiles, &f.name, args, |name, inputs| {
                dlc_mlir::run_tile(&tiles, name, inputs)
                    .map_err(|e| DriverError::Codegen(e.to_string()))
            })?
        }
        _ => interpret_within(module, f, args, max_work)?,
    };
    if check {
        let reference = interpret_within(module, f, args, max_work)?;
        let tolerances = dlc_driver::check_tolerances_with(f, tf32);
        let floors = gradients
            .map(|(first, _)| dlc_driver::gradient_floors(&reference, first))
            .unwrap_or_default();
        let checks =
            dlc_driver::check_results_with_floors(&outputs, &reference, &tolerances, &floors)?;
        let label = |c: &dlc_driver::ResultCheck| match gradients.and_then(|(_, n)| n.get(c.index))
        {
            Some(name) => c.describe(name),
            None => c.to_string(),
        };
        let failed: Vec<String> = checks.iter().filter(|c| !c.passed()).map(label).collect();
        if !failed.is_empty() {
            return Err(DriverError::Usage(format!(
                "--check: results differ from the reference interpreter: {}",
                failed.join("; ")
            )));
        }
        for c in &checks {
            if c.all_nan() {
                eprintln!("warning: --check: {}", label(c));
            }
            dlc_cli::outln!("check: ok: {}", label(c));
        }
    }
    Ok(outputs)
}

fn main() -> ExitCode {
    // Starting maps some 50 MB of this executable (LLVM's and MLIR's static
    // initializers, each page brought in with its neighbours) that nothing
    // reads again: peak memory W3 b1 80 -> 66 MiB, for 2 ms.
    dlc_runtime::release_code_pages();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = e.to_string();
            eprint!("{msg}");
            if !msg.ends_with('\n') {
                eprintln!();
            }
            ExitCode::FAILURE
        }
    }
}
