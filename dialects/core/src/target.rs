//! Target descriptions: the one statement of what a machine offers, read
//! by the loop -> tile conversion (schedules, tile sizes), the CPU back end
//! (its micro-kernel and blocking) and the equality-saturation cost model
//! (which products run on the register tile). No back-end constant is
//! written anywhere else.
//!
//! # What a description holds, and who reads it
//!
//! `TargetDesc` is the one statement of what a target offers: for a CPU the vector width
//! and registers, FMA/AVX512-BF16, cores, L1/L2 sizes and L1 sets, and its memory system
//! (FMA units, the L3 a core can count on, bytes a cycle from the L3 and from memory),
//! which `ops::winograd_pays` and the Winograd kernel's blocks read; for a GPU the compute capability,
//! warp size, threads and shared memory per block, multiprocessors and tensor-core
//! (`mma`) shapes per element type. `TargetDesc::host()` is what `native` means for the
//! process: the CPU `DLC_CPU` names when it is set (any name `--cpu` takes, so that an
//! AVX-512 machine compiles, schedules, prices and runs everything as an AVX2 one would
//! under `DLC_CPU=x86-64-v3`), else this machine (AVX-512 when it has AVX512F, else AVX2).
//! A `DLC_CPU` that `--cpu` does not know, or whose level's instructions this machine
//! lacks (its code would not run here), is an error that `dlc` and `dlc-opt` report before
//! anything else (`check_cpu_env`) and that `for_cpu("native")`/`named("host")` return;
//! `host()` itself never fails. The variable is read once, with the host's description.
//! The target is an argument everywhere code is decided: `fusion::plan`, the graph
//! rules that choose how a convolution runs (`ops::conv_is_winograd`,
//! `conv_is_im2col_product`), the saturation cost model (`graph.saturate{target=..}`,
//! `PassOptions::target`: `dlc compile` and `dlc run` price for `--target`),
//! `convert-graph-to-loop{target=..}` / `dlc_lower::lower_module(m, target)` (parallel
//! loops, Winograd's vector width) and `convert-loop-to-tile`. `host()` is read only
//! where this machine is meant: the driver's default target, the JIT, the emulator and
//! MLIR's execution engine (the LLVM code generator cuts tiles by the lanes of the target
//! it compiles for). Invariant (tested by
//! `the_loop_ir_depends_on_the_target_not_the_host`): the same source and `--target` give
//! the same graph and loop IR on any machine. `named` knows `host`, `x86-64-avx512`,
//! `x86-64-avx2`, `sm_80`, `sm_90` (`--target`). Derived from it, and written nowhere
//! else: `lanes(dtype)`, the packed product kernel's blocking `gemm_blocking(dtype)`
//! (MR rows by two vectors, MC=144 rows, KC=256: 6x32x256 with AVX-512, 4x16 with
//! AVX2; 64x64x32 thread-block tiles on a GPU; a narrow product, of at most `narrow_n`
//! columns, runs unpacked in tiles of `narrow_mr` rows by its columns: 16 x 16 (one
//! vector) with AVX-512, 6 x 16 (one register tile: two vectors) with AVX2, whose
//! 16-column products have one panel, so packing copied their left operand for a single
//! use), `packs_product(dtype, macs)` (f32 with
//! at least 16K multiply-adds), `min_units` (the fewest programs a packed product is cut
//! into, so threads are balanced) and `min_thread_iterations`. The conversion's
//! schedules, the code generator's threading, the lowering's choice of im2col
//! convolutions and the saturation cost model's register-tile rounding all read them.
//! It lives in dlc-core rather than compiler/lower because the cost model (dlc-graph)
//! reads it too.

use crate::DType;

/// A CPU: vector width, registers, caches, cores, and the blocking of its
/// packed matrix-product kernel, derived from those.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuDesc {
    /// Bits of one vector register (512 with AVX-512, 256 with AVX2).
    pub vector_bits: usize,
    /// Vector registers (32 with AVX-512, 16 with AVX2).
    pub vector_registers: usize,
    /// Whether fused multiply-add exists.
    pub fma: bool,
    /// Whether AVX-512 BF16 instructions exist (bf16 dot products).
    pub avx512_bf16: bool,
    /// Cores the runtime's thread pool may use.
    pub cores: usize,
    /// Level-1 data cache per core, bytes.
    pub l1_bytes: usize,
    /// Sets of the level-1 data cache (of 64-byte lines): lines a multiple
    /// of `64 * l1_sets` bytes apart compete for one set's ways.
    pub l1_sets: usize,
    /// Level-2 cache per core, bytes.
    pub l2_bytes: usize,
    /// The level-3 cache one core can count on holding what it reads
    /// again, bytes: a buffer larger than this comes from memory each time.
    pub l3_bytes: usize,
    /// Vector fused multiply-adds (or multiplies and adds, without FMA) a
    /// core starts each cycle at the full `vector_bits`: 2 on Intel's
    /// server cores with AVX-512, on Zen 2, 3 and 5; 1 on Zen 4, which
    /// splits a 512-bit instruction over its two 256-bit units.
    pub fma_units: usize,
    /// Bytes one core streams from its L3 each cycle: about 8 on Intel's
    /// server cores, whose L3 is slices on a mesh (measured with
    /// `scripts/mem_bw.c`: 25-30 GB/s from 4 to 16 MB on a 2.6 GHz Xeon,
    /// Emerald Rapids); 16 on AMD's Zen cores (on two cores of a 3.6 GHz Zen
    /// 5 EPYC: 63-82 GB/s for one alone from 8 to 16 MB, 42-65 each while
    /// both stream; the design's 32 made Winograd re-read a 9.4 MB kernel
    /// per block of tile rows there, 0.89 ms a 14 x 14 x 256 convolution
    /// at one thread against 0.81 read once in chunks).
    pub l3_bytes_per_cycle: usize,
    /// Bytes a core streams from memory each cycle while every core of
    /// `cores` streams too (code compiled for them runs them all at once):
    /// 5 on Zen cores (`scripts/mem_bw.c 2` on two cores of a Zen 5 EPYC at
    /// 3.6 GHz: 19 GB/s each from 128 MB, 32-37 GB/s for one alone); about
    /// 4 on that Xeon (12 GB/s from 64 MB up, one core alone: what two get
    /// is not measured).
    pub memory_bytes_per_cycle: usize,
    /// The CPU code is generated for, as LLVM names it (`x86-64-v3`), or
    /// `None` for the machine the compiler runs on (its CPU and features,
    /// as LLVM detects them).
    pub llvm_cpu: Option<String>,
    /// The target triple, or `None` for the machine the compiler runs on.
    pub triple: Option<String>,
}

impl CpuDesc {
    /// Whether masks are predicate registers (AVX-512's): a masked store is
    /// one instruction as fast as a plain one, and a padded load's mask of
    /// lanes inside the buffer one compare per vector. Elsewhere masks are
    /// vectors: AVX2's `vmaskmovps` store is microcode on AMD's Zen 1-3
    /// (half of a 1 x 1 convolution's time on Zen 3), its lanes are
    /// compared four 64-bit ones at a time, and SSE and Advanced SIMD store
    /// lane by lane. There code generation stores plainly when a store's
    /// lanes are all on, and graph -> loop runs a padded direct
    /// convolution's middle apart from its borders, with unpadded loads.
    pub fn mask_registers(&self) -> bool {
        self.vector_bits >= 512
    }

