//! Loop to tile: each top-level loop nest becomes a kernel scheduled for a target.
//!
//! The conversion is split by concern: `loop_to_tile.rs` (state, the walk over
//! top-level nests, operand helpers), `grid.rs` (each nest's schedule; band kernels),
//! `vectorize.rs` (a program's body), `packed.rs`, `dot.rs`, `fused.rs` (attention rows,
//! implicit im2col) and `winograd.rs`. The tile passes run after it are
//! `dlc_tile::transforms`' (`tile.reuse-packs`, `tile.dce`, `tile.split-prepare`, `tile.insert-barriers`).
//!
//! `convert-loop-to-tile{target=NAME}` keeps buffers at the host level and makes each
//! top-level loop nest a kernel, recording the choice as the kernel's `Schedule`, an
//! enum with one variant per strategy and its typed parameters (`Schedule::Packed {
//! blocking: [mr, nr, mc, kc], pack: Option<PackedOperand> }`, printed `schedule =
//! "packed", blocking = [..], pack = [1]`; the parser refuses an unknown strategy, a
//! missing parameter or a wrong count of sizes):
//!
//! - `blocked`: a band of perfectly nested parallel loops (up to three) is the grid; when
//!   the innermost band loop has a straight-line body, each program takes `vector`
//!   consecutive iterations of it as one tile axis (mask on the ragged last block). So
//!   does a body of reductions whose every read moving with that loop is strided along
//!   theirs (`vectorizable_outside`: a sum down the columns, `out[j] = sum[i](x[i, j])`,
//!   is 64 columns per program adding one contiguous row at a time, not one column per
//!   program gathering down it).
//!   A parallel loop over rows shorter than a tile (fewer than `vector` iterations,
//!   straight-line body, every store moving with both counters in separate dimensions)
//!   takes several rows at a time: `r x c` tiles with `c` the row and `r = vector / c`,
//!   one program per block of rows (`tile = [r, c]`; W8's 7-column rows become 9 x 7
//!   tiles on AVX-512, 36 x 7 on sm_90).
//! - `rows`: the band is the grid, one program per iteration, and the body runs in each
//!   program: every innermost loop becomes a `tile.for` over `vector`-wide tiles (loads
//!   and stores at `#0`, values that do not depend on the loop stay scalars and are
//!   splatted where they meet tiles), a value it carries by `+`, `*`, `max` or `min` (a
//!   reduction) becomes a tile of partial results reduced by `tile.reduce` after the
//!   loop, masked-off lanes contributing the identity; an integer division in a masked
//!   region divides masked lanes by 1. The ragged last tile's mask is an operand of every
//!   tile's loads and stores; on a CPU without mask registers (`CpuDesc::mask_registers`)
//!   the whole tiles run unmasked instead and the rest after them as one tile of exactly
//!   the rest, each part's partial results reduced. A loop is vectorized only if every store in it
//!   moves with the loop and a buffer (or view of one) both read and written in it is
//!   accessed through one value at one index (an element updated in place);
//!   other loops stay counted `tile.for`s. A loop whose body holds only short
//!   reductions (`vectorizable_outside`: inner loops no longer than its tile,
//!   storing nothing, reading along its counter contiguously or a few
//!   elements apart, up to `dlc_tile::MAX_DEINTERLEAVED_STEP`) is the one
//!   made of tiles instead, the inner loops counted `tile.for`s carrying tiles, a lane
//!   per iteration of the outer loop: a depthwise convolution's or a pool's `sum[ky, kx]`
//!   for each column is a tile of columns per tap, not a tile of three taps reduced per
//!   column (`differential.rs::short_reductions_run_across_their_columns`), at stride 2
//!   too (MobileNet's downsampling: a column tile read two apart).
//! - `dot`: a contraction becomes a grid over the batch and `BM x BN` blocks of the
//!   result, a `tile.for` over `BK`-deep slices loading both operand blocks (masked on
//!   ragged edges, pad 0) into `tile.dot`, then the epilogue (bias, activation, store)
//!   on the accumulator tile. For a GPU target the operand blocks go through shared
//!   memory in two stages (`stages = [2]`): each operand has a shared buffer of two
//!   slots; the first slice is copied into slot 0 before the loop, and each iteration
//!   takes two slices, each half copying the next slice into the other slot before
//!   reading its own and running `tile.dot`, then one barrier, so a copy overlaps the
//!   product before it and one barrier per slice orders both (slots alternate without an
//!   index computed at run time; the depth is rounded up to an even number of slices,
//!   those past it masked to zeros).
//!
//! - `serial`: top-level ops outside nests (a full reduction to a scalar and its store)
//!   and nests that share scalars with them run in one program.
//!
//! Sizes come from the target: on a CPU `vector` is four vectors of f32 (64 with
//! AVX-512) and the dot block is the packed kernel's register tile and depth
//! (6 x 32 x 256); on sm_80/sm_90, `vector = 256` and 64 x 64 x 32 blocks, clamped to the
//! nest's extents. Contractions arrive as the structured `loop.matmul` the lowering emits
//! for every product of matrices (f16/bf16 included: `tile.dot` accumulates them in
//! f32); nothing is re-discovered from scalar loops.
//!
//! The parameters are a `ScheduleParams` value (`for_target`, or given by hand:
//! `convert_module_with`, and the pass's `vector`, `dot` and `packed` options), so a
//! search can try others without touching the conversion; the differential tests run
//! odd ones (vectors of 1, 3 and 7, blocks of one element, packing blockings that divide
//! nothing) against the graph interpreter.
//!
//! Every example and language-reference example converts for the host and for sm_90,
//! verifies, round-trips and parses in mlir-opt; the differential tests run the tile
//! interpreter on both schedules of every differential program and 64 generated
//! programs against the graph interpreter, and `dlc run --backend tile [--target T]
//! --check` runs any model on it.

use std::collections::{HashMap, HashSet};

