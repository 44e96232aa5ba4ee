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

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::layout::{self, FileName};
use crate::ops::{FileCompletion, FileError, FileOp, FileOpKind, FileOutput, LogId, OpId};
use crate::record::{
    self, DecodedEntry, EntryMeta, SegmentHeader, Step, MAX_ENTRY_BYTES, MAX_PUBLISHER_BYTES,
    SEGMENT_HEADER_LEN,
};
use crate::segment::{Segment, Stage};
use crate::write_buffers::WriteBuffers;

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
/// Power loss zero-fills whole sectors; the torn-tail rule reasons in these units.
const SECTOR_BYTES: u64 = 512;
/// Write padding. With direct I/O the runtime writes whole blocks of this size at aligned
/// offsets, and the tail of the last block past the log's bytes is zeros (the next append
/// rewrites that block). So any segment may end in fewer than this many zero bytes after
/// its last entry, its length then being a multiple of this: that is padding, not damage.
pub const WRITE_PADDING_BLOCK: u64 = 4096;

/// Whether zeros from `at` to the end of a file of `file_len` bytes are write padding
/// ([`WRITE_PADDING_BLOCK`]); the caller checks that they are zeros.
fn is_write_padding(at: u64, file_len: u64) -> bool {
    at < file_len
        && file_len.is_multiple_of(WRITE_PADDING_BLOCK)
        && file_len - at < WRITE_PADDING_BLOCK
}

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
    bytes: Bytes,
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
    segments: Vec<Segment>,
    next_offset: u64,
    written_offset: u64,
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
            cfg,
            phase: Phase::Opening(Box::default()),
            replay: None,
            scanned_ext: VecDeque::new(),
            segments: Vec::new(),
            next_offset: 0,
            written_offset: 0,
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
        self.segments.first().map_or(self.next_offset, |s| s.base)
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

    pub fn config(&self) -> &LogConfig {
        &self.cfg
    }

    /// No op in flight or queued, nothing pending, nothing to sync. A shutdown calls
    /// [`ShardLog::sync_now`] and drives the log until this holds.
    pub fn is_idle(&self) -> bool {
        self.inflight.is_empty()
            && self.ops.is_empty()
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

    /// Where to read from for the first entry stamped at or after `at_micros`: every entry
    /// below the returned offset is stamped earlier, even if the clock stepped back, and
    /// the one wanted follows within about an index interval. `None` when every record is
    /// older.
    pub fn seek_time(&self, at_micros: u64) -> Option<u64> {
        let i = self
            .segments
            .iter()
            .position(|s| s.has_entries() && s.newest_time_us >= at_micros)?;
        Some(self.segments[i].seek_time(at_micros))
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
        }
        self.drive();
    }

    // ---- commands -----------------------------------------------------------------------

    /// Appends one batch and returns the offset of its first record. The batch becomes
    /// durable later: watch for [`LogEvent::Durable`] covering it before acknowledging.
    pub fn append(&mut self, now: Instant, batch: Batch<'_>) -> Result<u64, AppendError> {
        self.append_ext(now, batch, &record::EntryExt::NONE)
    }

    /// [`ShardLog::append`] of an entry that also carries a producer mark or commit state.
    pub fn append_ext(
        &mut self,
        now: Instant,
        batch: Batch<'_>,
        ext: &record::EntryExt<'_>,
    ) -> Result<u64, AppendError> {
        if let Some(e) = &self.poison {
            return Err(AppendError::Failed(e.clone()));
        }
        if !self.is_open() {
            return Err(AppendError::NotOpen);
        }
        if batch.payloads.is_empty() {
            return Err(AppendError::Empty);
        }
        let publisher = batch.publisher.unwrap_or_default();
        if publisher.len() > MAX_PUBLISHER_BYTES {
            return Err(AppendError::PublisherTooLong);
        }
        let len = record::entry_len_ext(publisher, batch.payloads, ext);
        if len > MAX_ENTRY_BYTES || batch.payloads.len() > u32::MAX as usize {
            return Err(AppendError::TooLarge(len));
        }
        if self.pending_bytes + len > self.cfg.max_pending_bytes && self.pending_bytes > 0 {
            return Err(AppendError::Backpressure);
        }

        let first = self.next_offset;
        let active = self.segments.last().expect("an open log has a segment");
        if active.has_entries() && active.len + len as u64 > self.cfg.segment_max_bytes {
            self.segments.push(Segment::new_unborn(&self.dir, first));
        }
        let seg = self.segments.last_mut().expect("an open log has a segment");
        if self.pending.back().is_none_or(|p| p.base != seg.base) {
            self.pending.push_back(Pending {
                base: seg.base,
                buf: BytesMut::new(),
                entries: Vec::new(),
                end: first,
                since: None,
            });
        }
        let p = self.pending.back_mut().expect("pushed above");
        if p.buf.capacity() - p.buf.len() < len {
            // Room for about one more write like the last, so a busy log fills one buffer
            // per write instead of regrowing (and copying) it append by append.
            let room = self
                .last_write_bytes
                .clamp(len, WRITE_BUFFER_MAX_BYTES.max(len));
            if p.buf.is_empty() {
                p.buf = self.write_buffers.take(room);
            } else {
                p.buf.reserve(room);
            }
        }
        let rel = p.buf.len();
        record::encode_entry_ext(
            &mut p.buf,
            first,
            batch.time_us,
            publisher,
            batch.payloads,
            ext,
        );
        let count = batch.payloads.len() as u32;
        let meta = EntryMeta {
            base: first,
            count,
            time_us: batch.time_us,
            len: len as u32,
        };
        let pos = seg.len;
        seg.note_entry(pos, &meta);
        p.entries.push(PendingEntry {
            base: first,
            rel,
            len,
        });
        p.end = meta.end();
        self.pending_bytes += len;
        self.next_offset = meta.end();
        p.since.get_or_insert(now);
        self.dirty_since.get_or_insert(now);
        // The write goes out when the ops are next polled, so every append of one turn
        // shares it (one write per turn rather than one per append).
        self.write_due = true;
        Ok(first)
    }

    #[cfg(test)]
    pub(crate) fn write_buffers(&self) -> &WriteBuffers {
        &self.write_buffers
    }

    /// Asks for a sync of everything written so far, whatever the mode (shutdown, or a
    /// caller that wants a point on the device).
    pub fn sync_now(&mut self) {
        self.sync_requested = true;
        self.drive();
    }

    /// Reads records from `from_offset` on: at most `max_records`, and payload bytes up to
    /// `max_bytes` (but always at least one record when there is one). Only durable records
    /// are returned. The result comes as [`LogEvent::Read`]; when the tail cache holds the
    /// range it is queued before this returns.
    pub fn read(
        &mut self,
        from_offset: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<ReadTicket, ReadError> {
        if !self.is_open() {
            return Err(ReadError::NotOpen);
        }
        if from_offset < self.start_offset() {
            return Err(ReadError::Trimmed {
                requested: from_offset,
                oldest: self.start_offset(),
            });
        }
        if self.reads.len() >= MAX_READS_IN_FLIGHT {
            return Err(ReadError::Busy);
        }
        let ticket = ReadTicket(self.next_ticket);
        self.next_ticket += 1;
        let job = ReadJob {
            ticket,
            next: from_offset,
            limit: self.durable_offset(),
            max_records: max_records.clamp(1, MAX_RECORDS_PER_READ),
            max_bytes,
            records: 0,
            bytes: 0,
            full: false,
            out: Vec::new(),
            resume: None,
            in_flight: None,
        };
        self.reads.insert(ticket.0, job);
        self.advance_read(ticket.0);
        Ok(ticket)
    }

    /// Keeps every segment holding an offset at or above `floor` through retention (`None`:
    /// retention alone decides).
    pub fn set_retention_floor(&mut self, floor: Option<u64>) {
        self.retention_floor = floor;
    }

    /// Removes whole sealed segments from the head while a retention bound is exceeded.
    /// Runs on the retention timer; callable directly. Never touches the active segment, a
    /// segment being read, or anything while a compaction runs.
    pub fn enforce_retention(&mut self, unix_micros: u64) {
        if !self.is_open() || self.compaction.is_some() || self.poison.is_some() {
            return;
        }
        let mut total = self.total_bytes();
        let age_us = self
            .cfg
            .retention_age
            .map(|a| u64::try_from(a.as_micros()).unwrap_or(u64::MAX));
        let mut removed = false;
        while self.segments.len() >= 2 {
            let (s0, s1) = (&self.segments[0], &self.segments[1]);
            // Sealed means its successor exists on disk, which happens only after its sync.
            if s1.stage != Stage::Ready || s0.reads_in_flight > 0 {
                break;
            }
            if self.retention_floor.is_some_and(|floor| s0.end > floor) {
                break;
            }
            let over_size = self.cfg.retention_bytes.is_some_and(|b| total > b);
            let too_old = age_us.is_some_and(|a| s0.newest_time_us.saturating_add(a) < unix_micros);
            if !(over_size || too_old) {
                break;
            }
            total -= s0.len;
            let s0 = self.segments.remove(0);
            // Oldest first, each unlink made durable before the next: a crash can only
            // leave a longer log, never one with a hole in it.
            self.tasks.push_back(Task::Remove(s0.path));
            self.tasks.push_back(Task::SyncDir);
            removed = true;
        }
        if removed {
            let start = self.start_offset();
            self.evict_tail_below(start);
            self.events.push_back(LogEvent::Trimmed {
                start_offset: start,
            });
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
        self.drive_writes();
        self.drive_compaction();
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

    // ---- the write lane -----------------------------------------------------------------

    fn sync_wanted(&self) -> bool {
        self.cfg.fsync == FsyncMode::OnCommit || self.sync_requested || self.periodic_due
    }

    fn drive_writes(&mut self) {
        if self.poison.is_some() {
            return;
        }
        let lanes_idle = self.lane.is_none() && self.sync_lane.is_none();
        if let Some(task) = self.tasks.front() {
            // Housekeeping has both lanes to itself, in order.
            if lanes_idle {
                let kind = match task {
                    Task::Remove(path) => FileOpKind::Remove { path: path.clone() },
                    Task::SyncDir => FileOpKind::SyncDir {
                        path: self.dir.clone(),
                    },
                };
                let task = self.tasks.pop_front().expect("peeked");
                self.lane = Some(self.issue(kind, Inflight::Write(WriteJob::Task(task))));
            }
            return;
        }
        while self.pending.len() > 1 && self.pending[0].buf.is_empty() {
            self.pending.pop_front();
        }
        // A segment being born. Its predecessor is sealed first: every byte written, then
        // synced. So a segment file exists only once every older one is complete on the
        // device, which is what lets recovery treat damage in any older file as corruption.
        // Sealing and creation take both lanes: nothing else is in flight meanwhile.
        if let Some(i) = self.segments.iter().position(|s| s.stage != Stage::Ready) {
            let prev_unwritten =
                i > 0 && self.segments[i - 1].written_len < self.segments[i - 1].len;
            if !prev_unwritten {
                if !lanes_idle {
                    return;
                }
                if i > 0 && self.segments[i - 1].synced_len < self.segments[i - 1].written_len {
                    self.issue_sync(i - 1);
                    return;
                }
                let seg = &self.segments[i];
                let (base, path) = (seg.base, seg.path.clone());
                let kind = match seg.stage {
                    Stage::Create => FileOpKind::Create { path },
                    Stage::Header => FileOpKind::Append {
                        path,
                        bytes: Bytes::copy_from_slice(
                            &SegmentHeader {
                                base,
                                compacted_end: None,
                            }
                            .encode(),
                        ),
                    },
                    Stage::SyncFile => FileOpKind::Sync { path },
                    Stage::SyncDir => FileOpKind::SyncDir {
                        path: self.dir.clone(),
                    },
                    Stage::Ready => unreachable!("found by stage != Ready"),
                };
                self.lane = Some(self.issue(kind, Inflight::Write(WriteJob::Stage { base })));
                return;
            }
        }
        // Written but unsynced bytes and a reason to sync them. The sync may overlap the
        // append in flight: it covers only the writes already complete, and the bytes of
        // that append wait for the next one. Group commit happens here: appends made while
        // a sync is in flight go out as one write and the next sync covers all of it.
        let sync_may_go = self.sync_lane.is_none() && (self.lane.is_none() || self.appending);
        if sync_may_go && self.sync_wanted() {
            let unsynced = self
                .segments
                .iter()
                .rposition(|s| s.stage == Stage::Ready && s.synced_len < s.written_len);
            if let Some(i) = unsynced {
                self.issue_sync(i);
            } else if !self.appending && self.pending_is_empty() {
                // Nothing to sync and nothing on its way to being written: the reasons lapse.
                // (Bytes pending or being written keep them: they get a sync once written.)
                self.periodic_due = false;
                self.sync_requested = false;
            }
        }
        if self.lane.is_some() {
            return;
        }
        let Some(front) = self.pending.front_mut() else {
            return;
        };
        let Ok(i) = self.segments.binary_search_by_key(&front.base, |s| s.base) else {
            return;
        };
        if self.segments[i].stage != Stage::Ready || front.buf.is_empty() {
            return;
        }
        // The whole buffer goes with the write (its spare room too), so it can be reused
        // as a unit once the tail cache lets go of it.
        let bytes = std::mem::take(&mut front.buf).freeze();
        let bytes_len = bytes.len();
        let entries = std::mem::take(&mut front.entries);
        let (end, base) = (front.end, front.base);
        let since = front.since.take();
        if self.pending.len() > 1 {
            self.pending.pop_front();
        }
        let kind = FileOpKind::Append {
            path: self.segments[i].path.clone(),
            bytes: bytes.clone(),
        };
        let job = WriteJob::Append {
            base,
            bytes,
            entries,
            end,
        };
        self.last_write_bytes = bytes_len;
        self.lane = Some(self.issue(kind, Inflight::Write(job)));
        self.appending = true;
        self.appending_since = since;
    }

    fn pending_is_empty(&self) -> bool {
        self.pending.iter().all(|p| p.buf.is_empty())
    }

    /// Syncs segment `i`, covering every byte whose write has completed. An append in
    /// flight is not covered, whichever of the two the runtime finishes first.
    fn issue_sync(&mut self, i: usize) {
        let seg = &self.segments[i];
        let job = WriteJob::Sync {
            base: seg.base,
            len: seg.written_len,
            covers: self.written_offset,
        };
        let kind = FileOpKind::Sync {
            path: seg.path.clone(),
        };
        self.periodic_due = false;
        if !self.appending && self.pending_is_empty() {
            self.sync_requested = false;
        }
        // What is not written yet is not covered: its clock keeps running.
        self.dirty_since = self
            .pending
            .iter()
            .filter_map(|p| p.since)
            .chain(self.appending_since)
            .min();
        self.sync_lane = Some(self.issue(kind, Inflight::Write(job)));
    }

    fn write_complete(&mut self, job: WriteJob, result: Result<FileOutput, FileError>) {
        if let Err(error) = result {
            let kind = self.describe_job(&job);
            self.fail(Self::io_error(&kind, error));
            return;
        }
        match job {
            WriteJob::Stage { base } => {
                let Some(i) = self.seg_index(base) else {
                    return;
                };
                let seg = &mut self.segments[i];
                seg.stage = match seg.stage {
                    Stage::Create => {
                        seg.written_len = 0;
                        seg.synced_len = 0;
                        Stage::Header
                    }
                    Stage::Header => {
                        seg.written_len = SEGMENT_HEADER_LEN;
                        Stage::SyncFile
                    }
                    Stage::SyncFile => {
                        seg.synced_len = seg.written_len;
                        Stage::SyncDir
                    }
                    Stage::SyncDir | Stage::Ready => Stage::Ready,
                };
            }
            WriteJob::Append {
                base,
                bytes,
                entries,
                end,
            } => {
                if let Some(i) = self.seg_index(base) {
                    self.segments[i].written_len += bytes.len() as u64;
                }
                self.pending_bytes -= bytes.len();
                self.written_offset = end;
                for e in entries {
                    self.tail_bytes += e.len;
                    self.tail.push_back(TailEntry {
                        base: e.base,
                        bytes: bytes.slice(e.rel..e.rel + e.len),
                    });
                }
                while self.tail_bytes > self.cfg.tail_cache_bytes {
                    let Some(old) = self.tail.pop_front() else {
                        break;
                    };
                    self.tail_bytes -= old.bytes.len();
                }
                self.write_buffers.retire(bytes);
            }
            WriteJob::Sync { base, len, covers } => {
                if let Some(i) = self.seg_index(base) {
                    let seg = &mut self.segments[i];
                    seg.synced_len = seg.synced_len.max(len);
                }
                self.synced_offset = self.synced_offset.max(covers);
            }
            WriteJob::Task(_) => {}
        }
        // Parked reads may now see more; a finished segment sync may let retention go on.
        self.report_durable();
    }

    /// Rebuilds the op a job was, for the error message.
    fn describe_job(&self, job: &WriteJob) -> FileOpKind {
        let path_of = |base: u64| layout::join(&self.dir, &layout::segment_name(base));
        match job {
            WriteJob::Stage { base } => FileOpKind::Create {
                path: path_of(*base),
            },
            WriteJob::Append { base, bytes, .. } => FileOpKind::Append {
                path: path_of(*base),
                bytes: bytes.clone(),
            },
            WriteJob::Sync { base, .. } => FileOpKind::Sync {
                path: path_of(*base),
            },
            WriteJob::Task(Task::Remove(path)) => FileOpKind::Remove { path: path.clone() },
            WriteJob::Task(Task::SyncDir) => FileOpKind::SyncDir {
                path: self.dir.clone(),
            },
        }
    }

    fn evict_tail_below(&mut self, offset: u64) {
        while self.tail.front().is_some_and(|e| e.base < offset) {
            let e = self.tail.pop_front().expect("checked");
            self.tail_bytes -= e.bytes.len();
        }
    }

    // ---- reads --------------------------------------------------------------------------

    fn finish_read(&mut self, job: ReadJob, result: Result<(), ReadError>) {
        let result = result.map(|()| ReadBatch {
            next_offset: job.next,
            batches: job.out,
        });
        self.events.push_back(LogEvent::Read {
            ticket: job.ticket,
            result,
        });
    }

    /// Takes the records of one entry that the job wants. Returns false once the job needs
    /// nothing past this entry.
    fn take_entry(job: &mut ReadJob, entry: &Bytes, meta: &EntryMeta) -> bool {
        if meta.end() <= job.next {
            return true;
        }
        if meta.base >= job.limit {
            // Nothing in [next, limit) is left (a compacted log skips offsets).
            job.next = job.next.max(job.limit);
            return false;
        }
        let d = record::decode_entry(entry);
        let mut taken: Vec<Bytes> = Vec::new();
        let mut first = None;
        for (i, payload) in d.payloads.into_iter().enumerate() {
            let offset = meta.base + i as u64;
            if offset < job.next {
                continue;
            }
            let full = job.records >= job.max_records
                || (job.records > 0 && job.bytes + payload.len() > job.max_bytes);
            if full {
                job.full = true;
            }
            if offset >= job.limit || full {
                break;
            }
            first.get_or_insert(offset);
            job.records += 1;
            job.bytes += payload.len();
            job.next = offset + 1;
            taken.push(payload);
        }
        if let Some(first_offset) = first {
            job.out.push(StoredBatch {
                first_offset,
                time_us: d.time_us,
                publisher: d.publisher,
                payloads: taken,
            });
        }
        job.next >= meta.end() && !Self::read_is_done(job)
    }

    fn read_is_done(job: &ReadJob) -> bool {
        job.full
            || job.next >= job.limit
            || job.records >= job.max_records
            || (job.records > 0 && job.bytes >= job.max_bytes)
    }

    /// Moves a read on: answers it from the tail cache, issues its next file read, parks it
    /// while compaction swaps files, or finishes it.
    fn advance_read(&mut self, key: u64) {
        let Some(mut job) = self.reads.remove(&key) else {
            return;
        };
        if Self::read_is_done(&job) {
            return self.finish_read(job, Ok(()));
        }
        let start = self.start_offset();
        if job.next < start {
            if job.records > 0 {
                return self.finish_read(job, Ok(()));
            }
            let err = ReadError::Trimmed {
                requested: job.next,
                oldest: start,
            };
            return self.finish_read(job, Err(err));
        }
        // The tail cache is contiguous up to everything written, so it answers alone.
        if self.tail.front().is_some_and(|e| e.base <= job.next) {
            for e in &self.tail {
                let Step::Entry(meta) = record::step(&e.bytes) else {
                    unreachable!("the tail cache holds entries this log encoded");
                };
                if !Self::take_entry(&mut job, &e.bytes, &meta) {
                    break;
                }
            }
            return self.finish_read(job, Ok(()));
        }
        if self.compaction.as_ref().is_some_and(|c| c.parks_reads()) {
            self.reads.insert(key, job);
            self.parked_reads.push(key);
            return;
        }
        let mut i = self
            .segments
            .partition_point(|s| s.base <= job.next)
            .saturating_sub(1);
        while i + 1 < self.segments.len() && job.next >= self.segments[i].end {
            i += 1;
            job.next = job.next.max(self.segments[i].base);
        }
        let seg = &self.segments[i];
        let pos = match job.resume {
            Some((base, pos)) if base == seg.base => pos,
            _ => seg.seek(job.next),
        };
        if pos >= seg.written_len {
            return self.finish_read(job, Ok(()));
        }
        let want = (job.max_bytes as u64)
            .saturating_add(4096)
            .clamp(READ_MIN_BYTES.into(), READ_MAX_BYTES.into());
        let len = want.min(seg.written_len - pos) as u32;
        self.issue_read(i, job, key, pos, len);
    }

    fn issue_read(&mut self, i: usize, mut job: ReadJob, key: u64, pos: u64, len: u32) {
        let seg = &mut self.segments[i];
        seg.reads_in_flight += 1;
        job.in_flight = Some((seg.base, pos));
        let path = seg.path.clone();
        self.issue(FileOpKind::Read { path, pos, len }, Inflight::Read(key));
        self.reads.insert(key, job);
    }

    fn read_complete(&mut self, key: u64, result: Result<FileOutput, FileError>) {
        let Some(mut job) = self.reads.remove(&key) else {
            return;
        };
        let Some((base, pos)) = job.in_flight.take() else {
            return;
        };
        let seg_i = self.seg_index(base);
        if let Some(i) = seg_i {
            self.segments[i].reads_in_flight -= 1;
        }
        let path = layout::join(&self.dir, &layout::segment_name(base));
        let data = match result {
            Ok(FileOutput::Data(d)) => d,
            Ok(_) => Bytes::new(),
            Err(error) => {
                let e = StorageError::Io {
                    op: "read",
                    path,
                    error,
                };
                return self.finish_read(job, Err(ReadError::Failed(e)));
            }
        };
        let (Some(i), false) = (seg_i, data.is_empty()) else {
            return self.finish_read(job, Ok(()));
        };
        let written = self.segments[i].written_len;
        let mut at = 0usize;
        loop {
            match record::step(&data[at..]) {
                Step::Entry(meta) => {
                    let entry = data.slice(at..at + meta.len as usize);
                    let more = Self::take_entry(&mut job, &entry, &meta);
                    if job.next >= meta.end() {
                        at += meta.len as usize;
                    }
                    job.resume = Some((base, pos + at as u64));
                    if !more {
                        break;
                    }
                }
                Step::End => break,
                Step::Partial { need } => {
                    let start = pos + at as u64;
                    if start + need > written {
                        let e = StorageError::Corrupt {
                            path,
                            pos: start,
                            what: "an entry runs past the written bytes".into(),
                        };
                        return self.finish_read(job, Err(ReadError::Failed(e)));
                    }
                    job.resume = Some((base, start));
                    if at == 0 {
                        // One entry larger than the chunk: read exactly it.
                        return self.issue_read(i, job, key, start, need as u32);
                    }
                    break;
                }
                Step::Damaged { damage, .. } => {
                    let e = StorageError::Corrupt {
                        path,
                        pos: pos + at as u64,
                        what: damage.describe(),
                    };
                    return self.finish_read(job, Err(ReadError::Failed(e)));
                }
            }
        }
        self.reads.insert(key, job);
        self.advance_read(key);
    }

    // ---- recovery -----------------------------------------------------------------------

    fn opening(&mut self) -> &mut Opening {
        match &mut self.phase {
            Phase::Opening(o) => o,
            _ => unreachable!("only called while opening"),
        }
    }

    fn open_fail(&mut self, e: StorageError) {
        self.fail(e);
        self.phase = Phase::Failed;
    }

    /// Issues the next recovery op, or finishes. Called only when no recovery op is in
    /// flight; the helpers below only decide the next step, this is what acts on it.
    fn open_next(&mut self) {
        loop {
            let dir = self.dir.clone();
            let Phase::Opening(o) = &mut self.phase else {
                return;
            };
            match std::mem::replace(&mut o.step, OpenStep::Done) {
                OpenStep::CreateDir => {
                    o.step = OpenStep::List;
                    self.issue(FileOpKind::CreateDir { path: dir }, Inflight::Open);
                    return;
                }
                OpenStep::List => {
                    o.step = OpenStep::Listed;
                    self.issue(FileOpKind::ListDir { path: dir }, Inflight::Open);
                    return;
                }
                OpenStep::Listed | OpenStep::Done => return,
                OpenStep::NextSegment => self.open_next_segment(),
                OpenStep::Scanning(scan) => {
                    let kind = FileOpKind::Read {
                        path: scan.seg.path.clone(),
                        pos: scan.read_at,
                        len: scan.read_len,
                    };
                    o.step = OpenStep::Scanning(scan);
                    self.issue(kind, Inflight::Open);
                    return;
                }
                OpenStep::Cleanup => {
                    // Leftovers first (any order: each is redundant), then the torn-tail cut,
                    // then a sync of the newest file and of the directory, so what the crash
                    // left in the page cache is on the device before it counts as durable.
                    o.step = OpenStep::Cleanup;
                    let kind = if let Some(path) = o.cleanup.pop() {
                        o.dir_dirty = true;
                        FileOpKind::Remove { path }
                    } else if let Some((path, len)) = o.truncate.take() {
                        FileOpKind::Truncate { path, len }
                    } else if let Some(path) = o.sync_file.take() {
                        FileOpKind::Sync { path }
                    } else if std::mem::take(&mut o.dir_dirty) {
                        FileOpKind::SyncDir { path: dir }
                    } else {
                        return self.open_finish();
                    };
                    self.issue(kind, Inflight::Open);
                    return;
                }
            }
        }
    }

    fn open_complete(&mut self, result: Result<FileOutput, FileError>) {
        let dir = self.dir.clone();
        let step = std::mem::replace(&mut self.opening().step, OpenStep::Done);
        let output = match result {
            Ok(o) => o,
            Err(error) => {
                let (op, path) = match &step {
                    OpenStep::List => ("create_dir", dir),
                    OpenStep::Listed => ("list_dir", dir),
                    OpenStep::Scanning(s) => ("read", s.seg.path.clone()),
                    _ => ("recover", dir),
                };
                return self.open_fail(StorageError::Io { op, path, error });
            }
        };
        let next = match step {
            OpenStep::Listed => {
                let FileOutput::Listing(entries) = output else {
                    let error = FileError::new(crate::ops::FileErrorKind::Other, "not a listing");
                    let e = StorageError::Io {
                        op: "list_dir",
                        path: dir,
                        error,
                    };
                    return self.open_fail(e);
                };
                let o = self.opening();
                for e in entries.into_iter().filter(|e| !e.is_dir) {
                    match layout::parse_name(&e.name) {
                        FileName::Segment(base) => o.listing.push((base, e.len)),
                        FileName::CompactTemp(_) => o.cleanup.push(layout::join(&dir, &e.name)),
                        FileName::Other => {}
                    }
                }
                o.listing.sort_unstable();
                OpenStep::NextSegment
            }
            OpenStep::Scanning(scan) => {
                let data = match output {
                    FileOutput::Data(d) => d,
                    _ => Bytes::new(),
                };
                match self.open_scan_chunk(scan, data) {
                    Ok(next) => next,
                    Err(e) => return self.open_fail(e),
                }
            }
            other => other, // List and Cleanup go on where they were
        };
        self.opening().step = next;
        self.open_next();
    }

    /// Moves to the next listed segment: settles supersession and continuity with the one
    /// before, then starts its scan (or finishes the scan phase).
    fn open_next_segment(&mut self) {
        let dir = self.dir.clone();
        let prev = self
            .segments
            .last()
            .map(|s| (s.end, s.compacted_end, s.path.clone()));
        let o = self.opening();
        let Some(&(base, len)) = o.listing.get(o.at) else {
            o.step = OpenStep::Cleanup;
            // Without a segment, or after a compaction output, the log needs a new active one.
            let next = prev.as_ref().map_or(0, |p| p.0);
            if prev.as_ref().is_none_or(|p| p.1.is_some()) {
                self.segments.push(Segment::new_unborn(&dir, next));
            }
            return;
        };
        o.at += 1;
        let path = layout::join(&dir, &layout::segment_name(base));
        if let Some((prev_end, prev_compacted, prev_path)) = prev {
            if prev_compacted.is_some() && base < prev_end {
                // Replaced by a compaction output whose rename is on disk; its unlink is not.
                o.cleanup.push(path);
                o.step = OpenStep::NextSegment;
                return;
            }
            if base != prev_end {
                let what = if base < prev_end {
                    format!("its offsets from {base} overlap {prev_path}, which ends at {prev_end}")
                } else {
                    format!("offsets {prev_end}..{base} are missing after {prev_path}")
                };
                return self.open_fail(StorageError::Corrupt { path, pos: 0, what });
            }
        }
        let listed_last = o.at == o.listing.len();
        let scan = Box::new(SegScan {
            seg: Segment::found(&dir, base, None),
            file_len: len,
            read_at: 0,
            read_len: len.min(SCAN_READ_BYTES.into()) as u32,
            header_done: false,
            expect: base,
            listed_last,
            is_last: listed_last,
            zero: None,
        });
        let next = if len < SEGMENT_HEADER_LEN {
            self.open_headerless(scan, "the header is cut short")
        } else {
            Ok(OpenStep::Scanning(scan))
        };
        match next {
            Ok(step) => self.opening().step = step,
            Err(e) => self.open_fail(e),
        }
    }

    /// The newest segment without a complete header holds no record (the header is synced
    /// before any record is written): its creation was cut short, so it is made again.
    /// Anywhere else, the log is corrupt.
    fn open_headerless(
        &mut self,
        mut scan: Box<SegScan>,
        why: &str,
    ) -> Result<OpenStep, StorageError> {
        if !scan.listed_last {
            return Err(StorageError::Corrupt {
                path: scan.seg.path.clone(),
                pos: 0,
                what: format!("{why}, and newer segments follow"),
            });
        }
        tracing::warn!(path = %scan.seg.path, "recreating a segment whose creation was cut short");
        scan.seg.stage = Stage::Create;
        scan.seg.written_len = 0;
        scan.seg.synced_len = 0;
        scan.seg.len = SEGMENT_HEADER_LEN;
        self.opening().truncated_bytes += scan.file_len;
        self.segments.push(scan.seg);
        Ok(OpenStep::NextSegment)
    }

    /// Takes one chunk of the segment being scanned and says what to do next.
    fn open_scan_chunk(
        &mut self,
        mut scan: Box<SegScan>,
        data: Bytes,
    ) -> Result<OpenStep, StorageError> {
        let chunk_at = scan.read_at;
        let chunk_end = chunk_at + data.len() as u64;
        let at_eof = chunk_end >= scan.file_len;
        let corrupt = |scan: &SegScan, pos: u64, what: String| StorageError::Corrupt {
            path: scan.seg.path.clone(),
            pos,
            what,
        };
        if data.len() != scan.read_len as usize {
            let what = "the file is shorter than its listing said".into();
            return Err(corrupt(&scan, chunk_end, what));
        }
        if let Some(z) = scan.zero.take() {
            return self.open_check_zeros(scan, &data, 0, z);
        }
        let mut at = 0usize;
        if !scan.header_done {
            match SegmentHeader::decode(&data) {
                Ok(h) if h.base != scan.seg.base => {
                    let what = format!("the header says base {}", h.base);
                    return Err(corrupt(&scan, 0, what));
                }
                Ok(h) => {
                    if let Some(end) = h.compacted_end {
                        scan.seg.compacted_end = Some(end);
                        scan.seg.end = end;
                        // Newer files inside its range are superseded leftovers.
                        let o = self.opening();
                        scan.is_last = o.listing[o.at..].iter().all(|&(b, _)| b < end);
                    }
                    scan.header_done = true;
                    at = SEGMENT_HEADER_LEN as usize;
                }
                Err(record::HeaderError::AllZero) if scan.listed_last => {
                    // Power loss after the file grew but before its first sector landed.
                    let z = ZeroCheck {
                        damage_at: 0,
                        then: AllZero::Recreate,
                        what: "the header is zero but the file is not".into(),
                    };
                    return self.open_check_zeros(scan, &data, 0, z);
                }
                Err(e) => return Err(corrupt(&scan, 0, e.describe())),
            }
        }
        let sparse = scan.seg.compacted_end;
        loop {
            let pos = chunk_at + at as u64;
            match record::step(&data[at..]) {
                Step::Entry(meta) => {
                    let ok = match sparse {
                        None => meta.base == scan.expect,
                        Some(end) => meta.base >= scan.expect && meta.end() <= end,
                    };
                    if !ok {
                        let what = format!(
                            "entry holds offsets {}..{} where {} was next",
                            meta.base,
                            meta.end(),
                            scan.expect
                        );
                        return Err(corrupt(&scan, pos, what));
                    }
                    scan.seg.note_entry(pos, &meta);
                    scan.expect = meta.end();
                    let entry = &data[at..at + meta.len as usize];
                    if let Some(ext) = record::scanned_ext(entry, &meta) {
                        self.scanned_ext.push_back(ext);
                    }
                    if let Some(r) = self.replay.as_mut() {
                        r.push_back(record::decode_entry(
                            &data.slice(at..at + meta.len as usize),
                        ));
                    }
                    at += meta.len as usize;
                }
                Step::End if at_eof => return Ok(self.open_segment_done(scan, SegEnd::Whole)),
                Step::End => {
                    scan.read_at = pos;
                    scan.read_len = (scan.file_len - pos).min(SCAN_READ_BYTES.into()) as u32;
                    return Ok(OpenStep::Scanning(scan));
                }
                Step::Partial { need } if !at_eof => {
                    scan.read_at = pos;
                    let want = need.max(SCAN_READ_BYTES.into()).min(scan.file_len - pos);
                    scan.read_len = want as u32;
                    return Ok(OpenStep::Scanning(scan));
                }
                // Fewer than 8 bytes left, all zero, in the last block: write padding. (At the
                // end of the file, so this chunk holds all of it.)
                Step::Partial { .. }
                    if is_write_padding(pos, scan.file_len)
                        && data[at..].iter().all(|&b| b == 0) =>
                {
                    return Ok(self.open_segment_done(scan, SegEnd::Padding(pos)));
                }
                Step::Partial { .. } if !scan.is_last => {
                    let what = "a sealed segment ends inside an entry".into();
                    return Err(corrupt(&scan, pos, what));
                }
                // Incomplete last entry: a crash mid-append. It was never acknowledged.
                Step::Partial { .. } => {
                    return Ok(self.open_segment_done(scan, SegEnd::Torn(pos)));
                }
                // A zero length where the last block's zeros begin: write padding, in any
                // segment, if everything to the end of the file is zero.
                Step::Damaged {
                    damage: damage @ record::Damage::Length(0),
                    ..
                } if is_write_padding(pos, scan.file_len) => {
                    let z = ZeroCheck {
                        damage_at: pos,
                        then: AllZero::Padding,
                        what: damage.describe(),
                    };
                    return self.open_check_zeros(scan, &data, at, z);
                }
                Step::Damaged { damage, .. } if !scan.is_last => {
                    return Err(corrupt(&scan, pos, damage.describe()));
                }
                Step::Damaged { damage, len } => {
                    // Damage in the newest segment is a torn tail only if power loss explains
                    // it: everything from a sector boundary inside the entry (or from the
                    // entry itself, for a zero length) to the end of the file is zero.
                    let from = match (damage, len) {
                        (record::Damage::Length(0), _) => Some(pos),
                        (_, Some(len)) => {
                            let end = pos + u64::from(len);
                            let sector = (end - 1) / SECTOR_BYTES * SECTOR_BYTES;
                            (sector > pos).then_some(sector)
                        }
                        _ => None,
                    };
                    let Some(from) = from else {
                        return Err(corrupt(&scan, pos, damage.describe()));
                    };
                    let z = ZeroCheck {
                        damage_at: pos,
                        then: AllZero::Torn,
                        what: damage.describe(),
                    };
                    return self.open_check_zeros(scan, &data, (from - chunk_at) as usize, z);
                }
            }
        }
    }

    /// Checks `data[rel..]` and then, through more reads, the rest of the file for zeros.
    fn open_check_zeros(
        &mut self,
        mut scan: Box<SegScan>,
        data: &Bytes,
        rel: usize,
        z: ZeroCheck,
    ) -> Result<OpenStep, StorageError> {
        let chunk_end = scan.read_at + data.len() as u64;
        if let Some(i) = data[rel.min(data.len())..].iter().position(|&b| b != 0) {
            let at = scan.read_at + (rel + i) as u64;
            return Err(StorageError::Corrupt {
                path: scan.seg.path.clone(),
                pos: z.damage_at,
                what: format!("{} (and a non-zero byte follows at {at})", z.what),
            });
        }
        if chunk_end < scan.file_len {
            scan.read_at = chunk_end;
            scan.read_len = (scan.file_len - chunk_end).min(SCAN_READ_BYTES.into()) as u32;
            scan.zero = Some(z);
            return Ok(OpenStep::Scanning(scan));
        }
        match z.then {
            AllZero::Recreate => self.open_headerless(scan, "the header is zero"),
            AllZero::Torn => Ok(self.open_segment_done(scan, SegEnd::Torn(z.damage_at))),
            AllZero::Padding => Ok(self.open_segment_done(scan, SegEnd::Padding(z.damage_at))),
        }
    }

    /// A segment is scanned. A torn tail is cut from the newest one; write padding is cut
    /// from the newest plain segment (the one appends go to: the runtime takes a file's
    /// length for its logical end when it reopens it) and left on disk elsewhere.
    fn open_segment_done(&mut self, scan: Box<SegScan>, end: SegEnd) -> OpenStep {
        let SegScan {
            mut seg,
            file_len,
            is_last,
            ..
        } = *scan;
        let o = match &mut self.phase {
            Phase::Opening(o) => o,
            _ => unreachable!("only called while opening"),
        };
        let len = match end {
            SegEnd::Whole => file_len,
            SegEnd::Torn(at) => {
                tracing::warn!(path = %seg.path, at, cut = file_len - at, "repairing a torn tail");
                o.truncated_bytes += file_len - at;
                debug_assert!(o.truncate.is_none(), "only the newest segment is cut");
                o.truncate = Some((seg.path.clone(), at));
                at
            }
            SegEnd::Padding(at) if is_last && seg.compacted_end.is_none() => {
                tracing::debug!(path = %seg.path, at, cut = file_len - at, "cutting write padding");
                debug_assert!(o.truncate.is_none(), "only the newest segment is cut");
                o.truncate = Some((seg.path.clone(), at));
                at
            }
            SegEnd::Padding(at) => {
                tracing::debug!(path = %seg.path, at, "a segment ends in write padding");
                at
            }
        };
        seg.len = len;
        seg.written_len = seg.len;
        seg.synced_len = seg.len;
        if is_last {
            o.sync_file = Some(seg.path.clone());
            o.dir_dirty = true;
        }
        self.segments.push(seg);
        OpenStep::NextSegment
    }

    fn open_finish(&mut self) {
        let Phase::Opening(o) = std::mem::replace(&mut self.phase, Phase::Ready) else {
            return;
        };
        let next = self.segments.last().map_or(0, |s| s.end);
        self.next_offset = next;
        self.written_offset = next;
        self.synced_offset = next;
        self.reported_durable = next;
        self.events.push_back(LogEvent::Opened {
            start_offset: self.start_offset(),
            next_offset: next,
            truncated_bytes: o.truncated_bytes,
        });
        self.drive();
    }

    // ---- compaction ---------------------------------------------------------------------

    /// Rewrites the sealed segments, keeping only the records whose offsets are in `keep`
    /// (ascending), each at its own offset. Returns false if nothing is sealed yet or a pass
    /// is already running. See `docs/storage-format.md`, "Compaction", for the crash order.
    pub fn compact(&mut self, keep: Vec<u64>) -> bool {
        if !self.is_open() || self.poison.is_some() || self.compaction.is_some() {
            return false;
        }
        let durable = self.durable_offset();
        let mut k = 0;
        while k + 1 < self.segments.len()
            && self.segments[k + 1].stage == Stage::Ready
            && self.segments[k].end <= durable
            && self.segments[k].written_len == self.segments[k].len
        {
            k += 1;
        }
        if k == 0 {
            return false;
        }
        let old: Vec<OldSeg> = self.segments[..k]
            .iter()
            .map(|s| OldSeg {
                base: s.base,
                path: s.path.clone(),
                len: s.len,
            })
            .collect();
        let cut = self.segments[k].base;
        let bytes_before = old.iter().map(|s| s.len).sum();
        debug_assert!(keep.windows(2).all(|w| w[0] < w[1]));
        self.compaction = Some(Box::new(Compaction {
            keep,
            ki: 0,
            old,
            cut,
            cur: 0,
            read_at: SEGMENT_HEADER_LEN,
            seg_out: Vec::new(),
            group: None,
            written: Vec::new(),
            step: CStep::Read,
            busy: false,
            bytes_before,
            rename_at: 0,
            remove: Vec::new(),
        }));
        self.drive();
        true
    }

    pub fn compacting(&self) -> bool {
        self.compaction.is_some()
    }

    /// The lowest offset from which this log still holds every record: below it,
    /// compaction has collapsed history (or a running pass may collapse it). A reader that
    /// must not miss a record cannot replay from below this.
    pub fn complete_from(&self) -> u64 {
        let compacted = self
            .segments
            .iter()
            .filter_map(|s| s.compacted_end)
            .max()
            .unwrap_or(0);
        let running = self.compaction.as_ref().map_or(0, |c| c.cut);
        compacted.max(running).max(self.start_offset())
    }

    fn drive_compaction(&mut self) {
        if self.poison.is_some() {
            return;
        }
        let Some(c) = self.compaction.as_mut() else {
            return;
        };
        if c.busy {
            return;
        }
        let dir = self.dir.clone();
        let kind = match c.step {
            CStep::Read => {
                let o = &c.old[c.cur];
                let len = (o.len - c.read_at).min(SCAN_READ_BYTES.into()) as u32;
                FileOpKind::Read {
                    path: o.path.clone(),
                    pos: c.read_at,
                    len,
                }
            }
            CStep::ReadExact(need) => {
                let o = &c.old[c.cur];
                FileOpKind::Read {
                    path: o.path.clone(),
                    pos: c.read_at,
                    len: need as u32,
                }
            }
            CStep::CreateTmp => FileOpKind::Create {
                path: c.written.last().expect("a group to write").tmp_path(&dir),
            },
            CStep::WriteTmp => {
                let g = c.written.last_mut().expect("a group to write");
                let mut bytes = BytesMut::with_capacity(SEGMENT_HEADER_LEN as usize + g.buf.len());
                bytes.extend_from_slice(
                    &SegmentHeader {
                        base: g.base,
                        compacted_end: Some(g.end),
                    }
                    .encode(),
                );
                bytes.extend_from_slice(&g.buf);
                FileOpKind::Append {
                    path: g.tmp_path(&dir),
                    bytes: bytes.freeze(),
                }
            }
            CStep::SyncTmp => FileOpKind::Sync {
                path: c.written.last().expect("a group to write").tmp_path(&dir),
            },
            CStep::WaitReads => {
                // New disk reads park; wait for those already out to land.
                let busy = self.segments[..c.old.len()]
                    .iter()
                    .any(|s| s.reads_in_flight > 0);
                if busy {
                    return;
                }
                c.step = CStep::Rename;
                return self.drive_compaction();
            }
            CStep::Rename => {
                let g = &c.written[c.rename_at];
                FileOpKind::Rename {
                    from: g.tmp_path(&dir),
                    to: layout::join(&dir, &layout::segment_name(g.base)),
                }
            }
            CStep::SyncDirRenamed | CStep::SyncDirRemoved => FileOpKind::SyncDir { path: dir },
            CStep::Remove => match c.remove.last() {
                Some(path) => FileOpKind::Remove { path: path.clone() },
                None => {
                    c.step = CStep::SyncDirRemoved;
                    return self.drive_compaction();
                }
            },
        };
        c.busy = true;
        self.issue(kind, Inflight::Compact);
    }

    fn compact_complete(&mut self, result: Result<FileOutput, FileError>) {
        let dir = self.dir.clone();
        let Some(c) = self.compaction.as_mut() else {
            return;
        };
        c.busy = false;
        let output = match result {
            Ok(o) => o,
            Err(error) => {
                let path = c.old.get(c.cur).map_or(dir.clone(), |o| o.path.clone());
                let e = StorageError::Io {
                    op: "compact",
                    path,
                    error,
                };
                return self.compact_abort(e);
            }
        };
        match c.step {
            CStep::Read | CStep::ReadExact(_) => {
                let data = match output {
                    FileOutput::Data(d) => d,
                    _ => Bytes::new(),
                };
                if let Err(e) = c.consume(&data, self.cfg.segment_max_bytes) {
                    self.compact_abort(e);
                }
            }
            CStep::CreateTmp => c.step = CStep::WriteTmp,
            CStep::WriteTmp => c.step = CStep::SyncTmp,
            CStep::SyncTmp => c.after_group_written(),
            CStep::WaitReads => {}
            CStep::Rename => {
                c.rename_at += 1;
                if c.rename_at == c.written.len() {
                    c.step = CStep::SyncDirRenamed;
                }
            }
            CStep::SyncDirRenamed => {
                // Every rename is durable: the new files are the log now, and parked reads
                // go on against them.
                c.step = CStep::Remove;
                self.compaction_swap();
            }
            CStep::Remove => {
                c.remove.pop();
            }
            CStep::SyncDirRemoved => {
                let c = self.compaction.take().expect("still running");
                let bytes_after = c.written.iter().map(|g| g.file_len()).sum();
                self.events.push_back(LogEvent::Compacted {
                    bytes_before: c.bytes_before,
                    bytes_after,
                });
            }
        }
    }

    fn compact_abort(&mut self, e: StorageError) {
        let Some(c) = self.compaction.take() else {
            return;
        };
        if c.step.changes_the_log() {
            // A rename or unlink failed: what the directory holds is no longer known.
            self.fail(e);
        } else {
            // Only temporary files were touched; the next open removes them.
            self.events.push_back(LogEvent::CompactionFailed(e));
            let parked = std::mem::take(&mut self.parked_reads);
            for key in parked {
                self.advance_read(key);
            }
        }
    }

    /// Replaces the compacted segments in memory with the new files.
    fn compaction_swap(&mut self) {
        let dir = self.dir.clone();
        let c = self.compaction.as_mut().expect("still running");
        let k = c.old.len();
        let new: Vec<Segment> = c.written.iter().map(|g| g.segment(&dir)).collect();
        let group_bases: Vec<u64> = c.written.iter().map(|g| g.base).collect();
        c.remove = c
            .old
            .iter()
            .filter(|o| !group_bases.contains(&o.base))
            .map(|o| o.path.clone())
            .collect();
        c.remove.reverse(); // popped from the back: oldest first
        let cut = c.cut;
        self.segments.splice(..k, new);
        // Cached entries below the cut may include records compaction dropped.
        self.evict_tail_below(cut);
        let parked = std::mem::take(&mut self.parked_reads);
        for key in parked {
            if let Some(job) = self.reads.get_mut(&key) {
                job.resume = None;
            }
            self.advance_read(key);
        }
    }
}

#[derive(Debug, Default)]
struct Opening {
    step: OpenStep,
    listing: Vec<(u64, u64)>,
    at: usize,
    cleanup: Vec<String>,
    truncate: Option<(String, u64)>,
    sync_file: Option<String>,
    dir_dirty: bool,
    truncated_bytes: u64,
}

#[derive(Debug, Default)]
enum OpenStep {
    #[default]
    CreateDir,
    List,
    Listed,
    NextSegment,
    Scanning(Box<SegScan>),
    Cleanup,
    Done,
}

#[derive(Debug)]
struct SegScan {
    seg: Segment,
    file_len: u64,
    read_at: u64,
    read_len: u32,
    header_done: bool,
    /// The offset the next entry must start at (or beyond, in a compacted segment).
    expect: u64,
    /// No segment file sorts after this one.
    listed_last: bool,
    /// No segment file that survives follows this one (later ones may be superseded).
    is_last: bool,
    zero: Option<ZeroCheck>,
}

/// Bytes from `damage_at` (or from a sector boundary after it) are being checked for
/// zeros to the end of the file; `what` names the damage if a non-zero byte turns up.
#[derive(Debug)]
struct ZeroCheck {
    damage_at: u64,
    then: AllZero,
    what: String,
}

/// What a segment is when a [`ZeroCheck`] finds only zeros.
#[derive(Debug, Clone, Copy)]
enum AllZero {
    /// Its header never landed: it is created again.
    Recreate,
    /// The newest segment has a torn tail from `damage_at`.
    Torn,
    /// It ends in write padding from `damage_at`.
    Padding,
}

/// Where a scanned segment's logical end is.
#[derive(Debug, Clone, Copy)]
enum SegEnd {
    /// At the end of the file.
    Whole,
    /// At the start of a torn tail.
    Torn(u64),
    /// At the start of write padding.
    Padding(u64),
}

#[derive(Debug)]
struct OldSeg {
    base: u64,
    path: String,
    len: u64,
}

/// One compaction output file: the kept records of old segments `[first, last]`.
#[derive(Debug)]
struct Group {
    base: u64,
    end: u64,
    buf: BytesMut,
    metas: Vec<(u64, EntryMeta)>,
}

impl Group {
    fn tmp_path(&self, dir: &str) -> String {
        layout::join(dir, &layout::compact_name(self.base))
    }

    fn file_len(&self) -> u64 {
        SEGMENT_HEADER_LEN + self.buf.len() as u64
    }

    fn segment(&self, dir: &str) -> Segment {
        let mut s = Segment::found(dir, self.base, Some(self.end));
        for (rel, meta) in &self.metas {
            s.note_entry(SEGMENT_HEADER_LEN + rel, meta);
        }
        s.len = self.file_len();
        s.written_len = s.len;
        s.synced_len = s.len;
        s
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CStep {
    Read,
    ReadExact(u64),
    CreateTmp,
    WriteTmp,
    SyncTmp,
    WaitReads,
    Rename,
    SyncDirRenamed,
    Remove,
    SyncDirRemoved,
}

impl CStep {
    fn changes_the_log(self) -> bool {
        matches!(
            self,
            CStep::Rename | CStep::SyncDirRenamed | CStep::Remove | CStep::SyncDirRemoved
        )
    }
}

#[derive(Debug)]
struct Compaction {
    keep: Vec<u64>,
    ki: usize,
    old: Vec<OldSeg>,
    cut: u64,
    /// The old segment being read, and where.
    cur: usize,
    read_at: u64,
    /// Kept entries of the old segment being read.
    seg_out: Vec<(Bytes, EntryMeta)>,
    group: Option<Group>,
    /// Groups written to synced temporary files; the last may be in the middle of it.
    written: Vec<Group>,
    step: CStep,
    busy: bool,
    bytes_before: u64,
    rename_at: usize,
    /// Superseded old files, removed from the back.
    remove: Vec<String>,
}

impl Compaction {
    fn parks_reads(&self) -> bool {
        matches!(
            self.step,
            CStep::WaitReads | CStep::Rename | CStep::SyncDirRenamed
        )
    }

    fn keeps(&mut self, offset: u64) -> bool {
        while self.keep.get(self.ki).is_some_and(|&k| k < offset) {
            self.ki += 1;
        }
        self.keep.get(self.ki) == Some(&offset)
    }

    /// Takes one chunk of the old segment being read.
    fn consume(&mut self, data: &Bytes, segment_max: u64) -> Result<(), StorageError> {
        let o = &self.old[self.cur];
        let (path, chunk_at, seg_len) = (o.path.clone(), self.read_at, o.len);
        let mut at = 0usize;
        loop {
            match record::step(&data[at..]) {
                Step::Entry(meta) => {
                    let entry = data.slice(at..at + meta.len as usize);
                    at += meta.len as usize;
                    let d = record::decode_entry(&entry);
                    for (i, payload) in d.payloads.into_iter().enumerate() {
                        let offset = meta.base + i as u64;
                        if !self.keeps(offset) {
                            continue;
                        }
                        let mut one = BytesMut::new();
                        let publisher = d.publisher.as_deref().unwrap_or_default();
                        record::encode_entry(&mut one, offset, d.time_us, publisher, &[payload]);
                        let m = EntryMeta {
                            base: offset,
                            count: 1,
                            time_us: d.time_us,
                            len: one.len() as u32,
                        };
                        self.seg_out.push((one.freeze(), m));
                    }
                }
                Step::End => break,
                Step::Partial { need } => {
                    let pos = chunk_at + at as u64;
                    if pos + need > seg_len {
                        return Err(StorageError::Corrupt {
                            path,
                            pos,
                            what: "a sealed segment ends inside an entry".into(),
                        });
                    }
                    self.read_at = pos;
                    self.step = if at == 0 {
                        CStep::ReadExact(need)
                    } else {
                        CStep::Read
                    };
                    return Ok(());
                }
                Step::Damaged { damage, .. } => {
                    return Err(StorageError::Corrupt {
                        path,
                        pos: chunk_at + at as u64,
                        what: damage.describe(),
                    })
                }
            }
        }
        self.read_at = chunk_at + at as u64;
        if self.read_at < seg_len {
            self.step = CStep::Read;
            return Ok(());
        }
        self.old_segment_done(segment_max);
        Ok(())
    }

    /// An old segment is fully read: its kept entries join the current output group, or
    /// close it and start the next one at this old segment's base, so every output file
    /// replaces a whole run of old files and its name is the first of them.
    fn old_segment_done(&mut self, segment_max: u64) {
        let out_len: u64 = self.seg_out.iter().map(|(b, _)| b.len() as u64).sum();
        let base = self.old[self.cur].base;
        let fits = self
            .group
            .as_ref()
            .is_some_and(|g| g.file_len() + out_len <= segment_max);
        if self.group.is_some() && !fits {
            let mut g = self.group.take().expect("checked");
            g.end = base;
            self.written.push(g);
            self.step = CStep::CreateTmp;
            // The kept entries wait in `seg_out` until the group is written.
            return;
        }
        self.fill_group(base);
        self.next_old();
    }

    fn fill_group(&mut self, base: u64) {
        let g = self.group.get_or_insert_with(|| Group {
            base,
            end: base,
            buf: BytesMut::new(),
            metas: Vec::new(),
        });
        for (bytes, meta) in self.seg_out.drain(..) {
            g.metas.push((g.buf.len() as u64, meta));
            g.buf.extend_from_slice(&bytes);
        }
    }

    fn next_old(&mut self) {
        self.cur += 1;
        self.read_at = SEGMENT_HEADER_LEN;
        if self.cur < self.old.len() {
            self.step = CStep::Read;
            return;
        }
        let mut g = self
            .group
            .take()
            .expect("at least one old segment was read");
        g.end = self.cut;
        self.written.push(g);
        self.step = CStep::CreateTmp;
    }

    fn after_group_written(&mut self) {
        if self.cur >= self.old.len() {
            // That was the last group.
            self.step = CStep::WaitReads;
            return;
        }
        // The old segment that did not fit starts the next group.
        let base = self.old[self.cur].base;
        self.fill_group(base);
        self.next_old();
    }
}

#[cfg(test)]
mod tests;
