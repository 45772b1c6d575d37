//! The loop dialect: text round-trip, MLIR generic form, verifier errors, and
//! the interpreter against plain Rust loops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_core::{DType, Verify};
use dlc_loop::interp::{Buffer, LoopError, run_function};
use dlc_loop::{BufferType, parse_module, print_mlir_generic, print_module};

const KERNELS: &str = "
// mm = a @ b; rs = relu(rowsum(a) - 1); box = 3x3 box filter of img with zero
// padding; t = transpose of a into a column-major buffer; mask = (a > 0) as i32;
// mm2 = a @ b again, as the structured product
loop.func @kernels(%a: buffer<f32[4, 8]>, %b: buffer<f32[8, 3]>, %img: buffer<f32[5, 5]>,
                   %mm: buffer<f32[4, 3]>, %rs: buffer<f32[4]>, %box: buffer<f32[5, 5]>,
                   %t: buffer<f32[8, 4], strides = [1, 8]>, %mask: buffer<i32[4, 8]>,
                   %mm2: buffer<f32[4, 3]>) {
  loop.parallel {lo = 0, hi = 4} (%i) {
    loop.for {lo = 0, hi = 3, step = 1} (%j) {
      %zero = loop.const {value = 0.0} : f32
      %acc = loop.for %zero {lo = 0, hi = 8, step = 1} (%k, %s) {
        %x = loop.load %a[%i, %k] : f32
        %y = loop.load %b[%k, %j] : f32
        %p = loop.mul %x, %y : f32
        %n = loop.add %s, %p : f32
        loop.yield %n
      } : f32
      loop.store %acc, %mm[%i, %j]
    }
  }
  %scratch = loop.alloc : buffer<f32[4]>
  loop.parallel {lo = 0, hi = 4} (%r) {
    %z = loop.const {value = 0.0} : f32
    %sum = loop.for %z {lo = 0, hi = 8, step = 1} (%c, %q) {
      %v = loop.load %a[%r, %c] : f32
      %q2 = loop.add %q, %v : f32
      loop.yield %q2
    } : f32
    loop.store %sum, %scratch[%r]
  }
  loop.for {lo = 0, hi = 4, step = 1} (%r2) {
    %v2 = loop.load %scratch[%r2] : f32
    %one = loop.const {value = 1.0} : f32
    %d = loop.sub %v2, %one : f32
    %e = loop.relu %d : f32
    loop.store %e, %rs[%r2]
  }
  loop.dealloc %scratch
  loop.parallel {lo = 0, hi = 5} (%py) {
    loop.parallel {lo = 0, hi = 5} (%px) {
      %z0 = loop.const {value = 0.0} : f32
      %rowsum = loop.for %z0 {lo = 0, hi = 3, step = 1} (%ky, %acc1) {
        %colsum = loop.for %acc1 {lo = 0, hi = 3, step = 1} (%kx, %acc2) {
          %w = loop.load %img[%py + %ky - 1, %px + %kx - 1] {pad = 0.0} : f32
          %acc3 = loop.add %acc2, %w : f32
          loop.yield %acc3
        } : f32
        loop.yield %colsum
      } : f32
      loop.store %rowsum, %box[%py, %px]
    }
  }
  loop.for {lo = 0, hi = 4, step = 2} (%ti) {
    loop.for {lo = 0, hi = 8, step = 1} (%tj) {
      %tv = loop.load %a[%ti, %tj] : f32
      loop.store %tv, %t[%tj, %ti]
      %tw = loop.load %a[%ti + 1, %tj] : f32
      loop.store %tw, %t[%tj, 1*%ti + 1]
      %zz = loop.const {value = 0.0} : f32
      %pos = loop.gt %tv, %zz : bool
      %one_i = loop.const {value = 1} : i32
      %zero_i = loop.const {value = 0} : i32
      %m = loop.select %pos, %one_i, %zero_i : i32
      loop.store %m, %mask[%ti, %tj]
      %pos2 = loop.gt %tw, %zz : bool
      %m2 = loop.cast %pos2 : i32
      loop.store %m2, %mask[%ti + 1, %tj]
    }
  }
  loop.matmul %a[#0, #2], %b[#2, #1] {sizes = [4, 3, 8]} (%mi, %mj, %mk, %macc) {
    loop.store %macc, %mm2[%mi, %mj]
  }
  loop.return
}
";

