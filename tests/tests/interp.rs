//! The reference interpreter on small programs, against values computed by
//! hand (or, for transcendental functions, with NumPy in float64, noted
//! beside them).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::{DType, TensorType};
use dlc_driver::{
    DEFAULT_PIPELINE, DriverError, PassOptions, SourceText, compile_source, interpret, run_passes,
    select_entry,
};
use dlc_runtime::HostTensor;

fn t(dtype: DType, shape: &[usize], data: &[f64]) -> HostTensor {
    HostTensor::new(TensorType::new(dtype, shape.to_vec()), data.to_vec()).unwrap()
}

fn f32t(shape: &[usize], data: &[f64]) -> HostTensor {
    t(DType::F32, shape, data)
}

fn eval(src: &str, inputs: &[HostTensor]) -> Result<Vec<HostTensor>, DriverError> {
    let mut module = compile_source(&SourceText {
        name: "test.dl".into(),
        text: src.into(),
        weights: Vec::new(),
    })?;
    run_passes(&mut module, DEFAULT_PIPELINE, PassOptions::default())?;
    let f = select_entry(&module, None)?;
    interpret(&module, f, inputs)
}

#[track_caller]
fn expect(src: &str, inputs: &[HostTensor], shape: &[usize], want: &[f64]) {
    let out = eval(src, inputs).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0].ty.shape, shape, "shape");
    assert_eq!(out[0].data.len(), want.len());
    for (i, (g, w)) in out[0].data.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "element {i}: got {g}, want {w}\n{:?}",
            out[0].data
        );
    }
}

