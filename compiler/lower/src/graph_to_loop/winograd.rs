//! Convolutions as Winograd's `F(4x4, 3x3)` (Lavin and Gray, "Fast
//! Algorithms for Convolutional Neural Networks", 2016).
//!
//! A 3 x 3 convolution at stride 1 computes each 4 x 4 block of an output
//! channel from a 6 x 6 patch of every input channel. In the transformed
//! domain that is one multiplication per point: with `U = G g G^T` (the
//! kernel `g`, 3 x 3 -> 6 x 6) and `V = B^T d B` (the patch `d`), the block
//! is `A^T (sum over channels of U . V) A`. Summed over the channels, each
//! of the 36 points is a matrix product: `M[p] (tiles x O) = V[p] (tiles x
//! C) @ U[p] (C x O)`. So a convolution becomes three loop nests and one
//! batched `loop.matmul`:
//!
//! - the kernel transform, `U[p, c, o]`, which reads the weights alone
//!   (with declared weights, the preparer runs it, and packs `U` once);
//! - the input transform, `V[p, t, c]` for every tile `t = (n, ty, tx)`;
//! - 36 products `M[p] = V[p] @ U[p]`, on the packed kernel;
//! - the output transform, `A^T M A` per tile and output channel, into the
//!   result (the convolution takes no epilogue: see
//!   `dlc_graph::fusion::conv_as_winograd`).
//!
//! 36 multiply-adds per input channel give 16 outputs, where the direct
//! product takes 9 for each: a quarter of the arithmetic, for the
//! transforms' work (on a CPU the three nests run as one kernel, so `V` and
//! `M` stay in cache: `convert-loop-to-tile`'s `winograd` schedule). The
//! transforms are straight-line code
//! in the lanes of one vector of channels (the innermost loop), with the
//! matrices' zeros skipped and their ones not multiplied.
//!
//! Exactness: the transforms scale by at most 8 (`A`) and 1/24 (`G`);
//! on f32 the results differ from the direct sum by a few units in the
//! last place of the largest terms (checked by the differential tests
//! against the graph interpreter).
//!
//! # How the nests are written
//!
//!   transform into the result. The transforms are nests over the images and rows of tiles
//!   (both parallel) around a loop over a row's tiles, whose bodies are straight-line
//!   code with the matrices' zeros skipped and their ones not multiplied, in the lanes of
//!   one vector of channels (the channel loop is split into groups of the target's
//!   lanes), so each input element is a gather (the channels are a plane apart in NCHW)
//!   and each result a scatter. On a CPU the three nests become one kernel (`loop_to_tile::winograd`), so `V` and `M` never go to memory. A quarter of the multiply-adds
//!   (36 per input channel for 16 outputs, against 9 each). The convolution takes no
//!   epilogue: the bias, residual and relu are a pass of their own, along contiguous rows
//!   where the output transform would scatter them, and the two convolutions of a ResNet
//!   block then compile to one shared kernel. On f32 the result is within 1.2e-6 of
//!   the float64 reference on W3 (the tolerance is 1e-4); the differential tests run
//!   padding 0, 1 and 2, channel counts that are and are not multiples of the vector,
//!   narrow and packed products, a batch, declared weights and the passes after on the
//!   loop and tile interpreters (host and sm_90, and odd blockings), compiled code, and
//!   through ptxas. Where the extents are not multiples of 4 (ResNet's 14 x 14 and 7 x
//!   7), the last tiles overhang the result: the input transform reads zeros past the
//!   input's edge, the output transform writes whole tiles into a padded result, and a
//!   pass crops it (`dlc_graph::ops::winograd_fits`: at least 2 x 2 tiles per image, at
//!   least half filled). Convolutions that do not qualify (strides, other kernels,
//!   groups, few channels, few or mostly empty tiles) keep the im2col product or a
//!   direct nest. F(2x2, 3x3) and F(6x6, 3x3) (fewer multiplications, larger transform
//!   constants) are not done.

