//! Compiling dlc models from a Rust program's `build.rs`, so that the
//! program links them with no compiler at run time.
//!
//! ```text
//! // build.rs (with `dlc-build` under [build-dependencies], and `ndarray`
//! // under [dependencies] for the bindings' tensors)
//! fn main() {
//!     dlc_build::Model::new("models/mlp.dl").build();
//! }
//! ```
//!
//! ```text
//! // src/main.rs
//! mod mlp {
//!     include!(concat!(env!("OUT_DIR"), "/mlp.rs"));
//! }
//! let y = mlp::mlp(x.view(), w.view())?; // ndarray in, ndarray out
//! ```
//!
//! [`Model::build`] compiles the model for the target Cargo builds for (its
//! triple, and on x86-64 the CPU level its target features allow: `-C
//! target-cpu=native` in `RUSTFLAGS` gets this machine's vector width, a
//! plain build the SSE2 baseline every x86-64 CPU has), writes the static
//! library `libdlc_STEM.a` and the bindings `STEM.rs` to `OUT_DIR`, and
//! prints the `cargo:` lines that link the library (with libm, and libgomp
//! for kernels on threads) and rebuild when the model changes. A model that
//! does not compile fails the build with its diagnostic (`file:line:col`).
//! The bindings are described in `dlc_driver::bindings`.
//!
//! For an NVIDIA GPU, [`Model::build_gpu`] writes the GPU module `STEM.dlcm`
//! (`dlc compile --emit gpu-module`) to `OUT_DIR` instead; the program embeds
//! its bytes and runs it through the runtime, with no compiler:
//!
//! ```text
//! // build.rs
//! dlc_build::Model::new("models/mlp.dl").build_gpu("sm_90");
//! // src/main.rs (dlc-runtime under [dependencies])
//! let module = GpuModule::from_bytes("mlp", include_bytes!(concat!(env!("OUT_DIR"), "/mlp.dlcm")))?;
//! let mut cuda = dlc_runtime::cuda::Cuda::open()?;
//! cuda.load_module(&module)?;
//! let (f, _) = module.entry("mlp")?;
//! let y = dlc_runtime::gpu::Prepared::new(&mut cuda, f)?.call(&mut cuda, &inputs)?;
//! ```
//!
//! # Linking
//!
//! **dlc-build** (`tools/dlc-build`). `dlc_build::Model::new("model.dl").build()` in a
//! `build.rs` reads Cargo's environment (`CARGO_CFG_TARGET_ARCH/OS/FEATURE`, `OUT_DIR`):
//! x86-64 Linux compiles for the highest x86-64 level all of whose features Cargo enables
//! (`RUSTFLAGS=-C target-cpu=native` gets this machine's; a plain build the SSE2
//! baseline, so the binary runs wherever Rust's default target does; `.cpu("x86-64-v3")`
//! chooses), aarch64 Linux cross-compiles, anything else is an error saying so. It writes
//! `libdlc_STEM.a` and `STEM.rs` and prints `rerun-if-changed`, the link search path, the
//! static library, `-lm`, and libgomp linked with `--no-as-needed`: generated code calls
//! the OpenMP runtime through weak symbols, which rustc's default `--as-needed` does not
//! count as uses, so the library would be dropped and kernels would silently run on one
//! thread. A model that does not compile ends the build script with its diagnostic on
//! standard error, which Cargo shows (`--> model.dl:2:16`).
#![deny(missing_docs)]

use std::path::{Path, PathBuf};

use dlc_driver::{Artifact, CompileOptions, DriverError, NativeArtifact};

