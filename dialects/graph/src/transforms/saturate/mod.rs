//! `graph.saturate`: equality saturation in the style of TASO and Tensat.
//!
//! Each function becomes an e-graph ([`lang`]); the rule tables ([`rules`])
//! grow it under explicit node, iteration and time limits, the multi-pattern
//! merges only in the first iterations; extraction ([`extract`]) picks the
//! cheapest equivalent graph under the calibrated per-op cost model
//! ([`cost`]), and the function is replaced only if the function-level model
//! (which follows the back end's fusion plan) finds it cheaper than it was.
//! Subexpressions that depend only on constants are folded while the graph
//! is rebuilt, so work on weights is done once, at compile time.
//!
//! # In detail
//!
//! `graph.saturate` explores the equivalent forms of each function at once and keeps
//! the cheapest, as TASO and Tensat do.
//!
//! - **Term language** (`lang.rs`): one egg `define_language!` whose op names match the
//!   graph dialect's. Attributes are leaf children placed first (`(transpose [1,0] ?x)`,
//!   `(slice 1 0 64 ?x)`, `(conv2d [1,1] [1,1] 1 ?x ?w)`), so patterns bind and compare
//!   them. Parameters and constants are `(param i)` / `(const k)` indexing tables held by
//!   the analysis. Ops no rule looks inside (reductions, softmax, layernorm, pooling,
//!   comparisons, select, casts, user-defined `compute` operators) are `(opaque k ..)`:
//!   their operands still take part in rewriting and sharing. The `Analysis` holds each
//!   class's type (computed by `infer::infer`, the dialect's own typing rule), whether it
//!   depends only on constants ("weights"), and whether it is a leaf.
//! - **Settled ops** (`Node::settled`, not part of the text form). A function
//!   saturated without calls has every op marked settled; inlining copies the mark. When
//!   the inlined caller is saturated, single-pattern rules do not fire at a settled
//!   class (one whose every graph op is settled): its rewrites were explored in the
//!   callee. Multi-pattern merges still fire anywhere (the products of a NasRNN's gates
//!   sit in eight inlined copies of `gate`), the caller's own ops are rewritten as
//!   before, and the e-graph still shares what the copies repeat (the function is
//!   replaced when as cheap with fewer ops, so two inlined copies that fold the same
//!   weights fold them once). A helper is saturated in the context it is inlined into:
//!   it declares as weights the parameters for which every call site passes declared
//!   weights or work on them alone (`weights_from_call_sites`; W3's `block` folds its
//!   batchnorms into its callers' weights); a helper whose call sites differ, or an
//!   entry point called with other weights than its own, is not settled and is
//!   saturated again wherever it is inlined. What settling gives up: rewrites rooted
//!   at a callee's op that need what the call site passes (a product whose operand is
//!   a caller's transpose); none of the examples changes (every example's graph after
//!   the pipeline is the one the inline-first pipeline gave, W7's but for sharing its
//!   32 transposes of `w_ih`).
//! - **Conversion**: a function becomes an e-graph (a function with calls or
//!   multi-result ops is left alone and counted in `--stats`); extraction picks one node
//!   per class and `rebuild` makes a function again, in the original node order where
//!   nodes came from the original. Without rules this is the identity up to sharing:
//!   repeated subexpressions (W7 repeats each step's weight transposes) become one node.
//!   Tested on every example.
//!
//! - **Search**: egg's runner with explicit node, iteration and time limits; the
//!   multi-pattern table runs only in the first `multi-iters` iterations (Tensat's
//!   remedy for blow-up), then the single-pattern tables continue within what is left.
//!
//! - `--stats` (dlc-opt) prints, summed over functions: functions saturated / changed /
//!   skipped, the stop reason, iterations, e-classes, e-nodes, time, estimated cost
//!   before and after (ns), and how extraction ended.
//! - Figures (`make bench-saturate`: optimization time, e-graph sizes, estimated against
//!   measured latency before and after, the cost model's calibration) are in
//!   docs/performance.md, "Equality saturation".
//! - Reproducibility: the search is bounded by work, not by the clock: the
//!   e-graph grows by at most `node-limit` e-nodes over the function it started
//!   from, for at most `iter-limit` iterations, and egg checks the node limit
//!   after each rule's application, so a compile's result depends only on its
//!   input (the object cache's key promises as much). The two time limits
//!   (the search's and exact extraction's) are safety nets an order of magnitude
//!   above what any program the project knows takes on a loaded two-core machine;
//!   a search or an ILP that reaches one has a result that depends on the
//!   machine's speed and load, and `--stats` says so ("stopped: time limit",
//!   "ilp at time limit"). Exact extraction is attempted only on programs of at
//!   most `extract::ILP_MAX_NODES` candidates (the greedy choice is used above:
//!   "greedy (too large for ilp)"), and a function is only replaced by something
//!   the function-level model finds cheaper.
//! - Floating point: the rules are laws of real arithmetic, so a saturated program may
//!   round differently (as with `-ffast-math` or XLA's algebraic simplifier); the
//!   property tests check the default pipeline within 1e-5 of each output's magnitude
//!   and the other passes bit for bit.

