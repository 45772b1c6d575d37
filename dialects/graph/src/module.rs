//! Modules, functions and nodes. A function body is a petgraph
//! `StableDiGraph` whose nodes are ops and whose edges are uses: an edge from
//! `a` to `b` with weight `Use { operand: i, result: r }` says that `b`'s
//! `i`-th operand is `a`'s `r`-th result. The edges are the only record of
//! operands, so a rewrite that re-points a use changes one edge.

use std::fmt;

use dlc_core::TensorType;
use petgraph::Direction;
use petgraph::stable_graph::{EdgeIndex, NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;

use crate::ops::Op;

/// One use of a result: which operand slot of the user it fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Use {
    /// Operand position in the user.
    pub operand: u32,
    /// Result position in the producer.
    pub result: u32,
}

/// One result of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value {
    /// The producing node.
    pub node: NodeIndex,
    /// Which of its results.
    pub result: u32,
}

impl Value {
    /// The first (often only) result of `node`.
    pub fn of(node: NodeIndex) -> Value {
        Value { node, result: 0 }
    }
}

/// An op and the types of its results.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// What the node computes.
    pub op: Op,
    /// Result types; most ops have one.
    pub results: Vec<TensorType>,
    /// Where the op comes from in the source, when it was compiled from
    /// source: run-time errors name it. Not part of the text form.
    pub loc: Option<dlc_core::SourceLoc>,
    /// Whether `graph.saturate` has already rewritten the op in the
    /// function it was in (a callee saturated before it was inlined):
    /// single-pattern rules rooted at it are not tried again. Not part of
    /// the text form.
    pub settled: bool,
}

/// Whether a function is an entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// An entry point: exported, kept by `graph.inline`.
    Public,
    /// A helper (an instantiated generic function): removed once inlined.
    Private,
}

/// A function: parameters, a DAG of ops, and the returned values.
#[derive(Debug, Clone)]
pub struct Function {
    /// Symbol name, printed `@name`.
    pub name: String,
    /// Entry point or helper.
    pub visibility: Visibility,
    /// Parameter names (printed `%name`) and their `graph.param` nodes.
    pub params: Vec<(String, NodeIndex)>,
    /// The ops.
    pub body: StableDiGraph<Node, Use>,
    /// Returned values, in order.
    pub results: Vec<Value>,
    /// The parameters (indices into `params`) declared weights: bound once
    /// and read by many calls, so work on them alone may run once, when
    /// they are bound (printed `weight %name`).
    pub weights: std::collections::BTreeSet<usize>,
    /// Whether a gradient through a call of this function recomputes its
    /// body from the call's arguments instead of keeping its intermediate
    /// values (`checkpoint(f(..))`: gradient checkpointing). Inlining for
    /// anything else ignores it. Not part of the text form.
    pub recompute: bool,
}

impl Function {
    /// An empty function.
    pub fn new(name: impl Into<String>, visibility: Visibility) -> Self {
        Function {
            name: name.into(),
            visibility,
            params: Vec::new(),
            body: StableDiGraph::new(),
            results: Vec::new(),
            weights: Default::default(),
            recompute: false,
        }
    }

    /// Appends a parameter.
    pub fn add_param(&mut self, name: impl Into<String>, ty: TensorType) -> Value {
        let index = self.params.len() as u32;
        let node = self.body.add_node(Node {
            op: Op::Param { index },
            results: vec![ty],
            loc: None,
            settled: false,
        });
        self.params.push((name.into(), node));
        Value::of(node)
    }

