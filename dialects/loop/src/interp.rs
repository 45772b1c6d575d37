//! The loop interpreter: runs a function over buffers. Scalars are f64
//! values rounded to their element type after every op, as in the graph
//! interpreter; carried values of a `loop.for` are rounded each iteration,
//! so an f32 reduction accumulates in f32 here (the graph interpreter
//! accumulates in f64: results agree within tolerance, not exactly).

use dlc_core::DType;
use dlc_core::scalar::{apply_binary_in, apply_unary};

use crate::ir::{Block, BufferType, Function, IndexExpr, Module, OpKind, Type, Value};

use dlc_core::ir::OpDecl;
pub use dlc_core::ir::interp::{DEFAULT_WORK_LIMIT, MAX_ELEMENTS};

/// A buffer's contents (the IR core's interpreters' buffer).
pub type Buffer = dlc_core::ir::interp::Buffer<BufferType>;

/// Why a function could not run (the IR core's interpreters' errors).
pub type LoopError = dlc_core::ir::interp::RunError;

/// The ops a block executes: loops multiply their body's count by their
/// trip count, `loop.matmul` counts its multiply-adds and runs its epilogue
/// once per element.
fn block_work(f: &Function, b: &crate::Block) -> f64 {
    b.ops.iter().map(|&op| op_work(f, op)).sum()
}

fn op_work(f: &Function, op: crate::OpId) -> f64 {
    let data = &f.ops[op.0 as usize];
    let body = || data.regions.iter().map(|r| block_work(f, r)).sum::<f64>();
    let trips = |lo: i64, hi: i64, step: i64| ((hi - lo).max(0) as f64 / step.max(1) as f64).ceil();
    match &data.kind {
        OpKind::For { lo, hi, step } => 1.0 + trips(*lo, *hi, *step) * body(),
        OpKind::Parallel { lo, hi } => 1.0 + trips(*lo, *hi, 1) * body(),
        OpKind::Matmul(c) => {
            let (m, n, k) = (c.m.max(0) as f64, c.n.max(0) as f64, c.k.max(0) as f64);
            m * n * (2.0 * k + body())
        }
        _ => 1.0 + body(),
    }
}

/// Fails with [`LoopError::TooMuchWork`] when function `f`'s estimated
/// work is above `limit`.
pub fn check_work(f: &Function, limit: f64) -> Result<(), LoopError> {
    dlc_core::ir::interp::check_work(f, limit, op_work)
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Unset,
    Index(i64),
    Scalar(f64),
    Buffer(usize),
}

struct Machine<'f> {
    f: &'f Function,
    slots: Vec<Slot>,
    heap: Vec<Option<Buffer>>,
}

/// Runs `name` with `args`, one buffer per parameter, updating them in
/// place; refuses functions whose estimated work is above
/// [`DEFAULT_WORK_LIMIT`].
pub fn run_function(m: &Module, name: &str, args: &mut [Buffer]) -> Result<(), LoopError> {
    run_function_within(m, name, args, DEFAULT_WORK_LIMIT)
}

/// [`run_function`] under a work limit of `limit` executed ops.
pub fn run_function_within(
    m: &Module,
    name: &str,
    args: &mut [Buffer],
    limit: f64,
) -> Result<(), LoopError> {
    let f = dlc_core::ir::interp::function_for(m, name, args, limit, op_work)?;
    let mut machine = Machine {
        f,
        slots: vec![Slot::Unset; f.values.len()],
        heap: Vec::new(),
    };
    for ((_, v), arg) in f.params.iter().zip(args.iter_mut()) {
        machine.slots[v.0 as usize] = Slot::Buffer(machine.heap.len());
        machine.heap.push(Some(std::mem::replace(
            arg,
            Buffer {
                ty: arg.ty.clone(),
                data: vec![],
            },
        )));
    }
    let result = machine.block(&f.body, &[]);
    for (i, arg) in args.iter_mut().enumerate() {
        if let Some(b) = machine.heap[i].take() {
            *arg = b;
        }
    }
    result.map(|_| ())
}