use dlc_core::{DType, TargetDesc};
use dlc_loop::{
    BufferType as LBufferType, Function as LFunction, IndexExpr, KernelGroup, Module as LModule,
    OpId as LOpId, OpKind as L, Type as LType, Value as LValue,
};
use dlc_tile::{Affine, BufferType, Builder, Module, Schedule, Space, Value};

mod dot;
mod fused;
mod grid;
mod packed;
mod vectorize;
mod winograd;
use dlc_core::ir::OpDecl;
use fused::{Fusion, Im2col};
use packed::{PackPlan, Panels, Strips, TileEpilogue};
use winograd::WinogradFusion;

/// Why loop IR could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TileConvError {
    /// IR the loop verifier should have rejected.
    #[error("invalid loop IR in @{0}: {1}")]
    Invalid(String, String),
    /// A tile pass after the conversion failed.
    #[error("{0}")]
    Pass(String),
}

/// The schedule parameters a target gives each kind of nest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleParams {
    /// The target they are for (by default its own numbers below): the tile
    /// passes after the conversion run for it.
    pub target: TargetDesc,
    /// Iterations of an innermost loop one tile holds.
    pub vector: usize,
    /// Tiles of `vector` iterations one program of a sum down columns (a
    /// blocked kernel whose reductions run outside: `out[j] = sum[i](x[i,
    /// j])`) takes side by side. On a CPU 4, a kilobyte of f32 per row: it
    /// reads each row's run of a matrix stored row-major, and a 256-byte
    /// run per row left it waiting on memory (a gated aggregation's column
    /// gradient, 2708 x 2708: 11 ms at one tile, 7 at four, the same at
    /// eight and sixteen); on a GPU 1.
    pub column_strips: usize,
    /// Block of a contraction: rows, columns, depth.
    pub dot: [usize; 3],
    /// Whether contraction operands are staged through shared memory.
    pub stage_shared: bool,
    /// On a CPU, the packed product's parameters (products of f32, f16 or
    /// bf16 operands accumulated in f32).
    pub packed: Option<Packing>,
}

