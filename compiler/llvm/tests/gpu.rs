//! The GPU back end without a GPU: tile IR scheduled for sm_80 and sm_90
//! compiled to PTX that NVIDIA's `ptxas` accepts, and the very same
//! kernels run by the emulator (CPU threads as a block's threads, a
//! barrier as `bar.sync`, a buffer as shared memory) against the graph
//! interpreter. What only a GPU can show (the PTX running through the CUDA
//! driver) is tested by `dlc run --backend gpu --check` where one is.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::{DType, TargetDesc, TensorType};
use dlc_driver::{interpret, max_relative_error, prepare_inputs};
use dlc_runtime::HostTensor;
use dlc_runtime::abi::Symbols;
use proptest::prelude::*;

/// As for compiled CPU code: sums in f32 in another order, f32
/// transcendental functions.
const TOLERANCE: f64 = 1e-4;

fn graph(src: &str) -> dlc_graph::Module {
    dlc_tests::optimized(src)
}

/// Entry point `f` of `m` scheduled for `target` and run by the emulator.
fn emulated(
    m: &dlc_graph::Module,
    f: &dlc_graph::Function,
    inputs: &[HostTensor],
    target: &TargetDesc,
) -> Vec<HostTensor> {
    let tiles = dlc_driver::lower_for_tile(m, target).unwrap();
    dlc_llvm::emulate(&tiles, target, |emu| Ok(emu.call(&f.name, inputs)))
        .unwrap_or_else(|e| panic!("{e}\n{}", dlc_tile::print_module(&tiles)))
        .unwrap_or_else(|e| panic!("{e}\n{}", dlc_tile::print_module(&tiles)))
}

/// Every entry point of `src` run by the emulator agrees with the
/// interpreter within `--check`'s tolerance for each result's type (f32
/// within 1e-4 of its magnitude; a narrow float summed in another order
/// may round to the neighbouring value; integers exactly), and an all-f32
/// program within 1e-4 overall; scheduled for sm_90.
fn emulated_agrees(src: &str) {
    emulated_agrees_on(src, &TargetDesc::sm_90());
}

/// [`emulated_agrees`] for `target`.
fn emulated_agrees_on(src: &str, target: &TargetDesc) {
    let m = graph(src);
    for (seed, f) in m.entry_points().enumerate() {
        let inputs = prepare_inputs(f, &[], Some(seed as u64)).unwrap();
        let want = interpret(&m, f, &inputs).unwrap();
        let got = emulated(&m, f, &inputs, target);
        let tolerances = dlc_driver::check_tolerances(f);
        for c in dlc_driver::check_results(&got, &want, &tolerances).unwrap() {
            assert!(c.passed(), "@{}: {c}\n{src}", f.name);
        }
        if got.iter().all(|t| t.ty.dtype == dlc_core::DType::F32) {
            let err = max_relative_error(&got, &want).unwrap();
            assert!(
                err <= TOLERANCE,
                "@{}: relative error {err:.3e}\n{src}",
                f.name
            );
        }
    }
}

#[test]
fn every_differential_program_on_the_emulator() {
    for src in dlc_tests::differential_programs() {
        emulated_agrees(src);
    }
}

#[test]
fn products_reductions_and_moves_with_ragged_edges() {
    // Tiles larger than a block (64 x 64 over 256 threads), smaller than
    // one (a 7-element row), ragged in every direction, batched products,
    // transposes and broadcasts through shared memory.
    emulated_agrees(
        "fn f(x: f32[70, 40], w: f32[40, 90], b: f32[90]) -> f32[70, 90] { return gelu(x @ w + b); }",
    );
    emulated_agrees(
        "fn f(q: f32[3, 20, 33], k: f32[3, 37, 33]) -> f32[3, 20, 37] { return q @ transpose(k, [0, 2, 1]) / 4.0; }",
    );
    emulated_agrees(
        "fn f(x: f32[5, 300]) -> (f32[5, 300], f32[300], f32) { return (softmax(x, axis=-1), sum(x, axis=0), max(x)); }",
    );
    emulated_agrees(
        "fn f(x: f32[9, 7], y: f32[7]) -> f32[9, 7] { return layernorm(x + y) * 2.0; }",
    );
    emulated_agrees(
        "fn f(x: i32[33, 65]) -> (i32[33], i32[65]) { return (max(x, axis=1), sum(x, axis=0)); }",
    );
}

