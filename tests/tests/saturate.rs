//! Equality saturation over the project's programs: the graph -> e-graph ->
//! graph conversion is the identity when no rule fires (up to the sharing of
//! repeated subexpressions, which the e-graph merges, and constants its
//! analysis folds), and the default
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
        weights: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    run_passes(&mut m, pipeline, PassOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    m
}

#[test]
fn conversion_is_the_identity_when_no_rule_fires() {
    let model = CostModel::calibrated();
    let target = dlc_core::TargetDesc::x86_64_avx512(2);
    for (name, text) in programs() {
        let m = compiled(&name, &text, EXACT_PIPELINE);
        for f in &m.functions {
            let enc = encode(f).unwrap_or_else(|e| panic!("{name} @{}: {e:?}", f.name));
            let choice = greedy(model, &target, &enc.egraph, &enc.roots);
            let back = rebuild(&enc.egraph, &choice, &enc.roots, f, &enc.origin)
                .unwrap_or_else(|| panic!("{name} @{}: rebuild failed", f.name));
            let tensor_classes = enc
                .egraph
                .classes()
                .filter(|c| c.data.ty().is_some())
                .count();
            if tensor_classes == f.body.node_count() {
                assert_eq!(printed(&back), printed(f), "{name} @{}", f.name);
            } else {
                // Repeated subexpressions are shared: at most one node per
                // class (fewer where the analysis folded a chain to a
                // constant: a gradient's seed reshaped and sliced to the
                // scalar a checkpoint's barriers wait for), and converting
                // again changes nothing.
                assert!(
                    back.body.node_count() <= tensor_classes,
                    "{name} @{}: {} nodes, {tensor_classes} classes",
                    f.name,
                    back.body.node_count()
                );
                let again = encode(&back).unwrap();
                let choice = greedy(model, &target, &again.egraph, &again.roots);
                let twice =
                    rebuild(&again.egraph, &choice, &again.roots, &back, &again.origin).unwrap();
                assert_eq!(printed(&twice), printed(&back), "{name} @{}", f.name);
            }
        }
    }
}

