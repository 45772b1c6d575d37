//! Work on weights alone, done once when they are bound.
//!
//! A function's inputs declared weights (`weight %w`) take the same values
//! call after call, so a kernel that reads nothing but weights (a `pack`
//! kernel copying a weight matrix into the panels the micro-kernel reads,
//! say) computes the same buffer on every call. [`split_prepare`] moves
//! such kernels out of function `@f` into a function of their own,
//! `@f_prepare`, whose inputs are the weights they read and whose results
//! are the buffers the rest of `@f` reads; those buffers become inputs of
//! `@f` (weights themselves, after its other inputs, in the order
//! `@f_prepare` returns them), and `@f` names its preparer
//! (`tile.func @f(..) prepare @f_prepare`). A caller runs `@f_prepare` once
//! per binding of the weights and `@f` per call.
//!
//! A kernel moves when every buffer it loads is a weight, a constant or a
//! buffer written by a kernel that moved, and every buffer it stores to is
//! a buffer of the function body (`tile.alloc`) that nothing else writes
//! and nothing reads before its last write (storage the lowering reused
//! holds more than one value during a call).
//! The weights stay inputs of `@f` (a caller passes the same inputs as
//! before), whether or not `@f` still reads them.

use std::collections::{HashMap, HashSet};

use super::reuse::{accessed_roots, root, view_bases};
use crate::ir::{Function, Module, OpId, Value};
use crate::ops::OpKind;

/// Ops reachable from `f`'s body.
fn reachable(f: &Function) -> HashSet<OpId> {
    let mut seen = HashSet::new();
    let mut pending: Vec<OpId> = f.body.ops.clone();
    while let Some(id) = pending.pop() {
        if seen.insert(id) {
            pending.extend(f.op(id).regions.iter().flat_map(|r| r.ops.iter().copied()));
        }
    }
    seen
}

/// A name like `base` that is not in `taken`.
fn fresh(base: String, taken: &mut HashSet<String>) -> String {
    let mut name = base;
    while taken.contains(&name) {
        name.push('_');
    }
    taken.insert(name.clone());
    name
}

/// What moves out of one function: the kernels, the buffers they write
/// that the rest reads (in allocation order, with their names) and those
/// only they use.
struct Split {
    moved: Vec<OpId>,
    prepared: Vec<(String, Value)>,
    written: HashSet<Value>,
    weights_read: Vec<(String, Value)>,
}

