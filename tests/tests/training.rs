//! Training in the language: `value_and_grad`, the optimizer updates and
//! the learning-rate schedules, on the graph interpreter, against their
//! definitions (PyTorch's algorithms for SGD, Adam and AdamW) written out
//! here.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::{DType, Pass, TensorType};
use dlc_graph::interp::{Tensor, run_function};

fn compile(src: &str) -> dlc_graph::Module {
    dlc_driver::compile_source(&dlc_driver::SourceText {
        name: "t.dl".into(),
        text: src.to_string(),
        weights: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{src}: {e}"))
}

fn t64(v: &[f64]) -> Tensor {
    Tensor::from_vec(&TensorType::new(DType::F64, vec![v.len()]), v.to_vec()).unwrap()
}

fn scalar(v: f64) -> Tensor {
    Tensor::from_vec(&TensorType::new(DType::F64, vec![]), vec![v]).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.data.iter().copied().collect()
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-12 * w.abs().max(1.0),
            "{what}: {got:?} vs {want:?}"
        );
    }
}

/// Each source fails to compile with a message containing its text.
fn fails_to_compile(cases: &[(&str, &str)]) {
    for &(src, want) in cases {
        let err = dlc_driver::compile_source(&dlc_driver::SourceText {
            name: "t.dl".into(),
            text: src.to_string(),
            weights: Vec::new(),
        })
        .map(|_| ())
        .expect_err(src)
        .to_string();
        assert!(err.contains(want), "{src}\nexpected `{want}` in:\n{err}");
    }
}

const W: [f64; 3] = [0.5, -1.25, 2.0];
const G: [f64; 3] = [0.1, -0.3, 0.25];

#[test]
fn sgd_with_and_without_momentum() {
    let m = compile(
        "fn f(w: f64[3], g: f64[3], b: f64[3]) -> (f64[3], f64[3], f64[3], f64[3], f64[3]) {
            let (w1, b1) = sgd_momentum(w, g, b, 0.1, momentum=0.9, weight_decay=0.01);
            let (w2, b2) = sgd_momentum(w, g, b, 0.1, momentum=0.5, nesterov=true);
            return (sgd(w, g, 0.1, weight_decay=0.5), w1, b1, w2, b2);
        }",
    );
    let buf = [0.2, 0.0, -0.1];
    let out = run_function(&m, "f", &[t64(&W), t64(&G), t64(&buf)]).unwrap();
    let plain: Vec<f64> = (0..3).map(|i| W[i] - 0.1 * (G[i] + 0.5 * W[i])).collect();
    close(&values(&out[0]), &plain, "sgd with weight decay");
    // PyTorch: d = g + wd w; b = mu b + d; w -= lr (d + mu b if nesterov else b)
    let b1: Vec<f64> = (0..3).map(|i| 0.9 * buf[i] + G[i] + 0.01 * W[i]).collect();
    let w1: Vec<f64> = (0..3).map(|i| W[i] - 0.1 * b1[i]).collect();
    close(&values(&out[1]), &w1, "momentum weights");
    close(&values(&out[2]), &b1, "momentum buffer");
    let b2: Vec<f64> = (0..3).map(|i| 0.5 * buf[i] + G[i]).collect();
    let w2: Vec<f64> = (0..3).map(|i| W[i] - 0.1 * (G[i] + 0.5 * b2[i])).collect();
    close(&values(&out[3]), &w2, "nesterov weights");
    close(&values(&out[4]), &b2, "nesterov buffer");
}

