//! [`ShardLog`]: one shard's durable log as a state machine over file operations.
//!
//! The log decides what to write, sync, read, rename and remove; it performs nothing. The
//! owner drives it with the four families of calls:
//!
//! - inputs: [`ShardLog::handle_completion`] (a file op finished) and
//!   [`ShardLog::handle_timeout`] (the periodic fsync or the retention check is due);
//! - commands: [`ShardLog::append`], [`ShardLog::read`], [`ShardLog::sync_now`],
//!   [`ShardLog::enforce_retention`] and (for caches) `compact`;
//! - outputs, drained after every input or command until `None`: [`ShardLog::poll_op`]
//!   (file ops for the runtime; appends made since the last poll share one write) then
//!   [`ShardLog::poll_event`] (what happened);
//!   [`ShardLog::poll_timeout`] is the next deadline;
//! - getters: offsets, sizes, state.
//!
//! Writes go out one at a time (the write lane), and one sync of written records may run
//! beside the write in flight (the sync lane): a sync vouches only for writes that had
//! completed when it was issued, so the runtime may execute the two in either order. Appends
//! made meanwhile queue in memory and go out as one write when the lane frees; when a sync
//! completes, the next one covers every write finished since (group commit). Segment
//! creation and housekeeping take both lanes. Compaction has a lane of its own so a long
//! rewrite never delays an append. Reads go out concurrently, only ever for bytes whose
//! write has completed.
//!
//! The impl is split by concern: `write.rs` (appends, the write and sync lanes, segment
//! roll), `read.rs` (reads and the tail cache), `recovery.rs` (the open), `retention.rs`,
//! `compaction.rs` and `replica.rs` (framed reads and appends, truncation, the replica
//! state file). This file holds the types, the state and the routing of inputs.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::ops::{FileCompletion, FileError, FileOp, FileOpKind, LogId, OpId};
use crate::record::{self, DecodedEntry};
use crate::segment::{Segment, Stage};
use crate::write_buffers::WriteBuffers;

mod compaction;
mod read;
mod recovery;
mod replica;
mod retention;
mod write;

use compaction::Compaction;
use recovery::Opening;
use replica::Truncation;

pub use replica::{AppendedEntry, FramedBatch, ReplicaEvent, TruncateError};

/// Segment size at which the log rolls to a new file.
pub const DEFAULT_SEGMENT_MAX_BYTES: u64 = 64 << 20;
/// Default interval of [`FsyncMode::Periodic`].
pub const DEFAULT_FSYNC_INTERVAL: Duration = Duration::from_millis(250);
/// Recent entries kept in memory so tail reads (live subscribers catching up, cache gets of
/// fresh keys) need no file op.
pub const DEFAULT_TAIL_CACHE_BYTES: usize = 4 << 20;
/// Encoded bytes accepted but not yet written; past this, `append` refuses (backpressure).
pub const DEFAULT_MAX_PENDING_BYTES: usize = 64 << 20;
/// The most buffer space an append reserves ahead for the writes after it (a spare buffer
/// stays with an idle log, so this bounds what each log can hold unused).
pub const WRITE_BUFFER_MAX_BYTES: usize = 1 << 20;
/// How often retention bounds are checked when any is set.
pub const DEFAULT_RETENTION_CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// Chunk size for recovery scans and compaction reads: memory per open stays bounded.
pub const SCAN_READ_BYTES: u32 = 1 << 20;
/// Smallest and largest single read a range read issues.
pub const READ_MIN_BYTES: u32 = 64 << 10;
pub const READ_MAX_BYTES: u32 = 4 << 20;
/// Read tickets outstanding at once, per log.
pub const MAX_READS_IN_FLIGHT: usize = 256;
/// Records returned by one read at most, whatever its byte budget.
pub const MAX_RECORDS_PER_READ: usize = 10_000;
/// Write padding. With direct I/O the runtime writes whole blocks of this size at aligned
/// offsets, and the tail of the last block past the log's bytes is zeros (the next append
/// rewrites that block). So any segment may end in fewer than this many zero bytes after
/// its last entry, its length then being a multiple of this: that is padding, not damage.
pub const WRITE_PADDING_BLOCK: u64 = 4096;