/// The packed product's parameters (BLIS's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packing {
    /// `[mr, nr, mc, kc]`: the register tile, rows packed at once, depth.
    pub blocking: [usize; 4],
    /// Rows of the taller register tile a product takes where its rows pad
    /// about as few (`GemmBlocking::tall_mr`; `mr` where there is no choice).
    pub tall_mr: usize,
    /// `[rows, columns]`: the register tile of a product whose last panel
    /// would be at most half full (`GemmBlocking::half_panel_tile`), and
    /// of one whose few one-panel programs two threads would share
    /// unevenly (`packed.rs`'s `balancing_tile`); `None`: always
    /// `blocking`'s.
    pub half_panel_tile: Option<[usize; 2]>,
    /// The fewest multiply-adds worth packing.
    pub min_macs: usize,
    /// A product is cut into at least this many programs when it has that
    /// many panels (threads are balanced).
    pub units: usize,
    /// The fewest multiply-adds of one program of a product split along
    /// its depth (`packed::Conv::depth_splits`).
    pub split_macs: usize,
    /// Deepest slice of `k` one copy into packed form moves (a vector's
    /// lanes: a transposed copy is then square blocks of vectors).
    pub copy_depth: usize,
    /// `[rows, columns]`: a product of at most `columns` columns, which
    /// `blocking`'s wider tile would pad, is not packed but runs in
    /// programs of `rows` rows (the target's `narrow_mr x narrow_n`); `None`:
    /// every product is packed.
    pub narrow: Option<[usize; 2]>,
    /// A product's programs are made a multiple of this where that takes
    /// at most twice the column chunks (2 for a CPU: 9 row blocks become 18
    /// programs, not 9 of which one of two threads runs 5). The threads are
    /// only known when the code runs, so this is fixed rather than the
    /// compiling machine's cores: schedules do not depend on where they
    /// were made.
    pub balance: usize,
    /// Sets of the L1 data cache (of 64-byte lines). A product of one block
    /// of rows reads its right operand in place, unpacked, when that
    /// operand's rows are a whole number of lines apart and that number is
    /// coprime with the sets (so the rows of a panel fall in every set
    /// rather than a few): the operand is then read once, where packing
    /// reads it, writes the panels and reads those again. 0: never.
    pub l1_sets: usize,
    /// Bytes of a core's L2 cache: a fused Winograd convolution's program
    /// keeps its rows of the transformed input and product within half.
    pub l2_bytes: usize,
    /// The deepest product (of one slice of the depth, its result's rows
    /// apart in memory) whose programs walk each strip across their panels
    /// instead of each panel across their strips (`packed.rs`'s
    /// `program_product`): so shallow a register tile stores about as fast
    /// as it multiplies, and a panel's tile was a line of each of the
    /// block's rows, a store stream per row that the prefetchers do not
    /// follow (MobileNetV2's 16 -> 96 expansion over 112 x 112, its result
    /// 96 streams of 4.8 MB: 38% faster); strip by strip the stores are `mr`
    /// runs along the rows, and the chunk's panels (copied first, within a
    /// quarter of the L2) are read again per strip. 24 on a CPU: a depth of
    /// 32 (32 -> 192 over 28 x 28) was slower. 0: never.
    pub strips_outer_depth: usize,
    /// The deepest product whose epilogue reads an operand along both axes
    /// (a residual: `packed.rs`'s `TileEpilogue::Heavy`) that walks each
    /// strip across its panels (where they fit half the L2) and runs that
    /// epilogue on each register tile, reading the operand and writing the
    /// result along `mr` rows, instead of writing its block of sums and
    /// running the epilogue on it row by row. The panels are then read
    /// from the L2 once per strip, which a deep product pays for: on Zen 3
    /// (AVX2), ResNet-50's 64 -> 256 convolutions with their residual over
    /// 56 x 56 took 15-18% less, 128 -> 512 over 28 x 28 6-8% less, but 256
    /// -> 1024 over 14 x 14 28% more. 128 on a CPU; 0: never.
    pub heavy_outer_depth: usize,
    /// Panels ahead (to the right, the same rows) whose lines a register
    /// tile's epilogue prefetches in its result and in any operand it reads
    /// along both axes (a residual): see `packed.rs`'s `prefetch_ahead`.
    /// On Zen 3 (AVX2, one thread, caches evicted before each call), 2:
    /// ResNet-50's 64 -> 256 convolution with its residual over 56 x 56
    /// (strips walked across panels, the tile two ahead) 1.86-1.91 ->
    /// 1.71-1.77 ms (1, 3 and 6 ahead: 1.83, 1.80, 1.90), its 256 -> 64
    /// over 56 x 56 (panels across strips, the same strip two passes
    /// ahead) 1.71-1.93 -> 1.54-1.73; ResNet-50's layer 1 and 2 1 x 1
    /// convolutions 8-16% less in the model. 0: never.
    pub epilogue_prefetch: usize,
    /// Rows ahead whose lines the epilogue prefetches in a result stored
    /// along its rows (a 1 x 1 convolution's with its pixels as the rows:
    /// each of a tile's `nr` channels a run of pixels, a channel plane
    /// apart, so each store of a row is a line of `nr` planes) and in an
    /// operand read so (its residual): see `packed.rs`'s
    /// `prefetch_rows_ahead`. A line's worth of f32, 16, on a CPU: the
    /// stores of the rows before fetched those lines themselves, one plane
    /// at a time, from memory where the result was cold. Zen 4, one
    /// thread: MobileNetV2's last 320 -> 1280 over 7 x 7 cut out of the
    /// model, with 40 MB written before each call, 0.532-0.599 -> 0.485-0.52
    /// ms (onnxruntime's 0.49-0.57 alongside; 0.38-0.41 both without the
    /// eviction, unchanged); whole models in one process, alternated:
    /// MobileNetV2 7.48 -> 7.43 ms (two threads 4.47 -> 4.41),
    /// EfficientNet-B0 11.60 -> 11.45, ResNet-50 72.6 -> 72.1 (8 rows
    /// ahead measured as 16). 0: never.
    pub result_rows_ahead: usize,
    /// Whether a packed product's register tiles prefetch the weights
    /// their program reads next, packed once when they were bound: strips
    /// of weights (a convolution's kernel, the left operand) one strip
    /// ahead, and panels of weights (`x @ w`, and a convolution over few
    /// pixels whose pixels are the rows) in the first strip's tiles, the
    /// next panel's slice where the program's rows take as long as its
    /// fetch from memory (`packed.rs`'s `tiles_outlast_fetch`), else the
    /// same panel one slice of the depth ahead. Weights larger than the
    /// caches a model's other layers leave them come from memory, in
    /// strips at four bytes a cycle, which the hardware prefetchers did
    /// not keep up with. On Zen 5, one thread: MobileNetV2's 960 -> 160
    /// projections over 7 x 7 0.132 -> 0.085 ms in the model (alone, the
    /// weights in the L2 or L3: 0.08 either way; after a 64 MB stream 0.129
    /// -> 0.087), EfficientNet-B0's 1152 -> 192 0.18 -> 0.12 ms and the
    /// model 6.6 -> 6.2-6.3 ms; five 512 -> 512 3 x 3 convolutions over 7 x
    /// 7 in a row (their panels of 9.4 MB each, from memory) 6.29 -> 5.90
    /// ms, at two threads 3.2 -> 3.0. Strips go to the L1 (the next tile
    /// reads them); panels to the L2 (`prefetcht1`): the next slice's panel
    /// is read only after this slice's strips, which still read this one,
    /// and a `256 x 32` slice of a panel is Zen 4's whole 32 KB L1. On Zen 5
    /// (48 KB) the L2 measured as the L1; on Zen 4, one thread, a chain of
    /// 80 1 x 1 convolutions over 14 x 14 (1024 <-> 256) 81.6 -> 79.9 ms,
    /// of 24 over 7 x 7 (2048 <-> 512) 27.6 -> 25.5, GPT-2's block 18.56 ->
    /// 18.02 (two threads 9.76 -> 9.30), ResNet-50 72.1 -> 71.2.
    pub weight_prefetch: bool,
    /// The deepest slice of a product whose programs read their strips
    /// from the left operand where it lies, contiguous along the rows (a
    /// 1 x 1 convolution's input with its pixels as the rows:
    /// `packed.rs`'s `columns_in_place`), where the blocking takes three
    /// slices or more. Each step of the depth is then a line of the
    /// operand rather than `mr` floats of a packed strip, so the slice is
    /// kept shallow enough for a panel's slice and the operand's lines to
    /// share the L1: 64 on a CPU (Zen 4, one thread, 1152 -> 320 and 960
    /// -> 160 over 7 x 7: 192-240 deep 8-11% slower than packed strips,
    /// 32-64 deep as fast or faster; two threads 30-50% faster either
    /// way). 0: never.
    pub in_place_depth: usize,
    /// The most rows of a product of one block whose right operand its
    /// programs read where it lies rather than each copying its panels,
    /// where that operand's rows are whole lines apart and a slice's rows
    /// take at most twice the ways of the L1 sets they fall in (`l1_ways`):
    /// `packed.rs`'s `few_rows_read_in_place`. A copied panel then serves
    /// so few rows that the copy is a large part of the program. 24 on a
    /// CPU (Zen 4, one thread: MobileNetV2's 32 -> 16 over 112 x 112 cut
    /// out 0.142 -> 0.124 ms; node by node in the model, with up to twice
    /// the ways allowed, its 96 -> 24 and 144 -> 24 over 56 x 56 5-10%
    /// faster, its 192 -> 32 over 28 x 28 (32 rows) 5% slower). 0: never.
    pub in_place_rows: usize,
    /// Ways of each set of the L1 data cache (`CpuDesc::l1_ways`).
    pub l1_ways: usize,
    /// Steps of the depth the register tile's loop takes per iteration
    /// (at most: the largest number up to this that divides `kc`). Two
    /// gave W1 1024 4.5% on one and two threads (the loop's counter and
    /// branch once per 24 multiply-adds instead of 12); four no more.
    pub unroll: usize,
    /// `[mr, nr, mc, kc]` of a product of two bf16 operands that keeps them
    /// bf16 in its strips and panels and steps the depth by pairs (an
    /// `mr x 2` by `2 x nr` `tile.dot`, which the CPU runs as dot products
    /// of bf16 pairs into f32, `vdpbf16ps`); `None`: bf16 is widened to f32
    /// and takes `blocking`. The target's `gemm_blocking(BF16)` where it
    /// multiplies pairs (`CpuDesc::avx512_bf16`).
    pub bf16_pairs: Option<[usize; 4]>,
}

