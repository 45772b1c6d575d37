//! `tile.shared-layouts`: how the blocks a GPU's tensor-core products read
//! lie in shared memory.
//!
//! A tensor-core product reads its operands' fragments from the schedule's
//! staged blocks in place, one 32-bit word per lane and register, in the
//! PTX ISA's layouts (group `g = lane / 4`, member `t = lane % 4`): the
//! left operand's lane reads row `g` at depth `t` words, the right one's
//! (row-major, depth by column) column `g` at depth `t` words (two 16-bit
//! elements are two rows then). With rows of 64 or 128 bytes the eight
//! rows of a fragment fall in the same few banks of shared memory, and
//! each read is served in four passes. This pass gives each shared buffer
//! those reads touch rows at a pitch, in its strides (`buffer<bf16[2, 64,
//! 32], strides = [2560, 40, 1], shared>`): the shortest, 16-byte aligned,
//! at which no two lanes of any such read touch different words of one
//! bank (the target's `GpuDesc::shared_banks`). Loads, stores and copies
//! address a buffer by its strides; code generation reads the fragments at
//! its pitch.

use dlc_core::{DType, Layout as Strided, TargetDesc};

use crate::ir::{Block, Function, Space, Type, Value};
use crate::ops::OpKind;

/// Lanes of a warp whose reads the pitch is chosen for (`mma.sync`'s).
const LANES: usize = 32;

/// Rows at a pitch start 16-byte aligned (vector reads of a row stay
/// aligned).
const ROW_ALIGN: usize = 16;

/// Which operand of a tensor-core product a block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Left (rows by depth).
    Left,
    /// Right (depth by columns).
    Right,
}

/// Gives every shared buffer of `f` that `target`'s tensor-core products
/// read in place rows at the pitch their fragment reads need; returns how
/// many buffers it changed.
pub fn shared_layouts(f: &mut Function, target: &TargetDesc) -> usize {
    let Some(gpu) = target.gpu() else {
        return 0;
    };
    let mut changed = 0;
    for kernel in 0..f.ops.len() {
        if !matches!(f.ops[kernel].kind, OpKind::Kernel { .. }) {
            continue;
        }
        let mut allocs = Vec::new();
        for r in &f.ops[kernel].regions {
            shared_allocs(f, r, &mut allocs);
        }
        let mut chosen = Vec::new();
        let mut bytes = 0usize;
        for &buf in &allocs {
            let Type::Buffer(t) = f.ty(buf) else { continue };
            let padded = match pitch_for(f, buf, gpu.shared_banks) {
                Some(p) if t.is_contiguous() => {
                    let l = Strided::with_row_pitch(t.dtype, t.shape.clone(), p);
                    chosen.push((buf, l.clone()));
                    l
                }
                _ => t.layout.clone(),
            };
            bytes += padded.storage_len().unwrap_or(usize::MAX) * padded.dtype.size_bytes();
        }
        // Padding that would not fit in the block's shared memory is not
        // worth a kernel the target cannot run.
        if bytes > gpu.shared_memory_per_block {
            continue;
        }
        for (buf, l) in chosen {
            if let Type::Buffer(t) = &mut f.values[buf.0 as usize] {
                t.layout = l;
                changed += 1;
            }
        }
    }
    changed
}

/// The shared buffers allocated in `b` and the blocks nested in it.
fn shared_allocs(f: &Function, b: &Block, out: &mut Vec<Value>) {
    for &id in &b.ops {
        let op = f.op(id);
        if matches!(op.kind, OpKind::Alloc)
            && let Some(&r) = op.results.first()
            && matches!(f.ty(r), Type::Buffer(t) if t.space == Space::Shared)
        {
            out.push(r);
        }
        for r in &op.regions {
            shared_allocs(f, r, out);
        }
    }
}

/// The pitch `buf`'s rows need: `None` when no tensor-core product reads
/// it, when anything but loads and stores uses it (a view keeps the
/// strides it was made with), or when no pitch serves every read.
fn pitch_for(f: &Function, buf: Value, banks: (usize, usize)) -> Option<usize> {
    let Type::Buffer(t) = f.ty(buf) else {
        return None;
    };
    if t.shape.len() < 2 {
        return None;
    }
    let rows = &t.shape[t.shape.len() - 2..];
    let mut roles = Vec::new();
    for op in &f.ops {
        let uses: Vec<usize> = (0..op.operands.len())
            .filter(|&i| op.operands[i] == buf)
            .collect();
        match op.kind {
            _ if uses.is_empty() => {}
            OpKind::Load { .. } if uses == [0] => {
                let whole = matches!(f.ty(op.results[0]), Type::Tile(x) if x.shape == rows);
                for user in &f.ops {
                    if !whole || !matches!(user.kind, OpKind::Dot { mma: Some(_) }) {
                        continue;
                    }
                    if user.operands[0] == op.results[0] {
                        roles.push(Role::Left);
                    }
                    if user.operands[1] == op.results[0] {
                        roles.push(Role::Right);
                    }
                }
            }
            OpKind::Store { .. } if uses == [1] => {}
            _ => return None,
        }
    }
    if roles.is_empty() {
        return None;
    }
    let (cols, size) = (rows[1], t.dtype.size_bytes());
    let step = ROW_ALIGN / gcd(ROW_ALIGN, size);
    let first = cols.div_ceil(step) * step;
    // Past a whole turn of the banks the patterns repeat.
    let last = first + banks.0 * banks.1;
    (first..=last)
        .step_by(step)
        .find(|&p| roles.iter().all(|&r| conflict_free(r, t.dtype, p, banks)))
}

/// Whether one fragment read of an operand in role `r`, of type `d`, from
/// rows `pitch` elements apart touches at most one word of each bank.
fn conflict_free(r: Role, d: DType, pitch: usize, (banks, bank_bytes): (usize, usize)) -> bool {
    let size = d.size_bytes();
    let per_word = (4 / size).max(1);
    let mut word_of_bank = vec![None; banks];
    (0..LANES).all(|lane| {
        let (g, t) = (lane / 4, lane % 4);
        let (row, col) = match r {
            Role::Left => (g, t * per_word),
            Role::Right => (t * per_word, g),
        };
        let word = (row * pitch + col) * size / bank_bytes;
        let seen = &mut word_of_bank[word % banks];
        *seen.get_or_insert(word) == word
    })
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BANKS: (usize, usize) = (32, 4);

    #[test]
    fn row_major_blocks_conflict_and_padded_ones_do_not() {
        // The GPU schedule's blocks: 64 x 32 left, 32 x 64 right.
        assert!(!conflict_free(Role::Left, DType::BF16, 32, BANKS));
        assert!(conflict_free(Role::Left, DType::BF16, 40, BANKS));
        assert!(!conflict_free(Role::Right, DType::BF16, 64, BANKS));
        assert!(conflict_free(Role::Right, DType::BF16, 72, BANKS));
        assert!(!conflict_free(Role::Left, DType::F32, 32, BANKS));
        assert!(conflict_free(Role::Left, DType::F32, 36, BANKS));
        // TF32's right operand: a row of 68 words still puts members
        // 0 and 1 of groups 4 apart in one bank.
        assert!(!conflict_free(Role::Right, DType::F32, 68, BANKS));
        assert!(conflict_free(Role::Right, DType::F32, 72, BANKS));
    }
}
