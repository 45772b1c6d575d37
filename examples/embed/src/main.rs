//! Calls four dlc models that `build.rs` compiled (with `dlc-build`) and
//! this program links statically: no compiler at run time.
//!
//! `dlc-embed-example [--save DIR]` prints a summary of each result; with
//! `--save`, it also writes each model's inputs and results as `.npy` files
//! under `DIR/ENTRY/` (inputs by parameter name, results as `out0.npy`),
//! which the project's test checks against the reference interpreter.

use std::path::Path;

use ndarray::{Array, ArrayBase, ArrayD, Data, Dimension, IxDyn};

mod mlp {
    include!(concat!(env!("OUT_DIR"), "/w2_mlp.rs"));
}
mod layernorm_gelu {
    include!(concat!(env!("OUT_DIR"), "/w5_layernorm_gelu.rs"));
}
mod ratio {
    include!(concat!(env!("OUT_DIR"), "/ratio.rs"));
}
mod kinds {
    include!(concat!(env!("OUT_DIR"), "/kinds.rs"));
}

/// Deterministic inputs in `[-scale, scale)`: a multiplicative hash of the
/// element's index, different for each `seed`.
fn input(shape: &[usize], seed: u64, scale: f32) -> ArrayD<f32> {
    let mut i = 0u64;
    Array::from_shape_simple_fn(IxDyn(shape), || {
        i += 1;
        let h = (i.wrapping_add(seed << 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
        (h as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    })
}

/// Writes `a` as `DIR/NAME.npy`, its elements in row-major order (a
/// transposed view is written as it reads, not as it is stored).
fn save<S: Data<Elem = f32>, D: Dimension>(
    dir: &Path,
    name: &str,
    a: &ArrayBase<S, D>,
) -> std::io::Result<()> {
    use npyz::WriterBuilder;
    std::fs::create_dir_all(dir)?;
    let file = std::io::BufWriter::new(std::fs::File::create(dir.join(format!("{name}.npy")))?);
    let shape: Vec<u64> = a.shape().iter().map(|&d| d as u64).collect();
    let mut w = npyz::WriteOptions::<f32>::new()
        .default_dtype()
        .shape(&shape)
        .writer(file)
        .begin_nd()?;
    w.extend(a.iter().copied())?;
    w.finish()
}

fn summary<D: Dimension>(name: &str, a: &Array<f32, D>) {
    let (lo, hi) = a
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    let first: Vec<String> = a.iter().take(4).map(|v| format!("{v:.6}")).collect();
    println!(
        "{name}: shape {:?}, first [{}], min {lo:.6}, max {hi:.6}",
        a.shape(),
        first.join(", ")
    );
}

fn run(save_dir: Option<&Path>) -> Result<(), Box<dyn std::error::Error>> {
    // mlp(x, w1, b1, w2, b2): two products of the W2 workload.
    let x = input(&[128, 1024], 1, 1.0).into_dimensionality()?;
    let w1 = input(&[1024, 4096], 2, 0.05).into_dimensionality()?;
    let b1 = input(&[4096], 3, 0.1).into_dimensionality()?;
    let w2 = input(&[4096, 1024], 4, 0.02).into_dimensionality()?;
    let b2 = input(&[1024], 5, 0.1).into_dimensionality()?;
    // Its weights are declared (`weight w1: ..`): `mlp_prepare` packs the
    // two weight matrices once, and each call of `mlp` reads the packed
    // panels.
    let (w1_packed, w2_packed) = mlp::mlp_prepare(w1.view(), w2.view())?;
    let y = mlp::mlp(
        x.view(),
        w1.view(),
        b1.view(),
        w2.view(),
        b2.view(),
        w1_packed.view(),
        w2_packed.view(),
    )?;
    summary("mlp", &y);
    if let Some(dir) = save_dir {
        let dir = dir.join("mlp");
        save(&dir, "x", &x)?;
        save(&dir, "w1", &w1)?;
        save(&dir, "b1", &b1)?;
        save(&dir, "w2", &w2)?;
        save(&dir, "b2", &b2)?;
        save(&dir, "out0", &y)?;
    }

    // layernorm_gelu(x, g, b): the W5 workload. The input is a transposed
    // view: the bindings copy it into row-major order.
    let xt = input(&[768, 2048], 6, 2.0).into_dimensionality::<ndarray::Ix2>()?;
    let x = xt.t();
    let g = input(&[768], 7, 1.0).into_dimensionality()?;
    let b = input(&[768], 8, 0.5).into_dimensionality()?;
    let z = layernorm_gelu::layernorm_gelu(x, g.view(), b.view())?;
    summary("layernorm_gelu", &z);
    if let Some(dir) = save_dir {
        let dir = dir.join("layernorm_gelu");
        save(&dir, "x", &x)?;
        save(&dir, "g", &g)?;
        save(&dir, "b", &b)?;
        save(&dir, "out0", &z)?;
    }

    // Errors are values: a wrong shape, and a failure of the compiled code
    // naming the op's source place.
    let wrong = ndarray::Array2::<f32>::zeros((2, 2));
    match layernorm_gelu::layernorm_gelu(wrong.view(), g.view(), b.view()) {
        Err(e) => println!("error (expected): {e}"),
        Ok(_) => return Err("a 2x2 input was accepted".into()),
    }
    let a = ndarray::arr1(&[7, -9, 10, 3]);
    println!(
        "ratio: {}",
        ratio::ratio(a.view(), ndarray::arr1(&[2, 3, 5, 3]).view())?
    );
    match ratio::ratio(a.view(), ndarray::arr1(&[1, 0, 1, 1]).view()) {
        Err(e) => println!("error (expected): {e}"),
        Ok(r) => return Err(format!("a division by zero returned {r}").into()),
    }

    // f16, bf16 and bool tensors, scalars in and out, several results, and
    // Rust keywords as names (`r#move`, `r#type`).
    use half::{bf16, f16};
    let ty = ndarray::arr1(&[1.5, -2.0, -0.25].map(f16::from_f32));
    let m = ndarray::arr1(&[0.5, 1.0, -1.0].map(bf16::from_f32));
    let flag = ndarray::arr1(&[true, false, true]);
    let (a, b, n) = kinds::r#move(ty.view(), m.view(), flag.view(), 21, 2.0)?;
    println!("move: {:?} {:?} {n}", a.to_vec(), b.to_vec());
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let save_dir = match args.as_slice() {
        [] => None,
        [flag, dir] if flag == "--save" => Some(Path::new(dir)),
        _ => {
            eprintln!("usage: dlc-embed-example [--save DIR]");
            return std::process::ExitCode::from(2);
        }
    };
    match run(save_dir) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
