//! Compiled modules loaded from shared libraries, and the thread pool.

use std::ffi::{CStr, c_char, c_int};
use std::path::{Path, PathBuf};

use crate::abi::Signature;
use crate::call::{EntryFn, Kernel, RuntimeError};

/// A shared library made by `dlc compile --emit so`.
#[derive(Debug)]
pub struct SharedLibrary {
    lib: libloading::Library,
    path: PathBuf,
}

impl SharedLibrary {
    /// Loads the library at `path`.
    pub fn open(path: &Path) -> Result<SharedLibrary, RuntimeError> {
        // Pin the thread pool first: unloading the library must not unload it.
        load_thread_pool()?;
        // SAFETY: loading runs the library's initializers; a dlc library has
        // none beyond the C runtime's.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| RuntimeError::Load(format!("{}: {e}", path.display())))?;
        Ok(SharedLibrary {
            lib,
            path: path.to_path_buf(),
        })
    }

    /// The signature of the function exported as `name` (an entry point's
    /// symbol: its name with the prefix it was compiled with, `dlc_model_f`
    /// for entry `f` of `model.dl` by default), read from `name.signature`.
    pub fn signature(&self, name: &str) -> Result<Signature, RuntimeError> {
        let symbol = format!("{name}.signature\0");
        // SAFETY: `NAME.signature` is a NUL-terminated constant string that
        // dlc emits beside every function; the symbol's address is its first
        // byte, valid while the library is loaded.
        let text = unsafe {
            let p = self
                .lib
                .get::<*const c_char>(symbol.as_bytes())
                .map_err(|_| self.no_function(name))?;
            CStr::from_ptr(*p).to_string_lossy().into_owned()
        };
        Signature::decode(name, &text).map_err(RuntimeError::Load)
    }

    /// The function exported as `name` (see [`SharedLibrary::signature`]),
    /// callable with checked arguments.
    pub fn kernel(&self, name: &str) -> Result<Kernel<'_>, RuntimeError> {
        let signature = self.signature(name)?;
        let symbol = format!("{name}.entry\0");
        let prepare = signature.prepare.clone();
        // SAFETY: `NAME.entry` has type `EntryFn` in every dlc library, and
        // `signature` is the one emitted with it; the kernel borrows `self`,
        // so the code stays loaded while it exists.
        let kernel = unsafe {
            let entry = *self
                .lib
                .get::<EntryFn>(symbol.as_bytes())
                .map_err(|_| self.no_function(name))?;
            Kernel::from_raw(signature, entry)
        };
        match prepare {
            Some(p) => kernel.with_prepare(self.kernel(&p)?),
            None => Ok(kernel),
        }
    }

    fn no_function(&self, name: &str) -> RuntimeError {
        RuntimeError::Load(format!(
            "{}: no dlc function `{name}` (a function's symbol is its entry point's name with the \
             symbol prefix it was compiled with: `dlc_model_f` for entry `f` of `model.dl`, or \
             `--prefix`)",
            self.path.display()
        ))
    }
}

/// Loads the OpenMP runtime (libgomp) that parallel loops of compiled code
/// run on, for the rest of the process: it is never unloaded, since its
/// worker threads outlive every call (LLVM's JIT, which also opens it,
/// closes its handles at exit while those threads still sleep in it).
pub fn load_thread_pool() -> Result<(), RuntimeError> {
    static POOL: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        // SAFETY: libgomp's initializers have no preconditions; the handle
        // is leaked so the library stays mapped.
        unsafe { libloading::Library::new("libgomp.so.1") }
            .map(std::mem::forget)
            .map_err(|e| {
                format!("cannot load the OpenMP runtime libgomp.so.1 (install libgomp1): {e}")
            })
    })
    .clone()
    .map_err(RuntimeError::Load)
}

