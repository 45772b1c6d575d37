//! Calling compiled code with checked arguments.

use std::marker::PhantomData;

use dlc_core::{DType, TensorType};

use crate::abi::{Param, Signature, status_message};
use crate::tensor::{HostTensor, TensorError, Value};

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
    lines: Vec<Line>,
    len: usize,
}

/// One cache line of storage. (`[u64; 8]` alone is aligned to 8 bytes
/// only: buffers were, until a test looked.)
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

// SAFETY: 64 bytes of integers, aligned to 64, without padding: every bit
// pattern is a valid `Line`, all zeros included.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; `Line` is `Copy` and `repr(C)`.
unsafe impl bytemuck::Pod for Line {}

/// Asks Linux to back the 2 MiB-aligned part of the `len` bytes at `start`
/// (allocated, not yet written) with huge pages: a fresh page costs a fault
/// and its zeroing when first written, and a model's weights and prepared
/// kernels are hundreds of MB of them (BERT-base's preparer's results, 340
/// MB, took 0.96 s to zero in 4 KiB pages on a 2-core virtual machine, 0.6
/// s so).
#[cfg(target_os = "linux")]
fn advise_huge_pages(start: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    let (a, b) = (
        (start as usize).next_multiple_of(HUGE),
        (start as usize).saturating_add(len) / HUGE * HUGE,
    );
    if b > a {
        // SAFETY: advice on whole pages inside one allocation of ours; it
        // changes no contents (the pages are not written yet) and a
        // failure only leaves the small pages.
        unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_start: *mut u8, _len: usize) {}

impl AlignedBuffer {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> AlignedBuffer {
        // A large buffer asks for huge pages before its first write.
        let n = len.div_ceil(64).max(1);
        let mut lines: Vec<Line> = Vec::with_capacity(n);
        advise_huge_pages(lines.as_mut_ptr().cast(), n * 64);
        lines.resize(n, Line([0; 8]));
        AlignedBuffer { lines, len }
    }

    /// The elements of `t` as little-endian bytes of its element type,
    /// written in place (no intermediate copy).
    pub fn from_tensor(t: &HostTensor) -> AlignedBuffer {
        AlignedBuffer::from_values(t.ty.dtype, t.data.len(), t.data.iter().copied())
    }

    /// `n` elements of type `dtype` taken from `values` (zeros where it
    /// runs out), as little-endian bytes.
    pub fn from_values(dtype: DType, n: usize, values: impl Iterator<Item = f64>) -> AlignedBuffer {
        let size = dtype.size_bytes();
        let mut b = AlignedBuffer::zeroed(n * size);
        let out = b.bytes_mut().chunks_exact_mut(size).zip(values);
        // f32, the common case, without the per-element match on the type:
        // W8's inputs (45 MB) lay out in 82-87 ms this way, 101-164 ms
        // through `write_le_bytes` (inlined or not).
        if dtype == DType::F32 {
            for (o, x) in out {
                o.copy_from_slice(&(x as f32).to_le_bytes());
            }
        } else {
            for (o, x) in out {
                dtype.write_le_bytes(x, o);
            }
        }
        b
    }

    /// A copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> AlignedBuffer {
        let mut b = AlignedBuffer::zeroed(bytes.len());
        b.bytes_mut().copy_from_slice(bytes);
        b
    }

    /// The contents.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<Line, u8>(&self.lines)[..self.len]
    }

    /// The contents, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<Line, u8>(&mut self.lines)[..self.len]
    }

    /// The address of the first byte.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.lines.as_mut_ptr().cast()
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
    /// The kernel computing the last inputs from the weights, run once per
    /// [`Kernel::bind`].
    prepare: Option<(Box<Kernel<'a>>, PrepareBinding)>,
    _code: PhantomData<&'a ()>,
}

/// How a function with a preparer is called: the caller's inputs are the
/// function's inputs but the prepared ones (its last), and the preparer's
/// inputs are some of them, by name.
#[derive(Debug, Clone)]
pub struct PrepareBinding {
    /// The inputs a caller passes: the function's signature without the
    /// prepared inputs.
    pub given: Signature,
    /// For each input of the preparer, its index among `given`'s inputs.
    pub prepare_inputs: Vec<usize>,
}

