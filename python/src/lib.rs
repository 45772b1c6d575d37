//! `dlc._dlc`: the native half of the `dlc` Python package (python/dlc
//! holds the other half). It compiles a model with the same driver as the
//! `dlc` command, keeps the machine code in process (the JIT's object cache
//! shared with `dlc run`), and calls it on the caller's memory.
//!
//! What it guarantees:
//! - Inputs are read where they are: a [`View`] is the address, element type
//!   and shape of a tensor the caller owns (NumPy's array interface or a
//!   DLPack capsule from PyTorch, JAX, ...); a call checks each against its
//!   parameter (type, shape, C order, alignment) and raises `TypeError`
//!   naming the parameter otherwise. Nothing is copied but weights given to
//!   [`Function::bind`], which the bound function owns.
//! - Results are [`Tensor`]s: buffers the compiled code wrote, handed out by
//!   DLPack (`numpy.from_dlpack`, `torch.from_dlpack`) without a copy.
//! - Compiled code runs with the GIL released.
//! - Every failure is a Python exception: `dlc.CompileError` (the rendered
//!   diagnostics, with `file`, `line`, `column` of the first),
//!   `dlc.RuntimeError` (a failing op's source place), `TypeError` or
//!   `ValueError` for arguments.
#![allow(unsafe_code)] // DLPack is a C ABI: raw tensors in and out.

use std::collections::BTreeSet;
use std::ffi::{CStr, c_void};
use std::sync::{Arc, Mutex};

use dlc_core::{DType, TargetDesc, TensorType};
use dlc_driver::{Artifact, Backends, CompileOptions, DriverError, NativeArtifact, SourceText};
use dlc_runtime::{AlignedBuffer, Kernel, Signature};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

create_exception!(
    _dlc,
    CompileError,
    PyException,
    "A model that could not be compiled: the message is the full diagnostic text; `file`, \
     `line` and `column` locate the first diagnostic where the source has one (else None)."
);
create_exception!(
    _dlc,
    RuntimeError,
    PyRuntimeError,
    "Compiled code that failed while it ran (integer division by zero, out of memory): the \
     message names the failing op's source place."
);

/// A driver error as the Python exception a user expects.
fn compile_error(py: Python<'_>, e: DriverError) -> PyErr {
    let err = CompileError::new_err(e.to_string());
    let (file, place) = match &e {
        DriverError::Source(s) => (Some(s.file.clone()), s.place),
        DriverError::IrSyntax {
            path, line, column, ..
        }
        | DriverError::NotUtf8 {
            path, line, column, ..
        } => (Some(path.clone()), Some((*line, *column))),
        DriverError::Io { path, .. } | DriverError::Import { path, .. } => {
            (Some(path.clone()), None)
        }
        _ => (None, None),
    };
    let value = err.value(py);
    let set = || -> PyResult<()> {
        value.setattr("file", file)?;
        value.setattr("line", place.map(|p| p.0))?;
        value.setattr("column", place.map(|p| p.1))
    };
    match set() {
        Ok(()) => err,
        Err(e) => e,
    }
}

fn runtime_error(e: dlc_runtime::RuntimeError) -> PyErr {
    match e {
        dlc_runtime::RuntimeError::Arguments(m) => PyTypeError::new_err(m),
        other => RuntimeError::new_err(other.to_string()),
    }
}

// ---------------------------------------------------------------- DLPack

/// DLPack's C structures (dlpack.h, version 0.8; the unversioned
/// `dltensor` capsule every framework exports and takes).
mod dlpack {
    use std::ffi::c_void;

    pub const CPU: i32 = 1;
    pub const INT: u8 = 0;
    pub const UINT: u8 = 1;
    pub const FLOAT: u8 = 2;
    pub const BFLOAT: u8 = 4;
    pub const BOOL: u8 = 6;

    #[repr(C)]
    pub struct Device {
        pub device_type: i32,
        pub device_id: i32,
    }

    #[repr(C)]
    pub struct DataType {
        pub code: u8,
        pub bits: u8,
        pub lanes: u16,
    }

    #[repr(C)]
    pub struct Tensor {
        pub data: *mut c_void,
        pub device: Device,
        pub ndim: i32,
        pub dtype: DataType,
        pub shape: *mut i64,
        pub strides: *mut i64,
        pub byte_offset: u64,
    }

    #[repr(C)]
    pub struct ManagedTensor {
        pub dl_tensor: Tensor,
        pub manager_ctx: *mut c_void,
        pub deleter: Option<unsafe extern "C" fn(*mut ManagedTensor)>,
    }

    /// DLPack 1.x's managed tensor (capsule `dltensor_versioned`), which
    /// can say that a tensor is writable: NumPy marks arrays from the
    /// unversioned capsule read-only.
    #[repr(C)]
    pub struct ManagedTensorVersioned {
        pub version: [u32; 2],
        pub manager_ctx: *mut c_void,
        pub deleter: Option<unsafe extern "C" fn(*mut ManagedTensorVersioned)>,
        /// Bit 0: read-only; bit 1: a copy. Neither, here.
        pub flags: u64,
        pub dl_tensor: Tensor,
    }
}

const DLTENSOR: &CStr = c"dltensor";
const USED_DLTENSOR: &CStr = c"used_dltensor";
const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";

/// DLPack's code of an element type.
fn dl_dtype(d: DType) -> dlpack::DataType {
    let code = match d {
        DType::F32 | DType::F64 | DType::F16 => dlpack::FLOAT,
        DType::BF16 => dlpack::BFLOAT,
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => dlpack::INT,
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => dlpack::UINT,
        DType::Bool => dlpack::BOOL,
    };
    dlpack::DataType {
        code,
        bits: (d.size_bytes() * 8) as u8,
        lanes: 1,
    }
}

/// The element type DLPack's code names, if dlc has it.
fn from_dl_dtype(t: &dlpack::DataType) -> Option<DType> {
    if t.lanes != 1 {
        return None;
    }
    DType::ALL
        .into_iter()
        .find(|&d| {
            let ours = dl_dtype(d);
            ours.code == t.code && ours.bits == t.bits
        })
        // Some exporters call a byte-wide boolean an unsigned integer of
        // one bit; none of ours is.
        .or((t.code == dlpack::BOOL && t.bits == 1).then_some(DType::Bool))
}

