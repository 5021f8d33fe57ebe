//! Opening a wgpu device that meets a plan's requirements, and waiting on it.
//!
//! Everything that waits for the GPU is an `async fn`: requesting the adapter
//! and device, popping error scopes, and the map and work-done callbacks
//! (delivered through a oneshot channel that [`Gpu::settle`] awaits). The
//! runtime never blocks a thread itself, so the same code runs in a browser
//! (where blocking is impossible) and under an async server; a native caller
//! that wants to block wraps the call in an executor such as
//! `pollster::block_on`. The surprise: on native targets wgpu makes progress
//! only when polled, so [`Gpu::settle`] first calls `device.poll(wait)` (on the
//! web the browser drives the GPU and `poll` returns at once).
//!
//! [`Gpu::adapters`] lists the adapters wgpu finds (native targets only), in
//! the order [`Gpu::open_on`] numbers them; without a number the device is
//! the high-performance adapter wgpu prefers.
//!
//! GPU faults become typed errors, never a panic or a wait without end:
//! creation calls run inside error scopes ([`Gpu::scoped`]: out of memory,
//! validation); the device's lost callback and uncaptured-error handler
//! (wgpu's default one panics) record what they see, and the next scope or
//! wait returns it ([`RuntimeError::DeviceLost`], `OutOfMemory`,
//! `Validation`). wgpu reports nothing for calls on a lost device, and a
//! destroyed one says so only from a poll, so every wait checks. A lost
//! device is dropped from the process's shared ones: the next session opens
//! a fresh device. Tests inject faults with [`Gpu::inject_device_loss`] and
//! [`Gpu::inject_out_of_memory_over`].

use crate::error::RuntimeError;
use gerbil_plan::Requirements;
use std::sync::{Arc, Mutex};

/// A wgpu device and queue with the adapter's description. Cloning shares
/// the device.
#[derive(Clone)]
pub struct Gpu {
    /// The device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// Adapter name, backend and type.
    pub adapter: wgpu::AdapterInfo,
    /// Limits the device was created with.
    pub limits: wgpu::Limits,
    /// What the device reported outside the runtime's error scopes.
    faults: Arc<Mutex<Faults>>,
}

/// What a device reported that no error scope caught, kept until the next
/// wait ([`Gpu::settle`]) or scope ([`Gpu::scoped`]) turns it into an error:
/// wgpu delivers a device loss through a callback and errors outside a scope
/// to a handler, whose default panics.
#[derive(Default)]
struct Faults {
    /// Why the device was lost, once it is.
    lost: Option<String>,
    /// The first error no scope captured since the last check.
    uncaptured: Option<Uncaptured>,
    /// Fault injection: buffers larger than this fail as the device's
    /// out-of-memory would ([`Gpu::inject_out_of_memory_over`]).
    refuse_over: Option<u64>,
}

/// An error no scope captured.
enum Uncaptured {
    OutOfMemory,
    Validation(String),
}

/// How many more waits [`Gpu::settle`] gives a callback that a wait made
/// due but that has not come yet, 2 ms apart, before it calls the device
/// lost.
#[cfg(not(target_arch = "wasm32"))]
const SETTLE_RETRIES: u32 = 50;

/// Locks the faults, whatever a panicking holder left: they are plain data.
fn lock(faults: &Mutex<Faults>) -> std::sync::MutexGuard<'_, Faults> {
    faults.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gpu {
    /// Whether timestamp queries inside passes are enabled.
    pub fn has_timestamps(&self) -> bool {
        self.device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
    }
}

/// Size of the device-memory blocks buffers smaller than it are
/// suballocated from (the smallest gpu-allocator takes); a larger buffer gets
/// memory of its own. Larger blocks left the tail of each one unused: with
/// 16 MiB blocks, each of Llama-1B's 9.4 MiB per-layer KV caches took a
/// block of its own, 200 MiB in all.
const SUBALLOCATION_BLOCK: std::ops::Range<u64> = (4 << 20)..(4 << 20);

fn check(
    adapter: &str,
    limit: &'static str,
    needed: u64,
    available: u64,
) -> Result<(), RuntimeError> {
    if needed > available {
        return Err(RuntimeError::Limit {
            adapter: adapter.to_string(),
            limit,
            needed,
            available,
        });
    }
    Ok(())
}

