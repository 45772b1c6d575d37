//! Safe Rust bindings of compiled entry points: the Rust a program
//! `include!`s to call a model it links as a static library.
//!
//! Each entry point `f(x: f32[2, 3], n: i32[]) -> f32[2, 4]` becomes
//! `pub fn f(x: ArrayView<'_, f32, Ix2>, n: i32) -> Result<Array<f32, Ix2>,
//! Error>`: tensors are `ndarray` arrays (the array type Rust's numeric
//! crates share, with the rank in the type and the shape checked at the
//! call, any memory layout accepted), scalars are plain values, several
//! results are a tuple, and a failure status of the compiled code is an
//! [`Error`](#) value naming the failing op's source place. The bindings
//! need the `ndarray` crate, and `half` for f16/bf16 tensors.
//!
//! # In detail
//!
//! **Rust bindings** (`dlc_driver::bindings`, `dlc compile --emit rust`). One safe
//! function per entry point: tensors in as `ndarray::ArrayView<'_, T, IxN>` (rank in the
//! type, shape checked at the call, any memory layout accepted: a transposed view is
//! copied into row-major order, a row-major one is passed as is), scalars as plain
//! values, results as owned `ndarray::Array`s (a tuple for several). ndarray because it is
//! the array type Rust's numeric crates (and onnxruntime's Rust bindings) share, and
//! because its views carry the shape a flat slice would lose. Every call returns
//! `Result<_, Error>`: `Error::Shape` names the input and both shapes, and a failure
//! status becomes `Error::DivisionByZero { at: Some("model.dl:3:12") }` (the site is read
//! from the library's `SYM.signature` string) or `Error::OutOfMemory`. Bool results go
//! through a byte buffer (compiled code writes 0/1; Rust never sees an unchecked
//! `bool`); f16/bf16 use the `half` crate. The declarations are `unsafe extern "C"` in a
//! private module; every `unsafe` block is the FFI boundary and says why it holds.

use std::fmt::Write as _;

use dlc_core::DType;
use dlc_runtime::abi::{Param, Signature};

/// Rust's keywords, strict and reserved (2024 edition).
const KEYWORDS: [&str; 52] = [
    "as", "break", "const", "continue", "crate", "else", "enum", "extern", "false", "fn", "for",
    "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return",
    "self", "Self", "static", "struct", "super", "trait", "true", "type", "unsafe", "use", "where",
    "while", "async", "await", "dyn", "abstract", "become", "box", "do", "final", "macro",
    "override", "priv", "typeof", "unsized", "virtual", "yield", "try", "gen",
];

/// A dlc name as a Rust identifier: itself, `r#name` for a keyword, and
/// `name_` for the keywords raw identifiers cannot spell.
fn ident(name: &str) -> String {
    match name {
        "self" | "Self" | "super" | "crate" | "_" => format!("{name}_"),
        _ if KEYWORDS.contains(&name) => format!("r#{name}"),
        _ => name.to_string(),
    }
}

/// The Rust element type of a dtype.
fn element(d: DType) -> &'static str {
    match d {
        DType::F16 => "::half::f16",
        DType::BF16 => "::half::bf16",
        other => other.name(),
    }
}

/// The element type the C function takes: `u8` for `bool` (one byte, and
/// results read back as `!= 0`, so no byte is taken for a `bool` unchecked).
fn c_element(d: DType) -> &'static str {
    match d {
        DType::Bool => "u8",
        other => element(other),
    }
}

fn dim(rank: usize) -> String {
    if rank <= 6 {
        format!("::ndarray::Ix{rank}")
    } else {
        "::ndarray::IxDyn".into()
    }
}

