//! The `dlc` command end to end: exit codes, inputs and outputs as `.npy`
//! files, and the errors users get for bad arguments.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Dir, dlc, dlc_with_env, fails_with, stderr};

use dlc_core::{DType, TensorType};
use dlc_runtime::HostTensor;

const MODEL: &str = "
fn affine(x: f32[2, 3], w: f32[3, 2], b: f32[2]) -> f32[2, 2] {
    return x @ w + b;
}

fn pair(x: f32[2]) -> (f32[2], i32[2]) {
    return (x * 2.0, cast(x, i32));
}
";

fn f32ty(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

#[test]
fn run_reads_inputs_and_saves_outputs_in_return_order() {
    let d = Dir::new("run");
    let model = d.file("m.dl", MODEL);
    let x = d.npy("x.npy", f32ty(&[2, 3]), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let w = d.npy("w.npy", f32ty(&[3, 2]), &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    let b = d.npy("b.npy", f32ty(&[2]), &[0.5, -0.5]);
    let out = d.0.join("out");
    let o = dlc(&[
        "run",
        &model,
        "--entry",
        "affine",
        "--backend",
        "interp",
        "--input",
        &format!("x={x}"),
        "--input",
        &format!("w={w}"),
        "--input",
        &format!("b={b}"),
        "--save-outputs",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = HostTensor::read_npy(&out.join("out0.npy"), None).unwrap();
    assert_eq!(got.ty, f32ty(&[2, 2]));
    assert_eq!(got.data, vec![4.5, 4.5, 10.5, 10.5]);

    let x = d.npy("x2.npy", f32ty(&[2]), &[1.5, -2.5]);
    let o = dlc(&[
        "run",
        &model,
        "--entry",
        "pair",
        "--input",
        &format!("x={x}"),
        "--save-outputs",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let a = HostTensor::read_npy(&out.join("out0.npy"), None).unwrap();
    let b = HostTensor::read_npy(&out.join("out1.npy"), None).unwrap();
    assert_eq!(a.data, vec![3.0, -5.0]);
    assert_eq!(b.ty, TensorType::new(DType::I32, vec![2]));
    assert_eq!(b.data, vec![1.0, -2.0]);
}

#[test]
fn random_inputs_are_deterministic() {
    let d = Dir::new("random");
    let model = d.file("m.dl", MODEL);
    let run = |seed: &str| {
        let o = dlc(&["run", &model, "--entry", "affine", "--random-inputs", seed]);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(run("3"), run("3"));
    assert_ne!(run("3"), run("4"));
}

#[test]
fn input_errors_are_clear() {
    let d = Dir::new("inputs");
    let model = d.file("m.dl", MODEL);
    fails_with(
        &dlc(&["run", &model, "--entry", "affine"]),
        "missing input(s) for `affine`: x, w, b",
    );
    let bad_shape = d.npy("x.npy", f32ty(&[3, 2]), &[0.0; 6]);
    fails_with(
        &dlc(&[
            "run",
            &model,
            "--entry",
            "affine",
            "--random-inputs",
            "0",
            "--input",
            &format!("x={bad_shape}"),
        ]),
        "input `x` must be f32[2, 3], got f32[3, 2]",
    );
    let bad_dtype = d.npy("xi.npy", TensorType::new(DType::I32, vec![2, 3]), &[0.0; 6]);
    fails_with(
        &dlc(&[
            "run",
            &model,
            "--entry",
            "affine",
            "--random-inputs",
            "0",
            "--input",
            &format!("x={bad_dtype}"),
        ]),
        "input `x` must be f32[2, 3], got i32[2, 3]",
    );
    fails_with(
        &dlc(&[
            "run",
            &model,
            "--entry",
            "affine",
            "--random-inputs",
            "0",
            "--input",
            "y=a.npy",
        ]),
        "`affine` has no parameter `y`; its parameters: x, w, b",
    );
    fails_with(
        &dlc(&["run", &model, "--entry", "affine", "--input", "x"]),
        "--input takes NAME=PATH.npy",
    );
    fails_with(
        &dlc(&[
            "run",
            &model,
            "--entry",
            "affine",
            "--random-inputs",
            "0",
            "--input",
            "x=/no/such.npy",
        ]),
        "/no/such.npy",
    );
    let huge = d.file(
        "huge.dl",
        "fn f(x: f32[100000, 100000]) -> f32 { return sum(x); }",
    );
    fails_with(
        &dlc(&["run", &huge, "--random-inputs", "0"]),
        "input `x` (f32[100000, 100000]) has more elements than dlc holds in memory",
    );
    let big_const = d.file(
        "bigc.dl",
        "fn f(x: f32) -> f32 { return sum(zeros([100000, 100000])) + x; }",
    );
    fails_with(
        &dlc(&[
            "run",
            &big_const,
            "--backend",
            "interp",
            "--random-inputs",
            "0",
        ]),
        "@f graph.sum would take about 1.00e10 element operations",
    );
    let garbage = d.file("g.npy", "not an array");
    fails_with(
        &dlc(&[
            "run",
            &model,
            "--entry",
            "affine",
            "--random-inputs",
            "0",
            "--input",
            &format!("x={garbage}"),
        ]),
        "not a readable .npy file",
    );
}

#[test]
fn entry_point_selection() {
    let d = Dir::new("entry");
    let model = d.file("m.dl", MODEL);
    fails_with(
        &dlc(&["run", &model, "--random-inputs", "0"]),
        "has 2 entry points; choose one with --entry: affine, pair",
    );
    fails_with(
        &dlc(&["run", &model, "--entry", "nope", "--random-inputs", "0"]),
        "no entry point `nope`; entry points: affine, pair",
    );
    let single = d.file("s.dl", "fn only(x: f32[2]) -> f32[2] { return x; }");
    assert!(
        dlc(&["run", &single, "--random-inputs", "0"])
            .status
            .success()
    );
}

#[test]
fn compile_emits_graph_ir_and_refuses_what_does_not_exist_yet() {
    let d = Dir::new("compile");
    let model = d.file("m.dl", MODEL);
    let out = d.0.join("m.graph");
    emit_to(&model, "graph", &out);
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.starts_with("graph.func @affine("), "{text}");
    let o = dlc(&["compile", &model, "--entry", "pair", "--emit", "graph"]);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("graph.func @pair("));
    let o = dlc(&["compile", &model, "--entry", "affine", "--emit", "loop"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("loop.func @affine(%x: buffer<f32[2, 3]>")
    );
    let o = dlc(&["compile", &model, "--emit", "loop-mlir"]);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("module {\n  \"loop.func\"() ({"));
    for target in ["host", "sm_90"] {
        let o = dlc(&[
            "compile", &model, "--entry", "affine", "--emit", "tile", "--target", target,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.starts_with("tile.func @affine(") && text.contains("tile.kernel"),
            "{text}"
        );
    }
    let o = dlc(&["compile", &model, "--emit", "tile-mlir"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"tile.kernel\""));
    let o = dlc(&["compile", &model, "--emit", "tile", "--target", "tpu"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown target `tpu`"),
        "{}",
        stderr(&o)
    );
    let o = dlc(&["compile", &model, "--emit", "llvm"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(" i32 @dlc_m_affine(ptr"),
        "{}",
        stderr(&o)
    );
    let o = dlc(&["compile", &model, "--emit", "asm"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("affine:"),
        "{}",
        stderr(&o)
    );
    let obj = d.0.join("m.o");
    assert!(
        dlc(&[
            "compile",
            &model,
            "--emit",
            "obj",
            "-o",
            obj.to_str().unwrap()
        ])
        .status
        .success()
    );
    assert_eq!(&std::fs::read(&obj).unwrap()[..4], b"\x7fELF");
    fails_with(&dlc(&["compile", &model, "--emit", "so"]), "give -o FILE");
}

/// `--backend gpu` runs on GPU 0 where there is one and says in one line
/// why not where there is none; `--emit ptx` needs a GPU target and the
/// GPU emulator runs the kernels here.
#[test]
fn the_gpu_backend_runs_or_says_why_not() {
    let d = Dir::new("gpu");
    let model = d.file("m.dl", MODEL);
    for entry in ["affine", "pair"] {
        let args = [
            "run",
            &model,
            "--entry",
            entry,
            "--random-inputs",
            "3",
            "--check",
            "--backend",
        ];
        let emulated = dlc(&[&args[..], &["gpu-emulator"]].concat());
        assert!(emulated.status.success(), "{}", stderr(&emulated));
        assert!(String::from_utf8_lossy(&emulated.stdout).contains("check: ok"));
        let o = dlc(&[&args[..], &["gpu"]].concat());
        let err = stderr(&o);
        if err.contains("no CUDA driver found") || err.contains("no CUDA device") {
            println!("no GPU here: {}", err.trim());
            assert_eq!(o.status.code(), Some(1));
            assert_eq!(err.trim().lines().count(), 1, "{err}");
        } else {
            assert!(o.status.success(), "{err}");
            assert!(String::from_utf8_lossy(&o.stdout).contains("check: ok"));
        }
    }
    let o = dlc(&[
        "bench",
        &model,
        "--entry",
        "affine",
        "--backend",
        "gpu",
        "--runs",
        "3",
    ]);
    let err = stderr(&o);
    if err.contains("no CUDA driver found") || err.contains("no CUDA device") {
        assert_eq!(o.status.code(), Some(1));
    } else {
        assert!(o.status.success(), "{err}");
        assert!(String::from_utf8_lossy(&o.stdout).contains("GPU: "));
    }
    let ptx = dlc(&[
        "compile", &model, "--emit", "ptx", "--target", "sm_80", "-o", "-",
    ]);
    assert!(ptx.status.success(), "{}", stderr(&ptx));
    let text = String::from_utf8_lossy(&ptx.stdout);
    assert!(
        text.contains(".target sm_80") && text.contains(".entry dlc_m_affine_k0"),
        "{text}"
    );
    fails_with(
        &dlc(&["compile", &model, "--emit", "ptx", "-o", "-"]),
        "PTX is made for a GPU target (--target sm_80 or sm_90)",
    );
    // TF32 tensor cores for f32 products only when asked for, and only
    // on a GPU.
    let product = d.file(
        "p.dl",
        "fn p(x: f32[64, 32], w: f32[32, 64]) -> f32[64, 64] { return x @ w; }",
    );
    for (extra, tf32) in [(&[][..], false), (&["--tf32"][..], true)] {
        let o = dlc(&[
            &[
                "compile", &product, "--emit", "ptx", "--target", "sm_90", "-o", "-",
            ][..],
            extra,
        ]
        .concat());
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).contains(".tf32.tf32"),
            tf32
        );
    }
    let o = dlc(&[
        "run",
        &product,
        "--backend",
        "gpu-emulator",
        "--tf32",
        "--random-inputs",
        "0",
        "--check",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    fails_with(
        &dlc(&["run", &product, "--tf32", "--random-inputs", "0"]),
        "--tf32 is for --backend gpu and gpu-emulator",
    );
    fails_with(
        &dlc(&["compile", &product, "--emit", "ptx", "--tf32", "-o", "-"]),
        "--tf32 is for GPU targets",
    );
    fails_with(
        &dlc(&[
            "compile", &model, "--emit", "asm", "--target", "sm_90", "-o", "-",
        ]),
        "sm_90 compiles to PTX (--emit ptx)",
    );
    fails_with(
        &dlc(&[
            "run",
            &model,
            "--entry",
            "pair",
            "--backend",
            "gpu-emulator",
            "--target",
            "x86-64-avx2",
            "--random-inputs",
            "0",
        ]),
        "--backend gpu-emulator runs GPU code",
    );
}

/// `--emit gpu-module` writes a module `dlc-rt` loads with no compiler:
/// each entry point's plan, its inputs drawn as `dlc run --random-inputs`
/// draws them, and its results' `--check` tolerances.
#[test]
fn a_gpu_module_carries_what_a_runner_needs() {
    let d = Dir::new("gpu_module");
    let model = d.file("m.dl", MODEL);
    let path = d.path("m.dlcm");
    let o = dlc(&[
        "compile",
        &model,
        "--target",
        "sm_90",
        "--emit",
        "gpu-module",
        "-o",
        &path,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = dlc_runtime::module::GpuModule::read(Path::new(&path)).unwrap();
    assert_eq!(
        (m.target.as_str(), m.capability, m.tf32),
        ("sm_90", (9, 0), false)
    );
    assert_eq!(m.entry_names().collect::<Vec<_>>(), ["affine", "pair"]);
    assert!(m.program.ptx.contains(".target sm_90"));
    let (f, info) = m.entry("affine").unwrap();
    assert_eq!(
        info.random,
        [
            dlc_runtime::RandomRange::Unit,
            dlc_runtime::RandomRange::Weight(1.0 / 3f64.sqrt()),
            dlc_runtime::RandomRange::Unit
        ]
    );
    assert_eq!(info.tolerances, [1e-4]);
    let saved = d.path("inputs");
    let o = dlc(&[
        "run",
        &model,
        "--entry",
        "affine",
        "--random-inputs",
        "7",
        "--save-inputs",
        &saved,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let drawn = info.inputs(f, &[], Some(7)).unwrap();
    for (p, t) in f.signature.inputs().zip(&drawn) {
        let file = Path::new(&saved).join(format!("{}.npy", p.name));
        assert_eq!(&HostTensor::read_npy(&file, None).unwrap(), t, "{}", p.name);
    }
    let o = dlc(&[
        "compile",
        &model,
        "--target",
        "sm_90",
        "--tf32",
        "--emit",
        "gpu-module",
        "-o",
        &path,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = dlc_runtime::module::GpuModule::read(Path::new(&path)).unwrap();
    assert!(m.tf32);
    assert_eq!(
        m.entry("affine").unwrap().1.tolerances,
        [dlc_runtime::check::TF32_TOLERANCE]
    );
    fails_with(
        &dlc(&["compile", &model, "--emit", "gpu-module", "-o", &path]),
        "a GPU module is compiled for a GPU target (--target sm_80 or sm_90), not",
    );
}

#[test]
fn the_loop_and_tile_backends_agree_with_the_reference() {
    let d = Dir::new("loop");
    let model = d.file("m.dl", MODEL);
    for (entry, backend) in [
        ("affine", "loop"),
        ("pair", "loop"),
        ("affine", "tile"),
        ("pair", "tile"),
        ("affine", "cpu"),
        ("pair", "cpu"),
    ] {
        let o = dlc(&[
            "run",
            &model,
            "--entry",
            entry,
            "--backend",
            backend,
            "--random-inputs",
            "5",
            "--check",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("check: ok"));
    }
}

#[test]
fn bench_reports_compile_time_and_latency() {
    let d = Dir::new("bench");
    let model = d.file("m.dl", MODEL);
    let o = dlc(&[
        "bench", &model, "--entry", "affine", "--runs", "3", "--warmup", "1", "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["entry"], "affine");
    assert_eq!(report["runs"], 3);
    for key in [
        "compile_s",
        "frontend_s",
        "llvm_s",
        "median_ms",
        "min_ms",
        "max_ms",
    ] {
        assert!(
            report[key].as_f64().is_some_and(|v| v >= 0.0),
            "{key} in {report}"
        );
    }
    assert!(report["min_ms"].as_f64() <= report["median_ms"].as_f64());
    let o = dlc(&["bench", &model, "--entry", "pair", "--runs", "2"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("latency: median"),
        "{}",
        stderr(&o)
    );
    let two = [
        "bench",
        &model,
        "--entry",
        "affine",
        "--runs",
        "2",
        "--threads",
        "2",
    ];
    let o = dlc(&[&two[..], &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["threads"], 2);
    // At two threads it says how fast their cores pass a line (the
    // placement it ran in); at one it has no second thread to ask.
    assert!(
        report["core_round_trip_ns"]
            .as_f64()
            .is_some_and(|ns| ns > 0.0),
        "{report}"
    );
    let o = dlc(&two);
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .contains("cores: a cache line passes between two threads"),
        "{}",
        stderr(&o)
    );
    let o = dlc(&[
        "bench", &model, "--entry", "affine", "--runs", "2", "--json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["core_round_trip_ns"].is_null(), "{report}");
    fails_with(
        &dlc(&["bench", &model, "--entry", "pair", "--runs", "0"]),
        "--runs must be at least 1",
    );
}

/// `dlc bench --profile` times every kernel launch of the timed runs in
/// the compiled code: each launch of the three lines' ops is listed once a
/// run with the place of its op, the times are inside the runs', and the
/// text names the places; a profile is of CPU code compiled for it, so
/// neither `--cache` nor the GPU takes it.
#[test]
fn bench_profiles_each_kernel_launch_at_its_place() {
    let d = Dir::new("bench-profile");
    let model = d.file(
        "m.dl",
        "fn layers(x: f32[256, 256], w: f32[256, 256], v: f32[256, 256]) -> f32[256, 256] {
    let h = tanh(x @ w);
    let s = h / sum(h, 0, true);
    return s @ v;
}
",
    );
    let bench = ["bench", &model, "--runs", "4", "--warmup", "1", "--json"];
    let o = dlc(&[&bench[..], &["--profile"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let launches = report["profile"].as_array().expect("a profile");
    let mut lines = std::collections::BTreeSet::new();
    let mut inside = 0.0;
    for l in launches {
        let place = l["place"].as_str().unwrap();
        let line = place
            .strip_prefix(&format!("{model}:"))
            .and_then(|p| p.split(':').next())
            .unwrap_or_else(|| panic!("{place} is not a place in {model}"));
        lines.insert(line.to_string());
        assert_eq!(l["calls_per_run"], 1.0, "{l}");
        assert!(l["programs"].as_u64().is_some_and(|p| p >= 1), "{l}");
        assert!(
            l["kernel"]
                .as_str()
                .is_some_and(|k| k.starts_with("layers.")),
            "{l}"
        );
        let (median, mean) = (
            l["median_ms"].as_f64().unwrap(),
            l["mean_ms"].as_f64().unwrap(),
        );
        assert!(median > 0.0 && mean > 0.0, "{l}");
        assert!(median <= report["max_ms"].as_f64().unwrap(), "{l}");
        inside += mean;
    }
    assert_eq!(
        lines.into_iter().collect::<Vec<_>>(),
        ["2", "3", "4"],
        "{report}"
    );
    // The mean run holds its launches, and no run is longer than the
    // longest.
    assert!(inside <= report["max_ms"].as_f64().unwrap(), "{report}");
    let o = dlc(&bench);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["profile"].is_null(), "{report}");
    let o = dlc(&["bench", &model, "--runs", "2", "--profile"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("kernel launches a run"), "{text}");
    assert!(text.contains(&format!("{model}:4:")), "{text}");
    fails_with(
        &dlc(&["bench", &model, "--profile", "--cache"]),
        "--profile compiles code of its own",
    );
    fails_with(
        &dlc(&["bench", &model, "--profile", "--backend", "gpu"]),
        "--profile is for --backend cpu",
    );
}

/// `dlc run` keeps compiled kernels in the object cache (`DLC_CACHE_DIR`)
/// unless told not to; `dlc bench` compiles cold unless given `--cache`,
/// and says how many parts came from it.
#[test]
fn the_object_cache_is_used_by_run_and_on_request_by_bench() {
    let d = Dir::new("object-cache");
    let model = d.file("m.dl", MODEL);
    let cache = d.0.join("cache");
    let with_cache = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dlc"))
            .env("DLC_CACHE_DIR", &cache)
            .args(args)
            .output()
            .unwrap()
    };
    let entries = || std::fs::read_dir(&cache).map_or(0, |d| d.count());
    let run = [
        "run",
        &model,
        "--entry",
        "affine",
        "--random-inputs",
        "1",
        "--check",
    ];
    let o = with_cache(&[&run[..], &["--no-cache"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(entries(), 0, "--no-cache writes nothing");
    let bench = [
        "bench", &model, "--entry", "affine", "--runs", "1", "--json",
    ];
    let o = with_cache(&bench);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(entries(), 0, "bench is cold by default");
    let o = with_cache(&run);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("check: ok"));
    let stored = entries();
    assert!(stored >= 1, "dlc run stores its parts");
    // The same kernels again: every part from the cache, no object added
    // (the program's manifest is: see `whole_programs_come_from_the_cache`).
    let o = with_cache(&[&bench[..], &["--cache"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["cached_parts"], report["llvm_parts"], "{report}");
    assert_eq!(
        report["llvm_parts"].as_u64(),
        Some(stored as u64),
        "{report}"
    );
    assert_eq!(entries(), stored + 1);
    // A cached compile runs correctly.
    let o = with_cache(&run);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("check: ok"));
    fails_with(
        &with_cache(&[&bench[..], &["--cache", "--backend", "gpu"]].concat()),
        "--cache is for --backend cpu",
    );
}

/// `dlc run` and `dlc bench --cache` keep whole programs in the cache: the
/// same source, entry point and passes on the same machine link the stored
/// objects with no front end and compute the same results; a change to any
/// of those is another program; a damaged manifest or a trimmed object is
/// compiled again.
#[test]
fn whole_programs_come_from_the_cache() {
    let d = Dir::new("program-cache");
    let model = d.file("m.dl", MODEL);
    let cache = d.0.join("cache");
    let with_cache = |args: &[&str], cpu: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_dlc"));
        c.env("DLC_CACHE_DIR", &cache).env_remove("DLC_CPU");
        if let Some(cpu) = cpu {
            c.env("DLC_CPU", cpu);
        }
        c.args(args).output().unwrap()
    };
    let files = |ext: &str| -> Vec<PathBuf> {
        std::fs::read_dir(&cache).map_or(Vec::new(), |d| {
            d.map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == ext))
                .collect()
        })
    };
    let run = |model: &str| {
        let o = with_cache(
            &["run", model, "--entry", "affine", "--random-inputs", "1"],
            None,
        );
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // Whether the program came from the cache, by `dlc bench`'s report.
    let whole = |model: &str, extra: &[&str], cpu: Option<&str>| {
        let args = [
            &[
                "bench", model, "--runs", "1", "--warmup", "0", "--cache", "--json",
            ],
            extra,
        ]
        .concat();
        let o = with_cache(&args, cpu);
        assert!(o.status.success(), "{}", stderr(&o));
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        report["cached_program"].as_bool().unwrap()
    };
    let first = run(&model);
    assert_eq!(files("program").len(), 1, "dlc run stores the program");
    assert_eq!(
        run(&model),
        first,
        "the program from the cache computes the same"
    );
    assert!(whole(&model, &["--entry", "affine"], None));

    // Another entry point, other passes, another text (a comment added),
    // another CPU: each another program, then found.
    for (extra, cpu) in [
        (&["--entry", "pair"][..], None),
        (
            &["--entry", "affine", "--passes", "graph.canonicalize"][..],
            None,
        ),
        (&["--entry", "affine"][..], Some("x86-64-v3")),
    ] {
        assert!(!whole(&model, extra, cpu), "{extra:?} {cpu:?}");
        assert!(whole(&model, extra, cpu), "{extra:?} {cpu:?}");
    }
    let edited = d.file("m2.dl", format!("// edited\n{MODEL}"));
    assert!(!whole(&edited, &["--entry", "affine"], None));

    // A damaged manifest and a trimmed object: compiled again, correctly.
    for p in files("program") {
        let mut bytes = std::fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&p, bytes).unwrap();
    }
    assert_eq!(run(&model), first);
    assert!(whole(&model, &["--entry", "affine"], None));
    for p in files("o") {
        std::fs::remove_file(p).unwrap();
    }
    assert!(!whole(&model, &["--entry", "affine"], None));
    assert_eq!(run(&model), first);
}

/// `dlc train` compiles its step through the object cache `dlc run` keeps:
/// a second run of an unchanged model takes its objects from it and trains
/// to the same weights; `--no-cache` neither reads nor writes it.
#[test]
fn train_takes_the_steps_objects_from_the_cache() {
    let d = Dir::new("train-cache");
    let xs: Vec<f64> = (0..24).map(|i| f64::from(i * 5 % 7 - 3) / 4.0).collect();
    let ys: Vec<f64> = (0..8).map(|i| f64::from(i) / 4.0).collect();
    let (model, x, y) = linear_regression(&d, &xs, &ys);
    let train = |cache: &Path, out: &str, extra: &[&str]| {
        let out = d.path(out);
        let args = [
            &[
                "train",
                &model,
                "--data",
                &x,
                "--data",
                &y,
                "--epochs",
                "3",
                "--save-weights",
                &out,
            ][..],
            extra,
        ]
        .concat();
        let o = Command::new(env!("CARGO_BIN_EXE_dlc"))
            .env("DLC_CACHE_DIR", cache)
            .args(&args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        std::fs::read(Path::new(&out).join("w.npy")).unwrap()
    };
    let objects = |cache: &Path| {
        std::fs::read_dir(cache).map_or(0, |d| {
            d.filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "o")
            })
            .count()
        })
    };
    let cache = d.0.join("cache");
    let cold = train(&cache, "cold", &[]);
    let stored = objects(&cache);
    assert!(stored >= 1, "the step's parts are stored");
    // The same step again: its objects found, nothing added.
    assert_eq!(train(&cache, "warm", &[]), cold);
    assert_eq!(objects(&cache), stored);
    let none = d.0.join("none");
    assert_eq!(train(&none, "uncached", &["--no-cache"]), cold);
    assert_eq!(objects(&none), 0, "--no-cache writes nothing");
}

/// Code generation is deterministic: two processes (different hash seeds)
/// write the same LLVM IR and the same object file, so that the object
/// cache finds what it stored (W7's workspace was once placed in hash
/// order).
#[test]
fn compiling_twice_gives_the_same_bytes() {
    let d = Dir::new("deterministic");
    let gru = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/w7_gru.dl");
    for emit in ["llvm", "obj"] {
        let out: Vec<Vec<u8>> = ["a", "b"]
            .iter()
            .map(|n| {
                let path = d.path(&format!("{n}.{emit}"));
                let o = dlc(&["compile", gru, "--emit", emit, "-o", &path]);
                assert!(o.status.success(), "{}", stderr(&o));
                std::fs::read(&path).unwrap()
            })
            .collect();
        assert!(out[0] == out[1], "--emit {emit} differs between two runs");
    }
}

#[test]
fn bad_files_fail_with_a_location() {
    let d = Dir::new("bad");
    let bad = d.file(
        "bad.dl",
        "fn f(x: f32[4]) -> f32[4] {\n    return x @ y;\n}\n",
    );
    let o = dlc(&["check", &bad]);
    fails_with(&o, "unknown name `y`");
    assert!(stderr(&o).contains("bad.dl:2:16"), "{}", stderr(&o));
    let p = d.0.join("bin.dl");
    std::fs::write(&p, b"fn \xfe").unwrap();
    fails_with(
        &dlc(&["check", p.to_str().unwrap()]),
        "bin.dl:1:4: the file is not valid UTF-8",
    );
    fails_with(&dlc(&["check", "/no/such/file.dl"]), "/no/such/file.dl");
    let ok = d.file("ok.dl", MODEL);
    let o = dlc(&["check", &ok]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("2 entry point(s): affine, pair"));
}

#[test]
fn examples_run_in_the_interpreter() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let o = dlc(&[
        "run",
        root.join("examples/language/index_notation.dl")
            .to_str()
            .unwrap(),
        "--random-inputs",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("out0: f32[12, 384, 64]"));
}

/// The C program of the object-file test: fills the inputs, calls the
/// compiled `affine` through the generated header, prints the results.
const C_MAIN: &str = r#"
#include <stdio.h>
#include "model.h"

int main(void) {
    float x[6], w[6], b[2], out[4];
    for (int i = 0; i < 6; i++) {
        x[i] = 0.5f * (float)i - 1.0f;
        w[i] = 0.25f * (float)(i * i) - 2.0f;
    }
    b[0] = 1.5f;
    b[1] = -3.0f;
    int32_t status = dlc_m_affine(x, w, b, out);
    if (status != DLC_OK) {
        printf("status %d\n", status);
        return 1;
    }
    for (int i = 0; i < 4; i++) {
        printf("%.6f\n", out[i]);
    }
    return 0;
}
"#;

/// `x @ w + b` for the inputs `C_MAIN` makes, computed here.
fn affine_reference() -> Vec<f64> {
    let x: Vec<f64> = (0..6).map(|i| 0.5 * f64::from(i) - 1.0).collect();
    let w: Vec<f64> = (0..6).map(|i| 0.25 * f64::from(i * i) - 2.0).collect();
    let b = [1.5, -3.0];
    let mut out = Vec::new();
    for i in 0..2 {
        for j in 0..2 {
            out.push((0..3).map(|k| x[i * 3 + k] * w[k * 2 + j]).sum::<f64>() + b[j]);
        }
    }
    out
}

/// Compiles `model` to `DIR/STEM.o` and `DIR/STEM.h` (with `options`
/// given to `dlc compile`); the header's text.
fn emit_object_and_header(d: &Dir, model: &str, stem: &str, options: &[&str]) -> (PathBuf, String) {
    let (obj, header) = (d.0.join(format!("{stem}.o")), d.0.join(format!("{stem}.h")));
    for (emit, path) in [("obj", &obj), ("header", &header)] {
        emit_with(model, emit, path, options);
    }
    (obj, std::fs::read_to_string(&header).unwrap())
}

/// `dlc compile MODEL --emit EMIT -o PATH`, which must succeed.
fn emit_to(model: &str, emit: &str, path: &Path) {
    emit_with(model, emit, path, &[]);
}

/// [`emit_to`] with `options` given to `dlc compile` too.
fn emit_with(model: &str, emit: &str, path: &Path, options: &[&str]) {
    let mut args = vec![
        "compile",
        model,
        "--emit",
        emit,
        "-o",
        path.to_str().unwrap(),
    ];
    args.extend_from_slice(options);
    let o = dlc(&args);
    assert!(o.status.success(), "{emit}: {}", stderr(&o));
}

/// Builds `main` with `obj` into `DIR/EXE` (`cc -std=c99 -Wall -Werror`)
/// and runs it; its standard output.
fn run_c_program(d: &Dir, exe: &str, main: &str, obj: &Path, libs: &[&str]) -> String {
    let exe = d.0.join(exe);
    let cc = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(main)
        .arg(obj)
        .args(libs)
        .output()
        .expect("the C compiler `cc` (installed by `make setup`)");
    assert!(cc.status.success(), "{libs:?}: {}", stderr(&cc));
    let run = Command::new(&exe).output().unwrap();
    let out = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(run.status.success(), "{out}{}", stderr(&run));
    out
}

#[test]
fn object_files_link_into_a_c_program() {
    let d = Dir::new("cabi");
    let model = d.file("m.dl", MODEL);
    let (obj, h) = emit_object_and_header(&d, &model, "model", &[]);
    assert!(
        h.contains(
            "int32_t dlc_m_affine(const float *x, const float *w, const float *b, float *out0);"
        ),
        "{h}"
    );
    assert!(
        h.contains("int32_t dlc_m_pair(const float *x, float *out0, int32_t *out1);"),
        "{h}"
    );
    let main = d.file("main.c", C_MAIN);
    // With the OpenMP runtime, parallel loops run on its threads; without
    // it, on the calling thread.
    for (exe, libs) in [
        ("main", &["-lm", "-lgomp"][..]),
        ("main_alone", &["-lm"][..]),
    ] {
        check_affine_output(&run_c_program(&d, exe, &main, &obj, libs), exe);
    }
}

/// A C program that is its own OpenMP runtime: `GOMP_parallel` runs the
/// team's members one after another (a member is held up until those
/// before it have returned), and after each prints how many of the
/// output's elements the region has written so far (it fills the output
/// with NaN first), for teams of 1 (which it is never asked to start), 2
/// and 3, and as `smaller`, teams of 2 and 3 one member short of what
/// `omp_get_max_threads` says (the last never runs); for a light 1 x 1
/// convolution (64 channels out) and a heavy one (256), whose every
/// element it checks (192 = 384 x 1 x 0.5).
const C_TEAM: &str = r#"
#include <math.h>
#include <stdio.h>
#include "split.h"

#define PIXELS (14 * 14)
static float x[384 * PIXELS], w[256 * 384], out[256 * PIXELS];
static int members = 1, member = 0, smaller = 0, size = 0;

int omp_get_max_threads(void) { return members; }
int omp_get_num_threads(void) { return members - smaller; }
int omp_get_thread_num(void) { return member; }

void GOMP_parallel(void (*fn)(void *), void *data, unsigned n, unsigned flags) {
    (void)n;
    (void)flags;
    for (member = 0; member < members - smaller; member++) {
        fn(data);
        int written = 0;
        for (int i = 0; i < size; i++) written += !isnan(out[i]);
        printf(" %d", written);
    }
    member = 0;
}

static int run(const char *name, int channels) {
    size = channels * PIXELS;
    for (smaller = 0; smaller <= 1; smaller++) {
        for (members = 1 + smaller; members <= 3; members++) {
            for (int i = 0; i < size; i++) out[i] = NAN;
            printf("%s %s %d:", name, smaller ? "smaller" : "team", members);
            int status = channels == 64 ? dlc_split_light(x, w, out) : dlc_split_heavy(x, w, out);
            if (status != DLC_OK) return 1;
            for (int i = 0; i < size; i++)
                if (out[i] != 192.0f) return 2;
            printf("\n");
        }
    }
    return 0;
}

int main(void) {
    for (int i = 0; i < 384 * PIXELS; i++) x[i] = 1.0f;
    for (int i = 0; i < 256 * 384; i++) w[i] = 0.5f;
    return run("light", 64) || run("heavy", 256);
}
"#;

/// How a kernel's programs are shared among the threads (a 1 x 1
/// convolution over 14 x 14 pixels is, on AVX2, panels of 16 pixels, the
/// last of 4: 13 along the pixels). A light kernel's in fixed shares, the
/// later threads taking the extra programs where the grid's last is the
/// one the edge cuts short: two threads take 6 and 6 + 1/4 panels (96 and
/// 100 pixels of 64 channels: 6144 and 6400 elements), not 7 and 5 + 1/4;
/// three take 4, 4 and 4 + 1/4. A heavy kernel's (`min_claim_work`) from a
/// word per thread holding that share: a thread takes its own share's
/// programs in order, then those left in the others', so one held up
/// leaves its programs to those that are free: under a runtime running a
/// team's members one after another, the first writes the whole output.
/// A team smaller than `omp_get_max_threads` still runs every program.
#[test]
fn a_thread_held_up_leaves_a_heavy_kernels_programs_to_the_others() {
    let d = Dir::new("team");
    let model = d.file(
        "split.dl",
        "fn light(x: f32[1, 384, 14, 14], w: f32[64, 384, 1, 1]) -> f32[1, 64, 14, 14] {\n    \
         return conv2d(x, w);\n}\n\
         fn heavy(x: f32[1, 384, 14, 14], w: f32[256, 384, 1, 1]) -> f32[1, 256, 14, 14] {\n    \
         return conv2d(x, w);\n}\n",
    );
    let (obj, _) = emit_object_and_header(&d, &model, "split", &["--cpu", "x86-64-v3"]);
    let main = d.file("team.c", C_TEAM);
    let printed = run_c_program(&d, "team", &main, &obj, &["-lm"]);
    // The product's region is the one that writes the output; a region
    // packing the weights writes none of it.
    let product = |team: &str, run: usize, all: usize| -> Vec<usize> {
        let line = printed
            .lines()
            .find(|l| l.starts_with(&format!("{team}:")))
            .unwrap_or_else(|| panic!("{printed}"));
        let counts: Vec<usize> = line
            .split_once(':')
            .unwrap()
            .1
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        counts
            .chunks(run)
            .find(|region| region.last() == Some(&all))
            .unwrap_or_else(|| panic!("{team}: {printed}"))
            .to_vec()
    };
    let (light, heavy) = (64 * 196, 256 * 196);
    // At one thread the kernels run in place, without a team.
    for name in ["light", "heavy"] {
        assert!(
            printed.lines().any(|l| l == format!("{name} team 1:")),
            "{printed}"
        );
    }
    assert_eq!(
        product("light team 2", 2, light),
        [6144, light],
        "{printed}"
    );
    assert_eq!(
        product("light team 3", 3, light),
        [4096, 8192, light],
        "{printed}"
    );
    assert_eq!(
        product("heavy team 2", 2, heavy),
        [heavy, heavy],
        "{printed}"
    );
    assert_eq!(product("heavy team 3", 3, heavy), [heavy; 3], "{printed}");
    assert_eq!(product("heavy smaller 2", 1, heavy), [heavy], "{printed}");
    assert_eq!(
        product("heavy smaller 3", 2, heavy),
        [heavy, heavy],
        "{printed}"
    );
}

/// What `C_MAIN` printed (built as `what`) against [`affine_reference`].
fn check_affine_output(printed: &str, what: &str) {
    let got: Vec<f64> = printed.lines().map(|l| l.parse().unwrap()).collect();
    let want = affine_reference();
    assert_eq!(got.len(), want.len(), "{what}: {printed}");
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}: got {got:?}, want {want:?}"
        );
    }
}

/// A C program that links no OpenMP runtime loads a shared library with
/// `dlopen` (as Python's ctypes does), calls `dlc_mm_mm` on zeros and
/// prints how many threads the process has.
const C_DLOPEN: &str = r#"#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int32_t (*mm_fn)(const float *, const float *, float *);

static int threads(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    struct dirent *e;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    mm_fn mm = (mm_fn)dlsym(lib, "dlc_mm_mm");
    float *a = calloc(512 * 512, sizeof(float));
    float *b = calloc(512 * 512, sizeof(float));
    float *c = calloc(512 * 512, sizeof(float));
    if (!mm || !a || !b || !c || mm(a, b, c) != 0) return 1;
    printf("%d\n", threads());
    return 0;
}
"#;

/// A shared library brings the OpenMP runtime it was linked against: a
/// process without one of its own (a C program that only `dlopen`s the
/// library, as Python's ctypes does) runs its kernels on the runtime's
/// threads. Linked `--as-needed`, the library lost the runtime and ran
/// every kernel on the calling thread there.
#[test]
fn shared_libraries_run_their_kernels_on_threads_in_any_process() {
    let d = Dir::new("so_threads");
    let model = d.file(
        "mm.dl",
        "fn mm(a: f32[512, 512], b: f32[512, 512]) -> f32[512, 512] {\n    return a @ b;\n}\n",
    );
    let so = d.0.join("libmm.so");
    emit_to(&model, "so", &so);
    let main = d.file("load.c", C_DLOPEN);
    let exe = d.0.join("load");
    let cc = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&main)
        .arg("-ldl")
        .output()
        .expect("the C compiler `cc` (installed by `make setup`)");
    assert!(cc.status.success(), "{}", stderr(&cc));
    let run = Command::new(&exe)
        .arg(&so)
        .env("OMP_NUM_THREADS", "2")
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", stderr(&run));
    let threads: usize = String::from_utf8_lossy(&run.stdout).trim().parse().unwrap();
    assert!(threads >= 2, "the process ran on {threads} thread(s)");
}

/// A model with declared weights compiled to a shared library: its header
/// declares the preparer and says which inputs come from it, and a kernel
/// loaded from the library runs the preparer once per binding and takes
/// the source's inputs only, giving the interpreter's results.
#[test]
fn shared_libraries_prepare_declared_weights() {
    let d = Dir::new("so_weights");
    let model = d.file(
        "w.dl",
        "fn dense(x: f32[40, 70], weight w: f32[70, 90], weight b: f32[90]) -> f32[40, 90] {\n    \
         return relu(x @ w + b);\n}\n",
    );
    let so = d.0.join("libw.so");
    emit_to(&model, "so", &so);
    let h = dlc(&["compile", &model, "--emit", "header", "-o", "-"]);
    let h = String::from_utf8_lossy(&h.stdout);
    assert!(
        h.contains("/* Its last inputs (w_packed) come from dlc_w_dense_prepare:"),
        "{h}"
    );
    assert!(
        h.contains("int32_t dlc_w_dense_prepare(const float *w, float *w_packed);"),
        "{h}"
    );
    let lib = dlc_runtime::SharedLibrary::open(&so).unwrap();
    assert_eq!(
        lib.signature("dlc_w_dense").unwrap().prepare.as_deref(),
        Some("dlc_w_dense_prepare")
    );
    let dense = lib.kernel("dlc_w_dense").unwrap();
    let src = dlc_driver::SourceText {
        name: "w.dl".into(),
        text: std::fs::read_to_string(&model).unwrap(),
        weights: Vec::new(),
    };
    let m = dlc_driver::compile_source(&src).unwrap();
    let f = dlc_driver::select_entry(&m, None).unwrap();
    let inputs = dlc_driver::prepare_inputs(f, &[], Some(3)).unwrap();
    let want = dlc_driver::interpret(&m, f, &inputs).unwrap();
    let mut call = dense.bind(&inputs).unwrap();
    for _ in 0..2 {
        call.run().unwrap();
        let got = call.outputs().unwrap();
        let err = dlc_driver::max_relative_error(&got, &want).unwrap();
        assert!(err <= 1e-5, "relative error {err}");
    }
}

#[test]
fn shared_libraries_load_and_check_their_arguments() {
    let d = Dir::new("so");
    let model = d.file("m.dl", MODEL);
    let so = d.0.join("libmodel.so");
    emit_to(&model, "so", &so);
    fails_with(&dlc(&["compile", &model, "--emit", "so"]), "give -o FILE");
    let lib = dlc_runtime::SharedLibrary::open(&so).unwrap();
    let affine = lib.kernel("dlc_m_affine").unwrap();
    let x: Vec<f64> = (0..6).map(|i| 0.5 * f64::from(i) - 1.0).collect();
    let w: Vec<f64> = (0..6).map(|i| 0.25 * f64::from(i * i) - 2.0).collect();
    let args = [
        HostTensor::new(f32ty(&[2, 3]), x).unwrap(),
        HostTensor::new(f32ty(&[3, 2]), w).unwrap(),
        HostTensor::new(f32ty(&[2]), vec![1.5, -3.0]).unwrap(),
    ];
    let out = affine.call(&args).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ty, f32ty(&[2, 2]));
    for (g, w) in out[0].data.iter().zip(affine_reference()) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{:?}",
            out[0].data
        );
    }
    let err = affine.call(&args[..2]).unwrap_err().to_string();
    assert_eq!(
        err,
        "`dlc_m_affine` takes 3 input(s), got 2: missing `b` (f32[2])"
    );
    let pair = lib.kernel("dlc_m_pair").unwrap();
    let err = pair
        .call(&[HostTensor::new(TensorType::new(DType::I32, vec![2]), vec![1.0, 2.0]).unwrap()])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "`dlc_m_pair`: input `x` must have element type f32, got i32 (i32[2])"
    );
    let err = lib.kernel("nothing").unwrap_err().to_string();
    assert!(err.contains("no dlc function `nothing`"), "{err}");
    let err = lib.kernel("affine").unwrap_err().to_string();
    assert!(err.contains("symbol prefix"), "{err}");
    let err = dlc_runtime::SharedLibrary::open(&d.0.join("absent.so")).unwrap_err();
    assert!(err.to_string().contains("absent.so"), "{err}");
}

#[test]
fn compile_stats_report_saturation() {
    let d = Dir::new("stats");
    let model = d.file(
        "assoc.dl",
        "fn f(a: f32[256, 256], x: f32[256, 512], w: f32[512, 8]) -> f32[256, 8] { return (a @ x) @ w; }",
    );
    let o = dlc(&["compile", &model, "--stats"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for counter in [
        "graph.saturate - functions changed",
        "graph.saturate - stopped: saturated",
        "graph.saturate - e-classes",
        "graph.saturate - e-nodes",
        "graph.saturate - time (us)",
        "graph.saturate - estimated cost before (ns)",
        "graph.saturate - estimated cost after (ns)",
        "graph.saturate - extraction: ilp optimal",
    ] {
        assert!(err.contains(counter), "missing `{counter}` in:\n{err}");
    }
    let cost = |what: &str| -> u64 {
        let line = err.lines().find(|l| l.contains(what)).unwrap();
        line.split_whitespace().next().unwrap().parse().unwrap()
    };
    // 67M multiply-adds and a narrow product against two narrow products.
    assert!(cost("cost after") * 5 < cost("cost before"), "{err}");
    // The cheaper association is what was compiled.
    let ir = String::from_utf8_lossy(&o.stdout);
    assert!(ir.contains("graph.matmul %x, %w"), "{ir}");
    // Without saturation, no statistics of it and the order as written.
    let o = dlc(&[
        "compile",
        &model,
        "--stats",
        "--passes",
        "graph.inline,graph.dce",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("graph.saturate"));
    assert!(String::from_utf8_lossy(&o.stdout).contains("graph.matmul %a, %x"));
}

/// Entry points and parameters named like C library, OpenMP and LLVM
/// symbols or C keywords: each compiles, links into a C program through its
/// header and runs; the JIT runs them too; a prefix that would export a
/// reserved symbol is refused with a message.
#[test]
fn any_legal_name_compiles_links_and_runs() {
    let names = [
        "malloc",
        "free",
        "omp_get_thread_num",
        "GOMP_parallel",
        "int",
        "memcpy",
    ];
    let mut model = String::new();
    for (k, name) in names.iter().enumerate() {
        model.push_str(&format!(
            "fn {name}(int: f32[64, 64], double: f32[64, 64], NULL: f32[64]) -> f32[64, 64] {{\n    \
             return relu(int @ double + NULL) * {}.0;\n}}\n",
            k + 1
        ));
    }
    let d = Dir::new("names");
    let src = d.file("names.dl", &model);
    let (obj, h) = emit_object_and_header(&d, &src, "names", &[]);
    assert!(
        h.contains(
            "int32_t dlc_names_malloc(const float *int_, const float *double_, const float *NULL_, \
             float *out0);"
        ),
        "{h}"
    );
    // Every entry on inputs of ones: relu(64 + 1) * (k + 1) everywhere.
    let mut main = String::from(
        "#include <stdio.h>\n#include \"names.h\"\nstatic float a[4096], b[4096], c[64], o[4096];\n\
         int main(void) {\n  for (int i = 0; i < 4096; i++) { a[i] = 1.0f; b[i] = 1.0f; }\n  \
         for (int i = 0; i < 64; i++) c[i] = 1.0f;\n",
    );
    for name in names {
        main.push_str(&format!(
            "  if (dlc_names_{name}(a, b, c, o) != DLC_OK) return 1;\n  printf(\"%g %g\\n\", o[0], o[4095]);\n"
        ));
    }
    main.push_str("  return 0;\n}\n");
    let main = d.file("main.c", &main);
    let want: String = (1..=names.len())
        .map(|k| format!("{0} {0}\n", 65 * k))
        .collect();
    assert_eq!(
        run_c_program(&d, "names", &main, &obj, &["-lm", "-lgomp"]),
        want
    );
    // In process (JIT), checked against the interpreter.
    for name in names {
        let o = dlc(&[
            "run",
            &src,
            "--entry",
            name,
            "--random-inputs",
            "0",
            "--check",
        ]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
    }
    // An explicit prefix is checked: no prefix at all would export `malloc`.
    fails_with(
        &dlc(&[
            "compile",
            &src,
            "--emit",
            "obj",
            "-o",
            "/dev/null",
            "--prefix",
            "",
        ]),
        "the symbol `malloc` of entry point `malloc` is reserved",
    );
    fails_with(
        &dlc(&["compile", &src, "--emit", "header", "--prefix", "9"]),
        "symbol prefix `9` is not the start of a C identifier",
    );
    let o = dlc(&["compile", &src, "--emit", "header", "--prefix", "my_"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("int32_t my_int("));
}

/// A reduction over 10^13 elements: the interpreters refuse it before
/// running (naming the op and the figure) instead of running for days, the
/// limit is a flag, and constant folding leaves it to run-time.
#[test]
fn interpreters_refuse_work_beyond_their_limit() {
    let d = Dir::new("work");
    let huge = d.file(
        "huge.dl",
        "op s[N](x: f32[N]) -> f32[N] { out[i] = sum[k in 0..10000000000000](x[k]); }\n\
         fn f(x: f32[4]) -> f32[4] { return s(x); }\n",
    );
    for backend in ["interp", "loop", "tile", "cpu"] {
        let start = std::time::Instant::now();
        let o = dlc(&[
            "run",
            &huge,
            "--backend",
            backend,
            "--random-inputs",
            "0",
            "--check",
        ]);
        fails_with(
            &o,
            "error: @f graph.compute (s) would take about 4.00e13 element operations",
        );
        assert!(
            stderr(&o).contains("--max-work raises the limit"),
            "{}",
            stderr(&o)
        );
        assert!(
            start.elapsed().as_secs() < 60,
            "{backend} took {:?}",
            start.elapsed()
        );
    }
    // The limit is adjustable both ways.
    let small = d.file(
        "small.dl",
        "fn f(x: f32[64, 64]) -> f32[64, 64] { return x @ x; }",
    );
    let o = dlc(&[
        "run",
        &small,
        "--backend",
        "interp",
        "--random-inputs",
        "0",
        "--max-work",
        "1000",
    ]);
    fails_with(
        &o,
        "@f graph.matmul would take about 2.62e5 element operations",
    );
    let o = dlc(&[
        "run",
        &small,
        "--backend",
        "loop",
        "--random-inputs",
        "0",
        "--max-work",
        "1e7",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    fails_with(
        &dlc(&["run", &small, "--random-inputs", "0", "--max-work", "0"]),
        "--max-work must be a positive number",
    );
    // Folding a constant operand must not run it at compile time.
    let folded = d.file(
        "folded.dl",
        "op s[N](x: f32[N]) -> f32[N] { out[i] = sum[k in 0..10000000000000](x[k]); }\n\
         fn f(y: f32[4]) -> f32[4] { return s(ones([4])) + y; }\n",
    );
    let start = std::time::Instant::now();
    let o = dlc(&["compile", &folded]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        start.elapsed().as_secs() < 60,
        "compile took {:?}",
        start.elapsed()
    );
}

/// `dlc run MODEL --random-inputs SEED --check --save-inputs DIR`, which
/// must succeed.
fn run_checked_saving_inputs(model: &str, seed: &str, dir: &Path) -> Output {
    let dir = dir.to_str().unwrap();
    let o = dlc(&[
        "run",
        model,
        "--random-inputs",
        seed,
        "--check",
        "--save-inputs",
        dir,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    o
}

/// The smaller traps: every error line starts with `error:`, output
/// directories are checked before the model runs, random inputs stay in
/// their ops' domains and can be saved, integers and booleans print as such,
/// an object file can go to standard output.
#[test]
fn small_traps_are_closed() {
    let d = Dir::new("traps");
    // Missing files and unwritable directories: `error:` lines, exit 1.
    let o = dlc(&["check", "/no/such/model.dl"]);
    fails_with(&o, "/no/such/model.dl");
    assert!(stderr(&o).starts_with("error: "), "{}", stderr(&o));
    let model = d.file("m.dl", MODEL);
    let blocker = d.file("not-a-dir", "");
    let under_file = format!("{blocker}/out");
    for flag in ["--save-outputs", "--save-inputs"] {
        let o = dlc(&[
            "run",
            &model,
            "--entry",
            "affine",
            "--random-inputs",
            "0",
            flag,
            &under_file,
        ]);
        fails_with(&o, &under_file);
        assert!(stderr(&o).starts_with("error: "), "{}", stderr(&o));
        assert!(o.stdout.is_empty(), "ran before checking {flag}");
    }
    // Variances, square roots and logarithms get positive random inputs, so
    // the check compares numbers, not NaNs; the inputs can be saved and
    // reused.
    let domain = d.file(
        "domain2.dl",
        "fn f(x: f32[2, 3, 4, 4], m: f32[3], v: f32[3], g: f32[3], b: f32[3], s: f32[4], t: f32[3, 2]) -> f32[2, 3, 4, 4] {\n\
         \x20   let u = slice(transpose(t), axis=0, start=0, end=1);\n\
         \x20   return batchnorm(x, m, v, g, b) * sqrt(s) + sum(log(u));\n}\n",
    );
    let inputs = d.0.join("inputs");
    let o = run_checked_saving_inputs(&domain, "3", &inputs);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(!out.contains("NaN") && !stderr(&o).contains("NaN"), "{out}");
    for p in ["v", "s", "t"] {
        let t = HostTensor::read_npy(&inputs.join(format!("{p}.npy")), None).unwrap();
        assert!(t.data.iter().all(|&x| x > 0.0), "{p}: {:?}", t.data);
    }
    let x = HostTensor::read_npy(&inputs.join("x.npy"), None).unwrap();
    assert!(x.data.iter().any(|&v| v < 0.0), "x keeps its usual range");
    let mut again = vec!["run".to_string(), domain.clone()];
    for p in ["x", "m", "v", "g", "b", "s", "t"] {
        again.push("--input".into());
        again.push(format!("{p}={}", inputs.join(format!("{p}.npy")).display()));
    }
    let again: Vec<&str> = again.iter().map(String::as_str).collect();
    let o2 = dlc(&again);
    assert!(o2.status.success(), "{}", stderr(&o2));
    let last = |s: &str| s.lines().last().unwrap_or_default().to_string();
    assert_eq!(last(&String::from_utf8_lossy(&o2.stdout)), last(&out));
    // Weights of products and convolutions are scaled by 1/sqrt(fan-in),
    // as initializations are, so deep models (W7's 32 GRU steps) stay out
    // of chaos and pass --check.
    let weights = d.file(
        "weights.dl",
        "fn f(x: f32[4, 256], w: f32[8, 256], img: f32[1, 4, 6, 6], k: f32[2, 4, 3, 3]) -> (f32[4, 8], f32[1, 2, 4, 4]) {\n\
         \x20   return (x @ transpose(w), conv2d(img, k));\n}\n",
    );
    let saved = d.0.join("weights");
    run_checked_saving_inputs(&weights, "1", &saved);
    let largest = |p: &str| {
        let t = HostTensor::read_npy(&saved.join(format!("{p}.npy")), None).unwrap();
        t.data.iter().fold(0f64, |m, v| m.max(v.abs()))
    };
    assert!(
        largest("w") <= 1.0 / 16.0 && largest("w") > 0.03,
        "w: {}",
        largest("w")
    );
    assert!(
        largest("k") <= 1.0 / 6.0 && largest("k") > 0.1,
        "k: {}",
        largest("k")
    );
    assert!(
        largest("x") > 0.9 && largest("img") > 0.5,
        "activations keep [-1, 1)"
    );
    // Integers and booleans print as such.
    let ints = d.file(
        "ints.dl",
        "fn f(x: i32[3]) -> (i32[3], bool[3]) { return (x * 2, x > 1); }",
    );
    let xs = d.npy(
        "xs.npy",
        TensorType::new(DType::I32, vec![3]),
        &[1.0, 2.0, -3.0],
    );
    let o = dlc(&["run", &ints, "--input", &format!("x={xs}")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("out0: i32[3] = [2, 4, -6]  min -6 max 4 mean 0.000000"),
        "{out}"
    );
    assert!(
        out.contains("out1: bool[3] = [false, true, false]  1 true, 2 false"),
        "{out}"
    );
    // An object file on standard output.
    let o = dlc(&["compile", &model, "--emit", "obj", "-o", "-"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.starts_with(b"\x7fELF"), "not an object file");
    // Calibration checks its output before measuring.
    let start = std::time::Instant::now();
    fails_with(
        &dlc(&["calibrate", "-o", &format!("{under_file}/model.json")]),
        &under_file,
    );
    assert!(start.elapsed().as_secs() < 10);
}

/// Outside the repository, `dlc calibrate` writes `dlc-cost-model.json` in
/// the current directory.
#[test]
fn calibrate_writes_to_the_current_directory_outside_the_repository() {
    let d = Dir::new("calibrate");
    let o = Command::new(env!("CARGO_BIN_EXE_dlc"))
        .args(["calibrate", "--runs", "1"])
        .current_dir(&d.0)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(d.0.join("dlc-cost-model.json")).unwrap();
    assert!(text.contains("gemm_gflops"), "{text}");
}

/// An integer division by zero names its source place on every backend:
/// compiled code (in process, in a loop spread over threads, and through a
/// shared library's checked call) and the interpreters.
#[test]
fn run_time_errors_name_the_source_place() {
    let d = Dir::new("place");
    let src = d.file(
        "div.dl",
        "fn f(x: i32[64], y: i32[64]) -> i32[64] {\n    let s = x * 2;\n    let q = s / y;\n    return q + 1;\n}\n",
    );
    let place = format!("{src}:3:13");
    for backend in ["cpu", "interp", "loop", "tile"] {
        // Random integers in [-10, 10]: some divisor of 64 is zero.
        let o = dlc(&["run", &src, "--backend", backend, "--random-inputs", "0"]);
        fails_with(&o, &format!("integer division by zero at {place}"));
    }
    let so = d.0.join("libdiv.so");
    let o = dlc(&["compile", &src, "--emit", "so", "-o", so.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lib = dlc_runtime::SharedLibrary::open(&so).unwrap();
    let f = lib.kernel("dlc_div_f").unwrap();
    let ints = |v: Vec<f64>| HostTensor::new(TensorType::new(DType::I32, vec![64]), v).unwrap();
    let err = f
        .call(&[ints(vec![1.0; 64]), ints((0..64).map(f64::from).collect())])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!("`dlc_div_f`: integer division by zero at {place}")
    );
    let ok = f.call(&[ints(vec![3.0; 64]), ints(vec![2.0; 64])]).unwrap();
    assert!(ok[0].data.iter().all(|&v| v == 4.0), "{:?}", ok[0].data);
    // Saturation rewrites the function (`x @ a + x @ b` becomes
    // `x @ (a + b)`): the ops it rebuilds keep their places.
    let sat = d.file(
        "sat.dl",
        "fn f(x: f32[64, 64], a: f32[64, 64], b: f32[64, 64], y: i32[64], z: i32[64]) -> (f32[64, 64], i32[64]) {\n    let p = x @ a + x @ b;\n    let q = (y * 2) / z;\n    return (p, q + 1);\n}\n",
    );
    let graph = dlc(&["compile", &sat, "--emit", "graph"]);
    let graph = String::from_utf8_lossy(&graph.stdout);
    assert!(
        graph.contains("graph.add %a, %b"),
        "saturation no longer rewrites the test's function:\n{graph}"
    );
    for backend in ["cpu", "loop", "tile"] {
        let o = dlc(&["run", &sat, "--backend", backend, "--random-inputs", "0"]);
        fails_with(&o, &format!("integer division by zero at {sat}:3:13"));
    }
    // A 40 GB intermediate: the allocation fails, and says where.
    let oom = d.file(
        "oom.dl",
        "fn f(x: f32[100000]) -> f32[100000] {\n    let b = broadcast(x, [100000, 100000]);\n    return sum(b * b + b, axis=1);\n}\n",
    );
    fails_with(
        &dlc(&["run", &oom, "--random-inputs", "0"]),
        &format!("`f`: out of memory allocating a buffer at {oom}:2:13"),
    );
}

/// `--emit lib` writes a static archive (one object, with a symbol index)
/// that a C program links like the object file.
#[test]
fn static_libraries_link_into_a_c_program() {
    let d = Dir::new("lib");
    let model = d.file("m.dl", MODEL);
    let lib = d.0.join("libm_model.a");
    emit_to(&model, "lib", &lib);
    fails_with(&dlc(&["compile", &model, "--emit", "lib"]), "give -o FILE");
    // Written again over the old archive: still one member.
    emit_to(&model, "lib", &lib);
    let members = Command::new("ar").arg("t").arg(&lib).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&members.stdout).lines().count(), 1);
    let (_, h) = emit_object_and_header(&d, &model, "model", &[]);
    assert!(h.contains("dlc_m_affine"), "{h}");
    let main = d.file("main.c", C_MAIN);
    check_affine_output(
        &run_c_program(&d, "main_lib", &main, &lib, &["-lm", "-lgomp"]),
        "main_lib",
    );
}

/// Two models with entry points of the same name, each compiled to a
/// static library with its header, link into one C program: their symbols
/// (and their internal workspace caches) carry each model's prefix.
#[test]
fn two_models_link_into_one_program() {
    let d = Dir::new("two");
    let affine = |op: &str| {
        format!(
            "fn affine(x: f32[2, 3], w: f32[3, 2], b: f32[2]) -> f32[2, 2] {{ return x @ w {op} b; }}\n"
        )
    };
    for (stem, op) in [("plus", "+"), ("minus", "-")] {
        let model = d.file(&format!("{stem}.dl"), affine(op));
        for (emit, file) in [
            ("lib", format!("lib{stem}.a")),
            ("header", format!("{stem}.h")),
        ] {
            let path = d.0.join(file);
            emit_to(&model, emit, &path);
        }
    }
    let main = d.file(
        "main.c",
        r#"
#include <stdio.h>
#include "plus.h"
#include "minus.h"

int main(void) {
    float x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, 0, 0, 1, 1, 1}, b[2] = {10, 20};
    float p[4], m[4];
    if (dlc_plus_affine(x, w, b, p) != DLC_OK || dlc_minus_affine(x, w, b, m) != DLC_OK) {
        return 1;
    }
    for (int i = 0; i < 4; i++) {
        printf("%g %g\n", p[i], m[i]);
    }
    return 0;
}
"#,
    );
    let exe = d.0.join("both");
    let cc = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&main)
        .arg(d.0.join("libplus.a"))
        .arg(d.0.join("libminus.a"))
        .args(["-lm", "-lgomp"])
        .output()
        .unwrap();
    assert!(cc.status.success(), "{}", stderr(&cc));
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success(), "{}", stderr(&run));
    // x @ w = [[4, 5], [10, 11]]; plus adds b, minus subtracts it.
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "14 -6\n25 -15\n20 0\n31 -9\n"
    );
}

/// `--cpu CPU` compiles for an x86-64 level or an LLVM CPU: the object for
/// `x86-64-v3` (and `haswell`) uses no AVX-512 register, the one for
/// `x86-64-v2` no AVX one and the one for `x86-64` no SSE4.1 blend either
/// (checked in the disassembly); each computes the right results in a C
/// program, and a packed product compiled for every CPU this machine runs
/// agrees with this machine's.
#[test]
fn objects_for_a_cpu_level_use_only_its_instructions() {
    let d = Dir::new("cpu");
    // A product large enough for the packed kernel, and the C_MAIN model.
    let model = d.file(
        "m.dl",
        format!(
            "{MODEL}\nfn big(x: f32[64, 96], w: f32[96, 80]) -> f32[64, 80] {{ return tanh(x @ w); }}\n"
        ),
    );
    let (_, h) = emit_object_and_header(&d, &model, "model", &[]);
    assert!(h.contains("dlc_m_affine"), "{h}");
    let main = d.file("main.c", C_MAIN);
    for (level, absent) in [
        ("x86-64-v3", &["%zmm"][..]),
        ("x86-64-v2", &["%zmm", "%ymm"][..]),
        // SSE2 only: no SSE4.1 blend either.
        ("x86-64", &["%zmm", "%ymm", "blendv"][..]),
        ("haswell", &["%zmm"][..]),
    ] {
        let obj = d.0.join(format!("{level}.o"));
        let o = dlc(&[
            "compile",
            &model,
            "--emit",
            "obj",
            "--cpu",
            level,
            "-o",
            obj.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{level}: {}", stderr(&o));
        let dis = Command::new("objdump")
            .arg("-d")
            .arg(&obj)
            .output()
            .expect("objdump (binutils, installed by `make setup`)");
        let text = String::from_utf8_lossy(&dis.stdout);
        assert!(text.contains("dlc_m_big"), "{level}: no disassembly");
        for what in absent {
            assert!(!text.contains(what), "{level} uses {what}");
        }
        check_affine_output(
            &run_c_program(&d, level, &main, &obj, &["-lm", "-lgomp"]),
            level,
        );
    }
    // The packed product and tanh in vectors of each level's width agree
    // with this machine's code.
    let x: Vec<f64> = (0..64 * 96)
        .map(|i| ((i * 37 % 101) as f64 - 50.0) / 40.0)
        .collect();
    let w: Vec<f64> = (0..96 * 80)
        .map(|i| ((i * 53 % 89) as f64 - 44.0) / 300.0)
        .collect();
    let args = [
        HostTensor::new(f32ty(&[64, 96]), x).unwrap(),
        HostTensor::new(f32ty(&[96, 80]), w).unwrap(),
    ];
    let big = |level: &str| -> Vec<f64> {
        let so = d.0.join(format!("lib{level}.so"));
        let o = dlc(&[
            "compile",
            &model,
            "--emit",
            "so",
            "--cpu",
            level,
            "-o",
            so.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{level}: {}", stderr(&o));
        let lib = dlc_runtime::SharedLibrary::open(&so).unwrap();
        lib.kernel("dlc_m_big").unwrap().call(&args).unwrap()[0]
            .data
            .clone()
    };
    let native = big("native");
    let mut levels = vec!["x86-64", "x86-64-v2", "x86-64-v3", "haswell"];
    // AVX-512 code runs only where the CPU has it.
    if std::arch::is_x86_feature_detected!("avx512f") {
        levels.extend(["x86-64-v4", "skylake-avx512"]);
    }
    for level in levels {
        let got = big(level);
        for (g, n) in got.iter().zip(&native) {
            assert!(
                (g - n).abs() <= 1e-5 * n.abs().max(1.0),
                "{level}: {g} vs {n}"
            );
        }
    }
    // The header says which CPUs the code runs on.
    let h = dlc(&["compile", &model, "--emit", "header", "--cpu", "x86-64-v3"]);
    assert!(
        String::from_utf8_lossy(&h.stdout)
            .contains("Compiled for x86-64-v3: it runs on any x86-64 CPU of that level."),
        "{}",
        String::from_utf8_lossy(&h.stdout)
    );
    fails_with(
        &dlc(&[
            "compile", &model, "--emit", "obj", "--cpu", "pentium9", "-o", "-",
        ]),
        "unknown CPU `pentium9` (known: native, x86-64, x86-64-v2, x86-64-v3, x86-64-v4, or an \
         LLVM CPU name: nehalem, sandybridge,",
    );
}

/// The target is an argument: the same source and `--target` give the same
/// graph and loop IR whatever machine compiles it (here, this machine taken
/// as three x86-64 levels through `DLC_CPU`), for both x86-64 vector widths
/// and a GPU; and the targets' IR differ where their rules do (the Winograd
/// kernel transform runs over a vector of the target's: 16 output channels
/// at a time on AVX-512, 8 on AVX2). Saturation runs with time limits no
/// run reaches (its node and iteration limits bind), so that a loaded
/// machine stopping it early cannot change the graph.
/// The default pipeline with time limits no example reaches.
const UNTIMED_PIPELINE: &str = "graph.canonicalize,\
    graph.saturate{time-limit-ms=600000,ilp-time-limit-ms=600000},graph.inline,graph.canonicalize,\
    graph.saturate{time-limit-ms=600000,ilp-time-limit-ms=600000},graph.canonicalize,graph.dce";

#[test]
fn the_loop_ir_depends_on_the_target_not_the_host() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/");
    let out = |o: Output| -> String {
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let mut per_target = Vec::new();
    for target in ["x86-64-avx512", "x86-64-avx2", "sm_90"] {
        let mut texts = Vec::new();
        for (file, entry) in [
            ("w3_conv_block.dl", "conv_block_b1"),
            ("w4_attention.dl", "attention"),
            ("w5_layernorm_gelu.dl", "layernorm_gelu"),
        ] {
            let path = format!("{root}{file}");
            let args = |emit: &'static str| {
                [
                    "compile",
                    &path,
                    "--entry",
                    entry,
                    "--emit",
                    emit,
                    "--target",
                    target,
                    "--passes",
                    UNTIMED_PIPELINE,
                ]
                .map(str::to_string)
            };
            let mut seen = Vec::new();
            for cpu in ["native", "x86-64-v3", "x86-64-v2"] {
                let env = [("DLC_CPU", cpu)];
                let run = |emit| {
                    let a = args(emit);
                    let a: Vec<&str> = a.iter().map(String::as_str).collect();
                    out(dlc_with_env(&env, &a))
                };
                seen.push(run("graph") + &run("loop"));
            }
            assert!(
                seen.iter().all(|t| *t == seen[0]),
                "{file} for {target}: the IR depends on the compiling machine"
            );
            texts.push(seen.swap_remove(0));
        }
        per_target.push(texts);
    }
    let (avx512, avx2) = (&per_target[0][0], &per_target[1][0]);
    assert!(
        avx512.contains("loop.for {lo = 0, hi = 16, step = 1}"),
        "{avx512}"
    );
    assert!(
        avx2.contains("loop.for {lo = 0, hi = 8, step = 1}") && avx512 != avx2,
        "{avx2}"
    );
}

/// `DLC_CPU` makes `native` mean another CPU for the whole process: code
/// for `native` is that CPU's (AVX2 vectors under `x86-64-v3`, whatever this
/// machine has), its schedules are that CPU's, and every back end runs on it
/// (bf16 through MLIR's lowering too, which has no conversion routine to call
/// on a CPU without bf16 instructions). A CPU this machine cannot run, or
/// one `--cpu` does not know, is an error before anything else.
#[test]
fn dlc_cpu_makes_native_another_cpu() {
    let d = Dir::new("dlc-cpu");
    let model = d.file(
        "m.dl",
        "fn big(x: f32[64, 96], w: f32[96, 80]) -> f32[64, 80] { return tanh(x @ w); }\n\
         fn narrow(x: f32[5, 16], b: bf16[16]) -> (bf16[5, 16], bf16[16]) { \
         return (cast(x, bf16) * b + 1.0, silu(b) - floor(b * 2.0)); }\n",
    );
    let v3 = [("DLC_CPU", "x86-64-v3")];
    let out = |o: Output| -> String {
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let asm = out(dlc_with_env(&v3, &["compile", &model, "--emit", "asm"]));
    assert!(asm.contains("%ymm") && !asm.contains("%zmm"), "{asm}");
    let header = out(dlc_with_env(&v3, &["compile", &model, "--emit", "header"]));
    assert!(
        header.contains("Compiled for x86-64-v3: it runs on any x86-64 CPU of that level."),
        "{header}"
    );
    // The schedules are the CPU's: AVX2's register tile is 6 x 16 f32.
    let tiles = out(dlc_with_env(
        &v3,
        &["compile", &model, "--emit", "tile", "--entry", "big"],
    ));
    assert_eq!(
        tiles,
        out(dlc(&[
            "compile",
            &model,
            "--emit",
            "tile",
            "--entry",
            "big",
            "--target",
            "x86-64-avx2"
        ])),
    );
    for backend in ["cpu", "mlir", "mlir-tile", "tile", "loop"] {
        for entry in ["big", "narrow"] {
            let o = dlc_with_env(
                &v3,
                &[
                    "run",
                    &model,
                    "--backend",
                    backend,
                    "--entry",
                    entry,
                    "--random-inputs",
                    "1",
                    "--check",
                ],
            );
            assert!(
                out(o).contains("check: ok: out0"),
                "{backend} {entry} under DLC_CPU=x86-64-v3"
            );
        }
    }
    // `native` (or nothing) is this machine.
    let native = |value: &str| {
        out(dlc_with_env(
            &[("DLC_CPU", value)],
            &["compile", &model, "--emit", "header"],
        ))
    };
    assert!(
        native("native").contains("Compiled for the CPU of the machine that compiled it"),
        "{}",
        native("native")
    );
    assert_eq!(native("native"), native(""));
    fails_with(
        &dlc_with_env(&[("DLC_CPU", "pentium9")], &["check", &model]),
        "DLC_CPU=pentium9: unknown CPU `pentium9`",
    );
    // AVX-512 stands for this machine only where it has AVX-512.
    let v4 = dlc_with_env(
        &[("DLC_CPU", "x86-64-v4")],
        &["compile", &model, "--emit", "asm", "--entry", "big"],
    );
    if std::arch::is_x86_feature_detected!("avx512f") {
        assert!(out(v4).contains("%zmm"));
    } else {
        fails_with(&v4, "DLC_CPU=x86-64-v4: this machine's CPU lacks avx512f");
    }
}

/// `--target aarch64-linux-gnu` cross-compiles: the object is AArch64 ELF
/// (its machine field) and its code uses Advanced SIMD multiply-adds; a
/// shared library, which this machine's linker cannot make for it, and an
/// x86-64 level with it are refused with a reason.
#[test]
fn objects_cross_compile_for_aarch64() {
    let d = Dir::new("arm");
    let model = d.file(
        "m.dl",
        "fn big(x: f32[64, 96], w: f32[96, 80]) -> f32[64, 80] { return tanh(x @ w); }\n",
    );
    let obj = d.0.join("m.o");
    let args = ["compile", &model, "--target", "aarch64-linux-gnu", "--emit"];
    let o = dlc(&[&args[..], &["obj", "-o", obj.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&obj).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF");
    // e_machine, little-endian: EM_AARCH64 is 183.
    assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 183);
    let asm = dlc(&[&args[..], &["asm"]].concat());
    assert!(String::from_utf8_lossy(&asm.stdout).contains("fmla"));
    let so = d.0.join("libm.so");
    fails_with(
        &dlc(&[&args[..], &["so", "-o", so.to_str().unwrap()]].concat()),
        "cannot link for aarch64-unknown-linux-gnu: make an object file or a static library",
    );
    fails_with(
        &dlc(&[
            &args[..],
            &["obj", "--cpu", "x86-64-v3", "-o", obj.to_str().unwrap()],
        ]
        .concat()),
        "--cpu x86-64-v3 is an x86-64 CPU",
    );
}

/// `--emit mlir` prints the loop level in upstream dialects, which
/// `mlir-opt` reads with no unregistered dialect; `--backend mlir` runs it
/// through MLIR's own lowering and passes `--check`; a zero divisor there is
/// an error, not a crash.
#[test]
fn the_mlir_back_end_emits_upstream_mlir_and_runs_checked() {
    let d = Dir::new("mlir");
    let model = d.file(
        "m.dl",
        "fn f(x: f32[8, 16], w: f32[16, 4]) -> f32[8, 4] { return tanh(x @ w) + 1.0; }\n\
         fn g(a: i32[4], b: i32[4]) -> i32[4] { return a / b; }\n",
    );
    let o = dlc(&["compile", &model, "--emit", "mlir", "--entry", "f"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        text.contains("func.func @f(%arg0: memref<8x16xf32>"),
        "{text}"
    );
    assert!(
        text.contains("math.tanh") && !text.contains("loop."),
        "{text}"
    );
    if let Some(tool) = dlc_tests::mlir_opt() {
        dlc_tests::mlir_parses_upstream(&tool, &text).unwrap();
    }
    let run = |entry: &str, inputs: &[&str]| {
        let mut args = vec![
            "run",
            &model,
            "--backend",
            "mlir",
            "--entry",
            entry,
            "--check",
        ];
        for i in inputs {
            args.extend(["--input", i]);
        }
        if inputs.is_empty() {
            args.extend(["--random-inputs", "3"]);
        }
        dlc(&args)
    };
    let o = run("f", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("check: ok: out0"));
    // The tile kernels too: printed in upstream dialects, and run.
    let o = dlc(&["compile", &model, "--emit", "mlir-tile", "--entry", "f"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        text.contains("scf.parallel") && text.contains("tensor.generate"),
        "{text}"
    );
    if let Some(tool) = dlc_tests::mlir_opt() {
        dlc_tests::mlir_parses_upstream(&tool, &text).unwrap();
    }
    let o = dlc(&[
        "run",
        &model,
        "--backend",
        "mlir-tile",
        "--entry",
        "f",
        "--check",
        "--random-inputs",
        "4",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("check: ok: out0"));
    let ty =
        |v: [f64; 4]| HostTensor::new(TensorType::new(DType::I32, vec![4]), v.to_vec()).unwrap();
    let (a, b) = (d.0.join("a.npy"), d.0.join("b.npy"));
    ty([1.0, 2.0, 3.0, 4.0]).write_npy(&a).unwrap();
    ty([1.0, 0.0, 1.0, 1.0]).write_npy(&b).unwrap();
    let (a, b) = (format!("a={}", a.display()), format!("b={}", b.display()));
    fails_with(&run("g", &[&a, &b]), "@g: integer division by zero");
}

const TRAINABLE: &str = "
op mm_t[M, N, K](a: f32[K, M], b: f32[K, N]) -> f32[M, N] {
    out[i, j] = sum[k](a[k, i] * b[k, j]);
}

fn loss(x: f32[2, 3, 12, 12], weight w1: f32[4, 3, 3, 3], weight w2: f32[36, 5],
        weight b2: f32[5]) -> f32 {
    let h = maxpool2d(relu(conv2d(x, w1, stride=2, padding=1)), kernel=2, stride=2);
    let z = tanh(mm_t(transpose(reshape(h, [2, 36]), [1, 0]), w2) + b2);
    return mean(z * z);
}
";

/// `dlc grad`: the value and the gradients of an entry point, compiled
/// for this CPU and checked against the reference interpreter, saved as
/// `out0.npy` and `grad_NAME.npy`; by default with respect to the
/// weights.
#[test]
fn grad_runs_the_gradient_and_saves_it_by_parameter_name() {
    let d = Dir::new("grad");
    let model = d.file("m.dl", TRAINABLE);
    let out = d.0.join("out");
    let o = dlc(&[
        "grad",
        &model,
        "--random-inputs",
        "7",
        "--check",
        "--save-outputs",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for name in ["out0", "grad_w1", "grad_w2", "grad_b2"] {
        assert!(text.contains(&format!("{name}: f32")), "{text}");
    }
    assert_eq!(text.matches("check: ok").count(), 4, "{text}");
    let value = HostTensor::read_npy(&out.join("out0.npy"), None).unwrap();
    assert_eq!(value.ty, f32ty(&[]));
    let w1 = HostTensor::read_npy(&out.join("grad_w1.npy"), None).unwrap();
    assert_eq!(w1.ty, f32ty(&[4, 3, 3, 3]));
    assert!(w1.data.iter().any(|&g| g != 0.0));
    assert!(!out.join("grad_x.npy").exists());

    // The same gradient with respect to the input, on the interpreter.
    let o = dlc(&[
        "grad",
        &model,
        "--random-inputs",
        "7",
        "--wrt",
        "x,b2",
        "--backend",
        "interp",
        "--save-outputs",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let x = HostTensor::read_npy(&out.join("grad_x.npy"), None).unwrap();
    assert_eq!(x.ty, f32ty(&[2, 3, 12, 12]));
}

/// A bias before a batch normalization has a gradient that is zero in
/// real arithmetic: rounding noise on both sides, which `--check` compares
/// on the other gradients' scale rather than failing on its own.
#[test]
fn grad_check_takes_a_zero_gradient_for_what_it_is() {
    let d = Dir::new("grad-zero");
    let model = d.file(
        "m.dl",
        "fn loss(x: f32[16, 8, 6, 6], weight w: f32[8, 8, 3, 3], weight c: f32[8], weight g: f32[8],
                 weight b: f32[8], rm: f32[8], rv: f32[8]) -> f32 {
            let h = conv2d(x, w, padding=1) + reshape(c, [1, 8, 1, 1]);
            let (y, rm2, rv2) = batchnorm_train(h, g, b, rm, rv);
            return mean(y * y * y);
        }",
    );
    let o = dlc(&["grad", &model, "--random-inputs", "0", "--check"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.matches("check: ok").count(), 5, "{text}");
    // Each gradient named as its file would be.
    assert!(text.contains("check: ok: grad_c (f32[8])"), "{text}");
}

#[test]
fn grad_errors_name_what_is_wrong() {
    let d = Dir::new("grad-errors");
    let model = d.file("m.dl", TRAINABLE);
    fails_with(
        &dlc(&["grad", &model, "--random-inputs", "1", "--wrt", "q"]),
        "@loss has no parameter `q`; its parameters: x, w1, w2, b2",
    );
    let vector = d.file("v.dl", "fn f(x: f32[4]) -> f32[4] { return x * 2.0; }");
    fails_with(
        &dlc(&["grad", &vector, "--random-inputs", "1"]),
        "the differentiated result must be a float scalar, got f32[4]",
    );
    let ints = d.file(
        "i.dl",
        "fn f(x: f32[4], n: i32[4]) -> f32 { return sum(x * cast(n, f32)); }",
    );
    fails_with(
        &dlc(&["grad", &ints, "--random-inputs", "1", "--wrt", "n"]),
        "parameter `n` is i32[4]; only float values have gradients",
    );
}

/// `dlc train --save-weights FILE.safetensors` writes one file whose tensors
/// are the .npy files `--save-weights DIR` writes, bit for bit; `dlc run`
/// evaluates it and `dlc train --weights FILE.safetensors` starts from it.
#[test]
fn train_saves_and_starts_from_a_safetensors_file() {
    let d = Dir::new("train-safetensors");
    let root = dlc_tests::repo_root();
    let data = root.join("examples/train/data");
    let model = root.join("examples/train/digits_mlp.dl");
    let (model, dx, dy) = (
        model.to_str().unwrap().to_string(),
        format!("x={}", data.join("digits_train_x.npy").display()),
        format!("y={}", data.join("digits_train_y.npy").display()),
    );
    let train = |extra: &[&str]| {
        let mut args = vec![
            "train",
            &model,
            "--entry",
            "loss",
            "--data",
            &dx,
            "--data",
            &dy,
            "--optimizer",
            "adam",
            "--lr",
            "0.003",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = dlc(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let first: serde_json::Value =
            serde_json::from_str(text.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
        first["loss"].as_f64().unwrap()
    };
    let (file, dir) = (d.path("w.safetensors"), d.0.join("w"));
    let scratch = train(&["--epochs", "2", "--save-weights", &file]);
    train(&["--epochs", "2", "--save-weights", dir.to_str().unwrap()]);
    let saved = dlc_driver::read_safetensors(Path::new(&file)).unwrap();
    assert_eq!(saved.tensors.len(), 4);
    for (name, t) in &saved.tensors {
        let npy = HostTensor::read_npy(&dir.join(format!("{name}.npy")), None).unwrap();
        assert_eq!(t, &npy, "{name}");
    }
    assert!(digits_accuracy(&model, Path::new(&file), &[]) > 0.8);
    let resumed = train(&["--epochs", "1", "--weights", &file]);
    assert!(
        resumed < scratch / 2.0,
        "from the trained weights {resumed}, from scratch {scratch}"
    );
}

/// `--weights PATH` binds a model's weights from a directory of NAME.npy
/// or a .safetensors file for `dlc run` and `dlc bench`, and builds them
/// into what `dlc compile` makes; a missing, mistyped or unreadable weight
/// is an error that names it.
#[test]
fn weights_from_files_are_run_benched_and_built_in() {
    let d = Dir::new("weights");
    let model = d.file(
        "m.dl",
        "fn predict(x: f32[2, 3], weight w: f32[3, 2], weight b: f32[2]) -> f32[2, 2] {
            return x @ w + b;
        }",
    );
    let x = d.npy("x.npy", f32ty(&[2, 3]), &[1.0, 2.0, 3.0, -1.0, 0.5, 0.0]);
    let w: Vec<f64> = (0..6).map(|i| f64::from(i) / 4.0 - 0.5).collect();
    let b = [0.25, -2.0];
    let rows = [[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0]];
    let mut want = Vec::new();
    for r in &rows {
        for j in 0..2 {
            want.push((0..3).map(|k| r[k] * w[k * 2 + j]).sum::<f64>() + b[j]);
        }
    }
    std::fs::create_dir_all(d.0.join("dir")).unwrap();
    d.npy("dir/w.npy", f32ty(&[3, 2]), &w);
    d.npy("dir/b.npy", f32ty(&[2]), &b);
    // A safetensors file as `dlc train`'s checkpoint names a weight
    // (`weight.w`) and as other tools do (`b`).
    let tensors = [
        ("weight.w", f32ty(&[3, 2]), w.clone()),
        ("b", f32ty(&[2]), b.to_vec()),
    ];
    let write = |name: &str, tensors: &[(&str, TensorType, Vec<f64>)]| {
        let bytes: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, ty, v)| {
                HostTensor::new(ty.clone(), v.clone())
                    .unwrap()
                    .to_le_bytes()
            })
            .collect();
        let views = tensors.iter().zip(&bytes).map(|((n, ty, _), b)| {
            let dtype = dlc_driver::safetensors_dtype(ty.dtype);
            let view = safetensors::tensor::TensorView::new(dtype, ty.shape.clone(), b);
            (n.to_string(), view.unwrap())
        });
        let path = d.0.join(name);
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
        path.to_str().unwrap().to_string()
    };
    let st = write("m.safetensors", &tensors);
    for source in [d.path("dir"), st.clone()] {
        let out = d.0.join("out");
        let o = dlc(&[
            "run",
            &model,
            "--input",
            &format!("x={x}"),
            "--weights",
            &source,
            "--check",
            "--save-outputs",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{source}: {}", stderr(&o));
        let got = HostTensor::read_npy(&out.join("out0.npy"), None).unwrap();
        for (g, w) in got.data.iter().zip(&want) {
            assert!(
                (g - w).abs() < 1e-6,
                "{source}: {:?} against {want:?}",
                got.data
            );
        }
    }
    let o = dlc(&["bench", &model, "--weights", &st, "--runs", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("weights from --weights"));

    // Built in: the weights are constants, not parameters.
    let o = dlc(&["compile", &model, "--weights", &d.path("dir")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("@predict(%x: f32[2, 3]) -> f32[2, 2]"),
        "{text}"
    );
    assert!(text.contains("value = [0.25, -2.0]"), "{text}");
    let lib = d.path("m.so");
    let o = dlc(&[
        "compile",
        &model,
        "--weights",
        &st,
        "--emit",
        "so",
        "-o",
        &lib,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Weights large enough to be packed: the library packs its built-in
    // `v` on its first call and keeps it; the caller passes `x` alone, and
    // the header names no preparer.
    let big = d.file(
        "big.dl",
        "fn predict(x: f32[32, 64], weight v: f32[64, 48]) -> f32[32, 48] { return x @ v; }",
    );
    std::fs::create_dir_all(d.0.join("big")).unwrap();
    let v: Vec<f64> = (0..64 * 48)
        .map(|i| f64::from(i % 13) / 8.0 - 0.75)
        .collect();
    d.npy("big/v.npy", f32ty(&[64, 48]), &v);
    let xs: Vec<f64> = (0..32 * 64).map(|i| f64::from(i % 7) / 4.0 - 0.5).collect();
    let xs = HostTensor::new(f32ty(&[32, 64]), xs).unwrap();
    let want: Vec<f64> = (0..32 * 48)
        .map(|e| {
            (0..64)
                .map(|k| xs.data[e / 48 * 64 + k] * v[k * 48 + e % 48])
                .sum()
        })
        .collect();
    let built = |emit: &str| {
        let o = dlc(&["compile", &big, "--weights", &d.path("big"), "--emit", emit]);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let tile = built("tile");
    assert!(
        tile.contains("tile.prepared {func = \"predict_prepare\""),
        "{tile}"
    );
    let h = built("header");
    assert!(
        h.contains("int32_t dlc_big_predict(const float *x, float *out0);")
            && !h.contains("prepare"),
        "{h}"
    );
    let so = d.path("big.so");
    let o = dlc(&[
        "compile",
        &big,
        "--weights",
        &d.path("big"),
        "--emit",
        "so",
        "-o",
        &so,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let so = dlc_runtime::SharedLibrary::open(std::path::Path::new(&so)).unwrap();
    let predict = so.kernel("dlc_big_predict").unwrap();
    for _ in 0..3 {
        let got = predict.call(std::slice::from_ref(&xs)).unwrap();
        for (g, w) in got[0].data.iter().zip(&want) {
            assert!((g - w).abs() < 1e-4, "{:?} against {want:?}", got[0].data);
        }
    }

    std::fs::remove_file(d.0.join("dir/b.npy")).unwrap();
    fails_with(
        &dlc(&[
            "run",
            &model,
            "--random-inputs",
            "0",
            "--weights",
            &d.path("dir"),
        ]),
        "no value for weight `b`",
    );
    let f64s = write(
        "f64.safetensors",
        &[("w", TensorType::new(DType::F64, vec![3, 2]), w.clone())],
    );
    fails_with(
        &dlc(&["bench", &model, "--weights", &f64s]),
        "`w` is f32[3, 2], but tensor `w` of",
    );
    let only_w = write("w.safetensors", &tensors[..1]);
    fails_with(
        &dlc(&["compile", &model, "--weights", &only_w]),
        "no value for weight `b` (tensor `b` or `weight.b` of",
    );
    fails_with(
        &dlc(&["run", &model, "--random-inputs", "0", "--weights", &x]),
        "neither a directory of NAME.npy nor a .safetensors file",
    );
    let junk = d.file("junk.safetensors", "not safetensors");
    fails_with(
        &dlc(&["run", &model, "--random-inputs", "0", "--weights", &junk]),
        "not a safetensors file",
    );
    let plain = d.file("p.dl", "fn f(x: f32[2]) -> f32[2] { return x; }");
    fails_with(
        &dlc(&["compile", &plain, "--weights", &st]),
        "no entry point declares `weight` parameters",
    );
}

/// A linear regression to train in `d`: `m.dl` (the mean squared error of
/// `x @ w + b` against `y`, 8 examples of 3 features) and its data `xs`
/// and `ys` as `x.npy` and `y.npy`. Returns the model's path and the two
/// `--data` arguments.
fn linear_regression(d: &Dir, xs: &[f64], ys: &[f64]) -> (String, String, String) {
    let model = d.file(
        "m.dl",
        "fn loss(x: f32[8, 3], y: f32[8], weight w: f32[3], weight b: f32) -> f32 {
            return mse_loss(x @ w + b, y);
        }",
    );
    let x = d.npy("x.npy", f32ty(&[8, 3]), xs);
    let y = d.npy("y.npy", f32ty(&[8]), ys);
    (model, format!("x={x}"), format!("y={y}"))
}

/// `dlc train` runs the compiled step batch after batch, each step's
/// weights the previous step's results: three full-batch steps of SGD on a
/// linear regression end where the update rule, applied here in f64, ends.
#[test]
fn train_steps_follow_the_update_rule() {
    let d = Dir::new("train-rule");
    let xs: Vec<f64> = (0..24).map(|i| f64::from(i * 7 % 11 - 5) / 4.0).collect();
    let ys: Vec<f64> = (0..8).map(|i| f64::from(i) / 3.0 - 1.0).collect();
    let (model, x, y) = linear_regression(&d, &xs, &ys);
    let init = d.0.join("init");
    std::fs::create_dir_all(&init).unwrap();
    let w0 = [0.5, -0.25, 0.125];
    d.npy("init/w.npy", f32ty(&[3]), &w0);
    d.npy("init/b.npy", f32ty(&[]), &[0.25]);
    let out = d.0.join("trained");
    let o = dlc(&[
        "train",
        &model,
        "--data",
        &x,
        "--data",
        &y,
        "--epochs",
        "3",
        "--lr",
        "0.1",
        "--weights",
        init.to_str().unwrap(),
        "--save-weights",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("epoch 3/3: loss"), "{text}");
    // The update, in f64: w -= lr * 2/N * xᵀ(xw + b - y), b likewise.
    let (mut w, mut b) = (w0.to_vec(), 0.25);
    for _ in 0..3 {
        let r: Vec<f64> = (0..8)
            .map(|i| (0..3).map(|j| xs[i * 3 + j] * w[j]).sum::<f64>() + b - ys[i])
            .collect();
        let gw: Vec<f64> = (0..3)
            .map(|j| (0..8).map(|i| 2.0 / 8.0 * r[i] * xs[i * 3 + j]).sum())
            .collect();
        let gb: f64 = r.iter().map(|v| 2.0 / 8.0 * v).sum();
        for j in 0..3 {
            w[j] -= 0.1 * gw[j];
        }
        b -= 0.1 * gb;
    }
    let got_w = HostTensor::read_npy(&out.join("w.npy"), None).unwrap();
    let got_b = HostTensor::read_npy(&out.join("b.npy"), None).unwrap();
    for (g, e) in got_w
        .data
        .iter()
        .chain(&got_b.data)
        .zip(w.iter().chain([&b]))
    {
        assert!(
            (g - e).abs() < 1e-5,
            "trained {:?} {:?}, the rule gives {w:?} {b}",
            got_w.data,
            got_b.data
        );
    }
}

/// The fraction of the digits test set the `accuracy` entry of `model`
/// classifies right with the weights `weights` (`dlc run --weights`; the
/// result saved in WEIGHTS.accuracy/), `extra` flags added.
fn digits_accuracy(model: &str, weights: &Path, extra: &[&str]) -> f64 {
    let data = dlc_tests::repo_root().join("examples/train/data");
    let x = format!("x={}", data.join("digits_test_x.npy").display());
    let y = format!("y={}", data.join("digits_test_y.npy").display());
    let out = format!("{}.accuracy", weights.display());
    let weights = weights.to_str().unwrap();
    let mut args = vec![
        "run",
        model,
        "--entry",
        "accuracy",
        "--weights",
        weights,
        "--input",
        &x,
        "--input",
        &y,
        "--save-outputs",
        &out,
    ];
    args.extend_from_slice(extra);
    let o = dlc(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    HostTensor::read_npy(&Path::new(&out).join("out0.npy"), None)
        .unwrap()
        .data[0]
}

/// The digits classifier of examples/train learns: after a few epochs of
/// Adam its test accuracy, measured by `dlc run --weights`, is above 0.9
/// (0.96 after 20 epochs: docs/performance.md); `--json` logs each epoch.
#[test]
fn train_learns_the_digits_and_run_evaluates_the_weights() {
    let d = Dir::new("train-digits");
    let root = dlc_tests::repo_root();
    let data = |f: &str| {
        root.join("examples/train/data")
            .join(f)
            .display()
            .to_string()
    };
    let model = root
        .join("examples/train/digits_mlp.dl")
        .display()
        .to_string();
    let out = d.0.join("trained");
    let o = dlc(&[
        "train",
        &model,
        "--entry",
        "loss",
        "--data",
        &format!("x={}", data("digits_train_x.npy")),
        "--data",
        &format!("y={}", data("digits_train_y.npy")),
        "--epochs",
        "6",
        "--optimizer",
        "adam",
        "--lr",
        "0.003",
        "--seed",
        "1",
        "--json",
        "--save-weights",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let epochs: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(epochs.len(), 6, "{text}");
    assert_eq!(epochs[5]["steps"], 6 * (1437 / 32));
    let first = epochs[0]["loss"].as_f64().unwrap();
    let last = epochs[5]["loss"].as_f64().unwrap();
    assert!(last < first / 4.0, "the loss went from {first} to {last}");
    let acc = digits_accuracy(&model, &out, &[]);
    assert!(acc > 0.9, "test accuracy {acc}");

    // The convolutional one, with SGD and momentum (0.975 after 20 epochs).
    let model = root
        .join("examples/train/digits_cnn.dl")
        .display()
        .to_string();
    let o = dlc(&[
        "train",
        &model,
        "--entry",
        "loss",
        "--data",
        &format!("x={}", data("digits_train_x.npy")),
        "--data",
        &format!("y={}", data("digits_train_y.npy")),
        "--epochs",
        "3",
        "--optimizer",
        "sgd",
        "--momentum",
        "0.9",
        "--lr",
        "0.05",
        "--seed",
        "1",
        "--save-weights",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let acc = digits_accuracy(&model, &out, &["--check"]);
    assert!(acc > 0.85, "test accuracy of the CNN {acc}");
}

#[test]
fn train_errors_name_what_is_wrong() {
    let d = Dir::new("train-errors");
    let model = d.file(
        "m.dl",
        "fn loss(x: f32[4, 3], y: f32[4], weight w: f32[3]) -> f32 { return mse_loss(x @ w, y); }
         fn plain(x: f32[4, 3]) -> f32 { return sum(x); }",
    );
    let x = d.npy("x.npy", f32ty(&[6, 3]), &[0.5; 18]);
    let y = d.npy("y.npy", f32ty(&[6]), &[1.0; 6]);
    let y5 = d.npy("y5.npy", f32ty(&[5]), &[1.0; 5]);
    let x2 = d.npy("x2.npy", f32ty(&[2, 3]), &[0.5; 6]);
    let y2 = d.npy("y2.npy", f32ty(&[2]), &[0.5; 2]);
    let xw = d.npy("xw.npy", f32ty(&[6, 4]), &[0.5; 24]);
    let dx = format!("x={x}");
    let dy = format!("y={y}");
    let (dy5, dxw, dx2, dy2) = (
        format!("y={y5}"),
        format!("x={xw}"),
        format!("x={x2}"),
        format!("y={y2}"),
    );
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--entry", "loss", "--data", &dx],
            "parameter `y` of `loss` is not a weight and has no --data y=FILE.npy",
        ),
        (
            vec![
                "--entry", "loss", "--data", &dx, "--data", &dy, "--data", "q=z.npy",
            ],
            "--data `q`: `loss` has no such parameter",
        ),
        (
            vec!["--entry", "plain", "--data", &dx],
            "`plain` declares no `weight` parameters",
        ),
        (
            vec!["--entry", "loss", "--data", &dx, "--data", &dy5],
            "--data y has 5 rows, --data x has 6",
        ),
        (
            vec!["--entry", "loss", "--data", &dxw, "--data", &dy],
            "a data set for f32[4, 3] is f32[N, 3]",
        ),
        (
            vec!["--entry", "loss", "--data", &dx2, "--data", &dy2],
            "the data set has 2 rows, fewer than one batch of 4",
        ),
        (
            vec![
                "--entry",
                "loss",
                "--data",
                &dx,
                "--data",
                &dy,
                "--optimizer",
                "adam",
                "--momentum",
                "0.9",
            ],
            "--momentum and --nesterov are for --optimizer sgd",
        ),
        (
            vec![
                "--entry",
                "loss",
                "--data",
                &dx,
                "--data",
                &dy,
                "--schedule",
                "cosine:warmup=x",
            ],
            "--schedule: `x` is not a number",
        ),
        (
            vec![
                "--entry",
                "loss",
                "--data",
                &dx,
                "--data",
                &dy,
                "--weights",
                d.0.to_str().unwrap(),
            ],
            "no value for weight `w`",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["train", model.as_str()];
        all.extend(args);
        fails_with(&dlc(&all), want);
    }
}

/// `dlc train --precision bf16|f16`: products in the narrow type from f32
/// master weights. The digits MLP learns in both. A loss whose gradient
/// overflows f16 at the first loss scale (2^16) skips those updates and
/// halves the scale until it fits, then trains; resumed from a checkpoint
/// (which keeps the scale and the count of updates), it ends bit for bit
/// where the uninterrupted run does.
#[test]
fn train_in_mixed_precision_with_dynamic_loss_scaling() {
    let d = Dir::new("train-mixed");
    let root = dlc_tests::repo_root();
    let data = |f: &str| {
        root.join("examples/train/data")
            .join(f)
            .display()
            .to_string()
    };
    let digits = root
        .join("examples/train/digits_mlp.dl")
        .display()
        .to_string();
    for precision in ["bf16", "f16"] {
        let out = d.0.join(precision);
        let o = dlc(&[
            "train",
            &digits,
            "--entry",
            "loss",
            "--data",
            &format!("x={}", data("digits_train_x.npy")),
            "--data",
            &format!("y={}", data("digits_train_y.npy")),
            "--epochs",
            "10",
            "--optimizer",
            "adam",
            "--lr",
            "0.002",
            "--precision",
            precision,
            "--save-weights",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let acc = digits_accuracy(&digits, &out, &[]);
        assert!(acc > 0.9, "{precision}: test accuracy {acc}");
    }

    // 1000 (x w - y)^2: its gradient, times 2^16, is far beyond f16's 65504.
    let model = d.file(
        "m.dl",
        "fn loss(x: f32[8, 4], y: f32[8, 2], weight w: f32[4, 2]) -> f32 {
            return mse_loss(x @ w, y) * 1000.0;
        }",
    );
    let xs: Vec<f64> = (0..320).map(|i| f64::from(i * 7 % 11 - 5) / 4.0).collect();
    let ys: Vec<f64> = (0..160).map(|i| f64::from(i % 5 - 2)).collect();
    let x = d.npy("x.npy", f32ty(&[80, 4]), &xs);
    let y = d.npy("y.npy", f32ty(&[80, 2]), &ys);
    let path = |n: &str| d.0.join(n).display().to_string();
    let (dx, dy) = (format!("x={x}"), format!("y={y}"));
    let base = [
        "train",
        model.as_str(),
        "--data",
        dx.as_str(),
        "--data",
        dy.as_str(),
        "--lr",
        "0.00001",
        "--precision",
        "f16",
        "--json",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        dlc(&args)
    };
    let (full, ck, resumed) = (path("full"), path("ck"), path("resumed"));
    let o = run(&["--epochs", "3", "--save-weights", &full]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let first = &lines[0];
    let skipped = first["skipped"].as_u64().unwrap();
    let scale = first["loss_scale"].as_f64().unwrap();
    assert!(skipped >= 1, "{first}");
    assert_eq!(first["updates"].as_u64().unwrap() + skipped, 10, "{first}");
    assert!(
        scale < 65536.0 && scale.log2().fract() == 0.0,
        "halved from 2^16: {first}"
    );
    let last = &lines[2];
    assert!(
        last["updates"].as_u64().unwrap() > 10,
        "it trains once the scale fits: {last}"
    );
    assert!(
        last["loss"].as_f64().unwrap() < first["loss"].as_f64().unwrap(),
        "{first} then {last}"
    );

    let o = run(&["--epochs", "1", "--checkpoint", &ck]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["--epochs", "3", "--resume", &ck, "--save-weights", &resumed]);
    assert!(o.status.success(), "{}", stderr(&o));
    let a = HostTensor::read_npy(&d.0.join("full/w.npy"), None).unwrap();
    let b = HostTensor::read_npy(&d.0.join("resumed/w.npy"), None).unwrap();
    assert_eq!(a, b, "resumed in mixed precision");
    let mut other = base.to_vec();
    let at = other.len() - 2;
    other[at] = "bf16";
    other.extend_from_slice(&["--epochs", "3", "--resume", &ck]);
    fails_with(
        &dlc(&other),
        "the checkpoint was written with the optimizer",
    );
}

/// A run stopped after two epochs and resumed from its checkpoint ends
/// with the weights, bit for bit, of the run never stopped; a resume with
/// other settings is refused.
#[test]
fn train_resumes_from_a_checkpoint_bit_identically() {
    let d = Dir::new("train-resume");
    let root = dlc_tests::repo_root();
    let data = |f: &str| {
        root.join("examples/train/data")
            .join(f)
            .display()
            .to_string()
    };
    let model = root
        .join("examples/train/digits_mlp.dl")
        .display()
        .to_string();
    let (dx, dy) = (
        format!("x={}", data("digits_train_x.npy")),
        format!("y={}", data("digits_train_y.npy")),
    );
    let path = |n: &str| d.0.join(n).display().to_string();
    let (full, ck, resumed) = (path("full"), path("ck"), path("resumed"));
    let base = [
        "train",
        model.as_str(),
        "--entry",
        "loss",
        "--data",
        dx.as_str(),
        "--data",
        dy.as_str(),
        "--optimizer",
        "adam",
        "--lr",
        "0.003",
        "--seed",
        "3",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        dlc(&args)
    };
    let o = run(&["--epochs", "4", "--save-weights", &full]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["--epochs", "2", "--checkpoint", &ck]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        std::path::Path::new(&ck)
            .join("checkpoint.safetensors")
            .is_file()
    );
    let o = run(&["--epochs", "4", "--resume", &ck, "--save-weights", &resumed]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("epoch 3/4") && !text.contains("epoch 2/4"),
        "{text}"
    );
    for w in ["w1", "b1", "w2", "b2"] {
        let a = std::fs::read(d.0.join("full").join(format!("{w}.npy"))).unwrap();
        let b = std::fs::read(d.0.join("resumed").join(format!("{w}.npy"))).unwrap();
        assert!(a == b, "weight {w} differs after resuming");
    }
    let mut args = base.to_vec();
    args[13] = "4";
    args.extend_from_slice(&["--epochs", "4", "--resume", &ck]);
    fails_with(
        &dlc(&args),
        "the checkpoint was written with --seed 3, this run has 4",
    );
    fails_with(
        &run(&["--epochs", "4", "--resume", &ck, "--weights", &full]),
        "--resume continues from a checkpoint's weights: leave out --weights",
    );
    std::fs::create_dir_all(d.0.join("junk")).unwrap();
    d.file("junk/checkpoint.safetensors", "not a checkpoint");
    fails_with(
        &run(&["--epochs", "4", "--resume", &path("junk")]),
        "not a safetensors file",
    );
}

/// Running averages train as buffers: the loss returns their new values
/// after itself, `dlc train` feeds them to the next step and saves them with
/// the weights, and the inference form evaluates with them.
#[test]
fn train_keeps_batch_norm_running_averages() {
    let d = Dir::new("train-bn");
    let root = dlc_tests::repo_root();
    let data = |f: &str| {
        root.join("examples/train/data")
            .join(f)
            .display()
            .to_string()
    };
    let model = d.file(
        "bn.dl",
        "fn features[B](x: u8[B, 64], w1: f32[8, 1, 3, 3]) -> f32[B, 8, 8, 8] {
            return conv2d(reshape(cast(x, f32) / 16.0, [B, 1, 8, 8]), w1, padding=1);
        }
        fn head[B](h: f32[B, 8, 8, 8], w2: f32[128, 10]) -> f32[B, 10] {
            return reshape(maxpool2d(relu(h), kernel=2, stride=2), [B, 128]) @ w2;
        }
        fn loss(x: u8[32, 64], y: i64[32], weight w1: f32[8, 1, 3, 3], weight g: f32[8],
                weight b: f32[8], rm: f32[8], rv: f32[8], weight w2: f32[128, 10]) -> (f32, f32[8], f32[8]) {
            let (h, rm2, rv2) = batchnorm_train(features(x, w1), g, b, rm, rv);
            return (cross_entropy(head(h, w2), y), rm2, rv2);
        }
        fn accuracy(x: u8[360, 64], y: i64[360], weight w1: f32[8, 1, 3, 3], weight g: f32[8],
                    weight b: f32[8], weight rm: f32[8], weight rv: f32[8], weight w2: f32[128, 10]) -> f32 {
            let h = batchnorm(features(x, w1), rm, rv, g, b);
            return mean(cast(argmax(head(h, w2), axis=1) == y, f32));
        }",
    );
    let out = d.0.join("trained");
    // gamma starts at one (a file); the other weights are drawn.
    let init = d.0.join("init");
    std::fs::create_dir_all(&init).unwrap();
    d.npy("init/g.npy", f32ty(&[8]), &[1.0; 8]);
    let o = dlc(&[
        "train",
        &model,
        "--entry",
        "loss",
        "--data",
        &format!("x={}", data("digits_train_x.npy")),
        "--data",
        &format!("y={}", data("digits_train_y.npy")),
        "--epochs",
        "3",
        "--optimizer",
        "adam",
        "--lr",
        "0.01",
        "--weights",
        init.to_str().unwrap(),
        "--save-weights",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rv = HostTensor::read_npy(&out.join("rv.npy"), None).unwrap();
    assert_eq!(rv.ty, f32ty(&[8]));
    // From zeros, 132 updates at momentum 0.1 bring each running variance
    // to within 1e-6 of the batches' (positive) variances.
    assert!(rv.data.iter().all(|&v| v > 0.0), "{:?}", rv.data);
    let acc = digits_accuracy(&model, &out, &[]);
    assert!(acc > 0.85, "test accuracy with the running averages {acc}");
    // A loss whose extra results do not match its buffers is refused.
    let bad = d.file(
        "bad.dl",
        "fn loss(x: f32[4, 3], y: f32[4], weight w: f32[3], s: f32[2]) -> (f32, f32[3]) {
            return (mse_loss(x @ w, y), w);
        }",
    );
    let x = d.npy("x.npy", f32ty(&[4, 3]), &[0.5; 12]);
    let y = d.npy("y.npy", f32ty(&[4]), &[1.0; 4]);
    fails_with(
        &dlc(&[
            "train",
            &bad,
            "--data",
            &format!("x={x}"),
            "--data",
            &format!("y={y}"),
        ]),
        "returns 1 value(s) after the loss, the new values of its buffers (the parameters neither weights nor data: s: f32[2])",
    );
}
