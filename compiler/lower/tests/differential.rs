//! Graph to loop to tile, differentially: the loop interpreter running the
//! lowered program, and the tile interpreter running it scheduled for the
//! host CPU and for an sm_90 GPU, must give the graph interpreter's results
//! (the definition) within tolerance, on small programs that cover every op,
//! every fusion case and every way a result can be produced; every example
//! model and language reference example lowers to loop and tile IR that
//! verify and round-trip.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::TargetDesc;
use dlc_core::Verify;
use dlc_driver::{
    DEFAULT_PIPELINE, PassOptions, SourceText, compile_source, interpret, interpret_loops,
    interpret_tile_within, lower_for_tile, max_relative_error, prepare_inputs, run_passes,
};
use dlc_loop::{parse_module, print_mlir_generic, print_module};
use dlc_lower::lower_module;
use proptest::prelude::*;

/// Relative error allowed: the loop interpreter accumulates reductions in f32
/// (or the integer type), the graph interpreter in f64.
const TOLERANCE: f64 = 1e-4;

fn graph(src: &str) -> dlc_graph::Module {
    let mut m = compile_source(&SourceText {
        name: "t.dl".into(),
        text: src.into(),
        weights: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{e}"));
    run_passes(&mut m, DEFAULT_PIPELINE, PassOptions::default()).unwrap();
    m
}

fn lowered(m: &dlc_graph::Module) -> dlc_loop::Module {
    let l = lower_module(m, TargetDesc::host()).unwrap_or_else(|e| panic!("{e}"));
    let text = print_module(&l);
    if let Err(errors) = l.verify() {
        panic!("lowered IR does not verify: {errors:?}\n{text}");
    }
    let again = parse_module(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print_module(&again), text, "loop IR does not round-trip");
    l
}

/// The targets tile IR is checked for: this CPU and an sm_90 GPU (no GPU
/// needed: the tile interpreter runs the GPU schedule).
fn targets() -> Vec<TargetDesc> {
    vec![TargetDesc::host().clone(), TargetDesc::sm_90()]
}

/// The program scheduled as tile kernels for `target`; its text verifies
/// and round-trips.
fn kernels(m: &dlc_graph::Module, target: &TargetDesc) -> dlc_tile::Module {
    let t = lower_for_tile(m, target).unwrap_or_else(|e| panic!("{}: {e}", target.name));
    checked(t, &target.name)
}

/// [`kernels`] for this CPU as compiled code runs them
/// (`dlc_driver::lower_for_code`).
fn code_kernels(m: &dlc_graph::Module) -> dlc_tile::Module {
    let t = dlc_driver::lower_for_code(m, TargetDesc::host()).unwrap_or_else(|e| panic!("{e}"));
    checked(t, "host, constants prepared once")
}

/// `t`, which must verify and round-trip through its text.
fn checked(t: dlc_tile::Module, what: &str) -> dlc_tile::Module {
    let text = dlc_tile::print_module(&t);
    if let Err(errors) = t.verify() {
        panic!("{what}: tile IR does not verify: {errors:?}\n{text}");
    }
    let again = dlc_tile::parse_module(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(
        dlc_tile::print_module(&again),
        text,
        "tile IR does not round-trip"
    );
    t
}

#[test]
fn narrow_floats_accumulate_in_f32_on_the_tile_interpreter() {
    for target in targets() {
        dlc_tests::check_narrow_accumulation(&move |m, f, inputs| {
            let t = kernels(m, &target);
            interpret_tile_within(&t, f, inputs, dlc_driver::DEFAULT_WORK_LIMIT).unwrap()
        });
    }
}

#[test]
fn narrow_floats_accumulate_in_f32_on_the_loop_interpreter() {
    dlc_tests::check_narrow_accumulation(&|m, f, inputs| interpret_loops(m, f, inputs).unwrap());
}

#[test]
fn every_element_type_on_the_loop_and_tile_interpreters() {
    dlc_tests::check_element_types(&|m, f, inputs| interpret_loops(m, f, inputs).unwrap());
    for target in targets() {
        dlc_tests::check_element_types(&move |m, f, inputs| {
            let t = kernels(m, &target);
            interpret_tile_within(&t, f, inputs, dlc_driver::DEFAULT_WORK_LIMIT).unwrap()
        });
    }
}

/// Whether `got` agrees with the graph interpreter's `want` within
/// `--check`'s tolerance for each result's type (f32 within 1e-4 of its
/// magnitude, a narrow float within 4 of its ulps, integers exactly), and
/// an all-f32 function within 1e-4 overall; the first disagreement if not.
fn disagreement(
    f: &dlc_graph::Function,
    got: &[dlc_runtime::HostTensor],
    want: &[dlc_runtime::HostTensor],
) -> Option<String> {
    let checks = dlc_driver::check_results(got, want, &dlc_driver::check_tolerances(f)).unwrap();
    if let Some(c) = checks.iter().find(|c| !c.passed()) {
        return Some(c.to_string());
    }
    let err = max_relative_error(got, want).unwrap();
    let all_f32 = got.iter().all(|t| t.ty.dtype == dlc_core::DType::F32);
    (all_f32 && err > TOLERANCE).then(|| format!("relative error {err:.3e}"))
}

/// Runs every entry point four ways on random inputs (graph interpreter,
/// loop interpreter, tile interpreter on the kernels for the host and for
/// sm_90) and compares.
fn agree(src: &str) {
    let m = graph(src);
    let l = lowered(&m);
    let mut scheduled: Vec<(String, dlc_tile::Module)> = targets()
        .iter()
        .map(|target| (target.name.clone(), kernels(&m, target)))
        .collect();
    // What compiled code on this CPU runs, where it differs: constants
    // lowered as weights, what depends on them alone prepared once.
    let code = code_kernels(&m);
    if dlc_tile::print_module(&code) != dlc_tile::print_module(&scheduled[0].1) {
        scheduled.push(("host, constants prepared once".into(), code));
    }
    for (seed, f) in m.entry_points().enumerate() {
        let inputs = prepare_inputs(f, &[], Some(seed as u64)).unwrap();
        let want = interpret(&m, f, &inputs).unwrap();
        for (name, k) in &scheduled {
            let text = || dlc_tile::print_module(k);
            let got = interpret_tile_within(k, f, &inputs, dlc_driver::DEFAULT_WORK_LIMIT)
                .unwrap_or_else(|e| panic!("{name}: {e}\n{}", text()));
            if let Some(d) = disagreement(f, &got, &want) {
                panic!("@{} on {name}: tile interpreter: {d}\n{}", f.name, text());
            }
        }
        let got =
            interpret_loops(&m, f, &inputs).unwrap_or_else(|e| panic!("{e}\n{}", print_module(&l)));
        if let Some(d) = disagreement(f, &got, &want) {
            panic!(
                "@{}: loop interpreter: {d}\nwant {:?}\ngot  {:?}\n{}",
                f.name,
                want.iter()
                    .map(|t| &t.data[..t.data.len().min(8)])
                    .collect::<Vec<_>>(),
                got.iter()
                    .map(|t| &t.data[..t.data.len().min(8)])
                    .collect::<Vec<_>>(),
                print_module(&l)
            );
        }
    }
}

#[test]
fn element_wise_and_broadcasting() {
    for src in dlc_tests::ELEMENT_WISE_PROGRAMS {
        agree(src);
    }
}

#[test]
fn shape_operators() {
    for src in dlc_tests::SHAPE_PROGRAMS
        .iter()
        .chain(dlc_tests::GATHER_PROGRAMS)
    {
        agree(src);
    }
}

#[test]
fn reductions_and_normalizations() {
    for src in dlc_tests::REDUCTION_PROGRAMS {
        agree(src);
    }
}

#[test]
fn matrix_products() {
    for src in dlc_tests::PRODUCT_PROGRAMS {
        agree(src);
    }
}

/// Contractions large enough to become `loop.matmul` (with epilogues,
/// batches, transposed operands), interpreted as tile IR.
#[test]
fn contractions_mapped_to_tiles() {
    let src = "
fn dense(x: f32[40, 30], w: f32[30, 50], b: f32[50]) -> f32[40, 50] { return gelu(x @ w + b) * 2.0; }
fn scores(q: f32[3, 20, 33], k: f32[3, 37, 33]) -> f32[3, 20, 37] { return q @ transpose(k, [0, 2, 1]) / 4.0; }
fn two(x: f32[24, 40], w1: f32[40, 36], w2: f32[36, 40]) -> f32[24, 40] { return relu(x @ w1) @ w2; }
";
    let text = print_module(&lowered(&graph(src)));
    assert_eq!(text.matches("loop.matmul").count(), 4, "{text}");
    agree(src);
}

#[test]
fn convolution_and_pooling() {
    for src in dlc_tests::POOLING_PROGRAMS {
        agree(src);
    }
}

/// Convolutions large enough to be lowered as products over an im2col
/// buffer (and mapped to `loop.matmul`): strides, padding, non-square
/// kernels, a following batchnorm and relu.
#[test]
fn convolutions_as_products() {
    let src = "fn f(x: f32[2, 8, 13, 11], w: f32[16, 8, 3, 2], m: f32[16], v: f32[16], g: f32[16], b: f32[16]) -> f32[2, 16, 7, 12] { return relu(batchnorm(conv2d(x, w, stride=[2, 1], padding=[1, 1]), m, v, g, b)); }";
    let text = print_module(&lowered(&graph(src)));
    assert!(text.contains("loop.matmul"), "{text}");
    agree(&src.replace(
        "batchnorm(conv2d(x, w, stride=[2, 1], padding=[1, 1]), m, v, g, b)",
        "batchnorm(conv2d(x, w, stride=[2, 1], padding=[1, 1]), m, abs(v) + 0.5, g, b)",
    ));
}

/// A convolution computed as a product computes the element-wise chain
/// after it (bias, residual, relu, clip) in the product's region, at the
/// product's index, reading the chain's operands through `[N, C, H*W]`
/// views; a 1 x 1 convolution at stride 1 reads its input in place (no
/// im2col copy). A chain reading a value that varies along one spatial axis
/// only stays a nest of its own. All agree with the graph interpreter.
#[test]
fn convolution_products_compute_their_epilogues() {
    let [residual, clip, rows, silu] = dlc_tests::CONV_EPILOGUE_PROGRAMS else {
        panic!("four programs");
    };
    // The product's region: from `loop.matmul` to its store.
    let region = |text: &str| -> String {
        let at = text.find("loop.matmul").expect(text);
        let len = text[at..].find("loop.store").expect(text);
        text[at..at + len].to_string()
    };
    let text = print_module(&lowered(&graph(residual)));
    let product = region(&text);
    assert!(
        product.contains("loop.relu")
            && product.contains("loop.load %2[%5, %6, %7]")
            && !text.contains("loop.alloc : buffer<f32[2, 16, 90]>")
            && !text.contains("loop.alloc : buffer<f32[2, 24, 9, 10]>")
            && !text.contains("group = \"im2col\""),
        "{text}"
    );
    let text = print_module(&lowered(&graph(clip)));
    let product = region(&text);
    assert!(
        product.contains("loop.minimum")
            && text.contains("group = \"im2col\"")
            && !text.contains("loop.alloc : buffer<f32[1, 16, 8, 8]>"),
        "{text}"
    );
    let text = print_module(&lowered(&graph(rows)));
    let product = region(&text);
    assert!(
        !product.contains("loop.tanh") && text.contains("loop.alloc : buffer<f32[2, 24, 9, 10]>"),
        "{text}"
    );
    let text = print_module(&lowered(&graph(silu)));
    let product = region(&text);
    assert!(
        product.contains("loop.silu") && !text.contains("loop.alloc : buffer<f32[2, 24, 9, 10]>"),
        "{text}"
    );
    for src in dlc_tests::CONV_EPILOGUE_PROGRAMS {
        agree(src);
    }
}

/// Convolutions whose product's programs copy their panels straight from
/// the input (no im2col buffer) on the AVX-512 schedule: panels spanning up
/// to four output rows (12 columns per row), strides, padding, a
/// non-square kernel, a batchnorm and relu after; one whose rows (15
/// columns) would need groups of 15 panels keeps its im2col buffer. Both
/// agree with the graph interpreter.
#[test]
fn convolutions_read_from_their_input() {
    let cases = [
        (
            "fn f(x: f32[2, 8, 13, 11], w: f32[16, 8, 3, 2]) -> f32[2, 16, 7, 12] { return conv2d(x, w, stride=[2, 1], padding=[1, 1]); }",
            "f32[2, 48, 84]",
            false,
        ),
        (
            "fn f(x: f32[1, 16, 20, 20], w: f32[24, 16, 3, 3], m: f32[24], v: f32[24], g: f32[24], b: f32[24]) -> f32[1, 24, 20, 20] { return relu(batchnorm(conv2d(x, w, padding=1), m, abs(v) + 0.5, g, b)); }",
            "f32[1, 144, 400]",
            false,
        ),
        (
            "fn f(x: f32[3, 4, 30, 30], w: f32[8, 4, 5, 5]) -> f32[3, 8, 15, 15] { return conv2d(x, w, stride=2, padding=2); }",
            "f32[3, 100, 225]",
            true,
        ),
    ];
    let avx512 = dlc_lower::ScheduleParams::for_target(&TargetDesc::x86_64_avx512(2));
    for (src, col, materialized) in cases {
        let m = graph(src);
        let l = lowered(&m);
        assert!(
            print_module(&l).contains(&format!("loop.alloc : buffer<{col}>")),
            "{src}"
        );
        let t = dlc_lower::convert_module_with(&l, &avx512).unwrap();
        let text = dlc_tile::print_module(&t);
        assert_eq!(
            text.contains(&format!("tile.alloc : buffer<{col}>")),
            materialized,
            "{src}\n{text}"
        );
        agree(src);
    }
}

/// A convolution written in index notation is the built-in's kernel: one
/// that computes exactly a `conv2d` becomes it (`graph.canonicalize`), so a
/// strided one's tile IR is the built-in's im2col product and a stride-1
/// 3x3 one's the built-in's Winograd kernel, byte for byte, on both x86-64
/// widths; any other window (dilated: no built-in has dilation) is read from
/// its indices, its gathered operand is an im2col group carrying that
/// window, and the product's programs copy their panels from the input
/// through it, never making the copy. All agree with the graph
/// interpreter.
#[test]
fn convolutions_in_index_notation_are_the_builtin_kernel() {
    let user = "op conv[N, C, O](x: f32[N, C, 28, 28], w: f32[O, C, 3, 3]) -> f32[N, O, 14, 14] { out[n, o, y, xx] = sum[c, ky, kx](x[n, c, 2 * y + ky - 1, 2 * xx + kx - 1] * w[o, c, ky, kx]); }
fn f(x: f32[2, 16, 28, 28], w: f32[32, 16, 3, 3]) -> f32[2, 32, 14, 14] { return conv(x, w); }";
    let builtin = "fn f(x: f32[2, 16, 28, 28], w: f32[32, 16, 3, 3]) -> f32[2, 32, 14, 14] { return conv2d(x, w, stride=2, padding=1); }";
    let dilated = dlc_tests::CONTRACTION_PROGRAMS
        .iter()
        .find(|p| p.starts_with("op dilated"))
        .unwrap();
    let (lu, lb, ld) = (
        lowered(&graph(user)),
        lowered(&graph(builtin)),
        lowered(&graph(dilated)),
    );
    let window = "loop.kernel_begin {group = \"im2col\", kernel = [3, 3], stride = [2, 2], padding = [1, 1], dilation = [1, 1]}";
    assert!(print_module(&lu).contains(window), "{}", print_module(&lu));
    assert!(print_module(&lb).contains(window), "{}", print_module(&lb));
    assert!(print_module(&ld).contains(
        "loop.kernel_begin {group = \"im2col\", kernel = [3, 3], stride = [2, 1], padding = [1, 2], dilation = [2, 2]}"
    ));
    for target in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let params = dlc_lower::ScheduleParams::for_target(&target);
        let tile = |l: &dlc_loop::Module| {
            dlc_tile::print_module(&dlc_lower::convert_module_with(l, &params).unwrap())
        };
        let (tu, tb, td) = (tile(&lu), tile(&lb), tile(&ld));
        assert!(
            !tb.contains("buffer<f32[2, 144, 196]>"),
            "{}\n{tb}",
            target.name
        );
        assert_eq!(tu, tb, "{}", target.name);
        assert!(
            td.contains("schedule = \"packed\""),
            "{}\n{td}",
            target.name
        );
        assert!(
            !td.contains("buffer<f32[2, 72, 760]>"),
            "{}\n{td}",
            target.name
        );
    }
    agree(user);
    agree(dilated);
    // A stride-1 3x3 one is the built-in's Winograd kernel.
    let user = "op conv[N, C, O](x: f32[N, C, 32, 32], w: f32[O, C, 3, 3]) -> f32[N, O, 32, 32] { out[n, o, y, xx] = sum[c, ky, kx](w[o, c, ky, kx] * x[n, c, y + ky - 1, xx + kx - 1]); }
fn f(x: f32[1, 16, 32, 32], w: f32[24, 16, 3, 3]) -> f32[1, 24, 32, 32] { return relu(conv(x, w)); }";
    let builtin = "fn f(x: f32[1, 16, 32, 32], w: f32[24, 16, 3, 3]) -> f32[1, 24, 32, 32] { return relu(conv2d(x, w, padding=1)); }";
    let (lu, lb) = (lowered(&graph(user)), lowered(&graph(builtin)));
    assert!(print_module(&lu).contains("loop.kernel_begin {group = \"winograd\"}"));
    for target in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let params = dlc_lower::ScheduleParams::for_target(&target);
        let tile = |l: &dlc_loop::Module| {
            dlc_tile::print_module(&dlc_lower::convert_module_with(l, &params).unwrap())
        };
        assert_eq!(tile(&lu), tile(&lb), "{}", target.name);
    }
    agree(user);
}

/// A product of few rows over many columns splits its columns into chunks
/// (one program each); the strips of its left operand are then packed once,
/// by a kernel of their own, not once per chunk; a product with as many
/// blocks of rows as threads packs its own. Both agree with the graph
/// interpreter, ragged edges included.
#[test]
fn few_rows_pack_their_left_operand_once() {
    let avx512 = dlc_lower::ScheduleParams::for_target(&TargetDesc::x86_64_avx512(8));
    for (src, once) in [
        (
            "fn f(x: f32[20, 70], w: f32[70, 400], b: f32[400]) -> f32[20, 400] { return relu(x @ w + b); }",
            true,
        ),
        (
            "fn f(x: f32[400, 40], w: f32[40, 64]) -> f32[400, 64] { return x @ w; }",
            false,
        ),
    ] {
        let m = graph(src);
        let t = dlc_lower::convert_module_with(&lowered(&m), &avx512).unwrap();
        let text = dlc_tile::print_module(&t);
        assert_eq!(
            text.matches("pack = [0]").count(),
            usize::from(once),
            "{src}\n{text}"
        );
        let f = m.entry_points().next().unwrap();
        let inputs = prepare_inputs(f, &[], Some(2)).unwrap();
        let want = interpret(&m, f, &inputs).unwrap();
        let got = interpret_tile_within(&t, f, &inputs, dlc_driver::DEFAULT_WORK_LIMIT)
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        let err = max_relative_error(&got, &want).unwrap();
        assert!(err <= TOLERANCE, "{src}: relative error {err:.3e}\n{text}");
        agree(src);
    }
}

/// The convolutions of `WINOGRAD_PROGRAMS` run as Winograd's F(4x4, 3x3)
/// (36 transformed products, one kernel over rows of tiles on a CPU, a
/// declared kernel's transform in the preparer); those that do not qualify
/// keep their product or loop nest. The first agree with the graph
/// interpreter.
#[test]
fn convolutions_as_winograd() {
    let winograd = dlc_tests::WINOGRAD_PROGRAMS;
    let direct = [
        // Stride 2, a 5 x 5 kernel, two groups; tiles mostly past the
        // result (5 x 5 in 2 x 2 tiles, 39% filled), one tile per image.
        "fn f(x: f32[1, 32, 64, 64], w: f32[32, 32, 3, 3]) -> f32[1, 32, 32, 32] { return conv2d(x, w, stride=2, padding=1); }",
        "fn f(x: f32[1, 32, 36, 36], w: f32[32, 32, 5, 5]) -> f32[1, 32, 32, 32] { return conv2d(x, w); }",
        "fn f(x: f32[1, 32, 32, 32], w: f32[32, 16, 3, 3]) -> f32[1, 32, 32, 32] { return conv2d(x, w, padding=1, groups=2); }",
        "fn f(x: f32[1, 128, 5, 5], w: f32[128, 128, 3, 3]) -> f32[1, 128, 5, 5] { return conv2d(x, w, padding=1); }",
        "fn f(x: f32[4, 128, 4, 4], w: f32[128, 128, 3, 3]) -> f32[4, 128, 4, 4] { return conv2d(x, w, padding=1); }",
    ];
    for (src, expected) in winograd
        .iter()
        .map(|s| (s, true))
        .chain(direct.iter().map(|s| (s, false)))
    {
        let m = graph(src);
        let text = print_module(&lowered(&m));
        assert_eq!(
            text.contains("loop.alloc : buffer<f32[36, "),
            expected,
            "{src}\n{text}"
        );
        // The others' lowerings have tests of their own.
        if expected {
            agree(src);
        }
    }
    // On a CPU, each convolution's transforms and packed products are one
    // kernel over rows of tiles, and the transformed input and products
    // (the `[36, tiles, C]` buffers) are never allocated; output channels
    // within the target's narrow width (16 on AVX-512 and AVX2) make narrow
    // products (not packed), which stay three kernels. With
    // declared weights, the kernel's transform and its packing are the
    // preparer's: a call runs, per convolution, the fused kernel and the
    // pass after it (batchnorm and relu; residual and relu).
    for cpu in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        for (src, channels) in winograd.iter().zip([16, 24, 16, 32, 32, 48]) {
            let fused = channels > cpu.gemm_blocking(dlc_core::DType::F32).narrow_n;
            let tiles = kernels(&graph(src), &cpu);
            let text = dlc_tile::print_module(&tiles);
            let body = text.split("tile.func @f_prepare").next().unwrap();
            assert_eq!(
                body.contains("schedule = \"winograd\""),
                fused,
                "{}: {src}\n{text}",
                cpu.name
            );
            // V and M; U too, when the kernel is not a declared weight (its
            // packed panels are 5-D).
            let transformed = body
                .lines()
                .filter_map(|l| l.split("tile.alloc : buffer<f32[36, ").nth(1))
                .filter(|rest| rest.ends_with("]>") && rest.matches(", ").count() == 1)
                .count();
            assert_eq!(transformed <= 1, fused, "{}: {src}\n{text}", cpu.name);
        }
        let cpu_tiles = kernels(&graph(winograd[3]), &cpu);
        let text = dlc_tile::print_module(&cpu_tiles);
        let f = cpu_tiles.functions.iter().find(|f| f.name == "f").unwrap();
        assert!(f.prepare.is_some(), "{text}");
        let body = text.split("tile.func @f_prepare").next().unwrap();
        assert_eq!(body.matches("tile.kernel").count(), 4, "{text}");
        assert_eq!(body.matches("schedule = \"winograd\"").count(), 2, "{text}");
        // The preparer transforms the two kernels one after the other, and
        // releases each transform once it is packed: the two never take
        // workspace at once.
        let prepare = &text[text.find("tile.func @f_prepare").unwrap()..];
        let (mut live, mut most, mut transforms) = (std::collections::HashSet::new(), 0, 0);
        for line in prepare.lines().map(str::trim) {
            if let Some((v, _)) = line.split_once(" = tile.alloc : buffer<f32[36, ") {
                live.insert(v.to_string());
                transforms += 1;
            } else if let Some(v) = line.strip_prefix("tile.dealloc ") {
                live.remove(v);
            }
            most = most.max(live.len());
        }
        assert_eq!((transforms, most), (2, 1), "{prepare}");
    }
}

