//! What codegen compiles for: a [`Target`] is the device features kernels may
//! use and the limits they must respect.
//!
//! A target does not pick one kernel per op: codegen emits one *variant* of
//! the schedules per feature set worth using on the target (see
//! [`crate::variant`]), and the plan records what each variant needs. The
//! runtime then runs the best variant the adapter supports, so one plan serves
//! a browser without `shader-f16` and a desktop GPU with tensor cores. Limits
//! are the ones every variant must meet (WebGPU's defaults for `portable`).

use gerbil_plan::Feature;

/// Device limits codegen respects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest storage binding (weights above it are split into row shards).
    pub max_storage_binding: u64,
    /// Workgroup memory per kernel, in bytes.
    pub max_workgroup_storage: u32,
    /// Invocations per workgroup.
    pub max_invocations: u32,
    /// Workgroups per dispatch along one axis.
    pub max_workgroups_per_dim: u32,
    /// Alignment of binding offsets (`minStorageBufferOffsetAlignment`).
    pub binding_align: u64,
}

impl Limits {
    /// WebGPU's default limits: what every adapter offers.
    pub fn webgpu_default() -> Self {
        Limits {
            max_storage_binding: 128 << 20,
            max_workgroup_storage: 16 << 10,
            max_invocations: 256,
            max_workgroups_per_dim: 65_535,
            binding_align: 256,
        }
    }
}

/// Subgroup sizes a target's adapters may run with (the kernel must work for
/// any size in the range; no fixed size is assumed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubgroupSizes {
    /// Smallest subgroup size.
    pub min: u32,
    /// Largest subgroup size.
    pub max: u32,
}

/// A compilation target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Name, e.g. `portable`.
    pub name: String,
    /// Features kernels may use, in variants that record them.
    pub features: Vec<Feature>,
    /// Subgroup sizes, when `features` has [`Feature::Subgroups`].
    pub subgroups: Option<SubgroupSizes>,
    /// Limits every variant respects.
    pub limits: Limits,
}

impl Target {
    /// WebGPU's defaults and no optional capability: runs on every
    /// adapter, lavapipe and browsers included; its feature
    /// [`Feature::Cpu`] adds the `cpu` variant, which CPU adapters run.
    pub fn portable() -> Self {
        Target {
            name: "portable".into(),
            features: vec![Feature::Cpu],
            subgroups: None,
            limits: Limits::webgpu_default(),
        }
    }

    /// Desktop GPUs: 2 GiB − 4 storage bindings; may use f16, subgroups and
    /// cooperative matrices (tensor cores).
    pub fn desktop() -> Self {
        Target {
            name: "desktop".into(),
            features: vec![
                Feature::ShaderF16,
                Feature::Subgroups,
                Feature::CooperativeMatrix,
            ],
            subgroups: Some(SubgroupSizes { min: 4, max: 128 }),
            limits: Limits {
                max_storage_binding: (2u64 << 30) - 4,
                ..Limits::webgpu_default()
            },
        }
    }

    /// The targets `--target` names.
    pub const NAMES: [&'static str; 2] = ["portable", "desktop"];

    /// The target called `name` (`portable` or `desktop`).
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "portable" => Some(Target::portable()),
            "desktop" => Some(Target::desktop()),
            _ => None,
        }
    }

    /// Whether kernels for this target may use `f`.
    pub fn has(&self, f: Feature) -> bool {
        self.features.contains(&f)
    }
}
