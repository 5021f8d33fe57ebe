//! Per-dispatch GPU timing with timestamp queries, for `gerbil-run bench
//! --profile`: where a prefill, decode, batch or packed embedding step
//! ([`Session::profile_embedding`]) spends its time, and how close each
//! dispatch comes to the memory bandwidth of a plain copy.
//!
//! [`Session::profile`] times every dispatch of one step and estimates the
//! bytes it moves; [`Session::copy_bandwidth`] measures the roofline those
//! are compared with: a `vec4<f32>` copy kernel over the largest buffer pair
//! the device binds (up to 256 MiB), timed the same way. The surprise: the
//! byte counts come from the plan, not the kernel — weights and the KV-cache
//! rows in use exactly, activations as the step's share (`T / max T`) of
//! their slices — so a kernel that reads its input twice shows as faster than
//! it is.

use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::session::{Session, Step};

/// GPU time of one dispatch.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchTime {
    /// IR node label (e.g. `layers.3.mlp.down_proj`).
    pub label: String,
    /// The node's transformer layer, if any.
    pub layer: Option<u32>,
    /// The label without layer numbers: what a profile groups by
    /// ([`gerbil_plan::Dispatch::group`]).
    pub group: String,
    /// Kernel name.
    pub kernel: String,
    /// Nanoseconds between the timestamps around the dispatch.
    pub nanos: f64,
    /// Bytes the dispatch reads and writes (estimated from its bindings).
    pub bytes: u64,
    /// Floating-point operations it does (the plan's count at this step's
    /// `T`; zero where codegen does not count them).
    pub flops: u64,
}

/// Timestamps `0..count` of a [`timed_pass`], over as many query sets as
/// they need (wgpu caps a set at [`wgpu::QUERY_SET_MAX_QUERIES`]: a LoRA
/// training step has more dispatches than that).
pub(crate) struct Stamps {
    sets: Vec<wgpu::QuerySet>,
    /// Queries per set.
    per: u32,
}

impl Stamps {
    /// Writes timestamp `i` after what `pass` has recorded so far.
    pub(crate) fn write(&self, pass: &mut wgpu::ComputePass<'_>, i: u32) {
        pass.write_timestamp(&self.sets[(i / self.per) as usize], i % self.per);
    }
}

/// Records one compute pass through `record`, which writes timestamps
/// `0..count` through the [`Stamps`] it is given (one before the first
/// dispatch, one after each), then resolves and reads them back: the GPU
/// clock in ticks of the queue's timestamp period.
pub(crate) async fn timed_pass(
    gpu: &Gpu,
    count: u32,
    record: impl FnOnce(&mut wgpu::ComputePass<'_>, &Stamps) -> Result<(), RuntimeError>,
) -> Result<Vec<u64>, RuntimeError> {
    timed_pass_in_sets_of(gpu, count, wgpu::QUERY_SET_MAX_QUERIES, record).await
}

/// [`timed_pass`] with query sets of `per` queries (a multiple of 32: each
/// set resolves at `per · 8` bytes past the last, and resolves go to
/// offsets of [`wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT`]).
async fn timed_pass_in_sets_of(
    gpu: &Gpu,
    count: u32,
    per: u32,
    record: impl FnOnce(&mut wgpu::ComputePass<'_>, &Stamps) -> Result<(), RuntimeError>,
) -> Result<Vec<u64>, RuntimeError> {
    let device = &gpu.device;
    let stamps = Stamps {
        per,
        sets: (0..count.div_ceil(per))
            .map(|s| {
                device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: (count - s * per).min(per),
                })
            })
            .collect(),
    };
    let bytes = u64::from(count) * 8;
    let resolve = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("profile resolve"),
        size: bytes,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("profile read"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("profile"),
    });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("profile"),
            timestamp_writes: None,
        });
        record(&mut pass, &stamps)?;
    }
    for (s, set) in stamps.sets.iter().enumerate() {
        let first = s as u32 * per;
        let offset = u64::from(first) * 8;
        enc.resolve_query_set(set, 0..(count - first).min(per), &resolve, offset);
    }
    enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, bytes);
    gpu.queue.submit([enc.finish()]);
    gpu.read_mapped(&read, |bytes| bytemuck::cast_slice(bytes).to_vec())
        .await
}

