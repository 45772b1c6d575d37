//! Whole programs in the object cache: a compiled module's manifest (the
//! keys of its parts' objects, its entry wrappers, its functions'
//! signatures, and what the caller keeps with them) stored under a key of
//! what the compile started from, so that compiling the same program again
//! links its objects without running the front end, the passes, the
//! lowering or LLVM.
//!
//! The key ([`ProgramKey`]) covers the caller's fields (the source's name
//! and text, the entry point, the passes), this build of the compiler (a
//! hash of its sources, `build.rs`), LLVM's version and the host (the
//! target machine and [`TargetDesc::host`], which `DLC_CPU` sets). A
//! manifest whose object is gone (the cache trimmed it) is a miss, and so
//! is one that does not read as a manifest: the caller compiles, and
//! stores the program again.

use std::collections::HashMap;
use std::fmt::Write;

use dlc_core::TargetDesc;
use dlc_runtime::abi::Signature;

use crate::cache::{Entry, ObjectCache};
use crate::jit::{Jit, link, load_thread_pool};
use crate::{CodegenError, R};

/// The first line of a manifest.
const HEADER: &str = "dlc program";

/// Where a program is kept in the cache: see the module's documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramKey(String);

impl ProgramKey {
    /// The key of the program compiled for this machine from `fields`,
    /// each of which must be something that decides the program (it is
    /// hashed with its length, so fields cannot run into each other).
    pub fn new(fields: &[&[u8]]) -> R<ProgramKey> {
        Ok(ProgramKey(ObjectCache::program_key(
            fields,
            &host_description()?,
        )))
    }

    /// The key as 64 hexadecimal digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The host as code is compiled for it: the target machine's triple, CPU
/// and features, and the description lowering schedules for.
fn host_description() -> R<String> {
    let target = TargetDesc::host();
    let machine = crate::target::machine(target)?;
    Ok(format!(
        "{} {} {} {target:?}",
        machine.get_triple(),
        machine.get_cpu(),
        machine.get_feature_string().to_string_lossy()
    ))
}

/// `%`, line breaks and spaces escaped, so that a field is one word of a
/// manifest's line.
fn escape(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\n', "%0A")
        .replace('\r', "%0D")
        .replace(' ', "%20")
}

fn unescape(s: &str) -> String {
    s.replace("%20", " ")
        .replace("%0D", "\r")
        .replace("%0A", "\n")
        .replace("%25", "%")
}

/// A manifest, read.
struct Manifest {
    objects: Vec<String>,
    entries: Vec<String>,
    signatures: HashMap<String, R<Signature>>,
    meta: String,
}

impl Manifest {
    /// `dlc program`, then one `object KEY` per part, `entry SYMBOL` per
    /// entry wrapper, `signature NAME TEXT` ([`Signature::encode`]) or
    /// `unsigned NAME WHY` per function, and `meta` followed by the
    /// caller's text to the end.
    fn write(
        objects: &[String],
        entries: &[String],
        signatures: &HashMap<String, R<Signature>>,
        meta: &str,
    ) -> String {
        let mut text = format!("{HEADER}\n");
        for key in objects {
            let _ = writeln!(text, "object {key}");
        }
        for entry in entries {
            let _ = writeln!(text, "entry {}", escape(entry));
        }
        let mut names: Vec<&String> = signatures.keys().collect();
        names.sort();
        for name in names {
            let _ = match &signatures[name] {
                Ok(sig) => writeln!(text, "signature {} {}", escape(name), escape(&sig.encode())),
                Err(e) => writeln!(text, "unsigned {} {}", escape(name), escape(&e.to_string())),
            };
        }
        text.push_str("meta\n");
        text.push_str(meta);
        text
    }