impl PrepareBinding {
    /// Checks that `prepare`'s results are `main`'s last inputs (names,
    /// types, order) and that each of its inputs is one of `main`'s others.
    pub fn new(main: &Signature, prepare: &Signature) -> Result<PrepareBinding, RuntimeError> {
        let bad = |why: String| {
            RuntimeError::Load(format!(
                "`{}` is not prepared by `{}`: {why}",
                main.name, prepare.name
            ))
        };
        let inputs: Vec<&Param> = main.inputs().collect();
        let results: Vec<&Param> = prepare.outputs().collect();
        if results.len() > inputs.len() {
            return Err(bad(format!(
                "{} results for {} inputs",
                results.len(),
                inputs.len()
            )));
        }
        let first = inputs.len() - results.len();
        for (r, i) in results.iter().zip(&inputs[first..]) {
            if r.name != i.name || r.ty != i.ty {
                return Err(bad(format!(
                    "result `{}` ({}) is not input `{}` ({})",
                    r.name, r.ty, i.name, i.ty
                )));
            }
        }
        let prepare_inputs = prepare
            .inputs()
            .map(|p| {
                inputs[..first]
                    .iter()
                    .position(|i| i.name == p.name && i.ty == p.ty)
                    .ok_or_else(|| bad(format!("it reads `{}` ({}), not an input", p.name, p.ty)))
            })
            .collect::<Result<_, _>>()?;
        let prepared: Vec<&str> = results.iter().map(|r| r.name.as_str()).collect();
        let mut given = main.clone();
        given
            .params
            .retain(|p| p.output || !prepared.contains(&p.name.as_str()));
        given.prepare = None;
        Ok(PrepareBinding {
            given,
            prepare_inputs,
        })
    }

    /// The full inputs of the function: the caller's `inputs` (checked
    /// against [`PrepareBinding::given`]) and the results of
    /// `run_prepare`, called on the preparer's inputs.
    pub fn inputs<E: From<RuntimeError>>(
        &self,
        inputs: &[HostTensor],
        run_prepare: impl FnOnce(&[HostTensor]) -> Result<Vec<HostTensor>, E>,
    ) -> Result<Vec<HostTensor>, E> {
        check_inputs(&self.given, inputs)?;
        let weights: Vec<HostTensor> = self
            .prepare_inputs
            .iter()
            .map(|&i| inputs[i].clone())
            .collect();
        let mut all = inputs.to_vec();
        all.extend(run_prepare(&weights)?);
        Ok(all)
    }
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

/// A function's status as a result: a failure names its source place.
fn check_status(signature: &Signature, status: i32) -> Result<(), RuntimeError> {
    match status_message(status, &signature.site_places()) {
        None => Ok(()),
        Some(m) => Err(RuntimeError::Failed(format!("`{}`: {m}", signature.name))),
    }
}

/// Checks `inputs` against `signature` (count, element types, shapes).
pub fn check_inputs(signature: &Signature, inputs: &[HostTensor]) -> Result<(), RuntimeError> {
    check_count(signature, inputs.len())?;
    for (p, t) in signature.inputs().zip(inputs) {
        check_input(&signature.name, p, &t.ty)?;
    }
    Ok(())
}

/// Checks that `signature` takes `given` inputs.
fn check_count(signature: &Signature, given: usize) -> Result<(), RuntimeError> {
    let name = &signature.name;
    let params: Vec<_> = signature.inputs().collect();
    if given < params.len() {
        let missing: Vec<String> = params[given..]
            .iter()
            .map(|p| format!("`{}` ({})", p.name, p.ty))
            .collect();
        return Err(RuntimeError::Arguments(format!(
            "`{name}` takes {} input(s), got {given}: missing {}",
            params.len(),
            missing.join(", ")
        )));
    }
    if given > params.len() {
        return Err(RuntimeError::Arguments(format!(
            "`{name}` takes {} input(s), got {given}",
            params.len(),
        )));
    }
    Ok(())
}

/// Checks an input of type `ty` against parameter `p` of function `name`.
fn check_input(name: &str, p: &Param, ty: &TensorType) -> Result<(), RuntimeError> {
    if p.ty.dtype != ty.dtype {
        return Err(RuntimeError::Arguments(format!(
            "`{name}`: input `{}` must have element type {}, got {} ({ty})",
            p.name, p.ty.dtype, ty.dtype
        )));
    }
    if p.ty.shape != ty.shape {
        return Err(RuntimeError::Arguments(format!(
            "`{name}`: input `{}` must be {}, got {ty}",
            p.name, p.ty
        )));
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
            buffers.push(AlignedBuffer::from_tensor(t));
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
            prepare: None,
            _code: PhantomData,
        }
    }

