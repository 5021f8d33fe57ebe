//! naga validation of every emitted module, with the capabilities of the
//! variant it belongs to (a portable kernel may not use `f16`).

use crate::CodegenError;
use gerbil_plan::Feature;

/// Parses and validates a WGSL module with naga; a failure names the kernel
/// and carries naga's report with the source location.
pub fn validate(name: &str, wgsl: &str) -> Result<(), CodegenError> {
    check(name, wgsl, naga::valid::Capabilities::default())
}

fn check(name: &str, wgsl: &str, caps: naga::valid::Capabilities) -> Result<(), CodegenError> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| CodegenError::Naga {
        kernel: name.to_string(),
        report: e.emit_to_string(wgsl),
    })?;
    let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
    validator
        .validate(&module)
        .map_err(|e| CodegenError::Naga {
            kernel: name.to_string(),
            report: e.emit_to_string(wgsl),
        })?;
    Ok(())
}

/// Like [`validate`], allowing what a variant's `features` enable.
pub fn validate_with(name: &str, wgsl: &str, features: &[Feature]) -> Result<(), CodegenError> {
    let mut caps = naga::valid::Capabilities::default();
    for f in features {
        caps |= match f {
            Feature::ShaderF16 => naga::valid::Capabilities::SHADER_FLOAT16,
            Feature::Subgroups => naga::valid::Capabilities::SUBGROUP,
            Feature::CooperativeMatrix => naga::valid::Capabilities::COOPERATIVE_MATRIX,
        };
    }
    check(name, wgsl, caps)
}
