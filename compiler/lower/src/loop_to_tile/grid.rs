//! Kernels of parallel bands: the grid (a band of parallel loops, one
//! program per iteration), blocked innermost loops, short rows taken
//! several at a time; and the choice, per top-level nest, of the schedule
//! a nest runs under (blocked, rows, a product's dot, packed or narrow).

use dlc_loop::{IndexExpr, OpId as LOpId, OpKind as L, Type as LType, Value as LValue};
use dlc_tile::{Affine, BufferType, Schedule, Space};

use super::{Conv, Redirect, TileConvError, is_counter, is_parallel, loop_bounds};

impl<'a> Conv<'a> {
    /// A top-level parallel nest or contraction as its own kernel.
    pub(super) fn parallel_kernel(&mut self, root: LOpId) -> Result<(), TileConvError> {
        self.values.clear();
        // A nest with an empty loop in its band does nothing: no kernel (a
        // grid has at least one program).
        let mut at = root;
        while let Some((lo, hi, _)) = loop_bounds(&self.op(at).kind) {
            if hi <= lo {
                return Ok(());
            }
            match self.op(at).regions[0].ops.as_slice() {
                [inner] if is_parallel(&self.op(*inner).kind) => at = *inner,
                _ => break,
            }
        }
        // The band of perfectly nested parallel loops.
        let mut band: Vec<LOpId> = vec![];
        let mut at = root;
        loop {
            let op = self.op(at);
            if !is_parallel(&op.kind) || band.len() == 3 {
                break;
            }
            band.push(at);
            match op.regions[0].ops.as_slice() {
                [inner]
                    if is_parallel(&self.op(*inner).kind)
                        || matches!(self.op(*inner).kind, L::Matmul(_)) =>
                {
                    at = *inner
                }
                _ => break,
            }
        }
        let inner_matmul = if band.is_empty() {
            Some(root)
        } else {
            let last = self.op(*band.last().unwrap_or(&root));
            match last.regions[0].ops.as_slice() {
                [m] if matches!(self.op(*m).kind, L::Matmul(_))
                    && (band.len() < 2
                        || band.len() == 2 && self.packs(*m) && self.narrow(*m).is_none()) =>
                {
                    Some(*m)
                }
                _ => None,
            }
        };
        if let Some(m) = inner_matmul {
            if band.len() <= 2 && self.packs(m) {
                if let Some(tile) = self.narrow(m) {
                    return self.narrow_kernels(&band, m, tile);
                }
                return self.packed_dot(&band, m);
            }
            return self.dot_kernel(&band, m);
        }
        let last = *band.last().ok_or_else(|| self.invalid("empty band"))?;
        if band.len() == 1
            && let Some(inner) = self.short_rows(last)
        {
            return self.short_rows_kernel(last, inner);
        }
        let last_op = self.op(last);
        let straight = last_op.regions[0].ops.iter().all(|o| {
            loop_bounds(&self.op(*o).kind).is_none() && !matches!(self.op(*o).kind, L::Matmul(_))
        });
        // A body of reductions better run across this loop's iterations
        // (`vectorizable_outside`: a column sum `out[j] = sum[i](x[i, j])`
        // with `j` the last parallel loop) is blocked too: each program
        // takes a tile of iterations and adds rows of them, one contiguous
        // load at a time, instead of one iteration gathering down a column.
        let blocked = if straight {
            self.vectorizable(last).is_some()
        } else {
            self.vectorizable_outside(last)
                .is_some_and(|carries| carries.is_empty())
        };
        // A program of a sum down columns takes `column_strips` tiles side
        // by side: longer runs of each row it reads.
        let width = if straight {
            self.params.vector
        } else {
            self.params.vector * self.params.column_strips
        };
        let mut grid = vec![];
        for &l in &band {
            let (lo, hi, _) = loop_bounds(&self.op(l).kind).unwrap_or((0, 1, 1));
            let n = (hi - lo).max(0) as usize;
            if l == last && blocked {
                let w = width.min(n.max(1));
                grid.push(n.div_ceil(w).max(1));
            } else {
                grid.push(n.max(1));
            }
        }
        let schedule = if blocked {
            Schedule::Blocked {
                vector: width,
                tile: None,
            }
        } else {
            Schedule::Rows {
                vector: self.params.vector,
            }
        };
        self.b.begin_kernel(grid.clone(), schedule);
        for (axis, &l) in band.iter().enumerate() {
            let op = self.op(l);
            let (lo, hi, _) = loop_bounds(&op.kind).unwrap_or((0, 1, 1));
            let pid = self.b.program_id(axis);
            let counter = op.regions[0].args[0];
            if l == last && blocked {
                let n = (hi - lo).max(0) as usize;
                let w = width.min(n.max(1));
                let base = Affine::value(pid)
                    .scaled(w as i64)
                    .plus_scaled(1, &Affine::constant(lo));
                self.index
                    .insert(counter, base.plus_scaled(1, &Affine::axis(0)));
                self.shape = vec![w];
                self.mask = (!n.is_multiple_of(w)).then(|| {
                    let limit =
                        Affine::constant(n as i64).plus_scaled(-(w as i64), &Affine::value(pid));
                    self.b.mask(vec![limit], &[w])
                });
                self.splats.clear();
            } else {
                self.index.insert(
                    counter,
                    Affine::value(pid).plus_scaled(1, &Affine::constant(lo)),
                );
            }
        }
        let private = if blocked {
            vec![]
        } else {
            self.private_buffers(root, &band)
        };
        for &(v, kept) in &private {
            let LType::Buffer(t) = self.src.ty(v) else {
                continue;
            };
            let global = self.buffer(v)?;
            let scratch = self.b.alloc(BufferType::contiguous(
                t.dtype,
                t.shape[kept..].to_vec(),
                Space::Scratch,
            ));
            let axes = (kept..t.shape.len())
                .map(|a| (a, Affine::constant(0)))
                .collect();
            self.redirects.insert(v, Redirect { scratch, axes });
            self.privatized.insert(global);
        }
        let body = &self.op(last).regions[0];
        let result = self.ops(&body.ops);
        for (v, _) in private {
            self.redirects.remove(&v);
        }
        self.leave_tiles();
        result?;
        self.b.end_kernel();
        Ok(())
    }

