//! ONNX models through the `dlc` command: real models against onnxruntime's
//! outputs (made by `scripts/onnx_models.py`, kept under `tests/onnx/`),
//! `dlc import`, and the errors a model dlc cannot take gets.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{Dir, dlc, fails_with, stderr};

use dlc_onnx::pb;
use dlc_runtime::HostTensor;
use prost::Message as _;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/onnx")
}

#[track_caller]
fn succeeds(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The inputs of a stored model, as `--input NAME=PATH` arguments.
fn input_args(model: &Path) -> Vec<String> {
    let mut args = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(model)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.extension().is_some_and(|e| e == "npy") && !stem.starts_with("out") {
            args.push("--input".to_string());
            args.push(format!("{stem}={}", p.display()));
        }
    }
    args
}

#[test]
fn real_models_match_onnxruntime() {
    let d = Dir::new("real");
    // torch_encoder: nn.TransformerEncoder from PyTorch's TorchScript
    // exporter (its attention's reshape arithmetic concatenates an empty
    // slice of a shape); torch_encoder_external: the same from the
    // torch.export-based exporter, its weights in model.onnx.data.
    for name in [
        "mlp",
        "cnn",
        "transformer",
        "gru",
        "recurrent",
        "torch_encoder",
        "torch_encoder_external",
    ] {
        let dir = root().join(name);
        let model = dir.join("model.onnx").display().to_string();
        let out = d.path(name);
        let mut args: Vec<String> = [
            "run",
            &model,
            "--backend",
            "cpu",
            "--check",
            "--save-outputs",
            &out,
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        args.extend(input_args(&dir));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = dlc(&argv);
        let stdout = succeeds(&o);
        assert!(stdout.contains("check: ok"), "{name}: {stdout}");
        // No progress display where standard error is not a terminal.
        assert_eq!(stderr(&o), "", "{name}");
        // Saved under the model's output name.
        let model_bytes = std::fs::read(dir.join("model.onnx")).unwrap();
        let proto = pb::ModelProto::decode(model_bytes.as_slice()).unwrap();
        let output = proto.graph.unwrap().output[0].name().to_string();
        let stem = dlc_driver::output_file_stems(&[output.as_str()]).remove(0);
        let got = HostTensor::read_npy(&Path::new(&out).join(format!("{stem}.npy")), None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = HostTensor::read_npy(&dir.join("out0.npy"), None).unwrap();
        assert_eq!(got.ty, want.ty, "{name}");
        let scale = want.data.iter().fold(0f64, |m, v| m.max(v.abs()));
        let err = got
            .data
            .iter()
            .zip(&want.data)
            .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            err <= 1e-4 * scale,
            "{name}: largest difference from onnxruntime {err:e} (scale {scale})"
        );
    }
}

#[test]
fn imported_programs_read_back_and_run_with_random_inputs() {
    let d = Dir::new("import");
    for name in ["mlp", "cnn"] {
        let model = root().join(name).join("model.onnx").display().to_string();
        let out = d.path(&format!("{name}.dl"));
        let weights = d.path(&format!("{name}.safetensors"));
        succeeds(&dlc(&["import", &model, "-o", &out]));
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(
            text.starts_with("// Imported from ONNX (opset 17)"),
            "{text}"
        );
        // Weights are parameters whose values are in the side file, not
        // literals.
        assert!(
            text.contains(&format!("weights are in {weights} ")),
            "{text}"
        );
        assert!(text.contains("weight "), "{text}");
        for literal in text.split("tensor([").skip(1) {
            let list = &literal[..literal.find(']').unwrap()];
            assert!(
                list.split(',').count() <= dlc_onnx::WEIGHT_MIN_ELEMENTS,
                "a literal of more than {} elements: {list}",
                dlc_onnx::WEIGHT_MIN_ELEMENTS
            );
        }
        succeeds(&dlc(&["check", &out]));
        let stdout = succeeds(&dlc(&[
            "run",
            &out,
            "--weights",
            &weights,
            "--random-inputs",
            "0",
            "--check",
        ]));
        assert!(stdout.contains("check: ok"), "{stdout}");
        let stdout = succeeds(&dlc(&["run", &model, "--random-inputs", "0", "--check"]));
        assert!(stdout.contains("check: ok"), "{stdout}");
        // The same values either way: the program with the side file, and
        // the model, whose weights are bound at the call.
        let first = |s: &str| {
            s.lines()
                .find(|l| l.starts_with("out0"))
                .unwrap()
                .to_string()
        };
        let from_dl = succeeds(&dlc(&[
            "run",
            &out,
            "--weights",
            &weights,
            "--random-inputs",
            "0",
        ]));
        let from_onnx = succeeds(&dlc(&["run", &model, "--random-inputs", "0"]));
        assert_eq!(first(&from_dl), first(&from_onnx), "{name}");
        // A self-contained program on request.
        let inline = d.path(&format!("{name}_inline.dl"));
        succeeds(&dlc(&["import", &model, "-o", &inline, "--inline-weights"]));
        let text = std::fs::read_to_string(&inline).unwrap();
        assert!(
            text.contains("tensor([") && !text.contains("weight "),
            "{text}"
        );
        assert!(!Path::new(&d.path(&format!("{name}_inline.safetensors"))).exists());
        let stdout = succeeds(&dlc(&["run", &inline, "--random-inputs", "0", "--check"]));
        assert!(stdout.contains("check: ok"), "{stdout}");
    }
    // Weights need a place to go.
    let mlp = root().join("mlp/model.onnx").display().to_string();
    fails_with(
        &dlc(&["import", &mlp]),
        "has 5 weights: give -o FILE (they go to FILE.safetensors), --weights-out PATH, or --inline-weights",
    );
    let elsewhere = d.path("elsewhere.safetensors");
    let text = succeeds(&dlc(&["import", &mlp, "--weights-out", &elsewhere]));
    assert!(text.contains("weight "), "{text}");
    assert!(Path::new(&elsewhere).exists());
    // The CNN's strided, dilated, asymmetric convolution and its ceil-mode
    // pooling are helper operators in index notation.
    let cnn = std::fs::read_to_string(d.path("cnn.dl")).unwrap();
    assert!(
        cnn.contains("op conv(") && cnn.contains("op avgpool("),
        "{cnn}"
    );
    assert!(cnn.contains("2 * y0 + k0 - 1"), "{cnn}");
}

fn tensor_type(elem: i32, dims: &[pb::tensor_shape_proto::Dimension]) -> pb::TypeProto {
    pb::TypeProto {
        value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
            elem_type: Some(elem),
            shape: Some(pb::TensorShapeProto { dim: dims.to_vec() }),
        })),
        ..Default::default()
    }
}

