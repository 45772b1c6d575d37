//! Helpers shared by the workspace-level tests: where the repository and its
//! examples are, the code examples of the language reference, and the MLIR
//! tools that check `--mlir-generic` output.
#![deny(missing_docs)]

use std::path::{Path, PathBuf};

use dlc_runtime::HostTensor;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Every fenced code block of a Markdown text that defines a `fn` or `op`.
pub fn code_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            match current.take() {
                Some(block) => blocks.push(block),
                None => current = Some(String::new()),
            }
        } else if let Some(block) = &mut current {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks
        .into_iter()
        .filter(|b| {
            b.lines()
                .any(|l| l.starts_with("fn ") || l.starts_with("op "))
        })
        .collect()
}

/// The code examples of the language reference (`docs/language.md`), which
/// are normative, read from the file itself.
pub fn language_reference_examples() -> Vec<String> {
    let path = repo_root().join("docs/language.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "the language reference {} must be readable: {e}",
            path.display()
        )
    });
    code_blocks(&text)
}

/// The repository's files, relative to its root: what `git ls-files` lists,
/// or, without git (an unpacked archive), every file outside the ignored
/// build and fuzzing directories.
pub fn repository_files() -> Vec<String> {
    let root = repo_root();
    if let Ok(out) = std::process::Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z"])
        .output()
        && out.status.success()
    {
        return String::from_utf8_lossy(&out.stdout)
            .split('\0')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
    }
    const IGNORED: [&str; 6] = [
        ".git",
        "target",
        "fuzz/target",
        "fuzz/corpus",
        "fuzz/artifacts",
        "out",
    ];
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap_or(&p).display().to_string();
            if IGNORED.contains(&rel.as_str()) {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root, &root, &mut files);
    files.sort();
    files
}

/// Every `.dl` file under `examples/`, sorted, as (relative path, text).
pub fn example_files() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "dl") {
                out.push(p);
            }
        }
    }
    let root = repo_root();
    let mut paths = Vec::new();
    walk(&root.join("examples"), &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&root).unwrap_or(&p).display().to_string();
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            (rel, text)
        })
        .collect()
}

/// `mlir-opt` from LLVM 22, which `make setup` installs. Outside CI a
/// missing tool skips the MLIR checks with a printed reason; in CI
/// (`CI` set) it is an error, so the check cannot silently vanish.
pub fn mlir_opt() -> Option<PathBuf> {
    for candidate in ["/usr/lib/llvm-22/bin/mlir-opt", "/usr/bin/mlir-opt-22"] {
        let p = PathBuf::from(candidate);
        if p.exists() {
            return Some(p);
        }
    }
    if std::env::var_os("CI").is_some() {
        panic!("mlir-opt (LLVM 22) is missing in CI; `make setup` installs it");
    }
    eprintln!("skipping the MLIR parse check: mlir-opt-22 not found (run `make setup`)");
    None
}

/// NVIDIA's PTX assembler, from the `nvidia-cuda-nvcc-cu12` wheel that
/// `make setup-cuda` installs under `target/cuda-venv` (or `DLC_PTXAS`).
/// Outside CI a missing assembler skips the PTX checks with a printed
/// reason; in CI (`CI` set) it is an error.
pub fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DLC_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let lib = repo_root().join("target/cuda-venv/lib");
    if let Ok(entries) = std::fs::read_dir(&lib) {
        for e in entries.flatten() {
            let p = e.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas");
            if p.exists() {
                return Some(p);
            }
        }
    }
    if std::env::var_os("CI").is_some() {
        panic!("ptxas is missing in CI; `make setup-cuda` installs it");
    }
    eprintln!("skipping the PTX assembly check: ptxas not found (run `make setup-cuda`)");
    None
}

/// Assembles `ptx` for `arch` (`sm_90`) with `ptxas`; `Ok` holds what it
/// says about each kernel (registers, spills, shared memory), `Err` its
/// complaint.
pub fn ptxas_accepts(ptxas: &Path, ptx: &str, arch: &str) -> Result<String, String> {
    // A directory per call, removed after it (calls run on several threads).
    let n = PTX_FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("dlc-ptxas-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let file = dir.join("k.ptx");
    let run = std::fs::write(&file, ptx)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            std::process::Command::new(ptxas)
                .arg(format!("-arch={arch}"))
                .arg("-v")
                .arg(&file)
                .arg("-o")
                .arg(dir.join("k.cubin"))
                .output()
                .map_err(|e| format!("running {}: {e}", ptxas.display()))
        });
    let _ = std::fs::remove_dir_all(&dir);
    let out = run?;
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(said)
    } else {
        Err(said)
    }
}

static PTX_FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Runs `mlir-opt --allow-unregistered-dialect` on `text`; `Err` holds its
/// complaint.
pub fn mlir_parses(mlir_opt: &Path, text: &str) -> Result<(), String> {
    run_mlir_opt(mlir_opt, text, &["--allow-unregistered-dialect"])
}

/// Runs `mlir-opt` on `text` with only MLIR's registered dialects (upstream MLIR, no dlc dialect); `Err` holds
/// its complaint.
pub fn mlir_parses_upstream(mlir_opt: &Path, text: &str) -> Result<(), String> {
    run_mlir_opt(mlir_opt, text, &[])
}

