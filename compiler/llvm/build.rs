//! The compiler's identity, for the program cache (`cache.rs`): a SHA-256
//! of every file but the tests of every crate that decides what code dlc
//! generates for a program (their sources, build scripts and the data they
//! build in, such as the cost model's constants) and of `Cargo.lock`, which
//! pins their dependencies, as
//! `DLC_COMPILER_ID`. A cached program compiled by another build of dlc is
//! never taken for this one's; an unchanged tree builds the same identity.
//! Outside the workspace (a crate on its own) the identity is the
//! package's version.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The crates, relative to the workspace root, whose sources are hashed:
/// this one and everything it depends on in the workspace.
const CRATES: [&str; 10] = [
    "lang",
    "onnx",
    "dialects/core",
    "dialects/graph",
    "dialects/loop",
    "dialects/tile",
    "compiler/driver",
    "compiler/lower",
    "compiler/llvm",
    "runtime",
];

/// Every file under `path` (itself if it is one), in any order.
fn files_under(path: &Path, out: &mut Vec<PathBuf>) {
    match std::fs::read_dir(path) {
        Ok(entries) => {
            for e in entries.flatten() {
                files_under(&e.path(), out);
            }
        }
        Err(_) if path.is_file() => out.push(path.to_path_buf()),
        Err(_) => {}
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest.join("../..");
    let mut files = Vec::new();
    for krate in CRATES {
        // Everything but the tests: the sources, build scripts, and data
        // the code reads at build time (the cost model's constants, the
        // ONNX schema).
        let Ok(entries) = std::fs::read_dir(root.join(krate)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || ["tests", "benches", "target"].contains(&name.as_str()) {
                continue;
            }
            println!("cargo:rerun-if-changed={}", e.path().display());
            files_under(&e.path(), &mut files);
        }
    }
    let lock = root.join("Cargo.lock");
    if lock.exists() {
        println!("cargo:rerun-if-changed={}", lock.display());
        files.push(lock);
    }
    files.sort();
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let mut h = Sha256::new();
    h.update(version.as_bytes());
    for f in &files {
        let name = f
            .strip_prefix(&root)
            .unwrap_or(f)
            .to_string_lossy()
            .into_owned();
        let Ok(bytes) = std::fs::read(f) else {
            continue;
        };
        for field in [name.as_bytes(), &bytes] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field);
        }
    }
    let id: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=DLC_COMPILER_ID={version}+{id}");
}
