//! `Model::build` as a build script runs it: a model that does not compile
//! ends the script with status 1 (which fails `cargo build`) and the model's
//! diagnostic on its standard error, and names the model for Cargo to watch.
//! The script is this test binary run again with `BUILD_SCRIPT_MODEL` set,
//! in Cargo's build-script environment, so that no second build of the
//! compiler is needed (`examples/embed`, built with the workspace, is the
//! script that succeeds).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::process::Command;

/// Set in the run that acts as the build script: the model it builds.
const MODEL_VAR: &str = "BUILD_SCRIPT_MODEL";

#[test]
fn a_model_that_does_not_compile_fails_the_build_with_its_diagnostic() {
    if let Some(model) = std::env::var_os(MODEL_VAR) {
        // The build script: on failure `build` does not return.
        dlc_build::Model::new(model).build();
        return;
    }
    let dir = std::env::temp_dir().join(format!("dlc-build-script-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    std::fs::write(
        dir.join("model.dl"),
        "fn f(x: f32[4]) -> f32[4] {\n    return x + y;\n}\n",
    )
    .expect("model");
    let o = Command::new(std::env::current_exe().expect("the test's path"))
        .args([
            "--exact",
            "a_model_that_does_not_compile_fails_the_build_with_its_diagnostic",
            "--nocapture",
            "--test-threads=1",
        ])
        .current_dir(&dir)
        .env(MODEL_VAR, "model.dl")
        .env("OUT_DIR", &dir)
        .env("CARGO_CFG_TARGET_ARCH", "x86_64")
        .env("CARGO_CFG_TARGET_OS", "linux")
        .env("CARGO_CFG_TARGET_FEATURE", "fxsr,sse,sse2")
        .env("TARGET", "x86_64-unknown-linux-gnu")
        .output()
        .expect("the test binary as a build script");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(o.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("error: unknown name `y`"), "{stderr}");
    assert!(stderr.contains("model.dl:2:16"), "{stderr}");
    // After the test harness's `test NAME ... `, on that line.
    assert!(
        stdout
            .lines()
            .any(|l| l.ends_with(" ... cargo:rerun-if-changed=model.dl")),
        "{stdout}"
    );
}
