//! Built-ins for training: losses, optimizer updates and learning-rate
//! schedules. Each expands into the graph ops it is made of, as the
//! composites do, so its gradient comes from those ops' rules and it
//! compiles like any expression (docs/language.md gives each formula).
//!
//! # Gradients and training layers in the language
//!
//! - `value_and_grad(f(args), wrt=[..])` in the language elaborates the call's
//!   arguments, instantiates `f`, adds the private function `f$grad$i$j`
//!   (`autodiff::add_grad_function`, once per `f` and positions) and calls it; inlining
//!   then makes the step one graph, saturated as a whole (the forward and backward share
//!   subexpressions; transposes fold into products).
//!
//! - Losses, optimizer updates, schedules and the training-mode layers
//!   (`batchnorm_train`, `dropout(.., step=t)`) are built-ins that expand into graph ops,
//!   as the composites do: their formulas exist once, in the language, and their
//!   gradients come from the ops' rules. Dropout's mask is a counter-based hash in `u32`
//!   arithmetic of each element's position, the seed and the step, so it is the same on
//!   every back end; this holds because every level wraps integer `+ - * <<` exactly
//!   (the interpreters through `scalar::apply_binary_in`, which computes on 64-bit
//!   integers before rounding to the type: an `f64` product of two `u32`s loses the low
//!   bits the type keeps). The position enters axis by axis (`iota_a * stride_a`) after
//!   the step, so no constant as large as the tensor is formed for `graph.saturate` to
//!   fold into the program.

use super::*;

/// A positive whole number of steps given as a constant (`every`,
/// `warmup`, `interval`, ...).
fn step_count_const(e: &Expr, dims: &HashMap<String, usize>, what: &str) -> R<f64> {
    let n = const_int(e, dims)?;
    if n < 1 {
        return Err(Diagnostic::new(
            format!("`{what}` must be a positive number of steps"),
            e.span,
            format!("{n}"),
        ));
    }
    Ok(n as f64)
}