/// When appended bytes are forced to the device, and so what an acknowledgement means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncMode {
    /// Never on the append path (only at segment roll and on request). Durable = written
    /// to the page cache: survives a process crash, not a machine crash.
    None,
    /// Within the interval of the first unsynced append. Durable = written.
    Periodic(Duration),
    /// Before the append counts as durable. Durable = fsynced. Group commit: one sync
    /// releases every append queued behind the one in flight.
    OnCommit,
}

impl Default for FsyncMode {
    fn default() -> Self {
        FsyncMode::Periodic(DEFAULT_FSYNC_INTERVAL)
    }
}

impl FsyncMode {
    /// `none` | `periodic` | `on_commit` (`FELIX_DURABLE_FSYNC_MODE`); `interval` is used by
    /// `periodic` (`FELIX_DURABLE_FSYNC_INTERVAL_MS`).
    pub fn parse(name: &str, interval: Duration) -> Result<FsyncMode, String> {
        match name {
            "none" => Ok(FsyncMode::None),
            "periodic" if interval.is_zero() => Err("fsync interval must be above zero".into()),
            "periodic" => Ok(FsyncMode::Periodic(interval)),
            "on_commit" => Ok(FsyncMode::OnCommit),
            other => Err(format!(
                "unknown fsync mode {other:?}: expected none, periodic or on_commit"
            )),
        }
    }
}

/// Settings for one log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    pub fsync: FsyncMode,
    pub segment_max_bytes: u64,
    pub tail_cache_bytes: usize,
    pub max_pending_bytes: usize,
    /// Delete the oldest sealed segments while the log is larger than this.
    pub retention_bytes: Option<u64>,
    /// Delete sealed segments whose newest record is older than this.
    pub retention_age: Option<Duration>,
    pub retention_check_interval: Duration,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            fsync: FsyncMode::default(),
            segment_max_bytes: DEFAULT_SEGMENT_MAX_BYTES,
            tail_cache_bytes: DEFAULT_TAIL_CACHE_BYTES,
            max_pending_bytes: DEFAULT_MAX_PENDING_BYTES,
            retention_bytes: None,
            retention_age: None,
            retention_check_interval: DEFAULT_RETENTION_CHECK_INTERVAL,
        }
    }
}

/// A failure that stops a log: at open, or a write that leaves the files in doubt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageError {
    /// Bytes that are not a repairable torn tail are wrong. Refusing beats guessing, because
    /// the damaged record may have been acknowledged.
    Corrupt {
        path: String,
        pos: u64,
        what: String,
    },
    /// A file op failed.
    Io {
        op: &'static str,
        path: String,
        error: FileError,
    },
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Corrupt { path, pos, what } => {
                write!(f, "corrupt log file {path} at byte {pos}: {what}")
            }
            StorageError::Io { op, path, error } => write!(f, "{op} {path}: {error}"),
        }
    }
}

impl std::error::Error for StorageError {}

/// Why `append` refused a batch. Nothing was assigned an offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendError {
    /// The log has not finished opening (or failed to).
    NotOpen,
    /// An earlier write or sync failed; nothing more is accepted until a restart re-reads
    /// what reached the disk.
    Failed(StorageError),
    Empty,
    PublisherTooLong,
    /// The encoded batch is larger than [`MAX_ENTRY_BYTES`].
    TooLarge(usize),
    /// Too many bytes wait to be written ([`LogConfig::max_pending_bytes`]).
    Backpressure,
    /// `append_framed`: the first entry is not at `expected` (the log's next offset), or an
    /// entry does not start where the one before it ended (a skip entry counts as a jump
    /// from its base to its end). `append_framed_with_gaps`: an entry starts below
    /// `expected` (the next offset, or where the entry before it ended), or the first one
    /// not at the base given.
    NotContiguous {
        expected: u64,
        got: u64,
    },
    /// `append_framed`: the entry `pos` bytes into the shipped bytes is damaged or cut
    /// short. Nothing was appended.
    Damaged {
        pos: usize,
        what: String,
    },
    /// A `truncate_to` is running; appends wait for [`ReplicaEvent::Truncated`].
    Truncating,
    /// The log is a follower's copy ([`ShardLog::take_only_shipped`]): only entries shipped
    /// from its leader are appended, never one written here.
    ShippedOnly,
}

/// Why `read` refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    NotOpen,
    /// Those offsets existed and retention removed them; `oldest` is the first kept.
    Trimmed {
        requested: u64,
        oldest: u64,
    },
    /// [`MAX_READS_IN_FLIGHT`] reads are outstanding.
    Busy,
    /// The read failed or found damage.
    Failed(StorageError),
}

