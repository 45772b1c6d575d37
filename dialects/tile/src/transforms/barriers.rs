//! Barriers for programs run by many threads (a GPU thread block).
//!
//! On a CPU a program is one thread and runs its ops in order. On a GPU
//! the threads of a block run it together, each holding part of every
//! tile: in the flat layout element `e` of a tile (its row-major
//! position) belongs to thread `e mod T` of `T`, for every tile of every
//! shape (other layouts deal elements otherwise). So when a program
//! writes memory and later reads or writes it again, the element a thread
//! reads may be one another thread wrote, and nothing orders the two
//! unless a `tile.barrier` stands between them. [`insert_barriers`] puts
//! one before every access that may conflict with an earlier one of
//! another thread since the last barrier:
//!
//! - accesses of different buffers never conflict (a view is its base
//!   buffer), nor do two reads, nor accesses of one buffer at different
//!   constant places along a dimension (the two slots of a staging
//!   buffer);
//! - two accesses by the same pattern (the same buffer layout, tile shape,
//!   tile layout and index expressions) in one iteration of every enclosing loop touch
//!   each address from the thread that owns the element there, so a
//!   thread reads its own write (a scalar access is every thread's: each
//!   reads what it wrote, or the same value written by another, but a
//!   read before a write may see another thread's write);
//!   and so do accesses by one pattern in different iterations of loops
//!   when the address is a one-to-one function of the element and those
//!   loops' counters (a row walked 256 elements at a time: the thread
//!   that writes an address is the one that reads it);
//! - anything else needs a barrier.
//!
//! Loops are analysed to a fixed point: what is pending at the end of an
//! iteration is pending at the start of the next. The conversion already
//! separates its shared-memory staging with barriers; this adds those that
//! global and scratch memory need.

use std::collections::HashSet;

use crate::ir::{Affine, Function, Layout, OpId, Type, Value};
use crate::ops::OpKind;

/// One access since the last barrier.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Access {
    op: OpId,
    root: Value,
    write: bool,
    /// The accessed buffer's type (a view's layout), the tile shape and
    /// the index expressions (terms sorted): the access's pattern.
    buffer: Type,
    shape: Vec<usize>,
    index: Vec<Affine>,
    /// How the threads hold the tile (which thread has which element).
    layout: Layout,
    /// Loop counters whose value may have changed since the access (it
    /// happened in an earlier iteration, or the loop has ended).
    stale: Vec<Value>,
}

impl Access {
    fn same_pattern(&self, other: &Access) -> bool {
        self.buffer == other.buffer
            && self.shape == other.shape
            && self.index == other.index
            && self.layout == other.layout
    }
}

struct Analysis<'f> {
    f: &'f Function,
    /// The ops a barrier goes before.
    before: HashSet<OpId>,
    /// Each loop counter's step and trip count.
    loops: Vec<(Value, i64, i64)>,
}

/// Inserts the barriers the kernels of `f` need when a block of threads
/// runs each program (see the module documentation); returns how many.
pub fn insert_barriers(f: &mut Function) -> usize {
    let mut a = Analysis {
        f,
        before: HashSet::new(),
        loops: Vec::new(),
    };
    for &id in &f.body.ops {
        if matches!(f.op(id).kind, OpKind::Kernel { .. }) {
            a.block(&f.op(id).regions[0].ops, &mut Vec::new());
        }
    }
    let before = a.before;
    let n = before.len();
    if n == 0 {
        return 0;
    }
    // Every op before which a barrier goes, with the block holding it.
    let mut blocks: Vec<(usize, usize)> = Vec::new();
    for i in 0..f.ops.len() {
        for r in 0..f.ops[i].regions.len() {
            if f.ops[i].regions[r].ops.iter().any(|o| before.contains(o)) {
                blocks.push((i, r));
            }
        }
    }
    for (i, r) in blocks {
        let ops = std::mem::take(&mut f.ops[i].regions[r].ops);
        let mut out = Vec::with_capacity(ops.len() + 1);
        for o in ops {
            if before.contains(&o) {
                out.push(f.create_op(OpKind::Barrier, vec![], &[], vec![]));
            }
            out.push(o);
        }
        f.ops[i].regions[r].ops = out;
    }
    n
}

