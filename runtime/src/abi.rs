//! The calling convention of compiled code.
//!
//! Every compiled entry point `f` is exported under a symbol `SYM`, its name
//! with a prefix (see [`Symbols`]: `dlc_model_f` for `model.dl` by default),
//! twice:
//! - `int32_t SYM(T0 *p0, T1 *p1, ...)`: one pointer per parameter, inputs
//!   first, then the results it writes; each points to the row-major
//!   elements of the tensor (`bool` is one byte per element);
//! - `int32_t SYM.entry(void **params)`: the same, with the pointers in an
//!   array, for callers that learn the arity at run time.
//!
//! Both return a [status](status_message). Beside them, `SYM.signature` is a
//! NUL-terminated string describing the parameters (see [`Signature`]), so a
//! loaded library can be called with checked arguments. Every other symbol
//! of generated code is private to its object file.
//!
//! # Statuses, places and symbols
//!
//! Every entry point is
//! `int32_t SYM(T0 *p0, ...)` (inputs, then results; row-major; bool one byte) plus
//! `int32_t SYM.entry(void **)`, returning `DLC_OK` (0), `DLC_DIVISION_BY_ZERO` (1) or
//! `DLC_OUT_OF_MEMORY` (2); `Signature` reads and writes `SYM.signature`, and `c_header`
//! writes the header `dlc compile --emit header` prints.
//!
//! **Failure statuses and source places.** Ops compiled from source carry their place
//! (`dlc_core::SourceLoc`, `file:line:column`): the front end sets it on every graph op
//! it writes (`Node::loc`), `graph.inline` and `graph.canonicalize` keep it on the ops
//! they copy or rewrite, the lowering sets it on the loop ops of each kernel and of each
//! fused element-wise op (`OpData::loc`), and `convert-loop-to-tile` on the tile ops made
//! from them (host-level buffers included). Code generation numbers the places where a function can fail (an
//! integer division, an allocation) as its *sites* and returns `kind | site << 8`: the
//! low byte is the kind (`DLC_DIVISION_BY_ZERO`, `DLC_OUT_OF_MEMORY`;
//! `DLC_STATUS_KIND(status)` in the header), the rest the site, from 1 (0: unknown).
//! `SYM.signature` lists the sites after the parameters (`site KIND FILE LINE COLUMN`),
//! so the runtime's checked calls, in process or through a shared library, say
//! `integer division by zero at model.dl:3:13`; the interpreters name the same place.
//! Places are not part of the IR text forms (IR read from text has none), and ops that
//! `graph.saturate` creates when it replaces a function carry none; their failures are
//! reported without a place.
//!
//! **Symbol naming** (`abi::Symbols`). Entry point `f` is exported as `PREFIX f`. The
//! default prefix is `dlc_` plus the module file's stem made an identifier, plus `_`
//! (`dlc_model_mlp` for `mlp` in `model.dl`; `dlc_stdin_` for standard input); the JIT,
//! whose symbols never leave the process, uses `dlc_jit_`. `dlc compile --prefix P` sets
//! it (`--prefix ''` for bare names). Every resulting symbol is checked: it must be a C
//! identifier and not a C or C++ keyword, an implementation-reserved name (`__x`, `_X`),
//! a `DLC_` macro, or a function generated code calls (`malloc`, `calloc`, `free`,
//! `GOMP_parallel`, `omp_*`, libm); a refused symbol is an error naming the entry point.
//! So an entry point may have any legal dlc name, `malloc` and `int` included, and two
//! models link into one program. Everything else in generated code is private (outlined
//! thread bodies, packing and micro-kernel functions) or weak and hidden (the bf16
//! rounding fallback `__truncsfbf2`). In the header, a parameter whose name C would read as
//! something else (a keyword, a `<stdint.h>` type or macro, `NULL`) gets a `_` appended.

use std::fmt::Write as _;

use dlc_core::{DType, TensorType};

/// Status of a successful call.
pub const STATUS_OK: i32 = 0;
/// Status when an integer division by zero was attempted.
pub const STATUS_DIVISION_BY_ZERO: i32 = 1;
/// Status when a buffer could not be allocated.
pub const STATUS_OUT_OF_MEMORY: i32 = 2;

