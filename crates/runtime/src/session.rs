//! A loaded plan on a device: buffers and bind groups created once
//! (pipelines when a step first runs them: [`crate::variant_pipelines`]),
//! then steps of prefill or decode, each one submit.
//!
//! Creating a session and running it are `async` (see [`crate::device`]):
//! `Session::new(&plan).await` in a browser or a server,
//! `pollster::block_on(Session::new(&plan))` in a command-line tool.

use crate::device::{DeviceOptions, Gpu};
use crate::error::RuntimeError;
use crate::pipeline::ShaderChecks;
use crate::pipeline_cache::{PipelineCacheOptions, PipelineCacheState};
use crate::progress::{Progress, ProgressHook};
use crate::residency::Residency;
use crate::variant::PrecisionChoice;
use crate::variant_pipelines::{PipelineStats, VariantPipelines};
use gerbil_plan::{
    BufferKind, Dispatch, PlanFile, PlanHeader, Requirements, Variant, STEP_PARAMS_BYTES,
};
use std::collections::HashSet;
use std::time::Duration;

/// Bytes of GPU memory by purpose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Weights (and derived tables).
    pub weights: u64,
    /// KV cache.
    pub kv_cache: u64,
    /// Activation arenas, dispatch scratch, token ids, step parameters, logits.
    pub activations: u64,
}

pub(crate) struct Step {
    pub(crate) pipeline: usize,
    /// One bind group, or one per sequence slot when the dispatch binds a
    /// KV cache of a session with several.
    pub(crate) bind_groups: Vec<wgpu::BindGroup>,
    pub(crate) dispatch: Dispatch,
}

/// A plan resident on a GPU, with its KV cache.
pub struct Session {
    pub(crate) gpu: Gpu,
    pub(crate) header: PlanHeader,
    /// The wgpu buffers the plan's buffers live in.
    residency: Residency,
    /// The variant's pipelines, created as steps first need them.
    pipelines: VariantPipelines,
    pub(crate) prefill: Vec<Step>,
    pub(crate) decode: Vec<Step>,
    /// The prefill fallback's variant and prefill steps, on the same
    /// buffers ([`PrefillFallback`]).
    fallback: Option<(String, Vec<Step>)>,
    /// When prompts may run on the fallback.
    fallback_mode: PrefillFallback,
    /// Whether the last prefill step ran on the fallback (the next step's
    /// schedule, between [`Session::ensure_step_pipelines`] and recording).
    pub(crate) on_fallback: bool,
    /// Prompts run so far (calls of `forward` and embedding steps).
    prompts: u64,
    /// The batch schedule's steps (empty: the plan has none).
    pub(crate) batch: Vec<Step>,
    /// Where a batch step's logits are read back: `max_batch` rows, made
    /// once (a plan with a batch schedule only).
    pub(crate) batch_readback: Option<wgpu::Buffer>,
    /// The variant that runs (its schedules are `prefill` and `decode`).
    variant: Variant,
    readback: wgpu::Buffer,
    /// Tokens in the KV cache of the current slot.
    pub(crate) position: u64,
    /// The sequence slot steps run in ([`Session::set_slot`]).
    slot: usize,
    /// Every slot's position (the current slot's is `position`).
    positions: Vec<u64>,
    /// Positions the KV cache holds: the plan's `max_context` or the smaller
    /// [`SessionOptions::context`].
    context: u64,
    /// Tokens in the last step (the logits row to read when the plan keeps every row).
    pub(crate) last_step_tokens: u64,
    /// Told how far a prompt of several chunks has got ([`Session::set_progress`]).
    progress: Option<ProgressHook>,
    memory: MemoryReport,
    load: LoadReport,
}

/// Creates the bind groups of every dispatch of one schedule: one per
/// sequence slot for a dispatch that binds a KV cache (each slot has its own
/// copy), one for the others; a batch schedule's (`all_slots`) bind every
/// slot's copy at once.
async fn make_steps(
    gpu: &Gpu,
    residency: &Residency,
    kernels: &VariantPipelines,
    list: &[Dispatch],
    (phase, slots, all_slots): (&str, usize, bool),
) -> Result<Vec<Step>, RuntimeError> {
    let mut steps = Vec::with_capacity(list.len());
    for d in list {
        let pipeline = kernels.slot(d.kernel)?;
        let per_slot = !all_slots && d.bindings.iter().any(|s| residency.per_slot(s.buffer));
        let mut bind_groups = Vec::new();
        for slot in 0..if per_slot { slots } else { 1 } {
            let entries: Vec<wgpu::BindGroupEntry> = d
                .bindings
                .iter()
                .enumerate()
                .map(|(i, s)| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: wgpu::BindingResource::Buffer(if all_slots {
                        residency.binding_all_slots(s, slots)
                    } else {
                        residency.binding(s, slot)
                    }),
                })
                .collect();
            let bind_group = gpu
                .scoped(&format!("binding {phase} dispatch `{}`", d.label), || {
                    gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some(&d.label),
                        layout: kernels.layout(pipeline),
                        entries: &entries,
                    })
                })
                .await?;
            bind_groups.push(bind_group);
        }
        steps.push(Step {
            pipeline,
            bind_groups,
            dispatch: d.clone(),
        });
    }
    Ok(steps)
}

