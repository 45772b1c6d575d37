//! The fusion plan: how each node of a function is computed by the CPU
//! back end's loop nests, for a target. It is one analysis, read by the
//! lowering to loops (which emits what it says) and by the
//! equality-saturation cost model's function-level estimate (which prices
//! what it says), so the two cannot drift apart.

use std::collections::{HashMap, HashSet};

use petgraph::Direction;
use petgraph::stable_graph::NodeIndex;

use dlc_core::TargetDesc;

use crate::module::Function;
use crate::ops::{ConstValue, Op, conv_is_im2col_product, conv_is_winograd};

/// How a node is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// A parameter: its buffer is given.
    Param,
    /// Computed at each index where it is read; never stored (an
    /// element-wise op whose one user is element-wise).
    Inline,
    /// Stored in its own buffer by its own loop nest.
    Stored,
    /// The end of an element-wise chain, stored by the loop nest of the op
    /// it follows (that op's epilogue).
    EpilogueOf(NodeIndex),
    /// An op with a value per index whose loop nest applies the chain
    /// ending at the given node before storing (its epilogue).
    WithEpilogue(NodeIndex),
    /// A view of its operand's buffer: a reshape, a transpose read only
    /// by matrix products (which read through any strides), or a slice
    /// that is one run of its operand's storage (a view with an offset).
    View,
}

/// Whether an op produces one value per result index from a loop nest of
/// its own (so an element-wise chain may follow it as an epilogue):
/// products, reductions, softmax, layernorm, convolutions, pooling, user
/// operators.
pub fn has_value_at_index(op: &Op) -> bool {
    matches!(
        op,
        Op::MatMul
            | Op::Reduce { .. }
            | Op::Softmax { .. }
            | Op::LayerNorm { .. }
            | Op::Conv2d { .. }
            | Op::Pool2d { .. }
            | Op::Compute(_)
    )
}

/// Whether convolution `n` runs as a product over an im2col buffer (whose
/// epilogue, when it takes one, is computed at the product's flattened
/// index: see [`flat_epilogue_reads`]).
pub fn conv_as_matmul(f: &Function, n: NodeIndex, target: &TargetDesc) -> bool {
    let Op::Conv2d { groups, .. } = f.body[n].op else {
        return false;
    };
    let w = f.value_type(f.operands(n)[1]);
    !conv_as_winograd(f, n, target)
        && conv_is_im2col_product(groups, &f.body[n].results[0], w, target)
}

/// `shape` with its last two axes made one, after aligning it to rank 4 as
/// broadcasting does (`[O, 1, 1]` is `[1, O, 1]`, `[N, C, H, W]` is `[N, C,
/// H*W]`): the index space of a convolution's product, `[N, O, OY*OX]`.
pub fn flat_shape(shape: &[usize]) -> Vec<usize> {
    let mut a = vec![1; 4usize.saturating_sub(shape.len())];
    a.extend_from_slice(shape);
    let (head, tail) = a.split_at(a.len() - 2);
    let mut out = head.to_vec();
    out.push(tail.iter().product());
    out
}

/// The stored nodes the epilogue chain of convolution `n` (from its user to
/// `end`) reads, when the chain can be computed at the index of the
/// convolution's product, `[N, O, OY*OX]`, where the output row and column
/// are one index (the product's columns): every op in it, and every inlined
/// op it reads, is pointwise or a broadcast, and every value read spans both
/// of the output's spatial axes or neither (a bias `[O, 1, 1]`, a residual
/// `[N, O, OY, OX]`, a scalar), so reading it at the flattened index is
/// reading it through a `[.., OY*OX]` view of its row-major storage. `None`
/// when it cannot (a value varying along one spatial axis only, a
/// transpose or slice inside).
pub fn flat_epilogue_reads(
    f: &Function,
    plan: &HashMap<NodeIndex, Plan>,
    n: NodeIndex,
    end: NodeIndex,
) -> Option<Vec<NodeIndex>> {
    flat_reads(f, plan, n, end, false)
}

/// The stored nodes element-wise node `n` and its epilogue chain (to
/// `end`, or `n` itself without one) read, when all of it can be computed
/// at the flattened index `[N, C, H*W]` of its `[N, C, H, W]` result, as
/// [`flat_epilogue_reads`] says of a convolution's chain: graph -> loop
/// then runs the nest along the image's rows and columns as one axis (a 7
/// x 7 image as 49 lanes, not seven rows of 7). `None` when it cannot.
pub fn flat_elementwise_reads(
    f: &Function,
    plan: &HashMap<NodeIndex, Plan>,
    n: NodeIndex,
    end: NodeIndex,
) -> Option<Vec<NodeIndex>> {
    flat_reads(f, plan, n, end, true)
}

