//! A compiled GPU module as a file (`dlc compile --target sm_90 --emit
//! gpu-module -o model.dlcm`): everything a program needs to run the entry
//! points on an NVIDIA GPU with no compiler present, which `dlc-rt` and a
//! program embedding it load.
//!
//! The file is a fixed header and a payload:
//!
//! | bytes | what |
//! |---|---|
//! | 8 | magic `DLCGPUM\0` |
//! | 4 | format version ([`FORMAT_VERSION`]), little-endian |
//! | 8 | payload length in bytes, little-endian |
//! | 32 | SHA-256 of the payload |
//! | n | payload |
//!
//! The payload is a sequence of little-endian integers and length-prefixed
//! byte strings (a `u64` length, then the bytes): the GPU target's name, the
//! compute capability it needs, whether f32 products use TF32, the PTX of
//! every kernel, then per entry point its signature
//! ([`Signature::encode`]), its workspace size, its buffers (parameters,
//! workspace offsets, constant data), its launches in order (kernel symbol,
//! grid, block, dynamic shared memory, buffer arguments) and how each input
//! is drawn for `--random-inputs` ([`RandomRange`]) and each result's `--check`
//! tolerance. GPU kernels read
//! weights as they are given: unlike CPU code, an entry point has no
//! preparer, and a signature naming one is refused.
//!
//! Reading checks the magic, the version, the length and the checksum before
//! anything else, then that every index in the plan points at something:
//! a truncated, corrupted or foreign file is an error naming the file, never
//! a crash.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::abi::Signature;
use crate::call::RuntimeError;
use crate::gpu::{DeviceBuffer, GpuFunction, GpuProgram, Launch};
use crate::tensor::{HostTensor, RandomRange, seeded_rng};

/// The first bytes of every module file.
pub const MAGIC: &[u8; 8] = b"DLCGPUM\0";
/// The format version this runtime writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Magic, version, payload length, checksum.
const HEADER: usize = 8 + 4 + 8 + 32;

/// A compiled GPU module: the program and what a runner needs besides it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuModule {
    /// The GPU target it was compiled for (`sm_90`).
    pub target: String,
    /// The compute capability the PTX needs (`(9, 0)`): a device below it
    /// is refused.
    pub capability: (u32, u32),
    /// Whether f32 products run on tensor cores as TF32.
    pub tf32: bool,
    /// The kernels and each entry point's launch plan.
    pub program: GpuProgram,
    /// What a runner needs of each entry point besides its launch plan, in
    /// the order of `program.functions`.
    pub entries: Vec<EntryInfo>,
}

/// What a runner needs of an entry point besides its launch plan: what the
/// compiler knows from the graph.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EntryInfo {
    /// How each input is drawn by `--random-inputs`.
    pub random: Vec<RandomRange>,
    /// Each result's `--check` tolerance against the reference interpreter
    /// (`dlc_driver::check_tolerances_with`).
    pub tolerances: Vec<f64>,
}

