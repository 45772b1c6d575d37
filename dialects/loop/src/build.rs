//! A builder that appends ops to the innermost open block, for code that
//! produces loop IR (the lowering from the graph dialect).

use dlc_core::DType;
use dlc_core::scalar::{BinaryOp, CmpOp, UnaryOp};

use crate::ir::{BufferType, Function, IndexExpr, Loop, OpKind, Type, Value};

/// Builds one function (on the IR core's builder); loop bodies are built by
/// closures.
pub struct Builder {
    b: dlc_core::ir::build::Builder<Loop>,
    open: Vec<OpenLoop>,
}

/// A loop whose body is being built.
enum OpenLoop {
    /// A counted loop (its op and initial values are the core builder's).
    For,
    Parallel {
        lo: i64,
        hi: i64,
    },
    Matmul {
        m: i64,
        n: i64,
        k: i64,
    },
}

impl std::ops::Deref for Builder {
    type Target = dlc_core::ir::build::Builder<Loop>;
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

    /// Appends an input buffer parameter (before any output).
    pub fn param(&mut self, name: impl Into<String>, ty: BufferType) -> Value {
        self.b.param(name, ty, false)
    }

    /// Marks input parameter `i` a weight.
    pub fn weight(&mut self, i: usize) {
        self.b.function_mut().weights.insert(i);
    }

    /// Appends an output buffer parameter: a result the function writes.
    pub fn output(&mut self, name: impl Into<String>, ty: BufferType) -> Value {
        self.b.param(name, ty, true)
    }

    fn scalar_type(&self, v: Value) -> DType {
        match self.b.ty(v) {
            Type::Scalar(d) => *d,
            _ => DType::F32,
        }
    }

    /// `loop.kernel_begin {group = ..}`: opens a kernel group of the
    /// function's top-level ops.
    pub fn kernel_begin(&mut self, group: crate::KernelGroup) {
        self.push(OpKind::KernelBegin(group), vec![], &[], vec![]);
    }

    /// `loop.kernel_end`: closes the open kernel group.
    pub fn kernel_end(&mut self) {
        self.push(OpKind::KernelEnd, vec![], &[], vec![]);
    }

    /// `loop.const` (the value rounded to `dtype`).
    pub fn constant(&mut self, v: f64, dtype: DType) -> Value {
        self.one(OpKind::Const(dtype.round(v)), vec![], Type::Scalar(dtype))
    }

    /// An element-wise function of one scalar.
    pub fn unary(&mut self, u: UnaryOp, x: Value) -> Value {
        let d = self.scalar_type(x);
        self.one(OpKind::Unary(u), vec![x], Type::Scalar(d))
    }

    /// An element-wise function of two scalars of one type.
    pub fn binary(&mut self, b: BinaryOp, x: Value, y: Value) -> Value {
        let d = self.scalar_type(x);
        self.one(OpKind::Binary(b), vec![x, y], Type::Scalar(d))
    }

    /// A comparison, giving bool.
    pub fn compare(&mut self, c: CmpOp, x: Value, y: Value) -> Value {
        self.one(OpKind::Compare(c), vec![x, y], Type::Scalar(DType::Bool))
    }

    /// `loop.select`.
    pub fn select(&mut self, c: Value, a: Value, b: Value) -> Value {
        let d = self.scalar_type(a);
        self.one(OpKind::Select, vec![c, a, b], Type::Scalar(d))
    }

    /// `loop.cast` (nothing when the type already matches).
    pub fn cast(&mut self, x: Value, to: DType) -> Value {
        if self.scalar_type(x) == to {
            return x;
        }
        self.one(OpKind::Cast, vec![x], Type::Scalar(to))
    }

    /// `%i = loop.cast %x : index`: an integer scalar as an index, which
    /// loads and stores may then use (a gather's data-dependent row).
    pub fn index_of(&mut self, x: Value) -> Value {
        self.one(OpKind::Cast, vec![x], Type::Index)
    }

    /// `loop.load`, with an optional value for reads outside the buffer.
    pub fn load(&mut self, buf: Value, index: Vec<IndexExpr>, pad: Option<f64>) -> Value {
        let d = match self.b.ty(buf) {
            Type::Buffer(b) => b.dtype,
            _ => DType::F32,
        };
        self.one(OpKind::Load { index, pad }, vec![buf], Type::Scalar(d))
    }