impl ScheduleParams {
    /// Checks parameters given by hand: every tile they make must be a tile
    /// (at most `dlc_tile::ir::MAX_TILE_ELEMENTS` elements).
    pub fn validate(&self) -> Result<(), String> {
        let max = dlc_tile::ir::MAX_TILE_ELEMENTS;
        let [m, n, k] = self.dot;
        let fits =
            |a: usize, b: usize| a >= 1 && b >= 1 && a.checked_mul(b).is_some_and(|x| x <= max);
        if !(1..=max).contains(&self.vector) {
            return Err(format!("vector must be 1 to {max}, got {}", self.vector));
        }
        if !fits(self.vector, self.column_strips) {
            return Err(format!(
                "column_strips must be at least 1 and make tiles of at most {max} elements, got {}",
                self.column_strips
            ));
        }
        if !(fits(m, n) && fits(m, k) && fits(k, n)) {
            return Err(format!(
                "dot blocks {m}x{n}x{k} make tiles of more than {max} elements"
            ));
        }
        let blocks = |[mr, nr, mc, kc]: [usize; 4]| {
            fits(mr, nr) && fits(kc, nr) && fits(mc, nr) && fits(mr, kc) && mc.is_multiple_of(mr)
        };
        if let Some(Packing {
            blocking,
            tall_mr,
            half_panel_tile,
            units,
            copy_depth,
            narrow,
            balance,
            bf16_pairs,
            ..
        }) = self.packed
        {
            if !(units >= 1
                && balance >= 1
                && copy_depth >= 1
                && narrow.is_none_or(|[r, c]| fits(r, c))
                && blocks(blocking)
                && tall_mr >= blocking[0]
                && blocks([tall_mr, blocking[1], blocking[2], blocking[3]]))
            {
                let [mr, nr, mc, kc] = blocking;
                return Err(format!(
                    "packed blocking {mr}x{nr}x{mc}x{kc} (taller tile {tall_mr} rows) is not a valid blocking"
                ));
            }
            if let Some([r, c]) = half_panel_tile
                && !blocks([r, c, blocking[2], blocking[3]])
            {
                return Err(format!(
                    "half-panel register tile {r}x{c} is not a valid tile of the blocking"
                ));
            }
            if let Some(p @ [mr, nr, mc, kc]) = bf16_pairs
                && !(blocks(p) && kc.is_multiple_of(2))
            {
                return Err(format!(
                    "bf16 pair blocking {mr}x{nr}x{mc}x{kc} is not a valid blocking \
                     (and an even depth)"
                ));
            }
        }
        Ok(())
    }

    /// The tile passes run after the conversion, in order: staged
    /// products (a GPU's) need barriers; on a CPU, work on weights alone
    /// moves into the preparer.
    pub fn tile_pipeline(&self) -> &'static str {
        if self.stage_shared {
            dlc_tile::transforms::GPU_PIPELINE
        } else {
            dlc_tile::transforms::CPU_PIPELINE
        }
    }

    /// What `target` takes: on a CPU, four vectors of f32 per tile and the
    /// packed kernel's register tile and depth (`mr x nr`, `kc`); on a GPU,
    /// a tile of one element per thread of a 256-thread block and
    /// 64 x 64 x 32 blocks staged through shared memory.
    pub fn for_target(target: &TargetDesc) -> ScheduleParams {
        let g = target.gemm_blocking(DType::F32);
        let pairs = target.gemm_blocking(DType::BF16);
        match target.gpu() {
            Some(gpu) => ScheduleParams {
                target: target.clone(),
                vector: 256.min(gpu.max_threads_per_block),
                column_strips: 1,
                dot: [g.mr, g.nr, g.kc],
                stage_shared: true,
                packed: None,
            },
            None => ScheduleParams {
                target: target.clone(),
                vector: 4 * target.lanes(DType::F32),
                column_strips: 4,
                dot: [g.mr, g.nr, g.kc],
                stage_shared: false,
                packed: Some(Packing {
                    blocking: [g.mr, g.nr, g.mc, g.kc],
                    tall_mr: g.tall_mr,
                    half_panel_tile: g.half_panel_tile,
                    min_macs: target.min_packed_macs(),
                    units: g.min_units,
                    split_macs: target.min_split_macs(),
                    copy_depth: g.lanes,
                    narrow: (g.nr > g.lanes).then_some([g.narrow_mr, g.narrow_n]),
                    balance: 2,
                    l1_sets: target.cpu().map_or(0, |c| c.l1_sets),
                    l2_bytes: target.cpu().map_or(0, |c| c.l2_bytes),
                    strips_outer_depth: 24,
                    heavy_outer_depth: 128,
                    epilogue_prefetch: 2,
                    result_rows_ahead: 16,
                    weight_prefetch: true,
                    in_place_depth: 64,
                    in_place_rows: 24,
                    l1_ways: target.cpu().map_or(0, |c| c.l1_ways()),
                    unroll: 2,
                    bf16_pairs: pairs
                        .pairs
                        .then_some([pairs.mr, pairs.nr, pairs.mc, pairs.kc]),
                }),
            },
        }
    }
}

/// Converts every function of a verified loop module with the schedule
/// parameters of `target`.
pub fn convert_module(m: &LModule, target: &TargetDesc) -> Result<Module, TileConvError> {
    convert_module_with(m, &ScheduleParams::for_target(target))
}