/// The kind of a status (its low byte): [`STATUS_OK`],
/// [`STATUS_DIVISION_BY_ZERO`] or [`STATUS_OUT_OF_MEMORY`]. The bits above
/// number the failing op's [`Site`] in the function's signature, from 1 (0:
/// unknown).
pub fn status_kind(status: i32) -> i32 {
    status & 0xff
}

/// A place where a compiled function can fail: the kind of failure (its
/// status) and the source place of the op (`model.dl:3:12`), when the
/// program was compiled from source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// [`STATUS_DIVISION_BY_ZERO`] or [`STATUS_OUT_OF_MEMORY`].
    pub kind: i32,
    /// Where the op comes from.
    pub loc: Option<dlc_core::SourceLoc>,
}

/// What a nonzero status means, naming the failing op's source place when
/// `sites` (the function's) has it; `None` for [`STATUS_OK`].
pub fn status_message(status: i32, sites: &[String]) -> Option<String> {
    let what = match status_kind(status) {
        STATUS_OK if status == STATUS_OK => return None,
        STATUS_DIVISION_BY_ZERO => "integer division by zero",
        STATUS_OUT_OF_MEMORY => "out of memory allocating a buffer",
        _ => return Some(format!("compiled code failed with status {status}")),
    };
    let site = usize::try_from(status >> 8).unwrap_or(0);
    Some(match site.checked_sub(1).and_then(|k| sites.get(k)) {
        Some(place) if place != "-" => format!("{what} at {place}"),
        _ => what.to_string(),
    })
}

/// One parameter of a compiled function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// Its name in the source.
    pub name: String,
    /// Element type and shape.
    pub ty: TensorType,
    /// Whether it is a result the function writes (otherwise an input).
    pub output: bool,
}

/// The parameters of a compiled function: inputs, then results; and the
/// source places its failure statuses number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// The function's symbol.
    pub name: String,
    /// Its parameters, in call order.
    pub params: Vec<Param>,
    /// Where it can fail: site `k` (from 1) of a failure status is
    /// `sites[k - 1]`.
    pub sites: Vec<Site>,
    /// The function (its symbol) that computes this one's last inputs from
    /// its weights, once per binding of them: its results are, by name and
    /// in order, those inputs (see [`crate::call::Kernel::with_prepare`]).
    pub prepare: Option<String>,
}

/// `%`, `;` and spaces escaped, so a file name is one word of a signature
/// entry.
fn escape(s: &str) -> String {
    s.replace('%', "%25")
        .replace(';', "%3B")
        .replace(' ', "%20")
}

fn unescape(s: &str) -> String {
    s.replace("%20", " ")
        .replace("%3B", ";")
        .replace("%25", "%")
}

impl Signature {
    /// The inputs, in order.
    pub fn inputs(&self) -> impl Iterator<Item = &Param> {
        self.params.iter().filter(|p| !p.output)
    }

    /// The results, in order.
    pub fn outputs(&self) -> impl Iterator<Item = &Param> {
        self.params.iter().filter(|p| p.output)
    }

    /// The source place of each site, as failure messages name it (`-`
    /// where unknown).
    pub fn site_places(&self) -> Vec<String> {
        self.sites
            .iter()
            .map(|s| s.loc.as_ref().map_or("-".into(), ToString::to_string))
            .collect()
    }

    /// The text stored in `NAME.signature`: one `in|out NAME DTYPE DIMS...`
    /// entry per parameter, `prepare SYMBOL` when a preparer computes its
    /// last inputs, then one `site KIND FILE LINE COLUMN` (or
    /// `site KIND -`) per failure site, separated by `;`
    /// (`in x f32 128 784;out out0 f32 128 10;site 1 m.dl 3 12`); `%`, `;`
    /// and spaces in file names are escaped as `%25`, `%3B` and `%20`.
    pub fn encode(&self) -> String {
        let mut entries: Vec<String> = self
            .params
            .iter()
            .map(|p| {
                let mut e = format!(
                    "{} {} {}",
                    if p.output { "out" } else { "in" },
                    p.name,
                    p.ty.dtype
                );
                for d in &p.ty.shape {
                    let _ = write!(e, " {d}");
                }
                e
            })
            .collect();
        if let Some(p) = &self.prepare {
            entries.push(format!("prepare {p}"));
        }
        for site in &self.sites {
            entries.push(match &site.loc {
                Some(l) => format!(
                    "site {} {} {} {}",
                    site.kind,
                    escape(&l.file),
                    l.line,
                    l.column
                ),
                None => format!("site {} -", site.kind),
            });
        }
        entries.join(";")
    }

