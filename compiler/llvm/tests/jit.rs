//! Compiled code (tile IR scheduled for the host -> LLVM -> JIT on this
//! CPU) against the graph interpreter, on programs covering every op, and
//! generated programs.
//! This is the one test binary that links LLVM.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::{DType, TargetDesc, TensorType};
use dlc_driver::{
    DEFAULT_PIPELINE, PassOptions, SourceText, compile_source, interpret, max_relative_error,
    prepare_inputs, run_passes,
};
use dlc_runtime::HostTensor;
use proptest::prelude::*;

/// Relative error allowed: compiled code accumulates in f32 (or the integer
/// type), reassociates sums and evaluates transcendental functions in f32.
const TOLERANCE: f64 = 1e-4;

/// `src` checked and through the default pipeline.
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

#[test]
fn narrow_floats_accumulate_in_f32_in_compiled_code() {
    dlc_tests::check_narrow_accumulation(&|m, f, inputs| {
        let lowered = dlc_driver::lower_for_cpu(m).unwrap();
        dlc_llvm::jit(&lowered, |jit| Ok(jit.kernel(&f.name)?.call(inputs)))
            .unwrap()
            .unwrap()
    });
}

#[test]
fn every_element_type_in_compiled_code() {
    dlc_tests::check_element_types(&|m, f, inputs| compiled(m, f, inputs));
}

