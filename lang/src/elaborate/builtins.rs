//! Every built-in function of the language, declared once: its name, its
//! parameters (kind, default) and the function that expands a call of it
//! into graph ops. The table drives recognition (`is_builtin`; a
//! primitive's name is reserved, `is_reserved`), argument binding (positional or by keyword, checked
//! against the parameters here), the diagnostics of a bad call (unknown
//! function, unknown or missing argument), the index of built-ins in
//! docs/language.md (rendered by [`markdown`], printed by `dlc builtins`; a
//! test checks the two agree). The element-wise rows come from
//! `dlc_core::scalar`'s names, which the ONNX importer maps its element-wise
//! ops through too.
//!
//! The expansions live beside the ops they build: the primitives in
//! `elaborate.rs`, the compositions in `composite.rs`, the losses,
//! optimizers and schedules in `training.rs`. A default written as a value
//! here is the one the expansion reads ([`Call::float`], [`Call::int`],
//! [`Call::flag`], [`Call::dtype`]); a default the expansion computes from
//! the other arguments says so in words ([`Default::Computed`]).

use std::sync::LazyLock;

use super::*;

/// What an argument is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A tensor expression.
    Tensor,
    /// A tensor expression or a number (which takes the other operand's type).
    Operand,
    /// A list of tensors: `[a, b]`.
    Tensors,
    /// A constant integer (a number or a dimension name).
    Int,
    /// A constant integer or a list of them (axes, a pair of extents).
    Ints,
    /// A list of constant integers (a shape, sizes, paddings).
    Shape,
    /// A constant number.
    Float,
    /// `true` or `false`.
    Bool,
    /// An element type: `f32`, `i64`, ...
    DType,
    /// A learning rate: a positive number or a float scalar tensor.
    Rate,
    /// A flat list of numbers or of `true`/`false`.
    Values,
    /// A call of a `fn`.
    Call,
    /// A list of argument names of that call.
    Names,
}

impl Kind {
    /// How the index of built-ins writes it.
    pub fn text(self) -> &'static str {
        match self {
            Kind::Tensor => "tensor",
            Kind::Operand => "tensor or number",
            Kind::Tensors => "[tensor]",
            Kind::Int => "int",
            Kind::Ints => "int or [int]",
            Kind::Shape => "[int]",
            Kind::Float => "float",
            Kind::Bool => "bool",
            Kind::DType => "dtype",
            Kind::Rate => "float or scalar",
            Kind::Values => "[number]",
            Kind::Call => "call",
            Kind::Names => "[name]",
        }
    }
}

/// What a parameter is when its argument is left out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Default {
    /// It cannot be.
    Required,
    /// This value, written as in a program (`0.01`, `-1`, `false`, `f32`).
    Value(&'static str),
    /// What the expansion computes from the other arguments, in words.
    Computed(&'static str),
}

/// A parameter of a built-in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Param {
    /// Its keyword.
    pub name: &'static str,
    /// What its argument is.
    pub kind: Kind,
    /// What it is when left out.
    pub default: Default,
}

/// The part of docs/language.md's index a built-in is listed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Section {
    /// Element-wise functions.
    Elementwise,
    /// Activations.
    Activation,
    /// Logical and bitwise operators.
    Logical,
    /// Reductions and normalizations.
    Reduction,
    /// Shape changes.
    Shape,
    /// Index-valued functions and gathers.
    Index,
    /// Convolution, pooling and layers.
    Network,
    /// Constants and types.
    Constant,
    /// Gradients.
    Gradient,
    /// Losses.
    Loss,
    /// Optimizer updates and mixed precision.
    Optimizer,
    /// Learning-rate schedules.
    Schedule,
}

impl Section {
    /// Every section, in the index's order.
    pub const ALL: [Section; 12] = [
        Section::Elementwise,
        Section::Activation,
        Section::Logical,
        Section::Reduction,
        Section::Shape,
        Section::Index,
        Section::Network,
        Section::Constant,
        Section::Gradient,
        Section::Loss,
        Section::Optimizer,
        Section::Schedule,
    ];

    fn title(self) -> &'static str {
        match self {
            Section::Elementwise => "Element-wise",
            Section::Activation => "Activations",
            Section::Logical => "Logical and bitwise",
            Section::Reduction => "Reductions and normalizations",
            Section::Shape => "Shapes",
            Section::Index => "Indices and gathers",
            Section::Network => "Convolution, pooling and layers",
            Section::Constant => "Constants and types",
            Section::Gradient => "Gradients",
            Section::Loss => "Losses",
            Section::Optimizer => "Optimizer updates and mixed precision",
            Section::Schedule => "Learning-rate schedules",
        }
    }
}

/// Expands a bound call into graph ops.
pub(super) type Expand = fn(&mut Elab<'_>, &mut FnCx, &Call<'_>) -> R<EVal>;

