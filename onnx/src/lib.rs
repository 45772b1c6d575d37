//! ONNX models into dlc source.
//!
//! `dlc_onnx::import(bytes, &Options { shapes })` turns a serialized `ModelProto`
//! (default domain, opset 13 and later; older models when each of their operators is one
//! whose definition at the model's opset means what the importer implements, listed
//! with the oldest such opset in `OLD_OPSETS`) into one dlc program: an entry point named after
//! the graph whose parameters are the graph's inputs that are not initializers, one
//! `let` per node output in node order, and the graph's outputs returned. `dlc import`
//! prints it; `dlc check|compile|run|bench model.onnx` import first and then do exactly
//! what they do with source, so an imported model goes through the same checks, passes,
//! backends and `--check`. The program is the interface: there is no second path from
//! ONNX into the graph dialect to keep in step with the language.
//!
//! - **Weights stay binary.** Initializers (and `Constant` nodes, and tensors folded
//!   from them) of more than [`WEIGHT_MIN_ELEMENTS`] elements, not all equal, become
//!   `weight` parameters of the entry point, after its inputs, with their values in
//!   [`Imported::weights`]; smaller ones (shapes, axes, scalars) and splats are literals
//!   of the program (`tensor([...], shape, dtype=...)`, `full(...)`), written at their
//!   first use, where constant folding sees them. `dlc run|bench|compile|check
//!   model.onnx` bind the weights as constants when the program is compiled
//!   (`SourceText::weights` in the driver), so the graph is the one literals would
//!   give (a batchnorm after a convolution still folds into its weights at compile
//!   time) without the front end reading millions of numbers as text; `dlc import`
//!   writes them to a safetensors file beside the program (`--inline-weights` writes
//!   literals instead). Tensors kept as external data (`location`, `offset`, `length`:
//!   what PyTorch's torch.export-based exporter writes) are read from the model's
//!   directory ([`Options::model_dir`]); a location outside it is refused, as ONNX's
//!   checker refuses it. The constants the importer computes itself (interpolation
//!   matrices, masks, DFT twiddles) are literals.
//! - **Shapes are static.** Every input needs a fully known shape: a symbolic
//!   dimension is an error naming the input and its ONNX shape, and `--shape
//!   NAME=[d0,d1,...]` supplies it. Values that feed shapes (a `Reshape` target, `Slice`
//!   bounds, reduction axes, `Expand` shapes) must be known at import time; the importer
//!   folds the `Shape`/`Gather`/`Concat`/`Unsqueeze`/`Cast`/arithmetic chains exporters
//!   write around them (on tensors of at most 2^16 elements) and never emits them.
//!   A folded value may be empty (an empty slice of a shape, as the TorchScript
//!   exporter writes for `nn.MultiheadAttention`'s reshapes, concatenated to nothing);
//!   an empty tensor that would become a value of the program is an error.
//! - **Binding inputs.** An input that sets a shape (a `Reshape` target, `Resize`
//!   scales, reduction axes given as a graph input) cannot be a parameter of a
//!   static-shape program; `--bind NAME=PATH.npy` (`Options::bound`) makes it a constant
//!   holding the file's tensor, so the model is specialized to that value.
//! - **Resize** (static scales or sizes, every coordinate transformation, nearest,
//!   linear and cubic, `exclude_outside`, tf_crop_and_resize's extrapolation) is, per
//!   resized axis, a product with a constant `[out, in]` interpolation matrix the
//!   importer computes with ONNX's reference algorithm applied to each output position
//!   (separable, as ONNX defines it), with `keep_aspect_ratio_policy` giving every
//!   resized axis one scale; antialiasing is refused.
//! - **ConvTranspose** (1-D to 3-D, groups, dilation, output padding, `output_shape`,
//!   `auto_pad`) is a convolution of the input spread with `stride - 1` zeros between its
//!   elements (a reshape, a concatenation with `zeros` and a slice per axis) against the
//!   weights with channels swapped per group and every spatial axis reversed (a helper
//!   operator reading `w[.., K - 1 - k]`), padded by `dilation * (kernel - 1)` less the
//!   pads. **Pad** in reflect, edge and wrap modes concatenates one-element slices.
//! - **Attention** (opset 23: 3-D inputs split into heads, grouped-query heads
//!   repeated by a reshape and broadcast, past keys and values prepended and returned as
//!   the present ones, both sides scaled by the square root of `scale`, `softcap`, bool or
//!   float masks padded to the keys' length, the causal bias as a constant, softmax with
//!   fully masked rows giving zeros, `qk_matmul_output_mode`, sliding windows,
//!   `nonpad_kv_seqlen`: keys past each batch's length masked, and the causal and window
//!   masks shifted per batch, from iotas over queries and keys) is a composition. **NegativeLogLikelihoodLoss** and
//!   **SoftmaxCrossEntropyLoss** select each label's score by comparing the labels with
//!   an iota over the classes (weights, `ignore_index`, every reduction).
//! - **Operators.** Each op becomes a built-in call or a composition of built-ins
//!   (`LeakyRelu` is `where(x < 0.0, x * a, x)`, `LogSoftmax` a max, an exp and a sum,
//!   `Gemm` transposes and scales, integer `Div` truncates through a floor division and
//!   a correction, `Tile` concatenates). What the built-ins do not cover becomes a helper
//!   operator in index notation appended to the program: convolutions with asymmetric
//!   padding or 1-D/3-D windows (over grouped views `x: [N, G, C/G, ...]`; a 2-D one,
//!   dilated or not, is `conv2d`),
//!   pooling with ceil mode, dilation or excluded padding (a mask of ones marks the
//!   elements inside the window), `LpPool` (`pow(sum[k](pow(abs(x), p)), 1/p)`), strided and reversed slices, constant padding, running
//!   sums (`CumSum`: a sum against a constant 0/1 matrix). Operators that need an index as
//!   a value use a constant iota: `ArgMax` is the smallest index where the element equals
//!   the maximum, `TopK` (constant k up to 64) k rounds of that with the taken position
//!   masked out, `OneHot` and `Hardmax` compare with it, `Trilu` is a `where` over a
//!   constant mask. `Gather` with indices known only at run time is the language's
//!   `gather`, a graph op that reads only the rows it gives (a load at a data-dependent
//!   index in the loop and tile dialects; an out-of-range index reads zero, where ONNX
//!   leaves it undefined), so an embedding lookup costs the rows it reads.
//!   `GatherElements` is the language's `gather_elements`, and `GatherND` a `gather` of
//!   the data with its batch and indexed axes flattened, at each index tuple's flat
//!   position (`flat_positions`: the coordinates times their strides plus iotas over
//!   the indices' own axes, and the whole extent, which reads zero, for a tuple outside
//!   the data). `ScatterElements` with reduction `add` is the language's
//!   `scatter_add_elements`, `ScatterND`'s its `scatter_add` on the data flattened the
//!   same way; with `none`, the
//!   updates' sum where a count of the indices (a `scatter_add` of ones) is not zero,
//!   the data elsewhere. `TensorScatter` (a key-value cache's update) is such a `none`
//!   scatter of the cache flattened up to its sequence axis, each update row at its
//!   batch's write index plus its own (modulo the axis in `circular` mode; past the end
//!   in `linear` mode, nowhere). So each costs the elements its indices name. With `mul`,
//!   `max` or `min` a scatter is still a reduction over the indices for each element, in
//!   index notation against iotas over the indexed axes and a mask of ones (a read past
//!   the indices is no index). `Einsum` is one operator in index
//!   notation (a sum over the labels the output lacks; an ellipsis aligned right and
//!   broadcast). `CumProd` shares `CumSum`'s prefix mask (applied with a `where`, so an
//!   infinity outside the prefix stays out). `DFT` is a product with constant cosine and
//!   sine matrices along the signal axis, in f64 (forward, inverse, one-sided, and irfft
//!   from a half spectrum). **RNN, GRU and LSTM** are unrolled over the static sequence:
//!   one product for every step's input projection, then per step the recurrent product
//!   and the gates (every direction, layout, initial state, `linear_before_reset`,
//!   peepholes, the activation functions ONNX lists); a `sequence_lens` shorter than the
//!   sequence is refused. `RotaryEmbedding` gathers its caches by `position_ids` through a
//!   `Gather` node of the importer's own (`sub_node`), and `MatMulInteger`/`ConvInteger`
//!   are rewritten as `MatMul`/`Conv` of the importer's own i32 values (`define`,
//!   `rewrite`). So every operator runs on every backend, compiled through the same
//!   pipeline.
//! - **Quantization.** Every ONNX integer and float element type dlc has maps to its
//!   `DType` (f64, i8..i64, u8..u64; float8, int4 and int2 are refused by name).
//!   `QuantizeLinear` is `cast(min(max(round(x / scale) + zero_point, lo), hi), T)` with
//!   the division in the scale's type (or `precision`'s) as ONNX defines it, ties to
//!   even, and the saturation bounds of the output type (the zero point's, else
//!   `output_dtype`, else u8); `DequantizeLinear` is `(x - zero_point) * scale` in f32,
//!   rounded once to the scale's type. Per-tensor parameters are scalars, per-axis ones
//!   are reshaped to broadcast along `axis`, and per-block ones (`block_size`) are
//!   repeated over their blocks by a reshape and a broadcast (cut to the axis when the
//!   last block is short). `MatMulInteger` and `ConvInteger` are the i32 product of the
//!   operands minus their zero points (per tensor, per row, per filter);
//!   `QLinearMatMul` and `QLinearConv` scale that product by `a_scale * b_scale /
//!   y_scale` in f64 (as ONNX's reference promotes it), add the output's zero point and
//!   saturate; `DynamicQuantizeLinear` computes its u8 scale and zero point from the
//!   input's range. Bitwise ops and shifts (`BitShift`, `Bitwise*`) map to the
//!   language's `bitand`/`bitor`/`bitxor`/`shl`/`shr`.
//! - **Errors.** An unsupported op, attribute, element type or data location is an
//!   error naming the node (its name, or its first output), the op and the model's opset:
//!   `node `n1` (TopK, opset 17): this operator is not supported yet`. Every attribute an
//!   op does not read is refused rather than ignored. Malformed protobuf is a decode
//!   error; the importer is fuzzed (`fuzz/fuzz_targets/onnx.rs`; with `DLC_FUZZ_STRICT=1`
//!   it also fails on any program it writes that the front end rejects). Operand types
//!   and shapes are checked by the importer, so a bad model is refused naming its node
//!   rather than with a diagnostic in the generated program.
//! - **Judged by ONNX's node tests.** `make onnx-tests` runs every backend node test of
//!   the `onnx` package (1884 in onnx 1.23) through `dlc run --backend cpu` and compares
//!   at each test's tolerance; see docs/testing.md.

