//! Equality saturation: every rule's soundness on random shapes and inputs
//! (checked with the reference interpreter), one-line goal tests, and the
//! merges the cost model should and should not pick.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose
#![allow(clippy::too_many_lines)] // each rule's seed terms are one table

use std::collections::HashMap;
use std::time::Duration;

use dlc_core::{DType, TensorType};
use dlc_graph::interp::{Tensor, eval_op, run_function};
use dlc_graph::ops::Op;
use dlc_graph::parse_module;
use dlc_graph::transforms::saturate::cost::CostModel;
use dlc_graph::transforms::saturate::lang::{
    Data, Head, TEGraph, TLang, Tables, TensorAnalysis, decode, reachable,
};
use dlc_graph::transforms::saturate::rules::{self, Rule};
use dlc_graph::transforms::saturate::{SaturateOptions, extract, saturate_function};
use egg::{AstSize, Extractor, Id, Language, RecExpr, Runner};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Terms on which each rule fires, `(param i)` having the i-th shape. In a
/// shape, a letter is a random extent (the same letter, the same extent),
/// a number is itself, and a leading `+` asks for positive inputs.
fn seeds(rule: &str) -> Vec<(&'static str, Vec<&'static str>)> {
    let v = |t: &'static str, s: &[&'static str]| (t, s.to_vec());
    match rule {
        "add-comm" => vec![v("(add (param 0) (param 1))", &["M N", "N"])],
        "mul-comm" => vec![v("(mul (param 0) (param 1))", &["M N", "M 1"])],
        "neg-neg" => vec![v("(unary neg (unary neg (param 0)))", &["M N"])],
        "mul-sigmoid-is-silu" => vec![v("(mul (param 0) (unary sigmoid (param 0)))", &["M N"])],
        "sigmoid-mul-is-silu" => vec![v("(mul (unary sigmoid (param 0)) (param 0))", &["M N"])],
        "add-assoc" => vec![v(
            "(add (add (param 0) (param 1)) (param 2))",
            &["M N", "N", "M 1"],
        )],
        "add-assoc-rev" => vec![v(
            "(add (param 0) (add (param 1) (param 2)))",
            &["M N", "N", "M 1"],
        )],
        "mul-assoc" => vec![v(
            "(mul (mul (param 0) (param 1)) (param 2))",
            &["M N", "N", "M 1"],
        )],
        "mul-assoc-rev" => vec![v(
            "(mul (param 0) (mul (param 1) (param 2)))",
            &["M N", "N", "M 1"],
        )],
        "mul-distrib-add" => {
            vec![v(
                "(mul (param 0) (add (param 1) (param 2)))",
                &["M 1", "M N", "N"],
            )]
        }
        "mul-distrib-add-rev" => vec![v(
            "(add (mul (param 0) (param 1)) (mul (param 0) (param 2)))",
            &["M 1", "M N", "N"],
        )],
        "sub-as-add-neg" => vec![v("(sub (param 0) (param 1))", &["M N", "N"])],
        "sub-as-add-neg-rev" => vec![v("(add (param 0) (unary neg (param 1)))", &["M N", "N"])],
        "transpose-transpose" => vec![
            v(
                "(transpose [1,2,0] (transpose [0,2,1] (param 0)))",
                &["A B C"],
            ),
            v("(transpose [1,0] (transpose [1,0] (param 0)))", &["M N"]),
        ],
        "transpose-unary" => vec![v("(transpose [1,0] (unary tanh (param 0)))", &["M N"])],
        "transpose-unary-rev" => vec![v("(unary tanh (transpose [1,0] (param 0)))", &["M N"])],
        "transpose-add" | "transpose-sub" | "transpose-mul" | "transpose-div" => {
            vec![match rule {
                "transpose-add" => v(
                    "(transpose [1,0] (add (param 0) (param 1)))",
                    &["M N", "1 N"],
                ),
                "transpose-sub" => v(
                    "(transpose [1,0] (sub (param 0) (param 1)))",
                    &["M N", "1 N"],
                ),
                "transpose-mul" => v(
                    "(transpose [1,0] (mul (param 0) (param 1)))",
                    &["M N", "1 N"],
                ),
                _ => v(
                    "(transpose [1,0] (div (param 0) (param 1)))",
                    &["M N", "+1 N"],
                ),
            }]
        }
        "transpose-add-rev" | "transpose-sub-rev" | "transpose-mul-rev" | "transpose-div-rev" => {
            vec![match rule {
                "transpose-add-rev" => v(
                    "(add (transpose [2,0,1] (param 0)) (transpose [2,0,1] (param 1)))",
                    &["A B C", "A 1 C"],
                ),
                "transpose-sub-rev" => v(
                    "(sub (transpose [1,0] (param 0)) (transpose [1,0] (param 1)))",
                    &["M N", "M 1"],
                ),
                "transpose-mul-rev" => v(
                    "(mul (transpose [1,0] (param 0)) (transpose [1,0] (param 1)))",
                    &["M N", "M N"],
                ),
                _ => v(
                    "(div (transpose [1,0] (param 0)) (transpose [1,0] (param 1)))",
                    &["M N", "+M N"],
                ),
            }]
        }
        "transpose-matmul" => vec![
            v(
                "(transpose [0,2,1] (matmul (param 0) (param 1)))",
                &["B M K", "B K N"],
            ),
            v(
                "(transpose [1,0] (matmul (param 0) (param 1)))",
                &["M K", "K N"],
            ),
        ],
        "transpose-matmul-rev" => vec![v(
            "(matmul (transpose [1,0] (param 1)) (transpose [1,0] (param 0)))",
            &["M K", "K N"],
        )],
        "matmul-assoc" => vec![v(
            "(matmul (matmul (param 0) (param 1)) (param 2))",
            &["M K", "K N", "N P"],
        )],
        "matmul-assoc-rev" => vec![v(
            "(matmul (param 0) (matmul (param 1) (param 2)))",
            &["B M K", "B K N", "N P"],
        )],
        "matmul-distrib-right" => vec![v(
            "(matmul (param 0) (add (param 1) (param 2)))",
            &["M K", "K N", "K N"],
        )],
        "matmul-distrib-right-rev" => vec![v(
            "(add (matmul (param 0) (param 1)) (matmul (param 0) (param 2)))",
            &["M K", "K N", "K N"],
        )],
        "matmul-distrib-left" => vec![v(
            "(matmul (add (param 0) (param 1)) (param 2))",
            &["M K", "M K", "K N"],
        )],
        "matmul-distrib-left-rev" => vec![v(
            "(add (matmul (param 0) (param 2)) (matmul (param 1) (param 2)))",
            &["M K", "M K", "K N"],
        )],
        "matmul-mul-scalar" => vec![v(
            "(mul (matmul (param 0) (param 1)) (param 2))",
            &["M K", "K N", ""],
        )],
        "matmul-mul-scalar-rev" => vec![v(
            "(matmul (param 0) (mul (param 1) (param 2)))",
            &["M K", "K N", ""],
        )],
        "matmul-div-scalar" => vec![v(
            "(div (matmul (param 0) (param 1)) (param 2))",
            &["M K", "K N", "+"],
        )],
        "matmul-div-scalar-rev" => vec![v(
            "(matmul (div (param 0) (param 2)) (param 1))",
            &["M K", "K N", "+"],
        )],
        "conv-bilinear-weights" => vec![v(
            "(add (conv2d [1,1] [1,1] 1 (param 0) (param 1)) (conv2d [1,1] [1,1] 1 (param 0) (param 2)))",
            &["N C H W", "O C 3 3", "O C 3 3"],
        )],
        "conv-bilinear-weights-rev" => vec![v(
            "(conv2d [2,1] [1,0] 1 (param 0) (add (param 1) (param 2)))",
            &["N C H W", "O C 1 1", "O C 1 1"],
        )],
        "conv-bilinear-input" => vec![v(
            "(add (conv2d [1,1] [0,1] 1 (param 0) (param 2)) (conv2d [1,1] [0,1] 1 (param 1) (param 2)))",
            &["N C 4 W", "N C 4 W", "O C 3 2"],
        )],
        "conv-bilinear-input-rev" => vec![v(
            "(conv2d [1,1] [1,1] 1 (add (param 0) (param 1)) (param 2))",
            &["N C H W", "N C H W", "O C 3 3"],
        )],
        "conv-batchnorm-fold" => vec![
            v(
                "(batchnorm 1e-5 (conv2d [1,1] [1,1] 1 (param 0) (param 1)) (param 2) (param 3) (param 4) (param 5))",
                &["N C H W", "O C 3 3", "O", "+O", "O", "O"],
            ),
            v(
                "(batchnorm 0.001 (conv2d [1,1] [1,1] 2 (param 0) (param 1)) (param 2) (param 3) (param 4) (param 5))",
                &["N 4 H W", "6 2 3 3", "6", "+6", "6", "6"],
            ),
        ],
        "conv-scale-fold" => vec![
            v(
                "(mul (conv2d [1,1] [1,1] 1 (param 0) (param 1)) (param 2))",
                &["N C H W", "O C 3 3", "O 1 1"],
            ),
            v(
                "(mul (conv2d [1,1] [0,0] 1 (param 0) (param 1)) (param 2))",
                &["N C H W", "O C 1 1", ""],
            ),
        ],
        "conv-input-scale-fold" => vec![
            v(
                "(conv2d [1,1] [0,0] 1 (mul (param 0) (param 1)) (param 2))",
                &["1 C H W", "1 C 1 1", "O C 1 1"],
            ),
            v(
                "(conv2d [2,1] [1,1] 1 (mul (param 0) (param 1)) (param 2))",
                &["1 C H W", "C 1 1", "O C 3 3"],
            ),
            v(
                "(conv2d [1,1] [1,1] 2 (mul (param 0) (param 1)) (param 2))",
                &["N 4 H W", "", "6 2 3 3"],
            ),
        ],
        "conv-input-scale-fold-left" => vec![v(
            "(conv2d [1,1] [0,0] 1 (mul (param 1) (param 0)) (param 2))",
            &["1 C H W", "1 C 1 1", "O C 1 1"],
        )],
        "slice-concat" => vec![
            v(
                "(slice 1 0 2 (concat 1 (param 0) (param 1)))",
                &["M 3", "M 2"],
            ),
            v(
                "(slice 1 3 5 (concat 1 (param 0) (param 1)))",
                &["M 3", "M 2"],
            ),
            v(
                "(slice 0 4 5 (concat 0 (param 0) (param 1)))",
                &["3 N", "2 N"],
            ),
        ],
        "slice-slice" => vec![v("(slice 0 1 3 (slice 0 1 5 (param 0)))", &["6 N"])],
        "slice-whole" => vec![v("(slice 1 0 4 (param 0))", &["M 4"])],
        "concat-adjacent-slices" => vec![v(
            "(concat 0 (slice 0 1 3 (param 0)) (slice 0 3 5 (param 0)))",
            &["6 N"],
        )],
        "concat-unary" => vec![v(
            "(concat 1 (unary relu (param 0)) (unary relu (param 1)))",
            &["M N", "M K"],
        )],
        "concat-unary-rev" => vec![v(
            "(unary sigmoid (concat 1 (param 0) (param 1)))",
            &["M N", "M K"],
        )],
        "concat-add" => vec![v(
            "(concat 0 (add (param 0) (param 1)) (add (param 2) (param 3)))",
            &["M N", "M N", "K N", "K N"],
        )],
        "concat-add-rev" => vec![v(
            "(add (concat 0 (param 0) (param 2)) (concat 0 (param 1) (param 3)))",
            &["M N", "M N", "K N", "K N"],
        )],
        "concat-mul" => vec![v(
            "(concat 1 (mul (param 0) (param 1)) (mul (param 2) (param 3)))",
            &["M N", "M N", "M K", "M K"],
        )],
        "concat-mul-rev" => vec![v(
            "(mul (concat 1 (param 0) (param 2)) (concat 1 (param 1) (param 3)))",
            &["M N", "M N", "M K", "M K"],
        )],
        "slice-unary" => vec![v("(slice 1 1 3 (unary exp (param 0)))", &["M 4"])],
        "slice-unary-rev" => vec![v("(unary exp (slice 1 1 3 (param 0)))", &["M 4"])],
        "merge-matmul-shared-lhs" => vec![v(
            "(concat 1 (matmul (param 0) (param 1)) (matmul (param 0) (param 2)))",
            &["M K", "K N", "K P"],
        )],
        "merge-matmul-shared-rhs" => vec![v(
            "(concat 0 (matmul (param 0) (param 2)) (matmul (param 1) (param 2)))",
            &["M K", "P K", "K N"],
        )],
        "merge-conv-shared-input" => vec![v(
            "(concat 1 (conv2d [1,1] [1,1] 1 (param 0) (param 1)) (conv2d [1,1] [1,1] 1 (param 0) (param 2)))",
            &["N C H W", "O C 3 3", "P C 3 3"],
        )],
        _ => vec![],
    }
}