fn plan(f: &Function) -> Option<Split> {
    let views = view_bases(f);
    let body = &f.body.ops;
    let mut loads: Vec<HashSet<Value>> = Vec::with_capacity(body.len());
    let mut stores: Vec<HashSet<Value>> = Vec::with_capacity(body.len());
    for &id in body {
        let (mut l, mut s) = (HashSet::new(), HashSet::new());
        accessed_roots(f, &views, &[id], true, &mut l);
        accessed_roots(f, &views, &[id], false, &mut s);
        loads.push(l);
        stores.push(s);
    }
    let written_anywhere: HashSet<Value> = stores.iter().flatten().copied().collect();
    let allocated: HashSet<Value> = body
        .iter()
        .filter(|&&id| matches!(f.op(id).kind, OpKind::Alloc))
        .filter_map(|&id| f.op(id).results.first().copied())
        .collect();
    // Weights nothing writes, and constants: what a moved kernel may read.
    let mut known: HashSet<Value> = f
        .params
        .iter()
        .enumerate()
        .filter(|(i, (_, v))| f.weights.contains(i) && !written_anywhere.contains(v))
        .map(|(_, (_, v))| *v)
        .collect();
    known.extend(
        body.iter()
            .filter(|&&id| matches!(f.op(id).kind, OpKind::Global(_)))
            .filter_map(|&id| f.op(id).results.first().copied()),
    );
    // Kernels that may move: they write only buffers of the body, every
    // writer of which may move too, and read only weights, constants and
    // buffers written by such kernels alone (to a fixed point).
    let mut moved_pos: HashSet<usize> = (0..body.len())
        .filter(|&p| {
            matches!(f.op(body[p]).kind, OpKind::Kernel { .. })
                && !stores[p].is_empty()
                && stores[p].iter().all(|v| allocated.contains(v))
        })
        .collect();
    // Buffers read before their last write (storage the lowering reused
    // for another value: a constant filled in, read, then the next one):
    // what such a buffer holds changes during a call, so no writer of it
    // moves.
    let rewritten: HashSet<Value> = allocated
        .iter()
        .copied()
        .filter(|v| {
            let last = (0..body.len()).rev().find(|p| stores[*p].contains(v));
            last.is_some_and(|last| {
                (0..last).any(|p| loads[p].contains(v) && !stores[p].contains(v))
            })
        })
        .collect();
    loop {
        // Buffers every writer of which is still a candidate.
        let ready: HashSet<Value> = allocated
            .iter()
            .copied()
            .filter(|v| !rewritten.contains(v))
            .filter(|v| {
                let mut writers = (0..body.len())
                    .filter(|p| stores[*p].contains(v))
                    .peekable();
                writers.peek().is_some() && writers.all(|p| moved_pos.contains(&p))
            })
            .collect();
        let before = moved_pos.len();
        moved_pos.retain(|&p| {
            stores[p].iter().all(|v| ready.contains(v))
                && loads[p]
                    .iter()
                    .all(|v| known.contains(v) || ready.contains(v))
        });
        if moved_pos.len() == before {
            break;
        }
    }
    let moved: Vec<OpId> = (0..body.len())
        .filter(|p| moved_pos.contains(p))
        .map(|p| body[p])
        .collect();
    let written: HashSet<Value> = moved_pos
        .iter()
        .flat_map(|&p| stores[p].iter().copied())
        .collect();
    // The buffers the kernels that stay read.
    let read_by_rest: HashSet<Value> = (0..body.len())
        .filter(|p| !moved_pos.contains(p))
        .flat_map(|p| loads[p].iter().copied())
        .collect();
    let mut taken: HashSet<String> = f.params.iter().map(|(n, _)| n.clone()).collect();
    let param_name: HashMap<Value, &str> = f.params.iter().map(|(n, v)| (*v, n.as_str())).collect();
    let mut prepared = Vec::new();
    for &id in body {
        let op = f.op(id);
        let Some(&b) = op.results.first() else {
            continue;
        };
        if !matches!(op.kind, OpKind::Alloc) || !written.contains(&b) || !read_by_rest.contains(&b)
        {
            continue;
        }
        // Named after the weight its writer reads (the first by name).
        let writer = (0..body.len()).find(|p| moved_pos.contains(p) && stores[*p].contains(&b));
        let source = writer
            .and_then(|p| loads[p].iter().filter_map(|v| param_name.get(v)).min())
            .map_or_else(|| "weight".to_string(), |n| n.to_string());
        prepared.push((fresh(format!("{source}_packed"), &mut taken), b));
    }
    if prepared.is_empty() {
        return None;
    }
    let read: HashSet<Value> = moved_pos
        .iter()
        .flat_map(|&p| loads[p].iter().copied())
        .collect();
    let weights_read = f
        .inputs()
        .iter()
        .filter(|(_, v)| read.contains(v))
        .cloned()
        .collect();
    Some(Split {
        moved,
        prepared,
        written,
        weights_read,
    })
}

