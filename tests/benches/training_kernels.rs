//! Times the training kernels on this machine's GPU at SmolLM2-135M's
//! shapes (a sequence of 512 tokens): the fused optimizer step over all
//! 134,515,008 weights (f32 and 8-bit state, with the f16 mirror) and
//! each backward kernel once. Run it where a GPU is:
//!
//! ```text
//! cargo bench -p gerbil-e2e --bench training_kernels
//! ```
//!
//! Each line is the median of 15 timed runs (after 3 warm ones) of the
//! kernel's dispatches submitted and waited for, so it includes one
//! submit-and-wait (70–130 µs on the H100): the numbers are for ranking
//! kernels and sizing the work ahead, not for a tight loop. Inputs are
//! constants (finite, so the optimizer never skips its step).
//!
//! The surprise: it needs 4.3 GB of GPU memory for the optimizer's four
//! f32 buffers, so it is a benchmark, never part of `cargo test`.

use gerbil_codegen_wgsl::kernels::{adamw, backward, KernelSource, Rows};
use gerbil_ir::{Attention, DType, Embedding, RmsNorm, UnaryOp};
use std::time::Instant;

/// SmolLM2-135M's weights.
const WEIGHTS: u32 = 134_515_008;
/// The sequence length.
const T: u32 = 512;

/// One kernel to time: its source, each storage binding's bytes (in
/// binding order) and its dispatches per run.
struct Case {
    what: String,
    kernels: Vec<(KernelSource, Vec<u64>)>,
    /// Bytes a run must move at least (for a bandwidth figure), if any.
    bytes: Option<u64>,
}

fn main() {
    let opts = gerbil_runtime::device::DeviceOptions::default();
    let gpu = match pollster::block_on(gerbil_runtime::Gpu::open_on(&Default::default(), &opts)) {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("no GPU to time on: {e}");
            return;
        }
    };
    println!("{} ({:?})", gpu.adapter.name, gpu.adapter.backend);
    for case in cases() {
        let ms = time(&gpu, &case);
        let rate = case
            .bytes
            .map(|b| format!(", {:.2} TB/s", b as f64 / (ms * 1e-3) / 1e12))
            .unwrap_or_default();
        println!("{:<58} {ms:>8.3} ms{rate}", case.what);
    }
}

fn cases() -> Vec<Case> {
    let n = u64::from(WEIGHTS);
    let partials = u64::from(adamw::PARTIALS) * 4;
    let norm_pass = (adamw::grad_norm_partials(WEIGHTS), vec![4 * n, partials]);
    let f32_state = vec![32, partials, 4 * n, 4 * n, 4 * n, 4 * n, 12, 2 * n];
    let q = n.next_multiple_of(4);
    let scales = 8 * u64::from(WEIGHTS.div_ceil(adamw::STATE_BLOCK));
    let eight_bit = vec![32, partials, 4 * n, 4 * n, q, q, scales, 12, 2 * n];
    let (h, kv, hd, mlp, vocab) = (576u32, 192u32, 64u32, 1536u32, 49_152u32);
    let (t, f) = (u64::from(T), 4u64);
    let attention = Attention {
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: hd,
        scale: 0.125,
        window: None,
        causal: true,
    };
    let norm = RmsNorm {
        eps: 1e-5,
        weight_offset: 0.0,
        groups: 1,
    };
    let lookup = Embedding {
        scale: None,
        padding: Some(2),
    };
    let (mlp64, h64, v64) = (u64::from(mlp), u64::from(h), u64::from(vocab));
    // Several dispatches of one op, each binding's bytes by its name
    // (scratch: as declared).
    let chain =
        |what: &str, kernels: Vec<KernelSource>, bytes: &dyn Fn(&str) -> Option<u64>| Case {
            what: what.to_string(),
            kernels: kernels
                .into_iter()
                .map(|src| {
                    let sizes = src.bindings[1..]
                        .iter()
                        .map(|b| bytes(&b.name).unwrap_or(b.bytes))
                        .collect();
                    (src, sizes)
                })
                .collect(),
            bytes: None,
        };
    let attention_bytes = |name: &str| match name {
        "q" | "dy" | "o" | "dq" => Some(t * h64 * f),
        "k" | "v" | "dk" | "dv" => Some(t * u64::from(kv) * f),
        "lse" => Some(t * 9 * f),
        _ => None,
    };
    let one = |what: &str, src: KernelSource, bytes: Vec<u64>| Case {
        what: what.to_string(),
        kernels: vec![(src, bytes)],
        bytes: None,
    };
    vec![
        Case {
            what: "adamw, f32 state + f16 mirror, all weights (2 dispatches)".into(),
            kernels: vec![
                norm_pass.clone(),
                (adamw::adamw_update(WEIGHTS, 1, true), f32_state),
            ],
            // Gradients read twice; weights, m, v read and written; the
            // mirror and zeroed gradients written.
            bytes: Some(4 * n * 2 + 4 * n * 6 + 2 * n + 4 * n),
        },
        Case {
            what: "adamw, 8-bit state + f16 mirror, all weights (2 dispatches)".into(),
            kernels: vec![
                norm_pass,
                (adamw::adamw_update_8bit(WEIGHTS, 1, true), eight_bit),
            ],
            bytes: Some(4 * n * 2 + 4 * n * 2 + 2 * q * 2 + 2 * n + 4 * n),
        },
        one(
            "cross_entropy_grad, T 512 × vocab 49,152",
            backward::cross_entropy_grad(vocab),
            vec![t * v64 * f, t * 4, t * v64 * f],
        ),
        one(
            "cross_entropy (loss), T 512 × vocab 49,152",
            backward::cross_entropy(vocab, T),
            vec![t * v64 * f, t * 4, 4, t * 4, 4],
        ),
        chain(
            "matmul_grad_x (2 dispatches: pieces, sum), lm_head: 512 × 49,152 → 576 (bf16 w)",
            backward::matmul_grad_x(vocab, h, DType::BF16, T),
            &|name| match name {
                "dy" => Some(t * v64 * f),
                "w" => Some(v64 * h64 * 2),
                "dx" => Some(t * h64 * f),
                _ => None,
            },
        ),
        one(
            "matmul_grad_w, lm_head: 49,152 × 576 over 512 rows",
            backward::matmul_grad_w(vocab, h, T).remove(0),
            vec![t * v64 * f, t * h64 * f, v64 * h64 * f],
        ),
        one(
            "matmul_grad_x, down_proj: 512 × 576 → 1,536 (bf16 w)",
            backward::matmul_grad_x(h, mlp, DType::BF16, T).remove(0),
            vec![t * h64 * f, h64 * mlp64 * 2, t * mlp64 * f],
        ),
        one(
            "matmul_grad_w, gate_proj: 1,536 × 576 over 512 rows",
            backward::matmul_grad_w(mlp, h, T).remove(0),
            vec![t * mlp64 * f, t * h64 * f, mlp64 * h64 * f],
        ),
        one(
            "silu_grad, 512 × 1,536",
            backward::unary_grad(UnaryOp::Silu, Rows::Tokens, mlp),
            vec![t * mlp64 * f, t * mlp64 * f, t * mlp64 * f],
        ),
        chain(
            "rms_norm_grad (3 dispatches), 512 × 576 (bf16 w)",
            backward::rms_norm_grad(h, &norm, DType::BF16, T),
            &|name| match name {
                "x" | "dy" | "dx" => Some(t * h64 * f),
                "w" => Some(h64 * 2),
                "dw" => Some(h64 * f),
                _ => None,
            },
        ),
        chain(
            "attention_lse (2 dispatches), 512 rows, 9 heads of 64, 3 KV heads",
            backward::attention_lse(&attention, T, T, 1),
            &attention_bytes,
        ),
        chain(
            "attention_grad (8 dispatches), 512 rows, 9 heads of 64, 3 KV heads",
            backward::attention_grad(&attention, T, T, 1),
            &attention_bytes,
        ),
        one(
            "embedding_grad, 49,152 × 576 from 512 ids",
            backward::embedding_grad(vocab, h, &lookup),
            vec![t * 4, t * h64 * f, v64 * h64 * f],
        ),
    ]
}

