//! `dlc-opt` end to end: pipelines, printing options and errors.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn dlc_opt(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlc-opt"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const SRC: &str =
    "fn f(x: f32[4, 8]) -> f32[4, 8] {\n    return transpose(transpose(x)) * 1.0;\n}\n";

#[test]
fn reads_source_and_ir_from_stdin() {
    let o = dlc_opt(&["-"], SRC);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let ir = text(&o.stdout);
    assert!(ir.contains("graph.transpose"), "{ir}");
    let again = dlc_opt(&["-"], &ir);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), ir);
}

#[test]
fn passes_stats_timing_and_print_after_all() {
    let o = dlc_opt(
        &[
            "-",
            "--passes",
            "graph.canonicalize,graph.dce",
            "--print-after-all",
            "--stats",
            "-T",
        ],
        SRC,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "graph.func @f(%x: f32[4, 8]) -> f32[4, 8] {\n  graph.return %x\n}\n"
    );
    let err = text(&o.stderr);
    assert!(
        err.contains("// -----// IR after graph.canonicalize //----- //"),
        "{err}"
    );
    assert!(
        err.contains("// -----// IR after graph.dce //----- //"),
        "{err}"
    );
    assert!(
        err.contains("graph.canonicalize - identities applied"),
        "{err}"
    );
    assert!(
        err.contains("ms  graph.dce") && err.contains("ms  total"),
        "{err}"
    );
}

#[test]
fn mlir_generic_output() {
    let o = dlc_opt(&["-", "--mlir-generic"], SRC);
    assert!(o.status.success());
    let out = text(&o.stdout);
    assert!(
        out.starts_with("\"graph.func\"() ({\n^bb0(%x: tensor<4x8xf32>):"),
        "{out}"
    );
    assert!(
        out.contains("\"graph.transpose\"(%x) {perm = array<i64: 1, 0>}"),
        "{out}"
    );
}

#[test]
fn errors_exit_non_zero_with_locations() {
    let o = dlc_opt(&["-", "--passes", "graph.nope"], SRC);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("unknown pass `graph.nope`"));
    let o = dlc_opt(&["-", "--passes", "graph.dce{"], SRC);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("bad pipeline at column 11"),
        "{}",
        text(&o.stderr)
    );
    let o = dlc_opt(
        &["-"],
        "graph.func @f(%x: f32[4]) -> f32[4] {\n  %0 = graph.relu %y : f32[4]\n  graph.return %0\n}\n",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("<stdin>:2:19: `%y` is not defined before this use"),
        "{}",
        text(&o.stderr)
    );
    let o = dlc_opt(
        &["-"],
        "graph.func @f(%x: f32[4]) -> f32[4] {\n  %0 = graph.relu %x : f32[5]\n  graph.return %0\n}\n",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("returned types differ"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn lowers_to_loops_and_reads_loop_ir_back() {
    let o = dlc_opt(
        &["-", "--passes", "graph.canonicalize,convert-graph-to-loop"],
        SRC,
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let loops = text(&o.stdout);
    assert!(
        loops.starts_with("loop.func @f(%x: buffer<f32[4, 8]>, out %out0: buffer<f32[4, 8]>)"),
        "{loops}"
    );
    let again = dlc_opt(&["-"], &loops);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), loops);
    let o = dlc_opt(&["-", "--passes", "graph.dce"], &loops);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("pass `graph.dce` failed: expects graph IR, got loop IR"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn lists_passes() {
    let o = dlc_opt(&["--list-passes"], "");
    assert!(o.status.success());
    let out = text(&o.stdout);
    for p in [
        "graph.canonicalize",
        "graph.dce",
        "graph.inline",
        "convert-graph-to-loop",
        "convert-loop-to-tile",
        "tile.reuse-packs",
        "tile.tensor-cores",
        "tile.insert-barriers",
        "tile.split-prepare",
        "tile.dce",
    ] {
        assert!(out.contains(p), "{out}");
    }
}