/// W2's training step (forward, backward, SGD), at a sixteenth of its
/// width so that the emulator's one CPU thread per GPU thread gets through
/// it, in f32 and with bf16 products on tensor cores (`autocast=bf16`).
#[test]
fn the_w2_training_step_on_the_emulator() {
    emulated_agrees(&dlc_tests::w2_training_step(32, 64, 256, 64));
}

#[test]
fn narrow_floats_accumulate_in_f32_on_the_emulator() {
    dlc_tests::check_narrow_accumulation(&|m, f, inputs| {
        emulated(m, f, inputs, &TargetDesc::sm_90())
    });
}

#[test]
fn every_element_type_on_the_emulator() {
    // f64 transcendental functions need a C library a GPU does not have:
    // refused with a message, and every other program runs.
    let refused = dlc_tests::ELEMENT_TYPE_PROGRAMS
        .iter()
        .chain(&dlc_tests::COMPOSITE_PROGRAMS)
        .filter(|src| {
            let m = graph(src);
            let tiles = dlc_driver::lower_for_tile(&m, &TargetDesc::sm_90()).unwrap();
            match dlc_llvm::emulate(&tiles, &TargetDesc::sm_90(), |_| Ok(())) {
                Ok(()) => false,
                Err(e) => {
                    assert!(
                        e.to_string().contains("the GPU back end does not build"),
                        "{e}"
                    );
                    true
                }
            }
        })
        .count();
    assert_eq!(refused, 1, "only the f64 program calls the C library");
    dlc_tests::check_element_types(&|m, f, inputs| {
        let target = TargetDesc::sm_90();
        let tiles = dlc_driver::lower_for_tile(m, &target).unwrap();
        match dlc_llvm::emulate(&tiles, &target, |emu| Ok(emu.call(&f.name, inputs))) {
            Ok(r) => r.unwrap_or_else(|e| panic!("{e}")),
            // The refused program: the interpreter's results stand in.
            Err(_) => interpret(m, f, inputs).unwrap(),
        }
    });
}

#[test]
fn integer_division_by_zero_is_an_error_with_its_place() {
    let m = graph("fn f(x: i32[300]) -> i32[300] { return x / (x - x); }");
    let f = m.entry_points().next().unwrap();
    let x = HostTensor::new(TensorType::new(DType::I32, vec![300]), vec![1.0; 300]).unwrap();
    let target = TargetDesc::sm_90();
    let tiles = dlc_driver::lower_for_tile(&m, &target).unwrap();
    let err = dlc_llvm::emulate(&tiles, &target, |emu| Ok(emu.call(&f.name, &[x])))
        .unwrap()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "`f`: integer division by zero at t.dl:1:40"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn generated_programs_agree_on_the_emulator(choices in prop::collection::vec(any::<u32>(), 1..10), tuple in any::<bool>()) {
        emulated_agrees(&dlc_tests::generated_program(&choices, tuple));
    }
}

