//! ONNX operators that the importer writes as compositions of built-ins or
//! as helper operators, each as a one-node model run on the reference
//! interpreter against values worked out by hand (NumPy float64 where
//! transcendental). ONNX's own node tests (`make onnx-tests`) cover them
//! more widely; these are the ones `make test` keeps.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::{DType, TensorType};
use dlc_driver::{
    DEFAULT_PIPELINE, PassOptions, SourceText, compile_source, interpret, run_passes, select_entry,
};
use dlc_onnx::pb;
use dlc_runtime::HostTensor;
use prost::Message as _;

/// An attribute of a node.
enum A {
    I(i64),
    F(f32),
    Is(Vec<i64>),
    S(&'static str),
}

fn attr(name: &str, a: A) -> pb::AttributeProto {
    use pb::attribute_proto::AttributeType as T;
    let mut p = pb::AttributeProto {
        name: Some(name.into()),
        ..Default::default()
    };
    match a {
        A::I(i) => {
            p.i = Some(i);
            p.set_type(T::Int);
        }
        A::F(f) => {
            p.f = Some(f);
            p.set_type(T::Float);
        }
        A::Is(v) => {
            p.ints = v;
            p.set_type(T::Ints);
        }
        A::S(s) => {
            p.s = Some(s.as_bytes().to_vec());
            p.set_type(T::String);
        }
    }
    p
}

fn onnx_type(d: DType) -> i32 {
    dlc_onnx::onnx_code(d)
}

/// A tensor given to the model: an input (`init: false`) or an initializer.
#[derive(Clone)]
struct T {
    name: &'static str,
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<f64>,
    init: bool,
}

fn input(name: &'static str, dtype: DType, shape: &[usize], data: &[f64]) -> T {
    T {
        name,
        dtype,
        shape: shape.to_vec(),
        data: data.to_vec(),
        init: false,
    }
}

fn init(name: &'static str, dtype: DType, shape: &[usize], data: &[f64]) -> T {
    T {
        init: true,
        ..input(name, dtype, shape, data)
    }
}

/// Runs `y = op(inputs...)` (opset 21) on the interpreter.
fn run(op: &str, tensors: &[T], attrs: Vec<pb::AttributeProto>) -> HostTensor {
    run_n(op, tensors, attrs, 1).remove(0)
}

/// Runs `y0, y1, ... = op(inputs...)` with `n` outputs.
fn run_n(op: &str, tensors: &[T], attrs: Vec<pb::AttributeProto>, n: usize) -> Vec<HostTensor> {
    let (m, args) = optimized(op, tensors, attrs, n);
    let f = select_entry(&m, None).unwrap();
    interpret(&m, f, &args).unwrap()
}

/// `op(inputs...)` with `n` outputs imported and optimized, and the
/// arguments its inputs take.
fn optimized(
    op: &str,
    tensors: &[T],
    attrs: Vec<pb::AttributeProto>,
    n: usize,
) -> (dlc_graph::Module, Vec<HostTensor>) {
    let (imported, args) = import_n(op, tensors, attrs, n);
    let mut m = compile_source(&SourceText {
        name: "model.onnx".into(),
        text: imported.source.clone(),
        weights: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", imported.source));
    run_passes(&mut m, DEFAULT_PIPELINE, PassOptions::default()).unwrap();
    (m, args)
}

/// `y0, y1, ... = op(inputs...)` with `n` outputs (opset 21) imported, or
/// the importer's error, and the arguments its inputs take.
fn try_import_n(
    op: &str,
    tensors: &[T],
    attrs: Vec<pb::AttributeProto>,
    n: usize,
) -> (
    Result<dlc_onnx::Imported, dlc_onnx::ImportError>,
    Vec<HostTensor>,
) {
    let outputs: Vec<String> = (0..n)
        .map(|i| if i == 0 { "y".into() } else { format!("y{i}") })
        .collect();
    let mut graph = pb::GraphProto {
        name: Some("g".into()),
        node: vec![pb::NodeProto {
            op_type: Some(op.into()),
            input: tensors.iter().map(|t| t.name.to_string()).collect(),
            output: outputs.clone(),
            attribute: attrs,
            ..Default::default()
        }],
        output: outputs
            .iter()
            .map(|o| pb::ValueInfoProto {
                name: Some(o.clone()),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let mut args = Vec::new();
    for t in tensors.iter().filter(|t| !t.name.is_empty()) {
        if t.init {
            let mut p = pb::TensorProto {
                name: Some(t.name.into()),
                dims: t.shape.iter().map(|&d| d as i64).collect(),
                data_type: Some(onnx_type(t.dtype)),
                ..Default::default()
            };
            match t.dtype {
                DType::I64 => p.int64_data = t.data.iter().map(|&v| v as i64).collect(),
                DType::F32 => p.float_data = t.data.iter().map(|&v| v as f32).collect(),
                _ => p.int32_data = t.data.iter().map(|&v| v as i32).collect(),
            }
            graph.initializer.push(p);
        } else {
            let dims = t
                .shape
                .iter()
                .map(|&d| pb::tensor_shape_proto::Dimension {
                    value: Some(pb::tensor_shape_proto::dimension::Value::DimValue(d as i64)),
                    ..Default::default()
                })
                .collect();
            graph.input.push(pb::ValueInfoProto {
                name: Some(t.name.into()),
                r#type: Some(pb::TypeProto {
                    value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                        elem_type: Some(onnx_type(t.dtype)),
                        shape: Some(pb::TensorShapeProto { dim: dims }),
                    })),
                    ..Default::default()
                }),
                ..Default::default()
            });
            args.push(
                HostTensor::new(TensorType::new(t.dtype, t.shape.clone()), t.data.clone()).unwrap(),
            );
        }
    }
    let model = pb::ModelProto {
        ir_version: Some(10),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(21),
        }],
        graph: Some(graph),
        ..Default::default()
    };
    let imported = dlc_onnx::import(&model.encode_to_vec(), &dlc_onnx::Options::default());
    (imported, args)
}

