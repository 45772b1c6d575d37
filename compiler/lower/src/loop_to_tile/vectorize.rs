//! A program's body: loop ops converted in the program, every innermost
//! loop a `tile.for` over `vector`-wide tiles, reductions carried as tiles
//! of partial results.

use std::collections::{HashMap, HashSet};

use dlc_core::DType;
use dlc_core::scalar::{BinaryOp, ReduceKind};
use dlc_loop::{
    Block as LBlock, IndexExpr, OpId as LOpId, OpKind as L, Type as LType, Value as LValue,
};
use dlc_tile::{Affine, MAX_DEINTERLEAVED_STEP, TileType, Type, Value};

use super::{Conv, TileConvError, loop_bounds, moves_with};
use dlc_core::ir::OpDecl;

/// A reduction carried by an innermost loop: the carried argument is read
/// once, by `combine`, whose result is yielded in its place.
#[derive(Clone, Copy)]
pub(super) struct Carry {
    pub(super) kind: ReduceKind,
    pub(super) op: BinaryOp,
    /// The combining op in the body.
    pub(super) combine: LOpId,
}

impl<'a> Conv<'a> {
    /// Whether the innermost loop `id` can run as tiles: its reductions,
    /// or `None`.
    pub(super) fn vectorizable(&self, id: LOpId) -> Option<Vec<Carry>> {
        self.vectorizable_over(id, &[])
    }

    /// Whether loop `id`, whose body holds loops, is better run as tiles of
    /// its own iterations, each lane running the inner loops for its
    /// iteration: its reductions, or `None`. So when the inner loops are
    /// short reductions (no longer than the tile this loop's iterations
    /// make: a 5 x 5 window over 7 columns is 25 taps of 7-lane tiles, not 5
    /// of 5 lanes and a reduction for every column), store nothing, and read
    /// along this loop's counter contiguously or a few elements apart (a
    /// strided convolution's columns, up to `MAX_DEINTERLEAVED_STEP`): a
    /// depthwise convolution's `sum[ky, kx]` for each output column is then
    /// a tile of columns per tap, not a tile of 3 taps reduced for every
    /// column. Inner reductions of any length are taken outside when every
    /// read they make that moves with this loop moves with their counters
    /// by more than one element, and some read does: a column sum
    /// (`sum[i](x[i, j])` for each `j`) is rows of columns added, not a
    /// gather along a column for every column, and so is a row times a
    /// matrix (`sum[k](x[k] * w[k, j])`, `x[k]` one value per tile).
    pub(super) fn vectorizable_outside(&self, id: LOpId) -> Option<Vec<Carry>> {
        let op = self.op(id);
        let (lo, hi, _) = loop_bounds(&op.kind)?;
        let body = &op.regions[0];
        let counter = body.args[0];
        let limit = self.params.vector.min((hi - lo).max(0) as usize);
        let reductions = |limit: usize| {
            let (mut inner, mut counters) = (vec![], vec![]);
            for &o in &body.ops {
                if loop_bounds(&self.op(o).kind).is_some()
                    && !self.short_reduction(o, limit, &mut inner, &mut counters)
                {
                    return None;
                }
            }
            Some((inner, counters))
        };
        let inner = match reductions(limit) {
            Some((inner, _)) => inner,
            None => {
                let (inner, counters) = reductions(usize::MAX)?;
                // A read that does not move with this loop's counter is one
                // value for the whole tile (a row's `x[k]` in `sum[k](x[k] *
                // w[k, j])` for each `j`), whatever its stride.
                let strided = inner.iter().all(|&o| {
                    let d = self.op(o);
                    match &d.kind {
                        L::Load { index, .. } => {
                            !moves_with(index, counter)
                                || counters.iter().all(|&c| {
                                    !moves_with(index, c)
                                        || !self.unit_stride(d.operands[0], index, c)
                                })
                        }
                        _ => true,
                    }
                });
                // And some read does move with it: a reduction whose every
                // read is the same for each iteration of this loop (a mean
                // kept over a last axis of one) is no tile of columns.
                let moves = inner.iter().any(|&o| {
                    matches!(&self.op(o).kind, L::Load { index, .. } if moves_with(index, counter))
                });
                if !strided || !moves {
                    return None;
                }
                inner
            }
        };
        if inner.is_empty() {
            return None;
        }
        // Every read moving with the counter moves by a few elements at
        // most: one element (a column of taps) or a stride's few (a strided
        // convolution's columns, each tile read as one wide load and a
        // shuffle).
        let near = inner.iter().all(|&o| {
            let d = self.op(o);
            match &d.kind {
                L::Load { index, .. } => {
                    !moves_with(index, counter)
                        || self
                            .step(d.operands[0], index, counter)
                            .is_some_and(|s| (1..=MAX_DEINTERLEAVED_STEP).contains(&s))
                }
                _ => true,
            }
        });
        if !near {
            return None;
        }
        self.vectorizable_over(id, &inner)
    }

