//! The body of `graph.compute`: a user-defined operator in index notation.
//!
//! A body defines local element arrays `t0, t1, ...` in order and then the
//! output `out`, each as a scalar expression over index variables `dN`.
//! Operands are read as `in0, in1, ...` with affine indices; a read outside
//! an operand's (or local's) bounds yields zero. Reductions bind their own
//! variables with explicit ranges (`sum[d2 in 0..64](...)`).

use std::collections::HashMap;
use std::fmt::{self, Write};

use dlc_core::{DType, TensorType, Window, format_float};

use crate::ops::{BinaryOp, CmpOp, ReduceKind, UnaryOp};

/// An index variable, printed `d{N}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IndexVar(pub u32);

impl fmt::Display for IndexVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "d{}", self.0)
    }
}

/// `sum(coeff * var) + constant`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Affine {
    /// Non-zero coefficients, one per variable.
    pub terms: Vec<(i64, IndexVar)>,
    /// The constant term.
    pub constant: i64,
}

impl Affine {
    /// The plain variable `v`.
    pub fn var(v: IndexVar) -> Self {
        Affine {
            terms: vec![(1, v)],
            constant: 0,
        }
    }

    /// The variable if this is exactly one variable with coefficient 1.
    pub fn as_var(&self) -> Option<IndexVar> {
        match (self.terms.as_slice(), self.constant) {
            ([(1, v)], 0) => Some(*v),
            _ => None,
        }
    }

    /// Evaluates with `env[v]` the value of variable `v`.
    pub fn eval(&self, env: &[i64]) -> i64 {
        self.terms.iter().fold(self.constant, |acc, (c, v)| {
            acc.saturating_add(c.saturating_mul(env[v.0 as usize]))
        })
    }
}

impl fmt::Display for Affine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for &(c, v) in &self.terms {
            let (neg, mag) = (c < 0, c.unsigned_abs());
            match (first, neg) {
                (true, true) => f.write_str("-")?,
                (false, true) => f.write_str(" - ")?,
                (false, false) => f.write_str(" + ")?,
                (true, false) => {}
            }
            if mag != 1 {
                write!(f, "{mag}*")?;
            }
            write!(f, "{v}")?;
            first = false;
        }
        if first {
            write!(f, "{}", self.constant)
        } else if self.constant > 0 {
            write!(f, " + {}", self.constant)
        } else if self.constant < 0 {
            write!(f, " - {}", self.constant.unsigned_abs())
        } else {
            Ok(())
        }
    }
}

/// What a read reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The op's `N`-th operand, printed `in{N}`.
    Input(u32),
    /// The body's `N`-th local, printed `t{N}`.
    Local(u32),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Input(i) => write!(f, "in{i}"),
            Source::Local(i) => write!(f, "t{i}"),
        }
    }
}

/// A reduction variable and its half-open range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeVar {
    /// The variable.
    pub var: IndexVar,
    /// First value.
    pub lo: i64,
    /// One past the last value.
    pub hi: i64,
}

/// A scalar expression evaluated at one point of an index space.
#[derive(Debug, Clone, PartialEq)]
pub enum ScalarExpr {
    /// A number; its element type is that of the expression around it.
    Const(f64),
    /// An element of an operand or a local; zero outside its bounds.
    Read {
        /// Operand or local.
        src: Source,
        /// One affine index per dimension.
        index: Vec<Affine>,
    },
    /// Unary function.
    Unary(UnaryOp, Box<ScalarExpr>),
    /// Binary function.
    Binary(BinaryOp, Box<ScalarExpr>, Box<ScalarExpr>),
    /// Comparison, giving bool.
    Compare(CmpOp, Box<ScalarExpr>, Box<ScalarExpr>),
    /// `where(c, a, b)`.
    Select(Box<ScalarExpr>, Box<ScalarExpr>, Box<ScalarExpr>),
    /// Type conversion.
    Cast(DType, Box<ScalarExpr>),
    /// Reduction over the given ranges.
    Reduce {
        /// How values combine.
        kind: ReduceKind,
        /// Bound variables.
        vars: Vec<RangeVar>,
        /// The reduced expression.
        body: Box<ScalarExpr>,
    },
}

/// A local element array (`let`) or the output (`out`).
#[derive(Debug, Clone, PartialEq)]
pub struct ElemDef {
    /// One variable per dimension of `ty`.
    pub vars: Vec<IndexVar>,
    /// Shape and element type of the defined array.
    pub ty: TensorType,
    /// The value at each point.
    pub expr: ScalarExpr,
}

/// The body of a `graph.compute` op.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeBody {
    /// The user operator's name, for readers of the IR.
    pub name: String,
    /// Locals `t0, t1, ...`, each computed before the next.
    pub locals: Vec<ElemDef>,
    /// The output; its type is the op's result type.
    pub out: ElemDef,
}

fn write_vars(out: &mut String, vars: &[IndexVar]) {
    for (i, v) in vars.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{v}");
    }
}

impl ComputeBody {
    /// The operator as the built-in convolution it computes, if it is one:
    /// no locals, and an output `out[n, o, y, xx] = sum[c, ky, kx](x[n, c,
    /// s0 * y + d0 * ky - p0, s1 * xx + d1 * kx - p1] * w[o, c, ky, kx])`
    /// (the product in either order) of operands `x` and `w`, summed over
    /// all of their channels and taps, whose type is the one `conv2d(x, w,
    /// stride=[s0, s1], padding=[p0, p1], dilation=[d0, d1])` has. Returns the op and which of `inputs` (the
    /// operands' types) are `x` and `w`. A convolution written so is then
    /// the built-in op: its kernels (Winograd's, the im2col product), its
    /// fusions and its rewrites.
    pub fn as_conv2d(&self, inputs: &[&TensorType]) -> Option<(crate::ops::Op, [usize; 2])> {
        if !self.locals.is_empty() {
            return None;
        }
        let def = &self.out;
        let ty = |s: Source| match s {
            Source::Input(i) => inputs.get(i as usize).copied(),
            Source::Local(_) => None,
        };
        let form = def.contraction(&ty, true)?;
        // The output is the sum itself: no epilogue.
        if !std::ptr::eq(form.sum, &def.expr) || form.m != 1 {
            return None;
        }
        let window = form.window(def, &ty)?;
        if window.padding.iter().any(|&p| p < 0) {
            return None;
        }
        let ((xs, _), (ws, weight)) = (as_read(form.b)?, as_read(form.a)?);
        let (Source::Input(xi), Source::Input(wi)) = (xs, ws) else {
            return None;
        };
        let (x, w) = (*inputs.get(xi as usize)?, *inputs.get(wi as usize)?);
        let [c, ky, kx] = &form.k[..] else {
            return None;
        };
        let reads_weight = weight.len() == 4
            && [def.vars[1], c.var, ky.var, kx.var]
                .iter()
                .zip(weight)
                .all(|(v, e)| e.as_var() == Some(*v));
        let whole = x.shape.get(1) == Some(&(c.hi as usize))
            && w.shape.get(2..) == Some(&[ky.hi as usize, kx.hi as usize][..]);
        if !reads_weight || !whole {
            return None;
        }
        let op = crate::ops::Op::Conv2d {
            stride: window.stride.map(|s| s as usize),
            padding: window.padding.map(|p| p as usize),
            groups: 1,
            dilation: window.dilation.map(|d| d as usize),
        };
        let out = crate::infer::infer(&op, &[x, w]).ok()?;
        (out == [def.ty.clone()]).then_some((op, [xi as usize, wi as usize]))
    }