    /// This kernel with its preparer (the kernel its signature's `prepare`
    /// names): [`Kernel::bind`] then takes the inputs but the prepared
    /// ones, runs `prepare` on the weights among them once, and passes its
    /// results to every run.
    pub fn with_prepare(mut self, prepare: Kernel<'a>) -> Result<Kernel<'a>, RuntimeError> {
        let binding = PrepareBinding::new(&self.signature, &prepare.signature)?;
        self.prepare = Some((Box::new(prepare), binding));
        Ok(self)
    }

    /// The parameters it takes (with a preparer: the prepared inputs too).
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// The signature of what a caller passes: the inputs but the prepared
    /// ones.
    pub fn given(&self) -> &Signature {
        match &self.prepare {
            Some((_, binding)) => &binding.given,
            None => &self.signature,
        }
    }

    /// The kernel computing this one's last inputs from its weights, and
    /// which of the caller's inputs it reads.
    pub fn preparer(&self) -> Option<(&Kernel<'a>, &PrepareBinding)> {
        self.prepare.as_ref().map(|(k, b)| (&**k, b))
    }

    /// Calls the function on storage the caller owns, without copies: one
    /// pointer per parameter of [`Kernel::signature`] (its prepared inputs
    /// included), inputs first, then results; a failure status is an error
    /// naming the failing op's source place.
    ///
    /// # Safety
    /// Each pointer addresses storage of its parameter's type (row-major,
    /// [`TensorType::num_elements`] elements of its element type's size),
    /// aligned to its element size, that stays alive for the call; inputs
    /// are only read, and nothing else writes them during the call;
    /// results are writable and overlap nothing else.
    pub unsafe fn call_raw(&self, pointers: &[*mut u8]) -> Result<(), RuntimeError> {
        if pointers.len() != self.signature.params.len() {
            return Err(RuntimeError::Arguments(format!(
                "`{}` takes {} buffers (inputs and results), got {}",
                self.signature.name,
                self.signature.params.len(),
                pointers.len()
            )));
        }
        // SAFETY: `from_raw`'s contract makes `entry` a dlc entry function
        // for this signature, still loaded; the caller vouches for the
        // storage, one buffer per parameter, in order.
        let status = unsafe { (self.entry)(pointers.as_ptr()) };
        check_status(&self.signature, status)
    }

    /// Checks `inputs` against the signature (count, element types, shapes)
    /// and prepares the storage of a call: the inputs and zeroed results.
    /// With a preparer, `inputs` leave out the prepared inputs, which the
    /// preparer computes here, once.
    pub fn bind(&self, inputs: &[HostTensor]) -> Result<BoundCall<'_, 'a>, RuntimeError> {
        // The count first, so that a call missing inputs says which; each
        // input is checked as it is pushed.
        check_count(self.given(), inputs.len())?;
        let mut binder = self.binder();
        for t in inputs {
            binder.push(t)?;
        }
        binder.finish()
    }

    /// A call whose inputs are given one at a time ([`Binder::push`]): a
    /// caller that makes or reads its inputs one by one needs only the one
    /// in hand beside the call's storage, not all of them twice.
    pub fn binder(&self) -> Binder<'_, 'a> {
        Binder {
            kernel: self,
            buffers: Vec::with_capacity(self.signature.params.len()),
        }
    }

    /// Calls the function on `inputs`; returns its results.
    pub fn call(&self, inputs: &[HostTensor]) -> Result<Vec<HostTensor>, RuntimeError> {
        self.call_each(inputs.iter().collect())
    }

    /// [`Kernel::call`] on inputs it takes: each is laid out, then dropped
    /// (freed, when owned) before the next, so the caller's tensors are not
    /// held beside their layout (`dlc run` of an imported model, whose
    /// weights are most of its memory).
    pub fn call_each<T: Input>(&self, inputs: Vec<T>) -> Result<Vec<HostTensor>, RuntimeError> {
        check_count(self.given(), inputs.len())?;
        let mut binder = self.binder();
        for t in inputs {
            t.push_to(&mut binder)?;
        }
        let mut call = binder.finish()?;
        call.run()?;
        call.outputs()
    }
}

/// What [`Kernel::call_each`] takes as an input: a tensor (owned or
/// borrowed) or a [`Value`].
pub trait Input {
    /// Checks `self` against the binder's next input and lays it out.
    fn push_to(&self, binder: &mut Binder<'_, '_>) -> Result<(), RuntimeError>;
}

impl Input for HostTensor {
    fn push_to(&self, binder: &mut Binder<'_, '_>) -> Result<(), RuntimeError> {
        binder.push(self)
    }
}

impl Input for &HostTensor {
    fn push_to(&self, binder: &mut Binder<'_, '_>) -> Result<(), RuntimeError> {
        binder.push(self)
    }
}

impl Input for Value {
    fn push_to(&self, binder: &mut Binder<'_, '_>) -> Result<(), RuntimeError> {
        binder.push_value(self)
    }
}

/// A call being bound input by input ([`Kernel::binder`]).
pub struct Binder<'k, 'a> {
    kernel: &'k Kernel<'a>,
    buffers: Vec<AlignedBuffer>,
}

impl<'k, 'a> Binder<'k, 'a> {
    /// Checks `t` against the next input the caller passes and lays it out
    /// (`t` may be dropped then).
    pub fn push(&mut self, t: &HostTensor) -> Result<(), RuntimeError> {
        self.push_values(&t.ty, t.data.iter().copied())
    }

