//! Fuzzes the front end, the graph pipeline and the tile level: any bytes,
//! read as dlc source, as graph IR and as tile IR, must give a result or an
//! error, never a panic, a hang or a crash. What checks must also print,
//! parse back identically, survive the default pipeline, print as MLIR and,
//! when small, run; programs are also lowered and scheduled as tile kernels
//! for the host and for sm_90, which must verify and, when small, run on the
//! tile interpreter, and so must verified loop IR read as text.
#![no_main]

use dlc_core::{PassManager, Pipeline, Verify};
use dlc_graph::{Module, interp};
use libfuzzer_sys::fuzz_target;

/// Programs whose tensors all stay this small are also interpreted.
const INTERPRET_LIMIT: usize = 4096;

/// The interpreter's work limit here: it refuses (with an error) what would
/// only trip the fuzzer's timeout, and the refusal itself is exercised.
const WORK_LIMIT: f64 = 1e6;

fn exercise(mut module: Module) {
    let printed = dlc_graph::print_module(&module);
    let reparsed = dlc_graph::parse_module(&printed).expect("printed IR parses back");
    assert_eq!(
        dlc_graph::print_module(&reparsed),
        printed,
        "print-parse-print differs"
    );
    let passes = dlc_graph::transforms::registry()
        .build(
            &Pipeline::parse(dlc_graph::transforms::DEFAULT_PIPELINE)
                .expect("default pipeline parses"),
        )
        .expect("default pipeline builds");
    PassManager::new(passes)
        .run(&mut module)
        .expect("verified IR survives the default pipeline");
    let _ = dlc_graph::print_mlir_generic(&module);
    for f in module.entry_points() {
        let small = f.body.node_weights().all(|n| {
            n.results
                .iter()
                .all(|t| t.num_elements().is_some_and(|e| e <= INTERPRET_LIMIT))
        });
        if !small {
            continue;
        }
        let args: Vec<interp::Tensor> = f
            .param_types()
            .iter()
            .map(|t| {
                let n = t.num_elements().unwrap_or(0);
                interp::Tensor::from_vec(t, (0..n).map(|i| (i % 7) as f64 - 3.0).collect())
                    .expect("argument matches its type")
            })
            .collect();
        // Errors (integer division by zero, too much work) are fine;
        // panics are not.
        let _ = interp::run_function_within(&module, &f.name, &args, WORK_LIMIT);
    }
    if let Ok(lowered) = dlc_lower::lower_module(&module, dlc_core::TargetDesc::host()) {
        for target in [
            dlc_core::TargetDesc::host().clone(),
            dlc_core::TargetDesc::sm_90(),
        ] {
            let tiled = dlc_lower::convert_module(&lowered, &target)
                .expect("verified loop IR converts to tile IR");
            if let Err(errors) = tiled.verify() {
                panic!("tile IR does not verify: {errors:?}");
            }
            exercise_tile(&tiled);
        }
    }
}

/// Tile IR that verifies: it prints and parses back identically, prints as
/// MLIR, and runs (on made-up arguments) to a result or an error.
fn exercise_tile(module: &dlc_tile::Module) {
    let printed = dlc_tile::print_module(module);
    let reparsed = dlc_tile::parse_module(&printed).expect("printed tile IR parses back");
    assert_eq!(
        dlc_tile::print_module(&reparsed),
        printed,
        "print-parse-print differs"
    );
    let _ = dlc_tile::print_mlir_generic(module);
    for f in &module.functions {
        let mut args = Vec::new();
        for (_, v) in &f.params {
            let dlc_tile::Type::Buffer(t) = f.ty(*v) else {
                return;
            };
            match t.storage_len() {
                Some(n) if n <= INTERPRET_LIMIT => args.push(dlc_tile::interp::Buffer {
                    ty: t.clone(),
                    data: (0..n).map(|i| (i % 7) as f64 - 3.0).collect(),
                }),
                _ => return,
            }
        }
        let _ = dlc_tile::interp::run_function_within(module, &f.name, &mut args, WORK_LIMIT);
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(module) = dlc_lang::compile_source(text) {
        exercise(module);
    }
    if let Ok(module) = dlc_graph::parse_module(text)
        && module.verify().is_ok()
    {
        exercise(module);
    }
    if let Ok(module) = dlc_tile::parse_module(text)
        && module.verify().is_ok()
    {
        exercise_tile(&module);
    }
    // Verified loop IR (written by hand, not only lowered) converts to
    // verified tile IR or says why not.
    if let Ok(module) = dlc_loop::parse_module(text)
        && module.verify().is_ok()
    {
        for target in [
            dlc_core::TargetDesc::host().clone(),
            dlc_core::TargetDesc::sm_90(),
        ] {
            if let Ok(tiled) = dlc_lower::convert_module(&module, &target) {
                if let Err(errors) = tiled.verify() {
                    panic!("tile IR converted from verified loop IR does not verify: {errors:?}");
                }
                exercise_tile(&tiled);
            }
        }
    }
});
