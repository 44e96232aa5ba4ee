//! The broker's side of durable storage: the records waiting to become durable before they
//! fan out, and the broker's work on log events (see `Broker::process_logs`).
//!
//! The logs and the table that routes file completions to them (and walks the disk at
//! startup) are `felix_storage`'s [`LogTable`]; [`Logs`] is that table plus what the
//! broker keys by its own ids (catch-up reads and readers refused `Busy`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::{Deref, DerefMut};
use std::time::Instant;

use bytes::Bytes;

use felix_storage::cache_log::{CacheEvent, CacheLog};
use felix_storage::layout;
use felix_storage::log::{LogConfig, ReadTicket};
use felix_storage::ops::{FileCompletion, FileOp, LogId};
use felix_storage::table::LogTable;
pub(crate) use felix_storage::table::{AnyEvent, LogState, Owner, TableEvent};

use super::SubscriberId;
use crate::clock::UnixAnchor;

/// Records a catch-up read returns at most, and its payload byte budget.
pub(crate) const CATCH_UP_READ_RECORDS: usize = 1024;
pub(crate) const CATCH_UP_READ_BYTES: usize = 1 << 20;
/// Encoded catch-up frames a subscriber holds before the next read is issued.
pub(crate) const CATCH_UP_FRAMES_AHEAD: usize = 4;

/// How the broker runs its durable shards.
#[derive(Debug, Clone)]
pub(crate) struct DurableSettings {
    pub(crate) log: LogConfig,
    /// Every acknowledged publish is answered once durable, with its offset, whatever the
    /// client offered: false only when the operator chose `ack_before_write`.
    pub(crate) ack_after_write: bool,
    /// Consumer-group limits.
    pub(crate) groups: super::groups::GroupConfig,
}

/// What the engine learns from the logs: when to release answers held for durability, when
/// to re-run requests that met a log still opening, and the values of cache reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    /// The value a cache get (or delete) waited for: `None` if absent or expired.
    Value {
        log: LogId,
        ticket: ReadTicket,
        value: Result<Option<Bytes>, String>,
    },
    /// Every record of this log below `up_to` is durable (on a gated log: committed).
    Durable { log: LogId, up_to: u64 },
    /// A gated log is durable below `up_to` on this node (`replicated.rs`).
    LocalDurable { log: LogId, up_to: u64 },
    /// Quorum publishes on a gated log ending at or below `up_to` timed out.
    TimedOut { log: LogId, up_to: u64 },
    /// A framed read, a truncation or a replica state write finished (`replicated.rs`).
    Replica {
        log: LogId,
        event: felix_storage::log::ReplicaEvent,
    },
    /// The log finished opening (or failed to: then it is also failed).
    Opened { log: LogId },
    /// The log stopped; answers waiting on it are failures.
    Failed { log: LogId },
    /// A group poll's answer, for the session holding `waiter`.
    GroupRecords {
        waiter: u64,
        result: Result<Vec<super::groups::PolledRecord>, super::BrokerError>,
    },
}

/// Why a log will make nothing more durable (see [`Broker::log_gone`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogGone<'a> {
    /// The log stopped on a storage error.
    Failed(&'a str),
    /// Its stream was deleted and the log forgotten.
    Deleted,
}

/// Appended records waiting for durability before live fan-out. The payloads are the
/// publish frame's own bytes (no copy).
#[derive(Debug)]
pub(crate) struct Unreleased {
    pub(crate) first: u64,
    pub(crate) time_us: u64,
    pub(crate) publisher: Option<Box<str>>,
    pub(crate) payloads: Vec<Bytes>,
}

/// The storage side of one durable shard.
#[derive(Debug)]
pub(crate) struct ShardStore {
    pub(crate) log: LogId,
    pub(crate) unreleased: VecDeque<Unreleased>,
    /// Every record below this was handed to live fan-out (or had nobody to go to): the
    /// readable tail, where a `latest` subscriber starts and a catch-up joins live delivery.
    pub(crate) released: u64,
}

impl From<TableEvent> for Notice {
    fn from(e: TableEvent) -> Notice {
        match e {
            TableEvent::Opened { log } => Notice::Opened { log },
            TableEvent::Failed { log } => Notice::Failed { log },
        }
    }
}