use std::collections::HashMap;

use dlc_core::scalar::BinaryOp;
use dlc_core::{DType, TensorType};
use dlc_graph::ops::{WINOGRAD_TILE, winograd_tiles};
use dlc_loop::{IndexExpr, Value};
use petgraph::stable_graph::NodeIndex;

use super::{Lowering, contiguous, ix, ix_axpy, ix_const};

/// Points of the transformed tile along each axis (`4 + 3 - 1`).
const P: usize = 6;

/// `B^T`: a 6 x 6 input patch to the transformed domain, by rows.
const BT: [[f64; 6]; 6] = [
    [4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
    [0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
    [0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
    [0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
    [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
    [0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
];

/// `G`: a 3 x 3 kernel to the transformed domain.
const G: [[f64; 3]; 6] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];

/// `A^T`: the transformed product back to a 4 x 4 output block.
const AT: [[f64; 6]; 4] = [
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
    [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
    [0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
];

/// Straight-line linear combinations in one loop body: the constants it
/// multiplies by are made once.
struct Combiner {
    dtype: DType,
    constants: HashMap<u64, Value>,
}

impl Combiner {
    fn new(dtype: DType) -> Self {
        Combiner {
            dtype,
            constants: HashMap::new(),
        }
    }

    fn constant(&mut self, l: &mut Lowering<'_>, k: f64) -> Value {
        *self
            .constants
            .entry(k.to_bits())
            .or_insert_with(|| l.b.constant(k, self.dtype))
    }

    /// `sum of k[i] * x[i]`: zero coefficients skipped, ones not
    /// multiplied, the positive terms first so that a negative one is a
    /// subtraction.
    fn combine(&mut self, l: &mut Lowering<'_>, k: &[f64], x: &[Value]) -> Value {
        let mut terms: Vec<(f64, Value)> = k
            .iter()
            .zip(x)
            .filter(|(k, _)| **k != 0.0)
            .map(|(k, x)| (*k, *x))
            .collect();
        terms.sort_by_key(|(k, _)| *k < 0.0);
        let mut acc: Option<Value> = None;
        for (k, x) in terms {
            acc = Some(match acc {
                None if k == 1.0 => x,
                None => {
                    let c = self.constant(l, k);
                    l.b.binary(BinaryOp::Mul, x, c)
                }
                Some(a) => {
                    let term = if k.abs() == 1.0 {
                        x
                    } else {
                        let c = self.constant(l, k.abs());
                        l.b.binary(BinaryOp::Mul, x, c)
                    };
                    let op = if k < 0.0 {
                        BinaryOp::Sub
                    } else {
                        BinaryOp::Add
                    };
                    l.b.binary(op, a, term)
                }
            });
        }
        acc.unwrap_or_else(|| self.constant(l, 0.0))
    }

    /// `L X R^T` for the square `X` given by rows: `left` and `right` have
    /// `X`'s size as their width.
    fn sandwich<const W: usize>(
        &mut self,
        l: &mut Lowering<'_>,
        left: &[[f64; W]],
        right: &[[f64; W]],
        x: &[[Value; W]; W],
    ) -> Vec<Vec<Value>> {
        // (L X)[a][j], column by column of X.
        let lx: Vec<Vec<Value>> = left
            .iter()
            .map(|row| {
                (0..W)
                    .map(|j| {
                        let col: Vec<Value> = (0..W).map(|i| x[i][j]).collect();
                        self.combine(l, row, &col)
                    })
                    .collect()
            })
            .collect();
        lx.iter()
            .map(|r| right.iter().map(|k| self.combine(l, k, r)).collect())
            .collect()
    }
}

/// The loops over `extent` channels: groups of `lanes` and the lanes, when
/// `lanes` divides it, else one loop.
fn lane_loops(extent: usize, lanes: usize) -> Vec<usize> {
    if lanes > 1 && extent > lanes && extent.is_multiple_of(lanes) {
        vec![extent / lanes, lanes]
    } else {
        vec![extent]
    }
}

/// The channel index of [`lane_loops`]' indices: `group * lanes + lane`, or
/// the one index.
fn lane_index(ivs: &[IndexExpr], lanes: usize) -> IndexExpr {
    ivs.iter()
        .fold(ix_const(0), |acc, i| ix_axpy(lanes as i64, &acc, i))
}

impl Lowering<'_> {
    /// Opens a nest over `outer` and then `last`, cut into `lanes`-wide
    /// groups when `lanes` divides it (so the innermost loop, which the
    /// tile conversion vectorizes, is one vector); returns the indices of
    /// `outer` and the index into `last`, and how many loops to close.
    fn open_lanes(
        &mut self,
        outer: &[usize],
        last: usize,
        lanes: usize,
    ) -> (Vec<IndexExpr>, IndexExpr, usize) {
        let mut shape = outer.to_vec();
        shape.extend(lane_loops(last, lanes));
        let mut ivs = self.open_nest(&shape);
        let inner = lane_index(&ivs.split_off(outer.len()), lanes);
        (ivs, inner, shape.len())
    }

    /// Opens a transform's nest over the tiles and the channels `c`: the
    /// image and the row of tiles parallel, then the tile's column, then
    /// the channels in groups of `lanes` (see [`Self::open_lanes`]);
    /// `convert-loop-to-tile` recognises this shape to run the two
    /// transforms and the products as one kernel over blocks of tile rows.
    /// Returns the image, tile row and tile column indices, the tile's flat
    /// index `(n * rows + ty) * cols + tx`, the channel index, and how many
    /// loops to close.
    fn open_tiles(
        &mut self,
        [batch, rows, cols]: [usize; 3],
        c: usize,
        lanes: usize,
    ) -> ([IndexExpr; 3], IndexExpr, IndexExpr, usize) {
        let nb = ix(self.b.begin_parallel(0, batch as i64));
        let ty = ix(self.b.begin_parallel(0, rows as i64));
        let tx = ix(self.b.begin_for(0, cols as i64, 1, &[]).0);
        let inner = lane_loops(c, lanes);
        let ivs: Vec<IndexExpr> = inner
            .iter()
            .map(|&extent| ix(self.b.begin_for(0, extent as i64, 1, &[]).0))
            .collect();
        let ci = lane_index(&ivs, lanes);
        self.parallel.push(2);
        let tile = ix_axpy(cols as i64, &ix_axpy(rows as i64, &nb, &ty), &tx);
        ([nb, ty, tx], tile, ci, 3 + inner.len())
    }

    /// Convolution `n` (see `dlc_graph::ops::conv_is_winograd`) as
    /// Winograd's `F(4x4, 3x3)`, its output transform storing the result
    /// (or, when the tiles overhang it, a padded result then cropped).
    pub(super) fn conv_winograd(&mut self, n: NodeIndex, padding: [usize; 2]) {
        let ty = self.ty(n).clone();
        let dtype = ty.dtype;
        let (x, w) = (self.operand(n, 0), self.operand(n, 1));
        let (xbuf, wbuf) = (self.home[&x], self.home[&w]);
        let wsh = self.ty(w).shape.clone();
        let (o, c) = (wsh[0], wsh[1]);
        let t = WINOGRAD_TILE;
        let (batch, ty_n, tx_n) = (
            ty.shape[0],
            ty.shape[2].div_ceil(t),
            ty.shape[3].div_ceil(t),
        );
        let ragged = ty_n * t != ty.shape[2] || tx_n * t != ty.shape[3];
        let tiles = winograd_tiles(&ty);
        let lanes = self.target.lanes(dtype);
        let buffer = |shape: Vec<usize>| contiguous(&TensorType::new(dtype, shape));

        // U[p, c, o] = (G w[o, c] G^T)[p].
        let u = self.b.alloc(buffer(vec![P * P, c, o]));
        let (ivs, oi, depth) = self.open_lanes(&[c], o, lanes);
        let ci = &ivs[0];
        let mut k = Combiner::new(dtype);
        let g: [[Value; 3]; 3] = std::array::from_fn(|i| {
            std::array::from_fn(|j| {
                let at = vec![
                    oi.clone(),
                    ci.clone(),
                    ix_const(i as i64),
                    ix_const(j as i64),
                ];
                self.b.load(wbuf, at, None)
            })
        });
        let tu = k.sandwich(self, &G, &G, &g);
        self.store_points(&tu, u, |p| vec![p, ci.clone(), oi.clone()]);
        self.close_nest(depth);

        // Ragged tiles (14 x 14 is 4 x 4 tiles of 16 x 16): the input
        // transform reads zeros past the input's edge, and the output
        // transform writes whole tiles into a padded result, cropped after.
        let padded = ragged.then(|| self.b.alloc(buffer(vec![batch, o, ty_n * t, tx_n * t])));
        // V[p, t, c] = (B^T d B)[p] for the patch d of tile t in channel c.
        let v = self.b.alloc(buffer(vec![P * P, tiles, c]));
        let ([nb, tyi, txi], tile, ci, depth) = self.open_tiles([batch, ty_n, tx_n], c, lanes);
        let (nb, tyi, txi) = (&nb, &tyi, &txi);
        let mut k = Combiner::new(dtype);
        let d: [[Value; P]; P] = std::array::from_fn(|i| {
            std::array::from_fn(|j| {
                let y = ix_axpy(t as i64, tyi, &ix_const(i as i64 - padding[0] as i64));
                let xx = ix_axpy(t as i64, txi, &ix_const(j as i64 - padding[1] as i64));
                self.b
                    .load(xbuf, vec![nb.clone(), ci.clone(), y, xx], Some(0.0))
            })
        });
        let tv = k.sandwich(self, &BT, &BT, &d);
        self.store_points(&tv, v, |p| vec![p, tile.clone(), ci.clone()]);
        self.close_nest(depth);

        // M[p] = V[p] @ U[p], summed over the input channels.
        let m = self.b.alloc(buffer(vec![P * P, tiles, o]));
        self.product(
            &[P * P],
            [tiles, o, c],
            dtype,
            (v, &|b, i, kk| vec![b[0].clone(), i.clone(), kk.clone()]),
            (u, &|b, kk, j| vec![b[0].clone(), kk.clone(), j.clone()]),
            &mut |l, idx, acc| l.b.store(acc, m, idx.to_vec()),
        );
        self.b.dealloc(v);

        // out[n, o, 4 ty + a, 4 tx + b] = (A^T M[., t, o] A)[a, b].
        let ([nb, tyi, txi], tile, oi, depth) = self.open_tiles([batch, ty_n, tx_n], o, lanes);
        let (nb, tyi, txi) = (&nb, &tyi, &txi);
        let mut k = Combiner::new(dtype);
        let mp: [[Value; P]; P] = std::array::from_fn(|i| {
            std::array::from_fn(|j| {
                let p = ix_const((i * P + j) as i64);
                self.b.load(m, vec![p, tile.clone(), oi.clone()], None)
            })
        });
        let out = k.sandwich(self, &AT, &AT, &mp);
        for (a, row) in out.iter().enumerate() {
            for (b, &val) in row.iter().enumerate() {
                let y = ix_axpy(t as i64, tyi, &ix_const(a as i64));
                let xx = ix_axpy(t as i64, txi, &ix_const(b as i64));
                let at = vec![nb.clone(), oi.clone(), y, xx];
                match padded {
                    Some(p) => self.b.store(val, p, at),
                    None => self.sink(n, &at, val),
                }
            }
        }
        self.close_nest(depth);
        self.b.dealloc(m);
        // Released after the output transform, so that nothing separates
        // the three nests but V's release (see `convert-loop-to-tile`'s
        // Winograd fusion).
        if self.holds_weights(w) {
            self.held.push(u);
        } else {
            self.b.dealloc(u);
        }
        // The result: the whole tiles cropped (a pass of its own, along
        // contiguous rows).
        if let Some(p) = padded {
            let ivs = self.open_nest(&ty.shape);
            let val = self.b.load(p, ivs.clone(), None);
            self.sink(n, &ivs, val);
            self.close_nest(ty.shape.len());
            self.b.dealloc(p);
        }
    }

    /// Stores a transformed 6 x 6 tile, given by rows, into `buf` at
    /// `index(p)` for each of its points `p = 6 a + b`.
    fn store_points(
        &mut self,
        values: &[Vec<Value>],
        buf: Value,
        index: impl Fn(IndexExpr) -> Vec<IndexExpr>,
    ) {
        for (a, row) in values.iter().enumerate() {
            for (b, &v) in row.iter().enumerate() {
                self.b.store(v, buf, index(ix_const((a * P + b) as i64)));
            }
        }
    }

    /// Whether `w` (a convolution's kernel) is a declared weight or
    /// computed from weights alone, so that what the lowering derives from
    /// it belongs to the preparer and lives to the end of the function.
    fn holds_weights(&self, w: NodeIndex) -> bool {
        self.bound.contains(&w)
            || matches!(self.op(w), dlc_graph::ops::Op::Param { index } if self.g.is_weight(*index as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `F(4x4, 3x3)` in f64 on one patch equals the direct correlation.
    #[test]
    fn the_transforms_compute_a_correlation() {
        let d: [[f64; P]; P] = std::array::from_fn(|i| {
            std::array::from_fn(|j| ((i * 7 + j * 3) % 11) as f64 - 5.0 + 0.25 * j as f64)
        });
        let g: [[f64; 3]; 3] =
            std::array::from_fn(|i| std::array::from_fn(|j| (i * 3 + j) as f64 * 0.5 - 2.0));
        let mul = |a: &[Vec<f64>], b: &[Vec<f64>]| -> Vec<Vec<f64>> {
            (0..a.len())
                .map(|i| {
                    (0..b[0].len())
                        .map(|j| (0..b.len()).map(|k| a[i][k] * b[k][j]).sum())
                        .collect()
                })
                .collect()
        };
        let rows = |m: &[[f64; 6]]| m.iter().map(|r| r.to_vec()).collect::<Vec<_>>();
        let tr = |m: &[Vec<f64>]| -> Vec<Vec<f64>> {
            (0..m[0].len())
                .map(|j| m.iter().map(|r| r[j]).collect())
                .collect()
        };
        let gm: Vec<Vec<f64>> = G.iter().map(|r| r.to_vec()).collect();
        let u = mul(
            &mul(&gm, &g.iter().map(|r| r.to_vec()).collect::<Vec<_>>()),
            &tr(&gm),
        );
        let bt = rows(&BT);
        let v = mul(
            &mul(&bt, &d.iter().map(|r| r.to_vec()).collect::<Vec<_>>()),
            &tr(&bt),
        );
        let uv: Vec<Vec<f64>> = (0..P)
            .map(|i| (0..P).map(|j| u[i][j] * v[i][j]).collect())
            .collect();
        let at = rows(&AT);
        let y = mul(&mul(&at, &uv), &tr(&at));
        for a in 0..4 {
            for b in 0..4 {
                let direct: f64 = (0..3)
                    .flat_map(|i| (0..3).map(move |j| (i, j)))
                    .map(|(i, j)| g[i][j] * d[a + i][b + j])
                    .sum();
                assert!(
                    (y[a][b] - direct).abs() < 1e-9,
                    "({a}, {b}): {} against {direct}",
                    y[a][b]
                );
            }
        }
    }
}