    /// Whether loop `id` is a short reduction nest: every loop in it of
    /// step one and at most `limit` iterations, nothing stored, no product.
    /// Collects the ops of its bodies into `ops` and their counters into
    /// `counters`.
    fn short_reduction(
        &self,
        id: LOpId,
        limit: usize,
        ops: &mut Vec<LOpId>,
        counters: &mut Vec<LValue>,
    ) -> bool {
        let op = self.op(id);
        let Some((lo, hi, step)) = loop_bounds(&op.kind) else {
            return false;
        };
        if step != 1 || (hi - lo).max(0) as usize > limit || !matches!(op.kind, L::For { .. }) {
            return false;
        }
        counters.push(op.regions[0].args[0]);
        for &o in &op.regions[0].ops {
            match &self.op(o).kind {
                L::For { .. } | L::Parallel { .. } => {
                    if !self.short_reduction(o, limit, ops, counters) {
                        return false;
                    }
                }
                L::Store { .. } | L::Matmul(_) => return false,
                _ => ops.push(o),
            }
        }
        true
    }

    /// [`Conv::vectorizable`] for a loop whose body may hold loops, whose
    /// ops are `inner` (loads only checked: they store nothing).
    fn vectorizable_over(&self, id: LOpId, inner: &[LOpId]) -> Option<Vec<Carry>> {
        let op = self.op(id);
        let (_, _, step) = loop_bounds(&op.kind)?;
        if step != 1 {
            return None;
        }
        let body = &op.regions[0];
        let counter = body.args[0];
        let mut stored: HashSet<LValue> = HashSet::new();
        let mut loaded: HashSet<LValue> = HashSet::new();
        // Every access: the buffer value and its index.
        let mut accesses: Vec<(LValue, &[IndexExpr])> = Vec::new();
        for &o in &body.ops {
            let d = self.op(o);
            match &d.kind {
                L::Store { index } => {
                    let distinct = index
                        .iter()
                        .any(|e| e.terms.iter().any(|t| t.1 == counter && t.0 != 0));
                    if !distinct {
                        return None;
                    }
                    stored.insert(d.operands[1]);
                    accesses.push((d.operands[1], index));
                }
                L::Load { index, pad } => {
                    loaded.insert(d.operands[0]);
                    // A padded load reads past the edges, where no store
                    // writes: never an in-place access.
                    if pad.is_none() {
                        accesses.push((d.operands[0], index));
                    } else {
                        accesses.push((d.operands[0], &[]));
                    }
                }
                // An index read from data differs from lane to lane: the
                // loop runs as scalars.
                L::Cast if self.is_index_cast(d) => return None,
                L::For { .. } | L::Parallel { .. } if !inner.is_empty() => {}
                L::For { .. } | L::Parallel { .. } | L::Matmul(_) => {
                    return None;
                }
                _ => {}
            }
        }
        for &o in inner {
            let d = self.op(o);
            if self.is_index_cast(d) {
                return None;
            }
            if let L::Load { index, pad } = &d.kind {
                loaded.insert(d.operands[0]);
                accesses.push((d.operands[0], if pad.is_none() { index } else { &[] }));
            }
        }
        // Views alias: compare storage roots. A buffer both read and
        // written is updated in place only when every access of it is
        // through one value at one index (each iteration reads and writes
        // its own elements, which a vector of iterations keeps).
        let root = |v: LValue| self.root_buffer(v);
        let stored: HashSet<LValue> = stored.into_iter().map(root).collect();
        let loaded: HashSet<LValue> = loaded.into_iter().map(root).collect();
        for r in stored.intersection(&loaded) {
            let mut of_r = accesses.iter().filter(|(v, _)| root(*v) == *r);
            let first = of_r.next();
            if of_r.any(|a| Some(a) != first) {
                return None;
            }
        }
        let carried = &body.args[1..];
        let yield_op = body.ops.last().map(|o| self.op(*o));
        let mut carries = vec![];
        for (k, &c) in carried.iter().enumerate() {
            let users: Vec<LOpId> = body
                .ops
                .iter()
                .copied()
                .filter(|o| self.op(*o).operands.contains(&c))
                .collect();
            let [user] = users.as_slice() else {
                return None;
            };
            let u = self.op(*user);
            let (kind, bop) = match u.kind {
                L::Binary(b @ BinaryOp::Add) => (ReduceKind::Sum, b),
                L::Binary(b @ BinaryOp::Mul) => (ReduceKind::Prod, b),
                L::Binary(b @ BinaryOp::Max) => (ReduceKind::Max, b),
                L::Binary(b @ BinaryOp::Min) => (ReduceKind::Min, b),
                _ => return None,
            };
            if u.operands[0] == u.operands[1]
                || yield_op.is_none_or(|y| {
                    !matches!(y.kind, L::Yield) || y.operands.get(k) != Some(&u.results[0])
                })
            {
                return None;
            }
            // The partial result is only yielded.
            let used_elsewhere = body
                .ops
                .iter()
                .filter(|o| self.op(**o).operands.contains(&u.results[0]))
                .count()
                != 1;
            if used_elsewhere {
                return None;
            }
            carries.push(Carry {
                kind,
                op: bop,
                combine: *user,
            });
        }
        Some(carries)
    }

