//! Host tensors, their `.npy` files and random inputs.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::Path;

use dlc_core::{DType, TensorType};
use npyz::WriterBuilder;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// A tensor in host memory, its elements stored as f64 values that are each
/// exactly representable in its element type.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Element type and shape.
    pub ty: TensorType,
    /// Elements, row-major.
    pub data: Vec<f64>,
}

/// A tensor held as the little-endian bytes of its element type, as a file
/// stores them (an ONNX model's initializer: a slice of the mapped model
/// file). Compiled code takes it by a copy of its bytes, never as `f64`s.
#[derive(Debug, Clone)]
pub struct RawTensor {
    ty: TensorType,
    bytes: bytes::Bytes,
}

impl RawTensor {
    /// `bytes` as a tensor of type `ty`: an error when their length is not
    /// the type's, or (bool) a byte is neither 0 nor 1.
    pub fn new(ty: TensorType, bytes: bytes::Bytes) -> Result<RawTensor, TensorError> {
        let size = ty.dtype.size_bytes();
        let expected = ty.num_elements().unwrap_or(usize::MAX);
        if expected.checked_mul(size) != Some(bytes.len()) {
            return Err(TensorError::Length {
                ty,
                expected,
                got: bytes.len() / size,
            });
        }
        if ty.dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err(TensorError::Bytes(format!(
                "{ty}: a boolean's byte is 0 or 1"
            )));
        }
        Ok(RawTensor { ty, bytes })
    }

    /// Its type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// Its elements, as little-endian bytes of its element type.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The same elements as `f64`s (for the interpreters).
    pub fn to_host(&self) -> Result<HostTensor, TensorError> {
        HostTensor::from_le_bytes(self.ty.clone(), &self.bytes)
    }
}

/// A value given for a parameter: elements as `f64`s, or a tensor's bytes
/// as a file holds them.
#[derive(Debug, Clone)]
pub enum Value {
    /// Elements as `f64`s.
    Host(HostTensor),
    /// Bytes as stored.
    Raw(RawTensor),
}

impl Value {
    /// Its type.
    pub fn ty(&self) -> &TensorType {
        match self {
            Value::Host(t) => &t.ty,
            Value::Raw(t) => t.ty(),
        }
    }

    /// As a tensor of `f64`s (a copy for bytes).
    pub fn into_host(self) -> Result<HostTensor, TensorError> {
        match self {
            Value::Host(t) => Ok(t),
            Value::Raw(t) => t.to_host(),
        }
    }
}

impl From<HostTensor> for Value {
    fn from(t: HostTensor) -> Value {
        Value::Host(t)
    }
}

/// How random values for a float parameter are drawn (`--random-inputs`):
/// the compiler picks one per parameter from the ops that read it
/// (`dlc_driver::random_ranges`), and a compiled GPU module records it, so
/// that a runner with no compiler draws the same inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RandomRange {
    /// Uniform in [-1, 1).
    Unit,
    /// Uniform in [0.25, 1.25): an op needs the value positive.
    Positive,
    /// Uniform in [-s, s): the weights of a product or convolution, scaled
    /// by `s = 1 / sqrt(fan-in)` as common initializations are, so that
    /// activations stay near 1 however deep the model.
    Weight(f64),
}

