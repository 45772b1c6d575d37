//! `insert_barriers`: where a block of threads running one program needs a
//! barrier between accesses of global memory, and where it does not.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::Verify;
use dlc_tile::transforms::insert_barriers;
use dlc_tile::{parse_module, print_module};

/// The kernel body after the pass, one op per line, and how many barriers
/// it added.
fn barriers(body: &str) -> (String, usize) {
    let text = format!(
        "tile.func @f(%x: buffer<f32[8, 512]>, out %y: buffer<f32[8, 512]>) {{\n\
         tile.kernel {{grid = [8], schedule = \"rows\", vector = [64]}} {{\n\
         %p = tile.program_id {{axis = 0}} : index\n{body}\n}}\ntile.return\n}}\n"
    );
    let mut m = parse_module(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let n = insert_barriers(&mut m.functions[0]);
    m.verify().unwrap();
    let printed = print_module(&m);
    let ops: Vec<&str> = printed
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("tile.store") || l.contains("tile.load") || *l == "tile.barrier")
        .map(|l| {
            if l.contains("tile.load") {
                "load"
            } else if l == "tile.barrier" {
                "barrier"
            } else {
                "store"
            }
        })
        .collect();
    (ops.join(" "), n)
}

#[test]
fn a_thread_reading_what_it_wrote_needs_no_barrier() {
    // Same pattern: every element is written and read by its own thread.
    let (ops, n) = barriers(
        "%t = tile.load %x[%p, #0] : tile<512xf32>\n\
         tile.store %t, %y[%p, #0]\n\
         %u = tile.load %y[%p, #0] : tile<512xf32>\n\
         tile.store %u, %y[%p, #0]",
    );
    assert_eq!((ops.as_str(), n), ("load store load store", 0));
}

#[test]
fn reading_another_threads_element_waits_for_a_barrier() {
    // Reversed, element e reads what element 511 - e wrote.
    let (ops, n) = barriers(
        "%t = tile.load %x[%p, #0] : tile<512xf32>\n\
         tile.store %t, %y[%p, #0]\n\
         %u = tile.load %y[%p, -#0 + 511] : tile<512xf32>\n\
         tile.store %u, %y[%p, #0]",
    );
    // And the second store overwrites what the reversed load read.
    assert_eq!(
        (ops.as_str(), n),
        ("load store barrier load barrier store", 2)
    );
}

#[test]
fn reads_of_a_buffer_nobody_writes_need_no_barrier() {
    let (ops, n) = barriers(
        "%t = tile.load %x[%p, #0] : tile<512xf32>\n\
         %u = tile.load %x[%p, -#0 + 511] : tile<512xf32>\n\
         %v = tile.add %t, %u : tile<512xf32>\n\
         tile.store %v, %y[%p, #0]",
    );
    assert_eq!((ops.as_str(), n), ("load load store", 0));
}

#[test]
fn a_row_walked_a_tile_at_a_time_needs_no_barrier() {
    // Each iteration writes and reads back 128 new elements.
    let (ops, n) = barriers(
        "tile.for {lo = 0, hi = 512, step = 128} (%i) {\n\
         %t = tile.load %x[%p, %i + #0] : tile<128xf32>\n\
         tile.store %t, %y[%p, %i + #0]\n\
         %u = tile.load %y[%p, %i + #0] : tile<128xf32>\n\
         tile.store %u, %y[%p, %i + #0]\n\
         }",
    );
    assert_eq!((ops.as_str(), n), ("load store load store", 0));
}

#[test]
fn overlapping_iterations_need_a_barrier_in_the_loop() {
    // Iteration i writes y[i..i+128] and the next one reads y[i+64..]:
    // half of what it reads another thread wrote.
    let (ops, n) = barriers(
        "tile.for {lo = 0, hi = 384, step = 64} (%i) {\n\
         %t = tile.load %y[%p, %i + #0] : tile<128xf32>\n\
         %s = tile.const {value = 1.0} : tile<128xf32>\n\
         %u = tile.add %t, %s : tile<128xf32>\n\
         tile.store %u, %y[%p, %i + #0]\n\
         }",
    );
    assert_eq!((ops.as_str(), n), ("barrier load store", 1));
}

#[test]
fn a_scalar_rewritten_each_iteration_is_guarded() {
    // Every thread writes y[p, 0] in every iteration: a fast thread's next
    // write must not reach a slow thread's read.
    let (ops, n) = barriers(
        "tile.for {lo = 0, hi = 4, step = 1} (%i) {\n\
         %a = tile.load %y[%p, 0] : f32\n\
         %b = tile.load %x[%p, %i] : f32\n\
         %c = tile.add %a, %b : f32\n\
         tile.store %c, %y[%p, 0]\n\
         }",
    );
    // And within one iteration, a thread's read of y[p, 0] must come
    // before any thread's write of it.
    assert_eq!((ops.as_str(), n), ("barrier load load barrier store", 2));
    // A scalar at a new place each iteration is not.
    let (ops, n) = barriers(
        "tile.for {lo = 0, hi = 4, step = 1} (%i) {\n\
         %b = tile.load %x[%p, %i] : f32\n\
         tile.store %b, %y[%p, %i]\n\
         %a = tile.load %y[%p, %i] : f32\n\
         %c = tile.add %a, %b : f32\n\
         }",
    );
    assert_eq!((ops.as_str(), n), ("load store load", 0));
}

#[test]
fn an_explicit_barrier_already_orders_the_accesses() {
    let (ops, n) = barriers(
        "%t = tile.load %x[%p, #0] : tile<512xf32>\n\
         tile.store %t, %y[%p, #0]\n\
         tile.barrier\n\
         %u = tile.load %y[%p, -#0 + 511] : tile<512xf32>\n\
         tile.barrier\n\
         tile.store %u, %y[%p, #0]",
    );
    assert_eq!(
        (ops.as_str(), n),
        ("load store barrier load barrier store", 0)
    );
}

#[test]
fn two_slots_of_one_buffer_do_not_meet() {
    // Slot 1 is filled while slot 0 is read: no barrier between them.
    let (ops, n) = barriers(
        "%t = tile.load %x[%p, #0] : tile<512xf32>\n\
         tile.store %t, %y[0, #0]\n\
         %u = tile.load %y[1, -#0 + 511] : tile<512xf32>\n\
         tile.store %u, %y[2, #0]",
    );
    assert_eq!((ops.as_str(), n), ("load store load store", 0));
}
