//! The loop dialect: loop nests with affine indices over explicit buffers.
//!
//! A function takes buffers (inputs, and outputs it writes in place) and is a
//! tree of blocks: `loop.for` (sequential, carrying values such as a
//! reduction's accumulator), `loop.parallel` (independent iterations), loads
//! and stores with affine indices (a load may name a pad value for reads
//! outside the buffer, which is how zero padding is written), scalar
//! arithmetic and math, buffer allocation, and the structured product
//! `loop.matmul`. This crate owns the data model ([`ir`]), each op's one
//! declaration ([`ops`], from which the text form ([`print`] / [`parse`],
//! which round-trip) and MLIR generic printing derive), the verifier, and
//! the interpreter ([`interp`]).
#![deny(missing_docs)]

pub mod build;
pub mod interp;
pub mod ir;
pub mod ops;
pub mod parse;
pub mod print;
pub mod verify;

pub use build::Builder;
pub use ir::{
    Block, BufferType, Contraction, Function, IndexExpr, Module, OpData, OpId, OpKind, Type, Value,
};
pub use ops::KernelGroup;
pub use parse::parse_module;
pub use print::{print_mlir_generic, print_module};

impl std::fmt::Display for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&print::print_module(self))
    }
}
