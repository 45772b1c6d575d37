//! `dlc train`: trains the weights of a loss function on a data set.
//!
//! The training step is a program of the language, generated here around
//! the user's loss: `value_and_grad` of the loss with respect to its
//! weights, the optimizer's update of each weight (the built-ins `sgd`,
//! `sgd_momentum`, `adam`, `adamw`) at the learning rate of the schedule (a
//! built-in too), returning the loss, the new weights and the new state.
//! It is compiled once for this CPU (or with `--backend gpu` for the GPU,
//! `train/gpu.rs`) and called once per batch on one bound call whose weight
//! and state inputs are its previous results (the buffers trade places:
//! nothing of the model is copied between steps).
//!
//! # The step and its checkpoints
//!
//! - `dlc train` generates the training step as source (`__train_step`: `value_and_grad`
//!   of the loss with respect to its weights, the update built-in per weight at the
//!   schedule's rate; with `--precision`, `autocast=` and `scale=`, `all_finite`,
//!   `where` keeping the weights and state of a skipped update, and `loss_scale_update`,
//!   the new scale, count and whether the update was made returned last), appends it to the user's program and compiles it with the default
//!   pipeline for this CPU, once. The step declares no weights (they change every call,
//!   so nothing may be prepared once). One `BoundCall` runs every step; after each run,
//!   the new weights and state trade buffers with the inputs they replace
//!   (`BoundCall::swap_result_into_input`), so nothing of the model is copied between
//!   steps. Only the batch inputs and the step number are written per step. Each epoch
//!   shuffles the rows by `seed + epoch` and drops the remainder smaller than a batch. A
//!   loss returning more than the loss returns its buffers' new values (its parameters
//!   neither weights nor data, in order: running averages); they trade buffers with their
//!   inputs the same way, and are checkpointed and saved with the weights.
//!   The invariant this relies on: a compiled function writes every element of every
//!   result on every call (tested by `dlc train` following the update rule over several
//!   steps).
//! - Checkpoints (`--checkpoint DIR`) are written after each epoch as
//!   `DIR/checkpoint.safetensors`: tensors `weight.NAME` and `state.{m,v,buf}.NAME`, and
//!   metadata (`format = dlc-train-1`, epochs done, the next step's number, the next
//!   update's number, the loss scale and the updates since it changed (mixed precision:
//!   a skipped update does not count), the seed, the learning rate, the optimizer's
//!   settings and precision, the global batch), to a temporary file that is flushed and
//!   renamed over the old one. The run's only randomness is each epoch's shuffle, drawn
//!   from `seed + epoch`, so `--resume` (same seed, rate, optimizer and rows a step, which
//!   a data-parallel run on other ranks would change; the same number
//!   of epochs under a cosine schedule, which spans them) continues exactly where the
//!   checkpoint stands and ends bit-identical to an uninterrupted run.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use dlc_driver::{
    DEFAULT_PIPELINE, DriverError, PassOptions, SourceText, compile_source, read_model, run_passes,
};
use dlc_runtime::HostTensor;
use rand::seq::SliceRandom;

use crate::distributed::{self, Buckets, Slot, World};
use dlc_runtime::AlignedBuffer;

mod gpu;

/// Where `dlc train --backend` runs the step.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum TrainBackend {
    /// Compiled for this CPU.
    Cpu,
    /// Compiled for the GPU (GPU 0, or a rank's own under
    /// --data-parallel, whose gradients NCCL sums).
    Gpu,
    /// The GPU's kernels on this CPU by the emulator: slow, for checking
    /// GPU training without a GPU (one rank at most).
    GpuEmulator,
}

/// The optimizer `dlc train --optimizer` names.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Optimizer {
    /// Stochastic gradient descent, with momentum if `--momentum` is given.
    Sgd,
    /// Adam (weight decay as an L2 term of the gradient).
    Adam,
    /// Adam with decoupled weight decay.
    Adamw,
}

/// The precision `dlc train --precision` computes the loss's products in.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Precision {
    /// Everything in the loss's own types.
    F32,
    /// Products in bf16 (`value_and_grad(.., autocast=bf16)`), f32 master
    /// weights, dynamic loss scaling.
    Bf16,
    /// Products in f16, f32 master weights, dynamic loss scaling.
    F16,
}

/// PyTorch's `GradScaler` defaults: the first loss scale, and how many
/// updates without an overflow double it.
const INITIAL_LOSS_SCALE: f64 = 65536.0;

/// What `dlc train` was asked for.
#[derive(clap::Args)]
pub struct TrainArgs {
    /// The `.dl` file.
    pub file: String,
    /// Compile every kernel of the step, neither reading nor writing the
    /// object cache `dlc run` keeps (`$DLC_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/dlc` or `~/.cache/dlc`).
    #[arg(long)]
    pub no_cache: bool,
    /// The loss: an entry point returning an f32 scalar first; may be
    /// left out when there is only one.
    #[arg(long)]
    pub entry: Option<String>,
    /// A data set as NAME=PATH.npy, one per parameter that is not a
    /// weight: its rows (leading axis) are shuffled and cut into batches
    /// of the parameter's leading extent.
    #[arg(long = "data", value_name = "NAME=PATH")]
    pub data: Vec<String>,
    /// Passes over the data.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// The update rule.
    #[arg(long, value_enum, default_value = "sgd")]
    pub optimizer: Optimizer,
    /// Learning rate (the peak of a schedule).
    #[arg(long, default_value_t = 0.01)]
    pub lr: f64,
    /// SGD with this momentum (PyTorch's SGD; buffer from zero).
    #[arg(long)]
    pub momentum: Option<f64>,
    /// SGD with Nesterov momentum (default momentum 0.9).
    #[arg(long)]
    pub nesterov: bool,
    /// Weight decay: an L2 term of the gradient for sgd and adam,
    /// decoupled for adamw (whose default is 0.01).
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Learning-rate schedule over the steps: constant (default),
    /// step:every=N[,gamma=G], warmup:warmup=N,
    /// cosine[:warmup=N,min_lr=X] (over every step of the run).
    #[arg(long, value_name = "SCHEDULE")]
    pub schedule: Option<String>,
    /// Seed of the initial weights and of each epoch's shuffle.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Mixed precision: bf16 or f16 computes the loss's products in that
    /// type from f32 master weights, with dynamic loss scaling (PyTorch's
    /// GradScaler: scale 2^16 at first, halved and the update skipped when
    /// a gradient overflows, doubled after 2000 updates without one).
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: Precision,
    /// Initial weights (and buffers): DIR/NAME.npy where DIR holds one, or
    /// the tensors of a .safetensors file (NAME, weight.NAME, buffer.NAME);
    /// the others are drawn as PyTorch initializes layers, from --seed
    /// (rank-1 weights start at zero: give a scale that starts at one, a
    /// batch norm's gamma, as a file).
    #[arg(long, value_name = "PATH")]
    pub weights: Option<PathBuf>,
    /// Write the trained weights (and buffers) as DIR/NAME.npy, or as one
    /// file when PATH ends in .safetensors (tensors named as the
    /// parameters; written atomically).
    #[arg(long, value_name = "PATH")]
    pub save_weights: Option<PathBuf>,
    /// One JSON object per epoch on standard output instead of text.
    #[arg(long)]
    pub json: bool,
    /// After each epoch, write the weights, the optimizer state and the
    /// progress to DIR/checkpoint.safetensors (atomically: a killed run
    /// leaves the previous checkpoint whole).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// Continue from DIR/checkpoint.safetensors with the settings it was
    /// written with: the run ends as the uninterrupted one does, bit for
    /// bit.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Run as one rank of a data-parallel run started by `mpirun -np N`:
    /// each global batch (N times the loss's batch) is shared among the
    /// ranks, their gradients are summed by MPI all-reduces, and every
    /// rank makes the same update; rank 0 alone writes files and logs.
    #[arg(long)]
    pub data_parallel: bool,
    /// Train data-parallel on N processes of this machine: starts this
    /// command under `mpirun -np N --oversubscribe` with --data-parallel.
    #[arg(long, value_name = "N")]
    pub ranks: Option<usize>,
    /// Data-parallel: the MiB of gradients summed by one all-reduce (PyTorch
    /// DDP's `bucket_cap_mb`). The gradient is computed in one stage per
    /// bucket, the last weights' first, and each bucket's all-reduce starts
    /// as the stage computing it ends.
    #[arg(long, value_name = "MIB", default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// Where the step runs: cpu, gpu (one GPU per rank; gradients summed
    /// by NCCL with --data-parallel) or gpu-emulator.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: TrainBackend,
}

fn usage(message: impl Into<String>) -> DriverError {
    DriverError::Usage(message.into())
}