/// Every example, language-reference example, differential and Winograd
/// program compiles to PTX that ptxas assembles for sm_80 and sm_90.
#[test]
fn ptxas_accepts_every_program() {
    let Some(ptxas) = dlc_tests::ptxas() else {
        return;
    };
    let mut programs: Vec<(String, String)> = dlc_tests::every_example();
    programs.extend(
        dlc_tests::differential_programs()
            .into_iter()
            .enumerate()
            .map(|(i, t)| (format!("differential program {i}"), t.to_string())),
    );
    programs.extend(
        dlc_tests::ELEMENT_TYPE_PROGRAMS
            .iter()
            .chain(&dlc_tests::COMPOSITE_PROGRAMS)
            .map(|t| ("element type program".to_string(), t.to_string())),
    );
    programs.extend(
        dlc_tests::WINOGRAD_PROGRAMS
            .iter()
            .map(|t| ("Winograd program".to_string(), t.to_string())),
    );
    programs.extend(
        dlc_tests::narrow_accumulation_cases()
            .into_iter()
            .map(|(t, _, _)| ("narrow float program".to_string(), t)),
    );
    for (i, choices) in [[3u32, 1, 4, 1, 5], [9, 2, 6, 5, 3], [5, 8, 9, 7, 9]]
        .iter()
        .enumerate()
    {
        programs.push((
            format!("generated program {i}"),
            dlc_tests::generated_program(choices, i % 2 == 0),
        ));
    }
    for target in [TargetDesc::sm_80(), TargetDesc::sm_90()] {
        for (name, text) in &programs {
            let m = graph(text);
            let tiles = dlc_driver::lower_for_tile(&m, &target).unwrap();
            let program = match dlc_llvm::compile_gpu(&tiles, &Symbols::for_module("t"), &target) {
                Ok(p) => p,
                Err(e) if e.to_string().contains("the GPU back end does not build") => continue,
                Err(e) => panic!("{name} for {}: {e}", target.name),
            };
            dlc_tests::ptxas_accepts(&ptxas, &program.ptx, &target.name)
                .unwrap_or_else(|e| panic!("{name} for {}: ptxas says\n{e}", target.name));
        }
    }
}

/// The PTX of four kernels as a GPU engineer reads them: a 64 x 64 x 32
/// f32 product block (operands staged in shared memory, 16 accumulators
/// per thread, one FMA per element and depth step), the same in f16 on
/// tensor cores (each warp's 16 x 8 tiles by `mma.sync.m16n8k16` on
/// fragments read from shared memory as 32-bit words), a row softmax (the
/// row's max and sum by warp shuffles, the eight warps' through shared
/// memory; the exp polynomial), and a fused element-wise chain (one
/// coalesced load of each operand per thread, GELU, one store). LLVM's output is pinned by
/// the Debian package; an update means reviewing these.
#[test]
fn ptx_of_key_kernels() {
    let target = TargetDesc::sm_90();
    for (name, src) in [
        (
            "product",
            "fn f(x: f32[64, 32], w: f32[32, 64]) -> f32[64, 64] { return x @ w; }",
        ),
        (
            "tensor_core_product",
            "fn f(x: f16[64, 32], w: f16[32, 64]) -> f16[64, 64] { return x @ w; }",
        ),
        (
            "row_softmax",
            "fn f(x: f32[8, 256]) -> f32[8, 256] { return softmax(x, axis=-1); }",
        ),
        (
            "elementwise_chain",
            "fn f(x: f32[4096], b: f32[4096]) -> f32[4096] { return gelu(x * 2.0 + b); }",
        ),
    ] {
        let m = graph(src);
        let tiles = dlc_driver::lower_for_tile(&m, &target).unwrap();
        let program = dlc_llvm::compile_gpu(&tiles, &Symbols::for_module(name), &target).unwrap();
        insta::assert_snapshot!(name, format!("{src}\n\n{}", program.ptx));
    }
}

/// f16 and bf16 products in whole 16 x 8 x 16 steps run on tensor cores
/// (`mma.sync`), ragged blocks, batches and epilogues included; the
/// emulator computes each warp's `mma.sync` from the fragment layouts of
/// the PTX ISA.
#[test]
fn tensor_core_products_on_the_emulator() {
    for src in dlc_tests::TENSOR_CORE_PROGRAMS {
        emulated_agrees(src);
    }
    // The PTX holds the instruction for both types.
    for (t, name) in [("f16", "f16.f16"), ("bf16", "bf16.bf16")] {
        let m = graph(&format!(
            "fn f(x: {t}[64, 32], w: {t}[32, 64]) -> {t}[64, 64] {{ return x @ w; }}"
        ));
        let tiles = dlc_driver::lower_for_tile(&m, &TargetDesc::sm_80()).unwrap();
        let p =
            dlc_llvm::compile_gpu(&tiles, &Symbols::for_module("t"), &TargetDesc::sm_80()).unwrap();
        assert!(
            p.ptx
                .contains(&format!("mma.sync.aligned.m16n8k16.row.col.f32.{name}.f32")),
            "{}",
            p.ptx
        );
    }
}

