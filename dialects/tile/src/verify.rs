//! The tile dialect's verifier: SSA (each value defined once, used only
//! where visible), where each op may stand (host code or a kernel), each
//! op's typing rule from its declaration, region arguments and
//! terminators. Every problem is reported, each located by the op's name
//! in the printed text (`%7 = tile.dot`, or `tile.store after %9`).

use std::collections::HashMap;

use dlc_core::VerifyError;

use crate::ir::{Block, Function, Module, OpId, Space, Type, Value};
use crate::ops::{OpKind, Place};

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
        Checker::new(f, &mut errors).function();
    }
    for f in &m.functions {
        if let Some(p) = &f.prepare
            && let Err(message) = check_prepare(m, f, p)
        {
            errors.push(VerifyError {
                location: format!("@{}", f.name),
                message,
            });
        }
    }
    errors
}

/// Checks that function `p` of `m` prepares `f`'s last inputs: its results
/// are those inputs, by name, type and order, and its inputs are weights of
/// `f` (by name and type).
fn check_prepare(m: &Module, f: &Function, p: &str) -> Result<(), String> {
    let prep = m
        .functions
        .iter()
        .find(|g| g.name == p)
        .ok_or_else(|| format!("is prepared by @{p}, which is not defined"))?;
    if prep.prepare.is_some() {
        return Err(format!("is prepared by @{p}, which is itself prepared"));
    }
    let inputs = f.inputs();
    let results = prep.results();
    if results.is_empty() || results.len() > inputs.len() {
        return Err(format!(
            "is prepared by @{p}, whose {} results are not among its {} inputs",
            results.len(),
            inputs.len()
        ));
    }
    let first = inputs.len() - results.len();
    for (k, ((pn, pv), (n, v))) in results.iter().zip(&inputs[first..]).enumerate() {
        if pn != n || prep.ty(*pv) != f.ty(*v) {
            return Err(format!(
                "input %{n} ({}) is not result %{pn} ({}) of @{p}",
                f.ty(*v),
                prep.ty(*pv)
            ));
        }
        if !f.weights.contains(&(first + k)) {
            return Err(format!("prepared input %{n} is not a weight"));
        }
    }
    for (pn, pv) in prep.inputs() {
        let found = inputs[..first]
            .iter()
            .enumerate()
            .find(|(_, (n, _))| n == pn);
        match found {
            Some((i, (_, v))) if f.ty(*v) == prep.ty(*pv) && f.weights.contains(&i) => {}
            _ => {
                return Err(format!(
                    "@{p} reads %{pn}, which is not a weight of this function of that type"
                ));
            }
        }
    }
    Ok(())
}

