//! Retention: dropping whole sealed segments from the head once a size or age bound is
//! exceeded.
//!
//! Its own file because it shares nothing with compaction beyond standing aside while a
//! pass runs: it rewrites nothing, it only queues unlinks on the write lane.

use super::{LogEvent, ShardLog, Task};
use crate::segment::Stage;

impl ShardLog {
    /// Keeps every segment holding an offset at or above `floor` through retention (`None`:
    /// retention alone decides).
    pub fn set_retention_floor(&mut self, floor: Option<u64>) {
        self.retention_floor = floor;
    }

    /// Removes whole sealed segments from the head while a retention bound is exceeded.
    /// Runs on the retention timer; callable directly. Never touches the active segment, a
    /// segment being read, or anything while a compaction runs.
    pub fn enforce_retention(&mut self, unix_micros: u64) {
        if !self.is_open()
            || self.compaction.is_some()
            || self.truncation.is_some()
            || self.poison.is_some()
        {
            return;
        }
        let mut total = self.total_bytes();
        let age_us = self
            .cfg
            .retention_age
            .map(|a| u64::try_from(a.as_micros()).unwrap_or(u64::MAX));
        let mut removed = false;
        while self.segments.len() >= 2 {
            let (s0, s1) = (&self.segments[0], &self.segments[1]);
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
            let s0 = self.segments.remove(0);
            // Oldest first, each unlink made durable before the next: a crash can only
            // leave a longer log, never one with a hole in it.
            self.tasks.push_back(Task::Remove(s0.path));
            self.tasks.push_back(Task::SyncDir);
            removed = true;
        }
        if removed {
            let start = self.start_offset();
            self.evict_tail_below(start);
            self.events.push_back(LogEvent::Trimmed {
                start_offset: start,
            });
        }
        self.drive();
    }
}
