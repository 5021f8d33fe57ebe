//! `gerbil-run devices`: the GPU adapters wgpu finds, as a table or JSON.
//!
//! [`devices`] lists what `gerbil_runtime::Gpu::adapters` reports; the
//! index it prints is the one `gerbil-run --device N` takes, and the
//! adapter marked `*` is the one used without `--device`. The features are
//! those plan variants depend on: shader-f16 (f16 variants), subgroups,
//! cooperative matrices (the `tensor-f16` variant, requested unless
//! `--no-tensor-cores` or `GERBIL_TENSOR_CORES=0`) and timestamp queries
//! (`bench --profile`).

use gerbil_runtime::AdapterSummary;
use std::fmt::Write;

/// Lists the adapters: one JSON array (`json`) or a table. No adapter at
/// all is an error naming how to get one.
pub async fn devices(json: bool) -> anyhow::Result<String> {
    let adapters = gerbil_runtime::Gpu::adapters().await;
    if adapters.is_empty() {
        return Err(gerbil_runtime::RuntimeError::NoAdapter.into());
    }
    if json {
        return Ok(serde_json::to_string(&adapters)? + "\n");
    }
    Ok(render(&adapters))
}

/// The table `gerbil-run devices` prints.
pub fn render(adapters: &[AdapterSummary]) -> String {
    let mut out = String::new();
    for a in adapters {
        let mark = if a.default { '*' } else { ' ' };
        let _ = writeln!(out, "{mark}{:>2}  {}", a.index, a.name);
        let driver = [a.driver.as_str(), a.driver_info.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        let _ = writeln!(
            out,
            "     backend {}, {} device, driver {}",
            a.backend,
            a.device_type,
            if driver.is_empty() {
                "unknown"
            } else {
                &driver
            }
        );
        let yes = |b: bool| if b { "yes" } else { "no" };
        let subgroups = if a.subgroups {
            format!("yes ({}-{})", a.subgroup_sizes[0], a.subgroup_sizes[1])
        } else {
            "no".into()
        };
        let _ = writeln!(
            out,
            "     shader-f16 {}, subgroups {subgroups}, cooperative matrix {}, timestamp queries {}",
            yes(a.shader_f16),
            yes(a.cooperative_matrix),
            yes(a.timestamp_queries)
        );
        let _ = writeln!(
            out,
            "     max storage binding {}, max buffer {}",
            size(a.max_storage_binding),
            size(a.max_buffer_size)
        );
    }
    out.push_str("* the default; `gerbil-run --device N` picks another\n");
    out
}

/// Bytes in binary units (`2 GiB`, `128 MiB`).
fn size(bytes: u64) -> String {
    let mut value = bytes as f64;
    for unit in ["B", "KiB", "MiB", "GiB", "TiB"] {
        if value < 1024.0 {
            return format!("{} {unit}", (value * 10.0).round() / 10.0);
        }
        value /= 1024.0;
    }
    format!("{} PiB", (value * 10.0).round() / 10.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_marks_the_default_and_names_every_feature() {
        let a = AdapterSummary {
            index: 1,
            name: "Test GPU".into(),
            backend: "vulkan".into(),
            device_type: "discrete".into(),
            driver: "testdrv".into(),
            driver_info: "1.2".into(),
            shader_f16: true,
            subgroups: true,
            subgroup_sizes: [32, 64],
            cooperative_matrix: false,
            timestamp_queries: true,
            max_storage_binding: 2 << 30,
            max_buffer_size: (1 << 40) + (1 << 39),
            default: true,
        };
        let t = render(&[a]);
        assert!(t.starts_with("* 1  Test GPU\n"), "{t}");
        assert!(
            t.contains("backend vulkan, discrete device, driver testdrv 1.2"),
            "{t}"
        );
        assert!(t.contains("shader-f16 yes, subgroups yes (32-64), cooperative matrix no, timestamp queries yes"), "{t}");
        assert!(
            t.contains("max storage binding 2 GiB, max buffer 1.5 TiB"),
            "{t}"
        );
    }
}
