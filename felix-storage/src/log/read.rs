//! Reads: tickets and read jobs, answered from the tail cache or by file reads of bytes
//! whose write has completed, plus the time seek and the tail cache's eviction.
//!
//! Its own file because reads run beside everything else and meet the write side only
//! through the tail cache and each segment's written length.

use bytes::Bytes;

use super::{
    Inflight, LogEvent, ReadBatch, ReadError, ReadJob, ReadTicket, ShardLog, StorageError,
    StoredBatch, MAX_READS_IN_FLIGHT, MAX_RECORDS_PER_READ, READ_MAX_BYTES, READ_MIN_BYTES,
};
use crate::layout;
use crate::ops::{FileError, FileOpKind, FileOutput};
use crate::record::{self, EntryMeta, Step};

impl ShardLog {
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
        self.start_read(from_offset, max_records, max_bytes, None)
    }

    /// A record read, or a framed one when `framed` is set (`read_framed`).
    pub(super) fn start_read(
        &mut self,
        from_offset: u64,
        max_records: usize,
        max_bytes: usize,
        framed: Option<super::replica::FramedAcc>,
    ) -> Result<ReadTicket, ReadError> {
        if !self.is_open() {
            return Err(ReadError::NotOpen);
        }
        // A truncation cuts the files reads would go to; it is short and rare.
        if self.truncation.is_some() {
            return Err(ReadError::Busy);
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
        // A shipping leader's framed reads take what is written: its followers sync it
        // while it syncs its own copy (`ship_before_sync`).
        let limit = if framed.is_some() && self.ship_written {
            self.written_offset.max(self.durable_offset())
        } else {
            self.durable_offset()
        };
        let job = ReadJob {
            ticket,
            next: from_offset,
            limit,
            max_records: max_records.clamp(1, MAX_RECORDS_PER_READ),
            max_bytes,
            records: 0,
            bytes: 0,
            full: false,
            out: Vec::new(),
            framed,
            resume: None,
            in_flight: None,
        };
        self.reads.insert(ticket.0, job);
        self.advance_read(ticket.0);
        Ok(ticket)
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

    pub(super) fn evict_tail_below(&mut self, offset: u64) {
        while self.tail.front().is_some_and(|e| e.base < offset) {
            let e = self.tail.pop_front().expect("checked");
            self.tail_bytes -= e.bytes.len();
        }
    }

    pub(super) fn finish_read(&mut self, mut job: ReadJob, result: Result<(), ReadError>) {
        if let Some(acc) = job.framed.take() {
            let result = result.map(|()| acc.into_batch());
            self.events
                .push_back(LogEvent::Replica(super::ReplicaEvent::Framed {
                    ticket: job.ticket,
                    result,
                }));
            return;
        }
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
        if meta.skip {
            // Nothing lives at these offsets: the read goes on past them, up to the durable
            // mark.
            job.next = job.next.max(meta.end().min(job.limit));
            return job.next >= meta.end() && !Self::read_is_done(job);
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
    pub(super) fn advance_read(&mut self, key: u64) {
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
            if job.framed.is_some() {
                self.framed_from_tail(&mut job);
                return self.finish_read(job, Ok(()));
            }
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
            if seg.compacted_end.is_some() && i + 1 < self.segments.len() {
                // A compacted segment may end in a gap (its last records were dropped):
                // what follows is in the next segment, not nowhere.
                job.next = seg.end;
                job.resume = None;
                self.reads.insert(key, job);
                return self.advance_read(key);
            }
            return self.finish_read(job, Ok(()));
        }
        let want = (job.max_bytes as u64)
            .saturating_add(4096)
            .clamp(READ_MIN_BYTES.into(), READ_MAX_BYTES.into());
        let len = want.min(seg.written_len - pos) as u32;
        self.issue_read(i, job, key, pos, len);
    }

    pub(super) fn issue_read(&mut self, i: usize, mut job: ReadJob, key: u64, pos: u64, len: u32) {
        let seg = &mut self.segments[i];
        seg.reads_in_flight += 1;
        job.in_flight = Some((seg.base, pos));
        let path = seg.path.clone();
        self.issue(FileOpKind::Read { path, pos, len }, Inflight::Read(key));
        self.reads.insert(key, job);
    }

    pub(super) fn read_complete(&mut self, key: u64, result: Result<FileOutput, FileError>) {
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
        if job.framed.is_some() {
            return self.framed_chunk(key, job, i, pos, data);
        }
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
}