/// A built-in function.
pub struct Builtin {
    /// What a program calls it.
    pub name: &'static str,
    /// Where the index lists it.
    pub section: Section,
    /// Its parameters, the required ones first.
    pub params: &'static [Param],
    /// Takes any number of tensors by position instead of `params`.
    pub variadic: bool,
    /// Whether no program may define a function of this name: true of the
    /// primitives. A program's own `fn` or `op` named like a composition or
    /// a training built-in (`gemm`, `split`, `adam`) is called in its place,
    /// as Python lets a module shadow a library function.
    pub reserved: bool,
    pub(super) expand: Expand,
}

impl Builtin {
    /// `name(p: kind, q: kind = default, ...)`.
    pub fn signature(&self) -> String {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|p| {
                let dots = if self.variadic { ", ..." } else { "" };
                match p.default {
                    Default::Required => format!("{}: {}{dots}", p.name, p.kind.text()),
                    Default::Value(v) => format!("{}: {} = {v}", p.name, p.kind.text()),
                    Default::Computed(w) => format!("{}: {} = <{w}>", p.name, p.kind.text()),
                }
            })
            .collect();
        format!("{}({})", self.name, params.join(", "))
    }

    fn required(&self) -> usize {
        self.params
            .iter()
            .take_while(|p| p.default == Default::Required)
            .count()
    }
}

/// A call of a built-in, its arguments bound to its parameters.
pub(super) struct Call<'e> {
    pub(super) builtin: &'static Builtin,
    /// The arguments as written.
    pub(super) args: &'e [Arg],
    /// The argument of each parameter, by position in `builtin.params`.
    pub(super) a: Vec<Option<&'e Expr>>,
    pub(super) span: Span,
}

impl Call<'_> {
    pub(super) fn name(&self) -> &'static str {
        self.builtin.name
    }

    /// The default value of parameter `i`, as written in the table.
    fn default_text(&self, i: usize) -> &'static str {
        match self.builtin.params[i].default {
            Default::Value(v) => v,
            _ => unreachable!(
                "`{}`'s parameter `{}` has no default value",
                self.name(),
                self.builtin.params[i].name
            ),
        }
    }

    /// Number argument `i`, or its default.
    pub(super) fn float(&self, i: usize) -> R<f64> {
        match self.a[i] {
            Some(e) => Ok(const_float(e)?.0),
            None => Ok(default_float(self.default_text(i))),
        }
    }

    /// Integer argument `i` (dimension names allowed), or its default.
    pub(super) fn int(&self, i: usize, dims: &HashMap<String, usize>) -> R<i64> {
        match self.a[i] {
            Some(e) => const_int(e, dims),
            None => Ok(default_int(self.default_text(i))),
        }
    }

    /// `true`/`false` argument `i`, or its default.
    pub(super) fn flag(&self, i: usize) -> R<bool> {
        match self.a[i] {
            Some(e) => const_bool(e),
            None => Ok(self.default_text(i) == "true"),
        }
    }

    /// Axis argument `i` of an operand of type `ty` (negative counts from
    /// the end), or its default.
    pub(super) fn axis(
        &self,
        i: usize,
        ty: &TensorType,
        dims: &HashMap<String, usize>,
    ) -> R<usize> {
        match self.a[i] {
            Some(e) => normalize_axis(const_int(e, dims)?, ty, e.span),
            None => normalize_axis(default_int(self.default_text(i)), ty, self.span),
        }
    }

    /// Argument `i` given as `n` or `[h, w]` (a stride, a padding), or its
    /// default (one integer for both).
    pub(super) fn pair(&self, i: usize, dims: &HashMap<String, usize>) -> R<[usize; 2]> {
        self.ints(i, dims)
    }

    /// Argument `i` given as `n` or `[n0, .., n(N-1)]` (a 3-D stride or
    /// padding), or its default (one integer for every axis).
    pub(super) fn ints<const N: usize>(
        &self,
        i: usize,
        dims: &HashMap<String, usize>,
    ) -> R<[usize; N]> {
        match self.a[i] {
            Some(_) => ints_arg(self.a[i], [0; N], self.builtin.params[i].name, dims),
            None => {
                let v = default_int(self.default_text(i));
                let v = usize::try_from(v).unwrap_or_else(|_| unreachable!("a negative default"));
                Ok([v; N])
            }
        }
    }

    /// Number argument `i` checked by `check` (which names the parameter in
    /// its error), or its default.
    pub(super) fn checked(&self, i: usize, check: fn(&Expr, &str) -> R<f64>) -> R<f64> {
        match self.a[i] {
            Some(e) => check(e, self.builtin.params[i].name),
            None => Ok(default_float(self.default_text(i))),
        }
    }

    /// Element-type argument `i`, or its default.
    pub(super) fn dtype(&self, i: usize) -> R<DType> {
        match self.a[i] {
            Some(e) => dtype_arg(e),
            None => Ok(default_dtype(self.default_text(i))),
        }
    }
}

