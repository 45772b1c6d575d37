//! The tile interpreter: runs a function exactly as the IR says. Kernels
//! run their programs one after another in row-major grid order; scratch
//! and shared buffers are allocated per program (filled with NaN for float
//! types, so reading what was never written shows); masks, pads and
//! packing loads and stores run element by element. Elements are f64
//! values rounded to their element type after every op; `tile.dot` and
//! `tile.reduce` sum exactly and round once.
//!
//! A program stands for all the threads a GPU runs it on, so the
//! interpreter checks what a barrier is for: an element of shared memory
//! written since the last `tile.barrier` must not be read or written again
//! before the next one, and one read must not be overwritten (each could be
//! another thread's access).

use std::rc::Rc;

use dlc_core::DType;
use dlc_core::scalar::{ReduceKind, apply_binary, apply_unary};

use crate::ir::{Affine, Block, BufferType, Function, Module, OpId, Space, Type, Value, op_work};
use crate::ops::OpKind;

use dlc_core::ir::OpDecl;
pub use dlc_core::ir::interp::{DEFAULT_WORK_LIMIT, MAX_ELEMENTS};

/// A buffer's contents (the IR core's interpreters' buffer).
pub type Buffer = dlc_core::ir::interp::Buffer<BufferType>;

/// Why a function could not run (the IR core's interpreters' errors).
pub type TileError = dlc_core::ir::interp::RunError;

fn elements(t: &Type) -> f64 {
    match t {
        Type::Tile(t) => t.len() as f64,
        _ => 1.0,
    }
}

/// Fails with [`TileError::TooMuchWork`] when function `f`'s estimated work
/// is above `limit`.
pub fn check_work(f: &Function, limit: f64) -> Result<(), TileError> {
    dlc_core::ir::interp::check_work(f, limit, op_work)
}

#[derive(Debug, Clone)]
enum Slot {
    Unset,
    Index(i64),
    Scalar(f64),
    Tile(Rc<[f64]>),
    Buffer(usize),
}

/// Storage: elements, and for shared memory the state of each element
/// since the last barrier (1: written, 2: read).
struct Storage {
    data: Vec<f64>,
    hazards: Option<Vec<u8>>,
}

struct Machine<'f> {
    f: &'f Function,
    slots: Vec<Slot>,
    heap: Vec<Option<Storage>>,
    program: [i64; 3],
    /// The results of the preparers `tile.prepared` ops name, by name.
    prepared: std::collections::HashMap<String, Vec<Vec<f64>>>,
}

/// Runs `name` with `args`, one buffer per parameter, updating them in
/// place; refuses functions whose estimated work is above
/// [`DEFAULT_WORK_LIMIT`].
pub fn run_function(m: &Module, name: &str, args: &mut [Buffer]) -> Result<(), TileError> {
    run_function_within(m, name, args, DEFAULT_WORK_LIMIT)
}

/// [`run_function`] under a work limit of `limit` element operations.
pub fn run_function_within(
    m: &Module,
    name: &str,
    args: &mut [Buffer],
    limit: f64,
) -> Result<(), TileError> {
    let f = dlc_core::ir::interp::function_for(m, name, args, limit, op_work)?;
    let mut machine = Machine {
        f,
        slots: vec![Slot::Unset; f.values.len()],
        heap: Vec::new(),
        program: [0; 3],
        prepared: run_preparers(m, f, limit)?,
    };
    for ((_, v), arg) in f.params.iter().zip(args.iter_mut()) {
        machine.slots[v.0 as usize] = Slot::Buffer(machine.heap.len());
        machine.heap.push(Some(Storage {
            data: std::mem::take(&mut arg.data),
            hazards: None,
        }));
    }
    let result = machine.block(&f.body, &[]);
    for (i, arg) in args.iter_mut().enumerate() {
        if let Some(s) = machine.heap[i].take() {
            arg.data = s.data;
        }
    }
    result.map(|_| ())
}