#[test]
fn matmul_numpy_semantics() {
    let a = f32t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = f32t(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
    expect(
        "fn f(a: f32[2, 2], b: f32[2, 2]) -> f32[2, 2] { return a @ b; }",
        &[a, b],
        &[2, 2],
        &[19.0, 22.0, 43.0, 50.0],
    );
    let v = f32t(&[3], &[1.0, 2.0, 3.0]);
    let m = f32t(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    expect(
        "fn f(v: f32[3], m: f32[3, 2]) -> f32[2] { return v @ m; }",
        &[v.clone(), m],
        &[2],
        &[4.0, 5.0],
    );
    let w = f32t(&[3], &[4.0, 5.0, 6.0]);
    expect(
        "fn f(v: f32[3], w: f32[3]) -> f32 { return v @ w; }",
        &[v, w],
        &[],
        &[32.0],
    );
    // Batched, with the batch dimension broadcast: [2,1,2] @ [2,1] -> [2,1,1].
    let a = f32t(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = f32t(&[2, 1], &[10.0, 1.0]);
    expect(
        "fn f(a: f32[2, 1, 2], b: f32[2, 1]) -> f32[2, 1, 1] { return a @ b; }",
        &[a, b],
        &[2, 1, 1],
        &[12.0, 34.0],
    );
}

#[test]
fn broadcasting_and_literals() {
    let a = f32t(&[2, 1], &[1.0, 2.0]);
    let b = f32t(&[3], &[10.0, 20.0, 30.0]);
    expect(
        "fn f(a: f32[2, 1], b: f32[3]) -> f32[2, 3] { return a + b; }",
        &[a.clone(), b],
        &[2, 3],
        &[11.0, 21.0, 31.0, 12.0, 22.0, 32.0],
    );
    expect(
        "fn f(a: f32[2, 1]) -> f32[2, 1] { return 2 * a - 1.5 / 3.0; }",
        &[a],
        &[2, 1],
        &[1.5, 3.5],
    );
}

#[test]
fn reductions() {
    let x = || f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    expect(
        "fn f(x: f32[2, 3]) -> f32[2] { return sum(x, axis=1); }",
        &[x()],
        &[2],
        &[6.0, 15.0],
    );
    expect(
        "fn f(x: f32[2, 3]) -> f32[3] { return mean(x, axis=0); }",
        &[x()],
        &[3],
        &[2.5, 3.5, 4.5],
    );
    expect(
        "fn f(x: f32[2, 3]) -> f32 { return max(x); }",
        &[x()],
        &[],
        &[6.0],
    );
    expect(
        "fn f(x: f32[2, 3]) -> f32[2, 1] { return min(x, axis=-1, keepdims=true); }",
        &[x()],
        &[2, 1],
        &[1.0, 4.0],
    );
    expect(
        "fn f(x: f32[2, 3]) -> f32 { return sum(x, axis=[0, 1]); }",
        &[x()],
        &[],
        &[21.0],
    );
}

#[test]
fn normalizations() {
    let x = f32t(&[2], &[0.0, 3f64.ln()]);
    expect(
        "fn f(x: f32[2]) -> f32[2] { return softmax(x); }",
        &[x],
        &[2],
        &[0.25, 0.75],
    );
    let x = f32t(&[3], &[1.0, 2.0, 3.0]);
    // (x - 2) / sqrt(2/3)
    expect(
        "fn f(x: f32[3]) -> f32[3] { return layernorm(x, eps=0.0); }",
        &[x],
        &[3],
        &[-1.224744871391589, 0.0, 1.224744871391589],
    );
    let x = f32t(&[1, 2, 1, 1], &[1.0, 2.0]);
    let stat = |a: f64, b: f64| f32t(&[2], &[a, b]);
    expect(
        "fn f(x: f32[1, 2, 1, 1], m: f32[2], v: f32[2], g: f32[2], b: f32[2]) -> f32[1, 2, 1, 1] { return batchnorm(x, m, v, g, b, eps=0.0); }",
        &[
            x,
            stat(0.0, 1.0),
            stat(1.0, 4.0),
            stat(2.0, 3.0),
            stat(0.0, 1.0),
        ],
        &[1, 2, 1, 1],
        &[2.0, 2.5],
    );
}

#[test]
fn elementwise_functions() {
    let one = || f32t(&[], &[1.0]);
    // NumPy float64: 0.5 * (1 + tanh(sqrt(2/pi) * (1 + 0.044715))) = 0.8411919906082768
    expect(
        "fn f(x: f32) -> f32 { return gelu(x); }",
        &[one()],
        &[],
        &[0.8411919906082768],
    );
    expect(
        "fn f(x: f32) -> f32[6] { return concat([reshape(relu(-x), [1]), reshape(sigmoid(x - 1.0), [1]), reshape(tanh(x - 1.0), [1]), reshape(rsqrt(x * 4.0), [1]), reshape(abs(x - 3.0), [1]), reshape(sqrt(x * 9.0), [1])]); }",
        &[one()],
        &[6],
        &[0.0, 0.5, 0.0, 0.5, 2.0, 3.0],
    );
    expect(
        "fn f(x: f32) -> f32 { return pow(x * 2.0, 3.0) + exp(x - 1.0) + log(x); }",
        &[one()],
        &[],
        &[9.0],
    );
    let x = f32t(&[2], &[-1.0, 2.0]);
    expect(
        "fn f(x: f32[2]) -> f32[2] { return where(x > 0.0, x, 0.5); }",
        std::slice::from_ref(&x),
        &[2],
        &[0.5, 2.0],
    );
    expect(
        "fn f(x: f32[2]) -> f32[2] { return max(x, 0.0) + min(x, 1.0); }",
        &[x],
        &[2],
        &[-1.0, 3.0],
    );
    // Rounding: ties go to even (NumPy's round); floor and ceil below zero.
    let v = f32t(&[6], &[-2.5, -1.5, -0.5, 0.5, 1.5, 2.7]);
    expect(
        "fn f(x: f32[6]) -> f32[6] { return round(x); }",
        std::slice::from_ref(&v),
        &[6],
        &[-2.0, -2.0, -0.0, 0.0, 2.0, 3.0],
    );
    expect(
        "fn f(x: f32[6]) -> f32[6] { return floor(x) * 10.0 + ceil(x); }",
        std::slice::from_ref(&v),
        &[6],
        &[-32.0, -21.0, -10.0, 1.0, 12.0, 23.0],
    );
    expect(
        "fn f(x: f32[6]) -> f32[6] { return sign(x - 0.5) + reciprocal(x); }",
        std::slice::from_ref(&v),
        &[6],
        &[
            -1.4,
            -1.0 - 1.0 / 1.5,
            -3.0,
            2.0,
            1.0 + 1.0 / 1.5,
            1.0 + 1.0 / 2.7,
        ],
    );
    // NumPy float64: sin(1) + cos(1) = 1.3817732906760363; 1 / (1 + e^-1) = 0.7310585786300049.
    expect(
        "fn f(x: f32) -> f32[2] { return concat([reshape(sin(x) + cos(x), [1]), reshape(silu(x), [1])]); }",
        &[one()],
        &[2],
        &[1.3817732906760363, 0.7310585786300049],
    );
    let i = t(DType::I32, &[3], &[-7.0, 0.0, 5.0]);
    expect(
        "fn f(x: i32[3]) -> i32[3] { return sign(x); }",
        &[i],
        &[3],
        &[-1.0, 0.0, 1.0],
    );
}

#[test]
fn shape_operators() {
    let x = || f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    expect(
        "fn f(x: f32[2, 3]) -> f32[3, 2] { return transpose(x); }",
        &[x()],
        &[3, 2],
        &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0],
    );
    expect(
        "fn f(x: f32[2, 3]) -> f32[3, 2] { return reshape(x, [3, -1]); }",
        &[x()],
        &[3, 2],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
    );
    expect(
        "fn f(x: f32[2, 3]) -> f32[2, 1] { return slice(x, axis=1, start=-2, end=-1); }",
        &[x()],
        &[2, 1],
        &[2.0, 5.0],
    );
    expect(
        "fn f(x: f32[2, 3]) -> f32[2, 6] { return concat([x, x * 10.0], axis=1); }",
        &[x()],
        &[2, 6],
        &[
            1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 4.0, 5.0, 6.0, 40.0, 50.0, 60.0,
        ],
    );
    expect(
        "fn f(x: f32[2, 3]) -> f32[2, 2, 3] { return broadcast(x, [2, 2, 3]); }",
        &[x()],
        &[2, 2, 3],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
    );
    expect(
        "fn f(x: f32[2, 3]) -> f32[2, 3] { return x + zeros([2, 3]) + ones([3]) + full([2, 1], 0.5); }",
        &[x()],
        &[2, 3],
        &[2.5, 3.5, 4.5, 5.5, 6.5, 7.5],
    );
}

#[test]
fn convolution_and_pooling() {
    let ones = |shape: &[usize]| f32t(shape, &vec![1.0; shape.iter().product()]);
    let conv = "fn f(x: f32[1, 1, 3, 3], w: f32[1, 1, 3, 3]) -> f32[1, 1, 3, 3] { return conv2d(x, w, padding=1); }";
    expect(
        conv,
        &[ones(&[1, 1, 3, 3]), ones(&[1, 1, 3, 3])],
        &[1, 1, 3, 3],
        &[4.0, 6.0, 4.0, 6.0, 9.0, 6.0, 4.0, 6.0, 4.0],
    );
    let strided = "fn f(x: f32[1, 1, 3, 3], w: f32[1, 1, 3, 3]) -> f32[1, 1, 2, 2] { return conv2d(x, w, stride=2, padding=1); }";
    expect(
        strided,
        &[ones(&[1, 1, 3, 3]), ones(&[1, 1, 3, 3])],
        &[1, 1, 2, 2],
        &[4.0, 4.0, 4.0, 4.0],
    );
    let grouped = "fn f(x: f32[1, 2, 1, 1], w: f32[2, 1, 1, 1]) -> f32[1, 2, 1, 1] { return conv2d(x, w, groups=2); }";
    expect(
        grouped,
        &[
            f32t(&[1, 2, 1, 1], &[1.0, 2.0]),
            f32t(&[2, 1, 1, 1], &[3.0, 5.0]),
        ],
        &[1, 2, 1, 1],
        &[3.0, 10.0],
    );
    let x: Vec<f64> = (1..=16).map(f64::from).collect();
    // Taps two apart: each output sums the corners of a 3 x 3 square.
    let dilated = "fn f(x: f32[1, 1, 4, 4], w: f32[1, 1, 2, 2]) -> f32[1, 1, 2, 2] { return conv2d(x, w, dilation=2); }";
    expect(
        dilated,
        &[f32t(&[1, 1, 4, 4], &x), ones(&[1, 1, 2, 2])],
        &[1, 1, 2, 2],
        &[24.0, 28.0, 40.0, 44.0],
    );
    expect(
        "fn f(x: f32[1, 1, 4, 4]) -> f32[1, 1, 2, 2] { return maxpool2d(x, kernel=2); }",
        &[f32t(&[1, 1, 4, 4], &x)],
        &[1, 1, 2, 2],
        &[6.0, 8.0, 14.0, 16.0],
    );
    expect(
        "fn f(x: f32[1, 1, 4, 4]) -> f32[1, 1, 2, 2] { return avgpool2d(x, kernel=2); }",
        &[f32t(&[1, 1, 4, 4], &x)],
        &[1, 1, 2, 2],
        &[3.5, 5.5, 11.5, 13.5],
    );
}

#[test]
fn integers_and_casts() {
    let x = t(DType::I32, &[3], &[-7.0, 7.0, 2147483647.0]);
    expect(
        "fn f(x: i32[3]) -> i32[3] { return x / 2; }",
        std::slice::from_ref(&x),
        &[3],
        &[-4.0, 3.0, 1073741823.0],
    );
    expect(
        "fn f(x: i32[3]) -> i32[3] { return x + 1; }",
        std::slice::from_ref(&x),
        &[3],
        &[-6.0, 8.0, -2147483648.0],
    );
    let y = f32t(&[2], &[2.7, -2.7]);
    expect(
        "fn f(y: f32[2]) -> i32[2] { return cast(y, i32); }",
        &[y],
        &[2],
        &[2.0, -2.0],
    );
    let err = eval("fn f(x: i32[3]) -> i32[3] { return x / (x - x); }", &[x]).unwrap_err();
    assert!(
        err.to_string().contains("integer division by zero"),
        "{err}"
    );
}

#[test]
fn reduced_precision_rounds_per_op() {
    let h = t(DType::F16, &[1], &[1.0]);
    expect(
        "fn f(x: f16[1]) -> f16[1] { return x + 0.0001; }",
        &[h],
        &[1],
        &[1.0],
    );
    let b = t(DType::BF16, &[1], &[1.0]);
    expect(
        "fn f(x: bf16[1]) -> bf16[1] { return x + 0.001; }",
        &[b],
        &[1],
        &[1.0],
    );
    let f = f32t(&[1], &[1.0]);
    expect(
        "fn f(x: f32[1]) -> f32[1] { return x + 0.0001; }",
        &[f],
        &[1],
        &[1.0001_f32 as f64],
    );
}

#[test]
fn user_operators_in_index_notation() {
    let ops = "
op matmul_t[M, N, K](a: f32[M, K], b: f32[N, K]) -> f32[M, N] {
    out[i, j] = sum[k](a[i, k] * b[j, k]);
}
op rowprod[M, N](x: f32[M, N]) -> f32[M] {
    out[i] = prod[j](x[i, j]);
}
op shift[N](x: f32[N]) -> f32[N] {
    out[i] = x[i + 1];
}
op head_sum[N](x: f32[N]) -> f32 {
    out[] = sum[k in 0..2](x[k]);
}
op conv3x3[N, C, H, W, O](img: f32[N, C, H, W], w: f32[O, C, 3, 3]) -> f32[N, O, H, W] {
    out[n, o, y, x] = sum[c, ky, kx](img[n, c, y + ky - 1, x + kx - 1] * w[o, c, ky, kx]);
}
";
    let a = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32t(&[1, 3], &[1.0, 0.0, -1.0]);
    expect(
        &format!(
            "{ops} fn f(a: f32[2, 3], b: f32[1, 3]) -> f32[2, 1] {{ return matmul_t(a, b); }}"
        ),
        &[a.clone(), b],
        &[2, 1],
        &[-2.0, -2.0],
    );
    expect(
        &format!("{ops} fn f(a: f32[2, 3]) -> f32[2] {{ return rowprod(a); }}"),
        &[a],
        &[2],
        &[6.0, 120.0],
    );
    let v = f32t(&[3], &[1.0, 2.0, 3.0]);
    expect(
        &format!("{ops} fn f(v: f32[3]) -> f32[3] {{ return shift(v); }}"),
        std::slice::from_ref(&v),
        &[3],
        &[2.0, 3.0, 0.0],
    );
    expect(
        &format!("{ops} fn f(v: f32[3]) -> f32 {{ return head_sum(v); }}"),
        &[v],
        &[],
        &[3.0],
    );
    let ones = f32t(&[1, 1, 3, 3], &[1.0; 9]);
    expect(
        &format!(
            "{ops} fn f(x: f32[1, 1, 3, 3], w: f32[1, 1, 3, 3]) -> f32[1, 1, 3, 3] {{ return conv3x3(x, w); }}"
        ),
        &[ones.clone(), ones],
        &[1, 1, 3, 3],
        &[4.0, 6.0, 4.0, 6.0, 9.0, 6.0, 4.0, 6.0, 4.0],
    );
}

#[test]
fn names_can_be_rebound() {
    let x = f32t(&[2], &[1.0, -2.0]);
    expect(
        "fn f(x: f32[2]) -> f32[2] { let h = relu(x); let h = h * .5 + 1; let x = h + x; return x; }",
        &[x],
        &[2],
        &[2.5, -1.0],
    );
}

#[test]
fn tuples_come_back_in_order() {
    let x = f32t(&[2], &[1.0, 2.0]);
    let out = eval(
        "fn f(x: f32[2]) -> (f32[2], f32) { return (x * 2.0, sum(x)); }",
        &[x],
    )
    .unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].data, vec![2.0, 4.0]);
    assert_eq!(out[1].data, vec![3.0]);
}

