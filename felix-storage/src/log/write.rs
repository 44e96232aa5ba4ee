//! Appends and the write lane: encoding into pending buffers, one write at a time, the
//! sync that may run beside it (group commit), segment roll and creation, and the
//! housekeeping tasks queued on the lane.
//!
//! Its own file because this is the hot path and the lane rules decide what `Durable`
//! means; a change to durability should only need reading here.

use bytes::{Bytes, BytesMut};
use std::time::Instant;

use super::{
    AppendError, Batch, FsyncMode, Inflight, Pending, PendingEntry, ShardLog, TailEntry, Task,
    WriteJob, WRITE_BUFFER_MAX_BYTES,
};
use crate::layout;
use crate::ops::{FileError, FileOpKind, FileOutput};
use crate::record::{
    self, EntryMeta, SegmentHeader, MAX_ENTRY_BYTES, MAX_PUBLISHER_BYTES, SEGMENT_HEADER_LEN,
};
use crate::segment::{Segment, Stage};
#[cfg(test)]
use crate::write_buffers::WriteBuffers;

impl ShardLog {
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
        self.check_appendable()?;
        if self.only_shipped {
            return Err(AppendError::ShippedOnly);
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
        let meta = EntryMeta {
            base: first,
            count: batch.payloads.len() as u32,
            time_us: batch.time_us,
            len: len as u32,
            skip: false,
        };
        self.stage_entry(now, &meta, |buf| {
            record::encode_entry_ext(buf, first, batch.time_us, publisher, batch.payloads, ext)
        });
        Ok(first)
    }

    /// Puts one entry of `meta.len` bytes, which `put` writes at the end of the buffer it is
    /// given, into the pending writes at the next offset: rolls the segment when the entry
    /// would take a non-empty one past the limit, notes it in the index, and asks for the
    /// write lane. The caller has checked every limit.
    pub(super) fn stage_entry(
        &mut self,
        now: Instant,
        meta: &EntryMeta,
        put: impl FnOnce(&mut BytesMut),
    ) {
        let len = meta.len as usize;
        let first = meta.base;
        debug_assert_eq!(first, self.next_offset);
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
        put(&mut p.buf);
        debug_assert_eq!(p.buf.len() - rel, len);
        let pos = seg.len;
        seg.note_entry(pos, meta);
        p.entries.push(PendingEntry {
            base: first,
            end: meta.end(),
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
    }

    pub(super) fn check_appendable(&self) -> Result<(), AppendError> {
        if let Some(e) = &self.poison {
            return Err(AppendError::Failed(e.clone()));
        }
        if !self.is_open() {
            return Err(AppendError::NotOpen);
        }
        if self.truncation.is_some() {
            return Err(AppendError::Truncating);
        }
        Ok(())
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

    fn sync_wanted(&self) -> bool {
        self.cfg.fsync == FsyncMode::OnCommit || self.sync_requested || self.periodic_due
    }

    pub(super) fn drive_writes(&mut self) {
        // A truncation has both lanes to itself until it is done.
        if self.poison.is_some() || self.truncation.is_some() {
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

    pub(super) fn pending_is_empty(&self) -> bool {
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

    pub(super) fn write_complete(&mut self, job: WriteJob, result: Result<FileOutput, FileError>) {
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
                let mut at = 0;
                if let Some(i) = self.seg_index(base) {
                    at = self.segments[i].written_len;
                    self.segments[i].written_len += bytes.len() as u64;
                }
                // A failure meanwhile forgot every byte still pending (`fail`), this write's
                // among them.
                self.pending_bytes = self.pending_bytes.saturating_sub(bytes.len());
                self.written_offset = end;
                if self.ship_written {
                    self.events
                        .push_back(super::LogEvent::Replica(super::ReplicaEvent::Written {
                            up_to: end,
                        }));
                }
                for e in entries {
                    self.tail_bytes += e.len;
                    self.tail.push_back(TailEntry {
                        base: e.base,
                        end: e.end,
                        bytes: bytes.slice(e.rel..e.rel + e.len),
                        write: bytes.clone(),
                        rel: e.rel,
                        pos: at + e.rel as u64,
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
        self.restart_progress();
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
}