impl Analysis<'_> {
    fn access(&self, id: OpId) -> Option<Access> {
        let op = self.f.op(id);
        let (buf, value, write, index) = match &op.kind {
            OpKind::Load { index, .. } => (op.operands[0], op.results[0], false, index),
            OpKind::Store { index } => (op.operands[1], op.operands[0], true, index),
            _ => return None,
        };
        let mut index = index.clone();
        for e in &mut index {
            e.terms.sort_by_key(|t| t.1);
            e.axes.sort_by_key(|t| t.1);
        }
        Some(Access {
            op: id,
            root: self.f.root_buffer(buf),
            write,
            buffer: self.f.ty(buf).clone(),
            shape: self.f.ty(value).shape().unwrap_or(&[]).to_vec(),
            index,
            layout: match self.f.ty(value) {
                Type::Tile(t) => t.layout,
                _ => Layout::Flat,
            },
            stale: Vec::new(),
        })
    }

    /// Whether `later` may touch, from another thread, an address
    /// `earlier` touched, with one of them a write.
    fn conflict(&self, earlier: &Access, later: &Access) -> bool {
        if earlier.root != later.root || !(earlier.write || later.write) {
            return false;
        }
        if separate(earlier, later) {
            return false;
        }
        if !earlier.same_pattern(later) {
            return true;
        }
        if earlier.shape.is_empty() {
            // Every thread makes a scalar access, and within one dynamic
            // instance of the op they all write the same value; but a read
            // before a write may see another thread's write. Two
            // instances differ in some loop counter gone stale: if the
            // address is a one-to-one function of all of them (and depends
            // on one), two instances never share an address.
            let mentioned = |v: &Value| {
                earlier
                    .index
                    .iter()
                    .any(|e| e.terms.iter().any(|t| t.1 == *v))
            };
            let single = |v: &Value| self.loops.iter().any(|l| l.0 == *v && l.2 <= 1);
            let distinct = earlier.stale.iter().any(mentioned)
                && earlier.stale.iter().all(|v| mentioned(v) || single(v))
                && self.injective(earlier);
            return !distinct && (!earlier.stale.is_empty() || !earlier.write);
        }
        !self.injective(earlier)
    }

    /// Whether the pattern's address is a one-to-one function of the
    /// element and of the loop counters that may differ between the two
    /// accesses: then two accesses of one address are by one element, so
    /// by one thread. Every access is inside its buffer (the interpreter
    /// checks it), so when the buffer's layout is one-to-one it is enough
    /// that each dimension's index is a one-to-one function of its own
    /// coordinates; otherwise the element offset must be.
    fn injective(&self, a: &Access) -> bool {
        let Type::Buffer(t) = &a.buffer else {
            return false;
        };
        // Per dimension: (coefficient, count) of each coordinate, in index
        // units; a coordinate is a tile axis or a stale loop counter.
        let mut dims: Vec<Vec<(i64, i64)>> = Vec::new();
        let mut seen: Vec<(Option<usize>, Option<Value>)> = Vec::new();
        let mut shared = false;
        for e in &a.index {
            let mut coords: Vec<(i64, i64)> = Vec::new();
            for &(c, k) in &e.axes {
                let n = a.shape.get(k).copied().unwrap_or(1) as i64;
                shared |= seen.contains(&(Some(k), None));
                seen.push((Some(k), None));
                coords.push((c, n));
            }
            for &(c, v) in &e.terms {
                if !a.stale.contains(&v) {
                    continue;
                }
                let Some(&(_, step, trips)) = self.loops.iter().find(|l| l.0 == v) else {
                    return false;
                };
                shared |= seen.contains(&(None, Some(v)));
                seen.push((None, Some(v)));
                coords.push((c.saturating_mul(step), trips));
            }
            dims.push(coords);
        }
        let layout: Vec<(i64, i64)> = t
            .strides
            .iter()
            .zip(&t.shape)
            .map(|(&s, &n)| (s as i64, n as i64))
            .collect();
        if !shared && mixed_radix(layout) {
            return dims.into_iter().all(mixed_radix);
        }
        // The element offset: each dimension's coordinates times its
        // stride, like terms merged.
        let mut offset: Vec<(i64, i64)> = Vec::new();
        let mut keys: Vec<(Option<usize>, Option<Value>)> = Vec::new();
        let mut at = 0;
        for (coords, &stride) in dims.iter().zip(&t.strides) {
            for &(c, n) in coords {
                let key = seen[at];
                at += 1;
                let c = c.saturating_mul(stride as i64);
                match keys.iter().position(|k| *k == key) {
                    Some(i) => offset[i].0 = offset[i].0.saturating_add(c),
                    None => {
                        keys.push(key);
                        offset.push((c, n));
                    }
                }
            }
        }
        mixed_radix(offset)
    }

    /// Analyses `ops` with `pending` the accesses since the last barrier,
    /// leaving in it those pending after them.
    fn block(&mut self, ops: &[OpId], pending: &mut Vec<Access>) {
        for &id in ops {
            let op = self.f.op(id);
            match &op.kind {
                OpKind::Barrier => pending.clear(),
                OpKind::Load { .. } | OpKind::Store { .. } => {
                    let Some(x) = self.access(id) else { continue };
                    if pending.iter().any(|p| self.conflict(p, &x)) {
                        self.before.insert(id);
                        pending.clear();
                    }
                    pending.push(x);
                }
                OpKind::For { lo, hi, step } => {
                    let body = &op.regions[0];
                    let counter = body.args[0];
                    let trips = if hi > lo && *step > 0 {
                        (hi - lo).saturating_add(step - 1) / step
                    } else {
                        0
                    };
                    self.loops.push((counter, *step, trips));
                    let entry = pending.clone();
                    let mut carried: Vec<Access> = Vec::new();
                    // The state at the start of an iteration is what was
                    // pending before the loop and at the end of the one
                    // before; both only grow within a finite set, so this
                    // ends.
                    loop {
                        let mut state = entry.clone();
                        extend(&mut state, &carried);
                        let barriers = self.before.len();
                        self.block(&body.ops, &mut state);
                        // What happened in the body is from an earlier
                        // iteration in the next one, and after the loop.
                        for s in &mut state {
                            if !entry.contains(s) && !s.stale.contains(&counter) {
                                s.stale.push(counter);
                                s.stale.sort();
                            }
                        }
                        let grew = extend(&mut carried, &state);
                        if !grew && self.before.len() == barriers {
                            break;
                        }
                    }
                    extend(pending, &carried);
                }
                _ => {}
            }
        }
    }
}

