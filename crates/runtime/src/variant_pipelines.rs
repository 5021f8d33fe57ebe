//! The pipelines of the variant a session runs, each created when a step
//! first needs it.
//!
//! Opening a session creates every kernel's bind-group and pipeline layouts
//! (cheap: the bind groups are made against them), but no pipeline: creating
//! one is WGSL → SPIR-V → the driver's machine code, much of a cold start on
//! a GPU (0.3–0.5 s of the Llama-3.2-1B shape's 1.2 s cold first token on
//! an H200, 1.4 s with tensor cores) and on lavapipe. Before a step is recorded,
//! [`VariantPipelines::ensure`] creates the pipelines of the dispatches that
//! step runs and that do not exist yet — all of them at once, in parallel
//! where the platform has threads ([`crate::pipeline::create_pipelines`]) —
//! and writes the pipeline cache back when it grew. So a short prompt never
//! compiles the long prompts' GEMM tiles, a session that never serves never
//! compiles the batch step's kernels, and the first token waits only for its
//! own kernels; the decode kernels follow at the second token.
//! [`VariantPipelines::ensure_all`] creates the rest at once (a server does,
//! so that no client waits for a compile).
//!
//! On a native machine with cores to spare (at least [`BACKGROUND_CORES`]
//! threads, or as [`SessionOptions::background_pipelines`] says), opening
//! also starts a thread that creates the prefill and decode pipelines while
//! the weights upload; the first step waits for it, then creates whatever
//! is still missing. The weight upload (0.4 s of the Llama-3.2-1B shape's
//! load on an H200) and the compile then overlap instead of adding up, and
//! the decode kernels are ready before the second token. On few cores (a CI
//! machine, lavapipe) both would fight for the same cores, and the thread
//! would compile kernels a short prompt never runs, so it stays off there.
//!
//! The surprise: a pipeline is created by the `async` step that needs it,
//! not in [`crate::Session::record`], which is synchronous (recording
//! happens inside a compute pass) and cannot wait for error scopes in a
//! browser. Recording a dispatch whose pipeline was never ensured is an
//! internal error, reported rather than skipped.

use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::pipeline::{create_layout, create_pipelines, KernelLayout, PipelineJob, ShaderChecks};
use crate::pipeline_cache::{PipelineCacheState, Store};
use crate::session::SessionOptions;
use gerbil_plan::{Kernel, PlanHeader, Variant};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Threads a machine needs for [`VariantPipelines`] to create pipelines in
/// the background by default.
pub const BACKGROUND_CORES: usize = 8;

/// The background thread's result: pipelines it created and the threads it
/// created them on.
#[cfg(not(target_arch = "wasm32"))]
type Background = std::thread::JoinHandle<Result<(usize, usize), RuntimeError>>;

/// Pipelines created so far and the time it took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Pipelines created.
    pub created: usize,
    /// Wall time spent creating them (and writing the pipeline cache).
    pub time: Duration,
    /// The most threads one round of creation used.
    pub threads: usize,
}

/// The kernels one variant dispatches: layouts made at load, pipelines made
/// on demand. Kernels of other variants are never compiled: they may need
/// features this device lacks.
pub(crate) struct VariantPipelines {
    /// Plan kernel index → slot in the vectors below.
    slots: HashMap<u32, usize>,
    /// Each slot's plan kernel index.
    kernels: Vec<u32>,
    layouts: Vec<KernelLayout>,
    pipelines: Arc<Vec<OnceLock<wgpu::ComputePipeline>>>,
    checks: ShaderChecks,
    threads: Option<usize>,
    store: Arc<Store>,
    stats: Mutex<PipelineStats>,
    /// The thread creating the prefill and decode pipelines, until a step
    /// waits for it.
    #[cfg(not(target_arch = "wasm32"))]
    background: Mutex<Option<Background>>,
}

