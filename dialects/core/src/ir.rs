//! The IR core the loop and tile dialects share: functions over buffers whose
//! values and ops live in per-function arenas ([`Value`] and [`OpId`] index
//! them), ops that own their nested blocks, blocks that list their ops in
//! order. What an op is (the dialect's op kind) lives apart from where it sits
//! (the block that lists it).
//!
//! A dialect is a [`Dialect`]: its name, its op kinds ([`OpDecl`]: each op
//! declared once, with its name, attributes, syntax and index lists) and its
//! value types. The text printer, parser and verifier of both dialects derive
//! from those declarations ([`crate::ir::print`], [`crate::ir::parse`],
//! [`crate::ir::verify`]); what stays with a dialect is its types, its ops'
//! meaning (typing rules, interpreter) and the checks only it knows.
//!
//! The graph dialect is a DAG held in petgraph, not arenas of blocks, and does
//! not use this core; it shares the attributes ([`crate::attr`]), the lexer
//! ([`crate::lex`]) and the pass machinery.

use std::collections::BTreeSet;
use std::fmt;

pub mod build;
pub mod interp;
pub mod mlir;
pub mod parse;
pub mod print;
pub mod verify;

pub use verify::Terminator;

pub use crate::attr::Attr;

/// An SSA value: a function parameter, a block argument or an op result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(pub u32);

/// An op of a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u32);

/// A dialect of the IR core: the loop dialect or the tile dialect.
pub trait Dialect: Sized + Clone + fmt::Debug + PartialEq + Default + 'static {
    /// The prefix of its op names (`loop` in `loop.add`).
    const NAME: &'static str;
    /// What an op does: the dialect's op kinds.
    type Op: OpDecl;
    /// The type of a value.
    type Type: Clone + fmt::Debug + PartialEq + fmt::Display;
    /// The type of a function parameter (every parameter is a buffer).
    type Buffer: Clone + fmt::Debug + PartialEq + fmt::Display;
    /// A parameter's buffer as the type of its value.
    fn buffer_type(b: Self::Buffer) -> Self::Type;
    /// The type `index` (loop counters, program ids).
    fn index_type() -> Self::Type;
    /// The dialect's op for one of the buffer ops every dialect of the core
    /// has.
    fn buffer_op(op: BufferOp) -> Self::Op;
}

/// The buffer ops every dialect of the IR core has, with one meaning.
#[derive(Debug, Clone, PartialEq)]
pub enum BufferOp {
    /// `%b = D.alloc : buffer<..>`: a new buffer, contents undefined.
    Alloc,
    /// `%b = D.global {value = [..]} : buffer<..>`: a read-only row-major
    /// buffer holding these elements (a constant tensor's data).
    Global(std::sync::Arc<[f64]>),
    /// `D.dealloc %b`: the buffer's storage is released.
    Dealloc,
    /// `%v = D.view %b : buffer<..>`: the same storage seen with another
    /// shape, strides or offset.
    View,
}

/// How an op's operands are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operands {
    /// Exactly this many values, comma-separated.
    Fixed(usize),
    /// Any number of values (a loop's initial values, a `yield`).
    Variadic,
    /// `before` values, then a buffer with its index `%b[..]` (loads and
    /// stores); with `mask`, an optional `mask %m` after it.
    Indexed {
        /// Values before the buffer.
        before: usize,
        /// Whether a `mask %m` may follow.
        mask: bool,
    },
    /// Two buffers, each with its index over the op's counters, the first
    /// `counters` arguments of its region, written `#k`:
    /// `%a[#0, #2], %b[#2, #1]` (`loop.matmul`).
    Product {
        /// How many region arguments are counters.
        counters: usize,
    },
    /// An index list `[..]` and no values (`tile.mask`).
    Limits,
}

/// Whether an op has a region, and how it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// No region.
    None,
    /// One region whose arguments are written `(%i, ..)` before it.
    WithArgs,
    /// One region without arguments (`tile.kernel { .. }`).
    Bare,
}

/// An op's syntax, derived from its declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Syntax {
    /// How operands are written.
    pub operands: Operands,
    /// Its region.
    pub region: Region,
    /// Whether it ends a block, and which end it is.
    pub terminator: Option<Terminator>,
}

impl Syntax {
    /// An op written with these operands, no region, at most one result.
    pub const fn of(operands: Operands) -> Syntax {
        Syntax {
            operands,
            region: Region::None,
            terminator: None,
        }
    }
}

/// An op kind's declaration: what the text forms and the generic passes read.
pub trait OpDecl: Clone + fmt::Debug + PartialEq {
    /// The op's full name (`loop.add`).
    fn name(&self) -> String;
    /// How it is written.
    fn syntax(&self) -> Syntax;
    /// The attributes the text forms print, in print order.
    fn attrs(&self) -> Vec<(String, Attr)>;
    /// The index lists written with its operands (one for a load or store,
    /// two for a product, the limits of a mask).
    fn indices(&self) -> Vec<&[Affine]>;
    /// Whether it is a view: its one result aliases its first operand.
    fn is_view(&self) -> bool;
}

