//! Running an entry point compiled for an NVIDIA GPU.
//!
//! The code generator makes PTX kernels and, for each entry point, a
//! [`GpuFunction`]: the device buffers it uses (its parameters, a
//! workspace holding every intermediate at a planned offset, constant
//! data) and the kernel launches in order. [`Prepared`] carries that out
//! on a [`Device`]: CUDA through cudarc (`crate::cuda`), or the emulator
//! that runs the same kernels on CPU threads in the code generator's
//! tests. Inputs are copied in once per call, the kernels run in order on
//! one stream, results are copied back, and the status word the kernels
//! write (an integer division by zero, with its source place) becomes an
//! error.
//!
//! # In detail
//!
//! **GPUs** (`runtime/src/gpu.rs`, `runtime/src/cuda.rs`). A program compiled for a GPU is
//! a `GpuProgram`: the PTX and, per entry point, a `GpuFunction` (buffers and launches,
//! see the GPU back end). `gpu::Prepared` carries one out on any `gpu::Device`: it copies
//! the constants and allocates the workspace once, `bind` checks the inputs as a CPU call
//! does and copies them in, `run` zeroes the status word, launches every kernel in order on
//! one stream, waits, and turns the status into an error (a failing launch names its
//! kernel), `outputs` copies the results back. `cuda::Cuda` is the device of CUDA's driver
//! API through cudarc with dynamic loading: building needs no CUDA toolkit and no GPU;
//! `Cuda::open` first asks whether `libcuda.so` can be loaded and returns "no CUDA driver
//! found" (or cudarc's "no CUDA device" error) instead of letting cudarc panic, loads the
//! PTX (the driver compiles it for the device), and raises each kernel's shared-memory
//! limit where it needs to. `dlc run --backend gpu` picks the target from the device's
//! compute capability (8.x: sm_80, 9.0 and later: sm_90) and `dlc bench --backend gpu`
//! times calls with inputs bound once.

use crate::abi::{Signature, status_message};
use crate::call::{AlignedBuffer, RuntimeError, lay_out, results};
use crate::tensor::HostTensor;

/// A module compiled for a GPU: its PTX and how to run each entry point.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuProgram {
    /// The kernels, as PTX text.
    pub ptx: String,
    /// One per entry point.
    pub functions: Vec<GpuFunction>,
}

impl GpuProgram {
    /// Entry point `name`.
    pub fn function(&self, name: &str) -> Result<&GpuFunction, RuntimeError> {
        self.functions
            .iter()
            .find(|f| f.signature.name == name)
            .ok_or_else(|| RuntimeError::Load(format!("no entry point `{name}` was compiled")))
    }
}

/// What the host does to run one entry point.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuFunction {
    /// Its parameters (inputs, then results) and failure sites; `name` is
    /// the entry point's.
    pub signature: Signature,
    /// Bytes of the workspace holding the intermediates.
    pub workspace: u64,
    /// The buffers kernels are given, by index.
    pub buffers: Vec<DeviceBuffer>,
    /// The kernels to launch, in order.
    pub launches: Vec<Launch>,
}

/// A buffer a kernel reads or writes.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceBuffer {
    /// Parameter `i` of the entry point.
    Param(usize),
    /// The workspace, from this byte offset.
    Workspace(u64),
    /// Read-only data (a constant tensor), copied to the device once.
    Constant(Vec<u8>),
}

/// One kernel launch: a one-dimensional grid of blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The kernel's symbol in the PTX.
    pub kernel: String,
    /// Blocks (the tile kernel's programs).
    pub blocks: u32,
    /// Threads per block.
    pub threads: u32,
    /// Bytes of dynamic shared memory per block.
    pub shared_bytes: u32,
    /// The kernel's buffer arguments, indices into
    /// [`GpuFunction::buffers`]; the status word's address follows them.
    pub args: Vec<usize>,
}

/// A machine kernels run on.
pub trait Device {
    /// Device memory.
    type Memory;
    /// `bytes` zeroed bytes of device memory.
    fn alloc(&mut self, bytes: usize) -> Result<Self::Memory, RuntimeError>;
    /// Copies `from` to the start of `to`.
    fn upload(&mut self, to: &mut Self::Memory, from: &[u8]) -> Result<(), RuntimeError>;
    /// Copies the start of `from` into `to`.
    fn download(&mut self, from: &Self::Memory, to: &mut [u8]) -> Result<(), RuntimeError> {
        self.download_from(from, 0, to)
    }
    /// Copies the bytes of `from` from byte `offset` on into `to`.
    fn download_from(
        &mut self,
        from: &Self::Memory,
        offset: usize,
        to: &mut [u8],
    ) -> Result<(), RuntimeError>;
    /// The device address of `m`.
    fn address(&self, m: &Self::Memory) -> u64;
    /// Launches `launch` with these argument addresses (the buffers, then
    /// the status word).
    fn launch(&mut self, launch: &Launch, args: &[u64]) -> Result<(), RuntimeError>;
    /// Waits for every launch to finish.
    fn synchronize(&mut self) -> Result<(), RuntimeError>;
}

