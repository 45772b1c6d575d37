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

    /// Whether the op's code is a long chain of dependent instructions (a
    /// division; a power's logarithm and exponential), as
    /// [`UnaryOp::is_long_latency`] says of unary ops.
    pub fn is_long_latency(self) -> bool {
        matches!(self, BinaryOp::Div | BinaryOp::Pow)
    }

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

/// Applies a unary function: a primitive directly, a composite by its
/// [`UnaryOp::expansion`].
pub fn apply_unary(u: UnaryOp, x: f64) -> f64 {
    if let Some(e) = u.expansion() {
        return e.eval([x, x, x]);
    }
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
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Abs => x.abs(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Erf => libm::erf(x),
        UnaryOp::Rsqrt
        | UnaryOp::Sigmoid
        | UnaryOp::Gelu
        | UnaryOp::Sign
        | UnaryOp::Reciprocal
        | UnaryOp::Silu => unreachable!("{} is a composite", u.name()),
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

/// Applies a binary function to elements of type `d`. Integer `+`, `-`,
/// `*` and `<<` are computed exactly on 64 bits and wrapped to the type's
/// width before they become an `f64` (a `u32` product reaches 2^64, past
/// what an `f64` holds exactly, and the low bits are what the type keeps).
pub fn apply_binary_in(b: BinaryOp, x: f64, y: f64, d: crate::DType) -> Option<f64> {
    if !d.is_int() {
        return apply_binary(b, x, y, false);
    }
    let (p, q) = (bits(x), bits(y));
    let exact = match b {
        BinaryOp::Add => p.wrapping_add(q),
        BinaryOp::Sub => p.wrapping_sub(q),
        BinaryOp::Mul => p.wrapping_mul(q),
        BinaryOp::Shl => match shift_amount(y) {
            Some(s) => p.wrapping_shl(s),
            None => 0,
        },
        _ => return apply_binary(b, x, y, true),
    };
    Some(d.wrap_bits(exact))
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

/// A small expression over an element-wise function's operands (`X`, and
/// `Y` for the second of a binary function) and its result (`R`): the one
/// statement of a fact every level reads.
/// - A derivative rule: [`UnaryOp::derivative`] and [`BinaryOp::partials`]
///   give each function's rule once; the graph dialect's reverse mode builds
///   it from tensors, and the derivation of a user operator from scalar
///   expressions ([`Formula::build`]).
/// - An expansion: [`UnaryOp::expansion`] writes a composite function
///   (`gelu`, `sigmoid`, `silu`...) in terms of primitive ones, once; the
///   interpreters ([`apply_unary`]), the LLVM and PTX generator and the MLIR
///   emitter each build it from their own primitives.
#[derive(Debug, Clone, PartialEq)]
pub enum Formula {
    /// The (first) operand.
    X,
    /// The second operand of a binary function.
    Y,
    /// The function's result.
    R,
    /// A number.
    Const(f64),
    /// An element-wise function of one operand.
    Unary(UnaryOp, Box<Formula>),
    /// An element-wise function of two operands.
    Binary(BinaryOp, Box<Formula>, Box<Formula>),
    /// `where(a cmp b, then, else)`.
    Select(CmpOp, Box<[Formula; 4]>),
}

/// What a [`Formula`] is built from: values standing for its leaves and the
/// functions that combine them.
pub trait FormulaBuilder {
    /// A built value.
    type Value: Clone;
    /// The error building may fail with.
    type Error;
    /// A number of the operands' element type.
    fn constant(&mut self, c: f64) -> Result<Self::Value, Self::Error>;
    /// `u(a)`.
    fn unary(&mut self, u: UnaryOp, a: Self::Value) -> Result<Self::Value, Self::Error>;
    /// `b(x, y)`.
    fn binary(
        &mut self,
        b: BinaryOp,
        x: Self::Value,
        y: Self::Value,
    ) -> Result<Self::Value, Self::Error>;
    /// `where(a cmp b, t, e)`.
    fn select(
        &mut self,
        cmp: CmpOp,
        a: Self::Value,
        b: Self::Value,
        t: Self::Value,
        e: Self::Value,
    ) -> Result<Self::Value, Self::Error>;
    /// The number `v` is, if it is a number.
    fn as_const(&self, v: &Self::Value) -> Option<f64>;

    /// `u(a)`, computed when `a` is a number.
    fn fold_unary(&mut self, u: UnaryOp, a: Self::Value) -> Result<Self::Value, Self::Error> {
        match self.as_const(&a) {
            Some(c) => self.constant(apply_unary(u, c)),
            None => self.unary(u, a),
        }
    }

    /// `op(x, y)` with what is known of it folded: two numbers computed,
    /// `x * 1`, `1 * x`, `x + 0`, `0 + x`, `x - 0` and `x / 1` are `x`, a
    /// product by 0 is 0 and one by -1 a negation. A derivative built so
    /// stays the expression it means (`g * b`, not `(g * 1) * b`), which
    /// the lowering then recognizes.
    fn fold(
        &mut self,
        op: BinaryOp,
        x: Self::Value,
        y: Self::Value,
    ) -> Result<Self::Value, Self::Error> {
        let (p, q) = (self.as_const(&x), self.as_const(&y));
        if let (Some(p), Some(q)) = (p, q)
            && let Some(v) = apply_binary(op, p, q, false)
        {
            return self.constant(v);
        }
        match (op, p, q) {
            (BinaryOp::Mul, Some(1.0), _) | (BinaryOp::Add, Some(0.0), _) => Ok(y),
            (BinaryOp::Mul | BinaryOp::Div, _, Some(1.0)) => Ok(x),
            (BinaryOp::Add | BinaryOp::Sub, _, Some(0.0)) => Ok(x),
            (BinaryOp::Mul, Some(0.0), _) | (BinaryOp::Mul, _, Some(0.0)) => self.constant(0.0),
            (BinaryOp::Mul, Some(-1.0), _) => self.unary(UnaryOp::Neg, y),
            (BinaryOp::Mul, _, Some(-1.0)) => self.unary(UnaryOp::Neg, x),
            _ => self.binary(op, x, y),
        }
    }
}

impl Formula {
    /// The expression built by `b`, with `leaves` the values of `X`, `Y`
    /// and `R` (`Y` may be anything for a unary rule, which never reads it).
    pub fn build<B: FormulaBuilder>(
        &self,
        b: &mut B,
        leaves: &[B::Value; 3],
    ) -> Result<B::Value, B::Error> {
        Ok(match self {
            Formula::X => leaves[0].clone(),
            Formula::Y => leaves[1].clone(),
            Formula::R => leaves[2].clone(),
            Formula::Const(c) => b.constant(*c)?,
            Formula::Unary(u, a) => {
                let a = a.build(b, leaves)?;
                b.fold_unary(*u, a)?
            }
            Formula::Binary(op, x, y) => {
                let x = x.build(b, leaves)?;
                let y = y.build(b, leaves)?;
                b.fold(*op, x, y)?
            }
            Formula::Select(cmp, parts) => {
                let [p, q, t, e] = &**parts;
                let (p, q) = (p.build(b, leaves)?, q.build(b, leaves)?);
                let (t, e) = (t.build(b, leaves)?, e.build(b, leaves)?);
                match (b.as_const(&p), b.as_const(&q)) {
                    (Some(p), Some(q)) => {
                        if cmp.apply(p, q) {
                            t
                        } else {
                            e
                        }
                    }
                    _ => b.select(*cmp, p, q, t, e)?,
                }
            }
        })
    }

    /// Whether this is the number `c`.
    pub fn is_const(&self, c: f64) -> bool {
        matches!(self, Formula::Const(v) if *v == c)
    }

    /// The value on numbers, `leaves` those of `X`, `Y` and `R` (what
    /// [`Formula::build`] gives on numbers, without its folding).
    pub fn eval(&self, leaves: [f64; 3]) -> f64 {
        match self {
            Formula::X => leaves[0],
            Formula::Y => leaves[1],
            Formula::R => leaves[2],
            Formula::Const(c) => *c,
            Formula::Unary(u, a) => apply_unary(*u, a.eval(leaves)),
            Formula::Binary(op, x, y) => {
                apply_binary(*op, x.eval(leaves), y.eval(leaves), false).unwrap_or(f64::NAN)
            }
            Formula::Select(cmp, parts) => {
                let [p, q, t, e] = &**parts;
                if cmp.apply(p.eval(leaves), q.eval(leaves)) {
                    t.eval(leaves)
                } else {
                    e.eval(leaves)
                }
            }
        }
    }
}

fn d_un(u: UnaryOp, a: Formula) -> Formula {
    Formula::Unary(u, Box::new(a))
}

fn d_bin(op: BinaryOp, a: Formula, b: Formula) -> Formula {
    Formula::Binary(op, Box::new(a), Box::new(b))
}

fn d_mul(a: Formula, b: Formula) -> Formula {
    d_bin(BinaryOp::Mul, a, b)
}

fn d_sub(a: Formula, b: Formula) -> Formula {
    d_bin(BinaryOp::Sub, a, b)
}

fn d_add(a: Formula, b: Formula) -> Formula {
    d_bin(BinaryOp::Add, a, b)
}

fn exp_neg(a: Formula) -> Formula {
    d_un(UnaryOp::Exp, d_un(UnaryOp::Neg, a))
}

fn d_sel(cmp: CmpOp, a: Formula, b: Formula, t: Formula, e: Formula) -> Formula {
    Formula::Select(cmp, Box::new([a, b, t, e]))
}

/// The share of the gradient each operand of `max` / `min` gets: all of it
/// to the chosen one, half each on a tie (as JAX splits it).
fn chooser(first: CmpOp, x: Formula, y: Formula) -> Formula {
    d_sel(
        first,
        x.clone(),
        y.clone(),
        Formula::Const(1.0),
        d_sel(CmpOp::Eq, x, y, Formula::Const(0.5), Formula::Const(0.0)),
    )
}

/// Each unary op's [`UnaryOp::expansion`], by discriminant: built once.
static EXPANSIONS: std::sync::LazyLock<[Option<Formula>; UnaryOp::ALL.len()]> =
    std::sync::LazyLock::new(|| UnaryOp::ALL.map(UnaryOp::expand));

impl UnaryOp {
    /// Whether the op's code is a long chain of dependent instructions (a
    /// range reduction and a polynomial, a division or a square root: tens
    /// of cycles from its argument to its result) rather than one or two.
    /// A lowering that can compute it either right where its argument is
    /// produced or in a loop of independent elements of its own reads it.
    pub fn is_long_latency(self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg
                | UnaryOp::Relu
                | UnaryOp::Abs
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
                | UnaryOp::Sign
        )
    }

    /// A composite function written in terms of primitive ones (an
    /// expression over `X`), which every level builds from its own
    /// primitives; `None` for a primitive (`exp`, `tanh`, `erf`...), which
    /// each level implements. On floats only: `sign` of an integer is each
    /// integer back end's own.
    pub fn expansion(self) -> Option<&'static Formula> {
        EXPANSIONS[self as usize].as_ref()
    }

    fn expand(self) -> Option<Formula> {
        use Formula::{Const, X};
        Some(match self {
            UnaryOp::Rsqrt => d_bin(BinaryOp::Div, Const(1.0), d_un(UnaryOp::Sqrt, X)),
            UnaryOp::Reciprocal => d_bin(BinaryOp::Div, Const(1.0), X),
            UnaryOp::Sigmoid => d_bin(BinaryOp::Div, Const(1.0), d_add(Const(1.0), exp_neg(X))),
            // Through the sigmoid op, so that a level with its own sigmoid
            // (the CPU code's, `codegen/math.rs`) uses it here too.
            UnaryOp::Silu => d_mul(X, d_un(UnaryOp::Sigmoid, X)),
            UnaryOp::Gelu => {
                // x/2 (1 + tanh(c (x + a x^3))), c = sqrt(2 / pi)
                let c = (2.0 / std::f64::consts::PI).sqrt();
                let cube = d_mul(d_mul(X, X), X);
                let inner = d_mul(Const(c), d_add(X, d_mul(Const(0.044715), cube)));
                let t = d_un(UnaryOp::Tanh, inner);
                d_mul(d_mul(Const(0.5), X), d_add(Const(1.0), t))
            }
            // 1 above zero, -1 below, x itself at ±0 and NaN.
            UnaryOp::Sign => d_sel(
                CmpOp::Gt,
                X,
                Const(0.0),
                Const(1.0),
                d_sel(CmpOp::Lt, X, Const(0.0), Const(-1.0), X),
            ),
            _ => return None,
        })
    }

    /// `d r / d x` for `r = self(x)` on floats. Piecewise-constant functions
    /// (`floor`, `ceil`, `round`, `sign`) have derivative 0, as in JAX and
    /// PyTorch; `relu` and `abs` take 0 at 0.
    pub fn derivative(self) -> Formula {
        use Formula::{Const, R, X};
        match self {
            UnaryOp::Neg => Const(-1.0),
            // From the result, as PyTorch's `threshold_backward` does (the
            // same mask: r > 0 exactly where x > 0): a backward pass reading
            // `relu(x)` leaves `x` to its producer's epilogue, unstored.
            UnaryOp::Relu => d_sel(CmpOp::Gt, R, Const(0.0), Const(1.0), Const(0.0)),
            UnaryOp::Exp => R,
            UnaryOp::Log => d_un(UnaryOp::Reciprocal, X),
            UnaryOp::Sqrt => d_bin(BinaryOp::Div, Const(0.5), R),
            // d x^-1/2 = -1/2 x^-3/2 = -1/2 r / x
            UnaryOp::Rsqrt => d_mul(Const(-0.5), d_bin(BinaryOp::Div, R, X)),
            UnaryOp::Tanh => d_sub(Const(1.0), d_mul(R, R)),
            UnaryOp::Sigmoid => d_mul(R, d_sub(Const(1.0), R)),
            UnaryOp::Gelu => {
                // r = x/2 (1 + t), t = tanh(c (x + a x^3)):
                // r' = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3 a x^2)
                let c = (2.0 / std::f64::consts::PI).sqrt();
                let a = 0.044715;
                let x2 = d_mul(X, X);
                let inner = d_mul(Const(c), d_add(X, d_mul(Const(a), d_mul(x2.clone(), X))));
                let t = d_un(UnaryOp::Tanh, inner);
                let left = d_mul(Const(0.5), d_add(Const(1.0), t.clone()));
                let slope = d_mul(Const(c), d_add(Const(1.0), d_mul(Const(3.0 * a), x2)));
                let right = d_mul(
                    d_mul(Const(0.5), X),
                    d_mul(d_sub(Const(1.0), d_mul(t.clone(), t)), slope),
                );
                d_add(left, right)
            }
            UnaryOp::Abs => d_un(UnaryOp::Sign, X),
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign => Const(0.0),
            UnaryOp::Reciprocal => d_un(UnaryOp::Neg, d_mul(R, R)),
            UnaryOp::Sin => d_un(UnaryOp::Cos, X),
            UnaryOp::Cos => d_un(UnaryOp::Neg, d_un(UnaryOp::Sin, X)),
            UnaryOp::Silu => {
                // s (1 + x (1 - s)), s = sigmoid(x)
                let s = d_un(UnaryOp::Sigmoid, X);
                d_mul(s.clone(), d_add(Const(1.0), d_mul(X, d_sub(Const(1.0), s))))
            }
            UnaryOp::Erf => d_mul(
                Const(2.0 / std::f64::consts::PI.sqrt()),
                d_un(UnaryOp::Exp, d_un(UnaryOp::Neg, d_mul(X, X))),
            ),
        }
    }
}

impl BinaryOp {
    /// `[d r / d x, d r / d y]` for `r = self(x, y)` on floats; `None` for
    /// the bitwise operators and shifts, which are integer-only. `max` and
    /// `min` split a tie evenly; `pow`'s exponent derivative takes
    /// `log(x)` as 0 where `x` is 0 (as JAX does).
    pub fn partials(self) -> Option<[Formula; 2]> {
        use Formula::{Const, R, X, Y};
        Some(match self {
            BinaryOp::Add => [Const(1.0), Const(1.0)],
            BinaryOp::Sub => [Const(1.0), Const(-1.0)],
            BinaryOp::Mul => [Y, X],
            BinaryOp::Div => [
                d_un(UnaryOp::Reciprocal, Y),
                d_un(UnaryOp::Neg, d_bin(BinaryOp::Div, R, Y)),
            ],
            BinaryOp::Max => [chooser(CmpOp::Gt, X, Y), chooser(CmpOp::Gt, Y, X)],
            BinaryOp::Min => [chooser(CmpOp::Lt, X, Y), chooser(CmpOp::Lt, Y, X)],
            BinaryOp::Pow => [
                d_mul(Y, d_bin(BinaryOp::Pow, X, d_sub(Y, Const(1.0)))),
                d_mul(
                    R,
                    d_un(UnaryOp::Log, d_sel(CmpOp::Eq, X, Const(0.0), Const(1.0), X)),
                ),
            ],
            BinaryOp::BitAnd
            | BinaryOp::BitOr
            | BinaryOp::BitXor
            | BinaryOp::Shl
            | BinaryOp::Shr => return None,
        })
    }
}

#[cfg(test)]
mod deriv_tests {
    use super::*;

    /// Builds a rule on plain numbers.
    struct Numbers;

    impl FormulaBuilder for Numbers {
        type Value = f64;
        type Error = ();
        fn constant(&mut self, c: f64) -> Result<f64, ()> {
            Ok(c)
        }
        fn unary(&mut self, u: UnaryOp, a: f64) -> Result<f64, ()> {
            Ok(apply_unary(u, a))
        }
        fn binary(&mut self, b: BinaryOp, x: f64, y: f64) -> Result<f64, ()> {
            apply_binary(b, x, y, false).ok_or(())
        }
        fn select(&mut self, c: CmpOp, a: f64, b: f64, t: f64, e: f64) -> Result<f64, ()> {
            Ok(if c.apply(a, b) { t } else { e })
        }
        fn as_const(&self, v: &f64) -> Option<f64> {
            Some(*v)
        }
    }

    #[test]
    fn expansions_are_indexed_by_discriminant_and_mean_their_functions() {
        for (i, u) in UnaryOp::ALL.into_iter().enumerate() {
            assert_eq!(u as usize, i, "{} out of order in UnaryOp::ALL", u.name());
        }
        type Reference = fn(f64) -> f64;
        let reference: [(UnaryOp, Reference); 6] = [
            (UnaryOp::Sigmoid, |x| 1.0 / (1.0 + (-x).exp())),
            (UnaryOp::Silu, |x| x / (1.0 + (-x).exp())),
            (UnaryOp::Rsqrt, |x| x.sqrt().recip()),
            (UnaryOp::Reciprocal, f64::recip),
            (UnaryOp::Sign, |x| {
                if x == 0.0 || x.is_nan() {
                    x
                } else {
                    x.signum()
                }
            }),
            (UnaryOp::Gelu, |x| {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x.powi(3))).tanh())
            }),
        ];
        for (u, f) in reference {
            assert!(u.expansion().is_some(), "{} has no expansion", u.name());
            for x in [-30.0, -3.5, -1.0, -0.25, -0.0, 0.0, 0.5, 2.0, 7.0, 40.0] {
                let (got, want) = (apply_unary(u, x), f(x));
                let close = got == want
                    || (got - want).abs() <= 4.0 * f64::EPSILON * want.abs().max(1e-300)
                    || (want == 0.0 && got == 0.0)
                    || (want.is_nan() && got.is_nan());
                assert!(close, "{}({x}) = {got}, want {want}", u.name());
            }
            assert!(apply_unary(u, f64::NAN).is_nan(), "{}(NaN)", u.name());
        }
        assert_eq!(
            apply_unary(UnaryOp::Sign, -0.0).to_bits(),
            (-0.0f64).to_bits()
        );
        let primitives = UnaryOp::ALL
            .iter()
            .filter(|u| u.expansion().is_none())
            .count();
        assert_eq!(
            primitives,
            UnaryOp::ALL.len() - 6,
            "a new composite needs a row here"
        );
    }

    fn central(f: impl Fn(f64) -> f64, x: f64) -> f64 {
        let h = 1e-6 * x.abs().max(1.0);
        (f(x + h) - f(x - h)) / (2.0 * h)
    }

    #[test]
    fn unary_derivatives_match_central_differences() {
        for u in UnaryOp::ALL {
            for x in [-1.7f64, -0.4, 0.3, 0.9, 2.2] {
                let x = match u {
                    UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => x.abs(),
                    _ => x,
                };
                let r = apply_unary(u, x);
                let got = u.derivative().build(&mut Numbers, &[x, 0.0, r]).unwrap();
                let want = central(|x| apply_unary(u, x), x);
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{}'({x}) = {got}, central differences give {want}",
                    u.name()
                );
            }
        }
    }

    #[test]
    fn binary_partials_match_central_differences() {
        for b in BinaryOp::ALL {
            let Some(partials) = b.partials() else {
                assert!(b.is_bitwise(), "{} has no derivative", b.name());
                continue;
            };
            for (x, y) in [(0.7f64, 1.3), (1.9, -0.6), (2.5, 0.5), (-0.8, -1.1)] {
                let x = if b == BinaryOp::Pow { x.abs() } else { x };
                let r = apply_binary(b, x, y, false).unwrap();
                for (i, p) in partials.iter().enumerate() {
                    let got = p.build(&mut Numbers, &[x, y, r]).unwrap();
                    let want = if i == 0 {
                        central(|x| apply_binary(b, x, y, false).unwrap(), x)
                    } else {
                        central(|y| apply_binary(b, x, y, false).unwrap(), y)
                    };
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "d {}(x, y) / d operand {i} at ({x}, {y}) = {got}, central differences give {want}",
                        b.name()
                    );
                }
            }
        }
    }

    #[test]
    fn ties_split_the_gradient() {
        for b in [BinaryOp::Max, BinaryOp::Min] {
            let [dx, dy] = b.partials().unwrap();
            let at = [1.5, 1.5, 1.5];
            assert_eq!(dx.build(&mut Numbers, &at), Ok(0.5));
            assert_eq!(dy.build(&mut Numbers, &at), Ok(0.5));
        }
    }
}

