//! `dlc train --backend gpu` (and `gpu-emulator`): the training step on a
//! GPU, its tensors in device memory from the first step to the last.
//!
//! - **One process**: the fused step (`__train_step`) runs as one
//!   [`Prepared`] entry point on parameters this stepper owns; after each
//!   step the new weights, state and buffers trade device buffers with the
//!   inputs they replace (`Layout::trades`, as on the CPU), so only the
//!   batch and the step number are copied in, and the loss out.
//! - **Data-parallel** (`--data-parallel`, one process per GPU: rank `r`
//!   takes the machine's GPU `local rank`): the gradient's stages
//!   (`__train_grads_stageK`) write their buckets in device memory, and as
//!   each stage is launched its bucket's sum over the ranks is started by
//!   NCCL on a stream of its own, waiting for that stage only, so the
//!   reduction of one bucket overlaps the next stages' kernels; the update
//!   (`__train_update`) waits for the sums. The ranks meet through an NCCL
//!   id rank 0 draws and MPI broadcasts, start from rank 0's weights (MPI's
//!   broadcast, before they are copied in), and stay identical bit for bit
//!   as on the CPU. The GPU emulator has no NCCL: it runs the same stepper
//!   in a world of one, which is what tests it without a GPU.

use std::cell::RefCell;
use std::time::Instant;

use dlc_core::TensorType;
use dlc_driver::DriverError;
use dlc_runtime::gpu::{Alone, Collective, Device, GpuFunction, GpuProgram, Prepared};
use dlc_runtime::{AlignedBuffer, HostTensor};

use super::{
    Initial, Layout, Loop, Split, StagePlan, Stepper, Timing, TrainBackend, batch, runtime, usage,
    zeroed,
};
use crate::distributed::{Slot, World};

/// Why the emulator trains on one rank only.
pub(super) const EMULATOR_RANKS: &str =
    "--backend gpu-emulator has no NCCL: data-parallel training on it runs on one rank only";

/// Trains on the device `backend` names: `module` holds the step's entry
/// points, split for a data-parallel `world` as `split` says.
pub(super) fn train(
    backend: TrainBackend,
    module: &dlc_graph::Module,
    split: Option<Split>,
    layout: &Layout,
    initial: &Initial<'_>,
    driven: &Loop<'_>,
) -> Result<Vec<HostTensor>, DriverError> {
    let world = driven.world;
    match backend {
        TrainBackend::Cpu => Err(usage("the CPU trains without a GPU stepper")),
        TrainBackend::GpuEmulator => {
            if world.is_some_and(|w| w.size() > 1) {
                return Err(usage(EMULATOR_RANKS));
            }
            let target = dlc_core::TargetDesc::sm_90();
            let tiles = dlc_driver::lower_for_tile(module, &target)?;
            dlc_llvm::emulate(&tiles, &target, |emu| {
                let mut device = emu.device();
                Ok(run(
                    &mut device,
                    emu.program(),
                    split,
                    layout,
                    initial,
                    driven,
                    |_| Ok(Alone),
                ))
            })
            .map_err(|e| usage(e.to_string()))?
        }
        TrainBackend::Gpu => {
            // One process per GPU: a rank takes the GPU of its place among
            // the ranks of its machine.
            let ordinal = match world {
                Some(_) => std::env::var("OMPI_COMM_WORLD_LOCAL_RANK")
                    .ok()
                    .and_then(|r| r.parse::<usize>().ok())
                    .unwrap_or(0),
                None => 0,
            };
            let mut cuda = dlc_runtime::cuda::Cuda::open_ordinal(ordinal).map_err(runtime)?;
            let (_, cc) = cuda.describe().map_err(runtime)?;
            let target = crate::gpu_target(cc)?;
            let tiles = dlc_driver::lower_for_tile(module, &target)?;
            let symbols =
                dlc_runtime::abi::Symbols::with_prefix("dlc_").map_err(DriverError::Usage)?;
            let program = dlc_llvm::compile_gpu(&tiles, &symbols, &target)
                .map_err(|e| usage(e.to_string()))?;
            cuda.load(&program).map_err(runtime)?;
            run(
                &mut cuda,
                &program,
                split,
                layout,
                initial,
                driven,
                |cuda: &mut dlc_runtime::cuda::Cuda| join_nccl(cuda, world),
            )
        }
    }
}