    /// Reads the text of [`Signature::encode`].
    pub fn decode(name: &str, text: &str) -> Result<Signature, String> {
        let mut params = Vec::new();
        let mut sites = Vec::new();
        let mut prepare = None;
        for entry in text.split(';').filter(|e| !e.is_empty()) {
            let bad = || format!("`{name}`: malformed signature entry `{entry}`");
            let mut words = entry.split(' ');
            let output = match words.next() {
                Some("in") => false,
                Some("out") => true,
                Some("prepare") => {
                    prepare = Some(words.next().ok_or_else(bad)?.to_string());
                    continue;
                }
                Some("site") => {
                    let kind = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
                    let loc = match words.next().ok_or_else(bad)? {
                        "-" => None,
                        file => {
                            let mut num = || -> Result<u32, String> {
                                words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)
                            };
                            let (line, column) = (num()?, num()?);
                            Some(dlc_core::SourceLoc {
                                file: unescape(file).into(),
                                line,
                                column,
                            })
                        }
                    };
                    sites.push(Site { kind, loc });
                    continue;
                }
                _ => return Err(bad()),
            };
            let pname = words.next().ok_or_else(bad)?.to_string();
            let dtype: DType = words.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
            let shape = words
                .map(|w| w.parse::<usize>().map_err(|_| bad()))
                .collect::<Result<Vec<_>, _>>()?;
            params.push(Param {
                name: pname,
                ty: TensorType::new(dtype, shape),
                output,
            });
        }
        Ok(Signature {
            name: name.to_string(),
            params,
            sites,
            prepare,
        })
    }
}

/// Names that a symbol of generated code, or a parameter name in its C
/// header, must never take: C and C++ keywords, the types and macros the
/// header uses, and the C library, libm and OpenMP functions that generated
/// code calls.
const RESERVED: &[&str] = &[
    // C (to C23) and C++ keywords.
    "alignas",
    "alignof",
    "and",
    "and_eq",
    "asm",
    "auto",
    "bitand",
    "bitor",
    "bool",
    "break",
    "case",
    "catch",
    "char",
    "char8_t",
    "char16_t",
    "char32_t",
    "class",
    "compl",
    "concept",
    "const",
    "consteval",
    "constexpr",
    "constinit",
    "const_cast",
    "continue",
    "co_await",
    "co_return",
    "co_yield",
    "decltype",
    "default",
    "delete",
    "do",
    "double",
    "dynamic_cast",
    "else",
    "enum",
    "explicit",
    "export",
    "extern",
    "false",
    "float",
    "for",
    "friend",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "mutable",
    "namespace",
    "new",
    "noexcept",
    "not",
    "not_eq",
    "nullptr",
    "operator",
    "or",
    "or_eq",
    "private",
    "protected",
    "public",
    "register",
    "reinterpret_cast",
    "requires",
    "restrict",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "static_assert",
    "static_cast",
    "struct",
    "switch",
    "template",
    "this",
    "thread_local",
    "throw",
    "true",
    "try",
    "typedef",
    "typeid",
    "typename",
    "typeof",
    "typeof_unqual",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "wchar_t",
    "while",
    "xor",
    "xor_eq",
    // Types and macros of the header and <stdint.h>.
    "int8_t",
    "int16_t",
    "int32_t",
    "int64_t",
    "uint8_t",
    "uint16_t",
    "uint32_t",
    "uint64_t",
    "intptr_t",
    "uintptr_t",
    "intmax_t",
    "uintmax_t",
    "size_t",
    "ptrdiff_t",
    "NULL",
    // What generated code calls.
    "malloc",
    "calloc",
    "realloc",
    "free",
    "memcpy",
    "memmove",
    "memset",
    "abort",
    "exit",
    "GOMP_parallel",
    "omp_get_thread_num",
    "omp_get_num_threads",
    "omp_set_num_threads",
    "exp",
    "expf",
    "log",
    "logf",
    "sqrt",
    "sqrtf",
    "tanh",
    "tanhf",
    "pow",
    "powf",
    "fabs",
    "fabsf",
    "fmax",
    "fmaxf",
    "fmin",
    "fminf",
    "floor",
    "floorf",
    "main",
];