/// Three steps of Adam and of AdamW from zero moments, each step's bias
/// correction by its step number.
#[test]
fn adam_and_adamw_over_three_steps() {
    let m = compile(
        "fn adam3(w: f64[3], g: f64[3], m: f64[3], v: f64[3], t: f64, lr: f64) -> (f64[3], f64[3], f64[3]) {
            return adam(w, g, m, v, t, lr=lr, weight_decay=0.1);
        }
        fn adamw3(w: f64[3], g: f64[3], m: f64[3], v: f64[3], t: i32) -> (f64[3], f64[3], f64[3]) {
            return adamw(w, g, m, v, t, lr=0.01, beta1=0.8, eps=0.001);
        }",
    );
    for decoupled in [false, true] {
        let (mut w, mut mm, mut vv) = (W.to_vec(), vec![0.0; 3], vec![0.0; 3]);
        let (b1, b2, eps, lr, wd) = if decoupled {
            (0.8, 0.999, 1e-3, 0.01, 0.01)
        } else {
            (0.9, 0.999, 1e-8, 0.05, 0.1)
        };
        for step in 1..=3 {
            // The gradient changes with the weights, as in training.
            let g: Vec<f64> = (0..3).map(|i| G[i] * (1.0 + w[i])).collect();
            let args = vec![t64(&w), t64(&g), t64(&mm), t64(&vv)];
            let out = if decoupled {
                let t = Tensor::from_vec(&TensorType::new(DType::I32, vec![]), vec![step as f64])
                    .unwrap();
                run_function(&m, "adamw3", &[args, vec![t]].concat()).unwrap()
            } else {
                run_function(
                    &m,
                    "adam3",
                    &[args, vec![scalar(step as f64), scalar(lr)]].concat(),
                )
                .unwrap()
            };
            let t = step as f64;
            for i in 0..3 {
                let gi = if decoupled { g[i] } else { g[i] + wd * w[i] };
                if decoupled {
                    w[i] -= lr * wd * w[i];
                }
                mm[i] = b1 * mm[i] + (1.0 - b1) * gi;
                vv[i] = b2 * vv[i] + (1.0 - b2) * gi * gi;
                let mh = mm[i] / (1.0 - b1.powf(t));
                let vh = vv[i] / (1.0 - b2.powf(t));
                w[i] -= lr * mh / (vh.sqrt() + eps);
            }
            let what = if decoupled { "adamw" } else { "adam" };
            close(
                &values(&out[0]),
                &w,
                &format!("{what} weights, step {step}"),
            );
            close(
                &values(&out[1]),
                &mm,
                &format!("{what} first moment, step {step}"),
            );
            close(
                &values(&out[2]),
                &vv,
                &format!("{what} second moment, step {step}"),
            );
        }
    }
}

#[test]
fn learning_rate_schedules() {
    let m = compile(
        "fn f(t: i64) -> (f32, f32, f32, f32) {
            return (step_lr(t, 0.1, 10, gamma=0.5), warmup_lr(t, 0.1, 4),
                    cosine_lr(t, 0.1, 100), cosine_lr(t, 0.1, 100, warmup=10, min_lr=0.01));
        }",
    );
    for step in [1u32, 4, 10, 11, 21, 55, 100, 150] {
        let t =
            Tensor::from_vec(&TensorType::new(DType::I64, vec![]), vec![f64::from(step)]).unwrap();
        let out = run_function(&m, "f", &[t]).unwrap();
        let got: Vec<f64> = out.iter().map(|o| values(o)[0]).collect();
        let s = f64::from(step);
        let cosine = |warm: f64, min: f64| {
            if s <= warm && warm > 0.0 {
                0.1 * s / warm
            } else {
                let p = ((s - warm) / (100.0 - warm)).clamp(0.0, 1.0);
                min + (0.1 - min) * (1.0 + (std::f64::consts::PI * p).cos()) / 2.0
            }
        };
        let want = [
            0.1 * 0.5f64.powf(((s - 1.0) / 10.0).floor()),
            0.1 * (s / 4.0).min(1.0),
            cosine(0.0, 0.0),
            cosine(10.0, 0.01),
        ];
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 2e-7 * w.abs().max(1e-3),
                "schedule {k} at step {step}: {g} vs {w}"
            );
        }
    }
}