    /// Ways of each set of the level-1 data cache (8 on Zen 4's 32 KB of
    /// 64 sets).
    pub fn l1_ways(&self) -> usize {
        self.l1_bytes / (64 * self.l1_sets).max(1)
    }

    /// Multiply-adds of f32 a core starts each cycle at its peak.
    pub fn macs_per_cycle(&self) -> usize {
        self.vector_bits / 32 * self.fma_units
    }

    /// Bytes a core streams each cycle from where a buffer of `bytes` it
    /// read before now is: its L3 when it fits there, else memory.
    pub fn reread_bytes_per_cycle(&self, bytes: usize) -> usize {
        if bytes <= self.l3_bytes {
            self.l3_bytes_per_cycle
        } else {
            self.memory_bytes_per_cycle
        }
    }

    /// This description made AMD's Zen `generation` (4 or 5): the L3 and
    /// memory of Zen's cores (as [`TargetDesc::x86_64_avx2`] states them),
    /// 1 MB of L2 a core (Intel's AVX-512 cores have 1 to 2), an L1 of 32
    /// KB (Zen 4) or 48 (Zen 5), and one 512-bit FMA unit (Zen 4 splits
    /// each into two 256-bit halves) or two (Zen 5). With the L2 at Intel's
    /// 2 MB, a 1 x 1 convolution's input of 1 to 2 MB was taken to fit it
    /// and its panel copies went without prefetches (`prefetches_panels`):
    /// on Zen 4, MobileNetV2's 32 -> 16 projection over 112 x 112 took
    /// 0.195 ms in the model, 0.151 with them.
    fn zen(mut self, generation: u32) -> CpuDesc {
        if let TargetKind::Cpu(zen) = TargetDesc::x86_64_avx2(1).kind {
            self.l3_bytes = zen.l3_bytes;
            self.l3_bytes_per_cycle = zen.l3_bytes_per_cycle;
            self.memory_bytes_per_cycle = zen.memory_bytes_per_cycle;
        }
        self.l2_bytes = 1 << 20;
        let zen5 = generation >= 5;
        self.l1_bytes = if zen5 { 48 << 10 } else { 32 << 10 };
        self.fma_units = if zen5 { 2 } else { 1 };
        self
    }
}

/// The register-tiled product kernel's blocking (BLIS's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmBlocking {
    /// Rows of the register tile.
    pub mr: usize,
    /// Rows of a taller register tile a packed product takes where it is
    /// deep and its rows pad about as few as `mr`'s ([`takes_taller_tile`]):
    /// AVX2's 6 (12 accumulators), `mr` itself where there is no choice.
    /// AVX2's 4-row tile has 8 accumulators, exactly the FMA latency (4)
    /// times its two units, and ran 10-14% slower in some kernels than in
    /// others of the same loop (in the loop itself, not the epilogue, and
    /// whatever the loop's alignment; the cause is not pinned down): a
    /// 128 x 768 x 3072 product with GELU 7.1-7.4 ms against 6.3-6.6
    /// without, 6.5 either way with 6 rows (Zen 3, one thread).
    pub tall_mr: usize,
    /// Columns of the register tile (whole vectors).
    pub nr: usize,
    /// Rows of the left operand packed at once (a multiple of `mr`).
    pub mc: usize,
    /// Depth of the packed panels.
    pub kc: usize,
    /// Vector lanes of the element type.
    pub lanes: usize,
    /// A parallel product is cut into at least this many units of work.
    pub min_units: usize,
    /// Columns of the widest narrow product (W8's 16 and 7), which runs
    /// unpacked in tiles of `narrow_mr` rows by its own columns: one
    /// register tile's (`nr`) on a CPU of 16 vector registers, where such a
    /// product has one panel and packing would copy its left operand for a
    /// single use (W8 on AVX2: 18.1 -> 6.7 ms); one vector on AVX-512, where
    /// `mr x nr`'s second vector would be all padding (whether two-vector
    /// narrow tiles, and losing the fused schedules that need packed
    /// products, pay there is not measured).
    pub narrow_n: usize,
    /// Rows of a narrow product's tile: its accumulators (one per vector of
    /// `narrow_n` per row), the right operand's vectors and a broadcast fit
    /// the registers, at most half of them accumulators (16 x 16 with
    /// AVX-512, 6 x 16 with AVX2).
    pub narrow_mr: usize,
    /// Whether the depth steps in pairs of the element type, which one
    /// instruction multiplies into f32 (AVX-512 BF16's `vdpbf16ps`): the
    /// operands stay in their own type in the packed strips and panels
    /// rather than being widened to f32.
    pub pairs: bool,
    /// The least depth and output channels at which a 1 x 1 (or im2col)
    /// convolution over few pixels (7 x 7: 49 in panels of 64) runs with
    /// the pixels as its product's rows and each register tile stored
    /// transposed, `nr` runs of `mr` elements. Measured with `dlc bench`,
    /// one thread, the two orientations alternating. Zen 4 with AVX-512
    /// (6 x 32 tiles): 32 deep into 192 channels 7.6 -> 11.7 us, 1152 deep
    /// into 192 264 -> 300 us and into 320 443 -> 501, but 160 deep into
    /// 960 194 -> 181 and 512 into 2048 1.23 -> 1.07 ms: (128, 512). Zen 3
    /// with AVX2 (6 x 16 tiles), over 7 x 7: 1152 into 192 0.302 -> 0.264
    /// ms, into 320 0.497 -> 0.417, 960 into 160 0.222 -> 0.184, 288 into
    /// 48 0.020 -> 0.018, 96 into 576 0.083 -> 0.074, 48 into 288 0.025 ->
    /// 0.023, but 32 into 192 0.011 both: (48, 32); with 4 x 16 tiles
    /// still so (1152 into 192 0.242 ms as rows against 0.299 as columns,
    /// 160 into 960 0.168 against 0.205). A product qualifies by either
    /// pair. Zen 5 (AVX-512 at two full-width FMA units a cycle), one
    /// thread, then two: over 7 x 7 960 deep into 320 0.156 -> 0.125 ms,
    /// 0.081 -> 0.068; 1152 into 320 0.194 -> 0.159, 0.103 -> 0.090; over
    /// 14 x 14 1024 into 256 0.477 -> 0.434, 0.248 -> 0.223. Into fewer
    /// channels it gains at one thread and loses at two, where its pixel
    /// strips split unevenly (960 into 160 0.082 -> 0.065, 0.064 -> 0.077;
    /// 576 into 96 0.029 -> 0.024, 0.019 -> 0.045); 384 into 64 over 14 x
    /// 14 loses at one (0.045 -> 0.050), 80 into 480 too (0.066 -> 0.088);
    /// 160 into 960 over 7 x 7 0.074 -> 0.070 and 2048 into 512 0.54 ->
    /// 0.41: (128, 512) or (512, 256). Intel's cores, with two FMA units
    /// too, are not measured and take Zen 5's. Zen 4, splitting each
    /// 512-bit FMA, measured again on the code of 2026-12-03 (a bias, no
    /// residual; one thread, then two, five to seven alternated rounds):
    /// over 7 x 7 960 into 320 0.363 -> 0.290 ms, 0.207 -> 0.191; 1152
    /// into 320 0.471 -> 0.387, 0.361 -> 0.267; 672 into 192 0.159 ->
    /// 0.132 (two threads 0.82 and 1.18 of the rows' in two runs); 576
    /// into 160 0.118 -> 0.092, 0.082 -> 0.079; over 14 x 14 1024 into 256
    /// 1.114 -> 1.036, 0.608 -> 0.579; but 480 into 112 0.234 both and 576
    /// into 96 over 7 x 7 0.068 -> 0.057 at one thread, 0.038 -> 0.062 at
    /// two (three panels for two threads): (128, 512) or (512, 160). With
    /// a residual they gain at one thread and lose at two (960 into 160
    /// 0.196 -> 0.158, 0.195 -> 0.269; 512 into 2048 1.274 -> 1.281, 0.656
    /// -> 0.869), so there the channels stay the rows
    /// (`graph_to_loop`'s `pixels_as_rows`).
    pub pixel_rows_min: [(usize, usize); 2],
    /// The depth and channels from which a 1 x 1 convolution whose pixels
    /// would pad more than a fifth of the columns it runs
    /// ([`Self::padded_columns`]: 49 pixels in 64) takes them as its rows,
    /// with a residual or without, where [`Self::pixel_rows_min`] does not
    /// hold: the padding saved pays for the transposed stores sooner. Only
    /// where the target has a half-panel tile, which splits the few
    /// channel panels that leaves evenly between two threads (`packed.rs`'s
    /// `balancing_tile`; without it Zen 5 lost at two threads, above). Zen
    /// 4, MobileNetV3-small's six products over 7 x 7 (96 into 576, 288
    /// and 576 into 96, two with a residual; 576 into 96 cut out 0.065 ->
    /// 0.053 ms at one thread, 0.034 -> 0.027 at two), the whole model
    /// 1.58 -> 1.52 ms at one thread, 0.927 -> 0.900 at two (`p25`,
    /// alternated): (96, 96). Elsewhere unmeasured: never.
    pub few_pixel_rows_min: (usize, usize),
    /// The register tile, `[rows, columns]`, of a product whose last panel
    /// of `nr` columns would be at most half full (196 pixels, 14 x 14, in
    /// seven panels of 32, the last holding 4): twice the rows by one
    /// vector, so that the columns pad to a vector rather than a panel
    /// (where that pads at least a twentieth fewer: `packed.rs`). On
    /// Zen 4 (one 512-bit FMA a cycle), `12 x 16` against `6 x 32`, one
    /// thread, alternated: 96 -> 576 over 14 x 14 0.222 -> 0.203 ms, 576
    /// -> 96 0.225 -> 0.209, in ResNet-50 its 256 -> 1024s with their
    /// residual 1.16 -> 1.05 ms each; MobileNetV2 2.2% and EfficientNet-B0
    /// 2.8% less in all (`dlc bench --profile`, per node). A full panel's
    /// tile stays `mr x nr`: `12 x 16` took 10% more over 1024^3. Not
    /// measured on cores of two FMA units (Zen 5, Intel's), whose 12 x 16
    /// tile would load about twice a cycle, nor on AVX2: `None` there.
    pub half_panel_tile: Option<[usize; 2]>,
}