    /// Makes parameter `i` a constant of `values` (row-major, of its type):
    /// its node becomes a `graph.constant`, the parameters after it move
    /// up one place, and it is no longer a weight. What `--weights` does to
    /// a compiled artifact: the weights are in it, not arguments of it.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn bind_param(&mut self, i: usize, values: impl Into<std::sync::Arc<[f64]>>) {
        let (_, node) = self.params.remove(i);
        self.body[node].op = Op::Constant(crate::ops::ConstValue::Dense(values.into()));
        for (k, (_, n)) in self.params.iter().enumerate().skip(i) {
            self.body[*n].op = Op::Param { index: k as u32 };
        }
        self.weights = std::mem::take(&mut self.weights)
            .into_iter()
            .filter(|&w| w != i)
            .map(|w| if w > i { w - 1 } else { w })
            .collect();
    }

    /// Makes every dense constant of the function a `weight` parameter of
    /// its own (after the others), the inverse of [`Self::bind_param`], and
    /// returns each new parameter's name and values, in order: how the CPU
    /// back end treats constants as the weights they are (work on them alone
    /// runs once) before building them back in.
    pub fn lift_constants(&mut self) -> Vec<(String, std::sync::Arc<[f64]>)> {
        let mut dense: Vec<NodeIndex> = self
            .body
            .node_indices()
            .filter(|&n| {
                matches!(
                    self.body[n].op,
                    Op::Constant(crate::ops::ConstValue::Dense(_))
                )
            })
            .collect();
        dense.sort();
        let mut taken: std::collections::HashSet<String> =
            self.params.iter().map(|(n, _)| n.clone()).collect();
        let mut lifted = Vec::with_capacity(dense.len());
        for n in dense {
            let index = self.params.len();
            let op = std::mem::replace(
                &mut self.body[n].op,
                Op::Param {
                    index: index as u32,
                },
            );
            let Op::Constant(crate::ops::ConstValue::Dense(values)) = op else {
                continue;
            };
            let mut name = format!("const{}", lifted.len());
            while !taken.insert(name.clone()) {
                name.push('_');
            }
            self.params.push((name.clone(), n));
            self.weights.insert(index);
            lifted.push((name, values));
        }
        lifted
    }

    /// Whether parameter `i` is a weight.
    pub fn is_weight(&self, i: usize) -> bool {
        self.weights.contains(&i)
    }

    /// Adds an op with the given operands and result types.
    pub fn add_node(&mut self, op: Op, operands: &[Value], results: Vec<TensorType>) -> NodeIndex {
        let node = self.body.add_node(Node {
            op,
            results,
            loc: None,
            settled: false,
        });
        for (i, v) in operands.iter().enumerate() {
            self.body.add_edge(
                v.node,
                node,
                Use {
                    operand: i as u32,
                    result: v.result,
                },
            );
        }
        node
    }

    /// Adds a single-result op and returns its value.
    pub fn add_op(&mut self, op: Op, operands: &[Value], result: TensorType) -> Value {
        Value::of(self.add_node(op, operands, vec![result]))
    }

    /// Parameter types, in order.
    pub fn param_types(&self) -> Vec<TensorType> {
        self.params
            .iter()
            .map(|(_, n)| self.body[*n].results[0].clone())
            .collect()
    }

    /// Result types, in order.
    pub fn result_types(&self) -> Vec<TensorType> {
        self.results
            .iter()
            .map(|v| self.value_type(*v).clone())
            .collect()
    }

    /// The type of a value.
    ///
    /// # Panics
    /// If `v` names no result of a live node; the verifier rules this out.
    pub fn value_type(&self, v: Value) -> &TensorType {
        &self.body[v.node].results[v.result as usize]
    }

    /// The operands of `node`, in operand order.
    pub fn operands(&self, node: NodeIndex) -> Vec<Value> {
        let mut uses: Vec<(u32, Value)> = self
            .body
            .edges_directed(node, Direction::Incoming)
            .map(|e| {
                (
                    e.weight().operand,
                    Value {
                        node: e.source(),
                        result: e.weight().result,
                    },
                )
            })
            .collect();
        uses.sort_by_key(|(slot, _)| *slot);
        uses.into_iter().map(|(_, v)| v).collect()
    }

    /// The nodes that use any result of `node` (with repetitions removed).
    pub fn users(&self, node: NodeIndex) -> Vec<NodeIndex> {
        let mut users: Vec<NodeIndex> = self
            .body
            .neighbors_directed(node, Direction::Outgoing)
            .collect();
        users.sort_unstable();
        users.dedup();
        users
    }

    /// Makes every use of `from` (operands and function results) use `to`.
    pub fn replace_all_uses(&mut self, from: Value, to: Value) {
        if from == to {
            return;
        }
        let edges: Vec<(EdgeIndex, NodeIndex, Use)> = self
            .body
            .edges_directed(from.node, Direction::Outgoing)
            .filter(|e| e.weight().result == from.result)
            .map(|e| (e.id(), e.target(), *e.weight()))
            .collect();
        for (edge, user, u) in edges {
            self.body.remove_edge(edge);
            self.body.add_edge(
                to.node,
                user,
                Use {
                    operand: u.operand,
                    result: to.result,
                },
            );
        }
        for r in &mut self.results {
            if *r == from {
                *r = to;
            }
        }
    }

    /// Nodes in a deterministic topological order: parameters first, in
    /// signature order, then ops, always taking the ready node with the
    /// smallest index. For a freshly parsed function this is print order.
    pub fn topo_order(&self) -> Vec<NodeIndex> {
        // Indexed by node index (a vector, not a map: this runs for every
        // analysis of every candidate a pass prices).
        let bound = petgraph::visit::NodeIndexable::node_bound(&self.body);
        let mut indegree: Vec<usize> = vec![0; bound];
        let mut ready = std::collections::BinaryHeap::new();
        for n in self.body.node_indices() {
            let d = self.body.edges_directed(n, Direction::Incoming).count();
            indegree[n.index()] = d;
            if d == 0 && !matches!(self.body[n].op, Op::Param { .. }) {
                ready.push(std::cmp::Reverse(n));
            }
        }
        let mut order: Vec<NodeIndex> = Vec::with_capacity(self.body.node_count());
        order.extend(self.params.iter().map(|(_, n)| *n));
        let release =
            |n: NodeIndex,
             indegree: &mut Vec<usize>,
             ready: &mut std::collections::BinaryHeap<std::cmp::Reverse<NodeIndex>>| {
                for succ in self.body.neighbors_directed(n, Direction::Outgoing) {
                    // One decrement per edge: neighbors_directed repeats a
                    // neighbor once for each edge to it.
                    let d = &mut indegree[succ.index()];
                    *d -= 1;
                    if *d == 0 {
                        ready.push(std::cmp::Reverse(succ));
                    }
                }
            };
        for &p in &order {
            release(p, &mut indegree, &mut ready);
        }
        while let Some(std::cmp::Reverse(n)) = ready.pop() {
            order.push(n);
            release(n, &mut indegree, &mut ready);
        }
        order
    }

    /// Number of op nodes (parameters excluded).
    pub fn num_ops(&self) -> usize {
        self.body
            .node_weights()
            .filter(|n| !matches!(n.op, Op::Param { .. }))
            .count()
    }
}

/// A list of functions with distinct names.
#[derive(Debug, Clone, Default)]
pub struct Module {
    /// The functions, in print order.
    pub functions: Vec<Function>,
}

impl Module {
    /// The function called `name`.
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// The public functions (entry points).
    pub fn entry_points(&self) -> impl Iterator<Item = &Function> {
        self.functions
            .iter()
            .filter(|f| f.visibility == Visibility::Public)
    }
}

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::print::print_module(self))
    }
}