/// How [`Session::open`] opens a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Which of the plan's precision variants may run.
    pub precision: PrecisionChoice,
    /// Run this variant of the plan (by name) instead of the best one.
    pub variant: Option<String>,
    /// Enable timestamp queries when the device has them, for
    /// [`Session::profile`](crate::profile).
    pub profiling: bool,
    /// Keep compiled pipelines on disk between loads
    /// ([`crate::pipeline_cache`]); `None` (the default) compiles every
    /// load and writes nothing.
    pub pipeline_cache: Option<PipelineCacheOptions>,
    /// Positions the KV cache holds (`None`: the plan's `max_context`); a
    /// smaller context allocates a smaller KV cache. At most the plan's.
    pub context: Option<u64>,
    /// Open adapter `N` of [`Gpu::adapters`]'s list instead of the
    /// high-performance default (native targets only;
    /// in a browser `Some` is an error).
    pub adapter: Option<usize>,
    /// Told how the weight upload goes ([`Progress::Weights`]), and later
    /// how long prompts go ([`Progress::Prefill`]; see [`Session::set_progress`]).
    pub progress: Option<ProgressHook>,
    /// Request tensor cores where the adapter has them, so the plan's
    /// `tensor-f16` variant can run ([`DeviceOptions::tensor_cores`]; on by
    /// default).
    pub tensor_cores: bool,
    /// Keep wgpu's shader runtime checks ([`ShaderChecks`]; off by default:
    /// they cost 2.5–40× on NVIDIA, and a plan is trusted code).
    pub shader_checks: ShaderChecks,
    /// Threads creating the pipelines a step needs (`None`: one per core, at most 16;
    /// one in a browser).
    pub pipeline_threads: Option<usize>,
    /// Sequence slots: KV caches of `slots` sequences, each kept while steps
    /// run in another ([`Session::set_slot`]); 0 and 1 both mean one.
    pub slots: usize,
    /// Create the prefill and decode pipelines (and the prefill fallback's
    /// prefill: [`PrefillFallback`]) on a thread of their own
    /// while the weights upload (`None`: on native targets with at least
    /// [`BACKGROUND_CORES`](crate::variant_pipelines::BACKGROUND_CORES)
    /// threads; never in a browser). See [`crate::variant_pipelines`].
    pub background_pipelines: Option<bool>,
    /// Whether prompts may run on another variant while this one's prefill
    /// pipelines compile ([`PrefillFallback`]).
    pub prefill_fallback: PrefillFallback,
}

/// Whether a session runs prompts on a *fallback* variant while the prefill
/// pipelines of the variant it chose still compile: the first variant after
/// it in the plan that the device runs, of the same precision, without
/// cooperative matrices, and whose prefill binds only buffers the session
/// already has ([`crate::variant::fallback`]) — `subgroups-f16` for
/// `tensor-f16` (`subgroups-f16-i8` in a plan of quantized weights), whose
/// GEMMs take the driver 0.8–1.4 s each to compile where the SIMT ones take
/// 0.2–0.4 s. Both variants write the same KV caches and
/// logits, so decode continues on the chosen variant; the fallback's logits
/// are within its own tolerance of the reference, not bit-identical to the
/// chosen variant's. Never for a variant named in
/// [`SessionOptions::variant`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillFallback {
    /// Every step runs the chosen variant, waiting for its pipelines
    /// (`gerbil-run --no-prefill-fallback`): results that do not depend on
    /// how fast the driver compiles.
    Off,
    /// While the background thread
    /// ([`SessionOptions::background_pipelines`]) still compiles the chosen
    /// tensor-core variant's prefill pipelines, a prompt chunk runs on the
    /// fallback (whose pipelines the thread creates first).
    #[default]
    WhileCompiling,
    /// The first prompt runs on the fallback, whatever the variant and
    /// however far its pipelines are, later ones on the chosen variant:
    /// deterministic, to test the fallback and time a cold start on it.
    FirstPrompt,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            precision: PrecisionChoice::default(),
            variant: None,
            profiling: false,
            pipeline_cache: None,
            context: None,
            adapter: None,
            progress: None,
            tensor_cores: true,
            shader_checks: ShaderChecks::default(),
            pipeline_threads: None,
            slots: 0,
            background_pipelines: None,
            prefill_fallback: PrefillFallback::default(),
        }
    }
}

/// Where the time of [`Session::open`] went, and what the pipeline cache
/// did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Opening the device (zero when the process had one open already:
    /// native sessions share one device).
    pub device: Duration,
    /// Allocating the buffers.
    pub buffers: Duration,
    /// Uploading the weights.
    pub weights: Duration,
    /// Creating the kernels' layouts and opening the pipeline cache (the
    /// pipelines themselves are created when a step first needs them:
    /// [`Session::pipeline_stats`]).
    pub pipelines: Duration,
    /// Creating the bind groups and the readback buffer.
    pub bind_groups: Duration,
    /// What the pipeline cache did.
    pub pipeline_cache: PipelineCacheState,
}

/// Wall time between laps.
struct Stopwatch {
    last: web_time::Instant,
}

impl Stopwatch {
    fn start() -> Stopwatch {
        Stopwatch {
            last: web_time::Instant::now(),
        }
    }

    /// Time since the start or the previous lap.
    fn lap(&mut self) -> Duration {
        let now = web_time::Instant::now();
        let d = now - self.last;
        self.last = now;
        d
    }
}

/// The buffers `variant` binds, plus the plan's inputs and outputs: the
/// ones a session allocates (another variant's KV caches are not among them).
fn buffers_used(header: &PlanHeader, variant: &Variant) -> HashSet<u32> {
    let io = &header.io;
    let mut used: HashSet<u32> = variant.bound_buffers().collect();
    used.extend([io.step_params, io.token_ids, io.logits.buffer]);
    used.extend(io.next_token.map(|n| n.buffer));
    used.extend(io.sampling_params);
    used.extend(io.step_rows);
    used
}

/// The KV-cache positions a session allocates: `asked`, or the plan's
/// `max_context` when `None`.
fn context_size(header: &PlanHeader, asked: Option<u64>) -> Result<u64, RuntimeError> {
    let max = header.model.max_context;
    match asked {
        None => Ok(max),
        Some(n) if n >= 1 && n <= max => Ok(n),
        Some(n) => Err(RuntimeError::ContextSize { asked: n, max }),
    }
}

