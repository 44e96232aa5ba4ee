//! Leases never overlap, on the nodes' own clocks: while a node believes it may write a
//! replicated shard (it leads it at the metadata's generation and its lease, read on its own
//! drifting clock, has not run out), no other node believes the same of that shard; and no
//! node serves a write once its own clock is past its lease. Each belief is kept as an
//! interval of true time: from when the node was seen leading with a live lease to where its
//! clock reaches the lease's end (or to when it was seen to stop leading). A leader frozen
//! past its lease and resumed (SIGSTOP) must find its lease over before it writes
//! (docs/replication.md, invariant 3).

use std::collections::BTreeMap;
use std::time::Instant;

use crate::oracle::Violation;

pub(crate) const NAME: &str = "leases_disjoint";

/// One node's belief that it may write one shard, in true time.
#[derive(Debug, Clone, Copy)]
struct Belief {
    since: Instant,
    until: Instant,
    generation: u64,
}

#[derive(Default)]
pub(crate) struct LeasesDisjoint {
    /// (object, shard) -> node -> its latest belief.
    beliefs: BTreeMap<(String, u32), BTreeMap<String, Belief>>,
    pub(crate) checked: u64,
}

/// What one node shows about one shard copy at one true instant.
pub(crate) struct Seen<'a> {
    pub(crate) node: &'a str,
    pub(crate) object: &'a str,
    pub(crate) shard: u32,
    pub(crate) generation: u64,
    /// The true instant its clock reaches its lease's end, if it leads the shard at the
    /// metadata's generation now; `None` if it does not.
    pub(crate) lease_end: Option<Instant>,
}

impl LeasesDisjoint {
    /// Node `seen.node` as observed at true time `now`.
    pub(crate) fn observe(&mut self, now: Instant, seen: &Seen<'_>) -> Result<(), Violation> {
        let shard = (seen.object.to_owned(), seen.shard);
        let per_node = self.beliefs.entry(shard).or_default();
        match seen.lease_end.filter(|end| *end > now) {
            None => {
                // Stopped believing (or never did): its belief ends here at the latest.
                if let Some(b) = per_node.get_mut(seen.node) {
                    b.until = b.until.min(now);
                }
                Ok(())
            }
            Some(until) => {
                for (other, b) in per_node.iter() {
                    if other != seen.node && b.until > now {
                        return Err(Violation {
                            invariant: NAME,
                            detail: format!(
                                "{} shard {}: {} holds its lease at generation {} while {other} still holds it at generation {} (for {} ms more by its clock)",
                                seen.object,
                                seen.shard,
                                seen.node,
                                seen.generation,
                                b.generation,
                                (b.until - now).as_millis()
                            ),
                        });
                    }
                }
                self.checked += 1;
                let b = per_node.entry(seen.node.to_owned()).or_insert(Belief {
                    since: now,
                    until,
                    generation: seen.generation,
                });
                if b.generation != seen.generation || b.until <= now {
                    b.since = now;
                }
                b.until = until;
                b.generation = seen.generation;
                Ok(())
            }
        }
    }

    /// Node `node` served a write on the shard at true time `now`: it must have held the
    /// lease then, by its own clock.
    pub(crate) fn wrote(
        &self,
        now: Instant,
        node: &str,
        object: &str,
        shard: u32,
    ) -> Result<(), Violation> {
        let belief = self
            .beliefs
            .get(&(object.to_owned(), shard))
            .and_then(|m| m.get(node));
        match belief {
            Some(b) if b.since <= now && now < b.until => Ok(()),
            _ => Err(Violation {
                invariant: NAME,
                detail: format!(
                    "{node} served a write on {object} shard {shard} without a live lease by its own clock"
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn seen<'a>(node: &'a str, generation: u64, lease_end: Option<Instant>) -> Seen<'a> {
        Seen {
            node,
            object: "stream:t/n/s",
            shard: 0,
            generation,
            lease_end,
        }
    }

    #[test]
    fn a_second_holder_before_the_first_lease_ends_is_refused() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_millis(n);
        let mut l = LeasesDisjoint::default();
        l.observe(s(0), &seen("n1", 1, Some(s(2000)))).unwrap();
        l.wrote(s(10), "n1", "stream:t/n/s", 0).unwrap();
        // n2 promoted while n1 (frozen, say) still believes until 2000.
        let v = l
            .observe(s(1500), &seen("n2", 2, Some(s(4000))))
            .unwrap_err();
        assert_eq!(v.invariant, NAME);
    }

    #[test]
    fn a_holder_after_the_first_lease_ends_is_fine_and_the_old_one_may_not_write() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_millis(n);
        let mut l = LeasesDisjoint::default();
        l.observe(s(0), &seen("n1", 1, Some(s(2000)))).unwrap();
        l.observe(s(2100), &seen("n2", 2, Some(s(4000)))).unwrap();
        // n1 resumes at 2200 and writes: its lease is over.
        assert!(l.wrote(s(2200), "n1", "stream:t/n/s", 0).is_err());
        l.wrote(s(2200), "n2", "stream:t/n/s", 0).unwrap();
    }

    #[test]
    fn a_holder_that_stepped_down_early_frees_the_shard() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_millis(n);
        let mut l = LeasesDisjoint::default();
        l.observe(s(0), &seen("n1", 1, Some(s(2000)))).unwrap();
        l.observe(s(500), &seen("n1", 1, None)).unwrap();
        l.observe(s(600), &seen("n2", 2, Some(s(3000)))).unwrap();
    }
}
