//! Every forwarded publish that was acknowledged is on the shard leader's log. A node that
//! does not lead a shard forwards publishes to its leader and answers only once the leader
//! did; the ack names the leader's offset. At the end of a cluster run one auditor per shard
//! reads the shard from the earliest offset, following `not_leader` to the leader, and every
//! forwarded ack must be found there at its offset with its payload.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use bytes::Bytes;

use crate::oracle::{show, Oracle, Violation};

pub(crate) const NAME: &str = "forwarded_acks";

/// What one auditor read: the node it read from, the first offset, the records by offset.
pub(crate) struct ReadBack<'a> {
    pub(crate) from: Option<SocketAddr>,
    pub(crate) records: Option<&'a BTreeMap<u64, Bytes>>,
}

/// `leaders[shard]`: the leader's client address; `read[shard]`: that shard's read-back.
pub(crate) fn check(
    oracle: &Oracle,
    leaders: &BTreeMap<u32, SocketAddr>,
    read: &BTreeMap<u32, ReadBack<'_>>,
) -> Result<(), Violation> {
    for (shard, offset, payload, via) in &oracle.forwarded_acks {
        let leader = leaders.get(shard);
        let back = read.get(shard);
        let from = back.and_then(|b| b.from);
        if from.is_none() || from != leader.copied() {
            return Err(Violation {
                invariant: NAME,
                detail: format!(
                    "shard {shard}: the read-back came from {from:?}, not the leader {leader:?}"
                ),
            });
        }
        let got = back.and_then(|b| b.records).and_then(|r| r.get(offset));
        if got != Some(payload) {
            return Err(Violation {
                invariant: NAME,
                detail: format!(
                    "{} acked through {via} at shard {shard} offset {offset} is not on the leader's log (found {:?})",
                    show(payload),
                    got.map(|g| show(g))
                ),
            });
        }
    }
    Ok(())
}