mod data;
mod ops;

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use dlc_core::DType;
use prost::Message as _;

pub use data::{Data, Stored, Values, onnx_code};

/// The ONNX protobuf messages, generated by prost from `proto/onnx.proto`.
#[allow(missing_docs, clippy::all, rust_2018_idioms)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

/// The default-domain opset from which the importer reads every operator
/// it supports. Older models are read when each of their operators is one
/// whose definition at the model's opset means what the importer implements
/// (see `OLD_OPSETS` in `ops.rs`).
pub const MIN_OPSET: i64 = 13;

/// How to import a model.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Shapes for inputs whose ONNX shape has symbolic (or unknown)
    /// dimensions, by ONNX input name.
    pub shapes: Vec<(String, Vec<usize>)>,
    /// Inputs bound to values: each becomes a constant of the program (a
    /// model specialized to them), so that an input that sets a shape, an
    /// axis or a bound can be given.
    pub bound: Vec<(String, Data)>,
    /// The directory of the model's file, where tensors kept as external
    /// data are read (their `location` is relative to it); none for a
    /// model given as bytes, which then cannot have external data.
    pub model_dir: Option<std::path::PathBuf>,
    /// Write every tensor known at import as a literal of the program
    /// (`tensor([...])`), as a self-contained program needs, rather than
    /// the large ones as `weight` parameters ([`Imported::weights`]).
    pub inline_weights: bool,
}

