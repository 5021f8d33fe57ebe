//! The pipelines of the variant a session runs, each created when a step
//! first needs it.
//!
//! Opening a session creates every kernel's bind-group and pipeline layouts
//! (cheap: the bind groups are made against them), but no pipeline: creating
//! one is WGSL → SPIR-V → the driver's machine code, much of a cold start on
//! a GPU (0.3–0.5 s of the Llama-3.2-1B shape's cold first token on an
//! H200, 0.8–1.4 s per tensor-core GEMM) and on lavapipe. Before a step is
//! recorded, [`VariantPipelines::ensure`] creates the pipelines of the
//! dispatches that step runs and that do not exist yet — all of them at
//! once, in parallel where the platform has threads
//! ([`crate::pipeline::create_pipelines`]) — and writes the pipeline cache
//! back when it grew. So a short prompt never compiles the long prompts'
//! GEMM tiles, a session that never serves never compiles the batch step's
//! kernels, and the first token waits only for its own kernels.
//! [`crate::Session::create_all_pipelines`] creates the rest at once (a
//! server does, so that no client waits for a compile).
//!
//! On a native machine with cores to spare (at least [`BACKGROUND_CORES`]
//! threads, or as [`SessionOptions::background_pipelines`] says), opening
//! also starts a thread that creates the prefill and decode pipelines while
//! the weights upload — the prefill fallback's first, where the session has
//! one ([`crate::session::PrefillFallback`]) — and publishes each the moment
//! it exists: a step waits only for the pipelines it needs, and
//! [`VariantPipelines::compiling`] tells whether the thread still has some
//! of them to make, without waiting.
//! On few cores (a CI machine, lavapipe) the thread and the upload would
//! fight for the same cores, and the thread would compile kernels a short
//! prompt never runs, so it stays off there.
//!
//! The surprise: a pipeline is created by the `async` step that needs it,
//! not in [`crate::Session::record`], which is synchronous (recording
//! happens inside a compute pass) and cannot wait for error scopes in a
//! browser. Recording a dispatch whose pipeline was never ensured is an
//! internal error, reported rather than skipped. A pipeline the background
//! thread failed to create is left to the step, which creates it again and
//! reports the error.

use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::pipeline::{create_layout, create_pipelines, KernelLayout, PipelineJob, ShaderChecks};
use crate::pipeline_cache::{PipelineCacheState, Store};
use crate::session::SessionOptions;
use gerbil_plan::{Dispatch, Kernel, PlanHeader, Variant};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// Threads a machine needs for [`VariantPipelines`] to create pipelines in
/// the background by default.
pub const BACKGROUND_CORES: usize = 8;

/// Pipelines created so far and the time steps spent on them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Pipelines created (by steps, or by the background thread).
    pub created: usize,
    /// Of those, the ones the background thread created.
    pub background: usize,
    /// Wall time steps spent creating pipelines or waiting for the
    /// background thread's (and writing the pipeline cache).
    pub time: Duration,
    /// The most threads one round of creation used.
    pub threads: usize,
}

/// The pipelines, each set once it exists, and the slots the background
/// thread has still to create.
struct Cells {
    pipelines: Vec<OnceLock<wgpu::ComputePipeline>>,
    pending: Mutex<HashSet<usize>>,
    changed: Condvar,
    /// Set when the session goes: the background thread starts no more.
    #[cfg(not(target_arch = "wasm32"))]
    stop: std::sync::atomic::AtomicBool,
}

impl Cells {
    /// Sets `slot`'s pipeline (a `None` leaves it to the step that needs
    /// it) and wakes the steps waiting for the background thread.
    #[cfg(not(target_arch = "wasm32"))]
    fn publish(&self, slot: usize, pipeline: Option<wgpu::ComputePipeline>) {
        if let Some(p) = pipeline {
            let _ = self.pipelines[slot].set(p);
        }
        if let Ok(mut pending) = self.pending.lock() {
            pending.remove(&slot);
        }
        self.changed.notify_all();
    }

    /// Waits until the background thread is done with every slot of
    /// `slots`; returns whether it had to wait.
    fn wait_for(&self, slots: &[usize]) -> bool {
        let Ok(mut pending) = self.pending.lock() else {
            return false;
        };
        let mut waited = false;
        while slots.iter().any(|s| pending.contains(s)) {
            waited = true;
            pending = match self.changed.wait(pending) {
                Ok(p) => p,
                Err(_) => break,
            };
        }
        waited
    }
}

/// Clears the background thread's pending slots however the thread ends
/// (a panic included), so that no step waits for it forever.
#[cfg(not(target_arch = "wasm32"))]
struct Finished(Arc<Cells>);