/// Checks the plan's requirements against an adapter's limits.
pub fn check_limits(
    adapter: &str,
    have: &wgpu::Limits,
    need: &Requirements,
) -> Result<(), RuntimeError> {
    check(
        adapter,
        "max_storage_buffer_binding_size",
        need.max_storage_buffer_binding_size,
        have.max_storage_buffer_binding_size,
    )?;
    check(
        adapter,
        "max_buffer_size",
        need.max_buffer_size,
        have.max_buffer_size,
    )?;
    check(
        adapter,
        "max_storage_buffers_per_shader_stage",
        need.max_storage_buffers_per_shader_stage.into(),
        have.max_storage_buffers_per_shader_stage.into(),
    )?;
    check(
        adapter,
        "max_compute_workgroup_storage_size",
        need.max_compute_workgroup_storage_size.into(),
        have.max_compute_workgroup_storage_size.into(),
    )?;
    check(
        adapter,
        "max_compute_invocations_per_workgroup",
        need.max_compute_invocations_per_workgroup.into(),
        have.max_compute_invocations_per_workgroup.into(),
    )
}

/// Which device to open, and what to enable on it beyond what every plan variant may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Timestamp queries inside compute passes, where the adapter has them (for profiling).
    pub timestamps: bool,
    /// Adapter `N` of [`Gpu::adapters`]'s list (`None`: the high-performance default).
    pub adapter: Option<usize>,
    /// Request cooperative matrices (tensor cores) where the adapter has the 16×16×16
    /// f16 → f32 configuration, so plans can run their `tensor-f16` variant (on by default;
    /// `gerbil-run --no-tensor-cores` or `GERBIL_TENSOR_CORES=0` turn it off, e.g. to compare
    /// with the SIMT variants or to step around a driver's cooperative-matrix bug).
    pub tensor_cores: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            timestamps: false,
            adapter: None,
            tensor_cores: true,
        }
    }
}

/// `EXPERIMENTAL_COOPERATIVE_MATRIX` when tensor cores are `requested` and the adapter has
/// the feature with the configuration the tensor-core kernels use (16×16×16, f16 operands,
/// f32 sums); else nothing. The device then needs wgpu's experimental opt-in.
fn tensor_core_features(adapter: &wgpu::Adapter, requested: bool) -> wgpu::Features {
    if requested && has_tensor_cores(adapter) {
        wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
    } else {
        wgpu::Features::empty()
    }
}

/// Whether the adapter offers cooperative matrices in the configuration the
/// tensor-core kernels use (16×16×16, f16 operands, f32 sums) and shader-f16.
fn has_tensor_cores(adapter: &wgpu::Adapter) -> bool {
    let coop = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    let f16_f32 = |p: &wgpu::CooperativeMatrixProperties| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
            && p.ab_type == wgpu::CooperativeScalarType::F16
            && p.cr_type == wgpu::CooperativeScalarType::F32
    };
    adapter
        .features()
        .contains(coop | wgpu::Features::SHADER_F16)
        && adapter.cooperative_matrix_properties().iter().any(f16_f32)
}

/// One GPU adapter as [`Gpu::adapters`] lists it: what `gerbil-run devices`
/// prints, and what `--device N` ([`Gpu::open_on`]) picks by `index`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct AdapterSummary {
    /// Position in the list: the number `--device` takes.
    pub index: usize,
    /// Adapter name, e.g. `llvmpipe (LLVM 15.0.7, 256 bits)`.
    pub name: String,
    /// wgpu backend: `vulkan`, `metal`, `dx12`, `gl`.
    pub backend: String,
    /// `discrete`, `integrated`, `virtual`, `cpu` or `other`.
    pub device_type: String,
    /// Driver name (may be empty).
    pub driver: String,
    /// Driver version and details (may be empty).
    pub driver_info: String,
    /// shader-f16: f16 arithmetic in shaders (the f16 variants need it).
    pub shader_f16: bool,
    /// Subgroup operations (the `subgroups` variants need them).
    pub subgroups: bool,
    /// Smallest and largest subgroup size the adapter reports.
    pub subgroup_sizes: [u32; 2],
    /// Cooperative matrices of 16×16×16 f16 → f32, which the `tensor-f16`
    /// variant runs on; requested unless [`DeviceOptions::tensor_cores`] is off.
    pub cooperative_matrix: bool,
    /// Timestamp queries inside passes (`bench --profile`).
    pub timestamp_queries: bool,
    /// Largest storage-buffer binding, in bytes (bounds the largest weight
    /// or KV cache a plan may bind).
    pub max_storage_binding: u64,
    /// Largest buffer, in bytes.
    pub max_buffer_size: u64,
    /// Whether this is the adapter opened when none is chosen.
    pub default: bool,
}

