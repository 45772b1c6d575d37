//! The dlc runtime: what a program needs to feed and run compiled models,
//! with no compiler at run time.
//!
//! - [`HostTensor`]: tensors in host memory, their `.npy` files, random inputs.
//! - [`abi`]: the calling convention of compiled code (one pointer per buffer,
//!   a status code), the signature every compiled function carries
//!   (`NAME.signature`), and the C header that describes it.
//! - [`Kernel`]: a typed call of compiled code that checks the count, shapes
//!   and element types of its inputs and turns statuses into errors.
//! - [`SharedLibrary`]: a module compiled with `dlc compile --emit so`,
//!   loaded with `dlopen`.
//!
//! Parallel loops of compiled code run on the OpenMP runtime's thread pool
//! (libgomp), which the generated code calls itself; [`set_num_threads`]
//! sizes it. [`gpu`] runs programs compiled for an NVIDIA GPU: CUDA through
//! cudarc ([`cuda`]), whose driver library is loaded at run time; [`module`]
//! is such a program as a file, which `dlc-rt` runs.
#![deny(missing_docs)]

pub mod abi;
pub mod check;
// CUDA's driver API is an FFI boundary.
#[allow(unsafe_code)]
pub mod cuda;
// Calling compiled code and loading libraries is an FFI boundary; the
// unsafe blocks are confined to these two modules.
#[allow(unsafe_code)]
pub mod call;
pub mod gpu;
#[allow(unsafe_code)]
mod library;
pub mod module;
mod tensor;

pub use abi::{Param, Signature, Site};
pub use call::{AlignedBuffer, Binder, Kernel, PrepareBinding, RuntimeError};
pub use library::{SharedLibrary, load_thread_pool, release_code_pages, set_num_threads};
pub use tensor::{HostTensor, RandomRange, TensorError, seeded_rng};