fn default_float(text: &str) -> f64 {
    text.parse()
        .unwrap_or_else(|_| unreachable!("`{text}` is not a number (a test checks the table)"))
}

fn default_int(text: &str) -> i64 {
    text.parse()
        .unwrap_or_else(|_| unreachable!("`{text}` is not an integer (a test checks the table)"))
}

fn default_dtype(text: &str) -> DType {
    text.parse()
        .unwrap_or_else(|_| unreachable!("`{text}` is not a type (a test checks the table)"))
}

const fn required(name: &'static str, kind: Kind) -> Param {
    Param {
        name,
        kind,
        default: Default::Required,
    }
}

const fn optional(name: &'static str, kind: Kind, value: &'static str) -> Param {
    Param {
        name,
        kind,
        default: Default::Value(value),
    }
}

const fn computed(name: &'static str, kind: Kind, what: &'static str) -> Param {
    Param {
        name,
        kind,
        default: Default::Computed(what),
    }
}

use Kind::{Bool, Float, Int, Ints, Operand, Rate, Shape, Tensor, Tensors};
use Section as S;

const X: Param = required("x", Tensor);
const UNARY: &[Param] = &[X];
const PAIR: &[Param] = &[required("x", Operand), required("y", Operand)];
const EPS: Param = optional("eps", Float, "1e-5");
const REDUCE: &[Param] = &[
    X,
    computed("axis", Ints, "every axis"),
    optional("keepdims", Bool, "false"),
];
/// `conv2d`'s and `conv3d`'s parameters: a stride, padding and dilation
/// per spatial axis.
const CONV: &[Param] = &[
    X,
    required("w", Tensor),
    optional("stride", Ints, "1"),
    optional("padding", Ints, "0"),
    optional("groups", Int, "1"),
    optional("dilation", Ints, "1"),
];

const POOL1: &[Param] = &[
    X,
    required("kernel", Int),
    computed("stride", Int, "kernel"),
    optional("padding", Int, "0"),
];
const POOL2: &[Param] = &[
    X,
    required("kernel", Ints),
    computed("stride", Ints, "kernel"),
    optional("padding", Ints, "0"),
];
const LOSS: &[Param] = &[X, required("y", Tensor)];
const GATHER: &[Param] = &[X, required("indices", Tensor), optional("axis", Int, "0")];
const SCATTER: &[Param] = &[
    X,
    required("indices", Tensor),
    required("updates", Tensor),
    optional("axis", Int, "0"),
];
const ADAM: &[Param] = &[
    required("w", Tensor),
    required("g", Tensor),
    required("m", Tensor),
    required("v", Tensor),
    required("step", Operand),
    optional("lr", Rate, "0.001"),
    optional("beta1", Float, "0.9"),
    optional("beta2", Float, "0.999"),
    optional("eps", Float, "1e-8"),
];

