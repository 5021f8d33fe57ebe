//! The tensor-core GEMM (`gemm_coop`) on the CPU: CI's lavapipe has no
//! cooperative matrices, so these tests are what CI knows of the kernel.
//! Every tile and epilogue is validated by naga with the variant's capabilities,
//! which writes it to SPIR-V inside `catch_unwind` (naga 30's SPIR-V writer
//! panics on some cooperative-matrix code its validator accepts).

use gerbil_codegen_wgsl::kernels::gemm_coop::{self, CoopGemm, CoopTile};
use gerbil_codegen_wgsl::kernels::{matmul::MatMulSpec, KernelSource, Rows};
use gerbil_codegen_wgsl::validate_with;
use gerbil_codegen_wgsl::TENSOR_WORKGROUP_STORAGE;
use gerbil_ir::{DType, UnaryOp};
use gerbil_plan::Feature;

/// The features of the tensor-core variant.
const FEATURES: [Feature; 3] = [
    Feature::ShaderF16,
    Feature::Subgroups,
    Feature::CooperativeMatrix,
];

/// Validates `src` with the tensor-core variant's capabilities, which also
/// writes it to SPIR-V (`validate_with`); the error names the kernel.
pub fn to_spirv(src: &KernelSource) -> Result<(), String> {
    validate_with(&src.name, &src.wgsl, &FEATURES).map_err(|e| e.to_string())
}

fn spec(k: u32, n: u32, wdtype: DType) -> MatMulSpec {
    MatMulSpec {
        rows: Rows::Tokens,
        k,
        n,
        wdtype,
        bias: false,
        tt: 8,
        shard_rows: None,
        glu: None,
        norm: None,
        residual: false,
        last_row: false,
        act: None,
    }
}

/// Dtypes × K (multiples of the tile and not, odd) × N (odd, wide enough
/// for the 128-row blocks), with every epilogue and prologue, shards.
fn specs() -> Vec<MatMulSpec> {
    let mut out = Vec::new();
    let dtypes = [DType::BF16, DType::F16, DType::F32];
    for (i, (k, n)) in [
        (64, 64),
        (7, 5),
        (130, 37),
        (576, 960),
        (2048, 8192),
        (96, 4100),
    ]
    .into_iter()
    .enumerate()
    {
        for (d, wdtype) in dtypes.into_iter().enumerate() {
            let j = i + d;
            let base = spec(k, n, wdtype);
            out.push(base);
            out.push(MatMulSpec {
                bias: j % 2 == 0,
                norm: Some((1e-6, [0.0, 1.0][j % 2], dtypes[j % 3])),
                ..base
            });
            out.push(MatMulSpec {
                residual: true,
                bias: j % 2 == 1,
                ..base
            });
            out.push(MatMulSpec {
                act: Some([UnaryOp::Gelu, UnaryOp::Silu][j % 2]),
                bias: true,
                residual: j % 3 == 0,
                ..base
            });
            for act in [UnaryOp::Silu, UnaryOp::GeluTanh, UnaryOp::Softcap(30.0)] {
                out.push(MatMulSpec {
                    glu: Some(act),
                    bias: j % 2 == 1,
                    norm: (j % 3 != 0).then_some((1e-5, 0.0, DType::BF16)),
                    ..base
                });
            }
            out.push(MatMulSpec {
                shard_rows: Some(16),
                glu: (j % 2 == 0).then_some(UnaryOp::Silu),
                residual: j % 2 == 1,
                ..base
            });
        }
    }
    out
}

/// Every tile, unsplit and (where the K tiles allow) split in two, for up
/// to 100 rows (the batch tiles for up to `SHORT_PROMPT`: a short prompt's
/// step runs them).
fn gemms(s: &MatMulSpec) -> impl Iterator<Item = CoopGemm> {
    let k = s.k;
    let tiles = CoopTile::CANDIDATES.into_iter().map(|t| (t, 100));
    let short = gerbil_codegen_wgsl::SHORT_PROMPT;
    let batch = CoopTile::BATCH.into_iter().map(move |t| (t, short));
    tiles.chain(batch).flat_map(move |(tile, max_rows)| {
        let split = if k.div_ceil(tile.bk).is_multiple_of(2) {
            2
        } else {
            1
        };
        [1, split].map(|splits| CoopGemm {
            tile,
            splits,
            max_rows,
        })
    })
}