struct Spec {
    ty: TensorType,
    positive: bool,
}

fn specs(shapes: &[&str], rng: &mut StdRng) -> Vec<Spec> {
    let mut dims: HashMap<String, usize> = HashMap::new();
    shapes
        .iter()
        .map(|s| {
            let positive = s.starts_with('+');
            let shape = s
                .trim_start_matches('+')
                .split_whitespace()
                .map(|d| match d.parse() {
                    Ok(n) => n,
                    Err(_) => *dims
                        .entry(d.to_string())
                        .or_insert_with(|| rng.random_range(1..=4)),
                })
                .collect();
            Spec {
                ty: TensorType::new(DType::F32, shape),
                positive,
            }
        })
        .collect()
}

fn input(spec: &Spec, rng: &mut StdRng) -> Tensor {
    let n = spec.ty.num_elements().unwrap_or(0);
    let values = (0..n)
        .map(|_| {
            if spec.positive {
                rng.random_range(0.5..2.0)
            } else {
                rng.random_range(-1.0..1.0)
            }
        })
        .collect();
    Tensor::from_vec(&spec.ty, values).unwrap()
}

fn egraph_of(term: &str, specs: &[Spec]) -> (TEGraph, Id) {
    let tables = Tables {
        params: specs.iter().map(|s| s.ty.clone()).collect(),
        ..Tables::default()
    };
    let mut eg = TEGraph::new(TensorAnalysis {
        tables,
        ..TensorAnalysis::default()
    });
    let expr: RecExpr<TLang> = term.parse().unwrap();
    let root = eg.add_expr(&expr);
    eg.rebuild();
    (eg, root)
}

