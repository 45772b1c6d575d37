//! `dlc-rt`: runs GPU modules compiled by `dlc compile --emit gpu-module`
//! on GPU 0, with no compiler present. It is built from the runtime crate
//! alone (no LLVM, no MLIR): a few megabytes, what a deployment ships and
//! what travels to a machine with a GPU but no Rust.
//!
//! ```sh
//! dlc-rt info model.dlcm
//! dlc-rt run model.dlcm --entry f --input x=x.npy --save-outputs out/
//! dlc-rt run model.dlcm --random-inputs 0 --expect ref/      # compare with saved results
//! dlc-rt bench model.dlcm --runs 50 --json
//! ```
//!
//! Without a CUDA driver or a GPU, `run` and `bench` say so in one line and
//! exit with status 1.
//!
//! # What it does
//!
//! `dlc-rt` (`tools/dlc-rt`) is the runner a GPU machine gets: `info` (needs no GPU),
//! `run` (inputs from `.npy` files or drawn from a seed exactly as `dlc run
//! --random-inputs` draws them, `EntryInfo::inputs`; `--expect DIR` compares with saved
//! results by `dlc_runtime::check`, the comparison `dlc run --check` uses) and `bench`
//! (median, min, max of waited-for calls; `--per-kernel` times each launch waited for on
//! its own, which locates a slow kernel without a profiler). `Cuda::load_module` refuses a
//! device below the module's compute capability before loading any PTX. The driver JIT-
//! compiles the PTX for whatever GPU it finds; nothing else is compiled at run time.
//! `make gpu-check-prepare` and `scripts/gpu-check.sh` (docs/testing.md) use both.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use dlc_cli::outln;
use dlc_runtime::HostTensor;
use dlc_runtime::check::check_results;
use dlc_runtime::cuda::Cuda;
use dlc_runtime::gpu::{GpuFunction, Prepared};
use dlc_runtime::module::{EntryInfo, GpuModule};

#[derive(Parser)]
#[command(
    name = "dlc-rt",
    version,
    about = "Runs dlc GPU modules (`dlc compile --emit gpu-module`) on GPU 0, with no compiler"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What a module holds: its target, entry points, kernels and sizes
    /// (needs no GPU).
    Info {
        /// The module file.
        module: PathBuf,
    },
    /// Runs an entry point once on GPU 0 and prints its results' types.
    Run {
        /// The module file.
        module: PathBuf,
        #[command(flatten)]
        inputs: Inputs,
        /// Writes the results as DIR/out0.npy, DIR/out1.npy, ...
        #[arg(long, value_name = "DIR")]
        save_outputs: Option<PathBuf>,
        /// Compares the results with DIR/out0.npy, ... (as `dlc run
        /// --save-outputs` writes the reference interpreter's) within the
        /// tolerances of `dlc run --check`; exits with status 1 if any
        /// differs.
        #[arg(long, value_name = "DIR")]
        expect: Option<PathBuf>,
    },
    /// Times an entry point on GPU 0: inputs copied in once, then each call
    /// is every kernel launch and the wait for the last.
    Bench {
        /// The module file.
        module: PathBuf,
        #[command(flatten)]
        inputs: Inputs,
        /// Timed calls.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Untimed calls before them.
        #[arg(long, default_value_t = 3)]
        warmup: usize,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also times each kernel launch (median over the runs, each
        /// kernel waited for before the next, launch overhead included).
        #[arg(long)]
        per_kernel: bool,
    },
}

