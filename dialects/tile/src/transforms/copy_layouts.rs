//! `tile.copy-layouts`: how the threads of a GPU program hold the tiles it
//! only copies from global into shared memory.
//!
//! In the flat layout a thread's elements are a block's worth apart, so a
//! copy moves one element per access, and 16-bit ones through registers
//! (`cp.async` moves at least 4 bytes). A tile loaded from global memory
//! whose only use is a store into shared memory (the GPU schedule's
//! operand copies), and the mask of that load, are given the layout
//! `#blocked<v>` instead, `v` elements making the target's widest
//! asynchronous copy (`GpuDesc::async_copy_bytes`, 16 bytes): each thread
//! holds runs of `v` consecutive elements of a row, which code generation
//! copies with one `cp.async` each where a run is aligned. Nothing else
//! reads these tiles, so no other op sees the layout.

use dlc_core::TargetDesc;

use super::users;
use crate::ir::{Function, Layout, Space, Type, Value};
use crate::ops::OpKind;

/// Gives every operand copy of `f` (and its load's mask) the `#blocked`
/// layout of `target`'s widest asynchronous copy; returns how many copies.
pub fn copy_layouts(f: &mut Function, target: &TargetDesc) -> usize {
    let Some(gpu) = target.gpu() else {
        return 0;
    };
    let space = |f: &Function, b: Value| match f.ty(b) {
        Type::Buffer(t) => Some(t.space),
        _ => None,
    };
    let mut chosen: Vec<(Value, Option<Value>, Layout)> = Vec::new();
    for store in &f.ops {
        // An unmasked store of a tile into shared memory...
        let (OpKind::Store { .. }, [v, dst]) = (&store.kind, &store.operands[..]) else {
            continue;
        };
        let Type::Tile(t) = f.ty(*v) else { continue };
        let size = t.dtype.size_bytes();
        if space(f, *dst) != Some(Space::Shared)
            || t.layout != Layout::Flat
            || size == 0
            || !gpu.async_copy_bytes.is_multiple_of(size)
        {
            continue;
        }
        let run = gpu.async_copy_bytes / size;
        // ... in whole runs per row ...
        if run < 2 || t.shape.last().is_none_or(|n| n % run != 0) || users(f, *v).len() != 1 {
            continue;
        }
        // ... of a tile just loaded from global memory, its mask (if any)
        // that load's alone.
        let Some(load) = f.ops.iter().find(|o| o.results.first() == Some(v)) else {
            continue;
        };
        if !matches!(load.kind, OpKind::Load { .. })
            || space(f, load.operands[0]) != Some(Space::Global)
        {
            continue;
        }
        let mask = load.operands.get(1).copied();
        let mask_ok = mask.is_none_or(|m| {
            users(f, m).len() == 1
                && f.ops
                    .iter()
                    .any(|o| o.results.first() == Some(&m) && matches!(o.kind, OpKind::Mask { .. }))
        });
        if mask_ok {
            chosen.push((*v, mask, Layout::Blocked(run)));
        }
    }
    for &(v, mask, layout) in &chosen {
        for x in std::iter::once(v).chain(mask) {
            if let Type::Tile(t) = &mut f.values[x.0 as usize] {
                t.layout = layout;
            }
        }
    }
    chosen.len()
}