/// Grouped convolutions of several input channels a group
/// (`GROUPED_CONVOLUTION_PROGRAMS`) run as packed products, one per group
/// and image, on AVX-512 and AVX2: over 16 x 16 one kernel whose programs
/// copy their panels from the input, in a batch of two (and over 14 x 14 on
/// AVX2) after an im2col copy, the 1 x 1 over 7 x 7 with the pixels as its
/// rows on AVX2. A depthwise one, one channel a group, keeps its direct loops.
/// They agree with the graph interpreter.
#[test]
fn grouped_convolutions_are_products_per_group() {
    let src = dlc_tests::GROUPED_CONVOLUTION_PROGRAMS;
    for cpu in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let text = dlc_tile::print_module(&kernels(&graph(src), &cpu));
        for (f, groups, copied) in [
            ("g3", 16, false),
            // 196 pixels: in whole rows of panels 224 columns either way
            // with AVX-512's panels of 32; with AVX2's of 16, 208 as panels.
            ("g14", 16, cpu.name == "x86-64-avx2"),
            ("s2", 4, true),
            ("res", 4, false),
            ("rows", 2, false),
        ] {
            let body = text
                .split(&format!("tile.func @{f}("))
                .nth(1)
                .and_then(|b| b.split("tile.func @").next())
                .unwrap_or_else(|| panic!("no function {f}\n{text}"));
            // One product, its grid the groups (and the images), and the
            // im2col copy's kernel where there is one.
            let kernels: Vec<&str> = body.lines().filter(|l| l.contains("tile.kernel")).collect();
            let packed: Vec<&&str> = kernels
                .iter()
                .filter(|l| l.contains("\"packed\""))
                .collect();
            let grid = if f == "s2" {
                format!("[2, {groups}, ")
            } else {
                format!("[{groups}, ")
            };
            assert!(
                packed.len() == 1 && packed[0].contains(&format!("grid = {grid}")),
                "{}: @{f} is not one packed product per group\n{text}",
                cpu.name
            );
            assert_eq!(
                kernels.len(),
                1 + usize::from(copied),
                "{}: @{f}\n{text}",
                cpu.name
            );
            // 49 pixels as rows: one block of 52 (13 strips of 4).
            let pixel_rows = body.contains("blocking = [4, 16, 52, ");
            assert_eq!(
                pixel_rows,
                f == "rows" && cpu.name == "x86-64-avx2",
                "{}: @{f}\n{text}",
                cpu.name
            );
        }
    }
    let dw = "fn f(x: f32[1, 32, 14, 14], w: f32[32, 1, 3, 3]) -> f32[1, 32, 14, 14] { return conv2d(x, w, padding=1, groups=32); }";
    let text = dlc_tile::print_module(&kernels(&graph(dw), &TargetDesc::x86_64_avx2(2)));
    assert!(!text.contains("schedule = \"packed\""), "{text}");
    agree(src);
    agree(dw);
}

/// Dilated convolutions run the built-in convolution's kernels with their
/// taps `dilation` apart: the depthwise 5 x 5 over 14 x 14 through its
/// padded copy on AVX2 (the input loaded once, plainly, by the copy), the
/// dense one as a packed im2col product, never a Winograd kernel (its
/// transforms are for taps one apart). Every one agrees with the graph
/// interpreter on each target's tile interpreter and the loop interpreter.
#[test]
fn dilated_convolutions_run_the_convolution_kernels() {
    let src = dlc_tests::DILATED_CONVOLUTION_PROGRAMS;
    let m = graph(src);
    for cpu in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let text = dlc_tile::print_module(&kernels(&m, &cpu));
        let body = |f: &str| {
            text.split(&format!("tile.func @{f}("))
                .nth(1)
                .and_then(|b| b.split("tile.func @").next())
                .unwrap_or_else(|| panic!("no function {f}\n{text}"))
        };
        assert!(!text.contains("winograd"), "{}: {text}", cpu.name);
        let dense = body("dense");
        assert!(
            dense.contains("schedule = \"packed\""),
            "{}: {dense}",
            cpu.name
        );
        // Rows 2 apart at stride 2: its phases' copy spans 119 rows (the
        // window's 9 rows, then 2 a row of output).
        let roll = body("roll");
        assert!(
            roll.contains("buffer<f32[119, 2, 64], scratch>"),
            "{}: {roll}",
            cpu.name
        );
        if cpu.name == "x86-64-avx2" {
            let dw = body("dw5");
            let loads: Vec<&str> = dw.lines().filter(|l| l.contains("tile.load %x[")).collect();
            assert!(
                loads.len() == 1 && !loads[0].contains("pad") && dw.contains("scratch"),
                "{}: {dw}",
                cpu.name
            );
        }
    }
    agree(src);
}

/// Video convolutions (`conv3d`) are 2-D convolutions of their frames:
/// each a `conv2d` over a copy of the input frames its temporal taps read,
/// no operator in index notation; the one over a single frame reads it
/// through its middle temporal tap alone (weights `[16, 16, 3, 3]`). They
/// agree with the graph interpreter on every lowering.
#[test]
fn video_convolutions_are_convolutions_of_their_frames() {
    let src = dlc_tests::VIDEO_CONVOLUTION_PROGRAMS;
    let text = dlc_graph::print_module(&graph(src));
    for f in ["c3", "strided", "grp", "one"] {
        let body = graph_function(&text, f);
        let convs = body.lines().filter(|l| l.contains("graph.conv2d")).count();
        assert!(
            convs == 1 && !body.contains("graph.compute"),
            "@{f}: {body}"
        );
    }
    let one = graph_function(&text, "one");
    assert!(
        one.lines()
            .any(|l| l.contains("graph.reshape") && l.ends_with("f32[16, 16, 3, 3]")),
        "{one}"
    );
    agree(src);
}

/// A convolution whose outer taps read only padding from every output
/// (ASPP's 3 x 3 windows 24 and 36 apart over 14 x 14) is canonicalized to
/// the taps that meet the image (`canonicalize::trimmed_taps`): here a 1 x
/// 1 convolution by the middle taps' weights. It computes what the whole
/// window does (`canonicalized_agrees`). Not trimmed: a window whose outer
/// taps meet some outputs, and one whose useless taps are on one side only.
#[test]
fn convolutions_keep_only_the_taps_that_meet_the_image() {
    let src = "fn aspp(x: f32[1, 8, 6, 6], w: f32[4, 8, 3, 3]) -> f32[1, 4, 6, 6] { return conv2d(x, w, padding=6, dilation=6); }
fn mid(x: f32[1, 8, 6, 6], w: f32[4, 8, 3, 3]) -> f32[1, 4, 6, 6] { return conv2d(x, w, padding=2, dilation=2); }
fn rows(x: f32[1, 4, 6, 6], w: f32[4, 1, 3, 3]) -> f32[1, 4, 6, 6] { return conv2d(x, w, padding=[6, 1], dilation=[6, 1], groups=4); }
fn side(x: f32[1, 2, 3, 3], w: f32[2, 2, 3, 3]) -> f32[1, 2, 1, 1] { return conv2d(x, w, stride=3, padding=2, dilation=2); }";
    let text = canonicalized_agrees(src);
    // The kernel each convolution runs, and whether it was trimmed (one
    // tap wide along every dilated axis: no dilation left).
    for (f, kernel, trimmed) in [
        ("aspp", "f32[4, 8, 1, 1]", true),
        ("mid", "f32[4, 8, 3, 3]", false),
        ("rows", "f32[4, 1, 1, 3]", true),
        ("side", "f32[2, 2, 3, 3]", false),
    ] {
        let body = graph_function(&text, f);
        let conv = body.lines().find(|l| l.contains("graph.conv2d")).unwrap();
        let sliced = body
            .lines()
            .any(|l| l.contains("graph.slice") && l.ends_with(kernel));
        assert_eq!(sliced, trimmed, "@{f}: {body}");
        assert_eq!(conv.contains("dilation"), !trimmed, "@{f}: {body}");
    }
}

/// A convolution most of whose multiply-adds read padding (DeepLabV3's 3 x
/// 3 window 12 apart over 14 x 14) is split into the regions of its output
/// that meet the image through the same taps (`canonicalize::tap_regions`):
/// an interior, edges and corners, each a convolution without padding of
/// the slice of the image it reads, concatenated back. Strided, grouped
/// and split along the rows only, too; not split: a window that meets the
/// image for most of its multiply-adds, and one whose outputs meet it
/// through more than three sets of taps along an axis.
#[test]
fn convolutions_split_into_the_regions_that_meet_the_same_taps() {
    let src = "fn aspp(x: f32[1, 8, 7, 7], w: f32[4, 8, 3, 3]) -> f32[1, 4, 7, 7] { return conv2d(x, w, padding=5, dilation=5); }
fn halves(x: f32[1, 8, 6, 6], w: f32[4, 8, 3, 3]) -> f32[1, 4, 6, 6] { return conv2d(x, w, padding=3, dilation=3); }
fn strided(x: f32[1, 4, 10, 10], w: f32[4, 2, 3, 3]) -> f32[1, 4, 5, 5] { return conv2d(x, w, stride=2, padding=6, dilation=6, groups=2); }
fn rows(x: f32[1, 4, 8, 8], w: f32[4, 1, 3, 1]) -> f32[1, 4, 8, 8] { return relu(conv2d(x, w, padding=[6, 0], dilation=[6, 1], groups=4)); }
fn most(x: f32[1, 8, 8, 8], w: f32[4, 8, 3, 3]) -> f32[1, 4, 8, 8] { return conv2d(x, w, padding=3, dilation=3); }
fn many(x: f32[1, 2, 5, 5], w: f32[2, 2, 5, 5]) -> f32[1, 2, 9, 9] { return conv2d(x, w, padding=4); }";
    let text = canonicalized_agrees(src);
    for (f, regions) in [
        ("aspp", 9),
        ("halves", 4),
        ("strided", 9),
        ("rows", 3),
        ("most", 1),
        ("many", 1),
    ] {
        let body = graph_function(&text, f);
        let convs: Vec<&str> = body
            .lines()
            .filter(|l| l.contains("graph.conv2d"))
            .collect();
        assert_eq!(convs.len(), regions, "@{f}: {body}");
        let unpadded = convs.iter().all(|l| l.contains("padding = [0, 0]"));
        assert_eq!(unpadded, regions > 1, "@{f}: {body}");
    }
    // The interior of `aspp` is a 1 x 1 convolution of the image's middle.
    let aspp = graph_function(&text, "aspp");
    assert!(
        aspp.contains("{axis = 3, start = 2, end = 5} : f32[1, 8, 3, 3]")
            && aspp.contains("padding = [0, 0], groups = 1} : f32[1, 4, 3, 3]"),
        "{aspp}"
    );
}

/// `src` after the graph passes (printed) computes what it did before them
/// on the graph interpreter, and agrees with it on every lowering.
#[track_caller]
fn canonicalized_agrees(src: &str) -> String {
    let raw = compile_source(&SourceText {
        name: "t.dl".into(),
        text: src.into(),
        weights: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let m = graph(src);
    for (seed, (f, g)) in raw.entry_points().zip(m.entry_points()).enumerate() {
        let inputs = prepare_inputs(f, &[], Some(seed as u64)).unwrap();
        let want = interpret(&raw, f, &inputs).unwrap();
        let got = interpret(&m, g, &inputs).unwrap();
        if let Some(d) = disagreement(g, &got, &want) {
            panic!("@{}: {d}", f.name);
        }
    }
    agree(src);
    dlc_graph::print_module(&m)
}

/// Graph function `@f`'s body in a printed module.
#[track_caller]
fn graph_function<'a>(text: &'a str, f: &str) -> &'a str {
    text.split(&format!("graph.func @{f}("))
        .nth(1)
        .and_then(|b| b.split("graph.func @").next())
        .unwrap_or_else(|| panic!("no function {f}\n{text}"))
}