/// One function's text, as `dlc-opt` prints it.
fn printed(f: &dlc_graph::Function) -> String {
    dlc_graph::print_module(&dlc_graph::Module {
        functions: vec![f.clone()],
    })
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

/// A helper called many times is saturated once, before inlining: its
/// inlined copies are settled, so the caller's saturation does not explore
/// them again (a GRU's steps: the e-graph of the inlined caller stays as
/// large as the caller, where unsettled copies regrow every step's
/// rewrites).
#[test]
fn helpers_are_saturated_once_before_inlining() {
    let src = "
fn step[B](x: f32[B, 16], h: f32[B, 16], w: f32[16, 16], u: f32[16, 16], b: f32[16]) -> f32[B, 16] {
    return tanh(x @ w + h @ u + b) * (h + b) + (x + h) * (x - b);
}
fn f(x: f32[4, 8, 16], weight w: f32[16, 16], weight u: f32[16, 16], weight b: f32[16]) -> f32[8, 16] {
    let h1 = step(reshape(slice(x, axis=0, start=0, end=1), [8, 16]), zeros([8, 16]), w, u, b);
    let h2 = step(reshape(slice(x, axis=0, start=1, end=2), [8, 16]), h1, w, u, b);
    let h3 = step(reshape(slice(x, axis=0, start=2, end=3), [8, 16]), h2, w, u, b);
    return step(reshape(slice(x, axis=0, start=3, end=4), [8, 16]), h3, w, u, b);
}";
    let m = compiled(
        "t.dl",
        src,
        "graph.canonicalize,graph.saturate,graph.inline,graph.canonicalize",
    );
    let f = m.function("f").unwrap();
    assert!(f.body.node_weights().any(|n| n.settled));
    let model = CostModel::calibrated();
    // Limits of iterations and nodes, not of time, so that the sizes
    // compared do not depend on how fast the machine is.
    let options = dlc_graph::transforms::saturate::SaturateOptions {
        time_limit: std::time::Duration::from_secs(600),
        iter_limit: 6,
        node_limit: 5000,
        ..Default::default()
    };
    let settled =
        dlc_graph::transforms::saturate::saturate_function(&mut f.clone(), &options, model)
            .unwrap();
    let mut fresh = f.clone();
    for n in fresh.body.node_weights_mut() {
        n.settled = false;
    }
    let unsettled =
        dlc_graph::transforms::saturate::saturate_function(&mut fresh, &options, model).unwrap();
    assert!(
        settled.nodes * 2 < unsettled.nodes,
        "settled copies grew the e-graph to {} nodes, unsettled ones to {}",
        settled.nodes,
        unsettled.nodes
    );
    same_results_as_without_saturation(src);
}

/// `@f` of `src` gives the same results (up to rounding) through the
/// default pipeline as without saturation.
fn same_results_as_without_saturation(src: &str) {
    let plain = compiled("t.dl", src, EXACT_PIPELINE);
    let saturated = compiled("t.dl", src, DEFAULT_PIPELINE);
    let f = plain.function("f").unwrap();
    let inputs = prepare_inputs(f, &[], Some(3)).unwrap();
    assert_close(
        src,
        &interpret(&plain, f, &inputs).unwrap(),
        &interpret(&saturated, saturated.function("f").unwrap(), &inputs).unwrap(),
    );
}

/// A helper saturated before inlining takes as weights the parameters every
/// call site passes declared weights for, so it folds its batchnorm into
/// them as the inlined caller would (once, for two calls with the same
/// weights); a helper whose call sites differ is saturated again where it
/// is inlined, so the call with weights still folds and the other keeps its
/// batchnorm.
#[test]
fn helpers_take_their_weights_from_their_call_sites() {
    let block = "
fn block[N](x: f32[N, 32, 8, 16], w: f32[32, 32, 3, 3], m: f32[32], v: f32[32], g: f32[32], b: f32[32]) -> f32[N, 32, 8, 16] {
    return relu(batchnorm(conv2d(x, w, padding=1), m, v, g, b, eps=1e-5));
}";
    let count = |m: &dlc_graph::Module, what: &str| {
        dlc_graph::print_module(m)
            .lines()
            .filter(|l| l.contains(what))
            .count()
    };
    let agreeing = format!(
        "{block}
fn f(x: f32[2, 32, 8, 16], weight w: f32[32, 32, 3, 3], weight m: f32[32], weight v: f32[32], weight g: f32[32], weight b: f32[32]) -> f32[2, 32, 8, 16] {{
    return block(block(x, w, m, v, g, b), w, m, v, g, b);
}}"
    );
    let m = compiled("t.dl", &agreeing, DEFAULT_PIPELINE);
    assert_eq!(
        count(&m, "graph.batchnorm"),
        0,
        "{}",
        dlc_graph::print_module(&m)
    );
    assert_eq!(
        count(&m, "graph.mul %w"),
        1,
        "{}",
        dlc_graph::print_module(&m)
    );
    let differing = format!(
        "{block}
fn f(x: f32[2, 32, 8, 16], weight w: f32[32, 32, 3, 3], weight m: f32[32], weight v: f32[32], weight g: f32[32], weight b: f32[32], s: f32[32]) -> f32[2, 32, 8, 16] {{
    return block(block(x, w, m, v, g, b), w, m, v, g * s, b);
}}"
    );
    let m = compiled("t.dl", &differing, DEFAULT_PIPELINE);
    assert_eq!(
        count(&m, "graph.batchnorm"),
        1,
        "{}",
        dlc_graph::print_module(&m)
    );
    same_results_as_without_saturation(&agreeing);
    same_results_as_without_saturation(&differing);
}

/// The search is bounded by work (e-nodes and iterations), not by the
/// clock: on a training step's gradient, whose search runs to its limits
/// of work (thousands of e-nodes), the default options stop before their
/// time limits (safety nets) and give the program that unbounded time
/// gives, so that a compile's result does not depend on how fast or busy
/// the machine is. (With a 50 ms
/// search, the default until it made the object cache's outputs differ
/// between runs, this gradient stopped on the clock.)
#[test]
fn the_default_search_does_not_depend_on_the_clock() {
    use dlc_graph::transforms::saturate::{SaturateOptions, saturate_function};
    use egg::StopReason;
    let src = "
fn mlp(x: f32[16, 64], w1: f32[64, 128], b1: f32[128], w2: f32[128, 32], b2: f32[32]) -> f32[16, 32] {
    return relu(x @ w1 + b1) @ w2 + b2;
}
fn loss(x: f32[16, 64], w1: f32[64, 128], b1: f32[128], w2: f32[128, 32], b2: f32[32], y: f32[16, 32]) -> f32 {
    return mse_loss(mlp(x, w1, b1, w2, b2), y);
}
fn f(x: f32[16, 64], w1: f32[64, 128], b1: f32[128], w2: f32[128, 32], b2: f32[32], y: f32[16, 32]) -> (f32, f32[64, 128], f32[128], f32[128, 32], f32[32]) {
    let (l, g1, c1, g2, c2) = value_and_grad(loss(x, w1, b1, w2, b2, y), wrt=[w1, b1, w2, b2]);
    return (l, sgd(w1, g1, 0.01), sgd(b1, c1, 0.01), sgd(w2, g2, 0.01), sgd(b2, c2, 0.01));
}";
    let m = compiled("t.dl", src, "graph.canonicalize");
    let model = CostModel::calibrated();
    let default = SaturateOptions::default();
    let unbounded = SaturateOptions {
        time_limit: std::time::Duration::from_secs(3600),
        ilp_time_limit: std::time::Duration::from_secs(3600),
        ..SaturateOptions::default()
    };
    let mut grew = false;
    for f in &m.functions {
        let mut a = f.clone();
        let mut b = f.clone();
        let (Some(ra), Some(_)) = (
            saturate_function(&mut a, &default, model),
            saturate_function(&mut b, &unbounded, model),
        ) else {
            continue;
        };
        assert!(
            !matches!(ra.stop, StopReason::TimeLimit(_)),
            "@{}: the default search stopped on the clock after {} iterations, {} e-nodes",
            f.name,
            ra.iterations,
            ra.nodes
        );
        assert_eq!(printed(&a), printed(&b), "@{}", f.name);
        grew |= matches!(
            ra.stop,
            StopReason::NodeLimit(_) | StopReason::IterationLimit(_)
        ) && ra.nodes > 1000;
    }
    assert!(grew, "no function's search reached its limits of work");
}
