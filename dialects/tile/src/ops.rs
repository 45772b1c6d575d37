//! The tile dialect's operations, each declared once: its name
//! ([`OpKind::name`]), its attributes ([`OpKind::attrs`], rebuilt by
//! [`OpKind::from_parts`]), its operand and region syntax
//! ([`OpKind::syntax`]) and its typing rule ([`OpKind::check`]). The text
//! printer, the text parser, the MLIR generic printer and the verifier all
//! derive from these four; no op has a printer or parser of its own.

pub use dlc_core::attr::Attr;
use dlc_core::attr::AttrReader;
pub use dlc_core::scalar::{BinaryOp, CmpOp, ReduceKind, UnaryOp};
use dlc_core::{DType, format_float};

use crate::ir::{Affine, BufferType, Layout, Schedule, Type};

/// What an op does. Operands, results and regions are in
/// [`crate::OpData`].
#[derive(Debug, Clone, PartialEq)]
pub enum OpKind {
    /// `%b = tile.alloc : buffer<..>`: a new buffer in the result type's
    /// space; in the function body a global buffer, in a kernel one per
    /// program (scratch) or per program's thread block (shared). Contents
    /// are undefined until stored.
    Alloc,
    /// `%b = tile.global {value = [..]} : buffer<..>`: a read-only global
    /// buffer holding these elements (row-major): a constant tensor's data.
    Global(std::sync::Arc<[f64]>),
    /// `%b = tile.prepared {func = "f_prepare", index = 0} : buffer<..>`:
    /// result `index` of function `func`, a preparer of constants (it takes
    /// no inputs), computed once and read by every call after: on a CPU,
    /// the first call runs `func` into memory the process keeps
    /// (`tile.bind-constants` makes these ops).
    Prepared {
        /// The preparer.
        func: String,
        /// Which of its results.
        index: usize,
    },
    /// `tile.dealloc %b`: a global buffer's storage is released.
    Dealloc,
    /// `%v = tile.view %b : buffer<..>`: the same storage with another shape
    /// and strides (a reshape, a transpose, a packed layout's panel).
    View,
    /// `tile.kernel {grid = [..], ..} { body }`: runs the body once per grid
    /// point (a program); programs are independent of one another.
    Kernel {
        /// Programs along each grid axis (one to three axes).
        grid: Vec<usize>,
        /// How the conversion scheduled the loop nest this kernel runs.
        schedule: Schedule,
    },
    /// Ends a function.
    Return,
    /// `%p = tile.program_id {axis = 0} : index`: this program's coordinate
    /// along a grid axis.
    ProgramId {
        /// The grid axis.
        axis: usize,
    },
    /// `%c = tile.const {value = 0.0} : tile<..>`: a scalar, or a tile with
    /// every element equal.
    Const(f64),
    /// `%t = tile.splat %s : tile<..>`: a tile with every element `%s`.
    Splat,
    /// Element-wise function of one scalar or tile.
    Unary(UnaryOp),
    /// Element-wise function of two scalars or tiles of one type.
    Binary(BinaryOp),
    /// Element-wise comparison, giving bool.
    Compare(CmpOp),
    /// `tile.select %c, %a, %b`: element-wise choice.
    Select,
    /// Element type conversion.
    Cast,
    /// `%t = tile.load %b[idx, ..] mask %m {pad = P} : tile<..>`: element
    /// `e` of the result is `b[idx(e)]`, where `#k` in an index is `e`'s
    /// coordinate along axis `k` (an index without `#k` broadcasts along
    /// axis `k`). Elements the mask turns off read `pad` (zero, or false,
    /// without one: a mask only says which lanes a tile's edge leaves
    /// out); elements outside the buffer read `pad`, and without one are
    /// errors. So a load without a pad needs no bounds test per lane, and
    /// a masked one reads only the lanes that are on.
    Load {
        /// One affine index per buffer dimension.
        index: Vec<Affine>,
        /// The value read outside the buffer and where the mask is off
        /// (zero there without one).
        pad: Option<f64>,
    },
    /// `tile.store %v, %b[idx, ..] mask %m`: writes every element the mask
    /// leaves on (all without a mask) to `b[idx(e)]`; out of bounds is an
    /// error, and two elements must not write one place.
    Store {
        /// One affine index per buffer dimension.
        index: Vec<Affine>,
    },
    /// `tile.prefetch %b[idx, ..] {shape = [..], level = 2}`: a hint that
    /// the elements a load of a tile of that shape at that index would read
    /// are read soon: on a CPU each row's 64-byte lines are fetched into
    /// that level of cache (the first where `level` is left out). It reads
    /// and writes nothing: elements outside the buffer are no error (the
    /// address is only a hint, never dereferenced), the interpreters and
    /// GPU targets skip it.
    Prefetch {
        /// One affine index per buffer dimension.
        index: Vec<Affine>,
        /// The tile's shape.
        shape: Vec<usize>,
        /// The level of cache the lines go to: 1 (the nearest) to 3.
        level: usize,
    },
    /// `%m = tile.mask [l0, l1, ..] : tile<..xbool>`: element `e` is on when
    /// `e_k < l_k` along every axis: the ragged edge of a loop nest.
    Mask {
        /// One limit per axis (no `#` terms).
        limits: Vec<Affine>,
    },
    /// `%r = tile.broadcast %t : tile<..>`: axes of extent 1 repeated to
    /// the result's extent.
    Broadcast,
    /// `%r = tile.reshape %t : tile<..>`: the same elements, row-major, in
    /// another shape.
    Reshape,
    /// `%r = tile.trans %t {perm = [1, 0]}`: result axis `i` is operand
    /// axis `perm[i]`.
    Trans {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// `%r = tile.slice %t[0, %i + 2] : tile<..>`: the part of the operand
    /// the result's shape cuts out from the offsets on: result element `e`
    /// is operand element `e + offsets` (affine in index values, no `#k`;
    /// an offset whose cut reaches past the operand is an error). The taps
    /// of a window along a row are slices of one wider load of the row
    /// (`tile.share-window-loads`).
    Slice {
        /// Where the result starts along each axis.
        offsets: Vec<Affine>,
    },
    /// `%r = tile.expand_dims %t {axis = 0}`: a new axis of extent 1.
    ExpandDims {
        /// Where the new axis goes.
        axis: usize,
    },
    /// `%r = tile.dot %a, %b, %acc`: `acc + a @ b` for `a: MxK`, `b: KxN`,
    /// `acc: MxN` in the operands' accumulator type (f32 for f16/bf16).
    /// `{mma = [m, n, k]}`: on a GPU, in tensor-core steps of that shape
    /// (`mma.sync`; f32 operands then as TF32), which `tile.tensor-cores`
    /// chooses from the target; a CPU computes it as without.
    Dot {
        /// The tensor-core instruction's shape, when it runs on them.
        mma: Option<[usize; 3]>,
    },
    /// `%r = tile.convert_layout %t : tile<.., #mma<2, 4>>`: the same elements in
    /// another layout (on a GPU, moved between threads through shared
    /// memory).
    ConvertLayout,
    /// `%r = tile.reduce %t {kind = sum, axis = 1}`: combines the elements
    /// along one axis (a 1-axis tile reduces to a scalar).
    Reduce {
        /// How elements combine.
        kind: ReduceKind,
        /// The reduced axis.
        axis: usize,
    },
    /// `%r:n = tile.for %init.. {lo, hi, step} (%i, %c..) { .. }`: a counted
    /// loop in one program, carrying values from one iteration to the next.
    For {
        /// First counter value.
        lo: i64,
        /// One past the last.
        hi: i64,
        /// Positive step.
        step: i64,
    },
    /// Ends a `tile.for` body: the next iteration's carried values.
    Yield,
    /// `tile.barrier`: every thread running the program arrives before any
    /// goes on, so shared memory written before is visible after.
    Barrier,
}

use dlc_core::ir::OpDecl;
pub use dlc_core::ir::{Operands, Region, Syntax, Terminator};

/// Where an op may appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// In a function body, outside kernels.
    Host,
    /// In a kernel (in its body or a loop inside it).
    Program,
    /// Either.
    Anywhere,
}

