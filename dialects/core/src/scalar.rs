//! Scalar operators shared by every level: the element-wise functions,
//! comparisons and reduction kinds that the graph, loop and tile dialects
//! name the same way, and their meaning on f64 values.

/// Element-wise functions of one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `max(x, 0)`
    Relu,
    /// `e^x`
    Exp,
    /// natural logarithm
    Log,
    /// square root
    Sqrt,
    /// `1 / sqrt(x)`
    Rsqrt,
    /// hyperbolic tangent
    Tanh,
    /// `1 / (1 + e^-x)`
    Sigmoid,
    /// GELU, tanh approximation
    Gelu,
    /// absolute value
    Abs,
    /// largest integer not above `x`
    Floor,
    /// smallest integer not below `x`
    Ceil,
    /// nearest integer, ties to even (ONNX's `Round`, NumPy's `round`)
    Round,
    /// -1, 0 or 1 by the sign of `x` (NaN stays NaN)
    Sign,
    /// `1 / x`
    Reciprocal,
    /// sine
    Sin,
    /// cosine
    Cos,
    /// `x * sigmoid(x)` (SiLU, swish)
    Silu,
    /// the error function
    Erf,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 19] = [
        UnaryOp::Neg,
        UnaryOp::Relu,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Gelu,
        UnaryOp::Abs,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Sign,
        UnaryOp::Reciprocal,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Silu,
        UnaryOp::Erf,
    ];

    /// Source-level and scalar-expression name (`relu`).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Relu => "relu",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Abs => "abs",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Sign => "sign",
            UnaryOp::Reciprocal => "reciprocal",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Silu => "silu",
            UnaryOp::Erf => "erf",
        }
    }

    /// Whether the op is defined on integers too (otherwise floats only).
    pub fn accepts_int(self) -> bool {
        matches!(
            self,
            UnaryOp::Neg | UnaryOp::Relu | UnaryOp::Abs | UnaryOp::Sign
        )
    }

    /// The op from its name.
    pub fn from_name(name: &str) -> Option<UnaryOp> {
        UnaryOp::ALL.into_iter().find(|u| u.name() == name)
    }
}

/// Element-wise functions of two operands (with broadcasting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b` (floor division on integers)
    Div,
    /// element-wise maximum
    Max,
    /// element-wise minimum
    Min,
    /// `a ^ b`
    Pow,
    /// bitwise and (integers)
    BitAnd,
    /// bitwise or (integers)
    BitOr,
    /// bitwise exclusive or (integers)
    BitXor,
    /// `a << b`: the low bits of `a` shifted up by `b` (0 from `b` at
    /// or past the width, negative `b` included)
    Shl,
    /// `a >> b`: logical for unsigned types, arithmetic for signed ones (a
    /// shift at or past the width gives 0, or -1 for a negative `a`)
    Shr,
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 12] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
        BinaryOp::BitAnd,
        BinaryOp::BitOr,
        BinaryOp::BitXor,
        BinaryOp::Shl,
        BinaryOp::Shr,
    ];

    /// Graph op suffix (`add`, `maximum`).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "maximum",
            BinaryOp::Min => "minimum",
            BinaryOp::Pow => "pow",
            BinaryOp::BitAnd => "bitand",
            BinaryOp::BitOr => "bitor",
            BinaryOp::BitXor => "bitxor",
            BinaryOp::Shl => "shl",
            BinaryOp::Shr => "shr",
        }
    }

    /// The infix symbol, for the four arithmetic operators.
    pub fn symbol(self) -> Option<&'static str> {
        match self {
            BinaryOp::Add => Some("+"),
            BinaryOp::Sub => Some("-"),
            BinaryOp::Mul => Some("*"),
            BinaryOp::Div => Some("/"),
            _ => None,
        }
    }

    /// The function name used in scalar expressions for non-infix ops.
    pub fn function_name(self) -> Option<&'static str> {
        match self {
            BinaryOp::Max => Some("max"),
            BinaryOp::Min => Some("min"),
            BinaryOp::Pow => Some("pow"),
            BinaryOp::BitAnd
            | BinaryOp::BitOr
            | BinaryOp::BitXor
            | BinaryOp::Shl
            | BinaryOp::Shr => Some(self.name()),
            _ => None,
        }
    }

    /// Whether the op is defined on integers.
    pub fn accepts_int(self) -> bool {
        self != BinaryOp::Pow
    }

    /// Whether the op is defined on floats (the bitwise ones are not).
    pub fn accepts_float(self) -> bool {
        !self.is_bitwise()
    }

    /// Whether this is a bitwise op or a shift (integers only).
    pub fn is_bitwise(self) -> bool {
        matches!(
            self,
            BinaryOp::BitAnd | BinaryOp::BitOr | BinaryOp::BitXor | BinaryOp::Shl | BinaryOp::Shr
        )
    }

    /// Whether the op is defined on elements of `d`.
    pub fn accepts(self, d: crate::DType) -> bool {
        if d.is_float() {
            self.accepts_float()
        } else {
            d.is_int() && self.accepts_int()
        }
    }
}