    /// Reads what [`Manifest::write`] wrote; `None` for anything else.
    fn read(text: &str) -> Option<Manifest> {
        let mut lines = text.split_inclusive('\n');
        if lines.next()? != format!("{HEADER}\n") {
            return None;
        }
        let mut m = Manifest {
            objects: Vec::new(),
            entries: Vec::new(),
            signatures: HashMap::new(),
            meta: String::new(),
        };
        for line in lines.by_ref() {
            let line = line.strip_suffix('\n')?;
            if line == "meta" {
                m.meta = lines.collect();
                return Some(m);
            }
            let mut words = line.split(' ');
            match (words.next()?, words.next()?, words.next()) {
                ("object", key, None) => m.objects.push(key.to_string()),
                ("entry", symbol, None) => m.entries.push(unescape(symbol)),
                ("signature", name, Some(sig)) => {
                    let name = unescape(name);
                    let sig = Signature::decode(&name, &unescape(sig)).ok()?;
                    m.signatures.insert(name, Ok(sig));
                }
                ("unsigned", name, Some(why)) => {
                    let why = CodegenError::Arguments(unescape(why));
                    m.signatures.insert(unescape(name), Err(why));
                }
                _ => return None,
            }
            if words.next().is_some() {
                return None;
            }
        }
        // No `meta` line: a manifest cut short.
        None
    }
}

impl Jit {
    /// Stores this code in `cache` as the program `key` names, with `meta`
    /// (what the caller needs to call it without compiling again: the
    /// entry point's parameters). `Ok(false)` when it cannot be stored: a
    /// part of it was compiled without the cache (one holding much constant
    /// data, see [`crate::MAX_CACHED_CONSTANT_BYTES`], or a compile given
    /// no cache), or it is profiled (its key would not say so).
    pub fn store(
        &self,
        cache: &ObjectCache,
        key: &ProgramKey,
        meta: &str,
    ) -> std::io::Result<bool> {
        let Some(objects) = self.objects.as_ref().filter(|_| !self.profiled) else {
            return Ok(false);
        };
        let text = Manifest::write(objects, &self.entries, &self.signatures, meta);
        cache.put(&key.0, Entry::Program, text.as_bytes())?;
        Ok(true)
    }

    /// Keeps `bytes` beside program `key` in `cache` (checksummed like
    /// every entry; [`Jit::load_data`] reads them back).
    pub fn store_data(cache: &ObjectCache, key: &ProgramKey, bytes: &[u8]) -> std::io::Result<()> {
        cache.put(&key.0, Entry::Data, bytes)
    }

    /// What [`Jit::store_data`] kept beside program `key`; `None` when the
    /// cache holds none, or a damaged entry.
    pub fn load_data(cache: &ObjectCache, key: &ProgramKey) -> Option<Vec<u8>> {
        cache.get(&key.0, Entry::Data)
    }

    /// The program `key` names, linked from the objects `cache` holds,
    /// with the text stored with it ([`Jit::store`]); `None` when the cache
    /// holds no intact manifest under `key`, or lacks one of its objects.
    pub fn load(cache: &ObjectCache, key: &ProgramKey) -> R<Option<(Jit, String)>> {
        let start = std::time::Instant::now();
        let Some(manifest) = cache
            .get(&key.0, Entry::Program)
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .and_then(|text| Manifest::read(&text))
        else {
            return Ok(None);
        };
        let mut objects = Vec::with_capacity(manifest.objects.len());
        for k in &manifest.objects {
            match cache.get(k, Entry::Object) {
                Some(object) => objects.push(object),
                None => return Ok(None),
            }
        }
        load_thread_pool()?;
        crate::target::initialize_native()?;
        let linker = link(&objects.iter().map(Vec::as_slice).collect::<Vec<_>>())?;
        let parts = objects.len();
        let mut jit = Jit {
            linker,
            compile_time: std::time::Duration::ZERO,
            signatures: manifest.signatures,
            parts,
            cached: parts,
            objects: Some(manifest.objects),
            entries: manifest.entries,
            // A profiled program is never stored (`Jit::store`).
            profiled: false,
        };
        jit.link_entries()?;
        jit.compile_time = start.elapsed();
        Ok(Some((jit, manifest.meta)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_round_trip_and_anything_else_is_a_miss() {
        let sig = Signature::decode("f", "in x f32 4;out out0 f32 4;site 1 a%20b.dl 3 7").unwrap();
        let mut signatures = HashMap::new();
        signatures.insert("f".to_string(), Ok(sig.clone()));
        signatures.insert(
            "g".to_string(),
            Err(CodegenError::Arguments("a tuple\nof 100% nothing".into())),
        );
        let objects = vec!["ab".repeat(32), "cd".repeat(32)];
        let entries = vec!["dlc_jit_f.entry".to_string()];
        let meta = "entry f\nparam x\n";
        let text = Manifest::write(&objects, &entries, &signatures, meta);
        let m = Manifest::read(&text).unwrap();
        assert_eq!(m.objects, objects);
        assert_eq!(m.entries, entries);
        assert_eq!(m.meta, meta);
        assert_eq!(m.signatures["f"].as_ref().unwrap(), &sig);
        assert_eq!(
            m.signatures["g"].as_ref().unwrap_err().to_string(),
            "a tuple\nof 100% nothing"
        );
        // Cut short, or not a manifest: a miss, not an error.
        assert!(Manifest::read(&text[..text.find("meta").unwrap()]).is_none());
        assert!(Manifest::read("dlc program\nobject a b\nmeta\n").is_none());
        assert!(Manifest::read("something else\nmeta\n").is_none());
    }
}
