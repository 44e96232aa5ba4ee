//! Opening a promoted leader: a majority fenced at the new generation, the most advanced log
//! among them adopted.
//!
//! The promoted node persists generation G+1 itself and asks every replica to do the same. A
//! replica that took the fence refuses any leader below G+1 from then on, restarts included, and
//! answers with how far its log reaches and at which generation its last record was written.
//! Any record acknowledged at G was durable on a majority of the set; the majority that took the
//! fence shares at least one replica with it, so the most advanced log among the fenced —
//! ordered by the generation of its last record, then by its length — holds every such record.
//! The leader adopts that log's tail before it opens for writes, which is why no replica that
//! is behind can ever serve: the promotion brings it level first.

use super::{majority, Replica};
use crate::NodeId;

/// How far one copy of the shard's log reaches: what the fence compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogPosition {
    /// The generation the last record was written at (0 for an empty log).
    pub last_generation: u64,
    /// The offset after the last record.
    pub end: u64,
}

/// One replica's answer to the fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceAnswer {
    pub node: NodeId,
    pub storage_id: String,
    pub position: LogPosition,
}

/// What the promoted leader does with the answers it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceOutcome {
    /// Not yet a majority (leader included) of answers that count.
    Waiting { counted: usize, needed: usize },
    /// Open now: the leader's own log is the most advanced among the fenced.
    Open,
    /// First adopt the tail of `from`'s log (it reaches `position`), then open.
    Adopt { from: NodeId, position: LogPosition },
}

/// Decides from the replica set (as the metadata records it, leader included), the leader's own
/// position, and the answers so far. Answers from nodes outside the set, or from a storage
/// identity the metadata does not name (a wiped disk answering from an empty log), do not
/// count: such a replica has not yet been rebuilt and cannot hold anything promised.
///
/// The leader counts itself by the same rule: a node back on a new disk that the metadata
/// still names as leader (it restarted within its lease, or a promotion decided before its
/// disk changed was applied after) holds none of the records it is named for, so it waits
/// — never opening, however the others answer — until the control plane hands the shard
/// on. (Found by the replicated simulator with follower and leader disks wiped: such a node
/// fenced with one follower that was behind and opened an empty log, and acknowledged
/// records were lost.) A leader whose disk the metadata has not recorded at all (placed
/// before its join was applied) waits too, until its join records the copy: what it
/// acknowledged would otherwise rest on a disk the metadata does not name, and the control
/// plane, seeing no copy for it, hands a `leader` shard on as if that disk were lost
/// ([`crate::meta::may_hand_over`]). (Found by the simulator, seed 10869 of the replicated
/// `leader` workload: n3 opened so before its join, acknowledged offset 2 alone, was cut
/// off, and n1 was promoted at the next generation with an empty copy and wrote offset 2
/// again.)
///
/// Ties go to the leader (no copy needed), then to the lowest node id, so every node reading
/// the same answers decides the same.
pub fn fence_outcome(
    set: &[Replica],
    leader: &Replica,
    own: LogPosition,
    answers: &[FenceAnswer],
) -> FenceOutcome {
    let needed = majority(set.len());
    let leader_holds_its_copy = set.iter().any(|r| {
        r.node == leader.node && !r.storage_id.is_empty() && r.storage_id == leader.storage_id
    });
    let mut counted: Vec<&FenceAnswer> = answers
        .iter()
        .filter(|a| {
            a.node != leader.node
                && set
                    .iter()
                    .any(|r| r.node == a.node && r.storage_id == a.storage_id)
        })
        .collect();
    counted.sort_by(|a, b| a.node.cmp(&b.node));
    counted.dedup_by(|a, b| a.node == b.node);
    let have = counted.len() + usize::from(leader_holds_its_copy);
    if have < needed || !leader_holds_its_copy {
        return FenceOutcome::Waiting {
            counted: have,
            needed,
        };
    }
    let best = counted
        .iter()
        .filter(|a| a.position > own)
        .max_by(|a, b| a.position.cmp(&b.position).then(b.node.cmp(&a.node)));
    match best {
        None => FenceOutcome::Open,
        Some(a) => FenceOutcome::Adopt {
            from: a.node.clone(),
            position: a.position,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::golden::{self, Block};
    use super::*;

    /// Each case: `set=a:sa,b:sb,c:sc leader=a own=G/E` (and `leader_storage=S` when the
    /// leader runs on another disk than the metadata names), then one answer per line:
    /// `node=b storage=sb at=G/E`.
    fn run(block: &Block) -> String {
        let pos = |s: &str| {
            let (g, e) = s.split_once('/').unwrap();
            LogPosition {
                last_generation: g.parse().unwrap(),
                end: e.parse().unwrap(),
            }
        };
        let head = golden::fields(&block.lines[0]);
        let set: Vec<Replica> = head["set"]
            .split(',')
            .map(|r| {
                let (n, s) = r.split_once(':').unwrap();
                Replica {
                    node: NodeId::new(n),
                    storage_id: s.to_string(),
                }
            })
            .collect();
        let mut leader = set
            .iter()
            .find(|r| r.node.as_str() == head["leader"])
            .unwrap()
            .clone();
        // The disk the leader runs on, when it is not the one the metadata names.
        if let Some(s) = head.get("leader_storage") {
            leader.storage_id = s.clone();
        }
        let answers: Vec<FenceAnswer> = block.lines[1..]
            .iter()
            .map(|l| {
                let f = golden::fields(l);
                FenceAnswer {
                    node: NodeId::new(f["node"].clone()),
                    storage_id: f["storage"].clone(),
                    position: pos(&f["at"]),
                }
            })
            .collect();
        match fence_outcome(&set, &leader, pos(&head["own"]), &answers) {
            FenceOutcome::Waiting { counted, needed } => {
                format!("waiting counted={counted} needed={needed}")
            }
            FenceOutcome::Open => "open".to_string(),
            FenceOutcome::Adopt { from, position } => format!(
                "adopt from={from} at={}/{}",
                position.last_generation, position.end
            ),
        }
    }

    #[test]
    fn fence_golden_file() {
        golden::check("fence.txt", run);
    }
}
