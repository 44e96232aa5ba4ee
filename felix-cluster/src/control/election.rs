//! Elections that follow the node's seed.
//!
//! raft-rs draws each randomized election timeout from `rand::thread_rng()` whenever it resets
//! its election timer (on every term or role change, and when a follower hears its leader).
//! That draw is the one input the engine's seed does not control, so a simulated run would not
//! repeat. Every reset leaves `election_elapsed` at zero, so after each call into raft the
//! driver overwrites the timeout with a draw from the seeded generator whenever it sees zero.
//! raft-rs only compares the timeout on `tick`, and no tick happens between a reset and the
//! overwrite, so raft-rs's own draw never decides anything.

use raft::RawNode;

use super::store::MetaStore;

/// A small seeded generator (SplitMix64): reproducible, and enough for timer jitter.
#[derive(Debug, Clone)]
pub(crate) struct SeededRng(u64);

impl SeededRng {
    pub(crate) fn new(seed: u64) -> SeededRng {
        SeededRng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform enough in `lo..hi` for jitter (`hi > lo`).
    pub(crate) fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo) as u64) as usize
    }
}

/// The election timer's range, in ticks: `[min, max)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ElectionRange {
    pub(crate) min: usize,
    pub(crate) max: usize,
}

/// Overwrites raft-rs's own draw if its timer was just reset. Called after every call that can
/// reset it: `tick`, `step`, `campaign`, `propose`, and construction.
pub(crate) fn reseed_if_reset(
    node: &mut RawNode<MetaStore>,
    range: ElectionRange,
    rng: &mut SeededRng,
) {
    if node.raft.election_elapsed == 0 {
        let t = rng.range(range.min, range.max);
        node.raft.set_randomized_election_timeout(t);
    }
}