#[test]
fn user_operators() {
    agree(dlc_tests::USER_OPERATOR_PROGRAM);
}

/// `src`'s tile IR for each of `targets` (with the lanes of its row tiles)
/// has no `tile.reduce` and satisfies `holds`; then `src` agrees with the
/// graph interpreter.
#[track_caller]
fn tiles_hold(src: &str, targets: &[(TargetDesc, usize)], holds: impl Fn(&str, usize) -> bool) {
    let m = graph(src);
    for (target, lanes) in targets {
        let text = dlc_tile::print_module(&kernels(&m, target));
        assert!(
            !text.contains("tile.reduce") && holds(&text, *lanes),
            "{}: {text}",
            target.name
        );
    }
    agree(src);
}

/// The type a packed product's whole register tile of f32 prints with on
/// `target` (`: tile<4x16xf32>` on AVX2).
fn register_tile(target: &TargetDesc) -> String {
    let g = target.gemm_blocking(dlc_core::DType::F32);
    format!(": tile<{}x{}xf32>", g.mr, g.nr)
}

/// An AVX-512 and an AVX2 target, with the lanes of their row tiles.
fn x86_widths() -> [(TargetDesc, usize); 2] {
    [
        (TargetDesc::x86_64_avx512(2), 64),
        (TargetDesc::x86_64_avx2(2), 32),
    ]
}

/// A short reduction for each column of a result (a depthwise convolution's
/// and a max pool's 3 x 3 window) runs as tiles of columns, each tap one
/// multiply-add or max of a tile (of a load, or a slice of the window
/// row's one load), rather than as a tile of three taps reduced for every
/// column: on either x86-64 width and sm_90.
#[test]
fn short_reductions_run_across_their_columns() {
    let [avx512, avx2] = x86_widths();
    tiles_hold(
        dlc_tests::CONTRACTION_PROGRAMS[21],
        &[avx512, avx2, (TargetDesc::sm_90(), 70)],
        |text, lanes| {
            // Where a CPU writes the taps' loop out and no mask cuts the
            // row, the taps slice one load two columns wider.
            let rows = |n: usize| {
                text.matches(&format!("{{pad = 0.0}} : tile<{n}xf32>"))
                    .count()
            };
            !text.contains("tile<3xf32>") && rows(lanes) + rows(lanes + 2) == 2
        },
    );
}

/// An edge-gated aggregation's gradients with respect to its column scores
/// and its features read the adjacency `a[i, j]` along its rows only, on
/// either x86-64 width and sm_90: the column scores' sum over `i` is a
/// blocked kernel of column tiles adding rows (the product it reads laid
/// out `[i, j]` as `a` is), and the features' prologue copy runs along `j`.
/// No read of `a` moves down a column (`#0` in its first index).
#[test]
fn gated_gradients_read_their_matrix_along_its_rows() {
    let [avx512, avx2] = x86_widths();
    let src = dlc_tests::CONTRACTION_PROGRAMS[25];
    let m = graph(src);
    for target in [avx512.0, avx2.0, TargetDesc::sm_90()] {
        let text = dlc_tile::print_module(&kernels(&m, &target));
        let reads: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("tile.load %a["))
            .collect();
        // The tile's innermost axis (`#0` of a row, `#1` of rows) moves
        // along `a`'s last index.
        let along_rows = |l: &&str| {
            let (Some(open), Some(close)) = (l.find("%a["), l.find(']')) else {
                return false;
            };
            let index = &l[open + 3..close];
            let rank = l
                .rsplit("tile<")
                .next()
                .map_or(0, |t| t.matches('x').count());
            let inner = format!("#{}", rank.saturating_sub(1));
            let last = index.rsplit(',').next().unwrap_or("");
            rank >= 1 && last.contains(&inner)
        };
        assert!(
            reads.len() >= 2
                && reads.iter().all(along_rows)
                && text.contains("schedule = \"blocked\""),
            "{}: {text}",
            target.name
        );
    }
    agree(src);
}

/// The same at stride 2: each tap a tile of columns, copied in phases
/// from the input read two elements apart (`2*#0`, which the CPU back end
/// reads as a wide load and a shuffle; plain where the columns are
/// inside), not a tile of three taps reduced for every column.
#[test]
fn strided_short_reductions_run_across_their_columns() {
    tiles_hold(
        dlc_tests::STRIDED_DEPTHWISE_PROGRAM,
        &x86_widths(),
        |text, lanes| {
            let tile = format!(": tile<{lanes}xf32>");
            !text.contains("tile<3xf32>")
                && text
                    .lines()
                    .any(|l| l.contains("2*#0 - 1]") && l.ends_with(&tile) && !l.contains("pad"))
        },
    );
}

/// Element-wise work over small images runs along the image's rows and
/// columns as one axis where every value it reads spans both or neither
/// (a 7 x 7 image as 49 lanes), and keeps two axes where one spans a
/// single axis; both agree with the interpreter.
#[test]
fn small_images_run_as_one_axis() {
    let [flat, rows, hardswish] = dlc_tests::FLAT_IMAGE_PROGRAMS;
    // The loop a program runs along the image (its tiles are the
    // target's vectors, or the whole axis where it fits one).
    for (src, along) in [
        (flat, "hi = 49, step = "),
        (rows, "hi = 7, step = 7}"),
        (hardswish, "hi = 196, step = "),
    ] {
        let m = graph(src);
        for (target, _) in x86_widths() {
            let text = dlc_tile::print_module(&kernels(&m, &target));
            assert!(
                text.contains(along),
                "{}: no `{along}`: {text}",
                target.name
            );
        }
        agree(src);
    }
}

/// 1 x 1 convolutions in a chain, whose inputs the lowering keeps in
/// reused storage (the second and fourth read the first's buffer): each
/// product's programs pack the panels they multiply by themselves, as for
/// an input read once, rather than a kernel packing them into global
/// panels first (rows of 4 KB, 64 lines apart, are not read in place).
/// They agree with the graph interpreter.
#[test]
fn products_of_reused_storage_pack_their_own_panels() {
    let src = "fn f(x: f32[1, 32, 32, 32], weight w1: f32[64, 32, 1, 1], weight w2: f32[32, 64, 1, 1], weight w3: f32[64, 32, 1, 1], weight w4: f32[32, 64, 1, 1]) -> f32[1, 32, 32, 32] { let a = relu(conv2d(x, w1)); let b = relu(conv2d(a, w2)); let c = relu(conv2d(b, w3)); return conv2d(c, w4); }";
    for cpu in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let tiles = kernels(&graph(src), &cpu);
        let text = dlc_tile::print_module(&tiles);
        let body = text.split("tile.func @f_prepare").next().unwrap();
        assert_eq!(
            body.matches("schedule = \"packed\"").count(),
            4,
            "{}: {text}",
            cpu.name
        );
        assert!(!body.contains("pack = [1]"), "{}: {text}", cpu.name);
    }
    agree(src);
}

/// A 1 x 1 convolution over few pixels and many channels is a product with
/// the pixels as its rows and the channels as its columns, stored
/// transposed, where that pads the register tiles at least a tenth less
/// and the product is deep and wide enough (the target's
/// `GemmBlocking::pixel_rows_min`: 128 deep into 512 channels or 512 deep
/// into 256 on AVX-512 with two FMA units, into 160 on Zen 4, 48 into 32
/// on AVX2; on Zen 4 also 96 deep into 96 where the pixels leave more
/// than a fifth of the columns empty, `few_pixel_rows_min`): 7 x 7 on
/// either x86-64 width, 14 x 14 where a
/// panel is 32 columns (196 pixels in 7 panels of 32, but 13 of 16 on
/// AVX2). 32 deep or over 8 x 8 the channels stay the rows on both, and
/// 256 deep into 160 channels on AVX-512; so do they over 14 x 14 with a
/// residual, whose reads per channel and pixel want a fifth of the panels
/// empty (over 7 x 7 with one the pixels are the rows, on Zen 4 too). So does a convolution whose
/// product reads an im2col buffer (strided 1 x 1 and 3 x 3), the buffer
/// read transposed as the rows. The first and the strided one run on the
/// tile interpreter (the others are millions of multiply-adds each; every
/// one runs compiled against the graph interpreter in `jit.rs`).
#[test]
fn few_pixels_are_the_rows_of_a_convolution_product() {
    let [
        bias,
        residual,
        fourteen,
        shallow,
        narrow,
        large,
        strided,
        window,
        deep,
        fourteen_residual,
    ] = dlc_tests::PIXEL_ROW_PROGRAMS;
    // The product's sizes on AVX-512, then on AVX2.
    for (src, sizes) in [
        (bias, ["sizes = [49, 512, 128]"; 2]),
        (residual, ["sizes = [49, 512, 128]"; 2]),
        (
            fourteen,
            ["sizes = [196, 512, 128]", "sizes = [512, 196, 128]"],
        ),
        (shallow, ["sizes = [512, 49, 32]"; 2]),
        (narrow, ["sizes = [160, 49, 256]", "sizes = [49, 160, 256]"]),
        (large, ["sizes = [512, 64, 128]"; 2]),
        (strided, ["sizes = [49, 512, 128]"; 2]),
        (window, ["sizes = [49, 512, 576]"; 2]),
        (deep, ["sizes = [49, 320, 960]"; 2]),
        (fourteen_residual, ["sizes = [512, 196, 128]"; 2]),
    ] {
        let m = graph(src);
        for ((target, _), sizes) in x86_widths().into_iter().zip(sizes) {
            let loops = dlc_driver::lower_to_loops(&m, &target).unwrap();
            let text = print_module(&loops);
            assert!(
                text.contains(sizes),
                "{}: no `{sizes}`: {text}",
                target.name
            );
            let tiles = dlc_tile::print_module(&kernels(&m, &target));
            assert!(
                tiles.contains("schedule = \"packed\""),
                "{}: {tiles}",
                target.name
            );
        }
    }
    // Zen 4 splits each 512-bit FMA in two: 512 deep or more into 160
    // channels or more takes the pixels as rows there, with a residual or
    // without; and 49 pixels, more than a fifth of their two panels empty,
    // from 96 deep into 96 channels (`few_pixel_rows_min`): 256 deep into
    // 160 too, not 32 deep.
    let zen4 = TargetDesc::for_cpu("znver4").unwrap();
    for (src, sizes) in [
        (deep, "sizes = [49, 320, 960]"),
        (narrow, "sizes = [49, 160, 256]"),
        (residual, "sizes = [49, 512, 128]"),
        (bias, "sizes = [49, 512, 128]"),
        (shallow, "sizes = [512, 49, 32]"),
    ] {
        let loops = print_module(&dlc_driver::lower_to_loops(&graph(src), &zen4).unwrap());
        assert!(loops.contains(sizes), "{loops}");
    }
    agree(bias);
    agree(strided);
}

/// A 1 x 1 convolution over few pixels deep enough for three slices of
/// the depth reads its pixels (the product's rows) where they lie, in
/// slices of 64 (`Packing::in_place_depth`): no kernel packs them into
/// strips. 1152 deep is six slices of 192 for the packed blocking (not
/// five of 240), so it takes 18 of 64. One of two slices (320 deep) keeps
/// the kernel packing its strips. On Zen 4 and AVX2, whose pixels are the
/// rows of all three; AVX-512 with two FMA units keeps the channels of the
/// first two as rows (`GemmBlocking::pixel_rows_min`: into 256 or more).
/// Each runs compiled against the graph interpreter in `jit.rs`.
#[test]
fn deep_products_read_their_pixels_in_place() {
    let [deep, residual, shallow] = dlc_tests::DEEP_PIXEL_ROW_PROGRAMS;
    let targets = [
        (TargetDesc::for_cpu("znver4").unwrap(), [true; 3]),
        (TargetDesc::x86_64_avx2(2), [true; 3]),
        (TargetDesc::x86_64_avx512(2), [false, false, true]),
    ];
    for (target, pixel_rows) in &targets {
        for ((src, sizes, in_place), rows) in [
            (deep, "sizes = [49, 192, 1152]", true),
            (residual, "sizes = [49, 160, 960]", true),
            (shallow, "sizes = [49, 1280, 320]", false),
        ]
        .into_iter()
        .zip(pixel_rows)
        {
            let m = graph(src);
            let loops = print_module(&dlc_driver::lower_to_loops(&m, target).unwrap());
            assert_eq!(
                loops.contains(sizes),
                *rows,
                "{}: `{sizes}`: {loops}",
                target.name
            );
            let text = dlc_tile::print_module(&kernels(&m, target));
            let body = text.split("tile.func @f_prepare").next().unwrap();
            let product = body
                .lines()
                .find(|l| l.contains("schedule = \"packed\"") && !l.contains("pack = "))
                .unwrap_or_else(|| panic!("{}: no product kernel: {text}", target.name));
            let read_in_place = in_place && *rows;
            // With the channels as rows the weights are the strips,
            // packed when they are bound.
            assert_eq!(
                body.contains("pack = [0]"),
                *rows && !in_place,
                "{}: {text}",
                target.name
            );
            assert_eq!(
                product.contains(", 64]"),
                read_in_place,
                "{}: {product}",
                target.name
            );
            // Packed, 1152 deep is six slices of 192.
            if src == deep && !rows {
                assert!(product.contains(", 192]"), "{}: {product}", target.name);
            }
        }
    }
}

/// Constants whose buffers share storage (ONNX attention's scale, zero
/// and -inf, as imported): compiled code's tile IR prepares none of them
/// once, and agrees with the interpreter.
#[test]
fn constants_in_reused_storage_are_not_prepared() {
    agree(dlc_tests::REUSED_CONSTANT_STORAGE_PROGRAM);
}

/// A convolution of one pixel per image through a 1 x 1 window (a
/// squeeze-excite block's layers) is a dot product per output channel,
/// vectorized along the input's channels and reduced, not a product whose
/// tiles run along the weights' rows (each lane a row `C` floats from the
/// next).
#[test]
fn pixel_convolutions_are_dot_products_along_the_channels() {
    for src in dlc_tests::PIXEL_CONV_PROGRAMS {
        let m = graph(src);
        for (target, _) in x86_widths() {
            let text = dlc_tile::print_module(&kernels(&m, &target));
            assert!(
                text.contains("tile.reduce")
                    && text.contains("schedule = \"rows\"")
                    && !text.contains("schedule = \"dot\"")
                    && !text.contains("schedule = \"packed\""),
                "{}: {text}",
                target.name
            );
        }
        agree(src);
    }
}

/// A window longer than the row is wide (5 x 5 over 7 columns) still runs
/// across the columns: 25 taps of 7-lane tiles (each window row one padded
/// load of 11 columns, its taps slices of it), the SiLU after them on the
/// tile, not 5-lane tiles of taps reduced for every column.
#[test]
fn wide_windows_run_across_their_columns() {
    tiles_hold(
        dlc_tests::WIDE_WINDOW_DEPTHWISE_PROGRAM,
        &x86_widths(),
        |text, _| {
            !text.contains("tile<5xf32>")
                && text.contains("tile.silu %")
                && text.contains("{pad = 0.0} : tile<11xf32>")
                && text.contains("tile.slice")
        },
    );
}

/// One row times a transposed weight is a dot product of the row with each
/// of the weight's rows (a reduction along both operands' contiguous axis,
/// its epilogue after it), one program per output column, not a packed
/// product copying the weight into panels.
#[test]
fn a_row_by_a_transposed_weight_is_dot_products() {
    let src = dlc_tests::ROW_BY_TRANSPOSED_PROGRAM;
    let m = graph(src);
    let text = print_module(&lowered(&m));
    assert!(
        !text.contains("loop.matmul")
            && text.contains("loop.parallel {lo = 0, hi = 70}")
            && text.contains("loop.relu"),
        "{text}"
    );
    let tile = dlc_tile::print_module(&kernels(&m, &TargetDesc::x86_64_avx512(2)));
    assert!(
        tile.contains("grid = [1, 70], schedule = \"rows\"") && tile.contains("tile.reduce"),
        "{tile}"
    );
    agree(src);
}

/// One row times a weight stored `[K, N]` is tiles of columns, each the
/// sum over the depth of a row of the weight scaled by the row's element
/// (the weight read once along its rows, no reduction across lanes), not a
/// packed product of one row.
#[test]
fn a_row_by_a_matrix_is_tiles_of_columns() {
    let src = dlc_tests::ROW_BY_MATRIX_PROGRAM;
    let m = graph(src);
    let text = print_module(&lowered(&m));
    assert!(
        !text.contains("loop.matmul") && text.contains("loop.relu"),
        "{text}"
    );
    // 70 columns: one tile where that is at most two tiles' worth
    // (AVX-512's of 64: `a_chunk_of_columns_is_one_tile`), else tiles of
    // `lanes`, the ragged rest its own exact tile (AVX2,
    // `ragged_vector_loops_...`).
    tiles_hold(src, &x86_widths(), |tile, lanes| {
        let rest = 70 % lanes;
        !tile.contains("schedule = \"packed\"")
            && if 70 <= 2 * lanes {
                tile.contains("hi = 70, step = 70")
            } else {
                tile.contains(&format!("hi = {}, step = {lanes}", 70 - rest))
                    && tile.contains(&format!("hi = 70, step = {rest}"))
            }
    });
}

