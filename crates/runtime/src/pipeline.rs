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
//! kernels. `SessionOptions::shader_checks` turns them back on (`gerbil-run`
//! maps `GERBIL_SHADER_CHECKS=1` onto it). The surprise: a plan
//! is code — run only plans you trust, or with checks on; and the e2e kernel
//! tests run every template both ways between poisoned guard bands, so an
//! index the templates fail to guard shows up there.
//!
//! [`create_pipelines`] builds a variant's pipelines at load: on native
//! targets on several threads at once (wgpu's device is `Send + Sync`, and
//! the driver's compile is most of a load on a GPU), biggest kernel first;
//! in a browser one after another. Each worker thread opens its own error
//! scopes (wgpu's scopes belong to the thread that pushed them), and the
//! errors are reported in kernel order, naming the kernel.

use crate::device::Gpu;
use crate::error::RuntimeError;
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShaderChecks {
    /// Bounds checks, loop bounding and zeroed workgroup memory (WebGPU's defaults).
    Checked,
    /// None of them: the kernels' own guards keep every index in range.
    #[default]
    Unchecked,
}

/// Creates the pipeline of `kernel` with an explicit layout built from its
/// binding declarations. Errors surface through the device's error scopes.
pub fn create_pipeline(
    device: &wgpu::Device,
    kernel: &Kernel,
    checks: ShaderChecks,
) -> KernelPipeline {
    create_pipeline_cached(device, kernel, checks, None)
}

/// Like [`create_pipeline`], through the driver's pipeline `cache` when
/// given (see [`crate::pipeline_cache`]).
pub fn create_pipeline_cached(
    device: &wgpu::Device,
    kernel: &Kernel,
    checks: ShaderChecks,
    cache: Option<&wgpu::PipelineCache>,
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
        // SAFETY: a plan is code, and this trusts it like a shared library:
        // only plans from a trusted source may run unchecked (a plan edited
        // by someone else can read or write any GPU memory its bindings
        // reach). For plans gerbilc wrote, generated kernels guard every
        // index with the shape constants their bindings are sized by (the
        // plan validator checks the sizes), data-dependent indices are
        // checked by the session, and every loop is bounded by a constant or
        // a step parameter.
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
        cache,
    });
    KernelPipeline { layout, pipeline }
}

/// Most threads [`create_pipelines`] uses (more compile no faster: drivers
/// serialize parts of pipeline creation).
#[cfg(not(target_arch = "wasm32"))]
const MAX_THREADS: usize = 16;

/// Creates the pipelines of `kernels`, in their order, through `cache` when
/// given; on native targets on up to [`MAX_THREADS`] threads (one per core,
/// or `threads` when given, at least 1). Returns the pipelines and how many
/// threads built them.
pub async fn create_pipelines(
    gpu: &Gpu,
    kernels: &[&Kernel],
    checks: ShaderChecks,
    cache: Option<&wgpu::PipelineCache>,
    threads: Option<usize>,
) -> Result<(Vec<KernelPipeline>, usize), RuntimeError> {
    #[cfg(target_arch = "wasm32")]
    let _ = threads;
    #[cfg(not(target_arch = "wasm32"))]
    {
        let threads = threads
            .map(|n| n.max(1))
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .min(MAX_THREADS)
            .min(kernels.len());
        if threads > 1 {
            let pipelines = create_in_parallel(gpu, kernels, checks, cache, threads).await?;
            return Ok((pipelines, threads));
        }
    }
    let mut pipelines = Vec::with_capacity(kernels.len());
    for k in kernels {
        let p = gpu
            .scoped(&format!("creating pipeline `{}`", k.name), || {
                create_pipeline_cached(&gpu.device, k, checks, cache)
            })
            .await?;
        pipelines.push(p);
    }
    Ok((pipelines, 1))
}

/// An error scope's result, awaited on the calling thread after a worker
/// thread popped it.
#[cfg(not(target_arch = "wasm32"))]
type ScopeResult = std::pin::Pin<Box<dyn std::future::Future<Output = Option<wgpu::Error>> + Send>>;

/// [`create_pipelines`] on `threads` worker threads, each taking the next
/// kernel, largest WGSL first so that the slowest compiles start early.
#[cfg(not(target_arch = "wasm32"))]
async fn create_in_parallel(
    gpu: &Gpu,
    kernels: &[&Kernel],
    checks: ShaderChecks,
    cache: Option<&wgpu::PipelineCache>,
    threads: usize,
) -> Result<Vec<KernelPipeline>, RuntimeError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut order: Vec<usize> = (0..kernels.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(kernels[i].wgsl.len()));
    let next = AtomicUsize::new(0);
    let worker = || {
        let mut made = Vec::new();
        while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
            let oom = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let validation = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
            let p = create_pipeline_cached(&gpu.device, kernels[i], checks, cache);
            let v: ScopeResult = Box::pin(validation.pop());
            let o: ScopeResult = Box::pin(oom.pop());
            made.push((i, p, v, o));
        }
        made
    };
    let made: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut slots: Vec<Option<KernelPipeline>> = (0..kernels.len()).map(|_| None).collect();
    let mut first_error: Option<(usize, RuntimeError)> = None;
    for (i, p, v, o) in made {
        let (v, o) = (v.await, o.await);
        let context = || format!("creating pipeline `{}`", kernels[i].name);
        let error = if o.is_some() {
            Some(gpu.out_of_memory(&context(), None))
        } else {
            v.map(|e| RuntimeError::Validation {
                context: context(),
                message: e.to_string(),
            })
        };
        match error {
            Some(e) if first_error.as_ref().is_none_or(|(j, _)| i < *j) => {
                first_error = Some((i, e))
            }
            Some(_) => {}
            None => slots[i] = Some(p),
        }
    }
    if let Some((_, e)) = first_error {
        return Err(e);
    }
    Ok(slots.into_iter().flatten().collect())
}