    /// `loop.store`.
    pub fn store(&mut self, v: Value, buf: Value, index: Vec<IndexExpr>) {
        self.push(OpKind::Store { index }, vec![v, buf], &[], vec![]);
    }

    /// Opens a sequential loop carrying `inits`; ops built until
    /// [`Builder::end_for`] form its body. Returns the index and the carried
    /// values as the body sees them.
    pub fn begin_for(
        &mut self,
        lo: i64,
        hi: i64,
        step: i64,
        inits: &[Value],
    ) -> (Value, Vec<Value>) {
        self.open.push(OpenLoop::For);
        self.b.open_loop(OpKind::For { lo, hi, step }, inits)
    }

    /// Closes the innermost open `loop.for`, yielding `next` (one per carried
    /// value); returns the loop's results.
    pub fn end_for(&mut self, next: Vec<Value>) -> Vec<Value> {
        let Some(OpenLoop::For) = self.open.pop() else {
            unreachable!("end_for closes a loop opened by begin_for")
        };
        self.b.close_loop(OpKind::Yield, next)
    }

    /// Opens a loop of independent iterations; returns its index.
    pub fn begin_parallel(&mut self, lo: i64, hi: i64) -> Value {
        self.open.push(OpenLoop::Parallel { lo, hi });
        self.b.open(&[Type::Index])[0]
    }

    /// Closes the innermost open `loop.parallel`.
    pub fn end_parallel(&mut self) {
        let Some(OpenLoop::Parallel { lo, hi }) = self.open.pop() else {
            unreachable!("end_parallel closes a loop opened by begin_parallel")
        };
        let block = self.b.close();
        self.push(OpKind::Parallel { lo, hi }, vec![], &[], vec![block]);
    }

    /// Opens a `loop.matmul` of `m x n` results summed over `k`, whose
    /// accumulator is `acc`; ops built until [`Builder::end_matmul`] are its
    /// epilogue. Returns `(i, j, k, acc)` as the epilogue sees them (`k`
    /// only indexes the operands).
    pub fn begin_matmul(&mut self, m: i64, n: i64, k: i64, acc: DType) -> [Value; 4] {
        self.open.push(OpenLoop::Matmul { m, n, k });
        let args = self
            .b
            .open(&[Type::Index, Type::Index, Type::Index, Type::Scalar(acc)]);
        [args[0], args[1], args[2], args[3]]
    }

    /// Closes the innermost open `loop.matmul`: its operands, indexed by
    /// affine expressions of the `i`, `k` (left) and `k`, `j` (right) that
    /// [`Builder::begin_matmul`] returned and of enclosing indices.
    pub fn end_matmul(
        &mut self,
        a: Value,
        a_index: Vec<IndexExpr>,
        b: Value,
        b_index: Vec<IndexExpr>,
    ) {
        let Some(OpenLoop::Matmul { m, n, k }) = self.open.pop() else {
            unreachable!("end_matmul closes a product opened by begin_matmul")
        };
        let block = self.b.close();
        let c = crate::ir::Contraction {
            m,
            n,
            k,
            a: a_index,
            b: b_index,
        };
        self.push(OpKind::Matmul(Box::new(c)), vec![a, b], &[], vec![block]);
    }

    /// A sequential loop carrying `inits`; `body` gets the index and the
    /// carried values and returns the next ones. Returns the final values.
    pub fn for_loop(
        &mut self,
        lo: i64,
        hi: i64,
        step: i64,
        inits: &[Value],
        body: impl FnOnce(&mut Self, Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let (iv, carried) = self.begin_for(lo, hi, step, inits);
        let next = body(self, iv, &carried);
        self.end_for(next)
    }

    /// A loop of independent iterations.
    pub fn parallel(&mut self, lo: i64, hi: i64, body: impl FnOnce(&mut Self, Value)) {
        let iv = self.begin_parallel(lo, hi);
        body(self, iv);
        self.end_parallel();
    }

    /// Ends the function with `loop.return`.
    pub fn finish(self) -> Function {
        self.b.finish(OpKind::Return)
    }
}
