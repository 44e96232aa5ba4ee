//! Offsets on a shard are never reused: once a record was acknowledged or delivered at an
//! offset, no other record ever appears there (durable streams). Contiguity is checked by
//! [`contiguous`] on a subscriber's view from its start and by the final audit.

use bytes::Bytes;

use crate::oracle::{show, Oracle, Promise, Violation};

pub(crate) const NAME: &str = "offsets_unique_and_contiguous";

/// Records that `payload` was seen at `offset` on `shard` (`how`: "ack" or "event").
pub(crate) fn observe(
    oracle: &mut Oracle,
    shard: u32,
    offset: u64,
    payload: &Bytes,
    how: &str,
) -> Result<(), Violation> {
    if oracle.promise != Promise::Durable {
        return Ok(());
    }
    let known = oracle.at_offset.entry(shard).or_default();
    match known.get(&offset) {
        Some(prev) if prev != payload => Err(Violation {
            invariant: NAME,
            detail: format!(
                "shard {shard} offset {offset}: {how} carries {} but {} was there before",
                show(payload),
                show(prev)
            ),
        }),
        Some(_) => Ok(()),
        None => {
            known.insert(offset, payload.clone());
            Ok(())
        }
    }
}

/// The offsets a reader saw from `start` are `start, start+1, ...` with no hole.
pub(crate) fn contiguous(shard: u32, start: u64, offsets: &[u64]) -> Result<(), Violation> {
    for (i, o) in offsets.iter().enumerate() {
        if *o != start + i as u64 {
            return Err(Violation {
                invariant: NAME,
                detail: format!(
                    "shard {shard}: audit read from {start} found offset {o} at position {i}"
                ),
            });
        }
    }
    Ok(())
}