fn dim(v: i64) -> pb::tensor_shape_proto::Dimension {
    pb::tensor_shape_proto::Dimension {
        value: Some(pb::tensor_shape_proto::dimension::Value::DimValue(v)),
        ..Default::default()
    }
}

fn sym(p: &str) -> pb::tensor_shape_proto::Dimension {
    pb::tensor_shape_proto::Dimension {
        value: Some(pb::tensor_shape_proto::dimension::Value::DimParam(p.into())),
        ..Default::default()
    }
}

/// A node `op` of `input` giving `output`, named `name` (unnamed when
/// empty).
fn node(name: &str, op: &str, input: &[&str], output: &str) -> pb::NodeProto {
    pb::NodeProto {
        name: (!name.is_empty()).then(|| name.into()),
        op_type: Some(op.into()),
        input: input.iter().map(ToString::to_string).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

/// A model at `opset` of graph `g`: `nodes` over `inputs` and
/// `initializers`, returning `y`.
fn model_of(
    opset: i64,
    nodes: Vec<pb::NodeProto>,
    initializers: Vec<pb::TensorProto>,
    inputs: Vec<pb::ValueInfoProto>,
) -> Vec<u8> {
    let model = pb::ModelProto {
        ir_version: Some(8),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(pb::GraphProto {
            name: Some("g".into()),
            node: nodes,
            initializer: initializers,
            input: inputs,
            output: vec![pb::ValueInfoProto {
                name: Some("y".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    model.encode_to_vec()
}

/// An input `name` of element type `elem` and dimensions `dims`.
fn input_of(
    name: &str,
    elem: i32,
    dims: &[pb::tensor_shape_proto::Dimension],
) -> pb::ValueInfoProto {
    pb::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(tensor_type(elem, dims)),
        ..Default::default()
    }
}

/// A model of one node named `the_node`, `y = op(x, inputs..)`, over an f32
/// input `x` of the given dimensions and `initializers`, at `opset`.
fn one_node_with(
    op: &str,
    x: &[pb::tensor_shape_proto::Dimension],
    initializers: Vec<pb::TensorProto>,
    opset: i64,
) -> Vec<u8> {
    let f32 = pb::tensor_proto::DataType::Float as i32;
    let names: Vec<String> = initializers.iter().map(|t| t.name().to_string()).collect();
    let mut input = vec!["x"];
    input.extend(names.iter().map(String::as_str));
    let nodes = vec![node("the_node", op, &input, "y")];
    model_of(opset, nodes, initializers, vec![input_of("x", f32, x)])
}

/// A one-node model `y = op(x)` over an f32 input of the given dimensions.
fn one_node(op: &str, x: &[pb::tensor_shape_proto::Dimension], opset: i64) -> Vec<u8> {
    one_node_with(op, x, Vec::new(), opset)
}

/// `y = x @ w` over an f32 `x: [1, k]` and an initializer `w: [k, n]`.
fn matmul_by_initializer(k: usize, n: usize) -> Vec<u8> {
    let w = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![k as i64, n as i64],
        data_type: Some(pb::tensor_proto::DataType::Float as i32),
        float_data: (0..k * n).map(|i| ((i % 7) as f32 - 3.0) / 8.0).collect(),
        ..Default::default()
    };
    one_node_with("MatMul", &[dim(1), dim(k as i64)], vec![w], 17)
}

/// `dlc run` and `dlc bench` bind a model's initializers when they call
/// it, as weights: the compiled code holds none, so it goes through the
/// object cache however large the weights are, the initializers are not
/// inputs to save, and one given as an input replaces the model's.
#[test]
fn an_onnx_models_weights_are_bound_at_the_call() {
    let d = Dir::new("bound-weights");
    // 4.5 MB of weights: more than a part holding its constants may take
    // to the object cache (dlc_llvm::MAX_CACHED_CONSTANT_BYTES).
    let (k, n) = (1024, 1100);
    assert!((k * n * 4) as u64 > dlc_llvm::MAX_CACHED_CONSTANT_BYTES);
    let m = d.file("m.onnx", matmul_by_initializer(k, n));
    let cache = d.path("cache");
    let bench = |m: &str| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_dlc"))
            .env("DLC_CACHE_DIR", &cache)
            .args([
                "bench", m, "--runs", "1", "--warmup", "0", "--cache", "--json",
            ])
            .output()
            .unwrap();
        serde_json::from_str::<serde_json::Value>(&succeeds(&o)).unwrap()
    };
    let first = bench(&m);
    assert_eq!(first["cached_parts"], 0, "{first}");
    let second = bench(&m);
    assert_eq!(second["cached_parts"], second["llvm_parts"], "{second}");
    // Other weights, of the same shape, hit the same compiled code.
    let other = pb::ModelProto::decode(matmul_by_initializer(k, n).as_slice())
        .map(|mut p| {
            for v in &mut p.graph.as_mut().unwrap().initializer[0].float_data {
                *v = -*v;
            }
            p.encode_to_vec()
        })
        .unwrap();
    let other = d.file("other.onnx", other);
    let third = bench(&other);
    assert_eq!(third["cached_parts"], third["llvm_parts"], "{third}");

    // The initializers are not inputs: --save-inputs writes `x` alone.
    let cnn = root().join("cnn/model.onnx").display().to_string();
    let saved = d.path("saved");
    let run = ["run", &cnn, "--random-inputs", "0", "--check"];
    let out = succeeds(&dlc(&[&run[..], &["--save-inputs", &saved]].concat()));
    assert!(out.contains("check: ok"), "{out}");
    let mut written: Vec<String> = std::fs::read_dir(&saved)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(written, ["image.npy"]);
    // One given as an input replaces the model's.
    let zeros = HostTensor::new(
        dlc_core::TensorType::new(dlc_core::DType::F32, vec![10, 16]),
        vec![0.0; 160],
    )
    .unwrap();
    let fc_w = d.path("fc_w.npy");
    zeros.write_npy(Path::new(&fc_w)).unwrap();
    let given = format!("fc_w={fc_w}");
    let out = succeeds(&dlc(&[&run[..], &["--input", &given]].concat()));
    let out0 = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("out0"))
            .unwrap()
            .to_string()
    };
    assert_ne!(out0(&out), out0(&succeeds(&dlc(&run))));
    assert!(out.contains("check: ok"), "{out}");
    // With the classifier's weights zero, the logits are its bias.
    assert!(
        out0(&out).starts_with("out0: f32[2, 10] = [0.268126, 0.017437, -0.243291,"),
        "{out}"
    );
    // --weights binds dlc source's weights, not a model's.
    fails_with(
        &dlc(&[&run[..], &["--weights", &saved]].concat()),
        "carries its weights (an ONNX model's initializers); --weights binds those of dlc source",
    );
}

/// An initializer the model names more than once (PyTorch's exporter
/// shares a parameter used in several places, tied embeddings or cloned
/// layers, through `Identity` nodes) is one weight of the program: stored
/// once by `dlc import`, bound and prepared once by a run.
#[test]
fn an_initializer_shared_through_identity_is_one_weight() {
    let d = Dir::new("shared-weight");
    let f32 = pb::tensor_proto::DataType::Float as i32;
    let w = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![16, 16],
        data_type: Some(f32),
        float_data: (0..256).map(|i| ((i % 7) as f32 - 3.0) / 8.0).collect(),
        ..Default::default()
    };
    // `w` used directly, then through two names made after that use and
    // one made before it.
    let nodes = vec![
        node("", "Identity", &["w"], "w0"),
        node("", "MatMul", &["x", "w"], "h"),
        node("", "Identity", &["w"], "w1"),
        node("", "Identity", &["w1"], "w2"),
        node("", "MatMul", &["h", "w2"], "h2"),
        node("", "MatMul", &["h2", "w0"], "y"),
    ];
    let x = input_of("x", f32, &[dim(2), dim(16)]);
    let m = d.file("m.onnx", model_of(17, nodes, vec![w], vec![x]));
    let dl = d.path("m.dl");
    succeeds(&dlc(&["import", &m, "-o", &dl]));
    let source = std::fs::read_to_string(&dl).unwrap();
    let signature = source.lines().find(|l| l.starts_with("fn ")).unwrap();
    assert_eq!(signature.matches("weight ").count(), 1, "{source}");
    assert_eq!(
        source.matches("matmul(").count() + source.matches(" @ ").count(),
        3,
        "{source}"
    );
    // Its values once: 1 KiB and the file's header.
    let stored = std::fs::metadata(d.path("m.safetensors")).unwrap().len();
    assert!((1024..2048).contains(&stored), "{stored} bytes");
    let out = succeeds(&dlc(&["run", &m, "--random-inputs", "0", "--check"]));
    assert!(out.contains("check: ok"), "{out}");
    // The program and its side file give what the model gives.
    let weights = d.path("m.safetensors");
    let run = ["run", &dl, "--weights", &weights, "--random-inputs", "0"];
    let from_dl = succeeds(&dlc(&run));
    let out0 = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("out0"))
            .unwrap()
            .to_string()
    };
    assert_eq!(out0(&from_dl), out0(&out));
}