/// The element type NumPy's array-interface type string names
/// (`<f4`, `|b1`, `<V2` is not one).
fn from_typestr(s: &str) -> Option<DType> {
    let (order, kind) = (s.get(..1)?, s.get(1..)?);
    if order == ">" {
        return None;
    }
    Some(match kind {
        "f4" => DType::F32,
        "f8" => DType::F64,
        "f2" => DType::F16,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "b1" => DType::Bool,
        _ => return None,
    })
}

/// Whether `strides` (in elements, `None` for C order) walk `shape` in C
/// order: extents of one may have any stride.
fn c_contiguous(shape: &[usize], strides: Option<&[i64]>) -> bool {
    let Some(strides) = strides else {
        return true;
    };
    let mut expected: i64 = 1;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(n as i64);
    }
    true
}

/// A tensor the caller owns, described for a call: where its elements are,
/// their type and shape, and what keeps them alive.
#[pyclass(module = "dlc._dlc", frozen)]
struct View {
    address: usize,
    /// `None`: a type dlc has no name for (`what` says which).
    dtype: Option<DType>,
    what: String,
    shape: Vec<usize>,
    contiguous: bool,
    /// The object whose memory this is.
    _owner: Py<PyAny>,
    /// A consumed DLPack tensor, whose deleter runs when the view goes.
    _managed: Option<ManagedPtr>,
}

struct ManagedPtr(*mut dlpack::ManagedTensor);

// SAFETY: DLPack lets a consumer call the deleter from any thread.
unsafe impl Send for ManagedPtr {}
// SAFETY: the pointer is only used by `Drop`.
unsafe impl Sync for ManagedPtr {}

impl Drop for ManagedPtr {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a `dltensor` capsule this view
        // consumed (renamed `used_dltensor`): its deleter is ours to call,
        // once.
        unsafe {
            if let Some(deleter) = (*self.0).deleter {
                deleter(self.0);
            }
        }
    }
}

#[pymethods]
impl View {
    /// A view of NumPy's array interface (`__array_interface__`): `data`
    /// as (address, read-only), `typestr`, `shape` and `strides` (bytes,
    /// None for C order); `owner` is kept alive while the view lives.
    #[staticmethod]
    #[pyo3(signature = (address, typestr, shape, strides, owner))]
    fn from_interface(
        address: usize,
        typestr: &str,
        shape: Vec<usize>,
        strides: Option<Vec<i64>>,
        owner: Py<PyAny>,
    ) -> View {
        let dtype = from_typestr(typestr);
        let item = dtype.map_or(1, |d| d.size_bytes() as i64);
        let strides: Option<Vec<i64>> = strides.map(|s| {
            s.iter()
                .map(|&b| if b % item == 0 { b / item } else { i64::MIN })
                .collect()
        });
        View {
            address,
            dtype,
            what: format!("NumPy type {typestr}"),
            contiguous: c_contiguous(&shape, strides.as_deref()),
            shape,
            _owner: owner,
            _managed: None,
        }
    }

    /// A view of a NumPy array's `__array_struct__` capsule (its C-level
    /// array interface: no dictionary to build, the fast path of a call);
    /// `owner` is kept alive while the view lives.
    #[staticmethod]
    fn from_array_struct(capsule: &Bound<'_, PyAny>, owner: Py<PyAny>) -> PyResult<View> {
        /// NumPy's `PyArrayInterface` (numpy/ndarraytypes.h).
        #[repr(C)]
        struct ArrayInterface {
            two: i32,
            nd: i32,
            typekind: u8,
            itemsize: i32,
            flags: i32,
            shape: *const isize,
            strides: *const isize,
            data: *mut c_void,
        }
        const C_CONTIGUOUS: i32 = 0x1;
        const NOT_SWAPPED: i32 = 0x200;
        // SAFETY: a capsule's pointer is read only after the capsule is
        // checked; NumPy's holds an `ArrayInterface` (checked by its `two`)
        // whose shape has `nd` entries, alive while `capsule` is.
        unsafe {
            let raw = capsule.as_ptr();
            let p = ffi::PyCapsule_GetPointer(raw, std::ptr::null())
                .cast::<ArrayInterface>()
                .cast_const();
            if p.is_null() || (*p).two != 2 {
                ffi::PyErr_Clear();
                return Err(PyTypeError::new_err("not a NumPy array interface capsule"));
            }
            let a = &*p;
            let nd = usize::try_from(a.nd).unwrap_or(0);
            let shape: Vec<usize> = if nd == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(a.shape, nd)
                    .iter()
                    .map(|&n| n.max(0) as usize)
                    .collect()
            };
            let kind = a.typekind as char;
            let typestr = format!(
                "{}{kind}{}",
                if a.flags & NOT_SWAPPED != 0 { '<' } else { '>' },
                a.itemsize
            );
            let dtype = from_typestr(&typestr);
            Ok(View {
                address: a.data as usize,
                dtype,
                what: format!("NumPy type {typestr}"),
                contiguous: a.flags & C_CONTIGUOUS != 0 || shape.iter().product::<usize>() <= 1,
                shape,
                _owner: owner,
                _managed: None,
            })
        }
    }

    /// A view of a tensor described by its parts, for callers that read
    /// them cheaply (a PyTorch tensor's `data_ptr()`, `is_contiguous()`):
    /// `dtype` is dlc's name of its element type.
    #[staticmethod]
    fn from_parts(
        address: usize,
        dtype: &str,
        shape: Vec<usize>,
        contiguous: bool,
        owner: Py<PyAny>,
    ) -> View {
        View {
            address,
            dtype: DType::ALL.into_iter().find(|d| d.name() == dtype),
            what: dtype.to_string(),
            shape,
            contiguous,
            _owner: owner,
            _managed: None,
        }
    }

    /// A view of a DLPack capsule (what `x.__dlpack__()` returns), which it
    /// consumes; `owner` is kept alive while the view lives.
    #[staticmethod]
    fn from_dlpack(capsule: &Bound<'_, PyAny>, owner: Py<PyAny>) -> PyResult<View> {
        let raw = capsule.as_ptr();
        // SAFETY: `raw` is a live object; a capsule of another name (or no
        // capsule) is refused before its pointer is read.
        let managed = unsafe {
            if ffi::PyCapsule_IsValid(raw, DLTENSOR.as_ptr()) != 1 {
                return Err(PyTypeError::new_err(
                    "__dlpack__() did not return an unconsumed `dltensor` capsule",
                ));
            }
            let p =
                ffi::PyCapsule_GetPointer(raw, DLTENSOR.as_ptr()).cast::<dlpack::ManagedTensor>();
            if p.is_null() || ffi::PyCapsule_SetName(raw, USED_DLTENSOR.as_ptr()) != 0 {
                return Err(PyErr::fetch(capsule.py()));
            }
            ManagedPtr(p)
        };
        // SAFETY: a valid `dltensor` capsule points to a managed tensor
        // whose shape (and strides, when not null) hold `ndim` entries;
        // it stays valid until its deleter runs (when `managed` drops).
        let t = unsafe { &(*managed.0).dl_tensor };
        let ndim = usize::try_from(t.ndim).unwrap_or(0);
        let (shape, strides) = unsafe {
            let shape: Vec<i64> = if ndim == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(t.shape, ndim).to_vec()
            };
            let strides = (!t.strides.is_null() && ndim > 0)
                .then(|| std::slice::from_raw_parts(t.strides, ndim).to_vec());
            (shape, strides)
        };
        if t.device.device_type != dlpack::CPU {
            return Err(PyTypeError::new_err(format!(
                "the tensor is on DLPack device {} ({}): dlc runs compiled code on the CPU; \
                 move it there first (`.cpu()`)",
                t.device.device_type, t.device.device_id
            )));
        }
        let shape: Vec<usize> = shape.iter().map(|&n| n.max(0) as usize).collect();
        let dtype = from_dl_dtype(&t.dtype);
        Ok(View {
            address: (t.data as usize).wrapping_add(t.byte_offset as usize),
            dtype,
            what: format!(
                "DLPack type code {} of {} bits x{}",
                t.dtype.code, t.dtype.bits, t.dtype.lanes
            ),
            contiguous: c_contiguous(&shape, strides.as_deref()),
            shape,
            _owner: owner,
            _managed: Some(managed),
        })
    }

    /// The address of the first element.
    #[getter]
    fn address(&self) -> usize {
        self.address
    }

    /// The element type's dlc name (`f32`), None when dlc has none.
    #[getter]
    fn dtype(&self) -> Option<&'static str> {
        self.dtype.map(DType::name)
    }

    /// The extents.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }
}

