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
