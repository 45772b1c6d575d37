//! The tile dialect's types and schedules, and the dialect as a
//! [`dlc_core::ir::Dialect`]: its functions, blocks and ops are the IR
//! core's. A function is host code: it allocates global buffers and launches
//! kernels one after another. A `tile.kernel` is a grid of program
//! instances; each instance runs the kernel's body with its own program ids,
//! on values that are whole tiles (small static-shaped blocks), scalars and
//! indices.

use std::fmt;

use dlc_core::DType;

pub use dlc_core::ir::{Affine, Block, OpId, Value};

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// Memory every program and the host see (parameters, intermediates).
    Global,
    /// Memory private to one program instance (a CPU thread's stack or
    /// heap scratch, a GPU thread block's registers or local memory).
    Scratch,
    /// Memory shared by the threads that run one program on a GPU (CUDA
    /// shared memory); accesses that conflict must be separated by a
    /// `tile.barrier`.
    Shared,
}

impl Space {
    /// Every space.
    pub const ALL: [Space; 3] = [Space::Global, Space::Scratch, Space::Shared];

    /// The text name.
    pub fn name(self) -> &'static str {
        match self {
            Space::Global => "global",
            Space::Scratch => "scratch",
            Space::Shared => "shared",
        }
    }

    /// MLIR's memory space number (NVVM's: 0 generic, 3 shared, 5 local).
    pub fn mlir(self) -> u32 {
        match self {
            Space::Global => 0,
            Space::Shared => 3,
            Space::Scratch => 5,
        }
    }
}

/// A buffer: its layout (element type, shape, strides in elements; read
/// through it as `t.dtype`, `t.shape`, `t.strides`) and its memory space.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BufferType {
    /// Element type, shape and strides.
    pub layout: dlc_core::Layout,
    /// Where it lives.
    pub space: Space,
}

impl std::ops::Deref for BufferType {
    type Target = dlc_core::Layout;
    fn deref(&self) -> &dlc_core::Layout {
        &self.layout
    }
}

impl AsRef<dlc_core::Layout> for BufferType {
    fn as_ref(&self) -> &dlc_core::Layout {
        &self.layout
    }
}

impl std::ops::DerefMut for BufferType {
    fn deref_mut(&mut self) -> &mut dlc_core::Layout {
        &mut self.layout
    }
}

impl BufferType {
    /// A row-major buffer in `space`.
    pub fn contiguous(dtype: DType, shape: Vec<usize>, space: Space) -> Self {
        BufferType {
            layout: dlc_core::Layout::contiguous(dtype, shape),
            space,
        }
    }

    /// The MLIR type (`memref<4x8xf32>`, `memref<4x8xf32, strided<[1, 4]>, 3>`).
    pub fn mlir(&self) -> String {
        self.layout
            .mlir_in((self.space != Space::Global).then(|| self.space.mlir()))
    }
}

impl fmt::Display for BufferType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let space = (self.space != Space::Global).then(|| self.space.name());
        self.layout.text_with(f, space)
    }
}

/// The most elements one tile may have: tiles are blocks a program holds
/// in registers or scratch memory, not whole tensors.
pub const MAX_TILE_ELEMENTS: usize = 1 << 20;

/// The largest lane stride a CPU back end reads as one wide masked load and
/// a shuffle rather than a gather (a stride of `s` loads `s` times the lanes
/// it keeps; x86 runs a gather about an element at a time). The conversion
/// from loops makes tiles along a counter that strides its reads by at most
/// this (a strided depthwise convolution's columns), and the LLVM back end
/// reads them so.
pub const MAX_DEINTERLEAVED_STEP: i64 = 4;

/// A tile: a static-shaped block of elements held by one program, laid
/// out over its threads as `layout` says.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TileType {
    /// Element type.
    pub dtype: DType,
    /// Extent of each axis (at least one axis, every extent at least 1).
    pub shape: Vec<usize>,
    /// How a program's threads hold its elements (on a CPU one thread
    /// holds them all, whatever the layout).
    pub layout: Layout,
}

/// How the threads of a GPU program hold a tile's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// Element `e` (row-major) by thread `e mod threads` (not printed).
    #[default]
    Flat,
    /// A tensor-core accumulator, `#mma<r, c>`: the 2-axis tile cut into
    /// 16 x 8 tiles, dealt to an `r x c` grid of warps in blocks
    /// ([`MmaGrid`]), each tile held by its warp's lanes as `mma.sync`'s f32
    /// accumulator fragments (lane `l`: rows `l / 4` and `l / 4 + 8`,
    /// columns `2 (l mod 4)` and the next). Only `tile.for` carries it,
    /// `tile.dot {mma}` accumulates in it and `tile.convert_layout`
    /// converts it; the pass `tile.mma-accumulators` chooses it.
    Mma(MmaGrid),
    /// `#blocked<v>`: runs of `v` consecutive elements (row-major) dealt to
    /// the threads in turn (run `r` to thread `r mod threads`), so a
    /// thread's run is one wide access of memory. Only a tile loaded from
    /// global memory and stored into shared memory (an operand copy) and
    /// its mask are in it; the pass `tile.copy-layouts` chooses it.
    Blocked(usize),
}