    /// Checks `v` against the next input and lays it out: a tensor's bytes
    /// are copied as they are, not read as `f64`s.
    pub fn push_value(&mut self, v: &Value) -> Result<(), RuntimeError> {
        match v {
            Value::Host(t) => self.push(t),
            Value::Raw(t) => self.push_bytes(t.ty(), t.bytes()),
        }
    }

    /// The next input as its type and its elements' little-endian bytes,
    /// copied as they are.
    pub fn push_bytes(&mut self, ty: &TensorType, bytes: &[u8]) -> Result<(), RuntimeError> {
        let p = self.next_input(ty)?;
        let want = bytes_of(ty)?;
        if bytes.len() != want {
            return Err(RuntimeError::Arguments(format!(
                "`{}`: input `{}` ({ty}) takes {want} bytes, got {}",
                self.kernel.given().name,
                p.name,
                bytes.len()
            )));
        }
        self.buffers.push(AlignedBuffer::from_bytes(bytes));
        Ok(())
    }

    /// The parameter the next input is for, checked against `ty`.
    fn next_input(&self, ty: &TensorType) -> Result<&'k Param, RuntimeError> {
        let given = self.kernel.given();
        let k = self.buffers.len();
        let p = given.inputs().nth(k).ok_or_else(|| {
            RuntimeError::Arguments(format!("`{}` takes {k} input(s), got more", given.name))
        })?;
        check_input(&given.name, p, ty)?;
        Ok(p)
    }

    /// The next input as its type and its elements in row-major order,
    /// written into its buffer as they come (a caller drawing or decoding
    /// values never holds the tensor as `f64`s); elements past the type's
    /// count are not read, missing ones are an error.
    pub fn push_values(
        &mut self,
        ty: &TensorType,
        values: impl Iterator<Item = f64>,
    ) -> Result<(), RuntimeError> {
        let p = self.next_input(ty)?;
        let n = ty
            .num_elements()
            .ok_or_else(|| RuntimeError::Arguments(format!("{ty} is too large")))?;
        let mut count = 0;
        let buffer = AlignedBuffer::from_values(ty.dtype, n, values.inspect(|_| count += 1));
        if count < n {
            return Err(RuntimeError::Arguments(format!(
                "`{}`: input `{}` ({ty}) has {count} of its {n} elements",
                self.kernel.given().name,
                p.name
            )));
        }
        self.buffers.push(buffer);
        Ok(())
    }