#[test]
fn arguments_of_the_wrong_type_are_errors() {
    let wrong = f32t(&[3], &[1.0, 2.0, 3.0]);
    let err = eval("fn f(x: f32[2]) -> f32[2] { return x; }", &[wrong]).unwrap_err();
    assert!(
        err.to_string().contains("must be f32[2], got f32[3]"),
        "{err}"
    );
    let err = eval("fn f(x: f32[2]) -> f32[2] { return x; }", &[]).unwrap_err();
    assert!(
        err.to_string().contains("takes 1 argument(s), got 0"),
        "{err}"
    );
}

#[test]
fn tensor_literals_hold_every_element() {
    expect(
        "fn f(x: f32[2, 3]) -> f32[2, 3] {
            return x + tensor([1.5, -2, 0.25, 1e-3, -0.0, 3], [2, 3]);
        }",
        &[f32t(&[2, 3], &[1.0; 6])],
        &[2, 3],
        &[2.5, -1.0, 1.25, 1.001, 1.0, 4.0],
    );
    // Integers by default, bool from true/false, scalars with shape [].
    expect(
        "fn f(x: i64[3]) -> i64[3] {
            return where(tensor([true, false, true], [3]), x * tensor([7], []), tensor([1, 2, 3], [3]));
        }",
        &[t(DType::I64, &[3], &[1.0, 2.0, 3.0])],
        &[3],
        &[7.0, 2.0, 21.0],
    );
    // Values are rounded to the type; inf and nan are written by name.
    let out = eval(
        "fn f(x: f16[3]) -> f16[3] { return x + tensor([0.1, inf, -nan], [3], dtype=f16); }",
        &[t(DType::F16, &[3], &[0.0; 3])],
    )
    .unwrap();
    assert_eq!(out[0].data[0], DType::F16.round(0.1));
    assert_eq!(out[0].data[1], f64::INFINITY);
    assert!(out[0].data[2].is_nan());
}

