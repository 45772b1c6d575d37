//! Compiled object files kept on disk, so that compiling an unchanged
//! model again skips LLVM's passes and machine code generation.
//!
//! An entry is keyed by what determines its object file: the part's LLVM
//! module before optimization (as bitcode), the LLVM version, the target
//! machine (triple, CPU, features) and the pipeline. An entry is the
//! SHA-256 of the object followed by the object, written to a temporary
//! file and renamed into place (another process sees all of it or none);
//! an entry whose checksum does not match is removed and compiled again.
//! When the entries pass the size bound, the least recently used go. The
//! directory may be deleted at any time.
//!
//! # In detail
//!
//! **The object cache** (`cache.rs`, `JitOptions::cache`). A part's object file depends
//! only on its LLVM module before optimization, LLVM's version, the target machine
//! (triple, CPU, features) and the pipeline, so it is stored under the SHA-256 of
//! those (the module as bitcode) and looked up before optimizing: a second compile of
//! an unchanged model skips LLVM's passes and machine code generation, and a model that
//! shares a part with another (the same kernels, partitioned alike) reuses it. An entry
//! is the object's own SHA-256 followed by the object, written to a temporary file and
//! renamed into place, so a reader sees a whole entry or none; a damaged entry is a
//! miss, removed and compiled again. A hit touches the entry's modification time;
//! after a store, the least recently used entries go until the cache is under three
//! quarters of its bound (512 MiB by default). `dlc run` uses `$DLC_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/dlc` or `~/.cache/dlc` (`--no-cache`: neither read nor written);
//! `dlc bench` compiles cold unless given `--cache`, and says how many parts came from
//! the cache; the library's `jit` uses none (`jit_with` takes one). A part holding more
//! than `MAX_CACHED_CONSTANT_BYTES` (4 MiB) of constant data skips the cache: its key
//! (the module as bitcode, data included) took longer to make than the part takes to
//! compile (BERT-base's weights as constants: 3.5 s and 2.6 GB through the cache, 1.7 s
//! and 1.45 GB without). `dlc run` and `dlc bench` bind an imported model's weights at
//! the call, so its code holds none and is cached like any other. A compile whose
//! parts all come from the cache still runs the front end, emits the LLVM module,
//! hashes its bitcode and links (its time: performance.md); a whole program kept
//! beside its objects (`KEY.program`, see `program.rs`) skips all of that but the
//! link. A caller may keep bytes beside a program (`KEY.data`: an imported model's
//! folded weights), checksummed and trimmed like the rest.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

/// What an entry's format and the pipeline it was compiled with are
/// called; change it when either changes.
const FORMAT: &str =
    "dlc object cache 2; default<O3>, no unrolling, PIC; optnone parts at CodeGenOpt::None";

/// What a program entry's format is called; change it when the format or
/// what a program's key covers changes.
const PROGRAM_FORMAT: &str = "dlc program cache 1";

/// The kinds of entries: an object file (`KEY.o`), a whole program's
/// manifest (`KEY.program`: the keys of its objects, its entry points and
/// their signatures, and what the caller stored with them), or bytes a
/// caller keeps beside a program (`KEY.data`: an imported model's weights
/// that are not in its file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    Object,
    Program,
    Data,
}

impl Entry {
    fn extension(self) -> &'static str {
        match self {
            Entry::Object => "o",
            Entry::Program => "program",
            Entry::Data => "data",
        }
    }
}

/// The default bound on the entries' total size.
pub const DEFAULT_MAX_BYTES: u64 = 512 << 20;

