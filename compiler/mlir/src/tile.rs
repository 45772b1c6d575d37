//! Tile IR scheduled for a CPU as upstream MLIR: tiles are `tensor`
//! values, buffers memrefs.
//!
//! **The tile level** (`compiler/mlir/src/tile.rs`; `dlc compile --emit mlir-tile`, `dlc run
//! --backend mlir-tile`) converts tile IR scheduled for a target, so that MLIR also
//! cross-checks our schedules (packing, blocking, masks, program ids). Tiles are
//! `tensor` values: every op producing a tile is a `tensor.generate` whose body computes
//! one element from its coordinates, which makes every form of the tile dialect
//! expressible without pattern matching: a load evaluates its affine index with `#k` the
//! element's coordinate along axis `k` and reads the buffer, or the pad where the mask is
//! off or the index outside; masks compare coordinates with their limits; broadcasts,
//! reshapes (through the row-major position), transposes and new axes read the operand
//! at the corresponding coordinates; element-wise ops use the loop conversion's scalar
//! emitters (`compiler/mlir/src/scalar.rs`, shared); `tile.dot` sums its products in an
//! `scf.for` over the depth and adds the accumulator; `tile.reduce` combines along its
//! axis in an `scf.for`; a load of a rank-0 buffer is a scalar. A store is a loop nest
//! over the tile writing the elements its mask leaves on. A kernel is an `scf.parallel`
//! over its grid (program ids are its induction variables); barriers are dropped (one
//! CPU thread runs a program). `dlc_mlir::TILE_PIPELINE` runs MLIR's one-shot
//! bufferization (`allow-return-allocs-from-loops`: tiles carried by `tile.for` are new
//! values each iteration) and its deallocation pipeline, which frees every buffer,
//! `tile.alloc`'s included (it refuses frees it did not place, so the conversion writes
//! none), then `linalg` (what `tensor.generate` bufferizes to) as loops and the loop
//! level's pipeline. Runs use MLIR's C interface (`_mlir_ciface_`, memref descriptors)
//! rather than bare pointers, because the deallocation pipeline's helper function takes
//! dynamic memrefs, which the bare-pointer convention cannot pass. Tile modules compile
//! at LLVM O0 (W7's 32 unrolled steps are 28 000 lines of MLIR, which O2 is far too slow
//! for: performance.md). Not used yet: the `vector` dialect (a tile could be a vector and a
//! dot a `vector.contract`), which would make this path fast, not more correct.

use std::collections::HashMap;

use dlc_core::DType;
use dlc_core::scalar::{BinaryOp, ReduceKind};
use dlc_tile::{Affine, Block, Function, Module, OpData, OpKind, Type, Value};

use crate::MlirError;
use crate::scalar::{Writer, scalar};
use dlc_core::ir::OpDecl;

/// The module's text; as [`crate::convert::module_text`] for loop IR.
pub fn module_text(m: &Module, prefix: &str, run: bool) -> Result<String, MlirError> {
    let mut out = String::from("module {\n");
    for f in &m.functions {
        let mut g = Gen {
            f,
            w: Writer::new(&f.name, 1, run.then(|| "%status".to_string())),
            names: HashMap::new(),
            program: Vec::new(),
        };
        g.function(prefix)?;
        out.push_str(&g.w.globals);
        out.push_str(&g.w.out);
    }
    out.push_str("}\n");
    Ok(out)
}

struct Gen<'f> {
    f: &'f Function,
    w: Writer,
    /// Values spelled other than `%vN`.
    names: HashMap<Value, String>,
    /// The induction variables of the kernel being written.
    program: Vec<String>,
}

fn invalid(f: &Function, what: String) -> MlirError {
    MlirError::Invalid(format!("@{}: {what}", f.name))
}

/// A tile type's tensor.
fn tensor(shape: &[usize], d: DType) -> String {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("tensor<{}x{}>", dims.join("x"), scalar(d))
}