#[test]
fn prod_reduces_like_sum() {
    expect(
        "fn f(x: f32[2, 3]) -> f32[2] { return prod(x, axis=1); }",
        &[f32t(&[2, 3], &[1.0, 2.0, 3.0, -1.0, 0.5, 4.0])],
        &[2],
        &[6.0, -2.0],
    );
}

#[test]
fn integers_wrap_at_their_width_and_unsigned_ones_compare_unsigned() {
    let a = t(DType::U8, &[4], &[250.0, 3.0, 200.0, 0.0]);
    let c = t(DType::I8, &[4], &[100.0, -100.0, -128.0, 7.0]);
    // 250 + 10 = 4, 3 + 10 = 13, 200 + 10 = 210, 0 + 10 = 10; then - 20.
    expect(
        "fn f(a: u8[4]) -> u8[4] { return a + 10 - 20; }",
        std::slice::from_ref(&a),
        &[4],
        &[240.0, 249.0, 190.0, 246.0],
    );
    expect(
        "fn f(a: u8[4]) -> bool[4] { return a > 100; }",
        std::slice::from_ref(&a),
        &[4],
        &[1.0, 0.0, 1.0, 0.0],
    );
    expect(
        "fn f(a: u8[4]) -> i32[4] { return cast(a, i32) + cast(cast(a, i8), i32); }",
        std::slice::from_ref(&a),
        &[4],
        // 250 + (-6), 3 + 3, 200 + (-56), 0.
        &[244.0, 6.0, 144.0, 0.0],
    );
    expect(
        "fn f(c: i8[4]) -> i8[4] { return c * 2; }",
        std::slice::from_ref(&c),
        &[4],
        &[-56.0, 56.0, 0.0, 14.0],
    );
    expect(
        "fn f(c: i8[4]) -> u8[4] { return cast(c, u8) / 3; }",
        &[c],
        &[4],
        // 100 / 3, 156 / 3, 128 / 3, 7 / 3: unsigned division.
        &[33.0, 52.0, 42.0, 2.0],
    );
}

