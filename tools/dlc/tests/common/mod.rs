//! What the `dlc` command's test binaries share: a scratch directory, running
//! the binary, and reading its errors.

// Each test binary uses its own subset.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

use dlc_core::TensorType;
use dlc_runtime::HostTensor;

/// A scratch directory, removed when dropped.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(name: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("dlc-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }

    /// The path of `name` in the directory, as a string.
    pub fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }

    /// Writes `name` (text or bytes; `sub/name` makes the folder) and
    /// returns its path.
    pub fn file(&self, name: &str, contents: impl AsRef<[u8]>) -> String {
        let p = self.path(name);
        if let Some(parent) = std::path::Path::new(&p).parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, contents).unwrap();
        p
    }

    /// Writes a `.npy` tensor and returns its path.
    pub fn npy(&self, name: &str, ty: TensorType, data: &[f64]) -> String {
        let p = self.0.join(name);
        HostTensor::new(ty, data.to_vec())
            .unwrap()
            .write_npy(&p)
            .unwrap();
        p.display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `dlc` with `args`, its object cache in the build's temporary
/// directory (not the user's).
pub fn dlc(args: &[&str]) -> Output {
    dlc_with_env(&[], args)
}

/// [`dlc`] with `env` added to its environment.
pub fn dlc_with_env(env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlc"))
        .env("DLC_CACHE_DIR", cache_dir())
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The run failed with status 1 and `text` in its standard error.
#[track_caller]
pub fn fails_with(o: &Output, text: &str) {
    assert_eq!(o.status.code(), Some(1), "stderr: {}", stderr(o));
    assert!(
        stderr(o).contains(text),
        "expected `{text}` in:\n{}",
        stderr(o)
    );
}

/// The object cache of `dlc` as the tests run it.
pub fn cache_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dlc-object-cache")
}
