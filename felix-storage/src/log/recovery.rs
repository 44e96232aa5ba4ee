//! Recovery: opening a log at startup as a sequence of file ops. The directory is listed,
//! each segment scanned and checked for continuity, a torn tail or write padding cut, and
//! leftovers removed, before the log reports `Opened`.
//!
//! Its own file because it runs once, before any other lane, and its rules (which damage a
//! crash explains and which is corruption) follow `docs/storage-format.md`, "Recovery".

use bytes::Bytes;

use super::{
    Inflight, LogEvent, Phase, ShardLog, StorageError, SCAN_READ_BYTES, WRITE_PADDING_BLOCK,
};
use crate::layout::{self, FileName};
use crate::ops::{FileError, FileOpKind, FileOutput};
use crate::record::{self, SegmentHeader, Step, SEGMENT_HEADER_LEN};
use crate::segment::{Segment, Stage};

/// Power loss zero-fills whole sectors; the torn-tail rule reasons in these units.
const SECTOR_BYTES: u64 = 512;

/// Whether zeros from `at` to the end of a file of `file_len` bytes are write padding
/// ([`WRITE_PADDING_BLOCK`]); the caller checks that they are zeros.
fn is_write_padding(at: u64, file_len: u64) -> bool {
    at < file_len
        && file_len.is_multiple_of(WRITE_PADDING_BLOCK)
        && file_len - at < WRITE_PADDING_BLOCK
}

impl ShardLog {
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
    pub(super) fn open_next(&mut self) {
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
                OpenStep::Listed | OpenStep::ReplicaStateRead | OpenStep::Done => return,
                OpenStep::ReplicaState(len) => {
                    o.step = OpenStep::ReplicaStateRead;
                    match self.replica_state_read(len) {
                        Ok(kind) => {
                            self.issue(kind, Inflight::Open);
                        }
                        Err(e) => self.open_fail(e),
                    }
                    return;
                }
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

    pub(super) fn open_complete(&mut self, result: Result<FileOutput, FileError>) {
        let dir = self.dir.clone();
        let step = std::mem::replace(&mut self.opening().step, OpenStep::Done);
        let output = match result {
            Ok(o) => o,
            Err(error) => {
                let (op, path) = match &step {
                    OpenStep::List => ("create_dir", dir),
                    OpenStep::Listed => ("list_dir", dir),
                    OpenStep::Scanning(s) => ("read", s.seg.path.clone()),
                    OpenStep::ReplicaStateRead => (
                        "read",
                        layout::join(&dir, crate::replica_state::REPLICA_STATE_FILE),
                    ),
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
                    use crate::replica_state::{REPLICA_STATE_FILE, REPLICA_STATE_TMP};
                    if e.name == REPLICA_STATE_FILE {
                        o.replica_len = Some(e.len);
                        continue;
                    }
                    if e.name == REPLICA_STATE_TMP {
                        // Never renamed in: the state it held never counted as durable.
                        o.cleanup.push(layout::join(&dir, &e.name));
                        continue;
                    }
                    match layout::parse_name(&e.name) {
                        FileName::Segment(base) => o.listing.push((base, e.len)),
                        FileName::CompactTemp(_) => o.cleanup.push(layout::join(&dir, &e.name)),
                        FileName::Other => {}
                    }
                }
                o.listing.sort_unstable();
                match o.replica_len {
                    Some(len) => OpenStep::ReplicaState(len),
                    None => OpenStep::NextSegment,
                }
            }
            OpenStep::ReplicaStateRead => {
                let data = match output {
                    FileOutput::Data(d) => d,
                    _ => Bytes::new(),
                };
                if let Err(e) = self.replica_state_loaded(&data) {
                    return self.open_fail(e);
                }
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
                    // A skip entry holds no record to replay.
                    if let Some(r) = self.replay.as_mut().filter(|_| !meta.skip) {
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
}

#[derive(Debug, Default)]
pub(super) struct Opening {
    step: OpenStep,
    listing: Vec<(u64, u64)>,
    at: usize,
    cleanup: Vec<String>,
    truncate: Option<(String, u64)>,
    sync_file: Option<String>,
    dir_dirty: bool,
    truncated_bytes: u64,
    /// The replica state file's listed length, when there is one.
    replica_len: Option<u64>,
}

#[derive(Debug, Default)]
enum OpenStep {
    #[default]
    CreateDir,
    List,
    Listed,
    /// The replica state file is to be read (its listed length).
    ReplicaState(u64),
    ReplicaStateRead,
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