/// Splits every function of `m` with weights whose kernels read only
/// weights (see the module's documentation); returns how many kernels
/// moved.
pub fn split_prepare(m: &mut Module) -> usize {
    let mut names: HashSet<String> = m.functions.iter().map(|f| f.name.clone()).collect();
    let mut added = Vec::new();
    let mut count = 0;
    for f in &mut m.functions {
        if f.weights.is_empty() || f.prepare.is_some() {
            continue;
        }
        let Some(split) = plan(f) else {
            continue;
        };
        let name = fresh(format!("{}_prepare", f.name), &mut names);
        let moved: HashSet<OpId> = split.moved.iter().copied().collect();
        let prepared: HashSet<Value> = split.prepared.iter().map(|p| p.1).collect();
        let is_buffer_op_of = |f: &Function, id: OpId, set: &HashSet<Value>| {
            let op = f.op(id);
            match op.kind {
                OpKind::Alloc => op.results.first().is_some_and(|r| set.contains(r)),
                OpKind::Dealloc => op.operands.first().is_some_and(|b| set.contains(b)),
                _ => false,
            }
        };
        // The preparer: the moved kernels, the buffers only they use, and
        // every pure op of the body (what they do not use goes).
        let mut p = f.clone();
        p.name = name.clone();
        p.prepare = None;
        p.weights.clear();
        let intermediates: HashSet<Value> = split.written.difference(&prepared).copied().collect();
        p.body.ops.retain(|&id| {
            let op = f.op(id);
            moved.contains(&id)
                || is_buffer_op_of(f, id, &intermediates)
                || matches!(op.kind, OpKind::Return)
                || (op.regions.is_empty()
                    && !matches!(
                        op.kind,
                        OpKind::Alloc | OpKind::Dealloc | OpKind::Kernel { .. }
                    ))
        });
        p.params = split.weights_read.clone();
        p.params.extend(split.prepared.iter().cloned());
        p.outputs = split.prepared.len();
        let live = reachable(&p);
        for i in 0..p.ops.len() {
            if !live.contains(&OpId(i as u32)) {
                super::detach(&mut p, OpId(i as u32));
            }
        }
        super::dce(&mut p);
        release_after_last_use(&mut p);
        // The function itself: the prepared buffers are inputs now.
        let kept: Vec<OpId> = f
            .body
            .ops
            .iter()
            .copied()
            .filter(|&id| !moved.contains(&id) && !is_buffer_op_of(f, id, &split.written))
            .collect();
        f.body.ops = kept;
        for &id in &split.moved {
            super::detach(f, id);
        }
        let at = f.params.len() - f.outputs.min(f.params.len());
        for (k, param) in split.prepared.iter().enumerate() {
            f.params.insert(at + k, param.clone());
            f.weights.insert(at + k);
        }
        f.prepare = Some(name);
        super::dce(f);
        count += split.moved.len();
        added.push(p);
    }
    m.functions.extend(added);
    count
}

/// Moves each `tile.dealloc` of `f`'s body to just after the last op of
/// the body that reads or writes its buffer (through views too), so that
/// buffers used one after another share memory (the workspace is planned
/// first fit over the buffers' lifetimes). A preparer's intermediates keep
/// the places their deallocs had in the function it came from, at its
/// end: ResNet-18's Winograd weight transforms (`[36, cout, cin]` each,
/// before packing) all lived at once, 151 MB of workspace for 38 MB used
/// at a time.
fn release_after_last_use(f: &mut Function) {
    fn roots(f: &Function, views: &HashMap<Value, Value>, id: OpId, out: &mut HashSet<Value>) {
        let op = f.op(id);
        out.extend(op.operands.iter().map(|&v| root(views, v)));
        out.extend(op.results.iter().map(|&v| root(views, v)));
        for r in &op.regions {
            for &inner in &r.ops {
                roots(f, views, inner, out);
            }
        }
    }
    let views = view_bases(f);
    let mut last: HashMap<Value, usize> = HashMap::new();
    let mut deallocs: Vec<(OpId, Value)> = Vec::new();
    for (i, &id) in f.body.ops.iter().enumerate() {
        let op = f.op(id);
        if matches!(op.kind, OpKind::Dealloc) {
            if let Some(&b) = op.operands.first() {
                deallocs.push((id, root(&views, b)));
            }
            continue;
        }
        let mut touched = HashSet::new();
        roots(f, &views, id, &mut touched);
        for b in touched {
            last.insert(b, i);
        }
    }
    let moved: HashSet<OpId> = deallocs
        .iter()
        .filter(|(_, b)| last.contains_key(b))
        .map(|d| d.0)
        .collect();
    let mut ops = Vec::with_capacity(f.body.ops.len());
    for (i, &id) in f.body.ops.iter().enumerate() {
        if !moved.contains(&id) {
            ops.push(id);
        }
        ops.extend(
            deallocs
                .iter()
                .filter(|(d, b)| moved.contains(d) && last.get(b) == Some(&i))
                .map(|d| d.0),
        );
    }
    f.body.ops = ops;
}

