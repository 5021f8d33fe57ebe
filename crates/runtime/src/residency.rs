//! Where a session's plan buffers live on the device, and how the weights
//! get there.
//!
//! [`Residency::allocate`] gives every plan buffer the running variant uses
//! a home: a wgpu buffer of its own, or — for a weight or a KV cache smaller
//! than [`POOL_ITEM_MAX`] — a range of a *pool*, one wgpu buffer holding many
//! of them at aligned offsets. [`Residency::binding`] turns a plan
//! `BufferSlice` into the range of the wgpu buffer it lives in, and
//! [`Residency::upload_weights`] reads the weights from the plan into two
//! mapped staging buffers in turn and copies them to their homes.
//!
//! The surprise: a device allocator rounds every buffer up to its block or
//! page, and a 30-layer model has hundreds of 1–4 MiB buffers, so one wgpu
//! buffer per plan buffer cost SmolLM2 a sixth of its memory. Weights and KV
//! caches pool separately: WebGPU forbids binding one buffer both read-only
//! and writable in a dispatch, and a matmul reads weights where attention's
//! neighbours write caches, while every dispatch binds all its caches the
//! same way.

use crate::device::Gpu;
use crate::error::RuntimeError;
use crate::progress::{Progress, ProgressHook};
use crate::session::kv_bytes;
use gerbil_plan::{BufferKind, BufferSlice, PlanFile, PlanHeader, SectionRef};
use std::collections::HashSet;
use std::num::NonZeroU64;
use wgpu::WriteOnly;

/// Largest plan buffer placed in a pool; a larger one gets a wgpu buffer,
/// and so device memory, of its own (where rounding costs little).
const POOL_ITEM_MAX: u64 = 32 << 20;

/// Most bytes in one pool.
const POOL_BYTES: u64 = 256 << 20;

/// Bytes of one staging buffer, the most weights one copy submission
/// carries. The upload keeps [`STAGING_BUFFERS`] of them mapped and fills
/// one from the plan file (through each thread's buffer) while the GPU
/// copies out of another, so
/// reading and copying overlap and the staging memory stays bounded (and
/// is reused: `queue.write_buffer` had wgpu allocate fresh host memory for
/// every write, which the driver pins page by page).
const UPLOAD_WINDOW: usize = 64 << 20;

/// Staging buffers the upload cycles through.
const STAGING_BUFFERS: usize = 2;

/// Largest piece of a weight one thread reads at a time: a window holds 16,
/// so every upload thread of a 16-core machine has one.
const UPLOAD_CHUNK: usize = 4 << 20;

/// The pools: plan buffers of one pool are bound the same way in every
/// dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    Weights,
    Caches,
}

fn pool_of(kind: &BufferKind) -> Option<Pool> {
    match kind {
        BufferKind::Weight { .. } => Some(Pool::Weights),
        BufferKind::KvCache { .. } => Some(Pool::Caches),
        _ => None,
    }
}

pub(crate) fn usage_for(kind: &BufferKind) -> wgpu::BufferUsages {
    use wgpu::BufferUsages as U;
    match kind {
        // Unit tests read an upload back.
        BufferKind::Weight { .. } if cfg!(test) => U::STORAGE | U::COPY_SRC | U::COPY_DST,
        BufferKind::Weight { .. } => U::STORAGE | U::COPY_DST,
        BufferKind::Arena | BufferKind::Scratch { .. } => U::STORAGE,
        // A KV cache is copied from (tests, and one slot's rows into
        // another's) and into.
        BufferKind::KvCache { .. } => U::STORAGE | U::COPY_SRC | U::COPY_DST,
        BufferKind::Output { .. } => U::STORAGE | U::COPY_SRC,
        BufferKind::StepParams | BufferKind::SamplingParams => U::UNIFORM | U::COPY_DST,
        BufferKind::TokenIds | BufferKind::StepRows => U::STORAGE | U::COPY_DST,
        // Written by the host, copied between, read back, saved.
        BufferKind::Training { .. } => U::STORAGE | U::COPY_SRC | U::COPY_DST,
    }
}