/// The leaves of the chain from `n` to `end` (with `n`'s own operand tree
/// when `computed`, else `n` substituted) if every value in it spans both
/// of `n`'s spatial axes or neither.
fn flat_reads(
    f: &Function,
    plan: &HashMap<NodeIndex, Plan>,
    n: NodeIndex,
    end: NodeIndex,
    computed: bool,
) -> Option<Vec<NodeIndex>> {
    let out = &f.body[n].results[0].shape;
    let [_, _, oy, ox] = out[..] else {
        return None;
    };
    let spans = |shape: &[usize]| {
        let r = shape.len();
        let at = |k: usize| if k < r { shape[r - 1 - k] } else { 1 };
        r <= 4 && ((at(1), at(0)) == (oy, ox) || (at(1), at(0)) == (1, 1))
    };
    let mut chain = if end == n {
        Vec::new()
    } else {
        epilogue_chain(f, n, end)
    };
    if computed {
        chain.push(n);
    }
    let mut stack = chain.clone();
    let (mut seen, mut leaves) = (HashSet::new(), Vec::new());
    if !computed {
        seen.insert(n);
    }
    while let Some(c) = stack.pop() {
        if !seen.insert(c) {
            continue;
        }
        if !spans(&f.body[c].results[0].shape) {
            return None;
        }
        let computed = chain.contains(&c) || plan.get(&c) == Some(&Plan::Inline);
        if !computed {
            leaves.push(c);
            continue;
        }
        let op = &f.body[c].op;
        if !(op.is_pointwise() || matches!(op, Op::Broadcast { .. }))
            || matches!(op, Op::BatchNorm { .. })
        {
            return None;
        }
        stack.extend(f.operands(c).iter().map(|v| v.node));
    }
    Some(leaves)
}

/// Whether convolution `n` runs as Winograd's `F(4x4, 3x3)`
/// (`conv_is_winograd`): 36 products between an input and an output
/// transform. It takes no epilogue: the two convolutions of a ResNet block
/// then compile to one shared kernel (W3: 0.29 -> 0.17 s of LLVM on one
/// core), and a separate pass adds the bias, residual and relu along
/// contiguous rows where the output transform would scatter them (W3 b1
/// 2.26 -> 2.07 ms, b8 21.0 -> 21.6).
pub fn conv_as_winograd(f: &Function, n: NodeIndex, target: &TargetDesc) -> bool {
    let Op::Conv2d {
        stride,
        groups,
        dilation,
        ..
    } = f.body[n].op
    else {
        return false;
    };
    let w = f.value_type(f.operands(n)[1]);
    conv_is_winograd(stride, dilation, groups, &f.body[n].results[0], w, target)
}

/// The nodes of `f` computed from its declared weights (and constants)
/// alone, with at least one weight among what they depend on: the CPU back
/// end computes them once, when the weights are bound (the preparer), so
/// they are stored rather than recomputed inside a per-call consumer, and
/// cost a call nothing.
pub fn bound_nodes(f: &Function) -> HashSet<NodeIndex> {
    let mut bound = HashSet::new();
    if f.weights.is_empty() {
        return bound;
    }
    let mut constant = HashSet::new();
    for n in f.topo_order() {
        match &f.body[n].op {
            Op::Param { index } => {
                if f.is_weight(*index as usize) {
                    bound.insert(n);
                }
            }
            Op::Constant(_) => {
                constant.insert(n);
            }
            _ => {
                let operands = f.operands(n);
                let from_weights = operands.iter().any(|v| bound.contains(&v.node));
                let only = operands
                    .iter()
                    .all(|v| constant.contains(&v.node) || bound.contains(&v.node));
                if from_weights && only {
                    bound.insert(n);
                }
            }
        }
    }
    // The parameters themselves are not computed.
    bound.retain(|&n| !matches!(f.body[n].op, Op::Param { .. }));
    bound
}

/// Whether a slice along `axis` of a row-major buffer of `shape` is one run
/// of its storage (every axis before `axis` has extent 1), which a view
/// with an offset reads in place: W7's 32 steps each take one step of
/// the input this way instead of copying it.
pub fn slice_is_contiguous(shape: &[usize], axis: usize) -> bool {
    axis < shape.len() && shape[..axis].iter().all(|&d| d == 1)
}

