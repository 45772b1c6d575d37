//! Loop IR as upstream MLIR: `func`, `memref`, `scf`, `arith` and `math`.
//!
//! Each `loop.func` becomes a `func.func` over memrefs (a buffer's layout is
//! its memref type, strided where it is not row-major); loops become
//! `scf.for` (with `iter_args` for carried values) and `scf.parallel`;
//! a `loop.matmul` becomes three `scf.for`s, the innermost carrying the sum,
//! followed by its epilogue; a load with a pad value becomes an `scf.if` on
//! the index being in bounds. Scalar ops keep the loop dialect's meaning
//! (`dlc_core::scalar`): integer division rounds toward negative infinity
//! (`arith.floordivsi`), `maximum`/`minimum` propagate NaN
//! (`arith.maximumf`), `!=` is true for NaN (`arith.cmpf une`), and bool is
//! `i1` compared unsigned. Transcendental functions of f16 and bf16 are
//! computed in f32 and rounded once, as the interpreter rounds each op's
//! result. An integer division by zero has no status in MLIR: it is
//! undefined behaviour there (see [`crate::has_integer_division`]).

use std::collections::HashMap;

use dlc_core::DType;
use dlc_core::scalar::{BinaryOp, CmpOp, UnaryOp};
use dlc_loop::{Block, Function, IndexExpr, Module, OpKind, Type, Value};

use crate::MlirError;

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
            out: String::new(),
            indent: 1,
            names: HashMap::new(),
            next: 0,
            status: run.then(|| "%status".to_string()),
        };
        g.function(prefix)?;
        out.push_str(&g.out);
    }
    out.push_str("}\n");
    Ok(out)
}

/// The text of one function.
struct Gen<'f> {
    f: &'f Function,
    out: String,
    indent: usize,
    /// Values spelled other than `%vN` (a matmul's counters and sum).
    names: HashMap<Value, String>,
    next: usize,
    /// The status parameter, when running.
    status: Option<String>,
}

fn unsupported(what: String) -> MlirError {
    MlirError::Unsupported(what)
}

/// The MLIR type of a scalar.
fn scalar(d: DType) -> &'static str {
    d.mlir_name()
}

