//! What the loop and tile interpreters share: buffers of f64 elements, the
//! errors a run ends with, finding the function to run and checking its
//! arguments, and the work check made before running. How each op runs is
//! the dialect's interpreter.

use std::fmt;

use crate::Layout;

use super::{Dialect, Function, Module, OpId};

/// The largest buffer (in elements) an interpreter allocates.
pub const MAX_ELEMENTS: usize = 1 << 29;

/// The most work an interpreter takes on in one run unless told otherwise:
/// 2^34 executed ops or element operations, as the graph interpreter's.
pub const DEFAULT_WORK_LIMIT: f64 = 17_179_869_184.0;

/// A buffer's contents: `data[offset]` holds the element whose offset (the
/// dot product of its index with the strides) is `offset`.
#[derive(Debug, Clone, PartialEq)]
pub struct Buffer<B> {
    /// Type, shape and strides (and, in tile IR, memory space).
    pub ty: B,
    /// Storage.
    pub data: Vec<f64>,
}

impl<B: AsRef<Layout> + fmt::Display> Buffer<B> {
    /// A zero-filled buffer.
    pub fn zeros(ty: B) -> Result<Buffer<B>, RunError> {
        match ty.as_ref().storage_len() {
            Some(n) if n <= MAX_ELEMENTS => Ok(Buffer {
                data: vec![0.0; n],
                ty,
            }),
            _ => Err(RunError::TooLarge(ty.to_string())),
        }
    }
}

/// Why a function could not run to its end.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    /// No such function.
    #[error("no function `@{0}`")]
    UnknownFunction(String),
    /// Arguments do not match the parameters.
    #[error("{0}")]
    Arguments(String),
    /// An access outside a buffer without a pad value.
    #[error("{op} accesses index {index:?}, outside {ty}")]
    OutOfBounds {
        /// The op.
        op: String,
        /// The computed index.
        index: Vec<i64>,
        /// The buffer type.
        ty: String,
    },
    /// Two elements of one store write the same place.
    #[error("{op} writes index {index:?} of {ty} twice")]
    OverlappingStore {
        /// The op.
        op: String,
        /// The index written twice.
        index: Vec<i64>,
        /// The buffer type.
        ty: String,
    },
    /// Conflicting shared-memory accesses without a barrier between them.
    #[error(
        "{op} {what} shared memory ({ty}, index {index:?}) {since} since the last tile.barrier"
    )]
    SharedRace {
        /// The op.
        op: String,
        /// `reads` or `writes`.
        what: &'static str,
        /// What happened to the element before.
        since: &'static str,
        /// The index.
        index: Vec<i64>,
        /// The buffer type.
        ty: String,
    },
    /// A buffer used after it was deallocated.
    #[error("{0} uses a buffer after it was deallocated")]
    UseAfterFree(String),
    /// Integer division by zero, at the op's source place when known.
    #[error("integer division by zero{}", .0.as_ref().map_or(String::new(), |l| format!(" at {l}")))]
    DivisionByZero(Option<crate::SourceLoc>),
    /// A buffer too large to allocate.
    #[error("{0} is too large for the interpreter (limit {MAX_ELEMENTS} elements)")]
    TooLarge(String),
    /// IR the verifier should have rejected.
    #[error("invalid IR: {0}")]
    Invalid(String),
    /// A function whose estimated work exceeds the limit it is run under.
    #[error("{0}")]
    TooMuchWork(#[from] crate::work::WorkExceeded),
}

/// Function `name` of `m`, once `args` (one buffer per parameter) have been
/// checked against its parameters and its work, each top-level op's
/// estimated by `op_work`, against `limit`.
pub fn function_for<'m, D: Dialect>(
    m: &'m Module<D>,
    name: &str,
    args: &[Buffer<D::Buffer>],
    limit: f64,
    op_work: impl Fn(&Function<D>, OpId) -> f64,
) -> Result<&'m Function<D>, RunError> {
    let f = m
        .functions
        .iter()
        .find(|f| f.name == name)
        .ok_or_else(|| RunError::UnknownFunction(name.into()))?;
    if args.len() != f.params.len() {
        return Err(RunError::Arguments(format!(
            "@{name} takes {} buffers, got {}",
            f.params.len(),
            args.len()
        )));
    }
    for (i, ((pname, v), arg)) in f.params.iter().zip(args).enumerate() {
        if f.ty(*v) != &D::buffer_type(arg.ty.clone()) {
            return Err(RunError::Arguments(format!(
                "argument {i} (%{pname}) must be {}, got {}",
                f.ty(*v),
                arg.ty
            )));
        }
    }
    check_work(f, limit, op_work)?;
    Ok(f)
}

/// Fails with [`RunError::TooMuchWork`] when function `f`'s work, each
/// top-level op's estimated by `op_work`, is above `limit`.
pub fn check_work<D: Dialect>(
    f: &Function<D>,
    limit: f64,
    op_work: impl Fn(&Function<D>, OpId) -> f64,
) -> Result<(), RunError> {
    use super::OpDecl;
    let per_op: Vec<(String, f64)> = f
        .body
        .ops
        .iter()
        .map(|&op| (f.op(op).kind.name(), op_work(f, op)))
        .collect();
    Ok(crate::work::check_work(&f.name, &per_op, limit)?)
}
