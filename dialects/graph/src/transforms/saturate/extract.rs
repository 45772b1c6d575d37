//! Extraction: pick one e-node per needed e-class so that the chosen graph
//! costs least.
//!
//! - **Extraction** (`extract.rs`): greedy (egg's bottom-up extractor; a shared subterm
//!   counts once per use, so it never sees the gain of a merge, and prefers recomputing
//!   a value read twice; a local search then switches classes to nodes built from what
//!   the choice already computes while the program's cost falls, `improve`) and exact: an integer
//!   program over the DAG (a boolean per candidate node and per class; a used class picks
//!   one node; a picked node uses its children's classes; roots are used), solved by
//!   microlp through good_lp, warm-started from the (improved) greedy choice so that it is never
//!   worse. Cycles are cut lazily: a solution whose choice has a cycle gets a
//!   constraint forbidding that cycle and is solved again, which keeps the program far
//!   smaller than Tensat's topological-order variables. On the time limit the best
//!   solution found is used; on failure the greedy one. Candidates dominated by another
//!   node of their class (no cheaper, operand classes a superset: commuted operands)
//!   get no variable. A
//!   presolve drops what every solution shares: a class the roots reach through classes
//!   of one candidate each is used in any solution, and if it has one candidate itself
//!   that node is chosen, so neither needs a variable. The
//!   choice is always checked (complete and acyclic) before use; both the greedy and
//!   the ILP choice are rebuilt and the cheaper by the function-level model replaces
//!   the function if it beats the original.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use egg::{CostFunction, Extractor, Id, Language};
use good_lp::{
    Expression, Solution, SolverModel, Variable, WithInitialSolution, WithTimeLimit, constraint,
    microlp, variable, variables,
};

use dlc_core::TargetDesc;

use super::cost::CostModel;
use super::lang::{Data, Head, TEGraph, TLang, TensorAnalysis, reachable, typed};

/// One chosen e-node per e-class.
pub type Choice = BTreeMap<Id, TLang>;

/// The cost of `node` alone (its children not included), in µs; infinite
/// for a node that does not type-check.
pub fn node_cost(model: &CostModel, target: &TargetDesc, eg: &TEGraph, node: &TLang) -> f64 {
    if node.is_leaf() {
        return 0.0;
    }
    let get = |c: Id| eg[c].data.clone();
    match typed(&eg.analysis.tables, node, &get) {
        Some((Head::Const(_), _, _)) => 0.0,
        Some((Head::Op(op), inputs, out)) => model.op_cost(&op, &out, &inputs, target),
        None => f64::INFINITY,
    }
}

/// The tensor operands' classes of a node (attribute leaves left out).
pub fn tensor_children(eg: &TEGraph, node: &TLang) -> Vec<Id> {
    node.children()
        .iter()
        .map(|&c| eg.find(c))
        .filter(|&c| matches!(eg[c].data, Data::Tensor(_) | Data::Invalid))
        .collect()
}

struct TreeCost<'a> {
    model: &'a CostModel,
    target: &'a TargetDesc,
    eg: &'a TEGraph,
}

impl CostFunction<TLang> for TreeCost<'_> {
    type Cost = f64;

    fn cost<C>(&mut self, enode: &TLang, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        let own = node_cost(self.model, self.target, self.eg, enode);
        enode.children().iter().fold(own, |acc, &c| acc + costs(c))
    }
}

/// Greedy extraction: for each class reachable from `roots`, its cheapest
/// node by tree cost.
pub fn greedy(model: &CostModel, target: &TargetDesc, eg: &TEGraph, roots: &[Id]) -> Choice {
    let ex = Extractor::new(eg, TreeCost { model, target, eg });
    let mut choice = Choice::new();
    choose_greedily(eg, &ex, &mut choice, roots);
    choice
}

