//! `dlc._dlc`: the native half of the `dlc` Python package (python/dlc
//! holds the other half).
//!
//! `pip install ./python` builds `dlc-python` (a workspace member, `crate-type = cdylib`,
//! no Rust tests: python/tests is its suite) with maturin into the package `dlc`:
//! `python/dlc/__init__.py` (the API: `compile`, `Module`, `Param`), the native module
//! `dlc._dlc` (python/src/: `lib.rs` compiling and calling, `tensors.rs` views and results,
//! `saved.rs` saved modules) and its stubs (`_dlc.pyi`). LLVM is linked statically,
//! as in `dlc`. Invariants:
//! - **One compiler.** `dlc._dlc.compile` is `dlc_driver::prepare_with` (front end or ONNX
//!   import, `weights=` built in as constants, the pipeline, one entry point) and
//!   `dlc_llvm::compile_in_process`, which returns a `Jit` that owns its code and every
//!   function's signature, so a `Module` outlives the call that compiled it; the object
//!   cache is the user's, shared with `dlc run`. `Module.grad` compiles again from the
//!   kept source with `add_grad_function` applied before the passes, as `dlc grad` does.
//! - **Inputs are not copied.** A `View` is an address, element type and shape read from
//!   a NumPy array's `__array_struct__` (the C-level interface: no dictionary per call),
//!   a consumed DLPack capsule (its deleter runs when the view goes) or a tensor's parts
//!   (`from_parts`: the torch backend, whose views of parameters are reused while their
//!   memory stays put); buffer-protocol objects go through `numpy.asarray`, which shares their
//!   memory (abi3 before 3.11 has no buffer API). A call checks each view against its
//!   parameter (type, shape, C order, element alignment: the code's loads assume no more)
//!   and hands the address to `Kernel::call_raw`; a mismatch is a `TypeError` naming the
//!   parameter. Only `Module.bind` copies, once: bound weights are owned by the bound
//!   function, and its preparer runs then when every input it reads is bound.
//! - **Results are owned, then shared.** Each call allocates fresh 64-byte-aligned results
//!   (`Tensor`); `__dlpack__` exports them with a reference to the buffer (DLPack 1.0's
//!   capsule, which says they are writable, where the consumer asks for a version), so
//!   NumPy, PyTorch or JAX keep it alive without a copy.
//! - **The GIL is released** while compiled code and preparers run (`Python::detach`);
//!   the JIT is `Send + Sync` because generated code takes its cached workspace by an
//!   atomic exchange (a concurrent call allocates its own).
//! - **Errors are exceptions**: `DriverError` -> `dlc.CompileError` (the rendered text;
//!   `file`/`line`/`column` from `SourceError::place`, the IR and UTF-8 errors' places),
//!   failure statuses -> `dlc.RuntimeError` (the op's source place), arguments ->
//!   `TypeError`.
#![allow(unsafe_code)] // DLPack is a C ABI: raw tensors in and out.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use dlc_driver::{Artifact, Backends, CompileOptions, DriverError, NativeArtifact, SourceText};
use dlc_runtime::{AlignedBuffer, Kernel, Signature};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

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

mod saved;
mod tensors;

use saved::SAVED_PREFIX;
use tensors::{Tensor, View};

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
    /// What it was compiled from (`None` when loaded from a file or
    /// imported from ONNX, whose program text holds the weights).
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
    let imported = match &input {
        Input::Onnx(_) => true,
        Input::Path(p) => dlc_driver::is_onnx(p),
        Input::Text(_) => false,
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
            let mut compiled = compile_entry(origin, None)?;
            if imported {
                // An imported model's program comes with its weights (as
                // f64, twice the model's size): not kept for the module's
                // life.
                compiled.origin = None;
            }
            Ok(compiled)
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
    let src =
        match input {
            Input::Text(text) => SourceText {
                name,
                text,
                weights: Vec::new(),
            },
            // An ONNX file is imported from its path, where its external data
            // is found.
            Input::Path(path) if dlc_driver::is_onnx(&path) => {
                let imported = dlc_driver::import_onnx(&path, &dlc_onnx::Options::default())?;
                entry.get_or_insert(imported.entry.clone());
                dlc_driver::imported_source(&path, imported)
            }
            Input::Path(path) => dlc_driver::read_input(&path)?,
            Input::Onnx(bytes) => {
                let imported = dlc_onnx::import_owned(bytes, &dlc_onnx::Options::default())
                    .map_err(|source| DriverError::Import {
                        path: name.clone(),
                        source,
                    })?;
                entry.get_or_insert(imported.entry.clone());
                dlc_driver::imported_source(&name, imported)
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
        profile: false,
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

    /// The open input called `key` (of `open`), or a `TypeError` listing
    /// them; `what` says what the name was for.
    fn find_open<'s>(
        &self,
        open: &[(usize, &'s dlc_runtime::Param)],
        key: &str,
        what: &str,
    ) -> PyResult<(usize, &'s dlc_runtime::Param)> {
        open.iter()
            .find(|(_, p)| p.name == key)
            .copied()
            .ok_or_else(|| {
                let known: Vec<&str> = open.iter().map(|(_, p)| p.name.as_str()).collect();
                PyTypeError::new_err(format!(
                    "`{}` has no input `{key}`{what}; its inputs: {}",
                    self.name(),
                    known.join(", ")
                ))
            })
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
            let (i, p) = self.find_open(&open, key, "")?;
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
    // SAFETY: the caller's inputs were checked against their parameters
    // (type, shape, C order, alignment) and are alive during the call.
    unsafe { dlc_runtime::call::prepare_raw(prepare, binding, given) }
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
        let results: Vec<SendPtr> = outputs.iter().map(|t| SendPtr(t.address())).collect();
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
            let (i, p) = self.find_open(&open, key, " left to bind")?;
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
            let why = match self.compiled.code {
                Code::Library { .. } => {
                    "was loaded from a saved module, which keeps machine code only: its \
                     gradient needs the module compiled (dlc.compile)"
                }
                Code::Jit(_) => {
                    "is an imported ONNX model, whose program is not kept: compile the \
                     program `dlc import` writes and take its gradient"
                }
            };
            return Err(PyValueError::new_err(format!("`{}` {why}", self.name())));
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
        saved::save(self, &library, &path)
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
    m.add_function(wrap_pyfunction!(saved::load, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add("DEFAULT_PIPELINE", dlc_driver::DEFAULT_PIPELINE)?;
    Ok(())
}