/// The compiled results for entry point `f` of `m`.
fn compiled(
    m: &dlc_graph::Module,
    f: &dlc_graph::Function,
    inputs: &[HostTensor],
) -> Vec<HostTensor> {
    let tiles = dlc_driver::lower_for_cpu(m).unwrap();
    // Called twice: the second call runs in the workspace the first one
    // handed back, and must not see anything the first one left there.
    let [first, again] = dlc_llvm::jit(&tiles, |jit| {
        let k = jit.kernel(&f.name)?;
        Ok([k.call(inputs), k.call(inputs)])
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", dlc_tile::print_module(&tiles)))
    .map(|r| r.unwrap_or_else(|e| panic!("{e}\n{}", dlc_tile::print_module(&tiles))));
    let bits = |ts: &[HostTensor]| -> Vec<Vec<u64>> {
        ts.iter()
            .map(|t| t.data.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    assert_eq!(
        bits(&first),
        bits(&again),
        "@{}: a second call differs",
        f.name
    );
    first
}

fn jit_agrees(src: &str) {
    let m = graph(src);
    for (seed, f) in m.entry_points().enumerate() {
        let inputs = prepare_inputs(f, &[], Some(seed as u64)).unwrap();
        let want = interpret(&m, f, &inputs).unwrap();
        let got = compiled(&m, f, &inputs);
        let err = max_relative_error(&got, &want).unwrap();
        assert!(
            err <= TOLERANCE,
            "@{}: relative error {err:.3e}\nwant {:?}\ngot {:?}",
            f.name,
            want[0].data,
            got[0].data
        );
    }
}

#[test]
fn element_wise_ops_and_casts() {
    jit_agrees(
        "fn f(x: f32[5, 16], h: f16[16], b: bf16[16]) -> (f32[5, 16], f16[16], bf16[16]) { return (floor(x * 3.0) + ceil(x * 2.0) - round(x * 5.0) + sign(x) + reciprocal(abs(x) + 0.5) + sin(x * 3.0) * cos(x) + silu(x), round(h * 4.0) + sin(h), silu(b) - floor(b * 2.0)); }",
    );
    jit_agrees(
        "fn f(x: i32[3, 8], y: i64[8]) -> (i32[3, 8], i64[8]) { return (sign(x) * 3, sign(y)); }",
    );
    jit_agrees(
        "fn f(x: f32[3, 4], b: f32[4], s: f32) -> f32[3, 4] { return gelu(tanh(x) * b - s) + sigmoid(-x) / (abs(x) + 1.0); }",
    );
    jit_agrees(
        "fn f(x: f32[3, 4], y: f32[3, 1]) -> f32[3, 4] { return where(x > y, exp(x), pow(abs(y) + 0.5, 2.0)) + max(x, y) - min(x, 0.0) + rsqrt(abs(x) + 1.0) + log(sqrt(abs(x) + 1.0)) + relu(x); }",
    );
    jit_agrees(
        "fn f(x: i32[2, 3], y: i32[3]) -> i32[2, 3] { return (x * 3 + y) / 4 - abs(x) + relu(y) + max(x, y) - min(x, 2); }",
    );
    jit_agrees(
        "fn f(x: f32[2, 3]) -> (i32[2, 3], i64[2, 3], bool[2, 3], f16[2, 3], bf16[2, 3]) { return (cast(x * 10.0, i32), cast(x * 1000.0, i64), x > 0.0, cast(x, f16), cast(x, bf16)); }",
    );
    jit_agrees(
        "fn f(x: f16[4], b: bf16[4]) -> (f16[4], bf16[4]) { return (x * x + 1.0 + tanh(x) + max(x, 0.5), exp(b) - b + gelu(b) + pow(abs(b), 2.0)); }",
    );
    jit_agrees(
        "fn f(c: bool[4], x: i64[4]) -> (i64[4], f32[4]) { return (where(c, x, -x), cast(c, f32) + cast(x, f32)); }",
    );
}

/// `max` and `min` in compiled code are the interpreter's, element for
/// element: a NaN on either side propagates, and of two equal operands (+0
/// and -0) the second is the result; in a vector and its scalar tail, and
/// against a constant as ReLU6's clip has it.
#[test]
fn max_and_min_are_the_interpreters() {
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    let pairs = [
        (nan, 1.0),
        (1.0, nan),
        (nan, nan),
        (2.0, 1.0),
        (1.0, 2.0),
        (0.0, -0.0),
        (-0.0, 0.0),
        (inf, -inf),
        (-inf, nan),
        (3.0, 3.0),
        (-7.0, 8.0),
    ];
    let n = 21;
    let (xs, ys): (Vec<f64>, Vec<f64>) = (0..n).map(|i| pairs[i % pairs.len()]).unzip();
    let m = graph(&format!(
        "fn f(x: f32[{n}], y: f32[{n}]) -> (f32[{n}], f32[{n}], f32[{n}], f32[{n}]) {{ return (max(x, y), min(x, y), min(max(x, 0.0), 6.0), max(-0.0, x)); }}"
    ));
    let f = m.entry_points().next().unwrap();
    let t = |v: Vec<f64>| HostTensor::new(TensorType::new(DType::F32, vec![n]), v).unwrap();
    let inputs = [t(xs), t(ys)];
    let want = interpret(&m, f, &inputs).unwrap();
    let got = compiled(&m, f, &inputs);
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        for (i, (a, b)) in w.data.iter().zip(&g.data).enumerate() {
            assert!(
                (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits(),
                "result {k}, element {i} ({:?}): interpreter {a:?}, compiled {b:?}",
                pairs[i % pairs.len()]
            );
        }
    }
}

/// Against a constant bound that is no NaN (ReLU6's clip), `max` and `min`
/// are one unordered compare and a select each: no separate NaN test of
/// the other operand (`max_and_min_are_the_interpreters` checks the
/// values, NaN and signed zeros included).
#[test]
fn clips_against_constants_test_no_nan_apart() {
    let src = "fn f(x: f32[64], y: f32[64]) -> (f32[64], f32[64]) { return (min(max(x, 0.0), 6.0), min(max(x, y), 6.0)); }";
    let clip = "fn f(x: f32[64]) -> f32[64] { return min(max(x, 0.0), 6.0); }";
    for (target, _, ir) in x86_ir(clip) {
        assert!(
            ir.contains("select <") && !ir.contains("fcmp uno <"),
            "{}: {ir}",
            target.name
        );
    }
    // Against a value that may be a NaN, the vectors' NaN test stays.
    for (target, _, ir) in x86_ir(src) {
        assert!(ir.contains("fcmp uno <"), "{}: {ir}", target.name);
    }
    jit_agrees(src);
}

#[test]
fn integer_division_by_zero_is_an_error() {
    let m = graph("fn f(x: i32[2]) -> i32[2] { return x / (x - x); }");
    let x = HostTensor::new(TensorType::new(DType::I32, vec![2]), vec![1.0, 2.0]).unwrap();
    // A zero in any lane of a vector fails, at the division's place.
    let tiles = dlc_driver::lower_for_cpu(&m).unwrap();
    assert_eq!(
        call(&tiles, "f", &[x]).unwrap_err(),
        "`f`: integer division by zero at t.dl:1:36"
    );
}

/// Function `name` of `m` compiled and called (the call's error as text).
fn call<P: dlc_llvm::Program>(
    m: &P,
    name: &str,
    inputs: &[HostTensor],
) -> Result<Vec<HostTensor>, String> {
    dlc_llvm::jit(m, |jit| Ok(jit.kernel(name)?.call(inputs)))
        .unwrap()
        .map_err(|e| e.to_string())
}

/// The inline f32 `exp`, `tanh` and `erf` (which let loops vectorize) stay within
/// a few ulp of the exact values, element by element, over their whole
/// range, with the IEEE special values right.
#[test]
fn transcendental_functions_are_accurate_everywhere() {
    let n = 4096;
    let mut xs: Vec<f64> = (0..n)
        .map(|i| f64::from(-87.0f32 + 175.0 * i as f32 / (n - 5) as f32))
        .collect();
    xs.truncate(n - 5);
    xs.extend([0.0, -0.0, 1e-30, f64::INFINITY, f64::NEG_INFINITY]);
    // Past f32's range of normal exponentials: subnormal, zero and
    // infinite results (and the tails of tanh, sigmoid and erf).
    for (i, x) in [
        -87.5f32, -95.0, -100.0, -103.9, -104.5, -150.0, 88.5, 88.7, 88.8, 89.5, 100.0,
    ]
    .into_iter()
    .enumerate()
    {
        xs[i * 7 + 1] = f64::from(x);
    }
    let src = format!(
        "fn f(x: f32[{n}]) -> (f32[{n}], f32[{n}], f32[{n}], f32[{n}], f32[{n}], f32[{n}], f32[{n}]) {{ return (exp(x), tanh(x), tanh(x / 64.0), sigmoid(x), erf(x), erf(x / 16.0), silu(x)); }}"
    );
    let m = graph(&src);
    let tiles = dlc_driver::lower_for_cpu(&m).unwrap();
    let x = HostTensor::new(TensorType::new(DType::F32, vec![n]), xs.clone()).unwrap();
    check_transcendental(&xs, &call(&tiles, "f", std::slice::from_ref(&x)).unwrap());
    // exp(NaN) is NaN.
    let nan = HostTensor::new(TensorType::new(DType::F32, vec![n]), vec![f64::NAN; n]).unwrap();
    let out = call(&tiles, "f", std::slice::from_ref(&nan)).unwrap();
    assert!(out.iter().all(|t| t.data.iter().all(|v| v.is_nan())));
    // On scalars (no 16-lane vector: exp builds 2^n in exponent bits rather
    // than by AVX-512's vscalefps), every 17th point and the edges.
    let scalar = graph(
        "fn g(x: f32) -> (f32, f32, f32, f32, f32, f32, f32) { return (exp(x), tanh(x), tanh(x / 64.0), sigmoid(x), erf(x), erf(x / 16.0), silu(x)); }",
    );
    let scalar = dlc_driver::lower_for_cpu(&scalar).unwrap();
    let picked: Vec<f64> = xs
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 17 == 0 || i % 7 == 1 || *i >= n - 5)
        .map(|(_, x)| *x)
        .collect();
    let mut outs: Vec<HostTensor> = (0..7)
        .map(|_| {
            HostTensor::new(
                TensorType::new(DType::F32, vec![picked.len()]),
                vec![0.0; picked.len()],
            )
            .unwrap()
        })
        .collect();
    dlc_llvm::jit(&scalar, |jit| {
        let g = jit.kernel("g")?;
        for (i, &x) in picked.iter().enumerate() {
            let x = HostTensor::new(TensorType::new(DType::F32, vec![]), vec![x]).unwrap();
            for (o, r) in outs.iter_mut().zip(g.call(&[x]).unwrap()) {
                o.data[i] = r.data[0];
            }
        }
        Ok(())
    })
    .unwrap();
    check_transcendental(&picked, &outs);
}

/// Sigmoid (and SiLU, written through it) where `exp` builds 2^n in
/// exponent bits (AVX2, not AVX-512's `vscalefps`) clamps its exp(-x) to
/// [-87, 88] and builds 2^n as one factor: no halving of n (`sdiv`), which
/// `exp` itself keeps for its subnormal and infinite results. Its accuracy
/// and tails are `transcendental_functions_are_accurate_everywhere`'s; here
/// both agree with the graph interpreter.
#[test]
fn sigmoid_builds_its_power_of_two_in_one_factor() {
    let src = "fn s(x: f32[64]) -> f32[64] { return sigmoid(x) + silu(x); }
fn e(x: f32[64]) -> f32[64] { return exp(x); }";
    let target = TargetDesc::x86_64_avx2(2);
    let tiles = dlc_driver::lower_for_tile(&graph(src), &target).unwrap();
    let ir = dlc_llvm::emit_llvm_ir(&tiles, &dlc_runtime::abi::Symbols::for_module("t"), &target)
        .unwrap();
    let kernel = |name: &str| {
        ir.split("\ndefine ")
            .find(|f| {
                let head = f.lines().next().unwrap_or("");
                head.contains(&format!("@{name}.kernel"))
            })
            .unwrap_or_else(|| panic!("no kernel of @{name}: {ir}"))
    };
    assert!(!kernel("s").contains("sdiv"), "{}", kernel("s"));
    assert!(kernel("e").contains("sdiv"), "{}", kernel("e"));
    jit_agrees(src);
}

/// `exp` rounds x log2 e to an integer by adding and subtracting 1.5 * 2^23
/// and reads 2^n's exponent from the sum's bits: no `roundeven`, no
/// float-to-integer conversion (poison on NaN), and so on x86, whose clamp
/// keeps NaN, no select of NaN back in (a GPU's clamp does not keep it: the
/// `gpu` snapshots keep the select); the product and the addition are one
/// `llvm.fmuladd`. SiLU is x / (1 + exp(-x)), one division of x, not a
/// reciprocal times x, and on AVX2 its denominator is infinite below -88.38
/// by its 2^n alone (n = 128 is infinity's bits), with no compare and
/// select of an infinity. Accuracy is
/// `transcendental_functions_are_accurate_everywhere`'s.
#[test]
fn exp_rounds_by_adding_and_silu_divides_once() {
    let src = "fn e(x: f32[64]) -> f32[64] { return exp(x); }
fn s(x: f32[64]) -> f32[64] { return silu(x); }";
    let kernel = |target: &TargetDesc, name: &str| -> String {
        let tiles = dlc_driver::lower_for_tile(&graph(src), target).unwrap();
        let ir =
            dlc_llvm::emit_llvm_ir(&tiles, &dlc_runtime::abi::Symbols::for_module("t"), target)
                .unwrap();
        ir.split("\ndefine ")
            .find(|f| f.lines().next().unwrap_or("").contains(&format!("@{name}")))
            .unwrap_or_else(|| panic!("no kernel of @{name}: {ir}"))
            .to_string()
    };
    for target in [TargetDesc::x86_64_avx2(2), TargetDesc::x86_64_avx512(2)] {
        let e = kernel(&target, "e");
        for gone in ["roundeven", "fptosi", "fcmp uno"] {
            assert!(!e.contains(gone), "{}: {gone} in {e}", target.name);
        }
        assert!(
            e.contains("0x4168000000000000") && e.contains("@llvm.fmuladd"),
            "{}: no 1.5 * 2^23 added by a multiply-add in {e}",
            target.name
        );
    }
    let avx2 = TargetDesc::x86_64_avx2(2);
    let s = kernel(&avx2, "s");
    let divisions: Vec<&str> = s.lines().filter(|l| l.contains(" fdiv ")).collect();
    assert!(!divisions.is_empty(), "no division in {s}");
    for d in divisions {
        assert!(!d.contains("1.000000e+00"), "a reciprocal: {d}");
    }
    for gone in ["0x7FF0000000000000", "sdiv"] {
        assert!(!s.contains(gone), "{gone} in {s}");
    }
    jit_agrees(src);
}

fn check_transcendental(xs: &[f64], out: &[HostTensor]) {
    let erf = |x: f64| dlc_core::scalar::apply_unary(dlc_core::scalar::UnaryOp::Erf, x);
    let refs: [&dyn Fn(f64) -> f64; 7] = [
        &f64::exp,
        &f64::tanh,
        &|x| (x / 64.0).tanh(),
        &|x| 1.0 / (1.0 + (-x).exp()),
        &erf,
        &|x| erf(DType::F32.round(x / 16.0)),
        &|x| x / (1.0 + (-x).exp()),
    ];
    for (k, (got, want)) in out.iter().zip(refs).enumerate() {
        for (i, &x) in xs.iter().enumerate() {
            let w = DType::F32.round(want(x));
            let g = got.data[i];
            // silu(-inf) is -inf / inf, NaN, as in PyTorch and JAX.
            let ok = if w.is_nan() {
                g.is_nan()
            } else if w == 0.0 || w.is_infinite() {
                g == w || (w == 0.0 && g.abs() < 1e-37)
            } else if w.abs() < f64::from(f32::MIN_POSITIVE) {
                // A subnormal: within the smallest normal of it.
                (g - w).abs() < f64::from(f32::MIN_POSITIVE)
            } else {
                ((g - w) / w).abs() <= 4.0 * f64::from(f32::EPSILON)
            };
            assert!(ok, "function {k} at x = {x:e}: got {g:e}, want {w:e}");
        }
    }
}

/// The runtime's checked call rejects what does not match the signature.
#[test]
fn calls_with_wrong_arguments_are_rejected() {
    let m = graph("fn f(x: f32[2, 3], y: f32[3]) -> f32[2, 3] { return x * y; }");
    let lowered = dlc_driver::lower_for_cpu(&m).unwrap();
    let t = |d: DType, shape: Vec<usize>| {
        HostTensor::new(
            TensorType::new(d, shape.clone()),
            vec![1.0; shape.iter().product()],
        )
        .unwrap()
    };
    let errors = dlc_llvm::jit(&lowered, |jit| {
        let k = jit.kernel("f")?;
        assert_eq!(
            k.call(&[t(DType::F32, vec![2, 3]), t(DType::F32, vec![3])])
                .unwrap()[0]
                .data,
            vec![1.0; 6]
        );
        Ok([
            vec![t(DType::F32, vec![2, 3])],
            vec![t(DType::F32, vec![3, 2]), t(DType::F32, vec![3])],
            vec![t(DType::F32, vec![2, 3]), t(DType::I32, vec![3])],
            vec![
                t(DType::F32, vec![2, 3]),
                t(DType::F32, vec![3]),
                t(DType::F32, vec![3]),
            ],
        ]
        .map(|args| k.call(&args).unwrap_err().to_string()))
    })
    .unwrap();
    assert_eq!(
        errors,
        [
            "`f` takes 2 input(s), got 1: missing `y` (f32[3])",
            "`f`: input `x` must be f32[2, 3], got f32[3, 2]",
            "`f`: input `y` must have element type f32, got i32 (i32[3])",
            "`f` takes 2 input(s), got 3",
        ]
    );
    let missing = dlc_llvm::jit(&lowered, |jit| jit.kernel("g").map(|_| ())).unwrap_err();
    assert_eq!(missing.to_string(), "no function `@g`");
    // Inputs pushed one at a time are checked as they come, and the count
    // when the binding is finished.
    let errors = dlc_llvm::jit(&lowered, |jit| {
        let k = jit.kernel("f")?;
        let mut b = k.binder();
        let wrong = b.push(&t(DType::F32, vec![3])).unwrap_err().to_string();
        let short = b
            .push_values(
                &TensorType::new(DType::F32, vec![2, 3]),
                [1.0, 2.0].into_iter(),
            )
            .unwrap_err()
            .to_string();
        b.push(&t(DType::F32, vec![2, 3])).unwrap();
        let early = k.binder();
        let few = early.finish().err().unwrap().to_string();
        b.push(&t(DType::F32, vec![3])).unwrap();
        let more = b.push(&t(DType::F32, vec![3])).unwrap_err().to_string();
        let mut call = b.finish().unwrap();
        call.run().unwrap();
        assert_eq!(call.outputs().unwrap()[0].data, vec![1.0; 6]);
        Ok([wrong, short, few, more])
    })
    .unwrap();
    assert_eq!(
        errors,
        [
            "`f`: input `x` must be f32[2, 3], got f32[3]",
            "`f`: input `x` (f32[2, 3]) has 2 of its 6 elements",
            "`f` takes 2 input(s), got 0: missing `x` (f32[2, 3]), `y` (f32[3])",
            "`f` takes 2 input(s), got more",
        ]
    );
}

/// Declared weights: the panels of every product by a weight (plain,
/// transposed, batched, shared by two products, computed from weights,
/// concatenated weights) and a batchnorm folded into convolution weights are
/// packed by the preparer once per binding, and calls read them; results
/// agree with the interpreter, a second call agrees with the first, and a
/// call checks the inputs it takes (the prepared ones are not among them).
#[test]
fn weights_are_prepared_once_per_binding() {
    let programs = [
        "fn f(x: f32[50, 70], weight w: f32[70, 90], weight b: f32[90]) -> f32[50, 90] { return relu(x @ w + b); }",
        "fn f(x: f32[50, 70], weight w: f32[90, 70]) -> f32[50, 90] { return x @ transpose(w); }",
        "fn f(x: f32[3, 20, 40], weight w: f32[3, 40, 50]) -> f32[3, 20, 50] { return x @ w; }",
        "fn f(x: f32[30, 64], y: f32[30, 64], weight w: f32[64, 64]) -> f32[30, 64] { return x @ w + y @ w; }",
        "fn f(x: f32[30, 64], weight w: f32[64, 64], weight s: f32[64]) -> f32[30, 64] { return x @ (w * s); }",
        "fn f(x: f32[30, 64], weight a: f32[64, 40], weight b: f32[64, 40]) -> f32[30, 80] { return x @ concat([a, b], axis=1); }",
        "fn f(x: f32[2, 3, 10, 10], weight w: f32[8, 3, 3, 3], weight m: f32[8], weight v: f32[8], weight g: f32[8], weight b: f32[8]) -> f32[2, 8, 10, 10] { return relu(batchnorm(conv2d(x, w, padding=1), m, v, g, b, eps=1e-5)); }",
    ];
    for src in programs {
        let m = graph(src);
        let tiles = dlc_driver::lower_for_cpu(&m).unwrap();
        let text = dlc_tile::print_module(&tiles);
        assert!(text.contains("prepare @f_prepare"), "{src}\n{text}");
        jit_agrees(src);
    }
    // Inputs pushed one at a time give what a call on all of them gives,
    // the preparer running when the binding is finished.
    for src in programs {
        let m = graph(src);
        let tiles = dlc_driver::lower_for_cpu(&m).unwrap();
        let f = m.entry_points().next().unwrap();
        let inputs = prepare_inputs(f, &[], Some(3)).unwrap();
        let (whole, pushed) = dlc_llvm::jit(&tiles, |jit| {
            let k = jit.kernel("f")?;
            let whole = k.call(&inputs).unwrap();
            let mut b = k.binder();
            for t in &inputs {
                b.push(t).unwrap();
            }
            let mut call = b.finish().unwrap();
            call.run().unwrap();
            Ok((whole, call.outputs().unwrap()))
        })
        .unwrap();
        assert_eq!(whole, pushed, "{src}");
    }
    // The preparer's results are not inputs of a call.
    let m = graph(programs[0]);
    let tiles = dlc_driver::lower_for_cpu(&m).unwrap();
    let f = m.entry_points().next().unwrap();
    let mut inputs = prepare_inputs(f, &[], Some(0)).unwrap();
    let err = dlc_llvm::jit(&tiles, |jit| {
        let k = jit.kernel("f")?;
        inputs.pop();
        Ok(k.call(&inputs).unwrap_err().to_string())
    })
    .unwrap();
    assert_eq!(err, "`f` takes 3 input(s), got 2: missing `b` (f32[90])");
}

/// Contractions compiled as packed, register-tiled `loop.matmul`s: row
/// counts that are not multiples of the register tile (6) or the row block
/// (72, so several blocks run on threads), columns that are not multiples of
/// 32, depths over one packed panel (256), transposed and batched operands,
/// epilogues.
#[test]
fn tiled_contractions() {
    jit_agrees(
        "fn f(x: f32[150, 300], w: f32[300, 70], b: f32[70]) -> f32[150, 70] { return relu(x @ w + b); }",
    );
    jit_agrees(
        "fn f(q: f32[3, 41, 64], k: f32[3, 53, 64], v: f32[3, 53, 17]) -> f32[3, 41, 17] { return softmax(q @ transpose(k, [0, 2, 1]) / 8.0, axis=-1) @ v; }",
    );
    // Whole blocks of rows: both products read their rows in place.
    jit_agrees(
        "fn f(q: f32[2, 192, 64], k: f32[2, 100, 64], v: f32[2, 100, 40]) -> f32[2, 192, 40] { return softmax(q @ transpose(k, [0, 2, 1]) / 8.0, axis=-1) @ v; }",
    );
    jit_agrees(
        "fn f(x: f32[7, 513], w: f32[33, 513]) -> f32[7, 33] { return x @ transpose(w, [1, 0]); }",
    );
    // One row block: the columns are split over threads in chunks of two
    // strips, the last chunk one partial strip.
    jit_agrees(
        "fn f(x: f32[20, 40], w: f32[40, 330], b: f32[330]) -> f32[20, 330] { return tanh(x @ w) - b; }",
    );
    // A strided depthwise convolution: tiles of columns read two apart; a
    // window wider than its rows; a row by a transposed weight.
    jit_agrees(dlc_tests::STRIDED_DEPTHWISE_PROGRAM);
    jit_agrees(dlc_tests::WIDE_WINDOW_DEPTHWISE_PROGRAM);
    jit_agrees(dlc_tests::ROW_BY_TRANSPOSED_PROGRAM);
    jit_agrees(dlc_tests::ROW_BY_MATRIX_PROGRAM);
    jit_agrees(dlc_tests::REUSED_CONSTANT_STORAGE_PROGRAM);
    for src in dlc_tests::PIXEL_CONV_PROGRAMS
        .iter()
        .chain(&dlc_tests::FLAT_IMAGE_PROGRAMS)
        .chain(&dlc_tests::PIXEL_ROW_PROGRAMS)
        .chain(&dlc_tests::DEEP_PIXEL_ROW_PROGRAMS)
    {
        jit_agrees(src);
    }
    // Convolutions as products computing their epilogues.
    for src in dlc_tests::CONV_EPILOGUE_PROGRAMS {
        jit_agrees(src);
    }
    // A convolution as a product over an im2col buffer.
    jit_agrees(
        "fn f(x: f32[3, 8, 13, 11], w: f32[20, 8, 3, 2], b: f32[20, 1, 1]) -> f32[3, 20, 7, 12] { return relu(conv2d(x, w, stride=[2, 1], padding=[1, 1]) + b); }",
    );
}

/// Gathers in compiled code: an index read from data addresses a row
/// (`tile.cast %i : index`), one out of range reads zero.
#[test]
fn gathers_agree() {
    for src in dlc_tests::GATHER_PROGRAMS {
        jit_agrees(src);
    }
    // The embedding's row is read as vectors: the index is computed once per
    // row, outside the loop over the row.
    let m = graph(dlc_tests::GATHER_PROGRAMS[0]);
    let text = dlc_tile::print_module(&dlc_driver::lower_for_cpu(&m).unwrap());
    assert!(
        text.contains(": index") && text.contains("tile<12xf32>"),
        "{text}"
    );
}

/// Convolutions as Winograd's F(4x4, 3x3) (see `WINOGRAD_PROGRAMS`),
/// compiled, with and without declared weights.
#[test]
fn winograd_convolutions() {
    for src in dlc_tests::WINOGRAD_PROGRAMS {
        jit_agrees(src);
    }
}

#[test]
fn tensor_operators() {
    jit_agrees(
        "fn f(x: f32[3, 4, 5]) -> (f32[3, 5], f32[1, 4, 1], f32, f32[3, 4, 5], f32[3, 4, 5]) { return (sum(x, axis=1), mean(x, axis=[0, 2], keepdims=true), max(x), softmax(x, axis=1), layernorm(x, axis=[1, 2])); }",
    );
    jit_agrees(
        "fn f(a: f32[2, 1, 3, 4], b: f32[5, 4, 2], v: f32[4]) -> (f32[2, 5, 3, 2], f32[2, 1, 3]) { return (a @ b, a @ v); }",
    );
    jit_agrees(
        "fn f(x: f32[2, 4, 6, 5], w: f32[6, 2, 3, 2]) -> f32[2, 6, 3, 6] { return relu(conv2d(x, w, stride=[2, 1], padding=[1, 1], groups=2)); }",
    );
    jit_agrees(
        "fn f(x: f32[1, 2, 7, 6]) -> (f32[1, 2, 4, 3], f32[1, 2, 4, 3]) { return (maxpool2d(x, kernel=3, stride=2, padding=1), avgpool2d(x, kernel=3, stride=2, padding=1)); }",
    );
    jit_agrees(
        "fn f(x: f32[2, 3, 4, 4], m: f32[3], v: f32[3], g: f32[3], b: f32[3]) -> f32[2, 3, 4, 4] { return batchnorm(x, m, abs(v) + 0.5, g, b); }",
    );
    jit_agrees(
        "fn f(x: f32[2, 6], y: f32[2, 3]) -> (f32[3, 4], f32[4, 2], f32[2, 9], f32[2, 2, 3]) { return (reshape(exp(x), [3, 4]), transpose(slice(reshape(x, [3, 4]), axis=0, start=1, end=3)), concat([x, y], axis=1), broadcast(y, [2, 2, 3])); }",
    );
}

/// Convolutions and pooling (`dlc_tests::POOLING_PROGRAMS`: max pools in
/// two passes, padded or not, strided along one axis or both, with an
/// epilogue) in compiled code.
#[test]
fn pooling_in_compiled_code() {
    for src in dlc_tests::POOLING_PROGRAMS {
        jit_agrees(src);
    }
}

#[test]
fn user_operators() {
    jit_agrees(
        "
op conv3x3[N, C, H, W, O](img: f32[N, C, H, W], w: f32[O, C, 3, 3]) -> f32[N, O, H, W] {
    out[n, o, y, x] = sum[c, ky, kx](img[n, c, y + ky - 1, x + kx - 1] * w[o, c, ky, kx]);
}
op row_softmax[M, N](x: f32[M, N]) -> f32[M, N] {
    let m[i] = max[j](x[i, j]);
    let e[i, j] = exp(x[i, j] - m[i]);
    let s[i] = sum[j](e[i, j]);
    out[i, j] = e[i, j] / s[i];
}
fn f(img: f32[1, 2, 5, 5], w: f32[3, 2, 3, 3], a: f32[3, 4]) -> (f32[1, 3, 5, 5], f32[3, 4]) {
    return (conv3x3(img, w), row_softmax(a));
}",
    );
}

#[test]
fn small_workloads() {
    jit_agrees(
        "fn mlp(x: f32[4, 8], w1: f32[8, 16], b1: f32[16], w2: f32[16, 8], b2: f32[8]) -> f32[4, 8] { return relu(x @ w1 + b1) @ w2 + b2; }",
    );
    jit_agrees(
        "fn attention(q: f32[2, 6, 4], k: f32[2, 6, 4], v: f32[2, 6, 4]) -> f32[2, 6, 4] { return softmax(q @ transpose(k, [0, 2, 1]) / sqrt(4.0), axis=-1) @ v; }",
    );
    // Repeated steps (a recurrent network unrolled): the tile back end
    // emits each kernel once and calls it on every step's buffers.
    jit_agrees(
        "fn step[N](h: f32[64, N], w: f32[N, N], b: f32[N]) -> f32[64, N] { return tanh(h @ transpose(w) + b) + h; }
         fn f(h: f32[64, 96], w: f32[96, 96], b: f32[96]) -> f32[64, 96] { return step(step(step(h, w, b), w, b * 2.0), w, b); }",
    );
}

/// Steps that each read their slice of one input (W7's `x[t]`) read it in
/// place, through a view with an offset, and share their kernels as if
/// each step had an input of its own: the module has as many functions as
/// the same steps over separate inputs, and none copies a slice.
#[test]
fn slices_along_the_outer_axis_are_read_in_place() {
    let step = "fn step(x: f32[40, 128], h: f32[40, 96], w: f32[96, 128]) -> f32[40, 96] { return tanh(x @ transpose(w) + h); }";
    let sliced = format!(
        "{step}
         fn f(x: f32[3, 40, 128], w: f32[96, 128]) -> f32[40, 96] {{
             let h = zeros([40, 96]);
             let h1 = step(reshape(slice(x, axis=0, start=0, end=1), [40, 128]), h, w);
             let h2 = step(reshape(slice(x, axis=0, start=1, end=2), [40, 128]), h1, w);
             return step(reshape(slice(x, axis=0, start=2, end=3), [40, 128]), h2, w);
         }}"
    );
    let separate = format!(
        "{step}
         fn f(x0: f32[40, 128], x1: f32[40, 128], x2: f32[40, 128], w: f32[96, 128]) -> f32[40, 96] {{
             return step(x2, step(x1, step(x0, zeros([40, 96]), w), w), w);
         }}"
    );
    jit_agrees(&sliced);
    let functions = |src: &str| {
        let m = graph(src);
        let tiles = dlc_driver::lower_for_cpu(&m).unwrap();
        let text = dlc_tile::print_module(&tiles);
        let ir = dlc_llvm::emit_llvm_ir(
            &tiles,
            &dlc_runtime::abi::Symbols::for_module("t"),
            TargetDesc::host(),
        )
        .unwrap();
        (
            ir.lines().filter(|l| l.starts_with("define ")).count(),
            text,
        )
    };
    let (n_sliced, text) = functions(&sliced);
    assert!(text.contains("offset = 10240>"), "{text}");
    assert_eq!(n_sliced, functions(&separate).0, "{text}");
}

/// A window's taps, a loop carrying the sum of at most 8 short
/// iterations, are written out by the code generator (LLVM's unroller is
/// off): a 3x3 depthwise convolution compiles to no loop over its taps,
/// a 9x9 one keeps its loops. Both agree with the graph interpreter.
#[test]
fn short_window_loops_are_written_out() {
    let program = |k: usize| {
        format!(
            "fn f(x: f32[1, 4, 20, 16], w: f32[4, 1, {k}, {k}]) -> f32[1, 4, 20, 16] {{ return conv2d(x, w, padding={}, groups=4); }}",
            k / 2
        )
    };
    for target in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let loops = |src: &str| {
            let tiles = dlc_driver::lower_for_tile(&graph(src), &target).unwrap();
            let ir = dlc_llvm::emit_llvm_ir(
                &tiles,
                &dlc_runtime::abi::Symbols::for_module("t"),
                &target,
            )
            .unwrap();
            ir.lines()
                .filter(|l| {
                    l.strip_prefix("loop.body").is_some_and(|rest| {
                        rest.trim_start_matches(|c: char| c.is_ascii_digit())
                            .starts_with(':')
                    })
                })
                .count()
        };
        assert_eq!(loops(&program(3)), 0, "{}", target.name);
        assert!(loops(&program(9)) >= 1, "{}", target.name);
    }
    jit_agrees(&program(3));
    jit_agrees(&program(9));
}

/// Rows of a small plane whose window sums are written out are written out
/// too (each row's taps one chain; written out, the rows' chains interleave
/// and their padded loads test constants): a 3 x 3 depthwise convolution
/// over 7 x 7 multiplies 7 rows of 9 taps in straight-line code (63 `fmul`s
/// of 7 lanes), over 14 x 14 its rows stay a loop. On AVX2 and AVX-512;
/// both agree with the graph interpreter.
#[test]
fn rows_of_small_planes_are_written_out() {
    let program = |side: usize| {
        format!(
            "fn f(x: f32[1, 4, {side}, {side}], w: f32[4, 1, 3, 3]) -> f32[1, 4, {side}, {side}] {{ return conv2d(x, w, padding=1, groups=4); }}"
        )
    };
    let products = |ir: &str| ir.lines().filter(|l| l.contains(" = fmul ")).count();
    for (target, _, ir) in x86_ir(&program(7)) {
        assert_eq!(products(&ir), 63, "{}: {ir}", target.name);
    }
    for (target, _, ir) in x86_ir(&program(14)) {
        assert!(products(&ir) < 14 * 9, "{}: {ir}", target.name);
    }
    jit_agrees(&program(7));
    jit_agrees(&program(14));
}

/// A short loop whose body reads a padded load that moves with its counter
/// is written out, so that each copy tests its bounds against constants: a
/// 3 x 3 stride-2 convolution's im2col copy (three channels, as a network's
/// stem) reads each of its 27 taps by a load of its own (a masked load where
/// the window may leave the image). On AVX2 and AVX-512; it agrees with the
/// graph interpreter.
#[test]
fn padded_copies_along_short_loops_are_written_out() {
    let src = "fn f(x: f32[1, 3, 32, 32], w: f32[16, 3, 3, 3]) -> f32[1, 16, 16, 16] { return conv2d(x, w, stride=2, padding=1); }";
    for (target, _, ir) in x86_ir(src) {
        let padded = ir
            .lines()
            .filter(|l| l.contains("@llvm.masked.load"))
            .count();
        assert!(padded >= 27, "{}: {padded}\n{ir}", target.name);
    }
    jit_agrees(src);
}

/// A kernel of few programs runs on threads when they are heavy: a
/// Winograd convolution over 14 x 14 is a kernel of two to four programs
/// (blocks of tile rows), each a third of a million multiply-adds or more,
/// and is outlined for the OpenMP threads (`f.threadsN`), where a kernel
/// of as few light programs (a bias over two rows) runs on the calling
/// thread (`f.kernelN`). Both agree with the graph interpreter.
#[test]
fn few_heavy_programs_run_on_threads() {
    let heavy = "fn f(x: f32[1, 64, 14, 14], w: f32[64, 64, 3, 3]) -> f32[1, 64, 14, 14] { return conv2d(x, w, padding=1); }";
    let light = "fn f(x: f32[2, 64], b: f32[2, 1]) -> f32[2, 64] { return x + b; }";
    for target in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let kernels = |src: &str| {
            let tiles = dlc_driver::lower_for_tile(&graph(src), &target).unwrap();
            let text = dlc_tile::print_module(&tiles);
            // The Winograd kernel's grid, or the only kernel's.
            let grid = text
                .lines()
                .filter(|l| l.contains("tile.kernel"))
                .find(|l| l.contains("winograd") || !text.contains("winograd"))
                .and_then(|l| l.split("grid = [").nth(1))
                .and_then(|g| g.split(']').next())
                .map(|g| {
                    g.split(", ")
                        .map(|n| n.parse::<usize>().unwrap())
                        .product::<usize>()
                })
                .unwrap();
            let ir = dlc_llvm::emit_llvm_ir(
                &tiles,
                &dlc_runtime::abi::Symbols::for_module("t"),
                &target,
            )
            .unwrap();
            let defined = |prefix: &str| {
                ir.lines()
                    .filter(|l| l.starts_with("define ") && l.contains(prefix))
                    .count()
            };
            (grid, defined("@f.threads"), defined("@f.kernel"), text)
        };
        let (grid, threads, serial, text) = kernels(heavy);
        assert!(
            (2..target.min_thread_iterations()).contains(&grid),
            "{}: {text}",
            target.name
        );
        assert!(
            text.contains("schedule = \"winograd\""),
            "{}: {text}",
            target.name
        );
        // Every kernel on threads, the Winograd kernel too.
        assert!(threads >= 1 && serial == 0, "{}: {text}", target.name);
        let (grid, threads, serial, text) = kernels(light);
        assert!(
            grid < target.min_thread_iterations(),
            "{}: {text}",
            target.name
        );
        assert_eq!((threads, serial), (0, 1), "{}: {text}", target.name);
    }
    jit_agrees(heavy);
    jit_agrees(light);
}

/// A load whose lanes all read one element under a mask (a product's
/// epilogue reading the bias of each row of a register tile, at the
/// block's ragged edges: 16 rows, 324 columns in panels of 32 or 16) is one
/// element read where any lane is on, then broadcast: no gather. It agrees
/// with the graph interpreter.
#[test]
fn masked_broadcast_loads_read_one_element() {
    let src = "fn f(x: f32[1, 32, 18, 18], w: f32[16, 32, 1, 1], b: f32[16]) -> f32[1, 16, 18, 18] { return conv2d(x, w) + reshape(b, [1, 16, 1, 1]); }";
    for target in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let tiles = dlc_driver::lower_for_tile(&graph(src), &target).unwrap();
        let text = dlc_tile::print_module(&tiles);
        assert!(
            text.contains("schedule = \"packed\""),
            "{}: {text}",
            target.name
        );
        let ir =
            dlc_llvm::emit_llvm_ir(&tiles, &dlc_runtime::abi::Symbols::for_module("t"), &target)
                .unwrap();
        assert!(!ir.contains("@llvm.masked.gather"), "{}: {ir}", target.name);
        assert!(
            ir.contains("@llvm.masked.load.v1f32"),
            "{}: {ir}",
            target.name
        );
    }
    jit_agrees(src);
}

