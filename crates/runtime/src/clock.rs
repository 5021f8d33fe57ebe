//! Wall time where the platform has a clock: std has none on
//! `wasm32-unknown-unknown` (`Instant::now` panics there), where every
//! [`Clock`] reads zero, so timing code runs unchanged in a browser.

use std::time::Duration;

/// A started clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    #[cfg(not(target_arch = "wasm32"))]
    start: std::time::Instant,
}

impl Clock {
    /// Starts a clock now.
    pub fn start() -> Clock {
        Clock {
            #[cfg(not(target_arch = "wasm32"))]
            start: std::time::Instant::now(),
        }
    }

    /// Time since [`Clock::start`] (zero in a browser).
    pub fn elapsed(&self) -> Duration {
        #[cfg(not(target_arch = "wasm32"))]
        return self.start.elapsed();
        #[cfg(target_arch = "wasm32")]
        Duration::ZERO
    }
}
