//! Scalar arithmetic in MLIR text, shared by the loop and tile conversions:
//! constants, element-wise functions, comparisons and casts with the
//! meaning `dlc_core::scalar` gives them, and the text writer itself.

use dlc_core::DType;
use dlc_core::scalar::{BinaryOp, CmpOp, FormulaBuilder, UnaryOp};

use crate::MlirError;

/// The MLIR type of a scalar.
pub(crate) fn scalar(d: DType) -> &'static str {
    d.mlir_name()
}

/// MLIR text being written: lines at an indent, and fresh value names.
pub(crate) struct Writer {
    /// The text so far.
    pub out: String,
    /// Current depth of regions.
    pub indent: usize,
    /// The last fresh name's number.
    pub next: usize,
    /// The function written, for messages.
    pub fname: String,
    /// The status parameter, when running: integer divisions by zero set it.
    pub status: Option<String>,
    /// Module-level declarations the function needs (its constants'
    /// `memref.global`s), written before it.
    pub globals: String,
}

impl Writer {
    /// Opens `func.func @{name}(params)`, with the status parameter and the
    /// C interface when running, and then, where `native` names a CPU
    /// (`DLC_CPU`), that CPU: the execution engine compiles for this
    /// machine's CPU and features unless a function says otherwise.
    pub fn open_function(&mut self, name: &str, mut params: Vec<String>) {
        if let Some(status) = &self.status {
            params.push(format!("{status}: memref<i32>"));
        }
        let cpu = dlc_core::TargetDesc::host()
            .cpu()
            .and_then(|c| c.llvm_cpu.as_deref());
        let attrs = match (&self.status, cpu) {
            (None, _) => String::new(),
            (Some(_), None) => " attributes {llvm.emit_c_interface}".into(),
            // The CPU's own features only: an empty feature list replaces
            // the engine's (this machine's).
            (Some(_), Some(cpu)) => format!(
                " attributes {{llvm.emit_c_interface, target_cpu = \"{cpu}\", \
                 target_features = #llvm.target_features<[]>}}"
            ),
        };
        self.open(&format!(
            "func.func @{name}({}){attrs} {{",
            params.join(", ")
        ));
    }

    /// `name = memref.alloc()` of a row-major buffer.
    pub fn alloc(&mut self, name: &str, layout: &dlc_core::Layout) -> Result<(), MlirError> {
        if !layout.is_contiguous() {
            return Err(MlirError::Unsupported(format!(
                "@{}: an allocation with strides ({layout})",
                self.fname
            )));
        }
        self.line(&format!("{name} = memref.alloc() : {}", layout.mlir()));
        Ok(())
    }

    /// `name = ` a constant buffer of `layout` holding `values`: a private
    /// constant `memref.global` of the elements in one dimension, seen as
    /// `layout`.
    pub fn global(
        &mut self,
        name: &str,
        layout: &dlc_core::Layout,
        values: &[f64],
    ) -> Result<(), MlirError> {
        if !layout.is_contiguous() {
            return Err(MlirError::Invalid(format!(
                "@{}: a constant buffer with strides ({layout})",
                self.fname
            )));
        }
        let d = layout.dtype;
        let sym = format!("__dlc_{}_{}", self.fname, name.trim_start_matches('%'));
        let flat = format!("memref<{}x{}>", values.len(), scalar(d));
        let mut elems = String::with_capacity(values.len() * 10);
        for (i, &v) in values.iter().enumerate() {
            if i > 0 {
                elems.push_str(", ");
            }
            let text = match d {
                DType::Bool => (if v != 0.0 { "true" } else { "false" }).to_string(),
                _ => number(v, d),
            };
            elems.push_str(&text);
        }
        self.globals.push_str(&format!(
            "  memref.global \"private\" constant @{sym} : {flat} = dense<[{elems}]>\n"
        ));
        let data = self.fresh();
        self.line(&format!("{data} = memref.get_global @{sym} : {flat}"));
        self.view(name, &data, &flat, layout);
        Ok(())
    }

