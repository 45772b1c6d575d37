//! The tile dialect's text form (the IR core's generic one,
//! [`dlc_core::ir::print`], read back by [`crate::parse`] to the same text),
//! kernel fingerprints, and MLIR's generic operation syntax (which `mlir-opt
//! --allow-unregistered-dialect` parses), derived from the op declarations
//! in [`crate::ops`].

use std::collections::HashSet;
use std::fmt::Write;

use dlc_core::Namer;

use crate::ir::{Function, Module, OpData, OpId, Tile, Type, Value};
use crate::ops::OpKind;

/// Prints a module in the text form (the IR core's, [`dlc_core::ir::print`]).
pub fn print_module(m: &Module) -> String {
    dlc_core::ir::print::print_module(m)
}

/// Op `id` as text that says what it does to its inputs and nothing else:
/// the values it uses from outside are named `%in0`, `%in1`, ... in the
/// order of their first use (and returned in that order) and written with
/// their types, values defined inside are numbered from zero, and the
/// source place of every op in it that can fail at run time is written too
/// (a failure names its place).
/// Two ops with the same fingerprint compute the same function of their
/// inputs, so a code generator may emit one and call it for both.
pub fn fingerprint(f: &Function, id: OpId) -> (String, Vec<Value>) {
    fn walk(f: &Function, ops: &[OpId], defined: &mut HashSet<Value>, inputs: &mut Vec<Value>) {
        for &id in ops {
            let op = f.op(id);
            let index = op.kind.index().unwrap_or(&[]);
            let uses = op
                .operands
                .iter()
                .copied()
                .chain(index.iter().flat_map(|e| e.terms.iter().map(|t| t.1)));
            for v in uses {
                if defined.insert(v) {
                    inputs.push(v);
                }
            }
            defined.extend(&op.results);
            for r in &op.regions {
                defined.extend(&r.args);
                walk(f, &r.ops, defined, inputs);
            }
        }
    }
    let mut inputs = Vec::new();
    walk(f, &[id], &mut HashSet::new(), &mut inputs);
    let names: Vec<String> = (0..inputs.len()).map(|k| format!("in{k}")).collect();
    let mut namer = Namer::new(names.iter().zip(inputs.iter().copied()));
    let mut out = String::new();
    for (n, v) in names.iter().zip(&inputs) {
        let _ = writeln!(out, "%{n}: {}", f.ty(*v));
    }
    dlc_core::ir::print::print_op(f, id, &mut namer, 0, &mut out);
    fn places(f: &Function, ops: &[OpId], out: &mut String) {
        for &id in ops {
            let op = f.op(id);
            if op
                .kind
                .may_fail(&op.operands.iter().map(|v| f.ty(*v)).collect::<Vec<_>>())
            {
                let _ = writeln!(out, "{:?}", op.loc);
            }
            for r in &op.regions {
                places(f, &r.ops, out);
            }
        }
    }
    places(f, &[id], &mut out);
    (out, inputs)
}

/// [`fingerprint`] for a code generator that hands a kernel each input
/// buffer as a pointer to its element `[0, 0, ..]` (its offset applied):
/// where no view inside op `id` moves from its source (every such view
/// keeps its source's offset), the code depends on no offset, so the
/// offsets are left out and kernels that differ only in where their
/// buffers start share one key (W7's 32 steps, each reading its slice of
/// the input).
pub fn relocatable_fingerprint(f: &Function, id: OpId) -> (String, Vec<Value>) {
    fn moves(f: &Function, ops: &[OpId]) -> bool {
        ops.iter().any(|&id| {
            let op = f.op(id);
            let offset = |v: Value| match f.ty(v) {
                Type::Buffer(t) => t.offset,
                _ => 0,
            };
            (matches!(op.kind, OpKind::View) && offset(op.operands[0]) != offset(op.results[0]))
                || op.regions.iter().any(|r| moves(f, &r.ops))
        })
    }
    let (text, inputs) = fingerprint(f, id);
    if moves(f, &[id]) {
        return (text, inputs);
    }
    // Buffer types are the only text with `, offset = N`.
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find(", offset = ") {
        out.push_str(&rest[..at]);
        rest = rest[at + ", offset = ".len()..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    (out, inputs)
}

/// Prints a module in MLIR's generic operation syntax (the IR core's,
/// [`dlc_core::ir::mlir`]): tiles are `tensor`s, buffers are `memref`s with
/// their memory space, and an index list is an `affine_map` whose
/// dimensions are the tile coordinates and whose symbols are the index
/// values it uses (appended to the operands).
pub fn print_mlir_generic(m: &Module) -> String {
    dlc_core::ir::mlir::print_mlir_generic(m)
}

impl dlc_core::ir::mlir::MlirDialect for Tile {
    /// A tile's layout is its tensor's encoding, as in Triton's IR.
    fn mlir_type(t: &Type) -> String {
        match t {
            Type::Tile(tile) if tile.layout.name().is_some() => {
                let plain = t.mlir();
                let name = tile.layout.name().unwrap_or_default();
                format!("{}, \"{name}\">", &plain[..plain.len() - 1])
            }
            _ => t.mlir(),
        }
    }

    fn index_attrs(f: &Function, op: &OpData) -> (Vec<String>, Vec<Value>) {
        let Some(index) = op.kind.index() else {
            return (vec![], vec![]);
        };
        let mut symbols: Vec<Value> = Vec::new();
        for e in index {
            for (_, v) in &e.terms {
                if !symbols.contains(v) {
                    symbols.push(*v);
                }
            }
        }
        let dims = index
            .iter()
            .flat_map(|e| e.axes.iter().map(|a| a.1 + 1))
            .max()
            .unwrap_or(0)
            .max(
                op.results
                    .first()
                    .and_then(|r| f.ty(*r).shape())
                    .map_or(0, |s| s.len()),
            );
        let results: Vec<String> = index
            .iter()
            .map(|e| {
                e.text(
                    |v| format!("s{}", symbols.iter().position(|s| *s == v).unwrap_or(0)),
                    |k| format!("d{k}"),
                    true,
                )
            })
            .collect();
        let d: Vec<String> = (0..dims).map(|i| format!("d{i}")).collect();
        let s: Vec<String> = (0..symbols.len()).map(|i| format!("s{i}")).collect();
        let attrs = vec![
            format!(
                "index = affine_map<({})[{}] -> ({})>",
                d.join(", "),
                s.join(", "),
                results.join(", ")
            ),
            format!("index_symbols = {} : i64", symbols.len()),
        ];
        (attrs, symbols)
    }
}
