//! Runs one codegen kernel template on the GPU (lavapipe in CI) and compares
//! it with a CPU reference.
//!
//! [`run`] takes a [`KernelSource`], the step parameters `T` and `P`, and one
//! byte buffer per storage binding (binding 1 first) but the kernel's
//! scratch, which the harness provides; it dispatches the kernel once and
//! returns the bytes of every `read_write` input, in binding order.
//! [`run_steps`] dispatches a kernel several times on the same buffers, so a
//! kernel that keeps counters in scratch shows it leaves them zero. Outputs are whatever the caller passes for them: give
//! [`poison`] so an element the kernel forgets to write reads back as NaN and
//! fails [`check_close`]. [`Rng`] makes deterministic inputs in `[-1, 1]`,
//! [`encode`] packs them as f32, bf16 or f16 and returns the exactly decoded
//! values for the reference.
//!
//! The surprise: the runtime runs kernels without wgpu's runtime bounds
//! checks, so [`run`] does too — one pipeline per case, as the runtime
//! builds it — with every binding placed between poisoned guard bands as
//! long as the binding itself (at least 256 bytes): a read out of range
//! finds NaN and fails [`check_close`], a write out of range changes a
//! guard band and fails the run. An index a template fails to guard fails
//! the test.

use gerbil_codegen_wgsl::kernels::KernelSource;
use gerbil_ir::DType;
use gerbil_plan::{Access, BindingDecl, Elem, Port};
use std::sync::Mutex;

/// Largest accepted `|got − want| / max(1, |want|)`: f32 accumulation noise.
pub const TOL: f64 = 1e-4;

/// The device, opened on first use with the adapter's full limits, and
/// again when it was lost: it is the device sessions share (the same
/// options), which the device-loss tests destroy.
fn gpu() -> gerbil_runtime::Gpu {
    static GPU: Mutex<Option<gerbil_runtime::Gpu>> = Mutex::new(None);
    let mut gpu = GPU.lock().unwrap_or_else(|e| e.into_inner());
    match &*gpu {
        Some(g) if g.lost().is_none() => g.clone(),
        _ => {
            // Every capability the adapter has, tensor cores included, so
            // the cooperative-matrix kernels run where the GPU can.
            let opts = gerbil_runtime::device::DeviceOptions {
                tensor_cores: true,
                ..Default::default()
            };
            let g = pollster::block_on(gerbil_runtime::Gpu::open_on(&Default::default(), &opts))
                .expect("no wgpu adapter: install mesa-vulkan-drivers (lavapipe)");
            *gpu = Some(g.clone());
            g
        }
    }
}

/// Whether the test device runs cooperative-matrix (tensor-core) kernels:
/// the harness's device asks for them, and gets them where the adapter
/// offers 16×16×16 f16 → f32 (not lavapipe).
pub fn has_cooperative_matrix() -> bool {
    gpu()
        .device
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
}

/// The test device's workgroup memory limit (32 KiB on lavapipe, 48 KiB on
/// an H100 or H200): kernels whose tiles grow with the limit are checked at
/// it as well as at WebGPU's default.
pub fn max_workgroup_bytes() -> u32 {
    gpu().limits.max_compute_workgroup_storage_size
}

/// The fewest bytes of poison (all bits set: NaN as f32) before and after
/// every storage binding (a binding's guard bands are as long as it is), so
/// an out-of-range read of an unchecked kernel shows up as NaN and an
/// out-of-range write as a changed guard band. Also the binding offset
/// alignment.
const GUARD: u64 = 256;

/// One dispatch of a sequence run by [`run_steps`].
#[derive(Clone, Debug)]
pub struct Step {
    /// Tokens of the step (`T`).
    pub t: u32,
    /// Position of its first token (`P`).
    pub p: u32,
    /// One input per storage binding that is not scratch, in binding order
    /// (lengths are padded to 4 bytes).
    pub inputs: Vec<Vec<u8>>,
}

