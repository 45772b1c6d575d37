//! Upstream MLIR through melior, the only crate that links MLIR.
//!
//! [`convert_module`] writes loop IR in upstream dialects (`func`, `memref`,
//! `scf`, `arith`, `math`; see [`convert`] for how each op maps), has MLIR
//! parse it in process and checks it with MLIR's own verifier: what
//! `dlc compile --emit mlir` prints, which `mlir-opt` reads with no
//! unregistered dialect; [`convert_tile_module`] does the same for tile IR
//! scheduled for a CPU, tiles being tensors (see [`tile`]). [`run`] (and
//! [`run_tile`], after MLIR's bufferization) is a second back end: MLIR's own
//! conversion passes lower the module to the LLVM dialect
//! ([`LOWERING_PIPELINE`]), MLIR's execution engine translates it to LLVM IR
//! and compiles it in process, and the entry point runs on the inputs. It
//! exists to cross-check the native back end (both are tested against the
//! graph interpreter), not for speed: loops stay scalar and sequential.
#![deny(missing_docs)]
// The execution engine's call is an FFI boundary; see `run`.
#![allow(unsafe_code)]

pub mod convert;
mod scalar;
pub mod tile;

use std::cell::RefCell;
use std::rc::Rc;

use dlc_core::{DType, TensorType};
use dlc_loop::{Module, OpKind, Type};
use dlc_runtime::HostTensor;
use melior::ir::operation::OperationLike;
use melior::{Context, dialect::DialectRegistry, ir::Module as MlirModule, pass::PassManager};

/// Why a module could not be converted or run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MlirError {
    /// Valid loop IR this conversion does not handle (said why).
    #[error("the MLIR back end does not handle {0}")]
    Unsupported(String),
    /// The loop IR breaks an invariant its verifier checks.
    #[error("invalid loop IR: {0}")]
    Invalid(String),
    /// MLIR refused the module or a pass failed (its diagnostics).
    #[error("MLIR: {0}")]
    Mlir(String),
    /// Arguments do not match the function.
    #[error("{0}")]
    Arguments(String),
    /// The compiled function reported a failure.
    #[error("{0}")]
    Failed(String),
}

/// MLIR's passes from the upstream dialects to the LLVM dialect. Functions
/// keep MLIR's memref calling convention; the ones run carry
/// `llvm.emit_c_interface`, whose wrapper takes each memref as a pointer to
/// its descriptor.
pub const LOWERING_PIPELINE: &str = "builtin.module(convert-scf-to-cf,convert-math-to-libm,\
     convert-math-to-llvm,expand-strided-metadata,finalize-memref-to-llvm,convert-arith-to-llvm,\
     convert-index-to-llvm,convert-cf-to-llvm,\
     convert-func-to-llvm,reconcile-unrealized-casts)";

/// [`LOWERING_PIPELINE`] after MLIR's one-shot bufferization (tiles are
/// tensors in the tile level's conversion), its deallocation of the
/// buffers it creates, and `linalg` (what `tensor.generate` bufferizes to)
/// as loops.
pub const TILE_PIPELINE: &str = "builtin.module(one-shot-bufferize{allow-return-allocs-from-loops},buffer-deallocation-pipeline,\
     convert-linalg-to-loops,convert-scf-to-cf,convert-math-to-libm,\
     convert-math-to-llvm,expand-strided-metadata,finalize-memref-to-llvm,convert-arith-to-llvm,\
     convert-index-to-llvm,convert-cf-to-llvm,\
     convert-func-to-llvm,reconcile-unrealized-casts)";

/// A context with every upstream dialect and translation to LLVM IR, and
/// the diagnostics MLIR reports in it.
struct Session {
    context: Context,
    diagnostics: Rc<RefCell<Vec<String>>>,
}

impl Session {
    fn new() -> Session {
        let registry = DialectRegistry::new();
        melior::utility::register_all_dialects(&registry);
        let context = Context::new();
        context.append_dialect_registry(&registry);
        context.load_all_available_dialects();
        melior::utility::register_all_llvm_translations(&context);
        melior::utility::register_all_passes();
        let diagnostics = Rc::new(RefCell::new(Vec::new()));
        let sink = Rc::clone(&diagnostics);
        context.attach_diagnostic_handler(move |d| {
            sink.borrow_mut().push(format!("{}: {d}", d.location()));
            true
        });
        Session {
            context,
            diagnostics,
        }
    }

