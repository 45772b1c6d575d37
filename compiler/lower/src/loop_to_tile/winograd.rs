//! A Winograd convolution as one kernel over blocks of tile rows.
//!
//! Graph-to-loop lowers a Winograd convolution (see `graph_to_loop`'s
//! `winograd` module) to an input transform writing `V[36, tiles, C]`, 36
//! packed products `M[p] = V[p] @ U[p]`, and an output transform reading
//! `M[36, tiles, O]`; the transforms are nests over the images and rows of
//! tiles around a loop over the tiles of a row. Run as three kernels, `V`
//! and `M` go to memory and back (29 MB at W3's batch 8). Here each
//! program takes a block of whole tile rows of one image, and runs the
//! input transform on them into a scratch copy of its rows of `V`, the 36
//! products of those rows into a scratch copy of its rows of `M`, and the
//! output transform on them: `V` and `M` are never allocated, and a
//! program's rows of them stay in its core's L2.
//!
//! # The schedule
//!
//! - `winograd` (CPU targets with packing; `loop_to_tile/winograd.rs`): a Winograd
//!   convolution's three nests (`graph_to_loop::winograd`) as one kernel over blocks of tile rows. The
//!   conversion recognises them by their shape: an input transform over images and rows
//!   of tiles storing only into `V` at `[point, tile, ..]`, tile `n * rows * cols + ty *
//!   cols + tx` of its own loops; a packed product in a loop over the points reading `V[p,
//!   i, k]` and storing only `M[p, i, j]`; an output transform over the same tiles reading
//!   `M` at its own tile; `V` and `M` the function's own allocations, used nowhere else;
//!   and nothing the output transform writes read by the other two (programs run
//!   concurrently). The grid is the images and blocks of whole tile rows (as many rows as
//!   keep a program's rows of `V` and `M` within half the L2, `Packing::l2_bytes`, and
//!   within the blocking's rows: 2 rows of 14 tiles on W3); each program runs the input
//!   transform on its rows into a scratch `[36, rows, C]` (`Redirect`, as `fused` does),
//!   then for each of the 36 points the packed product's program body on those rows (its
//!   strips packed from scratch, `U`'s panels from their pack kernel, the preparer's for
//!   declared weights) into a scratch `[36, rows, O]`, then the output transform. `V` and
//!   `M` are not allocated. A kernel of fewer programs than the target's units runs on one
//!   thread, so blocks take fewer rows where that gives the threads work: W3 b1 runs one
//!   row of 14 tiles per program (14 programs; three strips of 6 rows, 18 computed for
//!   14). Where the transformed kernel `U` does not fit the L2 and reading it again
//!   for each block takes longer than the block's products (`rereads_are_slow`, from the
//!   target's bytes a cycle from its L3 and memory: ResNet's 14 x 14 and 28 x 28 stages on
//!   Intel's server cores, its 7 x 7 stage at 512 channels, a 38 MB `U`, on Zen 4), every
//!   block of rows would read all of it: there a block takes the blocking's rows and the
//!   programs take chunks of the output channels instead (a third grid axis; whole panels
//!   and whole groups of the output transform's channel loop, which each program runs over
//!   its chunk's groups through `Conv::ranges`), each reading its share of `U` and
//!   transforming its rows' input again. A product of at most one vector of columns (16
//!   output channels: the `narrow` schedule) is not fused.

use std::collections::HashSet;

use dlc_core::DType;
use dlc_loop::{IndexExpr, OpId as LOpId, OpKind as L, Type as LType, Value as LValue};
use dlc_tile::{Affine, BufferType, Schedule, Space};

use super::{
    Conv, Packing, Panels, Redirect, TileConvError, TileEpilogue, is_counter, is_parallel,
    loop_bounds,
};