impl View {
    /// What the view holds, in the words of an error message.
    fn describe(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(ToString::to_string).collect();
        let ty = self
            .dtype
            .map_or(self.what.clone(), |d| d.name().to_string());
        format!("{ty}[{}]", dims.join(", "))
    }

    /// Checks the view against parameter `name` of type `ty` of `function`:
    /// its address, readable in place.
    fn check(&self, function: &str, name: &str, ty: &TensorType) -> PyResult<*mut u8> {
        let given = self.describe();
        let bad = |why: &str| {
            PyTypeError::new_err(format!(
                "`{function}`: input `{name}` must be a C-contiguous {ty} tensor on the CPU; \
                 got {given}{why}"
            ))
        };
        if self.dtype != Some(ty.dtype) || self.shape != ty.shape {
            return Err(bad(""));
        }
        if !self.contiguous {
            return Err(bad(
                " that is not C-contiguous (numpy.ascontiguousarray or \
                             .contiguous() makes a copy that is)",
            ));
        }
        let n = ty.num_elements().unwrap_or(0);
        if n > 0 && (self.address == 0 || !self.address.is_multiple_of(ty.dtype.size_bytes())) {
            return Err(bad(" whose address is not aligned to its element size"));
        }
        Ok(self.address as *mut u8)
    }
}

/// A result of a call: a buffer the compiled code wrote, owned here and
/// shared without copies through DLPack.
#[pyclass(module = "dlc._dlc", frozen)]
struct Tensor {
    ty: TensorType,
    buffer: Arc<OwnedBuffer>,
}

/// A buffer and the shape DLPack describes it with, alive while a Tensor
/// or a DLPack consumer holds it.
struct OwnedBuffer {
    bytes: AlignedBuffer,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

// SAFETY: the buffer is written once, by the call that made it, before it
// is shared; afterwards it is only read (or written by the one consumer
// that numpy or torch hands it to, as DLPack allows).
unsafe impl Send for OwnedBuffer {}
// SAFETY: as for `Send`.
unsafe impl Sync for OwnedBuffer {}

impl OwnedBuffer {
    fn address(&self) -> *mut u8 {
        self.bytes.bytes().as_ptr().cast_mut()
    }
}

/// What a DLPack consumer owns: the managed tensor `M` and a reference to
/// the buffer it points into.
#[repr(C)]
struct Export<M> {
    /// First, so that a pointer to it is a pointer to the export: the
    /// consumer reads it through the pointer the capsule holds.
    #[allow(dead_code)]
    managed: M,
    _buffer: Arc<OwnedBuffer>,
}

unsafe extern "C" fn delete_export(m: *mut dlpack::ManagedTensor) {
    if !m.is_null() {
        // SAFETY: `m` is the first field of an `Export` boxed by
        // `__dlpack__` (repr(C)), and DLPack calls the deleter once.
        drop(unsafe { Box::from_raw(m.cast::<Export<dlpack::ManagedTensor>>()) });
    }
}

unsafe extern "C" fn delete_export_versioned(m: *mut dlpack::ManagedTensorVersioned) {
    if !m.is_null() {
        // SAFETY: as for `delete_export`, for the versioned form.
        drop(unsafe { Box::from_raw(m.cast::<Export<dlpack::ManagedTensorVersioned>>()) });
    }
}

unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: a capsule still named `dltensor` (or `dltensor_versioned`)
    // was never consumed: its managed tensor is deleted here, as DLPack
    // asks of the producer.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr());
            delete_export(m.cast());
        } else if ffi::PyCapsule_IsValid(capsule, DLTENSOR_VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, DLTENSOR_VERSIONED.as_ptr());
            delete_export_versioned(m.cast());
        } else {
            ffi::PyErr_Clear();
        }
    }
}