/// Where one plan buffer lives.
#[derive(Clone, Copy, Debug)]
struct Home {
    /// Index into [`Residency::buffers`].
    buffer: usize,
    /// Byte offset of the plan buffer in it.
    offset: u64,
    /// Bytes allocated for the plan buffer: its declared size, or less for a
    /// KV cache holding fewer positions than the plan's `max_context`.
    size: u64,
}

/// A pool being filled: its plan buffers and the bytes it holds so far.
struct Filling {
    /// Plan buffer index, offset in the pool, bytes.
    members: Vec<(usize, u64, u64)>,
    len: u64,
}

/// The wgpu buffers of a session and where each plan buffer lives in them.
pub(crate) struct Residency {
    buffers: Vec<wgpu::Buffer>,
    /// By plan buffer index; `None` for a buffer the variant does not use.
    /// A KV cache of several slots: slot 0's, the others following it.
    homes: Vec<Option<Home>>,
    /// Bytes from one slot's copy of a KV cache to the next's, by plan
    /// buffer index (KV caches of a session with several slots only).
    slot_strides: std::collections::HashMap<usize, u64>,
    /// Cache rows from one slot's copy to the next's: the context rounded
    /// up to a multiple of 256, so every stride is a whole number of rows
    /// and a multiple of 256 bytes, whatever a row holds.
    slot_rows: u64,
}

impl Residency {
    /// Allocates the plan buffers in `used` (empty; weights are written by
    /// [`Residency::upload_weights`]), each KV cache for `context` positions
    /// and `slots` times (one per sequence slot), the copies of one cache
    /// side by side in one wgpu buffer, `align`ed: one binding can span them
    /// all.
    pub(crate) async fn allocate(
        gpu: &Gpu,
        header: &PlanHeader,
        used: &HashSet<u32>,
        context: u64,
        slots: usize,
    ) -> Result<Residency, RuntimeError> {
        let align = u64::from(gpu.limits.min_storage_buffer_offset_alignment).max(256);
        let pool_bytes = POOL_BYTES.min(gpu.limits.max_buffer_size);
        let mut residency = Residency {
            buffers: Vec::new(),
            homes: vec![None; header.buffers.len()],
            slot_strides: std::collections::HashMap::new(),
            slot_rows: context.next_multiple_of(256),
        };
        let mut filling: Vec<(Pool, Filling)> = Vec::new();
        for (i, decl) in header.buffers.iter().enumerate() {
            if !used.contains(&(i as u32)) {
                continue;
            }
            let (size, all) = match decl.kind {
                BufferKind::KvCache { row_bytes, .. } => {
                    let one = kv_bytes(decl.size, context, header.model.max_context);
                    if slots > 1 {
                        let row = row_bytes.unwrap_or(decl.size / header.model.max_context.max(1));
                        let stride = (row * residency.slot_rows).next_multiple_of(align);
                        residency.slot_strides.insert(i, stride);
                        (one, stride * (slots as u64 - 1) + one)
                    } else {
                        (one, one)
                    }
                }
                _ => (decl.size, decl.size),
            };
            let pool = pool_of(&decl.kind).filter(|_| all <= POOL_ITEM_MAX);
            let Some(pool) = pool else {
                let label = decl.kind.describe();
                let buffer = residency
                    .create(gpu, &label, all, usage_for(&decl.kind))
                    .await?;
                residency.homes[i] = Some(Home {
                    buffer,
                    offset: 0,
                    size,
                });
                continue;
            };
            let at = filling.iter().position(|(p, _)| *p == pool);
            let fits = |f: &Filling| f.len.next_multiple_of(align) + all <= pool_bytes;
            let k = match at {
                Some(k) if fits(&filling[k].1) => k,
                _ => {
                    if let Some(k) = at {
                        let (p, full) = filling.remove(k);
                        residency.close(gpu, header, p, full).await?;
                    }
                    filling.push((
                        pool,
                        Filling {
                            members: Vec::new(),
                            len: 0,
                        },
                    ));
                    filling.len() - 1
                }
            };
            let f = &mut filling[k].1;
            let offset = f.len.next_multiple_of(align);
            f.members.push((i, offset, size));
            f.len = offset + all;
        }
        for (p, f) in filling {
            residency.close(gpu, header, p, f).await?;
        }
        Ok(residency)
    }