    /// The buffers nest `root` (over the parallel loops `band`) may hold in
    /// each program's scratch memory, with the first axis each keeps: a
    /// contiguous allocation of the function that no other top-level op uses
    /// (its deallocation aside), whose every access in the nest indexes its
    /// leading axes by the band's counters in order, exactly, and by no
    /// other band counter after them. Each program then reads only what it
    /// wrote, so its part need not be a global buffer: a depthwise
    /// convolution's copy of its channel in phases
    /// (`graph_to_loop::phase_copy`) stays in the core's cache, where as one
    /// buffer of every channel (as large as the input) it was written back
    /// to memory: MobileNetV2's 112 x 112 x 96 at stride 2 took 50% longer.
    /// On a CPU (scratch memory is per thread there).
    fn private_buffers(&self, root: LOpId, band: &[LOpId]) -> Vec<(LValue, usize)> {
        if self.params.packed.is_none() {
            return vec![];
        }
        let counters: Vec<LValue> = band
            .iter()
            .map(|&l| self.op(l).regions[0].args[0])
            .collect();
        let mut accesses: Vec<(LValue, &[IndexExpr])> = vec![];
        self.buffer_accesses(root, &mut accesses);
        let mut kept: Vec<(LValue, Option<usize>)> = vec![];
        for (v, index) in accesses {
            let leading = index
                .iter()
                .zip(&counters)
                .take_while(|(e, c)| is_counter(e, **c))
                .count();
            let others = index[leading..]
                .iter()
                .any(|e| counters.iter().any(|c| e.coefficient(*c) != 0));
            let k = (leading > 0 && !others).then_some(leading);
            match kept.iter_mut().find(|(b, _)| *b == v) {
                Some((_, prev)) => {
                    if *prev != k {
                        *prev = None;
                    }
                }
                None => kept.push((v, k)),
            }
        }
        kept.into_iter()
            .filter_map(|(v, k)| Some((v, k?)))
            .filter(|&(v, _)| {
                self.allocated_here(v)
                    && self.users.get(&v).is_some_and(|u| u == &[root])
                    && matches!(self.src.ty(v), LType::Buffer(t) if t.is_contiguous())
            })
            .collect()
    }