/// Evaluates every e-class once (through its smallest term) and then every
/// e-node of it on its children's values: each must equal its class's value.
fn check_classes(eg: &TEGraph, root: Id, inputs: &[Tensor]) -> Result<usize, String> {
    let ex = Extractor::new(eg, AstSize);
    let mut values: HashMap<Id, Tensor> = HashMap::new();
    fn eval_node(
        eg: &TEGraph,
        node: &TLang,
        inputs: &[Tensor],
        child: &mut dyn FnMut(Id) -> Result<Tensor, String>,
        ty: &TensorType,
    ) -> Result<Tensor, String> {
        let get = |c: Id| eg[c].data.clone();
        let (head, operands) = decode(&eg.analysis.tables, node, &get)
            .ok_or_else(|| format!("{node:?} does not decode"))?;
        match head {
            Head::Const(k) => {
                let (cv, ty) = &eg.analysis.tables.consts[k];
                Tensor::from_const(cv, ty).map_err(|e| e.to_string())
            }
            Head::Op(Op::Param { index }) => Ok(inputs[index as usize].clone()),
            Head::Op(op) => {
                let args: Vec<Tensor> = operands
                    .iter()
                    .map(|&o| child(eg.find(o)))
                    .collect::<Result<_, _>>()?;
                let refs: Vec<&Tensor> = args.iter().collect();
                let mut out =
                    eval_op(&op, &refs, std::slice::from_ref(ty)).map_err(|e| e.to_string())?;
                Ok(out.remove(0))
            }
        }
    }
    fn value_of(
        eg: &TEGraph,
        ex: &Extractor<'_, AstSize, TLang, TensorAnalysis>,
        c: Id,
        inputs: &[Tensor],
        values: &mut HashMap<Id, Tensor>,
    ) -> Result<Tensor, String> {
        let c = eg.find(c);
        if let Some(v) = values.get(&c) {
            return Ok(v.clone());
        }
        let ty = eg[c].data.ty().ok_or("not a tensor")?.clone();
        let node = ex.find_best_node(c).clone();
        let v = eval_node(
            eg,
            &node,
            inputs,
            &mut |k| value_of(eg, ex, k, inputs, values),
            &ty,
        )?;
        values.insert(c, v.clone());
        Ok(v)
    }
    let mut checked = 0;
    for c in reachable(eg, &[root]) {
        let Data::Tensor(info) = &eg[c].data else {
            continue;
        };
        let expected = value_of(eg, &ex, c, inputs, &mut values)?;
        for node in &eg[c].nodes {
            let got = eval_node(
                eg,
                node,
                inputs,
                &mut |k| value_of(eg, &ex, k, inputs, &mut values),
                &info.ty,
            )?;
            if got.data.shape() != expected.data.shape() {
                return Err(format!(
                    "{node:?}: shape {:?} != {:?}",
                    got.data.shape(),
                    expected.data.shape()
                ));
            }
            let scale = expected.data.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            for (a, b) in got.data.iter().zip(expected.data.iter()) {
                if (a - b).abs() > 1e-5 * scale {
                    return Err(format!("{node:?} gives {a}, its class {b}"));
                }
            }
            checked += 1;
        }
    }
    Ok(checked)
}