impl AdapterSummary {
    #[cfg(not(target_arch = "wasm32"))]
    fn of(index: usize, adapter: &wgpu::Adapter, default: Option<&wgpu::AdapterInfo>) -> Self {
        let info = adapter.get_info();
        let features = adapter.features();
        let limits = adapter.limits();
        let ts = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        AdapterSummary {
            index,
            default: default == Some(&info),
            backend: info.backend.to_str().to_string(),
            device_type: match info.device_type {
                wgpu::DeviceType::DiscreteGpu => "discrete",
                wgpu::DeviceType::IntegratedGpu => "integrated",
                wgpu::DeviceType::VirtualGpu => "virtual",
                wgpu::DeviceType::Cpu => "cpu",
                wgpu::DeviceType::Other => "other",
            }
            .to_string(),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            subgroup_sizes: [info.subgroup_min_size, info.subgroup_max_size],
            cooperative_matrix: has_tensor_cores(adapter),
            timestamp_queries: features.contains(ts),
            max_storage_binding: limits.max_storage_buffer_binding_size,
            max_buffer_size: limits.max_buffer_size,
            name: info.name,
            driver: info.driver,
            driver_info: info.driver_info,
        }
    }
}

/// A wgpu instance with the backends the environment allows
/// (`WGPU_BACKEND` and friends).
fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

/// What the device is opened on when no adapter is chosen.
fn default_adapter_options() -> wgpu::RequestAdapterOptions<'static, 'static> {
    wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        force_fallback_adapter: false,
        compatible_surface: None,
        ..Default::default()
    }
}

/// Every adapter of `instance`, in a stable order (wgpu's, which follows
/// the backends' and drivers' own).
#[cfg(not(target_arch = "wasm32"))]
async fn enumerate(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    instance.enumerate_adapters(wgpu::Backends::all()).await
}

impl Gpu {
    /// The adapters wgpu finds, numbered as [`Gpu::open_on`] takes them, the
    /// default one marked. Native targets only: a browser offers one
    /// adapter, chosen by `requestAdapter`.
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn adapters() -> Vec<AdapterSummary> {
        let instance = instance();
        let adapters = enumerate(&instance).await;
        let default = instance
            .request_adapter(&default_adapter_options())
            .await
            .ok()
            .map(|a| a.get_info());
        adapters
            .iter()
            .enumerate()
            .map(|(i, a)| AdapterSummary::of(i, a, default.as_ref()))
            .collect()
    }

    /// Opens the first high-performance adapter and a device with its full
    /// limits, after checking them against `need`.
    pub async fn open(need: &Requirements) -> Result<Gpu, RuntimeError> {
        Gpu::open_with(need, false).await
    }

    /// Like [`Gpu::open`]; with `timestamps`, also enables timestamp queries
    /// inside compute passes when the adapter has them (for profiling).
    ///
    /// On native targets one device per process (per `timestamps` setting)
    /// is opened and then shared by every later call: sessions of several
    /// plans live on one device, as they would in a server, and drivers that
    /// limit how many Vulkan instances or devices a process may create are
    /// never exhausted. In a browser every call opens its own device (wgpu's
    /// WebGPU handles cannot be shared between threads, and a page has no
    /// driver limit to protect).
    pub async fn open_with(need: &Requirements, timestamps: bool) -> Result<Gpu, RuntimeError> {
        let opts = DeviceOptions {
            timestamps,
            ..DeviceOptions::default()
        };
        Gpu::open_on(need, &opts).await
    }

