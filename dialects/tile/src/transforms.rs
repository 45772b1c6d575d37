//! Transforms of tile IR, and the registry that names them as passes
//! (`dlc-opt --pipeline tile.reuse-packs,tile.dce`).
//!
//! The conversion from loops (`convert-loop-to-tile`) only schedules nests
//! as kernels; what a target runs after it is a pipeline of these passes
//! ([`CPU_PIPELINE`], [`GPU_PIPELINE`]), so each can be run, and tested,
//! on its own.

use std::collections::HashSet;

use dlc_core::{Pass, PassError, PassRegistry, TargetDesc};

use crate::ir::{Block, Function, Module, OpId, Value};
use crate::ops::OpKind;

/// What runs after the conversion for a CPU: each row of a window the
/// code generator writes out loaded once for all its taps, each operand
/// packed once per call however many products read it, the copies that
/// made redundant removed, and work on weights alone moved into the
/// function's preparer (run once per binding of the weights).
pub const CPU_PIPELINE: &str =
    "tile.share-window-loads,tile.reuse-packs,tile.dce,tile.split-prepare";

/// What runs after the conversion for a GPU: the products that run on
/// tensor cores chosen, their loops' accumulators kept in the warps'
/// fragments and the rows of the blocks they read padded against bank
/// conflicts, the operand copies laid out in runs a wide copy moves, packs
/// reused as on a CPU, then the barriers a
/// block of threads needs between accesses of one buffer (the GPU runtime
/// does not call preparers: weights are inputs like any other there).
pub const GPU_PIPELINE: &str = "tile.tensor-cores,tile.mma-accumulators,tile.shared-layouts,\
                                tile.copy-layouts,tile.reuse-packs,tile.dce,tile.insert-barriers";

/// A transform of each function, run as a pass; the counter it reports
/// is what the transform returns.
struct PerFunction {
    name: &'static str,
    counter: &'static str,
    run: fn(&mut Function) -> usize,
}

impl Pass<Module> for PerFunction {
    fn name(&self) -> &'static str {
        self.name
    }

    fn run(&mut self, m: &mut Module) -> Result<Vec<(&'static str, u64)>, PassError> {
        let n: usize = m.functions.iter_mut().map(|f| (self.run)(f)).sum();
        Ok(vec![(self.counter, n as u64)])
    }
}

/// `tile.split-prepare`: a transform of the whole module (it adds
/// functions).
struct SplitPrepare;

impl Pass<Module> for SplitPrepare {
    fn name(&self) -> &'static str {
        "tile.split-prepare"
    }

    fn run(&mut self, m: &mut Module) -> Result<Vec<(&'static str, u64)>, PassError> {
        Ok(vec![("kernels moved", split_prepare(m) as u64)])
    }
}

/// A transform of each function for a target, run as a pass
/// (`tile.tensor-cores`, `tile.shared-layouts`).
struct ForTarget {
    name: &'static str,
    counter: &'static str,
    run: fn(&mut Function, &TargetDesc) -> usize,
    target: TargetDesc,
}

impl Pass<Module> for ForTarget {
    fn name(&self) -> &'static str {
        self.name
    }

    fn run(&mut self, m: &mut Module) -> Result<Vec<(&'static str, u64)>, PassError> {
        let n: usize = m
            .functions
            .iter_mut()
            .map(|f| (self.run)(f, &self.target))
            .sum();
        Ok(vec![(self.counter, n as u64)])
    }
}

/// Every tile pass, by name, the target-dependent ones for this machine
/// unless their options name another.
pub fn registry() -> PassRegistry<Module> {
    registry_for(TargetDesc::host())
}