impl Session {
    /// Runs one step on `tokens` (appended to the cache) with a timestamp
    /// after every dispatch and returns each dispatch's GPU time. Needs a
    /// session from [`Session::new_profiling`] on a device with timestamp
    /// queries inside passes.
    pub async fn profile(&mut self, tokens: &[u32]) -> Result<Vec<DispatchTime>, RuntimeError> {
        self.need_timestamps()?;
        // Saturating, so that no length wraps into the allowed range.
        let t = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        if tokens.is_empty() || u64::from(t) > self.header.model.max_tokens_per_step {
            return Err(RuntimeError::Sampling(format!(
                "profile one step of 1..={} tokens",
                self.header.model.max_tokens_per_step
            )));
        }
        let needed = self.position + u64::from(t);
        if needed > self.context() {
            return Err(RuntimeError::ContextOverflow {
                needed,
                max: self.context(),
            });
        }
        // The variant's own steps, never its prefill fallback's.
        self.on_fallback = false;
        let steps = self.prepare_step(tokens)?;
        let times = self.time_steps(steps, t, needed).await?;
        self.position = needed;
        Ok(times)
    }

    /// Runs one batch step on `rows` ([`Session::forward_batch`]'s rows)
    /// with a timestamp after every dispatch and returns each dispatch's GPU
    /// time; needs what [`Session::profile`] needs and a batch schedule.
    pub async fn profile_batch(
        &mut self,
        rows: &[(usize, u32)],
    ) -> Result<Vec<DispatchTime>, RuntimeError> {
        self.need_timestamps()?;
        let (t, taken) = self.prepare_batch(rows)?;
        let context = self.batch_keys(&taken);
        let times = self.time_steps(&self.batch, t, context).await?;
        self.advance_batch(&taken);
        Ok(times)
    }

    /// For an embedding plan: runs one packed step of `inputs` (which must
    /// fit one step: at most the plan's `max_inputs`, their tokens at most a
    /// step's) with a timestamp after every dispatch and returns each
    /// dispatch's GPU time; needs what [`Session::profile`] needs.
    pub async fn profile_embedding(
        &mut self,
        inputs: &[&[u32]],
    ) -> Result<Vec<DispatchTime>, RuntimeError> {
        self.need_timestamps()?;
        self.check_embedding_inputs(inputs)?;
        let places = self
            .header
            .model
            .embedding
            .as_ref()
            .map_or(1, |e| (e.max_inputs as usize).max(1));
        let room = self.context().min(self.header.model.max_tokens_per_step);
        let packed: Vec<u32> = inputs.iter().flat_map(|t| t.iter().copied()).collect();
        if inputs.is_empty() || inputs.len() > places || packed.len() as u64 > room {
            return Err(RuntimeError::Sampling(format!(
                "profile one embedding step: 1 to {places} inputs of {room} tokens in all"
            )));
        }
        self.reset();
        self.write_segments(inputs, places);
        let t = packed.len() as u32;
        self.on_fallback = false;
        let steps = self.prepare_step(&packed)?;
        let times = self.time_steps(steps, t, u64::from(t)).await?;
        self.reset();
        Ok(times)
    }

    fn need_timestamps(&self) -> Result<(), RuntimeError> {
        if self.gpu.has_timestamps() {
            return Ok(());
        }
        Err(RuntimeError::Device(
            "this device has no timestamp queries inside compute passes; profiling needs them"
                .into(),
        ))
    }

    /// Records `steps` for `t` rows with a timestamp after each, runs them
    /// and returns each recorded dispatch's time (bytes counted with the KV
    /// caches `context` rows full, and a split-K attention launching the
    /// splits that many keys fill).
    async fn time_steps(
        &self,
        steps: &[Step],
        t: u32,
        context: u64,
    ) -> Result<Vec<DispatchTime>, RuntimeError> {
        self.ensure_pipelines(steps, t).await?;
        let count = (steps.len() + 1) as u32;
        let mut recorded = Vec::new();
        let stamps = timed_pass(&self.gpu, count, |pass, stamps| {
            stamps.write(pass, 0);
            for (i, s) in steps.iter().enumerate() {
                if self.record(pass, s, t, context)? {
                    recorded.push(i);
                }
                stamps.write(pass, (i + 1) as u32);
            }
            Ok(())
        })
        .await?;
        let period = f64::from(self.gpu.queue.get_timestamp_period());
        let times = recorded
            .into_iter()
            .map(|i| {
                let d = &steps[i].dispatch;
                DispatchTime {
                    label: d.label.clone(),
                    layer: d.layer,
                    group: d.group_or_label().to_string(),
                    kernel: self.header.kernels[d.kernel as usize].name.clone(),
                    nanos: stamps[i + 1].saturating_sub(stamps[i]) as f64 * period,
                    bytes: self.dispatch_bytes(d, t, context),
                    flops: d.flops.eval(t),
                }
            })
            .collect();
        Ok(times)
    }

