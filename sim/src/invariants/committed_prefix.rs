//! Committed prefixes agree: once the run has healed and gone quiet, every copy of a
//! replicated shard holds, below the leader's commit mark, exactly the leader's entries, byte
//! for byte (entries are shipped as the leader framed them, so equal logs are equal bytes).
//! Records at or below the commit mark are never rewritten; a copy may differ only above it,
//! where a rejoining follower is cut (docs/replication.md, invariant 5). Read from each
//! node's disk, segment by segment, with the storage's own entry scanner.

use std::collections::BTreeMap;

use felix_storage::record::{self, Step, SEGMENT_HEADER_LEN};

use crate::disk::MemFs;
use crate::oracle::Violation;

pub(crate) const NAME: &str = "committed_prefix";

/// One entry of a shard's log: its first offset, one past its last, and its bytes.
pub(crate) struct Entry {
    pub(crate) base: u64,
    pub(crate) end: u64,
    pub(crate) bytes: Vec<u8>,
}

/// The entries in `dir` (a shard's log directory) on `disk`, in offset order.
pub(crate) fn read_log(disk: &MemFs, dir: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    for name in disk.list(dir) {
        if !name.ends_with(".seg") {
            continue;
        }
        let Some(bytes) = disk.file(&format!("{dir}/{name}")) else {
            continue;
        };
        let mut at = SEGMENT_HEADER_LEN as usize;
        while at < bytes.len() {
            match record::step(&bytes[at..]) {
                Step::Entry(meta) => {
                    let len = meta.len as usize;
                    out.push(Entry {
                        base: meta.base,
                        end: meta.end(),
                        bytes: bytes[at..at + len].to_vec(),
                    });
                    at += len;
                }
                _ => break,
            }
        }
    }
    out.sort_by_key(|e| e.base);
    out
}

/// `leader`'s log against every other copy, below `commit`.
pub(crate) fn check(
    object: &str,
    shard: u32,
    commit: u64,
    leader: (&str, &[Entry]),
    copies: &[(&str, &[Entry])],
) -> Result<u64, Violation> {
    let by_base: BTreeMap<u64, &Entry> = leader.1.iter().map(|e| (e.base, e)).collect();
    let mut checked = 0;
    for (node, entries) in copies {
        for e in entries.iter().filter(|e| e.end <= commit) {
            match by_base.get(&e.base) {
                Some(l) if l.end == e.end && l.bytes == e.bytes => checked += 1,
                Some(_) => {
                    return Err(Violation {
                        invariant: NAME,
                        detail: format!(
                            "{object} shard {shard}: the entry at offset {} below the commit mark {commit} differs between the leader {} and {node}",
                            e.base, leader.0
                        ),
                    })
                }
                None => {
                    return Err(Violation {
                        invariant: NAME,
                        detail: format!(
                            "{object} shard {shard}: {node} holds an entry at offsets {}..{} below the commit mark {commit} that the leader {} does not",
                            e.base, e.end, leader.0
                        ),
                    })
                }
            }
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(base: u64, end: u64, b: u8) -> Entry {
        Entry {
            base,
            end,
            bytes: vec![b; 4],
        }
    }

    #[test]
    fn a_differing_committed_entry_is_refused_and_one_above_the_mark_is_not() {
        let leader = vec![e(0, 2, 1), e(2, 3, 2), e(3, 5, 3)];
        let same = vec![e(0, 2, 1), e(2, 3, 2), e(3, 5, 9)];
        assert_eq!(
            check("s", 0, 3, ("n1", &leader), &[("n2", &same)]).unwrap(),
            2
        );
        let differs = vec![e(0, 2, 1), e(2, 3, 7)];
        let v = check("s", 0, 3, ("n1", &leader), &[("n2", &differs)]).unwrap_err();
        assert_eq!(v.invariant, NAME);
        let split = vec![e(0, 1, 1)];
        assert!(check("s", 0, 3, ("n1", &leader), &[("n2", &split)]).is_err());
    }
}
