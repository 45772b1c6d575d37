//! `tile.tensor-cores`: which products a GPU runs on its tensor cores.
//!
//! The choice is the target's (`GpuDesc::mma`: the instruction shapes per
//! operand type, f32 only with TF32) and the product's (whole steps of the
//! shape, an f32 accumulator, a program of whole warps); it is written on
//! each `tile.dot` as `{mma = [m, n, k]}`, so `--emit tile --target sm_90`
//! shows it and code generation follows it rather than deciding again.

use dlc_core::{DType, TargetDesc};

use crate::ir::{Function, Layout, Type};
use crate::ops::OpKind;

/// Marks every `tile.dot` of `f` that `target` runs on tensor cores with
/// the shape of its instruction, and unmarks the others (but a product
/// whose accumulator is already in the `#mma` layout); returns how many
/// are marked.
pub fn tensor_cores(f: &mut Function, target: &TargetDesc) -> usize {
    let choices: Vec<Option<[usize; 3]>> = (0..f.ops.len()).map(|i| shape(f, i, target)).collect();
    let mut marked = 0;
    for (i, choice) in choices.into_iter().enumerate() {
        // A product whose accumulator is laid out for its mark keeps it.
        let laid = f.ops[i]
            .operands
            .get(2)
            .is_some_and(|&acc| matches!(f.ty(acc), Type::Tile(t) if t.layout != Layout::Flat));
        if let OpKind::Dot { mma } = &mut f.ops[i].kind {
            if !laid {
                *mma = choice;
            }
            marked += usize::from(mma.is_some());
        }
    }
    marked
}

/// The tensor-core instruction shape for op `i` of `f` on `target`: a
/// `tile.dot` of operands of a type the target has a shape for, into an
/// f32 accumulator, in whole steps of it, in a program of whole warps.
fn shape(f: &Function, i: usize, target: &TargetDesc) -> Option<[usize; 3]> {
    let op = &f.ops[i];
    let gpu = target.gpu()?;
    if !matches!(op.kind, OpKind::Dot { .. })
        || !target.program_threads().is_multiple_of(gpu.warp_size)
    {
        return None;
    }
    // (An op taken out of its block has no operands left.)
    let [a, b, acc] = op.operands[..] else {
        return None;
    };
    let (Type::Tile(a), Type::Tile(b), Type::Tile(acc)) = (f.ty(a), f.ty(b), f.ty(acc)) else {
        return None;
    };
    let (m, k, n) = (a.shape[0], a.shape[1], *b.shape.get(1)?);
    let &(_, shape @ [mm, mn, mk]) = gpu.mma.iter().find(|(d, _)| *d == a.dtype)?;
    (acc.dtype == DType::F32 && m % mm == 0 && n % mn == 0 && k % mk == 0).then_some(shape)
}