impl Elab<'_> {
    /// `mse_loss`, `l1_loss`, `huber_loss`, `bce_with_logits`.
    pub(super) fn call_mse_loss(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let one = |v: Value| Ok(EVal::Tensor(v));
        let x = self.float_tensor(cx, req(a, 0), name)?;
        let d = Self::ty(cx, x).dtype;
        let y = self.operand_like(cx, req(a, 1), d)?;
        let per = match name {
            "mse_loss" => {
                let e = self.bin(cx, BinaryOp::Sub, x, y, span)?;
                self.bin(cx, BinaryOp::Mul, e, e, span)?
            }
            "l1_loss" => {
                let e = self.bin(cx, BinaryOp::Sub, x, y, span)?;
                self.add(cx, Op::Unary(UnaryOp::Abs), &[e], span)?
            }
            "huber_loss" => {
                let delta = c.checked(2, positive_float)?;
                // 0.5 e^2 where |e| < delta, delta (|e| - delta / 2) elsewhere
                let e = self.bin(cx, BinaryOp::Sub, x, y, span)?;
                let ae = self.add(cx, Op::Unary(UnaryOp::Abs), &[e], span)?;
                let kd = self.k(cx, delta, d);
                let small = self.cmp(cx, CmpOp::Lt, ae, kd, span)?;
                let sq = self.bin(cx, BinaryOp::Mul, e, e, span)?;
                let half = self.k(cx, 0.5, d);
                let quad = self.bin(cx, BinaryOp::Mul, sq, half, span)?;
                let hd = self.k(cx, delta / 2.0, d);
                let lin = self.bin(cx, BinaryOp::Sub, ae, hd, span)?;
                let lin = self.bin(cx, BinaryOp::Mul, lin, kd, span)?;
                self.add(cx, Op::Select, &[small, quad, lin], span)?
            }
            _ => {
                // x - x y + log(1 + e^-x) for x >= 0, -x y + log(1 + e^x)
                // below: each branch smooth, neither overflows.
                let zero = self.k(cx, 0.0, d);
                let pos = self.cmp(cx, CmpOp::Ge, x, zero, span)?;
                let xy = self.bin(cx, BinaryOp::Mul, x, y, span)?;
                let nx = self.add(cx, Op::Unary(UnaryOp::Neg), &[x], span)?;
                let lp = self.log1p_exp(cx, nx, span)?;
                let ln = self.log1p_exp(cx, x, span)?;
                let p = self.bin(cx, BinaryOp::Sub, x, xy, span)?;
                let p = self.bin(cx, BinaryOp::Add, p, lp, span)?;
                let n = self.bin(cx, BinaryOp::Sub, ln, xy, span)?;
                self.add(cx, Op::Select, &[pos, p, n], span)?
            }
        };
        one(self.mean_all(cx, per, span)?)
    }

    /// `cross_entropy`.
    pub(super) fn call_cross_entropy(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let one = |v: Value| Ok(EVal::Tensor(v));
        let x = self.float_tensor(cx, req(a, 0), name)?;
        let ty = Self::ty(cx, x);
        if ty.rank() == 0 {
            return Err(Diagnostic::new(
                "cross_entropy needs logits with a class axis, got a scalar",
                req(a, 0).span,
                "scalar",
            ));
        }
        let axis = match a[2] {
            Some(e) => normalize_axis(const_int(e, &cx.dims)?, &ty, e.span)?,
            None => ty.rank() - 1,
        };
        let target = self.tensor(cx, req(a, 1))?;
        let tt = Self::ty(cx, target);
        let (_, c, l) = self.shifted_logsumexp(cx, x, &[axis], span)?;
        let logp = self.bin(cx, BinaryOp::Sub, c, l, span)?;
        let classes = ty.shape[axis];
        let mut rest = ty.shape.clone();
        rest.remove(axis);
        let probs = if tt.dtype.is_int() && tt.shape == rest {
            // Class indices: the one-hot rows of the labels.
            let mut col = rest.clone();
            col.insert(axis, 1);
            let lab = self.add(cx, Op::Reshape { shape: col }, &[target], span)?;
            let iota = self.iota(cx, classes, axis, ty.rank(), tt.dtype);
            let hit = self.cmp(cx, CmpOp::Eq, lab, iota, span)?;
            self.add(cx, Op::Cast { to: ty.dtype }, &[hit], span)?
        } else if tt == ty {
            target
        } else {
            return Err(Diagnostic::new(
                format!(
                    "cross_entropy takes class indices (an integer tensor of shape {rest:?}) or probabilities (a tensor of type {ty}), got {tt}"
                ),
                req(a, 1).span,
                "wrong target",
            ));
        };
        let picked = self.bin(cx, BinaryOp::Mul, probs, logp, span)?;
        let per = self.add(
            cx,
            Op::Reduce {
                kind: ReduceKind::Sum,
                axes: vec![axis],
                keepdims: false,
            },
            &[picked],
            span,
        )?;
        let m = self.mean_all(cx, per, span)?;
        one(self.add(cx, Op::Unary(UnaryOp::Neg), &[m], span)?)
    }

    /// `sgd`.
    pub(super) fn call_sgd(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let one = |v: Value| Ok(EVal::Tensor(v));
        let (w, g, d) = self.weight_and_grad(cx, req(a, 0), req(a, 1), name)?;
        let lr = self.rate(cx, req(a, 2), d)?;
        let g = {
            let wd = c.checked(3, non_negative_float)?;
            self.with_decay(cx, g, w, wd, d, span)?
        };
        let step = self.bin(cx, BinaryOp::Mul, g, lr, span)?;
        one(self.bin(cx, BinaryOp::Sub, w, step, span)?)
    }

    /// `sgd_momentum`.
    pub(super) fn call_sgd_momentum(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let (w, g, d) = self.weight_and_grad(cx, req(a, 0), req(a, 1), name)?;
        let buf = self.state_like(cx, req(a, 2), w, "buf")?;
        let lr = self.rate(cx, req(a, 3), d)?;
        let mu = c.checked(4, unit_float)?;
        let nesterov = c.flag(5)?;
        // PyTorch's SGD: buf = mu buf + g; step = g + mu buf (Nesterov) or buf.
        let g = {
            let wd = c.checked(6, non_negative_float)?;
            self.with_decay(cx, g, w, wd, d, span)?
        };
        let kmu = self.k(cx, mu, d);
        let b = self.bin(cx, BinaryOp::Mul, buf, kmu, span)?;
        let b = self.bin(cx, BinaryOp::Add, b, g, span)?;
        let dir = if nesterov {
            let mb = self.bin(cx, BinaryOp::Mul, b, kmu, span)?;
            self.bin(cx, BinaryOp::Add, g, mb, span)?
        } else {
            b
        };
        let step = self.bin(cx, BinaryOp::Mul, dir, lr, span)?;
        let w = self.bin(cx, BinaryOp::Sub, w, step, span)?;
        Ok(EVal::Tuple(vec![w, b]))
    }

    /// `adam`, `adamw`.
    pub(super) fn call_adam(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let (w, g, d) = self.weight_and_grad(cx, req(a, 0), req(a, 1), name)?;
        let m = self.state_like(cx, req(a, 2), w, "m")?;
        let v = self.state_like(cx, req(a, 3), w, "v")?;
        let t = self.step_count(cx, req(a, 4), d)?;
        let lr = match a[5] {
            Some(e) => self.rate(cx, e, d)?,
            None => self.k(cx, c.float(5)?, d),
        };
        let b1 = c.checked(6, unit_float)?;
        let b2 = c.checked(7, unit_float)?;
        let eps = c.checked(8, positive_float)?;
        let wd = c.checked(9, non_negative_float)?;
        // Adam: g += wd w (L2); AdamW: w -= lr wd w first (decoupled).
        let (w, g) = if name == "adam" {
            (w, self.with_decay(cx, g, w, wd, d, span)?)
        } else if wd > 0.0 {
            let kwd = self.k(cx, wd, d);
            let s = self.bin(cx, BinaryOp::Mul, lr, kwd, span)?;
            let s = self.bin(cx, BinaryOp::Mul, w, s, span)?;
            (self.bin(cx, BinaryOp::Sub, w, s, span)?, g)
        } else {
            (w, g)
        };
        let ema = |me: &mut Self, cx: &mut FnCx, old: Value, new: Value, beta: f64| {
            let kb = me.k(cx, beta, d);
            let kc = me.k(cx, 1.0 - beta, d);
            let o = me.bin(cx, BinaryOp::Mul, old, kb, span)?;
            let n = me.bin(cx, BinaryOp::Mul, new, kc, span)?;
            me.bin(cx, BinaryOp::Add, o, n, span)
        };
        let m = ema(self, cx, m, g, b1)?;
        let gg = self.bin(cx, BinaryOp::Mul, g, g, span)?;
        let v = ema(self, cx, v, gg, b2)?;
        // w - lr m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps)
        let corr = |me: &mut Self, cx: &mut FnCx, beta: f64| {
            let kb = me.k(cx, beta, d);
            let p = me.bin(cx, BinaryOp::Pow, kb, t, span)?;
            let k1 = me.k(cx, 1.0, d);
            me.bin(cx, BinaryOp::Sub, k1, p, span)
        };
        let c1 = corr(self, cx, b1)?;
        let c2 = corr(self, cx, b2)?;
        let mh = self.bin(cx, BinaryOp::Div, m, c1, span)?;
        let vh = self.bin(cx, BinaryOp::Div, v, c2, span)?;
        let den = self.add(cx, Op::Unary(UnaryOp::Sqrt), &[vh], span)?;
        let keps = self.k(cx, eps, d);
        let den = self.bin(cx, BinaryOp::Add, den, keps, span)?;
        let upd = self.bin(cx, BinaryOp::Div, mh, den, span)?;
        let upd = self.bin(cx, BinaryOp::Mul, upd, lr, span)?;
        let w = self.bin(cx, BinaryOp::Sub, w, upd, span)?;
        Ok(EVal::Tuple(vec![w, m, v]))
    }

    /// `all_finite`.
    pub(super) fn call_all_finite(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let args = c.args;
        let span = c.span;
        let one = |v: Value| Ok(EVal::Tensor(v));
        // Per tensor: the least of `|x| < inf` as 0 or 1 (NaN and
        // infinities compare false), then the least over tensors.
        if args.is_empty() {
            return Err(Diagnostic::new(
                "all_finite takes one or more float tensors",
                span,
                "no arguments",
            ));
        }
        let mut all: Option<Value> = None;
        for arg in args {
            if let Some(k) = &arg.name {
                return Err(Diagnostic::new(
                    "all_finite takes tensors by position only",
                    k.span,
                    "a keyword",
                ));
            }
            let x = self.float_tensor(cx, &arg.value, name)?;
            let ty = Self::ty(cx, x);
            let ax = self.add(cx, Op::Unary(UnaryOp::Abs), &[x], span)?;
            let inf = self.k(cx, f64::INFINITY, ty.dtype);
            let fin = self.cmp(cx, CmpOp::Lt, ax, inf, span)?;
            let fin = self.add(cx, Op::Cast { to: DType::F32 }, &[fin], span)?;
            let fin = if ty.rank() == 0 {
                fin
            } else {
                let reduce = Op::Reduce {
                    kind: ReduceKind::Min,
                    axes: (0..ty.rank()).collect(),
                    keepdims: false,
                };
                self.add(cx, reduce, &[fin], span)?
            };
            all = Some(match all {
                Some(a) => self.bin(cx, BinaryOp::Min, a, fin, span)?,
                None => fin,
            });
        }
        let all = all.unwrap_or_else(|| self.k(cx, 1.0, DType::F32));
        one(self.add(cx, Op::Cast { to: DType::Bool }, &[all], span)?)
    }

    /// `loss_scale_update`.
    pub(super) fn call_loss_scale_update(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let scale = self.float_tensor(cx, req(a, 0), name)?;
        let st = Self::ty(cx, scale);
        let good = self.tensor(cx, req(a, 1))?;
        let gt = Self::ty(cx, good);
        let finite = self.bool_tensor(cx, req(a, 2), name)?;
        let ft = Self::ty(cx, finite);
        let need = |ok: bool, e: &Expr, what: &str, t: &TensorType| {
            if ok {
                Ok(())
            } else {
                Err(Diagnostic::new(
                    format!("{what}, got {t}"),
                    e.span,
                    format!("{t}"),
                ))
            }
        };
        need(st.rank() == 0, req(a, 0), "`scale` is a float scalar", &st)?;
        need(
            gt.rank() == 0 && gt.dtype.is_int(),
            req(a, 1),
            "`good` (updates since the scale last changed) is an integer scalar",
            &gt,
        )?;
        need(
            ft.rank() == 0,
            req(a, 2),
            "`finite` is a bool scalar (all_finite of the gradients)",
            &ft,
        )?;
        let growth = c.checked(3, positive_float)?;
        let backoff = c.checked(4, unit_float)?;
        let interval = match a[5] {
            Some(e) => step_count_const(e, &cx.dims, "interval")?,
            None => c.int(5, &cx.dims)? as f64,
        };
        // PyTorch's GradScaler: on overflow, scale * backoff and
        // the count restarts; otherwise the count grows, and at
        // `interval` the scale grows (if it stays finite) and the
        // count restarts.
        let (d, gd) = (st.dtype, gt.dtype);
        let k1 = self.k(cx, 1.0, gd);
        let next = self.bin(cx, BinaryOp::Add, good, k1, span)?;
        let kint = self.k(cx, interval, gd);
        let due = self.cmp(cx, CmpOp::Ge, next, kint, span)?;
        let kg = self.k(cx, growth, d);
        let grown = self.bin(cx, BinaryOp::Mul, scale, kg, span)?;
        let inf = self.k(cx, f64::INFINITY, d);
        let fits = self.cmp(cx, CmpOp::Lt, grown, inf, span)?;
        let grown = self.add(cx, Op::Select, &[fits, grown, scale], span)?;
        let kept = self.add(cx, Op::Select, &[due, grown, scale], span)?;
        let kb = self.k(cx, backoff, d);
        let backed = self.bin(cx, BinaryOp::Mul, scale, kb, span)?;
        let new_scale = self.add(cx, Op::Select, &[finite, kept, backed], span)?;
        let k0 = self.k(cx, 0.0, gd);
        let count = self.add(cx, Op::Select, &[due, k0, next], span)?;
        let new_good = self.add(cx, Op::Select, &[finite, count, k0], span)?;
        Ok(EVal::Tuple(vec![new_scale, new_good]))
    }

    /// `step_lr`, `cosine_lr`, `warmup_lr`.
    pub(super) fn call_step_lr(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let one = |v: Value| Ok(EVal::Tensor(v));
        let d = DEFAULT_FLOAT;
        let t = self.step_count(cx, req(a, 0), d)?;
        let (lr, _) = const_float(req(a, 1))?;
        let count = |e: &Expr, what: &str| step_count_const(e, &cx.dims, what);
        match name {
            "step_lr" => {
                // lr gamma^floor((t - 1) / every)
                let every = count(req(a, 2), "every")?;
                let gamma = c.checked(3, positive_float)?;
                let k1 = self.k(cx, 1.0, d);
                let t0 = self.bin(cx, BinaryOp::Sub, t, k1, span)?;
                let ke = self.k(cx, every, d);
                let q = self.bin(cx, BinaryOp::Div, t0, ke, span)?;
                let q = self.add(cx, Op::Unary(UnaryOp::Floor), &[q], span)?;
                let kg = self.k(cx, gamma, d);
                let p = self.bin(cx, BinaryOp::Pow, kg, q, span)?;
                let klr = self.k(cx, lr, d);
                one(self.bin(cx, BinaryOp::Mul, p, klr, span)?)
            }
            "warmup_lr" => {
                // lr min(1, t / warmup)
                let warm = count(req(a, 2), "warmup")?;
                let kw = self.k(cx, warm, d);
                let r = self.bin(cx, BinaryOp::Div, t, kw, span)?;
                let k1 = self.k(cx, 1.0, d);
                let r = self.bin(cx, BinaryOp::Min, r, k1, span)?;
                let klr = self.k(cx, lr, d);
                one(self.bin(cx, BinaryOp::Mul, r, klr, span)?)
            }
            _ => {
                // Linear warm-up over `warmup` steps, then
                // min_lr + (lr - min_lr) (1 + cos(pi p)) / 2, p the
                // fraction of the remaining steps done (at most 1).
                let total = count(req(a, 2), "total")?;
                let warm = c.int(3, &cx.dims)? as f64;
                if !(0.0..total).contains(&warm) {
                    return Err(Diagnostic::new(
                        "`warmup` must be at least 0 and fewer than `total` steps",
                        a[3].map_or(span, |e| e.span),
                        "warmup",
                    ));
                }
                let min_lr = c.checked(4, non_negative_float)?;
                let kw = self.k(cx, warm, d);
                let done = self.bin(cx, BinaryOp::Sub, t, kw, span)?;
                let kspan = self.k(cx, total - warm, d);
                let p = self.bin(cx, BinaryOp::Div, done, kspan, span)?;
                let k0 = self.k(cx, 0.0, d);
                let k1 = self.k(cx, 1.0, d);
                let p = self.bin(cx, BinaryOp::Max, p, k0, span)?;
                let p = self.bin(cx, BinaryOp::Min, p, k1, span)?;
                let kpi = self.k(cx, std::f64::consts::PI, d);
                let c = self.bin(cx, BinaryOp::Mul, p, kpi, span)?;
                let c = self.add(cx, Op::Unary(UnaryOp::Cos), &[c], span)?;
                let c = self.bin(cx, BinaryOp::Add, c, k1, span)?;
                let kh = self.k(cx, (lr - min_lr) / 2.0, d);
                let c = self.bin(cx, BinaryOp::Mul, c, kh, span)?;
                let kmin = self.k(cx, min_lr, d);
                let cosine = self.bin(cx, BinaryOp::Add, c, kmin, span)?;
                if warm == 0.0 {
                    return one(cosine);
                }
                let r = self.bin(cx, BinaryOp::Div, t, kw, span)?;
                let klr = self.k(cx, lr, d);
                let ramp = self.bin(cx, BinaryOp::Mul, r, klr, span)?;
                let warming = self.cmp(cx, CmpOp::Le, t, kw, span)?;
                one(self.add(cx, Op::Select, &[warming, ramp, cosine], span)?)
            }
        }
    }

    /// `batchnorm_train`.
    pub(super) fn call_batchnorm_train(&mut self, cx: &mut FnCx, c: &Call<'_>) -> R<EVal> {
        let name = c.name();
        let span = c.span;
        let a = &c.a;
        let x = self.float_tensor(cx, req(a, 0), name)?;
        let ty = Self::ty(cx, x);
        if ty.rank() < 2 {
            return Err(Diagnostic::new(
                format!("batchnorm_train needs an input of rank >= 2 (N, C, ...), got {ty}"),
                req(a, 0).span,
                format!("rank {}", ty.rank()),
            ));
        }
        let channels = ty.shape[1];
        let chan = TensorType::new(ty.dtype, vec![channels]);
        let mut stats = Vec::new();
        for (i, what) in [
            (1, "gamma"),
            (2, "beta"),
            (3, "running_mean"),
            (4, "running_var"),
        ] {
            let e = req(a, i);
            let v = self.tensor(cx, e)?;
            if Self::ty(cx, v) != chan {
                return Err(Diagnostic::new(
                    format!(
                        "batchnorm_train: `{what}` must be {chan} (the channels of {ty}), got {}",
                        Self::ty(cx, v)
                    ),
                    e.span,
                    format!("{}", Self::ty(cx, v)),
                ));
            }
            stats.push(v);
        }
        let m = c.checked(5, unit_float)?;
        let eps = c.checked(6, positive_float)?;
        let d = ty.dtype;
        let axes: Vec<usize> = (0..ty.rank()).filter(|&i| i != 1).collect();
        let count: usize = axes.iter().map(|&i| ty.shape[i]).product();
        let red = |me: &mut Self, cx: &mut FnCx, v: Value| {
            me.add(
                cx,
                Op::Reduce {
                    kind: ReduceKind::Mean,
                    axes: axes.clone(),
                    keepdims: true,
                },
                &[v],
                span,
            )
        };
        // The batch's mean and (biased) variance normalize it.
        let mean = red(self, cx, x)?;
        let dev = self.bin(cx, BinaryOp::Sub, x, mean, span)?;
        let sq = self.bin(cx, BinaryOp::Mul, dev, dev, span)?;
        let var = red(self, cx, sq)?;
        let keps = self.k(cx, eps, d);
        let ve = self.bin(cx, BinaryOp::Add, var, keps, span)?;
        let r = self.add(cx, Op::Unary(UnaryOp::Rsqrt), &[ve], span)?;
        let mut col = vec![1; ty.rank()];
        col[1] = channels;
        let g = self.add(cx, Op::Reshape { shape: col.clone() }, &[stats[0]], span)?;
        let b = self.add(cx, Op::Reshape { shape: col }, &[stats[1]], span)?;
        let y = self.bin(cx, BinaryOp::Mul, dev, r, span)?;
        let y = self.bin(cx, BinaryOp::Mul, y, g, span)?;
        let y = self.bin(cx, BinaryOp::Add, y, b, span)?;
        // Running averages: the unbiased variance, as PyTorch keeps.
        let flat = |me: &mut Self, cx: &mut FnCx, v: Value| {
            me.add(
                cx,
                Op::Reshape {
                    shape: vec![channels],
                },
                &[v],
                span,
            )
        };
        let mean_c = flat(self, cx, mean)?;
        let var_c = flat(self, cx, var)?;
        let unbias = self.k(cx, count as f64 / (count.max(2) - 1) as f64, d);
        let var_c = self.bin(cx, BinaryOp::Mul, var_c, unbias, span)?;
        let keep = self.k(cx, 1.0 - m, d);
        let km = self.k(cx, m, d);
        let mut run = Vec::new();
        for (old, new) in [(stats[2], mean_c), (stats[3], var_c)] {
            let o = self.bin(cx, BinaryOp::Mul, old, keep, span)?;
            let n = self.bin(cx, BinaryOp::Mul, new, km, span)?;
            run.push(self.bin(cx, BinaryOp::Add, o, n, span)?);
        }
        Ok(EVal::Tuple(vec![y, run[0], run[1]]))
    }

    /// Training dropout: each element kept with probability `1 - p` (and
    /// scaled by `1 / (1 - p)`) or zeroed, by a counter-based hash of its
    /// row-major position `i`, the seed and the step, in u32 arithmetic:
    /// `h = fmix32(i * 0x9E3779B1 + seed * 0x85EBCA6B + step * 0xC2B2AE35)`
    /// (MurmurHash3's finalizer), kept where `(h >> 8) / 2^24 >= p`. Integer
    /// ops wrap alike on every back end, so every back end draws the same
    /// mask for a seed and a step.
    pub(super) fn train_dropout(
        &mut self,
        cx: &mut FnCx,
        x: Value,
        p: f64,
        step: &Expr,
        seed: i64,
        span: Span,
    ) -> R<Value> {
        let ty = Self::ty(cx, x);
        if !ty.dtype.is_float() {
            return Err(Diagnostic::new(
                format!("dropout needs a floating-point operand, got {ty}"),
                span,
                "not a float type",
            ));
        }
        let u = DType::U32;
        let k = |me: &mut Self, cx: &mut FnCx, v: u64| me.k(cx, (v & 0xffff_ffff) as f64, u);
        // t * 0xC2B2AE35 + seed * 0x85EBCA6B, then + i * 0x9E3779B1 one axis
        // at a time (the position's multiple of each axis's iota: no
        // constant as large as `x` is ever formed, so none is folded into
        // the program).
        let t = self.step_count(cx, step, DType::I64)?;
        let t = self.add(cx, Op::Cast { to: u }, &[t], span)?;
        let c2 = k(self, cx, 0xC2B2_AE35);
        let mut h = self.bin(cx, BinaryOp::Mul, t, c2, span)?;
        let sk = k(self, cx, (seed as u64).wrapping_mul(0x85EB_CA6B));
        h = self.bin(cx, BinaryOp::Add, h, sk, span)?;
        let mut stride = 1u64;
        for axis in (0..ty.rank()).rev() {
            let iota = self.iota(cx, ty.shape[axis], axis, ty.rank(), u);
            let ks = k(self, cx, stride.wrapping_mul(0x9E37_79B1));
            let term = self.bin(cx, BinaryOp::Mul, iota, ks, span)?;
            h = self.bin(cx, BinaryOp::Add, h, term, span)?;
            stride = stride.wrapping_mul(ty.shape[axis] as u64);
        }
        // fmix32
        for (shift, mul) in [
            (16, Some(0x85EB_CA6Bu64)),
            (13, Some(0xC2B2_AE35)),
            (16, None),
        ] {
            let ks = k(self, cx, shift);
            let sh = self.bin(cx, BinaryOp::Shr, h, ks, span)?;
            h = self.bin(cx, BinaryOp::BitXor, h, sh, span)?;
            if let Some(m) = mul {
                let km = k(self, cx, m);
                h = self.bin(cx, BinaryOp::Mul, h, km, span)?;
            }
        }
        let k8 = k(self, cx, 8);
        let top = self.bin(cx, BinaryOp::Shr, h, k8, span)?;
        // (h >> 8) >= p 2^24, compared exactly in f32 (24 bits).
        let top = self.add(cx, Op::Cast { to: DType::F32 }, &[top], span)?;
        let kp = self.k(cx, (p * 16_777_216.0).ceil(), DType::F32);
        let keep = self.cmp(cx, CmpOp::Ge, top, kp, span)?;
        let scale = self.k(cx, 1.0 / (1.0 - p), ty.dtype);
        let kept = self.bin(cx, BinaryOp::Mul, x, scale, span)?;
        let zero = self.k(cx, 0.0, ty.dtype);
        self.add(cx, Op::Select, &[keep, kept, zero], span)
    }

    /// `log(1 + e^x)`.
    fn log1p_exp(&mut self, cx: &mut FnCx, x: Value, span: Span) -> R<Value> {
        let d = Self::ty(cx, x).dtype;
        let e = self.add(cx, Op::Unary(UnaryOp::Exp), &[x], span)?;
        let k1 = self.k(cx, 1.0, d);
        let s = self.bin(cx, BinaryOp::Add, e, k1, span)?;
        self.add(cx, Op::Unary(UnaryOp::Log), &[s], span)
    }

    /// The mean of every element.
    fn mean_all(&mut self, cx: &mut FnCx, x: Value, span: Span) -> R<Value> {
        let rank = Self::ty(cx, x).rank();
        if rank == 0 {
            return Ok(x);
        }
        self.add(
            cx,
            Op::Reduce {
                kind: ReduceKind::Mean,
                axes: (0..rank).collect(),
                keepdims: false,
            },
            &[x],
            span,
        )
    }

    /// A second operand of element type `d`: a literal takes the type.
    fn operand_like(&mut self, cx: &mut FnCx, e: &Expr, d: DType) -> R<Value> {
        match self.expr(cx, e)? {
            EVal::Lit(x, f) => self.materialize(cx, x, f, d, e.span),
            v => {
                let v = self.as_tensor(cx, v, e.span)?;
                let got = Self::ty(cx, v);
                if got.dtype != d {
                    return Err(Diagnostic::new(
                        format!("the operands' element types differ: {d} vs {}", got.dtype),
                        e.span,
                        format!("{} vs {d}", got.dtype),
                    ));
                }
                Ok(v)
            }
        }
    }

    /// A weight and its gradient: float tensors of one type.
    fn weight_and_grad(
        &mut self,
        cx: &mut FnCx,
        we: &Expr,
        ge: &Expr,
        what: &str,
    ) -> R<(Value, Value, DType)> {
        let w = self.float_tensor(cx, we, what)?;
        let g = self.state_like(cx, ge, w, "g")?;
        Ok((w, g, Self::ty(cx, w).dtype))
    }

    /// An optimizer operand of the weight's type exactly.
    fn state_like(&mut self, cx: &mut FnCx, e: &Expr, w: Value, name: &str) -> R<Value> {
        let v = self.tensor(cx, e)?;
        let (want, got) = (Self::ty(cx, w), Self::ty(cx, v));
        if got != want {
            return Err(Diagnostic::new(
                format!("`{name}` must have the weight's type {want}, got {got}"),
                e.span,
                format!("{got}"),
            ));
        }
        Ok(v)
    }

    /// A learning rate: a positive literal, or a float scalar of type `d`
    /// (a schedule's value).
    fn rate(&mut self, cx: &mut FnCx, e: &Expr, d: DType) -> R<Value> {
        self.positive_scalar(cx, e, d, "a learning rate")
    }

    /// `what` (a learning rate, a loss scale): a positive number or a
    /// scalar of type `d`, as a value of type `d`.
    pub(super) fn positive_scalar(
        &mut self,
        cx: &mut FnCx,
        e: &Expr,
        d: DType,
        what: &str,
    ) -> R<Value> {
        match self.expr(cx, e)? {
            EVal::Lit(x, f) => {
                if !(x > 0.0 && x.is_finite()) {
                    return Err(Diagnostic::new(
                        format!("{what} must be positive"),
                        e.span,
                        format!("{x}"),
                    ));
                }
                self.materialize(cx, x, f, d, e.span)
            }
            v => {
                let v = self.as_tensor(cx, v, e.span)?;
                let got = Self::ty(cx, v);
                if got != TensorType::scalar(d) {
                    return Err(Diagnostic::new(
                        format!("{what} is a number or a {d} scalar, got {got}"),
                        e.span,
                        format!("{got}"),
                    ));
                }
                Ok(v)
            }
        }
    }

    /// The step number (1 for the first update): a numeric scalar, as `d`.
    fn step_count(&mut self, cx: &mut FnCx, e: &Expr, d: DType) -> R<Value> {
        match self.expr(cx, e)? {
            EVal::Lit(x, f) => self.materialize(cx, x, f, d, e.span),
            v => {
                let v = self.as_tensor(cx, v, e.span)?;
                let got = Self::ty(cx, v);
                if got.rank() != 0 || !got.dtype.is_numeric() {
                    return Err(Diagnostic::new(
                        format!("`step` is a number scalar (1 for the first update), got {got}"),
                        e.span,
                        format!("{got}"),
                    ));
                }
                if got.dtype == d {
                    Ok(v)
                } else {
                    self.add(cx, Op::Cast { to: d }, &[v], e.span)
                }
            }
        }
    }

    fn with_decay(
        &mut self,
        cx: &mut FnCx,
        g: Value,
        w: Value,
        wd: f64,
        d: DType,
        span: Span,
    ) -> R<Value> {
        if wd == 0.0 {
            return Ok(g);
        }
        let k = self.k(cx, wd, d);
        let s = self.bin(cx, BinaryOp::Mul, w, k, span)?;
        self.bin(cx, BinaryOp::Add, g, s, span)
    }
}

fn float_in(e: &Expr, what: &str, ok: impl Fn(f64) -> bool, range: &str) -> R<f64> {
    let (v, _) = const_float(e)?;
    if ok(v) {
        Ok(v)
    } else {
        Err(Diagnostic::new(
            format!("`{what}` must be {range}, got {v}"),
            e.span,
            format!("{v}"),
        ))
    }
}

fn positive_float(e: &Expr, what: &str) -> R<f64> {
    float_in(e, what, |v| v > 0.0 && v.is_finite(), "positive")
}

fn non_negative_float(e: &Expr, what: &str) -> R<f64> {
    float_in(e, what, |v| v >= 0.0 && v.is_finite(), "at least 0")
}

fn unit_float(e: &Expr, what: &str) -> R<f64> {
    float_in(e, what, |v| (0.0..1.0).contains(&v), "in [0, 1)")
}