/// A learning-rate schedule as the language's expression of the step `t`.
fn schedule_expr(spec: Option<&str>, lr: f64, total_steps: usize) -> Result<String, DriverError> {
    let lr = format!("{lr:?}");
    let Some(spec) = spec else {
        return Ok(lr);
    };
    let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let mut opts = std::collections::BTreeMap::new();
    for kv in rest.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| usage(format!("--schedule: `{kv}` is not KEY=VALUE")))?;
        let v: f64 = v
            .parse()
            .map_err(|_| usage(format!("--schedule: `{v}` is not a number")))?;
        opts.insert(k.to_string(), v);
    }
    let take = |opts: &mut std::collections::BTreeMap<String, f64>, k: &str| opts.remove(k);
    let int = |v: f64, k: &str| -> Result<i64, DriverError> {
        if v.fract() == 0.0 && (0.0..1e15).contains(&v) {
            Ok(v as i64)
        } else {
            Err(usage(format!(
                "--schedule: `{k}` must be a whole number of steps, got {v}"
            )))
        }
    };
    let expr = match kind {
        "constant" => lr.clone(),
        "step" => {
            let every = take(&mut opts, "every")
                .ok_or_else(|| usage("--schedule step:every=N[,gamma=G] needs `every`"))?;
            let gamma = take(&mut opts, "gamma").unwrap_or(0.1);
            format!(
                "step_lr(t, {lr}, {}, gamma={gamma:?})",
                int(every, "every")?
            )
        }
        "warmup" => {
            let w = take(&mut opts, "warmup")
                .ok_or_else(|| usage("--schedule warmup:warmup=N needs `warmup`"))?;
            format!("warmup_lr(t, {lr}, {})", int(w, "warmup")?)
        }
        "cosine" => {
            let w = take(&mut opts, "warmup").unwrap_or(0.0);
            let min = take(&mut opts, "min_lr").unwrap_or(0.0);
            format!(
                "cosine_lr(t, {lr}, {}, warmup={}, min_lr={min:?})",
                total_steps.max(1),
                int(w, "warmup")?
            )
        }
        _ => {
            return Err(usage(format!(
                "--schedule: unknown schedule `{kind}`; schedules: constant, step:every=N[,gamma=G], warmup:warmup=N, cosine[:warmup=N,min_lr=X]"
            )));
        }
    };
    if let Some(k) = opts.keys().next() {
        return Err(usage(format!("--schedule {kind}: unknown option `{k}`")));
    }
    Ok(expr)
}

/// The parameters of the loss: which are data (and their files) and which
/// are weights.
struct Plan {
    loss: String,
    params: Vec<(String, dlc_core::TensorType)>,
    weights: Vec<usize>,
    /// (parameter, file) for every parameter that is not a weight.
    data: Vec<(usize, PathBuf)>,
    /// Optimizer state per weight: the names of its tensors.
    state: Vec<&'static str>,
    /// Buffers: the parameters that are neither weights nor data, whose new
    /// values the loss returns after the loss itself, in order (a
    /// `batchnorm_train`'s running averages).
    buffers: Vec<usize>,
}

/// The training step's source, to follow the user's program: one function
/// `__train_step` (forward, backward and update), or, for `ranks` ranks of
/// a data-parallel run, `__train_grads` (the loss and the gradients of this
/// rank's share of the batch, and the buffers' new values) and
/// `__train_update` (the update from the gradients summed over the ranks,
/// which it divides by their number), between which the ranks all-reduce.
fn step_source(
    plan: &Plan,
    args: &TrainArgs,
    total_steps: usize,
    ranks: Option<usize>,
) -> Result<String, DriverError> {
    let ty = |i: usize| plan.params[i].1.to_string();
    let name = |i: usize| plan.params[i].0.clone();
    let loss_params: Vec<String> = plan
        .params
        .iter()
        .map(|(n, t)| format!("{n}: {t}"))
        .collect();
    let mut state_params = Vec::new();
    for &w in &plan.weights {
        for s in &plan.state {
            state_params.push(format!("__{s}_{}: {}", name(w), ty(w)));
        }
    }
    let mixed = match args.precision {
        Precision::F32 => None,
        Precision::Bf16 => Some("bf16"),
        Precision::F16 => Some("f16"),
    };
    let mut tail_params = vec!["t: i64".to_string()];
    if mixed.is_some() {
        tail_params.push("__scale: f32".into());
        tail_params.push("__good: i64".into());
    }
    let weight_types: Vec<String> = plan.weights.iter().map(|&w| ty(w)).collect();
    let mut state_types = Vec::new();
    for &w in &plan.weights {
        state_types.extend(plan.state.iter().map(|_| ty(w)));
    }
    let buffer_types: Vec<String> = plan.buffers.iter().map(|&b| ty(b)).collect();
    // With mixed precision the update also returns the new loss scale, the
    // updates since it changed and whether this update was made.
    let scale_types: Vec<String> = if mixed.is_some() {
        vec!["f32".into(), "i64".into(), "bool".into()]
    } else {
        vec![]
    };
    let aux: Vec<String> = plan
        .buffers
        .iter()
        .map(|&b| format!("__new_{}", name(b)))
        .collect();
    let call_args: Vec<String> = plan.params.iter().map(|(n, _)| n.clone()).collect();
    let wrt: Vec<String> = plan.weights.iter().map(|&w| name(w)).collect();
    let grads: Vec<String> = wrt.iter().map(|w| format!("__g_{w}")).collect();
    let gradient = format!(
        "    let (__loss, {}) = value_and_grad({}({}), wrt=[{}]{});",
        aux.iter()
            .chain(&grads)
            .cloned()
            .collect::<Vec<_>>()
            .join(", "),
        plan.loss,
        call_args.join(", "),
        wrt.join(", "),
        mixed
            .map(|d| format!(", autocast={d}, scale=__scale"))
            .unwrap_or_default()
    );
    let mut update = Vec::new();
    if let Some(n) = ranks {
        // The all-reduce summed the ranks' means: their mean is the mean
        // over the global batch.
        for g in &grads {
            update.push(format!("    let {g} = {g} / {n}.0;"));
        }
    }
    if mixed.is_some() {
        // The scaled gradients: all finite, or this update is skipped.
        update.push(format!(
            "    let __finite = all_finite({});",
            grads.join(", ")
        ));
        for g in &grads {
            update.push(format!("    let {g} = {g} / __scale;"));
        }
    }
    update.push(format!(
        "    let __lr = {};",
        schedule_expr(args.schedule.as_deref(), args.lr, total_steps)?
    ));
    let mut new_w = Vec::new();
    let mut new_s = Vec::new();
    for w in &wrt {
        let (lhs, call) = optimizer_call(args, w);
        update.push(format!("    let {lhs} = {call};"));
        new_w.push(format!("__new_{w}"));
        new_s.extend(plan.state.iter().map(|s| format!("__new_{s}_{w}")));
    }
    // The update's results: the weights, the state, and with mixed
    // precision the loss scale's.
    let mut updated = Vec::new();
    if mixed.is_some() {
        // A skipped update leaves the weights and the state as they were.
        let kept = |new: &str, old: String| format!("where(__finite, {new}, {old})");
        updated.extend(new_w.iter().zip(&wrt).map(|(n, w)| kept(n, w.clone())));
        for w in &wrt {
            for st in &plan.state {
                updated.push(kept(&format!("__new_{st}_{w}"), format!("__{st}_{w}")));
            }
        }
        update.push(
            "    let (__new_scale, __new_good) = loss_scale_update(__scale, __good, __finite);"
                .into(),
        );
    } else {
        updated.extend(new_w);
        updated.extend(new_s);
    }
    let scale_results: Vec<String> = if mixed.is_some() {
        vec!["__new_scale".into(), "__new_good".into(), "__finite".into()]
    } else {
        vec![]
    };
    let function =
        |name: &str, params: &[String], results: &[String], body: &[String], ret: &[String]| {
            format!(
                "\n\nfn {name}({}) -> ({}) {{\n{}\n    return ({});\n}}\n",
                params.join(", "),
                results.join(", "),
                body.join("\n"),
                ret.join(", ")
            )
        };
    let cat = |parts: &[&[String]]| parts.concat();
    let loss = ["f32".to_string()];
    let loss_name = ["__loss".to_string()];
    if ranks.is_none() {
        // The loss (an f32 scalar: `train` checks), the weights, the state,
        // the buffers, the loss scale's.
        return Ok(function(
            "__train_step",
            &cat(&[&loss_params, &state_params, &tail_params]),
            &cat(&[
                &loss,
                &weight_types,
                &state_types,
                &buffer_types,
                &scale_types,
            ]),
            &cat(&[std::slice::from_ref(&gradient), &update]),
            &cat(&[&loss_name, &updated, &aux, &scale_results]),
        ));
    }
    let mut grads_params = loss_params;
    if mixed.is_some() {
        grads_params.push("__scale: f32".into());
    }
    let update_params: Vec<String> = wrt
        .iter()
        .zip(&weight_types)
        .map(|(w, t)| format!("{w}: {t}"))
        .chain(
            grads
                .iter()
                .zip(&weight_types)
                .map(|(g, t)| format!("{g}: {t}")),
        )
        .chain(state_params)
        .chain(tail_params)
        .collect();
    Ok(format!(
        "{}{}",
        function(
            "__train_grads",
            &grads_params,
            &cat(&[&loss, &weight_types, &buffer_types]),
            std::slice::from_ref(&gradient),
            &cat(&[&loss_name, &grads, &aux]),
        ),
        function(
            "__train_update",
            &update_params,
            &cat(&[&weight_types, &state_types, &scale_types]),
            &update,
            &cat(&[&updated, &scale_results]),
        )
    ))
}

/// The optimizer's update of weight `w` (from its gradient `__g_w`, its
/// state `__buf_w` or `__m_w` and `__v_w`, at the rate `__lr`): the names
/// it binds and the call.
fn optimizer_call(args: &TrainArgs, w: &str) -> (String, String) {
    let g = format!("__g_{w}");
    let wd = args
        .weight_decay
        .map(|w| format!(", weight_decay={w:?}"))
        .unwrap_or_default();
    match args.optimizer {
        Optimizer::Sgd if args.momentum.is_some() || args.nesterov => (
            format!("(__new_{w}, __new_buf_{w})"),
            format!(
                "sgd_momentum({w}, {g}, __buf_{w}, __lr, momentum={:?}, nesterov={}{wd})",
                args.momentum.unwrap_or(0.9),
                args.nesterov
            ),
        ),
        Optimizer::Sgd => (format!("__new_{w}"), format!("sgd({w}, {g}, __lr{wd})")),
        Optimizer::Adam | Optimizer::Adamw => (
            format!("(__new_{w}, __new_m_{w}, __new_v_{w})"),
            format!(
                "{}({w}, {g}, __m_{w}, __v_{w}, t, lr=__lr{wd})",
                if args.optimizer == Optimizer::Adam {
                    "adam"
                } else {
                    "adamw"
                }
            ),
        ),
    }
}

