//! The loop dialect's types, and the dialect as a [`dlc_core::ir::Dialect`]:
//! its functions, blocks and ops are the IR core's, its op kinds
//! [`OpKind`].

use std::fmt;

use dlc_core::DType;

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

/// An affine index over index values (`sum(coeff * value) + constant`; the
/// loop dialect writes no tile coordinates).
pub type IndexExpr = dlc_core::ir::Affine;

pub use crate::ops::{Contraction, OpKind};
pub use dlc_core::ir::{Block, OpId, Value};

/// The loop dialect, as a dialect of the IR core ([`dlc_core::ir`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Loop;

/// An op: its kind, operands, results and nested blocks (loop bodies).
pub type OpData = dlc_core::ir::OpData<Loop>;

/// A function over buffers: inputs and outputs are parameters (outputs are
/// written in place), and the body ends with `loop.return`.
pub type Function = dlc_core::ir::Function<Loop>;

/// A list of functions.
pub type Module = dlc_core::ir::Module<Loop>;

impl dlc_core::ir::Dialect for Loop {
    const NAME: &'static str = "loop";
    type Op = OpKind;
    type Type = Type;
    type Buffer = BufferType;

    fn buffer_type(b: BufferType) -> Type {
        Type::Buffer(b)
    }

    fn index_type() -> Type {
        Type::Index
    }

    fn buffer_op(op: dlc_core::ir::BufferOp) -> crate::ops::OpKind {
        use dlc_core::ir::BufferOp;
        match op {
            BufferOp::Alloc => crate::ops::OpKind::Alloc,
            BufferOp::Global(v) => crate::ops::OpKind::Global(v),
            BufferOp::Dealloc => crate::ops::OpKind::Dealloc,
            BufferOp::View => crate::ops::OpKind::View,
        }
    }
}
