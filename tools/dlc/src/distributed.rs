//! Data-parallel training over MPI (`dlc train --data-parallel`, run under
//! `mpirun`, or `--ranks N`, which starts `mpirun` on this machine).
//!
//! Every rank holds the weights, runs the compiled gradient of its share of
//! each global batch, and the gradients are summed by MPI all-reduces in
//! buckets (DistributedDataParallel's scheme: about 25 MiB each, in the
//! order the backward pass finishes them, the last weights' first) before
//! the same compiled update runs everywhere. The weights start as rank 0's
//! (broadcast), so every rank's weights stay identical bit for bit; rank 0
//! alone writes checkpoints, weights and logs. An error on any rank ends
//! every rank (`MPI_Abort`), and a rank that dies ends the others through
//! `mpirun`.
//!
//! # How a step runs on several ranks
//!
//! - **Data parallelism** (`tools/dlc/src/distributed.rs`, `dlc train --data-parallel`
//!   under `mpirun`, or `--ranks N`, which starts `mpirun -np N --oversubscribe` with this
//!   command again). The step is generated as two entry points around the all-reduce:
//!   `__train_grads` (the loss, the gradients of this rank's share of the global batch,
//!   the buffers' new values) and `__train_update` (the update from the summed gradients,
//!   divided by the ranks in the program; the same source lines as the fused step's).
//!   After the passes, `__train_grads`'s results are laid out in f32 buckets of
//!   `--bucket-mb` (25 MiB, DDP's default; each tensor 64-byte aligned): the loss and the
//!   buffers first, then the gradients last weight first, the order the backward pass
//!   finishes them. `dlc_graph::transforms::split_by_results` cuts the function into one
//!   stage per bucket (`__train_grads_stageK`): an op belongs to the first stage whose
//!   bucket needs it, values later stages read become results and parameters, constants
//!   are copied. Each stage is lowered and compiled on its own (fusion does not cross a
//!   cut). The step (`Staged` in train.rs) owns every tensor and hands compiled code
//!   pointers (`Kernel::call_raw`): stages write their results into the buckets and read
//!   each other's values, the update reads the sums and writes new weights and state into
//!   buffers that then trade places with the old, so nothing is copied between calls. As
//!   each stage ends its bucket's `MPI_Iallreduce` starts and the ones under way are
//!   tested (Open MPI moves data only within its calls); the last are waited for after
//!   the last stage. Invariants: every rank starts from rank 0's weights, state and
//!   buffers (broadcast) and applies the same compiled update to the same sums, so the
//!   ranks stay identical bit for bit (checked at the end with a digest all-gathered
//!   from every rank); rank `r` reads rows `[r b, (r+1) b)` of each global batch drawn
//!   from the shuffle every rank draws alike, so N ranks of b rows step as one process of
//!   N b rows; any error on any rank is printed with its rank and ends them all
//!   (`MPI_Abort`), and a rank that dies ends the run through `mpirun`. Each rank's
//!   compiled code gets its share of the cores (`OMPI_COMM_WORLD_LOCAL_SIZE`) unless
//!   `OMP_NUM_THREADS` is set. A thread of its own summing the buckets while the stages
//!   compute was tried and dropped: with a core a rank (this machine, CI) each bucket
//!   waited for the scheduler to run the threads of both ranks (the digits MLP on two
//!   ranks: 1.6-6 ms a bucket on the thread, 0.06 ms in line). On GPUs
//!   (`--backend gpu`, `train/gpu.rs`) the buckets live in device memory
//!   and NCCL sums them; MPI only hands NCCL its id and broadcasts the
//!   starting weights.

use dlc_driver::DriverError;
use dlc_runtime::AlignedBuffer;

/// The ranks through MPI (the `mpi` feature, on by default).
#[cfg(feature = "mpi")]
mod world {
    use std::time::{Duration, Instant};

    use dlc_driver::DriverError;
    use mpi::collective::SystemOperation;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;

    use super::Region;

    /// This process's place among the ranks, for the whole run.
    pub struct World {
        // Finalizes MPI when dropped; the communicator is only valid until then.
        _universe: mpi::environment::Universe,
        world: SimpleCommunicator,
    }

    impl World {
        /// Joins the ranks `mpirun` started (a process started without it is a
        /// world of one).
        pub fn join() -> Result<World, DriverError> {
            let universe = mpi::initialize().ok_or_else(|| {
                DriverError::Usage("MPI was initialized twice in one process".into())
            })?;
            let world = universe.world();
            Ok(World {
                _universe: universe,
                world,
            })
        }