/// Element-wise comparisons; the result is `bool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
    /// `!=`
    Ne,
}

impl CmpOp {
    /// Every comparison.
    pub const ALL: [CmpOp; 6] = [
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
        CmpOp::Eq,
        CmpOp::Ne,
    ];

    /// Graph op suffix (`lt`).
    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
        }
    }

    /// The infix symbol.
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
        }
    }

    /// Applies the comparison.
    pub fn apply(self, a: f64, b: f64) -> bool {
        match self {
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
        }
    }
}

/// How a reduction combines elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// sum
    Sum,
    /// arithmetic mean (floats only)
    Mean,
    /// maximum
    Max,
    /// minimum
    Min,
    /// product
    Prod,
}

impl ReduceKind {
    /// Every reduction kind.
    pub const ALL: [ReduceKind; 5] = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Prod,
    ];

    /// Name in source and IR (`sum`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Mean => "mean",
            ReduceKind::Max => "max",
            ReduceKind::Min => "min",
            ReduceKind::Prod => "prod",
        }
    }

    /// The kind from its name.
    pub fn from_name(name: &str) -> Option<ReduceKind> {
        ReduceKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The value a reduction over nothing gives.
    pub fn identity(self) -> f64 {
        match self {
            ReduceKind::Sum | ReduceKind::Mean => 0.0,
            ReduceKind::Prod => 1.0,
            ReduceKind::Max => f64::NEG_INFINITY,
            ReduceKind::Min => f64::INFINITY,
        }
    }

    /// The identity in element type `d`: the extreme values of an integer
    /// type stand for the infinities it lacks.
    pub fn identity_in(self, d: crate::DType) -> f64 {
        match (self, d.int_min(), d.int_max()) {
            (ReduceKind::Max, Some(min), _) => min,
            // `i64::MAX` and `u64::MAX` are not f64 values; the nearest
            // below them is, and no element of the type exceeds it.
            (ReduceKind::Min, _, Some(max)) => d.round(max),
            _ => self.identity(),
        }
    }

    /// Folds one more element into an accumulator.
    pub fn combine(self, acc: f64, x: f64) -> f64 {
        match self {
            ReduceKind::Sum | ReduceKind::Mean => acc + x,
            ReduceKind::Prod => acc * x,
            // NaN propagates, as in NumPy.
            ReduceKind::Max => {
                if x.is_nan() || x > acc {
                    x
                } else {
                    acc
                }
            }
            ReduceKind::Min => {
                if x.is_nan() || x < acc {
                    x
                } else {
                    acc
                }
            }
        }
    }
}

/// Applies a unary function.
pub fn apply_unary(u: UnaryOp, x: f64) -> f64 {
    match u {
        UnaryOp::Neg => -x,
        UnaryOp::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Gelu => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Abs => x.abs(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                // 0 keeps its sign bit, NaN stays NaN.
                x
            }
        }
        UnaryOp::Reciprocal => 1.0 / x,
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Erf => libm::erf(x),
    }
}

/// Applies a binary function; `int` selects integer division.
pub fn apply_binary(b: BinaryOp, x: f64, y: f64, int: bool) -> Option<f64> {
    Some(match b {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div if int => {
            if y == 0.0 {
                return None;
            }
            (x / y).floor()
        }
        BinaryOp::Div => x / y,
        BinaryOp::Max => {
            if x.is_nan() || x > y {
                x
            } else {
                y
            }
        }
        BinaryOp::Min => {
            if x.is_nan() || x < y {
                x
            } else {
                y
            }
        }
        BinaryOp::Pow => x.powf(y),
        BinaryOp::BitAnd => (bits(x) & bits(y)) as f64,
        BinaryOp::BitOr => (bits(x) | bits(y)) as f64,
        BinaryOp::BitXor => (bits(x) ^ bits(y)) as f64,
        // The caller rounds to the type, which keeps the low bits.
        BinaryOp::Shl => match shift_amount(y) {
            Some(s) => bits(x).wrapping_shl(s) as f64,
            None => 0.0,
        },
        // Only signed types hold negative values: arithmetic for them,
        // logical for the rest.
        BinaryOp::Shr if x < 0.0 => (bits(x) >> shift_amount(y).unwrap_or(63)) as f64,
        BinaryOp::Shr => match shift_amount(y) {
            Some(s) => ((bits(x) as u64) >> s) as f64,
            None => 0.0,
        },
    })
}

/// An integer element as the 64 bits of its two's complement (u64 values
/// past `i64::MAX` as the negative `i64` of the same bits).
fn bits(x: f64) -> i64 {
    if x >= 9_223_372_036_854_775_808.0 {
        x as u64 as i64
    } else {
        x as i64
    }
}

/// A shift amount below 64; `None` for the others (negative included),
/// which shift every bit out.
fn shift_amount(y: f64) -> Option<u32> {
    (0.0..64.0).contains(&y).then_some(y as u32)
}
