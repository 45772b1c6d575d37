//! Top-level nests run as one kernel: attention's two products and row
//! softmax over blocks of rows, and an im2col buffer read from the
//! convolution's input by the packed product's programs.
//!
//! # The two schedules
//!
//! - **im2col read from the input** (CPU targets with packing): an im2col group's copy
//!   nest (`col[n, (c*KH + ky)*KW + kx, y*OX + x] = input[n, c, s0*y + d0*ky - p0, s1*x +
//!   d1*kx - p1]`, zero outside, as graph -> loop writes it for a built-in or an
//!   index-notation convolution; the window is the group's attribute,
//!   `Conv::implicit_im2col`) whose buffer only the following packed product reads, as
//!   its right operand with one block of rows (so its programs copy their own panels),
//!   makes no kernel and no buffer: the product's programs copy each `kc x nr` panel
//!   slice from the input. The depth slices are whole channels (`kc` = channels x taps,
//!   the most channels that divide the input's and fit the blocking's depth: W3 16 x 9 =
//!   144), so a slice row is a (channel, tap) pair walked by three loops; the panels
//!   come in groups of whole output rows (`lcm(nr, OX) / nr` panels: 7 panels of 32 = 4
//!   rows of 56 for W3; up to 8, else the im2col buffer stays), each program's chunk is
//!   whole groups, and each panel's output row and column are then constants of its
//!   place in its group: a panel's 32 lanes span one to a few output rows, one load of
//!   the input per row (zero outside it, which is the padding) and the earlier rows'
//!   lanes selected over the later ones.
//!
//! - `fused` (CPU targets with packing): attention, `softmax(q @ k^T) @ v`, as one
//!   kernel over blocks of rows, so that the score matrix never goes to memory. Three
//!   top-level nests qualify (`Conv::row_fusion`): a packed product (in a batch loop or
//!   not) whose epilogue stores only into a buffer `S` at `[batch, i, j]`; a nest over
//!   the same batch and the rows of `S` (no carried values, no product) whose every
//!   access is to row `i` of `S` or of one other buffer `P`; and a packed product of
//!   `P` (read at `[batch, i, k]`, as deep as `S` is wide) by another operand. `S` and
//!   `P` must be the function's own allocations that nothing else touches (views made
//!   after the three nests aside), and the second product must not write storage the
//!   first one or its own epilogue reads (programs run concurrently: a program would
//!   write rows of the result while others still read the queries). The kernel's grid
//!   is the batch and blocks of `mc` rows (the packed plan's, the same for both
//!   products, with every panel in each program); each program runs the first product
//!   on its rows (`program_product`, the packed product's program body) with its
//!   epilogue's stores redirected to a scratch `[mc, width]` copy of its rows of `S`
//!   (`Redirect`: a buffer's axes mapped to a scratch buffer's, less the block's first
//!   row), then the row nest on each of its rows, `S` and `P` in scratch, then the
//!   second product of its rows of `P`. Rows past the product's in the last block are
//!   computed on scratch memory and never stored (the second product's epilogue is
//!   masked). `S` and `P` are not allocated at all. The right operands, read by every
//!   block, are packed by pack kernels as usual. BERT's attention (W6) fuses
//!   too; it is a small part of W6. Inside the kernel (5fc8440, 48b50f5):
//!   - each product reads its rows of the left operand where they lie
//!     (`Strips::InPlace`: a column of `mr` rows is `mr` loads off one address register,
//!     through the operand's own index, and through the redirect for `P`), instead of
//!     packing them into strips, when that needs no mask: the operand contiguous along
//!     the depth, every slice of the depth whole, every block of rows inside it (`P`'s
//!     scratch always holds whole blocks). The queries are a 96 x 64 block read once per
//!     panel, the probabilities are in the program's scratch already;
//!   - a row nest whose last loop only scales the row of `P` by a factor computed before
//!     it (`p[.., i, k] = p[.., i, k] * c`: softmax's normalization, `Conv::row_scale`)
//!     stores the factor per row instead, and the second product's epilogue scales its
//!     result's rows by it: `(c * p) @ v = c * (p @ v)`, a pass over 64 columns where
//!     the normalization made one over 384 (a last loop doing anything else is kept);
//!   - the first product's epilogue runs inside the loop over rows, row by row, so the
//!     row nest reads the row the epilogue has just written (`Conv::epilogue_row`).

use std::collections::HashSet;

