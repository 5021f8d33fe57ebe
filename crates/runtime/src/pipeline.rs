//! Turning a plan kernel into a wgpu compute pipeline, with or without
//! wgpu's shader runtime checks.
//!
//! Generated kernels index their bindings through compile-time shape
//! constants and guard every index with them; the plan validator checks that
//! each binding is exactly the size its kernel declares, and the runtime
//! checks the data-dependent indices (token ids below the vocabulary,
//! positions below the context). So the runtime creates modules
//! [`ShaderChecks::Unchecked`] by default: on NVIDIA wgpu's checks (index
//! clamping, loop bounding, workgroup-memory zeroing) cost 2.5–40× on some
//! kernels. `GERBIL_SHADER_CHECKS=1` turns them back on. The surprise: a plan
//! is code — run only plans you trust, or with checks on; and the e2e kernel
//! tests run every template both ways between poisoned guard bands, so an
//! index the templates fail to guard shows up there.

use gerbil_plan::{Access, Kernel};

/// A kernel's bind-group layout (group 0) and compute pipeline.
pub struct KernelPipeline {
    /// Layout of the kernel's bindings, for creating bind groups.
    pub layout: wgpu::BindGroupLayout,
    /// The pipeline.
    pub pipeline: wgpu::ComputePipeline,
}

fn binding_type(access: Access) -> wgpu::BufferBindingType {
    match access {
        Access::Uniform => wgpu::BufferBindingType::Uniform,
        Access::Read => wgpu::BufferBindingType::Storage { read_only: true },
        Access::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
    }
}

/// Whether shader modules keep wgpu's runtime checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShaderChecks {
    /// Bounds checks, loop bounding and zeroed workgroup memory (WebGPU's defaults).
    Checked,
    /// None of them: the kernels' own guards keep every index in range.
    Unchecked,
}

impl ShaderChecks {
    /// `Checked` when the environment sets `GERBIL_SHADER_CHECKS` to
    /// anything but `0` or the empty string, `Unchecked` otherwise.
    pub fn from_env() -> ShaderChecks {
        match std::env::var("GERBIL_SHADER_CHECKS") {
            Ok(v) if !v.is_empty() && v != "0" => ShaderChecks::Checked,
            _ => ShaderChecks::Unchecked,
        }
    }
}

/// Creates the pipeline of `kernel` with an explicit layout built from its
/// binding declarations. Errors surface through the device's error scopes.
pub fn create_pipeline(
    device: &wgpu::Device,
    kernel: &Kernel,
    checks: ShaderChecks,
) -> KernelPipeline {
    let entries: Vec<wgpu::BindGroupLayoutEntry> = kernel
        .bindings
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupLayoutEntry {
            binding: i as u32,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: binding_type(b.access),
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(&kernel.name),
        entries: &entries,
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(&kernel.name),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(&kernel.name),
        source: wgpu::ShaderSource::Wgsl(kernel.wgsl.as_str().into()),
    };
    let module = match checks {
        ShaderChecks::Checked => device.create_shader_module(desc),
        // SAFETY: generated kernels guard every index with the shape
        // constants their bindings are sized by (the plan validator checks
        // the sizes), data-dependent indices are checked by the session, and
        // every loop is bounded by a constant or a step parameter.
        ShaderChecks::Unchecked => unsafe {
            device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
        },
    };
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&kernel.name),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(&kernel.entry),
        compilation_options: wgpu::PipelineCompilationOptions {
            zero_initialize_workgroup_memory: checks == ShaderChecks::Checked,
            ..Default::default()
        },
        cache: None,
    });
    KernelPipeline { layout, pipeline }
}
