//! The loop's clock: the wall clock, or a replay's virtual one. The
//! simulator is a backend that is also a clock; the loop itself knows
//! nothing of simulations.

use std::time::Instant;

/// Seconds since the Unix epoch.
pub(crate) fn now_unix() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Where the loop reads the time.
pub(crate) trait Clock: Send + Sync {
    /// Seconds since the sweep started.
    fn now(&self) -> f64;

    /// Unix time now.
    fn unix_now(&self) -> f64;

    /// Whether time passes only when the loop waits ([`Clock::idle`]): a
    /// timer on the wall clock would never fire in it.
    fn is_virtual(&self) -> bool {
        false
    }

    /// Called when the loop has acted on every event so far and is about to
    /// wait for the next: a virtual clock moves to its next event here.
    fn idle(&self) {}
}

/// The wall clock, from the sweep's start.
pub(crate) struct WallClock {
    origin: Instant,
}

impl WallClock {
    pub(crate) fn new() -> Self {
        Self { origin: Instant::now() }
    }
}

impl Clock for WallClock {
    fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    fn unix_now(&self) -> f64 {
        now_unix()
    }
}
