use std::collections::{HashMap, HashSet};

use dlc_core::{Pass, PassError};
use petgraph::stable_graph::NodeIndex;

use crate::module::{Function, Module, Value, Visibility};
use crate::ops::Op;

/// `graph.inline`: replaces every `graph.call` by a copy of the callee's
/// body, then removes private functions nothing calls any more.
pub struct Inline;

/// Calls inlined into one function before the pass gives up; a verified
/// module has no recursion, so this bounds only pathological inputs.
const MAX_INLINES: u64 = 100_000;

fn inline_call(f: &mut Function, call: NodeIndex, callee: &Function) {
    let args = f.operands(call);
    let mut map: HashMap<NodeIndex, NodeIndex> = HashMap::new();
    let mut param_values: HashMap<NodeIndex, Value> = HashMap::new();
    for (i, (_, p)) in callee.params.iter().enumerate() {
        param_values.insert(*p, args[i]);
    }
    let translate = |v: Value, map: &HashMap<NodeIndex, NodeIndex>| -> Value {
        match param_values.get(&v.node) {
            Some(arg) => *arg,
            None => Value {
                node: map[&v.node],
                result: v.result,
            },
        }
    };
    for node in callee.topo_order() {
        let n = &callee.body[node];
        if matches!(n.op, Op::Param { .. }) {
            continue;
        }
        let operands: Vec<Value> = callee
            .operands(node)
            .into_iter()
            .map(|v| translate(v, &map))
            .collect();
        let new = f.add_node(n.op.clone(), &operands, n.results.clone());
        f.body[new].loc = n.loc.clone();
        f.body[new].settled = n.settled;
        map.insert(node, new);
    }
    for (r, v) in callee.results.iter().enumerate() {
        let to = translate(*v, &map);
        f.replace_all_uses(
            Value {
                node: call,
                result: r as u32,
            },
            to,
        );
    }
    f.body.remove_node(call);
}

/// Inlines into `f` every call of a function of `functions` but those
/// `keep` says to keep (and the calls their bodies bring in, likewise).
pub fn inline_into(
    f: &mut Function,
    functions: &[Function],
    keep: &dyn Fn(&Function) -> bool,
) -> Result<(), String> {
    let mut count = 0;
    loop {
        let mut next = None;
        for n in f.body.node_indices() {
            if let Op::Call { callee } = &f.body[n].op {
                let g = functions
                    .iter()
                    .find(|g| g.name == *callee)
                    .ok_or_else(|| format!("call of unknown function @{callee}"))?;
                if !keep(g) {
                    next = Some((n, g));
                    break;
                }
            }
        }
        let Some((node, callee)) = next else {
            return Ok(());
        };
        inline_call(f, node, callee);
        count += 1;
        if count > MAX_INLINES {
            return Err(format!(
                "more than {MAX_INLINES} calls inlined into @{}",
                f.name
            ));
        }
    }
}

impl Pass<Module> for Inline {
    fn name(&self) -> &'static str {
        "graph.inline"
    }

    fn run(&mut self, m: &mut Module) -> Result<Vec<(&'static str, u64)>, PassError> {
        let mut inlined = 0;
        for i in 0..m.functions.len() {
            let mut count = 0;
            loop {
                let f = &m.functions[i];
                let call = f.body.node_indices().find_map(|n| match &f.body[n].op {
                    Op::Call { callee } => Some((n, callee.clone())),
                    _ => None,
                });
                let Some((node, callee)) = call else { break };
                let callee = m
                    .function(&callee)
                    .cloned()
                    .ok_or_else(|| PassError::Failed {
                        pass: self.name().into(),
                        message: format!("call of unknown function @{callee}"),
                    })?;
                inline_call(&mut m.functions[i], node, &callee);
                count += 1;
                if count > MAX_INLINES {
                    return Err(PassError::Failed {
                        pass: self.name().into(),
                        message: format!(
                            "more than {MAX_INLINES} calls inlined into @{}",
                            m.functions[i].name
                        ),
                    });
                }
            }
            inlined += count;
        }
        let called: HashSet<String> = m
            .functions
            .iter()
            .flat_map(|f| f.body.node_weights())
            .filter_map(|n| match &n.op {
                Op::Call { callee } => Some(callee.clone()),
                _ => None,
            })
            .collect();
        let before = m.functions.len();
        m.functions
            .retain(|f| f.visibility == Visibility::Public || called.contains(&f.name));
        Ok(vec![
            ("calls inlined", inlined),
            ("functions removed", (before - m.functions.len()) as u64),
        ])
    }
}
