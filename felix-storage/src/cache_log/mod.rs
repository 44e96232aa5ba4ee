//! [`CacheLog`]: a cache as a projection of a [`ShardLog`].
//!
//! A put or a delete appends one record; an in-memory index maps each live key to the
//! offset of its newest put and that put's absolute expiry. The index holds no values: a
//! get reads the log (the log's tail cache answers recent keys without a file op). The
//! index is rebuilt by replaying the log on open, so it cannot be stale in a way that
//! matters. A write becomes visible (and may be acknowledged) once the log reports it
//! durable; until then gets see the previous value.
//!
//! Expiry is an absolute Unix time in milliseconds stored in the record, so it means the
//! same after a restart. Expired keys read as absent; compaction drops them.
//!
//! Compaction rewrites the sealed segments keeping only each live key's newest put, at its
//! own offset: offsets are never renumbered, so the index needs no change beyond the keys
//! it drops. The log's `compact` does the file work and owns the crash order.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};

use crate::driven::Driven;
use crate::log::{
    AppendError, Batch, LogConfig, LogEvent, ReadError, ReadTicket, ShardLog, StorageError,
};
use crate::ops::LogId;
use crate::record::{self, DecodedEntry};

/// Version byte at the start of every cache record.
const CACHE_RECORD_VERSION: u8 = 1;
const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
/// Fixed part of a cache record: version, op, key length, expiry.
const CACHE_RECORD_FIXED: usize = 12;
/// Longest key a record can carry.
pub const MAX_CACHE_KEY_BYTES: usize = u16::MAX as usize;
/// Below this many bytes of segments a cache log is never compacted.
pub const COMPACT_MIN_BYTES: u64 = 1 << 20;
/// Compaction is due when the log holds this many times its live bytes.
pub const COMPACT_GARBAGE_RATIO: u64 = 4;

/// The compaction trigger shared by the cache and counter logs: the log holds
/// [`COMPACT_GARBAGE_RATIO`] times `live_bytes` (and at least [`COMPACT_MIN_BYTES`]) and no
/// pass is running.
pub fn garbage_heavy(log: &ShardLog, live_bytes: u64) -> bool {
    let total = log.total_bytes();
    !log.compacting()
        && total >= COMPACT_MIN_BYTES
        && total > COMPACT_GARBAGE_RATIO.saturating_mul(live_bytes)
}

/// Encoded size of the log entry a put of this key and value writes: what the key counts
/// for in [`CacheLog::live_bytes`] once applied (limits are checked against it).
pub fn put_entry_bytes(key_len: usize, value_len: usize) -> u64 {
    (record::entry_len::<&[u8]>(b"", &[&[]]) + CACHE_RECORD_FIXED + key_len + value_len) as u64
}

/// One cache write as stored in a log record's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheRecord {
    Put {
        key: Bytes,
        value: Bytes,
        /// Absolute Unix milliseconds; `None` never expires.
        expiry_unix_ms: Option<u64>,
    },
    Delete {
        key: Bytes,
    },
}

impl CacheRecord {
    pub fn encode(&self) -> Bytes {
        let (op, key, value, expiry) = match self {
            CacheRecord::Put {
                key,
                value,
                expiry_unix_ms,
            } => (OP_PUT, key, &value[..], expiry_unix_ms.unwrap_or(0)),
            CacheRecord::Delete { key } => (OP_DELETE, key, &[][..], 0),
        };
        debug_assert!(key.len() <= MAX_CACHE_KEY_BYTES);
        let mut b = BytesMut::with_capacity(CACHE_RECORD_FIXED + key.len() + value.len());
        b.put_u8(CACHE_RECORD_VERSION);
        b.put_u8(op);
        b.put_u16_le(key.len() as u16);
        b.put_u64_le(expiry);
        b.put_slice(key);
        b.put_slice(value);
        b.freeze()
    }