/// One publish batch to append. Every record in it shares the time and publisher.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// Wall-clock append time in µs since the Unix epoch (stored; drives retention by age).
    pub time_us: u64,
    /// The publishing principal (≤ 255 bytes), or none.
    pub publisher: Option<&'a [u8]>,
    pub payloads: &'a [Bytes],
}

/// Names a read; its result arrives as [`LogEvent::Read`] with the same ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadTicket(pub u64);

/// Records that share an entry: consecutive offsets from `first_offset`, unless the log is
/// compacted, where each batch holds one record and offsets may skip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBatch {
    pub first_offset: u64,
    pub time_us: u64,
    pub publisher: Option<Bytes>,
    pub payloads: Vec<Bytes>,
}

/// What a read returned: records from the requested offset on, in order, and where the
/// next read should start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadBatch {
    pub batches: Vec<StoredBatch>,
    pub next_offset: u64,
}

impl ReadBatch {
    pub fn record_count(&self) -> usize {
        self.batches.iter().map(|b| b.payloads.len()).sum()
    }
}

/// What the log reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEvent {
    /// Recovery finished; appends and reads are accepted. `truncated_bytes` were cut from a
    /// torn tail (write padding cut from the newest segment is not counted: it held nothing).
    Opened {
        start_offset: u64,
        next_offset: u64,
        truncated_bytes: u64,
    },
    /// Every record below `up_to` is durable under the fsync mode: acknowledge and fan out.
    Durable { up_to: u64 },
    Read {
        ticket: ReadTicket,
        result: Result<ReadBatch, ReadError>,
    },
    /// Retention removed whole segments; reads below `start_offset` now fail as trimmed.
    Trimmed { start_offset: u64 },
    /// A compaction pass finished: `bytes_before` of sealed segments are now `bytes_after`.
    Compacted { bytes_before: u64, bytes_after: u64 },
    /// A compaction pass stopped before changing anything; the log goes on as it was.
    CompactionFailed(StorageError),
    /// The log stopped: open failed, or a write or sync did. Appends at or past the last
    /// `Durable` will never be; fail them.
    Failed(StorageError),
    /// Replication: a framed read's answer, a finished truncation, a durable replica state
    /// (one variant, so owners that do not replicate ignore them with one arm).
    Replica(ReplicaEvent),
}

#[derive(Debug)]
enum Phase {
    Opening(Box<Opening>),
    Ready,
    Failed,
}

/// What an op in flight was for.
#[derive(Debug)]
enum Inflight {
    Open,
    Write(WriteJob),
    Read(u64),
    Compact,
    /// A step of `truncate_to`.
    Truncate,
    /// A step of writing the replica state file.
    ReplicaState,
}

#[derive(Debug)]
enum WriteJob {
    /// One step of making segment `base` (see [`Stage`]).
    Stage {
        base: u64,
    },
    Append {
        base: u64,
        bytes: Bytes,
        entries: Vec<PendingEntry>,
        end: u64,
    },
    Sync {
        base: u64,
        len: u64,
        covers: u64,
    },
    Task(Task),
}

/// Directory housekeeping queued on the write lane.
#[derive(Debug, Clone)]
enum Task {
    Remove(String),
    SyncDir,
}

#[derive(Debug, Clone, Copy)]
struct PendingEntry {
    base: u64,
    end: u64,
    /// Position within the pending buffer.
    rel: usize,
    len: usize,
}

/// Encoded entries for one segment, not yet handed to the runtime.
#[derive(Debug)]
struct Pending {
    base: u64,
    buf: BytesMut,
    entries: Vec<PendingEntry>,
    end: u64,
    /// When the oldest entry in `buf` was appended.
    since: Option<Instant>,
}

#[derive(Debug)]
struct TailEntry {
    base: u64,
    /// One past its last offset.
    end: u64,
    bytes: Bytes,
    /// The whole write it came in and where in it the entry starts, so a framed read
    /// can hand out consecutive entries of one write as one slice.
    write: Bytes,
    rel: usize,
    /// Its position in its segment file.
    pos: u64,
}