/// One row times a weight stored `[K, N]` with enough columns takes them
/// in chunks that are programs of their own on a CPU (a classifier's
/// product ran as one program, on one thread however many there were):
/// the fewest chunks from 8 that are whole vectors (200 columns on AVX2:
/// 25 of 8), or else at least a vector each (AVX-512: 8 of 25). On a GPU,
/// one program as before. Each agrees with the graph interpreter.
#[test]
fn a_row_by_a_matrix_takes_its_columns_in_chunks() {
    let src = "fn f(x: f32[1, 64], weight w: f32[64, 200], weight b: f32[200]) -> f32[1, 200] { return relu(x @ w + b); }";
    let m = graph(src);
    for (target, grid) in [
        (
            TargetDesc::x86_64_avx2(2),
            "grid = [1, 25], schedule = \"rows\"",
        ),
        (
            TargetDesc::x86_64_avx512(2),
            "grid = [1, 8], schedule = \"rows\"",
        ),
        (TargetDesc::sm_90(), "grid = [1], "),
    ] {
        let tiles = kernels(&m, &target);
        let text = dlc_tile::print_module(&tiles);
        assert!(
            text.contains(grid) && !text.contains("schedule = \"packed\""),
            "{}: {text}",
            target.name
        );
        if target.cpu().is_some() {
            agree_on_tile_interpreter(&m, &tiles, &target);
        }
    }
    agree(src);
}

/// A loop of tiles taken outside a longer loop runs as one tile where its
/// iterations are at most two tiles' worth: a row by a matrix in chunks of
/// 40 (AVX2, tiles of 32) or 125 (AVX-512, tiles of 64) columns reads each
/// of the matrix's rows once per chunk, not for a whole tile and again for
/// the rest. A matrix of weights is read from a copy whose chunks are
/// contiguous, `[chunks, K, width]`, which the preparer makes; a GPU, which
/// takes no chunks, reads it in place.
#[test]
fn a_chunk_of_columns_is_one_tile() {
    let src = dlc_tests::ROW_BY_MATRIX_IN_CHUNKS;
    let m = graph(src);
    for (target, copy, tile) in [
        (
            TargetDesc::x86_64_avx2(2),
            "buffer<f32[25, 96, 40]>",
            "tile.load %w_packed[%1, %6, %2 + #0] : tile<40xf32>",
        ),
        (
            TargetDesc::x86_64_avx512(2),
            "buffer<f32[8, 96, 125]>",
            "tile.load %w_packed[%1, %6, %2 + #0] : tile<125xf32>",
        ),
    ] {
        let tiles = kernels(&m, &target);
        let text = dlc_tile::print_module(&tiles);
        let prepare = text.find("tile.func @f_prepare").expect(&text);
        let (call, prepared) = text.split_at(prepare);
        let loads: Vec<&str> = call
            .lines()
            .filter(|l| l.contains("= tile.load %w"))
            .collect();
        assert!(
            call.contains(&format!("weight %w_packed: {copy}"))
                && loads.len() == 1
                && loads[0].contains(tile)
                && prepared.contains(", %w_packed["),
            "{}: {text}",
            target.name
        );
        agree_on_tile_interpreter(&m, &tiles, &target);
    }
    let text = dlc_tile::print_module(&kernels(&m, &TargetDesc::sm_90()));
    assert!(!text.contains("w_packed"), "{text}");
    agree(src);
}

/// A product whose epilogue reads an operand along both axes (a residual,
/// a weight's update), of a depth of at most `Packing::heavy_outer_depth`,
/// walks each strip across its panels and runs that epilogue on each
/// register tile (a block of sums of one tile); a deeper one keeps the
/// program's block of sums (its rows by its chunk's columns) and runs the
/// epilogue on it after the product. All agree with the graph interpreter.
#[test]
fn residual_products_up_to_a_depth_run_their_epilogue_per_tile() {
    // Per program, [AVX2's, AVX-512's] block of sums.
    let expected = [
        [
            "buffer<f32[4, 16], scratch>",
            "buffer<f32[14, 32], scratch>",
        ],
        [
            "buffer<f32[24, 80], scratch>",
            "buffer<f32[28, 64], scratch>",
        ],
        [
            "buffer<f32[4, 16], scratch>",
            "buffer<f32[14, 32], scratch>",
        ],
    ];
    for (src, expected) in dlc_tests::RESIDUAL_PRODUCT_PROGRAMS.lines().zip(expected) {
        let m = graph(src);
        for (target, block) in [TargetDesc::x86_64_avx2(2), TargetDesc::x86_64_avx512(2)]
            .into_iter()
            .zip(expected)
        {
            let tiles = kernels(&m, &target);
            let text = dlc_tile::print_module(&tiles);
            // The product's kernel's first scratch buffer is its block.
            let first = text.lines().find(|l| l.contains("scratch>")).expect(&text);
            assert!(first.contains(block), "{}: {src}\n{text}", target.name);
            agree_on_tile_interpreter(&m, &tiles, &target);
        }
        agree(src);
    }
}

/// A product whose programs copy their own panels from an operand larger
/// than the target's L2 prefetches each next panel's slice as it copies one
/// (`tile.prefetch`, `dlc_tests::PREFETCHED_PRODUCT_PROGRAMS`): on AVX2
/// (512 KB), not on AVX-512 (2 MB). Both agree with the graph interpreter
/// on the tile interpreter (compiled: `dlc-llvm`'s
/// `prefetching_products_compile_and_agree`). Zen 4's L2 is 1 MB:
/// a 32 -> 96 1 x 1 convolution over 112 x 112, whose input is 1.6 MB (as
/// MobileNetV2's first projection's, which of 16 rows reads its panels in
/// place: `Packing::in_place_rows`), prefetches there and not on Intel's
/// AVX-512 cores.
#[test]
fn products_beyond_the_l2_prefetch_their_next_panel() {
    let projection = "fn f1(x: f32[1, 32, 112, 112], w: f32[96, 32, 1, 1]) -> f32[1, 96, 112, 112] { return conv2d(x, w); }";
    let zen4 = TargetDesc::for_cpu("znver4").expect("a known CPU");
    for (target, prefetches) in [(zen4, true), (TargetDesc::x86_64_avx512(2), false)] {
        let text = dlc_tile::print_module(&kernels(&graph(projection), &target));
        assert_eq!(
            text.contains("tile.prefetch %0["),
            prefetches,
            "{}\n{text}",
            target.name
        );
    }
    for src in dlc_tests::PREFETCHED_PRODUCT_PROGRAMS.lines() {
        let m = graph(src);
        for (target, prefetches) in [
            (TargetDesc::x86_64_avx2(2), true),
            (TargetDesc::x86_64_avx512(2), false),
        ] {
            let tiles = kernels(&m, &target);
            let text = dlc_tile::print_module(&tiles);
            // Of the input's panels (`%0`, a view of `%x`; the register
            // tiles' epilogues prefetch the result's lines on both).
            assert_eq!(
                text.contains("tile.prefetch %0["),
                prefetches,
                "{}: {src}\n{text}",
                target.name
            );
            agree_on_tile_interpreter(&m, &tiles, &target);
        }
    }
}

/// A product whose last panel of 32 columns would be at most half full
/// takes 12 x 16 register tiles on Zen 4 (`GemmBlocking::half_panel_tile`):
/// 100 pixels (10 x 10, the last panel holding 4) and a matrix of 40
/// columns; 49 pixels (17 in the last panel) keep 6 x 32, as do 784 (28 x
/// 28: 16 in the last, 784 columns against 800 saving too little), and all
/// of them on Intel's AVX-512 cores. Each agrees with the graph interpreter
/// on the tile interpreter.
#[test]
fn a_half_empty_last_panel_takes_a_narrower_register_tile() {
    let zen4 = TargetDesc::for_cpu("znver4").expect("a known CPU");
    for (src, half) in [
        (
            "fn f(x: f32[1, 64, 10, 10], w: f32[48, 64, 1, 1], b: f32[48, 1, 1]) -> f32[1, 48, 10, 10] { return relu(conv2d(x, w) + b); }",
            true,
        ),
        (
            "fn f(a: f32[64, 96], b: f32[96, 40]) -> f32[64, 40] { return a @ b; }",
            true,
        ),
        (
            "fn f(x: f32[1, 64, 7, 7], w: f32[48, 64, 1, 1]) -> f32[1, 48, 7, 7] { return conv2d(x, w); }",
            false,
        ),
        (
            "fn f(a: f32[24, 16], b: f32[16, 784]) -> f32[24, 784] { return a @ b; }",
            false,
        ),
    ] {
        let m = graph(src);
        for (target, narrow) in [(&zen4, half), (&TargetDesc::x86_64_avx512(2), false)] {
            let tiles = kernels(&m, target);
            let text = dlc_tile::print_module(&tiles);
            let blocking = if narrow {
                "blocking = [12, 16,".to_string()
            } else {
                format!(
                    "blocking = [{}, 32,",
                    target.gemm_blocking(dlc_core::DType::F32).mr
                )
            };
            assert!(
                text.contains(&blocking),
                "{}: no `{blocking}`: {src}\n{text}",
                target.name
            );
            agree_on_tile_interpreter(&m, &tiles, target);
        }
    }
}

/// A product's programs are made even where that costs no padding, so
/// that neither of two threads runs one more than the other: 36 panels of
/// 32 (1152 output channels, 49 pixels as the rows) in 12 chunks of 3, not
/// 9 of 4; and on Zen 4, 5 panels of 32 (160 channels) as 10 of 16 with
/// its half-panel tile (`balancing_tile`; Intel's AVX-512 cores, with
/// none, keep their 14 x 32 tiles, whose 168-row blocks take 160 channels
/// as rows in two chunks of pixels). Each agrees with the graph
/// interpreter on the tile interpreter.
#[test]
fn a_products_programs_are_even_where_that_pads_nothing() {
    let zen4 = TargetDesc::for_cpu("znver4").expect("a known CPU");
    let intel = TargetDesc::x86_64_avx512(2);
    for (src, expected) in [
        (
            "fn f(x: f32[1, 192, 7, 7], w: f32[1152, 192, 1, 1]) -> f32[1, 1152, 7, 7] { return conv2d(x, w); }",
            [("grid = [1, 1, 12]", 32), ("grid = [1, 1, 12]", 32)],
        ),
        (
            "fn f(x: f32[1, 960, 7, 7], w: f32[160, 960, 1, 1]) -> f32[1, 160, 7, 7] { return conv2d(x, w); }",
            [("grid = [1, 1, 10]", 16), ("grid = [1, 1, 2]", 32)],
        ),
    ] {
        let m = graph(src);
        for (target, (grid, nr)) in [&zen4, &intel].into_iter().zip(expected) {
            // The half-panel tile's rows, or the blocking's.
            let g = target.gemm_blocking(dlc_core::DType::F32);
            let mr = match g.half_panel_tile {
                Some([rows, width]) if width == nr => rows,
                _ => g.mr,
            };
            let blocking = format!("blocking = [{mr}, {nr},");
            let tiles = kernels(&m, target);
            let text = dlc_tile::print_module(&tiles);
            let product = text
                .lines()
                .find(|l| l.contains("schedule = \"packed\"") && !l.contains("pack = "))
                .unwrap_or_default();
            assert!(
                product.contains(grid) && product.contains(&blocking),
                "{}: not `{grid}` and `{blocking}`: {src}\n{text}",
                target.name
            );
            agree_on_tile_interpreter(&m, &tiles, target);
        }
    }
}

/// A product of few rows (`Packing::in_place_rows`) reads its right
/// operand where it lies instead of each program copying its panels, where
/// a slice of that operand's rows takes at most twice the ways of each L1
/// set it falls in: on Zen 4 (8 ways, 64 sets) a 32 -> 16 1 x 1
/// convolution over 56 x 56 (rows 196 lines apart: a slice's 32 rows two
/// to a set) and 144 -> 16 over 24 x 24 (rows 36 lines apart: 144 rows
/// in 16 sets, 9 to a set) have no panel in scratch, while 32 -> 96 (96
/// rows) and 32 -> 16 over 32 x 32 (rows 64 lines apart, every row of a
/// slice in the same set) copy theirs. Each agrees with the graph
/// interpreter on the tile interpreter.
#[test]
fn a_product_of_few_rows_reads_its_columns_in_place() {
    let zen4 = TargetDesc::for_cpu("znver4").expect("a known CPU");
    for (src, panel, in_place) in [
        (
            "fn f(x: f32[1, 32, 56, 56], w: f32[16, 32, 1, 1]) -> f32[1, 16, 56, 56] { return conv2d(x, w); }",
            "buffer<f32[32, 32], scratch>",
            true,
        ),
        (
            "fn f(x: f32[1, 144, 24, 24], w: f32[16, 144, 1, 1]) -> f32[1, 16, 24, 24] { return conv2d(x, w); }",
            "buffer<f32[144, 32], scratch>",
            true,
        ),
        (
            "fn f(x: f32[1, 32, 56, 56], w: f32[96, 32, 1, 1]) -> f32[1, 96, 56, 56] { return conv2d(x, w); }",
            "buffer<f32[32, 32], scratch>",
            false,
        ),
        (
            "fn f(x: f32[1, 32, 32, 32], w: f32[16, 32, 1, 1]) -> f32[1, 16, 32, 32] { return conv2d(x, w); }",
            "buffer<f32[32, 32], scratch>",
            false,
        ),
    ] {
        let m = graph(src);
        let tiles = kernels(&m, &zen4);
        let text = dlc_tile::print_module(&tiles);
        assert!(
            text.contains("schedule = \"packed\""),
            "not a packed product: {src}\n{text}"
        );
        assert_eq!(!text.contains(panel), in_place, "{src}\n{text}");
        agree_on_tile_interpreter(&m, &tiles, &zen4);
    }
}

/// A shallow product (a depth of at most `Packing::strips_outer_depth`)
/// copies its chunk's panels first, into one scratch buffer, and walks each
/// strip across them, so its result is written a strip's rows at a time
/// along their columns; a deeper one copies a panel at a time and runs every
/// strip over it. Both agree with the graph interpreter.
#[test]
fn shallow_products_walk_each_strip_across_their_panels() {
    // Per program, [AVX2's, AVX-512's] panel buffer and the two loops
    // around the register tile's, outer first: 10 strips of 4 (AVX2, and
    // a last tile of 2) or 3 of 14 (AVX-512) output channels over 5 or 6
    // panels of 16 or 32 pixels a program; 15 strips over 7 panels, or 4
    // of 14 (and a last tile of 4) over 4; the deeper one panel by panel.
    let expected = [
        [
            ("buffer<f32[5, 16, 16], scratch>", ["hi = 10", "hi = 5"]),
            ("buffer<f32[6, 16, 32], scratch>", ["hi = 3", "hi = 6"]),
        ],
        [
            ("buffer<f32[7, 12, 16], scratch>", ["hi = 15", "hi = 7"]),
            ("buffer<f32[4, 12, 32], scratch>", ["hi = 4", "hi = 4"]),
        ],
        [
            ("buffer<f32[32, 16], scratch>", ["hi = 5", "hi = 10"]),
            ("buffer<f32[32, 32], scratch>", ["hi = 6", "hi = 3"]),
        ],
    ];
    let cases = dlc_tests::SHALLOW_PRODUCT_PROGRAMS.lines().zip(expected);
    for (src, expected) in cases {
        let m = graph(src);
        for (target, (panels, loops)) in [TargetDesc::x86_64_avx2(2), TargetDesc::x86_64_avx512(2)]
            .into_iter()
            .zip(expected)
        {
            let tiles = kernels(&m, &target);
            let text = dlc_tile::print_module(&tiles);
            let lines: Vec<&str> = text.lines().collect();
            // The register tile's loop carries the accumulator.
            let tile_loop = lines
                .iter()
                .position(|l| l.contains("= tile.for %"))
                .expect(&text);
            // The loops enclosing it, innermost first.
            let indent = |l: &str| l.len() - l.trim_start().len();
            let mut depth = indent(lines[tile_loop]);
            let mut around = vec![];
            for l in lines[..tile_loop].iter().rev() {
                if indent(l) < depth {
                    depth = indent(l);
                    around.push(*l);
                }
            }
            assert!(
                text.contains(panels)
                    && around[..2]
                        .iter()
                        .rev()
                        .zip(loops)
                        .all(|(l, hi)| l.contains("tile.for") && l.contains(&format!("{hi},"))),
                "{}: {src}\n{text}",
                target.name
            );
            agree_on_tile_interpreter(&m, &tiles, &target);
        }
        agree(src);
    }
}

/// A reduction kept over a last axis of one (batchnorm's per-channel mean)
/// reads nothing that moves with that axis: it stays tiles along the
/// image's rows, not one-lane tiles across the kept axis.
#[test]
fn a_reduction_over_a_kept_axis_of_one_is_tiles_of_rows() {
    let src = "fn f(x: f32[2, 3, 9, 56]) -> f32[1, 3, 1, 1] { return mean(x, axis=[0, 2, 3], keepdims=true); }";
    let m = graph(src);
    let text = dlc_tile::print_module(&kernels(&m, &TargetDesc::x86_64_avx512(2)));
    assert!(
        text.contains(": tile<56xf32>") && !text.contains("tile<1xf32>"),
        "{text}"
    );
    agree(src);
}