use dlc_core::DType;
use dlc_core::Window;
use dlc_core::scalar::BinaryOp;
use dlc_loop::{IndexExpr, OpId as LOpId, OpKind as L, Type as LType, Value as LValue};
use dlc_tile::{Affine, BufferType, Schedule, Space, TileType, Type, Value};

use super::{
    Conv, PackPlan, Panels, Redirect, Strips, TileConvError, TileEpilogue, WinogradFusion, gcd,
    is_counter, is_parallel, loop_bounds,
};

/// Top-level nests run as one kernel.
#[derive(Clone, Debug)]
pub(super) enum Fusion {
    /// Attention's products and softmax, over blocks of rows.
    Rows(RowFusion),
    /// A Winograd convolution's transforms and products, over blocks of
    /// tile rows.
    Winograd(WinogradFusion),
}

/// Three top-level nests run as one kernel over blocks of rows (see
/// [`Conv::row_fusion`]).
#[derive(Clone, Debug)]
pub(super) struct RowFusion {
    /// The batch loop of each nest (none without a batch).
    pub(super) batches: [Option<LOpId>; 3],
    /// The two products.
    pub(super) products: [LOpId; 2],
    /// The row nest's loop over rows.
    pub(super) rows: LOpId,
    /// S and P: held in scratch memory, never in their own buffers.
    pub(super) held: [LValue; 2],
    /// Those of S and P whose allocation nothing else uses: not made.
    pub(super) elided: Vec<LValue>,
}

/// An im2col buffer that a packed product's programs read from the
/// convolution's input instead (see [`Conv::implicit_im2col`]).
#[derive(Clone, Debug)]
pub(super) struct Im2col {
    pub(super) input: LValue,
    pub(super) col: LValue,
    pub(super) channels: usize,
    /// `[KH, KW]`.
    pub(super) kernel: [usize; 2],
    /// The group's window.
    pub(super) window: Window,
    /// Output columns.
    pub(super) ox: usize,
    /// Panels per group of whole output rows, and the rows of a group.
    pub(super) group: usize,
    pub(super) rows: i64,
    /// For a grouped convolution of one image, whose product's batch is
    /// its groups (reading a `[groups, C/groups*KH*KW, OY*OX]` view of the
    /// buffer): the input channels of a group. `None`: the batch is the
    /// image's.
    pub(super) group_channels: Option<usize>,
}

