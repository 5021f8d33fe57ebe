//! naga validation of every emitted module.

use crate::CodegenError;

/// Parses and validates a WGSL module with naga; a failure names the kernel
/// and carries naga's report with the source location.
pub fn validate(name: &str, wgsl: &str) -> Result<(), CodegenError> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| CodegenError::Naga {
        kernel: name.to_string(),
        report: e.emit_to_string(wgsl),
    })?;
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::default(),
    );
    validator
        .validate(&module)
        .map_err(|e| CodegenError::Naga {
            kernel: name.to_string(),
            report: e.emit_to_string(wgsl),
        })?;
    Ok(())
}