/// The table's rows written out (the element-wise functions of one
/// operand and the bitwise operators are [`GENERATED`]).
static WRITTEN: &[Builtin] = &[
    b("pow", S::Elementwise, PAIR, |e, cx, c| e.call_binary(cx, c)),
    b("max", S::Reduction, REDUCE, |e, cx, c| e.call_sum(cx, c)),
    b("min", S::Reduction, REDUCE, |e, cx, c| e.call_sum(cx, c)),
    b("sum", S::Reduction, REDUCE, |e, cx, c| e.call_sum(cx, c)),
    b("mean", S::Reduction, REDUCE, |e, cx, c| e.call_sum(cx, c)),
    b("prod", S::Reduction, REDUCE, |e, cx, c| e.call_sum(cx, c)),
    b(
        "softmax",
        S::Reduction,
        const { &[X, optional("axis", Int, "-1")] },
        |e, cx, c| e.call_softmax(cx, c),
    ),
    b(
        "layernorm",
        S::Reduction,
        const { &[X, optional("axis", Ints, "-1"), EPS] },
        |e, cx, c| e.call_layernorm(cx, c),
    ),
    b(
        "reshape",
        S::Shape,
        const { &[X, required("shape", Shape)] },
        |e, cx, c| e.call_reshape(cx, c),
    ),
    b(
        "transpose",
        S::Shape,
        const { &[X, computed("perm", Ints, "the axes reversed")] },
        |e, cx, c| e.call_transpose(cx, c),
    ),
    b(
        "concat",
        S::Shape,
        const { &[required("tensors", Tensors), optional("axis", Int, "0")] },
        |e, cx, c| e.call_concat(cx, c),
    ),
    b(
        "slice",
        S::Shape,
        const {
            &[
                X,
                optional("axis", Int, "0"),
                optional("start", Int, "0"),
                computed("end", Int, "the axis's extent"),
            ]
        },
        |e, cx, c| e.call_slice(cx, c),
    ),
    b(
        "broadcast",
        S::Shape,
        const { &[X, required("shape", Shape)] },
        |e, cx, c| e.call_broadcast(cx, c),
    ),
    b("conv2d", S::Network, CONV, |e, cx, c| e.call_conv2d(cx, c)),
    b("maxpool2d", S::Network, POOL2, |e, cx, c| {
        e.call_maxpool2d(cx, c)
    }),
    b("avgpool2d", S::Network, POOL2, |e, cx, c| {
        e.call_maxpool2d(cx, c)
    }),
    b(
        "batchnorm",
        S::Network,
        const {
            &[
                X,
                required("mean", Tensor),
                required("var", Tensor),
                required("gamma", Tensor),
                required("beta", Tensor),
                EPS,
            ]
        },
        |e, cx, c| e.call_batchnorm(cx, c),
    ),
    b(
        "cast",
        S::Constant,
        const { &[X, required("dtype", Kind::DType)] },
        |e, cx, c| e.call_cast(cx, c),
    ),
    b(
        "where",
        S::Elementwise,
        const {
            &[
                required("cond", Tensor),
                required("a", Operand),
                required("b", Operand),
            ]
        },
        |e, cx, c| e.call_where(cx, c),
    ),
    b(
        "zeros",
        S::Constant,
        const {
            &[
                required("shape", Shape),
                optional("dtype", Kind::DType, "f32"),
            ]
        },
        |e, cx, c| e.call_zeros(cx, c),
    ),
    b(
        "ones",
        S::Constant,
        const {
            &[
                required("shape", Shape),
                optional("dtype", Kind::DType, "f32"),
            ]
        },
        |e, cx, c| e.call_zeros(cx, c),
    ),
    b(
        "full",
        S::Constant,
        const {
            &[
                required("shape", Shape),
                required("value", Float),
                computed("dtype", Kind::DType, "f32 or i64, as the value is written"),
            ]
        },
        |e, cx, c| e.call_zeros(cx, c),
    ),
    b(
        "tensor",
        S::Constant,
        const {
            &[
                required("values", Kind::Values),
                required("shape", Shape),
                computed("dtype", Kind::DType, "as the values are written"),
            ]
        },
        |e, cx, c| e.call_tensor(cx, c),
    ),
    b(
        "value_and_grad",
        S::Gradient,
        const {
            &[
                required("call", Kind::Call),
                computed("wrt", Kind::Names, "the callee's weights"),
                computed("autocast", Kind::DType, "none"),
                computed("scale", Rate, "none"),
            ]
        },
        |e, cx, c| e.value_and_grad(cx, c),
    ),
    b(
        "checkpoint",
        S::Gradient,
        const { &[required("call", Kind::Call)] },
        |e, cx, c| e.checkpoint(cx, c),
    ),
    // Compositions (composite.rs).
    lib(
        "leaky_relu",
        S::Activation,
        const { &[X, optional("alpha", Float, "0.01")] },
        |e, cx, c| e.call_leaky_relu(cx, c),
    ),
    lib(
        "elu",
        S::Activation,
        const { &[X, optional("alpha", Float, "1.0")] },
        |e, cx, c| e.call_elu(cx, c),
    ),
    lib(
        "hardsigmoid",
        S::Activation,
        const {
            &[
                X,
                optional("alpha", Float, "0.2"),
                optional("beta", Float, "0.5"),
            ]
        },
        |e, cx, c| e.call_hardsigmoid(cx, c),
    ),
    lib("softplus", S::Activation, UNARY, |e, cx, c| {
        e.call_softplus(cx, c)
    }),
    lib("hardswish", S::Activation, UNARY, |e, cx, c| {
        e.call_softplus(cx, c)
    }),
    lib("mish", S::Activation, UNARY, |e, cx, c| {
        e.call_softplus(cx, c)
    }),
    lib("log1p", S::Elementwise, UNARY, |e, cx, c| {
        e.call_softplus(cx, c)
    }),
    lib("expm1", S::Elementwise, UNARY, |e, cx, c| {
        e.call_softplus(cx, c)
    }),
    lib("isnan", S::Elementwise, UNARY, |e, cx, c| {
        e.call_softplus(cx, c)
    }),
    lib("isinf", S::Elementwise, UNARY, |e, cx, c| {
        e.call_softplus(cx, c)
    }),
    lib("clamp", S::Elementwise, CLAMP, |e, cx, c| {
        e.call_clamp(cx, c)
    }),
    lib("clip", S::Elementwise, CLAMP, |e, cx, c| {
        e.call_clamp(cx, c)
    }),
    lib("logical_and", S::Logical, LOGICAL, |e, cx, c| {
        e.call_logical_and(cx, c)
    }),
    lib("logical_or", S::Logical, LOGICAL, |e, cx, c| {
        e.call_logical_and(cx, c)
    }),
    lib("logical_xor", S::Logical, LOGICAL, |e, cx, c| {
        e.call_logical_and(cx, c)
    }),
    lib("logical_not", S::Logical, UNARY, |e, cx, c| {
        e.call_logical_not(cx, c)
    }),
    lib(
        "squeeze",
        S::Shape,
        const { &[X, computed("axis", Ints, "every axis of extent 1")] },
        |e, cx, c| e.call_squeeze(cx, c),
    ),
    lib(
        "unsqueeze",
        S::Shape,
        const { &[X, required("axis", Ints)] },
        |e, cx, c| e.call_squeeze(cx, c),
    ),
    lib(
        "flatten",
        S::Shape,
        const { &[X, optional("axis", Int, "1")] },
        |e, cx, c| e.call_squeeze(cx, c),
    ),
    lib(
        "expand",
        S::Shape,
        const { &[X, required("shape", Shape)] },
        |e, cx, c| e.call_expand(cx, c),
    ),
    lib(
        "stack",
        S::Shape,
        const { &[required("tensors", Tensors), optional("axis", Int, "0")] },
        |e, cx, c| e.call_stack(cx, c),
    ),
    lib(
        "split",
        S::Shape,
        const { &[X, required("sizes", Shape), optional("axis", Int, "0")] },
        |e, cx, c| e.call_split(cx, c),
    ),
    lib(
        "tile",
        S::Shape,
        const { &[X, required("reps", Shape)] },
        |e, cx, c| e.call_tile(cx, c),
    ),
    lib(
        "log_softmax",
        S::Reduction,
        const { &[X, optional("axis", Ints, "-1")] },
        |e, cx, c| e.call_log_softmax(cx, c),
    ),
    lib("logsumexp", S::Reduction, REDUCE, |e, cx, c| {
        e.call_log_softmax(cx, c)
    }),
    lib("variance", S::Reduction, REDUCE, |e, cx, c| {
        e.call_log_softmax(cx, c)
    }),
    lib("l1_norm", S::Reduction, REDUCE, |e, cx, c| {
        e.call_log_softmax(cx, c)
    }),
    lib("l2_norm", S::Reduction, REDUCE, |e, cx, c| {
        e.call_log_softmax(cx, c)
    }),
    lib("argmax", S::Index, ARGMAX, |e, cx, c| e.call_argmax(cx, c)),
    lib("argmin", S::Index, ARGMAX, |e, cx, c| e.call_argmax(cx, c)),
    lib(
        "one_hot",
        S::Index,
        const {
            &[
                required("indices", Tensor),
                required("depth", Int),
                optional("dtype", Kind::DType, "f32"),
            ]
        },
        |e, cx, c| e.call_one_hot(cx, c),
    ),
    lib(
        "arange",
        S::Constant,
        const {
            &[
                required("start", Float),
                required("end", Float),
                optional("step", Float, "1"),
                computed(
                    "dtype",
                    Kind::DType,
                    "f32 or i64, as the numbers are written",
                ),
            ]
        },
        |e, cx, c| e.call_arange(cx, c),
    ),
    lib(
        "tril",
        S::Index,
        const { &[X, optional("k", Int, "0")] },
        |e, cx, c| e.call_tril(cx, c),
    ),
    lib(
        "triu",
        S::Index,
        const { &[X, optional("k", Int, "0")] },
        |e, cx, c| e.call_tril(cx, c),
    ),
    lib("global_avgpool", S::Network, UNARY, |e, cx, c| {
        e.call_global_avgpool(cx, c)
    }),
    lib("global_maxpool", S::Network, UNARY, |e, cx, c| {
        e.call_global_avgpool(cx, c)
    }),
    lib(
        "pad",
        S::Shape,
        const { &[X, required("pads", Shape), optional("value", Float, "0")] },
        |e, cx, c| e.call_pad(cx, c),
    ),
    lib(
        "cumsum",
        S::Reduction,
        const {
            &[
                X,
                required("axis", Int),
                optional("exclusive", Bool, "false"),
                optional("reverse", Bool, "false"),
            ]
        },
        |e, cx, c| e.call_cumsum(cx, c),
    ),
    lib(
        "group_norm",
        S::Network,
        const {
            &[
                X,
                required("groups", Int),
                required("gamma", Tensor),
                required("beta", Tensor),
                EPS,
            ]
        },
        |e, cx, c| e.call_group_norm(cx, c),
    ),
    lib(
        "instance_norm",
        S::Network,
        const { &[X, required("gamma", Tensor), required("beta", Tensor), EPS] },
        |e, cx, c| e.call_group_norm(cx, c),
    ),
    lib(
        "gemm",
        S::Network,
        const {
            &[
                required("a", Tensor),
                required("b", Tensor),
                computed("c", Operand, "none"),
                optional("alpha", Float, "1"),
                optional("beta", Float, "1"),
                optional("trans_a", Bool, "false"),
                optional("trans_b", Bool, "false"),
            ]
        },
        |e, cx, c| e.call_gemm(cx, c),
    ),
    lib(
        "conv1d",
        S::Network,
        const {
            &[
                X,
                required("w", Tensor),
                optional("stride", Int, "1"),
                optional("padding", Int, "0"),
                optional("groups", Int, "1"),
                optional("dilation", Int, "1"),
            ]
        },
        |e, cx, c| e.call_conv1d(cx, c),
    ),
    lib("conv3d", S::Network, CONV, |e, cx, c| e.call_conv3d(cx, c)),
    lib("maxpool1d", S::Network, POOL1, |e, cx, c| {
        e.call_conv1d(cx, c)
    }),
    lib("avgpool1d", S::Network, POOL1, |e, cx, c| {
        e.call_conv1d(cx, c)
    }),
    lib(
        "topk",
        S::Index,
        const {
            &[
                X,
                required("k", Int),
                optional("axis", Int, "-1"),
                optional("largest", Bool, "true"),
            ]
        },
        |e, cx, c| e.call_topk(cx, c),
    ),
    lib("gather_elements", S::Index, GATHER, |e, cx, c| {
        e.call_gather_elements(cx, c)
    }),
    lib("gather", S::Index, GATHER, |e, cx, c| e.call_gather(cx, c)),
    lib("scatter_add", S::Index, SCATTER, |e, cx, c| {
        e.call_scatter_add(cx, c)
    }),
    lib("scatter_add_elements", S::Index, SCATTER, |e, cx, c| {
        e.call_scatter_add_elements(cx, c)
    }),
    lib(
        "dropout",
        S::Network,
        const {
            &[
                X,
                optional("p", Float, "0.5"),
                computed("step", Operand, "none: the identity, for inference"),
                optional("seed", Int, "0"),
            ]
        },
        |e, cx, c| e.call_dropout(cx, c),
    ),
    // Training (training.rs).
    lib("mse_loss", S::Loss, LOSS, |e, cx, c| e.call_mse_loss(cx, c)),
    lib("l1_loss", S::Loss, LOSS, |e, cx, c| e.call_mse_loss(cx, c)),
    lib(
        "huber_loss",
        S::Loss,
        const { &[X, required("y", Tensor), optional("delta", Float, "1.0")] },
        |e, cx, c| e.call_mse_loss(cx, c),
    ),
    lib("bce_with_logits", S::Loss, LOSS, |e, cx, c| {
        e.call_mse_loss(cx, c)
    }),
    lib(
        "cross_entropy",
        S::Loss,
        const {
            &[
                required("logits", Tensor),
                required("target", Tensor),
                optional("axis", Int, "-1"),
            ]
        },
        |e, cx, c| e.call_cross_entropy(cx, c),
    ),
    lib(
        "sgd",
        S::Optimizer,
        const {
            &[
                required("w", Tensor),
                required("g", Tensor),
                required("lr", Rate),
                optional("weight_decay", Float, "0"),
            ]
        },
        |e, cx, c| e.call_sgd(cx, c),
    ),
    lib(
        "sgd_momentum",
        S::Optimizer,
        const {
            &[
                required("w", Tensor),
                required("g", Tensor),
                required("buf", Tensor),
                required("lr", Rate),
                optional("momentum", Float, "0.9"),
                optional("nesterov", Bool, "false"),
                optional("weight_decay", Float, "0"),
            ]
        },
        |e, cx, c| e.call_sgd_momentum(cx, c),
    ),
    lib("adam", S::Optimizer, ADAM_PARAMS, |e, cx, c| {
        e.call_adam(cx, c)
    }),
    lib("adamw", S::Optimizer, ADAMW_PARAMS, |e, cx, c| {
        e.call_adam(cx, c)
    }),
    Builtin {
        name: "all_finite",
        section: S::Optimizer,
        params: const { &[required("tensors", Tensor)] },
        variadic: true,
        reserved: false,
        expand: |e, cx, c| e.call_all_finite(cx, c),
    },
    lib(
        "loss_scale_update",
        S::Optimizer,
        const {
            &[
                required("scale", Tensor),
                required("good", Tensor),
                required("finite", Tensor),
                optional("growth", Float, "2.0"),
                optional("backoff", Float, "0.5"),
                optional("interval", Int, "2000"),
            ]
        },
        |e, cx, c| e.call_loss_scale_update(cx, c),
    ),
    lib(
        "step_lr",
        S::Schedule,
        const {
            &[
                required("step", Operand),
                required("lr", Float),
                required("every", Int),
                optional("gamma", Float, "0.1"),
            ]
        },
        |e, cx, c| e.call_step_lr(cx, c),
    ),
    lib(
        "cosine_lr",
        S::Schedule,
        const {
            &[
                required("step", Operand),
                required("lr", Float),
                required("total", Int),
                optional("warmup", Int, "0"),
                optional("min_lr", Float, "0"),
            ]
        },
        |e, cx, c| e.call_step_lr(cx, c),
    ),
    lib(
        "warmup_lr",
        S::Schedule,
        const {
            &[
                required("step", Operand),
                required("lr", Float),
                required("warmup", Int),
            ]
        },
        |e, cx, c| e.call_step_lr(cx, c),
    ),
    lib(
        "batchnorm_train",
        S::Network,
        const {
            &[
                X,
                required("gamma", Tensor),
                required("beta", Tensor),
                required("running_mean", Tensor),
                required("running_var", Tensor),
                optional("momentum", Float, "0.1"),
                EPS,
            ]
        },
        |e, cx, c| e.call_batchnorm_train(cx, c),
    ),
];

