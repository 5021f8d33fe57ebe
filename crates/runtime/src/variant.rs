//! Choosing which of a plan's variants runs on this device.
//!
//! A plan lists its variants best first, each with the device features and
//! limits its kernels need. [`pick`] takes the first one the device meets, so
//! the same plan runs its tensor-core kernels on a GPU that has them, its
//! portable kernels in a browser and its `cpu` ones on a CPU adapter (a
//! GPU passes over those). When none fits, the error says, variant by
//! variant, what was missing.

use crate::device::{check_limits, Gpu};
use crate::error::RuntimeError;
use gerbil_plan::{BufferKind, Feature, PlanHeader, Precision, Variant};
use std::collections::HashSet;

/// The plan features this device has enabled, and [`Feature::Cpu`] where
/// the adapter is a CPU (a browser's fallback adapter counts as one).
/// Cooperative matrices count
/// only where the device opted into them, which it does when
/// [`DeviceOptions::tensor_cores`](crate::device::DeviceOptions::tensor_cores)
/// asks (the default) and the adapter offers the 16×16×16 f16 → f32
/// configuration (`device.rs`).
pub fn device_features(gpu: &Gpu) -> Vec<Feature> {
    let have = gpu.device.features();
    [
        (Feature::ShaderF16, wgpu::Features::SHADER_F16),
        (Feature::Subgroups, wgpu::Features::SUBGROUP),
        (
            Feature::CooperativeMatrix,
            wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
        ),
    ]
    .into_iter()
    .filter(|(_, w)| have.contains(*w))
    .map(|(f, _)| f)
    .chain((gpu.adapter.device_type == wgpu::DeviceType::Cpu).then_some(Feature::Cpu))
    .collect()
}

/// Why `variant` cannot run on a device with `features` and `gpu`'s limits.
fn refusal(variant: &Variant, features: &[Feature], gpu: &Gpu) -> Option<String> {
    let missing: Vec<&str> = variant
        .features
        .iter()
        .filter(|f| !features.contains(f))
        .map(|f| f.name())
        .collect();
    if !missing.is_empty() {
        // A GPU with tensor cores still lacks the feature when they were
        // turned off.
        let hint = if variant.features.contains(&Feature::CooperativeMatrix)
            && !features.contains(&Feature::CooperativeMatrix)
        {
            " (tensor cores in the 16x16x16 f16 -> f32 configuration: this adapter has none, \
             or they were turned off with `--no-tensor-cores` or GERBIL_TENSOR_CORES=0)"
        } else {
            match variant.precision {
                Precision::F16 => " (`--precision f32` runs without it)",
                Precision::F32 => "",
            }
        };
        return Some(format!("needs {}{hint}", missing.join(", ")));
    }
    match check_limits(&gpu.adapter.name, &gpu.limits, &variant.requirements) {
        Ok(()) => None,
        Err(RuntimeError::Limit {
            limit,
            needed,
            available,
            ..
        }) => Some(format!(
            "needs {limit} of {needed}, the device's is {available}"
        )),
        Err(other) => Some(other.to_string()),
    }
}

/// Which numerics a session runs (`--precision`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrecisionChoice {
    /// The best variant the device runs: f16 where it has `shader-f16` and
    /// the plan an f16 variant, else f32.
    #[default]
    Auto,
    /// Only variants of this precision.
    Only(Precision),
}

impl std::str::FromStr for PrecisionChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(PrecisionChoice::Auto),
            "f32" => Ok(PrecisionChoice::Only(Precision::F32)),
            "f16" => Ok(PrecisionChoice::Only(Precision::F16)),
            _ => Err(format!(
                "unknown precision `{s}`; expected auto, f32 or f16"
            )),
        }
    }
}

impl PrecisionChoice {
    fn accepts(self, p: Precision) -> bool {
        match self {
            PrecisionChoice::Auto => true,
            PrecisionChoice::Only(want) => want == p,
        }
    }
}

