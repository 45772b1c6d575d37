//! The packed product (BLIS in tile IR): the plan of blocks, the kernels
//! packing either operand into panels or strips, the register tile over
//! them, and the epilogue on each program's block of sums.
//!
//! # The schedule
//!
//! - `packed` (CPU targets, a product the target packs, at the top level or inside
//!   one or two parallel batch loops, of f32 operands or f16/bf16 ones accumulated in
//!   f32: those are widened as they are copied into the f32 panels and strips, so the
//!   register tile is f32's and the operands are never read in place; except two bf16
//!   operands over an even depth where the target multiplies bf16 pairs
//!   (`TargetDesc::gemm_blocking(BF16)`'s `pairs`, from `CpuDesc::avx512_bf16` ->
//!   `Packing::bf16_pairs`, that blocking -> `PackPlan::pairs`): they stay bf16 with a
//!   blocking of their own (8-row tiles, `kc` 512), the strips are rows `[mr, kc]`
//!   instead of transposed columns, the panels `[kc / 2, nr, 2]` (each pair of the
//!   depth interleaved column by column, as the pair instruction reads it), and the
//!   depth loop steps by pairs, an `mr x 2 . 2 x nr` dot): BLIS written in
//!   tile IR. A `pack` kernel (grid over the batch and
//!   the panels) copies the right operand once into a global `[batch, K/kc, N/nr, kc,
//!   nr]` buffer of panels, zero past its edges; the panels' batch axes are only the
//!   batch loops the operand's index reads (`x[b] @ w` packs `w` once, not per batch).
//!   With two batch loops (`[B, H, M, N]` scores: graph -> loop makes both parallel)
//!   each is a grid axis, the rows the third, and a program takes every panel of its
//!   rows (no column chunks; the pack kernel loops over the panels). Each program of the second kernel
//!   takes `mc` rows and a chunk of panels: the columns are split into chunks when the
//!   product has fewer row blocks (times batches) than the target's `min_units`, so a
//!   product of few rows (GRU's 64-row steps, a convolution's 64 output channels) still
//!   keeps every thread busy, and cut in two when that makes the programs even (fixed at
//!   two, the threads being known only at run time). A product that is still one
//!   program (one block of rows, one panel: a weight gradient's `32 x 32` over a depth
//!   of 8192) is split along its depth (`depth_splits`, split-K): as many programs as
//!   divide its `kc` slices evenly, up to the target's units, each of at least
//!   `Packing::split_macs` multiply-adds, each summing its share of the slices into its
//!   block and copying it to a global `[split, block, chunk, mc, columns]` buffer; a
//!   second kernel adds the shares in split order (the result does not depend on the
//!   threads) and runs the epilogue. A program zeroes a scratch `mc x chunk` block (when the depth takes more than one
//!   `kc` slice; with one, each register tile starts from zero in registers and is stored
//!   once), and for
//!   each `kc`-deep slice packs its rows of the left operand into transposed `mr`-row
//!   strips of scratch memory (`%strips[s, #1, #0]`; when the operand is the same for
//!   every batch and there are more than two chunks per block of rows, or it is a weight
//!   (a convolution's kernel), a kernel packs every block's strips once, before, into a
//!   global buffer the programs read instead, and the preparer runs that kernel once per
//!   binding of the weights), then for every panel of its chunk
//!   and every strip runs the register tile: a `tile.for` of `kc` steps, each an `mr x
//!   1` by `1 x nr` `tile.dot` (the broadcast-FMA outer product of the micro-kernel)
//!   carrying the `mr x nr` accumulator (where one block holds every row, the last
//!   strip's tile has only the rows left, `PackPlan::last_rows`: 49 pixels are 12
//!   strips of 4 and a tile of one row on AVX2, not 52 rows multiplied; such a tile
//!   sums alternate steps of the depth into `mr / rows` accumulators, added after,
//!   as many chains of multiply-adds as a whole tile's, where its one or two chains
//!   waited on their own latency); finally the epilogue runs on the block one
//!   row of a panel (`1 x nr`) at a time, masked at the ragged edges, so its code (a
//!   GELU's polynomial, say) is written for two vectors rather than the register
//!   tile's twelve, and it walks the block row by row (row `r` of every panel, then row
//!   `r + 1`), so the block is read and the result written along their rows; where the
//!   result is stored along the rows (the pixels as rows) and the tile has at most
//!   `MAX_TILE_EPILOGUE_ROWS` (AVX2's 4, Zen 4's 6, a last strip's 7), on `mr x nr` tiles, so that its
//!   store is runs of rows transposed in registers rather than a scatter per row. With one
//!   slice of the depth (and no split), each register tile is final when its loop
//!   ends: it is stored to an `mr x nr` scratch block and the epilogue runs on its rows
//!   right away, while they are in L1, instead of on the whole block after (a 1 x 1
//!   convolution's `96 x 1568` block of sums, 600 KB, was written and read back: half
//!   of the product's time). Such a product of a shallow depth (at most
//!   `Packing::strips_outer_depth`) whose result's rows are apart in memory walks each
//!   strip across the chunk's panels instead (copied first, when the program copies
//!   them): its stores are then `mr` runs along the rows, not a line of each of the
//!   block's rows per panel, as many store streams as rows. So does one whose epilogue
//!   reads an operand along both axes (a residual, a weight's update:
//!   `TileEpilogue::Heavy`), up to `Packing::heavy_outer_depth` and where the chunk's
//!   panels fit half the L2, running that epilogue on each register tile (the operand
//!   read along `mr` rows); a deeper one writes its block of sums and runs the
//!   epilogue on it row by row after the product. The epilogue of a register tile
//!   prefetches the lines of its rows `Packing::epilogue_prefetch` panels to the right
//!   in its result and residual (`prefetch_ahead`: a tile's result is a line of each of
//!   `mr` rows a row apart, which no hardware prefetcher follows). Any epilogue of a
//!   result stored along its rows (the pixels as rows: a row of a tile is a line of
//!   each of `nr` channel planes) prefetches those planes' lines
//!   `Packing::result_rows_ahead` rows further, in the result and a residual read so
//!   (`prefetch_rows_ahead`).
//!   Every copy into packed form moves a tile of at most one vector's lanes of `k`
//!   (16 with AVX-512) in a `tile.for`, read along the operand's
//!   contiguous axis: a transposed weight (`x @ transpose(w)`, as linear layers store
//!   it) is read as `nr x 16` rows and transposed in registers by the store, not
//!   gathered. Blocks fit the product: `kc` divides the depth evenly (576 is three
//!   slices of 192, not 256 + 256 + 64 padded to 256), `mc` is the multiple of `mr`
//!   between half and all of the blocking's that pads the rows least (1024 rows: 9
//!   blocks of 114, 1026 rows computed, not 8 of 144, 1152). The interpreter runs the
//!   packing, so a packing bug shows as NaN (unwritten scratch) or a wrong result in
//!   the differential tests. The batch, when there is one, is the first grid axis of
//!   both kernels. A function that multiplies by one operand several times packs it once
//!   per call (the pass `tile.reuse-packs`, run after the conversion): a later
//!   `pack` kernel whose text, read buffers and their layouts are an earlier one's, and
//!   whose source nothing in the function writes, goes; its products read the first
//!   panel buffer, which is released after the last of them. W7's 32 steps packed each
//!   of their two weight matrices on every step (64 copies of 1.5 and 3 MB per call);
//!   they now pack each once.
//!   A product of one block of rows has no pack kernel: each program copies the `kc x
//!   nr` slice of the panel it is about to multiply into scratch memory (the same copy,
//!   zeros past the edges) and runs its strips over it, since each panel serves one
//!   program and global panels would be written and read back for nothing. When
//!   another product also reads its right operand, it reads that operand in place
//!   instead (`Packing::l1_sets`), if the operand is contiguous along the columns and its
//!   rows are a number of 64-byte lines apart coprime with the L1's sets (64 on x86-64,
//!   `CpuDesc::l1_sets`: the rows of a `kc` slice then fall in every set), and otherwise
//!   keeps the pack kernel, which
//!   `reuse_packs` makes one (W7). A program copying its own panels from an operand
//!   contiguous along the columns only and larger than the L2 (a 1 x 1 convolution's
//!   input, a slice a line from each of `kc` channel planes: more streams than the
//!   hardware prefetchers follow) prefetches, with each copy, the same rows of the next
//!   panel (`tile.prefetch`, `Conv::prefetches_panels`). Per-program panel copies beat reading in place where
//!   both apply (an in-place panel is reread from scattered pages by every strip; a copied
//!   one is contiguous). Tried and not kept, each within noise (figures in
//!   docs/performance.md): software
//!   prefetch of the next panel (a `tile.prefetch` op into L2 or L1, for packed, in-place
//!   and per-program panels), transparent huge pages for the workspace, a pack kernel
//!   walking 16-row runs along the operand's rows, unmasked epilogues where blocks are
//!   exact, the epilogue run per panel while it is in L1 over several slices of the
//!   depth, the left operand's strips
//!   packed once per block for all column chunks, a program copying the slices of all its
//!   chunk's panels at once, masks and padded loads' bounds compared in 32-bit lanes after
//!   clamping, 8-row register tiles where they pad fewer rows than 6-row ones, and the
//!   fused attention's first product accumulating in its scratch scores.

use dlc_core::DType;
use dlc_core::scalar::BinaryOp;
use dlc_core::target::{half_panel_pads_less, takes_taller_tile};
use dlc_loop::{
    Block as LBlock, IndexExpr, OpId as LOpId, OpKind as L, Type as LType, Value as LValue,
};
use dlc_tile::{Affine, BufferType, PackedOperand, Schedule, Space, TileType, Type, Value};

use super::{Conv, Packing, TileConvError, gcd, moves_with};

/// Where a packed product's epilogue runs (`program_product`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TileEpilogue {
    /// On the block of sums after the product (or not in the product's
    /// programs at all: a product split along its depth, whose shares a
    /// kernel of its own adds).
    Block,
    /// On each register tile as it is summed, wherever one slice of the
    /// depth makes it final: it reads only scalars and values per row or
    /// per column (a bias, a clip's bounds).
    Light,
    /// It reads an operand that varies along both the rows and the
    /// columns (a weight's update, a residual): on each register tile only
    /// where the programs walk each strip across their panels (then the
    /// operand is read along `mr` rows); else on the block of sums row by
    /// row after the product, streaming the operand along its rows (read
    /// tile by tile, panel by panel, it made W2's training step 5% slower).
    Heavy,
}

impl TileEpilogue {
    /// [`TileEpilogue::Light`] for a light epilogue, else
    /// [`TileEpilogue::Block`] (the schedules that do not walk a heavy
    /// epilogue's strips: a fused attention's, a Winograd convolution's).
    pub(super) fn light_or_block(light: bool) -> TileEpilogue {
        if light {
            TileEpilogue::Light
        } else {
            TileEpilogue::Block
        }
    }
}

/// The blocks of a packed product (see [`Conv::pack_plan`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct PackPlan {
    pub(super) mr: usize,
    pub(super) nr: usize,
    pub(super) mc: usize,
    pub(super) kc: usize,
    /// Depth of one copied tile.
    pub(super) kk: usize,
    /// Slices of the depth, and panels of the columns.
    pub(super) kb_n: usize,
    /// `mr`-row strips of a block of rows.
    pub(super) strips: usize,
    /// The rows of the last strip's register tile: `mr`, or, where one
    /// block holds every row, those left past the whole strips (a 7 x 7
    /// image's 49 pixels are 12 strips of 4 and a tile of one row, not 13
    /// tiles of 4: 52 rows multiplied).
    pub(super) last_rows: usize,
    pub(super) blocks: usize,
    pub(super) chunks: usize,
    pub(super) per_chunk: usize,
    /// Panels of the packed operand (whole chunks).
    pub(super) nb_n: usize,
    pub(super) ragged: bool,
    pub(super) unroll: usize,
    /// Programs along the depth (split-K), each over `kb_n / splits`
    /// slices: 1 but for a product of one program (see
    /// [`Conv::depth_splits`]).
    pub(super) splits: usize,
    pub(super) l1_sets: usize,
    /// bf16 operands kept bf16 and multiplied in pairs along the depth
    /// (`Packing::bf16_pairs`): strips `[.., mr, kc]` (rows, not
    /// transposed: a row's pair is one word) and panels `[.., kc / 2, nr,
    /// 2]` (each pair of the depth interleaved, column by column, as the
    /// pair instruction reads it: no shuffle in the register tile), an
    /// `mr x 2` by `2 x nr` dot per step. `kc`, `kk` and the product's depth
    /// are even; `unroll` counts pairs.
    pub(super) pairs: bool,
}