impl<'a> Conv<'a> {
    /// Three top-level nests from `top[i]` that run as one kernel over
    /// blocks of rows (attention's `softmax(q @ k^T) @ v`): a packed product
    /// (in a batch loop or not) whose epilogue writes buffer `S` at
    /// `[batch, i, j]`, a nest over the same batch and the rows of `S` whose
    /// body reads and writes only row `i` of `S` and of a buffer `P`, and a
    /// packed product of `P` (at `[batch, i, k]`) by another operand.
    /// Nothing else touches `S` or `P`, so each program keeps its rows of
    /// them in scratch memory: the score matrix never goes to memory.
    /// Returns the fusion and the index of its last nest.
    pub(super) fn row_fusion(
        &self,
        top: &[LOpId],
        i: usize,
        cuts: &[bool],
    ) -> Option<(RowFusion, usize)> {
        let mentions = |e: &IndexExpr, v: LValue| e.terms.iter().any(|t| t.1 == v && t.0 != 0);
        // A packed product, in one batch loop or none.
        let product = |id: LOpId| -> Option<(Option<LOpId>, LOpId)> {
            let op = self.op(id);
            let (b, m) = match &op.kind {
                L::Matmul(_) => (None, id),
                L::Parallel { .. } => match op.regions[0].ops.as_slice() {
                    [m] if matches!(self.op(*m).kind, L::Matmul(_)) => (Some(id), *m),
                    _ => return None,
                },
                _ => return None,
            };
            self.packs_wide(m).then_some((b, m))
        };
        let bounds = |b: Option<LOpId>| b.and_then(|b| loop_bounds(&self.op(b).kind));
        let counter = |b: Option<LOpId>| b.map(|b| self.op(b).regions[0].args[0]);
        let (b1, m1) = product(top[i])?;
        let L::Matmul(c1) = &self.op(m1).kind else {
            return None;
        };
        // The first product's epilogue stores only into S, at [b, i, j].
        let e1 = &self.op(m1).regions[0];
        let (iv1, jv1) = (e1.args[0], e1.args[1]);
        let mut s = None;
        let mut stores1 = vec![];
        for &o in &e1.ops {
            let d = self.op(o);
            match &d.kind {
                L::Store { index } => {
                    let mut want: Vec<LValue> = counter(b1).into_iter().collect();
                    want.extend([iv1, jv1]);
                    let at_ij = index.len() == want.len()
                        && index.iter().zip(&want).all(|(e, v)| is_counter(e, *v));
                    if !at_ij || s.is_some_and(|s| s != d.operands[1]) {
                        return None;
                    }
                    s = Some(d.operands[1]);
                    stores1.push(o);
                }
                L::For { .. } | L::Parallel { .. } | L::Matmul(_) => return None,
                _ => {}
            }
        }
        let s = s?;
        // The row nest: a loop over the batch (when there is one) around a
        // loop over the rows, without carried values.
        let j = self.next_nest(top, i)?;
        let (b2, rows) = {
            let op = self.op(top[j]);
            if b1.is_some() {
                match op.regions.first()?.ops.as_slice() {
                    [r] if is_parallel(&op.kind) => (Some(top[j]), *r),
                    _ => return None,
                }
            } else {
                (None, top[j])
            }
        };
        let row_op = self.op(rows);
        if (b2.is_some() && bounds(b2) != bounds(b1))
            || loop_bounds(&row_op.kind) != Some((0, c1.m, 1))
            || !row_op.operands.is_empty()
            || !row_op.results.is_empty()
        {
            return None;
        }
        let iv2 = row_op.regions[0].args[0];
        let mut row_at: Vec<LValue> = counter(b2).into_iter().collect();
        row_at.push(iv2);
        let mut row_ops = HashSet::new();
        self.nested_ops(rows, &mut row_ops);
        // Every access of the row nest is to row i of S or of one other
        // buffer P, and nothing in it is a product.
        let mut p = None;
        for &o in &row_ops {
            let d = self.op(o);
            let (buf, index) = match &d.kind {
                L::Matmul(_) => return None,
                L::Load { index, .. } => (d.operands[0], index),
                L::Store { index } => (d.operands[1], index),
                _ => continue,
            };
            if buf != s {
                if p.is_some_and(|p| p != buf) {
                    return None;
                }
                p = Some(buf);
            }
            let row_i = index.len() == row_at.len() + 1
                && index.iter().zip(&row_at).all(|(e, v)| is_counter(e, *v))
                && index
                    .last()
                    .is_some_and(|e| row_at.iter().all(|v| !mentions(e, *v)));
            if !row_i {
                return None;
            }
        }
        let p = p?;
        // The second product reads P at [b, i, k], as deep as S is wide.
        let k = self.next_nest(top, j)?;
        let (b3, m2) = product(top[k])?;
        let m2op = self.op(m2);
        let L::Matmul(c2) = &m2op.kind else {
            return None;
        };
        let (iv3, kv3) = (m2op.regions[0].args[0], m2op.regions[0].args[2]);
        let mut want: Vec<LValue> = counter(b3).into_iter().collect();
        want.extend([iv3, kv3]);
        let width = c1.n;
        let shape_ok = |v: LValue| match self.src.ty(v) {
            LType::Buffer(t) => {
                t.dtype == DType::F32
                    && t.shape.len() == want.len()
                    && t.shape[t.shape.len() - 2..] == [c1.m as usize, width as usize]
            }
            _ => false,
        };
        if bounds(b3) != bounds(b1)
            || m2op.operands[0] != p
            || m2op.operands[1] == s
            || m2op.operands[1] == p
            || c2.m != c1.m
            || c2.k != width
            || c2.a.len() != want.len()
            || !c2.a.iter().zip(&want).all(|(e, v)| is_counter(e, *v))
            || !shape_ok(s)
            || !shape_ok(p)
            || !cuts[i]
            || !cuts[k + 1]
        {
            return None;
        }
        let mut allowed: HashSet<LOpId> = row_ops;
        allowed.extend(stores1);
        let elided = self.row_fusion_storage(top, k, [s, p], [m1, m2], allowed)?;
        Some((
            RowFusion {
                batches: [b1, b2, b3],
                products: [m1, m2],
                rows,
                held: [s, p],
                elided,
            },
            k,
        ))
    }