/// Whether a product of `n` columns takes a half-panel register tile
/// `width` columns wide (`GemmBlocking::half_panel_tile`) rather than panels
/// of `nr`: its last panel would be at most half full and its columns pad
/// at least a twentieth fewer (196 pixels: 208 against 224, measured 7-9%
/// faster; 784: 784 against 800, not measured).
pub fn half_panel_pads_less(n: usize, nr: usize, width: usize) -> bool {
    let last = n % nr;
    last > 0 && 2 * last <= nr && n.next_multiple_of(width) * 20 <= n.next_multiple_of(nr) * 19
}

/// Whether a packed product of `rows` rows and `depth` deep takes a
/// register tile of `tall` rows rather than `mr` (`GemmBlocking::tall_mr`):
/// it is at least one `kc` slice deep, where the tile's loop dominates
/// (shallower products pay more for a taller tile's stores and epilogue:
/// RegNetY's 208 -> 208 over 14 x 14 8% slower, its 32 -> 48 over 112 x
/// 112 10%), and its rows, rounded up to whole tiles, are at most a
/// thirty-second more (128 rows: 132 against 128; 16 and 32 stay at 4,
/// which 6 would pad to 18 and 36, RegNet's groups of 8 channels too).
pub fn takes_taller_tile(rows: usize, depth: usize, [mr, tall, kc]: [usize; 3]) -> bool {
    tall > mr && depth >= kc && rows.next_multiple_of(tall) * 32 <= rows.next_multiple_of(mr) * 33
}

impl GemmBlocking {
    /// The columns a packed product of `n` columns runs: `n` rounded up to
    /// its register tile's width, the half-panel tile's where it takes one
    /// ([`half_panel_pads_less`]).
    pub fn padded_columns(&self, n: usize) -> usize {
        let (_, nr) = self.register_tile(n);
        match self.half_panel_tile {
            Some([_, width]) if half_panel_pads_less(n, nr, width) => n.next_multiple_of(width),
            _ => n.next_multiple_of(nr),
        }
    }

    /// The register tile of a product of `n` columns, as rows and the
    /// columns its width is rounded up to: `narrow_mr x lanes` for a narrow
    /// one (its tile is as many vectors as `n` needs), else `mr x nr`.
    pub fn register_tile(&self, n: usize) -> (usize, usize) {
        if n <= self.narrow_n && self.nr > self.lanes {
            (self.narrow_mr, self.lanes)
        } else {
            (self.mr, self.nr)
        }
    }
}

/// An NVIDIA GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDesc {
    /// Compute capability, e.g. `(9, 0)` for sm_90.
    pub compute_capability: (u32, u32),
    /// Threads of a warp.
    pub warp_size: usize,
    /// Most threads of one block.
    pub max_threads_per_block: usize,
    /// Shared memory one block may use, bytes (the opt-in maximum).
    pub shared_memory_per_block: usize,
    /// Streaming multiprocessors (for sizing grids).
    pub multiprocessors: usize,
    /// Banks of shared memory and the bytes of each: a warp's access is
    /// served at once when no two lanes read different words of one bank
    /// (word `w` is in bank `w mod banks`).
    pub shared_banks: (usize, usize),
    /// Bytes one asynchronous copy from global to shared memory
    /// (`cp.async`) moves at most: a thread's run of elements in a copy.
    pub async_copy_bytes: usize,
    /// Tensor-core instruction shapes `(m, n, k)` per input type; the
    /// accumulator is that type's accumulator (f32 for f16/bf16).
    pub mma: Vec<(DType, [usize; 3])>,
}