    /// The body lines as printed between braces, without indentation.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (i, local) in self.locals.iter().enumerate() {
            let mut s = format!("let t{i}[");
            write_vars(&mut s, &local.vars);
            let _ = write!(s, "] : {} = ", local.ty);
            local.expr.write(&mut s, true);
            lines.push(s);
        }
        let mut s = String::from("out[");
        write_vars(&mut s, &self.out.vars);
        s.push_str("] = ");
        self.out.expr.write(&mut s, true);
        lines.push(s);
        lines
    }
}

impl ScalarExpr {
    /// Appends the text form; `top` leaves a binary expression unparenthesized.
    pub fn write(&self, out: &mut String, top: bool) {
        match self {
            ScalarExpr::Const(v) => out.push_str(&format_float(*v)),
            ScalarExpr::Read { src, index } => {
                let _ = write!(out, "{src}[");
                for (i, a) in index.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    let _ = write!(out, "{a}");
                }
                out.push(']');
            }
            ScalarExpr::Unary(UnaryOp::Neg, e) => {
                out.push('-');
                e.write(out, false);
            }
            ScalarExpr::Unary(u, e) => {
                let _ = write!(out, "{}(", u.name());
                e.write(out, true);
                out.push(')');
            }
            ScalarExpr::Binary(b, l, r) => match (b.symbol(), b.function_name()) {
                (Some(sym), _) => {
                    if !top {
                        out.push('(');
                    }
                    l.write(out, false);
                    let _ = write!(out, " {sym} ");
                    r.write(out, false);
                    if !top {
                        out.push(')');
                    }
                }
                (None, fname) => {
                    let _ = write!(out, "{}(", fname.unwrap_or("?"));
                    l.write(out, true);
                    out.push_str(", ");
                    r.write(out, true);
                    out.push(')');
                }
            },
            ScalarExpr::Compare(c, l, r) => {
                if !top {
                    out.push('(');
                }
                l.write(out, false);
                let _ = write!(out, " {} ", c.symbol());
                r.write(out, false);
                if !top {
                    out.push(')');
                }
            }
            ScalarExpr::Select(c, a, b) => {
                out.push_str("where(");
                c.write(out, true);
                out.push_str(", ");
                a.write(out, true);
                out.push_str(", ");
                b.write(out, true);
                out.push(')');
            }
            ScalarExpr::Cast(t, e) => {
                out.push_str("cast(");
                e.write(out, true);
                let _ = write!(out, ", {t})");
            }
            ScalarExpr::Reduce { kind, vars, body } => {
                let _ = write!(out, "{}[", kind.name());
                for (i, rv) in vars.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    let _ = write!(out, "{} in {}..{}", rv.var, rv.lo, rv.hi);
                }
                out.push_str("](");
                body.write(out, true);
                out.push(')');
            }
        }
    }

    /// Calls `f` on this expression and every sub-expression, parents first.
    pub fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a ScalarExpr)) {
        f(self);
        match self {
            ScalarExpr::Const(_) | ScalarExpr::Read { .. } => {}
            ScalarExpr::Unary(_, e) | ScalarExpr::Cast(_, e) => e.visit(f),
            ScalarExpr::Reduce { body, .. } => body.visit(f),
            ScalarExpr::Binary(_, a, b) | ScalarExpr::Compare(_, a, b) => {
                a.visit(f);
                b.visit(f);
            }
            ScalarExpr::Select(c, a, b) => {
                c.visit(f);
                a.visit(f);
                b.visit(f);
            }
        }
    }
}

/// A definition that is a contraction: `E(sum[k..](a * b))`, where `a` and
/// `b` are reads of operands or locals (or element-wise expressions of such
/// reads: prologues) of one element type whose indices are affine in the
/// definition's variables and the reduction variables `k..`, each of which
/// both read, and `E`, the epilogue, is the
/// rest of the definition, element-wise (it holds no other reduction). The
/// lowering computes it as one structured product (`loop.matmul`): for every
/// value of the `batch` variables, an `M x N` product over the reduction
/// variables (one depth counter), whose rows are the variable `m` and whose
/// columns are `n`, then `E` of each sum. Each operand is read
/// ([`OperandRead`]) in place through its own index when one reduction
/// variable indexes it within its bounds, through a view when several span
/// whole consecutive axes of it, and otherwise (a convolution's window, a
/// read past its edges, which gives zero) from a gathered copy laid out as
/// the product reads it (im2col). A contraction written in index notation
/// is then the same product as the built-in `@` or convolution computing
/// it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContractionForm<'a> {
    /// The `sum[..](..)` node, which `E` is written around.
    pub sum: &'a ScalarExpr,
    /// The reduction variables and their ranges, outermost first.
    pub k: Vec<RangeVar>,
    /// The operand giving the product's rows (it reads `m`, not `n`): a
    /// read, or an element-wise expression of reads (a prologue,
    /// `relu(a[i, k])`), which is always gathered.
    pub a: &'a ScalarExpr,
    /// The operand giving the product's columns (it reads `n`, not `m`).
    pub b: &'a ScalarExpr,
    /// How `a` and `b` are read.
    pub reads: [OperandRead; 2],
    /// Position among the definition's variables of the rows.
    pub m: usize,
    /// Position of the columns: the last variable, so that a row of
    /// results is a row of the stored array; or the first of the last
    /// `columns` variables, which the columns then run over together, in
    /// row-major order.
    pub n: usize,
    /// How many variables the columns are: 1, or, when `E` reads nothing
    /// but the sum and `b` is gathered anyway or reads them as whole
    /// consecutive axes of its own, every trailing variable that `b` alone
    /// reads (a convolution's weight gradient, `out[o, c, ky, kx]`, has
    /// `c * 3 * 3` columns, not 3; a 1x1 convolution's columns are the
    /// image's pixels).
    pub columns: usize,
    /// Positions of the other variables, in order: loops around the product.
    pub batch: Vec<usize>,
}

