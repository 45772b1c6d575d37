//! `graph.remat`: what a function keeps in memory, and what it computes
//! again.
//!
//! An element-wise value read by several kernels is stored by the first
//! and held until the last reads it. In a gradient that is the forward
//! pass's activations, held until the backward pass reads them. For each
//! such value, in order, this pass considers the function in which every
//! reader after the first reads a copy of the value's element-wise
//! definition instead, computed again from what that definition reads, and
//! prices both with the cost model saturation extracts by
//! ([`CostModel::planned_cost`], which follows the CPU back end's fusion
//! plan) and by the most bytes of stored values live at once
//! ([`fusion::memory`]): the copy is taken when it is no slower and needs
//! less memory (a page at least), or needs no more and is faster.
//! Typically a value whose other readers are element-wise is then computed
//! inside their kernels instead of stored (a batch normalization's
//! normalized input), and a value read by a product (which reads memory)
//! stays kept.
//!
//! The copy reads what its definition reads through barriers that wait for
//! the latest stored value its first late reader reads anyway, so the
//! schedule (which computes a node as soon as its operands allow) computes
//! it where it is read, not beside the original. The pass runs last, after
//! saturation, which would merge the copy with the original. Recomputing
//! whole functions, whatever it costs, is `checkpoint` in the language
//! ([`crate::Function::recompute`]).
//!
//! # Pricing and invariants
//!
//! Only values held at the peak, or whose first
//! reader is element-wise (so that they may stop being stored), are priced, which keeps
//! the pass near linear. Invariants: a copy computes exactly the original's arithmetic
//! on the same values (the interpreter gives bit-identical results, tested on every
//! shipped program); the pass runs after the last saturation, which would merge a copy
//! with its original (the barriers are opaque to it in any case).
//!
//! `fusion::memory` models the CPU workspace, which places the same buffers first fit
//! beside what kernels add (packed operands, im2col and Winograd buffers). `Price` (time
//! and peak, and the rule above) is also what `autodiff::compute::keep_by_cost` decides a
//! user operator's locals by. Forcing recomputation whatever it costs stays `checkpoint(..)`.

use std::collections::{HashMap, HashSet};

use dlc_core::{Pass, PassError, TargetDesc, TensorType};
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;

use crate::fusion::{self, Plan};
use crate::module::{Function, Module, Use, Value};
use crate::ops::{ConstValue, Op};
use crate::transforms::saturate::cost::CostModel;

/// `graph.remat`: see the module doc.
pub struct Remat {
    /// The target whose kernels are priced.
    pub target: TargetDesc,
}

impl Pass<Module> for Remat {
    fn name(&self) -> &'static str {
        "graph.remat"
    }

    fn run(&mut self, m: &mut Module) -> Result<Vec<(&'static str, u64)>, PassError> {
        let mut count = 0;
        for f in &mut m.functions {
            count += rematerialize(f, &self.target);
        }
        Ok(vec![("values computed again", count as u64)])
    }
}

/// One element of `v` as a scalar (`v` itself if it is one): what a barrier
/// waiting for `v` reads.
pub(crate) fn scalar_token(f: &mut Function, v: Value) -> Value {
    let ty = f.value_type(v).clone();
    if ty.rank() == 0 {
        return v;
    }
    let n: usize = ty.shape.iter().product();
    let flat = f.add_op(
        Op::Reshape { shape: vec![n] },
        &[v],
        TensorType::new(ty.dtype, vec![n]),
    );
    let one = Op::Slice {
        axis: 0,
        start: 0,
        end: 1,
    };
    let first = f.add_op(one, &[flat], TensorType::new(ty.dtype, vec![1]));
    f.add_op(
        Op::Reshape { shape: vec![] },
        &[first],
        TensorType::new(ty.dtype, vec![]),
    )
}

/// The least memory worth a copy that is no faster: a page.
const PAGE: u64 = 4096;

