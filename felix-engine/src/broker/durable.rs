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

use felix_storage::cache_log::{CacheEvent, CacheLog};
use felix_storage::counter_log::CounterLog;
use felix_storage::driven::Driven;
use felix_storage::group_log::GroupLog;
use felix_storage::layout;
use felix_storage::log::{LogConfig, ReadTicket, ShardLog};
use felix_storage::ops::{
    FileCompletion, FileErrorKind, FileOp, FileOpKind, FileOutput, LogId, OpId,
};

use super::groups::GROUPS_DIR;
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
/// Top-level directory of cache logs under the storage root.
pub(crate) const CACHES_DIR: &str = "caches";
/// Top-level directory of counter logs (one per cache that has counters).
pub(crate) const COUNTERS_DIR: &str = "counters";

/// What kind of log a directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Stream,
    Cache,
    Counter,
    Group,
}

/// A stream shard's log or a cache's.
pub(crate) enum AnyLog {
    Stream(ShardLog),
    Cache(CacheLog),
    Counter(CounterLog),
    Group(GroupLog),
}

impl AnyLog {
    /// The underlying segment log (for a cache, the one under its index).
    pub(crate) fn shard(&self) -> &ShardLog {
        match self {
            AnyLog::Stream(l) => l,
            AnyLog::Cache(c) => c.log(),
            AnyLog::Counter(c) => c.log(),
            AnyLog::Group(g) => g.log(),
        }
    }

    /// A stream shard's log; `None` for a cache.
    pub(crate) fn stream_mut(&mut self) -> Option<&mut ShardLog> {
        match self {
            AnyLog::Stream(l) => Some(l),
            AnyLog::Cache(_) | AnyLog::Counter(_) | AnyLog::Group(_) => None,
        }
    }

    pub(crate) fn group_mut(&mut self) -> Option<&mut GroupLog> {
        match self {
            AnyLog::Group(g) => Some(g),
            _ => None,
        }
    }

    pub(crate) fn cache_mut(&mut self) -> Option<&mut CacheLog> {
        match self {
            AnyLog::Cache(c) => Some(c),
            AnyLog::Stream(_) | AnyLog::Counter(_) | AnyLog::Group(_) => None,
        }
    }

    pub(crate) fn counter_mut(&mut self) -> Option<&mut CounterLog> {
        match self {
            AnyLog::Counter(c) => Some(c),
            _ => None,
        }
    }

    pub(crate) fn durable_offset(&self) -> u64 {
        self.shard().durable_offset()
    }

    /// The log as the broker drives it, whatever its kind.
    fn driven(&mut self) -> &mut dyn Driven {
        match self {
            AnyLog::Stream(l) => l,
            AnyLog::Cache(c) => c,
            AnyLog::Counter(c) => c,
            AnyLog::Group(g) => g,
        }
    }

    fn poll_op(&mut self) -> Option<FileOp> {
        self.driven().poll_op()
    }

    /// Every kind's deadline is its segment log's.
    fn poll_timeout(&self) -> Option<Instant> {
        self.shard().poll_timeout()
    }

    fn handle_completion(&mut self, c: FileCompletion) {
        self.driven().handle_completion(c)
    }

    fn handle_timeout(&mut self, now: Instant, unix_micros: u64) {
        self.driven().handle_timeout(now, unix_micros)
    }

    fn sync_now(&mut self) {
        self.driven().sync_now()
    }

    fn is_idle(&self) -> bool {
        self.shard().is_idle()
    }

    pub(crate) fn poll_event(&mut self) -> Option<AnyEvent> {
        match self {
            AnyLog::Stream(l) => l.poll_event().map(AnyEvent::Stream),
            AnyLog::Cache(c) => c.poll_event().map(AnyEvent::Cache),
            // A counter log reports the cache events it shares (opened, durable, failed).
            AnyLog::Counter(c) => c.poll_event().map(AnyEvent::Cache),
            AnyLog::Group(g) => g.poll_event().map(AnyEvent::Group),
        }
    }
}

/// An event from either kind of log.
pub(crate) enum AnyEvent {
    Stream(LogEvent),
    Cache(CacheEvent),
    Group(LogEvent),
}

