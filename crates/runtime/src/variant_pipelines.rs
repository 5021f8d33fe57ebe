//! The pipelines of the variant a session runs, each created when a step
//! first needs it.
//!
//! Opening a session creates every kernel's bind-group and pipeline layouts
//! (cheap: the bind groups are made against them), but no pipeline: creating
//! one is WGSL → SPIR-V → the driver's machine code, most of a cold load on
//! a GPU (the 1B's 2 s of 2.7) and on lavapipe. Before a step is recorded,
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
//! The surprise: a pipeline is created by the `async` step that needs it,
//! not in [`crate::Session::record`], which is synchronous (recording
//! happens inside a compute pass) and cannot wait for error scopes in a
//! browser. Recording a dispatch whose pipeline was never ensured is an
//! internal error, reported rather than skipped.

use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::pipeline::{create_layout, create_pipelines, KernelLayout, ShaderChecks};
use crate::pipeline_cache::{PipelineCacheState, Store};
use crate::session::SessionOptions;
use gerbil_plan::{Kernel, PlanHeader, Variant};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

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
    pipelines: Vec<OnceLock<wgpu::ComputePipeline>>,
    checks: ShaderChecks,
    threads: Option<usize>,
    store: Store,
    stats: Mutex<PipelineStats>,
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
        Ok(VariantPipelines {
            slots: kernels.iter().enumerate().map(|(s, &k)| (k, s)).collect(),
            pipelines: kernels.iter().map(|_| OnceLock::new()).collect(),
            kernels,
            layouts,
            checks,
            threads: opts.pipeline_threads,
            store,
            stats: Mutex::new(PipelineStats::default()),
        })
    }

    /// The slot of plan kernel `kernel` (one the variant dispatches).
    pub(crate) fn slot(&self, kernel: u32) -> usize {
        self.slots[&kernel]
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
    /// and writes the pipeline cache back if it grew.
    pub(crate) async fn ensure(
        &self,
        gpu: &Gpu,
        header: &PlanHeader,
        slots: impl IntoIterator<Item = usize>,
    ) -> Result<(), RuntimeError> {
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
        let jobs: Vec<(&Kernel, &wgpu::PipelineLayout)> = missing
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
        if let Ok(mut stats) = self.stats.lock() {
            stats.created += missing.len();
            stats.time += clock.elapsed();
            stats.threads = stats.threads.max(threads);
        }
        tracing::debug!(
            created = missing.len(),
            ms = clock.elapsed().as_secs_f64() * 1e3,
            "pipelines created on demand"
        );
        Ok(())
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
