//! Constant tensors: ONNX `TensorProto`s decoded into values the importer
//! can fold and print, and the element types dlc has.

use std::cell::OnceCell;
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Component, Path};
use std::rc::Rc;

use dlc_core::DType;

use crate::pb::{TensorProto, tensor_proto::DataType};

/// A tensor whose elements are known at import time (an initializer, a
/// `Constant`, or an op folded on them). Elements are held as `f64`, which
/// is exact for every dlc element type except i64 beyond 2^53.
#[derive(Debug, Clone, PartialEq)]
pub struct Data {
    /// Element type.
    pub dtype: DType,
    /// Extents.
    pub shape: Vec<usize>,
    /// Row-major elements (decoded from [`Data::stored`] when first read).
    pub values: Values,
    /// The same elements as a file stores them, when they are an
    /// initializer's (or a `Constant`'s) bytes as they are, or reshaped:
    /// what a run binds without reading them as `f64`s, and where a cached
    /// program finds them again without importing the model.
    pub stored: Option<Stored>,
}

/// A tensor's elements as `f64`s, shared by its clones. Those of a
/// tensor stored in the file are decoded from its bytes when first read:
/// a weight the importer only passes on to the run (most of a model's
/// bytes) is never held as `f64`s.
#[derive(Clone)]
pub struct Values(Rc<LazyValues>);

struct LazyValues {
    decoded: OnceCell<Vec<f64>>,
    /// The bytes to decode, when not given decoded.
    from: Option<(DType, prost::bytes::Bytes)>,
}

impl Values {
    /// Values given decoded.
    pub fn new(values: Vec<f64>) -> Values {
        Values(Rc::new(LazyValues {
            decoded: OnceCell::from(values),
            from: None,
        }))
    }

    /// The values of `bytes` (little-endian, of `dtype`), decoded when
    /// first read.
    fn of_bytes(dtype: DType, bytes: prost::bytes::Bytes) -> Values {
        Values(Rc::new(LazyValues {
            decoded: OnceCell::new(),
            from: Some((dtype, bytes)),
        }))
    }

    /// Which elements these are: equal for clones of one tensor's values
    /// (an initializer passed on through `Identity` or a reshape), distinct
    /// for any other values alive at the same time.
    pub(crate) fn identity(&self) -> usize {
        Rc::as_ptr(&self.0) as usize
    }

    /// Whether they have been decoded (or were given so).
    pub fn is_decoded(&self) -> bool {
        self.0.decoded.get().is_some()
    }

    /// The values, owned (no copy when nothing else shares them).
    pub fn into_vec(self) -> Vec<f64> {
        match Rc::try_unwrap(self.0) {
            Ok(lazy) => {
                let from = lazy.from;
                lazy.decoded
                    .into_inner()
                    .unwrap_or_else(|| decode_bytes(from.as_ref()))
            }
            Err(rc) => Values(rc).to_vec(),
        }
    }
}

fn decode_bytes(from: Option<&(DType, prost::bytes::Bytes)>) -> Vec<f64> {
    from.map(|(dtype, bytes)| dtype.from_le_bytes_all(bytes))
        .unwrap_or_default()
}

impl std::ops::Deref for Values {
    type Target = Vec<f64>;
    fn deref(&self) -> &Vec<f64> {
        self.0
            .decoded
            .get_or_init(|| decode_bytes(self.0.from.as_ref()))
    }
}

impl PartialEq for Values {
    fn eq(&self, other: &Values) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for Values {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_decoded() {
            f.debug_list().entries(self.iter()).finish()
        } else {
            write!(f, "[not decoded]")
        }
    }
}

/// A tensor's elements, byte for byte, in a model's files: little-endian
/// values of its element type.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The bytes: a slice of the model's buffer ([`crate::import_bytes`]),
    /// or read from its external data file.
    pub bytes: prost::bytes::Bytes,
    /// The external data file (its location, relative to the model's
    /// directory) and the bytes' offset in it; `None`: the model file.
    pub external: Option<(String, u64)>,
}