#[test]
fn bitwise_operators_and_shifts() {
    let a = t(DType::U8, &[4], &[202.0, 15.0, 255.0, 1.0]);
    let b = t(DType::U8, &[4], &[170.0, 85.0, 4.0, 8.0]);
    let src = |e: &str| format!("fn f(a: u8[4], b: u8[4]) -> u8[4] {{ return {e}; }}");
    let ab = [a.clone(), b.clone()];
    expect(
        &src("bitand(a, b)"),
        &ab,
        &[4],
        &[0b1000_1010 as f64, 5.0, 4.0, 0.0],
    );
    expect(
        &src("bitor(a, b)"),
        &ab,
        &[4],
        &[0b1110_1010 as f64, 0b0101_1111 as f64, 255.0, 9.0],
    );
    expect(
        &src("bitxor(a, b)"),
        &ab,
        &[4],
        &[0b0110_0000 as f64, 0b0101_1010 as f64, 251.0, 9.0],
    );
    // Shifts by 1 keep the low 8 bits; by 8 or more every bit goes.
    expect(
        &src("shl(a, 1)"),
        &ab,
        &[4],
        &[0b1001_0100 as f64, 30.0, 254.0, 2.0],
    );
    expect(&src("shl(a, b)"), &ab, &[4], &[0.0, 0.0, 240.0, 0.0]);
    expect(&src("shr(a, b)"), &ab, &[4], &[0.0, 0.0, 15.0, 0.0]);
    // Signed: arithmetic right shifts, and negative amounts shift all out.
    let c = t(DType::I8, &[4], &[-128.0, -7.0, 64.0, 5.0]);
    let s = t(DType::I8, &[4], &[3.0, 9.0, 1.0, -1.0]);
    expect(
        "fn f(c: i8[4], s: i8[4]) -> i8[4] { return shr(c, s); }",
        &[c.clone(), s.clone()],
        &[4],
        &[-16.0, -1.0, 32.0, 0.0],
    );
    expect(
        "fn f(c: i8[4], s: i8[4]) -> i8[4] { return shl(c, s); }",
        &[c, s],
        &[4],
        &[0.0, 0.0, -128.0, 0.0],
    );
    let err = eval("fn f(x: f32[4]) -> f32[4] { return bitand(x, x); }", &[]).unwrap_err();
    assert!(err.to_string().contains("integer"), "{err}");
}

/// NumPy float64: x * tanh(log1p(exp(x))) of [-2, -0.5, 0, 3].
const MISH: [f64; 4] = [
    -0.252_501_482_695_708_9,
    -0.220_743_774_651_73,
    0.0,
    2.986_535_004_967_957,
];