    /// Whether `op` is `loop.cast %i : index` (an integer made an index).
    fn is_index_cast(&self, op: &dlc_loop::OpData) -> bool {
        matches!(op.kind, L::Cast)
            && op
                .results
                .first()
                .is_some_and(|r| matches!(self.src.ty(*r), LType::Index))
    }

    /// Converts a list of ops in the current region.
    pub(super) fn ops(&mut self, ops: &[LOpId]) -> Result<(), TileConvError> {
        for &id in ops {
            let loc = self.op(id).loc.clone();
            self.b.set_loc(loc);
            self.op_in_program(id)?;
        }
        Ok(())
    }

    pub(super) fn affine(&self, e: &IndexExpr) -> Result<Affine, TileConvError> {
        let mut out = Affine::constant(e.constant);
        for &(c, v) in &e.terms {
            let a = self.index.get(&v).ok_or_else(|| {
                self.invalid(format!("index value {} has no tile counterpart", v.0))
            })?;
            out = out.plus_scaled(c, a);
        }
        Ok(out)
    }

    /// The tile counterpart of a scalar: computed in this program, or a
    /// constant re-created here.
    pub(super) fn scalar(&mut self, v: LValue) -> Result<Value, TileConvError> {
        if let Some(&t) = self.values.get(&v) {
            return Ok(t);
        }
        if let Some(&(c, d)) = self.consts.get(&v) {
            let t = self.b.constant(c, Type::Scalar(d));
            self.values.insert(v, t);
            return Ok(t);
        }
        Err(self.invalid(format!("value {} is used before it is computed", v.0)))
    }

    pub(super) fn is_tile(&self, t: Value) -> bool {
        matches!(self.b.ty(t), Type::Tile(_))
    }

    /// The counterpart of `v` as a tile of the region's shape.
    pub(super) fn as_tile(&mut self, v: LValue) -> Result<Value, TileConvError> {
        let t = self.scalar(v)?;
        if self.is_tile(t) || self.shape.is_empty() {
            return Ok(t);
        }
        if let Some(&s) = self.splats.get(&v) {
            return Ok(s);
        }
        let shape = self.shape.clone();
        let s = self.b.splat(t, &shape);
        self.splats.insert(v, s);
        Ok(s)
    }

    /// Operands of an element-wise op: all tiles when any is, else scalars.
    pub(super) fn elementwise_operands(
        &mut self,
        vs: &[LValue],
    ) -> Result<Vec<Value>, TileConvError> {
        let direct: Vec<Value> = vs
            .iter()
            .map(|v| self.scalar(*v))
            .collect::<Result<_, _>>()?;
        if direct.iter().any(|t| self.is_tile(*t)) {
            vs.iter().map(|v| self.as_tile(*v)).collect()
        } else {
            Ok(direct)
        }
    }

