//! ShardLog against the fault-injecting memfs: recovery, group commit, crashes at every
//! write step, corruption, retention and reads.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::*;
use crate::layout;
use crate::memfs::{Crash, MemFs};
use crate::ops::FileErrorKind;
use crate::record::{Step, MAX_ENTRY_BYTES, SEGMENT_HEADER_LEN};

pub(crate) const DIR: &str = "streams/t/ns/s/0";

/// A log, its filesystem and an oracle of what was appended and acknowledged.
pub(crate) struct Rig {
    pub(crate) fs: MemFs,
    pub(crate) log: ShardLog,
    pub(crate) cfg: LogConfig,
    pub(crate) t0: Instant,
    /// Ops the log emitted that the "runtime" has not executed yet.
    pub(crate) queue: VecDeque<FileOp>,
    pub(crate) durable: u64,
    pub(crate) opened: Option<(u64, u64, u64)>,
    pub(crate) failed: Option<StorageError>,
    pub(crate) reads: HashMap<ReadTicket, Result<ReadBatch, ReadError>>,
    pub(crate) trimmed: Option<u64>,
    pub(crate) compacted: usize,
    /// Every payload appended, by offset.
    pub(crate) appended: Vec<Bytes>,
    pub(crate) ops_seen: Vec<FileOpKind>,
    /// Replication events, as they came.
    pub(crate) framed: HashMap<ReadTicket, Result<FramedBatch, ReadError>>,
    pub(crate) truncated: Vec<Result<u64, TruncateError>>,
    pub(crate) states: Vec<crate::replica_state::ReplicaState>,
    /// `Written` reports (a log shipping before its sync).
    pub(crate) written: Vec<u64>,
}

pub(crate) fn cfg(fsync: FsyncMode, segment_max_bytes: u64) -> LogConfig {
    LogConfig {
        fsync,
        segment_max_bytes,
        ..LogConfig::default()
    }
}

impl Rig {
    pub(crate) fn new(cfg: LogConfig) -> Rig {
        Rig::on(MemFs::new(), cfg)
    }

    /// Opens a log over an existing filesystem and runs recovery to the end.
    pub(crate) fn on(fs: MemFs, cfg: LogConfig) -> Rig {
        let t0 = Instant::now();
        let log = ShardLog::open(LogId(1), DIR.into(), cfg.clone(), t0);
        let mut rig = Rig {
            fs,
            log,
            cfg,
            t0,
            queue: VecDeque::new(),
            durable: 0,
            opened: None,
            failed: None,
            reads: HashMap::new(),
            trimmed: None,
            compacted: 0,
            appended: Vec::new(),
            ops_seen: Vec::new(),
            framed: HashMap::new(),
            truncated: Vec::new(),
            states: Vec::new(),
            written: Vec::new(),
        };
        rig.pump();
        rig
    }

    pub(crate) fn collect(&mut self) {
        while let Some(op) = self.log.poll_op() {
            assert_eq!(op.id.log(), LogId(1));
            self.ops_seen.push(op.kind.clone());
            self.queue.push_back(op);
        }
        while let Some(e) = self.log.poll_event() {
            match e {
                LogEvent::Opened {
                    start_offset,
                    next_offset,
                    truncated_bytes,
                } => self.opened = Some((start_offset, next_offset, truncated_bytes)),
                LogEvent::Durable { up_to } => {
                    assert!(up_to > self.durable, "durable goes forward");
                    self.durable = up_to;
                }
                LogEvent::Read { ticket, result } => {
                    assert!(self.reads.insert(ticket, result).is_none());
                }
                LogEvent::Trimmed { start_offset } => self.trimmed = Some(start_offset),
                LogEvent::Compacted { .. } => self.compacted += 1,
                LogEvent::CompactionFailed(e) | LogEvent::Failed(e) => self.failed = Some(e),
                LogEvent::Replica(ReplicaEvent::Framed { ticket, result }) => {
                    assert!(self.framed.insert(ticket, result).is_none());
                }
                LogEvent::Replica(ReplicaEvent::Truncated { result }) => {
                    if let Ok(at) = result {
                        // The durable mark starts again from the cut.
                        self.durable = self.durable.min(at);
                    }
                    self.truncated.push(result);
                }
                LogEvent::Replica(ReplicaEvent::StateDurable(s)) => self.states.push(s),
                LogEvent::Replica(ReplicaEvent::Written { up_to }) => self.written.push(up_to),
            }
        }
    }

    /// Executes the oldest queued op. False when nothing is queued.
    pub(crate) fn step(&mut self) -> bool {
        self.collect();
        let Some(op) = self.queue.pop_front() else {
            return false;
        };
        if let Some(c) = self.fs.execute(op) {
            self.log.handle_completion(c);
        }
        self.collect();
        true
    }

    /// Runs every op to quiescence (bounded).
    pub(crate) fn pump(&mut self) {
        for _ in 0..100_000 {
            if !self.step() {
                return;
            }
        }
        panic!("the log did not settle");
    }

    /// Completes queued ops in a seeded random order (the runtime may reorder freely).
    pub(crate) fn pump_shuffled(&mut self, rng: &mut u64) {
        for _ in 0..100_000 {
            self.collect();
            if self.queue.is_empty() {
                return;
            }
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            let i = (*rng % self.queue.len() as u64) as usize;
            let op = self.queue.remove(i).expect("in range");
            if let Some(c) = self.fs.execute(op) {
                self.log.handle_completion(c);
            }
        }
        panic!("the log did not settle");
    }

    pub(crate) fn append(&mut self, payloads: &[&[u8]]) -> u64 {
        let payloads: Vec<Bytes> = payloads.iter().map(|p| Bytes::copy_from_slice(p)).collect();
        let batch = Batch {
            time_us: 1_000 + self.appended.len() as u64,
            publisher: Some(b"pub"),
            payloads: &payloads,
        };
        let first = self.log.append(self.t0, batch).expect("append");
        assert_eq!(first, self.appended.len() as u64);
        self.appended.extend(payloads);
        self.collect();
        first
    }

    pub(crate) fn read(&mut self, from: u64, max_records: usize, max_bytes: usize) -> ReadBatch {
        let ticket = self.log.read(from, max_records, max_bytes).expect("read");
        self.pump();
        self.reads
            .remove(&ticket)
            .expect("read answered")
            .expect("read ok")
    }

    /// Every durable record from the start, read page by page.
    pub(crate) fn read_all(&mut self) -> Vec<(u64, Bytes)> {
        let mut out = Vec::new();
        let mut from = self.log.start_offset();
        for _ in 0..10_000 {
            let page = self.read(from, 7, 300);
            if page.batches.is_empty() {
                return out;
            }
            for b in page.batches {
                assert_eq!(b.publisher.as_deref(), Some(&b"pub"[..]));
                for (i, p) in b.payloads.into_iter().enumerate() {
                    out.push((b.first_offset + i as u64, p));
                }
            }
            assert!(page.next_offset > from);
            from = page.next_offset;
        }
        panic!("read_all did not finish");
    }

    pub(crate) fn files(&self) -> Vec<String> {
        self.fs.list(DIR)
    }

    pub(crate) fn seg_path(base: u64) -> String {
        format!("{DIR}/{}", layout::segment_name(base))
    }

    pub(crate) fn reopen(self, crash: Crash) -> Rig {
        let Rig { mut fs, cfg, .. } = self;
        fs.crash(crash);
        Rig::on(fs, cfg)
    }
}

fn payload(i: usize) -> Vec<u8> {
    // Varied sizes so entries straddle sectors and segment limits differently.
    let len = (i * 37) % 90 + 1;
    (0..len).map(|j| (i * 7 + j) as u8).collect()
}

#[test]
fn a_new_log_creates_its_first_segment_durably() {
    let rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    assert_eq!(rig.opened, Some((0, 0, 0)));
    assert_eq!(rig.files(), vec![layout::segment_name(0)]);
    let seg = rig.fs.file(&Rig::seg_path(0)).unwrap();
    assert_eq!(seg.len(), SEGMENT_HEADER_LEN as usize);
    // Directory first, then create, header, sync of the file, sync of the directory.
    let kinds: Vec<&str> = rig.ops_seen.iter().map(|k| k.name()).collect();
    assert_eq!(
        kinds,
        [
            "create_dir",
            "list_dir",
            "create",
            "append",
            "sync",
            "sync_dir"
        ]
    );
    let rig = rig.reopen(Crash::Power);
    assert_eq!(rig.opened, Some((0, 0, 0)));
}