#[test]
fn composite_activations_and_logical_operators() {
    let x = || f32t(&[4], &[-2.0, -0.5, 0.0, 3.0]);
    let run = |e: &str| format!("fn f(x: f32[4]) -> f32[4] {{ return {e}; }}");
    expect(
        &run("leaky_relu(x, alpha=0.1)"),
        &[x()],
        &[4],
        &[-0.2, -0.05, 0.0, 3.0],
    );
    expect(&run("hardsigmoid(x)"), &[x()], &[4], &[0.1, 0.4, 0.5, 1.0]);
    // x * relu6(x + 3) / 6
    expect(
        &run("hardswish(x)"),
        &[x()],
        &[4],
        &[-1.0 / 3.0, -0.5 * 2.5 / 6.0, 0.0, 3.0],
    );
    expect(
        &run("clamp(x, -1.0, 1.0)"),
        &[x()],
        &[4],
        &[-1.0, -0.5, 0.0, 1.0],
    );
    // NumPy float64: elu, softplus, mish of [-2, -0.5, 0, 3].
    expect(
        &run("elu(x)"),
        &[x()],
        &[4],
        &[-0.864_664_716_763_387_3, -0.393_469_340_287_366_6, 0.0, 3.0],
    );
    expect(
        &run("softplus(x)"),
        &[x()],
        &[4],
        &[
            0.126_928_011_042_972_1,
            0.474_076_984_180_949_4,
            std::f64::consts::LN_2,
            3.048_587_351_573_742,
        ],
    );
    expect(&run("mish(x)"), &[x()], &[4], &MISH);
    // log1p and expm1 keep small arguments exact where log(1 + x) would not.
    let tiny = f32t(&[2], &[1e-7, 0.5]);
    let out = eval(
        "fn f(x: f32[2]) -> (f32[2], f32[2]) { return (log1p(x), expm1(x)); }",
        &[tiny],
    )
    .unwrap();
    assert!((out[0].data[0] - 1e-7).abs() < 1e-13, "{:?}", out[0].data);
    assert!((out[0].data[1] - 0.405_465_108_108_164_4).abs() < 1e-7);
    assert!((out[1].data[0] - 1e-7).abs() < 1e-13, "{:?}", out[1].data);
    assert!((out[1].data[1] - 0.648_721_270_700_128_2).abs() < 1e-7);
    let special = f32t(&[3], &[f64::NAN, f64::INFINITY, 1.0]);
    let b = |e: &str| format!("fn f(x: f32[3]) -> bool[3] {{ return {e}; }}");
    expect(
        &b("isnan(x)"),
        std::slice::from_ref(&special),
        &[3],
        &[1.0, 0.0, 0.0],
    );
    expect(
        &b("isinf(x)"),
        std::slice::from_ref(&special),
        &[3],
        &[0.0, 1.0, 0.0],
    );
    expect(
        &b("logical_xor(isnan(x), logical_not(isinf(x)))"),
        &[special],
        &[3],
        &[0.0, 0.0, 1.0],
    );
}

#[test]
fn composite_shapes_reductions_and_indices() {
    let m = || f32t(&[2, 3], &[1.0, 5.0, 2.0, 7.0, 0.0, 7.0]);
    let run = |ret: &str, e: &str| format!("fn f(x: f32[2, 3]) -> {ret} {{ return {e}; }}");
    expect(
        &run("f32[3, 4]", "reshape(stack([x, x], axis=2), [3, 4])"),
        &[m()],
        &[3, 4],
        &[1.0, 1.0, 5.0, 5.0, 2.0, 2.0, 7.0, 7.0, 0.0, 0.0, 7.0, 7.0],
    );
    expect(
        &run("f32[1, 2, 3]", "unsqueeze(x, axis=0)"),
        &[m()],
        &[1, 2, 3],
        &[1.0, 5.0, 2.0, 7.0, 0.0, 7.0],
    );
    expect(
        &run("f32[2, 6]", "tile(x, [1, 2])"),
        &[m()],
        &[2, 6],
        &[1.0, 5.0, 2.0, 1.0, 5.0, 2.0, 7.0, 0.0, 7.0, 7.0, 0.0, 7.0],
    );
    // The first maximum and minimum.
    expect(
        &run("i64[2]", "argmax(x, axis=1)"),
        &[m()],
        &[2],
        &[1.0, 0.0],
    );
    expect(
        &run("i64[3]", "argmin(x, axis=0)"),
        &[m()],
        &[3],
        &[0.0, 1.0, 0.0],
    );
    expect(
        &run("f32[2]", "variance(x, axis=1)"),
        &[m()],
        &[2],
        &[26.0 / 9.0, 98.0 / 9.0],
    );
    expect(
        &run("f32[2]", "l1_norm(x, axis=1)"),
        &[m()],
        &[2],
        &[8.0, 14.0],
    );
    expect(
        &run("f32[3]", "l2_norm(x, axis=0)"),
        &[m()],
        &[3],
        &[50f64.sqrt(), 5.0, 53f64.sqrt()],
    );
    // log(e^1 + e^5 + e^2) in float64.
    expect(
        &run("f32[2, 1]", "logsumexp(x, axis=1, keepdims=true)"),
        &[m()],
        &[2, 1],
        &[5.065_883_903_757_429, 7.693_603_017_633_216],
    );
    expect(
        &run("f32[2, 3]", "tril(x)"),
        &[m()],
        &[2, 3],
        &[1.0, 0.0, 0.0, 7.0, 0.0, 0.0],
    );
    expect(
        &run("f32[2, 3]", "triu(x, k=1)"),
        &[m()],
        &[2, 3],
        &[0.0, 5.0, 2.0, 0.0, 0.0, 7.0],
    );
    let i = t(DType::I64, &[3], &[1.0, -2.0, 5.0]);
    // Index -2 is row 0; index 5 is out of range and reads zeros.
    expect(
        "fn f(x: f32[2, 3], i: i64[3]) -> f32[3, 3] { return gather(x, i, axis=0); }",
        &[m(), i.clone()],
        &[3, 3],
        &[7.0, 0.0, 7.0, 1.0, 5.0, 2.0, 0.0, 0.0, 0.0],
    );
    expect(
        "fn f(i: i64[3]) -> f32[3, 2] { return one_hot(i, 2); }",
        &[i],
        &[3, 2],
        &[0.0, 1.0, 0.0, 0.0, 0.0, 0.0],
    );
    expect(
        "fn f() -> f32[4] { return arange(0.5, 2.5, step=0.5); }",
        &[],
        &[4],
        &[0.5, 1.0, 1.5, 2.0],
    );
    let out = eval(
        "fn f(x: f32[2, 3]) -> (f32[2, 1], f32[2, 2]) { return split(x, [1, 2], axis=1); }",
        &[m()],
    )
    .unwrap();
    assert_eq!(out[0].data, [1.0, 7.0]);
    assert_eq!(out[1].data, [5.0, 2.0, 0.0, 7.0]);
    let err = eval(
        "fn f(x: f32[2, 3]) -> f32[3] { return squeeze(x, axis=0); }",
        &[m()],
    )
    .unwrap_err();
    assert!(err.to_string().contains("has extent 2, not 1"), "{err}");
}