/// A training step as an entry point: the loss, and the weights moved
/// against the gradient `dlc grad` computes for the same loss.
#[test]
fn value_and_grad_makes_a_training_step() {
    let src = "
        fn loss(x: f64[4, 3], y: i64[4], weight w: f64[3, 5], weight b: f64[5]) -> f64 {
            return cross_entropy(tanh(x @ w) + b, y);
        }
        fn step(x: f64[4, 3], y: i64[4], weight w: f64[3, 5], weight b: f64[5]) -> (f64, f64[3, 5], f64[5]) {
            let (l, gw, gb) = value_and_grad(loss(x, y, w, b), wrt=[w, b]);
            return (l, sgd(w, gw, 0.5), sgd(b, gb, 0.5));
        }
        fn grad_b_only(x: f64[4, 3], y: i64[4], weight w: f64[3, 5], weight b: f64[5]) -> (f64, f64[5]) {
            return value_and_grad(loss(x, y, w, b), wrt=[b]);
        }";
    let mut m = compile(src);
    dlc_graph::autodiff::add_grad_function(&mut m, "loss", &[], "loss_grad").unwrap();
    let x = Tensor::from_vec(
        &TensorType::new(DType::F64, vec![4, 3]),
        (0..12).map(|i| (f64::from(i) * 0.37).sin()).collect(),
    )
    .unwrap();
    let y = Tensor::from_vec(
        &TensorType::new(DType::I64, vec![4]),
        vec![0.0, 4.0, 2.0, 2.0],
    )
    .unwrap();
    let w = Tensor::from_vec(
        &TensorType::new(DType::F64, vec![3, 5]),
        (0..15).map(|i| (f64::from(i) * 0.91).cos() * 0.5).collect(),
    )
    .unwrap();
    let b = t64(&[0.1, -0.2, 0.0, 0.3, 0.05]);
    let args = [x, y, w.clone(), b.clone()];
    let reference = run_function(&m, "loss_grad", &args).unwrap();
    let stepped = run_function(&m, "step", &args).unwrap();
    assert_eq!(values(&stepped[0]), values(&reference[0]), "the loss");
    let moved: Vec<f64> = values(&w)
        .iter()
        .zip(values(&reference[1]))
        .map(|(w, g)| w - 0.5 * g)
        .collect();
    close(&values(&stepped[1]), &moved, "the weights after one step");
    let moved: Vec<f64> = values(&b)
        .iter()
        .zip(values(&reference[2]))
        .map(|(b, g)| b - 0.5 * g)
        .collect();
    close(&values(&stepped[2]), &moved, "the biases after one step");
    let only_b = run_function(&m, "grad_b_only", &args).unwrap();
    assert_eq!(values(&only_b[1]), values(&reference[2]));
}

#[test]
fn value_and_grad_errors_point_at_the_mistake() {
    let cases = [
        (
            "fn f(x: f32[4]) -> (f32, f32[4]) { return value_and_grad(sum(x), wrt=[x]); }",
            "`value_and_grad` differentiates a `fn`: `sum` is not a function defined with `fn`",
        ),
        (
            "fn l(x: f32[4]) -> f32 { return sum(x * x); }
             fn f(x: f32[4]) -> (f32, f32[4]) { return value_and_grad(x, wrt=[x]); }",
            "the first argument of `value_and_grad` must be a call of a `fn`",
        ),
        (
            "fn l(x: f32[4], y: f32[4]) -> f32 { return sum(x * y); }
             fn f(x: f32[4], z: f32[4]) -> (f32, f32[4]) { return value_and_grad(l(x, z), wrt=[y]); }",
            "`y` is not an argument of this call of `l`",
        ),
        (
            "fn l(x: f32[4], y: f32[4]) -> f32 { return sum(x * y); }
             fn f(x: f32[4]) -> (f32, f32[4]) { return value_and_grad(l(x, x), wrt=[x]); }",
            "`x` is passed to `l` more than once",
        ),
        (
            "fn l(x: f32[4]) -> f32[4] { return x * 2.0; }
             fn f(x: f32[4]) -> (f32[4], f32[4]) { return value_and_grad(l(x), wrt=[x]); }",
            "cannot differentiate `l`: @l: the differentiated result must be a float scalar, got f32[4]",
        ),
        (
            "fn f(w: f32[4], g: f32[3]) -> f32[4] { return sgd(w, g, 0.1); }",
            "`g` must have the weight's type f32[4], got f32[3]",
        ),
        (
            "fn f(w: f32[4], g: f32[4]) -> f32[4] { return sgd(w, g, -0.1); }",
            "a learning rate must be positive",
        ),
        (
            "fn f(w: f32[4], g: f32[4], m: f32[4], v: f32[4]) -> (f32[4], f32[4], f32[4]) { return adam(w, g, m, v, 1, beta1=1.5); }",
            "`beta1` must be in [0, 1), got 1.5",
        ),
        (
            "fn f(x: f32[4, 3], y: f32[4]) -> f32 { return cross_entropy(x, y); }",
            "cross_entropy takes class indices (an integer tensor of shape [4]) or probabilities (a tensor of type f32[4, 3]), got f32[4]",
        ),
    ];
    fails_to_compile(&cases);
}