/// The plan of every node of `f`, compiled for `target`.
pub fn plan(f: &Function, target: &TargetDesc) -> HashMap<NodeIndex, Plan> {
    // Uses count every edge and every appearance among the results.
    let edges = |n: NodeIndex| f.body.edges_directed(n, Direction::Outgoing).count();
    let is_result = |n: NodeIndex| f.results.iter().any(|r| r.node == n);
    let uses = |n: NodeIndex| edges(n) + f.results.iter().filter(|r| r.node == n).count();
    let op = |n: NodeIndex| &f.body[n].op;
    let ty = |n: NodeIndex| &f.body[n].results[0];
    let order = f.topo_order();
    let bound = bound_nodes(f);
    let mut plan: HashMap<NodeIndex, Plan> = HashMap::new();
    for &n in &order {
        let users = f.users(n);
        let p = match op(n) {
            Op::Param { .. } => Plan::Param,
            Op::Reshape { .. } => Plan::View,
            Op::Transpose { .. }
                if !is_result(n)
                    && users.iter().all(|u| matches!(op(*u), Op::MatMul))
                    && matches!(
                        f.operands(n).first().and_then(|v| plan.get(&v.node)),
                        Some(Plan::Param | Plan::Stored | Plan::View)
                    ) =>
            {
                Plan::View
            }
            Op::Slice { axis, .. }
                if slice_is_contiguous(&f.value_type(f.operands(n)[0]).shape, *axis)
                    && matches!(
                        f.operands(n).first().and_then(|v| plan.get(&v.node)),
                        Some(Plan::Param | Plan::Stored | Plan::View)
                    ) =>
            {
                Plan::View
            }
            // A splat constant read only by pointwise ops costs them
            // nothing to compute: each inlines it, however many there are
            // (equality saturation leaves one shared by every reader;
            // stored, it was a buffer each loaded, per row of an epilogue:
            // ReLU6's clip bounds).
            Op::Constant(ConstValue::Splat(_))
                if !is_result(n)
                    && !users.is_empty()
                    && users.iter().all(|&u| op(u).is_pointwise()) =>
            {
                Plan::Inline
            }
            o if o.is_elementwise() => {
                // Work on weights alone is stored by the preparer, not
                // redone in every call's consumer.
                if uses(n) == 1
                    && users.len() == 1
                    && op(users[0]).is_elementwise()
                    && (!bound.contains(&n) || bound.contains(&users[0]))
                {
                    Plan::Inline
                } else {
                    Plan::Stored
                }
            }
            _ => Plan::Stored,
        };
        plan.insert(n, p);
    }
    // Epilogues: an op with a value per index whose users all begin
    // element-wise paths of its shape that meet at one stored node (a chain
    // `relu(x @ w + b)`, or `x * sigmoid(x)`, SiLU, which reads the op
    // twice, or `h * sigmoid(h)` with `h = conv + b`) stores that node
    // instead; a stored node on the way whose own readers all meet there
    // too is computed in the region (inlined).
    for &n in &order {
        if !has_value_at_index(op(n)) || is_result(n) || conv_as_winograd(f, n, target) {
            continue;
        }
        let shape = &ty(n).shape;
        let mut memo: HashMap<NodeIndex, Option<NodeIndex>> = HashMap::new();
        let ends: Vec<Option<NodeIndex>> = f
            .users(n)
            .into_iter()
            .map(|u| meet(f, &plan, u, shape, &mut memo))
            .collect();
        let Some(Some(end)) = ends.first().copied() else {
            continue;
        };
        if ends.iter().any(|e| *e != Some(end)) {
            continue;
        }
        // A convolution's product computes its chain at the flattened
        // index of its columns.
        let flattens =
            || !conv_as_matmul(f, n, target) || flat_epilogue_reads(f, &plan, n, end).is_some();
        // A product of weights takes no epilogue that reads activations
        // (it would run on every call).
        if plan[&end] == Plan::Stored && (!bound.contains(&n) || bound.contains(&end)) && flattens()
        {
            // The stored nodes the paths run through are computed in the
            // region.
            for t in epilogue_chain(f, n, end) {
                if t != end && plan[&t] == Plan::Stored {
                    plan.insert(t, Plan::Inline);
                }
            }
            plan.insert(n, Plan::WithEpilogue(end));
            plan.insert(end, Plan::EpilogueOf(n));
        }
    }
    plan
}