/// A Winograd convolution's three nests, fused (see the module).
#[derive(Clone, Debug)]
pub(super) struct WinogradFusion {
    /// Each transform's loops over the images and over the rows of tiles
    /// (the row loop's body, the loop over a row's tiles, is converted as
    /// it stands).
    input: [LOpId; 2],
    output: [LOpId; 2],
    /// The products' loop over the 36 points, and the product.
    batch: LOpId,
    product: LOpId,
    /// Images, rows of tiles, tiles per row.
    tiles: [usize; 3],
    /// Rows of tiles per program.
    rows: usize,
    /// Chunks of the output channels (programs along the grid's third
    /// axis), and the output transform's loop over groups of channels
    /// with its extent, which a program runs over its chunk's groups.
    chunks: usize,
    channel_groups: Option<(LOpId, usize)>,
    /// `V` and `M`, held in scratch memory (never allocated).
    pub(super) held: [LValue; 2],
}

/// Whether `e` is `n * rows * cols + ty * cols + tx`: the flat index of
/// tile `(n, ty, tx)`.
fn tile_index(e: &IndexExpr, [n, ty, tx]: [LValue; 3], [_, rows, cols]: [usize; 3]) -> bool {
    let mut want = vec![((rows * cols) as i64, n), (cols as i64, ty), (1, tx)];
    let mut got = e.terms.clone();
    want.sort_by_key(|t| (t.1.0, t.0));
    got.sort_by_key(|t| (t.1.0, t.0));
    e.constant == 0 && got == want
}

impl<'a> Conv<'a> {
    /// A nest over images and rows of tiles (two parallel loops from 0)
    /// around a sequential loop over a row's tiles with no carried
    /// values: its image, row and tile loops and their extents.
    fn tile_nest(&self, id: LOpId) -> Option<([LOpId; 3], [usize; 3])> {
        let extent = |o: LOpId| match loop_bounds(&self.op(o).kind) {
            Some((0, hi, 1)) if hi > 0 => Some(hi as usize),
            _ => None,
        };
        let n = self.op(id);
        let [ty] = n.regions.first()?.ops[..] else {
            return None;
        };
        let [tx] = self.op(ty).regions.first()?.ops[..] else {
            return None;
        };
        let txo = self.op(tx);
        let shaped = is_parallel(&n.kind)
            && is_parallel(&self.op(ty).kind)
            && matches!(txo.kind, L::For { .. })
            && txo.operands.is_empty()
            && txo.results.is_empty();
        shaped.then_some(())?;
        Some(([id, ty, tx], [extent(id)?, extent(ty)?, extent(tx)?]))
    }

    fn counters(&self, loops: [LOpId; 3]) -> [LValue; 3] {
        loops.map(|l| self.op(l).regions[0].args[0])
    }

