//! Running a [`TrainingPlan`]: one optimizer step of `B` sequences per
//! [`Trainer::step`], in one submission.
//!
//! [`Trainer::new`] creates the plan's buffers (the parameter buffer filled
//! with the caller's initial weights, frozen weights with their bytes, the
//! segment table of a pass's sequences), a pipeline per kernel and a bind
//! group per dispatch. A step uploads the batch's tokens and targets into a
//! staging buffer, then records, for each pass (a micro-batch of `M`
//! sequences packed end to end), copies of its ids into the plan's token
//! and target buffers, the pass schedule, a copy of its loss aside, and the
//! accumulation of its gradients (none in a step of one pass); then the
//! optimizer; then the copy of the losses and the optimizer's report into
//! a buffer it maps. One wait per step.
//!
//! The surprise: the ids are copied inside the command encoder rather than
//! written with `Queue::write_buffer`, whose writes all land before the
//! submission runs — `B / M` writes to the token buffer would leave only
//! the last pass's for every pass.

use crate::device::{check_limits, Gpu};
use crate::error::RuntimeError;
use crate::pipeline::{create_pipeline, KernelPipeline, ShaderChecks};
use crate::profile::{timed_pass, DispatchTime};
use crate::residency::usage_for;
use crate::session::segment_table;
use gerbil_plan::{BufferKind, Dispatch, TrainingBuffer, TrainingPlan, STEP_PARAMS_BYTES};

/// One dispatch, ready to record.
struct Bound {
    kernel: usize,
    group: wgpu::BindGroup,
    workgroups: [u32; 3],
}

/// What one optimizer step did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// Each pass's mean cross-entropy (the mean of its micro-batch's
    /// sequences'), in batch order.
    pub losses: Vec<f32>,
    /// The global gradient norm of the batch's mean gradient, before
    /// clipping.
    pub grad_norm: f32,
    /// The factor the gradients were scaled by (1 without clipping).
    pub clip: f32,
    /// Whether the step changed the weights: `false` when the gradient was
    /// not finite (the step was skipped and the gradients dropped).
    pub applied: bool,
}

impl StepReport {
    /// The batch's loss: the mean of its sequences' (passes have as many
    /// rows each).
    pub fn loss(&self) -> f32 {
        self.losses.iter().sum::<f32>() / self.losses.len().max(1) as f32
    }
}

/// A training plan on a device; see the module documentation.
pub struct Trainer {
    gpu: Gpu,
    plan: TrainingPlan,
    buffers: Vec<wgpu::Buffer>,
    pipelines: Vec<KernelPipeline>,
    pass: Vec<Bound>,
    accumulate: Vec<Bound>,
    optimizer: Vec<Bound>,
    /// Every sequence's tokens, then every sequence's targets.
    ids: wgpu::Buffer,
    /// The batch's losses, then the report.
    results: wgpu::Buffer,
    readback: wgpu::Buffer,
}