/// The storage table with the broker's own bookkeeping beside it. It derefs to the table:
/// everything about logs is the table's; only what names a subscriber lives here.
pub(crate) struct Logs {
    table: LogTable<Notice>,
    /// Every acknowledged publish is answered once durable (see [`DurableSettings`]).
    pub(crate) ack_after_write: bool,
    /// Catch-up reads in flight and whose they are.
    pub(crate) reads: HashMap<(LogId, ReadTicket), SubscriberId>,
    /// Catch-up readers refused `Busy` by a log, retried when one of its reads lands.
    pub(crate) blocked_readers: BTreeMap<LogId, Vec<SubscriberId>>,
    anchor: UnixAnchor,
}

impl Deref for Logs {
    type Target = LogTable<Notice>;
    fn deref(&self) -> &LogTable<Notice> {
        &self.table
    }
}

impl DerefMut for Logs {
    fn deref_mut(&mut self) -> &mut LogTable<Notice> {
        &mut self.table
    }
}

impl Logs {
    /// Starts the walk over the storage root that opens every log already on disk.
    /// `anchor` gives wall-clock time: cache expiry and compaction compare stored Unix
    /// times.
    pub(crate) fn new(settings: DurableSettings, anchor: UnixAnchor) -> Logs {
        Logs {
            table: LogTable::new(settings.log),
            anchor,
            ack_after_write: settings.ack_after_write,
            reads: HashMap::new(),
            blocked_readers: BTreeMap::new(),
        }
    }

    /// Unix milliseconds at `now`.
    pub(crate) fn unix_ms(&self, now: Instant) -> u64 {
        self.anchor.unix_ms(now)
    }

    /// Drops a log (its stream was deleted): its completions in flight are ignored from now
    /// on, and nothing finds it by directory any more.
    pub(crate) fn forget(&mut self, id: LogId) {
        self.table.forget(id);
        self.reads.retain(|(l, _), _| *l != id);
        self.blocked_readers.remove(&id);
    }
}

// ---- the broker's storage work ------------------------------------------------------------

use std::time::Instant as Now;

use felix_proto::message::{ErrorMessage, Message};
use felix_proto::Flags;

use super::encode::{encode_event_batch, BatchView};
use felix_proto::ErrorCode;

use super::{fan_in, mark_ready, seal, Broker, CatchUp, FanOut};
use super::{BrokerError, CacheKey};
use felix_storage::cache_log::{Lookup, MAX_CACHE_KEY_BYTES};
use felix_storage::log::{LogEvent, ReadBatch, ReadError};

/// Rounds of log events handled in one flush; anything left waits for the next turn (and
/// [`Broker::poll_timeout`] asks for that turn at once).
const MAX_LOG_ROUNDS: usize = 8;

impl Broker {
    /// Startup is over: every log found on disk is open (always true in memory).
    pub(crate) fn is_ready(&self) -> bool {
        self.logs.as_ref().is_none_or(|l| l.is_ready())
    }

    /// Why the broker cannot start: a log found on disk could not be opened (corruption
    /// names the file and the byte).
    pub(crate) fn storage_fatal(&self) -> Option<&str> {
        self.logs.as_ref()?.fatal.as_deref()
    }

    /// Every acked publish is answered only once durable, with its offset.
    pub(crate) fn acks_after_write(&self) -> bool {
        self.logs.as_ref().is_some_and(|l| l.ack_after_write)
    }

    /// Records of `log` below this are durable (on a gated log: committed, which is never
    /// past its own durability).
    pub(crate) fn durable_offset(&self, log: LogId) -> u64 {
        let own = self
            .logs
            .as_ref()
            .and_then(|l| l.slot(log))
            .map_or(0, |s| s.log.durable_offset());
        match self.gates.get(&log) {
            Some(g) => g.committed.min(own),
            None => own,
        }
    }