/// Where the pointwise paths of `shape` from `u` meet: `u` itself if it is
/// stored and its readers' paths do not all meet at one node, else that
/// node, through inlined nodes and stored ones whose every reader's path
/// meets there (a result is never seen through). `None` when a path leaves
/// the shape or the pointwise ops. Memoized per node, so a chain of nodes
/// each read twice is walked once.
fn meet(
    f: &Function,
    plan: &HashMap<NodeIndex, Plan>,
    u: NodeIndex,
    shape: &[usize],
    memo: &mut HashMap<NodeIndex, Option<NodeIndex>>,
) -> Option<NodeIndex> {
    if let Some(m) = memo.get(&u) {
        return *m;
    }
    let node = &f.body[u];
    let end = if !node.op.is_pointwise() || node.results[0].shape != shape {
        None
    } else {
        match plan.get(&u) {
            Some(Plan::Inline) => {
                let next = f.users(u)[0];
                meet(f, plan, next, shape, memo)
            }
            Some(Plan::Stored) => {
                let users = f.users(u);
                let is_result = f.results.iter().any(|r| r.node == u);
                let ends: Vec<Option<NodeIndex>> = if is_result || users.is_empty() {
                    vec![]
                } else {
                    users
                        .iter()
                        .map(|&w| meet(f, plan, w, shape, memo))
                        .collect()
                };
                match ends.first() {
                    Some(Some(e)) if ends.iter().all(|x| *x == Some(*e)) => Some(*e),
                    _ => Some(u),
                }
            }
            _ => None,
        }
    };
    memo.insert(u, end);
    end
}

/// The kernel whose loop nest is emitted at `p`'s place in topological
/// order: `p`'s own, or, for the end of an epilogue chain, its anchor's
/// (placed there so every operand of the chain is computed before it).
pub fn kernel_at(plan: &HashMap<NodeIndex, Plan>, p: NodeIndex) -> Option<NodeIndex> {
    match plan[&p] {
        Plan::Stored | Plan::View => Some(p),
        Plan::EpilogueOf(anchor) => Some(anchor),
        Plan::Param | Plan::Inline | Plan::WithEpilogue(_) => None,
    }
}

/// The element-wise nodes an op's epilogue computes: every path from one
/// of its users to `end`, `end` included, each node once.
pub fn epilogue_chain(f: &Function, n: NodeIndex, end: NodeIndex) -> Vec<NodeIndex> {
    let mut chain = Vec::new();
    let mut stack = f.users(n);
    while let Some(cur) = stack.pop() {
        if chain.contains(&cur) {
            continue;
        }
        chain.push(cur);
        if cur != end {
            stack.extend(f.users(cur));
        }
    }
    chain
}

/// The stored nodes kernel `n`'s loop nest reads: its operands and those
/// of its epilogue chain, looking through inlined nodes.
pub fn kernel_reads(f: &Function, plan: &HashMap<NodeIndex, Plan>, n: NodeIndex) -> Vec<NodeIndex> {
    let mut skip: HashSet<NodeIndex> = HashSet::from([n]);
    let mut stack: Vec<NodeIndex> = f.operands(n).iter().map(|v| v.node).collect();
    if let Plan::WithEpilogue(end) = plan[&n] {
        for c in epilogue_chain(f, n, end) {
            skip.insert(c);
            stack.extend(f.operands(c).iter().map(|v| v.node));
        }
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    while let Some(o) = stack.pop() {
        if skip.contains(&o) || !seen.insert(o) {
            continue;
        }
        match plan[&o] {
            Plan::Inline => stack.extend(f.operands(o).iter().map(|v| v.node)),
            _ => out.push(o),
        }
    }
    out
}

/// The storage a node's buffer lives in (a view's is its operand's).
pub fn storage_of(f: &Function, plan: &HashMap<NodeIndex, Plan>, n: NodeIndex) -> NodeIndex {
    let mut cur = n;
    while plan[&cur] == Plan::View {
        cur = f.operands(cur)[0].node;
    }
    cur
}

/// The memory the stored values of a plan take ([`memory`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memory {
    /// The most bytes live at once.
    pub peak: u64,
    /// The values whose buffers are live at every moment the peak is
    /// reached: only making one of them die sooner can lower it.
    pub at_peak: HashSet<NodeIndex>,
}