    pub(super) fn result_dtype(&self, v: LValue) -> DType {
        match self.src.ty(v) {
            LType::Scalar(d) => *d,
            _ => DType::F32,
        }
    }

    /// Back to scalar code after a region of tiles: no tile shape, no
    /// mask, no splatted scalars.
    pub(super) fn leave_tiles(&mut self) {
        self.shape.clear();
        self.mask = None;
        self.splats.clear();
    }

    pub(super) fn op_in_program(&mut self, id: LOpId) -> Result<(), TileConvError> {
        let op = self.op(id);
        let r = op.results.first().copied();
        let set = |c: &mut Self, t: Value| {
            if let Some(r) = r {
                c.values.insert(r, t);
            }
        };
        match &op.kind {
            L::Const(v) => {
                let t = self
                    .b
                    .constant(*v, Type::Scalar(self.result_dtype(op.results[0])));
                set(self, t);
            }
            L::Unary(u) => {
                let x = self.elementwise_operands(&op.operands)?;
                let t = self.b.unary(*u, x[0]);
                set(self, t);
            }
            L::Binary(bop) => {
                let mut x = self.elementwise_operands(&op.operands)?;
                // A masked-off lane must not divide by zero.
                if *bop == BinaryOp::Div
                    && self.result_dtype(op.operands[0]).is_int()
                    && let Some(m) = self.mask
                    && self.is_tile(x[1])
                {
                    let one = self.b.constant(1.0, self.b.ty(x[1]).clone());
                    x[1] = self.b.select(m, x[1], one);
                }
                let t = self.b.binary(*bop, x[0], x[1]);
                set(self, t);
            }
            L::Compare(c) => {
                let x = self.elementwise_operands(&op.operands)?;
                let t = self.b.compare(*c, x[0], x[1]);
                set(self, t);
            }
            L::Select => {
                let x = self.elementwise_operands(&op.operands)?;
                let t = self.b.select(x[0], x[1], x[2]);
                set(self, t);
            }
            // An integer as an index (a gather's row): computed once, in
            // scalar code (a loop that would compute one per lane is not
            // vectorized), and used by the accesses after it.
            L::Cast if self.is_index_cast(op) => {
                let x = self.scalar(op.operands[0])?;
                if self.is_tile(x) {
                    return Err(self.invalid("an index computed per lane of a tile"));
                }
                let t = self.b.index_of(x);
                self.index.insert(op.results[0], Affine::value(t));
            }
            L::Cast => {
                let x = self.elementwise_operands(&op.operands)?;
                let t = self.b.cast(x[0], self.result_dtype(op.results[0]));
                set(self, t);
            }
            L::Load { index, pad } => {
                let index: Vec<Affine> = index
                    .iter()
                    .map(|e| self.affine(e))
                    .collect::<Result<_, _>>()?;
                let (buf, index) = self.place(op.operands[0], index)?;
                let d = self.result_dtype(op.results[0]);
                let t = if index.iter().any(|e| !e.axes.is_empty()) {
                    // A ragged tile's masked-off lanes need no pad: an
                    // unpadded load stays one, with no bounds test per lane.
                    let ty = Type::Tile(TileType::new(d, self.shape.clone()));
                    self.b.load(buf, index, self.mask, *pad, ty)
                } else {
                    self.b.load(buf, index, None, *pad, Type::Scalar(d))
                };
                set(self, t);
            }
            L::Store { index } => {
                let index: Vec<Affine> = index
                    .iter()
                    .map(|e| self.affine(e))
                    .collect::<Result<_, _>>()?;
                let (buf, index) = self.place(op.operands[1], index)?;
                let tiled = index.iter().any(|e| !e.axes.is_empty());
                let v = if tiled {
                    self.as_tile(op.operands[0])?
                } else {
                    self.scalar(op.operands[0])?
                };
                if self.is_tile(v) && !tiled {
                    return Err(self.invalid("a tile stored at one place"));
                }
                let mask = if tiled { self.mask } else { None };
                self.b.store(v, buf, index, mask);
            }
            L::For { .. } | L::Parallel { .. } => self.loop_in_program(id)?,
            L::Matmul(_) => self.dot_in_program(id)?,
            L::Yield => {}
            L::Alloc
            | L::Global(_)
            | L::Dealloc
            | L::View
            | L::Return
            | L::KernelBegin(_)
            | L::KernelEnd => {
                return Err(self.invalid(format!("{} inside a loop nest", op.kind.name())));
            }
        }
        Ok(())
    }