#[cfg(not(target_arch = "wasm32"))]
impl Drop for Finished {
    fn drop(&mut self) {
        if let Ok(mut pending) = self.0.pending.lock() {
            pending.clear();
        }
        self.0.changed.notify_all();
    }
}

/// The kernels one variant dispatches (and its prefill fallback's prefill
/// kernels): layouts made at load, pipelines made on demand. Kernels of
/// other variants are never compiled: they may need features this device
/// lacks.
pub(crate) struct VariantPipelines {
    /// Plan kernel index → slot in the vectors below.
    slots: HashMap<u32, usize>,
    /// Each slot's plan kernel index.
    kernels: Vec<u32>,
    layouts: Vec<KernelLayout>,
    cells: Arc<Cells>,
    checks: ShaderChecks,
    threads: Option<usize>,
    store: Arc<Store>,
    stats: Arc<Mutex<PipelineStats>>,
    /// The background thread, stopped and joined when the session goes.
    #[cfg(not(target_arch = "wasm32"))]
    background: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Stops the background thread taking new pipelines and waits for the
/// compiles under way: a driver still compiling on another thread while
/// the process exits and the driver unloads crashed it (SIGSEGV after a
/// short cold `gerbil-run` on an H200, whose first prompt ran on the
/// prefill fallback while the tensor-core pipelines compiled).
#[cfg(not(target_arch = "wasm32"))]
impl Drop for VariantPipelines {
    fn drop(&mut self) {
        self.cells
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let handle = self.background.get_mut().ok().and_then(Option::take);
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }
}

impl VariantPipelines {
    /// The layouts of every kernel `v` dispatches and `fallback` prefills
    /// with, and the pipeline cache `opts` asks for (opened, not yet used).
    pub(crate) async fn open(
        gpu: &Gpu,
        header: &PlanHeader,
        v: &Variant,
        fallback: &[Dispatch],
        opts: &SessionOptions,
    ) -> Result<Self, RuntimeError> {
        let mut kernels: Vec<u32> = v
            .prefill
            .iter()
            .chain(&v.decode)
            .chain(&v.batch)
            .chain(fallback)
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
            cells: Arc::new(Cells {
                pipelines: kernels.iter().map(|_| OnceLock::new()).collect(),
                pending: Mutex::new(HashSet::new()),
                changed: Condvar::new(),
                #[cfg(not(target_arch = "wasm32"))]
                stop: std::sync::atomic::AtomicBool::new(false),
            }),
            kernels,
            layouts,
            checks,
            threads: opts.pipeline_threads,
            store: Arc::new(store),
            stats: Arc::new(Mutex::new(PipelineStats::default())),
            #[cfg(not(target_arch = "wasm32"))]
            background: Mutex::new(None),
        };
        #[cfg(not(target_arch = "wasm32"))]
        if wants_background(opts) {
            // The prefill, then the decode; with a fallback, its prefill
            // first (the first prompt runs on it), then the decode (the
            // first tokens), then the variant's own prefill (for the prompts
            // after). Largest first in each group.
            let groups = match fallback {
                [] => [&v.prefill[..], &v.decode, &[]],
                _ => [fallback, &v.decode, &v.prefill],
            };
            let mut order = Vec::new();
            for list in groups {
                let mut group: Vec<usize> = list
                    .iter()
                    .filter_map(|d| out.slot(d.kernel).ok())
                    .collect();
                group.sort_by_key(|&s| std::cmp::Reverse(out.source(header, s).wgsl.len()));
                order.extend(group);
            }
            let mut seen = HashSet::new();
            order.retain(|&s| seen.insert(s));
            out.start_background(gpu, header, order);
        }
        Ok(out)
    }