pub mod cost;
pub mod extract;
pub mod lang;
pub mod rules;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use dlc_core::{Pass, PassError};
use egg::{Id, Runner, StopReason};
use petgraph::stable_graph::NodeIndex;

use crate::interp::{FOLD_WORK_LIMIT, Tensor, eval_op, op_work};
use crate::module::{Function, Module, Value};
use crate::ops::Op;
use cost::{CostModel, WEIGHT_FOLD_LIMIT};
use extract::{Choice, IlpOutcome, greedy, ilp, improve, tensor_children, used_classes};
use lang::{Encoded, Head, TEGraph, decode, encode};

/// How the chosen graph is extracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extraction {
    /// Bottom-up tree cost (fast; counts shared subterms once per use).
    Greedy,
    /// Integer programming over the DAG, greedy as start and fallback.
    Ilp,
}

/// Limits and choices of one saturation run.
#[derive(Debug, Clone)]
pub struct SaturateOptions {
    /// Stop growing the e-graph once it holds this many e-nodes more than
    /// the function it started from (growth, so that a model larger than
    /// the limit still gets its first iterations).
    pub node_limit: usize,
    /// At most this many iterations (rule applications over the e-graph).
    pub iter_limit: usize,
    /// Stop growing the e-graph after this long: a safety net, not the
    /// budget (which is `node_limit` and `iter_limit`, so that the result
    /// does not depend on the machine's speed or load).
    pub time_limit: Duration,
    /// Multi-pattern rules run only in this many first iterations.
    pub multi_iters: usize,
    /// How to extract.
    pub extraction: Extraction,
    /// Time limit of exact extraction: a safety net, as `time_limit` is
    /// (its problems are bounded by `extract::ILP_MAX_NODES`).
    pub ilp_time_limit: Duration,
    /// The rule tables to use, by name ([`rules::TABLES`]).
    pub tables: Vec<String>,
    /// What the cost model prices: the kernels compiled for this target
    /// (its packed products and fusion plan).
    pub target: dlc_core::TargetDesc,
}

impl Default for SaturateOptions {
    fn default() -> Self {
        SaturateOptions {
            // The budget, in work (docs/performance.md, "Equality
            // saturation"): every example, workload and exported ONNX model
            // saturates or reaches the iteration limit within it, but the
            // gradients of the training steps (W3, W4, W6, W7, W8, the
            // WaveNet-style network), W6's step and the first searches of
            // EfficientNet-B0 and BERT-base, which stop at it; none of those
            // extracts anything cheaper with four times the growth and no
            // time limit.
            node_limit: 5_000,
            iter_limit: 12,
            // Safety nets, far above what the budget takes: at most 0.5 s
            // of search (BERT-base's, on a busy two-core machine) and 0.1 s
            // of exact extraction (the ResNeXt-like block's).
            time_limit: Duration::from_secs(10),
            multi_iters: 2,
            extraction: Extraction::Ilp,
            ilp_time_limit: Duration::from_secs(1),
            tables: rules::TABLES.iter().map(|s| s.to_string()).collect(),
            // The driver's default: what `dlc run` compiles for.
            target: dlc_core::TargetDesc::host().clone(),
        }
    }
}

/// What one saturation of one function did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Why the e-graph stopped growing.
    pub stop: StopReason,
    /// Iterations run.
    pub iterations: usize,
    /// E-classes at the end.
    pub classes: usize,
    /// E-nodes at the end.
    pub nodes: usize,
    /// Estimated cost of the function as it was, µs (function-level model).
    pub cost_before: f64,
    /// Estimated cost of the function as it is now, µs.
    pub cost_after: f64,
    /// How exact extraction ended (`None` when greedy was asked for).
    pub ilp: Option<IlpOutcome>,
    /// Whether the function was replaced.
    pub changed: bool,
    /// Wall time.
    pub elapsed: Duration,
}