/// Whether two accesses through one layout can never meet: along some
/// dimension each indexes one constant place, and the places differ (two
/// slots of a staging buffer). Every access is inside its buffer, so with
/// a one-to-one layout different index tuples are different elements.
fn separate(a: &Access, b: &Access) -> bool {
    let Type::Buffer(t) = &a.buffer else {
        return false;
    };
    let layout = t
        .strides
        .iter()
        .zip(&t.shape)
        .map(|(&s, &n)| (s as i64, n as i64))
        .collect();
    a.buffer == b.buffer && mixed_radix(layout) && Affine::constants_differ(&a.index, &b.index)
}

/// Whether `sum c * x` over coordinates `x` in `0..n` is one-to-one:
/// sorted by size, each coefficient exceeds the span of the smaller ones
/// (a mixed-radix number). Coordinates with one value do not count.
fn mixed_radix(mut coords: Vec<(i64, i64)>) -> bool {
    coords.retain(|&(_, n)| n > 1);
    coords.sort_by_key(|&(c, _)| c.saturating_abs());
    let mut span: i64 = 0;
    for (c, n) in coords {
        if c.saturating_abs() <= span {
            return false;
        }
        span = span.saturating_add(c.saturating_abs().saturating_mul(n - 1));
    }
    true
}

/// Adds to `to` the accesses of `from` it lacks; whether it grew.
fn extend(to: &mut Vec<Access>, from: &[Access]) -> bool {
    let mut grew = false;
    for a in from {
        if !to.contains(a) {
            to.push(a.clone());
            grew = true;
        }
    }
    grew
}
