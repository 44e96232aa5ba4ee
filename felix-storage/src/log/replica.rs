//! What log replication needs from a log: framed reads that ship entries exactly as stored,
//! framed appends that write them on a follower as they came, truncation for a follower
//! that rejoins, and the replica state file.
//!
//! Its own file because none of it is on a leader's append path: a framed read is a read
//! job in another mode, a framed append reuses the write lane through `stage_entry`, and a
//! truncation is a short state machine that holds both write lanes while it runs.
//!
//! **Framed reads and entry alignment.** `read_framed(from, ..)` answers from the entry that
//! holds `from`, so when `from` falls inside an entry the batch's `base` is below it. A
//! follower appends only at exactly its `next_offset()`, so such a batch is refused there
//! as `NotContiguous`: a follower whose end is inside a leader's entry has entries that
//! differ from the leader's, and must `truncate_to` a boundary both logs share first.
//! Nothing ever splits or skips part of an entry.
//!
//! **Gaps.** A compacted log (a cache's, counters', consumer groups') holds only live
//! records at their own offsets, so the entries it ships jump. A follower of such a log
//! appends them with `append_framed_with_gaps`, which writes a skip entry
//! (`record::encode_skip`) over each jump: the follower's log stays contiguous, so its
//! offsets, durable mark, recovery rules and truncation boundaries work as for any log,
//! while reads, replay and compaction find nothing in a skip. A stream's follower uses
//! `append_framed`, which refuses a jump and a shipped skip entry alike: there a gap would
//! be lost records.

use bytes::Bytes;
use std::time::Instant;

use super::{
    AppendError, Inflight, LogEvent, ReadError, ReadJob, ReadTicket, ShardLog, StorageError, Task,
};
use crate::layout;
use crate::ops::{FileError, FileOpKind, FileOutput};
use crate::record::{self, EntryMeta, ScannedExt, Step, ENTRY_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::replica_state::{
    ReplicaState, ReplicaStateError, StateFile, MAX_REPLICA_STATE_BYTES, REPLICA_STATE_FILE,
};
use crate::segment::{Segment, Stage, INDEX_INTERVAL_BYTES};

/// Entries exactly as a segment holds them, for shipping to a follower.
///
/// In a plain log `end == base + record_count`. Where the log is compacted (or holds skip
/// entries) offsets jump, so `end - base` may exceed `record_count` and `base` may lie past
/// the `from` asked for: `end` is where the batch ends, never `base + record_count`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FramedBatch {
    /// The first entry's base offset: at or below the `from` asked for in a plain log, and
    /// above it when `from` falls in a compacted log's gap.
    pub base: u64,
    /// Records the entries hold (a skip entry holds none).
    pub record_count: u32,
    /// One past the last entry's last offset: where the next framed read starts.
    pub end: u64,
    /// Whole entries, headers and CRCs included; empty when nothing durable is at `from`.
    pub entries: Bytes,
}

/// One entry `append_framed` appended, for the owner to take in as recovery's scanned
/// entries are taken in (`take_appended`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendedEntry {
    pub meta: EntryMeta,
    /// Its producer mark and state block, when it has either.
    pub ext: Option<ScannedExt>,
}

/// What replication hears back, inside [`LogEvent::Replica`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaEvent {
    /// The answer to `read_framed`.
    Framed {
        ticket: ReadTicket,
        result: Result<FramedBatch, ReadError>,
    },
    /// A `truncate_to` (or a `restart_at`) finished: `Ok(offset)` once the cut is durable
    /// (the log's next offset is then `offset`, and `Durable` marks start from there again).
    Truncated { result: Result<u64, TruncateError> },
    /// This state is now the durable content of the replica state file.
    StateDurable(ReplicaState),
    /// With early shipping on ([`ShardLog::ship_before_sync`]): every record below `up_to`
    /// is written (not yet synced) and may be read framed.
    Written { up_to: u64 },
}

/// Why `truncate_to` refused (at the call, or later in [`ReplicaEvent::Truncated`]). Nothing
/// was changed unless it is `Failed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TruncateError {
    NotOpen,
    /// The log stopped (or this truncation's own file op failed, stopping it).
    Failed(StorageError),
    /// Outside `[start_offset, next_offset]`.
    OutOfRange {
        offset: u64,
        start: u64,
        next: u64,
    },
    /// `offset` is inside the entry holding `entry_base..entry_end`.
    NotBoundary {
        offset: u64,
        entry_base: u64,
        entry_end: u64,
    },
    /// The cut would fall in or before a compaction output; replicated logs are plain.
    Compacted,
    /// Something else is in flight (appends, syncs, reads, compaction, housekeeping, another
    /// truncation): drive the log until [`ShardLog::is_idle`] and ask again.
    Busy,
}