/// What a target is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetKind {
    /// An x86-64 CPU.
    Cpu(CpuDesc),
    /// An NVIDIA GPU.
    Gpu(GpuDesc),
}

/// A target: its name (`x86-64-avx512`, `sm_90`) and what it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetDesc {
    /// The name `--target` takes.
    pub name: String,
    /// CPU or GPU.
    pub kind: TargetKind,
}

/// The levels [`TargetDesc::for_cpu`] knows.
pub const CPU_LEVELS: [&str; 5] = ["native", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"];

/// The LLVM CPU names `--cpu` takes beside the levels: each with the level
/// whose vector code it gets (its registers and width) and whether it has
/// AVX-512 BF16.
pub const LLVM_CPUS: [(&str, &str, bool); 19] = [
    ("nehalem", "x86-64-v2", false),
    ("sandybridge", "x86-64-v2", false),
    ("ivybridge", "x86-64-v2", false),
    ("haswell", "x86-64-v3", false),
    ("broadwell", "x86-64-v3", false),
    ("skylake", "x86-64-v3", false),
    ("alderlake", "x86-64-v3", false),
    ("znver1", "x86-64-v3", false),
    ("znver2", "x86-64-v3", false),
    ("znver3", "x86-64-v3", false),
    ("skylake-avx512", "x86-64-v4", false),
    ("cascadelake", "x86-64-v4", false),
    ("icelake-client", "x86-64-v4", false),
    ("icelake-server", "x86-64-v4", false),
    ("tigerlake", "x86-64-v4", false),
    ("cooperlake", "x86-64-v4", true),
    ("sapphirerapids", "x86-64-v4", true),
    ("znver4", "x86-64-v4", true),
    ("znver5", "x86-64-v4", true),
];

/// The environment variable that makes `native` (the `host` target, `--cpu
/// native`, the JIT, the schedules and the cost model) mean another CPU for
/// the whole process: any name `--cpu` takes (`DLC_CPU=x86-64-v3`), so that
/// a machine with AVX-512 compiles and runs as an AVX2 one would.
pub const CPU_ENV: &str = "DLC_CPU";

/// The names [`TargetDesc::named`] knows.
pub const TARGET_NAMES: [&str; 6] = [
    "host",
    "x86-64-avx512",
    "x86-64-avx2",
    "aarch64-linux-gnu",
    "sm_80",
    "sm_90",
];

/// Contractions with fewer multiply-adds than this are not packed: packing
/// costs more than it saves.
const MIN_PACKED_MACS: usize = 16 * 1024;

/// A packed product of one program is split along its depth into programs
/// of at least this many multiply-adds each (about 25 us of one core's
/// register tile on AVX-512): fewer would cost more in the second kernel,
/// which adds the splits' sums, than the threads save.
const MIN_SPLIT_MACS: usize = 1 << 20;

/// A parallel loop with fewer iterations than this is looked through for a
/// wider one inside before being spread over threads.
const MIN_THREAD_ITERATIONS: usize = 8;

/// A kernel of fewer programs than [`MIN_THREAD_ITERATIONS`] (but two or
/// more) still runs on threads when it does at least this many element
/// operations (`dlc_tile::ir::op_work`; a million multiply-adds, about 20
/// us of one core): ResNet's Winograd convolutions over 14 x 14 and 7 x 7
/// are two to seven programs of up to 1.4 ms each, and ran on one thread.
const MIN_THREAD_WORK: f64 = (2 << 20) as f64;

/// A kernel on threads of at least this many element operations (about
/// 160 us of one core) hands its programs out from a word per thread, a
/// held-up thread's left to the others, rather than in fixed shares: the
/// compare-exchange a program and the words' cache lines cost about half
/// a microsecond a launch, 4% of MobileNetV3-small's two-thread call when
/// every kernel did (docs/performance.md).
const MIN_CLAIM_WORK: f64 = (16 << 20) as f64;

/// The instructions code for the x86-64 `level` (and AVX-512 BF16 when
/// `bf16`) uses that this machine lacks, by the names `/proc/cpuinfo` gives.
#[cfg(target_arch = "x86_64")]
fn host_lacks(level: &str, bf16: bool) -> Vec<&'static str> {
    use std::arch::is_x86_feature_detected as has;
    let rank = CPU_LEVELS[1..]
        .iter()
        .position(|&l| l == level)
        .unwrap_or(0);
    // Each level's instructions (LLVM's definitions), by the first level
    // (1: v2, 2: v3, 3: v4) that has them.
    let wanted = [
        (1, "ssse3", has!("ssse3")),
        (1, "sse4_2", has!("sse4.2")),
        (1, "popcnt", has!("popcnt")),
        (1, "cx16", has!("cmpxchg16b")),
        (2, "avx2", has!("avx2")),
        (2, "fma", has!("fma")),
        (2, "bmi2", has!("bmi2")),
        (2, "f16c", has!("f16c")),
        (2, "movbe", has!("movbe")),
        (2, "lzcnt", has!("lzcnt")),
        (3, "avx512f", has!("avx512f")),
        (3, "avx512bw", has!("avx512bw")),
        (3, "avx512cd", has!("avx512cd")),
        (3, "avx512dq", has!("avx512dq")),
        (3, "avx512vl", has!("avx512vl")),
    ];
    let bf16_lacking = (bf16 && !has!("avx512bf16")).then_some("avx512_bf16");
    wanted
        .into_iter()
        .filter(|&(from, _, present)| from <= rank && !present)
        .map(|(_, name, _)| name)
        .chain(bf16_lacking)
        .collect()
}

/// The family of this machine's CPU (CPUID leaf 1, with its extended
/// family added) when AMD made it.
#[cfg(target_arch = "x86_64")]
fn amd_family() -> Option<u32> {
    use std::arch::x86_64::__cpuid;
    let vendor = __cpuid(0);
    let amd = [vendor.ebx, vendor.edx, vendor.ecx] == [0x6874_7541, 0x6974_6e65, 0x444d_4163];
    let eax = __cpuid(1).eax;
    let family = (eax >> 8) & 0xf;
    amd.then_some(if family == 0xf {
        family + ((eax >> 20) & 0xff)
    } else {
        family
    })
}

/// Off x86-64, every x86-64 CPU's code is foreign.
#[cfg(not(target_arch = "x86_64"))]
fn host_lacks(_level: &str, _bf16: bool) -> Vec<&'static str> {
    vec!["the x86-64 instruction set"]
}

impl TargetDesc {
    /// An x86-64 CPU with AVX-512 (F, FMA): 32 registers of 512 bits.
    pub fn x86_64_avx512(cores: usize) -> TargetDesc {
        TargetDesc {
            name: "x86-64-avx512".into(),
            kind: TargetKind::Cpu(CpuDesc {
                vector_bits: 512,
                vector_registers: 32,
                fma: true,
                avx512_bf16: false,
                cores,
                l1_bytes: 48 << 10,
                l1_sets: 64,
                l2_bytes: 2 << 20,
                // Intel's server cores (Skylake-SP to Emerald Rapids): 1.4
                // to 5 MB of L3 a core, two 512-bit FMA units; Zen 4 and 5
                // are told apart when they are the host (`detect_host`) or
                // named (`znver4`).
                l3_bytes: 2 << 20,
                fma_units: 2,
                l3_bytes_per_cycle: 8,
                memory_bytes_per_cycle: 4,
                llvm_cpu: Some("x86-64-v4".into()),
                triple: None,
            }),
        }
    }