/// This rank's NCCL communicator: rank 0 draws the id, MPI hands it to the
/// others.
fn join_nccl(
    cuda: &mut dlc_runtime::cuda::Cuda,
    world: Option<&World>,
) -> Result<dlc_runtime::nccl::Nccl, DriverError> {
    use dlc_runtime::nccl::{ID_BYTES, Nccl};
    let world = world.ok_or_else(|| usage("NCCL joins the ranks of a data-parallel run"))?;
    let mut id = [0u8; ID_BYTES];
    if world.leads() {
        id = Nccl::unique_id().map_err(runtime)?;
    }
    world.broadcast(&mut id);
    Nccl::join(cuda, id, world.rank(), world.size()).map_err(runtime)
}

/// Runs the training loop on `device`: the fused step alone, or the
/// gradient's stages, summed by the collective `join` makes, and the
/// update.
fn run<D: Device, C: Collective<D>>(
    device: &mut D,
    program: &GpuProgram,
    split: Option<Split>,
    layout: &Layout,
    initial: &Initial<'_>,
    driven: &Loop<'_>,
    join: impl FnOnce(&mut D) -> Result<C, DriverError>,
) -> Result<Vec<HostTensor>, DriverError> {
    match (driven.world, split) {
        (None, _) => {
            let step = program.function("__train_step").map_err(runtime)?;
            let mut s = OnDevice::bind(device, step, layout, initial)?;
            driven.run(&mut s)
        }
        (Some(_), None) => Err(usage("the data-parallel gradient was not split")),
        (Some(world), Some((buckets, slots, plans))) => {
            let collective = join(device)?;
            if collective.ranks() != world.size() {
                return Err(usage(format!(
                    "the collective joins {} rank(s), the run has {}",
                    collective.ranks(),
                    world.size()
                )));
            }
            let stages = plans
                .iter()
                .map(|p| Ok((program.function(&p.name).map_err(runtime)?, p)))
                .collect::<Result<Vec<_>, DriverError>>()?;
            let update = program.function("__train_update").map_err(runtime)?;
            let mut s = StagedOnDevice::bind(
                device,
                collective,
                &stages,
                update,
                &buckets.lens(),
                slots,
                layout,
                initial,
                world,
            )?;
            drop(buckets);
            driven.run(&mut s)
        }
    }
}

/// The device address of `slot`'s elements in its bucket.
fn slot_address<D: Device>(device: &D, buckets: &[D::Memory], slot: Slot) -> u64 {
    device.address(&buckets[slot.bucket]) + 4 * slot.offset as u64
}

/// `b` copied into fresh device memory.
fn upload<D: Device>(device: &mut D, b: &AlignedBuffer) -> Result<D::Memory, DriverError> {
    let mut m = device.alloc(b.bytes().len()).map_err(runtime)?;
    device.upload(&mut m, b.bytes()).map_err(runtime)?;
    Ok(m)
}

/// The tensor of type `ty` at byte `offset` of `m`.
fn download<D: Device>(
    device: &mut D,
    m: &D::Memory,
    offset: usize,
    ty: &TensorType,
) -> Result<HostTensor, DriverError> {
    let mut bytes = vec![0u8; ty.num_elements().unwrap_or(0) * ty.dtype.size_bytes()];
    device
        .download_from(m, offset, &mut bytes)
        .map_err(runtime)?;
    HostTensor::from_le_bytes(ty.clone(), &bytes).map_err(|e| usage(e.to_string()))
}

/// The fused step on a device: one entry point whose parameters (inputs,
/// then results) live in device memory owned here.
struct OnDevice<'p, 'd, D: Device> {
    device: RefCell<&'d mut D>,
    step: Prepared<'p, D>,
    types: Vec<TensorType>,
    memory: Vec<D::Memory>,
    inputs: usize,
    layout: &'p Layout,
}

impl<'p, 'd, D: Device> OnDevice<'p, 'd, D> {
    fn bind(
        device: &'d mut D,
        function: &'p GpuFunction,
        layout: &'p Layout,
        initial: &Initial<'_>,
    ) -> Result<Self, DriverError> {
        let params = &function.signature.params;
        let types: Vec<TensorType> = params.iter().map(|p| p.ty.clone()).collect();
        let inputs = params.iter().filter(|p| !p.output).count();
        let given = layout.initial_inputs(&types[..inputs], initial);
        if given.len() != inputs {
            return Err(usage(format!(
                "the training step takes {inputs} inputs, {} were laid out",
                given.len()
            )));
        }
        let mut memory = Vec::with_capacity(types.len());
        for (i, ty) in types.iter().enumerate() {
            let b = match given.get(i) {
                Some(g) => g.buffer(i, ty)?,
                None => zeroed(ty),
            };
            memory.push(upload(device, &b)?);
        }
        let step = Prepared::new(device, function).map_err(runtime)?;
        Ok(OnDevice {
            device: RefCell::new(device),
            step,
            types,
            memory,
            inputs,
            layout,
        })
    }