#[test]
fn symbolic_dimensions_need_a_shape() {
    let d = Dir::new("sym");
    let m = d.file("m.onnx", one_node("Relu", &[sym("batch"), dim(4)], 17));
    fails_with(
        &dlc(&["run", &m, "--random-inputs", "0"]),
        "input `x` has a symbolic dimension `batch`; give its shape with --shape x=[d0,d1,...] (ONNX shape [batch, 4])",
    );
    let out = succeeds(&dlc(&[
        "run",
        &m,
        "--shape",
        "x=[3,4]",
        "--random-inputs",
        "0",
        "--check",
    ]));
    assert!(out.contains("out0: f32[3, 4]"), "{out}");
    fails_with(
        &dlc(&["run", &m, "--shape", "x=[3,5]", "--random-inputs", "0"]),
        "--shape x=[3, 5] does not fit the model's shape [batch, 4]",
    );
    fails_with(
        &dlc(&["run", &m, "--shape", "x=[a]"]),
        "--shape takes NAME=[d0,d1,...]",
    );
}

#[test]
fn unsupported_ops_name_the_node_op_and_opset() {
    let d = Dir::new("unsupported");
    let m = d.file("m.onnx", one_node("NonMaxSuppression", &[dim(2)], 17));
    fails_with(
        &dlc(&["check", &m]),
        "node `the_node` (NonMaxSuppression, opset 17): this operator is not supported yet",
    );
    let m = d.file("old.onnx", one_node("Relu", &[dim(2)], 11));
    fails_with(
        &dlc(&["check", &m]),
        "node `the_node` (Relu, opset 11): this operator is not supported at opset 11 (dlc reads it, if at all, from opset 13 on",
    );
}