impl Machine<'_> {
    fn scalar(&self, v: Value) -> Result<f64, LoopError> {
        match self.slots.get(v.0 as usize) {
            Some(Slot::Scalar(x)) => Ok(*x),
            _ => Err(LoopError::Invalid(format!(
                "value {} is not a computed scalar",
                v.0
            ))),
        }
    }

    fn dtype(&self, v: Value) -> DType {
        match self.f.ty(v) {
            Type::Scalar(d) => *d,
            _ => DType::F32,
        }
    }

    fn index(&self, e: &IndexExpr) -> Result<i64, LoopError> {
        e.terms.iter().try_fold(e.constant, |acc, (c, v)| {
            match self.slots.get(v.0 as usize) {
                Some(Slot::Index(i)) => Ok(acc.saturating_add(c.saturating_mul(*i))),
                _ => Err(LoopError::Invalid(format!("value {} is not an index", v.0))),
            }
        })
    }

    /// The storage offset of `index` in buffer `b`, or `None` out of bounds.
    fn offset(
        &self,
        b: Value,
        index: &[IndexExpr],
        op: &str,
    ) -> Result<(usize, Option<usize>), LoopError> {
        let Some(Slot::Buffer(id)) = self.slots.get(b.0 as usize).copied() else {
            return Err(LoopError::Invalid(format!("value {} is not a buffer", b.0)));
        };
        if self.heap[id].is_none() {
            return Err(LoopError::UseAfterFree(op.into()));
        }
        // The layout is the value's own type: a view shares storage with
        // another shape, strides and offset.
        let Type::Buffer(layout) = self.f.ty(b) else {
            return Err(LoopError::Invalid(format!("value {} is not a buffer", b.0)));
        };
        let idx: Vec<i64> = index
            .iter()
            .map(|e| self.index(e))
            .collect::<Result<_, _>>()?;
        let mut off = layout.offset;
        for ((&i, &d), &s) in idx.iter().zip(&layout.shape).zip(&layout.strides) {
            if i < 0 || i as u64 >= d as u64 {
                return Ok((id, None));
            }
            off += i as usize * s;
        }
        Ok((id, Some(off)))
    }

    fn out_of_bounds(&self, op: &str, b: Value, index: &[IndexExpr]) -> LoopError {
        LoopError::OutOfBounds {
            op: op.into(),
            index: index
                .iter()
                .map(|e| self.index(e).unwrap_or(i64::MIN))
                .collect(),
            ty: self.f.ty(b).to_string(),
        }
    }

    fn set(&mut self, v: Value, s: Slot) {
        self.slots[v.0 as usize] = s;
    }

    /// Runs a block; returns the values of its `loop.yield`, if any.
    fn block(&mut self, b: &Block, args: &[Slot]) -> Result<Vec<f64>, LoopError> {
        for (a, s) in b.args.iter().zip(args) {
            self.set(*a, *s);
        }
        for &id in &b.ops {
            let op = self.f.op(id);
            let name = op.kind.name();
            let r = op.results.first().copied();
            let scalar_result = |m: &mut Self, x: f64| {
                if let Some(r) = r {
                    let d = m.dtype(r);
                    m.set(r, Slot::Scalar(d.round(x)));
                }
            };
            match &op.kind {
                OpKind::Alloc => {
                    let Type::Buffer(t) = self.f.ty(op.results[0]).clone() else {
                        return Err(LoopError::Invalid("alloc of a non-buffer".into()));
                    };
                    self.heap.push(Some(Buffer::zeros(t)?));
                    self.set(op.results[0], Slot::Buffer(self.heap.len() - 1));
                }
                OpKind::Global(values) => {
                    let Type::Buffer(t) = self.f.ty(op.results[0]).clone() else {
                        return Err(LoopError::Invalid("global of a non-buffer".into()));
                    };
                    let mut b = Buffer::zeros(t)?;
                    if b.data.len() != values.len() {
                        return Err(LoopError::Invalid(format!(
                            "loop.global holds {} values for {} elements",
                            values.len(),
                            b.data.len()
                        )));
                    }
                    b.data.copy_from_slice(values);
                    self.heap.push(Some(b));
                    self.set(op.results[0], Slot::Buffer(self.heap.len() - 1));
                }
                OpKind::View => {
                    let src = self.slots.get(op.operands[0].0 as usize).copied();
                    let Some(Slot::Buffer(id)) = src else {
                        return Err(LoopError::Invalid("view of a non-buffer".into()));
                    };
                    self.set(op.results[0], Slot::Buffer(id));
                }
                OpKind::Dealloc => {
                    let Some(Slot::Buffer(id)) = self.slots.get(op.operands[0].0 as usize).copied()
                    else {
                        return Err(LoopError::Invalid("dealloc of a non-buffer".into()));
                    };
                    if self.heap[id].take().is_none() {
                        return Err(LoopError::UseAfterFree(name));
                    }
                }
                OpKind::Const(v) => scalar_result(self, *v),
                OpKind::Unary(u) => {
                    let x = self.scalar(op.operands[0])?;
                    scalar_result(self, apply_unary(*u, x));
                }
                OpKind::Binary(b) => {
                    let (x, y) = (self.scalar(op.operands[0])?, self.scalar(op.operands[1])?);
                    let d = self.dtype(op.operands[0]);
                    let v = apply_binary_in(*b, x, y, d)
                        .ok_or_else(|| LoopError::DivisionByZero(op.loc.clone()))?;
                    scalar_result(self, v);
                }
                OpKind::Compare(c) => {
                    let (x, y) = (self.scalar(op.operands[0])?, self.scalar(op.operands[1])?);
                    scalar_result(self, f64::from(u8::from(c.apply(x, y))));
                }
                OpKind::Select => {
                    let c = self.scalar(op.operands[0])?;
                    let v = self.scalar(op.operands[if c != 0.0 { 1 } else { 2 }])?;
                    scalar_result(self, v);
                }
                OpKind::Cast => {
                    let x = self.scalar(op.operands[0])?;
                    if let Some(r) = op.results.first()
                        && self.f.ty(*r) == &Type::Index
                    {
                        self.set(*r, Slot::Index(x as i64));
                    } else {
                        scalar_result(self, x);
                    }
                }
                OpKind::Load { index, pad } => {
                    let v = match self.offset(op.operands[0], index, &name)? {
                        (id, Some(off)) => self.heap[id].as_ref().map_or(0.0, |b| b.data[off]),
                        (_, None) => match pad {
                            Some(p) => *p,
                            None => return Err(self.out_of_bounds(&name, op.operands[0], index)),
                        },
                    };
                    scalar_result(self, v);
                }
                OpKind::Store { index } => {
                    let v = self.scalar(op.operands[0])?;
                    match self.offset(op.operands[1], index, &name)? {
                        (id, Some(off)) => {
                            if let Some(b) = self.heap[id].as_mut() {
                                b.data[off] = v;
                            }
                        }
                        (_, None) => return Err(self.out_of_bounds(&name, op.operands[1], index)),
                    }
                }
                OpKind::For { lo, hi, step } => {
                    let mut carried: Vec<f64> = op
                        .operands
                        .iter()
                        .map(|v| self.scalar(*v))
                        .collect::<Result<_, _>>()?;
                    let mut i = *lo;
                    while i < *hi {
                        let mut args = vec![Slot::Index(i)];
                        args.extend(carried.iter().map(|x| Slot::Scalar(*x)));
                        let yielded = self.block(&op.regions[0], &args)?;
                        if !carried.is_empty() {
                            carried = yielded;
                        }
                        i = i.saturating_add(*step);
                    }
                    for (r, x) in op.results.iter().zip(carried) {
                        self.set(*r, Slot::Scalar(x));
                    }
                }
                OpKind::Parallel { lo, hi } => {
                    for i in *lo..*hi {
                        self.block(&op.regions[0], &[Slot::Index(i)])?;
                    }
                }
                OpKind::Matmul(c) => {
                    let crate::ir::Contraction { m, n, k, a, b, .. } = &**c;
                    let body = &op.regions[0];
                    let (iv, jv, kv, acc) =
                        (body.args[0], body.args[1], body.args[2], body.args[3]);
                    let d = self.dtype(acc);
                    for i in 0..*m {
                        for j in 0..*n {
                            self.set(iv, Slot::Index(i));
                            self.set(jv, Slot::Index(j));
                            let mut sum = 0.0;
                            for kk in 0..*k {
                                self.set(kv, Slot::Index(kk));
                                let mut x = [0.0; 2];
                                for (slot, (buf, index)) in
                                    x.iter_mut().zip([(op.operands[0], a), (op.operands[1], b)])
                                {
                                    *slot = match self.offset(buf, index, &name)? {
                                        (id, Some(off)) => {
                                            self.heap[id].as_ref().map_or(0.0, |b| b.data[off])
                                        }
                                        (_, None) => {
                                            return Err(self.out_of_bounds(&name, buf, index));
                                        }
                                    };
                                }
                                sum = d.round(sum + d.round(x[0] * x[1]));
                            }
                            let args = [
                                Slot::Index(i),
                                Slot::Index(j),
                                Slot::Index(0),
                                Slot::Scalar(sum),
                            ];
                            self.block(body, &args)?;
                        }
                    }
                }
                OpKind::Yield => {
                    return op.operands.iter().map(|v| self.scalar(*v)).collect();
                }
                // A kernel group's bounds compute nothing.
                OpKind::KernelBegin(_) | OpKind::KernelEnd => {}
                OpKind::Return => return Ok(vec![]),
            }
        }
        Ok(vec![])
    }
}