/// The buffers `plan` stores, live at once at most, kernels run in
/// topological order: each stored value from its kernel to the last kernel
/// reading it, views in their storage (a value a result views, to the end);
/// parameters, constants, results (the caller's buffers) and work on
/// weights (computed once, when they are bound) not counted. A model of the back end's workspace, which places these buffers
/// first fit (and so may need more, for fragmentation) beside what the
/// kernels add (packed operands, im2col and Winograd buffers).
pub fn memory(f: &Function, plan: &HashMap<NodeIndex, Plan>) -> Memory {
    let bound = bound_nodes(f);
    let order = f.topo_order();
    let size = |n: NodeIndex| -> u64 {
        f.body[n]
            .results
            .iter()
            .map(|t| (t.num_elements().unwrap_or(0) * t.dtype.size_bytes()) as u64)
            .sum()
    };
    // Results are written into the caller's output buffers.
    let counted = |n: NodeIndex| {
        !bound.contains(&n)
            && !matches!(f.body[n].op, Op::Param { .. } | Op::Constant(_))
            && !f.results.iter().any(|r| r.node == n)
    };
    // The buffer each kernel writes, in order, and the last kernel reading
    // each buffer.
    let mut written: Vec<NodeIndex> = Vec::new();
    let mut last: HashMap<NodeIndex, usize> = HashMap::new();
    for &p in &order {
        let Some(k) = kernel_at(plan, p) else {
            continue;
        };
        if plan[&p] == Plan::View || !counted(p) {
            continue;
        }
        for r in kernel_reads(f, plan, k) {
            let r = storage_of(f, plan, r);
            if counted(r) {
                last.insert(r, written.len());
            }
        }
        written.push(p);
    }
    for r in &f.results {
        last.insert(storage_of(f, plan, r.node), usize::MAX);
    }
    let mut ends: HashMap<usize, Vec<NodeIndex>> = HashMap::new();
    let mut live: HashSet<NodeIndex> = HashSet::new();
    let mut bytes: u64 = 0;
    let mut m = Memory {
        peak: 0,
        at_peak: HashSet::new(),
    };
    for (i, &p) in written.iter().enumerate() {
        live.insert(p);
        bytes += size(p);
        if bytes > m.peak {
            m.peak = bytes;
            m.at_peak.clone_from(&live);
        } else if bytes == m.peak {
            m.at_peak.retain(|n| live.contains(n));
        }
        match last.get(&p) {
            Some(&end) if end != usize::MAX => ends.entry(end.max(i)).or_default().push(p),
            Some(_) => {}
            // Read by nothing: freed at once.
            None => {
                live.remove(&p);
                bytes -= size(p);
            }
        }
        for n in ends.remove(&i).unwrap_or_default() {
            live.remove(&n);
            bytes -= size(n);
        }
    }
    m
}

/// Kernels that may run as one: decided here, once, from the graph and
/// its plan, and read by graph -> loop (which keeps the group's buffers
/// alive across it) and by loop -> tile (which fuses it where the target
/// packs products).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelGroup {
    /// A product of a softmax of a product (attention): `scores`'s kernel
    /// computes the stored `read` (the scores, or the end of their
    /// epilogue), `softmax` reads it, and `output`, a product, reads the
    /// softmax. Run over blocks of rows, one program computes its rows of
    /// the scores, their softmax and their product, so a program writes
    /// rows of `output`'s result while others still read `scores`'s
    /// operands.
    Attention {
        /// The first product.
        scores: NodeIndex,
        /// What the softmax reads of it.
        read: NodeIndex,
        /// The softmax.
        softmax: NodeIndex,
        /// The second product.
        output: NodeIndex,
    },
}

/// Every kernel group of `f` under `plan` (see [`KernelGroup`]), in
/// topological order of the place their last kernel is emitted at.
pub fn kernel_groups(f: &Function, plan: &HashMap<NodeIndex, Plan>) -> Vec<KernelGroup> {
    let kernel_of = |n: NodeIndex| match plan[&n] {
        Plan::EpilogueOf(anchor) => anchor,
        _ => n,
    };
    let mut groups = Vec::new();
    for p in f.topo_order() {
        let Some(output) = kernel_at(plan, p) else {
            continue;
        };
        if !matches!(f.body[output].op, Op::MatMul) {
            continue;
        }
        let softmax = kernel_of(storage_of(f, plan, f.operands(output)[0].node));
        if !matches!(f.body[softmax].op, Op::Softmax { .. }) {
            continue;
        }
        for read in kernel_reads(f, plan, softmax) {
            let scores = kernel_of(storage_of(f, plan, read));
            if matches!(f.body[scores].op, Op::MatMul) {
                groups.push(KernelGroup::Attention {
                    scores,
                    read,
                    softmax,
                    output,
                });
            }
        }
    }
    groups
}