    /// The storage a row fusion holds per program (`held`: S and P, read
    /// and written by `allowed` ops only, the nests' ops; products `m1` and
    /// `m2`, the second at `top[k]`) may be: the function's own, touched by
    /// nothing else but views after the fused nests, and the second
    /// product writes nothing a program reads. Returns the held buffers
    /// nothing else takes, which are not allocated at all.
    fn row_fusion_storage(
        &self,
        top: &[LOpId],
        k: usize,
        held: [LValue; 2],
        products: [LOpId; 2],
        allowed: HashSet<LOpId>,
    ) -> Option<Vec<LValue>> {
        let ([s, p], [m1, m2]) = (held, products);
        let m2op = self.op(m2);
        // S and P are the function's own storage (a result or a parameter
        // must be written where the caller sees it).
        let allocated = |v: LValue| {
            let root = self.root_buffer(v);
            top.iter()
                .any(|&o| matches!(self.op(o).kind, L::Alloc) && self.op(o).results == [root])
        };
        if !allocated(s) || !allocated(p) {
            return None;
        }
        // Nothing else uses S or P but views made after the fused nests
        // (their storage reused for later values).
        let later: HashSet<LOpId> = top[k + 1..].iter().copied().collect();
        let m2_id = m2;
        let mut viewed = vec![];
        for (id, op) in self.src.ops.iter().enumerate() {
            let id = LOpId(id as u32);
            let uses = op.operands.iter().any(|&v| v == s || v == p);
            let later_view = matches!(op.kind, L::View) && later.contains(&id);
            let ok = !uses
                || allowed.contains(&id)
                || (id == m2_id && op.operands[1..].iter().all(|&v| v != s && v != p))
                || matches!(op.kind, L::Dealloc)
                || later_view;
            if !ok {
                return None;
            }
            if uses && later_view {
                viewed.extend(op.operands.first().copied());
            }
        }
        // Storage nothing else takes is not allocated at all.
        let elided: Vec<LValue> = [s, p]
            .into_iter()
            .filter(|&v| self.root_buffer(v) == v && !viewed.contains(&v))
            .collect();
        let mut m2_body = HashSet::new();
        self.nested_ops(m2, &mut m2_body);
        // What the second product writes, no program may read: a program
        // writes its rows of the result while others still read the
        // first product's operands (a buffer reused for the result, as
        // BERT's output of attention takes the storage of its queries).
        let mut m1_body = HashSet::new();
        self.nested_ops(m1, &mut m1_body);
        let mut read: HashSet<LValue> = HashSet::new();
        read.extend(self.op(m1).operands.iter().map(|&v| self.root_buffer(v)));
        read.insert(self.root_buffer(m2op.operands[1]));
        for &o in m1_body.iter().chain(&m2_body) {
            if let L::Load { .. } = self.op(o).kind {
                read.insert(self.root_buffer(self.op(o).operands[0]));
            }
        }
        let writes_read = m2_body.iter().any(|&o| {
            let d = self.op(o);
            matches!(d.kind, L::Store { .. }) && read.contains(&self.root_buffer(d.operands[1]))
        });
        (!writes_read).then_some(elided)
    }