/// How a contraction reads one of its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperandRead {
    /// Through its own index, the one reduction variable's value being
    /// the depth counter's (plus the range's start): every read is
    /// within the operand.
    InPlace,
    /// Through a view whose axes from this one on, one per reduction
    /// variable (whole, in order), are one axis.
    Merged(usize),
    /// The column operand, through a view whose axes from this one on,
    /// one per column variable (whole, in order), are one axis, the one
    /// reduction variable read as for `InPlace` (a 1x1 convolution's
    /// `x[n, c, y, xx]`: its columns are the image's pixels, `y, xx`).
    MergedColumns(usize),
    /// From a copy, zero where the read falls outside the operand, whose
    /// axes are the batch variables it reads, then (`a`) the rows and the
    /// reduction variables or (`b`) the reduction variables and the
    /// columns.
    Gathered,
}

impl ContractionForm<'_> {
    /// The window through which the gathered column operand reads, when
    /// the contraction is a convolution written in index notation:
    /// `sum[c, ky, kx](a[.., c, ky, kx] * x[n, c, s0 * y + d0 * ky - p0,
    /// s1 * xx + d1 * kx - p1])` over columns `y, xx` (the last two
    /// variables), with `n` the one batch variable `x` reads and `c`, `n`
    /// within `x`'s first two axes. Its gathered copy is then an im2col
    /// buffer, `[n, (c, ky, kx), (y, xx)]`, that the lowering marks as such
    /// (a kernel group whose product may read the input through the
    /// window instead). `def` is the definition the form is of; `ty` gives
    /// the operands' types.
    pub fn window<'a>(
        &self,
        def: &ElemDef,
        ty: &dyn Fn(Source) -> Option<&'a TensorType>,
    ) -> Option<Window> {
        let (src, index) = as_read(self.b)?;
        let [c, ky, kx] = &self.k[..] else {
            return None;
        };
        if self.reads[1] != OperandRead::Gathered
            || self.columns != 2
            || self.k.iter().any(|k| k.lo != 0)
        {
            return None;
        }
        let (y, xx) = (def.vars[self.n], def.vars[self.n + 1]);
        let batch: Vec<usize> = self
            .batch
            .iter()
            .copied()
            .filter(|&p| reads(self.b, def.vars[p]))
            .collect();
        let [nb] = batch[..] else {
            return None;
        };
        let [i0, i1, i2, i3] = index else {
            return None;
        };
        let t = ty(src)?;
        // `e` is `s * out + d * tap - p`, with `s`, `d` positive.
        let axis = |e: &Affine, out: IndexVar, tap: IndexVar| -> Option<(i64, i64, i64)> {
            let coef = |v: IndexVar| e.terms.iter().find(|t| t.1 == v).map(|t| t.0);
            let (s, d) = (coef(out)?, coef(tap)?);
            (e.terms.len() == 2 && s >= 1 && d >= 1).then_some((s, d, -e.constant))
        };
        let (s0, d0, p0) = axis(i2, y, ky.var)?;
        let (s1, d1, p1) = axis(i3, xx, kx.var)?;
        let fits = i0.as_var() == Some(def.vars[nb])
            && i1.as_var() == Some(c.var)
            && t.shape.len() == 4
            && def.ty.shape[nb] <= t.shape[0]
            && c.hi as usize <= t.shape[1];
        fits.then_some(Window {
            kernel: [ky.hi, kx.hi],
            stride: [s0, s1],
            padding: [p0, p1],
            dilation: [d0, d1],
        })
    }
}

/// The operand `e` as a plain read: what it reads and at which index.
pub fn as_read(e: &ScalarExpr) -> Option<(Source, &[Affine])> {
    match e {
        ScalarExpr::Read { src, index } => Some((*src, index.as_slice())),
        _ => None,
    }
}

/// Whether expression `e` reads anything at an index that uses `v`.
pub fn reads(e: &ScalarExpr, v: IndexVar) -> bool {
    let mut found = false;
    e.visit(&mut |x| {
        if let ScalarExpr::Read { index, .. } = x {
            found |= index.iter().any(|a| a.terms.iter().any(|t| t.1 == v));
        }
    });
    found
}

/// The most elements a gathered operand may have (2^26: 256 MiB of f32);
/// a contraction needing more keeps its scalar loops.
pub const MAX_GATHERED: usize = 1 << 26;