fn run_mlir_opt(mlir_opt: &Path, text: &str, flags: &[&str]) -> Result<(), String> {
    use std::io::Write;
    let mut child = std::process::Command::new(mlir_opt)
        .args(flags)
        .arg("-o")
        .arg("/dev/null")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", mlir_opt.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Reductions in every floating-point type at sizes where accumulating in
/// f16 or bf16 visibly fails, each as (source, the value every input is
/// filled with, the exact value of the result's first element). A narrow
/// accumulator stalls: a sum of f16 ones stops at 2048, a bf16 one at 256.
/// Every execution path accumulates f16/bf16 in f32 (docs/language.md) and
/// must give the exact value within a few ulps of the type.
pub fn narrow_accumulation_cases() -> Vec<(String, f64, f64)> {
    let mut cases = Vec::new();
    for t in ["f32", "f16", "bf16"] {
        // Inputs rounded to the type: 0.1 is not exact in any of them.
        let dtype: dlc_core::DType = t.parse().unwrap_or(dlc_core::DType::F32);
        let tenth = dtype.round(0.1);
        cases.extend([
            (
                format!("fn c(x: {t}[1, 64, 3, 3], w: {t}[1, 64, 3, 3]) -> {t}[1, 1, 1, 1] {{ return conv2d(x, w); }}"),
                0.1,
                576.0 * tenth * tenth,
            ),
            (
                format!("fn s(x: {t}[128, 128]) -> {t} {{ return sum(x); }}"),
                1.0,
                16384.0,
            ),
            (
                format!("fn s(x: {t}[64, 4096]) -> {t}[64] {{ return sum(x, axis=1); }}"),
                1.0,
                4096.0,
            ),
            (
                format!("fn m(x: {t}[24, 24]) -> {t} {{ return mean(x); }}"),
                0.1,
                tenth,
            ),
            (
                format!("fn p(x: {t}[576]) -> {t}[576] {{ return softmax(x); }}"),
                0.1,
                1.0 / 576.0,
            ),
            (
                format!("fn p(x: {t}[2, 4096]) -> {t}[2, 4096] {{ return layernorm(x) + x; }}"),
                1.0,
                1.0,
            ),
            (
                format!("fn g(a: {t}[4, 4096], b: {t}[4096, 4]) -> {t}[4, 4] {{ return a @ b; }}"),
                1.0,
                4096.0,
            ),
            (
                format!("fn a(x: {t}[1, 1, 64, 64]) -> {t}[1, 1, 1, 1] {{ return avgpool2d(x, kernel=64); }}"),
                0.1,
                tenth,
            ),
            (
                format!(
                    "op rows[M, N](x: {t}[M, N]) -> {t}[M] {{ out[i] = sum[j](x[i, j]); }}\n\
                     fn r(x: {t}[8, 8192]) -> {t}[8] {{ return rows(x); }}"
                ),
                1.0,
                8192.0,
            ),
        ]);
    }
    cases
}

/// Every model in `examples/` and every example of the language
/// reference, named.
pub fn every_example() -> Vec<(String, String)> {
    let mut programs = example_files();
    programs.extend(
        language_reference_examples()
            .into_iter()
            .enumerate()
            .map(|(i, t)| (format!("docs/language.md example {}", i + 1), t)),
    );
    programs
}

/// `src` compiled and run through the default pipeline; panics (naming
/// the source) where either fails.
pub fn optimized(src: &str) -> dlc_graph::Module {
    let mut m = dlc_driver::compile_source(&dlc_driver::SourceText {
        name: "t.dl".into(),
        text: src.to_string(),
        weights: Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{src}: {e}"));
    dlc_driver::run_passes(
        &mut m,
        dlc_driver::DEFAULT_PIPELINE,
        dlc_driver::PassOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{src}: {e}"));
    m
}

/// A way of running entry point `f` of a module on inputs.
pub type Runner =
    dyn Fn(&dlc_graph::Module, &dlc_graph::Function, &[HostTensor]) -> Vec<HostTensor>;

/// Runs the [`narrow_accumulation_cases`] with `run` on inputs filled with
/// their value: the first result element must be the exact value within
/// `--check`'s tolerance for the type, and every result must pass `--check`
/// against the graph interpreter. Panics otherwise.
pub fn check_narrow_accumulation(run: &Runner) {
    for (src, fill, exact) in narrow_accumulation_cases() {
        let m = optimized(&src[..]);
        let Some(f) = m.entry_points().next() else {
            panic!("{src}: no entry point");
        };
        let inputs: Vec<HostTensor> = f
            .param_types()
            .into_iter()
            .map(|t| {
                let n = t.num_elements().unwrap_or(0);
                let v = t.dtype.round(fill);
                HostTensor::new(t, vec![v; n]).unwrap_or_else(|e| panic!("{e}"))
            })
            .collect();
        let got = run(&m, f, &inputs);
        let want = dlc_driver::interpret(&m, f, &inputs).unwrap_or_else(|e| panic!("{e}"));
        let tolerances = dlc_driver::check_tolerances(f);
        let first = got[0].data[0];
        assert!(
            (first - exact).abs() <= tolerances[0] * exact.abs(),
            "{src}: got {first}, exact {exact} (reference interpreter {})",
            want[0].data[0]
        );
        let checks =
            dlc_driver::check_results(&got, &want, &tolerances).unwrap_or_else(|e| panic!("{e}"));
        for c in checks {
            assert!(c.passed(), "{src}: {c}");
        }
    }
}

/// Programs over every element type beyond f32: f64 functions and
/// products, and the signed and unsigned integers of each width where they
/// differ from one another (wrapping at the width, unsigned comparison,
/// division, max/min and extension, reductions from each type's extreme
/// values, casts between them, bitwise ops, and logical and arithmetic
/// shifts, by amounts past the width and negative ones too).
pub const ELEMENT_TYPE_PROGRAMS: [&str; 6] = [
    "fn f(a: u8[16], b: u8[16], c: i8[16], d: i16[16], g: u64[16]) -> (u8[16], u8[16], i8[16], i8[16], i16[16], u64[16], u8[16]) { let h = b / 2; return (bitand(a * 13, b * 7) + bitor(a, h), bitxor(a, 255) + shl(a * 9, h), shr(c * 15, cast(b, i8) / 2), shl(c, c) + bitxor(c, -1), shr(d * 999, cast(b, i16)), shr(g * 1000000000, cast(h, u64)) + shl(g, 60), shr(a * 13, h)); }",
    "fn f(a: u8[16], b: u8[16]) -> (u8[16], u8[16], bool[16], i32[16], f32[16], u8[16], u8[16]) { let w = a * 13 + b; return (w / (b + 1), max(w, b * 11) - min(w, 7), w > 100, cast(w, i32), cast(w, f32), sign(w) + abs(w) + relu(w), b - 15); }",
    "fn f(c: i8[16], d: i16[16]) -> (i8[16], i16[16], i32[16], f32[16], bool[16], u8[16]) { let v = c * 15; return (v / 3 - abs(v) + max(v, c), d * 3000 + cast(v, i16), cast(v, i32) + cast(d, i32), cast(v, f32), v < c, cast(v, u8)); }",
    "fn f(e: u32[8], g: u64[8], h: u16[8]) -> (u32[8], u64[8], u16[8], i64[8], f64[8]) { return (e * 4000000 + 7, g * 3 + 70, h - 5 + cast(e, u16), cast(e - 30, i64), cast(g, f64) / 3.0); }",
    "fn f(x: f64[4, 8], y: f64[8, 3]) -> (f64[4, 3], f64[4, 8], f32[4, 8], i8[4, 8]) { return (relu(x @ y) + pow(abs(x @ y), 0.5), tanh(x) + exp(x) * erf(x) + sigmoid(x) - gelu(x) + silu(x) + sin(x) * cos(x) + log(abs(x) + 1.0) + max(x, 0.25) + floor(x * 3.0) + sign(x) + rsqrt(abs(x) + 1.0), cast(x, f32), cast(x * 100.0, i8)); }",
    "fn f(a: u8[4, 8], c: i8[4, 8], x: f64[4, 8], e: u32[4, 8]) -> (u8[8], u8[4], i8[8], i8[4], f64[4], f64[8], u32[8]) { return (max(a * 13, axis=0), min(a * 13, axis=1), min(c * 15, axis=0), max(c * 15, axis=1), sum(x, axis=1), mean(x, axis=0), min(e - 10, axis=0)); }",
];

/// Programs of the built-ins that are compositions of graph ops
/// (activations, logical operators, shape helpers, reductions, `argmax`,
/// `gather` with run-time indices, `one_hot`, `arange`, `topk`, `cumsum`,
/// `pad`, `conv1d`, pooling in 1-D, group and instance norms, `gemm`...).
pub const COMPOSITE_PROGRAMS: [&str; 2] = [
    "fn main(x: f32[3, 4], i: i64[5], b: bool[3, 4]) -> (f32[3, 4], f32[3, 4], bool[3, 4], f32[3, 4], f32[4, 3], i64[3], f32[5, 4], f32[3], f32[3, 4], f32[5, 6]) {  let a = leaky_relu(x, alpha=0.1) + elu(x) + softplus(x) + hardsigmoid(x) + hardswish(x) + mish(x) + clamp(x, -0.5, 0.5) + log1p(abs(x)) + expm1(x);  let c = log_softmax(x, axis=1) + tril(x, k=1) + triu(x) ;  let d = logical_or(logical_and(b, isnan(x)), logical_not(logical_xor(b, isinf(x))));  let (p, q) = split(x, [1, 3], axis=1);  let e = concat([q, p], axis=1) + expand(unsqueeze(l2_norm(x, axis=1), axis=1), [3, 4]);  let g = transpose(stack([x, x], axis=0), [0, 2, 1]);  let h = reshape(slice(g, axis=0, start=0, end=1), [4, 3]);  return (a, c, d, e, h, argmax(x, axis=1), gather(x, i, axis=0), logsumexp(x, axis=1) + variance(x, axis=1) + l1_norm(x, axis=1), dropout(x, p=0.1) * cast(one_hot(argmin(x, axis=1), 4), f32), cast(tile(one_hot(i - 2, 3), [1, 2]), f32) + arange(0.0, 6.0)); }",
    "fn main(x: f32[2, 4, 6], w: f32[3, 4, 3], g: f32[4], b: f32[4], i: i64[2, 4, 2], m: f32[3, 5], n: f32[5, 3]) -> (f32[2, 3, 3], f32[2, 4, 3], f32[2, 4, 6], f32[2, 4, 6], f32[2, 4, 6], f32[3, 3], f32[2, 4, 2], i64[2, 4, 2], f32[2, 4, 2], f32[4, 7]) {  let (v, k) = topk(x, 2, axis=2);  return (conv1d(x, w, padding=1, stride=2), maxpool1d(x, 2) + avgpool1d(x, 2), cumsum(x, 2, reverse=true) + cumsum(x, 1, exclusive=true), group_norm(x, 2, g, b), instance_norm(x, g, b, eps=0.001), gemm(m, n, m @ n, alpha=0.5, beta=2.0) + gemm(n, m, trans_a=true, trans_b=true), v, k, gather_elements(x, i, axis=2), pad(reshape(slice(x, axis=0, start=0, end=1), [4, 6]), [0, 0, 0, 1], value=-1.0)); }",
];

/// Runs the [`ELEMENT_TYPE_PROGRAMS`] and the [`COMPOSITE_PROGRAMS`] with
/// `run` on random inputs: every result must pass `--check` against the
/// graph interpreter at its own type's tolerance (integers exactly).
/// Panics otherwise.
pub fn check_element_types(run: &Runner) {
    for src in ELEMENT_TYPE_PROGRAMS.iter().chain(&COMPOSITE_PROGRAMS) {
        let m = optimized(&src[..]);
        let Some(f) = m.entry_points().next() else {
            panic!("{src}: no entry point");
        };
        for seed in 0..3 {
            let inputs =
                dlc_driver::prepare_inputs(f, &[], Some(seed)).unwrap_or_else(|e| panic!("{e}"));
            let got = run(&m, f, &inputs);
            let want = dlc_driver::interpret(&m, f, &inputs).unwrap_or_else(|e| panic!("{e}"));
            let tolerances: Vec<f64> = f
                .result_types()
                .into_iter()
                .map(|t| dlc_driver::check_tolerance(t.dtype))
                .collect();
            let checks = dlc_driver::check_results(&got, &want, &tolerances)
                .unwrap_or_else(|e| panic!("{e}"));
            for (i, c) in checks.iter().enumerate() {
                assert!(
                    c.passed(),
                    "{src}\nseed {seed}: {c}\ngot  {:?}\nwant {:?}",
                    got[i].data,
                    want[i].data
                );
            }
        }
    }
}

/// Operators every generated program defines.
const HEADER: &str = "
op rowsum[M, N](x: f32[M, N]) -> f32[M] {
    out[i] = sum[j](x[i, j]);
}
op shift[N](x: f32[N]) -> f32[N] {
    let h[i] = x[i] * 0.5;
    out[i] = h[i + 1] - h[i];
}
";

/// Builds a well-typed program from a list of choices: each choice appends
/// one `let` applying some operator to values already defined. The entry
/// point is `f(a: f32[4, 6], b: f32[6, 4], c: f32[6], s: f32)`.
pub fn generated_program(choices: &[u32], tuple: bool) -> String {
    generated_program_sized(choices, tuple, 4, 6)
}

/// [`generated_program`] with the entry point
/// `f(a: f32[M, N], b: f32[N, M], c: f32[N], s: f32)` (`M` and `N` distinct):
/// large sizes make its products big enough for the tile dialect's
/// `loop.matmul`.
pub fn generated_program_sized(choices: &[u32], tuple: bool, m: usize, n: usize) -> String {
    let mut pool: Vec<(String, Vec<usize>)> = vec![
        ("a".into(), vec![m, n]),
        ("b".into(), vec![n, m]),
        ("c".into(), vec![n]),
        ("s".into(), vec![]),
    ];
    let mut body = String::new();
    for (n, &c) in choices.iter().enumerate() {
        let (v, shape) = pool[(c as usize / 16) % pool.len()].clone();
        let partner = pool.iter().find(|(w, sh)| *sh == shape && *w != v).cloned();
        let rank = shape.len();
        let (expr, out): (String, Vec<usize>) = match c % 16 {
            0 => (format!("relu({v})"), shape),
            1 => (format!("tanh({v})"), shape),
            2 => (format!("sigmoid({v}) * 1.0"), shape),
            3 => (format!("({v} * 0.5 + 1.0) - 0.0"), shape),
            4 => (format!("-(-{v}) / 1.0"), shape),
            5 if rank == 2 => (format!("transpose({v})"), vec![shape[1], shape[0]]),
            6 if rank >= 1 => {
                let keep = (c >> 8) & 1 == 1;
                let mut s = shape.clone();
                if keep {
                    s[0] = 1
                } else {
                    s.remove(0);
                }
                (format!("sum({v}, axis=0, keepdims={keep})"), s)
            }
            7 if rank == 2 => match pool
                .iter()
                .find(|(_, sh)| sh.len() == 2 && sh[0] == shape[1])
            {
                Some((w, sh)) => (format!("{v} @ {w}"), vec![shape[0], sh[1]]),
                None => (format!("gelu({v})"), shape),
            },
            8 => match partner {
                Some((w, _)) => (
                    ["+", "*", "-"].map(|o| format!("{v} {o} {w}"))[(c as usize >> 8) % 3].clone(),
                    shape,
                ),
                None => (format!("max({v}, 0.25)"), shape),
            },
            9 if rank >= 1 => (format!("softmax({v}, axis=-1)"), shape),
            10 if rank == 2 => (format!("rowsum({v})"), vec![shape[0]]),
            10 if rank == 1 => (format!("shift({v})"), shape),
            11 if rank >= 1 => {
                let dims = shape
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                (format!("reshape(reshape({v}, [-1]), [{dims}])"), shape)
            }
            12 if rank == 2 => (format!("transpose(transpose({v}))"), shape),
            13 => (
                format!(
                    "{v} + full([{}], 0.5) * 2.0",
                    shape
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                shape,
            ),
            14 if rank == 2 => (
                format!("layernorm({v}) + where({v} > 0.0, {v}, 0.0)"),
                shape,
            ),
            _ => (format!("abs({v}) * exp(0.0)"), shape),
        };
        let name = format!("v{n}");
        body.push_str(&format!("    let {name} = {expr};\n"));
        pool.push((name, out));
    }
    let ty = |s: &[usize]| {
        format!(
            "f32[{}]",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let (last, last_shape) = pool.last().cloned().unwrap_or_default();
    let (ret_ty, ret) = if tuple {
        let (first, first_shape) = pool[pool.len() / 2].clone();
        (
            format!("({}, {})", ty(&last_shape), ty(&first_shape)),
            format!("({last}, {first})"),
        )
    } else {
        (ty(&last_shape), last)
    };
    format!(
        "{HEADER}\nfn f(a: f32[{m}, {n}], b: f32[{n}, {m}], c: f32[{n}], s: f32) -> {ret_ty} {{\n{body}    return {ret};\n}}\n"
    )
}

// Programs the differential tests run on every execution path (the loop
// and tile interpreters, the GPU emulator) against the graph interpreter,
// by group.

/// Element-wise operators, broadcasting, casts.
pub const ELEMENT_WISE_PROGRAMS: &[&str] = &[
    "fn f(x: f32[3, 4], b: f32[4], s: f32) -> f32[3, 4] { return gelu(tanh(x) * b - s) + sigmoid(-x) / (abs(x) + 1.0); }",
    "fn f(x: f32[3, 4], y: f32[3, 1]) -> f32[3, 4] { return where(x > y, exp(x), pow(abs(y) + 0.5, 2.0)) + max(x, y) - min(x, 0.0) + rsqrt(abs(x) + 1.0) + log(sqrt(abs(x) + 1.0)); }",
    "fn f(x: i32[2, 3], y: i32[3]) -> i32[2, 3] { return (x * 3 + y) / 4 - abs(x) + relu(y); }",
    "fn f(x: f32[2, 3]) -> i32[2, 3] { return cast(x * 10.0, i32); }",
];

/// Transposes, reshapes, slices (those along the outer axis are views with
/// offsets: read by a product, element-wise ops, a result, a slice of a
/// slice), concatenations, broadcasts, dense constants.
pub const SHAPE_PROGRAMS: &[&str] = &[
    "fn f(x: f32[2, 3, 4]) -> f32[4, 2, 3] { return transpose(x, [2, 0, 1]) * 2.0; }",
    "fn f(x: f32[2, 6]) -> f32[3, 4] { return reshape(exp(x), [3, 4]) + 1.0; }",
    "fn f(x: f32[2, 6]) -> f32[3, 4] { return reshape(exp(x), [3, 4]); }",
    "fn f(x: f32[2, 6]) -> f32[12] { return reshape(x, [-1]); }",
    "fn f(x: f32[4, 5]) -> f32[4, 2] { return slice(x, axis=1, start=1, end=3) - 1.0; }",
    "fn f(x: f32[4, 6, 8], w: f32[8, 5], y: f32[3, 2, 8]) -> (f32[6, 5], f32[2, 6, 8], f32[6, 8], f32[1, 2, 8]) { let a = reshape(slice(x, axis=0, start=2, end=3), [6, 8]); let c = exp(reshape(slice(x, axis=0, start=3, end=4), [6, 8])) + 1.0; return (a @ w, slice(x, axis=0, start=1, end=3) * 2.0, c, slice(slice(y, axis=0, start=1, end=3), axis=0, start=1, end=2)); }",
    "fn f(a: f32[2, 3], b: f32[2, 2]) -> f32[2, 5] { return concat([relu(a), b * 2.0], axis=1); }",
    "fn f(x: f32[3]) -> f32[2, 3] { return broadcast(x, [2, 3]); }",
    "fn f(x: f32[2, 3]) -> (f32[3, 2], f32[2, 3], i64[2]) { let w = tensor([0.5, -1.0, 2.0, 0.25, 3.0, -0.75], [2, 3]); return (reshape(w, [3, 2]) * 2.0, x @ transpose(w) @ w, tensor([3, -4], [2])); }",
    "fn f(x: f32[2]) -> f32[4] { return concat([x, zeros([1]), ones([1])]) * concat([ones([2]), full([2], 3.0)]); }",
    // Mostly transposed reads (a sum of weight gradients stored the other
    // way round, into an update): the nest runs along the result's columns.
    "fn f(w: f32[70, 33], a: f32[33, 70], b: f32[33, 70], c: f32[33, 70]) -> f32[70, 33] { return w - 0.5 * (transpose(a) + transpose(b) + transpose(c)); }",
];

/// Gathers (`graph.gather`) and scatter-adds (`graph.scatter_add`): random
/// indices (in -10..=10) fall inside, repeat, count from the end and fall
/// outside (reading zero, adding nowhere); a row each (an embedding and its
/// gradient), columns, a scalar index, constant indices, `gather_elements`
/// (a gather of the flattened tensor) and `scatter_add_elements` with
/// indices shorter than the data on another axis, integers.
pub const GATHER_PROGRAMS: &[&str] = &[
    "fn f(t: f32[8, 12], ids: i64[3, 2]) -> f32[3, 2, 12] { return gather(t, ids) * 2.0; }",
    "fn f(x: f32[4, 6, 5], ids: i32[7]) -> (f32[4, 7, 5], f32[6, 7]) { return (gather(x, ids, axis=1), gather(gather(x, tensor([-3], [], dtype=i64)), ids, axis=-1)); }",
    "fn f(x: f32[6, 5]) -> f32[4, 5] { return gather(relu(x), tensor([5, -1, 0, 6], [4], dtype=i64)); }",
    "fn f(t: f32[9, 70], ids: i64[5, 4], g: f32[5, 4, 70]) -> f32[9, 70] { return scatter_add(t, ids, g * 2.0) + 1.0; }",
    "fn f(x: f32[3, 8, 5], ids: i32[12], u: f32[3, 12, 5], v: i32[4, 8], j: i64[6]) -> (f32[3, 8, 5], i32[4, 8], f32[3]) { return (scatter_add(relu(x), ids, u, axis=1), scatter_add(v, j, slice(v, axis=1, start=0, end=6) * 3, axis=-1), scatter_add(full([3], 0.5), tensor([2, 2, -1, 7], [4], dtype=i64), tensor([1.0, 2.0, 3.0, 4.0], [4]))); }",
    "fn f(x: f32[4, 9, 6], i: i64[3, 9, 2], u: f32[3, 9, 2]) -> f32[4, 9, 6] { return scatter_add_elements(x, i, u * 2.0, axis=2); }",
    "fn f(x: f32[4, 9, 6], i: i64[3, 9, 2], y: i32[5, 11]) -> (f32[3, 9, 2], i32[1, 7]) { return (gather_elements(x, i, axis=2) + 1.0, gather_elements(y, tensor([0, 10, -1, -11, 3, 4, 12], [1, 7], dtype=i64), axis=1)); }",
];

/// Reductions, softmax, layernorm, batchnorm.
pub const REDUCTION_PROGRAMS: &[&str] = &[
    "fn f(x: f32[3, 4, 5]) -> (f32[3, 5], f32[1, 4, 1], f32, f32[3, 4]) { return (sum(x, axis=1), mean(x, axis=[0, 2], keepdims=true), max(x), min(x, axis=-1)); }",
    "fn f(x: i32[3, 4]) -> (i32[3], i32[4]) { return (max(x, axis=1), min(x, axis=0)); }",
    "fn f(x: f32[3, 4, 5]) -> (f32[3, 4, 5], f32[3, 4, 5]) { return (softmax(x, axis=1), layernorm(x, axis=[1, 2]) * 2.0 + 1.0); }",
    "fn f(x: f32[2, 3, 4, 4], m: f32[3], v: f32[3], g: f32[3], b: f32[3]) -> f32[2, 3, 4, 4] { return relu(batchnorm(x, m, abs(v) + 0.5, g, b)); }",
];

/// Matrix products with epilogues, batches, vectors.
pub const PRODUCT_PROGRAMS: &[&str] = &[
    "fn f(x: f32[3, 5], w: f32[5, 4], b: f32[4]) -> f32[3, 4] { return relu(x @ w + b); }",
    "fn f(a: f32[2, 1, 3, 4], b: f32[5, 4, 2]) -> f32[2, 5, 3, 2] { return a @ b; }",
    "fn f(v: f32[4], m: f32[4, 3], w: f32[3]) -> (f32[3], f32) { return (v @ m, (v @ m) @ w); }",
    "fn f(x: f32[3, 5], w: f32[5, 4], z: f32[6, 4]) -> f32[3, 4] { return x @ w + sum(z, axis=0); }",
    "fn f(x: f32[3, 5], w: f32[5, 1], y: f32[3, 4]) -> f32[3, 4] { return (x @ w) * y; }",
    "fn f(x: f32[3, 3]) -> f32[3, 3] { let p = x @ x; return p + transpose(p); }",
    "fn f(a: f32[4, 6], b: f32[6, 4]) -> f32[6, 6] { return transpose(b @ a) * 2.0; }",
    "fn f(x: f32[5, 5, 3]) -> f32[5, 5] { return exp(transpose(sum(x, axis=2), [1, 0])); }",
];

/// Convolutions computed as products (im2col, or a 1 x 1 one reading its
/// input in place) whose element-wise chain the product computes at its
/// flattened index `[N, O, OY*OX]`: a bias `[O, 1, 1]`, a residual and a
/// relu; ReLU6 as a clip at stride 2; a scale that varies along the output
/// rows only, which cannot be read at that index (its own nest); SiLU of a
/// biased sum, which reads the sum twice.
pub const CONV_EPILOGUE_PROGRAMS: &[&str] = &[
    "fn f(x: f32[2, 16, 9, 10], w: f32[24, 16, 1, 1], b: f32[24, 1, 1], r: f32[2, 24, 9, 10]) -> f32[2, 24, 9, 10] { return relu(conv2d(x, w) + b + r); }",
    "fn f(x: f32[1, 8, 15, 15], w: f32[16, 8, 3, 3]) -> f32[1, 16, 8, 8] { return clip(conv2d(x, w, stride=2, padding=1), 0.0, 6.0); }",
    "fn f(x: f32[2, 16, 9, 10], w: f32[24, 16, 1, 1], s: f32[1, 1, 9, 1]) -> f32[2, 24, 9, 10] { return tanh(conv2d(x, w) * s); }",
    "fn f(x: f32[2, 16, 9, 10], w: f32[24, 16, 3, 3], b: f32[24, 1, 1]) -> f32[2, 24, 9, 10] { let h = conv2d(x, w, padding=1) + b; return h * sigmoid(h); }",
];

/// A depthwise convolution at stride 2 (MobileNet's downsampling), ReLU6
/// after it: its columns are read two elements apart, 71 of them (ragged
/// in tiles of 32 and 64).
pub const STRIDED_DEPTHWISE_PROGRAM: &str = "fn f(x: f32[2, 8, 33, 141], w: f32[8, 1, 3, 3]) -> f32[2, 8, 17, 71] { return clip(conv2d(x, w, stride=2, padding=1, groups=8), 0.0, 6.0); }";

/// Element-wise work over small images (`[N, C, H, W]`, rows under 16):
/// a squeeze-excite gate scaling a 7 x 7 image, then a residual and a
/// per-channel affine (all of it spanning the image or per channel: one
/// 49-long axis); a value per image row added (spanning one axis: the
/// nest keeps two); a 14 x 14 image's hardswish.
pub const FLAT_IMAGE_PROGRAMS: [&str; 3] = [
    "fn f(x: f32[2, 24, 7, 7], s: f32[2, 24, 1, 1], r: f32[2, 24, 7, 7], a: f32[24, 1, 1], b: f32[24, 1, 1]) -> f32[2, 24, 7, 7] { return (x * sigmoid(s) + r) * a + b; }",
    "fn f(x: f32[1, 24, 7, 7], r: f32[7, 1]) -> f32[1, 24, 7, 7] { return relu(x + r); }",
    "fn f(x: f32[1, 40, 14, 14]) -> f32[1, 40, 14, 14] { return hardswish(x); }",
];

/// Pixel convolutions (`dlc_graph::ops::conv_is_pixel`): a squeeze-excite
/// block's two fully connected layers on `[N, C, 1, 1]` (a bias and ReLU,
/// then hardsigmoid, as epilogues), large enough that the CPU would pack
/// them as products; one pixel taken from a 2 x 2 image at stride 2; one
/// whose only tap falls in the padding.
pub const PIXEL_CONV_PROGRAMS: [&str; 3] = [
    "fn f(x: f32[2, 144, 1, 1], w1: f32[160, 144, 1, 1], b1: f32[160, 1, 1], w2: f32[144, 160, 1, 1]) -> f32[2, 144, 1, 1] { let h = relu(conv2d(x, w1) + b1); return hardsigmoid(conv2d(h, w2)); }",
    "fn f(x: f32[3, 70, 2, 2], w: f32[240, 70, 1, 1]) -> f32[3, 240, 1, 1] { return conv2d(x, w, stride=2); }",
    "fn f(x: f32[1, 5, 1, 1], w: f32[4, 5, 1, 1], b: f32[4, 1, 1]) -> f32[1, 4, 1, 1] { return conv2d(x, w, stride=3, padding=1) + b; }",
];

/// 1 x 1 convolutions over few pixels and many channels, run with the
/// pixels as the product's rows (the register tile stored transposed): a
/// bias and relu epilogue over a 7 x 7 image, a residual and the ReLU6 clip
/// over 7 x 7 in a batch of two, a 14 x 14 one (where a vector panel is 32
/// columns); and three that keep the channels as rows: 32 deep over 7 x 7
/// (too shallow to pay for the transposed stores), 160 channels over 7 x 7
/// (too few at 256 deep), and 8 x 8, whose pixels fill the panels; then two
/// whose product reads an im2col buffer as its rows: a strided 1 x 1
/// (ResNet's downsampling) and a strided 3 x 3 into 7 x 7 with padding;
/// last 960 deep into 320 channels over 7 x 7 (MobileNetV2's last
/// projection: deep enough for few channels where a core runs two 512-bit
/// FMAs a cycle, and on AVX2); and 14 x 14 with a residual, which keeps
/// the channels as rows (its 196 pixels leave too little of 7 panels empty
/// for an epilogue reading a value per channel and pixel).
pub const PIXEL_ROW_PROGRAMS: [&str; 10] = [
    "fn f(x: f32[1, 128, 7, 7], w: f32[512, 128, 1, 1], b: f32[512, 1, 1]) -> f32[1, 512, 7, 7] { return relu(conv2d(x, w) + b); }",
    "fn f(x: f32[2, 128, 7, 7], w: f32[512, 128, 1, 1], r: f32[2, 512, 7, 7]) -> f32[2, 512, 7, 7] { return clip(conv2d(x, w) + r, 0.0, 6.0); }",
    "fn f(x: f32[1, 128, 14, 14], w: f32[512, 128, 1, 1]) -> f32[1, 512, 14, 14] { return conv2d(x, w) * 0.5; }",
    "fn f(x: f32[1, 32, 7, 7], w: f32[512, 32, 1, 1]) -> f32[1, 512, 7, 7] { return relu(conv2d(x, w)); }",
    "fn f(x: f32[1, 256, 7, 7], w: f32[160, 256, 1, 1]) -> f32[1, 160, 7, 7] { return conv2d(x, w); }",
    "fn f(x: f32[1, 128, 8, 8], w: f32[512, 128, 1, 1]) -> f32[1, 512, 8, 8] { return relu(conv2d(x, w)); }",
    "fn f(x: f32[1, 128, 14, 14], w: f32[512, 128, 1, 1], b: f32[512, 1, 1]) -> f32[1, 512, 7, 7] { return conv2d(x, w, stride=2) + b; }",
    "fn f(x: f32[1, 64, 14, 14], w: f32[512, 64, 3, 3]) -> f32[1, 512, 7, 7] { return relu(conv2d(x, w, stride=2, padding=1)); }",
    "fn f(x: f32[1, 960, 7, 7], w: f32[320, 960, 1, 1], b: f32[320, 1, 1]) -> f32[1, 320, 7, 7] { return conv2d(x, w) + b; }",
    "fn f(x: f32[1, 128, 14, 14], w: f32[512, 128, 1, 1], r: f32[1, 512, 14, 14]) -> f32[1, 512, 14, 14] { return relu(conv2d(x, w) + r); }",
];

/// 1 x 1 convolutions over 7 x 7 deep enough for three slices of the
/// depth or more, with their residual (EfficientNet-B0's 1152 -> 192,
/// MobileNetV2's 960 -> 160): the pixels are the product's rows, read in
/// place from the input; then one of two slices (320 deep), whose pixels
/// are packed into strips first.
pub const DEEP_PIXEL_ROW_PROGRAMS: [&str; 3] = [
    "fn f(x: f32[1, 1152, 7, 7], w: f32[192, 1152, 1, 1], b: f32[192, 1, 1], r: f32[1, 192, 7, 7]) -> f32[1, 192, 7, 7] { return conv2d(x, w) + b + r; }",
    "fn f(x: f32[1, 960, 7, 7], w: f32[160, 960, 1, 1], b: f32[160, 1, 1], r: f32[1, 160, 7, 7]) -> f32[1, 160, 7, 7] { return conv2d(x, w) + b + r; }",
    "fn f(x: f32[1, 320, 7, 7], w: f32[1280, 320, 1, 1], b: f32[1280, 1, 1]) -> f32[1, 1280, 7, 7] { let y = conv2d(x, w) + b; return y * sigmoid(y); }",
];

/// ONNX's attention with a boolean mask, as `dlc import` writes it: its
/// scalar constants (the scale, zero, -inf) fill buffers whose storage the
/// lowering reuses for one another, which compiled code must not prepare
/// once (a prepared buffer holds one value for the whole call).
pub const REUSED_CONSTANT_STORAGE_PROGRAM: &str = "fn f(q: f32[2, 3, 4, 8], k: f32[2, 3, 6, 8], v: f32[2, 3, 6, 8], mask: bool[4, 6]) -> f32[2, 3, 4, 8] { let scores = (q * 0.59460354) @ transpose(k * 0.59460354, [0, 1, 3, 2]); let bias = where(mask, 0.0, tensor([-inf], [], dtype=f32)); let probs = where(max(bias, axis=-1, keepdims=true) == tensor([-inf], [], dtype=f32), 0.0, softmax(scores + bias, axis=-1)); return probs @ v; }";

/// A 5 x 5 depthwise convolution over 7 columns (EfficientNet's last
/// stages), SiLU after it: longer windows than the rows are wide.
pub const WIDE_WINDOW_DEPTHWISE_PROGRAM: &str = "fn f(x: f32[1, 24, 7, 7], w: f32[24, 1, 5, 5]) -> f32[1, 24, 7, 7] { let h = conv2d(x, w, padding=2, groups=24); return h * sigmoid(h); }";

/// One row times a transposed weight (a linear layer or classifier at
/// batch 1), with a bias and relu after it.
pub const ROW_BY_TRANSPOSED_PROGRAM: &str = "fn f(x: f32[1, 300], w: f32[70, 300], b: f32[70]) -> f32[1, 70] { return relu(x @ transpose(w, [1, 0]) + b); }";

/// One row times a weight stored `[K, N]` (a classifier whose transpose
/// was folded), with a bias and relu after it.
pub const ROW_BY_MATRIX_PROGRAM: &str =
    "fn f(x: f32[1, 300], w: f32[300, 70], b: f32[70]) -> f32[1, 70] { return relu(x @ w + b); }";

/// 1 x 1 convolutions over 7 x 7 pixels that run with the pixels as the
/// product's rows (deep enough, into enough channels): one slice of the
/// depth with SiLU after it, two with a residual and ReLU.
pub const PIXEL_ROW_PRODUCTS: &str = "fn one(x: f32[1, 128, 7, 7], w: f32[512, 128, 1, 1]) -> f32[1, 512, 7, 7] { return silu(conv2d(x, w)); }
fn res(x: f32[1, 384, 7, 7], w: f32[512, 384, 1, 1], r: f32[1, 512, 7, 7]) -> f32[1, 512, 7, 7] { return relu(conv2d(x, w) + r); }";

/// 1 x 1 convolutions computed with the output channels as the product's
/// rows (their result stored along the register tile's columns): SiLU
/// written as exporters write it (`h * sigmoid(h)`), with a bias, and with
/// 40 channels (the last strip ragged); and ReLU6, a short epilogue.
pub const CHANNEL_ROW_PRODUCTS: &str = "fn swish(x: f32[1, 24, 14, 14], weight w: f32[48, 24, 1, 1], weight b: f32[48, 1, 1]) -> f32[1, 48, 14, 14] { let h = conv2d(x, w) + b; return h * sigmoid(h); }
fn ragged(x: f32[1, 16, 10, 10], weight w: f32[40, 16, 1, 1]) -> f32[1, 40, 10, 10] { let h = conv2d(x, w); return sigmoid(h) * h; }
fn six(x: f32[1, 24, 14, 14], weight w: f32[48, 24, 1, 1]) -> f32[1, 48, 14, 14] { return clamp(conv2d(x, w), 0.0, 6.0); }";

/// Depthwise convolutions whose epilogue runs over each output channel's
/// plane after its rows (a long-latency op in it: SiLU; tanh of a sum with
/// a residual, divided by a broadcast; a sigmoid after a grouped
/// convolution of three output channels a group), and one whose short
/// epilogue (ReLU6) stays at each row.
pub const DEFERRED_EPILOGUE_PROGRAMS: &str = "fn silu_dw(x: f32[1, 8, 7, 7], w: f32[8, 1, 5, 5]) -> f32[1, 8, 7, 7] { let h = conv2d(x, w, padding=2, groups=8); return h * sigmoid(h); }
fn res(x: f32[2, 8, 9, 9], w: f32[8, 1, 3, 3], r: f32[2, 8, 9, 9], b: f32[8, 1, 1]) -> f32[2, 8, 9, 9] { return tanh(conv2d(x, w, padding=1, groups=8) + r) / (b + 2.0); }
fn six(x: f32[1, 8, 9, 9], w: f32[8, 1, 3, 3]) -> f32[1, 8, 9, 9] { return clamp(conv2d(x, w, padding=1, groups=8), 0.0, 6.0); }
fn grp(x: f32[1, 8, 6, 6], w: f32[6, 4, 3, 3]) -> f32[1, 6, 6, 6] { return sigmoid(conv2d(x, w, padding=1, groups=2)); }";

/// Grouped convolutions of more than one input channel a group, which run
/// as one packed product per group: 3 x 3 with a bias and ReLU over 16 x 16
/// (ResNeXt's 4 channels a group), whose programs copy their panels from
/// the input; over 14 x 14 (on AVX2 whole rows of panels would pad the
/// columns more) and strided in a batch of two, over an im2col copy; 1 x 1 read in
/// place with a residual; and 1 x 1 over 7 x 7 deep enough that AVX2 takes
/// the pixels as the product's rows.
pub const GROUPED_CONVOLUTION_PROGRAMS: &str = "fn g3(x: f32[1, 64, 16, 16], w: f32[64, 4, 3, 3], b: f32[64, 1, 1]) -> f32[1, 64, 16, 16] { return relu(conv2d(x, w, padding=1, groups=16) + b); }
fn g14(x: f32[1, 64, 14, 14], w: f32[64, 4, 3, 3]) -> f32[1, 64, 14, 14] { return conv2d(x, w, padding=1, groups=16); }
fn s2(x: f32[2, 32, 15, 15], w: f32[64, 8, 3, 3]) -> f32[2, 64, 8, 8] { return conv2d(x, w, stride=2, padding=1, groups=4); }
fn res(x: f32[1, 64, 12, 12], w: f32[128, 16, 1, 1], r: f32[1, 128, 12, 12]) -> f32[1, 128, 12, 12] { return relu(conv2d(x, w, groups=4) + r); }
fn rows(x: f32[1, 256, 7, 7], w: f32[256, 128, 1, 1]) -> f32[1, 256, 7, 7] { return conv2d(x, w, groups=2); }";

/// Dilated convolutions (atrous: DeepLab's and LR-ASPP's): a 5 x 5
/// depthwise window two apart over 14 x 14 (on AVX2 read through a padded
/// copy of each channel), a strided depthwise one dilated along its columns
/// only, a dense 3 x 3 one of 16 channels (a Winograd convolution were it
/// not dilated) with a bias and ReLU, a grouped one, one whose outer taps
/// meet the image from a third of the outputs (ASPP's rates over a small
/// image: split into the regions that meet the same taps, its corners 2 x
/// 2 taps 4 apart without padding), a 1-D one, and a strided depthwise one dilated along its rows
/// over 112 x 112, whose phases' copy, past the L1, is filled a few rows
/// ahead of the output rows that read them.
pub const DILATED_CONVOLUTION_PROGRAMS: &str = "fn dw5(x: f32[1, 16, 14, 14], w: f32[16, 1, 5, 5]) -> f32[1, 16, 14, 14] { return relu(conv2d(x, w, padding=4, dilation=2, groups=16)); }
fn dws2(x: f32[1, 8, 15, 17], w: f32[8, 1, 3, 3]) -> f32[1, 8, 8, 9] { return conv2d(x, w, stride=2, padding=[1, 2], dilation=[1, 2], groups=8); }
fn dense(x: f32[1, 16, 16, 16], w: f32[16, 16, 3, 3], b: f32[16, 1, 1]) -> f32[1, 16, 16, 16] { return relu(conv2d(x, w, padding=2, dilation=2) + b); }
fn grp(x: f32[1, 8, 12, 12], w: f32[8, 4, 3, 3]) -> f32[1, 8, 12, 10] { return conv2d(x, w, padding=[2, 1], dilation=2, groups=2); }
fn wide(x: f32[1, 4, 6, 6], w: f32[4, 4, 3, 3]) -> f32[1, 4, 6, 6] { return conv2d(x, w, padding=4, dilation=4); }
fn c1(x: f32[2, 4, 20], w: f32[4, 4, 3]) -> f32[2, 4, 16] { return conv1d(x, w, dilation=2); }
fn roll(x: f32[1, 2, 112, 112], w: f32[2, 1, 5, 5]) -> f32[1, 2, 56, 56] { return conv2d(x, w, stride=2, padding=[4, 2], dilation=[2, 1], groups=2); }";

/// Video convolutions (R3D's): a 3 x 3 x 3 one over 4 frames with a bias
/// and ReLU, one strided in time and space, a grouped one dilated in
/// time, and one over a single frame whose outer temporal taps read only
/// padding.
pub const VIDEO_CONVOLUTION_PROGRAMS: &str = "fn c3(x: f32[1, 8, 4, 10, 10], w: f32[8, 8, 3, 3, 3], b: f32[1, 8, 1, 1, 1]) -> f32[1, 8, 4, 10, 10] { return relu(conv3d(x, w, padding=1) + b); }
fn strided(x: f32[1, 4, 5, 9, 9], w: f32[8, 4, 3, 3, 3]) -> f32[1, 8, 3, 5, 5] { return conv3d(x, w, stride=2, padding=1); }
fn grp(x: f32[2, 8, 4, 6, 6], w: f32[8, 4, 2, 3, 3]) -> f32[2, 8, 4, 6, 6] { return conv3d(x, w, padding=1, dilation=[2, 1, 1], groups=2); }
fn one(x: f32[1, 16, 1, 7, 7], w: f32[16, 16, 3, 3, 3]) -> f32[1, 16, 1, 7, 7] { return conv3d(x, w, padding=1); }";

/// A row by a matrix of weights stored `[K, N]`, deeper than a tile is
/// wide, whose columns a CPU takes in chunks of 40 (AVX2) or 125 (AVX-512):
/// each chunk one tile, read from a copy of the matrix chunk by chunk.
pub const ROW_BY_MATRIX_IN_CHUNKS: &str = "fn f(x: f32[1, 96], weight w: f32[96, 1000], weight b: f32[1000]) -> f32[1, 1000] { return relu(x @ w + b); }";

/// Products of one slice of the depth, one a line: 1 x 1 convolutions of 16
/// and 32 input channels to 42 over 40 x 38 pixels, and a 60 x 12 by 12 x
/// 1000 product (its last panel ragged). The shallow two walk each strip
/// across their panels on a CPU, the deep one each panel across its strips.
pub const SHALLOW_PRODUCT_PROGRAMS: &str = "fn c16(x: f32[1, 16, 40, 38], w: f32[42, 16, 1, 1]) -> f32[1, 42, 40, 38] { return clamp(conv2d(x, w), 0.0, 6.0); }
fn mm12(x: f32[60, 12], y: f32[12, 1000]) -> f32[60, 1000] { return tanh(x @ y); }
fn c32(x: f32[1, 32, 40, 38], w: f32[42, 32, 1, 1]) -> f32[1, 42, 40, 38] { return relu(conv2d(x, w)); }";

/// Products whose epilogue reads an operand along both their rows and
/// their columns, one a line: 1 x 1 convolutions of 64 and of 136 input
/// channels to 24 over 16 x 40 pixels with a residual and relu, and a 24 x
/// 96 by 96 x 640 product subtracted from a matrix (a weight's update). On
/// a CPU the two of at most `Packing::heavy_outer_depth` (128) walk each
/// strip across their panels and run the epilogue on each register tile;
/// the 136-deep one writes its block of sums and runs the epilogue on it
/// row by row.
pub const RESIDUAL_PRODUCT_PROGRAMS: &str = "fn r64(x: f32[1, 64, 16, 40], w: f32[24, 64, 1, 1], r: f32[1, 24, 16, 40]) -> f32[1, 24, 16, 40] { return relu(conv2d(x, w) + r); }
fn r136(x: f32[1, 136, 16, 40], w: f32[24, 136, 1, 1], r: f32[1, 24, 16, 40]) -> f32[1, 24, 16, 40] { return relu(conv2d(x, w) + r); }
fn upd(x: f32[24, 96], y: f32[96, 640], r: f32[24, 640]) -> f32[24, 640] { return r - 0.5 * (x @ y); }";

/// 1 x 1 convolutions whose input is larger than the L2 of an AVX2 target
/// (512 KB) and at most an AVX-512 one's (2 MB): 40 channels over 58 x 58
/// pixels (538 KB, its last panel ragged), panel by panel, and a shallow 16
/// channels over 95 x 95 (578 KB), which copies its chunk's panels before
/// walking its strips (its rows are not whole lines apart, so its 8 rows do
/// not read them in place: `Packing::in_place_rows`). On AVX2 each copy of a panel's slice prefetches the
/// next panel's (`packed.rs`'s `prefetches_panels`).
pub const PREFETCHED_PRODUCT_PROGRAMS: &str = "fn p40(x: f32[1, 40, 58, 58], w: f32[6, 40, 1, 1]) -> f32[1, 6, 58, 58] { return conv2d(x, w); }
fn p16(x: f32[1, 16, 95, 95], w: f32[8, 16, 1, 1]) -> f32[1, 8, 95, 95] { return clamp(conv2d(x, w), 0.0, 6.0); }";

/// Depthwise convolutions strided along their columns, which a CPU runs
/// reading each channel through a padded copy split into the stride's
/// phases: 5 x 5 at stride 2 with hardswish and with a deferred SiLU, 3 x 3
/// over an odd width in a batch of two, and a 3 x 4 window three columns
/// apart and one row, unpadded.
pub const STRIDED_DEPTHWISE_PROGRAMS: &str = "fn s5(x: f32[1, 8, 28, 28], w: f32[8, 1, 5, 5]) -> f32[1, 8, 14, 14] { return hardswish(conv2d(x, w, stride=2, padding=2, groups=8)); }
fn silu5(x: f32[1, 8, 14, 14], w: f32[8, 1, 5, 5]) -> f32[1, 8, 7, 7] { let h = conv2d(x, w, stride=2, padding=2, groups=8); return h * sigmoid(h); }
fn odd(x: f32[2, 6, 15, 15], w: f32[6, 1, 3, 3]) -> f32[2, 6, 8, 8] { return clamp(conv2d(x, w, stride=2, padding=1, groups=6), 0.0, 6.0); }
fn cols(x: f32[1, 4, 9, 20], w: f32[4, 1, 3, 4]) -> f32[1, 4, 7, 6] { return conv2d(x, w, stride=[1, 3], groups=4); }
fn wide(x: f32[2, 2, 128, 127], w: f32[2, 1, 3, 3]) -> f32[2, 2, 64, 64] { return conv2d(x, w, stride=2, padding=1, groups=2); }";

/// Direct convolutions and pooling (a max pool runs as two passes: a
/// window of rows, padded, strided, with an epilogue, and unpadded in a
/// function that also returns the pooled input).
pub const POOLING_PROGRAMS: &[&str] = &[
    "fn f(x: f32[2, 4, 6, 5], w: f32[6, 2, 3, 2]) -> f32[2, 6, 3, 6] { return relu(conv2d(x, w, stride=[2, 1], padding=[1, 1], groups=2)); }",
    "fn f(x: f32[1, 2, 7, 6]) -> (f32[1, 2, 4, 3], f32[1, 2, 4, 3]) { return (maxpool2d(x, kernel=3, stride=2, padding=1), avgpool2d(x, kernel=3, stride=2, padding=1)); }",
    "fn f(x: f32[2, 3, 9, 11]) -> f32[2, 3, 9, 6] { return relu(maxpool2d(x - 0.5, kernel=[3, 2], stride=[1, 2], padding=[1, 1])); }",
    "fn f(x: f32[1, 2, 8, 9]) -> (f32[1, 2, 4, 4], f32[1, 2, 8, 9]) { return (maxpool2d(x, kernel=2, stride=2), x); }",
];

/// Results that are parameters, views or repeated.
pub const RESULT_PROGRAMS: &[&str] = &[
    "fn f(x: f32[2, 3]) -> (f32[2, 3], f32[2, 3], f32[6], f32[2, 3]) { let y = exp(x); return (x, y, reshape(y, [6]), y); }",
];

/// W2, W4, W5, W6 and W7 at small sizes, written as the examples are.
pub const WORKLOAD_PROGRAMS: &[&str] = &[
    "fn mlp(x: f32[4, 8], w1: f32[8, 16], b1: f32[16], w2: f32[16, 8], b2: f32[8]) -> f32[4, 8] { return relu(x @ w1 + b1) @ w2 + b2; }",
    "fn attention(q: f32[2, 6, 4], k: f32[2, 6, 4], v: f32[2, 6, 4]) -> f32[2, 6, 4] { return softmax(q @ transpose(k, [0, 2, 1]) / sqrt(4.0), axis=-1) @ v; }",
    "fn layernorm_gelu(x: f32[5, 8], g: f32[8], b: f32[8]) -> f32[5, 8] { return gelu(layernorm(x) * g + b); }",
    "
fn heads[S](x: f32[S, 8]) -> f32[2, S, 4] { return transpose(reshape(x, [S, 2, 4]), [1, 0, 2]); }
fn bert(x: f32[6, 8], wq: f32[8, 8], wk: f32[8, 8], wv: f32[8, 8], wo: f32[8, 8], w1: f32[8, 16], w2: f32[16, 8], g: f32[8], b: f32[8]) -> f32[6, 8] {
    let p = softmax(heads(x @ wq) @ transpose(heads(x @ wk), [0, 2, 1]) / 2.0, axis=-1);
    let ctx = reshape(transpose(p @ heads(x @ wv), [1, 0, 2]), [6, 8]);
    let h1 = layernorm(ctx @ wo + x) * g + b;
    return layernorm(gelu(h1 @ w1) @ w2 + h1) * g + b;
}",
    "
fn cell[B, I, H](x: f32[B, I], h: f32[B, H], w_ih: f32[3 * H, I], w_hh: f32[3 * H, H], b_ih: f32[3 * H], b_hh: f32[3 * H]) -> f32[B, H] {
    let gi = x @ transpose(w_ih) + b_ih;
    let gh = h @ transpose(w_hh) + b_hh;
    let r = sigmoid(slice(gi, axis=1, start=0, end=H) + slice(gh, axis=1, start=0, end=H));
    let z = sigmoid(slice(gi, axis=1, start=H, end=2 * H) + slice(gh, axis=1, start=H, end=2 * H));
    let n = tanh(slice(gi, axis=1, start=2 * H, end=3 * H) + r * slice(gh, axis=1, start=2 * H, end=3 * H));
    return (1.0 - z) * n + z * h;
}
fn gru(x: f32[2, 3, 4], w_ih: f32[15, 4], w_hh: f32[15, 5], b_ih: f32[15], b_hh: f32[15]) -> f32[3, 5] {
    let h0 = zeros([3, 5]);
    let h1 = cell(reshape(slice(x, axis=0, start=0, end=1), [3, 4]), h0, w_ih, w_hh, b_ih, b_hh);
    return cell(reshape(slice(x, axis=0, start=1, end=2), [3, 4]), h1, w_ih, w_hh, b_ih, b_hh);
}",
];

/// User-defined operators in index notation.
pub const USER_OPERATOR_PROGRAM: &str = "
op matmul_t[M, N, K](a: f32[M, K], b: f32[N, K]) -> f32[M, N] {
    out[i, j] = sum[k](a[i, k] * b[j, k]);
}
op row_softmax[M, N](x: f32[M, N]) -> f32[M, N] {
    let m[i] = max[j](x[i, j]);
    let e[i, j] = exp(x[i, j] - m[i]);
    let s[i] = sum[j](e[i, j]);
    out[i, j] = e[i, j] / s[i];
}
op conv3x3[N, C, H, W, O](img: f32[N, C, H, W], w: f32[O, C, 3, 3]) -> f32[N, O, H, W] {
    out[n, o, y, x] = sum[c, ky, kx](img[n, c, y + ky - 1, x + kx - 1] * w[o, c, ky, kx]);
}
op misc[N](x: f32[N], k: i32[N]) -> f32[N] {
    let c = 0.5;
    out[i] = where(x[i] > 0.0, x[i + 1] * c, cast(k[i], f32)) + prod[j in 0..2](x[j] + 2.0) + min[j in -1..1](x[i + j]);
}
fn f(a: f32[3, 4], b: f32[2, 4], img: f32[1, 2, 4, 4], w: f32[3, 2, 3, 3], x: f32[5], k: i32[5])
    -> (f32[3, 2], f32[3, 4], f32[1, 3, 4, 4], f32[5]) {
    return (relu(matmul_t(a, b)) + 1.0, row_softmax(a), conv3x3(img, w), misc(x, k));
}
";

/// User operators that are contractions (`E(sum[k](a[..] * b[..]))`), which
/// lower to the structured `loop.matmul` whatever their operands' layout:
/// transposed operands (a weight gradient's `Aᵀ·G`, an input gradient's
/// `G·Bᵀ`), two batch indices and a broadcast one, an epilogue reading
/// another operand, a local computed in its reader's epilogue (`h` read
/// twice at its own index) and one stored (read at another index), a
/// transposed result, a strided read over an offset range, f16 and i32
/// (and f16 and bf16 products large enough to be packed, one with both
/// operands transposed), a
/// sum over two indices spanning whole consecutive axes (read as one);
/// operands gathered into copies (a read past an operand's edge, two
/// reduction indices in different orders in the two operands, a 3x3
/// convolution's input and weight gradients with padding, a strided and
/// dilated window, small and large enough to be packed: a window the
/// product's programs read their panels through); prologues on operands (`relu(a[i, k] - mu[i])`,
/// `exp(..)`, an f16 operand cast to f32), computed in the copy; and a sum of
/// a sum, not a product, which keeps its scalar loops.
pub const CONTRACTION_PROGRAMS: &[&str] = &[
    "op at_g[K, M, N](a: f32[K, M], g: f32[K, N]) -> f32[M, N] { out[i, j] = sum[k](a[k, i] * g[k, j]); }
fn f(a: f32[37, 40], g: f32[37, 45]) -> f32[40, 45] { return at_g(a, g); }",
    "op g_bt[M, N, K](g: f32[M, K], b: f32[N, K], c: f32[N]) -> f32[M, N] { out[i, j] = tanh(sum[k](g[i, k] * b[j, k]) * 0.5 + c[j]); }
fn f(g: f32[33, 70], b: f32[41, 70], c: f32[41]) -> f32[33, 41] { return relu(g_bt(g, b, c)) + 1.0; }",
    "op scores[B, H, I, J, D](q: f32[B, H, I, D], k: f32[B, H, J, D]) -> f32[B, H, I, J] { out[b, h, i, j] = sum[d](q[b, h, i, d] * k[b, h, j, d]) / 4.0; }
fn f(q: f32[2, 3, 40, 32], k: f32[2, 3, 44, 32]) -> f32[2, 3, 40, 44] { return scores(q, k); }",
    "op shared[B, M, K, N](x: f32[B, M, K], w: f32[K, N]) -> f32[B, M, N] { out[b, i, j] = sum[k](x[b, i, k] * w[k, j]); }
fn f(x: f32[3, 200, 40], w: f32[40, 36]) -> f32[3, 200, 36] { return shared(x, w); }",
    "op dense_gate[M, K, N](x: f32[M, K], w: f32[K, N], b: f32[N]) -> f32[M, N] {
    let h[i, j] = sum[k](x[i, k] * w[k, j]) + b[j];
    out[i, j] = h[i, j] * sigmoid(h[i, j]);
}
fn f(x: f32[30, 40], w: f32[40, 50], b: f32[50]) -> f32[30, 50] { return dense_gate(x, w, b); }",
    "op sym[N, K](a: f32[N, K], b: f32[K, N]) -> f32[N, N] {
    let h[i, j] = sum[k](a[i, k] * b[k, j]);
    out[i, j] = h[i, j] + h[j, i];
}
fn f(a: f32[24, 30], b: f32[30, 24]) -> f32[24, 24] { return sym(a, b); }",
    "op mm_t[M, K, N](a: f32[M, K], b: f32[K, N]) -> f32[N, M] { out[j, i] = sum[k](a[i, k] * b[k, j]); }
fn f(a: f32[20, 30], b: f32[30, 36]) -> f32[36, 20] { return mm_t(a, b); }",
    "op strided[M, N](a: f32[M, 18], b: f32[8, N]) -> f32[M, N] { out[i, j] = sum[k in 1..9](a[i, 2 * k] * b[k - 1, j]); }
fn f(a: f32[20, 18], b: f32[8, 24]) -> f32[20, 24] { return strided(a, b); }",
    "op hgemm[M, K, N](a: f16[M, K], b: f16[K, N]) -> f16[M, N] { out[i, j] = sum[k](a[i, k] * b[k, j]); }
fn f(a: f16[30, 40], b: f16[40, 24]) -> f16[30, 24] { return hgemm(a, b); }",
    "op imm[M, K, N](a: i32[M, K], b: i32[K, N]) -> i32[M, N] { out[i, j] = sum[k](a[i, k] * b[k, j]); }
fn f(a: i32[6, 7], b: i32[7, 5]) -> i32[6, 5] { return imm(a, b); }",
    "op shifted[M, K, N](a: f32[M, K], b: f32[K, N]) -> f32[M, N] { out[i, j] = sum[k](a[i, k + 1] * b[k, j]); }
fn f(a: f32[20, 30], b: f32[30, 24]) -> f32[20, 24] { return shifted(a, b); }",
    "op two[M, K, L, N](a: f32[M, K, L], b: f32[K, L, N]) -> f32[M, N] { out[i, j] = sum[k, l](a[i, k, l] * b[k, l, j]); }
fn f(a: f32[6, 5, 4], b: f32[5, 4, 7]) -> f32[6, 7] { return two(a, b); }",
    "op crossed[M, K, L, N](a: f32[M, L, K], b: f32[K, L, N]) -> f32[M, N] { out[i, j] = sum[k, l](a[i, l, k] * b[k, l, j]); }
fn f(a: f32[6, 4, 5], b: f32[5, 4, 7]) -> f32[6, 7] { return crossed(a, b); }",
    "op conv_dx[N, O, H, W, C](g: f32[N, O, H, W], w: f32[O, C, 3, 3]) -> f32[N, C, H, W] { out[n, c, y, x] = sum[o, ky, kx](g[n, o, y - ky + 1, x - kx + 1] * w[o, c, ky, kx]); }
fn f(g: f32[2, 8, 6, 7], w: f32[8, 5, 3, 3]) -> f32[2, 5, 6, 7] { return conv_dx(g, w); }",
    "op conv_dw[N, C, H, W, O](x: f32[N, C, H, W], g: f32[N, O, H, W]) -> f32[O, C, 3, 3] { out[o, c, ky, kx] = sum[n, y, xx](g[n, o, y, xx] * x[n, c, y + ky - 1, xx + kx - 1]); }
fn f(x: f32[2, 5, 6, 7], g: f32[2, 8, 6, 7]) -> f32[8, 5, 3, 3] { return conv_dw(x, g); }",
    "op window[N, C, O](x: f32[N, C, 20, 20], w: f32[O, C, 3, 3]) -> f32[N, O, 8, 8] { out[n, o, y, xx] = relu(sum[c, ky, kx](x[n, c, 2 * y + 2 * ky, 2 * xx + 2 * kx - 1] * w[o, c, ky, kx])); }
fn f(x: f32[2, 3, 20, 20], w: f32[4, 3, 3, 3]) -> f32[2, 4, 8, 8] { return window(x, w); }",
    "op sumsum[M, K, N](a: f32[M, K], b: f32[K, N]) -> f32[M, N] { out[i, j] = sum[k](a[i, k] + b[k, j]); }
fn f(a: f32[6, 5], b: f32[5, 7]) -> f32[6, 7] { return sumsum(a, b); }",
    "op pro[M, K, N](a: f32[M, K], mu: f32[M], b: f32[K, N]) -> f32[M, N] { out[i, j] = sum[k](relu(a[i, k] - mu[i]) * exp(b[k, j] * 0.1)); }
fn f(a: f32[30, 40], mu: f32[30], b: f32[40, 36]) -> f32[30, 36] { return pro(a, mu, b); }",
    "op mixed[M, K, N](a: f16[M, K], b: f32[K, N]) -> f32[M, N] { out[i, j] = sum[k](cast(a[i, k], f32) * b[k, j]); }
fn f(a: f16[20, 24], b: f32[24, 18]) -> f32[20, 18] { return mixed(a, b); }",
    "op bgemm_t[K, M, N](a: bf16[K, M], b: bf16[N, K], c: bf16[N]) -> bf16[M, N] { out[i, j] = relu(sum[k](a[k, i] * b[j, k]) + c[j]); }
fn f(a: bf16[40, 30], b: bf16[36, 40], c: bf16[36]) -> bf16[30, 36] { return bgemm_t(a, b, c); }",
    "op dilated[N, C, O](x: f32[N, C, 40, 40], w: f32[O, C, 3, 3]) -> f32[N, O, 19, 40] { out[n, o, y, xx] = sum[c, ky, kx](x[n, c, 2 * y + 2 * ky - 1, xx + 2 * kx - 2] * w[o, c, ky, kx]); }
fn f(x: f32[2, 8, 40, 40], w: f32[16, 8, 3, 3]) -> f32[2, 16, 19, 40] { return dilated(x, w); }",
    // Short reductions for each output column (not contractions: no
    // product of two operands reads every index): a depthwise convolution
    // and a max pool, 70 columns (ragged in tiles of 32 and 64).
    "op depthwise[N, C, H, W](x: f32[N, C, H, W], w: f32[C, 3, 3]) -> f32[N, C, H, W] { out[n, c, y, xx] = sum[ky, kx](x[n, c, y + ky - 1, xx + kx - 1] * w[c, ky, kx]); }
op pool[N, C, H, W](x: f32[N, C, H, W]) -> f32[N, C, H, W] { out[n, c, y, xx] = max[ky in 0..3, kx in 0..3](x[n, c, y + ky - 1, xx + kx - 1]); }
fn f(x: f32[2, 3, 9, 70], w: f32[3, 3, 3]) -> (f32[2, 3, 9, 70], f32[2, 3, 9, 70]) { return (depthwise(x, w), pool(x)); }",
    // A 1x1 convolution, whose columns are an image's pixels read in place
    // (`y, xx`: whole consecutive axes of `x`), and one whose result
    // transposes them (so its columns are `y` alone).
    "op conv1x1[N, C, H, W, O](x: f32[N, C, H, W], w: f32[O, C]) -> f32[N, O, H, W] { out[n, o, y, xx] = sum[c](w[o, c] * x[n, c, y, xx]); }
op pix_t[N, C, H, W, O](x: f32[N, C, H, W], w: f32[O, C]) -> f32[N, O, W, H] { out[n, o, xx, y] = sum[c](w[o, c] * x[n, c, y, xx]); }
fn f(x: f32[2, 6, 5, 7], w: f32[9, 6]) -> (f32[2, 9, 5, 7], f32[2, 9, 7, 5]) { return (conv1x1(x, w), pix_t(x, w)); }",
    // A weight gradient feeding its SGD update, as in a training step: the
    // update in its epilogue would leave it 3 columns (`kx`); its columns
    // stay `c, ky, kx` merged and the update runs after it.
    "op conv_dw[N, C, H, W, O](x: f32[N, C, H, W], g: f32[N, O, H, W]) -> f32[O, C, 3, 3] { out[o, c, ky, kx] = sum[n, y, xx](g[n, o, y, xx] * x[n, c, y + ky - 1, xx + kx - 1]); }
fn f(x: f32[2, 5, 6, 7], g: f32[2, 8, 6, 7], w: f32[8, 5, 3, 3]) -> f32[8, 5, 3, 3] { return w - 0.01 * conv_dw(x, g); }",
    // A sum of four factors of which two alone read `g` (an edge-gated
    // aggregation's gradient): they are contracted first, into a local.
    "op gated_grad[N, M, G](d: f32[N, G], h: f32[M, G], a: f32[N, M], s: f32[N], t: f32[M]) -> f32[N] { out[i] = sum[j, g](d[i, g] * h[j, g] * a[i, j] * sigmoid(s[i] + t[j])); }
fn f(d: f32[30, 20], h: f32[40, 20], a: f32[30, 40], s: f32[30], t: f32[40]) -> f32[30] { return gated_grad(d, h, a, s, t); }",
    // The same aggregation's gradients with respect to its column scores
    // and its features: the local is laid out as `a` is read (`t[i, j]`)
    // and the sum down its columns is blocked along `j` (70: ragged in
    // tiles of 64); the features' gradient copies its prologue `a[i, j] *
    // sigmoid(..)` along `a`'s rows, read transposed by the product.
    "op gated_cols[N, M, G](d: f32[N, G], h: f32[M, G], a: f32[N, M], s: f32[N], t: f32[M]) -> f32[M] { out[j] = sum[i, g](d[i, g] * h[j, g] * a[i, j] * sigmoid(s[i] + t[j])); }
op gated_dh[N, M, G](d: f32[N, G], a: f32[N, M], s: f32[N], t: f32[M]) -> f32[M, G] { out[j, g] = sum[i](d[i, g] * (a[i, j] * sigmoid(s[i] + t[j]))); }
fn f(d: f32[30, 20], h: f32[70, 20], a: f32[30, 70], s: f32[30], t: f32[70]) -> (f32[70], f32[70, 20]) { return (gated_cols(d, h, a, s, t), gated_dh(d, a, s, t)); }",
    // The aggregation and its features' gradient: both multiply by the
    // same gate, computed once by an operator of its own that both
    // products read (the gradient's transposed).
    "op gated_agg[N, M, G](a: f32[N, M], s: f32[N], t: f32[M], h: f32[M, G]) -> f32[N, G] { out[i, g] = sum[j](a[i, j] * sigmoid(s[i] + t[j]) * h[j, g]); }
op gated_dh[N, M, G](d: f32[N, G], a: f32[N, M], s: f32[N], t: f32[M]) -> f32[M, G] { out[j, g] = sum[i](d[i, g] * (a[i, j] * sigmoid(s[i] + t[j]))); }
fn f(a: f32[30, 70], s: f32[30], t: f32[70], h: f32[70, 20], d: f32[30, 20]) -> (f32[30, 20], f32[70, 20]) { return (gated_agg(a, s, t, h), gated_dh(d, a, s, t)); }",
];

/// Convolutions that run as Winograd's F(4x4, 3x3) on a CPU (3 x 3, stride
/// 1, at least 2 x 2 output tiles at least half filled, at least 16
/// channels in and out): zero, one and two of padding, 16 output channels
/// (narrow products, three kernels) and 24 and 32 (packed, one kernel on a
/// CPU), a channel count that is not a multiple of the vector (24), a batch
/// of two, an epilogue (bias, batchnorm, residual, relu), declared weights
/// (a ResNet basic block), and ragged tiles (the last ones overhanging the
/// result: 30 columns; 11 x 11 in a batch of two, by one row and column as
/// in ResNet's last stage, whose 7 x 7 images are Winograd's only on
/// targets whose memory keeps up: `dlc_graph::ops::winograd_pays`).
pub const WINOGRAD_PROGRAMS: &[&str] = &[
    "fn f(x: f32[1, 16, 32, 32], w: f32[16, 16, 3, 3]) -> f32[1, 16, 32, 32] { return conv2d(x, w, padding=1); }",
    "fn f(x: f32[1, 16, 34, 30], w: f32[24, 16, 3, 3], b: f32[24, 1, 1]) -> f32[1, 24, 32, 28] { return relu(conv2d(x, w) + b); }",
    "fn f(x: f32[1, 16, 30, 30], w: f32[16, 16, 3, 3]) -> f32[1, 16, 32, 32] { return conv2d(x, w, padding=2); }",
    "fn f(x: f32[2, 32, 8, 16], weight w1: f32[32, 32, 3, 3], weight m1: f32[32], weight v1: f32[32], weight g1: f32[32], weight b1: f32[32], weight w2: f32[32, 32, 3, 3]) -> f32[2, 32, 8, 16] { let h = relu(batchnorm(conv2d(x, w1, padding=1), m1, v1, g1, b1, eps=1e-5)); return relu(conv2d(h, w2, padding=1) + x); }",
    "fn f(x: f32[1, 32, 32, 30], w: f32[32, 32, 3, 3]) -> f32[1, 32, 32, 30] { return conv2d(x, w, padding=1); }",
    "fn f(x: f32[2, 48, 11, 11], weight w: f32[48, 48, 3, 3], b: f32[48, 1, 1], r: f32[2, 48, 11, 11]) -> f32[2, 48, 11, 11] { return relu(conv2d(x, w, padding=1) + b + r); }",
];

/// W2's MLP (`relu(x @ w1 + b1) @ w2 + b2`) made a training step: the mean
/// squared error against a target `y` and one plain SGD update at 0.01 of
/// each weight, returning the loss and the new weights. `w2_step` computes
/// in f32, `w2_step_bf16` its products in bf16 from the f32 weights
/// (`autocast=bf16`). W2's own sizes are 128, 1024, 4096, 1024.
pub fn w2_training_step(batch: usize, d_in: usize, hidden: usize, d_out: usize) -> String {
    let params = format!(
        "x: f32[{batch}, {d_in}], y: f32[{batch}, {d_out}], w1: f32[{d_in}, {hidden}], b1: f32[{hidden}], w2: f32[{hidden}, {d_out}], b2: f32[{d_out}]"
    );
    let results = format!(
        "(f32, f32[{d_in}, {hidden}], f32[{hidden}], f32[{hidden}, {d_out}], f32[{d_out}])"
    );
    let step = |name: &str, options: &str| {
        format!(
            "fn {name}({params}) -> {results} {{
    let (l, g1, gb1, g2, gb2) = value_and_grad(w2_loss(x, y, w1, b1, w2, b2), wrt=[w1, b1, w2, b2]{options});
    return (l, sgd(w1, g1, 0.01), sgd(b1, gb1, 0.01), sgd(w2, g2, 0.01), sgd(b2, gb2, 0.01));
}}
"
        )
    };
    format!(
        "fn w2_loss({params}) -> f32 {{
    return mse_loss(relu(x @ w1 + b1) @ w2 + b2, y);
}}

{}
{}",
        step("w2_step", ""),
        step("w2_step_bf16", ", autocast=bf16")
    )
}

/// W3's block in training mode, small: a convolution, batch statistics and
/// a relu, twice, with a residual; the mean square as the loss, and `step`,
/// one SGD step of every weight. Its batch normalizations' normalized
/// inputs are what `graph.remat` computes again in the backward pass.
pub const BATCHNORM_TRAINING_STEP: &str = "
fn block(x: f32[4, 16, 12, 12], w1: f32[16, 16, 3, 3], g1: f32[16], b1: f32[16],
         w2: f32[16, 16, 3, 3], g2: f32[16], b2: f32[16]) -> f32 {
    let stat = zeros([16]);
    let (h0, m1, v1) = batchnorm_train(conv2d(x, w1, padding=1), g1, b1, stat, stat);
    let (y, m2, v2) = batchnorm_train(conv2d(relu(h0), w2, padding=1), g2, b2, stat, stat);
    return mean(relu(y + x) * relu(y + x));
}
fn step(x: f32[4, 16, 12, 12], w1: f32[16, 16, 3, 3], g1: f32[16], b1: f32[16],
        w2: f32[16, 16, 3, 3], g2: f32[16], b2: f32[16])
        -> (f32, f32[16, 16, 3, 3], f32[16], f32[16], f32[16, 16, 3, 3], f32[16], f32[16]) {
    let (l, d1, dg1, db1, d2, dg2, db2) =
        value_and_grad(block(x, w1, g1, b1, w2, g2, b2), wrt=[w1, g1, b1, w2, g2, b2]);
    return (l, sgd(w1, d1, 0.1), sgd(g1, dg1, 0.1), sgd(b1, db1, 0.1),
            sgd(w2, d2, 0.1), sgd(g2, dg2, 0.1), sgd(b2, db2, 0.1));
}
";

/// f16 and bf16 products that run on a GPU's tensor cores (`mma.sync` in
/// whole 16 x 8 x 16 steps): ragged blocks, a batch with an epilogue, and
/// attention scores under a softmax.
pub const TENSOR_CORE_PROGRAMS: &[&str] = &[
    "fn f(x: f16[70, 48], w: f16[48, 90]) -> f16[70, 90] { return x @ w; }",
    "fn f(x: bf16[2, 40, 64], w: bf16[2, 64, 72], b: bf16[72]) -> bf16[2, 40, 72] { return relu(x @ w + b); }",
    "fn f(q: f16[3, 20, 32], k: f16[3, 37, 32]) -> f16[3, 20, 37] { return softmax(q @ transpose(k, [0, 2, 1]), axis=-1); }",
];

/// Every differential program of the groups above.
pub fn differential_programs() -> Vec<&'static str> {
    let mut all: Vec<&'static str> = Vec::new();
    for group in [
        ELEMENT_WISE_PROGRAMS,
        SHAPE_PROGRAMS,
        GATHER_PROGRAMS,
        REDUCTION_PROGRAMS,
        PRODUCT_PROGRAMS,
        POOLING_PROGRAMS,
        RESULT_PROGRAMS,
        WORKLOAD_PROGRAMS,
    ] {
        all.extend_from_slice(group);
    }
    all.push(USER_OPERATOR_PROGRAM);
    all.extend_from_slice(CONTRACTION_PROGRAMS);
    all
}

