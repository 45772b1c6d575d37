//! The tile dialect: block-level programs, the level where a loop nest is
//! scheduled onto a machine. The conversion from the loop dialect lives in
//! `compiler/lower`: this crate knows nothing of the levels above or below it.
//!
//! The tile level is where a loop nest is scheduled onto a machine. It follows the model
//! of Triton (and of triton-cpu on CPUs): a kernel is a grid of independent program
//! instances, and each program works on whole tiles (small static-shaped blocks) rather
//! than on scalars. On a CPU the grid points are spread over threads; on a GPU each is a
//! thread block, and a tile is distributed over the block's threads.
//!
//! ```text
//! tile.func @dense(%x: buffer<f32[10, 40]>, %w: buffer<f32[40, 20]>, %b: buffer<f32[20]>, out %out0: buffer<f32[10, 20]>) {
//!   tile.kernel {grid = [2, 1], schedule = "dot", tile = [6, 20, 40]} {
//!     %0 = tile.program_id {axis = 0} : index
//!     %1 = tile.program_id {axis = 1} : index
//!     %2 = tile.const {value = 0.0} : tile<6x20xf32>
//!     %3 = tile.for %2 {lo = 0, hi = 40, step = 40} (%4, %5) {
//!       %6 = tile.mask [-6*%0 + 10, -%4 + 40] : tile<6x40xbool>
//!       %7 = tile.load %x[6*%0 + #0, %4 + #1] mask %6 {pad = 0.0} : tile<6x40xf32>
//!       %8 = tile.load %w[%4 + #0, 20*%1 + #1] : tile<40x20xf32>
//!       %9 = tile.dot %7, %8, %5 : tile<6x20xf32>
//!       tile.yield %9
//!     } : tile<6x20xf32>
//!     %10 = tile.mask [-6*%0 + 10, -20*%1 + 20] : tile<6x20xbool>
//!     %11 = tile.load %b[20*%1 + #1] mask %10 {pad = 0.0} : tile<6x20xf32>
//!     %12 = tile.add %3, %11 : tile<6x20xf32>
//!     %13 = tile.relu %12 : tile<6x20xf32>
//!     tile.store %13, %out0[6*%0 + #0, 20*%1 + #1] mask %10
//!   }
//!   tile.return
//! }
//! ```
//!
//! - **Types**: `index`, scalars (`f32`), tiles (`tile<6x20xf32>`, at least one axis),
//!   and buffers with a memory space: `buffer<f32[10, 40]>` (global),
//!   `buffer<f32[16, 32], scratch>` (private to one program: a CPU thread's stack or
//!   heap, a GPU block's local memory), `buffer<f32[16, 32], shared>` (a GPU block's
//!   shared memory). MLIR prints tiles as `tensor`s and spaces as memref memory spaces
//!   (NVVM's numbering: 3 shared, 5 local).
//! - **Host ops** (function body): `tile.alloc` (global), `tile.global` (read-only
//!   constant data), `tile.view`, `tile.dealloc`,
//!   `tile.kernel {grid = [..], schedule = "..", params..} { body }` (the schedule's
//!   parameters are typed by strategy: `rows`/`serial` take `vector`, `blocked` `vector`
//!   and optionally `tile`, `dot` `tile` and optionally `stages`, `packed` `blocking` and
//!   optionally `pack`, `fused` and `winograd` `blocking`), `tile.return`.
//! - **Program ops** (kernel bodies): `tile.program_id {axis}`; `tile.const` (a scalar or a
//!   splat tile), `tile.splat`; the shared scalar operators (`tile.exp`, `tile.add`,
//!   `tile.lt`, `tile.select`, `tile.cast`) on scalars or tiles of one type;
//!   `tile.load %b[idx..] mask %m {pad = P}` and `tile.store %v, %b[idx..] mask %m`, where
//!   each buffer index is affine in index values and in `#k`, an element's coordinate
//!   along tile axis `k` (an index without `#k` broadcasts along it; `%x[#1, #0]` reads a
//!   transposed block; `%p[#0, 2*#1]` a strided one), masked-off elements read the pad;
//!   `tile.mask [l0, l1..]` (element `e` is on when `e_k < l_k`: the ragged edge of a
//!   nest); `tile.broadcast`, `tile.reshape`, `tile.trans {perm}`, `tile.expand_dims
//!   {axis}`, `tile.slice %t[offsets..]` (the part of a tile from offsets affine in index
//!   values on); `tile.dot %a, %b, %acc` (`MxK @ KxN` into `MxN` in the accumulator type, f32
//!   for f16/bf16); `tile.reduce {kind = sum|max|min|prod, axis}` (a one-axis tile
//!   reduces to a scalar); `tile.for %init.. {lo, hi, step} (%i, %c..) { .. tile.yield }`
//!   carrying scalars or tiles; `tile.alloc` of scratch or shared buffers (packing is a
//!   load and a store into one: IR the interpreter runs); `tile.barrier`.
//! - **One declaration per op** (`ops.rs`): `OpKind::name`, `attrs`/`from_parts`,
//!   `syntax` (operand shape: fixed, variadic, indexed buffer with optional mask, limit
//!   list; region with or without arguments; terminator), `place` (host or program)
//!   and `check` (the typing rule). The IR core's text printer and parser
//!   (`%r = tile.NAME operands {attrs} (region args) { region } : result types`), MLIR
//!   generic printer (index lists become `affine_map<(tile coordinates)[index
//!   operands] -> (..)>` attributes) and verifier derive from it ([`dlc_core::ir`]);
//!   mlir-opt-22 parses the generic form of every example.
//! - **Verifier**: SSA scoping (kernels see the host's buffers; a loop's results are not
//!   visible in its body), where each op may stand, each op's typing rule, region
//!   arguments, terminators; every problem is reported at the op's printed name
//!   (`@f: %8 = tile.reduce: axis 2 is past the 2 axes`, `@f: tile.store after %10: ..`).
//! - **Interpreter** (`interp.rs`): runs programs one after another in row-major grid
//!   order; scratch and shared buffers are allocated per program and filled with NaN
//!   (float types), so reading what packing never wrote shows in the results; masks,
//!   pads and bounds are checked per element (out of bounds without a pad, two
//!   elements of one store writing one place, integer division by zero are errors; a
//!   masked-off element reads the pad, or zero); `tile.dot` and `tile.reduce` sum exactly and round
//!   once. A program stands for every thread that runs it on a GPU, so the interpreter
//!   checks what barriers are for: an element of shared memory written since the last
//!   `tile.barrier` may not be read or written, and one read may not be overwritten,
//!   before the next barrier. Work is estimated before running (2^34 by default).
//! - `transforms::dce` removes pure ops nothing uses.
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
    Affine, Block, BufferType, Function, Layout, MAX_DEINTERLEAVED_STEP, MmaGrid, Module, OpData,
    OpId, PackedOperand, Schedule, Space, Tile, TileType, Type, Value,
};
pub use ops::OpKind;
pub use parse::parse_module;
pub use print::{print_mlir_generic, print_module};