impl GpuModule {
    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let no_record = EntryInfo::default();
        let mut w = Writer::default();
        w.str(&self.target);
        w.u32(self.capability.0);
        w.u32(self.capability.1);
        w.u8(u8::from(self.tf32));
        w.str(&self.program.ptx);
        w.u64(self.program.functions.len() as u64);
        for (k, f) in self.program.functions.iter().enumerate() {
            w.str(&f.signature.name);
            w.str(&f.signature.encode());
            w.u64(f.workspace);
            w.u64(f.buffers.len() as u64);
            for b in &f.buffers {
                match b {
                    DeviceBuffer::Param(p) => {
                        w.u8(0);
                        w.u64(*p as u64);
                    }
                    DeviceBuffer::Workspace(offset) => {
                        w.u8(1);
                        w.u64(*offset);
                    }
                    DeviceBuffer::Constant(data) => {
                        w.u8(2);
                        w.bytes(data);
                    }
                }
            }
            w.u64(f.launches.len() as u64);
            for l in &f.launches {
                w.str(&l.kernel);
                w.u32(l.blocks);
                w.u32(l.threads);
                w.u32(l.shared_bytes);
                w.u64(l.args.len() as u64);
                for &a in &l.args {
                    w.u64(a as u64);
                }
            }
            // A module whose records are missing writes empty ones, which
            // reading refuses (`check`).
            let info = self.entries.get(k).unwrap_or(&no_record);
            w.u64(info.random.len() as u64);
            for r in &info.random {
                match r {
                    RandomRange::Unit => w.u8(0),
                    RandomRange::Positive => w.u8(1),
                    RandomRange::Weight(s) => {
                        w.u8(2);
                        w.u64(s.to_bits());
                    }
                }
            }
            w.u64(info.tolerances.len() as u64);
            for t in &info.tolerances {
                w.u64(t.to_bits());
            }
        }
        let payload = w.0;
        let mut out = Vec::with_capacity(HEADER + payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&Sha256::digest(&payload));
        out.extend_from_slice(&payload);
        out
    }

    /// Reads a module from its bytes; `name` (the file) is what errors
    /// name.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<GpuModule, RuntimeError> {
        let bad = |what: String| RuntimeError::Load(format!("{name}: {what}"));
        if bytes.len() < 8 || &bytes[..8] != MAGIC {
            return Err(bad(
                "not a dlc GPU module (made by `dlc compile --emit gpu-module`)".into(),
            ));
        }
        if bytes.len() < HEADER {
            return Err(bad(format!(
                "truncated: {} bytes, shorter than the header",
                bytes.len()
            )));
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version != FORMAT_VERSION {
            return Err(bad(format!(
                "module format version {version}; this runtime reads version {FORMAT_VERSION} \
                 (compile it again with the dlc of this runtime)"
            )));
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&bytes[12..20]);
        let len = u64::from_le_bytes(len);
        let payload = &bytes[HEADER..];
        if payload.len() as u64 != len {
            return Err(bad(format!(
                "truncated or extended: the header says {len} bytes of payload, the file has {}",
                payload.len()
            )));
        }
        if Sha256::digest(payload).as_slice() != &bytes[20..HEADER] {
            return Err(bad("corrupted: its checksum does not match".into()));
        }
        let mut r = Reader {
            bytes: payload,
            at: 0,
        };
        let decoded =
            decode(&mut r).map_err(|e| bad(format!("malformed at byte {}: {e}", r.at)))?;
        check(&decoded).map_err(bad)?;
        Ok(decoded)
    }

    /// Reads the module file at `path`.
    pub fn read(path: &Path) -> Result<GpuModule, RuntimeError> {
        let bytes = std::fs::read(path)
            .map_err(|e| RuntimeError::Load(format!("{}: {e}", path.display())))?;
        GpuModule::from_bytes(&path.display().to_string(), &bytes)
    }

    /// Entry point `name` and what the compiler recorded of it.
    pub fn entry(&self, name: &str) -> Result<(&GpuFunction, &EntryInfo), RuntimeError> {
        let k = self
            .program
            .functions
            .iter()
            .position(|f| f.signature.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.entry_names().collect();
                RuntimeError::Arguments(format!(
                    "no entry point `{name}` in the module (it has {})",
                    names.join(", ")
                ))
            })?;
        Ok((&self.program.functions[k], &self.entries[k]))
    }

    /// The entry points' names, in order.
    pub fn entry_names(&self) -> impl Iterator<Item = &str> {
        self.program
            .functions
            .iter()
            .map(|f| f.signature.name.as_str())
    }
}