/// An affine index into a buffer dimension or a limit:
/// `constant + sum(coeff * index value) + sum(coeff * #axis)`. In the tile
/// dialect `#k` is an element's coordinate along axis `k` of the tile being
/// loaded, stored or masked; the loop dialect has no `#` terms (its product's
/// counters are values of its region).
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Affine {
    /// Non-zero coefficients of index-typed values.
    pub terms: Vec<(i64, Value)>,
    /// Non-zero coefficients of tile coordinates.
    pub axes: Vec<(i64, usize)>,
    /// The constant term.
    pub constant: i64,
}

impl Affine {
    /// The constant `c`.
    pub fn constant(c: i64) -> Self {
        Affine {
            constant: c,
            ..Affine::default()
        }
    }

    /// The index value `v`.
    pub fn value(v: Value) -> Self {
        Affine {
            terms: vec![(1, v)],
            ..Affine::default()
        }
    }

    /// Tile coordinate `#axis`.
    pub fn axis(axis: usize) -> Self {
        Affine {
            axes: vec![(1, axis)],
            ..Affine::default()
        }
    }

    /// `sum(coeff * value) + constant`, like terms merged, zero ones dropped.
    pub fn of_terms(terms: &[(i64, Value)], constant: i64) -> Self {
        let mut e = Affine::constant(constant);
        for &(c, v) in terms {
            e = e.plus_scaled(c, &Affine::value(v));
        }
        e
    }

    /// `k * v + #axis`: coordinate `axis` of an element of block `v` of
    /// blocks `k` wide.
    pub fn block(v: Value, k: i64, axis: usize) -> Self {
        Affine::value(v)
            .scaled(k)
            .plus_scaled(1, &Affine::axis(axis))
    }

    /// `self + k * other`, with like terms merged and zero terms dropped.
    pub fn plus_scaled(&self, k: i64, other: &Affine) -> Affine {
        let mut out = self.clone();
        out.constant = out
            .constant
            .saturating_add(k.saturating_mul(other.constant));
        for &(c, v) in &other.terms {
            match out.terms.iter_mut().find(|t| t.1 == v) {
                Some(t) => t.0 = t.0.saturating_add(k.saturating_mul(c)),
                None => out.terms.push((k.saturating_mul(c), v)),
            }
        }
        for &(c, a) in &other.axes {
            match out.axes.iter_mut().find(|t| t.1 == a) {
                Some(t) => t.0 = t.0.saturating_add(k.saturating_mul(c)),
                None => out.axes.push((k.saturating_mul(c), a)),
            }
        }
        out.terms.retain(|t| t.0 != 0);
        out.axes.retain(|t| t.0 != 0);
        out
    }

    /// `k * self`.
    pub fn scaled(&self, k: i64) -> Affine {
        Affine::default().plus_scaled(k, self)
    }

    /// The coefficient of index value `v` (0 when the expression does not
    /// move with it).
    pub fn coefficient(&self, v: Value) -> i64 {
        self.terms.iter().filter(|t| t.1 == v).map(|t| t.0).sum()
    }

    /// Whether the expression is a constant (no index value, no tile
    /// coordinate).
    pub fn is_constant(&self) -> bool {
        self.terms.is_empty() && self.axes.is_empty()
    }

    /// Whether two accesses indexed `a` and `b` name different places along
    /// some dimension where both are constants (two slots of a buffer).
    pub fn constants_differ(a: &[Affine], b: &[Affine]) -> bool {
        a.iter()
            .zip(b)
            .any(|(x, y)| x.is_constant() && y.is_constant() && x.constant != y.constant)
    }

    /// The text: `%a + 2*%b - #1 + 3`, with `var` naming values and `axis`
    /// tile coordinates; in MLIR's syntax the coefficient follows (`s1 * 2`).
    pub fn text(
        &self,
        var: impl Fn(Value) -> String,
        axis: impl Fn(usize) -> String,
        mlir: bool,
    ) -> String {
        let mut parts: Vec<(i64, String)> = self.terms.iter().map(|&(c, v)| (c, var(v))).collect();
        parts.extend(self.axes.iter().map(|&(c, k)| (c, axis(k))));
        crate::affine_text(&parts, self.constant, mlir)
    }
}

/// An op: its kind, operands, results and nested blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct OpData<D: Dialect> {
    /// What it does.
    pub kind: D::Op,
    /// Values it reads.
    pub operands: Vec<Value>,
    /// Values it defines.
    pub results: Vec<Value>,
    /// Nested blocks (loop and kernel bodies).
    pub regions: Vec<Block>,
    /// The source place of the graph op it was lowered from, when known:
    /// what a run-time failure of the op (a division by zero, an allocation)
    /// names. Not part of the text form.
    pub loc: Option<crate::SourceLoc>,
}

