//! Wall time on every platform the runtime runs on: std's `Instant::now`
//! panics on `wasm32-unknown-unknown`, so a [`Clock`] reads the `web-time`
//! crate's instant, which is std's natively and `performance.now()` in a
//! browser (the page, its worker, Deno).

use std::time::Duration;

/// A started clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: web_time::Instant,
}

impl Clock {
    /// Starts a clock now.
    pub fn start() -> Clock {
        Clock {
            start: web_time::Instant::now(),
        }
    }

    /// Time since [`Clock::start`].
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}
