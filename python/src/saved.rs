//! Compiled modules saved to a directory and loaded without a compiler:
//! the shared library the driver links and what `load` needs besides.

use std::sync::Arc;

use dlc_core::TargetDesc;
use dlc_runtime::Kernel;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

use crate::{Code, Compiled, Function};

/// The symbol prefix of the Python package's entry points (`dlc_NAME`).
pub(crate) const SAVED_PREFIX: &str = "dlc_";
/// What `module.json` starts with, and its version.
const SAVED_FORMAT: &str = "dlc-python-module";
const SAVED_VERSION: u64 = 1;

/// What a saved module records beside its library.
#[derive(Debug, PartialEq)]
struct Saved {
    entry: String,
    /// The library's file in the directory: named by its contents, since
    /// the dynamic loader takes a path it has loaded for the library
    /// already loaded (a module saved again in place would load the old
    /// code).
    library: String,
    /// The entry point's inputs declared `weight`, by index.
    weights: Vec<usize>,
    /// The results' names, where the library's signature does not have
    /// them (a gradient's).
    outputs: Vec<String>,
    /// The CPU target the code was compiled for, and what it needs.
    target: String,
    vector_bits: usize,
    avx512_bf16: bool,
}

impl Saved {
    fn encode(&self) -> String {
        serde_json::json!({
            "format": SAVED_FORMAT,
            "version": SAVED_VERSION,
            "entry": self.entry,
            "library": self.library,
            "weights": self.weights,
            "outputs": self.outputs,
            "target": self.target,
            "vector_bits": self.vector_bits,
            "avx512_bf16": self.avx512_bf16,
        })
        .to_string()
    }

    fn decode(text: &str) -> Result<Saved, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        if v["format"] != SAVED_FORMAT {
            return Err("not a saved dlc module".into());
        }
        if v["version"] != SAVED_VERSION {
            return Err(format!(
                "version {} of the format; this dlc reads version {SAVED_VERSION}",
                v["version"]
            ));
        }
        let field = |k: &str| v.get(k).ok_or_else(|| format!("no `{k}`"));
        let text = |k: &str| {
            field(k)?
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("`{k}` is not a string"))
        };
        let weights = field("weights")?
            .as_array()
            .and_then(|a| a.iter().map(|w| w.as_u64().map(|w| w as usize)).collect())
            .ok_or("`weights` is not a list of indices")?;
        let library = text("library")?;
        if library.contains('/') || !library.ends_with(".so") {
            return Err(format!("`library` {library:?} is not a file name"));
        }
        let outputs = field("outputs")?
            .as_array()
            .and_then(|a| a.iter().map(|o| o.as_str().map(str::to_string)).collect())
            .ok_or("`outputs` is not a list of names")?;
        Ok(Saved {
            entry: text("entry")?,
            library,
            outputs,
            weights,
            target: text("target")?,
            vector_bits: field("vector_bits")?
                .as_u64()
                .ok_or("`vector_bits` is not a number")? as usize,
            avx512_bf16: field("avx512_bf16")?
                .as_bool()
                .ok_or("`avx512_bf16` is not true or false")?,
        })
    }
}

/// `Module.save`: writes `f`'s library (linked now by the driver) and its
/// metadata as the saved module `path`.
pub(crate) fn save(f: &Function, library: &[u8], path: &std::path::Path) -> PyResult<()> {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(library);
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let target = TargetDesc::host();
    let cpu = target.cpu();
    let meta = Saved {
        entry: f.name().to_string(),
        library: format!("module-{hex}.so"),
        weights: f.compiled.weights.iter().copied().collect(),
        outputs: f.compiled.output_names.clone(),
        target: target.name.clone(),
        vector_bits: cpu.map_or(0, |c| c.vector_bits),
        avx512_bf16: cpu.is_some_and(|c| c.avx512_bf16),
    };
    write_saved(path, &meta.library, library, &meta.encode())
        .map_err(|e| PyOSError::new_err(format!("{}: {e}", path.display())))
}

/// Writes `library` and `meta` as the saved module `path`: into a fresh
/// directory beside it, renamed into place (replacing a saved module
/// there, and nothing else).
fn write_saved(
    path: &std::path::Path,
    file: &str,
    library: &[u8],
    meta: &str,
) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    if path.exists() && !path.join("module.json").is_file() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            "exists and is not a saved dlc module; not replaced",
        ));
    }
    let name = path
        .file_name()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "names no directory"))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let staging = parent.join(format!(
        ".{}.{}.partial",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&staging);
    let written = (|| {
        std::fs::create_dir(&staging)?;
        std::fs::write(staging.join(file), library)?;
        std::fs::write(staging.join("module.json"), meta)?;
        if path.exists() {
            std::fs::remove_dir_all(path)?;
        }
        std::fs::rename(&staging, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    written
}

/// Loads a module `Module.save` wrote: its library, with no compiler.
#[pyfunction]
pub(crate) fn load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Function> {
    let bad = |why: String| PyValueError::new_err(format!("{}: {why}", path.display()));
    let meta = std::fs::read_to_string(path.join("module.json")).map_err(|e| {
        PyOSError::new_err(format!(
            "{}: not a saved dlc module ({}: {e})",
            path.display(),
            path.join("module.json").display()
        ))
    })?;
    let saved = Saved::decode(&meta).map_err(|e| bad(format!("module.json: {e}")))?;
    let host = TargetDesc::host();
    let fits = host.cpu().is_some_and(|c| {
        c.vector_bits >= saved.vector_bits && (c.avx512_bf16 || !saved.avx512_bf16)
    });
    if !fits {
        return Err(bad(format!(
            "compiled for {} ({}-bit vectors{}); this machine is {}",
            saved.target,
            saved.vector_bits,
            if saved.avx512_bf16 {
                ", AVX-512 BF16"
            } else {
                ""
            },
            host.name
        )));
    }
    let library = path.join(&saved.library);
    let entry = saved.entry.clone();
    let (kernel, library) = py
        .detach(move || {
            let library = dlc_runtime::SharedLibrary::open(&library)?;
            let symbol = dlc_runtime::abi::Symbols::with_prefix(SAVED_PREFIX)
                .and_then(|s| s.symbol(&entry))
                .map_err(dlc_runtime::RuntimeError::Load)?;
            let kernel = library.kernel(&symbol)?;
            // SAFETY: the kernel borrows the library's code, which
            // `Compiled` owns beside it and drops after it.
            let kernel = unsafe { std::mem::transmute::<Kernel<'_>, Kernel<'static>>(kernel) };
            Ok((kernel, library))
        })
        .map_err(|e: dlc_runtime::RuntimeError| bad(e.to_string()))?;
    Ok(Function {
        compiled: Arc::new(Compiled {
            kernel,
            code: Code::Library { _library: library },
            prepared: None,
            weights: saved.weights.into_iter().collect(),
            entry: saved.entry,
            output_names: saved.outputs,
            origin: None,
        }),
        bound: Vec::new(),
        prepared: None,
    })
}