/// Whether `name` is reserved in C or by the header: a [`RESERVED`] name, an
/// implementation-reserved identifier (`__x`, `_X`), a `DLC_` status macro,
/// or a name shaped like a `<stdint.h>` macro (`..._MAX`, `..._MIN`,
/// `..._WIDTH`, `..._C`).
fn is_reserved(name: &str) -> bool {
    let upper = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    };
    RESERVED.contains(&name)
        || name.starts_with("__")
        || name.starts_with('_') && name[1..].starts_with(|c: char| c.is_ascii_uppercase())
        || name.starts_with("DLC_")
        || upper(name)
            && ["_MAX", "_MIN", "_WIDTH", "_C"]
                .iter()
                .any(|s| name.ends_with(s))
}

/// How the functions of a compiled module are named in an object file,
/// library or C header: entry point `f` becomes `PREFIX f`. The default
/// prefix comes from the module's file (`dlc_model_` for `model.dl`), so
/// two models link into one program and no entry point's name (`malloc`,
/// `int`, `GOMP_parallel`) meets a symbol of the C library, the OpenMP
/// runtime or LLVM, or a C keyword. A prefix is set with `--prefix`; every
/// resulting symbol is checked ([`Symbols::symbol`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbols {
    prefix: String,
}

impl Symbols {
    /// Symbols with `prefix` (empty, or the start of a C identifier).
    pub fn with_prefix(prefix: &str) -> Result<Symbols, String> {
        let ok = prefix.is_empty()
            || prefix.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && prefix
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(format!(
                "symbol prefix `{prefix}` is not the start of a C identifier (letters, digits and `_`, not starting with a digit)"
            ));
        }
        Ok(Symbols {
            prefix: prefix.to_string(),
        })
    }

    /// The default for a module read from a file with this stem (`model`
    /// for `model.dl`): `dlc_` and the stem made an identifier, then `_`.
    pub fn for_module(stem: &str) -> Symbols {
        let stem: String = stem
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        Symbols {
            prefix: format!("dlc_{stem}_"),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The exported symbol of entry point `name`, or why it cannot be one
    /// (not a C identifier, or a name reserved in C or by the runtime).
    pub fn symbol(&self, name: &str) -> Result<String, String> {
        let symbol = format!("{}{name}", self.prefix);
        if !is_c_identifier(&symbol) {
            return Err(format!(
                "`{symbol}` (entry point `{name}`) is not a C identifier"
            ));
        }
        if is_reserved(&symbol) {
            return Err(format!(
                "the symbol `{symbol}` of entry point `{name}` is reserved (a C keyword, or a name \
                 of the C library, the OpenMP runtime or the header); choose another --prefix"
            ));
        }
        Ok(symbol)
    }
}

/// A parameter's name as the C header writes it: the name itself, with `_`
/// appended where C would read it as something else (a keyword, a type or
/// macro of the header, a reserved identifier).
fn c_param_name(name: &str) -> String {
    if is_reserved(name) {
        format!("{name}_")
    } else {
        name.to_string()
    }
}

fn c_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        // No portable C type for the 16-bit floats: their bits.
        DType::F16 | DType::BF16 => "uint16_t",
        DType::I8 => "int8_t",
        DType::I16 => "int16_t",
        DType::I32 => "int32_t",
        DType::I64 => "int64_t",
        DType::U8 | DType::Bool => "uint8_t",
        DType::U16 => "uint16_t",
        DType::U32 => "uint32_t",
        DType::U64 => "uint64_t",
    }
}