/// Initial weights: from `dir` (`NAME.npy`) when given, else drawn as
/// PyTorch initializes layers: uniform within ±1/sqrt(fan-in) for a weight
/// of rank 2 or more (fan-in: the contraction length of the product or
/// convolution reading it; otherwise its first extent for rank 2, the
/// product of all but the first for higher ranks), zero for rank 0 and 1.
fn initial_weights(
    f: &dlc_graph::Function,
    plan: &Plan,
    source: Option<&dlc_driver::WeightSource>,
    seed: u64,
) -> Result<Vec<HostTensor>, DriverError> {
    let ranges = dlc_driver::random_ranges(f);
    let mut rng = dlc_runtime::seeded_rng(seed);
    // Each weight's value from `--weights`, read once.
    let given: Vec<Option<HostTensor>> = plan
        .weights
        .iter()
        .map(|&w| {
            let (name, ty) = &plan.params[w];
            source.map_or(Ok(None), |s| s.get(name, ty))
        })
        .collect::<Result<_, _>>()?;
    if let Some(s) = source
        && given.iter().all(Option::is_none)
    {
        let (name, _) = &plan.params[plan.weights[0]];
        return Err(usage(format!(
            "--weights: no value for weight `{name}` ({}) nor for any other weight",
            s.place(name)
        )));
    }
    plan.weights
        .iter()
        .zip(given)
        .map(|(&w, given)| {
            let (_, ty) = &plan.params[w];
            // Every weight is drawn, so that a weight's initial value does
            // not depend on which others come from files.
            let bound = match (ranges[w], ty.rank()) {
                (_, 0 | 1) => 0.0,
                (dlc_driver::RandomRange::Weight(s), _) => s,
                (_, 2) => 1.0 / (ty.shape[0] as f64).sqrt(),
                _ => 1.0 / (ty.shape[1..].iter().product::<usize>() as f64).sqrt(),
            };
            let values = HostTensor::random_values(ty, &mut rng)
                .map(|v| ty.dtype.round(v * bound))
                .collect::<Vec<f64>>();
            match given {
                Some(t) => Ok(t),
                None => HostTensor::new(ty.clone(), values).map_err(|e| usage(e.to_string())),
            }
        })
        .collect()
}

/// Initial buffers: from `--weights` where it holds one (`NAME.npy`, or
/// `NAME` or `buffer.NAME` in a .safetensors file), zeros otherwise
/// (PyTorch starts a running variance at one: give it a file of ones).
fn initial_buffers(
    plan: &Plan,
    source: Option<&dlc_driver::WeightSource>,
) -> Result<Vec<HostTensor>, DriverError> {
    plan.buffers
        .iter()
        .map(|&b| {
            let (name, ty) = &plan.params[b];
            match source.map_or(Ok(None), |s| s.get(name, ty))? {
                Some(t) => Ok(t),
                None => HostTensor::new(ty.clone(), vec![0.0; ty.num_elements().unwrap_or(0)])
                    .map_err(|e| usage(e.to_string())),
            }
        })
        .collect()
}

/// Runs `dlc train`.
pub fn train(args: &TrainArgs) -> Result<(), DriverError> {
    if let Some(ranks) = args.ranks {
        if args.backend == TrainBackend::GpuEmulator && ranks > 1 {
            return Err(usage(gpu::EMULATOR_RANKS));
        }
        if args.data_parallel {
            return Err(usage(
                "--ranks starts mpirun with --data-parallel itself: give one of the two",
            ));
        }
        return distributed::launch(ranks);
    }
    if !(args.bucket_mb > 0.0 && args.bucket_mb.is_finite()) {
        return Err(usage(format!(
            "--bucket-mb must be positive, got {}",
            args.bucket_mb
        )));
    }
    if !args.data_parallel {
        return train_on(args, None);
    }
    let world = World::join()?;
    world.share_cores()?;
    // An error on one rank ends them all: the others would wait for it in
    // the next all-reduce.
    match train_on(args, Some(&world)) {
        Ok(()) => Ok(()),
        Err(e) => world.fail(&e.to_string()),
    }
}

/// Trains, alone or as one rank of `world`.
fn train_on(args: &TrainArgs, world: Option<&World>) -> Result<(), DriverError> {
    let save_file = check_settings(args)?;
    let src = read_model(&args.file, &dlc_onnx::Options::default())?;
    let module = compile_source(&src)?;
    let f = dlc_driver::select_entry(&module, args.entry.as_deref())?.clone();
    let plan = Plan::of(&f, args)?;
    let (tensors, n) = read_data(&plan)?;
    let batch = plan.params[plan.data[0].0].1.shape[0];
    // A data-parallel run's global batch: every rank's share.
    let ranks = world.map_or(1, World::size);
    let global = batch * ranks;
    let steps = n / global;
    if steps == 0 {
        return Err(usage(if world.is_some() {
            format!(
                "the data set has {n} rows, fewer than one global batch of {global} ({ranks} rank(s) of {batch})"
            )
        } else {
            format!("the data set has {n} rows, fewer than one batch of {batch}")
        }));
    }
    if world.is_some() {
        plan.check_summable()?;
    }
    let total = steps * args.epochs;
    let (step_module, split) = compile_step(&src, &plan, args, total, world)?;
    let mixed = args.precision != Precision::F32;
    let setting = Progress::first(args, global);
    let source = args
        .weights
        .as_deref()
        .map(dlc_driver::WeightSource::open)
        .transpose()?;
    let start = match &args.resume {
        None => Start {
            weights: initial_weights(&f, &plan, source.as_ref(), args.seed)?,
            state: None,
            buffers: initial_buffers(&plan, source.as_ref())?,
            progress: setting.clone(),
        },
        Some(dir) => resume(dir, args, &plan, &setting)?,
    };
    let layout = Layout {
        params: plan.params.len(),
        weights: plan.weights.clone(),
        buffers: plan.buffers.clone(),
        ns: plan.state.len(),
        mixed,
    };
    let initial = Initial {
        weights: &start.weights,
        state: start.state.as_deref(),
        buffers: &start.buffers,
        scale: start.progress.loss_scale,
        good: start.progress.good,
    };
    let driven = Loop {
        args,
        plan: &plan,
        data: &tensors,
        rows: n,
        batch,
        steps,
        total,
        start: &start.progress,
        setting: &setting,
        world,
    };
    if args.backend != TrainBackend::Cpu {
        let trained = gpu::train(
            args.backend,
            &step_module,
            split,
            &layout,
            &initial,
            &driven,
        )?;
        if world.is_none_or(World::leads) {
            save_trained(args, &plan, trained, save_file)?;
        }
        return Ok(());
    }
    let lowered = dlc_driver::lower_for_cpu(&step_module)?;
    // The step's objects from the cache when an unchanged model trains
    // again (its front end still runs: the plan is made from the graph).
    let options = dlc_llvm::JitOptions {
        cache: (!args.no_cache)
            .then(dlc_llvm::ObjectCache::for_user)
            .flatten(),
        profile: false,
    };
    let result = dlc_llvm::jit_with(&lowered, &options, |jit| {
        Ok(match (world, split) {
            (None, _) => {
                let kernel = jit.kernel("__train_step")?;
                Fused::bind(&kernel, &layout, &initial).and_then(|mut s| driven.run(&mut s))
            }
            (Some(_), None) => Err(usage("the data-parallel gradient was not split")),
            (Some(world), Some((buckets, slots, plans))) => {
                let kernels = plans
                    .iter()
                    .map(|p| jit.kernel(&p.name))
                    .collect::<Result<Vec<_>, _>>()?;
                let update = jit.kernel("__train_update")?;
                Staged::bind(
                    &kernels, &plans, &update, buckets, slots, &layout, &initial, world,
                )
                .and_then(|mut s| driven.run(&mut s))
            }
        })
    })
    .map_err(|e| usage(e.to_string()))?;
    let trained = result?;
    if world.is_none_or(World::leads) {
        save_trained(args, &plan, trained, save_file)?;
    }
    Ok(())
}

/// Checks the settings that need no model, and that the places written
/// to can be; returns whether `--save-weights` names one .safetensors
/// file (rather than a folder of .npy files).
fn check_settings(args: &TrainArgs) -> Result<bool, DriverError> {
    if args.epochs == 0 {
        return Err(usage("--epochs must be at least 1"));
    }
    if !(args.lr > 0.0 && args.lr.is_finite()) {
        return Err(usage(format!("--lr must be positive, got {}", args.lr)));
    }
    if args.optimizer != Optimizer::Sgd && (args.momentum.is_some() || args.nesterov) {
        return Err(usage("--momentum and --nesterov are for --optimizer sgd"));
    }
    if args.resume.is_some() && args.weights.is_some() {
        return Err(usage(
            "--resume continues from a checkpoint's weights: leave out --weights",
        ));
    }
    let as_file = |p: &Path| p.extension().is_some_and(|e| e == "safetensors");
    let save_file = args.save_weights.as_deref().filter(|p| as_file(p));
    for path in [&args.save_weights, &args.checkpoint].into_iter().flatten() {
        match path.parent() {
            // A .safetensors file of weights goes into its folder.
            Some(parent) if Some(path.as_path()) == save_file => {
                let parent = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
                dlc_driver::ensure_writable_dir(parent)?;
            }
            _ => dlc_driver::ensure_writable_dir(path)?,
        }
    }
    Ok(save_file.is_some())
}