/// A reduction over the trailing axes of a row-major operand (a global
/// average pool) is one loop over their elements, as one row of a view
/// (`[2, 3, 196]`: a few wide tiles summed across lanes once per result,
/// not 14 rows of 14); over axes that do not trail (or one axis) the
/// operand is read through its own shape. Kept or dropped axes, sums,
/// means and maxima agree with the graph interpreter.
#[test]
fn a_reduction_over_trailing_axes_is_one_row() {
    let flat = [
        "fn f(x: f32[2, 3, 14, 14]) -> f32[2, 3, 1, 1] { return mean(x, axis=[2, 3], keepdims=true); }",
        "fn f(x: f32[2, 3, 14, 14]) -> f32[2, 3] { return max(x, axis=[3, 2]); }",
        "fn f(x: f32[2, 3, 14, 14]) -> f32[2] { return sum(x, axis=[1, 2, 3]); }",
    ];
    let shaped = [
        "fn f(x: f32[2, 3, 14, 14]) -> f32[2, 14] { return sum(x, axis=[1, 2]); }",
        "fn f(x: f32[2, 3, 14, 14]) -> f32[2, 3, 14] { return sum(x, axis=3); }",
    ];
    for (src, views) in flat
        .iter()
        .map(|s| (s, true))
        .chain(shaped.iter().map(|s| (s, false)))
    {
        let text = print_module(&lowered(&graph(src)));
        assert_eq!(text.contains("loop.view"), views, "{src}\n{text}");
        agree(src);
    }
}

/// A convolution's kernel is its product's left operand: when it is a
/// declared weight, a kernel of its own packs its strips, which the
/// preparer runs once per binding (`@f_prepare`), rather than every program
/// of every call packing its rows.
#[test]
fn a_weight_kernel_is_packed_when_bound() {
    let src = "fn f(x: f32[1, 32, 14, 14], weight w: f32[96, 32, 1, 1]) -> f32[1, 96, 14, 14] { return relu(conv2d(x, w)); }";
    let m = graph(src);
    let text = dlc_tile::print_module(&kernels(&m, &TargetDesc::x86_64_avx512(2)));
    let prepare = text.find("tile.func @f_prepare").expect(&text);
    assert!(text[prepare..].contains("pack = [0]"), "{text}");
    assert!(!text[..prepare].contains("pack = [0]"), "{text}");
    agree(src);
}

/// The same for a strided convolution, whose programs copy their im2col
/// panels from the input, and for its kernel given as a constant (an
/// imported model's initializer, lifted to a weight for compiled code):
/// a kernel of its own packs the strips and the preparer runs it once.
/// ResNet-18's and ResNet-50's stride-2 convolutions (their stems too) had
/// every program of every call pack the whole kernel (the 3 x 3 from 256
/// to 512 channels: 4.7 MB, in each program).
#[test]
fn a_strided_convolutions_kernel_is_packed_when_bound() {
    let kernels_of = |text: &str| -> String {
        text.lines()
            .filter(|l| l.contains("tile.func") || l.contains("tile.kernel"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let check = |t: &dlc_tile::Module, what: &str| {
        let text = dlc_tile::print_module(t);
        let prepare = text.find("tile.func @f_prepare").unwrap_or_else(|| {
            panic!("{what}: no preparer\n{}", kernels_of(&text));
        });
        let main = &text[..prepare];
        assert!(
            text[prepare..].contains("pack = [0]") && !main.contains("pack = [0]"),
            "{what}: the kernel's strips are packed per call\n{}",
            kernels_of(&text)
        );
        assert!(
            !main.contains("tile.global"),
            "{what}: the kernel is read per call\n{}",
            kernels_of(&text)
        );
    };
    let declared = [
        "fn f(x: f32[1, 8, 28, 28], weight w: f32[32, 8, 3, 3]) -> f32[1, 32, 14, 14] { return relu(conv2d(x, w, stride=2, padding=1)); }",
        "fn f(x: f32[1, 3, 32, 32], weight w: f32[16, 3, 7, 7]) -> f32[1, 16, 16, 16] { return relu(conv2d(x, w, stride=2, padding=3)); }",
    ];
    for src in declared {
        let m = graph(src);
        for target in [TargetDesc::x86_64_avx2(2), TargetDesc::x86_64_avx512(2)] {
            check(&kernels(&m, &target), &format!("{src} on {}", target.name));
        }
        agree(src);
    }
    let values: Vec<String> = (0..32 * 8 * 9)
        .map(|i| format!("{:.3}", ((i * 37) % 17) as f64 / 17.0 - 0.5))
        .collect();
    let constant = format!(
        "fn f(x: f32[1, 8, 28, 28]) -> f32[1, 32, 14, 14] {{ return relu(conv2d(x, tensor([{}], [32, 8, 3, 3], f32), stride=2, padding=1)); }}",
        values.join(", ")
    );
    let m = graph(&constant);
    for target in [TargetDesc::x86_64_avx2(2), TargetDesc::x86_64_avx512(2)] {
        let t = dlc_driver::lower_for_code(&m, &target).unwrap_or_else(|e| panic!("{e}"));
        check(&t, &format!("a constant kernel on {}", target.name));
    }
    agree(&constant);
}

/// The `tile.prefetch` ops of tile IR `text`: each one's buffer, through
/// any views to the buffer they view, and the op's text.
fn prefetches(text: &str) -> Vec<(String, String)> {
    let views: std::collections::HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(" = tile.view ")?;
            Some((name, rest.split_whitespace().next()?))
        })
        .collect();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("tile.prefetch "))
        .map(|l| {
            let mut buf = &l[..l.find('[').unwrap_or(l.len())];
            while let Some(b) = views.get(buf) {
                buf = b;
            }
            (buf.to_string(), l.to_string())
        })
        .collect()
}

/// A register tile's epilogue prefetches the lines of its rows two panels
/// ahead in its result and in the residual it reads (`Packing::
/// epilogue_prefetch`): a 1 x 1 convolution with a residual, whose
/// programs walk each strip across their panels, and one with a clamp
/// only (or a bias too: a vector along the rows, never prefetched),
/// walking each panel across its strips. A result stored along its
/// rows (49 pixels as the rows of a deeper product) is prefetched the other
/// way, its tile's channels `Packing::result_rows_ahead` rows further
/// (`[.., row + 16] {shape = [nr, rows]}`), and never panels ahead; nothing
/// in a program's scratch (a Winograd convolution's products) is. All agree
/// with the graph interpreter.
#[test]
fn a_register_tiles_epilogue_prefetches_the_lines_ahead() {
    let residual = "fn f(x: f32[1, 16, 32, 32], weight w: f32[64, 16, 1, 1], r: f32[1, 64, 32, 32]) -> f32[1, 64, 32, 32] { return relu(conv2d(x, w) + r); }";
    let clamp = "fn f(x: f32[1, 64, 32, 32], weight w: f32[32, 64, 1, 1]) -> f32[1, 32, 32, 32] { return relu(conv2d(x, w)); }";
    let biased = "fn f(x: f32[1, 64, 32, 32], weight w: f32[32, 64, 1, 1], weight b: f32[32, 1, 1]) -> f32[1, 32, 32, 32] { return relu(conv2d(x, w) + b); }";
    let pixels = "fn f(x: f32[1, 256, 7, 7], weight w: f32[512, 256, 1, 1]) -> f32[1, 512, 7, 7] { return relu(conv2d(x, w)); }";
    let winograd = "fn f(x: f32[1, 64, 14, 14], weight w: f32[64, 64, 3, 3]) -> f32[1, 64, 14, 14] { return relu(conv2d(x, w, padding=1)); }";
    for target in [TargetDesc::x86_64_avx2(2), TargetDesc::x86_64_avx512(2)] {
        let nr = target.gemm_blocking(dlc_core::DType::F32).nr;
        let rows_ahead = dlc_lower::ScheduleParams::for_target(&target)
            .packed
            .expect("a CPU's packing")
            .result_rows_ahead;
        assert_eq!(rows_ahead, 16, "a line of floats");
        // The buffers prefetched two panels to the right, and those
        // prefetched rows ahead (a run of rows for each of `nr` columns).
        for (src, panels_ahead, rows) in [
            (residual, vec!["%out0", "%r"], vec![]),
            (clamp, vec!["%out0"], vec![]),
            (biased, vec!["%out0"], vec![]),
            (pixels, vec![], vec!["%out0"]),
            (winograd, vec![], vec![]),
        ] {
            let text = dlc_tile::print_module(&kernels(&graph(src), &target));
            // Prefetches but those of the input's panels as they are
            // copied (`Conv::prefetches_panels`) and of packed weights
            // (`weights_from_memory_are_prefetched_ahead`).
            let right = format!(" + {}] ", 2 * nr);
            let down = format!(" + {rows_ahead}] {{shape = [{nr}, ");
            let (mut got_right, mut got_down) = (vec![], vec![]);
            for (buf, l) in prefetches(&text) {
                if buf == "%x" || buf.ends_with("_packed") {
                    continue;
                }
                match (l.contains(&right), l.contains(&down)) {
                    (true, false) => got_right.push(buf),
                    (false, true) => got_down.push(buf),
                    _ => panic!("{src} on {}: {l}", target.name),
                }
            }
            for (got, want) in [(got_right, panels_ahead), (got_down, rows)] {
                let mut got = got;
                got.sort();
                got.dedup();
                let mut want: Vec<String> = want.into_iter().map(String::from).collect();
                want.sort();
                assert_eq!(got, want, "{src} on {}\n{text}", target.name);
            }
        }
    }
    for src in [residual, clamp, biased, pixels, winograd] {
        agree(src);
    }
}

/// Weights packed when they are bound are prefetched by the register tiles
/// that read them (`Packing::weight_prefetch`): a convolution's kernel, the
/// product's left operand in strips, one strip ahead in every tile's loop
/// (`[.., strip + 1, k, 0]`, one line an iteration); panels of weights
/// (`x @ w`, and a 1 x 1 convolution over 7 x 7 whose pixels are the
/// rows) the slice the program multiplies next, the next panel's
/// (`[kb, nb + 1, ..]`), where its chunk has more than one and its rows
/// take as long as the slice's fetch from memory (40 rows by 1024
/// columns; or a depth of one slice, 256 here), else the same panel's
/// next slice of the depth (`[kb + 1, nb, ..]`: a chunk of one panel, 64
/// columns; 4 rows), in the first strip's tiles alone, into the L2
/// (`level = 2`: the strips still read this slice's panel). A product of
/// activations prefetches no operand, nor does a schedule without the
/// flag. All agree with the graph interpreter.
#[test]
fn weights_from_memory_are_prefetched_ahead() {
    let kernel = "fn f(x: f32[1, 96, 7, 7], weight w: f32[40, 96, 1, 1]) -> f32[1, 40, 7, 7] { return relu(conv2d(x, w)); }";
    let panels = "fn f(x: f32[40, 600], weight w: f32[600, 64]) -> f32[40, 64] { return x @ w; }";
    let wide = "fn f(x: f32[40, 600], weight w: f32[600, 1024]) -> f32[40, 1024] { return x @ w; }";
    let few = "fn f(x: f32[4, 600], weight w: f32[600, 1024]) -> f32[4, 1024] { return x @ w; }";
    let pixels = "fn f(x: f32[1, 256, 7, 7], weight w: f32[512, 256, 1, 1]) -> f32[1, 512, 7, 7] { return relu(conv2d(x, w)); }";
    let activations = "fn f(x: f32[40, 96], y: f32[96, 64]) -> f32[40, 64] { return x @ y; }";
    for target in [TargetDesc::x86_64_avx2(2), TargetDesc::x86_64_avx512(2)] {
        let g = target.gemm_blocking(dlc_core::DType::F32);
        let strip_load = format!(": tile<{}x1xf32>", g.mr);
        let panel_load = format!(": tile<1x{}xf32>", g.nr);
        // What the loads read, the prefetch's shape, and which of its
        // indices is one ahead: the strip, the slice, or the panel.
        for (src, want) in [
            (kernel, Some((&strip_load, "[1, 1]", 2))),
            (panels, Some((&panel_load, "[2, 32], level = 2", 0))),
            (wide, Some((&panel_load, "[2, 32], level = 2", 1))),
            (few, Some((&panel_load, "[2, 32], level = 2", 0))),
            (pixels, Some((&panel_load, "[2, 32], level = 2", 1))),
            (activations, None),
        ] {
            let m = graph(src);
            let l = lowered(&m);
            let own = dlc_lower::ScheduleParams::for_target(&target);
            let mut off = own.clone();
            if let Some(p) = off.packed.as_mut() {
                p.weight_prefetch = false;
            }
            for (params, on) in [(own, true), (off, false)] {
                let t = dlc_lower::convert_module_with(&l, &params).unwrap();
                t.verify().unwrap_or_else(|e| panic!("{e:?}"));
                let text = dlc_tile::print_module(&t);
                // The buffers of the product's strips or panels, and the
                // operand prefetches (not an epilogue's, of the result).
                let buffer = |l: &str| l.split('[').next().unwrap_or("").to_string();
                let read: Vec<String> = text
                    .lines()
                    .filter_map(|l| l.trim().split_once(" = tile.load "))
                    .filter(|(_, r)| want.is_some_and(|(shape, ..)| r.ends_with(shape.as_str())))
                    .map(|(_, r)| buffer(r))
                    .collect();
                let fetched: Vec<String> = prefetches(&text)
                    .into_iter()
                    .filter(|(buf, _)| buf != "%out0")
                    .map(|(_, l)| l)
                    .collect();
                match (want, on) {
                    (Some((_, shape, ahead)), true) => {
                        let shape = shape.replace("32", &g.nr.to_string());
                        assert!(!fetched.is_empty(), "{src} on {}\n{text}", target.name);
                        for l in &fetched {
                            let index: Vec<&str> = l
                                .split(['[', ']'])
                                .nth(1)
                                .unwrap_or("")
                                .split(", ")
                                .collect();
                            let one = |i: usize| index.get(i).is_some_and(|x| x.ends_with(" + 1"));
                            // A strip's step of the depth (index 3) may be
                            // the unrolled loop's second: 14 rows are 112
                            // bytes an iteration, two lines, each fetched.
                            let step = |i: usize| src == kernel && i == 3;
                            assert!(
                                read.contains(&buffer(l.as_str()))
                                    && (0..index.len()).all(|i| one(i) == (i == ahead) || step(i))
                                    && l.ends_with(&format!("{{shape = {shape}}}")),
                                "{src} on {}: {l}\n{text}",
                                target.name
                            );
                        }
                    }
                    _ => assert!(fetched.is_empty(), "{src} on {}\n{text}", target.name),
                }
            }
        }
    }
    for src in [kernel, panels, wide, few, pixels, activations] {
        agree(src);
    }
}

/// A max pool lowers to two passes (`graph_to_loop`'s
/// `emit_separable_max_pool`): the window's rows at every column of the
/// input and its padding, stored (`[N, C, OH, W + 2 PW]`), then the
/// window's columns of that, unpadded; an average pool stays one window.
/// Both passes run in one nest over the images and channels, so that on a
/// CPU one kernel's programs each keep their channel's rows in scratch of
/// their own (`[4, 8]`), with the max pool's epilogue after its second pass.
#[test]
fn a_max_pool_is_two_passes() {
    let src = "fn f(x: f32[2, 3, 7, 6]) -> (f32[2, 3, 4, 3], f32[2, 3, 4, 3]) { return (maxpool2d(x, kernel=3, stride=2, padding=1) * 2.0 - 1.0, avgpool2d(x, kernel=3, stride=2, padding=1)); }";
    let m = graph(src);
    let text = print_module(&lowered(&m));
    assert_eq!(text.matches("buffer<f32[2, 3, 4, 8]>").count(), 1, "{text}");
    let tiles = dlc_tile::print_module(&kernels(&m, &TargetDesc::x86_64_avx512(2)));
    let kernels: Vec<&str> = tiles.split("tile.kernel ").skip(1).collect();
    assert_eq!(kernels.len(), 2, "{tiles}");
    assert!(
        kernels[0].starts_with("{grid = [2, 3]")
            && kernels[0].contains("buffer<f32[4, 8], scratch>"),
        "{tiles}"
    );
    agree(src);
}

