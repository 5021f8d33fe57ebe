//! Kernel variants: which sets of schedules codegen emits for a target.
//!
//! A variant is a name, the device features its kernels need, and the knobs
//! that select kernels in [`crate::lower`]. Codegen emits every variant the
//! target's features allow, best first; the runtime runs the first one the
//! adapter supports. All variants bind the same weight buffers, so a plan
//! stores its weights once however many variants it carries.
//!
//! Two variants today, both f32 arithmetic: `subgroups` (decode GEMVs reduce
//! with `subgroupAdd`, any subgroup size) for targets with the `subgroups`
//! feature, then `portable` (no optional feature, the kernels every WebGPU
//! adapter runs), which the runtime falls back to on an adapter without
//! subgroups. Variants that use `shader-f16` or cooperative matrices are
//! added here, before `portable`, each gated on
//! [`Target::has`](crate::Target::has).

use crate::target::Target;
use gerbil_plan::Feature;

/// One variant to emit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VariantSpec {
    /// Name recorded in the plan (`bench` prints it).
    pub name: &'static str,
    /// Features its kernels need.
    pub features: Vec<Feature>,
    /// Matmul rows per workgroup in the prefill schedule.
    pub prefill_rows_per_workgroup: u32,
}

impl VariantSpec {
    /// f32 compute; decode GEMVs reduce with subgroup operations.
    pub fn subgroups(prefill_rows_per_workgroup: u32) -> Self {
        VariantSpec {
            name: "subgroups",
            features: vec![Feature::Subgroups],
            prefill_rows_per_workgroup,
        }
    }

    /// f32 compute, no optional feature.
    pub fn portable(prefill_rows_per_workgroup: u32) -> Self {
        VariantSpec {
            name: "portable",
            features: Vec::new(),
            prefill_rows_per_workgroup,
        }
    }
}

/// The variants to emit for `target`, best first. The portable variant is
/// always last, so every plan runs on every adapter that meets its limits.
pub fn variants_for(target: &Target, prefill_rows_per_workgroup: u32) -> Vec<VariantSpec> {
    [
        VariantSpec::subgroups(prefill_rows_per_workgroup),
        VariantSpec::portable(prefill_rows_per_workgroup),
    ]
    .into_iter()
    .filter(|v| v.features.iter().all(|f| target.has(*f)))
    .collect()
}
