//! A model compiled for this CPU by `dlc run` and `dlc bench`: taken whole
//! from the program cache when it holds it (no front end, passes, lowering
//! or LLVM: its objects linked, its entry point's interface read back),
//! else compiled and stored there.
//!
//! The key is the source's name and text, the entry point, the passes and
//! the target they priced for; `dlc_llvm::ProgramKey` adds the compiler's
//! build and the host.
//!
//! An ONNX model ([`compile_onnx_for_cpu`]) is keyed by its path (which its
//! failures name), its file's SHA-256 and the import options instead, so a
//! hit does not import it: the model
//! is mapped, hashed, and each weight is a slice of the mapping (or of its
//! external data file, or, for a tensor the importer folded, of the bytes
//! kept beside the program), bound as the file stores it. What a run needs
//! of the model (its inputs' and outputs' ONNX names, where each weight's
//! bytes are, the external files' hashes) is kept with the program.

use std::time::{Duration, Instant};

use dlc_core::TargetDesc;
use dlc_driver::{DriverError, Interface, PassOptions, SourceText};
use dlc_llvm::{Jit, JitOptions, ObjectCache, ProgramKey};
use dlc_runtime::{HostTensor, RawTensor, Value};
use sha2::{Digest, Sha256};

use crate::phases::Phases;

/// What [`compile_for_cpu`] compiles, and where it keeps it.
pub struct Compile<'a> {
    /// The entry point (`None`: the only one).
    pub entry: Option<&'a str>,
    /// The graph pipeline.
    pub passes: &'a str,
    /// The target the passes price for.
    pub priced: &'a TargetDesc,
    /// The object cache, holding programs and objects (`None`: compile
    /// everything, store nothing).
    pub cache: Option<&'a ObjectCache>,
    /// Time every kernel launch in the code (`dlc bench --profile`).
    pub profile: bool,
}

/// A compiled entry point.
pub struct CpuProgram {
    /// Its code.
    pub jit: Jit,
    /// Its parameters.
    pub interface: Interface,
    /// The values of the weights the source carried (an imported model's
    /// initializers), by name.
    pub carried: Carried,
    /// Whether the program came whole from the cache.
    pub cached: bool,
    /// The front end's and the lowering's time (the key's, from the
    /// cache); LLVM's is `jit.compile_time()`.
    pub front: Duration,
}

impl Compile<'_> {
    fn key(&self, src: &SourceText) -> Result<ProgramKey, DriverError> {
        let priced = format!("{:?}", self.priced);
        let fields: [&[u8]; 5] = [
            src.name.as_bytes(),
            src.text.as_bytes(),
            self.entry.unwrap_or("").as_bytes(),
            self.passes.as_bytes(),
            priced.as_bytes(),
        ];
        ProgramKey::new(&fields).map_err(codegen)
    }
}

fn codegen(e: dlc_llvm::CodegenError) -> DriverError {
    DriverError::Usage(e.to_string())
}

/// Compiles entry point `how.entry` of `src` for this CPU, or takes it
/// from the cache (see the module's documentation).
pub fn compile_for_cpu(
    src: SourceText,
    how: &Compile<'_>,
    phases: &Phases,
) -> Result<CpuProgram, DriverError> {
    let start = Instant::now();
    let key = how.cache.map(|_| how.key(&src)).transpose()?;
    if let (Some(cache), Some(key)) = (how.cache, &key) {
        let front = start.elapsed();
        // A program that cannot be linked again (nothing this build
        // stored) is compiled again, as a missing one is.
        if let Ok(Some((jit, meta))) = Jit::load(cache, key)
            && let Some(interface) = Interface::decode(&meta)
        {
            let carried = carried_weights(&src.name, src.weights, &interface)?;
            return Ok(CpuProgram {
                jit,
                interface,
                carried,
                cached: true,
                front,
            });
        }
    }
    let (jit, interface, carried, front) = compile_fresh(src, how, phases, start)?;
    let carried = carried
        .into_iter()
        .map(|(n, t)| (n, Value::Host(t)))
        .collect();
    if let (Some(cache), Some(key)) = (how.cache, &key) {
        // A cache that cannot be written only makes the next run slower.
        let _ = jit.store(cache, key, &interface.encode());
    }
    Ok(CpuProgram {
        jit,
        interface,
        carried,
        cached: false,
        front,
    })
}

/// What [`compile_fresh`] makes: the code, its entry point's interface,
/// the weights the source carried, and the time from `start` to the end of
/// lowering.
type Fresh = (Jit, Interface, Vec<(String, HostTensor)>, Duration);