impl OpKind {
    /// Where the op may stand: host code, a kernel's program, or either.
    pub fn place(&self) -> Place {
        match self {
            OpKind::Alloc | OpKind::View => Place::Anywhere,
            OpKind::Global(_)
            | OpKind::Prepared { .. }
            | OpKind::Dealloc
            | OpKind::Kernel { .. }
            | OpKind::Return => Place::Host,
            _ => Place::Program,
        }
    }

    /// The index list written after the buffer (loads, stores) or as the
    /// operand list (`tile.mask`).
    pub fn index(&self) -> Option<&[Affine]> {
        match self {
            OpKind::Load { index, .. }
            | OpKind::Store { index }
            | OpKind::Prefetch { index, .. }
            | OpKind::Slice { offsets: index } => Some(index),
            OpKind::Mask { limits } => Some(limits),
            _ => None,
        }
    }

    /// The index list, to rewrite it (see [`OpKind::index`]).
    pub fn index_mut(&mut self) -> Option<&mut Vec<Affine>> {
        match self {
            OpKind::Load { index, .. }
            | OpKind::Store { index }
            | OpKind::Prefetch { index, .. }
            | OpKind::Slice { offsets: index } => Some(index),
            OpKind::Mask { limits } => Some(limits),
            _ => None,
        }
    }