/// A masked store where the CPU has no mask registers (AVX2: `vmaskmovps`,
/// microcode on AMD's Zen 1-3) tests its lanes and, every lane on, stores
/// plainly (a `store.full` branch); the masked store is left for partial
/// tiles. With AVX-512's mask registers the masked store is the only one.
/// A 1 x 1 convolution's epilogue over 20 x 20 pixels (400 columns, ragged
/// in panels of 16 or 32) and a ragged element-wise pass of 70 elements
/// (blocks of 32, the last program's masked) both have such stores (LLVM
/// unswitches the epilogue's loop on the test, so that only the element-wise
/// pass's branch keeps its name); they agree with the graph interpreter.
#[test]
fn masked_stores_without_mask_registers_store_whole_vectors_plainly() {
    let src = "fn f(x: f32[1, 32, 20, 20], w: f32[16, 32, 1, 1]) -> f32[1, 16, 20, 20] { return clamp(conv2d(x, w), 0.0, 6.0); }
fn g(x: f32[70]) -> f32[70] { return tanh(x) * 2.0; }";
    without_mask_registers_only(src, "@llvm.masked.store", "store.full");
}

/// A padded load whose every lane stays inside its buffer for every value
/// its loop counters and program ids take is a plain load: no bounds test,
/// no masked load (as the middle panels of a padded convolution's im2col
/// copy), where LLVM does not fold a vector of lane indices compared with
/// the extent (the tiles of a loop over 64 columns by 32 read columns 3 to
/// 66 of 70); one that reaches past the buffer (7 to 70) keeps both. Both
/// agree with the graph interpreter.
#[test]
fn padded_loads_proven_inside_test_no_bounds() {
    let program = |shift: usize| {
        format!(
            "op shift[N](x: f32[4, N]) -> f32[4, 64] {{ out[i, j] = x[i, j + {shift}]; }}
fn f(x: f32[4, 70]) -> f32[4, 64] {{ return shift(x); }}"
        )
    };
    for (shift, inside) in [(3, true), (7, false)] {
        let src = program(shift);
        for (target, _, ir) in x86_ir(&src) {
            assert_eq!(
                !ir.contains("@llvm.masked.load"),
                inside,
                "{}: {ir}",
                target.name
            );
        }
        jit_agrees(&src);
    }
}