        pub fn rank(&self) -> usize {
            self.world.rank() as usize
        }

        pub fn size(&self) -> usize {
            self.world.size() as usize
        }

        /// Ends every rank: this one's error on its standard error, then
        /// `MPI_Abort`, which `mpirun` turns into the end of all of them with a
        /// non-zero status.
        pub fn fail(&self, message: &str) -> ! {
            let message = message.trim_end();
            let message = message.strip_prefix("error: ").unwrap_or(message);
            // One write of the whole line: `eprintln!` writes its pieces
            // one by one, and two ranks failing at once interleaved them on
            // mpirun's pipe ("rank 10 of 2 of : .."), where one write under
            // `PIPE_BUF` bytes is atomic.
            let line = format!(
                "error: rank {} of {}: {message}\n",
                self.rank(),
                self.size()
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
            self.world.abort(1)
        }

        /// Overwrites `bytes` with rank 0's.
        pub fn broadcast(&self, bytes: &mut [u8]) {
            self.world.process_at_rank(0).broadcast_into(bytes);
        }

        /// Whether every rank holds the same `digest`; the ranks that differ
        /// from rank 0's otherwise.
        pub fn differing(&self, digest: u64) -> Vec<usize> {
            let mut all = vec![0u64; self.size()];
            self.world.all_gather_into(&digest, &mut all[..]);
            (0..all.len()).filter(|&r| all[r] != all[0]).collect()
        }
    }

    /// Runs `compute`, which calls its `ready` with each bucket's index as soon
    /// as the bucket's send storage is complete (and is not written again
    /// until this returns): the bucket's all-reduce starts then, non-blocking,
    /// and the ones under way are progressed; once `compute` returns, the rest
    /// are waited for. Returns `compute`'s result and the time spent in MPI
    /// (starting, progressing and waiting; the part within `compute`, and the
    /// wait after it): what summing added to the step.
    #[allow(unsafe_code)] // The buckets' storage, handed to MPI by address.
    pub fn reduce_as_ready<R>(
        world: &World,
        regions: &[Region],
        compute: impl FnOnce(&mut dyn FnMut(usize)) -> R,
    ) -> Result<(R, Duration, Duration), DriverError> {
        let world = &world.world;
        let mut in_mpi = Duration::ZERO;
        let mut waited = Duration::ZERO;
        let mut started = 0;
        let result = mpi::request::scope(|sc| {
            let mut pending = Vec::new();
            let result = {
                let mut ready = |b: usize| {
                    let Some(r) = regions.get(b) else { return };
                    let start = Instant::now();
                    // SAFETY: the caller hands over bucket `b` whole: its send
                    // storage written and left alone, its sums read by no one
                    // until this returns; `Buckets` keeps both alive.
                    let (send, recv) = unsafe {
                        (
                            std::slice::from_raw_parts(r.send as *const f32, r.len),
                            std::slice::from_raw_parts_mut(r.recv as *mut f32, r.len),
                        )
                    };
                    pending.push(world.immediate_all_reduce_into(
                        sc,
                        send,
                        recv,
                        SystemOperation::sum(),
                    ));
                    started += 1;
                    // Progress the reductions under way (MPI moves data only
                    // within its calls).
                    pending = std::mem::take(&mut pending)
                        .into_iter()
                        .filter_map(|request| request.test().err())
                        .collect();
                    in_mpi += start.elapsed();
                };
                compute(&mut ready)
            };
            let start = Instant::now();
            for request in pending {
                request.wait();
            }
            waited = start.elapsed();
            result
        });
        if started != regions.len() {
            return Err(DriverError::Usage(format!(
                "{started} of {} gradient buckets were summed",
                regions.len()
            )));
        }
        Ok((result, in_mpi, waited))
    }
}

/// Without MPI (a build without the `mpi` feature, which then needs no MPI
/// library): a world of one, as a process MPI did not start is. That is what
/// a GPU machine without Open MPI trains on (its gradients summed by NCCL in
/// a world of one); a process `mpirun` started as one of several refuses.
#[cfg(not(feature = "mpi"))]
mod world {
    use std::time::Duration;

    use dlc_driver::DriverError;

    use super::Region;

    /// The only rank.
    pub struct World(());

    impl World {
        pub fn join() -> Result<World, DriverError> {
            let started = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
                .iter()
                .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok());
            match started {
                Some(n) if n > 1 => Err(DriverError::Usage(format!(
                    "this process is one of {n} ranks, but this dlc was built without MPI (its `mpi` feature) and trains as a world of one: build dlc with its default features and Open MPI installed (`make setup` installs it)"
                ))),
                _ => Ok(World(())),
            }
        }