impl Plan {
    /// The plan of training `f` as `args` say: its loss, weights, data
    /// and buffers, checked against each other.
    fn of(f: &dlc_graph::Function, args: &TrainArgs) -> Result<Plan, DriverError> {
        let loss_ty = f.result_types();
        if loss_ty
            .first()
            .is_none_or(|t| t.rank() != 0 || t.dtype != dlc_core::DType::F32)
        {
            return Err(usage(format!(
                "`{}` must return an f32 scalar loss first, returns ({})",
                f.name,
                loss_ty
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let params: Vec<(String, dlc_core::TensorType)> = f
            .params
            .iter()
            .map(|(n, node)| (n.clone(), f.body[*node].results[0].clone()))
            .collect();
        let weights: Vec<usize> = f.weights.iter().copied().collect();
        if weights.is_empty() {
            return Err(usage(format!(
                "`{}` declares no `weight` parameters: mark the parameters to train `weight name: type`",
                f.name
            )));
        }
        if let Some(&w) = weights.iter().find(|&&w| !params[w].1.dtype.is_float()) {
            return Err(usage(format!(
                "weight `{}` is {}: only float weights train",
                params[w].0, params[w].1
            )));
        }
        let mut files = data_files(args)?;
        let mut data = Vec::new();
        let mut buffers = Vec::new();
        for (i, (name, _)) in params.iter().enumerate() {
            if weights.contains(&i) {
                if files.iter().any(|(n, _)| n == name) {
                    return Err(usage(format!(
                        "`{name}` is a weight of `{}`: weights are not data (initialize them with --weights DIR)",
                        f.name
                    )));
                }
                continue;
            }
            match files.iter().position(|(n, _)| n == name) {
                Some(k) => data.push((i, files.remove(k).1)),
                None => buffers.push(i),
            }
        }
        // The loss's further results are its buffers' new values.
        let aux = &loss_ty[1..];
        let fits =
            buffers.len() == aux.len() && buffers.iter().zip(aux).all(|(&b, t)| &params[b].1 == t);
        if !fits {
            return Err(usage(buffers_unfit(f, &params, &buffers, aux)));
        }
        if let Some((name, _)) = files.first() {
            let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
            return Err(usage(format!(
                "--data `{name}`: `{}` has no such parameter; its parameters: {}",
                f.name,
                names.join(", ")
            )));
        }
        if data.is_empty() {
            return Err(usage(format!(
                "`{}` takes no data: every parameter is a weight",
                f.name
            )));
        }
        let state: Vec<&'static str> = match args.optimizer {
            Optimizer::Sgd if args.momentum.is_some() || args.nesterov => vec!["buf"],
            Optimizer::Sgd => vec![],
            Optimizer::Adam | Optimizer::Adamw => vec!["m", "v"],
        };
        Ok(Plan {
            loss: f.name.clone(),
            params,
            weights,
            data,
            state,
            buffers,
        })
    }

    /// Data-parallel ranks sum f32 tensors: every weight and buffer must
    /// be one.
    fn check_summable(&self) -> Result<(), DriverError> {
        let not_f32 = self
            .weights
            .iter()
            .chain(&self.buffers)
            .find(|&&i| self.params[i].1.dtype != dlc_core::DType::F32);
        match not_f32 {
            Some(&i) => {
                let (name, ty) = &self.params[i];
                Err(usage(format!(
                    "--data-parallel sums f32 gradients and buffers over the ranks; `{name}` is {ty} (train it in f32; --precision bf16 or f16 keeps f32 weights)"
                )))
            }
            None => Ok(()),
        }
    }
}

/// `--data NAME=PATH` as (name, path), each name once.
fn data_files(args: &TrainArgs) -> Result<Vec<(String, PathBuf)>, DriverError> {
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    for spec in &args.data {
        let Some((name, path)) = spec.split_once('=') else {
            return Err(usage(format!("--data takes NAME=PATH.npy, got `{spec}`")));
        };
        if files.iter().any(|(n, _)| n == name) {
            return Err(usage(format!("--data `{name}` is given twice")));
        }
        files.push((name.to_string(), PathBuf::from(path)));
    }
    Ok(files)
}

/// Why the loss's results after the first do not fit its buffers (the
/// parameters that are neither weights nor data).
fn buffers_unfit(
    f: &dlc_graph::Function,
    params: &[(String, dlc_core::TensorType)],
    buffers: &[usize],
    aux: &[dlc_core::TensorType],
) -> String {
    let (name, _) = &params[buffers.first().copied().unwrap_or(0)];
    match buffers.first() {
        Some(_) if aux.is_empty() => format!(
            "parameter `{name}` of `{}` is not a weight and has no --data {name}=FILE.npy (a buffer, such as a running average, is returned by the loss after it)",
            f.name
        ),
        _ => format!(
            "`{}` returns {} value(s) after the loss, the new values of its buffers (the parameters neither weights nor data: {}), which must match them in number and type",
            f.name,
            aux.len(),
            if buffers.is_empty() {
                "none".to_string()
            } else {
                buffers
                    .iter()
                    .map(|&b| format!("{}: {}", params[b].0, params[b].1))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
    }
}

/// The data sets, checked against their parameters: each file's rows are
/// the parameter's batch rows. Returns them and their number of rows.
fn read_data(plan: &Plan) -> Result<(Vec<HostTensor>, usize), DriverError> {
    let mut tensors = Vec::new();
    let mut rows: Option<(usize, String)> = None;
    for (i, path) in &plan.data {
        let (name, ty) = &plan.params[*i];
        if ty.rank() == 0 {
            return Err(usage(format!(
                "data parameter `{name}` is a scalar; its leading extent is the batch"
            )));
        }
        let t = HostTensor::read_npy(path, Some(ty.dtype))?;
        if t.ty.dtype != ty.dtype || t.ty.rank() != ty.rank() || t.ty.shape[1..] != ty.shape[1..] {
            return Err(usage(format!(
                "--data {name}: {} holds {}; a data set for {ty} is {}[N{}]",
                path.display(),
                t.ty,
                ty.dtype,
                ty.shape[1..]
                    .iter()
                    .map(|d| format!(", {d}"))
                    .collect::<String>()
            )));
        }
        let n = t.ty.shape[0];
        match &rows {
            Some((m, other)) if *m != n => {
                return Err(usage(format!(
                    "--data {name} has {n} rows, --data {other} has {m}"
                )));
            }
            _ => rows = Some((n, name.clone())),
        }
        tensors.push(t);
    }
    let params = &plan.params;
    let first = plan.data[0].0;
    let batch = params[first].1.shape[0];
    if let Some(&(i, _)) = plan
        .data
        .iter()
        .find(|(i, _)| params[*i].1.shape[0] != batch)
    {
        return Err(usage(format!(
            "data parameters must share their leading extent (the batch): `{}` has {}, `{}` has {batch}",
            params[i].0, params[i].1.shape[0], params[first].0
        )));
    }
    Ok((tensors, rows.map_or(0, |r| r.0)))
}

/// A data-parallel gradient's stages: the buckets, their slots and each
/// stage's plan.
type Split = (Buckets, Vec<Slot>, Vec<StagePlan>);

/// The step, compiled for this CPU: one function, or a data-parallel run's
/// gradient (in stages, one per bucket of results, so that a bucket is
/// summed while the next stage computes) and update.
/// The training step's entry points (`__train_step`, or for `world` the
/// gradient's stages and `__train_update`) after the default pipeline, to
/// be lowered for the device that runs them.
fn compile_step(
    src: &SourceText,
    plan: &Plan,
    args: &TrainArgs,
    total: usize,
    world: Option<&World>,
) -> Result<(dlc_graph::Module, Option<Split>), DriverError> {
    let text = format!(
        "{}{}",
        src.text,
        step_source(plan, args, total, world.map(World::size))?
    );
    let mut step_module = compile_source(&SourceText {
        name: src.name.clone(),
        text,
        weights: Vec::new(),
    })?;
    run_passes(&mut step_module, DEFAULT_PIPELINE, PassOptions::default())?;
    let entries = match world {
        None => vec!["__train_step".to_string()],
        Some(_) => vec!["__train_grads".to_string(), "__train_update".to_string()],
    };
    let mut step_module = dlc_driver::only_entries(&step_module, &entries)?;
    let split = match world {
        None => None,
        Some(_) => {
            let bytes = (args.bucket_mb * (1 << 20) as f64) as usize;
            Some(split_gradient(&mut step_module, plan.weights.len(), bytes)?)
        }
    };
    Ok((step_module, split))
}

/// Where training starts: the weights, the optimizer's state (none: from
/// zero), the buffers and the progress.
struct Start {
    weights: Vec<HostTensor>,
    state: Option<Vec<HostTensor>>,
    buffers: Vec<HostTensor>,
    progress: Progress,
}

/// `--resume DIR`: the checkpoint's tensors and progress, once its
/// settings are found to be this run's.
fn resume(
    dir: &Path,
    args: &TrainArgs,
    plan: &Plan,
    setting: &Progress,
) -> Result<Start, DriverError> {
    let (tensors, progress) = read_checkpoint(dir)?;
    let differs = |what: &str, was: &dyn std::fmt::Debug, now: &dyn std::fmt::Debug| {
        usage(format!(
            "--resume {}: the checkpoint was written with {what} {was:?}, this run has {now:?}; resume with the run's own settings",
            dir.display()
        ))
    };
    if progress.seed != setting.seed {
        return Err(differs("--seed", &progress.seed, &setting.seed));
    }
    // A cosine schedule spans the whole run; any other lets a run go on
    // for more epochs than it first meant to.
    let spans_run = args
        .schedule
        .as_deref()
        .is_some_and(|s| s.starts_with("cosine"));
    if spans_run && progress.epochs != setting.epochs {
        return Err(differs(
            "--epochs (which the cosine schedule spans)",
            &progress.epochs,
            &setting.epochs,
        ));
    }
    // 0: a checkpoint from before the batch was recorded.
    if progress.batch != 0 && progress.batch != setting.batch {
        return Err(differs(
            "a global batch of",
            &progress.batch,
            &setting.batch,
        ));
    }
    if progress.lr != setting.lr {
        return Err(differs("--lr", &progress.lr, &setting.lr));
    }
    if progress.optimizer != setting.optimizer {
        return Err(differs(
            "the optimizer",
            &progress.optimizer,
            &setting.optimizer,
        ));
    }
    if progress.epoch >= args.epochs {
        return Err(usage(format!(
            "--resume {}: the checkpoint has done all {} epochs",
            dir.display(),
            args.epochs
        )));
    }
    let take = |key: String, ty: &dlc_core::TensorType| -> Result<HostTensor, DriverError> {
        match tensors.iter().find(|(n, _)| *n == key) {
            Some((_, t)) if &t.ty == ty => Ok(t.clone()),
            Some((_, t)) => Err(usage(format!(
                "--resume: `{key}` is {} in the checkpoint, {ty} here",
                t.ty
            ))),
            None => Err(usage(format!("--resume: the checkpoint has no `{key}`"))),
        }
    };
    let mut weights = Vec::new();
    let mut state = Vec::new();
    for &w in &plan.weights {
        let (name, ty) = &plan.params[w];
        weights.push(take(format!("weight.{name}"), ty)?);
        for s in &plan.state {
            state.push(take(format!("state.{s}.{name}"), ty)?);
        }
    }
    let buffers = plan
        .buffers
        .iter()
        .map(|&b| take(format!("buffer.{}", plan.params[b].0), &plan.params[b].1))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Start {
        weights,
        state: Some(state),
        buffers,
        progress,
    })
}

/// `--save-weights`: the trained weights and buffers, as one .safetensors
/// file (`as_file`) or a folder of .npy files.
fn save_trained(
    args: &TrainArgs,
    plan: &Plan,
    trained: Vec<HostTensor>,
    as_file: bool,
) -> Result<(), DriverError> {
    let Some(path) = &args.save_weights else {
        return Ok(());
    };
    let names = plan
        .weights
        .iter()
        .chain(&plan.buffers)
        .map(|&w| plan.params[w].0.clone());
    if as_file {
        let named: Vec<(String, HostTensor)> = names.zip(trained).collect();
        dlc_driver::write_safetensors(path, &named, Default::default())?;
        dlc_cli::outln!("wrote {}", path.display());
    } else {
        let named: Vec<(String, &HostTensor)> = names.zip(&trained).collect();
        for path in dlc_driver::save_named_outputs(path, &named)? {
            dlc_cli::outln!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn runtime(e: dlc_runtime::RuntimeError) -> DriverError {
    usage(e.to_string())
}

/// Where the step's tensors are among its parameters.
struct Layout {
    /// The loss's parameters.
    params: usize,
    /// The weights' and the buffers' places among them.
    weights: Vec<usize>,
    buffers: Vec<usize>,
    /// Optimizer state tensors per weight.
    ns: usize,
    /// Mixed precision: a loss scale and its count of good updates.
    mixed: bool,
}

/// What a run starts from: fresh or a checkpoint's.
struct Initial<'a> {
    weights: &'a [HostTensor],
    /// None: zeros.
    state: Option<&'a [HostTensor]>,
    buffers: &'a [HostTensor],
    scale: f64,
    good: u64,
}

impl<'a> Initial<'a> {
    /// Optimizer state tensor `i` (weight by weight) from the checkpoint;
    /// none when starting fresh (zeros).
    fn state_tensor(&self, i: usize) -> Option<&'a HostTensor> {
        self.state.and_then(|s| s.get(i))
    }
}

impl Layout {
    /// The loss's parameter `i` at the start: a weight's or a buffer's
    /// tensor, or none for data.
    fn initial_param<'t>(&self, i: usize, initial: &Initial<'t>) -> Option<&'t HostTensor> {
        if let Some(k) = self.weights.iter().position(|&w| w == i) {
            initial.weights.get(k)
        } else {
            let j = self.buffers.iter().position(|&b| b == i)?;
            initial.buffers.get(j)
        }
    }

    /// What each input of the fused step starts as: the loss's parameters
    /// (the weights, the buffers, the data: zeros until the first batch),
    /// the optimizer state (zeros, or the checkpoint's), the step number,
    /// and with mixed precision the loss scale and its good updates.
    fn initial_inputs<'t>(
        &self,
        types: &[dlc_core::TensorType],
        initial: &Initial<'t>,
    ) -> Vec<Given<'t>> {
        let mut given: Vec<Given<'t>> = (0..self.params.min(types.len()))
            .map(|i| match self.initial_param(i, initial) {
                Some(t) => Given::Tensor(t),
                None => Given::Zeros,
            })
            .collect();
        for k in 0..initial.weights.len() {
            for s in 0..self.ns {
                given.push(match initial.state_tensor(k * self.ns + s) {
                    Some(t) => Given::Tensor(t),
                    None => Given::Zeros,
                });
            }
        }
        given.push(Given::Value(1.0));
        if self.mixed {
            given.push(Given::Value(initial.scale));
            given.push(Given::Value(initial.good as f64));
        }
        given
    }

    /// The fused step's input holding the step number (the loss scale and
    /// its good updates follow it).
    fn t_input(&self) -> usize {
        self.params + self.weights.len() * self.ns
    }

    /// The fused step's result saying how many, with mixed precision, comes
    /// after the loss, the weights, the state and the buffers: the loss
    /// scale, its good updates, whether the update was made.
    fn scale_result(&self) -> usize {
        let nw = self.weights.len();
        1 + nw + nw * self.ns + self.buffers.len()
    }

    /// The fused step's results that become its inputs for the next step,
    /// as (result, input): the new weights, state, buffers, and the loss
    /// scale and its good updates.
    fn trades(&self) -> Vec<(usize, usize)> {
        let (nw, ns) = (self.weights.len(), self.ns);
        let mut pairs = Vec::new();
        for (k, &w) in self.weights.iter().enumerate() {
            pairs.push((1 + k, w));
            for s in 0..ns {
                pairs.push((1 + nw + k * ns + s, self.params + k * ns + s));
            }
        }
        for (j, &b) in self.buffers.iter().enumerate() {
            pairs.push((1 + nw + nw * ns + j, b));
        }
        if self.mixed {
            let (r, t) = (self.scale_result(), self.t_input());
            pairs.push((r, t + 1));
            pairs.push((r + 1, t + 2));
        }
        pairs
    }
}

impl Layout {
    /// The data-parallel gradient's inputs at the start (`types`): the
    /// loss's parameters, and with mixed precision the loss scale.
    fn gradient_inputs(
        &self,
        types: &[dlc_core::TensorType],
        initial: &Initial<'_>,
    ) -> Vec<AlignedBuffer> {
        let mut params: Vec<AlignedBuffer> = types
            .iter()
            .enumerate()
            .map(|(i, ty)| match self.initial_param(i, initial) {
                Some(t) => AlignedBuffer::from_tensor(t),
                None => zeroed(ty),
            })
            .collect();
        if self.mixed {
            params[self.params] =
                AlignedBuffer::from_values(dlc_core::DType::F32, 1, std::iter::once(initial.scale));
        }
        params
    }

