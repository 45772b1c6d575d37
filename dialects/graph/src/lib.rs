//! The graph dialect: a function is a DAG of tensor operations with static
//! shapes and element types, held in a petgraph `StableDiGraph`.
//!
//! This crate owns the dialect's ops ([`ops`]), user-defined operators in
//! index notation ([`compute`]), shape inference ([`infer`]), the verifier,
//! the text form ([`print`] / [`parse`], which round-trip) and MLIR generic
//! printing, the transforms ([`transforms`]) and the reference interpreter
//! ([`interp`]) that defines what every dlc program means.
#![deny(missing_docs)]

pub mod autodiff;
pub mod compute;
pub mod fusion;
pub mod infer;
pub mod interp;
pub mod module;
pub mod ops;
pub mod parse;
pub mod print;
pub mod transforms;
pub mod verify;

pub use module::{Function, Module, Node, Use, Value, Visibility};
pub use ops::Op;
pub use parse::{ParseError, parse_module};
pub use print::{print_mlir_generic, print_module};