fn shape(p: &Param) -> String {
    let dims: Vec<String> = p.ty.shape.iter().map(ToString::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// An array's shape as `into_shape`/`default` take it.
fn shape_arg(p: &Param) -> String {
    if p.ty.shape.len() <= 6 {
        shape(p)
    } else {
        format!("::ndarray::IxDyn(&{})", shape(p))
    }
}

/// The Rust type of a parameter: its element for a scalar, else an
/// `ndarray` view (inputs) or owned array (results).
fn rust_type(p: &Param) -> String {
    if p.ty.shape.is_empty() {
        return element(p.ty.dtype).into();
    }
    let array = if p.output { "Array<" } else { "ArrayView<'_, " };
    format!(
        "::ndarray::{array}{}, {}>",
        element(p.ty.dtype),
        dim(p.ty.shape.len())
    )
}

/// The shared part: the error type and the helpers every entry point uses.
const PRELUDE: &str = r#"/// Why a call of a compiled entry point failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// An input's shape is not the one the entry point was compiled for.
    Shape {
        /// The entry point.
        entry: &'static str,
        /// The input.
        input: &'static str,
        /// Its shape in the model.
        expected: &'static [usize],
        /// The shape it was given.
        found: Vec<usize>,
    },
    /// An integer division by zero, at the op's source place when known.
    DivisionByZero {
        /// The entry point.
        entry: &'static str,
        /// `file:line:column` of the division.
        at: Option<String>,
    },
    /// The compiled code could not allocate its workspace.
    OutOfMemory {
        /// The entry point.
        entry: &'static str,
    },
    /// A status these bindings do not know.
    Status {
        /// The entry point.
        entry: &'static str,
        /// The status the compiled code returned.
        status: i32,
    },
}

impl ::core::fmt::Display for Error {
    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
        match self {
            Error::Shape { entry, input, expected, found } => write!(
                f,
                "{entry}: input `{input}` has shape {found:?}, the model takes {expected:?}"
            ),
            Error::DivisionByZero { entry, at: Some(at) } => {
                write!(f, "{entry}: integer division by zero at {at}")
            }
            Error::DivisionByZero { entry, at: None } => {
                write!(f, "{entry}: integer division by zero")
            }
            Error::OutOfMemory { entry } => {
                write!(f, "{entry}: out of memory allocating the workspace")
            }
            Error::Status { entry, status } => {
                write!(f, "{entry}: compiled code failed with status {status}")
            }
        }
    }
}

impl ::std::error::Error for Error {}

// The calls into the library are the FFI boundary: each `unsafe` says why
// it holds.
#[allow(unsafe_code)]
mod __dlc {
    use super::Error;

    /// The input if its shape is `expected`, in row-major order (copied
    /// only when it is not already).
    pub fn input<'a, T: Clone, D: ::ndarray::Dimension>(
        entry: &'static str,
        input: &'static str,
        a: ::ndarray::ArrayView<'a, T, D>,
        expected: &'static [usize],
    ) -> Result<::ndarray::CowArray<'a, T, D>, Error> {
        if a.shape() != expected {
            return Err(Error::Shape { entry, input, expected, found: a.shape().to_vec() });
        }
        Ok(if a.is_standard_layout() {
            a.into()
        } else {
            a.as_standard_layout().into_owned().into()
        })
    }

    /// A status as a result; `signature` is the entry point's signature
    /// string, whose `site` entries name the source places of failures.
    pub fn status(
        entry: &'static str,
        status: i32,
        signature: *const ::core::ffi::c_char,
    ) -> Result<(), Error> {
        match (status, status & 0xff) {
            (0, _) => Ok(()),
            (_, 1) => Err(Error::DivisionByZero {
                entry,
                at: site(signature, usize::try_from(status >> 8).unwrap_or(0)),
            }),
            (_, 2) => Err(Error::OutOfMemory { entry }),
            _ => Err(Error::Status { entry, status }),
        }
    }

    /// The place of failure site `k` (from 1): `site KIND FILE LINE COLUMN`.
    fn site(signature: *const ::core::ffi::c_char, k: usize) -> Option<String> {
        // SAFETY: `signature` is the NUL-terminated string the library
        // exports beside the entry point.
        let text = unsafe { ::core::ffi::CStr::from_ptr(signature) }.to_str().ok()?;
        let entry = text.split(';').filter(|e| e.starts_with("site ")).nth(k.checked_sub(1)?)?;
        match entry.split(' ').collect::<Vec<_>>().as_slice() {
            [_, _, file, line, column] => {
                let file = file.replace("%20", " ").replace("%3B", ";").replace("%25", "%");
                Some(format!("{file}:{line}:{column}"))
            }
            _ => None,
        }
    }