/// How a program's warps hold the 16 x 8 tiles of a tensor-core
/// accumulator (`#mma<rows, cols>`): as a `rows x cols` grid, warp `w` at
/// row `w / cols`, column `w mod cols` of it, each taking the block of
/// tiles at its place, row by row in rounds (round `q`: row `q / c`,
/// column `q mod c` of a block of `r x c` tiles). A warp then reads each
/// of its block's rows of left fragments and columns of right ones once
/// per step of the depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MmaGrid {
    /// Warps down.
    pub rows: usize,
    /// Warps across.
    pub cols: usize,
}

impl MmaGrid {
    /// The grid of `warps` warps over an `m x n` accumulator's tiles that
    /// reads the fewest bytes of fragments per step (a left fragment is 512
    /// bytes, a right one 256); `None` where no grid divides the tiles.
    pub fn choose(m: usize, n: usize, warps: usize) -> Option<MmaGrid> {
        (1..=warps)
            .filter(|&r| warps.is_multiple_of(r))
            .map(|rows| MmaGrid {
                rows,
                cols: warps / rows,
            })
            .filter(|g| g.divides(m, n))
            .min_by_key(|g| {
                let (r, c) = g.block(m, n);
                2 * r + c
            })
    }

    /// Whether the grid deals an `m x n` accumulator's 16 x 8 tiles evenly.
    pub fn divides(self, m: usize, n: usize) -> bool {
        self.rows > 0
            && self.cols > 0
            && m.is_multiple_of(16)
            && n.is_multiple_of(8)
            && (m / 16).is_multiple_of(self.rows)
            && (n / 8).is_multiple_of(self.cols)
    }

    /// The tiles down and across of each warp's block.
    pub fn block(self, m: usize, n: usize) -> (usize, usize) {
        (m / 16 / self.rows, n / 8 / self.cols)
    }

    /// The tile (row and column of tiles) warp `warp` takes in round
    /// `round` of an `m x n` accumulator.
    pub fn tile(self, round: usize, warp: usize, m: usize, n: usize) -> (usize, usize) {
        let (r, c) = self.block(m, n);
        (
            (warp / self.cols) * r + round / c,
            (warp % self.cols) * c + round % c,
        )
    }
}

impl Layout {
    /// The text after `#` (`mma<2, 4>`, `blocked<8>`), none for the flat
    /// layout.
    pub fn name(self) -> Option<String> {
        match self {
            Layout::Flat => None,
            Layout::Mma(g) => Some(format!("mma<{}, {}>", g.rows, g.cols)),
            Layout::Blocked(v) => Some(format!("blocked<{v}>")),
        }
    }
}

impl TileType {
    /// A tile type in the flat layout.
    pub fn new(dtype: DType, shape: Vec<usize>) -> Self {
        TileType {
            dtype,
            shape,
            layout: Layout::Flat,
        }
    }

    /// The same tile in layout `layout`.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// Whether it can be a tensor-core accumulator in the `#mma` layout:
    /// an f32 matrix of whole 16 x 8 tiles.
    pub fn fits_mma(&self) -> bool {
        self.dtype == DType::F32
            && self.shape.len() == 2
            && self.shape[0].is_multiple_of(16)
            && self.shape[1].is_multiple_of(8)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tile has no elements (never, for a verified type).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Display for TileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tile<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}", self.dtype)?;
        if let Some(name) = self.layout.name() {
            write!(f, ", #{name}")?;
        }
        f.write_str(">")
    }
}

/// The type of a value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Type {
    /// An index (a signed 64-bit integer): program ids, loop counters.
    Index,
    /// One element.
    Scalar(DType),
    /// A tile of elements.
    Tile(TileType),
    /// A buffer.
    Buffer(BufferType),
}

impl Type {
    /// The element type of a scalar or tile.
    pub fn dtype(&self) -> Option<DType> {
        match self {
            Type::Scalar(d) => Some(*d),
            Type::Tile(t) => Some(t.dtype),
            _ => None,
        }
    }