    pub(super) fn loop_in_program(&mut self, id: LOpId) -> Result<(), TileConvError> {
        let op = self.op(id);
        let (lo, hi, step) = loop_bounds(&op.kind).unwrap_or((0, 0, 1));
        let body: &'a LBlock = &op.regions[0];
        let innermost = body.ops.iter().all(|o| {
            loop_bounds(&self.op(*o).kind).is_none() && !matches!(self.op(*o).kind, L::Matmul(_))
        });
        if self.shape.is_empty() && !self.ranges.contains_key(&id) {
            let carries = if innermost {
                self.vectorizable(id)
            } else {
                self.vectorizable_outside(id)
            };
            if let Some(carries) = carries {
                let width = self.tile_width(id, (hi - lo).max(0) as usize, innermost);
                return self.vector_loop(id, lo, hi, width, carries);
            }
        }
        // A counted loop carrying scalars; inside a loop of tiles
        // (`vectorizable_outside`), carrying tiles, one lane per iteration
        // of that loop.
        let tiles = !self.shape.is_empty();
        let carry = |c: &mut Self, v: LValue| if tiles { c.as_tile(v) } else { c.scalar(v) };
        let inits: Vec<Value> = op
            .operands
            .iter()
            .map(|v| carry(self, *v))
            .collect::<Result<_, _>>()?;
        // A program's part of the range (see `Conv::ranges`), or all of it.
        let carried = match self.ranges.get(&id).cloned() {
            Some((from, n)) => {
                let (counter, carried) = self.b.begin_for(0, n, 1, &inits);
                let at = from.plus_scaled(1, &Affine::value(counter));
                self.index.insert(body.args[0], at);
                carried
            }
            None => {
                let (counter, carried) = self.b.begin_for(lo, hi, step, &inits);
                self.index.insert(body.args[0], Affine::value(counter));
                carried
            }
        };
        for (a, c) in body.args[1..].iter().zip(&carried) {
            self.values.insert(*a, *c);
        }
        // Scalars splatted in a body of tiles are not defined after it.
        let splats = tiles.then(|| self.splats.clone());
        self.ops(&body.ops)?;
        let next: Vec<Value> = match body.ops.last().map(|o| self.op(*o)) {
            Some(y) if matches!(y.kind, L::Yield) => y
                .operands
                .iter()
                .map(|v| carry(self, *v))
                .collect::<Result<_, _>>()?,
            _ => vec![],
        };
        if let Some(splats) = splats {
            self.splats = splats;
        }
        let results = self.b.end_for(next);
        for (r, t) in op.results.iter().zip(results) {
            self.values.insert(*r, t);
        }
        Ok(())
    }

    /// The tiles loop `id` of `n` iterations runs as: `vector` iterations
    /// each, or all `n` in one tile (of up to twice `vector`) where the loop
    /// is taken outside a longer inner loop (`vectorizable_outside`): each
    /// tile runs the inner loops in full, so a rest after the whole tiles
    /// runs them all again. A row by a matrix stored `[K, N]` in chunks of
    /// 40 columns (`graph_to_loop`'s `column_chunks`) read each of the
    /// matrix's rows twice, 32 columns and then 8, 1024 rows 4000 bytes
    /// apart (MobileNetV3-small's classifier).
    fn tile_width(&self, id: LOpId, n: usize, innermost: bool) -> usize {
        let w = self.params.vector.min(n);
        let long_inner = || {
            self.op(id).regions[0].ops.iter().any(|&o| {
                loop_bounds(&self.op(o).kind).is_some_and(|(lo, hi, _)| hi - lo > w as i64)
            })
        };
        if !innermost && n > w && n <= 2 * w && long_inner() {
            n
        } else {
            w
        }
    }

