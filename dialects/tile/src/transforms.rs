//! Transforms of tile IR.

use std::collections::HashSet;

use crate::ir::{Block, Function, Value};
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
            f.ops[i as usize].operands.clear();
            if let OpKind::Load { index, .. } = &mut f.ops[i as usize].kind {
                index.iter_mut().for_each(|e| e.terms.clear());
            }
            if let OpKind::Mask { limits } = &mut f.ops[i as usize].kind {
                limits.iter_mut().for_each(|e| e.terms.clear());
            }
        }
        if removed == before {
            return removed;
        }
    }
}

pub mod barriers;
mod reuse;
pub use barriers::insert_barriers;
pub use reuse::reuse_packs;