/// A primitive of [`WRITTEN`]: its name is reserved.
const fn b(
    name: &'static str,
    section: Section,
    params: &'static [Param],
    expand: Expand,
) -> Builtin {
    Builtin {
        name,
        section,
        params,
        variadic: false,
        reserved: true,
        expand,
    }
}

/// A composition or training built-in of [`WRITTEN`]: a program may define
/// its own function of that name.
const fn lib(
    name: &'static str,
    section: Section,
    params: &'static [Param],
    expand: Expand,
) -> Builtin {
    Builtin {
        reserved: false,
        ..b(name, section, params, expand)
    }
}

const CLAMP: &[Param] = &[
    X,
    computed("min", Operand, "none"),
    computed("max", Operand, "none"),
];
const LOGICAL: &[Param] = &[required("a", Tensor), required("b", Tensor)];
const ARGMAX: &[Param] = &[
    X,
    required("axis", Int),
    optional("keepdims", Bool, "false"),
];
const ADAM_PARAMS: &[Param] = &concat_params(ADAM, optional("weight_decay", Float, "0"));
const ADAMW_PARAMS: &[Param] = &concat_params(ADAM, optional("weight_decay", Float, "0.01"));

/// `ADAM` and then `last`.
const fn concat_params(first: &[Param], last: Param) -> [Param; 10] {
    let mut out = [last; 10];
    let mut i = 0;
    while i < first.len() {
        out[i] = first[i];
        i += 1;
    }
    out
}

