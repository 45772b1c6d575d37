//! `dlc train --data-parallel` and `--ranks N`: ranks started by Open MPI's
//! `mpirun` on this machine (as root in CI: the two variables Open MPI asks
//! for are set here, for these runs only).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Dir, dlc_with_env, fails_with, stderr};
use dlc_core::{DType, TensorType};

/// What Open MPI needs to start ranks as root.
const AS_ROOT: [(&str, &str); 2] = [
    ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
    ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
];

fn dlc(args: &[&str]) -> Output {
    dlc_with_env(&AS_ROOT, args)
}

/// Whether `mpirun` is here; without it a test is skipped with a printed
/// reason, except in CI, where `make setup` installs it and its absence
/// fails the test.
fn have_mpirun() -> bool {
    let found = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "mpirun is missing: `make setup` installs Open MPI"
        );
        eprintln!("skipped: no mpirun (make setup installs Open MPI)");
    }
    found
}

/// A two-layer regression of `B` rows a step, its loss the batch's mean.
fn model(d: &Dir, batch: usize) -> String {
    d.file(
        &format!("mlp{batch}.dl"),
        format!(
            "fn loss(x: f32[{batch}, 4], y: f32[{batch}, 2], weight w1: f32[4, 8], weight b1: f32[8],
                     weight w2: f32[8, 2]) -> f32 {{
                 let p = tanh(x @ w1 + b1) @ w2;
                 return mean((p - y) * (p - y));
             }}
             fn loss64(x: f32[{batch}, 4], weight w: f64[4, 2]) -> f32 {{
                 return cast(mean(cast(x, f64) @ w), f32);
             }}
             fn loss_bn(x: f32[{batch}, 4], weight w: f32[4, 3], weight gamma: f32[3], weight beta: f32[3],
                        mean: f32[3], var: f32[3]) -> (f32, f32[3], f32[3]) {{
                 let (h, m, v) = batchnorm_train(x @ w, gamma, beta, mean, var);
                 return (mean(h * h), m, v);
             }}"
        ),
    )
}

/// The data set: `rows` rows of x and y.
fn data(d: &Dir, rows: usize) -> (String, String) {
    let x: Vec<f64> = (0..rows * 4)
        .map(|i| ((i * 37 % 23) as f64 - 11.0) / 8.0)
        .collect();
    let y: Vec<f64> = (0..rows * 2)
        .map(|i| ((i * 11 % 7) as f64 - 3.0) / 4.0)
        .collect();
    (
        format!(
            "x={}",
            d.npy(
                &format!("x{rows}.npy"),
                TensorType::new(DType::F32, vec![rows, 4]),
                &x
            )
        ),
        format!(
            "y={}",
            d.npy(
                &format!("y{rows}.npy"),
                TensorType::new(DType::F32, vec![rows, 2]),
                &y
            )
        ),
    )
}