/// Saturates `f` and replaces it by the cheapest equivalent found. Returns
/// `None` (and leaves `f` alone) for a function with calls or multi-result
/// ops.
pub fn saturate_function(
    f: &mut Function,
    options: &SaturateOptions,
    model: &CostModel,
) -> Option<Report> {
    let start = Instant::now();
    let Encoded {
        egraph,
        roots,
        origin,
    } = encode(f).ok()?;
    let target = &options.target;
    let cost_before = model.function_cost(f, target);
    let (single, multi): (Vec<_>, Vec<_>) = rules::tables()
        .into_iter()
        .filter(|(name, _, _)| options.tables.iter().any(|t| t == name))
        .partition(|(_, _, is_multi)| !is_multi);
    let single: Vec<rules::Rule> = single.into_iter().flat_map(|(_, r, _)| r).collect();
    let all: Vec<rules::Rule> = single
        .iter()
        .cloned()
        .chain(multi.into_iter().flat_map(|(_, r, _)| r))
        .collect();
    let first = options.multi_iters.min(options.iter_limit);
    let node_limit = egraph.total_number_of_nodes() + options.node_limit;
    let mut runner = Runner::default()
        .with_egraph(egraph)
        .with_iter_limit(first)
        .with_node_limit(node_limit)
        .with_time_limit(options.time_limit)
        .run(&all);
    let mut iterations = runner.iterations.len();
    let mut stop = runner.stop_reason.clone().unwrap_or(StopReason::Saturated);
    if matches!(stop, StopReason::IterationLimit(_)) && options.iter_limit > first {
        let left = options.time_limit.saturating_sub(start.elapsed());
        runner = Runner::default()
            .with_egraph(runner.egraph)
            .with_iter_limit(options.iter_limit - first)
            .with_node_limit(node_limit)
            .with_time_limit(left)
            .run(&single);
        iterations += runner.iterations.len();
        stop = runner.stop_reason.clone().unwrap_or(StopReason::Saturated);
    }
    let mut eg = runner.egraph;
    eg.rebuild();
    let roots: Vec<Id> = roots.iter().map(|&r| eg.find(r)).collect();
    let origin: HashMap<Id, NodeIndex> = origin.into_iter().map(|(c, n)| (eg.find(c), n)).collect();
    let g = greedy(model, target, &eg, &roots);
    let g = improve(model, target, &eg, &roots, &g);
    let mut candidates = vec![g.clone()];
    let outcome = match options.extraction {
        Extraction::Greedy => None,
        Extraction::Ilp => {
            let (c, o) = ilp(model, target, &eg, &roots, &g, options.ilp_time_limit);
            candidates.push(c);
            Some(o)
        }
    };
    // Extraction minimizes the per-op model; the function-level model (the
    // back end's fusion plan) decides between the candidates and the
    // original.
    let mut best: Option<(f64, Function)> = None;
    for choice in &candidates {
        if let Some(new) = rebuild(&eg, choice, &roots, f, &origin) {
            let cost = model.function_cost(&new, target);
            if best.as_ref().is_none_or(|(b, _)| cost < *b) {
                best = Some((cost, new));
            }
        }
    }
    let mut changed = false;
    let mut cost_after = cost_before;
    // Cheaper, or as cheap with fewer ops: the e-graph shares what the
    // function repeats (two inlined copies of a helper fold the same
    // weights, which costs a call nothing but is prepared twice).
    if let Some((cost, new)) = best
        && (cost < cost_before * (1.0 - 1e-9)
            || (cost <= cost_before * (1.0 + 1e-9) && new.body.node_count() < f.body.node_count()))
    {
        *f = new;
        changed = true;
        cost_after = cost;
    }
    Some(Report {
        stop,
        iterations,
        classes: eg.number_of_classes(),
        nodes: eg.total_number_of_nodes(),
        cost_before,
        cost_after,
        ilp: outcome,
        changed,
        elapsed: start.elapsed(),
    })
}