#[cfg(test)]
mod wrap_tests {
    use super::*;
    use crate::DType;

    /// Products past 2^53 keep their low bits: what an f64 product would
    /// round away.
    #[test]
    fn integer_arithmetic_wraps_exactly() {
        let big = 4_294_967_295.0; // u32::MAX
        assert_eq!(
            apply_binary_in(BinaryOp::Mul, big, big, DType::U32),
            Some(1.0)
        );
        assert_eq!(
            apply_binary_in(BinaryOp::Mul, 2_654_435_761.0, 3_266_489_909.0, DType::U32),
            Some(f64::from(2_654_435_761u32.wrapping_mul(3_266_489_909)))
        );
        assert_eq!(
            apply_binary_in(BinaryOp::Add, big, 2.0, DType::U32),
            Some(1.0)
        );
        assert_eq!(
            apply_binary_in(BinaryOp::Sub, 0.0, 1.0, DType::U32),
            Some(big)
        );
        assert_eq!(
            apply_binary_in(BinaryOp::Shl, big, 31.0, DType::U32),
            Some(2_147_483_648.0)
        );
        assert_eq!(
            apply_binary_in(BinaryOp::Mul, -3.0, 1e9, DType::I32),
            Some(f64::from((-3i32).wrapping_mul(1_000_000_000)))
        );
        assert_eq!(
            apply_binary_in(BinaryOp::Mul, 1.5, 2.0, DType::F32),
            Some(3.0)
        );
    }
}
