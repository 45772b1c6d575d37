//! Tensors crossing into and out of compiled code without copies: views
//! of the caller's memory (NumPy's array interface, DLPack capsules, a
//! tensor's parts) checked against a parameter, and results handed out by
//! DLPack.

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use dlc_core::{DType, TensorType};
use dlc_runtime::AlignedBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

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
pub(crate) struct View {
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
    pub(crate) fn check(&self, function: &str, name: &str, ty: &TensorType) -> PyResult<*mut u8> {
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
pub(crate) struct Tensor {
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
    /// Where the compiled code writes it.
    pub(crate) fn address(&self) -> *mut u8 {
        self.buffer.address()
    }

    /// A fresh result of type `ty`.
    pub(crate) fn zeroed(ty: &TensorType) -> PyResult<Tensor> {
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