/// A capsule named `name` owning `raw`, which `delete` frees if the
/// capsule cannot be made.
///
/// # Safety
/// `raw` is a boxed export of the kind `name` says, handed over.
unsafe fn export_capsule<'py>(
    py: Python<'py>,
    raw: *mut c_void,
    name: &'static CStr,
    delete: impl FnOnce(*mut c_void),
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the capsule owns `raw` until a consumer renames it; the
    // destructor frees it if none does.
    unsafe {
        let capsule = ffi::PyCapsule_New(raw, name.as_ptr(), Some(capsule_destructor));
        if capsule.is_null() {
            delete(raw);
        }
        Bound::from_owned_ptr_or_err(py, capsule)
    }
}

#[pymethods]
impl Tensor {
    /// The tensor as a DLPack capsule (NumPy, PyTorch and JAX take it
    /// without a copy): DLPack 1.0's (writable) when `max_version` allows
    /// it, else the unversioned one.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, dl_device);
        if copy == Some(true) {
            return Err(PyValueError::new_err(
                "a dlc tensor is shared, not copied: copy it in the consumer",
            ));
        }
        let b = &self.buffer;
        let dl_tensor = dlpack::Tensor {
            data: b.address().cast(),
            device: dlpack::Device {
                device_type: dlpack::CPU,
                device_id: 0,
            },
            ndim: b.shape.len() as i32,
            dtype: dl_dtype(self.ty.dtype),
            shape: b.shape.as_ptr().cast_mut(),
            strides: b.strides.as_ptr().cast_mut(),
            byte_offset: 0,
        };
        if max_version.is_some_and(|(major, _)| major >= 1) {
            let export = Box::new(Export {
                managed: dlpack::ManagedTensorVersioned {
                    version: [1, 0],
                    manager_ctx: std::ptr::null_mut(),
                    deleter: Some(delete_export_versioned),
                    flags: 0,
                    dl_tensor,
                },
                _buffer: Arc::clone(b),
            });
            let raw = Box::into_raw(export).cast::<c_void>();
            // SAFETY: `raw` is a boxed versioned export, handed over.
            return unsafe {
                export_capsule(py, raw, DLTENSOR_VERSIONED, |r| {
                    delete_export_versioned(r.cast())
                })
            };
        }
        let export = Box::new(Export {
            managed: dlpack::ManagedTensor {
                dl_tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_export),
            },
            _buffer: Arc::clone(b),
        });
        let raw = Box::into_raw(export).cast::<c_void>();
        // SAFETY: `raw` is a boxed unversioned export, handed over.
        unsafe { export_capsule(py, raw, DLTENSOR, |r| delete_export(r.cast())) }
    }

    /// Where the tensor is: the CPU (DLPack device 1, number 0).
    fn __dlpack_device__(&self) -> (i32, i32) {
        (dlpack::CPU, 0)
    }

    /// The element type's dlc name (`f32`).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.ty.dtype.name()
    }

    /// The extents.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.ty.shape)
    }

    /// The address of the first element (what a consumer's array points
    /// at).
    fn data_ptr(&self) -> usize {
        self.buffer.address() as usize
    }

    fn __repr__(&self) -> String {
        format!("dlc.Tensor({})", self.ty)
    }
}

impl Tensor {
    fn zeroed(ty: &TensorType) -> PyResult<Tensor> {
        let n = ty.num_elements().unwrap_or(usize::MAX);
        let bytes = n
            .checked_mul(ty.dtype.size_bytes())
            .ok_or_else(|| PyValueError::new_err(format!("{ty} is too large")))?;
        let shape: Vec<i64> = ty.shape.iter().map(|&d| d as i64).collect();
        let mut strides = vec![1i64; shape.len()];
        for k in (0..shape.len().saturating_sub(1)).rev() {
            strides[k] = strides[k + 1] * shape[k + 1];
        }
        Ok(Tensor {
            ty: ty.clone(),
            buffer: Arc::new(OwnedBuffer {
                bytes: AlignedBuffer::zeroed(bytes),
                shape,
                strides,
            }),
        })
    }
}

// ---------------------------------------------------------------- modules

/// A model's code in this process: its entry point, what keeps its code
/// alive, and (when compiled here) what it came from.
struct Compiled {
    /// Borrows `code`: declared first, dropped first.
    kernel: Kernel<'static>,
    code: Code,
    /// The graph module after the pipeline and its levels, for `ir` and
    /// `save` (`None` for a module loaded from a file).
    prepared: Option<Mutex<dlc_driver::Prepared>>,
    /// Which parameters of the entry point are weights.
    weights: BTreeSet<usize>,
    /// The entry point's name in the source.
    entry: String,
    /// The results' names where they are not the signature's (a
    /// gradient's: `out0`, `grad_w`).
    output_names: Vec<String>,
    /// What it was compiled from (`None` when loaded from a file).
    origin: Option<Origin>,
}

/// Where a module's machine code lives.
enum Code {
    /// Compiled in this process.
    Jit(dlc_llvm::Jit),
    /// A shared library `Module.save` wrote, loaded.
    Library {
        _library: dlc_runtime::SharedLibrary,
    },
}

/// A compiled entry point, callable; `bind` makes one with its weights
/// given once.
#[pyclass(module = "dlc._dlc", frozen)]
struct Function {
    compiled: Arc<Compiled>,
    /// Inputs given by `bind`, by their index among the caller's inputs,
    /// owned.
    bound: Vec<(usize, AlignedBuffer)>,
    /// The preparer's results, when it ran at `bind`.
    prepared: Option<Vec<AlignedBuffer>>,
}

/// What a model is read from.
enum Input {
    /// Source or IR text.
    Text(String),
    /// A file of source or IR text.
    Path(String),
    /// An ONNX model's bytes.
    Onnx(Vec<u8>),
}