    /// The nests at `top[i]` and after as graph-to-loop lowers a Winograd
    /// convolution, fused when: the input transform stores only into `V`,
    /// at `[point, tile, ..]` for its own tile; a packed product in a loop
    /// over the points reads `V[p, i, k]` and stores only into `M[p, i,
    /// j]`; the output transform, over the same tiles, reads `M` at its own
    /// tile and neither `V` nor what the others read is written by it (its
    /// programs run while others still read); `V` and `M` are the
    /// function's own allocations, used nowhere else. Returns the fusion
    /// and the index of the output transform's nest.
    pub(super) fn winograd_fusion(
        &self,
        top: &[LOpId],
        i: usize,
        cuts: &[bool],
    ) -> Option<(WinogradFusion, usize)> {
        let packing = self.params.packed?;
        let (input, tiles) = self.tile_nest(top[i])?;
        let at_in = self.counters(input);
        let mentions_tile =
            |e: &IndexExpr, c: &[LValue; 3]| e.terms.iter().any(|t| c.contains(&t.1));
        let mut in_ops = HashSet::new();
        self.nested_ops(top[i], &mut in_ops);
        let mut v = None;
        let mut read_in: HashSet<LValue> = HashSet::new();
        for &o in &in_ops {
            let d = self.op(o);
            match &d.kind {
                L::Matmul(_) => return None,
                L::Store { index } => {
                    let ok = index.len() == 3
                        && !mentions_tile(&index[0], &at_in)
                        && tile_index(&index[1], at_in, tiles)
                        && v.is_none_or(|v| v == d.operands[1]);
                    ok.then_some(())?;
                    v = Some(d.operands[1]);
                }
                L::Load { .. } => {
                    read_in.insert(self.root_buffer(d.operands[0]));
                }
                _ => {}
            }
        }
        let v = v?;
        // The products.
        let k = self.next_nest(top, i)?;
        let batch = top[k];
        let bop = self.op(batch);
        let [m] = bop.regions.first()?.ops[..] else {
            return None;
        };
        let L::Matmul(c) = &self.op(m).kind else {
            return None;
        };
        let points = match (is_parallel(&bop.kind), loop_bounds(&bop.kind)) {
            (true, Some((0, hi, 1))) if hi > 0 => hi as usize,
            _ => return None,
        };
        let p = bop.regions[0].args[0];
        let mop = self.op(m);
        let e = &mop.regions[0];
        let (iv, jv, kv) = (e.args[0], e.args[1], e.args[2]);
        let total = tiles.iter().product::<usize>();
        if !self.packs_wide(m)
            || mop.operands[0] != v
            || mop.operands[1] == v
            || c.m as usize != total
            || c.a.len() != 3
            || ![p, iv, kv]
                .iter()
                .zip(&c.a)
                .all(|(var, e)| is_counter(e, *var))
        {
            return None;
        }
        let mut mm = None;
        let mut read_product: HashSet<LValue> = HashSet::new();
        read_product.insert(self.root_buffer(mop.operands[1]));
        let mut product_ops = HashSet::new();
        self.nested_ops(m, &mut product_ops);
        for &o in &product_ops {
            let d = self.op(o);
            match &d.kind {
                L::Store { index } => {
                    let ok = index.len() == 3
                        && [p, iv, jv]
                            .iter()
                            .zip(index)
                            .all(|(var, e)| is_counter(e, *var))
                        && mm.is_none_or(|mm| mm == d.operands[1]);
                    ok.then_some(())?;
                    mm = Some(d.operands[1]);
                }
                L::Load { .. } => {
                    read_product.insert(self.root_buffer(d.operands[0]));
                }
                L::For { .. } | L::Parallel { .. } | L::Matmul(_) => return None,
                _ => {}
            }
        }
        let mm = mm?;
        if mm == v || mop.operands[1] == mm {
            return None;
        }
        // The output transform, over the same tiles (past V's release).
        let k2 = (k + 1..top.len()).find(|&j| {
            let d = self.op(top[j]);
            match d.kind {
                L::Alloc | L::View | L::Const(_) => false,
                L::Dealloc => d.operands != [v],
                _ => true,
            }
        })?;
        let (output, out_tiles) = self.tile_nest(top[k2])?;
        if out_tiles != tiles {
            return None;
        }
        let at_out = self.counters(output);
        let mut out_ops = HashSet::new();
        self.nested_ops(top[k2], &mut out_ops);
        let mut written_out: HashSet<LValue> = HashSet::new();
        for &o in &out_ops {
            let d = self.op(o);
            match &d.kind {
                L::Matmul(_) => return None,
                L::Load { index, .. } if d.operands[0] == mm => {
                    let ok = index.len() == 3
                        && !mentions_tile(&index[0], &at_out)
                        && tile_index(&index[1], at_out, tiles);
                    ok.then_some(())?;
                }
                L::Load { .. } if d.operands[0] == v => return None,
                L::Store { .. } => {
                    let root = self.root_buffer(d.operands[1]);
                    if d.operands[1] == v || d.operands[1] == mm {
                        return None;
                    }
                    written_out.insert(root);
                }
                _ => {}
            }
        }
        if written_out
            .iter()
            .any(|w| read_in.contains(w) || read_product.contains(w))
            || !cuts[i]
            || !cuts[k2 + 1]
        {
            return None;
        }
        // V and M: f32, [points, tiles, ..], allocated here and used by the
        // three nests (and their deallocations) alone.
        let shaped = |b: LValue| match self.src.ty(b) {
            LType::Buffer(t) => {
                t.dtype == DType::F32
                    && t.shape.len() == 3
                    && t.shape[..2] == [points, total]
                    && t.is_contiguous()
            }
            _ => false,
        };
        let allocated = |b: LValue| {
            top.iter()
                .any(|&o| matches!(self.op(o).kind, L::Alloc) && self.op(o).results == [b])
        };
        if !shaped(v) || !shaped(mm) || !allocated(v) || !allocated(mm) {
            return None;
        }
        let mut allowed: HashSet<LOpId> = in_ops;
        allowed.extend(product_ops);
        allowed.extend(out_ops);
        allowed.insert(m);
        for (id, op) in self.src.ops.iter().enumerate() {
            let id = LOpId(id as u32);
            let uses = op.operands.iter().any(|&b| b == v || b == mm);
            if uses && !allowed.contains(&id) && !matches!(op.kind, L::Dealloc) {
                return None;
            }
        }
        let out_channels = match self.src.ty(mm) {
            LType::Buffer(t) => t.shape[2],
            _ => return None,
        };
        let channel_groups = self.channel_groups(output[2], out_channels);
        let (rows, chunks) = self.winograd_rows(
            &packing,
            tiles,
            points,
            [v, mm],
            channel_groups.map(|g| g.1),
        );
        Some((
            WinogradFusion {
                input: [input[0], input[1]],
                output: [output[0], output[1]],
                batch,
                product: m,
                tiles,
                rows,
                chunks,
                channel_groups,
                held: [v, mm],
            },
            k2,
        ))
    }