/// Direct convolutions whose epilogue runs over each channel's plane after
/// its rows (`differential::long_epilogues_of_direct_convolutions_...`)
/// agree with the graph interpreter.
#[test]
fn deferred_epilogues_agree() {
    jit_agrees(dlc_tests::DEFERRED_EPILOGUE_PROGRAMS);
}

/// Grouped convolutions of several input channels a group, one packed
/// product per group (`differential::grouped_convolutions_are_products_per_group`),
/// agree with the graph interpreter.
#[test]
fn grouped_convolutions_agree() {
    jit_agrees(dlc_tests::GROUPED_CONVOLUTION_PROGRAMS);
}

/// Dilated convolutions
/// (`differential::dilated_convolutions_run_the_convolution_kernels`)
/// agree with the graph interpreter, compiled.
#[test]
fn dilated_convolutions_agree() {
    jit_agrees(dlc_tests::DILATED_CONVOLUTION_PROGRAMS);
}

/// Video convolutions
/// (`differential::video_convolutions_are_convolutions_of_their_frames`)
/// agree with the graph interpreter, compiled.
#[test]
fn video_convolutions_agree() {
    jit_agrees(dlc_tests::VIDEO_CONVOLUTION_PROGRAMS);
}

/// Depthwise convolutions strided along their columns, which read each
/// channel through a padded copy in the stride's phases
/// (`differential::strided_depthwise_convolutions_read_a_copy_in_phases`),
/// agree with the graph interpreter.
#[test]
fn strided_depthwise_convolutions_agree() {
    jit_agrees(dlc_tests::STRIDED_DEPTHWISE_PROGRAMS);
}

/// A strided depthwise convolution's phases hold their rows in whole
/// vectors (`graph_to_loop`'s `phase_buffer`), so that a window's row whose
/// width is not a whole number of vectors (5 x 5 at stride 2 into 28
/// columns: rows of 30 and 29) loads its last vector whole, not as LLVM's
/// pieces of 8, 4, 2 and 1 (each tap then rebuilt from them by shuffles).
/// It agrees with the graph interpreter.
#[test]
fn strided_depthwise_rows_load_whole_vectors() {
    let src = "fn f(x: f32[1, 3, 56, 56], w: f32[3, 1, 5, 5]) -> f32[1, 3, 28, 28] { let h = conv2d(x, w, stride=2, padding=2, groups=3); return h * sigmoid(h); }";
    for (target, _, ir) in x86_ir(src) {
        let lanes = target.lanes(dlc_core::DType::F32);
        for row in [30, 29] {
            let piece = format!("load <{} x float>", row % lanes);
            assert!(!ir.contains(&piece), "{}: {piece}\n{ir}", target.name);
        }
        let whole = format!("load <{lanes} x float>");
        assert!(ir.contains(&whole), "{}: {ir}", target.name);
    }
    jit_agrees(src);
}

/// A row by a matrix whose chunks of columns are one tile each
/// (`differential::a_chunk_of_columns_is_one_tile`) agrees with the graph
/// interpreter.
#[test]
fn a_chunk_of_columns_as_one_tile_agrees() {
    jit_agrees(dlc_tests::ROW_BY_MATRIX_IN_CHUNKS);
}

/// Shallow products, which walk each strip across their panels
/// (`differential::shallow_products_walk_each_strip_across_their_panels`),
/// and a deeper one agree with the graph interpreter.
#[test]
fn shallow_products_agree() {
    jit_agrees(dlc_tests::SHALLOW_PRODUCT_PROGRAMS);
}