impl PackPlan {
    /// The element type of the strips and panels: the operands' own for a
    /// product in pairs, else f32 (narrow operands widened on the way).
    pub(super) fn packed_dtype(&self) -> DType {
        if self.pairs { DType::BF16 } else { DType::F32 }
    }

    /// The depth one step of the register tile takes: a pair in pairs.
    pub(super) fn depth_step(&self) -> usize {
        if self.pairs { 2 } else { 1 }
    }

    /// The shape of one slice of a panel.
    pub(super) fn panel_shape(&self) -> Vec<usize> {
        if self.pairs {
            vec![self.kc / 2, self.nr, 2]
        } else {
            vec![self.kc, self.nr]
        }
    }

    /// Where in a slice of a panel a tile of the depth from step `step`
    /// (a pair in pairs) lies, the tile's axis `depth` running along the
    /// depth and `col` along the columns (in pairs, interleaved: pair
    /// `step`, every column, both of the pair's rows).
    pub(super) fn panel_at(&self, step: &Affine, [depth, col]: [usize; 2]) -> Vec<Affine> {
        if self.pairs {
            vec![step.clone(), Affine::axis(col), Affine::axis(depth)]
        } else {
            vec![step.plus_scaled(1, &Affine::axis(depth)), Affine::axis(col)]
        }
    }

    /// Depth of one copy into a panel: `kk`, or one pair in pairs (a
    /// panel's pairs are interleaved, which a copy of more rows could not
    /// store through an affine index).
    pub(super) fn panel_copy_depth(&self) -> usize {
        if self.pairs { 2 } else { self.kk }
    }

    /// The shape of `n` strips of one slice of the depth.
    pub(super) fn strips_shape(&self, n: usize) -> Vec<usize> {
        if self.pairs {
            vec![n, self.mr, self.kc]
        } else {
            vec![n, self.kc, self.mr]
        }
    }
}

impl PackPlan {
    pub(super) fn schedule(&self) -> Schedule {
        self.pack_schedule(None)
    }

    /// The schedule of a kernel packing `operand` for this product
    /// (`None`: the product itself).
    pub(super) fn pack_schedule(&self, operand: Option<PackedOperand>) -> Schedule {
        Schedule::Packed {
            blocking: [self.mr, self.nr, self.mc, self.kc],
            pack: operand,
        }
    }
}

/// Where a packed product's programs read the right operand's panels.
#[derive(Clone, Copy, Debug)]
pub(super) enum Panels {
    /// From the operand itself.
    InPlace,
    /// Each program copies the slice of a panel it multiplies into scratch.
    Own,
    /// From a global buffer a pack kernel filled.
    Global(Value),
}

/// The most rows of a register tile on which an epilogue runs as one tile
/// where its result is stored along the rows or it has a long-latency op
/// (`Conv::epilogue`): AVX2's 4 and Zen 4's 6, not the 14 of AVX-512 with
/// two FMA units (whose last strip of 7 rows over 49 pixels takes it).
const MAX_TILE_EPILOGUE_ROWS: usize = 8;

/// Which rows of its block an epilogue runs on: one (a counter), or the
/// `mr` from a first one as one tile.
enum EpilogueRows {
    One(Value),
    Tile(Affine),
}

/// What a packed product's epilogue needs once its block is computed (see
/// [`Conv::epilogue`]).
#[derive(Clone, Debug)]
pub(super) struct Epilogue {
    pub(super) m: LOpId,
    /// The program's `[rows, panels * nr]` block of sums.
    pub(super) block: Value,
    /// The block's first row and first panel.
    pub(super) i0: Affine,
    pub(super) nb0: Affine,
    pub(super) rows: usize,
    pub(super) panels: usize,
    pub(super) nr: usize,
    /// The register tile's rows (`rows` is a multiple of it).
    pub(super) mr: usize,
    /// Panels ahead whose lines the epilogue of a register tile prefetches
    /// (`Packing::epilogue_prefetch`); 0: none.
    pub(super) prefetch: usize,
}

/// Where a program of a packed product reads its operands at a step of
/// the depth: the strips (their buffer, none when read in place, and where
/// the program's are in it), the strip it is at, the panels (their
/// buffer when the program copies them, and its group of panels), the
/// right operand's batch, the slice of the depth, the program's first
/// panel and the panel it is at, its first row.
struct StepSources<'x> {
    strip_buf: Option<Value>,
    strips_at: &'x [Affine],
    strip: Value,
    /// The register tile's rows: `mr`, or the last strip's `last_rows`.
    rows: usize,
    panels: Panels,
    panel_buf: Option<Value>,
    group_at: Option<Value>,
    bat: &'x [Affine],
    kb: Affine,
    nb0: &'x Affine,
    nb: Affine,
    i0: &'x Affine,
    /// The weights the register tile's loop prefetches, if any.
    ahead: Option<Ahead>,
}

/// Weights a register tile's loop prefetches, read from memory rather than
/// the caches (`Packing::weight_prefetch`): the packed strips one strip
/// ahead (the next tile's), or a packed panel's slice: the one the
/// program multiplies next, the next panel's (`next_panel`), where its
/// tiles over this one take as long as a slice's fetch from memory
/// (`Conv::tiles_outlast_fetch`); else this panel's next slice of
/// the depth, which the program reaches after its chunk's other panels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ahead {
    Strip,
    Panel { next_panel: bool },
}

/// Where a program's register tiles sum: its block of sums (or one
/// tile's, run through the epilogue at once), over how many slices of the
/// depth.
struct RegisterTiles {
    block: Value,
    slices: usize,
    tile_epilogue: bool,
    /// Zero tiles of `mr` rows and of the last strip's.
    zeros: [Value; 2],
}

/// Where a packed product's programs read strips of the left operand.
#[derive(Clone, Debug)]
pub(super) enum Strips {
    /// Packed by each program into scratch memory, slice by slice.
    Own,
    /// From the global buffer a kernel packed them all into, at the
    /// program's block of rows.
    Global(Value, Affine),
    /// From the operand itself, contiguous along the depth (in a fused
    /// kernel, rows that are in cache already: a column of `mr` rows is
    /// `mr` loads off one address register, as cheap as from a packed
    /// strip).
    InPlace,
}

/// A program's strips as loops of register tiles, `(first, end, rows)`:
/// the strips of `mr` rows, then the last one's tile of `last_rows` when
/// it is ragged; with `first_apart`, the first strip a loop of its own.
fn strip_loops(plan: &PackPlan, first_apart: bool) -> Vec<(usize, usize, usize)> {
    let (mr, strips) = (plan.mr, plan.strips);
    let full = if plan.last_rows < mr {
        strips - 1
    } else {
        strips
    };
    let first = if first_apart { full.min(1) } else { 0 };
    [
        (0, first, mr),
        (first, full, mr),
        (full, strips, plan.last_rows),
    ]
    .into_iter()
    .filter(|p| p.0 < p.1)
    .collect()
}

impl<'a> Conv<'a> {
    /// Whether contraction `m` runs on the CPU's packed kernel: operands
    /// of f32, or of f16/bf16 accumulated in f32 (copied into f32 panels
    /// and strips, widened on the way, so the register tile is f32's; or,
    /// two bf16 operands where the target multiplies bf16 pairs, kept bf16:
    /// [`PackPlan::pairs`]).
    pub(super) fn packs(&self, m: LOpId) -> bool {
        let op = self.op(m);
        let (L::Matmul(c), Some(Packing { min_macs, .. })) = (&op.kind, self.params.packed) else {
            return false;
        };
        let floats = op.operands.iter().all(|v| {
            matches!(
                self.operand_dtype(*v),
                Some(DType::F32 | DType::F16 | DType::BF16)
            )
        });
        let macs = c.m.saturating_mul(c.n).saturating_mul(c.k);
        floats
            && self.result_dtype(op.regions[0].args[3]) == DType::F32
            && usize::try_from(macs).is_ok_and(|macs| macs >= min_macs)
    }

    /// The element type of a product's operand buffer.
    pub(super) fn operand_dtype(&self, v: LValue) -> Option<DType> {
        match self.src.ty(v) {
            LType::Buffer(t) => Some(t.dtype),
            _ => None,
        }
    }

    /// Whether both operands of product `m` are f32 (what reading them in
    /// place, and the fused schedules, take).
    pub(super) fn f32_operands(&self, m: LOpId) -> bool {
        self.op(m)
            .operands
            .iter()
            .all(|v| self.operand_dtype(*v) == Some(DType::F32))
    }

    /// A `shape` tile of product operand `operand` (buffer `buf` at
    /// `index`) as `to`: an f16/bf16 operand is loaded as is and widened
    /// to f32 where `to` is f32.
    pub(super) fn load_as(
        &mut self,
        operand: LValue,
        (buf, index): (Value, Vec<Affine>),
        mask: Option<Value>,
        shape: Vec<usize>,
        to: DType,
    ) -> Value {
        let dtype = self.operand_dtype(operand).unwrap_or(DType::F32);
        // Zero past the edges, which the mask leaves out.
        let t = self.b.load(
            buf,
            index,
            mask,
            None,
            Type::Tile(TileType::new(dtype, shape)),
        );
        if dtype == to { t } else { self.b.cast(t, to) }
    }