    async fn create(
        &mut self,
        gpu: &Gpu,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<usize, RuntimeError> {
        let desc = wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        };
        let buffer = gpu
            .create_buffer(&format!("allocating buffer `{label}`"), &desc)
            .await?;
        self.buffers.push(buffer);
        Ok(self.buffers.len() - 1)
    }

    /// Creates the wgpu buffer of a filled pool and homes its members there.
    async fn close(
        &mut self,
        gpu: &Gpu,
        header: &PlanHeader,
        pool: Pool,
        f: Filling,
    ) -> Result<(), RuntimeError> {
        let Some(&(first, _, _)) = f.members.first() else {
            return Ok(());
        };
        let label = format!("{pool:?} pool ({} buffers)", f.members.len());
        let usage = usage_for(&header.buffers[first].kind);
        let buffer = self
            .create(gpu, &label, f.len.next_multiple_of(4), usage)
            .await?;
        for (i, offset, size) in f.members {
            self.homes[i] = Some(Home {
                buffer,
                offset,
                size,
            });
        }
        Ok(())
    }

    /// Plan buffer `i`'s copy for sequence `slot`: the wgpu buffer, the
    /// offset and the bytes allocated (slot 0 for a buffer without copies).
    pub(crate) fn slot_range(&self, i: u32, slot: usize) -> (&wgpu::Buffer, u64, u64) {
        let home = self.home(i);
        let stride = self.slot_strides.get(&(i as usize)).copied().unwrap_or(0);
        let offset = home.offset + stride * slot as u64;
        (&self.buffers[home.buffer], offset, home.size)
    }

    /// KV-cache rows from one slot's copy to the next's: a batch step's row
    /// table addresses slot `s`, position `p` as row `s · slot_rows + p`.
    pub(crate) fn slot_rows(&self) -> u64 {
        self.slot_rows
    }

