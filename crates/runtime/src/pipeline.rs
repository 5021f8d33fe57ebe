//! Turning a plan kernel into a wgpu compute pipeline.

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

/// Creates the pipeline of `kernel` with an explicit layout built from its
/// binding declarations. Errors surface through the device's error scopes.
pub fn create_pipeline(device: &wgpu::Device, kernel: &Kernel) -> KernelPipeline {
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
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(&kernel.name),
        source: wgpu::ShaderSource::Wgsl(kernel.wgsl.as_str().into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&kernel.name),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(&kernel.entry),
        compilation_options: wgpu::PipelineCompilationOptions::default(),
        cache: None,
    });
    KernelPipeline { layout, pipeline }
}