/// MurmurHash3's 32-bit finalizer.
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^ (h >> 16)
}

/// Training dropout keeps each element by the documented hash of its
/// position, seed and step: the same mask for the same seed and step, a
/// new one for the next step, about `1 - p` of the elements kept, scaled by
/// `1 / (1 - p)`.
#[test]
fn dropout_masks_follow_the_documented_hash() {
    let m = compile(
        "fn f(x: f64[40, 50], t: i64) -> (f64[40, 50], f64[40, 50], f64[40, 50]) {
            return (dropout(x, p=0.25, step=t, seed=9), dropout(x, p=0.25, step=t, seed=9),
                    dropout(x, p=0.25, step=t + 1, seed=9));
        }",
    );
    let x = Tensor::from_vec(&TensorType::new(DType::F64, vec![40, 50]), vec![2.0; 2000]).unwrap();
    let t = Tensor::from_vec(&TensorType::new(DType::I64, vec![]), vec![5.0]).unwrap();
    let out = run_function(&m, "f", &[x, t]).unwrap();
    let (a, b, c) = (values(&out[0]), values(&out[1]), values(&out[2]));
    assert_eq!(a, b, "one seed and step, one mask");
    assert_ne!(a, c, "the next step draws another mask");
    for (step, got) in [(5u32, &a), (6, &c)] {
        for (i, &v) in got.iter().enumerate() {
            let h = fmix32(
                (i as u32)
                    .wrapping_mul(0x9E37_79B1)
                    .wrapping_add(step.wrapping_mul(0xC2B2_AE35))
                    .wrapping_add(9u32.wrapping_mul(0x85EB_CA6B)),
            );
            let keep = f64::from(h >> 8) / 16_777_216.0 >= 0.25;
            assert_eq!(
                v,
                if keep { 2.0 / 0.75 } else { 0.0 },
                "element {i} at step {step}"
            );
        }
    }
    let kept = a.iter().filter(|&&v| v != 0.0).count() as f64 / 2000.0;
    assert!((kept - 0.75).abs() < 0.03, "kept {kept}");
}

/// Batch normalization in training mode: the batch's statistics normalize
/// it, and the running averages move toward them (the variance unbiased).
#[test]
fn batchnorm_train_uses_and_keeps_batch_statistics() {
    let m = compile(
        "fn f(x: f64[4, 2, 3], g: f64[2], b: f64[2], rm: f64[2], rv: f64[2]) -> (f64[4, 2, 3], f64[2], f64[2]) {
            return batchnorm_train(x, g, b, rm, rv, momentum=0.2, eps=0.001);
        }",
    );
    let xs: Vec<f64> = (0..24).map(|i| (f64::from(i) * 0.7).sin() * 3.0).collect();
    let x = Tensor::from_vec(&TensorType::new(DType::F64, vec![4, 2, 3]), xs.clone()).unwrap();
    let (g, b, rm, rv) = ([1.5, -0.5], [0.1, 0.2], [0.3, -0.3], [2.0, 0.5]);
    let out = run_function(&m, "f", &[x, t64(&g), t64(&b), t64(&rm), t64(&rv)]).unwrap();
    let y = values(&out[0]);
    for c in 0..2 {
        let at: Vec<usize> = (0..4)
            .flat_map(|n| (0..3).map(move |k| n * 6 + c * 3 + k))
            .collect();
        let mean = at.iter().map(|&i| xs[i]).sum::<f64>() / 12.0;
        let var = at.iter().map(|&i| (xs[i] - mean).powi(2)).sum::<f64>() / 12.0;
        for &i in &at {
            let want = (xs[i] - mean) / (var + 0.001).sqrt() * g[c] + b[c];
            assert!((y[i] - want).abs() < 1e-12, "y[{i}] {} vs {want}", y[i]);
        }
        let run_mean = 0.8 * rm[c] + 0.2 * mean;
        let run_var = 0.8 * rv[c] + 0.2 * var * 12.0 / 11.0;
        assert!((values(&out[1])[c] - run_mean).abs() < 1e-12);
        assert!((values(&out[2])[c] - run_var).abs() < 1e-12);
    }
}

