//! The loop dialect's operations, each declared once: its name
//! ([`OpKind::name`]), its attributes ([`OpKind::attrs`], rebuilt by
//! [`OpKind::from_parts`]), how its operands and region are written
//! ([`OpKind::syntax`]), the types of its region's arguments
//! ([`OpKind::region_args`]) and its typing rule ([`OpKind::check`]). The
//! text printer, the text parser, the MLIR generic printer and the verifier
//! derive from these; no op has a printer or parser of its own. Every op is written in one generic shape,
//!
//! ```text
//! %r = loop.NAME operands {attrs} (%region_args) { region } : result types
//! ```
//!
//! where a load's or store's buffer carries its index (`%b[%i, 2*%j + 1]`)
//! and a `loop.matmul`'s two operands carry theirs over the op's own
//! counters, `#0` (row), `#1` (column) and `#2` (depth).
//!
//! # The structured product
//!
//! The lowering emits every product of matrices (a matmul, a batched matmul, a
//! convolution over an im2col buffer) as one structured op rather than a loop nest that
//! a later pass must recognise:
//!
//! ```text
//! loop.func @dense(%x: buffer<f32[64, 32]>, %w: buffer<f32[32, 48]>, %b: buffer<f32[48]>, out %out0: buffer<f32[64, 48]>) {
//!   loop.matmul %x[#0, #2], %w[#2, #1] {sizes = [64, 48, 32]} (%0, %1, %2, %3) {
//!     %4 = loop.load %b[%1] : f32
//!     %5 = loop.add %3, %4 : f32
//!     %6 = loop.relu %5 : f32
//!     loop.store %6, %out0[%0, %1]
//!   }
//!   loop.return
//! }
//! ```
//!
//! `%acc` is the sum over `k` of the two affine-indexed operands in the operands'
//! accumulator type (f32 for f16/bf16; any strides: a transposed operand is read in
//! place). The verifier holds it to a matrix product: `i` never indexes the right
//! operand, `j` never the left one, `k` only the operands. The region, run per `(i, j)`,
//! is the epilogue (bias, activation, scaling, the store), kept as loop ops. The loop
//! interpreter runs it as the triple loop it means; `convert-loop-to-tile` makes it the
//! `packed` or `dot` schedule (`compiler/lower`'s `loop_to_tile`).

pub use dlc_core::attr::Attr;
use dlc_core::attr::AttrReader;
pub use dlc_core::scalar::{BinaryOp, CmpOp, UnaryOp};
use dlc_core::{DType, Window};

use crate::ir::{IndexExpr, Type};

/// The sizes and indices of a `loop.matmul` (boxed in [`OpKind`], which
/// they would otherwise make larger for every op).
#[derive(Debug, Clone, PartialEq)]
pub struct Contraction {
    /// Rows.
    pub m: i64,
    /// Columns.
    pub n: i64,
    /// Reduction length.
    pub k: i64,
    /// Index into the left operand.
    pub a: Vec<IndexExpr>,
    /// Index into the right operand.
    pub b: Vec<IndexExpr>,
}