/// Bytes of a plan KV cache of `size` bytes for `max_context` positions
/// when it holds only `context` (the cache is position-major: row `p` holds
/// position `p` of every head).
pub(crate) fn kv_bytes(size: u64, context: u64, max_context: u64) -> u64 {
    if context >= max_context || max_context == 0 {
        return size;
    }
    let row = size / max_context;
    (row * context).next_multiple_of(4)
}

/// The prefill fallback `opts` gives a session of `chosen` on `gpu` that
/// allocated `used` ([`PrefillFallback`]): none for a variant asked for by
/// name, with the fallback off, or (`WhileCompiling`) for a variant without
/// tensor cores or a session without a background thread.
fn prefill_fallback<'h>(
    header: &'h PlanHeader,
    gpu: &Gpu,
    chosen: &Variant,
    used: &HashSet<u32>,
    opts: &SessionOptions,
) -> Option<&'h Variant> {
    let wanted = match opts.prefill_fallback {
        PrefillFallback::Off => false,
        PrefillFallback::FirstPrompt => true,
        PrefillFallback::WhileCompiling => {
            chosen
                .features
                .contains(&gerbil_plan::Feature::CooperativeMatrix)
                && crate::variant_pipelines::wants_background(opts)
        }
    };
    if !wanted || opts.variant.is_some() {
        return None;
    }
    let fallback = crate::variant::fallback(header, gpu, chosen, used)?;
    tracing::info!(
        "prompts may run on `{}` while the pipelines of `{}` compile",
        fallback.name,
        chosen.name
    );
    Some(fallback)
}

impl Session {
    /// Opens a device for the plan, uploads its weights and builds every
    /// bind group (pipelines come when steps first run them), running the best variant the device
    /// supports (f16 where it can: [`PrecisionChoice::Auto`]).
    pub async fn new(plan: &PlanFile) -> Result<Session, RuntimeError> {
        Session::open(plan, &SessionOptions::default()).await
    }

    /// Like [`Session::new`], with timestamp queries enabled when the device
    /// has them, for [`Session::profile`](crate::profile).
    pub async fn new_profiling(plan: &PlanFile) -> Result<Session, RuntimeError> {
        let opts = SessionOptions {
            profiling: true,
            ..SessionOptions::default()
        };
        Session::open(plan, &opts).await
    }

    /// Like [`Session::new`], with the precision, profiling and pipeline
    /// cache of `opts`.
    pub async fn open(plan: &PlanFile, opts: &SessionOptions) -> Result<Session, RuntimeError> {
        let mut clock = Stopwatch::start();
        let device = DeviceOptions {
            timestamps: opts.profiling,
            adapter: opts.adapter,
            tensor_cores: opts.tensor_cores,
        };
        let gpu = Gpu::open_on(&Requirements::default(), &device).await?;
        let device = clock.lap();
        let mut session = Session::with_gpu(gpu, plan, opts).await?;
        session.load.device = device;
        let l = &session.load;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        tracing::info!(
            device_ms = ms(l.device),
            buffers_ms = ms(l.buffers),
            weights_ms = ms(l.weights),
            weight_bytes = session.memory.weights,
            layouts_ms = ms(l.pipelines),
            pipeline_cache = l.pipeline_cache.name(),
            bind_groups_ms = ms(l.bind_groups),
            "session loaded"
        );
        Ok(session)
    }

    /// Like [`Session::open`] on an already opened device (`opts.profiling`
    /// is the device's business, so it is not looked at). Runs the best
    /// variant of the plan the device supports at `opts.precision`, or the
    /// one `opts.variant` names ([`crate::variant::pick`]), and allocates
    /// only the buffers it uses.
    pub async fn with_gpu(
        gpu: Gpu,
        plan: &PlanFile,
        opts: &SessionOptions,
    ) -> Result<Session, RuntimeError> {
        let mut clock = Stopwatch::start();
        let mut load = LoadReport::default();
        let header = plan.header.clone();
        let variant =
            crate::variant::pick(&header, &gpu, opts.precision, opts.variant.as_deref())?.clone();
        let used = buffers_used(&header, &variant);
        let context = context_size(&header, opts.context)?;
        let slots = opts.slots.max(1);
        let mut memory = MemoryReport::default();
        for i in &used {
            let decl = &header.buffers[*i as usize];
            match &decl.kind {
                // Saturating: each size is bounded, their number is not.
                BufferKind::Weight { .. } => {
                    memory.weights = memory.weights.saturating_add(decl.size)
                }
                BufferKind::KvCache { .. } => {
                    let bytes = kv_bytes(decl.size, context, header.model.max_context);
                    let bytes = bytes.saturating_mul(slots as u64);
                    memory.kv_cache = memory.kv_cache.saturating_add(bytes)
                }
                _ => memory.activations = memory.activations.saturating_add(decl.size),
            }
        }
        let residency = Residency::allocate(&gpu, &header, &used, context, slots).await?;
        load.buffers = clock.lap();
        let fallback = prefill_fallback(&header, &gpu, &variant, &used, opts);
        let fallback_prefill = fallback.map_or(&[][..], |f| &f.prefill[..]);
        // Before the upload: a background thread may compile while it runs.
        let pipelines =
            VariantPipelines::open(&gpu, &header, &variant, fallback_prefill, opts).await?;
        load.pipeline_cache = pipelines.cache_state();
        load.pipelines = clock.lap();
        residency
            .upload_weights(&gpu, plan, opts.progress.as_ref())
            .await?;
        load.weights = clock.lap();
        let steps = |list, how| make_steps(&gpu, &residency, &pipelines, list, how);
        let prefill = steps(&variant.prefill, ("prefill", slots, false)).await?;
        let decode = steps(&variant.decode, ("decode", slots, false)).await?;
        let batch = steps(&variant.batch, ("batch", slots, true)).await?;
        let fallback = match fallback {
            Some(f) => {
                let prefill = steps(&f.prefill, ("fallback prefill", slots, false)).await?;
                Some((f.name.clone(), prefill))
            }
            None => None,
        };
        let readback_desc = wgpu::BufferDescriptor {
            label: Some("logits readback"),
            // One row of logits (vocab_size ≤ limits::VOCABULARY, validated),
            // or an embedding plan's whole output (validated slice).
            size: match header.model.embedding {
                Some(_) => header.io.logits.size,
                None => header.model.vocab_size * 4,
            },
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        };
        let readback = gpu
            .create_buffer("allocating the logits readback buffer", &readback_desc)
            .await?;
        let batch_readback = if variant.batch.is_empty() {
            None
        } else {
            let desc = wgpu::BufferDescriptor {
                label: Some("batch logits readback"),
                // max_batch ≤ max_tokens_per_step and vocab_size are validated.
                size: crate::batch_step::readback_bytes(&header),
                ..readback_desc
            };
            let buffer = gpu
                .create_buffer("allocating the batch logits readback buffer", &desc)
                .await?;
            Some(buffer)
        };
        load.bind_groups = clock.lap();
        Ok(Session {
            gpu,
            header,
            residency,
            pipelines,
            prefill,
            decode,
            fallback,
            fallback_mode: opts.prefill_fallback,
            on_fallback: false,
            prompts: 0,
            batch,
            batch_readback,
            variant,
            readback,
            position: 0,
            slot: 0,
            positions: vec![0; slots],
            context,
            last_step_tokens: 0,
            progress: opts.progress.clone(),
            memory,
            load,
        })
    }

