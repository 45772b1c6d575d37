//! The loop dialect's verifier: SSA (each value defined once, used only
//! where visible), the type rules of every op, and the terminators of each
//! kind of block. Every problem is reported, each with where it is.

use dlc_core::VerifyError;
use dlc_core::ir::Region;

use crate::ir::{Block, Function, IndexExpr, Module, OpId, OpKind, Type, Value};
use crate::ops::MATMUL_COUNTERS;

/// Every problem in `m`.
pub fn verify_module(m: &Module) -> Vec<VerifyError> {
    let mut errors = Vec::new();
    let mut names = std::collections::HashSet::new();
    for f in &m.functions {
        if !names.insert(f.name.as_str()) {
            errors.push(VerifyError {
                location: format!("@{}", f.name),
                message: "function defined twice".into(),
            });
        }
        if let Some(p) = &f.prepare {
            errors.push(VerifyError {
                location: format!("@{}", f.name),
                message: format!(
                    "loop IR has no preparers (`prepare @{p}`): `tile.split-prepare` makes them in tile IR"
                ),
            });
        }
        Checker::new(f, &mut errors).function();
    }
    errors
}

#[derive(Clone, Copy, PartialEq)]
enum BlockKind {
    Function,
    For { carries: bool },
    Parallel,
}

struct Checker<'a> {
    f: &'a Function,
    errors: &'a mut Vec<VerifyError>,
    defined: Vec<bool>,
    visible: Vec<Value>,
    op_seen: Vec<bool>,
}

impl<'a> Checker<'a> {
    fn new(f: &'a Function, errors: &'a mut Vec<VerifyError>) -> Self {
        Checker {
            f,
            errors,
            defined: vec![false; f.values.len()],
            visible: Vec::new(),
            op_seen: vec![false; f.ops.len()],
        }
    }

    fn err(&mut self, location: String, message: String) {
        self.errors.push(VerifyError { location, message });
    }

    fn loc(&self, id: OpId) -> String {
        format!(
            "@{} op {} ({})",
            self.f.name,
            id.0,
            self.f.ops[id.0 as usize].kind.name()
        )
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

    fn ty(&self, v: Value) -> Option<&Type> {
        self.f.values.get(v.0 as usize)
    }

    fn function(&mut self) {
        let loc = format!("@{}", self.f.name);
        for (name, v) in &self.f.params {
            self.define(*v, &loc);
            match self.ty(*v) {
                Some(Type::Buffer(b)) if b.offset != 0 => self.err(
                    loc.clone(),
                    format!("parameter %{name} has an offset: a parameter is its own storage"),
                ),
                Some(Type::Buffer(_)) => {}
                _ => self.err(loc.clone(), format!("parameter %{name} is not a buffer")),
            }
        }
        let inputs = self.f.params.len().saturating_sub(self.f.outputs);
        if let Some(w) = self.f.weights.iter().find(|&&w| w >= inputs) {
            self.err(loc.clone(), format!("weight {w} is not an input parameter"));
        }
        let body = self.f.body.clone();
        self.block(&body, BlockKind::Function, &[], &loc);
    }

    fn block(&mut self, b: &Block, kind: BlockKind, carried: &[Type], loc: &str) {
        let depth = self.visible.len();
        for a in &b.args {
            self.define(*a, loc);
        }
        // The `loop.kernel_begin` of the group open at this point.
        let mut group: Option<OpId> = None;
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
            match (&op.kind, kind) {
                (OpKind::Return, BlockKind::Function) if last => {}
                (OpKind::Return, _) => self.err(
                    self.loc(id),
                    "must be the last op of a function body".into(),
                ),
                (OpKind::Yield, BlockKind::For { carries: true }) if last => {
                    let types: Vec<Type> = op
                        .operands
                        .iter()
                        .filter_map(|v| self.ty(*v).cloned())
                        .collect();
                    if types != carried {
                        self.err(
                            self.loc(id),
                            "yields values whose types differ from the carried ones".into(),
                        );
                    }
                }
                (OpKind::Yield, _) => self.err(
                    self.loc(id),
                    "must be the last op of a loop.for body that carries values".into(),
                ),
                (OpKind::KernelBegin(_), BlockKind::Function) => {
                    if group.is_some() {
                        self.err(
                            self.loc(id),
                            "opens a kernel group inside another (groups do not nest)".into(),
                        );
                    } else {
                        group = Some(id);
                    }
                }
                // The guard closes the open group, if any.
                (OpKind::KernelEnd, BlockKind::Function) if group.take().is_none() => {
                    self.err(self.loc(id), "closes no open kernel group".into());
                }
                (OpKind::KernelEnd, BlockKind::Function) => {}
                (OpKind::KernelBegin(_) | OpKind::KernelEnd, _) => self.err(
                    self.loc(id),
                    "must be in a function body, not in a loop (a kernel group bounds top-level \
                     ops)"
                        .into(),
                ),
                _ => {}
            }
            self.op(id);
        }
        let ends_with = |k: fn(&OpKind) -> bool| {
            b.ops
                .last()
                .and_then(|o| self.f.ops.get(o.0 as usize))
                .is_some_and(|o| k(&o.kind))
        };
        if let Some(open) = group {
            self.err(
                self.loc(open),
                "opens a kernel group that no loop.kernel_end closes".into(),
            );
        }
        match kind {
            BlockKind::Function if !ends_with(|k| matches!(k, OpKind::Return)) => self.err(
                loc.into(),
                "the function body does not end with loop.return".into(),
            ),
            BlockKind::For { carries: true } if !ends_with(|k| matches!(k, OpKind::Yield)) => self
                .err(
                    loc.into(),
                    "a loop.for carrying values must end with loop.yield".into(),
                ),
            _ => {}
        }
        self.visible.truncate(depth);
    }

