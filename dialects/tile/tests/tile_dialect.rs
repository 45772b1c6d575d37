//! The tile dialect on its own: text round trips, the MLIR generic form
//! parses, and the interpreter runs programs exactly: masks and pads,
//! packing through scratch memory, shared memory between barriers, dots and
//! reductions, and refuses what is wrong (out of bounds, overlapping stores,
//! races on shared memory).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::ir::OpDecl;
use dlc_core::{DType, Verify};
use dlc_tile::interp::{Buffer, TileError, run_function};
use dlc_tile::{BufferType, Space, parse_module, print_mlir_generic, print_module};

fn module(text: &str) -> dlc_tile::Module {
    let m = parse_module(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    if let Err(errors) = m.verify() {
        panic!("does not verify: {errors:?}\n{text}");
    }
    let printed = print_module(&m);
    let again = parse_module(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(print_module(&again), printed, "does not round-trip");
    if let Some(tool) = dlc_tests::mlir_opt() {
        dlc_tests::mlir_parses(&tool, &print_mlir_generic(&m)).unwrap();
    }
    m
}

fn buffer(dtype: DType, shape: &[usize], data: Vec<f64>) -> Buffer {
    Buffer {
        ty: BufferType::contiguous(dtype, shape.to_vec(), Space::Global),
        data,
    }
}

fn run(m: &dlc_tile::Module, args: &mut [Buffer]) -> Result<(), TileError> {
    run_function(m, "f", args)
}

/// A matrix product with ragged blocks: a 5 x 7 by 7 x 3 product in 4 x 2
/// blocks with a K loop of 4, masks on every ragged edge, the left operand
/// packed through scratch memory transposed (and read back transposed),
/// the right one staged through shared memory between barriers.
const BLOCKED_PRODUCT: &str = "
tile.func @f(%a: buffer<f32[5, 7]>, %b: buffer<f32[7, 3]>, out %c: buffer<f32[5, 3]>) {
  tile.kernel {grid = [2, 2], schedule = \"dot\", tile = [4, 2, 4]} {
    %i = tile.program_id {axis = 0} : index
    %j = tile.program_id {axis = 1} : index
    %pack = tile.alloc : buffer<f32[4, 4], scratch>
    %sb = tile.alloc : buffer<f32[4, 2], shared>
    %zero = tile.const {value = 0.0} : tile<4x2xf32>
    %acc:1 = tile.for %zero {lo = 0, hi = 7, step = 4} (%k, %part) {
      %ma = tile.mask [5 - 4*%i, 7 - %k] : tile<4x4xbool>
      %ta = tile.load %a[4*%i + #0, %k + #1] mask %ma {pad = 0.0} : tile<4x4xf32>
      %tt = tile.trans %ta {perm = [1, 0]} : tile<4x4xf32>
      tile.store %tt, %pack[#0, #1]
      %pa = tile.load %pack[#1, #0] : tile<4x4xf32>
      %mb = tile.mask [7 - %k, 3 - 2*%j] : tile<4x2xbool>
      %tb = tile.load %b[%k + #0, 2*%j + #1] mask %mb {pad = 0.0} : tile<4x2xf32>
      tile.store %tb, %sb[#0, #1]
      tile.barrier
      %sbt = tile.load %sb[#0, #1] : tile<4x2xf32>
      %next = tile.dot %pa, %sbt, %part : tile<4x2xf32>
      tile.barrier
      tile.yield %next
    } : tile<4x2xf32>
    %mc = tile.mask [5 - 4*%i, 3 - 2*%j] : tile<4x2xbool>
    tile.store %acc#0, %c[4*%i + #0, 2*%j + #1] mask %mc
  }
  tile.return
}
";

#[test]
fn a_blocked_product_with_packing_and_shared_memory_runs_exactly() {
    let m = module(BLOCKED_PRODUCT);
    let a: Vec<f64> = (0..35).map(|x| f64::from(x % 11) - 5.0).collect();
    let b: Vec<f64> = (0..21).map(|x| f64::from(x % 7) * 0.5 - 1.0).collect();
    let mut args = [
        buffer(DType::F32, &[5, 7], a.clone()),
        buffer(DType::F32, &[7, 3], b.clone()),
        buffer(DType::F32, &[5, 3], vec![0.0; 15]),
    ];
    run(&m, &mut args).unwrap();
    for i in 0..5 {
        for j in 0..3 {
            let want: f64 = (0..7).map(|k| a[i * 7 + k] * b[k * 3 + j]).sum();
            assert_eq!(args[2].data[i * 3 + j], want, "c[{i}, {j}]");
        }
    }
}

#[test]
fn shared_memory_read_without_a_barrier_is_a_race() {
    let text = BLOCKED_PRODUCT.replacen("      tile.barrier\n", "", 1);
    let m = module(&text);
    let mut args = [
        buffer(DType::F32, &[5, 7], vec![1.0; 35]),
        buffer(DType::F32, &[7, 3], vec![1.0; 21]),
        buffer(DType::F32, &[5, 3], vec![0.0; 15]),
    ];
    let e = run(&m, &mut args).unwrap_err();
    assert!(
        matches!(
            e,
            TileError::SharedRace {
                what: "reads",
                since: "written",
                ..
            }
        ),
        "{e}"
    );
    // Without the barrier at the end of the loop, the next iteration's
    // store overwrites what this one read.
    let text = BLOCKED_PRODUCT.replace("      tile.barrier\n      tile.yield", "      tile.yield");
    let e = run(&module(&text), &mut args).unwrap_err();
    assert!(
        matches!(
            e,
            TileError::SharedRace {
                what: "writes",
                since: "read",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn reading_unwritten_scratch_memory_shows() {
    // Packing that forgets the last row of each block: the product reads
    // NaN from scratch memory, which the interpreter fills it with.
    let text = BLOCKED_PRODUCT.replace(
        "tile.store %tt, %pack[#0, #1]",
        "%half = tile.reshape %tt : tile<4x4xf32>\n      tile.store %half, %pack[#0, #1] mask %ma",
    );
    let m = module(&text);
    let mut args = [
        buffer(DType::F32, &[5, 7], vec![1.0; 35]),
        buffer(DType::F32, &[7, 3], vec![1.0; 21]),
        buffer(DType::F32, &[5, 3], vec![0.0; 15]),
    ];
    run(&m, &mut args).unwrap();
    assert!(
        args[2].data.iter().any(|x| x.is_nan()),
        "{:?}",
        args[2].data
    );
}

const ROWS: &str = "
tile.func @f(%x: buffer<f32[3, 10]>, out %o: buffer<f32[3]>, out %y: buffer<f32[3, 10]>) {
  tile.kernel {grid = [3], schedule = \"rows\", vector = [4]} {
    %r = tile.program_id {axis = 0} : index
    %init = tile.const {value = -inf} : tile<4xf32>
    %ninf = tile.const {value = -inf} : tile<4xf32>
    %m:1 = tile.for %init {lo = 0, hi = 10, step = 4} (%c, %acc) {
      %on = tile.mask [10 - %c] : tile<4xbool>
      %v = tile.load %x[%r, %c + #0] mask %on {pad = 0.0} : tile<4xf32>
      %w = tile.select %on, %v, %ninf : tile<4xf32>
      %next = tile.maximum %acc, %w : tile<4xf32>
      tile.yield %next
    } : tile<4xf32>
    %max = tile.reduce %m#0 {kind = max, axis = 0} : f32
    tile.store %max, %o[%r]
    tile.for {lo = 0, hi = 10, step = 4} (%c2) {
      %on2 = tile.mask [10 - %c2] : tile<4xbool>
      %v2 = tile.load %x[%r, %c2 + #0] mask %on2 {pad = 0.0} : tile<4xf32>
      %s = tile.splat %max : tile<4xf32>
      %d = tile.sub %v2, %s : tile<4xf32>
      tile.store %d, %y[%r, %c2 + #0] mask %on2
    }
  }
  tile.return
}
";

#[test]
fn row_reductions_with_ragged_masks() {
    let m = module(ROWS);
    let x: Vec<f64> = (0..30).map(|i| f64::from((i * 7) % 13) - 6.0).collect();
    let mut args = [
        buffer(DType::F32, &[3, 10], x.clone()),
        buffer(DType::F32, &[3], vec![0.0; 3]),
        buffer(DType::F32, &[3, 10], vec![0.0; 30]),
    ];
    run(&m, &mut args).unwrap();
    for r in 0..3 {
        let row = &x[r * 10..r * 10 + 10];
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(args[1].data[r], max);
        for (c, x) in row.iter().enumerate() {
            assert_eq!(args[2].data[r * 10 + c], x - max);
        }
    }
}

/// A masked load without a pad reads zero where its mask is off (and reads
/// nothing there: no bounds test per lane), as the vectorized loops' ragged
/// tiles of in-bounds loads are.
#[test]
fn masked_off_lanes_without_a_pad_read_zero() {
    let no_pad = ROWS.replace("mask %on {pad = 0.0}", "mask %on");
    let x = vec![-1.0; 30];
    let fresh = || {
        [
            buffer(DType::F32, &[3, 10], x.clone()),
            buffer(DType::F32, &[3], vec![5.0; 3]),
            buffer(DType::F32, &[3, 10], vec![5.0; 30]),
        ]
    };
    let mut args = fresh();
    run(&module(&no_pad), &mut args).unwrap();
    assert_eq!(args[1].data, vec![-1.0; 3]);
    // Without the select, the last tile's two lanes past the row are
    // zeros in the maximum.
    let unselected = no_pad.replace(
        "%next = tile.maximum %acc, %w",
        "%next = tile.maximum %acc, %v",
    );
    let mut args = fresh();
    run(&module(&unselected), &mut args).unwrap();
    assert_eq!(args[1].data, vec![0.0; 3]);
    assert_eq!(args[2].data, vec![-1.0; 30]);
}

#[test]
fn what_the_interpreter_refuses() {
    // Without the mask, the last tile of each row reads past the buffer.
    let no_mask = ROWS.replace(
        "%v = tile.load %x[%r, %c + #0] mask %on {pad = 0.0}",
        "%v = tile.load %x[%r, %c + #0]",
    );
    let mut args = [
        buffer(DType::F32, &[3, 10], vec![1.0; 30]),
        buffer(DType::F32, &[3], vec![0.0; 3]),
        buffer(DType::F32, &[3, 10], vec![0.0; 30]),
    ];
    let e = run(&module(&no_mask), &mut args).unwrap_err();
    assert!(
        matches!(&e, TileError::OutOfBounds { index, .. } if index == &vec![0, 10]),
        "{e}"
    );
    // Two elements of one store may not write one place.
    let overlap = ROWS.replace(
        "tile.store %d, %y[%r, %c2 + #0]",
        "tile.store %d, %y[%r, %c2]",
    );
    let e = run(&module(&overlap), &mut args).unwrap_err();
    assert!(matches!(e, TileError::OverlappingStore { .. }), "{e}");
    // Arguments are checked.
    let mut wrong = [buffer(DType::F32, &[3, 9], vec![0.0; 27])];
    let e = run(&module(ROWS), &mut wrong).unwrap_err();
    assert!(matches!(e, TileError::Arguments(_)), "{e}");
}

/// `tile.prefetch` names the level of cache its lines go to where it is not
/// the first (`level = 2`: a packed panel's next slice, read only after
/// this one), reads back as written, changes no result, and a level past
/// the third is an error that says so.
#[test]
fn prefetches_name_their_cache_level() {
    let fetched = ROWS.replace(
        "    tile.store %max, %o[%r]\n",
        "    tile.store %max, %o[%r]\n    tile.prefetch %x[%r, #1] {shape = [1, 4]}\n    tile.prefetch %x[%r + 1, #1] {shape = [1, 4], level = 2}\n",
    );
    assert_ne!(fetched, ROWS);
    let m = module(&fetched);
    let text = print_module(&m);
    assert_eq!(text.matches("tile.prefetch").count(), 2, "{text}");
    assert_eq!(text.matches("level = 2").count(), 1, "{text}");
    let x: Vec<f64> = (0..30).map(|i| f64::from(i % 7)).collect();
    let fresh = || {
        [
            buffer(DType::F32, &[3, 10], x.clone()),
            buffer(DType::F32, &[3], vec![0.0; 3]),
            buffer(DType::F32, &[3, 10], vec![0.0; 30]),
        ]
    };
    let (mut with, mut without) = (fresh(), fresh());
    run(&m, &mut with).unwrap();
    run(&module(ROWS), &mut without).unwrap();
    assert_eq!(with[1].data, without[1].data);
    assert_eq!(with[2].data, without[2].data);
    let wrong = parse_module(&fetched.replace("level = 2", "level = 4")).unwrap();
    let errors = format!("{:?}", wrong.verify().unwrap_err());
    assert!(
        errors.contains("prefetches into cache level 4 (there are levels 1 to 3)"),
        "{errors}"
    );
}

#[test]
fn narrow_floats_dot_and_reduce_round_once() {
    // 2048 f16 ones summed with tile.reduce give 2048 (exact, rounded once),
    // and a dot of f16 tiles accumulates in f32.
    let text = "
tile.func @f(%x: buffer<f16[1, 4096]>, out %o: buffer<f32[2]>) {
  tile.kernel {grid = [1], schedule = \"serial\", vector = [64]} {
    %t = tile.load %x[0, #0] : tile<4096xf16>
    %w = tile.cast %t : tile<4096xf32>
    %s = tile.reduce %w {kind = sum, axis = 0} : f32
    tile.store %s, %o[0]
    %a = tile.load %x[#0, #1] : tile<1x4096xf16>
    %b = tile.load %x[#1, #0] : tile<4096x1xf16>
    %z = tile.const {value = 0.0} : tile<1x1xf32>
    %d = tile.dot %a, %b, %z : tile<1x1xf32>
    tile.store %d, %o[1 + #0 + #1]
  }
  tile.return
}
";
    let m = module(text);
    let mut args = [
        buffer(DType::F16, &[1, 4096], vec![1.0; 4096]),
        buffer(DType::F32, &[2], vec![0.0; 2]),
    ];
    run(&m, &mut args).unwrap();
    assert_eq!(args[1].data, vec![4096.0, 4096.0]);
}

#[test]
fn work_is_estimated_before_running() {
    let m = module(BLOCKED_PRODUCT);
    let f = &m.functions[0];
    assert!(dlc_tile::interp::check_work(f, 1e6).is_ok());
    let e = dlc_tile::interp::check_work(f, 10.0).unwrap_err();
    assert!(e.to_string().contains("tile.kernel"), "{e}");
    // A huge grid or loop counts even with nothing in it.
    let empty = module(
        "tile.func @f() {
  tile.kernel {grid = [1000000, 1000000], schedule = \"serial\", vector = [64]} {
    tile.for {lo = 0, hi = 1000000, step = 1} (%i) {
    }
  }
  tile.return
}
",
    );
    assert!(dlc_tile::interp::check_work(&empty.functions[0], 1e12).is_err());
}

/// Kernels that do the same thing to different buffers have one
/// fingerprint (code generation emits them once); their inputs come back in
/// the order of first use, and a kernel that differs in anything (a
/// constant, a buffer's layout) has another.
#[test]
fn kernels_doing_the_same_thing_share_a_fingerprint() {
    let m = module(
        "
tile.func @f(%x: buffer<f32[4, 8]>, %y: buffer<f32[8, 4], strides = [1, 8]>, out %o: buffer<f32[4, 8]>) {
  %a = tile.alloc : buffer<f32[4, 8]>
  tile.kernel {grid = [4], schedule = \"rows\", vector = [8]} {
    %p = tile.program_id {axis = 0} : index
    %t = tile.load %x[%p, #0] : tile<8xf32>
    %u = tile.exp %t : tile<8xf32>
    tile.store %u, %a[%p, #0]
  }
  tile.kernel {grid = [4], schedule = \"rows\", vector = [8]} {
    %p = tile.program_id {axis = 0} : index
    %t = tile.load %a[%p, #0] : tile<8xf32>
    %u = tile.exp %t : tile<8xf32>
    tile.store %u, %o[%p, #0]
  }
  tile.kernel {grid = [4], schedule = \"rows\", vector = [8]} {
    %p = tile.program_id {axis = 0} : index
    %t = tile.load %a[%p, #0] : tile<8xf32>
    %u = tile.tanh %t : tile<8xf32>
    tile.store %u, %o[%p, #0]
  }
  tile.kernel {grid = [4], schedule = \"rows\", vector = [8]} {
    %p = tile.program_id {axis = 0} : index
    %t = tile.load %y[#0, %p] : tile<8xf32>
    %u = tile.exp %t : tile<8xf32>
    tile.store %u, %o[%p, #0]
  }
  tile.dealloc %a
  tile.return
}",
    );
    let f = &m.functions[0];
    let kernels: Vec<_> = f
        .body
        .ops
        .iter()
        .copied()
        .filter(|&id| f.op(id).kind.name() == "tile.kernel")
        .collect();
    let prints: Vec<_> = kernels
        .iter()
        .map(|&k| dlc_tile::print::fingerprint(f, k))
        .collect();
    let names = |vs: &[dlc_tile::Value]| -> Vec<String> {
        vs.iter()
            .map(|v| {
                f.params
                    .iter()
                    .find(|(_, p)| p == v)
                    .map_or_else(|| "a".to_string(), |(n, _)| n.clone())
            })
            .collect()
    };
    assert_eq!(prints[0].0, prints[1].0);
    assert_eq!(names(&prints[0].1), ["x", "a"]);
    assert_eq!(names(&prints[1].1), ["a", "o"]);
    assert_ne!(prints[1].0, prints[2].0, "tanh is not exp");
    assert_ne!(prints[0].0, prints[3].0, "another buffer type");
}

/// A view with an offset reads its part of the storage (the interpreter
/// adds the offset to every access), and kernels that differ only in the
/// offsets of their input buffers share a relocatable fingerprint (code
/// generation passes each input as a pointer to its first element) but
/// not an exact one; a kernel whose own views move from their source keeps
/// its offsets in the key, as do views that start before their source or
/// reach past it, which the verifier refuses.
#[test]
fn views_with_offsets() {
    let kernel = |src: &str, dst: &str, op: &str| {
        format!(
            "  tile.kernel {{grid = [2], schedule = \"rows\", vector = [4]}} {{
    %p = tile.program_id {{axis = 0}} : index
    %t = tile.load {src}[%p, #0] : tile<4xf32>
    %u = tile.{op} %t : tile<4xf32>
    tile.store %u, {dst}[%p, #0]
  }}
"
        )
    };
    let text = format!(
        "tile.func @f(%x: buffer<f32[3, 2, 4]>, out %o: buffer<f32[3, 2, 4]>) {{
  %a = tile.view %x : buffer<f32[2, 4]>
  %b = tile.view %x : buffer<f32[2, 4], offset = 8>
  %c = tile.view %x : buffer<f32[2, 4], offset = 16>
  %oa = tile.view %o : buffer<f32[2, 4]>
  %ob = tile.view %o : buffer<f32[2, 4], offset = 8>
  %oc = tile.view %o : buffer<f32[2, 4], offset = 16>
{}{}{}  tile.kernel {{grid = [1], schedule = \"rows\", vector = [4]}} {{
    %v = tile.view %x : buffer<f32[4], offset = 4>
    %t = tile.load %v[#0] : tile<4xf32>
    tile.store %t, %oa[0, #0]
  }}
  tile.kernel {{grid = [1], schedule = \"rows\", vector = [4]}} {{
    %v = tile.view %b : buffer<f32[4], offset = 12>
    %t = tile.load %v[#0] : tile<4xf32>
    tile.store %t, %oa[0, #0]
  }}
  tile.return
}}",
        kernel("%a", "%oa", "exp"),
        kernel("%b", "%ob", "exp"),
        kernel("%c", "%oc", "neg"),
    );
    let m = module(&text);
    assert!(print_module(&m).contains("buffer<f32[2, 4], offset = 16>"));
    let mut args = vec![
        buffer(
            DType::F32,
            &[3, 2, 4],
            (0..24).map(|i| i as f64 / 8.0).collect(),
        ),
        buffer(DType::F32, &[3, 2, 4], vec![0.0; 24]),
    ];
    run(&m, &mut args).unwrap();
    let want: Vec<f64> = (0..24)
        .map(|i| {
            let x = i as f64 / 8.0;
            match i {
                // The last two kernels copy x[0, 1, ..] and x[1, 1, ..].
                0..4 => ((i + 12) as f64) / 8.0,
                4..8 => x.exp(),
                8..16 => x.exp(),
                _ => -x,
            }
        })
        .collect();
    for (g, w) in args[1].data.iter().zip(&want) {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{:?}",
            args[1].data
        );
    }
    let f = &m.functions[0];
    let kernels: Vec<_> = f
        .body
        .ops
        .iter()
        .copied()
        .filter(|&id| f.op(id).kind.name() == "tile.kernel")
        .collect();
    let exact: Vec<_> = kernels
        .iter()
        .map(|&k| dlc_tile::print::fingerprint(f, k).0)
        .collect();
    let relocatable: Vec<_> = kernels
        .iter()
        .map(|&k| dlc_tile::print::relocatable_fingerprint(f, k).0)
        .collect();
    assert_ne!(exact[0], exact[1], "the offsets differ");
    assert_eq!(relocatable[0], relocatable[1], "only the offsets differ");
    assert_ne!(relocatable[1], relocatable[2], "neg is not exp");
    // Views inside the kernels move 4 elements from %x and from %b: the
    // code depends on their offsets, which stay in the key.
    assert!(relocatable[3].contains("offset = 4"), "{}", relocatable[3]);
    assert_ne!(relocatable[3], relocatable[4]);
    for bad in [
        "tile.func @f(%x: buffer<f32[8], offset = 8>) {\n  tile.return\n}",
        "tile.func @f(%x: buffer<f32[8]>) {\n  %a = tile.alloc : buffer<f32[4], offset = 4>\n  tile.return\n}",
        "tile.func @f(%x: buffer<f32[8]>) {\n  %a = tile.view %x : buffer<f32[4], offset = 5>\n  tile.return\n}",
        "tile.func @f(%x: buffer<f32[8]>) {\n  %a = tile.view %x : buffer<f32[4], offset = 4>\n  %b = tile.view %a : buffer<f32[4], offset = 2>\n  tile.return\n}",
    ] {
        let m = parse_module(bad).unwrap_or_else(|e| panic!("{e}\n{bad}"));
        let errors = m.verify().unwrap_err();
        assert!(
            errors
                .iter()
                .any(|e| e.message.contains("offset") || e.message.contains("reaches outside")),
            "{bad}: {errors:?}"
        );
    }
}

/// The source places of ops that cannot fail do not keep kernels apart (a
/// model's many identical products share code); those of ops that can (an
/// integer division by zero names its place) do.
#[test]
fn only_the_places_of_failures_are_in_a_fingerprint() {
    let kernel = |op: &str, ty: &str| {
        format!(
            "  tile.kernel {{grid = [4], schedule = \"rows\", vector = [8]}} {{
    %p = tile.program_id {{axis = 0}} : index
    %t = tile.load %x[%p, #0] : tile<8x{ty}>
    %u = tile.{op} %t, %t : tile<8x{ty}>
    tile.store %u, %o[%p, #0]
  }}
"
        )
    };
    for (ty, op, apart) in [
        ("f32", "add", false),
        ("i32", "add", false),
        ("i32", "div", true),
    ] {
        let text = format!(
            "tile.func @f(%x: buffer<{ty}[4, 8]>, out %o: buffer<{ty}[4, 8]>) {{\n{}{}  tile.return\n}}",
            kernel(op, ty),
            kernel(op, ty)
        );
        let mut m = module(&text);
        let f = &mut m.functions[0];
        let kernels: Vec<_> = f.body.ops[..2].to_vec();
        // The same ops, from two places of a source file.
        for (line, &k) in kernels.iter().enumerate() {
            let mut inner = vec![k];
            while let Some(id) = inner.pop() {
                f.ops[id.0 as usize].loc = Some(dlc_core::SourceLoc {
                    file: "m.dl".into(),
                    line: line as u32 + 1,
                    column: 5,
                });
                inner.extend(
                    f.ops[id.0 as usize]
                        .regions
                        .iter()
                        .flat_map(|r| r.ops.clone()),
                );
            }
        }
        let [a, b] = [0, 1].map(|i| dlc_tile::print::fingerprint(f, kernels[i]).0);
        assert_eq!(a != b, apart, "{ty} {op}");
    }
}

/// A kernel of one store under the schedule attributes `attrs`.
fn scheduled(attrs: &str) -> String {
    format!(
        "tile.func @f(%x: buffer<f32[8]>, out %y: buffer<f32[8]>) {{\n  \
         tile.kernel {{grid = [1], {attrs}}} {{\n    \
         %t = tile.load %x[#0] : tile<8xf32>\n    tile.store %t, %y[#0]\n  }}\n  \
         tile.return\n}}\n"
    )
}

#[test]
fn every_schedule_reads_back_as_the_same_typed_value() {
    use dlc_tile::{OpKind, PackedOperand, Schedule};
    let cases = [
        (
            "schedule = \"serial\", vector = [16]",
            Schedule::Serial { vector: 16 },
        ),
        (
            "schedule = \"rows\", vector = [64]",
            Schedule::Rows { vector: 64 },
        ),
        (
            "schedule = \"blocked\", vector = [64]",
            Schedule::Blocked {
                vector: 64,
                tile: None,
            },
        ),
        (
            "schedule = \"blocked\", vector = [64], tile = [8, 8]",
            Schedule::Blocked {
                vector: 64,
                tile: Some([8, 8]),
            },
        ),
        (
            "schedule = \"dot\", tile = [64, 64, 32], stages = [2]",
            Schedule::Dot {
                tile: [64, 64, 32],
                staged: true,
            },
        ),
        (
            "schedule = \"packed\", blocking = [6, 32, 42, 160], pack = [0]",
            Schedule::Packed {
                blocking: [6, 32, 42, 160],
                pack: Some(PackedOperand::Left),
            },
        ),
        (
            "schedule = \"fused\", blocking = [6, 32, 42, 64, 256]",
            Schedule::Fused {
                blocking: [6, 32, 42, 64, 256],
            },
        ),
        (
            "schedule = \"winograd\", blocking = [6, 32, 36, 64]",
            Schedule::Winograd {
                blocking: [6, 32, 36, 64],
            },
        ),
    ];
    for (attrs, expected) in cases {
        let text = scheduled(attrs);
        let m = module(&text);
        let f = &m.functions[0];
        let kernel = f.op(f.body.ops[0]);
        let OpKind::Kernel { schedule, .. } = &kernel.kind else {
            panic!("not a kernel: {text}");
        };
        assert_eq!(*schedule, expected, "{text}");
        assert!(print_module(&m).contains(attrs), "{}", print_module(&m));
    }
}

#[test]
fn malformed_schedules_are_errors_that_say_what_is_wrong() {
    for (attrs, message) in [
        (
            "schedule = \"elementwise\"",
            "unknown schedule `elementwise`; schedules: serial, rows",
        ),
        (
            "schedule = \"rows\"",
            "`tile.kernel` needs attribute `vector`",
        ),
        (
            "schedule = \"packed\", blocking = [6, 32]",
            "`blocking` takes 4 sizes, got 2",
        ),
        (
            "schedule = \"packed\", blocking = [6, 32, 42, 160], pack = [2]",
            "`pack` names operand 0 or 1, got 2",
        ),
        (
            "schedule = \"dot\", tile = [4, 4, 4], stages = [3]",
            "1 or 2 stages, got 3",
        ),
        (
            "schedule = \"rows\", vector = [64], tiles = [4]",
            "`tile.kernel` has no attribute `tiles`",
        ),
        (
            "schedule = \"rows\", vector = [-1]",
            "`vector` must not be negative",
        ),
    ] {
        let text = scheduled(attrs);
        let e = parse_module(&text).expect_err(&text).to_string();
        assert!(e.contains(message), "{attrs}: {e}");
    }
}

/// `ir::index_ranges`: a program id ranges over its kernel's grid, a loop
/// counter from its first to its last value (a step that does not divide
/// the range stops short of `hi`), and a loop that runs no iteration gives
/// its counter no range.
#[test]
fn index_ranges_are_the_grid_and_the_loop_bounds() {
    let m = module(
        "tile.func @f(%x: buffer<f32[4, 70]>, out %y: buffer<f32[4, 64]>) {
  tile.kernel {grid = [4], schedule = \"rows\", vector = [32]} {
    %0 = tile.program_id {axis = 0} : index
    tile.for {lo = 0, hi = 64, step = 32} (%1) {
      %2 = tile.load %x[%0, %1 + #0 + 3] {pad = 0.0} : tile<32xf32>
      tile.store %2, %y[%0, %1 + #0]
    }
    tile.for {lo = 2, hi = 9, step = 3} (%3) {
      %4 = tile.load %x[%0, %3] : f32
      tile.store %4, %y[%0, %3]
    }
    tile.for {lo = 5, hi = 5, step = 1} (%5) {
      %6 = tile.load %x[%0, %5] : f32
      tile.store %6, %y[%0, %5]
    }
  }
  tile.return
}",
    );
    let f = &m.functions[0];
    let ranges = dlc_tile::ir::index_ranges(f);
    let mut got: Vec<(i64, i64)> = ranges.values().copied().collect();
    got.sort_unstable();
    assert_eq!(got, vec![(0, 3), (0, 32), (2, 8)]);
}

/// `tile.slice` cuts a tile out of another from its offsets on, an index
/// value's among them; offsets that do not fit are refused: constants and
/// tile coordinates by the typing rule, index values by the interpreter.
#[test]
fn slices_read_from_their_offsets_and_stay_inside() {
    let text = |offset: &str| {
        format!(
            "tile.func @f(%x: buffer<f32[3, 10]>, out %y: buffer<f32[2, 4]>) {{
  tile.kernel {{grid = [1], schedule = \"rows\", vector = [4]}} {{
    %t = tile.load %x[#0, #1] : tile<3x10xf32>
    %z = tile.const {{value = 0.0}} : tile<2x4xf32>
    %s:1 = tile.for %z {{lo = 0, hi = 3, step = 1}} (%k, %acc) {{
      %b = tile.slice %t[1, {offset}] : tile<2x4xf32>
      %c = tile.add %acc, %b : tile<2x4xf32>
      tile.yield %c
    }} : tile<2x4xf32>
    tile.store %s#0, %y[#0, #1]
  }}
  tile.return
}}"
        )
    };
    let x: Vec<f64> = (0..30).map(f64::from).collect();
    let mut args = [
        buffer(DType::F32, &[3, 10], x.clone()),
        buffer(DType::F32, &[2, 4], vec![0.0; 8]),
    ];
    run(&module(&text("2*%k + 1")), &mut args).unwrap();
    // y[i, j] = sum over k of x[1 + i, 2k + 1 + j].
    let want: Vec<f64> = (0..8)
        .map(|e| {
            let (i, j) = (e / 4, e % 4);
            (0..3).map(|k| x[(1 + i) * 10 + 2 * k + 1 + j]).sum()
        })
        .collect();
    assert_eq!(args[1].data, want);
    let e = run(&module(&text("3*%k + 1")), &mut args).unwrap_err();
    assert!(
        matches!(&e, TileError::OutOfBounds { index, .. } if index == &vec![1, 7]),
        "{e}"
    );
    for (offset, why) in [
        (
            "7",
            "cuts 4 elements of axis 1 at 7 out of the operand's 10",
        ),
        ("%k - 1 + #0", "uses `#0`"),
    ] {
        let errors = parse_module(&text(offset)).unwrap().verify().unwrap_err();
        assert!(
            errors.iter().any(|e| e.to_string().contains(why)),
            "{offset}: {errors:?}"
        );
    }
}
