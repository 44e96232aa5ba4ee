//! Where two copies of a shard's log stop agreeing.
//!
//! Each copy keeps, beside its records, the generation every run of records was written at (an
//! epoch list: the first offset written at each generation). One leader writes at a generation,
//! and a node that restarts never resumes writing at the generation it held, so two records at
//! one offset written at one generation are the same record: comparing generations offset by
//! offset finds the first disagreement without reading a byte of payload.

/// A copy of a shard's log by its epochs: `(generation, first offset written at it)`, both
/// ascending, and the offset after its last record.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EpochLog {
    pub epochs: Vec<(u64, u64)>,
    pub end: u64,
}

impl EpochLog {
    /// The generation the record at `offset` was written at, if the log holds it.
    fn generation_at(&self, offset: u64) -> Option<u64> {
        if offset >= self.end {
            return None;
        }
        self.epochs
            .iter()
            .rev()
            .find(|&&(_, start)| start <= offset)
            .map(|&(g, _)| g)
    }

    /// The first epoch boundary after `offset`, or the log's end.
    fn next_boundary(&self, offset: u64) -> u64 {
        self.epochs
            .iter()
            .map(|&(_, start)| start)
            .find(|&s| s > offset)
            .unwrap_or(self.end)
            .min(self.end)
    }
}

/// The length of the longest prefix both copies hold identically.
pub fn agreed_prefix(a: &EpochLog, b: &EpochLog) -> u64 {
    agree_on_from(a, b, 0)
}

/// For copies of which one no longer holds the offsets below `from` (retention dropped
/// them, or the copy was started there): where they stop agreeing, when both hold `from`
/// at one generation. Then they hold the same records from `from` on (and, as far as either
/// still holds, before it: a record at one offset and generation is the same record with
/// the same history). `None` when they do not.
pub fn agreed_from(a: &EpochLog, b: &EpochLog, from: u64) -> Option<u64> {
    match (a.generation_at(from), b.generation_at(from)) {
        (Some(x), Some(y)) if x == y => Some(agree_on_from(a, b, from)),
        _ => None,
    }
}

/// The first offset at or after `offset` where the copies stop agreeing.
fn agree_on_from(a: &EpochLog, b: &EpochLog, mut offset: u64) -> u64 {
    // Each round moves to the next boundary of either log, so it ends within their epoch counts.
    for _ in 0..=(a.epochs.len() + b.epochs.len() + 1) {
        match (a.generation_at(offset), b.generation_at(offset)) {
            (Some(x), Some(y)) if x == y => {
                offset = a.next_boundary(offset).min(b.next_boundary(offset));
            }
            _ => return offset,
        }
    }
    offset
}

/// What a replica rejoining a leader does with its own log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejoin {
    /// Drop its records from `truncate_to` on (nothing, when it equals the replica's end) and
    /// fetch the leader's from there.
    TruncateTo(u64),
    /// The copies disagree below what the replica knew to be committed. Rewriting there would
    /// lose acknowledged records, so the replica stops serving this shard and says so.
    Halt { agreed: u64, committed: u64 },
}

/// Decides a rejoin from the replica's log, the commit mark it persisted, and the leader's log.
pub fn rejoin(replica: &EpochLog, replica_committed: u64, leader: &EpochLog) -> Rejoin {
    let agreed = agreed_prefix(replica, leader);
    if agreed < replica_committed.min(replica.end) {
        Rejoin::Halt {
            agreed,
            committed: replica_committed,
        }
    } else {
        Rejoin::TruncateTo(agreed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::golden::{self, Block};
    use super::*;

    /// `G@S,G@S…/END` → an epoch list and an end; `-/0` is an empty log.
    fn log(s: &str) -> EpochLog {
        let (epochs, end) = s.rsplit_once('/').unwrap();
        EpochLog {
            epochs: if epochs == "-" {
                Vec::new()
            } else {
                epochs
                    .split(',')
                    .map(|e| {
                        let (g, start) = e.split_once('@').unwrap();
                        (g.parse().unwrap(), start.parse().unwrap())
                    })
                    .collect()
            },
            end: end.parse().unwrap(),
        }
    }

    /// Each case is one line: `replica=LOG committed=N leader=LOG`, or `replica=LOG
    /// leader=LOG from=N` for [`agreed_from`].
    fn run(block: &Block) -> String {
        let f = golden::fields(&block.lines[0]);
        let (r, l) = (log(&f["replica"]), log(&f["leader"]));
        let agreed = agreed_prefix(&r, &l);
        assert_eq!(agreed, agreed_prefix(&l, &r), "agreement is symmetric");
        if let Some(from) = f.get("from") {
            let from: u64 = from.parse().unwrap();
            return match agreed_from(&r, &l, from) {
                Some(a) => format!("agreed_from={a}"),
                None => "no agreement there".to_owned(),
            };
        }
        match rejoin(&r, golden::num(&f, "committed"), &l) {
            Rejoin::TruncateTo(t) => format!("agreed={agreed} truncate_to={t}"),
            Rejoin::Halt { agreed, committed } => {
                format!("halt agreed={agreed} committed={committed}")
            }
        }
    }

    #[test]
    fn divergence_golden_file() {
        golden::check("divergence.txt", run);
    }
}