    /// The optimizer state at the start, from the types of the update's
    /// inputs (the weights, the gradients, the state, ...): zeros, or the
    /// checkpoint's.
    fn update_state<'t>(
        &self,
        inputs: impl Iterator<Item = &'t dlc_core::TensorType>,
        initial: &Initial<'_>,
    ) -> Vec<AlignedBuffer> {
        let nw = self.weights.len();
        inputs
            .skip(2 * nw)
            .take(nw * self.ns)
            .enumerate()
            .map(|(i, ty)| match initial.state_tensor(i) {
                Some(t) => AlignedBuffer::from_tensor(t),
                None => zeroed(ty),
            })
            .collect()
    }
}

/// `values` as the elements of data parameter `i` of type `ty`, all of
/// them given.
fn batch(
    i: usize,
    ty: &dlc_core::TensorType,
    values: impl Iterator<Item = f64>,
) -> Result<AlignedBuffer, DriverError> {
    let n = ty.num_elements().unwrap_or(0);
    let mut count = 0;
    let b = AlignedBuffer::from_values(ty.dtype, n, values.inspect(|_| count += 1));
    if count < n {
        return Err(usage(format!(
            "data parameter {i} ({ty}) given {count} of its {n} elements"
        )));
    }
    Ok(b)
}

/// An input's value at the start of training.
pub(crate) enum Given<'t> {
    Tensor(&'t HostTensor),
    Zeros,
    Value(f64),
}

impl Given<'_> {
    /// The value as the element bytes of type `ty`; a tensor of another
    /// type is an error naming input `i`.
    pub(crate) fn buffer(
        &self,
        i: usize,
        ty: &dlc_core::TensorType,
    ) -> Result<AlignedBuffer, DriverError> {
        let n = ty.num_elements().unwrap_or(0);
        match self {
            Given::Tensor(t) if &t.ty == ty => Ok(AlignedBuffer::from_tensor(t)),
            Given::Tensor(t) => Err(usage(format!(
                "input {i} of the training step is {ty}, given {}",
                t.ty
            ))),
            Given::Zeros => Ok(zeroed(ty)),
            Given::Value(v) => Ok(AlignedBuffer::from_values(
                ty.dtype,
                n,
                std::iter::repeat(*v),
            )),
        }
    }
}

/// Time a data-parallel step spent, since it was last asked.
#[derive(Default)]
struct Timing {
    /// In the compiled gradient and update.
    compute: std::time::Duration,
    /// In MPI, summing gradients, buffers and the loss over the ranks
    /// (starting each bucket's all-reduce, progressing those under way,
    /// waiting for the last).
    reduce: std::time::Duration,
    buckets: usize,
    bytes: usize,
    /// What summed on the device beside the step's kernels (NCCL), their
    /// time within `compute`; none for MPI on the host.
    on_device: Option<&'static str>,
}

