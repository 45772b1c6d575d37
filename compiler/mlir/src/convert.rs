//! Loop IR as upstream MLIR: `func`, `memref`, `scf`, `arith` and `math`.
//!
//! `dlc compile --emit mlir` prints the loop level in upstream dialects; `dlc run --backend
//! mlir` runs it through MLIR's own lowering (the tile level: `crate::tile`). The conversion (`compiler/mlir/src/convert.rs`)
//! maps each `loop.func` to a `func.func` over memrefs (a buffer's layout is its memref
//! type, `strided<[..], offset: N>` where it is not row-major from its storage's start;
//! `loop.view` is `memref.reinterpret_cast` to the view's offset), `loop.for` to `scf.for` with `iter_args`, `loop.parallel`
//! to `scf.parallel`, a padded load to an `scf.if` on the index being in bounds, and a
//! `loop.matmul` to loops that add each sum's products in increasing `k` (as the
//! interpreter does): `i, k, j` into a row of sums when the right operand's contiguous
//! axis follows the column counter (a row-major `b[k, j]`: read along rows), else `i, j,
//! k` with the sum carried by the innermost loop; then the epilogue per column. Scalar
//! ops keep the loop dialect's meaning: `arith.floordivsi` for integer division (toward
//! negative infinity; `arith.divui` for unsigned types, whose integers are signless `iN`
//! with `maxui`/`cmpi ult`/`extui`/`uitofp` chosen by the element type), `arith.maximumf`/`minimumf` (NaN propagates), `cmpf une` for `!=`,
//! `i1` compared unsigned, `rsqrt` as `1 / sqrt` (libm has no `rsqrtf`), integer `abs`
//! as a select (MLIR's lowering has no `math.absi`), transcendental functions of f16 and
//! bf16 in f32 rounded once (f64 in f64), float to integer through i64 (truncating, then wrapping as
//! the interpreter does).
//!
//! MLIR parses and verifies the module in process; `mlir-opt-22` reads the printed text
//! with no `--allow-unregistered-dialect`. To run, `dlc_mlir::LOWERING_PIPELINE` lowers it
//! (`convert-scf-to-cf`, math to libm and LLVM intrinsics, `expand-strided-metadata`,
//! `finalize-memref-to-llvm`, arith/index/cf to LLVM, `convert-func-to-llvm` with
//! bare-pointer memrefs, `reconcile-unrealized-casts`), MLIR's execution engine translates
//! it to LLVM IR and compiles it (O2), and the entry point is called through the packed
//! wrapper the engine generates for functions marked `llvm.emit_c_interface`
//! (`invokePacked` itself did not find it through the C API; the wrapper is looked up and
//! called directly). The functions run are prefixed `dlc_mlir_` so that an entry point
//! named like a libm function does not meet it in the engine's symbol table, and take one
//! more parameter, a `memref<i32>` status: an integer division by zero sets it and
//! divides by 1, and the run reports `@f: integer division by zero` (without the
//! division's place, which only the native back end reports). The module `--emit mlir`
//! prints has no status parameter: there a zero divisor is undefined behaviour, as
//! `arith.floordivsi` says. Where a CPU has no instruction for a 16-bit float
//! conversion, LLVM calls compiler-rt's routine (`__truncsfbf2` for every f32 -> bf16
//! without AVX-512 BF16, even for a bf16 value it carried through a `phi`; `__truncsfhf2`
//! and `__extendhfsf2` below F16C), which nothing in the process provides (Debian's libgcc
//! lacks `__truncsfbf2`): the engine is handed the three (`CONVERSION_ROUTINES`, through
//! the `half` crate), so this back end runs every element type on every CPU. The engine
//! compiles for this machine's CPU unless a function says otherwise, so under `DLC_CPU`
//! each function run carries `target_cpu` and an empty `target_features` (the CPU's own
//! features replace the machine's). Loops stay scalar and sequential: this back end exists to
//! cross-check the native one, both against the graph interpreter, not for speed.

use std::collections::HashMap;

use dlc_core::DType;
use dlc_core::scalar::BinaryOp;
use dlc_loop::{Block, Function, IndexExpr, Module, OpKind, Type, Value};

use crate::MlirError;
use crate::scalar::{Writer, scalar};