    /// The shape of a tile (empty for a scalar).
    pub fn shape(&self) -> Option<&[usize]> {
        match self {
            Type::Scalar(_) => Some(&[]),
            Type::Tile(t) => Some(&t.shape),
            _ => None,
        }
    }

    /// The same shape with another element type.
    pub fn with_dtype(&self, d: DType) -> Type {
        match self {
            Type::Tile(t) => Type::Tile(TileType::new(d, t.shape.clone())),
            _ => Type::Scalar(d),
        }
    }

    /// A scalar (empty `shape`) or tile type.
    pub fn value(dtype: DType, shape: &[usize]) -> Type {
        if shape.is_empty() {
            Type::Scalar(dtype)
        } else {
            Type::Tile(TileType::new(dtype, shape.to_vec()))
        }
    }

    /// The MLIR type: tiles are `tensor`s (as Triton's are).
    pub fn mlir(&self) -> String {
        match self {
            Type::Index => "index".into(),
            Type::Scalar(d) => d.mlir_name().into(),
            Type::Tile(t) => {
                let dims: String = t.shape.iter().map(|d| format!("{d}x")).collect();
                format!("tensor<{dims}{}>", t.dtype.mlir_name())
            }
            Type::Buffer(b) => b.mlir(),
        }
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Index => f.write_str("index"),
            Type::Scalar(d) => write!(f, "{d}"),
            Type::Tile(t) => write!(f, "{t}"),
            Type::Buffer(b) => write!(f, "{b}"),
        }
    }
}

/// How a kernel was scheduled: the strategy the conversion picked for the
/// loop nest, with its typed parameters (tile sizes, vector width,
/// blocking, staging). It is printed with the kernel (`schedule =
/// "packed", blocking = [6, 32, 42, 160]`) so that a cost model or a
/// search can read it and ask the conversion for another; code generation
/// reads the IR, never this (only `tile.reuse-packs` reads it, to find
/// pack kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Ops outside nests (a full reduction and its store) and the nests
    /// that share scalars with them, in one program.
    Serial {
        /// Iterations of an innermost loop one tile holds.
        vector: usize,
    },
    /// The parallel band is the grid; each program runs the band's body,
    /// its innermost loops vectorized.
    Rows {
        /// Iterations of an innermost loop one tile holds.
        vector: usize,
    },
    /// The band's innermost loop blocked: each program takes `vector`
    /// consecutive iterations as one tile axis.
    Blocked {
        /// Iterations per program.
        vector: usize,
        /// Short rows: `[rows, columns]` of the program's tile (a whole
        /// row of columns, rows enough for about `vector` elements).
        tile: Option<[usize; 2]>,
    },
    /// A block product: `tile.dot` over `[bm, bn, bk]` blocks.
    Dot {
        /// `[rows, columns, depth]` of a block.
        tile: [usize; 3],
        /// Operand blocks staged through shared memory (a GPU's).
        staged: bool,
    },
    /// A packed product (BLIS's loops around a register tile), or a kernel
    /// copying one of its operands into the packed form.
    Packed {
        /// `[mr, nr, mc, kc]`.
        blocking: [usize; 4],
        /// For a pack kernel, the operand it packs.
        pack: Option<PackedOperand>,
    },
    /// Two products fused by rows (attention: scores, online softmax and
    /// the product by the values in one program).
    Fused {
        /// `[mr, nr, mc, kc of the first product, kc of the second]`.
        blocking: [usize; 5],
    },
    /// A Winograd convolution: input transform, product and output
    /// transform in one program per block of rows.
    Winograd {
        /// `[mr, nr, tiles per program, kc]`.
        blocking: [usize; 4],
    },
}

/// The operand a pack kernel copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedOperand {
    /// The left operand, into strips of `mr` rows (`pack = [0]`).
    Left,
    /// The right operand, into panels of `nr` columns (`pack = [1]`).
    Right,
}

impl Schedule {
    /// Every strategy's name, as printed.
    pub const NAMES: [&'static str; 7] = [
        "serial", "rows", "blocked", "dot", "packed", "fused", "winograd",
    ];