/// Whether `name` can be a C identifier.
pub fn is_c_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A C header declaring compiled functions; `guard` names the include
/// guard (made a C identifier). Functions whose names are not C identifiers
/// are left out (only their `.entry` form can be called, by `dlsym`).
/// `cpu` says which CPUs the code runs on (written in the header).
pub fn c_header(guard: &str, functions: &[Signature], cpu: &str) -> String {
    let guard: String = guard
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    let mut h = String::new();
    let _ = writeln!(
        h,
        "/* Generated by dlc. Link the object file (or the static or shared library)
 * with -lm, and with -lgomp for kernels on threads (OMP_NUM_THREADS sizes the
 * pool; without it they run on the calling thread).
 * Compiled for {cpu}. */
#ifndef DLC_{guard}_H
#define DLC_{guard}_H

#include <stdint.h>

#ifdef __cplusplus
extern \"C\" {{
#endif

/* Every function returns DLC_OK, or a failure status whose kind
 * (DLC_STATUS_KIND) is one of the others; the bits above number the failing
 * op among the function's sites (listed in its SYM.signature string). */
#define DLC_OK {STATUS_OK}
#define DLC_DIVISION_BY_ZERO {STATUS_DIVISION_BY_ZERO}
#define DLC_OUT_OF_MEMORY {STATUS_OUT_OF_MEMORY}
#define DLC_STATUS_KIND(status) ((status) & 0xff)
"
    );
    for f in functions {
        if !is_c_identifier(&f.name) {
            continue;
        }
        let _ = writeln!(
            h,
            "/* {}: inputs, then results it writes; row-major elements. */",
            f.name
        );
        if let Some(prep) = &f.prepare {
            let prepared: Vec<&str> = functions
                .iter()
                .find(|g| &g.name == prep)
                .map(|g| g.outputs().map(|p| p.name.as_str()).collect())
                .unwrap_or_default();
            let _ = writeln!(
                h,
                "/* Its last inputs ({}) come from {prep}:\n * call that once when the \
                 weights are bound and pass its results to every call. */",
                prepared.join(", ")
            );
        }
        for p in &f.params {
            let _ = writeln!(
                h,
                "/*   {} {}: {} ({} elements) */",
                if p.output { "out" } else { "in " },
                p.name,
                p.ty,
                p.ty.num_elements().unwrap_or(0)
            );
        }
        let params: Vec<String> = f
            .params
            .iter()
            .map(|p| {
                let konst = if p.output { "" } else { "const " };
                let pname = if is_c_identifier(&p.name) {
                    c_param_name(&p.name)
                } else {
                    String::new()
                };
                format!("{konst}{} *{pname}", c_type(p.ty.dtype))
            })
            .collect();
        let params = if params.is_empty() {
            "void".to_string()
        } else {
            params.join(", ")
        };
        let _ = writeln!(h, "int32_t {}({params});\n", f.name);
    }
    let _ = writeln!(
        h,
        "#ifdef __cplusplus
}}
#endif

