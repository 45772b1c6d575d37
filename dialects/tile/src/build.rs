//! A builder that appends ops to the innermost open block, for code that
//! produces tile IR (the loop -> tile conversion).

use dlc_core::DType;
use dlc_core::scalar::{BinaryOp, CmpOp, ReduceKind, UnaryOp};

use crate::ir::{Affine, BufferType, Function, Schedule, Tile, TileType, Type, Value};
use crate::ops::OpKind;

/// Builds one function (on the IR core's builder); kernel and loop bodies
/// are opened and closed.
pub struct Builder {
    b: dlc_core::ir::build::Builder<Tile>,
    open: Vec<Open>,
}

enum Open {
    Kernel {
        grid: Vec<usize>,
        schedule: Schedule,
    },
    /// A counted loop (its op and initial values are the core builder's).
    For,
}

impl std::ops::Deref for Builder {
    type Target = dlc_core::ir::build::Builder<Tile>;
    fn deref(&self) -> &Self::Target {
        &self.b
    }
}

impl std::ops::DerefMut for Builder {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.b
    }
}

impl Builder {
    /// Starts function `name` with an empty body.
    pub fn new(name: impl Into<String>) -> Self {
        Builder {
            b: dlc_core::ir::build::Builder::new(name),
            open: vec![],
        }
    }

    /// Appends a buffer parameter; `output` marks a result (after inputs).
    pub fn param(&mut self, name: impl Into<String>, ty: BufferType, output: bool) -> Value {
        self.b.param(name, ty, output)
    }

    /// Marks the inputs (indices into the parameters) that are weights.
    pub fn set_weights(&mut self, weights: std::collections::BTreeSet<usize>) {
        self.b.function_mut().weights = weights;
    }

    /// `tile.program_id`.
    pub fn program_id(&mut self, axis: usize) -> Value {
        self.one(OpKind::ProgramId { axis }, vec![], Type::Index)
    }

    /// `tile.const` of type `ty` (a scalar or a tile), `v` rounded to its
    /// element type (as the loop dialect's `loop.const 2.4 : f32` means).
    pub fn constant(&mut self, v: f64, ty: Type) -> Value {
        let v = ty.dtype().map_or(v, |d| d.round(v));
        self.one(OpKind::Const(v), vec![], ty)
    }

    /// `tile.splat` of a scalar to a tile of `shape`.
    pub fn splat(&mut self, x: Value, shape: &[usize]) -> Value {
        let d = self.ty(x).dtype().unwrap_or(DType::F32);
        self.one(
            OpKind::Splat,
            vec![x],
            Type::Tile(TileType::new(d, shape.to_vec())),
        )
    }

    /// An element-wise unary op.
    pub fn unary(&mut self, u: UnaryOp, x: Value) -> Value {
        let t = self.ty(x).clone();
        self.one(OpKind::Unary(u), vec![x], t)
    }

    /// An element-wise binary op.
    pub fn binary(&mut self, b: BinaryOp, x: Value, y: Value) -> Value {
        let t = self.ty(x).clone();
        self.one(OpKind::Binary(b), vec![x, y], t)
    }

    /// An element-wise comparison.
    pub fn compare(&mut self, c: CmpOp, x: Value, y: Value) -> Value {
        let t = self.ty(x).with_dtype(DType::Bool);
        self.one(OpKind::Compare(c), vec![x, y], t)
    }

    /// `tile.select`.
    pub fn select(&mut self, c: Value, a: Value, b: Value) -> Value {
        let t = self.ty(a).clone();
        self.one(OpKind::Select, vec![c, a, b], t)
    }

    /// `tile.cast` to element type `to`.
    pub fn cast(&mut self, x: Value, to: DType) -> Value {
        let t = self.ty(x).with_dtype(to);
        self.one(OpKind::Cast, vec![x], t)
    }

    /// `%i = tile.cast %x : index`: an integer scalar as an index, for the
    /// accesses that follow (a gather's data-dependent row).
    pub fn index_of(&mut self, x: Value) -> Value {
        self.one(OpKind::Cast, vec![x], Type::Index)
    }

    /// `tile.load` of a `result` value (`pad` rounded to its element type).
    pub fn load(
        &mut self,
        buf: Value,
        index: Vec<Affine>,
        mask: Option<Value>,
        pad: Option<f64>,
        result: Type,
    ) -> Value {
        let mut operands = vec![buf];
        operands.extend(mask);
        // The pad is a value of the element type.
        let pad = pad.map(|p| result.dtype().map_or(p, |d| d.round(p)));
        self.one(OpKind::Load { index, pad }, operands, result)
    }