/// Reads, checks and compiles a model for this CPU: one of `text` (dlc
/// source or graph IR), `path` (a file of either) or `onnx` (an ONNX
/// model's bytes), called `name` in diagnostics.
#[pyfunction]
#[pyo3(signature = (name, text = None, path = None, onnx = None, entry = None, passes = None, weights = None, cache = true))]
#[allow(clippy::too_many_arguments)] // Python's keywords
fn compile(
    py: Python<'_>,
    name: String,
    text: Option<String>,
    path: Option<String>,
    onnx: Option<Vec<u8>>,
    entry: Option<String>,
    passes: Option<String>,
    weights: Option<String>,
    cache: bool,
) -> PyResult<Function> {
    let input = match (text, path, onnx) {
        (Some(t), None, None) => Input::Text(t),
        (None, Some(p), None) => Input::Path(p),
        (None, None, Some(b)) => Input::Onnx(b),
        _ => {
            return Err(PyValueError::new_err(
                "give exactly one of text, path and onnx",
            ));
        }
    };
    let options = CompileOptions {
        passes: passes.unwrap_or_else(|| dlc_driver::DEFAULT_PIPELINE.into()),
        weights: weights.map(Into::into),
        ..CompileOptions::default()
    };
    let compiled = py
        .detach(move || {
            let (src, entry) = read_source(name, input, entry)?;
            let origin = Origin {
                src,
                entry,
                options,
                cache,
            };
            compile_entry(origin, None)
        })
        .map_err(|e| compile_error(py, e))?;
    Ok(Function {
        compiled: Arc::new(compiled),
        bound: Vec::new(),
        prepared: None,
    })
}

/// What a compiled module came from, to compile more from it (its
/// gradient).
#[derive(Clone)]
struct Origin {
    src: SourceText,
    /// The entry point compiled.
    entry: String,
    options: CompileOptions,
    cache: bool,
}

/// The source `input` holds, called `name` in diagnostics, and its entry
/// point: `entry`, an ONNX model's own, or the only one.
fn read_source(
    name: String,
    input: Input,
    entry: Option<String>,
) -> Result<(SourceText, String), DriverError> {
    let mut entry = entry;
    let src = match input {
        Input::Text(text) => SourceText { name, text },
        Input::Path(path) => dlc_driver::read_input(&path)?,
        Input::Onnx(bytes) => {
            let imported =
                dlc_onnx::import(&bytes, &dlc_onnx::Options::default()).map_err(|source| {
                    DriverError::Import {
                        path: name.clone(),
                        source,
                    }
                })?;
            entry.get_or_insert(imported.entry);
            SourceText {
                name,
                text: imported.source,
            }
        }
    };
    let entry = match entry {
        Some(e) => e,
        None => {
            // The front end alone, to name the one entry point.
            let module = dlc_driver::load(&src)?;
            let names: Vec<&str> = module.entry_points().map(|f| f.name.as_str()).collect();
            match names.as_slice() {
                [one] => one.to_string(),
                [] => return Err(DriverError::Usage(format!("{}: no entry point", src.name))),
                _ => {
                    return Err(DriverError::Usage(format!(
                        "{} has {} entry points; choose one with entry=: {}",
                        src.name,
                        names.len(),
                        names.join(", ")
                    )));
                }
            }
        }
    };
    Ok((src, entry))
}

/// Compiles `origin`'s entry point as its options say (their entries
/// aside); with `grad`, the function returning its value and its gradient
/// with respect to the parameters `grad` names (its `weight` parameters,
/// or every float one, when empty), as `dlc grad` does.
fn compile_entry(origin: Origin, grad: Option<Vec<String>>) -> Result<Compiled, DriverError> {
    let compiled = match &grad {
        Some(_) => format!("{}_grad", origin.entry),
        None => origin.entry.clone(),
    };
    let options = CompileOptions {
        entries: vec![compiled.clone()],
        prefix: Some(SAVED_PREFIX.into()),
        ..origin.options.clone()
    };
    let mut gradients = Vec::new();
    let prepared = dlc_driver::prepare_with(&origin.src, &options, |module| {
        if let Some(wrt) = &grad {
            gradients =
                dlc_graph::autodiff::add_grad_function(module, &origin.entry, wrt, &compiled)?;
        }
        Ok(())
    })?;
    let f = dlc_driver::select_entry(&prepared.module, Some(&compiled))?;
    let weights = f.weights.clone();
    // A gradient's results are called as `dlc grad` calls them.
    let values = f.results.len() - gradients.len();
    let output_names = match grad {
        Some(_) => (0..values)
            .map(|i| format!("out{i}"))
            .chain(gradients.iter().map(|&p| format!("grad_{}", f.params[p].0)))
            .collect(),
        None => Vec::new(),
    };
    let jit_options = dlc_llvm::JitOptions {
        cache: origin.cache.then(dlc_llvm::ObjectCache::for_user).flatten(),
    };
    let codegen = |e: dlc_llvm::CodegenError| DriverError::Codegen(e.to_string());
    let jit = dlc_llvm::compile_in_process(prepared.tiles()?, &jit_options).map_err(codegen)?;
    let kernel = jit.kernel(&compiled).map_err(codegen)?;
    // SAFETY: the kernel borrows the JIT's code, which `Compiled` owns
    // beside it and drops after it (field order).
    let kernel = unsafe { std::mem::transmute::<Kernel<'_>, Kernel<'static>>(kernel) };
    Ok(Compiled {
        kernel,
        code: Code::Jit(jit),
        prepared: Some(Mutex::new(prepared)),
        weights,
        entry: compiled,
        output_names,
        origin: Some(origin),
    })
}

/// A parameter as Python sees it: (name, dtype, shape, role), the role
/// `input`, `weight` or `output`.
type ParamInfo = (String, &'static str, Vec<usize>, &'static str);

impl Function {
    fn name(&self) -> &str {
        &self.compiled.entry
    }

    /// The inputs a caller passes, with their index among
    /// [`Kernel::given`]'s inputs: the function's, less the prepared and
    /// the bound ones.
    fn open_inputs(&self) -> Vec<(usize, &dlc_runtime::Param)> {
        self.compiled
            .kernel
            .given()
            .inputs()
            .enumerate()
            .filter(|(i, _)| !self.bound.iter().any(|(b, _)| b == i))
            .collect()
    }

