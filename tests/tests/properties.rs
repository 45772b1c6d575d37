//! Property tests over generated programs: every generated well-typed
//! program checks, its graph IR round-trips, and the interpreter gives the
//! same results before the default pipeline, after it, and after a trip
//! through the text form. Arbitrary and mutated text never crashes the
//! front end or the IR parser.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_driver::{
    DEFAULT_PIPELINE, DriverError, PassOptions, SourceText, compile_source, interpret, parse_graph,
    prepare_inputs, run_passes, select_entry,
};
use dlc_runtime::HostTensor;
use proptest::prelude::*;

const HEADER: &str = "
op rowsum[M, N](x: f32[M, N]) -> f32[M] {
    out[i] = sum[j](x[i, j]);
}
op shift[N](x: f32[N]) -> f32[N] {
    let h[i] = x[i] * 0.5;
    out[i] = h[i + 1] - h[i];
}
";

/// Builds a well-typed program from a list of choices: each choice appends
/// one `let` applying some operator to values already defined.
fn program(choices: &[u32], tuple: bool) -> String {
    let mut pool: Vec<(String, Vec<usize>)> = vec![
        ("a".into(), vec![4, 6]),
        ("b".into(), vec![6, 4]),
        ("c".into(), vec![6]),
        ("s".into(), vec![]),
    ];
    let mut body = String::new();
    for (n, &c) in choices.iter().enumerate() {
        let (v, shape) = pool[(c as usize / 16) % pool.len()].clone();
        let partner = pool.iter().find(|(w, sh)| *sh == shape && *w != v).cloned();
        let rank = shape.len();
        let (expr, out): (String, Vec<usize>) = match c % 16 {
            0 => (format!("relu({v})"), shape),
            1 => (format!("tanh({v})"), shape),
            2 => (format!("sigmoid({v}) * 1.0"), shape),
            3 => (format!("({v} * 0.5 + 1.0) - 0.0"), shape),
            4 => (format!("-(-{v}) / 1.0"), shape),
            5 if rank == 2 => (format!("transpose({v})"), vec![shape[1], shape[0]]),
            6 if rank >= 1 => {
                let keep = (c >> 8) & 1 == 1;
                let mut s = shape.clone();
                if keep {
                    s[0] = 1
                } else {
                    s.remove(0);
                }
                (format!("sum({v}, axis=0, keepdims={keep})"), s)
            }
            7 if rank == 2 => match pool
                .iter()
                .find(|(_, sh)| sh.len() == 2 && sh[0] == shape[1])
            {
                Some((w, sh)) => (format!("{v} @ {w}"), vec![shape[0], sh[1]]),
                None => (format!("gelu({v})"), shape),
            },
            8 => match partner {
                Some((w, _)) => (
                    ["+", "*", "-"].map(|o| format!("{v} {o} {w}"))[(c as usize >> 8) % 3].clone(),
                    shape,
                ),
                None => (format!("max({v}, 0.25)"), shape),
            },
            9 if rank >= 1 => (format!("softmax({v}, axis=-1)"), shape),
            10 if rank == 2 => (format!("rowsum({v})"), vec![shape[0]]),
            10 if rank == 1 => (format!("shift({v})"), shape),
            11 if rank >= 1 => {
                let dims = shape
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                (format!("reshape(reshape({v}, [-1]), [{dims}])"), shape)
            }
            12 if rank == 2 => (format!("transpose(transpose({v}))"), shape),
            13 => (
                format!(
                    "{v} + full([{}], 0.5) * 2.0",
                    shape
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                shape,
            ),
            14 if rank == 2 => (
                format!("layernorm({v}) + where({v} > 0.0, {v}, 0.0)"),
                shape,
            ),
            _ => (format!("abs({v}) * exp(0.0)"), shape),
        };
        let name = format!("v{n}");
        body.push_str(&format!("    let {name} = {expr};\n"));
        pool.push((name, out));
    }
    let ty = |s: &[usize]| {
        format!(
            "f32[{}]",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let (last, last_shape) = pool.last().cloned().unwrap();
    let (ret_ty, ret) = if tuple {
        let (first, first_shape) = pool[pool.len() / 2].clone();
        (
            format!("({}, {})", ty(&last_shape), ty(&first_shape)),
            format!("({last}, {first})"),
        )
    } else {
        (ty(&last_shape), last)
    };
    format!(
        "{HEADER}\nfn f(a: f32[4, 6], b: f32[6, 4], c: f32[6], s: f32) -> {ret_ty} {{\n{body}    return {ret};\n}}\n"
    )
}

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

fn src(text: &str) -> SourceText {
    SourceText {
        name: "gen.dl".into(),
        text: text.into(),
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

        let mut optimized = module.clone();
        run_passes(&mut optimized, DEFAULT_PIPELINE, PassOptions::default()).unwrap();
        let after = interpret(&optimized, select_entry(&optimized, Some("f")).unwrap(), &inputs).unwrap();
        prop_assert!(same(&before, &after), "default pipeline changed results of\n{}", text);

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
