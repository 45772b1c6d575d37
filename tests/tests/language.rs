//! Every code example of the language reference, and every example model,
//! checks; its graph IR round-trips through the text form (before and after
//! the default pipeline); and its `--mlir-generic` form parses with MLIR.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_driver::{
    DEFAULT_PIPELINE, PassOptions, SourceText, compile_source, parse_graph, run_passes,
};
use dlc_tests::{example_files, language_reference_examples, mlir_opt, mlir_parses};

fn source(name: &str, text: &str) -> SourceText {
    SourceText {
        name: name.to_string(),
        text: text.to_string(),
        weights: Vec::new(),
    }
}

fn assert_round_trips(name: &str, module: &dlc_graph::Module) {
    let printed = dlc_graph::print_module(module);
    let reparsed = parse_graph(&source(name, &printed))
        .unwrap_or_else(|e| panic!("{name}: printed IR does not parse back:\n{e}\n{printed}"));
    assert_eq!(
        dlc_graph::print_module(&reparsed),
        printed,
        "{name}: print-parse-print differs"
    );
}

fn check_program(name: &str, text: &str, mlir: Option<&std::path::Path>) {
    let mut module =
        compile_source(&source(name, text)).unwrap_or_else(|e| panic!("{name} must check:\n{e}"));
    assert!(module.entry_points().count() > 0, "{name}: no entry point");
    assert_round_trips(name, &module);
    if let Some(tool) = mlir {
        let generic = dlc_graph::print_mlir_generic(&module);
        if let Err(e) = mlir_parses(tool, &generic) {
            panic!("{name}: MLIR rejects the generic form:\n{e}\n{generic}");
        }
    }
    run_passes(&mut module, DEFAULT_PIPELINE, PassOptions::default())
        .unwrap_or_else(|e| panic!("{name}: default pipeline failed: {e}"));
    assert!(
        module
            .functions
            .iter()
            .all(|f| f.visibility == dlc_graph::Visibility::Public),
        "{name}: graph.inline left helper functions behind"
    );
    assert_round_trips(name, &module);
}

#[test]
fn language_reference_examples_check_and_round_trip() {
    let examples = language_reference_examples();
    assert!(
        examples.len() >= 4,
        "expected the reference's four code examples, found {}",
        examples.len()
    );
    let tool = mlir_opt();
    for (i, text) in examples.iter().enumerate() {
        check_program(
            &format!("docs/language.md example {}", i + 1),
            text,
            tool.as_deref(),
        );
    }
}

#[test]
fn example_models_check_and_round_trip() {
    let files = example_files();
    for w in [
        "w1_gemm",
        "w2_mlp",
        "w3_conv_block",
        "w4_attention",
        "w5_layernorm_gelu",
        "w6_bert_layer",
        "w7_gru",
        "w8_gcn",
    ] {
        assert!(
            files.iter().any(|(p, _)| p.contains(w)),
            "examples/ lacks workload {w}"
        );
    }
    let tool = mlir_opt();
    for (path, text) in &files {
        check_program(path, text, tool.as_deref());
    }
}

#[test]
fn examples_hold_every_reference_example() {
    let files = example_files();
    for example in language_reference_examples() {
        assert!(
            files.iter().any(|(_, text)| text.contains(example.trim())),
            "examples/ has no copy of this docs/language.md example:\n{example}"
        );
    }
}

/// The repository stands alone: no file of it may refer to anything beside
/// it (a user's clone has nothing there). The needle is built at run time so
/// that this file does not match itself.
#[test]
fn no_file_refers_outside_the_repository() {
    let needle = format!("..{}shared", '/');
    let root = dlc_tests::repo_root();
    let files = dlc_tests::repository_files();
    assert!(
        files.iter().any(|p| p.ends_with("Cargo.toml")),
        "the repository's file list is empty"
    );
    let offenders: Vec<String> = files
        .iter()
        .filter(|p| {
            std::fs::read(root.join(p))
                .is_ok_and(|bytes| String::from_utf8_lossy(&bytes).contains(&needle))
        })
        .cloned()
        .collect();
    assert!(
        offenders.is_empty(),
        "these files refer to `{needle}`, which a clone does not have: {offenders:?}"
    );
}