/// A framed read's budget and what it has taken so far.
#[derive(Debug)]
pub(super) struct FramedAcc {
    from: u64,
    max_bytes: usize,
    batch: Option<FramedBatch>,
}

impl FramedAcc {
    pub(super) fn into_batch(self) -> FramedBatch {
        self.batch.unwrap_or(FramedBatch {
            base: self.from,
            record_count: 0,
            end: self.from,
            entries: Bytes::new(),
        })
    }
}

/// Header bytes a truncation's scan needs of each entry: length, CRC, kind, publisher
/// length, flags, count, base.
const ENTRY_HEAD_BYTES: usize = ENTRY_HEADER_LEN + 16;
/// One read finds an unindexed entry: it starts less than an index interval past the index
/// point before it.
const TRUNCATE_SCAN_BYTES: u64 = INDEX_INTERVAL_BYTES + ENTRY_HEAD_BYTES as u64;

/// A `truncate_to` in progress. Order, one op at a time: find the cut's file position (a
/// read, unless known), remove the segments after the one holding it newest first, each
/// unlink synced into the directory before the next, then cut that segment and sync it.
/// A crash at any point leaves a prefix of the old log that ends at or past the cut.
#[derive(Debug)]
pub(super) struct Truncation {
    offset: u64,
    /// The segment holding the cut (its index does not change while this runs).
    seg: usize,
    pos: Option<u64>,
    scan_at: u64,
    /// Later segments still to remove, newest last.
    later: Vec<String>,
    step: TStep,
    busy: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TStep {
    Scan,
    Remove,
    SyncDir,
    Cut,
    SyncCut,
}

impl ShardLog {
    // ---- framed reads -------------------------------------------------------------------

    /// Reads whole entries as stored, from the entry holding `from` on (in a compacted log's
    /// gap, the first entry after it), for shipping to a follower: at most `max_bytes` of them (always at least one when one is durable),
    /// only durable ones, and never across a segment or (from the tail cache) a write. The
    /// answer comes as [`ReplicaEvent::Framed`]; from the tail cache it is queued before
    /// this returns and shares its bytes (no copy), otherwise it is one file read.
    pub fn read_framed(&mut self, from: u64, max_bytes: usize) -> Result<ReadTicket, ReadError> {
        let acc = FramedAcc {
            from,
            max_bytes,
            batch: None,
        };
        self.start_read(from, 1, max_bytes, Some(acc))
    }

    /// Answers a framed read from the tail cache (its front is at or below `from`).
    pub(super) fn framed_from_tail(&self, job: &mut ReadJob) {
        let acc = job.framed.as_mut().expect("a framed read");
        let i = self.tail.partition_point(|e| e.end <= acc.from);
        let Some(first) = self.tail.get(i) else {
            return;
        };
        let (mut count, mut last) = (0u64, None);
        for e in self.tail.range(i..) {
            // Entries of one write lie back to back in its buffer.
            let same_write =
                e.write.as_ptr() == first.write.as_ptr() && e.write.len() == first.write.len();
            if !same_write || e.end > job.limit {
                break;
            }
            // Offsets within one write only: another write's may lie below `first`'s.
            let len = e.rel + e.bytes.len() - first.rel;
            if last.is_some() && len > acc.max_bytes {
                break;
            }
            count += u64::from(record::records_in(&e.bytes));
            last = Some(e);
        }
        if let Some(last) = last {
            acc.batch = Some(FramedBatch {
                base: first.base,
                record_count: count as u32,
                end: last.end,
                entries: first.write.slice(first.rel..last.rel + last.bytes.len()),
            });
        }
        job.full = true;
    }

