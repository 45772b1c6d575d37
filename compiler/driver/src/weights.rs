//! `--weights PATH`: the values of an entry point's `weight` parameters,
//! from a directory of `NAME.npy` files (what `dlc train --save-weights`
//! writes) or one `.safetensors` file (tensors named as the weights, or
//! `weight.NAME` as `dlc train`'s checkpoint names them), for `dlc run` and
//! `dlc bench` to bind and `dlc compile` to build into the artifact.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use dlc_core::{DType, TensorType};
use dlc_graph::Module;
use dlc_runtime::HostTensor;

use crate::{DriverError, Interface};

/// A `.safetensors` file: its tensors in file order, and its metadata.
pub struct SafeTensorsFile {
    /// Each tensor by name.
    pub tensors: Vec<(String, HostTensor)>,
    /// The header's `__metadata__` (empty when it has none).
    pub metadata: HashMap<String, String>,
}

/// The element type safetensors calls `d`, where dlc has it.
fn dtype_of(d: safetensors::Dtype) -> Option<DType> {
    use safetensors::Dtype as S;
    Some(match d {
        S::F32 => DType::F32,
        S::F64 => DType::F64,
        S::F16 => DType::F16,
        S::BF16 => DType::BF16,
        S::I8 => DType::I8,
        S::I16 => DType::I16,
        S::I32 => DType::I32,
        S::I64 => DType::I64,
        S::U8 => DType::U8,
        S::U16 => DType::U16,
        S::U32 => DType::U32,
        S::U64 => DType::U64,
        S::BOOL => DType::Bool,
        _ => return None,
    })
}

/// How safetensors calls dlc's element type `d` (every one has a name).
pub fn safetensors_dtype(d: DType) -> safetensors::Dtype {
    use safetensors::Dtype as S;
    match d {
        DType::F32 => S::F32,
        DType::F64 => S::F64,
        DType::F16 => S::F16,
        DType::BF16 => S::BF16,
        DType::I8 => S::I8,
        DType::I16 => S::I16,
        DType::I32 => S::I32,
        DType::I64 => S::I64,
        DType::U8 => S::U8,
        DType::U16 => S::U16,
        DType::U32 => S::U32,
        DType::U64 => S::U64,
        DType::Bool => S::BOOL,
    }
}

/// Reads a `.safetensors` file; a file that is not one, or holds a tensor
/// of an element type dlc lacks, is an error naming it.
pub fn read_safetensors(path: &Path) -> Result<SafeTensorsFile, DriverError> {
    let bad = |m: String| DriverError::Usage(format!("{}: {m}", path.display()));
    let data = std::fs::read(path).map_err(|source| DriverError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let st = safetensors::SafeTensors::deserialize(&data)
        .map_err(|e| bad(format!("not a safetensors file ({e})")))?;
    let (_, header) =
        safetensors::SafeTensors::read_metadata(&data).map_err(|e| bad(e.to_string()))?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let mut tensors = Vec::new();
    for (name, view) in st.iter() {
        let dtype = dtype_of(view.dtype()).ok_or_else(|| {
            bad(format!(
                "tensor `{name}` is {:?}, an element type dlc lacks",
                view.dtype()
            ))
        })?;
        let ty = TensorType::new(dtype, view.shape().to_vec());
        let t = HostTensor::from_le_bytes(ty, view.data())
            .map_err(|e| bad(format!("tensor `{name}`: {e}")))?;
        tensors.push((name.to_string(), t));
    }
    Ok(SafeTensorsFile { tensors, metadata })
}

/// Where `--weights PATH` takes tensors from: a directory of `NAME.npy`,
/// or a `.safetensors` file read whole.
pub enum WeightSource {
    /// `DIR/NAME.npy`.
    Dir(PathBuf),
    /// The file's tensors by name, and its path.
    SafeTensors(Vec<(String, HostTensor)>, PathBuf),
}

impl WeightSource {
    /// Opens `path`: a directory, or a file named `*.safetensors`.
    pub fn open(path: &Path) -> Result<WeightSource, DriverError> {
        if path.is_dir() {
            return Ok(WeightSource::Dir(path.to_path_buf()));
        }
        if path.extension().is_some_and(|e| e == "safetensors") {
            let file = read_safetensors(path)?;
            return Ok(WeightSource::SafeTensors(file.tensors, path.to_path_buf()));
        }
        Err(DriverError::Usage(format!(
            "--weights {}: neither a directory of NAME.npy nor a .safetensors file",
            path.display()
        )))
    }

    /// The tensor for parameter `name` of type `ty`, if the source has one:
    /// `NAME.npy`, or the tensor `NAME`, `weight.NAME` or `buffer.NAME` (as
    /// `dlc train`'s checkpoint names weights and buffers). One of another
    /// type is an error naming it.
    pub fn get(&self, name: &str, ty: &TensorType) -> Result<Option<HostTensor>, DriverError> {
        let (t, from) = match self {
            WeightSource::Dir(dir) => {
                let file = dir.join(format!("{name}.npy"));
                if !file.is_file() {
                    return Ok(None);
                }
                let t = HostTensor::read_npy(&file, Some(ty.dtype))?;
                (t, file.display().to_string())
            }
            WeightSource::SafeTensors(tensors, path) => {
                let keys = [
                    name.to_string(),
                    format!("weight.{name}"),
                    format!("buffer.{name}"),
                ];
                let Some((key, t)) = tensors.iter().find(|(n, _)| keys.contains(n)) else {
                    return Ok(None);
                };
                (t.clone(), format!("tensor `{key}` of {}", path.display()))
            }
        };
        if &t.ty != ty {
            return Err(DriverError::Usage(format!(
                "--weights: `{name}` is {ty}, but {from} is {}",
                t.ty
            )));
        }
        Ok(Some(t))
    }

    /// Where a parameter named `name` would be found, for messages.
    pub fn place(&self, name: &str) -> String {
        match self {
            WeightSource::Dir(dir) => dir.join(format!("{name}.npy")).display().to_string(),
            WeightSource::SafeTensors(_, path) => {
                format!("tensor `{name}` or `weight.{name}` of {}", path.display())
            }
        }
    }
}

/// Writes `tensors` (and `metadata`) as the safetensors file `path`,
/// atomically: a temporary file beside it, flushed, then renamed over it,
/// so a process killed while writing leaves the old file whole.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, HostTensor)],
    metadata: HashMap<String, String>,
) -> Result<(), DriverError> {
    let tensors = tensors
        .iter()
        .map(|(name, t)| {
            let bytes = move || t.to_le_bytes();
            (
                name.clone(),
                TensorBytes::Made(t.ty.clone(), Box::new(bytes)),
            )
        })
        .collect();
    write_safetensors_bytes(path, tensors, metadata)
}

