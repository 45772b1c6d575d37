//! The verifier every dialect of the IR core shares: SSA (each value defined
//! once, used only where visible: in its block after its definition, or in a
//! block nested there), ops listed in exactly one block, indices over index
//! values, the regions an op's syntax declares, and terminators (a `return`
//! ends the function body, a `yield` ends a loop body with the types the loop
//! carries). What only a dialect knows (each op's typing rule, where it may
//! stand, what its region is) it says through [`VerifyDialect`]. Every
//! problem is reported, each located by the op's name in the printed text
//! (`@f: %7 = tile.dot`, or `@f: tile.store after %9`).

use std::collections::{HashMap, HashSet};

use crate::VerifyError;

use super::{Block, Dialect, Function, Module, OpData, OpDecl, OpId, Operands, Region, Value};

/// How a block ends.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockKind<T> {
    /// A function body: it ends with the dialect's `return`.
    Body,
    /// A loop body carrying values of these types: a `yield` of them ends it
    /// (and must, when it carries any).
    Loop(Vec<T>),
    /// Any other region (a parallel loop, a kernel, a product's epilogue):
    /// no terminator.
    Plain,
}

/// What a dialect adds to the generic verifier.
pub trait VerifyDialect: Dialect {
    /// What the dialect needs to know about where a block stands (the tile
    /// dialect: host code, or a kernel of some grid rank).
    type Context: Copy;
    /// The context of a function body.
    fn body_context() -> Self::Context;
    /// Problems of a function as a whole: its parameters, its values' types.
    fn check_function(f: &Function<Self>) -> Vec<String>;
    /// Problems of op `id` standing in `cx`: its typing rule, where it may
    /// stand, its indices and its region's arguments. Its operands and
    /// results exist, and it has the regions its syntax declares.
    fn check_op(f: &Function<Self>, id: OpId, cx: Self::Context) -> Vec<String>;
    /// How the region of `op` (which has one) is checked.
    fn region(
        f: &Function<Self>,
        op: &OpData<Self>,
        cx: Self::Context,
    ) -> (Self::Context, BlockKind<Self::Type>);
    /// Problems of the order of a block's ops that only the dialect knows
    /// (the loop dialect's kernel groups), each at an op or at the block.
    fn check_block(
        _f: &Function<Self>,
        _b: &Block,
        _kind: &BlockKind<Self::Type>,
    ) -> Vec<(Option<OpId>, String)> {
        Vec::new()
    }
    /// Problems between functions (the tile dialect's preparers), each at a
    /// function.
    fn check_module(_m: &Module<Self>) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// Which terminator an op is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminator {
    /// Ends a function body.
    Return,
    /// Ends a loop body, giving the next iteration's values.
    Yield,
}

/// Every problem in `m`.
pub fn verify_module<D: VerifyDialect>(m: &Module<D>) -> Vec<VerifyError> {
    let mut errors = Vec::new();
    let mut names = HashSet::new();
    for f in &m.functions {
        if !names.insert(f.name.as_str()) {
            errors.push(VerifyError {
                location: format!("@{}", f.name),
                message: "function defined twice".into(),
            });
        }
        Checker::new(f, &mut errors).function();
    }
    for (f, message) in D::check_module(m) {
        errors.push(VerifyError {
            location: format!("@{f}"),
            message,
        });
    }
    errors
}

/// The printed name of every op, as the text printer numbers values:
/// `@f: %3 = tile.add` for an op with results, `@f: tile.store after %3` for
/// one without.
pub fn op_labels<D: Dialect>(f: &Function<D>) -> HashMap<OpId, String> {
    fn walk<D: Dialect>(
        f: &Function<D>,
        b: &Block,
        next: &mut u32,
        last: &mut String,
        labels: &mut HashMap<OpId, String>,
    ) {
        for &id in &b.ops {
            let Some(op) = f.ops.get(id.0 as usize) else {
                continue;
            };
            let name = op.kind.name();
            let label = if op.results.is_empty() {
                if last.is_empty() {
                    format!("@{}: {name}", f.name)
                } else {
                    format!("@{}: {name} after {last}", f.name)
                }
            } else {
                let v = format!("%{next}");
                *next += 1;
                *last = v.clone();
                format!("@{}: {v} = {name}", f.name)
            };
            labels.insert(id, label);
            for r in &op.regions {
                for _ in &r.args {
                    *last = format!("%{next}");
                    *next += 1;
                }
                walk(f, r, next, last, labels);
            }
        }
    }
    let mut labels = HashMap::new();
    walk(f, &f.body, &mut 0, &mut String::new(), &mut labels);
    labels
}

/// The types, as text: `f32, index`, or `nothing`.
pub fn types_text<T: std::fmt::Display>(ts: &[T]) -> String {
    if ts.is_empty() {
        return "nothing".into();
    }
    ts.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

struct Checker<'a, D: Dialect> {
    f: &'a Function<D>,
    errors: &'a mut Vec<VerifyError>,
    defined: Vec<bool>,
    visible: Vec<Value>,
    op_seen: Vec<bool>,
    labels: HashMap<OpId, String>,
}

impl<'a, D: VerifyDialect> Checker<'a, D> {
    fn new(f: &'a Function<D>, errors: &'a mut Vec<VerifyError>) -> Self {
        Checker {
            f,
            errors,
            defined: vec![false; f.values.len()],
            visible: Vec::new(),
            op_seen: vec![false; f.ops.len()],
            labels: op_labels(f),
        }
    }

    fn err(&mut self, location: String, message: String) {
        self.errors.push(VerifyError { location, message });
    }