fn f32s(shape: &[usize], f: impl Fn(usize) -> f64) -> Tensor {
    let n = shape.iter().product();
    let ty = TensorType::new(DType::F32, shape.to_vec());
    Tensor::from_vec(&ty, (0..n).map(|i| f64::from(f(i) as f32)).collect()).unwrap()
}

/// `autocast=bf16` differentiates the loss computed as the autocast policy
/// says (docs/language.md): products on bf16 copies of their f32 operands,
/// a bias add and relu in f32 once a product's result meets an f32 weight,
/// a softmax-based loss in f32. The same loss written with those casts by
/// hand has bit-identical value and gradients; the gradients are those of
/// the f32 loss within bf16's precision, and `scale=s` multiplies them (not
/// the value) by `s`.
#[test]
fn autocast_and_loss_scaling_differentiate_the_narrow_program() {
    let src = "
        fn loss(x: f32[6, 5], y: i64[6], weight w1: f32[5, 8], weight b1: f32[8], weight w2: f32[8, 3]) -> f32 {
            let h = relu(x @ w1 + b1) * 0.5;
            return cross_entropy(h @ w2, y);
        }
        fn by_hand(x: f32[6, 5], y: i64[6], weight w1: f32[5, 8], weight b1: f32[8], weight w2: f32[8, 3]) -> f32 {
            let p = cast(cast(x, bf16) @ cast(w1, bf16), f32);
            let h = relu(p + b1) * 0.5;
            return cross_entropy(cast(cast(h, bf16) @ cast(w2, bf16), f32), y);
        }
        fn narrow(x: f32[6, 5], y: i64[6], weight w1: f32[5, 8], weight b1: f32[8], weight w2: f32[8, 3])
                -> (f32, f32[5, 8], f32[8], f32[8, 3]) {
            return value_and_grad(loss(x, y, w1, b1, w2), autocast=bf16);
        }
        fn hand(x: f32[6, 5], y: i64[6], weight w1: f32[5, 8], weight b1: f32[8], weight w2: f32[8, 3])
                -> (f32, f32[5, 8], f32[8], f32[8, 3]) {
            return value_and_grad(by_hand(x, y, w1, b1, w2));
        }
        fn wide(x: f32[6, 5], y: i64[6], weight w1: f32[5, 8], weight b1: f32[8], weight w2: f32[8, 3])
                -> (f32, f32[5, 8], f32[8], f32[8, 3]) {
            return value_and_grad(loss(x, y, w1, b1, w2));
        }
        fn scaled(x: f32[6, 5], y: i64[6], weight w1: f32[5, 8], weight b1: f32[8], weight w2: f32[8, 3], s: f32)
                -> (f32, f32[5, 8], f32[8], f32[8, 3]) {
            return value_and_grad(loss(x, y, w1, b1, w2), autocast=f16, scale=s);
        }
        fn unscaled(x: f32[6, 5], y: i64[6], weight w1: f32[5, 8], weight b1: f32[8], weight w2: f32[8, 3])
                -> (f32, f32[5, 8], f32[8], f32[8, 3]) {
            return value_and_grad(loss(x, y, w1, b1, w2), autocast=f16);
        }";
    let m = compile(src);
    let x = f32s(&[6, 5], |i| (i as f64 * 0.37).sin());
    let y = Tensor::from_vec(
        &TensorType::new(DType::I64, vec![6]),
        vec![0.0, 2.0, 1.0, 1.0, 0.0, 2.0],
    )
    .unwrap();
    let w1 = f32s(&[5, 8], |i| (i as f64 * 0.91).cos() * 0.6);
    let b1 = f32s(&[8], |i| i as f64 * 0.05 - 0.2);
    let w2 = f32s(&[8, 3], |i| (i as f64 * 1.3).sin() * 0.7);
    let args = [x, y, w1, b1, w2];
    let narrow = run_function(&m, "narrow", &args).unwrap();
    let hand = run_function(&m, "hand", &args).unwrap();
    for (k, (a, b)) in narrow.iter().zip(&hand).enumerate() {
        assert_eq!(a.ty().dtype, DType::F32, "result {k} keeps its type");
        assert_eq!(
            values(a),
            values(b),
            "result {k}: autocast against the casts by hand"
        );
    }
    let wide = run_function(&m, "wide", &args).unwrap();
    for (k, (a, b)) in narrow.iter().zip(&wide).enumerate() {
        let (a, b) = (values(a), values(b));
        let top = b.iter().fold(0f64, |m, v| m.max(v.abs()));
        let err = a
            .iter()
            .zip(&b)
            .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        // bf16 keeps 8 bits: a few of its ulps, not more.
        assert!(err <= 0.03 * top, "result {k}: {err} of {top}");
        assert!(
            err > 0.0,
            "result {k} is computed in bf16, so not exactly f32's"
        );
    }
    let unscaled = run_function(&m, "unscaled", &args).unwrap();
    let mut with_scale = args.to_vec();
    with_scale.push(Tensor::from_vec(&TensorType::new(DType::F32, vec![]), vec![1024.0]).unwrap());
    let scaled = run_function(&m, "scaled", &with_scale).unwrap();
    assert_eq!(
        values(&scaled[0]),
        values(&unscaled[0]),
        "the value is not scaled"
    );
    for k in 1..4 {
        let want: Vec<f64> = values(&unscaled[k]).iter().map(|g| g * 1024.0).collect();
        // A power of two scales f16's rounding exactly (nothing here
        // overflows or leaves f16's normal range).
        assert_eq!(values(&scaled[k]), want, "gradient {k} scaled by 1024");
    }
}

