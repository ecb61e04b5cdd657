//! The simulated clock: `mako_rt::Clock` over the scheduler's time. Wall time is a
//! fixed epoch plus simulated time, so timestamps (mtime, ctime, generation seeds)
//! are a function of the seed; sleeping lets simulated time pass.

use crate::sched::Sim;
use mako_rt::Clock;
use std::time::Duration;

/// The wall time at simulated time zero: 2024-01-01T00:00:00Z.
pub const SIM_EPOCH: Duration = Duration::from_secs(1_704_067_200);

pub struct SimClock {
    sim: Sim,
}

impl SimClock {
    pub fn new(sim: &Sim) -> SimClock {
        SimClock { sim: sim.clone() }
    }
}

impl Clock for SimClock {
    fn wall(&self) -> Duration {
        SIM_EPOCH + self.monotonic()
    }
    fn monotonic(&self) -> Duration {
        // From a task, its scheduler's view; from the driver (before or after the
        // run), the simulation's.
        match mako_diag::sched::current() {
            Some(s) => s.now(),
            None => self.sim.now(),
        }
    }
    fn sleep(&self, duration: Duration) {
        mako_diag::sched::sleep(duration);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimConfig;
    use std::sync::Arc;

    #[test]
    fn wall_time_is_epoch_plus_simulated_time() {
        let sim = Sim::new(1, SimConfig::default());
        let clock = Arc::new(SimClock::new(&sim));
        assert_eq!(clock.wall(), SIM_EPOCH);
        let c = clock.clone();
        sim.spawn("sleeper", move || {
            c.sleep(Duration::from_millis(3));
            assert_eq!(c.monotonic(), Duration::from_millis(3));
        });
        sim.run().expect("run");
        assert_eq!(clock.wall(), SIM_EPOCH + Duration::from_millis(3));
    }
}