        pub fn rank(&self) -> usize {
            0
        }

        pub fn size(&self) -> usize {
            1
        }

        pub fn fail(&self, message: &str) -> ! {
            let message = message.trim_end();
            let message = message.strip_prefix("error: ").unwrap_or(message);
            eprintln!("error: rank 0 of 1: {message}");
            std::process::exit(1)
        }

        pub fn broadcast(&self, _bytes: &mut [u8]) {}

        pub fn differing(&self, _digest: u64) -> Vec<usize> {
            Vec::new()
        }
    }

    /// Runs `compute`; each bucket's sum over one rank is the bucket.
    #[allow(unsafe_code)] // The buckets' storage, by address.
    pub fn reduce_as_ready<R>(
        _world: &World,
        regions: &[Region],
        compute: impl FnOnce(&mut dyn FnMut(usize)) -> R,
    ) -> Result<(R, Duration, Duration), DriverError> {
        let mut started = 0;
        let result = compute(&mut |b: usize| {
            let Some(r) = regions.get(b) else { return };
            // SAFETY: as for MPI: the caller hands over bucket `b` whole,
            // its send storage written and its sums read by no one until
            // this returns; the two are distinct buffers of `len` f32.
            unsafe {
                std::ptr::copy_nonoverlapping(r.send as *const f32, r.recv as *mut f32, r.len);
            }
            started += 1;
        });
        if started != regions.len() {
            return Err(DriverError::Usage(format!(
                "{started} of {} gradient buckets were summed",
                regions.len()
            )));
        }
        Ok((result, Duration::ZERO, Duration::ZERO))
    }
}

pub use world::{World, reduce_as_ready};

impl World {
    /// Gives each rank on this machine its share of the cores for its
    /// compiled code's threads, unless `OMP_NUM_THREADS` says otherwise (as
    /// torchrun does): ranks whose threads outnumber the cores wait for
    /// each other's spinning threads.
    pub fn share_cores(&self) -> Result<(), DriverError> {
        if std::env::var_os("OMP_NUM_THREADS").is_some() {
            return Ok(());
        }
        // The cores this process may run on: all of them, or what mpirun
        // bound it to.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let local = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(1)
            .max(1);
        dlc_runtime::set_num_threads((cores / local).max(1))
            .map_err(|e| DriverError::Usage(e.to_string()))
    }

    /// Rank 0, which alone writes files and logs.
    pub fn leads(&self) -> bool {
        self.rank() == 0
    }
}

/// Where a reduced tensor's elements sit in a bucket.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub bucket: usize,
    /// In f32 elements, a multiple of 16 (64 bytes: compiled code is handed
    /// its tensors so aligned).
    pub offset: usize,
    pub len: usize,
}

/// f32 tensors summed over the ranks in buckets of about a given size, each
/// one all-reduce; compiled code writes its results into their regions and
/// reads the sums from them in place.
pub struct Buckets {
    send: Vec<AlignedBuffer>,
    recv: Vec<AlignedBuffer>,
}

/// One bucket's storage as addresses: sent, summed, and its f32 count.
#[derive(Clone, Copy)]
pub struct Region {
    send: usize,
    recv: usize,
    len: usize,
}

impl Buckets {
    /// Buckets for tensors of `lens` elements, filled in the order given
    /// (a tensor larger than a bucket has one of its own); their slots.
    pub fn new(lens: &[usize], cap_bytes: usize) -> (Buckets, Vec<Slot>) {
        let cap = (cap_bytes / 4).max(1);
        let mut sizes: Vec<usize> = Vec::new();
        let mut slots = Vec::with_capacity(lens.len());
        for &len in lens {
            let last = sizes.len().wrapping_sub(1);
            match sizes.last_mut() {
                Some(size) if size.next_multiple_of(16) + len <= cap => {
                    let offset = size.next_multiple_of(16);
                    slots.push(Slot {
                        bucket: last,
                        offset,
                        len,
                    });
                    *size = offset + len;
                }
                _ => {
                    slots.push(Slot {
                        bucket: sizes.len(),
                        offset: 0,
                        len,
                    });
                    sizes.push(len);
                }
            }
        }
        let buckets = Buckets {
            send: sizes
                .iter()
                .map(|&n| AlignedBuffer::zeroed(n * 4))
                .collect(),
            recv: sizes
                .iter()
                .map(|&n| AlignedBuffer::zeroed(n * 4))
                .collect(),
        };
        (buckets, slots)
    }

    pub fn count(&self) -> usize {
        self.send.len()
    }