/// Tile IR whose `tile.slice`s cut 2 x 20 tiles out of a 4 x 40 one: at
/// constant offsets (in a loop a CPU writes out; each result vector from
/// one or two operand vectors, aligned or not, the last one short) and at
/// offsets known only at run time (a loop of 12 trips stays a loop), with
/// an offset along the leading axis too.
pub const SLICES_TILE_PROGRAM: &str =
    "tile.func @f(%x: buffer<f32[4, 40]>, out %y: buffer<f32[2, 20]>) {
  tile.kernel {grid = [1], schedule = \"rows\", vector = [16]} {
    %t = tile.load %x[#0, #1] : tile<4x40xf32>
    %z = tile.const {value = 0.0} : tile<2x20xf32>
    %s:1 = tile.for %z {lo = 0, hi = 4, step = 1} (%k, %acc) {
      %b = tile.slice %t[1, 5*%k + 1] : tile<2x20xf32>
      %c = tile.add %acc, %b : tile<2x20xf32>
      tile.yield %c
    } : tile<2x20xf32>
    %u:1 = tile.for %s#0 {lo = 0, hi = 12, step = 1} (%j, %acc2) {
      %d = tile.slice %t[2, %j + 5] : tile<2x20xf32>
      %m = tile.add %acc2, %d : tile<2x20xf32>
      tile.yield %m
    } : tile<2x20xf32>
    tile.store %u#0, %y[#0, #1]
  }
  tile.return
}";