/// Compiles `src` (the passes, lowering and LLVM; LLVM's parts through the
/// object cache): its code, its entry point's interface, and the weights
/// it carried as tensors of their declared types.
fn compile_fresh(
    src: SourceText,
    how: &Compile<'_>,
    phases: &Phases,
    start: Instant,
) -> Result<Fresh, DriverError> {
    phases.set("checking");
    // An imported model's weights are bound at the call, not compiled in.
    let (mut module, carried) = dlc_driver::compile_source_unbound(src)?;
    phases.set("optimizing");
    let options = PassOptions {
        target: Some(how.priced),
        ..PassOptions::default()
    };
    dlc_driver::run_passes(&mut module, how.passes, options)?;
    let module = dlc_driver::only_entry(&module, how.entry)?;
    let f = dlc_driver::select_entry(&module, None)?;
    let interface = Interface::of(f);
    phases.set("compiling");
    let lowered = dlc_driver::lower_for_cpu(&module)?;
    let front = start.elapsed();
    let options = JitOptions {
        cache: how.cache.cloned(),
        profile: how.profile,
    };
    let jit = dlc_llvm::compile_in_process(&lowered, &options).map_err(codegen)?;
    Ok((jit, interface, carried, front))
}

/// The weights `name` carried (`weights`, by name) as tensors of the types
/// `interface` declares; those of other entry points are left out.
fn carried_weights(
    name: &str,
    weights: Vec<(String, Vec<f64>)>,
    interface: &Interface,
) -> Result<Carried, DriverError> {
    weights
        .into_iter()
        .filter_map(|(weight, values)| {
            let p = interface
                .params
                .iter()
                .find(|p| p.weight && p.name == weight)?;
            Some(
                HostTensor::new(p.ty.clone(), values)
                    .map(|t| (weight, Value::Host(t)))
                    .map_err(|e| DriverError::Usage(format!("{name}: weight `{}`: {e}", p.name))),
            )
        })
        .collect()
}

/// Weights' values, by name.
type Carried = Vec<(String, Value)>;

/// An ONNX model compiled for this CPU, and what a run needs of the model.
pub struct OnnxProgram {
    /// The program; its carried weights are the model's.
    pub program: CpuProgram,
    /// The graph's inputs: ONNX name and the parameter it became.
    pub inputs: Vec<(String, String)>,
    /// The graph's outputs' ONNX names, in order.
    pub outputs: Vec<String>,
}

/// Where a weight's bytes are, as the record kept with a program says.
#[derive(Debug, Clone, PartialEq)]
enum Place {
    /// In the model file, at a byte offset.
    Model { offset: usize, len: usize },
    /// In an external data file (relative to the model's directory).
    External {
        file: String,
        offset: usize,
        len: usize,
    },
    /// In the bytes kept beside the program (a tensor the importer folded).
    Kept { offset: usize, len: usize },
}

/// What a cached ONNX program keeps of its model (see the module's
/// documentation), as one line of JSON after its interface.
#[derive(Debug, Clone, PartialEq)]
struct Record {
    inputs: Vec<(String, String)>,
    outputs: Vec<String>,
    weights: Vec<(String, Place)>,
    /// The external data files the weights come from, with their SHA-256.
    externals: Vec<(String, String)>,
}

impl Record {
    fn encode(&self) -> String {
        use serde_json::json;
        let weights: Vec<serde_json::Value> = self
            .weights
            .iter()
            .map(|(name, place)| match place {
                Place::Model { offset, len } => json!([name, "model", offset, len]),
                Place::External { file, offset, len } => {
                    json!([name, "external", offset, len, file])
                }
                Place::Kept { offset, len } => json!([name, "kept", offset, len]),
            })
            .collect();
        json!({
            "inputs": self.inputs,
            "outputs": self.outputs,
            "weights": weights,
            "externals": self.externals,
        })
        .to_string()
    }

    /// Reads what [`Record::encode`] wrote; `None` for anything else.
    fn decode(text: &str) -> Option<Record> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let pairs = |v: &serde_json::Value| -> Option<Vec<(String, String)>> {
            v.as_array()?
                .iter()
                .map(|p| Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string())))
                .collect()
        };
        let size = |v: &serde_json::Value| usize::try_from(v.as_u64()?).ok();
        let weights = v["weights"]
            .as_array()?
            .iter()
            .map(|w| {
                let (offset, len) = (size(&w[2])?, size(&w[3])?);
                let place = match w[1].as_str()? {
                    "model" => Place::Model { offset, len },
                    "external" => Place::External {
                        file: w[4].as_str()?.to_string(),
                        offset,
                        len,
                    },
                    "kept" => Place::Kept { offset, len },
                    _ => return None,
                };
                Some((w[0].as_str()?.to_string(), place))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Record {
            inputs: pairs(&v["inputs"])?,
            outputs: v["outputs"]
                .as_array()?
                .iter()
                .map(|o| o.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()?,
            weights,
            externals: pairs(&v["externals"])?,
        })
    }
}

