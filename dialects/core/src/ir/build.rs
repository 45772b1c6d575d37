//! Building a function of any dialect of the IR core: ops are appended to
//! the innermost open block, and a region is a block opened with its
//! arguments and closed into the op that owns it. Each dialect's builder
//! wraps this one with constructors for its ops.

use super::{Block, BufferOp, Dialect, Function, Value};

/// Builds one function.
pub struct Builder<D: Dialect> {
    f: Function<D>,
    blocks: Vec<Block>,
    /// The loops being built: each one's op and initial values.
    loops: Vec<(D::Op, Vec<Value>)>,
    loc: Option<crate::SourceLoc>,
}

impl<D: Dialect> Builder<D> {
    /// Starts function `name` with an empty body.
    pub fn new(name: impl Into<String>) -> Self {
        Builder {
            f: Function::new(name),
            blocks: vec![Block::default()],
            loops: vec![],
            loc: None,
        }
    }

    /// Sets the source place the ops built from now on carry; returns the
    /// previous one.
    pub fn set_loc(&mut self, loc: Option<crate::SourceLoc>) -> Option<crate::SourceLoc> {
        std::mem::replace(&mut self.loc, loc)
    }

    /// Appends a buffer parameter; `output` marks a result, which follows
    /// every input.
    pub fn param(&mut self, name: impl Into<String>, ty: D::Buffer, output: bool) -> Value {
        debug_assert!(output || self.f.outputs == 0, "inputs come before outputs");
        self.f.outputs += usize::from(output);
        self.f.add_param(name, ty)
    }

    /// The function built so far (its weights, say).
    pub fn function_mut(&mut self) -> &mut Function<D> {
        &mut self.f
    }

    /// The type of a value built so far.
    pub fn ty(&self, v: Value) -> &D::Type {
        self.f.ty(v)
    }

    /// Appends an op to the innermost open block; returns its results.
    pub fn push(
        &mut self,
        kind: D::Op,
        operands: Vec<Value>,
        results: &[D::Type],
        regions: Vec<Block>,
    ) -> Vec<Value> {
        let id = self.f.create_op(kind, operands, results, regions);
        self.f.ops[id.0 as usize].loc = self.loc.clone();
        if let Some(b) = self.blocks.last_mut() {
            b.ops.push(id);
        }
        self.f.op(id).results.clone()
    }

    /// Appends an op of one result; returns it.
    pub fn one(&mut self, kind: D::Op, operands: Vec<Value>, result: D::Type) -> Value {
        self.push(kind, operands, &[result], vec![])[0]
    }

    /// `D.alloc`: a new buffer.
    pub fn alloc(&mut self, ty: D::Buffer) -> Value {
        self.one(D::buffer_op(BufferOp::Alloc), vec![], D::buffer_type(ty))
    }

    /// `D.global`: a read-only row-major buffer of `ty` holding `values`.
    pub fn global(&mut self, values: std::sync::Arc<[f64]>, ty: D::Buffer) -> Value {
        self.one(
            D::buffer_op(BufferOp::Global(values)),
            vec![],
            D::buffer_type(ty),
        )
    }

    /// `D.dealloc`.
    pub fn dealloc(&mut self, b: Value) {
        self.push(D::buffer_op(BufferOp::Dealloc), vec![b], &[], vec![]);
    }

    /// `D.view`: buffer `b` seen as `ty`.
    pub fn view(&mut self, b: Value, ty: D::Buffer) -> Value {
        self.one(D::buffer_op(BufferOp::View), vec![b], D::buffer_type(ty))
    }

    /// Opens a region whose arguments have these types: ops built until
    /// [`Builder::close`] form its block. Returns the arguments.
    pub fn open(&mut self, args: &[D::Type]) -> Vec<Value> {
        let args: Vec<Value> = args.iter().map(|t| self.f.new_value(t.clone())).collect();
        self.blocks.push(Block {
            args: args.clone(),
            ops: vec![],
        });
        args
    }

    /// Closes the innermost open region; returns its block.
    pub fn close(&mut self) -> Block {
        self.blocks.pop().unwrap_or_default()
    }

    /// Opens the body of loop op `kind` carrying `inits`: ops built until
    /// [`Builder::close_loop`] form it. Returns its arguments, the counter (an
    /// index) and the carried values as the body sees them.
    pub fn open_loop(&mut self, kind: D::Op, inits: &[Value]) -> (Value, Vec<Value>) {
        let mut types = vec![D::index_type()];
        types.extend(inits.iter().map(|v| self.f.ty(*v).clone()));
        let args = self.open(&types);
        self.loops.push((kind, inits.to_vec()));
        (args[0], args[1..].to_vec())
    }

    /// Closes the innermost loop, ending its body with `yield_op` of `next`
    /// when it carries values; returns its results (the last iteration's
    /// values).
    pub fn close_loop(&mut self, yield_op: D::Op, next: Vec<Value>) -> Vec<Value> {
        let Some((kind, inits)) = self.loops.pop() else {
            unreachable!("close_loop closes a loop opened by open_loop")
        };
        if !inits.is_empty() {
            self.push(yield_op, next, &[], vec![]);
        }
        let types: Vec<D::Type> = inits.iter().map(|v| self.f.ty(*v).clone()).collect();
        let block = self.close();
        self.push(kind, inits, &types, vec![block])
    }

    /// Ends the function with `ret` and returns it.
    pub fn finish(mut self, ret: D::Op) -> Function<D> {
        self.push(ret, vec![], &[], vec![]);
        self.f.body = self.blocks.pop().unwrap_or_default();
        self.f
    }
}
