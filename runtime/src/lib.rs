//! The dlc runtime: what a program needs to feed and run compiled models,
//! with no compiler at run time.
//!
//! - [`HostTensor`]: tensors in host memory, their `.npy` files, random inputs;
//!   [`RawTensor`], a tensor as a file stores it (bytes of its element type),
//!   and [`Value`], either, as a call's input; [`map_file`] maps a file.
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
//! is such a program as a file, which `dlc-rt` runs. [`nccl`] sums tensors
//! in GPU memory over the processes of a data-parallel run (NCCL, loaded at
//! run time too).
//!
//! # Tensors, kernels and threads
//!
//! `dlc-runtime` holds `HostTensor` (type plus f64 elements, each representable in the
//! type), `.npy` read/write through npyz (every dlc element type but bf16 is a NumPy
//! one), and seeded random inputs (floats uniform in [-1, 1), signed integers in
//! [-10, 10], unsigned ones in [0, 20]). NumPy has no bfloat16: bf16 tensors are written as
//! float32, and a float32 file is accepted for a bf16 parameter (rounded).
//!
//! A `Kernel` is a compiled
//! function with its signature: `call` checks the number of inputs, their element types
//! and shapes, lays them out in 64-byte aligned buffers (`AlignedBuffer`, vectors of a
//! `repr(align(64))` line: until a test checked, they were vectors of `[u64; 8]`, aligned
//! to 8 bytes only, so inputs and prepared panels could straddle cache lines), calls, and
//! turns a nonzero status into an error; `bind` prepares a call once for repeated runs
//! (benchmarks), and `binder` does the same with inputs pushed one at a time, each
//! checked and written into its buffer in place as it comes, so that a caller making or
//! reading its inputs one by one never holds all of them twice (`dlc bench` draws its
//! random inputs that way).
//! `SharedLibrary::open` loads a `--emit so` library (dlopen through libloading) and
//! hands out its kernels; the JIT hands out the same kernels.
//!
//! Parallel loops run on the OpenMP runtime's pool (libgomp): generated code calls
//! `GOMP_parallel`, so an object file or shared library needs nothing of ours at run
//! time (`-lgomp`, `OMP_NUM_THREADS` work as for any OpenMP program). The OpenMP symbols
//! are weak: an object file linked without `-lgomp` runs its parallel loops on the
//! calling thread instead of failing to link. `set_num_threads` sizes the pool for
//! `dlc bench --threads`. The runtime loads libgomp once and never unloads it (`load_thread_pool`): its workers outlive every call, and LLVM's
//! JIT closes its own handle at exit.
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
// Mapping a file is unsafe in Rust's terms (another process may change it).
#[allow(unsafe_code)]
mod library;
#[allow(unsafe_code)]
mod mapped;
pub mod module;
// NCCL's API is an FFI boundary too.
#[allow(unsafe_code)]
pub mod nccl;
mod tensor;

pub use abi::{Param, Signature, Site};
pub use call::{AlignedBuffer, Binder, Input, Kernel, PrepareBinding, RuntimeError};
pub use library::{SharedLibrary, load_thread_pool, release_code_pages, set_num_threads};
pub use mapped::map_file;
pub use tensor::{HostTensor, RandomRange, RawTensor, TensorError, Value, seeded_rng};