    /// The output transform's loop over groups of its `channels`, the only
    /// op in its loop over a row's tiles (`tx`), and its extent: counted
    /// from 0 by 1, around one loop over a group's channels (the lanes),
    /// the two covering the channels. `None` when the channels are one
    /// loop.
    fn channel_groups(&self, tx: LOpId, channels: usize) -> Option<(LOpId, usize)> {
        let [group] = self.op(tx).regions.first()?.ops[..] else {
            return None;
        };
        let g = self.op(group);
        let Some((0, hi, 1)) = loop_bounds(&g.kind) else {
            return None;
        };
        let [lanes] = g.regions.first()?.ops[..] else {
            return None;
        };
        let covers = match loop_bounds(&self.op(lanes).kind) {
            Some((0, n, 1)) => (hi * n) as usize == channels,
            _ => false,
        };
        (matches!(g.kind, L::For { .. }) && g.operands.is_empty() && covers)
            .then_some((group, hi as usize))
    }

    /// How many whole rows of tiles (of `tiles`: images, rows, columns) a
    /// program of a Winograd fusion takes, and into how many chunks its
    /// output channels are cut (`groups`: the output transform's groups of
    /// channels, when a program can take some of them). Each program of
    /// a block of rows reads all of the transformed kernel `U` (36 x C x O),
    /// and each chunk its share of it: where reading `U` again for each
    /// block is slower than the block's products
    /// ([`Conv::rereads_are_slow`]), the blocks take as many rows as the
    /// blocking takes (`U` read once per block) and the threads get chunks
    /// of the channels. Otherwise as many rows as keep the
    /// program's rows of the `held` buffers V and M (over `points` points)
    /// within half the L2 and within the blocking's rows, and enough
    /// programs for the threads where the rows allow (a kernel of fewer
    /// programs than `units` runs on one thread).
    fn winograd_rows(
        &self,
        packing: &Packing,
        tiles: [usize; 3],
        points: usize,
        held: [LValue; 2],
        groups: Option<usize>,
    ) -> (usize, usize) {
        let [v, mm] = held;
        let [mr, nr, mc, _] = packing.blocking;
        let width = |b: LValue| match self.src.ty(b) {
            LType::Buffer(t) => t.shape[2],
            _ => 0,
        };
        let bytes = |rows: usize| {
            4 * points * (rows * tiles[2]).next_multiple_of(mr) * (width(v) + width(mm))
        };
        let programs = |r: usize| tiles[0] * tiles[1] / r;
        let whole = |r: &usize| tiles[1].is_multiple_of(*r) && r * tiles[2] <= mc;
        let (o, c) = (width(mm), width(v));
        let kernel = 4 * points * c * o;
        // The rows the blocks take when `U` is not a reason to take more.
        let near = (1..=tiles[1])
            .rev()
            .find(|r| {
                whole(r)
                    && bytes(*r) <= packing.l2_bytes / 2
                    && (programs(*r) >= packing.units || *r == 1)
            })
            .unwrap_or(1);
        // Chunks of whole panels and whole groups of channels: the fewest
        // that give `balance` programs, or as many as divide both.
        let chunked = groups.and_then(|g| {
            if !self.rereads_are_slow(packing, kernel, near * tiles[2]) || !o.is_multiple_of(nr) {
                return None;
            }
            let r = (1..=tiles[1]).rev().find(whole)?;
            let panels = o / nr;
            let fits: Vec<usize> = (1..=panels)
                .filter(|k| panels.is_multiple_of(*k) && g.is_multiple_of(*k))
                .collect();
            let k = fits
                .iter()
                .copied()
                .find(|k| programs(r) * k >= packing.balance)
                .or(fits.last().copied())?;
            (k > 1).then_some((r, k))
        });
        chunked.unwrap_or((near, 1))
    }