#endif /* DLC_{guard}_H */"
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig() -> Signature {
        Signature {
            name: "mlp".into(),
            params: vec![
                Param {
                    name: "x".into(),
                    ty: TensorType::new(DType::F32, vec![2, 3]),
                    output: false,
                },
                Param {
                    name: "n".into(),
                    ty: TensorType::scalar(DType::I64),
                    output: false,
                },
                Param {
                    name: "out0".into(),
                    ty: TensorType::new(DType::Bool, vec![4]),
                    output: true,
                },
            ],
            sites: vec![],
            prepare: None,
        }
    }

    #[test]
    fn signatures_round_trip_through_their_text() {
        let s = sig();
        assert_eq!(s.encode(), "in x f32 2 3;in n i64;out out0 bool 4");
        assert_eq!(Signature::decode("mlp", &s.encode()), Ok(s));
        assert!(Signature::decode("f", "sideways x f32 2").is_err());
        assert!(Signature::decode("f", "in x f99 2").is_err());
        assert!(Signature::decode("f", "in x f32 two").is_err());
        assert!(Signature::decode("f", "in x f32 2;prepare").is_err());
        let mut s = sig();
        s.prepare = Some("dlc_m_mlp_prepare".into());
        assert_eq!(
            s.encode(),
            "in x f32 2 3;in n i64;out out0 bool 4;prepare dlc_m_mlp_prepare"
        );
        assert_eq!(Signature::decode("mlp", &s.encode()), Ok(s.clone()));
        s.sites = vec![
            Site {
                kind: STATUS_DIVISION_BY_ZERO,
                loc: Some(dlc_core::SourceLoc {
                    file: "my dir;x/m%.dl".into(),
                    line: 3,
                    column: 12,
                }),
            },
            Site {
                kind: STATUS_OUT_OF_MEMORY,
                loc: None,
            },
        ];
        assert_eq!(Signature::decode("mlp", &s.encode()), Ok(s.clone()));
        let places = s.site_places();
        assert_eq!(
            status_message(STATUS_DIVISION_BY_ZERO | 1 << 8, &places).as_deref(),
            Some("integer division by zero at my dir;x/m%.dl:3:12")
        );
        assert_eq!(
            status_message(STATUS_OUT_OF_MEMORY | 2 << 8, &places).as_deref(),
            Some("out of memory allocating a buffer")
        );
        assert_eq!(
            status_message(STATUS_DIVISION_BY_ZERO, &places).as_deref(),
            Some("integer division by zero")
        );
        assert_eq!(status_message(STATUS_OK, &places), None);
        assert!(Signature::decode("f", "site 1 m.dl three 4").is_err());
    }

    #[test]
    fn headers_declare_c_functions() {
        let mut hidden = sig();
        hidden.name = "dense$4$8".into();
        let h = c_header("my-model", &[sig(), hidden], "x86-64-v3");
        assert!(h.contains("#ifndef DLC_MY_MODEL_H"), "{h}");
        assert!(
            h.contains("int32_t mlp(const float *x, const int64_t *n, uint8_t *out0);"),
            "{h}"
        );
        assert!(!h.contains("dense$"), "{h}");
        // A function with a preparer says which inputs come from it.
        let mut main = sig();
        main.params.insert(
            2,
            Param {
                name: "w_packed".into(),
                ty: TensorType::new(DType::F32, vec![4]),
                output: false,
            },
        );
        main.prepare = Some("mlp_prepare".into());
        let prepare = Signature {
            name: "mlp_prepare".into(),
            params: vec![
                Param {
                    name: "x".into(),
                    ty: TensorType::new(DType::F32, vec![2, 3]),
                    output: false,
                },
                Param {
                    name: "w_packed".into(),
                    ty: TensorType::new(DType::F32, vec![4]),
                    output: true,
                },
            ],
            sites: vec![],
            prepare: None,
        };
        let h = c_header("m", &[main, prepare], "x86-64-v3");
        assert!(
            h.contains("/* Its last inputs (w_packed) come from mlp_prepare:"),
            "{h}"
        );
        assert!(
            h.contains("int32_t mlp_prepare(const float *x, float *w_packed);"),
            "{h}"
        );
    }

    #[test]
    fn symbols_are_prefixed_and_checked() {
        let d = Symbols::for_module("w2-mlp");
        assert_eq!(d.prefix(), "dlc_w2_mlp_");
        for name in [
            "malloc",
            "free",
            "int",
            "GOMP_parallel",
            "omp_get_thread_num",
            "main",
        ] {
            assert_eq!(d.symbol(name), Ok(format!("dlc_w2_mlp_{name}")));
        }
        let bare = Symbols::with_prefix("").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bare.symbol("mlp"), Ok("mlp".into()));
        for name in [
            "malloc",
            "free",
            "int",
            "GOMP_parallel",
            "omp_get_thread_num",
            "__x",
        ] {
            assert!(bare.symbol(name).is_err(), "{name} must be refused");
        }
        assert!(Symbols::with_prefix("9x").is_err());
        assert!(Symbols::with_prefix("a-b").is_err());
        assert!(Symbols::with_prefix("my_").is_ok());
    }

    #[test]
    fn header_parameter_names_are_never_c_keywords_or_macros() {
        let mut s = sig();
        for (p, name) in s.params.iter_mut().zip(["int", "INT32_MAX", "out0"]) {
            p.name = name.into();
        }
        let h = c_header("m", &[s], "x86-64-v3");
        assert!(
            h.contains("int32_t mlp(const float *int_, const int64_t *INT32_MAX_, uint8_t *out0);"),
            "{h}"
        );
    }
}