/// Converts every function of a verified loop module with the given
/// schedule parameters (a target's, or a search's), then runs the tile
/// passes the target runs after the conversion
/// ([`ScheduleParams::tile_pipeline`]).
pub fn convert_module_with(m: &LModule, params: &ScheduleParams) -> Result<Module, TileConvError> {
    let mut tiled = schedule_module(m, params)?;
    let pipeline = dlc_core::Pipeline::parse(params.tile_pipeline())
        .map_err(|e| TileConvError::Pass(e.to_string()))?;
    let passes = dlc_tile::transforms::registry_for(&params.target)
        .build(&pipeline)
        .map_err(|e| TileConvError::Pass(e.to_string()))?;
    for mut pass in passes {
        pass.run(&mut tiled)
            .map_err(|e| TileConvError::Pass(e.to_string()))?;
    }
    Ok(tiled)
}

/// The conversion alone (`convert-loop-to-tile`): each nest of each
/// function scheduled as kernels, no tile pass run after.
pub fn schedule_module(m: &LModule, params: &ScheduleParams) -> Result<Module, TileConvError> {
    let functions = m
        .functions
        .iter()
        .map(|f| Conv::new(f, params).function())
        .collect::<Result<_, _>>()?;
    Ok(Module { functions })
}

fn tile_buffer(t: &LBufferType) -> BufferType {
    BufferType {
        layout: t.clone(),
        space: Space::Global,
    }
}

fn loop_bounds(kind: &L) -> Option<(i64, i64, i64)> {
    match *kind {
        L::For { lo, hi, step } => Some((lo, hi, step)),
        L::Parallel { lo, hi } => Some((lo, hi, 1)),
        _ => None,
    }
}

fn is_parallel(kind: &L) -> bool {
    matches!(kind, L::Parallel { .. })
}

/// A buffer of the loop function held, inside a fused kernel, by a scratch
/// buffer of the program: the scratch buffer, and for each of its axes the
/// buffer's axis it takes and the first index along it (the buffer's other
/// axes are the program's: indexed by the batch).
#[derive(Clone, Debug)]
struct Redirect {
    scratch: Value,
    axes: Vec<(usize, Affine)>,
}

struct Conv<'a> {
    src: &'a LFunction,
    params: &'a ScheduleParams,
    b: Builder,
    /// Buffers: parameters, allocations, views.
    buffers: HashMap<LValue, Value>,
    /// Loop counters: as affine expressions of tile indices and coordinates.
    index: HashMap<LValue, Affine>,
    /// Scalars and tiles.
    values: HashMap<LValue, Value>,
    /// The shape of the tiles of the region being converted (empty: scalar
    /// code) and its mask.
    shape: Vec<usize>,
    mask: Option<Value>,
    /// Scalars splatted to `shape` in the current region.
    splats: HashMap<LValue, Value>,
    /// Top-level ops defining constants (re-created where used).
    consts: HashMap<LValue, (f64, DType)>,
    /// Each view's source buffer (views alias their source's storage).
    view_of: HashMap<LValue, LValue>,
    /// Buffers held by a program's scratch memory in a fused kernel.
    redirects: HashMap<LValue, Redirect>,
    /// Products whose right operand, an im2col buffer, their programs copy
    /// from the convolution's input.
    convs: HashMap<LOpId, Im2col>,
    /// Buffers (roots) whose elements depend on weights alone: weight
    /// parameters, and buffers written only by top-level nests that read
    /// only such buffers (see [`Conv::find_weight_derived`]).
    weight_derived: HashSet<LValue>,
    /// While a packed product's programs are emitted: where they read the
    /// left operand's strips.
    strips: Strips,
    /// While a fused kernel's second product is emitted: the scratch
    /// `[mc]` buffer of factors its result rows are scaled by (the rows
    /// of P it read were left unscaled).
    row_factors: Option<Value>,
    /// Loops a program runs over part of their range: from the offset,
    /// this many iterations (a Winograd output transform's channels, in
    /// the program's chunk of them).
    ranges: HashMap<LOpId, (Affine, i64)>,
    /// For each buffer, the top-level ops other than its allocation and
    /// deallocation that use it (a view counts: it is one).
    users: HashMap<LValue, Vec<LOpId>>,
    /// Allocations a kernel holds in each program's scratch memory instead
    /// (`Conv::private_buffers`): their global allocation and deallocation
    /// are removed once the function is converted.
    privatized: HashSet<Value>,
}

impl<'a> Conv<'a> {
    fn new(src: &'a LFunction, params: &'a ScheduleParams) -> Self {
        let mut c = Conv {
            src,
            params,
            b: Builder::new(src.name.clone()),
            buffers: HashMap::new(),
            index: HashMap::new(),
            values: HashMap::new(),
            shape: vec![],
            mask: None,
            splats: HashMap::new(),
            consts: HashMap::new(),
            view_of: src
                .ops
                .iter()
                .filter(|o| matches!(o.kind, L::View))
                .filter_map(|o| Some((*o.results.first()?, *o.operands.first()?)))
                .collect(),
            redirects: HashMap::new(),
            convs: HashMap::new(),
            weight_derived: HashSet::new(),
            strips: Strips::Own,
            row_factors: None,
            ranges: HashMap::new(),
            users: HashMap::new(),
            privatized: HashSet::new(),
        };
        c.weight_derived = c.find_weight_derived();
        c
    }

    /// Roots of the buffers the ops `ops` (and ops nested in them) load
    /// from (`reads`) and store to (`writes`); a product reads its two
    /// operands.
    fn accessed_roots(
        &self,
        ops: &[LOpId],
        reads: &mut HashSet<LValue>,
        writes: &mut HashSet<LValue>,
    ) {
        for &id in ops {
            let op = self.op(id);
            match &op.kind {
                L::Load { .. } => reads.extend(op.operands.first().map(|&b| self.root_buffer(b))),
                L::Store { .. } => writes.extend(op.operands.get(1).map(|&b| self.root_buffer(b))),
                L::Matmul(_) => {
                    reads.extend(op.operands.iter().take(2).map(|&b| self.root_buffer(b)))
                }
                _ => {}
            }
            for r in &op.regions {
                self.accessed_roots(&r.ops, reads, writes);
            }
        }
    }