/// Why a tensor could not be read, written or made.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    /// The file could not be opened, read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The system error.
        source: std::io::Error,
    },
    /// The file is not an `.npy` array dlc can read.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A tensor's bytes do not hold values of its type.
    #[error("{0}")]
    Bytes(String),
    /// The tensor's data length disagrees with its type.
    #[error("{ty} needs {expected} elements, got {got}")]
    Length {
        /// The type.
        ty: TensorType,
        /// Elements the type has.
        expected: usize,
        /// Elements given.
        got: usize,
    },
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> TensorError + '_ {
    move |source| TensorError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl HostTensor {
    /// A tensor from a type and row-major elements, rounded to the type.
    pub fn new(ty: TensorType, data: Vec<f64>) -> Result<HostTensor, TensorError> {
        let expected = ty.num_elements().unwrap_or(usize::MAX);
        if data.len() != expected {
            return Err(TensorError::Length {
                ty,
                expected,
                got: data.len(),
            });
        }
        let data = data.into_iter().map(|x| ty.dtype.round(x)).collect();
        Ok(HostTensor { ty, data })
    }

    /// Random elements: floats uniform in [-1, 1), signed integers uniform
    /// in [-10, 10], unsigned ones in [0, 20], booleans fair coins; the
    /// same seed gives the same tensor.
    pub fn random(ty: &TensorType, rng: &mut StdRng) -> HostTensor {
        HostTensor {
            ty: ty.clone(),
            data: HostTensor::random_values(ty, rng).collect(),
        }
    }

    /// The elements [`HostTensor::random`] draws, one at a time.
    pub fn random_values<'r>(
        ty: &TensorType,
        rng: &'r mut StdRng,
    ) -> impl Iterator<Item = f64> + use<'r> {
        let n = ty.num_elements().unwrap_or(0);
        let dtype = ty.dtype;
        (0..n).map(move |_| match dtype {
            d if d.is_float() => d.round(rng.random_range(-1.0..1.0)),
            DType::Bool => f64::from(u8::from(rng.random_bool(0.5))),
            d if d.is_unsigned() => rng.random_range(0i64..=20) as f64,
            _ => rng.random_range(-10i64..=10) as f64,
        })
    }

    /// The elements [`HostTensor::random_values`] draws, mapped into
    /// `range` for a float type (others are drawn as they are): what
    /// `--random-inputs` gives a parameter, the same on every machine.
    pub fn random_values_in<'r>(
        ty: &TensorType,
        range: RandomRange,
        rng: &'r mut StdRng,
    ) -> impl Iterator<Item = f64> + use<'r> {
        let dtype = ty.dtype;
        HostTensor::random_values(ty, rng).map(move |v| match range {
            _ if !dtype.is_float() => v,
            RandomRange::Unit => v,
            RandomRange::Positive => dtype.round(v.abs() + 0.25),
            RandomRange::Weight(s) => dtype.round(v * s),
        })
    }

    /// The elements as little-endian bytes of the element type (bool: one
    /// byte each), as compiled code reads them.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.ty.dtype.to_le_bytes_all(&self.data)
    }

    /// A tensor from little-endian bytes of its element type.
    pub fn from_le_bytes(ty: TensorType, bytes: &[u8]) -> Result<HostTensor, TensorError> {
        let size = ty.dtype.size_bytes();
        let data = bytes
            .chunks_exact(size)
            .map(|c| ty.dtype.from_le_bytes(c))
            .collect();
        HostTensor::new(ty, data)
    }

    /// Reads an `.npy` file. Its element type maps to dlc's: `<f4` f32,
    /// `<f8` f64, `<f2` f16, `|i1`..`<i8` i8..i64, `|u1`..`<u8` u8..u64,
    /// `|b1` bool. NumPy has no bfloat16: read a float32 file with
    /// `as_dtype = Some(BF16)` to round it.
    pub fn read_npy(path: &Path, as_dtype: Option<DType>) -> Result<HostTensor, TensorError> {
        let file = File::open(path).map_err(io_err(path))?;
        let npy = npyz::NpyFile::new(BufReader::new(file)).map_err(|e| TensorError::Format {
            path: path.display().to_string(),
            message: format!("not a readable .npy file: {e}"),
        })?;
        let format_err = |message: String| TensorError::Format {
            path: path.display().to_string(),
            message,
        };
        let fortran = npy.order() == npyz::Order::Fortran;
        let shape: Vec<usize> = npy
            .shape()
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format_err("dimension too large".into())))
            .collect::<Result<_, _>>()?;
        let npyz::DType::Plain(ts) = npy.dtype() else {
            return Err(format_err("structured arrays are not supported".into()));
        };
        let descr = ts.to_string();
        let file_dtype = match (ts.type_char(), ts.size_field()) {
            (npyz::TypeChar::Float, 4) => DType::F32,
            (npyz::TypeChar::Float, 8) => DType::F64,
            (npyz::TypeChar::Float, 2) => DType::F16,
            (npyz::TypeChar::Int, 1) => DType::I8,
            (npyz::TypeChar::Int, 2) => DType::I16,
            (npyz::TypeChar::Int, 4) => DType::I32,
            (npyz::TypeChar::Int, 8) => DType::I64,
            (npyz::TypeChar::Uint, 1) => DType::U8,
            (npyz::TypeChar::Uint, 2) => DType::U16,
            (npyz::TypeChar::Uint, 4) => DType::U32,
            (npyz::TypeChar::Uint, 8) => DType::U64,
            (npyz::TypeChar::Bool, 1) => DType::Bool,
            _ => {
                return Err(format_err(format!(
                    "element type `{descr}` has no dlc equivalent (dlc reads float16/32/64, int8..int64, uint8..uint64 and bool)"
                )));
            }
        };
        let read = |e: std::io::Error| format_err(format!("reading data: {e}"));
        macro_rules! read_as {
            ($t:ty, $conv:expr) => {
                npy.into_vec::<$t>()
                    .map_err(read)?
                    .into_iter()
                    .map($conv)
                    .collect()
            };
        }
        let data: Vec<f64> = match file_dtype {
            DType::F32 => read_as!(f32, f64::from),
            DType::F64 => read_as!(f64, |x| x),
            DType::F16 => read_as!(half::f16, |x| x.to_f64()),
            DType::I8 => read_as!(i8, f64::from),
            DType::I16 => read_as!(i16, f64::from),
            DType::I32 => read_as!(i32, f64::from),
            DType::I64 => read_as!(i64, |x| x as f64),
            DType::U8 => read_as!(u8, f64::from),
            DType::U16 => read_as!(u16, f64::from),
            DType::U32 => read_as!(u32, f64::from),
            DType::U64 => read_as!(u64, |x| x as f64),
            DType::Bool => read_as!(bool, |b| f64::from(u8::from(b))),
            DType::BF16 => unreachable!("no .npy element type maps to bf16"),
        };
        let data = if fortran {
            fortran_to_c(&shape, &data)
        } else {
            data
        };
        let dtype = match as_dtype {
            Some(DType::BF16) if file_dtype == DType::F32 => DType::BF16,
            _ => file_dtype,
        };
        HostTensor::new(TensorType::new(dtype, shape), data)
    }

    /// Writes an `.npy` file; bf16 is written as float32 (NumPy has no
    /// bfloat16), which represents every bf16 value exactly.
    pub fn write_npy(&self, path: &Path) -> Result<(), TensorError> {
        let file = File::create(path).map_err(io_err(path))?;
        let shape: Vec<u64> = self.ty.shape.iter().map(|&d| d as u64).collect();
        let w = BufWriter::new(file);
        let io = io_err(path);
        macro_rules! write_as {
            ($t:ty, $conv:expr) => {{
                let mut writer = npyz::WriteOptions::<$t>::new()
                    .default_dtype()
                    .shape(&shape)
                    .writer(w)
                    .begin_nd()
                    .map_err(&io)?;
                writer.extend(self.data.iter().map($conv)).map_err(&io)?;
                writer.finish().map_err(&io)
            }};
        }
        match self.ty.dtype {
            DType::F32 | DType::BF16 => write_as!(f32, |&x| x as f32),
            DType::F16 => write_as!(half::f16, |&x| half::f16::from_f64(x)),
            DType::F64 => write_as!(f64, |&x| x),
            DType::I8 => write_as!(i8, |&x| x as i8),
            DType::I16 => write_as!(i16, |&x| x as i16),
            DType::I32 => write_as!(i32, |&x| x as i32),
            DType::I64 => write_as!(i64, |&x| x as i64),
            DType::U8 => write_as!(u8, |&x| x as u8),
            DType::U16 => write_as!(u16, |&x| x as u16),
            DType::U32 => write_as!(u32, |&x| x as u32),
            DType::U64 => write_as!(u64, |&x| x as u64),
            DType::Bool => write_as!(bool, |&x| x != 0.0),
        }
    }
}

