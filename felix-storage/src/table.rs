//! The table of every log a node holds: it opens them, routes each file completion to the
//! log that issued the op (by the op's [`LogId`]), collects their ops and timers, and runs
//! the startup walk that finds the logs already on disk (and finishes the tombstones of
//! streams deleted before a crash).
//!
//! The owner (the broker) claims logs by directory, drains [`LogTable::poll_op`] and
//! [`LogTable::poll_timeout`], and reads the logs' events; the table's own events
//! ([`TableEvent`]) arrive in the owner's notice queue, in order with the owner's.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use crate::cache_log::{CacheEvent, CacheLog};
use crate::counter_log::CounterLog;
use crate::driven::Driven;
use crate::group_log::{GroupLog, GROUP_SEGMENT_MAX_BYTES};
use crate::layout::{self, CACHES_DIR, COUNTERS_DIR, GROUPS_DIR, STREAMS_DIR};
use crate::log::{LogConfig, LogEvent, ShardLog};
use crate::ops::{FileCompletion, FileErrorKind, FileOp, FileOpKind, FileOutput, LogId, OpId};
use crate::retire::{is_retire_id, is_tombstone, Retiring};

/// What the table tells its owner, through the owner's notice queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableEvent {
    /// The log finished opening (or failed to: then it is also failed). A retirement's id
    /// also "opens" once its renames are durable: requests stalled on it may run.
    Opened { log: LogId },
    /// The log stopped; answers waiting on it are failures.
    Failed { log: LogId },
}

/// The startup walk's own id: logs are numbered from 1.
const DISCOVERY: LogId = LogId(0);
/// Directory depth below `streams/` of a shard directory: tenant / namespace / stream / shard.
const SHARD_DEPTH: usize = 4;

/// What kind of log a directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Stream,
    Cache,
    Counter,
    Group,
}

/// A stream shard's log or a cache's.
pub enum AnyLog {
    Stream(ShardLog),
    Cache(CacheLog),
    Counter(CounterLog),
    Group(GroupLog),
}

impl AnyLog {
    /// The underlying segment log (for a cache, the one under its index).
    pub fn shard(&self) -> &ShardLog {
        match self {
            AnyLog::Stream(l) => l,
            AnyLog::Cache(c) => c.log(),
            AnyLog::Counter(c) => c.log(),
            AnyLog::Group(g) => g.log(),
        }
    }

    /// A stream shard's log; `None` for a cache.
    pub fn stream_mut(&mut self) -> Option<&mut ShardLog> {
        match self {
            AnyLog::Stream(l) => Some(l),
            AnyLog::Cache(_) | AnyLog::Counter(_) | AnyLog::Group(_) => None,
        }
    }

    pub fn group_mut(&mut self) -> Option<&mut GroupLog> {
        match self {
            AnyLog::Group(g) => Some(g),
            _ => None,
        }
    }

    pub fn cache_mut(&mut self) -> Option<&mut CacheLog> {
        match self {
            AnyLog::Cache(c) => Some(c),
            AnyLog::Stream(_) | AnyLog::Counter(_) | AnyLog::Group(_) => None,
        }
    }

    pub fn counter_mut(&mut self) -> Option<&mut CounterLog> {
        match self {
            AnyLog::Counter(c) => Some(c),
            _ => None,
        }
    }

    pub fn durable_offset(&self) -> u64 {
        self.shard().durable_offset()
    }