    /// Parses a payload; key and value are slices of it.
    pub fn decode(payload: &Bytes) -> Result<CacheRecord, &'static str> {
        if payload.len() < CACHE_RECORD_FIXED {
            return Err("a cache record shorter than its header");
        }
        if payload[0] != CACHE_RECORD_VERSION {
            return Err("an unknown cache record version");
        }
        let key_len = u16::from_le_bytes([payload[2], payload[3]]) as usize;
        let expiry = record::u64_at(payload, 4);
        let rest = payload.len() - CACHE_RECORD_FIXED;
        if key_len > rest {
            return Err("a cache key longer than its record");
        }
        let key = payload.slice(CACHE_RECORD_FIXED..CACHE_RECORD_FIXED + key_len);
        match payload[1] {
            OP_PUT => Ok(CacheRecord::Put {
                key,
                value: payload.slice(CACHE_RECORD_FIXED + key_len..),
                expiry_unix_ms: (expiry != 0).then_some(expiry),
            }),
            OP_DELETE if key_len == rest && expiry == 0 => Ok(CacheRecord::Delete { key }),
            OP_DELETE => Err("a cache delete with a value or an expiry"),
            _ => Err("an unknown cache op"),
        }
    }
}

/// Where a live key's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    offset: u64,
    /// Absolute Unix milliseconds, 0 for never.
    expiry_ms: u64,
    /// Encoded size of the entry holding it, for the live-bytes estimate.
    bytes: u32,
}

impl Slot {
    fn expired(&self, unix_ms: u64) -> bool {
        self.expiry_ms != 0 && self.expiry_ms <= unix_ms
    }
}

#[derive(Debug)]
struct Staged {
    offset: u64,
    key: Box<[u8]>,
    /// `None` for a delete.
    slot: Option<Slot>,
    /// The value written (a put's, shared with the record), for watchers.
    value: Option<Bytes>,
}

/// One write the cache applied (it became durable and visible), in offset order: what a
/// cache watch delivers. A delete has no value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub offset: u64,
    pub key: Bytes,
    pub value: Option<Bytes>,
    /// Absolute Unix milliseconds; `None` never expires.
    pub expiry_unix_ms: Option<u64>,
}

/// A value a get found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedValue {
    pub value: Bytes,
    pub expiry_unix_ms: Option<u64>,
    /// The offset of the put that wrote it.
    pub offset: u64,
}

/// What a get needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The key is not there (or has expired): no read needed.
    Absent,
    /// The value is being read; [`CacheEvent::Value`] with this ticket answers.
    Pending(ReadTicket),
}

/// What the cache log reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// The index is rebuilt: `keys` live keys, appends go on from `next_offset`.
    Opened {
        keys: usize,
        next_offset: u64,
    },
    /// Every write below `up_to` is durable and visible: acknowledge those puts and deletes.
    Durable {
        up_to: u64,
    },
    /// The answer to a [`Lookup::Pending`] get.
    Value {
        ticket: ReadTicket,
        result: Result<Option<CachedValue>, ReadError>,
    },
    Compacted {
        bytes_before: u64,
        bytes_after: u64,
    },
    CompactionFailed(StorageError),
    /// The cache's log stopped (see [`LogEvent::Failed`]): fail every write not yet durable.
    Failed(StorageError),
    /// A write became visible (only while [`CacheLog::set_observed`] is on).
    Applied(Change),
    /// The answer to a [`CacheLog::scan`].
    Scanned {
        ticket: ReadTicket,
        result: Result<crate::log::ReadBatch, ReadError>,
    },
    /// Replication's answers on the log underneath (see [`LogEvent::Replica`]).
    Replica(crate::log::ReplicaEvent),
}

/// One cache shard on a log, [`Driven`] like [`ShardLog`]: inputs `handle_completion`,
/// `handle_timeout` and `sync_now`, commands `put`, `delete`, `get`, `compact`, outputs
/// `poll_op`, `poll_event` and the log's deadline, drained after every call.
#[derive(Debug)]
pub struct CacheLog {
    log: ShardLog,
    index: HashMap<Box<[u8]>, Slot>,
    live_bytes: u64,
    staged: VecDeque<Staged>,
    gets: HashMap<ReadTicket, u64>,
    /// Range reads for watchers, answered as [`CacheEvent::Scanned`].
    scans: HashSet<ReadTicket>,
    events: VecDeque<CacheEvent>,
    failed: bool,
    /// Writes below this are applied to the index (the last durable mark absorbed).
    applied: u64,
    /// Someone watches this cache: report each applied write.
    observed: bool,
    /// Index entries with an expiry.
    expiring: usize,
}