/// Code generation follows `tile.tensor-cores`' marks instead of deciding
/// again: the same product without the pass runs on the FMA path (and
/// agrees with the reference just as well), and a mark the target has no
/// instruction for (f32 without TF32) is refused with a message, not
/// ignored.
#[test]
fn code_generation_obeys_the_tensor_core_marks() {
    let m = graph("fn f(x: f16[64, 32], w: f16[32, 64]) -> f16[64, 64] { return x @ w; }");
    let f = m.entry_points().next().unwrap();
    let inputs = prepare_inputs(f, &[], Some(3)).unwrap();
    let want = interpret(&m, f, &inputs).unwrap();
    let target = TargetDesc::sm_80();
    let ptx = |t: &dlc_tile::Module, target: &TargetDesc| {
        dlc_llvm::compile_gpu(t, &Symbols::for_module("t"), target).map(|p| p.ptx)
    };
    let marked = dlc_driver::lower_for_tile(&m, &target).unwrap();
    assert!(dlc_tile::print_module(&marked).contains("{mma = [16, 8, 16]}"));
    assert!(ptx(&marked, &target).unwrap().contains("mma.sync"));
    // The GPU's tile pipeline without `tile.tensor-cores` (and so without
    // the accumulators it would keep in fragments).
    let mut ir = dlc_driver::Ir::Loop(dlc_driver::lower_to_loops(&m, &target).unwrap());
    dlc_driver::run_pipeline(
        &mut ir,
        "convert-loop-to-tile{target=sm_80},tile.reuse-packs,tile.dce,tile.insert-barriers",
        dlc_driver::PassOptions::default(),
    )
    .unwrap();
    let dlc_driver::Ir::Tile(unmarked) = ir else {
        panic!("no tile IR")
    };
    assert!(!dlc_tile::print_module(&unmarked).contains("mma"));
    assert!(!ptx(&unmarked, &target).unwrap().contains("mma.sync"));
    let got = dlc_llvm::emulate(&unmarked, &target, |emu| Ok(emu.call(&f.name, &inputs)))
        .unwrap()
        .unwrap();
    for c in dlc_driver::check_results(&got, &want, &dlc_driver::check_tolerances(f)).unwrap() {
        assert!(c.passed(), "{c}");
    }
    // An f32 product marked for TF32 on a target that was not asked for it.
    let m = graph("fn f(x: f32[64, 32], w: f32[32, 64]) -> f32[64, 64] { return x @ w; }");
    let tf32 = TargetDesc::sm_90().with_tf32();
    let tiles = dlc_driver::lower_for_tile(&m, &tf32).unwrap();
    assert!(dlc_tile::print_module(&tiles).contains("{mma = [16, 8, 8]}"));
    let err = ptx(&tiles, &TargetDesc::sm_90()).unwrap_err().to_string();
    assert!(
        err.contains("not a tensor-core instruction of this target"),
        "{err}"
    );
}

/// A tensor-core product's accumulator carried across the depth loop
/// stays in the warps' fragments (`#mma`, `tile.mma-accumulators`): no
/// staging and read-back at every product, one conversion before the loop
/// and one after; the emulator agrees with the reference, ragged edges
/// and several rounds of tiles per warp included.
#[test]
fn accumulators_stay_in_fragments_across_the_loop() {
    let target = TargetDesc::sm_80();
    for src in [
        "fn f(x: f16[64, 96], w: f16[96, 64]) -> f16[64, 64] { return x @ w; }",
        "fn f(x: bf16[70, 100], w: bf16[100, 90], b: bf16[90]) -> bf16[70, 90] { return x @ w + b; }",
    ] {
        let m = graph(src);
        let tiles = dlc_driver::lower_for_tile(&m, &target).unwrap();
        let text = dlc_tile::print_module(&tiles);
        assert!(text.contains(", #mma<2, 4>>"), "{text}");
        assert_eq!(text.matches("tile.convert_layout").count() % 2, 0, "{text}");
        emulated_agrees_on(src, &target);
    }
}

