//! The graph dialect's text form (which [`crate::parse`] reads back to the
//! same text) and MLIR's generic operation syntax (which `mlir-opt
//! --allow-unregistered-dialect` parses).

use std::collections::HashMap;
use std::fmt::Write;

use dlc_core::{DType, TensorType, format_float};
use petgraph::stable_graph::NodeIndex;

use crate::module::{Function, Module, Value, Visibility};
use crate::ops::{ConstValue, Op};

/// The printed name of each node: `%name` for parameters, `%0, %1, ...` for
/// ops in [`Function::topo_order`].
pub fn node_names(f: &Function) -> HashMap<NodeIndex, String> {
    let mut names = HashMap::new();
    for (name, node) in &f.params {
        names.insert(*node, format!("%{name}"));
    }
    let mut next = 0;
    for node in f.topo_order() {
        names.entry(node).or_insert_with(|| {
            next += 1;
            format!("%{}", next - 1)
        });
    }
    names
}

fn value_name(f: &Function, names: &HashMap<NodeIndex, String>, v: Value) -> String {
    let base = names
        .get(&v.node)
        .cloned()
        .unwrap_or_else(|| "%<invalid>".into());
    let multi = f
        .body
        .node_weight(v.node)
        .is_some_and(|n| n.results.len() > 1);
    if multi {
        format!("{base}#{}", v.result)
    } else {
        base
    }
}

fn types_text(types: &[TensorType]) -> String {
    types
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Prints a whole module.
pub fn print_module(m: &Module) -> String {
    let mut out = String::new();
    for (i, f) in m.functions.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        print_function(f, &mut out);
    }
    out
}

fn print_function(f: &Function, out: &mut String) {
    let names = node_names(f);
    let vis = if f.visibility == Visibility::Private {
        "private "
    } else {
        ""
    };
    let _ = write!(out, "graph.func {vis}@{}(", f.name);
    for (i, (name, node)) in f.params.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let weight = if f.is_weight(i) { "weight " } else { "" };
        let _ = write!(out, "{weight}%{name}: {}", f.body[*node].results[0]);
    }
    let rtypes = f.result_types();
    if rtypes.len() == 1 {
        let _ = writeln!(out, ") -> {} {{", rtypes[0]);
    } else {
        let _ = writeln!(out, ") -> ({}) {{", types_text(&rtypes));
    }
    for node in f.topo_order() {
        let n = &f.body[node];
        if matches!(n.op, Op::Param { .. }) {
            continue;
        }
        let operands: Vec<String> = f
            .operands(node)
            .into_iter()
            .map(|v| value_name(f, &names, v))
            .collect();
        let result = &names[&node];
        let _ = write!(out, "  {result}");
        if n.results.len() != 1 {
            let _ = write!(out, ":{}", n.results.len());
        }
        let _ = write!(out, " = {}", n.op.name());
        match &n.op {
            Op::Call { callee } => {
                let _ = write!(out, " @{callee}({})", operands.join(", "));
            }
            Op::Compute(body) => {
                let _ = write!(out, " {:?}", body.name);
                if !operands.is_empty() {
                    let _ = write!(out, " {}", operands.join(", "));
                }
                out.push_str(" {\n");
                for line in body.lines() {
                    let _ = writeln!(out, "    {line}");
                }
                out.push_str("  }");
            }
            op => {
                if !operands.is_empty() {
                    let _ = write!(out, " {}", operands.join(", "));
                }
                let attrs = op.attrs();
                if !attrs.is_empty() {
                    let items: Vec<String> = attrs
                        .iter()
                        .map(|(k, a)| format!("{k} = {}", a.text()))
                        .collect();
                    let _ = write!(out, " {{{}}}", items.join(", "));
                }
            }
        }
        let _ = writeln!(out, " : {}", types_text(&n.results));
    }
    let results: Vec<String> = f
        .results
        .iter()
        .map(|v| value_name(f, &names, *v))
        .collect();
    let _ = writeln!(out, "  graph.return {}", results.join(", "));
    out.push_str("}\n");
}

fn mlir_element(v: f64, dtype: DType) -> String {
    match dtype {
        DType::Bool => (v != 0.0).to_string(),
        d if d.is_int() => d.signless(v).to_string(),
        _ if v.is_finite() => format_float(v),
        DType::F64 => format!("0x{:016X}", v.to_bits()),
        DType::F32 => format!("0x{:08X}", (v as f32).to_bits()),
        DType::F16 => format!("0x{:04X}", half::f16::from_f64(v).to_bits()),
        DType::BF16 => format!("0x{:04X}", half::bf16::from_f64(v).to_bits()),
        _ => unreachable!("integer types are handled above"),
    }
}

