//! A builder that appends ops to the innermost open block, for code that
//! produces loop IR (the lowering from the graph dialect).

use dlc_core::DType;
use dlc_core::scalar::{BinaryOp, CmpOp, UnaryOp};

use crate::ir::{Block, BufferType, Function, IndexExpr, OpKind, Type, Value};

/// Builds one function; loop bodies are built by closures.
pub struct Builder {
    f: Function,
    blocks: Vec<Block>,
}

impl Builder {
    /// Starts function `name` with an empty body.
    pub fn new(name: impl Into<String>) -> Self {
        Builder {
            f: Function::new(name),
            blocks: vec![Block::default()],
        }
    }

    /// Appends a buffer parameter.
    pub fn param(&mut self, name: impl Into<String>, ty: BufferType) -> Value {
        self.f.add_param(name, ty)
    }

    /// The type of a value built so far.
    pub fn ty(&self, v: Value) -> &Type {
        self.f.ty(v)
    }

    fn scalar_type(&self, v: Value) -> DType {
        match self.f.ty(v) {
            Type::Scalar(d) => *d,
            _ => DType::F32,
        }
    }

    fn push(
        &mut self,
        kind: OpKind,
        operands: Vec<Value>,
        results: &[Type],
        regions: Vec<Block>,
    ) -> Vec<Value> {
        let id = self.f.create_op(kind, operands, results, regions);
        if let Some(b) = self.blocks.last_mut() {
            b.ops.push(id);
        }
        self.f.op(id).results.clone()
    }

    fn one(&mut self, kind: OpKind, operands: Vec<Value>, result: Type) -> Value {
        self.push(kind, operands, &[result], vec![])[0]
    }

    /// `loop.alloc`.
    pub fn alloc(&mut self, ty: BufferType) -> Value {
        self.one(OpKind::Alloc, vec![], Type::Buffer(ty))
    }

    /// `loop.dealloc`.
    pub fn dealloc(&mut self, b: Value) {
        self.push(OpKind::Dealloc, vec![b], &[], vec![]);
    }

    /// `loop.view`.
    pub fn view(&mut self, b: Value, ty: BufferType) -> Value {
        self.one(OpKind::View, vec![b], Type::Buffer(ty))
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

    /// `loop.load`, with an optional value for reads outside the buffer.
    pub fn load(&mut self, buf: Value, index: Vec<IndexExpr>, pad: Option<f64>) -> Value {
        let d = match self.f.ty(buf) {
            Type::Buffer(b) => b.dtype,
            _ => DType::F32,
        };
        self.one(OpKind::Load { index, pad }, vec![buf], Type::Scalar(d))
    }

    /// `loop.store`.
    pub fn store(&mut self, v: Value, buf: Value, index: Vec<IndexExpr>) {
        self.push(OpKind::Store { index }, vec![v, buf], &[], vec![]);
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
        let iv = self.f.new_value(Type::Index);
        let types: Vec<Type> = inits.iter().map(|v| self.f.ty(*v).clone()).collect();
        let carried: Vec<Value> = types.iter().map(|t| self.f.new_value(t.clone())).collect();
        let mut args = vec![iv];
        args.extend(&carried);
        self.blocks.push(Block { args, ops: vec![] });
        let next = body(self, iv, &carried);
        if !inits.is_empty() {
            self.push(OpKind::Yield, next, &[], vec![]);
        }
        let block = self.blocks.pop().unwrap_or_default();
        self.push(
            OpKind::For { lo, hi, step },
            inits.to_vec(),
            &types,
            vec![block],
        )
    }

    /// A loop of independent iterations.
    pub fn parallel(&mut self, lo: i64, hi: i64, body: impl FnOnce(&mut Self, Value)) {
        let iv = self.f.new_value(Type::Index);
        self.blocks.push(Block {
            args: vec![iv],
            ops: vec![],
        });
        body(self, iv);
        let block = self.blocks.pop().unwrap_or_default();
        self.push(OpKind::Parallel { lo, hi }, vec![], &[], vec![block]);
    }

    /// Ends the function with `loop.return`.
    pub fn finish(mut self) -> Function {
        self.push(OpKind::Return, vec![], &[], vec![]);
        self.f.body = self.blocks.pop().unwrap_or_default();
        self.f
    }
}