    /// Rebuilds an op from its name, attributes and index list (the
    /// parser's half of the declaration).
    pub fn from_parts(
        name: &str,
        attrs: &[(String, Attr)],
        index: Option<Vec<Affine>>,
    ) -> Result<OpKind, String> {
        let suffix = name
            .strip_prefix("tile.")
            .ok_or_else(|| format!("`{name}` is not a tile dialect op"))?;
        let mut a = AttrReader::new(name, attrs);
        let index = |what: &str| {
            index
                .clone()
                .ok_or_else(|| format!("`{name}` needs {what}"))
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
                "prepared" => OpKind::Prepared {
                    func: a.string("func")?,
                    index: a.usize("index")?,
                },
                "dealloc" => OpKind::Dealloc,
                "view" => OpKind::View,
                "kernel" => {
                    let grid = a.usizes("grid")?;
                    let schedule = Schedule::read(&mut a).map_err(|e| format!("`{name}`: {e}"))?;
                    OpKind::Kernel { grid, schedule }
                }
                "return" => OpKind::Return,
                "program_id" => OpKind::ProgramId {
                    axis: a.usize("axis")?,
                },
                "const" => OpKind::Const(a.float("value")?),
                "splat" => OpKind::Splat,
                "select" => OpKind::Select,
                "cast" => OpKind::Cast,
                "load" => OpKind::Load {
                    index: index("an index `%b[..]`")?,
                    pad: a.optional_float("pad")?,
                },
                "store" => OpKind::Store {
                    index: index("an index `%b[..]`")?,
                },
                "prefetch" => OpKind::Prefetch {
                    index: index("an index `%b[..]`")?,
                    shape: a.usizes("shape")?,
                    level: if a.has("level") { a.usize("level")? } else { 1 },
                },
                "mask" => OpKind::Mask {
                    limits: index("limits `[..]`")?,
                },
                "broadcast" => OpKind::Broadcast,
                "reshape" => OpKind::Reshape,
                "trans" => OpKind::Trans {
                    perm: a.usizes("perm")?,
                },
                "expand_dims" => OpKind::ExpandDims {
                    axis: a.usize("axis")?,
                },
                "slice" => OpKind::Slice {
                    offsets: index("offsets `%t[..]`")?,
                },
                "convert_layout" => OpKind::ConvertLayout,
                "dot" => OpKind::Dot {
                    mma: a.has("mma").then(|| a.sizes::<3>("mma")).transpose()?,
                },
                "reduce" => {
                    let kind = a.word("kind")?;
                    OpKind::Reduce {
                        kind: ReduceKind::from_name(&kind)
                            .ok_or_else(|| format!("`{name}`: unknown reduction `{kind}`"))?,
                        axis: a.usize("axis")?,
                    }
                }
                "for" => OpKind::For {
                    lo: a.int("lo")?,
                    hi: a.int("hi")?,
                    step: a.int("step")?,
                },
                "yield" => OpKind::Yield,
                "barrier" => OpKind::Barrier,
                _ => return Err(format!("unknown op `{name}`")),
            }
        };
        a.finish()?;
        Ok(op)
    }

    /// Whether the op can fail at run time on operands of these types: an
    /// integer division by zero (the interpreter's error, compiled code's
    /// failure status). Buffers are allocated before kernels run.
    pub fn may_fail(&self, operands: &[&Type]) -> bool {
        matches!(self, OpKind::Binary(BinaryOp::Div))
            && operands
                .first()
                .and_then(|t| t.dtype())
                .is_some_and(|d| d.is_int())
    }

    /// The op's typing rule: whether operands of types `operands` and
    /// results of types `results` fit it. Where an op stands, SSA scoping
    /// and region arguments are the verifier's.
    pub fn check(&self, operands: &[&Type], results: &[&Type]) -> Result<(), String> {
        self.check_arity(operands, results)?;
        self.check_layouts(operands, results)?;
        let result = || results.first().copied().ok_or("no result");
        match self {
            OpKind::ConvertLayout => {
                let (d, shape) = tile(operands[0])?;
                let (rd, rshape) = tile(result()?)?;
                if d != rd || shape != rshape {
                    return Err(format!(
                        "converts {} to {}: only the layout may change",
                        operands[0], results[0]
                    ));
                }
            }
            OpKind::Alloc => {
                let b = buffer(result()?)?;
                if b.offset != 0 {
                    return Err(format!(
                        "gives a buffer of its own, with no offset, not {b}"
                    ));
                }
            }
            OpKind::Global(v) => {
                let b = buffer(result()?)?;
                if b.space != crate::ir::Space::Global || !b.is_contiguous() {
                    return Err(format!("gives a row-major global buffer, not {b}"));
                }
                if b.storage_len() != Some(v.len()) {
                    return Err(format!("holds {} values for a buffer of {b}", v.len()));
                }
            }
            OpKind::Prepared { .. } => {
                let b = buffer(result()?)?;
                if b.space != crate::ir::Space::Global || !b.is_contiguous() || b.offset != 0 {
                    return Err(format!("gives a row-major global buffer, not {b}"));
                }
            }
            OpKind::Dealloc => {
                buffer(operands[0])?;
            }
            OpKind::View => check_view(buffer(operands[0])?, buffer(result()?)?)?,
            OpKind::Kernel { grid, .. } => {
                if grid.is_empty() || grid.len() > 3 || grid.contains(&0) {
                    return Err(format!(
                        "grid {grid:?} must have one to three axes, each at least 1"
                    ));
                }
            }
            OpKind::ProgramId { axis } => {
                if *axis > 2 {
                    return Err(format!("axis {axis} is not a grid axis (0, 1 or 2)"));
                }
                same(&Type::Index, result()?, "the result")?;
            }
            OpKind::Const(v) => {
                let (d, _) = value(result()?)?;
                if d.round(*v) != *v && !v.is_nan() {
                    return Err(format!("{} is not a value of {d}", format_float(*v)));
                }
            }
            OpKind::Splat => {
                let (d, _) = tile(result()?)?;
                same(&Type::Scalar(d), operands[0], "the operand")?;
            }
            OpKind::Unary(u) => {
                let (d, _) = value(operands[0])?;
                if !d.is_numeric() || (d.is_int() && !u.accepts_int()) {
                    return Err(format!("is not defined on {d}"));
                }
                same(operands[0], result()?, "the result")?;
            }
            OpKind::Binary(b) => {
                let (d, _) = value(operands[0])?;
                same(operands[0], operands[1], "the second operand")?;
                if !b.accepts(d) {
                    return Err(format!("is not defined on {d}"));
                }
                same(operands[0], result()?, "the result")?;
            }
            OpKind::Compare(_) => {
                let (_, shape) = value(operands[0])?;
                same(operands[0], operands[1], "the second operand")?;
                same(&Type::value(DType::Bool, &shape), result()?, "the result")?;
            }
            OpKind::Select => {
                let (_, shape) = value(operands[1])?;
                same(
                    &Type::value(DType::Bool, &shape),
                    operands[0],
                    "the condition",
                )?;
                same(operands[1], operands[2], "the third operand")?;
                same(operands[1], result()?, "the result")?;
            }
            // An integer scalar as an index: a gather's row.
            OpKind::Cast if result()? == &Type::Index => {
                let (d, shape) = value(operands[0])?;
                if !d.is_int() || !shape.is_empty() {
                    return Err(format!(
                        "makes an index of {d}{shape:?}, not of an integer scalar"
                    ));
                }
            }
            OpKind::Cast => {
                let (_, shape) = value(operands[0])?;
                let (_, rshape) = value(result()?)?;
                if shape != rshape {
                    return Err("changes the shape".into());
                }
            }
            OpKind::Load { index, pad } => check_load(index, *pad, operands, result()?)?,
            OpKind::Store { index } => {
                let (d, shape) = value(operands[0])?;
                let b = buffer(operands[1])?;
                if d != b.dtype {
                    return Err(format!("stores {d} into {b}"));
                }
                check_index(index, b.shape.len(), shape.len())?;
                if let Some(m) = operands.get(2) {
                    same(&mask_for(operands[0]), m, "the mask")?;
                }
            }
            OpKind::Prefetch {
                index,
                shape,
                level,
            } => check_prefetch(index, shape, *level, buffer(operands[0])?.shape.len())?,
            OpKind::Mask { limits } => check_mask(limits, result()?)?,
            OpKind::Broadcast => {
                let (d, from) = tile(operands[0])?;
                let (rd, to) = tile(result()?)?;
                if d != rd
                    || from.len() != to.len()
                    || from.iter().zip(&to).any(|(f, t)| f != t && *f != 1)
                {
                    return Err(format!(
                        "cannot broadcast {} to {}",
                        operands[0], results[0]
                    ));
                }
            }
            OpKind::Reshape => {
                let (d, from) = tile(operands[0])?;
                let (rd, to) = tile(result()?)?;
                if d != rd || from.iter().product::<usize>() != to.iter().product::<usize>() {
                    return Err(format!("cannot reshape {} to {}", operands[0], results[0]));
                }
            }
            OpKind::Trans { perm } => {
                let (d, from) = tile(operands[0])?;
                let mut sorted = perm.clone();
                sorted.sort_unstable();
                if sorted != (0..from.len()).collect::<Vec<_>>() {
                    return Err(format!(
                        "{perm:?} is not a permutation of {} axes",
                        from.len()
                    ));
                }
                let to: Vec<usize> = perm.iter().map(|&p| from[p]).collect();
                same(&Type::value(d, &to), result()?, "the result")?;
            }
            OpKind::Slice { offsets } => check_slice(offsets, operands[0], result()?)?,
            OpKind::ExpandDims { axis } => {
                let (d, mut shape) = tile(operands[0])?;
                if *axis > shape.len() {
                    return Err(format!("axis {axis} is past the {} axes", shape.len()));
                }
                shape.insert(*axis, 1);
                same(&Type::value(d, &shape), result()?, "the result")?;
            }
            OpKind::Dot { mma } => check_dot(operands, result()?, *mma)?,
            OpKind::Reduce { axis, .. } => {
                let (d, mut shape) = tile(operands[0])?;
                if *axis >= shape.len() {
                    return Err(format!("axis {axis} is past the {} axes", shape.len()));
                }
                if !d.is_numeric() {
                    return Err(format!("is not defined on {d}"));
                }
                shape.remove(*axis);
                same(&Type::value(d, &shape), result()?, "the result")?;
            }
            OpKind::For { step, .. } => {
                if *step <= 0 {
                    return Err(format!("step {step} must be positive"));
                }
                for (i, (o, r)) in operands.iter().zip(results).enumerate() {
                    value(o)?;
                    same(o, r, &format!("result {i}"))?;
                }
            }
            OpKind::Yield => {
                for o in operands {
                    value(o)?;
                }
            }
            OpKind::Return | OpKind::Barrier => {}
        }
        Ok(())
    }

    /// Where a tile in a layout other than the flat one may be: an `#mma`
    /// tile carried by `tile.for`, as a tensor-core product's accumulator
    /// and result, and converted (an f32 matrix of whole 16 x 8 tiles); a
    /// `#blocked` one loaded, made as a mask and stored, every tile of the
    /// op in that layout.
    fn check_layouts(&self, operands: &[&Type], results: &[&Type]) -> Result<(), String> {
        let layout = |t: &&Type| match t {
            Type::Tile(t) => Some(t.layout),
            _ => None,
        };
        let tiles: Vec<Layout> = operands.iter().chain(results).filter_map(layout).collect();
        if tiles.iter().any(|l| matches!(l, Layout::Blocked(_))) {
            let one = tiles.windows(2).all(|w| w[0] == w[1]);
            return match self {
                OpKind::Load { .. } | OpKind::Store { .. } | OpKind::Mask { .. } if one => Ok(()),
                OpKind::Load { .. } | OpKind::Store { .. } | OpKind::Mask { .. } => Err(
                    "has tiles in different layouts (a #blocked tile's mask is #blocked too)"
                        .into(),
                ),
                _ => Err(
                    "takes no #blocked tile (only tile.load, tile.mask and tile.store do)".into(),
                ),
            };
        }
        let laid = |t: &&Type| matches!(t, Type::Tile(t) if t.layout != Layout::Flat);
        let mma_ok = |t: &&Type| match t {
            Type::Tile(t) => match t.layout {
                Layout::Mma(g) => t.fits_mma() && g.divides(t.shape[0], t.shape[1]),
                _ => true,
            },
            _ => true,
        };
        if let Some(t) = operands.iter().chain(results).find(|t| !mma_ok(t)) {
            return Err(format!(
                "{t}: an #mma tile is an f32 matrix of whole 16 x 8 tiles its grid of warps \
                 divides"
            ));
        }
        let allowed = match self {
            OpKind::For { .. } | OpKind::Yield | OpKind::ConvertLayout => true,
            // The accumulator and the result, both in the layout or neither.
            OpKind::Dot { mma: Some(_) } => !laid(&operands[0]) && !laid(&operands[1]),
            _ => false,
        };
        if !allowed && operands.iter().chain(results).any(laid) {
            return Err(
                "takes no tile in the #mma layout (only tile.for, tile.yield, \
                 tile.convert_layout and a tensor-core tile.dot's accumulator do)"
                    .into(),
            );
        }
        Ok(())
    }

    /// Whether the numbers of operands and results fit the op.
    fn check_arity(&self, operands: &[&Type], results: &[&Type]) -> Result<(), String> {
        match self.syntax().operands {
            Operands::Fixed(n) if operands.len() != n => {
                return Err(format!("takes {n} operands, got {}", operands.len()));
            }
            Operands::Indexed { before, mask }
                if !(before + 1..=before + 1 + usize::from(mask)).contains(&operands.len()) =>
            {
                let optional = if mask { " and an optional mask" } else { "" };
                return Err(format!(
                    "takes {} operands{optional}, got {}",
                    before + 1,
                    operands.len()
                ));
            }
            Operands::Limits if !operands.is_empty() => {
                return Err("takes no operands".into());
            }
            _ => {}
        }
        let produces = match self {
            OpKind::Dealloc
            | OpKind::Kernel { .. }
            | OpKind::Return
            | OpKind::Store { .. }
            | OpKind::Prefetch { .. }
            | OpKind::Yield
            | OpKind::Barrier => 0,
            OpKind::For { .. } => operands.len(),
            _ => 1,
        };
        if results.len() != produces {
            return Err(format!(
                "has {} results, expected {produces}",
                results.len()
            ));
        }
        Ok(())
    }
}