    /// Plan buffer `i`, one of the plan's inputs and outputs (which have
    /// wgpu buffers of their own: only weights and KV caches are pooled).
    pub(crate) fn buffer(&self, i: u32) -> &wgpu::Buffer {
        self.residency.own(i)
    }

    /// The plan variant this session runs.
    pub fn variant(&self) -> &Variant {
        &self.variant
    }

    /// The plan's header.
    pub fn header(&self) -> &PlanHeader {
        &self.header
    }

    /// The device the session runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// GPU memory by purpose.
    pub fn memory(&self) -> MemoryReport {
        self.memory
    }

    /// Where the load's time went, and what the pipeline cache did.
    pub fn load_report(&self) -> &LoadReport {
        &self.load
    }

    /// Tokens in the KV cache (of the current slot).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Sequence slots: KV caches of this many sequences
    /// ([`SessionOptions::slots`]).
    pub fn slots(&self) -> usize {
        self.positions.len()
    }

    /// The slot steps run in.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Tokens in the KV cache of `slot` (0 for a slot past the last).
    pub fn slot_position(&self, slot: usize) -> u64 {
        if slot == self.slot {
            self.position
        } else {
            self.positions.get(slot).copied().unwrap_or(0)
        }
    }

    /// Runs the following steps in sequence slot `slot` (< [`Session::slots`]):
    /// its own KV cache, at its own position; the current slot's cache is
    /// kept as it is for when steps come back to it. Wait for steps in
    /// flight first ([`Session::sync`]).
    pub fn set_slot(&mut self, slot: usize) -> Result<(), RuntimeError> {
        if slot >= self.positions.len() {
            return Err(RuntimeError::Slot {
                slot,
                slots: self.positions.len(),
            });
        }
        self.positions[self.slot] = self.position;
        self.slot = slot;
        self.position = self.positions[slot];
        Ok(())
    }

