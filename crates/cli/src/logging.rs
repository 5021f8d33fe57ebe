//! Log levels for `gerbilc` and `gerbil-run`: `-v`, `-vv`, `-vvv`, or a
//! `GERBIL_LOG` filter.
//!
//! Call [`init`] once at the start of `main` with the number of `-v` flags.
//! gerbil's own crates log at warn without a flag, info with `-v` (device,
//! variant, load times, compile phases) and debug with `-vv` (prefill
//! chunks, pipelines, the pipeline cache); other crates stay at warn until
//! `-vvv`, which shows wgpu's debug logs (adapters, instance, device) and
//! every other crate's info, and `-vvvv`, which shows everything at debug —
//! including naga's, tens of thousands of lines per load (wgpu logs nothing
//! at info on lavapipe, so `-vvv` asks for its debug). `GERBIL_LOG` (a `tracing` filter such as
//! `gerbil_runtime=debug,wgpu_hal=info`) replaces all of that.
//!
//! The surprise: `EnvFilter` matches targets by plain string prefix (not by
//! `::` segments), so the one directive `gerbil` covers every crate of the
//! workspace (`gerbil_runtime`, `gerbil_compiler`, …) and the binaries
//! (`gerbilc`, `gerbil_run`) — and nothing of wgpu's.

use std::io::{IsTerminal, Write};
use tracing_subscriber::EnvFilter;

/// The filter for `verbosity` `-v` flags (see the module documentation).
pub fn filter_for(verbosity: u8) -> String {
    match verbosity {
        0 => "warn".into(),
        1 => "warn,gerbil=info".into(),
        2 => "warn,gerbil=debug".into(),
        3 => "info,gerbil=debug,wgpu=debug,wgpu_core=debug,wgpu_hal=debug".into(),
        _ => "debug,gerbil=trace".into(),
    }
}

/// Installs the log subscriber: `GERBIL_LOG` when set, else
/// [`filter_for`]`(verbosity)`; lines go to standard error, around any
/// progress bars ([`crate::progress::suspend`]).
pub fn init(verbosity: u8) {
    let filter = match std::env::var("GERBIL_LOG") {
        Ok(f) if !f.is_empty() => EnvFilter::new(f),
        _ => EnvFilter::new(filter_for(verbosity)),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| BarSafeStderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Standard error, written with the progress bars lifted (tracing's
/// formatter writes each event in one call).
struct BarSafeStderr;

impl Write for BarSafeStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        crate::progress::suspend(|| std::io::stderr().write_all(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;
    use tracing_subscriber::layer::SubscriberExt;

    /// Whether an event of `target` at `level` passes `filter`.
    fn passes(filter: &str, target: &'static str, level: Level) -> bool {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let hit = Arc::new(AtomicBool::new(false));
        let seen = hit.clone();
        struct Flag(Arc<AtomicBool>);
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Flag {
            fn on_event(
                &self,
                _: &tracing::Event<'_>,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let subscriber = tracing_subscriber::registry()
            .with(EnvFilter::new(filter))
            .with(Flag(seen));
        tracing::subscriber::with_default(subscriber, || match (target, level) {
            ("gerbil_runtime::session", Level::DEBUG) => {
                tracing::debug!(target: "gerbil_runtime::session", "x")
            }
            ("gerbil_runtime::session", Level::INFO) => {
                tracing::info!(target: "gerbil_runtime::session", "x")
            }
            ("gerbil_run", Level::INFO) => tracing::info!(target: "gerbil_run", "x"),
            ("wgpu_hal::vulkan", Level::INFO) => tracing::info!(target: "wgpu_hal::vulkan", "x"),
            ("wgpu_core::device", Level::DEBUG) => {
                tracing::debug!(target: "wgpu_core::device", "x")
            }
            ("naga::front", Level::DEBUG) => tracing::debug!(target: "naga::front", "x"),
            other => panic!("no probe for {other:?}"),
        });
        hit.load(Ordering::SeqCst)
    }

    #[test]
    fn each_v_raises_gerbil_first_then_wgpu_then_naga() {
        let gerbil_info = |v| passes(&filter_for(v), "gerbil_runtime::session", Level::INFO);
        let gerbil_debug = |v| passes(&filter_for(v), "gerbil_runtime::session", Level::DEBUG);
        let wgpu_info = |v| passes(&filter_for(v), "wgpu_hal::vulkan", Level::INFO);
        assert!(!gerbil_info(0) && gerbil_info(1) && gerbil_info(2));
        assert!(!gerbil_debug(1) && gerbil_debug(2));
        assert!(passes(&filter_for(1), "gerbil_run", Level::INFO));
        assert!(!wgpu_info(2) && wgpu_info(3));
        assert!(!passes(&filter_for(2), "wgpu_core::device", Level::DEBUG));
        assert!(passes(&filter_for(3), "wgpu_core::device", Level::DEBUG));
        assert!(!passes(&filter_for(3), "naga::front", Level::DEBUG));
        assert!(passes(&filter_for(4), "naga::front", Level::DEBUG));
    }
}
