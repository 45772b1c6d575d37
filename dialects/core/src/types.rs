use std::fmt;
use std::str::FromStr;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit two's complement integer.
    I32,
    /// 64-bit two's complement integer.
    I64,
    /// Boolean.
    Bool,
}

impl DType {
    /// Every element type, in declaration order.
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    /// The name used in source and IR text (`f32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// The name of the matching MLIR builtin type (`f32`, `i1`).
    pub fn mlir_name(self) -> &'static str {
        match self {
            DType::Bool => "i1",
            other => other.name(),
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Whether this is an integer type (bool excluded).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
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
    /// nearest-even, integers wrap as two's complement after truncating
    /// toward zero, and bool is `x != 0`.
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F32 => x as f32 as f64,
            DType::F16 => half::f16::from_f64(x).to_f64(),
            DType::BF16 => half::bf16::from_f64(x).to_f64(),
            DType::I32 => (x as i64) as i32 as f64,
            DType::I64 => x as i64 as f64,
            DType::Bool => f64::from(u8::from(x != 0.0)),
        }
    }

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::Bool => 1,
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
        assert!("f64".parse::<DType>().is_err());
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
