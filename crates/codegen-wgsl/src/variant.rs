//! Kernel variants: which sets of schedules codegen emits for a target.
//!
//! A variant is a name, the device features its kernels need, its
//! [`Precision`] and the knobs that select kernels in [`crate::lower`].
//! Codegen emits every variant the target's features allow, best first; the
//! runtime runs the first one the adapter supports and the user's
//! `--precision` accepts. All variants bind the same weight buffers, so a plan
//! stores its weights once however many variants it carries; an f16 variant
//! binds KV caches of its own (half the size), which the runtime allocates
//! only when it runs that variant.
//!
//! First, where the target allows it (`portable`), `cpu`: f32, every matmul
//! as [`matmul_cpu`](crate::kernels::matmul_cpu) (whole outputs per
//! thread, no barrier), every attention as
//! [`attention_cpu`](crate::kernels::attention_cpu) (a thread per query row
//! and head) and the next-token choice in 16-thread workgroups
//! ([`sample_token::Shape::CPU`](crate::kernels::sample_token::Shape)),
//! which only CPU adapters run ([`Feature::Cpu`]): on lavapipe it decodes
//! SmolLM2 3.1× and prefills it 5× as fast as `portable`, and on a GPU it
//! would be slow. Then five variants, f16 ones
//! first: `tensor-f16` (the schedules of
//! `subgroups-f16`, but prefill matmuls on tensor cores through cooperative
//! matrices, f16 operands and f32 sums), `subgroups-f16` and `portable-f16`
//! (KV cache in f16; they need `shader-f16`), then `subgroups` and
//! `portable` (f32 throughout). A plan with quantized weights also carries
//! `subgroups-f16-i8` right after `tensor-f16`: `subgroups-f16` whose decode
//! GEMVs dot the blocks with `x` rounded to int8
//! ([`gemv::Dots::Int8`](crate::kernels::gemv::Dots)), as `tensor-f16`'s
//! do in such a plan. It is the default f16 variant of a quantized plan on a
//! GPU without tensor cores (or with them turned off):
//! 1.3–1.4× faster decode than float dots on an H200 (Llama-3.2-1B shape,
//! q4_0), at a KL divergence of 0.003 from them on real text (SmolLM2
//! q4_0), a tenth of what q8_0 weights cost; `subgroups-f16` still decodes
//! with float dots (`--variant`). The `subgroups` ones reduce decode GEMVs with
//! `subgroupAdd` (any subgroup size); the `portable` ones need no optional
//! feature beyond their precision's, and `portable` none at all, so every
//! plan runs on every WebGPU adapter that meets its limits.
//!
//! The `tensor`, `subgroups` and int8 variants are [`VariantSpec::wide`]:
//! made for desktop GPUs, they bind each weight whole up to the target's
//! [`Target::wide_binding`] (2 GiB − 4 on `desktop` and the default
//! `universal`), while `portable`, `portable-f16` and `cpu` bind row shards
//! within the target's `max_storage_binding` (WebGPU's 128 MiB on
//! `universal`), so Gemma 3's 320 MiB embedding runs in f16 on an adapter
//! with 128 MiB bindings and unsharded on a desktop GPU, from one plan.

use crate::target::{Limits, Target};
use gerbil_plan::{Feature, Precision};

/// Workgroup memory of the `tensor-f16` variant's kernels: the adapters
/// with 16×16×16 f16 cooperative matrices offer at least 48 KiB (NVIDIA;
/// AMD and Intel 64), three times WebGPU's default, and the larger GEMM
/// blocks need it. The variant records it in its requirements, so an
/// adapter with less runs the next variant.
pub const TENSOR_WORKGROUP_STORAGE: u32 = 48 << 10;

/// One variant to emit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VariantSpec {
    /// Name recorded in the plan (`bench` prints it).
    pub name: &'static str,
    /// Features its kernels need.
    pub features: Vec<Feature>,
    /// What its kernels store in f16.
    pub precision: Precision,
    /// Matmul rows per workgroup in the prefill schedule.
    pub prefill_rows_per_workgroup: u32,
    /// Workgroup memory its kernels may use when its features promise more
    /// than the target's limit; `None`: the target's.
    pub workgroup_storage: Option<u32>,
    /// Decode GEMVs of quantized weights use integer dot products with
    /// int8 activations.
    pub int8_dots: bool,
    /// Made for desktop GPUs: binds each weight whole up to the target's
    /// [`Target::wide_binding`], where the others bind row shards of its
    /// `max_storage_binding` (the same bytes in the plan).
    pub wide: bool,
}

impl VariantSpec {
    /// Decode GEMVs reduce with subgroup operations.
    pub fn subgroups(precision: Precision, prefill_rows_per_workgroup: u32) -> Self {
        let (name, features) = match precision {
            Precision::F32 => ("subgroups", vec![Feature::Subgroups]),
            Precision::F16 => (
                "subgroups-f16",
                vec![Feature::ShaderF16, Feature::Subgroups],
            ),
        };
        VariantSpec {
            name,
            features,
            precision,
            prefill_rows_per_workgroup,
            workgroup_storage: None,
            int8_dots: false,
            wide: true,
        }
    }