    /// `name`, the storage of `src` (of type `src_ty`) seen as `layout`
    /// (its offset counted from the start of the storage).
    pub fn view(&mut self, name: &str, src: &str, src_ty: &str, layout: &dlc_core::Layout) {
        let dims = |xs: &[usize]| {
            xs.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        // The offset is from the start of the storage, as the cast's is.
        self.line(&format!(
            "{name} = memref.reinterpret_cast {src} to offset: [{}], sizes: [{}], strides: [{}] : \
             {src_ty} to {}",
            layout.offset,
            dims(&layout.shape),
            dims(&layout.strides),
            layout.mlir()
        ));
    }

    /// `sum(c * x) + constant` over `terms` (index values) as an `index`.
    pub fn affine(&mut self, terms: Vec<(i64, String)>, constant: i64) -> String {
        let mut acc: Option<String> = None;
        for (c, x) in terms {
            let term = if c == 1 {
                x
            } else {
                let k = self.index_const(c);
                self.emit("arith.muli", &format!("{x}, {k}"), "index")
            };
            acc = Some(match acc {
                None => term,
                Some(a) => self.emit("arith.addi", &format!("{a}, {term}"), "index"),
            });
        }
        match acc {
            None => self.index_const(constant),
            Some(a) if constant == 0 => a,
            Some(a) => {
                let k = self.index_const(constant);
                self.emit("arith.addi", &format!("{a}, {k}"), "index")
            }
        }
    }

    /// Whether every index is inside `shape` (`i1`; `None` for no index).
    pub fn in_bounds(&mut self, idx: &[String], shape: &[usize]) -> Option<String> {
        let mut inside: Option<String> = None;
        for (i, &n) in idx.iter().zip(shape) {
            let zero = self.index_const(0);
            let n = self.index_const(n as i64);
            let lo = self.emit("arith.cmpi", &format!("sge, {i}, {zero}"), "index");
            let hi = self.emit("arith.cmpi", &format!("slt, {i}, {n}"), "index");
            let both = self.emit("arith.andi", &format!("{lo}, {hi}"), "i1");
            inside = Some(match inside {
                None => both,
                Some(a) => self.emit("arith.andi", &format!("{a}, {both}"), "i1"),
            });
        }
        inside
    }

    /// `memref.load {access}` (`%b[%i, ..]` of type `ty`) where `cond`
    /// holds, the pad elsewhere; an unconditional load without a pad.
    pub fn load(
        &mut self,
        access: &str,
        ty: &str,
        cond: Option<String>,
        pad: Option<f64>,
        d: DType,
    ) -> String {
        let (Some(cond), Some(pad)) = (cond, pad) else {
            return self.emit("memref.load", access, ty);
        };
        let r = self.fresh();
        self.open(&format!("{r} = scf.if {cond} -> ({}) {{", scalar(d)));
        let v = self.emit("memref.load", access, ty);
        self.line(&format!("scf.yield {v} : {}", scalar(d)));
        self.indent -= 1;
        self.line("} else {");
        self.indent += 1;
        let p = self.constant(pad, d);
        self.line(&format!("scf.yield {p} : {}", scalar(d)));
        self.close();
        r
    }

    /// Opens `scf.for i = lo to hi step step`, carrying `carried` (each
    /// region argument with its initial value) as `results` of `types`.
    pub fn open_for(
        &mut self,
        i: &str,
        [lo, hi, step]: [i64; 3],
        results: &[String],
        carried: &[(String, String)],
        types: &[String],
    ) {
        let (lo, hi, step) = (
            self.index_const(lo),
            self.index_const(hi),
            self.index_const(step),
        );
        let head = if results.is_empty() {
            format!("scf.for {i} = {lo} to {hi} step {step} {{")
        } else {
            let carried: Vec<String> = carried.iter().map(|(a, v)| format!("{a} = {v}")).collect();
            format!(
                "{} = scf.for {i} = {lo} to {hi} step {step} iter_args({}) -> ({}) {{",
                results.join(", "),
                carried.join(", "),
                types.join(", ")
            )
        };
        self.open(&head);
    }

    /// Closes what [`Writer::open_for`] opened, yielding `values` of `types`
    /// (nothing when it carries nothing).
    pub fn close_for(&mut self, values: &[String], types: &[String]) {
        if !types.is_empty() {
            self.line(&format!(
                "scf.yield {} : {}",
                values.join(", "),
                types.join(", ")
            ));
        }
        self.close();
    }

    /// A writer at depth `indent` for function `fname`.
    pub fn new(fname: &str, indent: usize, status: Option<String>) -> Writer {
        Writer {
            out: String::new(),
            indent,
            next: 0,
            fname: fname.to_string(),
            status,
            globals: String::new(),
        }
    }

    pub fn line(&mut self, text: &str) {
        for _ in 0..self.indent {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    /// A line opening a region (ending in `{`), and the region's indent.
    pub fn open(&mut self, head: &str) {
        self.line(head);
        self.indent += 1;
    }

    /// The end of the region [`Gen::open`] opened.
    pub fn close(&mut self) {
        self.indent -= 1;
        self.line("}");
    }

    pub fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%t{}", self.next)
    }

    /// `%t = OP ARGS : TYPE`, returning `%t`.
    pub fn emit(&mut self, op: &str, args: &str, ty: &str) -> String {
        let t = self.fresh();
        self.line(&format!("{t} = {op} {args} : {ty}"));
        t
    }

    /// An integer scalar of type `from` as an `index` (`arith.index_cast`,
    /// or `arith.index_castui` for unsigned types and bool).
    pub fn index_cast(&mut self, x: &str, from: DType) -> String {
        let op = if from == DType::Bool || from.is_unsigned() {
            "arith.index_castui"
        } else {
            "arith.index_cast"
        };
        let t = self.fresh();
        self.line(&format!("{t} = {op} {x} : {} to index", scalar(from)));
        t
    }

    pub fn index_const(&mut self, c: i64) -> String {
        self.emit("arith.constant", &c.to_string(), "index")
    }

    /// A constant of scalar type `d`.
    pub fn constant(&mut self, v: f64, d: DType) -> String {
        let text = match d {
            DType::Bool => u8::from(v != 0.0).to_string(),
            _ => number(v, d),
        };
        self.emit("arith.constant", &text, scalar(d))
    }

    pub fn unary(&mut self, u: UnaryOp, x: &str, d: DType) -> Result<String, MlirError> {
        let t = scalar(d);
        if d.is_int() || d == DType::Bool {
            return Ok(match u {
                UnaryOp::Neg => {
                    let zero = self.constant(0.0, d);
                    self.emit("arith.subi", &format!("{zero}, {x}"), t)
                }
                // Unsigned values are their own magnitude.
                UnaryOp::Relu | UnaryOp::Abs if d.is_unsigned() => x.to_string(),
                UnaryOp::Sign if d.is_unsigned() => {
                    let zero = self.constant(0.0, d);
                    let nonzero = self.emit("arith.cmpi", &format!("ne, {x}, {zero}"), t);
                    self.cast(&nonzero, DType::Bool, d)
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
                UnaryOp::Sign => {
                    let one = self.constant(1.0, d);
                    let minus = self.constant(-1.0, d);
                    let low = self.emit("arith.minsi", &format!("{x}, {one}"), t);
                    self.emit("arith.maxsi", &format!("{low}, {minus}"), t)
                }
                other => {
                    return Err(MlirError::Invalid(format!(
                        "@{}: {} of an integer",
                        self.fname,
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
        // Transcendental functions in f32 (f16 and bf16 rounded once), f64
        // in f64.
        let w = if d == DType::F64 { d } else { DType::F32 };
        let x = self.cast(x, d, w);
        let f = scalar(w);
        if let Some(e) = u.expansion() {
            let v = e.build(&mut Expand { w: self, d: w }, &[x.clone(), x.clone(), x])?;
            return Ok(self.cast(&v, w, d));
        }
        let v = match u {
            UnaryOp::Exp => self.emit("math.exp", &x, f),
            UnaryOp::Log => self.emit("math.log", &x, f),
            UnaryOp::Sqrt => self.emit("math.sqrt", &x, f),
            UnaryOp::Tanh => self.emit("math.tanh", &x, f),
            UnaryOp::Floor => self.emit("math.floor", &x, f),
            UnaryOp::Ceil => self.emit("math.ceil", &x, f),
            UnaryOp::Round => self.emit("math.roundeven", &x, f),
            UnaryOp::Sin => self.emit("math.sin", &x, f),
            UnaryOp::Erf => self.emit("math.erf", &x, f),
            UnaryOp::Cos => self.emit("math.cos", &x, f),
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => {
                return Err(MlirError::Invalid(format!(
                    "@{}: {} out of place",
                    self.fname,
                    u.name()
                )));
            }
            UnaryOp::Rsqrt
            | UnaryOp::Sigmoid
            | UnaryOp::Gelu
            | UnaryOp::Sign
            | UnaryOp::Reciprocal
            | UnaryOp::Silu => unreachable!("{} is a composite", u.name()),
        };
        Ok(self.cast(&v, w, d))
    }

    pub fn binary(&mut self, b: BinaryOp, x: &str, y: &str, d: DType) -> Result<String, MlirError> {
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
                let w = if d == DType::F64 { d } else { DType::F32 };
                let (x, y) = (self.cast(x, d, w), self.cast(y, d, w));
                let v = self.emit("math.powf", &format!("{x}, {y}"), scalar(w));
                return Ok(self.cast(&v, w, d));
            }
            (BinaryOp::Add, true) => "arith.addi",
            (BinaryOp::Sub, true) => "arith.subi",
            (BinaryOp::Mul, true) => "arith.muli",
            (BinaryOp::Div, true) => {
                // Floor division is truncating division on unsigned values.
                let div = if d.is_unsigned() {
                    "arith.divui"
                } else {
                    "arith.floordivsi"
                };
                let Some(status) = self.status.clone() else {
                    return Ok(self.emit(div, &args, t));
                };
                let zero = self.constant(0.0, d);
                let one = self.constant(1.0, d);
                let is_zero = self.emit("arith.cmpi", &format!("eq, {y}, {zero}"), t);
                self.open(&format!("scf.if {is_zero} {{"));
                let failed = self.emit("arith.constant", "1", "i32");
                self.line(&format!("memref.store {failed}, {status}[] : memref<i32>"));
                self.close();
                let safe = self.emit("arith.select", &format!("{is_zero}, {one}, {y}"), t);
                return Ok(self.emit(div, &format!("{x}, {safe}"), t));
            }
            (BinaryOp::Max, true) if d.is_unsigned() => "arith.maxui",
            (BinaryOp::Min, true) if d.is_unsigned() => "arith.minui",
            (BinaryOp::Max, true) => "arith.maxsi",
            (BinaryOp::Min, true) => "arith.minsi",
            (BinaryOp::Pow, true) => {
                return Err(MlirError::Invalid(format!(
                    "@{}: pow of integers",
                    self.fname
                )));
            }
            (BinaryOp::BitAnd, true) => "arith.andi",
            (BinaryOp::BitOr, true) => "arith.ori",
            (BinaryOp::BitXor, true) => "arith.xori",
            (BinaryOp::Shl | BinaryOp::Shr, true) => {
                // arith's shifts are poison at or past the width; every bit
                // is shifted out there, as the interpreters say.
                let bits = 8.0 * d.size_bytes() as f64;
                let width = self.constant(bits, d);
                let past = self.emit("arith.cmpi", &format!("uge, {y}, {width}"), t);
                let zero = self.constant(0.0, d);
                let v = if b == BinaryOp::Shl {
                    self.emit("arith.shli", &args, t)
                } else if d.is_unsigned() {
                    self.emit("arith.shrui", &args, t)
                } else {
                    let last = self.constant(bits - 1.0, d);
                    let s = self.emit("arith.minui", &format!("{y}, {last}"), t);
                    return Ok(self.emit("arith.shrsi", &format!("{x}, {s}"), t));
                };
                return Ok(self.emit("arith.select", &format!("{past}, {zero}, {v}"), t));
            }
            (_, false) => {
                return Err(MlirError::Invalid(format!(
                    "@{}: {} of floats",
                    self.fname,
                    b.name()
                )));
            }
        };
        Ok(self.emit(op, &args, t))
    }

    pub fn compare(&mut self, c: CmpOp, x: &str, y: &str, d: DType) -> String {
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
            let signed = d != DType::Bool && !d.is_unsigned();
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
    pub fn cast(&mut self, x: &str, from: DType, to: DType) -> String {
        use DType::*;
        if from == to {
            return x.to_string();
        }
        let width = |d: DType| if d == Bool { 1 } else { 8 * d.size_bytes() };
        // Bool counts as unsigned: true is 1.
        let unsigned = |d: DType| d == Bool || d.is_unsigned();
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
            (true, false) if to == U64 => {
                // Above zero through `fptoui`, so values past `i64::MAX`
                // keep their magnitude; below, wrapped from i64.
                let zero = self.constant(0.0, from);
                let neg = self.emit("arith.cmpf", &format!("olt, {x}, {zero}"), scalar(from));
                let s = conv(self, "arith.fptosi", x, from, I64);
                let u = conv(self, "arith.fptoui", x, from, U64);
                self.emit("arith.select", &format!("{neg}, {s}, {u}"), scalar(U64))
            }
            (true, false) => {
                let wide = conv(self, "arith.fptosi", x, from, I64);
                if width(to) == 64 {
                    wide
                } else {
                    conv(self, "arith.trunci", &wide, I64, to)
                }
            }
            (false, true) if unsigned(from) => conv(self, "arith.uitofp", x, from, to),
            (false, true) => conv(self, "arith.sitofp", x, from, to),
            (false, false) if to == Bool => {
                let zero = self.constant(0.0, from);
                self.emit("arith.cmpi", &format!("ne, {x}, {zero}"), scalar(from))
            }
            // Same width, other signedness: the same bits.
            (false, false) if width(to) == width(from) => x.to_string(),
            (false, false) if width(to) > width(from) && unsigned(from) => {
                conv(self, "arith.extui", x, from, to)
            }
            (false, false) if width(to) > width(from) => conv(self, "arith.extsi", x, from, to),
            (false, false) => conv(self, "arith.trunci", x, from, to),
        }
    }
}

/// A number of element type `d` (not bool) as an MLIR literal: integers as
/// signless values, finite floats in decimal, the others as their bits.
fn number(v: f64, d: DType) -> String {
    match d {
        d if d.is_int() => d.signless(v).to_string(),
        _ if v.is_finite() => dlc_core::format_float(v),
        DType::F64 => format!("0x{:016X}", v.to_bits()),
        DType::F16 => format!("0x{:04X}", half::f16::from_f64(v).to_bits()),
        DType::BF16 => format!("0x{:04X}", half::bf16::from_f64(v).to_bits()),
        _ => format!("0x{:08X}", (v as f32).to_bits()),
    }
}

/// Builds a composite function's [`UnaryOp::expansion`] in `arith` and
/// `math` ops on floats of type `d` (f32 or f64).
struct Expand<'w> {
    w: &'w mut Writer,
    d: DType,
}

impl FormulaBuilder for Expand<'_> {
    type Value = String;
    type Error = MlirError;

    fn constant(&mut self, c: f64) -> Result<String, MlirError> {
        Ok(self.w.constant(c, self.d))
    }

    fn unary(&mut self, u: UnaryOp, a: String) -> Result<String, MlirError> {
        self.w.unary(u, &a, self.d)
    }

    fn binary(&mut self, op: BinaryOp, x: String, y: String) -> Result<String, MlirError> {
        self.w.binary(op, &x, &y, self.d)
    }

    fn select(
        &mut self,
        cmp: CmpOp,
        a: String,
        b: String,
        t: String,
        e: String,
    ) -> Result<String, MlirError> {
        let c = self.w.compare(cmp, &a, &b, self.d);
        Ok(self
            .w
            .emit("arith.select", &format!("{c}, {t}, {e}"), scalar(self.d)))
    }

    /// Nothing is folded: an expansion's constants are its own.
    fn as_const(&self, _: &String) -> Option<f64> {
        None
    }
}