/// The module's text in upstream dialects; function `f` is named
/// `@{prefix}f`. For running (`run`), each function carries
/// `llvm.emit_c_interface` (so that MLIR's execution engine can call it
/// through a packed wrapper) and takes a last parameter `memref<i32>`, its
/// status: an integer division by a zero divisor sets it to 1 and divides
/// by 1 instead, as the native back end returns a status (without it, a zero
/// divisor is undefined behaviour, as `arith.floordivsi` says).
pub fn module_text(m: &Module, prefix: &str, run: bool) -> Result<String, MlirError> {
    let mut out = String::from("module {\n");
    for f in &m.functions {
        let mut g = Gen {
            f,
            w: Writer::new(&f.name, 1, run.then(|| "%status".to_string())),
            names: HashMap::new(),
        };
        g.function(prefix)?;
        out.push_str(&g.w.globals);
        out.push_str(&g.w.out);
    }
    out.push_str("}\n");
    Ok(out)
}

/// The text of one function.
struct Gen<'f> {
    f: &'f Function,
    w: Writer,
    /// Values spelled other than `%vN` (a matmul's counters and sum).
    names: HashMap<Value, String>,
}

impl Gen<'_> {
    fn name(&self, v: Value) -> String {
        self.names
            .get(&v)
            .cloned()
            .unwrap_or_else(|| format!("%v{}", v.0))
    }

    fn ty(&self, v: Value) -> String {
        self.f.ty(v).mlir()
    }

    fn dtype(&self, v: Value) -> Result<DType, MlirError> {
        match self.f.ty(v) {
            Type::Scalar(d) => Ok(*d),
            other => Err(MlirError::Invalid(format!(
                "@{}: value %{} is {other}, not a scalar",
                self.f.name, v.0
            ))),
        }
    }

    fn layout(&self, v: Value) -> Result<&dlc_core::Layout, MlirError> {
        match self.f.ty(v) {
            Type::Buffer(l) => Ok(l),
            other => Err(MlirError::Invalid(format!(
                "@{}: value %{} is {other}, not a buffer",
                self.f.name, v.0
            ))),
        }
    }

    /// An affine index as an `index` value.
    fn index(&mut self, e: &IndexExpr) -> String {
        let terms = e.terms.iter().map(|&(c, v)| (c, self.name(v))).collect();
        self.w.affine(terms, e.constant)
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

    /// The ops of a block; returns the operands of its terminator
    /// (`loop.yield`).
    fn block(&mut self, b: &Block) -> Result<Vec<Value>, MlirError> {
        for &id in &b.ops {
            let op = self.f.op(id).clone();
            let r = op.results.first().copied();
            match &op.kind {
                OpKind::Return => self.w.line("func.return"),
                OpKind::Yield => return Ok(op.operands.clone()),
                // A kernel group bounds top-level ops for the tile
                // conversion; upstream MLIR runs them as they are.
                OpKind::KernelBegin(_) | OpKind::KernelEnd => {}
                OpKind::Alloc => {
                    let r = r.ok_or_else(|| MlirError::Invalid("alloc without a result".into()))?;
                    let l = self.layout(r)?.clone();
                    self.w.alloc(&self.name(r), &l)?;
                }
                OpKind::Dealloc => {
                    let b = op.operands[0];
                    self.w
                        .line(&format!("memref.dealloc {} : {}", self.name(b), self.ty(b)));
                }
                OpKind::Global(values) => {
                    let r =
                        r.ok_or_else(|| MlirError::Invalid("global without a result".into()))?;
                    let l = self.layout(r)?.clone();
                    self.w.global(&self.name(r), &l, values)?;
                }
                OpKind::View => {
                    let (src, r) = (op.operands[0], r.unwrap_or(op.operands[0]));
                    let l = self.layout(r)?.clone();
                    let (name, src_name, src_ty) = (self.name(r), self.name(src), self.ty(src));
                    self.w.view(&name, &src_name, &src_ty, &l);
                }
                OpKind::Const(v) => {
                    let r = r.ok_or_else(|| MlirError::Invalid("const without a result".into()))?;
                    let d = self.dtype(r)?;
                    let c = self.w.constant(*v, d);
                    self.names.insert(r, c);
                }
                OpKind::Unary(u) => {
                    let x = op.operands[0];
                    let d = self.dtype(x)?;
                    let v = self.w.unary(*u, &self.name(x), d)?;
                    self.bind(r, v);
                }
                OpKind::Binary(bop) => {
                    let (x, y) = (self.name(op.operands[0]), self.name(op.operands[1]));
                    let d = self.dtype(op.operands[0])?;
                    let v = self.w.binary(*bop, &x, &y, d)?;
                    self.bind(r, v);
                }
                OpKind::Compare(c) => {
                    let (x, y) = (self.name(op.operands[0]), self.name(op.operands[1]));
                    let d = self.dtype(op.operands[0])?;
                    let v = self.w.compare(*c, &x, &y, d);
                    self.bind(r, v);
                }
                OpKind::Select => {
                    let [c, a, b] = [0, 1, 2].map(|i| self.name(op.operands[i]));
                    let d = self.dtype(op.operands[1])?;
                    let v = self
                        .w
                        .emit("arith.select", &format!("{c}, {a}, {b}"), scalar(d));
                    self.bind(r, v);
                }
                OpKind::Cast if r.is_some_and(|r| self.f.ty(r) == &dlc_loop::Type::Index) => {
                    let x = op.operands[0];
                    let v = self.w.index_cast(&self.name(x), self.dtype(x)?);
                    self.bind(r, v);
                }
                OpKind::Cast => {
                    let x = op.operands[0];
                    let to = r.map(|r| self.dtype(r)).transpose()?.unwrap_or(DType::F32);
                    let v = self.w.cast(&self.name(x), self.dtype(x)?, to);
                    self.bind(r, v);
                }
                OpKind::Load { index, pad } => {
                    let r = r.ok_or_else(|| MlirError::Invalid("load without a result".into()))?;
                    let v = self.load(op.operands[0], index, *pad, self.dtype(r)?)?;
                    self.names.insert(r, v);
                }
                OpKind::Store { index } => {
                    let (v, b) = (op.operands[0], op.operands[1]);
                    let idx: Vec<String> = index.iter().map(|e| self.index(e)).collect();
                    let line = format!(
                        "memref.store {}, {}[{}] : {}",
                        self.name(v),
                        self.name(b),
                        idx.join(", "),
                        self.ty(b)
                    );
                    self.w.line(&line);
                }
                OpKind::For { lo, hi, step } => self.for_loop(&op, *lo, *hi, *step)?,
                OpKind::Parallel { lo, hi } => {
                    let region = &op.regions[0];
                    let (lo, hi, one) = (
                        self.w.index_const(*lo),
                        self.w.index_const(*hi),
                        self.w.index_const(1),
                    );
                    let i = self.name(region.args[0]);
                    self.w.open(&format!(
                        "scf.parallel ({i}) = ({lo}) to ({hi}) step ({one}) {{"
                    ));
                    self.block(region)?;
                    self.w.line("scf.reduce");
                    self.w.close();
                }
                OpKind::Matmul(c) => self.matmul(&op, c)?,
            }
        }
        Ok(Vec::new())
    }

    /// Names result `r` by the value that computed it.
    fn bind(&mut self, r: Option<Value>, v: String) {
        if let Some(r) = r {
            self.names.insert(r, v);
        }
    }

    fn for_loop(
        &mut self,
        op: &dlc_loop::OpData,
        lo: i64,
        hi: i64,
        step: i64,
    ) -> Result<(), MlirError> {
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

    /// A `loop.matmul` as loops. Where the right operand's contiguous axis
    /// follows the column counter (a row-major `b[k, j]`), loops over rows
    /// `i`, depth `k` and columns `j` sum into a row of accumulators, read
    /// along `b`'s rows, then the epilogue runs for each column of the row;
    /// otherwise (`b[j, k]`, a transposed weight) `k` is innermost and
    /// carries the sum. Either way each sum adds its products in increasing
    /// `k`, as the interpreter does.
    fn matmul(
        &mut self,
        op: &dlc_loop::OpData,
        c: &dlc_loop::Contraction,
    ) -> Result<(), MlirError> {
        let region = &op.regions[0];
        let b = self.layout(op.operands[1])?;
        let jv = region.args[1];
        let along_columns = b
            .strides
            .iter()
            .position(|&s| s == 1)
            .and_then(|axis| c.b.get(axis))
            .is_some_and(|e| e.terms.iter().any(|&(_, v)| v == jv));
        if along_columns {
            self.matmul_rows(op, c)
        } else {
            self.matmul_dots(op, c)
        }
    }

    /// [`Gen::matmul`] with `k` innermost: one dot product per `(i, j)`.
    fn matmul_dots(
        &mut self,
        op: &dlc_loop::OpData,
        c: &dlc_loop::Contraction,
    ) -> Result<(), MlirError> {
        let region = &op.regions[0];
        let [iv, jv, kv, acc] = [0, 1, 2, 3].map(|i| region.args[i]);
        let d = self.dtype(acc)?;
        let [zero, one, m, n, k] = self.matmul_bounds(c);
        let (i, j) = (self.name(iv), self.name(jv));
        self.w
            .open(&format!("scf.for {i} = {zero} to {m} step {one} {{"));
        self.w
            .open(&format!("scf.for {j} = {zero} to {n} step {one} {{"));
        let init = self.w.constant(0.0, d);
        let (kk, sum, total) = (self.w.fresh(), self.w.fresh(), self.w.fresh());
        self.names.insert(kv, kk.clone());
        self.w.open(&format!(
            "{total} = scf.for {kk} = {zero} to {k} step {one} iter_args({sum} = {init}) -> ({}) {{",
            scalar(d)
        ));
        let p = self.product(op, c, d)?;
        let s = self.w.binary(BinaryOp::Add, &sum, &p, d)?;
        self.w.line(&format!("scf.yield {s} : {}", scalar(d)));
        self.w.close();
        // The epilogue sees the sum, and the depth counter at 0.
        self.names.insert(kv, zero);
        self.names.insert(acc, total);
        self.block(region)?;
        self.w.close();
        self.w.close();
        Ok(())
    }

    /// The index constants a `loop.matmul`'s loops run over: 0, 1, M, N, K.
    fn matmul_bounds(&mut self, c: &dlc_loop::Contraction) -> [String; 5] {
        [0, 1, c.m, c.n, c.k].map(|x| self.w.index_const(x))
    }

    /// One product of a `loop.matmul`'s operands, in the accumulator type.
    fn product(
        &mut self,
        op: &dlc_loop::OpData,
        c: &dlc_loop::Contraction,
        d: DType,
    ) -> Result<String, MlirError> {
        let mut x = Vec::new();
        for (buf, index) in [(op.operands[0], &c.a), (op.operands[1], &c.b)] {
            let e = self.layout(buf)?.dtype;
            let v = self.load(buf, index, None, e)?;
            x.push(self.w.cast(&v, e, d));
        }
        self.w.binary(BinaryOp::Mul, &x[0], &x[1], d)
    }

    /// [`Gen::matmul`] over rows: `i`, `k`, `j`, into a row of sums.
    fn matmul_rows(
        &mut self,
        op: &dlc_loop::OpData,
        c: &dlc_loop::Contraction,
    ) -> Result<(), MlirError> {
        let region = &op.regions[0];
        let [iv, jv, kv, acc] = [0, 1, 2, 3].map(|i| region.args[i]);
        let d = self.dtype(acc)?;
        let row_ty = format!("memref<{}x{}>", c.n, scalar(d));
        let row = self.w.fresh();
        self.w.line(&format!("{row} = memref.alloc() : {row_ty}"));
        let [zero, one, m, n, k] = self.matmul_bounds(c);
        let i = self.name(iv);
        self.w
            .open(&format!("scf.for {i} = {zero} to {m} step {one} {{"));
        // The row's sums start at zero.
        let j0 = self.w.fresh();
        self.w
            .open(&format!("scf.for {j0} = {zero} to {n} step {one} {{"));
        let init = self.w.constant(0.0, d);
        self.w
            .line(&format!("memref.store {init}, {row}[{j0}] : {row_ty}"));
        self.w.close();
        let (kk, jj) = (self.w.fresh(), self.w.fresh());
        self.names.insert(kv, kk.clone());
        self.names.insert(jv, jj.clone());
        self.w
            .open(&format!("scf.for {kk} = {zero} to {k} step {one} {{"));
        self.w
            .open(&format!("scf.for {jj} = {zero} to {n} step {one} {{"));
        let p = self.product(op, c, d)?;
        let sum = self.w.emit("memref.load", &format!("{row}[{jj}]"), &row_ty);
        let s = self.w.binary(BinaryOp::Add, &sum, &p, d)?;
        self.w
            .line(&format!("memref.store {s}, {row}[{jj}] : {row_ty}"));
        self.w.close();
        self.w.close();
        // The epilogue sees each column's sum, and the depth counter at 0.
        let j = self.w.fresh();
        self.names.insert(jv, j.clone());
        self.w
            .open(&format!("scf.for {j} = {zero} to {n} step {one} {{"));
        let total = self.w.emit("memref.load", &format!("{row}[{j}]"), &row_ty);
        self.names.insert(kv, zero);
        self.names.insert(acc, total);
        self.block(region)?;
        self.w.close();
        self.w.close();
        self.w.line(&format!("memref.dealloc {row} : {row_ty}"));
        Ok(())
    }

    /// An element of `b`, or `pad` where the index is out of bounds.
    fn load(
        &mut self,
        b: Value,
        index: &[IndexExpr],
        pad: Option<f64>,
        d: DType,
    ) -> Result<String, MlirError> {
        let shape = self.layout(b)?.shape.clone();
        let ty = self.ty(b);
        let idx: Vec<String> = index.iter().map(|e| self.index(e)).collect();
        let cond = if pad.is_some() {
            self.w.in_bounds(&idx, &shape)
        } else {
            None
        };
        let access = format!("{}[{}]", self.name(b), idx.join(", "));
        Ok(self.w.load(&access, &ty, cond, pad, d))
    }
}