    /// The range of a wgpu buffer that plan slice `s` is, over every slot's
    /// copy of a KV cache (a batch step's binding).
    pub(crate) fn binding_all_slots(
        &self,
        s: &BufferSlice,
        slots: usize,
    ) -> wgpu::BufferBinding<'_> {
        let home = self.home(s.buffer);
        let size = match self.slot_strides.get(&(s.buffer as usize)) {
            Some(stride) => stride * (slots as u64 - 1) + home.size,
            None => s.size.min(home.size.saturating_sub(s.offset)),
        };
        wgpu::BufferBinding {
            buffer: &self.buffers[home.buffer],
            offset: home.offset + s.offset,
            size: NonZeroU64::new(size),
        }
    }

    /// Whether plan buffer `i` has a copy per sequence slot (a KV cache of
    /// a session with several).
    pub(crate) fn per_slot(&self, i: u32) -> bool {
        self.slot_strides.contains_key(&(i as usize))
    }

    fn home(&self, i: u32) -> Home {
        self.homes[i as usize]
            .expect("a session binds only the buffers it allocated for its variant")
    }

    /// The range of a wgpu buffer that plan slice `s` is.
    /// A slice of a KV cache allocated for fewer positions than the plan's
    /// ends where the allocation does: kernels read and write only the rows
    /// of positions the session holds.
    /// A KV cache's slice is in sequence slot `slot`'s copy.
    pub(crate) fn binding(&self, s: &BufferSlice, slot: usize) -> wgpu::BufferBinding<'_> {
        let (buffer, offset, size) = self.slot_range(s.buffer, slot);
        wgpu::BufferBinding {
            buffer,
            offset: offset + s.offset,
            size: NonZeroU64::new(s.size.min(size.saturating_sub(s.offset))),
        }
    }

    /// Plan buffer `i`, which must have a wgpu buffer of its own (the step
    /// parameters, token ids and outputs: only weights and KV caches pool).
    pub(crate) fn own(&self, i: u32) -> &wgpu::Buffer {
        let home = self.home(i);
        debug_assert_eq!(home.offset, 0, "plan buffer {i} is pooled");
        &self.buffers[home.buffer]
    }

    /// Copies every weight section of `plan` into its home through
    /// [`STAGING_BUFFERS`] mapped staging buffers of [`UPLOAD_WINDOW`]
    /// bytes, telling `progress` the bytes done after each window has
    /// reached the GPU.
    pub(crate) async fn upload_weights(
        &self,
        gpu: &Gpu,
        plan: &PlanFile,
        progress: Option<&ProgressHook>,
    ) -> Result<(), RuntimeError> {
        self.upload_in_windows(gpu, plan, UPLOAD_WINDOW, progress)
            .await
    }

    /// [`Residency::upload_weights`] with staging buffers of `window` bytes
    /// (a multiple of 4).
    async fn upload_in_windows(
        &self,
        gpu: &Gpu,
        plan: &PlanFile,
        window: usize,
        progress: Option<&ProgressHook>,
    ) -> Result<(), RuntimeError> {
        let weights = plan
            .header
            .buffers
            .iter()
            .enumerate()
            .filter_map(|(i, decl)| match (&decl.kind, self.homes[i]) {
                (BufferKind::Weight { section, .. }, Some(home)) => Some((*section, home)),
                _ => None,
            });
        let windows = plan_windows(&self.buffers, weights, window);
        let total: u64 = windows.iter().map(|w| window_bytes(w)).sum();
        let report = |done| {
            if let Some(hook) = progress {
                hook.report(Progress::Weights { done, total });
            }
        };
        if windows.is_empty() {
            report(0);
            return Ok(());
        }
        let context = "uploading the weights";
        let size = windows.iter().map(|w| window_bytes(w)).max().unwrap_or(0);
        let mut ring = Vec::new();
        for _ in 0..STAGING_BUFFERS.min(windows.len()) {
            let desc = wgpu::BufferDescriptor {
                label: Some("weight staging"),
                size,
                usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            };
            ring.push(gpu.create_buffer(context, &desc).await?);
        }
        let mut scratch = vec![Vec::new(); upload_threads()];
        // Windows submitted and not yet known to be copied, oldest first:
        // each one's submission and bytes.
        let mut in_flight = std::collections::VecDeque::new();
        let mut done = 0u64;
        for (i, writes) in windows.iter().enumerate() {
            let staging = &ring[i % ring.len()];
            if i >= ring.len() {
                // This staging buffer's last window is the oldest in flight.
                let (submission, bytes) = in_flight.pop_front().ok_or_else(|| {
                    RuntimeError::Device("internal error: no upload window in flight".into())
                })?;
                gpu.map_for_writing(staging, Some(submission), context)
                    .await?;
                done += bytes;
                report(done);
            }
            let bytes = window_bytes(writes);
            {
                let mut view = staging
                    .slice(..bytes)
                    .get_mapped_range_mut()
                    .map_err(|e| gpu.device_lost(context, e.to_string()))?;
                fill_window(plan, writes, view.slice(..), &mut scratch)?;
            }
            staging.unmap();
            let mut encoder = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("weight upload"),
                });
            let mut from = 0;
            for w in writes {
                encoder.copy_buffer_to_buffer(staging, from, w.buffer, w.at, w.len as u64);
                from += w.len as u64;
            }
            in_flight.push_back((gpu.queue.submit([encoder.finish()]), bytes));
        }
        gpu.idle_while(context).await?;
        for (_, bytes) in in_flight {
            done += bytes;
            report(done);
        }
        // Reads past a shortened end already failed; this catches a plan
        // rewritten in place while it was read.
        plan.check_unchanged()?;
        Ok(())
    }
}

/// One weight write: `len` bytes of `section` from byte `from` of it, to
/// byte `at` of `buffer`.
struct Write<'a> {
    buffer: &'a wgpu::Buffer,
    at: u64,
    section: SectionRef,
    from: u64,
    len: usize,
}

/// Cuts `weights` (each a section and its home among `buffers`) into
/// writes of at most [`UPLOAD_CHUNK`] bytes and groups them, in order, into
/// windows of at most `window` bytes.
fn plan_windows<'a>(
    buffers: &'a [wgpu::Buffer],
    weights: impl Iterator<Item = (SectionRef, Home)>,
    window: usize,
) -> Vec<Vec<Write<'a>>> {
    let chunk = UPLOAD_CHUNK.min(window);
    let mut windows = Vec::new();
    let mut current: Vec<Write<'a>> = Vec::new();
    let mut pending = 0;
    for (section, home) in weights {
        for from in (0..section.len).step_by(chunk) {
            let len = chunk.min((section.len - from) as usize);
            if pending + len > window && !current.is_empty() {
                windows.push(std::mem::take(&mut current));
                pending = 0;
            }
            current.push(Write {
                buffer: &buffers[home.buffer],
                at: home.offset + from,
                section,
                from,
                len,
            });
            pending += len;
        }
    }
    if !current.is_empty() {
        windows.push(current);
    }
    windows
}