    /// Whether reading the transformed kernel, `kernel` bytes, again for
    /// each block of `rows` tiles takes the target's core longer than the
    /// block's products: the kernel does not fit the L2, and comes from
    /// the L3 (or memory, past the L3's share: `CpuDesc::l3_bytes`) at
    /// fewer bytes a cycle than four (one f32) for each `rows` multiply-adds
    /// of the core's peak. Then blocks take the most rows and the threads
    /// get chunks of the channels instead, each transforming its rows'
    /// input again. On a 2.6 GHz Xeon (32 multiply-adds a cycle; a kernel
    /// past the L2 is past its 2 MB of L3, so 4 bytes a cycle from memory:
    /// blocks of under 32 rows are slow; one thread, alternated): 14 x 14
    /// over 256 channels (`U` 9.4 MB, one row of 4 tiles a block) 2.8 ->
    /// 1.9 ms a convolution in a chain of six (two threads: 1.18 -> 0.92),
    /// and 1.89 -> 1.29 alone; 28 x 28 over 128 (2.4 MB, 7 tiles) 1.20 ->
    /// 1.05 in a chain of four (0.65 -> 0.56). On
    /// Zen 4 (16 bytes, 16 multiply-adds: under 4 rows; from memory, 5
    /// bytes: under 13) as measured there: 14 x 14 over 256 four blocks of
    /// a row took 0.85 ms and two chunks 1.07, but 7 x 7 over 512 (38 MB,
    /// past its L3) two blocks of a row 2.6 and two chunks 1.4. On Zen 5
    /// (16 bytes, 32 multiply-adds: under 8 rows) 14 x 14 over 256 in a
    /// chain of six, three alternated rounds: 0.89 -> 0.81 ms a
    /// convolution at one thread, 0.46 -> 0.41 at two.
    fn rereads_are_slow(&self, packing: &Packing, kernel: usize, rows: usize) -> bool {
        let Some(cpu) = self.params.target.cpu() else {
            return false;
        };
        kernel > packing.l2_bytes
            && cpu.reread_bytes_per_cycle(kernel) * rows < 4 * cpu.macs_per_cycle()
    }

