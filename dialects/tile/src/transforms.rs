//! Transforms of tile IR.

use std::collections::HashSet;

use crate::ir::{Block, Function, OpId, Value};
use crate::ops::OpKind;

/// Whether an op only computes its results (no memory effect, no
/// synchronization, no region), so it may go when they are unused.
fn is_pure(kind: &OpKind) -> bool {
    !matches!(
        kind,
        OpKind::Alloc
            | OpKind::Dealloc
            | OpKind::Kernel { .. }
            | OpKind::Return
            | OpKind::Store { .. }
            | OpKind::For { .. }
            | OpKind::Yield
            | OpKind::Barrier
    )
}

/// Makes op `id`, taken out of its block, and the ops nested in it use
/// nothing (they stay in the arena, where a use would still count).
pub(crate) fn detach(f: &mut Function, id: OpId) {
    let mut pending = vec![id];
    while let Some(id) = pending.pop() {
        let op = &mut f.ops[id.0 as usize];
        op.operands.clear();
        if let OpKind::Load { index, .. } | OpKind::Store { index } = &mut op.kind {
            index.iter_mut().for_each(|e| e.terms.clear());
        }
        if let OpKind::Mask { limits } = &mut op.kind {
            limits.iter_mut().for_each(|e| e.terms.clear());
        }
        pending.extend(op.regions.iter().flat_map(|r| r.ops.iter().copied()));
    }
}

/// Removes pure ops whose results nothing uses (repeatedly, so chains
/// go); returns how many.
pub fn dce(f: &mut Function) -> usize {
    let mut removed = 0;
    loop {
        let mut used: HashSet<Value> = HashSet::new();
        for op in &f.ops {
            used.extend(&op.operands);
            if let Some(index) = op.kind.index() {
                for e in index {
                    used.extend(e.terms.iter().map(|t| t.1));
                }
            }
        }
        let dead: HashSet<u32> = f
            .ops
            .iter()
            .enumerate()
            .filter(|(_, op)| {
                is_pure(&op.kind)
                    && !op.results.is_empty()
                    && op.results.iter().all(|r| !used.contains(r))
            })
            .map(|(i, _)| i as u32)
            .collect();
        // Ops outside every block (already removed) stay in the arena.
        let before = removed;
        fn prune(b: &mut Block, dead: &HashSet<u32>, removed: &mut usize) {
            let n = b.ops.len();
            b.ops.retain(|o| !dead.contains(&o.0));
            *removed += n - b.ops.len();
        }
        let mut body = std::mem::take(&mut f.body);
        prune(&mut body, &dead, &mut removed);
        f.body = body;
        for i in 0..f.ops.len() {
            let mut regions = std::mem::take(&mut f.ops[i].regions);
            for r in &mut regions {
                prune(r, &dead, &mut removed);
            }
            f.ops[i].regions = regions;
        }
        // Operands of removed ops no longer count as uses.
        for &i in &dead {
            detach(f, OpId(i));
        }
        if removed == before {
            return removed;
        }
    }
}

pub mod barriers;
mod prepare;
mod reuse;
pub use barriers::insert_barriers;
pub use prepare::split_prepare;
pub use reuse::reuse_packs;
