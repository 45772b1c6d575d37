//! Loop to tile: each loop nest becomes a kernel scheduled for a target.
//!
//! A function's buffers stay at the host level (`tile.alloc`, `tile.view`,
//! `tile.dealloc`); each top-level loop nest becomes a `tile.kernel`:
//!
//! - **Grid**: the outermost band of perfectly nested parallel loops (up to
//!   three) becomes the grid, one program per iteration; when the band's
//!   innermost loop has a straight-line body, it is blocked instead: each
//!   program takes `vector` consecutive iterations as one tile axis, with a
//!   mask on the ragged last block (schedule `blocked`). Otherwise the body
//!   runs in each program (schedule `rows`).
//! - **Vectorization**: inside a program, every innermost loop becomes a
//!   `tile.for` over blocks of `vector` iterations: loads and stores become
//!   tile loads and stores at `#0`, arithmetic acts on whole tiles, values
//!   that do not depend on the loop stay scalars, and a value the loop
//!   carries by `+`, `*`, `max` or `min` (a reduction) becomes a tile of
//!   partial results, reduced by `tile.reduce` after the loop. Loops that
//!   are not innermost stay counted `tile.for` loops.
//! - **Contractions** (`loop.matmul`, the structured product the lowering's
//!   nests are raised to) become block programs (schedule `dot`): a grid
//!   over `BM x BN` blocks of the result, a `tile.for` over `BK`-deep slices
//!   of the reduction loading both operand blocks and accumulating with
//!   `tile.dot`, then the epilogue on the `BM x BN` accumulator tile. For a
//!   GPU target the operand blocks are staged through shared memory between
//!   barriers.
//! - Top-level ops outside nests (a full reduction to a scalar and its
//!   store), and nests that share scalars with them, run in one program
//!   (schedule `serial`).
//!
//! The choices are a [`Schedule`] per kernel, printed with it; the sizes
//! come from the target description ([`TargetDesc`]).

use std::collections::{HashMap, HashSet};

use dlc_core::scalar::{BinaryOp, ReduceKind};
use dlc_core::{DType, TargetDesc};
use dlc_loop::{
    Block as LBlock, BufferType as LBufferType, Function as LFunction, IndexExpr,
    Module as LModule, OpId as LOpId, OpKind as L, Type as LType, Value as LValue,
};
use dlc_tile::{
    Affine, BufferType, Builder, Module, PackedOperand, Schedule, Space, TileType, Type, Value,
};

mod winograd;
use winograd::WinogradFusion;

/// Why loop IR could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TileConvError {
    /// IR the loop verifier should have rejected.
    #[error("invalid loop IR in @{0}: {1}")]
    Invalid(String, String),
    /// A tile pass after the conversion failed.
    #[error("{0}")]
    Pass(String),
}

/// The schedule parameters a target gives each kind of nest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleParams {
    /// Iterations of an innermost loop one tile holds.
    pub vector: usize,
    /// Block of a contraction: rows, columns, depth.
    pub dot: [usize; 3],
    /// Whether contraction operands are staged through shared memory.
    pub stage_shared: bool,
    /// On a CPU, the packed product's parameters (products of f32, f16 or
    /// bf16 operands accumulated in f32).
    pub packed: Option<Packing>,
}

/// The packed product's parameters (BLIS's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packing {
    /// `[mr, nr, mc, kc]`: the register tile, rows packed at once, depth.
    pub blocking: [usize; 4],
    /// The fewest multiply-adds worth packing.
    pub min_macs: usize,
    /// A product is cut into at least this many programs when it has that
    /// many panels (threads are balanced).
    pub units: usize,
    /// Deepest slice of `k` one copy into packed form moves (a vector's
    /// lanes: a transposed copy is then square blocks of vectors).
    pub copy_depth: usize,
    /// `[rows, columns]`: a product of at most `columns` columns, which
    /// `blocking`'s wider tile would pad, is not packed but runs in
    /// programs of `rows` rows (the target's `narrow_mr x narrow_n`); `None`:
    /// every product is packed.
    pub narrow: Option<[usize; 2]>,
    /// A product's programs are made a multiple of this where that takes
    /// at most twice the column chunks (2 for a CPU: 9 row blocks become 18
    /// programs, not 9 of which one of two threads runs 5). The threads are
    /// only known when the code runs, so this is fixed rather than the
    /// compiling machine's cores: schedules do not depend on where they
    /// were made.
    pub balance: usize,
    /// Sets of the L1 data cache (of 64-byte lines). A product of one block
    /// of rows reads its right operand in place, unpacked, when that
    /// operand's rows are a whole number of lines apart and that number is
    /// coprime with the sets (so the rows of a panel fall in every set
    /// rather than a few): the operand is then read once, where packing
    /// reads it, writes the panels and reads those again. 0: never.
    pub l1_sets: usize,
    /// Bytes of a core's L2 cache: a fused Winograd convolution's program
    /// keeps its rows of the transformed input and product within half.
    pub l2_bytes: usize,
    /// Steps of the depth the register tile's loop takes per iteration
    /// (at most: the largest number up to this that divides `kc`). Two
    /// gave W1 1024 4.5% on one and two threads (the loop's counter and
    /// branch once per 24 multiply-adds instead of 12); four no more.
    pub unroll: usize,
}

impl ScheduleParams {
    /// Checks parameters given by hand: every tile they make must be a tile
    /// (at most `dlc_tile::ir::MAX_TILE_ELEMENTS` elements).
    pub fn validate(&self) -> Result<(), String> {
        let max = dlc_tile::ir::MAX_TILE_ELEMENTS;
        let [m, n, k] = self.dot;
        let fits =
            |a: usize, b: usize| a >= 1 && b >= 1 && a.checked_mul(b).is_some_and(|x| x <= max);
        if !(1..=max).contains(&self.vector) {
            return Err(format!("vector must be 1 to {max}, got {}", self.vector));
        }
        if !(fits(m, n) && fits(m, k) && fits(k, n)) {
            return Err(format!(
                "dot blocks {m}x{n}x{k} make tiles of more than {max} elements"
            ));
        }
        if let Some(Packing {
            blocking: [mr, nr, mc, kc],
            units,
            copy_depth,
            narrow,
            balance,
            ..
        }) = self.packed
            && !(units >= 1
                && balance >= 1
                && copy_depth >= 1
                && narrow.is_none_or(|[r, c]| fits(r, c))
                && fits(mr, nr)
                && fits(kc, nr)
                && fits(mc, nr)
                && fits(mr, kc)
                && mc.is_multiple_of(mr))
        {
            return Err(format!(
                "packed blocking {mr}x{nr}x{mc}x{kc} is not a valid blocking"
            ));
        }
        Ok(())
    }

    /// The tile passes run after the conversion, in order: staged
    /// products (a GPU's) need barriers; on a CPU, work on weights alone
    /// moves into the preparer.
    pub fn tile_pipeline(&self) -> &'static str {
        if self.stage_shared {
            dlc_tile::transforms::GPU_PIPELINE
        } else {
            dlc_tile::transforms::CPU_PIPELINE
        }
    }

    /// What `target` takes: on a CPU, four vectors of f32 per tile and the
    /// packed kernel's register tile and depth (`mr x nr`, `kc`); on a GPU,
    /// a tile of one element per thread of a 256-thread block and
    /// 64 x 64 x 32 blocks staged through shared memory.
    pub fn for_target(target: &TargetDesc) -> ScheduleParams {
        let g = target.gemm_blocking(DType::F32);
        match target.gpu() {
            Some(gpu) => ScheduleParams {
                vector: 256.min(gpu.max_threads_per_block),
                dot: [g.mr, g.nr, g.kc],
                stage_shared: true,
                packed: None,
            },
            None => ScheduleParams {
                vector: 4 * target.lanes(DType::F32),
                dot: [g.mr, g.nr, g.kc],
                stage_shared: false,
                packed: Some(Packing {
                    blocking: [g.mr, g.nr, g.mc, g.kc],
                    min_macs: target.min_packed_macs(),
                    units: g.min_units,
                    copy_depth: g.lanes,
                    narrow: (g.nr > g.lanes).then_some([g.narrow_mr, g.narrow_n]),
                    balance: 2,
                    l1_sets: target.cpu().map_or(0, |c| c.l1_sets),
                    l2_bytes: target.cpu().map_or(0, |c| c.l2_bytes),
                    unroll: 2,
                }),
            },
        }
    }
}

/// Converts every function of a verified loop module with the schedule
/// parameters of `target`.
pub fn convert_module(m: &LModule, target: &TargetDesc) -> Result<Module, TileConvError> {
    convert_module_with(m, &ScheduleParams::for_target(target))
}

/// Converts every function of a verified loop module with the given
/// schedule parameters (a target's, or a search's), then runs the tile
/// passes the target runs after the conversion
/// ([`ScheduleParams::tile_pipeline`]).
pub fn convert_module_with(m: &LModule, params: &ScheduleParams) -> Result<Module, TileConvError> {
    let mut tiled = schedule_module(m, params)?;
    let pipeline = dlc_core::Pipeline::parse(params.tile_pipeline())
        .map_err(|e| TileConvError::Pass(e.to_string()))?;
    let passes = dlc_tile::transforms::registry()
        .build(&pipeline)
        .map_err(|e| TileConvError::Pass(e.to_string()))?;
    for mut pass in passes {
        pass.run(&mut tiled)
            .map_err(|e| TileConvError::Pass(e.to_string()))?;
    }
    Ok(tiled)
}

/// The conversion alone (`convert-loop-to-tile`): each nest of each
/// function scheduled as kernels, no tile pass run after.
pub fn schedule_module(m: &LModule, params: &ScheduleParams) -> Result<Module, TileConvError> {
    let functions = m
        .functions
        .iter()
        .map(|f| Conv::new(f, params).function())
        .collect::<Result<_, _>>()?;
    Ok(Module { functions })
}

fn tile_buffer(t: &LBufferType) -> BufferType {
    BufferType {
        layout: t.clone(),
        space: Space::Global,
    }
}

fn loop_bounds(kind: &L) -> Option<(i64, i64, i64)> {
    match *kind {
        L::For { lo, hi, step } => Some((lo, hi, step)),
        L::Parallel { lo, hi } => Some((lo, hi, 1)),
        _ => None,
    }
}

fn is_parallel(kind: &L) -> bool {
    matches!(kind, L::Parallel { .. })
}

/// The blocks of a packed product (see [`Conv::pack_plan`]).
#[derive(Clone, Copy, Debug)]
struct PackPlan {
    mr: usize,
    nr: usize,
    mc: usize,
    kc: usize,
    /// Depth of one copied tile.
    kk: usize,
    /// Slices of the depth, and panels of the columns.
    kb_n: usize,
    /// `mr`-row strips of a block of rows.
    strips: usize,
    blocks: usize,
    chunks: usize,
    per_chunk: usize,
    /// Panels of the packed operand (whole chunks).
    nb_n: usize,
    ragged: bool,
    unroll: usize,
    l1_sets: usize,
}

impl PackPlan {
    fn schedule(&self) -> Schedule {
        self.pack_schedule(None)
    }

    /// The schedule of a kernel packing `operand` for this product
    /// (`None`: the product itself).
    fn pack_schedule(&self, operand: Option<PackedOperand>) -> Schedule {
        Schedule::Packed {
            blocking: [self.mr, self.nr, self.mc, self.kc],
            pack: operand,
        }
    }
}

/// Where a packed product's programs read the right operand's panels.
#[derive(Clone, Copy, Debug)]
enum Panels {
    /// From the operand itself.
    InPlace,
    /// Each program copies the slice of a panel it multiplies into scratch.
    Own,
    /// From a global buffer a pack kernel filled.
    Global(Value),
}

/// A buffer of the loop function held, inside a fused kernel, by a scratch
/// buffer of the program: the scratch buffer, and for each of its axes the
/// buffer's axis it takes and the first index along it (the buffer's other
/// axes are the program's: indexed by the batch).
#[derive(Clone, Debug)]
struct Redirect {
    scratch: Value,
    axes: Vec<(usize, Affine)>,
}

/// Top-level nests run as one kernel.
#[derive(Clone, Debug)]
enum Fusion {
    /// Attention's products and softmax, over blocks of rows.
    Rows(RowFusion),
    /// A Winograd convolution's transforms and products, over blocks of
    /// tile rows.
    Winograd(WinogradFusion),
}

/// Three top-level nests run as one kernel over blocks of rows (see
/// [`Conv::row_fusion`]).
#[derive(Clone, Debug)]
struct RowFusion {
    /// The batch loop of each nest (none without a batch).
    batches: [Option<LOpId>; 3],
    /// The two products.
    products: [LOpId; 2],
    /// The row nest's loop over rows.
    rows: LOpId,
    /// S and P: held in scratch memory, never in their own buffers.
    held: [LValue; 2],
    /// Those of S and P whose allocation nothing else uses: not made.
    elided: Vec<LValue>,
}

/// An im2col buffer that a packed product's programs read from the
/// convolution's input instead (see [`Conv::implicit_im2col`]).
#[derive(Clone, Debug)]
struct Im2col {
    input: LValue,
    col: LValue,
    channels: usize,
    /// `[KH, KW]`.
    kernel: [usize; 2],
    stride: [i64; 2],
    padding: [i64; 2],
    /// Output columns.
    ox: usize,
    /// Panels per group of whole output rows, and the rows of a group.
    group: usize,
    rows: i64,
}

/// A reduction carried by an innermost loop: the carried argument is read
/// once, by `combine`, whose result is yielded in its place.
#[derive(Clone, Copy)]
struct Carry {
    kind: ReduceKind,
    op: BinaryOp,
    /// The combining op in the body.
    combine: LOpId,
}

struct Conv<'a> {
    src: &'a LFunction,
    params: &'a ScheduleParams,
    b: Builder,
    /// Buffers: parameters, allocations, views.
    buffers: HashMap<LValue, Value>,
    /// Loop counters: as affine expressions of tile indices and coordinates.
    index: HashMap<LValue, Affine>,
    /// Scalars and tiles.
    values: HashMap<LValue, Value>,
    /// The shape of the tiles of the region being converted (empty: scalar
    /// code) and its mask.
    shape: Vec<usize>,
    mask: Option<Value>,
    /// Scalars splatted to `shape` in the current region.
    splats: HashMap<LValue, Value>,
    /// Top-level ops defining constants (re-created where used).
    consts: HashMap<LValue, (f64, DType)>,
    /// Each view's source buffer (views alias their source's storage).
    view_of: HashMap<LValue, LValue>,
    /// Buffers held by a program's scratch memory in a fused kernel.
    redirects: HashMap<LValue, Redirect>,
    /// Products whose right operand, an im2col buffer, their programs copy
    /// from the convolution's input.
    convs: HashMap<LOpId, Im2col>,
    /// Buffers (roots) whose elements depend on weights alone: weight
    /// parameters, and buffers written only by top-level nests that read
    /// only such buffers (see [`Conv::find_weight_derived`]).
    weight_derived: HashSet<LValue>,
    /// While a packed product's programs are emitted: where they read the
    /// left operand's strips.
    strips: Strips,
    /// While a fused kernel's second product is emitted: the scratch
    /// `[mc]` buffer of factors its result rows are scaled by (the rows
    /// of P it read were left unscaled).
    row_factors: Option<Value>,
}

/// What a packed product's epilogue needs once its block is computed (see
/// [`Conv::epilogue`]).
#[derive(Clone, Debug)]
struct Epilogue {
    m: LOpId,
    /// The program's `[rows, panels * nr]` block of sums.
    block: Value,
    /// The block's first row and first panel.
    i0: Affine,
    nb0: Affine,
    rows: usize,
    panels: usize,
    nr: usize,
}