/// Whether binding `b` is scratch, which the harness provides itself.
fn is_scratch(b: &BindingDecl) -> bool {
    matches!(b.port, Port::Scratch | Port::Counters)
}

/// Runs `src` with step parameters `t`, `p` and one input per storage
/// binding that is not scratch (`inputs[0]` is the first, from binding 1;
/// lengths are padded to 4 bytes), without wgpu's shader runtime checks (as
/// the runtime runs it), each binding between poisoned guard bands. Returns
/// the contents of every `read_write` binding that is not scratch, in
/// binding order, at the length it was given. Panics on any wgpu error, on a
/// write into a guard band or on counters left non-zero, naming the kernel.
pub fn run(src: &KernelSource, t: u32, p: u32, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let step = Step {
        t,
        p,
        inputs: inputs.to_vec(),
    };
    run_steps(src, &[step]).remove(0)
}

/// [`run`] for a sequence of dispatches of `src` on the same buffers: each
/// step uploads its inputs afresh (outputs included), while the kernel's
/// scratch persists from one dispatch to the next like the plan's scratch
/// buffer (working memory starts as NaN, counters at zero, and every
/// dispatch must leave the counters zero). Returns, per step, what [`run`]
/// returns.
pub fn run_steps(src: &KernelSource, steps: &[Step]) -> Vec<Vec<Vec<u8>>> {
    let checks = gerbil_runtime::pipeline::ShaderChecks::Unchecked;
    assert_eq!(
        src.bindings.first().map(|b| b.access),
        Some(Access::Uniform),
        "{}: binding 0 must be the step parameters",
        src.name
    );
    let storage_bindings = &src.bindings[1..];
    // `operand[i]`: which input of a step binding `i + 1` takes, if not scratch.
    let mut operand = Vec::new();
    let mut inputs = 0;
    for b in storage_bindings {
        operand.push((!is_scratch(b)).then_some(inputs));
        inputs += usize::from(!is_scratch(b));
    }
    for step in steps {
        assert_eq!(
            step.inputs.len(),
            inputs,
            "{}: one input per storage binding that is not scratch",
            src.name
        );
    }
    let _lock = crate::gpu_lock();
    let gpu = gpu();
    let gerbil_runtime::Gpu { device, queue, .. } = &gpu;
    let setup = device.push_error_scope(wgpu::ErrorFilter::Validation);

    let storage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    let params = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("params"),
        size: 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let padded_len = |n: usize| (n as u64).next_multiple_of(4).max(4);
    // The first step's contents of each binding: an input, zeroed counters,
    // or NaN working memory.
    let first: Vec<Vec<u8>> = storage_bindings
        .iter()
        .zip(&operand)
        .map(|(b, i)| match (i, b.port) {
            (Some(i), _) => steps[0].inputs[*i].clone(),
            (None, Port::Counters) => vec![0; b.bytes as usize],
            (None, _) => vec![0xFF; b.bytes as usize],
        })
        .collect();
    // Each binding is `padded` bytes at offset `guard` (its length rounded up
    // to GUARD) of a poisoned buffer `guard + padded + guard` long.
    let buffers: Vec<(wgpu::Buffer, u64, u64)> = first
        .iter()
        .zip(storage_bindings)
        .map(|(data, decl)| {
            // A uniform (the sampling parameters) is bound as one.
            let usage = match decl.access {
                Access::Uniform => wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                _ => storage,
            };
            let padded = padded_len(data.len());
            let guard = padded.next_multiple_of(GUARD);
            let mut bytes = vec![0xFF; (guard + padded + guard) as usize];
            bytes[guard as usize..][..data.len()].copy_from_slice(data);
            bytes[(guard as usize + data.len())..(guard + padded) as usize].fill(0);
            let buf = device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes.len() as u64,
                usage: usage | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            queue.write_buffer(&buf, 0, &bytes);
            (buf, padded, guard)
        })
        .collect();

    let gerbil_runtime::pipeline::KernelPipeline {
        layout: bgl,
        pipeline,
    } = kernel_pipeline(device, src);
    let resources = buffers.iter().map(|(buffer, size, guard)| {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer,
            offset: *guard,
            size: std::num::NonZeroU64::new(*size),
        })
    });
    let bind_group = bind_group(device, src, &bgl, &params, resources);

    if let Some(e) = pollster::block_on(setup.pop()) {
        panic!("kernel `{}`: {e}", src.name);
    }

    let mut results = Vec::new();
    for (n, step) in steps.iter().enumerate() {
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        queue.write_buffer(
            &params,
            0,
            bytemuck::cast_slice(&[step.t, step.p, 0u32, 0u32]),
        );
        if n > 0 {
            for ((buf, padded, guard), i) in buffers.iter().zip(&operand) {
                if let Some(i) = i {
                    let mut bytes = step.inputs[*i].clone();
                    bytes.resize(*padded as usize, 0);
                    queue.write_buffer(buf, *guard, &bytes);
                }
            }
        }
        // As the runtime launches it: a split-K attention only the splits
        // the step's last row fills (its position plus one keys).
        let groups = src.workgroups.map(|w| w.eval_at(step.t, step.p + step.t));
        let mut enc = device.create_command_encoder(&Default::default());
        if groups.iter().all(|&g| g > 0) {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(&src.name),
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        }
        // Every buffer comes back whole: read_write bindings for their
        // contents, all of them for their guard bands.
        let readbacks: Vec<wgpu::Buffer> = buffers
            .iter()
            .map(|(gpu_buf, _, _)| {
                let staging = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("readback"),
                    size: gpu_buf.size(),
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                enc.copy_buffer_to_buffer(gpu_buf, 0, &staging, 0, gpu_buf.size());
                staging
            })
            .collect();
        queue.submit([enc.finish()]);
        if let Some(e) = pollster::block_on(validation.pop()) {
            panic!("kernel `{}` (groups {groups:?}): {e}", src.name);
        }

        for staging in &readbacks {
            staging.slice(..).map_async(wgpu::MapMode::Read, |r| {
                r.expect("map readback buffer");
            });
        }
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .expect("device lost");
        let mut out = Vec::new();
        for (i, (staging, &(_, padded, guard))) in readbacks.iter().zip(&buffers).enumerate() {
            let view = staging
                .slice(..)
                .get_mapped_range()
                .expect("mapped readback");
            let guards_intact = view[..guard as usize].iter().all(|&b| b == 0xFF)
                && view[(guard + padded) as usize..].iter().all(|&b| b == 0xFF);
            assert!(
                guards_intact,
                "{} ({checks:?}): binding {} wrote outside its range",
                src.name,
                i + 1
            );
            let b = &storage_bindings[i];
            match operand[i] {
                Some(k) if b.access == Access::ReadWrite => {
                    out.push(view[guard as usize..][..step.inputs[k].len()].to_vec())
                }
                None if b.port == Port::Counters => {
                    let counters = &view[guard as usize..][..b.bytes as usize];
                    assert!(
                        counters.iter().all(|&x| x == 0),
                        "{} ({checks:?}): dispatch {} left counters `{}` at {:?}; \
                         a kernel must leave its counters zero",
                        src.name,
                        n + 1,
                        b.name,
                        bytemuck::cast_slice::<u8, u32>(counters)
                    );
                }
                _ => {}
            }
        }
        results.push(out);
    }
    results
}