/// The blocks tensor-core products read in place get rows padded against
/// bank conflicts (`tile.shared-layouts`: strides in their buffer type),
/// and the fragments are read from them by `ldmatrix`: the left operand's
/// always, the right one's transposed when 16-bit (TF32's word by word).
/// The emulator's `ldmatrix` reads NaNs from a row off a 16-byte boundary;
/// it agrees with the reference, several rounds of tiles per warp and two
/// column tiles per warp included.
#[test]
fn fragments_are_read_by_ldmatrix_from_padded_rows() {
    for (src, tf32) in [
        (
            "fn f(x: bf16[64, 96], w: bf16[96, 128]) -> bf16[64, 128] { return x @ w; }",
            false,
        ),
        (
            "fn f(x: f32[64, 96], w: f32[96, 64]) -> f32[64, 64] { return x @ w; }",
            true,
        ),
    ] {
        let target = if tf32 {
            TargetDesc::sm_90().with_tf32()
        } else {
            TargetDesc::sm_90()
        };
        let m = graph(src);
        let tiles = dlc_driver::lower_for_tile(&m, &target).unwrap();
        let text = dlc_tile::print_module(&tiles);
        let padded = if tf32 {
            [
                "f32[2, 64, 32], strides = [2304, 36, 1], shared",
                "f32[2, 32, 64], strides = [2304, 72, 1], shared",
            ]
        } else {
            [
                "bf16[2, 64, 32], strides = [2560, 40, 1], shared",
                "bf16[2, 32, 64], strides = [2304, 72, 1], shared",
            ]
        };
        for p in padded {
            assert!(text.contains(p), "{p} in\n{text}");
        }
        let ptx = dlc_llvm::compile_gpu(&tiles, &Symbols::for_module("t"), &target)
            .unwrap()
            .ptx;
        assert!(
            ptx.contains("ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
            "{ptx}"
        );
        assert_eq!(
            ptx.contains("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"),
            !tf32
        );
        if !tf32 {
            emulated_agrees_on(src, &target);
            continue;
        }
        let f = m.entry_points().next().unwrap();
        let inputs = prepare_inputs(f, &[], Some(3)).unwrap();
        let want = interpret(&m, f, &inputs).unwrap();
        let got = dlc_llvm::emulate(&tiles, &target, |emu| Ok(emu.call(&f.name, &inputs)))
            .unwrap()
            .unwrap();
        let err = max_relative_error(&got, &want).unwrap();
        assert!(
            err <= dlc_driver::TF32_TOLERANCE,
            "relative error {err:.3e}"
        );
    }
}

/// An operand copy is laid out in runs of 16 bytes (`tile.copy-layouts`:
/// `#blocked<8>` for bf16, `#blocked<4>` for f32), each one `cp.async` of 16
/// bytes where it is aligned and wholly on or off; runs cut by the edge of
/// a matrix or off a 16-byte boundary (rows of 140 and 276 bytes here) are
/// copied element by element, and the emulator agrees with the reference.
#[test]
fn operand_copies_move_runs_of_16_bytes() {
    for (src, run) in [
        (
            "fn f(x: bf16[100, 70], w: bf16[70, 136], b: bf16[136]) -> bf16[100, 136] { return x @ w + b; }",
            "#blocked<8>",
        ),
        (
            "fn f(x: f32[50, 69], w: f32[69, 40]) -> f32[50, 40] { return x @ w; }",
            "#blocked<4>",
        ),
    ] {
        let target = TargetDesc::sm_90();
        let m = graph(src);
        let tiles = dlc_driver::lower_for_tile(&m, &target).unwrap();
        let text = dlc_tile::print_module(&tiles);
        assert!(text.contains(run), "{run} in\n{text}");
        let ptx = dlc_llvm::compile_gpu(&tiles, &Symbols::for_module("t"), &target)
            .unwrap()
            .ptx;
        assert!(ptx.contains("cp.async.cg.shared.global"), "{ptx}");
        emulated_agrees_on(src, &target);
    }
}

/// An `#mma` accumulator's grid of warps is part of its type, and the
/// generator holds the tile as the type says: the grid the pass chose
/// compiles; a grid of 4 warps in a program of 8 is refused with the type
/// named, not laid out otherwise.
#[test]
fn accumulators_are_held_by_the_grid_their_type_names() {
    let text = |grid: &str| {
        format!(
            "tile.func @f(%a: buffer<f16[64, 64]>, %b: buffer<f16[64, 64]>, out %c: buffer<f32[64, 64]>) {{
  tile.kernel {{grid = [1], schedule = \"dot\", tile = [64, 64, 16]}} {{
    %z = tile.const {{value = 0.0}} : tile<64x64xf32>
    %m = tile.convert_layout %z : tile<64x64xf32, #mma<{grid}>>
    %r = tile.for %m {{lo = 0, hi = 64, step = 16}} (%k, %acc) {{
      %ta = tile.load %a[#0, %k + #1] : tile<64x16xf16>
      %tb = tile.load %b[%k + #0, #1] : tile<16x64xf16>
      %p = tile.dot %ta, %tb, %acc {{mma = [16, 8, 16]}} : tile<64x64xf32, #mma<{grid}>>
      tile.yield %p
    }} : tile<64x64xf32, #mma<{grid}>>
    %f = tile.convert_layout %r : tile<64x64xf32>
    tile.store %f, %c[#0, #1]
  }}
  tile.return
}}"
        )
    };
    let target = TargetDesc::sm_90();
    let ptx = |m: &dlc_tile::Module| {
        dlc_llvm::compile_gpu(m, &Symbols::for_module("t"), &target).map(|p| p.ptx)
    };
    let ok = dlc_tile::parse_module(&text("2, 4")).unwrap();
    assert!(ptx(&ok).unwrap().contains("mma.sync"));
    let bad = dlc_tile::parse_module(&text("1, 4")).unwrap();
    let err = ptx(&bad).unwrap_err().to_string();
    assert!(
        err.contains("#mma<1, 4>") && err.contains("a program of 8 warps cannot hold it"),
        "{err}"
    );
}

/// f32 products stay on the FMA path unless TF32 is asked for; then they
/// run on tensor cores (`mma.sync.m16n8k8` on TF32) and agree with the
/// reference at TF32's precision (`--check --tf32`'s tolerance), which the
/// f32 tolerance is too tight for.
#[test]
fn tf32_products_only_when_asked_for() {
    let src = "fn f(x: f32[70, 48], w: f32[48, 90], b: f32[90]) -> f32[70, 90] { return gelu(x @ w + b); }";
    let m = graph(src);
    let f = m.entry_points().next().unwrap();
    let inputs = prepare_inputs(f, &[], Some(1)).unwrap();
    let want = interpret(&m, f, &inputs).unwrap();
    let plain = TargetDesc::sm_90();
    let tf32 = TargetDesc::sm_90().with_tf32();
    for (target, tensor_cores) in [(&plain, false), (&tf32, true)] {
        let tiles = dlc_driver::lower_for_tile(&m, target).unwrap();
        let ptx = dlc_llvm::compile_gpu(&tiles, &Symbols::for_module("t"), target)
            .unwrap()
            .ptx;
        assert_eq!(
            ptx.contains("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
            tensor_cores
        );
        let got = dlc_llvm::emulate(&tiles, target, |emu| Ok(emu.call(&f.name, &inputs)))
            .unwrap()
            .unwrap();
        let err = max_relative_error(&got, &want).unwrap();
        let tolerance = if tensor_cores {
            dlc_driver::TF32_TOLERANCE
        } else {
            TOLERANCE
        };
        assert!(
            err <= tolerance,
            "tf32 {tensor_cores}: relative error {err:.3e}"
        );
        if tensor_cores {
            // Rounded operands show: TF32 is not f32.
            assert!(
                err > TOLERANCE / 100.0,
                "TF32 products as exact as f32: {err:.3e}"
            );
        }
    }
}

/// A product reads an operand in place from the shared buffer it was
/// loaded from only when nothing overwrote the buffer in between: here the
/// buffer is zeroed after the load, so the product must use the loaded
/// values (as the tile interpreter does).
#[test]
fn products_read_shared_operands_in_place_only_when_unchanged() {
    let text = "tile.func @f(%x: buffer<f32[16, 16]>, %w: buffer<f32[16, 16]>, out %y: buffer<f32[16, 16]>) {
  tile.kernel {grid = [1], schedule = \"dot\", tile = [4, 4, 4]} {
    %s = tile.alloc : buffer<f32[16, 16], shared>
    %a = tile.load %x[#0, #1] : tile<16x16xf32>
    tile.store %a, %s[#0, #1]
    tile.barrier
    %b = tile.load %s[#0, #1] : tile<16x16xf32>
    tile.barrier
    %z = tile.const {value = 0.0} : tile<16x16xf32>
    tile.store %z, %s[#0, #1]
    tile.barrier
    %v = tile.load %w[#0, #1] : tile<16x16xf32>
    %c = tile.const {value = 0.0} : tile<16x16xf32>
    %r = tile.dot %b, %v, %c : tile<16x16xf32>
    tile.store %r, %y[#0, #1]
  }
  tile.return
}";
    let m = dlc_tile::parse_module(text).unwrap();
    let ty = dlc_core::TensorType::new(DType::F32, vec![16, 16]);
    let x = HostTensor::new(
        ty.clone(),
        (0..256).map(|i| f64::from(i % 7) - 3.0).collect(),
    )
    .unwrap();
    let w = HostTensor::new(ty, (0..256).map(|i| f64::from(i % 5) * 0.5).collect()).unwrap();
    let mut want = vec![0.0; 256];
    for i in 0..16 {
        for j in 0..16 {
            want[i * 16 + j] = (0..16)
                .map(|k| x.data[i * 16 + k] * w.data[k * 16 + j])
                .sum();
        }
    }
    let got = dlc_llvm::emulate(&m, &TargetDesc::sm_90(), |emu| Ok(emu.call("f", &[x, w])))
        .unwrap()
        .unwrap();
    assert_eq!(got[0].data, want);
}

/// A tile copied from global into shared memory goes by `cp.async`, which
/// reads its source later, only when nothing in the function writes that
/// source; the results are the tile interpreter's either way.
#[test]
fn async_copies_only_from_buffers_nothing_writes() {
    let program = |write_back: bool| {
        format!(
            "tile.func @f(%x: buffer<f32[256]>, out %y: buffer<f32[256]>) {{
  tile.kernel {{grid = [1], schedule = \"rows\", vector = [64]}} {{
    %s = tile.alloc : buffer<f32[256], shared>
    %a = tile.load %x[#0] : tile<256xf32>
    tile.store %a, %s[#0]
    tile.barrier
    %b = tile.load %s[-#0 + 255] : tile<256xf32>
    tile.store %b, %y[#0]{}
  }}
  tile.return
}}",
            if write_back {
                "\n    tile.barrier\n    tile.store %b, %x[#0]"
            } else {
                ""
            }
        )
    };
    for write_back in [false, true] {
        let m = dlc_tile::parse_module(&program(write_back)).unwrap();
        let p = dlc_llvm::compile_gpu(&m, &Symbols::for_module("t"), &TargetDesc::sm_90()).unwrap();
        assert_eq!(p.ptx.contains("cp.async"), !write_back, "{}", p.ptx);
        let x = HostTensor::new(
            dlc_core::TensorType::new(DType::F32, vec![256]),
            (0..256).map(f64::from).collect(),
        )
        .unwrap();
        let got = dlc_llvm::emulate(&m, &TargetDesc::sm_90(), |emu| Ok(emu.call("f", &[x])))
            .unwrap()
            .unwrap();
        let want: Vec<f64> = (0..256).rev().map(f64::from).collect();
        assert_eq!(got[0].data, want);
    }
}

/// `tile.slice` on the emulator agrees with the tile interpreter, at
/// offsets of a loop's counter (a GPU writes no loop out) and constants.
#[test]
fn slices_on_the_emulator() {
    let (m, input, want) = dlc_tests::slices_case();
    let got = dlc_llvm::emulate(&m, &TargetDesc::sm_90(), |emu| Ok(emu.call("f", &[input])))
        .unwrap()
        .unwrap();
    assert_eq!(got[0].data, want);
}