/// A scalar's or a tile's element type and shape (none for a scalar).
fn value(t: &Type) -> Result<(DType, Vec<usize>), String> {
    match t {
        Type::Scalar(d) => Ok((*d, vec![])),
        Type::Tile(t) => Ok((t.dtype, t.shape.clone())),
        other => Err(format!("expects a scalar or tile, got {other}")),
    }
}

/// A tile's element type and shape.
fn tile(t: &Type) -> Result<(DType, Vec<usize>), String> {
    match t {
        Type::Tile(t) => Ok((t.dtype, t.shape.clone())),
        other => Err(format!("expects a tile, got {other}")),
    }
}

/// A buffer's type.
fn buffer(t: &Type) -> Result<BufferType, String> {
    match t {
        Type::Buffer(b) => Ok(b.clone()),
        other => Err(format!("expects a buffer, got {other}")),
    }
}

/// That `got`, the type of `what`, is `want`.
fn same(want: &Type, got: &Type, what: &str) -> Result<(), String> {
    if want == got {
        Ok(())
    } else {
        Err(format!("{what} is {got}, expected {want}"))
    }
}

/// `tile.view`: `dst` lies within `src`, in its element type and space.
fn check_view(src: BufferType, dst: BufferType) -> Result<(), String> {
    if src.dtype != dst.dtype || src.space != dst.space {
        return Err(format!(
            "views {src} as {dst}: element type and space must stay"
        ));
    }
    if !dst.lies_within(&src) || dst.shape.len() != dst.strides.len() {
        return Err(format!("views {src} as {dst}, which reaches outside it"));
    }
    Ok(())
}