/// Runs `src` like [`run`] and returns `inputs[out]` (which must be bound
/// `read_write`) as f32s, after checking that every other `read_write` input
/// came back unchanged.
pub fn run_output(
    src: &KernelSource,
    t: u32,
    p: u32,
    inputs: &[Vec<u8>],
    out: usize,
) -> Result<Vec<f32>, String> {
    Ok(run_outputs(src, t, p, inputs, &[out])?.remove(0))
}

/// [`run_output`] for a kernel with several outputs: returns `inputs[o]` for
/// each `o` of `outs`, in that order, after checking that every other
/// `read_write` binding came back unchanged.
pub fn run_outputs(
    src: &KernelSource,
    t: u32,
    p: u32,
    inputs: &[Vec<u8>],
    outs: &[usize],
) -> Result<Vec<Vec<f32>>, String> {
    let step = Step {
        t,
        p,
        inputs: inputs.to_vec(),
    };
    Ok(run_steps_outputs(src, &[step], outs)?.remove(0))
}

/// [`run_outputs`] for a sequence of dispatches ([`run_steps`]): per step,
/// that step's `inputs[o]` for each `o` of `outs`, after checking that its
/// other `read_write` inputs came back unchanged.
pub fn run_steps_outputs(
    src: &KernelSource,
    steps: &[Step],
    outs: &[usize],
) -> Result<Vec<Vec<Vec<f32>>>, String> {
    let writable: Vec<(usize, Elem)> = src
        .bindings
        .iter()
        .skip(1)
        .filter(|b| !is_scratch(b))
        .enumerate()
        .filter(|(_, b)| b.access == Access::ReadWrite)
        .map(|(i, b)| (i, b.elem))
        .collect();
    let mut all = Vec::new();
    for (n, (step, got)) in steps.iter().zip(run_steps(src, steps)).enumerate() {
        let mut results = vec![None; outs.len()];
        for (&(i, elem), bytes) in writable.iter().zip(got) {
            if let Some(k) = outs.iter().position(|&o| o == i) {
                results[k] = Some(match elem {
                    Elem::F16x2 => f16_to_f32(&bytes),
                    _ => to_f32(&bytes),
                });
            } else if bytes != step.inputs[i] {
                return Err(format!("step {}: input {i} was modified", n + 1));
            }
        }
        let results = results
            .into_iter()
            .zip(outs)
            .map(|(r, o)| r.ok_or_else(|| format!("input {o} is not read_write")))
            .collect::<Result<Vec<_>, _>>()?;
        all.push(results);
    }
    Ok(all)
}

