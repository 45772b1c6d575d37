//! Block products (`tile.dot` over `BM x BN x BK` blocks): a GPU's
//! products, staged through shared memory, narrow products on a CPU,
//! and products inside a program's body.
//!
//! # Narrow products
//!
//! - narrow products (CPU, f32, at most the target's `narrow_n` columns: one vector on
//!   AVX-512, one register tile on AVX2; W8's 16 and 7) are
//!   not packed: a `dot` kernel whose programs take 16 rows on AVX-512, 6 on AVX2 (the target's `narrow_mr`;
//!   all of them in one program for a product of fewer) and every column, and whose depth loop broadcasts one element
//!   of each row of the left operand straight from memory against one row of the right
//!   one (`16 x 1` by `1 x n`: 16 accumulators of one vector), so the left operand is read
//!   once and never copied. The row blocks that end within the rows are one kernel with
//!   no masks on the rows (a masked one-lane load is a branch per lane); the ragged last
//!   block is a second kernel of one program.

use dlc_core::DType;
use dlc_loop::{Block as LBlock, OpId as LOpId, OpKind as L};
use dlc_tile::{Affine, BufferType, Schedule, Space, TileType, Type, Value};

use super::{Conv, TileConvError, loop_bounds};

impl<'a> Conv<'a> {
    /// The `dot` schedule's blocks for contraction `c`: the parameters,
    /// clamped to the product's extents.
    pub(super) fn dot_blocks(&self, c: &dlc_loop::Contraction) -> [usize; 3] {
        let [bm, bn, bk] = self.params.dot;
        [
            bm.min(c.m.max(1) as usize),
            bn.min(c.n.max(1) as usize),
            bk.min(c.k.max(1) as usize),
        ]
    }

    /// A contraction (and the parallel loops around it, `band`) as its own
    /// kernel: a grid over the batch and the result's blocks.
    pub(super) fn dot_kernel(&mut self, band: &[LOpId], m: LOpId) -> Result<(), TileConvError> {
        let (_, c) = self.contraction(m)?;
        let blocks = self.dot_blocks(c);
        let row_blocks = (c.m.max(0) as usize).div_ceil(blocks[0]).max(1);
        self.dot_grid(band, m, blocks, (0, row_blocks), false)
    }

    /// The register tile of a narrow product on a CPU (`rows x n` for a
    /// product of `n` columns, at most the target's narrow tile's; fewer
    /// rows for a product of fewer), or `None`.
    pub(super) fn narrow(&self, m: LOpId) -> Option<[usize; 2]> {
        let L::Matmul(c) = &self.op(m).kind else {
            return None;
        };
        let [rows, cols] = self.params.packed?.narrow?;
        let n = c.n.max(1) as usize;
        (n <= cols).then_some([rows.min(c.m.max(1) as usize), n])
    }

    /// A narrow product (at most the target's `narrow_n` columns: W8's 16
    /// and 7) on a CPU, without packing: each program takes `rows` rows and every
    /// column, and each step of the depth broadcasts one element of each of
    /// its rows of the left operand straight from memory against one row of
    /// the right one (`rows x 1` by `1 x n`), so the left operand (W8's
    /// 29 MB adjacency) is read once and never copied. The blocks that end
    /// within the rows are one kernel with no masks on the rows; the last,
    /// ragged block is a second kernel of one program.
    pub(super) fn narrow_kernels(
        &mut self,
        band: &[LOpId],
        m: LOpId,
        [rows, n]: [usize; 2],
    ) -> Result<(), TileConvError> {
        let (_, c) = self.contraction(m)?;
        let total = c.m.max(0) as usize;
        let full = total / rows;
        if full > 0 {
            self.dot_grid(band, m, [rows, n, 1], (0, full), true)?;
        }
        if !total.is_multiple_of(rows) {
            self.dot_grid(band, m, [rows, n, 1], (full, 1), false)?;
        }
        Ok(())
    }

