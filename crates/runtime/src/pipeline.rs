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
//! [`create_pipelines`] builds the pipelines a step needs first
//! ([`crate::variant_pipelines`]): on native targets on several threads at once (wgpu's device is `Send + Sync`, and
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
    let layout = create_layout(device, kernel);
    let pipeline = compile(device, kernel, &layout.pipeline, checks, None);
    KernelPipeline {
        layout: layout.bind_group,
        pipeline,
    }
}

/// A kernel's bind-group layout (group 0) and the pipeline layout holding
/// it: cheap to create, and all a bind group needs, so a session makes them
/// at load and the pipeline only when a step needs it
/// ([`crate::variant_pipelines`]).
pub struct KernelLayout {
    /// Layout of the kernel's bindings, for creating bind groups.
    pub bind_group: wgpu::BindGroupLayout,
    /// The pipeline layout the kernel's pipeline is created with.
    pub pipeline: wgpu::PipelineLayout,
}

/// Creates `kernel`'s layouts from its binding declarations.
pub fn create_layout(device: &wgpu::Device, kernel: &Kernel) -> KernelLayout {
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
    let bind_group = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(&kernel.name),
        entries: &entries,
    });
    let pipeline = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(&kernel.name),
        bind_group_layouts: &[Some(&bind_group)],
        immediate_size: 0,
    });
    KernelLayout {
        bind_group,
        pipeline,
    }
}

/// Compiles `kernel` into a pipeline of `layout`, through the driver's
/// pipeline `cache` when given (see [`crate::pipeline_cache`]); logs how
/// long it took at debug level (`GERBIL_LOG=debug`: which kernels a cold
/// start waits for).
fn compile(
    device: &wgpu::Device,
    kernel: &Kernel,
    layout: &wgpu::PipelineLayout,
    checks: ShaderChecks,
    cache: Option<&wgpu::PipelineCache>,
) -> wgpu::ComputePipeline {
    let clock = web_time::Instant::now();
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
        layout: Some(layout),
        module: &module,
        entry_point: Some(&kernel.entry),
        compilation_options: wgpu::PipelineCompilationOptions {
            zero_initialize_workgroup_memory: checks == ShaderChecks::Checked,
            ..Default::default()
        },
        cache,
    });
    tracing::debug!(
        kernel = kernel.name,
        ms = clock.elapsed().as_secs_f64() * 1e3,
        "pipeline created"
    );
    pipeline
}

/// Most threads [`create_pipelines`] uses (more compile no faster: drivers
/// serialize parts of pipeline creation).
#[cfg(not(target_arch = "wasm32"))]
const MAX_THREADS: usize = 16;

/// Threads that create `jobs` pipelines: `threads` when given (at least 1),
/// else one per core; at most [`MAX_THREADS`] and `jobs`.
#[cfg(not(target_arch = "wasm32"))]
pub fn worker_threads(threads: Option<usize>, jobs: usize) -> usize {
    threads
        .map(|n| n.max(1))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .min(MAX_THREADS)
        .min(jobs)
}

/// A kernel to compile and the pipeline layout it gets.
pub type PipelineJob<'a> = (&'a Kernel, &'a wgpu::PipelineLayout);

