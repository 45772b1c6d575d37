//! CUDA through cudarc: the [`Device`] programs compiled for an NVIDIA GPU
//! run on. The driver library (`libcuda.so`) is loaded when first asked
//! for, so building and running everything else needs no CUDA installed;
//! without a driver or a device, [`Cuda::open`] says so as an error.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::call::RuntimeError;
use crate::gpu::{Device, GpuProgram, Launch};

/// Shared memory a kernel may use without asking for more.
const DEFAULT_SHARED: u32 = 48 << 10;

/// A GPU (GPU 0 unless opened by ordinal), with a program's kernels loaded.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The loaded kernels (each keeps its module loaded).
    functions: HashMap<String, CudaFunction>,
}

fn failed(what: &str) -> impl Fn(cudarc::driver::DriverError) -> RuntimeError + '_ {
    move |e| RuntimeError::Load(format!("{what}: {e}"))
}

impl Cuda {
    /// Opens GPU 0: fails, without panicking, when no CUDA driver can be
    /// loaded or no device is present.
    pub fn open() -> Result<Cuda, RuntimeError> {
        Self::open_ordinal(0)
    }

    /// Opens GPU `ordinal` of this machine's (CUDA's numbering): fails,
    /// without panicking, when there is no driver or no such device.
    pub fn open_ordinal(ordinal: usize) -> Result<Cuda, RuntimeError> {
        // SAFETY: this only tries to load the driver library by name.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(RuntimeError::Load(
                "no CUDA driver found (libcuda.so could not be loaded): running GPU code needs \
                 an NVIDIA GPU and its driver"
                    .into(),
            ));
        }
        let count = CudaContext::device_count().map_err(failed("no CUDA device"))?;
        if i64::from(count) <= ordinal as i64 {
            return Err(RuntimeError::Load(format!(
                "no CUDA device {ordinal}: this machine has {count} GPU(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(failed("no CUDA device"))?;
        let stream = ctx.default_stream();
        Ok(Cuda {
            ctx,
            stream,
            functions: HashMap::new(),
        })
    }

    /// The stream every launch and copy is made on, in order.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's name and compute capability (`(9, 0)`).
    pub fn describe(&self) -> Result<(String, (i32, i32)), RuntimeError> {
        Ok((
            self.ctx.name().map_err(failed("the device's name"))?,
            self.ctx
                .compute_capability()
                .map_err(failed("the device's compute capability"))?,
        ))
    }

    /// Loads a compiled module's kernels, after checking that this device
    /// has the compute capability its PTX needs.
    pub fn load_module(&mut self, module: &crate::module::GpuModule) -> Result<(), RuntimeError> {
        let (name, (major, minor)) = self.describe()?;
        let (need_major, need_minor) = module.capability;
        if (i64::from(major), i64::from(minor)) < (i64::from(need_major), i64::from(need_minor)) {
            return Err(RuntimeError::Load(format!(
                "the module is compiled for {} (compute capability {need_major}.{need_minor}); \
                 GPU 0 ({name}) has {major}.{minor}: compile it for that GPU's target",
                module.target
            )));
        }
        self.load(&module.program)
    }

    /// Loads `program`'s PTX (the driver compiles it for this device) and
    /// looks up every kernel it launches.
    pub fn load(&mut self, program: &GpuProgram) -> Result<(), RuntimeError> {
        let module = self
            .ctx
            .load_module(Ptx::from_src(program.ptx.clone()))
            .map_err(failed("loading the PTX"))?;
        let mut functions = HashMap::new();
        for f in &program.functions {
            for l in &f.launches {
                if functions.contains_key(&l.kernel) {
                    continue;
                }
                let k = module
                    .load_function(&l.kernel)
                    .map_err(|e| RuntimeError::Load(format!("kernel {}: {e}", l.kernel)))?;
                if l.shared_bytes > DEFAULT_SHARED {
                    k.set_attribute(
                        CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        l.shared_bytes as i32,
                    )
                    .map_err(|e| {
                        RuntimeError::Load(format!(
                            "kernel {}: {} bytes of shared memory: {e}",
                            l.kernel, l.shared_bytes
                        ))
                    })?;
                }
                functions.insert(l.kernel.clone(), k);
            }
        }
        self.functions = functions;
        Ok(())
    }
}

impl Device for Cuda {
    type Memory = CudaSlice<u8>;

    fn alloc(&mut self, bytes: usize) -> Result<CudaSlice<u8>, RuntimeError> {
        self.stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| RuntimeError::Failed(format!("allocating {bytes} bytes on the GPU: {e}")))
    }

    fn upload(&mut self, to: &mut CudaSlice<u8>, from: &[u8]) -> Result<(), RuntimeError> {
        let mut view = to.slice_mut(..from.len());
        self.stream
            .memcpy_htod(from, &mut view)
            .map_err(|e| RuntimeError::Failed(format!("copying to the GPU: {e}")))
    }

    fn download_from(
        &mut self,
        from: &CudaSlice<u8>,
        offset: usize,
        to: &mut [u8],
    ) -> Result<(), RuntimeError> {
        let end = offset + to.len();
        if end > from.len() {
            return Err(RuntimeError::Arguments(format!(
                "a copy of bytes {offset}..{end} from a GPU buffer of {}",
                from.len()
            )));
        }
        let view = from.slice(offset..end);
        self.stream
            .memcpy_dtoh(&view, to)
            .map_err(|e| RuntimeError::Failed(format!("copying from the GPU: {e}")))
    }

    fn address(&self, m: &CudaSlice<u8>) -> u64 {
        let (p, _sync) = m.device_ptr(&self.stream);
        p
    }

    fn launch(&mut self, launch: &Launch, args: &[u64]) -> Result<(), RuntimeError> {
        let f = self
            .functions
            .get(&launch.kernel)
            .ok_or_else(|| RuntimeError::Load(format!("kernel {} is not loaded", launch.kernel)))?;
        let mut b = self.stream.launch_builder(f);
        for a in args {
            b.arg(a);
        }
        let config = LaunchConfig {
            grid_dim: (launch.blocks, 1, 1),
            block_dim: (launch.threads, 1, 1),
            shared_mem_bytes: launch.shared_bytes,
        };
        // SAFETY: the kernel was generated with one pointer parameter per
        // argument (its buffers, then the status word), every address is of
        // a live allocation planned to hold what the kernel accesses, and
        // the launch uses the block size and shared memory it was compiled
        // for.
        unsafe { b.launch(config) }
            .map(|_| ())
            .map_err(|e| RuntimeError::Failed(e.to_string()))
    }

    fn synchronize(&mut self) -> Result<(), RuntimeError> {
        self.stream
            .synchronize()
            .map_err(|e| RuntimeError::Failed(e.to_string()))
    }
}
