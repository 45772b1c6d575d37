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

use std::time::{Duration, Instant};

use dlc_driver::DriverError;
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// The bytes a bucket gathers before its all-reduce starts: PyTorch DDP's
/// default (`bucket_cap_mb=25`).
pub const BUCKET_BYTES: usize = 25 << 20;

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
        let universe = mpi::initialize()
            .ok_or_else(|| DriverError::Usage("MPI was initialized twice in one process".into()))?;
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

    /// Ends every rank: this one's error on its standard error, then
    /// `MPI_Abort`, which `mpirun` turns into the end of all of them with a
    /// non-zero status.
    pub fn fail(&self, message: &str) -> ! {
        let message = message.trim_end();
        let message = message.strip_prefix("error: ").unwrap_or(message);
        eprintln!("error: rank {} of {}: {message}", self.rank(), self.size());
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

/// Where a reduced tensor's elements sit in a bucket.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub bucket: usize,
    pub offset: usize,
    pub len: usize,
}

/// f32 tensors summed over the ranks in buckets of about
/// [`BUCKET_BYTES`], each one all-reduce.
pub struct Buckets {
    send: Vec<Vec<f32>>,
    recv: Vec<Vec<f32>>,
    /// Time spent in the last [`Buckets::reduce`].
    pub last: Duration,
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
                Some(size) if *size + len <= cap => {
                    slots.push(Slot {
                        bucket: last,
                        offset: *size,
                        len,
                    });
                    *size += len;
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
            send: sizes.iter().map(|&n| vec![0.0; n]).collect(),
            recv: sizes.iter().map(|&n| vec![0.0; n]).collect(),
            last: Duration::ZERO,
        };
        (buckets, slots)
    }

    pub fn count(&self) -> usize {
        self.send.len()
    }

    /// The bytes every step all-reduces.
    pub fn bytes(&self) -> usize {
        self.send.iter().map(|b| b.len() * 4).sum()
    }

    /// The elements of `slot` to be summed: write them here before
    /// [`Buckets::reduce`].
    pub fn input(&mut self, slot: Slot) -> &mut [f32] {
        &mut self.send[slot.bucket][slot.offset..slot.offset + slot.len]
    }

    /// The sums over the ranks of `slot`'s elements, after
    /// [`Buckets::reduce`].
    pub fn sum(&self, slot: Slot) -> &[f32] {
        &self.recv[slot.bucket][slot.offset..slot.offset + slot.len]
    }

    /// Sums every bucket over the ranks: each bucket's all-reduce is
    /// started (non-blocking) in order, then all are waited for.
    pub fn reduce(&mut self, world: &World) {
        let start = Instant::now();
        let comm = &world.world;
        let (send, recv) = (&self.send, &mut self.recv);
        mpi::request::scope(|scope| {
            let pending: Vec<_> = send
                .iter()
                .zip(recv.iter_mut())
                .map(|(s, r)| {
                    comm.immediate_all_reduce_into(
                        scope,
                        &s[..],
                        &mut r[..],
                        SystemOperation::sum(),
                    )
                })
                .collect();
            for request in pending {
                request.wait();
            }
        });
        self.last = start.elapsed();
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
        // 4-byte elements, 40-byte buckets: 10 elements each.
        let (b, slots) = Buckets::new(&[4, 5, 3, 12, 1], 40);
        let at: Vec<(usize, usize)> = slots.iter().map(|s| (s.bucket, s.offset)).collect();
        assert_eq!(at, [(0, 0), (0, 4), (1, 0), (2, 0), (3, 0)]);
        assert_eq!(b.count(), 4);
        assert_eq!(b.bytes(), 25 * 4);
    }

    #[test]
    fn digests_tell_bytes_apart() {
        assert_eq!(digest(&[b"ab", b"c"]), digest(&[b"abc"]));
        assert_ne!(digest(&[b"abc"]), digest(&[b"abd"]));
    }
}