/// Products with the output channels as rows whose SiLU epilogue runs on
/// whole register tiles where the CPU has no mask registers
/// (`differential::long_epilogues_of_channel_row_products_run_on_register_tiles`),
/// and a ReLU6 one row by row, agree with the graph interpreter.
#[test]
fn channel_row_products_agree() {
    jit_agrees(dlc_tests::CHANNEL_ROW_PRODUCTS);
}

/// Products with the pixels as rows store their result `[channels,
/// pixels]`, along the register tile's rows: on AVX2, which has no scatter
/// instruction (and whose gathers Zen runs lane by lane), the tile's
/// columns are transposed in registers
/// and stored (and the residual read) as runs of its rows, not scattered
/// and gathered lane by lane; the last strip's one-row tile (49 pixels)
/// stores each lane with a plain store where every lane is on, scattering
/// only in the branch of a partial mask. So does Zen 4, which has the
/// instructions but runs them slowly: its `6 x 32` tiles are stored and
/// their residual read as runs of 6, masked runs where the block's mask
/// may cut them (no gather; only the one-row tile scatters, its two
/// vectors: its masked `6 x 32` stores were twelve scatters).
/// AVX-512 with 14-row tiles, its epilogue row by row, keeps its scatters.
/// They agree with the graph interpreter.
#[test]
fn pixel_row_products_store_runs_of_their_rows_without_scatters() {
    let src = dlc_tests::PIXEL_ROW_PRODUCTS;
    let zen4 = llvm_ir(src, &TargetDesc::for_cpu("znver4").expect("a known CPU"));
    assert!(!zen4.contains("@llvm.masked.gather"), "{zen4}");
    assert!(zen4.contains("store <6 x float>"), "{zen4}");
    assert!(zen4.contains("@llvm.masked.load.v6f32"), "{zen4}");
    assert!(zen4.contains("@llvm.masked.store.v6f32"), "{zen4}");
    let scatters = zen4
        .lines()
        .filter(|l| l.contains("call ") && l.contains("@llvm.masked.scatter"))
        .count();
    assert!(scatters <= 2, "{scatters} scatters: {zen4}");
    for (target, avx2, ir) in x86_ir(src) {
        if !avx2 {
            assert!(ir.contains("@llvm.masked.scatter"), "{}: {ir}", target.name);
        } else {
            assert!(!ir.contains("@llvm.masked.gather"), "{}: {ir}", target.name);
            for block in blocks_calling(&ir, "@llvm.masked.scatter") {
                assert!(
                    block.starts_with("store.part"),
                    "{}: a scatter in {block}: {ir}",
                    target.name
                );
            }
            let mr = target.gemm_blocking(dlc_core::DType::F32).mr;
            let run = format!("store <{mr} x float>");
            assert!(ir.contains(&run), "{}: {ir}", target.name);
            assert!(ir.contains("store float"), "{}: {ir}", target.name);
        }
    }
    jit_agrees(src);
}

/// A packed panel of weights prefetched a slice of the depth ahead goes to
/// the L2 (`llvm.prefetch`'s locality 2, `prefetcht1`), the strips of a
/// convolution's kernel one strip ahead to the L1 (locality 3); both
/// agree with the graph interpreter.
#[test]
fn weight_panels_are_prefetched_into_the_l2_and_strips_into_the_l1() {
    let panels = "fn f(x: f32[40, 600], weight w: f32[600, 64]) -> f32[40, 64] { return x @ w; }";
    let strips = "fn f(x: f32[1, 96, 7, 7], weight w: f32[40, 96, 1, 1]) -> f32[1, 40, 7, 7] { return relu(conv2d(x, w)); }";
    let locality = |ir: &str, l: u32| {
        ir.lines()
            .filter(|line| {
                line.contains("call void @llvm.prefetch")
                    && line.ends_with(&format!("i32 0, i32 {l}, i32 1)"))
            })
            .count()
    };
    let target = TargetDesc::x86_64_avx512(2);
    let ir = llvm_ir(panels, &target);
    assert!(locality(&ir, 2) > 0 && locality(&ir, 3) == 0, "{ir}");
    let ir = llvm_ir(strips, &target);
    assert!(locality(&ir, 3) > 0 && locality(&ir, 2) == 0, "{ir}");
    jit_agrees(panels);
    jit_agrees(strips);
}

/// A `tile.prefetch` whose tile has rows at one address (along an axis
/// its index does not move with: a vector along a product's rows, its
/// `[32, 1]` tile as a tile of its columns would be) fetches that line
/// once, not once per row; rows that do move get a line each.
#[test]
fn prefetches_of_rows_at_one_address_are_one() {
    let text = |index: &str| {
        format!(
            "tile.func @f(%b: buffer<f32[64, 1]>, out %y: buffer<f32[64, 1]>) {{
  tile.kernel {{grid = [1], schedule = \"rows\", vector = [1]}} {{
    tile.prefetch %b[{index}, 0] {{shape = [32, 1]}}
    %v = tile.load %b[#0, #1] : tile<64x1xf32>
    tile.store %v, %y[#0, #1]
  }}
  tile.return
}}"
        )
    };
    let prefetches = |index: &str| {
        let m = dlc_tile::parse_module(&text(index)).unwrap();
        let target = TargetDesc::x86_64_avx512(2);
        let ir = dlc_llvm::emit_llvm_ir(&m, &dlc_runtime::abi::Symbols::for_module("t"), &target)
            .unwrap();
        ir.matches("call void @llvm.prefetch").count()
    };
    assert_eq!(prefetches("16"), 1);
    assert_eq!(prefetches("16 + #0"), 32);
}

/// The labels of the basic blocks of LLVM IR text `ir` in which a line
/// holds `call`.
fn blocks_calling<'s>(ir: &'s str, call: &str) -> Vec<&'s str> {
    let mut block = "";
    let mut found = Vec::new();
    for line in ir.lines() {
        if let Some((label, _)) = line.split_once(':')
            && !line.starts_with(' ')
            && !label.is_empty()
            && !label.contains(' ')
        {
            block = label;
        }
        if line.contains("call ") && line.contains(call) {
            found.push(block);
        }
    }
    found
}

/// Compiles `src` to LLVM IR for AVX2 and for AVX-512: both hold `always`,
/// and only AVX2's (no mask registers) holds `marker`; then `src` agrees
/// with the graph interpreter.
#[track_caller]
fn without_mask_registers_only(src: &str, always: &str, marker: &str) {
    for (target, avx2, ir) in x86_ir(src) {
        assert!(ir.contains(always), "{}: {ir}", target.name);
        assert_eq!(ir.contains(marker), avx2, "{}: {ir}", target.name);
    }
    jit_agrees(src);
}

/// `src`'s LLVM IR for AVX2 (`true`: no mask registers) and for AVX-512.
fn x86_ir(src: &str) -> [(TargetDesc, bool, String); 2] {
    [
        (TargetDesc::x86_64_avx2(2), true),
        (TargetDesc::x86_64_avx512(2), false),
    ]
    .map(|(target, avx2)| {
        let ir = llvm_ir(src, &target);
        (target, avx2, ir)
    })
}

/// `src`'s LLVM IR for `target`.
fn llvm_ir(src: &str, target: &TargetDesc) -> String {
    let tiles = dlc_driver::lower_for_tile(&graph(src), target).unwrap();
    dlc_llvm::emit_llvm_ir(&tiles, &dlc_runtime::abi::Symbols::for_module("t"), target).unwrap()
}

/// A Winograd convolution cut into chunks of its output channels (the
/// host's schedule with its L2 shrunk to 1 KB and its L3 and memory slowed
/// to a byte a cycle, so that the transformed kernel is read from beyond
/// the L2 slower than any block's products, whatever the host: programs
/// along a third grid axis, each
/// transforming its rows' input, multiplying by its panels and running
/// the output transform of its channels) compiles and agrees with the
/// graph interpreter.
#[test]
fn winograd_chunks_of_channels_compile() {
    let src = "fn f(x: f32[1, 48, 8, 8], w: f32[96, 48, 3, 3]) -> f32[1, 96, 8, 8] { return conv2d(x, w, padding=1); }";
    let m = graph(src);
    let host = TargetDesc::host();
    let loops = dlc_driver::lower_to_loops(&m, host).unwrap();
    let mut params = dlc_lower::ScheduleParams::for_target(host);
    if let Some(p) = params.packed.as_mut() {
        p.l2_bytes = 1024;
    }
    if let dlc_core::target::TargetKind::Cpu(c) = &mut params.target.kind {
        c.l3_bytes_per_cycle = 1;
        c.memory_bytes_per_cycle = 1;
    }
    let tiles = dlc_lower::convert_module_with(&loops, &params).unwrap();
    let text = dlc_tile::print_module(&tiles);
    let kernel = text.lines().find(|l| l.contains("schedule = \"winograd\""));
    assert!(
        kernel.is_some_and(|l| l.contains("grid = [1, 1, ")),
        "{}: {text}",
        host.name
    );
    let f = m.entry_points().next().unwrap();
    let inputs = prepare_inputs(f, &[], Some(5)).unwrap();
    let want = interpret(&m, f, &inputs).unwrap();
    let got = dlc_llvm::jit(&tiles, |jit| Ok(jit.kernel("f")?.call(&inputs)))
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let err = max_relative_error(&got, &want).unwrap();
    assert!(err <= TOLERANCE, "relative error {err:.3e}\n{text}");
}

/// A load of a row of 7 lanes is one load of 8, the last lane dropped,
/// where the 8th element is inside the buffer for every row (rows of 8: a
/// strided depthwise convolution's phases into a 7 x 7 image); LLVM splits
/// a 7-lane load into loads of 4, 2 and 1. One whose 8th element would be
/// past its row (a row of 7 read from its second element) keeps its lanes.
/// Both agree with the graph interpreter.
#[test]
fn odd_loads_read_a_whole_vector_where_it_is_inside() {
    let cases = [
        (
            "op take[M](x: f32[M, 8]) -> f32[M, 7] { out[i, j] = x[i, j] * 2.0 + x[i, j + 1]; }
fn f(x: f32[8, 8]) -> f32[8, 7] { return take(x); }",
            "load <8 x float>",
            "load <7 x float>",
        ),
        (
            "op take[M](x: f32[M, 7]) -> f32[M, 6] { out[i, j] = x[i, j + 1] * 2.0; }
fn f(x: f32[8, 7]) -> f32[8, 6] { return take(x); }",
            "load <6 x float>",
            "load <8 x float>",
        ),
    ];
    for (src, present, absent) in cases {
        for (target, _, ir) in x86_ir(src) {
            assert!(
                ir.contains(present) && !ir.contains(absent),
                "{}: {src}\n{ir}",
                target.name
            );
        }
        jit_agrees(src);
    }
}

/// A `tile.mask` whose limits the loop counters' and program ids' ranges
/// keep at or past the tile's extent everywhere (a product over whole
/// register tiles, packing and epilogue) is constants all on: its loads and
/// stores are plain ones, no compares and no masked intrinsics; a ragged
/// product keeps its masked edge. Both agree with the graph interpreter.
#[test]
fn masks_proven_on_everywhere_are_plain_accesses() {
    // 84 rows: whole tiles of AVX2's 4 rows and AVX-512's 14 (6 on Zen 4).
    let whole = "fn f(x: f32[84, 48], w: f32[48, 64]) -> f32[84, 64] { return relu(x @ w); }";
    let ragged = "fn f(x: f32[60, 48], w: f32[48, 60]) -> f32[60, 60] { return relu(x @ w); }";
    for (target, _, ir) in x86_ir(whole) {
        assert!(
            ir.contains("fmul") || ir.contains("fma"),
            "{}: {ir}",
            target.name
        );
        assert!(!ir.contains("@llvm.masked."), "{}: {ir}", target.name);
    }
    for (target, _, ir) in x86_ir(ragged) {
        assert!(ir.contains("@llvm.masked.store"), "{}: {ir}", target.name);
    }
    jit_agrees(whole);
    jit_agrees(ragged);
}

