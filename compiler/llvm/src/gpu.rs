//! NVIDIA GPUs: tile IR scheduled for a GPU target (`sm_80`, `sm_90`)
//! compiled to PTX ([`compile_gpu`]), with the plan the runtime follows to
//! run each entry point (`dlc_runtime::gpu`); and an emulator
//! ([`emulate`]) that compiles the very same kernels for this CPU, with
//! thread indices, barriers and shared memory provided by CPU threads, so
//! that the GPU code generator is checked against the reference
//! interpreter on machines without a GPU.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Barrier;

use crate::codegen::gpu::{EMULATOR_HOOKS, Flavor, emit_function, undefined_calls};
use crate::{CodegenError, R};
use dlc_core::TargetDesc;
use dlc_runtime::abi::Symbols;
use dlc_runtime::gpu::{Device, GpuFunction, GpuProgram, Launch, Prepared};
use dlc_runtime::{AlignedBuffer, HostTensor, RuntimeError};
use dlc_tile::Module as TModule;
use inkwell::OptimizationLevel;
use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::FileType;

/// Emits every function of `m` as kernels of one LLVM module.
fn kernels<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    m: &TModule,
    symbols: &Symbols,
    target: &TargetDesc,
    flavor: Flavor,
) -> R<Vec<GpuFunction>> {
    let mut functions = Vec::with_capacity(m.functions.len());
    for f in &m.functions {
        let symbol = symbols.symbol(&f.name).map_err(CodegenError::Symbol)?;
        functions.push(emit_function(ctx, module, f, &symbol, target, flavor)?);
    }
    let missing = undefined_calls(module);
    if !missing.is_empty() {
        return Err(CodegenError::Unsupported(format!(
            "the GPU back end does not build {} yet (a GPU has no C library: f64 \
             transcendental functions and erf are computed by it on a CPU)",
            missing.join(", ")
        )));
    }
    module
        .verify()
        .map_err(|e| CodegenError::Llvm(format!("generated IR is invalid: {e}")))?;
    Ok(functions)
}

/// What each entry point launches, as PTX comments (`dlc compile --emit
/// ptx` prints them above the kernels).
fn describe(functions: &[GpuFunction]) -> String {
    let mut out = String::from(
        "// dlc: kernels of each entry point, launched in order (one-dimensional grids; the\n// last argument of every kernel is the address of a zeroed int32 status word)\n",
    );
    for f in functions {
        out.push_str(&format!(
            "// entry {} ({}), workspace {} bytes:\n",
            f.signature.name,
            f.signature.encode(),
            f.workspace
        ));
        for l in &f.launches {
            let args: Vec<String> = l
                .args
                .iter()
                .map(|&i| match &f.buffers[i] {
                    dlc_runtime::gpu::DeviceBuffer::Param(p) => f.signature.params[*p].name.clone(),
                    dlc_runtime::gpu::DeviceBuffer::Workspace(o) => format!("workspace+{o}"),
                    dlc_runtime::gpu::DeviceBuffer::Constant(b) => {
                        format!("constant({} bytes)", b.len())
                    }
                })
                .collect();
            out.push_str(&format!(
                "//   {}<<<{}, {}, {}>>>({}, status)\n",
                l.kernel,
                l.blocks,
                l.threads,
                l.shared_bytes,
                args.join(", ")
            ));
        }
    }
    out
}

/// Compiles `m` (tile IR scheduled for GPU `target`) to PTX for it, entry
/// point `f`'s kernels named after `symbols.symbol(f)`.
pub fn compile_gpu(m: &TModule, symbols: &Symbols, target: &TargetDesc) -> R<GpuProgram> {
    let machine = crate::target::nvptx::machine(target)?;
    let ctx = Context::create();
    let module = ctx.create_module("dlc");
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    let functions = kernels(&ctx, &module, m, symbols, target, Flavor::Nvptx)?;
    module
        .run_passes("default<O3>", &machine, PassBuilderOptions::create())
        .map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let ptx = machine
        .write_to_memory_buffer(&module, FileType::Assembly)
        .map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let ptx = String::from_utf8_lossy(ptx.as_slice())
        .trim_end_matches('\0')
        .to_string();
    Ok(GpuProgram {
        ptx: format!("{}{ptx}", describe(&functions)),
        functions,
    })
}