#[test]
fn composite_windows_running_sums_and_selections() {
    let v = || f32t(&[1, 1, 4], &[1.0, 3.0, 2.0, 5.0]);
    // A 1-D convolution with taps (1, 1), padded by one on each side.
    let w = f32t(&[1, 1, 2], &[1.0, 1.0]);
    expect(
        "fn f(x: f32[1, 1, 4], w: f32[1, 1, 2]) -> f32[1, 1, 5] { return conv1d(x, w, padding=1); }",
        &[v(), w],
        &[1, 1, 5],
        &[1.0, 4.0, 5.0, 7.0, 5.0],
    );
    expect(
        "fn f(x: f32[1, 1, 4]) -> f32[1, 1, 2] { return maxpool1d(x, 2); }",
        &[v()],
        &[1, 1, 2],
        &[3.0, 5.0],
    );
    let r = |e: &str| format!("fn f(x: f32[1, 1, 4]) -> f32[1, 1, 4] {{ return {e}; }}");
    expect(
        &r("cumsum(x, 2)"),
        &[v()],
        &[1, 1, 4],
        &[1.0, 4.0, 6.0, 11.0],
    );
    expect(
        &r("cumsum(x, 2, exclusive=true, reverse=true)"),
        &[v()],
        &[1, 1, 4],
        &[10.0, 7.0, 5.0, 0.0],
    );
    expect(
        "fn f(x: f32[1, 1, 4]) -> f32[1, 2, 5] { return pad(x, [0, 0, 1, 0, 0, 1], value=9.0); }",
        &[v()],
        &[1, 2, 5],
        &[9.0, 9.0, 9.0, 9.0, 9.0, 1.0, 3.0, 2.0, 5.0, 9.0],
    );
    let out = eval(
        "fn f(x: f32[1, 1, 4]) -> (f32[1, 1, 2], i64[1, 1, 2]) { return topk(x, 2); }",
        &[v()],
    )
    .unwrap();
    assert_eq!(out[0].data, [5.0, 3.0]);
    assert_eq!(out[1].data, [3.0, 1.0]);
    let out = eval(
        "fn f(x: f32[1, 1, 4]) -> (f32[1, 1, 2], i64[1, 1, 2]) { return topk(x, 2, largest=false); }",
        &[v()],
    )
    .unwrap();
    assert_eq!(out[0].data, [1.0, 2.0]);
    assert_eq!(out[1].data, [0.0, 2.0]);
    let i = t(DType::I64, &[1, 1, 3], &[3.0, -4.0, 1.0]);
    expect(
        "fn f(x: f32[1, 1, 4], i: i64[1, 1, 3]) -> f32[1, 1, 3] { return gather_elements(x, i, axis=2); }",
        &[v(), i],
        &[1, 1, 3],
        &[5.0, 1.0, 3.0],
    );
    // gemm: 0.5 * a^T b + 2 c
    let a = f32t(&[2, 1], &[1.0, 2.0]);
    let b = f32t(&[2, 1], &[3.0, 4.0]);
    let c = f32t(&[1, 1], &[1.0]);
    expect(
        "fn f(a: f32[2, 1], b: f32[2, 1], c: f32[1, 1]) -> f32[1, 1] { return gemm(a, b, c, alpha=0.5, beta=2.0, trans_a=true); }",
        &[a, b, c],
        &[1, 1],
        &[7.5],
    );
    // Each group (two channels of two elements) normalized on its own.
    let x = f32t(&[1, 4, 2], &[1.0, 3.0, 1.0, 3.0, 0.0, 4.0, 0.0, 4.0]);
    let ones = f32t(&[4], &[1.0; 4]);
    let zeros = f32t(&[4], &[0.0; 4]);
    expect(
        "fn f(x: f32[1, 4, 2], g: f32[4], b: f32[4]) -> f32[1, 4, 2] { return group_norm(x, 2, g, b, eps=0.0); }",
        &[x, ones, zeros],
        &[1, 4, 2],
        &[-1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0],
    );
}