/// `tile.load`: the element type, the index, the mask and the pad.
fn check_load(
    index: &[Affine],
    pad: Option<f64>,
    operands: &[&Type],
    result: &Type,
) -> Result<(), String> {
    let b = buffer(operands[0])?;
    let (d, shape) = value(result)?;
    if d != b.dtype {
        return Err(format!("loads {d} from {b}"));
    }
    check_index(index, b.shape.len(), shape.len())?;
    if let Some(m) = operands.get(1) {
        same(&mask_for(result), m, "the mask")?;
    }
    if let Some(p) = pad
        && d.round(p) != p
        && !p.is_nan()
    {
        return Err(format!("pad {} is not a value of {d}", format_float(p)));
    }
    Ok(())
}

/// `tile.mask`: bool tiles, a limit per axis, none using tile coordinates.
/// `tile.slice`: a tile of the operand's element type and rank whose
/// shape fits in the operand's, at offsets without tile coordinates; a
/// constant offset must leave the cut inside the operand.
fn check_slice(offsets: &[Affine], operand: &Type, result: &Type) -> Result<(), String> {
    let (d, from) = tile(operand)?;
    let (rd, to) = tile(result)?;
    if d != rd || to.len() != from.len() {
        return Err(format!("cannot cut {result} out of {operand}"));
    }
    check_index(offsets, from.len(), 0)?;
    for (k, e) in offsets.iter().enumerate() {
        let room = from[k] as i64 - to[k] as i64;
        if room < 0 || (e.is_constant() && !(0..=room).contains(&e.constant)) {
            return Err(format!(
                "cuts {} elements of axis {k} at {} out of the operand's {}",
                to[k],
                e.text(|v| format!("%{}", v.0), |a| format!("#{a}"), false),
                from[k]
            ));
        }
    }
    Ok(())
}

