use std::fmt;
use std::str::FromStr;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// 8-bit two's complement integer.
    I8,
    /// 16-bit two's complement integer.
    I16,
    /// 32-bit two's complement integer.
    I32,
    /// 64-bit two's complement integer.
    I64,
    /// 8-bit unsigned integer.
    U8,
    /// 16-bit unsigned integer.
    U16,
    /// 32-bit unsigned integer.
    U32,
    /// 64-bit unsigned integer.
    U64,
    /// Boolean.
    Bool,
}

impl DType {
    /// Every element type, in declaration order.
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
    ];

    /// The name used in source and IR text (`f32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bool => "bool",
        }
    }

    /// The name of the matching MLIR builtin type (`f32`, `i1`). MLIR's
    /// arithmetic takes signless integers and says signedness in the op
    /// (`arith.divui`, `arith.cmpi ult`), so `u8` is `i8` there.
    pub fn mlir_name(self) -> &'static str {
        match self {
            DType::Bool => "i1",
            DType::U8 => "i8",
            DType::U16 => "i16",
            DType::U32 => "i32",
            DType::U64 => "i64",
            other => other.name(),
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// Whether this is an integer type (bool excluded), signed or not.
    pub fn is_int(self) -> bool {
        self.int_bits().is_some()
    }

    /// Whether this is an unsigned integer type (bool excluded).
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U8 | DType::U16 | DType::U32 | DType::U64)
    }

    /// The width of an integer type in bits; `None` for floats and bool.
    pub fn int_bits(self) -> Option<u32> {
        match self {
            DType::I8 | DType::U8 => Some(8),
            DType::I16 | DType::U16 => Some(16),
            DType::I32 | DType::U32 => Some(32),
            DType::I64 | DType::U64 => Some(64),
            _ => None,
        }
    }

    /// The least value of an integer type (as f64; `None` for floats and
    /// bool).
    pub fn int_min(self) -> Option<f64> {
        let bits = self.int_bits()?;
        Some(if self.is_unsigned() {
            0.0
        } else {
            -(2f64.powi(bits as i32 - 1))
        })
    }

    /// The greatest value of an integer type (as f64, so `i64`'s and
    /// `u64`'s are rounded up to a power of two; `None` for floats and
    /// bool).
    pub fn int_max(self) -> Option<f64> {
        let bits = self.int_bits()?;
        Some(if self.is_unsigned() {
            2f64.powi(bits as i32) - 1.0
        } else {
            2f64.powi(bits as i32 - 1) - 1.0
        })
    }

    /// The type a reduction over elements of this type accumulates in:
    /// `f32` for the narrow floats `f16` and `bf16` (the result is rounded
    /// to the narrow type once, at the end), the type itself otherwise.
    /// Every execution path follows this rule, so a sum of thousands of
    /// `f16` values does not stall once its partial sum outgrows the
    /// spacing of `f16`.
    pub fn accumulator(self) -> DType {
        match self {
            DType::F16 | DType::BF16 => DType::F32,
            other => other,
        }
    }

    /// Whether this is `f16` or `bf16`, whose arithmetic is carried out in
    /// `f32` wherever one op would otherwise round many times.
    pub fn is_narrow_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// Whether arithmetic is defined on this type.
    pub fn is_numeric(self) -> bool {
        self != DType::Bool
    }

    /// Rounds `x` to the nearest value of this type: floats round to
    /// nearest-even, integers truncate toward zero, saturate to the range
    /// of `i64` (of `u64` for `u64`, above zero) and then wrap as two's
    /// complement to their width (so -1 is 255 in `u8`), and bool is
    /// `x != 0`. NaN becomes 0 in every integer type.
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F32 => x as f32 as f64,
            DType::F64 => x,
            DType::F16 => half::f16::from_f64(x).to_f64(),
            DType::BF16 => half::bf16::from_f64(x).to_f64(),
            DType::I8 => (x as i64) as i8 as f64,
            DType::I16 => (x as i64) as i16 as f64,
            DType::I32 => (x as i64) as i32 as f64,
            DType::I64 => x as i64 as f64,
            DType::U8 => (x as i64) as u8 as f64,
            DType::U16 => (x as i64) as u16 as f64,
            DType::U32 => (x as i64) as u32 as f64,
            DType::U64 if x >= 0.0 => x as u64 as f64,
            DType::U64 => (x as i64) as u64 as f64,
            DType::Bool => f64::from(u8::from(x != 0.0)),
        }
    }

    /// The value of type `self` (an integer type) whose bits are the low
    /// bits of `v`: two's complement wrapping to the type's width.
    pub fn wrap_bits(self, v: i64) -> f64 {
        match self {
            DType::I8 => f64::from(v as i8),
            DType::I16 => f64::from(v as i16),
            DType::I32 => f64::from(v as i32),
            DType::U8 => f64::from(v as u8),
            DType::U16 => f64::from(v as u16),
            DType::U32 => f64::from(v as u32),
            DType::U64 => v as u64 as f64,
            _ => v as f64,
        }
    }

    /// An integer value as the signed integer of the same bits, the way
    /// signless integer IR (MLIR, LLVM) spells a constant: 255 in `u8` is
    /// -1. For signed types this is the value itself.
    pub fn signless(self, x: f64) -> i64 {
        match self {
            DType::U8 => i64::from(x as u8 as i8),
            DType::U16 => i64::from(x as u16 as i16),
            DType::U32 => i64::from(x as u32 as i32),
            DType::U64 => x as u64 as i64,
            _ => x as i64,
        }
    }

    /// Appends `x` (a value of this type) as little-endian bytes of the
    /// type, the layout of tensors in memory (bool: one byte, 0 or 1).
    pub fn push_le_bytes(self, x: f64, out: &mut Vec<u8>) {
        let at = out.len();
        out.resize(at + self.size_bytes(), 0);
        self.write_le_bytes(x, &mut out[at..]);
    }

    /// Writes `x` as this type's little-endian bytes into `out`
    /// (`out.len() == self.size_bytes()`), converting as
    /// [`DType::push_le_bytes`] does.
    pub fn write_le_bytes(self, x: f64, out: &mut [u8]) {
        match self {
            DType::F32 => out.copy_from_slice(&(x as f32).to_le_bytes()),
            DType::F64 => out.copy_from_slice(&x.to_le_bytes()),
            DType::F16 => out.copy_from_slice(&half::f16::from_f64(x).to_le_bytes()),
            DType::BF16 => out.copy_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
            DType::I8 => out.copy_from_slice(&(x as i8).to_le_bytes()),
            DType::I16 => out.copy_from_slice(&(x as i16).to_le_bytes()),
            DType::I32 => out.copy_from_slice(&(x as i32).to_le_bytes()),
            DType::I64 => out.copy_from_slice(&(x as i64).to_le_bytes()),
            DType::U8 => out[0] = x as u8,
            DType::U16 => out.copy_from_slice(&(x as u16).to_le_bytes()),
            DType::U32 => out.copy_from_slice(&(x as u32).to_le_bytes()),
            DType::U64 => out.copy_from_slice(&(x as u64).to_le_bytes()),
            DType::Bool => out[0] = u8::from(x != 0.0),
        }
    }

    /// The value of one element from its little-endian bytes
    /// (`b.len() == self.size_bytes()`; bool is any non-zero byte).
    pub fn from_le_bytes(self, b: &[u8]) -> f64 {
        let b2 = || [b[0], b[1]];
        let b4 = || [b[0], b[1], b[2], b[3]];
        let b8 = || [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
        match self {
            DType::F32 => f64::from(f32::from_le_bytes(b4())),
            DType::F64 => f64::from_le_bytes(b8()),
            DType::F16 => half::f16::from_le_bytes(b2()).to_f64(),
            DType::BF16 => half::bf16::from_le_bytes(b2()).to_f64(),
            DType::I8 => f64::from(b[0] as i8),
            DType::I16 => f64::from(i16::from_le_bytes(b2())),
            DType::I32 => f64::from(i32::from_le_bytes(b4())),
            DType::I64 => i64::from_le_bytes(b8()) as f64,
            DType::U8 => f64::from(b[0]),
            DType::U16 => f64::from(u16::from_le_bytes(b2())),
            DType::U32 => f64::from(u32::from_le_bytes(b4())),
            DType::U64 => u64::from_le_bytes(b8()) as f64,
            DType::Bool => f64::from(u8::from(b[0] != 0)),
        }
    }

    /// Every element of `b` (little-endian, [`Self::size_bytes`] each; a
    /// short tail is ignored), as [`Self::from_le_bytes`] reads one: the
    /// type is matched once, not per element (an imported model's weights).
    pub fn from_le_bytes_all(self, b: &[u8]) -> Vec<f64> {
        fn each<const N: usize>(b: &[u8], f: impl Fn([u8; N]) -> f64) -> Vec<f64> {
            b.chunks_exact(N)
                .map(|c| f(c.try_into().unwrap_or([0; N])))
                .collect()
        }
        match self {
            DType::F32 => each(b, |c| f64::from(f32::from_le_bytes(c))),
            DType::F64 => each(b, f64::from_le_bytes),
            DType::I32 => each(b, |c| f64::from(i32::from_le_bytes(c))),
            DType::I64 => each(b, |c| i64::from_le_bytes(c) as f64),
            other => b
                .chunks_exact(other.size_bytes())
                .map(|c| other.from_le_bytes(c))
                .collect(),
        }
    }

    /// `values` as [`Self::push_le_bytes`] writes each, one after another
    /// (a constant's or a tensor's bytes in memory).
    pub fn to_le_bytes_all<'a>(self, values: impl IntoIterator<Item = &'a f64>) -> Vec<u8> {
        let values = values.into_iter();
        let mut out = Vec::with_capacity(values.size_hint().0 * self.size_bytes());
        for &x in values {
            self.push_le_bytes(x, &mut out);
        }
        out
    }

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown element type `{s}`"))
    }
}

