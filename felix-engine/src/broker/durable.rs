//! The broker's side of durable storage: one log per durable shard, the table that routes
//! file completions to them, the records waiting to become durable before they fan out, and
//! the startup walk that finds the logs already on disk.
//!
//! The logs themselves ([`ShardLog`]) are state machines over file operations; this module
//! only owns them, multiplexes their operations by [`LogId`] and turns their events into
//! broker work (see `Broker::process_logs` in the parent module).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use bytes::Bytes;

use crate::storage::layout;
use crate::storage::log::{LogConfig, ReadTicket, ShardLog};
use crate::storage::ops::{
    FileCompletion, FileErrorKind, FileOp, FileOpKind, FileOutput, LogId, OpId,
};

use super::SubscriberId;

/// Records a catch-up read returns at most, and its payload byte budget.
pub(crate) const CATCH_UP_READ_RECORDS: usize = 1024;
pub(crate) const CATCH_UP_READ_BYTES: usize = 1 << 20;
/// Encoded catch-up frames a subscriber holds before the next read is issued.
pub(crate) const CATCH_UP_FRAMES_AHEAD: usize = 4;

/// The startup walk's own id: logs are numbered from 1.
const DISCOVERY: LogId = LogId(0);
/// Directory depth below `streams/` of a shard directory: tenant / namespace / stream / shard.
const SHARD_DEPTH: usize = 4;
/// Top-level directory of stream logs under the storage root.
pub(crate) const STREAMS_DIR: &str = "streams";

/// How the broker runs its durable shards.
#[derive(Debug, Clone)]
pub(crate) struct DurableSettings {
    pub(crate) log: LogConfig,
    /// Every acknowledged publish is answered once durable, with its offset, whatever the
    /// client offered (`FELIX_ACK_ON_COMMIT`, or the `on_commit` fsync mode).
    pub(crate) ack_after_write: bool,
}

/// Where a log is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LogState {
    Opening,
    Open,
    /// Open failed, or a write did; the message names the file.
    Failed(String),
}

/// What a log holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Found on disk at startup; no stream has used it since.
    Unclaimed,
    /// Shard `shard` of stream number `stream`.
    Stream { stream: usize, shard: u32 },
}

/// What the engine learns from the logs: when to release answers held for durability and
/// when to re-run requests that met a log still opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notice {
    /// Every record of this log below `up_to` is durable.
    Durable { log: LogId, up_to: u64 },
    /// The log finished opening (or failed to: then it is also failed).
    Opened { log: LogId },
    /// The log stopped; answers waiting on it are failures.
    Failed { log: LogId },
}

pub(crate) struct LogSlot {
    pub(crate) log: ShardLog,
    pub(crate) owner: Owner,
    pub(crate) state: LogState,
    /// Opened by the startup walk: failing to open stops the broker from starting.
    pub(crate) startup: bool,
    /// Its deadline in [`Logs::timers`].
    timer: Option<Instant>,
    dirty: bool,
    /// Catch-up readers refused `Busy`, retried when one of its reads lands.
    pub(crate) blocked_readers: Vec<SubscriberId>,
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

/// Every log, routed by id, and the queues between them and the engine.
pub(crate) struct Logs {
    pub(crate) settings: DurableSettings,
    slots: Vec<Option<LogSlot>>,
    /// Logs by directory: a stream created on first use claims the one found at startup.
    by_dir: HashMap<String, LogId>,
    dirty: Vec<LogId>,
    timers: BTreeSet<(Instant, LogId)>,
    ops: VecDeque<FileOp>,
    pub(crate) notices: VecDeque<Notice>,
    /// Catch-up reads in flight and whose they are.
    pub(crate) reads: HashMap<(LogId, ReadTicket), SubscriberId>,
    discovery: Discovery,
    /// Startup logs not open yet.
    startup_opening: usize,
    /// Why the broker cannot start (a startup log is corrupt or unreadable).
    pub(crate) fatal: Option<String>,
    shutting_down: bool,
}

impl Logs {
    /// Starts the walk over the storage root that opens every log already on disk.
    pub(crate) fn new(settings: DurableSettings) -> Logs {
        let mut logs = Logs {
            settings,
            slots: Vec::new(),
            by_dir: HashMap::new(),
            dirty: Vec::new(),
            timers: BTreeSet::new(),
            ops: VecDeque::new(),
            notices: VecDeque::new(),
            reads: HashMap::new(),
            discovery: Discovery::default(),
            startup_opening: 0,
            fatal: None,
            shutting_down: false,
        };
        let op = logs.discovery.list(STREAMS_DIR.to_owned(), 0);
        logs.ops.push_back(op);
        logs
    }