impl Trainer {
    /// Loads `plan` on `gpu`: `parameters` are the parameter banks' initial
    /// values, laid end to end (every [`gerbil_plan::Parameter`] at its
    /// offset, zeros between), `frozen` the bytes of each other weight
    /// buffer.
    pub async fn new(
        gpu: Gpu,
        plan: TrainingPlan,
        parameters: &[f32],
        frozen: &[(u32, Vec<u8>)],
    ) -> Result<Self, RuntimeError> {
        check_limits(&gpu.adapter.name, &gpu.limits, &plan.requirements)?;
        if plan.batch == 0 || plan.micro_batch == 0 || !plan.batch.is_multiple_of(plan.micro_batch)
        {
            return Err(RuntimeError::Training(format!(
                "the plan's micro-batch of {} does not divide its batch of {}",
                plan.micro_batch, plan.batch
            )));
        }
        let io = &plan.io;
        let buffers = gpu
            .scoped("creating the training buffers", || {
                plan.buffers
                    .iter()
                    .map(|decl| {
                        gpu.device.create_buffer(&wgpu::BufferDescriptor {
                            label: Some(&decl.kind.describe()),
                            size: decl.size,
                            usage: usage_for(&decl.kind),
                            mapped_at_creation: false,
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .await?;
        let queue = &gpu.queue;
        for (buffer, bytes) in frozen {
            let Some(b) = buffers.get(*buffer as usize) else {
                return Err(RuntimeError::Training(format!(
                    "frozen weight buffer {buffer} is not in the plan"
                )));
            };
            queue.write_buffer(b, 0, bytes);
        }
        let rows = plan.micro_batch * plan.seq_len;
        let params: [u32; (STEP_PARAMS_BYTES / 4) as usize] = [rows, 0, 0, 0];
        queue.write_buffer(
            &buffers[io.step_params as usize],
            0,
            bytemuck::cast_slice(&params),
        );
        queue.write_buffer(
            &buffers[io.step_rows as usize],
            0,
            bytemuck::cast_slice(&segment_table(
                &vec![plan.seq_len; plan.micro_batch as usize],
                plan.micro_batch as usize,
            )),
        );
        let pipelines = gpu
            .scoped("compiling the training kernels", || {
                plan.kernels
                    .iter()
                    .map(|k| create_pipeline(&gpu.device, k, ShaderChecks::Unchecked))
                    .collect::<Vec<_>>()
            })
            .await?;
        let bind = |schedule: &[Dispatch]| {
            schedule
                .iter()
                .map(|d| bound(&gpu, &buffers, &pipelines, d, rows))
                .collect::<Vec<_>>()
        };
        let (pass, accumulate, optimizer) = gpu
            .scoped("binding the training dispatches", || {
                (
                    bind(&plan.pass),
                    bind(&plan.accumulate),
                    bind(&plan.optimizer),
                )
            })
            .await?;
        let batch = u64::from(plan.batch.max(1));
        let ids_bytes = 2 * batch * u64::from(plan.seq_len) * 4;
        let results_bytes = 4 * u64::from(plan.passes()) + 12;
        let buffer = |label: &str, size: u64, usage: wgpu::BufferUsages| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: size.next_multiple_of(4),
                usage,
                mapped_at_creation: false,
            })
        };
        use wgpu::BufferUsages as U;
        let (ids, results, readback) = gpu
            .scoped("creating the batch buffers", || {
                (
                    buffer("batch ids", ids_bytes, U::COPY_SRC | U::COPY_DST),
                    buffer("batch results", results_bytes, U::COPY_SRC | U::COPY_DST),
                    buffer("batch readback", results_bytes, U::MAP_READ | U::COPY_DST),
                )
            })
            .await?;
        let trainer = Trainer {
            gpu,
            plan,
            buffers,
            pipelines,
            pass,
            accumulate,
            optimizer,
            ids,
            results,
            readback,
        };
        trainer.write(TrainingBuffer::Parameters, bytemuck::cast_slice(parameters))?;
        Ok(trainer)
    }

    /// The plan it runs.
    pub fn plan(&self) -> &TrainingPlan {
        &self.plan
    }

    /// One optimizer step over `sequences` (the plan's batch of them, each
    /// `(tokens, targets)` of the plan's sequence length) with the AdamW
    /// settings `settings` (`gerbil_codegen_wgsl::kernels::adamw::AdamwSettings::to_array`).
    pub async fn step(
        &mut self,
        sequences: &[(&[u32], &[u32])],
        settings: [f32; 8],
    ) -> Result<StepReport, RuntimeError> {
        let (batch, len) = (self.plan.batch as usize, self.plan.seq_len as usize);
        if sequences.len() != batch {
            return Err(RuntimeError::Training(format!(
                "a step takes {batch} sequences (the plan's batch), got {}",
                sequences.len()
            )));
        }
        let vocab = self.plan.vocab;
        let mut ids = Vec::with_capacity(2 * batch * len);
        for part in [0, 1] {
            for (i, seq) in sequences.iter().enumerate() {
                let values = if part == 0 { seq.0 } else { seq.1 };
                if values.len() != len {
                    return Err(RuntimeError::Training(format!(
                        "sequence {i} has {} {}, the plan's sequence length is {len}",
                        values.len(),
                        if part == 0 { "tokens" } else { "targets" },
                    )));
                }
                if let Some(&id) = values.iter().find(|&&t| t >= vocab) {
                    return Err(RuntimeError::TokenOutOfRange {
                        id,
                        vocab: vocab.into(),
                    });
                }
                ids.extend_from_slice(values);
            }
        }
        let io = &self.plan.io;
        let queue = &self.gpu.queue;
        queue.write_buffer(&self.ids, 0, bytemuck::cast_slice(&ids));
        queue.write_buffer(
            &self.buffers[io.settings as usize],
            0,
            bytemuck::cast_slice(&settings),
        );
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("training step"),
            });
        let passes = self.plan.passes() as usize;
        let pass_bytes = (4 * len * batch / passes) as u64;
        let targets_at = (batch * len * 4) as u64;
        for b in 0..passes as u64 {
            let token_ids = &self.buffers[io.token_ids as usize];
            let target_ids = &self.buffers[io.target_ids as usize];
            enc.copy_buffer_to_buffer(&self.ids, b * pass_bytes, token_ids, 0, pass_bytes);
            let targets = targets_at + b * pass_bytes;
            enc.copy_buffer_to_buffer(&self.ids, targets, target_ids, 0, pass_bytes);
            self.record(&mut enc, &self.pass);
            let loss = &self.buffers[io.loss as usize];
            enc.copy_buffer_to_buffer(loss, 0, &self.results, 4 * b, 4);
            self.record(&mut enc, &self.accumulate);
        }
        self.record(&mut enc, &self.optimizer);
        let report = &self.buffers[io.report as usize];
        enc.copy_buffer_to_buffer(report, 0, &self.results, 4 * passes as u64, 12);
        enc.copy_buffer_to_buffer(&self.results, 0, &self.readback, 0, self.results.size());
        self.gpu
            .scoped("running a training step", || queue.submit([enc.finish()]))
            .await?;
        let values: Vec<f32> = self
            .gpu
            .read_mapped(&self.readback, |bytes| {
                bytemuck::cast_slice::<u8, f32>(bytes).to_vec()
            })
            .await?;
        Ok(StepReport {
            losses: values[..passes].to_vec(),
            grad_norm: values[passes],
            clip: values[passes + 1],
            applied: values[passes + 2] != 0.0,
        })
    }

    /// The plan's buffers that hold `holds`, one per bank, in bank order.
    fn banks(&self, holds: TrainingBuffer) -> Result<Vec<&wgpu::Buffer>, RuntimeError> {
        let banks: Vec<&wgpu::Buffer> = self
            .plan
            .buffers
            .iter()
            .zip(&self.buffers)
            .filter(|(b, _)| b.kind == BufferKind::Training { holds })
            .map(|(_, buffer)| buffer)
            .collect();
        if banks.is_empty() {
            return Err(RuntimeError::Training(format!(
                "the plan has no {holds:?} buffer"
            )));
        }
        Ok(banks)
    }

    /// Overwrites the buffers that hold `holds` (the parameters, or the
    /// optimizer's state when a run resumes) with `bytes`: their contents
    /// laid end to end, bank after bank, which must be their size.
    pub fn write(&self, holds: TrainingBuffer, bytes: &[u8]) -> Result<(), RuntimeError> {
        let banks = self.banks(holds)?;
        let size: u64 = banks.iter().map(|b| b.size()).sum();
        if size != bytes.len() as u64 {
            return Err(RuntimeError::Training(format!(
                "the {holds:?} buffers hold {size} bytes, not {}",
                bytes.len()
            )));
        }
        let mut rest = bytes;
        for bank in banks {
            let (head, tail) = rest.split_at(bank.size() as usize);
            self.gpu.queue.write_buffer(bank, 0, head);
            rest = tail;
        }
        Ok(())
    }

    /// The bytes of the buffers that hold `holds`, as they are now, bank
    /// after bank: the parameters (every trained weight at its offset), or
    /// the optimizer's state for a checkpoint.
    pub async fn read(&self, holds: TrainingBuffer) -> Result<Vec<u8>, RuntimeError> {
        let mut out = Vec::new();
        for source in self.banks(holds)? {
            let readback = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("training readback"),
                size: source.size(),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut enc = self
                .gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("training readback"),
                });
            enc.copy_buffer_to_buffer(source, 0, &readback, 0, source.size());
            self.gpu.queue.submit([enc.finish()]);
            let bytes = self
                .gpu
                .read_mapped(&readback, |bytes| bytes.to_vec())
                .await?;
            out.extend_from_slice(&bytes);
        }
        Ok(out)
    }

    /// Runs one pass's dispatches on `tokens` and `targets` (a micro-batch's
    /// sequences end to end) with a timestamp after each and returns each
    /// dispatch's GPU time — not the accumulation or the optimizer, so the
    /// weights and the batch's gradients stay as they were (a plan of one
    /// pass a step has no gradients of the batch of its own: the pass's,
    /// which this leaves written, are overwritten by the next step's pass
    /// before the optimizer reads them). Needs a device opened with
    /// timestamps (`DeviceOptions::timestamps`).
    pub async fn profile(
        &self,
        tokens: &[u32],
        targets: &[u32],
    ) -> Result<Vec<DispatchTime>, RuntimeError> {
        if !self.gpu.has_timestamps() {
            return Err(RuntimeError::Device(
                "this device has no timestamp queries inside compute passes; profiling needs them"
                    .into(),
            ));
        }
        let rows = (self.plan.micro_batch * self.plan.seq_len) as usize;
        if tokens.len() != rows || targets.len() != rows {
            return Err(RuntimeError::Training(format!(
                "profile one pass: {rows} tokens and targets ({} sequences of {})",
                self.plan.micro_batch, self.plan.seq_len
            )));
        }
        let io = &self.plan.io;
        let queue = &self.gpu.queue;
        queue.write_buffer(
            &self.buffers[io.token_ids as usize],
            0,
            bytemuck::cast_slice(tokens),
        );
        queue.write_buffer(
            &self.buffers[io.target_ids as usize],
            0,
            bytemuck::cast_slice(targets),
        );
        let count = self.pass.len() as u32 + 1;
        let stamps = timed_pass(&self.gpu, count, |pass, stamps| {
            stamps.write(pass, 0);
            for (i, d) in self.pass.iter().enumerate() {
                pass.set_pipeline(&self.pipelines[d.kernel].pipeline);
                pass.set_bind_group(0, &d.group, &[]);
                let [x, y, z] = d.workgroups;
                pass.dispatch_workgroups(x, y, z);
                stamps.write(pass, i as u32 + 1);
            }
            Ok(())
        })
        .await?;
        let period = f64::from(queue.get_timestamp_period());
        let t = rows as u32;
        Ok(self
            .plan
            .pass
            .iter()
            .enumerate()
            .map(|(i, d)| DispatchTime {
                label: d.label.clone(),
                layer: d.layer,
                group: d.group_or_label().to_string(),
                kernel: self.plan.kernels[d.kernel as usize].name.clone(),
                nanos: stamps[i + 1].saturating_sub(stamps[i]) as f64 * period,
                bytes: 0,
                flops: d.flops.eval(t),
            })
            .collect())
    }

    fn record(&self, enc: &mut wgpu::CommandEncoder, schedule: &[Bound]) {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        for d in schedule {
            pass.set_pipeline(&self.pipelines[d.kernel].pipeline);
            pass.set_bind_group(0, &d.group, &[]);
            let [x, y, z] = d.workgroups;
            pass.dispatch_workgroups(x, y, z);
        }
    }
}

/// `d`'s bind group over `buffers`, and its workgroups at `T = t`.
fn bound(
    gpu: &Gpu,
    buffers: &[wgpu::Buffer],
    pipelines: &[KernelPipeline],
    d: &Dispatch,
    t: u32,
) -> Bound {
    let kernel = d.kernel as usize;
    let entries: Vec<wgpu::BindGroupEntry> = d
        .bindings
        .iter()
        .enumerate()
        .map(|(i, s)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &buffers[s.buffer as usize],
                offset: s.offset,
                size: wgpu::BufferSize::new(s.size),
            }),
        })
        .collect();
    let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(&d.label),
        layout: &pipelines[kernel].layout,
        entries: &entries,
    });
    Bound {
        kernel,
        group,
        workgroups: d.workgroups.map(|w| w.eval(t)),
    }
}