    /// The buffers (roots) whose elements depend on weights alone: the
    /// weight parameters nothing writes, and every allocation all of whose
    /// writers are top-level nests that read only such buffers (found to a
    /// fixed point, so chains of them count). Products by them pack their
    /// panels with a kernel of their own, which the preparer runs once.
    fn find_weight_derived(&self) -> HashSet<LValue> {
        let f = self.src;
        if f.weights.is_empty() {
            return HashSet::new();
        }
        let top = &f.body.ops;
        let access: Vec<(HashSet<LValue>, HashSet<LValue>)> = top
            .iter()
            .map(|&id| {
                let (mut r, mut w) = (HashSet::new(), HashSet::new());
                self.accessed_roots(&[id], &mut r, &mut w);
                (r, w)
            })
            .collect();
        let written: HashSet<LValue> = access.iter().flat_map(|a| a.1.iter().copied()).collect();
        let mut derived: HashSet<LValue> = f
            .params
            .iter()
            .enumerate()
            .filter(|(i, (_, v))| f.weights.contains(i) && !written.contains(v))
            .map(|(_, (_, v))| *v)
            .collect();
        let allocated: HashSet<LValue> = top
            .iter()
            .filter(|&&id| matches!(f.op(id).kind, L::Alloc))
            .filter_map(|&id| f.op(id).results.first().copied())
            .collect();
        loop {
            let grown: Vec<LValue> = allocated
                .iter()
                .filter(|b| !derived.contains(b))
                .filter(|b| {
                    let mut writers = access.iter().filter(|a| a.1.contains(b)).peekable();
                    writers.peek().is_some()
                        && writers.all(|(r, _)| r.iter().all(|v| derived.contains(v) || v == *b))
                })
                .copied()
                .collect();
            if grown.is_empty() {
                return derived;
            }
            derived.extend(grown);
        }
    }

    /// The buffer a view ultimately aliases.
    fn root_buffer(&self, mut v: LValue) -> LValue {
        while let Some(&source) = self.view_of.get(&v) {
            v = source;
        }
        v
    }

    fn invalid(&self, what: impl Into<String>) -> TileConvError {
        TileConvError::Invalid(self.src.name.clone(), what.into())
    }

