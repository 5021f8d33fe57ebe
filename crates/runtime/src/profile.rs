//! Per-dispatch GPU timing with timestamp queries, for `gerbil-run bench
//! --profile`: where a prefill or decode step spends its time.

use crate::error::RuntimeError;
use crate::session::Session;

/// GPU time of one dispatch.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchTime {
    /// IR node label (e.g. `layers.3.mlp.down_proj`).
    pub label: String,
    /// The node's transformer layer, if any.
    pub layer: Option<u32>,
    /// Kernel name.
    pub kernel: String,
    /// Nanoseconds between the timestamps around the dispatch.
    pub nanos: f64,
}

impl Session {
    /// Runs one step on `tokens` (appended to the cache) with a timestamp
    /// after every dispatch and returns each dispatch's GPU time. Needs a
    /// session from [`Session::new_profiling`] on a device with timestamp
    /// queries inside passes.
    pub async fn profile(&mut self, tokens: &[u32]) -> Result<Vec<DispatchTime>, RuntimeError> {
        if !self.gpu.has_timestamps() {
            return Err(RuntimeError::Device(
                "this device has no timestamp queries inside compute passes; profiling needs them"
                    .into(),
            ));
        }
        let t = tokens.len() as u32;
        if tokens.is_empty() || u64::from(t) > self.header.model.max_tokens_per_step {
            return Err(RuntimeError::Sampling(format!(
                "profile one step of 1..={} tokens",
                self.header.model.max_tokens_per_step
            )));
        }
        let needed = self.position + u64::from(t);
        if needed > self.header.model.max_context {
            return Err(RuntimeError::ContextOverflow {
                needed,
                max: self.header.model.max_context,
            });
        }
        let device = &self.gpu.device;
        let steps = self.prepare_step(tokens);
        let count = (steps.len() + 1) as u32;
        let queries = device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count,
        });
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
        let mut recorded = Vec::new();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("profile"),
                timestamp_writes: None,
            });
            pass.write_timestamp(&queries, 0);
            for (i, s) in steps.iter().enumerate() {
                if self.record(&mut pass, s, t) {
                    recorded.push(i);
                }
                pass.write_timestamp(&queries, (i + 1) as u32);
            }
        }
        enc.resolve_query_set(&queries, 0..count, &resolve, 0);
        enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, bytes);
        self.gpu.queue.submit([enc.finish()]);
        let stamps: Vec<u64> = self
            .gpu
            .read_mapped(&read, |bytes| bytemuck::cast_slice(bytes).to_vec())
            .await?;
        let period = f64::from(self.gpu.queue.get_timestamp_period());
        let times = recorded
            .into_iter()
            .map(|i| {
                let d = &steps[i].dispatch;
                DispatchTime {
                    label: d.label.clone(),
                    layer: d.layer,
                    kernel: self.header.kernels[d.kernel as usize].name.clone(),
                    nanos: stamps[i + 1].saturating_sub(stamps[i]) as f64 * period,
                }
            })
            .collect();
        self.position = needed;
        Ok(times)
    }
}