impl VariantPipelines {
    /// The layouts of every kernel `v` dispatches, and the pipeline cache
    /// `opts` asks for (opened, not yet used).
    pub(crate) async fn open(
        gpu: &Gpu,
        header: &PlanHeader,
        v: &Variant,
        opts: &SessionOptions,
    ) -> Result<Self, RuntimeError> {
        let mut kernels: Vec<u32> = v
            .prefill
            .iter()
            .chain(&v.decode)
            .chain(&v.batch)
            .map(|d| d.kernel)
            .collect();
        kernels.sort_unstable();
        kernels.dedup();
        let sources: Vec<&Kernel> = kernels
            .iter()
            .map(|&i| &header.kernels[i as usize])
            .collect();
        let checks = opts.shader_checks;
        let store = Store::open(gpu, opts.pipeline_cache.as_ref(), &sources, checks).await;
        let mut layouts = Vec::with_capacity(sources.len());
        for k in &sources {
            let context = format!("creating the bind-group layout of `{}`", k.name);
            layouts.push(
                gpu.scoped(&context, || create_layout(&gpu.device, k))
                    .await?,
            );
        }
        let out = VariantPipelines {
            slots: kernels.iter().enumerate().map(|(s, &k)| (k, s)).collect(),
            pipelines: Arc::new(kernels.iter().map(|_| OnceLock::new()).collect()),
            kernels,
            layouts,
            checks,
            threads: opts.pipeline_threads,
            store: Arc::new(store),
            stats: Mutex::new(PipelineStats::default()),
            #[cfg(not(target_arch = "wasm32"))]
            background: Mutex::new(None),
        };
        #[cfg(not(target_arch = "wasm32"))]
        if wants_background(opts) {
            let slots = v
                .prefill
                .iter()
                .chain(&v.decode)
                .filter_map(|d| out.slot(d.kernel).ok());
            out.start_background(gpu, header, slots);
        }
        Ok(out)
    }

    /// Starts the thread that creates the pipelines of `slots` (a failure to
    /// start one leaves them to the steps).
    #[cfg(not(target_arch = "wasm32"))]
    fn start_background(&self, gpu: &Gpu, header: &PlanHeader, slots: impl Iterator<Item = usize>) {
        let mut slots: Vec<usize> = slots.collect();
        slots.sort_unstable();
        slots.dedup();
        let jobs: Vec<(Kernel, wgpu::PipelineLayout, usize)> = slots
            .into_iter()
            .map(|s| {
                let kernel = header.kernels[self.kernels[s] as usize].clone();
                (kernel, self.layouts[s].pipeline.clone(), s)
            })
            .collect();
        let (gpu, cells, store) = (gpu.clone(), self.pipelines.clone(), self.store.clone());
        let (checks, threads) = (self.checks, self.threads);
        let spawned = std::thread::Builder::new()
            .name("gerbil-pipelines".into())
            .spawn(move || {
                let refs: Vec<PipelineJob<'_>> = jobs.iter().map(|(k, l, _)| (k, l)).collect();
                let cache = store.cache.as_ref();
                let (made, threads) =
                    pollster::block_on(create_pipelines(&gpu, &refs, checks, cache, threads))?;
                for ((_, _, s), p) in jobs.iter().zip(made) {
                    let _ = cells[*s].set(p);
                }
                store.save();
                Ok((jobs.len(), threads))
            });
        match spawned {
            Ok(handle) => {
                if let Ok(mut b) = self.background.lock() {
                    *b = Some(handle);
                }
            }
            Err(e) => tracing::debug!("no background pipeline thread: {e}"),
        }
    }