/// A directory of compiled objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl ObjectCache {
    /// A cache in `dir` (created when first written) of at most
    /// `max_bytes` of entries.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> ObjectCache {
        ObjectCache {
            dir: dir.into(),
            max_bytes,
        }
    }

    /// The cache of this user: `$DLC_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/dlc`, else `$HOME/.cache/dlc`; `None` when none of
    /// them is set.
    pub fn for_user() -> Option<ObjectCache> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let dir = var("DLC_CACHE_DIR")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("dlc")))
            .or_else(|| var("HOME").map(|d| d.join(".cache").join("dlc")))?;
        Some(ObjectCache::new(dir, DEFAULT_MAX_BYTES))
    }

    /// Where the entries are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of an object compiled from `bitcode` for `machine` (its
    /// triple, CPU and features, as text) by LLVM `llvm_version`.
    pub(crate) fn key(bitcode: &[u8], machine: &str, llvm_version: &str) -> String {
        let mut h = Sha256::new();
        for part in [
            FORMAT.as_bytes(),
            llvm_version.as_bytes(),
            machine.as_bytes(),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(bitcode);
        hex(&h.finalize())
    }

    /// The key of a whole program: what its compile started from
    /// (`fields`: the source's name and text, the entry point, the passes,
    /// whatever else decides the program), this build of the compiler
    /// (`DLC_COMPILER_ID`, a hash of its sources), LLVM's version and the
    /// host's description (`host`: the target machine and
    /// [`dlc_core::TargetDesc::host`], which `DLC_CPU` may set).
    pub(crate) fn program_key(fields: &[&[u8]], host: &str) -> String {
        let (major, minor, patch) = inkwell::support::get_llvm_version();
        let llvm = format!("{major}.{minor}.{patch}");
        let mut h = Sha256::new();
        for part in [
            PROGRAM_FORMAT.as_bytes(),
            env!("DLC_COMPILER_ID").as_bytes(),
            llvm.as_bytes(),
            host.as_bytes(),
        ]
        .iter()
        .chain(fields)
        {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        hex(&h.finalize())
    }

    fn path(&self, key: &str, kind: Entry) -> PathBuf {
        self.dir.join(format!("{key}.{}", kind.extension()))
    }

    /// The entry of `kind` stored under `key`, if there is an intact one (a
    /// hit marks it as recently used).
    pub(crate) fn get(&self, key: &str, kind: Entry) -> Option<Vec<u8>> {
        let path = self.path(key, kind);
        let bytes = std::fs::read(&path).ok()?;
        let (sum, object) = bytes.split_at_checked(32)?;
        if Sha256::digest(object).as_slice() != sum {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        if let Ok(f) = std::fs::File::options().append(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(object.to_vec())
    }

    /// Stores `object` under `key`, then trims the cache to its bound. A
    /// cache that cannot be written is only slower: errors are returned
    /// for the caller to ignore or report.
    pub(crate) fn put(&self, key: &str, kind: Entry, object: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(
            ".{key}.{}.{:?}.tmp",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut bytes = Vec::with_capacity(32 + object.len());
        bytes.extend_from_slice(&Sha256::digest(object));
        bytes.extend_from_slice(object);
        std::fs::write(&tmp, &bytes)?;
        if let Err(e) = std::fs::rename(&tmp, self.path(key, kind)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        self.trim()
    }

    /// Removes the least recently used entries while they take more than
    /// the bound (down to three quarters of it, so that trimming is rare).
    fn trim(&self) -> std::io::Result<()> {
        let mut entries = Vec::new();
        let mut total = 0u64;
        for e in std::fs::read_dir(&self.dir)? {
            let e = e?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if ![Entry::Object, Entry::Program, Entry::Data]
                .iter()
                .any(|k| name.ends_with(&format!(".{}", k.extension())))
            {
                continue;
            }
            let meta = e.metadata()?;
            total += meta.len();
            let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            entries.push((used, meta.len(), e.path()));
        }
        if total <= self.max_bytes {
            return Ok(());
        }
        entries.sort();
        let goal = self.max_bytes / 4 * 3;
        for (_, len, path) in entries {
            if total <= goal {
                break;
            }
            // Another process may have removed it first.
            let _ = std::fs::remove_file(&path);
            total = total.saturating_sub(len);
        }
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("dlc-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn keys_differ_with_what_makes_the_object() {
        let k = ObjectCache::key(b"module", "x86-64 skylake-avx512 +avx512f", "22.1.0");
        assert_eq!(k.len(), 64);
        assert_eq!(
            k,
            ObjectCache::key(b"module", "x86-64 skylake-avx512 +avx512f", "22.1.0")
        );
        assert_ne!(
            k,
            ObjectCache::key(b"modulf", "x86-64 skylake-avx512 +avx512f", "22.1.0")
        );
        assert_ne!(
            k,
            ObjectCache::key(b"module", "x86-64 znver4 +avx512f", "22.1.0")
        );
        assert_ne!(
            k,
            ObjectCache::key(b"module", "x86-64 skylake-avx512 +avx512f", "22.1.1")
        );
        // Lengths are part of the key: moving bytes between fields changes it.
        assert_ne!(
            ObjectCache::key(b"", "ab", "c"),
            ObjectCache::key(b"", "a", "bc")
        );
    }

    #[test]
    fn entries_round_trip_and_damaged_ones_are_misses() {
        let dir = scratch("round-trip");
        let cache = ObjectCache::new(&dir, 1 << 20);
        assert_eq!(cache.get("k1", Entry::Object), None);
        cache.put("k1", Entry::Object, b"\x7fELF object").unwrap();
        assert_eq!(
            cache.get("k1", Entry::Object).as_deref(),
            Some(&b"\x7fELF object"[..])
        );
        // A flipped byte: a miss, and the entry is gone.
        let path = dir.join("k1.o");
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(cache.get("k1", Entry::Object), None);
        assert!(!path.exists());
        // Shorter than a checksum: a miss.
        std::fs::write(&path, b"short").unwrap();
        assert_eq!(cache.get("k1", Entry::Object), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_least_recently_used_entries_go_first() {
        let dir = scratch("bound");
        // Room for three entries of 100 + 32 bytes, not four.
        let cache = ObjectCache::new(&dir, 450);
        let old = SystemTime::now() - std::time::Duration::from_secs(100);
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            cache.put(k, Entry::Object, &[i as u8; 100]).unwrap();
            let f = std::fs::File::options()
                .append(true)
                .open(dir.join(format!("{k}.o")))
                .unwrap();
            f.set_modified(old + std::time::Duration::from_secs(i as u64))
                .unwrap();
        }
        // `a` is the oldest until it is used.
        assert!(cache.get("a", Entry::Object).is_some());
        cache.put("d", Entry::Object, &[3; 100]).unwrap();
        let left: Vec<bool> = ["a", "b", "c", "d"]
            .iter()
            .map(|k| dir.join(format!("{k}.o")).exists())
            .collect();
        // 4 x 132 = 528 > 450: down to 337 or less, the oldest first (b, c).
        assert_eq!(left, [true, false, false, true]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
