//! `dlc-rt` as a user runs it: on module files written here (the format is
//! the runtime's; `dlc compile --emit gpu-module` makes real ones, tested
//! in dlc's own command-line tests), without a GPU on the machines the
//! tests run on, where `run` and `bench` must say so in one line.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::PathBuf;
use std::process::{Command, Output};

use dlc_core::{DType, TensorType};
use dlc_runtime::abi::{Param, Signature};
use dlc_runtime::gpu::{DeviceBuffer, GpuFunction, GpuProgram, Launch};
use dlc_runtime::module::{EntryInfo, GpuModule};
use dlc_runtime::{HostTensor, RandomRange};

/// A fresh directory under the system's temporary one, removed when the
/// test ends (each run used to leave three behind).
struct Dir(PathBuf);

impl std::ops::Deref for Dir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("dlc-rt-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

fn dlc_rt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlc-rt"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn fails_with(o: &Output, text: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(text), "expected `{text}` in: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

/// A module of one entry point `f(x: f32[4], w: f32[4]) -> f32[4]`, one
/// launch; its PTX is a stub, which `info` and the argument checks never
/// load.
fn module() -> GpuModule {
    let ty = TensorType::new(DType::F32, vec![4]);
    let param = |name: &str, output| Param {
        name: name.into(),
        ty: ty.clone(),
        output,
    };
    GpuModule {
        target: "sm_90".into(),
        capability: (9, 0),
        tf32: false,
        program: GpuProgram {
            ptx: ".version 8.0\n.target sm_90\n".into(),
            functions: vec![GpuFunction {
                signature: Signature {
                    name: "f".into(),
                    params: vec![param("x", false), param("w", false), param("out0", true)],
                    sites: Vec::new(),
                    prepare: None,
                },
                workspace: 0,
                buffers: vec![
                    DeviceBuffer::Param(0),
                    DeviceBuffer::Param(1),
                    DeviceBuffer::Param(2),
                ],
                launches: vec![Launch {
                    kernel: "dlc_f_k0".into(),
                    blocks: 1,
                    threads: 32,
                    shared_bytes: 0,
                    args: vec![0, 1, 2],
                }],
            }],
        },
        entries: vec![EntryInfo {
            random: vec![RandomRange::Unit, RandomRange::Positive],
            tolerances: vec![1e-4],
        }],
    }
}

#[test]
fn info_describes_a_module_without_a_gpu() {
    let d = dir("info");
    let path = d.join("m.dlcm");
    std::fs::write(&path, module().to_bytes()).unwrap();
    let o = dlc_rt(&["info", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("target sm_90 (compute capability 9.0)"),
        "{out}"
    );
    assert!(
        out.contains("entry f(in x: f32[4], in w: f32[4], out out0: f32[4]): 1 launches"),
        "{out}"
    );
}

#[test]
fn bad_modules_and_arguments_are_one_line_errors() {
    let d = dir("errors");
    let path = d.join("m.dlcm");
    let p = path.to_str().unwrap();
    let mut bytes = module().to_bytes();
    std::fs::write(&path, &bytes).unwrap();
    fails_with(&dlc_rt(&["run", p]), "missing input(s) for `f`: x, w");
    fails_with(
        &dlc_rt(&["run", p, "--input", "y=y.npy"]),
        "`f` has no input `y` (its inputs: x, w)",
    );
    fails_with(
        &dlc_rt(&["run", p, "--input", "x"]),
        "expected NAME=FILE.npy",
    );
    fails_with(&dlc_rt(&["run", p, "--entry", "g"]), "no entry point `g`");
    let x = d.join("x.npy");
    HostTensor::new(TensorType::new(DType::F32, vec![5]), vec![0.0; 5])
        .unwrap()
        .write_npy(&x)
        .unwrap();
    fails_with(
        &dlc_rt(&[
            "run",
            p,
            "--random-inputs",
            "0",
            "--input",
            &format!("x={}", x.display()),
        ]),
        "input `x` must be f32[4], got f32[5]",
    );
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    fails_with(
        &dlc_rt(&["info", p]),
        "corrupted: its checksum does not match",
    );
    fails_with(
        &dlc_rt(&["bench", d.join("none.dlcm").to_str().unwrap()]),
        "none.dlcm",
    );
    std::fs::write(&path, b"not a module").unwrap();
    fails_with(&dlc_rt(&["run", p]), "not a dlc GPU module");
}

/// Where there is no GPU (the machines the tests run on), `run` and
/// `bench` say so in one line and exit with status 1; where there is one,
/// the stub PTX fails to load, also in one line.
#[test]
fn without_a_gpu_run_and_bench_say_why() {
    let d = dir("nogpu");
    let path = d.join("m.dlcm");
    std::fs::write(&path, module().to_bytes()).unwrap();
    let p = path.to_str().unwrap();
    for args in [
        &["run", p, "--random-inputs", "0"][..],
        &["bench", p, "--runs", "2"],
    ] {
        let o = dlc_rt(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains("no CUDA driver found")
                || err.contains("no CUDA device")
                || err.contains("loading the PTX"),
            "{err}"
        );
    }
}
