//! An entry point as the tools bind arguments to it: its parameters' names
//! and types, which of them are weights, and how random values are drawn
//! for each ([`crate::random_ranges`]). It is what a compiled program kept
//! in the cache needs of its graph function (`dlc run` on a cached program
//! has no graph), and it is written as text for that.

use dlc_core::{DType, TensorType};
use dlc_graph::Function;
use dlc_runtime::RandomRange;

/// An entry point's parameters: see the module's documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct Interface {
    /// The function's name.
    pub name: String,
    /// Its parameters, in order.
    pub params: Vec<Param>,
}

/// One parameter of an [`Interface`].
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// Its name in the source.
    pub name: String,
    /// Element type and shape.
    pub ty: TensorType,
    /// Whether it is declared a `weight`.
    pub weight: bool,
    /// How its random values are drawn.
    pub range: RandomRange,
}

impl From<&Function> for Interface {
    fn from(f: &Function) -> Interface {
        Interface::of(f)
    }
}

impl Interface {
    /// The interface of `f`.
    pub fn of(f: &Function) -> Interface {
        let ranges = crate::random_ranges(f);
        let params = f
            .params
            .iter()
            .zip(f.param_types())
            .zip(ranges)
            .enumerate()
            .map(|(i, (((name, _), ty), range))| Param {
                name: name.clone(),
                ty,
                weight: f.is_weight(i),
                range,
            })
            .collect();
        Interface {
            name: f.name.clone(),
            params,
        }
    }

    /// Whether any parameter is declared a weight.
    pub fn has_weights(&self) -> bool {
        self.params.iter().any(|p| p.weight)
    }

    /// `entry NAME`, then one line per parameter: `input|weight NAME RANGE
    /// DTYPE DIMS...`, RANGE `unit`, `positive` or `weight:BITS` (the
    /// scale's bits in hexadecimal, so it reads back exactly).
    pub fn encode(&self) -> String {
        let mut text = format!("entry {}\n", self.name);
        for p in &self.params {
            let range = match p.range {
                RandomRange::Unit => "unit".to_string(),
                RandomRange::Positive => "positive".to_string(),
                RandomRange::Weight(s) => format!("weight:{:x}", s.to_bits()),
            };
            text.push_str(if p.weight { "weight " } else { "input " });
            text.push_str(&format!("{} {range} {}", p.name, p.ty.dtype));
            for d in &p.ty.shape {
                text.push_str(&format!(" {d}"));
            }
            text.push('\n');
        }
        text
    }

    /// Reads what [`Interface::encode`] wrote; `None` for anything else.
    pub fn decode(text: &str) -> Option<Interface> {
        let mut lines = text.lines();
        let name = lines.next()?.strip_prefix("entry ")?.to_string();
        let params = lines
            .map(|line| {
                let mut words = line.split(' ');
                let weight = match words.next()? {
                    "input" => false,
                    "weight" => true,
                    _ => return None,
                };
                let name = words.next()?.to_string();
                let range = match words.next()? {
                    "unit" => RandomRange::Unit,
                    "positive" => RandomRange::Positive,
                    w => RandomRange::Weight(f64::from_bits(
                        u64::from_str_radix(w.strip_prefix("weight:")?, 16).ok()?,
                    )),
                };
                let dtype: DType = words.next()?.parse().ok()?;
                let shape = words
                    .map(|d| d.parse().ok())
                    .collect::<Option<Vec<usize>>>()?;
                Some(Param {
                    name,
                    ty: TensorType::new(dtype, shape),
                    weight,
                    range,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Interface { name, params })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interfaces_round_trip_as_text() {
        let src = "fn f(x: f32[2, 3], v: f32[3], weight w: f32[3, 4]) -> f32[2, 4] { \
                   return (x / sqrt(v)) @ w; }";
        let module = dlc_lang::compile_file("t.dl", src).unwrap();
        let iface = Interface::of(&module.functions[0]);
        let ranges: Vec<RandomRange> = iface.params.iter().map(|p| p.range).collect();
        assert_eq!(
            ranges,
            [
                RandomRange::Unit,
                RandomRange::Positive,
                RandomRange::Weight(1.0 / 3f64.sqrt())
            ]
        );
        assert_eq!(
            iface.params.iter().map(|p| p.weight).collect::<Vec<_>>(),
            [false, false, true]
        );
        assert_eq!(Interface::decode(&iface.encode()), Some(iface.clone()));
        assert_eq!(Interface::decode("entry f\ninput x unit f99 3\n"), None);
        assert_eq!(Interface::decode("fn f\n"), None);
    }
}