/// Products that prefetch their next panel (`tile.prefetch`: the host's
/// schedule with its L2 shrunk to 64 KB, so that it does on any CPU; the
/// last program's prefetches reach past the input's end), and their
/// register tiles' epilogues the result's lines two panels ahead (past the
/// output's end at the last panels), compile to `llvm.prefetch` and agree
/// with the graph interpreter.
#[test]
fn prefetching_products_compile_and_agree() {
    let host = TargetDesc::host();
    let ir = dlc_llvm::emit_llvm_ir(
        &dlc_driver::lower_for_tile(
            &graph(dlc_tests::PREFETCHED_PRODUCT_PROGRAMS),
            &TargetDesc::x86_64_avx2(2),
        )
        .unwrap(),
        &dlc_runtime::abi::Symbols::for_module("t"),
        &TargetDesc::x86_64_avx2(2),
    )
    .unwrap();
    assert!(ir.contains("@llvm.prefetch"), "{ir}");
    let m = graph(dlc_tests::PREFETCHED_PRODUCT_PROGRAMS);
    let loops = dlc_driver::lower_to_loops(&m, host).unwrap();
    let mut params = dlc_lower::ScheduleParams::for_target(host);
    if let Some(p) = params.packed.as_mut() {
        p.l2_bytes = 64 << 10;
    }
    let tiles = dlc_lower::convert_module_with(&loops, &params).unwrap();
    let text = dlc_tile::print_module(&tiles);
    // The input's panels (`%0`, a view of `%x`) and the result (`%2`, of
    // `%out0`): one epilogue per register tile's code, whole strips' and
    // the last strip's (`p40`'s 6 rows and `p16`'s 8 in strips of the
    // host's `mr`: 4 + 2 and 4 + 4 with AVX2's 4, 6 and 6 + 2 with 6, one
    // tile each with 14).
    let mr = host.gemm_blocking(dlc_core::DType::F32).mr;
    let tiles_code = |rows: usize| {
        if rows <= mr || rows.is_multiple_of(mr) {
            1
        } else {
            2
        }
    };
    assert_eq!(text.matches("tile.prefetch %0[").count(), 2, "{text}");
    assert_eq!(
        text.matches("tile.prefetch %2[").count(),
        tiles_code(6) + tiles_code(8),
        "{text}"
    );
    for (seed, f) in m.entry_points().enumerate() {
        let inputs = prepare_inputs(f, &[], Some(seed as u64)).unwrap();
        let want = interpret(&m, f, &inputs).unwrap();
        let got = dlc_llvm::jit(&tiles, |jit| Ok(jit.kernel(&f.name)?.call(&inputs)))
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        let err = max_relative_error(&got, &want).unwrap();
        assert!(
            err <= TOLERANCE,
            "@{}: relative error {err:.3e}\n{text}",
            f.name
        );
    }
}

/// A load whose lanes are 2 to 4 elements apart (a stride-2 window) is one
/// wide masked load of the elements its lanes span, only theirs enabled,
/// and a shuffle; 5 apart, a gather. Both agree with the graph
/// interpreter, a padded strided window (zero outside) included.
#[test]
fn strided_lanes_are_deinterleaved_from_one_load() {
    let every = "op every[M, N](x: f32[M, N]) -> f32[M, 20] { out[i, j] = x[i, 2 * j + 1] + x[i, 3 * j] * 2.0 - x[i, 5 * j + 4]; }
fn f(x: f32[6, 100]) -> f32[6, 20] { return every(x); }";
    let window = "op window[N, C](x: f32[N, C, 9, 70]) -> f32[N, C, 3, 9, 35] { out[n, c, k, y, xx] = x[n, c, y + k - 1, 2 * xx + k - 1]; }
fn f(x: f32[2, 3, 9, 70]) -> f32[2, 3, 3, 9, 35] { return window(x); }";
    for target in [TargetDesc::x86_64_avx512(2), TargetDesc::x86_64_avx2(2)] {
        let ir = |src: &str| {
            let tiles = dlc_driver::lower_for_tile(&graph(src), &target).unwrap();
            dlc_llvm::emit_llvm_ir(&tiles, &dlc_runtime::abi::Symbols::for_module("t"), &target)
                .unwrap()
        };
        let (e, w) = (ir(every), ir(window));
        for text in [&e, &w] {
            assert!(text.contains("%deinterleave"), "{}: {text}", target.name);
        }
        assert!(e.contains("@llvm.masked.gather"), "{}: {e}", target.name);
        assert!(!w.contains("@llvm.masked.gather"), "{}: {w}", target.name);
    }
    jit_agrees(every);
    jit_agrees(window);
    // Five lanes (a 9 x 9 image at stride 2): their padded mask spread to
    // ten lanes was miscompiled as a `<5 x i1>` shuffle on AVX2.
    jit_agrees(
        "fn f(x: f32[2, 4, 9, 9], w: f32[8, 4, 3, 3]) -> f32[2, 8, 5, 5] { return conv2d(x, w, stride=2, padding=1); }",
    );
}

/// A load of lanes two apart with every lane on (the unpadded middle of a
/// stride-2 depthwise convolution on AVX2, which runs it apart from its
/// borders: 64 columns, two whole row tiles, so no mask) is two plain
/// loads overlapping in one element, the second ending at the last lane's
/// element (`%even.hi`), and one shuffle: no masked load of the span.
/// Where its loads are padded (AVX-512's one nest), the masked load stays.
/// It agrees with the graph interpreter.
#[test]
fn stride_two_loads_with_every_lane_on_are_plain() {
    let src = "fn f(x: f32[1, 3, 6, 160], w: f32[3, 1, 3, 3]) -> f32[1, 3, 3, 80] { return conv2d(x, w, stride=2, padding=1, groups=3); }";
    without_mask_registers_only(src, "%deinterleave", "%even.hi");
}

/// A bf16 product scheduled for a CPU with AVX-512 BF16 (`znver4`) runs
/// its register tile as `vdpbf16ps` dot products of pairs, reading its
/// panels' pairs as they lie (interleaved when packed: no shuffle in the
/// loop); for one without (`x86-64-v4`), as f32 multiply-adds of widened
/// operands. Compiled and run here, it agrees with the graph interpreter
/// either way (in pairs on a CPU that has them, as this machine's
/// `native`).
#[test]
fn bf16_products_run_as_dot_products_of_pairs() {
    let src = "fn f(a: bf16[64, 96], b: bf16[96, 80], c: bf16[80]) -> bf16[64, 80] { return relu(a @ b + c); }";
    let symbols = dlc_runtime::abi::Symbols::for_module("t");
    let tiles = |cpu: &str| {
        let target = TargetDesc::for_cpu(cpu).unwrap();
        (
            dlc_driver::lower_for_tile(&graph(src), &target).unwrap(),
            target,
        )
    };
    let ir = |cpu: &str| {
        let (tiles, target) = tiles(cpu);
        dlc_llvm::emit_llvm_ir(&tiles, &symbols, &target).unwrap()
    };
    let dot = "@llvm.x86.avx512bf16.dpbf16ps.512";
    assert!(ir("znver4").contains(dot));
    assert!(!ir("x86-64-v4").contains(dot));
    let (t, target) = tiles("znver4");
    let asm = dlc_llvm::emit_native(&t, false, &symbols, &target).unwrap();
    let asm = String::from_utf8(asm).unwrap();
    // The basic blocks of the register tile: between labels, with the dot.
    let blocks: Vec<&str> = asm.split(':').filter(|b| b.contains("vdpbf16ps")).collect();
    assert!(!blocks.is_empty(), "{asm}");
    for b in blocks {
        for shuffle in ["vperm", "vpunpck", "vpshuf", "vshuf", "vpalignr"] {
            assert!(!b.contains(shuffle), "{shuffle} in the register tile:\n{b}");
        }
    }
    jit_passes_check(src);
}

/// A host function launching many kernels is a frame and one call per
/// launch: the thread pool is entered through the module's one helper, and
/// every failed launch leaves through one block (W7's step launches 1,107
/// kernels: 36,000 instructions when each launch carried its own). The
/// helper enters the pool only where the runtime may run more than one
/// thread: at one, `GOMP_parallel`'s team of one cost 0.7 us a launch.
/// (It fills the claim words first, on either path.)
#[test]
fn kernel_launches_share_one_helper_and_one_failure_block() {
    let m = graph(
        "fn f(a: f32[256, 256], b: f32[256, 256]) -> (f32[256, 256], f32[256, 256], f32[256]) {
            let c = tanh(a @ b);
            return (c, softmax(c, axis=1) @ b, sum(exp(c), axis=1));
        }",
    );
    let ir = dlc_llvm::emit_llvm_ir(
        &dlc_driver::lower_for_cpu(&m).unwrap(),
        &dlc_runtime::abi::Symbols::for_module("model"),
        &TargetDesc::x86_64_avx512(2),
    )
    .unwrap();
    let body = |define: &str| -> Vec<&str> {
        ir.lines()
            .skip_while(|l| !(l.starts_with("define ") && l.contains(define)))
            .take_while(|l| *l != "}")
            .collect()
    };
    let host = body(" i32 @dlc_model_f(ptr");
    let calls = |f: &[&str], callee: &str| {
        f.iter()
            .filter(|l| l.contains(&format!("@{callee}(")))
            .count()
    };
    let launches = calls(&host, "dlc.parallel");
    assert!(launches >= 3, "{launches} launches:\n{}", host.join("\n"));
    assert_eq!(calls(&host, "GOMP_parallel"), 0, "{}", host.join("\n"));
    let failure_blocks = host
        .iter()
        .filter(|l| l.starts_with("threads.failed"))
        .count();
    assert_eq!(failure_blocks, 1, "{}", host.join("\n"));
    let helper = body("@dlc.parallel(");
    assert_eq!(calls(&helper, "GOMP_parallel"), 1, "{ir}");
    assert_eq!(calls(&helper, "omp_get_max_threads"), 1, "{ir}");
    let many = helper
        .iter()
        .find(|l| l.contains("icmp sgt i32 %max_threads, 1"))
        .and_then(|l| l.split_whitespace().next());
    // The branch to the pool is on `many`, or on a phi of it (after the
    // claim words are filled) that is false where the runtime is not linked.
    let cond = helper
        .iter()
        .find(|l| l.contains(", label %pool, label %alone"))
        .and_then(|l| l.split_whitespace().nth(2))
        .map(|c| c.trim_end_matches(','));
    let on_many = match (many, cond) {
        (Some(m), Some(c)) if m == c => true,
        (Some(m), Some(c)) => helper.iter().any(|l| {
            l.trim_start().starts_with(&format!("{c} = phi i1"))
                && l.contains(&format!("[ {m}, %linked ]"))
                && l.contains("[ false, %entry ]")
        }),
        _ => false,
    };
    assert!(on_many, "{}", helper.join("\n"));
    jit_passes_check(
        "fn f(a: f32[256, 256], b: f32[256, 256]) -> (f32[256, 256], f32[256, 256], f32[256]) {
            let c = tanh(a @ b);
            return (c, softmax(c, axis=1) @ b, sum(exp(c), axis=1));
        }",
    );
}

/// A product's edge block reads rows past its operand's last row with
/// every lane masked off; their addresses lie beyond the allocation (rows
/// 32-35 of a `[32, 8192]` operand start 1 MB past it), where a masked
/// access still costs Zen 4 a microcode assist when the page is not
/// mapped. Each such row's accesses address the buffer's start instead:
/// the pointer of every masked load that can be all off is a `select` on
/// its row being inside the operand.
#[test]
fn masked_rows_past_an_operands_end_address_the_operand() {
    let src =
        "fn f(a: f32[32, 8192], b: f32[32, 8192]) -> f32[32, 32] { return a @ transpose(b); }";
    let m = graph(src);
    // Scheduled and compiled for AVX-512 whatever the host: 6-row strips
    // of 16-lane vectors.
    let target = TargetDesc::x86_64_avx512(2);
    let ir = dlc_llvm::emit_llvm_ir(
        &dlc_driver::lower_for_tile(&m, &target).unwrap(),
        &dlc_runtime::abi::Symbols::for_module("model"),
        &target,
    )
    .unwrap();
    let definition = |name: &str| {
        ir.lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} = ")))
            .unwrap_or("")
    };
    let pointers: Vec<&str> = ir
        .lines()
        .filter(|l| l.contains("call <16 x float> @llvm.masked.load"))
        .filter_map(|l| l.split("(ptr ").nth(1)?.split(',').next())
        .collect();
    let selected = pointers
        .iter()
        .filter(|p| definition(p).contains(" = select i1 "))
        .count();
    // The strip's six rows: the first two are inside for every strip
    // (LLVM proves it), the other four can be past row 31.
    assert!(
        selected >= 4,
        "{selected} of {} masked loads select their address:\n{ir}",
        pointers.len()
    );
    jit_passes_check(src);
}

