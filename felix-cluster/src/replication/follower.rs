//! One shard's replication as a follower runs it: whom it accepts entries from, where the next
//! entry must start, and when it must stop rather than rewrite what was committed.
//!
//! A follower is fed by exactly one leader at one generation, the one the metadata names. It
//! first asks to be fed (its epochs and end), cuts its log where the leader says the copies
//! stop agreeing, then appends shipments that start exactly at its end. Anything else — an
//! older generation, another sender, a gap — is refused or answered by asking again; nothing
//! is appended out of place. Reports of the durable end go back after each sync.

use crate::NodeId;

/// Where the follower is with its leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowState {
    /// Asked to be fed, no answer yet.
    Asking,
    /// Cutting its log at the leader's word; fed once the cut is done.
    Truncating { to: u64 },
    /// Appending from `end`.
    Fed { end: u64 },
    /// The leader would have it cut below what it had persisted as committed: it stops
    /// serving this shard and says so, instead of rewriting a promised record.
    Halted { agreed: u64, committed: u64 },
}

/// What to do with a shipment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shipment {
    /// Append it: it starts at the log's end.
    Append,
    /// Already held (a resend): only report again.
    Held,
    /// It does not start at the end: ask to be fed again.
    Refollow,
    /// From an older generation or a node that does not lead this shard: refuse.
    Stale,
    /// Not now (asking, cutting, or halted): drop it; the leader resends after a new request.
    NotReady,
}

#[derive(Debug, Clone)]
pub struct ShardFollower {
    generation: u64,
    leader: NodeId,
    state: FollowState,
}

impl ShardFollower {
    /// Follows `leader` at `generation` (the metadata's), starting by asking to be fed.
    pub fn new(generation: u64, leader: NodeId) -> ShardFollower {
        ShardFollower {
            generation,
            leader,
            state: FollowState::Asking,
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn leader(&self) -> &NodeId {
        &self.leader
    }

    pub fn state(&self) -> FollowState {
        self.state
    }

    /// The leader's answer to the request to be fed: cut at `truncate_to`. `end` is the
    /// follower's log end now and `committed` the commit mark it had persisted. Returns the
    /// offset to cut at when a cut is needed (then call [`ShardFollower::truncated`]).
    pub fn follow_from(&mut self, truncate_to: u64, end: u64, committed: u64) -> Option<u64> {
        if self.state != FollowState::Asking {
            return None;
        }
        if truncate_to < committed.min(end) {
            self.state = FollowState::Halted {
                agreed: truncate_to,
                committed,
            };
            return None;
        }
        if truncate_to >= end {
            self.state = FollowState::Fed { end };
            return None;
        }
        self.state = FollowState::Truncating { to: truncate_to };
        Some(truncate_to)
    }

    /// The cut is done: appending starts at `end`.
    pub fn truncated(&mut self, end: u64) {
        if let FollowState::Truncating { .. } = self.state {
            self.state = FollowState::Fed { end };
        }
    }

    /// A shipment from `from` at `generation` of `count` records from `base`.
    pub fn shipment(&mut self, from: &NodeId, generation: u64, base: u64, count: u64) -> Shipment {
        if generation != self.generation || *from != self.leader {
            return Shipment::Stale;
        }
        let FollowState::Fed { end } = self.state else {
            return Shipment::NotReady;
        };
        if base == end {
            // The next shipment starts where this one ends, before the append is done: the
            // engine appends after it has read every message in hand, and a leader streams
            // its window, so waiting for `appended` would take every shipment after the first
            // for a gap. Appends are made in order, and the log refuses one that does not
            // start at its end; a failed one asks again (`ask_again`).
            self.state = FollowState::Fed { end: base + count };
            return Shipment::Append;
        }
        if base + count <= end {
            return Shipment::Held;
        }
        self.state = FollowState::Asking;
        Shipment::Refollow
    }

    /// The shipment was appended; the log ends at `end` now (or further, with the appends
    /// accepted after it).
    pub fn appended(&mut self, end: u64) {
        if let FollowState::Fed { end: e } = &mut self.state {
            *e = (*e).max(end);
        }
    }

    /// The leader refused us or a link came back: ask again from scratch.
    pub fn ask_again(&mut self) {
        if !matches!(self.state, FollowState::Halted { .. }) {
            self.state = FollowState::Asking;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s)
    }

    #[test]
    fn a_follower_appends_only_at_its_end_from_its_leader_at_its_generation() {
        let mut f = ShardFollower::new(4, n("n1"));
        assert_eq!(f.shipment(&n("n1"), 4, 0, 1), Shipment::NotReady);
        assert_eq!(f.follow_from(10, 10, 10), None);
        assert_eq!(f.state(), FollowState::Fed { end: 10 });
        assert_eq!(f.shipment(&n("n1"), 3, 10, 1), Shipment::Stale);
        assert_eq!(f.shipment(&n("n2"), 4, 10, 1), Shipment::Stale);
        assert_eq!(f.shipment(&n("n1"), 4, 10, 2), Shipment::Append);
        f.appended(12);
        assert_eq!(f.shipment(&n("n1"), 4, 10, 2), Shipment::Held);
        assert_eq!(f.shipment(&n("n1"), 4, 13, 2), Shipment::Refollow);
        assert_eq!(f.state(), FollowState::Asking);
    }

    #[test]
    fn shipments_in_a_row_are_appended_before_the_first_append_is_done() {
        // A leader's window arrives as one burst, read before any append is made.
        let mut f = ShardFollower::new(2, n("n2"));
        assert_eq!(f.follow_from(0, 0, 0), None);
        assert_eq!(f.shipment(&n("n2"), 2, 0, 1), Shipment::Append);
        assert_eq!(f.shipment(&n("n2"), 2, 1, 3), Shipment::Append);
        assert_eq!(f.shipment(&n("n2"), 2, 4, 1), Shipment::Append);
        assert_eq!(f.state(), FollowState::Fed { end: 5 });
        // A resend of one of them is held, not appended twice.
        assert_eq!(f.shipment(&n("n2"), 2, 1, 3), Shipment::Held);
        // The appends land in order; none moves the end back.
        f.appended(1);
        f.appended(4);
        assert_eq!(f.state(), FollowState::Fed { end: 5 });
        f.appended(5);
        assert_eq!(f.shipment(&n("n2"), 2, 5, 1), Shipment::Append);
        // One that failed: asked again from the log's real end.
        f.ask_again();
        assert_eq!(f.state(), FollowState::Asking);
        assert_eq!(f.shipment(&n("n2"), 2, 6, 1), Shipment::NotReady);
    }

    #[test]
    fn a_cut_above_the_commit_is_made_and_one_below_it_halts() {
        let mut f = ShardFollower::new(4, n("n1"));
        assert_eq!(f.follow_from(7, 12, 7), Some(7));
        assert_eq!(f.shipment(&n("n1"), 4, 7, 1), Shipment::NotReady);
        f.truncated(7);
        assert_eq!(f.shipment(&n("n1"), 4, 7, 1), Shipment::Append);

        let mut g = ShardFollower::new(4, n("n1"));
        assert_eq!(g.follow_from(5, 12, 7), None);
        assert_eq!(
            g.state(),
            FollowState::Halted {
                agreed: 5,
                committed: 7
            }
        );
        g.ask_again();
        assert!(matches!(g.state(), FollowState::Halted { .. }));
    }
}