    /// Takes a framed read's entries from one chunk of segment `i` read at `pos`.
    pub(super) fn framed_chunk(
        &mut self,
        key: u64,
        mut job: ReadJob,
        i: usize,
        pos: u64,
        data: Bytes,
    ) {
        let (base, path) = (self.segments[i].base, self.segments[i].path.clone());
        let written = self.segments[i].written_len;
        let acc = job.framed.as_mut().expect("a framed read");
        let corrupt = |pos: u64, what: String| {
            ReadError::Failed(StorageError::Corrupt {
                path: path.clone(),
                pos,
                what,
            })
        };
        let mut at = 0usize;
        let mut taken: Option<(usize, u64, u64)> = None; // (start, base, count)
        let mut end = acc.from;
        loop {
            match record::step(&data[at..]) {
                Step::Entry(meta) => {
                    let len = meta.len as usize;
                    if meta.end() <= acc.from {
                        at += len;
                        job.resume = Some((base, pos + at as u64));
                        continue;
                    }
                    let over = taken.is_some_and(|(start, _, _)| at + len - start > acc.max_bytes);
                    if meta.end() > job.limit || over {
                        // Not durable yet, or past the budget: the answer ends here.
                        job.full = true;
                        break;
                    }
                    let t = taken.get_or_insert((at, meta.base, 0));
                    t.2 += u64::from(meta.records());
                    end = meta.end();
                    at += len;
                }
                Step::End => break,
                Step::Partial { need } => {
                    let start = pos + at as u64;
                    if start + need > written {
                        let e = corrupt(start, "an entry runs past the written bytes".into());
                        return self.finish_read(job, Err(e));
                    }
                    if taken.is_none() {
                        job.resume = Some((base, start));
                        if at == 0 {
                            // One entry larger than the chunk: read exactly it.
                            return self.issue_read(i, job, key, start, need as u32);
                        }
                        self.reads.insert(key, job);
                        return self.advance_read(key);
                    }
                    break;
                }
                Step::Damaged { damage, .. } => {
                    let e = corrupt(pos + at as u64, damage.describe());
                    return self.finish_read(job, Err(e));
                }
            }
        }
        if let Some((start, first, count)) = taken {
            acc.batch = Some(FramedBatch {
                base: first,
                record_count: count as u32,
                end,
                entries: data.slice(start..at),
            });
            job.full = true;
        }
        // Nothing taken: the chunk held only entries before `from`; go on past them.
        self.reads.insert(key, job);
        self.advance_read(key);
    }

    /// Lets framed reads take records once written rather than once synced, and reports
    /// each write ([`ReplicaEvent::Written`]): a replicated log's leader ships in parallel
    /// with its own sync. Only a leader sets it; a quorum still counts the leader only for
    /// what it has synced (docs/replication.md, "Shipping before the leader's sync").
    pub fn ship_before_sync(&mut self, on: bool) {
        self.ship_written = on;
    }

    /// Makes the log a follower's copy (`true`): from now on it takes only what its leader
    /// ships (`append_framed*`, truncations), and a local `append` is refused
    /// [`AppendError::ShippedOnly`], whatever asked for it (a client write, a background
    /// pass). The node that leads the shard clears it.
    pub fn take_only_shipped(&mut self, on: bool) {
        self.only_shipped = on;
    }

    /// Whether the log takes only shipped entries.
    pub fn only_shipped(&self) -> bool {
        self.only_shipped
    }

    // ---- framed appends -----------------------------------------------------------------

    /// Appends entries shipped from a leader's `read_framed`, byte for byte, at exactly
    /// [`ShardLog::next_offset`] (`base`). Every entry's CRC and layout are checked and
    /// their offsets must run on without a gap, or nothing is appended. They keep the
    /// leader's append times, roll segments and commit as `append` does, and become
    /// durable as `append`'s do (`Durable`, `durable_offset`). Returns the new next offset.
    /// Each appended entry is queued for [`ShardLog::take_appended`] (and, for a log opened
    /// replaying, decoded for `take_replayed`); drain them after every call.
    ///
    /// For a stream's log: a skip entry among the shipped ones is refused as a gap
    /// (`NotContiguous` from its base to its end), since a stream never skips offsets.
    pub fn append_framed(
        &mut self,
        now: Instant,
        base: u64,
        entries: Bytes,
    ) -> Result<u64, AppendError> {
        self.append_framed_entries(now, base, entries, false)
    }

