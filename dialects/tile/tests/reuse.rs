//! `reuse_packs`: a function that multiplies by one operand several times
//! packs it once per call, and only when that is the same copy.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::{DType, Verify};
use dlc_tile::interp::{Buffer, run_function};
use dlc_tile::transforms::reuse_packs;
use dlc_tile::{BufferType, Space, parse_module, print_module};

/// A pack of `src` into a new panel buffer `%pN`, a product of `%x` by it
/// into `out`, and the panel's release.
fn step(n: usize, src: &str, x: &str, out: &str) -> String {
    format!(
        "%p{n} = tile.alloc : buffer<f32[8, 4]>
  tile.kernel {{grid = [1], schedule = \"packed\", blocking = [4, 4, 4, 8], pack = [1]}} {{
    %t{n} = tile.load {src}[#0, #1] : tile<8x4xf32>
    tile.store %t{n}, %p{n}[#0, #1]
  }}
  tile.kernel {{grid = [1], schedule = \"packed\", blocking = [4, 4, 4, 8]}} {{
    %a{n} = tile.load {x}[#0, #1] : tile<4x8xf32>
    %b{n} = tile.load %p{n}[#0, #1] : tile<8x4xf32>
    %z{n} = tile.const {{value = 0.0}} : tile<4x4xf32>
    %d{n} = tile.dot %a{n}, %b{n}, %z{n} : tile<4x4xf32>
    tile.store %d{n}, {out}[#0, #1]
  }}
  tile.dealloc %p{n}
  "
    )
}

fn function(body: &str) -> dlc_tile::Module {
    let text = format!(
        "tile.func @f(%x: buffer<f32[4, 8]>, %x2: buffer<f32[4, 8]>, %w: buffer<f32[8, 4]>, \
         out %y: buffer<f32[4, 4]>, out %y2: buffer<f32[4, 4]>, out %s: buffer<f32[8, 4]>) {{\n  \
         {body}tile.return\n}}\n"
    );
    let m = parse_module(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    m.verify().unwrap();
    m
}

/// Runs `f` on fixed inputs; its three outputs.
fn run(m: &dlc_tile::Module) -> Vec<Vec<f64>> {
    let buf = |shape: &[usize], seed: f64| Buffer {
        ty: BufferType::contiguous(DType::F32, shape.to_vec(), Space::Global),
        data: (0..shape.iter().product::<usize>())
            .map(|i| ((i as f64 * 0.37 + seed).sin() * 4.0).round())
            .collect(),
    };
    let mut args = vec![
        buf(&[4, 8], 1.0),
        buf(&[4, 8], 2.0),
        buf(&[8, 4], 3.0),
        buf(&[4, 4], 0.0),
        buf(&[4, 4], 0.0),
        buf(&[8, 4], 0.0),
    ];
    run_function(m, "f", &mut args).unwrap();
    args[3..].iter().map(|b| b.data.clone()).collect()
}

#[test]
fn one_operand_is_packed_once() {
    let mut m = function(&format!(
        "{}{}",
        step(1, "%w", "%x", "%y"),
        step(2, "%w", "%x2", "%y2")
    ));
    let before = run(&m);
    assert_eq!(reuse_packs(&mut m.functions[0]), 1);
    m.verify().unwrap();
    let text = print_module(&m);
    assert_eq!(text.matches("pack = [1]").count(), 1, "{text}");
    // The first panel buffer serves both products and is released after
    // the second (the interpreter fails on a released buffer).
    assert_eq!(text.matches("tile.alloc").count(), 1, "{text}");
    let dealloc = text.find("tile.dealloc").expect("a dealloc");
    assert!(dealloc > text.rfind("tile.dot").expect("a dot"), "{text}");
    assert_eq!(run(&m), before);
}

#[test]
fn different_operands_or_layouts_are_packed_each() {
    // The same buffer through another layout (a transposed view of %w) is
    // another copy.
    let mut m = function(&format!(
        "%v = tile.view %w : buffer<f32[8, 4], strides = [1, 8]>\n  {}{}",
        step(1, "%w", "%x", "%y"),
        step(2, "%v", "%x2", "%y2")
    ));
    assert_eq!(reuse_packs(&mut m.functions[0]), 0);
}

#[test]
fn an_operand_written_in_the_function_is_packed_each_time() {
    // %s is written between the two packs: the second copy differs.
    let fill = |k: usize, v: f64| {
        format!(
            "tile.kernel {{grid = [1], schedule = \"rows\", vector = [64]}} {{
    %c{k} = tile.const {{value = {v:?}}} : tile<8x4xf32>
    tile.store %c{k}, %s[#0, #1]
  }}
  "
        )
    };
    let mut m = function(&format!(
        "{}{}{}{}",
        fill(1, 1.0),
        step(1, "%s", "%x", "%y"),
        fill(2, 2.0),
        step(2, "%s", "%x", "%y2")
    ));
    let before = run(&m);
    assert_eq!(reuse_packs(&mut m.functions[0]), 0);
    assert_eq!(run(&m), before);
    assert_ne!(before[0], before[1]);
}