/// What an op does. Operands, results and regions are in
/// [`crate::OpData`].
#[derive(Debug, Clone, PartialEq)]
pub enum OpKind {
    /// `%b = loop.alloc : buffer<..>`: a new buffer, contents undefined.
    Alloc,
    /// `%b = loop.global {value = [..]} : buffer<..>`: a read-only buffer
    /// holding these elements (row-major, rounded to the element type): a
    /// constant tensor's data, kept for the program's whole life.
    Global(std::sync::Arc<[f64]>),
    /// `loop.dealloc %b`: the buffer's storage is released.
    Dealloc,
    /// `%v = loop.view %b : buffer<..>`: the same storage seen with another
    /// shape and strides (a reshape of a contiguous buffer, a transpose). The
    /// view must stay within the storage; it aliases `%b`.
    View,
    /// `%c = loop.const {value = 0.5} : f32`.
    Const(f64),
    /// Element-wise function of one scalar (`%r = loop.exp %x : f32`).
    Unary(UnaryOp),
    /// Element-wise function of two scalars of one type.
    Binary(BinaryOp),
    /// Comparison of two scalars of one type, giving bool.
    Compare(CmpOp),
    /// `%r = loop.select %c, %a, %b : f32`.
    Select,
    /// `%r = loop.cast %x : i32`: scalar type conversion; `: index` makes an
    /// integer scalar an index that loads and stores may use (a gather's
    /// data-dependent row).
    Cast,
    /// `%v = loop.load %b[idx, ..] {pad = P} : f32`: an element; out of
    /// bounds is an error, or `pad` when given (how zero padding is
    /// written).
    Load {
        /// One affine index per dimension.
        index: Vec<IndexExpr>,
        /// The value read outside the bounds.
        pad: Option<f64>,
    },
    /// `loop.store %v, %b[idx, ..]`.
    Store {
        /// One affine index per dimension.
        index: Vec<IndexExpr>,
    },
    /// `%r = loop.for %init.. {lo = 0, hi = 8, step = 1} (%i, %c..) { .. }
    /// : types`: a sequential loop carrying values from one iteration to
    /// the next (its region ends with `loop.yield`); its results are the
    /// last iteration's values.
    For {
        /// First index.
        lo: i64,
        /// One past the last index.
        hi: i64,
        /// Positive step.
        step: i64,
    },
    /// `loop.parallel {lo = 0, hi = 4} (%i) { .. }`: a loop whose iterations
    /// are independent and may run in any order or at once (over threads,
    /// SIMD lanes or GPU blocks).
    Parallel {
        /// First index.
        lo: i64,
        /// One past the last index.
        hi: i64,
    },
    /// Ends a `loop.for` body: the next iteration's values.
    Yield,
    /// `loop.matmul %a[#0, #2], %b[#2, #1] {sizes = [M, N, K]} (%i, %j, %k,
    /// %acc) { epilogue }`: for every `i < M`, `j < N`, `%acc` is the sum
    /// over `k < K` of `a[..] * b[..]` in the accumulator type of the
    /// operands' element type (the indices affine in the counters `#0` = i,
    /// `#1` = j, `#2` = k and in indices defined outside), and the region,
    /// run once per `(i, j)` after the sum, does what follows with it (an
    /// epilogue ending in stores): the structured contraction that
    /// `convert-loop-to-tile` turns into `tile.dot` programs (on a CPU,
    /// packed operands and a register-tiled micro-kernel).
    Matmul(Box<Contraction>),
    /// `loop.kernel_begin {group = "attention"}`: the top-level ops up to
    /// the next `loop.kernel_end` are one kernel group of the lowering's
    /// kernel plan (`dlc_graph::fusion::kernel_groups`), which
    /// `convert-loop-to-tile` runs as one kernel where the target's
    /// schedules allow (and as its nests, one by one, otherwise). The pair
    /// computes nothing; it delimits rather than encloses, so the values
    /// the group defines stay visible after it (buffers outlive kernels).
    KernelBegin(KernelGroup),
    /// `loop.kernel_end`: closes the group its `loop.kernel_begin` opened.
    KernelEnd,
    /// Ends a function.
    Return,
}

/// What a kernel group of the loop IR runs as (see
/// [`OpKind::KernelBegin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelGroup {
    /// A product, a row softmax of its result, and a product of that:
    /// one kernel over blocks of rows, the scores never stored.
    Attention,
    /// A convolution as an im2col copy and a product: the copy nest
    /// `col[n, (c * KH + ky) * KW + kx, y * OX + x] = input[n, c, iy, ix]`
    /// (loops `c, n, ky, kx, y, x`; `iy`, `ix` where the window reads, zero
    /// outside the input), then, in a loop over `n`, a product whose right
    /// operand is `col[n, #2, #1]`. The product's programs may copy their
    /// panels from the input through the window instead, the copy never
    /// made.
    Im2col(Window),
    /// A convolution as Winograd's F(4x4, 3x3): the input transform, the
    /// products and the output transform in one kernel over blocks of
    /// tile rows, the transformed values never stored.
    Winograd,
}