/// Bytes of staging memory a window's writes take, back to back.
fn window_bytes(writes: &[Write<'_>]) -> u64 {
    writes.iter().map(|w| w.len as u64).sum()
}

/// One write's range of mapped staging memory, handed to the thread that
/// fills it (wgpu's `WriteOnly<[u8]>` is not `Send`); it borrows the
/// mapping for `'a`, as the `WriteOnly` it was made from did.
struct Piece<'a>(
    std::ptr::NonNull<[u8]>,
    std::marker::PhantomData<&'a mut [u8]>,
);

impl<'a> Piece<'a> {
    fn of(mut range: WriteOnly<'a, [u8]>) -> Self {
        Piece(range.as_raw_ptr(), std::marker::PhantomData)
    }
}

// SAFETY: a `Piece` is a range of a mapping that outlives it (its `'a`),
// disjoint from every other piece: like a `&mut [u8]`, which is `Send`.
unsafe impl Send for Piece<'_> {}

/// Threads that read a window's writes from the plan.
fn upload_threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    #[cfg(target_arch = "wasm32")]
    let threads = 1;
    threads
}

/// Reads a window's writes from the plan into `view` (mapped staging
/// memory, the writes back to back, which wgpu lets us only write: it may
/// be write-combined), on as many threads as `scratch` has buffers, each
/// taking the next write until none is left (the reads were most of a 1B
/// model's upload on one thread) and reading it into its own buffer, kept
/// from window to window, before copying it into `view`. A plan file that
/// shrank since it was opened fails the read with
/// [`gerbil_plan::PlanError::Changed`]: the weights are read, never mapped,
/// so there is nothing to fault on.
fn fill_window(
    plan: &PlanFile,
    writes: &[Write<'_>],
    view: WriteOnly<'_, [u8]>,
    scratch: &mut [Vec<u8>],
) -> Result<(), RuntimeError> {
    let mut pieces = Vec::with_capacity(writes.len());
    let mut rest = view;
    for w in writes {
        let (head, tail) = rest.split_at(w.len);
        pieces.push((w, Piece::of(head)));
        rest = tail;
    }
    let read = |(w, dst): (&Write<'_>, Piece<'_>), buf: &mut Vec<u8>| {
        buf.resize(buf.len().max(w.len), 0);
        plan.read_section(w.section, w.from, &mut buf[..w.len])?;
        // SAFETY: `dst` is a range of `view`'s mapping, which outlives this
        // function, disjoint from every other piece, and written by this
        // thread alone.
        unsafe { WriteOnly::new(dst.0) }.copy_from_slice(&buf[..w.len]);
        Ok::<(), RuntimeError>(())
    };
    #[cfg(not(target_arch = "wasm32"))]
    if scratch.len().min(pieces.len()) > 1 {
        let queue = std::sync::Mutex::new(pieces.into_iter());
        let next = || queue.lock().ok().and_then(|mut q| q.next());
        return std::thread::scope(|scope| {
            let handles: Vec<_> = scratch
                .iter_mut()
                .take(writes.len())
                .map(|buf| scope.spawn(|| std::iter::from_fn(next).try_for_each(|p| read(p, buf))))
                .collect();
            // An error returns at once; the scope still joins every thread.
            handles
                .into_iter()
                .try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        });
    }
    match scratch.first_mut() {
        Some(buf) => pieces.into_iter().try_for_each(|p| read(p, buf)),
        None => pieces
            .into_iter()
            .try_for_each(|p| read(p, &mut Vec::new())),
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use gerbil_plan::{
        BufferDecl, CompileInfo, DataLayout, Dispatch, IoBindings, Kernel, ModelInfo, OutputKind,
        TextInfo, Variant, WorkgroupCount,
    };
    use std::sync::{Arc, Mutex};

    /// A GPU and the homes of `plan`'s `weights` weights (plan buffers 3,
    /// 4, …: [`plan_of_weights`]), not yet uploaded.
    async fn resident(plan: &PlanFile, weights: usize) -> (Gpu, Residency) {
        let gpu = Gpu::open(&Default::default()).await.expect("a GPU");
        let used: HashSet<u32> = (3..3 + weights as u32).collect();
        let residency = Residency::allocate(&gpu, &plan.header, &used, 4, 1)
            .await
            .expect("allocate");
        (gpu, residency)
    }

    /// A plan of `sizes` weights (pseudo-random bytes) and the least else a
    /// plan must hold to pass its checks; written to a temporary file and
    /// opened as the runtime opens plans.
    fn plan_of_weights(sizes: &[u64]) -> PlanFile {
        let path = std::env::temp_dir().join(format!(
            "gerbil-residency-test-{}-{}.plan",
            std::process::id(),
            sizes.len()
        ));
        write_plan_of_weights(sizes, &path);
        let plan = PlanFile::open(&path).expect("open the test plan");
        let _ = std::fs::remove_file(&path);
        plan
    }

    /// Writes the plan of [`plan_of_weights`] to `path`.
    fn write_plan_of_weights(sizes: &[u64], path: &std::path::Path) {
        let mut state = 0x9e37_79b9_u32;
        let bytes: Vec<Vec<u8>> = sizes
            .iter()
            .map(|&n| {
                (0..n)
                    .map(|_| {
                        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                        (state >> 24) as u8
                    })
                    .collect()
            })
            .collect();
        let mut data = DataLayout::default();
        let vocab = 8;
        let mut buffers = vec![
            BufferDecl {
                size: gerbil_plan::STEP_PARAMS_BYTES,
                kind: BufferKind::StepParams,
            },
            BufferDecl {
                size: 16,
                kind: BufferKind::TokenIds,
            },
            BufferDecl {
                size: vocab * 4,
                kind: BufferKind::Output {
                    output: OutputKind::Logits,
                },
            },
        ];
        for (i, b) in bytes.iter().enumerate() {
            let section = data.push(std::borrow::Cow::Borrowed(b));
            buffers.push(BufferDecl {
                size: b.len() as u64,
                kind: BufferKind::Weight {
                    section,
                    name: format!("w{i}"),
                    dtype: "u8".into(),
                    shape: vec![b.len() as u64],
                    position_rows: false,
                },
            });
        }
        let dispatch = Dispatch {
            kernel: 0,
            bindings: Vec::new(),
            workgroups: [WorkgroupCount::fixed(1); 3],
            label: "nothing".into(),
            layer: None,
            group: String::new(),
            flops: Default::default(),
            tokens: None,
        };
        let header = PlanHeader {
            model: ModelInfo {
                architecture: "Test".into(),
                family: "test".into(),
                name: "weights".into(),
                vocab_size: vocab,
                hidden_size: 4,
                num_layers: 1,
                max_context: 4,
                max_tokens_per_step: 4,
                config: serde_json::Value::Null,
                embedding: None,
            },
            text: TextInfo::default(),
            compile: CompileInfo::default(),
            buffers,
            kernels: vec![Kernel {
                op: Default::default(),
                name: "nothing".into(),
                wgsl: String::new(),
                entry: "main".into(),
                workgroup_size: [1, 1, 1],
                bindings: Vec::new(),
            }],
            variants: vec![Variant {
                name: "portable".into(),
                features: Vec::new(),
                precision: Default::default(),
                requirements: Default::default(),
                prefill: vec![dispatch.clone()],
                decode: vec![dispatch],
                batch: Vec::new(),
                int8_dots: false,
                split_x: false,
            }],
            io: IoBindings {
                step_params: 0,
                token_ids: 1,
                logits: BufferSlice {
                    buffer: 2,
                    offset: 0,
                    size: vocab * 4,
                },
                logits_all_rows: false,
                next_token: None,
                sampling_params: None,
                step_rows: None,
                max_batch: 0,
                batch_tokens: None,
            },
            selftest: None,
        };
        gerbil_plan::write_plan(path, &header, &data).expect("write the test plan");
    }

    /// A plan truncated by another program between opening and uploading
    /// fails the upload with an error naming the file; the weights are read,
    /// not mapped, so the missing bytes cannot fault (SIGBUS).
    #[test]
    fn a_plan_truncated_before_the_upload_is_an_error_not_a_fault() {
        let sizes = [20_000, 4_096, 52_000];
        let path = std::env::temp_dir().join(format!(
            "gerbil-residency-truncated-{}.plan",
            std::process::id()
        ));
        write_plan_of_weights(&sizes, &path);
        let plan = PlanFile::open(&path).expect("open the test plan");
        let len = std::fs::metadata(&path).expect("the plan").len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(len - 30_000))
            .expect("truncate the plan");
        let result = pollster::block_on(async {
            let (gpu, residency) = resident(&plan, sizes.len()).await;
            residency.upload_in_windows(&gpu, &plan, 16_384, None).await
        });
        let _ = std::fs::remove_file(&path);
        let err = result
            .expect_err("a truncated plan cannot upload")
            .to_string();
        assert_eq!(
            err,
            format!(
                "{}: the plan file changed while it was being read (now {} bytes, was {len}); \
                 do not rewrite a plan while gerbil runs it: rerun the command",
                path.display(),
                len - 30_000
            )
        );
    }

    /// Every weight arrives whole at its home, through staging buffers
    /// smaller than some weights (cut into pieces) and larger than others
    /// (several to a window), at their offsets in the weight pool, with more
    /// windows than staging buffers (each reused).
    #[test]
    fn uploaded_weights_read_back_as_the_plan_holds_them() {
        let sizes = [20_000, 4_096, 52_000, 8, 30_000, 100, 16_384];
        let plan = plan_of_weights(&sizes);
        let got = pollster::block_on(async {
            let (gpu, residency) = resident(&plan, sizes.len()).await;
            residency
                .upload_in_windows(&gpu, &plan, 12_288, None)
                .await
                .expect("upload");
            let mut got = Vec::new();
            for (i, &size) in (3u32..).zip(&sizes) {
                let slice = BufferSlice {
                    buffer: i,
                    offset: 0,
                    size,
                };
                let home = residency.binding(&slice, 0);
                let readback = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                let mut encoder = gpu.device.create_command_encoder(&Default::default());
                encoder.copy_buffer_to_buffer(home.buffer, home.offset, &readback, 0, size);
                gpu.queue.submit([encoder.finish()]);
                got.push(
                    gpu.read_mapped(&readback, |b| b.to_vec())
                        .await
                        .expect("read"),
                );
            }
            got
        });
        for (i, bytes) in (3usize..).zip(got) {
            let BufferKind::Weight { section, .. } = plan.header.buffers[i].kind else {
                panic!("buffer {i} is a weight");
            };
            let want = plan.section_bytes(section).expect("the plan's bytes");
            assert!(bytes == *want, "weight {i} ({} bytes) differs", bytes.len());
        }
    }

    #[test]
    fn upload_progress_counts_up_to_the_weight_bytes_once_per_window() {
        let sizes = [20_000, 4_096, 52_000, 8, 30_000, 100];
        let total: u64 = sizes.iter().sum();
        let plan = plan_of_weights(&sizes);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hook = {
            let seen = seen.clone();
            ProgressHook::new(move |p| seen.lock().unwrap().push(p))
        };
        pollster::block_on(async {
            let (gpu, residency) = resident(&plan, sizes.len()).await;
            residency
                .upload_in_windows(&gpu, &plan, 16_384, Some(&hook))
                .await
                .expect("upload");
        });
        let seen = seen.lock().unwrap();
        let done: Vec<u64> = seen
            .iter()
            .map(|p| match *p {
                Progress::Weights { done, total: t } => {
                    assert_eq!(t, total, "{seen:?}");
                    done
                }
                other => panic!("not a weights event: {other:?}"),
            })
            .collect();
        // Staging buffers of 16 KiB take pieces of at most 16 KiB, as many
        // as fit: 16,384 (of the first weight); its last 3,616 + 4,096;
        // three pieces of the third weight alone; its last 2,848 + 8; two
        // pieces of the fifth weight, the second with the last 100 bytes.
        // Each report comes after its window reached the GPU.
        assert_eq!(
            done,
            [16_384, 24_096, 40_480, 56_864, 73_248, 76_104, 92_488, 106_204],
            "{seen:?}"
        );
        assert!(done.windows(2).all(|w| w[0] < w[1]), "increasing: {done:?}");
        assert_eq!(done.last(), Some(&total), "{done:?}");
    }
}
