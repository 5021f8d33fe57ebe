//! The tensor-core GEMM (`gemm_coop`) on the CPU: CI's lavapipe has no
//! cooperative matrices, so these tests are what CI knows of the kernel.
//! Every specialization is validated by naga with the variant's capabilities,
//! which writes it to SPIR-V inside `catch_unwind` (naga 30's SPIR-V writer
//! panics on some cooperative-matrix code its validator accepts).

use gerbil_codegen_wgsl::kernels::{gemm_coop, matmul::MatMulSpec, KernelSource, Rows};
use gerbil_codegen_wgsl::validate_with;
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

#[test]
fn every_coop_specialization_validates_and_writes_spirv() {
    let failures: Vec<String> = specs()
        .into_iter()
        .filter_map(|s| to_spirv(&gemm_coop::kernel(s)).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn coop_kernels_bind_no_role_names_and_fit_the_desktop_workgroup_memory() {
    for s in specs() {
        let src = gemm_coop::kernel(s);
        for b in &src.bindings {
            assert!(
                !["A", "B", "C"].contains(&b.name.as_str()),
                "{}: binding `{}` clashes with a cooperative role",
                src.name,
                b.name
            );
        }
        let desktop = gerbil_codegen_wgsl::Target::desktop().limits;
        assert!(
            src.workgroup_bytes <= desktop.max_workgroup_storage,
            "{}: {} bytes of workgroup memory",
            src.name,
            src.workgroup_bytes
        );
    }
}

/// The SmolLM2 gate/up projection with its norm prologue, as WGSL.
#[test]
fn golden_coop_gate_up() {
    let src = gemm_coop::kernel(MatMulSpec {
        glu: Some(UnaryOp::Silu),
        norm: Some((1e-5, 0.0, DType::BF16)),
        ..spec(576, 1536, DType::BF16)
    });
    to_spirv(&src).unwrap_or_else(|e| panic!("{e}"));
    let header = format!(
        "// {} @workgroup_size({:?}) workgroups {:?}\n",
        src.name, src.workgroup_size, src.workgroups
    );
    insta::assert_snapshot!(src.name.clone(), header + &src.wgsl);
}