fn filled(ty: BufferType, f: impl Fn(usize) -> f64) -> Buffer {
    let mut b = Buffer::zeros(ty).unwrap();
    for (i, x) in b.data.iter_mut().enumerate() {
        *x = b.ty.dtype.round(f(i));
    }
    b
}

fn f32buf(shape: &[usize]) -> BufferType {
    BufferType::contiguous(DType::F32, shape.to_vec())
}

#[test]
fn text_round_trips() {
    let m = parse_module(KERNELS).unwrap_or_else(|e| panic!("{e}"));
    m.verify().unwrap_or_else(|e| panic!("{e:?}"));
    let printed = print_module(&m);
    let again = parse_module(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
    again.verify().unwrap();
    assert_eq!(print_module(&again), printed);
    assert!(
        printed.contains("%t: buffer<f32[8, 4], strides = [1, 8]>"),
        "{printed}"
    );
    assert!(printed.contains("{pad = 0.0} : f32"), "{printed}");
    assert!(
        printed.contains("loop.matmul %a[#0, #2], %b[#2, #1] {sizes = [4, 3, 8]} (%"),
        "{printed}"
    );
}

#[test]
fn mlir_parses_the_generic_form() {
    let m = parse_module(KERNELS).unwrap();
    let text = print_mlir_generic(&m);
    assert!(
        text.contains("map = affine_map<(d0, d1, d2, d3) -> (d0 + d1 - 1, d2 + d3 - 1)>"),
        "{text}"
    );
    if let Some(tool) = dlc_tests::mlir_opt() {
        dlc_tests::mlir_parses(&tool, &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    }
}

#[test]
fn interpreter_matches_plain_loops() {
    let m = parse_module(KERNELS).unwrap();
    let a = filled(f32buf(&[4, 8]), |i| (i as f64 * 0.37).sin());
    let b = filled(f32buf(&[8, 3]), |i| (i as f64 * 0.11).cos());
    let img = filled(f32buf(&[5, 5]), |i| i as f64 - 12.0);
    let mut args = vec![
        a.clone(),
        b.clone(),
        img.clone(),
        Buffer::zeros(f32buf(&[4, 3])).unwrap(),
        Buffer::zeros(f32buf(&[4])).unwrap(),
        Buffer::zeros(f32buf(&[5, 5])).unwrap(),
        Buffer::zeros(BufferType {
            dtype: DType::F32,
            shape: vec![8, 4],
            strides: vec![1, 8],
            offset: 0,
        })
        .unwrap(),
        Buffer::zeros(BufferType::contiguous(DType::I32, vec![4, 8])).unwrap(),
        Buffer::zeros(f32buf(&[4, 3])).unwrap(),
    ];
    run_function(&m, "kernels", &mut args).unwrap();
    let at = |i: usize, j: usize| a.data[i * 8 + j];
    for i in 0..4 {
        for j in 0..3 {
            let mut s = 0f32;
            for k in 0..8 {
                s += (at(i, k) as f32) * (b.data[k * 3 + j] as f32);
            }
            assert!(
                (args[3].data[i * 3 + j] - s as f64).abs() < 1e-6,
                "mm[{i},{j}]"
            );
            assert!(
                (args[8].data[i * 3 + j] - s as f64).abs() < 1e-6,
                "mm2[{i},{j}]"
            );
        }
        let row: f32 = (0..8).map(|k| at(i, k) as f32).sum();
        assert!(
            (args[4].data[i] - (row - 1.0).max(0.0) as f64).abs() < 1e-6,
            "rs[{i}]"
        );
        for j in 0..8 {
            // t is column-major: element [j, i] lives at j + 8 * i, which is a's row-major offset.
            assert_eq!(args[6].data[j + 8 * i], at(i, j));
            assert_eq!(
                args[7].data[i * 8 + j],
                if at(i, j) > 0.0 { 1.0 } else { 0.0 }
            );
        }
    }
    for y in 0..5i64 {
        for x in 0..5i64 {
            let mut s = 0.0;
            for ky in -1..=1 {
                for kx in -1..=1 {
                    let (iy, ix) = (y + ky, x + kx);
                    if (0..5).contains(&iy) && (0..5).contains(&ix) {
                        s += img.data[(iy * 5 + ix) as usize];
                    }
                }
            }
            assert_eq!(args[5].data[(y * 5 + x) as usize], s, "box[{y},{x}]");
        }
    }
}

#[test]
fn run_time_errors() {
    let oob = "loop.func @f(%o: buffer<f32[4]>) {\n  loop.for {lo = 0, hi = 5, step = 1} (%i) {\n    %c = loop.const {value = 1.0} : f32\n    loop.store %c, %o[%i]\n  }\n  loop.return\n}\n";
    let m = parse_module(oob).unwrap();
    m.verify().unwrap();
    let mut args = vec![Buffer::zeros(f32buf(&[4])).unwrap()];
    let err = run_function(&m, "f", &mut args).unwrap_err();
    assert_eq!(
        err,
        LoopError::OutOfBounds {
            op: "loop.store".into(),
            index: vec![4],
            ty: "buffer<f32[4]>".into()
        }
    );
    let freed = "loop.func @f(%o: buffer<f32[1]>) {\n  %b = loop.alloc : buffer<f32[1]>\n  loop.dealloc %b\n  %v = loop.load %b[0] : f32\n  loop.store %v, %o[0]\n  loop.return\n}\n";
    let m = parse_module(freed).unwrap();
    let err = run_function(&m, "f", &mut [Buffer::zeros(f32buf(&[1])).unwrap()]).unwrap_err();
    assert_eq!(err, LoopError::UseAfterFree("loop.load".into()));
    let err = run_function(&m, "f", &mut [Buffer::zeros(f32buf(&[2])).unwrap()]).unwrap_err();
    assert!(matches!(err, LoopError::Arguments(_)), "{err}");
}

#[test]
fn verifier_reports_every_problem() {
    let bad = "loop.func @f(%a: buffer<f32[4]>, %o: buffer<i32[4]>) {
  loop.parallel {lo = 0, hi = 4} (%i) {
    %x = loop.load %a[%i, %i] : f32
    %y = loop.exp %x : f32
    loop.store %y, %o[%i]
    %z = loop.cast %y : i32
    %w = loop.exp %z : i32
  }
  %s = loop.const {value = 0.0} : f32
  %r = loop.for %s {lo = 0, hi = 4, step = 0} (%k, %acc) {
    loop.yield %acc
  } : f32
}
";
    let m = parse_module(bad).unwrap_or_else(|e| panic!("{e}"));
    let errors = m.verify().unwrap_err();
    let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    let all = text.join("\n");
    for want in [
        "2 indices for a rank-1 buffer",
        "must store a i32 scalar",
        "%4 = loop.exp: is not defined on i32",
        "needs a positive step",
        "does not end with loop.return",
    ] {
        assert!(all.contains(want), "missing `{want}` in:\n{all}");
    }
    // The IR core's functions may name a preparer; only tile IR has them.
    let prepared = "loop.func @f(%a: buffer<f32[4]>) prepare @g {\n  loop.return\n}\n";
    let m = parse_module(prepared).unwrap_or_else(|e| panic!("{e}"));
    let errors = m.verify().unwrap_err();
    assert!(
        errors[0].to_string().contains("loop IR has no preparers"),
        "{errors:?}"
    );
}

#[test]
fn parse_errors_are_located() {
    let cases = [
        (
            "loop.func @f(%a: buffer<f32[4]>) {\n  %x = loop.load %b[0] : f32\n  loop.return\n}\n",
            "2:18: `%b` is not defined here",
        ),
        (
            "loop.func @f(%a: buffer<f32[4]>) {\n  %x = loop.frob %a : f32\n  loop.return\n}\n",
            "2:8: unknown op `loop.frob`",
        ),
        (
            "loop.func @f(%a: buffer<f32[4]>) {\n  %x:2 = loop.const {value = 1.0} : f32\n  loop.return\n}\n",
            "2:10: `loop.const` names 2 result(s), but 1 type(s) follow",
        ),
        (
            "loop.func @f(%a: buffer<f32[4]>) {\n  loop.parallel {lo = 0, hi = 4} (%i) {\n    %c = loop.const {value = 1.0} : f32\n  }\n  loop.store %c, %a[0]\n  loop.return\n}\n",
            "5:14: `%c` is not defined here",
        ),
        (
            "loop.func @f(out %o: buffer<f32[4]>, %a: buffer<f32[4]>) {\n  loop.return\n}\n",
            "1:38: expected `out`: results follow the inputs, found `%a`",
        ),
        (
            "loop.func @f(%a: buffer<f32[4]>) {\n  %x = loop.load %a[#0] : f32\n  loop.return\n}\n",
            "2:21: `#k` names a counter of a product, whose indices alone use them",
        ),
        (
            "loop.func @f(%a: buffer<f32[4]>) {\n  loop.parallel {lo = 0, hi = 4} (%i, %j) {\n  }\n  loop.return\n}\n",
            "2:3: `loop.parallel` has 1 region arguments, got 2",
        ),
        (
            "loop.func @f(%a: buffer<f32[4]>) {\n  loop.parallel {lo = 0, hi = 4, step = 1} (%i) {\n  }\n  loop.return\n}\n",
            "2:3: `loop.parallel` has no attribute `step`",
        ),
    ];
    for (text, want) in cases {
        let err = parse_module(text).unwrap_err().to_string();
        assert_eq!(err, want);
    }
    let deep = format!(
        "loop.func @f(%a: buffer<f32[1]>) {{\n{}{}  loop.return\n}}\n",
        (0..300)
            .map(|i| format!("loop.parallel {{lo = 0, hi = 1}} (%i{i}) {{\n"))
            .collect::<String>(),
        "}\n".repeat(300)
    );
    assert!(
        parse_module(&deep)
            .unwrap_err()
            .to_string()
            .contains("regions nest deeper than 64 levels")
    );
}

#[test]
fn builder_and_views() {
    use dlc_core::scalar::BinaryOp;
    use dlc_loop::{Builder, IndexExpr, Module};
    // out[i, j] = flat[i * 3 + j] * 2, with `flat` seen as [2, 3] through a view.
    let mut b = Builder::new("twice");
    let flat = b.param("flat", f32buf(&[6]));
    let out = b.param("out", f32buf(&[2, 3]));
    let grid = b.view(flat, f32buf(&[2, 3]));
    b.parallel(0, 2, |b, i| {
        b.for_loop(0, 3, 1, &[], |b, j, _| {
            let x = b.load(grid, vec![IndexExpr::value(i), IndexExpr::value(j)], None);
            let two = b.constant(2.0, DType::F32);
            let y = b.binary(BinaryOp::Mul, x, two);
            b.store(y, out, vec![IndexExpr::value(i), IndexExpr::value(j)]);
            vec![]
        });
    });
    let m = Module {
        functions: vec![b.finish()],
    };
    m.verify()
        .unwrap_or_else(|e| panic!("{e:?}\n{}", print_module(&m)));
    let text = print_module(&m);
    assert!(
        text.contains("loop.view %flat : buffer<f32[2, 3]>"),
        "{text}"
    );
    assert_eq!(print_module(&parse_module(&text).unwrap()), text);
    let mut args = vec![
        filled(f32buf(&[6]), |i| i as f64),
        Buffer::zeros(f32buf(&[2, 3])).unwrap(),
    ];
    run_function(&m, "twice", &mut args).unwrap();
    assert_eq!(args[1].data, vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
    let too_big = "loop.func @f(%a: buffer<f32[4]>) {\n  %v = loop.view %a : buffer<f32[5]>\n  loop.return\n}\n";
    let errors = parse_module(too_big).unwrap().verify().unwrap_err();
    assert!(errors[0].message.contains("reaches outside"), "{errors:?}");
}

/// A view with an offset reads its part of the storage, round-trips as
/// text, and may not start before its source or reach past it; parameters
/// and allocations have no offset.
#[test]
fn views_with_offsets() {
    let text = "loop.func @f(%x: buffer<f32[3, 4]>, out %y: buffer<f32[2, 4]>) {
  %0 = loop.view %x : buffer<f32[2, 4], offset = 4>
  %1 = loop.view %0 : buffer<f32[4], strides = [2], offset = 5>
  loop.parallel {lo = 0, hi = 4} (%2) {
    %3 = loop.load %0[1, %2] : f32
    %4 = loop.load %1[%2] : f32
    %5 = loop.add %3, %4 : f32
    loop.store %5, %y[0, %2]
    loop.store %4, %y[1, %2]
  }
  loop.return
}
";
    let m = parse_module(text).unwrap();
    m.verify().unwrap();
    assert_eq!(print_module(&m), text);
    let mut args = vec![
        filled(f32buf(&[3, 4]), |i| i as f64),
        Buffer::zeros(f32buf(&[2, 4])).unwrap(),
    ];
    run_function(&m, "f", &mut args).unwrap();
    // x[2, j] + x.flat[5 + 2 j]; then x.flat[5 + 2 j].
    assert_eq!(
        args[1].data,
        vec![13.0, 16.0, 19.0, 22.0, 5.0, 7.0, 9.0, 11.0]
    );
    for bad in [
        "loop.func @f(%x: buffer<f32[8], offset = 8>) {\n  loop.return\n}\n",
        "loop.func @f(%x: buffer<f32[8]>) {\n  %0 = loop.alloc : buffer<f32[4], offset = 4>\n  loop.return\n}\n",
        "loop.func @f(%x: buffer<f32[8]>) {\n  %0 = loop.view %x : buffer<f32[4], offset = 5>\n  loop.return\n}\n",
        "loop.func @f(%x: buffer<f32[8]>) {\n  %0 = loop.view %x : buffer<f32[4], offset = 4>\n  %1 = loop.view %0 : buffer<f32[2], offset = 2>\n  loop.return\n}\n",
    ] {
        let errors = parse_module(bad).unwrap().verify().unwrap_err();
        assert!(
            errors
                .iter()
                .any(|e| e.message.contains("offset") || e.message.contains("reaches outside")),
            "{bad}: {errors:?}"
        );
    }
}

#[test]
fn global_buffers_hold_their_data() {
    let text = "loop.func @f(%x: buffer<f32[2, 3]>, out %o: buffer<f32[2, 3]>) {
  %w = loop.global {value = [1.5, -2.0, inf, nan, 0.25, 3.0]} : buffer<f32[2, 3]>
  %m = loop.global {value = [1, 0, 1]} : buffer<bool[3]>
  loop.parallel {lo = 0, hi = 2} (%i) {
    loop.for {lo = 0, hi = 3, step = 1} (%j) {
      %a = loop.load %x[%i, %j] : f32
      %b = loop.load %w[%i, %j] : f32
      %c = loop.load %m[%j] : bool
      %s = loop.add %a, %b : f32
      %r = loop.select %c, %s, %a : f32
      loop.store %r, %o[%i, %j]
    }
  }
  loop.return
}
";
    let m = parse_module(text).unwrap_or_else(|e| panic!("{e}"));
    m.verify().unwrap_or_else(|e| panic!("{e:?}"));
    let printed = print_module(&m);
    assert!(
        printed
            .contains("loop.global {value = [1.5, -2.0, inf, nan, 0.25, 3.0]} : buffer<f32[2, 3]>"),
        "{printed}"
    );
    assert_eq!(print_module(&parse_module(&printed).unwrap()), printed);
    if let Some(tool) = dlc_tests::mlir_opt() {
        let generic = print_mlir_generic(&m);
        dlc_tests::mlir_parses(&tool, &generic).unwrap_or_else(|e| panic!("{e}\n{generic}"));
    }
    let mut args = [
        filled(f32buf(&[2, 3]), |i| i as f64),
        Buffer::zeros(f32buf(&[2, 3])).unwrap(),
    ];
    run_function(&m, "f", &mut args).unwrap();
    let got = &args[1].data;
    assert_eq!(got[0], 1.5);
    assert_eq!(got[1], 1.0); // the mask is off: x alone
    assert_eq!(got[2], f64::INFINITY);
    assert!(got[3].is_nan());
    assert_eq!(got[4], 4.0);
    assert_eq!(got[5], 8.0);
    // The data must fill the buffer exactly, row-major.
    let bad = text.replace("[1, 0, 1]", "[1, 0]");
    let errors = parse_module(&bad).unwrap().verify().unwrap_err();
    let all: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert!(
        all.join("\n").contains("holds 2 values for a buffer of"),
        "{all:?}"
    );
}
