//! Calling compiled code with checked arguments.

use std::marker::PhantomData;

use dlc_core::TensorType;

use crate::abi::{Signature, status_message};
use crate::tensor::{HostTensor, TensorError};

/// Why a compiled function could not be loaded or called, or failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The arguments do not match the function's signature.
    #[error("{0}")]
    Arguments(String),
    /// The compiled code returned a nonzero status.
    #[error("{0}")]
    Failed(String),
    /// A library or symbol could not be loaded.
    #[error("{0}")]
    Load(String),
    /// A result could not be made into a tensor.
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// Zero-initialized storage aligned to 64 bytes (a cache line, an AVX-512
/// vector), as compiled code is given.
#[derive(Debug, Clone)]
pub struct AlignedBuffer {
    words: Vec<[u64; 8]>,
    len: usize,
}

impl AlignedBuffer {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> AlignedBuffer {
        AlignedBuffer {
            words: vec![[0u64; 8]; len.div_ceil(64).max(1)],
            len,
        }
    }

    /// A copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> AlignedBuffer {
        let mut b = AlignedBuffer::zeroed(bytes.len());
        b.bytes_mut().copy_from_slice(bytes);
        b
    }

    /// The contents.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<[u64; 8], u8>(&self.words)[..self.len]
    }

    /// The contents, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<[u64; 8], u8>(&mut self.words)[..self.len]
    }

    /// The address of the first byte.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr().cast()
    }
}

/// The `NAME.entry` form of a compiled function: one pointer per parameter,
/// in an array.
pub type EntryFn = unsafe extern "C" fn(*const *mut u8) -> i32;

/// A compiled function that can be called with checked arguments. It
/// borrows whatever keeps its code alive (a JIT, a loaded library).
pub struct Kernel<'a> {
    signature: Signature,
    entry: EntryFn,
    _code: PhantomData<&'a ()>,
}

impl std::fmt::Debug for Kernel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("signature", &self.signature)
            .finish_non_exhaustive()
    }
}

fn bytes_of(ty: &TensorType) -> Result<usize, RuntimeError> {
    ty.num_elements()
        .and_then(|n| n.checked_mul(ty.dtype.size_bytes()))
        .ok_or_else(|| RuntimeError::Arguments(format!("{ty} is too large")))
}

/// Checks `inputs` against `signature` (count, element types, shapes).
pub fn check_inputs(signature: &Signature, inputs: &[HostTensor]) -> Result<(), RuntimeError> {
    let name = &signature.name;
    let params: Vec<_> = signature.inputs().collect();
    if inputs.len() < params.len() {
        let missing: Vec<String> = params[inputs.len()..]
            .iter()
            .map(|p| format!("`{}` ({})", p.name, p.ty))
            .collect();
        return Err(RuntimeError::Arguments(format!(
            "`{name}` takes {} input(s), got {}: missing {}",
            params.len(),
            inputs.len(),
            missing.join(", ")
        )));
    }
    if inputs.len() > params.len() {
        return Err(RuntimeError::Arguments(format!(
            "`{name}` takes {} input(s), got {}",
            params.len(),
            inputs.len()
        )));
    }
    for (p, t) in params.iter().zip(inputs) {
        if p.ty.dtype != t.ty.dtype {
            return Err(RuntimeError::Arguments(format!(
                "`{name}`: input `{}` must have element type {}, got {} ({})",
                p.name, p.ty.dtype, t.ty.dtype, t.ty
            )));
        }
        if p.ty.shape != t.ty.shape {
            return Err(RuntimeError::Arguments(format!(
                "`{name}`: input `{}` must be {}, got {}",
                p.name, p.ty, t.ty
            )));
        }
    }
    Ok(())
}

/// Checks `inputs` and lays out one buffer per parameter of `signature`:
/// the inputs' bytes, and zeroed results.
pub fn lay_out(
    signature: &Signature,
    inputs: &[HostTensor],
) -> Result<Vec<AlignedBuffer>, RuntimeError> {
    check_inputs(signature, inputs)?;
    let mut buffers = Vec::with_capacity(signature.params.len());
    let mut given = inputs.iter();
    for p in &signature.params {
        if p.output {
            buffers.push(AlignedBuffer::zeroed(bytes_of(&p.ty)?));
        } else if let Some(t) = given.next() {
            buffers.push(AlignedBuffer::from_bytes(&t.to_le_bytes()));
        }
    }
    Ok(buffers)
}

/// The results among `buffers` (one per parameter of `signature`), as
/// tensors.
pub fn results(
    signature: &Signature,
    buffers: &[AlignedBuffer],
) -> Result<Vec<HostTensor>, RuntimeError> {
    signature
        .params
        .iter()
        .zip(buffers)
        .filter(|(p, _)| p.output)
        .map(|(p, b)| Ok(HostTensor::from_le_bytes(p.ty.clone(), b.bytes())?))
        .collect()
}

impl<'a> Kernel<'a> {
    /// A kernel calling `entry`.
    ///
    /// # Safety
    /// `entry` must be the `NAME.entry` function dlc generated for a function
    /// with exactly this signature, and its code must stay loaded for `'a`.
    pub unsafe fn from_raw(signature: Signature, entry: EntryFn) -> Kernel<'a> {
        Kernel {
            signature,
            entry,
            _code: PhantomData,
        }
    }

    /// The parameters it takes.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Checks `inputs` against the signature (count, element types, shapes)
    /// and prepares the storage of a call: the inputs and zeroed results.
    pub fn bind(&self, inputs: &[HostTensor]) -> Result<BoundCall<'_, 'a>, RuntimeError> {
        Ok(BoundCall {
            kernel: self,
            buffers: lay_out(&self.signature, inputs)?,
        })
    }

    /// Calls the function on `inputs`; returns its results.
    pub fn call(&self, inputs: &[HostTensor]) -> Result<Vec<HostTensor>, RuntimeError> {
        let mut call = self.bind(inputs)?;
        call.run()?;
        call.outputs()
    }
}

/// A call whose arguments are checked and laid out; it can be run again
/// and again on the same storage (benchmarks do).
pub struct BoundCall<'k, 'a> {
    kernel: &'k Kernel<'a>,
    buffers: Vec<AlignedBuffer>,
}

impl BoundCall<'_, '_> {
    /// Runs the function once.
    pub fn run(&mut self) -> Result<(), RuntimeError> {
        let pointers: Vec<*mut u8> = self
            .buffers
            .iter_mut()
            .map(AlignedBuffer::as_mut_ptr)
            .collect();
        // SAFETY: `Kernel::from_raw`'s contract makes `entry` a dlc entry
        // function for this signature, still loaded; `bind` made one buffer
        // per parameter, in order, each of the size its type needs, and they
        // outlive the call.
        let status = unsafe { (self.kernel.entry)(pointers.as_ptr()) };
        match status_message(status, &self.kernel.signature.site_places()) {
            None => Ok(()),
            Some(m) => Err(RuntimeError::Failed(format!(
                "`{}`: {m}",
                self.kernel.signature.name
            ))),
        }
    }

    /// The results of the last run (zeros before any).
    pub fn outputs(&self) -> Result<Vec<HostTensor>, RuntimeError> {
        results(&self.kernel.signature, &self.buffers)
    }
}
