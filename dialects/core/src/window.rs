//! A two-dimensional convolution window: where each kernel tap of each
//! output position reads its input. One declaration for the graph dialect
//! (which finds a window in a user operator's index expressions) and the loop
//! dialect (whose `im2col` kernel groups carry it as attributes).

use crate::attr::{Attr, AttrReader};

/// In each of the two spatial axes `a`, output position `o` and kernel tap
/// `t` read the input at `stride[a] * o + dilation[a] * t - padding[a]`;
/// reads outside the input are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// Kernel taps, rows then columns.
    pub kernel: [i64; 2],
    /// Input steps between consecutive outputs.
    pub stride: [i64; 2],
    /// Zero positions before the input (a negative value starts the window
    /// inside it).
    pub padding: [i64; 2],
    /// Input steps between consecutive taps.
    pub dilation: [i64; 2],
}

impl Window {
    /// The attributes' names, in print order.
    pub const KEYS: [&'static str; 4] = ["kernel", "stride", "padding", "dilation"];

    /// The input coordinate that output position `o` and tap `t` read in
    /// axis `a`.
    pub fn input_at(&self, a: usize, o: i64, t: i64) -> i64 {
        self.stride[a] * o + self.dilation[a] * t - self.padding[a]
    }

    /// The window as attributes (`kernel = [3, 3], stride = [1, 1], ..`).
    pub fn attrs(&self) -> Vec<(String, Attr)> {
        [self.kernel, self.stride, self.padding, self.dilation]
            .into_iter()
            .zip(Self::KEYS)
            .map(|(v, k)| (k.to_string(), Attr::Ints(v.to_vec())))
            .collect()
    }

    /// Reads the window's attributes: each a pair, kernel, stride and
    /// dilation positive.
    pub fn read(a: &mut AttrReader<'_>) -> Result<Window, String> {
        let mut pair = |key: &str, positive: bool| -> Result<[i64; 2], String> {
            let v = a.ints(key)?;
            let op = a.op();
            let [x, y] = v[..] else {
                return Err(format!(
                    "`{op}`: `{key}` must be two integers, not {}",
                    v.len()
                ));
            };
            if positive && (x < 1 || y < 1) {
                return Err(format!("`{op}`: `{key}` must be positive, not [{x}, {y}]"));
            }
            Ok([x, y])
        };
        Ok(Window {
            kernel: pair("kernel", true)?,
            stride: pair("stride", true)?,
            padding: pair("padding", false)?,
            dilation: pair("dilation", true)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_reads_back_from_its_attributes() {
        let w = Window {
            kernel: [3, 5],
            stride: [2, 1],
            padding: [1, -2],
            dilation: [1, 3],
        };
        let attrs = w.attrs();
        let mut r = AttrReader::new("loop.kernel_begin", &attrs);
        assert_eq!(Window::read(&mut r), Ok(w));
        r.finish().unwrap();
        assert_eq!(w.input_at(0, 4, 2), 2 * 4 + 2 - 1);
        assert_eq!(w.input_at(1, 4, 2), 4 + 3 * 2 + 2);
    }

    #[test]
    fn a_window_needs_positive_pairs() {
        let bad = |key: &str, v: Vec<i64>| {
            let mut attrs = Window {
                kernel: [3, 3],
                stride: [1, 1],
                padding: [0, 0],
                dilation: [1, 1],
            }
            .attrs();
            attrs.iter_mut().find(|(k, _)| k == key).unwrap().1 = Attr::Ints(v);
            Window::read(&mut AttrReader::new("op", &attrs)).unwrap_err()
        };
        assert!(bad("stride", vec![0, 1]).contains("`stride` must be positive"));
        assert!(bad("kernel", vec![3]).contains("`kernel` must be two integers"));
        assert!(bad("dilation", vec![1, -1]).contains("positive"));
    }
}