#[test]
fn emits_llvm_ir_for_the_host() {
    let m = graph("fn f(x: f32[64], y: f32[64]) -> f32[64] { return x * y + 1.0; }");
    let symbols = dlc_runtime::abi::Symbols::for_module("model");
    let ir = dlc_llvm::emit_llvm_ir(
        &dlc_driver::lower_for_cpu(&m).unwrap(),
        &symbols,
        TargetDesc::host(),
    )
    .unwrap();
    assert!(ir.contains(" i32 @dlc_model_f(ptr"), "{ir}");
    assert!(ir.contains(" i32 @dlc_model_f.entry(ptr"), "{ir}");
    assert!(ir.contains("\"target-cpu\""), "{ir}");
    // The host function, which only orchestrates, is compiled as written;
    // its kernels are optimized.
    let attributes_of = |define: &str| -> String {
        let line = ir
            .lines()
            .find(|l| l.starts_with("define ") && l.contains(define))
            .unwrap_or_else(|| panic!("no {define} in {ir}"));
        let group = line
            .split_whitespace()
            .find(|w| w.starts_with('#'))
            .unwrap_or_else(|| panic!("no attributes on {line}"));
        ir.lines()
            .find(|l| l.starts_with(&format!("attributes {group} ")))
            .unwrap_or_else(|| panic!("no attributes {group}"))
            .to_string()
    };
    assert!(attributes_of(" i32 @dlc_model_f(ptr").contains("optnone"));
    assert!(!attributes_of(" void @f.").contains("optnone"));
    // Nothing but the entry points, their wrappers and signatures is
    // exported: helpers are private, the bf16 fallback weak and hidden, and
    // kernels internal (local symbols, so that a profile of a compiled
    // library names them).
    for line in ir.lines().filter(|l| l.starts_with("define ")) {
        assert!(
            line.contains("@dlc_model_f")
                || line.contains(" private ")
                || line.contains(" internal ")
                || line.contains(" hidden "),
            "{line}"
        );
    }
    let kernel = ir
        .lines()
        .find(|l| l.starts_with("define ") && l.contains(" void @f."));
    assert!(kernel.is_some_and(|l| l.contains(" internal ")), "{ir}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn generated_programs_agree(choices in prop::collection::vec(any::<u32>(), 1..10), tuple in any::<bool>()) {
        jit_agrees(&dlc_tests::generated_program(&choices, tuple));
    }

    /// The same at sizes where products become packed `loop.matmul`s (with
    /// whatever epilogue the program puts after them) and loops run on threads.
    #[test]
    fn large_generated_programs_agree(choices in prop::collection::vec(any::<u32>(), 1..10), tuple in any::<bool>()) {
        jit_agrees(&dlc_tests::generated_program_sized(&choices, tuple, 80, 96));
    }
}

/// `f`'s results, jitted from `tiles`, on `inputs` with each of `threads`
/// threads in turn.
fn results_on_threads(
    tiles: &dlc_tile::Module,
    inputs: &[HostTensor],
    threads: &[usize],
) -> Vec<Vec<HostTensor>> {
    dlc_llvm::jit(tiles, |jit| {
        let k = jit.kernel("f")?;
        let mut results = vec![];
        for &n in threads {
            dlc_runtime::set_num_threads(n).unwrap();
            results.push(k.call(inputs).unwrap());
        }
        Ok(results)
    })
    .unwrap()
}

/// A call after the thread count grew needs more scratch regions than the
/// workspace the previous call handed back holds: it takes a larger one and
/// computes the same result.
#[test]
fn the_workspace_grows_with_the_thread_count() {
    let m = graph(
        "fn f(x: f32[96, 80], w: f32[80, 200], b: f32[200]) -> f32[96, 200] { return relu(x @ w + b); }",
    );
    let f = m.entry_points().next().unwrap();
    let inputs = prepare_inputs(f, &[], Some(3)).unwrap();
    let want = interpret(&m, f, &inputs).unwrap();
    let tiles = dlc_driver::lower_for_cpu(&m).unwrap();
    let results = results_on_threads(&tiles, &inputs, &[1, 4, 2]);
    for got in &results {
        let err = max_relative_error(got, &want).unwrap();
        assert!(err <= TOLERANCE, "relative error {err:.3e}");
    }
    assert_eq!(results[0][0].data, results[1][0].data);
    assert_eq!(results[0][0].data, results[2][0].data);
}

/// A preparer frees its workspace when it returns, where an entry point
/// keeps its own for the next call: a preparer runs once per binding, and
/// its intermediates (here two Winograd weight transforms, one after the
/// other) would otherwise hold their memory for the process.
#[test]
fn a_preparer_frees_its_workspace() {
    let src = dlc_tests::WINOGRAD_PROGRAMS[3];
    let tiles = dlc_driver::lower_for_cpu(&graph(src)).unwrap();
    let ir = dlc_llvm::emit_llvm_ir(
        &tiles,
        &dlc_runtime::abi::Symbols::for_module("t"),
        &TargetDesc::x86_64_avx2(2),
    )
    .unwrap();
    // Each takes the cached workspace (exchanging in 0); only the entry
    // point puts one back.
    let exchanges = |global: &str| -> Vec<bool> {
        ir.lines()
            .filter(|l| l.contains("atomicrmw xchg") && l.contains(&format!("@{global},")))
            .map(|l| l.contains(", i64 0 "))
            .collect()
    };
    assert_eq!(exchanges("dlc_t_f_prepare.workspace"), [true], "{ir}");
    let entry = exchanges("dlc_t_f.workspace");
    assert!(entry.contains(&true) && entry.contains(&false), "{ir}");
    jit_agrees(src);
}

/// A kernel heavy enough that its threads claim its programs from a word
/// each (`TargetDesc::min_claim_work`: 256 x 384 x 256 multiply-adds here)
/// computes the same on 1 to 5 threads, to the bit (each program sums in
/// the same order whichever thread runs it), as the graph interpreter does.
#[test]
fn a_heavy_kernels_claimed_programs_agree_on_every_thread_count() {
    let m =
        graph("fn f(x: f32[256, 384], w: f32[384, 256]) -> f32[256, 256] { return relu(x @ w); }");
    let f = m.entry_points().next().unwrap();
    let inputs = prepare_inputs(f, &[], Some(5)).unwrap();
    let want = interpret(&m, f, &inputs).unwrap();
    let tiles = dlc_driver::lower_for_cpu(&m).unwrap();
    let ir = dlc_llvm::emit_llvm_ir(
        &tiles,
        &dlc_runtime::abi::Symbols::for_module("t"),
        TargetDesc::host(),
    )
    .unwrap();
    // The claims' compare-exchange (a prepared weight's is acq_rel).
    assert!(
        ir.lines()
            .any(|l| l.contains("cmpxchg") && l.contains("monotonic monotonic")),
        "no claimed kernel:\n{ir}"
    );
    let results = results_on_threads(&tiles, &inputs, &[1, 2, 3, 5]);
    for got in &results {
        let err = max_relative_error(got, &want).unwrap();
        assert!(err <= TOLERANCE, "relative error {err:.3e}");
        assert_eq!(got[0].data, results[0][0].data);
    }
}

#[test]
fn dense_constants_are_global_data_of_every_type() {
    // A weight matrix large enough for a packed product read from a global.
    let w: Vec<String> = (0..64 * 48)
        .map(|i| format!("{:.4}", ((i * 37 % 101) as f64 - 50.0) / 97.0))
        .collect();
    jit_agrees(&format!(
        "fn f(x: f32[8, 64], h: f16[3], b: bf16[3], i: i32[3], l: i64[2, 3], c: bool[3])
            -> (f32[8, 48], f16[3], bf16[3], i32[3], i64[2, 3], bool[3]) {{
            return (x @ tensor([{}], [64, 48]) + tensor([0.5], []),
                    h * tensor([0.1, -2.5, 3.0], [3], dtype=f16),
                    b + tensor([1.0, 2.0, -0.0078125], [3], dtype=bf16),
                    i * tensor([7, -3, 2147483647], [3], dtype=i32),
                    l + tensor([1, -2, 3, 4000000000, 5, -6], [2, 3]),
                    where(c, tensor([true, false, true], [3]), tensor([false, true, true], [3])));
        }}",
        w.join(", ")
    ));
}

/// What [`through_a_cache`] gives: the cache's directory, a call that
/// compiles and runs (giving parts, parts cached, results), and the
/// interpreter's results.
type CachedRun<F> = (std::path::PathBuf, F, Vec<HostTensor>);

