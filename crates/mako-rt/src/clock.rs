//! Time as the core sees it: the wall clock for file timestamps, a monotonic clock for
//! intervals, and sleeping. The daemon uses the system's; the simulation its own.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync {
    /// Time since the Unix epoch, for timestamps users see (mtime, ctime, ...).
    fn wall(&self) -> Duration;
    /// Time since an arbitrary fixed start, for intervals (sync interval, deadlines).
    fn monotonic(&self) -> Duration;
    /// Wait `duration` (real or simulated).
    fn sleep(&self, duration: Duration);
}

/// The host's clocks.
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    pub fn new() -> SystemClock {
        SystemClock {
            start: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn wall(&self) -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }
    fn monotonic(&self) -> Duration {
        self.start.elapsed()
    }
    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_moves_forward() {
        let c = SystemClock::new();
        let a = c.monotonic();
        c.sleep(Duration::from_millis(1));
        assert!(c.monotonic() > a);
        assert!(c.wall() > Duration::from_secs(1_600_000_000));
    }
}