/// What separates a cached ONNX program's interface from its record.
const RECORD: &str = "\nonnx ";

/// The key of ONNX model `model` (its bytes), read from `path`, imported
/// with `options` and compiled as `how` says. The path is part of it: the
/// program's failures name the file (and the node).
fn onnx_key(
    path: &str,
    model: &[u8],
    options: &dlc_onnx::Options,
    how: &Compile<'_>,
) -> Result<ProgramKey, DriverError> {
    let mut imported_as = String::new();
    for (name, dims) in &options.shapes {
        imported_as.push_str(&format!("shape {name:?} {dims:?}\n"));
    }
    for (name, d) in &options.bound {
        let mut h = Sha256::new();
        for v in d.values.iter() {
            h.update(v.to_bits().to_le_bytes());
        }
        imported_as.push_str(&format!(
            "bind {name:?} {} {:?} {}\n",
            d.dtype,
            d.shape,
            hex(&h.finalize())
        ));
    }
    let priced = format!("{:?}", how.priced);
    let digest = Sha256::digest(model);
    let fields: [&[u8]; 7] = [
        b"onnx model",
        path.as_bytes(),
        &digest,
        imported_as.as_bytes(),
        how.entry.unwrap_or("").as_bytes(),
        how.passes.as_bytes(),
        priced.as_bytes(),
    ];
    ProgramKey::new(&fields).map_err(codegen)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Maps the file at `path` (a model or its external data).
fn map(path: &std::path::Path) -> Result<bytes::Bytes, DriverError> {
    dlc_runtime::map_file(path).map_err(|source| DriverError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Compiles the ONNX model at `path` for this CPU, or takes it from the
/// cache without importing it (see the module's documentation).
pub fn compile_onnx_for_cpu(
    path: &str,
    options: &dlc_onnx::Options,
    how: &Compile<'_>,
    phases: &Phases,
) -> Result<OnnxProgram, DriverError> {
    let start = Instant::now();
    let model = map(std::path::Path::new(path))?;
    let dir = dlc_driver::onnx_model_dir(path);
    let key = how
        .cache
        .map(|_| onnx_key(path, &model, options, how))
        .transpose()?;
    if let (Some(cache), Some(key)) = (how.cache, &key)
        && let Ok(Some((jit, meta))) = Jit::load(cache, key)
        && let Some((interface, record)) = meta.split_once(RECORD)
        && let (Some(interface), Some(record)) = (
            Interface::decode(&format!("{interface}\n")),
            Record::decode(record.trim_end()),
        )
        && let Some(carried) = weights_in_place(&record, &interface, &model, &dir, || {
            Jit::load_data(cache, key)
        })
    {
        return Ok(OnnxProgram {
            program: CpuProgram {
                jit,
                interface,
                carried,
                cached: true,
                front: start.elapsed(),
            },
            inputs: record.inputs,
            outputs: record.outputs,
        });
    }
    phases.set("importing");
    let import_options = dlc_onnx::Options {
        model_dir: Some(dir.clone()),
        ..options.clone()
    };
    let imported = dlc_onnx::import_bytes(model.clone(), &import_options).map_err(|source| {
        DriverError::Import {
            path: path.to_string(),
            source,
        }
    })?;
    let src = SourceText {
        name: path.to_string(),
        text: imported.source,
        weights: Vec::new(),
    };
    let (jit, interface, _, front) = compile_fresh(src, how, phases, start)?;
    let (carried, mut record, kept) = bind_imported(
        path,
        imported.weights,
        &interface,
        &model,
        Record {
            inputs: imported.inputs,
            outputs: imported.outputs.into_iter().map(|(o, _)| o).collect(),
            weights: Vec::new(),
            externals: Vec::new(),
        },
    )?;
    // The external files are hashed only for a program that is kept.
    if let (Some(cache), Some(key)) = (how.cache, &key)
        && let Some(externals) = external_hashes(&record, &dir)
    {
        record.externals = externals;
        // The kept bytes go first: a program is never found without them.
        // A cache that cannot be written only makes the next run slower.
        if kept.is_empty() || Jit::store_data(cache, key, &kept).is_ok() {
            let meta = format!(
                "{}{}{}\n",
                interface.encode().trim_end(),
                RECORD,
                record.encode()
            );
            let _ = jit.store(cache, key, &meta);
        }
    }
    Ok(OnnxProgram {
        program: CpuProgram {
            jit,
            interface,
            carried,
            cached: false,
            front,
        },
        inputs: record.inputs,
        outputs: record.outputs,
    })
}

/// The external data files `record`'s weights are read from, with their
/// SHA-256; `None` when one cannot be read (the program is then not kept).
fn external_hashes(record: &Record, dir: &std::path::Path) -> Option<Vec<(String, String)>> {
    let mut externals: Vec<(String, String)> = Vec::new();
    for (_, place) in &record.weights {
        if let Place::External { file, .. } = place
            && !externals.iter().any(|(f, _)| f == file)
        {
            let digest = Sha256::digest(map(&dir.join(file)).ok()?);
            externals.push((file.clone(), hex(&digest)));
        }
    }
    Some(externals)
}

/// The weights an import gave (`weights`) as values of the types
/// `interface` declares: the file's bytes as they are where they are a
/// tensor's (initializers), else the folded values. Returns them, `record`
/// completed with where each one's bytes are (the external files' hashes
/// are added only when the program is kept), and the bytes to keep beside
/// the program (the folded ones').
fn bind_imported(
    path: &str,
    weights: Vec<(String, dlc_onnx::Data)>,
    interface: &Interface,
    model: &bytes::Bytes,
    mut record: Record,
) -> Result<(Carried, Record, Vec<u8>), DriverError> {
    let mut carried = Vec::with_capacity(weights.len());
    let mut kept = Vec::new();
    for (name, d) in weights {
        // Those of other entry points are left out.
        let Some(p) = interface.params.iter().find(|p| p.weight && p.name == name) else {
            continue;
        };
        let bad = |e: dlc_runtime::TensorError| {
            DriverError::Usage(format!("{path}: weight `{name}`: {e}"))
        };
        let stored = d
            .stored
            .filter(|_| d.dtype == p.ty.dtype)
            .and_then(|s| Some((RawTensor::new(p.ty.clone(), s.bytes.clone()).ok()?, s)));
        let (value, place) = match stored {
            Some((t, s)) => {
                let len = t.bytes().len();
                let place = match s.external {
                    Some((file, offset)) => {
                        let offset = usize::try_from(offset).map_err(|_| {
                            DriverError::Usage(format!(
                                "{path}: weight `{name}` is too far in {file}"
                            ))
                        })?;
                        Place::External { file, offset, len }
                    }
                    None => {
                        // The bytes are a slice of the mapped model.
                        let offset = (t.bytes().as_ptr() as usize)
                            .checked_sub(model.as_ptr() as usize)
                            .filter(|o| o + len <= model.len())
                            .ok_or_else(|| {
                                DriverError::Internal(format!(
                                    "{path}: weight `{name}`'s bytes are not in the model file"
                                ))
                            })?;
                        Place::Model { offset, len }
                    }
                };
                (Value::Raw(t), place)
            }
            None => {
                let values = d.values.into_vec();
                let t = HostTensor::new(p.ty.clone(), values).map_err(bad)?;
                let offset = kept.len().next_multiple_of(64);
                kept.resize(offset, 0);
                kept.extend_from_slice(&t.to_le_bytes());
                let len = kept.len() - offset;
                (Value::Host(t), Place::Kept { offset, len })
            }
        };
        record.weights.push((name.clone(), place));
        carried.push((name, value));
    }
    Ok((carried, record, kept))
}

/// The weights `record` places, read where they are: slices of `model`,
/// of its external files (each checked against its hash) and of the bytes
/// kept beside the program (`kept`, read only when some weight is there);
/// `None` when any is not where it was (the program is compiled again).
fn weights_in_place(
    record: &Record,
    interface: &Interface,
    model: &bytes::Bytes,
    dir: &std::path::Path,
    kept: impl FnOnce() -> Option<Vec<u8>>,
) -> Option<Carried> {
    let mut externals = std::collections::HashMap::new();
    for (file, digest) in &record.externals {
        let bytes = map(&dir.join(file)).ok()?;
        if hex(&Sha256::digest(&bytes)) != *digest {
            return None;
        }
        externals.insert(file.as_str(), bytes);
    }
    let kept = if record
        .weights
        .iter()
        .any(|(_, p)| matches!(p, Place::Kept { .. }))
    {
        bytes::Bytes::from(kept()?)
    } else {
        bytes::Bytes::new()
    };
    let slice = |b: &bytes::Bytes, offset: usize, len: usize| {
        (offset.checked_add(len)? <= b.len()).then(|| b.slice(offset..offset + len))
    };
    let mut carried = Vec::with_capacity(record.weights.len());
    for (name, place) in &record.weights {
        let p = interface
            .params
            .iter()
            .find(|p| p.weight && p.name == *name)?;
        let bytes = match place {
            Place::Model { offset, len } => slice(model, *offset, *len)?,
            Place::External { file, offset, len } => {
                slice(externals.get(file.as_str())?, *offset, *len)?
            }
            Place::Kept { offset, len } => slice(&kept, *offset, *len)?,
        };
        carried.push((
            name.clone(),
            Value::Raw(RawTensor::new(p.ty.clone(), bytes).ok()?),
        ));
    }
    Some(carried)
}