/// A tensor for [`write_safetensors_bytes`], of its type: its bytes
/// (little-endian, of its element type) at hand, or made as the file is
/// written.
pub enum TensorBytes<'a> {
    /// Bytes at hand: an initializer's, as a model file stores them.
    Stored(TensorType, &'a [u8]),
    /// Bytes made when the file is written, one tensor's at a time, as many
    /// as the type takes.
    Made(TensorType, Box<dyn Fn() -> Vec<u8> + 'a>),
}

/// A [`TensorBytes`] as the safetensors crate writes it.
struct View<'t, 'a> {
    dtype: safetensors::Dtype,
    shape: &'t [usize],
    len: usize,
    bytes: &'t TensorBytes<'a>,
}

impl safetensors::View for View<'_, '_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        match self.bytes {
            TensorBytes::Stored(_, b) => std::borrow::Cow::Borrowed(b),
            TensorBytes::Made(_, make) => {
                let b = make();
                debug_assert_eq!(b.len(), self.len);
                std::borrow::Cow::Owned(b)
            }
        }
    }
    fn data_len(&self) -> usize {
        self.len
    }
}

/// [`write_safetensors`] of tensors given as their bytes: the file is
/// written as they come, never held whole, nor the tensors' bytes all at
/// once. Stored bytes of another length than their type's are an error.
pub fn write_safetensors_bytes(
    path: &Path,
    tensors: Vec<(String, TensorBytes<'_>)>,
    metadata: HashMap<String, String>,
) -> Result<(), DriverError> {
    let io = |e: std::io::Error| DriverError::Io {
        path: path.display().to_string(),
        source: e,
    };
    let mut views = Vec::with_capacity(tensors.len());
    for (name, t) in &tensors {
        let (TensorBytes::Stored(ty, _) | TensorBytes::Made(ty, _)) = t;
        let len = ty.num_elements().unwrap_or(0) * ty.dtype.size_bytes();
        if let TensorBytes::Stored(_, b) = t
            && b.len() != len
        {
            return Err(DriverError::Usage(format!(
                "{}: tensor `{name}` ({ty}) takes {len} bytes, given {}",
                path.display(),
                b.len()
            )));
        }
        let dtype = safetensors_dtype(ty.dtype);
        let view = View {
            dtype,
            shape: &ty.shape,
            len,
            bytes: t,
        };
        views.push((name.as_str(), view));
    }
    // The crate writes a temporary file beside the one it is given and
    // renames it; this one is then flushed to the disk and renamed over
    // `path`, so a process killed while writing leaves the old file whole.
    let name = path
        .file_name()
        .map_or("out".into(), |n| n.to_string_lossy().to_string());
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let meta = (!metadata.is_empty()).then_some(metadata);
    if let Err(e) = safetensors::serialize_to_file(views, meta, &tmp) {
        let _ = std::fs::remove_file(&tmp);
        return Err(DriverError::Usage(format!("{}: {e}", path.display())));
    }
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The values `--weights path` gives `f`'s weights, by parameter name in
/// the order of `f.weights`, for each weight not named in `given` (bound
/// otherwise: `--input`). `path` is a directory of `NAME.npy` or a
/// `.safetensors` file ([`WeightSource`]); each must be of the weight's
/// type, and a weight without one is an error naming it.
pub fn read_weights(
    f: &Interface,
    path: &Path,
    given: &[String],
) -> Result<Vec<(String, HostTensor)>, DriverError> {
    if !f.has_weights() {
        return Err(DriverError::Usage(format!(
            "--weights: `{}` declares no `weight` parameters",
            f.name
        )));
    }
    weights_from(f, &WeightSource::open(path)?, path, given)
}

/// [`read_weights`] from a source already open.
fn weights_from(
    f: &Interface,
    source: &WeightSource,
    path: &Path,
    given: &[String],
) -> Result<Vec<(String, HostTensor)>, DriverError> {
    f.params
        .iter()
        .filter(|p| p.weight)
        .map(|p| (p.name.as_str(), &p.ty))
        .filter(|(name, _)| !given.iter().any(|g| g == name))
        .map(|(name, ty)| match source.get(name, ty)? {
            Some(t) => Ok((name.to_string(), t)),
            None => Err(DriverError::Usage(format!(
                "--weights {}: no value for weight `{name}` ({})",
                path.display(),
                source.place(name)
            ))),
        })
        .collect()
}

/// Builds the weights `--weights path` gives into every entry point of
/// `module` named in `entries` (every one when empty) that declares
/// weights: each becomes a constant and leaves the signature (`dlc compile
/// --weights`: an artifact that carries its weights). Returns how many
/// were bound; an error when no such entry point declares any.
pub fn bind_weights(
    module: &mut Module,
    entries: &[String],
    path: &Path,
) -> Result<usize, DriverError> {
    let source = WeightSource::open(path)?;
    let mut bound = 0;
    for f in module.functions.iter_mut() {
        if f.weights.is_empty()
            || f.visibility != dlc_graph::Visibility::Public
            || !(entries.is_empty() || entries.contains(&f.name))
        {
            continue;
        }
        let values = weights_from(&Interface::of(f), &source, path, &[])?;
        // In the order of `f.weights` (none given otherwise); bound from
        // the last so that the earlier ones keep their places.
        let indices: Vec<usize> = f.weights.iter().copied().collect();
        for (i, (_, t)) in indices.into_iter().zip(values).rev() {
            f.bind_param(i, t.data);
            bound += 1;
        }
    }
    if bound == 0 {
        return Err(DriverError::Usage(
            "--weights: no entry point declares `weight` parameters".into(),
        ));
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Stored bytes are written as they are and made ones as they are made,
    /// and the file reads back; stored bytes of another length than their
    /// type's are an error that leaves the file as it was.
    #[test]
    fn tensors_are_written_from_their_bytes() {
        let dir = std::env::temp_dir().join(format!("dlc-driver-bytes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.safetensors");
        let ty = |shape: Vec<usize>| TensorType::new(DType::F32, shape);
        let stored = le(&[1.0, 2.0, 3.0, 4.0]);
        let tensors = vec![
            ("a".into(), TensorBytes::Stored(ty(vec![2, 2]), &stored)),
            (
                "b".into(),
                TensorBytes::Made(ty(vec![3]), Box::new(|| le(&[5.0, 6.0, 7.0]))),
            ),
        ];
        write_safetensors_bytes(&path, tensors, HashMap::new()).unwrap();
        let read = read_safetensors(&path).unwrap().tensors;
        let mut got: Vec<(&str, &[usize], &[f64])> = read
            .iter()
            .map(|(n, t)| (n.as_str(), &t.ty.shape[..], &t.data[..]))
            .collect();
        got.sort_by_key(|g| g.0);
        assert_eq!(
            got,
            [
                ("a", &[2, 2][..], &[1.0, 2.0, 3.0, 4.0][..]),
                ("b", &[3][..], &[5.0, 6.0, 7.0][..])
            ]
        );
        let short = vec![("a".into(), TensorBytes::Stored(ty(vec![3, 2]), &stored))];
        let e = write_safetensors_bytes(&path, short, HashMap::new()).unwrap_err();
        assert!(
            e.to_string()
                .contains("tensor `a` (f32[3, 2]) takes 24 bytes, given 16"),
            "{e}"
        );
        assert_eq!(read_safetensors(&path).unwrap().tensors.len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