    /// Startup is over: every log on disk is open. Until then the engine takes no requests.
    pub(crate) fn is_ready(&self) -> bool {
        self.discovery.in_flight.is_empty() && self.startup_opening == 0 && self.fatal.is_none()
    }

    pub(crate) fn slot(&self, id: LogId) -> Option<&LogSlot> {
        self.slots.get(id.0.checked_sub(1)? as usize)?.as_ref()
    }

    pub(crate) fn slot_mut(&mut self, id: LogId) -> Option<&mut LogSlot> {
        self.slots.get_mut(id.0.checked_sub(1)? as usize)?.as_mut()
    }

    /// The log of a shard directory: the one found at startup, or a new one opening now.
    pub(crate) fn claim(&mut self, dir: String, owner: Owner, now: Instant) -> LogId {
        if let Some(&id) = self.by_dir.get(&dir) {
            let slot = self.slot_mut(id).expect("by_dir names live slots");
            slot.owner = owner;
            return id;
        }
        self.open(dir, owner, now, false)
    }

    fn open(&mut self, dir: String, owner: Owner, now: Instant, startup: bool) -> LogId {
        let id = LogId(self.slots.len() as u32 + 1);
        let log = ShardLog::open(id, dir.clone(), self.settings.log.clone(), now);
        self.slots.push(Some(LogSlot {
            log,
            owner,
            state: LogState::Opening,
            startup,
            timer: None,
            dirty: false,
            blocked_readers: Vec::new(),
        }));
        self.by_dir.insert(dir, id);
        if startup {
            self.startup_opening += 1;
        }
        self.mark_dirty(id);
        id
    }

    /// Schedules the log's outputs to be collected at the end of the turn.
    pub(crate) fn mark_dirty(&mut self, id: LogId) {
        if let Some(slot) = self.slot_mut(id) {
            if !slot.dirty {
                slot.dirty = true;
                self.dirty.push(id);
            }
        }
    }

    pub(crate) fn take_dirty(&mut self) -> Vec<LogId> {
        std::mem::take(&mut self.dirty)
    }

    pub(crate) fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Moves a log's file ops to the outgoing queue and re-arms its timer; the caller then
    /// drains its events.
    pub(crate) fn collect_ops(&mut self, id: LogId) {
        let Some(i) = id.0.checked_sub(1).map(|i| i as usize) else {
            return;
        };
        let Some(Some(slot)) = self.slots.get_mut(i) else {
            return;
        };
        slot.dirty = false;
        while let Some(op) = slot.log.poll_op() {
            self.ops.push_back(op);
        }
        let next = slot.log.poll_timeout();
        if next != slot.timer {
            if let Some(old) = slot.timer {
                self.timers.remove(&(old, id));
            }
            if let Some(new) = next {
                self.timers.insert((new, id));
            }
            slot.timer = next;
        }
    }

    /// A log finished opening (or failed to); keeps the startup count.
    pub(crate) fn opened(&mut self, id: LogId, result: Result<(), String>) {
        let Some(slot) = self.slot_mut(id) else {
            return;
        };
        let startup = std::mem::take(&mut slot.startup);
        slot.state = match &result {
            Ok(()) => LogState::Open,
            Err(e) => LogState::Failed(e.clone()),
        };
        if startup {
            self.startup_opening -= 1;
            if let Err(e) = result {
                self.fatal.get_or_insert(e);
            }
        }
        self.notices.push_back(Notice::Opened { log: id });
    }

    pub(crate) fn poll_op(&mut self) -> Option<FileOp> {
        self.ops.pop_front()
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(at, _)| at)
    }