/// `y0, y1, ... = op(inputs...)` imported, and the arguments its inputs
/// take; the importer must accept it.
fn import_n(
    op: &str,
    tensors: &[T],
    attrs: Vec<pb::AttributeProto>,
    n: usize,
) -> (dlc_onnx::Imported, Vec<HostTensor>) {
    let (imported, args) = try_import_n(op, tensors, attrs, n);
    (imported.unwrap(), args)
}

/// The importer's message for `y = op(inputs...)`, which it must reject.
fn import_error(op: &str, tensors: &[T], attrs: Vec<pb::AttributeProto>) -> String {
    match try_import_n(op, tensors, attrs, 1).0 {
        Ok(imported) => panic!("{op} was imported:\n{}", imported.source),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
fn expect(got: &HostTensor, shape: &[usize], want: &[f64]) {
    assert_eq!(got.ty.shape, shape);
    for (i, (g, w)) in got.data.iter().zip(want).enumerate() {
        assert!(
            g == w || (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "element {i}: got {g}, want {w}: {:?}",
            got.data
        );
    }
}

const F: DType = DType::F32;
const L: DType = DType::I64;

#[test]
fn erf_and_exact_gelu() {
    let x = || input("x", F, &[3], &[0.0, 0.5, -1.0]);
    expect(
        &run("Erf", &[x()], vec![]),
        &[3],
        &[0.0, 0.520_499_877_813_046_5, -0.842_700_792_949_714_9],
    );
    expect(
        &run("Gelu", &[x()], vec![]),
        &[3],
        &[0.0, 0.345_731_422_320_952_4, -0.158_655_253_931_457_05],
    );
}

#[test]
fn argmax_argmin_and_hardmax_take_the_first_or_last_extreme() {
    let x = || input("x", F, &[2, 3], &[1.0, 3.0, 3.0, 2.0, 0.0, 1.0]);
    expect(
        &run(
            "ArgMax",
            &[x()],
            vec![attr("axis", A::I(1)), attr("keepdims", A::I(0))],
        ),
        &[2],
        &[1.0, 0.0],
    );
    expect(
        &run(
            "ArgMax",
            &[x()],
            vec![attr("axis", A::I(1)), attr("select_last_index", A::I(1))],
        ),
        &[2, 1],
        &[2.0, 0.0],
    );
    expect(
        &run("ArgMin", &[x()], vec![attr("axis", A::I(0))]),
        &[1, 3],
        &[0.0, 1.0, 1.0],
    );
    expect(
        &run("Hardmax", &[x()], vec![]),
        &[2, 3],
        &[0.0, 1.0, 0.0, 1.0, 0.0, 0.0],
    );
}

#[test]
fn trilu_cumsum_and_one_hot_use_constant_masks() {
    let x = input(
        "x",
        F,
        &[3, 3],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    );
    let k = init("k", L, &[], &[1.0]);
    expect(
        &run("Trilu", &[x, k], vec![]),
        &[3, 3],
        &[0.0, 2.0, 3.0, 0.0, 0.0, 6.0, 0.0, 0.0, 0.0],
    );
    let x = input("x", F, &[3], &[1.0, 2.0, 3.0]);
    let axis = init("axis", L, &[], &[0.0]);
    expect(
        &run(
            "CumSum",
            &[x, axis],
            vec![attr("exclusive", A::I(1)), attr("reverse", A::I(1))],
        ),
        &[3],
        &[5.0, 3.0, 0.0],
    );
    let ind = input("ind", L, &[3], &[0.0, -1.0, 2.0]);
    let depth = init("depth", L, &[], &[3.0]);
    let values = init("values", F, &[2], &[0.0, 5.0]);
    expect(
        &run("OneHot", &[ind, depth, values], vec![]),
        &[3, 3],
        &[5.0, 0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 5.0],
    );
}

#[test]
fn integer_mod_and_fmod_follow_the_divisor_and_the_dividend() {
    let a = || input("a", L, &[2], &[-7.0, 7.0]);
    let b = || input("b", L, &[2], &[3.0, -3.0]);
    expect(&run("Mod", &[a(), b()], vec![]), &[2], &[2.0, -2.0]);
    expect(
        &run("Mod", &[a(), b()], vec![attr("fmod", A::I(1))]),
        &[2],
        &[-1.0, 1.0],
    );
    let (a, b) = (
        input("a", F, &[2], &[-7.5, 7.5]),
        input("b", F, &[2], &[2.0, 2.0]),
    );
    expect(
        &run("Mod", &[a, b], vec![attr("fmod", A::I(1))]),
        &[2],
        &[-1.5, 1.5],
    );
}

#[test]
fn gathers_with_run_time_indices_select_exactly() {
    let x = || input("x", F, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let ind = input("ind", L, &[2], &[2.0, -3.0]);
    expect(
        &run("Gather", &[x(), ind], vec![]),
        &[2, 2],
        &[5.0, 6.0, 1.0, 2.0],
    );
    let ind = input("ind", L, &[2, 1], &[1.0, 0.0]);
    expect(
        &run("Gather", &[x(), ind], vec![attr("axis", A::I(1))]),
        &[3, 2, 1],
        &[2.0, 1.0, 4.0, 3.0, 6.0, 5.0],
    );
    let ind = input("ind", L, &[2, 2], &[0.0, 0.0, 2.0, 1.0]);
    expect(
        &run("GatherElements", &[x(), ind], vec![attr("axis", A::I(0))]),
        &[2, 2],
        &[1.0, 2.0, 5.0, 4.0],
    );
}

#[test]
fn layouts_pads_and_slices() {
    let x = input("x", F, &[1, 4, 1, 1], &[0.0, 1.0, 2.0, 3.0]);
    expect(
        &run(
            "DepthToSpace",
            &[x],
            vec![attr("blocksize", A::I(2)), attr("mode", A::S("DCR"))],
        ),
        &[1, 1, 2, 2],
        &[0.0, 1.0, 2.0, 3.0],
    );
    let x = input("x", F, &[1, 2], &[1.0, 2.0]);
    let pads = init("pads", L, &[4], &[1.0, 0.0, 0.0, 1.0]);
    let value = init("value", F, &[], &[9.0]);
    expect(
        &run("Pad", &[x, pads, value], vec![]),
        &[2, 3],
        &[9.0, 9.0, 9.0, 1.0, 2.0, 9.0],
    );
    let x = input("x", F, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let starts = init("starts", L, &[1], &[-1.0]);
    let ends = init("ends", L, &[1], &[-9.0]);
    let axes = init("axes", L, &[1], &[0.0]);
    let steps = init("steps", L, &[1], &[-1.0]);
    expect(
        &run("Slice", &[x, starts, ends, axes, steps], vec![]),
        &[4],
        &[4.0, 3.0, 2.0, 1.0],
    );
    let x = input("x", F, &[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
    expect(
        &run(
            "MaxPool",
            &[x],
            vec![
                attr("kernel_shape", A::Is(vec![2])),
                attr("strides", A::Is(vec![2])),
                attr("pads", A::Is(vec![1, 1])),
            ],
        ),
        &[1, 1, 3],
        &[1.0, 3.0, 4.0],
    );
    let x = input("x", F, &[1, 1, 4], &[3.0, -4.0, 1.0, 2.0]);
    expect(
        &run(
            "LpPool",
            &[x],
            vec![
                attr("kernel_shape", A::Is(vec![2])),
                attr("strides", A::Is(vec![2])),
            ],
        ),
        &[1, 1, 2],
        &[5.0, 5f64.sqrt()],
    );
    let x = input("x", F, &[2, 2], &[-1.0, 1.0, 3.0, -4.0]);
    expect(
        &run(
            "LpNormalization",
            &[x],
            vec![attr("p", A::I(1)), attr("axis", A::I(1))],
        ),
        &[2, 2],
        &[-0.5, 0.5, 3.0 / 7.0, -4.0 / 7.0],
    );
    let x = input("x", F, &[2], &[-2.0, 0.5]);
    expect(
        &run("LeakyRelu", &[x], vec![attr("alpha", A::F(0.25))]),
        &[2],
        &[-0.5, 0.5],
    );
}

#[test]
fn resize_is_a_product_with_a_constant_interpolation_matrix() {
    let x = input("x", F, &[1, 1, 1, 2], &[1.0, 2.0]);
    let roi = init("roi", F, &[0], &[]);
    let scales = init("scales", F, &[4], &[1.0, 1.0, 1.0, 2.0]);
    expect(
        &run(
            "Resize",
            &[x, scales_only(roi), scales],
            vec![attr("mode", A::S("linear"))],
        ),
        &[1, 1, 1, 4],
        &[1.0, 1.25, 1.75, 2.0],
    );
    let x = input("x", F, &[1, 3], &[1.0, 2.0, 3.0]);
    let sizes = init("sizes", L, &[2], &[1.0, 6.0]);
    expect(
        &run(
            "Resize",
            &[x, init("", F, &[0], &[]), init("", F, &[0], &[]), sizes],
            vec![
                attr("coordinate_transformation_mode", A::S("asymmetric")),
                attr("nearest_mode", A::S("floor")),
            ],
        ),
        &[1, 6],
        &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0],
    );
}

/// An unused optional input (ONNX writes it as an empty name).
fn scales_only(t: T) -> T {
    T { name: "", ..t }
}

#[test]
fn conv_transpose_is_a_convolution_of_the_spread_input() {
    let x = || input("x", F, &[1, 1, 3], &[1.0, 2.0, 3.0]);
    let w = || input("w", F, &[1, 1, 2], &[1.0, 10.0]);
    expect(
        &run(
            "ConvTranspose",
            &[x(), w()],
            vec![attr("strides", A::Is(vec![2]))],
        ),
        &[1, 1, 6],
        &[1.0, 10.0, 2.0, 20.0, 3.0, 30.0],
    );
    expect(
        &run("ConvTranspose", &[x(), w()], vec![]),
        &[1, 1, 4],
        &[1.0, 12.0, 23.0, 30.0],
    );
    expect(
        &run(
            "ConvTranspose",
            &[x(), w()],
            vec![attr("pads", A::Is(vec![1, 0]))],
        ),
        &[1, 1, 3],
        &[12.0, 23.0, 30.0],
    );
}

#[test]
fn reflect_edge_and_wrap_pads_copy_the_input() {
    let pads = || init("pads", L, &[2], &[2.0, 1.0]);
    for (mode, want) in [
        ("reflect", [3.0, 2.0, 1.0, 2.0, 3.0, 2.0]),
        ("edge", [1.0, 1.0, 1.0, 2.0, 3.0, 3.0]),
        ("wrap", [2.0, 3.0, 1.0, 2.0, 3.0, 1.0]),
    ] {
        let x = input("x", F, &[3], &[1.0, 2.0, 3.0]);
        expect(
            &run("Pad", &[x, pads()], vec![attr("mode", A::S(mode))]),
            &[6],
            &want,
        );
    }
}

#[test]
fn attention_masks_rows_causally_and_zeroes_fully_masked_ones() {
    let q = || input("q", F, &[1, 1, 2, 2], &[1.0, 2.0, 0.0, 0.0]);
    let k = || input("k", F, &[1, 1, 2, 2], &[3.0, 1.0, 2.0, 5.0]);
    let v = || input("v", F, &[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    // Row 0 sees key 0 only; row 1's scores are equal, so it averages.
    expect(
        &run(
            "Attention",
            &[q(), k(), v()],
            vec![attr("is_causal", A::I(1))],
        ),
        &[1, 1, 2, 2],
        &[1.0, 2.0, 2.0, 3.0],
    );
    // A window of no keys before or after: each query sees its own key.
    expect(
        &run(
            "Attention",
            &[q(), k(), v()],
            vec![
                attr("left_window_size", A::I(0)),
                attr("right_window_size", A::I(0)),
            ],
        ),
        &[1, 1, 2, 2],
        &[1.0, 2.0, 3.0, 4.0],
    );
    let mask = input("mask", DType::Bool, &[2, 2], &[0.0, 0.0, 1.0, 1.0]);
    expect(
        &run("Attention", &[q(), k(), v(), mask], vec![]),
        &[1, 1, 2, 2],
        &[0.0, 0.0, 2.0, 3.0],
    );
}

#[test]
fn nll_loss_weighs_and_ignores_labels() {
    let x = || input("x", F, &[2, 3], &[-1.0, -2.0, -3.0, -0.5, -1.5, -2.5]);
    let t = || input("t", L, &[2], &[2.0, 0.0]);
    let w = || init("w", F, &[3], &[1.0, 2.0, 3.0]);
    let none = || attr("reduction", A::S("none"));
    expect(
        &run("NegativeLogLikelihoodLoss", &[x(), t(), w()], vec![none()]),
        &[2],
        &[9.0, 0.5],
    );
    expect(
        &run("NegativeLogLikelihoodLoss", &[x(), t(), w()], vec![]),
        &[],
        &[9.5 / 4.0],
    );
    expect(
        &run(
            "NegativeLogLikelihoodLoss",
            &[x(), t(), w()],
            vec![attr("ignore_index", A::I(0))],
        ),
        &[],
        &[3.0],
    );
    // Cross entropy is the loss of log_softmax: equal scores give log(3).
    let s = input("s", F, &[1, 3], &[0.5, 0.5, 0.5]);
    let t = input("t", L, &[1], &[1.0]);
    expect(
        &run("SoftmaxCrossEntropyLoss", &[s, t], vec![]),
        &[],
        &[3f64.ln()],
    );
}

#[test]
fn top_k_takes_the_k_extremes_in_order() {
    let x = || {
        input(
            "x",
            F,
            &[2, 4],
            &[1.0, 4.0, 4.0, 2.0, -1.0, -3.0, 0.0, -3.0],
        )
    };
    let k = || init("k", L, &[1], &[2.0]);
    expect(
        &run("TopK", &[x(), k()], vec![]),
        &[2, 2],
        &[4.0, 4.0, 0.0, -1.0],
    );
    expect(
        &run("TopK", &[x(), k()], vec![attr("largest", A::I(0))]),
        &[2, 2],
        &[1.0, 2.0, -3.0, -3.0],
    );
}

#[test]
fn quantize_linear_rounds_ties_to_even_and_saturates() {
    let q = run(
        "QuantizeLinear",
        &[
            input("x", F, &[7], &[0.0, 1.5, 0.25, 0.75, -3.0, 1000.0, -100.0]),
            init("s", F, &[], &[0.5]),
            init("z", DType::U8, &[], &[10.0]),
        ],
        vec![],
    );
    assert_eq!(q.ty.dtype, DType::U8);
    expect(&q, &[7], &[10.0, 13.0, 10.0, 12.0, 4.0, 255.0, 0.0]);
    // Per axis, to i8: column j by scale s[j] and zero point z[j].
    let q = run(
        "QuantizeLinear",
        &[
            input("x", F, &[2, 3], &[1.0, 2.0, 3.0, -200.0, 5.0, 9.0]),
            init("s", F, &[3], &[1.0, 2.0, 4.0]),
            init("z", DType::I8, &[3], &[0.0, -1.0, 1.0]),
        ],
        vec![attr("axis", A::I(1))],
    );
    assert_eq!(q.ty.dtype, DType::I8);
    expect(&q, &[2, 3], &[1.0, 0.0, 2.0, -128.0, 1.0, 3.0]);
}

#[test]
fn dequantize_linear_per_tensor_and_per_block() {
    let d = run(
        "DequantizeLinear",
        &[
            input("x", DType::U8, &[3], &[0.0, 10.0, 255.0]),
            init("s", F, &[], &[0.5]),
            init("z", DType::U8, &[], &[10.0]),
        ],
        vec![],
    );
    assert_eq!(d.ty.dtype, F);
    expect(&d, &[3], &[-5.0, 0.0, 122.5]);
    // Blocks of 2 along axis 1; the last block of a row of 3 is short.
    let d = run(
        "DequantizeLinear",
        &[
            input("x", DType::I8, &[2, 3], &[1.0, 2.0, 3.0, -5.0, 6.0, 7.0]),
            init("s", F, &[2, 2], &[1.0, 10.0, 100.0, 0.5]),
        ],
        vec![attr("axis", A::I(1)), attr("block_size", A::I(2))],
    );
    expect(&d, &[2, 3], &[1.0, 2.0, 30.0, -500.0, 600.0, 3.5]);
}

#[test]
fn integer_and_quantized_products() {
    let u8 = DType::U8;
    let p = run(
        "MatMulInteger",
        &[
            input("a", u8, &[2, 2], &[1.0, 2.0, 3.0, 4.0]),
            input("b", u8, &[2, 2], &[5.0, 6.0, 7.0, 8.0]),
            init("az", u8, &[], &[1.0]),
            init("bz", u8, &[], &[2.0]),
        ],
        vec![],
    );
    assert_eq!(p.ty.dtype, DType::I32);
    // [[0, 1], [2, 3]] @ [[3, 4], [5, 6]]
    expect(&p, &[2, 2], &[5.0, 6.0, 21.0, 26.0]);
    let q = |y_scale: f64| {
        run(
            "QLinearMatMul",
            &[
                input("a", u8, &[1, 2], &[10.0, 20.0]),
                init("sa", F, &[], &[0.5]),
                init("za", u8, &[], &[10.0]),
                input("b", u8, &[2, 1], &[4.0, 8.0]),
                init("sb", F, &[], &[0.25]),
                init("zb", u8, &[], &[0.0]),
                init("sy", F, &[], &[y_scale]),
                init("zy", u8, &[], &[5.0]),
            ],
            vec![],
        )
    };
    // [0, 10] @ [4, 8] = 80, times 0.5 * 0.25 / 0.1, plus 5; saturated at
    // 255 with a scale ten times finer.
    let y = q(0.1);
    assert_eq!(y.ty.dtype, u8);
    expect(&y, &[1, 1], &[105.0]);
    expect(&q(0.01), &[1, 1], &[255.0]);
    // ONNX's example: scale (2 + 3) / 255, zero point 153.
    let d = run(
        "DynamicQuantizeLinear",
        &[input("x", F, &[6], &[0.0, 2.0, -3.0, -2.5, 1.34, 0.5])],
        vec![],
    );
    expect(&d, &[6], &[153.0, 255.0, 0.0, 26.0, 221.0, 179.0]);
}

#[test]
fn einsum_cumprod_and_center_crop_pad() {
    let x = || input("x", F, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = input("y", F, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    // Implicit output: the labels seen once, in order (`ik`).
    expect(
        &run("Einsum", &[x(), y], vec![attr("equation", A::S("ij,jk"))]),
        &[2, 2],
        &[22.0, 28.0, 49.0, 64.0],
    );
    expect(
        &run("Einsum", &[x()], vec![attr("equation", A::S("ij->ji"))]),
        &[3, 2],
        &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0],
    );
    let sq = input("x", F, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    expect(
        &run("Einsum", &[sq], vec![attr("equation", A::S("ii->i"))]),
        &[2],
        &[1.0, 4.0],
    );
    let v = || input("x", F, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let axis = || init("axis", L, &[], &[0.0]);
    expect(
        &run("CumProd", &[v(), axis()], vec![]),
        &[4],
        &[1.0, 2.0, 6.0, 24.0],
    );
    expect(
        &run(
            "CumProd",
            &[v(), axis()],
            vec![attr("exclusive", A::I(1)), attr("reverse", A::I(1))],
        ),
        &[4],
        &[24.0, 12.0, 4.0, 1.0],
    );
    // An infinity outside a prefix does not reach it.
    let inf = input("x", F, &[3], &[1.0, 2.0, f64::INFINITY]);
    expect(
        &run("CumSum", &[inf, axis()], vec![]),
        &[3],
        &[1.0, 3.0, f64::INFINITY],
    );
    let w = || input("x", F, &[5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
    expect(
        &run("CenterCropPad", &[w(), init("s", L, &[1], &[3.0])], vec![]),
        &[3],
        &[2.0, 3.0, 4.0],
    );
    expect(
        &run("CenterCropPad", &[w(), init("s", L, &[1], &[8.0])], vec![]),
        &[8],
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 0.0],
    );
}

#[test]
fn scatters_and_gathers_with_run_time_indices() {
    let data = || input("d", F, &[4], &[1.0, 2.0, 3.0, 4.0]);
    // ScatterElements: index -1 is the last element.
    expect(
        &run(
            "ScatterElements",
            &[
                data(),
                input("i", L, &[2], &[-1.0, 0.0]),
                input("u", F, &[2], &[5.0, 7.0]),
            ],
            vec![],
        ),
        &[4],
        &[7.0, 2.0, 3.0, 5.0],
    );
    let nd = |reduction: &'static str| {
        run(
            "ScatterND",
            &[
                data(),
                input("i", L, &[2, 1], &[1.0, 3.0]),
                input("u", F, &[2], &[10.0, 20.0]),
            ],
            vec![attr("reduction", A::S(reduction))],
        )
    };
    expect(&nd("none"), &[4], &[1.0, 10.0, 3.0, 20.0]);
    expect(&nd("add"), &[4], &[1.0, 12.0, 3.0, 24.0]);
    expect(&nd("mul"), &[4], &[1.0, 20.0, 3.0, 80.0]);
    expect(&nd("min"), &[4], &[1.0, 2.0, 3.0, 4.0]);
    let m = || input("d", F, &[2, 2], &[0.0, 1.0, 2.0, 3.0]);
    expect(
        &run(
            "GatherND",
            &[m(), input("i", L, &[2, 2], &[0.0, 0.0, 1.0, 1.0])],
            vec![],
        ),
        &[2],
        &[0.0, 3.0],
    );
    expect(
        &run(
            "GatherND",
            &[m(), input("i", L, &[2, 1], &[1.0, 0.0])],
            vec![],
        ),
        &[2, 2],
        &[2.0, 3.0, 0.0, 1.0],
    );
    // Indices shorter than the data on the other axis, repeated ones added.
    let d = || input("d", F, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let se = |reduction: &'static str| {
        run(
            "ScatterElements",
            &[
                d(),
                input("i", L, &[1, 2], &[2.0, 2.0]),
                input("u", F, &[1, 2], &[10.0, 20.0]),
            ],
            vec![attr("axis", A::I(1)), attr("reduction", A::S(reduction))],
        )
    };
    expect(&se("add"), &[2, 3], &[1.0, 2.0, 33.0, 4.0, 5.0, 6.0]);
    expect(&se("max"), &[2, 3], &[1.0, 2.0, 20.0, 4.0, 5.0, 6.0]);
    // A tuple of two coordinates names an element; -1 counts from the end.
    expect(
        &run(
            "ScatterND",
            &[
                d(),
                input("i", L, &[2, 2], &[1.0, -1.0, 0.0, 1.0]),
                input("u", F, &[2], &[10.0, 20.0]),
            ],
            vec![],
        ),
        &[2, 3],
        &[1.0, 20.0, 3.0, 4.0, 5.0, 10.0],
    );
    // One index per batch row: row b takes its own element.
    expect(
        &run(
            "GatherND",
            &[d(), input("i", L, &[2, 1], &[2.0, -3.0])],
            vec![attr("batch_dims", A::I(1))],
        ),
        &[2],
        &[3.0, 4.0],
    );
    // A key-value cache's update: batch 0 writes from row 2, batch 1 from
    // row 0; circular wraps past the end, linear writes nothing there.
    let ts = |mode: &'static str| {
        run(
            "TensorScatter",
            &[
                input("c", F, &[2, 3, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
                input("u", F, &[2, 2, 1], &[10.0, 20.0, 30.0, 40.0]),
                input("w", L, &[2], &[2.0, 0.0]),
            ],
            vec![attr("mode", A::S(mode))],
        )
    };
    expect(
        &ts("circular"),
        &[2, 3, 1],
        &[20.0, 2.0, 10.0, 30.0, 40.0, 6.0],
    );
    expect(
        &ts("linear"),
        &[2, 3, 1],
        &[1.0, 2.0, 10.0, 30.0, 40.0, 6.0],
    );
    // Each is a gather or a scatter-add that touches only the elements its
    // indices name, not a sum over the indexed axis for every element.
    for (op, tensors, want) in [
        (
            "GatherElements",
            vec![d(), input("i", L, &[2, 3], &[0.0; 6])],
            "graph.gather",
        ),
        (
            "GatherND",
            vec![d(), input("i", L, &[4, 2], &[0.0; 8])],
            "graph.gather",
        ),
        (
            "ScatterElements",
            vec![
                d(),
                input("i", L, &[2, 2], &[0.0; 4]),
                input("u", F, &[2, 2], &[0.0; 4]),
            ],
            "graph.scatter_add",
        ),
        (
            "ScatterND",
            vec![
                d(),
                input("i", L, &[3, 1], &[0.0; 3]),
                input("u", F, &[3, 3], &[0.0; 9]),
            ],
            "graph.scatter_add",
        ),
    ] {
        let text = dlc_graph::print_module(&optimized(op, &tensors, vec![], 1).0);
        assert!(
            text.contains(want) && !text.contains("graph.sum") && !text.contains("graph.compute"),
            "{op}:\n{text}"
        );
    }
    expect(
        &run(
            "EyeLike",
            &[input("x", F, &[2, 3], &[0.0; 6])],
            vec![attr("k", A::I(1))],
        ),
        &[2, 3],
        &[0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
    );
}

#[test]
fn recurrent_ops_unroll_onnx_definitions() {
    // One step of a one-unit RNN, GRU and LSTM with unit weights, worked
    // by hand: x = 0.5, h0 = 0.25 (c0 = 0.1 for the LSTM), no bias.
    let x = || input("x", F, &[1, 1, 1], &[0.5]);
    let h0 = || input("h", F, &[1, 1, 1], &[0.25]);
    let none = || input("", F, &[], &[]);
    let rnn = run(
        "RNN",
        &[
            x(),
            init("w", F, &[1, 1, 1], &[1.0]),
            init("r", F, &[1, 1, 1], &[1.0]),
            none(),
            none(),
            h0(),
        ],
        vec![attr("hidden_size", A::I(1))],
    );
    expect(&rnn, &[1, 1, 1, 1], &[0.75f64.tanh()]);
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let gru = run(
        "GRU",
        &[
            x(),
            init("w", F, &[1, 3, 1], &[1.0; 3]),
            init("r", F, &[1, 3, 1], &[1.0; 3]),
            none(),
            none(),
            h0(),
        ],
        vec![attr("hidden_size", A::I(1))],
    );
    let (z, r) = (sig(0.75), sig(0.75));
    let hh = (0.5 + r * 0.25f64).tanh();
    expect(&gru, &[1, 1, 1, 1], &[(1.0 - z) * hh + z * 0.25]);
    let lstm = run(
        "LSTM",
        &[
            x(),
            init("w", F, &[1, 4, 1], &[1.0; 4]),
            init("r", F, &[1, 4, 1], &[1.0; 4]),
            none(),
            none(),
            h0(),
            input("c", F, &[1, 1, 1], &[0.1]),
        ],
        vec![attr("hidden_size", A::I(1))],
    );
    let g = sig(0.75);
    let c = g * 0.1 + g * 0.75f64.tanh();
    expect(&lstm, &[1, 1, 1, 1], &[g * c.tanh()]);
}

#[test]
fn dft_forward_inverse_and_one_sided() {
    // numpy.fft.fft([1, 2, 3, 4]) = [10, -2+2j, -2, -2-2j]
    let x = || input("x", F, &[1, 4, 1], &[1.0, 2.0, 3.0, 4.0]);
    let spectrum = [10.0, 0.0, -2.0, 2.0, -2.0, 0.0, -2.0, -2.0];
    expect(&run("DFT", &[x()], vec![]), &[1, 4, 2], &spectrum);
    expect(
        &run("DFT", &[x()], vec![attr("onesided", A::I(1))]),
        &[1, 3, 2],
        &spectrum[..6],
    );
    let inv = |shape: &[usize], data: &[f64], onesided: i64| {
        run(
            "DFT",
            &[input("x", F, shape, data)],
            vec![attr("inverse", A::I(1)), attr("onesided", A::I(onesided))],
        )
    };
    expect(
        &inv(&[1, 4, 2], &spectrum, 0),
        &[1, 4, 2],
        &[1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0],
    );
    // numpy.fft.irfft of the half spectrum: the signal again.
    expect(
        &inv(&[1, 3, 2], &spectrum[..6], 1),
        &[1, 4, 1],
        &[1.0, 2.0, 3.0, 4.0],
    );
}

#[test]
fn rotary_embedding_by_halves_and_interleaved() {
    // cos = [0, 1], sin = [1, 0]: the first pair turns by a right angle.
    let rot = |interleaved: i64| {
        run(
            "RotaryEmbedding",
            &[
                input("x", F, &[1, 1, 1, 4], &[1.0, 2.0, 3.0, 4.0]),
                init("c", F, &[1, 1, 2], &[0.0, 1.0]),
                init("s", F, &[1, 1, 2], &[1.0, 0.0]),
            ],
            vec![attr("interleaved", A::I(interleaved))],
        )
    };
    expect(&rot(0), &[1, 1, 1, 4], &[-3.0, 2.0, 1.0, 4.0]);
    expect(&rot(1), &[1, 1, 1, 4], &[-2.0, 1.0, 3.0, 4.0]);
}

#[test]
fn integer_pow_bool_reductions_and_aspect_preserving_resize() {
    let p = run(
        "Pow",
        &[
            input("x", DType::I32, &[3], &[2.0, -3.0, 5.0]),
            input("y", F, &[3], &[10.0, 3.0, 0.0]),
        ],
        vec![],
    );
    assert_eq!(p.ty.dtype, DType::I32);
    expect(&p, &[3], &[1024.0, -27.0, 1.0]);
    let b = || input("x", DType::Bool, &[2, 2], &[1.0, 0.0, 0.0, 0.0]);
    let reduce = |op: &str| {
        run(
            op,
            &[b(), init("axes", L, &[1], &[1.0])],
            vec![attr("keepdims", A::I(0))],
        )
    };
    expect(&reduce("ReduceMax"), &[2], &[1.0, 0.0]);
    expect(&reduce("ReduceMin"), &[2], &[0.0, 0.0]);
    // sizes [4, 4] of a [2, 4] image, not larger: one scale, 1.
    let r = run(
        "Resize",
        &[
            input("x", F, &[2, 4], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
            input("", F, &[], &[]),
            input("", F, &[], &[]),
            init("sizes", L, &[2], &[4.0, 4.0]),
        ],
        vec![attr("keep_aspect_ratio_policy", A::S("not_larger"))],
    );
    expect(&r, &[2, 4], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
}

#[test]
fn lrn_mean_variance_normalization_and_swiglu() {
    let x = input("x", F, &[1, 2, 1, 1], &[1.0, 2.0]);
    // Both channels see squares 1 + 4 = 5: 1 + 3 / 3 * 5 = 6.
    expect(
        &run(
            "LRN",
            &[x],
            vec![
                attr("size", A::I(3)),
                attr("alpha", A::F(3.0)),
                attr("beta", A::F(1.0)),
            ],
        ),
        &[1, 2, 1, 1],
        &[1.0 / 6.0, 2.0 / 6.0],
    );
    let m = run(
        "MeanVarianceNormalization",
        &[input("x", F, &[1, 1, 1, 2], &[1.0, 3.0])],
        vec![],
    );
    expect(&m, &[1, 1, 1, 2], &[-1.0, 1.0]);
    let s = run(
        "SwiGLU",
        &[
            input("a", F, &[2], &[0.0, 1.0]),
            input("b", F, &[2], &[2.0, 3.0]),
        ],
        vec![],
    );
    // NumPy float64: 3 / (1 + e^-1) = 2.193175735890015
    expect(&s, &[2], &[0.0, 2.193_175_735_890_015]);
}

#[test]
fn antialiased_linear_downsampling_widens_the_filter() {
    // Scale 1/2: four taps (1, 3, 3, 1) / 8 around x = 2y + 1/2, the
    // edges repeated.
    let r = run(
        "Resize",
        &[
            input("x", F, &[4], &[1.0, 2.0, 3.0, 4.0]),
            input("", F, &[], &[]),
            init("scales", F, &[1], &[0.5]),
        ],
        vec![attr("mode", A::S("linear")), attr("antialias", A::I(1))],
    );
    expect(&r, &[2], &[1.625, 3.375]);
}

#[test]
fn max_pool_indices_row_and_column_major() {
    // The maximum 4 is at (h, w) = (0, 1): flat 1 row-major, 2 column-major.
    let pool = |order: i64| {
        run_n(
            "MaxPool",
            &[input("x", F, &[1, 1, 2, 2], &[1.0, 4.0, 3.0, 2.0])],
            vec![
                attr("kernel_shape", A::Is(vec![2, 2])),
                attr("storage_order", A::I(order)),
            ],
            2,
        )
    };
    let r = pool(0);
    expect(&r[0], &[1, 1, 1, 1], &[4.0]);
    assert_eq!(r[1].ty.dtype, L);
    expect(&r[1], &[1, 1, 1, 1], &[1.0]);
    expect(&pool(1)[1], &[1, 1, 1, 1], &[2.0]);
    // Ties: the first maximum in the window.
    let t = run_n(
        "MaxPool",
        &[input("x", F, &[1, 1, 1, 4], &[5.0, 5.0, 1.0, 5.0])],
        vec![
            attr("kernel_shape", A::Is(vec![1, 2])),
            attr("strides", A::Is(vec![1, 2])),
        ],
        2,
    );
    expect(&t[1], &[1, 1, 1, 2], &[0.0, 3.0]);
}

#[test]
fn scalar_operands_of_products_are_errors() {
    // A scalar has no inner dimension to contract: an error naming the
    // operator, where the importer once indexed below rank 0.
    let scalar = || input("a", F, &[], &[2.0]);
    let vector = || input("b", F, &[2], &[1.0, 2.0]);
    for tensors in [[scalar(), vector()], [vector(), scalar()]] {
        let e = import_error("MatMul", &tensors, vec![]);
        assert!(
            e.contains("MatMul") && e.contains("must not be scalars"),
            "{e}"
        );
    }
}

/// Every operator of ONNX's default domain (ONNX 1.23's schemas).
const ONNX_OPS: &str = "Abs Acos Acosh Add AffineGrid And ArgMax ArgMin Asin Asinh Atan Atanh \
    Attention AveragePool BatchNormalization Bernoulli BitCast BitShift BitwiseAnd BitwiseNot \
    BitwiseOr BitwiseXor BlackmanWindow Cast CastLike CausalConvWithState Ceil Celu CenterCropPad \
    Clip Col2Im Compress Concat ConcatFromSequence Constant ConstantOfShape Conv ConvInteger \
    ConvTranspose Cos Cosh CumProd CumSum DFT DeformConv DepthToSpace DequantizeLinear Det Div \
    Dropout DynamicQuantizeLinear Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor GRU \
    Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool \
    Greater GreaterOrEqual GridSample GroupNormalization HammingWindow HannWindow HardSigmoid \
    HardSwish Hardmax Identity If ImageDecoder InstanceNormalization IsInf IsNaN LRN LSTM \
    LayerNormalization LeakyRelu Less LessOrEqual LinearAttention Log LogSoftmax Loop \
    LpNormalization LpPool MatMul MatMulInteger Max MaxPool MaxRoiPool MaxUnpool Mean \
    MeanVarianceNormalization MelWeightMatrix Min Mish Mod Mul Multinomial Neg \
    NegativeLogLikelihoodLoss NonMaxSuppression NonZero Not OneHot Optional OptionalGetElement \
    OptionalHasElement Or PRelu Pad Pow QLinearConv QLinearMatMul QuantizeLinear \
    RMSNormalization RNN RandomNormal RandomNormalLike RandomUniform RandomUniformLike Range \
    Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin \
    ReduceProd ReduceSum ReduceSumSquare RegexFullMatch Relu Reshape Resize ReverseSequence \
    RoiAlign RotaryEmbedding Round STFT Scan Scatter ScatterElements ScatterND Selu SequenceAt \
    SequenceConstruct SequenceEmpty SequenceErase SequenceInsert SequenceLength SequenceMap \
    Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax SoftmaxCrossEntropyLoss Softplus \
    Softsign SpaceToDepth Split SplitToSequence Sqrt Squeeze StringConcat StringNormalizer \
    StringSplit Sub Sum SwiGLU Swish Tan Tanh TensorScatter TfIdfVectorizer ThresholdedRelu Tile \
    TopK Transpose Trilu Unique Unsqueeze Upsample Where Xor";

#[test]
fn every_operator_over_operands_of_any_rank_imports_or_is_an_error() {
    // Each operator with one to three operands of rank 0 to 4, as inputs
    // and as initializers (which the importer folds), of f32 and i64, or
    // omitted: the importer writes a program the front end takes or
    // rejects, or says why it cannot import the node, and never panics.
    // (The fuzz target explores attributes and malformed files; this
    // sweeps the ranks every operator must check.)
    let t = |name: &'static str, dtype, shape: &[usize], folded: bool| {
        let data: Vec<f64> = (0..shape.iter().product::<usize>())
            .map(|i| if dtype == L { 1.0 } else { i as f64 + 1.0 })
            .collect();
        if folded {
            init(name, dtype, shape, &data)
        } else {
            input(name, dtype, shape, &data)
        }
    };
    let firsts = || {
        let mut v: Vec<T> = (0..=4).map(|r| t("x", F, &vec![2; r], false)).collect();
        v.push(t("x", L, &[2], false));
        v
    };
    let others = |name: &'static str| {
        vec![
            t(name, F, &[], true),
            t(name, F, &[2], true),
            t(name, F, &[2, 2], false),
            t(name, L, &[], true),
            t(name, L, &[1], true),
            t(name, L, &[2], true),
            input("", F, &[], &[]),
        ]
    };
    let (xs, bs, cs) = (firsts(), others("b"), others("c"));
    let mut cases: Vec<Vec<T>> = Vec::new();
    for x in &xs {
        cases.push(vec![x.clone()]);
        for b in &bs {
            cases.push(vec![x.clone(), b.clone()]);
            for c in &cs {
                cases.push(vec![x.clone(), b.clone(), c.clone()]);
            }
        }
    }
    // Where each panic happened, for the report.
    static WHERE: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
    std::panic::set_hook(Box::new(|info| {
        if let (Some(l), Ok(mut w)) = (info.location(), WHERE.lock()) {
            *w = format!("{}:{}", l.file(), l.line());
        }
    }));
    let mut panics = Vec::new();
    for op in ONNX_OPS.split_whitespace() {
        for tensors in &cases {
            let outcome = std::panic::catch_unwind(|| {
                if let Ok(imported) = try_import_n(op, tensors, vec![], 1).0 {
                    let _ = compile_source(&SourceText {
                        name: "model.onnx".into(),
                        text: imported.source,
                        weights: Vec::new(),
                    });
                }
            });
            if let Err(p) = outcome {
                let why = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(ToString::to_string))
                    .unwrap_or_default();
                let operands: Vec<String> = tensors
                    .iter()
                    .map(|t| format!("{}{:?}{}", t.dtype, t.shape, if t.init { "*" } else { "" }))
                    .collect();
                let at = WHERE.lock().map(|w| w.clone()).unwrap_or_default();
                panics.push(format!("{op}({}): {why} at {at}", operands.join(", ")));
            }
        }
    }
    let _ = std::panic::take_hook();
    assert!(
        panics.is_empty(),
        "{} panics (* marks an initializer):\n{}",
        panics.len(),
        panics.join("\n")
    );
}
