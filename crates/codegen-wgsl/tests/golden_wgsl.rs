//! Golden WGSL: a fixed set of specialized kernels, each validated by naga and
//! compared with its committed snapshot (`cargo insta review` to update).

use gerbil_codegen_wgsl::kernels::{
    adamw, argmax_rows,
    attention::{self, AttentionSpec},
    attention_cpu, attention_decode, backward, elementwise,
    embedding::{self, EmbeddingSpec},
    gemm::{self, GemmTile},
    gemv::{self, Dots, Reduce},
    gemv_batch, grad_coop,
    matmul::{self, MatMulSpec},
    matmul_cpu,
    qkv_rope::{self, QkvRopeSpec},
    rms_norm::{self, RmsNormSpec},
    rope::{self, RopeSpec},
    sample_token::{self, Shape},
    KernelSource, Positions, Rows,
};
use gerbil_codegen_wgsl::{validate, validate_with};
use gerbil_ir::{BinaryOp, DType, UnaryOp};
use gerbil_plan::Feature;

fn golden(src: KernelSource) {
    // Kernels of an f16 variant (an f16 KV cache) need `shader-f16`; those
    // that reduce with subgroup operations, `subgroups`.
    let mut features = Vec::new();
    if src.wgsl.starts_with("enable f16;") {
        features.push(Feature::ShaderF16);
    }
    if src.wgsl.contains("@builtin(subgroup_id)") {
        features.push(Feature::Subgroups);
    }
    if src.wgsl.contains("enable wgpu_cooperative_matrix;") {
        features.push(Feature::CooperativeMatrix);
    }
    if features.is_empty() {
        validate(&src.name, &src.wgsl)
    } else {
        validate_with(&src.name, &src.wgsl, &features)
    }
    .unwrap_or_else(|e| panic!("{e}"));
    let header = format!(
        "// {} @workgroup_size({:?}) workgroups {:?}\n",
        src.name, src.workgroup_size, src.workgroups
    );
    insta::assert_snapshot!(src.name.clone(), header + &src.wgsl);
}

