//! Buffer layouts: element type, shape, strides and offset, as the loop
//! and tile dialects' buffer types hold them.

use std::fmt;

use crate::DType;

/// A strided buffer: element type, shape, strides and offset in elements.
///
/// Element `[i0, i1, ..]` lives at `offset + i0 * strides[0] + i1 *
/// strides[1] + ..` of the storage the buffer belongs to (its allocation or
/// parameter): a view of part of a buffer (a slice along its outer axis)
/// keeps its storage and has an offset. Allocations and parameters have
/// none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Element type.
    pub dtype: DType,
    /// Extent of each dimension.
    pub shape: Vec<usize>,
    /// Distance in elements between neighbours along each dimension.
    pub strides: Vec<usize>,
    /// Where element `[0, 0, ..]` is in the storage, in elements.
    pub offset: usize,
}

impl Layout {
    /// A row-major buffer.
    pub fn contiguous(dtype: DType, shape: Vec<usize>) -> Self {
        let mut strides = vec![1usize; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1].saturating_mul(shape[i + 1]);
        }
        Layout {
            dtype,
            shape,
            strides,
            offset: 0,
        }
    }

    /// A buffer whose rows (along the last axis) are `pitch` elements apart
    /// instead of their length, the axes before them row-major over those
    /// rows: `[2, 64, 32]` at pitch 40 has strides `[2560, 40, 1]`. A
    /// pitch of a row's length is [`Layout::contiguous`]. The padding
    /// moves rows to other banks of a GPU's shared memory.
    pub fn with_row_pitch(dtype: DType, shape: Vec<usize>, pitch: usize) -> Self {
        let mut l = Layout::contiguous(dtype, shape);
        if let Some(&cols) = l.shape.last()
            && l.shape.len() >= 2
            && pitch > cols
        {
            let last = l.shape.len() - 1;
            l.strides[last - 1] = pitch;
            for i in (0..last - 1).rev() {
                l.strides[i] = l.strides[i + 1].saturating_mul(l.shape[i + 1]);
            }
        }
        l
    }

    /// The distance in elements between consecutive rows when the buffer
    /// is rows at a pitch ([`Layout::with_row_pitch`], row-major included:
    /// its pitch is a row's length) with no offset; `None` otherwise, and
    /// for a buffer of fewer than two axes.
    pub fn row_pitch(&self) -> Option<usize> {
        let n = self.shape.len();
        if n < 2 || self.offset != 0 {
            return None;
        }
        let pitch = self.strides[n - 2];
        (Layout::with_row_pitch(self.dtype, self.shape.clone(), pitch) == *self
            && pitch >= self.shape[n - 1])
            .then_some(pitch)
    }

    /// Whether the buffer is its storage from the start, row-major: the
    /// strides are the row-major ones and there is no offset.
    pub fn is_contiguous(&self) -> bool {
        self.offset == 0 && self.has_row_major_strides()
    }

    /// Whether the strides are the row-major ones (whatever the offset).
    pub fn has_row_major_strides(&self) -> bool {
        Layout::contiguous(self.dtype, self.shape.clone()).strides == self.strides
    }

    /// Elements of storage the buffer reaches (its offset and its span),
    /// or `None` on overflow.
    pub fn storage_len(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(self.offset);
        }
        self.shape
            .iter()
            .zip(&self.strides)
            .try_fold(self.offset.checked_add(1)?, |acc, (d, s)| {
                acc.checked_add((d - 1).checked_mul(*s)?)
            })
    }

    /// Whether a view with this layout stays inside `src`'s part of their
    /// storage: it starts no earlier and reaches no further.
    pub fn lies_within(&self, src: &Layout) -> bool {
        self.offset >= src.offset && self.storage_len() <= src.storage_len()
    }

    /// The MLIR type (`memref<4x8xf32>`, `memref<4x8xf32, strided<[1, 4]>>`),
    /// in memory space `space` when given (`memref<4xf32, 3>`).
    pub fn mlir_in(&self, space: Option<u32>) -> String {
        let mut s = String::from("memref<");
        for d in &self.shape {
            s.push_str(&format!("{d}x"));
        }
        s.push_str(self.dtype.mlir_name());
        if !self.is_contiguous() {
            let strides: Vec<String> = self.strides.iter().map(|s| s.to_string()).collect();
            s.push_str(&format!(", strided<[{}]", strides.join(", ")));
            if self.offset != 0 {
                s.push_str(&format!(", offset: {}", self.offset));
            }
            s.push('>');
        }
        if let Some(space) = space {
            s.push_str(&format!(", {space}"));
        }
        s.push('>');
        s
    }

    /// The MLIR type in the default memory space.
    pub fn mlir(&self) -> String {
        self.mlir_in(None)
    }

    /// The text form, `buffer<f32[4, 8], strides = [1, 4]>` (and `, offset
    /// = N` when it has one), with `extra` (a memory space) before the
    /// closing `>` when given.
    pub fn text_with(&self, f: &mut fmt::Formatter<'_>, extra: Option<&str>) -> fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        write!(f, "buffer<{}[{}]", self.dtype, dims.join(", "))?;
        if !self.has_row_major_strides() {
            let strides: Vec<String> = self.strides.iter().map(|s| s.to_string()).collect();
            write!(f, ", strides = [{}]", strides.join(", "))?;
        }
        if self.offset != 0 {
            write!(f, ", offset = {}", self.offset)?;
        }
        if let Some(extra) = extra {
            write!(f, ", {extra}")?;
        }
        f.write_str(">")
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.text_with(f, None)
    }
}

impl AsRef<Layout> for Layout {
    fn as_ref(&self) -> &Layout {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_at_a_pitch() {
        let l = Layout::with_row_pitch(DType::BF16, vec![2, 64, 32], 40);
        assert_eq!(l.strides, [2560, 40, 1]);
        assert_eq!(l.row_pitch(), Some(40));
        assert_eq!(l.storage_len(), Some(64 * 40 + 63 * 40 + 32));
        assert!(!l.has_row_major_strides());
        // Row-major is rows at their own length; a pitch no longer than a
        // row is row-major.
        let c = Layout::contiguous(DType::F32, vec![4, 8]);
        assert_eq!(c.row_pitch(), Some(8));
        assert_eq!(Layout::with_row_pitch(DType::F32, vec![4, 8], 6), c);
        // Not rows at a pitch: transposed, one axis, an offset.
        let mut t = Layout::contiguous(DType::F32, vec![4, 8]);
        t.strides = vec![1, 4];
        assert_eq!(t.row_pitch(), None);
        assert_eq!(Layout::contiguous(DType::F32, vec![8]).row_pitch(), None);
        let mut o = l.clone();
        o.offset = 3;
        assert_eq!(o.row_pitch(), None);
    }
}
