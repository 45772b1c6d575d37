//! Writes the programs the GPU check runs besides the workloads, one
//! source file each, into the folder named by its argument: every
//! differential program (`diff_NNN.dl`), the narrow-float accumulation
//! cases (`narrow_NNN.dl`), the tensor-core products (`mma_NNN.dl`) and
//! W2's training step, in f32 and with bf16 products, at a quarter of its
//! width (`train_w2_small.dl`, checked) and at its size (`train_w2.dl`,
//! timed), and a small batch-normalization training step (`train_bn.dl`,
//! checked: batch statistics, and values `graph.remat` computes again).
//! `make gpu-check-prepare` compiles each to a GPU module with its
//! reference results (`scripts/gpu_check_prepare.sh`).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: gpu_check_programs DIR");
        return ExitCode::FAILURE;
    };
    let narrow: Vec<String> = dlc_tests::narrow_accumulation_cases()
        .into_iter()
        .map(|(src, _, _)| src)
        .collect();
    let groups: [(&str, Vec<&str>); 3] = [
        ("diff", dlc_tests::differential_programs()),
        ("narrow", narrow.iter().map(String::as_str).collect()),
        ("mma", dlc_tests::TENSOR_CORE_PROGRAMS.to_vec()),
    ];
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("{}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let steps = [
        (
            "train_w2_small",
            dlc_tests::w2_training_step(64, 256, 1024, 256),
        ),
        (
            "train_w2",
            dlc_tests::w2_training_step(128, 1024, 4096, 1024),
        ),
        ("train_bn", dlc_tests::BATCHNORM_TRAINING_STEP.to_string()),
    ];
    for (name, src) in steps {
        let path = dir.join(format!("{name}.dl"));
        if let Err(e) = std::fs::write(&path, src) {
            eprintln!("{}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    for (prefix, programs) in groups {
        for (k, src) in programs.iter().enumerate() {
            let path = dir.join(format!("{prefix}_{k:03}.dl"));
            if let Err(e) = std::fs::write(&path, format!("{src}\n")) {
                eprintln!("{}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