/// Sets how many threads parallel loops of compiled code use (the OpenMP
/// runtime's `omp_set_num_threads`); 0 means one per core.
pub fn set_num_threads(n: usize) -> Result<(), RuntimeError> {
    load_thread_pool()?;
    let n = if n == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        n
    };
    let n = c_int::try_from(n)
        .map_err(|_| RuntimeError::Arguments(format!("{n} threads is too many")))?;
    // SAFETY: libgomp is loaded for good (above); this handle only looks up
    // a symbol of type `void (int)`.
    unsafe {
        let gomp = libloading::Library::new("libgomp.so.1")
            .map_err(|e| RuntimeError::Load(format!("libgomp.so.1: {e}")))?;
        let set = *gomp
            .get::<unsafe extern "C" fn(c_int)>(b"omp_set_num_threads\0")
            .map_err(|e| RuntimeError::Load(format!("libgomp.so.1: {e}")))?;
        set(n);
    }
    Ok(())
}

/// Drops from the process's resident set the pages of this executable's
/// code and read-only data (`madvise(MADV_DONTNEED)`): for the `dlc`
/// command, once it has started (static initializers map tens of megabytes
/// of LLVM and MLIR that nothing reads again) and once it is done compiling
/// (the compiler runs no more), while what does run is mapped again from the
/// page cache as it is used (a minor fault per page; the pages stay cached
/// for the next process). A library embedding dlc decides for itself: the
/// library's `jit` does not call this. Only
/// mappings that are read-only and hold no page of their own (`Anonymous:
/// 0 kB` in `/proc/self/smaps`: not the relocated read-only data, whose
/// pages were written before they were protected) are dropped, so what a
/// read of them gives cannot change. Returns the bytes dropped; best effort
/// (a system without `/proc` drops nothing).
pub fn release_code_pages() -> usize {
    let (Ok(exe), Ok(smaps)) = (
        std::fs::read_link("/proc/self/exe"),
        std::fs::read_to_string("/proc/self/smaps"),
    ) else {
        return 0;
    };
    let exe = exe.to_string_lossy();
    // (start, end, droppable) for every mapping: droppable if it maps the
    // executable, is not writable and holds no anonymous page.
    let mut ranges: Vec<(usize, usize, bool)> = Vec::new();
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let bounds = fields.first().and_then(|r| {
            let (a, b) = r.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        });
        match (bounds, &fields[..]) {
            // `start-end perms offset dev inode [path]`
            (Some((a, b)), [_, perms, _, _, _, rest @ ..]) => {
                let ours = rest.first() == Some(&exe.as_ref()) && !perms.contains('w');
                ranges.push((a, b, ours));
            }
            (None, ["Anonymous:", kb, "kB"]) if *kb != "0" => {
                if let Some(last) = ranges.last_mut() {
                    last.2 = false;
                }
            }
            _ => {}
        }
    }
    let mut dropped = 0;
    for (start, end, clean) in ranges {
        if !clean || end <= start {
            continue;
        }
        // SAFETY: the range is a read-only mapping of this process's own
        // executable with no page of its own: dropping its pages makes the
        // next read map the file's (unchanged) contents again.
        let r =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        if r == 0 {
            dropped += end - start;
        }
    }
    dropped
}

#[cfg(test)]
mod tests {
    /// Resident pages mapped from files (`/proc/self/statm`'s third field).
    fn file_pages() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        statm
            .split_whitespace()
            .nth(2)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn code_pages_are_dropped_and_come_back() {
        let before = file_pages();
        let dropped = super::release_code_pages();
        let after = file_pages();
        assert!(dropped > 0, "no mapping of the test executable was dropped");
        assert!(
            after < before,
            "resident file pages {before} -> {after} after dropping {dropped} bytes"
        );
        // The code runs on, read back as it is used, and the relocated
        // read-only data (vtables, string tables) is intact.
        let text = format!("{:?}", vec![Some(1.5f64), None]);
        assert_eq!(text, "[Some(1.5), None]");
        assert!(super::set_num_threads(1).is_ok());
    }
}
