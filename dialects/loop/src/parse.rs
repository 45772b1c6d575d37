//! Reads the loop dialect's text form: the IR core's generic parser
//! ([`dlc_core::ir::parse`]) with the loop dialect's types and ops. Errors
//! carry line and column; the verifier then checks what was read.

use dlc_core::attr::Attr;
use dlc_core::ir::parse::ParseDialect;
use dlc_core::lex::{Cursor, PResult, ParseError};

use crate::ir::{BufferType, IndexExpr, Loop, Module, OpKind, Type};

pub use dlc_core::ir::parse::MAX_NESTING;

/// Parses a whole module.
pub fn parse_module(text: &str) -> Result<Module, ParseError> {
    dlc_core::ir::parse::parse_module::<Loop>(text)
}

impl ParseDialect for Loop {
    const AXES: bool = false;

    fn parse_buffer(c: &mut Cursor) -> PResult<BufferType> {
        dlc_core::ir::parse::parse_layout(c, "", |_| false)
    }

    fn parse_value_type(c: &mut Cursor) -> PResult<Type> {
        Ok(Type::Scalar(c.dtype()?))
    }

    fn probe(name: &str) -> Option<OpKind> {
        crate::ops::probe(name)
    }

    fn from_parts(
        name: &str,
        attrs: &[(String, Attr)],
        indices: Vec<Vec<IndexExpr>>,
    ) -> Result<OpKind, String> {
        OpKind::from_parts(name, attrs, indices)
    }

    fn region_args(op: &OpKind, operands: &[&Type]) -> Vec<Type> {
        op.region_args(operands)
    }
}