#[derive(Debug)]
struct ReadJob {
    ticket: ReadTicket,
    next: u64,
    limit: u64,
    max_records: usize,
    max_bytes: usize,
    records: usize,
    bytes: usize,
    /// A record was left out for the budget: the answer ends before it.
    full: bool,
    out: Vec<StoredBatch>,
    /// A framed read (`read_framed`): whole entries as stored, not records.
    framed: Option<replica::FramedAcc>,
    /// Where the last chunk stopped, to continue without a new index lookup.
    resume: Option<(u64, u64)>,
    in_flight: Option<(u64, u64)>,
}

/// One shard's log. See the module docs for how to drive it.
#[derive(Debug)]
pub struct ShardLog {
    id: LogId,
    dir: String,
    cfg: LogConfig,
    phase: Phase,
    replay: Option<VecDeque<DecodedEntry>>,
    /// Extensions (producer marks, commit state) of the entries recovery scanned, for the
    /// broker to rebuild producers and state from (`take_scanned_ext`).
    scanned_ext: VecDeque<record::ScannedExt>,
    /// What `append_framed` appended, entry by entry, for the owner (`take_appended`).
    appended: VecDeque<AppendedEntry>,
    /// A `truncate_to` in progress: it has both write lanes until it is done.
    truncation: Option<Box<Truncation>>,
    /// A `restart_at` in progress: the offset the log starts again at, reported once its
    /// new segment is on the device.
    restarting: Option<u64>,
    /// The replica state file: loaded at open, rewritten by `persist_replica_state`.
    replica: crate::replica_state::StateFile,
    segments: Vec<Segment>,
    next_offset: u64,
    written_offset: u64,
    /// A leader ships from here before its own sync: framed reads go up to what is written,
    /// and each write is reported (`ReplicaEvent::Written`).
    ship_written: bool,
    /// A follower's copy: local appends are refused (`AppendError::ShippedOnly`).
    only_shipped: bool,
    synced_offset: u64,
    reported_durable: u64,
    pending: VecDeque<Pending>,
    pending_bytes: usize,
    /// The oldest append not covered by an issued sync (periodic mode's clock).
    dirty_since: Option<Instant>,
    /// An append is waiting for [`ShardLog::poll_op`] to consider the write lane.
    write_due: bool,
    /// The size of the last record write, to size the next buffer.
    last_write_bytes: usize,
    /// Buffers of completed writes, reused once the tail cache lets go of them.
    write_buffers: WriteBuffers,
    /// A sync of everything was asked for (`sync_now`); holds until nothing is pending.
    sync_requested: bool,
    /// The periodic interval ran out; the next sync clears it.
    periodic_due: bool,
    next_retention_check: Instant,
    /// Offsets at or above this are kept whatever the retention bounds say: the owner still
    /// needs them to rebuild what it keeps (a stream's commit state).
    retention_floor: Option<u64>,
    /// Records below this are no longer served, though a segment straddling it may still
    /// hold some: a copy cut where its leader decided ([`ShardLog::trim_to`]) keeps a
    /// segment that also holds records at or above the cut until it is wholly below.
    trimmed_below: u64,
    /// The write lane: an append, a segment-creation step or a housekeeping task.
    lane: Option<OpId>,
    /// The lane holds an append; `appending_since` is when its oldest entry was appended.
    appending: bool,
    appending_since: Option<Instant>,
    /// A sync in flight. One of written records may run beside an append on `lane`.
    sync_lane: Option<OpId>,
    tasks: VecDeque<Task>,
    inflight: HashMap<OpId, Inflight>,
    tail: VecDeque<TailEntry>,
    tail_bytes: usize,
    reads: HashMap<u64, ReadJob>,
    parked_reads: Vec<u64>,
    next_ticket: u64,
    compaction: Option<Box<Compaction>>,
    /// Compaction takes only segments ending at or below this (a replicated log's leader
    /// keeps it below what its followers hold); `None`: no bound.
    compact_below: Option<u64>,
    next_seq: u32,
    ops: VecDeque<FileOp>,
    events: VecDeque<LogEvent>,
    poison: Option<StorageError>,
}