/// Where a packed product's programs read strips of the left operand.
#[derive(Clone, Debug)]
enum Strips {
    /// Packed by each program into scratch memory, slice by slice.
    Own,
    /// From the global buffer a kernel packed them all into, at the
    /// program's block of rows.
    Global(Value, Affine),
    /// From the operand itself, contiguous along the depth (in a fused
    /// kernel, rows that are in cache already: a column of `mr` rows is
    /// `mr` loads off one address register, as cheap as from a packed
    /// strip).
    InPlace,
}

impl<'a> Conv<'a> {
    fn new(src: &'a LFunction, params: &'a ScheduleParams) -> Self {
        let mut c = Conv {
            src,
            params,
            b: Builder::new(src.name.clone()),
            buffers: HashMap::new(),
            index: HashMap::new(),
            values: HashMap::new(),
            shape: vec![],
            mask: None,
            splats: HashMap::new(),
            consts: HashMap::new(),
            view_of: src
                .ops
                .iter()
                .filter(|o| matches!(o.kind, L::View))
                .filter_map(|o| Some((*o.results.first()?, *o.operands.first()?)))
                .collect(),
            redirects: HashMap::new(),
            convs: HashMap::new(),
            weight_derived: HashSet::new(),
            strips: Strips::Own,
            row_factors: None,
        };
        c.weight_derived = c.find_weight_derived();
        c
    }

    /// Roots of the buffers the ops `ops` (and ops nested in them) load
    /// from (`reads`) and store to (`writes`); a product reads its two
    /// operands.
    fn accessed_roots(
        &self,
        ops: &[LOpId],
        reads: &mut HashSet<LValue>,
        writes: &mut HashSet<LValue>,
    ) {
        for &id in ops {
            let op = self.op(id);
            match &op.kind {
                L::Load { .. } => reads.extend(op.operands.first().map(|&b| self.root_buffer(b))),
                L::Store { .. } => writes.extend(op.operands.get(1).map(|&b| self.root_buffer(b))),
                L::Matmul(_) => {
                    reads.extend(op.operands.iter().take(2).map(|&b| self.root_buffer(b)))
                }
                _ => {}
            }
            for r in &op.regions {
                self.accessed_roots(&r.ops, reads, writes);
            }
        }
    }

    /// The buffers (roots) whose elements depend on weights alone: the
    /// weight parameters nothing writes, and every allocation all of whose
    /// writers are top-level nests that read only such buffers (found to a
    /// fixed point, so chains of them count). Products by them pack their
    /// panels with a kernel of their own, which the preparer runs once.
    fn find_weight_derived(&self) -> HashSet<LValue> {
        let f = self.src;
        if f.weights.is_empty() {
            return HashSet::new();
        }
        let top = &f.body.ops;
        let access: Vec<(HashSet<LValue>, HashSet<LValue>)> = top
            .iter()
            .map(|&id| {
                let (mut r, mut w) = (HashSet::new(), HashSet::new());
                self.accessed_roots(&[id], &mut r, &mut w);
                (r, w)
            })
            .collect();
        let written: HashSet<LValue> = access.iter().flat_map(|a| a.1.iter().copied()).collect();
        let mut derived: HashSet<LValue> = f
            .params
            .iter()
            .enumerate()
            .filter(|(i, (_, v))| f.weights.contains(i) && !written.contains(v))
            .map(|(_, (_, v))| *v)
            .collect();
        let allocated: HashSet<LValue> = top
            .iter()
            .filter(|&&id| matches!(f.op(id).kind, L::Alloc))
            .filter_map(|&id| f.op(id).results.first().copied())
            .collect();
        loop {
            let grown: Vec<LValue> = allocated
                .iter()
                .filter(|b| !derived.contains(b))
                .filter(|b| {
                    let mut writers = access.iter().filter(|a| a.1.contains(b)).peekable();
                    writers.peek().is_some()
                        && writers.all(|(r, _)| r.iter().all(|v| derived.contains(v) || v == *b))
                })
                .copied()
                .collect();
            if grown.is_empty() {
                return derived;
            }
            derived.extend(grown);
        }
    }

    /// The buffer a view ultimately aliases.
    fn root_buffer(&self, mut v: LValue) -> LValue {
        while let Some(&source) = self.view_of.get(&v) {
            v = source;
        }
        v
    }

    fn invalid(&self, what: impl Into<String>) -> TileConvError {
        TileConvError::Invalid(self.src.name.clone(), what.into())
    }

