//! Timing one kernel alone on the GPU, for the autotuner (`gerbilc tune`)
//! and for `bench --profile`'s copy roofline.
//!
//! [`time_kernel`] gives every binding of a plan [`Kernel`] a buffer of its
//! own — the step parameters with the `T` asked for, counters zeroed, every
//! other operand filled with a small finite value in its element type — and
//! returns the median GPU time of several dispatches, each between two
//! timestamps. [`time_dispatches`] is that measurement for any pipeline.
//! The surprise: the operands' values do not matter to the time (no kernel
//! branches on them), but they must be finite and the token ids in range,
//! so they are not random: ones, in each element type's encoding.

use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::pipeline::{create_pipeline, ShaderChecks};
use gerbil_plan::{Access, Elem, Kernel, Port};
use wgpu::util::DeviceExt;

/// Timed dispatches; the first warms caches and clocks and is not counted.
const RUNS: u32 = 6;

/// One element-type's filler word: 1.0 (f32), 1 (ids), a pair of 1.0s
/// (f16), a pair of 1/128s (bf16 halves read as `0x3c00`); quantized
/// blocks get scales of 1.0 and quants of 0 and 3.
fn filler(elem: Elem) -> u32 {
    match elem {
        Elem::F32 => 1.0f32.to_bits(),
        Elem::U32 => 1,
        Elem::Bf16x2 | Elem::F16x2 | Elem::Blocks => 0x3c00_3c00,
    }
}

/// The median GPU time in seconds of `pipeline` dispatched `groups`
/// workgroups with `bind` at group 0 (one warm-up dispatch, then
/// [`RUNS`]` − 1` timed ones). Needs a device with timestamp queries inside
/// passes ([`Gpu::open_with`] with `timestamps`).
pub async fn time_dispatches(
    gpu: &Gpu,
    pipeline: &wgpu::ComputePipeline,
    bind: &wgpu::BindGroup,
    groups: [u32; 3],
) -> Result<f64, RuntimeError> {
    if !gpu.has_timestamps() {
        return Err(RuntimeError::Device(
            "this device has no timestamp queries inside compute passes; timing needs them".into(),
        ));
    }
    let stamps = crate::profile::timed_pass(gpu, 2 * RUNS, |pass, stamps| {
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, bind, &[]);
        for r in 0..RUNS {
            stamps.write(pass, 2 * r);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
            stamps.write(pass, 2 * r + 1);
        }
        Ok(())
    })
    .await?;
    let period = f64::from(gpu.queue.get_timestamp_period());
    let mut secs: Vec<f64> = stamps
        .chunks_exact(2)
        .skip(1)
        .map(|p| p[1].saturating_sub(p[0]) as f64 * period * 1e-9)
        .collect();
    secs.sort_by(f64::total_cmp);
    Ok(secs[secs.len() / 2])
}

/// The median GPU time in seconds of `kernel` (an unchecked module, as
/// sessions run it) dispatched `groups` workgroups in a step of `t` tokens
/// at position 0, on operands of the sizes its bindings declare.
pub async fn time_kernel(
    gpu: &Gpu,
    kernel: &Kernel,
    groups: [u32; 3],
    t: u32,
) -> Result<f64, RuntimeError> {
    let device = &gpu.device;
    let context = format!("timing kernel `{}`", kernel.name);
    let (pipeline, buffers) = gpu
        .scoped(&context, || {
            let pipeline = create_pipeline(device, kernel, ShaderChecks::Unchecked);
            let buffers: Vec<wgpu::Buffer> = kernel
                .bindings
                .iter()
                .map(|b| {
                    let words = match (b.port, b.access) {
                        (Port::Params, _) => vec![t, 0, 0, 0],
                        (_, Access::Uniform) => vec![0; (b.bytes.max(16) / 4) as usize],
                        (Port::Counters, _) => vec![0; (b.bytes.max(4) / 4) as usize],
                        _ => vec![filler(b.elem); b.bytes.max(4).div_ceil(4) as usize],
                    };
                    let usage = match b.access {
                        Access::Uniform => wgpu::BufferUsages::UNIFORM,
                        _ => wgpu::BufferUsages::STORAGE,
                    };
                    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some(&b.name),
                        contents: bytemuck::cast_slice(&words),
                        usage,
                    })
                })
                .collect();
            (pipeline, buffers)
        })
        .await?;
    let entries: Vec<wgpu::BindGroupEntry> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: b.as_entire_binding(),
        })
        .collect();
    let bind = gpu
        .scoped(&context, || {
            device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&kernel.name),
                layout: &pipeline.layout,
                entries: &entries,
            })
        })
        .await?;
    time_dispatches(gpu, &pipeline.pipeline, &bind, groups).await
}
