//! Equality saturation over the project's programs: the graph -> e-graph ->
//! graph conversion is the identity when no rule fires (up to the sharing of
//! repeated subexpressions, which the e-graph merges), and the default
//! pipeline (which saturates) changes no example's results beyond rounding.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_driver::{
    DEFAULT_PIPELINE, PassOptions, SourceText, compile_source, interpret, prepare_inputs,
    run_passes,
};
use dlc_graph::transforms::saturate::cost::CostModel;
use dlc_graph::transforms::saturate::extract::greedy;
use dlc_graph::transforms::saturate::lang::encode;
use dlc_graph::transforms::saturate::rebuild;
use dlc_runtime::HostTensor;
use dlc_tests::{example_files, language_reference_examples};

const EXACT_PIPELINE: &str = "graph.inline,graph.canonicalize,graph.dce";

/// Every program the project ships: the example models and docs/language.md's.
fn programs() -> Vec<(String, String)> {
    let mut all = example_files();
    for (i, text) in language_reference_examples().into_iter().enumerate() {
        all.push((format!("docs/language.md example {}", i + 1), text));
    }
    all
}

fn compiled(name: &str, text: &str, pipeline: &str) -> dlc_graph::Module {
    let mut m = compile_source(&SourceText {
        name: name.into(),
        text: text.into(),
    })
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    run_passes(&mut m, pipeline, PassOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    m
}

#[test]
fn conversion_is_the_identity_when_no_rule_fires() {
    let model = CostModel::calibrated();
    for (name, text) in programs() {
        let m = compiled(&name, &text, EXACT_PIPELINE);
        for f in &m.functions {
            let enc = encode(f).unwrap_or_else(|e| panic!("{name} @{}: {e:?}", f.name));
            let choice = greedy(model, &enc.egraph, &enc.roots);
            let back = rebuild(&enc.egraph, &choice, &enc.roots, f, &enc.origin)
                .unwrap_or_else(|| panic!("{name} @{}: rebuild failed", f.name));
            let one = |g: &dlc_graph::Function| {
                dlc_graph::print_module(&dlc_graph::Module {
                    functions: vec![g.clone()],
                })
            };
            let tensor_classes = enc
                .egraph
                .classes()
                .filter(|c| c.data.ty().is_some())
                .count();
            if tensor_classes == f.body.node_count() {
                assert_eq!(one(&back), one(f), "{name} @{}", f.name);
            } else {
                // Repeated subexpressions are shared: one node per class,
                // and converting again changes nothing.
                assert_eq!(back.body.node_count(), tensor_classes, "{name} @{}", f.name);
                let again = encode(&back).unwrap();
                let choice = greedy(model, &again.egraph, &again.roots);
                let twice =
                    rebuild(&again.egraph, &choice, &again.roots, &back, &again.origin).unwrap();
                assert_eq!(one(&twice), one(&back), "{name} @{}", f.name);
            }
        }
    }
}

/// Equal up to the rounding of reassociated f32 arithmetic.
fn assert_close(what: &str, want: &[HostTensor], got: &[HostTensor]) {
    assert_eq!(want.len(), got.len(), "{what}");
    for (w, g) in want.iter().zip(got) {
        assert_eq!(w.ty, g.ty, "{what}");
        let scale = w.data.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (i, (a, b)) in w.data.iter().zip(&g.data).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * scale || (a.is_nan() && b.is_nan()),
                "{what}: element {i}: {a} before saturation, {b} after"
            );
        }
    }
}

/// The two largest entry points repeat smaller ones at 4x and 8x the work;
/// the interpreter would take most of a minute on them.
const TOO_LARGE_TO_INTERPRET: [&str; 2] = ["gemm_2048", "conv_block_b8"];

#[test]
fn saturation_changes_no_example_result() {
    for (name, text) in programs() {
        let plain = compiled(&name, &text, EXACT_PIPELINE);
        let saturated = compiled(&name, &text, DEFAULT_PIPELINE);
        for f in plain.entry_points() {
            if TOO_LARGE_TO_INTERPRET.contains(&f.name.as_str()) {
                continue;
            }
            // Random inputs stay inside every op's domain (batchnorm
            // variances positive), so every shipped example gives numbers.
            let inputs = prepare_inputs(f, &[], Some(5)).unwrap();
            let g = saturated.function(&f.name).unwrap();
            let want = interpret(&plain, f, &inputs).unwrap();
            assert!(
                want.iter().all(|t| t.data.iter().all(|x| x.is_finite())),
                "{name} @{}: random inputs give NaN or infinite results",
                f.name
            );
            let got = interpret(&saturated, g, &inputs).unwrap();
            assert_close(&format!("{name} @{}", f.name), &want, &got);
        }
    }
}