/// User operators that are contractions lower to one `loop.matmul` each,
/// reading their operands through their own indices (no copy, no scalar
/// reduction loop), with their epilogue in its region; the others keep
/// their scalar loops. All agree with the graph interpreter.
#[test]
fn user_contractions_are_structured_products() {
    let matmuls: Vec<usize> = dlc_tests::CONTRACTION_PROGRAMS
        .iter()
        .map(|src| {
            let text = print_module(&lowered(&graph(src)));
            text.matches("loop.matmul").count()
        })
        .collect();
    assert_eq!(
        matmuls,
        [
            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 2, 1, 1, 2, 2
        ]
    );
    // Of a sum of four factors, the two that alone read `g` are one
    // product (30 x 40 over 20) into a local the rest reads.
    let text = print_module(&lowered(&graph(dlc_tests::CONTRACTION_PROGRAMS[24])));
    assert!(text.contains("{sizes = [30, 40, 20]}"), "{text}");
    // A gate two products multiply by is computed once (one sigmoid in
    // the whole function) and read in place by both (no copy: one buffer,
    // the gate's).
    let text = print_module(&lowered(&graph(dlc_tests::CONTRACTION_PROGRAMS[26])));
    assert!(
        text.matches("loop.sigmoid").count() == 1 && text.matches("loop.alloc").count() == 1,
        "{text}"
    );
    // A weight gradient whose optimizer update follows it keeps its
    // columns merged (45), not the 3 of `kx` the update's epilogue would
    // leave it: the product is stored into a buffer of its own and the
    // update reads it in a pass after.
    let text = print_module(&lowered(&graph(dlc_tests::CONTRACTION_PROGRAMS[23])));
    assert!(
        text.contains("{sizes = [8, 45, 84]}") && text.contains("loop.sub"),
        "{text}"
    );
    // A 1x1 convolution's columns are every pixel of an image, read in
    // place through a view (one product per image, not per row of pixels);
    // transposed pixels keep one column variable.
    let text = print_module(&lowered(&graph(dlc_tests::CONTRACTION_PROGRAMS[22])));
    assert!(
        text.contains("loop.view %x : buffer<f32[2, 6, 35]>")
            && text.contains("{sizes = [9, 35, 6]}")
            && text.contains("{sizes = [9, 5, 6]}")
            && !text.contains("loop.alloc"),
        "{text}"
    );
    // Prologues are computed once per element, in the copies.
    let text = print_module(&lowered(&graph(dlc_tests::CONTRACTION_PROGRAMS[17])));
    assert!(
        text.matches("loop.relu").count() == 1 && text.matches("loop.exp").count() == 1,
        "{text}"
    );
    // A gathered operand is an im2col copy: the convolution's input gradient
    // copies its output gradient's windows (zero past the edges) and its
    // kernel, transposed, then runs one product per image whose columns are
    // the image's pixels (`y, x`: 42).
    let text = print_module(&lowered(&graph(dlc_tests::CONTRACTION_PROGRAMS[13])));
    assert!(
        text.contains("buffer<f32[5, 72]>")
            && text.contains("buffer<f32[2, 72, 42]>")
            && text.contains("{sizes = [5, 42, 72]}")
            && text.contains("{pad = 0.0}"),
        "{text}"
    );
    // The weight gradient's columns are every trailing index its gathered
    // input reads (`c, ky, kx`: 45, not 3), stored through a view of the
    // result. Its copy of the input holds the depth (`n, y, xx`) last, so
    // that it copies the input's rows (runs of 7 along `xx`, not 3 along
    // `kx`), and the product reads it transposed.
    let text = print_module(&lowered(&graph(dlc_tests::CONTRACTION_PROGRAMS[14])));
    assert!(
        text.contains("{sizes = [8, 45, 84]}")
            && text.contains("loop.view %out0")
            && text.contains("loop.alloc : buffer<f32[5, 3, 3, 2, 6, 7]>")
            && text.contains("[#1, #2] {sizes = [8, 45, 84]}"),
        "{text}"
    );
    // One whose copy would pass `MAX_GATHERED` elements keeps its loops.
    let big = "op conv_dx[N, O, H, W, C](g: f32[N, O, H, W], w: f32[O, C, 3, 3]) -> f32[N, C, H, W] { out[n, c, y, x] = sum[o, ky, kx](g[n, o, y - ky + 1, x - kx + 1] * w[o, c, ky, kx]); }
fn f(g: f32[64, 64, 128, 128], w: f32[64, 64, 3, 3]) -> f32[64, 64, 128, 128] { return conv_dx(g, w); }";
    let text = print_module(&lowered(&graph(big)));
    assert!(!text.contains("loop.matmul"), "{text}");
    // Two reduction indices over whole consecutive axes: one depth counter
    // over views of the operands.
    let text = print_module(&lowered(&graph(dlc_tests::CONTRACTION_PROGRAMS[11])));
    assert!(
        text.contains("buffer<f32[6, 20]>") && text.contains("buffer<f32[20, 7]>"),
        "{text}"
    );
    let text = print_module(&lowered(&graph(dlc_tests::CONTRACTION_PROGRAMS[0])));
    assert!(
        text.contains("loop.matmul %a[#2, #0], %g[#2, #1]") && !text.contains("loop.for"),
        "{text}"
    );
    // `h` is computed in the epilogue, once per element: no buffer.
    let text = print_module(&lowered(&graph(dlc_tests::CONTRACTION_PROGRAMS[4])));
    assert!(!text.contains("loop.alloc"), "{text}");
    assert_eq!(text.matches("loop.sigmoid").count(), 1, "{text}");
    // Two batch indices: each a grid axis of the packed product, on either
    // x86-64 vector width.
    let m = graph(dlc_tests::CONTRACTION_PROGRAMS[2]);
    for target in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let text = dlc_tile::print_module(&kernels(&m, &target));
        let packed = text
            .lines()
            .filter(|l| l.contains("grid = [2, 3, ") && l.contains("schedule = \"packed\""))
            .count();
        assert_eq!(packed, 1, "{}: {text}", target.name);
    }
    // A right operand shared by every batch (200 rows: two blocks of
    // rows a batch) is packed once, not per batch.
    let m = graph(dlc_tests::CONTRACTION_PROGRAMS[3]);
    for target in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let text = dlc_tile::print_module(&kernels(&m, &target));
        let packs: Vec<&str> = text.lines().filter(|l| l.contains("pack = [1]")).collect();
        assert!(
            packs.len() == 1 && !packs[0].contains("grid = [3, "),
            "{}: {text}",
            target.name
        );
    }
    // f16 and bf16 products are packed as f32's are: the copies into
    // panels and strips widen the operands, the register tile is f32's.
    for (i, narrow) in [(8, "f16"), (19, "bf16")] {
        let m = graph(dlc_tests::CONTRACTION_PROGRAMS[i]);
        for target in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
            let text = dlc_tile::print_module(&kernels(&m, &target));
            let packs = text.matches("schedule = \"packed\"").count();
            let widened = text
                .lines()
                .filter(|l| l.contains("tile.cast") && l.contains("xf32>"))
                .count();
            assert!(
                packs >= 1 && widened >= 2 && text.contains(&format!("x{narrow}>")),
                "{}: {text}",
                target.name
            );
        }
    }
    // The transposed result: columns are its last index, read from `a`.
    let text = print_module(&lowered(&graph(dlc_tests::CONTRACTION_PROGRAMS[6])));
    assert!(
        text.contains("loop.matmul %b[#2, #0], %a[#1, #2]"),
        "{text}"
    );
    for src in dlc_tests::CONTRACTION_PROGRAMS {
        agree(src);
    }
}

#[test]
fn results_that_are_parameters_views_or_repeated() {
    for src in dlc_tests::RESULT_PROGRAMS {
        agree(src);
    }
}

#[test]
fn small_versions_of_the_workloads() {
    for src in dlc_tests::WORKLOAD_PROGRAMS {
        agree(src);
    }
}

