//! Reads the tile dialect's text form: the IR core's generic parser
//! ([`dlc_core::ir::parse`]) with the tile dialect's types and ops. Errors
//! carry line and column; the verifier then checks what was read.

use dlc_core::DType;
use dlc_core::ir::parse::ParseDialect;
use dlc_core::lex::{Cursor, PResult, ParseError, Tok};

use crate::ir::{Affine, BufferType, Layout, Module, Space, Tile, TileType, Type};
use crate::ops::{Attr, OpKind};

pub use dlc_core::ir::parse::MAX_NESTING;

/// Parses a whole module.
pub fn parse_module(text: &str) -> Result<Module, ParseError> {
    dlc_core::ir::parse::parse_module::<Tile>(text)
}

impl ParseDialect for Tile {
    const AXES: bool = true;

    /// `<f32[4, 8]>`, `<f32[4, 8], strides = [1, 4]>`, `<f32[4], offset =
    /// 8>`, `<f32[4], shared>`.
    fn parse_buffer(c: &mut Cursor) -> PResult<BufferType> {
        let mut space = Space::Global;
        let layout = dlc_core::ir::parse::parse_layout(
            c,
            " or a memory space (`scratch`, `shared`)",
            |c| {
                Space::ALL
                    .into_iter()
                    .find(|s| c.eat_ident(s.name()))
                    .map(|s| space = s)
                    .is_some()
            },
        )?;
        Ok(BufferType { layout, space })
    }

    fn parse_value_type(c: &mut Cursor) -> PResult<Type> {
        if c.eat_ident("tile") {
            return Ok(Type::Tile(tile_rest(c)?));
        }
        Ok(Type::Scalar(c.dtype()?))
    }

    fn probe(name: &str) -> Option<OpKind> {
        probe_kind(name)
    }

    fn from_parts(
        name: &str,
        attrs: &[(String, Attr)],
        indices: Vec<Vec<Affine>>,
    ) -> Result<OpKind, String> {
        OpKind::from_parts(name, attrs, indices.into_iter().next())
    }

    /// A loop's counter, then its carried values, typed as its initial
    /// values; a kernel's body has no arguments.
    fn region_args(op: &OpKind, operands: &[&Type]) -> Vec<Type> {
        match op {
            OpKind::For { .. } => std::iter::once(Type::Index)
                .chain(operands.iter().map(|t| (*t).clone()))
                .collect(),
            _ => vec![],
        }
    }
}

/// `<64x32xf32>` after `tile`: the lexer reads `64` and then the name
/// `x32xf32`.
fn tile_rest(c: &mut Cursor) -> PResult<TileType> {
    c.expect("<")?;
    let mut shape = Vec::new();
    match c.bump() {
        Tok::Int(i) if i > 0 => shape.push(i as usize),
        _ => {
            c.pos -= 1;
            return c.expected("a tile shape `64x32xf32`");
        }
    }
    let rest = match c.bump() {
        Tok::Ident(s) if s.starts_with('x') => s,
        _ => {
            c.pos -= 1;
            return c.expected("`x` and the next extent or the element type");
        }
    };
    let mut parts: Vec<&str> = rest[1..].split('x').collect();
    let dtype = parts.pop().unwrap_or_default();
    for p in parts {
        match p.parse::<usize>() {
            Ok(d) if d > 0 => shape.push(d),
            _ => {
                c.pos -= 1;
                return c.error(format!("`{p}` is not a positive tile extent"));
            }
        }
    }
    let dtype: DType = match dtype.parse() {
        Ok(d) => d,
        Err(_) => {
            c.pos -= 1;
            return c.error(format!("`{dtype}` is not an element type"));
        }
    };
    let len = shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d));
    if len.is_none_or(|n| n > crate::ir::MAX_TILE_ELEMENTS) {
        return c.error(format!(
            "a tile has at most {} elements",
            crate::ir::MAX_TILE_ELEMENTS
        ));
    }
    let layout = if c.eat(",") {
        c.expect("#")?;
        match c.bump() {
            Tok::Ident(s) if s == "mma" => {
                if !c.eat("<") {
                    return c.expected("the grid of warps after `#mma` (`#mma<2, 4>`)");
                }
                let mut n = [0usize; 2];
                for (i, x) in n.iter_mut().enumerate() {
                    if i == 1 {
                        c.expect(",")?;
                    }
                    *x = match c.bump() {
                        Tok::Int(v) if (1..=32).contains(&v) => v as usize,
                        _ => {
                            c.pos -= 1;
                            return c.expected("the warps down and across, 1 to 32 (`#mma<2, 4>`)");
                        }
                    };
                }
                c.expect(">")?;
                Layout::Mma(crate::ir::MmaGrid {
                    rows: n[0],
                    cols: n[1],
                })
            }
            Tok::Ident(s) if s == "blocked" => {
                c.expect("<")?;
                let v = match c.bump() {
                    Tok::Int(v) if (1..=64).contains(&v) => v as usize,
                    _ => {
                        c.pos -= 1;
                        return c.expected("the elements of a run, 1 to 64 (`#blocked<8>`)");
                    }
                };
                c.expect(">")?;
                Layout::Blocked(v)
            }
            _ => {
                c.pos -= 1;
                return c.expected("a layout (`#mma<2, 4>`, `#blocked<8>`)");
            }
        }
    } else {
        Layout::Flat
    };
    c.expect(">")?;
    Ok(TileType::new(dtype, shape).with_layout(layout))
}

/// A kind with the given name and placeholder attributes, whose syntax is
/// the real kind's (syntax never depends on attribute values).
fn probe_kind(name: &str) -> Option<OpKind> {
    let suffix = name.strip_prefix("tile.")?;
    let placeholder = match suffix {
        "load" => OpKind::Load {
            index: vec![],
            pad: None,
        },
        "store" => OpKind::Store { index: vec![] },
        "prefetch" => OpKind::Prefetch {
            index: vec![],
            shape: vec![],
            level: 1,
        },
        "mask" => OpKind::Mask { limits: vec![] },
        "slice" => OpKind::Slice { offsets: vec![] },
        "kernel" => OpKind::Kernel {
            grid: vec![],
            schedule: crate::ir::Schedule::Serial { vector: 1 },
        },
        "for" => OpKind::For {
            lo: 0,
            hi: 0,
            step: 1,
        },
        _ => {
            let attrs: Vec<(String, Attr)> = match suffix {
                "program_id" | "expand_dims" => vec![("axis".into(), Attr::Int(0))],
                "const" => vec![("value".into(), Attr::Float(0.0))],
                "global" => vec![("value".into(), Attr::Ints(vec![]))],
                "prepared" => vec![
                    ("func".into(), Attr::Str(String::new())),
                    ("index".into(), Attr::Int(0)),
                ],
                "trans" => vec![("perm".into(), Attr::Ints(vec![]))],
                "reduce" => vec![
                    ("kind".into(), Attr::Word("sum".into())),
                    ("axis".into(), Attr::Int(0)),
                ],
                _ => vec![],
            };
            return OpKind::from_parts(name, &attrs, None).ok();
        }
    };
    Some(placeholder)
}
