//! Virtual time: a fixed `Instant` taken once per run plus an offset the simulation moves.
//! Nothing in a run reads the real clock after the base is taken, and only differences from
//! the base ever reach the trace, so the base's value does not matter.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub(crate) struct VirtualClock {
    base: Instant,
    offset: Duration,
}

impl VirtualClock {
    pub(crate) fn new() -> VirtualClock {
        VirtualClock {
            base: Instant::now(),
            offset: Duration::ZERO,
        }
    }

    pub(crate) fn now(&self) -> Instant {
        self.base + self.offset
    }

    /// Time since the run started.
    pub(crate) fn elapsed(&self) -> Duration {
        self.offset
    }

    pub(crate) fn at(&self, offset: Duration) -> Instant {
        self.base + offset
    }

    /// Moves time forward to `to`; never backwards.
    pub(crate) fn advance_to(&mut self, to: Instant) {
        let d = to.saturating_duration_since(self.base);
        if d > self.offset {
            self.offset = d;
        }
    }
}