impl CacheLog {
    pub fn open(id: LogId, dir: String, cfg: LogConfig, now: Instant) -> CacheLog {
        let mut c = CacheLog {
            log: ShardLog::open_replaying(id, dir, cfg, now),
            index: HashMap::new(),
            live_bytes: 0,
            staged: VecDeque::new(),
            gets: HashMap::new(),
            scans: HashSet::new(),
            events: VecDeque::new(),
            failed: false,
            applied: 0,
            observed: false,
            expiring: 0,
        };
        c.absorb();
        c
    }

    // ---- getters ------------------------------------------------------------------------

    pub fn log(&self) -> &ShardLog {
        &self.log
    }

    pub fn is_open(&self) -> bool {
        self.log.is_open() && !self.failed
    }

    /// Live keys (expired ones not yet noticed included).
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Bytes of the entries live keys point at.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// What the key's applied entry counts for in [`CacheLog::live_bytes`]; `None` when
    /// the index holds no entry for it (expired ones not yet noticed count).
    pub fn entry_bytes(&self, key: &[u8]) -> Option<u64> {
        self.index.get(key).map(|s| u64::from(s.bytes))
    }

    /// Every write below this is applied: in the index, visible, and (while observed)
    /// reported. A watch joins live delivery here.
    pub fn applied_offset(&self) -> u64 {
        self.applied
    }