impl Gen<'_> {
    fn name(&self, v: Value) -> String {
        self.names
            .get(&v)
            .cloned()
            .unwrap_or_else(|| format!("%v{}", v.0))
    }

    /// The MLIR type of a value.
    fn ty(&self, v: Value) -> String {
        match self.f.ty(v) {
            Type::Index => "index".into(),
            Type::Scalar(d) => scalar(*d).into(),
            Type::Tile(t) => tensor(&t.shape, t.dtype),
            Type::Buffer(b) => b.layout.mlir(),
        }
    }

    fn dtype(&self, v: Value) -> Result<DType, MlirError> {
        self.f
            .ty(v)
            .dtype()
            .ok_or_else(|| invalid(self.f, format!("%{} has no element type", v.0)))
    }

    /// A tile's shape (empty for a scalar).
    fn shape(&self, v: Value) -> Vec<usize> {
        self.f
            .ty(v)
            .shape()
            .map(<[usize]>::to_vec)
            .unwrap_or_default()
    }

    fn layout(&self, v: Value) -> Result<&dlc_core::Layout, MlirError> {
        match self.f.ty(v) {
            Type::Buffer(b) => Ok(&b.layout),
            other => Err(invalid(
                self.f,
                format!("%{} is {other:?}, not a buffer", v.0),
            )),
        }
    }

    /// An affine index, `#k` being `coords[k]`.
    fn affine(&mut self, e: &Affine, coords: &[String]) -> Result<String, MlirError> {
        let mut parts: Vec<(i64, String)> =
            e.terms.iter().map(|&(c, v)| (c, self.name(v))).collect();
        for &(c, k) in &e.axes {
            let x = coords
                .get(k)
                .cloned()
                .ok_or_else(|| invalid(self.f, format!("index axis #{k} outside the tile")))?;
            parts.push((c, x));
        }
        Ok(self.w.affine(parts, e.constant))
    }

    fn function(&mut self, prefix: &str) -> Result<(), MlirError> {
        let params: Vec<String> = self
            .f
            .params
            .iter()
            .map(|(_, v)| format!("{}: {}", self.name(*v), self.ty(*v)))
            .collect();
        self.w
            .open_function(&format!("{prefix}{}", self.f.name), params);
        let body = self.f.body.clone();
        self.block(&body)?;
        self.w.close();
        Ok(())
    }

    /// The ops of a block; returns its terminator's operands (`tile.yield`).
    fn block(&mut self, b: &Block) -> Result<Vec<Value>, MlirError> {
        for &id in &b.ops {
            let op = self.f.op(id).clone();
            let r = op.results.first().copied();
            match &op.kind {
                OpKind::Return => self.w.line("func.return"),
                OpKind::Yield => return Ok(op.operands.clone()),
                // A hint the scalar loops here have no use for.
                OpKind::Barrier | OpKind::Prefetch { .. } => {}
                OpKind::Alloc => {
                    let r = r.ok_or_else(|| invalid(self.f, "alloc without a result".into()))?;
                    let l = self.layout(r)?.clone();
                    self.w.alloc(&self.name(r), &l)?;
                }
                // MLIR's deallocation pipeline frees every buffer (it
                // refuses frees it did not place).
                OpKind::Dealloc => {}
                OpKind::Global(values) => {
                    let r = r.ok_or_else(|| invalid(self.f, "global without a result".into()))?;
                    let l = self.layout(r)?.clone();
                    self.w.global(&self.name(r), &l, values)?;
                }
                OpKind::Prepared { func, .. } => {
                    return Err(MlirError::Unsupported(format!(
                        "tile.prepared (@{} reads what @{func} prepares once per process); \
                         lower with `dlc_driver::lower_for_tile`, which keeps constants in the \
                         kernels",
                        self.f.name
                    )));
                }
                OpKind::View => {
                    let (src, r) = (op.operands[0], r.unwrap_or(op.operands[0]));
                    let l = self.layout(r)?.clone();
                    let (name, src_name, src_ty) = (self.name(r), self.name(src), self.ty(src));
                    self.w.view(&name, &src_name, &src_ty, &l);
                }
                OpKind::Kernel { grid, .. } => self.kernel(&op, grid)?,
                OpKind::ProgramId { axis } => {
                    let p = self.program.get(*axis).cloned().ok_or_else(|| {
                        invalid(self.f, format!("program id {axis} outside a kernel's grid"))
                    })?;
                    if let Some(r) = r {
                        self.names.insert(r, p);
                    }
                }
                OpKind::Const(v) => {
                    let r = r.ok_or_else(|| invalid(self.f, "const without a result".into()))?;
                    let d = self.dtype(r)?;
                    let shape = self.shape(r);
                    let c = self.w.constant(*v, d);
                    let name = if shape.is_empty() {
                        c
                    } else {
                        self.w.emit("tensor.splat", &c, &tensor(&shape, d))
                    };
                    self.names.insert(r, name);
                }
                OpKind::Splat => {
                    let r = r.ok_or_else(|| invalid(self.f, "splat without a result".into()))?;
                    let x = self.name(op.operands[0]);
                    let ty = self.ty(r);
                    let v = self.w.emit("tensor.splat", &x, &ty);
                    self.names.insert(r, v);
                }
                // An integer scalar as an index (a gather's row).
                OpKind::Cast if r.is_some_and(|r| self.f.ty(r) == &dlc_tile::Type::Index) => {
                    let x = op.operands[0];
                    let v = self.w.index_cast(&self.name(x), self.dtype(x)?);
                    if let Some(r) = r {
                        self.names.insert(r, v);
                    }
                }
                OpKind::Unary(_)
                | OpKind::Binary(_)
                | OpKind::Compare(_)
                | OpKind::Select
                | OpKind::Cast => self.element_wise(&op)?,
                OpKind::Load { index, pad } => self.load(&op, index, *pad)?,
                OpKind::Store { index } => self.store(&op, index)?,
                OpKind::Mask { limits } => {
                    let r = r.ok_or_else(|| invalid(self.f, "mask without a result".into()))?;
                    let limits: Vec<String> = limits
                        .iter()
                        .map(|l| self.affine(l, &[]))
                        .collect::<Result<_, _>>()?;
                    self.generate(r, |g, e| {
                        let mut on: Option<String> = None;
                        for (x, l) in e.iter().zip(&limits) {
                            let lt = g.w.emit("arith.cmpi", &format!("slt, {x}, {l}"), "index");
                            on = Some(match on {
                                None => lt,
                                Some(a) => g.w.emit("arith.andi", &format!("{a}, {lt}"), "i1"),
                            });
                        }
                        Ok(on.unwrap_or_else(|| g.w.constant(1.0, DType::Bool)))
                    })?;
                }
                OpKind::Broadcast => {
                    let (x, r) = (op.operands[0], op.results[0]);
                    let from = self.shape(x);
                    self.generate(r, |g, e| {
                        let zero = g.w.index_const(0);
                        let src: Vec<String> = e
                            .iter()
                            .zip(&from)
                            .map(|(c, &n)| if n == 1 { zero.clone() } else { c.clone() })
                            .collect();
                        Ok(g.extract(x, &src))
                    })?;
                }
                // A layout is the GPU's; here a tile is one tensor.
                OpKind::Reshape | OpKind::ExpandDims { .. } | OpKind::ConvertLayout => {
                    let (x, r) = (op.operands[0], op.results[0]);
                    let (from, to) = (self.shape(x), self.shape(r));
                    self.generate(r, |g, e| {
                        // The element's row-major position, then its
                        // coordinates in the operand's shape.
                        let mut lin = g.w.index_const(0);
                        for (c, &n) in e.iter().zip(&to) {
                            let n = g.w.index_const(n as i64);
                            let m = g.w.emit("arith.muli", &format!("{lin}, {n}"), "index");
                            lin = g.w.emit("arith.addi", &format!("{m}, {c}"), "index");
                        }
                        let mut src = vec![String::new(); from.len()];
                        for (k, &n) in from.iter().enumerate().rev() {
                            let n = g.w.index_const(n as i64);
                            src[k] = g.w.emit("arith.remui", &format!("{lin}, {n}"), "index");
                            lin = g.w.emit("arith.divui", &format!("{lin}, {n}"), "index");
                        }
                        Ok(g.extract(x, &src))
                    })?;
                }
                OpKind::Trans { perm } => {
                    let (x, r) = (op.operands[0], op.results[0]);
                    let perm = perm.clone();
                    self.generate(r, |g, e| {
                        let mut src = vec![String::new(); e.len()];
                        for (i, &p) in perm.iter().enumerate() {
                            src[p] = e[i].clone();
                        }
                        Ok(g.extract(x, &src))
                    })?;
                }
                OpKind::Slice { offsets } => {
                    let (x, r) = (op.operands[0], op.results[0]);
                    let at = offsets
                        .iter()
                        .map(|e| self.affine(e, &[]))
                        .collect::<Result<Vec<_>, _>>()?;
                    self.generate(r, |g, e| {
                        let src: Vec<String> = e
                            .iter()
                            .zip(&at)
                            .map(|(c, o)| g.w.emit("arith.addi", &format!("{c}, {o}"), "index"))
                            .collect();
                        Ok(g.extract(x, &src))
                    })?;
                }
                OpKind::Dot { .. } => self.dot(&op)?,
                OpKind::Reduce { kind, axis } => self.reduce(&op, *kind, *axis)?,
                OpKind::For { lo, hi, step } => self.for_loop(&op, *lo, *hi, *step)?,
            }
        }
        Ok(Vec::new())
    }

    /// `%r = tensor.generate` whose element at coordinates `e` is what
    /// `element` computes (for a scalar `r`, that element itself).
    fn generate(
        &mut self,
        r: Value,
        element: impl FnOnce(&mut Self, &[String]) -> Result<String, MlirError>,
    ) -> Result<(), MlirError> {
        let shape = self.shape(r);
        if shape.is_empty() {
            let v = element(self, &[])?;
            self.names.insert(r, v);
            return Ok(());
        }
        let d = self.dtype(r)?;
        let coords: Vec<String> = shape.iter().map(|_| self.w.fresh()).collect();
        let name = self.w.fresh();
        let args: Vec<String> = coords.iter().map(|c| format!("{c}: index")).collect();
        self.w.open(&format!("{name} = tensor.generate {{"));
        self.w.line(&format!("^bb0({}):", args.join(", ")));
        let v = element(self, &coords)?;
        self.w.line(&format!("tensor.yield {v} : {}", scalar(d)));
        self.w.indent -= 1;
        self.w.line(&format!("}} : {}", tensor(&shape, d)));
        self.names.insert(r, name);
        Ok(())
    }

    /// Element `coords` of a tile, or the scalar itself.
    fn extract(&mut self, v: Value, coords: &[String]) -> String {
        if self.shape(v).is_empty() {
            return self.name(v);
        }
        let args = format!("{}[{}]", self.name(v), coords.join(", "));
        let ty = self.ty(v);
        self.w.emit("tensor.extract", &args, &ty)
    }

    fn element_wise(&mut self, op: &OpData) -> Result<(), MlirError> {
        let r = op.results[0];
        let operands = op.operands.clone();
        let kind = op.kind.clone();
        let one = |g: &mut Self, xs: &[String]| -> Result<String, MlirError> {
            let d0 = g.dtype(operands[0])?;
            match &kind {
                OpKind::Unary(u) => g.w.unary(*u, &xs[0], d0),
                OpKind::Binary(b) => g.w.binary(*b, &xs[0], &xs[1], d0),
                OpKind::Compare(c) => Ok(g.w.compare(*c, &xs[0], &xs[1], d0)),
                OpKind::Select => {
                    let d = g.dtype(operands[1])?;
                    Ok(g.w.emit(
                        "arith.select",
                        &format!("{}, {}, {}", xs[0], xs[1], xs[2]),
                        scalar(d),
                    ))
                }
                OpKind::Cast => {
                    let to = g.dtype(r)?;
                    Ok(g.w.cast(&xs[0], d0, to))
                }
                other => Err(invalid(
                    g.f,
                    format!("{} is not element-wise", other.name()),
                )),
            }
        };
        self.generate(r, |g, e| {
            let xs: Vec<String> = operands.iter().map(|v| g.extract(*v, e)).collect();
            one(g, &xs)
        })
    }

    fn load(&mut self, op: &OpData, index: &[Affine], pad: Option<f64>) -> Result<(), MlirError> {
        let (b, r) = (op.operands[0], op.results[0]);
        let mask = op.operands.get(1).copied();
        let shape = self.layout(b)?.shape.clone();
        let (bty, d) = (self.ty(b), self.dtype(r)?);
        let index = index.to_vec();
        self.generate(r, |g, e| {
            let idx: Vec<String> = index
                .iter()
                .map(|a| g.affine(a, e))
                .collect::<Result<_, _>>()?;
            // Where the pad is read: outside the buffer, and where the mask
            // is off (zero there without a pad).
            let mut cond = None;
            let mut pad = pad;
            if pad.is_none()
                && let Some(m) = mask
            {
                cond = Some(g.extract(m, e));
                pad = Some(0.0);
            } else if pad.is_some() {
                cond = g.w.in_bounds(&idx, &shape);
                if let Some(m) = mask {
                    let on = g.extract(m, e);
                    cond = Some(match cond {
                        None => on,
                        Some(c) => g.w.emit("arith.andi", &format!("{c}, {on}"), "i1"),
                    });
                }
            }
            let access = format!("{}[{}]", g.name(b), idx.join(", "));
            Ok(g.w.load(&access, &bty, cond, pad, d))
        })
    }

    /// Loops over a tile's coordinates, running `body` at each.
    fn for_each(
        &mut self,
        shape: &[usize],
        body: impl FnOnce(&mut Self, &[String]) -> Result<(), MlirError>,
    ) -> Result<(), MlirError> {
        let (zero, one) = (self.w.index_const(0), self.w.index_const(1));
        let mut coords = Vec::new();
        for &n in shape {
            let n = self.w.index_const(n as i64);
            let c = self.w.fresh();
            self.w
                .open(&format!("scf.for {c} = {zero} to {n} step {one} {{"));
            coords.push(c);
        }
        body(self, &coords)?;
        for _ in shape {
            self.w.close();
        }
        Ok(())
    }

    fn store(&mut self, op: &OpData, index: &[Affine]) -> Result<(), MlirError> {
        let (v, b) = (op.operands[0], op.operands[1]);
        let mask = op.operands.get(2).copied();
        let bty = self.ty(b);
        let shape = self.shape(v);
        let index = index.to_vec();
        self.for_each(&shape.clone(), |g, e| {
            let on = mask.map(|m| g.extract(m, e));
            if let Some(on) = &on {
                g.w.open(&format!("scf.if {on} {{"));
            }
            let x = g.extract(v, e);
            let idx: Vec<String> = index
                .iter()
                .map(|a| g.affine(a, e))
                .collect::<Result<_, _>>()?;
            let line = format!(
                "memref.store {x}, {}[{}] : {bty}",
                g.name(b),
                idx.join(", ")
            );
            g.w.line(&line);
            if on.is_some() {
                g.w.close();
            }
            Ok(())
        })
    }

    fn dot(&mut self, op: &OpData) -> Result<(), MlirError> {
        let [a, b, acc] = [0, 1, 2].map(|i| op.operands[i]);
        let r = op.results[0];
        let k = self.shape(a).get(1).copied().unwrap_or(1);
        let (da, db, d) = (self.dtype(a)?, self.dtype(b)?, self.dtype(r)?);
        self.generate(r, |g, e| {
            let (zero, one) = (g.w.index_const(0), g.w.index_const(1));
            let n = g.w.index_const(k as i64);
            let init = g.w.constant(0.0, d);
            let (p, s, total) = (g.w.fresh(), g.w.fresh(), g.w.fresh());
            g.w.open(&format!(
                "{total} = scf.for {p} = {zero} to {n} step {one} iter_args({s} = {init}) -> ({}) {{",
                scalar(d)
            ));
            let x = g.extract(a, &[e[0].clone(), p.clone()]);
            let y = g.extract(b, &[p.clone(), e[1].clone()]);
            let (x, y) = (g.w.cast(&x, da, d), g.w.cast(&y, db, d));
            let m = g.w.binary(BinaryOp::Mul, &x, &y, d)?;
            let sum = g.w.binary(BinaryOp::Add, &s, &m, d)?;
            g.w.line(&format!("scf.yield {sum} : {}", scalar(d)));
            g.w.close();
            let c = g.extract(acc, e);
            g.w.binary(BinaryOp::Add, &c, &total, d)
        })
    }

    fn reduce(&mut self, op: &OpData, kind: ReduceKind, axis: usize) -> Result<(), MlirError> {
        let (x, r) = (op.operands[0], op.results[0]);
        let len = self.shape(x).get(axis).copied().unwrap_or(1);
        let d = self.dtype(x)?;
        let combine = move |g: &mut Self, e: &[String]| -> Result<String, MlirError> {
            let (zero, one) = (g.w.index_const(0), g.w.index_const(1));
            let n = g.w.index_const(len as i64);
            let init = g.w.constant(kind.identity_in(d), d);
            let (i, acc, total) = (g.w.fresh(), g.w.fresh(), g.w.fresh());
            g.w.open(&format!(
                "{total} = scf.for {i} = {zero} to {n} step {one} iter_args({acc} = {init}) -> ({}) {{",
                scalar(d)
            ));
            let mut src: Vec<String> = e.to_vec();
            src.insert(axis, i);
            let v = g.extract(x, &src);
            let op = match kind {
                ReduceKind::Sum | ReduceKind::Mean => BinaryOp::Add,
                ReduceKind::Prod => BinaryOp::Mul,
                ReduceKind::Max => BinaryOp::Max,
                ReduceKind::Min => BinaryOp::Min,
            };
            let next = g.w.binary(op, &acc, &v, d)?;
            g.w.line(&format!("scf.yield {next} : {}", scalar(d)));
            g.w.close();
            if kind == ReduceKind::Mean {
                let n = g.w.constant(len as f64, d);
                return g.w.binary(BinaryOp::Div, &total, &n, d);
            }
            Ok(total)
        };
        self.generate(r, combine)
    }

    fn kernel(&mut self, op: &OpData, grid: &[usize]) -> Result<(), MlirError> {
        let zeros: Vec<String> = grid.iter().map(|_| self.w.index_const(0)).collect();
        let ones: Vec<String> = grid.iter().map(|_| self.w.index_const(1)).collect();
        let ends: Vec<String> = grid.iter().map(|&g| self.w.index_const(g as i64)).collect();
        let ids: Vec<String> = grid.iter().map(|_| self.w.fresh()).collect();
        self.w.open(&format!(
            "scf.parallel ({}) = ({}) to ({}) step ({}) {{",
            ids.join(", "),
            zeros.join(", "),
            ends.join(", "),
            ones.join(", ")
        ));
        let outer = std::mem::replace(&mut self.program, ids);
        let region = &op.regions[0];
        self.block(region)?;
        self.program = outer;
        self.w.line("scf.reduce");
        self.w.close();
        Ok(())
    }

    fn for_loop(&mut self, op: &OpData, lo: i64, hi: i64, step: i64) -> Result<(), MlirError> {
        let region = &op.regions[0];
        let i = self.name(region.args[0]);
        let results: Vec<String> = op.results.iter().map(|r| format!("%v{}", r.0)).collect();
        let types: Vec<String> = op.results.iter().map(|r| self.ty(*r)).collect();
        let carried: Vec<(String, String)> = region.args[1..]
            .iter()
            .zip(&op.operands)
            .map(|(a, init)| (self.name(*a), self.name(*init)))
            .collect();
        self.w
            .open_for(&i, [lo, hi, step], &results, &carried, &types);
        let yielded = self.block(region)?;
        let values: Vec<String> = yielded.iter().map(|v| self.name(*v)).collect();
        self.w.close_for(&values, &types);
        for r in &op.results {
            self.names.remove(r);
        }
        Ok(())
    }
}