/// `all_finite` is false when any element of any argument is NaN or
/// infinite; `loss_scale_update` is PyTorch's GradScaler rule.
#[test]
fn dynamic_loss_scaling_follows_grad_scaler() {
    let m = compile(
        "fn fin(a: f32[3], b: f32[2, 2], c: bf16) -> bool { return all_finite(a, b, c); }
         fn upd(s: f32, n: i64, ok: bool) -> (f32, i64) {
             return loss_scale_update(s, n, ok, interval=3);
         }
         fn upd_default(s: f32, n: i32, ok: bool) -> (f32, i32) {
             return loss_scale_update(s, n, ok, growth=4.0, backoff=0.25);
         }",
    );
    let f32t = |shape: &[usize], v: Vec<f64>| {
        Tensor::from_vec(&TensorType::new(DType::F32, shape.to_vec()), v).unwrap()
    };
    let bf = |v: f64| Tensor::from_vec(&TensorType::new(DType::BF16, vec![]), vec![v]).unwrap();
    let fin = |a: Vec<f64>, b: Vec<f64>, c: f64| {
        let out = run_function(&m, "fin", &[f32t(&[3], a), f32t(&[2, 2], b), bf(c)]).unwrap();
        values(&out[0])[0] != 0.0
    };
    let big = f64::from(f32::MAX);
    assert!(fin(vec![1.0, -2.0, big], vec![0.0, -0.0, 1e-40, -big], 3.0));
    assert!(!fin(vec![1.0, f64::INFINITY, 0.0], vec![0.0; 4], 1.0));
    assert!(!fin(vec![1.0; 3], vec![0.0, f64::NAN, 0.0, 0.0], 1.0));
    assert!(!fin(vec![1.0; 3], vec![0.0; 4], f64::NEG_INFINITY));
    let scalar_of =
        |d: DType, v: f64| Tensor::from_vec(&TensorType::new(d, vec![]), vec![v]).unwrap();
    let upd = |f: &str, d: DType, s: f64, n: f64, ok: bool| {
        let out = run_function(
            &m,
            f,
            &[
                scalar_of(DType::F32, s),
                scalar_of(d, n),
                scalar_of(DType::Bool, f64::from(u8::from(ok))),
            ],
        )
        .unwrap();
        (values(&out[0])[0], values(&out[1])[0])
    };
    // found_inf: scale * backoff, tracker 0. Otherwise tracker + 1, and at
    // the interval the scale grows and the tracker restarts.
    assert_eq!(upd("upd", DType::I64, 1024.0, 1.0, false), (512.0, 0.0));
    assert_eq!(upd("upd", DType::I64, 1024.0, 0.0, true), (1024.0, 1.0));
    assert_eq!(upd("upd", DType::I64, 1024.0, 1.0, true), (1024.0, 2.0));
    assert_eq!(upd("upd", DType::I64, 1024.0, 2.0, true), (2048.0, 0.0));
    // A scale that would overflow stays; the tracker still restarts.
    assert_eq!(upd("upd", DType::I64, big, 2.0, true), (big, 0.0));
    assert_eq!(
        upd("upd_default", DType::I32, 8.0, 1998.0, true),
        (8.0, 1999.0)
    );
    assert_eq!(
        upd("upd_default", DType::I32, 8.0, 1999.0, true),
        (32.0, 0.0)
    );
    assert_eq!(upd("upd_default", DType::I32, 8.0, 5.0, false), (2.0, 0.0));
}

