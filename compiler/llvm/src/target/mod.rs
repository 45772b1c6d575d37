//! Targets: what is specific to one machine kind (its LLVM target machine,
//! function attributes). x86-64 is the only one so far; NVPTX sits beside
//! it.

pub(crate) mod x86_64;