/// The same stored bytes: the same place in the same file.
impl PartialEq for Stored {
    fn eq(&self, other: &Stored) -> bool {
        self.bytes.as_ptr() == other.bytes.as_ptr()
            && self.bytes.len() == other.bytes.len()
            && self.external == other.external
    }
}

impl Data {
    /// A tensor from its parts.
    pub fn new(dtype: DType, shape: Vec<usize>, values: Vec<f64>) -> Self {
        Data {
            dtype,
            shape,
            values: Values::new(values),
            stored: None,
        }
    }

    /// Its number of elements, from its shape (its values are not read).
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as integers (shape operands, axes).
    pub fn ints(&self) -> Vec<i64> {
        self.values.iter().map(|&v| v as i64).collect()
    }
}

/// The element types dlc has, as error messages list them.
pub(crate) const SUPPORTED_TYPES: &str =
    "dlc has float16/32/64, bfloat16, int8..int64, uint8..uint64 and bool";

/// The name of an ONNX element type, as error messages write it.
pub fn onnx_type_name(code: i32) -> String {
    DataType::try_from(code)
        .map(|d| d.as_str_name().to_ascii_lowercase())
        .unwrap_or_else(|_| format!("type {code}"))
}

/// The dlc element type of an ONNX one, if dlc has it.
pub fn dtype_of(code: i32) -> Option<DType> {
    Some(match DataType::try_from(code).ok()? {
        DataType::Float => DType::F32,
        DataType::Double => DType::F64,
        DataType::Float16 => DType::F16,
        DataType::Bfloat16 => DType::BF16,
        DataType::Int8 => DType::I8,
        DataType::Int16 => DType::I16,
        DataType::Int32 => DType::I32,
        DataType::Int64 => DType::I64,
        DataType::Uint8 => DType::U8,
        DataType::Uint16 => DType::U16,
        DataType::Uint32 => DType::U32,
        DataType::Uint64 => DType::U64,
        DataType::Bool => DType::Bool,
        _ => return None,
    })
}

/// The ONNX element type code of a dlc element type (the inverse of
/// [`dtype_of`]).
pub fn onnx_code(d: DType) -> i32 {
    let t = match d {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        DType::I8 => DataType::Int8,
        DType::I16 => DataType::Int16,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::U8 => DataType::Uint8,
        DType::U16 => DataType::Uint16,
        DType::U32 => DataType::Uint32,
        DType::U64 => DataType::Uint64,
        DType::Bool => DataType::Bool,
    };
    t as i32
}

/// The bytes of a tensor stored outside the model (`external_data`: a
/// `location` relative to the model's directory, an `offset` and a
/// `length`), read from `dir`. A location that is absolute or leaves the
/// directory is refused, as ONNX's checker refuses it.
fn external_bytes(
    t: &TensorProto,
    name: &str,
    dir: Option<&Path>,
) -> Result<(Vec<u8>, String, u64), String> {
    let field = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key() == key)
            .map(|e| e.value())
    };
    let location = field("location")
        .ok_or_else(|| format!("{name} keeps its data in an external file but names none"))?;
    let Some(dir) = dir else {
        return Err(format!(
            "{name} keeps its data in the external file `{location}`, and a model given as \
             bytes has no directory to find it in; import the model from its file"
        ));
    };
    let rel = Path::new(location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "{name}: external data location `{location}` must be a path inside the model's \
             directory"
        ));
    }
    let number = |key: &str| -> Result<Option<u64>, String> {
        field(key)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("{name}: external data {key} `{v}` is not a byte count"))
            })
            .transpose()
    };
    let (offset, length) = (number("offset")?.unwrap_or(0), number("length")?);
    let path = dir.join(rel);
    let mut file =
        File::open(&path).map_err(|e| format!("{name}: cannot open {}: {e}", path.display()))?;
    let size = file
        .metadata()
        .map_err(|e| format!("{name}: cannot read {}: {e}", path.display()))?
        .len();
    let length = length.unwrap_or(size.saturating_sub(offset));
    if offset.checked_add(length).is_none_or(|end| end > size) {
        return Err(format!(
            "{name}: bytes {offset}..{} of {} are asked for, the file holds {size}",
            offset.saturating_add(length),
            path.display()
        ));
    }
    let mut bytes = vec![0; usize::try_from(length).map_err(|_| format!("{name} is too large"))?];
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.read_exact(&mut bytes))
        .map_err(|e| format!("{name}: cannot read {}: {e}", path.display()))?;
    Ok((bytes, location.to_string(), offset))
}