#[test]
fn every_example_lowers_to_valid_loop_and_tile_ir() {
    let tool = dlc_tests::mlir_opt();
    let programs: Vec<(String, String)> = dlc_tests::every_example();
    for (name, text) in programs {
        let m = graph(&text);
        let l = lowered(&m);
        assert_eq!(l.functions.len(), m.entry_points().count(), "{name}");
        // Deterministic: lowering again (with fresh hash seeds) and
        // scheduling again give the same text.
        assert_eq!(print_module(&lowered(&m)), print_module(&l), "{name}");
        for target in targets() {
            let k = kernels(&m, &target);
            assert_eq!(
                dlc_tile::print_module(&kernels(&m, &target)),
                dlc_tile::print_module(&k),
                "{name}"
            );
            let text = dlc_tile::print_module(&k);
            for op in ["tile.kernel", "tile.program_id", "tile.load", "tile.store"] {
                assert!(
                    text.contains(op),
                    "{name} for {}: no {op}\n{text}",
                    target.name
                );
            }
            if let Some(tool) = &tool {
                let generic = dlc_tile::print_mlir_generic(&k);
                dlc_tests::mlir_parses(tool, &generic)
                    .unwrap_or_else(|e| panic!("{name} for {}: {e}", target.name));
            }
        }
        if let Some(tool) = &tool {
            let generic = print_mlir_generic(&l);
            dlc_tests::mlir_parses(tool, &generic).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn generated_programs_agree(choices in prop::collection::vec(any::<u32>(), 1..10), tuple in any::<bool>()) {
        agree(&dlc_tests::generated_program(&choices, tuple));
    }
}

/// Attention, `softmax(q @ k^T) @ v`, runs as one kernel over blocks of
/// rows on the CPU (the scores never leave a program's scratch memory),
/// with a batch of heads or without, ragged blocks, queries computed by a
/// product whose storage the lowering would otherwise reuse for the result
/// (as in BERT), and not when the softmax is also a result; the tile
/// interpreter agrees with the graph interpreter on every schedule.
#[test]
fn attention_runs_as_one_kernel_over_blocks_of_rows() {
    let fused = [
        // Three blocks of 102 rows on AVX-512 (300 rows: ragged).
        "fn f(q: f32[2, 300, 32], k: f32[2, 50, 32], v: f32[2, 50, 24]) -> f32[2, 300, 24] { return softmax(q @ transpose(k, [0, 2, 1]) / 2.0, axis=-1) @ v; }",
        // Two blocks of 78 rows, no batch.
        "fn f(q: f32[150, 40], k: f32[45, 40], v: f32[45, 33]) -> f32[150, 33] { return softmax(q @ transpose(k, [1, 0]), axis=-1) @ v; }",
        "fn f(x: f32[40, 96], wq: f32[96, 96], wk: f32[96, 96], wv: f32[96, 96]) -> f32[40, 96] {
            let q = transpose(reshape(x @ wq, [40, 4, 24]), [1, 0, 2]);
            let k = transpose(reshape(x @ wk, [40, 4, 24]), [1, 0, 2]);
            let v = transpose(reshape(x @ wv, [40, 4, 24]), [1, 0, 2]);
            return reshape(transpose(softmax(q @ transpose(k, [0, 2, 1]) / 5.0, axis=-1) @ v, [1, 0, 2]), [40, 96]);
        }",
    ];
    let unfused = "fn f(q: f32[2, 130, 32], k: f32[2, 50, 32], v: f32[2, 50, 24]) -> (f32[2, 130, 24], f32[2, 130, 50]) { let p = softmax(q @ transpose(k, [0, 2, 1]) / 2.0, axis=-1); return (p @ v, p); }";
    let avx512 = dlc_lower::ScheduleParams::for_target(&TargetDesc::x86_64_avx512(2));
    for src in fused.iter().chain([&unfused]) {
        let m = graph(src);
        let l = lowered(&m);
        let t = dlc_lower::convert_module_with(&l, &avx512).unwrap();
        let text = dlc_tile::print_module(&t);
        let kernels = text.matches("schedule = \"fused\"").count();
        assert_eq!(kernels, usize::from(*src != unfused), "{src}\n{text}");
        agree(src);
    }
}

/// In a fused attention kernel each product reads its block of rows of the
/// left operand where it lies when no row or slice of the depth reaches past
/// the operand (the queries from their buffer, the probabilities from the
/// program's scratch memory) and packs them into strips otherwise; the
/// softmax's normalization scales the result's rows instead of the
/// probabilities (`(c * p) @ v = c * (p @ v)`), unless the row nest's last
/// loop does more than scale. All agree with the graph interpreter.
#[test]
fn attention_reads_its_rows_in_place_and_scales_its_result() {
    let avx512 = dlc_lower::ScheduleParams::for_target(&TargetDesc::x86_64_avx512(2));
    // (program, the queries packed, the probabilities packed, the result
    // scaled)
    let cases = [
        // A block of 154 rows (11 strips of 14) of 150: it reaches past
        // the queries.
        (
            "fn f(q: f32[150, 40], k: f32[45, 40], v: f32[45, 33]) -> f32[150, 33] { return softmax(q @ transpose(k, [1, 0]) / 2.0, axis=-1) @ v; }",
            true,
            false,
            true,
        ),
        // 500 deep: two slices of 256, the second past the rows' end; 28
        // queries, two whole strips.
        (
            "fn f(q: f32[2, 28, 16], k: f32[2, 500, 16], v: f32[2, 500, 20]) -> f32[2, 28, 20] { return softmax(q @ transpose(k, [0, 2, 1]), axis=-1) @ v; }",
            false,
            true,
            true,
        ),
        (
            "fn f(q: f32[150, 40], k: f32[45, 40], v: f32[45, 33]) -> f32[150, 33] { return (softmax(q @ transpose(k, [1, 0]), axis=-1) + 1.0) @ v; }",
            true,
            false,
            false,
        ),
    ];
    for (src, q_packed, p_packed, scaled) in cases {
        let m = graph(src);
        let t = dlc_lower::convert_module_with(&lowered(&m), &avx512).unwrap();
        let text = dlc_tile::print_module(&t);
        let fused = text
            .split("tile.kernel")
            .find(|k| k.contains("schedule = \"fused\""))
            .unwrap_or_else(|| panic!("no fused kernel: {src}\n{text}"));
        // Scratch strips of `mr` rows; the first product's register tile
        // reading columns of `mr` rows of the queries themselves.
        let mr = TargetDesc::x86_64_avx512(2)
            .gemm_blocking(dlc_core::DType::F32)
            .mr;
        let strips = fused.matches(&format!(", {mr}], scratch>")).count();
        assert_eq!(
            strips,
            usize::from(q_packed) + usize::from(p_packed),
            "{src}\n{text}"
        );
        let columns_of_q = fused
            .lines()
            .any(|l| l.contains("tile.load %q[") && l.ends_with(&format!(": tile<{mr}x1xf32>")));
        assert_eq!(columns_of_q, !q_packed, "{src}\n{text}");
        let factors = fused
            .lines()
            .filter_map(|l| l.split_once("tile.alloc : buffer<f32[")?.1.split_once(']'))
            .filter(|(shape, rest)| !shape.contains(',') && rest.contains("scratch"))
            .count();
        assert_eq!(factors, usize::from(scaled), "{src}\n{text}");
        agree(src);
    }
}

/// Declared weights: on the CPU, kernels that read nothing but weights (the
/// packing of a product's right operand, an element-wise op on weights)
/// move to a preparer the tile interpreter runs first; on a GPU nothing
/// moves. Both agree with the graph interpreter.
#[test]
fn work_on_weights_alone_moves_to_a_preparer() {
    let programs = [
        // Packing by a weight, plain and through a transposed view.
        (
            "fn f(x: f32[50, 70], weight w: f32[70, 90], weight b: f32[90]) -> f32[50, 90] { return relu(x @ w + b); }",
            1,
        ),
        (
            "fn f(x: f32[50, 70], weight w: f32[90, 70]) -> f32[50, 90] { return x @ transpose(w); }",
            1,
        ),
        // A weight computed from weights: the product and its packing move.
        (
            "fn f(x: f32[30, 64], weight w: f32[64, 64], weight s: f32[64]) -> f32[30, 64] { return x @ (w * s); }",
            1,
        ),
        // Weights concatenated (three kernels write one buffer) and packed.
        (
            "fn f(x: f32[30, 64], weight a: f32[64, 40], weight b: f32[64, 40]) -> f32[30, 80] { return x @ concat([a, b], axis=1); }",
            1,
        ),
        // Batchnorm folded into the convolution's weights by saturation.
        (
            "fn f(x: f32[1, 3, 10, 10], weight w: f32[8, 3, 3, 3], weight m: f32[8], weight v: f32[8], weight g: f32[8], weight b: f32[8]) -> f32[1, 8, 10, 10] { return relu(batchnorm(conv2d(x, w, padding=1), m, v, g, b, eps=1e-5)); }",
            1,
        ),
        // Nothing reads only weights: no preparer.
        (
            "fn f(x: f32[30, 64], weight b: f32[64]) -> f32[30, 64] { return x + b; }",
            0,
        ),
        (
            "fn f(x: f32[30, 64], w: f32[64, 64]) -> f32[30, 64] { return x @ w; }",
            0,
        ),
    ];
    for (src, preparers) in programs {
        let m = graph(src);
        let cpu = kernels(&m, TargetDesc::host());
        let gpu = kernels(&m, &TargetDesc::sm_90());
        let count =
            |t: &dlc_tile::Module| t.functions.iter().filter(|f| f.prepare.is_some()).count();
        assert_eq!(
            count(&cpu),
            preparers,
            "{src}\n{}",
            dlc_tile::print_module(&cpu)
        );
        assert_eq!(count(&gpu), 0, "{src}");
        agree(src);
    }
}

/// Where the CPU has AVX-512 BF16 (`znver4`; not plain `x86-64-v4`), a
/// product of bf16 operands keeps them bf16 in its strips (pairs of the
/// depth side by side) and panels and steps its depth by pairs, an `mr x 2`
/// by `2 x nr` dot (which the code generator runs as `vdpbf16ps`); without
/// it, or with an odd depth, the operands are widened into f32 panels. Both
/// agree with the graph interpreter on the tile interpreter.
#[test]
fn bf16_products_multiply_pairs_where_the_target_has_them() {
    let bf16 = TargetDesc::for_cpu("znver4").unwrap();
    let cases = [
        (
            "fn f(a: bf16[64, 96], b: bf16[96, 80]) -> bf16[64, 80] { return a @ b; }",
            true,
        ),
        (dlc_tests::CONTRACTION_PROGRAMS[19], true),
        (
            "fn f(a: bf16[64, 97], b: bf16[97, 80]) -> bf16[64, 80] { return a @ b; }",
            false,
        ),
    ];
    for (src, even) in cases {
        let m = graph(src);
        let paired = kernels(&m, &bf16);
        let widened = kernels(&m, &TargetDesc::x86_64_avx512(2));
        let (p, w) = (
            dlc_tile::print_module(&paired),
            dlc_tile::print_module(&widened),
        );
        assert_eq!(p.contains("x2xbf16>"), even, "{src}\n{p}");
        assert!(!w.contains("x2xbf16>") && w.contains("xf32>"), "{src}\n{w}");
        for f in m.entry_points() {
            let inputs = prepare_inputs(f, &[], Some(7)).unwrap();
            let want = interpret(&m, f, &inputs).unwrap();
            for (t, text) in [(&paired, &p), (&widened, &w)] {
                let got = interpret_tile_within(t, f, &inputs, dlc_driver::DEFAULT_WORK_LIMIT)
                    .unwrap_or_else(|e| panic!("{e}\n{text}"));
                if let Some(d) = disagreement(f, &got, &want) {
                    panic!("{src}: {d}\n{text}");
                }
            }
        }
    }
}

/// The schedule is a parameter: odd vector widths and block sizes (ragged
/// masks everywhere, blocks of one element, packing blockings that do not
/// divide anything) give the same results on the tile interpreter.
#[test]
fn odd_schedule_parameters_agree() {
    let programs = [
        "fn f(x: f32[5, 37], w: f32[37, 9], b: f32[9]) -> f32[5, 9] { return relu(x @ w + b); }",
        "fn f(x: f32[3, 4, 5]) -> (f32[3, 5], f32, f32[3, 4, 5]) { return (sum(x, axis=1), max(x), softmax(x, axis=2)); }",
        "fn f(a: f32[2, 7, 40], b: f32[2, 40, 33]) -> f32[2, 7, 33] { return a @ b * 0.5; }",
        "fn f(x: i32[9]) -> i32 { return sum(x * x) / 3; }",
        // Right operands each program packs panel by panel (one reader),
        // and operands two products read whose rows are 3 and 4 lines apart
        // (read in place, and packed once by a pack kernel), an im2col
        // buffer.
        "fn f(x: f32[5, 37], w: f32[37, 48], v: f32[37, 64]) -> (f32[5, 48], f32[5, 64]) { return (x @ w, x @ v); }",
        "fn f(x: f32[5, 37], y: f32[5, 37], w: f32[37, 48], v: f32[37, 64]) -> (f32[5, 48], f32[5, 48], f32[5, 64], f32[5, 64]) { return (x @ w, relu(y) @ w, x @ v, relu(y) @ v); }",
        "fn f(x: f32[2, 8, 12, 12], w: f32[16, 8, 3, 3]) -> f32[2, 16, 12, 12] { return relu(conv2d(x, w, padding=1)); }",
        // Attention: with every product packed, one kernel over blocks of
        // rows (blocks of 4, 6 or 9 rows: ragged at 20).
        "fn f(q: f32[2, 20, 12], k: f32[2, 23, 12], v: f32[2, 23, 9]) -> f32[2, 20, 9] { return softmax(q @ transpose(k, [0, 2, 1]) / 2.0, axis=-1) @ v; }",
        // A Winograd convolution: one kernel over rows of tiles (one row
        // per program, with no L2 to fit; 7 tiles in strips of 2 or 3).
        dlc_tests::WINOGRAD_PROGRAMS[1],
        // bf16 products (in pairs of the depth where the blocking says so,
        // ragged everywhere): plain, transposed operands, a shared weight.
        "fn f(a: bf16[7, 38], b: bf16[38, 45], x: bf16[2, 5, 38]) -> (bf16[7, 45], bf16[2, 5, 45]) { return (a @ b, x @ b); }",
        dlc_tests::CONTRACTION_PROGRAMS[19],
        // One block of rows and one panel, eight slices of the depth with
        // the `[2, 3, 4, 5]` blocking, the last ragged: split along the
        // depth into two programs, their sums added by a second kernel
        // that runs the epilogue. With a bias (the epilogue reads another
        // operand) and a weight gradient's transposed operands.
        "fn f(a: f32[3, 38], b: f32[3, 38], c: f32[3]) -> f32[3, 3] { return tanh(a @ transpose(b) + c); }",
        "fn f(g: f32[38, 3], x: f32[38, 3]) -> f32[3, 3] { return transpose(g) @ x; }",
        // Shallow products, which walk each strip across their panels
        // (with the `[2, 3, 4, 5]` blocking, the last: 4 deep, 2 strips
        // a block, 7 panels a program, the last ragged).
        dlc_tests::SHALLOW_PRODUCT_PROGRAMS,
        "fn f(x: f32[8, 4], y: f32[4, 40], b: f32[40]) -> f32[8, 40] { return relu(x @ y + b); }",
        // Four columns, the last panel of 3 holding 1: the half-panel
        // tile of the `[2, 3, 4, 5]` schedule.
        "fn f(a: f32[8, 6], b: f32[6, 4], c: f32[4]) -> f32[8, 4] { return relu(a @ b + c); }",
        // A product with a residual (walked strip by strip up to the
        // blocking's depth of 16 with `units` 3; 9 deep, ragged).
        "fn f(x: f32[8, 9], y: f32[9, 40], r: f32[8, 40]) -> f32[8, 40] { return tanh(x @ y + r); }",
        // Left operands contiguous along their rows (transposed), one
        // block of rows, the depth in three slices or more: read in
        // place, in slices of 2 or 4, the last strip ragged.
        "fn f(g: f32[42, 7], x: f32[42, 11]) -> f32[7, 11] { return transpose(g) @ x; }",
        "fn f(g: f32[40, 3], x: f32[40, 10], b: f32[10]) -> f32[3, 10] { return relu(transpose(g) @ x + b); }",
    ];
    let mut schedules = vec![];
    for (vector, dot, packed) in [
        (1, [1, 1, 1], None),
        (3, [5, 3, 2], Some(([2, 3, 4, 5], 3))),
        (7, [8, 16, 8], Some(([3, 5, 9, 7], 1))),
    ] {
        let mut p = dlc_lower::ScheduleParams::for_target(TargetDesc::host());
        (p.vector, p.dot) = (vector, dot);
        p.packed = packed.map(|(blocking, units)| dlc_lower::Packing {
            blocking,
            // Products at least 5 deep (one `kc` slice) of 4, 8 or 20 rows
            // take `[2, 3, 4, 5]`'s taller tile of 4 rows, those of 5 or 7
            // its 2 (the test checks that some product takes it);
            // `[3, 5, 9, 7]` has no choice.
            tall_mr: if units == 3 { 4 } else { blocking[0] },
            // A product whose last panel is at most half full, and whose
            // columns that tile pads at least a twentieth fewer, takes it
            // (4 columns: two panels of 3, or two of 2; bf16 keeps its
            // pairs' tile); the test checks that each schedule's is taken.
            half_panel_tile: Some(if units == 3 { [4, 2] } else { [9, 2] }),
            min_macs: 1,
            units,
            // Every product of one program and two slices or more is
            // split along its depth (`units` 3: two or three splits).
            split_macs: 1,
            copy_depth: units + 1,
            narrow: Some([units + 2, 2]),
            balance: units + 1,
            // One set: every operand whose rows are whole lines apart is
            // read in place where the product has one block of rows and
            // shares the operand with another product.
            l1_sets: if units == 1 { 1 } else { 64 },
            // With none, a Winograd convolution's programs take one row
            // of tiles; with 1 MB, shallow products (all but the deepest
            // with `units` 3: `kc` 5) walk each strip across their panels.
            l2_bytes: if units == 3 { 1 << 20 } else { 0 },
            strips_outer_depth: 16,
            heavy_outer_depth: 16,
            // Prefetches past the tile (past the operands' edges, at the
            // last panels) change no value.
            epilogue_prefetch: units,
            // So do prefetches of a result stored along its rows, rows
            // ahead (past its last row too).
            result_rows_ahead: units + 2,
            // Prefetches of weights change no value either.
            weight_prefetch: units != 1,
            // Strips read in place, in slices of at most 4 with `units`
            // 3 (of 5) and 2 with `units` 1 (of 7).
            in_place_depth: if units == 3 { 4 } else { 2 },
            // Right operands of products of few rows read in place (up to
            // 8 rows with `units` 3, where each set takes at most 2 of a
            // slice's rows), never with `units` 1.
            in_place_rows: if units == 3 { 8 } else { 0 },
            l1_ways: 2,
            unroll: units,
            // bf16 products in pairs with one blocking (a register tile
            // of its own), widened with the other.
            bf16_pairs: (units == 3).then_some([3, 4, 6, 6]),
        });
        p.validate().unwrap();
        schedules.push(p);
    }
    // The AVX-512 CPU's own schedule (products this small are `dot`
    // kernels; the convolution and attention are packed), and Zen 4's.
    schedules.push(dlc_lower::ScheduleParams::for_target(
        &TargetDesc::x86_64_avx512(2),
    ));
    schedules.push(dlc_lower::ScheduleParams::for_target(
        &TargetDesc::for_cpu("znver4").expect("a known CPU"),
    ));
    // AVX2's, whose 4-row tile gives way to 6 rows where they pad as few.
    schedules.push(dlc_lower::ScheduleParams::for_target(
        &TargetDesc::x86_64_avx2(2),
    ));
    let mut staged = dlc_lower::ScheduleParams::for_target(&TargetDesc::sm_90());
    staged.dot = [3, 5, 7];
    schedules.push(staged);
    // Whether some product took each odd schedule's half-panel tile, and
    // `[2, 3, 4, 5]`'s taller tile.
    let mut half_taken = [false; 2];
    let mut tall_taken = false;
    for src in programs {
        let m = graph(src);
        let l = lowered(&m);
        for params in &schedules {
            let t = dlc_lower::convert_module_with(&l, params).unwrap();
            t.verify().unwrap_or_else(|e| panic!("{e:?}"));
            let text = dlc_tile::print_module(&t);
            for (taken, tile) in half_taken.iter_mut().zip(["[4, 2,", "[9, 2,"]) {
                *taken |= text.contains(&format!("blocking = {tile}"));
            }
            tall_taken |= text.contains("blocking = [4, 3, 4,");
            for (seed, f) in m.entry_points().enumerate() {
                let inputs = prepare_inputs(f, &[], Some(seed as u64)).unwrap();
                let want = interpret(&m, f, &inputs).unwrap();
                let got = interpret_tile_within(&t, f, &inputs, dlc_driver::DEFAULT_WORK_LIMIT)
                    .unwrap_or_else(|e| panic!("{params:?}: {e}\n{}", dlc_tile::print_module(&t)));
                if let Some(d) = disagreement(f, &got, &want) {
                    panic!("{params:?}: {d}\n{}", dlc_tile::print_module(&t));
                }
            }
        }
    }
    assert_eq!(half_taken, [true; 2], "a half-panel tile no product took");
    assert!(tall_taken, "no product took the taller tile");
}

/// A Winograd convolution whose transformed kernel is many times the L2
/// runs as one block of tile rows cut into chunks of the output channels
/// (each program reads its share of the kernel once), the grid's third
/// axis: the AVX-512 schedule with its L2 shrunk to 1 KB takes two or more
/// chunks of 96 channels over 8 x 8 (its own 1 MB L2 keeps blocks of rows),
/// and both agree with the graph interpreter on the tile interpreter.
#[test]
fn a_large_winograd_kernel_is_cut_into_chunks_of_channels() {
    let src = "fn f(x: f32[1, 48, 8, 8], w: f32[96, 48, 3, 3]) -> f32[1, 96, 8, 8] { return conv2d(x, w, padding=1); }";
    let m = graph(src);
    let l = lowered(&m);
    let own = dlc_lower::ScheduleParams::for_target(&TargetDesc::x86_64_avx512(2));
    let mut small = own.clone();
    if let Some(p) = small.packed.as_mut() {
        p.l2_bytes = 1024;
    }
    for (params, chunked) in [(own, false), (small, true)] {
        let t = dlc_lower::convert_module_with(&l, &params).unwrap();
        t.verify().unwrap_or_else(|e| panic!("{e:?}"));
        let text = dlc_tile::print_module(&t);
        let grid = text
            .lines()
            .find(|l| l.contains("schedule = \"winograd\""))
            .and_then(|l| l.split("grid = [").nth(1))
            .and_then(|g| g.split(']').next())
            .map(|g| {
                g.split(", ")
                    .map(|d| d.parse::<usize>().unwrap())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_else(|| panic!("no Winograd kernel\n{text}"));
        assert_eq!(grid.len() == 3 && grid[2] >= 2, chunked, "{grid:?}\n{text}");
        let f = m.entry_points().next().unwrap();
        let inputs = prepare_inputs(f, &[], Some(3)).unwrap();
        let want = interpret(&m, f, &inputs).unwrap();
        let got = interpret_tile_within(&t, f, &inputs, dlc_driver::DEFAULT_WORK_LIMIT)
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        if let Some(d) = disagreement(f, &got, &want) {
            panic!("{d}\n{text}");
        }
    }
}

/// Whether a Winograd kernel's programs take chunks of the output
/// channels follows from the target's bytes a cycle: ResNet's 14 x 14
/// stage at 256 channels (`U` 9.4 MB, four rows of 4 tiles) is one block
/// of all 16 tiles in chunks where `U` comes from beyond the L2 slower
/// than a block of one row multiplies (Intel's server cores, the AVX-512
/// description: 4 bytes a cycle from memory against 32 multiply-adds; Zen
/// 5: 16 from its L3 against 32), and four blocks of a row on Zen 4 (16
/// bytes a cycle from its L3 against 16). Structure only: chunks'
/// arithmetic is checked by
/// `a_large_winograd_kernel_is_cut_into_chunks_of_channels`.
#[test]
fn a_winograd_kernel_read_slowly_is_read_once_in_chunks() {
    let src = "fn f(x: f32[1, 256, 14, 14], w: f32[256, 256, 3, 3]) -> f32[1, 256, 14, 14] { return conv2d(x, w, padding=1); }";
    let m = graph(src);
    let zen4 = TargetDesc::for_cpu("znver4").expect("a known CPU");
    let zen5 = TargetDesc::for_cpu("znver5").expect("a known CPU");
    for (target, grid) in [
        (TargetDesc::x86_64_avx512(2), "grid = [1, 1, 2]"),
        (zen5, "grid = [1, 1, 2]"),
        (zen4, "grid = [1, 4]"),
    ] {
        let l = lower_module(&m, &target).unwrap_or_else(|e| panic!("{e}"));
        let t = dlc_lower::convert_module_with(&l, &dlc_lower::ScheduleParams::for_target(&target))
            .unwrap();
        let text = dlc_tile::print_module(&t);
        let kernel = text
            .lines()
            .find(|l| l.contains("schedule = \"winograd\""))
            .unwrap_or_else(|| panic!("{}: no Winograd kernel\n{text}", target.name));
        assert!(kernel.contains(grid), "{}: {kernel}", target.name);
    }
}

/// A product of one block of rows (a convolution's weight gradient, 64 x
/// 576 x 6272) is cut by columns into at least the target's units of work,
/// so that its kernel is spread over threads: 18 panels wanted in 8 chunks
/// are 9 chunks of 2 (they were 6 of 3, and a kernel of fewer programs
/// than the units runs on one thread). Structure only: the chunking's
/// arithmetic is checked by every packed product of the differential
/// programs.
#[test]
fn a_product_of_one_row_block_is_cut_into_the_targets_units() {
    let m = graph("fn f(a: f32[64, 6272], b: f32[6272, 576]) -> f32[64, 576] { return a @ b; }");
    for target in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let units = target.gemm_blocking(dlc_core::DType::F32).min_units;
        let text = dlc_tile::print_module(&kernels(&m, &target));
        let product = text
            .lines()
            .find(|l| l.contains("schedule = \"packed\"") && !l.contains("pack = ["))
            .unwrap_or_else(|| panic!("{}: no packed product\n{text}", target.name));
        let grid: usize = product
            .split("grid = [")
            .nth(1)
            .and_then(|g| g.split(']').next())
            .map(|g| g.split(", ").map(|d| d.parse::<usize>().unwrap()).product())
            .unwrap();
        assert!(
            grid >= units && grid >= target.min_thread_iterations(),
            "{}: {grid} programs: {product}",
            target.name
        );
    }
}

/// A product of one program (u1's weight gradients, 32 x 32 and 32 deep
/// slices of 8192: one block of rows, one panel) is split along its depth
/// into programs that each sum their share of the slices, and a second
/// kernel adds the shares up and runs the epilogue; a product of a few
/// slices, or of fewer multiply-adds than two splits' worth, is not.
/// Structure only: the split's arithmetic is checked by the differential
/// programs (one block, one panel, eight slices under the `[2, 3, 4, 5]`
/// blocking) and, compiled, by `dlc-llvm`'s
/// `masked_rows_past_an_operands_end_address_the_operand`.
#[test]
fn a_product_of_one_program_is_split_along_its_depth() {
    let grids = |src: &str, target: &TargetDesc| -> Vec<String> {
        let text = dlc_tile::print_module(&kernels(&graph(src), target));
        text.lines()
            .filter(|l| l.contains("tile.kernel"))
            .filter_map(|l| Some(l.split("grid = [").nth(1)?.split(']').next()?.to_string()))
            .collect()
    };
    let weight_gradient = "fn f(a: f32[32, 8192], b: f32[32, 8192], c: f32[32]) -> f32[32, 32] { return tanh(a @ transpose(b) + c); }";
    assert_eq!(
        grids(weight_gradient, &TargetDesc::x86_64_avx512(2)),
        ["1, 1, 8", "1, 1"]
    );
    // With AVX2's 16-column panels the same product is two programs already.
    assert_eq!(
        grids(weight_gradient, &TargetDesc::x86_64_avx2(2)),
        ["1, 2"]
    );
    // Four slices of 256 of 32 x 32: 1M multiply-adds, half a split's.
    assert_eq!(
        grids(
            "fn f(a: f32[32, 1024], b: f32[1024, 32]) -> f32[32, 32] { return a @ b; }",
            &TargetDesc::x86_64_avx512(2)
        ),
        ["1, 1"]
    );
}

/// A padded direct convolution (one input channel a group here, at stride 1,
/// and two output channels a group at stride 2) whose
/// middle columns fill at least a vector, its border columns a vector wide,
/// runs each output axis in three ranges where the CPU has no mask
/// registers (AVX2): the middle's loads of the input are plain (no pad, so
/// no bounds test per lane), the borders' padded, and every range runs as
/// tiles of columns (no tile of a window's taps reduced). With mask
/// registers (AVX-512), one padded nest. A depthwise one at stride 1 of 9
/// to 32 columns on AVX2 (28 columns, and 20, 4 in the middle under a
/// vector of 8) reads instead a padded copy of each channel (`phase_copy`
/// with one phase, `[rows, 1, columns + 2]` in scratch memory, its rows
/// rounded up to whole vectors): only the
/// copy loads the input, with plain loads (the columns outside it are
/// stored zeros). Each agrees with the graph interpreter on the tile
/// interpreter, on both.
#[test]
fn padded_direct_convolutions_run_their_middle_apart() {
    let src = "fn s1(x: f32[1, 3, 6, 90], w: f32[3, 1, 3, 3]) -> f32[1, 3, 6, 90] { return relu(conv2d(x, w, padding=1, groups=3)); }
fn s2(x: f32[1, 3, 6, 180], w: f32[6, 1, 3, 3]) -> f32[1, 6, 3, 90] { return conv2d(x, w, stride=2, padding=1, groups=3); }
fn s3(x: f32[1, 3, 6, 28], w: f32[3, 1, 3, 3]) -> f32[1, 3, 6, 28] { return conv2d(x, w, padding=1, groups=3); }
fn narrow(x: f32[1, 3, 6, 20], w: f32[3, 1, 3, 3]) -> f32[1, 3, 6, 20] { return conv2d(x, w, padding=1, groups=3); }";
    let m = graph(src);
    let copies = [
        ("s3", "buffer<f32[8, 1, 32], scratch>"),
        ("narrow", "buffer<f32[8, 1, 24], scratch>"),
    ];
    for (target, split, copied) in [
        (
            TargetDesc::x86_64_avx2(2),
            ["s1", "s2"].as_slice(),
            copies.as_slice(),
        ),
        (TargetDesc::x86_64_avx512(2), [].as_slice(), [].as_slice()),
    ] {
        let tiles = kernels(&m, &target);
        let text = dlc_tile::print_module(&tiles);
        assert!(!text.contains("tile.reduce"), "{}: {text}", target.name);
        for f in text.split("tile.func @").skip(1) {
            let name = f.split('(').next().unwrap();
            let loads: Vec<&str> = f.lines().filter(|l| l.contains("tile.load %x[")).collect();
            let plain = loads.iter().filter(|l| !l.contains("pad")).count();
            let copy = copied.iter().find(|(n, _)| *n == name);
            assert_eq!(
                copy.is_some(),
                copies.iter().any(|(_, buf)| f.contains(buf)),
                "{} @{name}: {f}",
                target.name
            );
            if let Some((_, buf)) = copy {
                assert!(
                    f.contains(buf) && loads.len() == 1 && plain == 1,
                    "{} @{name}: {f}",
                    target.name
                );
            } else if split.contains(&name) {
                assert!(
                    plain > 0 && plain < loads.len(),
                    "{} @{name}: {f}",
                    target.name
                );
            } else {
                assert_eq!(plain, 0, "{} @{name}: {f}", target.name);
            }
        }
        agree_on_tile_interpreter(&m, &tiles, &target);
    }
    agree(src);
}

/// Depthwise convolutions strided along their columns read each channel,
/// on a CPU, through a padded copy split into the stride's phases
/// (`graph_to_loop`'s `phase_copy`), held in each program's scratch memory
/// (`[rows, stride, columns]`; no global buffer of every channel): the
/// input is loaded only by the copy, one loop per phase, with plain loads
/// (the columns of a phase outside the input are stored zeros, not read
/// through a padded load testing every lane), and every load of a window
/// from the copy is a plain one; a row's phases are one sum, each phase's
/// loop carrying the last one's (an addition a multiply-add, and one a
/// row, where their epilogue adds nothing: `odd`, `cols`). A copy past the
/// target's L1 (`wide`, 67 KB a channel; two images, an odd width) is
/// copied a row stride's rows at a time in the loop over output rows,
/// before the first row that reads them; the others before the windows.
/// On a GPU they read the input where it lies. Each agrees with the graph
/// interpreter on the tile interpreter.
#[test]
fn strided_depthwise_convolutions_read_a_copy_in_phases() {
    let src = dlc_tests::STRIDED_DEPTHWISE_PROGRAMS;
    let m = graph(src);
    let strides = [
        ("s5", 2),
        ("silu5", 2),
        ("odd", 2),
        ("cols", 3),
        ("wide", 2),
    ];
    for target in [
        TargetDesc::x86_64_avx2(2),
        TargetDesc::x86_64_avx512(2),
        TargetDesc::aarch64_linux(2),
        TargetDesc::sm_90(),
    ] {
        let tiles = kernels(&m, &target);
        let text = dlc_tile::print_module(&tiles);
        for f in text.split("tile.func @").skip(1) {
            let name = f.split('(').next().unwrap();
            let Some(&(_, stride)) = strides.iter().find(|s| s.0 == name) else {
                continue;
            };
            let copy = f.lines().find_map(|l| {
                let (v, ty) = l.trim().split_once(" = tile.alloc : buffer<f32[")?;
                let dims: Vec<&str> = ty.strip_suffix("], scratch>")?.split(", ").collect();
                (dims.len() == 3 && dims[1] == stride.to_string())
                    .then(|| (format!("tile.load {v}["), dims[2].parse::<usize>().unwrap()))
            });
            let global = f
                .lines()
                .any(|l| l.contains("tile.alloc") && !l.contains("scratch"));
            assert!(!global, "{} @{name}: {f}", target.name);
            let inputs: Vec<&str> = f.lines().filter(|l| l.contains("tile.load %x[")).collect();
            let Some((copy, columns)) = copy else {
                assert!(target.gpu().is_some(), "{} @{name}: {f}", target.name);
                continue;
            };
            assert!(target.cpu().is_some(), "{} @{name}: {f}", target.name);
            // A phase's row is whole vectors, the columns past its last
            // tap's never written.
            let lanes = target.lanes(dlc_core::DType::F32);
            assert_eq!(columns % lanes, 0, "{} @{name}: {f}", target.name);
            // Stores into the copy at a row of the loop over output rows:
            // `wide`'s two input rows an output row, each phase loaded for
            // each (its odd width a ragged tile more); the others' input
            // rows one loop, a load a phase.
            let store = format!("{}2*%", copy.replace("tile.load ", ", "));
            let rolling = f.lines().any(|l| l.contains(&store));
            assert_eq!(rolling, name == "wide", "{} @{name}: {f}", target.name);
            let rows: std::collections::HashSet<&str> =
                inputs.iter().filter_map(|l| l.split(", ").nth(2)).collect();
            if rolling {
                assert_eq!(rows.len(), 2, "{} @{name}: {f}", target.name);
                assert!(inputs.len() >= 2 * stride, "{} @{name}: {f}", target.name);
            } else {
                assert_eq!(inputs.len(), stride, "{} @{name}: {f}", target.name);
            }
            assert!(
                inputs.iter().all(|l| !l.contains("pad")),
                "{} @{name}: {f}",
                target.name
            );
            let windows: Vec<&str> = f.lines().filter(|l| l.contains(&copy)).collect();
            assert!(!windows.is_empty(), "{} @{name}: {f}", target.name);
            assert!(
                windows.iter().all(|l| !l.contains("pad")),
                "{} @{name}: {f}",
                target.name
            );
            if name == "odd" || name == "cols" {
                let count = |op: &str| f.lines().filter(|l| l.contains(op)).count();
                let (adds, muls) = (count("tile.add"), count("tile.mul"));
                assert!(
                    muls > 0 && adds * stride == muls * (stride + 1),
                    "{} @{name}: {adds} additions, {muls} multiplications: {f}",
                    target.name
                );
            }
        }
        if target.cpu().is_some() {
            agree_on_tile_interpreter(&m, &tiles, &target);
        }
    }
    agree(src);
}

/// Every entry point of `m` run on the tile interpreter as `tiles`
/// (scheduled for `target`, whatever this CPU is) agrees with the graph
/// interpreter.
fn agree_on_tile_interpreter(m: &dlc_graph::Module, tiles: &dlc_tile::Module, target: &TargetDesc) {
    let text = dlc_tile::print_module(tiles);
    for (seed, f) in m.entry_points().enumerate() {
        let inputs = prepare_inputs(f, &[], Some(seed as u64)).unwrap();
        let want = interpret(m, f, &inputs).unwrap();
        let got = interpret_tile_within(tiles, f, &inputs, dlc_driver::DEFAULT_WORK_LIMIT)
            .unwrap_or_else(|e| panic!("{}: {e}\n{text}", target.name));
        if let Some(d) = disagreement(f, &got, &want) {
            panic!("@{} on {}: {d}\n{text}", f.name, target.name);
        }
    }
}

/// 1 x 1 convolutions over 7 x 7 pixels computed with the pixels as rows
/// (their result stored `[channels, pixels]`, along the register tile's
/// rows): where the register tile has at most 8 rows (AVX2's 4, Zen 4's 6)
/// the epilogue runs on whole `mr x nr` tiles, so that its store and its
/// residual's load are runs along the columns transposed in registers (not
/// scattered and gathered); with the 14 rows of AVX-512 with two FMA units,
/// row by row, but for the last strip's 7-row tile (49 pixels). One slice
/// of the depth (the epilogue on each register tile as it is summed, the
/// last strip's tile of the rows left on its own) and two (on the block
/// after, a tile of rows at a time). Each agrees with the graph interpreter
/// on the tile interpreter.
#[test]
fn pixel_row_products_run_their_epilogues_on_register_tiles_of_few_rows() {
    let src = dlc_tests::PIXEL_ROW_PRODUCTS;
    let m = graph(src);
    let zen4 = TargetDesc::for_cpu("znver4").expect("a known CPU");
    // Each target's three epilogues: the first product's whole tiles, its
    // last strip's, the second product's on its block.
    for (target, shapes) in [
        (TargetDesc::x86_64_avx2(2), ["4x16", "1x16", "4x16"]),
        (zen4, ["6x32", "1x32", "6x32"]),
        (TargetDesc::x86_64_avx512(2), ["1x32", "7x32", "1x32"]),
    ] {
        let tiles = kernels(&m, &target);
        let text = dlc_tile::print_module(&tiles);
        let epilogues: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("tile.silu") || l.contains("tile.relu"))
            .collect();
        assert_eq!(epilogues.len(), 3, "{}: {text}", target.name);
        for (l, shape) in epilogues.into_iter().zip(shapes) {
            let want = format!(": tile<{shape}xf32>");
            assert!(l.ends_with(&want), "{}: {l}\n{text}", target.name);
        }
        agree_on_tile_interpreter(&m, &tiles, &target);
    }
    agree(src);
}

/// The last strip of a product whose rows are all one block's is a
/// register tile of the rows left, not `mr` rows mostly zeros: 49 pixels
/// are 12 strips of 4 and a one-row tile on AVX2, 3 of 14 and a 7-row tile
/// on AVX-512. Its depth loop sums into `mr / rows` tiles of those rows in
/// turn (as many chains of multiply-adds as a whole tile's, where one
/// tile's two would wait on each other), added after. (The same tiles agree with the graph
/// interpreter in
/// `pixel_row_products_run_their_epilogues_on_register_tiles_of_few_rows`.)
#[test]
fn the_last_strip_of_one_block_is_a_tile_of_the_rows_left() {
    let src = dlc_tests::PIXEL_ROW_PRODUCTS;
    let m = graph(src);
    for (target, _) in x86_widths() {
        let g = target.gemm_blocking(dlc_core::DType::F32);
        let tiles = kernels(&m, &target);
        let text = dlc_tile::print_module(&tiles);
        let last = format!(
            "tile.for {{lo = {}, hi = {}, step = 1}}",
            49 / g.mr,
            49 / g.mr + 1
        );
        assert_eq!(text.matches(&last).count(), 2, "{}: {text}", target.name);
        // The last tile's multiply-adds, and the sums carried by their
        // loops they add to (not another multiply-add's): at least two
        // chains in each product's.
        let row = format!(": tile<{}x{}xf32>", 49 % g.mr, g.nr);
        for function in text.split("tile.func @").skip(1) {
            let dots: Vec<&str> = function
                .lines()
                .filter(|l| l.contains("tile.dot") && l.ends_with(&row))
                .collect();
            let results: Vec<&str> = dots
                .iter()
                .filter_map(|l| Some(l.split(" = ").next()?.trim()))
                .collect();
            let carried: std::collections::BTreeSet<&str> = dots
                .iter()
                .filter_map(|l| l.split(", ").nth(2)?.split(' ').next())
                .filter(|acc| !results.contains(acc))
                .collect();
            assert!(carried.len() >= 2, "{}: {carried:?}\n{text}", target.name);
        }
    }
}

/// 1 x 1 convolutions with the output channels as the product's rows (the
/// result stored along the register tile's columns): where the register
/// tile has at most 8 rows (AVX2's `4 x 16`), a long-latency epilogue (SiLU
/// written `h * sigmoid(h)`, which `graph.saturate` makes `silu(h)`) runs on
/// whole register tiles, eight independent chains, a short one (ReLU6) row
/// by row; with AVX-512's 14 rows both row by row. Each agrees with the
/// graph interpreter on the tile interpreter.
#[test]
fn long_epilogues_of_channel_row_products_run_on_register_tiles() {
    let src = dlc_tests::CHANNEL_ROW_PRODUCTS;
    let m = graph(src);
    for (target, lanes) in x86_widths() {
        let tiles = kernels(&m, &target);
        let text = dlc_tile::print_module(&tiles);
        let funcs: Vec<&str> = text
            .split("tile.func @")
            .skip(1)
            .filter(|f| !f.lines().next().unwrap_or("").contains("_prepare("))
            .collect();
        assert_eq!(funcs.len(), 3, "{}: {text}", target.name);
        for (f, (op, long)) in funcs.iter().zip([
            ("tile.silu", true),
            ("tile.silu", true),
            ("tile.minimum", false),
        ]) {
            assert!(f.contains("schedule = \"packed\""), "{}: {f}", target.name);
            let ops: Vec<&str> = f.lines().filter(|l| l.contains(op)).collect();
            assert!(!ops.is_empty(), "{}: {f}", target.name);
            let whole = long && lanes == 32;
            let tile = register_tile(&target);
            for l in ops {
                let shape = if whole { tile.as_str() } else { "xf32>" };
                assert!(l.ends_with(shape), "{}: {l}\n{f}", target.name);
                assert_eq!(l.ends_with(&tile), whole, "{}: {l}\n{f}", target.name);
            }
        }
        agree_on_tile_interpreter(&m, &tiles, &target);
    }
    agree(src);
}

/// A direct convolution (depthwise or grouped) whose epilogue has a
/// long-latency op (a sigmoid, a tanh and a division) computes it over each
/// output channel's plane after the channel's rows, as a loop of its own
/// over the flattened plane (reading a residual and a broadcast through
/// flat views); a short epilogue (ReLU6) stays at each row. On both x86-64
/// widths, each agreeing with the graph interpreter on the tile
/// interpreter.
#[test]
fn long_epilogues_of_direct_convolutions_run_over_each_plane() {
    let src = dlc_tests::DEFERRED_EPILOGUE_PROGRAMS;
    let m = graph(src);
    for (target, _) in x86_widths() {
        let tiles = kernels(&m, &target);
        let text = dlc_tile::print_module(&tiles);
        let funcs: Vec<&str> = text.split("tile.func @").skip(1).collect();
        assert_eq!(funcs.len(), 4, "{}: {text}", target.name);
        for (f, (plane, op, row)) in funcs.iter().zip([
            ("buffer<f32[1, 8, 49]>", "tile.silu", "tile<7xf32>"),
            ("buffer<f32[2, 8, 81]>", "tile.tanh", "tile<9xf32>"),
            ("", "tile.minimum", "tile<9xf32>"),
            ("buffer<f32[1, 6, 36]>", "tile.sigmoid", "tile<6xf32>"),
        ]) {
            let ops: Vec<&str> = f.lines().filter(|l| l.contains(op)).collect();
            assert!(!ops.is_empty(), "{}: {f}", target.name);
            let deferred = !plane.is_empty();
            for l in ops {
                assert_eq!(l.ends_with(row), !deferred, "{}: {l}\n{f}", target.name);
            }
            if deferred {
                assert!(
                    f.contains(&format!("tile.view %out0 : {plane}")),
                    "{}: {f}",
                    target.name
                );
            }
        }
        agree_on_tile_interpreter(&m, &tiles, &target);
    }
    agree(src);
}

/// A vectorized loop whose last block is ragged: on a CPU without mask
/// registers (AVX2), where a masked load or store costs more than a plain
/// one, its whole blocks run with no mask and the rest after them as one
/// tile of exactly the rest (a softmax's two reductions reduced from both
/// parts; an unpadded stride-2 depthwise convolution's columns; a row times
/// a matrix); with them (AVX-512), one masked loop. Each agrees with the
/// graph interpreter on the tile interpreter, on both.
#[test]
fn ragged_vector_loops_run_their_whole_blocks_unmasked_without_mask_registers() {
    let src = format!(
        "fn soft(x: f32[4, 70]) -> f32[4, 70] {{ return softmax(x, axis=1); }}\n{}\n{}",
        "fn dw(x: f32[2, 8, 33, 143], w: f32[8, 1, 3, 3]) -> f32[2, 8, 16, 71] { return conv2d(x, w, stride=2, groups=8); }",
        dlc_tests::ROW_BY_MATRIX_PROGRAM.replacen("fn f(", "fn row(", 1),
    );
    let m = graph(&src);
    for (target, lanes) in x86_widths() {
        let tiles = kernels(&m, &target);
        let text = dlc_tile::print_module(&tiles);
        let peeled = lanes == 32;
        assert_eq!(
            !text.contains("tile.mask"),
            peeled,
            "{}: {text}",
            target.name
        );
        for (cols, rest) in [(70, 6), (71, 7)] {
            let whole = format!("hi = {}, step = {lanes}", cols - rest);
            let tail = format!("lo = {}, hi = {cols}, step = {rest}", cols - rest);
            assert_eq!(
                text.contains(&whole) && text.contains(&tail),
                peeled,
                "{}: {text}",
                target.name
            );
        }
        agree_on_tile_interpreter(&m, &tiles, &target);
    }
    agree(&src);
}