/// An imported model.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The dlc program.
    pub source: String,
    /// Its entry point.
    pub entry: String,
    /// The graph's inputs: ONNX name and the dlc parameter it became.
    pub inputs: Vec<(String, String)>,
    /// The graph's outputs, in order: ONNX name and the dlc value returned.
    pub outputs: Vec<(String, String)>,
    /// The default-domain opset the model declares.
    pub opset: i64,
    /// The entry point's `weight` parameters, after the graph's inputs, and
    /// their values: the model's initializers (and the tensors the importer
    /// folds from them) of more than [`WEIGHT_MIN_ELEMENTS`] elements not all
    /// equal, unless [`Options::inline_weights`].
    pub weights: Vec<(String, Data)>,
}

/// A tensor known at import with more elements than this (and not all
/// equal) is a `weight` parameter of the program rather than a literal.
/// Smaller ones (shapes, axes, scalars) stay literals that the compiler's
/// constant folding sees.
pub const WEIGHT_MIN_ELEMENTS: usize = 16;

/// Why a model could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The bytes are not a valid serialized `ModelProto`.
    #[error("not a valid ONNX model: {0}")]
    Decode(String),
    /// Something about the model as a whole.
    #[error("{0}")]
    Model(String),
    /// An input's shape is not fully known.
    #[error(
        "input `{input}` has {what}; give its shape with --shape {input}=[d0,d1,...] \
         (ONNX shape {shape})"
    )]
    Shape {
        /// The ONNX input name.
        input: String,
        /// What is missing.
        what: String,
        /// The shape as the model writes it.
        shape: String,
    },
    /// A node dlc cannot import.
    #[error("node `{node}` ({op}, opset {opset}): {message}")]
    Node {
        /// The node's name (or its first output's, when unnamed).
        node: String,
        /// Its op type, with its domain when not the default one.
        op: String,
        /// The opset the model declares for that domain.
        opset: i64,
        /// What is wrong.
        message: String,
    },
}

/// What starts the comment naming the node whose lines follow it in an
/// imported program.
const NODE_COMMENT: &str = "// node ";