/// The kernels of the fusion passes, at SmolLM2 and Gemma 3 270M shapes.
#[test]
fn golden_fused_kernels() {
    // SmolLM2 decode: gate_up + SwiGLU.
    golden(matmul::kernel(MatMulSpec {
        shard_rows: None,
        rows: Rows::Tokens,
        k: 576,
        n: 1536,
        wdtype: DType::BF16,
        bias: false,
        tt: 1,
        glu: Some(UnaryOp::Silu),
        norm: None,
        residual: false,
        last_row: false,
        act: None,
    }));
    // GeGLU with a bias over an odd K, prefill rows, and a sharded weight.
    golden(matmul::kernel(MatMulSpec {
        shard_rows: Some(48),
        rows: Rows::Tokens,
        k: 7,
        n: 37,
        wdtype: DType::F32,
        bias: true,
        tt: 8,
        glu: Some(UnaryOp::GeluTanh),
        norm: None,
        residual: false,
        last_row: false,
        act: None,
    }));
    // SmolLM2 decode: the input norm in the q/k/v matmul's prologue.
    golden(matmul::kernel(MatMulSpec {
        shard_rows: None,
        rows: Rows::Tokens,
        k: 576,
        n: 960,
        wdtype: DType::BF16,
        bias: false,
        tt: 1,
        glu: None,
        norm: Some((1e-5, 0.0, DType::BF16)),
        residual: false,
        last_row: false,
        act: None,
    }));
    // SmolLM2 prefill: the residual add in down_proj's epilogue.
    golden(matmul::kernel(MatMulSpec {
        shard_rows: None,
        rows: Rows::Tokens,
        k: 1536,
        n: 576,
        wdtype: DType::BF16,
        bias: false,
        tt: 8,
        glu: None,
        norm: None,
        residual: true,
        last_row: false,
        act: None,
    }));
    // Gemma 3 270M decode: the pre-MLP norm `(1 + w)` in GeGLU's prologue.
    golden(matmul::kernel(MatMulSpec {
        shard_rows: None,
        rows: Rows::Tokens,
        k: 640,
        n: 2048,
        wdtype: DType::BF16,
        bias: false,
        tt: 1,
        glu: Some(UnaryOp::GeluTanh),
        norm: Some((1e-6, 1.0, DType::BF16)),
        residual: false,
        last_row: false,
        act: None,
    }));
    // An odd K (unpacked loads), f32 norm weight, bias and residual, prefill.
    golden(matmul::kernel(MatMulSpec {
        shard_rows: None,
        rows: Rows::Tokens,
        k: 7,
        n: 37,
        wdtype: DType::F16,
        bias: true,
        tt: 8,
        glu: None,
        norm: Some((1e-6, 1.0, DType::F32)),
        residual: true,
        last_row: false,
        act: None,
    }));
    // SmolLM2 prefill's LM head: the final norm on the last row of the stream.
    golden(matmul::kernel(MatMulSpec {
        shard_rows: None,
        rows: Rows::Fixed(1),
        k: 576,
        n: 49152,
        wdtype: DType::BF16,
        bias: false,
        tt: 1,
        glu: None,
        norm: Some((1e-5, 0.0, DType::BF16)),
        residual: false,
        last_row: true,
        act: None,
    }));
    golden(rms_norm::add_kernel(RmsNormSpec {
        rows: Rows::Tokens,
        width: 640,
        groups: 1,
        eps: 1e-6,
        offset: 1.0,
        wdtype: DType::BF16,
    }));
    // Gemma 3 270M's post-norms with their residual adds.
    golden(rms_norm::add_after_kernel(RmsNormSpec {
        rows: Rows::Tokens,
        width: 640,
        groups: 1,
        eps: 1e-6,
        offset: 1.0,
        wdtype: DType::BF16,
    }));
    golden(qkv_rope::kernel(QkvRopeSpec {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        rotary_dim: 64,
        norm: None,
        kv: DType::F32,
    }));
    golden(qkv_rope::kernel(QkvRopeSpec {
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        rotary_dim: 256,
        norm: Some((1e-6, 1.0, DType::BF16)),
        kv: DType::F32,
    }));
    golden(elementwise::slice_cols(Rows::Tokens, 960, 576, 192));
}