impl KernelGroup {
    /// Every group's name.
    pub const NAMES: [&'static str; 3] = ["attention", "im2col", "winograd"];

    /// The name the text form writes.
    pub fn name(self) -> &'static str {
        match self {
            KernelGroup::Attention => "attention",
            KernelGroup::Im2col(_) => "im2col",
            KernelGroup::Winograd => "winograd",
        }
    }

    /// The attributes the text form writes: the name, then the group's
    /// parameters.
    pub fn attrs(self) -> Vec<(String, Attr)> {
        let mut attrs = vec![("group".to_string(), Attr::Str(self.name().to_string()))];
        if let KernelGroup::Im2col(w) = self {
            attrs.extend(w.attrs());
        }
        attrs
    }

    /// Reads a group from its op's attributes.
    pub fn read(a: &mut AttrReader<'_>) -> Result<KernelGroup, String> {
        let group = a.string("group")?;
        let op = a.op();
        Ok(match group.as_str() {
            "attention" => KernelGroup::Attention,
            "im2col" => KernelGroup::Im2col(Window::read(a)?),
            "winograd" => KernelGroup::Winograd,
            _ => {
                return Err(format!(
                    "`{op}`: unknown group `{group}`; groups: {}",
                    Self::NAMES.join(", ")
                ));
            }
        })
    }
}

pub use dlc_core::ir::{Operands, Region, Syntax, Terminator};

const fn syntax(operands: Operands) -> Syntax {
    Syntax::of(operands)
}

/// The counters of a `loop.matmul`, as its indices write them: `#0`, `#1`,
/// `#2` are its region's first three arguments.
pub const MATMUL_COUNTERS: usize = 3;

