//! The x86-64 target: LLVM's target machine for this CPU and the function
//! attributes every function carries (the host CPU, its features, 512-bit
//! vectors).

use crate::{CodegenError, R};
use inkwell::OptimizationLevel;
use inkwell::targets::{CodeModel, InitializationConfig, RelocMode, Target, TargetMachine};

pub(crate) fn host_machine() -> R<TargetMachine> {
    Target::initialize_native(&InitializationConfig::default()).map_err(CodegenError::Llvm)?;
    let triple = TargetMachine::get_default_triple();
    let target = Target::from_triple(&triple).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let cpu = TargetMachine::get_host_cpu_name();
    let features = TargetMachine::get_host_cpu_features();
    target
        .create_target_machine(
            &triple,
            &cpu.to_string_lossy(),
            &features.to_string_lossy(),
            OptimizationLevel::Aggressive,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| CodegenError::Llvm("cannot create a target machine for the host".into()))
}

/// The attributes of every generated function: the host CPU, its features,
/// and a preference for 512-bit vectors.
pub(crate) fn function_attributes() -> Vec<(&'static str, String)> {
    let cpu = TargetMachine::get_host_cpu_name()
        .to_string_lossy()
        .into_owned();
    let features = TargetMachine::get_host_cpu_features()
        .to_string_lossy()
        .into_owned();
    vec![
        ("target-cpu", cpu),
        ("target-features", features),
        ("prefer-vector-width", "512".to_string()),
    ]
}