/// Runs each preparer `f`'s `tile.prepared` ops name, once, and returns
/// its results by name: what those ops read (the same values at every
/// call, so the interpreter computes them per call of `f`).
fn run_preparers(
    m: &Module,
    f: &Function,
    limit: f64,
) -> Result<std::collections::HashMap<String, Vec<Vec<f64>>>, TileError> {
    let mut prepared = std::collections::HashMap::new();
    for &id in &f.body.ops {
        let OpKind::Prepared { func, .. } = &f.op(id).kind else {
            continue;
        };
        if prepared.contains_key(func) {
            continue;
        }
        let invalid = |what: String| TileError::Invalid(format!("@{}: {what}", f.name));
        let p = m
            .functions
            .iter()
            .find(|g| g.name == *func)
            .ok_or_else(|| invalid(format!("tile.prepared names @{func}, which is not defined")))?;
        if p.params.len() != p.outputs || reads_prepared(p) {
            return Err(invalid(format!(
                "tile.prepared names @{func}, which takes inputs or reads prepared buffers"
            )));
        }
        let mut args = Vec::with_capacity(p.params.len());
        for (n, v) in &p.params {
            let Type::Buffer(t) = p.ty(*v) else {
                return Err(invalid(format!("result %{n} of @{func} is not a buffer")));
            };
            let len = t
                .storage_len()
                .filter(|&l| l <= MAX_ELEMENTS)
                .ok_or_else(|| invalid(format!("result %{n} of @{func} is too large")))?;
            args.push(Buffer {
                ty: t.clone(),
                data: vec![0.0; len],
            });
        }
        run_function_within(m, func, &mut args, limit)?;
        prepared.insert(func.clone(), args.into_iter().map(|b| b.data).collect());
    }
    Ok(prepared)
}

/// Whether `f` has `tile.prepared` ops.
pub(crate) fn reads_prepared(f: &Function) -> bool {
    f.body
        .ops
        .iter()
        .any(|&id| matches!(f.op(id).kind, OpKind::Prepared { .. }))
}

/// An index list evaluated for one program: per buffer dimension, the
/// part without tile coordinates and the coordinates' coefficients.
struct Addresses {
    bases: Vec<i64>,
    axes: Vec<Vec<(i64, usize)>>,
}

impl Addresses {
    fn at(&self, c: &[usize], out: &mut [i64]) {
        for (d, o) in out.iter_mut().enumerate() {
            *o = self.axes[d].iter().fold(self.bases[d], |acc, &(k, a)| {
                acc.saturating_add(k.saturating_mul(c.get(a).copied().unwrap_or(0) as i64))
            });
        }
    }
}

/// Row-major coordinates of element `flat` of `shape`.
fn coords(shape: &[usize], mut flat: usize, out: &mut [usize]) {
    for k in (0..shape.len()).rev() {
        out[k] = flat % shape[k];
        flat /= shape[k];
    }
}

fn flat_index(shape: &[usize], c: &[usize]) -> usize {
    c.iter().zip(shape).fold(0, |acc, (i, d)| acc * d + i)
}