/// One optimizer step as the training loop drives it.
trait Stepper {
    /// Overwrites data parameter `i` with this rank's rows of the batch.
    fn write_data(
        &mut self,
        i: usize,
        values: impl Iterator<Item = f64>,
    ) -> Result<(), DriverError>;
    /// Runs update number `update`: the loss (over the global batch), and
    /// whether the update was made (mixed precision skips one whose
    /// gradients overflowed).
    fn step(&mut self, update: u64) -> Result<(f64, bool), DriverError>;
    fn weight(&self, k: usize) -> Result<HostTensor, DriverError>;
    fn state(&self, k: usize, s: usize) -> Result<HostTensor, DriverError>;
    fn buffer(&self, j: usize) -> Result<HostTensor, DriverError>;
    /// The loss scale and its good updates (mixed precision).
    fn scale(&self) -> Result<(f64, u64), DriverError>;
    /// A data-parallel step's time since the last call.
    fn timing(&mut self) -> Option<Timing> {
        None
    }
}

/// The step as one compiled call whose weights and state trade buffers
/// with its results.
struct Fused<'k, 'a> {
    call: dlc_runtime::call::BoundCall<'k, 'a>,
    layout: &'k Layout,
}

impl<'k, 'a> Fused<'k, 'a> {
    fn bind(
        kernel: &'k dlc_runtime::Kernel<'a>,
        layout: &'k Layout,
        initial: &Initial<'_>,
    ) -> Result<Fused<'k, 'a>, DriverError> {
        let types: Vec<_> = kernel.signature().inputs().map(|p| p.ty.clone()).collect();
        let mut binder = kernel.binder();
        for (given, ty) in layout.initial_inputs(&types, initial).iter().zip(&types) {
            match given {
                Given::Tensor(t) => binder.push(t),
                Given::Zeros => binder.push_values(ty, std::iter::repeat(0.0)),
                Given::Value(v) => binder.push_values(ty, std::iter::repeat(*v)),
            }
            .map_err(runtime)?;
        }
        let call = binder.finish().map_err(runtime)?;
        Ok(Fused { call, layout })
    }

    fn state_input(&self, k: usize, s: usize) -> usize {
        self.layout.params + k * self.layout.ns + s
    }
}

impl Stepper for Fused<'_, '_> {
    fn write_data(
        &mut self,
        i: usize,
        values: impl Iterator<Item = f64>,
    ) -> Result<(), DriverError> {
        self.call.write_input(i, values).map_err(runtime)
    }

    fn step(&mut self, update: u64) -> Result<(f64, bool), DriverError> {
        let l = self.layout;
        let call = &mut self.call;
        call.write_input(l.t_input(), std::iter::once(update as f64))
            .map_err(runtime)?;
        call.run().map_err(runtime)?;
        let loss = call.output(0).map_err(runtime)?.data[0];
        let made = !l.mixed || call.output(l.scale_result() + 2).map_err(runtime)?.data[0] != 0.0;
        for (result, input) in l.trades() {
            call.swap_result_into_input(result, input)
                .map_err(runtime)?;
        }
        Ok((loss, made))
    }

    fn weight(&self, k: usize) -> Result<HostTensor, DriverError> {
        self.call.input(self.layout.weights[k]).map_err(runtime)
    }

    fn state(&self, k: usize, s: usize) -> Result<HostTensor, DriverError> {
        self.call.input(self.state_input(k, s)).map_err(runtime)
    }

    fn buffer(&self, j: usize) -> Result<HostTensor, DriverError> {
        self.call.input(self.layout.buffers[j]).map_err(runtime)
    }

    fn scale(&self) -> Result<(f64, u64), DriverError> {
        let t = self.layout.t_input();
        let scale = self.call.input(t + 1).map_err(runtime)?.data[0];
        let good = self.call.input(t + 2).map_err(runtime)?.data[0];
        Ok((scale, good as u64))
    }
}

/// The gradient's stages, as the data-parallel step runs them: stage `k`
/// computes bucket `k`'s results (written into the bucket), reading the
/// values of earlier stages it is handed.
pub struct StagePlan {
    /// Its entry point.
    name: String,
    /// Per parameter after the gradient's own: the stage and the carried
    /// result of that stage (counted after its bucket's results).
    carried: Vec<(usize, usize)>,
    /// Its bucket's results, in its results' order.
    own: Vec<Slot>,
}

/// Splits `__train_grads` of `module` into one stage per bucket of its
/// results (the loss, the buffers, the gradients in the order the backward
/// pass finishes them: the last weights' first), each an entry point; the
/// buckets, each result's slot, and the stages.
fn split_gradient(
    module: &mut dlc_graph::Module,
    nw: usize,
    bucket_bytes: usize,
) -> Result<Split, DriverError> {
    let at = module
        .functions
        .iter()
        .position(|f| f.name == "__train_grads")
        .ok_or_else(|| usage("no __train_grads"))?;
    let grads = module.functions.remove(at);
    let count = |v: &dlc_graph::Value| grads.value_type(*v).num_elements().unwrap_or(0);
    // Results: the loss, the gradients, the buffers; bucketed as the loss,
    // the buffers, then the gradients last to first.
    let n = grads.results.len();
    let order: Vec<usize> = std::iter::once(0)
        .chain(1 + nw..n)
        .chain((1..=nw).rev())
        .collect();
    let lens: Vec<usize> = order.iter().map(|&r| count(&grads.results[r])).collect();
    let (buckets, bucketed) = Buckets::new(&lens, bucket_bytes);
    let mut slots = vec![bucketed[0]; n];
    for (&r, &slot) in order.iter().zip(&bucketed) {
        slots[r] = slot;
    }
    let groups: Vec<Vec<usize>> = (0..buckets.count())
        .map(|b| {
            order
                .iter()
                .copied()
                .filter(|&r| slots[r].bucket == b)
                .collect()
        })
        .collect();
    let mut stages = dlc_graph::transforms::split_by_results(&grads, &groups).map_err(usage)?;
    // Entry points are C symbols.
    for (k, s) in stages.iter_mut().enumerate() {
        s.function.name = format!("__train_grads_stage{k}");
    }
    let plans = stages
        .iter()
        .zip(&groups)
        .map(|(s, group)| StagePlan {
            name: s.function.name.clone(),
            carried: s
                .carried
                .iter()
                .map(|&(j, r)| (j, r - stages[j].own))
                .collect(),
            own: group.iter().map(|&r| slots[r]).collect(),
        })
        .collect();
    module
        .functions
        .extend(stages.into_iter().map(|s| s.function));
    Ok((buckets, slots, plans))
}

fn zeroed(ty: &dlc_core::TensorType) -> AlignedBuffer {
    AlignedBuffer::zeroed(ty.num_elements().unwrap_or(0) * ty.dtype.size_bytes())
}

/// A data-parallel step: the gradient of this rank's share in stages, each
/// stage's bucket summed over the ranks on a thread of its own while the
/// next stage computes, then the update, the same on every rank. Every
/// tensor lives here once and each compiled call is handed pointers to
/// them: stages write into the buckets and read each other's values, the
/// update reads the sums, nothing is copied between calls.
///
/// The update takes the weights, the summed gradients, the state, the step
/// number (and the loss scale and its good updates) and returns the
/// weights and the state (and the loss scale's three), into buffers that
/// trade places with its inputs after the call.
struct Staged<'k, 'a> {
    stages: Vec<(&'k dlc_runtime::Kernel<'a>, &'k StagePlan)>,
    update: &'k dlc_runtime::Kernel<'a>,
    layout: &'k Layout,
    world: &'k World,
    buckets: Buckets,
    /// The gradient's parameters: the loss's (weights, buffers, data) and,
    /// with mixed precision, the loss scale.
    params: Vec<AlignedBuffer>,
    types: Vec<dlc_core::TensorType>,
    /// Each stage's carried results.
    carries: Vec<Vec<AlignedBuffer>>,
    /// The update's: the state, the step number, the good updates; the
    /// buffers it writes (the new weights, state, scale, good updates and
    /// whether the update was made).
    state: Vec<AlignedBuffer>,
    t: AlignedBuffer,
    good: AlignedBuffer,
    out: Vec<AlignedBuffer>,
    /// The slots of the loss, the gradients and the buffers.
    slots: Vec<Slot>,
    timing: Timing,
}

impl<'k, 'a> Staged<'k, 'a> {
    #[allow(clippy::too_many_arguments)]
    fn bind(
        kernels: &'k [dlc_runtime::Kernel<'a>],
        plans: &'k [StagePlan],
        update: &'k dlc_runtime::Kernel<'a>,
        buckets: Buckets,
        slots: Vec<Slot>,
        layout: &'k Layout,
        initial: &Initial<'_>,
        world: &'k World,
    ) -> Result<Staged<'k, 'a>, DriverError> {
        let first = kernels.first().ok_or_else(|| usage("no gradient stage"))?;
        // Every stage takes the gradient's parameters first.
        let given = first.signature().inputs().count() - plans[0].carried.len();
        let types: Vec<_> = first
            .signature()
            .inputs()
            .take(given)
            .map(|p| p.ty.clone())
            .collect();
        let params = layout.gradient_inputs(&types, initial);
        let carries = kernels
            .iter()
            .zip(plans)
            .map(|(k, p)| {
                k.signature()
                    .outputs()
                    .skip(p.own.len())
                    .map(|o| zeroed(&o.ty))
                    .collect()
            })
            .collect();
        let state = layout.update_state(update.signature().inputs().map(|p| &p.ty), initial);
        let out = update
            .signature()
            .outputs()
            .map(|o| zeroed(&o.ty))
            .collect();
        let i64_ty = dlc_core::DType::I64;
        let mut staged = Staged {
            stages: kernels.iter().zip(plans).collect(),
            update,
            layout,
            world,
            buckets,
            params,
            types,
            carries,
            state,
            t: AlignedBuffer::from_values(i64_ty, 1, std::iter::once(1.0)),
            good: AlignedBuffer::from_values(i64_ty, 1, std::iter::once(initial.good as f64)),
            out,
            slots,
            timing: Timing::default(),
        };
        // Every rank starts from rank 0's weights, state and buffers.
        for &i in layout.weights.iter().chain(&layout.buffers) {
            world.broadcast(staged.params[i].bytes_mut());
        }
        for s in &mut staged.state {
            world.broadcast(s.bytes_mut());
        }
        Ok(staged)
    }