/// Gives every class `from` reaches through the nodes `choice` picks (or,
/// where it picks none, `ex`'s cheapest) that node.
fn choose_greedily(
    eg: &TEGraph,
    ex: &Extractor<'_, TreeCost<'_>, TLang, TensorAnalysis>,
    choice: &mut Choice,
    from: &[Id],
) {
    let mut stack: Vec<Id> = from.iter().map(|&r| eg.find(r)).collect();
    while let Some(c) = stack.pop() {
        if choice.contains_key(&c) {
            continue;
        }
        let node = ex.find_best_node(c).clone();
        stack.extend(node.children().iter().map(|&ch| eg.find(ch)));
        choice.insert(c, node);
    }
}

/// Local search from `start` (greedy's choice): each used class tries
/// those of its other nodes whose operands are already computed, and a
/// switch stays when the program's cost, each used class's
/// node counted once, falls. Greedy prices a subterm at each use, so where
/// a value is read twice it prefers a rewrite that recomputes it:
/// `c * hardsigmoid(c)` after a convolution `c = conv(x, w)` has `c / 6`
/// also as `conv(x, w / 6)`, cheaper as a tree and a second convolution in
/// the program; switching `c / 6` back to a multiply drops it. Passes
/// repeat while one improves, within a bound on the switches tried.
/// (Trying every node was 4-50x the whole compile on the ONNX models.)
pub fn improve(
    model: &CostModel,
    target: &TargetDesc,
    eg: &TEGraph,
    roots: &[Id],
    start: &Choice,
) -> Choice {
    let ex = Extractor::new(eg, TreeCost { model, target, eg });
    let cost_of = |choice: &Choice| -> Option<f64> {
        let used = used_classes(eg, choice, roots)?;
        Some(
            used.iter()
                .map(|c| node_cost(model, target, eg, &choice[c]))
                .sum(),
        )
    };
    let mut cur = start.clone();
    let Some(mut cur_cost) = cost_of(&cur) else {
        return cur;
    };
    let mut budget = IMPROVE_TRIALS;
    loop {
        let Some(used) = used_classes(eg, &cur, roots) else {
            return cur;
        };
        let in_use: BTreeSet<Id> = used.iter().copied().collect();
        let mut improved = false;
        for c in used {
            for node in &eg[c].nodes {
                // Only a node whose operands the program already computes
                // (or that cost nothing: constants, parameters) can undo a
                // recomputation; the rest are greedy's own trade-offs.
                if cur.get(&c) == Some(node)
                    || !tensor_children(eg, node)
                        .iter()
                        .all(|k| in_use.contains(k) || ex.find_best_cost(*k) == 0.0)
                {
                    continue;
                }
                if budget == 0 {
                    return cur;
                }
                budget -= 1;
                let mut cand = cur.clone();
                cand.insert(c, node.clone());
                choose_greedily(eg, &ex, &mut cand, node.children());
                if let Some(cost) = cost_of(&cand)
                    && cost < cur_cost * (1.0 - 1e-9)
                {
                    cur = cand;
                    cur_cost = cost;
                    improved = true;
                }
            }
        }
        if !improved {
            return cur;
        }
    }
}

/// The most switches [`improve`] tries.
const IMPROVE_TRIALS: usize = 4000;

/// Why a choice describes no function.
enum Broken {
    /// A class it needs has no chosen node.
    Missing,
    /// The chosen nodes form a cycle through these classes.
    Cycle(Vec<Id>),
}