/// Which entry point runs, on what.
#[derive(clap::Args)]
struct Inputs {
    /// The entry point (needed when the module has several).
    #[arg(long)]
    entry: Option<String>,
    /// An input as NAME=FILE.npy (repeatable).
    #[arg(long = "input", value_name = "NAME=FILE")]
    files: Vec<String>,
    /// Draws the inputs not given as files from this seed, as `dlc run
    /// --random-inputs` does (the same tensors); `bench` uses seed 0 when
    /// neither is given.
    #[arg(long, value_name = "SEED")]
    random_inputs: Option<u64>,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlc-rt: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Info { module } => info(&GpuModule::read(&module).map_err(str)?),
        Command::Run {
            module,
            inputs,
            save_outputs,
            expect,
        } => {
            let m = GpuModule::read(&module).map_err(str)?;
            let (f, entry) = m
                .entry(&entry_name(&m, inputs.entry.as_deref())?)
                .map_err(str)?;
            let args = draw_inputs(f, entry, &inputs.files, inputs.random_inputs)?;
            let mut cuda = open(&m)?;
            let mut call = Prepared::new(&mut cuda, f).map_err(str)?;
            let outputs = call.call(&mut cuda, &args).map_err(str)?;
            for (i, t) in outputs.iter().enumerate() {
                outln!("out{i}: {}", t.ty);
            }
            if let Some(dir) = save_outputs {
                std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                for (i, t) in outputs.iter().enumerate() {
                    t.write_npy(&dir.join(format!("out{i}.npy"))).map_err(str)?;
                }
            }
            match expect {
                Some(dir) => compare(&outputs, &dir, &entry.tolerances),
                None => Ok(()),
            }
        }
        Command::Bench {
            module,
            inputs,
            runs,
            warmup,
            json,
            per_kernel,
        } => {
            let m = GpuModule::read(&module).map_err(str)?;
            let name = entry_name(&m, inputs.entry.as_deref())?;
            let (f, entry) = m.entry(&name).map_err(str)?;
            let seed = match (&inputs.random_inputs, inputs.files.is_empty()) {
                (None, true) => Some(0),
                (s, _) => *s,
            };
            let args = draw_inputs(f, entry, &inputs.files, seed)?;
            let start = Instant::now();
            let mut cuda = open(&m)?;
            let load = start.elapsed();
            let (device, _) = cuda.describe().map_err(str)?;
            let mut call = Prepared::new(&mut cuda, f).map_err(str)?;
            call.bind(&mut cuda, &args).map_err(str)?;
            let ms = call
                .time_runs(&mut cuda, warmup, runs.max(1))
                .map_err(str)?;
            let kernels = if per_kernel {
                let mut each = vec![Vec::with_capacity(runs); f.launches.len()];
                for _ in 0..runs.max(1) {
                    call.run_timed(&mut cuda, |k, s| each[k].push(s * 1e3))
                        .map_err(str)?;
                }
                each.iter_mut()
                    .zip(&f.launches)
                    .map(|(t, l)| {
                        t.sort_by(f64::total_cmp);
                        serde_json::json!({
                            "kernel": l.kernel,
                            "grid": [l.blocks, l.threads, l.shared_bytes],
                            "median_ms": t[t.len() / 2],
                        })
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let median = ms[ms.len() / 2];
            let (min, max) = (ms[0], ms[ms.len() - 1]);
            if json {
                outln!(
                    "{}",
                    serde_json::json!({
                        "file": module.display().to_string(),
                        "entry": name,
                        "backend": "gpu",
                        "device": format!("{device}, {}{}", m.target, if m.tf32 { ", TF32" } else { "" }),
                        "load_s": load.as_secs_f64(),
                        "runs": ms.len(),
                        "median_ms": median,
                        "min_ms": min,
                        "max_ms": max,
                        "kernels": kernels,
                    })
                );
            } else {
                outln!(
                    "{name} ({}), GPU: {device}: load {:.3} s, median {median:.4} ms (min {min:.4}, max {max:.4}, {} runs)",
                    module.display(),
                    load.as_secs_f64(),
                    ms.len()
                );
                for k in &kernels {
                    outln!("  {} {} {:.4} ms", k["kernel"], k["grid"], k["median_ms"]);
                }
            }
            Ok(())
        }
    }
}

fn str(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// GPU 0, with the module's kernels loaded.
fn open(m: &GpuModule) -> Result<Cuda, String> {
    let mut cuda = Cuda::open().map_err(str)?;
    cuda.load_module(m).map_err(str)?;
    Ok(cuda)
}

/// The entry point to run: the one asked for, or the module's only one.
fn entry_name(m: &GpuModule, asked: Option<&str>) -> Result<String, String> {
    if let Some(e) = asked {
        return Ok(e.to_string());
    }
    let names: Vec<&str> = m.entry_names().collect();
    match names.as_slice() {
        [one] => Ok((*one).to_string()),
        _ => Err(format!(
            "the module has {} entry points ({}): choose one with --entry",
            names.len(),
            names.join(", ")
        )),
    }
}

/// The inputs of `f`: `NAME=FILE.npy` specs where given, the rest drawn
/// from `seed`.
fn draw_inputs(
    f: &GpuFunction,
    entry: &EntryInfo,
    specs: &[String],
    seed: Option<u64>,
) -> Result<Vec<HostTensor>, String> {
    let mut files = Vec::with_capacity(specs.len());
    for spec in specs {
        let (input, path) = spec
            .split_once('=')
            .ok_or_else(|| format!("--input {spec}: expected NAME=FILE.npy"))?;
        files.push((input.to_string(), PathBuf::from(path)));
    }
    entry.inputs(f, &files, seed).map_err(str)
}

/// Compares `outputs` with `DIR/outI.npy` within `tolerances`.
fn compare(outputs: &[HostTensor], dir: &Path, tolerances: &[f64]) -> Result<(), String> {
    let mut reference = Vec::with_capacity(outputs.len());
    for (i, t) in outputs.iter().enumerate() {
        let path = dir.join(format!("out{i}.npy"));
        reference.push(HostTensor::read_npy(&path, Some(t.ty.dtype)).map_err(str)?);
    }
    let checks = check_results(outputs, &reference, tolerances).map_err(str)?;
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.passed())
        .map(ToString::to_string)
        .collect();
    if !failed.is_empty() {
        return Err(format!(
            "results differ from {}: {}",
            dir.display(),
            failed.join("; ")
        ));
    }
    for c in &checks {
        outln!("check: ok: {c}");
    }
    Ok(())
}

fn info(m: &GpuModule) -> Result<(), String> {
    outln!(
        "target {} (compute capability {}.{}{}), {} bytes of PTX",
        m.target,
        m.capability.0,
        m.capability.1,
        if m.tf32 { ", f32 products as TF32" } else { "" },
        m.program.ptx.len()
    );
    for f in &m.program.functions {
        let params: Vec<String> = f
            .signature
            .params
            .iter()
            .map(|p| {
                format!(
                    "{} {}: {}",
                    if p.output { "out" } else { "in" },
                    p.name,
                    p.ty
                )
            })
            .collect();
        let shared = f.launches.iter().map(|l| l.shared_bytes).max().unwrap_or(0);
        outln!(
            "entry {}({}): {} launches, workspace {} bytes, up to {shared} bytes of shared memory per block",
            f.signature.name,
            params.join(", "),
            f.launches.len(),
            f.workspace
        );
    }
    Ok(())
}