    /// Like [`Gpu::open_with`], with every [`DeviceOptions`]: on adapter
    /// `opts.adapter` of [`Gpu::adapters`]'s list (`None`: the
    /// high-performance default). An index past the list is
    /// [`RuntimeError::NoSuchAdapter`]; in a browser any `Some` is
    /// [`RuntimeError::AdapterChoiceUnsupported`]. The shared device is per
    /// options: `None` and the default's index open two devices.
    pub async fn open_on(need: &Requirements, opts: &DeviceOptions) -> Result<Gpu, RuntimeError> {
        let DeviceOptions {
            timestamps,
            adapter,
            tensor_cores,
        } = *opts;
        #[cfg(not(target_arch = "wasm32"))]
        {
            // An async lock, held while the first device is created, so that
            // callers racing to open one still share a single device.
            static SHARED: futures::lock::Mutex<Vec<(DeviceOptions, Gpu)>> =
                futures::lock::Mutex::new(Vec::new());
            let key = *opts;
            let mut shared = SHARED.lock().await;
            // A lost device is forgotten: loading again opens a fresh one.
            shared.retain(|(_, gpu)| gpu.lost().is_none());
            if let Some((_, gpu)) = shared.iter().find(|(k, _)| *k == key) {
                check_limits(&gpu.adapter.name, &gpu.limits, need)?;
                return Ok(gpu.clone());
            }
            let gpu = Gpu::create(need, timestamps, tensor_cores, adapter).await?;
            shared.push((key, gpu.clone()));
            Ok(gpu)
        }
        #[cfg(target_arch = "wasm32")]
        match adapter {
            Some(_) => Err(RuntimeError::AdapterChoiceUnsupported),
            None => Gpu::create(need, timestamps, tensor_cores).await,
        }
    }

    /// The adapter `choice` names (see [`Gpu::open_on`]).
    #[cfg(not(target_arch = "wasm32"))]
    async fn adapter(
        instance: &wgpu::Instance,
        choice: Option<usize>,
    ) -> Result<wgpu::Adapter, RuntimeError> {
        let Some(index) = choice else {
            return instance
                .request_adapter(&default_adapter_options())
                .await
                .map_err(|_| RuntimeError::NoAdapter);
        };
        let mut adapters = enumerate(instance).await;
        let count = adapters.len();
        if count == 0 {
            return Err(RuntimeError::NoAdapter);
        }
        if index >= count {
            return Err(RuntimeError::NoSuchAdapter { index, count });
        }
        Ok(adapters.swap_remove(index))
    }

    #[cfg(target_arch = "wasm32")]
    async fn adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter, RuntimeError> {
        instance
            .request_adapter(&default_adapter_options())
            .await
            .map_err(|_| RuntimeError::NoAdapter)
    }