    /// The kernel of blocks `bm x bn x bk` of contraction `m` over the
    /// batch (`band`), row blocks `first..first + count` and every column
    /// block. `exact_rows`: every row block ends within the rows (no masks
    /// on them).
    pub(super) fn dot_grid(
        &mut self,
        band: &[LOpId],
        m: LOpId,
        [bm, bn, bk]: [usize; 3],
        (first, count): (usize, usize),
        exact_rows: bool,
    ) -> Result<(), TileConvError> {
        let (_, c) = self.contraction(m)?;
        let mut grid: Vec<usize> = band
            .iter()
            .map(|l| {
                let (lo, hi, _) = loop_bounds(&self.op(*l).kind).unwrap_or((0, 1, 1));
                (hi - lo).max(1) as usize
            })
            .collect();
        grid.push(count);
        grid.push((c.n.max(0) as usize).div_ceil(bn).max(1));
        let schedule = Schedule::Dot {
            tile: [bm, bn, bk],
            staged: self.params.stage_shared,
        };
        self.b.begin_kernel(grid, schedule);
        for (axis, l) in band.iter().enumerate() {
            let op = self.op(*l);
            let (lo, _, _) = loop_bounds(&op.kind).unwrap_or((0, 1, 1));
            let pid = self.b.program_id(axis);
            self.index.insert(
                op.regions[0].args[0],
                Affine::value(pid).plus_scaled(1, &Affine::constant(lo)),
            );
        }
        let pi = self.b.program_id(band.len());
        let pj = self.b.program_id(band.len() + 1);
        let i0 = Affine::value(pi)
            .scaled(bm as i64)
            .plus_scaled(1, &Affine::constant((first * bm) as i64));
        let j0 = Affine::value(pj).scaled(bn as i64);
        self.dot_block(m, i0, j0, [bm, bn, bk], true, exact_rows)?;
        self.b.end_kernel();
        Ok(())
    }

    /// A contraction inside a program: counted loops over its blocks.
    pub(super) fn dot_in_program(&mut self, m: LOpId) -> Result<(), TileConvError> {
        let (_, c) = self.contraction(m)?;
        let [bm, bn, bk] = self.dot_blocks(c);
        let (ci, _) = self.b.begin_for(0, c.m, bm as i64, &[]);
        let (cj, _) = self.b.begin_for(0, c.n, bn as i64, &[]);
        self.dot_block(
            m,
            Affine::value(ci),
            Affine::value(cj),
            [bm, bn, bk],
            false,
            false,
        )?;
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        Ok(())
    }

