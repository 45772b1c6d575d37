//! Code generation through LLVM (inkwell), the only crate that links LLVM.
//!
//! [`compile`] turns tile IR scheduled for the host into an LLVM module:
//! each `tile.func` becomes a
//! C-ABI function `int32_t SYM(T0 *b0, T1 *b1, ...)`, where `SYM` is its
//! name with the module's symbol prefix ([`dlc_runtime::abi::Symbols`]), taking one pointer per
//! buffer parameter (contiguous storage of the buffer's element type; `bool`
//! is one byte) and returning 0, or a nonzero status: 1 for an integer
//! division by zero, 2 when an allocation fails. A wrapper
//! `int32_t SYM.entry(void **buffers)` takes the pointers as an array, for
//! callers that do not know the arity statically, and `SYM.signature`
//! describes the parameters (the ABI is `dlc_runtime::abi`'s). Every function
//! carries the host CPU and its features, and the module goes through LLVM's
//! O3 pipeline (see `codegen::tile` for how kernels, tiles and the
//! workspace are lowered). [`jit`] compiles a module in process and hands out its
//! functions as the runtime's checked [`dlc_runtime::Kernel`]s;
//! [`emit_native`] and [`emit_shared_library`] write object files, assembly
//! and shared libraries.
//!
//! Loads without a pad value or mask must be in bounds (the conversion only
//! emits those); padded loads are bounds-checked.
//!
//! Layout, by concern and by target: `target/` (one module per target:
//! `x86_64` builds the host's target machine and the attributes every
//! function carries; NVPTX goes beside it), `emit` (a loop module to an
//! optimized LLVM module, and its artifacts), `abi` (signatures and the
//! `SYM.entry` wrapper), `jit` (in-process kernels, compiled in parts on
//! every core: `split`, and linked by ORC's JIT: `orc`), `codegen` (tile IR to
//! LLVM IR: the generator and counted loops in `mod.rs`, `tile` for
//! kernels, tiles and the workspace, `elementwise` and `math` for the
//! operators on scalars and vectors, `parallel` for outlining onto the
//! OpenMP runtime and shared helpers).
//!
//! # Functions, CPU levels and artifacts
//!
//! Each `tile.func` becomes `int32_t SYM(T0 *b0, T1 *b1, ...)`, where `SYM` is the
//! entry point's name with the module's symbol prefix (`dlc_runtime::abi::Symbols`): one pointer per buffer
//! (contiguous storage; bool is a byte), returning 0 or a status (1: integer division by
//! zero, 2: allocation failure), so nothing the interpreters report as an error is
//! undefined behaviour in compiled code. `SYM.entry(void **buffers)` wraps it for
//! callers that learn the arity at run time (the JIT). `tile.for` loops become counted
//! LLVM loops with phis for carried values; padded loads are bounds-checked; integer `/`
//! floors and wraps `MIN / -1` like the interpreters; float-to-integer casts saturate
//! (`llvm.fptosi.sat`) before wrapping; unsigned types use the unsigned forms
//! (`udiv`, `icmp ult`, `umax`, `zext`, `uitofp`); transcendental functions of f64 call
//! the C library (`llvm.exp`, `llvm.tanh`, `erf` lane by lane); on f16/bf16 they compute
//! in f32 and round back (LLVM lowers many of them on 16-bit floats to library calls that do
//! not exist). f32 `exp` and `tanh` (and so `sigmoid`, `gelu`, softmax) are emitted as
//! straight-line code (Cephes' polynomials, within 4 ulp: tested element by element over
//! their whole range, subnormal and overflowing results of `exp` included, on vectors
//! and on scalars), not calls to libm, so they run on whole vectors. `exp` scales its
//! polynomial by 2^n with AVX-512's `vscalefps` on 16-lane vectors and by two factors
//! built in exponent bits elsewhere (one factor cannot hold 2^128: exp(88.5) came out
//! infinite before); float add,
//! subtract and multiply carry `reassoc` and `contract`, so multiply-adds fuse (results differ from the interpreter's f64 in the last bits, as any
//! summation order does). Every function carries its CPU and the vector width to prefer;
//! the module runs through LLVM's `default<O3>`.
//!
//! **CPU levels.** Code is compiled for a CPU description (`TargetDesc`): by default this
//! machine's (`--cpu native`: LLVM's host CPU name and every feature it detects, or the
//! CPU `DLC_CPU` names; the JIT always uses it), or with `dlc compile --cpu x86-64-v2|x86-64-v3|x86-64-v4` for an
//! x86-64 microarchitecture level, whose code runs on any CPU of that level: v2 (SSE4.2,
//! 128-bit vectors, no FMA), v3 (AVX2 and FMA, 256-bit), v4 (AVX-512, 512-bit). The level
//! sets both LLVM's target CPU and the tile schedule (`TargetDesc::for_cpu`: lanes, the
//! packed product's blocking), and tiles are cut into vectors of that width; the C header
//! says which CPUs an artifact runs on. Tested by disassembly (no `zmm` register in v3
//! code, no `ymm` in v2) and by running every level's code against this machine's.
//! `--target aarch64-linux-gnu` cross-compiles for 64-bit Arm Linux (the `generic`
//! Armv8-A CPU with Advanced SIMD: 128-bit vectors, 32 registers; `target/aarch64.rs`):
//! objects, static libraries, assembly, LLVM IR and headers; `--emit so` is refused (this
//! machine's linker cannot link for it) and nothing runs it here (the test checks the ELF
//! machine and the multiply-adds in the assembly). Other triples and LLVM CPU names are
//! not taken yet.
//!
//! Each module also defines a
//! weak, hidden `__truncsfbf2` (f32 -> bf16, round to nearest even): LLVM calls it on
//! CPUs without AVX512-BF16, and the libgcc of GCC 12 (Debian 12) lacks it.
//!
//! Beside each function the module exports `name.signature`, a constant string
//! describing the parameters (`in x f32 128 784;out out0 f32 128 10`), which the
//! runtime reads to check calls. `emit_native` writes assembly or an object file;
//! `emit_shared_library` links the object with `$CC` (else `cc`) `-shared ... -lm
//! -Wl,--push-state,--no-as-needed -lgomp -Wl,--pop-state`: the library's references to
//! the OpenMP runtime are weak, so a linker that defaults to `--as-needed` (Debian's and
//! Ubuntu's) dropped libgomp, and a process loading the library without an OpenMP
//! runtime of its own (Python's ctypes) ran every kernel on one thread;
//! `emit_static_library` (`--emit lib`) archives it with `$AR` (else binutils' `ar`, `rcsD`:
//! a symbol index, deterministic), and a program linking the archive adds `-lm` and, for
//! kernels on threads, `-lgomp` (without it they run on the calling thread).
//! `jit` compiles in process and hands out the functions as runtime `Kernel`s.
#![deny(missing_docs)]
// The JIT call is an FFI boundary; see `run`.
#![allow(unsafe_code)]