    /// [`VariantSpec::subgroups`] at f16 with integer dot products in the
    /// decode GEMVs of quantized weights.
    pub fn subgroups_int8(prefill_rows_per_workgroup: u32) -> Self {
        VariantSpec {
            name: "subgroups-f16-i8",
            int8_dots: true,
            ..Self::subgroups(Precision::F16, prefill_rows_per_workgroup)
        }
    }

    /// Prefill matmuls on tensor cores (cooperative matrices), and a batch
    /// step's wide dense ones ([`crate::kernels::gemm_coop::CoopGemm::choose_batch`]), the rest as
    /// [`VariantSpec::subgroups`] at f16: rounding the matmul operands to
    /// f16 is an f16-precision choice, so no plan has an f32 tensor variant
    /// (a training step's, [`VariantSpec::training_mixed`], keeps f32
    /// activations around its matmuls).
    pub fn tensor(prefill_rows_per_workgroup: u32) -> Self {
        VariantSpec {
            name: "tensor-f16",
            features: vec![
                Feature::ShaderF16,
                Feature::Subgroups,
                Feature::CooperativeMatrix,
            ],
            precision: Precision::F16,
            prefill_rows_per_workgroup,
            workgroup_storage: Some(TENSOR_WORKGROUP_STORAGE),
            int8_dots: false,
            wide: true,
        }
    }

    /// No optional feature beyond what `precision` needs.
    pub fn portable(precision: Precision, prefill_rows_per_workgroup: u32) -> Self {
        let (name, features) = match precision {
            Precision::F32 => ("portable", Vec::new()),
            Precision::F16 => ("portable-f16", vec![Feature::ShaderF16]),
        };
        VariantSpec {
            name,
            features,
            precision,
            prefill_rows_per_workgroup,
            workgroup_storage: None,
            int8_dots: false,
            wide: false,
        }
    }
}

impl VariantSpec {
    /// The variant of a mixed-precision training step: [`VariantSpec::portable`]
    /// at f32 (activations, caches, norms, attention and the optimizer in f32)
    /// with every matmul on tensor cores, the forward ones as `tensor-f16`'s
    /// ([`crate::kernels::gemm_coop`]) and their gradients
    /// ([`crate::kernels::grad_coop`]): f16 operands, one of them in two parts,
    /// and f32 sums.
    pub fn training_mixed(prefill_rows_per_workgroup: u32) -> Self {
        VariantSpec {
            name: "tensor-mixed",
            features: vec![
                Feature::ShaderF16,
                Feature::Subgroups,
                Feature::CooperativeMatrix,
            ],
            workgroup_storage: Some(TENSOR_WORKGROUP_STORAGE),
            ..Self::portable(Precision::F32, prefill_rows_per_workgroup)
        }
    }

    /// For CPU adapters: [`VariantSpec::portable`] at f32 with every matmul
    /// and attention scheduled for SIMD lanes ([`crate::kernels::matmul_cpu`],
    /// [`crate::kernels::attention_cpu`]) and the next-token choice in small
    /// workgroups.
    pub fn cpu(prefill_rows_per_workgroup: u32) -> Self {
        VariantSpec {
            name: "cpu",
            features: vec![Feature::Cpu],
            ..Self::portable(Precision::F32, prefill_rows_per_workgroup)
        }
    }

    /// The limits its kernels must meet on `target`: the target's, with
    /// [`VariantSpec::workgroup_storage`] where it has one, and the
    /// target's [`Target::wide_binding`] for a [`VariantSpec::wide`] one.
    pub fn limits(&self, target: &Target) -> Limits {
        Limits {
            max_workgroup_storage: self
                .workgroup_storage
                .unwrap_or(target.limits.max_workgroup_storage),
            max_storage_binding: if self.wide {
                target.wide_binding
            } else {
                target.limits.max_storage_binding
            },
            ..target.limits.clone()
        }
    }
}

/// The variants to emit for `target`, best first: `cpu` where the target
/// allows it, then the GPU ones. A graph with `quantized`
/// weights gets `subgroups-f16-i8` right after `tensor-f16`, and the decode
/// GEMVs of `tensor-f16` dot in int8 too, so the f16 variant a desktop GPU
/// runs by default is an int8 one. The portable f32 variant is always last,
/// so every plan runs on every adapter that meets its limits.
pub fn variants_for(
    target: &Target,
    prefill_rows_per_workgroup: u32,
    quantized: bool,
) -> Vec<VariantSpec> {
    let rows = prefill_rows_per_workgroup;
    let tensor = VariantSpec {
        int8_dots: quantized,
        ..VariantSpec::tensor(rows)
    };
    let int8 = quantized.then(|| VariantSpec::subgroups_int8(rows));
    std::iter::once(VariantSpec::cpu(rows))
        .chain([tensor])
        .chain(int8)
        .chain([
            VariantSpec::subgroups(Precision::F16, rows),
            VariantSpec::portable(Precision::F16, rows),
            VariantSpec::subgroups(Precision::F32, rows),
            VariantSpec::portable(Precision::F32, rows),
        ])
        .filter(|v| v.features.iter().all(|f| target.has(*f)))
        .collect()
}
