//! This program as the workspace's build made it: its build script compiled
//! four models with dlc-build; it links no LLVM, its results match the
//! reference interpreter, and its errors are values.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};
use std::process::Command;

use dlc_driver::{PassOptions, SourceText};
use dlc_runtime::HostTensor;

/// The workspace's root, where the models' paths start.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
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
        weights: Vec::new(),
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
fn the_program_links_no_llvm_and_matches_the_interpreter() {
    // Built by Cargo with the tests, as any build of the workspace builds it
    // (in the same build as the compiler, which its build script shares).
    let exe = Path::new(env!("CARGO_BIN_EXE_dlc-embed-example"));

    // Its dynamic dependencies: the C library, libm, the OpenMP runtime;
    // never LLVM or MLIR.
    let d = Command::new("readelf")
        .arg("-d")
        .arg(exe)
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
    let run = Command::new(exe)
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
