//! The text form every dialect of the IR core shares, read back by
//! [`super::parse`] to the same text. It derives from each op's declaration
//! ([`OpDecl`]): one generic shape for every op,
//!
//! ```text
//! %r = DIALECT.NAME operands {attrs} (%region_args) { region } : result types
//! ```
//!
//! where a load's or store's buffer is written with its index (`%b[4*%0 +
//! #1, %1]`, `#k` a tile coordinate), a mask follows as `mask %m`, and a
//! product's operands carry their indices over its counters (`%a[#0, #2]`).
//! An op with several results is `%r:n = ..`, its results used as `%r#k`.
//! Values are named `%0, %1, ...` in the order they are defined; parameters
//! keep their names.

use std::fmt::Write;

use crate::Namer;

use super::{Block, Dialect, Function, Module, OpDecl, OpId, Operands, Region, Value};

/// Prints a module.
pub fn print_module<D: Dialect>(m: &Module<D>) -> String {
    let mut out = String::new();
    for (i, f) in m.functions.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        print_function(f, &mut out);
    }
    out
}

fn print_function<D: Dialect>(f: &Function<D>, out: &mut String) {
    let mut namer = Namer::new(f.params.iter().map(|(n, v)| (n, *v)));
    let params: Vec<String> = f
        .params
        .iter()
        .enumerate()
        .map(|(i, (n, v))| {
            let out = if i + f.outputs >= f.params.len() {
                "out "
            } else if f.weights.contains(&i) {
                "weight "
            } else {
                ""
            };
            format!("{out}%{n}: {}", f.ty(*v))
        })
        .collect();
    let prepare = f
        .prepare
        .as_ref()
        .map_or(String::new(), |p| format!(" prepare @{p}"));
    let _ = writeln!(
        out,
        "{}.func @{}({}){prepare} {{",
        D::NAME,
        f.name,
        params.join(", ")
    );
    print_block(f, &f.body, &mut namer, 1, out);
    out.push_str("}\n");
}

fn print_block<D: Dialect>(
    f: &Function<D>,
    b: &Block,
    namer: &mut Namer<Value>,
    depth: usize,
    out: &mut String,
) {
    for &id in &b.ops {
        print_op(f, id, namer, depth, out);
    }
}

/// Names an op's results: `%r = ` for one, `%r:n = ` for several (used as
/// `%r#k`), nothing for none.
pub fn define_results(namer: &mut Namer<Value>, results: &[Value]) -> String {
    match results.len() {
        0 => String::new(),
        1 => format!("{} = ", namer.define(results[0])),
        n => format!("{}:{n} = ", namer.define_group(results)),
    }
}

/// Prints op `id` (with its regions) at `depth`, naming values by `namer`.
pub fn print_op<D: Dialect>(
    f: &Function<D>,
    id: OpId,
    namer: &mut Namer<Value>,
    depth: usize,
    out: &mut String,
) {
    let op = f.op(id);
    let pad = "  ".repeat(depth);
    out.push_str(&pad);
    out.push_str(&define_results(namer, &op.results));
    out.push_str(&op.kind.name());
    let syn = op.kind.syntax();
    // A product's indices name its counters `#k`, which its region defines.
    let counters: &[Value] = match syn.operands {
        Operands::Product { counters } => op
            .regions
            .first()
            .map_or(&[], |r| &r.args[..counters.min(r.args.len())]),
        _ => &[],
    };
    let indices = op.kind.indices();
    let index_text = |namer: &Namer<Value>, index: &[super::Affine]| -> String {
        let var = |v: Value| match counters.iter().position(|c| *c == v) {
            Some(k) => format!("#{k}"),
            None => namer.get(v),
        };
        let items: Vec<String> = index
            .iter()
            .map(|e| e.text(var, |k| format!("#{k}"), false))
            .collect();
        format!("[{}]", items.join(", "))
    };
    match syn.operands {
        Operands::Fixed(_) | Operands::Variadic => {
            if !op.operands.is_empty() {
                let _ = write!(out, " {}", namer.list(&op.operands));
            }
        }
        Operands::Indexed { before, .. } => {
            let mut parts: Vec<String> = op.operands[..before.min(op.operands.len())]
                .iter()
                .map(|v| namer.get(*v))
                .collect();
            if let (Some(b), Some(index)) = (op.operands.get(before), indices.first()) {
                parts.push(format!("{}{}", namer.get(*b), index_text(namer, index)));
            }
            let _ = write!(out, " {}", parts.join(", "));
            if let Some(m) = op.operands.get(before + 1) {
                let _ = write!(out, " mask {}", namer.get(*m));
            }
        }
        Operands::Product { .. } => {
            let parts: Vec<String> = op
                .operands
                .iter()
                .zip(&indices)
                .map(|(b, index)| format!("{}{}", namer.get(*b), index_text(namer, index)))
                .collect();
            let _ = write!(out, " {}", parts.join(", "));
        }
        Operands::Limits => {
            let _ = write!(
                out,
                " {}",
                index_text(namer, indices.first().copied().unwrap_or(&[]))
            );
        }
    }
    let attrs = op.kind.attrs();
    if !attrs.is_empty() {
        let items: Vec<String> = attrs
            .iter()
            .map(|(k, a)| format!("{k} = {}", a.text()))
            .collect();
        let _ = write!(out, " {{{}}}", items.join(", "));
    }
    if let Some(region) = op.regions.first() {
        if syn.region == Region::WithArgs {
            let args: Vec<String> = region.args.iter().map(|a| namer.define(*a)).collect();
            let _ = write!(out, " ({})", args.join(", "));
        }
        out.push_str(" {\n");
        print_block(f, region, namer, depth + 1, out);
        let _ = write!(out, "{pad}}}");
    }
    if !op.results.is_empty() {
        let types: Vec<String> = op.results.iter().map(|r| f.ty(*r).to_string()).collect();
        let _ = write!(out, " : {}", types.join(", "));
    }
    out.push('\n');
}