    /// The im2col nest at `top[i]` of a group through `window`, whose
    /// buffer one packed product (over the same batch, one block of rows)
    /// reads as its right operand and nothing else touches:
    /// `col[n, (c*KH + ky)*KW + kx, y*OX + x] = input[n, c, iy, ix]` (zero
    /// outside) where the window reads, as graph -> loop writes an
    /// [`KernelGroup::Im2col`](dlc_loop::KernelGroup) group. The window's
    /// parameters are the group's; the nest is checked against them (one
    /// that does not compute what the group says runs as written). The
    /// product's programs can copy their panels from the input instead, so
    /// the buffer is never made. Returns the convolution and the index of
    /// the product's nest.
    pub(super) fn implicit_im2col(
        &self,
        top: &[LOpId],
        i: usize,
        cuts: &[bool],
        window: &Window,
    ) -> Option<(Im2col, usize)> {
        let nr = self.params.packed?.blocking[1];
        // Six perfectly nested loops from 0 (channel, batch, kernel row and
        // column, output row and column), without carried values.
        let mut loops: Vec<(LValue, i64)> = vec![];
        let mut at = top[i];
        loop {
            let op = self.op(at);
            let (lo, hi, step) = loop_bounds(&op.kind)?;
            if lo != 0 || step != 1 || !op.operands.is_empty() || !op.results.is_empty() {
                return None;
            }
            loops.push((op.regions[0].args[0], hi));
            match op.regions[0].ops.as_slice() {
                [inner] if loops.len() < 6 => at = *inner,
                _ if loops.len() == 6 => break,
                _ => return None,
            }
        }
        let [
            (c, channels),
            (n, batch),
            (ky, kh),
            (kx, kw),
            (y, oy),
            (x, ox),
        ] = loops[..]
        else {
            return None;
        };
        let [ld, st] = self.op(at).regions[0].ops[..] else {
            return None;
        };
        let (ld_op, st_op) = (self.op(ld), self.op(st));
        let (
            L::Load {
                index: li,
                pad: Some(pad),
            },
            L::Store { index: si },
        ) = (&ld_op.kind, &st_op.kind)
        else {
            return None;
        };
        if *pad != 0.0 || st_op.operands[0] != ld_op.results[0] {
            return None;
        }
        let (input, col) = (ld_op.operands[0], st_op.operands[1]);
        let coef = |e: &IndexExpr, v: LValue| e.coefficient(v);
        // `e` is exactly the sum of `vars` times their coefficients, plus `k`.
        let is = |e: &IndexExpr, vars: &[(LValue, i64)], k: i64| {
            e.constant == k
                && e.terms.iter().all(|t| vars.iter().any(|(v, _)| *v == t.1))
                && vars.iter().all(|&(v, w)| coef(e, v) == w)
        };
        let [li0, li1, li2, li3] = &li[..] else {
            return None;
        };
        let [si0, si1, si2] = &si[..] else {
            return None;
        };
        let w = window;
        let fits = [kh, kw] == w.kernel
            && is(li0, &[(n, 1)], 0)
            && is(li1, &[(c, 1)], 0)
            && is(li2, &[(y, w.stride[0]), (ky, w.dilation[0])], -w.padding[0])
            && is(li3, &[(x, w.stride[1]), (kx, w.dilation[1])], -w.padding[1])
            && is(si0, &[(n, 1)], 0)
            && is(si1, &[(c, kh * kw), (ky, kw), (kx, 1)], 0)
            && is(si2, &[(y, ox), (x, 1)], 0);
        let f32_buffer = |v: LValue, rank: usize| matches!(self.src.ty(v), LType::Buffer(t) if t.dtype == DType::F32 && t.shape.len() == rank);
        if !fits || !f32_buffer(input, 4) || !f32_buffer(col, 3) || self.root_buffer(col) != col {
            return None;
        }
        // The product: a loop over the batch around a packed product of
        // `col[n, k, j]` as the right operand.
        let k = self.next_nest(top, i)?;
        let nest = self.op(top[k]);
        let [m] = nest.regions.first()?.ops[..] else {
            return None;
        };
        let mop = self.op(m);
        let L::Matmul(cm) = &mop.kind else {
            return None;
        };
        let (jv, kv) = (mop.regions[0].args[1], mop.regions[0].args[2]);
        let b = nest.regions[0].args[0];
        // A grouped convolution of one image: a product per group, reading
        // a row-major `[groups, k, n]` view of the buffer.
        let read = mop.operands[1];
        let groups = match self.src.ty(read) {
            _ if read == col => 1,
            LType::Buffer(t)
                if batch == 1
                    && self.view_of.get(&read) == Some(&col)
                    && t.offset == 0
                    && t.has_row_major_strides()
                    && t.shape.len() == 3
                    && t.shape[0] > 1
                    && [t.shape[1], t.shape[2]] == [cm.k as usize, cm.n as usize]
                    && channels % t.shape[0] as i64 == 0 =>
            {
                t.shape[0] as i64
            }
            _ => return None,
        };
        let slices = if groups == 1 { batch } else { groups };
        if !is_parallel(&nest.kind)
            || loop_bounds(&nest.kind) != Some((0, slices, 1))
            || mop.operands[0] == col
            || mop.operands[0] == read
            || cm.k * groups != channels * kh * kw
            || cm.n != oy * ox
            || cm.b.len() != 3
            || !(is_counter(&cm.b[0], b) && is_counter(&cm.b[1], kv) && is_counter(&cm.b[2], jv))
            || !self.packs_wide(m)
            || !cuts[i]
            || !cuts[k + 1]
        {
            return None;
        }
        let plan = self.pack_plan(m, slices as usize, true).ok()?;
        if !self.packs_own_panels(m, plan.blocks) {
            return None;
        }
        // Nothing else touches `col` (the product's epilogue included), nor
        // the product's view of it.
        let view = |op: &dlc_loop::OpData| matches!(op.kind, L::View) && op.results == [read];
        for (id, op) in self.src.ops.iter().enumerate() {
            let id = LOpId(id as u32);
            let reads = op.operands.contains(&col) || (read != col && op.operands.contains(&read));
            if reads && id != st && id != m && !matches!(op.kind, L::Dealloc) && !view(op) {
                return None;
            }
        }
        // Panels come in groups of whole output rows (`lcm(nr, OX)`
        // columns), so that each panel's place in the image is a constant
        // of its place in the group.
        let ox_u = ox as usize;
        let group = ox_u / gcd(nr as u64, ox_u as u64) as usize;
        if group > 8 || group == 0 {
            return None;
        }
        // A product per group copies its panels from the input where whole
        // groups of panels pad the columns no more than panels do (Zen 3,
        // ResNeXt-50's 3 x 3 convolutions of 32 groups, one thread: over 56
        // x 56, 4 channels a group, 1.26 -> 0.48 ms; over 28 x 28 0.61 ->
        // 0.42; over 14 x 14, 196 columns in 224 rather than 208, 0.57 ->
        // 0.78, so not there).
        let columns = (oy * ox) as usize;
        if groups > 1 && columns.next_multiple_of(group * nr) != columns.next_multiple_of(nr) {
            return None;
        }
        let conv = Im2col {
            input,
            col,
            channels: channels as usize,
            kernel: [kh as usize, kw as usize],
            window: *window,
            ox: ox_u,
            group,
            rows: (group * nr / ox_u) as i64,
            group_channels: (groups > 1).then_some((channels / groups) as usize),
        };
        Some((conv, k))
    }