/// `src`'s pipeline and binding layout, made as the runtime makes them
/// (without wgpu's shader runtime checks).
pub fn kernel_pipeline(
    device: &wgpu::Device,
    src: &KernelSource,
) -> gerbil_runtime::pipeline::KernelPipeline {
    let kernel = gerbil_plan::Kernel {
        op: Default::default(),
        name: src.name.clone(),
        wgsl: src.wgsl.clone(),
        entry: "main".into(),
        workgroup_size: src.workgroup_size,
        bindings: src.bindings.clone(),
    };
    let checks = gerbil_runtime::pipeline::ShaderChecks::Unchecked;
    gerbil_runtime::pipeline::create_pipeline(device, &kernel, checks)
}

/// The bind group of `src` on `layout`: the step parameters at binding 0,
/// then `storage` in binding order.
pub fn bind_group<'a>(
    device: &wgpu::Device,
    src: &KernelSource,
    layout: &wgpu::BindGroupLayout,
    params: &'a wgpu::Buffer,
    storage: impl Iterator<Item = wgpu::BindingResource<'a>>,
) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry> = std::iter::once(params.as_entire_binding())
        .chain(storage)
        .enumerate()
        .map(|(i, resource)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource,
        })
        .collect();
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(&src.name),
        layout,
        entries: &entries,
    })
}

/// `n` f32s of NaN (all bits set): the initial contents of an output.
pub fn poison(n: usize) -> Vec<u8> {
    vec![0xFF; n * 4]
}