impl ShardLog {
    /// Starts opening the log in `dir` (relative to the storage root): recovery runs as file
    /// ops, and [`LogEvent::Opened`] (or [`LogEvent::Failed`]) says when it is done.
    pub fn open(id: LogId, dir: String, cfg: LogConfig, now: Instant) -> ShardLog {
        let mut log = ShardLog {
            id,
            dir,
            next_retention_check: now + cfg.retention_check_interval,
            retention_floor: None,
            trimmed_below: 0,
            cfg,
            phase: Phase::Opening(Box::default()),
            replay: None,
            scanned_ext: VecDeque::new(),
            appended: VecDeque::new(),
            truncation: None,
            restarting: None,
            replica: crate::replica_state::StateFile::default(),
            segments: Vec::new(),
            next_offset: 0,
            written_offset: 0,
            ship_written: false,
            only_shipped: false,
            synced_offset: 0,
            reported_durable: 0,
            pending: VecDeque::new(),
            pending_bytes: 0,
            dirty_since: None,
            write_due: false,
            last_write_bytes: 0,
            write_buffers: WriteBuffers::default(),
            sync_requested: false,
            periodic_due: false,
            lane: None,
            appending: false,
            appending_since: None,
            sync_lane: None,
            tasks: VecDeque::new(),
            inflight: HashMap::new(),
            tail: VecDeque::new(),
            tail_bytes: 0,
            reads: HashMap::new(),
            parked_reads: Vec::new(),
            next_ticket: 0,
            compaction: None,
            compact_below: None,
            next_seq: 0,
            ops: VecDeque::new(),
            events: VecDeque::new(),
            poison: None,
        };
        log.open_next();
        log
    }

    /// Like [`ShardLog::open`], and every valid entry recovery scans is also handed out
    /// through `take_replayed` (the cache rebuilds its key index this way).
    pub fn open_replaying(id: LogId, dir: String, cfg: LogConfig, now: Instant) -> ShardLog {
        let mut log = ShardLog::open(id, dir, cfg, now);
        log.replay = Some(VecDeque::new());
        log
    }

    // ---- getters ------------------------------------------------------------------------

    pub fn id(&self) -> LogId {
        self.id
    }

    pub fn dir(&self) -> &str {
        &self.dir
    }