/// The median milliseconds of one run of `case`'s dispatches.
fn time(gpu: &gerbil_runtime::Gpu, case: &Case) -> f64 {
    let device = &gpu.device;
    let params = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("params"),
        size: 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    gpu.queue
        .write_buffer(&params, 0, bytemuck::cast_slice(&[T, 0u32, 0, 0]));
    let mut buffers = Vec::new();
    let mut passes = Vec::new();
    for (src, sizes) in &case.kernels {
        let made = gerbil_e2e::kernel_harness::kernel_pipeline(device, src);
        let bufs: Vec<wgpu::Buffer> = sizes
            .iter()
            .map(|&size| {
                let buf = device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: size.next_multiple_of(4),
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                // Small finite values: 1e-3 in every f32, a valid id in
                // every u32 id (the bits of 1e-3 are not, so ids get 7),
                // and counters at zero, as the plan's scratch starts.
                let fill: Vec<f32> = vec![1e-3; (size / 4) as usize];
                gpu.queue.write_buffer(&buf, 0, bytemuck::cast_slice(&fill));
                buf
            })
            .collect();
        for (decl, buf) in src.bindings[1..].iter().zip(&bufs) {
            let words = (buf.size() / 4) as usize;
            if decl.port == gerbil_plan::Port::Counters {
                gpu.queue
                    .write_buffer(buf, 0, bytemuck::cast_slice(&vec![0u32; words]));
            } else if decl.elem == gerbil_plan::Elem::U32
                && decl.access == gerbil_plan::Access::Read
            {
                gpu.queue
                    .write_buffer(buf, 0, bytemuck::cast_slice(&vec![7u32; words]));
            }
        }
        let storage = bufs.iter().map(|b| b.as_entire_binding());
        let group =
            gerbil_e2e::kernel_harness::bind_group(device, src, &made.layout, &params, storage);
        let counts = src.workgroups.map(|w| w.eval_at(T, T));
        passes.push((made.pipeline, group, counts));
        buffers.push(bufs);
    }
    let run = || {
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for (pipeline, group, [x, y, z]) in &passes {
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, group, &[]);
                pass.dispatch_workgroups(*x, *y, *z);
            }
        }
        gpu.queue.submit([enc.finish()]);
        // A lost device is the run's end; the timing then means nothing.
        let _ = device.poll(wgpu::PollType::wait_indefinitely());
    };
    for _ in 0..3 {
        run();
    }
    let mut times: Vec<f64> = (0..15)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}
