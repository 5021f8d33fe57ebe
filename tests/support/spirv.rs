//! WGSL to SPIR-V with naga, as wgpu's Vulkan backend does it, for kernels
//! CI cannot run: the tensor-core (cooperative-matrix) ones, which lavapipe
//! lacks. The surprise: naga 30's SPIR-V writer can panic on cooperative-
//! matrix code its validator accepts, so the writer runs inside
//! `catch_unwind` and a panic becomes an error naming the kernel.

/// Parses and validates `wgsl` with every capability and writes SPIR-V 1.3;
/// any failure, a writer panic included, is an error naming `name`.
pub fn to_spirv(name: &str, wgsl: &str) -> Result<Vec<u32>, String> {
    let source = wgsl.to_string();
    std::panic::catch_unwind(move || {
        let module =
            naga::front::wgsl::parse_str(&source).map_err(|e| e.emit_to_string(&source))?;
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .map_err(|e| e.emit_to_string(&source))?;
        let options = naga::back::spv::Options {
            lang_version: (1, 3),
            ..Default::default()
        };
        naga::back::spv::write_vec(&module, &info, &options, None).map_err(|e| e.to_string())
    })
    .map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{name}: naga's SPIR-V writer panicked: {msg}")
    })?
    .map_err(|e| format!("{name}: {e}"))
}
