//! LLVM's ORC JIT (`LLJIT`, through its C API): object files linked in
//! this process, their symbols looked up. Symbols the objects do not
//! define (libm, the OpenMP runtime, the C library) are the process's.

use std::ffi::{CStr, CString};
use std::ptr::null_mut;

use crate::{CodegenError, R};
use llvm_sys::core::LLVMCreateMemoryBufferWithMemoryRangeCopy;
use llvm_sys::error::{
    LLVMConsumeError, LLVMDisposeErrorMessage, LLVMErrorRef, LLVMGetErrorMessage,
};
use llvm_sys::orc2::lljit::{
    LLVMOrcCreateLLJIT, LLVMOrcDisposeLLJIT, LLVMOrcLLJITAddObjectFile,
    LLVMOrcLLJITGetGlobalPrefix, LLVMOrcLLJITGetMainJITDylib, LLVMOrcLLJITLookup, LLVMOrcLLJITRef,
};
use llvm_sys::orc2::{
    LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess, LLVMOrcJITDylibAddGenerator,
};

/// An in-process linker: the code of the objects added lives as long as
/// it does.
pub(crate) struct Linker {
    jit: LLVMOrcLLJITRef,
}

/// `Ok` for no error, else the error's message (the error is consumed).
fn check(err: LLVMErrorRef, what: &str) -> R<()> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: `err` is an error LLVM handed over; getting its message
    // consumes it, and the message is disposed of once copied.
    let message = unsafe {
        let m = LLVMGetErrorMessage(err);
        let text = CStr::from_ptr(m).to_string_lossy().into_owned();
        LLVMDisposeErrorMessage(m);
        text
    };
    Err(CodegenError::Llvm(format!("{what}: {message}")))
}

impl Linker {
    /// A JIT for this process's target (the native target must be
    /// initialized) that resolves undefined symbols in the process.
    pub(crate) fn new() -> R<Linker> {
        let mut jit = null_mut();
        // SAFETY: a null builder asks for the default one; `jit` is set on
        // success.
        check(
            unsafe { LLVMOrcCreateLLJIT(&mut jit, null_mut()) },
            "cannot create the JIT",
        )?;
        let linker = Linker { jit };
        let mut generator = null_mut();
        // SAFETY: `jit` is live; the generator is handed to its main
        // library, which owns it from then on.
        unsafe {
            let prefix = LLVMOrcLLJITGetGlobalPrefix(jit);
            check(
                LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                    &mut generator,
                    prefix,
                    None,
                    null_mut(),
                ),
                "cannot search the process for symbols",
            )?;
            LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit), generator);
        }
        Ok(linker)
    }

    /// Adds a relocatable object file (linked when one of its symbols is
    /// first looked up).
    pub(crate) fn add_object(&self, name: &str, bytes: &[u8]) -> R<()> {
        let cname = CString::new(name)
            .map_err(|_| CodegenError::Llvm(format!("object name `{name}` has a NUL")))?;
        // SAFETY: the buffer is a copy of `bytes`; the JIT takes ownership
        // of it.
        unsafe {
            let buffer = LLVMCreateMemoryBufferWithMemoryRangeCopy(
                bytes.as_ptr().cast(),
                bytes.len(),
                cname.as_ptr(),
            );
            check(
                LLVMOrcLLJITAddObjectFile(self.jit, LLVMOrcLLJITGetMainJITDylib(self.jit), buffer),
                &format!("cannot add object `{name}`"),
            )
        }
    }

    /// The address of `symbol`, linking what it needs first.
    pub(crate) fn address(&self, symbol: &str) -> R<usize> {
        let c = CString::new(symbol)
            .map_err(|_| CodegenError::Llvm(format!("symbol `{symbol}` has a NUL")))?;
        let mut address = 0;
        // SAFETY: `jit` is live; `address` is set on success.
        check(
            unsafe { LLVMOrcLLJITLookup(self.jit, &mut address, c.as_ptr()) },
            &format!("cannot find `{symbol}`"),
        )?;
        usize::try_from(address)
            .map_err(|_| CodegenError::Llvm(format!("`{symbol}` is out of the address space")))
    }
}

impl Drop for Linker {
    fn drop(&mut self) {
        // SAFETY: `jit` was created by `new` and is disposed of once; an
        // error on the way out has nowhere to go and is consumed.
        unsafe {
            let err = LLVMOrcDisposeLLJIT(self.jit);
            if !err.is_null() {
                LLVMConsumeError(err);
            }
        }
    }
}
