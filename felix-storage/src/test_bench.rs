//! Test support shared by the cache and counter log tests: a wrapper log run against a
//! [`MemFs`], one file op at a time, so a test sees every step and can crash between any
//! two.

use std::collections::VecDeque;
use std::time::Instant;

use super::driven::Driven;
use super::log::{FsyncMode, LogConfig};
use super::memfs::{Crash, MemFs};
use super::ops::{FileOp, FileOpKind};

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