/// Creates the pipelines of `jobs`, in their order, through `cache` when
/// given; on native targets on up to [`MAX_THREADS`] threads (one per core,
/// or `threads` when given, at least 1). Returns the pipelines and how many
/// threads built them.
pub async fn create_pipelines(
    gpu: &Gpu,
    jobs: &[PipelineJob<'_>],
    checks: ShaderChecks,
    cache: Option<&wgpu::PipelineCache>,
    threads: Option<usize>,
) -> Result<(Vec<wgpu::ComputePipeline>, usize), RuntimeError> {
    #[cfg(target_arch = "wasm32")]
    let _ = threads;
    #[cfg(not(target_arch = "wasm32"))]
    {
        let threads = worker_threads(threads, jobs.len());
        if threads > 1 {
            let pipelines = create_in_parallel(gpu, jobs, checks, cache, threads).await?;
            return Ok((pipelines, threads));
        }
    }
    let mut pipelines = Vec::with_capacity(jobs.len());
    for &(k, layout) in jobs {
        let p = gpu
            .scoped(&format!("creating pipeline `{}`", k.name), || {
                compile(&gpu.device, k, layout, checks, cache)
            })
            .await?;
        pipelines.push(p);
    }
    Ok((pipelines, 1))
}

/// An error scope's result, awaited after a worker thread popped it.
#[cfg(not(target_arch = "wasm32"))]
type ScopeResult = std::pin::Pin<Box<dyn std::future::Future<Output = Option<wgpu::Error>> + Send>>;

/// A pipeline a worker thread created, with its out-of-memory and
/// validation scopes (popped on that thread, awaited by whoever reports).
#[cfg(not(target_arch = "wasm32"))]
type Scoped = (wgpu::ComputePipeline, ScopeResult, ScopeResult);

/// Runs `make` for each job on `threads` worker threads, each taking the
/// next job in `order` until none is left or `stop` is set; each pipeline
/// is compiled inside
/// error scopes of the worker's own (wgpu's scopes belong to the thread
/// that pushed them) and handed to `made` with its job's index.
#[cfg(not(target_arch = "wasm32"))]
fn compile_on_workers(
    gpu: &Gpu,
    jobs: &[PipelineJob<'_>],
    order: &[usize],
    (checks, cache, threads): (ShaderChecks, Option<&wgpu::PipelineCache>, usize),
    stop: Option<&std::sync::atomic::AtomicBool>,
    made: &(dyn Fn(usize, Scoped) + Sync),
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let stopped = || stop.is_some_and(|s| s.load(Ordering::Relaxed));
    let worker = || {
        while let Some(&i) = order
            .get(next.fetch_add(1, Ordering::Relaxed))
            .filter(|_| !stopped())
        {
            let oom = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let validation = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
            let (kernel, layout) = jobs[i];
            let p = compile(&gpu.device, kernel, layout, checks, cache);
            made(i, (p, Box::pin(validation.pop()), Box::pin(oom.pop())));
        }
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        for h in handles {
            h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        }
    });
}

/// [`create_pipelines`] on `threads` worker threads, each taking the next
/// kernel, largest WGSL first so that the slowest compiles start early.
#[cfg(not(target_arch = "wasm32"))]
async fn create_in_parallel(
    gpu: &Gpu,
    jobs: &[PipelineJob<'_>],
    checks: ShaderChecks,
    cache: Option<&wgpu::PipelineCache>,
    threads: usize,
) -> Result<Vec<wgpu::ComputePipeline>, RuntimeError> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(jobs[i].0.wgsl.len()));
    let made = std::sync::Mutex::new(Vec::new());
    compile_on_workers(
        gpu,
        jobs,
        &order,
        (checks, cache, threads),
        None,
        &|i, scoped| {
            if let Ok(mut made) = made.lock() {
                made.push((i, scoped));
            }
        },
    );
    let made = made
        .into_inner()
        .map_err(|_| RuntimeError::Device("a thread creating pipelines panicked".into()))?;
    let mut slots: Vec<Option<wgpu::ComputePipeline>> = (0..jobs.len()).map(|_| None).collect();
    let mut first_error: Option<(usize, RuntimeError)> = None;
    for (i, (p, v, o)) in made {
        let (v, o) = (v.await, o.await);
        let context = || format!("creating pipeline `{}`", jobs[i].0.name);
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

/// Creates the pipelines of `jobs` on `threads` worker threads
/// ([`worker_threads`]), in the order given, and hands each to `publish`
/// with its job's index the moment it exists: `Some` pipeline, or `None` where creating it raised an error
/// (the caller creates that one again where it can report the error).
/// For a thread of its own ([`crate::variant_pipelines`]): it blocks until
/// every job is done, or until `stop` is set and the compiles under way
/// have ended (no job starts after it is set).
#[cfg(not(target_arch = "wasm32"))]
pub fn create_each(
    gpu: &Gpu,
    jobs: &[PipelineJob<'_>],
    (checks, cache, threads): (ShaderChecks, Option<&wgpu::PipelineCache>, usize),
    stop: &std::sync::atomic::AtomicBool,
    publish: &(dyn Fn(usize, Option<wgpu::ComputePipeline>) + Sync),
) {
    let order: Vec<usize> = (0..jobs.len()).collect();
    compile_on_workers(
        gpu,
        jobs,
        &order,
        (checks, cache, threads),
        Some(stop),
        &|i, (p, v, o)| {
            // Native scopes are settled when popped: these futures are ready.
            let failed = pollster::block_on(v).is_some() | pollster::block_on(o).is_some();
            publish(i, (!failed).then_some(p));
        },
    );
}
