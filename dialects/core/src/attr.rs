//! Attributes of ops in the text forms of every dialect
//! (`%r = dialect.name operands {key = value, ..} : types`): the values as
//! written, in the text form and in MLIR's, and a reader that rebuilds an
//! op's fields from them and refuses attributes the op does not take.

use crate::{DType, format_float};

/// A generic attribute value as the text form writes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    /// `3`
    Int(i64),
    /// `0.5`
    Float(f64),
    /// `[1, 0]`
    Ints(Vec<i64>),
    /// `[1.0, -0.5, nan]`: a list with a number written as a float (the
    /// elements of a constant buffer).
    Floats(std::sync::Arc<[f64]>),
    /// `sum`, `global`
    Word(String),
    /// `"dot"`
    Str(String),
    /// `true` (the graph dialect's flags; the loop and tile dialects read
    /// `true` as the number 1)
    Bool(bool),
    /// `f32` (the graph dialect's element types; the loop and tile
    /// dialects read a name as a word)
    Type(DType),
}

impl Attr {
    /// The text form.
    pub fn text(&self) -> String {
        match self {
            Attr::Int(i) => i.to_string(),
            Attr::Float(v) => format_float(*v),
            Attr::Ints(v) => {
                let items: Vec<String> = v.iter().map(|i| i.to_string()).collect();
                format!("[{}]", items.join(", "))
            }
            Attr::Floats(v) => {
                let mut out = String::with_capacity(v.len() * 8 + 2);
                out.push('[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&format_float(*x));
                }
                out.push(']');
                out
            }
            Attr::Word(w) => w.clone(),
            Attr::Str(s) => format!("{s:?}"),
            Attr::Bool(b) => b.to_string(),
            Attr::Type(t) => t.to_string(),
        }
    }

    /// MLIR's form.
    pub fn mlir(&self) -> String {
        match self {
            Attr::Int(i) => format!("{i} : i64"),
            Attr::Float(v) => mlir_float(*v),
            // MLIR spells an empty array without the colon.
            Attr::Ints(v) if v.is_empty() => "array<i64>".into(),
            Attr::Floats(v) if v.is_empty() => "array<f64>".into(),
            Attr::Ints(v) => {
                let items: Vec<String> = v.iter().map(|i| i.to_string()).collect();
                format!("array<i64: {}>", items.join(", "))
            }
            Attr::Floats(v) => {
                let items: Vec<String> = v
                    .iter()
                    .map(|&x| {
                        if x.is_finite() {
                            format_float(x)
                        } else {
                            format!("0x{:016X}", x.to_bits())
                        }
                    })
                    .collect();
                format!("array<f64: {}>", items.join(", "))
            }
            Attr::Word(w) | Attr::Str(w) => format!("{w:?}"),
            Attr::Bool(b) => b.to_string(),
            Attr::Type(t) => t.mlir_name().to_string(),
        }
    }
}

/// A float as an MLIR attribute (`0.5 : f64`; bit patterns for
/// infinities and NaN, which MLIR's float literals cannot spell).
pub fn mlir_float(v: f64) -> String {
    if v.is_finite() {
        format!("{} : f64", format_float(v))
    } else {
        format!("0x{:016X} : f64", v.to_bits())
    }
}

/// Reads an op's attributes by name, each at most once, so that
/// [`AttrReader::finish`] can refuse the ones no declaration asked for.
pub struct AttrReader<'a> {
    op: &'a str,
    attrs: &'a [(String, Attr)],
    used: Vec<bool>,
}

impl<'a> AttrReader<'a> {
    /// A reader of the attributes `attrs` of op `op` (its full name).
    pub fn new(op: &'a str, attrs: &'a [(String, Attr)]) -> Self {
        AttrReader {
            op,
            attrs,
            used: vec![false; attrs.len()],
        }
    }

    /// The op's full name, for errors about its attributes.
    pub fn op(&self) -> &str {
        self.op
    }

    /// Whether the op has attribute `key` (an optional one).
    pub fn has(&self, key: &str) -> bool {
        self.attrs.iter().any(|(k, _)| k == key)
    }

    fn find(&mut self, key: &str) -> Option<&Attr> {
        let i = self.attrs.iter().position(|(k, _)| k == key)?;
        self.used[i] = true;
        Some(&self.attrs[i].1)
    }

    /// The attribute `key`; an error naming the op when it is missing.
    pub fn get(&mut self, key: &str) -> Result<&Attr, String> {
        let op = self.op;
        self.find(key)
            .ok_or_else(|| format!("`{op}` needs attribute `{key}`"))
    }

    /// An integer attribute.
    pub fn int(&mut self, key: &str) -> Result<i64, String> {
        let op = self.op;
        match self.get(key)? {
            Attr::Int(i) => Ok(*i),
            _ => Err(format!("`{op}`: `{key}` must be an integer")),
        }
    }