/// The kernels of a module compiled for a GPU target, run on this CPU:
/// every block's threads are CPU threads (one per GPU thread), barriers
/// are a `std::sync::Barrier`, shared memory a buffer per launch filled
/// with NaN bytes (so a read of what was never written shows). Blocks run
/// one after another. Slow, and meant for small programs: it checks the
/// code generator's mapping (layouts, masks, staging, barriers), not
/// speed.
pub struct Emulator<'m> {
    /// Owns the compiled kernels the entries point into.
    _engine: ExecutionEngine<'m>,
    program: GpuProgram,
    /// Each kernel's entry wrapper (`void name.entry(void **args)`).
    entries: HashMap<String, usize>,
}

/// Compiles `m` (tile IR scheduled for GPU `target`) for the emulator and
/// hands it to `use_it`.
pub fn emulate<T>(
    m: &TModule,
    target: &TargetDesc,
    use_it: impl FnOnce(&Emulator<'_>) -> R<T>,
) -> R<T> {
    let ctx = Context::create();
    let module = ctx.create_module("dlc_emulated");
    let host = crate::target::x86_64::machine(TargetDesc::host(), OptimizationLevel::Aggressive)?;
    module.set_triple(&host.get_triple());
    module.set_data_layout(&host.get_target_data().get_data_layout());
    let symbols = Symbols::with_prefix("dlc_emu_").map_err(CodegenError::Symbol)?;
    let functions = kernels(&ctx, &module, m, &symbols, target, Flavor::Emulated)?;
    let mut names: Vec<(String, usize)> = Vec::new();
    for f in &functions {
        for l in &f.launches {
            if !names.iter().any(|n| n.0 == l.kernel) {
                names.push((l.kernel.clone(), l.args.len() + 1));
            }
        }
    }
    for (name, arity) in &names {
        let kernel = module
            .get_function(name)
            .ok_or_else(|| CodegenError::Invalid(format!("no kernel {name}")))?;
        crate::abi::entry_wrapper(&ctx, &module, *arity, kernel, name)?;
    }
    // This CPU rounds to bf16 with a function the C library may lack.
    crate::emit::define_bf16_truncation(&ctx, &module)?;
    module
        .run_passes("default<O2>", &host, PassBuilderOptions::create())
        .map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let engine = module
        .create_jit_execution_engine(OptimizationLevel::Default)
        .map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let hooks: [usize; 12] = [
        hooks::thread as *const () as usize,
        hooks::block as *const () as usize,
        hooks::barrier as *const () as usize,
        hooks::shared as *const () as usize,
        hooks::lg2 as *const () as usize,
        hooks::ex2 as *const () as usize,
        hooks::sin as *const () as usize,
        hooks::cos as *const () as usize,
        hooks::shfl_bfly as *const () as usize,
        hooks::mma as *const () as usize,
        hooks::cp_async as *const () as usize,
        hooks::ldmatrix as *const () as usize,
    ];
    for (name, address) in EMULATOR_HOOKS.iter().zip(hooks) {
        if let Some(f) = module.get_function(name) {
            engine.add_global_mapping(&f, address);
        }
    }
    let mut entries = HashMap::new();
    for (name, _) in &names {
        let address = engine
            .get_function_address(&format!("{name}.entry"))
            .map_err(|e| CodegenError::Llvm(e.to_string()))?;
        entries.insert(name.clone(), address);
    }
    let emulator = Emulator {
        _engine: engine,
        program: GpuProgram {
            ptx: String::new(),
            functions,
        },
        entries,
    };
    use_it(&emulator)
}

impl Emulator<'_> {
    /// How each entry point runs.
    pub fn program(&self) -> &GpuProgram {
        &self.program
    }

    /// Runs entry point `name` on `inputs`; returns its results.
    pub fn call(&self, name: &str, inputs: &[HostTensor]) -> Result<Vec<HostTensor>, RuntimeError> {
        let function = self.program.function(name)?;
        let mut device = self.device();
        let mut prepared = Prepared::new(&mut device, function)?;
        prepared.call(&mut device, inputs)
    }

    /// A device running this program's kernels, for callers that drive
    /// [`Prepared`] calls themselves (`dlc train --backend gpu-emulator`).
    pub fn device(&self) -> EmulatedDevice<'_> {
        EmulatedDevice {
            entries: &self.entries,
        }
    }
}

/// Host memory standing for device memory; kernels run on CPU threads.
pub struct EmulatedDevice<'e> {
    entries: &'e HashMap<String, usize>,
}