    fn tensor(&self, i: usize) -> Result<HostTensor, DriverError> {
        download(
            *self.device.borrow_mut(),
            &self.memory[i],
            0,
            &self.types[i],
        )
    }

    fn write(&mut self, i: usize, b: &AlignedBuffer) -> Result<(), DriverError> {
        let device = self.device.get_mut();
        device
            .upload(&mut self.memory[i], b.bytes())
            .map_err(runtime)
    }
}

impl<D: Device> Stepper for OnDevice<'_, '_, D> {
    fn write_data(
        &mut self,
        i: usize,
        values: impl Iterator<Item = f64>,
    ) -> Result<(), DriverError> {
        let b = batch(i, &self.types[i], values)?;
        self.write(i, &b)
    }

    fn step(&mut self, update: u64) -> Result<(f64, bool), DriverError> {
        let l = self.layout;
        let t = l.t_input();
        let b = AlignedBuffer::from_values(self.types[t].dtype, 1, std::iter::once(update as f64));
        self.write(t, &b)?;
        let device = self.device.get_mut();
        let addresses: Vec<u64> = self.memory.iter().map(|m| device.address(m)).collect();
        self.step.launch_at(device, &addresses).map_err(runtime)?;
        self.step.check(device).map_err(runtime)?;
        let loss = self.tensor(self.inputs)?.data[0];
        let made = !l.mixed || self.tensor(self.inputs + l.scale_result() + 2)?.data[0] != 0.0;
        for (result, input) in l.trades() {
            self.memory.swap(self.inputs + result, input);
        }
        Ok((loss, made))
    }

    fn weight(&self, k: usize) -> Result<HostTensor, DriverError> {
        self.tensor(self.layout.weights[k])
    }

    fn state(&self, k: usize, s: usize) -> Result<HostTensor, DriverError> {
        self.tensor(self.layout.params + k * self.layout.ns + s)
    }

    fn buffer(&self, j: usize) -> Result<HostTensor, DriverError> {
        self.tensor(self.layout.buffers[j])
    }

    fn scale(&self) -> Result<(f64, u64), DriverError> {
        let t = self.layout.t_input();
        Ok((
            self.tensor(t + 1)?.data[0],
            self.tensor(t + 2)?.data[0] as u64,
        ))
    }
}

/// The data-parallel step on a device: the CPU's `Staged` with its tensors
/// and buckets in device memory and the buckets summed by a
/// [`Collective`] as their stages are launched.
struct StagedOnDevice<'p, 'd, D: Device, C> {
    device: RefCell<&'d mut D>,
    collective: C,
    world: &'p World,
    stages: Vec<(Prepared<'p, D>, &'p StagePlan)>,
    update: Prepared<'p, D>,
    layout: &'p Layout,
    /// The gradient's parameters (the loss's, and with mixed precision the
    /// loss scale) and their types.
    params: Vec<D::Memory>,
    types: Vec<TensorType>,
    /// Each stage's carried results.
    carries: Vec<Vec<D::Memory>>,
    /// The buckets, each summed in place, and their f32 counts.
    buckets: Vec<D::Memory>,
    lens: Vec<usize>,
    slots: Vec<Slot>,
    /// The update's state, step number and good updates, and the buffers
    /// it writes (weights, state, scale, good updates, whether made).
    state: Vec<D::Memory>,
    t: D::Memory,
    good: D::Memory,
    out: Vec<D::Memory>,
    timing: Timing,
}