fn check_mask(limits: &[Affine], result: &Type) -> Result<(), String> {
    let (d, shape) = tile(result)?;
    if d != DType::Bool {
        return Err(format!("gives bool tiles, not {d}"));
    }
    if limits.len() != shape.len() {
        return Err(format!(
            "has {} limits for {} axes",
            limits.len(),
            shape.len()
        ));
    }
    if limits.iter().any(|l| !l.axes.is_empty()) {
        return Err("limits cannot use tile coordinates `#k`".into());
    }
    Ok(())
}

/// The mask of a load or store of `v`: bool, of its shape and layout.
fn mask_for(v: &Type) -> Type {
    match v {
        Type::Tile(t) => {
            Type::Tile(crate::TileType::new(DType::Bool, t.shape.clone()).with_layout(t.layout))
        }
        _ => Type::Scalar(DType::Bool),
    }
}

/// `tile.dot`: 2-axis tiles whose shapes make the accumulator's, which is
/// in the operands' accumulator type and is the result; on tensor cores,
/// float operands into an f32 accumulator in whole steps of `mma`.
fn check_dot(operands: &[&Type], result: &Type, mma: Option<[usize; 3]>) -> Result<(), String> {
    let (da, a) = tile(operands[0])?;
    let (db, b) = tile(operands[1])?;
    let (dc, c) = tile(operands[2])?;
    if a.len() != 2 || b.len() != 2 || c.len() != 2 {
        return Err("multiplies 2-axis tiles".into());
    }
    if da != db || !da.is_numeric() || dc != da.accumulator() {
        return Err(format!(
            "multiplies {da} by {db} into {dc}; the accumulator must be {}",
            da.accumulator()
        ));
    }
    if a[1] != b[0] || c != [a[0], b[1]] {
        return Err(format!(
            "shapes {a:?} @ {b:?} do not make the accumulator's {c:?}"
        ));
    }
    if let Some(shape @ [mm, mn, mk]) = mma {
        if !matches!(da, DType::F16 | DType::BF16 | DType::F32) || dc != DType::F32 {
            return Err(format!(
                "a tensor-core product takes f16, bf16 or f32 (as TF32) operands into an f32 \
                 accumulator, not {da} into {dc}"
            ));
        }
        if shape.contains(&0) || a[0] % mm != 0 || b[1] % mn != 0 || a[1] % mk != 0 {
            return Err(format!(
                "{}x{}x{} (m x n x k) is not in whole tensor-core steps of {shape:?}",
                a[0], b[1], a[1]
            ));
        }
    }
    same(operands[2], result, "the result")
}

