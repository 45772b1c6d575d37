//! The loop dialect's text form (read back by [`crate::parse`] to the same
//! text) and MLIR's generic operation syntax (which `mlir-opt
//! --allow-unregistered-dialect` parses). Values are named `%0, %1, ...` in
//! the order they are defined; parameters keep their names.

use std::fmt::Write;

use dlc_core::{DType, Namer, format_float};

use crate::ir::{Block, Function, IndexExpr, Module, OpId, OpKind, Type, Value};

fn index_text(namer: &Namer<Value>, e: &IndexExpr) -> String {
    affine_text(e, |v| namer.get(v), false)
}

/// An index with `var` naming each index value (MLIR's affine syntax when
/// `mlir`).
fn affine_text(e: &IndexExpr, var: impl Fn(Value) -> String, mlir: bool) -> String {
    let terms: Vec<(i64, String)> = e.terms.iter().map(|&(c, v)| (c, var(v))).collect();
    dlc_core::affine_text(&terms, e.constant, mlir)
}

fn const_text(v: f64, dtype: DType) -> String {
    match dtype {
        DType::Bool => (v != 0.0).to_string(),
        DType::I32 | DType::I64 => (v as i64).to_string(),
        _ => format_float(v),
    }
}

/// Prints a module.
pub fn print_module(m: &Module) -> String {
    let mut out = String::new();
    for (i, f) in m.functions.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        print_function(f, &mut out);
    }
    out
}

fn print_function(f: &Function, out: &mut String) {
    let mut namer = Namer::new(f.params.iter().map(|(n, v)| (n, *v)));
    let first_output = f.params.len() - f.outputs.min(f.params.len());
    let params: Vec<String> = f
        .params
        .iter()
        .enumerate()
        .map(|(i, (n, v))| {
            let out = if i >= first_output { "out " } else { "" };
            format!("{out}%{n}: {}", f.ty(*v))
        })
        .collect();
    let _ = writeln!(out, "loop.func @{}({}) {{", f.name, params.join(", "));
    print_block(f, &f.body, &mut namer, 1, out);
    out.push_str("}\n");
}

fn print_block(f: &Function, b: &Block, namer: &mut Namer<Value>, depth: usize, out: &mut String) {
    for &op in &b.ops {
        print_op(f, op, namer, depth, out);
    }
}

fn scalar_type(f: &Function, v: Value) -> String {
    f.ty(v).to_string()
}

fn print_op(f: &Function, id: OpId, namer: &mut Namer<Value>, depth: usize, out: &mut String) {
    let op = f.op(id);
    let pad = "  ".repeat(depth);
    let results: Vec<String> = op.results.iter().map(|r| namer.define(*r)).collect();
    out.push_str(&pad);
    if !results.is_empty() {
        let _ = write!(out, "{} = ", results.join(", "));
    }
    let name = op.kind.name();
    let ops = &op.operands;
    match &op.kind {
        OpKind::Alloc => {
            let _ = write!(out, "{name} : {}", f.ty(op.results[0]));
        }
        OpKind::View => {
            let _ = write!(
                out,
                "{name} {} : {}",
                namer.get(ops[0]),
                f.ty(op.results[0])
            );
        }
        OpKind::Dealloc | OpKind::Yield => {
            let _ = write!(out, "{name} {}", namer.list(ops));
        }
        OpKind::Return => out.push_str(&name),
        OpKind::Const(v) => {
            let t = f.ty(op.results[0]);
            let dtype = if let Type::Scalar(d) = t {
                *d
            } else {
                DType::F32
            };
            let _ = write!(out, "{name} {} : {t}", const_text(*v, dtype));
        }
        OpKind::Unary(_) | OpKind::Binary(_) | OpKind::Compare(_) | OpKind::Select => {
            let ty = scalar_type(f, *ops.last().unwrap_or(&op.results[0]));
            let _ = write!(out, "{name} {} : {ty}", namer.list(ops));
        }
        OpKind::Cast => {
            let _ = write!(
                out,
                "{name} {} : {} to {}",
                namer.get(ops[0]),
                f.ty(ops[0]),
                f.ty(op.results[0])
            );
        }
        OpKind::Load { index, pad } => {
            let idx: Vec<String> = index.iter().map(|e| index_text(namer, e)).collect();
            let _ = write!(out, "{name} {}[{}]", namer.get(ops[0]), idx.join(", "));
            if let Some(p) = pad {
                let dtype = if let Type::Scalar(d) = f.ty(op.results[0]) {
                    *d
                } else {
                    DType::F32
                };
                let _ = write!(out, " pad {}", const_text(*p, dtype));
            }
            let _ = write!(out, " : {}", f.ty(op.results[0]));
        }
        OpKind::Store { index } => {
            let idx: Vec<String> = index.iter().map(|e| index_text(namer, e)).collect();
            let _ = write!(
                out,
                "{name} {}, {}[{}]",
                namer.get(ops[0]),
                namer.get(ops[1]),
                idx.join(", ")
            );
        }
        OpKind::For { lo, hi, step } => {
            let body = &op.regions[0];
            let iv = namer.define(body.args[0]);
            let _ = write!(out, "{name} {iv} = {lo} to {hi} step {step}");
            if !ops.is_empty() {
                let iters: Vec<String> = body.args[1..]
                    .iter()
                    .zip(ops)
                    .map(|(a, init)| {
                        let n = namer.define(*a);
                        format!("{n} = {}", namer.get(*init))
                    })
                    .collect();
                let types: Vec<String> = op.results.iter().map(|r| f.ty(*r).to_string()).collect();
                let _ = write!(out, " iter({}) -> {}", iters.join(", "), types.join(", "));
            }
            out.push_str(" {\n");
            print_block(f, body, namer, depth + 1, out);
            let _ = write!(out, "{pad}}}");
        }
        OpKind::Parallel { lo, hi } => {
            let body = &op.regions[0];
            let iv = namer.define(body.args[0]);
            let _ = writeln!(out, "{name} {iv} = {lo} to {hi} {{");
            print_block(f, body, namer, depth + 1, out);
            let _ = write!(out, "{pad}}}");
        }
        OpKind::Matmul(c) => {
            let crate::ir::Contraction { m, n, k, a, b } = &**c;
            let body = &op.regions[0];
            let args: Vec<String> = body.args.iter().map(|v| namer.define(*v)).collect();
            let ai: Vec<String> = a.iter().map(|e| index_text(namer, e)).collect();
            let bi: Vec<String> = b.iter().map(|e| index_text(namer, e)).collect();
            let _ = writeln!(
                out,
                "{name} ({}) = ({m}, {n}, {k}) {}[{}] * {}[{}] {{",
                args.join(", "),
                namer.get(ops[0]),
                ai.join(", "),
                namer.get(ops[1]),
                bi.join(", "),
            );
            print_block(f, body, namer, depth + 1, out);
            let _ = write!(out, "{pad}}}");
        }
    }
    out.push('\n');
}