fn all_rules() -> Vec<Rule> {
    rules::tables()
        .into_iter()
        .flat_map(|(_, r, _)| r)
        .collect()
}

#[test]
fn every_rule_is_sound_on_random_shapes_and_inputs() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut failures = Vec::new();
    for rule in all_rules() {
        let name = rule.name.to_string();
        let cases = seeds(&name);
        if cases.is_empty() {
            failures.push(format!("{name}: no soundness seed"));
            continue;
        }
        for (term, shapes) in cases {
            for trial in 0..4 {
                let specs = specs(&shapes, &mut rng);
                let (eg, root) = egraph_of(term, &specs);
                if eg[root].data.ty().is_none() {
                    failures.push(format!("{name}: seed {term} does not type-check ({trial})"));
                    continue;
                }
                let runner = Runner::default()
                    .with_egraph(eg)
                    .with_iter_limit(2)
                    .with_node_limit(2_000)
                    .run(std::slice::from_ref(&rule));
                let applied: usize = runner
                    .iterations
                    .iter()
                    .filter_map(|it| it.applied.get(&rule.name))
                    .sum();
                if applied == 0 {
                    failures.push(format!(
                        "{name}: did not fire on {term} with {:?}",
                        types(&specs)
                    ));
                    continue;
                }
                if runner.egraph.analysis.conflicts > 0 {
                    failures.push(format!(
                        "{name}: merged classes of different types on {term}"
                    ));
                }
                let inputs: Vec<Tensor> = specs.iter().map(|s| input(s, &mut rng)).collect();
                if let Err(e) = check_classes(&runner.egraph, root, &inputs) {
                    failures.push(format!(
                        "{name}: unsound on {term} with {:?}: {e}",
                        types(&specs)
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn types(specs: &[Spec]) -> Vec<String> {
    specs.iter().map(|s| s.ty.to_string()).collect()
}

#[test]
fn every_rule_table_builds_with_distinct_kebab_names() {
    let mut names = std::collections::BTreeSet::new();
    for (table, rules, _) in rules::tables() {
        assert!(rules::TABLES.contains(&table), "{table}");
        for r in rules {
            let n = r.name.to_string();
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{n}"
            );
            assert!(names.insert(n.clone()), "duplicate rule name {n}");
        }
    }
    assert!(names.len() >= 40, "{}", names.len());
}

/// Saturates `start` with every table and says whether `goal` is proved equal.
fn proves(start: &str, goal: &str, shapes: &[&str]) -> bool {
    let mut rng = StdRng::seed_from_u64(1);
    let specs = specs(shapes, &mut rng);
    let (mut eg, a) = egraph_of(start, &specs);
    let b = eg.add_expr(&goal.parse().unwrap());
    eg.rebuild();
    let runner = Runner::default()
        .with_egraph(eg)
        .with_iter_limit(8)
        .with_node_limit(20_000)
        .with_time_limit(Duration::from_secs(5))
        .run(&all_rules());
    runner.egraph.find(a) == runner.egraph.find(b)
}

#[test]
fn goals() {
    let goals: &[(&str, &str, &[&str])] = &[
        (
            "(transpose [1,0] (transpose [1,0] (param 0)))",
            "(param 0)",
            &["3 4"],
        ),
        (
            "(transpose [2,0,1] (transpose [1,2,0] (param 0)))",
            "(param 0)",
            &["2 3 4"],
        ),
        (
            "(transpose [1,0] (matmul (param 0) (param 1)))",
            "(matmul (transpose [1,0] (param 1)) (transpose [1,0] (param 0)))",
            &["3 4", "4 5"],
        ),
        (
            "(matmul (matmul (param 0) (param 1)) (param 2))",
            "(matmul (param 0) (matmul (param 1) (param 2)))",
            &["2 3", "3 4", "4 5"],
        ),
        (
            "(add (matmul (param 0) (param 1)) (matmul (param 0) (param 2)))",
            "(matmul (param 0) (add (param 1) (param 2)))",
            &["2 3", "3 4", "3 4"],
        ),
        (
            "(slice 1 4 7 (concat 1 (param 0) (param 1)))",
            "(slice 1 0 3 (param 1))",
            &["2 4", "2 5"],
        ),
        (
            "(concat 1 (matmul (param 0) (param 1)) (matmul (param 0) (param 2)))",
            "(matmul (param 0) (concat 1 (param 1) (param 2)))",
            &["2 3", "3 4", "3 6"],
        ),
        ("(unary neg (unary neg (param 0)))", "(param 0)", &["5"]),
    ];
    for (start, goal, shapes) in goals {
        assert!(proves(start, goal, shapes), "{start} => {goal}");
    }
    // A goal that does not hold is not proved.
    assert!(!proves(
        "(matmul (param 0) (param 1))",
        "(matmul (param 1) (param 0))",
        &["3 3", "3 3"]
    ));
}

/// Three projections of one input: merged into one product when that is
/// cheaper by the cost model, left alone when not; same results either way.
#[test]
fn three_projections_merge_when_cheaper() {
    for (s, k, n, expect_merged) in [(4096usize, 256usize, 4usize, true), (8, 512, 512, false)] {
        let src = format!(
            "graph.func @proj(%x: f32[{s}, {k}], %wq: f32[{k}, {n}], %wk: f32[{k}, {n}], %wv: f32[{k}, {n}]) -> (f32[{s}, {n}], f32[{s}, {n}], f32[{s}, {n}]) {{\n\
               %q = graph.matmul %x, %wq : f32[{s}, {n}]\n\
               %k = graph.matmul %x, %wk : f32[{s}, {n}]\n\
               %v = graph.matmul %x, %wv : f32[{s}, {n}]\n\
               graph.return %q, %k, %v\n}}\n"
        );
        let (module, opt, report) = saturated(&src);
        let f = &opt.functions[0];
        let matmuls = f.body.node_weights().filter(|n| n.op == Op::MatMul).count();
        assert_eq!(
            matmuls == 1,
            expect_merged,
            "{s}x{k}x{n}: {report:?}\n{opt}"
        );
        assert!(report.cost_after <= report.cost_before);
        assert_same_results(&module, &opt, "proj", 3);
    }
}

/// A fixed cost model, so that the decisions tests expect do not move with
/// the machine's calibration: 100 GFLOP/s, 10 GB/s, 0.02 / 2 ns per fused
/// arithmetic / transcendental op and element, 1 us per kernel.
fn fixed_model() -> CostModel {
    CostModel {
        gemm_gflops: 100.0,
        bandwidth_gbs: 10.0,
        elementwise_ns: 0.02,
        transcendental_ns: 2.0,
        kernel_us: 1.0,
        source: "test".into(),
    }
}

/// The module `src` describes, and it with its first function saturated
/// under [`fixed_model`], with the report.
fn saturated(
    src: &str,
) -> (
    dlc_graph::module::Module,
    dlc_graph::module::Module,
    dlc_graph::transforms::saturate::Report,
) {
    let module = parse_module(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let mut opt = module.clone();
    let report = saturate_function(
        &mut opt.functions[0],
        &SaturateOptions::default(),
        &fixed_model(),
    )
    .unwrap();
    (module, opt, report)
}

/// `name` of `module` and of `opt` agree within 1e-5 of each output's
/// magnitude on random inputs drawn from `seed`.
fn assert_same_results(
    module: &dlc_graph::module::Module,
    opt: &dlc_graph::module::Module,
    name: &str,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let args: Vec<Tensor> = module
        .function(name)
        .unwrap()
        .param_types()
        .iter()
        .map(|t| {
            input(
                &Spec {
                    ty: t.clone(),
                    positive: false,
                },
                &mut rng,
            )
        })
        .collect();
    let want = run_function(module, name, &args).unwrap();
    let got = run_function(opt, name, &args).unwrap();
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        for (a, b) in w.data.iter().zip(g.data.iter()) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                "{name}: {a} vs {b}"
            );
        }
    }
}

/// Squeeze-excite's channel scale before a 1 x 1 projection: folded into
/// the weights where they are fewer than the pixels it would scale (a
/// 96 -> 24 projection over 56 x 56), kept on the input where they are more
/// (1152 -> 192 over 7 x 7), whichever operand of the product comes first,
/// and never for a batch of two images (each would need its own weights).
#[test]
fn a_channel_scale_folds_into_the_smaller_of_weights_and_input() {
    for (n, c, hw, o, expect_folded, scale_first) in [
        (1usize, 96usize, 56usize, 24usize, true, false),
        (1, 96, 56, 24, true, true),
        (1, 1152, 7, 192, false, false),
        (2, 96, 56, 24, false, false),
    ] {
        let product = if scale_first { "%0, %x" } else { "%x, %0" };
        let src = format!(
            "graph.func @se(%x: f32[{n}, {c}, {hw}, {hw}], %s: f32[{n}, {c}, 1, 1], %w: f32[{o}, {c}, 1, 1]) -> f32[{n}, {o}, {hw}, {hw}] {{\n\
               %0 = graph.sigmoid %s : f32[{n}, {c}, 1, 1]\n\
               %1 = graph.mul {product} : f32[{n}, {c}, {hw}, {hw}]\n\
               %2 = graph.conv2d %1, %w {{stride = [1, 1], padding = [0, 0], groups = 1}} : f32[{n}, {o}, {hw}, {hw}]\n\
               graph.return %2\n}}\n"
        );
        let (module, opt, report) = saturated(&src);
        let f = &opt.functions[0];
        let conv = f
            .body
            .node_indices()
            .find(|&i| matches!(f.body[i].op, Op::Conv2d { .. }))
            .unwrap();
        let reads_x_itself = f
            .body
            .neighbors_directed(conv, petgraph::Direction::Incoming)
            .any(|i| matches!(f.body[i].op, Op::Param { index: 0, .. }));
        assert_eq!(
            reads_x_itself, expect_folded,
            "{n}x{c}x{hw}x{hw} -> {o}: {report:?}\n{opt}"
        );
        assert_same_results(&module, &opt, "se", 5);
    }
}

/// A convolution read twice, `c * (c * k + h)` (hardswish's shape): with
/// the convolution rules, `c * k` is also `conv(x, w * k)`, which greedy
/// extraction (a subterm priced at each use) takes, computing the
/// convolution twice; its local search (`improve`) switches `c * k` back to
/// a multiply of the convolution the program computes anyway.
#[test]
fn greedy_extraction_computes_a_value_read_twice_once() {
    let mut rng = StdRng::seed_from_u64(1);
    let specs = specs(&["1 3 64 64", "16 3 3 3", "", ""], &mut rng);
    let term = "(mul (conv2d [2,2] [1,1] 1 (param 0) (param 1)) \
                     (add (mul (conv2d [2,2] [1,1] 1 (param 0) (param 1)) (param 2)) (param 3)))";
    let (eg, root) = egraph_of(term, &specs);
    let runner = Runner::default()
        .with_egraph(eg)
        .with_iter_limit(4)
        .run(&rules::conv());
    let eg = runner.egraph;
    let roots = [eg.find(root)];
    let model = fixed_model();
    let target = SaturateOptions::default().target;
    let convs = |choice: &extract::Choice| {
        extract::used_classes(&eg, choice, &roots)
            .unwrap()
            .iter()
            .filter(|c| matches!(choice[c], TLang::Conv2d(_)))
            .count()
    };
    let greedy = extract::greedy(&model, &target, &eg, &roots);
    assert_eq!(
        convs(&greedy),
        2,
        "the premise: greedy recomputes the convolution"
    );
    let improved = extract::improve(&model, &target, &eg, &roots, &greedy);
    assert_eq!(convs(&improved), 1);
}

/// A product chain's associations, grown to saturation (a fixed search,
/// whatever the machine's speed): more candidates than exact
/// extraction attempts, so the greedy choice stands and the solver is
/// never started on a program it cannot finish within its limit (a training
/// step's e-graphs: 300-11,000 candidates, 35-330 ms of each cold compile
/// for nothing). A small one is solved exactly.
#[test]
fn exact_extraction_is_for_small_programs() {
    use dlc_graph::transforms::saturate::extract::{IlpOutcome, greedy, ilp};
    let mut rng = StdRng::seed_from_u64(3);
    let shapes: Vec<String> = (0..16).map(|i| format!("{} {}", 6 + i, 7 + i)).collect();
    let shapes: Vec<&str> = shapes.iter().map(String::as_str).collect();
    let specs = specs(&shapes, &mut rng);
    // Every association of 16 factors: 120 classes, 680 products.
    let chain = (1..16).fold("(param 0)".to_string(), |acc, i| {
        format!("(matmul {acc} (param {i}))")
    });
    let assoc: Vec<Rule> = rules::matmul()
        .into_iter()
        .filter(|r| r.name.as_str().starts_with("matmul-assoc"))
        .collect();
    let model = CostModel::calibrated();
    let target = dlc_core::TargetDesc::x86_64_avx512(2);
    let outcome = |term: &str, iterations: usize| {
        let (eg, root) = egraph_of(term, &specs);
        let eg = Runner::default()
            .with_egraph(eg)
            .with_iter_limit(iterations)
            .with_node_limit(1_000_000)
            .with_time_limit(Duration::from_secs(600))
            .run(&assoc)
            .egraph;
        let root = eg.find(root);
        let start = greedy(model, &target, &eg, &[root]);
        ilp(model, &target, &eg, &[root], &start, Duration::from_secs(5)).1
    };
    assert_eq!(outcome(&chain, 16), IlpOutcome::TooLarge);
    let short = "(matmul (matmul (param 0) (param 1)) (param 2))";
    assert_eq!(outcome(short, 3), IlpOutcome::Optimal);
}

/// `-(-x) = x` puts a cycle in the e-graph (x's class holds `-(n)`, n's holds
/// `-(x)`): a choice through it is rejected, and exact extraction never
/// returns one.
#[test]
fn extraction_never_chooses_a_cycle() {
    use dlc_graph::transforms::saturate::extract::{Choice, IlpOutcome, greedy, ilp, used_classes};
    let mut rng = StdRng::seed_from_u64(2);
    let specs = specs(&["3 4"], &mut rng);
    let (eg, root) = egraph_of("(unary neg (unary neg (param 0)))", &specs);
    let rule: Vec<Rule> = rules::algebra()
        .into_iter()
        .filter(|r| r.name.as_str() == "neg-neg")
        .collect();
    let runner = Runner::default()
        .with_egraph(eg)
        .with_iter_limit(1)
        .run(&rule);
    let eg = runner.egraph;
    let x = eg.find(root);
    let neg_of = |c: Id| {
        eg[c]
            .nodes
            .iter()
            .find(|n| matches!(n, TLang::Unary(_)))
            .cloned()
    };
    let through = neg_of(x).unwrap();
    let inner = eg.find(*through.children().last().unwrap());
    let mut cyclic = Choice::new();
    cyclic.insert(x, through);
    cyclic.insert(inner, neg_of(inner).unwrap());
    for c in reachable(&eg, &[x]) {
        if let Some(leaf) = eg[c].nodes.iter().find(|n| n.is_leaf()) {
            cyclic.entry(c).or_insert_with(|| leaf.clone());
        }
    }
    assert!(used_classes(&eg, &cyclic, &[x]).is_none());
    let model = CostModel::calibrated();
    let target = dlc_core::TargetDesc::x86_64_avx512(2);
    let start = greedy(model, &target, &eg, &[x]);
    let used = used_classes(&eg, &start, &[x]).unwrap();
    assert_eq!(used, vec![x], "the parameter alone");
    let (choice, outcome) = ilp(model, &target, &eg, &[x], &start, Duration::from_secs(5));
    assert_eq!(outcome, IlpOutcome::Optimal);
    assert!(used_classes(&eg, &choice, &[x]).is_some());
}

/// The function-level cost follows the lowering's own fusion plan (one
/// analysis, `dlc_graph::fusion::plan`): a relu after a pooling or a user
/// operator is its epilogue and costs its arithmetic, not a kernel and a
/// pass over memory (the cost model's old copy of the plan had dropped
/// those epilogues).
#[test]
fn function_cost_prices_the_epilogues_the_lowering_fuses() {
    use dlc_graph::fusion::{Plan, plan};
    let m = parse_module(
        "graph.func @f(%x: f32[8, 64, 56, 56]) -> f32[8, 64, 28, 28] {
  %0 = graph.maxpool2d %x {kernel = [2, 2], stride = [2, 2], padding = [0, 0]} : f32[8, 64, 28, 28]
  %1 = graph.relu %0 : f32[8, 64, 28, 28]
  graph.return %1
}
graph.func @g(%x: f32[8, 64, 56, 56]) -> f32[8, 64, 28, 28] {
  %0 = graph.maxpool2d %x {kernel = [2, 2], stride = [2, 2], padding = [0, 0]} : f32[8, 64, 28, 28]
  graph.return %0
}
",
    )
    .unwrap();
    let (f, g) = (&m.functions[0], &m.functions[1]);
    let target = dlc_core::TargetDesc::x86_64_avx512(2);
    let p = plan(f, &target);
    let pool = f.topo_order()[1];
    assert!(matches!(p[&pool], Plan::WithEpilogue(_)), "{p:?}");
    let model = CostModel::calibrated();
    let (with_relu, alone) = (
        model.function_cost(f, &target),
        model.function_cost(g, &target),
    );
    // The relu adds its arithmetic only: far less than a kernel launch
    // plus a read and a write of 1.6 MB.
    let separate =
        model.kernel_us + 2.0 * 8.0 * 64.0 * 28.0 * 28.0 * 4.0 / (model.bandwidth_gbs * 1e3);
    assert!(
        with_relu - alone < separate / 2.0,
        "relu epilogue priced at {} us, a separate pass at {separate} us",
        with_relu - alone
    );
}

/// The function-level cost reads the plan's kernel groups: attention whose
/// scores and softmax nothing else reads runs as one kernel on a CPU, so it
/// costs two kernel launches, the scores' write and the softmax's read and
/// write less than the same nodes with the scores also returned (no longer
/// one kernel); for a GPU, whose schedules do not fuse it, the two cost the
/// same.
#[test]
fn function_cost_prices_attention_as_one_kernel() {
    let body = "  %0 = graph.transpose %k {perm = [0, 2, 1]} : f32[12, 384, 64]
  %1 = graph.matmul %q, %0 : f32[12, 384, 384]
  %2 = graph.softmax %1 {axis = 2} : f32[12, 384, 384]
  %3 = graph.matmul %2, %v : f32[12, 384, 64]";
    let m = parse_module(&format!(
        "graph.func @fused(%q: f32[12, 384, 64], %k: f32[12, 384, 64], %v: f32[12, 384, 64]) -> f32[12, 384, 64] {{
{body}
  graph.return %3
}}
graph.func @apart(%q: f32[12, 384, 64], %k: f32[12, 384, 64], %v: f32[12, 384, 64]) -> (f32[12, 384, 64], f32[12, 384, 384]) {{
{body}
  graph.return %3, %1
}}
"
    ))
    .unwrap();
    let model = CostModel::calibrated();
    let cpu = dlc_core::TargetDesc::x86_64_avx512(2);
    let cost = |i: usize, t: &dlc_core::TargetDesc| model.function_cost(&m.functions[i], t);
    let scores = 12.0 * 384.0 * 384.0 * 4.0;
    let saved = 2.0 * model.kernel_us + 3.0 * scores / (model.bandwidth_gbs * 1e3);
    let (fused, apart) = (cost(0, &cpu), cost(1, &cpu));
    assert!(
        ((apart - fused) / saved - 1.0).abs() < 1e-9,
        "one kernel saves {} us, expected {saved} us",
        apart - fused
    );
    let gpu = dlc_core::TargetDesc::sm_90();
    assert_eq!(cost(0, &gpu), cost(1, &gpu));
}