    /// Waits for the background thread, if one runs: the pipelines it
    /// created and the threads it used (none and 0 without one).
    fn join_background(&self) -> Result<(usize, usize), RuntimeError> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let handle = self.background.lock().ok().and_then(|mut b| b.take());
            if let Some(handle) = handle {
                return handle.join().unwrap_or_else(|_| {
                    Err(RuntimeError::Device(
                        "the thread creating pipelines panicked".into(),
                    ))
                });
            }
        }
        Ok((0, 0))
    }

    /// The slot of plan kernel `kernel` (one the variant dispatches).
    pub(crate) fn slot(&self, kernel: u32) -> Result<usize, RuntimeError> {
        self.slots.get(&kernel).copied().ok_or_else(|| {
            RuntimeError::Device(format!(
                "internal error: kernel {kernel} is not one of the variant's"
            ))
        })
    }

    /// The bind-group layout of `slot`.
    pub(crate) fn layout(&self, slot: usize) -> &wgpu::BindGroupLayout {
        &self.layouts[slot].bind_group
    }

    /// The pipeline of `slot`, if a step has needed it yet.
    pub(crate) fn get(&self, slot: usize) -> Option<&wgpu::ComputePipeline> {
        self.pipelines[slot].get()
    }

    /// What the pipeline cache did when it was opened.
    pub(crate) fn cache_state(&self) -> PipelineCacheState {
        self.store.state
    }

    /// Pipelines created so far.
    pub(crate) fn stats(&self) -> PipelineStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Creates the pipelines of `slots` that do not exist yet, in parallel,
    /// and writes the pipeline cache back if it grew; first waits for the
    /// background thread, if one runs.
    pub(crate) async fn ensure(
        &self,
        gpu: &Gpu,
        header: &PlanHeader,
        slots: impl IntoIterator<Item = usize>,
    ) -> Result<(), RuntimeError> {
        let clock = web_time::Instant::now();
        let (joined, joined_threads) = self.join_background()?;
        if joined > 0 {
            self.count(joined, joined_threads, clock.elapsed());
        }
        let mut missing: Vec<usize> = slots
            .into_iter()
            .filter(|&s| self.pipelines[s].get().is_none())
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            return Ok(());
        }
        let clock = web_time::Instant::now();
        let jobs: Vec<PipelineJob<'_>> = missing
            .iter()
            .map(|&s| {
                let kernel = &header.kernels[self.kernels[s] as usize];
                (kernel, &self.layouts[s].pipeline)
            })
            .collect();
        let cache = self.store.cache.as_ref();
        let (made, threads) =
            create_pipelines(gpu, &jobs, self.checks, cache, self.threads).await?;
        for (&s, p) in missing.iter().zip(made) {
            // A concurrent `ensure` of the same slot cannot happen (steps
            // take the session), and losing that race would only drop a
            // duplicate.
            let _ = self.pipelines[s].set(p);
        }
        self.store.save();
        self.count(missing.len(), threads, clock.elapsed());
        tracing::debug!(
            created = missing.len(),
            ms = clock.elapsed().as_secs_f64() * 1e3,
            "pipelines created on demand"
        );
        Ok(())
    }

    /// Adds `created` pipelines on `threads` threads in `time` to the stats.
    fn count(&self, created: usize, threads: usize, time: Duration) {
        if let Ok(mut stats) = self.stats.lock() {
            stats.created += created;
            stats.time += time;
            stats.threads = stats.threads.max(threads);
        }
    }

    /// Creates every pipeline of the variant that does not exist yet.
    pub(crate) async fn ensure_all(
        &self,
        gpu: &Gpu,
        header: &PlanHeader,
    ) -> Result<(), RuntimeError> {
        self.ensure(gpu, header, 0..self.kernels.len()).await
    }
}

/// Whether `opts` has the background thread start: as asked, else on a
/// machine of at least [`BACKGROUND_CORES`] threads.
#[cfg(not(target_arch = "wasm32"))]
fn wants_background(opts: &SessionOptions) -> bool {
    opts.background_pipelines.unwrap_or_else(|| {
        std::thread::available_parallelism().is_ok_and(|n| n.get() >= BACKGROUND_CORES)
    })
}