/// The places of an imported program's text (`source`, as [`import`] wrote
/// it) that come from a node: line (1-based) -> ``node `NAME` (OP)``, for
/// every line from a node's comment to the next comment or the `return`.
/// Errors and profiles of an imported model name the node, not a line of
/// a program the user never saw.
pub fn node_places(source: &str) -> HashMap<u32, String> {
    let mut places = HashMap::new();
    let mut node = None;
    for (i, line) in source.lines().enumerate() {
        let line = line.trim_start();
        if let Some(label) = line.strip_prefix(NODE_COMMENT) {
            node = Some(format!("node {label}"));
        } else if line.starts_with("return ") || line == "}" {
            node = None;
        } else if let Some(label) = &node {
            places.insert(u32::try_from(i + 1).unwrap_or(u32::MAX), label.clone());
        }
    }
    places
}

/// A value of the graph during import.
#[derive(Debug, Clone)]
struct Val {
    dtype: DType,
    shape: Vec<usize>,
    /// The dlc variable holding it, once written.
    var: Option<String>,
    /// Its elements, when known at import time.
    data: Option<Data>,
}

/// Names dlc source cannot use for a variable.
const RESERVED: &[&str] = &[
    "fn", "op", "let", "return", "in", "true", "false", "inf", "nan", "f32", "f16", "bf16", "i32",
    "i64", "bool", "out",
];

/// Imports a serialized ONNX model.
pub fn import(bytes: &[u8], options: &Options) -> Result<Imported, ImportError> {
    let model = pb::ModelProto::decode(bytes).map_err(|e| ImportError::Decode(e.to_string()))?;
    import_model(model, options)
}

/// [`import`] of a model read into `bytes`, which the initializers' raw
/// data then borrow instead of copying (ResNet-18: 45 MB not copied).
pub fn import_owned(bytes: Vec<u8>, options: &Options) -> Result<Imported, ImportError> {
    import_bytes(prost::bytes::Bytes::from(bytes), options)
}

/// [`import`] of a model held in `bytes` (a mapped file: `dlc run` maps
/// the model), which the initializers' raw data and their
/// [`Stored`] bytes are slices of.
pub fn import_bytes(
    bytes: prost::bytes::Bytes,
    options: &Options,
) -> Result<Imported, ImportError> {
    let model = pb::ModelProto::decode(bytes).map_err(|e| ImportError::Decode(e.to_string()))?;
    import_model(model, options)
}

fn import_model(model: pb::ModelProto, options: &Options) -> Result<Imported, ImportError> {
    let mut opset = None;
    for o in &model.opset_import {
        match o.domain() {
            "" | "ai.onnx" => opset = Some(o.version()),
            _ => {}
        }
    }
    let opset = opset.ok_or_else(|| {
        let domains: Vec<&str> = model.opset_import.iter().map(|o| o.domain()).collect();
        ImportError::Model(format!(
            "the model imports only the operator domains {domains:?}; these are not supported \
             (dlc reads the default ai.onnx domain)"
        ))
    })?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| ImportError::Model("the model has no graph".into()))?;
    let mut im = Importer::new(opset, options.model_dir.clone());
    im.inline_weights = options.inline_weights;
    im.run(graph, options)
}

struct Importer {
    opset: i64,
    /// Where external data is read from ([`Options::model_dir`]).
    model_dir: Option<std::path::PathBuf>,
    vals: HashMap<String, Val>,
    taken: HashSet<String>,
    lines: Vec<String>,
    /// Helper operators (index notation) the program needs.
    ops: Vec<String>,
    /// Whether every known tensor is written as a literal.
    inline_weights: bool,
    /// The `weight` parameters written so far, with their values.
    weights: Vec<(String, Data)>,
    /// The variable each constant was written to, by its elements'
    /// identity and its type: a tensor the model names more than once (an
    /// initializer passed through `Identity` nodes, as PyTorch's exporter
    /// shares a parameter used in several places) is one variable, so one
    /// weight to store, bind and prepare, not one per name. Each entry
    /// holds its values, so that no other tensor's can take their address.
    written: HashMap<(usize, DType, Vec<usize>), (String, crate::data::Values)>,
}

impl Importer {
    fn new(opset: i64, model_dir: Option<std::path::PathBuf>) -> Self {
        Importer {
            opset,
            model_dir,
            vals: HashMap::new(),
            taken: RESERVED.iter().map(|s| (*s).to_string()).collect(),
            lines: Vec::new(),
            ops: Vec::new(),
            inline_weights: false,
            weights: Vec::new(),
            written: HashMap::new(),
        }
    }

