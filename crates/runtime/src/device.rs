//! Opening a wgpu device that meets a plan's requirements.

use crate::error::RuntimeError;
use gerbil_plan::Requirements;

/// A wgpu device and queue with the adapter's description. Cloning shares
/// the device.
#[derive(Clone)]
pub struct Gpu {
    /// The device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// Adapter name, backend and type.
    pub adapter: wgpu::AdapterInfo,
    /// Limits the device was created with.
    pub limits: wgpu::Limits,
}

impl Gpu {
    /// Whether timestamp queries inside passes are enabled.
    pub fn has_timestamps(&self) -> bool {
        self.device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
    }
}

fn check(
    adapter: &str,
    limit: &'static str,
    needed: u64,
    available: u64,
) -> Result<(), RuntimeError> {
    if needed > available {
        return Err(RuntimeError::Limit {
            adapter: adapter.to_string(),
            limit,
            needed,
            available,
        });
    }
    Ok(())
}

/// Checks the plan's requirements against an adapter's limits.
pub fn check_limits(
    adapter: &str,
    have: &wgpu::Limits,
    need: &Requirements,
) -> Result<(), RuntimeError> {
    check(
        adapter,
        "max_storage_buffer_binding_size",
        need.max_storage_buffer_binding_size,
        have.max_storage_buffer_binding_size,
    )?;
    check(
        adapter,
        "max_buffer_size",
        need.max_buffer_size,
        have.max_buffer_size,
    )?;
    check(
        adapter,
        "max_storage_buffers_per_shader_stage",
        need.max_storage_buffers_per_shader_stage.into(),
        have.max_storage_buffers_per_shader_stage.into(),
    )?;
    check(
        adapter,
        "max_compute_workgroup_storage_size",
        need.max_compute_workgroup_storage_size.into(),
        have.max_compute_workgroup_storage_size.into(),
    )?;
    check(
        adapter,
        "max_compute_invocations_per_workgroup",
        need.max_compute_invocations_per_workgroup.into(),
        have.max_compute_invocations_per_workgroup.into(),
    )
}

impl Gpu {
    /// Opens the first high-performance adapter and a device with its full
    /// limits, after checking them against `need`.
    pub fn open(need: &Requirements) -> Result<Gpu, RuntimeError> {
        Gpu::open_with(need, false)
    }

    /// Like [`Gpu::open`]; with `timestamps`, also enables timestamp queries
    /// inside compute passes when the adapter has them (for profiling).
    ///
    /// One device per process (per `timestamps` setting) is opened and then
    /// shared by every later call: sessions of several plans live on one
    /// device, as they would in a server, and drivers that limit how many
    /// Vulkan instances or devices a process may create are never exhausted.
    pub fn open_with(need: &Requirements, timestamps: bool) -> Result<Gpu, RuntimeError> {
        static SHARED: std::sync::Mutex<Vec<(bool, Gpu)>> = std::sync::Mutex::new(Vec::new());
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, gpu)) = shared.iter().find(|(t, _)| *t == timestamps) {
            check_limits(&gpu.adapter.name, &gpu.limits, need)?;
            return Ok(gpu.clone());
        }
        let gpu = Gpu::create(need, timestamps)?;
        shared.push((timestamps, gpu.clone()));
        Ok(gpu)
    }

    fn create(need: &Requirements, timestamps: bool) -> Result<Gpu, RuntimeError> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            ..Default::default()
        }))
        .map_err(|_| RuntimeError::NoAdapter)?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        check_limits(&info.name, &limits, need)?;
        let ts = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let features = if timestamps && adapter.features().contains(ts) {
            ts
        } else {
            wgpu::Features::empty()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("gerbil"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| RuntimeError::Device(e.to_string()))?;
        device.on_uncaptured_error(std::sync::Arc::new(|e: wgpu::Error| {
            tracing::error!("uncaptured wgpu error: {e}");
        }));
        Ok(Gpu {
            device,
            queue,
            adapter: info,
            limits,
        })
    }

    /// Runs `f` inside out-of-memory and validation error scopes and turns a
    /// captured error into a [`RuntimeError`] that names `context`.
    pub fn scoped<T>(&self, context: &str, f: impl FnOnce() -> T) -> Result<T, RuntimeError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = f();
        let v = pollster::block_on(validation.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o {
            let _ = e;
            return Err(RuntimeError::OutOfMemory(context.to_string()));
        }
        if let Some(e) = v {
            return Err(RuntimeError::Validation {
                context: context.to_string(),
                message: e.to_string(),
            });
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_the_adapter_lacks_names_the_limit_and_both_values() {
        let have = wgpu::Limits::default();
        let need = Requirements {
            max_storage_buffer_binding_size: have.max_storage_buffer_binding_size + 4,
            ..Requirements::default()
        };
        let err = check_limits("test-gpu", &have, &need)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`test-gpu`"), "{err}");
        assert!(err.contains("max_storage_buffer_binding_size"), "{err}");
        assert!(
            err.contains(&(have.max_storage_buffer_binding_size + 4).to_string()),
            "{err}"
        );
        let need = Requirements {
            max_compute_workgroup_storage_size: have.max_compute_workgroup_storage_size + 1,
            ..Requirements::default()
        };
        let err = check_limits("test-gpu", &have, &need)
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_compute_workgroup_storage_size"), "{err}");
        assert!(check_limits("test-gpu", &have, &Requirements::default()).is_ok());
    }
}
