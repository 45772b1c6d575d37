//! The MLIR back end: every example converts to upstream MLIR that MLIR's
//! verifier and `mlir-opt` accept with no unregistered dialect, and runs
//! through MLIR's own lowering to the graph interpreter's results. The one
//! test binary that links MLIR.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_driver::{PassOptions, SourceText};

/// Each example's modules: (file, graph module after the default pipeline,
/// its loop IR, its tile IR scheduled for this CPU).
fn examples() -> Vec<(
    String,
    dlc_graph::Module,
    dlc_loop::Module,
    dlc_tile::Module,
)> {
    dlc_tests::example_files()
        .into_iter()
        .map(|(path, text)| {
            let src = SourceText {
                name: path.clone(),
                text,
                weights: Vec::new(),
            };
            let mut module =
                dlc_driver::compile_source(&src).unwrap_or_else(|e| panic!("{path}: {e}"));
            dlc_driver::run_passes(
                &mut module,
                dlc_driver::DEFAULT_PIPELINE,
                PassOptions::default(),
            )
            .unwrap_or_else(|e| panic!("{path}: {e}"));
            let loops = dlc_driver::lower_to_loops(&module, dlc_core::TargetDesc::host())
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            let tiles = dlc_driver::lower_for_tile(&module, dlc_core::TargetDesc::host())
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            (path, module, loops, tiles)
        })
        .collect()
}

#[test]
fn every_example_converts_to_upstream_mlir_that_mlir_opt_reads() {
    let mlir_opt = dlc_tests::mlir_opt();
    for (path, _, loops, tiles) in examples() {
        let text = dlc_mlir::convert_module(&loops).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(text.contains("func.func @"), "{path}: {text}");
        assert!(
            !text.contains("loop."),
            "{path}: a loop op is left:\n{text}"
        );
        if let Some(tool) = &mlir_opt {
            dlc_tests::mlir_parses_upstream(tool, &text)
                .unwrap_or_else(|e| panic!("{path}: mlir-opt: {e}\n{text}"));
        }
        let text =
            dlc_mlir::convert_tile_module(&tiles).unwrap_or_else(|e| panic!("{path} (tile): {e}"));
        assert!(
            text.contains("scf.parallel") && !text.contains("tile."),
            "{path}:\n{text}"
        );
        if let Some(tool) = &mlir_opt {
            dlc_tests::mlir_parses_upstream(tool, &text)
                .unwrap_or_else(|e| panic!("{path} (tile): mlir-opt: {e}\n{text}"));
        }
        // MLIR's own lowering takes it to the LLVM dialect.
        let llvm =
            dlc_mlir::lower_to_llvm_dialect(&loops).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(llvm.contains("llvm.func @"), "{path}");
    }
}

/// Runs entry point `f` through MLIR, from loop IR and from tile IR
/// scheduled for this CPU, and checks both against the graph interpreter:
/// the same results within `--check`'s tolerance, or an integer division by
/// zero in all three.
fn compare(
    what: &str,
    module: &dlc_graph::Module,
    f: &dlc_graph::Function,
    loops: &dlc_loop::Module,
    tiles: &dlc_tile::Module,
    inputs: &[dlc_runtime::HostTensor],
) {
    check_one(
        &format!("{what} (loop IR)"),
        module,
        f,
        dlc_mlir::run(loops, &f.name, inputs).map_err(|e| e.to_string()),
        inputs,
    );
    // A function with declared weights runs its preparer first.
    let tiled = dlc_driver::call_prepared(tiles, &f.name, inputs, |name, inputs| {
        dlc_mlir::run_tile(tiles, name, inputs)
            .map_err(|e| dlc_driver::DriverError::Codegen(e.to_string()))
    });
    check_one(
        &format!("{what} (tile IR)"),
        module,
        f,
        tiled.map_err(|e| e.to_string()),
        inputs,
    );
}

