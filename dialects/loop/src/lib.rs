//! The loop dialect: loop nests with affine indices over explicit buffers.
//!
//! A function takes buffers (inputs, and outputs it writes in place) and is a
//! tree of blocks: `loop.for` (sequential, carrying values such as a
//! reduction's accumulator), `loop.parallel` (independent iterations), loads
//! and stores with affine indices (a load may name a pad value for reads
//! outside the buffer, which is how zero padding is written), scalar
//! arithmetic and math, buffer allocation, and the structured product
//! `loop.matmul`. It is a dialect of the IR core ([`dlc_core::ir`]), which
//! holds its functions, blocks and ops, and whose text form, MLIR generic
//! printer, verifier and builder derive from each op's one declaration in
//! [`ops`]; this crate owns its types ([`ir`]), those declarations with their
//! typing rules, the verifier's loop-specific rules ([`verify`]) and the
//! interpreter ([`interp`]).
//!
//! # The dialect in detail
//!
//! A `loop.func` takes buffers (`buffer<f32[4, 8]>`, optionally with
//! `strides = [1, 4]`; a view of part of a buffer also has an `offset = N`, in elements
//! from the start of its storage, which parameters and allocations never have): inputs, then the outputs it writes in place, marked `out`
//! (destination passing, which is what the C ABI entry point takes). Its body is a tree
//! of blocks:
//!
//! ```text
//! loop.func @rowsum(%a: buffer<f32[4, 8]>, out %out: buffer<f32[4]>) {
//!   loop.parallel {lo = 0, hi = 4} (%0) {
//!     %1 = loop.const {value = 0.0} : f32
//!     %2 = loop.for %1 {lo = 0, hi = 8, step = 1} (%3, %4) {
//!       %5 = loop.load %a[%0, %3] : f32
//!       %6 = loop.add %4, %5 : f32
//!       loop.yield %6
//!     } : f32
//!     loop.store %2, %out[%0]
//!   }
//!   loop.return
//! }
//! ```
//!
//! - Data: per-function arenas of values (`Value`, with a `Type`: index, scalar or
//!   buffer) and ops (`OpId`, with `OpKind`, operands, results, nested blocks); a block
//!   lists its ops. What an op is lives apart from where it sits.
//! - Ops: `alloc`/`dealloc`, `const`, the shared scalar operators (`loop.exp`,
//!   `loop.add`, `loop.lt`, ...), `select`, `cast`, `load`/`store` with affine indices
//!   over loop indices (a load may carry `pad P`, the value read outside the buffer:
//!   how zero padding is written), `for` (sequential; carries values with
//!   `iter(...)`/`yield`, which is how reductions are written), `parallel`
//!   (independent iterations), `matmul` (the structured product: `ops`),
//!   `kernel_begin {group = "attention" | "im2col" | "winograd"}` / `kernel_end` (a kernel group of the
//!   lowering's plan: the top-level ops between them may run as one kernel; an im2col
//!   group carries its convolution's window, `kernel`, `stride`, `padding`, `dilation`,
//!   one `dlc_core::Window` declared once for the graph and loop dialects; the pair
//!   delimits rather than encloses, so buffers defined in a group stay visible after
//!   it, and the verifier checks that groups are closed, not nested and only at the top
//!   level), `return`. Loop bounds are constants: shapes are static.
//! - The verifier checks SSA scoping (each value defined once, used only where
//!   visible), every op's types (its declared rule), indices, and block terminators,
//!   reporting every problem.
//! - Each op is declared once (`dialects/loop/src/ops.rs`, as the graph and tile
//!   dialects do): its name, attributes, how its operands and region are written, its
//!   region's argument types and its typing rule (`OpKind::check`). The text printer,
//!   the text parser, the MLIR generic printer and the verifier derive from that
//!   declaration (the verifier adds scoping, indices and nested blocks); every op has one generic shape,
//!   `%r = loop.NAME operands {attrs} (%region_args) { region } : result types`, where
//!   a load's or store's buffer carries its index (`%b[%0, 2*%1 + 1]`) and a
//!   `loop.matmul`'s operands carry theirs over the op's counters (`%a[#0, #2]`; `#0`
//!   row, `#1` column, `#2` depth), and a loop with several results is `%r:2 = ...`,
//!   used as `%r#0`. The text form round-trips; values print as `%0, %1, ...` in
//!   definition order. The MLIR generic form uses `memref` types, regions with
//!   `^bb0(...)` arguments, and `affine_map` attributes for indices; mlir-opt-22
//!   parses it. Attributes and the reader that rebuilds ops from them are shared with
//!   the tile dialect (`dlc_core::attr`).
//! - The interpreter runs a function over `Buffer`s; out-of-bounds accesses without a
//!   pad, use after `dealloc` and integer division by zero are errors. Scalars round to
//!   their type after each op, so an f32 `loop.for` reduction accumulates in f32 (the
//!   graph interpreter accumulates in f64: the two agree within tolerance).
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
    Block, BufferType, Contraction, Function, IndexExpr, Loop, Module, OpData, OpId, OpKind, Type,
    Value,
};
pub use ops::KernelGroup;
pub use parse::parse_module;
pub use print::{print_mlir_generic, print_module};