/// Batch steps take tensor cores where the batch tiles fill the GPU: every
/// matmul of the Llama-3.2-1B shape, of SmolLM2-135M's only the LM head,
/// whatever the plan's most rows.
#[test]
fn batch_steps_take_tensor_cores_only_for_wide_matmuls() {
    let choose = |n, k, glu| CoopGemm::choose_batch(n, k, glu, 16, TENSOR_WORKGROUP_STORAGE);
    // (n, k, gated): q/k/v, o, gate/up, down, the LM head.
    let tensor_cores = [
        (3072, 2048, false),
        (2048, 2048, false),
        (8192, 2048, true),
        (2048, 8192, false),
        (128_256, 2048, false),
        (49_152, 576, false),
    ];
    for (n, k, glu) in tensor_cores {
        let g = choose(n, k, glu).unwrap_or_else(|| panic!("{n}x{k}: no batch tile"));
        assert_eq!(g.tile.bm(), 16, "{n}x{k}: {g:?}");
        assert!(CoopTile::BATCH.contains(&g.tile), "{n}x{k}: {g:?}");
        assert!(
            k.div_ceil(g.tile.bk).is_multiple_of(g.splits),
            "{n}x{k}: {g:?}"
        );
    }
    for (n, k, glu) in [
        (960, 576, false),
        (576, 576, false),
        (1536, 576, true),
        (576, 1536, false),
    ] {
        assert_eq!(choose(n, k, glu), None, "{n}x{k}");
        let most = CoopGemm::choose_batch(n, k, glu, 64, TENSOR_WORKGROUP_STORAGE);
        assert_eq!(most, None, "{n}x{k}, 64 rows");
    }
}

/// Each spec with every third of the tiles and splits, in turn, so that
/// every tile meets every epilogue and prologue over the specs (each spec
/// with all of them, 2,304 kernels, took CI 38 s).
#[test]
fn every_coop_specialization_validates_and_writes_spirv() {
    let failures: Vec<String> = specs()
        .into_iter()
        .enumerate()
        .flat_map(|(i, s)| {
            gemms(&s)
                .enumerate()
                .filter(move |(j, _)| (i + j) % 3 == 0)
                .map(move |(_, g)| (s, g))
        })
        .filter_map(|(s, g)| to_spirv(&gemm_coop::kernel(s, g)).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Besides the names and the size: every workgroup variable is an array of
/// a multiple of 16 bytes. With a lone `u32` among them, NVIDIA's driver
/// (580) put every `coopStoreT` into workgroup memory one element early.
#[test]
fn coop_kernels_bind_no_role_names_and_fit_the_tensor_workgroup_memory() {
    let specs = specs()
        .into_iter()
        .flat_map(|s| gemms(&s).map(move |g| (s, g)));
    for (s, g) in specs {
        let tile = g.tile;
        let src = gemm_coop::kernel(s, g);
        for b in &src.bindings {
            assert!(
                !["A", "B", "C"].contains(&b.name.as_str()),
                "{}: binding `{}` clashes with a cooperative role",
                src.name,
                b.name
            );
        }
        assert!(
            src.workgroup_bytes <= tile.workgroup_bytes()
                && tile.workgroup_bytes() <= TENSOR_WORKGROUP_STORAGE,
            "{}: {} bytes of workgroup memory",
            src.name,
            src.workgroup_bytes
        );
        for decl in src
            .wgsl
            .lines()
            .filter_map(|l| l.strip_prefix("var<workgroup> "))
        {
            let elems = decl
                .strip_suffix(">;")
                .and_then(|d| d.split_once(": array<"))
                .and_then(|(_, ty)| ty.split_once(", "));
            let bytes = match elems {
                Some(("f16", n)) => 2 * n.parse::<u32>().unwrap(),
                Some(("f32" | "u32", n)) => 4 * n.parse::<u32>().unwrap(),
                _ => 0,
            };
            assert!(
                bytes > 0 && bytes.is_multiple_of(16),
                "{}: workgroup variable `{decl}` is not an array of 16-byte multiples",
                src.name
            );
        }
    }
}

/// The SmolLM2 gate/up projection with its norm prologue, as WGSL.
#[test]
fn golden_coop_gate_up() {
    let gemm = CoopGemm::choose(1536, 576, true, 1024, TENSOR_WORKGROUP_STORAGE);
    let src = gemm_coop::kernel(
        MatMulSpec {
            glu: Some(UnaryOp::Silu),
            norm: Some((1e-5, 0.0, DType::BF16)),
            ..spec(576, 1536, DType::BF16)
        },
        gemm,
    );
    to_spirv(&src).unwrap_or_else(|e| panic!("{e}"));
    let header = format!(
        "// {} @workgroup_size({:?}) workgroups {:?}\n",
        src.name, src.workgroup_size, src.workgroups
    );
    insta::assert_snapshot!(src.name.clone(), header + &src.wgsl);
}