impl ElemDef {
    /// The definition as a contraction, if it is one; `ty` gives the type
    /// of each operand and local it may read.
    ///
    /// `merge_columns`: whether the columns may be several variables (the
    /// result is stored in a row-major array of its own, with no epilogue
    /// after it that reads it by index).
    pub fn contraction<'a>(
        &'a self,
        ty: &dyn Fn(Source) -> Option<&'a TensorType>,
        merge_columns: bool,
    ) -> Option<ContractionForm<'a>> {
        let mut reductions = Vec::new();
        self.expr.visit(&mut |e| {
            if let ScalarExpr::Reduce { .. } = e {
                reductions.push(e);
            }
        });
        let [sum] = reductions[..] else {
            return None;
        };
        let ScalarExpr::Reduce {
            kind: ReduceKind::Sum,
            vars,
            body,
        } = sum
        else {
            return None;
        };
        let ScalarExpr::Binary(BinaryOp::Mul, x, y) = &**body else {
            return None;
        };
        if vars.is_empty() || vars.iter().any(|k| k.hi <= k.lo) {
            return None;
        }
        // Each operand reads only what the body may read; the two are of one
        // numeric type (the verifier's rule for `*`).
        let (mut a, mut b): (&'a ScalarExpr, &'a ScalarExpr) = (x, y);
        let mut known = true;
        body.visit(&mut |e| {
            if let ScalarExpr::Read { src, .. } = e {
                known &= ty(*src).is_some();
            }
        });
        if !known {
            return None;
        }
        if let (Some(ra), Some(rb)) = (as_read(a), as_read(b)) {
            let (ta, tb) = (ty(ra.0)?, ty(rb.0)?);
            if ta.dtype != tb.dtype || !ta.dtype.is_numeric() {
                return None;
            }
        }
        if vars.iter().any(|k| !reads(a, k.var) || !reads(b, k.var)) {
            return None;
        }
        // Columns: the last variable, read by exactly one of the two.
        let n = self.vars.len().checked_sub(1)?;
        let last = self.vars[n];
        match (reads(a, last), reads(b, last)) {
            (true, false) => std::mem::swap(&mut a, &mut b),
            (false, true) => {}
            _ => return None,
        }
        // Rows: the last other variable read by `a` alone.
        let m = (0..n)
            .rev()
            .find(|&p| reads(a, self.vars[p]) && !reads(b, self.vars[p]))?;
        // Columns over several variables: the trailing ones `b` alone reads,
        // when `E` reads nothing (its only reads are the sum's two).
        let mut all_reads = 0;
        self.expr.visit(&mut |e| {
            if let ScalarExpr::Read { .. } = e {
                all_reads += 1;
            }
        });
        let first = (m + 1..=n)
            .find(|&q| (q..=n).all(|p| reads(b, self.vars[p]) && !reads(a, self.vars[p])))
            .unwrap_or(n);
        let n = if merge_columns && all_reads == 2 {
            first
        } else {
            n
        };
        // How each operand is read.
        let range = |v: IndexVar| -> Option<(i64, i64)> {
            if let Some(k) = vars.iter().find(|k| k.var == v) {
                return Some((k.lo, k.hi - 1));
            }
            let p = self.vars.iter().position(|w| *w == v)?;
            Some((0, self.ty.shape[p] as i64 - 1))
        };
        let within = |r: (Source, &[Affine]), t: &TensorType| -> Option<bool> {
            for (e, &dim) in r.1.iter().zip(&t.shape) {
                let (mut lo, mut hi) = (e.constant, e.constant);
                for &(c, v) in &e.terms {
                    let (vlo, vhi) = range(v)?;
                    let (p, q) = (c.checked_mul(vlo)?, c.checked_mul(vhi)?);
                    lo = lo.checked_add(p.min(q))?;
                    hi = hi.checked_add(p.max(q))?;
                }
                if lo < 0 || hi >= dim as i64 {
                    return Some(false);
                }
            }
            Some(true)
        };
        let depth_vars: Option<Vec<(IndexVar, usize)>> = vars
            .iter()
            .map(|k| (k.lo == 0).then_some((k.var, k.hi as usize)))
            .collect();
        let axes = |r: (Source, &[Affine]), t: &TensorType| -> Option<usize> {
            whole_axes(r.1, &t.shape, depth_vars.as_deref()?)
        };
        let batch: Vec<usize> = (0..n).filter(|&p| p != m).collect();
        let depth: usize = vars.iter().map(|k| (k.hi - k.lo) as usize).product();
        let columns: usize = self.ty.shape[n..].iter().product();
        let mode = |e: &'a ScalarExpr, own: usize| -> Option<OperandRead> {
            if let Some(r) = as_read(e) {
                let t = ty(r.0)?;
                if within(r, t)? {
                    if vars.len() == 1 {
                        return Some(OperandRead::InPlace);
                    }
                    if let Some(d) = axes(r, t) {
                        return Some(OperandRead::Merged(d));
                    }
                }
            }
            // The copy: the batch variables it reads, its own, the depth.
            let mut elements = depth.checked_mul(own)?;
            for &p in &batch {
                if reads(e, self.vars[p]) {
                    elements = elements.checked_mul(self.ty.shape[p])?;
                }
            }
            (elements <= MAX_GATHERED).then_some(OperandRead::Gathered)
        };
        let mut modes = [mode(a, self.ty.shape[m])?, mode(b, columns)?];
        let cols = self.vars.len() - n;
        if cols > 1 && modes[1] == OperandRead::InPlace {
            // Several column variables read in place where they are whole
            // consecutive axes of `b`, in order, read nowhere else.
            let r = as_read(b)?;
            let own: Vec<(IndexVar, usize)> = self.vars[n..]
                .iter()
                .copied()
                .zip(self.ty.shape[n..].iter().copied())
                .collect();
            if let Some(d) = whole_axes(r.1, &ty(r.0)?.shape, &own) {
                modes[1] = OperandRead::MergedColumns(d);
            }
        }
        if cols > 1
            && !matches!(
                modes[1],
                OperandRead::Gathered | OperandRead::MergedColumns(_)
            )
        {
            // Several column variables only where `b` is gathered anyway
            // or reads them as one axis.
            return self.contraction(ty, false);
        }
        Some(ContractionForm {
            sum,
            k: vars.clone(),
            a,
            b,
            reads: modes,
            m,
            n,
            columns: self.vars.len() - n,
            batch,
        })
    }
}

/// Where `vars` (each with its extent, from 0) are whole consecutive axes
/// of an operand of `shape` read at `index`, in order, and read by no other
/// axis: the first of those axes.
fn whole_axes(index: &[Affine], shape: &[usize], vars: &[(IndexVar, usize)]) -> Option<usize> {
    let first = vars.first()?.0;
    let d = index.iter().position(|e| e.as_var() == Some(first))?;
    let whole = vars.iter().enumerate().all(|(o, &(v, extent))| {
        index.get(d + o).and_then(Affine::as_var) == Some(v) && shape.get(d + o) == Some(&extent)
    });
    let elsewhere = index.iter().enumerate().any(|(p, e)| {
        !(d..d + vars.len()).contains(&p) && e.terms.iter().any(|t| vars.iter().any(|k| k.0 == t.1))
    });
    (whole && !elsewhere).then_some(d)
}