impl EntryInfo {
    /// The inputs of `f` (whose record this is) in order: `files` (input
    /// name, `.npy` path) where given, the rest drawn from `seed` exactly
    /// as `dlc run --random-inputs SEED` draws them. Every input is drawn,
    /// so that one's values do not depend on which others came from files.
    pub fn inputs(
        &self,
        f: &GpuFunction,
        files: &[(String, PathBuf)],
        seed: Option<u64>,
    ) -> Result<Vec<HostTensor>, RuntimeError> {
        let name = &f.signature.name;
        let mut given: HashMap<&str, &Path> = HashMap::new();
        for (input, path) in files {
            if !f.signature.inputs().any(|p| &p.name == input) {
                let names: Vec<&str> = f.signature.inputs().map(|p| p.name.as_str()).collect();
                return Err(RuntimeError::Arguments(format!(
                    "`{name}` has no input `{input}` (its inputs: {})",
                    names.join(", ")
                )));
            }
            if given.insert(input, path).is_some() {
                return Err(RuntimeError::Arguments(format!(
                    "input `{input}` is given twice"
                )));
            }
        }
        let missing: Vec<&str> = f
            .signature
            .inputs()
            .map(|p| p.name.as_str())
            .filter(|p| !given.contains_key(p))
            .collect();
        if seed.is_none() && !missing.is_empty() {
            return Err(RuntimeError::Arguments(format!(
                "missing input(s) for `{name}`: {}; pass --input NAME=FILE.npy for each, or \
                 --random-inputs SEED",
                missing.join(", ")
            )));
        }
        let mut rng = seeded_rng(seed.unwrap_or(0));
        let mut inputs = Vec::new();
        for (p, &range) in f.signature.inputs().zip(&self.random) {
            let random = HostTensor::random_values_in(&p.ty, range, &mut rng);
            match given.get(p.name.as_str()) {
                Some(path) => {
                    random.for_each(drop);
                    let t = HostTensor::read_npy(path, Some(p.ty.dtype))?;
                    if t.ty != p.ty {
                        return Err(RuntimeError::Arguments(format!(
                            "input `{}` must be {}, got {} from {}",
                            p.name,
                            p.ty,
                            t.ty,
                            path.display()
                        )));
                    }
                    inputs.push(t);
                }
                None => inputs.push(HostTensor::new(p.ty.clone(), random.collect())?),
            }
        }
        Ok(inputs)
    }
}

fn decode(r: &mut Reader<'_>) -> Result<GpuModule, String> {
    let target = r.str()?;
    let capability = (r.u32()?, r.u32()?);
    let tf32 = match r.u8()? {
        0 => false,
        1 => true,
        b => return Err(format!("a flag of {b}")),
    };
    let ptx = r.str()?;
    let n = r.count()?;
    let mut functions = Vec::new();
    let mut entries = Vec::new();
    for _ in 0..n {
        let name = r.str()?;
        let signature = Signature::decode(&name, &r.str()?)?;
        let workspace = r.u64()?;
        let mut buffers = Vec::new();
        for _ in 0..r.count()? {
            buffers.push(match r.u8()? {
                0 => DeviceBuffer::Param(r.index()?),
                1 => DeviceBuffer::Workspace(r.u64()?),
                2 => DeviceBuffer::Constant(r.bytes()?.to_vec()),
                t => return Err(format!("a buffer of kind {t}")),
            });
        }
        let mut launches = Vec::new();
        for _ in 0..r.count()? {
            let kernel = r.str()?;
            let (blocks, threads, shared_bytes) = (r.u32()?, r.u32()?, r.u32()?);
            let mut args = Vec::new();
            for _ in 0..r.count()? {
                args.push(r.index()?);
            }
            launches.push(Launch {
                kernel,
                blocks,
                threads,
                shared_bytes,
                args,
            });
        }
        let mut ranges = Vec::new();
        for _ in 0..r.count()? {
            ranges.push(match r.u8()? {
                0 => RandomRange::Unit,
                1 => RandomRange::Positive,
                2 => RandomRange::Weight(f64::from_bits(r.u64()?)),
                t => return Err(format!("a random range of kind {t}")),
            });
        }
        let mut tolerances = Vec::new();
        for _ in 0..r.count()? {
            tolerances.push(f64::from_bits(r.u64()?));
        }
        functions.push(GpuFunction {
            signature,
            workspace,
            buffers,
            launches,
        });
        entries.push(EntryInfo {
            random: ranges,
            tolerances,
        });
    }
    if r.at != r.bytes.len() {
        return Err(format!("{} bytes left over", r.bytes.len() - r.at));
    }
    Ok(GpuModule {
        target,
        capability,
        tf32,
        program: GpuProgram { ptx, functions },
        entries,
    })
}

