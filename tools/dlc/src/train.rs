//! `dlc train`: trains the weights of a loss function on a data set.
//!
//! The training step is a program of the language, generated here around
//! the user's loss: `value_and_grad` of the loss with respect to its
//! weights, the optimizer's update of each weight (the built-ins `sgd`,
//! `sgd_momentum`, `adam`, `adamw`) at the learning rate of the schedule (a
//! built-in too), returning the loss, the new weights and the new state.
//! It is compiled once for this CPU and called once per batch on one bound
//! call whose weight and state inputs are its previous results (the buffers
//! trade places: nothing of the model is copied between steps).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use dlc_driver::{
    DEFAULT_PIPELINE, DriverError, PassOptions, SourceText, compile_source, read_model, run_passes,
};
use dlc_runtime::HostTensor;
use rand::seq::SliceRandom;

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

/// The training step's source: the user's program and `__train_step`.
fn step_source(plan: &Plan, args: &TrainArgs, total_steps: usize) -> Result<String, DriverError> {
    let ty = |i: usize| plan.params[i].1.to_string();
    let name = |i: usize| plan.params[i].0.clone();
    let mut params: Vec<String> = plan
        .params
        .iter()
        .map(|(n, t)| format!("{n}: {t}"))
        .collect();
    for &w in &plan.weights {
        for s in &plan.state {
            params.push(format!("__{s}_{}: {}", name(w), ty(w)));
        }
    }
    params.push("t: i64".into());
    let mixed = match args.precision {
        Precision::F32 => None,
        Precision::Bf16 => Some("bf16"),
        Precision::F16 => Some("f16"),
    };
    if mixed.is_some() {
        params.push("__scale: f32".into());
        params.push("__good: i64".into());
    }
    // The loss (an f32 scalar: `train` checks), the weights, the state,
    // the buffers; with mixed precision the new loss scale, the updates
    // since it changed and whether this update was made.
    let mut results = vec!["f32".to_string()];
    results.extend(plan.weights.iter().map(|&w| ty(w)));
    for &w in &plan.weights {
        results.extend(plan.state.iter().map(|_| ty(w)));
    }
    results.extend(plan.buffers.iter().map(|&b| ty(b)));
    if mixed.is_some() {
        results.extend(["f32".into(), "i64".into(), "bool".into()]);
    }
    let aux: Vec<String> = plan
        .buffers
        .iter()
        .map(|&b| format!("__new_{}", name(b)))
        .collect();
    let call_args: Vec<String> = plan.params.iter().map(|(n, _)| n.clone()).collect();
    let wrt: Vec<String> = plan.weights.iter().map(|&w| name(w)).collect();
    let grads: Vec<String> = wrt.iter().map(|w| format!("__g_{w}")).collect();
    let mut body = vec![format!(
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
    )];
    if mixed.is_some() {
        // The scaled gradients: all finite, or this update is skipped.
        body.push(format!(
            "    let __finite = all_finite({});",
            grads.join(", ")
        ));
        for g in &grads {
            body.push(format!("    let {g} = {g} / __scale;"));
        }
    }
    body.push(format!(
        "    let __lr = {};",
        schedule_expr(args.schedule.as_deref(), args.lr, total_steps)?
    ));
    let wd = args
        .weight_decay
        .map(|w| format!(", weight_decay={w:?}"))
        .unwrap_or_default();
    let mut new_w = Vec::new();
    let mut new_s = Vec::new();
    for w in &wrt {
        let g = format!("__g_{w}");
        let (lhs, call) = match args.optimizer {
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
        };
        body.push(format!("    let {lhs} = {call};"));
        new_w.push(format!("__new_{w}"));
        new_s.extend(plan.state.iter().map(|s| format!("__new_{s}_{w}")));
    }
    let mut ret = vec!["__loss".to_string()];
    if mixed.is_some() {
        // A skipped update leaves the weights and the state as they were.
        let kept = |new: &str, old: String| format!("where(__finite, {new}, {old})");
        ret.extend(new_w.iter().zip(&wrt).map(|(n, w)| kept(n, w.clone())));
        for w in &wrt {
            for st in &plan.state {
                ret.push(kept(&format!("__new_{st}_{w}"), format!("__{st}_{w}")));
            }
        }
        body.push(
            "    let (__new_scale, __new_good) = loss_scale_update(__scale, __good, __finite);"
                .into(),
        );
        ret.extend(aux);
        ret.extend(["__new_scale".into(), "__new_good".into(), "__finite".into()]);
    } else {
        ret.extend(new_w);
        ret.extend(new_s);
        ret.extend(aux);
    }
    Ok(format!(
        "\n\nfn __train_step({}) -> ({}) {{\n{}\n    return ({});\n}}\n",
        params.join(", "),
        results.join(", "),
        body.join("\n"),
        ret.join(", ")
    ))
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
    let src = read_model(&args.file, &dlc_onnx::Options::default())?;
    let module = compile_source(&src)?;
    let f = dlc_driver::select_entry(&module, args.entry.as_deref())?.clone();
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
        let (name, _) = &params[buffers.first().copied().unwrap_or(0)];
        return Err(usage(match buffers.first() {
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
        }));
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
    // The data: each file's rows are the parameter's batch rows.
    let mut tensors = Vec::new();
    let mut rows: Option<(usize, String)> = None;
    for (i, path) in &data {
        let (name, ty) = &params[*i];
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
    let n = rows.map_or(0, |r| r.0);
    let batch = params[data[0].0].1.shape[0];
    if let Some(&(i, _)) = data.iter().find(|(i, _)| params[*i].1.shape[0] != batch) {
        return Err(usage(format!(
            "data parameters must share their leading extent (the batch): `{}` has {}, `{}` has {batch}",
            params[i].0, params[i].1.shape[0], params[data[0].0].0
        )));
    }
    let steps = n / batch;
    if steps == 0 {
        return Err(usage(format!(
            "the data set has {n} rows, fewer than one batch of {batch}"
        )));
    }
    let state: Vec<&'static str> = match args.optimizer {
        Optimizer::Sgd if args.momentum.is_some() || args.nesterov => vec!["buf"],
        Optimizer::Sgd => vec![],
        Optimizer::Adam | Optimizer::Adamw => vec!["m", "v"],
    };
    let plan = Plan {
        loss: f.name.clone(),
        params,
        weights,
        data,
        state,
        buffers,
    };
    // The step, compiled.
    let total = steps * args.epochs;
    let text = format!("{}{}", src.text, step_source(&plan, args, total)?);
    let mut step_module = compile_source(&SourceText {
        name: src.name.clone(),
        text,
    })?;
    run_passes(&mut step_module, DEFAULT_PIPELINE, PassOptions::default())?;
    let step_module = dlc_driver::only_entry(&step_module, Some("__train_step"))?;
    let lowered = dlc_driver::lower_for_cpu(&step_module)?;
    let nw = plan.weights.len();
    let ns = plan.state.len();
    let mixed = args.precision != Precision::F32;
    let setting = Progress {
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
            if mixed {
                format!(" precision={:?}", args.precision)
            } else {
                String::new()
            }
        ),
        epochs: args.epochs,
        lr: format!("{:?}", args.lr),
    };
    let source = args
        .weights
        .as_deref()
        .map(dlc_driver::WeightSource::open)
        .transpose()?;
    let (init, state0, buffers0, start) = match &args.resume {
        None => (
            initial_weights(&f, &plan, source.as_ref(), args.seed)?,
            None,
            initial_buffers(&plan, source.as_ref())?,
            setting.clone(),
        ),
        Some(dir) => {
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
            // A cosine schedule spans the whole run; any other lets a run
            // go on for more epochs than it first meant to.
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
            let take =
                |key: String, ty: &dlc_core::TensorType| -> Result<HostTensor, DriverError> {
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
            (weights, Some(state), buffers, progress)
        }
    };
    let result = dlc_llvm::jit_with(&lowered, &dlc_llvm::JitOptions::default(), |jit| {
        let kernel = jit.kernel("__train_step")?;
        let run = || -> Result<Vec<HostTensor>, DriverError> {
            let mut binder = kernel.binder();
            let err = |e: dlc_runtime::RuntimeError| usage(e.to_string());
            // Inputs in the step's order: the loss's parameters (data as
            // zeros until the first batch), the state, the step number.
            let mut w_iter = init.iter();
            let mut b_iter = buffers0.iter();
            for (i, (_, ty)) in plan.params.iter().enumerate() {
                if plan.weights.contains(&i) {
                    binder.push(w_iter.next().ok_or_else(|| usage("weights"))?).map_err(err)?;
                } else if plan.buffers.contains(&i) {
                    binder.push(b_iter.next().ok_or_else(|| usage("buffers"))?).map_err(err)?;
                } else {
                    binder.push_values(ty, std::iter::repeat(0.0)).map_err(err)?;
                }
            }
            let mut resumed = state0.iter().flatten();
            for &w in &plan.weights {
                for _ in 0..ns {
                    match resumed.next() {
                        Some(t) => binder.push(t).map_err(err)?,
                        None => binder
                            .push_values(&plan.params[w].1, std::iter::repeat(0.0))
                            .map_err(err)?,
                    }
                }
            }
            let t_ty = dlc_core::TensorType::scalar(dlc_core::DType::I64);
            binder.push_values(&t_ty, std::iter::once(1.0)).map_err(err)?;
            if mixed {
                let f32_ty = dlc_core::TensorType::scalar(dlc_core::DType::F32);
                binder.push_values(&f32_ty, std::iter::once(start.loss_scale)).map_err(err)?;
                binder.push_values(&t_ty, std::iter::once(start.good as f64)).map_err(err)?;
            }
            let mut call = binder.finish().map_err(err)?;
            let t_input = plan.params.len() + nw * ns;
            // With mixed precision: the loss scale, the updates since it
            // changed (inputs after `t`), their new values and whether the
            // update was made (results after the buffers).
            let (scale_input, good_input) = (t_input + 1, t_input + 2);
            let scale_result = 1 + nw + nw * ns + plan.buffers.len();
            // State input of weight k, tensor s.
            let state_input = |k: usize, s: usize| plan.params.len() + k * ns + s;
            let bar = progress(args, total);
            let mut t = start.step;
            let mut update = start.update;
            let mut skipped_total = 0u64;
            if let Some(bar) = &bar {
                bar.set_position(t - 1);
            }
            let started = Instant::now();
            for epoch in start.epoch + 1..=args.epochs {
                let mut order: Vec<usize> = (0..n).collect();
                order.shuffle(&mut dlc_runtime::seeded_rng(args.seed.wrapping_add(epoch as u64)));
                let epoch_start = Instant::now();
                let mut total_loss = 0.0;
                let mut skipped = 0usize;
                for b in 0..steps {
                    let picked = &order[b * batch..(b + 1) * batch];
                    for ((i, _), tensor) in plan.data.iter().zip(&tensors) {
                        let row: usize = tensor.ty.shape[1..].iter().product();
                        let values = picked
                            .iter()
                            .flat_map(|&r| tensor.data[r * row..(r + 1) * row].iter().copied());
                        call.write_input(*i, values).map_err(err)?;
                    }
                    call.write_input(t_input, std::iter::once(update as f64)).map_err(err)?;
                    call.run().map_err(err)?;
                    let loss = call.output(0).map_err(err)?.data[0];
                    let made = !mixed || call.output(scale_result + 2).map_err(err)?.data[0] != 0.0;
                    if mixed {
                        call.swap_result_into_input(scale_result, scale_input).map_err(err)?;
                        call.swap_result_into_input(scale_result + 1, good_input).map_err(err)?;
                    }
                    if made {
                        update += 1;
                    } else {
                        skipped += 1;
                    }
                    // A skipped update's loss may have overflowed the narrow
                    // type; a made one's must be finite.
                    if made && !loss.is_finite() {
                        return Err(usage(format!("the loss is {loss} at epoch {epoch}, step {t}: training diverged (a smaller --lr may help)")));
                    }
                    if loss.is_finite() {
                        total_loss += loss;
                    }
                    for (k, &w) in plan.weights.iter().enumerate() {
                        call.swap_result_into_input(1 + k, w).map_err(err)?;
                        for s in 0..ns {
                            call.swap_result_into_input(1 + nw + k * ns + s, state_input(k, s)).map_err(err)?;
                        }
                    }
                    for (j, &b) in plan.buffers.iter().enumerate() {
                        call.swap_result_into_input(1 + nw + nw * ns + j, b).map_err(err)?;
                    }
                    if let Some(bar) = &bar {
                        bar.set_position(t);
                        bar.set_message(format!("epoch {epoch}/{} loss {loss:.4}", args.epochs));
                    }
                    t += 1;
                }
                if let Some(dir) = &args.checkpoint {
                    let mut tensors = Vec::new();
                    for (k, &w) in plan.weights.iter().enumerate() {
                        let name = &plan.params[w].0;
                        tensors.push((format!("weight.{name}"), call.input(w).map_err(err)?));
                        for (si, s) in plan.state.iter().enumerate() {
                            tensors.push((format!("state.{s}.{name}"), call.input(state_input(k, si)).map_err(err)?));
                        }
                    }
                    for &b in &plan.buffers {
                        tensors.push((format!("buffer.{}", plan.params[b].0), call.input(b).map_err(err)?));
                    }
                    let progress = Progress {
                        epoch,
                        step: t,
                        update,
                        loss_scale: if mixed { call.input(scale_input).map_err(err)?.data[0] } else { INITIAL_LOSS_SCALE },
                        good: if mixed { call.input(good_input).map_err(err)?.data[0] as u64 } else { 0 },
                        ..setting.clone()
                    };
                    write_checkpoint(dir, &tensors, &progress)?;
                }
                // The mean over the steps whose loss is finite.
                let mean = total_loss / (steps - skipped).max(1) as f64;
                let rate = steps as f64 / epoch_start.elapsed().as_secs_f64().max(1e-9);
                skipped_total += skipped as u64;
                let scale = if mixed { Some(call.input(scale_input).map_err(err)?.data[0]) } else { None };
                if args.json {
                    let mut line = serde_json::json!({"epoch": epoch, "steps": t - 1, "loss": mean, "steps_per_s": rate});
                    if let Some(scale) = scale {
                        line["updates"] = serde_json::json!(update - 1);
                        line["skipped"] = serde_json::json!(skipped);
                        line["loss_scale"] = serde_json::json!(scale);
                    }
                    dlc_cli::outln!("{line}");
                } else {
                    let extra = scale.map(|s| format!(", {skipped} skipped, loss scale {s}")).unwrap_or_default();
                    let text = format!("epoch {epoch}/{}: loss {mean:.6} ({steps} steps, {rate:.1} steps/s{extra})", args.epochs);
                    match &bar {
                        Some(bar) => bar.println(text),
                        None => dlc_cli::outln!("{text}"),
                    }
                }
            }
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            if !args.json {
                dlc_cli::outln!(
                    "trained {} step(s) of {batch} in {:.2} s{}",
                    t - start.step,
                    started.elapsed().as_secs_f64(),
                    if mixed {
                        format!(" ({skipped_total} update(s) skipped on overflow)")
                    } else {
                        String::new()
                    }
                );
            }
            // The weights, then the buffers: what a model is evaluated with.
            plan.weights
                .iter()
                .chain(&plan.buffers)
                .map(|&w| call.input(w).map_err(err))
                .collect()
        };
        Ok(run())
    })
    .map_err(|e| usage(e.to_string()))?;
    let trained = result?;
    if let Some(path) = &args.save_weights {
        let names = plan
            .weights
            .iter()
            .chain(&plan.buffers)
            .map(|&w| plan.params[w].0.clone());
        if save_file.is_some() {
            let named: Vec<(String, HostTensor)> = names.zip(trained).collect();
            dlc_driver::write_safetensors(path, &named, Default::default())?;
            dlc_cli::outln!("wrote {}", path.display());
        } else {
            let named: Vec<(String, &HostTensor)> = names.zip(&trained).collect();
            for path in dlc_driver::save_named_outputs(path, &named)? {
                dlc_cli::outln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
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
    };
    Ok((file.tensors, progress))
}