    /// `tile.store`.
    pub fn store(&mut self, v: Value, buf: Value, index: Vec<Affine>, mask: Option<Value>) {
        let mut operands = vec![v, buf];
        operands.extend(mask);
        self.push(OpKind::Store { index }, operands, &[], vec![]);
    }

    /// `tile.prefetch` of a tile of `shape` at `index` into `buf`, into
    /// cache level `level` (1: the nearest).
    pub fn prefetch(&mut self, buf: Value, index: Vec<Affine>, shape: Vec<usize>, level: usize) {
        self.push(
            OpKind::Prefetch {
                index,
                shape,
                level,
            },
            vec![buf],
            &[],
            vec![],
        );
    }

    /// `tile.mask` of `shape` with the given limits.
    pub fn mask(&mut self, limits: Vec<Affine>, shape: &[usize]) -> Value {
        let t = Type::Tile(TileType::new(DType::Bool, shape.to_vec()));
        self.one(OpKind::Mask { limits }, vec![], t)
    }

    /// `tile.broadcast` to `shape`.
    pub fn broadcast(&mut self, x: Value, shape: &[usize]) -> Value {
        let d = self.ty(x).dtype().unwrap_or(DType::F32);
        self.one(OpKind::Broadcast, vec![x], Type::value(d, shape))
    }

    /// `tile.dot`.
    pub fn dot(&mut self, a: Value, b: Value, acc: Value) -> Value {
        let t = self.ty(acc).clone();
        self.one(OpKind::Dot { mma: None }, vec![a, b, acc], t)
    }

    /// `tile.convert_layout` of `x` to `layout`.
    pub fn convert_layout(&mut self, x: Value, layout: crate::ir::Layout) -> Value {
        let t = match self.ty(x) {
            Type::Tile(t) => Type::Tile(t.clone().with_layout(layout)),
            other => other.clone(),
        };
        self.one(OpKind::ConvertLayout, vec![x], t)
    }

    /// `tile.reduce` along `axis`.
    pub fn reduce(&mut self, kind: ReduceKind, axis: usize, x: Value) -> Value {
        let (d, mut shape) = match self.ty(x) {
            Type::Tile(t) => (t.dtype, t.shape.clone()),
            other => (other.dtype().unwrap_or(DType::F32), vec![]),
        };
        if axis < shape.len() {
            shape.remove(axis);
        }
        self.one(
            OpKind::Reduce { kind, axis },
            vec![x],
            Type::value(d, &shape),
        )
    }

    /// `tile.barrier`.
    pub fn barrier(&mut self) {
        self.push(OpKind::Barrier, vec![], &[], vec![]);
    }

    /// Opens a kernel; ops built until [`Builder::end_kernel`] are its body.
    pub fn begin_kernel(&mut self, grid: Vec<usize>, schedule: Schedule) {
        self.b.open(&[]);
        self.open.push(Open::Kernel { grid, schedule });
    }

    /// Closes the innermost open kernel.
    pub fn end_kernel(&mut self) {
        let Some(Open::Kernel { grid, schedule }) = self.open.pop() else {
            unreachable!("end_kernel closes a kernel opened by begin_kernel")
        };
        let block = self.b.close();
        self.push(OpKind::Kernel { grid, schedule }, vec![], &[], vec![block]);
    }

    /// Opens a counted loop carrying `inits`; returns its counter and the
    /// carried values as the body sees them.
    pub fn begin_for(
        &mut self,
        lo: i64,
        hi: i64,
        step: i64,
        inits: &[Value],
    ) -> (Value, Vec<Value>) {
        self.open.push(Open::For);
        self.b.open_loop(OpKind::For { lo, hi, step }, inits)
    }

    /// Closes the innermost open loop, yielding `next`; returns its results.
    pub fn end_for(&mut self, next: Vec<Value>) -> Vec<Value> {
        let Some(Open::For) = self.open.pop() else {
            unreachable!("end_for closes a loop opened by begin_for")
        };
        self.b.close_loop(OpKind::Yield, next)
    }

    /// Ends the function with `tile.return`.
    pub fn finish(self) -> Function {
        self.b.finish(OpKind::Return)
    }
}