#[test]
fn malformed_files_are_errors() {
    let d = Dir::new("malformed");
    let good = std::fs::read(root().join("mlp/model.onnx")).unwrap();
    for (name, bytes) in [
        ("empty.onnx", Vec::new()),
        (
            "text.onnx",
            b"fn f(x: f32[2]) -> f32[2] { return x; }".to_vec(),
        ),
        ("truncated.onnx", good[..good.len() / 2].to_vec()),
    ] {
        let m = d.file(name, &bytes);
        let o = dlc(&["run", &m, "--random-inputs", "0"]);
        assert_eq!(o.status.code(), Some(1), "{name}: {}", stderr(&o));
        assert!(
            stderr(&o).starts_with(&format!("error: {m}: ")),
            "{name}: {}",
            stderr(&o)
        );
    }
    fails_with(
        &dlc(&["import", &d.path("missing.onnx")]),
        "No such file or directory",
    );
    // `dlc run` maps the model: a missing one, or a directory, is an error
    // naming it.
    let missing = d.path("missing.onnx");
    let o = dlc(&["run", &missing, "--random-inputs", "0"]);
    fails_with(&o, &format!("{missing}: No such file or directory"));
    let dir = d.path("dir.onnx");
    std::fs::create_dir_all(&dir).unwrap();
    let o = dlc(&["run", &dir, "--random-inputs", "0"]);
    fails_with(&o, &format!("{dir}: is a directory"));
}

#[test]
fn inputs_that_set_shapes_can_be_bound_to_values() {
    let d = Dir::new("bind");
    let mut bytes = one_node("Reshape", &[dim(2), dim(3)], 17);
    let mut model = pb::ModelProto::decode(bytes.as_slice()).unwrap();
    let g = model.graph.as_mut().unwrap();
    g.node[0].input.push("shape".into());
    g.input.push(pb::ValueInfoProto {
        name: Some("shape".into()),
        r#type: Some(tensor_type(
            pb::tensor_proto::DataType::Int64 as i32,
            &[dim(2)],
        )),
        ..Default::default()
    });
    bytes = model.encode_to_vec();
    let m = d.file("m.onnx", &bytes);
    fails_with(
        &dlc(&["run", &m, "--random-inputs", "0"]),
        "node `the_node` (Reshape, opset 17): the shape (input 1) must be a constant; dlc shapes are static",
    );
    let shape = d.path("shape.npy");
    HostTensor::new(
        dlc_core::TensorType::new(dlc_core::DType::I64, vec![2]),
        vec![3.0, 2.0],
    )
    .unwrap()
    .write_npy(Path::new(&shape))
    .unwrap();
    let bind = format!("shape={shape}");
    let out = succeeds(&dlc(&[
        "run",
        &m,
        "--bind",
        &bind,
        "--random-inputs",
        "0",
        "--check",
    ]));
    assert!(out.contains("out0: f32[3, 2]"), "{out}");
    let text = succeeds(&dlc(&["import", &m, "--bind", &bind]));
    assert!(text.contains("fn g(x: f32[2, 3]) -> f32[3, 2]"), "{text}");
    fails_with(
        &dlc(&["check", &m, "--bind", &format!("nope={shape}")]),
        "--bind nope: the model has no input `nope`",
    );
    fails_with(
        &dlc(&["check", &m, "--bind", &format!("x={shape}")]),
        "--bind x: the value i64[2] does not fit the input",
    );
}