#[test]
fn golden_kernels() {
    golden(matmul::kernel(MatMulSpec {
        shard_rows: None,
        rows: Rows::Tokens,
        k: 576,
        n: 1536,
        wdtype: DType::BF16,
        bias: false,
        tt: 1,
        glu: None,
        norm: None,
        residual: false,
        last_row: false,
        act: None,
    }));
    golden(matmul::kernel(MatMulSpec {
        shard_rows: None,
        rows: Rows::Tokens,
        k: 64,
        n: 100,
        wdtype: DType::F32,
        bias: true,
        tt: 8,
        glu: None,
        norm: None,
        residual: false,
        last_row: false,
        act: None,
    }));
    golden(matmul::kernel(MatMulSpec {
        shard_rows: None,
        rows: Rows::Fixed(1),
        k: 7,
        n: 5,
        wdtype: DType::F16,
        bias: false,
        tt: 1,
        glu: None,
        norm: None,
        residual: false,
        last_row: false,
        act: None,
    }));
    golden(matmul::kernel(MatMulSpec {
        shard_rows: Some(104_856),
        rows: Rows::Fixed(1),
        k: 640,
        n: 262_144,
        wdtype: DType::BF16,
        bias: false,
        tt: 1,
        glu: None,
        norm: None,
        residual: false,
        last_row: false,
        act: None,
    }));
    golden(embedding::kernel(EmbeddingSpec {
        shard_rows: Some(104_856),
        vocab: 262_144,
        width: 640,
        wdtype: DType::BF16,
        scale: Some(25.298_221),
    }));
    golden(embedding::kernel_with_norm(
        EmbeddingSpec {
            shard_rows: Some(104_856),
            vocab: 262_144,
            width: 640,
            wdtype: DType::BF16,
            scale: Some(25.298_221),
        },
        embedding::NormSpec {
            eps: 1e-6,
            offset: 1.0,
            wdtype: DType::BF16,
        },
    ));
    golden(rms_norm::add_kernel_last_row(RmsNormSpec {
        rows: Rows::Fixed(1),
        width: 576,
        groups: 1,
        eps: 1e-5,
        offset: 0.0,
        wdtype: DType::BF16,
    }));
    golden(rms_norm::kernel(RmsNormSpec {
        rows: Rows::Tokens,
        width: 640,
        groups: 1,
        eps: 1e-6,
        offset: 1.0,
        wdtype: DType::BF16,
    }));
    // Gemma 3 270M's per-head q norm: 4 heads of 256 per row.
    golden(rms_norm::kernel(RmsNormSpec {
        rows: Rows::Tokens,
        width: 256,
        groups: 4,
        eps: 1e-6,
        offset: 1.0,
        wdtype: DType::BF16,
    }));
    golden(embedding::kernel(EmbeddingSpec {
        shard_rows: None,
        vocab: 262_144,
        width: 640,
        wdtype: DType::BF16,
        scale: Some(25.298_221),
    }));
    golden(rope::kernel(RopeSpec {
        heads: 9,
        head_dim: 64,
        rotary_dim: 64,
    }));
    golden(rope::kernel(RopeSpec {
        heads: 4,
        head_dim: 40,
        rotary_dim: 24,
    }));
    // Prefill and decode: SmolLM2 (decode at a 4096-token context) and a
    // Gemma 3 270M sliding layer.
    let smollm2 = AttentionSpec {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        scale: 0.125,
        window: 0,
        kv: DType::F32,
        causal: true,
        packed: false,
    };
    let gemma_sliding = AttentionSpec {
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        scale: 0.0625,
        window: 512,
        ..smollm2
    };
    golden(attention::kernel(smollm2, attention::MAX_WORKGROUP_BYTES));
    golden(attention::kernel(
        gemma_sliding,
        attention::MAX_WORKGROUP_BYTES,
    ));
    // The tensor-f16 variant's tiles (48 KiB of workgroup memory).
    golden(attention::kernel(
        gemma_sliding,
        gerbil_codegen_wgsl::TENSOR_WORKGROUP_STORAGE,
    ));
    golden(attention_decode::kernel(smollm2, 4096));
    golden(attention_decode::kernel(gemma_sliding, 32768));
    // Decode attention with its RoPE and cache writes: SmolLM2 (f16 caches)
    // and the Gemma 3 sliding layer (per-head norms).
    let rope = |s: AttentionSpec, norm| QkvRopeSpec {
        heads: s.heads,
        kv_heads: s.kv_heads,
        head_dim: s.head_dim,
        rotary_dim: s.head_dim,
        norm,
        kv: s.kv,
    };
    let smollm2_f16 = AttentionSpec {
        kv: DType::F16,
        ..smollm2
    };
    golden(attention_decode::kernel_with_rope(
        smollm2_f16,
        rope(smollm2_f16, None),
        4096,
    ));
    golden(attention_decode::kernel_with_rope(
        gemma_sliding,
        rope(gemma_sliding, Some((1e-6, 1.0, DType::BF16))),
        32768,
    ));
    golden(elementwise::unary(UnaryOp::GeluTanh, Rows::Tokens, 2048));
    golden(elementwise::unary(
        UnaryOp::Softcap(30.0),
        Rows::Fixed(1),
        262_144,
    ));
    golden(elementwise::unary(UnaryOp::Scale(2.0), Rows::Tokens, 576));
    golden(elementwise::binary(BinaryOp::Add, Rows::Tokens, 576));
    golden(elementwise::cache_write(192, DType::F32));
    golden(elementwise::add_bias(Rows::Tokens, 896, DType::BF16));
    golden(elementwise::slice_last_row(576));
}

