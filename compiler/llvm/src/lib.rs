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
mod split;
mod target;

pub use abi::{exported_signature, signature};
pub use cache::{DEFAULT_MAX_BYTES, ObjectCache};
pub use emit::{
    Compiled, Llvm, Program, compile, emit_llvm_ir, emit_native, emit_shared_library,
    emit_static_library,
};
pub use gpu::{Emulator, compile_gpu, emulate};
pub use jit::{Jit, JitOptions, compile_in_process, jit, jit_with};

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