    /// Pointers to the caller's inputs (every input of [`Kernel::given`]),
    /// from `args` in order and `named` by name, the bound ones from
    /// `bound`.
    fn input_pointers(
        &self,
        args: &[PyRef<'_, View>],
        named: &[(String, PyRef<'_, View>)],
    ) -> PyResult<Vec<*mut u8>> {
        let given: &Signature = self.compiled.kernel.given();
        let name = self.name();
        let open = self.open_inputs();
        if args.len() > open.len() {
            return Err(PyTypeError::new_err(format!(
                "`{name}` takes {} input(s), got {}",
                open.len(),
                args.len() + named.len()
            )));
        }
        let mut pointers: Vec<Option<*mut u8>> = vec![None; given.inputs().count()];
        for (&(i, p), v) in open.iter().zip(args) {
            pointers[i] = Some(v.check(name, &p.name, &p.ty)?);
        }
        for (key, v) in named {
            let Some(&(i, p)) = open.iter().find(|(_, p)| &p.name == key) else {
                let known: Vec<&str> = open.iter().map(|(_, p)| p.name.as_str()).collect();
                return Err(PyTypeError::new_err(format!(
                    "`{name}` has no input `{key}`; its inputs: {}",
                    known.join(", ")
                )));
            };
            if pointers[i].is_some() {
                return Err(PyTypeError::new_err(format!(
                    "`{name}`: input `{key}` given twice"
                )));
            }
            pointers[i] = Some(v.check(name, &p.name, &p.ty)?);
        }
        for (i, b) in &self.bound {
            pointers[*i] = Some(b.bytes().as_ptr().cast_mut());
        }
        let missing: Vec<String> = open
            .iter()
            .filter(|(i, _)| pointers[*i].is_none())
            .map(|(_, p)| format!("`{}` ({})", p.name, p.ty))
            .collect();
        if !missing.is_empty() {
            return Err(PyTypeError::new_err(format!(
                "`{name}` takes {} input(s); missing {}",
                open.len(),
                missing.join(", ")
            )));
        }
        Ok(pointers.into_iter().flatten().collect())
    }
}

/// Runs `kernel`'s preparer on the caller's inputs `given`: its results,
/// the kernel's last inputs.
fn run_preparer(
    prepare: &Kernel<'_>,
    binding: &dlc_runtime::PrepareBinding,
    given: &[*mut u8],
) -> Result<Vec<AlignedBuffer>, dlc_runtime::RuntimeError> {
    let mut results: Vec<AlignedBuffer> = prepare
        .signature()
        .outputs()
        .map(|p| {
            let n = p.ty.num_elements().unwrap_or(0) * p.ty.dtype.size_bytes();
            AlignedBuffer::zeroed(n)
        })
        .collect();
    let mut pointers: Vec<*mut u8> = binding.prepare_inputs.iter().map(|&i| given[i]).collect();
    pointers.extend(results.iter_mut().map(AlignedBuffer::as_mut_ptr));
    // SAFETY: the caller's inputs were checked against their parameters
    // (type, shape, C order, alignment) and are alive; the results are
    // fresh buffers of their types' sizes.
    unsafe { prepare.call_raw(&pointers)? };
    Ok(results)
}

/// A raw pointer that may cross into the GIL-free closure: the storage it
/// points to is kept alive by the caller's frame.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: see the type's doc.
unsafe impl Send for SendPtr {}

#[pymethods]
impl Function {
    /// Calls the entry point: inputs in order, then by name; returns its
    /// results as tensors. The inputs are read in place; the GIL is
    /// released while compiled code runs.
    #[pyo3(signature = (args, named))]
    fn call(
        &self,
        py: Python<'_>,
        args: Vec<PyRef<'_, View>>,
        named: Vec<(String, PyRef<'_, View>)>,
    ) -> PyResult<Vec<Tensor>> {
        let given = self.input_pointers(&args, &named)?;
        let kernel = &self.compiled.kernel;
        let outputs: Vec<Tensor> = kernel
            .signature()
            .outputs()
            .map(|p| Tensor::zeroed(&p.ty))
            .collect::<PyResult<_>>()?;
        let given: Vec<SendPtr> = given.into_iter().map(SendPtr).collect();
        let results: Vec<SendPtr> = outputs
            .iter()
            .map(|t| SendPtr(t.buffer.address()))
            .collect();
        let prepared = self.prepared.as_deref();
        py.detach(move || {
            let given: Vec<*mut u8> = given.iter().map(|p| p.0).collect();
            let mut pointers = given.clone();
            let fresh;
            match (kernel.preparer(), prepared) {
                (Some(_), Some(done)) => {
                    pointers.extend(done.iter().map(|b| b.bytes().as_ptr().cast_mut()));
                }
                (Some((prepare, binding)), None) => {
                    fresh = run_preparer(prepare, binding, &given)?;
                    pointers.extend(fresh.iter().map(|b| b.bytes().as_ptr().cast_mut()));
                }
                (None, _) => {}
            }
            pointers.extend(results.iter().map(|p| p.0));
            // SAFETY: every input was checked against its parameter and is
            // kept alive by this call's arguments (or by `self`); results
            // and prepared inputs are buffers of their types' sizes, owned
            // here, the results fresh and written by nothing else.
            unsafe { kernel.call_raw(&pointers) }
        })
        .map_err(runtime_error)?;
        Ok(outputs)
    }

    /// The entry point with inputs `named` given once, copied into buffers
    /// it owns; when they are every input its preparer reads, the preparer
    /// runs now, once.
    fn bind(&self, py: Python<'_>, named: Vec<(String, PyRef<'_, View>)>) -> PyResult<Function> {
        let name = self.name().to_string();
        let open = self.open_inputs();
        let mut bound = self.bound.clone();
        for (key, v) in &named {
            let Some(&(i, p)) = open.iter().find(|(_, p)| &p.name == key) else {
                let known: Vec<&str> = open.iter().map(|(_, p)| p.name.as_str()).collect();
                return Err(PyTypeError::new_err(format!(
                    "`{name}` has no input `{key}` left to bind; its inputs: {}",
                    known.join(", ")
                )));
            };
            let at = v.check(&name, &p.name, &p.ty)?;
            let n = p.ty.num_elements().unwrap_or(0) * p.ty.dtype.size_bytes();
            // SAFETY: `check` made `at` the address of `n` readable bytes,
            // kept alive by `v`.
            let bytes = unsafe { std::slice::from_raw_parts(at.cast_const(), n) };
            bound.push((i, AlignedBuffer::from_bytes(bytes)));
        }
        let mut f = Function {
            compiled: Arc::clone(&self.compiled),
            bound,
            prepared: None,
        };
        if let Some((prepare, binding)) = self.compiled.kernel.preparer() {
            let all_bound = binding
                .prepare_inputs
                .iter()
                .all(|i| f.bound.iter().any(|(b, _)| b == i));
            if all_bound {
                let mut given =
                    vec![std::ptr::null_mut(); self.compiled.kernel.given().inputs().count()];
                for (i, b) in &f.bound {
                    given[*i] = b.bytes().as_ptr().cast_mut();
                }
                let given: Vec<SendPtr> = given.into_iter().map(SendPtr).collect();
                let prepared = py
                    .detach(move || {
                        let given: Vec<*mut u8> = given.iter().map(|p| p.0).collect();
                        run_preparer(prepare, binding, &given)
                    })
                    .map_err(runtime_error)?;
                f.prepared = Some(prepared);
            }
        }
        Ok(f)
    }

    /// The entry point's value and its gradient with respect to the
    /// parameters `wrt` names (by default its `weight` parameters, or every
    /// float one when it declares none), compiled from the same source:
    /// results `out0`.. then `grad_NAME` in `wrt`'s order.
    #[pyo3(signature = (wrt = None))]
    fn grad(&self, py: Python<'_>, wrt: Option<Vec<String>>) -> PyResult<Function> {
        let Some(origin) = self.compiled.origin.clone() else {
            return Err(PyValueError::new_err(format!(
                "`{}` was loaded from a saved module, which keeps machine code only: its \
                 gradient needs the module compiled (dlc.compile)",
                self.name()
            )));
        };
        if self
            .compiled
            .output_names
            .iter()
            .any(|n| n.starts_with("grad_"))
        {
            return Err(PyValueError::new_err(format!(
                "`{}` is a gradient already; take the gradient of what its source computes",
                self.name()
            )));
        }
        let compiled = py
            .detach(move || compile_entry(origin, Some(wrt.unwrap_or_default())))
            .map_err(|e| compile_error(py, e))?;
        Ok(Function {
            compiled: Arc::new(compiled),
            bound: Vec::new(),
            prepared: None,
        })
    }

    /// The entry point's name.
    #[getter(name)]
    fn entry_name(&self) -> String {
        self.name().to_string()
    }

    /// Every parameter a call takes and returns: (name, dtype, shape,
    /// role), role `input`, `weight` or `output`; bound inputs left out.
    fn signature(&self) -> Vec<ParamInfo> {
        let open = self.open_inputs();
        let inputs = open.iter().map(|&(i, p)| {
            let role = if self.compiled.weights.contains(&i) {
                "weight"
            } else {
                "input"
            };
            (p.name.clone(), p.ty.dtype.name(), p.ty.shape.clone(), role)
        });
        let names = &self.compiled.output_names;
        let outputs = self
            .compiled
            .kernel
            .signature()
            .outputs()
            .enumerate()
            .map(|(i, p)| {
                let name = names.get(i).unwrap_or(&p.name).clone();
                (name, p.ty.dtype.name(), p.ty.shape.clone(), "output")
            });
        inputs.chain(outputs).collect()
    }

    /// The program at one level, as text: `graph` (after the passes),
    /// `loop`, `tile` (scheduled for this CPU) or `llvm` (optimized LLVM
    /// IR).
    fn ir(&self, py: Python<'_>, level: &str) -> PyResult<String> {
        let what = match level {
            "graph" => Artifact::Graph,
            "loop" => Artifact::Loop,
            "tile" => Artifact::Tile,
            "llvm" => Artifact::Native(NativeArtifact::LlvmIr),
            other => {
                return Err(PyValueError::new_err(format!(
                    "no level `{other}`: graph, loop, tile or llvm"
                )));
            }
        };
        let bytes = self.emit(py, what, "ir")?;
        String::from_utf8(bytes).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// How long code generation took, in seconds, and how many of the
    /// parts it was compiled in came from the object cache ((0, 0, 0) for
    /// a loaded module).
    fn compile_stats(&self) -> (f64, usize, usize) {
        match &self.compiled.code {
            Code::Jit(jit) => {
                let (parts, cached) = jit.parts();
                (jit.compile_time().as_secs_f64(), parts, cached)
            }
            Code::Library { .. } => (0.0, 0, 0),
        }
    }

    /// Writes the compiled entry point to the directory `path` (made, or
    /// replaced when it holds a saved module): `module-HASH.so`, the shared
    /// library (linked by the system's C compiler, as `dlc compile --emit
    /// so`), and `module.json`, what `load` needs besides. Written beside
    /// `path` first and renamed into place: never half a module.
    fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        if !self.bound.is_empty() {
            return Err(PyValueError::new_err(
                "a bound module keeps its weights in memory only: save the module before bind",
            ));
        }
        let library = self.emit(py, Artifact::Native(NativeArtifact::SharedLibrary), "save")?;
        let target = TargetDesc::host();
        let cpu = target.cpu();
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(&library);
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        let meta = Saved {
            entry: self.name().to_string(),
            library: format!("module-{hex}.so"),
            weights: self.compiled.weights.iter().copied().collect(),
            outputs: self.compiled.output_names.clone(),
            target: target.name.clone(),
            vector_bits: cpu.map_or(0, |c| c.vector_bits),
            avx512_bf16: cpu.is_some_and(|c| c.avx512_bf16),
        };
        write_saved(&path, &meta.library, &library, &meta.encode())
            .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("{}: {e}", path.display())))
    }
}

impl Function {
    /// The compiled module as `what` (`doing` names the method for a
    /// loaded module's error).
    fn emit(&self, py: Python<'_>, what: Artifact, doing: &str) -> PyResult<Vec<u8>> {
        if self.compiled.prepared.is_none() {
            return Err(PyValueError::new_err(format!(
                "`{}` was loaded from a saved module, which keeps machine code only: {doing} \
                 needs the module compiled (dlc.compile)",
                self.name()
            )));
        }
        let compiled = Arc::clone(&self.compiled);
        py.detach(move || {
            let prepared = compiled
                .prepared
                .as_ref()
                .ok_or_else(|| DriverError::Internal("no compiled module".into()))?
                .lock()
                .map_err(|_| DriverError::Internal("a compile thread panicked".into()))?;
            let backends = Backends {
                codegen: Some(&dlc_llvm::Llvm),
                mlir: None,
            };
            prepared.emit(what, backends)
        })
        .map_err(|e| compile_error(py, e))
    }
}

// ---------------------------------------------------------------- saved modules

/// The symbol prefix of the Python package's entry points (`dlc_NAME`).
const SAVED_PREFIX: &str = "dlc_";
/// What `module.json` starts with, and its version.
const SAVED_FORMAT: &str = "dlc-python-module";
const SAVED_VERSION: u64 = 1;

/// What a saved module records beside its library.
#[derive(Debug, PartialEq)]
struct Saved {
    entry: String,
    /// The library's file in the directory: named by its contents, since
    /// the dynamic loader takes a path it has loaded for the library
    /// already loaded (a module saved again in place would load the old
    /// code).
    library: String,
    /// The entry point's inputs declared `weight`, by index.
    weights: Vec<usize>,
    /// The results' names, where the library's signature does not have
    /// them (a gradient's).
    outputs: Vec<String>,
    /// The CPU target the code was compiled for, and what it needs.
    target: String,
    vector_bits: usize,
    avx512_bf16: bool,
}

impl Saved {
    fn encode(&self) -> String {
        serde_json::json!({
            "format": SAVED_FORMAT,
            "version": SAVED_VERSION,
            "entry": self.entry,
            "library": self.library,
            "weights": self.weights,
            "outputs": self.outputs,
            "target": self.target,
            "vector_bits": self.vector_bits,
            "avx512_bf16": self.avx512_bf16,
        })
        .to_string()
    }