impl OpKind {
    /// Rebuilds an op from its name, attributes and index lists (the
    /// parser's half of the declaration).
    pub fn from_parts(
        name: &str,
        attrs: &[(String, Attr)],
        mut indices: Vec<Vec<IndexExpr>>,
    ) -> Result<OpKind, String> {
        let suffix = name
            .strip_prefix("loop.")
            .ok_or_else(|| format!("`{name}` is not a loop dialect op"))?;
        let mut a = AttrReader::new(name, attrs);
        let mut index = || {
            if indices.is_empty() {
                Err(format!("`{name}` needs an index `%b[..]`"))
            } else {
                Ok(indices.remove(0))
            }
        };
        let op = if let Some(u) = UnaryOp::from_name(suffix) {
            OpKind::Unary(u)
        } else if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == suffix) {
            OpKind::Binary(b)
        } else if let Some(c) = CmpOp::ALL.into_iter().find(|c| c.name() == suffix) {
            OpKind::Compare(c)
        } else {
            match suffix {
                "alloc" => OpKind::Alloc,
                "global" => OpKind::Global(a.floats("value")?),
                "dealloc" => OpKind::Dealloc,
                "view" => OpKind::View,
                "const" => OpKind::Const(a.float("value")?),
                "select" => OpKind::Select,
                "cast" => OpKind::Cast,
                "load" => OpKind::Load {
                    index: index()?,
                    pad: a.optional_float("pad")?,
                },
                "store" => OpKind::Store { index: index()? },
                "for" => OpKind::For {
                    lo: a.int("lo")?,
                    hi: a.int("hi")?,
                    step: a.int("step")?,
                },
                "parallel" => OpKind::Parallel {
                    lo: a.int("lo")?,
                    hi: a.int("hi")?,
                },
                "yield" => OpKind::Yield,
                "return" => OpKind::Return,
                "kernel_begin" => OpKind::KernelBegin(KernelGroup::read(&mut a)?),
                "kernel_end" => OpKind::KernelEnd,
                "matmul" => {
                    let [m, n, k] = a.ints("sizes")?[..] else {
                        return Err(format!("`{name}`: `sizes` must be [rows, columns, depth]"));
                    };
                    let (lhs, rhs) = (index()?, index()?);
                    OpKind::Matmul(Box::new(Contraction {
                        m,
                        n,
                        k,
                        a: lhs,
                        b: rhs,
                    }))
                }
                _ => return Err(format!("unknown op `{name}`")),
            }
        };
        a.finish()?;
        Ok(op)
    }

    /// The op's typing rule: whether operands, results and region
    /// arguments of these types (`None`: a value the function does not
    /// have) fit it. Scoping, indices and what nested blocks hold are the
    /// verifier's.
    pub fn check(
        &self,
        ops: &[Option<&Type>],
        res: &[Option<&Type>],
        args: &[Option<&Type>],
    ) -> Result<(), String> {
        let shape = |n_ops: usize, n_res: usize| ops.len() == n_ops && res.len() == n_res;
        let first = |v: &[Option<&'_ Type>]| v.first().copied().flatten().cloned();
        let rule = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_string()) };
        let scalar = |t: Option<&Type>| match t {
            Some(Type::Scalar(d)) => Some(*d),
            _ => None,
        };
        match self {
            OpKind::Alloc => match (shape(0, 1), first(res)) {
                (true, Some(Type::Buffer(b))) if b.offset != 0 => Err(format!(
                    "gives a buffer of its own, with no offset, not {b}"
                )),
                (true, Some(Type::Buffer(_))) => Ok(()),
                _ => Err("takes no operand and gives one buffer".into()),
            },
            OpKind::Global(v) => match (shape(0, 1), first(res)) {
                (true, Some(Type::Buffer(b))) => {
                    if !b.is_contiguous() {
                        Err(format!("gives a row-major buffer, not {b}"))
                    } else if b.storage_len() != Some(v.len()) {
                        Err(format!("holds {} values for a buffer of {b}", v.len()))
                    } else {
                        Ok(())
                    }
                }
                _ => Err("takes no operand and gives one buffer".into()),
            },
            OpKind::Dealloc => rule(
                shape(1, 0) && matches!(ops[0], Some(Type::Buffer(_))),
                "takes one buffer",
            ),
            OpKind::View => match (shape(1, 1), first(ops), first(res)) {
                (true, Some(Type::Buffer(src)), Some(Type::Buffer(view))) => {
                    if src.dtype != view.dtype {
                        Err("keeps the element type".into())
                    } else if !view.lies_within(&src) {
                        Err(format!("{view} reaches outside {src}"))
                    } else {
                        Ok(())
                    }
                }
                _ => Err("views one buffer as another buffer type".into()),
            },
            OpKind::Const(_) => rule(
                shape(0, 1) && matches!(res[0], Some(Type::Scalar(_))),
                "gives one scalar",
            ),
            OpKind::Unary(u) => match (shape(1, 1), first(ops), first(res)) {
                (true, Some(Type::Scalar(a)), Some(Type::Scalar(r))) if a == r => rule(
                    a.is_numeric() && (a.is_float() || u.accepts_int()),
                    &format!("is not defined on {a}"),
                ),
                _ => Err("takes one scalar and gives one of the same type".into()),
            },
            OpKind::Binary(b) => match (shape(2, 1), scalar(ops.first().copied().flatten())) {
                (true, Some(d)) if ops[1] == ops[0] && res[0] == ops[0] => {
                    rule(b.accepts(d), &format!("is not defined on {d}"))
                }
                _ => Err("takes two scalars of one type and gives one of that type".into()),
            },
            OpKind::Compare(_) => rule(
                shape(2, 1)
                    && ops[0] == ops[1]
                    && matches!(ops[0], Some(Type::Scalar(_)))
                    && res[0] == Some(&Type::Scalar(DType::Bool)),
                "takes two scalars of one type and gives bool",
            ),
            OpKind::Select => rule(
                shape(3, 1)
                    && ops[0] == Some(&Type::Scalar(DType::Bool))
                    && ops[1] == ops[2]
                    && res[0] == ops[1],
                "takes bool, then two scalars of one type, and gives that type",
            ),
            OpKind::Cast => rule(
                shape(1, 1)
                    && match (ops[0], res[0]) {
                        (Some(Type::Scalar(_)), Some(Type::Scalar(_))) => true,
                        (Some(Type::Scalar(d)), Some(Type::Index)) => d.is_int(),
                        _ => false,
                    },
                "converts one scalar, or an integer scalar to an index",
            ),
            OpKind::Load { .. } => match (shape(1, 1), first(ops)) {
                (true, Some(Type::Buffer(b))) => rule(
                    res[0] == Some(&Type::Scalar(b.dtype)),
                    &format!("must give a {} scalar", b.dtype),
                ),
                _ => Err("reads one element of one buffer".into()),
            },
            OpKind::Store { .. } => match (shape(2, 0), ops.get(1).copied().flatten()) {
                (true, Some(Type::Buffer(b))) => rule(
                    ops[0] == Some(&Type::Scalar(b.dtype)),
                    &format!("must store a {} scalar", b.dtype),
                ),
                _ => Err("writes one scalar into one buffer".into()),
            },
            OpKind::For { step, .. } => {
                if *step <= 0 {
                    Err("needs a positive step".into())
                } else {
                    rule(
                        args.first() == Some(&Some(&Type::Index))
                            && args[1..] == *ops
                            && res == ops,
                        "has one body whose arguments are the index and the carried values, \
                         whose types are the results'",
                    )
                }
            }
            OpKind::Parallel { .. } => rule(
                shape(0, 0) && args.len() == 1 && args[0] == Some(&Type::Index),
                "has one body whose only argument is the index, and no results",
            ),
            OpKind::Matmul(c) => {
                if c.m <= 0 || c.n <= 0 || c.k <= 0 {
                    return Err("needs positive sizes".into());
                }
                let fits = match (shape(2, 0), first(ops), ops.get(1).copied().flatten()) {
                    (true, Some(Type::Buffer(ta)), Some(Type::Buffer(tb))) => {
                        ta.dtype == tb.dtype
                            && ta.dtype.is_numeric()
                            && args.len() == MATMUL_COUNTERS + 1
                            && args[..MATMUL_COUNTERS]
                                .iter()
                                .all(|t| *t == Some(&Type::Index))
                            && args[MATMUL_COUNTERS] == Some(&Type::Scalar(ta.dtype.accumulator()))
                    }
                    _ => false,
                };
                rule(
                    fits,
                    "takes two buffers of one numeric element type and has one body with \
                     arguments (i, j, k: index, acc: the element type's accumulator type)",
                )
            }
            OpKind::KernelBegin(_) | OpKind::KernelEnd => {
                rule(shape(0, 0), "takes no operand and gives no result")
            }
            OpKind::Yield | OpKind::Return => Ok(()),
        }
    }

    /// The types of the region's arguments, given the operands' types: a
    /// loop's counter (and a `loop.for`'s carried values, typed as its
    /// initial values); a `loop.matmul`'s three counters and its
    /// accumulator, in the operands' accumulator type.
    pub fn region_args(&self, operands: &[&Type]) -> Vec<Type> {
        match self {
            OpKind::For { .. } => std::iter::once(Type::Index)
                .chain(operands.iter().map(|t| (*t).clone()))
                .collect(),
            OpKind::Parallel { .. } => vec![Type::Index],
            OpKind::Matmul(_) => {
                let acc = match operands.first() {
                    Some(Type::Buffer(b)) => Type::Scalar(b.dtype.accumulator()),
                    _ => Type::Scalar(DType::F32),
                };
                let mut args = vec![Type::Index; MATMUL_COUNTERS];
                args.push(acc);
                args
            }
            _ => vec![],
        }
    }
}