/// Whether `op` may be computed again: element-wise work (never products,
/// reductions, normalizations, calls or barriers), and not an op that only
/// moves its operand's elements (computing one again holds its operand
/// instead of it, which saves nothing).
fn recomputable(op: &Op) -> bool {
    op.is_elementwise()
        && !matches!(
            op,
            Op::Barrier | Op::Constant(_) | Op::Transpose { .. } | Op::Slice { .. }
        )
}

/// What [`recompute`] added to a function, to take back.
#[derive(Default)]
struct Change {
    /// The nodes added: tokens, barriers, copies.
    added: Vec<NodeIndex>,
    /// The reads moved from the value to its copy: reader, use.
    moved: Vec<(NodeIndex, Use)>,
}

impl Change {
    /// Takes the change back: `f` is as it was, `v` read again by the
    /// readers moved.
    fn undo(self, f: &mut Function, v: NodeIndex) {
        for n in self.added {
            f.body.remove_node(n);
        }
        for (u, w) in self.moved {
            f.body.add_edge(v, u, w);
        }
    }
}

/// What a version of a function costs: the cost model's estimate of its
/// time and its fusion plan's peak of live memory (the plan kept for the
/// caller).
pub(crate) struct Price {
    /// `CostModel::planned_cost`, µs.
    pub(crate) time: f64,
    /// `fusion::memory`.
    pub(crate) memory: fusion::Memory,
    /// The plan both read.
    pub(crate) plan: HashMap<NodeIndex, Plan>,
}

impl Price {
    /// Prices `f` compiled for `target`.
    pub(crate) fn of(f: &Function, target: &TargetDesc) -> Price {
        let plan = fusion::plan(f, target);
        Price {
            time: CostModel::calibrated().planned_cost(f, &plan, target),
            memory: fusion::memory(f, &plan),
            plan,
        }
    }

    /// Whether this version is worth taking over `before`: no slower and at
    /// least a page smaller at the peak, or faster and no larger.
    pub(crate) fn better_than(&self, before: &Price) -> bool {
        let tol = 1e-9 * before.time.abs().max(1e-9);
        let (peak, was) = (self.memory.peak, before.memory.peak);
        (self.time <= before.time + tol && peak + PAGE <= was)
            || (self.time < before.time - tol && peak <= was)
    }
}

/// Chooses by cost which element-wise values of `f` its later readers
/// compute again (the module doc), for `target`. Returns how many.
pub fn rematerialize(f: &mut Function, target: &TargetDesc) -> usize {
    let mut price = Price::of(f, target);
    let order = f.topo_order();
    let position: HashMap<NodeIndex, usize> =
        order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut count = 0;
    for &v in &order {
        if !recomputable(&f.body[v].op)
            || !matches!(price.plan[&v], Plan::Stored | Plan::EpilogueOf(_))
            || f.results.iter().any(|r| r.node == v)
        {
            continue;
        }
        let mut readers = f.users(v);
        if readers.len() < 2 {
            continue;
        }
        readers.sort_by_key(|u| position.get(u).copied().unwrap_or(usize::MAX));
        // Only a value held at the peak can lower it by dying sooner, and
        // only one whose first reader is element-wise can stop being
        // stored (be computed inside it): the others are not priced.
        if !price.memory.at_peak.contains(&v) && !f.body[readers[0]].op.is_elementwise() {
            continue;
        }
        let late = &readers[1..];
        let mut change = Change::default();
        if recompute(f, &price.plan, &position, v, late, &mut change).is_none() {
            change.undo(f, v);
            continue;
        }
        debug_assert_eq!(f.topo_order().len(), f.body.node_count(), "a cycle");
        let after = Price::of(f, target);
        if after.better_than(&price) {
            price = after;
            count += 1;
        } else {
            change.undo(f, v);
        }
    }
    count
}