    fn decode(text: &str) -> Result<Saved, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        if v["format"] != SAVED_FORMAT {
            return Err("not a saved dlc module".into());
        }
        if v["version"] != SAVED_VERSION {
            return Err(format!(
                "version {} of the format; this dlc reads version {SAVED_VERSION}",
                v["version"]
            ));
        }
        let field = |k: &str| v.get(k).ok_or_else(|| format!("no `{k}`"));
        let text = |k: &str| {
            field(k)?
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("`{k}` is not a string"))
        };
        let weights = field("weights")?
            .as_array()
            .and_then(|a| a.iter().map(|w| w.as_u64().map(|w| w as usize)).collect())
            .ok_or("`weights` is not a list of indices")?;
        let library = text("library")?;
        if library.contains('/') || !library.ends_with(".so") {
            return Err(format!("`library` {library:?} is not a file name"));
        }
        let outputs = field("outputs")?
            .as_array()
            .and_then(|a| a.iter().map(|o| o.as_str().map(str::to_string)).collect())
            .ok_or("`outputs` is not a list of names")?;
        Ok(Saved {
            entry: text("entry")?,
            library,
            outputs,
            weights,
            target: text("target")?,
            vector_bits: field("vector_bits")?
                .as_u64()
                .ok_or("`vector_bits` is not a number")? as usize,
            avx512_bf16: field("avx512_bf16")?
                .as_bool()
                .ok_or("`avx512_bf16` is not true or false")?,
        })
    }
}