    fn op(&self, id: LOpId) -> &'a dlc_loop::OpData {
        let src: &'a LFunction = self.src;
        src.op(id)
    }

    /// Product `m` and its sizes and indices.
    fn contraction(
        &self,
        m: LOpId,
    ) -> Result<(&'a dlc_loop::OpData, &'a dlc_loop::Contraction), TileConvError> {
        let op = self.op(m);
        match &op.kind {
            L::Matmul(c) => Ok((op, c)),
            _ => Err(self.invalid("not a contraction")),
        }
    }

    fn function(mut self) -> Result<dlc_tile::Function, TileConvError> {
        let n = self.src.params.len();
        for (i, (name, v)) in self.src.params.iter().enumerate() {
            let LType::Buffer(t) = self.src.ty(*v) else {
                return Err(self.invalid(format!("parameter %{name} is not a buffer")));
            };
            let tv = self
                .b
                .param(name.clone(), tile_buffer(t), i + self.src.outputs >= n);
            self.buffers.insert(*v, tv);
        }
        self.b.set_weights(self.src.weights.clone());
        let top: Vec<LOpId> = self.src.body.ops.clone();
        for &id in &top {
            if matches!(self.op(id).kind, L::Alloc | L::Dealloc) {
                continue;
            }
            let mut used = vec![];
            collect_uses(self.src, id, &mut used);
            for v in used {
                let users = self.users.entry(v).or_default();
                if users.last() != Some(&id) {
                    users.push(id);
                }
            }
        }
        for &id in &top {
            if let L::Const(c) = self.op(id).kind {
                let d = match self.src.ty(self.op(id).results[0]) {
                    LType::Scalar(d) => *d,
                    _ => DType::F32,
                };
                self.consts.insert(self.op(id).results[0], (c, d));
            }
        }
        let cuts = self.cut_points(&top);
        // Nests fused into one kernel over blocks of rows, at the first
        // nest's index with the last one's; the top-level ops the fused
        // kernels and implicit im2col buffers replace; and the buffers no
        // kernel needs any more, never allocated.
        let mut fusions: HashMap<usize, (Fusion, usize)> = HashMap::new();
        let mut skipped: HashSet<usize> = HashSet::new();
        let mut elided: HashSet<LValue> = HashSet::new();
        if self.params.packed.is_some() {
            // The kernel groups the lowering delimits, each `(group, begin,
            // end)` at its bounds' positions: attention runs as one kernel
            // over blocks of rows when its nests fit the fused schedule
            // (`row_fusion` reads them), a Winograd convolution's transforms
            // and products likewise (`winograd_fusion`), and an im2col
            // convolution's product copies its panels from the input when
            // it can (`implicit_im2col`); each runs as its nests otherwise.
            // Nothing outside a group is fused.
            let mut groups: Vec<(KernelGroup, usize, usize)> = Vec::new();
            let mut open = None;
            for (at, &id) in top.iter().enumerate() {
                match self.op(id).kind {
                    L::KernelBegin(g) => open = Some((g, at)),
                    L::KernelEnd => {
                        if let Some((g, begin)) = open.take() {
                            groups.push((g, begin, at));
                        }
                    }
                    _ => {}
                }
            }
            for &(group, begin, end) in &groups {
                match group {
                    KernelGroup::Attention => {
                        let Some(i) = self.next_nest(&top, begin) else {
                            continue;
                        };
                        if let Some((f, last)) = self.row_fusion(&top, i, &cuts)
                            && last < end
                        {
                            skipped.extend(i + 1..=last);
                            elided.extend(f.elided.iter().copied());
                            fusions.insert(i, (Fusion::Rows(f), last));
                        }
                    }
                    KernelGroup::Winograd => {
                        for i in begin + 1..end {
                            if let Some((f, last)) = self.winograd_fusion(&top, i, &cuts)
                                && last < end
                            {
                                skipped.extend(i + 1..=last);
                                elided.extend(f.held);
                                fusions.insert(i, (Fusion::Winograd(f), last));
                                break;
                            }
                        }
                    }
                    KernelGroup::Im2col(window) => {
                        // The copy nest, then the product's.
                        for i in begin + 1..end {
                            if let Some((conv, k)) = self.implicit_im2col(&top, i, &cuts, &window)
                                && k < end
                            {
                                let [m] = self.op(top[k]).regions[0].ops[..] else {
                                    continue;
                                };
                                skipped.insert(i);
                                elided.insert(conv.col);
                                // The product's view of it, per group.
                                let read = self.op(m).operands[1];
                                skipped.extend((i + 1..k).filter(|&j| {
                                    let v = self.op(top[j]);
                                    matches!(v.kind, L::View) && v.results == [read]
                                }));
                                self.convs.insert(m, conv);
                                break;
                            }
                        }
                    }
                }
            }
        }
        let mut serial: Vec<LOpId> = vec![];
        let mut deferred: Vec<LOpId> = vec![];
        for (i, &id) in top.iter().enumerate() {
            let op = self.op(id);
            let elided_buffer = match op.kind {
                L::Alloc => op.results.first().is_some_and(|r| elided.contains(r)),
                L::Dealloc => op.operands.first().is_some_and(|v| elided.contains(v)),
                _ => false,
            };
            if elided_buffer || skipped.contains(&i) {
                continue;
            }
            if let Some((f, last)) = fusions.get(&i) {
                self.flush(&mut serial, &mut deferred)?;
                for &inside in &top[i + 1..=*last] {
                    let a = self.op(inside);
                    if matches!(a.kind, L::Alloc | L::View)
                        && !a.results.iter().any(|r| elided.contains(r))
                    {
                        self.host_op(inside)?;
                    }
                }
                self.b.set_loc(op.loc.clone());
                match f {
                    Fusion::Rows(f) => self.fused_rows_kernel(f)?,
                    Fusion::Winograd(f) => self.fused_winograd_kernel(f)?,
                }
                for d in std::mem::take(&mut deferred) {
                    self.host_op(d)?;
                }
                continue;
            }
            match &op.kind {
                L::Return | L::KernelBegin(_) | L::KernelEnd => {}
                L::Alloc | L::Global(_) | L::View => self.host_op(id)?,
                L::Dealloc => deferred.push(id),
                L::Const(_) => {}
                kind if (is_parallel(kind) || matches!(kind, L::Matmul(_)))
                    && cuts[i]
                    && cuts[i + 1] =>
                {
                    self.flush(&mut serial, &mut deferred)?;
                    self.b.set_loc(op.loc.clone());
                    self.parallel_kernel(id)?;
                    for d in std::mem::take(&mut deferred) {
                        self.host_op(d)?;
                    }
                }
                _ => serial.push(id),
            }
        }
        self.flush(&mut serial, &mut deferred)?;
        let mut f = self.b.finish();
        let privatized = std::mem::take(&mut self.privatized);
        f.body.ops.retain(|&o| {
            let op = &f.ops[o.0 as usize];
            let buffer = match op.kind {
                dlc_tile::OpKind::Alloc => op.results.first(),
                dlc_tile::OpKind::Dealloc => op.operands.first(),
                _ => None,
            };
            buffer.is_none_or(|b| !privatized.contains(b))
        });
        dlc_tile::transforms::dce(&mut f);
        Ok(f)
    }

    /// `cuts[i]`: whether no scalar defined by a top-level op before `i`
    /// (constants aside, which are re-created where used) is used at or
    /// after `i`, so a kernel may start there.
    fn cut_points(&self, top: &[LOpId]) -> Vec<bool> {
        let mut last_use: HashMap<LValue, usize> = HashMap::new();
        for (i, &id) in top.iter().enumerate() {
            let mut used = vec![];
            collect_uses(self.src, id, &mut used);
            for v in used {
                last_use.insert(v, i);
            }
        }
        let mut cuts = vec![true; top.len() + 1];
        for (i, &id) in top.iter().enumerate() {
            let op = self.op(id);
            if matches!(op.kind, L::Const(_)) {
                continue;
            }
            for r in &op.results {
                if matches!(self.src.ty(*r), LType::Buffer(_)) {
                    continue;
                }
                if let Some(&last) = last_use.get(r) {
                    for c in cuts.iter_mut().take(last + 1).skip(i + 1) {
                        *c = false;
                    }
                }
            }
        }
        cuts
    }

    fn host_op(&mut self, id: LOpId) -> Result<(), TileConvError> {
        let op = self.op(id);
        // An allocation's failure names the op it holds the result of.
        self.b.set_loc(op.loc.clone());
        match &op.kind {
            L::Alloc => {
                let LType::Buffer(t) = self.src.ty(op.results[0]) else {
                    return Err(self.invalid("alloc of a non-buffer"));
                };
                let v = self.b.alloc(tile_buffer(t));
                self.buffers.insert(op.results[0], v);
            }
            L::Global(values) => {
                let LType::Buffer(t) = self.src.ty(op.results[0]) else {
                    return Err(self.invalid("global of a non-buffer"));
                };
                let v = self.b.global(values.clone(), tile_buffer(t));
                self.buffers.insert(op.results[0], v);
            }
            L::View => {
                let LType::Buffer(t) = self.src.ty(op.results[0]) else {
                    return Err(self.invalid("view of a non-buffer"));
                };
                let from = self.buffer(op.operands[0])?;
                let v = self.b.view(from, tile_buffer(t));
                self.buffers.insert(op.results[0], v);
            }
            L::Dealloc => {
                let b = self.buffer(op.operands[0])?;
                self.b.dealloc(b);
            }
            _ => return Err(self.invalid(format!("{} at the host level", op.kind.name()))),
        }
        Ok(())
    }

    /// Emits the pending top-level ops as one program, then the deferred
    /// deallocations.
    fn flush(
        &mut self,
        serial: &mut Vec<LOpId>,
        deferred: &mut Vec<LOpId>,
    ) -> Result<(), TileConvError> {
        if !serial.is_empty() {
            let ops = std::mem::take(serial);
            let loc = self.op(ops[0]).loc.clone();
            self.b.set_loc(loc);
            let schedule = Schedule::Serial {
                vector: self.params.vector,
            };
            self.b.begin_kernel(vec![1], schedule);
            self.values.clear();
            self.ops(&ops)?;
            self.b.end_kernel();
        }
        for d in std::mem::take(deferred) {
            self.host_op(d)?;
        }
        Ok(())
    }

    /// The tile buffer and index of an access to loop buffer `v` at
    /// `index`: the buffer's own, or its program's scratch buffer in a fused
    /// kernel.
    fn place(&self, v: LValue, index: Vec<Affine>) -> Result<(Value, Vec<Affine>), TileConvError> {
        match self.redirects.get(&v) {
            None => Ok((self.buffer(v)?, index)),
            Some(r) => {
                let at = r
                    .axes
                    .iter()
                    .map(|(axis, first)| {
                        index
                            .get(*axis)
                            .map(|e| e.plus_scaled(-1, first))
                            .ok_or_else(|| self.invalid("a fused buffer indexed on too few axes"))
                    })
                    .collect::<Result<_, _>>()?;
                Ok((r.scratch, at))
            }
        }
    }

    fn buffer(&self, v: LValue) -> Result<Value, TileConvError> {
        self.buffers
            .get(&v)
            .copied()
            .ok_or_else(|| self.invalid(format!("buffer value {} is not defined", v.0)))
    }

    /// The next top-level nest after `top[at]`, past allocations, views and
    /// constants.
    fn next_nest(&self, top: &[LOpId], at: usize) -> Option<usize> {
        (at + 1..top.len())
            .find(|&k| !matches!(self.op(top[k]).kind, L::Alloc | L::View | L::Const(_)))
    }

    /// Every op nested in `id`'s regions.
    fn nested_ops(&self, id: LOpId, out: &mut HashSet<LOpId>) {
        for r in &self.op(id).regions {
            for &o in &r.ops {
                out.insert(o);
                self.nested_ops(o, out);
            }
        }
    }

    /// A batch loop's counter, first value and trip count.
    fn batch_loop(&self, l: Option<LOpId>) -> Option<(LValue, i64, usize)> {
        l.map(|l| {
            let op = self.op(l);
            let (lo, hi, _) = loop_bounds(&op.kind).unwrap_or((0, 1, 1));
            (op.regions[0].args[0], lo, (hi - lo).max(1) as usize)
        })
    }

    /// The program ids of a kernel whose first axes are the batch loops
    /// `loops`, one axis each, mapped to their counters.
    fn batch_axes(&mut self, loops: &[(LValue, i64, usize)]) -> Vec<Affine> {
        loops
            .iter()
            .enumerate()
            .map(|(axis, &(counter, lo, _))| {
                let p = self.b.program_id(axis);
                self.index.insert(
                    counter,
                    Affine::value(p).plus_scaled(1, &Affine::constant(lo)),
                );
                Affine::value(p)
            })
            .collect()
    }

    /// The batch's program id (the kernel's first axis, when there is a
    /// batch), mapped to the counter of each batch loop given (loops over
    /// the same batch in nests fused into one kernel).
    fn batch_ids(&mut self, loops: &[Option<(LValue, i64, usize)>]) -> Vec<Affine> {
        let mut id = None;
        for &(counter, lo, _) in loops.iter().flatten() {
            let p = *id.get_or_insert_with(|| self.b.program_id(0));
            self.index.insert(
                counter,
                Affine::value(p).plus_scaled(1, &Affine::constant(lo)),
            );
        }
        id.map(Affine::value).into_iter().collect()
    }

    /// `index` (into a product's operand) with two of the product's
    /// counters at the given places.
    fn index_at(
        &mut self,
        index: &[IndexExpr],
        at: [(LValue, Affine); 2],
    ) -> Result<Vec<Affine>, TileConvError> {
        for (v, e) in at {
            self.index.insert(v, e);
        }
        index.iter().map(|e| self.affine(e)).collect()
    }

    /// Whether `index` into buffer `buf` moves by one element when `var`
    /// steps by one (the operand is contiguous along `var`).
    fn unit_stride(&self, buf: LValue, index: &[IndexExpr], var: LValue) -> bool {
        self.step(buf, index, var) == Some(1)
    }

    /// How many elements `index` into buffer `buf` moves when `var` steps
    /// by one.
    fn step(&self, buf: LValue, index: &[IndexExpr], var: LValue) -> Option<i64> {
        let LType::Buffer(view) = self.src.ty(buf) else {
            return None;
        };
        Some(
            index
                .iter()
                .zip(&view.strides)
                .map(|(e, &s)| s as i64 * e.coefficient(var))
                .sum(),
        )
    }
}

/// Whether an access at `index` moves with counter `v`.
fn moves_with(index: &[IndexExpr], v: LValue) -> bool {
    index.iter().any(|e| e.coefficient(v) != 0)
}

/// Whether `e` is exactly the counter `v`.
fn is_counter(e: &IndexExpr, v: LValue) -> bool {
    e.constant == 0 && e.terms == [(1, v)]
}

/// The greatest common divisor.
fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Every value op `id` and its nested ops read (operands and index values).
fn collect_uses(f: &LFunction, id: LOpId, out: &mut Vec<LValue>) {
    let op = f.op(id);
    out.extend(&op.operands);
    let index: &[IndexExpr] = match &op.kind {
        L::Load { index, .. } | L::Store { index } => index,
        _ => &[],
    };
    for e in index {
        out.extend(e.terms.iter().map(|t| t.1));
    }
    if let L::Matmul(c) = &op.kind {
        for e in c.a.iter().chain(&c.b) {
            out.extend(e.terms.iter().map(|t| t.1));
        }
    }
    for r in &op.regions {
        for &o in &r.ops {
            collect_uses(f, o, out);
        }
    }
}