/// The checkpoint's weights after a run.
fn weights(dir: &str) -> Vec<(String, Vec<f64>)> {
    let file =
        dlc_driver::read_safetensors(&std::path::Path::new(dir).join("checkpoint.safetensors"))
            .unwrap();
    let mut w: Vec<(String, Vec<f64>)> = file
        .tensors
        .into_iter()
        .filter(|(n, _)| n.starts_with("weight."))
        .map(|(n, t)| (n, t.data))
        .collect();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

/// N ranks of B/N rows reach the weights one process with B rows reaches,
/// after every step (a step an epoch here, each resumed from the last's
/// checkpoint, which rank 0 writes), within f32's differences of summation
/// order; and every rank ends with the same weights (the run checks).
#[test]
fn ranks_sharing_a_batch_step_as_one_process_with_all_of_it() {
    if !have_mpirun() {
        return;
    }
    let d = Dir::new("dp-equal");
    let global = 6;
    let (x, y) = data(&d, global);
    // SGD with momentum and weight decay: state as well as weights, and an
    // update linear in the gradient (Adam's would hide a wrong scale).
    let run = |batch: usize, (x, y): (&str, &str), extra: &[&str], epochs: usize, ck: &str| {
        let m = model(&d, batch);
        let e = epochs.to_string();
        let mut args = vec![
            "train",
            m.as_str(),
            "--entry",
            "loss",
            "--data",
            x,
            "--data",
            y,
            "--optimizer",
            "sgd",
            "--momentum",
            "0.9",
            "--lr",
            "0.05",
            "--weight-decay",
            "0.01",
            "--epochs",
            e.as_str(),
            "--checkpoint",
            ck,
        ];
        if epochs > 1 {
            args.extend(["--resume", ck]);
        }
        args.extend_from_slice(extra);
        (dlc(&args), format!("{args:?}"))
    };
    let train = |batch: usize, extra: &[&str], epochs: usize, ck: &str| {
        let (o, args) = run(batch, (&x, &y), extra, epochs, ck);
        assert!(o.status.success(), "{args}: {}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let alone = d.path("alone");
    let mut reference = Vec::new();
    for epoch in 1..=3 {
        train(global, &[], epoch, &alone);
        reference.push(weights(&alone));
    }
    for (ranks, how) in [(1, "--data-parallel"), (2, "--ranks"), (3, "--ranks")] {
        let ck = d.path(&format!("ranks{ranks}"));
        let n = ranks.to_string();
        // Two and three ranks with buckets of 104 bytes: the gradient runs
        // in three stages, each bucket summed as its stage ends.
        let extra: Vec<&str> = match how {
            "--ranks" => vec!["--ranks", &n, "--bucket-mb", "0.0001"],
            _ => vec![how],
        };
        for (epoch, expected) in (1..=3).zip(&reference) {
            let out = train(global / ranks, &extra, epoch, &ck);
            // Rank 0 alone logs: one line for the epoch, and the check
            // that the ranks' weights agree bit for bit.
            assert_eq!(
                out.matches(&format!("epoch {epoch}/{epoch}")).count(),
                1,
                "{out}"
            );
            // One bucket with the default size; with 104-byte buckets, the
            // loss, w2's and b1's gradients, w1's.
            let buckets = if ranks == 1 { 1 } else { 3 };
            assert!(
                out.contains(&format!(
                    "data-parallel on {ranks} rank(s) of {}: {buckets} bucket(s)",
                    global / ranks
                )) && out.contains("the weights are identical on every rank"),
                "{out}"
            );
            let got = weights(&ck);
            assert_eq!(got.len(), expected.len());
            for ((name, a), (_, b)) in got.iter().zip(expected) {
                let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                let worst = a
                    .iter()
                    .zip(b)
                    .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    worst <= 1e-6 * scale,
                    "{ranks} rank(s), after step {epoch}: {name} differs by {worst} (largest {scale})"
                );
            }
        }
    }
    // A checkpoint of 2 ranks of 3 rows goes on only with 6 rows a step.
    let (x18, y18) = data(&d, 18);
    fails_with(
        &run(3, (&x18, &y18), &["--ranks", "3"], 4, &d.path("ranks2")).0,
        "the checkpoint was written with a global batch of 6, this run has 9",
    );
}

/// Mixed precision (the loss scale's overflow check on the summed
/// gradients, the same on every rank) and buffers (running averages, the
/// ranks' mean, in the first of several buckets) train data-parallel.
#[test]
fn ranks_train_in_mixed_precision_and_with_buffers() {
    if !have_mpirun() {
        return;
    }
    let d = Dir::new("dp-mixed");
    let (x, y) = data(&d, 12);
    let m = model(&d, 3);
    let o = dlc(&[
        "train",
        &m,
        "--entry",
        "loss",
        "--data",
        &x,
        "--data",
        &y,
        "--precision",
        "bf16",
        "--optimizer",
        "adam",
        "--epochs",
        "2",
        "--ranks",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    for l in &lines {
        assert_eq!(l["ranks"], 2);
        assert_eq!(l["steps_per_s"].as_f64().map(f64::is_finite), Some(true));
        assert!(l["loss_scale"].as_f64().is_some() && l["allreduce_bytes"].as_u64() > Some(0));
    }
    let saved = d.path("bn");
    let o = dlc(&[
        "train",
        &m,
        "--entry",
        "loss_bn",
        "--data",
        &x,
        "--epochs",
        "1",
        "--ranks",
        "2",
        "--bucket-mb",
        "0.0001",
        "--save-weights",
        &saved,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for b in ["w", "mean", "var"] {
        assert!(
            std::path::Path::new(&saved)
                .join(format!("{b}.npy"))
                .is_file()
        );
    }
}

/// The step on a GPU: on the emulator (no GPU needed), the fused step and
/// the data-parallel stages (a world of one, buckets small enough for three
/// stages) reach the CPU's weights within f32's differences, in f32 with
/// momentum and in bf16 with Adam and running averages; on a GPU, where
/// there is one, the same, the data-parallel gradients summed by NCCL;
/// without one, a one-line error saying so.
#[test]
fn the_gpu_trains_as_the_cpu_does() {
    if !have_mpirun() {
        return;
    }
    let d = Dir::new("gpu-train");
    let (x, y) = data(&d, 12);
    let m = model(&d, 6);
    let run = |entry: &str, extra: &[&str], ck: &str| {
        let mut args = vec![
            "train",
            &m,
            "--entry",
            entry,
            "--data",
            &x,
            "--epochs",
            "1",
            "--checkpoint",
            ck,
        ];
        if entry == "loss" {
            args.extend([
                "--data",
                &y,
                "--optimizer",
                "sgd",
                "--momentum",
                "0.9",
                "--weight-decay",
                "0.01",
                "--lr",
                "0.05",
            ]);
        } else {
            args.extend(["--optimizer", "adam", "--precision", "bf16"]);
        }
        args.extend_from_slice(extra);
        dlc(&args)
    };
    let close = |got: &[(String, Vec<f64>)], expected: &[(String, Vec<f64>)], what: &str| {
        assert_eq!(got.len(), expected.len(), "{what}");
        for ((name, a), (_, b)) in got.iter().zip(expected) {
            let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let worst = a
                .iter()
                .zip(b)
                .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= 1e-5 * scale.max(1.0),
                "{what}: {name} differs from the CPU's by {worst} (largest {scale})"
            );
        }
    };
    let staged = ["--data-parallel", "--bucket-mb", "0.0001"];
    for entry in ["loss", "loss_bn"] {
        let cpu = d.path(&format!("{entry}-cpu"));
        let o = run(entry, &[], &cpu);
        assert!(o.status.success(), "{}", stderr(&o));
        let expected = weights(&cpu);
        for (name, extra) in [
            ("emulated", vec!["--backend", "gpu-emulator"]),
            (
                "emulated, data-parallel",
                [&["--backend", "gpu-emulator"][..], &staged].concat(),
            ),
        ] {
            let ck = d.path(&format!("{entry}-{}", name.replace(", ", "-")));
            let o = run(entry, &extra, &ck);
            assert!(o.status.success(), "{name}: {}", stderr(&o));
            close(&weights(&ck), &expected, &format!("{entry}, {name}"));
            if extra.contains(&"--data-parallel") {
                let out = String::from_utf8_lossy(&o.stdout);
                assert!(
                    out.contains("data-parallel on 1 rank(s) of 6: ")
                        && out.contains("summed on the GPU by nothing (a world of one)"),
                    "{out}"
                );
            }
        }
        for (name, extra) in [
            ("on the GPU", vec!["--backend", "gpu"]),
            (
                "on the GPU, data-parallel",
                [&["--backend", "gpu"][..], &staged].concat(),
            ),
        ] {
            let ck = d.path(&format!("{entry}-{}", name.replace([',', ' '], "-")));
            let o = run(entry, &extra, &ck);
            let err = stderr(&o);
            let missing = ["no CUDA driver found", "no CUDA device", "NCCL's library"];
            if missing.iter().any(|m| err.contains(m)) {
                println!("{name}: not run here: {}", err.trim());
                assert_eq!(o.status.code(), Some(1));
                continue;
            }
            assert!(o.status.success(), "{name}: {err}");
            close(&weights(&ck), &expected, &format!("{entry}, {name}"));
            if extra.contains(&"--data-parallel") {
                let out = String::from_utf8_lossy(&o.stdout);
                assert!(out.contains("by NCCL"), "{out}");
            }
        }
    }
    // The emulator has no NCCL: one rank only.
    fails_with(
        &run(
            "loss",
            &["--backend", "gpu-emulator", "--ranks", "2"],
            &d.path("two"),
        ),
        "--backend gpu-emulator has no NCCL: data-parallel training on it runs on one rank only",
    );
}

/// What cannot run ends every rank with its reason: a data file no rank
/// can read (each rank names itself), a rank killed mid-run (mpirun names
/// it and the signal), in seconds; and arguments that cannot go together.
#[test]
fn a_failing_or_dying_rank_ends_the_run() {
    if !have_mpirun() {
        return;
    }
    let d = Dir::new("dp-faults");
    let (x, y) = data(&d, 600);
    let m = model(&d, 3);
    let missing = format!("x={}", d.path("missing.npy"));
    let started = Instant::now();
    let o = dlc(&[
        "train", &m, "--entry", "loss", "--data", &missing, "--data", &y, "--ranks", "2",
    ]);
    fails_with(&o, "missing.npy");
    assert!(stderr(&o).contains(" of 2: "), "{}", stderr(&o));
    assert!(started.elapsed() < Duration::from_secs(60));

    // A long run, its rank 1 killed once it is under way.
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlc"))
        .envs(AS_ROOT)
        .env("DLC_CACHE_DIR", d.path("cache"))
        .args([
            "train", &m, "--entry", "loss", "--data", &x, "--data", &y, "--epochs", "1000000",
            "--json", "--ranks", "2",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.path("stderr.txt")).unwrap())
        .spawn()
        .unwrap();
    let rank1 = (0..600).find_map(|_| {
        std::thread::sleep(Duration::from_millis(100));
        rank_process(&d.path("cache"), 1)
    });
    let rank1 = rank1.expect("rank 1 never started");
    // Let it reach its training loop.
    std::thread::sleep(Duration::from_millis(1500));
    let killed = Instant::now();
    let status = Command::new("kill")
        .args(["-9", &rank1.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "the run went on 30 s after rank 1 died"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let err = std::fs::read_to_string(d.path("stderr.txt")).unwrap();
    assert!(
        err.contains("rank 1") && err.contains("signal 9"),
        "no word of rank 1's death: {err}"
    );
    assert!(
        err.contains("the data-parallel run on 2 rank(s) failed"),
        "{err}"
    );

    fails_with(
        &dlc(&["train", &m, "--data", &x, "--ranks", "2", "--data-parallel"]),
        "give one of the two",
    );
    fails_with(
        &dlc(&["train", &m, "--data", &x, "--ranks", "0"]),
        "--ranks must be at least 1",
    );
    fails_with(
        &dlc(&[
            "train",
            &m,
            "--data",
            &x,
            "--ranks",
            "2",
            "--bucket-mb",
            "0",
        ]),
        "--bucket-mb must be positive, got 0",
    );
    fails_with(
        &dlc(&[
            "train",
            &m,
            "--entry",
            "loss64",
            "--data",
            &x,
            "--data-parallel",
        ]),
        "--data-parallel sums f32 gradients and buffers over the ranks; `w` is f64[4, 2]",
    );
    let (x4, y4) = data(&d, 4);
    fails_with(
        &dlc(&[
            "train", &m, "--entry", "loss", "--data", &x4, "--data", &y4, "--ranks", "2",
        ]),
        "the data set has 4 rows, fewer than one global batch of 6 (2 rank(s) of 3)",
    );
}

/// The process id of rank `rank` of a run whose environment names
/// `marker` (its object cache).
fn rank_process(marker: &str, rank: usize) -> Option<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        let has = |s: &str| vars.contains(&s.as_bytes());
        if has(&want) && has(&format!("DLC_CACHE_DIR={marker}")) {
            return Some(pid);
        }
    }
    None
}
