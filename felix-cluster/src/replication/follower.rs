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
    /// Dropping its whole copy to start the log again, empty, at the leader's log start;
    /// fed from there once that is done.
    Rebuilding { from: u64 },
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
    /// It starts past the end (one before it was lost or reordered): drop it. The leader
    /// sends again from its oldest shipment no report covers (`resend_after`), which fills
    /// the gap; asking to be fed again instead raced the shipments already in flight and
    /// could leave a returning follower unfed for good (docs/deploy.md, "a returning follower
    /// not fed").
    Gap,
    /// It overlaps the end without starting there: ask to be fed again.
    Refollow,
    /// From an older generation or a node that does not lead this shard: refuse.
    Stale,
    /// Not now (asking, cutting, rebuilding, or halted): drop it; the leader resends after a new request.
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

    /// The leader's answer to the request to be fed: nothing this copy holds can be fed
    /// from, so it starts again, empty, at `from` (the leader's log start). The copy holds
    /// `start..end`; `committed` as for [`ShardFollower::follow_from`]. Returns `from` when
    /// the copy is to be dropped (then call [`ShardFollower::truncated`] once the log starts
    /// there), `None` when it halts instead, or when it is already empty at `from` and is
    /// fed at once.
    ///
    /// Fed at once matters: the leader ships right after its answer, and what arrives while
    /// a copy is being dropped is refused, so the next shipment finds a gap and the copy
    /// asks again. A copy that asked again once its restart was done is empty at `from`; if
    /// that answer started another restart, each round would refuse the shipments the
    /// last one sent, for ever (the replicated simulator with wiped disks, seed 67).
    ///
    /// Records below `from` are gone from the leader too (its retention dropped them), so
    /// dropping them here loses nothing a copy still promises. Records at or above it that
    /// this copy knew were committed are another matter: the leader holds those offsets and
    /// does not agree with this copy there, and rewriting them could lose what a client was
    /// promised, so it halts as a cut below the commit would.
    pub fn rebuild_from(&mut self, from: u64, start: u64, end: u64, committed: u64) -> Option<u64> {
        if self.state != FollowState::Asking {
            return None;
        }
        if committed.min(end) > from {
            self.state = FollowState::Halted {
                agreed: from,
                committed,
            };
            return None;
        }
        if start == from && end == from {
            self.state = FollowState::Fed { end };
            return None;
        }
        self.state = FollowState::Rebuilding { from };
        Some(from)
    }

    /// The cut (or the restart of a rebuilt copy) is done: appending starts at `end`.
    pub fn truncated(&mut self, end: u64) {
        if let FollowState::Truncating { .. } | FollowState::Rebuilding { .. } = self.state {
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
            // Taken: the next shipment starts after it, even while this one is still being
            // written (a leader ships without waiting for each append).
            self.state = FollowState::Fed { end: base + count };
            return Shipment::Append;
        }
        if base + count <= end {
            return Shipment::Held;
        }
        if base > end {
            return Shipment::Gap;
        }
        // Overlapping its end: the shipment was read from an older position of the
        // leader's; be fed again from where this copy ends.
        self.state = FollowState::Asking;
        Shipment::Refollow
    }

    /// The shipment was appended; the log ends at `end` now. (A shipment counts from when it
    /// is taken, so this moves the end only if the log ran ahead of the shipments.)
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
        assert_eq!(f.shipment(&n("n1"), 4, 13, 2), Shipment::Gap);
        assert_eq!(
            f.state(),
            FollowState::Fed { end: 12 },
            "a gap changes nothing"
        );
        assert_eq!(f.shipment(&n("n1"), 4, 11, 2), Shipment::Refollow);
        assert_eq!(f.state(), FollowState::Asking);
    }

    #[test]
    fn shipments_in_a_row_are_taken_before_the_first_is_written() {
        let mut f = ShardFollower::new(4, n("n1"));
        assert_eq!(f.follow_from(10, 10, 10), None);
        assert_eq!(f.shipment(&n("n1"), 4, 10, 2), Shipment::Append);
        assert_eq!(f.shipment(&n("n1"), 4, 12, 3), Shipment::Append);
        assert_eq!(f.shipment(&n("n1"), 4, 12, 3), Shipment::Held);
        f.appended(12);
        assert_eq!(f.state(), FollowState::Fed { end: 15 });
        f.appended(15);
        assert_eq!(f.shipment(&n("n1"), 4, 15, 1), Shipment::Append);
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

    #[test]
    fn a_copy_with_nothing_to_feed_from_starts_again_at_the_leaders_log_start() {
        // Behind the leader's start (retention there dropped 0..20): everything here goes.
        let mut f = ShardFollower::new(4, n("n1"));
        assert_eq!(f.rebuild_from(20, 0, 12, 12), Some(20));
        assert_eq!(f.state(), FollowState::Rebuilding { from: 20 });
        assert_eq!(f.shipment(&n("n1"), 4, 20, 1), Shipment::NotReady);
        f.truncated(20);
        assert_eq!(f.shipment(&n("n1"), 4, 20, 1), Shipment::Append);

        // A new disk part way through an earlier rebuild from 20: dropped again.
        let mut g = ShardFollower::new(4, n("n1"));
        assert_eq!(g.rebuild_from(20, 20, 26, 0), Some(20));
        // Already empty at the start (a new disk, or a restart just done): fed at once, so
        // the shipments sent right after the answer are taken.
        let mut e = ShardFollower::new(4, n("n1"));
        assert_eq!(e.rebuild_from(20, 20, 20, 0), None);
        assert_eq!(e.state(), FollowState::Fed { end: 20 });
        assert_eq!(e.shipment(&n("n1"), 4, 20, 3), Shipment::Append);
        let mut z = ShardFollower::new(4, n("n1"));
        assert_eq!(z.rebuild_from(0, 0, 0, 0), None);
        assert_eq!(z.state(), FollowState::Fed { end: 0 });

        // It knew 25 committed, and the leader disagrees with it from 20: it halts.
        let mut h = ShardFollower::new(4, n("n1"));
        assert_eq!(h.rebuild_from(20, 0, 30, 25), None);
        assert_eq!(
            h.state(),
            FollowState::Halted {
                agreed: 20,
                committed: 25
            }
        );
        // Only an answer to a request counts.
        let mut k = ShardFollower::new(4, n("n1"));
        assert_eq!(k.follow_from(5, 5, 5), None);
        assert_eq!(k.rebuild_from(20, 0, 5, 5), None);
        assert_eq!(k.state(), FollowState::Fed { end: 5 });
    }
}