/// A prefetch's tile: a shape of no empty axis, a level of cache from 1
/// to 3, and an index into a buffer of `rank` axes.
fn check_prefetch(
    index: &[Affine],
    shape: &[usize],
    level: usize,
    rank: usize,
) -> Result<(), String> {
    if shape.is_empty() || shape.contains(&0) {
        return Err(format!("prefetches a tile of shape {shape:?}"));
    }
    if !(1..=3).contains(&level) {
        return Err(format!(
            "prefetches into cache level {level} (there are levels 1 to 3)"
        ));
    }
    check_index(index, rank, shape.len())
}

/// An index list of `rank` expressions whose tile coordinates are axes of a
/// `tile_rank`-axis tile.
fn check_index(index: &[Affine], rank: usize, tile_rank: usize) -> Result<(), String> {
    if index.len() != rank {
        return Err(format!("has {} indices for {rank} dimensions", index.len()));
    }
    for e in index {
        if let Some((_, k)) = e.axes.iter().find(|(_, k)| *k >= tile_rank) {
            return Err(format!("uses `#{k}`, but the tile has {tile_rank} axes"));
        }
    }
    Ok(())
}

impl dlc_core::ir::OpDecl for OpKind {
    /// The op's full name (`tile.dot`).
    fn name(&self) -> String {
        let s: &str = match self {
            OpKind::Alloc => "alloc",
            OpKind::Global(_) => "global",
            OpKind::Prepared { .. } => "prepared",
            OpKind::Dealloc => "dealloc",
            OpKind::View => "view",
            OpKind::Kernel { .. } => "kernel",
            OpKind::Return => "return",
            OpKind::ProgramId { .. } => "program_id",
            OpKind::Const(_) => "const",
            OpKind::Splat => "splat",
            OpKind::Unary(u) => u.name(),
            OpKind::Binary(b) => b.name(),
            OpKind::Compare(c) => c.name(),
            OpKind::Select => "select",
            OpKind::Cast => "cast",
            OpKind::Load { .. } => "load",
            OpKind::Store { .. } => "store",
            OpKind::Prefetch { .. } => "prefetch",
            OpKind::Mask { .. } => "mask",
            OpKind::Broadcast => "broadcast",
            OpKind::Reshape => "reshape",
            OpKind::Trans { .. } => "trans",
            OpKind::ExpandDims { .. } => "expand_dims",
            OpKind::Slice { .. } => "slice",
            OpKind::Dot { .. } => "dot",
            OpKind::ConvertLayout => "convert_layout",
            OpKind::Reduce { .. } => "reduce",
            OpKind::For { .. } => "for",
            OpKind::Yield => "yield",
            OpKind::Barrier => "barrier",
        };
        format!("tile.{s}")
    }