    /// Offsets of the newest puts of live, unexpired keys that `matches` accepts, ascending:
    /// a watch's snapshot of the current state at [`CacheLog::applied_offset`].
    pub fn live_offsets(&self, matches: impl Fn(&[u8]) -> bool, unix_ms: u64) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .index
            .iter()
            .filter(|(k, s)| !s.expired(unix_ms) && matches(k))
            .map(|(_, s)| s.offset)
            .collect();
        out.sort_unstable();
        out
    }

    /// The version (offset of the newest put) of a key's live entry, counting writes
    /// accepted but not durable yet: they become durable in order or not at all, so a
    /// condition checked against them is the one the key will have.
    pub fn current_version(&self, key: &[u8], unix_ms: u64) -> Option<u64> {
        let latest = match self.staged.iter().rev().find(|s| &*s.key == key) {
            Some(s) => s.slot,
            None => self.index.get(key).copied(),
        };
        latest.filter(|s| !s.expired(unix_ms)).map(|s| s.offset)
    }

    /// The version of a key's live, durable entry (what a get reads).
    pub fn durable_version(&self, key: &[u8], unix_ms: u64) -> Option<u64> {
        self.index
            .get(key)
            .filter(|s| !s.expired(unix_ms))
            .map(|s| s.offset)
    }

    /// True when the log holds [`COMPACT_GARBAGE_RATIO`] times its live bytes (and at least
    /// [`COMPACT_MIN_BYTES`]) and no pass is running.
    pub fn compaction_due(&self) -> bool {
        self.is_open() && garbage_heavy(&self.log, self.live_bytes)
    }

    // ---- outputs (file ops and inputs: see `impl Driven`) -------------------------------

    #[must_use]
    pub fn poll_event(&mut self) -> Option<CacheEvent> {
        self.events.pop_front()
    }

    // ---- commands -----------------------------------------------------------------------

    /// Appends a put and returns its offset; it is visible and may be acknowledged once
    /// [`CacheEvent::Durable`] passes it. `unix_micros` is stored as the record's time.
    pub fn put(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &[u8],
        value: Bytes,
        expiry_unix_ms: Option<u64>,
    ) -> Result<u64, AppendError> {
        if key.len() > MAX_CACHE_KEY_BYTES {
            return Err(AppendError::TooLarge(key.len()));
        }
        // A refcount, not a copy: kept until durable in case a watch starts meanwhile.
        let watched = Some(value.clone());
        let payload = CacheRecord::Put {
            key: Bytes::copy_from_slice(key),
            value,
            expiry_unix_ms,
        }
        .encode();
        let bytes = record::entry_len(b"", &[&payload]) as u32;
        let offset = self.append(now, unix_micros, payload)?;
        self.staged.push_back(Staged {
            offset,
            key: key.into(),
            slot: Some(Slot {
                offset,
                expiry_ms: expiry_unix_ms.unwrap_or(0),
                bytes,
            }),
            value: watched,
        });
        self.absorb();
        Ok(offset)
    }

    /// Appends a delete if the key is present (counting writes not yet durable) and returns
    /// its offset; `None` if there was nothing to delete, and nothing is written.
    pub fn delete(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &[u8],
    ) -> Result<Option<u64>, AppendError> {
        let unix_ms = unix_micros / 1000;
        let latest = match self.staged.iter().rev().find(|s| &*s.key == key) {
            Some(s) => s.slot,
            None => self.index.get(key).copied(),
        };
        if latest.is_none_or(|s| s.expired(unix_ms)) {
            return Ok(None);
        }
        let payload = CacheRecord::Delete {
            key: Bytes::copy_from_slice(key),
        }
        .encode();
        let offset = self.append(now, unix_micros, payload)?;
        self.staged.push_back(Staged {
            offset,
            key: key.into(),
            slot: None,
            value: None,
        });
        self.absorb();
        Ok(Some(offset))
    }

    /// Appends entries a leader's cache log shipped (its `read_framed`), as a follower does:
    /// with [`ShardLog::append_framed_with_gaps`], since a compacted log's offsets jump.
    /// Their writes become visible as this cache's own do, once durable, in offset order.
    /// Returns the log's new next offset.
    pub fn append_shipped(
        &mut self,
        now: Instant,
        base: u64,
        entries: Bytes,
    ) -> Result<u64, AppendError> {
        // Recovery's entries go to the index first, so what is replayed below is this batch.
        self.absorb();
        let r = self.log.append_framed_with_gaps(now, base, entries);
        while let Some(entry) = self.log.take_replayed() {
            for (offset, payload) in entry_records(&entry) {
                match self.decode_write(offset, payload) {
                    Some(staged) => self.staged.push_back(staged),
                    None => break,
                }
            }
        }
        self.absorb();
        r
    }

    /// Reports every applied write as [`CacheEvent::Applied`] while on.
    pub fn set_observed(&mut self, on: bool) {
        self.observed = on;
    }

    /// Reads stored records from `from` on (as [`ShardLog::read`]), answered as
    /// [`CacheEvent::Scanned`]: how a watch replays history and reads its snapshot.
    pub fn scan(
        &mut self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<ReadTicket, ReadError> {
        if !self.is_open() {
            return Err(ReadError::NotOpen);
        }
        let ticket = self.log.read(from, max_records, max_bytes)?;
        self.scans.insert(ticket);
        self.absorb();
        Ok(ticket)
    }

    /// Looks a key up at `unix_ms`. A present key is read from the log.
    pub fn get(&mut self, key: &[u8], unix_ms: u64) -> Result<Lookup, ReadError> {
        if !self.is_open() {
            return Err(ReadError::NotOpen);
        }
        let Some(slot) = self.index.get(key).copied() else {
            return Ok(Lookup::Absent);
        };
        if slot.expired(unix_ms) {
            // Left in the index for the expiry pass, which writes its delete.
            return Ok(Lookup::Absent);
        }
        let ticket = self.log.read(slot.offset, 1, 0)?;
        self.gets.insert(ticket, slot.offset);
        self.absorb();
        Ok(Lookup::Pending(ticket))
    }

    /// Keys in the index with an expiry (expired or not): the expiry pass has work while
    /// this is not zero.
    pub fn expiring(&self) -> usize {
        self.expiring
    }

    /// Writes a delete for up to `max` keys whose TTL has passed at `unix_micros` and that
    /// no accepted write has replaced since: an expiry becomes a change in the log, which
    /// watchers receive as a delete and compaction drops. Returns how many were written.
    pub fn expire_due(
        &mut self,
        now: Instant,
        unix_micros: u64,
        max: usize,
    ) -> Result<usize, AppendError> {
        let unix_ms = unix_micros / 1000;
        if self.expiring == 0 || !self.is_open() {
            return Ok(0);
        }
        // Oldest expiry first (then by key): the order must not depend on the hash map's,
        // or a replay of the same inputs would write the deletes at different offsets.
        let mut due: Vec<(u64, Box<[u8]>)> = self
            .index
            .iter()
            .filter(|(k, s)| s.expired(unix_ms) && !self.staged.iter().any(|st| st.key == **k))
            .map(|(k, s)| (s.expiry_ms, k.clone()))
            .collect();
        due.sort_unstable();
        let due: Vec<Box<[u8]>> = due.into_iter().take(max).map(|(_, k)| k).collect();
        for key in &due {
            let payload = CacheRecord::Delete {
                key: Bytes::copy_from_slice(key),
            }
            .encode();
            let offset = self.append(now, unix_micros, payload)?;
            self.staged.push_back(Staged {
                offset,
                key: key.clone(),
                slot: None,
                value: None,
            });
        }
        self.absorb();
        Ok(due.len())
    }

    /// Drops up to `max` expired keys from the index (lazy expiry covers the rest). Writes
    /// nothing: the records stay expired after a restart and compaction drops them.
    pub fn sweep_expired(&mut self, unix_ms: u64, max: usize) -> usize {
        let dead: Vec<Box<[u8]>> = self
            .index
            .iter()
            .filter(|(_, s)| s.expired(unix_ms))
            .map(|(k, _)| k.clone())
            .take(max)
            .collect();
        for k in &dead {
            self.forget(k);
        }
        dead.len()
    }

    /// Starts a compaction pass at `unix_ms`: expired keys are dropped, and the sealed
    /// segments are rewritten with only each live key's newest put. False if nothing is
    /// sealed or a pass is running.
    pub fn compact(&mut self, unix_ms: u64) -> bool {
        if !self.is_open() {
            return false;
        }
        self.sweep_expired(unix_ms, usize::MAX);
        let mut keep: Vec<u64> = self.index.values().map(|s| s.offset).collect();
        keep.sort_unstable();
        let started = self.log.compact(keep);
        self.absorb();
        started
    }

    // ---- internals ----------------------------------------------------------------------

    fn append(
        &mut self,
        now: Instant,
        unix_micros: u64,
        payload: Bytes,
    ) -> Result<u64, AppendError> {
        let payloads = [payload];
        let batch = Batch {
            time_us: unix_micros,
            publisher: None,
            payloads: &payloads,
        };
        let r = self.log.append(now, batch);
        self.absorb();
        r
    }

    fn forget(&mut self, key: &[u8]) {
        if let Some(old) = self.index.remove(key) {
            self.live_bytes -= u64::from(old.bytes);
            self.expiring -= usize::from(old.expiry_ms != 0);
        }
    }

    fn set(&mut self, key: Box<[u8]>, slot: Option<Slot>) {
        match slot {
            Some(slot) => {
                self.live_bytes += u64::from(slot.bytes);
                self.expiring += usize::from(slot.expiry_ms != 0);
                if let Some(old) = self.index.insert(key, slot) {
                    self.live_bytes -= u64::from(old.bytes);
                    self.expiring -= usize::from(old.expiry_ms != 0);
                }
            }
            None => self.forget(&key),
        }
    }

    fn fail(&mut self, e: StorageError) {
        if !self.failed {
            self.failed = true;
            self.events.push_back(CacheEvent::Failed(e));
        }
    }

    /// Replays one recovered entry into the index.
    fn replay(&mut self, entry: DecodedEntry) {
        for (offset, payload) in entry_records(&entry) {
            let Some(w) = self.decode_write(offset, payload) else {
                return;
            };
            self.set(w.key, w.slot);
        }
    }

    /// The write a stored record holds; a record that is not one fails the cache.
    fn decode_write(&mut self, offset: u64, payload: &Bytes) -> Option<Staged> {
        let w = match CacheRecord::decode(payload) {
            Ok(CacheRecord::Put {
                key,
                value,
                expiry_unix_ms,
            }) => Staged {
                offset,
                key: key[..].into(),
                slot: Some(Slot {
                    offset,
                    expiry_ms: expiry_unix_ms.unwrap_or(0),
                    bytes: record::entry_len(b"", &[payload]) as u32,
                }),
                value: Some(value),
            },
            Ok(CacheRecord::Delete { key }) => Staged {
                offset,
                key: key[..].into(),
                slot: None,
                value: None,
            },
            Err(why) => {
                let e = StorageError::Corrupt {
                    path: self.log.dir().to_owned(),
                    pos: 0,
                    what: format!("record {offset} is {why}"),
                };
                self.fail(e);
                return None;
            }
        };
        Some(w)
    }

    /// Takes in whatever the log did.
    fn absorb(&mut self) {
        while let Some(entry) = self.log.take_replayed() {
            self.replay(entry);
        }
        // A shipped entry's records come through `take_replayed`; its metadata is not needed.
        while self.log.take_appended().is_some() {}
        while let Some(ev) = self.log.poll_event() {
            match ev {
                LogEvent::Opened { next_offset, .. } => {
                    self.applied = self.log.durable_offset();
                    if !self.failed {
                        let keys = self.index.len();
                        self.events
                            .push_back(CacheEvent::Opened { keys, next_offset });
                    }
                }
                LogEvent::Durable { up_to } => {
                    while self.staged.front().is_some_and(|s| s.offset < up_to) {
                        let s = self.staged.pop_front().expect("checked");
                        if self.observed {
                            self.events.push_back(CacheEvent::Applied(Change {
                                offset: s.offset,
                                key: Bytes::copy_from_slice(&s.key),
                                value: s.value.clone(),
                                expiry_unix_ms: s
                                    .slot
                                    .and_then(|sl| (sl.expiry_ms != 0).then_some(sl.expiry_ms)),
                            }));
                        }
                        self.set(s.key, s.slot);
                    }
                    self.applied = self.applied.max(up_to);
                    self.events.push_back(CacheEvent::Durable { up_to });
                }
                LogEvent::Read { ticket, result } => {
                    if self.scans.remove(&ticket) {
                        self.events
                            .push_back(CacheEvent::Scanned { ticket, result });
                        continue;
                    }
                    let Some(offset) = self.gets.remove(&ticket) else {
                        continue;
                    };
                    let result = result.and_then(|batch| self.value_at(offset, batch));
                    self.events.push_back(CacheEvent::Value { ticket, result });
                }
                LogEvent::Trimmed { start_offset } => {
                    // Retention on a cache log forgets what it removed.
                    let gone: Vec<Box<[u8]>> = self
                        .index
                        .iter()
                        .filter(|(_, s)| s.offset < start_offset)
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in gone {
                        self.forget(&k);
                    }
                }
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

    fn value_at(
        &self,
        offset: u64,
        batch: crate::log::ReadBatch,
    ) -> Result<Option<CachedValue>, ReadError> {
        let wrong = |what: String| {
            ReadError::Failed(StorageError::Corrupt {
                path: self.log.dir().to_owned(),
                pos: 0,
                what,
            })
        };
        let Some(b) = batch.batches.first() else {
            return Err(wrong(format!("record {offset} is missing")));
        };
        if b.first_offset != offset {
            return Err(wrong(format!("record {offset} is missing")));
        }
        match CacheRecord::decode(&b.payloads[0]) {
            Ok(CacheRecord::Put {
                value,
                expiry_unix_ms,
                ..
            }) => Ok(Some(CachedValue {
                value,
                expiry_unix_ms,
                offset,
            })),
            Ok(CacheRecord::Delete { .. }) => Err(wrong(format!("record {offset} is a delete"))),
            Err(why) => Err(wrong(format!("record {offset} is {why}"))),
        }
    }
}

/// Each record of an entry with its offset.
fn entry_records(entry: &DecodedEntry) -> impl Iterator<Item = (u64, &Bytes)> {
    (entry.base..).zip(&entry.payloads)
}

impl Driven for CacheLog {
    fn shard_mut(&mut self) -> &mut ShardLog {
        &mut self.log
    }

    fn after_input(&mut self) {
        self.absorb();
    }
}

#[cfg(test)]
mod tests;