impl ComputeBody {
    /// The definition (a later local's index, or `locals.len()` for the
    /// output) that local `t` can be computed inside of, as the epilogue of
    /// `t`'s own loop nest: the only definition reading `t`, reading it
    /// only at its own index (`t[i, j]` in `out[i, j] = ..`), of `t`'s
    /// shape, and with no reduction. `h` in `let h[i, j] = ..; out[i, j] =
    /// h[i, j] * sigmoid(h[i, j])` is then computed once per element and
    /// never stored.
    pub fn sole_elementwise_reader(&self, t: usize) -> Option<usize> {
        let local = self.locals.get(t)?;
        let defs: Vec<&ElemDef> = self.locals.iter().chain([&self.out]).collect();
        let mut reader = None;
        for (d, def) in defs.iter().enumerate().skip(t + 1) {
            let (mut reads, mut identity, mut reduces) = (false, true, false);
            def.expr.visit(&mut |e| match e {
                ScalarExpr::Read {
                    src: Source::Local(i),
                    index,
                } if *i as usize == t => {
                    reads = true;
                    identity &= index.len() == def.vars.len()
                        && index
                            .iter()
                            .zip(&def.vars)
                            .all(|(e, v)| e.as_var() == Some(*v));
                }
                ScalarExpr::Reduce { .. } => reduces = true,
                _ => {}
            });
            if !reads {
                continue;
            }
            if reader.is_some() || !identity || reduces || def.ty.shape != local.ty.shape {
                return None;
            }
            reader = Some(d);
        }
        reader
    }
}

/// Elements a local made by [`ComputeBody::factored`] may hold.
pub const MAX_FACTORED_LOCAL: usize = 1 << 26;

/// The factors of a product (`a * b * c`, nested any way), in order.
fn factors<'e>(e: &'e ScalarExpr, out: &mut Vec<&'e ScalarExpr>) {
    match e {
        ScalarExpr::Binary(BinaryOp::Mul, a, b) => {
            factors(a, out);
            factors(b, out);
        }
        other => out.push(other),
    }
}

/// The operands expression `e` reads, added to `out` in the order first
/// read.
fn inputs_read(e: &ScalarExpr, out: &mut Vec<u32>) {
    e.visit(&mut |s| {
        if let ScalarExpr::Read {
            src: Source::Input(i),
            ..
        } = s
            && !out.contains(i)
        {
            out.push(*i);
        }
    });
}

/// The variables expression `e` reads with.
fn vars_read(e: &ScalarExpr, out: &mut Vec<IndexVar>) {
    e.visit(&mut |s| {
        if let ScalarExpr::Read { index, .. } = s {
            for a in index {
                for &(_, v) in &a.terms {
                    if !out.contains(&v) {
                        out.push(v);
                    }
                }
            }
        }
    });
}