    /// Copies the first `rows` positions of slot `from`'s KV cache into
    /// slot `to`'s (on the GPU, in order with the steps) and sets `to`'s
    /// position to `rows`: a prefix computed once serves two sequences.
    /// `rows` is at most `from`'s position.
    pub fn copy_slot_prefix(
        &mut self,
        from: usize,
        to: usize,
        rows: u64,
    ) -> Result<(), RuntimeError> {
        let slots = self.positions.len();
        for slot in [from, to] {
            if slot >= slots {
                return Err(RuntimeError::Slot { slot, slots });
            }
        }
        let rows = rows.min(self.slot_position(from));
        if from != to && rows > 0 {
            // The slots of a cache share one wgpu buffer, and WebGPU copies
            // only between two buffers: through a staging buffer, the copies
            // of every cache in one submission.
            let max_context = self.header.model.max_context.max(1);
            let caches: Vec<(u32, u64)> = (0..self.header.buffers.len() as u32)
                .filter(|&i| self.residency.per_slot(i))
                .map(|i| {
                    let (_, _, size) = self.residency.slot_range(i, from);
                    let row = self.header.buffers[i as usize].size / max_context;
                    (i, (row * rows).next_multiple_of(4).min(size))
                })
                .collect();
            let largest = caches.iter().map(|&(_, b)| b).max().unwrap_or(0);
            let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("KV-cache prefix staging"),
                size: largest.max(4),
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut enc = self
                .gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("copy a KV-cache prefix"),
                });
            for (i, bytes) in caches {
                let (src, src_at, _) = self.residency.slot_range(i, from);
                let (dst, dst_at, _) = self.residency.slot_range(i, to);
                enc.copy_buffer_to_buffer(src, src_at, &staging, 0, bytes);
                enc.copy_buffer_to_buffer(&staging, 0, dst, dst_at, bytes);
            }
            self.gpu.queue.submit([enc.finish()]);
        }
        if to == self.slot {
            self.position = rows;
        } else {
            self.positions[to] = rows;
        }
        Ok(())
    }

    /// Forgets the KV cache of the current slot (the next step starts at
    /// position 0).
    pub fn reset(&mut self) {
        self.position = 0;
    }

    /// Forgets the KV cache of every slot.
    pub fn reset_all(&mut self) {
        self.position = 0;
        self.positions.iter_mut().for_each(|p| *p = 0);
    }

    /// Keeps only the first `position` tokens of the KV cache (no-op when it
    /// holds fewer): the next step continues from there. How a chat reuses
    /// the cache of a conversation's earlier turns.
    pub fn truncate(&mut self, position: u64) {
        self.position = self.position.min(position);
    }

    /// Positions the KV cache holds: the plan's `max_context`, or the
    /// smaller [`SessionOptions::context`] it was opened with.
    pub fn context(&self) -> u64 {
        self.context
    }

    /// Sets (or with `None` removes) the hook told [`Progress::Prefill`]
    /// while [`Session::forward`] runs a prompt longer than the plan's
    /// `max_tokens_per_step`: after each chunk, with the prompt's tokens done
    /// and in all. With a hook set, such prompts wait for the GPU after every
    /// chunk (a few per cent of prefill time); shorter inputs and decode
    /// steps are untouched. A session starts with
    /// [`SessionOptions::progress`].
    pub fn set_progress(&mut self, hook: Option<ProgressHook>) {
        self.progress = hook;
    }

    /// Vocabulary size (logits per step).
    pub fn vocab_size(&self) -> u64 {
        self.header.model.vocab_size
    }

    /// Runs the model on `tokens` (appended after the cached ones) and returns
    /// the logits of the last one. Long inputs run in chunks of
    /// `max_tokens_per_step`; a single token uses the decode schedule.
    pub async fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        self.forward_no_readback(tokens).await?;
        self.read_logits().await
    }

    /// Like [`Session::forward`] but leaves the logits on the GPU.
    pub async fn forward_no_readback(&mut self, tokens: &[u32]) -> Result<(), RuntimeError> {
        self.expect_logits()?;
        self.run_tokens(tokens).await
    }

    /// Runs `tokens` after the cached ones, in chunks of the plan's step.
    async fn run_tokens(&mut self, tokens: &[u32]) -> Result<(), RuntimeError> {
        if tokens.is_empty() {
            return Err(RuntimeError::EmptyInput);
        }
        let max = self.context;
        let needed = self.position.saturating_add(tokens.len() as u64);
        if needed > max {
            return Err(RuntimeError::ContextOverflow { needed, max });
        }
        let vocab = self.vocab_size();
        if let Some(&id) = tokens.iter().find(|&&id| u64::from(id) >= vocab) {
            return Err(RuntimeError::TokenOutOfRange { id, vocab });
        }
        let chunk = self.header.model.max_tokens_per_step as usize;
        let hook = self.progress.clone().filter(|_| tokens.len() > chunk);
        let total = tokens.len() as u64;
        let mut done = 0;
        for part in tokens.chunks(chunk) {
            self.ensure_step_pipelines(part.len()).await?;
            self.gpu
                .scoped("running a step", || self.run_step(part))
                .await??;
            self.position += part.len() as u64;
            self.last_step_tokens = part.len() as u64;
            done += part.len() as u64;
            if total > 1 {
                tracing::debug!(
                    done,
                    total,
                    position = self.position,
                    "prefill chunk submitted"
                );
            }
            if let Some(hook) = &hook {
                self.gpu.idle().await?;
                hook.report(Progress::Prefill { done, total });
            }
        }
        self.prompts += 1;
        Ok(())
    }

    /// Checks a batch step's rows and writes its inputs (the step's `T`,
    /// the token ids, each row's KV-cache row and position); returns `T`
    /// and the rows each slot takes.
    pub(crate) fn prepare_batch(
        &mut self,
        rows: &[(usize, u32)],
    ) -> Result<(u32, Vec<u64>), RuntimeError> {
        if self.batch.is_empty() {
            return Err(RuntimeError::NoBatchSchedule);
        }
        let max = self.header.io.max_batch;
        let slots = self.positions.len();
        // Rows fed to each slot so far in this step.
        let mut taken = vec![0u64; slots];
        if rows.is_empty() || rows.len() > max as usize {
            let given = format!("{} rows", rows.len());
            return Err(RuntimeError::BatchSize { given, max });
        }
        let vocab = self.vocab_size();
        let mut table = Vec::with_capacity(2 * rows.len());
        for &(slot, token) in rows {
            if slot >= slots {
                return Err(RuntimeError::Slot { slot, slots });
            }
            if u64::from(token) >= vocab {
                return Err(RuntimeError::TokenOutOfRange { id: token, vocab });
            }
            let pos = self.slot_position(slot) + taken[slot];
            taken[slot] += 1;
            if pos >= self.context {
                return Err(RuntimeError::ContextOverflow {
                    needed: pos + 1,
                    max: self.context,
                });
            }
            // Positions are below the context, which the plan bounds to fit u32.
            let cache_row = slot as u64 * self.residency.slot_rows() + pos;
            table.extend([cache_row as u32, pos as u32]);
        }
        let t = rows.len() as u32;
        let q = &self.gpu.queue;
        let params: [u32; (STEP_PARAMS_BYTES / 4) as usize] = [t, 0, 0, 0];
        q.write_buffer(
            self.buffer(self.header.io.step_params),
            0,
            bytemuck::cast_slice(&params),
        );
        let tokens: Vec<u32> = rows.iter().map(|&(_, token)| token).collect();
        q.write_buffer(
            self.buffer(self.header.io.token_ids),
            0,
            bytemuck::cast_slice(&tokens),
        );
        if let Some(b) = self.header.io.step_rows {
            q.write_buffer(self.buffer(b), 0, bytemuck::cast_slice(&table));
        }
        Ok((t, taken))
    }

    /// The most keys a row of a batch step has in its cache, once the step
    /// has written its own: the step's `taken` rows of each slot past that
    /// slot's position.
    pub(crate) fn batch_keys(&self, taken: &[u64]) -> u64 {
        taken
            .iter()
            .enumerate()
            .filter(|&(_, &n)| n > 0)
            .map(|(slot, &n)| self.slot_position(slot) + n)
            .max()
            .unwrap_or(0)
    }

    /// Moves each slot past the rows a batch step gave it.
    pub(crate) fn advance_batch(&mut self, taken: &[u64]) {
        for (slot, &n) in taken.iter().enumerate() {
            if slot == self.slot {
                self.position += n;
            } else {
                self.positions[slot] += n;
            }
        }
    }

    /// Writes the step's inputs and returns the schedule for `t` tokens.
    /// Callers check `position + t ≤ context` first; the plan's validation
    /// bounds the context by [`gerbil_plan::limits::CONTEXT`], so both fit
    /// the kernels' `u32` and the error is only a guard.
    pub(crate) fn prepare_step(&self, tokens: &[u32]) -> Result<&[Step], RuntimeError> {
        let overflow = || RuntimeError::ContextOverflow {
            needed: self.position.saturating_add(tokens.len() as u64),
            max: self.context,
        };
        let t = u32::try_from(tokens.len()).map_err(|_| overflow())?;
        let position = u32::try_from(self.position).map_err(|_| overflow())?;
        let params: [u32; (STEP_PARAMS_BYTES / 4) as usize] = [t, position, 0, 0];
        let q = &self.gpu.queue;
        q.write_buffer(
            self.buffer(self.header.io.step_params),
            0,
            bytemuck::cast_slice(&params),
        );
        q.write_buffer(
            self.buffer(self.header.io.token_ids),
            0,
            bytemuck::cast_slice(tokens),
        );
        Ok(self.steps_for(tokens.len()))
    }

    /// The schedule a step of `t` tokens runs: decode for one, else
    /// prefill (the fallback's while [`Session::ensure_step_pipelines`]
    /// says so).
    fn steps_for(&self, t: usize) -> &[Step] {
        match (t, &self.fallback) {
            (1, _) => &self.decode,
            (_, Some((_, steps))) if self.on_fallback => steps,
            _ => &self.prefill,
        }
    }

    /// Chooses the schedule of a step of `t` tokens — the prefill fallback's
    /// while [`PrefillFallback`] asks for it — and creates its pipelines
    /// that do not exist yet. A fallback whose pipelines fail is dropped
    /// (with a warning) and the step runs the variant itself.
    async fn ensure_step_pipelines(&mut self, t: usize) -> Result<(), RuntimeError> {
        let rows = t as u32;
        if t == 1 {
            return self.ensure_pipelines(&self.decode, rows).await;
        }
        let own = self.prefill.iter().filter(|s| s.dispatch.runs_at(rows));
        self.on_fallback = self.fallback.is_some()
            && match self.fallback_mode {
                PrefillFallback::Off => false,
                PrefillFallback::FirstPrompt => self.prompts == 0,
                PrefillFallback::WhileCompiling => {
                    self.pipelines.compiling(own.map(|s| s.pipeline))
                }
            };
        if self.on_fallback {
            tracing::debug!(
                tokens = t,
                variant = self.prefill_variant(),
                "prompt on the prefill fallback"
            );
            match self.ensure_pipelines(self.steps_for(t), rows).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!(
                        "the prefill fallback `{}` failed ({e}); prompts wait for `{}`",
                        self.prefill_variant(),
                        self.variant.name
                    );
                    self.fallback = None;
                    self.on_fallback = false;
                }
            }
        }
        self.ensure_pipelines(&self.prefill, rows).await
    }

    /// The variant the last prefill step ran on: the session's, or its
    /// prefill fallback ([`PrefillFallback`]). A prompt longer than the
    /// plan's step runs in chunks, and the chunks after the first may run on
    /// the variant itself once its pipelines are there: this names the last
    /// chunk's.
    pub fn prefill_variant(&self) -> &str {
        match &self.fallback {
            Some((name, _)) if self.on_fallback => name,
            _ => &self.variant.name,
        }
    }

    /// Creates the pipelines of the dispatches of `steps` that run at `t`
    /// rows and do not exist yet ([`crate::variant_pipelines`]); every step
    /// calls it before recording.
    pub(crate) async fn ensure_pipelines(
        &self,
        steps: &[Step],
        t: u32,
    ) -> Result<(), RuntimeError> {
        let slots = steps
            .iter()
            .filter(|s| s.dispatch.runs_at(t))
            .map(|s| s.pipeline);
        self.pipelines.ensure(&self.gpu, &self.header, slots).await
    }

    /// Creates every pipeline of the variant now rather than when a step
    /// first needs it: a server calls it after loading, so that no client
    /// waits for a compile.
    pub async fn create_all_pipelines(&self) -> Result<(), RuntimeError> {
        self.ensure_schedules(&[&self.prefill, &self.decode, &self.batch])
            .await
    }

    /// Creates (or waits for) the pipelines of the variant's prefill and
    /// decode steps: after it every prompt runs on the variant itself, not
    /// its prefill fallback (`bench` calls it before timing).
    pub async fn create_step_pipelines(&self) -> Result<(), RuntimeError> {
        self.ensure_schedules(&[&self.prefill, &self.decode]).await
    }

    /// Creates (or waits for) the pipelines of every dispatch of
    /// `schedules`, whatever the rows they run at.
    async fn ensure_schedules(&self, schedules: &[&[Step]]) -> Result<(), RuntimeError> {
        let slots = schedules.iter().flat_map(|s| s.iter()).map(|s| s.pipeline);
        self.pipelines.ensure(&self.gpu, &self.header, slots).await
    }

    /// Pipelines created so far (at load none: each is created when a step
    /// first runs it), and how long that took.
    pub fn pipeline_stats(&self) -> PipelineStats {
        self.pipelines.stats()
    }

    /// Records one dispatch for a step of `t` rows whose longest row has
    /// `keys` keys in its cache (its position plus one), which bounds a
    /// split-K attention's workgroups; returns false if it has no work or
    /// is for steps of another size ([`gerbil_plan::Dispatch::runs_at`]).
    /// Its pipeline must exist ([`Session::ensure_pipelines`]).
    pub(crate) fn record(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        step: &Step,
        t: u32,
        keys: u64,
    ) -> Result<bool, RuntimeError> {
        if !step.dispatch.runs_at(t) {
            return Ok(false);
        }
        let keys = u32::try_from(keys).unwrap_or(u32::MAX);
        let [x, y, z] = step.dispatch.workgroups.map(|w| w.eval_at(t, keys));
        if x == 0 || y == 0 || z == 0 {
            return Ok(false);
        }
        let Some(pipeline) = self.pipelines.get(step.pipeline) else {
            return Err(RuntimeError::Device(format!(
                "internal error: dispatch `{}` was recorded before its pipeline was created",
                step.dispatch.label
            )));
        };
        pass.set_pipeline(pipeline);
        let group = step
            .bind_groups
            .get(self.slot)
            .unwrap_or(&step.bind_groups[0]);
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(x, y, z);
        Ok(true)
    }

    /// Records `steps` at `t` rows, the longest row holding `keys` keys,
    /// into one compute pass of `enc` called `label`.
    pub(crate) fn record_pass(
        &self,
        enc: &mut wgpu::CommandEncoder,
        label: &str,
        steps: &[Step],
        t: u32,
        keys: u64,
    ) -> Result<(), RuntimeError> {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(label),
            timestamp_writes: None,
        });
        for s in steps {
            self.record(&mut pass, s, t, keys)?;
        }
        Ok(())
    }

    fn run_step(&self, tokens: &[u32]) -> Result<(), RuntimeError> {
        let steps = self.prepare_step(tokens)?;
        // prepare_step checked that the length fits u32.
        let t = tokens.len() as u32;
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("step"),
            });
        self.record_pass(&mut enc, "forward", steps, t, self.position + u64::from(t))?;
        self.gpu.queue.submit([enc.finish()]);
        Ok(())
    }

    /// For an embedding plan: the vector of one input, `tokens` with its
    /// special tokens (at most the plan's `embedding.max_tokens`).
    pub async fn embed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        let mut vectors = self.embed_batch(&[tokens]).await?;
        Ok(vectors.pop().unwrap_or_default())
    }

    /// Whether [`Session::embed_batch`] takes `inputs`: an embedding plan,
    /// and each input not empty, within the most tokens an input may have
    /// (the plan's, or fewer in a session opened with a smaller context),
    /// and of ids in the vocabulary.
    pub fn check_embedding_inputs(&self, inputs: &[&[u32]]) -> Result<(), RuntimeError> {
        let Some(e) = &self.header.model.embedding else {
            return Err(RuntimeError::WrongModelKind(NOT_EMBEDDING));
        };
        // A session opened with a smaller context has a smaller KV cache:
        // a step (and so an input) must fit it.
        let room = self.context.min(self.header.model.max_tokens_per_step);
        let max = e.max_tokens.min(room);
        let vocab = self.vocab_size();
        for tokens in inputs {
            if tokens.is_empty() {
                return Err(RuntimeError::EmptyInput);
            }
            if tokens.len() as u64 > max {
                return Err(RuntimeError::InputTooLong {
                    tokens: tokens.len(),
                    max,
                });
            }
            if let Some(&id) = tokens.iter().find(|&&id| u64::from(id) >= vocab) {
                return Err(RuntimeError::TokenOutOfRange { id, vocab });
            }
        }
        Ok(())
    }

    /// For an embedding plan: the vector of each input (token ids with
    /// their special tokens, each at most the plan's `embedding.max_tokens`),
    /// in order. Inputs are packed end to end into steps of up to the plan's
    /// `max_tokens_per_step` tokens and `io.max_batch` inputs, each step at
    /// position 0 (the KV cache is the step's scratch, so the session's
    /// position starts over).
    pub async fn embed_batch(&mut self, inputs: &[&[u32]]) -> Result<Vec<Vec<f32>>, RuntimeError> {
        self.check_embedding_inputs(inputs)?;
        let Some(e) = &self.header.model.embedding else {
            return Err(RuntimeError::WrongModelKind(NOT_EMBEDDING));
        };
        let room = self.context.min(self.header.model.max_tokens_per_step);
        let (dimension, places) = (e.dimension as usize, (e.max_inputs as usize).max(1));
        self.reset();
        let step_tokens = room as usize;
        let mut vectors = Vec::with_capacity(inputs.len());
        let mut rest = inputs;
        while !rest.is_empty() {
            // As many whole inputs as one step holds (at least one: each fits).
            let mut take = 0;
            let mut tokens = 0;
            while take < rest.len().min(places) && tokens + rest[take].len() <= step_tokens {
                tokens += rest[take].len();
                take += 1;
            }
            let (group, later) = rest.split_at(take);
            rest = later;
            let packed: Vec<u32> = group.iter().flat_map(|t| t.iter().copied()).collect();
            self.write_segments(group, places);
            self.ensure_step_pipelines(packed.len()).await?;
            self.prompts += 1;
            self.gpu
                .scoped("running an embedding step", || self.run_step(&packed))
                .await??;
            let io = self.header.io.logits;
            let bytes = (group.len() * dimension * 4) as u64;
            let enc =
                self.gpu
                    .scoped("copying the embeddings", || {
                        let mut enc = self.gpu.device.create_command_encoder(
                            &wgpu::CommandEncoderDescriptor {
                                label: Some("readback"),
                            },
                        );
                        let buffer = self.buffer(io.buffer);
                        enc.copy_buffer_to_buffer(buffer, io.offset, &self.readback, 0, bytes);
                        enc.finish()
                    })
                    .await?;
            self.gpu.queue.submit([enc]);
            let step = self
                .gpu
                .read_mapped(&self.readback, |bytes| {
                    let all: &[f32] = bytemuck::cast_slice(bytes);
                    all.chunks(dimension)
                        .take(group.len())
                        .map(<[f32]>::to_vec)
                        .collect::<Vec<_>>()
                })
                .await?;
            vectors.extend(step);
        }
        Ok(vectors)
    }

    /// Writes an encoder step's segment table for `group` packed end to end
    /// (`gerbil_codegen_wgsl::kernels::Segments`): each row's sequence's
    /// first row and length, then each of `places` sequence places' (zero
    /// past the group).
    pub(crate) fn write_segments(&self, group: &[&[u32]], places: usize) {
        let lengths: Vec<u32> = group.iter().map(|t| t.len() as u32).collect();
        let table = segment_table(&lengths, places);
        if let Some(rows) = self.header.io.step_rows {
            let q = &self.gpu.queue;
            q.write_buffer(self.buffer(rows), 0, bytemuck::cast_slice(&table));
        }
    }

    /// Refuses to treat an embedding plan's vector as logits.
    fn expect_logits(&self) -> Result<(), RuntimeError> {
        match self.header.model.embedding {
            Some(_) => Err(RuntimeError::WrongModelKind(
                "this plan is an embedding model: it makes vectors (`Session::embed`, \
                 `gerbil-run PLAN embed`), not next-token logits",
            )),
            None => Ok(()),
        }
    }

    /// Copies the last step's logits to the CPU.
    pub async fn read_logits(&self) -> Result<Vec<f32>, RuntimeError> {
        let rows = self.kept_rows();
        let mut last = self.read_logit_rows(rows - 1, 1, &self.readback).await?;
        Ok(last.pop().unwrap_or_default())
    }

    /// Copies the logits of every token of the last step to the CPU, one row
    /// per token, when the plan keeps them (compiled without the
    /// `slice-last-row` pass: perplexity, checking a model teacher-forced in
    /// one step); else the one row the plan keeps, the last token's. Of a
    /// forward split into chunks, the last chunk's.
    pub async fn read_step_logits(&self) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let rows = self.kept_rows();
        if rows == 1 {
            return Ok(vec![self.read_logits().await?]);
        }
        let desc = wgpu::BufferDescriptor {
            label: Some("step logits readback"),
            // rows ≤ max_tokens_per_step and vocab_size are validated: no overflow.
            size: rows * self.vocab_size() * 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        };
        let readback = self
            .gpu
            .create_buffer("allocating the step logits readback buffer", &desc)
            .await?;
        self.read_logit_rows(0, rows, &readback).await
    }

    /// Rows of logits the plan keeps for the last step (at least one).
    fn kept_rows(&self) -> u64 {
        if self.header.io.logits_all_rows {
            self.last_step_tokens.max(1)
        } else {
            1
        }
    }

    /// Copies logit rows `first..first + rows` through `readback`.
    async fn read_logit_rows(
        &self,
        first: u64,
        rows: u64,
        readback: &wgpu::Buffer,
    ) -> Result<Vec<Vec<f32>>, RuntimeError> {
        self.expect_logits()?;
        let io = self.header.io.logits;
        let row_bytes = self.vocab_size() * 4;
        let enc = self
            .gpu
            .scoped("copying the logits", || {
                let mut enc =
                    self.gpu
                        .device
                        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                            label: Some("readback"),
                        });
                enc.copy_buffer_to_buffer(
                    self.buffer(io.buffer),
                    io.offset + first * row_bytes,
                    readback,
                    0,
                    rows * row_bytes,
                );
                enc.finish()
            })
            .await?;
        self.gpu.queue.submit([enc]);
        let vocab = self.vocab_size() as usize;
        self.gpu
            .read_mapped(readback, |bytes| {
                let all: &[f32] = bytemuck::cast_slice(bytes);
                all.chunks(vocab)
                    .take(rows as usize)
                    .map(<[f32]>::to_vec)
                    .collect()
            })
            .await
    }

    /// Waits until the GPU has finished all submitted work.
    pub async fn sync(&self) -> Result<(), RuntimeError> {
        self.gpu.idle().await
    }
}

/// Why a language model's plan makes no vectors.
pub const NOT_EMBEDDING: &str =
    "this plan is a language model, not an embedding model: it makes logits, not vectors";

/// The segment table (`gerbil_codegen_wgsl::kernels::Segments`) of
/// sequences of `lengths` packed end to end: each row's sequence's first
/// row and length, then each of `places` sequence places' (zeros past the
/// sequences).
pub(crate) fn segment_table(lengths: &[u32], places: usize) -> Vec<u32> {
    let mut table = Vec::new();
    let mut first = 0u32;
    let mut sequences = Vec::with_capacity(places);
    for &len in lengths {
        for _ in 0..len {
            table.extend([first, len]);
        }
        sequences.push([first, len]);
        first += len;
    }
    sequences.resize(places, [0, 0]);
    table.extend(sequences.into_iter().flatten());
    table
}