/// A kind with the given name and placeholder attributes and indices,
/// whose syntax is the real kind's (syntax never depends on attribute
/// values): what the parser reads the operands by.
pub fn probe(name: &str) -> Option<OpKind> {
    let suffix = name.strip_prefix("loop.")?;
    let attrs: Vec<(String, Attr)> = match suffix {
        "const" => vec![("value".into(), Attr::Float(0.0))],
        "global" => vec![("value".into(), Attr::Ints(vec![]))],
        "for" => vec![
            ("lo".into(), Attr::Int(0)),
            ("hi".into(), Attr::Int(0)),
            ("step".into(), Attr::Int(1)),
        ],
        "parallel" => vec![("lo".into(), Attr::Int(0)), ("hi".into(), Attr::Int(0))],
        "matmul" => vec![("sizes".into(), Attr::Ints(vec![0, 0, 0]))],
        "kernel_begin" => vec![("group".into(), Attr::Str("attention".into()))],
        _ => vec![],
    };
    OpKind::from_parts(name, &attrs, vec![vec![], vec![]]).ok()
}

impl dlc_core::ir::OpDecl for OpKind {
    /// The op's full name (`loop.add`).
    fn name(&self) -> String {
        let s: &str = match self {
            OpKind::Alloc => "alloc",
            OpKind::Global(_) => "global",
            OpKind::Dealloc => "dealloc",
            OpKind::View => "view",
            OpKind::Const(_) => "const",
            OpKind::Unary(u) => u.name(),
            OpKind::Binary(b) => b.name(),
            OpKind::Compare(c) => c.name(),
            OpKind::Select => "select",
            OpKind::Cast => "cast",
            OpKind::Load { .. } => "load",
            OpKind::Store { .. } => "store",
            OpKind::For { .. } => "for",
            OpKind::Parallel { .. } => "parallel",
            OpKind::Yield => "yield",
            OpKind::Return => "return",
            OpKind::Matmul(_) => "matmul",
            OpKind::KernelBegin(_) => "kernel_begin",
            OpKind::KernelEnd => "kernel_end",
        };
        format!("loop.{s}")
    }