/// An empty object cache in a fresh directory named after `name`, and
/// `m`'s entry `f` compiled through it on seeded inputs.
fn through_a_cache(
    name: &str,
    m: &dlc_graph::Module,
) -> CachedRun<impl Fn() -> ((usize, usize), Vec<HostTensor>) + use<>> {
    let dir = std::env::temp_dir().join(format!("dlc-jit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = dlc_llvm::JitOptions {
        cache: Some(dlc_llvm::ObjectCache::new(
            &dir,
            dlc_llvm::DEFAULT_MAX_BYTES,
        )),
        profile: false,
    };
    let tiles = dlc_driver::lower_for_cpu(m).unwrap();
    let f = m.entry_points().next().unwrap();
    let inputs = prepare_inputs(f, &[], Some(0)).unwrap();
    let want = interpret(m, f, &inputs).unwrap();
    let run = move || {
        dlc_llvm::jit_with(&tiles, &options, |jit| {
            Ok((jit.parts(), jit.kernel("f")?.call(&inputs).unwrap()))
        })
        .unwrap()
    };
    (dir, run, want)
}

/// A second compile of an unchanged module takes every part's object from
/// the cache and computes the same results; a damaged entry is compiled
/// again; a different module shares nothing it does not have in common.
#[test]
fn compiled_objects_come_from_the_cache_the_second_time() {
    let src = "fn f(x: f32[64, 96], weight w: f32[96, 96], b: f32[96]) -> f32[64, 96] { return softmax(tanh(x @ w + b), axis=-1) * 2.0; }";
    let (dir, run, want) = through_a_cache("cache", &graph(src));
    let ((parts, cached), first) = run();
    assert!(parts >= 1);
    assert_eq!(cached, 0, "an empty cache has nothing");
    let entries = || std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(entries(), parts, "one entry per part");
    let ((again, cached), second) = run();
    assert_eq!((again, cached), (parts, parts));
    for got in [&first, &second] {
        let err = max_relative_error(got, &want).unwrap();
        assert!(err <= TOLERANCE, "relative error {err:.3e}");
    }
    // Damage every entry: each is compiled again (and stored again).
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
    }
    let ((_, cached), third) = run();
    assert_eq!(cached, 0, "damaged entries are not used");
    assert!(max_relative_error(&third, &want).unwrap() <= TOLERANCE);
    assert_eq!(run().0, (parts, parts));
    // Another program: none of its parts is an entry of this one's.
    let other =
        graph("fn f(x: f32[64, 96], w: f32[96, 96]) -> f32[64, 96] { return relu(x @ w); }");
    let other = dlc_driver::lower_for_cpu(&other).unwrap();
    let options = dlc_llvm::JitOptions {
        cache: Some(dlc_llvm::ObjectCache::new(
            &dir,
            dlc_llvm::DEFAULT_MAX_BYTES,
        )),
        profile: false,
    };
    let (_, cached) = dlc_llvm::jit_with(&other, &options, |jit| Ok(jit.parts())).unwrap();
    assert_eq!(cached, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A compiled module stored as a program links from the cache alone and
/// computes the same results; another key, a module compiled without the
/// cache, a program whose object is gone and a damaged manifest are not
/// programs to load.
#[test]
fn whole_programs_link_from_the_cache() {
    let src = "fn f(x: f32[64, 96], weight w: f32[96, 96], b: f32[96]) -> f32[64, 96] { return softmax(tanh(x @ w + b), axis=-1) * 2.0; }\n\
               fn g(x: f32[3]) -> (f32[3], f32[3]) { return (x, x * 2.0); }";
    let m = graph(src);
    let dir = std::env::temp_dir().join(format!("dlc-jit-program-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dlc_llvm::ObjectCache::new(&dir, dlc_llvm::DEFAULT_MAX_BYTES);
    let tiles = dlc_driver::lower_for_cpu(&m).unwrap();
    let f = m.function("f").unwrap();
    let inputs = prepare_inputs(f, &[], Some(0)).unwrap();
    let want = interpret(&m, f, &inputs).unwrap();
    let key = dlc_llvm::ProgramKey::new(&[b"m.dl", src.as_bytes()]).unwrap();
    assert_eq!(
        key,
        dlc_llvm::ProgramKey::new(&[b"m.dl", src.as_bytes()]).unwrap()
    );
    let other = dlc_llvm::ProgramKey::new(&[b"m.dl", b"another text"]).unwrap();
    assert_ne!(key, other);
    assert!(
        dlc_llvm::Jit::load(&cache, &key).unwrap().is_none(),
        "an empty cache"
    );

    // Compiled without the cache, a module has no objects to name.
    let uncached = dlc_llvm::compile_in_process(&tiles, &dlc_llvm::JitOptions::default()).unwrap();
    assert!(!uncached.store(&cache, &key, "meta").unwrap());
    let options = dlc_llvm::JitOptions {
        cache: Some(cache.clone()),
        profile: false,
    };
    let compiled = dlc_llvm::compile_in_process(&tiles, &options).unwrap();
    assert!(compiled.store(&cache, &key, "the caller's\ntext").unwrap());
    let sig = compiled.signature("g").unwrap();
    drop(compiled);

    let (loaded, meta) = dlc_llvm::Jit::load(&cache, &key).unwrap().unwrap();
    assert_eq!(meta, "the caller's\ntext");
    let (parts, cached) = loaded.parts();
    assert_eq!(parts, cached);
    assert_eq!(loaded.signature("g").unwrap(), sig);
    let got = loaded.kernel("f").unwrap().call(&inputs).unwrap();
    let err = max_relative_error(&got, &want).unwrap();
    assert!(err <= TOLERANCE, "relative error {err:.3e}");
    assert!(dlc_llvm::Jit::load(&cache, &other).unwrap().is_none());

    let files = |ext: &str| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .collect()
    };
    // An object trimmed from the cache: not a program.
    let objects = files("o");
    let kept = std::fs::read(&objects[0]).unwrap();
    std::fs::remove_file(&objects[0]).unwrap();
    assert!(dlc_llvm::Jit::load(&cache, &key).unwrap().is_none());
    std::fs::write(&objects[0], kept).unwrap();
    assert!(dlc_llvm::Jit::load(&cache, &key).unwrap().is_some());
    // A damaged manifest: a miss, and gone.
    let manifest = files("program").pop().unwrap();
    let mut bytes = std::fs::read(&manifest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    std::fs::write(&manifest, bytes).unwrap();
    assert!(dlc_llvm::Jit::load(&cache, &key).unwrap().is_none());
    assert!(!manifest.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A part holding more constant data than `MAX_CACHED_CONSTANT_BYTES` (an
/// imported model's weights, bound as constants) is compiled every time;
/// the rest still come from the cache.
#[test]
fn parts_with_much_constant_data_skip_the_cache() {
    // 1.25M f32 weights: 5 MB of constants once bound.
    let (rows, cols) = (1250, 1000);
    assert!((rows * cols * 4) as u64 > dlc_llvm::MAX_CACHED_CONSTANT_BYTES);
    let src = format!(
        "fn f(x: f32[{cols}], weight w: f32[{rows}, {cols}]) -> f32[{rows}] {{ return sum(w * x, axis=1); }}"
    );
    let mut m = graph(&src);
    let values: Vec<f64> = (0..rows * cols).map(|i| ((i % 7) as f64) - 3.0).collect();
    m.functions[0].bind_param(1, values);
    let (dir, run, want) = through_a_cache("cache-data", &m);
    let ((parts, _), first) = run();
    let ((_, cached), second) = run();
    assert!(
        cached < parts,
        "{cached} of {parts} parts came from the cache"
    );
    for got in [&first, &second] {
        let err = max_relative_error(got, &want).unwrap();
        assert!(err <= TOLERANCE, "relative error {err:.3e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// User operators that are contractions (structured products, any
/// operand layout) in compiled code, each result within `--check`'s
/// tolerance for its type.
#[test]
fn user_contractions_in_compiled_code() {
    for src in dlc_tests::CONTRACTION_PROGRAMS {
        jit_passes_check(src);
    }
}

/// Compiled code agrees with the graph interpreter at `--check`'s
/// tolerance for each result's type.
fn jit_passes_check(src: &str) {
    let m = graph(src);
    for (seed, f) in m.entry_points().enumerate() {
        let inputs = prepare_inputs(f, &[], Some(seed as u64)).unwrap();
        let want = interpret(&m, f, &inputs).unwrap();
        let got = compiled(&m, f, &inputs);
        let tolerances = dlc_driver::check_tolerances(f);
        for c in dlc_driver::check_results(&got, &want, &tolerances).unwrap() {
            assert!(c.passed(), "@{}: {c}\n{src}", f.name);
        }
    }
}

/// Dense constants are lowered as weights and built back in
/// (`lower_for_cpu` is `dlc_driver::lower_for_code`): packing a constant
/// matrix, and a convolution's constant filters, move into a preparer of no
/// inputs whose results `tile.prepared` reads, computed by the first call
/// and kept for the process. Calls from several threads at once (all racing
/// to prepare), and the calls after, agree with the interpreter and with
/// one another.
#[test]
fn constants_are_prepared_once_per_process() {
    let values = |n: usize, scale: f64| -> String {
        (0..n)
            .map(|i| format!("{:.4}", ((i * 37 % 101) as f64 / 50.0 - 1.0) * scale))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let src = format!(
        "fn f(x: f32[24, 64], img: f32[1, 8, 10, 10]) -> (f32[24, 48], f32[1, 16, 10, 10]) {{ \
         let w = tensor([{}], [64, 48]); let k = tensor([{}], [16, 8, 3, 3]); \
         return (relu(x @ w + tensor([{}], [48])), conv2d(img, k, padding=1)); }}",
        values(64 * 48, 1.0),
        values(16 * 8 * 9, 0.5),
        values(48, 0.1)
    );
    let m = graph(&src);
    let tiles = dlc_driver::lower_for_cpu(&m).unwrap();
    let text = dlc_tile::print_module(&tiles);
    let f = tiles.functions.iter().find(|g| g.name == "f").unwrap();
    assert!(
        f.prepare.is_none() && f.params.len() == 4 && f.weights.is_empty(),
        "@f keeps the caller's signature:\n{text}"
    );
    let preparers: Vec<&str> = f
        .body
        .ops
        .iter()
        .filter_map(|&id| match &f.op(id).kind {
            dlc_tile::OpKind::Prepared { func, .. } => Some(func.as_str()),
            _ => None,
        })
        .collect();
    assert!(!preparers.is_empty(), "nothing is prepared:\n{text}");
    let p = tiles
        .functions
        .iter()
        .find(|g| g.name == preparers[0])
        .unwrap();
    assert!(
        p.inputs().is_empty() && p.outputs >= 1,
        "@{} takes no inputs:\n{text}",
        p.name
    );
    let g = dlc_driver::select_entry(&m, None).unwrap();
    let inputs = prepare_inputs(g, &[], Some(5)).unwrap();
    let want = interpret(&m, g, &inputs).unwrap();
    let bits = |ts: &[HostTensor]| -> Vec<Vec<u64>> {
        ts.iter()
            .map(|t| t.data.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    let runs: Vec<Vec<HostTensor>> = dlc_llvm::jit(&tiles, |jit| {
        let results = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let k = jit.kernel("f").unwrap();
                        [k.call(&inputs).unwrap(), k.call(&inputs).unwrap()]
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        Ok(results)
    })
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    for got in &runs {
        let err = max_relative_error(got, &want).unwrap();
        assert!(err <= TOLERANCE, "relative error {err:.3e}\n{text}");
        assert_eq!(bits(got), bits(&runs[0]), "calls differ");
    }
}

/// A preparer reading a declared weight and a constant: the constant is
/// built into it, the weight stays its input (and the caller's), so the
/// caller still runs it once per binding.
#[test]
fn a_preparer_of_weights_and_constants_keeps_the_weights() {
    let src = &mixed_preparer();
    let m = graph(src);
    let tiles = dlc_driver::lower_for_cpu(&m).unwrap();
    let text = dlc_tile::print_module(&tiles);
    let f = tiles.functions.iter().find(|g| g.name == "f").unwrap();
    let p = f
        .prepare
        .as_deref()
        .unwrap_or_else(|| panic!("no preparer:\n{text}"));
    let p = tiles.functions.iter().find(|g| g.name == p).unwrap();
    let inputs: Vec<&str> = p.inputs().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(inputs, ["w"], "{text}");
    assert!(text.contains("tile.global"), "{text}");
    jit_agrees(src);
}

/// A product by a declared weight whose columns a constant scales.
fn mixed_preparer() -> String {
    let scale: Vec<String> = (0..48)
        .map(|i| format!("{:.2}", f64::from(i % 7) / 4.0 - 0.5))
        .collect();
    format!(
        "fn f(x: f32[32, 64], weight w: f32[64, 48]) -> f32[32, 48] {{ \
         return x @ (w * tensor([{}], [48])); }}",
        scale.join(", ")
    )
}

/// `tile.slice` compiled agrees with the tile interpreter
/// ([`dlc_tests::SLICES_TILE_PROGRAM`]): at constant offsets and at offsets
/// known only at run time.
#[test]
fn slices_at_constant_and_run_time_offsets() {
    let (m, input, want) = dlc_tests::slices_case();
    let got = call(&m, "f", &[input]).unwrap();
    assert_eq!(got[0].data, want);
}

/// A depthwise convolution loads each row of its window once for the
/// row's taps (`tile.share-window-loads`), which take their columns with
/// shuffles: a 3 x 3 one over rows of 40 on AVX-512 reads 3 wide loads of
/// 42 columns (3 vectors each) per output row where it read 9 loads of 40
/// (27 vectors). (On AVX2 LLVM peels the rows' loop and splits the padded
/// loads whose masks became constants, so its count says less.) It agrees
/// with the graph interpreter, as does a 5 x 5 one over 7 x 7 planes (rows
/// of one short vector).
#[test]
fn window_rows_are_loaded_once() {
    let src = "fn f(x: f32[1, 4, 12, 40], w: f32[4, 1, 3, 3]) -> f32[1, 4, 12, 40] { return conv2d(x, w, padding=1, groups=4); }";
    let [_, (target, _, ir)] = x86_ir(src);
    let vector_loads = ir
        .lines()
        .filter(|l| !l.starts_with("declare"))
        .filter(|l| {
            l.contains("@llvm.masked.load")
                || (l.contains(" = load <") && !l.contains(" = load <1 x"))
        })
        .count();
    assert_eq!(vector_loads, 3 * 3, "{}: {ir}", target.name);
    jit_agrees(src);
    jit_agrees(dlc_tests::WIDE_WINDOW_DEPTHWISE_PROGRAM);
}