"#;

/// The bindings of `functions` (`(entry point, signature under its
/// exported symbol)`) compiled from `source`, for code that runs on
/// `runs_on`.
pub fn rust_bindings(source: &str, functions: &[(String, Signature)], runs_on: &str) -> String {
    let source = source.escape_debug().to_string();
    let source = source.as_str();
    let mut r = String::new();
    let _ = writeln!(
        r,
        "// Generated by dlc from `{source}`: do not edit.\n\
         // Compiled for {runs_on}.\n\
         // The program links the model's static library, libm, and libgomp for kernels on\n\
         // threads (dlc-build prints the `cargo:` lines); it depends on `ndarray`.\n"
    );
    r.push_str(PRELUDE);
    // Declarations of the C functions, inside `__dlc`.
    let _ = writeln!(
        r,
        "\n    #[allow(non_snake_case, non_upper_case_globals)]\n    pub mod ffi {{\n        unsafe extern \"C\" {{"
    );
    for (name, sig) in functions {
        let params: Vec<String> = sig
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mutability = if p.output { "mut" } else { "const" };
                format!("p{i}: *{mutability} {}", c_element(p.ty.dtype))
            })
            .collect();
        let _ = writeln!(
            r,
            "            #[link_name = \"{sym}\"]\n            pub fn {f}({params}) -> i32;\n            \
             #[link_name = \"{sym}.signature\"]\n            pub static {name}_signature: ::core::ffi::c_char;",
            sym = sig.name,
            f = ident(name),
            params = params.join(", "),
        );
    }
    let _ = writeln!(r, "        }}\n    }}\n}}");
    for (name, sig) in functions {
        // The preparer's entry point name (the signature names its symbol).
        let prepare = sig.prepare.as_ref().and_then(|sym| {
            functions
                .iter()
                .find(|(_, s)| &s.name == sym)
                .map(|(n, s)| (n.as_str(), s.outputs().count()))
        });
        entry_point(&mut r, source, name, sig, prepare);
    }
    r
}