    /// Why nothing more will become durable on `log`, if so: it failed, or it was forgotten
    /// when its stream was deleted (its slot is gone, so no notice will ever name it again).
    pub(crate) fn log_gone(&self, log: LogId) -> Option<LogGone<'_>> {
        let logs = self.logs.as_ref()?;
        match logs.slot(log) {
            None => Some(LogGone::Deleted),
            Some(slot) => match &slot.state {
                LogState::Failed(e) => Some(LogGone::Failed(e)),
                _ => None,
            },
        }
    }

    /// Feeds a finished file op to the log that issued it.
    pub(crate) fn handle_file_completion(&mut self, now: Now, c: FileCompletion) {
        if let Some(logs) = self.logs.as_mut() {
            logs.handle_completion(now, c);
        }
    }

    /// The next file op for the runtime.
    #[must_use]
    pub(crate) fn poll_file_op(&mut self) -> Option<FileOp> {
        self.logs.as_mut()?.poll_op()
    }

    /// What the engine must act on: answers to release, requests to re-run.
    #[must_use]
    pub(crate) fn poll_notice(&mut self) -> Option<Notice> {
        self.logs.as_mut()?.notices.pop_front()
    }

    /// Logs with events not handled yet: call [`Broker::flush`] again.
    pub(crate) fn has_storage_work(&self) -> bool {
        self.logs.as_ref().is_some_and(|l| l.has_dirty())
    }

    /// Syncs every log (a graceful stop); [`Broker::storage_idle`] says when it is done.
    pub(crate) fn begin_storage_shutdown(&mut self) {
        if let Some(logs) = self.logs.as_mut() {
            logs.begin_shutdown();
        }
    }

    pub(crate) fn storage_idle(&self) -> bool {
        self.logs.as_ref().is_none_or(|l| l.is_idle())
    }

    /// Bytes in every log's segment files (a metrics gauge; walks every log).
    pub(crate) fn log_bytes(&self) -> u64 {
        let Some(logs) = self.logs.as_ref() else {
            return 0;
        };
        logs.slots().map(|s| s.log.shard().total_bytes()).sum()
    }

    /// Handles the events of every log touched this turn.
    pub(super) fn process_logs(&mut self, now: Now) {
        self.retry_reloads(now);
        for _ in 0..MAX_LOG_ROUNDS {
            let Some(logs) = self.logs.as_mut() else {
                return;
            };
            let dirty = logs.take_dirty();
            if dirty.is_empty() {
                return;
            }
            let mut events = Vec::new();
            for &id in &dirty {
                logs.collect_ops(id);
                if let Some(slot) = logs.slot_mut(id) {
                    while let Some(ev) = slot.log.poll_event() {
                        events.push((id, ev));
                    }
                }
            }
            // Recovery's producer marks and commit state go to the shard as they are read.
            for id in dirty {
                self.absorb_scanned(id);
            }
            for (id, ev) in events {
                self.on_log_event(now, id, ev);
            }
        }
    }

    fn on_log_event(&mut self, now: Now, id: LogId, ev: AnyEvent) {
        let ev = match ev {
            AnyEvent::Stream(ev) => ev,
            AnyEvent::Cache(ev) => return self.on_cache_event(now, id, ev),
            AnyEvent::Group(ev) => return self.on_group_log_event(now, id, ev),
        };
        let logs = self.logs.as_mut().expect("called with logs");
        match ev {
            LogEvent::Opened {
                start_offset,
                next_offset,
                truncated_bytes,
            } => {
                logs.opened(id, Ok(()));
                let slot = logs.slot(id).expect("live");
                if truncated_bytes > 0 {
                    // A crash cut an append short; that record was never acknowledged.
                    tracing::warn!(
                        dir = slot.log.shard().dir(),
                        truncated_bytes,
                        next_offset,
                        "recovery cut a torn tail"
                    );
                } else {
                    tracing::debug!(
                        dir = slot.log.shard().dir(),
                        start_offset,
                        next_offset,
                        "log open"
                    );
                }
                let durable = slot.log.durable_offset();
                // Gated already (led here before it opened): only the committed part is served.
                let released = self
                    .gates
                    .get(&id)
                    .map_or(durable, |g| durable.min(g.committed));
                if let Owner::Stream { stream, shard } = slot.owner {
                    if let Some(store) = self.streams[stream].shards[shard as usize].store.as_mut()
                    {
                        store.released = released;
                    }
                }
            }
            LogEvent::Durable { up_to } if self.gates.contains_key(&id) => {
                logs.notices
                    .push_back(Notice::LocalDurable { log: id, up_to });
            }
            LogEvent::Durable { up_to } => {
                logs.notices.push_back(Notice::Durable { log: id, up_to });
                // A leadership here ended: what it wrote past its commit mark may be cut
                // by the next leader, so no subscriber sees it.
                let committed = self.last_retired(id).map_or(u64::MAX, |g| g.committed);
                self.release(id, up_to.min(committed));
            }
            LogEvent::Read { ticket, result } => {
                // A `stream_read` or `offset_for_time` page (`reads.rs`) takes its own.
                let result = self.on_page_read(id, ticket, result);
                let logs = self.logs.as_mut().expect("called with logs");
                let reader = logs.reads.remove(&(id, ticket));
                // A read landed: readers refused `Busy` may go now.
                let blocked = logs.blocked_readers.remove(&id).unwrap_or_default();
                match (reader, result) {
                    (Some(reader), Some(result)) => self.on_catch_up_read(reader, result),
                    (None, Some(result)) => self.on_group_read(id, ticket, result),
                    (_, None) => {}
                }
                for b in blocked {
                    self.advance_catch_up(b);
                }
                self.retry_group_reads(id);
            }
            LogEvent::Trimmed { start_offset } => {
                tracing::debug!(log = id.0, start_offset, "retention removed old segments");
            }
            LogEvent::Compacted {
                bytes_before,
                bytes_after,
            } => tracing::debug!(log = id.0, bytes_before, bytes_after, "compacted"),
            LogEvent::CompactionFailed(e) => {
                tracing::warn!(log = id.0, error = %e, "compaction failed; the log goes on")
            }
            LogEvent::Replica(event) => logs.notices.push_back(Notice::Replica { log: id, event }),
            LogEvent::Failed(e) => {
                logs.failed(id, e.to_string());
                // What was waiting to be durable never will be: it never fans out.
                if let Some(Owner::Stream { stream, shard }) = logs.slot(id).map(|s| s.owner) {
                    if let Some(store) = self.streams[stream].shards[shard as usize].store.as_mut()
                    {
                        store.unreleased.clear();
                    }
                }
            }
        }
    }

    /// Records of `log` below `up_to` are durable: they join the shard's open batch for
    /// live fan-out, and the released tail moves up.
    pub(super) fn release(&mut self, log: LogId, up_to: u64) {
        let owner = self
            .logs
            .as_ref()
            .and_then(|l| l.slot(log))
            .map(|s| s.owner);
        let Some(Owner::Stream { stream, shard }) = owner else {
            return;
        };
        let limits = (
            self.cfg.event_batch_max_records,
            self.cfg.event_batch_max_bytes,
        );
        let sh = &mut self.streams[stream].shards[shard as usize];
        let Some(store) = sh.store.as_mut() else {
            return;
        };
        let prev = store.released;
        // Records this release covers that were never queued for fan-out: appended as a
        // follower, or adopted from another copy while fencing, then committed under this
        // node's leadership. Live readers take them from the log: they go back to catching up
        // from the old tail (joining live again once level), ahead of anything fanned in here.
        let hole = up_to > prev && store.unreleased.front().is_none_or(|f| f.first > prev);
        let mut unreleased = std::mem::take(&mut store.unreleased);
        store.released = store.released.max(up_to);
        let mut fan = FanOut {
            subscribers: &mut self.subscribers,
            ready: &mut self.ready,
            stats: &mut self.stats,
            budget: &mut self.event_budget,
        };
        let mut rewound = Vec::new();
        if hole && !sh.subscribers.is_empty() {
            sh.dirty = false;
            seal(sh, &mut fan);
            for id in std::mem::take(&mut sh.subscribers) {
                if let Some(sub) = fan.subscribers.get_mut(&id) {
                    sub.catch_up = Some(CatchUp {
                        log,
                        next: prev,
                        reading: false,
                        joined: false,
                        frames: VecDeque::new(),
                        failed: None,
                    });
                    rewound.push(id);
                }
            }
        }
        while let Some(front) = unreleased.front_mut() {
            if front.first >= up_to {
                break;
            }
            let count = front.payloads.len() as u64;
            let done = if front.first + count <= up_to {
                unreleased.pop_front().expect("front exists")
            } else {
                // Entries are written whole, so this split is only defensive.
                let k = (up_to - front.first) as usize;
                let rest = front.payloads.split_off(k);
                let first = front.first;
                front.first = up_to;
                Unreleased {
                    first,
                    time_us: front.time_us,
                    publisher: front.publisher.clone(),
                    payloads: std::mem::replace(&mut front.payloads, rest),
                }
            };
            if !sh.subscribers.is_empty() {
                fan_in(
                    sh,
                    done.first,
                    done.payloads,
                    done.time_us,
                    done.publisher.as_deref(),
                    limits,
                    &mut fan,
                );
            }
        }
        sh.store.as_mut().expect("checked").unreleased = unreleased;
        if !sh.open.payloads.is_empty() && !sh.dirty {
            sh.dirty = true;
            self.dirty.push((stream, shard));
        }
        // Consumer groups waiting on this shard have new work.
        self.wake_group_polls(stream, shard);
        for id in rewound {
            self.advance_catch_up(id);
        }
    }

    /// Moves a catch-up along: joins live delivery once it has reached the shard's released
    /// tail, else reads the next stretch of the log while few frames are left.
    pub(super) fn advance_catch_up(&mut self, id: SubscriberId) {
        // Twice at most: a read refused as trimmed moves `next` up and tries once more.
        for _ in 0..2 {
            let Some(sub) = self.subscribers.get_mut(&id) else {
                return;
            };
            let (stream, shard) = (sub.stream, sub.shard);
            let Some(cu) = sub.catch_up.as_mut() else {
                return;
            };
            if cu.joined
                || cu.reading
                || cu.failed.is_some()
                || cu.frames.len() >= CATCH_UP_FRAMES_AHEAD
            {
                return;
            }
            let released = self.streams[stream].shards[shard as usize]
                .store
                .as_ref()
                .map_or(0, |s| s.released);
            if cu.next >= released {
                // Every record below the tail is replayed; from here on live fan-out brings
                // the rest. Seal first: the open batch holds records the replay covered.
                cu.joined = true;
                sub.detached = false;
                let mut fan = FanOut {
                    subscribers: &mut self.subscribers,
                    ready: &mut self.ready,
                    stats: &mut self.stats,
                    budget: &mut self.event_budget,
                };
                let sh = &mut self.streams[stream].shards[shard as usize];
                seal(sh, &mut fan);
                sh.subscribers.push(id);
                return;
            }
            let (log, next) = (cu.log, cu.next);
            let logs = self.logs.as_mut().expect("catch-up only on durable shards");
            let Some(slot) = logs.slot_mut(log) else {
                return;
            };
            let Some(shard_log) = slot.log.stream_mut() else {
                return;
            };
            match shard_log.read(next, CATCH_UP_READ_RECORDS, CATCH_UP_READ_BYTES) {
                Ok(ticket) => {
                    logs.reads.insert((log, ticket), id);
                    logs.mark_dirty(log);
                    cu.reading = true;
                    return;
                }
                Err(ReadError::Trimmed { oldest, .. }) => {
                    // Retention went past the cursor: skip to what is left (the jump shows
                    // in the offsets).
                    cu.next = cu.next.max(oldest);
                }
                Err(ReadError::Busy) => {
                    logs.blocked_readers.entry(log).or_default().push(id);
                    return;
                }
                Err(ReadError::NotOpen) => {
                    cu.failed = Some(error_frame("the shard's log is not open"));
                    mark_ready(id, sub, &mut self.ready);
                    return;
                }
                Err(ReadError::Failed(e)) => {
                    cu.failed = Some(error_frame(&format!("reading the log failed: {e}")));
                    mark_ready(id, sub, &mut self.ready);
                    return;
                }
            }
        }
    }

    /// A catch-up read landed: its records below the released tail become frames.
    fn on_catch_up_read(&mut self, id: SubscriberId, result: Result<ReadBatch, ReadError>) {
        let max_records = self.cfg.event_batch_max_records;
        let max_bytes = self.cfg.event_batch_max_bytes;
        let Some(sub) = self.subscribers.get_mut(&id) else {
            return;
        };
        let released = self.streams[sub.stream].shards[sub.shard as usize]
            .store
            .as_ref()
            .map_or(0, |s| s.released);
        let flags = sub
            .wants
            .intersection(Flags::EVENT_BATCH_OFFSETS.union(Flags::EVENT_BATCH_TIMESTAMPS));
        let Some(cu) = sub.catch_up.as_mut() else {
            return;
        };
        cu.reading = false;
        match result {
            Ok(batch) => {
                let before = cu.next;
                for stored in batch.batches {
                    let mut chunk: Vec<Bytes> = Vec::new();
                    let mut chunk_base = stored.first_offset;
                    let mut chunk_bytes = 0;
                    for (at, payload) in (stored.first_offset..).zip(stored.payloads) {
                        if at < cu.next || at >= released {
                            continue;
                        }
                        let full = chunk.len() >= max_records
                            || (!chunk.is_empty() && chunk_bytes + payload.len() > max_bytes);
                        if full {
                            let done = std::mem::take(&mut chunk);
                            cu.frames.push_back(replay_frame(
                                flags,
                                chunk_base,
                                stored.time_us,
                                &done,
                            ));
                            chunk_bytes = 0;
                        }
                        if chunk.is_empty() {
                            chunk_base = at;
                        }
                        chunk_bytes += payload.len();
                        chunk.push(payload);
                        cu.next = at + 1;
                    }
                    if !chunk.is_empty() {
                        cu.frames.push_back(replay_frame(
                            flags,
                            chunk_base,
                            stored.time_us,
                            &chunk,
                        ));
                    }
                }
                cu.next = cu.next.max(batch.next_offset.min(released));
                if cu.next == before {
                    // Nothing readable below the tail: should not happen (the tail is
                    // durable); join rather than wait for ever.
                    tracing::warn!(next = cu.next, released, "catch-up read made no progress");
                    cu.next = released;
                }
            }
            Err(ReadError::Trimmed { oldest, .. }) => cu.next = cu.next.max(oldest),
            Err(e) => {
                let why = match e {
                    ReadError::Failed(e) => format!("reading the log failed: {e}"),
                    other => format!("reading the log failed: {other:?}"),
                };
                cu.failed = Some(error_frame(&why));
            }
        }
        mark_ready(id, sub, &mut self.ready);
        self.advance_catch_up(id);
    }
}

