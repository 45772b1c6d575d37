//! The loop dialect's data: values and ops live in per-function arenas
//! (`Value` and `OpId` index them); an op owns its nested blocks, and a block
//! lists its ops in order. What an op is (`OpKind`) is apart from where it
//! sits (the block that lists it).

use std::fmt;

use dlc_core::DType;
use dlc_core::scalar::{BinaryOp, CmpOp, UnaryOp};

/// An SSA value: a function parameter, a block argument or an op result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(pub u32);

/// An op of a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u32);

/// A buffer: element type, shape, and strides in elements (the layout
/// every dialect's buffers share).
pub type BufferType = dlc_core::Layout;

/// The type of a value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Type {
    /// A loop index (a signed 64-bit integer).
    Index,
    /// A scalar element.
    Scalar(DType),
    /// A buffer.
    Buffer(BufferType),
}

impl Type {
    /// The MLIR type.
    pub fn mlir(&self) -> String {
        match self {
            Type::Index => "index".into(),
            Type::Scalar(d) => d.mlir_name().into(),
            Type::Buffer(b) => b.mlir(),
        }
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Index => f.write_str("index"),
            Type::Scalar(d) => write!(f, "{d}"),
            Type::Buffer(b) => write!(f, "{b}"),
        }
    }
}

/// An affine index: `sum(coeff * index value) + constant`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IndexExpr {
    /// Non-zero coefficients of index-typed values.
    pub terms: Vec<(i64, Value)>,
    /// The constant term.
    pub constant: i64,
}

impl IndexExpr {
    /// The index value `v`.
    pub fn value(v: Value) -> Self {
        IndexExpr {
            terms: vec![(1, v)],
            constant: 0,
        }
    }
}

/// The sizes and indices of a `loop.matmul` (boxed in [`OpKind`], which
/// they would otherwise make larger for every op).
#[derive(Debug, Clone, PartialEq)]
pub struct Contraction {
    /// Rows.
    pub m: i64,
    /// Columns.
    pub n: i64,
    /// Reduction length.
    pub k: i64,
    /// Index into the left operand.
    pub a: Vec<IndexExpr>,
    /// Index into the right operand.
    pub b: Vec<IndexExpr>,
}

/// What an op does. Operands, results and regions are in [`OpData`].
#[derive(Debug, Clone, PartialEq)]
pub enum OpKind {
    /// `%b = loop.alloc : memref<..>`: a new buffer, contents undefined.
    Alloc,
    /// `loop.dealloc %b`: the buffer's storage is released.
    Dealloc,
    /// `%v = loop.view %b : buffer<..>`: the same storage seen with another
    /// shape and strides (a reshape of a contiguous buffer, a transpose). The
    /// view must stay within the storage; it aliases `%b`.
    View,
    /// `%c = loop.const 0.5 : f32`.
    Const(f64),
    /// Element-wise function of one scalar.
    Unary(UnaryOp),
    /// Element-wise function of two scalars of one type.
    Binary(BinaryOp),
    /// Comparison of two scalars of one type, giving bool.
    Compare(CmpOp),
    /// `loop.select %c, %a, %b`.
    Select,
    /// Scalar type conversion.
    Cast,
    /// `%v = loop.load %b[idx, ...] [pad P]`: an element; out of bounds is an
    /// error, or `pad` when given (how zero padding is written).
    Load {
        /// One affine index per dimension.
        index: Vec<IndexExpr>,
        /// The value read outside the bounds.
        pad: Option<f64>,
    },
    /// `loop.store %v, %b[idx, ...]`.
    Store {
        /// One affine index per dimension.
        index: Vec<IndexExpr>,
    },
    /// A sequential loop `lo..hi` by `step`, carrying values (`iter`) from one
    /// iteration to the next; its results are the last iteration's values.
    For {
        /// First index.
        lo: i64,
        /// One past the last index.
        hi: i64,
        /// Positive step.
        step: i64,
    },
    /// A loop whose iterations are independent and may run in any order or at
    /// once (over threads, SIMD lanes or GPU blocks).
    Parallel {
        /// First index.
        lo: i64,
        /// One past the last index.
        hi: i64,
    },
    /// Ends a `loop.for` body that carries values: the next iteration's values.
    Yield,
    /// `loop.matmul (%i, %j, %k, %acc) = (M, N, K) %a[..] * %b[..]
    /// { epilogue }`: for every `i < M`, `j < N`, `%acc` is the sum over
    /// `k < K` of `a[..] * b[..]` in the accumulator type of the operands'
    /// element type (operands 0 and 1 are the buffers, the
    /// indices affine in `%i`, `%k` and `%k`, `%j`, and in indices defined
    /// outside), and the region, run once per `(i, j)` after the sum, does
    /// what follows with it (an epilogue ending in stores): the structured
    /// contraction that `convert-loop-to-tile` turns into `tile.dot`
    /// programs (on a CPU, packed operands and a register-tiled
    /// micro-kernel).
    Matmul(Box<Contraction>),
    /// Ends a function.
    Return,
}

