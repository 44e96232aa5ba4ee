//! Compaction: rewriting the sealed segments to keep only chosen records, on a lane of its
//! own, in the crash-safe order of synced temporary files, renames and unlinks.
//!
//! Its own file because the pass is a state machine of its own (`Compaction`, `CStep`)
//! that the rest of the log sees only through `drive_compaction` and whether reads park.

use bytes::{Bytes, BytesMut};

use super::{Inflight, LogEvent, ShardLog, StorageError, SCAN_READ_BYTES};
use crate::layout;
use crate::ops::{FileError, FileOpKind, FileOutput};
use crate::record::{self, EntryMeta, SegmentHeader, Step, SEGMENT_HEADER_LEN};
use crate::segment::{Segment, Stage};

impl ShardLog {
    /// Rewrites the sealed segments, keeping only the records whose offsets are in `keep`
    /// (ascending), each at its own offset. Returns false if nothing is sealed yet or a pass
    /// is already running. See `docs/storage-format.md`, "Compaction", for the crash order.
    pub fn compact(&mut self, keep: Vec<u64>) -> bool {
        if !self.is_open()
            || self.poison.is_some()
            || self.compaction.is_some()
            || self.truncation.is_some()
        {
            return false;
        }
        let durable = self
            .durable_offset()
            .min(self.compact_below.unwrap_or(u64::MAX));
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

    /// Keeps later passes to the segments that end at or below `below` (`None`: any sealed,
    /// durable one). A replicated log's leader bounds it by what every follower holds, so
    /// no follower is fed across a part compacted after it passed (docs/replication.md,
    /// "Consumer groups").
    pub fn bound_compaction(&mut self, below: Option<u64>) {
        self.compact_below = below;
    }

    /// The bound [`bound_compaction`](Self::bound_compaction) set.
    pub fn compaction_bound(&self) -> Option<u64> {
        self.compact_below
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

    pub(super) fn drive_compaction(&mut self) {
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

    pub(super) fn compact_complete(&mut self, result: Result<FileOutput, FileError>) {
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
pub(super) struct Compaction {
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
    pub(super) fn parks_reads(&self) -> bool {
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
                    // A skip entry decodes with no payloads: nothing of it is kept.
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
                            skip: false,
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
