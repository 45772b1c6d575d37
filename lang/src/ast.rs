//! The abstract syntax tree. Every node keeps its byte span for diagnostics.

/// A half-open byte range in the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Span {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

impl Span {
    /// A span from its ends.
    pub fn new(start: usize, end: usize) -> Self {
        Span { start, end }
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// A name and where it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Ident {
    /// The name.
    pub name: String,
    /// Where.
    pub span: Span,
}

/// A whole source file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Program {
    /// Functions and operators, in source order.
    pub items: Vec<Item>,
}

/// A top-level definition.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// `fn`
    Fn(FnDef),
    /// `op`
    Op(OpDef),
}

/// A dimension in a type: an integer, a dimension parameter, or arithmetic.
#[derive(Debug, Clone, PartialEq)]
pub enum DimExpr {
    /// `128`
    Int(i64, Span),
    /// `M`
    Name(Ident),
    /// `M + 1`, `2 * N`, `M - 1`
    Binary(DimOp, Box<DimExpr>, Box<DimExpr>, Span),
}

/// Arithmetic on dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DimOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
}

impl DimExpr {
    /// Where the dimension was written.
    pub fn span(&self) -> Span {
        match self {
            DimExpr::Int(_, s) | DimExpr::Binary(_, _, _, s) => *s,
            DimExpr::Name(i) => i.span,
        }
    }
}

/// `f32[M, 1024]`, or a bare `f32` for a scalar.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeExpr {
    /// The element type's name.
    pub dtype: Ident,
    /// The dimensions; empty for a scalar.
    pub dims: Vec<DimExpr>,
    /// Where.
    pub span: Span,
}

/// `name: type`.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// A word before the name (`weight`: the parameter is a weight, bound
    /// once and read by many calls); the elaborator checks it.
    pub modifier: Option<Ident>,
    /// The parameter's name.
    pub name: Ident,
    /// Its type.
    pub ty: TypeExpr,
}

/// `fn name[DIMS](params) -> ret { body }`.
#[derive(Debug, Clone, PartialEq)]
pub struct FnDef {
    /// Function name.
    pub name: Ident,
    /// Dimension parameters; empty for a concrete function.
    pub dims: Vec<Ident>,
    /// Parameters.
    pub params: Vec<Param>,
    /// Result types.
    pub ret: Vec<TypeExpr>,
    /// Whether the result was written as a tuple.
    pub ret_tuple: bool,
    /// Statements.
    pub body: Vec<Stmt>,
    /// The whole definition.
    pub span: Span,
}

/// A statement of a function body.
#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    /// `let x = e;` or `let (a, b) = e;`
    Let {
        /// Bound names.
        names: Vec<Ident>,
        /// Whether the names were written as a tuple.
        tuple: bool,
        /// The value.
        value: Expr,
        /// The statement.
        span: Span,
    },
    /// `return e;`
    Return {
        /// The value.
        value: Expr,
        /// The statement.
        span: Span,
    },
}

/// `op name[DIMS](params) -> ret { lets; out[...] = ...; }`.
#[derive(Debug, Clone, PartialEq)]
pub struct OpDef {
    /// Operator name.
    pub name: Ident,
    /// Dimension parameters.
    pub dims: Vec<Ident>,
    /// Operands.
    pub params: Vec<Param>,
    /// Result type.
    pub ret: TypeExpr,
    /// Element definitions in order; the last must be `out`.
    pub defs: Vec<ElemDef>,
    /// The whole definition.
    pub span: Span,
}

/// `let e[i, j] = expr;` (local) or `out[i, j] = expr;`.
#[derive(Debug, Clone, PartialEq)]
pub struct ElemDef {
    /// Whether this was written with `let`.
    pub is_let: bool,
    /// Defined name (`out` for the output).
    pub name: Ident,
    /// Index names.
    pub indices: Vec<Ident>,
    /// The element's value.
    pub value: Expr,
    /// The statement.
    pub span: Span,
}

/// Binary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `@`
    MatMul,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
    /// `!=`
    Ne,
}

impl BinOp {
    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::MatMul => "@",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
        }
    }
}

/// A call argument, positional or `name=value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Arg {
    /// The keyword, if any.
    pub name: Option<Ident>,
    /// The value.
    pub value: Expr,
}

/// An item in brackets: an expression, or `k in lo..hi` (reductions only).
#[derive(Debug, Clone, PartialEq)]
pub enum BracketItem {
    /// An expression.
    Expr(Expr),
    /// `k in lo..hi`.
    Range(Ident, Expr, Expr),
}

/// An expression, with its span and nesting depth.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    /// What it is.
    pub kind: ExprKind,
    /// Where.
    pub span: Span,
    /// Nesting depth (a leaf is 1); bounded by the parser.
    pub depth: u32,
}

/// The kinds of expression.
#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    /// `2`
    Int(i64),
    /// `0.5`
    Float(f64),
    /// `true`
    Bool(bool),
    /// A name.
    Var(String),
    /// `-e`
    Neg(Box<Expr>),
    /// `a op b`
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `f(args)`
    Call(Ident, Vec<Arg>),
    /// `x[items]` (index notation), or `sum[items](body)` (a reduction)
    Bracket(Ident, Vec<BracketItem>, Option<Box<Expr>>),
    /// `[a, b]`
    List(Vec<Expr>),
    /// `(a, b)`
    Tuple(Vec<Expr>),
}

/// Deepest expression nesting the parser accepts; deeper input is an error,
/// never a stack overflow.
pub const MAX_DEPTH: u32 = 200;

impl Expr {
    /// An expression node; fails when it would nest deeper than [`MAX_DEPTH`].
    pub fn new(kind: ExprKind, span: Span, children: &[u32]) -> Result<Expr, Span> {
        let depth = 1 + children.iter().copied().max().unwrap_or(0);
        if depth > MAX_DEPTH {
            return Err(span);
        }
        Ok(Expr { kind, span, depth })
    }
}
