//! The loop dialect's text form (the IR core's generic one,
//! [`dlc_core::ir::print`], read back by [`crate::parse`] to the same text)
//! and MLIR's generic operation syntax (which `mlir-opt
//! --allow-unregistered-dialect` parses), derived from the op declarations
//! in [`crate::ops`]: each function is a `"loop.func"` op with one region,
//! buffers are `memref`s, and an index list is an `affine_map` attribute.

use std::fmt::Write;

use dlc_core::Namer;

use crate::ir::{Block, Function, IndexExpr, Module, OpId, Value};
use crate::ops::{MATMUL_COUNTERS, Operands};

/// An index with `var` naming each index value (MLIR's affine syntax when
/// `mlir`).
fn affine_text(e: &IndexExpr, var: impl Fn(Value) -> String, mlir: bool) -> String {
    e.text(var, |k| format!("#{k}"), mlir)
}

/// Prints a module in the text form (the IR core's, [`dlc_core::ir::print`]).
pub fn print_module(m: &Module) -> String {
    dlc_core::ir::print::print_module(m)
}

/// The `affine_map` of an index list over the given dimensions.
fn affine_map_over(dims: &[Value], index: &[IndexExpr]) -> String {
    let dim_name = |v: Value| format!("d{}", dims.iter().position(|d| *d == v).unwrap_or(0));
    let results: Vec<String> = index
        .iter()
        .map(|e| affine_text(e, dim_name, true))
        .collect();
    let params: Vec<String> = (0..dims.len()).map(|i| format!("d{i}")).collect();
    format!(
        "affine_map<({}) -> ({})>",
        params.join(", "),
        results.join(", ")
    )
}

/// `dims` followed by the index values the lists use that are not among
/// them, each once.
fn index_dims(mut dims: Vec<Value>, lists: &[&[IndexExpr]]) -> Vec<Value> {
    for e in lists.iter().flat_map(|l| l.iter()) {
        for (_, v) in &e.terms {
            if !dims.contains(v) {
                dims.push(*v);
            }
        }
    }
    dims
}

/// Prints a module in MLIR's generic operation syntax: each function is a
/// `"loop.func"` op with one region, buffers are `memref`s, and an index
/// list is an `affine_map` attribute over the index values it uses
/// (appended to the operands); a `loop.matmul`'s maps (`a_map`, `b_map`)
/// are over its counters, then the outside index values.
pub fn print_mlir_generic(m: &Module) -> String {
    let mut out = String::new();
    for f in &m.functions {
        let mut namer = Namer::new(f.params.iter().map(|(n, v)| (n, *v)));
        let params: Vec<String> = f
            .params
            .iter()
            .map(|(n, v)| format!("%{n}: {}", f.ty(*v).mlir()))
            .collect();
        let _ = writeln!(out, "\"loop.func\"() ({{\n^bb0({}):", params.join(", "));
        mlir_block(f, &f.body, &mut namer, 1, &mut out);
        let types: Vec<String> = f.params.iter().map(|(_, v)| f.ty(*v).mlir()).collect();
        let _ = writeln!(
            out,
            "}}) {{dlc.outputs = {} : i64, function_type = ({}) -> (), sym_name = \"{}\"}} : () -> ()",
            f.outputs,
            types.join(", "),
            f.name
        );
    }
    out
}

fn mlir_block(f: &Function, b: &Block, namer: &mut Namer<Value>, depth: usize, out: &mut String) {
    for &id in &b.ops {
        mlir_op(f, id, namer, depth, out);
    }
}

fn mlir_op(f: &Function, id: OpId, namer: &mut Namer<Value>, depth: usize, out: &mut String) {
    let op = f.op(id);
    let pad = "  ".repeat(depth);
    let results = match op.results.len() {
        0 => String::new(),
        1 => format!("{} = ", namer.define(op.results[0])),
        n => format!("{}:{n} = ", namer.define_group(&op.results)),
    };
    let mut operands = op.operands.clone();
    let mut attrs: Vec<String> = op
        .kind
        .attrs()
        .iter()
        .map(|(k, a)| format!("{k} = {}", a.mlir()))
        .collect();
    let indices = op.kind.indices();
    match op.kind.syntax().operands {
        Operands::Indexed { .. } => {
            let dims = index_dims(vec![], &indices);
            attrs.push(format!("map = {}", affine_map_over(&dims, indices[0])));
            operands.extend(dims);
        }
        Operands::Product { .. } => {
            let counters = op.regions[0].args[..MATMUL_COUNTERS].to_vec();
            let dims = index_dims(counters, &indices);
            for (name, index) in ["a_map", "b_map"].iter().zip(&indices) {
                attrs.push(format!("{name} = {}", affine_map_over(&dims, index)));
            }
            operands.extend(&dims[MATMUL_COUNTERS..]);
        }
        Operands::Fixed(_) | Operands::Variadic | Operands::Limits => {}
    }
    attrs.sort();
    let operand_types: Vec<String> = operands.iter().map(|v| f.ty(*v).mlir()).collect();
    let _ = write!(
        out,
        "{pad}{results}\"{}\"({})",
        op.kind.name(),
        namer.list(&operands)
    );
    if let Some(region) = op.regions.first() {
        let args: Vec<String> = region
            .args
            .iter()
            .map(|a| {
                let n = namer.define(*a);
                format!("{n}: {}", f.ty(*a).mlir())
            })
            .collect();
        let _ = writeln!(out, " ({{\n{pad}^bb0({}):", args.join(", "));
        mlir_block(f, region, namer, depth + 1, out);
        let _ = write!(out, "{pad}}})");
    }
    if !attrs.is_empty() {
        let _ = write!(out, " {{{}}}", attrs.join(", "));
    }
    let result_types: Vec<String> = op.results.iter().map(|v| f.ty(*v).mlir()).collect();
    let _ = writeln!(
        out,
        " : ({}) -> ({})",
        operand_types.join(", "),
        result_types.join(", ")
    );
}