    /// [`ShardLog::append_framed`] for a compacted log (a cache's, counters', groups'),
    /// whose shipped offsets jump: `base` (the first entry's base) may lie past the next
    /// offset, and each entry may start past the end of the one before it, but never below.
    /// Each jump is filled with a skip entry (`record::encode_skip`, stamped with the time of
    /// the entry after it) before the shipped entry, so this log stays contiguous and its
    /// next offset lands where the leader's batch ended. Skip entries, shipped or written
    /// here, are queued neither for `take_appended` nor for `take_replayed`: they hold no
    /// record.
    ///
    /// A follower's projection (a cache's keys) equals its leader's only if everything in
    /// its log came from the leader's log as it is now: compaction drops deletes, so a
    /// follower that holds records from before a leader's pass over offsets at or past its
    /// next offset would keep keys the leader deleted. Such a follower is rebuilt (see
    /// [`ShardLog::complete_from`]), not fed through the gap.
    pub fn append_framed_with_gaps(
        &mut self,
        now: Instant,
        base: u64,
        entries: Bytes,
    ) -> Result<u64, AppendError> {
        self.append_framed_entries(now, base, entries, true)
    }

    /// Both framed appends: `gaps` lets offsets jump (filled with skip entries).
    fn append_framed_entries(
        &mut self,
        now: Instant,
        base: u64,
        entries: Bytes,
        gaps: bool,
    ) -> Result<u64, AppendError> {
        self.check_appendable()?;
        if entries.is_empty() {
            return Err(AppendError::Empty);
        }
        let expected = self.next_offset;
        if base < expected || (base > expected && !gaps) {
            return Err(AppendError::NotContiguous {
                expected,
                got: base,
            });
        }
        let mut metas = Vec::new();
        let (mut at, mut next, mut skip_bytes) = (0usize, expected, 0usize);
        while at < entries.len() {
            let meta = match record::step(&entries[at..]) {
                Step::Entry(meta) => meta,
                Step::Partial { .. } | Step::End => {
                    return Err(AppendError::Damaged {
                        pos: at,
                        what: "the last entry is cut short".into(),
                    })
                }
                Step::Damaged { damage, .. } => {
                    return Err(AppendError::Damaged {
                        pos: at,
                        what: damage.describe(),
                    })
                }
            };
            // The first entry starts at `base`; each later one where the last ended (or,
            // with gaps, past it).
            let want = if at == 0 { base } else { next };
            if meta.base < want || (meta.base > want && (!gaps || at == 0)) {
                return Err(AppendError::NotContiguous {
                    expected: want,
                    got: meta.base,
                });
            }
            if meta.skip && !gaps {
                return Err(AppendError::NotContiguous {
                    expected: meta.base,
                    got: meta.end(),
                });
            }
            skip_bytes += skips_over(meta.base - next) * record::SKIP_ENTRY_LEN;
            next = meta.end();
            metas.push((at, meta));
            at += meta.len as usize;
        }
        let len = entries.len() + skip_bytes;
        if self.pending_bytes + len > self.cfg.max_pending_bytes && self.pending_bytes > 0 {
            return Err(AppendError::Backpressure);
        }
        for (at, meta) in metas {
            self.stage_skips(now, meta.base, meta.time_us);
            let entry = entries.slice(at..at + meta.len as usize);
            if !meta.skip {
                let ext = record::scanned_ext(&entry, &meta);
                if let Some(r) = self.replay.as_mut() {
                    r.push_back(record::decode_entry(&entry));
                }
                self.appended.push_back(AppendedEntry { meta, ext });
            }
            self.stage_entry(now, &meta, |buf| buf.extend_from_slice(&entry));
        }
        Ok(self.next_offset)
    }

    /// Fills `[next_offset, to)` with skip entries stamped `time_us`.
    fn stage_skips(&mut self, now: Instant, to: u64, time_us: u64) {
        while self.next_offset < to {
            let count = (to - self.next_offset).min(u64::from(u32::MAX)) as u32;
            let meta = EntryMeta {
                base: self.next_offset,
                count,
                time_us,
                len: record::SKIP_ENTRY_LEN as u32,
                skip: true,
            };
            self.stage_entry(now, &meta, |buf| {
                record::encode_skip(buf, meta.base, count, time_us)
            });
        }
    }

    /// The next entry `append_framed` appended, oldest first.
    pub fn take_appended(&mut self) -> Option<AppendedEntry> {
        self.appended.pop_front()
    }

    // ---- truncation ---------------------------------------------------------------------