    /// A top-level f32 contraction as BLIS computes it on a CPU, with the
    /// packing as IR. A `pack` kernel copies the right operand once into
    /// `kc x nr` panels (zero-padded past its edges). Each program of the
    /// `packed` kernel then takes `mc` rows and a chunk of panels (the
    /// columns are split when there are fewer row blocks than the target's
    /// units of work, so a product of few rows still keeps every thread
    /// busy): for each `kc`-deep slice it packs its rows of the left
    /// operand into `mr`-row strips of scratch memory (transposed: one `mr`
    /// column per step of `k`), and for each panel and strip runs the
    /// register tile, `kc` steps of an `mr x 1` by `1 x nr` `tile.dot`
    /// accumulating into a scratch block of the result; finally the
    /// epilogue runs on the block, one `1 x nr` row of a panel at a time.
    /// Every copy moves
    /// tiles of a few vectors in a `tile.for`, read along the operand's
    /// contiguous axis (and transposed on the way when that is not the
    /// panel's), so no tile is larger than the register tile.
    ///
    /// With two batch loops (`[B, H, M, N]` attention scores), each is a
    /// grid axis of its own and the rows the third: a program takes every
    /// panel of its block of rows (there are `B * H` batches to share
    /// among threads).
    pub(super) fn packed_dot(&mut self, band: &[LOpId], m: LOpId) -> Result<(), TileConvError> {
        let batch: Vec<(LValue, i64, usize)> = band
            .iter()
            .filter_map(|l| self.batch_loop(Some(*l)))
            .collect();
        let batches = batch.iter().map(|b| b.2).product();
        let chunked = batch.len() < 2;
        let mut tile = self.half_panel_tile(m)?;
        let mut plan = self.pack_plan_tiled(m, batches, chunked, tile, None)?;
        if tile.is_none()
            && let Some(t) = self.balancing_tile(m, &plan, batches, chunked)
        {
            plan = self.pack_plan_tiled(m, batches, chunked, Some(t), None)?;
            tile = Some(t);
        }
        // A left operand laid out as packed strips are (a 1 x 1
        // convolution's input with its pixels as the rows) is read where it
        // lies, in slices of at most `Packing::in_place_depth`, where the
        // blocking takes three slices of its depth or more: no kernel packs
        // it, which one thread ran alone while the other waited, writing
        // lines both had read (Zen 4, two threads: EfficientNet-B0's 1152
        // -> 192 projections over 7 x 7 with their residual 0.14 -> 0.115 ms
        // in the model; one thread 0.27 -> 0.24). Its lines are `mr` floats
        // of each row the slice reads, so the slice is shallower than a
        // packed one (kc 192 or 240 in place: 1152 -> 160 over 7 x 7 alone
        // 8-11% slower than packed; 64: 0-14% faster). Products of one or
        // two slices keep their packed strips: taken to three slices of 64,
        // EfficientNet's 192 -> 1152 expansions over 7 x 7 were 7% slower.
        let weights = self.weight_left_operand(m);
        let in_place_depth = self.params.packed.map_or(0, |p| p.in_place_depth);
        let mut in_place = false;
        if batches == 1
            && !weights
            && in_place_depth > 0
            && plan.kb_n >= 3
            && self.columns_in_place(m, &plan)
        {
            let shallow = self.pack_plan_tiled(m, batches, chunked, tile, Some(in_place_depth))?;
            if self.columns_in_place(m, &shallow) {
                (plan, in_place) = (shallow, true);
            }
        }
        plan.splits = self.depth_splits(m, &plan, batch.len())?;
        // The right operand's panels differ only along the batch loops its
        // index reads: a weight shared by every batch is packed once.
        let (_, c) = self.contraction(m)?;
        let shared: Vec<bool> = batch.iter().map(|b| !moves_with(&c.b, b.0)).collect();
        let panel_batch: Vec<(LValue, i64, usize)> = batch
            .iter()
            .zip(&shared)
            .filter(|(_, s)| !**s)
            .map(|(b, _)| *b)
            .collect();
        let panels = self.panels(m, &panel_batch, &plan)?;
        // With several column chunks per block of rows, every chunk's
        // program would pack the same strips of the left operand: a kernel
        // packs them once (W6's feed-forward products: 8 programs each
        // packed all 128 rows of a 3072-deep operand). So does a left
        // operand of weights alone (a convolution's kernel), whose kernel
        // then runs once, when the weights are bound: MobileNet's products
        // over 7 x 7 and 14 x 14 pixels, tens of columns a chunk, spent a
        // third as long packing their weights as multiplying. Either way
        // the operand is the same for every batch (`w @ col[b]`), or there
        // is one batch (an exported transformer's `[1, 128, 3072]`
        // activations: GPT-2's block packed them 8 times a product). A
        // convolution whose programs copy their im2col panels from the
        // input takes the strips kernel only for a kernel of weights (the
        // preparer's: ResNet's stride-2 convolutions and stems had every
        // program of every call pack the whole kernel).
        let left_shared = batch.iter().all(|b| b.2 == 1 || !moves_with(&c.a, b.0));
        let strips = (!in_place
            && left_shared
            && (plan.chunks > 2 || weights)
            && (weights || !self.convs.contains_key(&m)))
        .then(|| {
            for &(counter, lo, _) in &batch {
                self.index.insert(counter, Affine::constant(lo));
            }
            self.strips_kernel(m, &plan)
        })
        .transpose()?;
        let mut grid: Vec<usize> = batch.iter().map(|b| b.2).collect();
        grid.push(plan.blocks);
        if batch.len() < 2 {
            grid.push(plan.chunks);
        }
        let split_axis = grid.len();
        if plan.splits > 1 {
            grid.push(plan.splits);
        }
        // A product split along the depth leaves each program's sums in a
        // global `[split, block, chunk, mc, chunk's columns]` buffer, and a
        // second kernel adds them up and runs the epilogue.
        let partials = (plan.splits > 1).then(|| {
            self.b.alloc(BufferType::contiguous(
                DType::F32,
                vec![
                    plan.splits,
                    plan.blocks,
                    plan.chunks,
                    plan.mc,
                    plan.per_chunk * plan.nr,
                ],
                Space::Global,
            ))
        });
        self.b.begin_kernel(grid.clone(), plan.schedule());
        let bat = self.batch_axes(&batch);
        let bat_axes = bat.len();
        let p = self.b.program_id(bat_axes);
        let chunk = if batch.len() < 2 {
            Affine::value(self.b.program_id(bat_axes + 1))
        } else {
            Affine::constant(0)
        };
        let split = match partials {
            Some(_) => Affine::value(self.b.program_id(split_axis)),
            None => Affine::constant(0),
        };
        let i0 = Affine::value(p).scaled(plan.mc as i64);
        self.strips = match strips {
            Some(buf) => Strips::Global(buf, Affine::value(p)),
            None if in_place => Strips::InPlace,
            None => Strips::Own,
        };
        let panel_bat: Vec<Affine> = bat
            .iter()
            .zip(&shared)
            .filter(|(_, s)| !**s)
            .map(|(a, _)| a.clone())
            .collect();
        let epilogue = match partials {
            Some(_) => TileEpilogue::Block,
            None => self.tile_epilogue_kind(m)?,
        };
        let result = self
            .program_product(m, &plan, panels, &panel_bat, &i0, &chunk, &split, epilogue)
            .and_then(|e| match (e, partials) {
                (None, _) => Ok(()),
                (Some(e), Some(partials)) => {
                    let at = [split.clone(), Affine::value(p), chunk.clone()];
                    self.copy_block(&e, partials, &at)
                }
                (Some(e), None) => self.epilogue(&e),
            });
        self.strips = Strips::Own;
        result?;
        self.b.end_kernel();
        if let Some(partials) = partials {
            self.sum_splits(m, &plan, partials, &grid[..split_axis])?;
            self.b.dealloc(partials);
        }
        if let Panels::Global(panels) = panels {
            self.b.dealloc(panels);
        }
        if let Some(strips) = strips {
            self.b.dealloc(strips);
        }
        Ok(())
    }

    /// How product `m`'s epilogue may run on each register tile as it is
    /// summed (`program_product`): [`TileEpilogue::Light`] when it reads
    /// nothing that varies along both its rows and its columns (only
    /// scalars, and values per row or per column: a bias, a clip's
    /// bounds), else [`TileEpilogue::Heavy`].
    pub(super) fn tile_epilogue_kind(&self, m: LOpId) -> Result<TileEpilogue, TileConvError> {
        Ok(if self.light_epilogue(m)? {
            TileEpilogue::Light
        } else {
            TileEpilogue::Heavy
        })
    }

    /// Whether product `m`'s epilogue reads nothing that varies along both
    /// its rows and its columns (see [`TileEpilogue`]).
    pub(super) fn light_epilogue(&self, m: LOpId) -> Result<bool, TileConvError> {
        let (op, _) = self.contraction(m)?;
        let body: &LBlock = &op.regions[0];
        let (iv, jv) = (body.args[0], body.args[1]);
        Ok(body.ops.iter().all(|&o| {
            let op = self.op(o);
            op.regions.is_empty()
                && match &op.kind {
                    L::Load { index, .. } => !(moves_with(index, iv) && moves_with(index, jv)),
                    _ => true,
                }
        }))
    }

    /// Programs of product `m` along its depth (split-K): a product of one
    /// program (one block of rows, one chunk of columns, no batch) and of
    /// at least two slices of the depth would leave every thread but one
    /// idle, so it is cut into as many programs along the depth as divide
    /// its slices evenly, up to the target's units of work, each of at
    /// least `Packing::split_macs` multiply-adds (u1's weight gradients,
    /// `[32, 8192] x [8192, 32]`, ran as one program on one of two
    /// threads). Not for a convolution's product (whose panels are copied
    /// from the input by group) or one in pairs.
    pub(super) fn depth_splits(
        &self,
        m: LOpId,
        plan: &PackPlan,
        batch_loops: usize,
    ) -> Result<usize, TileConvError> {
        let Some(Packing {
            units, split_macs, ..
        }) = self.params.packed
        else {
            return Ok(1);
        };
        let (_, c) = self.contraction(m)?;
        if batch_loops > 0
            || plan.blocks * plan.chunks > 1
            || plan.pairs
            || self.convs.contains_key(&m)
            || self.row_factors.is_some()
        {
            return Ok(1);
        }
        let macs = (c.m.max(0) as usize)
            .saturating_mul(c.n.max(0) as usize)
            .saturating_mul(c.k.max(0) as usize);
        Ok((2..=units.min(plan.kb_n))
            .rev()
            .find(|s| plan.kb_n.is_multiple_of(*s) && macs / s >= split_macs)
            .unwrap_or(1))
    }

    /// Copies the block of epilogue `e` to `dst[at.., row, column]`, `1 x
    /// nr` at a time.
    fn copy_block(&mut self, e: &Epilogue, dst: Value, at: &[Affine]) -> Result<(), TileConvError> {
        let row_t = Type::Tile(TileType::new(DType::F32, vec![1, e.nr]));
        let (r, _) = self.b.begin_for(0, e.rows as i64, 1, &[]);
        let (nb, _) = self.b.begin_for(0, e.panels as i64, 1, &[]);
        let place = vec![Affine::value(r), Affine::block(nb, e.nr as i64, 1)];
        let mut to = at.to_vec();
        to.extend(place.clone());
        let t = self.b.load(e.block, place, None, None, row_t);
        self.b.store(t, dst, to, None);
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        Ok(())
    }

    /// The kernel after a product split along the depth: over the same
    /// `grid` of blocks and chunks, each program adds up its block's sums
    /// of every split from `partials` (in split order, so the result does
    /// not depend on the threads) and runs the product's epilogue on them.
    fn sum_splits(
        &mut self,
        m: LOpId,
        plan: &PackPlan,
        partials: Value,
        grid: &[usize],
    ) -> Result<(), TileConvError> {
        let nr = plan.nr;
        let row_t = Type::Tile(TileType::new(DType::F32, vec![1, nr]));
        self.b.begin_kernel(grid.to_vec(), plan.schedule());
        let (p, chunk) = (self.b.program_id(0), self.b.program_id(1));
        let block = self.b.alloc(BufferType::contiguous(
            DType::F32,
            vec![plan.mc, plan.per_chunk * nr],
            Space::Scratch,
        ));
        let (r, _) = self.b.begin_for(0, plan.mc as i64, 1, &[]);
        let (nb, _) = self.b.begin_for(0, plan.per_chunk as i64, 1, &[]);
        let place = vec![Affine::value(r), Affine::block(nb, nr as i64, 1)];
        let mut sum = None;
        for split in 0..plan.splits {
            let mut at = vec![
                Affine::constant(split as i64),
                Affine::value(p),
                Affine::value(chunk),
            ];
            at.extend(place.clone());
            let t = self.b.load(partials, at, None, None, row_t.clone());
            sum = Some(match sum {
                Some(acc) => self.b.binary(BinaryOp::Add, acc, t),
                None => t,
            });
        }
        let sum = sum.ok_or_else(|| self.invalid("a split product of no splits"))?;
        self.b.store(sum, block, place, None);
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        self.epilogue(&Epilogue {
            m,
            block,
            i0: Affine::value(p).scaled(plan.mc as i64),
            nb0: Affine::value(chunk).scaled(plan.per_chunk as i64),
            rows: plan.mc,
            panels: plan.per_chunk,
            nr,
            mr: plan.mr,
            prefetch: 0,
        })?;
        self.b.end_kernel();
        Ok(())
    }

    /// The kernel packing product `m`'s left operand into a global
    /// `[block, kb, strip, kc, mr]` buffer of strips (as each program of the
    /// product would into scratch), which it returns.
    pub(super) fn strips_kernel(
        &mut self,
        m: LOpId,
        plan: &PackPlan,
    ) -> Result<Value, TileConvError> {
        let mut shape = vec![plan.blocks, plan.kb_n];
        shape.extend(plan.strips_shape(plan.strips));
        let strips = self.b.alloc(BufferType::contiguous(
            plan.packed_dtype(),
            shape,
            Space::Global,
        ));
        self.b.begin_kernel(
            vec![plan.blocks, plan.kb_n],
            plan.pack_schedule(Some(PackedOperand::Left)),
        );
        let (p, kb) = (self.b.program_id(0), self.b.program_id(1));
        let i0 = Affine::value(p).scaled(plan.mc as i64);
        self.pack_strips(
            m,
            plan,
            &Affine::value(kb),
            &i0,
            strips,
            &[Affine::value(p), Affine::value(kb)],
        )?;
        self.b.end_kernel();
        Ok(strips)
    }