    /// Bytes dispatch `d` moves in a step of `t` tokens that ends at
    /// `context` cached tokens: weights whole, KV caches up to `context`
    /// rows, scratch and parameters not at all, other slices (activations,
    /// outputs, token ids) scaled by `t / max_tokens_per_step`.
    fn dispatch_bytes(&self, d: &gerbil_plan::Dispatch, t: u32, context: u64) -> u64 {
        use gerbil_plan::BufferKind;
        let m = &self.header.model;
        let share = |bytes: u64, num: u64, den: u64| {
            (bytes as u128 * num as u128 / den.max(1) as u128) as u64
        };
        d.bindings
            .iter()
            .map(|b| match &self.header.buffers[b.buffer as usize].kind {
                BufferKind::Weight { .. } => b.size,
                BufferKind::KvCache { .. } => share(b.size, context, m.max_context),
                BufferKind::StepParams | BufferKind::Scratch { .. } => 0,
                _ => share(b.size, u64::from(t), m.max_tokens_per_step),
            })
            .sum()
    }

    /// The device's copy bandwidth in bytes per second (bytes read plus
    /// bytes written), the roofline of `bench --profile`: the median of five
    /// timed `vec4<f32>` copies of up to 256 MiB. Needs a session from
    /// [`Session::new_profiling`].
    pub async fn copy_bandwidth(&self) -> Result<f64, RuntimeError> {
        let device = &self.gpu.device;
        let limits = device.limits();
        // Whole multiples of the 64-thread workgroup's 1 KiB, within the
        // binding and dispatch limits.
        let per_group = 64 * 16u64;
        let bytes = (256u64 << 20)
            .min(limits.max_storage_buffer_binding_size)
            .min(limits.max_buffer_size)
            .min(u64::from(limits.max_compute_workgroups_per_dimension) * per_group)
            / per_group
            * per_group;
        let groups = (bytes / per_group) as u32;
        let make = |label| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        };
        let (src, dst) = (make("copy probe source"), make("copy probe destination"));
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("copy probe"),
            source: wgpu::ShaderSource::Wgsl(
                "@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;\n\
                 @group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;\n\
                 @compute @workgroup_size(64)\n\
                 fn main(@builtin(global_invocation_id) g: vec3<u32>) { dst[g.x] = src[g.x]; }\n"
                    .into(),
            ),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("copy probe"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("copy probe"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: src.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: dst.as_entire_binding(),
                },
            ],
        });
        let secs =
            crate::kernel_timer::time_dispatches(&self.gpu, &pipeline, &bind, [groups, 1, 1])
                .await?;
        Ok(2.0 * bytes as f64 / secs.max(1e-12))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceOptions;

    /// More timestamps than one query set holds (sets of 32 here, of 4,096
    /// in use) come back whole and in order.
    #[test]
    fn timestamps_past_one_query_set_come_back_in_order() {
        let options = DeviceOptions {
            timestamps: true,
            ..DeviceOptions::default()
        };
        let need = gerbil_plan::Requirements::default();
        let gpu =
            pollster::block_on(Gpu::open_on(&need, &options)).unwrap_or_else(|e| panic!("{e}"));
        if !gpu.has_timestamps() {
            return;
        }
        let module = gpu
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: None,
                source: wgpu::ShaderSource::Wgsl("@compute @workgroup_size(1) fn main() {}".into()),
            });
        let pipeline = gpu
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: None,
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        let count = 70;
        let stamps = pollster::block_on(timed_pass_in_sets_of(&gpu, count, 32, |pass, stamps| {
            stamps.write(pass, 0);
            for i in 1..count {
                pass.set_pipeline(&pipeline);
                pass.dispatch_workgroups(1, 1, 1);
                stamps.write(pass, i);
            }
            Ok(())
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stamps.len(), count as usize);
        assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "{stamps:?}");
        assert!(stamps[count as usize - 1] > stamps[0], "{stamps:?}");
    }
}