/// The best variant of `header` that `gpu` can run at `precision`, or the
/// variant called `name` when one is given (`--variant`: to compare
/// variants on one device, e.g. a tensor-core prefill with a portable one,
/// or the `cpu` variant on a GPU). Only a CPU adapter runs a `cpu` variant
/// unasked, and a tensor-core variant runs unasked only if its GEMMs split
/// `x` ([`Variant::split_x`]: plans from before rounded it).
pub fn pick<'h>(
    header: &'h PlanHeader,
    gpu: &Gpu,
    precision: PrecisionChoice,
    name: Option<&str>,
) -> Result<&'h Variant, RuntimeError> {
    if let Some(name) = name {
        if !header.variants.iter().any(|v| v.name == name) {
            return Err(RuntimeError::UnknownVariant {
                name: name.to_string(),
                available: header
                    .variants
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    let mut features = device_features(gpu);
    let cpu_adapter = features.contains(&Feature::Cpu);
    // `cpu` is a schedule, not a capability: a variant named on purpose runs
    // on any adapter (to compare it), and otherwise a GPU passes over it
    // without counting it among the refusals.
    if name.is_some() && !cpu_adapter {
        features.push(Feature::Cpu);
    }
    let mut reasons = Vec::new();
    for v in header
        .variants
        .iter()
        .filter(|v| name.is_none_or(|n| n == v.name))
        .filter(|v| name.is_some() || cpu_adapter || !v.features.contains(&Feature::Cpu))
    {
        if !precision.accepts(v.precision) {
            if name.is_some() {
                reasons.push(format!(
                    "`{}` is {}, not the {} --precision asks for",
                    v.name,
                    v.precision.name(),
                    if v.precision == Precision::F16 {
                        "f32"
                    } else {
                        "f16"
                    }
                ));
            }
            continue;
        }
        if name.is_none() && v.features.contains(&Feature::CooperativeMatrix) && !v.split_x {
            reasons.push(format!(
                "`{}` comes from an older gerbil whose tensor-core GEMMs rounded x to f16 (6.2e-2 \
                 from transformers on the Llama-3.2-1B shape): recompile the plan, or name it \
                 (--variant {})",
                v.name, v.name
            ));
            continue;
        }
        match refusal(v, &features, gpu) {
            None => {
                tracing::info!(
                    "running variant `{}` ({}) on {} ({:?})",
                    v.name,
                    v.precision.name(),
                    gpu.adapter.name,
                    gpu.adapter.backend
                );
                return Ok(v);
            }
            Some(why) => reasons.push(format!("`{}` {why}", v.name)),
        }
    }
    if let (PrecisionChoice::Only(p), true) = (precision, reasons.is_empty()) {
        return Err(RuntimeError::NoPrecision {
            precision: p.name(),
            target: header.compile.target.clone(),
        });
    }
    Err(RuntimeError::NoVariant {
        adapter: gpu.adapter.name.clone(),
        reasons: reasons.join("; "),
    })
}

/// The prefill fallback of a session running `chosen` on `gpu` with the
/// buffers `used` ([`crate::PrefillFallback`]): the first variant after
/// `chosen` in the plan's order that the device runs unasked (as [`pick`]
/// would), of the same precision, without cooperative matrices, whose
/// prefill binds only buffers in `used` and writes exactly the KV caches and
/// outputs `chosen`'s prefill writes — so it reads the same weights and
/// leaves the same state for `chosen`'s decode (a plan's variants of one
/// precision share a KV cache declaration only where they lay it out
/// alike: docs/plan-format.md).
pub(crate) fn fallback<'h>(
    header: &'h PlanHeader,
    gpu: &Gpu,
    chosen: &Variant,
    used: &HashSet<u32>,
) -> Option<&'h Variant> {
    let features = device_features(gpu);
    let cpu_adapter = features.contains(&Feature::Cpu);
    // The KV caches and outputs a prefill schedule binds.
    let state = |v: &Variant| -> HashSet<u32> {
        let bound = v.prefill.iter().flat_map(|d| &d.bindings);
        bound
            .map(|b| b.buffer)
            .filter(|&b| {
                header.buffers.get(b as usize).is_some_and(|d| {
                    matches!(
                        d.kind,
                        BufferKind::KvCache { .. } | BufferKind::Output { .. }
                    )
                })
            })
            .collect()
    };
    let kept = state(chosen);
    header
        .variants
        .iter()
        .skip_while(|v| v.name != chosen.name)
        .skip(1)
        .filter(|v| v.precision == chosen.precision)
        .filter(|v| !v.features.contains(&Feature::CooperativeMatrix))
        .filter(|v| cpu_adapter || !v.features.contains(&Feature::Cpu))
        .filter(|v| {
            let mut bound = v.prefill.iter().flat_map(|d| &d.bindings);
            bound.all(|b| used.contains(&b.buffer)) && state(v) == kept
        })
        .find(|v| refusal(v, &features, gpu).is_none())
}
