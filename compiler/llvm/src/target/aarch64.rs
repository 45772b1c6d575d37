//! The AArch64 target (Linux): LLVM's target machine for a 64-bit Arm CPU
//! with Advanced SIMD, and the attributes its functions carry. Code for it
//! is cross-compiled (objects, libraries); the JIT runs host code only.

use crate::{CodegenError, R};
use inkwell::OptimizationLevel;
use inkwell::targets::{
    CodeModel, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};

/// Every Armv8-A core has Advanced SIMD.
const FEATURES: &str = "+neon";

/// A target machine for `triple` and LLVM CPU `cpu`, generating machine
/// code at `level`.
pub(crate) fn machine(triple: &str, cpu: &str, level: OptimizationLevel) -> R<TargetMachine> {
    Target::initialize_aarch64(&InitializationConfig::default());
    let triple = TargetTriple::create(triple);
    let target = Target::from_triple(&triple).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    target
        .create_target_machine(
            &triple,
            cpu,
            FEATURES,
            level,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| CodegenError::Llvm(format!("cannot create a target machine for `{cpu}`")))
}

/// The attributes of every generated function: the CPU and its features.
pub(crate) fn function_attributes(cpu: &str) -> Vec<(&'static str, String)> {
    vec![
        ("target-cpu", cpu.to_string()),
        ("target-features", FEATURES.to_string()),
    ]
}