    /// Each bucket's f32 count.
    pub fn lens(&self) -> Vec<usize> {
        self.send.iter().map(|b| b.bytes().len() / 4).collect()
    }

    /// The bytes every step all-reduces.
    pub fn bytes(&self) -> usize {
        self.send.iter().map(|b| b.bytes().len()).sum()
    }

    /// Where `slot`'s elements are written, to be summed.
    pub fn send_ptr(&mut self, slot: Slot) -> *mut u8 {
        self.send[slot.bucket].bytes_mut()[slot.offset * 4..].as_mut_ptr()
    }

    /// Where `slot`'s sums over the ranks are.
    pub fn recv_ptr(&mut self, slot: Slot) -> *mut u8 {
        self.recv[slot.bucket].bytes_mut()[slot.offset * 4..].as_mut_ptr()
    }

    /// The sums over the ranks of `slot`'s elements, after a reduction.
    pub fn sum(&self, slot: Slot) -> &[f32] {
        let f: &[f32] = bytemuck::cast_slice(self.recv[slot.bucket].bytes());
        &f[slot.offset..slot.offset + slot.len]
    }

    /// Each bucket's storage, for [`reduce_as_ready`]: the addresses stay valid
    /// as long as the buckets do.
    pub fn regions(&mut self) -> Vec<Region> {
        self.send
            .iter_mut()
            .zip(&mut self.recv)
            .map(|(s, r)| Region {
                len: s.bytes().len() / 4,
                send: s.as_mut_ptr() as usize,
                recv: r.as_mut_ptr() as usize,
            })
            .collect()
    }
}

/// A digest of bytes (FNV-1a, 64 bits): equal tensors, equal digests.
pub fn digest(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// `dlc train --ranks N`: this command again under `mpirun -np N` on this
/// machine, with `--data-parallel` in place of `--ranks`; its status.
pub fn launch(ranks: usize) -> Result<(), DriverError> {
    if ranks == 0 {
        return Err(DriverError::Usage("--ranks must be at least 1".into()));
    }
    if cfg!(not(feature = "mpi")) && ranks > 1 {
        return Err(DriverError::Usage(
            "this dlc was built without MPI (its `mpi` feature): it trains as a world of one; build dlc with its default features and Open MPI installed (`make setup` installs it) for --ranks".into(),
        ));
    }
    let exe = std::env::current_exe().map_err(|source| DriverError::Io {
        path: "the dlc executable".into(),
        source,
    })?;
    let mut args: Vec<String> = Vec::new();
    let mut given = std::env::args().skip(1);
    while let Some(a) = given.next() {
        if a == "--ranks" {
            given.next();
        } else if !a.starts_with("--ranks=") {
            args.push(a);
        }
    }
    args.push("--data-parallel".into());
    // More ranks than cores is allowed (Open MPI refuses it by default):
    // the tests run three ranks on two cores.
    let status = std::process::Command::new("mpirun")
        .args(["-np", &ranks.to_string(), "--oversubscribe"])
        .arg(&exe)
        .args(&args)
        .status()
        .map_err(|e| {
            DriverError::Usage(if e.kind() == std::io::ErrorKind::NotFound {
                "--ranks starts `mpirun`, which is not on PATH: install Open MPI (`make setup` does)"
                    .to_string()
            } else {
                format!("--ranks: cannot start mpirun: {e}")
            })
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(DriverError::Usage(format!(
            "the data-parallel run on {ranks} rank(s) failed (mpirun: {status}); the ranks' errors are above"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_fill_in_order_up_to_their_size() {
        // 4-byte elements, 160-byte buckets: 40 elements each, each tensor
        // at a multiple of 16 elements (64 bytes).
        let (mut b, slots) = Buckets::new(&[4, 5, 30, 50, 1, 2], 160);
        let at: Vec<(usize, usize)> = slots.iter().map(|s| (s.bucket, s.offset)).collect();
        assert_eq!(at, [(0, 0), (0, 16), (1, 0), (2, 0), (3, 0), (3, 16)]);
        assert_eq!(b.count(), 4);
        assert_eq!(b.bytes(), (21 + 30 + 50 + 18) * 4);
        for s in &slots {
            assert_eq!(b.send_ptr(*s) as usize % 64, 0);
            assert_eq!(b.recv_ptr(*s) as usize % 64, 0);
        }
    }

    #[test]
    fn digests_tell_bytes_apart() {
        assert_eq!(digest(&[b"ab", b"c"]), digest(&[b"abc"]));
        assert_ne!(digest(&[b"abc"]), digest(&[b"abd"]));
    }
}
