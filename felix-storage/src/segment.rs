//! One segment file as the log sees it in memory: its offset range, how many of its bytes
//! are assigned, written and synced, and its sparse index.
//!
//! The index is never stored: it is rebuilt from the data whenever a segment is scanned and
//! extended as entries are appended, by the same rule both times, so the two can never
//! disagree. It says where to start reading; the entries read from there say what is true.

use super::layout;
use super::record::{EntryMeta, SEGMENT_HEADER_LEN};

/// One index point per this many bytes of entries (the first entry always has one). A read
/// decodes at most about this much before it reaches the offset it wants.
pub(crate) const INDEX_INTERVAL_BYTES: u64 = 4096;

/// Where a segment is in its creation: each step is one file op, done in this order so a
/// crash at any point leaves either no file, a file the recovery rules repair, or a
/// durable empty segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// `Create` (or truncate) the file.
    Create,
    /// Append the header.
    Header,
    /// Sync the file, so the header is on the device before any record.
    SyncFile,
    /// Sync the directory, so the file's name is.
    SyncDir,
    /// Takes appends.
    Ready,
}

#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub(crate) base: u64,
    pub(crate) path: String,
    /// Set on compaction output: the end of the range it covers, gaps allowed inside.
    pub(crate) compacted_end: Option<u64>,
    /// One past the last offset assigned to this segment (pending appends included).
    pub(crate) end: u64,
    /// Bytes assigned: header plus every entry, pending ones included.
    pub(crate) len: u64,
    /// Bytes whose write completed.
    pub(crate) written_len: u64,
    /// Bytes covered by a completed sync.
    pub(crate) synced_len: u64,
    /// `(first offset of an entry, file position of that entry)`, ascending.
    index: Vec<(u64, u64)>,
    /// Beside `index`: the newest append time of any entry up to and including that index
    /// point's entry. Never the entry's own time, which goes back when the wall clock does,
    /// and which would hide the entries between two points that are newer than both.
    index_times: Vec<u64>,
    last_indexed_pos: Option<u64>,
    /// Append time of the newest record, for retention by age.
    pub(crate) newest_time_us: u64,
    pub(crate) stage: Stage,
    /// Reads in flight against this file; it is not removed or renamed over while any are.
    pub(crate) reads_in_flight: u32,
}

impl Segment {
    /// A segment that does not exist on disk yet.
    pub(crate) fn new_unborn(dir: &str, base: u64) -> Segment {
        Segment {
            base,
            path: layout::join(dir, &layout::segment_name(base)),
            compacted_end: None,
            end: base,
            len: SEGMENT_HEADER_LEN,
            written_len: 0,
            synced_len: 0,
            index: Vec::new(),
            index_times: Vec::new(),
            last_indexed_pos: None,
            newest_time_us: 0,
            stage: Stage::Create,
            reads_in_flight: 0,
        }
    }

    /// A segment found on disk with a valid header; entries are added as they are scanned.
    pub(crate) fn found(dir: &str, base: u64, compacted_end: Option<u64>) -> Segment {
        Segment {
            compacted_end,
            end: compacted_end.unwrap_or(base),
            written_len: SEGMENT_HEADER_LEN,
            synced_len: SEGMENT_HEADER_LEN,
            stage: Stage::Ready,
            ..Segment::new_unborn(dir, base)
        }
    }

    /// Records an entry at `pos` (scanned or just appended).
    pub(crate) fn note_entry(&mut self, pos: u64, meta: &EntryMeta) {
        let due = self
            .last_indexed_pos
            .is_none_or(|last| pos - last >= INDEX_INTERVAL_BYTES);
        self.newest_time_us = self.newest_time_us.max(meta.time_us);
        if due {
            self.index.push((meta.base, pos));
            self.index_times.push(self.newest_time_us);
            self.last_indexed_pos = Some(pos);
        }
        if self.compacted_end.is_none() {
            self.end = meta.end();
        }
        self.len = self.len.max(pos + u64::from(meta.len));
    }

    /// Where to start reading for `offset`: the last indexed entry at or before it.
    pub(crate) fn seek(&self, offset: u64) -> u64 {
        let i = self.index.partition_point(|&(first, _)| first <= offset);
        if i == 0 {
            SEGMENT_HEADER_LEN
        } else {
            self.index[i - 1].1
        }
    }