/// One replayed event batch, encoded for this subscriber alone.
fn replay_frame(flags: Flags, base_offset: u64, time_us: u64, payloads: &[Bytes]) -> Bytes {
    let times = if flags.contains(Flags::EVENT_BATCH_TIMESTAMPS) {
        vec![time_us; payloads.len()]
    } else {
        Vec::new()
    };
    encode_event_batch(
        flags,
        &BatchView {
            base_offset,
            publisher: None,
            times: &times,
            payloads,
        },
    )
}

/// A JSON `error` that ends an event stream whose replay cannot go on.
fn error_frame(message: &str) -> Bytes {
    let mut out = Vec::new();
    Message::Error(ErrorMessage::coded(ErrorCode::Storage, message)).encode_frame_into(&mut out);
    Bytes::from(out)
}

/// The answer to a cache get or delete: known now, or once the log has read the value
/// (`ticket`) and, for a delete, made the delete durable (`durable_at`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CacheAnswer {
    Now(Option<Bytes>),
    Later {
        log: LogId,
        ticket: Option<ReadTicket>,
        durable_at: Option<u64>,
    },
}

impl CacheAnswer {
    /// The value of an answer known now (tests of the in-memory cache).
    #[cfg(test)]
    pub(crate) fn now(self) -> Option<Bytes> {
        match self {
            CacheAnswer::Now(v) => v,
            CacheAnswer::Later { .. } => panic!("answer not known yet"),
        }
    }
}

