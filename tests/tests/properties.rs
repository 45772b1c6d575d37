//! Property tests over generated programs: every generated well-typed
//! program checks, its graph IR round-trips, and the interpreter gives the
//! same results before and after the exact passes (bit for bit), after the
//! default pipeline (whose equality saturation reassociates floating-point
//! arithmetic, so within rounding), and after a trip through the text form. Arbitrary and mutated text never crashes the
//! front end or the IR parser.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_driver::{
    DEFAULT_PIPELINE, DriverError, PassOptions, SourceText, compile_source, interpret, parse_graph,
    prepare_inputs, run_passes, select_entry,
};
use dlc_runtime::HostTensor;
use dlc_tests::generated_program as program;
use proptest::prelude::*;

fn same(a: &[HostTensor], b: &[HostTensor]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.ty == y.ty
                && x.data
                    .iter()
                    .zip(&y.data)
                    .all(|(p, q)| p == q || (p.is_nan() && q.is_nan()))
        })
}

/// The passes that never change a result, not even its rounding.
const EXACT_PIPELINE: &str = "graph.inline,graph.canonicalize,graph.dce";

/// Equal up to the rounding of reassociated f32 arithmetic: within 1e-5 of
/// the largest magnitude of the reference tensor.
fn close(a: &[HostTensor], b: &[HostTensor]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            let scale = x
                .data
                .iter()
                .filter(|v| v.is_finite())
                .fold(1.0f64, |m, v| m.max(v.abs()));
            x.ty == y.ty
                && x.data.iter().zip(&y.data).all(|(p, q)| {
                    p == q || (p.is_nan() && q.is_nan()) || (p - q).abs() <= 1e-5 * scale
                })
        })
}

fn src(text: &str) -> SourceText {
    SourceText {
        name: "gen.dl".into(),
        text: text.into(),
        weights: Vec::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    #[test]
    fn generated_programs_round_trip_and_agree(choices in prop::collection::vec(any::<u32>(), 1..14), tuple in any::<bool>(), seed in 0u64..1000) {
        let text = program(&choices, tuple);
        let module = compile_source(&src(&text)).unwrap_or_else(|e| panic!("generated program must check:\n{text}\n{e}"));
        let printed = dlc_graph::print_module(&module);
        let reparsed = parse_graph(&src(&printed)).unwrap_or_else(|e| panic!("{e}\n{printed}"));
        prop_assert_eq!(dlc_graph::print_module(&reparsed), printed.clone());

        let f = select_entry(&module, Some("f")).unwrap();
        let inputs = prepare_inputs(f, &[], Some(seed)).unwrap();
        let before = interpret(&module, f, &inputs).unwrap();

        let mut exact = module.clone();
        run_passes(&mut exact, EXACT_PIPELINE, PassOptions::default()).unwrap();
        let after_exact = interpret(&exact, select_entry(&exact, Some("f")).unwrap(), &inputs).unwrap();
        prop_assert!(same(&before, &after_exact), "exact passes changed results of\n{}", text);

        let mut optimized = module.clone();
        run_passes(&mut optimized, DEFAULT_PIPELINE, PassOptions::default()).unwrap();
        let after = interpret(&optimized, select_entry(&optimized, Some("f")).unwrap(), &inputs).unwrap();
        prop_assert!(close(&before, &after), "default pipeline changed results of\n{}", text);

        let text2 = dlc_graph::print_module(&optimized);
        let reread = parse_graph(&src(&text2)).unwrap();
        let again = interpret(&reread, select_entry(&reread, Some("f")).unwrap(), &inputs).unwrap();
        prop_assert!(same(&after, &again), "text round trip changed results of\n{}", text2);
    }

    #[test]
    fn arbitrary_text_never_crashes_the_front_end(text in "\\PC{0,200}") {
        match compile_source(&src(&text)) {
            Ok(_) | Err(DriverError::Source(_)) => {}
            Err(e) => prop_assert!(false, "unexpected failure kind: {e}"),
        }
    }

    #[test]
    fn mutated_programs_never_crash_the_front_end(choices in prop::collection::vec(any::<u32>(), 1..6), at in any::<prop::sample::Index>(), len in 0usize..12, insert in "[-+*/@()\\[\\]{},;:=a-z0-9. ]{0,8}") {
        let text = program(&choices, false);
        let start = at.index(text.len());
        let end = (start + len).min(text.len());
        let mutated = format!("{}{}{}", &text[..start], insert, &text[end..]);
        match compile_source(&src(&mutated)) {
            Ok(_) | Err(DriverError::Source(_)) => {}
            Err(e) => prop_assert!(false, "unexpected failure kind: {e}"),
        }
    }

    #[test]
    fn mutated_ir_never_crashes_the_parser(choices in prop::collection::vec(any::<u32>(), 1..6), at in any::<prop::sample::Index>(), len in 0usize..12, insert in "[-+*/%#@(){}\\[\\],:=a-z0-9. ]{0,8}") {
        let module = compile_source(&src(&program(&choices, false))).unwrap();
        let text = dlc_graph::print_module(&module);
        let start = at.index(text.len());
        let end = (start + len).min(text.len());
        let mutated = format!("{}{}{}", &text[..start], insert, &text[end..]);
        match parse_graph(&src(&mutated)) {
            Ok(mut m) => {
                // Whatever parses and verifies must also survive the passes.
                run_passes(&mut m, DEFAULT_PIPELINE, PassOptions::default()).unwrap();
            }
            Err(DriverError::IrSyntax { .. } | DriverError::Pass(_)) => {}
            Err(e) => prop_assert!(false, "unexpected failure kind: {e}"),
        }
    }
}

#[test]
fn the_generator_covers_many_operators() {
    let choices: Vec<u32> = (0..64).map(|i| i * 17 + (i % 3) * 256).collect();
    let text = program(&choices, true);
    for op in [
        "relu(",
        "transpose(",
        "sum(",
        " @ ",
        "softmax(",
        "rowsum(",
        "shift(",
        "reshape(",
        "layernorm(",
        "full(",
    ] {
        assert!(text.contains(op), "generator never used {op}:\n{text}");
    }
    compile_source(&src(&text)).unwrap_or_else(|e| panic!("{e}\n{text}"));
}