    /// A non-negative integer attribute.
    pub fn usize(&mut self, key: &str) -> Result<usize, String> {
        let op = self.op;
        usize::try_from(self.int(key)?).map_err(|_| format!("`{op}`: `{key}` must not be negative"))
    }

    /// A list of non-negative integers.
    pub fn usizes(&mut self, key: &str) -> Result<Vec<usize>, String> {
        let op = self.op;
        match self.get(key)? {
            Attr::Ints(v) => v
                .iter()
                .map(|&i| usize::try_from(i))
                .collect::<Result<_, _>>()
                .map_err(|_| format!("`{op}`: `{key}` must not be negative")),
            _ => Err(format!("`{op}`: `{key}` must be a list of integers")),
        }
    }

    /// A list of integers.
    pub fn ints(&mut self, key: &str) -> Result<Vec<i64>, String> {
        let op = self.op;
        match self.get(key)? {
            Attr::Ints(v) => Ok(v.clone()),
            _ => Err(format!("`{op}`: `{key}` must be a list of integers")),
        }
    }

    /// A list of numbers (a list of integers reads as floats).
    pub fn floats(&mut self, key: &str) -> Result<std::sync::Arc<[f64]>, String> {
        let op = self.op;
        match self.get(key)? {
            Attr::Floats(v) => Ok(v.clone()),
            Attr::Ints(v) => Ok(v.iter().map(|&i| i as f64).collect()),
            _ => Err(format!("`{op}`: `{key}` must be a list of numbers")),
        }
    }

    /// A number (an integer reads as a float).
    pub fn float(&mut self, key: &str) -> Result<f64, String> {
        let op = self.op;
        match self.get(key)? {
            Attr::Float(v) => Ok(*v),
            Attr::Int(i) => Ok(*i as f64),
            _ => Err(format!("`{op}`: `{key}` must be a number")),
        }
    }

    /// A number, if present.
    pub fn optional_float(&mut self, key: &str) -> Result<Option<f64>, String> {
        if self.has(key) {
            self.float(key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A bare word (`sum`).
    pub fn word(&mut self, key: &str) -> Result<String, String> {
        let op = self.op;
        match self.get(key)? {
            Attr::Word(w) => Ok(w.clone()),
            _ => Err(format!("`{op}`: `{key}` must be a name")),
        }
    }

    /// A quoted string.
    pub fn string(&mut self, key: &str) -> Result<String, String> {
        let op = self.op;
        match self.get(key)? {
            Attr::Str(s) => Ok(s.clone()),
            _ => Err(format!("`{op}`: `{key}` must be a string")),
        }
    }

    /// A flag, `true` or `false`.
    pub fn bool(&mut self, key: &str) -> Result<bool, String> {
        let op = self.op;
        match self.get(key)? {
            Attr::Bool(b) => Ok(*b),
            _ => Err(format!("`{op}`: `{key}` must be `true` or `false`")),
        }
    }

    /// An element type.
    pub fn dtype(&mut self, key: &str) -> Result<DType, String> {
        let op = self.op;
        match self.get(key)? {
            Attr::Type(t) => Ok(*t),
            _ => Err(format!("`{op}`: `{key}` must be an element type")),
        }
    }

    /// A list of exactly `N` non-negative integers.
    pub fn sizes<const N: usize>(&mut self, key: &str) -> Result<[usize; N], String> {
        let op = self.op;
        let v = self.usizes(key)?;
        <[usize; N]>::try_from(v.as_slice())
            .map_err(|_| format!("`{op}`: `{key}` takes {N} sizes, got {}", v.len()))
    }

    /// Fails on the first attribute nothing read.
    pub fn finish(self) -> Result<(), String> {
        match self.attrs.iter().zip(&self.used).find(|(_, u)| !**u) {
            Some(((k, _), _)) => Err(format!("`{}` has no attribute `{k}`", self.op)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Attr;
    use crate::DType;

    /// MLIR reads `array<i64>` as an empty array and refuses `array<i64: >`
    /// (a reshape to a scalar has an empty shape).
    #[test]
    fn empty_lists_are_arrays_without_a_colon_in_mlir() {
        assert_eq!(Attr::Ints(vec![]).mlir(), "array<i64>");
        assert_eq!(Attr::Floats(Vec::new().into()).mlir(), "array<f64>");
        assert_eq!(Attr::Ints(vec![1, 0]).mlir(), "array<i64: 1, 0>");
        assert_eq!(Attr::Ints(vec![]).text(), "[]");
    }

    /// The graph dialect's flags and element types print as its text form
    /// and MLIR's write them.
    #[test]
    fn flags_and_element_types_print_as_written() {
        assert_eq!(Attr::Bool(false).text(), "false");
        assert_eq!(Attr::Bool(true).mlir(), "true");
        assert_eq!(Attr::Type(DType::BF16).text(), "bf16");
        assert_eq!(Attr::Type(DType::BF16).mlir(), DType::BF16.mlir_name());
    }
}
