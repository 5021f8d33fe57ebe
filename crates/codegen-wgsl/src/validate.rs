//! naga validation of every emitted module, with the capabilities of the
//! variant it belongs to (a portable kernel may not use `f16`).
//!
//! A kernel of a variant with cooperative matrices is also written to
//! SPIR-V 1.3, as wgpu's Vulkan backend will write it: naga 30's SPIR-V
//! writer panics on some cooperative-matrix code its validator accepts, and
//! CI's lavapipe cannot run these kernels, so the writer runs here, inside
//! `catch_unwind`, and a panic becomes a compile error naming the kernel
//! instead of a crash when a GPU with tensor cores loads the plan.

use crate::CodegenError;
use gerbil_plan::Feature;

/// Parses and validates a WGSL module with naga; a failure names the kernel
/// and carries naga's report with the source location.
pub fn validate(name: &str, wgsl: &str) -> Result<(), CodegenError> {
    check(name, wgsl, naga::valid::Capabilities::default())
}

fn check(name: &str, wgsl: &str, caps: naga::valid::Capabilities) -> Result<(), CodegenError> {
    let naga_error = |report: String| CodegenError::Naga {
        kernel: name.to_string(),
        report,
    };
    let module =
        naga::front::wgsl::parse_str(wgsl).map_err(|e| naga_error(e.emit_to_string(wgsl)))?;
    let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
    let info = validator
        .validate(&module)
        .map_err(|e| naga_error(e.emit_to_string(wgsl)))?;
    if caps.contains(naga::valid::Capabilities::COOPERATIVE_MATRIX) {
        write_spirv(&module, &info).map_err(naga_error)?;
    }
    Ok(())
}

/// Writes `module` to SPIR-V 1.3; a writer error or panic is its message.
fn write_spirv(module: &naga::Module, info: &naga::valid::ModuleInfo) -> Result<(), String> {
    let options = naga::back::spv::Options {
        lang_version: (1, 3),
        ..Default::default()
    };
    let written =
        std::panic::catch_unwind(|| naga::back::spv::write_vec(module, info, &options, None))
            .map_err(|p| {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                format!("naga's SPIR-V writer panicked: {msg}")
            })?;
    written.map(|_| ()).map_err(|e| format!("SPIR-V: {e}"))
}

/// Like [`validate`], allowing what a variant's `features` enable.
pub fn validate_with(name: &str, wgsl: &str, features: &[Feature]) -> Result<(), CodegenError> {
    check(name, wgsl, capabilities(features))
}

/// The shader capabilities `features` enable (`cpu` none: it says which
/// adapters run a variant, not what its shaders may use).
pub fn capabilities(features: &[Feature]) -> naga::valid::Capabilities {
    let mut caps = naga::valid::Capabilities::default();
    for f in features {
        caps |= match f {
            Feature::ShaderF16 => naga::valid::Capabilities::SHADER_FLOAT16,
            Feature::Subgroups => naga::valid::Capabilities::SUBGROUP,
            Feature::CooperativeMatrix => naga::valid::Capabilities::COOPERATIVE_MATRIX,
            Feature::Cpu => naga::valid::Capabilities::empty(),
        };
    }
    caps
}