    /// Runs stage `k`.
    #[allow(unsafe_code)] // Compiled code called on storage laid out here.
    fn run_stage(&mut self, k: usize) -> Result<(), DriverError> {
        let (kernel, plan) = self.stages[k];
        let mut pointers: Vec<*mut u8> = self.params.iter_mut().map(|b| b.as_mut_ptr()).collect();
        for &(j, c) in &plan.carried {
            pointers.push(self.carries[j][c].as_mut_ptr());
        }
        for &slot in &plan.own {
            pointers.push(self.buckets.send_ptr(slot));
        }
        pointers.extend(self.carries[k].iter_mut().map(AlignedBuffer::as_mut_ptr));
        // SAFETY: one buffer per parameter of the stage, each of its type's
        // size and 64-byte aligned (bucket slots too); its results (its
        // bucket's slots, its carried values) overlap nothing it reads.
        unsafe { kernel.call_raw(&pointers) }.map_err(runtime)
    }

    /// Runs the update on the summed gradients; its results trade places
    /// with its inputs.
    #[allow(unsafe_code)] // As `run_stage`.
    fn run_update(&mut self) -> Result<(), DriverError> {
        let l = self.layout;
        let nw = l.weights.len();
        let mut pointers: Vec<*mut u8> = Vec::new();
        for &w in &l.weights {
            pointers.push(self.params[w].as_mut_ptr());
        }
        for k in 0..nw {
            pointers.push(self.buckets.recv_ptr(self.slots[1 + k]));
        }
        pointers.extend(self.state.iter_mut().map(AlignedBuffer::as_mut_ptr));
        pointers.push(self.t.as_mut_ptr());
        if l.mixed {
            pointers.push(self.params[l.params].as_mut_ptr());
            pointers.push(self.good.as_mut_ptr());
        }
        pointers.extend(self.out.iter_mut().map(AlignedBuffer::as_mut_ptr));
        // SAFETY: as in `run_stage`: the update's inputs (weights, sums,
        // state, step) and its fresh results, one buffer each.
        unsafe { self.update.call_raw(&pointers) }.map_err(runtime)?;
        let mut out = self.out.iter_mut();
        for &w in &l.weights {
            std::mem::swap(
                &mut self.params[w],
                out.next().ok_or_else(|| usage("update"))?,
            );
        }
        for s in &mut self.state {
            std::mem::swap(s, out.next().ok_or_else(|| usage("update"))?);
        }
        if l.mixed {
            std::mem::swap(
                &mut self.params[l.params],
                out.next().ok_or_else(|| usage("update"))?,
            );
            std::mem::swap(&mut self.good, out.next().ok_or_else(|| usage("update"))?);
        }
        Ok(())
    }

    fn tensor(ty: &dlc_core::TensorType, b: &AlignedBuffer) -> Result<HostTensor, DriverError> {
        HostTensor::from_le_bytes(ty.clone(), b.bytes()).map_err(|e| usage(e.to_string()))
    }
}

impl Stepper for Staged<'_, '_> {
    fn write_data(
        &mut self,
        i: usize,
        values: impl Iterator<Item = f64>,
    ) -> Result<(), DriverError> {
        self.params[i] = batch(i, &self.types[i], values)?;
        Ok(())
    }

    fn step(&mut self, update: u64) -> Result<(f64, bool), DriverError> {
        let l = self.layout;
        let nw = l.weights.len();
        let ranks = self.world.size() as f32;
        self.t =
            AlignedBuffer::from_values(dlc_core::DType::I64, 1, std::iter::once(update as f64));
        let regions = self.buckets.regions();
        let started = Instant::now();
        let world = self.world;
        let (computed, in_mpi, waited) = distributed::reduce_as_ready(world, &regions, |ready| {
            for k in 0..self.stages.len() {
                self.run_stage(k)?;
                ready(k);
            }
            Ok::<_, DriverError>(started.elapsed())
        })?;
        // The stages' time, without what the all-reduces took within it.
        let computed = computed?.saturating_sub(in_mpi);
        // The buffers' new values (running averages): their mean.
        for (j, &b) in l.buffers.iter().enumerate() {
            let sums = self.buckets.sum(self.slots[1 + nw + j]);
            let to = bytemuck::cast_slice_mut::<u8, f32>(self.params[b].bytes_mut());
            for (t, &s) in to.iter_mut().zip(sums) {
                *t = s / ranks;
            }
        }
        let loss = self.buckets.sum(self.slots[0])[0] as f64 / ranks as f64;
        let updating = Instant::now();
        self.run_update()?;
        // With mixed precision the last result is whether the update was
        // made.
        let made = !l.mixed || self.out.last().is_some_and(|b| b.bytes()[0] != 0);
        let timing = &mut self.timing;
        timing.compute += computed + updating.elapsed();
        timing.reduce += in_mpi + waited;
        Ok((loss, made))
    }

    fn weight(&self, k: usize) -> Result<HostTensor, DriverError> {
        let w = self.layout.weights[k];
        Self::tensor(&self.types[w], &self.params[w])
    }

    fn state(&self, k: usize, s: usize) -> Result<HostTensor, DriverError> {
        let w = self.layout.weights[k];
        Self::tensor(&self.types[w], &self.state[k * self.layout.ns + s])
    }

    fn buffer(&self, j: usize) -> Result<HostTensor, DriverError> {
        let b = self.layout.buffers[j];
        Self::tensor(&self.types[b], &self.params[b])
    }

    fn scale(&self) -> Result<(f64, u64), DriverError> {
        let f32_ty = dlc_core::TensorType::scalar(dlc_core::DType::F32);
        let i64_ty = dlc_core::TensorType::scalar(dlc_core::DType::I64);
        let scale = Self::tensor(&f32_ty, &self.params[self.layout.params])?.data[0];
        let good = Self::tensor(&i64_ty, &self.good)?.data[0];
        Ok((scale, good as u64))
    }

    fn timing(&mut self) -> Option<Timing> {
        Some(Timing {
            buckets: self.buckets.count(),
            bytes: self.buckets.bytes(),
            ..std::mem::take(&mut self.timing)
        })
    }
}

/// The training loop: epochs of shuffled batches, checkpoints, logs.
struct Loop<'a> {
    args: &'a TrainArgs,
    plan: &'a Plan,
    /// The data sets, one per data parameter, and their rows.
    data: &'a [HostTensor],
    rows: usize,
    /// This rank's rows per step; the global batch is that times the ranks.
    batch: usize,
    steps: usize,
    total: usize,
    start: &'a Progress,
    setting: &'a Progress,
    world: Option<&'a World>,
}

