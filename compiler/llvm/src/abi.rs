//! The C ABI of generated code: each function's runtime signature and the
//! `SYM.entry(void **)` wrapper.

use crate::{CodegenError, R};
use dlc_runtime::abi::{Signature, Symbols};
use inkwell::AddressSpace;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::values::{BasicMetadataValueEnum, FunctionValue};

/// The runtime signature of a tile function: its parameters, inputs then
/// results, each a contiguous tensor.
pub fn signature(f: &dlc_tile::Function) -> R<Signature> {
    dlc_driver::signature(f).map_err(CodegenError::Arguments)
}

/// Function `name`'s signature, named by its exported symbol: what a C
/// header declares.
pub fn exported_signature<P: crate::Program + ?Sized>(
    m: &P,
    name: &str,
    symbols: &Symbols,
) -> R<Signature> {
    let mut sig = m.signature_of(name)?;
    sig.name = symbols.symbol(name).map_err(CodegenError::Symbol)?;
    if let Some(p) = &sig.prepare {
        sig.prepare = Some(symbols.symbol(p).map_err(CodegenError::Symbol)?);
    }
    Ok(sig)
}

pub(crate) fn entry_wrapper<'ctx>(
    ctx: &'ctx Context,
    module: &Module<'ctx>,
    params: usize,
    func: FunctionValue<'ctx>,
    symbol: &str,
) -> R<()> {
    let ptr = ctx.ptr_type(AddressSpace::default());
    // The wrapper returns what the function returns: a status, or nothing
    // (a GPU kernel run by the emulator).
    let ty = match func.get_type().get_return_type() {
        Some(t) => inkwell::types::BasicType::fn_type(&t, &[ptr.into()], false),
        None => ctx.void_type().fn_type(&[ptr.into()], false),
    };
    let wrapper = module.add_function(&format!("{symbol}.entry"), ty, Some(Linkage::External));
    let b = ctx.create_builder();
    b.position_at_end(ctx.append_basic_block(wrapper, "entry"));
    let array = wrapper
        .get_first_param()
        .map(|p| p.into_pointer_value())
        .ok_or_else(|| CodegenError::Invalid("wrapper without parameter".into()))?;
    let mut args: Vec<BasicMetadataValueEnum<'_>> = Vec::new();
    for i in 0..params {
        // SAFETY (LLVM IR semantics): index i is within the array the caller passes.
        let slot = unsafe {
            b.build_in_bounds_gep(
                ptr,
                array,
                &[ctx.i64_type().const_int(i as u64, false)],
                "slot",
            )?
        };
        args.push(b.build_load(ptr, slot, "buffer")?.into());
    }
    let call = b.build_call(func, &args, "status")?;
    match call.try_as_basic_value().basic() {
        Some(status) => b.build_return(Some(&status))?,
        None => b.build_return(None)?,
    };
    Ok(())
}