impl<'p, 'd, D: Device, C: Collective<D>> StagedOnDevice<'p, 'd, D, C> {
    #[allow(clippy::too_many_arguments)]
    fn bind(
        device: &'d mut D,
        collective: C,
        stages: &[(&'p GpuFunction, &'p StagePlan)],
        update: &'p GpuFunction,
        lens: &[usize],
        slots: Vec<Slot>,
        layout: &'p Layout,
        initial: &Initial<'_>,
        world: &'p World,
    ) -> Result<Self, DriverError> {
        let &(first, plan0) = stages.first().ok_or_else(|| usage("no gradient stage"))?;
        let sig = &first.signature.params;
        // Every stage takes the gradient's parameters first.
        let given = sig.iter().filter(|p| !p.output).count() - plan0.carried.len();
        let types: Vec<TensorType> = sig.iter().take(given).map(|p| p.ty.clone()).collect();
        let mut host = layout.gradient_inputs(&types, initial);
        let update_inputs = update.signature.params.iter().filter(|p| !p.output);
        let mut state = layout.update_state(update_inputs.map(|p| &p.ty), initial);
        // Every rank starts from rank 0's weights, state and buffers.
        for &i in layout.weights.iter().chain(&layout.buffers) {
            world.broadcast(host[i].bytes_mut());
        }
        for s in &mut state {
            world.broadcast(s.bytes_mut());
        }
        let params = host
            .iter()
            .map(|b| upload(device, b))
            .collect::<Result<Vec<_>, _>>()?;
        let state = state
            .iter()
            .map(|b| upload(device, b))
            .collect::<Result<Vec<_>, _>>()?;
        let mut carries = Vec::with_capacity(stages.len());
        for (f, p) in stages {
            let outputs = f.signature.params.iter().filter(|q| q.output);
            carries.push(
                outputs
                    .skip(p.own.len())
                    .map(|o| upload(device, &zeroed(&o.ty)))
                    .collect::<Result<Vec<_>, _>>()?,
            );
        }
        let buckets = lens
            .iter()
            .map(|&n| upload(device, &AlignedBuffer::zeroed(n * 4)))
            .collect::<Result<Vec<_>, _>>()?;
        let out = update
            .signature
            .params
            .iter()
            .filter(|p| p.output)
            .map(|o| upload(device, &zeroed(&o.ty)))
            .collect::<Result<Vec<_>, _>>()?;
        let i64_ty = dlc_core::DType::I64;
        let t = upload(
            device,
            &AlignedBuffer::from_values(i64_ty, 1, std::iter::once(1.0)),
        )?;
        let good = upload(
            device,
            &AlignedBuffer::from_values(i64_ty, 1, std::iter::once(initial.good as f64)),
        )?;
        let prepared = stages
            .iter()
            .map(|&(f, p)| Ok((Prepared::new(device, f).map_err(runtime)?, p)))
            .collect::<Result<Vec<_>, DriverError>>()?;
        let update = Prepared::new(device, update).map_err(runtime)?;
        Ok(StagedOnDevice {
            device: RefCell::new(device),
            collective,
            world,
            stages: prepared,
            update,
            layout,
            params,
            types,
            carries,
            buckets,
            lens: lens.to_vec(),
            slots,
            state,
            t,
            good,
            out,
            timing: Timing::default(),
        })
    }

    /// `slot`'s sums over the ranks, after a step's reduction.
    fn sums(&self, slot: Slot) -> Result<Vec<f32>, DriverError> {
        let ty = TensorType::new(dlc_core::DType::F32, vec![slot.len]);
        let t = download(
            *self.device.borrow_mut(),
            &self.buckets[slot.bucket],
            4 * slot.offset,
            &ty,
        )?;
        Ok(t.data.iter().map(|&x| x as f32).collect())
    }

    /// Launches stage `k` and starts summing its bucket.
    fn launch_stage(&mut self, k: usize) -> Result<(), DriverError> {
        let device = self.device.get_mut();
        let plan = self.stages[k].1;
        let mut addresses: Vec<u64> = self.params.iter().map(|m| device.address(m)).collect();
        for &(j, c) in &plan.carried {
            addresses.push(device.address(&self.carries[j][c]));
        }
        for &slot in &plan.own {
            addresses.push(slot_address(*device, &self.buckets, slot));
        }
        addresses.extend(self.carries[k].iter().map(|m| device.address(m)));
        self.stages[k]
            .0
            .launch_at(device, &addresses)
            .map_err(runtime)?;
        let bucket = device.address(&self.buckets[k]);
        self.collective
            .start_sum(device, bucket, self.lens[k])
            .map_err(runtime)
    }