fn read_failure(e: &ReadError) -> String {
    match e {
        ReadError::Failed(e) => format!("reading the cache log failed: {e}"),
        ReadError::NotOpen => "the cache log is not open".into(),
        ReadError::Busy => "too many cache reads are in flight".into(),
        ReadError::Trimmed { .. } => "the value was removed from the log".into(),
    }
}

impl Broker {
    pub(super) fn cache_sizes(&self, k: &str, value: &Bytes) -> Result<(), BrokerError> {
        let limit = |what: &str, n: usize, max: usize, name: &str| {
            BrokerError::new(
                ErrorCode::LimitExceeded,
                format!("cache {what} of {n} bytes exceeds {name} ({max})"),
            )
        };
        let max_key = self.cfg.cache_max_key_bytes.min(MAX_CACHE_KEY_BYTES);
        if k.len() > max_key {
            return Err(limit("key", k.len(), max_key, "cache_max_key_bytes"));
        }
        if value.len() > self.cfg.cache_max_value_bytes {
            let max = self.cfg.cache_max_value_bytes;
            return Err(limit("value", value.len(), max, "cache_max_value_bytes"));
        }
        Ok(())
    }

    /// The cache's log, open; `None` when no such cache was ever written (and `create` is
    /// false). A log still opening stalls the request.
    pub(super) fn cache_log(
        &mut self,
        now: Now,
        key: &CacheKey,
        create: bool,
    ) -> Result<Option<LogId>, BrokerError> {
        let logs = self.logs.as_mut().expect("durable");
        let dir = layout::cache_shard_dir(&key.tenant, &key.namespace, &key.cache, key.shard);
        if let (None, Some(retiring)) = (
            logs.find(&dir),
            logs.retiring_blocks(&super::delete::parent_dir(&dir)),
        ) {
            // Deleted a moment ago: a new log must not open the old files (`delete.rs`).
            return Err(BrokerError::opening(retiring));
        }
        let log = match (logs.find(&dir), create) {
            (Some(log), _) => log,
            (None, true) => logs.claim(dir, Owner::Cache, now),
            (None, false) => return Ok(None),
        };
        match &logs.slot(log).expect("live").state {
            LogState::Opening => Err(BrokerError::opening(log)),
            LogState::Failed(e) => {
                Err(BrokerError::storage(format!("the cache's log failed: {e}")))
            }
            LogState::Open => Ok(Some(log)),
        }
    }