    /// Copies slice `kb` of the `group` panels of group `g` (past the
    /// program's first, `g0`) of the im2col buffer `conv` stands for into `dst[u, k,
    /// j]`, from the convolution's input, batch `bat`: for each channel and
    /// kernel tap of the slice, each panel's `nr` output positions, one
    /// load per output row they span (zero outside the input).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_im2col_group(
        &mut self,
        conv: &Im2col,
        plan: &PackPlan,
        kb: Value,
        g: Value,
        g0: &Affine,
        bat: &[Affine],
        dst: Value,
    ) -> Result<(), TileConvError> {
        let (nr, kc) = (plan.nr, plan.kc);
        let [kh, kw] = conv.kernel;
        let cs = kc / (kh * kw);
        let input = self.buffer(conv.input)?;
        let w = &conv.window;
        let f32t = |shape: Vec<usize>| Type::Tile(TileType::new(DType::F32, shape));
        // The group: `g` groups of `rows` output rows past the program's
        // first (`g0`).
        let group0 = g0.plus_scaled(1, &Affine::value(g));
        // The image and its group's first channel.
        let batch = bat.first().cloned().unwrap_or_default();
        let (n, first) = match conv.group_channels {
            Some(cg) => (Affine::default(), batch.scaled(cg as i64)),
            None => (batch, Affine::default()),
        };
        let (cc, _) = self.b.begin_for(0, cs as i64, 1, &[]);
        let (a, _) = self.b.begin_for(0, kh as i64, 1, &[]);
        let (bx, _) = self.b.begin_for(0, kw as i64, 1, &[]);
        let channel = Affine::value(kb)
            .scaled(cs as i64)
            .plus_scaled(1, &Affine::value(cc))
            .plus_scaled(1, &first);
        let row = Affine::value(cc)
            .scaled((kh * kw) as i64)
            .plus_scaled(kw as i64, &Affine::value(a))
            .plus_scaled(1, &Affine::value(bx));
        for u in 0..conv.group {
            let (yu, xu) = ((u * nr / conv.ox) as i64, (u * nr % conv.ox) as i64);
            // Output row `oy` from lane 0 at output column `ox0`.
            let at = |oy: Affine, ox0: i64| -> Vec<Affine> {
                vec![
                    n.clone(),
                    channel.clone(),
                    oy.scaled(w.stride[0])
                        .plus_scaled(w.dilation[0], &Affine::value(a))
                        .plus_scaled(1, &Affine::constant(-w.padding[0])),
                    Affine::axis(1)
                        .scaled(w.stride[1])
                        .plus_scaled(w.dilation[1], &Affine::value(bx))
                        .plus_scaled(1, &Affine::constant(w.stride[1] * ox0 - w.padding[1])),
                ]
            };
            let oy = group0
                .scaled(conv.rows)
                .plus_scaled(1, &Affine::constant(yu));
            // The panel's lanes run over consecutive output rows: segment
            // `r` is row `yu + r`, lanes up to `(r + 1) * OX - xu`, each
            // read as a whole tile and the earlier rows' lanes selected
            // over the later ones.
            let ox = conv.ox as i64;
            let segments = (xu as usize + nr).div_ceil(conv.ox) as i64;
            let mut t = None;
            for r in (0..segments).rev() {
                let row_r = oy.plus_scaled(1, &Affine::constant(r));
                let seg = self.b.load(
                    input,
                    at(row_r, xu - r * ox),
                    None,
                    Some(0.0),
                    f32t(vec![1, nr]),
                );
                t = Some(match t {
                    None => seg,
                    Some(later) => {
                        let end = (r + 1) * ox - xu;
                        let here = self
                            .b
                            .mask(vec![Affine::constant(1), Affine::constant(end)], &[1, nr]);
                        self.b.select(here, seg, later)
                    }
                });
            }
            let t = t.ok_or_else(|| self.invalid("an empty panel"))?;
            self.b.store(
                t,
                dst,
                vec![
                    Affine::constant(u as i64),
                    row.plus_scaled(1, &Affine::axis(0)),
                    Affine::axis(1),
                ],
                None,
            );
        }
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        Ok(())
    }

    /// Whether contraction `m` runs as a packed product wider than the
    /// target's narrow products (not the narrow kernel): what fusing into
    /// its programs takes.
    pub(super) fn packs_wide(&self, m: LOpId) -> bool {
        self.packs(m) && self.f32_operands(m) && self.narrow(m).is_none()
    }

    /// The kernel of a [`RowFusion`]: a grid over the batch and blocks of
    /// `mc` rows; each program runs the first product on its rows into its
    /// scratch copy of S's rows, the row nest on them (S and P in scratch),
    /// then the second product of its rows of P, whose epilogue writes the
    /// result. The products' right operands are packed by kernels of their
    /// own when several blocks of rows read them, as a product's are.
    pub(super) fn fused_rows_kernel(&mut self, f: &RowFusion) -> Result<(), TileConvError> {
        let [b1, b2, b3] = f.batches.map(|b| self.batch_loop(b));
        let [m1, m2] = f.products;
        let batches = b1.map_or(1, |b| b.2);
        let mut plans = [
            self.pack_plan(m1, batches, false)?,
            self.pack_plan(m2, batches, false)?,
        ];
        // One register tile for both: where only one product is deep
        // enough for the taller tile (`Packing::tall_mr`), the other's.
        if plans[0].mr != plans[1].mr {
            let tile = Some([plans[0].mr.min(plans[1].mr), plans[0].nr]);
            plans = [
                self.pack_plan_tiled(m1, batches, false, tile, None)?,
                self.pack_plan_tiled(m2, batches, false, tile, None)?,
            ];
        }
        if plans[0].mc != plans[1].mc || plans[0].mr != plans[1].mr {
            return Err(self.invalid("fused products with different blocks of rows"));
        }
        let panels = [
            self.panels(m1, b1.as_slice(), &plans[0])?,
            self.panels(m2, b3.as_slice(), &plans[1])?,
        ];
        let (mr, nr, mc) = (plans[0].mr, plans[0].nr, plans[0].mc);
        let mut grid: Vec<usize> = b1.iter().map(|b| b.2).collect();
        grid.push(plans[0].blocks);
        let schedule = Schedule::Fused {
            blocking: [mr, nr, mc, plans[0].kc, plans[1].kc],
        };
        self.b.begin_kernel(grid, schedule);
        self.values.clear();
        let bat = self.batch_ids(&[b1, b2, b3]);
        let p = self.b.program_id(bat.len());
        let i0 = Affine::value(p).scaled(mc as i64);
        // This program's rows of S and P.
        for v in f.held {
            let LType::Buffer(t) = self.src.ty(v) else {
                return Err(self.invalid("a fused value is not a buffer"));
            };
            let width = t.shape[t.shape.len() - 1];
            let scratch = self.b.alloc(BufferType::contiguous(
                DType::F32,
                vec![mc, width],
                Space::Scratch,
            ));
            let axes = vec![
                (bat.len(), i0.clone()),
                (bat.len() + 1, Affine::constant(0)),
            ];
            self.redirects.insert(v, Redirect { scratch, axes });
        }
        let zero = Affine::constant(0);
        let result = (|| -> Result<(), TileConvError> {
            // Each product reads its block of rows where it lies when that
            // needs no mask: the queries (a block a program reads once per
            // panel), the probabilities (in scratch memory already).
            self.strips = self.rows_in_place(m1, &plans[0]);
            let first = self.program_product(
                m1,
                &plans[0],
                panels[0],
                &bat,
                &i0,
                &zero,
                &zero,
                TileEpilogue::Block,
            );
            self.strips = Strips::Own;
            let first = first?.ok_or_else(|| self.invalid("a fused product without its block"))?;
            // The row nest on each of the block's rows (rows past the
            // product's are computed on scratch memory and never stored).
            let rows = self.op(f.rows);
            // A last loop scaling the row of P by one factor (softmax's
            // normalization) is left to the second product, which scales
            // its result's row instead: `(c * p) @ v = c * (p @ v)`, a
            // pass over 64 columns instead of 384 in attention.
            let body = &rows.regions[0].ops;
            let scale = self.row_scale(body, f.held[1]).map(|c| {
                let factors = BufferType::contiguous(DType::F32, vec![mc], Space::Scratch);
                (c, self.b.alloc(factors))
            });
            let (r, _) = self.b.begin_for(0, mc as i64, 1, &[]);
            // The first product's epilogue on the row, then the row nest
            // reads it from the first level of cache.
            self.epilogue_row(&first, r)?;
            self.index.insert(
                rows.regions[0].args[0],
                i0.plus_scaled(1, &Affine::value(r)),
            );
            match scale {
                Some((c, factors)) => {
                    self.ops(&body[..body.len() - 1])?;
                    let c = self.scalar(c)?;
                    self.b.store(c, factors, vec![Affine::value(r)], None);
                }
                None => self.ops(body)?,
            }
            self.b.end_for(vec![]);
            self.strips = self.rows_in_place(m2, &plans[1]);
            self.row_factors = scale.map(|(_, factors)| factors);
            let epilogue = TileEpilogue::light_or_block(self.light_epilogue(m2)?);
            let result = self
                .program_product(m2, &plans[1], panels[1], &bat, &i0, &zero, &zero, epilogue)
                .and_then(|e| e.map_or(Ok(()), |e| self.epilogue(&e)));
            self.strips = Strips::Own;
            self.row_factors = None;
            result
        })();
        self.redirects.clear();
        result?;
        self.b.end_kernel();
        for p in panels {
            if let Panels::Global(p) = p {
                self.b.dealloc(p);
            }
        }
        Ok(())
    }

    /// Whether a row nest's body ends with a loop that only scales the row
    /// of `p` by a factor computed before it, `p[.., i, k] = p[.., i, k] *
    /// c` for every `k` (softmax's normalization): `c` if so.
    pub(super) fn row_scale(&self, body: &[LOpId], p: LValue) -> Option<LValue> {
        let (&last, _) = body.split_last()?;
        let op = self.op(last);
        let L::For { lo: 0, hi, step: 1 } = op.kind else {
            return None;
        };
        let LType::Buffer(t) = self.src.ty(p) else {
            return None;
        };
        if t.shape.last() != Some(&(hi as usize)) || !op.operands.is_empty() {
            return None;
        }
        let k = op.regions[0].args[0];
        let ops: Vec<&dlc_loop::OpData> = op.regions[0]
            .ops
            .iter()
            .map(|&o| self.op(o))
            .filter(|d| !matches!(d.kind, L::Yield) || !d.operands.is_empty())
            .collect();
        let [load, mul, store] = ops.as_slice() else {
            return None;
        };
        let (
            L::Load {
                index: from,
                pad: None,
            },
            L::Binary(BinaryOp::Mul),
            L::Store { index: to },
        ) = (&load.kind, &mul.kind, &store.kind)
        else {
            return None;
        };
        let x = load.results[0];
        let c = match mul.operands.as_slice() {
            [a, c] | [c, a] if *a == x && *c != x => *c,
            _ => return None,
        };
        // The factor is not computed in the loop, and the row is read and
        // written at the same place, the loop's counter last.
        let inside: HashSet<LValue> = [x, mul.results[0]].into();
        let at_k = from.last().is_some_and(|e| is_counter(e, k))
            && from[..from.len() - 1]
                .iter()
                .all(|e| e.terms.iter().all(|t| t.1 != k || t.0 == 0));
        (load.operands[0] == p
            && store.operands[1] == p
            && store.operands[0] == mul.results[0]
            && from == to
            && at_k
            && !inside.contains(&c)
            && c != k)
            .then_some(c)
    }
}