    /// `what` failed, with what MLIR said.
    fn error(&self, what: &str) -> MlirError {
        let said = self.diagnostics.borrow_mut().drain(..).collect::<Vec<_>>();
        if said.is_empty() {
            MlirError::Mlir(what.into())
        } else {
            MlirError::Mlir(format!("{what}: {}", said.join("; ")))
        }
    }

    /// Parses and verifies the upstream-dialect text of `m`.
    fn parse<'c>(&'c self, m: &Module, prefix: &str) -> Result<MlirModule<'c>, MlirError> {
        self.parse_text(&convert::module_text(m, prefix, !prefix.is_empty())?)
    }

    /// Parses and verifies upstream-dialect text.
    fn parse_text<'c>(&'c self, text: &str) -> Result<MlirModule<'c>, MlirError> {
        let module = MlirModule::parse(&self.context, text)
            .ok_or_else(|| self.error("the converted module does not parse"))?;
        if !module.as_operation().verify() {
            return Err(self.error("the converted module does not verify"));
        }
        Ok(module)
    }
}

/// `m` in upstream MLIR dialects, parsed and verified by MLIR, as MLIR
/// prints it.
pub fn convert_module(m: &Module) -> Result<String, MlirError> {
    let session = Session::new();
    let module = session.parse(m, "")?;
    Ok(format!("{}\n", module.as_operation()))
}

/// `m` lowered to MLIR's LLVM dialect by [`LOWERING_PIPELINE`].
pub fn lower_to_llvm_dialect(m: &Module) -> Result<String, MlirError> {
    let session = Session::new();
    let mut module = session.parse(m, "")?;
    lower(&session, &mut module, LOWERING_PIPELINE)?;
    Ok(format!("{}\n", module.as_operation()))
}

fn lower(session: &Session, module: &mut MlirModule<'_>, pipeline: &str) -> Result<(), MlirError> {
    let pm = PassManager::new(&session.context);
    melior::utility::parse_pass_pipeline(pm.as_operation_pass_manager(), pipeline)
        .map_err(|e| MlirError::Mlir(format!("the lowering pipeline: {e}")))?;
    pm.run(module)
        .map_err(|_| session.error("lowering to the LLVM dialect failed"))
}

/// Tile IR scheduled for a CPU in upstream MLIR dialects (tiles as
/// tensors; see [`tile`]), parsed and verified by MLIR.
pub fn convert_tile_module(m: &dlc_tile::Module) -> Result<String, MlirError> {
    let session = Session::new();
    let module = session.parse_text(&tile::module_text(m, "", false)?)?;
    Ok(format!("{}\n", module.as_operation()))
}

/// Runs function `entry` of tile IR scheduled for a CPU through MLIR
/// (bufferized, lowered, compiled by the execution engine), as [`run`] does
/// for loop IR. The code is compiled by LLVM at O0: a recurrence's
/// unrolled steps make large modules (W7's GRU is 28 000 lines of MLIR,
/// which O2 takes 100 s over), and this path checks results, not speed.
pub fn run_tile(
    m: &dlc_tile::Module,
    entry: &str,
    inputs: &[HostTensor],
) -> Result<Vec<HostTensor>, MlirError> {
    let f = find(&m.functions, entry, |f| &f.name)?;
    let params = entry_params(&f.params, |v| match f.ty(v) {
        dlc_tile::Type::Buffer(b) => Some(&b.layout),
        _ => None,
    });
    let text = tile::module_text(m, RUN_PREFIX, true)?;
    let n_inputs = f.params.len() - f.outputs.min(f.params.len());
    run_text(&text, TILE_PIPELINE, 0, entry, &params, n_inputs, inputs)
}

/// The first function with an integer division, whose division by zero
/// the native back end and [`run`] report as a failure, and the module
/// [`convert_module`] writes leaves undefined (as `arith.floordivsi` does).
pub fn has_integer_division(m: &Module) -> Option<&str> {
    m.functions
        .iter()
        .find(|f| {
            f.ops.iter().any(|op| {
                matches!(op.kind, OpKind::Binary(dlc_core::scalar::BinaryOp::Div))
                    && matches!(f.ty(op.operands[0]), Type::Scalar(d) if d.is_int())
            })
        })
        .map(|f| f.name.as_str())
}

/// Prefix of the functions [`run`] compiles: their symbols meet the
/// process's (libm's `tanhf`, `malloc`) in the execution engine.
const RUN_PREFIX: &str = "dlc_mlir_";