    /// Where to start looking for the first record appended at or after `at_micros`: the
    /// first offset of the last index point older than it (the base if none is). Every
    /// entry before that point is older, since `index_times` only rises.
    pub(crate) fn seek_time(&self, at_micros: u64) -> u64 {
        let i = self.index_times.partition_point(|&t| t < at_micros);
        if i == 0 {
            self.base
        } else {
            self.index[i - 1].0
        }
    }

    /// The file position of the entry starting at `offset`, if an index point says.
    pub(crate) fn indexed_pos(&self, offset: u64) -> Option<u64> {
        let i = self
            .index
            .binary_search_by_key(&offset, |&(first, _)| first)
            .ok()?;
        Some(self.index[i].1)
    }

    /// The segment now ends before `offset`, whose entry started at file position `pos`
    /// (a truncation, durable). The newest time stays: too new only keeps it longer.
    pub(crate) fn cut(&mut self, offset: u64, pos: u64) {
        let keep = self.index.partition_point(|&(first, _)| first < offset);
        self.index.truncate(keep);
        self.index_times.truncate(keep);
        self.last_indexed_pos = self.index.last().map(|&(_, p)| p);
        self.end = offset;
        self.len = pos;
        self.written_len = pos;
        self.synced_len = pos;
    }

    pub(crate) fn has_entries(&self) -> bool {
        self.len > SEGMENT_HEADER_LEN
    }

    #[cfg(test)]
    pub(crate) fn index_points(&self) -> &[(u64, u64)] {
        &self.index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(base: u64, count: u32, len: u32) -> EntryMeta {
        EntryMeta {
            base,
            count,
            time_us: base * 10,
            len,
            skip: false,
        }
    }

    #[test]
    fn the_index_is_sparse_and_seek_lands_at_or_before() {
        let mut s = Segment::found("d", 100, None);
        let mut pos = SEGMENT_HEADER_LEN;
        for i in 0..100u64 {
            s.note_entry(pos, &meta(100 + 2 * i, 2, 1000));
            pos += 1000;
        }
        assert_eq!(s.end, 300);
        assert_eq!(s.len, pos);
        // One point per ≥ 4096 bytes: entries 0, 5, 10, ...
        assert_eq!(s.index_points().len(), 20);
        assert_eq!(s.seek(100), SEGMENT_HEADER_LEN);
        assert_eq!(s.seek(99), SEGMENT_HEADER_LEN);
        let p = s.seek(151);
        // Entry 25 (offsets 150, 151) is indexed exactly.
        assert_eq!(p, SEGMENT_HEADER_LEN + 25 * 1000);
        let p = s.seek(159);
        assert!((SEGMENT_HEADER_LEN + 25 * 1000..=SEGMENT_HEADER_LEN + 29 * 1000).contains(&p));
        assert_eq!(s.newest_time_us, 298 * 10);
    }

    #[test]
    fn seek_time_starts_at_or_before_the_first_entry_that_recent_when_times_go_back() {
        let mut s = Segment::found("d", 0, None);
        let mut pos = SEGMENT_HEADER_LEN;
        // (time, length): 100 bytes keeps an entry off the index after a short indexed one.
        let entries = [
            (10, 100),
            (50, 100),
            (20, 5000),
            (30, 5000),
            (5, 5000),
            (40, 5000),
        ];
        for (i, &(time_us, len)) in entries.iter().enumerate() {
            let m = EntryMeta {
                base: i as u64,
                count: 1,
                time_us,
                len,
                skip: false,
            };
            s.note_entry(pos, &m);
            pos += u64::from(len);
        }
        // Index points on entries 0, 3, 4, 5; the unindexed 50 counts from entry 3 on.
        assert_eq!(s.index_points().len(), 4);
        for at in [0, 10, 11, 25, 45, 50] {
            let first = entries.iter().position(|&(t, _)| t >= at).unwrap() as u64;
            assert!(s.seek_time(at) <= first, "at {at}");
        }
        assert_eq!(s.seek_time(51), 5, "nothing that recent: the last point");
    }
}
