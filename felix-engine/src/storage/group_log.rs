//! [`GroupLog`]: the durable part of a shard's consumer groups, as a [`ShardLog`] of
//! small records beside the shard's own log.
//!
//! Every group on the shard shares one log. A record names its group and says one thing:
//! the group's cursor moved, a record became a dead letter, a dead letter was discarded or
//! redriven, a redriven record was finished, or the group was deleted. Replaying the log in
//! order on open rebuilds each group's cursor, dead letters and redriven records; the
//! in-flight claims are deliberately not recorded (see docs/groups.md).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};

use super::log::{AppendError, Batch, LogConfig, LogEvent, ShardLog, StorageError};
use super::ops::{FileCompletion, FileOp, LogId};
use super::record::{self, DecodedEntry};

/// Version byte at the start of every group record.
const GROUP_RECORD_VERSION: u8 = 1;
/// version, op, group length, offset.
const GROUP_RECORD_FIXED: usize = 12;
/// Longest group name a record carries (names are checked far below this).
pub(crate) const MAX_GROUP_NAME_BYTES: usize = u16::MAX as usize;

/// What one group record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupOp {
    Cursor = 1,
    Dead = 2,
    Discard = 3,
    Redrive = 4,
    Done = 5,
    Delete = 6,
}

impl GroupOp {
    fn from_u8(b: u8) -> Option<GroupOp> {
        Some(match b {
            1 => GroupOp::Cursor,
            2 => GroupOp::Dead,
            3 => GroupOp::Discard,
            4 => GroupOp::Redrive,
            5 => GroupOp::Done,
            6 => GroupOp::Delete,
            _ => return None,
        })
    }
}

/// One record: `op` on `group` at `offset` (0 for a delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupRecord {
    pub(crate) op: GroupOp,
    pub(crate) group: String,
    pub(crate) offset: u64,
}

impl GroupRecord {
    pub(crate) fn encode(&self) -> Bytes {
        debug_assert!(self.group.len() <= MAX_GROUP_NAME_BYTES);
        let mut b = BytesMut::with_capacity(GROUP_RECORD_FIXED + self.group.len());
        b.put_u8(GROUP_RECORD_VERSION);
        b.put_u8(self.op as u8);
        b.put_u16_le(self.group.len() as u16);
        b.put_u64_le(self.offset);
        b.put_slice(self.group.as_bytes());
        b.freeze()
    }

    pub(crate) fn decode(payload: &[u8]) -> Result<GroupRecord, &'static str> {
        if payload.len() < GROUP_RECORD_FIXED {
            return Err("a group record shorter than its header");
        }
        if payload[0] != GROUP_RECORD_VERSION {
            return Err("an unknown group record version");
        }
        let op = GroupOp::from_u8(payload[1]).ok_or("an unknown group op")?;
        let len = u16::from_le_bytes([payload[2], payload[3]]) as usize;
        if payload.len() != GROUP_RECORD_FIXED + len {
            return Err("a group name that does not fill its record");
        }
        let offset = record::u64_at(payload, 4);
        let group = std::str::from_utf8(&payload[GROUP_RECORD_FIXED..])
            .map_err(|_| "a group name that is not UTF-8")?
            .to_owned();
        Ok(GroupRecord { op, group, offset })
    }
}

/// A group as its log left it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DurableGroup {
    pub(crate) cursor: Option<u64>,
    pub(crate) dead: BTreeSet<u64>,
    pub(crate) redriven: BTreeSet<u64>,
}

impl DurableGroup {
    fn apply(&mut self, op: GroupOp, offset: u64) {
        match op {
            // A seek may move it back, so the newest record wins.
            GroupOp::Cursor => self.cursor = Some(offset),
            GroupOp::Dead => {
                self.redriven.remove(&offset);
                self.dead.insert(offset);
            }
            GroupOp::Discard => {
                self.dead.remove(&offset);
            }
            GroupOp::Redrive => {
                self.dead.remove(&offset);
                self.redriven.insert(offset);
            }
            GroupOp::Done => {
                self.redriven.remove(&offset);
            }
            GroupOp::Delete => *self = DurableGroup::default(),
        }
    }
}

/// The group log of one shard. Driven like [`ShardLog`]; its events are the shard log's.
#[derive(Debug)]
pub(crate) struct GroupLog {
    log: ShardLog,
    /// Filled by replay while opening; taken once by the broker.
    recovered: HashMap<String, DurableGroup>,
    events: VecDeque<LogEvent>,
    /// Replay met a record it cannot read: the open is reported as failed.
    corrupt: Option<StorageError>,
}