/// The function a choice describes: parameters as in `original`, nodes in
/// the original order where they came from the original, constant-only
/// subexpressions folded. `None` if the choice is incomplete or cyclic.
pub fn rebuild(
    eg: &TEGraph,
    choice: &Choice,
    roots: &[Id],
    original: &Function,
    origin: &HashMap<Id, NodeIndex>,
) -> Option<Function> {
    let used = used_classes(eg, choice, roots)?;
    // Order: each class keyed by its original node, new classes right after
    // the latest original node they depend on.
    let mut key: HashMap<Id, (usize, usize)> = HashMap::new();
    let mut fresh = 0;
    for &c in &used {
        let k = match origin.get(&c) {
            Some(n) => (n.index(), 0),
            None => {
                fresh += 1;
                let dep = tensor_children(eg, &choice[&c])
                    .iter()
                    .map(|k| key[k].0)
                    .max()
                    .unwrap_or(0);
                (dep, fresh)
            }
        };
        key.insert(c, k);
    }
    let mut users: HashMap<Id, Vec<Id>> = HashMap::new();
    let mut pending: HashMap<Id, usize> = HashMap::new();
    for &c in &used {
        let kids: BTreeSet<Id> = tensor_children(eg, &choice[&c]).into_iter().collect();
        pending.insert(c, kids.len());
        for k in kids {
            users.entry(k).or_default().push(c);
        }
    }
    let mut ready: BTreeSet<((usize, usize), Id)> = used
        .iter()
        .filter(|c| pending[c] == 0)
        .map(|&c| (key[&c], c))
        .collect();

    let mut f = Function::new(original.name.clone(), original.visibility);
    f.weights = original.weights.clone();
    let mut value: HashMap<Id, Value> = HashMap::new();
    let mut params: Vec<Option<Value>> = vec![None; original.params.len()];
    for (i, (name, node)) in original.params.iter().enumerate() {
        params[i] = Some(f.add_param(name.clone(), original.body[*node].results[0].clone()));
    }
    let mut folded: HashMap<Id, Tensor> = HashMap::new();
    let get = |c: Id| eg[c].data.clone();
    let mut order: Vec<Id> = Vec::with_capacity(used.len());
    while let Some((_, c)) = ready.pop_first() {
        order.push(c);
        let node = &choice[&c];
        let (head, operands) = decode(&eg.analysis.tables, node, &get)?;
        let info = eg[c].data.info()?.clone();
        let v = match head {
            Head::Op(Op::Param { index }) => params.get(index as usize).copied().flatten()?,
            Head::Const(k) => {
                let (cv, ty) = &eg.analysis.tables.consts[k];
                if ty.num_elements().is_some_and(|n| n <= WEIGHT_FOLD_LIMIT)
                    && let Ok(t) = Tensor::from_const(cv, ty)
                {
                    folded.insert(c, t);
                }
                f.add_op(Op::Constant(cv.clone()), &[], ty.clone())
            }
            Head::Op(op) => {
                let operands: Vec<Id> = operands.iter().map(|&o| eg.find(o)).collect();
                let fold = info.weights
                    && info
                        .ty
                        .num_elements()
                        .is_some_and(|n| n <= WEIGHT_FOLD_LIMIT)
                    && operands.iter().all(|o| folded.contains_key(o))
                    && {
                        let types: Vec<dlc_core::TensorType> =
                            operands.iter().map(|o| folded[o].ty()).collect();
                        let types: Vec<&dlc_core::TensorType> = types.iter().collect();
                        op_work(&op, &types, std::slice::from_ref(&info.ty)) <= FOLD_WORK_LIMIT
                    };
                let result = if fold {
                    let inputs: Vec<&Tensor> = operands.iter().map(|o| &folded[o]).collect();
                    eval_op(&op, &inputs, std::slice::from_ref(&info.ty))
                        .ok()
                        .and_then(|mut r| r.pop())
                } else {
                    None
                };
                match result {
                    Some(t) => {
                        let cv = t.to_const();
                        folded.insert(c, t);
                        f.add_op(Op::Constant(cv), &[], info.ty.clone())
                    }
                    None => {
                        let args: Vec<Value> = operands.iter().map(|o| value[o]).collect();
                        f.add_op(op, &args, info.ty.clone())
                    }
                }
            }
        };
        value.insert(c, v);
        for &u in users.get(&c).map(Vec::as_slice).unwrap_or(&[]) {
            let p = pending.get_mut(&u)?;
            *p -= 1;
            if *p == 0 {
                ready.insert((key[&u], u));
            }
        }
    }
    f.results = roots
        .iter()
        .map(|r| value.get(r).copied())
        .collect::<Option<_>>()?;
    place_rebuilt(&mut f, original, origin, &order, &users, &value);
    crate::transforms::remove_dead_nodes(&mut f);
    Some(f)
}