/// The classes a choice uses from `roots`, children before users.
fn walk(eg: &TEGraph, choice: &Choice, roots: &[Id]) -> Result<Vec<Id>, Broken> {
    // false: on the current path; true: done
    let mut state: HashMap<Id, bool> = HashMap::new();
    let (mut path, mut order) = (Vec::new(), Vec::new());
    fn visit(
        eg: &TEGraph,
        choice: &Choice,
        c: Id,
        state: &mut HashMap<Id, bool>,
        path: &mut Vec<Id>,
        order: &mut Vec<Id>,
    ) -> Result<(), Broken> {
        match state.get(&c) {
            Some(true) => return Ok(()),
            Some(false) => {
                let at = path.iter().position(|&p| p == c).unwrap_or(0);
                return Err(Broken::Cycle(path[at..].to_vec()));
            }
            None => {}
        }
        let node = choice.get(&c).ok_or(Broken::Missing)?;
        state.insert(c, false);
        path.push(c);
        for k in tensor_children(eg, node) {
            visit(eg, choice, k, state, path, order)?;
        }
        path.pop();
        state.insert(c, true);
        order.push(c);
        Ok(())
    }
    for &r in roots {
        visit(eg, choice, eg.find(r), &mut state, &mut path, &mut order)?;
    }
    Ok(order)
}

/// The classes a choice uses, children before users; `None` if the choice
/// misses a class or has a cycle.
pub fn used_classes(eg: &TEGraph, choice: &Choice, roots: &[Id]) -> Option<Vec<Id>> {
    walk(eg, choice, roots).ok()
}

/// How exact extraction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IlpOutcome {
    /// The solver proved its choice optimal.
    Optimal,
    /// The time limit stopped it; its best acyclic choice (at worst the
    /// starting one) is used.
    TimeLimit,
    /// The solver failed; the starting choice is used.
    Failed,
    /// More than [`ILP_MAX_NODES`] candidates: the starting choice is used.
    TooLarge,
}

/// The largest integer program (in candidate e-nodes) exact extraction
/// attempts. microlp proves the examples' programs (20-160 candidates)
/// optimal in 0.4-17 ms; from about 300 (the training steps' e-graphs: 300
/// to 11,000 candidates) it ran to its time limit on every workload, and
/// past it (30 ms asked, 90-170 ms taken building and solving the larger
/// ones) without ever bettering the greedy start: a training step's cold
/// compile spent 35-330 ms there for nothing.
pub const ILP_MAX_NODES: usize = 200;

/// A candidate e-node of the integer program.
struct Candidate {
    class: Id,
    node: TLang,
    kids: Vec<Id>,
    cost: f64,
}

/// The candidates for the classes `classes` (of tensors), without
/// dominated nodes: a node that costs at least as much as another of its
/// class whose operand classes are a subset of its own can be swapped for
/// that one in any solution (commuted operands are the common case), so it
/// never needs a variable. The starting choice is always kept, for the
/// warm start.
fn candidates(
    model: &CostModel,
    target: &TargetDesc,
    eg: &TEGraph,
    classes: &[Id],
    start: &Choice,
) -> Vec<Candidate> {
    let known: BTreeSet<Id> = classes.iter().copied().collect();
    let mut cands: Vec<Candidate> = Vec::new();
    for &c in classes {
        let mut here: Vec<Candidate> = Vec::new();
        for node in &eg[c].nodes {
            let cost = node_cost(model, target, eg, node);
            let kids = tensor_children(eg, node);
            if cost.is_finite() && !kids.contains(&c) && kids.iter().all(|k| known.contains(k)) {
                here.push(Candidate {
                    class: c,
                    node: node.clone(),
                    kids,
                    cost,
                });
            }
        }
        here.sort_by(|a, b| a.cost.total_cmp(&b.cost));
        let mut kept: Vec<Candidate> = Vec::new();
        for cand in here {
            let set: BTreeSet<Id> = cand.kids.iter().copied().collect();
            let dominated = kept
                .iter()
                .any(|k| k.cost <= cand.cost && k.kids.iter().all(|kid| set.contains(kid)));
            if !dominated || start.get(&c) == Some(&cand.node) {
                kept.push(cand);
            }
        }
        cands.extend(kept);
    }
    cands
}