/// The element-wise functions of one operand and the bitwise operators,
/// from `dlc_core::scalar`.
static GENERATED: LazyLock<Vec<Builtin>> = LazyLock::new(|| {
    let unary = UnaryOp::ALL
        .into_iter()
        .filter(|u| *u != UnaryOp::Neg)
        .map(|u| Builtin {
            name: u.name(),
            section: Section::Elementwise,
            params: UNARY,
            variadic: false,
            reserved: true,
            expand: |e, cx, c| e.call_unary(cx, c),
        });
    let bitwise = BinaryOp::ALL
        .into_iter()
        .filter(|b| b.is_bitwise())
        .map(|b| Builtin {
            name: b.name(),
            section: Section::Logical,
            params: PAIR,
            variadic: false,
            reserved: true,
            expand: |e, cx, c| e.call_binary(cx, c),
        });
    unary.chain(bitwise).collect()
});

/// Every row: the element-wise functions first, then [`WRITTEN`], then the
/// bitwise operators.
static TABLE: LazyLock<Vec<&'static Builtin>> = LazyLock::new(|| {
    let unary = GENERATED
        .iter()
        .filter(|b| b.section == Section::Elementwise);
    let bitwise = GENERATED.iter().filter(|b| b.section == Section::Logical);
    unary.chain(WRITTEN).chain(bitwise).collect()
});