#[test]
fn appends_read_back_from_memory_and_after_a_restart() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.append(&[b"a", b"bb"]);
    rig.append(&[b"ccc"]);
    rig.pump();
    assert_eq!(rig.durable, 3);
    let page = rig.read(1, 100, 1 << 20);
    assert_eq!(page.next_offset, 3);
    assert_eq!(page.batches.len(), 2);
    assert_eq!(page.batches[0].first_offset, 1);
    assert_eq!(page.batches[0].payloads, vec![Bytes::from_static(b"bb")]);
    assert_eq!(page.batches[0].time_us, 1_000);
    assert_eq!(page.batches[1].payloads, vec![Bytes::from_static(b"ccc")]);
    let reads_before = rig.ops_seen.iter().filter(|k| k.name() == "read").count();
    assert_eq!(reads_before, 0, "the tail cache answered");

    let mut rig = rig.reopen(Crash::Power);
    assert_eq!(rig.opened, Some((0, 3, 0)));
    let all = rig.read_all();
    assert_eq!(
        all.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>(),
        vec![&b"a"[..], b"bb", b"ccc"]
    );
    assert!(rig.ops_seen.iter().any(|k| k.name() == "read"));
}

fn queued(rig: &Rig) -> Vec<&'static str> {
    rig.queue.iter().map(|o| o.kind.name()).collect()
}

#[test]
fn group_commit_overlaps_the_next_write_with_the_sync_in_flight() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.ops_seen.clear();
    rig.append(&[b"first"]);
    assert!(rig.step(), "the append goes out and lands");
    assert_eq!(queued(&rig), ["sync"]);
    assert_eq!(rig.durable, 0, "written is not durable under on_commit");
    // While that sync is in flight the next append goes out at once, beside it...
    rig.append(&[b"second"]);
    assert_eq!(queued(&rig), ["sync", "append"]);
    // ...and everything after that waits in memory for the write lane.
    for i in 0..40u8 {
        rig.append(&[&[i]]);
    }
    assert_eq!(queued(&rig), ["sync", "append"], "one write at a time");
    assert!(rig.step(), "the sync lands");
    assert_eq!(rig.durable, 1, "it covered the first append only");
    assert_eq!(queued(&rig), ["append"], "nothing written is unsynced yet");
    assert!(rig.step(), "the second append lands");
    // A sync for it and the forty queued appends as one write go out together.
    assert_eq!(queued(&rig), ["sync", "append"]);
    let FileOpKind::Append { bytes, .. } = &rig.queue[1].kind else {
        unreachable!()
    };
    let one = record::entry_len(b"pub", &[[0u8]]);
    assert_eq!(
        bytes.len(),
        40 * one,
        "the queued appends went out as one write"
    );
    rig.pump();
    assert_eq!(rig.durable, 42);
    let names: Vec<&str> = rig.ops_seen.iter().map(|k| k.name()).collect();
    assert_eq!(
        names,
        ["append", "sync", "append", "sync", "append", "sync"],
        "42 appends, three writes, three syncs"
    );
    assert!(rig.log.is_idle());
}

/// Found by the `engine_frames` fuzz target: a failure while an append is in flight forgets
/// the queued bytes, and the append landing afterwards must not take its bytes off a total
/// that no longer holds them (an overflow, a panic in debug builds).
#[test]
fn an_append_landing_after_the_log_failed_is_absorbed() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.append(&[b"first"]);
    assert!(rig.step(), "the append goes out and lands");
    rig.append(&[b"second"]);
    assert_eq!(queued(&rig), ["sync", "append"]);
    let sync = rig.queue.pop_front().expect("the sync");
    rig.log.handle_completion(FileCompletion {
        id: sync.id,
        result: Err(FileError::new(FileErrorKind::NoSpace, "full")),
    });
    rig.collect();
    assert!(rig.failed.is_some(), "a failed sync stops the log");
    assert!(rig.step(), "the append in flight lands after the failure");
    assert_eq!(rig.durable, 0, "nothing became durable");
}

#[test]
fn appends_made_between_two_polls_share_one_write() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.ops_seen.clear();
    // One engine turn: ten publishes, then the turn's ops are collected.
    let payloads = [Bytes::from_static(b"r")];
    for _ in 0..10 {
        let batch = Batch {
            time_us: 1,
            publisher: Some(b"pub"),
            payloads: &payloads,
        };
        rig.log.append(rig.t0, batch).unwrap();
    }
    rig.collect();
    assert_eq!(queued(&rig), ["append"]);
    let FileOpKind::Append { bytes, .. } = &rig.queue[0].kind else {
        unreachable!()
    };
    assert_eq!(bytes.len(), 10 * record::entry_len(b"pub", &payloads));
    rig.pump();
    assert_eq!(rig.durable, 10);
    let names: Vec<&str> = rig.ops_seen.iter().map(|k| k.name()).collect();
    assert_eq!(names, ["append", "sync"]);
}

#[test]
fn a_sync_never_vouches_for_the_write_that_overlapped_it() {
    // The runtime finishes the overlapping append before the sync: on a real disk that
    // sync may well have flushed the append's bytes too, but it was issued before the
    // append completed, so the log must not count on it.
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.append(&[b"one"]);
    assert!(rig.step());
    rig.append(&[b"two"]);
    assert_eq!(queued(&rig), ["sync", "append"]);
    let sync = rig.queue.pop_front().unwrap();
    assert!(rig.step(), "the append lands first");
    assert_eq!(rig.log.durable_offset(), 0);
    assert!(queued(&rig).is_empty(), "the sync lane is still taken");
    let c = rig.fs.execute(sync).unwrap();
    rig.log.handle_completion(c);
    rig.collect();
    assert_eq!(rig.durable, 1, "the sync covers the first append only");
    assert_eq!(queued(&rig), ["sync"], "a second sync covers the second");
    rig.pump();
    assert_eq!(rig.durable, 2);
}

#[test]
fn periodic_mode_acknowledges_on_write_and_syncs_within_the_interval() {
    let iv = Duration::from_millis(250);
    let mut rig = Rig::new(cfg(FsyncMode::Periodic(iv), 1 << 20));
    rig.ops_seen.clear();
    rig.append(&[b"x"]);
    rig.pump();
    assert_eq!(rig.durable, 1, "durable once written under periodic");
    assert_eq!(rig.log.synced_offset(), 0);
    assert!(rig.ops_seen.iter().all(|k| k.name() != "sync"));
    assert_eq!(rig.log.poll_timeout(), Some(rig.t0 + iv));
    rig.log
        .handle_timeout(rig.t0 + iv - Duration::from_millis(1), 0);
    rig.pump();
    assert_eq!(rig.log.synced_offset(), 0, "not before the interval");
    rig.log.handle_timeout(rig.t0 + iv, 0);
    rig.pump();
    assert_eq!(rig.log.synced_offset(), 1);
    assert_eq!(
        rig.log.poll_timeout(),
        None,
        "nothing unsynced, no deadline"
    );
    assert!(rig.log.is_idle());
}

#[test]
fn none_mode_syncs_only_to_seal_a_segment_or_on_request() {
    let mut rig = Rig::new(cfg(FsyncMode::None, 200));
    rig.ops_seen.clear();
    for i in 0..3 {
        rig.append(&[&payload(i)]);
        rig.pump();
    }
    assert_eq!(rig.durable, 3);
    let syncs = rig.ops_seen.iter().filter(|k| k.name() == "sync").count();
    let rolls = rig.files().len() - 1;
    // Each roll syncs the sealed segment and the new one's header.
    assert_eq!(syncs, 2 * rolls);
    assert!(rig.log.synced_offset() < 3);
    assert_eq!(rig.log.poll_timeout(), None);
    rig.log.sync_now();
    rig.pump();
    assert_eq!(rig.log.synced_offset(), 3);
}

#[test]
fn segments_roll_at_the_size_limit_and_reads_cross_their_boundaries() {
    let mut rig = Rig::new(LogConfig {
        tail_cache_bytes: 0, // every read goes to the files
        ..cfg(FsyncMode::OnCommit, 256)
    });
    for i in 0..40 {
        rig.append(&[&payload(i)[..], &payload(i + 1)[..]]);
        if i % 4 == 3 {
            rig.pump();
        }
    }
    rig.pump();
    assert_eq!(rig.durable, 80);
    let files = rig.files();
    assert!(files.len() > 5, "{files:?}");
    for name in &files {
        let len = rig.fs.file(&format!("{DIR}/{name}")).unwrap().len();
        assert!(len <= 256, "{name} is {len} bytes");
    }
    // One read from offset 0 with a large budget returns everything, across every file.
    let page = rig.read(0, 10_000, 1 << 20);
    assert_eq!(page.record_count(), 80);
    assert_eq!(page.next_offset, 80);
    let got: Vec<Bytes> = page
        .batches
        .iter()
        .flat_map(|b| b.payloads.clone())
        .collect();
    assert_eq!(got, rig.appended);
    // A read starting mid-segment and mid-batch.
    let page = rig.read(33, 3, 1 << 20);
    assert_eq!(page.batches[0].first_offset, 33);
    assert_eq!(page.record_count(), 3);
    assert_eq!(page.next_offset, 36);
}