impl ComputeBody {
    /// The body with its output's sum of a product of three or more
    /// factors computed in two steps when two of the factors are plain
    /// reads that alone read some of the sum's variables: those two are
    /// contracted first into a new local over their other variables, which
    /// the sum then reads in their place. `out[i] = sum[j, g](a[i, g] * b[j,
    /// g] * c[i, j] * f(s[i] + t[j]))` (the gradient of an edge-gated graph
    /// aggregation) becomes `let t[i, j] = sum[g](a[i, g] * b[j, g]); out[i]
    /// = sum[j](t[i, j] * c[i, j] * f(s[i] + t[j]))`: a product the lowering
    /// runs packed, then one pass over `i, j` rather than one over `i, j,
    /// g` evaluating `f` at every point (einsum's contraction order, as
    /// opt_einsum chooses it, for the one pair that saves most). The local's
    /// axes are in the order of a factor reading exactly its variables
    /// (`c[j, i]` makes it `t[j, i]`), so that the pass over both reads them
    /// along the same axis. None when
    /// no pair qualifies, the local would pass [`MAX_FACTORED_LOCAL`]
    /// elements, or the output is not f32 or f64 (a narrow local would
    /// round the partial sums).
    ///
    /// When both factors read operands of the output's element type (`a`
    /// and `b` above, not locals), the product is an operator of its own
    /// ([`Factored::Hoisted`]) rather than a local: written in a canonical
    /// form (variables numbered in order, its operands renumbered in
    /// order, the two factors in printed order), so that the same product
    /// in two operators is one node (`graph.canonicalize` reuses it): a
    /// gradient with respect to row scores and one with respect to column
    /// scores both read `sum[g](a[i, g] * b[j, g])`.
    pub fn factored(&self, inputs: &[&TensorType]) -> Option<Factored> {
        let out = &self.out;
        // The local holds partial sums in the output's type: f16 or bf16
        // would round them, where the one sum rounds once.
        if !matches!(out.ty.dtype, DType::F32 | DType::F64) {
            return None;
        }
        let ScalarExpr::Reduce {
            kind: ReduceKind::Sum,
            vars,
            body,
        } = &out.expr
        else {
            return None;
        };
        let mut fs = Vec::new();
        factors(body, &mut fs);
        if fs.len() < 3 {
            return None;
        }
        let extent = |v: IndexVar| -> Option<(i64, i64)> {
            if let Some(k) = out.vars.iter().position(|&w| w == v) {
                return Some((0, *out.ty.shape.get(k)? as i64));
            }
            vars.iter().find(|r| r.var == v).map(|r| (r.lo, r.hi))
        };
        // Plain reads: every index one variable.
        let plain = |e: &ScalarExpr| -> Option<Vec<IndexVar>> {
            let (_, index) = as_read(e)?;
            index.iter().map(Affine::as_var).collect()
        };
        let read_by: Vec<Vec<IndexVar>> = fs
            .iter()
            .map(|f| {
                let mut v = Vec::new();
                vars_read(f, &mut v);
                v
            })
            .collect();
        // The pair saving most: (work saved, a, b, contracted, kept).
        type Pair = (i64, usize, usize, Vec<RangeVar>, Vec<IndexVar>);
        let mut best: Option<Pair> = None;
        for a in 0..fs.len() {
            for b in a + 1..fs.len() {
                let (Some(va), Some(vb)) = (plain(fs[a]), plain(fs[b])) else {
                    continue;
                };
                let inner: Vec<RangeVar> = vars
                    .iter()
                    .filter(|r| {
                        (va.contains(&r.var) || vb.contains(&r.var))
                            && (0..fs.len())
                                .filter(|&k| k != a && k != b)
                                .all(|k| !read_by[k].contains(&r.var))
                    })
                    .copied()
                    .collect();
                if inner.is_empty() {
                    continue;
                }
                let mut kept: Vec<IndexVar> = Vec::new();
                for v in va.iter().chain(&vb) {
                    if !kept.contains(v) && !inner.iter().any(|r| r.var == *v) {
                        kept.push(*v);
                    }
                }
                // The local's axes in the order another factor reads
                // exactly those variables in (`c[j, i]` beside it: the
                // local is `t[j, i]`, so that the pass reading both runs
                // along one axis of both, not across the rows of one);
                // else in the output's order, then the sum's.
                let alongside = (0..fs.len())
                    .filter(|&k| k != a && k != b)
                    .filter_map(|k| plain(fs[k]))
                    .find(|p| p.len() == kept.len() && kept.iter().all(|v| p.contains(v)));
                match alongside {
                    Some(order) => kept = order,
                    None => kept.sort_by_key(|v| {
                        out.vars.iter().position(|w| w == v).unwrap_or(
                            out.vars.len() + vars.iter().position(|r| r.var == *v).unwrap_or(0),
                        )
                    }),
                }
                let Some(bounds) = kept.iter().map(|&v| extent(v)).collect::<Option<Vec<_>>>()
                else {
                    continue;
                };
                let elements = bounds.iter().try_fold(1usize, |n, &(lo, hi)| {
                    (lo == 0 && hi > 0)
                        .then(|| n.checked_mul(hi as usize))
                        .flatten()
                });
                let saved: i64 = inner.iter().map(|r| (r.hi - r.lo).max(0)).product();
                match elements {
                    Some(n) if n <= MAX_FACTORED_LOCAL && saved >= 2 => {}
                    _ => continue,
                }
                if best.as_ref().is_none_or(|b| saved > b.0) {
                    best = Some((saved, a, b, inner, kept));
                }
            }
        }
        let (_, a, b, inner, kept) = best?;
        let shape: Vec<usize> = kept
            .iter()
            .filter_map(|&v| extent(v).map(|(_, hi)| hi as usize))
            .collect();
        let local = ElemDef {
            vars: kept.clone(),
            ty: TensorType::new(out.ty.dtype, shape),
            expr: ScalarExpr::Reduce {
                kind: ReduceKind::Sum,
                vars: inner.clone(),
                body: Box::new(ScalarExpr::Binary(
                    BinaryOp::Mul,
                    Box::new(fs[a].clone()),
                    Box::new(fs[b].clone()),
                )),
            },
        };
        let read = ScalarExpr::Read {
            src: Source::Local(self.locals.len() as u32),
            index: kept.iter().map(|&v| Affine::var(v)).collect(),
        };
        let rest = (0..fs.len())
            .filter(|&k| k != a && k != b)
            .fold(read, |acc, k| {
                ScalarExpr::Binary(BinaryOp::Mul, Box::new(acc), Box::new(fs[k].clone()))
            });
        let outer: Vec<RangeVar> = vars
            .iter()
            .filter(|r| !inner.iter().any(|i| i.var == r.var))
            .copied()
            .collect();
        let expr = if outer.is_empty() {
            rest
        } else {
            ScalarExpr::Reduce {
                kind: ReduceKind::Sum,
                vars: outer,
                body: Box::new(rest),
            }
        };
        let out = ElemDef {
            vars: out.vars.clone(),
            ty: out.ty.clone(),
            expr,
        };
        let operand_of = |e: &ScalarExpr| match as_read(e) {
            Some((Source::Input(i), _))
                if inputs
                    .get(i as usize)
                    .is_some_and(|t| t.dtype == local.ty.dtype) =>
            {
                Some(i)
            }
            _ => None,
        };
        if let (Some(ia), Some(ib)) = (operand_of(fs[a]), operand_of(fs[b])) {
            return Some(self.hoisted(&local, [ia, ib], out, inputs.len()));
        }
        let mut locals = self.locals.clone();
        locals.push(local);
        Some(Factored::Local(ComputeBody {
            name: self.name.clone(),
            locals,
            out,
        }))
    }

    /// [`Factored::Hoisted`]: `local` (a product of `operands`) as an
    /// operator of its own, and `out` (reading it as the local after the
    /// body's) reading it as an operand instead.
    fn hoisted(
        &self,
        local: &ElemDef,
        operands: [u32; 2],
        out: ElemDef,
        inputs: usize,
    ) -> Factored {
        let product = local.canonical(&operands);
        let mut operands = operands.to_vec();
        operands.sort_unstable();
        operands.dedup();
        // The rest reads the product where it read the local, as one more
        // operand, and no longer the operands it does not read.
        let hoisted = self.locals.len() as u32;
        let n = inputs as u32;
        let rest = ComputeBody {
            name: self.name.clone(),
            locals: self.locals.clone(),
            out,
        }
        .mapped(&mut |s| match s {
            Source::Local(t) if t == hoisted => Source::Input(n),
            other => other,
        });
        let (rest, read) = rest.reading_only_what_it_reads();
        let rest_operands = read.into_iter().map(|i| (i < n).then_some(i)).collect();
        Factored::Hoisted {
            product: ComputeBody {
                name: self.name.clone(),
                locals: Vec::new(),
                out: product,
            },
            operands,
            rest,
            rest_operands,
        }
    }

    /// The body with every read's source mapped by `f`.
    fn mapped(&self, f: &mut dyn FnMut(Source) -> Source) -> ComputeBody {
        let map = |d: &ElemDef, f: &mut dyn FnMut(Source) -> Source| ElemDef {
            expr: map_sources(&d.expr, f),
            ..d.clone()
        };
        ComputeBody {
            name: self.name.clone(),
            locals: self.locals.iter().map(|d| map(d, f)).collect(),
            out: map(&self.out, f),
        }
    }

    /// The body reading only the operands it reads, renumbered in order,
    /// and which of the old operands those are.
    pub fn reading_only_what_it_reads(&self) -> (ComputeBody, Vec<u32>) {
        let mut read: Vec<u32> = Vec::new();
        for def in self.locals.iter().chain([&self.out]) {
            inputs_read(&def.expr, &mut read);
        }
        read.sort_unstable();
        let body = self.mapped(&mut |s| match s {
            Source::Input(i) => {
                Source::Input(read.iter().position(|&r| r == i).unwrap_or(0) as u32)
            }
            local => local,
        });
        (body, read)
    }