/// How the broker runs its durable shards.
#[derive(Debug, Clone)]
pub(crate) struct DurableSettings {
    pub(crate) log: LogConfig,
    /// Every acknowledged publish is answered once durable, with its offset, whatever the
    /// client offered (`FELIX_ACK_ON_COMMIT`, or the `on_commit` fsync mode).
    pub(crate) ack_after_write: bool,
    /// Consumer-group limits.
    pub(crate) groups: super::groups::GroupConfig,
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
    /// A cache (its one shard).
    Cache,
    /// A cache's counters.
    Counter,
    /// The consumer groups of shard `shard` of stream number `stream`.
    Groups { stream: usize, shard: u32 },
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
    /// Every record of this log below `up_to` is durable.
    Durable { log: LogId, up_to: u64 },
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

pub(crate) struct LogSlot {
    pub(crate) log: AnyLog,
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
    anchor: (Instant, u64),
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
    /// Deleted streams' directories being retired (`delete.rs`).
    pub(super) retiring: super::delete::Retiring,
}

impl Logs {
    /// Starts the walk over the storage root that opens every log already on disk.
    /// `anchor` is an instant and the Unix microseconds it stood for (cache expiry and
    /// compaction compare stored wall-clock times).
    pub(crate) fn new(settings: DurableSettings, anchor: (Instant, u64)) -> Logs {
        let mut logs = Logs {
            settings,
            anchor,
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
            retiring: Default::default(),
        };
        // `groups/` is walked only for tombstones: group logs open when first used.
        for root in [STREAMS_DIR, CACHES_DIR, COUNTERS_DIR, GROUPS_DIR] {
            let op = logs.discovery.list(root.to_owned(), 0);
            logs.ops.push_back(op);
        }
        logs
    }

    /// The log already open (or opening) for a directory, if any.
    pub(crate) fn find(&self, dir: &str) -> Option<LogId> {
        self.by_dir.get(dir).copied()
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
        let kind = match owner {
            Owner::Cache => Kind::Cache,
            Owner::Counter => Kind::Counter,
            Owner::Groups { .. } => Kind::Group,
            _ => Kind::Stream,
        };
        self.open(dir, kind, owner, now, false)
    }

