//! The loop dialect's text form (the IR core's generic one,
//! [`dlc_core::ir::print`], read back by [`crate::parse`] to the same text)
//! and MLIR's generic operation syntax (which `mlir-opt
//! --allow-unregistered-dialect` parses), derived from the op declarations
//! in [`crate::ops`].

use crate::ir::{Function, IndexExpr, Loop, Module, OpData, Type, Value};
use crate::ops::{MATMUL_COUNTERS, Operands};
use dlc_core::ir::OpDecl;

/// Prints a module in the text form (the IR core's, [`dlc_core::ir::print`]).
pub fn print_module(m: &Module) -> String {
    dlc_core::ir::print::print_module(m)
}

/// The `affine_map` of an index list over the given dimensions.
fn affine_map_over(dims: &[Value], index: &[IndexExpr]) -> String {
    let dim_name = |v: Value| format!("d{}", dims.iter().position(|d| *d == v).unwrap_or(0));
    let results: Vec<String> = index
        .iter()
        .map(|e| e.text(dim_name, |k| format!("#{k}"), true))
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

/// Prints a module in MLIR's generic operation syntax (the IR core's,
/// [`dlc_core::ir::mlir`]): buffers are `memref`s, and an index list is an
/// `affine_map` attribute over the index values it uses (appended to the
/// operands); a `loop.matmul`'s maps (`a_map`, `b_map`) are over its
/// counters, then the outside index values.
pub fn print_mlir_generic(m: &Module) -> String {
    dlc_core::ir::mlir::print_mlir_generic(m)
}

impl dlc_core::ir::mlir::MlirDialect for Loop {
    fn mlir_type(t: &Type) -> String {
        t.mlir()
    }

    fn index_attrs(_: &Function, op: &OpData) -> (Vec<String>, Vec<Value>) {
        let indices = op.kind.indices();
        match op.kind.syntax().operands {
            Operands::Indexed { .. } => {
                let dims = index_dims(vec![], &indices);
                (
                    vec![format!("map = {}", affine_map_over(&dims, indices[0]))],
                    dims,
                )
            }
            Operands::Product { .. } => {
                let counters = op.regions[0].args[..MATMUL_COUNTERS].to_vec();
                let dims = index_dims(counters, &indices);
                let attrs = ["a_map", "b_map"]
                    .iter()
                    .zip(&indices)
                    .map(|(name, index)| format!("{name} = {}", affine_map_over(&dims, index)))
                    .collect();
                (attrs, dims[MATMUL_COUNTERS..].to_vec())
            }
            Operands::Fixed(_) | Operands::Variadic | Operands::Limits => (vec![], vec![]),
        }
    }
}
