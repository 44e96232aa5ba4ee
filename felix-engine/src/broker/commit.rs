//! Atomic commits (`commit`, `state_get`): an event and the state changes it makes, stored
//! as one log entry on the entity key's shard, so every reader sees all of it or none of it.
//!
//! The event is the entry's one record (what subscribers and `stream_read` see); the
//! changes ride in the entry's state block. The shard's state is a map from key to value
//! and the offset of the commit that wrote it, rebuilt from those blocks on recovery.
//!
//! State block layout (little-endian): `u32 count`, then per change `u8 op` (1 put,
//! 2 delete), `u16 key_len`, key, and for a put `u32 value_len`, value.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use felix_proto::message::{PublishRefusalReason, StateChange};
use felix_proto::ErrorCode;

use super::{Broker, BrokerError, Published, StreamKey};
use felix_storage::ops::LogId;
use felix_storage::record::EntryExt;

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;

/// One shard's committed state.
#[derive(Debug, Default)]
pub(crate) struct StateTable {
    values: HashMap<String, (Bytes, u64)>,
    /// Key plus value bytes of `values`, held under `state_max_bytes_per_shard`.
    bytes: usize,
    /// How many keys have each version: the oldest is the first offset the state still
    /// needs from the log, which retention must keep (`ShardLog::set_retention_floor`).
    versions: BTreeMap<u64, usize>,
    /// The offset of the last commit applied.
    as_of: Option<u64>,
}

impl StateTable {
    /// Applies a stored state block written at `offset`. A block that does not parse (it
    /// passed the entry CRC, so only a writer bug makes one) is skipped whole.
    pub(crate) fn apply_block(&mut self, offset: u64, block: &[u8]) {
        if let Some(changes) = decode_block(block) {
            self.apply(offset, changes);
        }
    }

    fn apply(&mut self, offset: u64, changes: Vec<(String, Option<Bytes>)>) {
        for (key, value) in changes {
            let key_len = key.len();
            let added = value.as_ref().map(|v| key_len + v.len());
            let old = match value {
                Some(v) => self.values.insert(key, (v, offset)),
                None => self.values.remove(&key),
            };
            if let Some((v, at)) = old {
                self.bytes -= key_len + v.len();
                if let Entry::Occupied(mut n) = self.versions.entry(at) {
                    *n.get_mut() -= 1;
                    if *n.get() == 0 {
                        n.remove();
                    }
                }
            }
            if let Some(added) = added {
                self.bytes += added;
                *self.versions.entry(offset).or_default() += 1;
            }
        }
        self.as_of = Some(offset);
    }

    /// The oldest offset holding a live key's value: what the log must keep for a restart
    /// to rebuild this state (`None`: no state).
    pub(crate) fn oldest_version(&self) -> Option<u64> {
        self.versions.keys().next().copied()
    }

    /// The state's size once `changes` are applied in order.
    fn bytes_after(&self, changes: &[StateChange]) -> usize {
        let mut pending: HashMap<&str, usize> = HashMap::new();
        let mut bytes = self.bytes;
        for change in changes {
            let (key, new) = match change {
                StateChange::Put { key, value } => (key.as_str(), key.len() + value.len()),
                StateChange::Delete { key } => (key.as_str(), 0),
            };
            let current = pending
                .get(key)
                .copied()
                .unwrap_or_else(|| self.values.get(key).map_or(0, |(v, _)| key.len() + v.len()));
            bytes = bytes - current + new;
            pending.insert(key, new);
        }
        bytes
    }
}

/// What `state_get` answers, once the log is durable up to `durable_at`.
#[derive(Debug)]
pub(crate) struct StateAnswer {
    pub(crate) value: Option<Bytes>,
    pub(crate) version: Option<u64>,
    pub(crate) as_of: Option<u64>,
    pub(crate) durable_at: Option<(LogId, u64)>,
}

pub(crate) fn encode_block(changes: &[StateChange]) -> Result<Bytes, BrokerError> {
    let mut out = BytesMut::new();
    out.put_u32_le(changes.len() as u32);
    for change in changes {
        let (op, key, value) = match change {
            StateChange::Put { key, value } => (OP_PUT, key, Some(value)),
            StateChange::Delete { key } => (OP_DELETE, key, None),
        };
        let key_len = u16::try_from(key.len())
            .map_err(|_| BrokerError::invalid("a state key is longer than 65535 bytes"))?;
        out.put_u8(op);
        out.put_u16_le(key_len);
        out.put_slice(key.as_bytes());
        if let Some(v) = value {
            out.put_u32_le(v.len() as u32);
            out.put_slice(v);
        }
    }
    Ok(out.freeze())
}