/// A user operator is priced as graph -> loop lowers it: a contraction
/// in index notation (`a[k, i] * b[k, j]`, Aᵀ·B) as the product it
/// becomes, within a quarter of the built-in `transpose(a) @ b`; a
/// gathered operand adds its copy; a sum that is not a product as scalar
/// loops, one op per element and step. (All three were priced as one pass
/// over their operands, less than a tenth of the product's arithmetic.)
#[test]
fn user_operators_are_priced_as_what_they_lower_to() {
    let m = parse_module(
        "graph.func @f(%a: f32[512, 256], %b: f32[512, 128]) -> f32[256, 128] {
  %0 = graph.compute \"mm\" %a, %b {
    out[d0, d1] = sum[d2 in 0..512](in0[d2, d0] * in1[d2, d1])
  } : f32[256, 128]
  graph.return %0
}
graph.func @g(%a: f32[512, 256], %b: f32[512, 128]) -> f32[256, 128] {
  %0 = graph.compute \"ss\" %a, %b {
    out[d0, d1] = sum[d2 in 0..512](in0[d2, d0] + in1[d2, d1])
  } : f32[256, 128]
  graph.return %0
}
graph.func @h(%a: f32[512, 256], %b: f32[512, 128]) -> f32[256, 128] {
  %0 = graph.transpose %a {perm = [1, 0]} : f32[256, 512]
  %1 = graph.matmul %0, %b : f32[256, 128]
  graph.return %1
}
graph.func @w(%a: f32[512, 256], %b: f32[512, 128]) -> f32[256, 128] {
  %0 = graph.compute \"padded\" %a, %b {
    out[d0, d1] = sum[d2 in 0..512](in0[d2, d0] * in1[d2 - 1, d1])
  } : f32[256, 128]
  graph.return %0
}
",
    )
    .unwrap();
    let target = dlc_core::TargetDesc::x86_64_avx512(2);
    let model = CostModel::calibrated();
    let cost = |i: usize| model.function_cost(&m.functions[i], &target);
    let (user, sum_of_sums, builtin) = (cost(0), cost(1), cost(2));
    let flops_us = 2.0 * 256.0 * 128.0 * 512.0 / (model.gemm_gflops * 1e3);
    assert!(user >= flops_us, "{user} us < the product's {flops_us} us");
    assert!(
        (user / builtin - 1.0).abs() < 0.25,
        "user operator {user} us, built-in product {builtin} us"
    );
    let scalar_us = 256.0 * 128.0 * 512.0 * model.elementwise_ns * 1e-3;
    assert!(
        sum_of_sums >= scalar_us,
        "{sum_of_sums} us < {scalar_us} us of scalar loops"
    );
    // `in1[d2 - 1, d1]` reads a row past the edge (zero there): `b` is
    // gathered into a copy, written and read once (512 x 128 f32s).
    let padded = cost(3);
    let copy_us = 2.0 * 512.0 * 128.0 * 4.0 / (model.bandwidth_gbs * 1e3);
    assert!(
        (padded - user - copy_us).abs() < 0.05 * copy_us,
        "gathered {padded} us, in place {user} us, the copy {copy_us} us"
    );
}

