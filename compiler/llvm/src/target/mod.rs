//! Targets: what is specific to one machine kind (its LLVM target machine,
//! function attributes), chosen by the CPU description's triple: x86-64
//! (the host's, by default) and AArch64 Linux; NVPTX (`nvptx`) for
//! NVIDIA GPUs.

use dlc_core::TargetDesc;
use inkwell::OptimizationLevel;
use inkwell::targets::TargetMachine;

use crate::{CodegenError, R};

pub(crate) mod aarch64;
pub(crate) mod nvptx;
pub(crate) mod x86_64;

pub(crate) use x86_64::initialize_native;

/// The AArch64 triple and CPU of `target`, if it is an AArch64 CPU.
fn arm(target: &TargetDesc) -> Option<(&str, &str)> {
    let cpu = target.cpu()?;
    let triple = cpu.triple.as_deref()?;
    triple
        .starts_with("aarch64")
        .then(|| (triple, cpu.llvm_cpu.as_deref().unwrap_or("generic")))
}

/// The LLVM target machine `target` compiles for.
pub(crate) fn machine(target: &TargetDesc) -> R<TargetMachine> {
    machine_at(target, OptimizationLevel::Aggressive)
}

/// [`machine`] generating machine code at optimization level `level`.
pub(crate) fn machine_at(target: &TargetDesc, level: OptimizationLevel) -> R<TargetMachine> {
    match (arm(target), target.cpu().and_then(|c| c.triple.as_deref())) {
        (Some((triple, cpu)), _) => aarch64::machine(triple, cpu, level),
        (None, None) => x86_64::machine(target, level),
        (None, Some(other)) => Err(CodegenError::Unsupported(format!(
            "no code generation for the triple `{other}` (x86-64 and AArch64 Linux are built)"
        ))),
    }
}

/// The attributes every function compiled for `target` carries.
pub(crate) fn function_attributes(target: &TargetDesc) -> Vec<(&'static str, String)> {
    match arm(target) {
        Some((_, cpu)) => aarch64::function_attributes(cpu),
        None => x86_64::function_attributes(target),
    }
}