/// Elements as MLIR's dense literal writes them: one bracket level per
/// axis (`[[1, 2], [3, 4]]`), a bare element for a scalar.
fn nested(elems: &[String], shape: &[usize]) -> String {
    match shape.split_first() {
        None => elems.first().cloned().unwrap_or_default(),
        Some((&n, rest)) => {
            let step = rest.iter().product::<usize>().max(1);
            let parts: Vec<String> = (0..n)
                .map(|i| nested(&elems[(i * step).min(elems.len())..], rest))
                .collect();
            format!("[{}]", parts.join(", "))
        }
    }
}

fn mlir_types(types: &[&TensorType]) -> String {
    types
        .iter()
        .map(|t| t.mlir())
        .collect::<Vec<_>>()
        .join(", ")
}

fn mlir_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\0A"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Prints a module in MLIR's generic operation syntax. Every op keeps its
/// dialect name; a function is a `graph.func` op with one region.
pub fn print_mlir_generic(m: &Module) -> String {
    let mut out = String::new();
    for f in &m.functions {
        let names = node_names(f);
        out.push_str("\"graph.func\"() ({\n^bb0(");
        let params: Vec<String> = f
            .params
            .iter()
            .map(|(name, node)| format!("%{name}: {}", f.body[*node].results[0].mlir()))
            .collect();
        out.push_str(&params.join(", "));
        out.push_str("):\n");
        for node in f.topo_order() {
            let n = &f.body[node];
            if matches!(n.op, Op::Param { .. }) {
                continue;
            }
            let operands = f.operands(node);
            let operand_names: Vec<String> =
                operands.iter().map(|v| value_name(f, &names, *v)).collect();
            let operand_types: Vec<&TensorType> =
                operands.iter().map(|v| f.value_type(*v)).collect();
            let mut attrs: Vec<String> = match &n.op {
                Op::Constant(value) => {
                    let t = &n.results[0];
                    let body = match value {
                        ConstValue::Splat(v) => mlir_element(*v, t.dtype),
                        ConstValue::Dense(vs) => {
                            let elems: Vec<String> =
                                vs.iter().map(|v| mlir_element(*v, t.dtype)).collect();
                            nested(&elems, &t.shape)
                        }
                    };
                    vec![format!("value = dense<{body}> : {}", t.mlir())]
                }
                Op::Call { callee } => vec![format!("callee = @{callee}")],
                Op::Compute(body) => vec![
                    format!("body = {}", mlir_string(&body.lines().join("; "))),
                    format!("name = {}", mlir_string(&body.name)),
                ],
                op => op
                    .attrs()
                    .iter()
                    .map(|(k, a)| format!("{k} = {}", a.mlir()))
                    .collect(),
            };
            attrs.sort();
            let _ = write!(out, "  {}", names[&node]);
            if n.results.len() != 1 {
                let _ = write!(out, ":{}", n.results.len());
            }
            let _ = write!(out, " = \"{}\"({})", n.op.name(), operand_names.join(", "));
            if !attrs.is_empty() {
                let _ = write!(out, " {{{}}}", attrs.join(", "));
            }
            let results: Vec<&TensorType> = n.results.iter().collect();
            let _ = writeln!(
                out,
                " : ({}) -> ({})",
                mlir_types(&operand_types),
                mlir_types(&results)
            );
        }
        let results: Vec<String> = f
            .results
            .iter()
            .map(|v| value_name(f, &names, *v))
            .collect();
        let rtypes = f.result_types();
        let rtype_refs: Vec<&TensorType> = rtypes.iter().collect();
        let ptypes = f.param_types();
        let ptype_refs: Vec<&TensorType> = ptypes.iter().collect();
        let _ = writeln!(
            out,
            "  \"graph.return\"({}) : ({}) -> ()",
            results.join(", "),
            mlir_types(&rtype_refs)
        );
        let vis = if f.visibility == Visibility::Private {
            ", sym_visibility = \"private\""
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "}}) {{function_type = ({}) -> ({}), sym_name = {}{vis}}} : () -> ()",
            mlir_types(&ptype_refs),
            mlir_types(&rtype_refs),
            mlir_string(&f.name)
        );
    }
    out
}