#[test]
fn the_rebuilt_index_is_the_one_built_while_appending() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 64 << 10));
    for i in 0..400 {
        rig.append(&[&payload(i)]);
    }
    rig.pump();
    let before: Vec<Vec<(u64, u64)>> = rig
        .log
        .segments
        .iter()
        .map(|s| s.index_points().to_vec())
        .collect();
    assert!(before.iter().map(Vec::len).sum::<usize>() > 4);
    let rig = rig.reopen(Crash::Process);
    let after: Vec<Vec<(u64, u64)>> = rig
        .log
        .segments
        .iter()
        .map(|s| s.index_points().to_vec())
        .collect();
    assert_eq!(before, after);
}

#[test]
fn a_record_bigger_than_the_budget_is_still_returned_alone() {
    let mut rig = Rig::new(LogConfig {
        tail_cache_bytes: 0,
        ..cfg(FsyncMode::OnCommit, 1 << 20)
    });
    let big = vec![5u8; 200_000];
    rig.append(&[&big, b"small"]);
    rig.pump();
    let page = rig.read(0, 100, 10);
    assert_eq!(page.record_count(), 1);
    assert_eq!(page.batches[0].payloads[0].len(), 200_000);
    assert_eq!(page.next_offset, 1);
    let page = rig.read(1, 100, 10);
    assert_eq!(page.batches[0].payloads, vec![Bytes::from_static(b"small")]);
}

#[test]
fn reads_stop_at_the_durable_offset() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.append(&[b"a"]);
    rig.pump();
    rig.append(&[b"b"]);
    assert!(rig.step(), "the write lands");
    // The sync for "b" is in flight: "b" is written and cached but not durable.
    let ticket = rig.log.read(0, 10, 1 << 20).unwrap();
    rig.collect();
    let page = rig.reads.remove(&ticket).unwrap().unwrap();
    assert_eq!(page.record_count(), 1);
    assert_eq!(page.next_offset, 1);
}

#[test]
fn a_torn_tail_is_cut_back_and_the_log_goes_on() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.append(&[b"kept"]);
    rig.pump();
    let path = Rig::seg_path(0);
    let mut bytes = rig.fs.file(&path).unwrap().to_vec();
    let good = bytes.len();
    let mut torn = BytesMut::new();
    record::encode_entry(&mut torn, 1, 0, b"", &[b"lost record"]);
    bytes.extend_from_slice(&torn[..torn.len() - 3]);
    rig.fs.put_file(&path, bytes);

    let mut rig = rig.reopen(Crash::Process);
    let (_, next, cut) = rig.opened.unwrap();
    assert_eq!((next, cut), (1, torn.len() as u64 - 3));
    assert_eq!(rig.fs.file(&path).unwrap().len(), good);
    rig.appended = vec![Bytes::from_static(b"kept")];
    rig.append(&[b"after"]);
    rig.pump();
    let mut rig = rig.reopen(Crash::Power);
    assert_eq!(rig.opened, Some((0, 2, 0)), "recovery is idempotent");
    assert_eq!(rig.read_all().len(), 2);
}

/// Appends one record sized so the newest segment file ends exactly at byte `end`.
fn fill_to(rig: &mut Rig, end: usize) {
    rig.pump();
    let name = rig.files().last().expect("a segment").clone();
    let path = format!("{DIR}/{name}");
    let len = rig.fs.file(&path).unwrap().len();
    let empty = record::entry_len(b"pub", &[[0u8; 0]]);
    rig.append(&[&vec![7u8; end - len - empty]]);
    rig.pump();
    assert_eq!(rig.fs.file(&path).unwrap().len(), end, "no roll-over");
}

/// A log whose first segment holds four records and ends at byte `end` exactly; with
/// `sealed`, a second segment holding one record follows. Every read goes to the files.
fn log_ending_at(end: usize, sealed: bool) -> Rig {
    // A segment to be sealed is full at `end`; the newest takes more.
    let max = if sealed { end } else { 2 * end };
    let mut rig = Rig::new(LogConfig {
        tail_cache_bytes: 0,
        ..cfg(FsyncMode::OnCommit, max as u64)
    });
    for i in 0..3 {
        rig.append(&[&payload(i)]);
    }
    fill_to(&mut rig, end);
    if sealed {
        rig.append(&[b"in the next segment"]);
        rig.pump();
        assert_eq!(rig.files().len(), 2);
    }
    rig
}

/// Adds `n` zero bytes at the end of a file; returns where they start.
fn add_zeros(fs: &mut MemFs, path: &str, n: usize) -> u64 {
    let mut b = fs.file(path).unwrap().to_vec();
    let at = b.len() as u64;
    b.resize(b.len() + n, 0);
    fs.put_file(path, b);
    at
}

/// Zero-fills a file up to the next multiple of [`WRITE_PADDING_BLOCK`], as a direct-I/O
/// write leaves it; returns where the padding starts.
fn pad_to_block(fs: &mut MemFs, path: &str) -> u64 {
    let len = fs.file(path).unwrap().len();
    let block = WRITE_PADDING_BLOCK as usize;
    assert!(!len.is_multiple_of(block), "nothing to pad");
    add_zeros(fs, path, len.next_multiple_of(block) - len)
}

fn truncates(rig: &Rig) -> Vec<(String, u64)> {
    rig.ops_seen
        .iter()
        .filter_map(|k| match k {
            FileOpKind::Truncate { path, len } => Some((path.clone(), *len)),
            _ => None,
        })
        .collect()
}

/// Where the entries end in the padding tests: 4095 zeros follow (one short of a block),
/// 8 (just a zero length field), 7 and 1 (less than a length field), and 1095.
const PADDED_ENDS: [usize; 5] = [4097, 4088, 4089, 4095, 3001];

#[test]
fn write_padding_ending_the_newest_segment_is_cut_without_calling_it_torn() {
    for end in PADDED_ENDS {
        let mut rig = log_ending_at(end, false);
        let path = Rig::seg_path(0);
        assert_eq!(pad_to_block(&mut rig.fs, &path), end as u64);
        let appended = rig.appended.clone();
        let n = appended.len() as u64;

        let mut rig = rig.reopen(Crash::Process);
        assert!(rig.failed.is_none(), "{end}: {:?}", rig.failed);
        assert_eq!(
            rig.opened,
            Some((0, n, 0)),
            "{end}: nothing counted as torn"
        );
        // The runtime takes the file's length for the logical end: the padding goes.
        assert_eq!(truncates(&rig), [(path.clone(), end as u64)], "{end}");
        assert_eq!(rig.fs.file(&path).unwrap().len(), end);
        let got: Vec<Bytes> = rig.read_all().into_iter().map(|(_, p)| p).collect();
        assert_eq!(got, appended, "{end}");

        // The next append lands right after the last entry, and survives a restart.
        rig.appended = appended;
        rig.append(&[b"after"]);
        rig.pump();
        let file = rig.fs.file(&path).unwrap();
        let Step::Entry(meta) = record::step(&file[end..]) else {
            panic!("{end}: no entry after the last one");
        };
        assert_eq!((meta.base, end + meta.len as usize), (n, file.len()));
        let mut rig = rig.reopen(Crash::Power);
        assert_eq!(rig.opened, Some((0, n + 1, 0)), "{end}");
        assert_eq!(
            rig.read_all().last().unwrap().1,
            Bytes::from_static(b"after")
        );
    }
}

#[test]
fn write_padding_ending_a_sealed_segment_is_skipped_and_left_on_disk() {
    for end in PADDED_ENDS {
        let mut rig = log_ending_at(end, true);
        let sealed = Rig::seg_path(0);
        let first = rig.log.segments[1].base;
        let newest = Rig::seg_path(first);
        assert_eq!(pad_to_block(&mut rig.fs, &sealed), end as u64);
        let newest_end = pad_to_block(&mut rig.fs, &newest);
        let appended = rig.appended.clone();
        let n = appended.len() as u64;

        let mut rig = rig.reopen(Crash::Process);
        assert!(rig.failed.is_none(), "{end}: {:?}", rig.failed);
        assert_eq!(rig.opened, Some((0, n, 0)), "{end}");
        // Only the newest segment is cut; the sealed one keeps its padding.
        assert_eq!(truncates(&rig), [(newest, newest_end)], "{end}");
        let block = WRITE_PADDING_BLOCK as usize;
        assert_eq!(
            rig.fs.file(&sealed).unwrap().len(),
            end.next_multiple_of(block)
        );
        // A read that ends at the sealed segment's end, one that runs across it, and all.
        let page = rig.read(0, first as usize, 1 << 20);
        assert_eq!(
            (page.record_count(), page.next_offset),
            (first as usize, first)
        );
        let page = rig.read(first - 1, 100, 1 << 20);
        assert_eq!((page.record_count(), page.next_offset), (2, n), "{end}");
        let got: Vec<Bytes> = rig.read_all().into_iter().map(|(_, p)| p).collect();
        assert_eq!(got, appended, "{end}");
        let rig = rig.reopen(Crash::Power);
        assert_eq!(rig.opened, Some((0, n, 0)), "{end}: again");
    }
}