/// Makes input `v` of `f` the result of a new host op of `kind` at the
/// start of its body (a parameter no more).
fn param_to_op(f: &mut Function, v: Value, kind: OpKind) {
    f.params.retain(|(_, p)| *p != v);
    let id = OpId(f.ops.len() as u32);
    f.ops.push(crate::ir::OpData {
        kind,
        operands: Vec::new(),
        results: vec![v],
        regions: Vec::new(),
        loc: None,
    });
    f.body.ops.insert(0, id);
}

/// Builds the values of entry point `name`'s weights into `m`:
/// `value(weight)` gives a weight's elements (row-major), or `None` for one
/// left a parameter. Each weight given becomes a `tile.global`, in `@name`
/// and in its preparer. A preparer left reading constants alone (no
/// inputs) is no longer the caller's to run: `@name` reads each buffer it
/// prepares through `tile.prepared {func, index}`, which compiled code
/// computes on its first call and keeps for the process, and the caller
/// passes the other inputs alone. Returns how many weights were bound; an
/// error names a value of the wrong size.
pub fn bind_weights(
    m: &mut Module,
    name: &str,
    value: impl Fn(&str) -> Option<std::sync::Arc<[f64]>>,
) -> Result<usize, String> {
    let fi = m
        .functions
        .iter()
        .position(|f| f.name == name)
        .ok_or_else(|| format!("no function @{name}"))?;
    let global = |f: &Function, n: &str, v: Value| -> Result<Option<OpKind>, String> {
        let Some(values) = value(n) else {
            return Ok(None);
        };
        let len = match f.ty(v) {
            crate::ir::Type::Buffer(b) => b.storage_len(),
            _ => None,
        };
        if len != Some(values.len()) {
            return Err(format!(
                "@{name}: weight %{n} is {}, its value has {} elements",
                f.ty(v),
                values.len()
            ));
        }
        Ok(Some(OpKind::Global(values)))
    };
    // `@name`'s weights, taken before any parameter moves.
    let weights: Vec<(String, Value)> = {
        let f = &m.functions[fi];
        f.weights
            .iter()
            .filter_map(|&i| f.params.get(i).cloned())
            .collect()
    };
    let mut bound = 0;
    // The preparer's inputs given values become globals; when none is left,
    // `@name`'s prepared inputs become its results by index.
    let mut prepared: HashSet<Value> = HashSet::new();
    if let Some(p) = m.functions[fi].prepare.clone() {
        let pi = m
            .functions
            .iter()
            .position(|g| g.name == p)
            .ok_or_else(|| format!("@{name} is prepared by @{p}, which is not defined"))?;
        let pf = &mut m.functions[pi];
        for (n, v) in pf.inputs().to_vec() {
            if let Some(kind) = global(pf, &n, v)? {
                param_to_op(pf, v, kind);
            }
        }
        pf.weights.clear();
        if pf.inputs().is_empty() {
            let outputs = pf.outputs;
            let f = &mut m.functions[fi];
            let inputs = f.inputs().to_vec();
            let first = inputs.len().checked_sub(outputs).ok_or_else(|| {
                format!("@{name} has fewer inputs than its preparer @{p} has results")
            })?;
            for (index, (_, v)) in inputs[first..].iter().enumerate() {
                prepared.insert(*v);
                let func = p.clone();
                param_to_op(f, *v, OpKind::Prepared { func, index });
            }
            f.prepare = None;
        }
    }
    let f = &mut m.functions[fi];
    let mut kept: HashSet<Value> = HashSet::new();
    for (n, v) in weights.into_iter().filter(|(_, v)| !prepared.contains(v)) {
        match global(f, &n, v)? {
            Some(kind) => {
                param_to_op(f, v, kind);
                bound += 1;
            }
            None => {
                kept.insert(v);
            }
        }
    }
    f.weights = (0..f.params.len())
        .filter(|&i| kept.contains(&f.params[i].1))
        .collect();
    // Weights only the preparer read are not kept twice.
    super::dce(f);
    Ok(bound)
}
