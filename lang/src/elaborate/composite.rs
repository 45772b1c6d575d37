//! Built-ins that are compositions of graph ops: activations, logical
//! operators, shape helpers, further reductions, index-valued functions
//! (`argmax`, `one_hot`, `arange`) and gathers. Each expands, where it is
//! called, into the ops it is made of, so it needs no interpreter, lowering
//! or code generator of its own and equality saturation and fusion see
//! through it (docs/language.md lists their meanings).

use super::*;

/// The largest stride, padding or dilation `conv3d` takes (its index
/// arithmetic stays far from overflowing).
const MAX_WINDOW: usize = 1 << 20;

impl Elab<'_> {
    /// `leaky_relu(x, alpha)`: `x` below 0 scaled by `alpha`.
    pub(super) fn call_leaky_relu(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let (x, d) = self.float_operand(cx, c)?;
        let (zero, alpha) = (self.k(cx, 0.0, d), self.k(cx, c.float(1)?, d));
        let neg = self.cmp(cx, CmpOp::Lt, x, zero, c.span)?;
        let scaled = self.bin(cx, BinaryOp::Mul, x, alpha, c.span)?;
        Ok(EVal::Tensor(self.add(
            cx,
            Op::Select,
            &[neg, scaled, x],
            c.span,
        )?))
    }

    /// `elu(x, alpha)`: `alpha (e^x - 1)` below 0.
    pub(super) fn call_elu(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let (x, d) = self.float_operand(cx, c)?;
        let (zero, one, alpha) = (
            self.k(cx, 0.0, d),
            self.k(cx, 1.0, d),
            self.k(cx, c.float(1)?, d),
        );
        let neg = self.cmp(cx, CmpOp::Lt, x, zero, span)?;
        let e = self.add(cx, Op::Unary(UnaryOp::Exp), &[x], span)?;
        let em1 = self.bin(cx, BinaryOp::Sub, e, one, span)?;
        let scaled = self.bin(cx, BinaryOp::Mul, em1, alpha, span)?;
        Ok(EVal::Tensor(self.add(
            cx,
            Op::Select,
            &[neg, scaled, x],
            span,
        )?))
    }

    /// `hardsigmoid(x, alpha, beta)`.
    pub(super) fn call_hardsigmoid(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let (x, d) = self.float_operand(cx, c)?;
        let (alpha, beta) = (self.k(cx, c.float(1)?, d), self.k(cx, c.float(2)?, d));
        Ok(EVal::Tensor(self.hard_sigmoid(cx, x, alpha, beta, c.span)?))
    }

    /// The first argument of `c`, a float tensor, and its element type.
    fn float_operand(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<(Value, DType)> {
        let x = self.float_tensor(cx, req(&c.a, 0), c.name())?;
        Ok((x, Self::ty(cx, x).dtype))
    }

    /// `softplus`, `hardswish`, `mish`, `log1p`, `expm1`, `isnan`, `isinf`.
    pub(super) fn call_softplus(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let x = self.float_tensor(cx, req(a, 0), name)?;
        let d = Self::ty(cx, x).dtype;
        match name {
            "softplus" => t(self.softplus(cx, x, span)?),
            "hardswish" => {
                let (al, be) = (self.k(cx, 1.0 / 6.0, d), self.k(cx, 0.5, d));
                let h = self.hard_sigmoid(cx, x, al, be, span)?;
                t(self.bin(cx, BinaryOp::Mul, x, h, span)?)
            }
            "mish" => {
                let sp = self.softplus(cx, x, span)?;
                let th = self.add(cx, Op::Unary(UnaryOp::Tanh), &[sp], span)?;
                t(self.bin(cx, BinaryOp::Mul, x, th, span)?)
            }
            "log1p" => {
                // Goldberg: log(u) * x / (u - 1) with u = 1 + x
                // rounded, exact where u rounds to 1.
                let one = self.k(cx, 1.0, d);
                let u = self.bin(cx, BinaryOp::Add, x, one, span)?;
                let um1 = self.bin(cx, BinaryOp::Sub, u, one, span)?;
                let lu = self.add(cx, Op::Unary(UnaryOp::Log), &[u], span)?;
                let num = self.bin(cx, BinaryOp::Mul, lu, x, span)?;
                let q = self.bin(cx, BinaryOp::Div, num, um1, span)?;
                let at1 = self.cmp(cx, CmpOp::Eq, u, one, span)?;
                // u - 1 = inf (x = inf) gives log(u) itself.
                let inf = self.k(cx, f64::INFINITY, d);
                let big = self.cmp(cx, CmpOp::Eq, u, inf, span)?;
                let q = self.add(cx, Op::Select, &[big, lu, q], span)?;
                t(self.add(cx, Op::Select, &[at1, x, q], span)?)
            }
            "expm1" => {
                // Kahan: (u - 1) * x / log(u) with u = e^x rounded.
                let one = self.k(cx, 1.0, d);
                let u = self.add(cx, Op::Unary(UnaryOp::Exp), &[x], span)?;
                let um1 = self.bin(cx, BinaryOp::Sub, u, one, span)?;
                let lu = self.add(cx, Op::Unary(UnaryOp::Log), &[u], span)?;
                let num = self.bin(cx, BinaryOp::Mul, um1, x, span)?;
                let q = self.bin(cx, BinaryOp::Div, num, lu, span)?;
                let at1 = self.cmp(cx, CmpOp::Eq, u, one, span)?;
                // Where u - 1 is -1 or inf the quotient is not needed.
                let minus = self.k(cx, -1.0, d);
                let low = self.cmp(cx, CmpOp::Eq, um1, minus, span)?;
                let inf = self.k(cx, f64::INFINITY, d);
                let high = self.cmp(cx, CmpOp::Eq, u, inf, span)?;
                let q = self.add(cx, Op::Select, &[low, minus, q], span)?;
                let q = self.add(cx, Op::Select, &[high, u, q], span)?;
                t(self.add(cx, Op::Select, &[at1, x, q], span)?)
            }
            "isnan" => t(self.cmp(cx, CmpOp::Ne, x, x, span)?),
            _ => {
                let ax = self.add(cx, Op::Unary(UnaryOp::Abs), &[x], span)?;
                let inf = self.k(cx, f64::INFINITY, d);
                t(self.cmp(cx, CmpOp::Eq, ax, inf, span)?)
            }
        }
    }

    /// `clamp`, `clip`.
    pub(super) fn call_clamp(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let x = self.tensor(cx, req(a, 0))?;
        let mut v = x;
        for (i, b) in [(1, BinaryOp::Max), (2, BinaryOp::Min)] {
            if let Some(e) = a[i] {
                let bound = self.expr(cx, e)?;
                let (p, q) = self.pair(cx, EVal::Tensor(v), bound, span, e.span)?;
                v = self.bin(cx, b, p, q, span)?;
            }
        }
        t(v)
    }

    /// `logical_and`, `logical_or`, `logical_xor`.
    pub(super) fn call_logical_and(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let x = self.bool_tensor(cx, req(a, 0), name)?;
        let y = self.bool_tensor(cx, req(a, 1), name)?;
        let (tr, fa) = (self.k(cx, 1.0, DType::Bool), self.k(cx, 0.0, DType::Bool));
        t(match name {
            "logical_and" => self.add(cx, Op::Select, &[x, y, fa], span)?,
            "logical_or" => self.add(cx, Op::Select, &[x, tr, y], span)?,
            _ => self.cmp(cx, CmpOp::Ne, x, y, span)?,
        })
    }

    /// `logical_not`.
    pub(super) fn call_logical_not(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let x = self.bool_tensor(cx, req(a, 0), name)?;
        let fa = self.k(cx, 0.0, DType::Bool);
        t(self.cmp(cx, CmpOp::Eq, x, fa, span)?)
    }

    /// `squeeze`, `unsqueeze`, `flatten`.
    pub(super) fn call_squeeze(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let (x, ty) = self.first_tensor(cx, c)?;
        let shape = match name {
            "squeeze" => {
                let axes = match a[1] {
                    Some(e) => normalize_axes(&const_int_or_list(e, &cx.dims)?, &ty)?,
                    None => (0..ty.rank()).filter(|&i| ty.shape[i] == 1).collect(),
                };
                if let Some(&bad) = axes.iter().find(|&&i| ty.shape[i] != 1) {
                    return Err(Diagnostic::new(
                        format!(
                            "squeeze: axis {bad} of {ty} has extent {}, not 1",
                            ty.shape[bad]
                        ),
                        a[1].map_or(span, |e| e.span),
                        "not of extent 1",
                    ));
                }
                (0..ty.rank())
                    .filter(|i| !axes.contains(i))
                    .map(|i| ty.shape[i])
                    .collect()
            }
            "unsqueeze" => {
                let items = const_int_or_list(req(a, 1), &cx.dims)?;
                let out = TensorType::new(ty.dtype, vec![1; ty.rank() + items.len()]);
                let axes = normalize_axes(&items, &out)?;
                let mut rest = ty.shape.iter();
                (0..out.rank())
                    .map(|i| {
                        if axes.contains(&i) {
                            1
                        } else {
                            rest.next().copied().unwrap_or(1)
                        }
                    })
                    .collect()
            }
            _ => {
                let ax = match a[1] {
                    Some(e) => {
                        let v = const_int(e, &cx.dims)?;
                        let r = ty.rank() as i64;
                        if v < -r || v > r {
                            return Err(Diagnostic::new(
                                format!("flatten: axis {v} is out of range for {ty}"),
                                e.span,
                                "axis out of range",
                            ));
                        }
                        if v < 0 { (v + r) as usize } else { v as usize }
                    }
                    None => 1.min(ty.rank()),
                };
                vec![
                    ty.shape[..ax].iter().product(),
                    ty.shape[ax..].iter().product(),
                ]
            }
        };
        t(self.add(cx, Op::Reshape { shape }, &[x], span)?)
    }

    /// `expand`.
    pub(super) fn call_expand(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let (x, ty) = self.first_tensor(cx, c)?;
        let want = positive_shape(&const_ints(req(a, 1), &cx.dims)?)?;
        // NumPy's broadcast of the two shapes (either may be larger).
        let r = ty.rank().max(want.len());
        let at = |s: &[usize], i: usize| {
            if i + s.len() >= r {
                s[i + s.len() - r]
            } else {
                1
            }
        };
        let mut shape = Vec::with_capacity(r);
        for i in 0..r {
            let (p, q) = (at(&ty.shape, i), at(&want, i));
            if p != q && p != 1 && q != 1 {
                return Err(Diagnostic::new(
                    format!("expand: {ty} does not broadcast with {want:?}"),
                    span,
                    "shapes do not broadcast",
                ));
            }
            shape.push(p.max(q));
        }
        t(self.add(cx, Op::Broadcast { shape }, &[x], span)?)
    }

    /// `stack`.
    pub(super) fn call_stack(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let vals = self.tensor_list(cx, req(a, 0), "stack")?;
        let ty = Self::ty(cx, vals[0]);
        let out = TensorType::new(ty.dtype, vec![1; ty.rank() + 1]);
        let axis = match a[1] {
            Some(e) => normalize_axis(const_int(e, &cx.dims)?, &out, e.span)?,
            None => 0,
        };
        let mut shape = ty.shape.clone();
        shape.insert(axis, 1);
        let mut parts = Vec::with_capacity(vals.len());
        for v in vals {
            parts.push(self.add(
                cx,
                Op::Reshape {
                    shape: shape.clone(),
                },
                &[v],
                span,
            )?);
        }
        t(self.add(cx, Op::Concat { axis }, &parts, span)?)
    }

    /// `split`.
    pub(super) fn call_split(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let (x, ty) = self.first_tensor(cx, c)?;
        let axis = c.axis(2, &ty, &cx.dims)?;
        let sizes = const_ints(req(a, 1), &cx.dims)?;
        let total: i64 = sizes.iter().map(|(v, _)| *v).sum();
        if sizes.iter().any(|(v, _)| *v < 1) || total != ty.shape[axis] as i64 {
            return Err(Diagnostic::new(
                format!(
                    "split: sizes must be positive and add up to {}",
                    ty.shape[axis]
                ),
                req(a, 1).span,
                format!("they add up to {total}"),
            ));
        }
        let mut start = 0;
        let mut parts = Vec::new();
        for (n, _) in sizes {
            let end = start + n as usize;
            parts.push(self.add(cx, Op::Slice { axis, start, end }, &[x], span)?);
            start = end;
        }
        Ok(EVal::Tuple(parts))
    }

    /// `tile`.
    pub(super) fn call_tile(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let (x, ty) = self.first_tensor(cx, c)?;
        let reps = const_ints(req(a, 1), &cx.dims)?;
        if reps.len() != ty.rank() || reps.iter().any(|(v, _)| !(1..=4096).contains(v)) {
            return Err(Diagnostic::new(
                format!("tile: one repeat count (1 to 4096) per axis of {ty}"),
                req(a, 1).span,
                "repeats do not fit",
            ));
        }
        let mut v = x;
        for (axis, (n, _)) in reps.into_iter().enumerate() {
            if n > 1 {
                v = self.add(cx, Op::Concat { axis }, &vec![v; n as usize], span)?;
            }
        }
        t(v)
    }

    /// `log_softmax`, `logsumexp`, `variance`, `l1_norm`, `l2_norm`.
    pub(super) fn call_log_softmax(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let (x, ty) = self.first_tensor(cx, c)?;
        if name != "l1_norm" && !ty.dtype.is_float() {
            return Err(Diagnostic::new(
                format!("{name} needs a float operand, got {ty}"),
                req(a, 0).span,
                format!("{} is not a float type", ty.dtype),
            ));
        }
        let axes = match a[1] {
            Some(e) => normalize_axes(&const_int_or_list(e, &cx.dims)?, &ty)?,
            None if name == "log_softmax" => vec![ty.rank().saturating_sub(1)],
            None => (0..ty.rank()).collect(),
        };
        let keep = a
            .get(2)
            .copied()
            .flatten()
            .map(const_bool)
            .transpose()?
            .unwrap_or(false);
        let red = |me: &mut Self, cx: &mut FnCx, kind, v, keepdims| {
            me.add(
                cx,
                Op::Reduce {
                    kind,
                    axes: axes.clone(),
                    keepdims,
                },
                &[v],
                span,
            )
        };
        match name {
            "log_softmax" | "logsumexp" => {
                let (m, c, l) = self.shifted_logsumexp(cx, x, &axes, span)?;
                if name == "log_softmax" {
                    return t(self.bin(cx, BinaryOp::Sub, c, l, span)?);
                }
                let r = self.bin(cx, BinaryOp::Add, m, l, span)?;
                t(self.keep_or_drop(cx, r, &ty, &axes, keep, span)?)
            }
            "variance" => {
                let mean = red(self, cx, ReduceKind::Mean, x, true)?;
                let c = self.bin(cx, BinaryOp::Sub, x, mean, span)?;
                let sq = self.bin(cx, BinaryOp::Mul, c, c, span)?;
                t(red(self, cx, ReduceKind::Mean, sq, keep)?)
            }
            "l1_norm" => {
                let ab = self.add(cx, Op::Unary(UnaryOp::Abs), &[x], span)?;
                t(red(self, cx, ReduceKind::Sum, ab, keep)?)
            }
            _ => {
                let sq = self.bin(cx, BinaryOp::Mul, x, x, span)?;
                let s = red(self, cx, ReduceKind::Sum, sq, keep)?;
                t(self.add(cx, Op::Unary(UnaryOp::Sqrt), &[s], span)?)
            }
        }
    }

    /// `argmax`, `argmin`.
    pub(super) fn call_argmax(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let (x, ty) = self.first_tensor(cx, c)?;
        if !ty.dtype.is_numeric() {
            return Err(Diagnostic::new(
                format!("{name} of bool"),
                span,
                "not numeric",
            ));
        }
        let e = req(a, 1);
        let axis = normalize_axis(const_int(e, &cx.dims)?, &ty, e.span)?;
        let keep = c.flag(2)?;
        let kind = if name == "argmax" {
            ReduceKind::Max
        } else {
            ReduceKind::Min
        };
        let iota = self.iota(cx, ty.shape[axis], axis, ty.rank(), DType::I64);
        let (_, idx) = self.first_extreme(cx, x, kind, axis, iota, span)?;
        t(self.keep_or_drop(cx, idx, &ty, &[axis], keep, span)?)
    }

    /// `one_hot`.
    pub(super) fn call_one_hot(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let ind = self.tensor(cx, req(a, 0))?;
        let ty = Self::ty(cx, ind);
        if !ty.dtype.is_int() {
            return Err(Diagnostic::new(
                format!("one_hot needs integer indices, got {ty}"),
                req(a, 0).span,
                "not an integer type",
            ));
        }
        let depth = const_int(req(a, 1), &cx.dims)?;
        if !(1..=1 << 20).contains(&depth) {
            return Err(Diagnostic::new(
                "one_hot: depth must be positive",
                req(a, 1).span,
                "depth",
            ));
        }
        let dtype = c.dtype(2)?;
        let mut s = ty.shape.clone();
        s.push(1);
        let col = self.add(cx, Op::Reshape { shape: s }, &[ind], span)?;
        let iota = self.iota(cx, depth as usize, 0, 1, ty.dtype);
        let hit = self.cmp(cx, CmpOp::Eq, col, iota, span)?;
        t(self.add(cx, Op::Cast { to: dtype }, &[hit], span)?)
    }

    /// `arange`.
    pub(super) fn call_arange(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let (s0, fs) = const_float(req(a, 0))?;
        let (s1, fe) = const_float(req(a, 1))?;
        let (st, fst) = a[2].map(const_float).transpose()?.unwrap_or((1.0, false));
        let dtype = match a[3] {
            Some(e) => dtype_arg(e)?,
            None => literal_dtype(fs || fe || fst),
        };
        let n = if st == 0.0 {
            0.0
        } else {
            ((s1 - s0) / st).ceil()
        };
        if !(1.0..=(1u64 << 24) as f64).contains(&n) {
            return Err(Diagnostic::new(
                "arange: the range must hold 1 to 2^24 elements",
                span,
                "empty or too long",
            ));
        }
        let values = (0..n as usize)
            .map(|i| dtype.round(s0 + i as f64 * st))
            .collect();
        Ok(EVal::Tensor(cx.f.add_op(
            Op::Constant(ConstValue::Dense(values)),
            &[],
            TensorType::new(dtype, vec![n as usize]),
        )))
    }

    /// `tril`, `triu`.
    pub(super) fn call_tril(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let (x, ty) = self.first_tensor(cx, c)?;
        at_least_rank(name, &ty, 2, "a matrix", span)?;
        let k = c.int(1, &cx.dims)?;
        let (rows, cols) = (ty.shape[ty.rank() - 2], ty.shape[ty.rank() - 1]);
        let keep: Vec<f64> = (0..rows * cols)
            .map(|p| {
                let d = (p % cols) as i64 - (p / cols) as i64;
                f64::from(u8::from(if name == "tril" { d <= k } else { d >= k }))
            })
            .collect();
        let mask = cx.f.add_op(
            Op::Constant(ConstValue::Dense(keep.into())),
            &[],
            TensorType::new(DType::Bool, vec![rows, cols]),
        );
        let zero = self.k(cx, 0.0, ty.dtype);
        t(self.add(cx, Op::Select, &[mask, x, zero], span)?)
    }

    /// `global_avgpool`, `global_maxpool`.
    pub(super) fn call_global_avgpool(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let (x, ty) = self.first_tensor(cx, c)?;
        at_least_rank(name, &ty, 3, "N, C and spatial axes", span)?;
        let kind = if name == "global_avgpool" {
            ReduceKind::Mean
        } else {
            ReduceKind::Max
        };
        t(self.add(
            cx,
            Op::Reduce {
                kind,
                axes: (2..ty.rank()).collect(),
                keepdims: true,
            },
            &[x],
            span,
        )?)
    }

    /// `pad`.
    pub(super) fn call_pad(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let (x, ty) = self.first_tensor(cx, c)?;
        let pads = const_ints(req(a, 1), &cx.dims)?;
        if pads.len() != 2 * ty.rank() || pads.iter().any(|(v, _)| !(0..=1 << 20).contains(v)) {
            return Err(Diagnostic::new(
                format!("pad: one (before, after) pair of non-negative counts per axis of {ty}"),
                req(a, 1).span,
                format!("expected {} counts", 2 * ty.rank()),
            ));
        }
        let value = match a[2] {
            Some(e) => {
                let (v, fl) = const_float(e)?;
                if fl && !ty.dtype.is_float() {
                    return Err(Diagnostic::new(
                        format!("the number `{v}` cannot be a {}", ty.dtype),
                        e.span,
                        "type mismatch",
                    ));
                }
                v
            }
            None => 0.0,
        };
        let mut v = x;
        for axis in 0..ty.rank() {
            let (before, after) = (pads[2 * axis].0 as usize, pads[2 * axis + 1].0 as usize);
            v = self.padded(cx, v, axis, (before, after), value, span)?;
        }
        t(v)
    }

    /// `v` with `before` and `after` elements of `value` around it along
    /// `axis` (a concatenation with constants; `v` itself where both are 0).
    fn padded(
        &mut self,
        cx: &mut FnCx,
        v: Value,
        axis: usize,
        (before, after): (usize, usize),
        value: f64,
        span: Span,
    ) -> R<Value> {
        let ty = Self::ty(cx, v);
        let mut parts = Vec::new();
        for (n, at_end) in [(before, false), (after, true)] {
            if n > 0 {
                let mut s = ty.shape.clone();
                s[axis] = n;
                let c = cx.f.add_op(
                    Op::Constant(ConstValue::Splat(ty.dtype.round(value))),
                    &[],
                    TensorType::new(ty.dtype, s),
                );
                parts.push((at_end, c));
            }
        }
        if parts.is_empty() {
            return Ok(v);
        }
        let mut ins: Vec<Value> = parts.iter().filter(|p| !p.0).map(|p| p.1).collect();
        ins.push(v);
        ins.extend(parts.iter().filter(|p| p.0).map(|p| p.1));
        self.add(cx, Op::Concat { axis }, &ins, span)
    }

    /// `cumsum`.
    pub(super) fn call_cumsum(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let (x, ty) = self.first_tensor(cx, c)?;
        if !ty.dtype.is_numeric() {
            return Err(Diagnostic::new("cumsum of bool", span, "not numeric"));
        }
        let e = req(a, 1);
        let axis = normalize_axis(const_int(e, &cx.dims)?, &ty, e.span)?;
        let excl = c.flag(2)?;
        let rev = c.flag(3)?;
        let n = ty.shape[axis];
        if n > 4096 {
            return Err(Diagnostic::new(
                "cumsum over more than 4096 elements",
                span,
                "too long",
            ));
        }
        // x as [.., n (k), 1, ..] against a mask [n (k), n (i)] of the k
        // each position i sums, a where (so an infinity outside a
        // prefix stays out), summed over k.
        let mut xs = ty.shape.clone();
        xs.insert(axis + 1, 1);
        let xv = self.add(cx, Op::Reshape { shape: xs }, &[x], span)?;
        let keep: Vec<f64> = (0..n * n)
            .map(|p| {
                let (k, i) = (p / n, p % n);
                f64::from(u8::from(match (rev, excl) {
                    (false, false) => k <= i,
                    (false, true) => k < i,
                    (true, false) => k >= i,
                    (true, true) => k > i,
                }))
            })
            .collect();
        let mut ms = vec![1; ty.rank() + 1];
        ms[axis] = n;
        ms[axis + 1] = n;
        let mask = cx.f.add_op(
            Op::Constant(ConstValue::Dense(keep.into())),
            &[],
            TensorType::new(DType::Bool, ms),
        );
        t(self.masked_sum(cx, mask, xv, axis, span)?)
    }

    /// `group_norm`, `instance_norm`.
    pub(super) fn call_group_norm(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let x = self.float_tensor(cx, req(a, 0), name)?;
        let ty = Self::ty(cx, x);
        at_least_rank(name, &ty, 3, "N, C and spatial axes", span)?;
        let channels = ty.shape[1];
        let off = usize::from(name == "group_norm");
        let g = if name == "group_norm" {
            const_int(req(a, 1), &cx.dims)?
        } else {
            channels as i64
        };
        if g < 1 || channels % g as usize != 0 {
            return Err(Diagnostic::new(
                format!("{name}: {g} groups do not divide {channels} channels"),
                span,
                "groups",
            ));
        }
        let eps = c.float(3 + off)?;
        let per: usize = ty.shape[1..].iter().product::<usize>() / g as usize;
        let grouped = self.add(
            cx,
            Op::Reshape {
                shape: vec![ty.shape[0], g as usize, per],
            },
            &[x],
            span,
        )?;
        let normed = self.add(cx, Op::LayerNorm { axes: vec![2], eps }, &[grouped], span)?;
        let v = self.add(
            cx,
            Op::Reshape {
                shape: ty.shape.clone(),
            },
            &[normed],
            span,
        )?;
        let mut cs = vec![channels];
        cs.extend(vec![1; ty.rank() - 2]);
        let gamma = self.tensor(cx, req(a, 1 + off))?;
        let beta = self.tensor(cx, req(a, 2 + off))?;
        let gamma = self.add(cx, Op::Reshape { shape: cs.clone() }, &[gamma], span)?;
        let beta = self.add(cx, Op::Reshape { shape: cs }, &[beta], span)?;
        let v = self.bin(cx, BinaryOp::Mul, v, gamma, span)?;
        t(self.bin(cx, BinaryOp::Add, v, beta, span)?)
    }

    /// `gemm`.
    pub(super) fn call_gemm(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let mut x = self.tensor(cx, req(a, 0))?;
        let mut y = self.tensor(cx, req(a, 1))?;
        for (slot, v) in [(5, &mut x), (6, &mut y)] {
            if a[slot].map(const_bool).transpose()?.unwrap_or(false) {
                *v = self.add(cx, Op::Transpose { perm: vec![1, 0] }, &[*v], span)?;
            }
        }
        let mut p = self.add(cx, Op::MatMul, &[x, y], span)?;
        let d = Self::ty(cx, p).dtype;
        if let Some(e) = a[3] {
            let al = self.k(cx, const_float(e)?.0, d);
            p = self.bin(cx, BinaryOp::Mul, p, al, span)?;
        }
        if let Some(e) = a[2] {
            let mut c = self.tensor(cx, e)?;
            if let Some(be) = a[4] {
                let b = self.k(cx, const_float(be)?.0, d);
                c = self.bin(cx, BinaryOp::Mul, c, b, span)?;
            }
            p = self.bin(cx, BinaryOp::Add, p, c, span)?;
        }
        t(p)
    }

    /// `conv1d`, `maxpool1d`, `avgpool1d`.
    pub(super) fn call_conv1d(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let conv = name == "conv1d";
        let (x, ty) = self.first_tensor(cx, c)?;
        let [n, ch, l] = ty.shape[..] else {
            return Err(Diagnostic::new(
                format!("{name} needs [N, C, L], got {ty}"),
                span,
                "rank",
            ));
        };
        let count = |v: i64| -> R<usize> {
            if v < 0 {
                return Err(Diagnostic::new(
                    format!("{name}: a negative count"),
                    span,
                    "negative",
                ));
            }
            Ok(v as usize)
        };
        let x2 = self.add(
            cx,
            Op::Reshape {
                shape: vec![n, ch, 1, l],
            },
            &[x],
            span,
        )?;
        let padding = count(c.int(3, &cx.dims)?)?;
        let out = if conv {
            let stride = count(c.int(2, &cx.dims)?)?;
            let w = self.tensor(cx, req(a, 1))?;
            let wt = Self::ty(cx, w);
            let [o, ci, k] = wt.shape[..] else {
                return Err(Diagnostic::new(
                    format!("conv1d needs weights [O, C, K], got {wt}"),
                    span,
                    "rank",
                ));
            };
            let w2 = self.add(
                cx,
                Op::Reshape {
                    shape: vec![o, ci, 1, k],
                },
                &[w],
                span,
            )?;
            let groups = count(c.int(4, &cx.dims)?)?;
            let dilation = count(c.int(5, &cx.dims)?)?;
            if dilation == 0 {
                return Err(Diagnostic::new(
                    "dilation must be positive",
                    a[5].map_or(span, |e| e.span),
                    "not positive",
                ));
            }
            self.add(
                cx,
                Op::Conv2d {
                    stride: [1, stride.max(1)],
                    padding: [0, padding],
                    groups,
                    dilation: [1, dilation],
                },
                &[x2, w2],
                span,
            )?
        } else {
            let k = count(c.int(1, &cx.dims)?)?;
            let kind = if name == "maxpool1d" {
                PoolKind::Max
            } else {
                PoolKind::Avg
            };
            let stride = match a[2] {
                Some(_) => count(c.int(2, &cx.dims)?)?,
                None => k,
            };
            self.add(
                cx,
                Op::Pool2d {
                    kind,
                    kernel: [1, k],
                    stride: [1, stride.max(1)],
                    padding: [0, padding],
                },
                &[x2],
                span,
            )?
        };
        let ot = Self::ty(cx, out);
        let shape = vec![ot.shape[0], ot.shape[1], ot.shape[3]];
        t(self.add(cx, Op::Reshape { shape }, &[out], span)?)
    }

    /// `conv3d`: a 2-D convolution of each output frame, the input frames
    /// its temporal taps read joined along the channels (within each
    /// group) and the weights' taps laid out to match: `out[n, o, t] =
    /// conv2d(concat over kt of x[n, :, s t + d kt - p], w[o, :, kt])`,
    /// with the frames of the batch as the batch of one `conv2d`. It runs
    /// the 2-D convolution's kernels (Winograd's, the im2col product) on a
    /// copy of the input as many frames deep as the taps that read it;
    /// temporal taps that read only padding are left out.
    pub(super) fn call_conv3d(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let (x, xt) = self.first_tensor(cx, c)?;
        let w = self.tensor(cx, req(a, 1))?;
        let wt = Self::ty(cx, w);
        let (&[n, ch, frames, h, wd], &[o, cg, kt, kh, kw]) = (&xt.shape[..], &wt.shape[..]) else {
            return Err(Diagnostic::new(
                format!(
                    "conv3d needs an input [N, C, T, H, W] and weights [O, C / groups, KT, KH, KW], got {xt} and {wt}"
                ),
                span,
                "rank",
            ));
        };
        let stride = c.ints::<3>(2, &cx.dims)?;
        let padding = c.ints::<3>(3, &cx.dims)?;
        let given_groups = c.int(4, &cx.dims)?;
        let groups = usize::try_from(given_groups).unwrap_or(0);
        let dilation = c.ints::<3>(5, &cx.dims)?;
        for (i, v, what, least) in [
            (2, stride, "stride", 1),
            (3, padding, "padding", 0),
            (5, dilation, "dilation", 1),
        ] {
            if v.iter().any(|v| !(least..=MAX_WINDOW).contains(v)) {
                return Err(Diagnostic::new(
                    format!("conv3d: each {what} must be {least} to {MAX_WINDOW}"),
                    a[i].map_or(span, |e| e.span),
                    "out of range",
                ));
            }
        }
        if groups == 0 || cg * groups != ch || o % groups != 0 {
            return Err(Diagnostic::new(
                format!(
                    "conv3d: {ch} input channels, {o} filters of {cg} channels and {given_groups} groups do not fit"
                ),
                a[4].map_or(span, |e| e.span),
                "groups",
            ));
        }
        for (axis, size, k) in [(0, frames, kt), (1, h, kh), (2, wd, kw)] {
            let window = dilation[axis] * k.saturating_sub(1) + 1;
            if k == 0 || window > size + 2 * padding[axis] {
                return Err(Diagnostic::new(
                    format!(
                        "conv3d: a window of {window} along spatial axis {axis} is wider than the padded input's {}",
                        size + 2 * padding[axis]
                    ),
                    span,
                    "window",
                ));
            }
        }
        let (s, p, d) = (stride[0], padding[0], dilation[0]);
        let out_frames = (frames + 2 * p - d * (kt - 1) - 1) / s + 1;
        // The temporal taps that read an input frame for some output (tap
        // `k` of output `i` reads padded frame `s i + d k`): a range.
        let meets = |k: usize| (0..out_frames).any(|i| (p..p + frames).contains(&(s * i + d * k)));
        let mut taps: Vec<usize> = (0..kt).filter(|&k| meets(k)).collect();
        if taps.is_empty() {
            // A stride past the clip: no output reads it, and tap 0 alone
            // (whose frames are all padding) gives the zeros.
            taps.push(0);
        }
        let (first, last) = (taps[0], taps[taps.len() - 1]);
        // Frames first, padded so that each tap's frames are `s * out_frames` long.
        let reach = d * last + s * out_frames;
        // Axes 1 and 2 swapped: the clip frames-first, the weights taps-first,
        // the output back.
        let swap = Op::Transpose {
            perm: vec![0, 2, 1, 3, 4],
        };
        let xf = self.add(cx, swap.clone(), &[x], span)?;
        let after = reach.saturating_sub(p + frames);
        let xf = self.padded(cx, xf, 1, (p, after), 0.0, span)?;
        let mut parts = Vec::new();
        for &k in &taps {
            let start = d * k;
            let mut v = self.add(
                cx,
                Op::Slice {
                    axis: 1,
                    start,
                    end: start + s * out_frames,
                },
                &[xf],
                span,
            )?;
            if s > 1 {
                v = self.add(
                    cx,
                    Op::Reshape {
                        shape: vec![n, out_frames, s, ch, h, wd],
                    },
                    &[v],
                    span,
                )?;
                v = self.add(
                    cx,
                    Op::Slice {
                        axis: 2,
                        start: 0,
                        end: 1,
                    },
                    &[v],
                    span,
                )?;
            }
            let shape = vec![n, out_frames, groups, 1, cg, h, wd];
            parts.push(self.add(cx, Op::Reshape { shape }, &[v], span)?);
        }
        let joined = if parts.len() == 1 {
            parts[0]
        } else {
            self.add(cx, Op::Concat { axis: 3 }, &parts, span)?
        };
        let depth = taps.len() * cg;
        let x2 = self.add(
            cx,
            Op::Reshape {
                shape: vec![n * out_frames, groups * depth, h, wd],
            },
            &[joined],
            span,
        )?;
        let mut w = w;
        if taps.len() < kt {
            let axis = 2;
            w = self.add(
                cx,
                Op::Slice {
                    axis,
                    start: first,
                    end: last + 1,
                },
                &[w],
                span,
            )?;
        }
        let w = self.add(cx, swap.clone(), &[w], span)?;
        let w2 = self.add(
            cx,
            Op::Reshape {
                shape: vec![o, depth, kh, kw],
            },
            &[w],
            span,
        )?;
        let y = self.add(
            cx,
            Op::Conv2d {
                stride: [stride[1], stride[2]],
                padding: [padding[1], padding[2]],
                groups,
                dilation: [dilation[1], dilation[2]],
            },
            &[x2, w2],
            span,
        )?;
        let yt = Self::ty(cx, y);
        let y = self.add(
            cx,
            Op::Reshape {
                shape: vec![n, out_frames, o, yt.shape[2], yt.shape[3]],
            },
            &[y],
            span,
        )?;
        Ok(EVal::Tensor(self.add(cx, swap, &[y], span)?))
    }

    /// `topk`.
    pub(super) fn call_topk(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let (x, ty) = self.first_tensor(cx, c)?;
        if !ty.dtype.is_numeric() || ty.rank() == 0 {
            return Err(Diagnostic::new(
                format!("topk needs numbers, got {ty}"),
                span,
                "type",
            ));
        }
        let axis = c.axis(2, &ty, &cx.dims)?;
        let n = ty.shape[axis];
        let k = const_int(req(a, 1), &cx.dims)?;
        if k < 1 || k as usize > n.min(64) {
            return Err(Diagnostic::new(
                format!("topk: k must be 1 to {} here", n.min(64)),
                req(a, 1).span,
                "k",
            ));
        }
        let largest = c.flag(3)?;
        let kind = if largest {
            ReduceKind::Max
        } else {
            ReduceKind::Min
        };
        // What a taken element becomes, so it is never taken again.
        let gone = match (ty.dtype.is_float(), largest) {
            (true, true) => f64::NEG_INFINITY,
            (true, false) => f64::INFINITY,
            (false, true) => ty.dtype.int_min().unwrap_or(0.0),
            (false, false) => ty.dtype.int_max().unwrap_or(0.0),
        };
        let gone = self.k(cx, gone, ty.dtype);
        let iota = self.iota(cx, n, axis, ty.rank(), DType::I64);
        let (mut vals, mut idxs, mut cur) = (Vec::new(), Vec::new(), x);
        for _ in 0..k {
            let (v, i) = self.first_extreme(cx, cur, kind, axis, iota, span)?;
            let taken = self.cmp(cx, CmpOp::Eq, iota, i, span)?;
            cur = self.add(cx, Op::Select, &[taken, gone, cur], span)?;
            vals.push(v);
            idxs.push(i);
        }
        let v = self.add(cx, Op::Concat { axis }, &vals, span)?;
        let i = self.add(cx, Op::Concat { axis }, &idxs, span)?;
        Ok(EVal::Tuple(vec![v, i]))
    }

    /// `gather_elements`: `x` read as one axis at each index's flat
    /// position ([`Self::flat_positions`]), so it costs the elements it reads
    /// and its adjoint is a `scatter_add`.
    pub(super) fn call_gather_elements(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let x = self.tensor(cx, req(a, 0))?;
        let ind = self.tensor(cx, req(a, 1))?;
        let (ty, it) = (Self::ty(cx, x), Self::ty(cx, ind));
        let axis = c.axis(2, &ty, &cx.dims)?;
        element_indices("gather_elements", &ty, &it, axis, span)?;
        let total = ty.shape.iter().product();
        let flat = self.add(cx, Op::Reshape { shape: vec![total] }, &[x], span)?;
        let at = self.flat_positions(cx, &ty.shape, ind, axis, span)?;
        Ok(EVal::Tensor(self.gather(cx, flat, at, 0, span)?))
    }

    /// `scatter_add`.
    pub(super) fn call_scatter_add(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let [(x, ty), (ind, it), (upd, ut)] = self.scatter_operands(cx, c)?;
        numbers_and_indices("scatter_add", &ty, &it, span)?;
        let axis = c.axis(3, &ty, &cx.dims)?;
        let mut want = ty.shape[..axis].to_vec();
        want.extend(&it.shape);
        want.extend(&ty.shape[axis + 1..]);
        if ut.dtype != ty.dtype || ut.shape != want {
            let want = TensorType::new(ty.dtype, want);
            return Err(Diagnostic::new(
                format!(
                    "scatter_add: updates {ut} do not fit {ty} at indices {it} along axis {axis} (they must be {want})"
                ),
                req(a, 2).span,
                "updates",
            ));
        }
        Ok(EVal::Tensor(self.add(
            cx,
            Op::ScatterAdd { axis },
            &[x, ind, upd],
            span,
        )?))
    }

    /// `scatter_add_elements`: `scatter_add` on `x` flattened at each
    /// index's flat position ([`Self::flat_positions`]), the inverse of
    /// `gather_elements`.
    pub(super) fn call_scatter_add_elements(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let [(x, ty), (ind, it), (upd, ut)] = self.scatter_operands(cx, c)?;
        let axis = c.axis(3, &ty, &cx.dims)?;
        element_indices("scatter_add_elements", &ty, &it, axis, span)?;
        if ut.dtype != ty.dtype || ut.shape != it.shape {
            return Err(Diagnostic::new(
                format!(
                    "scatter_add_elements: updates {ut} must be {}",
                    TensorType::new(ty.dtype, it.shape.clone())
                ),
                req(a, 2).span,
                "updates",
            ));
        }
        let total = ty.shape.iter().product();
        let flat = self.add(cx, Op::Reshape { shape: vec![total] }, &[x], span)?;
        let at = self.flat_positions(cx, &ty.shape, ind, axis, span)?;
        let sum = self.add(cx, Op::ScatterAdd { axis: 0 }, &[flat, at, upd], span)?;
        Ok(EVal::Tensor(self.add(
            cx,
            Op::Reshape {
                shape: ty.shape.clone(),
            },
            &[sum],
            span,
        )?))
    }

    /// A scatter's data, indices and updates, with their types.
    fn scatter_operands(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<[(Value, TensorType); 3]> {
        let mut read = |i: usize| -> R<(Value, TensorType)> {
            let v = self.tensor(cx, req(&c.a, i))?;
            Ok((v, Self::ty(cx, v)))
        };
        Ok([read(0)?, read(1)?, read(2)?])
    }

    /// The position in a tensor of shape `shape` flattened of each element
    /// of `ind` read as an index along `axis` (a negative one counted from
    /// the end, the other coordinates the element's own): `ind * stride +
    /// sum of iota * stride` over the other axes, in i64. An index outside
    /// the axis gets the flattened extent, which reads zero and adds nowhere.
    pub(super) fn flat_positions(
        &mut self,
        cx: &mut FnCx,
        shape: &[usize],
        ind: Value,
        axis: usize,
        span: Span,
    ) -> R<Value> {
        let it = Self::ty(cx, ind);
        let ind = match it.dtype {
            DType::I64 => ind,
            _ => self.add(cx, Op::Cast { to: DType::I64 }, &[ind], span)?,
        };
        let n = shape[axis];
        let i = self.counted_from_end(cx, ind, n, span)?;
        let strides: Vec<usize> = (0..shape.len())
            .map(|a| shape[a + 1..].iter().product())
            .collect();
        let stride = self.k(cx, strides[axis] as f64, DType::I64);
        let mut at = self.bin(cx, BinaryOp::Mul, i, stride, span)?;
        for (a, &d) in it.shape.iter().enumerate() {
            if a == axis || d == 1 {
                continue;
            }
            let iota = self.iota(cx, d, a, it.rank(), DType::I64);
            let stride = self.k(cx, strides[a] as f64, DType::I64);
            let along = self.bin(cx, BinaryOp::Mul, iota, stride, span)?;
            at = self.bin(cx, BinaryOp::Add, at, along, span)?;
        }
        let (zero, extent) = (
            self.k(cx, 0.0, DType::I64),
            self.k(cx, n as f64, DType::I64),
        );
        let outside = self.k(cx, shape.iter().product::<usize>() as f64, DType::I64);
        let above = self.cmp(cx, CmpOp::Ge, i, zero, span)?;
        let at = self.add(cx, Op::Select, &[above, at, outside], span)?;
        let below = self.cmp(cx, CmpOp::Lt, i, extent, span)?;
        self.add(cx, Op::Select, &[below, at, outside], span)
    }

    /// `gather`.
    pub(super) fn call_gather(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        let x = self.tensor(cx, req(a, 0))?;
        let ind = self.tensor(cx, req(a, 1))?;
        let (ty, it) = (Self::ty(cx, x), Self::ty(cx, ind));
        numbers_and_indices("gather", &ty, &it, span)?;
        let axis = c.axis(2, &ty, &cx.dims)?;
        t(self.gather(cx, x, ind, axis, span)?)
    }

    /// `dropout`.
    pub(super) fn call_dropout(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let span = c.span;
        let a = &c.a;
        let t = |v: Value| Ok(EVal::Tensor(v));
        // At inference the identity; with `step`, training
        // dropout (training.rs).
        let p = c.float(1)?;
        if !(0.0..1.0).contains(&p) {
            let at = a[1].map_or(span, |e| e.span);
            return Err(Diagnostic::new("dropout: p must be in [0, 1)", at, "p"));
        }
        let x = self.tensor(cx, req(a, 0))?;
        match a[2] {
            None if a[3].is_some() => Err(Diagnostic::new(
                "dropout: `seed` draws the mask of a training step: give `step` too",
                span,
                "no step",
            )),
            None => t(x),
            Some(step) => {
                let seed = c.int(3, &cx.dims)?;
                t(self.train_dropout(cx, x, p, step, seed, span)?)
            }
        }
    }

    /// The extreme (`kind` max or min) of `x` along `axis` and the index of
    /// its first occurrence (i64; the least `iota` position holding it),
    /// both with the axis kept.
    fn first_extreme(
        &mut self,
        cx: &mut FnCx,
        x: Value,
        kind: ReduceKind,
        axis: usize,
        iota: Value,
        span: Span,
    ) -> R<(Value, Value)> {
        let n = Self::ty(cx, x).shape[axis];
        let reduce = |kind| Op::Reduce {
            kind,
            axes: vec![axis],
            keepdims: true,
        };
        let ext = self.add(cx, reduce(kind), &[x], span)?;
        let hit = self.cmp(cx, CmpOp::Eq, x, ext, span)?;
        let past = self.k(cx, n as f64, DType::I64);
        let pos = self.add(cx, Op::Select, &[hit, iota, past], span)?;
        let idx = self.add(cx, reduce(ReduceKind::Min), &[pos], span)?;
        Ok((ext, idx))
    }

    /// `logsumexp(x)` over `axes` (kept) as `m + l`: the maximum `m` (0
    /// where it is infinite, so an all -inf row stays -inf), `c = x - m` and
    /// `l = log(sum(exp(c)))`; `log_softmax(x)` is `c - l`.
    pub(super) fn shifted_logsumexp(
        &mut self,
        cx: &mut FnCx,
        x: Value,
        axes: &[usize],
        span: Span,
    ) -> R<(Value, Value, Value)> {
        let d = Self::ty(cx, x).dtype;
        let red = |me: &mut Self, cx: &mut FnCx, kind, v| {
            me.add(
                cx,
                Op::Reduce {
                    kind,
                    axes: axes.to_vec(),
                    keepdims: true,
                },
                &[v],
                span,
            )
        };
        let m = red(self, cx, ReduceKind::Max, x)?;
        let am = self.add(cx, Op::Unary(UnaryOp::Abs), &[m], span)?;
        let inf = self.k(cx, f64::INFINITY, d);
        let finite = self.cmp(cx, CmpOp::Lt, am, inf, span)?;
        let zero = self.k(cx, 0.0, d);
        let m = self.add(cx, Op::Select, &[finite, m, zero], span)?;
        let c = self.bin(cx, BinaryOp::Sub, x, m, span)?;
        let e = self.add(cx, Op::Unary(UnaryOp::Exp), &[c], span)?;
        let s = red(self, cx, ReduceKind::Sum, e)?;
        let l = self.add(cx, Op::Unary(UnaryOp::Log), &[s], span)?;
        Ok((m, c, l))
    }

    /// A scalar constant of type `d`.
    pub(super) fn k(&mut self, cx: &mut FnCx, v: f64, d: DType) -> Value {
        cx.f.add_op(
            Op::Constant(ConstValue::Splat(d.round(v))),
            &[],
            TensorType::scalar(d),
        )
    }

    pub(super) fn bin(
        &mut self,
        cx: &mut FnCx,
        b: BinaryOp,
        x: Value,
        y: Value,
        span: Span,
    ) -> R<Value> {
        self.add(cx, Op::Binary(b), &[x, y], span)
    }

    pub(super) fn cmp(
        &mut self,
        cx: &mut FnCx,
        c: CmpOp,
        x: Value,
        y: Value,
        span: Span,
    ) -> R<Value> {
        self.add(cx, Op::Compare(c), &[x, y], span)
    }

    /// `0, 1, .., n - 1` of type `d` along axis `axis` of a rank-`rank`
    /// shape of ones.
    pub(super) fn iota(
        &mut self,
        cx: &mut FnCx,
        n: usize,
        axis: usize,
        rank: usize,
        d: DType,
    ) -> Value {
        let mut shape = vec![1; rank];
        shape[axis] = n;
        cx.f.add_op(
            Op::Constant(ConstValue::Dense((0..n).map(|i| i as f64).collect())),
            &[],
            TensorType::new(d, shape),
        )
    }

    pub(super) fn float_tensor(&mut self, cx: &mut FnCx, e: &Expr, what: &str) -> R<Value> {
        let v = self.tensor(cx, e)?;
        let ty = Self::ty(cx, v);
        if !ty.dtype.is_float() {
            return Err(Diagnostic::new(
                format!("{what} needs a floating-point operand, got {ty}"),
                e.span,
                format!("{} is not a float type", ty.dtype),
            ));
        }
        Ok(v)
    }

    pub(super) fn bool_tensor(&mut self, cx: &mut FnCx, e: &Expr, what: &str) -> R<Value> {
        let v = self.tensor(cx, e)?;
        let ty = Self::ty(cx, v);
        if ty.dtype != DType::Bool {
            return Err(Diagnostic::new(
                format!("{what} needs bool operands, got {ty}"),
                e.span,
                "not bool",
            ));
        }
        Ok(v)
    }

    /// `max(min(x * alpha + beta, 1), 0)`.
    fn hard_sigmoid(
        &mut self,
        cx: &mut FnCx,
        x: Value,
        alpha: Value,
        beta: Value,
        span: Span,
    ) -> R<Value> {
        let d = Self::ty(cx, x).dtype;
        let v = self.bin(cx, BinaryOp::Mul, x, alpha, span)?;
        let v = self.bin(cx, BinaryOp::Add, v, beta, span)?;
        let one = self.k(cx, 1.0, d);
        let v = self.bin(cx, BinaryOp::Min, v, one, span)?;
        let zero = self.k(cx, 0.0, d);
        self.bin(cx, BinaryOp::Max, v, zero, span)
    }

    /// `log(1 + e^x)`, as `max(x, 0) + log(1 + e^-|x|)` so it neither
    /// overflows nor loses small values.
    fn softplus(&mut self, cx: &mut FnCx, x: Value, span: Span) -> R<Value> {
        let d = Self::ty(cx, x).dtype;
        let pos = self.add(cx, Op::Unary(UnaryOp::Relu), &[x], span)?;
        let ax = self.add(cx, Op::Unary(UnaryOp::Abs), &[x], span)?;
        let nx = self.add(cx, Op::Unary(UnaryOp::Neg), &[ax], span)?;
        let e = self.add(cx, Op::Unary(UnaryOp::Exp), &[nx], span)?;
        let one = self.k(cx, 1.0, d);
        let s = self.bin(cx, BinaryOp::Add, e, one, span)?;
        let l = self.add(cx, Op::Unary(UnaryOp::Log), &[s], span)?;
        self.bin(cx, BinaryOp::Add, pos, l, span)
    }

    /// A reduction computed with kept axes, reshaped to drop them unless
    /// `keep`.
    fn keep_or_drop(
        &mut self,
        cx: &mut FnCx,
        v: Value,
        ty: &TensorType,
        axes: &[usize],
        keep: bool,
        span: Span,
    ) -> R<Value> {
        if keep {
            return Ok(v);
        }
        let shape = (0..ty.rank())
            .filter(|i| !axes.contains(i))
            .map(|i| ty.shape[i])
            .collect();
        self.add(cx, Op::Reshape { shape }, &[v], span)
    }

    /// `x` gathered along `axis` at `indices`: the graph op `gather`
    /// (negative indices count from the end; one out of range reads zero),
    /// which reads only the elements it gives.
    fn gather(&mut self, cx: &mut FnCx, x: Value, ind: Value, axis: usize, span: Span) -> R<Value> {
        self.add(cx, Op::Gather { axis }, &[x, ind], span)
    }

    /// The sum over `axis` of `x` where `keep` holds (a `where`, so an
    /// infinity or NaN where it does not stays out), the axis dropped.
    fn masked_sum(
        &mut self,
        cx: &mut FnCx,
        keep: Value,
        x: Value,
        axis: usize,
        span: Span,
    ) -> R<Value> {
        let zero = self.k(cx, 0.0, Self::ty(cx, x).dtype);
        let picked = self.add(cx, Op::Select, &[keep, x, zero], span)?;
        self.add(
            cx,
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![axis],
                keepdims: false,
            },
            &[picked],
            span,
        )
    }

    /// Indices with the negative ones counted from the end of an axis of
    /// extent `n`.
    fn counted_from_end(&mut self, cx: &mut FnCx, ind: Value, n: usize, span: Span) -> R<Value> {
        let d = Self::ty(cx, ind).dtype;
        let zero = self.k(cx, 0.0, d);
        let neg = self.cmp(cx, CmpOp::Lt, ind, zero, span)?;
        let ext = self.k(cx, n as f64, d);
        let wrapped = self.bin(cx, BinaryOp::Add, ind, ext, span)?;
        self.add(cx, Op::Select, &[neg, wrapped, ind], span)
    }
}