/// The candidates of each class, by their index.
fn by_class(cands: &[Candidate]) -> HashMap<Id, Vec<usize>> {
    let mut by_class: HashMap<Id, Vec<usize>> = HashMap::new();
    for (i, k) in cands.iter().enumerate() {
        by_class.entry(k.class).or_default().push(i);
    }
    by_class
}

/// The classes used in every solution: the roots, and the classes they
/// reach through classes of one candidate each (if such a class has one
/// candidate itself, that node is chosen: neither needs a variable; W7's
/// inlined steps, where a few classes have a choice among hundreds: a
/// program over all of them took microlp 35-60 ms to solve).
fn forced(
    eg: &TEGraph,
    roots: &[Id],
    cands: &[Candidate],
    by_class: &HashMap<Id, Vec<usize>>,
) -> BTreeSet<Id> {
    let mut forced: BTreeSet<Id> = roots.iter().map(|&r| eg.find(r)).collect();
    let mut queue: Vec<Id> = forced.iter().copied().collect();
    while let Some(c) = queue.pop() {
        if let Some([only]) = by_class.get(&c).map(Vec::as_slice) {
            for &kid in &cands[*only].kids {
                if forced.insert(kid) {
                    queue.push(kid);
                }
            }
        }
    }
    forced
}

/// Exact extraction by integer programming, starting from `start` (a
/// complete, acyclic choice, normally the greedy one).
///
/// Variables: one boolean per candidate e-node and per e-class ("used");
/// a used class picks exactly one node, a picked node uses its children's
/// classes, the roots are used. Cycles are ruled out lazily: a solution
/// whose choice has a cycle gets a cut (not all of the cycle's nodes) and is
/// solved again, which keeps the program small where a topological-order
/// formulation makes it slow.
pub fn ilp(
    model: &CostModel,
    target: &TargetDesc,
    eg: &TEGraph,
    roots: &[Id],
    start: &Choice,
    limit: Duration,
) -> (Choice, IlpOutcome) {
    let begin = std::time::Instant::now();
    let all = reachable(eg, roots);
    let classes: Vec<Id> = all
        .iter()
        .copied()
        .filter(|&c| matches!(eg[c].data, Data::Tensor(_)))
        .collect();
    // Attribute leaves are chosen as they are.
    let leaves: Vec<(Id, TLang)> = all
        .iter()
        .filter_map(|&c| Some((c, eg[c].nodes.iter().find(|n| n.is_leaf())?.clone())))
        .collect();
    let cands = candidates(model, target, eg, &classes, start);
    let by_class = by_class(&cands);
    let forced = forced(eg, roots, &cands, &by_class);
    let single = |c: Id| by_class.get(&c).is_some_and(|v| v.len() == 1);
    let (fixed, free): (Vec<usize>, Vec<usize>) =
        (0..cands.len()).partition(|&i| forced.contains(&cands[i].class) && single(cands[i].class));
    // Classes with a "used" variable: those not used in every solution.
    let classes: Vec<Id> = classes
        .into_iter()
        .filter(|c| !forced.contains(c))
        .collect();
    if free.len() > ILP_MAX_NODES {
        return (start.clone(), IlpOutcome::TooLarge);
    }
    let mut base = Choice::new();
    for &i in &fixed {
        base.insert(cands[i].class, cands[i].node.clone());
    }
    for (c, leaf) in &leaves {
        base.entry(*c).or_insert_with(|| leaf.clone());
    }
    if free.is_empty() {
        // Nothing to choose.
        return match walk(eg, &base, roots) {
            Ok(_) => (base, IlpOutcome::Optimal),
            Err(_) => (start.clone(), IlpOutcome::Failed),
        };
    }
    let cands: Vec<Candidate> = {
        let mut all: Vec<Option<Candidate>> = cands.into_iter().map(Some).collect();
        free.iter().filter_map(|&i| all[i].take()).collect()
    };
    // Forced classes that still choose among their candidates.
    let chosen_once: BTreeSet<Id> = cands
        .iter()
        .map(|k| k.class)
        .filter(|c| forced.contains(c))
        .collect();
    let start_used: BTreeSet<Id> = used_classes(eg, start, roots)
        .unwrap_or_default()
        .into_iter()
        .collect();
    let mut cuts: Vec<Vec<usize>> = Vec::new();
    for _round in 0..16 {
        let left = limit.saturating_sub(begin.elapsed());
        if left.is_zero() {
            return (start.clone(), IlpOutcome::TimeLimit);
        }
        let mut vars = variables!();
        let r: HashMap<Id, Variable> = classes
            .iter()
            .map(|&c| (c, vars.add(variable().binary())))
            .collect();
        let x: Vec<Variable> = cands
            .iter()
            .map(|_| vars.add(variable().binary()))
            .collect();
        let objective: Expression = cands.iter().zip(&x).map(|(k, v)| k.cost * *v).sum();
        let mut warm: Vec<(Variable, f64)> = Vec::new();
        for &c in &classes {
            warm.push((r[&c], if start_used.contains(&c) { 1.0 } else { 0.0 }));
        }
        for (k, v) in cands.iter().zip(&x) {
            let chosen = start_used.contains(&k.class) && start.get(&k.class) == Some(&k.node);
            warm.push((*v, if chosen { 1.0 } else { 0.0 }));
        }
        let mut problem = vars
            .minimise(objective)
            .using(microlp)
            .with_time_limit(left.as_secs_f64())
            .with_initial_solution(warm);
        let mut per_class: HashMap<Id, Expression> = HashMap::new();
        for (k, v) in cands.iter().zip(&x) {
            *per_class.entry(k.class).or_default() += *v;
            // A forced child is used whatever is chosen.
            for kid in k.kids.iter().filter_map(|kid| r.get(kid)) {
                problem.add_constraint(constraint!(*v <= *kid));
            }
        }
        for &c in &classes {
            let sum = per_class.remove(&c).unwrap_or_default();
            problem.add_constraint(constraint!(sum == r[&c]));
        }
        for c in &chosen_once {
            let sum = per_class.remove(c).unwrap_or_default();
            problem.add_constraint(constraint!(sum == 1.0));
        }
        for cut in &cuts {
            let sum: Expression = cut.iter().map(|&i| x[i]).sum();
            problem.add_constraint(constraint!(sum <= (cut.len() - 1) as f64));
        }
        let Ok(solution) = problem.solve() else {
            // microlp reports a time limit hit before any solution as an error.
            let outcome = if begin.elapsed() >= limit {
                IlpOutcome::TimeLimit
            } else {
                IlpOutcome::Failed
            };
            return (start.clone(), outcome);
        };
        let optimal = matches!(solution.status(), good_lp::SolutionStatus::Optimal);
        let mut choice = base.clone();
        let mut picked: HashMap<Id, usize> = HashMap::new();
        for (i, (k, v)) in cands.iter().zip(&x).enumerate() {
            if solution.value(*v) > 0.5 {
                choice.insert(k.class, k.node.clone());
                picked.insert(k.class, i);
            }
        }
        match walk(eg, &choice, roots) {
            Ok(_) => {
                let outcome = if optimal {
                    IlpOutcome::Optimal
                } else {
                    IlpOutcome::TimeLimit
                };
                return (choice, outcome);
            }
            Err(Broken::Missing) => return (start.clone(), IlpOutcome::Failed),
            Err(Broken::Cycle(cycle)) => {
                // Not all of the cycle's chosen nodes again; the fixed
                // ones are chosen in every solution.
                let cut: Vec<usize> = cycle
                    .iter()
                    .filter_map(|c| picked.get(c).copied())
                    .collect();
                if cut.is_empty() {
                    return (start.clone(), IlpOutcome::Failed);
                }
                cuts.push(cut);
            }
        }
    }
    (start.clone(), IlpOutcome::TimeLimit)
}