/// One back end's results for `f` against the graph interpreter's.
fn check_one(
    what: &str,
    module: &dlc_graph::Module,
    f: &dlc_graph::Function,
    got: Result<Vec<dlc_runtime::HostTensor>, String>,
    inputs: &[dlc_runtime::HostTensor],
) {
    match dlc_driver::interpret(module, f, inputs) {
        Ok(want) => {
            let got = got.unwrap_or_else(|e| panic!("{what} @{}: {e}", f.name));
            let tolerances = dlc_driver::check_tolerances(f);
            for c in dlc_driver::check_results(&got, &want, &tolerances).unwrap() {
                assert!(c.passed(), "{what} @{}: {c}", f.name);
            }
        }
        Err(e) if e.to_string().contains("division by zero") => {
            let got = got.map(|_| ()).unwrap_err().to_string();
            assert!(
                got.contains("integer division by zero"),
                "{what} @{}: {got}",
                f.name
            );
        }
        Err(e) => panic!("{what} @{}: the interpreter failed: {e}", f.name),
    }
}

/// Every entry point of every example through MLIR from loop IR (`tiles`
/// false) or from tile IR scheduled for this CPU, against the interpreter.
fn every_example_runs(tiles: bool) {
    let mut ran = 0;
    for (path, module, loops, tile_ir) in examples() {
        for f in module.entry_points() {
            let inputs = dlc_driver::prepare_inputs(f, &[], Some(1)).unwrap();
            let got = if tiles {
                // The entry point and its preparer, when its weights have work
                // of their own (the preparer runs first).
                let one = only(&tile_ir, &f.name);
                dlc_driver::call_prepared(&one, &f.name, &inputs, |name, inputs| {
                    dlc_mlir::run_tile(&one, name, inputs)
                        .map_err(|e| dlc_driver::DriverError::Codegen(e.to_string()))
                })
                .map_err(|e| e.to_string())
            } else {
                let single = dlc_loop::Module {
                    functions: loops
                        .functions
                        .iter()
                        .filter(|g| g.name == f.name)
                        .cloned()
                        .collect(),
                };
                dlc_mlir::run(&single, &f.name, &inputs).map_err(|e| e.to_string())
            };
            let level = if tiles { "tile IR" } else { "loop IR" };
            check_one(&format!("{path} ({level})"), &module, f, got, &inputs);
            ran += 1;
        }
    }
    assert!(ran >= 19, "only {ran} entry points ran");
}

/// Function `name` of a tile module, with its preparer if it has one.
fn only(m: &dlc_tile::Module, name: &str) -> dlc_tile::Module {
    let prepare = m
        .functions
        .iter()
        .find(|g| g.name == name)
        .and_then(|g| g.prepare.clone());
    dlc_tile::Module {
        functions: m
            .functions
            .iter()
            .filter(|g| g.name == name || Some(&g.name) == prepare.as_ref())
            .cloned()
            .collect(),
    }
}

#[test]
fn every_example_runs_through_mlir_from_loop_ir_to_the_interpreters_results() {
    every_example_runs(false);
}

#[test]
fn every_example_runs_through_mlir_from_tile_ir_to_the_interpreters_results() {
    every_example_runs(true);
}

#[test]
fn arguments_are_checked() {
    let (_, module, loops, _) = examples()
        .into_iter()
        .find(|(p, ..)| p.ends_with("w5_layernorm_gelu.dl"))
        .unwrap();
    let f = module.entry_points().next().unwrap();
    let e = dlc_mlir::run(&loops, &f.name, &[]).unwrap_err().to_string();
    assert!(e.contains("takes 3 inputs, got 0"), "{e}");
    let e = dlc_mlir::run(&loops, "nope", &[]).unwrap_err().to_string();
    assert!(e.contains("no function `@nope`"), "{e}");
}

