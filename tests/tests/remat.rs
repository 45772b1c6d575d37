//! Rematerialization (`graph.remat`): what a function keeps and what it
//! computes again changes no result (bit for bit, on the interpreter), and
//! is taken where the cost model says it needs less memory and no more
//! time: a batch-normalization training step's normalized input.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::TargetDesc;
use dlc_driver::{PassOptions, SourceText, compile_source, interpret, prepare_inputs, run_passes};
use dlc_graph::fusion;
use dlc_graph::transforms::rematerialize;
use dlc_graph::transforms::saturate::cost::CostModel;
use dlc_graph::{Function, Op};
use dlc_tests::{BATCHNORM_TRAINING_STEP, example_files, language_reference_examples};

/// The default pipeline without `graph.remat`, priced for one target
/// whatever the machine, and extracting greedily (the same program
/// however long the ILP solver would take).
const BEFORE_REMAT: &str = "graph.canonicalize,graph.saturate{target=x86-64-avx2,extract=greedy},graph.inline,graph.canonicalize,graph.saturate{target=x86-64-avx2,extract=greedy},graph.canonicalize,graph.dce";

fn compiled(name: &str, text: &str) -> dlc_graph::Module {
    let mut m = compile_source(&SourceText {
        name: name.into(),
        text: text.into(),
        weights: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    run_passes(&mut m, BEFORE_REMAT, PassOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    m
}

fn printed(f: &Function) -> String {
    dlc_graph::print_module(&dlc_graph::Module {
        functions: vec![f.clone()],
    })
}

/// Every shipped program's functions that `graph.remat` changes compute
/// exactly what they computed (a copy repeats the same arithmetic on the
/// same values), and it changes some: the training examples'.
#[test]
fn rematerialization_changes_no_result() {
    let mut programs = example_files();
    for (i, text) in language_reference_examples().into_iter().enumerate() {
        programs.push((format!("docs/language.md example {}", i + 1), text));
    }
    let mut changed = Vec::new();
    for (name, text) in programs {
        let kept = compiled(&name, &text);
        let mut again = kept.clone();
        run_passes(
            &mut again,
            "graph.remat{target=x86-64-avx2}",
            PassOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let errors = dlc_graph::verify::verify_module(&again);
        assert!(errors.is_empty(), "{name}: {errors:?}");
        for f in kept.entry_points() {
            let g = again.function(&f.name).unwrap();
            if printed(f) == printed(g) {
                continue;
            }
            changed.push(format!("{name} @{}", f.name));
            let inputs = prepare_inputs(f, &[], Some(3)).unwrap();
            let want = interpret(&kept, f, &inputs).unwrap();
            let got = interpret(&again, g, &inputs).unwrap();
            for (k, (w, g)) in want.iter().zip(&got).enumerate() {
                assert_eq!(w.ty, g.ty, "{name} @{} result {k}", f.name);
                let same = w
                    .data
                    .iter()
                    .zip(&g.data)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{name} @{} result {k} changed", f.name);
            }
        }
    }
    assert!(
        changed.iter().any(|c| c.contains("digits_cnn")),
        "expected the digits CNN's step among {changed:?}"
    );
}

/// The normalized input of each batch normalization, read by its forward
/// pass and by its gradient, is computed again in the backward pass from
/// the centred input (kept anyway): the estimated peak of live memory
/// falls, the estimated time does not rise, and the step computes the same
/// numbers.
#[test]
fn a_batch_normalization_step_keeps_less() {
    let target = TargetDesc::x86_64_avx2(2);
    let model = CostModel::calibrated();
    let kept = compiled("step.dl", BATCHNORM_TRAINING_STEP);
    let before = kept.function("step").unwrap().clone();
    let mut after = before.clone();
    let n = rematerialize(&mut after, &target);
    assert!(n >= 2, "{n} values computed again\n{}", printed(&after));
    let price = |f: &Function| {
        let plan = fusion::plan(f, &target);
        (
            model.planned_cost(f, &plan, &target),
            fusion::memory(f, &plan).peak,
        )
    };
    let (cost0, peak0) = price(&before);
    let (cost1, peak1) = price(&after);
    assert!(
        peak1 < peak0,
        "peak {peak0} -> {peak1} bytes\n{}",
        printed(&after)
    );
    assert!(cost1 <= cost0 * (1.0 + 1e-9), "cost {cost0} -> {cost1} us");
    let barriers = after
        .body
        .node_weights()
        .filter(|n| matches!(n.op, Op::Barrier))
        .count();
    assert!(barriers >= n, "{}", printed(&after));
    let mut again = kept.clone();
    *again
        .functions
        .iter_mut()
        .find(|f| f.name == "step")
        .unwrap() = after.clone();
    let inputs = prepare_inputs(&before, &[], Some(11)).unwrap();
    let want = interpret(&kept, &before, &inputs).unwrap();
    let got = interpret(&again, &after, &inputs).unwrap();
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        let same = w
            .data
            .iter()
            .zip(&g.data)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "result {k} changed");
    }
}

/// The memory model: three products of 1 KiB each, the first read by the
/// second and by the last's epilogue (which writes the result, the
/// caller's buffer): at most the first two are live at once.
#[test]
fn the_memory_model_counts_what_is_live_at_once() {
    let m = dlc_graph::parse_module(
        "graph.func @f(%x: f32[1, 256], %w: f32[256, 256]) -> f32[1, 256] {
  %0 = graph.matmul %x, %w : f32[1, 256]
  %1 = graph.matmul %0, %w : f32[1, 256]
  %2 = graph.matmul %1, %w : f32[1, 256]
  %3 = graph.add %2, %0 : f32[1, 256]
  graph.return %3
}",
    )
    .unwrap();
    let f = &m.functions[0];
    let plan = fusion::plan(f, &TargetDesc::x86_64_avx2(2));
    let memory = fusion::memory(f, &plan);
    assert_eq!(memory.peak, 2048);
    let products: Vec<_> = f
        .topo_order()
        .into_iter()
        .filter(|&n| matches!(f.body[n].op, Op::MatMul))
        .collect();
    let want: std::collections::HashSet<_> = products[..2].iter().copied().collect();
    assert_eq!(memory.at_peak, want);
}

/// `relu`'s gradient reads its result (`r > 0`, the mask `x > 0` gives):
/// in W2's training step the first product's epilogue adds the bias and
/// applies the relu, and only the relu's result is stored for the backward
/// pass, not the pre-activation too.
#[test]
fn a_relu_step_stores_only_the_activation() {
    let m = compiled("w2.dl", &dlc_tests::w2_training_step(8, 16, 32, 4));
    let f = m.function("w2_step").unwrap();
    let plan = fusion::plan(f, &TargetDesc::x86_64_avx2(2));
    let relu = f
        .body
        .node_indices()
        .find(|&n| matches!(f.body[n].op, Op::Unary(dlc_core::scalar::UnaryOp::Relu)))
        .unwrap();
    assert!(
        matches!(plan[&relu], fusion::Plan::EpilogueOf(p) if matches!(f.body[p].op, Op::MatMul)),
        "{:?}\n{}",
        plan[&relu],
        printed(f)
    );
}

/// A user operator's local that its gradient reads is computed once and
/// kept where that is priced cheaper: a row-wise softmax written in index
/// notation reads its row sums (`rowsoft.t0`, an operator of their own that
/// the gradient reads too) instead of summing them again inside its
/// kernel; the loss it computes is the plain loss's.
#[test]
fn a_user_operators_row_sums_are_kept_for_its_gradient() {
    let src = "
op rowsoft[B, N](x: f32[B, N]) -> f32[B, N] {
    let s[b] = sum[k](exp(x[b, k]));
    out[b, n] = exp(x[b, n]) / s[b];
}
fn loss(x: f32[64, 256], weight w: f32[256, 256]) -> f32 {
    let p = rowsoft(x @ w);
    return mean(p * p);
}
fn step(x: f32[64, 256], weight w: f32[256, 256]) -> (f32, f32[256, 256]) {
    return value_and_grad(loss(x, w));
}";
    let m = compiled("rowsoft.dl", src);
    let f = m.function("step").unwrap();
    let named = |n: &dlc_graph::Node, name: &str| matches!(&n.op, Op::Compute(b) if b.name == name);
    let forward = f
        .body
        .node_indices()
        .find(|&n| named(&f.body[n], "rowsoft"))
        .unwrap_or_else(|| panic!("{}", printed(f)));
    let sums = f.operands(forward);
    assert!(
        sums.iter().any(|v| named(&f.body[v.node], "rowsoft.t0")),
        "{}",
        printed(f)
    );
    let sums = sums
        .into_iter()
        .find(|v| named(&f.body[v.node], "rowsoft.t0"))
        .unwrap();
    assert!(
        f.users(sums.node).len() >= 2,
        "read by the gradient too\n{}",
        printed(f)
    );
    let loss = m.function("loss").unwrap();
    let inputs = prepare_inputs(loss, &[], Some(2)).unwrap();
    let want = interpret(&m, loss, &inputs).unwrap();
    let got = interpret(&m, f, &inputs).unwrap();
    assert_eq!(want[0].data, got[0].data);
}