/// One entry point's safe wrapper; `prepare`: the entry point that
/// computes its last inputs from its weights, and how many.
fn entry_point(
    r: &mut String,
    source: &str,
    name: &str,
    sig: &Signature,
    prepare: Option<(&str, usize)>,
) {
    let inputs: Vec<&Param> = sig.inputs().collect();
    let outputs: Vec<&Param> = sig.outputs().collect();
    let describe = |ps: &[&Param]| {
        ps.iter()
            .map(|p| format!("`{}: {}`", p.name, p.ty))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let results: Vec<String> = outputs.iter().map(|p| rust_type(p)).collect();
    let result = match results.as_slice() {
        [one] => one.clone(),
        many => format!("({})", many.join(", ")),
    };
    let prepared = match prepare {
        Some((p, n)) => format!(
            "\n///\n/// The last {n} input(s) are the results of `{p}`, which prepares the weights \
             once:\n/// call it when they are bound and pass its results to every call.",
            p = ident(p)
        ),
        None => String::new(),
    };
    let _ = writeln!(
        r,
        "\n/// `{name}` of `{source}` (symbol `{sym}`).\n///\n/// Inputs: {ins}. Results: {outs}.{prepared}\n\
         ///\n/// # Errors\n///\n/// An input of another shape, or a failure of the compiled code.\n\
         #[allow(unsafe_code, non_snake_case, clippy::too_many_arguments, clippy::type_complexity)]\n\
         pub fn {f}({params}) -> Result<{result}, Error> {{",
        sym = sig.name,
        ins = if inputs.is_empty() {
            "none".into()
        } else {
            describe(&inputs)
        },
        outs = describe(&outputs),
        f = ident(name),
        params = inputs
            .iter()
            .map(|p| format!("{}: {}", ident(&p.name), rust_type(p)))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let mut args = Vec::new();
    for p in &inputs {
        let v = ident(&p.name);
        if p.ty.shape.is_empty() {
            args.push(format!("::core::ptr::from_ref(&{v}).cast()"));
        } else {
            let _ = writeln!(
                r,
                "    let {v} = __dlc::input(\"{name}\", \"{pname}\", {v}, &{shape})?;",
                pname = p.name,
                shape = shape(p),
            );
            args.push(format!("{v}.as_ptr().cast()"));
        }
    }
    for (i, p) in outputs.iter().enumerate() {
        let c = c_element(p.ty.dtype);
        if p.ty.shape.is_empty() {
            let _ = writeln!(r, "    let mut __dlc_r{i} = <{c}>::default();");
            args.push(format!("::core::ptr::from_mut(&mut __dlc_r{i})"));
        } else {
            let _ = writeln!(
                r,
                "    let mut __dlc_r{i} = ::ndarray::Array::<{c}, {d}>::default({s});",
                d = dim(p.ty.shape.len()),
                s = shape_arg(p),
            );
            args.push(format!("__dlc_r{i}.as_mut_ptr()"));
        }
    }
    let _ = writeln!(
        r,
        "    // SAFETY: each pointer addresses the row-major elements of one\n    \
         // parameter, of its element type and shape (inputs checked above, results\n    \
         // allocated here); the function reads the inputs, writes the results and\n    \
         // keeps no pointer.\n    \
         let __dlc_status = unsafe {{ __dlc::ffi::{f}({args}) }};\n    \
         __dlc::status(\"{name}\", __dlc_status, &raw const __dlc::ffi::{name}_signature)?;",
        f = ident(name),
        args = args.join(", "),
    );
    let finished: Vec<String> = outputs
        .iter()
        .enumerate()
        .map(|(i, p)| match (p.ty.dtype, p.ty.shape.is_empty()) {
            (DType::Bool, true) => format!("__dlc_r{i} != 0"),
            (DType::Bool, false) => format!("__dlc_r{i}.mapv(|b| b != 0)"),
            _ => format!("__dlc_r{i}"),
        })
        .collect();
    let value = match finished.as_slice() {
        [one] => one.clone(),
        many => format!("({})", many.join(", ")),
    };
    let _ = writeln!(r, "    Ok({value})\n}}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlc_core::TensorType;

    #[test]
    fn keywords_become_raw_identifiers_or_get_a_suffix() {
        assert_eq!(ident("x"), "x");
        assert_eq!(ident("match"), "r#match");
        assert_eq!(ident("self"), "self_");
        assert_eq!(ident("gen"), "r#gen");
    }

    #[test]
    fn scalars_are_values_and_tensors_are_arrays() {
        let p = |name: &str, d, shape: Vec<usize>, output| Param {
            name: name.into(),
            ty: TensorType::new(d, shape),
            output,
        };
        let sig = Signature {
            name: "dlc_m_f".into(),
            params: vec![
                p("x", DType::F32, vec![2, 3], false),
                p("n", DType::I32, vec![], false),
                p("out0", DType::Bool, vec![2, 3], true),
                p("out1", DType::I64, vec![], true),
            ],
            sites: vec![],
            prepare: None,
        };
        let text = rust_bindings("m.dl", &[("f".into(), sig)], "x86-64-v3");
        assert!(text.contains(
            "pub fn f(x: ::ndarray::ArrayView<'_, f32, ::ndarray::Ix2>, n: i32) -> \
             Result<(::ndarray::Array<bool, ::ndarray::Ix2>, i64), Error> {"
        ));
        assert!(text.contains("#[link_name = \"dlc_m_f\"]"));
        assert!(text.contains(
            "pub fn f(p0: *const f32, p1: *const i32, p2: *mut u8, p3: *mut i64) -> i32;"
        ));
        assert!(text.contains("Ok((__dlc_r0.mapv(|b| b != 0), __dlc_r1))"));
    }
}
