//! What codegen compiles for: a [`Target`] is the device features kernels may
//! use and the limits they must respect.
//!
//! A target does not pick one kernel per op: codegen emits one *variant* of
//! the schedules per feature set worth using on the target (see
//! [`crate::variant`]), and the plan records what each variant needs. The
//! runtime then runs the best variant the adapter supports, so one plan serves
//! a browser without `shader-f16` and a desktop GPU with tensor cores. Limits
//! are the ones every variant must meet (WebGPU's defaults for `portable`).
//!
//! The surprise: one limit is not the same for every variant. The default
//! target, [`Target::universal`], keeps WebGPU's 128 MiB binding for what
//! variants share (activations, caches) and for its portable variants'
//! weights, which come in row shards; its desktop variants
//! ([`crate::variant::VariantSpec::wide`]) bind each weight whole, up to
//! [`Target::wide_binding`], and the plan stores the bytes once (the shards
//! are ranges of the whole weight's section).

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

/// Largest storage binding of a desktop GPU: 2 GiB − 4 (wgpu's ceiling).
const DESKTOP_BINDING: u64 = (2u64 << 30) - 4;

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
    /// Largest binding of a weight in the variants made for desktop GPUs
    /// ([`crate::variant::VariantSpec::wide`]): a weight up to this size is
    /// bound whole there, and in row shards of [`Limits::max_storage_binding`]
    /// in the others. At least `limits.max_storage_binding`.
    pub wide_binding: u64,
}

impl Target {
    /// WebGPU's defaults and no optional capability: runs on every
    /// adapter, lavapipe and browsers included; its feature
    /// [`Feature::Cpu`] adds the `cpu` variant, which CPU adapters run.
    pub fn portable() -> Self {
        let limits = Limits::webgpu_default();
        Target {
            name: "portable".into(),
            features: vec![Feature::Cpu],
            subgroups: None,
            wide_binding: limits.max_storage_binding,
            limits,
        }
    }

    /// Desktop GPUs: 2 GiB − 4 storage bindings; may use f16, subgroups and
    /// cooperative matrices (tensor cores).
    pub fn desktop() -> Self {
        let limits = Limits {
            max_storage_binding: DESKTOP_BINDING,
            ..Limits::webgpu_default()
        };
        Target {
            name: "desktop".into(),
            features: vec![
                Feature::ShaderF16,
                Feature::Subgroups,
                Feature::CooperativeMatrix,
            ],
            subgroups: Some(SubgroupSizes { min: 4, max: 128 }),
            wide_binding: limits.max_storage_binding,
            limits,
        }
    }

    /// Every adapter, each at its best (the default): the variants of
    /// [`Target::desktop`], whose weights bind whole up to 2 GiB − 4, and
    /// those of [`Target::portable`] (with `portable-f16`), within WebGPU's
    /// default limits, weights in row shards of 128 MiB.
    pub fn universal() -> Self {
        let desktop = Target::desktop();
        Target {
            name: "universal".into(),
            features: [Feature::Cpu].into_iter().chain(desktop.features).collect(),
            subgroups: desktop.subgroups,
            limits: Limits::webgpu_default(),
            wide_binding: DESKTOP_BINDING,
        }
    }

    /// The targets `--target` names.
    pub const NAMES: [&'static str; 3] = ["universal", "portable", "desktop"];

    /// The target called `name` (`universal`, `portable` or `desktop`).
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "universal" => Some(Target::universal()),
            "portable" => Some(Target::portable()),
            "desktop" => Some(Target::desktop()),
            _ => None,
        }
    }

    /// The target with no binding larger than `bytes` (`--max-storage-binding`):
    /// both its shared limit and its desktop variants' weights.
    pub fn with_max_binding(mut self, bytes: u64) -> Self {
        self.limits.max_storage_binding = bytes;
        self.wide_binding = bytes;
        self
    }

    /// Whether kernels for this target may use `f`.
    pub fn has(&self, f: Feature) -> bool {
        self.features.contains(&f)
    }
}