/// Decodes a tensor's elements from whichever field holds them, or from
/// the external file it names, relative to the model's directory `dir`.
pub fn decode(t: &TensorProto, dir: Option<&Path>) -> Result<Data, String> {
    let name = if t.name().is_empty() {
        "a constant".to_string()
    } else {
        format!("tensor `{}`", t.name())
    };
    let external = if t.data_location == Some(1) {
        Some(external_bytes(t, &name, dir)?)
    } else {
        None
    };
    let dtype = dtype_of(t.data_type()).ok_or_else(|| {
        format!(
            "{name} has element type {}, which dlc does not support ({SUPPORTED_TYPES})",
            onnx_type_name(t.data_type())
        )
    })?;
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(format!("{name} has a negative dimension {d}"));
        }
        shape.push(d as usize);
    }
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= 1 << 31)
        .ok_or_else(|| format!("{name} has too many elements"))?;
    let stored = match external {
        Some((bytes, location, offset)) => Some(Stored {
            bytes: bytes.into(),
            external: Some((location, offset)),
        }),
        None => t
            .raw_data
            .clone()
            .filter(|r| !r.is_empty())
            .map(|bytes| Stored {
                bytes,
                external: None,
            }),
    };
    let values: Values = if let Some(raw) = stored.as_ref().map(|s| &s.bytes) {
        let width = dtype.size_bytes();
        if raw.len() != count * width {
            let field = if stored.as_ref().is_some_and(|s| s.external.is_some()) {
                "its external data"
            } else {
                "raw_data"
            };
            return Err(format!(
                "{name}: {field} holds {} bytes, {count} {dtype} elements need {}",
                raw.len(),
                count * width
            ));
        }
        Values::of_bytes(dtype, raw.clone())
    } else {
        Values::new(match dtype {
            DType::F32 => t.float_data.iter().map(|&v| f64::from(v)).collect(),
            DType::F64 => t.double_data.clone(),
            // f16 and bf16 are stored as their bits in int32_data.
            DType::F16 => t
                .int32_data
                .iter()
                .map(|&v| half::f16::from_bits(v as u16).to_f64())
                .collect(),
            DType::BF16 => t
                .int32_data
                .iter()
                .map(|&v| half::bf16::from_bits(v as u16).to_f64())
                .collect(),
            // The narrow integers are stored widened in int32_data.
            DType::I8 | DType::I16 | DType::I32 | DType::U8 | DType::U16 => t
                .int32_data
                .iter()
                .map(|&v| dtype.round(f64::from(v)))
                .collect(),
            DType::U32 | DType::U64 => t.uint64_data.iter().map(|&v| v as f64).collect(),
            DType::Bool => t
                .int32_data
                .iter()
                .map(|&v| f64::from(u8::from(v != 0)))
                .collect(),
            DType::I64 => t.int64_data.iter().map(|&v| v as f64).collect(),
        })
    };
    // Bytes of the right length hold `count` elements.
    if values.is_decoded() && values.len() != count {
        return Err(format!(
            "{name} holds {} elements, its shape {shape:?} needs {count}",
            values.len()
        ));
    }
    Ok(Data {
        dtype,
        shape,
        values,
        stored,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_type_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(dtype_of(onnx_code(d)), Some(d));
        }
    }
}