    /// Whether `self` and `other` compute the same thing (their names aside).
    pub fn same_as(&self, other: &ComputeBody) -> bool {
        self.locals == other.locals && self.out == other.out
    }
}

/// An element-wise operand of a user operator's sum (see
/// [`ComputeBody::elementwise_operand`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ElementwiseOperand<'a> {
    /// The operand as a definition of its own, in canonical form, over
    /// `operands` renumbered in order.
    pub def: ElemDef,
    /// The operator's operands it reads, in increasing order.
    pub operands: Vec<u32>,
    /// The sum it is a factor of.
    sum: &'a ScalarExpr,
    /// Which of the sum's factors it is.
    factors: Vec<usize>,
    /// Its variables in the operator, in `def`'s order.
    vars: Vec<IndexVar>,
}

impl ComputeBody {
    /// The factors of the output's sum that do not read its last variable
    /// (the columns of the product it is), when they are more than one read
    /// or not a read: the rows' operand of the product, computed element
    /// by element (`a[i, j] * sigmoid(s[i] + t[j])` in `out[i, g] =
    /// sum[j](a[i, j] * sigmoid(s[i] + t[j]) * h[j, g])`). Only where it
    /// reads operands alone, of the output's element type, each index one
    /// variable spanning the whole axis it reads, the sum has other factors,
    /// and it has at most [`MAX_GATHERED`] elements. As a definition of its own in canonical form (its variables
    /// in the order its read of the most elements reads them, numbered in
    /// order, its factors in printed order), so that two operators with the
    /// same operand (a gated aggregation and its gradient) share one.
    pub fn elementwise_operand<'a>(
        &'a self,
        inputs: &[&TensorType],
    ) -> Option<ElementwiseOperand<'a>> {
        let out = &self.out;
        let last = *out.vars.last()?;
        let mut sums = Vec::new();
        out.expr.visit(&mut |e| {
            if let ScalarExpr::Reduce { .. } = e {
                sums.push(e);
            }
        });
        let [
            sum @ ScalarExpr::Reduce {
                kind: ReduceKind::Sum,
                vars,
                body,
            },
        ] = sums[..]
        else {
            return None;
        };
        let mut fs = Vec::new();
        factors(body, &mut fs);
        let mine: Vec<usize> = (0..fs.len()).filter(|&k| !reads(fs[k], last)).collect();
        if mine.is_empty()
            || mine.len() == fs.len()
            || mine.len() == 1 && as_read(fs[mine[0]]).is_some()
        {
            return None;
        }
        // The extent of each variable read: whole axes of operands of the
        // output's type, each index one variable.
        let extent = |v: IndexVar| -> Option<usize> {
            if let Some(p) = out.vars.iter().position(|&w| w == v) {
                return out.ty.shape.get(p).copied();
            }
            let r = vars.iter().find(|r| r.var == v)?;
            (r.lo == 0).then_some(r.hi as usize)
        };
        let mut ok = true;
        let mut widest: Option<(usize, Vec<IndexVar>)> = None;
        let mut used: Vec<IndexVar> = Vec::new();
        for &k in &mine {
            fs[k].visit(&mut |e| match e {
                ScalarExpr::Read {
                    src: Source::Input(i),
                    index,
                } => {
                    let Some(t) = inputs.get(*i as usize) else {
                        ok = false;
                        return;
                    };
                    ok &= t.dtype == out.ty.dtype && index.len() == t.shape.len();
                    let mut at = Vec::new();
                    for (a, &dim) in index.iter().zip(&t.shape) {
                        match a.as_var() {
                            Some(v) if extent(v) == Some(dim) => at.push(v),
                            _ => ok = false,
                        }
                    }
                    for &v in &at {
                        if !used.contains(&v) {
                            used.push(v);
                        }
                    }
                    let n = t.shape.iter().product();
                    if widest.as_ref().is_none_or(|w| n > w.0) {
                        widest = Some((n, at));
                    }
                }
                ScalarExpr::Read { .. } | ScalarExpr::Reduce { .. } => ok = false,
                _ => {}
            });
        }
        if !ok || used.len() < 2 {
            return None;
        }
        // Its variables: as its widest read reads them, then the others.
        let mut order: Vec<IndexVar> = Vec::new();
        for v in widest
            .map(|w| w.1)
            .unwrap_or_default()
            .into_iter()
            .chain(used)
        {
            if !order.contains(&v) {
                order.push(v);
            }
        }
        let shape = order
            .iter()
            .map(|&v| extent(v))
            .collect::<Option<Vec<_>>>()?;
        // No larger than a prologue's copy may be (`MAX_GATHERED`): a
        // shared operand is stored, where a larger prologue keeps its
        // scalar loops and stores nothing.
        if shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .is_none_or(|n| n > MAX_GATHERED)
        {
            return None;
        }
        let mut operands: Vec<u32> = Vec::new();
        for &k in &mine {
            inputs_read(fs[k], &mut operands);
        }
        operands.sort_unstable();
        let expr = mine[1..].iter().fold(fs[mine[0]].clone(), |acc, &k| {
            ScalarExpr::Binary(BinaryOp::Mul, Box::new(acc), Box::new(fs[k].clone()))
        });
        let def = ElemDef {
            vars: order.clone(),
            ty: TensorType::new(out.ty.dtype, shape),
            expr,
        }
        .canonical(&operands);
        // Its factors in printed order.
        let mut parts = Vec::new();
        factors(&def.expr, &mut parts);
        let mut parts: Vec<(String, ScalarExpr)> =
            parts.into_iter().map(|e| (printed(e), e.clone())).collect();
        parts.sort_by(|a, b| a.0.cmp(&b.0));
        let mut parts = parts.into_iter().map(|p| p.1);
        let first = parts.next()?;
        let expr = parts.fold(first, |acc, e| {
            ScalarExpr::Binary(BinaryOp::Mul, Box::new(acc), Box::new(e))
        });
        Some(ElementwiseOperand {
            def: ElemDef { expr, ..def },
            operands,
            sum,
            factors: mine,
            vars: order,
        })
    }

    /// The body with `operand`'s factors replaced by a read of operand
    /// `input` (which holds `operand.def`).
    pub fn reading_operand(&self, operand: &ElementwiseOperand<'_>, input: u32) -> ComputeBody {
        let expr = rebuild(&self.out.expr, &mut |e| {
            let ScalarExpr::Reduce { kind, vars, body } = e else {
                return None;
            };
            if !std::ptr::eq(e, operand.sum) {
                return None;
            }
            let mut fs = Vec::new();
            factors(body, &mut fs);
            let read = ScalarExpr::Read {
                src: Source::Input(input),
                index: operand.vars.iter().map(|&v| Affine::var(v)).collect(),
            };
            let body = (0..fs.len())
                .filter(|k| !operand.factors.contains(k))
                .fold(read, |acc, k| {
                    ScalarExpr::Binary(BinaryOp::Mul, Box::new(acc), Box::new(fs[k].clone()))
                });
            Some(ScalarExpr::Reduce {
                kind: *kind,
                vars: vars.clone(),
                body: Box::new(body),
            })
        });
        ComputeBody {
            name: self.name.clone(),
            locals: self.locals.clone(),
            out: ElemDef {
                expr,
                ..self.out.clone()
            },
        }
    }
}

