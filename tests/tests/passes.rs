//! File-driven pass tests. Each `passes/*.test` file starts with
//! `// RUN: PIPELINE` and holds its input (dlc source, graph or loop IR); the
//! output (the IR after the pipeline, or the error) is an insta snapshot
//! beside this file. `cargo insta review` is the review of a change.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_driver::{PassOptions, SourceText, load_ir, run_pipeline};

fn run_case(text: &str, name: &str) -> String {
    let pipeline = text
        .lines()
        .find_map(|l| l.strip_prefix("// RUN:"))
        .unwrap_or_else(|| panic!("{name}: the first line must be `// RUN: PIPELINE`"))
        .trim();
    let src = SourceText {
        name: name.to_string(),
        text: text.to_string(),
        weights: Vec::new(),
    };
    let result = load_ir(&src).and_then(|mut ir| {
        run_pipeline(&mut ir, pipeline, PassOptions::default())?;
        Ok(ir.print())
    });
    match result {
        Ok(ir) => ir,
        Err(e) => format!("ERROR:\n{e}"),
    }
}

#[test]
fn pass_files() {
    insta::glob!("passes/*.test", |path| {
        let text = std::fs::read_to_string(path).expect("test file is readable");
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        insta::assert_snapshot!(run_case(&text, &name));
    });
}

#[test]
fn every_case_has_a_pipeline_header() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/passes");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).expect("tests/passes exists") {
        let path = entry.expect("readable entry").path();
        let text = std::fs::read_to_string(&path).expect("readable file");
        assert!(
            text.starts_with("// RUN:"),
            "{} lacks its `// RUN:` header",
            path.display()
        );
        count += 1;
    }
    assert!(count >= 10, "expected the pass test files, found {count}");
}
