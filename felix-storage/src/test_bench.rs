//! Test support shared by the cache and counter log tests: a wrapper log run against a
//! [`MemFs`], one file op at a time, so a test sees every step and can crash between any
//! two.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use super::driven::Driven;
use super::log::{FramedBatch, FsyncMode, LogConfig, LogEvent, ReplicaEvent, ShardLog};
use super::memfs::{Crash, MemFs};
use super::ops::{FileOp, FileOpKind, LogId};

/// Synced on commit, so a write is durable once acknowledged; small segments make
/// compaction reachable.
pub(crate) fn cfg(segment_max_bytes: u64) -> LogConfig {
    LogConfig {
        fsync: FsyncMode::OnCommit,
        segment_max_bytes,
        ..LogConfig::default()
    }
}

/// The files under a log, the config it was opened with, and the file ops it asked for
/// that have not run yet. The log itself stays with the test's rig, typed as it is.
pub(crate) struct Bench {
    pub(crate) fs: MemFs,
    pub(crate) cfg: LogConfig,
    /// When the log was opened: the `now` the tests pass.
    pub(crate) t0: Instant,
    queue: VecDeque<FileOp>,
    /// Every op the log asked for, in order.
    pub(crate) ops_seen: Vec<FileOpKind>,
}

impl Bench {
    /// Opens a log over `fs` with `open`, now.
    pub(crate) fn open<L>(
        fs: MemFs,
        cfg: LogConfig,
        open: impl FnOnce(LogConfig, Instant) -> L,
    ) -> (Bench, L) {
        let t0 = Instant::now();
        let log = open(cfg.clone(), t0);
        let bench = Bench {
            fs,
            cfg,
            t0,
            queue: VecDeque::new(),
            ops_seen: Vec::new(),
        };
        (bench, log)
    }

    /// Queues every op `log` asks for.
    pub(crate) fn take_ops(&mut self, log: &mut impl Driven) {
        while let Some(op) = log.poll_op() {
            self.ops_seen.push(op.kind.clone());
            self.queue.push_back(op);
        }
    }

    /// Runs the oldest queued op and hands its completion to `log`; false if none was
    /// queued.
    pub(crate) fn run_one(&mut self, log: &mut impl Driven) -> bool {
        let Some(op) = self.queue.pop_front() else {
            return false;
        };
        if let Some(c) = self.fs.execute(op) {
            log.handle_completion(c);
        }
        true
    }

    /// What a restart after `crash` finds, to open the log on again.
    pub(crate) fn crashed(self, crash: Crash) -> (MemFs, LogConfig) {
        let Bench { mut fs, cfg, .. } = self;
        fs.crash(crash);
        (fs, cfg)
    }
}

/// Calls `step` until it has nothing left to do; a log that never settles is a bug, not a
/// slow test.
pub(crate) fn settle(what: &str, mut step: impl FnMut() -> bool) {
    for _ in 0..100_000 {
        if !step() {
            return;
        }
    }
    panic!("{what} did not settle");
}

/// A leader's files opened as a plain log, to read framed entries from (the cache, counter
/// and group logs do not hand out their log's replication events).
pub(crate) struct Shipper {
    bench: Bench,
    log: ShardLog,
}

impl Shipper {
    pub(crate) fn on(fs: MemFs, cfg: LogConfig, dir: &str) -> Shipper {
        let (bench, log) = Bench::open(fs, cfg, |cfg, t0| {
            ShardLog::open(LogId(40), dir.into(), cfg, t0)
        });
        let mut s = Shipper { bench, log };
        s.framed_or_none(None);
        assert!(s.log.is_open());
        s
    }

    pub(crate) fn next_offset(&self) -> u64 {
        self.log.next_offset()
    }

    /// Runs the log until it settles; the answer to `ticket`, if one came.
    fn framed_or_none(&mut self, ticket: Option<crate::log::ReadTicket>) -> Option<FramedBatch> {
        let mut answer = None;
        settle("the shipper", || {
            self.bench.take_ops(&mut self.log);
            while let Some(ev) = self.log.poll_event() {
                match ev {
                    LogEvent::Replica(ReplicaEvent::Framed { ticket: t, result }) => {
                        assert_eq!(Some(t), ticket);
                        answer = Some(result.expect("framed read ok"));
                    }
                    LogEvent::Failed(e) => panic!("the shipper failed: {e}"),
                    _ => {}
                }
            }
            self.bench.run_one(&mut self.log)
        });
        answer
    }

    /// One framed read from `from`.
    pub(crate) fn framed(&mut self, from: u64, max_bytes: usize) -> FramedBatch {
        let ticket = self.log.read_framed(from, max_bytes).expect("read_framed");
        self.framed_or_none(Some(ticket)).expect("answered")
    }
}

/// Ships everything on `shipper` to `follower`, `max_bytes` at a time, as a replicating
/// leader would: a framed read from the follower's next offset (`next`), handed to
/// `append`, which returns the follower's new next offset. Returns how many reads began
/// inside a gap (the batch started past the offset asked for).
pub(crate) fn ship<F>(
    shipper: &mut Shipper,
    follower: &mut F,
    max_bytes: usize,
    next: impl Fn(&F) -> u64,
    mut append: impl FnMut(&mut F, u64, Bytes) -> u64,
) -> usize {
    let mut in_gaps = 0;
    for _ in 0..100_000 {
        let from = next(follower);
        let b = shipper.framed(from, max_bytes);
        if b.entries.is_empty() {
            assert_eq!((b.base, b.end, b.record_count), (from, from, 0));
            return in_gaps;
        }
        assert!(b.base >= from && b.end > b.base, "{b:?} from {from}");
        assert!(u64::from(b.record_count) <= b.end - b.base);
        in_gaps += usize::from(b.base > from);
        assert_eq!(append(follower, b.base, b.entries), b.end);
    }
    panic!("shipping did not finish");
}