    fn open(
        &mut self,
        dir: String,
        kind: Kind,
        owner: Owner,
        now: Instant,
        startup: bool,
    ) -> LogId {
        let id = LogId(self.slots.len() as u32 + 1);
        let log = match kind {
            Kind::Stream => AnyLog::Stream(ShardLog::open(
                id,
                dir.clone(),
                self.settings.log.clone(),
                now,
            )),
            // Retention is a stream bound: on a cache it would forget live keys. A cache is
            // bounded by compaction instead.
            Kind::Cache => {
                let cfg = LogConfig {
                    retention_bytes: None,
                    retention_age: None,
                    ..self.settings.log.clone()
                };
                AnyLog::Cache(CacheLog::open(id, dir.clone(), cfg, now))
            }
            // Counters are bounded by compaction too: retention would forget sums.
            Kind::Counter => {
                let cfg = LogConfig {
                    retention_bytes: None,
                    retention_age: None,
                    ..self.settings.log.clone()
                };
                AnyLog::Counter(CounterLog::open(id, dir.clone(), cfg, now))
            }
            // Retention would forget cursors; small segments let compaction start early.
            Kind::Group => {
                let cfg = LogConfig {
                    retention_bytes: None,
                    retention_age: None,
                    segment_max_bytes: self
                        .settings
                        .log
                        .segment_max_bytes
                        .min(felix_storage::group_log::GROUP_SEGMENT_MAX_BYTES),
                    ..self.settings.log.clone()
                };
                AnyLog::Group(GroupLog::open(id, dir.clone(), cfg, now))
            }
        };
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

    /// A log stopped: while opening that is a failed open, else its writes fail from here.
    pub(crate) fn failed(&mut self, id: LogId, message: String) {
        let opening = self.slot(id).is_some_and(|s| s.state == LogState::Opening);
        if opening {
            self.opened(id, Err(message));
        } else if let Some(slot) = self.slot_mut(id) {
            slot.state = LogState::Failed(message);
        }
        self.notices.push_back(Notice::Failed { log: id });
    }

    /// Unix milliseconds at `now`, from the anchor the engine gave.
    pub(crate) fn unix_ms(&self, now: Instant) -> u64 {
        let (at, micros) = self.anchor;
        let micros = match now.checked_duration_since(at) {
            Some(d) => micros.saturating_add(d.as_micros() as u64),
            None => micros.saturating_sub(at.duration_since(now).as_micros() as u64),
        };
        micros / 1000
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
        if super::delete::is_retire_id(id) {
            return self.retire_completion(c);
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
        let groups = dir.starts_with(GROUPS_DIR);
        for entry in entries.into_iter().filter(|e| e.is_dir) {
            let child = layout::join(&dir, &entry.name);
            if depth == 2
                && (groups || dir.starts_with(STREAMS_DIR))
                && super::delete::is_tombstone(&entry.name)
            {
                // A stream (or its groups) deleted before a crash: never opened, its files
                // go now.
                let op = self.retiring.finish(child);
                self.ops.push_back(op);
                continue;
            }
            if groups {
                // Down to the namespaces, where tombstones are; group logs are not opened.
                if depth < 2 {
                    let op = self.discovery.list(child, depth + 1);
                    self.ops.push_back(op);
                }
                continue;
            }
            if depth + 1 < SHARD_DEPTH {
                let op = self.discovery.list(child, depth + 1);
                self.ops.push_back(op);
            } else if entry.name.parse::<u32>().is_ok() {
                if !self.by_dir.contains_key(&child) {
                    let kind = if child.starts_with(CACHES_DIR) {
                        Kind::Cache
                    } else if child.starts_with(COUNTERS_DIR) {
                        Kind::Counter
                    } else {
                        Kind::Stream
                    };
                    self.open(child, kind, Owner::Unclaimed, now, true);
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

    /// Live logs whose directory starts with `prefix` (a deleted stream's shards).
    pub(super) fn logs_under(&self, prefix: &str) -> Vec<LogId> {
        let mut ids: Vec<LogId> = self
            .by_dir
            .iter()
            .filter(|(dir, _)| dir.starts_with(prefix))
            .map(|(_, id)| *id)
            .collect();
        ids.sort();
        ids
    }

    pub(super) fn is_opening(&self, id: LogId) -> bool {
        self.slot(id).is_some_and(|s| s.state == LogState::Opening)
    }

    /// Drops a log (its stream was deleted): completions of its ops still in flight are
    /// ignored from now on, and nothing finds it by directory any more.
    pub(super) fn forget(&mut self, id: LogId) {
        let Some(slot) =
            id.0.checked_sub(1)
                .and_then(|i| self.slots.get_mut(i as usize))
                .and_then(Option::take)
        else {
            return;
        };
        if let Some(at) = slot.timer {
            self.timers.remove(&(at, id));
        }
        self.by_dir.retain(|_, l| *l != id);
        self.dirty.retain(|l| *l != id);
        self.reads.retain(|(l, _), _| *l != id);
    }

    pub(super) fn push_op(&mut self, op: FileOp) {
        self.ops.push_back(op);
    }

    pub(super) fn live_ids(&self) -> impl Iterator<Item = LogId> + '_ {
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
use super::{BrokerError, CacheKey};
use felix_storage::cache_log::{Lookup, MAX_CACHE_KEY_BYTES};
use felix_storage::log::{LogEvent, ReadBatch, ReadError};

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

    /// Bytes in every log's segment files (a metrics gauge; walks every log).
    pub(crate) fn log_bytes(&self) -> u64 {
        let Some(logs) = self.logs.as_ref() else {
            return 0;
        };
        logs.slots
            .iter()
            .flatten()
            .map(|s| s.log.shard().total_bytes())
            .sum()
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
                // A `stream_read` or `offset_for_time` page (`reads.rs`) takes its own.
                let result = self.on_page_read(id, ticket, result);
                let logs = self.logs.as_mut().expect("called with logs");
                let reader = logs.reads.remove(&(id, ticket));
                // A read landed: readers refused `Busy` may go now.
                let blocked = logs
                    .slot_mut(id)
                    .map(|s| std::mem::take(&mut s.blocked_readers))
                    .unwrap_or_default();
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
            budget: &mut self.event_budget,
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
        // Consumer groups waiting on this shard have new work.
        self.wake_group_polls(stream, shard);
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
        let dir = layout::cache_shard_dir(&key.tenant, &key.namespace, &key.cache, 0);
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
        let log = self.cache_log(now, key, true)?.expect("created");
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
        let watch_reading = self.watches.reading(id);
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
                logs.notices.push_back(Notice::Durable { log: id, up_to });
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
            // Taken by the watches above.
            CacheEvent::Applied(_) | CacheEvent::Scanned { .. } => {}
        }
    }
}
