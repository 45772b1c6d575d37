//! Sums over the GPUs of a data-parallel run through NCCL, one process per
//! GPU. NCCL's library (`libnccl.so`) is loaded when first asked for, as
//! CUDA's driver is: building needs none, and [`Nccl::unique_id`] says
//! when it cannot be loaded instead of letting cudarc panic.
//!
//! The ranks meet through an id rank 0 draws ([`Nccl::unique_id`]) and
//! hands to the others by any channel (MPI's broadcast in `dlc train`).
//! Each sum runs on a stream of its own that first waits for the work the
//! compute stream had been given, so later kernels of the step overlap
//! with it; [`Collective::finish`] makes the compute stream wait for them.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::{result as nccl, sys};

use crate::call::RuntimeError;
use crate::cuda::Cuda;
use crate::gpu::Collective;

/// The id the ranks of one communicator meet by (NCCL's `ncclUniqueId`).
pub const ID_BYTES: usize = 128;

/// This process's GPU among the ranks: an NCCL communicator and the stream
/// its sums run on.
pub struct Nccl {
    comm: sys::ncclComm_t,
    ranks: usize,
    stream: Arc<CudaStream>,
    /// Recorded after the last sum started, for the compute stream to wait
    /// on.
    done: Option<CudaEvent>,
}

fn failed(what: &str) -> impl Fn(nccl::NcclError) -> RuntimeError + '_ {
    move |e| RuntimeError::Failed(format!("NCCL: {what}: {e:?}"))
}

fn cuda_failed(what: &str) -> impl Fn(cudarc::driver::DriverError) -> RuntimeError + '_ {
    move |e| RuntimeError::Failed(format!("NCCL: {what}: {e}"))
}

impl Nccl {
    /// Whether NCCL's library can be loaded; an error saying what to
    /// install otherwise.
    fn present() -> Result<(), RuntimeError> {
        // SAFETY: this only tries to load the library by its names.
        if unsafe { sys::is_culib_present() } {
            Ok(())
        } else {
            Err(RuntimeError::Load(
                "NCCL's library (libnccl.so) could not be loaded: install NCCL, or put the folder \
                 holding libnccl.so on LD_LIBRARY_PATH (PyTorch's nvidia-nccl wheel ships \
                 libnccl.so.2 only: link libnccl.so to it)"
                    .into(),
            ))
        }
    }

    /// A fresh id for the ranks to meet by, drawn on rank 0.
    pub fn unique_id() -> Result<[u8; ID_BYTES], RuntimeError> {
        Self::present()?;
        let id = nccl::get_uniqueid().map_err(failed("drawing the ranks' id"))?;
        Ok(id.internal.map(|c| c as u8))
    }

    /// Joins the communicator of `ranks` processes meeting by `id`, as rank
    /// `rank`, on `cuda`'s GPU; every rank calls this at once.
    pub fn join(
        cuda: &Cuda,
        id: [u8; ID_BYTES],
        rank: usize,
        ranks: usize,
    ) -> Result<Nccl, RuntimeError> {
        Self::present()?;
        let (Ok(n), Ok(r)) = (i32::try_from(ranks), i32::try_from(rank)) else {
            return Err(RuntimeError::Arguments(format!(
                "rank {rank} of {ranks} is out of NCCL's range"
            )));
        };
        let stream = cuda
            .stream()
            .context()
            .new_stream()
            .map_err(cuda_failed("a stream for the sums"))?;
        // NCCL binds the communicator to the calling thread's current device.
        cuda.stream()
            .context()
            .bind_to_thread()
            .map_err(cuda_failed("the GPU's context"))?;
        let id = sys::ncclUniqueId {
            internal: id.map(|b| b as core::ffi::c_char),
        };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is written by NCCL; every rank passes the same id
        // and its own rank.
        unsafe { nccl::comm_init_rank(&mut comm, n, id, r) }
            .map_err(failed("joining the ranks"))?;
        Ok(Nccl {
            comm,
            ranks,
            stream,
            done: None,
        })
    }
}

impl Collective<Cuda> for Nccl {
    fn ranks(&self) -> usize {
        self.ranks
    }

    fn name(&self) -> &'static str {
        "NCCL on a stream of its own"
    }

    fn start_sum(&mut self, cuda: &mut Cuda, addr: u64, count: usize) -> Result<(), RuntimeError> {
        let ready = cuda
            .stream()
            .record_event(None)
            .map_err(cuda_failed("marking a bucket ready"))?;
        self.stream
            .wait(&ready)
            .map_err(cuda_failed("waiting for a bucket"))?;
        let buffer = addr as usize as *mut core::ffi::c_void;
        // SAFETY: `addr` holds `count` f32 of live device memory that
        // nothing touches until `finish` (the trait's contract); the sum is
        // in place, which NCCL allows.
        unsafe {
            nccl::all_reduce(
                buffer,
                buffer,
                count,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                self.stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(failed("summing a bucket"))?;
        self.done = Some(
            self.stream
                .record_event(None)
                .map_err(cuda_failed("marking the sums"))?,
        );
        Ok(())
    }

    fn finish(&mut self, cuda: &mut Cuda) -> Result<(), RuntimeError> {
        if let Some(done) = self.done.take() {
            cuda.stream()
                .wait(&done)
                .map_err(cuda_failed("waiting for the sums"))?;
        }
        Ok(())
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: the communicator was made by `join` and is not used after.
        let _ = unsafe { nccl::comm_destroy(self.comm) };
    }
}
