//! One load per row of a window.
//!
//! A depthwise convolution's (or a pool's) program sums, for each tap `k`
//! of a window's row, the input row shifted by `k`:
//!
//! ```text
//! tile.for %acc {lo = 0, hi = 3, step = 1} (%k, %s) {
//!   %t = tile.load %x[.., %k + %c + #0 - 1] {pad = 0.0} : tile<56xf32>
//!   ..
//! ```
//!
//! Each tap reads all but one of the elements its neighbour read. When a
//! CPU writes the loop out (`ir::unrolled_trips`: its offsets are then
//! constants), [`share_window_loads`] loads the row once before the loop,
//! `c * step * (trips - 1)` elements wider, and each tap takes its part of
//! it with `tile.slice`, which at a constant offset is a shuffle of two
//! vectors (x86's `valignd`) rather than a load with its bound checks:
//!
//! ```text
//! %w = tile.load %x[.., %c + #0 - 1] {pad = 0.0} : tile<58xf32>
//! tile.for %acc {lo = 0, hi = 3, step = 1} (%k, %s) {
//!   %t = tile.slice %w[%k] : tile<56xf32>
//! ```
//!
//! A tap qualifies when it is a load in the loop's body itself, without a
//! mask, whose last index moves with the counter (coefficient `c > 0`) and
//! with the tile's last axis (coefficient 1) and nothing else does; its
//! other index terms are defined outside the loop and nothing in the loop
//! stores to its buffer. Taps with one buffer, pad, type and index but for
//! the counter share one load. The wider load reads at most twice the
//! elements of a tap (a dilated window's would read more than it keeps).

use std::collections::{HashMap, HashSet};

use crate::ir::{Affine, Block, Function, OpId, Type, Value, unrolled_trips};
use crate::ops::OpKind;
use crate::transforms::reuse::{accessed_roots, root, view_bases};

/// Where a loop stands: the body (`None`) or region `.1` of op `.0`.
type Parent = Option<(OpId, usize)>;

/// Loads each window row of the loops a CPU writes out once (see the
/// module's documentation); returns how many taps now slice a shared load.
pub fn share_window_loads(f: &mut Function) -> usize {
    let mut loops = Vec::new();
    collect_loops(f, None, &f.body, &mut loops);
    let views = view_bases(f);
    loops
        .into_iter()
        .map(|(parent, l)| share_in(f, &views, parent, l))
        .sum()
}

/// Every `tile.for` of `b` and the blocks nested in it, with its block.
fn collect_loops(f: &Function, parent: Parent, b: &Block, out: &mut Vec<(Parent, OpId)>) {
    for &id in &b.ops {
        let op = f.op(id);
        if matches!(op.kind, OpKind::For { .. }) {
            out.push((parent, id));
        }
        for (r, region) in op.regions.iter().enumerate() {
            collect_loops(f, Some((id, r)), region, out);
        }
    }
}

/// Values `b` and the blocks nested in it define.
fn defined_in(f: &Function, b: &Block, out: &mut HashSet<Value>) {
    out.extend(&b.args);
    for &id in &b.ops {
        let op = f.op(id);
        out.extend(&op.results);
        for r in &op.regions {
            defined_in(f, r, out);
        }
    }
}

/// A tap's load with the counter taken out of its index: what taps that
/// share a load agree on.
struct Row {
    buffer: Value,
    /// The index at the loop's first iteration.
    index: Vec<Affine>,
    pad: Option<f64>,
    ty: Type,
    /// The counter's coefficient in the last index.
    c: i64,
}

impl Row {
    fn same(&self, o: &Row) -> bool {
        self.buffer == o.buffer
            && self.index == o.index
            && self.pad.map(f64::to_bits) == o.pad.map(f64::to_bits)
            && self.ty == o.ty
            && self.c == o.c
    }
}