/// Sums of device memory over the ranks of a data-parallel run, started
/// as a computation produces them and finished before what reads them.
pub trait Collective<D: Device> {
    /// The ranks taking part.
    fn ranks(&self) -> usize;
    /// What sums, in words (`NCCL`).
    fn name(&self) -> &'static str;
    /// Starts replacing the `count` f32 at device address `addr`, in place,
    /// with their sums over the ranks, once everything launched on `device`
    /// so far has run; the memory is neither written nor read until
    /// [`Collective::finish`].
    fn start_sum(&mut self, device: &mut D, addr: u64, count: usize) -> Result<(), RuntimeError>;
    /// Makes what is launched on `device` from now on wait for every sum
    /// started.
    fn finish(&mut self, device: &mut D) -> Result<(), RuntimeError>;
}

/// A world of one: every sum is the tensor itself.
pub struct Alone;

impl<D: Device> Collective<D> for Alone {
    fn ranks(&self) -> usize {
        1
    }

    fn name(&self) -> &'static str {
        "nothing (a world of one)"
    }

    fn start_sum(&mut self, _: &mut D, _: u64, _: usize) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn finish(&mut self, _: &mut D) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// An entry point ready to run on a device: its constants copied and its
/// workspace allocated once, then calls bound and run any number of times.
pub struct Prepared<'f, D: Device> {
    function: &'f GpuFunction,
    /// Each buffer's memory, for constants (others are `None`).
    constants: Vec<Option<D::Memory>>,
    workspace: Option<D::Memory>,
    status: D::Memory,
    /// The parameters of the bound call, and the host copies of them.
    params: Vec<D::Memory>,
    host: Vec<AlignedBuffer>,
}

impl<'f, D: Device> Prepared<'f, D> {
    /// Copies `function`'s constants to `device` and allocates its
    /// workspace.
    pub fn new(device: &mut D, function: &'f GpuFunction) -> Result<Self, RuntimeError> {
        let mut constants = Vec::with_capacity(function.buffers.len());
        for b in &function.buffers {
            constants.push(match b {
                DeviceBuffer::Constant(data) => {
                    let mut m = device.alloc(data.len().max(1))?;
                    device.upload(&mut m, data)?;
                    Some(m)
                }
                _ => None,
            });
        }
        let workspace = match function.workspace {
            0 => None,
            n => Some(device.alloc(usize::try_from(n).map_err(|_| {
                RuntimeError::Arguments(format!("a workspace of {n} bytes is too large"))
            })?)?),
        };
        let status = device.alloc(4)?;
        Ok(Prepared {
            function,
            constants,
            workspace,
            status,
            params: Vec::new(),
            host: Vec::new(),
        })
    }

    /// Checks `inputs` against the signature and copies them to the device.
    pub fn bind(&mut self, device: &mut D, inputs: &[HostTensor]) -> Result<(), RuntimeError> {
        let host = lay_out(&self.function.signature, inputs)?;
        let mut params = Vec::with_capacity(host.len());
        for b in &host {
            let mut m = device.alloc(b.bytes().len().max(1))?;
            device.upload(&mut m, b.bytes())?;
            params.push(m);
        }
        self.params = params;
        self.host = host;
        Ok(())
    }

    /// Runs every kernel once on the bound inputs and waits for them.
    pub fn run(&mut self, device: &mut D) -> Result<(), RuntimeError> {
        self.run_with(device, false, |_, _| {})
    }

    /// Milliseconds of `runs` calls on the bound inputs, each waited for,
    /// after `warmup` untimed ones, sorted (what `dlc bench --backend gpu`
    /// and `dlc-rt bench` report).
    pub fn time_runs(
        &mut self,
        device: &mut D,
        warmup: usize,
        runs: usize,
    ) -> Result<Vec<f64>, RuntimeError> {
        for _ in 0..warmup {
            self.run(device)?;
        }
        let mut ms = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = std::time::Instant::now();
            self.run(device)?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        ms.sort_by(f64::total_cmp);
        Ok(ms)
    }

    /// Runs like [`Prepared::run`], waiting for each kernel before the next
    /// and telling `each` the launch's index and the seconds from its
    /// launch to its end (launch overhead included): where a call's time
    /// goes, without a profiler.
    pub fn run_timed(
        &mut self,
        device: &mut D,
        each: impl FnMut(usize, f64),
    ) -> Result<(), RuntimeError> {
        self.run_with(device, true, each)
    }