/// Every index of the plan points at something, and nothing needs what
/// this runtime cannot do.
fn check(m: &GpuModule) -> Result<(), String> {
    if m.entries.len() != m.program.functions.len() {
        return Err(format!(
            "{} entry records for {} entry points",
            m.entries.len(),
            m.program.functions.len()
        ));
    }
    for (f, info) in m.program.functions.iter().zip(&m.entries) {
        let name = &f.signature.name;
        if let Some(p) = &f.signature.prepare {
            return Err(format!(
                "entry `{name}` names a weight preparer `{p}`, which GPU modules do not have"
            ));
        }
        if info.random.len() != f.signature.inputs().count() {
            return Err(format!(
                "entry `{name}`: {} random ranges for {} inputs",
                info.random.len(),
                f.signature.inputs().count()
            ));
        }
        if info.tolerances.len() != f.signature.outputs().count() {
            return Err(format!(
                "entry `{name}`: {} tolerances for {} results",
                info.tolerances.len(),
                f.signature.outputs().count()
            ));
        }
        for b in &f.buffers {
            match b {
                DeviceBuffer::Param(p) if *p >= f.signature.params.len() => {
                    return Err(format!(
                        "entry `{name}`: a buffer is parameter {p}, of none"
                    ));
                }
                DeviceBuffer::Workspace(o) if *o >= f.workspace.max(1) => {
                    return Err(format!(
                        "entry `{name}`: a buffer at workspace offset {o}, past its {} bytes",
                        f.workspace
                    ));
                }
                _ => {}
            }
        }
        for l in &f.launches {
            if let Some(a) = l.args.iter().find(|&&a| a >= f.buffers.len()) {
                return Err(format!(
                    "entry `{name}`: kernel {} is given buffer {a} of {}",
                    l.kernel,
                    f.buffers.len()
                ));
            }
            if l.blocks == 0 || l.threads == 0 {
                return Err(format!(
                    "entry `{name}`: kernel {} is launched with an empty grid or block",
                    l.kernel
                ));
            }
        }
    }
    Ok(())
}

#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
}