    /// An innermost loop as a `tile.for` over blocks of `w` iterations.
    /// Where the last block is ragged, its mask is an operand of every
    /// block's loads and stores; on a CPU without mask registers
    /// (`CpuDesc::mask_registers`: AVX2, SSE, NEON), where a masked access
    /// costs more than a plain one, the whole blocks run unmasked and the
    /// rest after them as one exact tile, unmasked too.
    pub(super) fn vector_loop(
        &mut self,
        id: LOpId,
        lo: i64,
        hi: i64,
        w: usize,
        carries: Vec<Carry>,
    ) -> Result<(), TileConvError> {
        let op = self.op(id);
        let n = (hi - lo).max(0) as usize;
        if n == 0 {
            for (r, init) in op.results.iter().zip(&op.operands) {
                let t = self.scalar(*init)?;
                self.values.insert(*r, t);
            }
            return Ok(());
        }
        let rest = n % w;
        let peel = rest != 0
            && self
                .params
                .target
                .cpu()
                .is_some_and(|c| !c.mask_registers());
        let parts = if peel {
            let mid = hi - rest as i64;
            let whole = self.vector_blocks(id, lo, mid, w, &carries)?;
            let tail = self.vector_blocks(id, mid, hi, rest, &carries)?;
            vec![whole, tail]
        } else {
            vec![self.vector_blocks(id, lo, hi, w, &carries)?]
        };
        for (k, (r, init)) in op.results.iter().zip(&op.operands).enumerate() {
            let c = carries[k];
            let mut t = None;
            for accs in &parts {
                let part = self.b.reduce(c.kind, 0, accs[k]);
                let before = match t {
                    Some(t) => t,
                    None => self.scalar(*init)?,
                };
                t = Some(self.b.binary(c.op, before, part));
            }
            if let Some(t) = t {
                self.values.insert(*r, t);
            }
        }
        Ok(())
    }

    /// Loop `id`'s iterations `lo..hi` as a `tile.for` over blocks of `w`
    /// (the last one masked when `w` does not divide them): its carries'
    /// tiles of partial results.
    fn vector_blocks(
        &mut self,
        id: LOpId,
        lo: i64,
        hi: i64,
        w: usize,
        carries: &[Carry],
    ) -> Result<Vec<Value>, TileConvError> {
        let op = self.op(id);
        let body: &'a LBlock = &op.regions[0];
        let n = (hi - lo).max(0) as usize;
        let shape = vec![w];
        let mut inits = vec![];
        for (c, init) in carries.iter().zip(&op.operands) {
            let d = self.result_dtype(*init);
            inits.push(self.b.constant(
                c.kind.identity_in(d),
                Type::Tile(TileType::new(d, shape.clone())),
            ));
        }
        // What a masked-off lane contributes to each reduction.
        let ragged = !n.is_multiple_of(w);
        let idents: Vec<Option<Value>> = carries
            .iter()
            .zip(&inits)
            .map(|(c, init)| {
                let ty = self.b.ty(*init).clone();
                let d = ty.dtype().unwrap_or(DType::F32);
                ragged.then(|| self.b.constant(c.kind.identity_in(d), ty))
            })
            .collect();
        let (counter, carried) = self.b.begin_for(lo, hi, w as i64, &inits);
        self.index.insert(
            body.args[0],
            Affine::value(counter).plus_scaled(1, &Affine::axis(0)),
        );
        self.shape = shape.clone();
        self.splats.clear();
        self.mask = ragged.then(|| {
            let limit = Affine::constant(hi).plus_scaled(-1, &Affine::value(counter));
            self.b.mask(vec![limit], &[w])
        });
        let combines: HashMap<LOpId, usize> = carries
            .iter()
            .enumerate()
            .map(|(k, c)| (c.combine, k))
            .collect();
        let mut next = vec![Value(0); carries.len()];
        let result = (|| -> Result<(), TileConvError> {
            for &o in &body.ops {
                let loc = self.op(o).loc.clone();
                self.b.set_loc(loc);
                if let Some(&k) = combines.get(&o) {
                    let d = self.op(o);
                    let x = if d.operands[0] == body.args[1 + k] {
                        d.operands[1]
                    } else {
                        d.operands[0]
                    };
                    let mut x = self.as_tile(x)?;
                    if let (Some(m), Some(ident)) = (self.mask, idents[k]) {
                        x = self.b.select(m, x, ident);
                    }
                    next[k] = self.b.binary(carries[k].op, carried[k], x);
                    continue;
                }
                if matches!(self.op(o).kind, L::Yield) {
                    continue;
                }
                self.op_in_program(o)?;
            }
            Ok(())
        })();
        self.leave_tiles();
        result?;
        Ok(self.b.end_for(next))
    }
}