/// Runs function `entry` of `m` on `inputs` through MLIR's lowering and
/// execution engine; returns its results, or an error for an integer
/// division by zero (the division's source place is not reported here).
pub fn run(m: &Module, entry: &str, inputs: &[HostTensor]) -> Result<Vec<HostTensor>, MlirError> {
    let f = find(&m.functions, entry, |f| &f.name)?;
    let params = entry_params(&f.params, |v| match f.ty(v) {
        Type::Buffer(l) => Some(l),
        _ => None,
    });
    let text = convert::module_text(m, RUN_PREFIX, true)?;
    run_text(
        &text,
        LOWERING_PIPELINE,
        2,
        entry,
        &params,
        f.inputs().len(),
        inputs,
    )
}

/// compiler-rt's conversions between f32 and the 16-bit floats that LLVM
/// calls where the CPU has no instruction for them (f32 -> bf16 on every
/// CPU without AVX-512 BF16, also for a bf16 value carried through a `phi`,
/// which LLVM widens to f32 and narrows again; f16 both ways below
/// x86-64-v3's F16C; bf16 -> f32 is always a shift) and that nothing in this
/// process provides (Debian's libgcc has no `__truncsfbf2`). They are handed
/// to the execution engine, so MLIR's code runs on every CPU.
/// A 16-bit float travels in the low 16 bits of the first vector register,
/// as the low bits of an f32 (x86-64 and AArch64 C ABIs).
const CONVERSION_ROUTINES: [(&str, extern "C" fn(f32) -> f32); 3] = [
    ("__truncsfbf2", truncsfbf2),
    ("__truncsfhf2", truncsfhf2),
    ("__extendhfsf2", extendhfsf2),
];

/// f32 -> bf16, rounded to nearest even (NaN stays NaN).
extern "C" fn truncsfbf2(x: f32) -> f32 {
    f32::from_bits(u32::from(half::bf16::from_f32(x).to_bits()))
}

/// f32 -> f16, rounded to nearest even.
extern "C" fn truncsfhf2(x: f32) -> f32 {
    f32::from_bits(u32::from(half::f16::from_f32(x).to_bits()))
}

/// f16 (the low 16 bits) -> f32, exactly.
extern "C" fn extendhfsf2(x: f32) -> f32 {
    half::f16::from_bits(x.to_bits() as u16).to_f32()
}

/// Function `entry` of `functions`.
fn find<'m, F>(
    functions: &'m [F],
    entry: &str,
    name: impl Fn(&F) -> &String,
) -> Result<&'m F, MlirError> {
    functions
        .iter()
        .find(|f| name(f) == entry)
        .ok_or_else(|| MlirError::Arguments(format!("no function `@{entry}`")))
}

/// Each parameter's name and buffer layout (`None`: not a buffer).
fn entry_params<'f, V: Copy>(
    params: &'f [(String, V)],
    layout: impl Fn(V) -> Option<&'f dlc_core::Layout>,
) -> Vec<(&'f str, Option<&'f dlc_core::Layout>)> {
    params
        .iter()
        .map(|(name, v)| (name.as_str(), layout(*v)))
        .collect()
}