/// The kernels that touch the KV cache as an f16 variant stores it:
/// SmolLM2's shapes at a 4096-token context.
#[test]
fn golden_f16_kv_kernels() {
    let smollm2 = AttentionSpec {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        scale: 0.125,
        window: 0,
        kv: DType::F16,
        causal: true,
        packed: false,
    };
    golden(qkv_rope::kernel(QkvRopeSpec {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        rotary_dim: 64,
        norm: None,
        kv: DType::F16,
    }));
    golden(attention::kernel(smollm2, attention::MAX_WORKGROUP_BYTES));
    golden(attention_decode::kernel(smollm2, 4096));
    golden(elementwise::cache_write(192, DType::F16));
}

/// The decode GEMVs at SmolLM2 shapes, in both reductions (the subgroup form
/// validated with the `subgroups` capability), and the fallbacks of a `K`
/// that is no multiple of 8.
/// A matmul over `T` rows without bias or last-row read.
fn rows_spec(
    k: u32,
    n: u32,
    wdtype: DType,
    glu: Option<UnaryOp>,
    norm: Option<(f32, f32, DType)>,
    residual: bool,
    shard_rows: Option<u32>,
) -> MatMulSpec {
    MatMulSpec {
        shard_rows,
        rows: Rows::Tokens,
        k,
        n,
        wdtype,
        bias: false,
        tt: 1,
        glu,
        norm,
        residual,
        last_row: false,
        act: None,
    }
}

#[test]
fn golden_gemv_kernels() {
    let spec = rows_spec;
    let bf16_norm = Some((1e-5, 0.0, DType::BF16));
    for reduce in [Reduce::Subgroup, Reduce::Workgroup] {
        let golden = |src: KernelSource| {
            let features: &[Feature] = match reduce {
                Reduce::Subgroup => &[Feature::Subgroups],
                Reduce::Workgroup => &[],
            };
            validate_with(&src.name, &src.wgsl, features).unwrap_or_else(|e| panic!("{e}"));
            let header = format!(
                "// {} @workgroup_size({:?}) workgroups {:?}\n",
                src.name, src.workgroup_size, src.workgroups
            );
            insta::assert_snapshot!(src.name.clone(), header + &src.wgsl);
        };
        // q/k/v with the input norm; gate/up + SwiGLU with the post-attention
        // norm; down_proj + residual.
        golden(gemv::kernel(
            &spec(576, 960, DType::BF16, None, bf16_norm, false, None),
            reduce,
            Dots::Float,
        ));
        golden(gemv::kernel(
            &spec(
                576,
                1536,
                DType::BF16,
                Some(UnaryOp::Silu),
                bf16_norm,
                false,
                None,
            ),
            reduce,
            Dots::Float,
        ));
        golden(gemv::kernel(
            &spec(1536, 576, DType::BF16, None, None, true, None),
            reduce,
            Dots::Float,
        ));
        // The LM head: the final norm, the last row of the stream.
        golden(gemv::kernel(
            &MatMulSpec {
                rows: Rows::Fixed(1),
                last_row: true,
                ..spec(576, 49152, DType::BF16, None, bf16_norm, false, None)
            },
            reduce,
            Dots::Float,
        ));
        // f16 pairs (K even, not a multiple of 4), odd f32 with a sharded
        // GeGLU weight.
        golden(gemv::kernel(
            &spec(
                130,
                64,
                DType::F16,
                None,
                Some((1e-6, 1.0, DType::F32)),
                true,
                None,
            ),
            reduce,
            Dots::Float,
        ));
        golden(gemv::kernel(
            &spec(
                7,
                37,
                DType::F32,
                Some(UnaryOp::GeluTanh),
                None,
                false,
                Some(48),
            ),
            reduce,
            Dots::Float,
        ));
    }
}