    /// How the op is written.
    fn syntax(&self) -> Syntax {
        use Operands::*;
        match self {
            OpKind::Alloc
            | OpKind::Global(_)
            | OpKind::Const(_)
            | OpKind::KernelBegin(_)
            | OpKind::KernelEnd => syntax(Fixed(0)),
            OpKind::Dealloc | OpKind::View | OpKind::Unary(_) | OpKind::Cast => syntax(Fixed(1)),
            OpKind::Binary(_) | OpKind::Compare(_) => syntax(Fixed(2)),
            OpKind::Select => syntax(Fixed(3)),
            OpKind::Load { .. } => syntax(Indexed {
                before: 0,
                mask: false,
            }),
            OpKind::Store { .. } => syntax(Indexed {
                before: 1,
                mask: false,
            }),
            OpKind::For { .. } => Syntax {
                region: Region::WithArgs,
                ..syntax(Variadic)
            },
            OpKind::Parallel { .. } => Syntax {
                region: Region::WithArgs,
                ..syntax(Fixed(0))
            },
            OpKind::Matmul(_) => Syntax {
                region: Region::WithArgs,
                ..syntax(Product {
                    counters: MATMUL_COUNTERS,
                })
            },
            OpKind::Yield => Syntax {
                terminator: Some(Terminator::Yield),
                ..syntax(Variadic)
            },
            OpKind::Return => Syntax {
                terminator: Some(Terminator::Return),
                ..syntax(Fixed(0))
            },
        }
    }

    /// The index lists written with the operands: one for a load or store,
    /// the two operands' for a `loop.matmul`.
    fn indices(&self) -> Vec<&[IndexExpr]> {
        match self {
            OpKind::Load { index, .. } | OpKind::Store { index } => vec![index],
            OpKind::Matmul(c) => vec![&c.a, &c.b],
            _ => vec![],
        }
    }

    /// The attributes the text forms print, in print order.
    fn attrs(&self) -> Vec<(String, Attr)> {
        let one = |k: &str, a: Attr| vec![(k.to_string(), a)];
        match self {
            OpKind::Const(v) => one("value", Attr::Float(*v)),
            OpKind::Global(v) => one("value", Attr::Floats(v.clone())),
            OpKind::Load { pad: Some(p), .. } => one("pad", Attr::Float(*p)),
            OpKind::For { lo, hi, step } => vec![
                ("lo".to_string(), Attr::Int(*lo)),
                ("hi".to_string(), Attr::Int(*hi)),
                ("step".to_string(), Attr::Int(*step)),
            ],
            OpKind::Parallel { lo, hi } => vec![
                ("lo".to_string(), Attr::Int(*lo)),
                ("hi".to_string(), Attr::Int(*hi)),
            ],
            OpKind::Matmul(c) => one("sizes", Attr::Ints(vec![c.m, c.n, c.k])),
            OpKind::KernelBegin(g) => g.attrs(),
            _ => vec![],
        }
    }

    fn is_view(&self) -> bool {
        matches!(self, OpKind::View)
    }
}