    pub fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Ready)
    }

    /// The oldest offset still held (retention moves it up).
    pub fn start_offset(&self) -> u64 {
        let physical = self.segments.first().map_or(self.next_offset, |s| s.base);
        physical.max(self.trimmed_below.min(self.next_offset))
    }

    /// The offset the next appended record gets.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Records below this are durable under the fsync mode (what may be acknowledged).
    pub fn durable_offset(&self) -> u64 {
        match self.cfg.fsync {
            FsyncMode::OnCommit => self.synced_offset,
            FsyncMode::None | FsyncMode::Periodic(_) => self.written_offset,
        }
    }

    /// Records below this are on the device.
    pub fn synced_offset(&self) -> u64 {
        self.synced_offset
    }

    /// Bytes in segment files, pending appends included.
    pub fn total_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.len).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Housekeeping file operations queued and not yet issued: a segment's removal after a
    /// retention cut or a trim, and the directory sync after each. Files below a cut are on
    /// disk until this reaches zero.
    pub fn housekeeping_queued(&self) -> usize {
        self.tasks.len()
    }

    pub fn config(&self) -> &LogConfig {
        &self.cfg
    }

    /// No op in flight or queued, nothing pending, nothing to sync. A shutdown calls
    /// [`ShardLog::sync_now`] and drives the log until this holds.
    pub fn is_idle(&self) -> bool {
        self.inflight.is_empty()
            && self.ops.is_empty()
            && self.truncation.is_none()
            && self.replica.is_idle()
            && self.pending.iter().all(|p| p.buf.is_empty())
            && self.tasks.is_empty()
            && self.segments.iter().all(|s| s.stage == Stage::Ready)
            && (self.poison.is_some() || self.synced_offset == self.written_offset)
    }

    // ---- outputs ------------------------------------------------------------------------

    /// The next file op for the runtime.
    #[must_use]
    pub fn poll_op(&mut self) -> Option<FileOp> {
        if std::mem::take(&mut self.write_due) {
            self.drive();
        }
        self.ops.pop_front()
    }

    /// The next thing that happened.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<LogEvent> {
        self.events.pop_front()
    }

    /// When [`ShardLog::handle_timeout`] next has work: the periodic fsync of the oldest
    /// unsynced append, or the retention check.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.is_open() {
            return None;
        }
        let sync = match self.cfg.fsync {
            FsyncMode::Periodic(iv) if !self.periodic_due => self.dirty_since.map(|t| t + iv),
            _ => None,
        };
        let retention = (self.cfg.retention_bytes.is_some() || self.cfg.retention_age.is_some())
            .then_some(self.next_retention_check);
        match (sync, retention) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn scanned_ext_len(&self) -> usize {
        self.scanned_ext.len()
    }

    /// The next extension recovery scanned, oldest first.
    pub fn take_scanned_ext(&mut self) -> Option<record::ScannedExt> {
        self.scanned_ext.pop_front()
    }

    /// Entries recovery scanned, for a log opened with [`ShardLog::open_replaying`].
    pub fn take_replayed(&mut self) -> Option<DecodedEntry> {
        self.replay.as_mut()?.pop_front()
    }

    // ---- inputs -------------------------------------------------------------------------

    /// Deadlines due at `now`; `unix_micros` is the same moment on the wall clock (retention
    /// by age compares it with stored append times).
    pub fn handle_timeout(&mut self, now: Instant, unix_micros: u64) {
        if !self.is_open() {
            return;
        }
        if let (FsyncMode::Periodic(iv), Some(since)) = (self.cfg.fsync, self.dirty_since) {
            if since + iv <= now {
                self.periodic_due = true;
            }
        }
        if now >= self.next_retention_check {
            self.next_retention_check = now + self.cfg.retention_check_interval;
            self.enforce_retention(unix_micros);
        }
        self.drive();
    }

    /// A file op finished.
    pub fn handle_completion(&mut self, c: FileCompletion) {
        let Some(what) = self.inflight.remove(&c.id) else {
            return; // not ours, or from before a failure; nothing waits on it
        };
        match what {
            Inflight::Open => {
                if let Phase::Opening(_) = self.phase {
                    self.open_complete(c.result);
                }
            }
            Inflight::Write(job) => {
                if self.lane == Some(c.id) {
                    self.lane = None;
                    self.appending = false;
                    self.appending_since = None;
                }
                if self.sync_lane == Some(c.id) {
                    self.sync_lane = None;
                }
                self.write_complete(job, c.result);
            }
            Inflight::Read(ticket) => self.read_complete(ticket, c.result),
            Inflight::Compact => self.compact_complete(c.result),
            Inflight::Truncate => self.truncate_complete(c.result),
            Inflight::ReplicaState => self.replica_state_complete(c.result),
        }
        self.drive();
    }

    // ---- internals: ids and ops ---------------------------------------------------------

    fn issue(&mut self, kind: FileOpKind, what: Inflight) -> OpId {
        let id = OpId::new(self.id, self.next_seq);
        self.next_seq = self.next_seq.wrapping_add(1);
        self.inflight.insert(id, what);
        self.ops.push_back(FileOp { id, kind });
        id
    }

    fn seg_index(&self, base: u64) -> Option<usize> {
        self.segments.binary_search_by_key(&base, |s| s.base).ok()
    }

    fn fail(&mut self, e: StorageError) {
        if self.poison.is_some() || matches!(self.phase, Phase::Failed) {
            return;
        }
        tracing::error!(dir = %self.dir, error = %e, "durable log stopped");
        self.poison = Some(e.clone());
        if let Phase::Opening(_) = self.phase {
            self.phase = Phase::Failed;
        }
        self.pending.clear();
        self.pending_bytes = 0;
        self.events.push_back(LogEvent::Failed(e));
        // Reads go on below the durable mark; a compaction does not.
        self.compaction = None;
        for key in std::mem::take(&mut self.parked_reads) {
            self.advance_read(key);
        }
    }

    fn io_error(op: &FileOpKind, error: FileError) -> StorageError {
        StorageError::Io {
            op: op.name(),
            path: op.path().to_owned(),
            error,
        }
    }

    /// Emits whatever can go out now: the next write, parked reads, compaction steps.
    fn drive(&mut self) {
        if !self.is_open() {
            return;
        }
        self.drive_truncation();
        self.drive_writes();
        self.drive_compaction();
        self.drive_replica_state();
        self.report_durable();
    }

    fn report_durable(&mut self) {
        let d = self.durable_offset();
        if d > self.reported_durable {
            self.reported_durable = d;
            if let Some(LogEvent::Durable { up_to }) = self.events.back_mut() {
                *up_to = d;
            } else {
                self.events.push_back(LogEvent::Durable { up_to: d });
            }
        }
    }
}

#[cfg(test)]
mod gap_tests;
#[cfg(test)]
mod replica_tests;
#[cfg(test)]
mod tests;