#[test]
fn write_padding_is_checked_across_scan_reads() {
    // The last entry ends 16 bytes past the first read; the scan reads it again from its
    // start, so the next read starts inside the padding.
    let end = SCAN_READ_BYTES as usize + 16;
    for poisoned in [false, true] {
        let mut rig = log_ending_at(end, false);
        let path = Rig::seg_path(0);
        let at = pad_to_block(&mut rig.fs, &path);
        let mut b = rig.fs.file(&path).unwrap().to_vec();
        let len = b.len() as u64;
        if poisoned {
            *b.last_mut().unwrap() = 1;
            rig.fs.put_file(&path, b);
        }
        let n = rig.appended.len() as u64;

        let rig = rig.reopen(Crash::Process);
        let read_in_padding = rig
            .ops_seen
            .iter()
            .any(|k| matches!(k, FileOpKind::Read { pos, .. } if *pos > at + 8 && *pos < len));
        assert!(read_in_padding, "{:?}", rig.ops_seen);
        if poisoned {
            let e = rig.failed.expect("refused");
            assert!(
                matches!(&e, StorageError::Corrupt { path: p, pos, what }
                    if *p == path && *pos == at && what.contains("non-zero")),
                "{e}"
            );
        } else {
            assert!(rig.failed.is_none(), "{:?}", rig.failed);
            assert_eq!(rig.opened, Some((0, n, 0)));
            assert_eq!(rig.fs.file(&path).unwrap().len() as u64, at);
        }
    }
}

#[test]
fn a_zero_run_of_a_whole_block_is_not_padding() {
    for sealed in [true, false] {
        // One zero short of a block after the entries: padding.
        let mut rig = log_ending_at(4097, sealed);
        add_zeros(&mut rig.fs, &Rig::seg_path(0), 4095);
        let rig = rig.reopen(Crash::Process);
        assert!(rig.failed.is_none(), "sealed {sealed}: {:?}", rig.failed);
        assert_eq!(rig.opened.unwrap().2, 0);

        // A whole block of zeros after entries that end on a block boundary: a torn tail
        // in the newest segment, damage in a sealed one.
        let mut rig = log_ending_at(4096, sealed);
        let path = Rig::seg_path(0);
        add_zeros(&mut rig.fs, &path, 4096);
        let rig = rig.reopen(Crash::Process);
        if sealed {
            let e = rig.failed.expect("refused");
            assert!(
                matches!(&e, StorageError::Corrupt { path: p, pos: 4096, .. } if *p == path),
                "{e}"
            );
        } else {
            assert!(rig.failed.is_none(), "{:?}", rig.failed);
            assert_eq!(rig.opened.unwrap().2, 4096, "a torn tail");
            assert_eq!(rig.fs.file(&path).unwrap().len(), 4096);
        }
    }
}

#[test]
fn zeros_ending_a_sealed_segment_off_the_block_size_are_damage() {
    // (entries end at, zeros after them, whether the file then ends on a block boundary)
    for (end, zeros, padded) in [
        (3001, 1095, true),
        (3001, 1094, false),
        (3001, 1096, false),
        (4089, 7, true),
        (4089, 6, false),
        (4095, 1, true),
        (4095, 2, false),
    ] {
        let mut rig = log_ending_at(end, true);
        let path = Rig::seg_path(0);
        add_zeros(&mut rig.fs, &path, zeros);
        let rig = rig.reopen(Crash::Process);
        if padded {
            assert!(rig.failed.is_none(), "{end}+{zeros}: {:?}", rig.failed);
            continue;
        }
        let e = rig.failed.expect("refused");
        assert!(
            matches!(&e, StorageError::Corrupt { path: p, pos, .. }
                if *p == path && *pos == end as u64),
            "{end}+{zeros}: {e}"
        );
    }
}

#[test]
fn a_non_zero_byte_in_the_padding_refuses() {
    for sealed in [true, false] {
        // Clean padding opens; a non-zero byte in the length field, just after it, or at
        // the end of the file refuses.
        for at in [None, Some(3001), Some(3009), Some(4095)] {
            let mut rig = log_ending_at(3001, sealed);
            let path = Rig::seg_path(0);
            pad_to_block(&mut rig.fs, &path);
            let mut b = rig.fs.file(&path).unwrap().to_vec();
            let Some(at) = at else {
                let rig = rig.reopen(Crash::Process);
                assert!(rig.failed.is_none(), "sealed {sealed}: {:?}", rig.failed);
                continue;
            };
            b[at] = 1;
            rig.fs.put_file(&path, b);
            let rig = rig.reopen(Crash::Process);
            let e = rig.failed.expect("refused");
            assert!(
                matches!(&e, StorageError::Corrupt { path: p, pos: 3001, .. } if *p == path),
                "sealed {sealed}, byte {at}: {e}"
            );
        }
    }
    // Fewer zeros than a length field, one of them not zero: in a sealed segment an entry
    // cut short. (In the newest it is a torn tail, as before.)
    let mut rig = log_ending_at(4089, true);
    let path = Rig::seg_path(0);
    pad_to_block(&mut rig.fs, &path);
    let mut b = rig.fs.file(&path).unwrap().to_vec();
    b[4094] = 1;
    rig.fs.put_file(&path, b);
    let e = rig.reopen(Crash::Process).failed.expect("refused");
    assert!(matches!(e, StorageError::Corrupt { pos: 4089, .. }), "{e}");
}

#[test]
fn write_padding_ending_a_compaction_output_is_skipped() {
    let mut rig = Rig::new(LogConfig {
        tail_cache_bytes: 0,
        ..cfg(FsyncMode::OnCommit, 300)
    });
    for i in 0..30 {
        rig.append(&[&payload(i)]);
    }
    rig.pump();
    let keep: Vec<u64> = (0..30).filter(|o| o % 3 == 0).collect();
    assert!(rig.log.compact(keep.clone()));
    rig.pump();
    assert_eq!(rig.compacted, 1);
    let outputs: Vec<String> = rig
        .log
        .segments
        .iter()
        .filter(|s| s.compacted_end.is_some())
        .map(|s| s.path.clone())
        .collect();
    assert!(!outputs.is_empty());
    let cut = rig.log.segments[outputs.len()].base;
    for path in &outputs {
        pad_to_block(&mut rig.fs, path);
    }
    let padded: Vec<usize> = outputs
        .iter()
        .map(|p| rig.fs.file(p).unwrap().len())
        .collect();
    let n = rig.appended.len() as u64;
    let appended = rig.appended.clone();

    let mut rig = rig.reopen(Crash::Process);
    assert!(rig.failed.is_none(), "{:?}", rig.failed);
    assert_eq!(rig.opened.map(|o| o.1), Some(n));
    assert!(truncates(&rig).is_empty());
    let now: Vec<usize> = outputs
        .iter()
        .map(|p| rig.fs.file(p).unwrap().len())
        .collect();
    assert_eq!(now, padded, "the padding stays");
    // Each kept record reads back at its own offset (as a cache get reads it).
    for o in (0..n).filter(|o| *o >= cut || o % 3 == 0) {
        let page = rig.read(o, 1, 1 << 20);
        assert_eq!(page.batches[0].first_offset, o);
        assert_eq!(page.batches[0].payloads, [appended[o as usize].clone()]);
    }
}

fn corrupt_and_open(mutate: impl FnOnce(&mut MemFs)) -> StorageError {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 300));
    for i in 0..30 {
        rig.append(&[&payload(i)]);
    }
    rig.pump();
    assert!(rig.files().len() >= 4);
    let Rig { mut fs, cfg, .. } = rig;
    mutate(&mut fs);
    let rig = Rig::on(fs, cfg);
    assert!(!rig.log.is_open());
    rig.failed.expect("open refused")
}