    /// An x86-64 CPU with AVX2 and FMA: 16 registers of 256 bits.
    pub fn x86_64_avx2(cores: usize) -> TargetDesc {
        TargetDesc {
            name: "x86-64-avx2".into(),
            kind: TargetKind::Cpu(CpuDesc {
                vector_bits: 256,
                vector_registers: 16,
                fma: true,
                avx512_bf16: false,
                cores,
                l1_bytes: 32 << 10,
                l1_sets: 64,
                // Zen 2 and 3's (Intel's AVX2 cores have 256 KB to 1.25 MB).
                // At 1 MB, ResNet-50's Winograd products took chunks twice
                // Zen 3's L2: 46.3 -> 45.0 ms at two threads, 0.8% at one.
                l2_bytes: 512 << 10,
                llvm_cpu: Some("x86-64-v3".into()),
                triple: None,
                // Zen 2 and 3's: 16 or 32 MB of L3 per complex of 4 or 8
                // cores, two 256-bit FMA units.
                l3_bytes: 32 << 20,
                fma_units: 2,
                l3_bytes_per_cycle: 16,
                memory_bytes_per_cycle: 5,
            }),
        }
    }

    /// An x86-64 CPU with SSE vectors and no AVX (the `x86-64-v2` level,
    /// SSE4.2; [`TargetDesc::for_cpu`] also makes the `x86-64` level, SSE2): 16
    /// registers of 128 bits, no fused multiply-add.
    pub fn x86_64_sse(cores: usize) -> TargetDesc {
        TargetDesc {
            name: "x86-64-sse".into(),
            kind: TargetKind::Cpu(CpuDesc {
                vector_bits: 128,
                vector_registers: 16,
                fma: false,
                avx512_bf16: false,
                cores,
                l1_bytes: 32 << 10,
                l1_sets: 64,
                l2_bytes: 256 << 10,
                llvm_cpu: Some("x86-64-v2".into()),
                triple: None,
                // Not measured.
                l3_bytes: 2 << 20,
                fma_units: 2,
                l3_bytes_per_cycle: 16,
                memory_bytes_per_cycle: 4,
            }),
        }
    }

    /// A 64-bit Arm CPU running Linux (`aarch64-linux-gnu`) with Advanced
    /// SIMD: 32 registers of 128 bits, fused multiply-add (the `generic`
    /// CPU, which every Armv8-A core runs).
    pub fn aarch64_linux(cores: usize) -> TargetDesc {
        TargetDesc {
            name: "aarch64-linux-gnu".into(),
            kind: TargetKind::Cpu(CpuDesc {
                vector_bits: 128,
                vector_registers: 32,
                fma: true,
                avx512_bf16: false,
                cores,
                l1_bytes: 64 << 10,
                l1_sets: 256,
                l2_bytes: 1 << 20,
                llvm_cpu: Some("generic".into()),
                triple: Some("aarch64-unknown-linux-gnu".into()),
                // Not measured (Neoverse N1: two 128-bit FMA units).
                l3_bytes: 1 << 20,
                fma_units: 2,
                l3_bytes_per_cycle: 16,
                memory_bytes_per_cycle: 4,
            }),
        }
    }

    /// The CPU `--cpu CPU` means: `native` (this machine: its CPU and
    /// every feature it has, or the CPU [`CPU_ENV`] names), an x86-64
    /// microarchitecture level, whose code runs on any CPU of that level
    /// (`x86-64`: SSE2, every x86-64 CPU; `x86-64-v2`: SSE4.2; `x86-64-v3`:
    /// AVX2, FMA; `x86-64-v4`: AVX-512), or one of the LLVM CPU names of
    /// [`LLVM_CPUS`] (code tuned for that CPU, needing its instructions).
    pub fn for_cpu(cpu: &str) -> Result<TargetDesc, String> {
        if cpu == "native" {
            TargetDesc::check_cpu_env()?;
            return Ok(TargetDesc::host().clone());
        }
        TargetDesc::named_cpu(cpu).map(|(t, ..)| t)
    }