/// Little-endian bytes of `v`.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Little-endian bytes of `v`.
pub fn u32_bytes(v: &[u32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// f32s from little-endian bytes.
pub fn to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// f32s from little-endian f16 halves (an f16 KV cache).
pub fn f16_to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

/// `v` stored as `dtype` (bf16/f16: raw little-endian halves, so two per
/// `u32`, low half first; a quantized dtype: blocks drawn from `v`, see
/// [`encode_blocks`], in ggml's layout — `gpu_layout` makes a buffer of
/// them) and the stored values decoded exactly.
pub fn encode(v: &[f32], dtype: DType) -> (Vec<u8>, Vec<f64>) {
    match dtype {
        DType::F32 => (f32_bytes(v), v.iter().map(|&x| f64::from(x)).collect()),
        DType::BF16 => {
            let h: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
            (
                bytemuck::cast_slice(&h).to_vec(),
                h.iter().map(|x| x.to_f64()).collect(),
            )
        }
        DType::F16 => {
            let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
            (
                bytemuck::cast_slice(&h).to_vec(),
                h.iter().map(|x| x.to_f64()).collect(),
            )
        }
        DType::U32 => panic!("encode: U32 is not a float dtype"),
        _ => encode_blocks(v, dtype),
    }
}

/// Whole blocks of quantized `dtype` drawn from `v` (one block per
/// `dtype.block().0` values: random quants, and scales and minimums that
/// keep the values near ±1), in ggml's layout, and their values as
/// gguf-py dequantizes them.
fn encode_blocks(v: &[f32], dtype: DType) -> (Vec<u8>, Vec<f64>) {
    let (per, block_bytes) = dtype.block();
    // The scale that brings a block's largest quant near 1, and its minimum.
    let (scale, min) = match dtype {
        DType::Q8_0 => (1.0 / 127.0, 0.0),
        DType::Q4_0 => (1.0 / 8.0, 0.0),
        DType::Q4_1 => (1.0 / 8.0, -0.9),
        DType::Q5_0 => (1.0 / 16.0, 0.0),
        DType::Q5_1 => (1.0 / 16.0, -0.9),
        DType::Q4K => (1.0 / 900.0, 1.0 / 60.0),
        DType::Q5K => (1.0 / 1800.0, 1.0 / 60.0),
        _ => (1.0 / 4000.0, 0.0),
    };
    let mut bytes = Vec::new();
    for (i, block) in v.chunks(per as usize).enumerate() {
        // splitmix64 seeded by the block's first value.
        let mut state = u64::from(block[0].to_bits()) ^ ((i as u64) << 32);
        let mut b: Vec<u8> = (0..block_bytes)
            .map(|_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                (z ^ (z >> 31)) as u8
            })
            .collect();
        let jitter = 0.5 + block[1].abs();
        for (j, &at) in dtype.block_f16_fields().iter().enumerate() {
            let x = if j == 0 { scale * jitter } else { min * jitter };
            let h = half::f16::from_f32(x).to_le_bytes();
            b[at as usize..at as usize + 2].copy_from_slice(&h);
        }
        bytes.extend(b);
    }
    let ty = gerbil_gguf::TensorType::from_name(dtype.name())
        .unwrap_or_else(|| panic!("{dtype} is not a GGUF type"));
    let mut values = vec![0f32; v.len()];
    if let Err(e) = ty.dequantize(&bytes, &mut values) {
        panic!("dequantizing {dtype}: {e}");
    }
    (bytes, values.iter().map(|&x| f64::from(x)).collect())
}

/// Widens f32s for the reference.
pub fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// Checks `got` against `want` element by element with
/// `|got − want| / max(1, |want|) ≤ tol`; NaN always fails. The error names
/// `what`, the worst index and both values.
pub fn check_close(what: &str, got: &[f32], want: &[f64], tol: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.len()
        ));
    }
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs() / w.abs().max(1.0);
        if err.is_nan() {
            return Err(format!("{what}: [{i}] is {g}, expected {w}"));
        }
        if err > worst.0 {
            worst = (err, i);
        }
    }
    let (err, i) = worst;
    if err > tol {
        return Err(format!(
            "{what}: error {err:.3e} > {tol:.0e} at [{i}]: got {}, expected {}",
            got[i], want[i]
        ));
    }
    Ok(())
}