/// `conv3d` (2-D convolutions of the frames its temporal taps read, joined
/// along the channels) computes the window sum it names, written in index
/// notation: strided in time and space, padded, dilated in time, grouped,
/// with temporal taps that read only padding (left out), and strides in
/// time whose last frames run past the padded clip.
#[test]
fn video_convolutions_are_the_window_sums_they_name() {
    let data = |n: usize, salt: usize| -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 37 + salt * 11) % 101) as f64 / 50.0 - 1.0)
            .collect()
    };
    // x [N, C, T, H, W], w [O, C / G, KT, KH, KW], stride, padding, dilation, groups.
    type Case = (
        [usize; 5],
        [usize; 5],
        [usize; 3],
        [usize; 3],
        [usize; 3],
        usize,
    );
    let cases: [Case; 5] = [
        (
            [2, 3, 5, 6, 7],
            [4, 3, 3, 3, 3],
            [2, 1, 2],
            [1, 1, 1],
            [1, 1, 1],
            1,
        ),
        (
            [1, 4, 3, 5, 5],
            [4, 2, 3, 1, 3],
            [1, 1, 1],
            [2, 0, 1],
            [2, 1, 1],
            2,
        ),
        (
            [1, 2, 1, 4, 4],
            [3, 2, 3, 3, 3],
            [1, 1, 1],
            [1, 1, 1],
            [1, 1, 1],
            1,
        ),
        (
            [1, 2, 4, 3, 3],
            [2, 2, 3, 1, 1],
            [2, 1, 1],
            [1, 0, 0],
            [1, 1, 1],
            1,
        ),
        (
            [1, 2, 7, 3, 3],
            [2, 2, 2, 1, 1],
            [3, 1, 1],
            [0, 0, 0],
            [2, 1, 1],
            1,
        ),
    ];
    for (x, w, s, p, d, g) in cases {
        let out: Vec<usize> = (0..3)
            .map(|a| (x[2 + a] + 2 * p[a] - d[a] * (w[2 + a] - 1) - 1) / s[a] + 1)
            .collect();
        let list = |v: &[usize]| {
            let items: Vec<String> = v.iter().map(usize::to_string).collect();
            format!("[{}]", items.join(", "))
        };
        let (cg, og) = (x[1] / g, w[0] / g);
        let index: Vec<String> = (0..3)
            .map(|a| format!("{} * y{a} + {} * k{a} - {}", s[a], d[a], p[a]))
            .collect();
        let mut inner = vec![x[0], g, cg];
        inner.extend(&x[2..]);
        let mut weights = vec![g, og, cg];
        weights.extend(&w[2..]);
        let mut result = vec![x[0], g, og];
        result.extend(&out);
        let mut full = vec![x[0], w[0]];
        full.extend(&out);
        let src = format!(
            "op window(inp: f32{inner}, wt: f32{weights}) -> f32{result} {{
    out[n, g, o, y0, y1, y2] = sum[c, k0, k1, k2](inp[n, g, c, {i}] * wt[g, o, c, k0, k1, k2]);
}}
fn f(x: f32{xs}, w: f32{ws}) -> (f32{fs}, f32{fs}) {{
    let named = reshape(window(reshape(x, {inner}), reshape(w, {weights})), {fs});
    return (conv3d(x, w, stride={st}, padding={pa}, dilation={di}, groups={g}), named);
}}",
            inner = list(&inner),
            weights = list(&weights),
            result = list(&result),
            i = index.join(", "),
            xs = list(&x),
            ws = list(&w),
            fs = list(&full),
            st = list(&s),
            pa = list(&p),
            di = list(&d),
        );
        let (nx, nw) = (x.iter().product(), w.iter().product());
        let got = eval(&src, &[f32t(&x, &data(nx, 1)), f32t(&w, &data(nw, 2))])
            .unwrap_or_else(|e| panic!("{e}\n{src}"));
        assert_eq!(got[0].ty.shape, full, "{src}");
        let scale = got[1].data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(scale > 0.5, "{src}");
        for (i, (a, b)) in got[0].data.iter().zip(&got[1].data).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "element {i}: {a} against {b}\n{src}"
            );
        }
    }
    // Strided past the clip: no output frame reads it, every output is 0.
    let got = eval(
        "fn f(x: f32[1, 2, 1, 3, 3], w: f32[2, 2, 1, 1, 1]) -> f32[1, 2, 2, 3, 3] { return conv3d(x, w, stride=[4, 1, 1], padding=[2, 0, 0]); }",
        &[f32t(&[1, 2, 1, 3, 3], &data(18, 1)), f32t(&[2, 2, 1, 1, 1], &data(4, 2))],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        got[0].data.len() == 36 && got[0].data.iter().all(|&v| v == 0.0),
        "{:?}",
        got[0].data
    );
}