    /// Runs the update on the summed gradients; its results trade places
    /// with its inputs.
    fn run_update(&mut self) -> Result<(), DriverError> {
        let l = self.layout;
        let device = self.device.get_mut();
        let mut addresses: Vec<u64> = l
            .weights
            .iter()
            .map(|&w| device.address(&self.params[w]))
            .collect();
        for k in 0..l.weights.len() {
            addresses.push(slot_address(*device, &self.buckets, self.slots[1 + k]));
        }
        addresses.extend(self.state.iter().map(|m| device.address(m)));
        addresses.push(device.address(&self.t));
        if l.mixed {
            addresses.push(device.address(&self.params[l.params]));
            addresses.push(device.address(&self.good));
        }
        addresses.extend(self.out.iter().map(|m| device.address(m)));
        self.update.launch_at(device, &addresses).map_err(runtime)?;
        self.update.check(device).map_err(runtime)?;
        let mut out = self.out.iter_mut();
        let mut next = || out.next().ok_or_else(|| usage("the update's results"));
        for &w in &l.weights {
            std::mem::swap(&mut self.params[w], next()?);
        }
        for s in &mut self.state {
            std::mem::swap(s, next()?);
        }
        if l.mixed {
            std::mem::swap(&mut self.params[l.params], next()?);
            std::mem::swap(&mut self.good, next()?);
        }
        Ok(())
    }

    fn tensor(&self, m: &D::Memory, ty: &TensorType) -> Result<HostTensor, DriverError> {
        download(*self.device.borrow_mut(), m, 0, ty)
    }
}

impl<D: Device, C: Collective<D>> Stepper for StagedOnDevice<'_, '_, D, C> {
    fn write_data(
        &mut self,
        i: usize,
        values: impl Iterator<Item = f64>,
    ) -> Result<(), DriverError> {
        let b = batch(i, &self.types[i], values)?;
        let device = self.device.get_mut();
        device
            .upload(&mut self.params[i], b.bytes())
            .map_err(runtime)
    }

    fn step(&mut self, update: u64) -> Result<(f64, bool), DriverError> {
        let l = self.layout;
        let nw = l.weights.len();
        let ranks = self.world.size() as f32;
        let started = Instant::now();
        {
            let t =
                AlignedBuffer::from_values(dlc_core::DType::I64, 1, std::iter::once(update as f64));
            let device = self.device.get_mut();
            device.upload(&mut self.t, t.bytes()).map_err(runtime)?;
        }
        for k in 0..self.stages.len() {
            self.launch_stage(k)?;
        }
        {
            let device = self.device.get_mut();
            self.collective.finish(device).map_err(runtime)?;
            for (stage, _) in &mut self.stages {
                stage.check(device).map_err(runtime)?;
            }
        }
        // The buffers' new values (running averages): their mean.
        for (j, &b) in l.buffers.iter().enumerate() {
            let sums = self.sums(self.slots[1 + nw + j])?;
            let mean = AlignedBuffer::from_values(
                dlc_core::DType::F32,
                sums.len(),
                sums.iter().map(|&s| f64::from(s / ranks)),
            );
            let device = self.device.get_mut();
            device
                .upload(&mut self.params[b], mean.bytes())
                .map_err(runtime)?;
        }
        let loss = f64::from(self.sums(self.slots[0])?[0]) / f64::from(ranks);
        self.run_update()?;
        // With mixed precision the last result is whether the update was
        // made.
        let made = match self.out.last() {
            Some(m) if l.mixed => {
                let mut byte = [0u8];
                let device = self.device.get_mut();
                device.download(m, &mut byte).map_err(runtime)?;
                byte[0] != 0
            }
            _ => true,
        };
        self.timing.compute += started.elapsed();
        Ok((loss, made))
    }

    fn weight(&self, k: usize) -> Result<HostTensor, DriverError> {
        let w = self.layout.weights[k];
        self.tensor(&self.params[w], &self.types[w])
    }

    fn state(&self, k: usize, s: usize) -> Result<HostTensor, DriverError> {
        let w = self.layout.weights[k];
        self.tensor(&self.state[k * self.layout.ns + s], &self.types[w])
    }

    fn buffer(&self, j: usize) -> Result<HostTensor, DriverError> {
        let b = self.layout.buffers[j];
        self.tensor(&self.params[b], &self.types[b])
    }

    fn scale(&self) -> Result<(f64, u64), DriverError> {
        let f32_ty = TensorType::scalar(dlc_core::DType::F32);
        let i64_ty = TensorType::scalar(dlc_core::DType::I64);
        Ok((
            self.tensor(&self.params[self.layout.params], &f32_ty)?.data[0],
            self.tensor(&self.good, &i64_ty)?.data[0] as u64,
        ))
    }

    fn timing(&mut self) -> Option<Timing> {
        Some(Timing {
            buckets: self.lens.len(),
            bytes: self.lens.iter().sum::<usize>() * 4,
            on_device: Some(self.collective.name()),
            ..std::mem::take(&mut self.timing)
        })
    }
}