    /// Packs slice `kb` of the rows from `i0` of product `m`'s left operand
    /// into `dst[prefix.., strip, k, row]`, strip by strip.
    pub(super) fn pack_strips(
        &mut self,
        m: LOpId,
        plan: &PackPlan,
        kb: &Affine,
        i0: &Affine,
        dst: Value,
        prefix: &[Affine],
    ) -> Result<(), TileConvError> {
        let (op, c) = self.contraction(m)?;
        let body: &'a LBlock = &op.regions[0];
        let (iv, kv) = (body.args[0], body.args[2]);
        let (mr, kc, kk) = (plan.mr, plan.kc, plan.kk);
        let (s, _) = self.b.begin_for(0, plan.strips as i64, 1, &[]);
        let (f, _) = self.b.begin_for(0, (kc / kk) as i64, 1, &[]);
        let row0 = i0.plus_scaled(mr as i64, &Affine::value(s));
        let k0 = kb
            .scaled(kc as i64)
            .plus_scaled(kk as i64, &Affine::value(f));
        let (a_index, limits, shape, [ia, ka]) = self.operand_block(
            op.operands[0],
            &c.a,
            [(iv, row0, c.m, mr), (kv, k0, c.k, kk)],
        )?;
        let placed = self.place(op.operands[0], a_index)?;
        let a_mask = self.b.mask(limits, &shape);
        let ta = self.load_as(
            op.operands[0],
            placed,
            Some(a_mask),
            shape,
            plan.packed_dtype(),
        );
        let k_at = Affine::value(f)
            .scaled(kk as i64)
            .plus_scaled(1, &Affine::axis(ka));
        let mut at = prefix.to_vec();
        at.push(Affine::value(s));
        // Transposed (a column of `mr` rows per step of the depth), or, in
        // pairs, row by row (each row's pair one word).
        if plan.pairs {
            at.extend([Affine::axis(ia), k_at]);
        } else {
            at.extend([k_at, Affine::axis(ia)]);
        }
        self.b.store(ta, dst, at, None);
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        Ok(())
    }

    /// In a fused kernel, whether product `m`'s programs may read their
    /// rows of the left operand where they lie: contiguous along the depth,
    /// every slice of the depth whole and every block of rows inside the
    /// operand (a fused buffer's scratch holds whole blocks).
    pub(super) fn rows_in_place(&self, m: LOpId, plan: &PackPlan) -> Strips {
        let op = self.op(m);
        let L::Matmul(c) = &op.kind else {
            return Strips::Own;
        };
        let a = op.operands[0];
        let inside = (c.m as usize).is_multiple_of(plan.mc) || self.redirects.contains_key(&a);
        if inside
            && self.operand_dtype(a) == Some(DType::F32)
            && (c.k as usize).is_multiple_of(plan.kc)
            && self.unit_stride(a, &c.a, op.regions[0].args[2])
        {
            Strips::InPlace
        } else {
            Strips::Own
        }
    }

    /// Whether product `m`'s programs read their strips from the left
    /// operand where it lies, laid out as a packed strip is: contiguous
    /// along the rows (`mr` rows at a step of the depth are `mr`
    /// neighbours: a 1 x 1 convolution's input with its pixels as the
    /// rows), one block holding every row (its last strip a tile of the
    /// rows left, so no row past the operand's is read) and whole slices
    /// of the depth.
    pub(super) fn columns_in_place(&self, m: LOpId, plan: &PackPlan) -> bool {
        let op = self.op(m);
        let L::Matmul(c) = &op.kind else {
            return false;
        };
        let (a, iv) = (op.operands[0], op.regions[0].args[0]);
        plan.blocks == 1
            && !plan.pairs
            && self.operand_dtype(a) == Some(DType::F32)
            && (c.k as usize).is_multiple_of(plan.kc)
            && self.unit_stride(a, &c.a, iv)
    }

    /// Where the programs of packed product `m` read the right operand's
    /// panels: packed once by a kernel of their own when the operand is a
    /// weight; else read in place by a product of few rows whose slices fit
    /// the L1 ([`Self::few_rows_read_in_place`]); else packed by each
    /// program into scratch memory, one slice of a panel at a time, when
    /// each panel serves one program; else read in place where the operand
    /// allows it; else packed once by a kernel of its own
    /// (`panels[batch.., kb, nb, k, j]`), emitted here.
    pub(super) fn panels(
        &mut self,
        m: LOpId,
        batch: &[(LValue, i64, usize)],
        plan: &PackPlan,
    ) -> Result<Panels, TileConvError> {
        Ok(if self.weight_operand(m) {
            Panels::Global(self.pack_kernel(m, batch, plan)?)
        } else if self.few_rows_read_in_place(m, plan)? {
            Panels::InPlace
        } else if self.packs_own_panels(m, plan.blocks) {
            Panels::Own
        } else if self.reads_in_place(m, plan.blocks, plan.l1_sets) {
            Panels::InPlace
        } else {
            Panels::Global(self.pack_kernel(m, batch, plan)?)
        })
    }

    /// The blocks of packed product `m` over `batches` batches: with
    /// `chunked`, the columns are split into chunks when there are fewer
    /// row blocks than the target's units of work; without, each program
    /// takes every panel.
    pub(super) fn pack_plan(
        &self,
        m: LOpId,
        batches: usize,
        chunked: bool,
    ) -> Result<PackPlan, TileConvError> {
        self.pack_plan_tiled(m, batches, chunked, None, None)
    }

    /// The register tile of packed product `m` where its last panel would
    /// be at most half full and the target has a tile for that
    /// (`Packing::half_panel_tile`: 12 x 16 rather than 6 x 32 on Zen 4),
    /// and that tile's columns pad at least a twentieth fewer
    /// (`dlc_core::target::half_panel_pads_less`), for a product whose
    /// right operand is not an im2col buffer
    /// read from the input (whose copies come in groups of panels of the
    /// blocking's width).
    pub(super) fn half_panel_tile(&self, m: LOpId) -> Result<Option<[usize; 2]>, TileConvError> {
        let Some(Packing {
            blocking: [_, nr, _, _],
            half_panel_tile: Some(tile @ [_, width]),
            ..
        }) = self.params.packed
        else {
            return Ok(None);
        };
        let (_, c) = self.contraction(m)?;
        let n = c.n.max(1) as usize;
        Ok((!self.convs.contains_key(&m) && half_panel_pads_less(n, nr, width)).then_some(tile))
    }

    /// The half-panel register tile (`Packing::half_panel_tile`) where
    /// `plan`, the blocking's, leaves programs of one panel each, fewer
    /// than twice the target's units and not a multiple of `balance`: half
    /// as wide, they are twice as many, which two threads share evenly
    /// (MobileNetV2's 960 -> 160 projections over 7 x 7, 5 panels of 32
    /// that one of two threads ran 3 of, are 10 of 16: Zen 4, cut out,
    /// 0.080 -> 0.070 ms at two threads, 0.131 -> 0.134 at one; the whole
    /// model, alternated, 3.88 -> 3.82 ms at two, 6.96 -> 6.92 at one).
    pub(super) fn balancing_tile(
        &self,
        m: LOpId,
        plan: &PackPlan,
        batches: usize,
        chunked: bool,
    ) -> Option<[usize; 2]> {
        let packing = self.params.packed?;
        let tile = packing.half_panel_tile?;
        let programs = plan.blocks * batches * plan.chunks;
        (chunked
            && !self.convs.contains_key(&m)
            && plan.per_chunk == 1
            && !programs.is_multiple_of(packing.balance)
            && programs < 2 * packing.units)
            .then_some(tile)
    }

    /// [`Self::pack_plan`] with register tile `tile` (`[mr, nr]`) in place
    /// of the blocking's, where one is given (bf16 pairs keep theirs).
    pub(super) fn pack_plan_tiled(
        &self,
        m: LOpId,
        batches: usize,
        chunked: bool,
        tile: Option<[usize; 2]>,
        depth_cap: Option<usize>,
    ) -> Result<PackPlan, TileConvError> {
        let (_, c) = self.contraction(m)?;
        let Some(Packing {
            blocking,
            tall_mr,
            units,
            copy_depth,
            balance,
            l1_sets,
            unroll,
            bf16_pairs,
            ..
        }) = self.params.packed
        else {
            return Err(self.invalid("no packed blocking for this target"));
        };
        // bf16 in pairs along an even depth (an im2col window's slices are
        // whole channels, read as f32).
        let conv = self.convs.get(&m);
        let pairs_blocking = bf16_pairs.filter(|_| {
            conv.is_none()
                && c.k % 2 == 0
                && self
                    .op(m)
                    .operands
                    .iter()
                    .all(|v| self.operand_dtype(*v) == Some(DType::BF16))
        });
        let pairs = pairs_blocking.is_some();
        let [mr, nr, mc, kc] = match (pairs_blocking, tile) {
            (Some(p), _) => p,
            (None, Some([mr, nr])) => [mr, nr, blocking[2], blocking[3]],
            (None, None) => {
                let [mr, nr, mc, kc] = blocking;
                let (rows, depth) = (c.m.max(1) as usize, c.k.max(1) as usize);
                let tall = takes_taller_tile(rows, depth, [mr, tall_mr, kc]);
                [if tall { tall_mr } else { mr }, nr, mc, kc]
            }
        };
        // Blocks no larger than the product needs, and slices of the depth
        // of even size (a whole number of copies deep), so that the last one
        // is not mostly zeros the register tile multiplies.
        let depth = c.k.max(1) as usize;
        let kc = depth_cap.map_or(kc, |d| d.min(kc));
        let even = depth.div_ceil(depth.div_ceil(kc));
        // Or, where one more slice than the fewest divides the depth into
        // whole copies, that: 1152 deep is six slices of 192, not five of
        // 240 (1200, the last 48 rows zeros and every copy of the slice
        // masked): EfficientNet-B0's 1152 -> 192 and 1152 -> 320 products
        // over 7 x 7 alone 11-12% faster on Zen 4 (one thread).
        let min_slices = depth.div_ceil(kc);
        let exact = (min_slices..=min_slices + 1)
            .find(|s| depth.is_multiple_of(*s) && (depth / s).is_multiple_of(copy_depth))
            .filter(|_| depth > kc);
        let kc = if let Some(s) = exact {
            depth / s
        } else if depth > kc && even > copy_depth {
            even.next_multiple_of(copy_depth).min(kc)
        } else {
            even
        };
        let kc = if pairs { kc.next_multiple_of(2) } else { kc };
        // Slices of whole channels when the right operand is an im2col
        // buffer read from the input: as many channels as fit the depth.
        let kc = match conv {
            Some(cv) => {
                let taps = cv.kernel[0] * cv.kernel[1];
                let cs = (1..=cv.channels)
                    .rev()
                    .find(|d| cv.channels.is_multiple_of(*d) && d * taps <= kc.max(taps))
                    .unwrap_or(1);
                cs * taps
            }
            None => kc,
        };
        // Row blocks of `mr`-row strips, as many strips as the blocking
        // takes or down to half of it, whichever pads the rows least (every
        // program runs all of its strips, so a last block mostly past the
        // rows would be multiplied for nothing).
        let rows = c.m.max(1) as usize;
        let most = (mc / mr).max(1);
        let mc = (most.div_ceil(2)..=most)
            .rev()
            .min_by_key(|s| rows.div_ceil(s * mr) * s * mr)
            .map_or(mr, |s| s * mr)
            .min(rows.div_ceil(mr) * mr);
        let (m_, n_, k_) = (c.m as usize, c.n as usize, c.k as usize);
        let (kb_n, strips_n) = (k_.div_ceil(kc), n_.div_ceil(nr));
        let blocks = m_.div_ceil(mc);
        // Panels per chunk: at most enough for the chunks wanted, and of
        // those sizes the one that pads the last chunk least (every program
        // runs all of its chunk's panels; 98 panels in 8 chunks would run
        // 104, in 14 chunks of 7 they run 98).
        let wanted = if chunked {
            units.div_ceil(blocks * batches).clamp(1, strips_n.max(1))
        } else {
            1
        };
        // Programs a multiple of `balance`, where at most twice the chunks
        // make it, so that no thread is left waiting on the last one.
        let wanted = if chunked {
            (wanted..=(2 * wanted).min(strips_n.max(1)))
                .find(|c| (blocks * batches * c).is_multiple_of(balance))
                .unwrap_or(wanted)
        } else {
            wanted
        };
        // At most `strips_n / wanted` panels per chunk, so that there are at
        // least the chunks wanted (18 panels wanted in 8 chunks are 9 of 2,
        // not 6 of 3: a kernel of fewer programs than the target's units
        // is not spread over threads); of the sizes that pad least, one
        // that makes the programs a multiple of `balance` (EfficientNet-B0's
        // 192 -> 1152 over 7 x 7, 36 panels: 12 chunks of 3, not 9 of 4,
        // of which one of two threads ran 5: Zen 4, alone, 0.125 -> 0.116
        // ms at two threads, 0.209 at one either way).
        let unbalanced = |p: usize| {
            chunked && !(blocks * batches * strips_n.div_ceil(p)).is_multiple_of(balance)
        };
        let per_chunk = (1..=(strips_n / wanted).max(1))
            .rev()
            .min_by_key(|&p| (strips_n.div_ceil(p) * p - strips_n, unbalanced(p)))
            .unwrap_or(1);
        // Whole groups of panels for an im2col buffer read from the input.
        let per_chunk = conv.map_or(per_chunk, |cv| per_chunk.next_multiple_of(cv.group));
        let chunks = strips_n.div_ceil(per_chunk);
        // Panels for whole chunks: the last chunk's extra panels are zeros.
        let nb_n = chunks * per_chunk;
        // Depth of one copied tile: a divisor of `kc`, so that copies never
        // cross from one `kc` slice into the next.
        // In pairs, an even one (two at least).
        let step = if pairs { 2 } else { 1 };
        let kk = (1..=copy_depth.max(step).min(kc))
            .rev()
            .find(|d| kc.is_multiple_of(*d) && d.is_multiple_of(step))
            .unwrap_or(step);
        // The depth loop, `unroll` steps (pairs) per iteration (the largest
        // that divides `kc` (`kc / 2`), up to the target's).
        let unroll = (1..=unroll.max(1))
            .rev()
            .find(|u| (kc / step).is_multiple_of(*u))
            .unwrap_or(1);
        Ok(PackPlan {
            mr,
            nr,
            mc,
            kc,
            kk,
            kb_n,
            strips: mc / mr,
            last_rows: if blocks == 1 && !pairs {
                rows - (mc / mr - 1) * mr
            } else {
                mr
            },
            blocks,
            chunks,
            per_chunk,
            nb_n,
            // Masks where a slice or a panel reaches past the operand.
            ragged: !k_.is_multiple_of(kc) || !n_.is_multiple_of(nr) || nb_n > strips_n,
            unroll,
            splits: 1,
            l1_sets,
            pairs,
        })
    }