    /// Drops every record at or above `offset`, which must lie in `[start_offset,
    /// next_offset]` on an entry boundary, with nothing else in flight. `Ok` means the cut
    /// is under way; [`ReplicaEvent::Truncated`] reports it durable (or refused, when the
    /// boundary check needed a read). Appends and reads are refused meanwhile.
    ///
    /// Crash rule: until `Truncated` is reported, a crash leaves the log as it would have
    /// been without the truncation, or a prefix of it ending at or past `offset`; the
    /// caller (a rejoining follower) then simply truncates again.
    pub fn truncate_to(&mut self, offset: u64) -> Result<(), TruncateError> {
        self.check_cuttable()?;
        let (start, next) = (self.start_offset(), self.next_offset);
        if offset < start || offset > next {
            return Err(TruncateError::OutOfRange {
                offset,
                start,
                next,
            });
        }
        if offset == next {
            self.events
                .push_back(LogEvent::Replica(ReplicaEvent::Truncated {
                    result: Ok(next),
                }));
            return Ok(());
        }
        let seg = self.segments.partition_point(|s| s.base <= offset) - 1;
        if self.segments[seg..]
            .iter()
            .any(|s| s.compacted_end.is_some())
        {
            return Err(TruncateError::Compacted);
        }
        let s = &self.segments[seg];
        let mut pos = (offset == s.base).then_some(SEGMENT_HEADER_LEN);
        if let Some(e) = self
            .tail
            .iter()
            .find(|e| e.base <= offset && offset < e.end)
        {
            if e.base != offset {
                return Err(TruncateError::NotBoundary {
                    offset,
                    entry_base: e.base,
                    entry_end: e.end,
                });
            }
            pos = Some(e.pos);
        }
        let pos = pos.or_else(|| s.indexed_pos(offset));
        let later = self.segments[seg + 1..]
            .iter()
            .map(|s| s.path.clone())
            .collect();
        self.truncation = Some(Box::new(Truncation {
            offset,
            seg,
            pos,
            scan_at: s.seek(offset),
            later,
            step: if pos.is_some() {
                TStep::Remove
            } else {
                TStep::Scan
            },
            busy: false,
        }));
        self.drive();
        Ok(())
    }

    /// Whether the log may be cut now: open, healthy, and nothing else in flight.
    fn check_cuttable(&self) -> Result<(), TruncateError> {
        if let Some(e) = &self.poison {
            return Err(TruncateError::Failed(e.clone()));
        }
        if !self.is_open() {
            return Err(TruncateError::NotOpen);
        }
        let busy = self.truncation.is_some()
            || self.restarting.is_some()
            || self.compaction.is_some()
            || !self.reads.is_empty()
            || self.lane.is_some()
            || self.sync_lane.is_some()
            || !self.tasks.is_empty()
            || self.write_due
            || !self.pending_is_empty()
            || self.segments.iter().any(|s| s.stage != Stage::Ready);
        if busy {
            return Err(TruncateError::Busy);
        }
        Ok(())
    }

    /// Drops every record and starts the log again, empty, at `start`, which may lie past
    /// its end: a follower rebuilt from its leader's first retained offset. Nothing else may
    /// be in flight, as for [`ShardLog::truncate_to`]. [`ReplicaEvent::Truncated`] with
    /// `Ok(start)` says when it is done; appends and cuts wait until then.
    ///
    /// Order: every segment is removed, newest first, each unlink synced into the directory
    /// before the next, then the new empty segment at `start` is created and synced as any
    /// new segment is. A crash leaves a prefix of the old log, or no segment at all (which
    /// opens as an empty log at 0); either way the follower asks its leader again.
    pub fn restart_at(&mut self, start: u64) -> Result<(), TruncateError> {
        // Compacted segments go like any other: nothing of the old log is kept, and a crash
        // part way leaves its oldest segments, a log that opens as it did before.
        self.check_cuttable()?;
        let old: Vec<Segment> = std::mem::take(&mut self.segments);
        for seg in old.into_iter().rev() {
            self.tasks.push_back(Task::Remove(seg.path));
            self.tasks.push_back(Task::SyncDir);
        }
        self.segments.push(Segment::new_unborn(&self.dir, start));
        self.trimmed_below = 0;
        self.tail.clear();
        self.tail_bytes = 0;
        self.next_offset = start;
        self.written_offset = start;
        self.synced_offset = start;
        self.reported_durable = start;
        self.dirty_since = None;
        self.periodic_due = false;
        self.sync_requested = false;
        self.restarting = Some(start);
        self.drive();
        Ok(())
    }