fn decode_block(mut b: &[u8]) -> Option<Vec<(String, Option<Bytes>)>> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (b.get(..n)?, b.get(n..)?);
        *b = tail;
        Some(head)
    }
    let count = u32::from_le_bytes(take(&mut b, 4)?.try_into().ok()?);
    let mut out = Vec::new();
    for _ in 0..count {
        let op = take(&mut b, 1)?[0];
        let key_len = u16::from_le_bytes(take(&mut b, 2)?.try_into().ok()?) as usize;
        let key = String::from_utf8(take(&mut b, key_len)?.to_vec()).ok()?;
        let value = match op {
            OP_PUT => {
                let n = u32::from_le_bytes(take(&mut b, 4)?.try_into().ok()?) as usize;
                Some(Bytes::copy_from_slice(take(&mut b, n)?))
            }
            OP_DELETE => None,
            _ => return None,
        };
        out.push((key, value));
    }
    b.is_empty().then_some(out)
}

/// A commit's outcome.
#[derive(Debug)]
pub(crate) enum Committed {
    Written(Published),
    Refused(PublishRefusalReason),
}

impl Broker {
    /// Appends `event` with `changes` as one entry on the shard `entity_key` routes to, if
    /// the shard's tail is `expected_offset` (when given). Needs a durable stream: the
    /// answer is an offset and state must survive a restart.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn commit(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &StreamKey,
        (entity_key, explicit): (&[u8], Option<u32>),
        event: Bytes,
        changes: &[StateChange],
        expected_offset: Option<u64>,
    ) -> Result<Committed, BrokerError> {
        let shard = self.route(key, Some(entity_key), explicit)?;
        let (stream, tail) = self.prepare_shard(now, key, shard)?;
        let Some(tail) = tail else {
            return Err(BrokerError::invalid(
                "commit needs a durable stream: an in-memory one keeps no state",
            ));
        };
        if expected_offset.is_some_and(|e| e != tail) {
            return Ok(Committed::Refused(PublishRefusalReason::OffsetMismatch {
                tail,
            }));
        }
        let table = &self.streams[stream].shards[shard as usize].state.commits;
        let after = table.bytes_after(changes);
        let limit = self.cfg.state_max_bytes_per_shard;
        if after > limit && after > table.bytes {
            return Err(BrokerError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "the commit would take the shard's state to {after} bytes, past its limit of {limit}"
                ),
            ));
        }
        let block = encode_block(changes)?;
        let ext = EntryExt {
            producer: None,
            state: Some(&block),
        };
        let published = self.publish_ext(
            now,
            unix_micros,
            key,
            (None, Some(shard)),
            vec![event],
            None,
            &ext,
        )?;
        let offset = published.first_offset.expect("a durable shard has offsets");
        let sh = &mut self.streams[stream].shards[shard as usize];
        sh.state.apply(Some(offset), 1, None, Some(&block));
        let floor = sh.state.commits.oldest_version();
        if let Some(log) = sh.store.as_ref().map(|s| s.log) {
            let slot = self.logs.as_mut().and_then(|l| l.slot_mut(log));
            if let Some(shard_log) = slot.and_then(|s| s.log.stream_mut()) {
                shard_log.set_retention_floor(floor);
            }
        }
        Ok(Committed::Written(published))
    }

    /// `key` in the state of the shard `entity_key` routes to. The answer waits until every
    /// commit it reflects is durable.
    pub(crate) fn state_get(
        &mut self,
        now: Instant,
        key: &StreamKey,
        (entity_key, explicit): (&[u8], Option<u32>),
        state_key: &str,
    ) -> Result<StateAnswer, BrokerError> {
        let shard = self.route(key, Some(entity_key), explicit)?;
        let (stream, tail) = self.prepare_shard(now, key, shard)?;
        if tail.is_none() {
            return Err(BrokerError::invalid(
                "state_get needs a durable stream: an in-memory one keeps no state",
            ));
        }
        let sh = &self.streams[stream].shards[shard as usize];
        let found = sh.state.commits.values.get(state_key);
        let as_of = sh.state.commits.as_of;
        let log = sh.store.as_ref().map(|s| s.log);
        Ok(StateAnswer {
            value: found.map(|(v, _)| v.clone()),
            version: found.map(|&(_, at)| at),
            as_of,
            durable_at: log.zip(as_of).map(|(log, at)| (log, at + 1)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_and_applies_in_order() {
        let changes = vec![
            StateChange::Put {
                key: "a".into(),
                value: Bytes::from_static(b"1"),
            },
            StateChange::Put {
                key: "b".into(),
                value: Bytes::from_static(b"2"),
            },
            StateChange::Delete { key: "a".into() },
        ];
        let block = encode_block(&changes).unwrap();
        let mut t = StateTable::default();
        t.apply_block(5, &block);
        assert_eq!(t.values.get("a"), None);
        assert_eq!(t.values.get("b"), Some(&(Bytes::from_static(b"2"), 5)));
        assert_eq!(t.as_of, Some(5));
        // A truncated block is refused whole, never half applied.
        let mut t2 = StateTable::default();
        t2.apply_block(6, &block[..block.len() - 1]);
        assert!(t2.values.is_empty() && t2.as_of.is_none());
    }
}