/// The printed name of every op, as the text printer numbers values:
/// `%3 = tile.add` for an op with results, `tile.store after %3` for one
/// without.
fn op_labels(f: &Function) -> HashMap<OpId, String> {
    fn walk(
        f: &Function,
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

#[derive(Clone, Copy, PartialEq)]
enum Context {
    Host,
    /// In a kernel with this many grid axes.
    Program(usize),
}

struct Checker<'a> {
    f: &'a Function,
    errors: &'a mut Vec<VerifyError>,
    defined: Vec<bool>,
    visible: Vec<Value>,
    op_seen: Vec<bool>,
    labels: HashMap<OpId, String>,
}

impl<'a> Checker<'a> {
    fn new(f: &'a Function, errors: &'a mut Vec<VerifyError>) -> Self {
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
        for t in &self.f.values {
            if let Type::Tile(t) = t {
                let len = t.shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d));
                if t.shape.is_empty()
                    || t.shape.contains(&0)
                    || len.is_none_or(|n| n > crate::ir::MAX_TILE_ELEMENTS)
                {
                    self.err(
                        loc.clone(),
                        format!(
                            "{t} is not a tile type (one or more axes, each at least 1, at most {} elements)",
                            crate::ir::MAX_TILE_ELEMENTS
                        ),
                    );
                }
            }
        }
        for (name, v) in &self.f.params {
            self.define(*v, &loc);
            match self.f.values.get(v.0 as usize) {
                Some(Type::Buffer(b)) if b.space == Space::Global && b.offset != 0 => self.err(
                    loc.clone(),
                    format!("parameter %{name} has an offset: a parameter is its own storage"),
                ),
                Some(Type::Buffer(b)) if b.space == Space::Global => {}
                _ => self.err(
                    loc.clone(),
                    format!("parameter %{name} is not a global buffer"),
                ),
            }
        }
        if self.f.outputs > self.f.params.len() {
            self.err(loc.clone(), "has more outputs than parameters".into());
        }
        let inputs = self.f.params.len().saturating_sub(self.f.outputs);
        if let Some(w) = self.f.weights.iter().find(|&&w| w >= inputs) {
            self.err(loc.clone(), format!("weight {w} is not an input parameter"));
        }
        self.block(&self.f.body, Context::Host, None, &loc);
    }

    /// Checks a block; `carried` is `Some(types)` in a `tile.for` body.
    fn block(&mut self, b: &'a Block, cx: Context, carried: Option<&[Type]>, loc: &str) {
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
            match (&op.kind, cx, carried) {
                (OpKind::Return, Context::Host, None) if last => {}
                (OpKind::Return, ..) => self.err(
                    self.loc(id),
                    "must be the last op of a function body".into(),
                ),
                (OpKind::Yield, _, Some(types)) if last => {
                    let got: Vec<Type> = op
                        .operands
                        .iter()
                        .filter_map(|v| self.f.values.get(v.0 as usize).cloned())
                        .collect();
                    if got != types {
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
                (OpKind::Yield, ..) => self.err(
                    self.loc(id),
                    "must be the last op of a tile.for body".into(),
                ),
                _ => {}
            }
            self.op(id, cx);
        }
        let ends_with = |k: fn(&OpKind) -> bool| {
            b.ops
                .last()
                .and_then(|o| self.f.ops.get(o.0 as usize))
                .is_some_and(|o| k(&o.kind))
        };
        match (cx, carried) {
            (Context::Host, None) if !ends_with(|k| matches!(k, OpKind::Return)) => self.err(
                loc.into(),
                "the function body does not end with tile.return".into(),
            ),
            (_, Some(types)) if !types.is_empty() && !ends_with(|k| matches!(k, OpKind::Yield)) => {
                self.err(
                    loc.into(),
                    "a tile.for carrying values must end with tile.yield".into(),
                )
            }
            _ => {}
        }
        self.visible.truncate(depth);
    }

    fn op(&mut self, id: OpId, cx: Context) {
        let op: &'a crate::ir::OpData = &self.f.ops[id.0 as usize];
        let loc = self.loc(id);
        match (op.kind.place(), cx) {
            (Place::Host, Context::Program(_)) => self.err(
                loc.clone(),
                "may only appear in a function body, outside kernels".into(),
            ),
            (Place::Program, Context::Host) => {
                self.err(loc.clone(), "may only appear inside a tile.kernel".into())
            }
            _ => {}
        }
        for v in &op.operands {
            if !self.visible.contains(v) {
                self.err(
                    loc.clone(),
                    format!("uses value {} where it is not visible", v.0),
                );
            }
        }
        if let Some(index) = op.kind.index() {
            for e in index {
                for (_, v) in &e.terms {
                    if !self.visible.contains(v) {
                        self.err(
                            loc.clone(),
                            format!("index uses value {} where it is not visible", v.0),
                        );
                    } else if self.f.values.get(v.0 as usize) != Some(&Type::Index) {
                        self.err(
                            loc.clone(),
                            format!("index uses value {}, which is not an index", v.0),
                        );
                    }
                }
            }
        }
        let operand_types: Option<Vec<&Type>> = op
            .operands
            .iter()
            .map(|v| self.f.values.get(v.0 as usize))
            .collect();
        let result_types: Option<Vec<&Type>> = op
            .results
            .iter()
            .map(|v| self.f.values.get(v.0 as usize))
            .collect();
        match (operand_types, result_types) {
            (Some(o), Some(r)) => {
                if let Err(e) = op.kind.check(&o, &r) {
                    self.err(loc.clone(), e);
                }
            }
            _ => self.err(loc.clone(), "names a value that does not exist".into()),
        }
        let result_buffer =
            op.results
                .first()
                .and_then(|r| match self.f.values.get(r.0 as usize) {
                    Some(Type::Buffer(b)) => Some(b.space),
                    _ => None,
                });
        match (&op.kind, cx) {
            (OpKind::Alloc, Context::Host) if result_buffer != Some(Space::Global) => self.err(
                loc.clone(),
                "allocates outside a kernel, so in global memory".into(),
            ),
            (OpKind::Alloc, Context::Program(_)) if result_buffer == Some(Space::Global) => self
                .err(
                    loc.clone(),
                    "allocates global memory inside a kernel (use scratch or shared)".into(),
                ),
            (OpKind::ProgramId { axis }, Context::Program(rank)) if *axis >= rank => self.err(
                loc.clone(),
                format!("reads grid axis {axis}, but the kernel's grid has {rank} axes"),
            ),
            (OpKind::Reduce { kind, .. }, _) if *kind == crate::ops::ReduceKind::Mean => self.err(
                loc.clone(),
                "reduces by sum, max, min or prod (a mean is a sum and a division)".into(),
            ),
            _ => {}
        }
        let depth = self.visible.len();
        match &op.kind {
            OpKind::Kernel { grid, .. } => {
                if op.regions.len() != 1 || !op.regions[0].args.is_empty() {
                    self.err(loc.clone(), "has one region without arguments".into());
                }
                if let Some(r) = op.regions.first() {
                    self.block(r, Context::Program(grid.len()), None, &loc);
                }
            }
            OpKind::For { .. } => {
                let carried: Vec<Type> = op
                    .operands
                    .iter()
                    .filter_map(|v| self.f.values.get(v.0 as usize).cloned())
                    .collect();
                match op.regions.first() {
                    Some(r) if op.regions.len() == 1 => {
                        let mut want = vec![Type::Index];
                        want.extend(carried.iter().cloned());
                        let got: Vec<Type> = r
                            .args
                            .iter()
                            .filter_map(|v| self.f.values.get(v.0 as usize).cloned())
                            .collect();
                        if got != want {
                            self.err(
                                loc.clone(),
                                format!(
                                    "region arguments are {}, expected {}",
                                    types_text(&got),
                                    types_text(&want)
                                ),
                            );
                        }
                        self.block(r, cx, Some(&carried), &loc);
                    }
                    _ => self.err(loc.clone(), "has one region".into()),
                }
            }
            _ if !op.regions.is_empty() => self.err(loc.clone(), "has no regions".into()),
            _ => {}
        }
        self.visible.truncate(depth);
        for r in &op.results {
            self.define(*r, &loc);
        }
    }
}

fn types_text(ts: &[Type]) -> String {
    if ts.is_empty() {
        return "nothing".into();
    }
    ts.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