    fn loc(&self, id: OpId) -> String {
        self.labels
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("@{} op {}", self.f.name, id.0))
    }

    fn define(&mut self, v: Value, loc: &str) {
        match self.defined.get_mut(v.0 as usize) {
            None => self.err(
                loc.into(),
                format!("defines value {} that does not exist", v.0),
            ),
            Some(d) if *d => self.err(loc.into(), format!("value {} is defined twice", v.0)),
            Some(d) => {
                *d = true;
                self.visible.push(v);
            }
        }
    }

    fn function(&mut self) {
        let loc = format!("@{}", self.f.name);
        for message in D::check_function(self.f) {
            self.err(loc.clone(), message);
        }
        for (_, v) in &self.f.params {
            self.define(*v, &loc);
        }
        if self.f.outputs > self.f.params.len() {
            self.err(loc.clone(), "has more outputs than parameters".into());
        }
        let inputs = self.f.params.len().saturating_sub(self.f.outputs);
        if let Some(w) = self.f.weights.iter().find(|&&w| w >= inputs) {
            self.err(loc.clone(), format!("weight {w} is not an input parameter"));
        }
        self.block(&self.f.body, D::body_context(), &BlockKind::Body, &loc);
    }

    fn block(&mut self, b: &'a Block, cx: D::Context, kind: &BlockKind<D::Type>, loc: &str) {
        let depth = self.visible.len();
        for a in &b.args {
            self.define(*a, loc);
        }
        for (i, &id) in b.ops.iter().enumerate() {
            let Some(op) = self.f.ops.get(id.0 as usize) else {
                self.err(loc.into(), format!("lists op {} that does not exist", id.0));
                continue;
            };
            if std::mem::replace(&mut self.op_seen[id.0 as usize], true) {
                self.err(self.loc(id), "is listed in two blocks".into());
                continue;
            }
            let last = i + 1 == b.ops.len();
            match (op.kind.syntax().terminator, kind) {
                (Some(Terminator::Return), BlockKind::Body) if last => {}
                (Some(Terminator::Return), _) => self.err(
                    self.loc(id),
                    "must be the last op of a function body".into(),
                ),
                (Some(Terminator::Yield), BlockKind::Loop(types)) if last => {
                    let got: Vec<D::Type> = op
                        .operands
                        .iter()
                        .filter_map(|v| self.f.values.get(v.0 as usize).cloned())
                        .collect();
                    if &got != types {
                        self.err(
                            self.loc(id),
                            format!(
                                "yields {} where the loop carries {}",
                                types_text(&got),
                                types_text(types)
                            ),
                        );
                    }
                }
                (Some(Terminator::Yield), _) => self.err(
                    self.loc(id),
                    format!("must be the last op of a {}.for body", D::NAME),
                ),
                (None, _) => {}
            }
            self.op(id, cx);
        }
        for (at, message) in D::check_block(self.f, b, kind) {
            let location = at.map_or_else(|| loc.to_string(), |id| self.loc(id));
            self.err(location, message);
        }
        let ends_with = |t: Terminator| {
            b.ops
                .last()
                .and_then(|o| self.f.ops.get(o.0 as usize))
                .is_some_and(|o| o.kind.syntax().terminator == Some(t))
        };
        match kind {
            BlockKind::Body if !ends_with(Terminator::Return) => self.err(
                loc.into(),
                format!("the function body does not end with {}.return", D::NAME),
            ),
            BlockKind::Loop(types) if !types.is_empty() && !ends_with(Terminator::Yield) => self
                .err(
                    loc.into(),
                    format!("a {0}.for carrying values must end with {0}.yield", D::NAME),
                ),
            _ => {}
        }
        self.visible.truncate(depth);
    }

    fn op(&mut self, id: OpId, cx: D::Context) {
        let f = self.f;
        let op = &f.ops[id.0 as usize];
        let loc = self.loc(id);
        let syn = op.kind.syntax();
        for v in &op.operands {
            if !self.visible.contains(v) {
                self.err(
                    loc.clone(),
                    format!("uses value {} where it is not visible", v.0),
                );
            }
        }
        // A product's counters are visible in its indices (and its region).
        let depth = self.visible.len();
        if let (Operands::Product { counters }, Some(r)) = (syn.operands, op.regions.first()) {
            self.visible.extend(r.args.iter().take(counters).copied());
        }
        for e in op.kind.indices().into_iter().flatten() {
            for (_, v) in &e.terms {
                if !self.visible.contains(v) {
                    self.err(
                        loc.clone(),
                        format!("index uses value {} where it is not visible", v.0),
                    );
                } else if f.values.get(v.0 as usize) != Some(&D::index_type()) {
                    self.err(
                        loc.clone(),
                        format!("index uses value {}, which is not an index", v.0),
                    );
                }
            }
        }
        self.visible.truncate(depth);
        let exists = |v: &Value| (v.0 as usize) < f.values.len();
        let regions = usize::from(syn.region != Region::None);
        if !op.operands.iter().all(exists)
            || !op.results.iter().all(exists)
            || !op.regions.iter().all(|r| r.args.iter().all(exists))
        {
            self.err(loc.clone(), "names a value that does not exist".into());
        } else if op.regions.len() != regions {
            self.err(
                loc.clone(),
                format!("has {} regions, expected {regions}", op.regions.len()),
            );
        } else {
            for p in D::check_op(f, id, cx) {
                self.err(loc.clone(), p);
            }
            if let Some(r) = op.regions.first() {
                let (inner, kind) = D::region(f, op, cx);
                self.block(r, inner, &kind, &loc);
            }
        }
        for r in &op.results {
            self.define(*r, &loc);
        }
    }
}