/// Every tile pass, by name, the target-dependent ones for `target`
/// unless their options name another.
pub fn registry_for(target: &TargetDesc) -> PassRegistry<Module> {
    let mut r = PassRegistry::default();
    // A pass for a target: `target=NAME` (default: the one compiled
    // for), and for `tile.tensor-cores` `tf32=true`.
    let for_target = |name: &'static str, counter, run| {
        let default = target.clone();
        move |o: &dlc_core::PassOptions| {
            let tf32 = name == "tile.tensor-cores";
            o.expect_only(if tf32 {
                &["target", "tf32"]
            } else {
                &["target"]
            })?;
            let bad = |message: String| PassError::BadOption {
                pass: name.into(),
                message,
            };
            let mut target = match o.get("target", String::new())? {
                name if name.is_empty() => default.clone(),
                name => TargetDesc::named(&name).map_err(bad)?,
            };
            if tf32 && o.get("tf32", false)? {
                target = target.with_tf32();
            }
            Ok(Box::new(ForTarget {
                name,
                counter,
                run,
                target,
            }) as Box<dyn Pass<Module>>)
        }
    };
    r.register(
        "tile.tensor-cores",
        "marks each `tile.dot` a GPU target runs on tensor cores with its instruction's shape \
         (`mma = [m, n, k]`) and unmarks the others; `target=NAME` (default: the target \
         compiled for; in dlc-opt this machine), `tf32=true` (f32 products as TF32 too)",
        for_target(
            "tile.tensor-cores",
            "products on tensor cores",
            tensor_cores,
        ),
    );
    r.register(
        "tile.shared-layouts",
        "pads the rows of each shared buffer tensor-core products read their fragments from \
         (its strides) to the shortest pitch at which a warp's reads hit no bank twice; \
         `target=NAME` (default: the target compiled for)",
        for_target(
            "tile.shared-layouts",
            "shared buffers padded",
            shared_layouts,
        ),
    );
    r.register(
        "tile.copy-layouts",
        "lays out each tile a GPU program only copies from global into shared memory (and its \
         mask) in runs of the target's widest asynchronous copy (`#blocked<8>` for 16-bit \
         elements); `target=NAME` (default: the target compiled for)",
        for_target("tile.copy-layouts", "copies in runs", copy_layouts),
    );
    let per_function = |name, counter, run| {
        move |o: &dlc_core::PassOptions| {
            o.expect_only(&[])?;
            Ok(Box::new(PerFunction { name, counter, run }) as Box<dyn Pass<Module>>)
        }
    };
    r.register(
        "tile.dce",
        "removes pure ops whose results nothing uses",
        per_function("tile.dce", "ops removed", dce),
    );
    r.register(
        "tile.mma-accumulators",
        "carries a loop's tensor-core accumulator in the warps' fragments (`#mma<r, c>`, the \
         grid of the target's warps that reads the fewest fragments) when it is only the \
         accumulator of the loop's tensor-core products, converting it before and after the \
         loop; `target=NAME` (default: the target compiled for)",
        for_target(
            "tile.mma-accumulators",
            "accumulators in fragments",
            mma_accumulators,
        ),
    );
    r.register(
        "tile.reuse-packs",
        "drops each `pack` kernel that copies what an earlier one of the same call already \
         packed (same operand, same panels), reading the first one's panels instead",
        per_function("tile.reuse-packs", "packs reused", reuse_packs),
    );
    r.register(
        "tile.share-window-loads",
        "in each loop a CPU writes out, loads a window's row once, wider, before the loop, \
         and has each tap's load along it take its part with `tile.slice`",
        per_function("tile.share-window-loads", "taps sliced", share_window_loads),
    );
    r.register(
        "tile.insert-barriers",
        "inserts the barriers a block of threads needs between accesses of one buffer by \
         different threads (a GPU program)",
        per_function("tile.insert-barriers", "barriers inserted", insert_barriers),
    );
    r.register(
        "tile.split-prepare",
        "moves kernels that read only weights into the function's preparer `@f_prepare`, run \
         once per binding of the weights",
        |o| {
            o.expect_only(&[])?;
            Ok(Box::new(SplitPrepare))
        },
    );
    r
}

/// The ops that use `v`, once per use.
pub(crate) fn users(f: &Function, v: Value) -> Vec<OpId> {
    f.ops
        .iter()
        .enumerate()
        .flat_map(|(i, op)| {
            op.operands
                .iter()
                .filter(move |&&o| o == v)
                .map(move |_| OpId(i as u32))
        })
        .collect()
}

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
            | OpKind::Prefetch { .. }
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
        if let Some(index) = op.kind.index_mut() {
            index.iter_mut().for_each(|e| e.terms.clear());
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
mod copy_layouts;
mod mma_accumulators;
mod prepare;
mod reuse;
mod shared_layouts;
mod tensor_cores;
mod windows;
pub use barriers::insert_barriers;
pub use copy_layouts::copy_layouts;
pub use mma_accumulators::mma_accumulators;
pub use prepare::{bind_weights, split_prepare};
pub use reuse::reuse_packs;
pub use shared_layouts::shared_layouts;
pub use tensor_cores::tensor_cores;
pub use windows::share_window_loads;