    /// How the op is written.
    fn syntax(&self) -> Syntax {
        use Operands::*;
        let of = Syntax::of;
        match self {
            OpKind::Alloc
            | OpKind::Global(_)
            | OpKind::Prepared { .. }
            | OpKind::ProgramId { .. }
            | OpKind::Const(_) => of(Fixed(0)),
            OpKind::Barrier => of(Fixed(0)),
            OpKind::Dealloc | OpKind::View => of(Fixed(1)),
            OpKind::Kernel { .. } => Syntax {
                region: Region::Bare,
                ..of(Fixed(0))
            },
            OpKind::Return => Syntax {
                terminator: Some(Terminator::Return),
                ..of(Fixed(0))
            },
            OpKind::Splat
            | OpKind::Unary(_)
            | OpKind::Cast
            | OpKind::Broadcast
            | OpKind::Reshape
            | OpKind::Trans { .. }
            | OpKind::ExpandDims { .. }
            | OpKind::ConvertLayout
            | OpKind::Reduce { .. } => of(Fixed(1)),
            OpKind::Binary(_) | OpKind::Compare(_) => of(Fixed(2)),
            OpKind::Select | OpKind::Dot { .. } => of(Fixed(3)),
            OpKind::Load { .. } => of(Indexed {
                before: 0,
                mask: true,
            }),
            OpKind::Store { .. } => of(Indexed {
                before: 1,
                mask: true,
            }),
            OpKind::Prefetch { .. } | OpKind::Slice { .. } => of(Indexed {
                before: 0,
                mask: false,
            }),
            OpKind::Mask { .. } => of(Limits),
            OpKind::For { .. } => Syntax {
                region: Region::WithArgs,
                ..of(Variadic)
            },
            OpKind::Yield => Syntax {
                terminator: Some(Terminator::Yield),
                ..of(Variadic)
            },
        }
    }

    /// The attributes the text forms print, in print order.
    fn attrs(&self) -> Vec<(String, Attr)> {
        let one = |k: &str, a: Attr| vec![(k.to_string(), a)];
        match self {
            OpKind::Kernel { grid, schedule } => {
                let mut v = vec![
                    (
                        "grid".to_string(),
                        Attr::Ints(grid.iter().map(|&g| g as i64).collect()),
                    ),
                    (
                        "schedule".to_string(),
                        Attr::Str(schedule.name().to_string()),
                    ),
                ];
                v.extend(
                    schedule
                        .params()
                        .into_iter()
                        .map(|(k, p)| (k.to_string(), Attr::Ints(p))),
                );
                v
            }
            OpKind::ProgramId { axis } | OpKind::ExpandDims { axis } => {
                one("axis", Attr::Int(*axis as i64))
            }
            OpKind::Const(v) => one("value", Attr::Float(*v)),
            OpKind::Global(v) => one("value", Attr::Floats(v.clone())),
            OpKind::Prepared { func, index } => vec![
                ("func".to_string(), Attr::Str(func.clone())),
                ("index".to_string(), Attr::Int(*index as i64)),
            ],
            OpKind::Load { pad: Some(p), .. } => one("pad", Attr::Float(*p)),
            OpKind::Prefetch { shape, level, .. } => {
                let mut v = one(
                    "shape",
                    Attr::Ints(shape.iter().map(|&x| x as i64).collect()),
                );
                if *level != 1 {
                    v.push(("level".to_string(), Attr::Int(*level as i64)));
                }
                v
            }
            OpKind::Trans { perm } => {
                one("perm", Attr::Ints(perm.iter().map(|&p| p as i64).collect()))
            }
            OpKind::Dot { mma: Some(shape) } => {
                one("mma", Attr::Ints(shape.iter().map(|&x| x as i64).collect()))
            }
            OpKind::Reduce { kind, axis } => vec![
                ("kind".to_string(), Attr::Word(kind.name().to_string())),
                ("axis".to_string(), Attr::Int(*axis as i64)),
            ],
            OpKind::For { lo, hi, step } => vec![
                ("lo".to_string(), Attr::Int(*lo)),
                ("hi".to_string(), Attr::Int(*hi)),
                ("step".to_string(), Attr::Int(*step)),
            ],
            _ => vec![],
        }
    }

    fn indices(&self) -> Vec<&[Affine]> {
        self.index().into_iter().collect()
    }

    fn is_view(&self) -> bool {
        matches!(self, OpKind::View)
    }
}