    /// The kernel packing product `m`'s right operand into a global
    /// `[batch.., kb, nb, kc, nr]` buffer of panels (`[.., kc / 2, nr, 2]`
    /// in pairs), which it returns: one
    /// program per batch, slice of the depth and panel, or, with two batch
    /// loops (a grid has three axes), per batch and slice, looping over
    /// the panels.
    pub(super) fn pack_kernel(
        &mut self,
        m: LOpId,
        batch: &[(LValue, i64, usize)],
        plan: &PackPlan,
    ) -> Result<Value, TileConvError> {
        let mut panel_shape: Vec<usize> = batch.iter().map(|b| b.2).collect();
        panel_shape.extend([plan.kb_n, plan.nb_n]);
        panel_shape.extend(plan.panel_shape());
        let panels = self.b.alloc(BufferType::contiguous(
            plan.packed_dtype(),
            panel_shape,
            Space::Global,
        ));
        let mut grid: Vec<usize> = batch.iter().map(|b| b.2).collect();
        grid.push(plan.kb_n);
        let looped = batch.len() >= 2;
        if !looped {
            grid.push(plan.nb_n);
        }
        self.b
            .begin_kernel(grid, plan.pack_schedule(Some(PackedOperand::Right)));
        let mut at = self.batch_axes(batch);
        let bat_axes = at.len();
        let pk = self.b.program_id(bat_axes);
        let pn = if looped {
            self.b.begin_for(0, plan.nb_n as i64, 1, &[]).0
        } else {
            self.b.program_id(bat_axes + 1)
        };
        at.extend([Affine::value(pk), Affine::value(pn)]);
        let j0 = Affine::value(pn).scaled(plan.nr as i64);
        self.copy_panel_slice(m, &Affine::value(pk), j0, plan, panels, &at, false)?;
        if looped {
            self.b.end_for(vec![]);
        }
        self.b.end_kernel();
        Ok(panels)
    }

