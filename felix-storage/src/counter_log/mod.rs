//! [`CounterLog`]: the counters of one cache, as a fold over a [`ShardLog`] of their own.
//!
//! A `counter_add` appends one record carrying the delta *and the sum it produced*, so the
//! newest record of a key is its whole state: recovery keeps the last sum per key, and
//! compaction (the log's, keeping each key's newest record at its own offset) is the
//! checkpoint that collapses applied deltas without renumbering anything. Counters live
//! under `counters/`, a root of their own, so a build that predates them never meets
//! these records in a log it serves.
//!
//! Like a cache write, an add is visible (and answered) once the log reports it durable;
//! the sum it answers counts every add accepted before it, durable or not, since they
//! become durable in order or not at all.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};

use crate::cache_log::{garbage_heavy, CacheEvent, MAX_CACHE_KEY_BYTES};
use crate::driven::Driven;
use crate::log::{AppendError, Batch, LogConfig, LogEvent, ShardLog, StorageError};
use crate::ops::LogId;
use crate::record::{self, DecodedEntry};

const COUNTER_RECORD_VERSION: u8 = 1;
const OP_ADD: u8 = 1;
/// Version, op, key length, delta, sum.
const COUNTER_RECORD_FIXED: usize = 20;

/// One applied add as stored in a record's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterRecord {
    pub key: Bytes,
    pub delta: i64,
    /// The counter's value after this add.
    pub sum: i64,
}

impl CounterRecord {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(COUNTER_RECORD_FIXED + self.key.len());
        b.put_u8(COUNTER_RECORD_VERSION);
        b.put_u8(OP_ADD);
        b.put_u16_le(self.key.len() as u16);
        b.put_i64_le(self.delta);
        b.put_i64_le(self.sum);
        b.put_slice(&self.key);
        b.freeze()
    }

    pub fn decode(payload: &Bytes) -> Result<CounterRecord, &'static str> {
        if payload.len() < COUNTER_RECORD_FIXED {
            return Err("a counter record shorter than its header");
        }
        if payload[0] != COUNTER_RECORD_VERSION {
            return Err("an unknown counter record version");
        }
        if payload[1] != OP_ADD {
            return Err("an unknown counter op");
        }
        let key_len = u16::from_le_bytes([payload[2], payload[3]]) as usize;
        if key_len != payload.len() - COUNTER_RECORD_FIXED {
            return Err("a counter key that does not fill its record");
        }
        Ok(CounterRecord {
            delta: record::u64_at(payload, 4) as i64,
            sum: record::u64_at(payload, 12) as i64,
            key: payload.slice(COUNTER_RECORD_FIXED..),
        })
    }
}