    /// Every load and store under `id`: its buffer and index.
    fn buffer_accesses<'s>(&'s self, id: LOpId, out: &mut Vec<(LValue, &'s [IndexExpr])>) {
        let op = self.op(id);
        match &op.kind {
            L::Load { index, .. } => out.extend(op.operands.first().map(|&b| (b, &index[..]))),
            L::Store { index } => out.extend(op.operands.get(1).map(|&b| (b, &index[..]))),
            _ => {}
        }
        for r in &op.regions {
            for &o in &r.ops {
                self.buffer_accesses(o, out);
            }
        }
    }

    /// Whether `v` is the result of one of the function's top-level
    /// allocations.
    fn allocated_here(&self, v: LValue) -> bool {
        self.src.body.ops.iter().any(|&id| {
            let op = self.op(id);
            matches!(op.kind, L::Alloc) && op.results.first() == Some(&v)
        })
    }

    /// For a parallel loop `outer` whose body is one loop over rows shorter
    /// than a tile (`vector` iterations) with a straight-line body, that
    /// loop: such rows are better taken several at a time, as 2-D tiles.
    /// Every store must write distinct places for distinct `(i, j)`: each
    /// index dimension uses at most one of the two counters, and both
    /// appear.
    pub(super) fn short_rows(&self, outer: LOpId) -> Option<LOpId> {
        let op = self.op(outer);
        let [inner] = op.regions[0].ops.as_slice() else {
            return None;
        };
        let inner_op = self.op(*inner);
        let (lo, hi, step) = loop_bounds(&inner_op.kind)?;
        let (i, j) = (op.regions[0].args[0], inner_op.regions[0].args[0]);
        let straight = inner_op.regions[0].ops.iter().all(|o| {
            loop_bounds(&self.op(*o).kind).is_none() && !matches!(self.op(*o).kind, L::Matmul(_))
        });
        if step != 1
            || !inner_op.operands.is_empty()
            || (hi - lo) as usize >= self.params.vector
            || !straight
            || self.vectorizable(*inner).is_none_or(|c| !c.is_empty())
        {
            return None;
        }
        let separable = inner_op.regions[0]
            .ops
            .iter()
            .all(|o| match &self.op(*o).kind {
                L::Store { index } => {
                    let uses =
                        |e: &IndexExpr, v: LValue| e.terms.iter().any(|t| t.1 == v && t.0 != 0);
                    index.iter().all(|e| !(uses(e, i) && uses(e, j)))
                        && index.iter().any(|e| uses(e, i))
                        && index.iter().any(|e| uses(e, j))
                }
                _ => true,
            });
        separable.then_some(*inner)
    }

    /// Rows `outer` x `inner` as `r x c` tiles: `c` the whole (short) row,
    /// `r` rows so that a tile holds about `vector` elements; one program
    /// per block of rows.
    pub(super) fn short_rows_kernel(
        &mut self,
        outer: LOpId,
        inner: LOpId,
    ) -> Result<(), TileConvError> {
        let (o, n) = (self.op(outer), self.op(inner));
        let (ilo, ihi, _) = loop_bounds(&o.kind).unwrap_or((0, 1, 1));
        let (jlo, jhi, _) = loop_bounds(&n.kind).unwrap_or((0, 1, 1));
        let (rows, c) = ((ihi - ilo).max(1) as usize, (jhi - jlo).max(1) as usize);
        let r = (self.params.vector / c).clamp(1, rows);
        let schedule = Schedule::Blocked {
            vector: self.params.vector,
            tile: Some([r, c]),
        };
        self.b.begin_kernel(vec![rows.div_ceil(r)], schedule);
        let pid = self.b.program_id(0);
        let row0 = Affine::value(pid)
            .scaled(r as i64)
            .plus_scaled(1, &Affine::constant(ilo));
        self.index
            .insert(o.regions[0].args[0], row0.plus_scaled(1, &Affine::axis(0)));
        self.index.insert(
            n.regions[0].args[0],
            Affine::constant(jlo).plus_scaled(1, &Affine::axis(1)),
        );
        self.shape = vec![r, c];
        self.splats.clear();
        self.mask = (!rows.is_multiple_of(r)).then(|| {
            let left = Affine::constant(rows as i64).plus_scaled(-(r as i64), &Affine::value(pid));
            self.b.mask(vec![left, Affine::constant(c as i64)], &[r, c])
        });
        let result = self.ops(&n.regions[0].ops);
        self.leave_tiles();
        result?;
        self.b.end_kernel();
        Ok(())
    }
}