mod abi;
mod cache;
mod codegen;
mod emit;
#[allow(unsafe_code)]
mod gpu;
mod jit;
mod orc;
mod program;
mod split;
mod target;

pub use abi::{exported_signature, signature};
pub use cache::{DEFAULT_MAX_BYTES, ObjectCache};
pub use emit::{
    Compiled, Llvm, Program, compile, emit_llvm_ir, emit_native, emit_shared_library,
    emit_static_library,
};
pub use gpu::{EmulatedDevice, Emulator, compile_gpu, emulate};
pub use jit::{
    Jit, JitOptions, Launch, MAX_CACHED_CONSTANT_BYTES, compile_in_process, jit, jit_with,
};
pub use program::ProgramKey;

use inkwell::builder::BuilderError;

/// Why code could not be generated or run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    /// LLVM refused something (a target, the IR, the JIT).
    #[error("LLVM: {0}")]
    Llvm(String),
    /// The tile IR breaks an invariant the verifier checks.
    #[error("invalid tile IR: {0}")]
    Invalid(String),
    /// Valid IR that this back end does not compile (said why).
    #[error("{0}")]
    Unsupported(String),
    /// Arguments do not match the function.
    #[error("{0}")]
    Arguments(String),
    /// A shared library could not be linked.
    #[error("{0}")]
    Link(String),
    /// An entry point's exported symbol is not allowed (see [`Symbols`]).
    #[error("{0}")]
    Symbol(String),
}

impl From<BuilderError> for CodegenError {
    fn from(e: BuilderError) -> Self {
        CodegenError::Llvm(e.to_string())
    }
}

pub(crate) type R<T> = Result<T, CodegenError>;
