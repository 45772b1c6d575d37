use std::collections::HashSet;

use dlc_core::{Pass, PassError};
use petgraph::Direction;

use crate::module::{Function, Module};
use crate::ops::Op;

/// `graph.dce`: removes ops none of whose results reach a returned value.
pub struct Dce;

/// Removes the dead ops of `f`; returns how many were removed.
pub fn remove_dead_nodes(f: &mut Function) -> u64 {
    let mut live = HashSet::new();
    let mut stack: Vec<_> = f.results.iter().map(|v| v.node).collect();
    while let Some(n) = stack.pop() {
        if live.insert(n) {
            stack.extend(f.body.neighbors_directed(n, Direction::Incoming));
        }
    }
    let dead: Vec<_> = f
        .body
        .node_indices()
        .filter(|n| !live.contains(n) && !matches!(f.body[*n].op, Op::Param { .. }))
        .collect();
    for n in &dead {
        f.body.remove_node(*n);
    }
    dead.len() as u64
}

impl Pass<Module> for Dce {
    fn name(&self) -> &'static str {
        "graph.dce"
    }

    fn run(&mut self, m: &mut Module) -> Result<Vec<(&'static str, u64)>, PassError> {
        let removed = m.functions.iter_mut().map(remove_dead_nodes).sum();
        Ok(vec![("ops removed", removed)])
    }
}