#[test]
fn external_data_is_read_beside_the_model_and_checked() {
    let d = Dir::new("external");
    let src = root().join("torch_encoder_external");
    let model = std::fs::read(src.join("model.onnx")).unwrap();
    let data = std::fs::read(src.join("model.onnx.data")).unwrap();
    let ids = src.join("ids.npy").display().to_string();
    let input = format!("ids={ids}");
    // Found relative to the model's directory, wherever the command runs.
    let m = d.file("m/model.onnx", &model);
    d.file("m/model.onnx.data", &data);
    let out = succeeds(&dlc(&["run", &m, "--input", &input, "--check"]));
    assert!(out.contains("check: ok"), "{out}");
    // A data file that is missing, or shorter than a tensor's bytes.
    let m = d.file("nodata/model.onnx", &model);
    fails_with(
        &dlc(&["check", &m]),
        "initializer: tensor `emb.weight`: cannot open",
    );
    let m = d.file("short/model.onnx", &model);
    d.file("short/model.onnx.data", &data[..data.len() / 2]);
    fails_with(&dlc(&["check", &m]), "the file holds");
    // A location that leaves the model's directory is refused.
    let mut escaping = pb::ModelProto::decode(model.as_slice()).unwrap();
    for t in &mut escaping.graph.as_mut().unwrap().initializer {
        for e in &mut t.external_data {
            if e.key() == "location" {
                e.value = Some("../model.onnx.data".into());
            }
        }
    }
    let m = d.file("escape/model.onnx", escaping.encode_to_vec());
    fails_with(
        &dlc(&["check", &m]),
        "external data location `../model.onnx.data` must be a path inside the model's directory",
    );
}