/// The `cpu` variant's matmuls at SmolLM2 shapes: gate/up + SwiGLU with
/// its norm over a prefill step's tokens (8 rows of `x` a thread),
/// down_proj with its residual in a decode step (one), the LM head on the
/// last row, and a Q4_K `o_proj` over a prefill step (its units dequantized
/// once for the 8 rows).
#[test]
fn golden_cpu_kernels() {
    let bf16_norm = Some((1e-5, 0.0, DType::BF16));
    let tokens = matmul_cpu::rows_per_thread(256);
    let swiglu = Some(UnaryOp::Silu);
    golden(matmul_cpu::kernel(
        &rows_spec(576, 1536, DType::BF16, swiglu, bf16_norm, false, None),
        tokens,
    ));
    golden(matmul_cpu::kernel(
        &rows_spec(1536, 576, DType::BF16, None, None, true, None),
        matmul_cpu::rows_per_thread(1),
    ));
    golden(matmul_cpu::kernel(
        &MatMulSpec {
            rows: Rows::Fixed(1),
            last_row: true,
            ..rows_spec(576, 49152, DType::BF16, None, bf16_norm, false, None)
        },
        1,
    ));
    golden(matmul_cpu::kernel(
        &rows_spec(576, 576, DType::Q4K, None, None, true, None),
        tokens,
    ));
}

/// The `cpu` variant's other kernels: SmolLM2's attention over a step's
/// rows, Gemma 3's sliding-window attention over a batch's row table (read
/// from an f16 cache, which the template supports though the variant is
/// f32 today), and the next-token choice
/// over SmolLM2's vocabulary in the CPU's shape.
#[test]
fn golden_cpu_attention_and_sampling() {
    golden(attention_cpu::kernel_at(
        AttentionSpec {
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            scale: 0.125,
            window: 0,
            kv: DType::F32,
            causal: true,
            packed: false,
        },
        Positions::Step,
    ));
    golden(attention_cpu::kernel_at(
        AttentionSpec {
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            scale: 0.0625,
            window: 512,
            kv: DType::F16,
            causal: true,
            packed: false,
        },
        Positions::Table,
    ));
    golden(sample_token::kernel(Rows::Fixed(1), 49152, Shape::CPU));
    golden(argmax_rows::kernel(49152, false));
}

/// The prefill GEMMs: SmolLM2's gate/up + SwiGLU with its norm prologue and
/// its down_proj + residual at the tiles the lowering picks, and an odd
/// shape (K = 7: one-element chunks) with every option on the smallest tile.
#[test]
fn golden_gemm_kernels() {
    let spec = |k, n, wdtype, glu, norm, residual, bias, shard_rows| MatMulSpec {
        shard_rows,
        rows: Rows::Tokens,
        k,
        n,
        wdtype,
        bias,
        tt: 1,
        glu,
        norm,
        residual,
        last_row: false,
        act: None,
    };
    let bf16_norm = Some((1e-5, 0.0, DType::BF16));
    let limit = gerbil_codegen_wgsl::Limits::webgpu_default().max_workgroup_storage;
    let gate_up = spec(
        576,
        1536,
        DType::BF16,
        Some(UnaryOp::Silu),
        bf16_norm,
        false,
        false,
        None,
    );
    golden(gemm::kernel(
        &gate_up,
        GemmTile::choose(1536, true, 256, limit),
    ));
    let down = spec(1536, 576, DType::BF16, None, None, true, false, None);
    golden(gemm::kernel(
        &down,
        GemmTile::choose(576, false, 256, limit),
    ));
    // Split K: the gated, normed matmul with its `K` shared by 4 workgroups.
    golden(gemm::kernel_split(
        &gate_up,
        GemmTile::choose(1536, true, 256, limit),
        gemm::GemmSplit {
            splits: 4,
            max_rows: 256,
        },
    ));
    let odd = spec(
        7,
        37,
        DType::F16,
        Some(UnaryOp::GeluTanh),
        Some((1e-6, 1.0, DType::F32)),
        true,
        true,
        Some(48),
    );
    golden(gemm::kernel(&odd, GemmTile::new(32, 64, 16, 4, 8)));
}