    /// One `bm x bn` block of contraction `m` at rows `i0`, columns `j0`:
    /// the K loop of `tile.dot`s, then the epilogue on the accumulator.
    /// `shared`: whether operands may be staged through shared memory
    /// (only at a kernel's top level, where every program reaches the
    /// barriers). `exact_rows`: the block ends within the rows.
    pub(super) fn dot_block(
        &mut self,
        m: LOpId,
        i0: Affine,
        j0: Affine,
        [bm, bn, bk]: [usize; 3],
        shared: bool,
        exact_rows: bool,
    ) -> Result<(), TileConvError> {
        let (op, c) = self.contraction(m)?;
        let body: &'a LBlock = &op.regions[0];
        let (iv, jv, kv, accv) = (body.args[0], body.args[1], body.args[2], body.args[3]);
        let (a, bbuf) = (self.buffer(op.operands[0])?, self.buffer(op.operands[1])?);
        let dtype = match self.b.ty(a) {
            Type::Buffer(t) => t.dtype,
            _ => DType::F32,
        };
        let acc_dtype = self.result_dtype(accv);
        let stage = shared && self.params.stage_shared;
        let zero = self
            .b
            .constant(0.0, Type::Tile(TileType::new(acc_dtype, vec![bm, bn])));
        let ragged_m = !exact_rows && !(c.m as usize).is_multiple_of(bm);
        let ragged_n = !(c.n as usize).is_multiple_of(bn);
        let ragged_k = !(c.k as usize).is_multiple_of(bk);
        let rows_left = Affine::constant(c.m).plus_scaled(-1, &i0);
        let cols_left = Affine::constant(c.n).plus_scaled(-1, &j0);
        let ta = Type::Tile(TileType::new(dtype, vec![bm, bk]));
        let tb = Type::Tile(TileType::new(dtype, vec![bk, bn]));
        // The operand blocks at depth `k0` (i -> i0 + #0, k -> k0 + #1 for
        // the left operand; k -> k0 + #0, j -> j0 + #1 for the right one),
        // masked on ragged edges (and always along the depth when
        // `past_end`: a prefetch may go beyond it, reading zeros).
        let blocks = |this: &mut Self,
                      k0: Affine,
                      past_end: bool|
         -> Result<(Value, Value), TileConvError> {
            let depth_left = Affine::constant(c.k).plus_scaled(-1, &k0);
            let mask_k = ragged_k || past_end;
            this.index.insert(iv, i0.plus_scaled(1, &Affine::axis(0)));
            this.index.insert(kv, k0.plus_scaled(1, &Affine::axis(1)));
            let a_index: Vec<Affine> =
                c.a.iter()
                    .map(|e| this.affine(e))
                    .collect::<Result<_, _>>()?;
            let a_mask = (ragged_m || mask_k).then(|| {
                this.b
                    .mask(vec![rows_left.clone(), depth_left.clone()], &[bm, bk])
            });
            let at = this
                .b
                .load(a, a_index, a_mask, a_mask.map(|_| 0.0), ta.clone());
            this.index.insert(kv, k0.plus_scaled(1, &Affine::axis(0)));
            this.index.insert(jv, j0.plus_scaled(1, &Affine::axis(1)));
            let b_index: Vec<Affine> =
                c.b.iter()
                    .map(|e| this.affine(e))
                    .collect::<Result<_, _>>()?;
            let b_mask = (mask_k || ragged_n)
                .then(|| this.b.mask(vec![depth_left, cols_left.clone()], &[bk, bn]));
            let bt = this
                .b
                .load(bbuf, b_index, b_mask, b_mask.map(|_| 0.0), tb.clone());
            Ok((at, bt))
        };
        let next = if stage {
            // Two stages: while one slot of each shared buffer feeds the
            // product, the next depth slice is copied into the other, so
            // one barrier per slice orders both. The loop takes two slices
            // per iteration (slots 0 and 1 alternate without an index
            // computed at run time), rounded up: slices past the depth
            // are masked to zeros.
            let sa = self.b.alloc(BufferType::contiguous(
                dtype,
                vec![2, bm, bk],
                Space::Shared,
            ));
            let sb = self.b.alloc(BufferType::contiguous(
                dtype,
                vec![2, bk, bn],
                Space::Shared,
            ));
            let slot = |s: i64| vec![Affine::constant(s), Affine::axis(0), Affine::axis(1)];
            let (at, bt) = blocks(self, Affine::constant(0), false)?;
            self.b.store(at, sa, slot(0), None);
            self.b.store(bt, sb, slot(0), None);
            self.b.barrier();
            let pairs = (c.k.max(1) as usize).div_ceil(2 * bk);
            let (kb, accs) = self
                .b
                .begin_for(0, (pairs * 2 * bk) as i64, 2 * bk as i64, &[zero]);
            let mut acc = accs[0];
            for s in 0..2i64 {
                let ahead =
                    Affine::value(kb).plus_scaled(1, &Affine::constant((s + 1) * bk as i64));
                let (at, bt) = blocks(self, ahead, true)?;
                self.b.store(at, sa, slot(1 - s), None);
                self.b.store(bt, sb, slot(1 - s), None);
                let x = self.b.load(sa, slot(s), None, None, ta.clone());
                let y = self.b.load(sb, slot(s), None, None, tb.clone());
                acc = self.b.dot(x, y, acc);
                self.b.barrier();
            }
            acc
        } else {
            let (kb, accs) = self.b.begin_for(0, c.k, bk as i64, &[zero]);
            let (at, bt) = blocks(self, Affine::value(kb), false)?;
            self.b.dot(at, bt, accs[0])
        };
        let acc = self.b.end_for(vec![next])[0];
        // The epilogue on the accumulator: i -> i0 + #0, j -> j0 + #1.
        self.index.insert(iv, i0.plus_scaled(1, &Affine::axis(0)));
        self.index.insert(jv, j0.plus_scaled(1, &Affine::axis(1)));
        self.index.insert(kv, Affine::constant(0));
        self.values.insert(accv, acc);
        let saved = (
            std::mem::take(&mut self.shape),
            self.mask.take(),
            std::mem::take(&mut self.splats),
        );
        self.shape = vec![bm, bn];
        self.mask =
            (ragged_m || ragged_n).then(|| self.b.mask(vec![rows_left, cols_left], &[bm, bn]));
        let result = self.ops(&body.ops);
        (self.shape, self.mask, self.splats) = saved;
        result
    }
}