impl Loop<'_> {
    /// Trains; the weights, then the buffers: what a model is evaluated
    /// with.
    fn run<S: Stepper>(&self, step: &mut S) -> Result<Vec<HostTensor>, DriverError> {
        let (args, plan) = (self.args, self.plan);
        let (rank, ranks) = self.world.map_or((0, 1), |w| (w.rank(), w.size()));
        let leads = rank == 0;
        let mixed = args.precision != Precision::F32;
        let (batch, global, steps) = (self.batch, self.batch * ranks, self.steps);
        let bar = progress(args, self.total).filter(|_| leads);
        let mut t = self.start.step;
        let mut update = self.start.update;
        let mut skipped_total = 0u64;
        let mut run_timing = Timing::default();
        if let Some(bar) = &bar {
            bar.set_position(t - 1);
        }
        let started = Instant::now();
        for epoch in self.start.epoch + 1..=args.epochs {
            let mut order: Vec<usize> = (0..self.rows).collect();
            order.shuffle(&mut dlc_runtime::seeded_rng(
                args.seed.wrapping_add(epoch as u64),
            ));
            let epoch_start = Instant::now();
            let mut total_loss = 0.0;
            let mut skipped = 0usize;
            for b in 0..steps {
                // This rank's share of the global batch.
                let picked = &order[b * global + rank * batch..b * global + (rank + 1) * batch];
                for ((i, _), tensor) in plan.data.iter().zip(self.data) {
                    let row: usize = tensor.ty.shape[1..].iter().product();
                    let values = picked
                        .iter()
                        .flat_map(|&r| tensor.data[r * row..(r + 1) * row].iter().copied());
                    step.write_data(*i, values)?;
                }
                let (loss, made) = step.step(update)?;
                if made {
                    update += 1;
                } else {
                    skipped += 1;
                }
                // A skipped update's loss may have overflowed the narrow
                // type; a made one's must be finite.
                if made && !loss.is_finite() {
                    return Err(usage(format!(
                        "the loss is {loss} at epoch {epoch}, step {t}: training diverged (a smaller --lr may help)"
                    )));
                }
                if loss.is_finite() {
                    total_loss += loss;
                }
                if let Some(bar) = &bar {
                    bar.set_position(t);
                    bar.set_message(format!("epoch {epoch}/{} loss {loss:.4}", args.epochs));
                }
                t += 1;
            }
            if let Some(dir) = args.checkpoint.as_ref().filter(|_| leads) {
                let mut tensors = Vec::new();
                for (k, &w) in plan.weights.iter().enumerate() {
                    let name = &plan.params[w].0;
                    tensors.push((format!("weight.{name}"), step.weight(k)?));
                    for (si, s) in plan.state.iter().enumerate() {
                        tensors.push((format!("state.{s}.{name}"), step.state(k, si)?));
                    }
                }
                for (j, &b) in plan.buffers.iter().enumerate() {
                    tensors.push((format!("buffer.{}", plan.params[b].0), step.buffer(j)?));
                }
                let (loss_scale, good) = if mixed {
                    step.scale()?
                } else {
                    (INITIAL_LOSS_SCALE, 0)
                };
                let progress = Progress {
                    epoch,
                    step: t,
                    update,
                    loss_scale,
                    good,
                    ..self.setting.clone()
                };
                write_checkpoint(dir, &tensors, &progress)?;
            }
            // The mean over the steps whose loss is finite.
            let mean = total_loss / (steps - skipped).max(1) as f64;
            let rate = steps as f64 / epoch_start.elapsed().as_secs_f64().max(1e-9);
            skipped_total += skipped as u64;
            let scale = if mixed { Some(step.scale()?.0) } else { None };
            let timing = step.timing();
            if let Some(tm) = &timing {
                run_timing.compute += tm.compute;
                run_timing.reduce += tm.reduce;
                (run_timing.buckets, run_timing.bytes, run_timing.on_device) =
                    (tm.buckets, tm.bytes, tm.on_device);
            }
            if !leads {
                continue;
            }
            if args.json {
                let mut line = serde_json::json!({"epoch": epoch, "steps": t - 1, "loss": mean, "steps_per_s": rate});
                if let Some(scale) = scale {
                    line["updates"] = serde_json::json!(update - 1);
                    line["skipped"] = serde_json::json!(skipped);
                    line["loss_scale"] = serde_json::json!(scale);
                }
                if let Some(tm) = &timing {
                    line["ranks"] = serde_json::json!(ranks);
                    line["compute_s"] = serde_json::json!(tm.compute.as_secs_f64());
                    // Sums on the device run beside the kernels, untimed.
                    if tm.on_device.is_none() {
                        line["allreduce_s"] = serde_json::json!(tm.reduce.as_secs_f64());
                    }
                    line["allreduce_bytes"] = serde_json::json!(tm.bytes);
                    line["buckets"] = serde_json::json!(tm.buckets);
                }
                dlc_cli::outln!("{line}");
            } else {
                let extra = scale
                    .map(|s| format!(", {skipped} skipped, loss scale {s}"))
                    .unwrap_or_default();
                let text = format!(
                    "epoch {epoch}/{}: loss {mean:.6} ({steps} steps, {rate:.1} steps/s{extra})",
                    args.epochs
                );
                match &bar {
                    Some(bar) => bar.println(text),
                    None => dlc_cli::outln!("{text}"),
                }
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        if let Some(world) = self.world {
            // The ranks applied the same updates to the same sums: their
            // weights, state and buffers must agree bit for bit.
            let mut held = Vec::new();
            for k in 0..plan.weights.len() {
                held.push(step.weight(k)?);
                for s in 0..plan.state.len() {
                    held.push(step.state(k, s)?);
                }
            }
            for j in 0..plan.buffers.len() {
                held.push(step.buffer(j)?);
            }
            let bytes: Vec<Vec<u8>> = held.iter().map(HostTensor::to_le_bytes).collect();
            let parts: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
            let differing = world.differing(distributed::digest(&parts));
            if !differing.is_empty() {
                return Err(usage(format!(
                    "after training, the weights of rank(s) {differing:?} differ from rank 0's"
                )));
            }
        }
        if leads && !args.json {
            dlc_cli::outln!(
                "trained {} step(s) of {global} in {:.2} s{}",
                t - self.start.step,
                started.elapsed().as_secs_f64(),
                if mixed {
                    format!(" ({skipped_total} update(s) skipped on overflow)")
                } else {
                    String::new()
                }
            );
            if let (Some(_), Some(by)) = (self.world, run_timing.on_device) {
                dlc_cli::outln!(
                    "data-parallel on {ranks} rank(s) of {batch}: {} bucket(s) of gradients, {} KiB a step, each summed on the GPU by {by} as the stage computing it is launched, beside the later stages; {:.3} s in steps; the weights are identical on every rank",
                    run_timing.buckets,
                    run_timing.bytes / 1024,
                    run_timing.compute.as_secs_f64(),
                );
            } else if self.world.is_some() {
                let (c, r) = (
                    run_timing.compute.as_secs_f64(),
                    run_timing.reduce.as_secs_f64(),
                );
                dlc_cli::outln!(
                    "data-parallel on {ranks} rank(s) of {batch}: {} bucket(s) of gradients, {} KiB a step, each summed as the stage computing it ends; {r:.3} s in MPI ({:.1}% of the steps), {c:.3} s computing; the weights are identical on every rank",
                    run_timing.buckets,
                    run_timing.bytes / 1024,
                    100.0 * r / (r + c).max(1e-12),
                );
            }
        }
        plan.weights
            .iter()
            .enumerate()
            .map(|(k, _)| step.weight(k))
            .chain((0..plan.buffers.len()).map(|j| step.buffer(j)))
            .collect()
    }
}

fn progress(args: &TrainArgs, total: usize) -> Option<indicatif::ProgressBar> {
    if args.json || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total as u64);
    let style =
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps {per_sec} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    Some(bar)
}

/// What a checkpoint holds besides its tensors: where the run stands and
/// what must not change for it to go on as if never stopped.
#[derive(Debug, Clone, PartialEq)]
struct Progress {
    /// Epochs done.
    epoch: usize,
    /// The number of the next step (1 for the first).
    step: u64,
    /// The number of the next optimizer update: the step's unless mixed
    /// precision skipped some.
    update: u64,
    /// The loss scale and the updates since it last changed (mixed
    /// precision).
    loss_scale: f64,
    good: u64,
    seed: u64,
    optimizer: String,
    epochs: usize,
    lr: String,
    /// Rows a step: the loss's batch times the ranks.
    batch: usize,
}

impl Progress {
    /// A new run's first step, with its settings: the optimizer's (and
    /// the precision, when mixed) and the global batch.
    fn first(args: &TrainArgs, batch: usize) -> Progress {
        Progress {
            epoch: 0,
            step: 1,
            update: 1,
            loss_scale: INITIAL_LOSS_SCALE,
            good: 0,
            seed: args.seed,
            optimizer: format!(
                "{:?} momentum={:?} nesterov={} weight_decay={:?} schedule={:?}{}",
                args.optimizer,
                args.momentum,
                args.nesterov,
                args.weight_decay,
                args.schedule,
                if args.precision != Precision::F32 {
                    format!(" precision={:?}", args.precision)
                } else {
                    String::new()
                }
            ),
            epochs: args.epochs,
            lr: format!("{:?}", args.lr),
            batch,
        }
    }
}

const CHECKPOINT: &str = "checkpoint.safetensors";

/// Writes `DIR/checkpoint.safetensors` atomically: a temporary file in the
/// directory, flushed, then renamed over the old checkpoint, so a run
/// killed while writing leaves the previous one whole.
fn write_checkpoint(
    dir: &Path,
    tensors: &[(String, HostTensor)],
    progress: &Progress,
) -> Result<(), DriverError> {
    let meta: std::collections::HashMap<String, String> = [
        ("format", "dlc-train-1".to_string()),
        ("epoch", progress.epoch.to_string()),
        ("step", progress.step.to_string()),
        ("update", progress.update.to_string()),
        ("loss_scale", format!("{:?}", progress.loss_scale)),
        ("good_steps", progress.good.to_string()),
        ("seed", progress.seed.to_string()),
        ("optimizer", progress.optimizer.clone()),
        ("epochs", progress.epochs.to_string()),
        ("lr", progress.lr.clone()),
        ("batch", progress.batch.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    std::fs::create_dir_all(dir).map_err(|source| DriverError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    dlc_driver::write_safetensors(&dir.join(CHECKPOINT), tensors, meta)
}

/// Reads `DIR/checkpoint.safetensors`: its tensors by name, and its progress.
fn read_checkpoint(dir: &Path) -> Result<(Vec<(String, HostTensor)>, Progress), DriverError> {
    let path = dir.join(CHECKPOINT);
    let bad = |m: String| usage(format!("--resume {}: {m}", path.display()));
    let file = dlc_driver::read_safetensors(&path).map_err(|e| usage(format!("--resume: {e}")))?;
    let meta = file.metadata;
    let get = |k: &str| {
        meta.get(k).cloned().ok_or_else(|| {
            bad(format!(
                "no `{k}` in its metadata: not a dlc training checkpoint"
            ))
        })
    };
    if get("format")? != "dlc-train-1" {
        return Err(bad("an unknown checkpoint format".into()));
    }
    let num = |k: &str| -> Result<u64, DriverError> {
        get(k)?
            .parse()
            .map_err(|_| bad(format!("`{k}` is not a number")))
    };
    let step = num("step")?;
    // Checkpoints of runs before mixed precision have no updates of their
    // own: each step was one.
    let or = |k: &str, default: String| meta.get(k).cloned().unwrap_or(default);
    let progress = Progress {
        epoch: num("epoch")? as usize,
        step,
        update: or("update", step.to_string())
            .parse()
            .map_err(|_| bad("`update` is not a number".into()))?,
        loss_scale: or("loss_scale", format!("{INITIAL_LOSS_SCALE:?}"))
            .parse()
            .map_err(|_| bad("`loss_scale` is not a number".into()))?,
        good: or("good_steps", "0".into())
            .parse()
            .map_err(|_| bad("`good_steps` is not a number".into()))?,
        seed: num("seed")?,
        optimizer: get("optimizer")?,
        epochs: num("epochs")? as usize,
        lr: get("lr")?,
        batch: or("batch", "0".into())
            .parse()
            .map_err(|_| bad("`batch` is not a number".into()))?,
    };
    Ok((file.tensors, progress))
}
