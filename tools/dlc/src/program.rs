//! A model compiled for this CPU by `dlc run` and `dlc bench`: taken whole
//! from the program cache when it holds it (no front end, passes, lowering
//! or LLVM: its objects linked, its entry point's interface read back),
//! else compiled and stored there.
//!
//! The key is the source's name and text (an ONNX model's imported
//! program: the import still runs, the weights come from it), the entry
//! point, the passes and the target they priced for; `dlc_llvm::ProgramKey`
//! adds the compiler's build and the host.

use std::time::{Duration, Instant};

use dlc_core::TargetDesc;
use dlc_driver::{DriverError, Interface, PassOptions, SourceText};
use dlc_llvm::{Jit, JitOptions, ObjectCache, ProgramKey};
use dlc_runtime::HostTensor;

use crate::phases::Phases;

/// What [`compile_for_cpu`] compiles, and where it keeps it.
pub struct Compile<'a> {
    /// The entry point (`None`: the only one).
    pub entry: Option<&'a str>,
    /// The graph pipeline.
    pub passes: &'a str,
    /// The target the passes price for.
    pub priced: &'a TargetDesc,
    /// The object cache, holding programs and objects (`None`: compile
    /// everything, store nothing).
    pub cache: Option<&'a ObjectCache>,
}

/// A compiled entry point.
pub struct CpuProgram {
    /// Its code.
    pub jit: Jit,
    /// Its parameters.
    pub interface: Interface,
    /// The values of the weights the source carried (an imported model's
    /// initializers), by name.
    pub carried: Vec<(String, HostTensor)>,
    /// Whether the program came whole from the cache.
    pub cached: bool,
    /// The front end's and the lowering's time (the key's, from the
    /// cache); LLVM's is `jit.compile_time()`.
    pub front: Duration,
}

impl Compile<'_> {
    fn key(&self, src: &SourceText) -> Result<ProgramKey, DriverError> {
        let priced = format!("{:?}", self.priced);
        let fields: [&[u8]; 5] = [
            src.name.as_bytes(),
            src.text.as_bytes(),
            self.entry.unwrap_or("").as_bytes(),
            self.passes.as_bytes(),
            priced.as_bytes(),
        ];
        ProgramKey::new(&fields).map_err(codegen)
    }
}

fn codegen(e: dlc_llvm::CodegenError) -> DriverError {
    DriverError::Usage(e.to_string())
}

/// Compiles entry point `how.entry` of `src` for this CPU, or takes it
/// from the cache (see the module's documentation).
pub fn compile_for_cpu(
    src: SourceText,
    how: &Compile<'_>,
    phases: &Phases,
) -> Result<CpuProgram, DriverError> {
    let start = Instant::now();
    let key = how.cache.map(|_| how.key(&src)).transpose()?;
    if let (Some(cache), Some(key)) = (how.cache, &key) {
        let front = start.elapsed();
        // A program that cannot be linked again (nothing this build
        // stored) is compiled again, as a missing one is.
        if let Ok(Some((jit, meta))) = Jit::load(cache, key)
            && let Some(interface) = Interface::decode(&meta)
        {
            let carried = carried_weights(&src.name, src.weights, &interface)?;
            return Ok(CpuProgram {
                jit,
                interface,
                carried,
                cached: true,
                front,
            });
        }
    }
    phases.set("checking");
    // An imported model's weights are bound at the call, not compiled in.
    let (mut module, carried) = dlc_driver::compile_source_unbound(src)?;
    phases.set("optimizing");
    let options = PassOptions {
        target: Some(how.priced),
        ..PassOptions::default()
    };
    dlc_driver::run_passes(&mut module, how.passes, options)?;
    let module = dlc_driver::only_entry(&module, how.entry)?;
    let f = dlc_driver::select_entry(&module, None)?;
    let interface = Interface::of(f);
    phases.set("compiling");
    let lowered = dlc_driver::lower_for_cpu(&module)?;
    let front = start.elapsed();
    let options = JitOptions {
        cache: how.cache.cloned(),
    };
    let jit = dlc_llvm::compile_in_process(&lowered, &options).map_err(codegen)?;
    if let (Some(cache), Some(key)) = (how.cache, &key) {
        // A cache that cannot be written only makes the next run slower.
        let _ = jit.store(cache, key, &interface.encode());
    }
    Ok(CpuProgram {
        jit,
        interface,
        carried,
        cached: false,
        front,
    })
}

/// The weights `name` carried (`weights`, by name) as tensors of the types
/// `interface` declares; those of other entry points are left out.
fn carried_weights(
    name: &str,
    weights: Vec<(String, Vec<f64>)>,
    interface: &Interface,
) -> Result<Vec<(String, HostTensor)>, DriverError> {
    weights
        .into_iter()
        .filter_map(|(weight, values)| {
            let p = interface
                .params
                .iter()
                .find(|p| p.weight && p.name == weight)?;
            Some(
                HostTensor::new(p.ty.clone(), values)
                    .map(|t| (weight, t))
                    .map_err(|e| DriverError::Usage(format!("{name}: weight `{}`: {e}", p.name))),
            )
        })
        .collect()
}
