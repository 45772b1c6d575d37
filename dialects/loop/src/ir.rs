//! The loop dialect's data: values and ops live in per-function arenas
//! (`Value` and `OpId` index them); an op owns its nested blocks, and a block
//! lists its ops in order. What an op is (`OpKind`) is apart from where it
//! sits (the block that lists it).

use std::fmt;

use dlc_core::DType;

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

pub use crate::ops::{Contraction, OpKind};

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
    /// The inputs (indices into `params`) that are weights: bound once and
    /// read by many calls (printed `weight %name`).
    pub weights: std::collections::BTreeSet<usize>,
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