    pub(super) fn cache_of(&mut self, log: LogId) -> Result<&mut CacheLog, BrokerError> {
        let logs = self.logs.as_mut().expect("durable");
        logs.mark_dirty(log);
        logs.slot_mut(log)
            .and_then(|s| s.log.cache_mut())
            .ok_or_else(|| BrokerError::storage("not a cache log"))
    }

    pub(super) fn log_cache_put(
        &mut self,
        now: Now,
        unix_micros: u64,
        key: &CacheKey,
        k: &str,
        value: Bytes,
        ttl_ms: Option<u64>,
    ) -> Result<(LogId, u64), BrokerError> {
        self.cache_sizes(k, &value)?;
        let write = super::cache::DurableWrite::Put {
            key: k,
            value_len: value.len(),
        };
        let log = self.durable_log_for(now, key, super::cache::DurableKind::Cache, write)?;
        // TTL is an absolute Unix time in the record: it means the same after a restart.
        let expiry = ttl_ms.and_then(|ms| (unix_micros / 1000).checked_add(ms));
        let offset = self
            .cache_of(log)?
            .put(now, unix_micros, k.as_bytes(), value, expiry)
            .map_err(super::append_error)?;
        self.stats.cache_puts += 1;
        if expiry.is_some() {
            self.arm_cache_expiry(now);
        }
        Ok((log, offset + 1))
    }