    fn run_with(
        &mut self,
        device: &mut D,
        timed: bool,
        each: impl FnMut(usize, f64),
    ) -> Result<(), RuntimeError> {
        let f = self.function;
        if self.params.len() != f.signature.params.len() {
            return Err(RuntimeError::Arguments(format!(
                "`{}`: no inputs were bound",
                f.signature.name
            )));
        }
        let params: Vec<u64> = self.params.iter().map(|m| device.address(m)).collect();
        self.launch_with(device, &params, timed, each)?;
        self.check(device)
    }

    /// Launches every kernel on parameters at the device addresses
    /// `params` (one per parameter of the signature: inputs, then results,
    /// each of its type's size) instead of bound ones, without waiting:
    /// for a caller that owns the tensors and chains calls on them.
    /// [`Prepared::check`] waits and reports the call's failure.
    pub fn launch_at(&mut self, device: &mut D, params: &[u64]) -> Result<(), RuntimeError> {
        let f = self.function;
        if params.len() != f.signature.params.len() {
            return Err(RuntimeError::Arguments(format!(
                "`{}` takes {} parameters (inputs and results), given {}",
                f.signature.name,
                f.signature.params.len(),
                params.len()
            )));
        }
        self.launch_with(device, params, false, |_, _| {})
    }

    /// Waits for the kernels launched so far and turns the status word of
    /// this entry point's last call into its error.
    pub fn check(&mut self, device: &mut D) -> Result<(), RuntimeError> {
        let f = self.function;
        device.synchronize().map_err(|e| {
            RuntimeError::Failed(format!("`{}`: running its kernels: {e}", f.signature.name))
        })?;
        let mut word = [0u8; 4];
        device.download(&self.status, &mut word)?;
        match status_message(i32::from_le_bytes(word), &f.signature.site_places()) {
            None => Ok(()),
            Some(m) => Err(RuntimeError::Failed(format!("`{}`: {m}", f.signature.name))),
        }
    }

    fn launch_with(
        &mut self,
        device: &mut D,
        params: &[u64],
        timed: bool,
        mut each: impl FnMut(usize, f64),
    ) -> Result<(), RuntimeError> {
        let f = self.function;
        device.upload(&mut self.status, &0i32.to_le_bytes())?;
        let status = device.address(&self.status);
        for (k, launch) in f.launches.iter().enumerate() {
            let mut args = Vec::with_capacity(launch.args.len() + 1);
            for &i in &launch.args {
                args.push(self.address(device, params, i)?);
            }
            args.push(status);
            let failed = |e: RuntimeError| {
                RuntimeError::Failed(format!(
                    "`{}`: kernel {} (launch {k}): {e}",
                    f.signature.name, launch.kernel
                ))
            };
            let start = std::time::Instant::now();
            device.launch(launch, &args).map_err(failed)?;
            if timed {
                device.synchronize().map_err(failed)?;
                each(k, start.elapsed().as_secs_f64());
            }
        }
        Ok(())
    }

    /// The results of the last run, copied back.
    pub fn outputs(&mut self, device: &mut D) -> Result<Vec<HostTensor>, RuntimeError> {
        for (i, p) in self.function.signature.params.iter().enumerate() {
            if p.output {
                let (host, dev) = (&mut self.host[i], &self.params[i]);
                device.download(dev, host.bytes_mut())?;
            }
        }
        results(&self.function.signature, &self.host)
    }

    /// Binds `inputs`, runs and returns the results.
    pub fn call(
        &mut self,
        device: &mut D,
        inputs: &[HostTensor],
    ) -> Result<Vec<HostTensor>, RuntimeError> {
        self.bind(device, inputs)?;
        self.run(device)?;
        self.outputs(device)
    }

    /// The device address of buffer `i`, the parameters at `params`.
    fn address(&self, device: &D, params: &[u64], i: usize) -> Result<u64, RuntimeError> {
        let missing = || RuntimeError::Load(format!("buffer {i} of a launch is not planned"));
        match self.function.buffers.get(i).ok_or_else(missing)? {
            DeviceBuffer::Param(p) => params.get(*p).copied().ok_or_else(missing),
            DeviceBuffer::Workspace(off) => {
                let w = self.workspace.as_ref().ok_or_else(missing)?;
                Ok(device.address(w) + off)
            }
            DeviceBuffer::Constant(_) => Ok(device.address(
                self.constants
                    .get(i)
                    .and_then(Option::as_ref)
                    .ok_or_else(missing)?,
            )),
        }
    }
}