#[test]
fn mixed_precision_errors_point_at_the_mistake() {
    let l = "fn l(x: f32[4], weight w: f32[4]) -> f32 { return sum(x * w); }\n";
    let cases = [
        (
            "fn f(x: f32[4], weight w: f32[4]) -> (f32, f32[4]) { return value_and_grad(l(x, w), autocast=f32); }",
            "`autocast` computes products in bf16 or f16, not f32",
        ),
        (
            "fn f(x: f32[4], weight w: f32[4]) -> (f32, f32[4]) { return value_and_grad(l(x, w), scale=-2.0); }",
            "a loss scale must be positive",
        ),
        (
            "fn f(x: f32[4], weight w: f32[4], s: f32[1]) -> (f32, f32[4]) { return value_and_grad(l(x, w), scale=s); }",
            "a loss scale is a number or a f32 scalar, got f32[1]",
        ),
        (
            "fn f(x: i32[4]) -> bool { return all_finite(x); }",
            "all_finite needs a floating-point operand, got i32[4]",
        ),
        (
            "fn f(x: f32[4]) -> bool { return all_finite(); }",
            "all_finite takes one or more float tensors",
        ),
        (
            "fn f(s: f32, n: f32, ok: bool) -> (f32, f32) { return loss_scale_update(s, n, ok); }",
            "`good` (updates since the scale last changed) is an integer scalar, got f32",
        ),
        (
            "fn f(s: f32, n: i64, ok: bool) -> (f32, i64) { return loss_scale_update(s, n, ok, interval=0); }",
            "`interval` must be a positive number of steps",
        ),
    ];
    let cases: Vec<(String, &str)> = cases
        .iter()
        .map(|(src, want)| (format!("{l}{src}"), *want))
        .collect();
    let cases: Vec<(&str, &str)> = cases.iter().map(|(s, w)| (s.as_str(), *w)).collect();
    fails_to_compile(&cases);
}

/// The autocast policy op by op: products narrow, an element-wise op on a
/// narrow value stays narrow (a constant follows it), an f32 operand that
/// is not a constant makes it f32, softmax and reductions run in f32, f64
/// is left alone, and the results keep their types.
#[test]
fn autocast_narrows_products_and_what_only_reads_them() {
    let m = compile(
        "fn f(x: f32[4, 4], w: f32[4, 4], b: f32[4], d: f64[4]) -> (f32[4, 4], f32, f64[4]) {
            let h = relu(x @ w) * 2.0;
            return (softmax(h + b, axis=1), sum(h), d * 2.0);
        }",
    );
    let f = m.function("f").unwrap();
    let g = dlc_graph::transforms::autocast(f, DType::BF16, "g").unwrap();
    let text = dlc_graph::print_module(&dlc_graph::Module {
        functions: vec![g.clone()],
    });
    let line = |op: &str| {
        text.lines()
            .find(|l| l.contains(&format!("= graph.{op} ")))
            .unwrap_or_else(|| panic!("no graph.{op} in\n{text}"))
            .to_string()
    };
    assert!(line("matmul").ends_with(": bf16[4, 4]"), "{text}");
    assert!(line("relu").ends_with(": bf16[4, 4]"), "{text}");
    assert!(line("mul").ends_with(": bf16[4, 4]"), "{text}");
    assert!(line("add").ends_with(": f32[4, 4]"), "{text}");
    assert!(line("softmax").ends_with(": f32[4, 4]"), "{text}");
    assert!(line("sum").ends_with(": f32[]"), "{text}");
    let f64_mul = text.lines().find(|l| l.contains("graph.mul %d,"));
    assert!(f64_mul.is_some_and(|l| l.ends_with(": f64[4]")), "{text}");
    assert!(!text.contains("graph.cast %d"), "{text}");
    assert_eq!(g.result_types(), f.result_types());
    assert_eq!(g.param_types(), f.param_types());
    assert!(dlc_graph::transforms::autocast(f, DType::F32, "g").is_err());
}