fn mlir_const(v: f64, dtype: DType) -> String {
    match dtype {
        DType::Bool => (v != 0.0).to_string(),
        DType::I32 | DType::I64 => format!("{} : {}", v as i64, dtype.mlir_name()),
        _ if v.is_finite() => format!("{} : {}", format_float(v), dtype.mlir_name()),
        DType::F32 => format!("0x{:08X} : f32", (v as f32).to_bits()),
        _ => format!("0x{:016X} : f64", v.to_bits()),
    }
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

/// The distinct index values an index list uses, and its `affine_map`.
fn affine_map(index: &[IndexExpr]) -> (Vec<Value>, String) {
    let mut dims: Vec<Value> = Vec::new();
    for e in index {
        for (_, v) in &e.terms {
            if !dims.contains(v) {
                dims.push(*v);
            }
        }
    }
    let map = affine_map_over(&dims, index);
    (dims, map)
}

/// Prints a module in MLIR's generic operation syntax.
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
        let op = f.op(id);
        let pad = "  ".repeat(depth);
        let results: Vec<String> = match op.results.len() {
            0 => vec![],
            1 => vec![namer.define(op.results[0])],
            _ => vec![namer.define_group(&op.results)],
        };
        let mut operands = op.operands.clone();
        let mut attrs: Vec<String> = Vec::new();
        match &op.kind {
            OpKind::Const(v) => {
                let dtype = if let Type::Scalar(d) = f.ty(op.results[0]) {
                    *d
                } else {
                    DType::F32
                };
                attrs.push(format!("value = {}", mlir_const(*v, dtype)));
            }
            OpKind::Load { index, pad: p } => {
                let (dims, map) = affine_map(index);
                operands.extend(dims);
                attrs.push(format!("map = {map}"));
                if let Some(p) = p {
                    let dtype = if let Type::Scalar(d) = f.ty(op.results[0]) {
                        *d
                    } else {
                        DType::F32
                    };
                    attrs.push(format!("pad = {}", mlir_const(*p, dtype)));
                }
            }
            OpKind::Store { index } => {
                let (dims, map) = affine_map(index);
                operands.extend(dims);
                attrs.push(format!("map = {map}"));
            }
            OpKind::For { lo, hi, step } => {
                attrs.push(format!("lower = {lo} : i64"));
                attrs.push(format!("step = {step} : i64"));
                attrs.push(format!("upper = {hi} : i64"));
            }
            OpKind::Parallel { lo, hi } => {
                attrs.push(format!("lower = {lo} : i64"));
                attrs.push(format!("upper = {hi} : i64"));
            }
            OpKind::Matmul(c) => {
                let crate::ir::Contraction { m, n, k, a, b } = &**c;
                // Maps over (i, j, k, indices from outside...); the outside
                // indices become operands after the two buffers.
                let mut dims: Vec<Value> = op.regions[0].args[..3].to_vec();
                for e in a.iter().chain(b) {
                    for (_, v) in &e.terms {
                        if !dims.contains(v) {
                            dims.push(*v);
                        }
                    }
                }
                operands.extend(&dims[3..]);
                attrs.push(format!("a_map = {}", affine_map_over(&dims, a)));
                attrs.push(format!("b_map = {}", affine_map_over(&dims, b)));
                attrs.push(format!("sizes = array<i64: {m}, {n}, {k}>"));
            }
            _ => {}
        }
        out.push_str(&pad);
        match op.results.len() {
            0 => {}
            1 => {
                let _ = write!(out, "{} = ", results[0]);
            }
            n => {
                let _ = write!(out, "{}:{n} = ", results[0]);
            }
        }
        let operand_types: Vec<String> = operands.iter().map(|v| f.ty(*v).mlir()).collect();
        let _ = write!(out, "\"{}\"({})", op.kind.name(), namer.list(&operands));
        if !op.regions.is_empty() {
            out.push_str(" (");
            for (i, region) in op.regions.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let args: Vec<String> = region
                    .args
                    .iter()
                    .map(|a| {
                        let n = namer.define(*a);
                        format!("{n}: {}", f.ty(*a).mlir())
                    })
                    .collect();
                let _ = writeln!(out, "{{\n{pad}^bb0({}):", args.join(", "));
                mlir_block(f, region, namer, depth + 1, out);
                let _ = write!(out, "{pad}}}");
            }
            out.push(')');
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
}