/// [`SLICES_TILE_PROGRAM`] parsed, its input (small integers: every path
/// sums exactly) and the output the tile interpreter computes, which is not
/// all zeros.
pub fn slices_case() -> (dlc_tile::Module, HostTensor, Vec<f64>) {
    use dlc_tile::interp::{Buffer, run_function};
    use dlc_tile::{BufferType, Space};
    let m = dlc_tile::parse_module(SLICES_TILE_PROGRAM).unwrap_or_else(|e| panic!("{e}"));
    let x: Vec<f64> = (0..160).map(|i| f64::from((i * 7) % 5 - 2)).collect();
    let buffer = |shape: Vec<usize>, data: Vec<f64>| Buffer {
        ty: BufferType::contiguous(dlc_core::DType::F32, shape, Space::Global),
        data,
    };
    let mut args = [
        buffer(vec![4, 40], x.clone()),
        buffer(vec![2, 20], vec![0.0; 40]),
    ];
    run_function(&m, "f", &mut args).unwrap_or_else(|e| panic!("{e}"));
    let want = args[1].data.clone();
    assert!(want.iter().any(|&v| v != 0.0), "a check that can fail");
    let ty = dlc_core::TensorType::new(dlc_core::DType::F32, vec![4, 40]);
    let x = HostTensor::new(ty, x).unwrap_or_else(|e| panic!("{e}"));
    (m, x, want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_blocks_keep_only_definitions() {
        let md = "text\n```\nfn f() -> f32 {\n}\n```\n```\nerror: x\n```\n";
        assert_eq!(code_blocks(md), vec!["fn f() -> f32 {\n}\n".to_string()]);
    }
}