/// A list of ops, with arguments (a loop's counter and carried values).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Block {
    /// Values the block defines on entry.
    pub args: Vec<Value>,
    /// Its ops, in order.
    pub ops: Vec<OpId>,
}

/// A function over buffers: inputs, then the outputs it writes in place
/// (destination passing: what the C ABI entry point takes).
#[derive(Debug, Clone, PartialEq)]
pub struct Function<D: Dialect> {
    /// Symbol name.
    pub name: String,
    /// Parameter names and values.
    pub params: Vec<(String, Value)>,
    /// How many of the parameters, at the end, are results the function
    /// writes (printed with `out`); the others are inputs it only reads.
    pub outputs: usize,
    /// The inputs (indices into `params`) that are weights: bound once and
    /// read by many calls (printed `weight %name`).
    pub weights: BTreeSet<usize>,
    /// The function that computes this one's prepared inputs from its
    /// weights, once, when they are bound (printed `prepare @name`): its
    /// results are, by name and in order, the last inputs of this function.
    /// Only tile IR has preparers (`tile.split-prepare`); the loop dialect's
    /// verifier refuses one.
    pub prepare: Option<String>,
    /// The body.
    pub body: Block,
    /// Type of each value, indexed by [`Value`].
    pub values: Vec<D::Type>,
    /// Every op, indexed by [`OpId`].
    pub ops: Vec<OpData<D>>,
}

impl<D: Dialect> Default for Function<D> {
    fn default() -> Self {
        Function {
            name: String::new(),
            params: Vec::new(),
            outputs: 0,
            weights: BTreeSet::new(),
            prepare: None,
            body: Block::default(),
            values: Vec::new(),
            ops: Vec::new(),
        }
    }
}

impl<D: Dialect> Function<D> {
    /// An empty function.
    pub fn new(name: impl Into<String>) -> Self {
        Function {
            name: name.into(),
            ..Function::default()
        }
    }

    /// A new value of type `ty`.
    pub fn new_value(&mut self, ty: D::Type) -> Value {
        self.values.push(ty);
        Value(self.values.len() as u32 - 1)
    }

    /// The parameters that are inputs (all but the trailing `outputs`).
    pub fn inputs(&self) -> &[(String, Value)] {
        &self.params[..self.params.len().saturating_sub(self.outputs)]
    }

    /// The parameters that are results.
    pub fn results(&self) -> &[(String, Value)] {
        &self.params[self.params.len().saturating_sub(self.outputs)..]
    }

    /// Appends a buffer parameter.
    pub fn add_param(&mut self, name: impl Into<String>, ty: D::Buffer) -> Value {
        let v = self.new_value(D::buffer_type(ty));
        self.params.push((name.into(), v));
        v
    }

    /// Creates an op (in no block yet) with results of the given types.
    pub fn create_op(
        &mut self,
        kind: D::Op,
        operands: Vec<Value>,
        results: &[D::Type],
        regions: Vec<Block>,
    ) -> OpId {
        let results = results.iter().map(|t| self.new_value(t.clone())).collect();
        self.ops.push(OpData {
            kind,
            operands,
            results,
            regions,
            loc: None,
        });
        OpId(self.ops.len() as u32 - 1)
    }

    /// The type of a value.
    ///
    /// # Panics
    /// If `v` is not a value of this function; the verifier rules this out.
    pub fn ty(&self, v: Value) -> &D::Type {
        &self.values[v.0 as usize]
    }

    /// An op's data.
    ///
    /// # Panics
    /// If `op` is not an op of this function; the verifier rules this out.
    pub fn op(&self, op: OpId) -> &OpData<D> {
        &self.ops[op.0 as usize]
    }

    /// The buffer `v` is a view of (through any number of views), or `v`
    /// itself.
    pub fn root_buffer(&self, mut v: Value) -> Value {
        while let Some(view) = self
            .ops
            .iter()
            .find(|op| op.kind.is_view() && op.results.first() == Some(&v))
        {
            v = view.operands[0];
        }
        v
    }
}

/// A list of functions.
#[derive(Debug, Clone, PartialEq)]
pub struct Module<D: Dialect> {
    /// The functions, in print order.
    pub functions: Vec<Function<D>>,
}

impl<D: Dialect> Default for Module<D> {
    fn default() -> Self {
        Module {
            functions: Vec::new(),
        }
    }
}

impl<D: verify::VerifyDialect> crate::Verify for Module<D> {
    fn verify(&self) -> Result<(), Vec<crate::VerifyError>> {
        let errors = verify::verify_module(self);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

impl<D: Dialect> fmt::Display for Module<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print::print_module(self))
    }
}