    /// A `restart_at` is done once the old segments are gone and the new one is ready.
    pub(super) fn restart_progress(&mut self) {
        let Some(start) = self.restarting else {
            return;
        };
        let ready = self.tasks.is_empty()
            && self.lane.is_none()
            && self.segments.iter().all(|s| s.stage == Stage::Ready);
        if ready {
            self.restarting = None;
            self.events
                .push_back(LogEvent::Replica(ReplicaEvent::Truncated {
                    result: Ok(start),
                }));
        }
    }

    pub(super) fn drive_truncation(&mut self) {
        if self.poison.is_some() {
            return;
        }
        let Some(t) = self.truncation.as_mut() else {
            return;
        };
        if t.busy {
            return;
        }
        let seg = &self.segments[t.seg];
        if t.step == TStep::Remove && t.later.is_empty() {
            t.step = TStep::Cut;
        }
        let kind = match t.step {
            TStep::Scan => FileOpKind::Read {
                path: seg.path.clone(),
                pos: t.scan_at,
                len: TRUNCATE_SCAN_BYTES.min(seg.written_len.saturating_sub(t.scan_at)) as u32,
            },
            TStep::Remove => FileOpKind::Remove {
                path: t.later.last().expect("checked").clone(),
            },
            TStep::SyncDir => FileOpKind::SyncDir {
                path: self.dir.clone(),
            },
            TStep::Cut => FileOpKind::Truncate {
                path: seg.path.clone(),
                len: t.pos.expect("found before the cut"),
            },
            TStep::SyncCut => FileOpKind::Sync {
                path: seg.path.clone(),
            },
        };
        t.busy = true;
        self.issue(kind, Inflight::Truncate);
    }

    pub(super) fn truncate_complete(&mut self, result: Result<FileOutput, FileError>) {
        let Some(mut t) = self.truncation.take() else {
            return;
        };
        t.busy = false;
        let path = self.segments[t.seg].path.clone();
        let data = match result {
            Ok(FileOutput::Data(d)) => d,
            Ok(_) => Bytes::new(),
            Err(error) => {
                let kind = match t.step {
                    TStep::Scan => "read",
                    TStep::Remove => "remove",
                    TStep::SyncDir => "sync_dir",
                    TStep::Cut => "truncate",
                    TStep::SyncCut => "sync",
                };
                let e = StorageError::Io {
                    op: kind,
                    path,
                    error,
                };
                return self.truncate_failed(e, t.step != TStep::Scan);
            }
        };
        match t.step {
            TStep::Scan => match scan_for_cut(&data, t.offset) {
                Cut::At(rel) => {
                    t.pos = Some(t.scan_at + rel as u64);
                    t.step = TStep::Remove;
                }
                Cut::Inside { base, end } => {
                    let e = TruncateError::NotBoundary {
                        offset: t.offset,
                        entry_base: base,
                        entry_end: end,
                    };
                    self.events
                        .push_back(LogEvent::Replica(ReplicaEvent::Truncated {
                            result: Err(e),
                        }));
                    return;
                }
                Cut::Further(rel) if rel > 0 => t.scan_at += rel as u64,
                Cut::Further(_) | Cut::Bad => {
                    let e = StorageError::Corrupt {
                        path,
                        pos: t.scan_at,
                        what: format!("no entry boundary found for offset {}", t.offset),
                    };
                    return self.truncate_failed(e, false);
                }
            },
            TStep::Remove => {
                t.later.pop();
                t.step = TStep::SyncDir;
            }
            TStep::SyncDir => t.step = TStep::Remove,
            TStep::Cut => t.step = TStep::SyncCut,
            TStep::SyncCut => return self.truncate_done(&t),
        }
        self.truncation = Some(t);
    }

    /// A truncation stopped. A failed read changed nothing; a failed write stops the log.
    fn truncate_failed(&mut self, e: StorageError, stops_log: bool) {
        self.events
            .push_back(LogEvent::Replica(ReplicaEvent::Truncated {
                result: Err(TruncateError::Failed(e.clone())),
            }));
        if stops_log {
            self.fail(e);
        }
    }

    /// The cut is durable: the log now ends at it.
    fn truncate_done(&mut self, t: &Truncation) {
        let pos = t.pos.expect("cut");
        self.segments.truncate(t.seg + 1);
        self.segments[t.seg].cut(t.offset, pos);
        while self.tail.back().is_some_and(|e| e.base >= t.offset) {
            let e = self.tail.pop_back().expect("checked");
            self.tail_bytes -= e.bytes.len();
        }
        self.next_offset = t.offset;
        self.written_offset = t.offset;
        self.synced_offset = t.offset;
        self.reported_durable = t.offset;
        self.dirty_since = None;
        self.periodic_due = false;
        self.sync_requested = false;
        self.events
            .push_back(LogEvent::Replica(ReplicaEvent::Truncated {
                result: Ok(t.offset),
            }));
    }