/// Gives each rebuilt node a source place, so that run-time failures and
/// kernel names still point at the program after saturation: a class that
/// holds an original node takes that node's place; a class the rewrites
/// made (a batchnorm folded into its convolution, a bias moved into a
/// product's epilogue) takes the place of its first user that has one, the
/// op whose value it helps compute, else of its first operand that has one.
fn place_rebuilt(
    f: &mut Function,
    original: &Function,
    origin: &HashMap<Id, NodeIndex>,
    order: &[Id],
    users: &HashMap<Id, Vec<Id>>,
    value: &HashMap<Id, Value>,
) {
    let mut place: HashMap<Id, dlc_core::SourceLoc> = origin
        .iter()
        .filter_map(|(&c, &n)| Some((c, original.body.node_weight(n)?.loc.clone()?)))
        .collect();
    // Users come after their operands in `order`: walking it backwards
    // settles every user before the class it reads.
    for &c in order.iter().rev() {
        if place.contains_key(&c) {
            continue;
        }
        let from_user = users
            .get(&c)
            .into_iter()
            .flatten()
            .find_map(|u| place.get(u).cloned());
        if let Some(loc) = from_user {
            place.insert(c, loc);
        }
    }
    let class_of: HashMap<NodeIndex, Id> = value.iter().map(|(&c, v)| (v.node, c)).collect();
    for &c in order {
        if place.contains_key(&c) {
            continue;
        }
        let operand = f
            .operands(value[&c].node)
            .into_iter()
            .find_map(|o| place.get(class_of.get(&o.node)?).cloned());
        if let Some(loc) = operand {
            place.insert(c, loc);
        }
    }
    for (c, loc) in place {
        if let Some(v) = value.get(&c)
            && let Some(node) = f.body.node_weight_mut(v.node)
            && !matches!(node.op, Op::Param { .. })
        {
            node.loc = Some(loc);
        }
    }
}

/// The functions whose saturated nodes may be settled (`Node::settled`)
/// once inlined: those nobody calls, and those whose every call site passes
/// declared weights (or work on them alone) for the same parameters, which
/// a helper then declares as its own weights, so that it is saturated in the
/// context it is inlined into (W3's `block` folds its batchnorms into the
/// weights its callers declare). A helper whose call sites differ, or an
/// entry point called with other weights than its own, is saturated again
/// wherever it is inlined.
fn weights_from_call_sites(module: &mut Module) -> std::collections::HashSet<String> {
    let mut settleable: std::collections::HashSet<String> =
        module.functions.iter().map(|f| f.name.clone()).collect();
    // Helpers take their weights from their callers: repeat until nothing
    // changes (a helper's weights make its own calls' arguments weights).
    for _ in 0..=module.functions.len() {
        let mut sites: HashMap<String, Vec<BTreeSet<usize>>> = HashMap::new();
        for f in &module.functions {
            let bound = crate::fusion::bound_nodes(f);
            for n in f.body.node_indices() {
                let Op::Call { callee } = &f.body[n].op else {
                    continue;
                };
                let weights = f
                    .operands(n)
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| {
                        bound.contains(&v.node)
                            || matches!(f.body[v.node].op, Op::Param { index } if f.is_weight(index as usize))
                    })
                    .map(|(i, _)| i)
                    .collect();
                sites.entry(callee.clone()).or_default().push(weights);
            }
        }
        let mut changed = false;
        for g in &mut module.functions {
            let Some(calls) = sites.get(&g.name) else {
                continue;
            };
            let agreed = calls.iter().all(|w| *w == calls[0]);
            match g.visibility {
                crate::module::Visibility::Private if agreed => {
                    if g.weights != calls[0] {
                        g.weights = calls[0].clone();
                        changed = true;
                    }
                    settleable.insert(g.name.clone());
                }
                crate::module::Visibility::Public if agreed && g.weights == calls[0] => {
                    settleable.insert(g.name.clone());
                }
                _ => {
                    settleable.remove(&g.name);
                }
            }
        }
        if !changed {
            break;
        }
    }
    settleable
}