    /// Runs every log timer due at `now`.
    pub(crate) fn handle_timeout(&mut self, now: Instant, unix_micros: u64) {
        while let Some(&(at, id)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            if let Some(slot) = self.slot_mut(id) {
                slot.timer = None;
                slot.log.handle_timeout(now, unix_micros);
            }
            self.mark_dirty(id);
        }
    }

    /// Routes a completion to the log that issued the op (or to the startup walk).
    pub(crate) fn handle_completion(&mut self, now: Instant, c: FileCompletion) {
        let id = c.id.log();
        if id == DISCOVERY {
            return self.discovered(now, c);
        }
        if let Some(slot) = self.slot_mut(id) {
            slot.log.handle_completion(c);
            self.mark_dirty(id);
        }
    }

    fn discovered(&mut self, now: Instant, c: FileCompletion) {
        let Some((dir, depth)) = self.discovery.in_flight.remove(&c.id) else {
            return;
        };
        let entries = match c.result {
            Ok(FileOutput::Listing(entries)) => entries,
            Ok(_) => Vec::new(),
            // No stream was ever stored: nothing to open.
            Err(e) if e.kind == FileErrorKind::NotFound && depth == 0 => Vec::new(),
            Err(e) => {
                self.fatal
                    .get_or_insert(format!("cannot list the storage directory {dir}: {e}"));
                return;
            }
        };
        for entry in entries.into_iter().filter(|e| e.is_dir) {
            let child = layout::join(&dir, &entry.name);
            if depth + 1 < SHARD_DEPTH {
                let op = self.discovery.list(child, depth + 1);
                self.ops.push_back(op);
            } else if entry.name.parse::<u32>().is_ok() {
                if !self.by_dir.contains_key(&child) {
                    self.open(child, Owner::Unclaimed, now, true);
                }
            } else {
                tracing::warn!(dir = %child, "ignoring a directory that is not a shard");
            }
        }
    }

    /// Asks every log to sync what it has written (a graceful stop).
    pub(crate) fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        let ids: Vec<LogId> = self.live_ids().collect();
        for id in ids {
            if let Some(slot) = self.slot_mut(id) {
                slot.log.sync_now();
            }
            self.mark_dirty(id);
        }
    }

    /// No log has work left (after [`Logs::begin_shutdown`]: everything written is synced).
    pub(crate) fn is_idle(&self) -> bool {
        self.ops.is_empty()
            && self.discovery.in_flight.is_empty()
            && self.slots.iter().flatten().all(|s| s.log.is_idle())
    }

    fn live_ids(&self) -> impl Iterator<Item = LogId> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| LogId(i as u32 + 1))
    }
}

/// The startup walk: `ListDir` down to every shard directory.
#[derive(Default)]
struct Discovery {
    next_seq: u32,
    in_flight: HashMap<OpId, (String, usize)>,
}

impl Discovery {
    fn list(&mut self, dir: String, depth: usize) -> FileOp {
        let id = OpId::new(DISCOVERY, self.next_seq);
        self.next_seq = self.next_seq.wrapping_add(1);
        self.in_flight.insert(id, (dir.clone(), depth));
        FileOp {
            id,
            kind: FileOpKind::ListDir { path: dir },
        }
    }
}

// ---- the broker's storage work ------------------------------------------------------------

use std::time::Instant as Now;

use felix_proto::message::{ErrorMessage, Message};
use felix_proto::Flags;

use super::encode::{encode_event_batch, BatchView};
use felix_proto::ErrorCode;

use super::{fan_in, mark_ready, seal, Broker, FanOut};
use crate::storage::log::{LogEvent, ReadBatch, ReadError};

/// Rounds of log events handled in one flush; anything left waits for the next turn (and
/// [`Broker::poll_timeout`] asks for that turn at once).
const MAX_LOG_ROUNDS: usize = 8;

impl Broker {
    /// Startup is over: every log found on disk is open (always true in memory).
    pub(crate) fn is_ready(&self) -> bool {
        self.logs.as_ref().is_none_or(Logs::is_ready)
    }

