//! Reads the loop dialect's text form: the IR core's generic parser
//! ([`dlc_core::ir::parse`]) with the loop dialect's types and ops. Errors
//! carry line and column; the verifier then checks what was read.

use dlc_core::attr::Attr;
use dlc_core::ir::parse::ParseDialect;
use dlc_core::lex::{Cursor, PResult, ParseError, bracketed};

use crate::ir::{BufferType, IndexExpr, Loop, Module, OpKind, Type};

pub use dlc_core::ir::parse::MAX_NESTING;

/// Parses a whole module.
pub fn parse_module(text: &str) -> Result<Module, ParseError> {
    dlc_core::ir::parse::parse_module::<Loop>(text)
}

impl ParseDialect for Loop {
    const AXES: bool = false;

    fn parse_type(c: &mut Cursor) -> PResult<Type> {
        if c.eat_ident("index") {
            return Ok(Type::Index);
        }
        if c.eat_ident("buffer") {
            return Ok(Type::Buffer(buffer_rest(c)?));
        }
        Ok(Type::Scalar(c.dtype()?))
    }

    fn parse_param(c: &mut Cursor) -> PResult<BufferType> {
        if !c.eat_ident("buffer") {
            return c.expected("a buffer type `buffer<f32[...]>`");
        }
        buffer_rest(c)
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

/// `<f32[4, 8]>`, `<f32[4, 8], strides = [1, 4]>`, `<f32[4], offset = 8>`
/// (strides before the offset), after `buffer`.
fn buffer_rest(c: &mut Cursor) -> PResult<BufferType> {
    c.expect("<")?;
    let dtype = c.dtype()?;
    let shape = bracketed(c, |c| c.usize())?;
    let mut ty = BufferType::contiguous(dtype, shape);
    let mut offset = false;
    while c.eat(",") {
        if !offset && c.eat_ident("strides") {
            c.expect("=")?;
            let strides = bracketed(c, |c| c.usize())?;
            if strides.len() != ty.shape.len() {
                return c.error("one stride per dimension");
            }
            ty.strides = strides;
        } else if !offset && c.eat_ident("offset") {
            c.expect("=")?;
            ty.offset = c.usize()?;
            offset = true;
        } else {
            return c.expected(if offset {
                "`>`"
            } else {
                "`strides` or `offset`"
            });
        }
    }
    c.expect(">")?;
    Ok(ty)
}