/// `e` as the IR prints it.
fn printed(e: &ScalarExpr) -> String {
    let mut out = String::new();
    e.write(&mut out, true);
    out
}

/// What [`ComputeBody::factored`] makes of a sum of products.
#[derive(Debug, Clone, PartialEq)]
pub enum Factored {
    /// The operator with the product as a new local.
    Local(ComputeBody),
    /// The product as an operator of its own, over the operator's
    /// `operands` (indices, in increasing order), and the rest of the
    /// operator, over `rest_operands`: the operator's it still reads (in
    /// increasing order), then the product (`None`).
    Hoisted {
        /// The product, in canonical form.
        product: ComputeBody,
        /// The operands it reads, as indices of the operator's.
        operands: Vec<u32>,
        /// The rest of the operator.
        rest: ComputeBody,
        /// Its operands: the operator's (`Some(index)`), the product (`None`).
        rest_operands: Vec<Option<u32>>,
    },
}

impl ElemDef {
    /// This definition, of operands `operands` (each read as its position
    /// among them, sorted), with its variables numbered in order: its own,
    /// then each reduction's as they appear; a product's two factors in
    /// printed order. Two definitions that differ only in naming are then
    /// equal.
    fn canonical(&self, operands: &[u32]) -> ElemDef {
        let mut sorted = operands.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut names: HashMap<IndexVar, IndexVar> = HashMap::new();
        for &v in &self.vars {
            let next = IndexVar(names.len() as u32);
            names.entry(v).or_insert(next);
        }
        self.expr.visit(&mut |e| {
            if let ScalarExpr::Reduce { vars, .. } = e {
                for r in vars {
                    let next = IndexVar(names.len() as u32);
                    names.entry(r.var).or_insert(next);
                }
            }
        });
        let rename = |v: IndexVar| names.get(&v).copied().unwrap_or(v);
        let expr = rebuild(&self.expr, &mut |e| match e {
            ScalarExpr::Read { src, index } => Some(ScalarExpr::Read {
                src: match src {
                    Source::Input(i) => {
                        Source::Input(sorted.iter().position(|s| s == i).unwrap_or(0) as u32)
                    }
                    local => *local,
                },
                index: index
                    .iter()
                    .map(|a| Affine {
                        terms: a.terms.iter().map(|&(c, v)| (c, rename(v))).collect(),
                        constant: a.constant,
                    })
                    .collect(),
            }),
            _ => None,
        });
        let expr = rebuild(&expr, &mut |e| match e {
            ScalarExpr::Reduce { kind, vars, body } => Some(ScalarExpr::Reduce {
                kind: *kind,
                vars: vars
                    .iter()
                    .map(|r| RangeVar {
                        var: rename(r.var),
                        ..*r
                    })
                    .collect(),
                body: Box::new(match body.as_ref() {
                    ScalarExpr::Binary(BinaryOp::Mul, x, y) => {
                        let (px, py) = (printed(x), printed(y));
                        let (x, y) = if py < px { (y, x) } else { (x, y) };
                        ScalarExpr::Binary(BinaryOp::Mul, x.clone(), y.clone())
                    }
                    other => other.clone(),
                }),
            }),
            _ => None,
        });
        ElemDef {
            vars: self.vars.iter().map(|&v| rename(v)).collect(),
            ty: self.ty.clone(),
            expr,
        }
    }
}

/// `e` with every read's source mapped by `f`.
pub(crate) fn map_sources(e: &ScalarExpr, f: &mut dyn FnMut(Source) -> Source) -> ScalarExpr {
    rebuild(e, &mut |e| match e {
        ScalarExpr::Read { src, index } => Some(ScalarExpr::Read {
            src: f(*src),
            index: index.clone(),
        }),
        _ => None,
    })
}

/// Rebuilds `e` bottom-up, `leaf` replacing the nodes it returns `Some` for.
pub(crate) fn rebuild(
    e: &ScalarExpr,
    leaf: &mut dyn FnMut(&ScalarExpr) -> Option<ScalarExpr>,
) -> ScalarExpr {
    if let Some(r) = leaf(e) {
        return r;
    }
    let mut r = |x: &ScalarExpr| Box::new(rebuild(x, leaf));
    match e {
        ScalarExpr::Const(_) | ScalarExpr::Read { .. } => e.clone(),
        ScalarExpr::Unary(u, a) => ScalarExpr::Unary(*u, r(a)),
        ScalarExpr::Cast(t, a) => ScalarExpr::Cast(*t, r(a)),
        ScalarExpr::Binary(op, a, c) => {
            let a = r(a);
            ScalarExpr::Binary(*op, a, r(c))
        }
        ScalarExpr::Compare(op, a, c) => {
            let a = r(a);
            ScalarExpr::Compare(*op, a, r(c))
        }
        ScalarExpr::Select(c, a, f) => {
            let c = r(c);
            let a = r(a);
            ScalarExpr::Select(c, a, r(f))
        }
        ScalarExpr::Reduce { kind, vars, body } => ScalarExpr::Reduce {
            kind: *kind,
            vars: vars.clone(),
            body: r(body),
        },
    }
}