/// Every built-in function.
pub fn builtins() -> impl Iterator<Item = &'static Builtin> {
    TABLE.iter().copied()
}

/// The built-in called `name`.
pub fn lookup(name: &str) -> Option<&'static Builtin> {
    builtins().find(|b| b.name == name)
}

/// Whether `name` is a built-in function of the language.
pub fn is_builtin(name: &str) -> bool {
    lookup(name).is_some() || UnaryOp::from_name(name).is_some()
}

/// Whether `name` is one no user function or operator may take: a
/// primitive built-in (see [`Builtin::reserved`]) or a scalar operator.
pub fn is_reserved(name: &str) -> bool {
    lookup(name).is_some_and(|b| b.reserved) || UnaryOp::from_name(name).is_some()
}

/// The index of built-ins in docs/language.md: one list per section, a
/// signature per line (`name(param: kind = default, ...)`; a default in
/// angle brackets is computed from the other arguments).
pub fn markdown() -> String {
    let mut out = String::new();
    for s in Section::ALL {
        out.push_str(&format!("\n**{}**\n\n", s.title()));
        for b in builtins().filter(|b| b.section == s) {
            let mark = if b.reserved { "" } else { " *" };
            out.push_str(&format!("- `{}`{mark}\n", b.signature()));
        }
    }
    out
}