/// Writes `library` and `meta` as the saved module `path`: into a fresh
/// directory beside it, renamed into place (replacing a saved module
/// there, and nothing else).
fn write_saved(
    path: &std::path::Path,
    file: &str,
    library: &[u8],
    meta: &str,
) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    if path.exists() && !path.join("module.json").is_file() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            "exists and is not a saved dlc module; not replaced",
        ));
    }
    let name = path
        .file_name()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "names no directory"))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let staging = parent.join(format!(
        ".{}.{}.partial",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&staging);
    let written = (|| {
        std::fs::create_dir(&staging)?;
        std::fs::write(staging.join(file), library)?;
        std::fs::write(staging.join("module.json"), meta)?;
        if path.exists() {
            std::fs::remove_dir_all(path)?;
        }
        std::fs::rename(&staging, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    written
}

/// Loads a module `Module.save` wrote: its library, with no compiler.
#[pyfunction]
fn load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Function> {
    let bad = |why: String| PyValueError::new_err(format!("{}: {why}", path.display()));
    let meta = std::fs::read_to_string(path.join("module.json")).map_err(|e| {
        pyo3::exceptions::PyOSError::new_err(format!(
            "{}: not a saved dlc module ({}: {e})",
            path.display(),
            path.join("module.json").display()
        ))
    })?;
    let saved = Saved::decode(&meta).map_err(|e| bad(format!("module.json: {e}")))?;
    let host = TargetDesc::host();
    let fits = host.cpu().is_some_and(|c| {
        c.vector_bits >= saved.vector_bits && (c.avx512_bf16 || !saved.avx512_bf16)
    });
    if !fits {
        return Err(bad(format!(
            "compiled for {} ({}-bit vectors{}); this machine is {}",
            saved.target,
            saved.vector_bits,
            if saved.avx512_bf16 {
                ", AVX-512 BF16"
            } else {
                ""
            },
            host.name
        )));
    }
    let library = path.join(&saved.library);
    let entry = saved.entry.clone();
    let (kernel, library) = py
        .detach(move || {
            let library = dlc_runtime::SharedLibrary::open(&library)?;
            let symbol = dlc_runtime::abi::Symbols::with_prefix(SAVED_PREFIX)
                .and_then(|s| s.symbol(&entry))
                .map_err(dlc_runtime::RuntimeError::Load)?;
            let kernel = library.kernel(&symbol)?;
            // SAFETY: the kernel borrows the library's code, which
            // `Compiled` owns beside it and drops after it.
            let kernel = unsafe { std::mem::transmute::<Kernel<'_>, Kernel<'static>>(kernel) };
            Ok((kernel, library))
        })
        .map_err(|e: dlc_runtime::RuntimeError| bad(e.to_string()))?;
    Ok(Function {
        compiled: Arc::new(Compiled {
            kernel,
            code: Code::Library { _library: library },
            prepared: None,
            weights: saved.weights.into_iter().collect(),
            entry: saved.entry,
            output_names: saved.outputs,
            origin: None,
        }),
        bound: Vec::new(),
        prepared: None,
    })
}

/// Sets how many threads compiled code runs on (the OpenMP runtime's
/// count; 0: one per core).
#[pyfunction]
fn set_num_threads(n: usize) -> PyResult<()> {
    dlc_runtime::set_num_threads(n).map_err(runtime_error)
}

/// The native module.
#[pymodule]
fn _dlc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CompileError", m.py().get_type::<CompileError>())?;
    m.add("RuntimeError", m.py().get_type::<RuntimeError>())?;
    m.add_class::<View>()?;
    m.add_class::<Tensor>()?;
    m.add_class::<Function>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add("DEFAULT_PIPELINE", dlc_driver::DEFAULT_PIPELINE)?;
    Ok(())
}