#[test]
fn empty_tensors_only_feed_folded_shape_arithmetic() {
    // y = x reshaped to concat(shape(x)[0:1], [-1], shape(x)[5:]): the last
    // part is empty and folds away, as in nn.MultiheadAttention's export.
    let d = Dir::new("empty");
    let i64t = pb::tensor_proto::DataType::Int64 as i32;
    let ints = |name: &str, v: &[i64]| pb::TensorProto {
        name: Some(name.into()),
        dims: vec![v.len() as i64],
        data_type: Some(i64t),
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let node = |op: &str, inputs: &[&str], out: &str| pb::NodeProto {
        name: Some(out.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(ToString::to_string).collect(),
        output: vec![out.into()],
        attribute: if op == "Concat" {
            vec![pb::AttributeProto {
                name: Some("axis".into()),
                i: Some(0),
                r#type: Some(pb::attribute_proto::AttributeType::Int as i32),
                ..Default::default()
            }]
        } else {
            vec![]
        },
        ..Default::default()
    };
    let mut model =
        pb::ModelProto::decode(one_node("Relu", &[dim(2), dim(3), dim(4)], 17).as_slice()).unwrap();
    let g = model.graph.as_mut().unwrap();
    g.initializer = vec![
        ints("zero", &[0]),
        ints("one", &[1]),
        ints("five", &[5]),
        ints("big", &[9]),
        ints("minus_one", &[-1]),
    ];
    g.node = vec![
        node("Shape", &["x"], "s"),
        node("Slice", &["s", "zero", "one"], "head"),
        node("Slice", &["s", "five", "big"], "tail"),
        node("Concat", &["head", "minus_one", "tail"], "target"),
        node("Reshape", &["x", "target"], "y"),
    ];
    let m = d.file("m.onnx", model.encode_to_vec());
    let out = succeeds(&dlc(&["run", &m, "--random-inputs", "0", "--check"]));
    assert!(out.contains("out0: f32[2, 12]"), "{out}");
    // The empty slice as a value of the program is still refused.
    g_output_is(&mut model, "tail");
    let m = d.file("out.onnx", model.encode_to_vec());
    fails_with(
        &dlc(&["check", &m]),
        "value `tail` is empty (i64[0]); dlc tensors have positive extents",
    );
}

/// A `Pad`'s pads computed from constants through a `Transpose` and a
/// `Reshape` (Swin's window padding, as torchvision exports it) fold: the
/// pads `[[0, 1], [0, 2], [1, 0]]` transposed are begins `[0, 0, 1]` and
/// ends `[1, 2, 0]`, so `[2, 3, 4]` pads to `[3, 5, 5]` (untransposed it
/// would be `[4, 5, 4]`).
#[test]
fn transposed_constants_fold() {
    let d = Dir::new("transposed");
    let i64t = pb::tensor_proto::DataType::Int64 as i32;
    let ints = |name: &str, dims: Vec<i64>, v: &[i64]| pb::TensorProto {
        name: Some(name.into()),
        dims,
        data_type: Some(i64t),
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let mut model =
        pb::ModelProto::decode(one_node("Relu", &[dim(2), dim(3), dim(4)], 17).as_slice()).unwrap();
    let g = model.graph.as_mut().unwrap();
    g.initializer = vec![
        ints("pairs", vec![3, 2], &[0, 1, 0, 2, 1, 0]),
        ints("flat", vec![1], &[-1]),
    ];
    let mut transpose = node("t", "Transpose", &["pairs"], "columns");
    transpose.attribute = vec![pb::AttributeProto {
        name: Some("perm".into()),
        ints: vec![1, 0],
        r#type: Some(pb::attribute_proto::AttributeType::Ints as i32),
        ..Default::default()
    }];
    g.node = vec![
        transpose,
        node("r", "Reshape", &["columns", "flat"], "pads"),
        node("p", "Pad", &["x", "pads"], "y"),
    ];
    let m = d.file("m.onnx", model.encode_to_vec());
    let out = succeeds(&dlc(&["run", &m, "--random-inputs", "0", "--check"]));
    assert!(out.contains("out0: f32[3, 5, 5]"), "{out}");
}

/// Makes `name` the model's only output.
fn g_output_is(model: &mut pb::ModelProto, name: &str) {
    model.graph.as_mut().unwrap().output = vec![pb::ValueInfoProto {
        name: Some(name.into()),
        ..Default::default()
    }];
}

/// On a terminal, a long command names the phase it is in (a spinner on
/// standard error, cleared before the results); `script` gives the command
/// a terminal.
#[test]
fn a_terminal_shows_the_phase_under_way() {
    let model = root().join("mlp/model.onnx").display().to_string();
    let command = format!(
        "{} run {model} --random-inputs 0 --no-cache",
        env!("CARGO_BIN_EXE_dlc")
    );
    let o = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("script (util-linux) runs a command on a terminal");
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{text}");
    // `--no-cache`: a program from the cache is neither optimized nor
    // compiled.
    for phase in ["importing", "optimizing", "compiling", "running"] {
        assert!(
            text.contains(&format!("{model}: {phase}")),
            "{phase}: {text}"
        );
    }
    // The results come after the spinner is cleared.
    let cleared = text.rfind("\x1b[2K").unwrap();
    assert!(text[cleared..].contains("out0: f32[8, 10]"), "{text}");
}

/// `y = x @ (wt * 2) + x @ w + b` over `x: [2, k]`: `w` and `wt` stored as
/// raw bytes (a run binds `w` from the file), `wt * 2` folded by the
/// importer (a weight whose values are the importer's, not the file's),
/// `b` in `float_data`. `scale` multiplies `w`'s and `wt`'s values.
fn raw_and_folded_weights(scale: f32) -> Vec<u8> {
    let (k, n) = (20usize, 24usize);
    let f32 = pb::tensor_proto::DataType::Float as i32;
    let raw = |name: &str, dims: &[usize], f: &dyn Fn(usize) -> f32| pb::TensorProto {
        name: Some(name.into()),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: Some(f32),
        raw_data: Some(
            (0..dims.iter().product())
                .flat_map(|i| f(i).to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        ),
        ..Default::default()
    };
    let nodes = vec![
        node("", "Mul", &["wt", "two"], "t"),
        node("", "MatMul", &["x", "t"], "p"),
        node("", "MatMul", &["x", "w"], "q"),
        node("", "Add", &["p", "q"], "s"),
        node("", "Add", &["s", "b"], "y"),
    ];
    let initializers = vec![
        raw("wt", &[k, n], &|i| scale * ((i % 11) as f32 - 5.0) / 16.0),
        raw("two", &[], &|_| 2.0),
        raw("w", &[k, n], &|i| scale * ((i % 7) as f32 - 3.0) / 8.0),
        pb::TensorProto {
            name: Some("b".into()),
            dims: vec![n as i64],
            data_type: Some(f32),
            float_data: (0..n).map(|i| i as f32 / 10.0).collect(),
            ..Default::default()
        },
    ];
    let x = input_of("x", f32, &[dim(2), dim(k as i64)]);
    model_of(17, nodes, initializers, vec![x])
}

/// A second `dlc run` of an unchanged ONNX model takes the program and
/// where its weights are from the cache, keyed by the file's hash (and its
/// path), without
/// importing it: its results are the same to the bit, an edited weight
/// (in the model or in its external data file) is never taken from an old
/// program, and bytes kept beside the program that are damaged mean a
/// compile.
#[test]
fn a_cached_onnx_program_is_not_imported_again() {
    let d = Dir::new("onnx-program-cache");
    let cache = d.path("cache");
    let command = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_dlc"))
            .env("DLC_CACHE_DIR", &cache)
            .args(args)
            .output()
            .unwrap()
    };
    let from_cache = |m: &str| {
        let o = command(&[
            "bench", m, "--runs", "1", "--warmup", "0", "--cache", "--json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&succeeds(&o)).unwrap();
        v["cached_program"].as_bool().unwrap()
    };
    // The outputs of `dlc run`, through the cache or not.
    let outputs = |m: &str, inputs: &[&str], no_cache: bool| {
        let dir = d.path(&format!("out{}", rand_name()));
        let mut args = vec!["run", m, "--save-outputs", &dir];
        args.extend(inputs);
        if no_cache {
            args.push("--no-cache");
        }
        succeeds(&command(&args));
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
            .iter()
            .map(|p| HostTensor::read_npy(p, None).unwrap())
            .collect::<Vec<_>>()
    };

    let x = d.npy(
        "x.npy",
        dlc_core::TensorType::new(dlc_core::DType::F32, vec![2, 20]),
        &(0..40).map(|i| (i % 5) as f64 - 2.0).collect::<Vec<_>>(),
    );
    let x = format!("--input=x={x}");
    let m = d.file("m/model.onnx", raw_and_folded_weights(1.0));
    // On a terminal, the phases a run goes through are shown: the first
    // run imports the model, the next do not.
    let phases = || {
        let o = std::process::Command::new("script")
            .env("DLC_CACHE_DIR", &cache)
            .args([
                "-qec",
                &format!("{} run {m} {x}", env!("CARGO_BIN_EXE_dlc")),
                "/dev/null",
            ])
            .output()
            .expect("script (util-linux) runs a command on a terminal");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let shown = phases();
    assert!(shown.contains("importing"), "{shown}");
    let want = outputs(&m, &[&x], true);
    assert!(from_cache(&m));
    assert_eq!(outputs(&m, &[&x], false), want);
    let shown = phases();
    assert!(shown.contains("out0: f32[2, 24]"), "{shown}");
    assert!(!shown.contains("importing"), "{shown}");
    // The same model under another name is another program (its failures
    // name the file).
    let renamed = d.file("elsewhere/renamed.onnx", raw_and_folded_weights(1.0));
    assert!(!from_cache(&renamed));
    assert!(from_cache(&renamed));
    assert_eq!(outputs(&renamed, &[&x], false), want);

    // An edited weight: the same path, other bytes.
    let m = d.file("m/model.onnx", raw_and_folded_weights(-2.0));
    let edited = outputs(&m, &[&x], true);
    assert_ne!(edited, want);
    assert_eq!(outputs(&m, &[&x], false), edited);
    assert!(from_cache(&m));
    assert_eq!(outputs(&m, &[&x], false), edited);

    // The folded weight's bytes, kept beside the program, damaged.
    let mut kept = 0;
    for e in std::fs::read_dir(&cache).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|e| e == "data") {
            let mut bytes = std::fs::read(&p).unwrap();
            let last = bytes.len() - 1;
            bytes[last] ^= 0x40;
            std::fs::write(&p, bytes).unwrap();
            kept += 1;
        }
    }
    assert_eq!(kept, 3, "one per program compiled");
    assert!(!from_cache(&m));
    assert_eq!(outputs(&m, &[&x], false), edited);

    // External data: an edited data file is a new program.
    let src = root().join("torch_encoder_external");
    let ids = format!("--input=ids={}", src.join("ids.npy").display());
    let m = d.file(
        "ext/model.onnx",
        std::fs::read(src.join("model.onnx")).unwrap(),
    );
    let mut data = std::fs::read(src.join("model.onnx.data")).unwrap();
    d.file("ext/model.onnx.data", &data);
    let want = outputs(&m, &[&ids], true);
    assert!(!from_cache(&m));
    assert!(from_cache(&m));
    assert_eq!(outputs(&m, &[&ids], false), want);
    // Every float's sign flipped: other weights, the same sizes.
    for b in data.iter_mut().skip(3).step_by(4) {
        *b ^= 0x80;
    }
    d.file("ext/model.onnx.data", &data);
    let edited = outputs(&m, &[&ids], true);
    assert_ne!(edited, want);
    assert_eq!(outputs(&m, &[&ids], false), edited);
}

/// A fresh name for an output directory.
fn rand_name() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed).to_string()
}

/// A failure in an imported model names the ONNX node it comes from, on
/// every back end and from the program cache, not a line of the program
/// the importer wrote, and so do its kernels' names; `dlc import` writes
/// each node's name above its lines (an unnamed node by its first output).
#[test]
fn failures_name_the_onnx_node() {
    let d = Dir::new("node-places");
    let i32t = pb::tensor_proto::DataType::Int32 as i32;
    let nodes = vec![
        node("", "Add", &["a", "a"], "doubled"),
        node("/model/divide", "Div", &["doubled", "b"], "y"),
    ];
    let inputs = vec![
        input_of("a", i32t, &[dim(4)]),
        input_of("b", i32t, &[dim(4)]),
    ];
    let model = model_of(17, nodes, Vec::new(), inputs);
    let m = d.file("div.onnx", model);
    let ty = dlc_core::TensorType::new(dlc_core::DType::I32, vec![4]);
    let a = format!("a={}", d.npy("a.npy", ty.clone(), &[1.0, 2.0, 3.0, 4.0]));
    let b = format!("b={}", d.npy("b.npy", ty, &[1.0, 0.0, 3.0, 4.0]));
    let place = format!("integer division by zero at {m}, node `/model/divide` (Div)");
    let run = ["run", &m, "--input", &a, "--input", &b];
    for extra in [
        &["--no-cache"][..],
        &[],
        &[],
        &["--check"],
        &["--backend", "loop"],
        &["--backend", "tile"],
    ] {
        fails_with(&dlc(&[&run[..], extra].concat()), &place);
    }
    // Its kernels are named after it, for profiles.
    let ir = succeeds(&dlc(&["compile", &m, "--emit", "llvm"]));
    assert!(ir.contains(".node_model_divide_Div"), "{ir}");
    let text = succeeds(&dlc(&["import", &m]));
    assert!(
        text.contains("    // node `doubled` (Add)\n    let doubled = a + a;"),
        "{text}"
    );
    assert!(
        text.contains("    // node `/model/divide` (Div)\n    let y = "),
        "{text}"
    );
}

/// A 2-D `Conv` with `dilations` imports as the built-in `conv2d` with its
/// `dilation` (not an operator in index notation), so it runs the
/// convolution's kernels (a 5 x 5 depthwise window two apart over 14 x 14,
/// LR-ASPP's, took 1.8 ms as an operator, 0.25 as the built-in, Zen 3, one
/// thread); a 2 x 2 window of ones two apart sums the corners of each 3 x 3
/// square of `1..=16`.
#[test]
fn dilated_convolutions_import_as_the_builtin() {
    let (program, y) = one_conv_of_ones(
        "dilated",
        &[1, 1, 4, 4],
        &[1, 1, 2, 2],
        &[("dilations", &[2, 2])],
    );
    assert!(program.contains("dilation=[2, 2]"), "{program}");
    assert_eq!(y, [24.0, 28.0, 40.0, 44.0]);
}

/// A 3-D `Conv` (R3D's video convolutions) imports as the built-in
/// `conv3d`, which runs as a 2-D convolution of its frames (R3D-18: 598 ms
/// as operators in index notation, 277 as `conv3d`, Zen 3, one thread); a
/// 2 x 1 x 2 window of ones, padded by one frame, strided two frames apart,
/// sums pairs of frames' neighbouring columns.
#[test]
fn video_convolutions_import_as_the_builtin() {
    let (program, y) = one_conv_of_ones(
        "video",
        &[1, 1, 3, 1, 2],
        &[1, 1, 2, 1, 2],
        &[("strides", &[2, 1, 1]), ("pads", &[1, 0, 0, 1, 0, 0])],
    );
    assert!(
        program.contains("conv3d(") && program.contains("stride=[2, 1, 1], padding=[1, 0, 0]"),
        "{program}"
    );
    // Frames (padding, 1 2), (3 4, 5 6): 3, then 3 + 4 + 5 + 6.
    assert_eq!(y, [3.0, 18.0]);
}

/// A model of one `Conv` of an input `x` shaped `x` (holding `1, 2, ...`)
/// by weights of ones shaped `w`, with integer-list `attributes`: the
/// program `dlc import` prints (which must have no operator in index
/// notation) and the output `dlc run` computes.
fn one_conv_of_ones(
    name: &str,
    x: &[usize],
    w: &[i64],
    attributes: &[(&str, &[i64])],
) -> (String, Vec<f64>) {
    let d = Dir::new(name);
    let weights = pb::TensorProto {
        name: Some("w".into()),
        dims: w.to_vec(),
        data_type: Some(pb::tensor_proto::DataType::Float as i32),
        float_data: vec![1.0; w.iter().product::<i64>() as usize],
        ..Default::default()
    };
    let dims: Vec<_> = x.iter().map(|&n| dim(n as i64)).collect();
    let mut model =
        pb::ModelProto::decode(one_node_with("Conv", &dims, vec![weights], 17).as_slice()).unwrap();
    model.graph.as_mut().unwrap().node[0].attribute = attributes
        .iter()
        .map(|(name, v)| pb::AttributeProto {
            name: Some((*name).into()),
            ints: v.to_vec(),
            r#type: Some(pb::attribute_proto::AttributeType::Ints as i32),
            ..Default::default()
        })
        .collect();
    let m = d.file("m.onnx", model.encode_to_vec());
    let program = succeeds(&dlc(&["import", &m]));
    assert!(!program.contains("\nop "), "{program}");
    let n = x.iter().product::<usize>();
    let xs = d.npy(
        "x.npy",
        dlc_core::TensorType::new(dlc_core::DType::F32, x.to_vec()),
        &(1..=n).map(|v| v as f64).collect::<Vec<_>>(),
    );
    let out = d.path("out");
    succeeds(&dlc(&[
        "run",
        &m,
        &format!("--input=x={xs}"),
        "--save-outputs",
        &out,
    ]));
    let y = HostTensor::read_npy(&Path::new(&out).join("y.npy"), None).unwrap();
    (program, y.data)
}
