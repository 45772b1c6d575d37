//! Bad input of every kind gets a located diagnostic, never a panic, a stack
//! overflow or a hang. Each case's rendered diagnostic is an insta snapshot
//! (the source is part of the snapshot, above the diagnostic).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use dlc_driver::{DriverError, SourceText, compile_source, decode};

fn diagnose(source: &str) -> String {
    let src = SourceText {
        name: "model.dl".into(),
        text: source.into(),
        weights: Vec::new(),
    };
    match compile_source(&src) {
        Ok(_) => panic!("expected an error for:\n{source}"),
        Err(DriverError::Source(e)) => e.rendered,
        Err(other) => panic!("expected a source diagnostic, got {other:?}"),
    }
}

macro_rules! bad_input {
    ($($name:ident: $src:expr;)*) => {$(
        #[test]
        fn $name() {
            let src: &str = $src;
            let rendered = diagnose(src);
            assert!(rendered.starts_with("error: "), "{rendered}");
            assert!(rendered.contains("--> model.dl:"), "no location in:\n{rendered}");
            insta::assert_snapshot!(stringify!($name), format!("{src}\n---\n{rendered}"));
        }
    )*};
}

bad_input! {
    syntax_missing_semicolon: "fn f(x: f32[4]) -> f32[4] {\n    let y = relu(x)\n    return y;\n}\n";
    syntax_unexpected_token: "fn f(x: f32[4]) -> f32[4] {\n    return x + * x;\n}\n";
    syntax_unclosed_brace: "fn f(x: f32[4]) -> f32[4] {\n    return x;\n";
    syntax_bad_character: "fn f(x: f32[4]) -> f32[4] {\n    return x $ x;\n}\n";
    unterminated_comment: "/* a comment that never ends\nfn f(x: f32[4]) -> f32[4] { return x; }\n";
    integer_too_large: "fn f(x: f32[4]) -> f32[4] {\n    return x * 99999999999999999999;\n}\n";
    unknown_name: "fn f(x: f32[4]) -> f32[4] {\n    return relu(y);\n}\n";
    unknown_function: "fn f(x: f32[4]) -> f32[4] {\n    return frobnicate(x);\n}\n";
    unknown_dtype: "fn f(x: f8[4]) -> f8[4] {\n    return x;\n}\n";
    int_literal_out_of_range: "fn f(x: u8[4]) -> u8[4] {\n    return x + 256;\n}\n";
    matmul_inner_dimensions: "fn f(x: f32[128, 1024], w: f32[512, 10]) -> f32[128, 10] {\n    let h = x @ w;\n    return h;\n}\n";
    broadcast_mismatch: "fn f(x: f32[4, 3], y: f32[5]) -> f32[4, 3] {\n    return x + y;\n}\n";
    dtype_mismatch: "fn f(x: f32[4], y: i32[4]) -> f32[4] {\n    return x * y;\n}\n";
    float_literal_for_int: "fn f(x: i32[4]) -> i32[4] {\n    return x * 0.5;\n}\n";
    float_only_function: "fn f(x: i32[4]) -> i32[4] {\n    return exp(x);\n}\n";
    axis_out_of_range: "fn f(x: f32[4, 8]) -> f32[4] {\n    return sum(x, axis=2);\n}\n";
    builtin_arity: "fn f(x: f32[4], y: f32[4]) -> f32[4] {\n    return relu(x, y);\n}\n";
    unknown_keyword: "fn f(x: f32[4, 8]) -> f32[4, 8] {\n    return softmax(x, axes=1);\n}\n";
    missing_argument: "fn f(x: f32[4, 8]) -> f32[4, 8] {\n    return reshape(x);\n}\n";
    user_function_arity: "fn dense[M, K, N](x: f32[M, K], w: f32[K, N], b: f32[N]) -> f32[M, N] {\n    return x @ w + b;\n}\nfn f(x: f32[2, 3], w: f32[3, 4]) -> f32[2, 4] {\n    return dense(x, w);\n}\n";
    generic_argument_mismatch: "fn dense[M, K, N](x: f32[M, K], w: f32[K, N], b: f32[N]) -> f32[M, N] {\n    return x @ w + b;\n}\nfn f(x: f32[2, 3], w: f32[4, 5], b: f32[5]) -> f32[2, 5] {\n    return dense(x, w, b);\n}\n";
    error_inside_instantiation: "fn bad[N](x: f32[N]) -> f32[N] {\n    return x @ x;\n}\nfn f(x: f32[3]) -> f32[3] {\n    return bad(x);\n}\n";
    cannot_infer_dimension: "fn make[N](x: f32[4]) -> f32[N] {\n    return x;\n}\nfn f(x: f32[4]) -> f32[4] {\n    return make(x);\n}\n";
    unbound_reduction_index: "op rowsum[M, N](a: f32[M, N]) -> f32[M] {\n    out[i] = a[i, k];\n}\nfn f(x: f32[2, 3]) -> f32[2] {\n    return rowsum(x);\n}\n";
    reduction_range_not_inferable: "op total[N](a: f32[N]) -> f32 {\n    out[] = sum[k](a[2 * k]);\n}\nfn f(x: f32[6]) -> f32 {\n    return total(x);\n}\n";
    non_affine_index: "op sq[N](a: f32[N, N]) -> f32[N] {\n    out[i] = a[i, i * i];\n}\nfn f(x: f32[3, 3]) -> f32[3] {\n    return sq(x);\n}\n";
    tensor_value_count: "fn f(x: f32[2, 2]) -> f32[2, 2] {\n    return x + tensor([1.0, 2.0, 3.0], [2, 2]);\n}\n";
    tensor_float_for_int: "fn f(x: i32[2]) -> i32[2] {\n    return x + tensor([1, 2.5], [2], dtype=i32);\n}\n";
    tensor_int_out_of_range: "fn f(x: i32[2]) -> i32[2] {\n    return x + tensor([1, 3000000000], [2], dtype=i32);\n}\n";
    tensor_not_a_list: "fn f(x: f32[2]) -> f32[2] {\n    return x + tensor(x, [2]);\n}\n";
    index_as_value: "op iota[N](a: f32[N]) -> f32[N] {\n    out[i] = a[i] + i;\n}\nfn f(x: f32[3]) -> f32[3] {\n    return iota(x);\n}\n";
    out_rank_mismatch: "op bad[N](a: f32[N]) -> f32[N, N] {\n    out[i] = a[i];\n}\nfn f(x: f32[3]) -> f32[3, 3] {\n    return bad(x);\n}\n";
    index_notation_in_fn: "fn f(x: f32[3]) -> f32[3] {\n    return x[0];\n}\n";
    direct_recursion: "fn f(x: f32[4]) -> f32[4] {\n    return f(x);\n}\n";
    mutual_recursion: "fn g[N](x: f32[N]) -> f32[N] {\n    return h(x);\n}\nfn h[N](x: f32[N]) -> f32[N] {\n    return g(x);\n}\nfn f(x: f32[4]) -> f32[4] {\n    return g(x);\n}\n";
    duplicate_function: "fn f(x: f32[4]) -> f32[4] {\n    return x;\n}\nfn f(x: f32[4]) -> f32[4] {\n    return x;\n}\n";
    duplicate_parameter: "fn f(x: f32[4], x: f32[4]) -> f32[4] {\n    return x;\n}\n";
    duplicate_tuple_names: "fn two(x: f32[4]) -> (f32[4], f32[4]) {
    return (x, x);
}
fn f(x: f32[4]) -> f32[4] {
    let (a, a) = two(x);
    return a;
}
";
    redefined_builtin: "fn relu(x: f32[4]) -> f32[4] {\n    return x;\n}\n";
    redefined_primitive: "fn softmax(x: f32[4]) -> f32[4] {\n    return x;\n}\n";
    misspelled_composite: "fn f(x: f32[4]) -> f32[4] {\n    return leaky_relo(x);\n}\n";
    composite_unknown_keyword: "fn f(x: f32[4]) -> f32[4] {\n    return leaky_relu(x, alhpa=0.1);\n}\n";
    zero_dimension: "fn f(x: f32[0, 4]) -> f32[0, 4] {\n    return x;\n}\n";
    unknown_dimension: "fn f(x: f32[M, 4]) -> f32[M, 4] {\n    return x;\n}\n";
    too_many_elements: "fn f(x: f32[4]) -> f32[4] {\n    let z = zeros([4294967296, 4294967296]);\n    return x;\n}\n";
    reshape_element_count: "fn f(x: f32[4, 6]) -> f32[5, 5] {\n    return reshape(x, [5, 5]);\n}\n";
    reshape_cannot_infer: "fn f(x: f32[4, 6]) -> f32[5, 5] {\n    return reshape(x, [5, -1]);\n}\n";
    transpose_not_permutation: "fn f(x: f32[4, 6]) -> f32[6, 4] {\n    return transpose(x, [0, 0]);\n}\n";
    slice_out_of_range: "fn f(x: f32[4, 6]) -> f32[4, 2] {\n    return slice(x, axis=1, start=5, end=7);\n}\n";
    conv_channel_mismatch: "fn f(x: f32[1, 3, 8, 8], w: f32[4, 2, 3, 3]) -> f32[1, 4, 8, 8] {\n    return conv2d(x, w, padding=1);\n}\n";
    conv_zero_dilation: "fn f(x: f32[1, 3, 8, 8], w: f32[4, 3, 3, 3]) -> f32[1, 4, 8, 8] {\n    return conv2d(x, w, padding=1, dilation=[1, 0]);\n}\n";
    conv_dilated_window_too_wide: "fn f(x: f32[1, 3, 8, 8], w: f32[4, 3, 3, 3]) -> f32[1, 4, 8, 8] {\n    return conv2d(x, w, dilation=4);\n}\n";
    conv3d_groups_do_not_fit: "fn f(x: f32[1, 6, 4, 8, 8], w: f32[4, 4, 3, 3, 3]) -> f32[1, 4, 4, 8, 8] {\n    return conv3d(x, w, padding=1, groups=2);\n}\n";
    conv3d_window_too_wide: "fn f(x: f32[1, 3, 2, 8, 8], w: f32[4, 3, 3, 3, 3]) -> f32[1, 4, 1, 6, 6] {\n    return conv3d(x, w, dilation=[2, 1, 1]);\n}\n";
    conv3d_two_strides: "fn f(x: f32[1, 3, 4, 8, 8], w: f32[4, 3, 3, 3, 3]) -> f32[1, 4, 2, 3, 3] {\n    return conv3d(x, w, stride=[2, 2]);\n}\n";
    conv3d_zero_stride: "fn f(x: f32[1, 3, 4, 8, 8], w: f32[4, 3, 3, 3, 3]) -> f32[1, 4, 2, 6, 6] {\n    return conv3d(x, w, stride=[2, 0, 1]);\n}\n";
    conv3d_rank: "fn f(x: f32[1, 3, 8, 8], w: f32[4, 3, 3, 3]) -> f32[1, 4, 6, 6] {\n    return conv3d(x, w);\n}\n";
    return_type_mismatch: "fn f(x: f32[4, 8]) -> f32[4, 8] {\n    return sum(x, axis=1);\n}\n";
    missing_return: "fn f(x: f32[4]) -> f32[4] {\n    let y = relu(x);\n}\n";
    statement_after_return: "fn f(x: f32[4]) -> f32[4] {\n    return x;\n    let y = x;\n}\n";
    tuple_count_mismatch: "fn f(x: f32[4]) -> (f32[4], f32[4]) {\n    return x;\n}\n";
    dimension_only_in_expression: "fn halves[N](x: f32[2 * N]) -> f32[N] {\n    return slice(x, start=0, end=N);\n}\nfn f(x: f32[8]) -> f32[4] {\n    return halves(x);\n}\n";
    error_in_uncalled_operator: "op broken[M, N](a: f32[M, N]) -> f32[M] {\n    out[i] = a[i, k];\n}\nfn f(x: f32[4]) -> f32[4] {\n    return x;\n}\n";
    error_in_uncalled_generic_function: "fn helper[N](x: f32[N]) -> f32[N] {\n    return relu(y);\n}\nfn f(x: f32[4]) -> f32[4] {\n    return x;\n}\n";
    huge_padding: "fn f(x: f32[1, 1, 4, 4]) -> f32 {\n    return sum(maxpool2d(x, kernel=2, padding=9223372036854775807));\n}\n";
    empty_input: "";
    every_error_of_a_function: "fn f(x: f32[4], y: f32[5]) -> f32[4] {\n    let a = x + y;\n    let b = relu(zz);\n    let c = sum(x, axis=3);\n    return a + b + c;\n}\n";
    syntax_missing_semicolon_before_comment: "fn f(x: f32[4]) -> f32[4] {\n    let y = relu(x) // the activation\n    /* then */\n    return y;\n}\n";
    generic_error_reported_once: "fn bad[N](x: f32[N]) -> f32[N] {\n    return x @ x;\n}\nfn f(x: f32[3]) -> f32[3] {\n    let a = bad(x);\n    let b = bad(x);\n    return a + b;\n}\n";
    did_you_mean_a_name: "fn f(x: f32[4]) -> f32[4] {\n    let hidden = relu(x);\n    return hiden * 2.0;\n}\n";
    did_you_mean_a_function: "fn f(x: f32[4, 4]) -> f32[4, 4] {\n    return sofmax(x);\n}\n";
    did_you_mean_an_operand: "op rows[M, N](xs: f32[M, N]) -> f32[M] {\n    out[i] = sum[j](x[i, j]);\n}\nfn f(x: f32[2, 3]) -> f32[2] {\n    return rows(x);\n}\n";
    only_generic_functions: "fn id[N](x: f32[N]) -> f32[N] {\n    return x;\n}\n";
    unknown_parameter_modifier: "fn f(x: f32[4], wieght w: f32[4]) -> f32[4] {\n    return x + w;\n}\n";
    weight_on_op_parameter: "op scale[N](weight w: f32[N], x: f32[N]) -> f32[N] {\n    out[i] = w[i] * x[i];\n}\nfn f(x: f32[4], weight w: f32[4]) -> f32[4] {\n    return scale(w, x);\n}\n";
}

