//! Retention: dropping whole sealed segments from the head once a size or age bound is
//! exceeded.
//!
//! Its own file because it shares nothing with compaction beyond standing aside while a
//! pass runs: it rewrites nothing, it only queues unlinks on the write lane.
//!
//! The decision ([`ShardLog::retention_cut`]) and the cut ([`ShardLog::trim_to`]) are
//! apart so that a replicated shard's copies are cut at the same offset: the copy that
//! leads decides, from its own segments, and its followers are cut where it says
//! (`felix-engine`'s `cluster/replicas.rs` ships the leader's log start). A copy that takes
//! only shipped entries (a follower) never decides a cut of its own. Its segments need not
//! end where the leader's do, so it keeps a segment that straddles the cut until a later cut
//! leaves it wholly below; reads below the cut are refused `Trimmed` all the same, so every
//! copy answers from the same first offset.

use std::time::Duration;

use super::{LogEvent, ShardLog, Task};
use crate::segment::Stage;

impl ShardLog {
    /// Keeps every segment holding an offset at or above `floor` through retention (`None`:
    /// retention alone decides).
    pub fn set_retention_floor(&mut self, floor: Option<u64>) {
        self.retention_floor = floor;
    }

    /// Changes this log's retention bounds (a stream's own, or the broker-wide ones it
    /// falls back to); the next check applies them.
    pub fn set_retention(&mut self, max_bytes: Option<u64>, max_age: Option<Duration>) {
        self.cfg.retention_bytes = max_bytes;
        self.cfg.retention_age = max_age;
    }

    /// Where retention would start this log now, `unix_micros` being the wall clock: the
    /// base of the oldest sealed segment it keeps, when that is past the current start.
    /// `None` when nothing is due. A pure reading of the segments: every copy of a shard
    /// that applies the cut its leader decided ends up starting at the same offset.
    /// Never past the active segment, a segment being read, or the retention floor.
    pub fn retention_cut(&self, unix_micros: u64) -> Option<u64> {
        if !self.is_open() || self.compaction.is_some() || self.poison.is_some() {
            return None;
        }
        let mut total = self.total_bytes();
        let age_us = self
            .cfg
            .retention_age
            .map(|a| u64::try_from(a.as_micros()).unwrap_or(u64::MAX));
        let mut cut = None;
        for pair in self.segments.windows(2) {
            let (s0, s1) = (&pair[0], &pair[1]);
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
            cut = Some(s1.base);
        }
        cut.filter(|&c| c > self.start_offset())
    }

    /// Runs on the retention timer; callable directly. A log that decides its own cuts
    /// (not a follower's copy) moves its start to [`ShardLog::retention_cut`]; every log
    /// also removes segments left wholly below a cut it was given.
    pub fn enforce_retention(&mut self, unix_micros: u64) {
        let cut = if self.only_shipped {
            None
        } else {
            self.retention_cut(unix_micros)
        };
        self.trim_to(cut.unwrap_or(0));
    }

    /// Starts the log at `offset` (a cut its leader decided, or its own): reads below are
    /// refused `Trimmed` from now on, and every segment wholly below is removed, oldest
    /// first, each unlink made durable before the next (a crash can only leave a longer
    /// log, never one with a hole in it). A segment that also holds records at or above
    /// `offset`, the active segment, and one being read stay until a later call. An offset
    /// at or below the start, or past the end, changes nothing (a copy behind its leader's
    /// start is rebuilt, not cut). [`LogEvent::Trimmed`] says when the start moved.
    pub fn trim_to(&mut self, offset: u64) {
        if !self.is_open()
            || self.compaction.is_some()
            || self.truncation.is_some()
            || self.restarting.is_some()
            || self.poison.is_some()
        {
            return;
        }
        let before = self.start_offset();
        if offset > before && offset <= self.next_offset {
            self.trimmed_below = offset;
        }
        let below = self.trimmed_below;
        while self.segments.len() >= 2 {
            let (s0, s1) = (&self.segments[0], &self.segments[1]);
            if s1.stage != Stage::Ready || s0.reads_in_flight > 0 || s1.base > below {
                break;
            }
            let s0 = self.segments.remove(0);
            self.tasks.push_back(Task::Remove(s0.path));
            self.tasks.push_back(Task::SyncDir);
        }
        let start = self.start_offset();
        if start != before {
            self.evict_tail_below(start);
            self.events.push_back(LogEvent::Trimmed {
                start_offset: start,
            });
        }
        self.drive();
    }
}
