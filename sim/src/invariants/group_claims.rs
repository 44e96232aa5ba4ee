//! `group_claims`: a record a consumer group handed to one consumer is not handed to another
//! while that claim stands (so no two consumers settle it as theirs at once).
//!
//! A claim is made at some broker moment `h` between the poll being queued (`sent`) and its
//! answer arriving (`received`), and stands until `h + visibility`. Two handouts of one
//! offset to different connections break the rule for certain only when the intervals
//! overlap for every possible `h` on both sides, the earlier holder had not handed it back
//! or finished it before the later answer arrived, and the broker did not restart in
//! between (claims are deliberately not durable).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::oracle::Violation;

/// Handouts remembered per offset.
const KEEP_PER_OFFSET: usize = 8;

#[derive(Debug, Clone)]
struct Handout {
    who: (usize, u64),
    sent: Instant,
    received: Instant,
    visibility: Duration,
    /// When its holder sent an ack or a nack for it.
    released: Option<Instant>,
}

#[derive(Debug, Default)]
pub(crate) struct GroupClaims {
    handouts: BTreeMap<(u32, u64), Vec<Handout>>,
    restarts: Vec<Instant>,
    pub(crate) checked: u64,
    /// Per shard, where the group stood after the auditor drained it: (cursor, tail).
    drained: BTreeMap<u32, (u64, u64)>,
}

impl GroupClaims {
    /// The auditor drained `shard`: the group's cursor and the shard's tail.
    pub(crate) fn drained(&mut self, shard: u32, cursor: u64, tail: u64) {
        self.drained.insert(shard, (cursor, tail));
    }

    /// At the end: the auditor drained every one of the `shards`, and on each every record
    /// is finished (acked or dead-lettered), so the cursor is at the tail, and the tail
    /// holds every record anyone was told about (`known_tail`). A drain that did not finish
    /// is a failure, not a pass: skipping it would let a group that stopped handing out
    /// records go unjudged.
    pub(crate) fn check_drained(
        &self,
        shards: u32,
        known_tail: impl Fn(u32) -> u64,
    ) -> Result<(), Violation> {
        for shard in 0..shards {
            let Some(&(cursor, tail)) = self.drained.get(&shard) else {
                return Err(Violation {
                    invariant: "group_claims",
                    detail: format!(
                        "the auditor's drain of shard {shard} did not finish by the end of the run ({} of {shards} shards drained)",
                        self.drained.len()
                    ),
                });
            };
            if cursor != tail || tail < known_tail(shard) {
                return Err(Violation {
                    invariant: "group_claims",
                    detail: format!(
                        "after the drain the group stands at {cursor} on shard {shard}, whose tail is {tail} ({} known): records were lost or never finished",
                        known_tail(shard)
                    ),
                });
            }
        }
        Ok(())
    }

    pub(crate) fn broker_restarted(&mut self, at: Instant) {
        self.restarts.push(at);
    }

    /// The holder `who` acked or nacked `offset` at `at`.
    pub(crate) fn released(&mut self, shard: u32, offset: u64, who: (usize, u64), at: Instant) {
        if let Some(list) = self.handouts.get_mut(&(shard, offset)) {
            for h in list
                .iter_mut()
                .filter(|h| h.who == who && h.released.is_none())
            {
                h.released = Some(at);
            }
        }
    }

    /// `who` got `offset` from a poll queued at `sent` with `visibility`, answered at
    /// `received`.
    pub(crate) fn handed(
        &mut self,
        shard: u32,
        offset: u64,
        who: (usize, u64),
        sent: Instant,
        received: Instant,
        visibility: Duration,
    ) -> Result<(), Violation> {
        self.checked += 1;
        let list = self.handouts.entry((shard, offset)).or_default();
        for h in list.iter().filter(|h| h.who != who) {
            let overlap = received < h.sent + h.visibility && h.received < sent + visibility;
            let released = h.released.is_some_and(|r| r < received);
            let (from, to) = (h.sent.min(sent), h.received.max(received));
            let restarted = self.restarts.iter().any(|&r| r >= from && r <= to);
            if overlap && !released && !restarted {
                return Err(Violation {
                    invariant: "group_claims",
                    detail: format!(
                        "shard {shard} offset {offset} went to client {} gen {} while client {} gen {} \
                         held it (claim of {:?} from a poll answered {:?} before)",
                        who.0,
                        who.1,
                        h.who.0,
                        h.who.1,
                        h.visibility,
                        received.saturating_duration_since(h.received)
                    ),
                });
            }
        }
        if list.len() >= KEEP_PER_OFFSET {
            list.remove(0);
        }
        list.push(Handout {
            who,
            sent,
            received,
            visibility,
            released: None,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_that_did_not_finish_fails_and_a_finished_one_is_judged() {
        let mut g = GroupClaims::default();
        let v = g.check_drained(2, |_| 4).unwrap_err();
        assert!(v.detail.contains("shard 0 did not finish"), "{v}");
        g.drained(0, 4, 4);
        let v = g.check_drained(2, |_| 4).unwrap_err();
        assert!(v.detail.contains("shard 1 did not finish"), "{v}");
        g.drained(1, 3, 4);
        let v = g.check_drained(2, |_| 4).unwrap_err();
        assert!(v.detail.contains("stands at 3 on shard 1"), "{v}");
        g.drained(1, 4, 4);
        assert!(g.check_drained(2, |_| 4).is_ok());
    }

    #[test]
    fn overlapping_standing_claims_are_caught_and_released_ones_are_not() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let mut g = GroupClaims::default();
        g.handed(0, 5, (1, 1), t, t + ms(10), ms(1000)).unwrap();
        // Another consumer gets it 100 ms later: the first claim surely stands.
        assert!(g
            .handed(0, 5, (2, 1), t + ms(100), t + ms(110), ms(1000))
            .is_err());
        // After the holder nacked it, it is owed again.
        g.released(0, 5, (1, 1), t + ms(50));
        g.handed(0, 5, (2, 1), t + ms(100), t + ms(110), ms(1000))
            .unwrap();
        // Past the visibility the claim has lapsed.
        g.handed(0, 6, (1, 1), t, t + ms(10), ms(100)).unwrap();
        g.handed(0, 6, (3, 1), t + ms(200), t + ms(210), ms(100))
            .unwrap();
    }
}
