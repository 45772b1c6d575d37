//! Reverse mode (`graph.grad`) against central finite differences: every
//! derivative rule of the graph dialect and the derivation of user
//! operators from their expressions, in f64 on the graph interpreter.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::TensorType;
use dlc_graph::interp::{Tensor, run_function};

/// A deterministic value in [-1, 1) for element `i` of input `p`.
fn sample(p: usize, i: usize) -> f64 {
    let mut z = (p as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^= z >> 31;
    z = z.wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 29;
    (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

fn inputs(types: &[TensorType], shift: &dyn Fn(usize, f64) -> f64) -> Vec<Tensor> {
    types
        .iter()
        .enumerate()
        .map(|(p, t)| {
            let n = t.num_elements().unwrap();
            Tensor::from_vec(t, (0..n).map(|i| shift(p, sample(p, i))).collect()).unwrap()
        })
        .collect()
}

/// Checks `@f`'s gradient (entry `f` of `src`, in f64, first result a
/// scalar) with respect to every float parameter against central
/// differences at inputs mapped by `shift` (parameter, sample), for up to
/// 24 elements of each parameter.
fn check_with(src: &str, shift: &dyn Fn(usize, f64) -> f64) {
    let mut m = compile(src);
    let wrt = dlc_graph::autodiff::add_grad_function(&mut m, "f", &[], "f_grad")
        .unwrap_or_else(|e| panic!("{src}: {e}"));
    let errors = dlc_graph::verify::verify_module(&m);
    assert!(errors.is_empty(), "{src}: {errors:?}\n{m}");
    let f = m.function("f").unwrap().clone();
    let types = f.param_types();
    let args = inputs(&types, shift);
    let out = run_function(&m, "f_grad", &args).unwrap_or_else(|e| panic!("{src}: {e}"));
    let base = run_function(&m, "f", &args).unwrap()[0]
        .data
        .iter()
        .copied()
        .next()
        .unwrap();
    let nres = f.results.len();
    assert_eq!(
        out[0].data.iter().next(),
        Some(&base),
        "{src}: the value differs"
    );
    for (k, &p) in wrt.iter().enumerate() {
        let grad = &out[nres + k];
        assert_eq!(grad.ty(), types[p], "{src}: gradient type");
        let n = types[p].num_elements().unwrap();
        let step = (n / 24).max(1);
        for i in (0..n).step_by(step) {
            let at = |delta: f64| {
                let mut a = args.clone();
                let flat = a[p].data.as_slice_mut().unwrap();
                flat[i] += delta;
                run_function(&m, "f", &a).unwrap()[0]
                    .data
                    .iter()
                    .copied()
                    .next()
                    .unwrap()
            };
            let h = 1e-6;
            let want = (at(h) - at(-h)) / (2.0 * h);
            let got = grad.data.as_slice().unwrap()[i];
            assert!(
                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{src}\nd f / d {}[{i}]: reverse mode {got}, central differences {want}\n{}",
                f.params[p].0,
                m
            );
        }
    }
}

fn compile(src: &str) -> dlc_graph::Module {
    dlc_driver::compile_source(&dlc_driver::SourceText {
        name: "t.dl".into(),
        text: src.to_string(),
        weights: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{src}: {e}"))
}

fn check(src: &str) {
    check_with(src, &|_, x| x)
}

#[test]
fn element_wise_functions() {
    for u in dlc_core::scalar::UnaryOp::ALL {
        let name = u.name();
        let arg = match name {
            "log" | "sqrt" | "rsqrt" => "abs(x) + 0.5",
            "reciprocal" => "x + 3.0",
            // Away from the kinks and jumps, where the derivative is 0 or 1.
            "floor" | "ceil" | "round" | "sign" | "relu" | "abs" => "x * 0.9 + 0.05",
            _ => "x",
        };
        let call = if name == "neg" {
            format!("-({arg})")
        } else {
            format!("{name}({arg})")
        };
        check(&format!(
            "fn f(x: f64[3, 4]) -> f64 {{ return sum({call} * x); }}"
        ));
    }
}

#[test]
fn binary_functions_broadcast() {
    check("fn f(x: f64[3, 4], y: f64[4]) -> f64 { return sum(x * y + x / (y + 3.0) - y); }");
    check("fn f(x: f64[3, 1], y: f64[1, 4]) -> f64 { return sum(max(x, y) * 2.0 + min(x, y)); }");
    check("fn f(x: f64[3, 4], y: f64[3, 4]) -> f64 { return sum(pow(abs(x) + 0.5, y)); }");
    check("fn f(x: f64[3, 4], s: f64) -> f64 { return sum(where(x > 0.0, x * s, s - x)); }");
    // Casts between float types pass the adjoint through, converted.
    let src = "fn f(x: f64[3, 4]) -> f64 { return sum(cast(cast(x, f32) * 2.0, f64)); }";
    let mut m = compile(src);
    dlc_graph::autodiff::add_grad_function(&mut m, "f", &[], "f_grad").unwrap();
    let x = Tensor::from_vec(
        &TensorType::new(dlc_core::DType::F64, vec![3, 4]),
        vec![0.1; 12],
    )
    .unwrap();
    let out = run_function(&m, "f_grad", &[x]).unwrap();
    assert!(out[1].data.iter().all(|&g| g == 2.0), "{:?}", out[1]);
}

#[test]
fn products() {
    check("fn f(a: f64[3, 5], b: f64[5, 4]) -> f64 { return sum(tanh(a @ b)); }");
    check("fn f(a: f64[2, 3, 5], b: f64[5, 4]) -> f64 { return sum(sin(a @ b)); }");
    check("fn f(a: f64[5], b: f64[2, 5, 4]) -> f64 { return sum(sin(a @ b)); }");
    check("fn f(a: f64[3, 5], b: f64[5]) -> f64 { return sum(exp(a @ b)); }");
    check("fn f(a: f64[2, 1, 3, 5], b: f64[4, 5, 2]) -> f64 { return sum(sin(a @ b)); }");
}

#[test]
fn reductions() {
    check(
        "fn f(x: f64[3, 4, 5]) -> f64 { return sum(exp(sum(x, axis=1))) + sum(sin(mean(x, axis=[0, 2], keepdims=true))); }",
    );
    check(
        "fn f(x: f64[3, 4, 5]) -> f64 { return sum(sin(max(x, axis=2))) + sum(cos(min(x, axis=0))); }",
    );
    check("fn f(x: f64[3, 4]) -> f64 { return sum(prod(x, axis=1)) + prod(x + 2.0); }");
}

#[test]
fn ties_and_zeros_take_the_documented_gradient() {
    // max over a row of equal elements: each gets half; prod with one zero:
    // the zero gets the product of the others, the rest nothing.
    let src = "fn f(x: f64[2]) -> f64 { return max(x) + prod(x - 1.0); }";
    let mut m = compile(src);
    dlc_graph::autodiff::add_grad_function(&mut m, "f", &[], "f_grad").unwrap();
    let x = Tensor::from_vec(
        &TensorType::new(dlc_core::DType::F64, vec![2]),
        vec![1.0, 1.0],
    )
    .unwrap();
    let out = run_function(&m, "f_grad", &[x]).unwrap();
    assert_eq!(out[1].data.as_slice().unwrap(), &[0.5, 0.5]);
    let x = Tensor::from_vec(
        &TensorType::new(dlc_core::DType::F64, vec![2]),
        vec![1.0, 4.0],
    )
    .unwrap();
    let out = run_function(&m, "f_grad", &[x]).unwrap();
    // max picks 4.0; prod(x - 1) = 0 * 3 gives the zero element 3.
    assert_eq!(out[1].data.as_slice().unwrap(), &[3.0, 1.0]);

    // The same in a user operator: with one zero, the zero gets the
    // product of the others and the rest nothing; with two, nothing at all.
    let src = "op rowprod(x: f64[2, 3]) -> f64[2] { out[i] = prod[j](x[i, j]); }
               fn f(x: f64[2, 3]) -> f64 { return sum(rowprod(x)); }";
    let mut m = compile(src);
    dlc_graph::autodiff::add_grad_function(&mut m, "f", &[], "f_grad").unwrap();
    let x = Tensor::from_vec(
        &TensorType::new(dlc_core::DType::F64, vec![2, 3]),
        vec![2.0, 0.0, 5.0, 0.0, 3.0, 0.0],
    )
    .unwrap();
    let out = run_function(&m, "f_grad", &[x]).unwrap();
    assert_eq!(
        out[1].data.as_slice().unwrap(),
        &[0.0, 10.0, 0.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn normalizations() {
    check("fn f(x: f64[3, 4, 5]) -> f64 { return sum(softmax(x, axis=1) * x); }");
    check("fn f(x: f64[3, 4, 5]) -> f64 { return sum(layernorm(x, axis=[1, 2]) * x); }");
    check("fn f(x: f64[3, 6]) -> f64 { return sum(layernorm(x, axis=-1, eps=0.01) * sin(x)); }");
    check_with(
        "fn f(x: f64[2, 3, 4, 4], m: f64[3], v: f64[3], g: f64[3], b: f64[3]) -> f64 { return sum(sin(batchnorm(x, m, v, g, b))); }",
        &|p, x| if p == 2 { x.abs() + 0.5 } else { x },
    );
}

#[test]
fn shapes() {
    check(
        "fn f(x: f64[2, 6]) -> f64 { return sum(sin(reshape(x, [3, 4])) * transpose(reshape(x, [4, 3]))); }",
    );
    check(
        "fn f(x: f64[2, 3, 4]) -> f64 { return sum(exp(transpose(x, [2, 0, 1])) * transpose(broadcast(sum(x, axis=0), [2, 3, 4]), [2, 0, 1])); }",
    );
    check(
        "fn f(a: f64[2, 3], b: f64[2, 2]) -> f64 { return sum(sin(concat([a, b, a], axis=1))); }",
    );
    check(
        "fn f(x: f64[4, 5]) -> f64 { return sum(exp(slice(x, axis=1, start=1, end=3))) + sum(slice(x, axis=0, start=0, end=4)); }",
    );
    check("fn f(x: f64[3]) -> f64 { return sum(sin(broadcast(x, [2, 3]))); }");
}

/// A gather's adjoint adds each element where its index points: repeated
/// indices add up, negative ones count from the end, and one out of range
/// adds nowhere.
#[test]
fn gathers() {
    check(
        "fn f(x: f64[4, 3]) -> f64 { return sum(sin(gather(x, tensor([2, 0, -1, 2, 5], [5], dtype=i64)))); }",
    );
    check(
        "fn f(x: f64[2, 4, 3]) -> f64 { return sum(sin(gather(x, tensor([1, 3, -4, 1], [2, 2], dtype=i32), axis=1))); }",
    );
    check(
        "fn f(x: f64[4, 3]) -> f64 { return sum(sin(gather(x, tensor([-2], [], dtype=i64)) * x)); }",
    );
}

/// A scatter-add passes its adjoint to `x` and gathers it for the
/// updates; `gather_elements`, a gather of the flattened tensor, adds each
/// element back at its flat position, and `scatter_add_elements` gathers
/// its updates' adjoint from there.
#[test]
fn scatters() {
    check(
        "fn f(x: f64[4, 3], u: f64[4, 2, 3]) -> f64 { return sum(sin(scatter_add(x * x, tensor([1, -1, 1, 9, 0, 3], [2, 3], dtype=i64), u * u, axis=1))); }",
    );
    check(
        "fn f(x: f64[3, 5]) -> f64 { return sum(sin(gather_elements(x, tensor([0, 4, 4, -1, 2, 7, 1, 1], [2, 4], dtype=i32), axis=1))); }",
    );
    check(
        "fn f(x: f64[3, 5], u: f64[2, 4]) -> f64 { return sum(sin(scatter_add_elements(x * x, tensor([0, 4, 4, -1, 2, 7, 1, 1], [2, 4], dtype=i32), u * u, axis=1))); }",
    );
}

#[test]
fn convolutions_and_pooling() {
    // Dilated windows too: strided, grouped, and one whose taps along the
    // rows are 3 apart and along the columns 2 apart.
    for (stride, padding, groups, dilation) in [
        (1, 1, 1, "1"),
        (2, 0, 1, "1"),
        (2, 1, 2, "1"),
        (1, 2, 4, "1"),
        (1, 2, 2, "2"),
        (2, 1, 1, "2"),
        (1, 3, 4, "[3, 2]"),
    ] {
        let cg = 4 / groups;
        check(&format!(
            "fn f(x: f64[2, 4, 6, 5], w: f64[4, {cg}, 3, 2]) -> f64 {{ return sum(sin(conv2d(x, w, stride={stride}, padding={padding}, groups={groups}, dilation={dilation}))); }}"
        ));
    }
    // Video convolutions: strided in time, grouped and dilated in time,
    // and one whose outer temporal taps read only padding.
    for (x, w, args) in [
        (
            "[1, 2, 4, 4, 3]",
            "[3, 2, 3, 2, 2]",
            "stride=[2, 1, 1], padding=1",
        ),
        (
            "[2, 4, 3, 3, 3]",
            "[4, 2, 2, 3, 1]",
            "padding=[1, 1, 0], dilation=[2, 1, 1], groups=2",
        ),
        ("[1, 2, 1, 3, 3]", "[2, 2, 3, 3, 3]", "padding=1"),
    ] {
        check(&format!(
            "fn f(x: f64{x}, w: f64{w}) -> f64 {{ return sum(sin(conv3d(x, w, {args}))); }}"
        ));
    }
    check(
        "fn f(x: f64[2, 3, 6, 6]) -> f64 { return sum(sin(avgpool2d(x, kernel=3, stride=2, padding=1))); }",
    );
    check("fn f(x: f64[2, 3, 6, 6]) -> f64 { return sum(sin(maxpool2d(x, kernel=2, stride=2))); }");
    check(
        "fn f(x: f64[2, 3, 5, 5]) -> f64 { return sum(sin(maxpool2d(x, kernel=3, stride=1, padding=1))); }",
    );
}

#[test]
fn user_operators_differentiate_from_their_expression() {
    let ops = [
        // A product with the operand transposed.
        (
            "op k(a: f64[5, 3], b: f64[5, 4]) -> f64[3, 4] { out[i, j] = sum[k](a[k, i] * b[k, j]); }",
            "k(a, b)",
            "a: f64[5, 3], b: f64[5, 4]",
        ),
        // An epilogue around the sum, a prologue inside it.
        (
            "op k(a: f64[3, 5], b: f64[5, 4], c: f64[4]) -> f64[3, 4] { out[i, j] = tanh(sum[k](sin(a[i, k]) * b[k, j]) + c[j]); }",
            "k(a, b, c)",
            "a: f64[3, 5], b: f64[5, 4], c: f64[4]",
        ),
        // Locals, a max reduction, a reduction of a local.
        (
            "op k(x: f64[3, 6]) -> f64[3, 6] { let m[i] = max[j](x[i, j]); let e[i, j] = exp(x[i, j] - m[i]); let s[i] = sum[j](e[i, j]); out[i, j] = e[i, j] / s[i]; }",
            "k(x)",
            "x: f64[3, 6]",
        ),
        // Shifted and strided windows, zero outside.
        (
            "op k(x: f64[10], w: f64[3]) -> f64[4] { out[i] = sum[t](x[2 * i + t - 1] * w[t]); }",
            "k(x, w)",
            "x: f64[10], w: f64[3]",
        ),
        // A diagonal, a constant index, a reversal.
        (
            "op k(x: f64[4, 4], y: f64[5]) -> f64[4] { out[i] = x[i, i] * y[0] + y[4 - i] * x[3 - i, i]; }",
            "k(x, y)",
            "x: f64[4, 4], y: f64[5]",
        ),
        // A reduction inside another, reading the outer's variable.
        (
            "op k(x: f64[3, 4, 5]) -> f64[3] { out[i] = sum[j](exp(max[k](x[i, j, k] * x[i, j, 0]))); }",
            "k(x)",
            "x: f64[3, 4, 5]",
        ),
        // A mean and a where.
        (
            "op k(x: f64[3, 4], y: f64[4]) -> f64[3] { out[i] = mean[j](where(x[i, j] > 0.0, x[i, j] * y[j], y[j] * y[j])); }",
            "k(x, y)",
            "x: f64[3, 4], y: f64[4]",
        ),
        // Products over one and over two variables, of a local, shifted.
        (
            "op k(x: f64[3, 5], y: f64[5]) -> f64[3] { let t[i, j] = x[i, j] + y[j]; out[i] = prod[j](t[i, j] * 0.5) + prod[j in 1..4](x[i, j]); }",
            "k(x, y)",
            "x: f64[3, 5], y: f64[5]",
        ),
        (
            "op k(x: f64[2, 3, 4]) -> f64[2] { out[i] = prod[j, l](x[i, j, l] + 1.0); }",
            "k(x)",
            "x: f64[2, 3, 4]",
        ),
    ];
    for (op, call, params) in ops {
        check(&format!(
            "{op}\nfn f({params}) -> f64 {{ return sum(sin({call})); }}"
        ));
    }
}

#[test]
fn batch_statistics_and_dropout() {
    // Through the batch's mean and variance, not around them.
    check(
        "fn f(x: f64[4, 3, 2, 2], g: f64[3], b: f64[3], rm: f64[3], rv: f64[3]) -> f64 {
        let (y, m, v) = batchnorm_train(x, g, b, rm, rv);
        return sum(sin(y)) + sum(m * v);
    }",
    );
    check("fn f(x: f64[6, 7]) -> f64 { return sum(sin(dropout(x, p=0.4, step=3, seed=1)) * x); }");
}

#[test]
fn losses() {
    check("fn f(x: f64[4, 5], y: i64[4]) -> f64 { return cross_entropy(x * 3.0, y); }");
    check("fn f(x: f64[4, 5], p: f64[4, 5]) -> f64 { return cross_entropy(x, softmax(p)); }");
    check("fn f(x: f64[3, 4, 2]) -> f64 { return cross_entropy(x, abs(x), axis=1); }");
    check("fn f(x: f64[3, 4], y: f64[3, 4]) -> f64 { return mse_loss(x, y) + l1_loss(x, y); }");
    check("fn f(x: f64[3, 4], y: f64[3, 4]) -> f64 { return huber_loss(x * 2.0, y, delta=0.5); }");
    check("fn f(x: f64[3, 4], y: f64[3, 4]) -> f64 { return bce_with_logits(x * 4.0, abs(y)); }");
}

/// The losses' values, against their formulas written out here.
#[test]
fn loss_values() {
    let src = "fn f(x: f64[2, 3], y: i64[2], z: f64[2, 3], t: f64[2, 3]) -> (f64, f64, f64, f64, f64) {
        return (cross_entropy(x, y), bce_with_logits(z, t), huber_loss(z, t, delta=0.5), mse_loss(z, t), l1_loss(z, t));
    }";
    let m = compile(src);
    let f64t = |shape: &[usize], v: Vec<f64>| {
        Tensor::from_vec(&TensorType::new(dlc_core::DType::F64, shape.to_vec()), v).unwrap()
    };
    let x = [0.5, -1.0, 2.0, 0.0, 0.25, -0.5];
    let z = [0.0, 3.0, -2.0, 0.7, -0.1, 1.5];
    let t = [1.0, 0.0, 0.5, 0.2, 1.0, 0.0];
    let y = Tensor::from_vec(
        &TensorType::new(dlc_core::DType::I64, vec![2]),
        vec![2.0, 1.0],
    )
    .unwrap();
    let out = run_function(
        &m,
        "f",
        &[
            f64t(&[2, 3], x.to_vec()),
            y,
            f64t(&[2, 3], z.to_vec()),
            f64t(&[2, 3], t.to_vec()),
        ],
    )
    .unwrap();
    let get = |i: usize| out[i].data.iter().copied().next().unwrap();
    let nll = |row: &[f64], label: usize| {
        let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
        lse - row[label]
    };
    let ce = (nll(&x[0..3], 2) + nll(&x[3..6], 1)) / 2.0;
    let pairs = z.iter().zip(&t);
    let bce = pairs
        .clone()
        .map(|(&z, &t)| {
            -(t * (1.0 / (1.0 + (-z).exp())).ln()
                + (1.0 - t) * (1.0 - 1.0 / (1.0 + (-z).exp())).ln())
        })
        .sum::<f64>()
        / 6.0;
    let huber = pairs
        .clone()
        .map(|(&z, &t)| {
            let d = (z - t).abs();
            if d < 0.5 {
                0.5 * d * d
            } else {
                0.5 * (d - 0.25)
            }
        })
        .sum::<f64>()
        / 6.0;
    let mse = pairs.clone().map(|(&z, &t)| (z - t) * (z - t)).sum::<f64>() / 6.0;
    let l1 = pairs.map(|(&z, &t)| (z - t).abs()).sum::<f64>() / 6.0;
    for (i, want) in [ce, bce, huber, mse, l1].into_iter().enumerate() {
        assert!(
            (get(i) - want).abs() < 1e-12,
            "loss {i}: {} vs {want}",
            get(i)
        );
    }
}

/// At a logit of exactly 0 (a zero-initialized last layer) the binary
/// cross-entropy's gradient is sigmoid(0) - y, not the one-sided value an
/// `abs` or `relu` in its formula would give.
#[test]
fn bce_gradient_at_zero_logits() {
    let mut m = compile(
        "fn f(x: f64[2]) -> f64 { return bce_with_logits(x, cast(tensor([1.0, 0.0], [2]), f64)); }",
    );
    dlc_graph::autodiff::add_grad_function(&mut m, "f", &[], "f_grad").unwrap();
    let x = Tensor::from_vec(
        &TensorType::new(dlc_core::DType::F64, vec![2]),
        vec![0.0, 0.0],
    )
    .unwrap();
    let out = run_function(&m, "f_grad", &[x]).unwrap();
    assert_eq!(out[1].data.as_slice().unwrap(), &[-0.25, 0.25]);
}
