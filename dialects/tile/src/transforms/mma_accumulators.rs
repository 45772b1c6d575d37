//! `tile.mma-accumulators`: a tensor-core product's accumulator kept in
//! its fragments across the loop over the depth.
//!
//! In the flat layout, every `tile.dot {mma}` of a GPU's depth loop moves
//! the accumulator through shared memory into the warps' fragments and
//! back. Where a loop's carried value is only ever the accumulator of a
//! chain of tensor-core products whose last result is yielded back, the
//! value is carried in the `#mma<r, c>` layout instead: converted once
//! before the loop and once after it. The grid of warps holding its tiles
//! is the one of the target's warps per program that reads the fewest
//! fragment bytes per step (`MmaGrid::choose`); an accumulator no grid
//! divides stays flat.

use dlc_core::TargetDesc;

use super::users;
use crate::ir::{Block, Function, Layout, MmaGrid, OpId, Type, Value};
use crate::ops::OpKind;

/// Carries each such accumulator of `f` in the `#mma` layout of
/// `target`'s warps; returns how many.
pub fn mma_accumulators(f: &mut Function, target: &TargetDesc) -> usize {
    let Some(gpu) = target.gpu() else {
        return 0;
    };
    let warps = target.program_threads() / gpu.warp_size.max(1);
    let mut changed = 0;
    for i in 0..f.ops.len() {
        if !matches!(f.ops[i].kind, OpKind::For { .. }) {
            continue;
        }
        for k in 0..f.ops[i].operands.len() {
            let Some(chain) = accumulator_chain(f, OpId(i as u32), k) else {
                continue;
            };
            let arg = f.op(OpId(i as u32)).regions[0].args[1 + k];
            let Type::Tile(t) = f.ty(arg) else { continue };
            if let Some(grid) = MmaGrid::choose(t.shape[0], t.shape[1], warps) {
                carry_in_fragments(f, OpId(i as u32), k, &chain, grid);
                changed += 1;
            }
        }
    }
    changed
}

/// The tensor-core products carried value `k` of loop `l` passes through:
/// the loop's argument is the accumulator of the first alone, each one's
/// result the accumulator of the next alone, the last one's result yielded
/// as value `k` alone; all in the loop's body, the value a flat f32
/// matrix of whole 16 x 8 tiles.
fn accumulator_chain(f: &Function, l: OpId, k: usize) -> Option<Vec<OpId>> {
    let body = f.op(l).regions.first()?;
    let arg = *body.args.get(1 + k)?;
    let fits =
        |v: Value| matches!(f.ty(v), Type::Tile(t) if t.layout == Layout::Flat && t.fits_mma());
    if !fits(arg) {
        return None;
    }
    let mut chain = Vec::new();
    let mut cur = arg;
    loop {
        let [user] = users(f, cur)[..] else {
            return None;
        };
        if !body.ops.contains(&user) {
            return None;
        }
        let op = f.op(user);
        match op.kind {
            OpKind::Dot { mma: Some(_) }
                if op.operands[2] == cur && op.operands[..2] != [cur; 2] =>
            {
                chain.push(user);
                cur = op.results[0];
            }
            OpKind::Yield if op.operands.get(k) == Some(&cur) && !chain.is_empty() => {
                return Some(chain);
            }
            _ => return None,
        }
    }
}

/// Carries value `k` of loop `l`, through `chain`, in the `#mma` layout:
/// converted before the loop and after it.
fn carry_in_fragments(f: &mut Function, l: OpId, k: usize, chain: &[OpId], grid: MmaGrid) {
    let mma = |f: &Function, v: Value| match f.ty(v) {
        Type::Tile(t) => Type::Tile(t.clone().with_layout(Layout::Mma(grid))),
        other => other.clone(),
    };
    let arg = f.op(l).regions[0].args[1 + k];
    let mut retyped = vec![arg];
    retyped.extend(chain.iter().map(|&d| f.op(d).results[0]));
    for v in retyped {
        f.values[v.0 as usize] = mma(f, v);
    }
    let (init, result) = (f.op(l).operands[k], f.op(l).results[k]);
    let flat = f.ty(result).clone();
    let before = f.create_op(OpKind::ConvertLayout, vec![init], &[mma(f, init)], vec![]);
    let carried = f.op(before).results[0];
    f.ops[l.0 as usize].operands[k] = carried;
    f.values[result.0 as usize] = mma(f, result);
    let after = f.create_op(OpKind::ConvertLayout, vec![result], &[flat], vec![]);
    let converted = f.op(after).results[0];
    for (i, op) in f.ops.iter_mut().enumerate() {
        if i != after.0 as usize {
            for o in op.operands.iter_mut().filter(|o| **o == result) {
                *o = converted;
            }
        }
    }
    // The conversions go around the loop, in the block that holds it.
    let place = |b: &mut Block| {
        if let Some(at) = b.ops.iter().position(|&o| o == l) {
            b.ops.insert(at + 1, after);
            b.ops.insert(at, before);
            true
        } else {
            false
        }
    };
    if !place(&mut f.body) {
        for i in 0..f.ops.len() {
            let mut regions = std::mem::take(&mut f.ops[i].regions);
            let placed = regions.iter_mut().any(place);
            f.ops[i].regions = regions;
            if placed {
                break;
            }
        }
    }
}