/// The graph module of `src` after the default pipeline.
fn graph(src: &str) -> dlc_graph::Module {
    let mut m = dlc_driver::compile_source(&SourceText {
        name: "t.dl".into(),
        text: src.into(),
        weights: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{e}\n{src}"));
    dlc_driver::run_passes(&mut m, dlc_driver::DEFAULT_PIPELINE, PassOptions::default())
        .unwrap_or_else(|e| panic!("{e}\n{src}"));
    m
}

/// Runs entry point `f` of `m` through MLIR.
fn through_mlir(
    m: &dlc_graph::Module,
    f: &dlc_graph::Function,
    inputs: &[dlc_runtime::HostTensor],
) -> Vec<dlc_runtime::HostTensor> {
    let loops = dlc_driver::lower_to_loops(m, dlc_core::TargetDesc::host()).unwrap();
    dlc_mlir::run(&loops, &f.name, inputs).unwrap_or_else(|e| panic!("@{}: {e}", f.name))
}

/// Every entry point of `src` through MLIR agrees with the interpreter.
fn agrees(src: &str) {
    let m = graph(src);
    let loops = dlc_driver::lower_to_loops(&m, dlc_core::TargetDesc::host()).unwrap();
    let tiles = dlc_driver::lower_for_tile(&m, dlc_core::TargetDesc::host()).unwrap();
    for (seed, f) in m.entry_points().enumerate() {
        let inputs = dlc_driver::prepare_inputs(f, &[], Some(seed as u64)).unwrap();
        compare(src, &m, f, &loops, &tiles, &inputs);
    }
}

#[test]
fn element_wise_ops_casts_and_every_element_type() {
    agrees(
        "fn f(x: f32[5, 16], h: f16[16], b: bf16[16]) -> (f32[5, 16], f16[16], bf16[16]) { return (floor(x * 3.0) + ceil(x * 2.0) - round(x * 5.0) + sign(x) + reciprocal(abs(x) + 0.5) + sin(x * 3.0) * cos(x) + silu(x), round(h * 4.0) + sin(h), silu(b) - floor(b * 2.0)); }",
    );
    agrees(
        "fn f(x: i32[3, 8], y: i64[8]) -> (i32[3, 8], i64[8]) { return (sign(x) * 3, sign(y)); }",
    );
    agrees(
        "fn f(x: f32[3, 4], b: f32[4], s: f32) -> f32[3, 4] { return gelu(tanh(x) * b - s) + sigmoid(-x) / (abs(x) + 1.0); }",
    );
    agrees(
        "fn f(x: f32[3, 4], y: f32[3, 1]) -> f32[3, 4] { return where(x > y, exp(x), pow(abs(y) + 0.5, 2.0)) + max(x, y) - min(x, 0.0) + rsqrt(abs(x) + 1.0) + log(sqrt(abs(x) + 1.0)) + relu(x); }",
    );
    agrees(
        "fn f(x: i32[2, 3], y: i32[3]) -> i32[2, 3] { return (x * 3 + y) / 4 - abs(x) + relu(y) + max(x, y) - min(x, 2) + (-x) / y; }",
    );
    agrees(
        "fn f(x: f32[2, 3]) -> (i32[2, 3], i64[2, 3], bool[2, 3], f16[2, 3], bf16[2, 3]) { return (cast(x * 10.0, i32), cast(x * 1000.0, i64), x > 0.0, cast(x, f16), cast(x, bf16)); }",
    );
    agrees(
        "fn f(x: f16[4], b: bf16[4]) -> (f16[4], bf16[4]) { return (x * x + 1.0 + tanh(x) + max(x, 0.5), exp(b) - b + gelu(b) + pow(abs(b), 2.0)); }",
    );
    agrees(
        "fn f(x: i64[5], c: bool[5]) -> (f32[5], bool[5], i32[5]) { return (cast(x, f32) + cast(c, f32), c != (x > 2), cast(c, i32) - cast(x, i32)); }",
    );
}

/// User operators that are contractions, through MLIR from the loop and
/// from the tile level.
#[test]
fn user_contractions_through_mlir() {
    for src in dlc_tests::CONTRACTION_PROGRAMS {
        agrees(src);
    }
}

/// Gathers through MLIR (`arith.index_cast` of the loaded index).
#[test]
fn gathers_through_mlir() {
    for src in dlc_tests::GATHER_PROGRAMS {
        agrees(src);
    }
}

#[test]
fn every_element_type_through_mlir() {
    dlc_tests::check_element_types(&through_mlir);
    dlc_tests::check_element_types(&tiles_through_mlir);
}

#[test]
fn narrow_floats_accumulate_in_f32_through_mlir() {
    dlc_tests::check_narrow_accumulation(&through_mlir);
    dlc_tests::check_narrow_accumulation(&tiles_through_mlir);
}

#[test]
fn generated_programs_agree() {
    // Sixteen fixed programs of the generator the other back ends' tests
    // draw from (choices from a fixed seed: the same programs every run).
    let mut state = 0x9e37_79b9_u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        (state >> 33) as u32
    };
    for i in 0..16 {
        let choices: Vec<u32> = (0..1 + next() % 9).map(|_| next()).collect();
        agrees(&dlc_tests::generated_program(&choices, i % 2 == 0));
        if i % 4 == 0 {
            agrees(&dlc_tests::generated_program_sized(
                &choices,
                i % 8 == 0,
                80,
                96,
            ));
        }
    }
}

/// Natively a zero divisor is a status naming the division; through MLIR
/// it is an error without the place (the module converted for `--emit
/// mlir` leaves it undefined, as `arith.floordivsi` does).
#[test]
fn an_integer_division_by_zero_is_an_error() {
    let m = graph("fn f(a: i32[4], b: i32[4]) -> i32[4] { return a / b; }");
    let f = m.entry_points().next().unwrap();
    let loops = dlc_driver::lower_to_loops(&m, dlc_core::TargetDesc::host()).unwrap();
    let tiles = dlc_driver::lower_for_tile(&m, dlc_core::TargetDesc::host()).unwrap();
    let t = |v: [f64; 4]| {
        dlc_runtime::HostTensor::new(
            dlc_core::TensorType::new(dlc_core::DType::I32, vec![4]),
            v.to_vec(),
        )
        .unwrap()
    };
    let ok = dlc_mlir::run(
        &loops,
        "f",
        &[t([7.0, -9.0, 10.0, -1.0]), t([2.0, 4.0, -3.0, 5.0])],
    )
    .unwrap();
    // Rounded toward negative infinity, as the interpreter does.
    assert_eq!(ok[0].data, vec![3.0, -3.0, -4.0, -1.0]);
    let e = dlc_mlir::run(&loops, "f", &[t([1.0; 4]), t([1.0, 0.0, 1.0, 1.0])]).unwrap_err();
    assert_eq!(e.to_string(), "@f: integer division by zero");
    assert!(dlc_mlir::has_integer_division(&loops).is_some());
    compare("a / b", &m, f, &loops, &tiles, &[t([1.0; 4]), t([0.0; 4])]);
    let e = dlc_mlir::run_tile(&tiles, "f", &[t([1.0; 4]), t([1.0, 0.0, 1.0, 1.0])]).unwrap_err();
    assert_eq!(e.to_string(), "@f: integer division by zero");
}

/// Runs entry point `f` of `m`, scheduled as tile kernels for this CPU,
/// through MLIR.
fn tiles_through_mlir(
    m: &dlc_graph::Module,
    f: &dlc_graph::Function,
    inputs: &[dlc_runtime::HostTensor],
) -> Vec<dlc_runtime::HostTensor> {
    let tiles = dlc_driver::lower_for_tile(m, dlc_core::TargetDesc::host()).unwrap();
    dlc_mlir::run_tile(&tiles, &f.name, inputs)
        .unwrap_or_else(|e| panic!("@{}: {e}\n{}", f.name, dlc_tile::print_module(&tiles)))
}

#[test]
fn dense_constants_are_memref_globals() {
    agrees(
        "fn f(x: f32[4, 6], h: f16[3], i: i32[3], c: bool[3]) -> (f32[4, 3], f16[3], i32[3], bool[3]) {
            return (x @ tensor([0.5, -1.0, 2.0, 0.25, 3.0, -0.75, 1.5, 1.0, -2.0, 0.125, 4.0, 1.0,
                               -0.5, 0.5, 1.0, 2.0, -3.0, 0.0], [6, 3]),
                    h * tensor([0.1, -2.5, 3.0], [3], dtype=f16),
                    i * tensor([7, -3, 5], [3], dtype=i32),
                    where(c, tensor([true, false, true], [3]), c));
        }",
    );
}

/// `tile.slice` through MLIR agrees with the tile interpreter, at constant
/// offsets and at offsets known only at run time.
#[test]
fn slices_through_mlir() {
    let (m, input, want) = dlc_tests::slices_case();
    let got = dlc_mlir::run_tile(&m, "f", &[input]).unwrap();
    assert_eq!(got[0].data, want);
}