struct Reader<'b> {
    bytes: &'b [u8],
    at: usize,
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: u64) -> Result<&'b [u8], String> {
        let left = self.bytes.len() - self.at;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| format!("{n} bytes asked for, {left} left"))?;
        let b = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    /// An index or a count: a `u64` that fits the address space.
    fn index(&mut self) -> Result<usize, String> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| format!("an index of {v}"))
    }
    /// A count of items that each take at least one byte, so a corrupted
    /// count cannot ask for more memory than the file holds.
    fn count(&mut self) -> Result<usize, String> {
        let n = self.index()?;
        let left = self.bytes.len() - self.at;
        if n > left {
            return Err(format!("a count of {n} with {left} bytes left"));
        }
        Ok(n)
    }
    fn bytes(&mut self) -> Result<&'b [u8], String> {
        let n = self.u64()?;
        self.take(n)
    }
    fn str(&mut self) -> Result<String, String> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| "text that is not UTF-8".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::Param;
    use dlc_core::{DType, TensorType};

    fn module() -> GpuModule {
        let ty = TensorType {
            dtype: DType::F32,
            shape: vec![4, 8],
        };
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
                ptx: "// kernels\n.version 8.0\n".into(),
                functions: vec![GpuFunction {
                    signature: Signature {
                        name: "f".into(),
                        params: vec![param("x", false), param("w", false), param("out0", true)],
                        sites: Vec::new(),
                        prepare: None,
                    },
                    workspace: 256,
                    buffers: vec![
                        DeviceBuffer::Param(0),
                        DeviceBuffer::Param(1),
                        DeviceBuffer::Workspace(128),
                        DeviceBuffer::Constant(vec![1, 2, 3]),
                        DeviceBuffer::Param(2),
                    ],
                    launches: vec![
                        Launch {
                            kernel: "dlc_f_k0".into(),
                            blocks: 4,
                            threads: 128,
                            shared_bytes: 0,
                            args: vec![0, 3, 2],
                        },
                        Launch {
                            kernel: "dlc_f_k1".into(),
                            blocks: 1,
                            threads: 32,
                            shared_bytes: 64 << 10,
                            args: vec![2, 1, 4],
                        },
                    ],
                }],
            },
            entries: vec![EntryInfo {
                random: vec![RandomRange::Unit, RandomRange::Weight(0.125)],
                tolerances: vec![1e-4],
            }],
        }
    }

    #[test]
    fn a_module_reads_back_as_written() {
        let m = module();
        let bytes = m.to_bytes();
        assert_eq!(&bytes[..8], MAGIC);
        assert_eq!(GpuModule::from_bytes("m.dlcm", &bytes).unwrap(), m);
    }

    #[test]
    fn damaged_files_are_refused_with_the_reason() {
        let bytes = module().to_bytes();
        let err = |b: &[u8]| GpuModule::from_bytes("m.dlcm", b).unwrap_err().to_string();
        assert!(err(b"\x7fELF....").contains("m.dlcm: not a dlc GPU module"));
        assert!(err(&bytes[..30]).contains("shorter than the header"));
        assert!(err(&bytes[..bytes.len() - 1]).contains("truncated or extended"));
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(err(&flipped).contains("corrupted: its checksum does not match"));
        let mut newer = bytes.clone();
        newer[8] = 2;
        assert!(err(&newer).contains("module format version 2; this runtime reads version 1"));
    }

    /// A file whose checksum matches but whose plan is inconsistent (as a
    /// writer with a bug would make) is refused, not run.
    #[test]
    fn an_inconsistent_plan_is_refused() {
        let mut m = module();
        m.program.functions[0].launches[1].args[0] = 9;
        let e = GpuModule::from_bytes("m.dlcm", &m.to_bytes()).unwrap_err();
        assert!(
            e.to_string()
                .contains("kernel dlc_f_k1 is given buffer 9 of 5"),
            "{e}"
        );
        let mut m = module();
        m.entries[0].random.pop();
        let e = GpuModule::from_bytes("m.dlcm", &m.to_bytes()).unwrap_err();
        assert!(
            e.to_string().contains("1 random ranges for 2 inputs"),
            "{e}"
        );
        let mut m = module();
        m.program.functions[0].signature.prepare = Some("f_prepare".into());
        let e = GpuModule::from_bytes("m.dlcm", &m.to_bytes()).unwrap_err();
        assert!(e.to_string().contains("weight preparer"), "{e}");
    }

    /// Every truncation of the payload, with the header made to match, is
    /// an error and never a panic.
    #[test]
    fn every_truncated_payload_is_an_error() {
        let bytes = module().to_bytes();
        let payload = &bytes[HEADER..];
        for n in 0..payload.len() {
            let p = &payload[..n];
            let mut b = Vec::new();
            b.extend_from_slice(MAGIC);
            b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
            b.extend_from_slice(&(n as u64).to_le_bytes());
            b.extend_from_slice(&Sha256::digest(p));
            b.extend_from_slice(p);
            assert!(GpuModule::from_bytes("m.dlcm", &b).is_err(), "{n} bytes");
        }
    }

    #[test]
    fn entries_are_found_by_name() {
        let m = module();
        assert_eq!(m.entry("f").unwrap().1.random.len(), 2);
        let e = m.entry("g").unwrap_err().to_string();
        assert_eq!(e, "no entry point `g` in the module (it has f)");
    }
}