    /// The log as the broker drives it, whatever its kind (replication works on its segment
    /// log through [`Driven::shard_mut`], then calls [`Driven::after_input`]).
    pub fn driven(&mut self) -> &mut dyn Driven {
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

    pub fn poll_event(&mut self) -> Option<AnyEvent> {
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
pub enum AnyEvent {
    Stream(LogEvent),
    Cache(CacheEvent),
    Group(LogEvent),
}

/// Where a log is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogState {
    Opening,
    Open,
    /// Open failed, or a write did; the message names the file.
    Failed(String),
}

/// What a log holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
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

pub struct LogSlot {
    pub log: AnyLog,
    pub owner: Owner,
    pub state: LogState,
    /// Opened by the startup walk: failing to open stops the broker from starting.
    pub startup: bool,
    /// Its deadline in [`Logs::timers`].
    timer: Option<Instant>,
    dirty: bool,
}

/// Every log, routed by id, and the queues between them and the engine. `N` is the owner's
/// notice type: the table's own events ([`TableEvent`]) go into the same queue as the
/// owner's, so their order is the order things happened in.
pub struct LogTable<N> {
    /// What each new log is opened with (kinds adjust it: caches keep no retention).
    log_config: LogConfig,
    slots: Vec<Option<LogSlot>>,
    /// Logs by directory: a stream created on first use claims the one found at startup.
    by_dir: HashMap<String, LogId>,
    dirty: Vec<LogId>,
    timers: BTreeSet<(Instant, LogId)>,
    ops: VecDeque<FileOp>,
    pub notices: VecDeque<N>,
    discovery: Discovery,
    /// Startup logs not open yet.
    startup_opening: usize,
    /// Why the broker cannot start (a startup log is corrupt or unreadable).
    pub fatal: Option<String>,
    shutting_down: bool,
    /// Deleted streams' directories being retired.
    retiring: Retiring,
}

impl<N: From<TableEvent>> LogTable<N> {
    /// Starts the walk over the storage root that opens every log already on disk.
    pub fn new(log_config: LogConfig) -> LogTable<N> {
        let mut logs = LogTable {
            log_config,
            slots: Vec::new(),
            by_dir: HashMap::new(),
            dirty: Vec::new(),
            timers: BTreeSet::new(),
            ops: VecDeque::new(),
            notices: VecDeque::new(),
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
    pub fn find(&self, dir: &str) -> Option<LogId> {
        self.by_dir.get(dir).copied()
    }

    /// Startup is over: every log on disk is open. Until then the engine takes no requests.
    pub fn is_ready(&self) -> bool {
        self.discovery.in_flight.is_empty() && self.startup_opening == 0 && self.fatal.is_none()
    }

    pub fn slot(&self, id: LogId) -> Option<&LogSlot> {
        self.slots.get(id.0.checked_sub(1)? as usize)?.as_ref()
    }

    pub fn slot_mut(&mut self, id: LogId) -> Option<&mut LogSlot> {
        self.slots.get_mut(id.0.checked_sub(1)? as usize)?.as_mut()
    }

    /// The log of a shard directory: the one found at startup, or a new one opening now.
    pub fn claim(&mut self, dir: String, owner: Owner, now: Instant) -> LogId {
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
        let log = self.new_log(id, dir.clone(), kind, now);
        self.slots.push(Some(LogSlot {
            log,
            owner,
            state: LogState::Opening,
            startup,
            timer: None,
            dirty: false,
        }));
        self.by_dir.insert(dir, id);
        if startup {
            self.startup_opening += 1;
        }
        self.mark_dirty(id);
        id
    }

    /// A log of `kind` over `dir`, opening (it replays what the directory holds).
    fn new_log(&self, id: LogId, dir: String, kind: Kind, now: Instant) -> AnyLog {
        match kind {
            Kind::Stream => AnyLog::Stream(ShardLog::open(id, dir, self.log_config.clone(), now)),
            // Retention is a stream bound: on a cache it would forget live keys. A cache is
            // bounded by compaction instead.
            Kind::Cache => {
                let cfg = LogConfig {
                    retention_bytes: None,
                    retention_age: None,
                    ..self.log_config.clone()
                };
                AnyLog::Cache(CacheLog::open(id, dir, cfg, now))
            }
            // Counters are bounded by compaction too: retention would forget sums.
            Kind::Counter => {
                let cfg = LogConfig {
                    retention_bytes: None,
                    retention_age: None,
                    ..self.log_config.clone()
                };
                AnyLog::Counter(CounterLog::open(id, dir, cfg, now))
            }
            // Retention would forget cursors; small segments let compaction start early.
            Kind::Group => {
                let cfg = LogConfig {
                    retention_bytes: None,
                    retention_age: None,
                    segment_max_bytes: self
                        .log_config
                        .segment_max_bytes
                        .min(GROUP_SEGMENT_MAX_BYTES),
                    ..self.log_config.clone()
                };
                AnyLog::Group(GroupLog::open(id, dir, cfg, now))
            }
        }
    }

    /// Opens an idle log again from its files, under the same id: a projection (a group
    /// log's groups) that followed a replicated log through cuts it cannot undo is rebuilt
    /// by replaying what the log holds now. `false` (nothing done) while the log has work
    /// in flight; its completions would land in the new log.
    pub fn reopen(&mut self, id: LogId, now: Instant) -> bool {
        let Some(slot) = self.slot(id) else {
            return false;
        };
        if !slot.log.is_idle() || !matches!(slot.state, LogState::Open) {
            return false;
        }
        let kind = match &slot.log {
            AnyLog::Stream(_) => Kind::Stream,
            AnyLog::Cache(_) => Kind::Cache,
            AnyLog::Counter(_) => Kind::Counter,
            AnyLog::Group(_) => Kind::Group,
        };
        let dir = slot.log.shard().dir().to_owned();
        let bound = slot.log.shard().compaction_bound();
        let only_shipped = slot.log.shard().only_shipped();
        let mut log = self.new_log(id, dir, kind, now);
        log.driven().shard_mut().bound_compaction(bound);
        // A follower's copy stays one across the reload.
        log.driven().shard_mut().take_only_shipped(only_shipped);
        let slot = self.slot_mut(id).expect("checked");
        slot.log = log;
        slot.state = LogState::Opening;
        self.mark_dirty(id);
        true
    }

    /// Every live log's slot, in id order.
    pub fn slots(&self) -> impl Iterator<Item = &LogSlot> {
        self.slots.iter().flatten()
    }

    /// Schedules the log's outputs to be collected at the end of the turn.
    pub fn mark_dirty(&mut self, id: LogId) {
        if let Some(slot) = self.slot_mut(id) {
            if !slot.dirty {
                slot.dirty = true;
                self.dirty.push(id);
            }
        }
    }

    pub fn take_dirty(&mut self) -> Vec<LogId> {
        std::mem::take(&mut self.dirty)
    }

    pub fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Moves a log's file ops to the outgoing queue and re-arms its timer; the caller then
    /// drains its events.
    pub fn collect_ops(&mut self, id: LogId) {
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
    pub fn failed(&mut self, id: LogId, message: String) {
        let opening = self.slot(id).is_some_and(|s| s.state == LogState::Opening);
        if opening {
            self.opened(id, Err(message));
        } else if let Some(slot) = self.slot_mut(id) {
            slot.state = LogState::Failed(message);
        }
        self.notices
            .push_back(TableEvent::Failed { log: id }.into());
    }

    /// A log finished opening (or failed to); keeps the startup count.
    pub fn opened(&mut self, id: LogId, result: Result<(), String>) {
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
        self.notices
            .push_back(TableEvent::Opened { log: id }.into());
    }

    pub fn poll_op(&mut self) -> Option<FileOp> {
        self.ops.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(at, _)| at)
    }

    /// Runs every log timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant, unix_micros: u64) {
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
    pub fn handle_completion(&mut self, now: Instant, c: FileCompletion) {
        let id = c.id.log();
        if id == DISCOVERY {
            return self.discovered(now, c);
        }
        if is_retire_id(id) {
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
            if depth == 2 && is_tombstone(&entry.name) {
                // A stream (its groups, a cache, its counters) deleted before a crash: never
                // opened, its files go now.
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
    pub fn begin_shutdown(&mut self) {
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
    pub fn is_idle(&self) -> bool {
        self.ops.is_empty()
            && self.discovery.in_flight.is_empty()
            && self.slots.iter().flatten().all(|s| s.log.is_idle())
    }

    /// Live logs whose directory starts with `prefix` (a deleted stream's shards).
    pub fn logs_under(&self, prefix: &str) -> Vec<LogId> {
        let mut ids: Vec<LogId> = self
            .by_dir
            .iter()
            .filter(|(dir, _)| dir.starts_with(prefix))
            .map(|(_, id)| *id)
            .collect();
        ids.sort();
        ids
    }

    pub fn is_opening(&self, id: LogId) -> bool {
        self.slot(id).is_some_and(|s| s.state == LogState::Opening)
    }

    /// Drops a log (its stream was deleted): completions of its ops still in flight are
    /// ignored from now on, and nothing finds it by directory any more.
    pub fn forget(&mut self, id: LogId) {
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
    }

    pub fn push_op(&mut self, op: FileOp) {
        self.ops.push_back(op);
    }

    pub fn live_ids(&self) -> impl Iterator<Item = LogId> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| LogId(i as u32 + 1))
    }
}

impl<N: From<TableEvent>> LogTable<N> {
    /// Starts retiring a stream directory (the rename to a tombstone).
    pub fn retire(&mut self, dirs: Vec<String>, unix_micros: u64) {
        let (_, op) = self.retiring.start(dirs, unix_micros);
        self.push_op(op);
    }

    /// Routes a retirement op's completion.
    fn retire_completion(&mut self, c: FileCompletion) {
        let (mut ops, mut events) = (Vec::new(), Vec::new());
        self.retiring.handle_completion(c, &mut ops, &mut events);
        ops.into_iter().for_each(|op| self.push_op(op));
        self.notices.extend(events.into_iter().map(N::from));
    }

    pub fn retiring_blocks(&self, dir: &str) -> Option<LogId> {
        self.retiring.blocking(dir)
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