impl Elab<'_> {
    /// A call of built-in `b`: its arguments bound, then expanded.
    pub(super) fn call_builtin(
        &mut self,
        cx: &mut FnCx,
        b: &'static Builtin,
        f: &Ident,
        args: &[Arg],
        span: Span,
    ) -> R<EVal> {
        let a = if b.variadic {
            vec![]
        } else {
            let names: Vec<&str> = b.params.iter().map(|p| p.name).collect();
            bind(f, args, &names, b.required(), span)?
        };
        let call = Call {
            builtin: b,
            args,
            a,
            span,
        };
        (b.expand)(self, cx, &call)
    }

    /// The first argument of `c`, a tensor, and its type.
    pub(super) fn first_tensor(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<(Value, TensorType)> {
        let x = self.tensor(cx, req(&c.a, 0))?;
        Ok((x, Self::ty(cx, x)))
    }

    /// An element-wise function of one operand (`relu`, `exp`, ...).
    pub(super) fn call_unary(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let u = UnaryOp::from_name(c.name())
            .unwrap_or_else(|| unreachable!("the table lists `{}` as unary", c.name()));
        let x = self.tensor(cx, req(&c.a, 0))?;
        Ok(EVal::Tensor(self.add(cx, Op::Unary(u), &[x], c.span)?))
    }

    /// An element-wise function of two operands (`pow`, `bitand`, ...;
    /// `max` and `min` of two positional arguments), broadcasting.
    pub(super) fn call_binary(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let b = BinaryOp::ALL
            .into_iter()
            .find(|b| b.name() == c.name())
            .unwrap_or_else(|| unreachable!("the table lists `{}` as binary", c.name()));
        self.elementwise_pair(cx, b, c)
    }

    /// `b` of the first two arguments of `c`, broadcast to each other.
    pub(super) fn elementwise_pair(&mut self, cx: &mut FnCx, b: BinaryOp, c: &Call<'_>) -> R<EVal> {
        let (ea, eb) = (req(&c.a, 0), req(&c.a, 1));
        let (va, vb) = (self.expr(cx, ea)?, self.expr(cx, eb)?);
        let (x, y) = self.pair(cx, va, vb, ea.span, eb.span)?;
        Ok(EVal::Tensor(self.add(
            cx,
            Op::Binary(b),
            &[x, y],
            c.span,
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_defaults_are_values_of_their_kind() {
        let mut seen = HashSet::new();
        for b in builtins() {
            assert!(seen.insert(b.name), "`{}` is declared twice", b.name);
            let required = b.required();
            for (i, p) in b.params.iter().enumerate() {
                assert!(
                    i < required || p.default != Default::Required,
                    "`{}`: required `{}` after an optional parameter",
                    b.name,
                    p.name
                );
                if let Default::Value(v) = p.default {
                    let ok = match p.kind {
                        Kind::Float | Kind::Rate => v.parse::<f64>().is_ok(),
                        Kind::Int | Kind::Ints => v.parse::<i64>().is_ok(),
                        Kind::Bool => v == "true" || v == "false",
                        Kind::DType => v.parse::<DType>().is_ok(),
                        _ => false,
                    };
                    assert!(
                        ok,
                        "`{}`: default `{v}` of `{}` is no {:?}",
                        b.name, p.name, p.kind
                    );
                }
            }
        }
    }

    #[test]
    fn a_program_may_shadow_a_composition_but_not_a_primitive() {
        // `gemm` takes two matrices; the program's own takes one.
        let own = "fn gemm(a: f32[2, 2]) -> f32[2, 2] { return a * 2.0; }\n\
                   fn main(x: f32[2, 2]) -> f32[2, 2] { return gemm(x); }\n";
        let module = crate::compile_source(own).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(module.function("main").is_some() && module.function("gemm").is_some());
        assert!(!is_reserved("gemm") && is_builtin("gemm"));
        let primitive = "fn softmax(a: f32[2]) -> f32[2] { return a; }\n";
        let Err(errors) = crate::compile_source(primitive) else {
            panic!("a program redefined `softmax`");
        };
        assert!(
            format!("{errors:?}").contains("cannot be redefined"),
            "{errors:?}"
        );
        assert!(is_reserved("softmax") && is_reserved("relu") && is_reserved("bitand"));
    }

    #[test]
    fn the_language_guide_lists_every_builtin_as_the_table_declares_it() {
        let doc = include_str!("../../../docs/language.md");
        let begin = "<!-- builtins: begin -->";
        let end = "<!-- builtins: end -->";
        let (Some(i), Some(j)) = (doc.find(begin), doc.find(end)) else {
            panic!("docs/language.md has no `{begin}` ... `{end}` section");
        };
        let listed = &doc[i + begin.len()..j];
        let want = markdown();
        assert!(
            listed == want,
            "docs/language.md's index of built-ins differs from the table; replace the text \
             between the markers with:\n{want}"
        );
    }
}