    /// A fresh dlc identifier resembling `hint`.
    fn fresh(&mut self, hint: &str) -> String {
        let mut base: String = hint
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        base = base.trim_matches('_').to_string();
        if base.is_empty() || base.starts_with(|c: char| c.is_ascii_digit()) {
            base = format!("v{base}");
        }
        if base.len() > 48 {
            base.truncate(48);
        }
        let mut name = base.clone();
        let mut k = 1;
        while self.taken.contains(&name) || dlc_lang::is_builtin(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        self.taken.insert(name.clone());
        name
    }

    fn run(&mut self, graph: &pb::GraphProto, options: &Options) -> Result<Imported, ImportError> {
        let entry = self.fresh(if graph.name().is_empty() {
            "main"
        } else {
            graph.name()
        });
        for t in &graph.initializer {
            let d = data::decode(t, self.model_dir.as_deref())
                .map_err(|m| ImportError::Model(format!("initializer: {m}")))?;
            self.vals.insert(
                t.name().to_string(),
                Val {
                    dtype: d.dtype,
                    shape: d.shape.clone(),
                    var: None,
                    data: Some(d),
                },
            );
        }
        let mut params = Vec::new();
        let mut inputs = Vec::new();
        for (name, _) in &options.bound {
            if !graph.input.iter().any(|i| i.name() == name) {
                return Err(ImportError::Model(format!(
                    "--bind {name}: the model has no input `{name}`"
                )));
            }
        }
        for input in &graph.input {
            if let Some((_, d)) = options.bound.iter().find(|(n, _)| n == input.name()) {
                // NumPy has no bfloat16: a bf16 input is bound from float32.
                let bf16 = input_type(input, options).is_ok_and(|(t, _)| t == DType::BF16);
                let d = &if bf16 && d.dtype == DType::F32 {
                    Data::new(
                        DType::BF16,
                        d.shape.clone(),
                        d.values.iter().map(|&v| DType::BF16.round(v)).collect(),
                    )
                } else {
                    d.clone()
                };
                let declared = input_type(
                    input,
                    &Options {
                        shapes: vec![(input.name().to_string(), d.shape.clone())],
                        bound: vec![],
                        model_dir: None,
                        inline_weights: false,
                    },
                );
                let (dtype, shape) = match declared {
                    Ok((dt, sh)) if dt == d.dtype && sh == d.shape => (dt, sh),
                    Ok((dt, sh)) => {
                        return Err(ImportError::Model(format!(
                            "--bind {}: the input is {}, the value {}",
                            input.name(),
                            type_text(dt, &sh),
                            type_text(d.dtype, &d.shape)
                        )));
                    }
                    Err(e) => {
                        return Err(ImportError::Model(format!(
                            "--bind {}: the value {} does not fit the input ({e})",
                            input.name(),
                            type_text(d.dtype, &d.shape)
                        )));
                    }
                };
                self.vals.insert(
                    input.name().to_string(),
                    Val {
                        dtype,
                        shape,
                        var: None,
                        data: Some(d.clone()),
                    },
                );
                continue;
            }
            // Inputs that are also initializers are constants here (opset
            // >= 9 lets them be overridden; dlc takes the stored value).
            if self.vals.contains_key(input.name()) {
                continue;
            }
            let (dtype, shape) = input_type(input, options)?;
            let var = self.fresh(input.name());
            params.push(format!("{var}: {}", type_text(dtype, &shape)));
            inputs.push((input.name().to_string(), var.clone()));
            self.vals.insert(
                input.name().to_string(),
                Val {
                    dtype,
                    shape,
                    var: Some(var),
                    data: None,
                },
            );
        }
        // Each node's lines follow a comment naming it (none for a node
        // folded away): what `node_places` reads back.
        for node in &graph.node {
            let (name, op) = ops::node_label(node);
            let start = self.lines.len();
            self.lines.push(format!(
                "{NODE_COMMENT}`{}` ({})",
                escape(&name),
                escape(&op)
            ));
            self.node(node)?;
            if self.lines.len() == start + 1 {
                self.lines.pop();
            }
        }
        let mut outputs = Vec::new();
        let mut types = Vec::new();
        let mut returned = Vec::new();
        for out in &graph.output {
            let name = out.name();
            let v = self.vals.get(name).cloned().ok_or_else(|| {
                ImportError::Model(format!("graph output `{name}` is not produced by any node"))
            })?;
            let var = self.var_of(name)?;
            types.push(type_text(v.dtype, &v.shape));
            returned.push(var.clone());
            outputs.push((name.to_string(), var));
        }
        if outputs.is_empty() {
            return Err(ImportError::Model("the graph has no outputs".into()));
        }
        let mut src = String::new();
        let _ = writeln!(
            src,
            "// Imported from ONNX (opset {}) by `dlc import`.",
            self.opset
        );
        for (onnx, var) in &inputs {
            if onnx != var {
                let _ = writeln!(src, "// input `{}` is parameter `{var}`", escape(onnx));
            }
        }
        for (onnx, var) in &outputs {
            if onnx != var {
                let _ = writeln!(src, "// output `{}` is `{var}`", escape(onnx));
            }
        }
        for op in &self.ops {
            src.push_str(op);
            src.push('\n');
        }
        let (ret_ty, ret) = if types.len() == 1 {
            (types[0].clone(), returned[0].clone())
        } else {
            (
                format!("({})", types.join(", ")),
                format!("({})", returned.join(", ")),
            )
        };
        for (var, d) in &self.weights {
            params.push(format!("weight {var}: {}", type_text(d.dtype, &d.shape)));
        }
        let _ = writeln!(src, "fn {entry}({}) -> {ret_ty} {{", params.join(", "));
        for line in &self.lines {
            let _ = writeln!(src, "    {line}");
        }
        let _ = writeln!(src, "    return {ret};\n}}");
        Ok(Imported {
            source: src,
            entry,
            inputs,
            outputs,
            opset: self.opset,
            weights: std::mem::take(&mut self.weights),
        })
    }

    /// The dlc variable of a value, writing its constant first if needed.
    fn var_of(&mut self, name: &str) -> Result<String, ImportError> {
        let v = self.vals.get(name).ok_or_else(|| {
            ImportError::Model(format!("value `{name}` is used before it is defined"))
        })?;
        if let Some(var) = &v.var {
            return Ok(var.clone());
        }
        let Some(d) = v.data.clone() else {
            return Err(ImportError::Model(format!(
                "value `{name}` has no definition"
            )));
        };
        if d.is_empty() {
            return Err(ImportError::Model(format!(
                "value `{name}` is empty ({}); dlc tensors have positive extents, so an empty \
                 tensor may only feed shape computations the importer folds",
                type_text(d.dtype, &d.shape)
            )));
        }
        let key = (d.values.identity(), d.dtype, d.shape.clone());
        let var = match self.written.get(&key) {
            Some((var, _)) => var.clone(),
            None => {
                let var = self.fresh(name);
                self.written.insert(key, (var.clone(), d.values.clone()));
                if !self.inline_weights && is_weight(&d) {
                    self.weights.push((var.clone(), d));
                } else {
                    let text = constant_text(&d);
                    self.lines.push(format!("let {var} = {text};"));
                }
                var
            }
        };
        if let Some(v) = self.vals.get_mut(name) {
            v.var = Some(var.clone());
        }
        Ok(var)
    }
}

fn escape(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// `f32[2, 3]`, `f32[]` for a scalar.
pub(crate) fn type_text(dtype: DType, shape: &[usize]) -> String {
    format!("{dtype}{}", shape_text(shape))
}

/// `[2, 3]`.
pub(crate) fn shape_text(shape: &[usize]) -> String {
    let items: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// A number as a dlc expression of `dtype`: a literal (floats always with
/// `.` or an exponent), or for infinities and NaN a scalar `tensor`.
pub(crate) fn literal(v: f64, dtype: DType) -> String {
    if dtype.is_float() && !v.is_finite() {
        format!("tensor([{}], [], dtype={dtype})", element(v, dtype))
    } else {
        element(v, dtype)
    }
}

/// A number as an element of a `tensor` list (`inf`, `-inf` and `nan` by
/// name).
pub(crate) fn element(v: f64, dtype: DType) -> String {
    if dtype.is_float() {
        if v.is_nan() {
            "nan".into()
        } else if v.is_infinite() {
            if v > 0.0 { "inf".into() } else { "-inf".into() }
        } else {
            let s = if dtype == DType::F32 {
                format!("{:?}", v as f32)
            } else {
                format!("{v:?}")
            };
            if s.contains(['.', 'e', 'E']) {
                s
            } else {
                format!("{s}.0")
            }
        }
    } else if dtype == DType::Bool {
        (if v != 0.0 { "true" } else { "false" }).into()
    } else if dtype == DType::U64 {
        format!("{}", v as u64)
    } else {
        format!("{}", v as i64)
    }
}

/// Whether every element of `d` is the first one (its first element).
fn splat(d: &Data) -> Option<f64> {
    // Not decoding a stored tensor for this: its elements' bytes all the
    // first one's (NaNs of other payloads are then not a splat).
    if !d.values.is_decoded()
        && let Some(s) = &d.stored
    {
        let width = d.dtype.size_bytes();
        let first = s.bytes.get(..width)?;
        return s
            .bytes
            .chunks_exact(width)
            .all(|c| c == first)
            .then(|| d.dtype.from_le_bytes(first));
    }
    let first = *d.values.first()?;
    d.values
        .iter()
        .all(|v| v.to_bits() == first.to_bits() || (v.is_nan() && first.is_nan()))
        .then_some(first)
}

/// Whether a known tensor is a `weight` parameter of the program rather
/// than a literal: more than [`WEIGHT_MIN_ELEMENTS`] elements, not all
/// equal (those are `full(...)`, short to write).
fn is_weight(d: &Data) -> bool {
    d.len() > WEIGHT_MIN_ELEMENTS && splat(d).is_none()
}

/// A constant as a dlc expression.
pub(crate) fn constant_text(d: &Data) -> String {
    if let Some(first) = splat(d)
        && first.is_finite()
        && d.dtype != DType::Bool
    {
        return format!(
            "full({}, {}, dtype={})",
            shape_text(&d.shape),
            literal(first, d.dtype),
            d.dtype
        );
    }
    let mut s = String::with_capacity(d.values.len() * 8 + 40);
    s.push_str("tensor([");
    for (i, v) in d.values.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&element(*v, d.dtype));
    }
    let _ = write!(s, "], {}, dtype={})", shape_text(&d.shape), d.dtype);
    s
}

fn input_type(
    input: &pb::ValueInfoProto,
    options: &Options,
) -> Result<(DType, Vec<usize>), ImportError> {
    use pb::type_proto::Value as T;
    let name = input.name();
    let Some(T::TensorType(t)) = input.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(ImportError::Model(format!(
            "input `{name}` is not a tensor (sequences, maps and optionals are not supported)"
        )));
    };
    let dtype = data::dtype_of(t.elem_type()).ok_or_else(|| {
        ImportError::Model(format!(
            "input `{name}` has element type {}, which dlc does not support ({})",
            data::onnx_type_name(t.elem_type()),
            data::SUPPORTED_TYPES
        ))
    })?;
    let given = options
        .shapes
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, s)| s.clone());
    let dims: Option<Vec<Option<i64>>> = t.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(pb::tensor_shape_proto::dimension::Value::DimValue(v)) if *v > 0 => Some(*v),
                _ => None,
            })
            .collect()
    });
    let written = match &t.shape {
        None => "unknown".to_string(),
        Some(s) => {
            let items: Vec<String> = s
                .dim
                .iter()
                .map(|d| match &d.value {
                    Some(pb::tensor_shape_proto::dimension::Value::DimValue(v)) => v.to_string(),
                    Some(pb::tensor_shape_proto::dimension::Value::DimParam(p)) => p.clone(),
                    None => "?".into(),
                })
                .collect();
            format!("[{}]", items.join(", "))
        }
    };
    if let Some(shape) = given {
        if let Some(dims) = &dims {
            let fits = dims.len() == shape.len()
                && dims
                    .iter()
                    .zip(&shape)
                    .all(|(d, &s)| d.is_none_or(|d| d as usize == s));
            if !fits {
                return Err(ImportError::Model(format!(
                    "--shape {name}={} does not fit the model's shape {written}",
                    shape_text(&shape)
                )));
            }
        }
        if shape.contains(&0) {
            return Err(ImportError::Model(format!(
                "--shape {name}: dimensions must be positive"
            )));
        }
        return Ok((dtype, shape));
    }
    match dims {
        None => Err(ImportError::Shape {
            input: name.into(),
            what: "no shape".into(),
            shape: written,
        }),
        Some(dims) => {
            if let Some(i) = t.shape.iter().flat_map(|s| &s.dim).position(|d| {
                matches!(
                    d.value,
                    Some(pb::tensor_shape_proto::dimension::Value::DimValue(0))
                )
            }) {
                return Err(ImportError::Model(format!(
                    "input `{name}` has extent 0 on axis {i} (shape {written}); dlc tensors have \
                     positive extents, so empty tensors are not supported"
                )));
            }
            if let Some(i) = dims.iter().position(Option::is_none) {
                let what = match &t.shape.as_ref().map(|s| &s.dim[i].value) {
                    Some(Some(pb::tensor_shape_proto::dimension::Value::DimParam(p))) => {
                        format!("a symbolic dimension `{p}`")
                    }
                    _ => format!("an unknown dimension (axis {i})"),
                };
                return Err(ImportError::Shape {
                    input: name.into(),
                    what,
                    shape: written,
                });
            }
            Ok((
                dtype,
                dims.into_iter().map(|d| d.unwrap_or(1) as usize).collect(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_read_back_as_their_type() {
        assert_eq!(literal(0.1f32 as f64, DType::F32), "0.1");
        assert_eq!(literal(2.0, DType::F32), "2.0");
        assert_eq!(literal(1e-7f32 as f64, DType::F32), "1e-7");
        assert_eq!(element(f64::NEG_INFINITY, DType::F16), "-inf");
        assert_eq!(
            literal(f64::NAN, DType::F32),
            "tensor([nan], [], dtype=f32)"
        );
        assert_eq!(literal(-3.0, DType::I64), "-3");
        assert_eq!(literal(1.0, DType::Bool), "true");
    }

    #[test]
    fn names_become_identifiers() {
        let mut im = Importer::new(17, None);
        assert_eq!(im.fresh("input.1"), "input_1");
        assert_eq!(im.fresh("input:1"), "input_1_1");
        assert_eq!(im.fresh("0"), "v0");
        assert_eq!(im.fresh("relu"), "relu_1");
        assert_eq!(im.fresh("fn"), "fn_1");
        assert_eq!(im.fresh("/conv/Conv_output_0"), "conv_Conv_output_0");
    }

    #[test]
    fn external_data_needs_the_models_directory() {
        let entry = |k: &str, v: &str| pb::StringStringEntryProto {
            key: Some(k.into()),
            value: Some(v.into()),
        };
        let model = pb::ModelProto {
            opset_import: vec![pb::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(pb::GraphProto {
                initializer: vec![pb::TensorProto {
                    name: Some("w".into()),
                    dims: vec![4],
                    data_type: Some(onnx_code(DType::F32)),
                    data_location: Some(1),
                    external_data: vec![entry("location", "w.bin"), entry("length", "16")],
                    ..Default::default()
                }],
                output: vec![pb::ValueInfoProto {
                    name: Some("w".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = import(&model.encode_to_vec(), &Options::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "initializer: tensor `w` keeps its data in the external file `w.bin`, and a model \
             given as bytes has no directory to find it in; import the model from its file"
        );
    }

    /// An initializer stored as raw bytes that only becomes a weight keeps
    /// them and is never decoded into `f64`s, passed through `Identity`
    /// too (and is one weight under both names); one the importer folds is
    /// decoded, and the folded result has no stored bytes; one whose bytes
    /// are all the same is a `full` literal, found without decoding it.
    #[test]
    fn stored_weights_are_not_decoded() {
        let raw = |name: &str, f: &dyn Fn(usize) -> f32| pb::TensorProto {
            name: Some(name.into()),
            dims: vec![8, 8],
            data_type: Some(onnx_code(DType::F32)),
            raw_data: Some(
                (0..64)
                    .flat_map(|i| f(i).to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into(),
            ),
            ..Default::default()
        };
        let node = |op: &str, input: [&str; 2], output: &str| pb::NodeProto {
            op_type: Some(op.into()),
            input: input.iter().map(ToString::to_string).collect(),
            output: vec![output.into()],
            ..Default::default()
        };
        let model = pb::ModelProto {
            opset_import: vec![pb::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(pb::GraphProto {
                node: vec![
                    pb::NodeProto {
                        op_type: Some("Identity".into()),
                        input: vec!["w".into()],
                        output: vec!["w_again".into()],
                        ..Default::default()
                    },
                    node("MatMul", ["x", "w"], "p"),
                    node("Mul", ["v", "v"], "vv"),
                    node("MatMul", ["p", "vv"], "q"),
                    node("MatMul", ["q", "w_again"], "r"),
                    node("Add", ["r", "ones"], "y"),
                ],
                initializer: vec![
                    raw("w", &|i| i as f32 / 64.0),
                    raw("v", &|i| 1.0 - i as f32 / 64.0),
                    raw("ones", &|_| 1.0),
                ],
                input: vec![pb::ValueInfoProto {
                    name: Some("x".into()),
                    r#type: Some(pb::TypeProto {
                        value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                            elem_type: Some(onnx_code(DType::F32)),
                            shape: Some(pb::TensorShapeProto {
                                dim: vec![
                                    pb::tensor_shape_proto::Dimension {
                                        value: Some(
                                            pb::tensor_shape_proto::dimension::Value::DimValue(8),
                                        ),
                                        ..Default::default()
                                    },
                                    pb::tensor_shape_proto::Dimension {
                                        value: Some(
                                            pb::tensor_shape_proto::dimension::Value::DimValue(8),
                                        ),
                                        ..Default::default()
                                    },
                                ],
                            }),
                        })),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                output: vec![pb::ValueInfoProto {
                    name: Some("y".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let bytes = prost::bytes::Bytes::from(model.encode_to_vec());
        let imported = import_bytes(bytes.clone(), &Options::default()).unwrap();
        let names: Vec<&str> = imported.weights.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["w", "vv"]);
        let (w, vv) = (&imported.weights[0].1, &imported.weights[1].1);
        assert!(!w.values.is_decoded());
        let stored = w.stored.as_ref().unwrap();
        assert!(stored.external.is_none());
        // A slice of the model's own buffer.
        let at = stored.bytes.as_ptr() as usize - bytes.as_ptr() as usize;
        assert_eq!(&bytes[at..at + 256], &stored.bytes[..]);
        assert_eq!(w.values[9], 9.0 / 64.0);
        assert!(vv.values.is_decoded() && vv.stored.is_none());
        assert_eq!(vv.values[1], (63.0f64 / 64.0).powi(2));
        assert!(
            imported.source.contains("= full([8, 8], 1.0"),
            "{}",
            imported.source
        );
    }

    #[test]
    fn garbage_is_an_error() {
        for bytes in [&b"\xff\xff\xff"[..], b"not a model", &[]] {
            assert!(import(bytes, &Options::default()).is_err());
        }
    }
}