impl Device for EmulatedDevice<'_> {
    type Memory = AlignedBuffer;

    fn alloc(&mut self, bytes: usize) -> Result<AlignedBuffer, RuntimeError> {
        Ok(AlignedBuffer::zeroed(bytes))
    }

    fn upload(&mut self, to: &mut AlignedBuffer, from: &[u8]) -> Result<(), RuntimeError> {
        to.bytes_mut()
            .get_mut(..from.len())
            .ok_or_else(|| RuntimeError::Arguments("an upload past the buffer".into()))?
            .copy_from_slice(from);
        Ok(())
    }

    fn download_from(
        &mut self,
        from: &AlignedBuffer,
        offset: usize,
        to: &mut [u8],
    ) -> Result<(), RuntimeError> {
        let n = to.len();
        to.copy_from_slice(
            from.bytes()
                .get(offset..offset + n)
                .ok_or_else(|| RuntimeError::Arguments("a download past the buffer".into()))?,
        );
        Ok(())
    }

    fn address(&self, m: &AlignedBuffer) -> u64 {
        m.bytes().as_ptr() as u64
    }

    fn launch(&mut self, launch: &Launch, args: &[u64]) -> Result<(), RuntimeError> {
        let entry = *self
            .entries
            .get(&launch.kernel)
            .ok_or_else(|| RuntimeError::Load(format!("no kernel {}", launch.kernel)))?;
        let threads = launch.threads as usize;
        let mut shared = AlignedBuffer::zeroed(launch.shared_bytes as usize);
        shared.bytes_mut().fill(0xff);
        let shared = shared.as_mut_ptr() as usize;
        let barrier = Barrier::new(threads);
        let exchange = hooks::Exchange(
            (0..threads * hooks::SLOTS)
                .map(|_| std::sync::atomic::AtomicU32::new(0))
                .collect(),
        );
        std::thread::scope(|s| {
            for t in 0..threads {
                let (barrier, exchange) = (&barrier, &exchange);
                let args = args.to_vec();
                s.spawn(move || {
                    hooks::enter(t as u32, barrier, shared, exchange);
                    for block in 0..launch.blocks {
                        hooks::BLOCK.with(|b| b.set(block));
                        // SAFETY: `entry` is the `NAME.entry` wrapper the
                        // emulator generated for this kernel, taking
                        // `args.len()` pointers, and the JIT engine that
                        // owns it outlives the launch; every argument is a
                        // live buffer of the size the kernel was planned
                        // with.
                        unsafe {
                            let f = std::mem::transmute::<usize, unsafe extern "C" fn(*const u64)>(
                                entry,
                            );
                            f(args.as_ptr());
                        }
                        // No thread starts the next block (and reuses
                        // shared memory) before every thread ends this one.
                        barrier.wait();
                    }
                    hooks::leave();
                });
            }
        });
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// The functions emulated kernels call, reading the calling CPU thread's
/// part in the launch.
mod hooks {
    use super::*;

    thread_local! {
        static THREAD: Cell<u32> = const { Cell::new(0) };
        pub(super) static BLOCK: Cell<u32> = const { Cell::new(0) };
        static BARRIER: Cell<usize> = const { Cell::new(0) };
        static SHARED: Cell<usize> = const { Cell::new(0) };
        static EXCHANGE: Cell<usize> = const { Cell::new(0) };
    }

    /// Where the threads of a launch exchange registers (shuffles, matrix
    /// fragments): [`SLOTS`] words per thread.
    pub(super) struct Exchange(pub(super) Vec<std::sync::atomic::AtomicU32>);

    /// Words of the exchange per thread.
    pub(super) const SLOTS: usize = 8;

    fn slots() -> Option<&'static [std::sync::atomic::AtomicU32]> {
        let e = EXCHANGE.with(Cell::get);
        // SAFETY: `enter` stored the address of the launch's exchange,
        // which outlives every thread of the launch (scoped threads);
        // `leave` clears it before the thread ends, and the reference is
        // used only while the hook runs.
        (e != 0).then(|| unsafe { &*(e as *const Exchange) }.0.as_slice())
    }

    pub(super) fn enter(thread: u32, barrier: &Barrier, shared: usize, exchange: &Exchange) {
        THREAD.with(|t| t.set(thread));
        BARRIER.with(|b| b.set(barrier as *const Barrier as usize));
        SHARED.with(|s| s.set(shared));
        EXCHANGE.with(|e| e.set(exchange as *const Exchange as usize));
    }

    pub(super) fn leave() {
        BARRIER.with(|b| b.set(0));
        EXCHANGE.with(|e| e.set(0));
    }

    /// `shfl.sync.bfly`: every thread of the block calls it together (the
    /// generated code shuffles only where all do), so a block barrier
    /// stands for the warp's synchronization.
    pub(super) extern "C" fn shfl_bfly(x: u32, mask: u32) -> u32 {
        use std::sync::atomic::Ordering;
        let Some(slots) = slots() else {
            return x;
        };
        let me = thread() as usize;
        slots[me * SLOTS].store(x, Ordering::SeqCst);
        barrier();
        let got = slots[(me ^ mask as usize) * SLOTS].load(Ordering::SeqCst);
        barrier();
        got
    }

    /// `cp.async.ca.shared.global` with a source size: `src_bytes` of the
    /// `bytes` copied from `src`, the rest zeros; here the copy is done
    /// when issued (a wait has nothing to wait for).
    pub(super) extern "C" fn cp_async(dst: *mut u8, src: *const u8, bytes: u32, src_bytes: u32) {
        let (n, from) = (bytes as usize, (src_bytes as usize).min(bytes as usize));
        // Both ends of a copy are aligned to its size on the hardware
        // (which does not define the rest): here a misaligned one is NaN
        // bytes, so a test of it fails.
        let misaligned = !(dst as usize - shared() as usize).is_multiple_of(n)
            || (from > 0 && !(src as usize).is_multiple_of(n));
        if misaligned {
            // SAFETY: the generated code passes `bytes` of the block's
            // shared memory at `dst`.
            unsafe { std::ptr::write_bytes(dst, 0xff, n) };
            return;
        }
        // SAFETY: the generated code passes `bytes` of the block's shared
        // memory at `dst` and, when `src_bytes` is not zero, that many
        // bytes of a live buffer at `src` (an element inside it).
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, from);
            std::ptr::write_bytes(dst.add(from), 0, n - from);
        }
    }

    /// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.f32` (kind 0, 1)
    /// and `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32` (kind 2) for
    /// the calling thread's warp: every lane's fragment registers are
    /// exchanged, and each lane computes its four results from the matrix
    /// elements the PTX ISA's fragment layouts put in them (groupID =
    /// lane / 4, threadID_in_group = lane % 4; A element i of a lane at
    /// row groupID (+8 for i in 2, 3, 6, 7), column 2 threadID_in_group +
    /// i % 2 (+8 for i >= 4); B element i at row 2 threadID_in_group +
    /// i % 2 (+8 for i >= 2), column groupID; C/D element i at row groupID
    /// (+8 for i >= 2), column 2 threadID_in_group + i % 2; two 16-bit
    /// elements per register, the first in the low half). Every thread of
    /// the block calls it together.
    #[allow(clippy::too_many_arguments)]
    pub(super) extern "C" fn mma(
        kind: u32,
        a0: u32,
        a1: u32,
        a2: u32,
        a3: u32,
        b0: u32,
        b1: u32,
        c0: f32,
        c1: f32,
        c2: f32,
        c3: f32,
        out: *mut f32,
    ) {
        use std::sync::atomic::Ordering;
        let Some(slots) = slots() else {
            return;
        };
        let me = thread() as usize;
        for (i, r) in [a0, a1, a2, a3, b0, b1].into_iter().enumerate() {
            slots[me * SLOTS + i].store(r, Ordering::SeqCst);
        }
        barrier();
        let warp = me & !31;
        let word =
            |lane: usize, reg: usize| slots[(warp + lane) * SLOTS + reg].load(Ordering::SeqCst);
        let (group, member) = ((me & 31) / 4, me & 3);
        let mut d = [c0, c1, c2, c3];
        if kind == 2 {
            // m16n8k8 on TF32 (f32 rounded to 10 mantissa bits, ties away):
            // A register r at row groupID (+8 for odd r), column
            // threadID_in_group (+4 for r >= 2); B register r at row
            // threadID_in_group (+4 for r = 1), column groupID.
            let tf32 = |w: u32| {
                let x = f32::from_bits(w);
                if x.is_finite() {
                    f32::from_bits(w.wrapping_add(0x1000) & !0x1fff)
                } else {
                    x
                }
            };
            let a = |row: usize, k: usize| {
                tf32(word(
                    (row % 8) * 4 + k % 4,
                    usize::from(row >= 8) + usize::from(k >= 4) * 2,
                ))
            };
            let b = |k: usize, col: usize| tf32(word(col * 4 + k % 4, 4 + usize::from(k >= 4)));
            for (i, v) in d.iter_mut().enumerate() {
                let (row, col) = (group + usize::from(i >= 2) * 8, member * 2 + (i & 1));
                for k in 0..8 {
                    *v += a(row, k) * b(k, col);
                }
            }
        } else {
            let element = |lane: usize, reg: usize, high: bool| -> f32 {
                let w = word(lane, reg);
                let bits = if high { w >> 16 } else { w & 0xffff } as u16;
                if kind == 1 {
                    half::bf16::from_bits(bits).to_f32()
                } else {
                    half::f16::from_bits(bits).to_f32()
                }
            };
            let a = |row: usize, k: usize| {
                let i = usize::from(k >= 8) * 4 + usize::from(row >= 8) * 2 + (k & 1);
                element((row % 8) * 4 + (k % 8) / 2, i / 2, i % 2 == 1)
            };
            let b = |k: usize, col: usize| {
                let i = usize::from(k >= 8) * 2 + (k & 1);
                element(col * 4 + (k % 8) / 2, 4 + i / 2, i % 2 == 1)
            };
            for (i, v) in d.iter_mut().enumerate() {
                let (row, col) = (group + usize::from(i >= 2) * 8, member * 2 + (i & 1));
                for k in 0..16 {
                    *v += a(row, k) * b(k, col);
                }
            }
        }
        barrier();
        // SAFETY: the generated code passes four floats of its own stack.
        unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), out, 4) };
    }

    /// `ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16` for the
    /// calling thread's warp: lane `8 i + r` gives the address of row `r`
    /// (eight 16-bit elements) of matrix `i`; each lane receives, per
    /// matrix, the word at row lane / 4, elements 2 (lane % 4) and the
    /// next, or with `trans` the elements at rows 2 (lane % 4) and the next
    /// of column lane / 4, low half first. A row not on a 16-byte boundary
    /// of shared memory (which the hardware does not define) reads as
    /// NaNs, so a test of it fails. Every thread of the block calls it
    /// together.
    pub(super) extern "C" fn ldmatrix(row: *const u8, count: u32, trans: u32, out: *mut u32) {
        use std::sync::atomic::Ordering;
        let Some(slots) = slots() else {
            return;
        };
        let me = thread() as usize;
        let address = row as usize as u64;
        slots[me * SLOTS].store(address as u32, Ordering::SeqCst);
        slots[me * SLOTS + 1].store((address >> 32) as u32, Ordering::SeqCst);
        barrier();
        let warp = me & !31;
        let base = shared() as usize;
        let row_of = |matrix: usize, r: usize| -> Option<*const u8> {
            let lane = warp + matrix * 8 + r;
            let lo = slots[lane * SLOTS].load(Ordering::SeqCst) as u64;
            let hi = slots[lane * SLOTS + 1].load(Ordering::SeqCst) as u64;
            let a = (lo | (hi << 32)) as usize;
            (a >= base && (a - base).is_multiple_of(16)).then_some(a as *const u8)
        };
        // SAFETY: each lane's address is a row of 16 bytes of the block's
        // shared memory, which no thread writes between the barriers.
        let half =
            |p: *const u8, i: usize| unsafe { (p.add(2 * i) as *const u16).read_unaligned() };
        let (group, member) = ((me & 31) / 4, me & 3);
        let mut words = [0u32; 4];
        for (matrix, w) in words.iter_mut().enumerate().take(count as usize) {
            let (lo, hi) = if trans != 0 {
                match (row_of(matrix, 2 * member), row_of(matrix, 2 * member + 1)) {
                    (Some(a), Some(b)) => (half(a, group), half(b, group)),
                    _ => (u16::MAX, u16::MAX),
                }
            } else {
                match row_of(matrix, group) {
                    Some(a) => (half(a, 2 * member), half(a, 2 * member + 1)),
                    None => (u16::MAX, u16::MAX),
                }
            };
            *w = u32::from(lo) | (u32::from(hi) << 16);
        }
        barrier();
        // SAFETY: the generated code passes four words of its own stack.
        unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), out, 4) };
    }

    pub(super) extern "C" fn thread() -> u32 {
        THREAD.with(Cell::get)
    }

    pub(super) extern "C" fn block() -> u32 {
        BLOCK.with(Cell::get)
    }

    pub(super) extern "C" fn barrier() {
        let b = BARRIER.with(Cell::get);
        if b != 0 {
            // SAFETY: `enter` stored the address of the launch's barrier,
            // which outlives every thread of the launch (a scoped thread),
            // and `leave` clears it before the thread ends.
            unsafe { &*(b as *const Barrier) }.wait();
        }
    }

    pub(super) extern "C" fn shared() -> *mut u8 {
        SHARED.with(Cell::get) as *mut u8
    }

    // The hardware's approximations, computed exactly here.
    pub(super) extern "C" fn lg2(x: f32) -> f32 {
        x.log2()
    }

    pub(super) extern "C" fn ex2(x: f32) -> f32 {
        x.exp2()
    }

    pub(super) extern "C" fn sin(x: f32) -> f32 {
        x.sin()
    }

    pub(super) extern "C" fn cos(x: f32) -> f32 {
        x.cos()
    }
}