    /// The bound call, once every input is pushed; with a preparer, the
    /// preparer runs here, once, on the buffers the calls will read.
    pub fn finish(self) -> Result<BoundCall<'k, 'a>, RuntimeError> {
        let Binder {
            kernel,
            mut buffers,
        } = self;
        check_count(kernel.given(), buffers.len())?;
        if let Some((prepare, binding)) = &kernel.prepare {
            // The preparer's results are the function's last inputs.
            let prepared = run_preparer(prepare, binding, &mut buffers)?;
            buffers.extend(prepared);
        }
        for p in kernel.signature.outputs() {
            buffers.push(AlignedBuffer::zeroed(bytes_of(&p.ty)?));
        }
        Ok(BoundCall { kernel, buffers })
    }
}

/// Runs `prepare` once on the weights among the caller's laid-out `inputs`
/// (as `binding` maps them); returns its results.
fn run_preparer(
    prepare: &Kernel<'_>,
    binding: &PrepareBinding,
    inputs: &mut [AlignedBuffer],
) -> Result<Vec<AlignedBuffer>, RuntimeError> {
    let given: Vec<*mut u8> = inputs.iter_mut().map(AlignedBuffer::as_mut_ptr).collect();
    // SAFETY: the caller's inputs are laid out, one checked buffer per
    // input, alive during the call.
    unsafe { prepare_raw(prepare, binding, &given) }
}

