//! The tile dialect: block-level programs, the level where a loop nest is
//! scheduled onto a machine.
//!
//! A function is host code over global buffers: it allocates intermediates
//! and launches `tile.kernel`s in order. A kernel is a grid of independent
//! program instances (CPU threads take grid points; on a GPU each is a
//! thread block); `tile.program_id` tells a program where it is. A
//! program's values are tiles (`tile<64x32xf32>`), scalars and indices:
//! `tile.load`/`tile.store` move tiles between buffers and the program at
//! affine offsets, with masks and pads for ragged edges; element-wise ops
//! (the scalar operators of `dlc_core::scalar`), `tile.dot`, `tile.reduce`,
//! `tile.broadcast`/`reshape`/`trans`/`expand_dims` act on whole tiles;
//! `tile.for` carries tiles across iterations; `tile.alloc` places scratch
//! or shared buffers (packing is loads and stores into them, which the
//! interpreter runs); `tile.barrier` orders shared memory.
//!
//! Each op is declared once ([`ops`]); the text printer and parser
//! ([`print`], [`parse`]), the MLIR generic printer and the verifier derive
//! from that declaration. [`interp`] runs tile IR exactly. The conversion
//! from the loop dialect lives in `compiler/lower`: this crate knows
//! nothing of the levels above or below it.
#![deny(missing_docs)]

pub mod build;
pub mod interp;
pub mod ir;
pub mod ops;
pub mod parse;
pub mod print;
pub mod transforms;
pub mod verify;

pub use build::Builder;
pub use ir::{
    Affine, Block, BufferType, Function, Module, OpData, OpId, PackedOperand, Schedule, Space,
    TileType, Type, Value,
};
pub use ops::OpKind;
pub use parse::parse_module;
pub use print::{print_mlir_generic, print_module};

impl std::fmt::Display for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&print::print_module(self))
    }
}
