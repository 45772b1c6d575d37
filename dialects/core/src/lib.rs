//! What every dlc dialect shares: element and tensor types, the helpers that
//! make each dialect's text form round-trip, verifier errors, and the pass
//! infrastructure (the [`Pass`] trait, a registry of named passes, pipelines
//! written `a,b{key=value},c`, and a manager that verifies after every pass).
#![deny(missing_docs)]

pub mod attr;
pub mod ir;
mod layout;
pub mod lex;
pub mod loc;
mod pass;
pub mod scalar;
pub mod target;
mod text;
mod types;
pub mod window;
pub mod work;

pub use layout::Layout;
pub use loc::{LineIndex, SourceLoc};
pub use pass::{
    Pass, PassAdapter, PassError, PassManager, PassOptions, PassRegistry, PassReport, Pipeline,
    PipelineEntry, Verify,
};
pub use target::TargetDesc;
pub use text::{Namer, affine_text, format_float, parse_float};
pub use types::{DType, TensorType};
pub use window::Window;

/// A problem the verifier found: where it is (an op's text name such as `%3`,
/// or a function `@mlp`) and why it is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError {
    /// Where the problem is, in the text form's names.
    pub location: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}