/// Makes the readers `late` of `v` read a copy of its definition (see the
/// module doc), recording what it adds in `change`; `None` when they read
/// nothing computed after `v` to wait for.
fn recompute(
    f: &mut Function,
    plan: &HashMap<NodeIndex, Plan>,
    position: &HashMap<NodeIndex, usize>,
    v: NodeIndex,
    late: &[NodeIndex],
    change: &mut Change,
) -> Option<()> {
    // The copy waits for the latest stored value computed after `v` that
    // the first late reader reads, or reads through values computed in its
    // kernel: one more read of a stored value changes no kernel (where a
    // read of a product's result would cost it its epilogue). Not a value
    // that itself waits for a late reader (which would make a cycle).
    let mut below: HashSet<NodeIndex> = HashSet::new();
    let mut stack: Vec<NodeIndex> = late.to_vec();
    while let Some(n) = stack.pop() {
        if below.insert(n) {
            stack.extend(f.users(n));
        }
    }
    let at = |n: NodeIndex| position.get(&n).copied();
    let after_v = |n: NodeIndex| at(n).zip(at(v)).is_some_and(|(a, b)| a > b);
    let mut wait: Option<NodeIndex> = None;
    let mut seen: HashSet<NodeIndex> = HashSet::new();
    let mut stack: Vec<NodeIndex> = f.operands(late[0]).iter().map(|o| o.node).collect();
    while let Some(n) = stack.pop() {
        if n == v || !seen.insert(n) || !after_v(n) {
            continue;
        }
        if matches!(plan.get(&n), Some(Plan::Stored | Plan::EpilogueOf(_))) {
            if !below.contains(&n) && wait.is_none_or(|w| at(n) > at(w)) {
                wait = Some(n);
            }
        } else {
            stack.extend(f.operands(n).iter().map(|o| o.node));
        }
    }
    let wait = Value::of(wait?);
    let before: HashSet<NodeIndex> = f.body.node_indices().collect();
    let token = scalar_token(f, wait);
    change
        .added
        .extend(f.body.node_indices().filter(|n| !before.contains(n)));
    let copy = copy_of(f, plan, v, token, &mut HashMap::new(), change);
    for &u in late {
        let edges: Vec<_> = f
            .body
            .edges_connecting(v, u)
            .map(|e| (e.id(), *e.weight()))
            .collect();
        for (e, w) in edges {
            f.body.remove_edge(e);
            f.body.add_edge(copy.node, u, w);
            change.moved.push((u, w));
        }
    }
    Some(())
}

/// A copy of node `n`'s computation: its operands computed inside its
/// kernel (inlined, never stored) are copied too, every other one read
/// through a barrier waiting for `token` (one per read, so that each is
/// inlined into its reader; splat constants as they are). `made` maps each
/// node copied to its copy.
fn copy_of(
    f: &mut Function,
    plan: &HashMap<NodeIndex, Plan>,
    n: NodeIndex,
    token: Value,
    made: &mut HashMap<NodeIndex, Value>,
    change: &mut Change,
) -> Value {
    if let Some(&c) = made.get(&n) {
        return c;
    }
    let mut operands = Vec::new();
    for o in f.operands(n) {
        let node = &f.body[o.node];
        let copied = if matches!(node.op, Op::Constant(ConstValue::Splat(_))) {
            o
        } else if plan.get(&o.node) == Some(&Plan::Inline) && recomputable(&node.op) {
            copy_of(f, plan, o.node, token, made, change)
        } else {
            let ty = f.value_type(o).clone();
            let loc = node.loc.clone();
            let barrier = f.add_op(Op::Barrier, &[o, token], ty);
            f.body[barrier.node].loc = loc;
            change.added.push(barrier.node);
            barrier
        };
        operands.push(copied);
    }
    let node = &f.body[n];
    let (op, results, loc) = (node.op.clone(), node.results.clone(), node.loc.clone());
    let c = f.add_node(op, &operands, results);
    f.body[c].loc = loc;
    change.added.push(c);
    let c = Value::of(c);
    made.insert(n, c);
    c
}
