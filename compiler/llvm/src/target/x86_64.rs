//! The x86-64 target: LLVM's target machine for a CPU description and the
//! function attributes every function carries (the CPU, its features, the
//! vector width to prefer).

use crate::{CodegenError, R};
use dlc_core::TargetDesc;
use inkwell::OptimizationLevel;
use inkwell::targets::{CodeModel, InitializationConfig, RelocMode, Target, TargetMachine};

/// The LLVM CPU name and features `target` compiles for: this machine's
/// (as LLVM detects them) for the host description, else the named CPU
/// (an x86-64 level) with the features LLVM knows it by.
fn cpu_and_features(target: &TargetDesc) -> (String, String) {
    match target.cpu().and_then(|c| c.llvm_cpu.clone()) {
        Some(cpu) => (cpu, String::new()),
        None => (
            TargetMachine::get_host_cpu_name()
                .to_string_lossy()
                .into_owned(),
            TargetMachine::get_host_cpu_features()
                .to_string_lossy()
                .into_owned(),
        ),
    }
}

/// Registers the host's target with LLVM, once per process (registration
/// is not safe to race with threads compiling).
pub(crate) fn initialize_native() -> R<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| Target::initialize_native(&InitializationConfig::default()))
        .clone()
        .map_err(CodegenError::Llvm)
}

/// A target machine for x86-64 Linux and `target`'s CPU, generating
/// machine code at `level`.
pub(crate) fn machine(target: &TargetDesc, level: OptimizationLevel) -> R<TargetMachine> {
    initialize_native()?;
    let triple = TargetMachine::get_default_triple();
    let llvm_target =
        Target::from_triple(&triple).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let (cpu, features) = cpu_and_features(target);
    llvm_target
        .create_target_machine(
            &triple,
            &cpu,
            &features,
            level,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| CodegenError::Llvm(format!("cannot create a target machine for `{cpu}`")))
}

/// The attributes of every generated function: the CPU, its features, and
/// a preference for the CPU's full vector width.
pub(crate) fn function_attributes(target: &TargetDesc) -> Vec<(&'static str, String)> {
    let (cpu, features) = cpu_and_features(target);
    let width = target.cpu().map_or(512, |c| c.vector_bits);
    let mut attrs = vec![
        ("target-cpu", cpu),
        ("prefer-vector-width", width.to_string()),
    ];
    if !features.is_empty() {
        attrs.push(("target-features", features));
    }
    attrs
}