/// Runs `prepare` once on the weights among the caller's inputs `given`
/// (one pointer per input the caller passes, as `binding` maps them);
/// returns its results, fresh buffers.
///
/// # Safety
/// As [`Kernel::call_raw`] for each pointer of `given` that `binding`
/// hands the preparer: the storage of its parameter's type, alive and
/// unwritten during the call.
pub unsafe fn prepare_raw(
    prepare: &Kernel<'_>,
    binding: &PrepareBinding,
    given: &[*mut u8],
) -> Result<Vec<AlignedBuffer>, RuntimeError> {
    let mut results = prepare
        .signature
        .outputs()
        .map(|p| Ok(AlignedBuffer::zeroed(bytes_of(&p.ty)?)))
        .collect::<Result<Vec<_>, RuntimeError>>()?;
    let mut pointers = Vec::with_capacity(prepare.signature.params.len());
    let (mut ins, mut outs) = (binding.prepare_inputs.iter(), results.iter_mut());
    for p in &prepare.signature.params {
        let b = if p.output {
            outs.next().map(AlignedBuffer::as_mut_ptr)
        } else {
            ins.next().and_then(|&i| given.get(i).copied())
        };
        let b = b.ok_or_else(|| {
            RuntimeError::Arguments(format!("`{}`: malformed preparer", prepare.signature.name))
        })?;
        pointers.push(b);
    }
    // SAFETY: one pointer per parameter of the preparer, in order: the
    // caller vouches for its inputs' storage, its results are fresh buffers
    // of their types' sizes.
    unsafe { prepare.call_raw(&pointers)? };
    Ok(results)
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
        // SAFETY: `bind` made one buffer per parameter, in order, each of
        // the size its type needs (64-byte aligned), and they outlive the
        // call.
        unsafe { self.kernel.call_raw(&pointers) }
    }

    /// The results of the last run (zeros before any).
    pub fn outputs(&self) -> Result<Vec<HostTensor>, RuntimeError> {
        results(&self.kernel.signature, &self.buffers)
    }

    /// Parameter `k` (inputs first, then results) and its buffer.
    fn param(&self, k: usize) -> Result<(&crate::abi::Param, &AlignedBuffer), RuntimeError> {
        match (self.kernel.signature.params.get(k), self.buffers.get(k)) {
            (Some(p), Some(b)) => Ok((p, b)),
            _ => Err(RuntimeError::Arguments(format!(
                "`{}` has no parameter {k}",
                self.kernel.signature.name
            ))),
        }
    }

    /// Input `i` as it stands (after [`BoundCall::swap_result_into_input`],
    /// a result of an earlier run).
    pub fn input(&self, i: usize) -> Result<HostTensor, RuntimeError> {
        let (p, b) = self.param(i)?;
        Ok(HostTensor::from_le_bytes(
            p.ty.clone(),
            &b.bytes()[..bytes_of(&p.ty)?],
        )?)
    }

    /// Result `r` of the last run.
    pub fn output(&self, r: usize) -> Result<HostTensor, RuntimeError> {
        self.input(self.kernel.signature.inputs().count() + r)
    }

    /// Input `i`'s storage as it stands: its type's little-endian bytes,
    /// row-major (for a caller moving tensors without a conversion, such
    /// as an all-reduce of gradients).
    pub fn input_bytes(&self, i: usize) -> Result<&[u8], RuntimeError> {
        let (p, b) = self.param(i)?;
        Ok(&b.bytes()[..bytes_of(&p.ty)?])
    }

    /// Result `r`'s storage after the last run, as [`BoundCall::input_bytes`].
    pub fn output_bytes(&self, r: usize) -> Result<&[u8], RuntimeError> {
        self.input_bytes(self.kernel.signature.inputs().count() + r)
    }

    /// Input `i`'s storage, to overwrite in place for the next run.
    pub fn input_bytes_mut(&mut self, i: usize) -> Result<&mut [u8], RuntimeError> {
        let (p, _) = self.param(i)?;
        if p.output {
            return Err(RuntimeError::Arguments(format!(
                "`{}`: parameter {i} is a result, not an input",
                self.kernel.signature.name
            )));
        }
        let n = bytes_of(&p.ty)?;
        Ok(&mut self.buffers[i].bytes_mut()[..n])
    }

    /// Overwrites input `i` with `values` (its type's count of elements,
    /// row-major), for the next run.
    pub fn write_input(
        &mut self,
        i: usize,
        values: impl Iterator<Item = f64>,
    ) -> Result<(), RuntimeError> {
        let (p, _) = self.param(i)?;
        let ty = p.ty.clone();
        let n = ty.num_elements().unwrap_or(0);
        let mut count = 0;
        let fresh = AlignedBuffer::from_values(ty.dtype, n, values.inspect(|_| count += 1));
        if count < n {
            return Err(RuntimeError::Arguments(format!(
                "input {i} ({ty}) given {count} of its {n} elements"
            )));
        }
        self.buffers[i] = fresh;
        Ok(())
    }

    /// Makes result `r` of the last run input `i` of the next, without a
    /// copy: the two buffers trade places (the input's old buffer takes
    /// the next run's result, which overwrites all of it). A training step
    /// whose results are the next step's weights and state runs so, in
    /// place. They must have one type.
    pub fn swap_result_into_input(&mut self, r: usize, i: usize) -> Result<(), RuntimeError> {
        let k = self.kernel.signature.inputs().count() + r;
        let (pi, _) = self.param(i)?;
        let (pr, _) = self.param(k)?;
        if pi.output || pi.ty != pr.ty {
            return Err(RuntimeError::Arguments(format!(
                "`{}`: result {r} ({}) cannot become input {i} ({})",
                self.kernel.signature.name, pr.ty, pi.ty
            )));
        }
        self.buffers.swap(i, k);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_are_laid_out_as_their_little_endian_bytes() {
        let values = [0.0, 1.5, -2.0, 3.0, 255.0, -0.25, 7.0];
        for dtype in DType::ALL {
            let data: Vec<f64> = values.iter().map(|&v| dtype.round(v)).collect();
            let t = HostTensor::new(TensorType::new(dtype, vec![data.len()]), data).unwrap();
            let b = AlignedBuffer::from_tensor(&t);
            assert_eq!(b.bytes(), t.to_le_bytes(), "{dtype}");
            assert_eq!(b.bytes().as_ptr() as usize % 64, 0, "{dtype}");
        }
    }
}