    fn op(&self, id: LOpId) -> &'a dlc_loop::OpData {
        let src: &'a LFunction = self.src;
        src.op(id)
    }

    /// Product `m` and its sizes and indices.
    fn contraction(
        &self,
        m: LOpId,
    ) -> Result<(&'a dlc_loop::OpData, &'a dlc_loop::Contraction), TileConvError> {
        let op = self.op(m);
        match &op.kind {
            L::Matmul(c) => Ok((op, c)),
            _ => Err(self.invalid("not a contraction")),
        }
    }

    fn function(mut self) -> Result<dlc_tile::Function, TileConvError> {
        let n = self.src.params.len();
        for (i, (name, v)) in self.src.params.iter().enumerate() {
            let LType::Buffer(t) = self.src.ty(*v) else {
                return Err(self.invalid(format!("parameter %{name} is not a buffer")));
            };
            let tv = self
                .b
                .param(name.clone(), tile_buffer(t), i + self.src.outputs >= n);
            self.buffers.insert(*v, tv);
        }
        self.b.set_weights(self.src.weights.clone());
        let top: Vec<LOpId> = self.src.body.ops.clone();
        for &id in &top {
            if let L::Const(c) = self.op(id).kind {
                let d = match self.src.ty(self.op(id).results[0]) {
                    LType::Scalar(d) => *d,
                    _ => DType::F32,
                };
                self.consts.insert(self.op(id).results[0], (c, d));
            }
        }
        let cuts = self.cut_points(&top);
        // Nests fused into one kernel over blocks of rows, at the first
        // nest's index with the last one's; the top-level ops the fused
        // kernels and implicit im2col buffers replace; and the buffers no
        // kernel needs any more, never allocated.
        let mut fusions: HashMap<usize, (Fusion, usize)> = HashMap::new();
        let mut skipped: HashSet<usize> = HashSet::new();
        let mut elided: HashSet<LValue> = HashSet::new();
        if self.params.packed.is_some() {
            let mut i = 0;
            while i < top.len() {
                if let Some((f, last)) = self.row_fusion(&top, i, &cuts) {
                    skipped.extend(i + 1..=last);
                    elided.extend(f.elided.iter().copied());
                    fusions.insert(i, (Fusion::Rows(f), last));
                    i = last + 1;
                } else if let Some((f, last)) = self.winograd_fusion(&top, i, &cuts) {
                    skipped.extend(i + 1..=last);
                    elided.extend(f.held);
                    fusions.insert(i, (Fusion::Winograd(f), last));
                    i = last + 1;
                } else {
                    i += 1;
                }
            }
            // im2col nests whose product copies its panels from the input:
            // no kernel, no buffer.
            for i in 0..top.len() {
                if fusions.contains_key(&i) || skipped.contains(&i) {
                    continue;
                }
                if let Some((conv, k)) = self.implicit_im2col(&top, i, &cuts)
                    && !skipped.contains(&k)
                    && !fusions.contains_key(&k)
                {
                    let [m] = self.op(top[k]).regions[0].ops[..] else {
                        continue;
                    };
                    skipped.insert(i);
                    elided.insert(conv.col);
                    self.convs.insert(m, conv);
                }
            }
        }
        let mut serial: Vec<LOpId> = vec![];
        let mut deferred: Vec<LOpId> = vec![];
        for (i, &id) in top.iter().enumerate() {
            let op = self.op(id);
            let elided_buffer = match op.kind {
                L::Alloc => op.results.first().is_some_and(|r| elided.contains(r)),
                L::Dealloc => op.operands.first().is_some_and(|v| elided.contains(v)),
                _ => false,
            };
            if elided_buffer || skipped.contains(&i) {
                continue;
            }
            if let Some((f, last)) = fusions.get(&i) {
                self.flush(&mut serial, &mut deferred)?;
                for &inside in &top[i + 1..=*last] {
                    let a = self.op(inside);
                    if matches!(a.kind, L::Alloc | L::View)
                        && !a.results.iter().any(|r| elided.contains(r))
                    {
                        self.host_op(inside)?;
                    }
                }
                self.b.set_loc(op.loc.clone());
                match f {
                    Fusion::Rows(f) => self.fused_rows_kernel(f)?,
                    Fusion::Winograd(f) => self.fused_winograd_kernel(f)?,
                }
                for d in std::mem::take(&mut deferred) {
                    self.host_op(d)?;
                }
                continue;
            }
            match &op.kind {
                L::Return => {}
                L::Alloc | L::Global(_) | L::View => self.host_op(id)?,
                L::Dealloc => deferred.push(id),
                L::Const(_) => {}
                kind if (is_parallel(kind) || matches!(kind, L::Matmul(_)))
                    && cuts[i]
                    && cuts[i + 1] =>
                {
                    self.flush(&mut serial, &mut deferred)?;
                    self.b.set_loc(op.loc.clone());
                    self.parallel_kernel(id)?;
                    for d in std::mem::take(&mut deferred) {
                        self.host_op(d)?;
                    }
                }
                _ => serial.push(id),
            }
        }
        self.flush(&mut serial, &mut deferred)?;
        let mut f = self.b.finish();
        dlc_tile::transforms::dce(&mut f);
        Ok(f)
    }

    /// `cuts[i]`: whether no scalar defined by a top-level op before `i`
    /// (constants aside, which are re-created where used) is used at or
    /// after `i`, so a kernel may start there.
    fn cut_points(&self, top: &[LOpId]) -> Vec<bool> {
        let mut last_use: HashMap<LValue, usize> = HashMap::new();
        for (i, &id) in top.iter().enumerate() {
            let mut used = vec![];
            collect_uses(self.src, id, &mut used);
            for v in used {
                last_use.insert(v, i);
            }
        }
        let mut cuts = vec![true; top.len() + 1];
        for (i, &id) in top.iter().enumerate() {
            let op = self.op(id);
            if matches!(op.kind, L::Const(_)) {
                continue;
            }
            for r in &op.results {
                if matches!(self.src.ty(*r), LType::Buffer(_)) {
                    continue;
                }
                if let Some(&last) = last_use.get(r) {
                    for c in cuts.iter_mut().take(last + 1).skip(i + 1) {
                        *c = false;
                    }
                }
            }
        }
        cuts
    }

    fn host_op(&mut self, id: LOpId) -> Result<(), TileConvError> {
        let op = self.op(id);
        // An allocation's failure names the op it holds the result of.
        self.b.set_loc(op.loc.clone());
        match &op.kind {
            L::Alloc => {
                let LType::Buffer(t) = self.src.ty(op.results[0]) else {
                    return Err(self.invalid("alloc of a non-buffer"));
                };
                let v = self.b.alloc(tile_buffer(t));
                self.buffers.insert(op.results[0], v);
            }
            L::Global(values) => {
                let LType::Buffer(t) = self.src.ty(op.results[0]) else {
                    return Err(self.invalid("global of a non-buffer"));
                };
                let v = self.b.global(values.clone(), tile_buffer(t));
                self.buffers.insert(op.results[0], v);
            }
            L::View => {
                let LType::Buffer(t) = self.src.ty(op.results[0]) else {
                    return Err(self.invalid("view of a non-buffer"));
                };
                let from = self.buffer(op.operands[0])?;
                let v = self.b.view(from, tile_buffer(t));
                self.buffers.insert(op.results[0], v);
            }
            L::Dealloc => {
                let b = self.buffer(op.operands[0])?;
                self.b.dealloc(b);
            }
            _ => return Err(self.invalid(format!("{} at the host level", op.kind.name()))),
        }
        Ok(())
    }

    /// Emits the pending top-level ops as one program, then the deferred
    /// deallocations.
    fn flush(
        &mut self,
        serial: &mut Vec<LOpId>,
        deferred: &mut Vec<LOpId>,
    ) -> Result<(), TileConvError> {
        if !serial.is_empty() {
            let ops = std::mem::take(serial);
            self.b.set_loc(self.op(ops[0]).loc.clone());
            let schedule = Schedule::Serial {
                vector: self.params.vector,
            };
            self.b.begin_kernel(vec![1], schedule);
            self.values.clear();
            self.ops(&ops)?;
            self.b.end_kernel();
        }
        for d in std::mem::take(deferred) {
            self.host_op(d)?;
        }
        Ok(())
    }

    /// The tile buffer and index of an access to loop buffer `v` at
    /// `index`: the buffer's own, or its program's scratch buffer in a fused
    /// kernel.
    fn place(&self, v: LValue, index: Vec<Affine>) -> Result<(Value, Vec<Affine>), TileConvError> {
        match self.redirects.get(&v) {
            None => Ok((self.buffer(v)?, index)),
            Some(r) => {
                let at = r
                    .axes
                    .iter()
                    .map(|(axis, first)| {
                        index
                            .get(*axis)
                            .map(|e| e.plus_scaled(-1, first))
                            .ok_or_else(|| self.invalid("a fused buffer indexed on too few axes"))
                    })
                    .collect::<Result<_, _>>()?;
                Ok((r.scratch, at))
            }
        }
    }

    fn buffer(&self, v: LValue) -> Result<Value, TileConvError> {
        self.buffers
            .get(&v)
            .copied()
            .ok_or_else(|| self.invalid(format!("buffer value {} is not defined", v.0)))
    }

    /// A top-level parallel nest or contraction as its own kernel.
    fn parallel_kernel(&mut self, root: LOpId) -> Result<(), TileConvError> {
        self.values.clear();
        // A nest with an empty loop in its band does nothing: no kernel (a
        // grid has at least one program).
        let mut at = root;
        while let Some((lo, hi, _)) = loop_bounds(&self.op(at).kind) {
            if hi <= lo {
                return Ok(());
            }
            match self.op(at).regions[0].ops.as_slice() {
                [inner] if is_parallel(&self.op(*inner).kind) => at = *inner,
                _ => break,
            }
        }
        // The band of perfectly nested parallel loops.
        let mut band: Vec<LOpId> = vec![];
        let mut at = root;
        loop {
            let op = self.op(at);
            if !is_parallel(&op.kind) || band.len() == 3 {
                break;
            }
            band.push(at);
            match op.regions[0].ops.as_slice() {
                [inner]
                    if is_parallel(&self.op(*inner).kind)
                        || matches!(self.op(*inner).kind, L::Matmul(_)) =>
                {
                    at = *inner
                }
                _ => break,
            }
        }
        let inner_matmul = if band.is_empty() {
            Some(root)
        } else {
            let last = self.op(*band.last().unwrap_or(&root));
            match last.regions[0].ops.as_slice() {
                [m] if matches!(self.op(*m).kind, L::Matmul(_))
                    && (band.len() < 2
                        || band.len() == 2 && self.packs(*m) && self.narrow(*m).is_none()) =>
                {
                    Some(*m)
                }
                _ => None,
            }
        };
        if let Some(m) = inner_matmul {
            if band.len() <= 2 && self.packs(m) {
                if let Some(tile) = self.narrow(m) {
                    return self.narrow_kernels(&band, m, tile);
                }
                return self.packed_dot(&band, m);
            }
            return self.dot_kernel(&band, m);
        }
        let last = *band.last().ok_or_else(|| self.invalid("empty band"))?;
        if band.len() == 1
            && let Some(inner) = self.short_rows(last)
        {
            return self.short_rows_kernel(last, inner);
        }
        let last_op = self.op(last);
        let straight = last_op.regions[0].ops.iter().all(|o| {
            loop_bounds(&self.op(*o).kind).is_none() && !matches!(self.op(*o).kind, L::Matmul(_))
        });
        let blocked = straight && self.vectorizable(last).is_some();
        let mut grid = vec![];
        for &l in &band {
            let (lo, hi, _) = loop_bounds(&self.op(l).kind).unwrap_or((0, 1, 1));
            let n = (hi - lo).max(0) as usize;
            if l == last && blocked {
                let w = self.params.vector.min(n.max(1));
                grid.push(n.div_ceil(w).max(1));
            } else {
                grid.push(n.max(1));
            }
        }
        let vector = self.params.vector;
        let schedule = if blocked {
            Schedule::Blocked { vector, tile: None }
        } else {
            Schedule::Rows { vector }
        };
        self.b.begin_kernel(grid.clone(), schedule);
        for (axis, &l) in band.iter().enumerate() {
            let op = self.op(l);
            let (lo, hi, _) = loop_bounds(&op.kind).unwrap_or((0, 1, 1));
            let pid = self.b.program_id(axis);
            let counter = op.regions[0].args[0];
            if l == last && blocked {
                let n = (hi - lo).max(0) as usize;
                let w = self.params.vector.min(n.max(1));
                let base = Affine::value(pid)
                    .scaled(w as i64)
                    .plus_scaled(1, &Affine::constant(lo));
                self.index
                    .insert(counter, base.plus_scaled(1, &Affine::axis(0)));
                self.shape = vec![w];
                self.mask = (!n.is_multiple_of(w)).then(|| {
                    let limit =
                        Affine::constant(n as i64).plus_scaled(-(w as i64), &Affine::value(pid));
                    self.b.mask(vec![limit], &[w])
                });
                self.splats.clear();
            } else {
                self.index.insert(
                    counter,
                    Affine::value(pid).plus_scaled(1, &Affine::constant(lo)),
                );
            }
        }
        let body = &self.op(last).regions[0];
        let result = self.ops(&body.ops);
        self.shape.clear();
        self.mask = None;
        self.splats.clear();
        result?;
        self.b.end_kernel();
        Ok(())
    }

    /// For a parallel loop `outer` whose body is one loop over rows shorter
    /// than a tile (`vector` iterations) with a straight-line body, that
    /// loop: such rows are better taken several at a time, as 2-D tiles.
    /// Every store must write distinct places for distinct `(i, j)`: each
    /// index dimension uses at most one of the two counters, and both
    /// appear.
    fn short_rows(&self, outer: LOpId) -> Option<LOpId> {
        let op = self.op(outer);
        let [inner] = op.regions[0].ops.as_slice() else {
            return None;
        };
        let inner_op = self.op(*inner);
        let (lo, hi, step) = loop_bounds(&inner_op.kind)?;
        let (i, j) = (op.regions[0].args[0], inner_op.regions[0].args[0]);
        let straight = inner_op.regions[0].ops.iter().all(|o| {
            loop_bounds(&self.op(*o).kind).is_none() && !matches!(self.op(*o).kind, L::Matmul(_))
        });
        if step != 1
            || !inner_op.operands.is_empty()
            || (hi - lo) as usize >= self.params.vector
            || !straight
            || self.vectorizable(*inner).is_none_or(|c| !c.is_empty())
        {
            return None;
        }
        let separable = inner_op.regions[0]
            .ops
            .iter()
            .all(|o| match &self.op(*o).kind {
                L::Store { index } => {
                    let uses =
                        |e: &IndexExpr, v: LValue| e.terms.iter().any(|t| t.1 == v && t.0 != 0);
                    index.iter().all(|e| !(uses(e, i) && uses(e, j)))
                        && index.iter().any(|e| uses(e, i))
                        && index.iter().any(|e| uses(e, j))
                }
                _ => true,
            });
        separable.then_some(*inner)
    }

    /// Rows `outer` x `inner` as `r x c` tiles: `c` the whole (short) row,
    /// `r` rows so that a tile holds about `vector` elements; one program
    /// per block of rows.
    fn short_rows_kernel(&mut self, outer: LOpId, inner: LOpId) -> Result<(), TileConvError> {
        let (o, n) = (self.op(outer), self.op(inner));
        let (ilo, ihi, _) = loop_bounds(&o.kind).unwrap_or((0, 1, 1));
        let (jlo, jhi, _) = loop_bounds(&n.kind).unwrap_or((0, 1, 1));
        let (rows, c) = ((ihi - ilo).max(1) as usize, (jhi - jlo).max(1) as usize);
        let r = (self.params.vector / c).clamp(1, rows);
        let schedule = Schedule::Blocked {
            vector: self.params.vector,
            tile: Some([r, c]),
        };
        self.b.begin_kernel(vec![rows.div_ceil(r)], schedule);
        let pid = self.b.program_id(0);
        let row0 = Affine::value(pid)
            .scaled(r as i64)
            .plus_scaled(1, &Affine::constant(ilo));
        self.index
            .insert(o.regions[0].args[0], row0.plus_scaled(1, &Affine::axis(0)));
        self.index.insert(
            n.regions[0].args[0],
            Affine::constant(jlo).plus_scaled(1, &Affine::axis(1)),
        );
        self.shape = vec![r, c];
        self.splats.clear();
        self.mask = (!rows.is_multiple_of(r)).then(|| {
            let left = Affine::constant(rows as i64).plus_scaled(-(r as i64), &Affine::value(pid));
            self.b.mask(vec![left, Affine::constant(c as i64)], &[r, c])
        });
        let result = self.ops(&n.regions[0].ops);
        self.shape.clear();
        self.mask = None;
        self.splats.clear();
        result?;
        self.b.end_kernel();
        Ok(())
    }

    /// Whether the innermost loop `id` can run as tiles: its reductions,
    /// or `None`.
    fn vectorizable(&self, id: LOpId) -> Option<Vec<Carry>> {
        let op = self.op(id);
        let (_, _, step) = loop_bounds(&op.kind)?;
        if step != 1 {
            return None;
        }
        let body = &op.regions[0];
        let counter = body.args[0];
        let mut stored: HashSet<LValue> = HashSet::new();
        let mut loaded: HashSet<LValue> = HashSet::new();
        // Every access: the buffer value and its index.
        let mut accesses: Vec<(LValue, &[IndexExpr])> = Vec::new();
        for &o in &body.ops {
            let d = self.op(o);
            match &d.kind {
                L::Store { index } => {
                    let distinct = index
                        .iter()
                        .any(|e| e.terms.iter().any(|t| t.1 == counter && t.0 != 0));
                    if !distinct {
                        return None;
                    }
                    stored.insert(d.operands[1]);
                    accesses.push((d.operands[1], index));
                }
                L::Load { index, pad } => {
                    loaded.insert(d.operands[0]);
                    // A padded load reads past the edges, where no store
                    // writes: never an in-place access.
                    if pad.is_none() {
                        accesses.push((d.operands[0], index));
                    } else {
                        accesses.push((d.operands[0], &[]));
                    }
                }
                L::For { .. } | L::Parallel { .. } | L::Matmul(_) => {
                    return None;
                }
                _ => {}
            }
        }
        // Views alias: compare storage roots. A buffer both read and
        // written is updated in place only when every access of it is
        // through one value at one index (each iteration reads and writes
        // its own elements, which a vector of iterations keeps).
        let root = |v: LValue| self.root_buffer(v);
        let stored: HashSet<LValue> = stored.into_iter().map(root).collect();
        let loaded: HashSet<LValue> = loaded.into_iter().map(root).collect();
        for r in stored.intersection(&loaded) {
            let mut of_r = accesses.iter().filter(|(v, _)| root(*v) == *r);
            let first = of_r.next();
            if of_r.any(|a| Some(a) != first) {
                return None;
            }
        }
        let carried = &body.args[1..];
        let yield_op = body.ops.last().map(|o| self.op(*o));
        let mut carries = vec![];
        for (k, &c) in carried.iter().enumerate() {
            let users: Vec<LOpId> = body
                .ops
                .iter()
                .copied()
                .filter(|o| self.op(*o).operands.contains(&c))
                .collect();
            let [user] = users.as_slice() else {
                return None;
            };
            let u = self.op(*user);
            let (kind, bop) = match u.kind {
                L::Binary(b @ BinaryOp::Add) => (ReduceKind::Sum, b),
                L::Binary(b @ BinaryOp::Mul) => (ReduceKind::Prod, b),
                L::Binary(b @ BinaryOp::Max) => (ReduceKind::Max, b),
                L::Binary(b @ BinaryOp::Min) => (ReduceKind::Min, b),
                _ => return None,
            };
            if u.operands[0] == u.operands[1]
                || yield_op.is_none_or(|y| {
                    !matches!(y.kind, L::Yield) || y.operands.get(k) != Some(&u.results[0])
                })
            {
                return None;
            }
            // The partial result is only yielded.
            let used_elsewhere = body
                .ops
                .iter()
                .filter(|o| self.op(**o).operands.contains(&u.results[0]))
                .count()
                != 1;
            if used_elsewhere {
                return None;
            }
            carries.push(Carry {
                kind,
                op: bop,
                combine: *user,
            });
        }
        Some(carries)
    }

    /// Converts a list of ops in the current region.
    fn ops(&mut self, ops: &[LOpId]) -> Result<(), TileConvError> {
        for &id in ops {
            self.b.set_loc(self.op(id).loc.clone());
            self.op_in_program(id)?;
        }
        Ok(())
    }

    fn affine(&self, e: &IndexExpr) -> Result<Affine, TileConvError> {
        let mut out = Affine::constant(e.constant);
        for &(c, v) in &e.terms {
            let a = self.index.get(&v).ok_or_else(|| {
                self.invalid(format!("index value {} has no tile counterpart", v.0))
            })?;
            out = out.plus_scaled(c, a);
        }
        Ok(out)
    }

    /// The tile counterpart of a scalar: computed in this program, or a
    /// constant re-created here.
    fn scalar(&mut self, v: LValue) -> Result<Value, TileConvError> {
        if let Some(&t) = self.values.get(&v) {
            return Ok(t);
        }
        if let Some(&(c, d)) = self.consts.get(&v) {
            let t = self.b.constant(c, Type::Scalar(d));
            self.values.insert(v, t);
            return Ok(t);
        }
        Err(self.invalid(format!("value {} is used before it is computed", v.0)))
    }

    fn is_tile(&self, t: Value) -> bool {
        matches!(self.b.ty(t), Type::Tile(_))
    }

    /// The counterpart of `v` as a tile of the region's shape.
    fn as_tile(&mut self, v: LValue) -> Result<Value, TileConvError> {
        let t = self.scalar(v)?;
        if self.is_tile(t) || self.shape.is_empty() {
            return Ok(t);
        }
        if let Some(&s) = self.splats.get(&v) {
            return Ok(s);
        }
        let shape = self.shape.clone();
        let s = self.b.splat(t, &shape);
        self.splats.insert(v, s);
        Ok(s)
    }

    /// Operands of an element-wise op: all tiles when any is, else scalars.
    fn elementwise_operands(&mut self, vs: &[LValue]) -> Result<Vec<Value>, TileConvError> {
        let direct: Vec<Value> = vs
            .iter()
            .map(|v| self.scalar(*v))
            .collect::<Result<_, _>>()?;
        if direct.iter().any(|t| self.is_tile(*t)) {
            vs.iter().map(|v| self.as_tile(*v)).collect()
        } else {
            Ok(direct)
        }
    }

    fn result_dtype(&self, v: LValue) -> DType {
        match self.src.ty(v) {
            LType::Scalar(d) => *d,
            _ => DType::F32,
        }
    }

    fn op_in_program(&mut self, id: LOpId) -> Result<(), TileConvError> {
        let op = self.op(id);
        let r = op.results.first().copied();
        let set = |c: &mut Self, t: Value| {
            if let Some(r) = r {
                c.values.insert(r, t);
            }
        };
        match &op.kind {
            L::Const(v) => {
                let t = self
                    .b
                    .constant(*v, Type::Scalar(self.result_dtype(op.results[0])));
                set(self, t);
            }
            L::Unary(u) => {
                let x = self.elementwise_operands(&op.operands)?;
                let t = self.b.unary(*u, x[0]);
                set(self, t);
            }
            L::Binary(bop) => {
                let mut x = self.elementwise_operands(&op.operands)?;
                // A masked-off lane must not divide by zero.
                if *bop == BinaryOp::Div
                    && self.result_dtype(op.operands[0]).is_int()
                    && let Some(m) = self.mask
                    && self.is_tile(x[1])
                {
                    let one = self.b.constant(1.0, self.b.ty(x[1]).clone());
                    x[1] = self.b.select(m, x[1], one);
                }
                let t = self.b.binary(*bop, x[0], x[1]);
                set(self, t);
            }
            L::Compare(c) => {
                let x = self.elementwise_operands(&op.operands)?;
                let t = self.b.compare(*c, x[0], x[1]);
                set(self, t);
            }
            L::Select => {
                let x = self.elementwise_operands(&op.operands)?;
                let t = self.b.select(x[0], x[1], x[2]);
                set(self, t);
            }
            L::Cast => {
                let x = self.elementwise_operands(&op.operands)?;
                let t = self.b.cast(x[0], self.result_dtype(op.results[0]));
                set(self, t);
            }
            L::Load { index, pad } => {
                let index: Vec<Affine> = index
                    .iter()
                    .map(|e| self.affine(e))
                    .collect::<Result<_, _>>()?;
                let (buf, index) = self.place(op.operands[0], index)?;
                let d = self.result_dtype(op.results[0]);
                let t = if index.iter().any(|e| !e.axes.is_empty()) {
                    let pad = pad.or(self.mask.map(|_| 0.0));
                    let ty = Type::Tile(TileType::new(d, self.shape.clone()));
                    self.b.load(buf, index, self.mask, pad, ty)
                } else {
                    self.b.load(buf, index, None, *pad, Type::Scalar(d))
                };
                set(self, t);
            }
            L::Store { index } => {
                let index: Vec<Affine> = index
                    .iter()
                    .map(|e| self.affine(e))
                    .collect::<Result<_, _>>()?;
                let (buf, index) = self.place(op.operands[1], index)?;
                let tiled = index.iter().any(|e| !e.axes.is_empty());
                let v = if tiled {
                    self.as_tile(op.operands[0])?
                } else {
                    self.scalar(op.operands[0])?
                };
                if self.is_tile(v) && !tiled {
                    return Err(self.invalid("a tile stored at one place"));
                }
                let mask = if tiled { self.mask } else { None };
                self.b.store(v, buf, index, mask);
            }
            L::For { .. } | L::Parallel { .. } => self.loop_in_program(id)?,
            L::Matmul(_) => self.dot_in_program(id)?,
            L::Yield => {}
            L::Alloc | L::Global(_) | L::Dealloc | L::View | L::Return => {
                return Err(self.invalid(format!("{} inside a loop nest", op.kind.name())));
            }
        }
        Ok(())
    }

    fn loop_in_program(&mut self, id: LOpId) -> Result<(), TileConvError> {
        let op = self.op(id);
        let (lo, hi, step) = loop_bounds(&op.kind).unwrap_or((0, 0, 1));
        let body: &'a LBlock = &op.regions[0];
        let innermost = body.ops.iter().all(|o| {
            loop_bounds(&self.op(*o).kind).is_none() && !matches!(self.op(*o).kind, L::Matmul(_))
        });
        if innermost
            && self.shape.is_empty()
            && let Some(carries) = self.vectorizable(id)
        {
            return self.vector_loop(id, lo, hi, carries);
        }
        // A counted loop carrying scalars.
        let inits: Vec<Value> = op
            .operands
            .iter()
            .map(|v| self.scalar(*v))
            .collect::<Result<_, _>>()?;
        let (counter, carried) = self.b.begin_for(lo, hi, step, &inits);
        self.index.insert(body.args[0], Affine::value(counter));
        for (a, c) in body.args[1..].iter().zip(&carried) {
            self.values.insert(*a, *c);
        }
        self.ops(&body.ops)?;
        let next: Vec<Value> = match body.ops.last().map(|o| self.op(*o)) {
            Some(y) if matches!(y.kind, L::Yield) => y
                .operands
                .iter()
                .map(|v| self.scalar(*v))
                .collect::<Result<_, _>>()?,
            _ => vec![],
        };
        let results = self.b.end_for(next);
        for (r, t) in op.results.iter().zip(results) {
            self.values.insert(*r, t);
        }
        Ok(())
    }

    /// An innermost loop as a `tile.for` over blocks of `vector` iterations.
    fn vector_loop(
        &mut self,
        id: LOpId,
        lo: i64,
        hi: i64,
        carries: Vec<Carry>,
    ) -> Result<(), TileConvError> {
        let op = self.op(id);
        let body: &'a LBlock = &op.regions[0];
        let n = (hi - lo).max(0) as usize;
        if n == 0 {
            for (r, init) in op.results.iter().zip(&op.operands) {
                let t = self.scalar(*init)?;
                self.values.insert(*r, t);
            }
            return Ok(());
        }
        let w = self.params.vector.min(n);
        let shape = vec![w];
        let mut inits = vec![];
        for (c, init) in carries.iter().zip(&op.operands) {
            let d = self.result_dtype(*init);
            inits.push(self.b.constant(
                c.kind.identity_in(d),
                Type::Tile(TileType::new(d, shape.clone())),
            ));
        }
        // What a masked-off lane contributes to each reduction.
        let ragged = !n.is_multiple_of(w);
        let idents: Vec<Option<Value>> = carries
            .iter()
            .zip(&inits)
            .map(|(c, init)| {
                let ty = self.b.ty(*init).clone();
                let d = ty.dtype().unwrap_or(DType::F32);
                ragged.then(|| self.b.constant(c.kind.identity_in(d), ty))
            })
            .collect();
        let (counter, carried) = self.b.begin_for(lo, hi, w as i64, &inits);
        self.index.insert(
            body.args[0],
            Affine::value(counter).plus_scaled(1, &Affine::axis(0)),
        );
        self.shape = shape.clone();
        self.splats.clear();
        self.mask = (!n.is_multiple_of(w)).then(|| {
            let limit = Affine::constant(hi).plus_scaled(-1, &Affine::value(counter));
            self.b.mask(vec![limit], &[w])
        });
        let combines: HashMap<LOpId, usize> = carries
            .iter()
            .enumerate()
            .map(|(k, c)| (c.combine, k))
            .collect();
        let mut next = vec![Value(0); carries.len()];
        let result = (|| -> Result<(), TileConvError> {
            for &o in &body.ops {
                self.b.set_loc(self.op(o).loc.clone());
                if let Some(&k) = combines.get(&o) {
                    let d = self.op(o);
                    let x = if d.operands[0] == body.args[1 + k] {
                        d.operands[1]
                    } else {
                        d.operands[0]
                    };
                    let mut x = self.as_tile(x)?;
                    if let (Some(m), Some(ident)) = (self.mask, idents[k]) {
                        x = self.b.select(m, x, ident);
                    }
                    next[k] = self.b.binary(carries[k].op, carried[k], x);
                    continue;
                }
                if matches!(self.op(o).kind, L::Yield) {
                    continue;
                }
                self.op_in_program(o)?;
            }
            Ok(())
        })();
        self.shape.clear();
        self.mask = None;
        self.splats.clear();
        result?;
        let accs = self.b.end_for(next);
        for ((r, init), (c, acc)) in op
            .results
            .iter()
            .zip(&op.operands)
            .zip(carries.iter().zip(accs))
        {
            let part = self.b.reduce(c.kind, 0, acc);
            let init = self.scalar(*init)?;
            let t = self.b.binary(c.op, init, part);
            self.values.insert(*r, t);
        }
        Ok(())
    }

    /// Whether contraction `m` runs on the CPU's packed kernel: operands
    /// of f32, or of f16/bf16 accumulated in f32 (copied into f32 panels
    /// and strips, widened on the way, so the register tile is f32's).
    fn packs(&self, m: LOpId) -> bool {
        let op = self.op(m);
        let (L::Matmul(c), Some(Packing { min_macs, .. })) = (&op.kind, self.params.packed) else {
            return false;
        };
        let floats = op.operands.iter().all(|v| {
            matches!(
                self.operand_dtype(*v),
                Some(DType::F32 | DType::F16 | DType::BF16)
            )
        });
        let macs = c.m.saturating_mul(c.n).saturating_mul(c.k);
        floats
            && self.result_dtype(op.regions[0].args[3]) == DType::F32
            && usize::try_from(macs).is_ok_and(|macs| macs >= min_macs)
    }

    /// The element type of a product's operand buffer.
    fn operand_dtype(&self, v: LValue) -> Option<DType> {
        match self.src.ty(v) {
            LType::Buffer(t) => Some(t.dtype),
            _ => None,
        }
    }

    /// Whether both operands of product `m` are f32 (what reading them in
    /// place, and the fused schedules, take).
    fn f32_operands(&self, m: LOpId) -> bool {
        self.op(m)
            .operands
            .iter()
            .all(|v| self.operand_dtype(*v) == Some(DType::F32))
    }

    /// A `shape` tile of product operand `operand` (buffer `buf` at
    /// `index`) as f32: an f16/bf16 operand is loaded as is and widened.
    fn load_f32(
        &mut self,
        operand: LValue,
        (buf, index): (Value, Vec<Affine>),
        mask: Option<Value>,
        shape: Vec<usize>,
    ) -> Value {
        let dtype = self.operand_dtype(operand).unwrap_or(DType::F32);
        let pad = mask.map(|_| 0.0);
        let t = self.b.load(
            buf,
            index,
            mask,
            pad,
            Type::Tile(TileType::new(dtype, shape)),
        );
        if dtype == DType::F32 {
            t
        } else {
            self.b.cast(t, DType::F32)
        }
    }

    /// A top-level f32 contraction as BLIS computes it on a CPU, with the
    /// packing as IR. A `pack` kernel copies the right operand once into
    /// `kc x nr` panels (zero-padded past its edges). Each program of the
    /// `packed` kernel then takes `mc` rows and a chunk of panels (the
    /// columns are split when there are fewer row blocks than the target's
    /// units of work, so a product of few rows still keeps every thread
    /// busy): for each `kc`-deep slice it packs its rows of the left
    /// operand into `mr`-row strips of scratch memory (transposed: one `mr`
    /// column per step of `k`), and for each panel and strip runs the
    /// register tile, `kc` steps of an `mr x 1` by `1 x nr` `tile.dot`
    /// accumulating into a scratch block of the result; finally the
    /// epilogue runs on the block, one `1 x nr` row of a panel at a time.
    /// Every copy moves
    /// tiles of a few vectors in a `tile.for`, read along the operand's
    /// contiguous axis (and transposed on the way when that is not the
    /// panel's), so no tile is larger than the register tile.
    ///
    /// With two batch loops (`[B, H, M, N]` attention scores), each is a
    /// grid axis of its own and the rows the third: a program takes every
    /// panel of its block of rows (there are `B * H` batches to share
    /// among threads).
    fn packed_dot(&mut self, band: &[LOpId], m: LOpId) -> Result<(), TileConvError> {
        let batch: Vec<(LValue, i64, usize)> = band
            .iter()
            .filter_map(|l| self.batch_loop(Some(*l)))
            .collect();
        let batches = batch.iter().map(|b| b.2).product();
        let plan = self.pack_plan(m, batches, batch.len() < 2)?;
        // The right operand's panels differ only along the batch loops its
        // index reads: a weight shared by every batch is packed once.
        let (_, c) = self.contraction(m)?;
        let reads = |counter: LValue| c.b.iter().any(|e| e.terms.iter().any(|t| t.1 == counter));
        let shared: Vec<bool> = batch.iter().map(|b| !reads(b.0)).collect();
        let panel_batch: Vec<(LValue, i64, usize)> = batch
            .iter()
            .zip(&shared)
            .filter(|(_, s)| !**s)
            .map(|(b, _)| *b)
            .collect();
        let panels = self.panels(m, &panel_batch, &plan)?;
        // With several column chunks per block of rows, every chunk's
        // program would pack the same strips of the left operand: a kernel
        // packs them once (W6's feed-forward products: 8 programs each
        // packed all 128 rows of a 3072-deep operand).
        let strips = (plan.chunks > 2 && batch.is_empty() && !self.convs.contains_key(&m))
            .then(|| self.strips_kernel(m, &plan))
            .transpose()?;
        let mut grid: Vec<usize> = batch.iter().map(|b| b.2).collect();
        grid.push(plan.blocks);
        if batch.len() < 2 {
            grid.push(plan.chunks);
        }
        self.b.begin_kernel(grid, plan.schedule());
        let bat = self.batch_axes(&batch);
        let bat_axes = bat.len();
        let p = self.b.program_id(bat_axes);
        let chunk = if batch.len() < 2 {
            Affine::value(self.b.program_id(bat_axes + 1))
        } else {
            Affine::constant(0)
        };
        let i0 = Affine::value(p).scaled(plan.mc as i64);
        self.strips = match strips {
            Some(buf) => Strips::Global(buf, Affine::value(p)),
            None => Strips::Own,
        };
        let panel_bat: Vec<Affine> = bat
            .iter()
            .zip(&shared)
            .filter(|(_, s)| !**s)
            .map(|(a, _)| a.clone())
            .collect();
        let result = self
            .program_product(m, &plan, panels, &panel_bat, &i0, &chunk)
            .and_then(|e| self.epilogue(&e));
        self.strips = Strips::Own;
        result?;
        self.b.end_kernel();
        if let Panels::Global(panels) = panels {
            self.b.dealloc(panels);
        }
        if let Some(strips) = strips {
            self.b.dealloc(strips);
        }
        Ok(())
    }

    /// The kernel packing product `m`'s left operand into a global
    /// `[block, kb, strip, kc, mr]` buffer of strips (as each program of the
    /// product would into scratch), which it returns.
    fn strips_kernel(&mut self, m: LOpId, plan: &PackPlan) -> Result<Value, TileConvError> {
        let strips = self.b.alloc(BufferType::contiguous(
            DType::F32,
            vec![plan.blocks, plan.kb_n, plan.strips, plan.kc, plan.mr],
            Space::Global,
        ));
        self.b.begin_kernel(
            vec![plan.blocks, plan.kb_n],
            plan.pack_schedule(Some(PackedOperand::Left)),
        );
        let (p, kb) = (self.b.program_id(0), self.b.program_id(1));
        let i0 = Affine::value(p).scaled(plan.mc as i64);
        self.pack_strips(
            m,
            plan,
            kb,
            &i0,
            strips,
            &[Affine::value(p), Affine::value(kb)],
        )?;
        self.b.end_kernel();
        Ok(strips)
    }

    /// Packs slice `kb` of the rows from `i0` of product `m`'s left operand
    /// into `dst[prefix.., strip, k, row]`, strip by strip.
    fn pack_strips(
        &mut self,
        m: LOpId,
        plan: &PackPlan,
        kb: Value,
        i0: &Affine,
        dst: Value,
        prefix: &[Affine],
    ) -> Result<(), TileConvError> {
        let (op, c) = self.contraction(m)?;
        let body: &'a LBlock = &op.regions[0];
        let (iv, kv) = (body.args[0], body.args[2]);
        let (mr, kc, kk) = (plan.mr, plan.kc, plan.kk);
        let (s, _) = self.b.begin_for(0, plan.strips as i64, 1, &[]);
        let (f, _) = self.b.begin_for(0, (kc / kk) as i64, 1, &[]);
        let row0 = i0.plus_scaled(mr as i64, &Affine::value(s));
        let k0 = Affine::value(kb)
            .scaled(kc as i64)
            .plus_scaled(kk as i64, &Affine::value(f));
        let (a_index, limits, shape, [ia, ka]) = self.operand_block(
            op.operands[0],
            &c.a,
            [(iv, row0, c.m, mr), (kv, k0, c.k, kk)],
        )?;
        let placed = self.place(op.operands[0], a_index)?;
        let a_mask = self.b.mask(limits, &shape);
        let ta = self.load_f32(op.operands[0], placed, Some(a_mask), shape);
        let mut at = prefix.to_vec();
        at.extend([
            Affine::value(s),
            Affine::value(f)
                .scaled(kk as i64)
                .plus_scaled(1, &Affine::axis(ka)),
            Affine::axis(ia),
        ]);
        self.b.store(ta, dst, at, None);
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        Ok(())
    }

    /// Three top-level nests from `top[i]` that run as one kernel over
    /// blocks of rows (attention's `softmax(q @ k^T) @ v`): a packed product
    /// (in a batch loop or not) whose epilogue writes buffer `S` at
    /// `[batch, i, j]`, a nest over the same batch and the rows of `S` whose
    /// body reads and writes only row `i` of `S` and of a buffer `P`, and a
    /// packed product of `P` (at `[batch, i, k]`) by another operand.
    /// Nothing else touches `S` or `P`, so each program keeps its rows of
    /// them in scratch memory: the score matrix never goes to memory.
    /// Returns the fusion and the index of its last nest.
    fn row_fusion(&self, top: &[LOpId], i: usize, cuts: &[bool]) -> Option<(RowFusion, usize)> {
        let mentions = |e: &IndexExpr, v: LValue| e.terms.iter().any(|t| t.1 == v && t.0 != 0);
        // A packed product, in one batch loop or none.
        let product = |id: LOpId| -> Option<(Option<LOpId>, LOpId)> {
            let op = self.op(id);
            let (b, m) = match &op.kind {
                L::Matmul(_) => (None, id),
                L::Parallel { .. } => match op.regions[0].ops.as_slice() {
                    [m] if matches!(self.op(*m).kind, L::Matmul(_)) => (Some(id), *m),
                    _ => return None,
                },
                _ => return None,
            };
            self.packs_wide(m).then_some((b, m))
        };
        let bounds = |b: Option<LOpId>| b.and_then(|b| loop_bounds(&self.op(b).kind));
        let counter = |b: Option<LOpId>| b.map(|b| self.op(b).regions[0].args[0]);
        let (b1, m1) = product(top[i])?;
        let L::Matmul(c1) = &self.op(m1).kind else {
            return None;
        };
        // The first product's epilogue stores only into S, at [b, i, j].
        let e1 = &self.op(m1).regions[0];
        let (iv1, jv1) = (e1.args[0], e1.args[1]);
        let mut s = None;
        let mut stores1 = vec![];
        for &o in &e1.ops {
            let d = self.op(o);
            match &d.kind {
                L::Store { index } => {
                    let mut want: Vec<LValue> = counter(b1).into_iter().collect();
                    want.extend([iv1, jv1]);
                    let at_ij = index.len() == want.len()
                        && index.iter().zip(&want).all(|(e, v)| is_counter(e, *v));
                    if !at_ij || s.is_some_and(|s| s != d.operands[1]) {
                        return None;
                    }
                    s = Some(d.operands[1]);
                    stores1.push(o);
                }
                L::For { .. } | L::Parallel { .. } | L::Matmul(_) => return None,
                _ => {}
            }
        }
        let s = s?;
        // The row nest: a loop over the batch (when there is one) around a
        // loop over the rows, without carried values.
        let j = self.next_nest(top, i)?;
        let (b2, rows) = {
            let op = self.op(top[j]);
            if b1.is_some() {
                match op.regions.first()?.ops.as_slice() {
                    [r] if is_parallel(&op.kind) => (Some(top[j]), *r),
                    _ => return None,
                }
            } else {
                (None, top[j])
            }
        };
        let row_op = self.op(rows);
        if (b2.is_some() && bounds(b2) != bounds(b1))
            || loop_bounds(&row_op.kind) != Some((0, c1.m, 1))
            || !row_op.operands.is_empty()
            || !row_op.results.is_empty()
        {
            return None;
        }
        let iv2 = row_op.regions[0].args[0];
        let mut row_at: Vec<LValue> = counter(b2).into_iter().collect();
        row_at.push(iv2);
        let mut row_ops = HashSet::new();
        self.nested_ops(rows, &mut row_ops);
        // Every access of the row nest is to row i of S or of one other
        // buffer P, and nothing in it is a product.
        let mut p = None;
        for &o in &row_ops {
            let d = self.op(o);
            let (buf, index) = match &d.kind {
                L::Matmul(_) => return None,
                L::Load { index, .. } => (d.operands[0], index),
                L::Store { index } => (d.operands[1], index),
                _ => continue,
            };
            if buf != s {
                if p.is_some_and(|p| p != buf) {
                    return None;
                }
                p = Some(buf);
            }
            let row_i = index.len() == row_at.len() + 1
                && index.iter().zip(&row_at).all(|(e, v)| is_counter(e, *v))
                && index
                    .last()
                    .is_some_and(|e| row_at.iter().all(|v| !mentions(e, *v)));
            if !row_i {
                return None;
            }
        }
        let p = p?;
        // The second product reads P at [b, i, k], as deep as S is wide.
        let k = self.next_nest(top, j)?;
        let (b3, m2) = product(top[k])?;
        let m2op = self.op(m2);
        let L::Matmul(c2) = &m2op.kind else {
            return None;
        };
        let (iv3, kv3) = (m2op.regions[0].args[0], m2op.regions[0].args[2]);
        let mut want: Vec<LValue> = counter(b3).into_iter().collect();
        want.extend([iv3, kv3]);
        let width = c1.n;
        let shape_ok = |v: LValue| match self.src.ty(v) {
            LType::Buffer(t) => {
                t.dtype == DType::F32
                    && t.shape.len() == want.len()
                    && t.shape[t.shape.len() - 2..] == [c1.m as usize, width as usize]
            }
            _ => false,
        };
        if bounds(b3) != bounds(b1)
            || m2op.operands[0] != p
            || m2op.operands[1] == s
            || m2op.operands[1] == p
            || c2.m != c1.m
            || c2.k != width
            || c2.a.len() != want.len()
            || !c2.a.iter().zip(&want).all(|(e, v)| is_counter(e, *v))
            || !shape_ok(s)
            || !shape_ok(p)
            || !cuts[i]
            || !cuts[k + 1]
        {
            return None;
        }
        // S and P are the function's own storage (a result or a parameter
        // must be written where the caller sees it).
        let allocated = |v: LValue| {
            let root = self.root_buffer(v);
            top.iter()
                .any(|&o| matches!(self.op(o).kind, L::Alloc) && self.op(o).results == [root])
        };
        if !allocated(s) || !allocated(p) {
            return None;
        }
        // Nothing else uses S or P but views made after the fused nests
        // (their storage reused for later values).
        let mut allowed: HashSet<LOpId> = row_ops;
        allowed.extend(stores1);
        let later: HashSet<LOpId> = top[k + 1..].iter().copied().collect();
        let m2_id = m2;
        let mut viewed = vec![];
        for (id, op) in self.src.ops.iter().enumerate() {
            let id = LOpId(id as u32);
            let uses = op.operands.iter().any(|&v| v == s || v == p);
            let later_view = matches!(op.kind, L::View) && later.contains(&id);
            let ok = !uses
                || allowed.contains(&id)
                || (id == m2_id && op.operands[1..].iter().all(|&v| v != s && v != p))
                || matches!(op.kind, L::Dealloc)
                || later_view;
            if !ok {
                return None;
            }
            if uses && later_view {
                viewed.extend(op.operands.first().copied());
            }
        }
        // Storage nothing else takes is not allocated at all.
        let elided = [s, p]
            .into_iter()
            .filter(|&v| self.root_buffer(v) == v && !viewed.contains(&v))
            .collect();
        let mut m2_body = HashSet::new();
        self.nested_ops(m2, &mut m2_body);
        // What the second product writes, no program may read: a program
        // writes its rows of the result while others still read the
        // first product's operands (a buffer reused for the result, as
        // BERT's output of attention takes the storage of its queries).
        let mut m1_body = HashSet::new();
        self.nested_ops(m1, &mut m1_body);
        let mut read: HashSet<LValue> = HashSet::new();
        read.extend(self.op(m1).operands.iter().map(|&v| self.root_buffer(v)));
        read.insert(self.root_buffer(m2op.operands[1]));
        for &o in m1_body.iter().chain(&m2_body) {
            if let L::Load { .. } = self.op(o).kind {
                read.insert(self.root_buffer(self.op(o).operands[0]));
            }
        }
        let writes_read = m2_body.iter().any(|&o| {
            let d = self.op(o);
            matches!(d.kind, L::Store { .. }) && read.contains(&self.root_buffer(d.operands[1]))
        });
        if writes_read {
            return None;
        }
        Some((
            RowFusion {
                batches: [b1, b2, b3],
                products: [m1, m2],
                rows,
                held: [s, p],
                elided,
            },
            k,
        ))
    }

    /// An im2col nest at `top[i]` whose buffer one packed product (over the
    /// same batch, one block of rows) reads as its right operand and
    /// nothing else touches: `col[n, (c*KH + ky)*KW + kx, y*OX + x] =
    /// input[n, c, s0*y + ky - p0, s1*x + kx - p1]` (zero outside), as
    /// graph-to-loop lowers a convolution. The product's programs can copy
    /// their panels from the input instead, so the buffer is never made.
    /// Returns the convolution and the index of the product's nest.
    fn implicit_im2col(&self, top: &[LOpId], i: usize, cuts: &[bool]) -> Option<(Im2col, usize)> {
        let nr = self.params.packed?.blocking[1];
        // Six perfectly nested loops from 0 (channel, batch, kernel row and
        // column, output row and column), without carried values.
        let mut loops: Vec<(LValue, i64)> = vec![];
        let mut at = top[i];
        loop {
            let op = self.op(at);
            let (lo, hi, step) = loop_bounds(&op.kind)?;
            if lo != 0 || step != 1 || !op.operands.is_empty() || !op.results.is_empty() {
                return None;
            }
            loops.push((op.regions[0].args[0], hi));
            match op.regions[0].ops.as_slice() {
                [inner] if loops.len() < 6 => at = *inner,
                _ if loops.len() == 6 => break,
                _ => return None,
            }
        }
        let [
            (c, channels),
            (n, batch),
            (ky, kh),
            (kx, kw),
            (y, oy),
            (x, ox),
        ] = loops[..]
        else {
            return None;
        };
        let [ld, st] = self.op(at).regions[0].ops[..] else {
            return None;
        };
        let (ld_op, st_op) = (self.op(ld), self.op(st));
        let (
            L::Load {
                index: li,
                pad: Some(pad),
            },
            L::Store { index: si },
        ) = (&ld_op.kind, &st_op.kind)
        else {
            return None;
        };
        if *pad != 0.0 || st_op.operands[0] != ld_op.results[0] {
            return None;
        }
        let (input, col) = (ld_op.operands[0], st_op.operands[1]);
        let coef = |e: &IndexExpr, v: LValue| -> i64 {
            e.terms.iter().filter(|t| t.1 == v).map(|t| t.0).sum()
        };
        // `e` is exactly the sum of `vars` times their coefficients, plus `k`.
        let is = |e: &IndexExpr, vars: &[(LValue, i64)], k: i64| {
            e.constant == k
                && e.terms.iter().all(|t| vars.iter().any(|(v, _)| *v == t.1))
                && vars.iter().all(|&(v, w)| coef(e, v) == w)
        };
        let [li0, li1, li2, li3] = &li[..] else {
            return None;
        };
        let [si0, si1, si2] = &si[..] else {
            return None;
        };
        let stride = [coef(li2, y), coef(li3, x)];
        let padding = [-li2.constant, -li3.constant];
        let fits = is(li0, &[(n, 1)], 0)
            && is(li1, &[(c, 1)], 0)
            && stride.iter().all(|&s| s >= 1)
            && padding.iter().all(|&p| p >= 0)
            && is(li2, &[(y, stride[0]), (ky, 1)], -padding[0])
            && is(li3, &[(x, stride[1]), (kx, 1)], -padding[1])
            && is(si0, &[(n, 1)], 0)
            && is(si1, &[(c, kh * kw), (ky, kw), (kx, 1)], 0)
            && is(si2, &[(y, ox), (x, 1)], 0);
        let f32_buffer = |v: LValue, rank: usize| matches!(self.src.ty(v), LType::Buffer(t) if t.dtype == DType::F32 && t.shape.len() == rank);
        if !fits || !f32_buffer(input, 4) || !f32_buffer(col, 3) || self.root_buffer(col) != col {
            return None;
        }
        // The product: a loop over the batch around a packed product of
        // `col[n, k, j]` as the right operand.
        let k = self.next_nest(top, i)?;
        let nest = self.op(top[k]);
        let [m] = nest.regions.first()?.ops[..] else {
            return None;
        };
        let mop = self.op(m);
        let L::Matmul(cm) = &mop.kind else {
            return None;
        };
        let (jv, kv) = (mop.regions[0].args[1], mop.regions[0].args[2]);
        let b = nest.regions[0].args[0];
        if !is_parallel(&nest.kind)
            || loop_bounds(&nest.kind) != Some((0, batch, 1))
            || mop.operands[1] != col
            || mop.operands[0] == col
            || cm.k != channels * kh * kw
            || cm.n != oy * ox
            || cm.b.len() != 3
            || !(is_counter(&cm.b[0], b) && is_counter(&cm.b[1], kv) && is_counter(&cm.b[2], jv))
            || !self.packs_wide(m)
            || !cuts[i]
            || !cuts[k + 1]
        {
            return None;
        }
        let plan = self.pack_plan(m, batch as usize, true).ok()?;
        if !self.packs_own_panels(m, plan.blocks) {
            return None;
        }
        // Nothing else touches `col` (the product's epilogue included).
        for (id, op) in self.src.ops.iter().enumerate() {
            let id = LOpId(id as u32);
            if op.operands.contains(&col) && id != st && id != m && !matches!(op.kind, L::Dealloc) {
                return None;
            }
        }
        // Panels come in groups of whole output rows (`lcm(nr, OX)`
        // columns), so that each panel's place in the image is a constant
        // of its place in the group.
        let ox_u = ox as usize;
        let group = ox_u / gcd(nr as u64, ox_u as u64) as usize;
        if group > 8 || group == 0 {
            return None;
        }
        let conv = Im2col {
            input,
            col,
            channels: channels as usize,
            kernel: [kh as usize, kw as usize],
            stride,
            padding,
            ox: ox_u,
            group,
            rows: (group * nr / ox_u) as i64,
        };
        Some((conv, k))
    }

    /// Copies slice `kb` of the `group` panels of group `g` (past the
    /// program's first, `g0`) of the im2col buffer `conv` stands for into `dst[u, k,
    /// j]`, from the convolution's input, batch `bat`: for each channel and
    /// kernel tap of the slice, each panel's `nr` output positions, one
    /// load per output row they span (zero outside the input).
    #[allow(clippy::too_many_arguments)]
    fn copy_im2col_group(
        &mut self,
        conv: &Im2col,
        plan: &PackPlan,
        kb: Value,
        g: Value,
        g0: &Affine,
        bat: &[Affine],
        dst: Value,
    ) -> Result<(), TileConvError> {
        let (nr, kc) = (plan.nr, plan.kc);
        let [kh, kw] = conv.kernel;
        let cs = kc / (kh * kw);
        let input = self.buffer(conv.input)?;
        let f32t = |shape: Vec<usize>| Type::Tile(TileType::new(DType::F32, shape));
        // The group: `g` groups of `rows` output rows past the program's
        // first (`g0`).
        let group0 = g0.plus_scaled(1, &Affine::value(g));
        let n = bat.first().cloned().unwrap_or_default();
        let (cc, _) = self.b.begin_for(0, cs as i64, 1, &[]);
        let (a, _) = self.b.begin_for(0, kh as i64, 1, &[]);
        let (bx, _) = self.b.begin_for(0, kw as i64, 1, &[]);
        let channel = Affine::value(kb)
            .scaled(cs as i64)
            .plus_scaled(1, &Affine::value(cc));
        let row = Affine::value(cc)
            .scaled((kh * kw) as i64)
            .plus_scaled(kw as i64, &Affine::value(a))
            .plus_scaled(1, &Affine::value(bx));
        for u in 0..conv.group {
            let (yu, xu) = ((u * nr / conv.ox) as i64, (u * nr % conv.ox) as i64);
            // Output row `oy` from lane 0 at output column `ox0`.
            let at = |oy: Affine, ox0: i64| -> Vec<Affine> {
                vec![
                    n.clone(),
                    channel.clone(),
                    oy.scaled(conv.stride[0])
                        .plus_scaled(1, &Affine::value(a))
                        .plus_scaled(1, &Affine::constant(-conv.padding[0])),
                    Affine::axis(1)
                        .scaled(conv.stride[1])
                        .plus_scaled(1, &Affine::value(bx))
                        .plus_scaled(1, &Affine::constant(conv.stride[1] * ox0 - conv.padding[1])),
                ]
            };
            let oy = group0
                .scaled(conv.rows)
                .plus_scaled(1, &Affine::constant(yu));
            // The panel's lanes run over consecutive output rows: segment
            // `r` is row `yu + r`, lanes up to `(r + 1) * OX - xu`, each
            // read as a whole tile and the earlier rows' lanes selected
            // over the later ones.
            let ox = conv.ox as i64;
            let segments = (xu as usize + nr).div_ceil(conv.ox) as i64;
            let mut t = None;
            for r in (0..segments).rev() {
                let row_r = oy.plus_scaled(1, &Affine::constant(r));
                let seg = self.b.load(
                    input,
                    at(row_r, xu - r * ox),
                    None,
                    Some(0.0),
                    f32t(vec![1, nr]),
                );
                t = Some(match t {
                    None => seg,
                    Some(later) => {
                        let end = (r + 1) * ox - xu;
                        let here = self
                            .b
                            .mask(vec![Affine::constant(1), Affine::constant(end)], &[1, nr]);
                        self.b.select(here, seg, later)
                    }
                });
            }
            let t = t.ok_or_else(|| self.invalid("an empty panel"))?;
            self.b.store(
                t,
                dst,
                vec![
                    Affine::constant(u as i64),
                    row.plus_scaled(1, &Affine::axis(0)),
                    Affine::axis(1),
                ],
                None,
            );
        }
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        Ok(())
    }

    /// Whether contraction `m` runs as a packed product wider than the
    /// target's narrow products (not the narrow kernel): what fusing into
    /// its programs takes.
    fn packs_wide(&self, m: LOpId) -> bool {
        self.packs(m) && self.f32_operands(m) && self.narrow(m).is_none()
    }

    /// The next top-level nest after `top[at]`, past allocations, views and
    /// constants.
    fn next_nest(&self, top: &[LOpId], at: usize) -> Option<usize> {
        (at + 1..top.len())
            .find(|&k| !matches!(self.op(top[k]).kind, L::Alloc | L::View | L::Const(_)))
    }

    /// Every op nested in `id`'s regions.
    fn nested_ops(&self, id: LOpId, out: &mut HashSet<LOpId>) {
        for r in &self.op(id).regions {
            for &o in &r.ops {
                out.insert(o);
                self.nested_ops(o, out);
            }
        }
    }

    /// The kernel of a [`RowFusion`]: a grid over the batch and blocks of
    /// `mc` rows; each program runs the first product on its rows into its
    /// scratch copy of S's rows, the row nest on them (S and P in scratch),
    /// then the second product of its rows of P, whose epilogue writes the
    /// result. The products' right operands are packed by kernels of their
    /// own when several blocks of rows read them, as a product's are.
    fn fused_rows_kernel(&mut self, f: &RowFusion) -> Result<(), TileConvError> {
        let [b1, b2, b3] = f.batches.map(|b| self.batch_loop(b));
        let [m1, m2] = f.products;
        let batches = b1.map_or(1, |b| b.2);
        let plans = [
            self.pack_plan(m1, batches, false)?,
            self.pack_plan(m2, batches, false)?,
        ];
        if plans[0].mc != plans[1].mc || plans[0].mr != plans[1].mr {
            return Err(self.invalid("fused products with different blocks of rows"));
        }
        let panels = [
            self.panels(m1, b1.as_slice(), &plans[0])?,
            self.panels(m2, b3.as_slice(), &plans[1])?,
        ];
        let (mr, nr, mc) = (plans[0].mr, plans[0].nr, plans[0].mc);
        let mut grid: Vec<usize> = b1.iter().map(|b| b.2).collect();
        grid.push(plans[0].blocks);
        let schedule = Schedule::Fused {
            blocking: [mr, nr, mc, plans[0].kc, plans[1].kc],
        };
        self.b.begin_kernel(grid, schedule);
        self.values.clear();
        let bat = self.batch_ids(&[b1, b2, b3]);
        let p = self.b.program_id(bat.len());
        let i0 = Affine::value(p).scaled(mc as i64);
        // This program's rows of S and P.
        for v in f.held {
            let LType::Buffer(t) = self.src.ty(v) else {
                return Err(self.invalid("a fused value is not a buffer"));
            };
            let width = t.shape[t.shape.len() - 1];
            let scratch = self.b.alloc(BufferType::contiguous(
                DType::F32,
                vec![mc, width],
                Space::Scratch,
            ));
            let axes = vec![
                (bat.len(), i0.clone()),
                (bat.len() + 1, Affine::constant(0)),
            ];
            self.redirects.insert(v, Redirect { scratch, axes });
        }
        let zero = Affine::constant(0);
        let result = (|| -> Result<(), TileConvError> {
            // Each product reads its block of rows where it lies when that
            // needs no mask: the queries (a block a program reads once per
            // panel), the probabilities (in scratch memory already).
            self.strips = self.rows_in_place(m1, &plans[0]);
            let first = self.program_product(m1, &plans[0], panels[0], &bat, &i0, &zero);
            self.strips = Strips::Own;
            let first = first?;
            // The row nest on each of the block's rows (rows past the
            // product's are computed on scratch memory and never stored).
            let rows = self.op(f.rows);
            // A last loop scaling the row of P by one factor (softmax's
            // normalization) is left to the second product, which scales
            // its result's row instead: `(c * p) @ v = c * (p @ v)`, a
            // pass over 64 columns instead of 384 in attention.
            let body = &rows.regions[0].ops;
            let scale = self.row_scale(body, f.held[1]).map(|c| {
                let factors = BufferType::contiguous(DType::F32, vec![mc], Space::Scratch);
                (c, self.b.alloc(factors))
            });
            let (r, _) = self.b.begin_for(0, mc as i64, 1, &[]);
            // The first product's epilogue on the row, then the row nest
            // reads it from the first level of cache.
            self.epilogue_row(&first, r)?;
            self.index.insert(
                rows.regions[0].args[0],
                i0.plus_scaled(1, &Affine::value(r)),
            );
            match scale {
                Some((c, factors)) => {
                    self.ops(&body[..body.len() - 1])?;
                    let c = self.scalar(c)?;
                    self.b.store(c, factors, vec![Affine::value(r)], None);
                }
                None => self.ops(body)?,
            }
            self.b.end_for(vec![]);
            self.strips = self.rows_in_place(m2, &plans[1]);
            self.row_factors = scale.map(|(_, factors)| factors);
            let result = self
                .program_product(m2, &plans[1], panels[1], &bat, &i0, &zero)
                .and_then(|e| self.epilogue(&e));
            self.strips = Strips::Own;
            self.row_factors = None;
            result
        })();
        self.redirects.clear();
        result?;
        self.b.end_kernel();
        for p in panels {
            if let Panels::Global(p) = p {
                self.b.dealloc(p);
            }
        }
        Ok(())
    }

    /// In a fused kernel, whether product `m`'s programs may read their
    /// rows of the left operand where they lie: contiguous along the depth,
    /// every slice of the depth whole and every block of rows inside the
    /// operand (a fused buffer's scratch holds whole blocks).
    fn rows_in_place(&self, m: LOpId, plan: &PackPlan) -> Strips {
        let op = self.op(m);
        let L::Matmul(c) = &op.kind else {
            return Strips::Own;
        };
        let a = op.operands[0];
        let inside = (c.m as usize).is_multiple_of(plan.mc) || self.redirects.contains_key(&a);
        if inside
            && self.operand_dtype(a) == Some(DType::F32)
            && (c.k as usize).is_multiple_of(plan.kc)
            && self.unit_stride(a, &c.a, op.regions[0].args[2])
        {
            Strips::InPlace
        } else {
            Strips::Own
        }
    }

    /// Whether a row nest's body ends with a loop that only scales the row
    /// of `p` by a factor computed before it, `p[.., i, k] = p[.., i, k] *
    /// c` for every `k` (softmax's normalization): `c` if so.
    fn row_scale(&self, body: &[LOpId], p: LValue) -> Option<LValue> {
        let (&last, _) = body.split_last()?;
        let op = self.op(last);
        let L::For { lo: 0, hi, step: 1 } = op.kind else {
            return None;
        };
        let LType::Buffer(t) = self.src.ty(p) else {
            return None;
        };
        if t.shape.last() != Some(&(hi as usize)) || !op.operands.is_empty() {
            return None;
        }
        let k = op.regions[0].args[0];
        let ops: Vec<&dlc_loop::OpData> = op.regions[0]
            .ops
            .iter()
            .map(|&o| self.op(o))
            .filter(|d| !matches!(d.kind, L::Yield) || !d.operands.is_empty())
            .collect();
        let [load, mul, store] = ops.as_slice() else {
            return None;
        };
        let (
            L::Load {
                index: from,
                pad: None,
            },
            L::Binary(BinaryOp::Mul),
            L::Store { index: to },
        ) = (&load.kind, &mul.kind, &store.kind)
        else {
            return None;
        };
        let x = load.results[0];
        let c = match mul.operands.as_slice() {
            [a, c] | [c, a] if *a == x && *c != x => *c,
            _ => return None,
        };
        // The factor is not computed in the loop, and the row is read and
        // written at the same place, the loop's counter last.
        let inside: HashSet<LValue> = [x, mul.results[0]].into();
        let at_k = from.last().is_some_and(|e| is_counter(e, k))
            && from[..from.len() - 1]
                .iter()
                .all(|e| e.terms.iter().all(|t| t.1 != k || t.0 == 0));
        (load.operands[0] == p
            && store.operands[1] == p
            && store.operands[0] == mul.results[0]
            && from == to
            && at_k
            && !inside.contains(&c)
            && c != k)
            .then_some(c)
    }

    /// Where the programs of packed product `m` read the right operand's
    /// panels: packed once by a kernel of their own when the operand is a
    /// weight; else packed by each program into scratch memory, one slice of a
    /// panel at a time, when each panel serves one program; else read in
    /// place where the operand allows it; else packed once by a kernel of
    /// its own (`panels[batch.., kb, nb, k, j]`), emitted here.
    fn panels(
        &mut self,
        m: LOpId,
        batch: &[(LValue, i64, usize)],
        plan: &PackPlan,
    ) -> Result<Panels, TileConvError> {
        Ok(if self.weight_operand(m) {
            Panels::Global(self.pack_kernel(m, batch, plan)?)
        } else if self.packs_own_panels(m, plan.blocks) {
            Panels::Own
        } else if self.reads_in_place(m, plan.blocks, plan.l1_sets) {
            Panels::InPlace
        } else {
            Panels::Global(self.pack_kernel(m, batch, plan)?)
        })
    }

    /// A batch loop's counter, first value and trip count.
    fn batch_loop(&self, l: Option<LOpId>) -> Option<(LValue, i64, usize)> {
        l.map(|l| {
            let op = self.op(l);
            let (lo, hi, _) = loop_bounds(&op.kind).unwrap_or((0, 1, 1));
            (op.regions[0].args[0], lo, (hi - lo).max(1) as usize)
        })
    }

    /// The program ids of a kernel whose first axes are the batch loops
    /// `loops`, one axis each, mapped to their counters.
    fn batch_axes(&mut self, loops: &[(LValue, i64, usize)]) -> Vec<Affine> {
        loops
            .iter()
            .enumerate()
            .map(|(axis, &(counter, lo, _))| {
                let p = self.b.program_id(axis);
                self.index.insert(
                    counter,
                    Affine::value(p).plus_scaled(1, &Affine::constant(lo)),
                );
                Affine::value(p)
            })
            .collect()
    }

    /// The batch's program id (the kernel's first axis, when there is a
    /// batch), mapped to the counter of each batch loop given (loops over
    /// the same batch in nests fused into one kernel).
    fn batch_ids(&mut self, loops: &[Option<(LValue, i64, usize)>]) -> Vec<Affine> {
        let mut id = None;
        for &(counter, lo, _) in loops.iter().flatten() {
            let p = *id.get_or_insert_with(|| self.b.program_id(0));
            self.index.insert(
                counter,
                Affine::value(p).plus_scaled(1, &Affine::constant(lo)),
            );
        }
        id.map(Affine::value).into_iter().collect()
    }

    /// The blocks of packed product `m` over `batches` batches: with
    /// `chunked`, the columns are split into chunks when there are fewer
    /// row blocks than the target's units of work; without, each program
    /// takes every panel.
    fn pack_plan(
        &self,
        m: LOpId,
        batches: usize,
        chunked: bool,
    ) -> Result<PackPlan, TileConvError> {
        let (_, c) = self.contraction(m)?;
        let Some(Packing {
            blocking: [mr, nr, mc, kc],
            units,
            copy_depth,
            balance,
            l1_sets,
            unroll,
            ..
        }) = self.params.packed
        else {
            return Err(self.invalid("no packed blocking for this target"));
        };
        // Blocks no larger than the product needs, and slices of the depth
        // of even size (a whole number of copies deep), so that the last one
        // is not mostly zeros the register tile multiplies.
        let depth = c.k.max(1) as usize;
        let even = depth.div_ceil(depth.div_ceil(kc));
        let kc = if depth > kc && even > copy_depth {
            even.next_multiple_of(copy_depth).min(kc)
        } else {
            even
        };
        // Slices of whole channels when the right operand is an im2col
        // buffer read from the input: as many channels as fit the depth.
        let conv = self.convs.get(&m);
        let kc = match conv {
            Some(cv) => {
                let taps = cv.kernel[0] * cv.kernel[1];
                let cs = (1..=cv.channels)
                    .rev()
                    .find(|d| cv.channels.is_multiple_of(*d) && d * taps <= kc.max(taps))
                    .unwrap_or(1);
                cs * taps
            }
            None => kc,
        };
        // Row blocks of `mr`-row strips, as many strips as the blocking
        // takes or down to half of it, whichever pads the rows least (every
        // program runs all of its strips, so a last block mostly past the
        // rows would be multiplied for nothing).
        let rows = c.m.max(1) as usize;
        let most = (mc / mr).max(1);
        let mc = (most.div_ceil(2)..=most)
            .rev()
            .min_by_key(|s| rows.div_ceil(s * mr) * s * mr)
            .map_or(mr, |s| s * mr)
            .min(rows.div_ceil(mr) * mr);
        let (m_, n_, k_) = (c.m as usize, c.n as usize, c.k as usize);
        let (kb_n, strips_n) = (k_.div_ceil(kc), n_.div_ceil(nr));
        let blocks = m_.div_ceil(mc);
        // Panels per chunk: at most enough for the chunks wanted, and of
        // those sizes the one that pads the last chunk least (every program
        // runs all of its chunk's panels; 98 panels in 8 chunks would run
        // 104, in 14 chunks of 7 they run 98).
        let wanted = if chunked {
            units.div_ceil(blocks * batches).clamp(1, strips_n.max(1))
        } else {
            1
        };
        // Programs a multiple of `balance`, where at most twice the chunks
        // make it, so that no thread is left waiting on the last one.
        let wanted = if chunked {
            (wanted..=(2 * wanted).min(strips_n.max(1)))
                .find(|c| (blocks * batches * c).is_multiple_of(balance))
                .unwrap_or(wanted)
        } else {
            wanted
        };
        let per_chunk = (1..=strips_n.div_ceil(wanted).max(1))
            .rev()
            .min_by_key(|p| strips_n.div_ceil(*p) * p - strips_n)
            .unwrap_or(1);
        // Whole groups of panels for an im2col buffer read from the input.
        let per_chunk = conv.map_or(per_chunk, |cv| per_chunk.next_multiple_of(cv.group));
        let chunks = strips_n.div_ceil(per_chunk);
        // Panels for whole chunks: the last chunk's extra panels are zeros.
        let nb_n = chunks * per_chunk;
        // Depth of one copied tile: a divisor of `kc`, so that copies never
        // cross from one `kc` slice into the next.
        let kk = (1..=copy_depth.min(kc))
            .rev()
            .find(|d| kc.is_multiple_of(*d))
            .unwrap_or(1);
        // The depth loop, `unroll` steps per iteration (the largest that
        // divides `kc`, up to the target's).
        let unroll = (1..=unroll.max(1))
            .rev()
            .find(|u| kc.is_multiple_of(*u))
            .unwrap_or(1);
        Ok(PackPlan {
            mr,
            nr,
            mc,
            kc,
            kk,
            kb_n,
            strips: mc / mr,
            blocks,
            chunks,
            per_chunk,
            nb_n,
            // Masks where a slice or a panel reaches past the operand.
            ragged: !k_.is_multiple_of(kc) || !n_.is_multiple_of(nr) || nb_n > strips_n,
            unroll,
            l1_sets,
        })
    }

    /// The kernel packing product `m`'s right operand into a global
    /// `[batch.., kb, nb, kc, nr]` buffer of panels, which it returns: one
    /// program per batch, slice of the depth and panel, or, with two batch
    /// loops (a grid has three axes), per batch and slice, looping over
    /// the panels.
    fn pack_kernel(
        &mut self,
        m: LOpId,
        batch: &[(LValue, i64, usize)],
        plan: &PackPlan,
    ) -> Result<Value, TileConvError> {
        let mut panel_shape: Vec<usize> = batch.iter().map(|b| b.2).collect();
        panel_shape.extend([plan.kb_n, plan.nb_n, plan.kc, plan.nr]);
        let panels = self.b.alloc(BufferType::contiguous(
            DType::F32,
            panel_shape,
            Space::Global,
        ));
        let mut grid: Vec<usize> = batch.iter().map(|b| b.2).collect();
        grid.push(plan.kb_n);
        let looped = batch.len() >= 2;
        if !looped {
            grid.push(plan.nb_n);
        }
        self.b
            .begin_kernel(grid, plan.pack_schedule(Some(PackedOperand::Right)));
        let mut at = self.batch_axes(batch);
        let bat_axes = at.len();
        let pk = self.b.program_id(bat_axes);
        let pn = if looped {
            self.b.begin_for(0, plan.nb_n as i64, 1, &[]).0
        } else {
            self.b.program_id(bat_axes + 1)
        };
        at.extend([Affine::value(pk), Affine::value(pn)]);
        let j0 = Affine::value(pn).scaled(plan.nr as i64);
        self.copy_panel_slice(
            m,
            pk,
            j0,
            [plan.kc, plan.kk, plan.nr],
            plan.ragged,
            panels,
            &at,
        )?;
        if looped {
            self.b.end_for(vec![]);
        }
        self.b.end_kernel();
        Ok(panels)
    }

    /// The body of a program of packed product `m`: rows from `i0` (`mc`
    /// of them), the `per_chunk` panels of column chunk `chunk`, the batch
    /// of its right operand (the program ids of the batch loops it reads)
    /// at `bat`.
    fn program_product(
        &mut self,
        m: LOpId,
        plan: &PackPlan,
        panels: Panels,
        bat: &[Affine],
        i0: &Affine,
        chunk: &Affine,
    ) -> Result<Epilogue, TileConvError> {
        let (op, c) = self.contraction(m)?;
        // The program's first panel.
        let nb0 = &chunk.scaled(plan.per_chunk as i64);
        // An im2col right operand read from the convolution's input, in
        // groups of panels (the program's first group).
        let conv = self.convs.get(&m).cloned();
        if conv.is_some() && !matches!(panels, Panels::Own) {
            return Err(self
                .invalid("an im2col operand read from the input must be copied by its programs"));
        }
        let PackPlan {
            mr,
            nr,
            mc,
            kc,
            kk,
            kb_n,
            strips,
            per_chunk,
            ragged,
            unroll,
            ..
        } = *plan;
        let body: &'a LBlock = &op.regions[0];
        let (iv, jv, kv) = (body.args[0], body.args[1], body.args[2]);
        let f32t = |shape: Vec<usize>| Type::Tile(TileType::new(DType::F32, shape));
        // The program's strips of the left operand, unless a kernel packed
        // them all before or they are read in place.
        let strips_from = self.strips.clone();
        let strip_buf = match &strips_from {
            Strips::Global(buf, _) => Some(*buf),
            Strips::InPlace => None,
            Strips::Own => Some(self.b.alloc(BufferType::contiguous(
                DType::F32,
                vec![strips, kc, mr],
                Space::Scratch,
            ))),
        };
        let block = self.b.alloc(BufferType::contiguous(
            DType::F32,
            vec![mc, per_chunk * nr],
            Space::Scratch,
        ));
        let panel_buf = matches!(panels, Panels::Own).then(|| {
            let mut shape: Vec<usize> = conv.iter().map(|cv| cv.group).collect();
            shape.extend([kc, nr]);
            self.b
                .alloc(BufferType::contiguous(DType::F32, shape, Space::Scratch))
        });
        let register_tile = |nb: &Affine, s: Value| {
            vec![
                Affine::block(s, mr as i64, 0),
                nb.scaled(nr as i64).plus_scaled(1, &Affine::axis(1)),
            ]
        };
        // With one slice of the depth, each register tile starts from zero
        // in registers: the block is written once, never zeroed or read
        // back (W4's products are 64 deep).
        let zero = self.b.constant(0.0, f32t(vec![mr, nr]));
        if kb_n > 1 {
            let (nb, _) = self.b.begin_for(0, per_chunk as i64, 1, &[]);
            let (s, _) = self.b.begin_for(0, strips as i64, 1, &[]);
            self.b
                .store(zero, block, register_tile(&Affine::value(nb), s), None);
            self.b.end_for(vec![]);
            self.b.end_for(vec![]);
        }
        let (kb, _) = self.b.begin_for(0, kb_n as i64, 1, &[]);
        // This slice of the program's rows in strips: packed by a kernel
        // before, or here, strip by strip.
        let strips_at: Vec<Affine> = match &strips_from {
            Strips::Global(_, block) => vec![block.clone(), Affine::value(kb)],
            Strips::InPlace => vec![],
            Strips::Own => {
                let dst = strip_buf.ok_or_else(|| self.invalid("no buffer of strips"))?;
                self.pack_strips(m, plan, kb, i0, dst, &[])?;
                vec![]
            }
        };
        // The register tile over every panel and strip.
        let (nb, group_at) = match &conv {
            Some(cv) => {
                // A group of panels copied from the input, then each panel.
                let (g, _) = self.b.begin_for(0, (per_chunk / cv.group) as i64, 1, &[]);
                if let Some(panel_buf) = panel_buf {
                    let g0 = chunk.scaled((per_chunk / cv.group) as i64);
                    self.copy_im2col_group(cv, plan, kb, g, &g0, bat, panel_buf)?;
                }
                let (u, _) = self.b.begin_for(0, cv.group as i64, 1, &[]);
                (
                    Affine::value(g)
                        .scaled(cv.group as i64)
                        .plus_scaled(1, &Affine::value(u)),
                    Some(u),
                )
            }
            None => {
                let (nb, _) = self.b.begin_for(0, per_chunk as i64, 1, &[]);
                if let Some(panel_buf) = panel_buf {
                    // This slice of the panel, copied as the pack kernel would.
                    let j0 = nb0.plus_scaled(1, &Affine::value(nb)).scaled(nr as i64);
                    self.copy_panel_slice(m, kb, j0, [kc, kk, nr], ragged, panel_buf, &[])?;
                }
                (Affine::value(nb), None)
            }
        };
        let (s, _) = self.b.begin_for(0, strips as i64, 1, &[]);
        let at = register_tile(&nb, s);
        let c0 = if kb_n > 1 {
            self.b
                .load(block, at.clone(), None, None, f32t(vec![mr, nr]))
        } else {
            zero
        };
        let (k, acc) = self.b.begin_for(0, kc as i64, unroll as i64, &[c0]);
        let mut next = acc[0];
        for u in 0..unroll {
            let ku = Affine::value(k).plus_scaled(1, &Affine::constant(u as i64));
            // This step of the depth.
            let k0 = Affine::value(kb).scaled(kc as i64).plus_scaled(1, &ku);
            let ak = match strip_buf {
                Some(strip_buf) => {
                    let mut at = strips_at.clone();
                    at.extend([
                        Affine::value(s),
                        ku.plus_scaled(1, &Affine::axis(1)),
                        Affine::axis(0),
                    ]);
                    self.b.load(strip_buf, at, None, None, f32t(vec![mr, 1]))
                }
                None => {
                    // Rows `mr * s..` of the block, this step of the depth.
                    let row0 = i0.plus_scaled(mr as i64, &Affine::value(s));
                    let index = self.index_at(
                        &c.a,
                        [
                            (iv, row0.plus_scaled(1, &Affine::axis(0))),
                            (kv, k0.plus_scaled(1, &Affine::axis(1))),
                        ],
                    )?;
                    let (a, index) = self.place(op.operands[0], index)?;
                    self.b.load(a, index, None, None, f32t(vec![mr, 1]))
                }
            };
            let bk = match (panels, panel_buf) {
                (_, Some(panel_buf)) => {
                    let mut at: Vec<Affine> = group_at.map(Affine::value).into_iter().collect();
                    at.extend([ku.plus_scaled(1, &Affine::axis(0)), Affine::axis(1)]);
                    self.b.load(panel_buf, at, None, None, f32t(vec![1, nr]))
                }
                (Panels::Global(panels), None) => {
                    let mut panel = bat.to_vec();
                    panel.extend([
                        Affine::value(kb),
                        nb0.plus_scaled(1, &nb),
                        ku.plus_scaled(1, &Affine::axis(0)),
                        Affine::axis(1),
                    ]);
                    self.b.load(panels, panel, None, None, f32t(vec![1, nr]))
                }
                (_, None) => {
                    // Row `k` of the slice, this panel's columns, straight from
                    // the operand (zeros past its edges, as in a panel).
                    let j0 = nb0.plus_scaled(1, &nb).scaled(nr as i64);
                    let index = self.index_at(
                        &c.b,
                        [
                            (kv, k0.plus_scaled(1, &Affine::axis(0))),
                            (jv, j0.plus_scaled(1, &Affine::axis(1))),
                        ],
                    )?;
                    let mask = ragged.then(|| {
                        self.b.mask(
                            vec![
                                Affine::constant(c.k).plus_scaled(-1, &k0),
                                Affine::constant(c.n).plus_scaled(-1, &j0),
                            ],
                            &[1, nr],
                        )
                    });
                    let b = self.buffer(op.operands[1])?;
                    self.b
                        .load(b, index, mask, mask.map(|_| 0.0), f32t(vec![1, nr]))
                }
            };
            next = self.b.dot(ak, bk, next);
        }
        let sum = self.b.end_for(vec![next])[0];
        self.b.store(sum, block, at, None);
        self.b.end_for(vec![]);
        if group_at.is_some() {
            self.b.end_for(vec![]);
        }
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        Ok(Epilogue {
            m,
            block,
            i0: i0.clone(),
            nb0: nb0.clone(),
            rows: mc,
            panels: per_chunk,
            nr,
        })
    }

    /// A packed product's epilogue over all of its block's rows, one row
    /// of a panel at a time (a `1 x nr` tile: the epilogue's code is
    /// written once for two vectors, not for the register tile's twelve),
    /// row by row: the block is read and the result written along their
    /// rows (panel by panel, each row of a panel was a different page of
    /// the result: W1 1024 spent 5.6% of its time here, 2.7% row by row).
    fn epilogue(&mut self, e: &Epilogue) -> Result<(), TileConvError> {
        let (r, _) = self.b.begin_for(0, e.rows as i64, 1, &[]);
        self.epilogue_row(e, r)?;
        self.b.end_for(vec![]);
        Ok(())
    }

    /// A packed product's epilogue on row `r` of its block.
    fn epilogue_row(&mut self, e: &Epilogue, r: Value) -> Result<(), TileConvError> {
        let (op, c) = self.contraction(e.m)?;
        let body: &'a LBlock = &op.regions[0];
        let (iv, jv, kv, accv) = (body.args[0], body.args[1], body.args[2], body.args[3]);
        let nr = e.nr;
        let (nb, _) = self.b.begin_for(0, e.panels as i64, 1, &[]);
        let sum = self.b.load(
            e.block,
            vec![Affine::value(r), Affine::block(nb, nr as i64, 1)],
            None,
            None,
            Type::Tile(TileType::new(DType::F32, vec![1, nr])),
        );
        let row0 = e.i0.plus_scaled(1, &Affine::value(r));
        let col0 = e.nb0.plus_scaled(1, &Affine::value(nb)).scaled(nr as i64);
        self.index.insert(iv, row0.plus_scaled(1, &Affine::axis(0)));
        self.index.insert(jv, col0.plus_scaled(1, &Affine::axis(1)));
        self.index.insert(kv, Affine::constant(0));
        let sum = match self.row_factors {
            Some(buf) => {
                let c = self.b.load(
                    buf,
                    vec![Affine::value(r)],
                    None,
                    None,
                    Type::Scalar(DType::F32),
                );
                let c = self.b.splat(c, &[1, nr]);
                self.b.binary(BinaryOp::Mul, sum, c)
            }
            None => sum,
        };
        self.values.insert(accv, sum);
        self.shape = vec![1, nr];
        self.splats.clear();
        self.mask = Some(self.b.mask(
            vec![
                Affine::constant(c.m).plus_scaled(-1, &row0),
                Affine::constant(c.n).plus_scaled(-1, &col0),
            ],
            &[1, nr],
        ));
        let result = self.ops(&body.ops);
        self.shape.clear();
        self.mask = None;
        self.splats.clear();
        result?;
        self.b.end_for(vec![]);
        Ok(())
    }

    /// Copies slice `kb` (`kc` deep) of the `nr` columns from `j0` of
    /// product `m`'s right operand to `dst[prefix.., k, j]`, `kk` steps of
    /// the depth per copy, zeros past the operand's edges where `ragged`.
    #[allow(clippy::too_many_arguments)]
    fn copy_panel_slice(
        &mut self,
        m: LOpId,
        kb: Value,
        j0: Affine,
        [kc, kk, nr]: [usize; 3],
        ragged: bool,
        dst: Value,
        prefix: &[Affine],
    ) -> Result<(), TileConvError> {
        let (op, c) = self.contraction(m)?;
        let body: &'a LBlock = &op.regions[0];
        let (jv, kv) = (body.args[1], body.args[2]);
        let b = self.buffer(op.operands[1])?;
        let (f, _) = self.b.begin_for(0, (kc / kk) as i64, 1, &[]);
        let k0 = Affine::value(kb)
            .scaled(kc as i64)
            .plus_scaled(kk as i64, &Affine::value(f));
        let (b_index, limits, shape, [ka, ja]) =
            self.operand_block(op.operands[1], &c.b, [(kv, k0, c.k, kk), (jv, j0, c.n, nr)])?;
        let mask = ragged.then(|| self.b.mask(limits, &shape));
        let t = self.load_f32(op.operands[1], (b, b_index), mask, shape);
        let mut at = prefix.to_vec();
        at.extend([
            Affine::value(f)
                .scaled(kk as i64)
                .plus_scaled(1, &Affine::axis(ka)),
            Affine::axis(ja),
        ]);
        self.b.store(t, dst, at, None);
        self.b.end_for(vec![]);
        Ok(())
    }

    /// A block of a product's operand `buf` (read at `index`) to copy: for
    /// each of its two counters, the counter, the block's first value of
    /// it, the counter's extent and the block's size along it. The copy's
    /// tile axes follow the counters, or go the other way round when the
    /// operand is contiguous along the first counter and not the second
    /// (so that the tile's rows, along its last axis, are contiguous runs).
    /// Returns the tile's index into `buf`, its mask limits, its shape, and
    /// the tile axis each counter took.
    #[allow(clippy::type_complexity)]
    fn operand_block(
        &mut self,
        buf: LValue,
        index: &[IndexExpr],
        counters: [(LValue, Affine, i64, usize); 2],
    ) -> Result<(Vec<Affine>, Vec<Affine>, Vec<usize>, [usize; 2]), TileConvError> {
        let flip = self.unit_stride(buf, index, counters[0].0)
            && !self.unit_stride(buf, index, counters[1].0);
        let axes = if flip { [1, 0] } else { [0, 1] };
        let mut limits = vec![Affine::default(); 2];
        let mut shape = vec![0; 2];
        for ((var, first, extent, size), axis) in counters.into_iter().zip(axes) {
            self.index
                .insert(var, first.plus_scaled(1, &Affine::axis(axis)));
            limits[axis] = Affine::constant(extent).plus_scaled(-1, &first);
            shape[axis] = size;
        }
        let tile_index = index
            .iter()
            .map(|e| self.affine(e))
            .collect::<Result<_, _>>()?;
        Ok((tile_index, limits, shape, axes))
    }

    /// `index` (into a product's operand) with two of the product's
    /// counters at the given places.
    fn index_at(
        &mut self,
        index: &[IndexExpr],
        at: [(LValue, Affine); 2],
    ) -> Result<Vec<Affine>, TileConvError> {
        for (v, e) in at {
            self.index.insert(v, e);
        }
        index.iter().map(|e| self.affine(e)).collect()
    }

    /// Whether `index` into buffer `buf` moves by one element when `var`
    /// steps by one (the operand is contiguous along `var`).
    fn unit_stride(&self, buf: LValue, index: &[IndexExpr], var: LValue) -> bool {
        self.step(buf, index, var) == Some(1)
    }

    /// How many elements `index` into buffer `buf` moves when `var` steps
    /// by one.
    fn step(&self, buf: LValue, index: &[IndexExpr], var: LValue) -> Option<i64> {
        let LType::Buffer(view) = self.src.ty(buf) else {
            return None;
        };
        Some(
            index
                .iter()
                .zip(&view.strides)
                .map(|(e, &s)| {
                    s as i64
                        * e.terms
                            .iter()
                            .filter(|(_, v)| *v == var)
                            .map(|(c, _)| c)
                            .sum::<i64>()
                })
                .sum(),
        )
    }

    /// Whether each program of packed product `m` (of `blocks` blocks of
    /// rows) packs the panels it multiplies by itself, one at a time into
    /// scratch memory, rather than a kernel packing every panel into a
    /// global buffer first: with one block of rows each panel serves one
    /// program, so the global panels would be written and read back for
    /// nothing (W2's two 16 MB weights, W6's 28 MB). Not when another
    /// product reads the same operand: their pack kernels become one
    /// (`reuse_packs`: W7's 32 steps pack each weight once).
    fn packs_own_panels(&self, m: LOpId, blocks: usize) -> bool {
        let root = self.root_buffer(self.op(m).operands[1]);
        let readers = self
            .src
            .ops
            .iter()
            .filter(|o| matches!(o.kind, L::Matmul(_)))
            .filter(|o| {
                o.operands
                    .get(1)
                    .is_some_and(|&b| self.root_buffer(b) == root)
            })
            .count();
        blocks == 1 && readers == 1
    }

    /// Whether the right operand of product `m` depends on weights alone
    /// (a weight parameter, or a buffer computed from weights, through
    /// views): its panels are packed by a kernel of their own, which reads
    /// nothing else and so can run once, when the weights are bound (see
    /// `dlc_tile::transforms::split_prepare`).
    fn weight_operand(&self, m: LOpId) -> bool {
        let root = self.root_buffer(self.op(m).operands[1]);
        self.weight_derived.contains(&root)
    }

    /// Whether packed product `m` (of `blocks` blocks of rows) reads its
    /// right operand in place: one block of rows, the operand contiguous
    /// along the columns, and its rows a number of 64-byte lines apart
    /// coprime with the L1's sets (see [`Packing::l1_sets`]).
    fn reads_in_place(&self, m: LOpId, blocks: usize, sets: usize) -> bool {
        let op = self.op(m);
        let L::Matmul(c) = &op.kind else {
            return false;
        };
        let body = &op.regions[0];
        let (jv, kv) = (body.args[1], body.args[2]);
        let b = op.operands[1];
        let row_bytes = self.step(b, &c.b, kv).map(|s| s.unsigned_abs() * 4);
        blocks == 1
            && sets > 0
            && self.operand_dtype(b) == Some(DType::F32)
            && self.unit_stride(b, &c.b, jv)
            && row_bytes.is_some_and(|r| r > 0 && r % 64 == 0 && gcd(r / 64, sets as u64) == 1)
    }

    /// The `dot` schedule's blocks for contraction `c`: the parameters,
    /// clamped to the product's extents.
    fn dot_blocks(&self, c: &dlc_loop::Contraction) -> [usize; 3] {
        let [bm, bn, bk] = self.params.dot;
        [
            bm.min(c.m.max(1) as usize),
            bn.min(c.n.max(1) as usize),
            bk.min(c.k.max(1) as usize),
        ]
    }

    /// A contraction (and the parallel loops around it, `band`) as its own
    /// kernel: a grid over the batch and the result's blocks.
    fn dot_kernel(&mut self, band: &[LOpId], m: LOpId) -> Result<(), TileConvError> {
        let (_, c) = self.contraction(m)?;
        let blocks = self.dot_blocks(c);
        let row_blocks = (c.m.max(0) as usize).div_ceil(blocks[0]).max(1);
        self.dot_grid(band, m, blocks, (0, row_blocks), false)
    }

    /// The register tile of a narrow product on a CPU (`rows x n` for a
    /// product of `n` columns, at most the target's narrow tile's; fewer
    /// rows for a product of fewer), or `None`.
    fn narrow(&self, m: LOpId) -> Option<[usize; 2]> {
        let L::Matmul(c) = &self.op(m).kind else {
            return None;
        };
        let [rows, cols] = self.params.packed?.narrow?;
        let n = c.n.max(1) as usize;
        (n <= cols).then_some([rows.min(c.m.max(1) as usize), n])
    }

    /// A narrow product (at most the target's `narrow_n` columns: W8's 16
    /// and 7) on a CPU, without packing: each program takes `rows` rows and every
    /// column, and each step of the depth broadcasts one element of each of
    /// its rows of the left operand straight from memory against one row of
    /// the right one (`rows x 1` by `1 x n`), so the left operand (W8's
    /// 29 MB adjacency) is read once and never copied. The blocks that end
    /// within the rows are one kernel with no masks on the rows; the last,
    /// ragged block is a second kernel of one program.
    fn narrow_kernels(
        &mut self,
        band: &[LOpId],
        m: LOpId,
        [rows, n]: [usize; 2],
    ) -> Result<(), TileConvError> {
        let (_, c) = self.contraction(m)?;
        let total = c.m.max(0) as usize;
        let full = total / rows;
        if full > 0 {
            self.dot_grid(band, m, [rows, n, 1], (0, full), true)?;
        }
        if !total.is_multiple_of(rows) {
            self.dot_grid(band, m, [rows, n, 1], (full, 1), false)?;
        }
        Ok(())
    }

    /// The kernel of blocks `bm x bn x bk` of contraction `m` over the
    /// batch (`band`), row blocks `first..first + count` and every column
    /// block. `exact_rows`: every row block ends within the rows (no masks
    /// on them).
    fn dot_grid(
        &mut self,
        band: &[LOpId],
        m: LOpId,
        [bm, bn, bk]: [usize; 3],
        (first, count): (usize, usize),
        exact_rows: bool,
    ) -> Result<(), TileConvError> {
        let (_, c) = self.contraction(m)?;
        let mut grid: Vec<usize> = band
            .iter()
            .map(|l| {
                let (lo, hi, _) = loop_bounds(&self.op(*l).kind).unwrap_or((0, 1, 1));
                (hi - lo).max(1) as usize
            })
            .collect();
        grid.push(count);
        grid.push((c.n.max(0) as usize).div_ceil(bn).max(1));
        let schedule = Schedule::Dot {
            tile: [bm, bn, bk],
            staged: self.params.stage_shared,
        };
        self.b.begin_kernel(grid, schedule);
        for (axis, l) in band.iter().enumerate() {
            let op = self.op(*l);
            let (lo, _, _) = loop_bounds(&op.kind).unwrap_or((0, 1, 1));
            let pid = self.b.program_id(axis);
            self.index.insert(
                op.regions[0].args[0],
                Affine::value(pid).plus_scaled(1, &Affine::constant(lo)),
            );
        }
        let pi = self.b.program_id(band.len());
        let pj = self.b.program_id(band.len() + 1);
        let i0 = Affine::value(pi)
            .scaled(bm as i64)
            .plus_scaled(1, &Affine::constant((first * bm) as i64));
        let j0 = Affine::value(pj).scaled(bn as i64);
        self.dot_block(m, i0, j0, [bm, bn, bk], true, exact_rows)?;
        self.b.end_kernel();
        Ok(())
    }

    /// A contraction inside a program: counted loops over its blocks.
    fn dot_in_program(&mut self, m: LOpId) -> Result<(), TileConvError> {
        let (_, c) = self.contraction(m)?;
        let [bm, bn, bk] = self.dot_blocks(c);
        let (ci, _) = self.b.begin_for(0, c.m, bm as i64, &[]);
        let (cj, _) = self.b.begin_for(0, c.n, bn as i64, &[]);
        self.dot_block(
            m,
            Affine::value(ci),
            Affine::value(cj),
            [bm, bn, bk],
            false,
            false,
        )?;
        self.b.end_for(vec![]);
        self.b.end_for(vec![]);
        Ok(())
    }

    /// One `bm x bn` block of contraction `m` at rows `i0`, columns `j0`:
    /// the K loop of `tile.dot`s, then the epilogue on the accumulator.
    /// `shared`: whether operands may be staged through shared memory
    /// (only at a kernel's top level, where every program reaches the
    /// barriers). `exact_rows`: the block ends within the rows.
    fn dot_block(
        &mut self,
        m: LOpId,
        i0: Affine,
        j0: Affine,
        [bm, bn, bk]: [usize; 3],
        shared: bool,
        exact_rows: bool,
    ) -> Result<(), TileConvError> {
        let (op, c) = self.contraction(m)?;
        let body: &'a LBlock = &op.regions[0];
        let (iv, jv, kv, accv) = (body.args[0], body.args[1], body.args[2], body.args[3]);
        let (a, bbuf) = (self.buffer(op.operands[0])?, self.buffer(op.operands[1])?);
        let dtype = match self.b.ty(a) {
            Type::Buffer(t) => t.dtype,
            _ => DType::F32,
        };
        let acc_dtype = self.result_dtype(accv);
        let stage = shared && self.params.stage_shared;
        let zero = self
            .b
            .constant(0.0, Type::Tile(TileType::new(acc_dtype, vec![bm, bn])));
        let ragged_m = !exact_rows && !(c.m as usize).is_multiple_of(bm);
        let ragged_n = !(c.n as usize).is_multiple_of(bn);
        let ragged_k = !(c.k as usize).is_multiple_of(bk);
        let rows_left = Affine::constant(c.m).plus_scaled(-1, &i0);
        let cols_left = Affine::constant(c.n).plus_scaled(-1, &j0);
        let ta = Type::Tile(TileType::new(dtype, vec![bm, bk]));
        let tb = Type::Tile(TileType::new(dtype, vec![bk, bn]));
        // The operand blocks at depth `k0` (i -> i0 + #0, k -> k0 + #1 for
        // the left operand; k -> k0 + #0, j -> j0 + #1 for the right one),
        // masked on ragged edges (and always along the depth when
        // `past_end`: a prefetch may go beyond it, reading zeros).
        let blocks = |this: &mut Self,
                      k0: Affine,
                      past_end: bool|
         -> Result<(Value, Value), TileConvError> {
            let depth_left = Affine::constant(c.k).plus_scaled(-1, &k0);
            let mask_k = ragged_k || past_end;
            this.index.insert(iv, i0.plus_scaled(1, &Affine::axis(0)));
            this.index.insert(kv, k0.plus_scaled(1, &Affine::axis(1)));
            let a_index: Vec<Affine> =
                c.a.iter()
                    .map(|e| this.affine(e))
                    .collect::<Result<_, _>>()?;
            let a_mask = (ragged_m || mask_k).then(|| {
                this.b
                    .mask(vec![rows_left.clone(), depth_left.clone()], &[bm, bk])
            });
            let at = this
                .b
                .load(a, a_index, a_mask, a_mask.map(|_| 0.0), ta.clone());
            this.index.insert(kv, k0.plus_scaled(1, &Affine::axis(0)));
            this.index.insert(jv, j0.plus_scaled(1, &Affine::axis(1)));
            let b_index: Vec<Affine> =
                c.b.iter()
                    .map(|e| this.affine(e))
                    .collect::<Result<_, _>>()?;
            let b_mask = (mask_k || ragged_n)
                .then(|| this.b.mask(vec![depth_left, cols_left.clone()], &[bk, bn]));
            let bt = this
                .b
                .load(bbuf, b_index, b_mask, b_mask.map(|_| 0.0), tb.clone());
            Ok((at, bt))
        };
        let next = if stage {
            // Two stages: while one slot of each shared buffer feeds the
            // product, the next depth slice is copied into the other, so
            // one barrier per slice orders both. The loop takes two slices
            // per iteration (slots 0 and 1 alternate without an index
            // computed at run time), rounded up: slices past the depth
            // are masked to zeros.
            let sa = self.b.alloc(BufferType::contiguous(
                dtype,
                vec![2, bm, bk],
                Space::Shared,
            ));
            let sb = self.b.alloc(BufferType::contiguous(
                dtype,
                vec![2, bk, bn],
                Space::Shared,
            ));
            let slot = |s: i64| vec![Affine::constant(s), Affine::axis(0), Affine::axis(1)];
            let (at, bt) = blocks(self, Affine::constant(0), false)?;
            self.b.store(at, sa, slot(0), None);
            self.b.store(bt, sb, slot(0), None);
            self.b.barrier();
            let pairs = (c.k.max(1) as usize).div_ceil(2 * bk);
            let (kb, accs) = self
                .b
                .begin_for(0, (pairs * 2 * bk) as i64, 2 * bk as i64, &[zero]);
            let mut acc = accs[0];
            for s in 0..2i64 {
                let ahead =
                    Affine::value(kb).plus_scaled(1, &Affine::constant((s + 1) * bk as i64));
                let (at, bt) = blocks(self, ahead, true)?;
                self.b.store(at, sa, slot(1 - s), None);
                self.b.store(bt, sb, slot(1 - s), None);
                let x = self.b.load(sa, slot(s), None, None, ta.clone());
                let y = self.b.load(sb, slot(s), None, None, tb.clone());
                acc = self.b.dot(x, y, acc);
                self.b.barrier();
            }
            acc
        } else {
            let (kb, accs) = self.b.begin_for(0, c.k, bk as i64, &[zero]);
            let (at, bt) = blocks(self, Affine::value(kb), false)?;
            self.b.dot(at, bt, accs[0])
        };
        let acc = self.b.end_for(vec![next])[0];
        // The epilogue on the accumulator: i -> i0 + #0, j -> j0 + #1.
        self.index.insert(iv, i0.plus_scaled(1, &Affine::axis(0)));
        self.index.insert(jv, j0.plus_scaled(1, &Affine::axis(1)));
        self.index.insert(kv, Affine::constant(0));
        self.values.insert(accv, acc);
        let saved = (
            std::mem::take(&mut self.shape),
            self.mask.take(),
            std::mem::take(&mut self.splats),
        );
        self.shape = vec![bm, bn];
        self.mask =
            (ragged_m || ragged_n).then(|| self.b.mask(vec![rows_left, cols_left], &[bm, bn]));
        let result = self.ops(&body.ops);
        (self.shape, self.mask, self.splats) = saved;
        result
    }
}

/// The greatest common divisor.
/// Whether `e` is exactly the counter `v`.
fn is_counter(e: &IndexExpr, v: LValue) -> bool {
    e.constant == 0 && e.terms == [(1, v)]
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Every value op `id` and its nested ops read (operands and index values).
fn collect_uses(f: &LFunction, id: LOpId, out: &mut Vec<LValue>) {
    let op = f.op(id);
    out.extend(&op.operands);
    let index: &[IndexExpr] = match &op.kind {
        L::Load { index, .. } | L::Store { index } => index,
        _ => &[],
    };
    for e in index {
        out.extend(e.terms.iter().map(|t| t.1));
    }
    if let L::Matmul(c) = &op.kind {
        for e in c.a.iter().chain(&c.b) {
            out.extend(e.terms.iter().map(|t| t.1));
        }
    }
    for r in &op.regions {
        for &o in &r.ops {
            collect_uses(f, o, out);
        }
    }
}