    /// The description of a CPU other than `native`, with the level whose
    /// vector code it gets.
    fn named_cpu(cpu: &str) -> Result<(TargetDesc, &'static str), String> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (level, bf16) = match CPU_LEVELS[1..].iter().find(|&&level| level == cpu) {
            Some(&level) => (level, false),
            None => match LLVM_CPUS.iter().find(|(name, ..)| *name == cpu) {
                Some(&(_, level, bf16)) => (level, bf16),
                None => {
                    return Err(format!(
                        "unknown CPU `{cpu}` (known: {}, or an LLVM CPU name: {})",
                        CPU_LEVELS.join(", "),
                        LLVM_CPUS.map(|(name, ..)| name).join(", ")
                    ));
                }
            },
        };
        let mut t = match level {
            "x86-64-v4" => TargetDesc::x86_64_avx512(cores),
            "x86-64-v3" => TargetDesc::x86_64_avx2(cores),
            _ => TargetDesc::x86_64_sse(cores),
        };
        if let TargetKind::Cpu(c) = &mut t.kind {
            c.llvm_cpu = Some(cpu.into());
            c.avx512_bf16 = bf16;
            match cpu {
                "znver4" => *c = c.clone().zen(4),
                "znver5" => *c = c.clone().zen(5),
                _ => {}
            }
        }
        Ok((t, level))
    }

    /// The CPU [`CPU_ENV`] names in place of this machine's, when it is set
    /// (and is not `native`), or why it cannot stand for this machine: a
    /// name `--cpu` does not take, or a CPU whose instructions (those of its
    /// x86-64 level, and AVX-512 BF16 where it has them) this machine lacks,
    /// so that code compiled for it would not run here. Read once, by
    /// [`TargetDesc::host`].
    fn cpu_from_env() -> Result<Option<TargetDesc>, String> {
        let Some(value) = std::env::var_os(CPU_ENV) else {
            return Ok(None);
        };
        let Some(cpu) = value.to_str().map(str::trim) else {
            return Err(format!("{CPU_ENV} is not UTF-8: {value:?}"));
        };
        if cpu.is_empty() || cpu == "native" {
            return Ok(None);
        }
        let (t, level) = TargetDesc::named_cpu(cpu).map_err(|e| format!("{CPU_ENV}={cpu}: {e}"))?;
        let lacking = host_lacks(level, t.cpu().is_some_and(|c| c.avx512_bf16));
        if !lacking.is_empty() {
            return Err(format!(
                "{CPU_ENV}={cpu}: this machine's CPU lacks {}, which code for `{cpu}` uses",
                lacking.join(", ")
            ));
        }
        Ok(Some(t))
    }

    /// What `native` means for this process, decided once: the CPU
    /// [`CPU_ENV`] names, or else this machine's (AVX-512 when it has
    /// AVX512F, else AVX2), with its core count. A [`CPU_ENV`] that cannot
    /// stand for this machine is not used here:
    /// [`TargetDesc::check_cpu_env`] says why ([`TargetDesc::for_cpu`] and
    /// [`TargetDesc::named`] return it, and the tools report it before
    /// anything else).
    pub fn host() -> &'static TargetDesc {
        &TargetDesc::host_and_env_error().0
    }

    /// Why [`CPU_ENV`] cannot stand for this machine, if it cannot (its
    /// value as read when [`TargetDesc::host`] was decided).
    pub fn check_cpu_env() -> Result<(), String> {
        match &TargetDesc::host_and_env_error().1 {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// `native`'s description and the error [`CPU_ENV`] gave, from one
    /// reading of it.
    fn host_and_env_error() -> &'static (TargetDesc, Option<String>) {
        static HOST: std::sync::OnceLock<(TargetDesc, Option<String>)> = std::sync::OnceLock::new();
        HOST.get_or_init(|| {
            let (named, error) = match TargetDesc::cpu_from_env() {
                Ok(named) => (named, None),
                Err(e) => (None, Some(e)),
            };
            let host = named.unwrap_or_else(|| {
                let mut t = TargetDesc::detect_host();
                if let TargetKind::Cpu(c) = &mut t.kind {
                    c.llvm_cpu = None;
                }
                t
            });
            (host, error)
        })
    }

    fn detect_host() -> TargetDesc {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                let mut t = TargetDesc::x86_64_avx512(cores);
                if let TargetKind::Cpu(c) = &mut t.kind {
                    c.avx512_bf16 = std::arch::is_x86_feature_detected!("avx512bf16");
                    // AMD's family 0x19 with AVX-512 is Zen 4, 0x1a Zen 5.
                    match amd_family() {
                        Some(0x19) => *c = c.clone().zen(4),
                        Some(f) if f >= 0x1a => *c = c.clone().zen(5),
                        _ => {}
                    }
                }
                return t;
            }
        }
        TargetDesc::x86_64_avx2(cores)
    }

    /// An NVIDIA GPU of compute capability 8.0 (A100).
    pub fn sm_80() -> TargetDesc {
        TargetDesc::nvidia((8, 0), 163 << 10, 108)
    }

    /// An NVIDIA GPU of compute capability 9.0 (H100).
    pub fn sm_90() -> TargetDesc {
        TargetDesc::nvidia((9, 0), 227 << 10, 132)
    }

    /// An NVIDIA GPU of compute capability `(major, minor)` with `shared`
    /// bytes of shared memory per block and `multiprocessors` SMs; warps of
    /// 32, blocks of up to 1024 threads, 32 banks of 4 bytes of shared
    /// memory, `mma.sync` m16n8k16 for f16/bf16.
    fn nvidia(compute_capability: (u32, u32), shared: usize, multiprocessors: usize) -> TargetDesc {
        TargetDesc {
            name: format!("sm_{}{}", compute_capability.0, compute_capability.1),
            kind: TargetKind::Gpu(GpuDesc {
                compute_capability,
                warp_size: 32,
                max_threads_per_block: 1024,
                shared_memory_per_block: shared,
                multiprocessors,
                shared_banks: (32, 4),
                async_copy_bytes: 16,
                mma: vec![(DType::F16, [16, 8, 16]), (DType::BF16, [16, 8, 16])],
            }),
        }
    }

    /// This GPU target with f32 products on tensor cores as TF32 (f32
    /// operands rounded to 10 mantissa bits, products accumulated in f32):
    /// faster, and less exact, so only when asked for (`--tf32`). A CPU
    /// target is returned unchanged.
    pub fn with_tf32(mut self) -> TargetDesc {
        if !self.tf32()
            && let TargetKind::Gpu(g) = &mut self.kind
        {
            g.mma.push((DType::F32, [16, 8, 8]));
        }
        self
    }

    /// Whether f32 products run on tensor cores as TF32
    /// ([`TargetDesc::with_tf32`]).
    pub fn tf32(&self) -> bool {
        self.gpu()
            .is_some_and(|g| g.mma.iter().any(|(d, _)| *d == DType::F32))
    }

    /// The description `--target NAME` means; `host` is this machine.
    pub fn named(name: &str) -> Result<TargetDesc, String> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        match name {
            "host" => TargetDesc::for_cpu("native"),
            "x86-64-avx512" => Ok(TargetDesc::x86_64_avx512(cores)),
            "x86-64-avx2" => Ok(TargetDesc::x86_64_avx2(cores)),
            "aarch64-linux-gnu" | "aarch64-unknown-linux-gnu" => {
                Ok(TargetDesc::aarch64_linux(cores))
            }
            "sm_80" | "cuda:sm_80" => Ok(TargetDesc::sm_80()),
            "sm_90" | "cuda:sm_90" => Ok(TargetDesc::sm_90()),
            other => Err(format!(
                "unknown target `{other}` (known: {})",
                TARGET_NAMES.join(", ")
            )),
        }
    }

    /// The CPU part, if this is a CPU.
    pub fn cpu(&self) -> Option<&CpuDesc> {
        match &self.kind {
            TargetKind::Cpu(c) => Some(c),
            TargetKind::Gpu(_) => None,
        }
    }

    /// The GPU part, if this is a GPU.
    pub fn gpu(&self) -> Option<&GpuDesc> {
        match &self.kind {
            TargetKind::Gpu(g) => Some(g),
            TargetKind::Cpu(_) => None,
        }
    }

    /// Elements of `d` one vector register holds (one per thread on a
    /// GPU, whose vectors are warps: see [`GpuDesc::warp_size`]).
    pub fn lanes(&self, d: DType) -> usize {
        match &self.kind {
            TargetKind::Cpu(c) => (c.vector_bits / 8 / d.size_bytes()).max(1),
            TargetKind::Gpu(_) => 1,
        }
    }

    /// Multiply-adds below which a contraction is not worth packing.
    pub fn min_packed_macs(&self) -> usize {
        MIN_PACKED_MACS
    }

    /// The fewest multiply-adds of one program of a product split along
    /// its depth.
    pub fn min_split_macs(&self) -> usize {
        MIN_SPLIT_MACS
    }

    /// Threads that run one program of a kernel: on a GPU a thread block
    /// of eight warps (within the block limit), on a CPU one.
    pub fn program_threads(&self) -> usize {
        match self.gpu() {
            Some(g) => (8 * g.warp_size).min(g.max_threads_per_block).max(1),
            None => 1,
        }
    }

    /// Iterations below which a parallel loop is looked through for a
    /// wider one before being spread over threads.
    pub fn min_thread_iterations(&self) -> usize {
        MIN_THREAD_ITERATIONS
    }

    /// Element operations from which a kernel of fewer programs than
    /// [`Self::min_thread_iterations`] runs on threads.
    pub fn min_thread_work(&self) -> f64 {
        MIN_THREAD_WORK
    }

    /// Element operations from which a kernel on threads hands out its
    /// programs to them as they come free rather than in fixed shares.
    pub fn min_claim_work(&self) -> f64 {
        MIN_CLAIM_WORK
    }

    /// The packed product kernel's blocking for `d` on a CPU: a register
    /// tile of `mr` rows by two vectors, `mc` rows (144, or 168 for the
    /// 14-row tile below) and `kc = 256` deep packed blocks, so a packed
    /// block of the left operand (144-168 KB) stays in L2 and a panel of
    /// the right one in L1, each panel fetched from further out serving 24
    /// strips of 6 or 36 of 4 (12 of 6 gave W2 and W6 15-20% more time on
    /// two threads, W1 4% on one). `mr` is 6 with AVX-512 on a
    /// core of one FMA unit (Zen 4: 12 of 32 registers accumulate) and 4 with AVX2 (8 of 16: the 6-row
    /// tile's 12 accumulators, two operand vectors and a broadcast took 15,
    /// and padded 16-, 32- and 64-row products to 18, 36 and 66), which
    /// takes 6 rows (`tall_mr`) only in products at least a slice deep whose
    /// rows they pad about as little ([`takes_taller_tile`]). Zen 3,
    /// one thread, 6 -> 4 rows: a 3 x 3 stride-2 stem convolution into 32
    /// channels 0.426 -> 0.302 ms, 1 x 1 192 -> 32 over 28 x 28 0.134 ->
    /// 0.106, 384 -> 64 over 14 x 14 0.120 -> 0.111, 256 x 512 x 512
    /// 1.48 -> 1.42; whole models 2-5% (docs/performance.md); 3 and 5
    /// rows were slower than both, 8 (16 accumulators) twice as slow. With
    /// AVX-512 and two FMA units a core does two FMAs a cycle against two
    /// 512-bit loads, and a 6-row tile's step is 12 FMAs for 8 loads (two
    /// vectors and six broadcasts), so the tile is 14 rows (28 of the 32
    /// registers accumulate: 28 FMAs for 16 loads) in blocks of 168 rows
    /// (12 strips; 144 cut 144-row products into two blocks of 84, each
    /// packing every panel). On an Intel Xeon with AMX (two 512-bit FMA
    /// units, 2 MB of L2), one thread, alone (`dlc bench`, ms): ResNet-50's
    /// 3 x 3 512 -> 512 over 7 x 7 1.81 -> 1.52, 256 -> 256 at stride 2
    /// into 14 x 14 1.84 -> 1.55, 512 -> 2048 over 7 x 7 with a residual
    /// 0.86 -> 0.76, 256 -> 64 over 56 x 56 0.78 -> 0.74; whole models 1t
    /// and 2t ResNet-50 -4.6% and -4.2%, GPT-2's block -7.7% and -6%,
    /// BERT -5% (1t), MobileNetV2 about even (its 16- and 24-deep
    /// expansions a tenth slower, its deep products faster); 8 x 48 and 6
    /// x 64 tiles (24 accumulators) were between the two. Zen 5's two FMA
    /// units take the same tile, not measured there. bf16 on a
    /// CPU that multiplies bf16 pairs (`CpuDesc::avx512_bf16`): an 8-row
    /// tile (16 of the 32 registers accumulate; 512^3 at one thread on Zen
    /// 4, 1.45 -> 1.27 ms) and `kc = 512`, the same bytes as f32's 256
    /// (1.27 -> 1.22 ms). On a GPU, the same numbers for one thread block's
    /// tile.
    pub fn gemm_blocking(&self, d: DType) -> GemmBlocking {
        let lanes = self.lanes(d.accumulator());
        match &self.kind {
            TargetKind::Cpu(c) => {
                let pairs = d == DType::BF16 && c.avx512_bf16;
                let (mr, mc, kc) = if pairs {
                    (8, 192, 512)
                } else if c.vector_bits == 256 {
                    (4, 144, 256)
                } else if c.fma_units >= 2 {
                    (14, 168, 256)
                } else {
                    (6, 144, 256)
                };
                let regs = c.vector_registers;
                let narrow_n = if regs <= 16 { 2 * lanes } else { lanes };
                let vectors = narrow_n / lanes;
                let half_panel = c.vector_bits == 512 && c.fma_units < 2 && !pairs;
                GemmBlocking {
                    mr,
                    tall_mr: if c.vector_bits == 256 && !pairs {
                        6
                    } else {
                        mr
                    },
                    nr: 2 * lanes,
                    mc,
                    kc,
                    lanes,
                    min_units: 8,
                    narrow_n,
                    narrow_mr: (regs / 2)
                        .min(regs.saturating_sub(vectors + 1) / vectors)
                        .max(1),
                    pairs,
                    pixel_rows_min: if c.vector_bits == 256 {
                        [(48, 32); 2]
                    } else if c.fma_units >= 2 {
                        [(128, 512), (512, 256)]
                    } else {
                        [(128, 512), (512, 160)]
                    },
                    few_pixel_rows_min: if half_panel {
                        (96, 96)
                    } else {
                        (usize::MAX, usize::MAX)
                    },
                    half_panel_tile: half_panel.then_some([2 * mr, lanes]),
                }
            }
            TargetKind::Gpu(_) => GemmBlocking {
                mr: 64,
                tall_mr: 64,
                nr: 64,
                mc: 64,
                kc: 32,
                lanes,
                min_units: 1,
                narrow_n: lanes,
                narrow_mr: 64,
                pairs: false,
                pixel_rows_min: [(usize::MAX, usize::MAX); 2],
                few_pixel_rows_min: (usize::MAX, usize::MAX),
                half_panel_tile: None,
            },
        }
    }

    /// Whether a product of `macs` multiply-adds over `d` runs on the
    /// packed register-tiled kernel (and pays for its columns rounded up to
    /// whole register tiles).
    pub fn packs_product(&self, d: DType, macs: usize) -> bool {
        d == DType::F32 && macs >= self.min_packed_macs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_state_their_machines() {
        let avx512 = TargetDesc::x86_64_avx512(2);
        assert_eq!(avx512.lanes(DType::F32), 16);
        assert_eq!(avx512.lanes(DType::F16), 32);
        let g = avx512.gemm_blocking(DType::F32);
        assert_eq!((g.mr, g.nr, g.mc, g.kc), (14, 32, 168, 256));
        // A core of one 512-bit FMA unit (Zen 4) keeps the 6-row tile.
        let zen4 = TargetDesc::for_cpu("znver4").expect("a known CPU");
        let z = zen4.gemm_blocking(DType::F32);
        assert_eq!((z.mr, z.nr, z.mc, z.kc), (6, 32, 144, 256));
        // Narrow products (at most one vector of columns) take a tile of one
        // vector by half the registers' rows.
        assert_eq!(g.register_tile(16), (16, 16));
        assert_eq!(g.register_tile(7), (16, 16));
        assert_eq!(g.register_tile(17), (14, 32));
        let avx2 = TargetDesc::x86_64_avx2(2);
        // AVX2's packed tile is 4 rows by two vectors (measured on Zen 3),
        // its packed blocks as many rows as AVX-512's.
        let g2 = avx2.gemm_blocking(DType::F32);
        assert_eq!((g2.mr, g2.nr, g2.mc, g2.kc), (4, 16, 144, 256));
        // Its products at least a slice deep take 6 rows where those pad
        // at most a thirty-second more rows: GPT-2's 128 tokens (132),
        // 64 channels (66), 48 and 96 (no padding), not 16 or 32 channels
        // (18, 36), 8 a group, 40 (42), nor a product 255 deep.
        assert_eq!(g2.tall_mr, 6);
        let tall =
            |rows: usize, depth: usize| takes_taller_tile(rows, depth, [g2.mr, g2.tall_mr, g2.kc]);
        for rows in [128, 64, 48, 96, 440, 3136] {
            assert!(tall(rows, 256) && tall(rows, 3072), "{rows} rows");
        }
        for rows in [16, 32, 8, 40, 4] {
            assert!(!tall(rows, 768), "{rows} rows");
        }
        assert!(!tall(128, 255));
        // Elsewhere the tile has no taller choice.
        assert_eq!((g.tall_mr, z.tall_mr), (g.mr, z.mr));
        assert!(!takes_taller_tile(128, 1024, [g.mr, g.tall_mr, g.kc]));
        // AVX2's narrow products are up to one register tile wide, 6 rows
        // (12 accumulators, two operand vectors, a broadcast: 15 of 16).
        assert_eq!((g2.narrow_mr, g2.narrow_n), (6, 16));
        assert_eq!(g2.register_tile(8), (6, 8));
        assert_eq!(g2.register_tile(16), (6, 8));
        assert_eq!(g2.register_tile(17), (4, 16));
        assert_eq!((g.narrow_mr, g.narrow_n), (16, 16));
        // Few pixels are a product's rows from shallower and narrower
        // products on AVX2 (measured on Zen 3) than on AVX-512 (Zen 4),
        // and from deep ones into fewer channels where a core runs two
        // 512-bit FMAs a cycle (Zen 5).
        let (zen4, _) = TargetDesc::named_cpu("znver4").expect("known");
        assert_eq!(
            (
                g.pixel_rows_min,
                zen4.gemm_blocking(DType::F32).pixel_rows_min,
                g2.pixel_rows_min
            ),
            (
                [(128, 512), (512, 256)],
                [(128, 512), (512, 160)],
                [(48, 32); 2]
            )
        );
        // Where the pixels pad more than a fifth of the columns, from 96
        // deep into 96 channels on Zen 4, whose half-panel tile splits the
        // channel panels evenly; nowhere else. The columns a product runs
        // count that tile where it pads a twentieth fewer (784: 800).
        let none = (usize::MAX, usize::MAX);
        assert_eq!(
            (
                g.few_pixel_rows_min,
                zen4.gemm_blocking(DType::F32).few_pixel_rows_min,
                g2.few_pixel_rows_min
            ),
            (none, (96, 96), none)
        );
        let z = zen4.gemm_blocking(DType::F32);
        assert_eq!(
            [49, 196, 100, 784].map(|n| z.padded_columns(n)),
            [64, 208, 112, 800]
        );
        assert_eq!(g.padded_columns(196), 224);
        // f16 products accumulate in f32, so their tile is f32's; so are
        // bf16 ones where bf16 is widened, not multiplied in pairs.
        assert_eq!(avx512.gemm_blocking(DType::F16).nr, 32);
        assert_eq!(avx512.gemm_blocking(DType::BF16), g);
        let (zen4, _) = TargetDesc::named_cpu("znver4").expect("known");
        let pairs = zen4.gemm_blocking(DType::BF16);
        assert!(pairs.pairs && !zen4.gemm_blocking(DType::F32).pairs);
        assert_eq!((pairs.mr, pairs.nr, pairs.mc, pairs.kc), (8, 32, 192, 512));
        // A half-empty last panel takes 12 x 16 tiles on Zen 4 only.
        assert_eq!(
            [zen4.gemm_blocking(DType::F32), g, g2, pairs].map(|b| b.half_panel_tile),
            [Some([12, 16]), None, None, None]
        );
        // The memory systems: Intel's server cores for AVX-512, Zen's for
        // AVX2 and for Zen 4 and 5 named.
        let memory = |t: &TargetDesc| {
            t.cpu().map(|c| {
                (
                    c.macs_per_cycle(),
                    c.l1_bytes >> 10,
                    c.l2_bytes >> 10,
                    c.l3_bytes >> 20,
                    c.l3_bytes_per_cycle,
                    c.memory_bytes_per_cycle,
                )
            })
        };
        assert_eq!(memory(&avx512), Some((32, 48, 2048, 2, 8, 4)));
        assert_eq!(memory(&avx2), Some((16, 32, 512, 32, 16, 5)));
        assert_eq!(memory(&zen4), Some((16, 32, 1024, 32, 16, 5)));
        let (zen5, _) = TargetDesc::named_cpu("znver5").expect("known");
        assert_eq!(memory(&zen5), Some((32, 48, 1024, 32, 16, 5)));
        let avx512_cpu = avx512.cpu().expect("a CPU");
        assert_eq!(avx512_cpu.reread_bytes_per_cycle(2 << 20), 8);
        assert_eq!(avx512_cpu.reread_bytes_per_cycle((2 << 20) + 1), 4);
        let sm90 = TargetDesc::named("sm_90").expect("known");
        assert_eq!(sm90.gpu().map(|g| g.compute_capability), Some((9, 0)));
        assert!(TargetDesc::named("sm_75").is_err());
        assert!(TargetDesc::host().cpu().is_some());
    }

    #[test]
    fn cpus_are_named_with_their_level_and_what_this_machine_lacks() {
        let (t, level) = TargetDesc::named_cpu("znver4").expect("known");
        assert_eq!(level, "x86-64-v4");
        assert!(t.cpu().is_some_and(|c| c.avx512_bf16));
        assert_eq!(t.cpu().and_then(|c| c.llvm_cpu.as_deref()), Some("znver4"));
        assert_eq!(t.lanes(DType::F32), 16);
        let (t, level) = TargetDesc::named_cpu("x86-64-v3").expect("known");
        assert_eq!((level, t.lanes(DType::F32)), ("x86-64-v3", 8));
        let unknown = TargetDesc::named_cpu("pentium9").map(|_| ());
        assert!(unknown.is_err_and(|e| e.starts_with("unknown CPU `pentium9`")));
        // `native` is not a name of a CPU but this machine.
        assert!(TargetDesc::named_cpu("native").is_err());
        #[cfg(target_arch = "x86_64")]
        {
            assert!(host_lacks("x86-64", false).is_empty());
            let avx512 = std::arch::is_x86_feature_detected!("avx512f");
            assert_eq!(host_lacks("x86-64-v4", false).contains(&"avx512f"), !avx512);
            // The levels below need none of AVX-512.
            assert!(!host_lacks("x86-64-v3", false).contains(&"avx512f"));
            let bf16 = std::arch::is_x86_feature_detected!("avx512bf16");
            assert_eq!(
                host_lacks("x86-64", true),
                if bf16 { vec![] } else { vec!["avx512_bf16"] }
            );
        }
    }
}
