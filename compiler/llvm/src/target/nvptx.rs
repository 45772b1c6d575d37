//! The NVPTX target: LLVM's `nvptx64-nvidia-cuda` target machine for a GPU
//! description's compute capability (`sm_80`, `sm_90`), which writes PTX.

use crate::{CodegenError, R};
use dlc_core::TargetDesc;
use inkwell::OptimizationLevel;
use inkwell::targets::{
    CodeModel, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};

/// A target machine writing PTX for `target`'s GPU.
pub(crate) fn machine(target: &TargetDesc) -> R<TargetMachine> {
    let gpu = target.gpu().ok_or_else(|| {
        CodegenError::Unsupported(format!(
            "`{}` is not a GPU target (PTX is made for sm_80 and sm_90)",
            target.name
        ))
    })?;
    Target::initialize_nvptx(&InitializationConfig::default());
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    let llvm_target =
        Target::from_triple(&triple).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let (major, minor) = gpu.compute_capability;
    let cpu = format!("sm_{major}{minor}");
    llvm_target
        .create_target_machine(
            &triple,
            &cpu,
            "",
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| {
            CodegenError::Llvm(format!("cannot create an NVPTX target machine for `{cpu}`"))
        })
}