    pub(super) fn log_cache_get(
        &mut self,
        now: Now,
        unix_micros: u64,
        key: &CacheKey,
        k: &str,
    ) -> Result<CacheAnswer, BrokerError> {
        let Some(log) = self.cache_log(now, key, false)? else {
            self.stats.cache_misses += 1;
            return Ok(CacheAnswer::Now(None));
        };
        let lookup = self
            .cache_of(log)?
            .get(k.as_bytes(), unix_micros / 1000)
            .map_err(|e| BrokerError::storage(read_failure(&e)))?;
        Ok(match lookup {
            Lookup::Absent => {
                self.stats.cache_misses += 1;
                CacheAnswer::Now(None)
            }
            Lookup::Pending(ticket) => {
                self.stats.cache_hits += 1;
                CacheAnswer::Later {
                    log,
                    ticket: Some(ticket),
                    durable_at: None,
                }
            }
        })
    }

    pub(super) fn log_cache_delete(
        &mut self,
        now: Now,
        unix_micros: u64,
        key: &CacheKey,
        k: &str,
    ) -> Result<CacheAnswer, BrokerError> {
        self.stats.cache_deletes += 1;
        let Some(log) = self.cache_log(now, key, false)? else {
            return Ok(CacheAnswer::Now(None));
        };
        let cache = self.cache_of(log)?;
        // The value it held is read first; the delete is answered with it once durable.
        let lookup = cache
            .get(k.as_bytes(), unix_micros / 1000)
            .map_err(|e| BrokerError::storage(read_failure(&e)))?;
        let deleted = cache
            .delete(now, unix_micros, k.as_bytes())
            .map_err(super::append_error)?;
        Ok(match (lookup, deleted) {
            (_, None) => CacheAnswer::Now(None),
            (Lookup::Absent, Some(offset)) => CacheAnswer::Later {
                log,
                ticket: None,
                durable_at: Some(offset + 1),
            },
            (Lookup::Pending(ticket), Some(offset)) => CacheAnswer::Later {
                log,
                ticket: Some(ticket),
                durable_at: Some(offset + 1),
            },
        })
    }