    /// The kernel of a [`WinogradFusion`]: a grid over the images and
    /// blocks of tile rows; each program runs the input transform on its
    /// tiles into scratch rows of `V`, the 36 products of those rows into
    /// scratch rows of `M`, and the output transform, which writes the
    /// result. The products' kernels (`U`) are packed by a
    /// kernel of their own (the preparer's, for declared weights).
    pub(super) fn fused_winograd_kernel(
        &mut self,
        f: &WinogradFusion,
    ) -> Result<(), TileConvError> {
        let [images, rows, cols] = f.tiles;
        let batch = self.batch_loop(Some(f.batch));
        let Some((counter, lo, points)) = batch else {
            return Err(self.invalid("a Winograd product without its loop over the points"));
        };
        let mut plan = self.pack_plan(f.product, points, false)?;
        // The program's rows: its block of tiles, in whole strips.
        let tiles = f.rows * cols;
        // Register tiles of the target's rows or down to two thirds of
        // them (8 accumulators of 12 still cover the FMA latency), as
        // many as pad the block least: W3 b1's 14 tiles as strips of 5
        // rather than 6 (15 rows computed, not 18: 2.2 -> 1.9 ms on one
        // thread), b8's 28 as strips of 4 (20.2 -> 19.5 ms).
        plan.mr = ((2 * plan.mr).div_ceil(3)..=plan.mr)
            .rev()
            .min_by_key(|r| tiles.div_ceil(*r) * r)
            .unwrap_or(plan.mr);
        plan.strips = tiles.div_ceil(plan.mr);
        plan.mc = plan.strips * plan.mr;
        // Every strip a whole register tile (the plan's ragged last strip
        // was the product's rows', not this block's tiles').
        plan.last_rows = plan.mr;
        plan.blocks = images * rows / f.rows;
        // The program's chunk of the output channels: whole panels.
        plan.chunks = f.chunks;
        plan.per_chunk = plan.nb_n / f.chunks;
        let panels = self.panels(f.product, batch.as_slice(), &plan)?;
        let schedule = Schedule::Winograd {
            blocking: [plan.mr, plan.nr, tiles, plan.kc],
        };
        let mut grid = vec![images, rows / f.rows];
        if f.chunks > 1 {
            grid.push(f.chunks);
        }
        self.b.begin_kernel(grid, schedule);
        self.values.clear();
        let image = Affine::value(self.b.program_id(0));
        let block = Affine::value(self.b.program_id(1));
        let chunk = if f.chunks > 1 {
            Affine::value(self.b.program_id(2))
        } else {
            Affine::constant(0)
        };
        if let (true, Some((group_loop, groups))) = (f.chunks > 1, f.channel_groups) {
            let per = groups / f.chunks;
            self.ranges
                .insert(group_loop, (chunk.scaled(per as i64), per as i64));
        }
        // The program's first tile.
        let i0 = image
            .scaled((rows * cols) as i64)
            .plus_scaled(tiles as i64, &block);
        for held in f.held {
            let LType::Buffer(t) = self.src.ty(held) else {
                return Err(self.invalid("a fused value is not a buffer"));
            };
            let scratch = self.b.alloc(BufferType::contiguous(
                DType::F32,
                vec![t.shape[0], plan.mc, t.shape[2]],
                Space::Scratch,
            ));
            let axes = vec![
                (0, Affine::constant(0)),
                (1, i0.clone()),
                (2, Affine::constant(0)),
            ];
            self.redirects.insert(held, Redirect { scratch, axes });
        }
        let result = (|| -> Result<(), TileConvError> {
            // A transform on each row of the program's tiles.
            let transform = |c: &mut Self, [n, ty]: [LOpId; 2]| -> Result<(), TileConvError> {
                let (r, _) = c.b.begin_for(0, f.rows as i64, 1, &[]);
                let (nv, tyv) = (c.op(n).regions[0].args[0], c.op(ty).regions[0].args[0]);
                c.index.insert(nv, image.clone());
                c.index.insert(
                    tyv,
                    block
                        .scaled(f.rows as i64)
                        .plus_scaled(1, &Affine::value(r)),
                );
                c.ops(&c.op(ty).regions[0].ops)?;
                c.b.end_for(vec![]);
                Ok(())
            };
            transform(self, f.input)?;
            let (p, _) = self.b.begin_for(0, points as i64, 1, &[]);
            self.index.insert(
                counter,
                Affine::value(p).plus_scaled(1, &Affine::constant(lo)),
            );
            let zero = Affine::constant(0);
            let epilogue = TileEpilogue::light_or_block(self.light_epilogue(f.product)?);
            let e = self.program_product(
                f.product,
                &plan,
                panels,
                &[Affine::value(p)],
                &i0,
                &chunk,
                &zero,
                epilogue,
            )?;
            if let Some(e) = e {
                self.epilogue(&e)?;
            }
            self.b.end_for(vec![]);
            transform(self, f.output)
        })();
        self.redirects.clear();
        self.ranges.clear();
        result?;
        self.b.end_kernel();
        if let Panels::Global(p) = panels {
            self.b.dealloc(p);
        }
        Ok(())
    }
}
