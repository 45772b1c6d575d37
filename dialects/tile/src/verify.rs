//! The tile dialect's part of the verifier: the generic one
//! ([`dlc_core::ir::verify`]: SSA, indices over index values, regions,
//! terminators) with where each op may stand (host code or a kernel), each
//! op's typing rule from its declaration, memory spaces, region arguments and
//! preparers. Every problem is reported, each located by the op's name in the
//! printed text (`%7 = tile.dot`, or `tile.store after %9`).

use dlc_core::VerifyError;
use dlc_core::ir::verify::{BlockKind, VerifyDialect, types_text};

use crate::ir::{Function, Module, OpData, OpId, Space, Tile, Type, Value};
use crate::ops::{OpKind, Place};

/// Every problem in `m`.
pub fn verify_module(m: &Module) -> Vec<VerifyError> {
    dlc_core::ir::verify::verify_module(m)
}

/// Where a block stands.
#[derive(Clone, Copy, PartialEq)]
pub enum Context {
    /// Host code: a function body.
    Host,
    /// In a kernel with this many grid axes.
    Program(usize),
}

impl VerifyDialect for Tile {
    type Context = Context;

    fn body_context() -> Context {
        Context::Host
    }

    fn check_function(f: &Function) -> Vec<String> {
        let mut problems = Vec::new();
        for t in &f.values {
            if let Type::Tile(t) = t {
                let len = t.shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d));
                if t.shape.is_empty()
                    || t.shape.contains(&0)
                    || len.is_none_or(|n| n > crate::ir::MAX_TILE_ELEMENTS)
                {
                    problems.push(format!(
                        "{t} is not a tile type (one or more axes, each at least 1, at most {} elements)",
                        crate::ir::MAX_TILE_ELEMENTS
                    ));
                }
            }
        }
        for (name, v) in &f.params {
            match f.values.get(v.0 as usize) {
                Some(Type::Buffer(b)) if b.space == Space::Global && b.offset != 0 => problems
                    .push(format!(
                        "parameter %{name} has an offset: a parameter is its own storage"
                    )),
                Some(Type::Buffer(b)) if b.space == Space::Global => {}
                _ => problems.push(format!("parameter %{name} is not a global buffer")),
            }
        }
        problems
    }

    fn check_op(f: &Function, id: OpId, cx: Context) -> Vec<String> {
        let op = f.op(id);
        let mut problems = Vec::new();
        match (op.kind.place(), cx) {
            (Place::Host, Context::Program(_)) => {
                problems.push("may only appear in a function body, outside kernels".into())
            }
            (Place::Program, Context::Host) => {
                problems.push("may only appear inside a tile.kernel".into())
            }
            _ => {}
        }
        let types = |vs: &[crate::Value]| -> Vec<&Type> { vs.iter().map(|v| f.ty(*v)).collect() };
        if let Err(e) = op.kind.check(&types(&op.operands), &types(&op.results)) {
            problems.push(e);
        }
        let result_space = op.results.first().and_then(|r| match f.ty(*r) {
            Type::Buffer(b) => Some(b.space),
            _ => None,
        });
        match (&op.kind, cx) {
            (OpKind::Alloc, Context::Host) if result_space != Some(Space::Global) => {
                problems.push("allocates outside a kernel, so in global memory".into())
            }
            (OpKind::Alloc, Context::Program(_)) if result_space == Some(Space::Global) => problems
                .push("allocates global memory inside a kernel (use scratch or shared)".into()),
            (OpKind::ProgramId { axis }, Context::Program(rank)) if *axis >= rank => problems.push(
                format!("reads grid axis {axis}, but the kernel's grid has {rank} axes"),
            ),
            (OpKind::Reduce { kind, .. }, _) if *kind == crate::ops::ReduceKind::Mean => problems
                .push("reduces by sum, max, min or prod (a mean is a sum and a division)".into()),
            (OpKind::For { .. }, _) => {
                let mut want = vec![Type::Index];
                want.extend(types(&op.operands).into_iter().cloned());
                let got: Vec<Type> = types(&op.regions[0].args).into_iter().cloned().collect();
                if got != want {
                    problems.push(format!(
                        "region arguments are {}, expected {}",
                        types_text(&got),
                        types_text(&want)
                    ));
                }
            }
            (OpKind::Kernel { .. }, _) if !op.regions[0].args.is_empty() => {
                problems.push("has one region without arguments".into())
            }
            _ => {}
        }
        problems
    }

    fn region(f: &Function, op: &OpData, cx: Context) -> (Context, BlockKind<Type>) {
        match &op.kind {
            OpKind::Kernel { grid, .. } => (Context::Program(grid.len()), BlockKind::Plain),
            OpKind::For { .. } => (
                cx,
                BlockKind::Loop(op.operands.iter().map(|v| f.ty(*v).clone()).collect()),
            ),
            _ => (cx, BlockKind::Plain),
        }
    }

    fn check_module(m: &Module) -> Vec<(String, String)> {
        let mut problems: Vec<(String, String)> = m
            .functions
            .iter()
            .filter_map(|f| {
                let p = f.prepare.as_ref()?;
                check_prepare(m, f, p).err().map(|e| (f.name.clone(), e))
            })
            .collect();
        for f in &m.functions {
            for &id in &f.body.ops {
                let op = f.op(id);
                if let OpKind::Prepared { func, index } = &op.kind
                    && let Err(e) = check_prepared(m, f, func, *index, op.results[0])
                {
                    problems.push((f.name.clone(), e));
                }
            }
        }
        problems
    }
}

/// Checks that `tile.prepared {func, index}` of `f` giving `v` reads a
/// preparer of constants: a function of `m` with no inputs that reads no
/// prepared buffer itself, whose result `index` has `v`'s type.
fn check_prepared(
    m: &Module,
    f: &Function,
    func: &str,
    index: usize,
    v: Value,
) -> Result<(), String> {
    let p = m
        .functions
        .iter()
        .find(|g| g.name == func)
        .ok_or_else(|| format!("tile.prepared reads @{func}, which is not defined"))?;
    if p.params.len() != p.outputs || p.prepare.is_some() || crate::interp::reads_prepared(p) {
        return Err(format!(
            "tile.prepared reads @{func}, which takes inputs or reads prepared buffers"
        ));
    }
    let results = p.results();
    let (n, r) = results.get(index).ok_or_else(|| {
        format!(
            "tile.prepared reads result {index} of @{func}, which has {}",
            results.len()
        )
    })?;
    if p.ty(*r) != f.ty(v) {
        return Err(format!(
            "tile.prepared gives {}, but result %{n} of @{func} is {}",
            f.ty(v),
            p.ty(*r)
        ));
    }
    Ok(())
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