    /// The strategy's name.
    pub fn name(&self) -> &'static str {
        match self {
            Schedule::Serial { .. } => "serial",
            Schedule::Rows { .. } => "rows",
            Schedule::Blocked { .. } => "blocked",
            Schedule::Dot { .. } => "dot",
            Schedule::Packed { .. } => "packed",
            Schedule::Fused { .. } => "fused",
            Schedule::Winograd { .. } => "winograd",
        }
    }

    /// The parameters as printed, in order.
    pub fn params(&self) -> Vec<(&'static str, Vec<i64>)> {
        let ints = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
        match self {
            Schedule::Serial { vector } | Schedule::Rows { vector } => {
                vec![("vector", ints(&[*vector]))]
            }
            Schedule::Blocked { vector, tile } => {
                let mut p = vec![("vector", ints(&[*vector]))];
                p.extend(tile.map(|t| ("tile", ints(&t))));
                p
            }
            Schedule::Dot { tile, staged } => {
                let mut p = vec![("tile", ints(tile))];
                if *staged {
                    p.push(("stages", vec![2]));
                }
                p
            }
            Schedule::Packed { blocking, pack } => {
                let mut p = vec![("blocking", ints(blocking))];
                p.extend(pack.map(|o| ("pack", vec![(o == PackedOperand::Right) as i64])));
                p
            }
            Schedule::Fused { blocking } => vec![("blocking", ints(blocking))],
            Schedule::Winograd { blocking } => vec![("blocking", ints(blocking))],
        }
    }

    /// Reads a kernel's schedule from its attributes (`schedule` and the
    /// strategy's parameters); an error names what is missing or wrong.
    pub fn read(a: &mut dlc_core::attr::AttrReader<'_>) -> Result<Schedule, String> {
        let vector = |a: &mut dlc_core::attr::AttrReader<'_>| a.sizes::<1>("vector").map(|[v]| v);
        let strategy = a.string("schedule")?;
        Ok(match strategy.as_str() {
            "serial" => Schedule::Serial { vector: vector(a)? },
            "rows" => Schedule::Rows { vector: vector(a)? },
            "blocked" => Schedule::Blocked {
                vector: vector(a)?,
                tile: a.has("tile").then(|| a.sizes::<2>("tile")).transpose()?,
            },
            "dot" => Schedule::Dot {
                tile: a.sizes::<3>("tile")?,
                staged: match a
                    .has("stages")
                    .then(|| a.sizes::<1>("stages"))
                    .transpose()?
                {
                    None | Some([1]) => false,
                    Some([2]) => true,
                    Some([n]) => return Err(format!("a dot schedule has 1 or 2 stages, got {n}")),
                },
            },
            "packed" => Schedule::Packed {
                blocking: a.sizes::<4>("blocking")?,
                pack: match a.has("pack").then(|| a.sizes::<1>("pack")).transpose()? {
                    None => None,
                    Some([0]) => Some(PackedOperand::Left),
                    Some([1]) => Some(PackedOperand::Right),
                    Some([n]) => {
                        return Err(format!("`pack` names operand 0 or 1, got {n}"));
                    }
                },
            },
            "fused" => Schedule::Fused {
                blocking: a.sizes::<5>("blocking")?,
            },
            "winograd" => Schedule::Winograd {
                blocking: a.sizes::<4>("blocking")?,
            },
            other => {
                return Err(format!(
                    "unknown schedule `{other}`; schedules: {}",
                    Schedule::NAMES.join(", ")
                ));
            }
        })
    }
}

/// The tile dialect, as a dialect of the IR core ([`dlc_core::ir`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tile;

/// An op: its kind, operands, results and nested blocks (kernel and loop
/// bodies).
pub type OpData = dlc_core::ir::OpData<Tile>;

/// A function over buffers: inputs, then the outputs it writes in place;
/// host code that allocates buffers and launches kernels. Its `prepare` names
/// the function computing its prepared inputs (see
/// `transforms::split_prepare`).
pub type Function = dlc_core::ir::Function<Tile>;