#[test]
fn pathological_nesting_is_an_error_not_a_crash() {
    for (open, close) in [("(", ")"), ("relu(", ")"), ("-", "")] {
        let depth = 50_000;
        let src = format!(
            "fn f(x: f32[4]) -> f32[4] {{\n    return {}x{};\n}}\n",
            open.repeat(depth),
            close.repeat(depth)
        );
        let rendered = diagnose(&src);
        assert!(
            rendered.contains("nests deeper than"),
            "{}",
            &rendered[..rendered.len().min(400)]
        );
    }
    let chain = format!(
        "fn f(x: f32[4]) -> f32[4] {{\n    return x{};\n}}\n",
        " + x".repeat(100_000)
    );
    assert!(diagnose(&chain).contains("nests deeper than"));
}

#[test]
fn bytes_that_are_not_utf8_are_located() {
    let err = decode(
        "model.dl",
        b"fn f(x: f32[4]) -> f32[4] {\n    return \xff;\n}\n".to_vec(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "error: model.dl:2:12: the file is not valid UTF-8 (byte 0xff)"
    );
}

#[test]
fn every_error_in_a_file_is_reported() {
    let rendered = diagnose(
        "fn f(x: f32[4]) -> f32[4] {\n    return y;\n}\nfn g(x: f32[4]) -> f32[4] {\n    return z;\n}\n",
    );
    assert!(
        rendered.contains("unknown name `y`") && rendered.contains("unknown name `z`"),
        "{rendered}"
    );
}

/// A source error carries the place of its first shown diagnostic (1-based,
/// columns in characters), which tools point at without parsing the text.
#[test]
fn source_errors_carry_the_first_place() {
    let place = |source: &str| match compile_source(&SourceText {
        name: "model.dl".into(),
        text: source.into(),
        weights: Vec::new(),
    }) {
        Err(DriverError::Source(e)) => {
            assert_eq!(e.file, "model.dl");
            assert!(e.rendered.contains(&format!(
                "--> model.dl:{}:{}",
                e.place.unwrap().0,
                e.place.unwrap().1
            )));
            e.place
        }
        other => panic!("expected a source diagnostic, got {other:?}"),
    };
    assert_eq!(
        place("fn f(x: f32[2]) -> f32[2] {\n    return x + zz;\n}"),
        Some((2, 16))
    );
    // Past a character of two bytes, the place is the renderer's.
    assert_eq!(
        place("// é\nfn f(x: f32[2]) -> f32[2] {\n  let é = 1; return x + zz; }"),
        Some((3, 7))
    );
}