impl Machine<'_> {
    fn invalid(&self, what: String) -> TileError {
        TileError::Invalid(format!("@{}: {what}", self.f.name))
    }

    fn slot(&self, v: Value) -> &Slot {
        &self.slots[v.0 as usize]
    }

    fn set(&mut self, v: Value, s: Slot) {
        self.slots[v.0 as usize] = s;
    }

    fn index_value(&self, v: Value) -> Result<i64, TileError> {
        match self.slot(v) {
            Slot::Index(i) => Ok(*i),
            _ => Err(self.invalid(format!("value {} is not an index", v.0))),
        }
    }

    /// The value of `e` without its tile coordinates.
    fn base(&self, e: &Affine) -> Result<i64, TileError> {
        e.terms.iter().try_fold(e.constant, |acc, (c, v)| {
            Ok(acc.saturating_add(c.saturating_mul(self.index_value(*v)?)))
        })
    }

    /// The elements of a scalar or tile value.
    fn elements(&self, v: Value) -> Result<Rc<[f64]>, TileError> {
        match self.slot(v) {
            Slot::Scalar(x) => Ok(Rc::from(vec![*x])),
            Slot::Tile(t) => Ok(t.clone()),
            _ => Err(self.invalid(format!("value {} is not computed", v.0))),
        }
    }

    fn put(&mut self, v: Value, data: Vec<f64>) {
        let d = self.f.ty(v).dtype().unwrap_or(DType::F32);
        let data: Vec<f64> = data.into_iter().map(|x| d.round(x)).collect();
        let slot = match self.f.ty(v) {
            Type::Tile(_) => Slot::Tile(Rc::from(data)),
            _ => Slot::Scalar(data.first().copied().unwrap_or(0.0)),
        };
        self.set(v, slot);
    }

    fn buffer(&self, v: Value, op: &str) -> Result<(usize, BufferType), TileError> {
        let Slot::Buffer(id) = self.slot(v) else {
            return Err(self.invalid(format!("value {} is not a buffer", v.0)));
        };
        if self.heap[*id].is_none() {
            return Err(TileError::UseAfterFree(op.into()));
        }
        let Type::Buffer(layout) = self.f.ty(v) else {
            return Err(self.invalid(format!("value {} is not a buffer", v.0)));
        };
        Ok((*id, layout.clone()))
    }

    fn alloc(&mut self, ty: &BufferType) -> Result<usize, TileError> {
        let n = match ty.storage_len() {
            Some(n) if n <= MAX_ELEMENTS => n,
            _ => return Err(TileError::TooLarge(ty.to_string())),
        };
        let fill = if ty.dtype.is_float() { f64::NAN } else { 0.0 };
        self.heap.push(Some(Storage {
            data: vec![fill; n],
            hazards: (ty.space == Space::Shared).then(|| vec![0; n]),
        }));
        Ok(self.heap.len() - 1)
    }

    /// The buffer index of each element under `index`.
    fn addresses(&self, index: &[Affine]) -> Result<Addresses, TileError> {
        Ok(Addresses {
            bases: index
                .iter()
                .map(|e| self.base(e))
                .collect::<Result<_, _>>()?,
            axes: index.iter().map(|e| e.axes.clone()).collect(),
        })
    }

    fn offset(layout: &BufferType, idx: &[i64]) -> Option<usize> {
        let mut off = layout.offset;
        for ((&i, &d), &s) in idx.iter().zip(&layout.shape).zip(&layout.strides) {
            if i < 0 || i as u64 >= d as u64 {
                return None;
            }
            off += i as usize * s;
        }
        Some(off)
    }

    fn mask(&self, op: &crate::OpData, at: usize) -> Result<Option<Rc<[f64]>>, TileError> {
        op.operands.get(at).map(|m| self.elements(*m)).transpose()
    }

    fn load(&mut self, id: OpId, index: &[Affine], pad: Option<f64>) -> Result<(), TileError> {
        let op = self.f.op(id);
        let name = op.kind.name();
        let (buf, layout) = self.buffer(op.operands[0], &name)?;
        let mask = self.mask(op, 1)?;
        let shape = self.f.ty(op.results[0]).shape().unwrap_or(&[]).to_vec();
        let n: usize = shape.iter().product();
        let address = self.addresses(index)?;
        let (mut c, mut idx) = (vec![0usize; shape.len()], vec![0i64; index.len()]);
        let mut out = Vec::with_capacity(n);
        for e in 0..n {
            if mask.as_ref().is_some_and(|m| m[e] == 0.0) {
                out.push(pad.unwrap_or(0.0));
                continue;
            }
            coords(&shape, e, &mut c);
            address.at(&c, &mut idx);
            match Self::offset(&layout, &idx) {
                Some(off) => {
                    let s = self.heap[buf]
                        .as_mut()
                        .ok_or_else(|| TileError::UseAfterFree(name.clone()))?;
                    if let Some(h) = s.hazards.as_mut() {
                        if h[off] & 1 != 0 {
                            return Err(TileError::SharedRace {
                                op: name,
                                what: "reads",
                                since: "written",
                                index: idx,
                                ty: layout.to_string(),
                            });
                        }
                        h[off] |= 2;
                    }
                    out.push(s.data[off]);
                }
                None => match pad {
                    Some(p) => out.push(p),
                    None => {
                        return Err(TileError::OutOfBounds {
                            op: name,
                            index: idx,
                            ty: layout.to_string(),
                        });
                    }
                },
            }
        }
        self.put(op.results[0], out);
        Ok(())
    }

    fn store(&mut self, id: OpId, index: &[Affine]) -> Result<(), TileError> {
        let op = self.f.op(id);
        let name = op.kind.name();
        let values = self.elements(op.operands[0])?;
        let (buf, layout) = self.buffer(op.operands[1], &name)?;
        let mask = self.mask(op, 2)?;
        let shape = self.f.ty(op.operands[0]).shape().unwrap_or(&[]).to_vec();
        let address = self.addresses(index)?;
        let (mut c, mut idx) = (vec![0usize; shape.len()], vec![0i64; index.len()]);
        let mut writes: Vec<(usize, usize)> = Vec::with_capacity(values.len());
        for e in 0..values.len() {
            if mask.as_ref().is_some_and(|m| m[e] == 0.0) {
                continue;
            }
            coords(&shape, e, &mut c);
            address.at(&c, &mut idx);
            match Self::offset(&layout, &idx) {
                Some(off) => writes.push((off, e)),
                None => {
                    return Err(TileError::OutOfBounds {
                        op: name,
                        index: idx,
                        ty: layout.to_string(),
                    });
                }
            }
        }
        let mut offsets: Vec<usize> = writes.iter().map(|w| w.0).collect();
        offsets.sort_unstable();
        if let Some(w) = offsets.windows(2).find(|w| w[0] == w[1]) {
            let e = writes.iter().find(|x| x.0 == w[0]).map_or(0, |x| x.1);
            coords(&shape, e, &mut c);
            address.at(&c, &mut idx);
            return Err(TileError::OverlappingStore {
                op: name,
                index: idx,
                ty: layout.to_string(),
            });
        }
        let s = self.heap[buf]
            .as_mut()
            .ok_or_else(|| TileError::UseAfterFree(name.clone()))?;
        if let Some(h) = s.hazards.as_mut() {
            for &(off, e) in &writes {
                if h[off] != 0 {
                    coords(&shape, e, &mut c);
                    address.at(&c, &mut idx);
                    return Err(TileError::SharedRace {
                        op: name,
                        what: "writes",
                        since: if h[off] & 1 != 0 { "written" } else { "read" },
                        index: idx,
                        ty: layout.to_string(),
                    });
                }
            }
            for &(off, _) in &writes {
                h[off] = 1;
            }
        }
        for (off, e) in writes {
            s.data[off] = values[e];
        }
        Ok(())
    }

    /// The shape of value `v` (none for a scalar).
    fn shape_of(&self, v: Value) -> Vec<usize> {
        self.f.ty(v).shape().unwrap_or(&[]).to_vec()
    }

    /// Runs a block; returns the values of its `tile.yield`, if any.
    fn block(&mut self, b: &Block, args: &[Slot]) -> Result<Vec<Slot>, TileError> {
        for (a, s) in b.args.iter().zip(args) {
            self.set(*a, s.clone());
        }
        for &id in &b.ops {
            let op = self.f.op(id);
            let name = op.kind.name();
            let result = op.results.first().copied();
            match &op.kind {
                OpKind::Alloc => {
                    let Some(Type::Buffer(t)) = result.map(|r| self.f.ty(r).clone()) else {
                        return Err(self.invalid("alloc of a non-buffer".into()));
                    };
                    let slot = self.alloc(&t)?;
                    self.set(op.results[0], Slot::Buffer(slot));
                }
                OpKind::Global(values) => self.global(id, values)?,
                OpKind::Prepared { func, index } => {
                    let values = self
                        .prepared
                        .get(func)
                        .and_then(|r| r.get(*index))
                        .cloned()
                        .ok_or_else(|| self.invalid(format!("@{func} has no result {index}")))?;
                    self.global(id, &values)?;
                }
                OpKind::View => {
                    let (id, _) = self.buffer(op.operands[0], &name)?;
                    self.set(op.results[0], Slot::Buffer(id));
                }
                OpKind::Dealloc => {
                    let (id, _) = self.buffer(op.operands[0], &name)?;
                    self.heap[id] = None;
                }
                OpKind::Kernel { grid, .. } => self.kernel(id, grid)?,
                OpKind::Return => return Ok(vec![]),
                OpKind::ProgramId { axis } => {
                    let p = self.program[(*axis).min(2)];
                    self.set(op.results[0], Slot::Index(p));
                }
                OpKind::Const(v) => {
                    let n = elements(self.f.ty(op.results[0])) as usize;
                    self.put(op.results[0], vec![*v; n]);
                }
                OpKind::Splat => {
                    let x = self.elements(op.operands[0])?[0];
                    let n = elements(self.f.ty(op.results[0])) as usize;
                    self.put(op.results[0], vec![x; n]);
                }
                OpKind::Unary(u) => {
                    let x = self.elements(op.operands[0])?;
                    self.put(
                        op.results[0],
                        x.iter().map(|&v| apply_unary(*u, v)).collect(),
                    );
                }
                OpKind::Binary(b) => {
                    let (x, y) = (
                        self.elements(op.operands[0])?,
                        self.elements(op.operands[1])?,
                    );
                    let d = self.f.ty(op.operands[0]).dtype();
                    let out: Option<Vec<f64>> = x
                        .iter()
                        .zip(y.iter())
                        .map(|(&a, &c)| match d {
                            Some(d) => dlc_core::scalar::apply_binary_in(*b, a, c, d),
                            None => apply_binary(*b, a, c, false),
                        })
                        .collect();
                    let out = out.ok_or_else(|| TileError::DivisionByZero(op.loc.clone()))?;
                    self.put(op.results[0], out);
                }
                OpKind::Compare(c) => {
                    let (x, y) = (
                        self.elements(op.operands[0])?,
                        self.elements(op.operands[1])?,
                    );
                    let out = x
                        .iter()
                        .zip(y.iter())
                        .map(|(&a, &b)| f64::from(u8::from(c.apply(a, b))));
                    self.put(op.results[0], out.collect());
                }
                OpKind::Select => {
                    let c = self.elements(op.operands[0])?;
                    let (a, b) = (
                        self.elements(op.operands[1])?,
                        self.elements(op.operands[2])?,
                    );
                    let out = (0..c.len()).map(|i| if c[i] != 0.0 { a[i] } else { b[i] });
                    self.put(op.results[0], out.collect());
                }
                OpKind::Cast if self.f.ty(op.results[0]) == &Type::Index => {
                    let x = self.elements(op.operands[0])?;
                    let i = x.first().copied().unwrap_or(0.0);
                    self.set(op.results[0], Slot::Index(i as i64));
                }
                OpKind::Cast => {
                    let x = self.elements(op.operands[0])?;
                    self.put(op.results[0], x.to_vec());
                }
                OpKind::Load { index, pad } => self.load(id, index, *pad)?,
                OpKind::Store { index } => self.store(id, index)?,
                // A hint: nothing is read, so no bounds to check.
                OpKind::Prefetch { .. } => {}
                OpKind::Mask { limits } => self.limits_mask(id, limits)?,
                OpKind::Broadcast => self.broadcast(id)?,
                OpKind::Reshape | OpKind::ExpandDims { .. } | OpKind::ConvertLayout => {
                    let x = self.elements(op.operands[0])?;
                    self.put(op.results[0], x.to_vec());
                }
                OpKind::Trans { perm } => self.trans(id, perm)?,
                OpKind::Slice { offsets } => self.slice(id, offsets)?,
                OpKind::Dot { .. } => self.dot(id)?,
                OpKind::Reduce { kind, axis } => self.reduce(id, *kind, *axis)?,
                OpKind::For { lo, hi, step } => {
                    let mut carried: Vec<Slot> =
                        op.operands.iter().map(|v| self.slot(*v).clone()).collect();
                    let mut i = *lo;
                    while i < *hi {
                        let mut args = vec![Slot::Index(i)];
                        args.extend(carried.iter().cloned());
                        let yielded = self.block(&op.regions[0], &args)?;
                        if !carried.is_empty() {
                            carried = yielded;
                        }
                        i = i.saturating_add((*step).max(1));
                    }
                    for (r, s) in op.results.iter().zip(carried) {
                        self.set(*r, s);
                    }
                }
                OpKind::Yield => {
                    return Ok(op.operands.iter().map(|v| self.slot(*v).clone()).collect());
                }
                OpKind::Barrier => {
                    for s in self.heap.iter_mut().flatten() {
                        if let Some(h) = s.hazards.as_mut() {
                            h.fill(0);
                        }
                    }
                }
            }
        }
        Ok(vec![])
    }

    /// `tile.global`: a buffer holding `values`.
    fn global(&mut self, id: OpId, values: &[f64]) -> Result<(), TileError> {
        let op = self.f.op(id);
        let Some(Type::Buffer(t)) = op.results.first().map(|&r| self.f.ty(r).clone()) else {
            return Err(self.invalid("global of a non-buffer".into()));
        };
        if t.storage_len() != Some(values.len()) {
            return Err(self.invalid(format!("tile.global holds {} values for {t}", values.len())));
        }
        let slot = self.alloc(&t)?;
        if let Some(storage) = self.heap[slot].as_mut() {
            storage.data.copy_from_slice(values);
        }
        self.set(op.results[0], Slot::Buffer(slot));
        Ok(())
    }

    /// `tile.kernel`: its body once per program of `grid`, in order.
    fn kernel(&mut self, id: OpId, grid: &[usize]) -> Result<(), TileError> {
        let op = self.f.op(id);
        let body = &op.regions[0];
        let total: usize = grid.iter().product();
        let mut c = vec![0usize; grid.len()];
        for p in 0..total {
            coords(grid, p, &mut c);
            for (k, x) in c.iter().enumerate() {
                self.program[k] = *x as i64;
            }
            let heap_mark = self.heap.len();
            let r = self.block(body, &[]);
            // Scratch and shared memory live for one program.
            self.heap.truncate(heap_mark);
            r?;
        }
        Ok(())
    }

    /// `tile.mask`: whether each element's coordinates lie within the limits.
    fn limits_mask(&mut self, id: OpId, limits: &[Affine]) -> Result<(), TileError> {
        let op = self.f.op(id);
        let shape = self.shape_of(op.results[0]);
        let lims: Vec<i64> = limits
            .iter()
            .map(|e| self.base(e))
            .collect::<Result<_, _>>()?;
        let n: usize = shape.iter().product();
        let mut c = vec![0usize; shape.len()];
        let mut out = Vec::with_capacity(n);
        for e in 0..n {
            coords(&shape, e, &mut c);
            let on = c.iter().zip(&lims).all(|(&x, &l)| (x as i64) < l);
            out.push(f64::from(u8::from(on)));
        }
        self.put(op.results[0], out);
        Ok(())
    }

    /// `tile.broadcast`: axes of extent 1 repeated.
    fn broadcast(&mut self, id: OpId) -> Result<(), TileError> {
        let from = self.shape_of(self.f.op(id).operands[0]);
        self.rearrange(id, |c, src| {
            for k in 0..c.len() {
                src[k] = if from[k] == 1 { 0 } else { c[k] };
            }
        })
    }

    /// `tile.trans`: the axes permuted.
    fn trans(&mut self, id: OpId, perm: &[usize]) -> Result<(), TileError> {
        self.rearrange(id, |c, src| {
            for (i, &p) in perm.iter().enumerate() {
                src[p] = c[i];
            }
        })
    }

    /// A result of op `id` each of whose elements is one of its operand's
    /// (of the same rank): the one at the coordinates `at` writes into its
    /// second argument from the result's coordinates.
    fn rearrange(
        &mut self,
        id: OpId,
        at: impl Fn(&[usize], &mut [usize]),
    ) -> Result<(), TileError> {
        let op = self.f.op(id);
        let (from, to) = (self.shape_of(op.operands[0]), self.shape_of(op.results[0]));
        let x = self.elements(op.operands[0])?;
        let n: usize = to.iter().product();
        let (mut c, mut src) = (vec![0usize; to.len()], vec![0usize; from.len()]);
        let mut out = Vec::with_capacity(n);
        for e in 0..n {
            coords(&to, e, &mut c);
            at(&c, &mut src);
            out.push(x[flat_index(&from, &src)]);
        }
        self.put(op.results[0], out);
        Ok(())
    }

    /// `tile.slice`: the operand's elements from the offsets on.
    fn slice(&mut self, id: OpId, offsets: &[Affine]) -> Result<(), TileError> {
        let op = self.f.op(id);
        let (from, to) = (self.shape_of(op.operands[0]), self.shape_of(op.results[0]));
        let at = offsets
            .iter()
            .map(|e| self.base(e))
            .collect::<Result<Vec<i64>, _>>()?;
        if let Some(k) = (0..to.len()).find(|&k| at[k] < 0 || at[k] + to[k] as i64 > from[k] as i64)
        {
            return Err(TileError::OutOfBounds {
                op: "tile.slice".into(),
                index: at,
                ty: format!(
                    "{} elements of axis {k} of {}",
                    to[k],
                    self.f.ty(op.operands[0])
                ),
            });
        }
        self.rearrange(id, |c, src| {
            for (k, s) in src.iter_mut().enumerate() {
                *s = c[k] + at[k] as usize;
            }
        })
    }

    /// `tile.dot`: the accumulator plus the product, in f64.
    fn dot(&mut self, id: OpId) -> Result<(), TileError> {
        let op = self.f.op(id);
        let (a, b, acc) = (
            self.elements(op.operands[0])?,
            self.elements(op.operands[1])?,
            self.elements(op.operands[2])?,
        );
        let (sa, sb) = (self.shape_of(op.operands[0]), self.shape_of(op.operands[1]));
        let (m, k, n) = (sa[0], sa[1], sb[1]);
        let mut out = acc.to_vec();
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
                out[i * n + j] += s;
            }
        }
        self.put(op.results[0], out);
        Ok(())
    }

    /// `tile.reduce` along `axis`.
    fn reduce(&mut self, id: OpId, kind: ReduceKind, axis: usize) -> Result<(), TileError> {
        let op = self.f.op(id);
        let shape = self.shape_of(op.operands[0]);
        let x = self.elements(op.operands[0])?;
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let len = shape[axis];
        let mut out = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            for i in 0..inner {
                let mut acc = kind.identity();
                for r in 0..len {
                    acc = kind.combine(acc, x[(o * len + r) * inner + i]);
                }
                if kind == ReduceKind::Mean {
                    acc /= len as f64;
                }
                out.push(acc);
            }
        }
        self.put(op.results[0], out);
        Ok(())
    }
}