    fn on_cache_event(&mut self, now: Now, id: LogId, ev: CacheEvent) {
        // What the log holds may have changed: the durable-cache limits count it.
        self.note_durable_usage(id);
        // Hooks for cache watches (`watch.rs`): changes, their reads, compaction held off
        // while one reads, and a failed log ending them.
        let ev = match ev {
            CacheEvent::Applied(change) => return self.on_watch_change(id, change),
            CacheEvent::Scanned { ticket, result } => {
                return self.on_watch_read(id, ticket, result)
            }
            CacheEvent::Failed(e) => {
                self.on_watch_log_failed(id, &e.to_string());
                CacheEvent::Failed(e)
            }
            ev => ev,
        };
        let watch_reading = self.watches_hold_compaction(id);
        let logs = self.logs.as_mut().expect("called with logs");
        match ev {
            CacheEvent::Opened { keys, next_offset } => {
                tracing::debug!(log = id.0, keys, next_offset, "cache log open");
                logs.opened(id, Ok(()));
                let expiring = logs
                    .slot_mut(id)
                    .and_then(|s| s.log.cache_mut())
                    .is_some_and(|c| c.expiring() > 0);
                if expiring {
                    self.arm_cache_expiry(now);
                }
            }
            CacheEvent::Durable { up_to } => {
                // A replicated cache led here counts its own durability toward the commit
                // mark, as a shard's log does (`replicated.rs`).
                let notice = if self.gates.contains_key(&id) {
                    Notice::LocalDurable { log: id, up_to }
                } else {
                    Notice::Durable { log: id, up_to }
                };
                logs.notices.push_back(notice);
                let unix_ms = logs.unix_ms(now);
                if let Some(c) = logs.slot_mut(id).and_then(|s| s.log.cache_mut()) {
                    if !watch_reading && c.compaction_due() && c.compact(unix_ms) {
                        logs.mark_dirty(id);
                    }
                } else if let Some(c) = logs.slot_mut(id).and_then(|s| s.log.counter_mut()) {
                    if c.compaction_due() && c.compact() {
                        logs.mark_dirty(id);
                    }
                }
            }
            CacheEvent::Value { ticket, result } => {
                let value = result
                    .map(|v| v.map(|v| v.value))
                    .map_err(|e| read_failure(&e));
                logs.notices.push_back(Notice::Value {
                    log: id,
                    ticket,
                    value,
                });
            }
            CacheEvent::Compacted {
                bytes_before,
                bytes_after,
            } => tracing::debug!(log = id.0, bytes_before, bytes_after, "cache compacted"),
            CacheEvent::CompactionFailed(e) => {
                tracing::warn!(log = id.0, error = %e, "cache compaction failed; the log goes on")
            }
            CacheEvent::Failed(e) => logs.failed(id, e.to_string()),
            CacheEvent::Replica(event) => {
                logs.notices.push_back(Notice::Replica { log: id, event })
            }
            // Taken by the watches above.
            CacheEvent::Applied(_) | CacheEvent::Scanned { .. } => {}
        }
    }
}