impl GroupLog {
    pub(crate) fn open(id: LogId, dir: String, cfg: LogConfig, now: Instant) -> GroupLog {
        let mut g = GroupLog {
            log: ShardLog::open_replaying(id, dir, cfg, now),
            recovered: HashMap::new(),
            events: VecDeque::new(),
            corrupt: None,
        };
        g.absorb();
        g
    }

    pub(crate) fn log(&self) -> &ShardLog {
        &self.log
    }

    /// Every group the log holds, as replay left them (empty after the first call).
    pub(crate) fn take_recovered(&mut self) -> HashMap<String, DurableGroup> {
        std::mem::take(&mut self.recovered)
    }

    #[must_use]
    pub(crate) fn poll_op(&mut self) -> Option<FileOp> {
        self.log.poll_op()
    }

    #[must_use]
    pub(crate) fn poll_event(&mut self) -> Option<LogEvent> {
        self.events.pop_front()
    }

    #[must_use]
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.log.poll_timeout()
    }

    pub(crate) fn handle_completion(&mut self, c: FileCompletion) {
        self.log.handle_completion(c);
        self.absorb();
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant, unix_micros: u64) {
        self.log.handle_timeout(now, unix_micros);
        self.absorb();
    }

    pub(crate) fn sync_now(&mut self) {
        self.log.sync_now();
        self.absorb();
    }

    /// Appends records as one entry and returns the offset every one of them is durable
    /// below once [`LogEvent::Durable`] passes it.
    pub(crate) fn append(
        &mut self,
        now: Instant,
        unix_micros: u64,
        records: &[GroupRecord],
    ) -> Result<u64, AppendError> {
        let payloads: Vec<Bytes> = records.iter().map(GroupRecord::encode).collect();
        let batch = Batch {
            time_us: unix_micros,
            publisher: None,
            payloads: &payloads,
        };
        let first = self.log.append(now, batch);
        self.absorb();
        first.map(|f| f + payloads.len() as u64)
    }

    fn absorb(&mut self) {
        while let Some(entry) = self.log.take_replayed() {
            self.replay(entry);
        }
        while let Some(ev) = self.log.poll_event() {
            let ev = match ev {
                LogEvent::Opened { .. } if self.corrupt.is_some() => {
                    LogEvent::Failed(self.corrupt.take().expect("checked"))
                }
                other => other,
            };
            self.events.push_back(ev);
        }
    }

    fn replay(&mut self, entry: DecodedEntry) {
        for (i, payload) in entry.payloads.iter().enumerate() {
            match GroupRecord::decode(payload) {
                Ok(r) => self
                    .recovered
                    .entry(r.group)
                    .or_default()
                    .apply(r.op, r.offset),
                Err(why) => {
                    self.corrupt.get_or_insert(StorageError::Corrupt {
                        path: self.log.dir().to_owned(),
                        pos: 0,
                        what: format!("record {} is {why}", entry.base + i as u64),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_record_round_trips_and_damage_is_refused() {
        let r = GroupRecord {
            op: GroupOp::Redrive,
            group: "billing/é".into(),
            offset: 1 << 40,
        };
        let bytes = r.encode();
        assert_eq!(GroupRecord::decode(&bytes), Ok(r));
        assert!(GroupRecord::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut bad = bytes.to_vec();
        bad[1] = 9;
        assert!(GroupRecord::decode(&bad).is_err());
    }

    #[test]
    fn replay_rebuilds_cursor_dead_letters_and_redrives() {
        let mut g = DurableGroup::default();
        for (op, off) in [
            (GroupOp::Cursor, 3),
            (GroupOp::Dead, 1),
            (GroupOp::Dead, 2),
            (GroupOp::Cursor, 7),
            (GroupOp::Redrive, 1),
            (GroupOp::Discard, 2),
            (GroupOp::Dead, 5),
        ] {
            g.apply(op, off);
        }
        assert_eq!(g.cursor, Some(7));
        assert_eq!(g.dead.iter().copied().collect::<Vec<_>>(), vec![5]);
        assert_eq!(g.redriven.iter().copied().collect::<Vec<_>>(), vec![1]);
        g.apply(GroupOp::Done, 1);
        assert!(g.redriven.is_empty());
        g.apply(GroupOp::Delete, 0);
        assert_eq!(g, DurableGroup::default());
    }
}
