//! `examples/embed`: a Rust program whose `build.rs` compiles four models
//! with dlc-build. Built from a clean state of its own, it links no LLVM,
//! its results match the reference interpreter, and its errors are values;
//! a model that does not compile fails `cargo build` with the model's
//! diagnostic.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dlc_driver::{PassOptions, SourceText};
use dlc_runtime::HostTensor;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The target directory this test was built in (`target/debug/deps/embed-*`
/// is the test): the example is built there, beside the compiler's crates.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.ancestors()
        .nth(3)
        .expect("target/debug/deps/TEST")
        .to_path_buf()
}

/// Cargo (the one running the tests) in `dir`, on the shared target
/// directory.
fn cargo(dir: &Path, args: &[&str]) -> Output {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    Command::new(cargo)
        .current_dir(dir)
        .args(args)
        .arg("--target-dir")
        .arg(target_dir())
        .output()
        .expect("cargo")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Checks the results the example saved under `dir` against the reference
/// interpreter on the inputs it saved beside them.
fn check_against_interpreter(model: &str, entry: &str, dir: &Path) {
    let path = root().join(model);
    let src = SourceText {
        name: model.into(),
        text: std::fs::read_to_string(&path).expect("model"),
    };
    let mut module = dlc_driver::compile_source(&src).unwrap_or_else(|e| panic!("{e}"));
    dlc_driver::run_passes(
        &mut module,
        dlc_driver::DEFAULT_PIPELINE,
        PassOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let f = dlc_driver::select_entry(&module, Some(entry)).unwrap_or_else(|e| panic!("{e}"));
    let files: Vec<(String, PathBuf)> = f
        .params
        .iter()
        .map(|(name, _)| (name.clone(), dir.join(format!("{name}.npy"))))
        .collect();
    let inputs = dlc_driver::prepare_inputs(f, &files, None).unwrap_or_else(|e| panic!("{e}"));
    let reference = dlc_driver::interpret(&module, f, &inputs).unwrap_or_else(|e| panic!("{e}"));
    let got = HostTensor::read_npy(&dir.join("out0.npy"), None).unwrap_or_else(|e| panic!("{e}"));
    let checks = dlc_driver::check_results(&[got], &reference, &dlc_driver::check_tolerances(f))
        .unwrap_or_else(|e| panic!("{e}"));
    for c in &checks {
        assert!(c.passed() && !c.all_nan(), "{entry}: {c}");
    }
}

#[test]
fn the_example_builds_from_a_clean_state_links_no_llvm_and_matches_the_interpreter() {
    let o = cargo(&root(), &["clean", "-p", "dlc-embed-example"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = cargo(&root(), &["build", "-p", "dlc-embed-example"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let exe = target_dir().join("debug/dlc-embed-example");

    // Its dynamic dependencies: the C library, libm, the OpenMP runtime;
    // never LLVM or MLIR.
    let d = Command::new("readelf")
        .arg("-d")
        .arg(&exe)
        .output()
        .expect("readelf (binutils, installed by `make setup`)");
    let needed: Vec<String> = text(&d.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .map(String::from)
        .collect();
    assert!(needed.iter().any(|l| l.contains("libgomp")), "{needed:?}");
    assert!(
        !needed
            .iter()
            .any(|l| l.to_lowercase().contains("llvm") || l.to_lowercase().contains("mlir")),
        "{needed:?}"
    );

    let out = std::env::temp_dir().join(format!("dlc-embed-{}", std::process::id()));
    let run = Command::new(&exe)
        .arg("--save")
        .arg(&out)
        .output()
        .expect("the example");
    let stdout = text(&run.stdout);
    assert!(run.status.success(), "{stdout}{}", text(&run.stderr));
    for line in [
        "error (expected): layernorm_gelu: input `x` has shape [2, 2], the model takes [2048, 768]",
        "ratio: [3, -3, 2, 1]",
        "error (expected): ratio: integer division by zero at models/ratio.dl:3:12",
        "move: [3.5, -3.0, -1.5] [false, false, true] 42",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "no `{line}` in:\n{stdout}"
        );
    }
    check_against_interpreter("examples/w2_mlp.dl", "mlp", &out.join("mlp"));
    check_against_interpreter(
        "examples/w5_layernorm_gelu.dl",
        "layernorm_gelu",
        &out.join("layernorm_gelu"),
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_model_that_does_not_compile_fails_the_build_with_its_diagnostic() {
    // A package of its own (outside the workspace), kept under the target
    // directory so that later runs reuse its build.
    let dir = target_dir().join("dlc-build-tests/broken-model");
    std::fs::create_dir_all(dir.join("src")).expect("package directory");
    let build = root().join("tools/dlc-build");
    let files = [
        (
            "Cargo.toml",
            format!(
                "[package]\nname = \"broken-model\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
                 [workspace]\n\n[build-dependencies]\ndlc-build = {{ path = {:?} }}\n\n\
                 [profile.dev.package.\"*\"]\nopt-level = 3\n\n[profile.dev]\n\
                 debug = \"line-tables-only\"\n",
                build.display().to_string()
            ),
        ),
        (
            "build.rs",
            "fn main() {\n    dlc_build::Model::new(\"model.dl\").build();\n}\n".into(),
        ),
        ("src/main.rs", "fn main() {}\n".into()),
        (
            "model.dl",
            "fn f(x: f32[4]) -> f32[4] {\n    return x + y;\n}\n".into(),
        ),
    ];
    for (name, content) in files {
        std::fs::write(dir.join(name), content).expect("package file");
    }
    // The workspace's lock file: the same dependency versions, no network.
    std::fs::copy(root().join("Cargo.lock"), dir.join("Cargo.lock")).expect("Cargo.lock");
    let o = cargo(&dir, &["build", "--offline"]);
    let stderr = text(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(stderr.contains("error: unknown name `y`"), "{stderr}");
    assert!(stderr.contains("model.dl:2:16"), "{stderr}");
}
