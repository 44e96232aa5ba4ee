//! An idempotent batch is never appended twice: however often a producer re-sends a batch
//! (after a lost connection, an error or a broker crash), its records are in the log once,
//! at the offset the `publish_ok` named; and a producer that only re-sends its pending batch
//! unchanged is never refused.
//!
//! Checked on every answer (a refusal, an offset that disagrees with what was seen there)
//! and at the audit (durable runs): no idempotent producer's payload appears at two offsets.
//! In memory runs a duplicate shows up to subscribers as a repeated payload number, which
//! `subscriber_order` refuses.

use std::collections::BTreeMap;

use bytes::Bytes;
use felix_proto::message::PublishRefusalReason;

use super::offsets;
use crate::oracle::{parse_payload, show, Oracle, Violation};
use crate::producer::{Batch, Producer};

pub(crate) const NAME: &str = "idempotent_once";

/// A `publish_ok` for `batch` at `offset`: the records are acknowledged there.
pub(crate) fn written(
    oracle: &mut Oracle,
    batch: &Batch,
    offset: Option<u64>,
) -> Result<(), Violation> {
    oracle.acked_count += 1;
    let Some(base) = offset else {
        return Ok(());
    };
    for (i, p) in batch.payloads.iter().enumerate() {
        let o = base + i as u64;
        offsets::observe(oracle, batch.shard, o, p, "idempotent ack")?;
        oracle
            .acked
            .entry(batch.shard)
            .or_default()
            .insert(o, p.clone());
    }
    Ok(())
}

/// A producer that only re-sends its pending batch is never refused.
pub(crate) fn refused(batch: &Batch, reason: &PublishRefusalReason) -> Violation {
    Violation {
        invariant: NAME,
        detail: format!(
            "sequence {} ({}) on shard {} refused: {reason:?}",
            batch.sequence,
            show(&batch.payloads[0]),
            batch.shard
        ),
    }
}

/// The audit: each idempotent payload at most once per shard.
pub(crate) fn check_audit(read: &BTreeMap<u32, Vec<(u64, Bytes)>>) -> Result<(), Violation> {
    for (shard, records) in read {
        let mut seen: BTreeMap<&[u8], u64> = BTreeMap::new();
        for (offset, payload) in records {
            let idempotent =
                parse_payload(payload).is_some_and(|(p, _)| Producer::is_idempotent_publisher(p));
            if !idempotent {
                continue;
            }
            if let Some(first) = seen.insert(payload, *offset) {
                return Err(Violation {
                    invariant: NAME,
                    detail: format!(
                        "shard {shard}: {} appended twice, at {first} and {offset}",
                        show(payload)
                    ),
                });
            }
        }
    }
    Ok(())
}
