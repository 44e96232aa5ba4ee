//! No acknowledged record is lost. Runs whose fsync mode promises survival across the
//! crashes they inject (`on_commit` with power loss; writes acknowledged after the write
//! with process crashes only) end with an audit: a fresh client reads every shard from the
//! earliest offset, and every acknowledged record must be there at its offset.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::invariants::offsets;
use crate::oracle::{show, Oracle, Promise, Violation};

pub(crate) const NAME: &str = "no_acked_loss";

/// `read[shard]`: the audit's `(offset, payload)`s in delivery order, from `start[shard]`.
pub(crate) fn check(
    oracle: &Oracle,
    start: &BTreeMap<u32, u64>,
    read: &BTreeMap<u32, Vec<(u64, Bytes)>>,
) -> Result<(), Violation> {
    if oracle.promise != Promise::Durable {
        return Ok(());
    }
    for shard in 0..oracle.shards {
        let records = read.get(&shard).map(Vec::as_slice).unwrap_or(&[]);
        let first = start.get(&shard).copied().unwrap_or(0);
        let offsets: Vec<u64> = records.iter().map(|(o, _)| *o).collect();
        offsets::contiguous(shard, first, &offsets)?;
        let got: BTreeMap<u64, &Bytes> = records.iter().map(|(o, p)| (*o, p)).collect();
        for (offset, payload) in oracle.acked.get(&shard).into_iter().flatten() {
            match got.get(offset) {
                Some(p) if *p == payload => {}
                Some(p) => {
                    return Err(Violation {
                        invariant: NAME,
                        detail: format!(
                            "shard {shard} offset {offset}: acknowledged {} but the log now holds {}",
                            show(payload),
                            show(p)
                        ),
                    })
                }
                None => {
                    return Err(Violation {
                        invariant: NAME,
                        detail: format!(
                            "shard {shard} offset {offset}: acknowledged {} is gone (audit read {} records from {first})",
                            show(payload),
                            records.len()
                        ),
                    })
                }
            }
        }
    }
    for (shard, payload) in &oracle.acked_unplaced {
        let found = read
            .get(shard)
            .is_some_and(|records| records.iter().any(|(_, p)| p == payload));
        if !found {
            return Err(Violation {
                invariant: NAME,
                detail: format!(
                    "shard {shard}: acknowledged {} (no offset given) is not in the log",
                    show(payload)
                ),
            });
        }
    }
    Ok(())
}
