//! Splitting a function into stages by its results: stage `k` computes the
//! results of group `k` and whatever of them no earlier stage computed,
//! reading the values earlier stages computed as parameters. Running the
//! stages in order computes what the function computes, op for op; a
//! caller can act on a group's results while later stages run
//! (data-parallel training starts the all-reduce of a bucket of gradients
//! as soon as the stage that finishes it returns).

use std::collections::HashMap;

use petgraph::Direction;
use petgraph::graph::NodeIndex;
use petgraph::visit::NodeIndexable;

use crate::{Function, Op, Value, Visibility};

/// One stage of a split function.
#[derive(Debug, Clone)]
pub struct Stage {
    /// `NAME$stageK`, an entry point: the original's parameters, then one
    /// parameter per value of an earlier stage it reads; its group's
    /// results in the group's order, then the values later stages read.
    pub function: Function,
    /// For each parameter after the original's: the stage and the result
    /// of that stage that it is.
    pub carried: Vec<(usize, usize)>,
    /// How many of its results are its group's (the rest are carried).
    pub own: usize,
}

/// Splits `f` into one stage per group of result indices (together, every
/// result once). An op belongs to the first stage whose group needs it; an
/// op without operands (a constant) is copied into each stage that reads
/// it rather than carried.
pub fn split_by_results(f: &Function, groups: &[Vec<usize>]) -> Result<Vec<Stage>, String> {
    let mut seen = vec![false; f.results.len()];
    for &r in groups.iter().flatten() {
        match seen.get_mut(r) {
            Some(s) if !*s => *s = true,
            Some(_) => return Err(format!("result {r} is in two groups")),
            None => return Err(format!("`{}` has no result {r}", f.name)),
        }
    }
    if let Some(r) = seen.iter().position(|s| !s) {
        return Err(format!("result {r} is in no group"));
    }
    let is_param = |n: NodeIndex| matches!(f.body[n].op, Op::Param { .. });
    let copied = |n: NodeIndex| {
        !is_param(n)
            && f.body
                .edges_directed(n, Direction::Incoming)
                .next()
                .is_none()
    };
    // Each op's stage: the first group that needs it.
    let mut stage: Vec<Option<usize>> = vec![None; f.body.node_bound()];
    for (k, group) in groups.iter().enumerate() {
        for &r in group {
            let n = f.results[r].node;
            stage[n.index()] = Some(stage[n.index()].map_or(k, |s| s.min(k)));
        }
    }
    let order = f.topo_order();
    for &n in order.iter().rev() {
        for user in f.users(n) {
            if let Some(s) = stage[user.index()] {
                stage[n.index()] = Some(stage[n.index()].map_or(s, |t| t.min(s)));
            }
        }
    }
    let mut stages: Vec<Stage> = Vec::with_capacity(groups.len());
    // Per stage: the original nodes it holds and their copies.
    let mut maps: Vec<HashMap<NodeIndex, NodeIndex>> = Vec::with_capacity(groups.len());
    for (k, group) in groups.iter().enumerate() {
        let mut g = Function::new(format!("{}$stage{k}", f.name), Visibility::Public);
        g.weights = f.weights.clone();
        let params: Vec<Value> = f
            .params
            .iter()
            .map(|(name, n)| g.add_param(name.clone(), f.body[*n].results[0].clone()))
            .collect();
        let mut map: HashMap<NodeIndex, NodeIndex> = HashMap::new();
        let mut carried_params: HashMap<Value, Value> = HashMap::new();
        let mut carried: Vec<(usize, usize)> = Vec::new();
        // The value `v` of the original as this stage sees it.
        let mut resolve = |v: Value,
                           g: &mut Function,
                           map: &mut HashMap<NodeIndex, NodeIndex>,
                           stages: &mut Vec<Stage>,
                           maps: &[HashMap<NodeIndex, NodeIndex>]|
         -> Result<Value, String> {
            if let Op::Param { index } = f.body[v.node].op {
                return Ok(params[index as usize]);
            }
            if let Some(&n) = map.get(&v.node) {
                return Ok(Value {
                    node: n,
                    result: v.result,
                });
            }
            if copied(v.node) {
                let node = &f.body[v.node];
                let n = g.add_node(node.op.clone(), &[], node.results.clone());
                g.body[n].loc = node.loc.clone();
                map.insert(v.node, n);
                return Ok(Value {
                    node: n,
                    result: v.result,
                });
            }
            if let Some(&p) = carried_params.get(&v) {
                return Ok(p);
            }
            let j = stage[v.node.index()]
                .filter(|&j| j < k)
                .ok_or_else(|| format!("an op of stage {k} reads a value of no earlier stage"))?;
            // A result of stage j from now on.
            let producer = &mut stages[j];
            let at = maps[j]
                .get(&v.node)
                .copied()
                .ok_or_else(|| format!("stage {j} does not hold the value stage {k} reads"))?;
            producer.function.results.push(Value {
                node: at,
                result: v.result,
            });
            carried.push((j, producer.function.results.len() - 1));
            let p = g.add_param(
                format!("__carried{}", carried.len() - 1),
                f.value_type(v).clone(),
            );
            carried_params.insert(v, p);
            Ok(p)
        };
        for &n in &order {
            if stage[n.index()] != Some(k) || is_param(n) || copied(n) {
                continue;
            }
            let operands = f
                .operands(n)
                .into_iter()
                .map(|v| resolve(v, &mut g, &mut map, &mut stages, &maps))
                .collect::<Result<Vec<_>, _>>()?;
            let node = &f.body[n];
            let copy = g.add_node(node.op.clone(), &operands, node.results.clone());
            g.body[copy].loc = node.loc.clone();
            g.body[copy].settled = node.settled;
            map.insert(n, copy);
        }
        for &r in group {
            let v = resolve(f.results[r], &mut g, &mut map, &mut stages, &maps)?;
            g.results.push(v);
        }
        stages.push(Stage {
            own: group.len(),
            function: g,
            carried,
        });
        maps.push(map);
    }
    Ok(stages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::{Tensor, run_function};
    use crate::module::Module;
    use dlc_core::{DType, TensorType};

    /// `((x * w) + 1, sum((x * w) * x), w + 1)`: a value shared by two
    /// groups, a constant read by two stages.
    fn function() -> Module {
        crate::parse::parse_module(
            "graph.func @f(%x: f32[4], %w: f32[4]) -> (f32[4], f32[], f32[4]) {
               %one = graph.constant {value = 1.0} : f32[4]
               %xw = graph.mul %x, %w : f32[4]
               %a = graph.add %xw, %one : f32[4]
               %b0 = graph.mul %xw, %x : f32[4]
               %b = graph.sum %b0 {axes = [0], keepdims = false} : f32[]
               %c = graph.add %w, %one : f32[4]
               graph.return %a, %b, %c
             }",
        )
        .unwrap()
    }

    #[test]
    fn stages_compute_what_the_function_computes() {
        let m = function();
        let f = &m.functions[0];
        let ty = TensorType::new(DType::F32, vec![4]);
        let x = Tensor::from_vec(&ty, vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let w = Tensor::from_vec(&ty, vec![0.5, -1.0, 2.0, 0.25]).unwrap();
        let whole = run_function(&m, "f", &[x.clone(), w.clone()]).unwrap();
        // Group 0: the sum; group 1: the other two.
        let stages = split_by_results(f, &[vec![1], vec![2, 0]]).unwrap();
        assert_eq!(stages.len(), 2);
        // `x * w` is computed by stage 0 and carried to stage 1; the
        // constant is copied, not carried.
        assert_eq!(stages[0].own, 1);
        assert_eq!(stages[0].function.results.len(), 2);
        assert_eq!(stages[1].carried, vec![(0, 1)]);
        let mut staged = Module::default();
        staged
            .functions
            .extend(stages.iter().map(|s| s.function.clone()));
        assert!(crate::verify::verify_module(&staged).is_empty());
        let out0 = run_function(&staged, "f$stage0", &[x.clone(), w.clone()]).unwrap();
        let out1 = run_function(&staged, "f$stage1", &[x, w, out0[1].clone()]).unwrap();
        assert_eq!(out0[0], whole[1]);
        assert_eq!(out1[0], whole[2]);
        assert_eq!(out1[1], whole[0]);
    }

    #[test]
    fn groups_must_cover_each_result_once() {
        let m = function();
        let f = &m.functions[0];
        let e = split_by_results(f, &[vec![0, 1], vec![1, 2]]).unwrap_err();
        assert!(e.contains("result 1 is in two groups"), "{e}");
        let e = split_by_results(f, &[vec![0, 1]]).unwrap_err();
        assert!(e.contains("result 2 is in no group"), "{e}");
        let e = split_by_results(f, &[vec![0, 1, 2, 3]]).unwrap_err();
        assert!(e.contains("no result 3"), "{e}");
    }
}