/// Every candidate tile with every option and chunk width validates (the
/// tiles that cannot pair gate and up columns are skipped for gated specs).
#[test]
fn every_gemm_tile_validates() {
    for tile in GemmTile::CANDIDATES {
        for (k, wdtype) in [
            (576, DType::BF16),
            (100, DType::F16),
            (130, DType::F32),
            (7, DType::BF16),
        ] {
            for glu in [None, Some(UnaryOp::Silu), Some(UnaryOp::Softcap(30.0))] {
                if !tile.supports(glu.is_some()) {
                    continue;
                }
                for (norm, residual, bias, shard_rows) in [
                    (None, false, false, None),
                    (Some((1e-6, 1.0, DType::BF16)), true, true, Some(40)),
                ] {
                    let src = gemm::kernel(
                        &MatMulSpec {
                            shard_rows,
                            rows: Rows::Tokens,
                            k,
                            n: 70,
                            wdtype,
                            bias,
                            tt: 1,
                            glu,
                            norm,
                            residual,
                            last_row: false,
                            act: None,
                        },
                        tile,
                    );
                    assert!(src.workgroup_bytes <= 16 << 10, "{}", src.name);
                    validate(&src.name, &src.wgsl).unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
    }
}

/// The decode GEMV of every ggml block type (SmolLM2's `down_proj` shape,
/// `K` = 1536: whole K-quant super-blocks), and the embedding of one: the
/// decoders the quantized loaders are built on.
#[test]
fn golden_quantized_kernels() {
    for (wdtype, dots) in gerbil_ir::QUANTIZED
        .into_iter()
        .flat_map(|w| [(w, Dots::Float), (w, Dots::Int8)])
    {
        let src = gemv::kernel(
            &MatMulSpec {
                shard_rows: None,
                rows: Rows::Tokens,
                k: 1536,
                n: 576,
                wdtype,
                bias: false,
                tt: 1,
                glu: None,
                norm: None,
                residual: true,
                last_row: false,
                act: None,
            },
            Reduce::Subgroup,
            dots,
        );
        validate_with(&src.name, &src.wgsl, &[Feature::Subgroups])
            .unwrap_or_else(|e| panic!("{e}"));
        let header = format!(
            "// {} @workgroup_size({:?}) workgroups {:?}\n",
            src.name, src.workgroup_size, src.workgroups
        );
        insta::assert_snapshot!(src.name.clone(), header + &src.wgsl);
    }
    golden(embedding::kernel(EmbeddingSpec {
        shard_rows: None,
        vocab: 49152,
        width: 576,
        wdtype: DType::Q8_0,
        scale: None,
    }));
}

/// The batch schedule's kernels, whose rows are sequences at the positions
/// of the row table: SmolLM2's fused q|k|v RoPE, a partial-rotary RoPE, a
/// Gemma 3 sliding-window attention and an f16 cache write; and its
/// matmuls: SmolLM2's gated MLP with its norm (bf16) and a Q4_0 `o_proj`
/// with its residual, 16 rows a workgroup.
#[test]
fn golden_row_table_kernels() {
    golden(qkv_rope::kernel_at(
        QkvRopeSpec {
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            rotary_dim: 64,
            norm: None,
            kv: DType::F32,
        },
        Positions::Table,
    ));
    golden(rope::kernel_at(
        RopeSpec {
            heads: 4,
            head_dim: 40,
            rotary_dim: 24,
        },
        Positions::Table,
    ));
    golden(attention_decode::kernel_at(
        AttentionSpec {
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            scale: 0.0625,
            window: 512,
            kv: DType::F32,
            causal: true,
            packed: false,
        },
        4096,
        Positions::Table,
        16,
    ));
    golden(elementwise::cache_write_at(
        192,
        DType::F16,
        Positions::Table,
    ));
    let norm = Some((1e-5, 0.0, DType::BF16));
    golden(gemv_batch::kernel(
        &rows_spec(
            576,
            1536,
            DType::BF16,
            Some(UnaryOp::Silu),
            norm,
            false,
            None,
        ),
        16,
    ));
    golden(gemv_batch::kernel(
        &rows_spec(576, 576, DType::Q4_0, None, None, true, None),
        16,
    ));
}

/// The fused optimizer step over all of SmolLM2's 134,515,008 weights.
#[test]
fn golden_adamw_kernels() {
    golden(adamw::grad_norm_partials(134_515_008));
    golden(adamw::adamw_update(134_515_008, 1, false));
    golden(adamw::adamw_update(134_515_008, 1, true));
    golden(adamw::adamw_update_8bit(134_515_008, 1, true));
}

/// A training step's backward kernels at SmolLM2's shapes (hidden 576,
/// MLP 1536, vocabulary 49,152, 9 heads of 64, 3 KV heads; bf16 weights).
#[test]
fn golden_backward_kernels() {
    let norm = gerbil_ir::RmsNorm {
        eps: 1e-5,
        weight_offset: 0.0,
        groups: 1,
    };
    golden(backward::cross_entropy(49_152, 512));
    golden(backward::cross_entropy_grad(49_152));
    golden(backward::unary_grad(UnaryOp::Silu, Rows::Fixed(2048), 1536));
    golden(backward::sum_rows(576));
    golden(backward::cache_rows(192));
    // One dispatch for an MLP projection; the LM head's in pieces of its depth.
    for kernel in backward::matmul_grad_x(1536, 576, DType::BF16, 512)
        .into_iter()
        .chain(backward::matmul_grad_x(49_152, 576, DType::BF16, 512))
    {
        golden(kernel);
    }
    // The LM head's weight gradient; a LoRA factor's, in pieces of the rows.
    for kernel in backward::matmul_grad_w(49_152, 576, 512)
        .into_iter()
        .chain(backward::matmul_grad_w(8, 576, 512))
    {
        golden(kernel);
    }
    // On tensor cores (`--precision mixed`): the input gradients of
    // SmolLM2's MLP and of the 1B shape's down projection, in pieces of
    // their depth (10 and 2);
    // the LM head's weight gradient, and a projection's in pieces of the
    // step's rows.
    for kernel in grad_coop::matmul_grad_x(1536, 576, DType::F32, 512)
        .into_iter()
        .chain(grad_coop::matmul_grad_x(2048, 8192, DType::BF16, 512))
        .chain(grad_coop::matmul_grad_w(49_152, 576, 512))
        .chain(grad_coop::matmul_grad_w(576, 576, 512))
    {
        golden(kernel);
    }
    for kernel in backward::rms_norm_grad(576, &norm, DType::BF16, 512) {
        golden(kernel);
    }
    let lookup = gerbil_ir::Embedding {
        scale: None,
        padding: Some(2),
    };
    golden(backward::embedding_grad(49_152, 576, &lookup));
    let attention = gerbil_ir::Attention {
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        scale: 0.125,
        window: None,
        causal: true,
    };
    // A pass of SmolLM2's batch of 4 sequences of 512, packed.
    for kernel in backward::attention_lse(&attention, 512, 512, 4) {
        golden(kernel);
    }
    for kernel in backward::attention_grad(&attention, 512, 512, 4) {
        golden(kernel);
    }
    golden(rope::backward(
        RopeSpec {
            heads: 9,
            head_dim: 64,
            rotary_dim: 64,
        },
        Positions::Packed,
    ));
}