    /// The body of a program of packed product `m`: rows from `i0` (`mc`
    /// of them), the `per_chunk` panels of column chunk `chunk`, the batch
    /// of its right operand (the program ids of the batch loops it reads)
    /// at `bat`, and of a product split along the depth
    /// ([`PackPlan::splits`]), share `split` of the depth's slices.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn program_product(
        &mut self,
        m: LOpId,
        plan: &PackPlan,
        panels: Panels,
        bat: &[Affine],
        i0: &Affine,
        chunk: &Affine,
        split: &Affine,
        epilogue: TileEpilogue,
    ) -> Result<Option<Epilogue>, TileConvError> {
        // The program's first panel.
        let nb0 = &chunk.scaled(plan.per_chunk as i64);
        // An im2col right operand read from the convolution's input, in
        // groups of panels (the program's first group).
        let conv = self.convs.get(&m).cloned();
        if conv.is_some() && !matches!(panels, Panels::Own) {
            return Err(self
                .invalid("an im2col operand read from the input must be copied by its programs"));
        }
        let PackPlan {
            mr,
            nr,
            mc,
            kc,
            kb_n,
            strips,
            per_chunk,
            splits,
            ..
        } = *plan;
        // The program's slices of the depth: all of them, or its share of
        // a product split along the depth.
        let slices = kb_n / splits;
        let first_slice = split.scaled(slices as i64);
        let f32t = |shape: Vec<usize>| Type::Tile(TileType::new(DType::F32, shape));
        // The program's strips of the left operand, unless a kernel packed
        // them all before or they are read in place.
        let strips_from = self.strips.clone();
        let [strip_ahead, panel_ahead] = self.weights_ahead(m, plan, &strips_from, panels);
        let strip_buf = match &strips_from {
            Strips::Global(buf, _) => Some(*buf),
            Strips::InPlace => None,
            Strips::Own => Some(self.b.alloc(BufferType::contiguous(
                plan.packed_dtype(),
                plan.strips_shape(strips),
                Space::Scratch,
            ))),
        };
        // A shallow product walks each strip across the chunk's panels (all
        // of them copied first, when the program copies them): its result
        // is then written `mr` rows at a time along their columns, rather
        // than a line of each of the block's rows per panel, a store stream
        // per row (see `Packing::strips_outer_depth`). So does one whose
        // epilogue reads an operand along both axes (a residual), up to
        // `Packing::heavy_outer_depth`, where the chunk's panels fit half
        // the L2: that operand
        // is then read, and the result written, along `mr` rows; panel by
        // panel each was a line of every row of the block (ResNet-50's 64 ->
        // 256 convolutions with their residual over 56 x 56: 128 streams,
        // 2.3 times slower than the block's epilogue row by row), and row by
        // row after the product the block of sums (`128 x 784`, 400 KB)
        // was written and read back (strip by strip: 18% faster).
        let (per_tile, heavy) = match epilogue {
            TileEpilogue::Block => (false, false),
            TileEpilogue::Light => (true, false),
            TileEpilogue::Heavy => (false, true),
        };
        let walkable = slices == 1
            && self.row_factors.is_none()
            && conv.is_none()
            && !plan.pairs
            && strips > 1
            && per_chunk > 1
            && !self.stores_along_rows(m)?;
        let panels_bytes = 4 * per_chunk * kc * nr;
        let strips_outer = walkable
            && self.params.packed.as_ref().is_some_and(|p| {
                if heavy {
                    kc <= p.heavy_outer_depth && panels_bytes <= p.l2_bytes / 2
                } else {
                    per_tile && kc <= p.strips_outer_depth && panels_bytes <= p.l2_bytes / 4
                }
            });
        // With one slice of the depth and `per_tile` (or a heavy epilogue
        // walked strip by strip), the epilogue runs on each register tile
        // as soon as it is summed, from an `mr x nr` block that stays in
        // the first level of cache, and the result is stored once: a 1 x 1
        // convolution over 112 x 112 pixels wrote its `96 x 1568` block of
        // sums (600 KB) and read it back for the epilogue, half of its
        // time.
        let tile_epilogue =
            (per_tile && slices == 1 && self.row_factors.is_none()) || (heavy && strips_outer);
        let block = self.b.alloc(BufferType::contiguous(
            DType::F32,
            if tile_epilogue {
                vec![mr, nr]
            } else {
                vec![mc, per_chunk * nr]
            },
            Space::Scratch,
        ));
        let panel_buf = matches!(panels, Panels::Own).then(|| {
            let mut shape: Vec<usize> = conv.iter().map(|cv| cv.group).collect();
            if strips_outer {
                shape.push(per_chunk);
            }
            shape.extend(plan.panel_shape());
            self.b.alloc(BufferType::contiguous(
                plan.packed_dtype(),
                shape,
                Space::Scratch,
            ))
        });
        // With one slice of the depth, each register tile starts from zero
        // in registers: the block is written once, never zeroed or read
        // back (W4's products are 64 deep).
        let zero = self.b.constant(0.0, f32t(vec![mr, nr]));
        let last_zero = if plan.last_rows < mr {
            self.b.constant(0.0, f32t(vec![plan.last_rows, nr]))
        } else {
            zero
        };
        if slices > 1 {
            let (nb, _) = self.b.begin_for(0, per_chunk as i64, 1, &[]);
            let (s, _) = self.b.begin_for(0, strips as i64, 1, &[]);
            let at = vec![
                Affine::block(s, mr as i64, 0),
                Affine::block(nb, nr as i64, 1),
            ];
            self.b.store(zero, block, at, None);
            self.b.end_for(vec![]);
            self.b.end_for(vec![]);
        }
        let (kb_loop, _) = self.b.begin_for(0, slices as i64, 1, &[]);
        let kb = first_slice.plus_scaled(1, &Affine::value(kb_loop));
        // This slice of the program's rows in strips: packed by a kernel
        // before, or here, strip by strip.
        let strips_at: Vec<Affine> = match &strips_from {
            Strips::Global(_, block) => vec![block.clone(), kb.clone()],
            Strips::InPlace => vec![],
            Strips::Own => {
                let dst = strip_buf.ok_or_else(|| self.invalid("no buffer of strips"))?;
                self.pack_strips(m, plan, &kb, i0, dst, &[])?;
                vec![]
            }
        };
        let parts = strip_loops(plan, false);
        let tiles = RegisterTiles {
            block,
            slices,
            tile_epilogue,
            zeros: [zero, last_zero],
        };
        let sources = |s: Value, rows: usize, nb: &Affine, group_at: Option<Value>| StepSources {
            strip_buf,
            strips_at: &strips_at,
            strip: s,
            rows,
            panels,
            panel_buf,
            group_at,
            bat,
            kb: kb.clone(),
            nb0,
            nb: nb.clone(),
            i0,
            ahead: strip_ahead.then_some(Ahead::Strip),
        };
        match &conv {
            Some(cv) => {
                // A group of panels copied from the input, then each panel.
                let (g, _) = self.b.begin_for(0, (per_chunk / cv.group) as i64, 1, &[]);
                if let Some(panel_buf) = panel_buf {
                    let g0 = chunk.scaled((per_chunk / cv.group) as i64);
                    // (A convolution's product is never split: `kb` is
                    // the loop's.)
                    self.copy_im2col_group(cv, plan, kb_loop, g, &g0, bat, panel_buf)?;
                }
                let (u, _) = self.b.begin_for(0, cv.group as i64, 1, &[]);
                let nb = Affine::value(g)
                    .scaled(cv.group as i64)
                    .plus_scaled(1, &Affine::value(u));
                for &(lo, hi, rows) in &parts {
                    let (s, _) = self.b.begin_for(lo as i64, hi as i64, 1, &[]);
                    self.register_tile(m, plan, &sources(s, rows, &nb, Some(u)), &tiles)?;
                    self.b.end_for(vec![]);
                }
                self.b.end_for(vec![]);
                self.b.end_for(vec![]);
            }
            None => {
                // This slice of panel `nb`, copied as the pack kernel would:
                // every panel of the chunk first (each at its own place),
                // or each just before its register tiles.
                let prefetch = panel_buf.is_some() && self.prefetches_panels(m)?;
                let copy = |c: &mut Self, nb: Value, at: &[Affine]| match panel_buf {
                    Some(panel_buf) => {
                        let j0 = nb0.plus_scaled(1, &Affine::value(nb)).scaled(nr as i64);
                        c.copy_panel_slice(m, &kb, j0, plan, panel_buf, at, prefetch)
                    }
                    None => Ok(()),
                };
                if strips_outer {
                    if panel_buf.is_some() {
                        let (nb, _) = self.b.begin_for(0, per_chunk as i64, 1, &[]);
                        copy(self, nb, &[Affine::value(nb)])?;
                        self.b.end_for(vec![]);
                    }
                    for &(lo, hi, rows) in &parts {
                        let (s, _) = self.b.begin_for(lo as i64, hi as i64, 1, &[]);
                        let (nb, _) = self.b.begin_for(0, per_chunk as i64, 1, &[]);
                        let group_at = panel_buf.map(|_| nb);
                        let nb = Affine::value(nb);
                        self.register_tile(m, plan, &sources(s, rows, &nb, group_at), &tiles)?;
                        self.b.end_for(vec![]);
                        self.b.end_for(vec![]);
                    }
                } else {
                    let (nb, _) = self.b.begin_for(0, per_chunk as i64, 1, &[]);
                    copy(self, nb, &[])?;
                    let nb = Affine::value(nb);
                    // With panels of weights, the first strip's tiles
                    // (a loop of their own) prefetch the next panel's
                    // slice or this panel's next one.
                    for (i, (lo, hi, rows)) in
                        strip_loops(plan, panel_ahead).into_iter().enumerate()
                    {
                        let (s, _) = self.b.begin_for(lo as i64, hi as i64, 1, &[]);
                        let mut src = sources(s, rows, &nb, None);
                        if panel_ahead && i == 0 {
                            src.ahead = Some(self.panel_ahead(plan, slices));
                        }
                        self.register_tile(m, plan, &src, &tiles)?;
                        self.b.end_for(vec![]);
                    }
                    self.b.end_for(vec![]);
                }
            }
        }
        self.b.end_for(vec![]);
        Ok((!tile_epilogue).then(|| Epilogue {
            m,
            block,
            i0: i0.clone(),
            nb0: nb0.clone(),
            rows: mc,
            panels: per_chunk,
            nr,
            mr,
            prefetch: 0,
        }))
    }

    /// The register tile of strip `o.strip` (its `o.rows` rows) by panel
    /// `o.nb` over the program's slice of the depth `o.kb`: from zero, or
    /// from the block's sums of the slices before; then into the block,
    /// or through the epilogue when the program runs it tile by tile.
    fn register_tile(
        &mut self,
        m: LOpId,
        plan: &PackPlan,
        o: &StepSources<'_>,
        t: &RegisterTiles,
    ) -> Result<(), TileConvError> {
        let (mr, nr, kc, rows) = (plan.mr, plan.nr, plan.kc, o.rows);
        let f32t = |shape: Vec<usize>| Type::Tile(TileType::new(DType::F32, shape));
        let at = vec![
            Affine::block(o.strip, mr as i64, 0),
            o.nb.scaled(nr as i64).plus_scaled(1, &Affine::axis(1)),
        ];
        let zero = t.zeros[usize::from(rows < mr)];
        let c0 = if t.slices > 1 {
            self.b
                .load(t.block, at.clone(), None, None, f32t(vec![rows, nr]))
        } else {
            zero
        };
        // A tile of fewer rows than `mr` has fewer chains of multiply-adds
        // than cover their latency: it sums the steps of the depth into
        // `mr / rows` tiles in turn, added at the end (a one-row tile's two
        // chains each waited on the last step: it took as long as four
        // rows).
        let (step, steps) = (plan.depth_step(), kc / plan.depth_step());
        let chains = (mr / rows).max(1);
        let unroll = (1..=plan.unroll.max(chains))
            .rev()
            .find(|u| steps.is_multiple_of(*u))
            .unwrap_or(1);
        let chains = chains.min(unroll);
        let mut init = vec![zero; chains];
        init[0] = c0;
        let (k, acc) = self.b.begin_for(0, steps as i64, unroll as i64, &init);
        let mut next = acc;
        self.prefetch_weights(plan, o, k, unroll);
        for u in 0..unroll {
            let ku = Affine::value(k).plus_scaled(1, &Affine::constant(u as i64));
            // This step of the depth (its first row, within the slice).
            let kr = ku.scaled(step as i64);
            let k0 = o.kb.scaled(kc as i64).plus_scaled(1, &kr);
            let ak = self.left_step(m, plan, o, &ku, &kr, &k0)?;
            let bk = self.right_step(m, plan, o, &ku, &k0)?;
            next[u % chains] = self.b.dot(ak, bk, next[u % chains]);
        }
        let sums = self.b.end_for(next);
        let sum = sums[1..]
            .iter()
            .fold(sums[0], |a, &b| self.b.binary(BinaryOp::Add, a, b));
        if t.tile_epilogue {
            let origin = vec![Affine::axis(0), Affine::axis(1)];
            self.b.store(sum, t.block, origin, None);
            self.epilogue(&Epilogue {
                m,
                block: t.block,
                i0: o.i0.plus_scaled(mr as i64, &Affine::value(o.strip)),
                nb0: o.nb0.plus_scaled(1, &o.nb),
                rows,
                panels: 1,
                nr,
                mr: rows,
                prefetch: self.params.packed.map_or(0, |p| p.epilogue_prefetch),
            })
        } else {
            self.b.store(sum, t.block, at, None);
            Ok(())
        }
    }

    /// Whether a program's register tiles over one slice of a panel, its
    /// `rows` rows by the slice's `kc x nr`, take at least as long as the
    /// slice's fetch from memory (`rows / macs_per_cycle >= 4 /
    /// memory_bytes_per_cycle`: 16 rows on Zen 4, 26 with two FMA units),
    /// so that a prefetch of the next panel's slice, issued by the first
    /// strip's tiles, arrives before the next panel's: GPT-2's block (128
    /// rows: Zen 4, one thread, 18.24 -> 17.88 ms) and 1 x 1 convolutions
    /// over 7 x 7 (49 rows). Fewer rows (a Winograd convolution's four
    /// tiles over 7 x 7, a linear layer's one row) take the same panel's
    /// next slice, a whole chunk of panels ahead: ResNet-18's layer-4
    /// products were 8-9% slower with the next panel's.
    fn tiles_outlast_fetch(&self, rows: usize) -> bool {
        self.params
            .target
            .cpu()
            .is_some_and(|c| rows * c.memory_bytes_per_cycle >= 4 * c.macs_per_cycle())
    }

    /// What the first strip's tiles of a program of `slices` slices of the
    /// depth prefetch of its panels of weights (see [`Ahead`]).
    fn panel_ahead(&self, plan: &PackPlan, slices: usize) -> Ahead {
        Ahead::Panel {
            next_panel: slices == 1 || (plan.per_chunk > 1 && self.tiles_outlast_fetch(plan.mc)),
        }
    }

    /// Whether the register tiles of product `m`'s programs prefetch its
    /// strips, and its panels: packed weights, which stream from memory
    /// rather than the caches (`Packing::weight_prefetch`; not in bf16
    /// pairs, whose strips are laid out row by row).
    fn weights_ahead(
        &self,
        m: LOpId,
        plan: &PackPlan,
        strips: &Strips,
        panels: Panels,
    ) -> [bool; 2] {
        let on = !plan.pairs && self.params.packed.is_some_and(|p| p.weight_prefetch);
        [
            on && matches!(strips, Strips::Global(..)) && self.weight_left_operand(m),
            on && matches!(panels, Panels::Global(_)) && self.weight_operand(m),
        ]
    }

    /// In the loop of a register tile's steps of the depth (`k`, `unroll`
    /// steps an iteration), the prefetches of `o.ahead`: the lines of the
    /// next strip (packed `[.., strip, kc, mr]`, contiguous across strips
    /// and slices of the depth) this iteration's steps would read, one per
    /// 64-byte line (past the last strip of a block they are the next
    /// block's, or outside the buffer: no error for a prefetch), into the
    /// L1; or the same rows of the next panel's slice or of this panel's
    /// next slice (`Ahead::Panel`), into the L2 (see
    /// `Packing::weight_prefetch`).
    fn prefetch_weights(&mut self, plan: &PackPlan, o: &StepSources<'_>, k: Value, unroll: usize) {
        let (mr, nr, step) = (plan.mr, plan.nr, plan.depth_step());
        match (o.ahead, o.strip_buf, o.panels) {
            (Some(Ahead::Strip), Some(strips), _) => {
                let per_line = (64 / (4 * mr)).max(1);
                for j in 0..(unroll * step).div_ceil(per_line) {
                    let mut at = o.strips_at.to_vec();
                    at.extend([
                        Affine::value(o.strip).plus_scaled(1, &Affine::constant(1)),
                        Affine::value(k).plus_scaled(1, &Affine::constant((j * per_line) as i64)),
                        Affine::constant(0),
                    ]);
                    self.b.prefetch(strips, at, vec![1, 1], 1);
                }
            }
            (Some(Ahead::Panel { next_panel }), _, Panels::Global(panels)) => {
                // The next panel (past a chunk's last, the next chunk's:
                // another program's, or past the buffer, no error for a
                // prefetch), or the same panel one slice deeper.
                let one = Affine::constant(1);
                let (kb, nb) = (o.kb.clone(), o.nb0.plus_scaled(1, &o.nb));
                let mut at = o.bat.to_vec();
                at.extend(if next_panel {
                    [kb, nb.plus_scaled(1, &one)]
                } else {
                    [kb.plus_scaled(1, &one), nb]
                });
                at.extend(plan.panel_at(&Affine::value(k).scaled(step as i64), [0, 1]));
                self.b.prefetch(panels, at, vec![unroll * step, nr], 2);
            }
            _ => {}
        }
    }

    /// The left operand's `mr x 1` column (or `mr x 2` pairs) at step
    /// `ku` of the depth (`kr` its first row within the slice, `k0` within
    /// the whole depth) of the strip the program is at.
    fn left_step(
        &mut self,
        m: LOpId,
        plan: &PackPlan,
        o: &StepSources<'_>,
        ku: &Affine,
        kr: &Affine,
        k0: &Affine,
    ) -> Result<Value, TileConvError> {
        let (op, c) = self.contraction(m)?;
        let body: &'a LBlock = &op.regions[0];
        let (iv, kv) = (body.args[0], body.args[2]);
        let (mr, rows) = (plan.mr, o.rows);
        let f32t = |shape: Vec<usize>| Type::Tile(TileType::new(DType::F32, shape));
        let packed_t = |shape: Vec<usize>| Type::Tile(TileType::new(plan.packed_dtype(), shape));
        Ok(match o.strip_buf {
            Some(strip_buf) if plan.pairs => {
                let mut at = o.strips_at.to_vec();
                at.extend([
                    Affine::value(o.strip),
                    Affine::axis(0),
                    kr.plus_scaled(1, &Affine::axis(1)),
                ]);
                self.b
                    .load(strip_buf, at, None, None, packed_t(vec![rows, 2]))
            }
            Some(strip_buf) => {
                let mut at = o.strips_at.to_vec();
                at.extend([
                    Affine::value(o.strip),
                    ku.plus_scaled(1, &Affine::axis(1)),
                    Affine::axis(0),
                ]);
                self.b.load(strip_buf, at, None, None, f32t(vec![rows, 1]))
            }
            None if plan.pairs => {
                return Err(self.invalid("bf16 pairs read from their own strips"));
            }
            None => {
                // Rows `mr * s..` of the block, this step of the depth.
                let row0 = o.i0.plus_scaled(mr as i64, &Affine::value(o.strip));
                let index = self.index_at(
                    &c.a,
                    [
                        (iv, row0.plus_scaled(1, &Affine::axis(0))),
                        (kv, k0.plus_scaled(1, &Affine::axis(1))),
                    ],
                )?;
                let (a, index) = self.place(op.operands[0], index)?;
                self.b.load(a, index, None, None, f32t(vec![rows, 1]))
            }
        })
    }

    /// The right operand's `step x nr` rows (`1 x nr` from the operand
    /// itself) at step `ku` of the depth (`k0` its first row within the
    /// whole depth) of the panel the program is at.
    fn right_step(
        &mut self,
        m: LOpId,
        plan: &PackPlan,
        o: &StepSources<'_>,
        ku: &Affine,
        k0: &Affine,
    ) -> Result<Value, TileConvError> {
        let (op, c) = self.contraction(m)?;
        let body: &'a LBlock = &op.regions[0];
        let (jv, kv) = (body.args[1], body.args[2]);
        let (nr, step, ragged) = (plan.nr, plan.depth_step(), plan.ragged);
        let f32t = |shape: Vec<usize>| Type::Tile(TileType::new(DType::F32, shape));
        let packed_t = |shape: Vec<usize>| Type::Tile(TileType::new(plan.packed_dtype(), shape));
        Ok(match (o.panels, o.panel_buf) {
            (_, Some(panel_buf)) => {
                let mut at: Vec<Affine> = o.group_at.map(Affine::value).into_iter().collect();
                at.extend(plan.panel_at(ku, [0, 1]));
                self.b
                    .load(panel_buf, at, None, None, packed_t(vec![step, nr]))
            }
            (Panels::Global(panels), None) => {
                let mut panel = o.bat.to_vec();
                panel.extend([o.kb.clone(), o.nb0.plus_scaled(1, &o.nb)]);
                panel.extend(plan.panel_at(ku, [0, 1]));
                self.b
                    .load(panels, panel, None, None, packed_t(vec![step, nr]))
            }
            (_, None) if plan.pairs => {
                return Err(self.invalid("bf16 pairs read from their own panels"));
            }
            (_, None) => {
                // Row `k` of the slice, this panel's columns, straight from
                // the operand (zeros past its edges, as in a panel).
                let j0 = o.nb0.plus_scaled(1, &o.nb).scaled(nr as i64);
                let index = self.index_at(
                    &c.b,
                    [
                        (kv, k0.plus_scaled(1, &Affine::axis(0))),
                        (jv, j0.plus_scaled(1, &Affine::axis(1))),
                    ],
                )?;
                let mask = ragged.then(|| {
                    self.b.mask(
                        vec![
                            Affine::constant(c.k).plus_scaled(-1, k0),
                            Affine::constant(c.n).plus_scaled(-1, &j0),
                        ],
                        &[1, nr],
                    )
                });
                let b = self.buffer(op.operands[1])?;
                self.b.load(b, index, mask, None, f32t(vec![1, nr]))
            }
        })
    }

    /// A packed product's epilogue over all of its block's rows, one row
    /// of a panel at a time (a `1 x nr` tile: the epilogue's code is
    /// written once for two vectors, not for the register tile's twelve),
    /// row by row: the block is read and the result written along their
    /// rows (panel by panel, each row of a panel was a different page of
    /// the result: W1 1024 spent 5.6% of its time here, 2.7% row by row).
    ///
    /// Where the result's rows are adjacent in memory and its columns are
    /// not (a 1 x 1 convolution computed with the pixels as rows, stored to
    /// `[channels, pixels]`), on a CPU whose register tile has at most
    /// `MAX_TILE_EPILOGUE_ROWS`, the epilogue runs on `mr x nr` tiles
    /// instead, a register tile's rows at a time: its store (and a
    /// residual's load) is then `nr` runs of `mr` elements transposed in
    /// registers, where a row's is a scatter (and a gather). Without mask
    /// registers (AVX2) a CPU scatters lane by lane (a quarter of
    /// EfficientNet-B0's 7 x 7 expansion with SiLU); Zen 4 has the
    /// instructions but runs them slowly: ResNet-50's 512 -> 2048 over 7 x
    /// 7 with its residual and ReLU, cut out, one thread, alternated with
    /// onnxruntime, 1.18 -> 1.06 ms warm, 1.35 -> 1.22 with the caches
    /// evicted (onnxruntime 1.01 and 1.17). So too, whatever the store's
    /// layout, where the epilogue has a long-latency op
    /// (`long_latency_epilogue`). Tiles of more rows (AVX-512 with two FMA
    /// units: 14) keep the rows, but for a last strip of the rows left that
    /// has at most as many (49 pixels: 3 strips of 14, then a 7-row tile).
    pub(super) fn epilogue(&mut self, e: &Epilogue) -> Result<(), TileConvError> {
        if e.mr <= MAX_TILE_EPILOGUE_ROWS
            && e.rows.is_multiple_of(e.mr)
            && self.row_factors.is_none()
            && self.params.target.cpu().is_some()
            && (self.stores_along_rows(e.m)? || self.long_latency_epilogue(e.m)?)
        {
            if e.rows == e.mr {
                return self.epilogue_rows(e, EpilogueRows::Tile(Affine::constant(0)));
            }
            let (s, _) = self.b.begin_for(0, (e.rows / e.mr) as i64, 1, &[]);
            let first = Affine::value(s).scaled(e.mr as i64);
            self.epilogue_rows(e, EpilogueRows::Tile(first))?;
            self.b.end_for(vec![]);
            return Ok(());
        }
        let (r, _) = self.b.begin_for(0, e.rows as i64, 1, &[]);
        self.epilogue_row(e, r)?;
        self.b.end_for(vec![]);
        Ok(())
    }

    /// Whether product `m`'s epilogue has a long-latency op (a sigmoid, a
    /// SiLU, a division: `UnaryOp::is_long_latency`). On a whole `mr x nr`
    /// tile its chains are `mr` times as many, independent, where a row's
    /// two or so vectors left the out-of-order window waiting on one
    /// (EfficientNet-B0's SiLU epilogues; short ones, a clamp or a
    /// hardswish, were slower on whole tiles).
    fn long_latency_epilogue(&self, m: LOpId) -> Result<bool, TileConvError> {
        let (op, _) = self.contraction(m)?;
        Ok(op.regions[0].ops.iter().any(|&o| match &self.op(o).kind {
            L::Unary(u) => u.is_long_latency(),
            L::Binary(b) => b.is_long_latency(),
            _ => false,
        }))
    }

    /// Whether product `m`'s epilogue stores its result with unit stride
    /// along the rows and not along the columns.
    fn stores_along_rows(&self, m: LOpId) -> Result<bool, TileConvError> {
        let (op, _) = self.contraction(m)?;
        let body: &'a LBlock = &op.regions[0];
        let (iv, jv) = (body.args[0], body.args[1]);
        let stores: Vec<_> = body
            .ops
            .iter()
            .filter_map(|&o| match &self.op(o).kind {
                L::Store { index } => Some((self.op(o).operands[1], index)),
                _ => None,
            })
            .collect();
        Ok(!stores.is_empty()
            && stores.iter().all(|&(buf, index)| {
                self.unit_stride(buf, index, iv) && !self.unit_stride(buf, index, jv)
            }))
    }

    /// A packed product's epilogue on row `r` of its block.
    pub(super) fn epilogue_row(&mut self, e: &Epilogue, r: Value) -> Result<(), TileConvError> {
        self.epilogue_rows(e, EpilogueRows::One(r))
    }

    /// A packed product's epilogue on one row of its block, or on `mr` rows
    /// as one tile.
    fn epilogue_rows(&mut self, e: &Epilogue, at: EpilogueRows) -> Result<(), TileConvError> {
        let (op, c) = self.contraction(e.m)?;
        let body: &'a LBlock = &op.regions[0];
        let (iv, jv, kv, accv) = (body.args[0], body.args[1], body.args[2], body.args[3]);
        let nr = e.nr;
        let (first, row, rows, r) = match at {
            EpilogueRows::One(r) => (Affine::value(r), Affine::value(r), 1, Some(r)),
            EpilogueRows::Tile(first) => {
                let row = first.plus_scaled(1, &Affine::axis(0));
                (first, row, e.mr, None)
            }
        };
        let (nb, _) = self.b.begin_for(0, e.panels as i64, 1, &[]);
        let sum = self.b.load(
            e.block,
            vec![row, Affine::block(nb, nr as i64, 1)],
            None,
            None,
            Type::Tile(TileType::new(DType::F32, vec![rows, nr])),
        );
        let row0 = e.i0.plus_scaled(1, &first);
        let col0 = e.nb0.plus_scaled(1, &Affine::value(nb)).scaled(nr as i64);
        self.index.insert(iv, row0.plus_scaled(1, &Affine::axis(0)));
        self.index.insert(jv, col0.plus_scaled(1, &Affine::axis(1)));
        self.index.insert(kv, Affine::constant(0));
        let sum = match (self.row_factors, r) {
            (Some(buf), Some(r)) => {
                let c = self.b.load(
                    buf,
                    vec![Affine::value(r)],
                    None,
                    None,
                    Type::Scalar(DType::F32),
                );
                let c = self.b.splat(c, &[1, nr]);
                self.b.binary(BinaryOp::Mul, sum, c)
            }
            (Some(_), None) => return Err(self.invalid("row factors on a whole tile's epilogue")),
            (None, _) => sum,
        };
        if e.prefetch > 0 {
            self.prefetch_ahead(e, body, rows, &col0)?;
        }
        let rows_ahead = self.params.packed.map_or(0, |p| p.result_rows_ahead);
        if rows_ahead > 0 {
            self.prefetch_rows_ahead(e.nr, rows_ahead, body, rows, &row0, &col0)?;
        }
        self.values.insert(accv, sum);
        self.shape = vec![rows, nr];
        self.splats.clear();
        self.mask = Some(self.b.mask(
            vec![
                Affine::constant(c.m).plus_scaled(-1, &row0),
                Affine::constant(c.n).plus_scaled(-1, &col0),
            ],
            &[rows, nr],
        ));
        let result = self.ops(&body.ops);
        self.leave_tiles();
        result?;
        self.b.end_for(vec![]);
        Ok(())
    }

    /// Prefetches, for the epilogue of a register tile whose columns start
    /// at `col0`, the lines of the same rows `e.prefetch` panels to the
    /// right in every buffer the epilogue reads or writes along both axes
    /// (its result, a residual): the tile that many ahead where a program
    /// walks each strip across its panels, the same strip that many passes
    /// ahead where it walks each panel across its strips. The result's lines are
    /// otherwise fetched by the store itself (a 1 x 1 convolution's tile is
    /// a line of each of `mr` rows a row's width apart, streams the hardware
    /// prefetchers do not follow) and the residual's by its load. The
    /// epilogue's column index (`self.index` of `jv`) is left at the tile's
    /// own, `col0` on.
    fn prefetch_ahead(
        &mut self,
        e: &Epilogue,
        body: &'a LBlock,
        rows: usize,
        col0: &Affine,
    ) -> Result<(), TileConvError> {
        let (iv, jv) = (body.args[0], body.args[1]);
        let ahead = col0.plus_scaled((e.prefetch * e.nr) as i64, &Affine::constant(1));
        self.index
            .insert(jv, ahead.plus_scaled(1, &Affine::axis(1)));
        // Lines along the columns (a line of every `nr` columns, not one
        // per element of a result stored along its rows).
        let result = self.prefetch_lines(body, &[rows, e.nr], |c, buf, index| {
            moves_with(index, iv) && c.unit_stride(buf, index, jv)
        });
        self.index.insert(jv, col0.plus_scaled(1, &Affine::axis(1)));
        result
    }

    /// In the epilogue `body`, prefetches a `shape` tile at the index
    /// (under `self.index`) of every load and store that `reads` accepts
    /// (given its buffer and index), in memory every program sees (a
    /// program's scratch, a Winograd convolution's products, stays in its
    /// caches).
    fn prefetch_lines(
        &mut self,
        body: &'a LBlock,
        shape: &[usize],
        reads: impl Fn(&Self, LValue, &[IndexExpr]) -> bool,
    ) -> Result<(), TileConvError> {
        for &o in &body.ops {
            let op = self.op(o);
            let (buf, index) = match &op.kind {
                L::Load { index, .. } => (op.operands[0], index),
                L::Store { index } => (op.operands[1], index),
                _ => continue,
            };
            if !reads(self, buf, index) {
                continue;
            }
            let index: Vec<Affine> = index
                .iter()
                .map(|x| self.affine(x))
                .collect::<Result<_, _>>()?;
            let (buf, index) = self.place(buf, index)?;
            if matches!(self.b.ty(buf), Type::Buffer(t) if t.space == Space::Global) {
                self.b.prefetch(buf, index, shape.to_vec(), 1);
            }
        }
        Ok(())
    }

    /// Prefetches, for the epilogue of `rows` rows from `row0` of a block
    /// whose `nr` columns start at `col0`, the lines of a result stored
    /// along its rows (a 1 x 1 convolution's with its pixels as the rows:
    /// each column a run of pixels, a row's width apart) `ahead` rows
    /// further (`Packing::result_rows_ahead`): a line of each column's run, which
    /// the stores of the rows before would otherwise fetch one by one,
    /// each column's from memory where the result is cold. The index is
    /// left at `row0`, `col0` on.
    fn prefetch_rows_ahead(
        &mut self,
        nr: usize,
        ahead: usize,
        body: &'a LBlock,
        rows: usize,
        row0: &Affine,
        col0: &Affine,
    ) -> Result<(), TileConvError> {
        let (iv, jv) = (body.args[0], body.args[1]);
        let ahead = row0.plus_scaled(ahead as i64, &Affine::constant(1));
        // The tile transposed: its columns are the prefetch's rows, each
        // a run along the result's rows (a line or two, not an element's).
        self.index
            .insert(iv, ahead.plus_scaled(1, &Affine::axis(1)));
        self.index.insert(jv, col0.plus_scaled(1, &Affine::axis(0)));
        // Only buffers with a run for each column: a vector along the rows
        // (a convolution's bias, its channels the rows) is one run, in
        // cache, and was prefetched once per column of the tile, the same
        // address `nr` times (30 of a 6 x 32 tile's epilogue's 45
        // instructions a row over 56 x 56, 64 deep).
        let result = self.prefetch_lines(body, &[nr, rows], |c, buf, index| {
            c.unit_stride(buf, index, iv) && moves_with(index, jv) && !c.unit_stride(buf, index, jv)
        });
        self.index.insert(iv, row0.plus_scaled(1, &Affine::axis(0)));
        self.index.insert(jv, col0.plus_scaled(1, &Affine::axis(1)));
        result
    }

    /// Copies slice `kb` (`kc` deep) of the `nr` columns from `j0` of
    /// product `m`'s right operand to `dst[prefix.., k, j]`, `kk` steps of
    /// the depth per copy, zeros past the operand's edges where the plan is
    /// ragged, as the plan's panels hold them (f32; or bf16 in pairs,
    /// `dst[prefix.., k / 2, j, k % 2]`, a pair per copy). With `prefetch`,
    /// each copy also prefetches the same rows of the next `nr` columns
    /// (the next panel's slice: see [`Self::prefetches_panels`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_panel_slice(
        &mut self,
        m: LOpId,
        kb: &Affine,
        j0: Affine,
        plan: &PackPlan,
        dst: Value,
        prefix: &[Affine],
        prefetch: bool,
    ) -> Result<(), TileConvError> {
        let (kc, nr, ragged) = (plan.kc, plan.nr, plan.ragged);
        let kk = plan.panel_copy_depth();
        let (op, c) = self.contraction(m)?;
        let body: &'a LBlock = &op.regions[0];
        let (jv, kv) = (body.args[1], body.args[2]);
        let b = self.buffer(op.operands[1])?;
        let (f, _) = self.b.begin_for(0, (kc / kk) as i64, 1, &[]);
        let k0 = kb
            .scaled(kc as i64)
            .plus_scaled(kk as i64, &Affine::value(f));
        let next = j0.plus_scaled(1, &Affine::constant(nr as i64));
        let (b_index, limits, shape, [ka, ja]) = self.operand_block(
            op.operands[1],
            &c.b,
            [(kv, k0.clone(), c.k, kk), (jv, j0, c.n, nr)],
        )?;
        let mask = ragged.then(|| self.b.mask(limits, &shape));
        let t = self.load_as(
            op.operands[1],
            (b, b_index),
            mask,
            shape.clone(),
            plan.packed_dtype(),
        );
        if prefetch {
            let (next_index, ..) = self.operand_block(
                op.operands[1],
                &c.b,
                [(kv, k0, c.k, kk), (jv, next, c.n, nr)],
            )?;
            self.b.prefetch(b, next_index, shape, 1);
        }
        let mut at = prefix.to_vec();
        let step = Affine::value(f).scaled((kk / plan.depth_step()) as i64);
        at.extend(plan.panel_at(&step, [ka, ja]));
        self.b.store(t, dst, at, None);
        self.b.end_for(vec![]);
        Ok(())
    }

    /// Whether the programs of packed product `m`, each copying its own
    /// panels, prefetch the next panel's slice as they copy one
    /// (`tile.prefetch`): where the right operand is contiguous along the
    /// columns and not along the depth (a slice of a panel is then a run
    /// from each of `kc` rows far apart: a 1 x 1 convolution's input, a
    /// line of each channel's plane) and larger than the L2, so that the
    /// copies read from beyond it, as many streams as the slice is deep,
    /// more than the hardware prefetchers follow. MobileNetV2's projections
    /// over 56 x 56 and 112 x 112 took 15-25% less in the model (their
    /// copies had been a third of their time); those whose input fits the
    /// L2 gained nothing.
    pub(super) fn prefetches_panels(&self, m: LOpId) -> Result<bool, TileConvError> {
        let Some(p) = self.params.packed.as_ref() else {
            return Ok(false);
        };
        let (op, c) = self.contraction(m)?;
        let body: &'a LBlock = &op.regions[0];
        let (jv, kv) = (body.args[1], body.args[2]);
        let b = op.operands[1];
        let bytes = self.operand_dtype(b).map_or(4, |d| d.size_bytes()) as i64 * c.k * c.n;
        Ok(p.l2_bytes > 0
            && bytes > p.l2_bytes as i64
            && self.unit_stride(b, &c.b, jv)
            && !self.unit_stride(b, &c.b, kv))
    }

    /// A block of a product's operand `buf` (read at `index`) to copy: for
    /// each of its two counters, the counter, the block's first value of
    /// it, the counter's extent and the block's size along it. The copy's
    /// tile axes follow the counters, or go the other way round when the
    /// operand is contiguous along the first counter and not the second
    /// (so that the tile's rows, along its last axis, are contiguous runs).
    /// Returns the tile's index into `buf`, its mask limits, its shape, and
    /// the tile axis each counter took.
    #[allow(clippy::type_complexity)]
    pub(super) fn operand_block(
        &mut self,
        buf: LValue,
        index: &[IndexExpr],
        counters: [(LValue, Affine, i64, usize); 2],
    ) -> Result<(Vec<Affine>, Vec<Affine>, Vec<usize>, [usize; 2]), TileConvError> {
        let flip = self.unit_stride(buf, index, counters[0].0)
            && !self.unit_stride(buf, index, counters[1].0);
        let axes = if flip { [1, 0] } else { [0, 1] };
        let mut limits = vec![Affine::default(); 2];
        let mut shape = vec![0; 2];
        for ((var, first, extent, size), axis) in counters.into_iter().zip(axes) {
            self.index
                .insert(var, first.plus_scaled(1, &Affine::axis(axis)));
            limits[axis] = Affine::constant(extent).plus_scaled(-1, &first);
            shape[axis] = size;
        }
        let tile_index = index
            .iter()
            .map(|e| self.affine(e))
            .collect::<Result<_, _>>()?;
        Ok((tile_index, limits, shape, axes))
    }

    /// Whether each program of packed product `m` (of `blocks` blocks of
    /// rows) packs the panels it multiplies by itself, one at a time into
    /// scratch memory, rather than a kernel packing every panel into a
    /// global buffer first: with one block of rows each panel serves one
    /// program, so the global panels would be written and read back for
    /// nothing (W2's two 16 MB weights, W6's 28 MB). Not when another
    /// product reads the same operand: their pack kernels become one
    /// (`reuse_packs`: W7's 32 steps pack each weight once). Storage the
    /// function writes holds one value after another (the lowering reuses
    /// it), so there the same operand is the same value, not the same
    /// storage: MobileNetV2's 1 x 1 convolutions, whose inputs share
    /// buffers, packed 1.6 MB into global panels and read them back.
    pub(super) fn packs_own_panels(&self, m: LOpId, blocks: usize) -> bool {
        let operand = self.op(m).operands[1];
        let root = self.root_buffer(operand);
        let written =
            self.src.ops.iter().any(|o| {
                matches!(o.kind, L::Store { .. }) && self.root_buffer(o.operands[1]) == root
            });
        let readers = self
            .src
            .ops
            .iter()
            .filter(|o| matches!(o.kind, L::Matmul(_)))
            .filter(|o| {
                o.operands.get(1).is_some_and(|&b| {
                    if written {
                        b == operand
                    } else {
                        self.root_buffer(b) == root
                    }
                })
            })
            .count();
        blocks == 1 && readers == 1
    }

    /// Whether the right operand of product `m` depends on weights alone
    /// (a weight parameter, or a buffer computed from weights, through
    /// views): its panels are packed by a kernel of their own, which reads
    /// nothing else and so can run once, when the weights are bound (see
    /// `dlc_tile::transforms::split_prepare`).
    pub(super) fn weight_operand(&self, m: LOpId) -> bool {
        let root = self.root_buffer(self.op(m).operands[1]);
        self.weight_derived.contains(&root)
    }

    /// Whether the left operand of product `m` depends on weights alone (a
    /// convolution's kernel `w [O, C*KH*KW]`): its strips are packed by a
    /// kernel of their own, which runs once, when the weights are bound.
    pub(super) fn weight_left_operand(&self, m: LOpId) -> bool {
        let root = self.root_buffer(self.op(m).operands[0]);
        self.weight_derived.contains(&root)
    }

    /// The 64-byte lines between consecutive rows of product `m`'s right
    /// operand where it can be read in place: f32, contiguous along the
    /// columns, its rows a whole number of lines apart.
    fn right_row_lines(&self, m: LOpId) -> Option<u64> {
        let op = self.op(m);
        let L::Matmul(c) = &op.kind else {
            return None;
        };
        let body = &op.regions[0];
        let (jv, kv) = (body.args[1], body.args[2]);
        let b = op.operands[1];
        let row_bytes = self.step(b, &c.b, kv)?.unsigned_abs() * 4;
        (self.operand_dtype(b) == Some(DType::F32)
            && self.unit_stride(b, &c.b, jv)
            && row_bytes > 0
            && row_bytes % 64 == 0)
            .then_some(row_bytes / 64)
    }

    /// Whether packed product `m` (of `blocks` blocks of rows) reads its
    /// right operand in place: one block of rows, the operand contiguous
    /// along the columns, and its rows a number of 64-byte lines apart
    /// coprime with the L1's sets (see [`Packing::l1_sets`]).
    pub(super) fn reads_in_place(&self, m: LOpId, blocks: usize, sets: usize) -> bool {
        blocks == 1
            && sets > 0
            && self
                .right_row_lines(m)
                .is_some_and(|lines| gcd(lines, sets as u64) == 1)
    }

    /// Whether product `m` under `plan`, one block of at most
    /// `Packing::in_place_rows` rows, reads its right operand in place
    /// rather than its programs copying their panels: not an im2col buffer
    /// read from the input, the operand's rows whole lines apart, and a
    /// slice's `kc` rows, `lines` apart, falling in `sets / gcd(lines,
    /// sets)` of the L1's sets, each taking at most twice its ways of them.
    /// A set's overflow is read again from the L2 by each strip (at most
    /// four, of 6 rows), which costs less than the copy: on Zen 4,
    /// MobileNetV2's and EfficientNet-B0's 144 -> 24 over 56 x 56 (rows
    /// 196 lines apart, 9 of a slice's 144 to a set of 8 ways) read in
    /// place took MobileNetV2 6.85 -> 6.75 ms at one thread (`p25`,
    /// alternated), 3.67 -> 3.58 at two. A slice of 32 rows in one set
    /// (rows a multiple of 64 lines apart) still copies.
    pub(super) fn few_rows_read_in_place(
        &self,
        m: LOpId,
        plan: &PackPlan,
    ) -> Result<bool, TileConvError> {
        let Some(p) = self.params.packed else {
            return Ok(false);
        };
        let (_, c) = self.contraction(m)?;
        let sets = p.l1_sets as u64;
        Ok(plan.blocks == 1
            && (c.m.max(1) as usize) <= p.in_place_rows
            && sets > 0
            && !self.convs.contains_key(&m)
            && self.right_row_lines(m).is_some_and(|lines| {
                plan.kc as u64 * gcd(lines, sets) / sets <= 2 * p.l1_ways as u64
            }))
    }
}