impl OpKind {
    /// The op's name (`loop.add`).
    pub fn name(&self) -> String {
        let s: &str = match self {
            OpKind::Alloc => "alloc",
            OpKind::Dealloc => "dealloc",
            OpKind::View => "view",
            OpKind::Const(_) => "const",
            OpKind::Unary(u) => u.name(),
            OpKind::Binary(b) => b.name(),
            OpKind::Compare(c) => c.name(),
            OpKind::Select => "select",
            OpKind::Cast => "cast",
            OpKind::Load { .. } => "load",
            OpKind::Store { .. } => "store",
            OpKind::For { .. } => "for",
            OpKind::Parallel { .. } => "parallel",
            OpKind::Yield => "yield",
            OpKind::Return => "return",
            OpKind::Matmul(_) => "matmul",
        };
        format!("loop.{s}")
    }
}

/// An op: its kind, operands, results and nested blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct OpData {
    /// What it does.
    pub kind: OpKind,
    /// Values it reads.
    pub operands: Vec<Value>,
    /// Values it defines.
    pub results: Vec<Value>,
    /// Nested blocks (loop bodies).
    pub regions: Vec<Block>,
    /// The source place of the graph op it was lowered from, when known:
    /// what a run-time failure of the op (a division by zero, an allocation)
    /// names. Not part of the text form.
    pub loc: Option<dlc_core::SourceLoc>,
}

/// A list of ops, with arguments (a loop's index and carried values).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Block {
    /// Values the block defines on entry.
    pub args: Vec<Value>,
    /// Its ops, in order.
    pub ops: Vec<OpId>,
}

/// A function over buffers: inputs and outputs are parameters (outputs are
/// written in place), and the body ends with `loop.return`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Function {
    /// Symbol name.
    pub name: String,
    /// Parameter names and values.
    pub params: Vec<(String, Value)>,
    /// How many of the parameters, at the end, are results the function
    /// writes (printed with `out`); the others are inputs it only reads.
    pub outputs: usize,
    /// The body.
    pub body: Block,
    /// Type of each value, indexed by [`Value`].
    pub values: Vec<Type>,
    /// Every op, indexed by [`OpId`].
    pub ops: Vec<OpData>,
}

impl Function {
    /// An empty function.
    pub fn new(name: impl Into<String>) -> Self {
        Function {
            name: name.into(),
            ..Function::default()
        }
    }

    /// A new value of type `ty`.
    pub fn new_value(&mut self, ty: Type) -> Value {
        self.values.push(ty);
        Value(self.values.len() as u32 - 1)
    }

    /// The parameters that are inputs (all but the trailing `outputs`).
    pub fn inputs(&self) -> &[(String, Value)] {
        &self.params[..self.params.len().saturating_sub(self.outputs)]
    }

    /// The parameters that are results.
    pub fn results(&self) -> &[(String, Value)] {
        &self.params[self.params.len().saturating_sub(self.outputs)..]
    }

    /// Appends a parameter.
    pub fn add_param(&mut self, name: impl Into<String>, ty: BufferType) -> Value {
        let v = self.new_value(Type::Buffer(ty));
        self.params.push((name.into(), v));
        v
    }

    /// Creates an op (not yet in any block) with results of the given types.
    pub fn create_op(
        &mut self,
        kind: OpKind,
        operands: Vec<Value>,
        results: &[Type],
        regions: Vec<Block>,
    ) -> OpId {
        let results = results.iter().map(|t| self.new_value(t.clone())).collect();
        self.ops.push(OpData {
            kind,
            operands,
            results,
            regions,
            loc: None,
        });
        OpId(self.ops.len() as u32 - 1)
    }

    /// The type of a value.
    ///
    /// # Panics
    /// If `v` is not a value of this function; the verifier rules this out.
    pub fn ty(&self, v: Value) -> &Type {
        &self.values[v.0 as usize]
    }

    /// An op's data.
    ///
    /// # Panics
    /// If `op` is not an op of this function; the verifier rules this out.
    pub fn op(&self, op: OpId) -> &OpData {
        &self.ops[op.0 as usize]
    }
}

/// A list of functions.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Module {
    /// The functions, in print order.
    pub functions: Vec<Function>,
}
