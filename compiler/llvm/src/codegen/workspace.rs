//! Where a tile function's memory lives, for both targets: the host-level
//! buffers at planned offsets of one workspace (first fit over their
//! lifetimes), and each kernel's scratch and shared buffers at planned
//! offsets of its per-program region. The CPU back end allocates the
//! workspace and threads' scratch regions ([`super::tile`]), the GPU back end
//! a device workspace and each block's dynamic shared memory
//! ([`super::gpu`]).

use std::collections::BTreeMap;

use dlc_tile::{Block, Function, OpId, OpKind, Type, Value};

use crate::{CodegenError, R};

/// Where a function's memory lives: every host-level `tile.alloc` at an
/// offset of one workspace, first fit among the ranges free at that point
/// (a buffer's range is free again after its `tile.dealloc`), so that part
/// is about the function's peak of live buffers; after it, one scratch
/// region per thread (the OpenMP runtime's maximum at the call), as large
/// as the largest kernel's scratch (its `tile.alloc`s at planned offsets).
/// A call takes the workspace the previous call left in a global cache if
/// it is large enough (a header records its size), else allocates one, and
/// hands it back when it returns (a preparer, run once per binding, frees
/// it instead): a model run many times allocates and
/// page-faults its memory once, not on every call, and kernels allocate
/// nothing (so they cannot fail for memory). Calls running at once each
/// hold their own.
pub(crate) struct Workspace {
    /// Byte offset of each global buffer (ordered, so that the code placing
    /// them is the same from one compile to the next).
    pub(super) offsets: BTreeMap<Value, u64>,
    /// Bytes of the global buffers.
    pub(super) size: u64,
    /// Bytes of one thread's scratch region.
    pub(super) scratch: u64,
    /// The source place of the largest buffer (named when allocating the
    /// workspace fails).
    pub(super) largest: Option<dlc_core::SourceLoc>,
}

impl Workspace {
    pub(super) fn plan(f: &Function) -> R<Workspace> {
        let mut live: Vec<(u64, u64, Value)> = Vec::new();
        let mut plan = Workspace {
            offsets: BTreeMap::new(),
            size: 0,
            scratch: 0,
            largest: None,
        };
        let mut largest = 0;
        for &id in &f.body.ops {
            let op = f.op(id);
            match op.kind {
                OpKind::Alloc => {
                    let v = op.results[0];
                    let bytes = buffer_bytes(f, v)?.div_ceil(64).saturating_mul(64);
                    live.sort_unstable();
                    let mut at = 0u64;
                    for &(start, end, _) in &live {
                        if start.saturating_sub(at) >= bytes {
                            break;
                        }
                        at = at.max(end);
                    }
                    let end = at.saturating_add(bytes);
                    live.push((at, end, v));
                    plan.offsets.insert(v, at);
                    plan.size = plan.size.max(end);
                    if bytes > largest {
                        largest = bytes;
                        plan.largest.clone_from(&op.loc);
                    }
                }
                OpKind::Dealloc => live.retain(|l| l.2 != op.operands[0]),
                OpKind::Kernel { .. } => {
                    let (_, bytes) = kernel_scratch(f, &op.regions[0])?;
                    plan.scratch = plan.scratch.max(bytes);
                }
                _ => {}
            }
        }
        Ok(plan)
    }
}

/// The scratch (and shared) buffers of a kernel body at planned
/// 64-byte-aligned offsets, and the bytes they take.
pub(super) fn kernel_scratch(f: &Function, body: &Block) -> R<(Vec<(Value, u64)>, u64)> {
    let mut allocs = Vec::new();
    collect(f, &body.ops, &mut allocs, &mut Vec::new());
    let mut placed = Vec::with_capacity(allocs.len());
    let mut bytes: u64 = 0;
    for v in allocs {
        placed.push((v, bytes));
        bytes = bytes
            .saturating_add(buffer_bytes(f, v)?)
            .div_ceil(64)
            .saturating_mul(64);
    }
    Ok((placed, bytes))
}

/// Bytes of buffer `v`'s storage (at least one).
pub(super) fn buffer_bytes(f: &Function, v: Value) -> R<u64> {
    let Type::Buffer(t) = f.ty(v) else {
        return Err(CodegenError::Invalid("tile.alloc of a non-buffer".into()));
    };
    Ok(t.storage_len()
        .unwrap_or(usize::MAX)
        .saturating_mul(t.dtype.size_bytes())
        .max(1) as u64)
}

/// The buffers a kernel allocates and its `tile.program_id` results with
/// their axes, at any depth.
pub(super) fn collect(
    f: &Function,
    ops: &[OpId],
    allocs: &mut Vec<Value>,
    pids: &mut Vec<(Value, usize)>,
) {
    for &id in ops {
        let op = f.op(id);
        match op.kind {
            OpKind::Alloc => allocs.extend(&op.results),
            OpKind::ProgramId { axis } => pids.extend(op.results.iter().map(|&r| (r, axis))),
            _ => {}
        }
        for r in &op.regions {
            collect(f, &r.ops, allocs, pids);
        }
    }
}