/// splitmix64: a small deterministic generator for test inputs.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from any string (e.g. the case's `Debug` form).
    pub fn from_label(label: &str) -> Rng {
        // FNV-1a.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in label.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Rng(h)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`.
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * u64::from(n)) >> 32) as u32
    }

    /// Uniform in `[-1, 1)`.
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values uniform in `[-1, 1)`.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
}

/// Runs `kernels` one after another, in one submission, as a plan runs the
/// dispatches of one node (`backward::attention_grad`'s eight): every kernel
/// binds each of its ports to the buffer `operands` gives that port, and
/// its scratch bindings to one shared scratch buffer laid out as the plan
/// lays it out (in binding order, each at a 256-byte boundary; working
/// memory starts as NaN), so what one kernel leaves there the next reads.
/// Returns every operand's bytes afterwards, in `operands`' order.
pub fn run_chain(
    kernels: &[KernelSource],
    t: u32,
    p: u32,
    operands: &[(Port, Vec<u8>)],
) -> Vec<Vec<u8>> {
    let _lock = crate::gpu_lock();
    let gpu = gpu();
    let gerbil_runtime::Gpu { device, queue, .. } = &gpu;
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
    let buffer = |bytes: &[u8]| {
        let b = device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (bytes.len() as u64).next_multiple_of(4).max(4),
            usage,
            mapped_at_creation: false,
        });
        let mut padded = bytes.to_vec();
        padded.resize(b.size() as usize, 0);
        queue.write_buffer(&b, 0, &padded);
        b
    };
    let buffers: Vec<wgpu::Buffer> = operands.iter().map(|(_, bytes)| buffer(bytes)).collect();
    let aligned = |n: u64| n.next_multiple_of(256);
    let scratch_bytes = kernels
        .iter()
        .map(|k| {
            k.bindings
                .iter()
                .filter(|b| is_scratch(b))
                .map(|b| aligned(b.bytes))
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    let scratch = buffer(&vec![0xFF; scratch_bytes.max(4) as usize]);
    let params = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("params"),
        size: 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    queue.write_buffer(&params, 0, bytemuck::cast_slice(&[t, p, 0u32, 0u32]));
    let mut enc = device.create_command_encoder(&Default::default());
    for src in kernels {
        let gerbil_runtime::pipeline::KernelPipeline { layout, pipeline } =
            kernel_pipeline(device, src);
        let mut next = 0;
        let resources = src.bindings[1..].iter().map(|b| {
            if is_scratch(b) {
                let offset = next;
                next += aligned(b.bytes);
                return wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &scratch,
                    offset,
                    size: std::num::NonZeroU64::new(b.bytes),
                });
            }
            let i = operands
                .iter()
                .position(|(port, _)| *port == b.port)
                .unwrap_or_else(|| panic!("{}: no operand for {:?}", src.name, b.port));
            buffers[i].as_entire_binding()
        });
        let group = bind_group(device, src, &layout, &params, resources);
        let groups = src.workgroups.map(|w| w.eval_at(t, p + t));
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
    }
    let readbacks: Vec<wgpu::Buffer> = buffers
        .iter()
        .map(|b| {
            let staging = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: b.size(),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            enc.copy_buffer_to_buffer(b, 0, &staging, 0, b.size());
            staging
        })
        .collect();
    queue.submit([enc.finish()]);
    if let Some(e) = pollster::block_on(scope.pop()) {
        panic!(
            "kernels {:?}: {e}",
            kernels.iter().map(|k| &k.name).collect::<Vec<_>>()
        );
    }
    for staging in &readbacks {
        staging
            .slice(..)
            .map_async(wgpu::MapMode::Read, |r| r.expect("map readback buffer"));
    }
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("device lost");
    readbacks
        .iter()
        .zip(operands)
        .map(|(staging, (_, bytes))| {
            let view = staging
                .slice(..)
                .get_mapped_range()
                .expect("mapped readback");
            view[..bytes.len()].to_vec()
        })
        .collect()
}