    async fn create(
        need: &Requirements,
        timestamps: bool,
        tensor_cores: bool,
        #[cfg(not(target_arch = "wasm32"))] choice: Option<usize>,
    ) -> Result<Gpu, RuntimeError> {
        let instance = instance();
        #[cfg(not(target_arch = "wasm32"))]
        let adapter = Gpu::adapter(&instance, choice).await?;
        #[cfg(target_arch = "wasm32")]
        let adapter = Gpu::adapter(&instance).await?;
        let mut info = adapter.get_info();
        if info.name.is_empty() {
            // A browser's WebGPU names no adapter: errors still say which kind it is.
            info.name = format!("unnamed {:?} adapter", info.backend);
        }
        let limits = adapter.limits();
        check_limits(&info.name, &limits, need)?;
        let ts = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let timestamp_features = if timestamps && adapter.features().contains(ts) {
            ts
        } else {
            wgpu::Features::empty()
        };
        // Every optional feature a plan variant may need, where the adapter
        // has it; variants are chosen after the device is open (`variant::pick`).
        // PIPELINE_CACHE lets sessions keep compiled pipelines on disk
        // (`crate::pipeline_cache`); without it they compile every load.
        let features = timestamp_features
            | (adapter.features() & (wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP))
            | (adapter.features() & wgpu::Features::PIPELINE_CACHE)
            | tensor_core_features(&adapter, tensor_cores);
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("gerbil"),
                required_features: features,
                required_limits: limits.clone(),
                // SAFETY: the only experimental feature requested is
                // cooperative matrices, whose kernels naga validates at
                // compile time and the kernel suite checks on the GPU.
                experimental_features: if features
                    .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
                {
                    unsafe { wgpu::ExperimentalFeatures::enabled() }
                } else {
                    wgpu::ExperimentalFeatures::disabled()
                },
                // Small suballocation blocks (larger buffers get memory of
                // their own): with wgpu's default 128–256 MiB blocks a
                // model's per-layer buffers left up to a block unused, more
                // than SmolLM2's whole KV cache.
                memory_hints: wgpu::MemoryHints::Manual {
                    suballocated_device_memory_block_size: SUBALLOCATION_BLOCK,
                },
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| RuntimeError::Device(e.to_string()))?;
        let faults = Arc::new(Mutex::new(Faults::default()));
        watch(&device, &faults);
        tracing::info!(
            adapter = %info.name,
            backend = %info.backend,
            driver = %info.driver,
            features = ?features,
            "device opened"
        );
        Ok(Gpu {
            device,
            queue,
            adapter: info,
            limits,
            faults,
        })
    }

    /// Runs `f` inside out-of-memory and validation error scopes and turns a
    /// captured error into a [`RuntimeError`] that names `context`. A device
    /// known to be lost is [`RuntimeError::DeviceLost`] (wgpu reports
    /// nothing for calls on a lost device: its objects are silently
    /// invalid), and an error no scope caught since the last check is
    /// reported here too.
    pub async fn scoped<T>(&self, context: &str, f: impl FnOnce() -> T) -> Result<T, RuntimeError> {
        self.check(context)?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = f();
        // Error scopes belong to the thread that pushed them: pop both before
        // the first await, which may resume on another thread.
        let (v, o) = (validation.pop(), oom.pop());
        let (v, o) = (v.await, o.await);
        self.check(context)?;
        if o.is_some() {
            return Err(self.out_of_memory(context, None));
        }
        if let Some(e) = v {
            return Err(RuntimeError::Validation {
                context: context.to_string(),
                message: e.to_string(),
            });
        }
        Ok(value)
    }

    /// Creates a buffer inside error scopes ([`Gpu::scoped`]); running out
    /// of memory names `context` and the bytes asked for.
    pub(crate) async fn create_buffer(
        &self,
        context: &str,
        desc: &wgpu::BufferDescriptor<'_>,
    ) -> Result<wgpu::Buffer, RuntimeError> {
        let refused = lock(&self.faults)
            .refuse_over
            .is_some_and(|max| desc.size > max);
        if refused {
            return Err(self.out_of_memory(context, Some(desc.size)));
        }
        match self
            .scoped(context, || self.device.create_buffer(desc))
            .await
        {
            Err(RuntimeError::OutOfMemory { .. }) => {
                Err(self.out_of_memory(context, Some(desc.size)))
            }
            other => other,
        }
    }

    /// [`RuntimeError::OutOfMemory`] on this device.
    pub(crate) fn out_of_memory(&self, context: &str, bytes: Option<u64>) -> RuntimeError {
        RuntimeError::OutOfMemory {
            adapter: self.adapter.name.clone(),
            context: context.to_string(),
            bytes,
        }
    }

    /// [`RuntimeError::DeviceLost`] on this device.
    pub fn device_lost(&self, context: &str, reason: String) -> RuntimeError {
        RuntimeError::DeviceLost {
            adapter: self.adapter.name.clone(),
            context: context.to_string(),
            reason,
        }
    }

    /// Why the device was lost, once wgpu has said so (its lost callback runs
    /// while the device is polled, so a loss shows here after the next wait).
    pub fn lost(&self) -> Option<String> {
        lock(&self.faults).lost.clone()
    }

    /// The device's loss, or the first error no scope captured since the
    /// last check, as an error naming `context`.
    fn check(&self, context: &str) -> Result<(), RuntimeError> {
        let mut faults = lock(&self.faults);
        if let Some(reason) = faults.lost.clone() {
            drop(faults);
            return Err(self.device_lost(context, reason));
        }
        let uncaptured = faults.uncaptured.take();
        drop(faults);
        match uncaptured {
            None => Ok(()),
            Some(Uncaptured::OutOfMemory) => Err(self.out_of_memory(context, None)),
            Some(Uncaptured::Validation(message)) => Err(RuntimeError::Validation {
                context: context.to_string(),
                message,
            }),
        }
    }

    /// Fault injection for tests: destroys the device, as a driver reset
    /// would lose it. Every later wait on it fails with
    /// [`RuntimeError::DeviceLost`], and the next session opens a fresh
    /// device. Destroys the device for every session sharing it.
    #[doc(hidden)]
    pub fn inject_device_loss(&self) {
        self.device.destroy();
    }

    /// Fault injection for tests: from now on a buffer of more than `bytes`
    /// fails as if the device were out of memory (`None` ends it). Every
    /// session sharing the device sees it.
    #[doc(hidden)]
    pub fn inject_out_of_memory_over(&self, bytes: Option<u64>) {
        lock(&self.faults).refuse_over = bytes;
    }

    /// Polls the device: waits (native targets) for `submission`, or for
    /// everything submitted when `None`. A failed wait, or a panic inside
    /// wgpu's poll (wgpu 30 panics there on a driver's device-lost error),
    /// becomes [`RuntimeError::DeviceLost`]; the device's loss or an error
    /// no scope caught, found by the poll, becomes its error.
    fn wait(
        &self,
        submission: Option<wgpu::SubmissionIndex>,
        context: &str,
    ) -> Result<(), RuntimeError> {
        let poll = |submission_index| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.device.poll(wgpu::PollType::Wait {
                    submission_index,
                    timeout: None,
                })
            }))
        };
        let failed = match poll(submission) {
            Ok(Ok(_)) => return self.check(context),
            Ok(Err(e)) => e.to_string(),
            Err(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "wgpu panicked while polling".into()),
        };
        // A destroyed device reports its loss only from a poll that finds
        // its queue empty: give it one, so the error says why.
        let _ = poll(None);
        self.check(context)?;
        Err(self.device_lost(context, failed))
    }

    /// Waits for the callback behind `done` (a buffer mapping, submitted work
    /// finishing). On native targets this polls the device until
    /// `submission` (or, with `None`, everything submitted) is done, which
    /// runs the callbacks; in a browser the callback arrives from the event
    /// loop while this future is pending. A lost device, a failed wait or a
    /// callback that never comes is [`RuntimeError::DeviceLost`] naming
    /// `context`, never a wait without end.
    pub(crate) async fn settle<T>(
        &self,
        done: futures::channel::oneshot::Receiver<T>,
        submission: Option<wgpu::SubmissionIndex>,
        context: &str,
    ) -> Result<T, RuntimeError> {
        self.check(context)?;
        self.wait(submission, context)?;
        // On native targets callbacks run only inside a poll: one still
        // missing after waiting for everything submitted never comes, and
        // awaiting it would block forever.
        #[cfg(not(target_arch = "wasm32"))]
        let delivered = {
            let mut done = done;
            let mut delivered = done.try_recv();
            // With several devices of one process polled on several threads
            // (lavapipe), a callback can come a moment after the wait that
            // made it due: wait again a few times before giving up.
            for _ in 0..SETTLE_RETRIES {
                if !matches!(delivered, Ok(None)) {
                    break;
                }
                self.wait(None, context)?;
                delivered = done.try_recv();
                if matches!(delivered, Ok(None)) {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
            delivered
        };
        // In a browser the callback comes from the event loop.
        #[cfg(target_arch = "wasm32")]
        let delivered = done.await.map(Some);
        match delivered {
            Ok(Some(value)) => Ok(value),
            Ok(None) => Err(self.device_lost(
                context,
                "wgpu never called back after the GPU finished".into(),
            )),
            Err(_) => {
                Err(self.device_lost(context, "wgpu dropped a callback without calling it".into()))
            }
        }
    }

    /// Maps a `MAP_READ` buffer once the GPU is done with it, lets `read`
    /// copy what it needs out of the bytes, and unmaps the buffer again.
    pub(crate) async fn read_mapped<T>(
        &self,
        buffer: &wgpu::Buffer,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, RuntimeError> {
        self.map_and_read(buffer, None, None, read).await
    }

    /// Like [`Gpu::read_mapped`], but maps only the first `len` bytes (a
    /// multiple of 4).
    pub(crate) async fn read_mapped_prefix<T>(
        &self,
        buffer: &wgpu::Buffer,
        len: u64,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, RuntimeError> {
        self.map_and_read(buffer, Some(len), None, read).await
    }

    /// Like [`Gpu::read_mapped`], but on native targets waits only for
    /// `submission` (and the work before it), not for later submissions: the
    /// GPU keeps running them while the CPU reads.
    pub(crate) async fn read_mapped_after<T>(
        &self,
        buffer: &wgpu::Buffer,
        submission: wgpu::SubmissionIndex,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, RuntimeError> {
        self.map_and_read(buffer, None, Some(submission), read)
            .await
    }

    /// Maps `buffer` (its first `len` bytes, else all), waits as
    /// [`Gpu::settle`] does, reads, unmaps.
    async fn map_and_read<T>(
        &self,
        buffer: &wgpu::Buffer,
        len: Option<u64>,
        submission: Option<wgpu::SubmissionIndex>,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, RuntimeError> {
        let slice = match len {
            Some(len) => buffer.slice(..len),
            None => buffer.slice(..),
        };
        let (tx, rx) = futures::channel::oneshot::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        let mapped = self.settle(rx, submission, "reading from the GPU").await?;
        if let Err(e) = mapped {
            self.check("reading from the GPU")?;
            return Err(self.device_lost("reading from the GPU", e.to_string()));
        }
        let value = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| self.device_lost("reading from the GPU", e.to_string()))?;
            read(&view)
        };
        buffer.unmap();
        Ok(value)
    }

    /// Maps a `MAP_WRITE` buffer for writing once the GPU has finished
    /// `submission` (the last work that read it; `None`: everything
    /// submitted), as [`Gpu::settle`] waits; the caller writes through
    /// `get_mapped_range_mut` and unmaps.
    pub(crate) async fn map_for_writing(
        &self,
        buffer: &wgpu::Buffer,
        submission: Option<wgpu::SubmissionIndex>,
        context: &str,
    ) -> Result<(), RuntimeError> {
        let (tx, rx) = futures::channel::oneshot::channel();
        buffer.slice(..).map_async(wgpu::MapMode::Write, move |r| {
            let _ = tx.send(r);
        });
        if let Err(e) = self.settle(rx, submission, context).await? {
            self.check(context)?;
            return Err(self.device_lost(context, e.to_string()));
        }
        Ok(())
    }

    /// Waits until the GPU has finished all work submitted so far.
    pub(crate) async fn idle(&self) -> Result<(), RuntimeError> {
        self.idle_while("waiting for the GPU").await
    }

    /// [`Gpu::idle`], its errors naming `context` (what the work was).
    pub(crate) async fn idle_while(&self, context: &str) -> Result<(), RuntimeError> {
        let (tx, rx) = futures::channel::oneshot::channel();
        self.queue.on_submitted_work_done(move || {
            let _ = tx.send(());
        });
        self.settle(rx, None, context).await
    }
}

/// Installs the device's lost callback and uncaptured-error handler, which
/// record into `faults` (wgpu's default handler panics).
fn watch(device: &wgpu::Device, faults: &Arc<Mutex<Faults>>) {
    let on_lost = faults.clone();
    device.set_device_lost_callback(move |reason, message| {
        let why = match (reason, message.is_empty()) {
            (wgpu::DeviceLostReason::Destroyed, true) => "the device was destroyed".to_string(),
            (wgpu::DeviceLostReason::Destroyed, false) => {
                format!("the device was destroyed: {message}")
            }
            (_, true) => "the driver reported the device lost".to_string(),
            (_, false) => format!("the driver reported the device lost: {message}"),
        };
        tracing::error!("GPU device lost: {why}");
        lock(&on_lost).lost.get_or_insert(why);
    });
    let on_error = faults.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        tracing::error!("uncaptured wgpu error: {e}");
        let seen = match e {
            wgpu::Error::OutOfMemory { .. } => Uncaptured::OutOfMemory,
            other => Uncaptured::Validation(other.to_string()),
        };
        lock(&on_error).uncaptured.get_or_insert(seen);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_the_adapter_lacks_names_the_limit_and_both_values() {
        let have = wgpu::Limits::default();
        let need = Requirements {
            max_storage_buffer_binding_size: have.max_storage_buffer_binding_size + 4,
            ..Requirements::default()
        };
        let err = check_limits("test-gpu", &have, &need)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`test-gpu`"), "{err}");
        assert!(err.contains("max_storage_buffer_binding_size"), "{err}");
        assert!(
            err.contains(&(have.max_storage_buffer_binding_size + 4).to_string()),
            "{err}"
        );
        let need = Requirements {
            max_compute_workgroup_storage_size: have.max_compute_workgroup_storage_size + 1,
            ..Requirements::default()
        };
        let err = check_limits("test-gpu", &have, &need)
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_compute_workgroup_storage_size"), "{err}");
        assert!(check_limits("test-gpu", &have, &Requirements::default()).is_ok());
    }
}