    fn check_index(&mut self, id: OpId, index: &[IndexExpr], rank: usize) {
        if index.len() != rank {
            self.err(
                self.loc(id),
                format!("{} indices for a rank-{rank} buffer", index.len()),
            );
        }
        for e in index {
            for (_, v) in &e.terms {
                if !self.visible.contains(v) {
                    self.err(
                        self.loc(id),
                        format!("index uses value {} where it is not visible", v.0),
                    );
                } else if self.ty(*v) != Some(&Type::Index) {
                    self.err(
                        self.loc(id),
                        format!("index uses value {}, which is not an index", v.0),
                    );
                }
            }
        }
    }

    /// A `loop.matmul`'s indices (over its counters and visible indices,
    /// shaped as a matrix product's) and its epilogue.
    fn matmul(
        &mut self,
        id: OpId,
        c: &crate::ir::Contraction,
        rank_a: usize,
        rank_b: usize,
        loc: &str,
    ) {
        let f = self.f;
        let region = &f.ops[id.0 as usize].regions[0];
        let depth = self.visible.len();
        self.visible.extend(&region.args[..MATMUL_COUNTERS]);
        self.check_index(id, &c.a, rank_a);
        self.check_index(id, &c.b, rank_b);
        self.visible.truncate(depth);
        // A matrix product: rows index the left operand only, columns the
        // right one only.
        let in_terms =
            |e: &[IndexExpr], v: Value| e.iter().any(|x| x.terms.iter().any(|t| t.1 == v));
        if in_terms(&c.a, region.args[1]) || in_terms(&c.b, region.args[0]) {
            self.err(
                loc.to_string(),
                "indexes its left operand by the column index or its right operand by the row \
                 index (a matrix product's left operand is indexed by rows and k, its right one \
                 by k and columns)"
                    .into(),
            );
        }
        if uses_value(f, region, region.args[2]) {
            self.err(
                loc.to_string(),
                "uses the reduction index outside the operands' indices".into(),
            );
        }
        self.block(region, BlockKind::Parallel, &[], loc);
    }

    fn op(&mut self, id: OpId) {
        let op: &'a crate::ir::OpData = &self.f.ops[id.0 as usize];
        let loc = self.loc(id);
        for v in &op.operands {
            if !self.visible.contains(v) {
                self.err(
                    loc.clone(),
                    format!(
                        "uses value {} before its definition or outside its scope",
                        v.0
                    ),
                );
            }
        }
        // Types borrow the function, not the checker, which checks nested
        // blocks mutably below.
        let f: &'a Function = self.f;
        let ops: Vec<Option<&'a Type>> = op
            .operands
            .iter()
            .map(|v| f.values.get(v.0 as usize))
            .collect();
        let res: Vec<Option<&'a Type>> = op
            .results
            .iter()
            .map(|v| f.values.get(v.0 as usize))
            .collect();
        let regions = usize::from(op.kind.syntax().region != Region::None);
        let args: Vec<Option<&'a Type>> = op
            .regions
            .first()
            .map(|b| b.args.iter().map(|v| f.values.get(v.0 as usize)).collect())
            .unwrap_or_default();
        let problem = if op.regions.len() != regions {
            Some(format!(
                "has {} regions, expected {regions}",
                op.regions.len()
            ))
        } else {
            op.kind.check(&ops, &res, &args).err()
        };
        // What the types alone do not say: indices, and nested blocks.
        if problem.is_none() {
            match &op.kind {
                OpKind::Load { index, .. } | OpKind::Store { index } => {
                    let buffer = ops[usize::from(matches!(op.kind, OpKind::Store { .. }))];
                    if let Some(Type::Buffer(b)) = buffer {
                        self.check_index(id, index, b.shape.len());
                    }
                }
                OpKind::For { .. } => {
                    let carried: Vec<Type> = ops.iter().filter_map(|t| t.cloned()).collect();
                    let b = op.regions[0].clone();
                    self.block(
                        &b,
                        BlockKind::For {
                            carries: !carried.is_empty(),
                        },
                        &carried,
                        &loc,
                    );
                }
                OpKind::Parallel { .. } => {
                    let b = op.regions[0].clone();
                    self.block(&b, BlockKind::Parallel, &[], &loc);
                }
                OpKind::Matmul(c) => {
                    // `check` saw two buffers and one region.
                    if let (Some(Type::Buffer(ta)), Some(Type::Buffer(tb))) = (ops[0], ops[1]) {
                        self.matmul(id, c, ta.shape.len(), tb.shape.len(), &loc);
                    }
                }
                _ => {}
            }
        }
        if let Some(p) = problem {
            self.err(loc.clone(), p);
        }
        let results = self.f.ops[id.0 as usize].results.clone();
        for r in results {
            self.define(r, &loc);
        }
    }
}

/// Whether an op in `b`, or in blocks nested in it, uses `v`.
fn uses_value(f: &Function, b: &Block, v: Value) -> bool {
    b.ops.iter().any(|id| {
        let Some(op) = f.ops.get(id.0 as usize) else {
            return false;
        };
        let in_index =
            |index: &[IndexExpr]| index.iter().any(|e| e.terms.iter().any(|(_, t)| *t == v));
        op.operands.contains(&v)
            || match &op.kind {
                OpKind::Load { index, .. } | OpKind::Store { index } => in_index(index),
                OpKind::Matmul(c) => in_index(&c.a) || in_index(&c.b),
                _ => false,
            }
            || op.regions.iter().any(|r| uses_value(f, r, v))
    })
}