/// The least and greatest value of every loop counter (`tile.for`'s first
/// block argument) and program id (`tile.program_id`, from its kernel's
/// grid) in `f`, for proving accesses inside their buffers. A loop that
/// runs no iteration gives its counter no range.
pub fn index_ranges(f: &Function) -> std::collections::HashMap<Value, (i64, i64)> {
    use crate::ops::OpKind;
    let mut ranges = std::collections::HashMap::new();
    for op in &f.ops {
        match &op.kind {
            OpKind::For { lo, hi, step } if hi > lo => {
                let last = lo + (hi - 1 - lo) / (*step).max(1) * (*step).max(1);
                if let Some(&counter) = op.regions.first().and_then(|b| b.args.first()) {
                    ranges.insert(counter, (*lo, last));
                }
            }
            OpKind::Kernel { grid, .. } => {
                let mut stack: Vec<&Block> = op.regions.iter().collect();
                while let Some(b) = stack.pop() {
                    for &id in &b.ops {
                        let inner = f.op(id);
                        if let OpKind::ProgramId { axis } = inner.kind
                            && let (Some(&n), Some(&r)) = (grid.get(axis), inner.results.first())
                            && n > 0
                        {
                            ranges.insert(r, (0, n as i64 - 1));
                        }
                        if !matches!(inner.kind, OpKind::Kernel { .. }) {
                            stack.extend(inner.regions.iter());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    ranges
}

/// The element operations op `id` of `f` executes: loops and kernels
/// multiply their body's count by their trip count or grid size, `tile.dot`
/// counts its multiply-adds twice. The interpreter's limit on work and the
/// CPU back end's choice of threads for a kernel of few programs read it.
pub fn op_work(f: &Function, id: OpId) -> f64 {
    let elements = |t: &Type| match t {
        Type::Tile(t) => t.len() as f64,
        _ => 1.0,
    };
    use crate::ops::OpKind;
    let op = f.op(id);
    let body: f64 = op
        .regions
        .iter()
        .map(|r| r.ops.iter().map(|&o| op_work(f, o)).sum::<f64>())
        .sum();
    let result = op.results.first().map_or(1.0, |r| elements(f.ty(*r)));
    match &op.kind {
        // Every program and iteration costs at least one step, so an empty
        // body over a huge grid or range is refused too.
        OpKind::Kernel { grid, .. } => {
            grid.iter().map(|&g| g as f64).product::<f64>() * (1.0 + body)
        }
        OpKind::For { lo, hi, step } => {
            1.0 + ((hi - lo).max(0) as f64 / (*step).max(1) as f64).ceil() * (1.0 + body)
        }
        OpKind::Dot { .. } => {
            let k = f.ty(op.operands[0]).shape().map_or(1, |s| s[1]) as f64;
            2.0 * result * k
        }
        OpKind::Store { .. } => elements(f.ty(op.operands[0])),
        OpKind::Reduce { .. } => elements(f.ty(op.operands[0])),
        _ => result,
    }
}

/// A list of functions.
pub type Module = dlc_core::ir::Module<Tile>;

impl dlc_core::ir::Dialect for Tile {
    const NAME: &'static str = "tile";
    type Op = crate::ops::OpKind;
    type Type = Type;
    type Buffer = BufferType;

    fn buffer_type(b: BufferType) -> Type {
        Type::Buffer(b)
    }

    fn index_type() -> Type {
        Type::Index
    }

    fn buffer_op(op: dlc_core::ir::BufferOp) -> crate::ops::OpKind {
        use dlc_core::ir::BufferOp;
        match op {
            BufferOp::Alloc => crate::ops::OpKind::Alloc,
            BufferOp::Global(v) => crate::ops::OpKind::Global(v),
            BufferOp::Dealloc => crate::ops::OpKind::Dealloc,
            BufferOp::View => crate::ops::OpKind::View,
        }
    }
}

/// The most iterations of a loop the CPU code generator writes out itself
/// (the LLVM back end's rule, here so that `tile.share-window-loads` knows
/// which loops it writes out: in those, a window's offsets are constants).
pub const UNROLLED_MAX_TRIPS: i64 = 8;

/// The most ops (counted through nested loops' bodies) the copies of an
/// unrolled loop's body may hold together.
pub const UNROLLED_MAX_OPS: usize = 96;

/// How many iterations a `tile.for` from `lo` to `hi` by `step` over `body`,
/// carrying values, is written out as, straight-line, when it is short and
/// small: a window's taps (a depthwise convolution's 3x3 or 5x5), whose
/// padded loads then bound-check constant offsets. LLVM's unroller is off
/// (dlc-llvm's `emit::optimize`:
/// it copied packing and epilogue loops for no gain and a third more
/// compile time, ResNet-18's LLVM time 0.41 -> 1.83 s); left to a loop,
/// MobileNetV2's depthwise convolutions took twice as long.
pub fn unrolled_trips(f: &Function, lo: i64, hi: i64, step: i64, body: &Block) -> Option<i64> {
    let trips = trips(lo, hi, step);
    (trips <= UNROLLED_MAX_TRIPS && trips as usize * nested_ops(f, body) <= UNROLLED_MAX_OPS)
        .then_some(trips)
}

/// Iterations of a `tile.for` from `lo` to `hi` by `step`.
pub fn trips(lo: i64, hi: i64, step: i64) -> i64 {
    let step = step.max(1);
    ((hi - lo).max(0) + step - 1) / step
}

/// Ops of `blk`, counted through nested loops' bodies.
pub fn nested_ops(f: &Function, blk: &Block) -> usize {
    blk.ops
        .iter()
        .map(|&id| {
            1 + f
                .op(id)
                .regions
                .iter()
                .map(|r| nested_ops(f, r))
                .sum::<usize>()
        })
        .sum()
}
