//! Any dialect of the IR core in MLIR's generic operation syntax, which
//! `mlir-opt --allow-unregistered-dialect` parses: each function is a
//! `"D.func"` op with one region whose block arguments are the parameters,
//! every op is `%r = "D.NAME"(operands) ({ ^bb0(args): .. }) {attrs} :
//! (operand types) -> (result types)`, a region that does not end with a
//! terminator ends with `"D.end"`, and an op's index lists become attributes
//! (the dialect says how: [`MlirDialect::index_attrs`]) over index values
//! appended to its operands.

use std::fmt::Write;

use crate::Namer;

use super::{Block, Dialect, Function, Module, OpData, OpDecl, OpId, Value};

/// What a dialect adds to the generic MLIR printer.
pub trait MlirDialect: Dialect {
    /// A value type in MLIR (`memref<4x8xf32>`, `tensor<6x20xf32>`).
    fn mlir_type(t: &Self::Type) -> String;
    /// The attributes standing for an op's index lists, and the index values
    /// they read, to be appended to its operands.
    fn index_attrs(f: &Function<Self>, op: &OpData<Self>) -> (Vec<String>, Vec<Value>);
}

/// Prints a module in MLIR's generic operation syntax.
pub fn print_mlir_generic<D: MlirDialect>(m: &Module<D>) -> String {
    let mut out = String::from("module {\n");
    for f in &m.functions {
        let mut namer = Namer::new(f.params.iter().map(|(n, v)| (n, *v)));
        let params: Vec<String> = f
            .params
            .iter()
            .map(|(n, v)| format!("%{n}: {}", D::mlir_type(f.ty(*v))))
            .collect();
        let _ = writeln!(out, "  \"{}.func\"() ({{", D::NAME);
        let _ = writeln!(out, "  ^bb0({}):", params.join(", "));
        block(f, &f.body, &mut namer, 2, &mut out);
        let types: Vec<String> = f
            .params
            .iter()
            .map(|(_, v)| D::mlir_type(f.ty(*v)))
            .collect();
        let _ = writeln!(
            out,
            "  }}) {{dlc.outputs = {} : i64, function_type = ({}) -> (), sym_name = \"{}\"}} : () -> ()",
            f.outputs,
            types.join(", "),
            f.name
        );
    }
    out.push_str("}\n");
    out
}

fn block<D: MlirDialect>(
    f: &Function<D>,
    b: &Block,
    namer: &mut Namer<Value>,
    depth: usize,
    out: &mut String,
) {
    for &id in &b.ops {
        op(f, id, namer, depth, out);
    }
}

fn op<D: MlirDialect>(
    f: &Function<D>,
    id: OpId,
    namer: &mut Namer<Value>,
    depth: usize,
    out: &mut String,
) {
    let op = f.op(id);
    let pad = "  ".repeat(depth);
    let mut operands = op.operands.clone();
    let mut attrs: Vec<String> = op
        .kind
        .attrs()
        .iter()
        .map(|(k, a)| format!("{k} = {}", a.mlir()))
        .collect();
    let (index_attrs, index_operands) = D::index_attrs(f, op);
    attrs.extend(index_attrs);
    operands.extend(index_operands);
    let operand_text = namer.list(&operands);
    let types = |vs: &[Value]| -> String {
        vs.iter()
            .map(|v| D::mlir_type(f.ty(*v)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    out.push_str(&pad);
    out.push_str(&super::print::define_results(namer, &op.results));
    let _ = write!(out, "\"{}\"({operand_text})", op.kind.name());
    if let Some(region) = op.regions.first() {
        out.push_str(" ({\n");
        let args: Vec<String> = region
            .args
            .iter()
            .map(|a| {
                let ty = D::mlir_type(f.ty(*a));
                format!("{}: {ty}", namer.define(*a))
            })
            .collect();
        let _ = writeln!(out, "{pad}^bb0({}):", args.join(", "));
        block(f, region, namer, depth + 1, out);
        let terminated = region
            .ops
            .last()
            .is_some_and(|o| f.op(*o).kind.syntax().terminator.is_some());
        if !terminated {
            let _ = writeln!(out, "{pad}  \"{}.end\"() : () -> ()", D::NAME);
        }
        let _ = write!(out, "{pad}}})");
    }
    if !attrs.is_empty() {
        let _ = write!(out, " {{{}}}", attrs.join(", "));
    }
    let _ = writeln!(out, " : ({}) -> ({})", types(&operands), types(&op.results));
}