    /// Why the broker cannot start: a log found on disk could not be opened (corruption
    /// names the file and the byte).
    pub(crate) fn storage_fatal(&self) -> Option<&str> {
        self.logs.as_ref()?.fatal.as_deref()
    }

    /// Every acked publish is answered only once durable, with its offset.
    pub(crate) fn acks_after_write(&self) -> bool {
        self.logs
            .as_ref()
            .is_some_and(|l| l.settings.ack_after_write)
    }

    /// Records of `log` below this are durable.
    pub(crate) fn durable_offset(&self, log: LogId) -> u64 {
        self.logs
            .as_ref()
            .and_then(|l| l.slot(log))
            .map_or(0, |s| s.log.durable_offset())
    }

    /// Why `log` stopped, if it did.
    pub(crate) fn log_failure(&self, log: LogId) -> Option<&str> {
        match &self.logs.as_ref()?.slot(log)?.state {
            LogState::Failed(e) => Some(e),
            _ => None,
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
        self.logs.as_ref().is_some_and(Logs::has_dirty)
    }

    /// Syncs every log (a graceful stop); [`Broker::storage_idle`] says when it is done.
    pub(crate) fn begin_storage_shutdown(&mut self) {
        if let Some(logs) = self.logs.as_mut() {
            logs.begin_shutdown();
        }
    }

    pub(crate) fn storage_idle(&self) -> bool {
        self.logs.as_ref().is_none_or(Logs::is_idle)
    }

    /// Handles the events of every log touched this turn.
    pub(super) fn process_logs(&mut self, now: Now) {
        for _ in 0..MAX_LOG_ROUNDS {
            let Some(logs) = self.logs.as_mut() else {
                return;
            };
            let dirty = logs.take_dirty();
            if dirty.is_empty() {
                return;
            }
            let mut events = Vec::new();
            for id in dirty {
                logs.collect_ops(id);
                if let Some(slot) = logs.slot_mut(id) {
                    while let Some(ev) = slot.log.poll_event() {
                        events.push((id, ev));
                    }
                }
            }
            for (id, ev) in events {
                self.on_log_event(now, id, ev);
            }
        }
    }

    fn on_log_event(&mut self, _now: Now, id: LogId, ev: LogEvent) {
        let logs = self.logs.as_mut().expect("called with logs");
        match ev {
            LogEvent::Opened { .. } => {
                logs.opened(id, Ok(()));
                let slot = logs.slot(id).expect("live");
                let durable = slot.log.durable_offset();
                if let Owner::Stream { stream, shard } = slot.owner {
                    if let Some(store) = self.streams[stream].shards[shard as usize].store.as_mut()
                    {
                        store.released = durable;
                    }
                }
            }
            LogEvent::Durable { up_to } => {
                logs.notices.push_back(Notice::Durable { log: id, up_to });
                self.release(id, up_to);
            }
            LogEvent::Read { ticket, result } => {
                let reader = logs.reads.remove(&(id, ticket));
                // A read landed: readers refused `Busy` may go now.
                let blocked = logs
                    .slot_mut(id)
                    .map(|s| std::mem::take(&mut s.blocked_readers))
                    .unwrap_or_default();
                if let Some(reader) = reader {
                    self.on_catch_up_read(reader, result);
                }
                for b in blocked {
                    self.advance_catch_up(b);
                }
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
            LogEvent::Failed(e) => {
                let message = e.to_string();
                let opening = logs.slot(id).is_some_and(|s| s.state == LogState::Opening);
                if opening {
                    logs.opened(id, Err(message));
                } else if let Some(slot) = logs.slot_mut(id) {
                    slot.state = LogState::Failed(message);
                }
                logs.notices.push_back(Notice::Failed { log: id });
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
    fn release(&mut self, log: LogId, up_to: u64) {
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
        let mut unreleased = std::mem::take(&mut store.unreleased);
        store.released = store.released.max(up_to);
        let mut fan = FanOut {
            subscribers: &mut self.subscribers,
            ready: &mut self.ready,
            stats: &mut self.stats,
        };
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
            match slot
                .log
                .read(next, CATCH_UP_READ_RECORDS, CATCH_UP_READ_BYTES)
            {
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
                    slot.blocked_readers.push(id);
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