/// Why an add was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddError {
    /// The sum would leave the i64 range; nothing was written.
    Overflow {
        sum: i64,
    },
    Append(AppendError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sum {
    offset: u64,
    value: i64,
    /// Encoded size of its entry, for the live-bytes estimate.
    bytes: u32,
}

/// Encoded size of the log entry an add to a counter with this key writes: what a new
/// counter adds to [`CounterLog::live_bytes`] (an add to an existing one adds nothing).
pub fn add_entry_bytes(key_len: usize) -> u64 {
    (record::entry_len::<&[u8]>(b"", &[&[]]) + COUNTER_RECORD_FIXED + key_len) as u64
}

/// One cache's counters on a log. [`Driven`] like [`crate::cache_log::CacheLog`], and reports
/// the same events (`Opened`, `Durable`, `Compacted`, `CompactionFailed`, `Failed`).
#[derive(Debug)]
pub struct CounterLog {
    log: ShardLog,
    sums: HashMap<Box<[u8]>, Sum>,
    staged: VecDeque<(Box<[u8]>, Sum)>,
    live_bytes: u64,
    events: VecDeque<CacheEvent>,
    failed: bool,
}

impl CounterLog {
    pub fn open(id: LogId, dir: String, cfg: LogConfig, now: Instant) -> CounterLog {
        let mut c = CounterLog {
            log: ShardLog::open_replaying(id, dir, cfg, now),
            sums: HashMap::new(),
            staged: VecDeque::new(),
            live_bytes: 0,
            events: VecDeque::new(),
            failed: false,
        };
        c.absorb();
        c
    }

    pub fn log(&self) -> &ShardLog {
        &self.log
    }

    pub fn is_open(&self) -> bool {
        self.log.is_open() && !self.failed
    }

    /// The durable sum of a counter; `None` if it was never written.
    pub fn get(&self, key: &[u8]) -> Option<i64> {
        self.sums.get(key).map(|s| s.value)
    }

    /// Counters written.
    pub fn len(&self) -> usize {
        self.sums.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sums.is_empty()
    }

    /// Bytes of each counter's newest record.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// As for a cache ([`garbage_heavy`]), live bytes being those of each counter's newest
    /// record.
    pub fn compaction_due(&self) -> bool {
        self.is_open() && garbage_heavy(&self.log, self.live_bytes)
    }

    #[must_use]
    pub fn poll_event(&mut self) -> Option<CacheEvent> {
        self.absorb();
        self.events.pop_front()
    }

    /// Adds `delta` and returns the record's offset and the sum including it. The add is
    /// durable (and visible to gets) once [`CacheEvent::Durable`] passes the offset.
    pub fn add(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &[u8],
        delta: i64,
    ) -> Result<(u64, i64), AddError> {
        // The record's key length is a u16, as a cache record's.
        if key.len() > MAX_CACHE_KEY_BYTES {
            return Err(AddError::Append(AppendError::TooLarge(key.len())));
        }
        let before = match self.staged.iter().rev().find(|(k, _)| &**k == key) {
            Some((_, s)) => s.value,
            None => self.get(key).unwrap_or(0),
        };
        let Some(sum) = before.checked_add(delta) else {
            return Err(AddError::Overflow { sum: before });
        };
        let payload = CounterRecord {
            key: Bytes::copy_from_slice(key),
            delta,
            sum,
        }
        .encode();
        let bytes = record::entry_len(b"", &[&payload]) as u32;
        let payloads = [payload];
        let offset = self
            .log
            .append(
                now,
                Batch {
                    time_us: unix_micros,
                    publisher: None,
                    payloads: &payloads,
                },
            )
            .map_err(AddError::Append)?;
        self.staged.push_back((
            key.into(),
            Sum {
                offset,
                value: sum,
                bytes,
            },
        ));
        self.absorb();
        Ok((offset, sum))
    }

    /// Appends entries a leader's counter log shipped (its `read_framed`), as a follower
    /// does: with [`ShardLog::append_framed_with_gaps`], since a compacted log's offsets
    /// jump. Their sums become visible as this log's own adds do, once durable. Returns the
    /// log's new next offset.
    pub fn append_shipped(
        &mut self,
        now: Instant,
        base: u64,
        entries: Bytes,
    ) -> Result<u64, AppendError> {
        // Recovery's entries go to the sums first, so what is replayed below is this batch.
        self.absorb();
        let r = self.log.append_framed_with_gaps(now, base, entries);
        while let Some(entry) = self.log.take_replayed() {
            for (i, payload) in entry.payloads.iter().enumerate() {
                match self.decode_sum(entry.base + i as u64, payload) {
                    Some(staged) => self.staged.push_back(staged),
                    None => break,
                }
            }
        }
        self.absorb();
        r
    }

    /// Starts a compaction pass keeping each counter's newest record. False if nothing is
    /// sealed or a pass is running.
    pub fn compact(&mut self) -> bool {
        if !self.is_open() {
            return false;
        }
        let mut keep: Vec<u64> = self.sums.values().map(|s| s.offset).collect();
        keep.sort_unstable();
        let started = self.log.compact(keep);
        self.absorb();
        started
    }

    fn set(&mut self, key: Box<[u8]>, sum: Sum) {
        self.live_bytes += u64::from(sum.bytes);
        if let Some(old) = self.sums.insert(key, sum) {
            self.live_bytes -= u64::from(old.bytes);
        }
    }

    fn fail(&mut self, e: StorageError) {
        if !self.failed {
            self.failed = true;
            self.events.push_back(CacheEvent::Failed(e));
        }
    }

    fn replay(&mut self, entry: DecodedEntry) {
        for (i, payload) in entry.payloads.iter().enumerate() {
            let Some((key, sum)) = self.decode_sum(entry.base + i as u64, payload) else {
                return;
            };
            self.set(key, sum);
        }
    }

    /// The key and sum a stored record holds; a record that is not one fails the log.
    fn decode_sum(&mut self, offset: u64, payload: &Bytes) -> Option<(Box<[u8]>, Sum)> {
        match CounterRecord::decode(payload) {
            Ok(r) => {
                let sum = Sum {
                    offset,
                    value: r.sum,
                    bytes: record::entry_len(b"", &[payload]) as u32,
                };
                Some((r.key[..].into(), sum))
            }
            Err(why) => {
                let e = StorageError::Corrupt {
                    path: self.log.dir().to_owned(),
                    pos: 0,
                    what: format!("record {offset} is {why}"),
                };
                self.fail(e);
                None
            }
        }
    }

    fn absorb(&mut self) {
        while let Some(entry) = self.log.take_replayed() {
            self.replay(entry);
        }
        // A shipped entry's records come through `take_replayed`; its metadata is not needed.
        while self.log.take_appended().is_some() {}
        while let Some(ev) = self.log.poll_event() {
            match ev {
                LogEvent::Opened { next_offset, .. } => {
                    if !self.failed {
                        let keys = self.sums.len();
                        self.events
                            .push_back(CacheEvent::Opened { keys, next_offset });
                    }
                }
                LogEvent::Durable { up_to } => {
                    while self.staged.front().is_some_and(|(_, s)| s.offset < up_to) {
                        let (key, sum) = self.staged.pop_front().expect("checked");
                        self.set(key, sum);
                    }
                    self.events.push_back(CacheEvent::Durable { up_to });
                }
                // Counters read nothing back: the sums are in memory.
                LogEvent::Read { .. } | LogEvent::Trimmed { .. } => {}
                LogEvent::Compacted {
                    bytes_before,
                    bytes_after,
                } => self.events.push_back(CacheEvent::Compacted {
                    bytes_before,
                    bytes_after,
                }),
                LogEvent::CompactionFailed(e) => {
                    self.events.push_back(CacheEvent::CompactionFailed(e))
                }
                LogEvent::Failed(e) => self.fail(e),
                // Replication's answers (framed reads, cuts, replica state) go up as they are.
                LogEvent::Replica(e) => self.events.push_back(CacheEvent::Replica(e)),
            }
        }
    }
}

impl Driven for CounterLog {
    fn shard_mut(&mut self) -> &mut ShardLog {
        &mut self.log
    }

    fn after_input(&mut self) {
        self.absorb();
    }
}

#[cfg(test)]
mod tests;