/// A tensor type: element type and static shape. A scalar has an empty shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Extent of each dimension, outermost first.
    pub shape: Vec<usize>,
}

impl TensorType {
    /// A tensor type from its parts.
    pub fn new(dtype: DType, shape: Vec<usize>) -> Self {
        TensorType { dtype, shape }
    }

    /// A rank-0 tensor.
    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: vec![],
        }
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements, or `None` when it overflows `usize`.
    pub fn num_elements(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// The MLIR builtin tensor type (`tensor<128x64xf32>`).
    pub fn mlir(&self) -> String {
        let mut s = String::from("tensor<");
        for d in &self.shape {
            s.push_str(&d.to_string());
            s.push('x');
        }
        s.push_str(self.dtype.mlir_name());
        s.push('>');
        s
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>(), Ok(d));
        }
        assert!("f128".parse::<DType>().is_err());
    }

    #[test]
    fn rounding_to_each_type() {
        assert_eq!(DType::F32.round(0.1), 0.1f32 as f64);
        assert_eq!(DType::F16.round(1.0001), 1.0);
        assert_eq!(DType::BF16.round(1.001), 1.0);
        assert_eq!(DType::I32.round(2147483648.0), -2147483648.0);
        assert_eq!(DType::I32.round(-2.7), -2.0);
        assert_eq!(DType::I64.round(2.7), 2.0);
        assert_eq!(DType::Bool.round(-0.5), 1.0);
        assert_eq!(DType::F64.round(0.1), 0.1);
        assert_eq!(DType::I8.round(128.0), -128.0);
        assert_eq!(DType::I16.round(-32769.5), 32767.0);
        assert_eq!(DType::U8.round(-1.0), 255.0);
        assert_eq!(DType::U8.round(256.9), 0.0);
        assert_eq!(DType::U16.round(65537.0), 1.0);
        assert_eq!(DType::U32.round(-1.0), 4294967295.0);
        assert_eq!(DType::U64.round(1e19), 1e19);
        assert_eq!(DType::U64.round(f64::NAN), 0.0);
    }

    #[test]
    fn bytes_round_trip() {
        for d in DType::ALL {
            for x in [0.0, 1.0, 3.0, 100.0] {
                let mut bytes = Vec::new();
                d.push_le_bytes(x, &mut bytes);
                assert_eq!(bytes.len(), d.size_bytes(), "{d}");
                let want = if d == DType::Bool { d.round(x) } else { x };
                assert_eq!(d.from_le_bytes(&bytes), want, "{d} {x}");
            }
        }
        let mut bytes = Vec::new();
        DType::U8.push_le_bytes(200.0, &mut bytes);
        DType::I8.push_le_bytes(-2.0, &mut bytes);
        assert_eq!(bytes, [200, 254]);
        assert_eq!(DType::I8.from_le_bytes(&[200]), -56.0);
    }

    /// A whole buffer decodes as its elements one at a time do.
    #[test]
    fn buffers_decode_element_by_element() {
        for d in DType::ALL {
            let xs = [0.0, 1.0, -3.0, 100.0, 0.5, -1e30, 7.0];
            let mut bytes = Vec::new();
            for x in xs {
                d.push_le_bytes(x, &mut bytes);
            }
            assert_eq!(d.to_le_bytes_all(&xs), bytes, "{d}");
            let one_by_one: Vec<f64> = bytes
                .chunks_exact(d.size_bytes())
                .map(|c| d.from_le_bytes(c))
                .collect();
            assert_eq!(one_by_one.len(), xs.len(), "{d}");
            assert_eq!(d.from_le_bytes_all(&bytes), one_by_one, "{d}");
            // A short tail is no element.
            bytes.push(1);
            assert_eq!(
                d.from_le_bytes_all(&bytes).len(),
                xs.len() + usize::from(d.size_bytes() == 1),
                "{d}"
            );
        }
    }

    #[test]
    fn integer_ranges() {
        assert_eq!(DType::I8.int_min(), Some(-128.0));
        assert_eq!(DType::I8.int_max(), Some(127.0));
        assert_eq!(DType::U8.int_min(), Some(0.0));
        assert_eq!(DType::U16.int_max(), Some(65535.0));
        assert_eq!(DType::I32.int_min(), Some(f64::from(i32::MIN)));
        assert_eq!(DType::F64.int_max(), None);
        assert!(DType::U32.is_unsigned() && DType::U32.is_int());
        assert!(!DType::I32.is_unsigned() && !DType::Bool.is_int());
        assert_eq!(DType::U64.size_bytes(), 8);
        assert_eq!(TensorType::scalar(DType::U8).mlir(), "tensor<i8>");
        assert_eq!(DType::U8.signless(255.0), -1);
        assert_eq!(DType::U64.signless(2f64.powi(63)), i64::MIN);
        assert_eq!(DType::I16.signless(-7.0), -7);
    }

    #[test]
    fn tensor_type_text() {
        let t = TensorType::new(DType::F32, vec![128, 1024]);
        assert_eq!(t.to_string(), "f32[128, 1024]");
        assert_eq!(t.mlir(), "tensor<128x1024xf32>");
        assert_eq!(TensorType::scalar(DType::Bool).to_string(), "bool[]");
        assert_eq!(TensorType::scalar(DType::Bool).mlir(), "tensor<i1>");
        assert_eq!(
            TensorType::new(DType::I32, vec![usize::MAX, 2]).num_elements(),
            None
        );
    }
}