/// `checkpoint(f(..))` changes no value and no gradient (bit for bit, on
/// the interpreter), but the gradient computes `f`'s body again after
/// barriers that wait for its adjoint, instead of reading the forward
/// pass's values: twice as many `tanh`s, one barrier per argument. Under
/// autocast the checkpointed body is narrow too.
#[test]
fn checkpoint_recomputes_a_call_and_changes_no_gradient() {
    let src = "
        fn block(h: f32[6, 8], w: f32[8, 8], b: f32[8]) -> f32[6, 8] {
            return tanh(h @ w + b) + h;
        }
        fn kept(x: f32[6, 8], weight w1: f32[8, 8], weight b1: f32[8], weight w2: f32[8, 8]) -> f32 {
            let h = block(block(x, w1, b1), w2, b1);
            return mean(h * h);
        }
        fn again(x: f32[6, 8], weight w1: f32[8, 8], weight b1: f32[8], weight w2: f32[8, 8]) -> f32 {
            let h = checkpoint(block(checkpoint(block(x, w1, b1)), w2, b1));
            return mean(h * h);
        }
        fn g_kept(x: f32[6, 8], weight w1: f32[8, 8], weight b1: f32[8], weight w2: f32[8, 8])
                -> (f32, f32[8, 8], f32[8], f32[8, 8]) {
            return value_and_grad(kept(x, w1, b1, w2));
        }
        fn g_again(x: f32[6, 8], weight w1: f32[8, 8], weight b1: f32[8], weight w2: f32[8, 8])
                -> (f32, f32[8, 8], f32[8], f32[8, 8]) {
            return value_and_grad(again(x, w1, b1, w2));
        }
        fn n_kept(x: f32[6, 8], weight w1: f32[8, 8], weight b1: f32[8], weight w2: f32[8, 8])
                -> (f32, f32[8, 8], f32[8], f32[8, 8]) {
            return value_and_grad(kept(x, w1, b1, w2), autocast=bf16);
        }
        fn n_again(x: f32[6, 8], weight w1: f32[8, 8], weight b1: f32[8], weight w2: f32[8, 8])
                -> (f32, f32[8, 8], f32[8], f32[8, 8]) {
            return value_and_grad(again(x, w1, b1, w2), autocast=bf16);
        }";
    let mut m = compile(src);
    let args = [
        f32s(&[6, 8], |i| (i as f64 * 0.37).sin()),
        f32s(&[8, 8], |i| (i as f64 * 0.91).cos() * 0.5),
        f32s(&[8], |i| i as f64 * 0.05 - 0.2),
        f32s(&[8, 8], |i| (i as f64 * 1.3).sin() * 0.4),
    ];
    for (a, b) in [("g_kept", "g_again"), ("n_kept", "n_again")] {
        let want = run_function(&m, a, &args).unwrap();
        let got = run_function(&m, b, &args).unwrap();
        for (k, (x, y)) in got.iter().zip(&want).enumerate() {
            assert_eq!(values(x), values(y), "{b} result {k}");
        }
    }
    dlc_graph::transforms::Inline.run(&mut m).unwrap();
    let count = |f: &str, what: &str| {
        let text = dlc_graph::print_module(&dlc_graph::Module {
            functions: vec![m.function(f).unwrap().clone()],
        });
        text.matches(what).count()
    };
    assert_eq!(count("g_kept", "graph.tanh"), 2);
    assert_eq!(count("g_again", "graph.tanh"), 4, "each block once more");
    assert_eq!(count("g_kept", "graph.barrier"), 0);
    assert_eq!(
        count("g_again", "graph.barrier"),
        6,
        "three arguments, two calls"
    );
    assert!(count("n_again", "graph.matmul %") >= 4);
}

#[test]
fn checkpoint_errors_point_at_the_mistake() {
    let cases = [
        (
            "fn f(x: f32[4]) -> f32[4] { return checkpoint(x); }",
            "the argument of `checkpoint` must be a call of a `fn`",
        ),
        (
            "fn f(x: f32[4]) -> f32 { return checkpoint(sum(x)); }",
            "`checkpoint` recomputes a `fn`: `sum` is not a function defined with `fn`",
        ),
    ];
    fails_to_compile(&cases);
}