/// Reorders column-major (Fortran-order) elements into row-major order.
fn fortran_to_c(shape: &[usize], data: &[f64]) -> Vec<f64> {
    // Column-major stride of each axis.
    let mut strides = vec![1usize; shape.len()];
    for i in 1..shape.len() {
        strides[i] = strides[i - 1] * shape[i - 1];
    }
    let mut index = vec![0usize; shape.len()];
    let mut out = Vec::with_capacity(data.len());
    for _ in 0..data.len() {
        out.push(
            data[index
                .iter()
                .zip(&strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()],
        );
        // Advance the row-major index, last axis fastest.
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    out
}

/// A deterministic generator for random inputs.
pub fn seeded_rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor's bytes are taken only when they hold its type: their
    /// length, and for bool bytes of 0 or 1; they read back as the values.
    #[test]
    fn raw_tensors_check_their_bytes() {
        let f32x3 = TensorType::new(DType::F32, vec![3]);
        let bytes: Vec<u8> = [1.5f32, -2.0, 0.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t = RawTensor::new(f32x3.clone(), bytes.clone().into()).unwrap();
        assert_eq!(t.to_host().unwrap().data, [1.5, -2.0, 0.25]);
        assert_eq!(Value::Raw(t).into_host().unwrap().ty, f32x3);
        let short = RawTensor::new(f32x3, bytes[..8].to_vec().into());
        assert!(matches!(short, Err(TensorError::Length { got: 2, .. })));
        let bools = TensorType::new(DType::Bool, vec![2]);
        assert!(RawTensor::new(bools.clone(), vec![0u8, 1].into()).is_ok());
        let e = RawTensor::new(bools, vec![0u8, 2].into()).unwrap_err();
        assert_eq!(e.to_string(), "bool[2]: a boolean's byte is 0 or 1");
    }

    #[test]
    fn npy_round_trips_every_dtype() {
        let dir = std::env::temp_dir().join(format!("dlc-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut rng = seeded_rng(7);
        for dtype in DType::ALL {
            let ty = TensorType::new(dtype, vec![2, 3]);
            let t = HostTensor::random(&ty, &mut rng);
            let path = dir.join(format!("{dtype}.npy"));
            t.write_npy(&path).unwrap();
            let back = HostTensor::read_npy(&path, Some(dtype)).unwrap();
            assert_eq!(back, t, "{dtype}");
        }
        let scalar = HostTensor::new(TensorType::scalar(DType::F32), vec![0.1]).unwrap();
        let path = dir.join("scalar.npy");
        scalar.write_npy(&path).unwrap();
        assert_eq!(HostTensor::read_npy(&path, None).unwrap(), scalar);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fortran_order_is_read_in_row_major_order() {
        // A 2x3 array [[1, 2, 3], [4, 5, 6]] saved by NumPy in Fortran order
        // (as `np.save(path, np.asfortranarray(a))` writes it).
        let header = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }";
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        let padded = format!("{header:<117}\n");
        bytes.extend((padded.len() as u16).to_le_bytes());
        bytes.extend(padded.as_bytes());
        for v in [1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0] {
            bytes.extend(v.to_le_bytes());
        }
        let dir = std::env::temp_dir().join(format!("dlc-npy-f-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.npy");
        std::fs::write(&path, bytes).unwrap();
        let t = HostTensor::read_npy(&path, None).unwrap();
        assert_eq!(t.ty, TensorType::new(DType::F32, vec![2, 3]));
        assert_eq!(t.data, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bytes_round_trip_every_dtype() {
        let mut rng = seeded_rng(3);
        for dtype in DType::ALL {
            let t = HostTensor::random(&TensorType::new(dtype, vec![5]), &mut rng);
            let bytes = t.to_le_bytes();
            assert_eq!(bytes.len(), 5 * dtype.size_bytes());
            assert_eq!(
                HostTensor::from_le_bytes(t.ty.clone(), &bytes).unwrap(),
                t,
                "{dtype}"
            );
        }
    }

    #[test]
    fn bad_files_are_errors() {
        let dir = std::env::temp_dir().join(format!("dlc-npy-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("garbage.npy");
        std::fs::write(&path, b"not numpy at all").unwrap();
        assert!(matches!(
            HostTensor::read_npy(&path, None),
            Err(TensorError::Format { .. })
        ));
        assert!(matches!(
            HostTensor::read_npy(&dir.join("missing.npy"), None),
            Err(TensorError::Io { .. })
        ));
        assert!(matches!(
            HostTensor::new(TensorType::new(DType::F32, vec![2]), vec![1.0]),
            Err(TensorError::Length { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