    /// The kernel of `slot`.
    fn source<'h>(&self, header: &'h PlanHeader, slot: usize) -> &'h Kernel {
        &header.kernels[self.kernels[slot] as usize]
    }

    /// Starts the thread that creates the pipelines of `slots`, in their
    /// order (a failure to start it leaves them to the steps).
    #[cfg(not(target_arch = "wasm32"))]
    fn start_background(&self, gpu: &Gpu, header: &PlanHeader, slots: Vec<usize>) {
        let jobs: Vec<(Kernel, wgpu::PipelineLayout, usize)> = slots
            .iter()
            .map(|&s| {
                (
                    self.source(header, s).clone(),
                    self.layouts[s].pipeline.clone(),
                    s,
                )
            })
            .collect();
        let threads = crate::pipeline::worker_threads(self.threads, jobs.len());
        if let Ok(mut pending) = self.cells.pending.lock() {
            pending.extend(slots);
        }
        if let Ok(mut stats) = self.stats.lock() {
            stats.threads = stats.threads.max(threads);
        }
        let (gpu, cells, store) = (gpu.clone(), self.cells.clone(), self.store.clone());
        let (checks, stats) = (self.checks, self.stats.clone());
        let spawned = std::thread::Builder::new()
            .name("gerbil-pipelines".into())
            .spawn(move || {
                let _finished = Finished(cells.clone());
                let refs: Vec<PipelineJob<'_>> = jobs.iter().map(|(k, l, _)| (k, l)).collect();
                let publish = |i: usize, p: Option<wgpu::ComputePipeline>| {
                    if p.is_some() {
                        if let Ok(mut stats) = stats.lock() {
                            stats.background += 1;
                        }
                    }
                    cells.publish(jobs[i].2, p)
                };
                let cache = store.cache.as_ref();
                let how = (checks, cache, threads);
                crate::pipeline::create_each(&gpu, &refs, how, &cells.stop, &publish);
                store.save();
            });
        match spawned {
            Ok(handle) => {
                if let Ok(mut background) = self.background.lock() {
                    *background = Some(handle);
                }
            }
            Err(e) => {
                tracing::debug!("no background pipeline thread: {e}");
                if let Ok(mut pending) = self.cells.pending.lock() {
                    pending.clear();
                }
            }
        }
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

    /// The pipeline of `slot`, if it has been created.
    pub(crate) fn get(&self, slot: usize) -> Option<&wgpu::ComputePipeline> {
        self.cells.pipelines[slot].get()
    }

    /// Whether the background thread has yet to create a pipeline of
    /// `slots` (without waiting for any). A slot it failed to create, or
    /// never had, is not pending: the step creates it and reports an error.
    pub(crate) fn compiling(&self, mut slots: impl Iterator<Item = usize>) -> bool {
        let Ok(pending) = self.cells.pending.lock() else {
            return false;
        };
        slots.any(|s| pending.contains(&s))
    }

    /// What the pipeline cache did when it was opened.
    pub(crate) fn cache_state(&self) -> PipelineCacheState {
        self.store.state
    }

    /// Pipelines created so far.
    pub(crate) fn stats(&self) -> PipelineStats {
        let created = self.cells.pipelines.iter().filter(|c| c.get().is_some());
        PipelineStats {
            created: created.count(),
            ..self.stats.lock().map(|s| *s).unwrap_or_default()
        }
    }

    /// Creates the pipelines of `slots` that do not exist yet, in parallel,
    /// and writes the pipeline cache back if it grew; first waits for those
    /// the background thread is creating.
    pub(crate) async fn ensure(
        &self,
        gpu: &Gpu,
        header: &PlanHeader,
        slots: impl IntoIterator<Item = usize>,
    ) -> Result<(), RuntimeError> {
        let clock = web_time::Instant::now();
        let mut missing: Vec<usize> = slots
            .into_iter()
            .filter(|&s| self.get(s).is_none())
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            return Ok(());
        }
        let waited = self.cells.wait_for(&missing);
        // Those the background thread made, while this step waited or just
        // before.
        missing.retain(|&s| self.get(s).is_none());
        if missing.is_empty() {
            if waited {
                self.count(0, clock.elapsed());
            }
            return Ok(());
        }
        let jobs: Vec<PipelineJob<'_>> = missing
            .iter()
            .map(|&s| (self.source(header, s), &self.layouts[s].pipeline))
            .collect();
        let cache = self.store.cache.as_ref();
        let (made, threads) =
            create_pipelines(gpu, &jobs, self.checks, cache, self.threads).await?;
        for (&s, p) in missing.iter().zip(made) {
            // A concurrent `ensure` of the same slot cannot happen (steps
            // take the session), and losing the race with the background
            // thread only drops a duplicate.
            let _ = self.cells.pipelines[s].set(p);
        }
        self.store.save();
        self.count(threads, clock.elapsed());
        tracing::debug!(
            created = missing.len(),
            ms = clock.elapsed().as_secs_f64() * 1e3,
            "pipelines created on demand"
        );
        Ok(())
    }

    /// Adds `time` spent by a step, on `threads` threads, to the stats.
    fn count(&self, threads: usize, time: Duration) {
        if let Ok(mut stats) = self.stats.lock() {
            stats.time += time;
            stats.threads = stats.threads.max(threads);
        }
    }
}

/// Whether `opts` has the background thread start: as asked, else on a
/// machine of at least [`BACKGROUND_CORES`] threads; never in a browser.
pub(crate) fn wants_background(opts: &SessionOptions) -> bool {
    #[cfg(target_arch = "wasm32")]
    let wanted = {
        let _ = opts;
        false
    };
    #[cfg(not(target_arch = "wasm32"))]
    let wanted = opts.background_pipelines.unwrap_or_else(|| {
        std::thread::available_parallelism().is_ok_and(|n| n.get() >= BACKGROUND_CORES)
    });
    wanted
}
