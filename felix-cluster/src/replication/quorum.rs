//! The quorum mark of a shard at one generation.
//!
//! A record below the mark is durable on a majority of the replica set *with the leader among
//! them*: the leader counts as one holder only for what it has itself made durable, and the
//! followers it needs besides itself must each have reported, at this generation and from the
//! storage the metadata names, a durable end at or past the record. Requiring the leader keeps
//! a leader from acknowledging a record it could not serve after a restart.

use super::{majority, Replica};

/// What a follower last told the leader about its copy: the generation it accepted the leader
/// at, the storage it writes to, and the end of what it has made durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub generation: u64,
    pub storage_id: String,
    pub durable_end: u64,
}

/// The mark from the leader's own durable end and the followers' latest reports.
///
/// `followers` pairs each follower of the replica set (leader excluded) with its latest report,
/// if any. A report from another generation or another storage identity does not count: the
/// first describes a log that may still be truncated, the second a disk the metadata does not
/// know. A follower cannot hold more of this generation's log than the leader wrote, so its end
/// is capped at the leader's.
pub fn quorum_mark(
    generation: u64,
    leader_durable_end: u64,
    followers: &[(&Replica, Option<&Report>)],
) -> u64 {
    let needed = majority(followers.len() + 1) - 1;
    if needed == 0 {
        return leader_durable_end;
    }
    let mut ends: Vec<u64> = followers
        .iter()
        .filter_map(|(replica, report)| {
            let r = (*report)?;
            (r.generation == generation && r.storage_id == replica.storage_id)
                .then_some(r.durable_end.min(leader_durable_end))
        })
        .collect();
    if ends.len() < needed {
        return 0;
    }
    ends.sort_unstable_by(|a, b| b.cmp(a));
    ends[needed - 1]
}

/// The mark as a leader keeps it: never moving back, whatever order reports arrive in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuorumMark {
    mark: u64,
}

impl QuorumMark {
    /// Starts at what the leader knows is committed (its commit offset when it opened).
    pub fn starting_at(committed: u64) -> QuorumMark {
        QuorumMark { mark: committed }
    }

    pub fn get(&self) -> u64 {
        self.mark
    }

    /// Recomputes the mark; returns the new value when it moved, which is when acknowledgements
    /// waiting below it are released.
    pub fn update(
        &mut self,
        generation: u64,
        leader_durable_end: u64,
        followers: &[(&Replica, Option<&Report>)],
    ) -> Option<u64> {
        let now = quorum_mark(generation, leader_durable_end, followers);
        (now > self.mark).then(|| {
            self.mark = now;
            now
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::golden::{self, Block};
    use super::*;
    use crate::NodeId;

    /// Each case: `generation=G leader_end=E`, then one line per follower: `node=N storage=S`
    /// (the metadata's view), and when it reported, `gen=G reported_storage=S end=E`.
    fn run(block: &Block) -> String {
        let head = golden::fields(&block.lines[0]);
        let generation = golden::num(&head, "generation");
        let leader_end = golden::num(&head, "leader_end");
        let mut replicas = Vec::new();
        let mut reports = Vec::new();
        for line in &block.lines[1..] {
            let f = golden::fields(line);
            replicas.push(Replica {
                node: NodeId::new(f["node"].clone()),
                storage_id: f["storage"].clone(),
            });
            reports.push(f.get("end").map(|end| Report {
                generation: golden::num(&f, "gen"),
                storage_id: f["reported_storage"].clone(),
                durable_end: end.parse().unwrap(),
            }));
        }
        let followers: Vec<(&Replica, Option<&Report>)> = replicas
            .iter()
            .zip(reports.iter().map(Option::as_ref))
            .collect();
        format!("mark={}", quorum_mark(generation, leader_end, &followers))
    }

    #[test]
    fn quorum_golden_file() {
        golden::check("quorum.txt", run);
    }

    #[test]
    fn the_mark_never_moves_back() {
        let b = Replica {
            node: NodeId::new("b"),
            storage_id: "sb".into(),
        };
        let c = Replica {
            node: NodeId::new("c"),
            storage_id: "sc".into(),
        };
        let at = |end| Report {
            generation: 2,
            storage_id: "sb".into(),
            durable_end: end,
        };
        let mut mark = QuorumMark::starting_at(3);
        assert_eq!(mark.update(2, 10, &[(&b, Some(&at(2))), (&c, None)]), None);
        assert_eq!(
            mark.get(),
            3,
            "a report below the committed start changes nothing"
        );
        assert_eq!(
            mark.update(2, 10, &[(&b, Some(&at(7))), (&c, None)]),
            Some(7)
        );
        assert_eq!(mark.update(2, 10, &[(&b, Some(&at(5))), (&c, None)]), None);
        assert_eq!(mark.get(), 7);
    }
}
