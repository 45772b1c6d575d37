//! Number formatting shared by every text form: floats print in the shortest
//! form that reads back to the same value, always with a `.` or an exponent
//! that MLIR's lexer accepts.

/// Formats `v` so that [`parse_float`] gives back exactly `v`, in a form that
/// both dlc's and MLIR's parsers accept (`1.0`, `1.0e-5`, `inf`, `nan`).
pub fn format_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let s = format!("{v:?}");
    match s.find('e') {
        Some(e) if !s[..e].contains('.') => format!("{}.0{}", &s[..e], &s[e..]),
        _ => s,
    }
}

/// Parses what [`format_float`] prints (and any Rust float literal).
pub fn parse_float(s: &str) -> Option<f64> {
    match s {
        "nan" => Some(f64::NAN),
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_round_trip() {
        for v in [
            0.0,
            -0.0,
            1.0,
            0.1,
            1e-5,
            1e300,
            -2.5e-300,
            123456789.0,
            f64::MAX,
        ] {
            let s = format_float(v);
            assert!(s.contains('.') || s.contains("inf"), "{s}");
            assert_eq!(parse_float(&s).map(f64::to_bits), Some(v.to_bits()), "{s}");
        }
        assert_eq!(format_float(1e-5), "1.0e-5");
        assert!(parse_float(&format_float(f64::NAN)).is_some_and(f64::is_nan));
    }
}

/// The names values print with: parameters keep theirs, everything else is
/// numbered `%0, %1, ...` in the order it is defined (a group of results
/// is `%N#0, %N#1, ...`, as MLIR names them).
#[derive(Debug, Clone)]
pub struct Namer<V> {
    names: std::collections::HashMap<V, String>,
    next: u32,
}

impl<V: Copy + Eq + std::hash::Hash + std::fmt::Debug> Namer<V> {
    /// A namer knowing the parameters' names (printed with `%`).
    pub fn new<'a>(params: impl IntoIterator<Item = (&'a String, V)>) -> Self {
        Namer {
            names: params
                .into_iter()
                .map(|(n, v)| (v, format!("%{n}")))
                .collect(),
            next: 0,
        }
    }

    /// Names a value `%N`.
    pub fn define(&mut self, v: V) -> String {
        let name = format!("%{}", self.next);
        self.next += 1;
        self.names.insert(v, name.clone());
        name
    }

    /// Names a group of results `%N#k`; returns `%N`.
    pub fn define_group(&mut self, vs: &[V]) -> String {
        let base = format!("%{}", self.next);
        self.next += 1;
        for (k, v) in vs.iter().enumerate() {
            self.names.insert(*v, format!("{base}#{k}"));
        }
        base
    }

    /// A value's name (`%<undefined ..>` for one never defined: IR the
    /// verifier rejects).
    pub fn get(&self, v: V) -> String {
        self.names
            .get(&v)
            .cloned()
            .unwrap_or_else(|| format!("%<undefined {v:?}>"))
    }

    /// Names, comma-separated.
    pub fn list(&self, vs: &[V]) -> String {
        vs.iter()
            .map(|v| self.get(*v))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// An affine expression as text: `a + 2*b - 1` from the terms
/// `(coefficient, name)` and the constant; MLIR's affine syntax (`mlir`)
/// writes the coefficient after the name: `b * 2`.
pub fn affine_text(terms: &[(i64, String)], constant: i64, mlir: bool) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for (i, (c, name)) in terms.iter().enumerate() {
        let mag = c.unsigned_abs();
        match (i == 0, *c < 0) {
            (true, true) => s.push('-'),
            (false, true) => s.push_str(" - "),
            (false, false) => s.push_str(" + "),
            (true, false) => {}
        }
        match (mag, mlir) {
            (1, _) => s.push_str(name),
            (_, false) => {
                let _ = write!(s, "{mag}*{name}");
            }
            (_, true) => {
                let _ = write!(s, "{name} * {mag}");
            }
        }
    }
    if terms.is_empty() {
        let _ = write!(s, "{constant}");
    } else if constant > 0 {
        let _ = write!(s, " + {constant}");
    } else if constant < 0 {
        let _ = write!(s, " - {}", constant.unsigned_abs());
    }
    s
}
