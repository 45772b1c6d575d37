//! One packing of an operand per call.
//!
//! The packed product copies its right operand into panels with a `pack`
//! kernel before every product. When a function multiplies by the same
//! operand several times (a recurrent network unrolled: W7's 32 steps each
//! multiply by the same two weight matrices), every product but the first
//! would copy the same elements into the same layout again. [`reuse_packs`]
//! keeps the first such copy for every later product: a later `pack`
//! kernel goes, its panel buffer becomes the first one's, and the first
//! buffer lives until the last of them is released.
//!
//! Two `pack` kernels are the same copy when their texts agree with their
//! inputs named by first use ([`crate::print::fingerprint`]), each input
//! pair is one buffer (the same root, through the same view layout), except
//! for the panel buffer each writes, and nothing in the function writes
//! what they read. A panel buffer qualifies when its kernel is all that
//! writes it and it is a buffer of the function body (`tile.alloc`, later
//! `tile.dealloc`).

use std::collections::{HashMap, HashSet};

use crate::ir::{Function, OpId, Schedule, Type, Value};
use crate::ops::OpKind;

/// What makes two `pack` kernels one copy: the kernel's text with inputs
/// named by first use, and each input's root buffer and layout (`None`: the
/// panel buffer it writes).
type CopyKey = (String, Vec<Option<(Value, Type)>>);

/// Each view's base buffer.
pub(super) fn view_bases(f: &Function) -> HashMap<Value, Value> {
    f.ops
        .iter()
        .filter(|op| matches!(op.kind, OpKind::View))
        .filter_map(|op| Some((*op.results.first()?, *op.operands.first()?)))
        .collect()
}

/// The buffer `v` is a view of, through any number of views.
pub(super) fn root(views: &HashMap<Value, Value>, mut v: Value) -> Value {
    while let Some(&base) = views.get(&v) {
        v = base;
    }
    v
}

/// Roots of every buffer that `ops` (and ops nested in them) store to, or
/// with `loads`, load from.
pub(super) fn accessed_roots(
    f: &Function,
    views: &HashMap<Value, Value>,
    ops: &[OpId],
    loads: bool,
    out: &mut HashSet<Value>,
) {
    for &id in ops {
        let op = f.op(id);
        let buffer = match op.kind {
            OpKind::Load { .. } if loads => op.operands.first(),
            OpKind::Store { .. } if !loads => op.operands.get(1),
            _ => None,
        };
        if let Some(&b) = buffer {
            out.insert(root(views, b));
        }
        for r in &op.regions {
            accessed_roots(f, views, &r.ops, loads, out);
        }
    }
}

/// Replaces every use of `from` (as an operand or in an index) by `to`.
fn rename(f: &mut Function, from: Value, to: Value) {
    for op in &mut f.ops {
        for v in &mut op.operands {
            if *v == from {
                *v = to;
            }
        }
        if let Some(index) = op.kind.index_mut() {
            for e in index {
                for t in &mut e.terms {
                    if t.1 == from {
                        t.1 = to;
                    }
                }
            }
        }
    }
}

/// Drops every `pack` kernel of `f`'s body that repeats an earlier one
/// (see the module's documentation); returns how many went.
pub fn reuse_packs(f: &mut Function) -> usize {
    let views = view_bases(f);
    let body = f.body.ops.clone();
    // What each op of the body writes, and everything written.
    let stores: Vec<HashSet<Value>> = body
        .iter()
        .map(|&id| {
            let mut s = HashSet::new();
            accessed_roots(f, &views, &[id], false, &mut s);
            s
        })
        .collect();
    let written: HashSet<Value> = stores.iter().flatten().copied().collect();
    let allocated: HashSet<Value> = body
        .iter()
        .filter(|&&id| matches!(f.op(id).kind, OpKind::Alloc))
        .filter_map(|&id| f.op(id).results.first().copied())
        .collect();
    // Per distinct copy: its key and the panel buffer that holds it.
    let mut seen: HashMap<CopyKey, Value> = HashMap::new();
    // Later panel buffer -> the first one.
    let mut merged: HashMap<Value, Value> = HashMap::new();
    let mut dropped: HashSet<OpId> = HashSet::new();
    for (pos, &id) in body.iter().enumerate() {
        let op = f.op(id);
        let OpKind::Kernel { schedule, .. } = &op.kind else {
            continue;
        };
        if !matches!(schedule, Schedule::Packed { pack: Some(_), .. }) {
            continue;
        }
        let [panel] = stores[pos].iter().copied().collect::<Vec<_>>()[..] else {
            continue;
        };
        if !allocated.contains(&panel) {
            continue;
        }
        let (text, inputs) = crate::print::fingerprint(f, id);
        // Every input but the panel buffer is a buffer nothing writes.
        let mut key_inputs = Vec::with_capacity(inputs.len());
        let mut pure = true;
        for v in inputs {
            if v == panel {
                key_inputs.push(None);
                continue;
            }
            let base = root(&views, v);
            if !matches!(f.ty(v), Type::Buffer(_)) || written.contains(&base) {
                pure = false;
                break;
            }
            key_inputs.push(Some((base, f.ty(v).clone())));
        }
        // The panel buffer itself must be the kernel's and no other's.
        let others_write = stores
            .iter()
            .enumerate()
            .any(|(o, s)| o != pos && s.contains(&panel));
        if !pure || others_write {
            continue;
        }
        match seen.get(&(text.clone(), key_inputs.clone())) {
            Some(&first) => {
                merged.insert(panel, first);
                dropped.insert(id);
            }
            None => {
                seen.insert((text, key_inputs), panel);
            }
        }
    }
    if merged.is_empty() {
        return 0;
    }
    // The first buffer is released where the last buffer merged into it
    // was: drop the allocs and deallocs of the later ones and every
    // dealloc of a first one but the last.
    let first_of = |v: Value| merged.get(&v).copied().unwrap_or(v);
    let firsts: HashSet<Value> = merged.values().copied().collect();
    let mut last_dealloc: HashMap<Value, usize> = HashMap::new();
    for (pos, &id) in body.iter().enumerate() {
        let op = f.op(id);
        if matches!(op.kind, OpKind::Dealloc)
            && let Some(&b) = op.operands.first()
            && firsts.contains(&first_of(b))
        {
            last_dealloc.insert(first_of(b), pos);
        }
    }
    let mut kept = Vec::with_capacity(body.len());
    for (pos, &id) in body.iter().enumerate() {
        let op = f.op(id);
        let keep = match op.kind {
            OpKind::Kernel { .. } => !dropped.contains(&id),
            OpKind::Alloc => op.results.first().is_none_or(|r| !merged.contains_key(r)),
            OpKind::Dealloc => op.operands.first().is_none_or(|&b| {
                !firsts.contains(&first_of(b)) || last_dealloc.get(&first_of(b)) == Some(&pos)
            }),
            _ => true,
        };
        if keep {
            kept.push(id);
        }
    }
    f.body.ops = kept;
    for (&later, &first) in &merged {
        rename(f, later, first);
    }
    for &id in &dropped {
        super::detach(f, id);
    }
    dropped.len()
}