/// The kernel plan's groups: attention (a product of a softmax of a
/// product, the scores scaled in the first product's epilogue) is one
/// group, named by its nodes; a softmax of a parameter, or of a sum, is
/// not.
#[test]
fn attention_is_a_kernel_group_of_the_plan() {
    use dlc_graph::fusion::{KernelGroup, kernel_groups, plan};
    let m = parse_module(
        "graph.func @a(%q: f32[12, 384, 64], %k: f32[12, 384, 64], %v: f32[12, 384, 64]) -> f32[12, 384, 64] {
  %0 = graph.transpose %k {perm = [0, 2, 1]} : f32[12, 64, 384]
  %1 = graph.matmul %q, %0 : f32[12, 384, 384]
  %2 = graph.constant {value = 8.0} : f32[]
  %3 = graph.div %1, %2 : f32[12, 384, 384]
  %4 = graph.softmax %3 {axis = 2} : f32[12, 384, 384]
  %5 = graph.matmul %4, %v : f32[12, 384, 64]
  graph.return %5
}
graph.func @b(%s: f32[12, 384, 384], %v: f32[12, 384, 64]) -> f32[12, 384, 64] {
  %0 = graph.softmax %s {axis = 2} : f32[12, 384, 384]
  %1 = graph.matmul %0, %v : f32[12, 384, 64]
  graph.return %1
}
graph.func @c(%s: f32[12, 384, 384], %t: f32[12, 384, 384], %v: f32[12, 384, 64]) -> f32[12, 384, 64] {
  %0 = graph.add %s, %t : f32[12, 384, 384]
  %1 = graph.softmax %0 {axis = 2} : f32[12, 384, 384]
  %2 = graph.matmul %1, %v : f32[12, 384, 64]
  graph.return %2
}
",
    )
    .unwrap();
    let target = dlc_core::TargetDesc::x86_64_avx512(2);
    let groups = |i: usize| {
        let f = &m.functions[i];
        kernel_groups(f, &plan(f, &target))
    };
    let f = &m.functions[0];
    let order = f.topo_order();
    let node = |name: &str| {
        *order
            .iter()
            .find(|&&n| f.body[n].op.name() == format!("graph.{name}"))
            .unwrap()
    };
    let products: Vec<_> = order
        .iter()
        .copied()
        .filter(|&n| f.body[n].op.name() == "graph.matmul")
        .collect();
    assert_eq!(
        groups(0),
        vec![KernelGroup::Attention {
            scores: products[0],
            read: node("div"),
            softmax: node("softmax"),
            output: products[1],
        }]
    );
    assert_eq!(groups(1), vec![]);
    assert_eq!(groups(2), vec![]);
}
