//! Code generation through LLVM (inkwell), the only crate that links LLVM.
//!
//! [`compile`] turns loop IR into an LLVM module: each `loop.func` becomes a
//! C-ABI function `int32_t SYM(T0 *b0, T1 *b1, ...)`, where `SYM` is its
//! name with the module's symbol prefix ([`dlc_runtime::abi::Symbols`]), taking one pointer per
//! buffer parameter (contiguous storage of the buffer's element type; `bool`
//! is one byte) and returning 0, or a nonzero status: 1 for an integer
//! division by zero, 2 when an allocation fails. A wrapper
//! `int32_t SYM.entry(void **buffers)` takes the pointers as an array, for
//! callers that do not know the arity statically, and `SYM.signature`
//! describes the parameters (the ABI is `dlc_runtime::abi`'s). Every function
//! carries the host CPU and its features, and the module goes through LLVM's
//! O3 pipeline. [`jit`] compiles a module in process and hands out its
//! functions as the runtime's checked [`dlc_runtime::Kernel`]s;
//! [`emit_native`] and [`emit_shared_library`] write object files, assembly
//! and shared libraries.
//!
//! Loads without a pad value must be in bounds (the lowering only emits
//! those); padded loads are bounds-checked.
#![deny(missing_docs)]
// The JIT call is an FFI boundary; see `run`.
#![allow(unsafe_code)]

mod codegen;

pub use codegen::{
    CodegenError, Compiled, Jit, compile, emit_llvm_ir, emit_native, emit_shared_library,
    exported_signature, jit, signature,
};
