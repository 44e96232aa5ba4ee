//! The simulated disk is felix-storage's in-memory filesystem ([`MemFs`]): it performs the
//! engine's file ops at completion (the world draws their latency), so an op in flight at a
//! crash may be lost or, for an append, land torn. A crash draws what it loses from the
//! run's own `crash` stream, lent to [`MemFs::crash_drawn`] here.

pub(crate) use felix_storage::memfs::{DrawnCrash as CrashKind, MemFs};

use crate::rng::SimRng;

impl felix_storage::memfs::Dice for SimRng {
    fn below(&mut self, n: u64) -> u64 {
        SimRng::below(self, n)
    }

    fn chance(&mut self, p: f64) -> bool {
        SimRng::chance(self, p)
    }
}