    // ---- the replica state file ---------------------------------------------------------

    /// The replica state as the file durably holds it (loaded at open; a missing file is
    /// the default state).
    pub fn replica_state(&self) -> &ReplicaState {
        self.replica.durable()
    }

    /// Writes `state` to the replica state file; [`ReplicaEvent::StateDurable`] says when
    /// it is durable. Refused if the fence generation or the commit would go back from the
    /// newest state accepted so far, or the epochs are out of order or too many. States
    /// accepted while one is being written are coalesced: the newest is written next.
    pub fn persist_replica_state(&mut self, state: ReplicaState) -> Result<(), ReplicaStateError> {
        if !self.is_open() || self.poison.is_some() {
            return Err(ReplicaStateError::NotOpen);
        }
        self.replica.accept(state)?;
        self.drive();
        Ok(())
    }

    pub(super) fn drive_replica_state(&mut self) {
        if self.poison.is_some() {
            return;
        }
        if let Some(kind) = self.replica.next_op(&self.dir) {
            self.issue(kind, Inflight::ReplicaState);
        }
    }

    pub(super) fn replica_state_complete(&mut self, result: Result<FileOutput, FileError>) {
        match self.replica.complete(&self.dir, result) {
            Ok(Some(state)) => self
                .events
                .push_back(LogEvent::Replica(ReplicaEvent::StateDurable(state))),
            Ok(None) => {}
            Err((kind, error)) => self.fail(Self::io_error(&kind, error)),
        }
    }

    /// Recovery found a replica state file of `len` bytes: the read that loads it.
    pub(super) fn replica_state_read(&self, len: u64) -> Result<FileOpKind, StorageError> {
        let path = layout::join(&self.dir, REPLICA_STATE_FILE);
        if len > MAX_REPLICA_STATE_BYTES as u64 {
            return Err(StorageError::Corrupt {
                path,
                pos: 0,
                what: format!("a replica state file of {len} bytes is too long"),
            });
        }
        Ok(FileOpKind::Read {
            path,
            pos: 0,
            len: len as u32,
        })
    }

    /// Recovery read the replica state file: a damaged one refuses to open.
    pub(super) fn replica_state_loaded(&mut self, data: &[u8]) -> Result<(), StorageError> {
        let state = ReplicaState::decode(data).map_err(|e| StorageError::Corrupt {
            path: layout::join(&self.dir, REPLICA_STATE_FILE),
            pos: 0,
            what: e.to_string(),
        })?;
        // Where its leader last cut: served from there again (`retention.rs`).
        self.trimmed_below = state.log_start;
        self.replica = StateFile::loaded(state);
        Ok(())
    }
}

/// Skip entries a jump of `gap` offsets takes (one holds at most `u32::MAX`).
fn skips_over(gap: u64) -> usize {
    gap.div_ceil(u64::from(u32::MAX)) as usize
}

/// What a truncation's scan found in a chunk.
#[derive(Debug, PartialEq, Eq)]
enum Cut {
    /// The entry starting at this position in the chunk begins at the offset.
    At(usize),
    /// The offset is inside this entry.
    Inside { base: u64, end: u64 },
    /// Not yet: go on from the entry starting here.
    Further(usize),
    /// The bytes are not entries this log wrote.
    Bad,
}

/// Walks entry headers (lengths, counts, bases; the entries were checked when written or
/// scanned) from the start of `data` to the one holding `offset`.
fn scan_for_cut(data: &[u8], offset: u64) -> Cut {
    let mut at = 0usize;
    while data.len() - at >= ENTRY_HEAD_BYTES {
        let total = record::u32_at(data, at) as usize + ENTRY_HEADER_LEN;
        let count = u64::from(record::u32_at(data, at + 12));
        let base = record::u64_at(data, at + 16);
        if total < ENTRY_HEAD_BYTES || count == 0 || base > offset {
            return Cut::Bad;
        }
        if base == offset {
            return Cut::At(at);
        }
        if base + count > offset {
            return Cut::Inside {
                base,
                end: base + count,
            };
        }
        at += total;
    }
    Cut::Further(at)
}