/// Op `id` as a tap of a window along the last axis of loop `counter`
/// (starting at `lo`), if it is one.
fn tap(
    f: &Function,
    id: OpId,
    (counter, lo): (Value, i64),
    inside: &HashSet<Value>,
    stored: &HashSet<Value>,
    views: &HashMap<Value, Value>,
) -> Option<Row> {
    let op = f.op(id);
    let OpKind::Load { index, pad } = &op.kind else {
        return None;
    };
    let (&[buffer], &[result]) = (&op.operands[..], &op.results[..]) else {
        return None;
    };
    let ty = f.ty(result).clone();
    let rank = ty.shape()?.len();
    let (last, lead) = index.split_last()?;
    let c = last.coefficient(counter);
    let along_row = |e: &Affine| e.axes.iter().any(|a| a.1 + 1 == rank);
    if rank == 0
        || c <= 0
        || last.axes != [(1, rank - 1)]
        || lead
            .iter()
            .any(|e| e.coefficient(counter) != 0 || along_row(e))
        || inside.contains(&buffer)
        || stored.contains(&root(views, buffer))
        || index
            .iter()
            .flat_map(|e| &e.terms)
            .any(|t| t.1 != counter && inside.contains(&t.1))
    {
        return None;
    }
    let mut index = index.clone();
    let at_lo = index[lead.len()].plus_scaled(-c, &Affine::value(counter));
    index[lead.len()] = at_lo.plus_scaled(c * lo, &Affine::constant(1));
    Some(Row {
        buffer,
        index,
        pad: *pad,
        ty,
        c,
    })
}

/// Shares the window loads of loop `l`, which stands in `parent`.
fn share_in(f: &mut Function, views: &HashMap<Value, Value>, parent: Parent, l: OpId) -> usize {
    let op = f.op(l);
    let OpKind::For { lo, hi, step } = op.kind else {
        return 0;
    };
    let body = op.regions[0].clone();
    // Only loops carrying values are written out by their trips (a loop
    // of rows is by other rules).
    let trips = match unrolled_trips(f, lo, hi, step, &body) {
        Some(t) if t > 1 && !op.operands.is_empty() => t,
        _ => return 0,
    };
    let counter = body.args[0];
    let mut inside = HashSet::new();
    defined_in(f, &body, &mut inside);
    let mut stored = HashSet::new();
    accessed_roots(f, views, &body.ops, false, &mut stored);
    let mut rows: Vec<(Row, Vec<OpId>)> = Vec::new();
    for &id in &body.ops {
        let Some(row) = tap(f, id, (counter, lo), &inside, &stored, views) else {
            continue;
        };
        match rows.iter_mut().find(|(r, _)| r.same(&row)) {
            Some((_, ids)) => ids.push(id),
            None => rows.push((row, vec![id])),
        }
    }
    let mut shared = 0;
    for (row, ids) in rows {
        let Type::Tile(t) = &row.ty else {
            continue;
        };
        let n = t.shape[t.shape.len() - 1];
        let extra = row.c * step.max(1) * (trips - 1);
        if extra > n as i64 {
            continue;
        }
        let mut wide = t.clone();
        if let Some(last) = wide.shape.last_mut() {
            *last += extra as usize;
        }
        let load = f.create_op(
            OpKind::Load {
                index: row.index,
                pad: row.pad,
            },
            vec![row.buffer],
            &[Type::Tile(wide)],
            vec![],
        );
        f.ops[load.0 as usize].loc = f.op(ids[0]).loc.clone();
        let w = f.op(load).results[0];
        let block = match parent {
            None => &mut f.body,
            Some((p, r)) => &mut f.ops[p.0 as usize].regions[r],
        };
        let at = block.ops.iter().position(|&o| o == l).unwrap_or(0);
        block.ops.insert(at, load);
        for id in ids {
            let rank = t.shape.len();
            let mut offsets = vec![Affine::constant(0); rank];
            offsets[rank - 1] = Affine::value(counter)
                .scaled(row.c)
                .plus_scaled(-row.c * lo, &Affine::constant(1));
            let op = &mut f.ops[id.0 as usize];
            op.kind = OpKind::Slice { offsets };
            op.operands = vec![w];
            shared += 1;
        }
    }
    shared
}