/// The pass.
pub struct Saturate {
    /// Limits and choices.
    pub options: SaturateOptions,
}

impl Pass<Module> for Saturate {
    fn name(&self) -> &'static str {
        "graph.saturate"
    }

    fn run(&mut self, module: &mut Module) -> Result<Vec<(&'static str, u64)>, PassError> {
        let model = CostModel::calibrated();
        let mut stats: Vec<(&'static str, u64)> = Vec::new();
        let mut add = |what: &'static str, n: u64| match stats.iter_mut().find(|(w, _)| *w == what)
        {
            Some((_, m)) => *m += n,
            None => stats.push((what, n)),
        };
        let settleable = weights_from_call_sites(module);
        for f in &mut module.functions {
            let Some(r) = saturate_function(f, &self.options, model) else {
                add("functions skipped (calls or multi-result ops)", 1);
                continue;
            };
            if settleable.contains(&f.name) {
                for n in f.body.node_weights_mut() {
                    n.settled = true;
                }
            }
            add("functions saturated", 1);
            add("functions changed", u64::from(r.changed));
            add(
                match r.stop {
                    StopReason::Saturated => "stopped: saturated",
                    StopReason::IterationLimit(_) => "stopped: iteration limit",
                    StopReason::NodeLimit(_) => "stopped: node limit",
                    StopReason::TimeLimit(_) => "stopped: time limit",
                    StopReason::Other(_) => "stopped: other",
                },
                1,
            );
            add("iterations", r.iterations as u64);
            add("e-classes", r.classes as u64);
            add("e-nodes", r.nodes as u64);
            add("time (us)", r.elapsed.as_micros() as u64);
            add(
                "estimated cost before (ns)",
                (r.cost_before * 1e3).round() as u64,
            );
            add(
                "estimated cost after (ns)",
                (r.cost_after * 1e3).round() as u64,
            );
            match r.ilp {
                Some(IlpOutcome::Optimal) => add("extraction: ilp optimal", 1),
                Some(IlpOutcome::TimeLimit) => add("extraction: ilp at time limit (best found)", 1),
                Some(IlpOutcome::Failed) => add("extraction: greedy (ilp failed)", 1),
                Some(IlpOutcome::TooLarge) => add("extraction: greedy (too large for ilp)", 1),
                None => add("extraction: greedy", 1),
            }
        }
        Ok(stats)
    }
}

/// Builds the pass from `graph.saturate{...}` options, pricing for
/// `target` unless `target=NAME` names another.
pub fn from_options(
    o: &dlc_core::PassOptions,
    target: &dlc_core::TargetDesc,
) -> Result<Saturate, PassError> {
    o.expect_only(&[
        "node-limit",
        "iter-limit",
        "time-limit-ms",
        "multi-iters",
        "extract",
        "ilp-time-limit-ms",
        "rules",
        "target",
    ])?;
    let d = SaturateOptions::default();
    let bad = |message: String| PassError::BadOption {
        pass: "graph.saturate".into(),
        message,
    };
    let extraction = match o.get("extract", "ilp".to_string())?.as_str() {
        "ilp" => Extraction::Ilp,
        "greedy" => Extraction::Greedy,
        other => {
            return Err(bad(format!(
                "`extract` is `ilp` or `greedy`, not `{other}`"
            )));
        }
    };
    let tables: Vec<String> = o
        .get("rules", rules::TABLES.join(" "))?
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if let Some(t) = tables.iter().find(|t| !rules::TABLES.contains(&t.as_str())) {
        return Err(bad(format!(
            "unknown rule table `{t}`; tables: {}",
            rules::TABLES.join(" ")
        )));
    }
    let target = match o.get("target", String::new())?.as_str() {
        "" => target.clone(),
        name => dlc_core::TargetDesc::named(name).map_err(bad)?,
    };
    Ok(Saturate {
        options: SaturateOptions {
            node_limit: o.get("node-limit", d.node_limit)?,
            iter_limit: o.get("iter-limit", d.iter_limit)?,
            time_limit: Duration::from_millis(
                o.get("time-limit-ms", d.time_limit.as_millis() as u64)?,
            ),
            multi_iters: o.get("multi-iters", d.multi_iters)?,
            extraction,
            ilp_time_limit: Duration::from_millis(
                o.get("ilp-time-limit-ms", d.ilp_time_limit.as_millis() as u64)?,
            ),
            tables,
            target,
        },
    })
}