/// Runs function `entry` of the module `text` (functions prefixed
/// [`RUN_PREFIX`], with a status parameter) after lowering it with
/// `pipeline`; `params` are the entry point's parameters (name and buffer
/// layout), the first `n_inputs` of them inputs.
fn run_text(
    text: &str,
    pipeline: &str,
    opt_level: usize,
    entry: &str,
    params: &[(&str, Option<&dlc_core::Layout>)],
    n_inputs: usize,
    inputs: &[HostTensor],
) -> Result<Vec<HostTensor>, MlirError> {
    let types: Vec<TensorType> = params
        .iter()
        .map(|&(name, l)| match l {
            Some(l) if l.is_contiguous() => Ok(TensorType::new(l.dtype, l.shape.clone())),
            _ => Err(MlirError::Unsupported(format!(
                "parameter %{name} of @{entry} (only row-major buffers are passed)"
            ))),
        })
        .collect::<Result<_, _>>()?;
    if inputs.len() != n_inputs {
        return Err(MlirError::Arguments(format!(
            "@{entry} takes {n_inputs} inputs, got {}",
            inputs.len()
        )));
    }
    for ((name, _), (t, want)) in params.iter().zip(inputs.iter().zip(&types)) {
        if &t.ty != want {
            return Err(MlirError::Arguments(format!(
                "input `{name}` of @{entry} is {want}, got {}",
                t.ty
            )));
        }
    }
    let session = Session::new();
    let mut module = session.parse_text(text)?;
    lower(&session, &mut module, pipeline)?;
    let engine = melior::ExecutionEngine::new(&module, opt_level, &[], false, false);
    for (name, routine) in CONVERSION_ROUTINES {
        // SAFETY: each routine is an `extern "C"` function of this process,
        // alive as long as the engine, with the C type LLVM calls it by
        // (see `CONVERSION_ROUTINES`).
        unsafe { engine.register_symbol(name, routine as *mut ()) };
    }
    // The packed wrapper of the entry point's C interface: one `void *` per
    // parameter, each pointing to the parameter's value, a pointer to a
    // memref descriptor.
    let wrapper = engine.lookup(&format!("_mlir__mlir_ciface_{RUN_PREFIX}{entry}"));
    if wrapper.is_null() {
        return Err(MlirError::Mlir(format!(
            "the execution engine has no function `@{entry}` (the module did not compile)"
        )));
    }
    // Every parameter in an aligned buffer of its element type (bool one
    // byte), inputs filled, results zeroed; the status last.
    let mut buffers: Vec<dlc_runtime::AlignedBuffer> = types
        .iter()
        .enumerate()
        .map(|(i, t)| match inputs.get(i) {
            Some(x) => dlc_runtime::AlignedBuffer::from_bytes(&x.to_le_bytes()),
            None => dlc_runtime::AlignedBuffer::zeroed(
                t.num_elements().unwrap_or(0) * t.dtype.size_bytes(),
            ),
        })
        .collect();
    buffers.push(dlc_runtime::AlignedBuffer::zeroed(4));
    let shapes: Vec<&[usize]> = types
        .iter()
        .map(|t| t.shape.as_slice())
        .chain([&[][..]])
        .collect();
    // Descriptors: allocated and aligned pointer, offset, sizes, strides
    // (row-major), each 64 bits.
    let mut descriptors: Vec<Vec<u64>> = buffers
        .iter_mut()
        .zip(&shapes)
        .map(|(b, shape)| {
            let p = b.as_mut_ptr() as u64;
            let mut d = vec![p, p, 0];
            d.extend(shape.iter().map(|&n| n as u64));
            let mut stride = 1u64;
            let mut strides = vec![0u64; shape.len()];
            for (s, &n) in strides.iter_mut().zip(shape.iter()).rev() {
                *s = stride;
                stride *= n as u64;
            }
            d.extend(strides);
            d
        })
        .collect();
    let mut pointers: Vec<*mut u64> = descriptors.iter_mut().map(|d| d.as_mut_ptr()).collect();
    let mut packed: Vec<*mut ()> = pointers
        .iter_mut()
        .map(|p| std::ptr::from_mut(p).cast())
        .collect();
    // SAFETY: `wrapper` is the packed wrapper of `@_mlir_ciface_dlc_mlir_ENTRY`,
    // a function `void(void **)` that reads one pointer per parameter from
    // `packed`; each points to a pointer to the memref descriptor of a live
    // buffer of that parameter's element type and shape (inputs checked
    // above), which the function reads (inputs) or writes (results and the
    // status) and does not keep. The engine, which owns the code, outlives
    // the call.
    unsafe {
        let call: unsafe extern "C" fn(*mut *mut ()) = std::mem::transmute(wrapper);
        call(packed.as_mut_ptr());
    }
    drop(packed);
    drop(pointers);
    drop(engine);
    let status = buffers.last().map_or(0, |b| {
        i32::from_le_bytes([b.bytes()[0], b.bytes()[1], b.bytes()[2], b.bytes()[3]])
    });
    if status != 0 {
        return Err(MlirError::Failed(format!(
            "@{entry}: integer division by zero"
        )));
    }
    types[n_inputs..]
        .iter()
        .zip(&buffers[n_inputs..])
        .map(|(t, b)| {
            HostTensor::from_le_bytes(t.clone(), &b.bytes()[..byte_len(t)])
                .map_err(|e| MlirError::Arguments(e.to_string()))
        })
        .collect()
}

fn byte_len(t: &TensorType) -> usize {
    t.num_elements().unwrap_or(0) * DType::size_bytes(t.dtype)
}

/// The MLIR back end as the driver's [`dlc_driver::MlirConverter`]: what
/// `dlc compile --emit mlir` calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mlir;

impl dlc_driver::MlirConverter for Mlir {
    fn convert(&self, module: &Module) -> Result<String, String> {
        convert_module(module).map_err(|e| e.to_string())
    }

    fn convert_tile(&self, module: &dlc_tile::Module) -> Result<String, String> {
        convert_tile_module(module).map_err(|e| e.to_string())
    }
}