impl Gen<'_> {
    fn line(&mut self, text: &str) {
        for _ in 0..self.indent {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    /// A line opening a region (ending in `{`), and the region's indent.
    fn open(&mut self, head: &str) {
        self.line(head);
        self.indent += 1;
    }

    /// The end of the region [`Gen::open`] opened.
    fn close(&mut self) {
        self.indent -= 1;
        self.line("}");
    }

    fn name(&self, v: Value) -> String {
        self.names
            .get(&v)
            .cloned()
            .unwrap_or_else(|| format!("%v{}", v.0))
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%t{}", self.next)
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

    /// `%t = OP ARGS : TYPE`, returning `%t`.
    fn emit(&mut self, op: &str, args: &str, ty: &str) -> String {
        let t = self.fresh();
        self.line(&format!("{t} = {op} {args} : {ty}"));
        t
    }

    fn index_const(&mut self, c: i64) -> String {
        self.emit("arith.constant", &c.to_string(), "index")
    }

    /// A constant of scalar type `d`.
    fn constant(&mut self, v: f64, d: DType) -> String {
        let text = match d {
            DType::Bool => u8::from(v != 0.0).to_string(),
            DType::I32 | DType::I64 => format!("{}", v as i64),
            _ if v.is_finite() => dlc_core::format_float(v),
            DType::F32 => format!("0x{:08X}", (v as f32).to_bits()),
            DType::F16 => format!("0x{:04X}", half::f16::from_f64(v).to_bits()),
            DType::BF16 => format!("0x{:04X}", half::bf16::from_f64(v).to_bits()),
        };
        self.emit("arith.constant", &text, scalar(d))
    }

    /// An affine index as an `index` value.
    fn index(&mut self, e: &IndexExpr) -> String {
        let mut acc: Option<String> = None;
        for &(c, v) in &e.terms {
            let term = if c == 1 {
                self.name(v)
            } else {
                let k = self.index_const(c);
                let v = self.name(v);
                self.emit("arith.muli", &format!("{v}, {k}"), "index")
            };
            acc = Some(match acc {
                None => term,
                Some(a) => self.emit("arith.addi", &format!("{a}, {term}"), "index"),
            });
        }
        match acc {
            None => self.index_const(e.constant),
            Some(a) if e.constant == 0 => a,
            Some(a) => {
                let k = self.index_const(e.constant);
                self.emit("arith.addi", &format!("{a}, {k}"), "index")
            }
        }
    }

    fn function(&mut self, prefix: &str) -> Result<(), MlirError> {
        let mut params: Vec<String> = self
            .f
            .params
            .iter()
            .map(|(_, v)| format!("{}: {}", self.name(*v), self.ty(*v)))
            .collect();
        if let Some(status) = &self.status {
            params.push(format!("{status}: memref<i32>"));
        }
        let c_interface = self.status.is_some();
        self.open(&format!(
            "func.func @{prefix}{}({}){} {{",
            self.f.name,
            params.join(", "),
            if c_interface {
                " attributes {llvm.emit_c_interface}"
            } else {
                ""
            }
        ));
        let body = self.f.body.clone();
        self.block(&body)?;
        self.close();
        Ok(())
    }

    /// The ops of a block; returns the operands of its terminator
    /// (`loop.yield`).
    fn block(&mut self, b: &Block) -> Result<Vec<Value>, MlirError> {
        for &id in &b.ops {
            let op = self.f.op(id).clone();
            let r = op.results.first().copied();
            match &op.kind {
                OpKind::Return => self.line("func.return"),
                OpKind::Yield => return Ok(op.operands.clone()),
                OpKind::Alloc => {
                    let r = r.ok_or_else(|| MlirError::Invalid("alloc without a result".into()))?;
                    let l = self.layout(r)?;
                    if !l.is_contiguous() {
                        return Err(unsupported(format!(
                            "@{}: an allocation with strides ({l})",
                            self.f.name
                        )));
                    }
                    let ty = l.mlir();
                    self.line(&format!("{} = memref.alloc() : {ty}", self.name(r)));
                }
                OpKind::Dealloc => {
                    let b = op.operands[0];
                    self.line(&format!("memref.dealloc {} : {}", self.name(b), self.ty(b)));
                }
                OpKind::View => {
                    let (src, r) = (op.operands[0], r.unwrap_or(op.operands[0]));
                    let l = self.layout(r)?;
                    let dims = |xs: &[usize]| {
                        xs.iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    let line = format!(
                        "{} = memref.reinterpret_cast {} to offset: [0], sizes: [{}], strides: [{}] : {} to {}",
                        self.name(r),
                        self.name(src),
                        dims(&l.shape),
                        dims(&l.strides),
                        self.ty(src),
                        l.mlir()
                    );
                    self.line(&line);
                }
                OpKind::Const(v) => {
                    let r = r.ok_or_else(|| MlirError::Invalid("const without a result".into()))?;
                    let d = self.dtype(r)?;
                    let c = self.constant(*v, d);
                    self.names.insert(r, c);
                }
                OpKind::Unary(u) => {
                    let x = op.operands[0];
                    let d = self.dtype(x)?;
                    let v = self.unary(*u, &self.name(x), d)?;
                    self.bind(r, v);
                }
                OpKind::Binary(bop) => {
                    let (x, y) = (self.name(op.operands[0]), self.name(op.operands[1]));
                    let d = self.dtype(op.operands[0])?;
                    let v = self.binary(*bop, &x, &y, d)?;
                    self.bind(r, v);
                }
                OpKind::Compare(c) => {
                    let (x, y) = (self.name(op.operands[0]), self.name(op.operands[1]));
                    let d = self.dtype(op.operands[0])?;
                    let v = self.compare(*c, &x, &y, d);
                    self.bind(r, v);
                }
                OpKind::Select => {
                    let [c, a, b] = [0, 1, 2].map(|i| self.name(op.operands[i]));
                    let d = self.dtype(op.operands[1])?;
                    let v = self.emit("arith.select", &format!("{c}, {a}, {b}"), scalar(d));
                    self.bind(r, v);
                }
                OpKind::Cast => {
                    let x = op.operands[0];
                    let to = r.map(|r| self.dtype(r)).transpose()?.unwrap_or(DType::F32);
                    let v = self.cast(&self.name(x), self.dtype(x)?, to);
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
                    self.line(&line);
                }
                OpKind::For { lo, hi, step } => self.for_loop(&op, *lo, *hi, *step)?,
                OpKind::Parallel { lo, hi } => {
                    let region = &op.regions[0];
                    let (lo, hi, one) = (
                        self.index_const(*lo),
                        self.index_const(*hi),
                        self.index_const(1),
                    );
                    let i = self.name(region.args[0]);
                    self.open(&format!(
                        "scf.parallel ({i}) = ({lo}) to ({hi}) step ({one}) {{"
                    ));
                    self.block(region)?;
                    self.line("scf.reduce");
                    self.close();
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
        let (lo, hi, step) = (
            self.index_const(lo),
            self.index_const(hi),
            self.index_const(step),
        );
        let i = self.name(region.args[0]);
        let results: Vec<String> = op.results.iter().map(|r| format!("%v{}", r.0)).collect();
        let types: Vec<String> = op.results.iter().map(|r| self.ty(*r)).collect();
        let carried: Vec<String> = region.args[1..]
            .iter()
            .zip(&op.operands)
            .map(|(a, init)| format!("{} = {}", self.name(*a), self.name(*init)))
            .collect();
        let head = if results.is_empty() {
            format!("scf.for {i} = {lo} to {hi} step {step} {{")
        } else {
            format!(
                "{} = scf.for {i} = {lo} to {hi} step {step} iter_args({}) -> ({}) {{",
                results.join(", "),
                carried.join(", "),
                types.join(", ")
            )
        };
        self.open(&head);
        let yielded = self.block(region)?;
        if !results.is_empty() {
            let values: Vec<String> = yielded.iter().map(|v| self.name(*v)).collect();
            self.line(&format!(
                "scf.yield {} : {}",
                values.join(", "),
                types.join(", ")
            ));
        }
        self.close();
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
        self.open(&format!("scf.for {i} = {zero} to {m} step {one} {{"));
        self.open(&format!("scf.for {j} = {zero} to {n} step {one} {{"));
        let init = self.constant(0.0, d);
        let (kk, sum, total) = (self.fresh(), self.fresh(), self.fresh());
        self.names.insert(kv, kk.clone());
        self.open(&format!(
            "{total} = scf.for {kk} = {zero} to {k} step {one} iter_args({sum} = {init}) -> ({}) {{",
            scalar(d)
        ));
        let p = self.product(op, c, d)?;
        let s = self.binary(BinaryOp::Add, &sum, &p, d)?;
        self.line(&format!("scf.yield {s} : {}", scalar(d)));
        self.close();
        // The epilogue sees the sum, and the depth counter at 0.
        self.names.insert(kv, zero);
        self.names.insert(acc, total);
        self.block(region)?;
        self.close();
        self.close();
        Ok(())
    }

    /// The index constants a `loop.matmul`'s loops run over: 0, 1, M, N, K.
    fn matmul_bounds(&mut self, c: &dlc_loop::Contraction) -> [String; 5] {
        [0, 1, c.m, c.n, c.k].map(|x| self.index_const(x))
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
            x.push(self.cast(&v, e, d));
        }
        self.binary(BinaryOp::Mul, &x[0], &x[1], d)
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
        let row = self.fresh();
        self.line(&format!("{row} = memref.alloc() : {row_ty}"));
        let [zero, one, m, n, k] = self.matmul_bounds(c);
        let i = self.name(iv);
        self.open(&format!("scf.for {i} = {zero} to {m} step {one} {{"));
        // The row's sums start at zero.
        let j0 = self.fresh();
        self.open(&format!("scf.for {j0} = {zero} to {n} step {one} {{"));
        let init = self.constant(0.0, d);
        self.line(&format!("memref.store {init}, {row}[{j0}] : {row_ty}"));
        self.close();
        let (kk, jj) = (self.fresh(), self.fresh());
        self.names.insert(kv, kk.clone());
        self.names.insert(jv, jj.clone());
        self.open(&format!("scf.for {kk} = {zero} to {k} step {one} {{"));
        self.open(&format!("scf.for {jj} = {zero} to {n} step {one} {{"));
        let p = self.product(op, c, d)?;
        let sum = self.emit("memref.load", &format!("{row}[{jj}]"), &row_ty);
        let s = self.binary(BinaryOp::Add, &sum, &p, d)?;
        self.line(&format!("memref.store {s}, {row}[{jj}] : {row_ty}"));
        self.close();
        self.close();
        // The epilogue sees each column's sum, and the depth counter at 0.
        let j = self.fresh();
        self.names.insert(jv, j.clone());
        self.open(&format!("scf.for {j} = {zero} to {n} step {one} {{"));
        let total = self.emit("memref.load", &format!("{row}[{j}]"), &row_ty);
        self.names.insert(kv, zero);
        self.names.insert(acc, total);
        self.block(region)?;
        self.close();
        self.close();
        self.line(&format!("memref.dealloc {row} : {row_ty}"));
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
        let load = |g: &mut Self| {
            g.emit(
                "memref.load",
                &format!("{}[{}]", g.name(b), idx.join(", ")),
                &ty,
            )
        };
        let Some(pad) = pad else {
            return Ok(load(self));
        };
        let mut inside: Option<String> = None;
        for (i, dim) in idx.iter().zip(&shape) {
            let zero = self.index_const(0);
            let n = self.index_const(*dim as i64);
            let lo = self.emit("arith.cmpi", &format!("sge, {i}, {zero}"), "index");
            let hi = self.emit("arith.cmpi", &format!("slt, {i}, {n}"), "index");
            let both = self.emit("arith.andi", &format!("{lo}, {hi}"), "i1");
            inside = Some(match inside {
                None => both,
                Some(a) => self.emit("arith.andi", &format!("{a}, {both}"), "i1"),
            });
        }
        let Some(inside) = inside else {
            return Ok(load(self));
        };
        let r = self.fresh();
        self.open(&format!("{r} = scf.if {inside} -> ({}) {{", scalar(d)));
        let v = load(self);
        self.line(&format!("scf.yield {v} : {}", scalar(d)));
        self.indent -= 1;
        self.line("} else {");
        self.indent += 1;
        let p = self.constant(pad, d);
        self.line(&format!("scf.yield {p} : {}", scalar(d)));
        self.close();
        Ok(r)
    }

    fn unary(&mut self, u: UnaryOp, x: &str, d: DType) -> Result<String, MlirError> {
        let t = scalar(d);
        if d.is_int() || d == DType::Bool {
            return Ok(match u {
                UnaryOp::Neg => {
                    let zero = self.constant(0.0, d);
                    self.emit("arith.subi", &format!("{zero}, {x}"), t)
                }
                UnaryOp::Relu => {
                    let zero = self.constant(0.0, d);
                    self.emit("arith.maxsi", &format!("{x}, {zero}"), t)
                }
                UnaryOp::Abs => {
                    // x < 0 ? 0 - x : x (MLIR's lowering has no math.absi).
                    let zero = self.constant(0.0, d);
                    let neg = self.emit("arith.cmpi", &format!("slt, {x}, {zero}"), t);
                    let minus = self.emit("arith.subi", &format!("{zero}, {x}"), t);
                    self.emit("arith.select", &format!("{neg}, {minus}, {x}"), t)
                }
                other => {
                    return Err(MlirError::Invalid(format!(
                        "@{}: {} of an integer",
                        self.f.name,
                        other.name()
                    )));
                }
            });
        }
        match u {
            UnaryOp::Neg => return Ok(self.emit("arith.negf", x, t)),
            UnaryOp::Abs => return Ok(self.emit("math.absf", x, t)),
            UnaryOp::Relu => {
                let zero = self.constant(0.0, d);
                let neg = self.emit("arith.cmpf", &format!("olt, {x}, {zero}"), t);
                return Ok(self.emit("arith.select", &format!("{neg}, {zero}, {x}"), t));
            }
            _ => {}
        }
        // Transcendental functions in f32 (f16 and bf16 rounded once).
        let x = self.cast(x, d, DType::F32);
        let f = "f32";
        let v = match u {
            UnaryOp::Exp => self.emit("math.exp", &x, f),
            UnaryOp::Log => self.emit("math.log", &x, f),
            UnaryOp::Sqrt => self.emit("math.sqrt", &x, f),
            UnaryOp::Rsqrt => {
                // 1 / sqrt(x), as the interpreter computes it (libm has no
                // rsqrtf for `convert-math-to-libm` to call).
                let one = self.constant(1.0, DType::F32);
                let r = self.emit("math.sqrt", &x, f);
                self.emit("arith.divf", &format!("{one}, {r}"), f)
            }
            UnaryOp::Tanh => self.emit("math.tanh", &x, f),
            UnaryOp::Sigmoid => {
                let one = self.constant(1.0, DType::F32);
                let n = self.emit("arith.negf", &x, f);
                let e = self.emit("math.exp", &n, f);
                let s = self.emit("arith.addf", &format!("{one}, {e}"), f);
                self.emit("arith.divf", &format!("{one}, {s}"), f)
            }
            UnaryOp::Gelu => {
                let c = self.constant((2.0 / std::f64::consts::PI).sqrt(), DType::F32);
                let a = self.constant(0.044715, DType::F32);
                let half = self.constant(0.5, DType::F32);
                let one = self.constant(1.0, DType::F32);
                let x2 = self.emit("arith.mulf", &format!("{x}, {x}"), f);
                let x3 = self.emit("arith.mulf", &format!("{x2}, {x}"), f);
                let ax3 = self.emit("arith.mulf", &format!("{a}, {x3}"), f);
                let inner = self.emit("arith.addf", &format!("{x}, {ax3}"), f);
                let scaled = self.emit("arith.mulf", &format!("{c}, {inner}"), f);
                let t = self.emit("math.tanh", &scaled, f);
                let onep = self.emit("arith.addf", &format!("{one}, {t}"), f);
                let hx = self.emit("arith.mulf", &format!("{half}, {x}"), f);
                self.emit("arith.mulf", &format!("{hx}, {onep}"), f)
            }
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => {
                return Err(MlirError::Invalid(format!(
                    "@{}: {} out of place",
                    self.f.name,
                    u.name()
                )));
            }
        };
        Ok(self.cast(&v, DType::F32, d))
    }

    fn binary(&mut self, b: BinaryOp, x: &str, y: &str, d: DType) -> Result<String, MlirError> {
        let t = scalar(d);
        let args = format!("{x}, {y}");
        let op = match (b, d.is_int()) {
            (BinaryOp::Add, false) => "arith.addf",
            (BinaryOp::Sub, false) => "arith.subf",
            (BinaryOp::Mul, false) => "arith.mulf",
            (BinaryOp::Div, false) => "arith.divf",
            (BinaryOp::Max, false) => "arith.maximumf",
            (BinaryOp::Min, false) => "arith.minimumf",
            (BinaryOp::Pow, false) => {
                let (x, y) = (self.cast(x, d, DType::F32), self.cast(y, d, DType::F32));
                let v = self.emit("math.powf", &format!("{x}, {y}"), "f32");
                return Ok(self.cast(&v, DType::F32, d));
            }
            (BinaryOp::Add, true) => "arith.addi",
            (BinaryOp::Sub, true) => "arith.subi",
            (BinaryOp::Mul, true) => "arith.muli",
            (BinaryOp::Div, true) => {
                let Some(status) = self.status.clone() else {
                    return Ok(self.emit("arith.floordivsi", &args, t));
                };
                let zero = self.constant(0.0, d);
                let one = self.constant(1.0, d);
                let is_zero = self.emit("arith.cmpi", &format!("eq, {y}, {zero}"), t);
                self.open(&format!("scf.if {is_zero} {{"));
                let failed = self.emit("arith.constant", "1", "i32");
                self.line(&format!("memref.store {failed}, {status}[] : memref<i32>"));
                self.close();
                let safe = self.emit("arith.select", &format!("{is_zero}, {one}, {y}"), t);
                return Ok(self.emit("arith.floordivsi", &format!("{x}, {safe}"), t));
            }
            (BinaryOp::Max, true) => "arith.maxsi",
            (BinaryOp::Min, true) => "arith.minsi",
            (BinaryOp::Pow, true) => {
                return Err(MlirError::Invalid(format!(
                    "@{}: pow of integers",
                    self.f.name
                )));
            }
        };
        Ok(self.emit(op, &args, t))
    }

    fn compare(&mut self, c: CmpOp, x: &str, y: &str, d: DType) -> String {
        let (op, pred) = if d.is_float() {
            let p = match c {
                CmpOp::Lt => "olt",
                CmpOp::Le => "ole",
                CmpOp::Gt => "ogt",
                CmpOp::Ge => "oge",
                CmpOp::Eq => "oeq",
                CmpOp::Ne => "une",
            };
            ("arith.cmpf", p)
        } else {
            let signed = d != DType::Bool;
            let p = match (c, signed) {
                (CmpOp::Lt, true) => "slt",
                (CmpOp::Le, true) => "sle",
                (CmpOp::Gt, true) => "sgt",
                (CmpOp::Ge, true) => "sge",
                (CmpOp::Lt, false) => "ult",
                (CmpOp::Le, false) => "ule",
                (CmpOp::Gt, false) => "ugt",
                (CmpOp::Ge, false) => "uge",
                (CmpOp::Eq, _) => "eq",
                (CmpOp::Ne, _) => "ne",
            };
            ("arith.cmpi", p)
        };
        self.emit(op, &format!("{pred}, {x}, {y}"), scalar(d))
    }

    /// `x` of type `from` as type `to`: floats round to nearest, floats to
    /// integers truncate toward zero (through i64, wrapping as the
    /// interpreter does), bool is `!= 0`.
    fn cast(&mut self, x: &str, from: DType, to: DType) -> String {
        use DType::*;
        if from == to {
            return x.to_string();
        }
        let width = |d: DType| match d {
            F16 | BF16 => 16,
            F32 | I32 => 32,
            I64 => 64,
            Bool => 1,
        };
        let conv = |g: &mut Self, op: &str, x: &str, from: DType, to: DType| {
            let t = g.fresh();
            g.line(&format!(
                "{t} = {op} {x} : {} to {}",
                scalar(from),
                scalar(to)
            ));
            t
        };
        match (from.is_float(), to.is_float()) {
            (true, true) => {
                if (from == F16 && to == BF16) || (from == BF16 && to == F16) {
                    let w = conv(self, "arith.extf", x, from, F32);
                    conv(self, "arith.truncf", &w, F32, to)
                } else if width(to) > width(from) {
                    conv(self, "arith.extf", x, from, to)
                } else {
                    conv(self, "arith.truncf", x, from, to)
                }
            }
            (true, false) if to == Bool => {
                let zero = self.constant(0.0, from);
                self.emit("arith.cmpf", &format!("une, {x}, {zero}"), scalar(from))
            }
            (true, false) => {
                let wide = conv(self, "arith.fptosi", x, from, I64);
                if to == I64 {
                    wide
                } else {
                    conv(self, "arith.trunci", &wide, I64, to)
                }
            }
            (false, true) if from == Bool => conv(self, "arith.uitofp", x, from, to),
            (false, true) => conv(self, "arith.sitofp", x, from, to),
            (false, false) if to == Bool => {
                let zero = self.constant(0.0, from);
                self.emit("arith.cmpi", &format!("ne, {x}, {zero}"), scalar(from))
            }
            (false, false) if from == Bool => conv(self, "arith.extui", x, from, to),
            (false, false) if width(to) > width(from) => conv(self, "arith.extsi", x, from, to),
            (false, false) => conv(self, "arith.trunci", x, from, to),
        }
    }
}