#[test]
fn interior_corruption_refuses_to_open_naming_file_and_byte() {
    // A flipped byte inside the second entry of a sealed segment.
    let mut target = String::new();
    let mut at = 0;
    let e = corrupt_and_open(|fs| {
        let name = fs.list(DIR)[1].clone();
        target = format!("{DIR}/{name}");
        let mut b = fs.file(&target).unwrap().to_vec();
        let first = record::u32_at(&b, SEGMENT_HEADER_LEN as usize) as usize + 8;
        at = SEGMENT_HEADER_LEN as usize + first;
        b[at + 20] ^= 0x40;
        fs.put_file(&target, b);
    });
    match &e {
        StorageError::Corrupt { path, pos, what } => {
            assert_eq!(path, &target);
            assert_eq!(*pos, at as u64);
            assert!(what.contains("checksum"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    let shown = e.to_string();
    assert!(
        shown.contains(&target) && shown.contains(&format!("byte {at}")),
        "{shown}"
    );
}

#[test]
fn damage_in_the_middle_of_the_newest_segment_is_not_a_torn_tail() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    for i in 0..10 {
        rig.append(&[&payload(i)]);
    }
    rig.pump();
    let path = Rig::seg_path(0);
    let mut b = rig.fs.file(&path).unwrap().to_vec();
    b[SEGMENT_HEADER_LEN as usize + 12] ^= 1; // the first entry; nine follow
    rig.fs.put_file(&path, b);
    let rig = rig.reopen(Crash::Process);
    let e = rig.failed.expect("refused");
    assert!(matches!(e, StorageError::Corrupt { pos, .. } if pos == SEGMENT_HEADER_LEN));
}

#[test]
fn a_complete_last_entry_with_a_bad_checksum_is_refused_not_repaired() {
    // Under on_commit that record may have been acknowledged and then rotted.
    let e = corrupt_and_open(|fs| {
        let name = fs.list(DIR).last().unwrap().clone();
        let path = format!("{DIR}/{name}");
        let mut b = fs.file(&path).unwrap().to_vec();
        let n = b.len();
        b[n - 1] ^= 1;
        fs.put_file(&path, b);
    });
    assert!(matches!(e, StorageError::Corrupt { ref what, .. } if what.contains("checksum")));
}

#[test]
fn a_missing_segment_is_a_gap_and_refuses() {
    let e = corrupt_and_open(|fs| {
        let name = fs.list(DIR)[1].clone();
        fs.delete(&format!("{DIR}/{name}"));
    });
    assert!(
        matches!(e, StorageError::Corrupt { ref what, .. } if what.contains("missing")),
        "{e}"
    );
}

#[test]
fn a_damaged_header_refuses() {
    let e = corrupt_and_open(|fs| {
        let name = fs.list(DIR)[0].clone();
        let path = format!("{DIR}/{name}");
        let mut b = fs.file(&path).unwrap().to_vec();
        b[10] ^= 1;
        fs.put_file(&path, b);
    });
    assert!(matches!(e, StorageError::Corrupt { pos: 0, .. }), "{e}");
}

fn run_workload(rig: &mut Rig) {
    for i in 0..14 {
        if rig.fs.is_dead() || !rig.log.is_open() {
            break;
        }
        let (a, b) = (payload(i), payload(i + 3));
        rig.append(&[&a[..], &b[..]][..1 + i % 2]);
        if i % 3 == 2 {
            rig.pump();
        }
        if i == 9 {
            rig.log.handle_timeout(rig.t0 + Duration::from_secs(1), 0);
        }
    }
    rig.pump();
}

/// Runs the workload, crashing at write step `step` (tearing that append at `tear` bytes),
/// reopens after `crash`, and checks the oracle: the log opens, holds a gap-free prefix of
/// what was appended, and that prefix covers everything acknowledged. Returns whether the
/// crash happened.
fn crash_once(mode: FsyncMode, step: usize, tear: Option<usize>, crash: Crash) -> bool {
    let mut fs = MemFs::new();
    fs.crash_at_step(step, tear);
    let mut rig = Rig::on(fs, cfg(mode, 300));
    run_workload(&mut rig);
    let crashed = rig.fs.is_dead();
    recover_and_check(
        rig,
        mode,
        crash,
        format!("{mode:?} step {step} tear {tear:?} {crash:?}"),
    );
    crashed
}

/// Reboots the crashed rig after `crash` and checks the oracle: the log opens, holds a
/// gap-free prefix of what was appended, that prefix covers everything acknowledged, and
/// the repaired log takes appends and reopens unchanged.
fn recover_and_check(rig: Rig, mode: FsyncMode, crash: Crash, what: String) {
    // A process crash keeps every write, so everything acknowledged under any mode must
    // come back; power loss keeps what a completed sync covered (all of it under on_commit).
    let acked = match crash {
        Crash::Process => rig.durable,
        _ => rig.log.synced_offset(),
    };
    if mode == FsyncMode::OnCommit {
        assert_eq!(rig.durable, rig.log.synced_offset(), "{what}");
    }
    let appended = rig.appended.clone();

    let mut rig = rig.reopen(crash);
    assert!(rig.failed.is_none(), "{what}: {:?}", rig.failed);
    let (_, next, _) = rig.opened.unwrap_or_else(|| panic!("{what}: did not open"));
    assert!(
        next >= acked,
        "{what}: acknowledged {acked}, recovered {next}"
    );
    let got = rig.read_all();
    assert_eq!(got.len() as u64, next, "{what}");
    for (offset, p) in &got {
        assert_eq!(p, &appended[*offset as usize], "{what}: offset {offset}");
    }
    rig.appended = appended[..next as usize].to_vec();
    rig.append(&[b"after"]);
    rig.log.sync_now();
    rig.pump();
    let rig = rig.reopen(Crash::Power);
    assert_eq!(rig.opened.map(|o| o.1), Some(next + 1), "{what}");
}

/// The workload's write steps, with the byte length of each one that is an append.
fn workload_steps(mode: FsyncMode) -> Vec<Option<usize>> {
    let mut rig = Rig::new(cfg(mode, 300));
    run_workload(&mut rig);
    rig.ops_seen
        .iter()
        .filter(|k| k.is_write())
        .map(|k| match k {
            FileOpKind::Append { bytes, .. } => Some(bytes.len()),
            _ => None,
        })
        .collect()
}

/// Where to tear an append of `len` bytes: its edges, the entry header's edges, the
/// middle, and a spread in between.
fn tears(len: usize) -> Vec<Option<usize>> {
    let mut t: Vec<usize> = [
        0,
        1,
        7,
        8,
        9,
        31,
        32,
        33,
        len / 2,
        len.saturating_sub(2),
        len - 1,
    ]
    .into_iter()
    .chain((0..len).step_by(23))
    .filter(|&n| n < len)
    .collect();
    t.sort_unstable();
    t.dedup();
    t.into_iter().map(Some).chain([None]).collect()
}

#[test]
fn a_crash_at_every_write_step_loses_only_unacknowledged_records() {
    for mode in [
        FsyncMode::OnCommit,
        FsyncMode::Periodic(Duration::from_millis(250)),
        FsyncMode::None,
    ] {
        let steps = workload_steps(mode);
        let headers = steps.iter().filter(|s| **s == Some(32)).count();
        assert!(headers >= 5, "the workload crosses several roll-overs");
        let mut crashes = 0;
        for (step, append_len) in steps.iter().enumerate() {
            // Steps cover the open (before the first header), every header, every record
            // write (torn at many bytes), every sync, and every roll-over in between.
            let tear_at = match append_len {
                Some(len) => tears(*len),
                None => vec![None],
            };
            for tear in tear_at {
                // A process crash: the page cache survives, so every write counts.
                assert!(crash_once(mode, step, tear, Crash::Process));
                // Power loss keeps synced bytes only, a prefix of the rest, or the rest's
                // sectors zeroed.
                crash_once(mode, step, tear, Crash::Power);
                crash_once(mode, step, tear, Crash::PowerKeeping(tear.unwrap_or(7)));
                crash_once(mode, step, tear, Crash::PowerZeroed);
                crash_once(mode, step, tear, Crash::PowerReordered(step as u64 + 1));
                crashes += 1;
            }
        }
        assert!(crashes > 200, "{crashes}");
        assert!(
            !crash_once(mode, steps.len(), None, Crash::Power),
            "past the end"
        );
        assert!(
            !crash_once(mode, steps.len(), None, Crash::Process),
            "past the end"
        );
    }
}

/// The workload's write ops, in order.
fn workload_ops(mode: FsyncMode) -> Vec<FileOpKind> {
    let mut rig = Rig::new(cfg(mode, 300));
    run_workload(&mut rig);
    rig.ops_seen.into_iter().filter(|k| k.is_write()).collect()
}

fn is_header(k: &FileOpKind) -> bool {
    matches!(k, FileOpKind::Append { bytes, .. } if bytes.len() == SEGMENT_HEADER_LEN as usize)
}

/// Step of the second segment's creation (the first roll-over), and of its header.
fn first_roll(ops: &[FileOpKind]) -> (usize, usize) {
    let creates: Vec<usize> = (0..ops.len())
        .filter(|&i| matches!(ops[i], FileOpKind::Create { .. }))
        .collect();
    (creates[1], creates[1] + 1)
}

#[test]
fn a_crash_before_the_header_is_written_leaves_the_log_openable() {
    let ops = workload_ops(FsyncMode::OnCommit);
    let (_, header) = first_roll(&ops);
    assert!(is_header(&ops[header]));
    for tear in [Some(0), Some(5), Some(31), None] {
        for crash in [Crash::Process, Crash::Power, Crash::PowerZeroed] {
            assert!(crash_once(FsyncMode::OnCommit, header, tear, crash));
        }
    }
    // And the very first segment of a new log.
    let first_header = ops.iter().position(is_header).unwrap();
    assert!(crash_once(
        FsyncMode::OnCommit,
        first_header,
        Some(3),
        Crash::Process
    ));
}

#[test]
fn a_crash_mid_record_discards_only_the_torn_record() {
    let ops = workload_ops(FsyncMode::OnCommit);
    let i = ops
        .iter()
        .position(|k| matches!(k, FileOpKind::Append { bytes, .. } if bytes.len() > 64))
        .unwrap();
    let FileOpKind::Append { bytes, .. } = &ops[i] else {
        unreachable!()
    };
    for tear in [1, 8, 9, bytes.len() / 2, bytes.len() - 1] {
        assert!(crash_once(
            FsyncMode::OnCommit,
            i,
            Some(tear),
            Crash::Process
        ));
        assert!(crash_once(
            FsyncMode::OnCommit,
            i,
            Some(tear),
            Crash::PowerKeeping(tear)
        ));
    }
}

#[test]
fn a_crash_before_fsync_loses_only_what_was_not_acknowledged() {
    let ops = workload_ops(FsyncMode::OnCommit);
    let syncs: Vec<usize> = (1..ops.len())
        .filter(|&i| {
            matches!(ops[i], FileOpKind::Sync { .. })
                && matches!(ops[i - 1], FileOpKind::Append { .. })
                && !is_header(&ops[i - 1])
        })
        .collect();
    assert!(syncs.len() > 3);
    for &i in &syncs {
        assert!(crash_once(FsyncMode::OnCommit, i, None, Crash::Power));
        assert!(crash_once(FsyncMode::OnCommit, i, None, Crash::PowerZeroed));
    }
}

#[test]
fn a_crash_mid_roll_over_leaves_the_log_openable() {
    let ops = workload_ops(FsyncMode::OnCommit);
    let (create, _) = first_roll(&ops);
    // The seal before it, the create, header, file sync, directory sync, first records.
    assert!(matches!(ops[create - 1], FileOpKind::Sync { .. }));
    assert!(matches!(ops[create + 2], FileOpKind::Sync { .. }));
    assert!(matches!(ops[create + 3], FileOpKind::SyncDir { .. }));
    for step in create - 1..=create + 4 {
        for crash in [
            Crash::Process,
            Crash::Power,
            Crash::PowerReordered(step as u64),
        ] {
            assert!(crash_once(FsyncMode::OnCommit, step, None, crash));
        }
    }
}

/// What happens to an append (A) and a sync (S) outstanding together: the file system
/// executes each, and later its completion reaches the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    RunAppend,
    RunSync,
    AppendDone,
    SyncDone,
}

/// The six orders of the four events in which each op runs before its completion arrives.
fn overlap_orders() -> Vec<[Ev; 4]> {
    use Ev::*;
    let all = [RunAppend, RunSync, AppendDone, SyncDone];
    let mut out = Vec::new();
    // Every permutation of the four: index i picks from what is left.
    for n in 0..24usize {
        let (mut left, mut k, mut o) = (all.to_vec(), n, Vec::new());
        for radix in (1..=4).rev() {
            o.push(left.remove(k % radix));
            k /= radix;
        }
        let at = |e| o.iter().position(|&x| x == e).unwrap();
        if at(RunAppend) < at(AppendDone) && at(RunSync) < at(SyncDone) {
            out.push([o[0], o[1], o[2], o[3]]);
        }
    }
    out
}

/// Indices of a record append and a sync both waiting in the queue, if there are.
fn overlap(queue: &VecDeque<FileOp>) -> Option<(usize, usize)> {
    let a = queue
        .iter()
        .position(|o| matches!(o.kind, FileOpKind::Append { .. }) && !is_header(&o.kind))?;
    let s = queue
        .iter()
        .position(|o| matches!(o.kind, FileOpKind::Sync { .. }))?;
    Some((a, s))
}

/// Segments that hold several appends, so appends overlap syncs between roll-overs.
const OVERLAP_SEGMENT_BYTES: u64 = 800;

/// Appends of varied sizes across several roll-overs, arriving while ops are out (one or
/// two ops run, oldest first, per append), and a reason to sync now and then in every
/// mode. `at_overlap(rig, n)` is called for the n-th time an append and a sync are
/// outstanding together; it returns false once it crashed.
fn overlap_workload(rig: &mut Rig, mut at_overlap: impl FnMut(&mut Rig, usize) -> bool) {
    let mut n = 0;
    // Runs one op: whether there was one, or `None` once the crash happened.
    let mut step = |rig: &mut Rig| {
        rig.collect();
        if overlap(&rig.queue).is_some() {
            n += 1;
            if !at_overlap(rig, n - 1) {
                return None;
            }
        }
        Some(rig.step())
    };
    for i in 0..24 {
        let (a, b) = (payload(i), payload(i + 5));
        rig.append(&[&a[..], &b[..]][..1 + i % 2]);
        if i % 5 == 4 {
            rig.log.handle_timeout(rig.t0 + Duration::from_secs(1), 0);
        }
        if i % 6 == 5 {
            rig.log.sync_now();
        }
        for _ in 0..1 + i % 2 {
            if step(rig).is_none() {
                return;
            }
        }
    }
    for _ in 0..10_000 {
        if step(rig) != Some(true) {
            return;
        }
    }
    panic!("the log did not settle");
}

/// At the `window`-th overlap, plays `order` up to `crash_point` events (tearing the append
/// at `tear` bytes if the crash lands on running it), with a publisher appending between
/// events, then reboots after `crash` and checks that only unacknowledged records are lost.
fn overlap_crash(
    mode: FsyncMode,
    window: usize,
    order: [Ev; 4],
    crash_point: usize,
    tear: Option<usize>,
    crash: Crash,
) {
    let mut rig = Rig::new(cfg(mode, OVERLAP_SEGMENT_BYTES));
    let mut crashed = false;
    overlap_workload(&mut rig, |rig, n| {
        if n != window {
            return true;
        }
        let (a, s) = overlap(&rig.queue).expect("an overlap");
        let (append, sync) = (rig.queue[a].clone(), rig.queue[s].clone());
        rig.queue.retain(|o| o.id != append.id && o.id != sync.id);
        let (mut append_done, mut sync_done) = (None, None);
        for (k, ev) in order.into_iter().enumerate() {
            if k == crash_point {
                if let (Ev::RunAppend, Some(t)) = (ev, tear) {
                    rig.fs.crash_at_step(rig.fs.writes, Some(t));
                    assert!(rig.fs.execute(append.clone()).is_none());
                }
                break;
            }
            match ev {
                Ev::RunAppend => append_done = rig.fs.execute(append.clone()),
                Ev::RunSync => sync_done = rig.fs.execute(sync.clone()),
                Ev::AppendDone => rig.log.handle_completion(append_done.take().unwrap()),
                Ev::SyncDone => rig.log.handle_completion(sync_done.take().unwrap()),
            }
            rig.collect();
            rig.append(&[&payload(100 + k)]);
        }
        crashed = true;
        false
    });
    assert!(crashed, "window {window} exists");
    let what = format!(
        "{mode:?} overlap {window} {order:?} crash after {crash_point} tear {tear:?} {crash:?}"
    );
    recover_and_check(rig, mode, crash, what);
}

#[test]
fn a_crash_with_an_append_and_a_sync_both_outstanding_loses_only_unacknowledged_records() {
    let orders = overlap_orders();
    assert_eq!(orders.len(), 6);
    for mode in [
        FsyncMode::OnCommit,
        FsyncMode::Periodic(Duration::from_millis(250)),
        FsyncMode::None,
    ] {
        let mut windows = 0;
        let mut rig = Rig::new(cfg(mode, OVERLAP_SEGMENT_BYTES));
        overlap_workload(&mut rig, |_, _| {
            windows += 1;
            true
        });
        let files = rig.files().len();
        assert!(files >= 3, "{mode:?}: the workload crosses roll-overs");
        assert!(windows >= 4, "{mode:?}: {windows} overlaps");
        let mut runs = 0;
        for window in 0..windows {
            for order in &orders {
                for crash_point in 0..=4 {
                    for crash in [
                        Crash::Process,
                        Crash::Power,
                        Crash::PowerKeeping(5),
                        Crash::PowerZeroed,
                    ] {
                        overlap_crash(mode, window, *order, crash_point, None, crash);
                        runs += 1;
                    }
                    if order.get(crash_point) == Some(&Ev::RunAppend) {
                        for tear in [0, 1, 9, 40] {
                            for crash in [Crash::Process, Crash::PowerKeeping(tear + 3)] {
                                overlap_crash(mode, window, *order, crash_point, Some(tear), crash);
                                runs += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(runs >= 4 * 6 * 5 * 4, "{mode:?}: {runs}");
    }
}

#[test]
fn oversized_batches_and_too_many_reads_are_refused_at_their_limits() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    let fits = MAX_ENTRY_BYTES - record::entry_len(b"", &[[0u8; 0]]);
    let big = [Bytes::from(vec![1u8; fits + 1])];
    let b = Batch {
        time_us: 0,
        publisher: None,
        payloads: &big,
    };
    assert_eq!(
        rig.log.append(rig.t0, b),
        Err(AppendError::TooLarge(MAX_ENTRY_BYTES + 1))
    );
    rig.append(&[b"x"]);
    rig.pump();
    rig.log.tail.clear(); // force file reads, which stay in flight below
    rig.log.tail_bytes = 0;
    for _ in 0..MAX_READS_IN_FLIGHT {
        rig.log.read(0, 1, 1).unwrap();
    }
    assert_eq!(rig.log.read(0, 1, 1), Err(ReadError::Busy));
    rig.pump();
    assert_eq!(rig.reads.len(), MAX_READS_IN_FLIGHT);
    assert!(rig.log.read(0, 1, 1).is_ok(), "room again once they land");
}

#[test]
fn subdirectories_in_a_shard_directory_are_not_segments() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.append(&[b"a"]);
    rig.pump();
    let Rig { mut fs, cfg, .. } = rig;
    let op = FileOp {
        id: OpId(0),
        kind: FileOpKind::CreateDir {
            path: format!("{DIR}/{}", layout::segment_name(5)),
        },
    };
    fs.execute(op).unwrap();
    let rig = Rig::on(fs, cfg);
    assert_eq!(rig.opened, Some((0, 1, 0)));
}

#[test]
fn a_write_failure_stops_the_log_and_nothing_past_durable_is_acknowledged() {
    let mut rig = Rig::new(cfg(FsyncMode::OnCommit, 1 << 20));
    rig.append(&[b"ok"]);
    rig.pump();
    rig.fs
        .inject(|k| matches!(k, FileOpKind::Sync { .. }).then_some(FileErrorKind::Other));
    rig.append(&[b"never durable"]);
    rig.pump();
    assert_eq!(rig.durable, 1);
    assert!(matches!(
        rig.failed,
        Some(StorageError::Io { op: "sync", .. })
    ));
    let err = rig
        .log
        .append(
            rig.t0,
            Batch {
                time_us: 0,
                publisher: None,
                payloads: &[Bytes::from_static(b"x")],
            },
        )
        .unwrap_err();
    assert!(matches!(err, AppendError::Failed(_)));
    // Reads still serve what is durable.
    assert_eq!(rig.read(0, 10, 100).record_count(), 1);
}

#[test]
fn appends_are_refused_before_open_and_past_the_pending_limit() {
    let t0 = Instant::now();
    let mut log = ShardLog::open(LogId(1), DIR.into(), LogConfig::default(), t0);
    let p = [Bytes::from_static(b"x")];
    let b = Batch {
        time_us: 0,
        publisher: None,
        payloads: &p,
    };
    assert_eq!(log.append(t0, b), Err(AppendError::NotOpen));
    let mut rig = Rig::new(LogConfig {
        max_pending_bytes: 100,
        ..cfg(FsyncMode::OnCommit, 1 << 20)
    });
    let big = [Bytes::from(vec![0u8; 70])];
    let b = Batch {
        time_us: 0,
        publisher: None,
        payloads: &big,
    };
    assert!(rig.log.append(rig.t0, b).is_ok(), "one batch always fits");
    assert_eq!(rig.log.append(rig.t0, b), Err(AppendError::Backpressure));
    rig.pump();
    assert!(rig.log.append(rig.t0, b).is_ok(), "room again once written");
    let long = [0u8; 256];
    let b = Batch {
        publisher: Some(&long),
        ..b
    };
    assert_eq!(
        rig.log.append(rig.t0, b),
        Err(AppendError::PublisherTooLong)
    );
    let b = Batch {
        payloads: &[],
        publisher: None,
        time_us: 0,
    };
    assert_eq!(rig.log.append(rig.t0, b), Err(AppendError::Empty));
}

#[test]
fn retention_by_bytes_removes_whole_segments_from_the_head_only() {
    let mut rig = Rig::new(LogConfig {
        retention_bytes: Some(1000),
        tail_cache_bytes: 0,
        ..cfg(FsyncMode::OnCommit, 300)
    });
    for i in 0..60 {
        rig.append(&[&payload(i)]);
    }
    rig.pump();
    let before = rig.files();
    let total_before = rig.log.total_bytes();
    assert!(total_before > 2000);
    assert_eq!(rig.log.housekeeping_queued(), 0);
    rig.log.enforce_retention(0);
    // The start moved at once; the files go one by one, each removal made durable first:
    // until the queue empties, they are still on disk.
    assert!(rig.log.housekeeping_queued() > 0);
    assert_eq!(rig.files(), before);
    rig.pump();
    assert_eq!(rig.log.housekeeping_queued(), 0);
    let after = rig.files();
    assert!(after.len() < before.len());
    assert_eq!(
        &before[before.len() - after.len()..],
        &after[..],
        "a suffix survives"
    );
    assert!(rig.log.total_bytes() <= 1000 + 300);
    let start = rig.log.start_offset();
    assert_eq!(rig.trimmed, Some(start));
    assert_eq!(
        after[0],
        layout::segment_name(start),
        "the start is a segment base"
    );
    assert_eq!(
        rig.log.read(0, 1, 1),
        Err(ReadError::Trimmed {
            requested: 0,
            oldest: start
        })
    );
    let got = rig.read_all();
    assert_eq!(got.first().unwrap().0, start);
    assert_eq!(got.len() as u64, 60 - start);
    // A crash after the sweep keeps a gap-free log.
    let rig = rig.reopen(Crash::Power);
    assert_eq!(rig.opened, Some((start, 60, 0)));
}

#[test]
fn a_crash_anywhere_in_a_retention_sweep_leaves_a_longer_log_never_a_gap() {
    let build = || {
        let mut rig = Rig::new(LogConfig {
            retention_bytes: Some(600),
            ..cfg(FsyncMode::OnCommit, 300)
        });
        for i in 0..40 {
            rig.append(&[&payload(i)]);
        }
        rig.pump();
        rig
    };
    let mut rig = build();
    let base = rig.fs.writes;
    rig.log.enforce_retention(0);
    rig.pump();
    let steps = rig.fs.writes - base;
    let final_start = rig.log.start_offset();
    assert!(
        steps >= 6,
        "several segments go, each unlink then a directory sync"
    );
    for k in 0..steps {
        for crash in [
            Crash::Power,
            Crash::PowerReordered(k as u64 + 1),
            Crash::PowerReordered(k as u64 + 77),
        ] {
            let mut rig = build();
            rig.fs.crash_at_step(base + k, None);
            rig.log.enforce_retention(0);
            rig.pump();
            let what = format!("retention step {k} {crash:?}");
            let mut rig = rig.reopen(crash);
            assert!(rig.failed.is_none(), "{what}: {:?}", rig.failed);
            let (start, next, _) = rig.opened.unwrap();
            assert!(start <= final_start && next == 40, "{what}");
            let got = rig.read_all();
            assert_eq!(got.len() as u64, 40 - start, "{what}");
        }
    }
}

#[test]
fn retention_by_age_uses_record_times_and_keeps_the_active_segment() {
    let mut rig = Rig::new(LogConfig {
        retention_age: Some(Duration::from_micros(100)),
        ..cfg(FsyncMode::OnCommit, 300)
    });
    for i in 0..30 {
        rig.append(&[&payload(i)]);
    }
    rig.pump();
    let n = rig.files().len();
    // Record times are 1000..1030 µs. At 1110 µs, records older than 1010 have expired.
    rig.log
        .handle_timeout(rig.t0 + Duration::from_secs(61), 1_110);
    rig.pump();
    let start = rig.log.start_offset();
    assert!(start > 0 && rig.files().len() < n);
    for s in &rig.log.segments[..rig.log.segments.len() - 1] {
        assert!(
            s.newest_time_us + 100 >= 1_110,
            "an expired segment survived"
        );
    }
    // Far in the future everything sealed goes, the active segment stays.
    rig.log.enforce_retention(u64::MAX);
    rig.pump();
    assert_eq!(rig.files().len(), 1);
    let start = rig.log.start_offset();
    let got = rig.read_all();
    assert_eq!(got.first().map(|r| r.0), Some(start));
    assert_eq!(got.last().map(|r| r.0), Some(29));
}

#[test]
fn the_runtime_may_complete_ops_in_any_order() {
    for seed in 1..40u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut rig = Rig::new(LogConfig {
            tail_cache_bytes: 200,
            ..cfg(FsyncMode::OnCommit, 400)
        });
        let mut tickets = Vec::new();
        for i in 0..50 {
            rig.append(&[&payload(i)]);
            if i % 5 == 4 {
                tickets.push((
                    rig.log.durable_offset(),
                    rig.log.read(0, 1000, 1 << 20).unwrap(),
                ));
                rig.pump_shuffled(&mut rng);
            }
        }
        rig.pump_shuffled(&mut rng);
        assert_eq!(rig.durable, 50, "seed {seed}");
        for (limit, t) in tickets {
            let page = rig.reads.remove(&t).unwrap().unwrap();
            assert!(page.record_count() as u64 >= limit, "seed {seed}");
        }
        let rig = rig.reopen(Crash::Power);
        assert_eq!(rig.opened.map(|o| o.1), Some(50), "seed {seed}");
    }
}

/// A log of 30 equal records (one per entry, stamped 1000..1030 µs) in segments of a known
/// width, for the cut decision's exact tests.
fn even_log(extra: LogConfig) -> Rig {
    let mut rig = Rig::new(extra);
    for _ in 0..30 {
        rig.append(&[&[7u8; 40]]);
    }
    rig.pump();
    rig
}

fn bases(rig: &Rig) -> Vec<u64> {
    rig.log.segments.iter().map(|s| s.base).collect()
}

#[test]
fn the_cut_by_age_is_decided_exactly_under_a_virtual_clock() {
    let rig = even_log(LogConfig {
        retention_age: Some(Duration::from_micros(100)),
        ..cfg(FsyncMode::OnCommit, 300)
    });
    // Segments of 3 records: [0,3) [3,6) ... [27,30), the newest stamped 1002, 1005, ...
    assert_eq!(bases(&rig), vec![0, 3, 6, 9, 12, 15, 18, 21, 24, 27]);
    // A segment goes once its newest record is older than 100 µs: strictly.
    assert_eq!(rig.log.retention_cut(1_102), None);
    assert_eq!(rig.log.retention_cut(1_103), Some(3));
    assert_eq!(rig.log.retention_cut(1_105), Some(3));
    assert_eq!(rig.log.retention_cut(1_106), Some(6));
    assert_eq!(rig.log.retention_cut(1_123), Some(21));
    // Never the active segment, however old.
    assert_eq!(rig.log.retention_cut(u64::MAX), Some(27));
    // The clock stepping back decides nothing.
    assert_eq!(rig.log.retention_cut(0), None);
}

#[test]
fn the_cut_by_size_keeps_the_newest_segments_within_the_bound_and_respects_the_floor() {
    let mut rig = even_log(LogConfig {
        retention_bytes: Some(1_000),
        ..cfg(FsyncMode::OnCommit, 300)
    });
    // Ten segments of 269 bytes: the newest three (807 bytes) fit under 1000.
    assert!(rig.log.segments.iter().all(|s| s.len == 269));
    assert_eq!(rig.log.retention_cut(0), Some(21));
    // The floor (commit state rebuilt from the log) holds the cut below it.
    rig.log.set_retention_floor(Some(10));
    assert_eq!(rig.log.retention_cut(0), Some(9));
    rig.log.set_retention_floor(None);
    // The bounds change at runtime: a stream's own retention replaces the broker's.
    rig.log.set_retention(Some(u64::MAX), None);
    assert_eq!(rig.log.retention_cut(u64::MAX), None);
    rig.log
        .set_retention(None, Some(Duration::from_micros(100)));
    assert_eq!(rig.log.retention_cut(1_103), Some(3));
    rig.log.set_retention(None, None);
    assert_eq!(rig.log.retention_cut(u64::MAX), None);
}

#[test]
fn the_leader_cuts_where_it_decided_and_a_follower_only_where_it_is_told() {
    let retention = LogConfig {
        retention_age: Some(Duration::from_micros(100)),
        ..cfg(FsyncMode::OnCommit, 300)
    };
    let mut leader = even_log(retention.clone());
    leader.log.enforce_retention(1_109);
    leader.pump();
    assert_eq!(leader.log.start_offset(), 9);
    assert_eq!(leader.trimmed, Some(9));
    assert_eq!(leader.files()[0], layout::segment_name(9));

    // A follower whose segments end elsewhere (wider ones): it decides nothing itself.
    let mut follower = even_log(LogConfig {
        segment_max_bytes: 500,
        ..retention
    });
    assert_eq!(bases(&follower), vec![0, 5, 10, 15, 20, 25]);
    follower.log.take_only_shipped(true);
    follower.log.enforce_retention(u64::MAX);
    follower.pump();
    assert_eq!(
        follower.log.start_offset(),
        0,
        "a follower never cuts on its own"
    );
    assert_eq!(follower.trimmed, None);
    // The leader's start, 9, is inside the follower's [5, 10): the follower starts at 9
    // exactly, removes [0, 5) and keeps the straddling segment for now.
    follower.log.trim_to(9);
    follower.pump();
    assert_eq!(follower.log.start_offset(), 9);
    assert_eq!(follower.trimmed, Some(9));
    assert_eq!(follower.files()[0], layout::segment_name(5));
    assert_eq!(
        follower.log.read(5, 1, 1 << 20),
        Err(ReadError::Trimmed {
            requested: 5,
            oldest: 9
        })
    );
    let got = follower.read_all();
    assert_eq!(got.first().map(|r| r.0), Some(9));
    assert_eq!(got.len(), 21);
    // An older cut, or one past its end, changes nothing.
    follower.trimmed = None;
    follower.log.trim_to(5);
    follower.log.trim_to(31);
    follower.pump();
    assert_eq!((follower.log.start_offset(), follower.trimmed), (9, None));
    // The leader's next cut passes the straddler: it goes too.
    follower.log.trim_to(16);
    follower.pump();
    assert_eq!(follower.log.start_offset(), 16);
    assert_eq!(follower.files()[0], layout::segment_name(15));
    // A cut on a segment boundary leaves no straddler; the timer cuts nothing more.
    follower.log.trim_to(20);
    follower.log.enforce_retention(u64::MAX);
    follower.pump();
    assert_eq!(follower.log.start_offset(), 20);
    assert_eq!(follower.files()[0], layout::segment_name(20));
}

#[test]
fn the_start_a_follower_was_told_is_kept_across_a_restart() {
    let mut follower = even_log(LogConfig {
        retention_age: Some(Duration::from_micros(100)),
        ..cfg(FsyncMode::OnCommit, 500)
    });
    assert_eq!(bases(&follower), vec![0, 5, 10, 15, 20, 25]);
    follower.log.take_only_shipped(true);
    follower.log.trim_to(9);
    let state = crate::replica_state::ReplicaState {
        log_start: 9,
        ..Default::default()
    };
    follower.log.persist_replica_state(state).unwrap();
    follower.pump();
    assert_eq!(follower.states.last().map(|s| s.log_start), Some(9));
    // A crash: the straddling segment [5, 10) is still on disk, yet the copy starts at 9.
    let mut follower = follower.reopen(Crash::Power);
    assert_eq!(follower.opened, Some((9, 30, 0)));
    assert_eq!(follower.files()[0], layout::segment_name(5));
    assert_eq!(
        follower.log.read(8, 1, 1 << 20),
        Err(ReadError::Trimmed {
            requested: 8,
            oldest: 9
        })
    );
    assert_eq!(follower.read_all().first().map(|r| r.0), Some(9));
}