/// Why a model could not be built.
#[derive(Debug)]
pub enum Error {
    /// The compiler's error: the model's diagnostic, rendered.
    Compile(DriverError),
    /// Cargo's environment does not say what a build script needs, or names
    /// a target dlc does not compile for.
    Environment(String),
    /// An output could not be written.
    Io {
        /// The file.
        path: PathBuf,
        /// The system error.
        source: std::io::Error,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Compile(e) => write!(f, "{e}"),
            Error::Environment(m) => write!(f, "error: dlc-build: {m}"),
            Error::Io { path, source } => write!(f, "error: {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for Error {}

impl From<DriverError> for Error {
    fn from(e: DriverError) -> Self {
        Error::Compile(e)
    }
}

/// What [`Model::compile`] wrote.
#[derive(Debug, Clone)]
pub struct Built {
    /// The static library.
    pub library: PathBuf,
    /// The Rust bindings, to `include!`.
    pub bindings: PathBuf,
    /// The `cargo:` lines (printed by [`Model::build`]).
    pub cargo_lines: Vec<String>,
    /// Which CPUs the code runs on, in words.
    pub runs_on: String,
}

/// A model to compile: a `.dl` file and how.
#[derive(Debug, Clone)]
pub struct Model {
    path: PathBuf,
    entries: Vec<String>,
    prefix: Option<String>,
    passes: Option<String>,
    cpu: Option<String>,
    threads: bool,
    weights: Option<PathBuf>,
}

impl Model {
    /// The model in `path` (relative to the package's root, where build
    /// scripts run).
    pub fn new(path: impl Into<PathBuf>) -> Model {
        Model {
            path: path.into(),
            entries: Vec::new(),
            prefix: None,
            passes: None,
            cpu: None,
            threads: true,
            weights: None,
        }
    }

    /// Compiles only this entry point (repeat for more; all by default).
    pub fn entry(mut self, name: &str) -> Model {
        self.entries.push(name.into());
        self
    }

    /// The prefix of the exported symbols (`dlc_STEM_` by default).
    pub fn prefix(mut self, prefix: &str) -> Model {
        self.prefix = Some(prefix.into());
        self
    }

    /// The graph pipeline (the compiler's default otherwise).
    pub fn passes(mut self, pipeline: &str) -> Model {
        self.passes = Some(pipeline.into());
        self
    }

    /// The x86-64 CPU to compile for (`x86-64-v3`, `native`, an LLVM CPU
    /// name), instead of the level Cargo's target features allow.
    pub fn cpu(mut self, cpu: &str) -> Model {
        self.cpu = Some(cpu.into());
        self
    }

    /// Builds the entry points' `weight` parameters into the library as
    /// constants, from a directory of `NAME.npy` (what `dlc train
    /// --save-weights` writes) or a `.safetensors` file: the bindings then
    /// take only the other inputs (`dlc compile --weights`).
    pub fn weights(mut self, path: impl Into<PathBuf>) -> Model {
        self.weights = Some(path.into());
        self
    }

    /// Whether kernels run on OpenMP threads (links libgomp; default yes).
    /// Without it they run on the calling thread.
    pub fn threads(mut self, threads: bool) -> Model {
        self.threads = threads;
        self
    }

    /// [`Model::compile`] with Cargo's environment, printing the `cargo:`
    /// lines; on failure prints the error (the model's diagnostic) and
    /// ends the build script with status 1, which fails the build.
    pub fn build(self) -> Built {
        match self.compile(&Cargo::from_env()) {
            Ok(built) => {
                for line in &built.cargo_lines {
                    println!("{line}");
                }
                built
            }
            Err(e) => {
                // The model is named so that Cargo reruns the script once it
                // is fixed.
                println!("cargo:rerun-if-changed={}", self.path.display());
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }

    /// [`Model::compile_gpu`] with Cargo's environment, printing the
    /// `cargo:` line that reruns it when the model changes; on failure as
    /// [`Model::build`]. Returns the module's path.
    pub fn build_gpu(self, target: &str) -> PathBuf {
        println!("cargo:rerun-if-changed={}", self.path.display());
        match self.compile_gpu(&Cargo::from_env(), target) {
            Ok(path) => path,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }

    /// Compiles the model for the GPU `target` (`sm_80`, `sm_90`) into
    /// `cargo`'s output directory as the GPU module `STEM.dlcm`, which the
    /// program embeds (`include_bytes!`) and loads with
    /// `dlc_runtime::module::GpuModule::from_bytes`.
    pub fn compile_gpu(&self, cargo: &Cargo, target: &str) -> Result<PathBuf, Error> {
        if self.cpu.is_some() {
            return Err(Error::Environment(format!(
                "a CPU (`cpu`) was chosen for a model compiled for the GPU target {target}"
            )));
        }
        let (src, stem, out) = self.source(cargo)?;
        let mut options = self.options(target.into(), "native".into());
        options.emit = Artifact::GpuModule;
        let codegen = dlc_driver::Backends {
            codegen: Some(&dlc_llvm::Llvm),
            mlir: None,
        };
        let module = dlc_driver::compile(&src, &options, codegen)?;
        let path = out.join(format!("{stem}.dlcm"));
        write(&path, &module.bytes)?;
        Ok(path)
    }

    /// The model's source, its file stem as an identifier, and the output
    /// directory.
    fn source(&self, cargo: &Cargo) -> Result<(dlc_driver::SourceText, String, PathBuf), Error> {
        let name = self.path.display().to_string();
        let bytes = std::fs::read(&self.path).map_err(|source| Error::Io {
            path: self.path.clone(),
            source,
        })?;
        let src = dlc_driver::decode(&name, bytes)?;
        let stem: String = dlc_driver::module_stem(&name)
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let out = cargo.out_dir.clone().ok_or_else(|| {
            Error::Environment("OUT_DIR is not set: call this from a build script".into())
        })?;
        Ok((src, stem, out))
    }

    /// The compile options this model's settings make, for `target`.
    fn options(&self, target: String, cpu: String) -> CompileOptions {
        let mut options = CompileOptions {
            entries: self.entries.clone(),
            prefix: self.prefix.clone(),
            target,
            cpu,
            ..CompileOptions::default()
        };
        if let Some(p) = &self.passes {
            options.passes.clone_from(p);
        }
        options.weights.clone_from(&self.weights);
        options
    }

    /// Compiles the model for `cargo`'s target into its output directory:
    /// `libdlc_STEM.a` and `STEM.rs`.
    pub fn compile(&self, cargo: &Cargo) -> Result<Built, Error> {
        let (target, cpu) = cargo.target_and_cpu(self.cpu.as_deref())?;
        let (src, stem, out) = self.source(cargo)?;
        let options = self.options(target, cpu);
        // One front end and pipeline run for both artifacts.
        let prepared = dlc_driver::prepare(&src, &options)?;
        let library_name = format!("dlc_{stem}");
        let library = out.join(format!("lib{library_name}.a"));
        let codegen = dlc_driver::Backends {
            codegen: Some(&dlc_llvm::Llvm),
            mlir: None,
        };
        let lib = prepared.emit(Artifact::Native(NativeArtifact::StaticLibrary), codegen)?;
        write(&library, &lib)?;
        let bindings = out.join(format!("{stem}.rs"));
        write(&bindings, &prepared.emit(Artifact::RustBindings, codegen)?)?;
        let mut cargo_lines = vec![format!("cargo:rerun-if-changed={}", self.path.display())];
        if let Some(w) = &self.weights {
            cargo_lines.push(format!("cargo:rerun-if-changed={}", w.display()));
        }
        cargo_lines.extend([
            format!("cargo:rustc-link-search=native={}", out.display()),
            format!("cargo:rustc-link-lib=static={library_name}"),
        ]);
        if self.threads {
            // Kernels reach the OpenMP runtime through weak symbols, which
            // `--as-needed` (rustc's default for libraries) does not count
            // as a use: the library is linked as needed regardless.
            cargo_lines.push(
                "cargo:rustc-link-arg=-Wl,--push-state,--no-as-needed,-lgomp,--pop-state".into(),
            );
        }
        cargo_lines.push("cargo:rustc-link-lib=m".into());
        Ok(Built {
            library,
            bindings,
            cargo_lines,
            runs_on: dlc_driver::runs_on(&prepared.target),
        })
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    std::fs::write(path, bytes).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// What Cargo tells a build script about the build.
#[derive(Debug, Clone, Default)]
pub struct Cargo {
    /// `OUT_DIR`.
    pub out_dir: Option<PathBuf>,
    /// `CARGO_CFG_TARGET_ARCH` (`x86_64`).
    pub arch: String,
    /// `CARGO_CFG_TARGET_OS` (`linux`).
    pub os: String,
    /// `CARGO_CFG_TARGET_FEATURE`, split (`sse2`, `avx2`, ...).
    pub features: Vec<String>,
    /// `TARGET`, the triple.
    pub triple: String,
}

impl Cargo {
    /// Cargo's environment variables.
    pub fn from_env() -> Cargo {
        let var = |name: &str| std::env::var(name).unwrap_or_default();
        Cargo {
            out_dir: std::env::var_os("OUT_DIR").map(PathBuf::from),
            arch: var("CARGO_CFG_TARGET_ARCH"),
            os: var("CARGO_CFG_TARGET_OS"),
            features: var("CARGO_CFG_TARGET_FEATURE")
                .split(',')
                .filter(|f| !f.is_empty())
                .map(String::from)
                .collect(),
            triple: var("TARGET"),
        }
    }

    /// The compiler's `--target` and `--cpu` for this build: on x86-64
    /// Linux the highest x86-64 level every enabled feature of which Cargo
    /// reports (or `cpu`); on aarch64 Linux the cross target.
    pub fn target_and_cpu(&self, cpu: Option<&str>) -> Result<(String, String), Error> {
        let host_arch = std::env::consts::ARCH;
        match (self.arch.as_str(), self.os.as_str()) {
            ("x86_64", "linux") if host_arch == "x86_64" => {
                let cpu = cpu.map_or_else(|| self.x86_64_level().to_string(), String::from);
                Ok(("host".into(), cpu))
            }
            ("aarch64", "linux") if host_arch != "aarch64" => match cpu {
                Some(cpu) => Err(Error::Environment(format!(
                    "cpu `{cpu}` is an x86-64 CPU; {} compiles for its own",
                    self.triple
                ))),
                None => Ok(("aarch64-linux-gnu".into(), "native".into())),
            },
            _ => Err(Error::Environment(format!(
                "Cargo builds for `{}` (arch `{}`, os `{}`) on {host_arch}; dlc compiles for \
                 x86_64 Linux, and cross-compiles for aarch64 Linux",
                self.triple, self.arch, self.os
            ))),
        }
    }

    /// The x86-64 level Cargo's target features include.
    fn x86_64_level(&self) -> &'static str {
        let has = |fs: &[&str]| fs.iter().all(|f| self.features.iter().any(|g| g == f));
        let v2 = ["cmpxchg16b", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3"];
        let v3 = [
            "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "lzcnt", "movbe",
        ];
        let v4 = ["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"];
        match (has(&v2), has(&v3), has(&v4)) {
            (true, true, true) => "x86-64-v4",
            (true, true, false) => "x86-64-v3",
            (true, false, _) => "x86-64-v2",
            _ => "x86-64",
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cargo(arch: &str, features: &str) -> Cargo {
        Cargo {
            out_dir: None,
            arch: arch.into(),
            os: "linux".into(),
            features: features.split(',').map(String::from).collect(),
            triple: format!("{arch}-unknown-linux-gnu"),
        }
    }

    #[test]
    fn the_level_is_the_highest_whose_features_cargo_enables() {
        let level = |f: &str| cargo("x86_64", f).target_and_cpu(None).unwrap().1;
        assert_eq!(level("fxsr,sse,sse2"), "x86-64");
        let v2 = "cmpxchg16b,fxsr,popcnt,sse,sse2,sse3,sse4.1,sse4.2,ssse3";
        assert_eq!(level(v2), "x86-64-v2");
        let v3 = format!("{v2},avx,avx2,bmi1,bmi2,f16c,fma,lzcnt,movbe");
        assert_eq!(level(&v3), "x86-64-v3");
        assert_eq!(
            level(&format!("{v3},avx512f,avx512bw,avx512cd,avx512dq")),
            "x86-64-v3"
        );
        let v4 = format!("{v3},avx512f,avx512bw,avx512cd,avx512dq,avx512vl");
        assert_eq!(level(&v4), "x86-64-v4");
        let chosen = cargo("x86_64", "sse2").target_and_cpu(Some("haswell"));
        assert_eq!(chosen.unwrap().1, "haswell");
    }

    #[test]
    fn other_targets_are_refused_or_cross_compiled() {
        let arm = cargo("aarch64", "neon").target_and_cpu(None).unwrap();
        assert_eq!(arm, ("aarch64-linux-gnu".into(), "native".into()));
        let mut wasm = cargo("wasm32", "");
        wasm.os = "unknown".into();
        let e = wasm.target_and_cpu(None).unwrap_err().to_string();
        assert!(e.contains("dlc compiles for x86_64 Linux"), "{e}");
    }

    /// A model built with its weights: the bindings take only the other
    /// inputs, and Cargo reruns the script when the weights change.
    #[test]
    fn weights_are_built_into_the_library() {
        let dir = std::env::temp_dir().join(format!("dlc-build-weights-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("w")).unwrap();
        let model = dir.join("m.dl");
        std::fs::write(
            &model,
            "fn f(x: f32[4], weight w: f32[4]) -> f32[4] { return x * w; }",
        )
        .unwrap();
        let ty = dlc_core::TensorType::new(dlc_core::DType::F32, vec![4]);
        dlc_runtime::HostTensor::new(ty, vec![1.0, 2.0, 3.0, 4.0])
            .unwrap()
            .write_npy(&dir.join("w/w.npy"))
            .unwrap();
        let mut c = cargo("x86_64", "sse2");
        c.out_dir = Some(dir.clone());
        let built = Model::new(&model).weights(dir.join("w")).compile(&c);
        let bindings = built.map(|b| (std::fs::read_to_string(&b.bindings), b.cargo_lines));
        let _ = std::fs::remove_dir_all(&dir);
        let (text, lines) = bindings.unwrap();
        let text = text.unwrap();
        assert!(text.contains("Inputs: `x: f32[4]`. Results"), "{text}");
        let watched = format!("cargo:rerun-if-changed={}", dir.join("w").display());
        assert!(lines.contains(&watched), "{lines:?}");
    }

    #[test]
    fn without_out_dir_compile_says_it_needs_a_build_script() {
        let dir = std::env::temp_dir().join(format!("dlc-build-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let model = dir.join("m.dl");
        std::fs::write(&model, "fn f(x: f32[4]) -> f32[4] { return x; }\n").unwrap();
        let e = Model::new(&model)
            .compile(&cargo("x86_64", "sse2"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("OUT_DIR is not set"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A GPU build writes a module the runtime loads, with the entry points
    /// asked for; a CPU target is refused.
    #[test]
    fn a_gpu_build_writes_a_module_the_runtime_loads() {
        let dir = std::env::temp_dir().join(format!("dlc-build-gpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let model = dir.join("two.dl");
        std::fs::write(
            &model,
            "fn f(x: f32[4]) -> f32[4] { return x * 2.0; }\nfn g(x: f32[4]) -> f32[4] { return x + 1.0; }\n",
        )
        .unwrap();
        let mut c = cargo("x86_64", "sse2");
        c.out_dir = Some(dir.clone());
        let path = Model::new(&model)
            .entry("g")
            .compile_gpu(&c, "sm_80")
            .unwrap();
        assert_eq!(path, dir.join("two.dlcm"));
        let m = dlc_runtime::module::GpuModule::read(&path).unwrap();
        assert_eq!(m.target, "sm_80");
        assert_eq!(m.entry_names().collect::<Vec<_>>(), ["g"]);
        let e = Model::new(&model)
            .compile_gpu(&c, "x86-64-avx2")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a GPU module is compiled for a GPU target"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