/// An error unless `it` holds integer indices of `ty`'s rank no longer than
/// `ty` on the axes other than `axis` (`gather_elements`,
/// `scatter_add_elements`).
fn element_indices(name: &str, ty: &TensorType, it: &TensorType, axis: usize, span: Span) -> R<()> {
    let fits =
        it.rank() == ty.rank() && (0..ty.rank()).all(|i| i == axis || it.shape[i] <= ty.shape[i]);
    if !it.dtype.is_int() || !ty.dtype.is_numeric() || !fits {
        return Err(Diagnostic::new(
            format!("{name}: indices {it} do not fit {ty} along axis {axis}"),
            span,
            "indices",
        ));
    }
    Ok(())
}

/// An error unless `ty` holds numbers and `it` integer indices:
/// `{name} takes numbers and integer indices, got {ty} and {it}`.
fn numbers_and_indices(name: &str, ty: &TensorType, it: &TensorType, span: Span) -> R<()> {
    if !it.dtype.is_int() || !ty.dtype.is_numeric() {
        return Err(Diagnostic::new(
            format!("{name} takes numbers and integer indices, got {ty} and {it}"),
            span,
            "types",
        ));
    }
    Ok(())
}

/// An error unless `ty` has at least `rank` axes: `{name} needs {what}, got
/// {ty}`.
fn at_least_rank(name: &str, ty: &TensorType, rank: usize, what: &str, span: Span) -> R<()> {
    if ty.rank() < rank {
        return Err(Diagnostic::new(
            format!("{name} needs {what}, got {ty}"),
            span,
            format!("rank < {rank}"),
        ));
    }
    Ok(())
}
