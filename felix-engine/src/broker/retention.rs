//! A stream's own retention: its `max_bytes` and `max_age_seconds` (from the cluster's
//! metadata, or a single node's `[[streams]]` declaration) replace the broker-wide bounds on
//! every log of its shards; a bound the stream does not set stays the broker-wide one.
//!
//! Which copy cuts is not decided here: a follower's copy never cuts on its own, and starts
//! where its leader's log starts (felix-storage `log/retention.rs`, `cluster/replicas.rs`).

use std::time::Duration;

use felix_storage::ops::LogId;

use super::{Broker, StreamKey};

/// A stream's own bounds; `None` falls back to the broker-wide one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StreamRetention {
    pub(crate) max_bytes: Option<u64>,
    pub(crate) max_age: Option<Duration>,
}

/// Sums over a node's stream logs ([`Engine::log_positions`](crate::Engine::log_positions)):
/// a fingerprint for whoever waits for logs to move, not a measure of anything.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogPositions {
    /// First offsets held.
    pub start: u64,
    /// Next offsets to append.
    pub next: u64,
    /// Durable offsets.
    pub durable: u64,
    /// Segments held (a trimmed one leaves this count when its removal is queued).
    pub segments: u64,
    /// Removals and directory syncs queued, not yet issued: a trimmed segment's file is on
    /// disk until its removal is issued and done, after which this count moves again.
    pub housekeeping: u64,
}

impl Broker {
    /// Sets `key`'s own retention, applied at once to every open shard log of it and to
    /// those opened later.
    pub(crate) fn set_stream_retention(&mut self, key: &StreamKey, r: StreamRetention) {
        if self.retention.get(key) == Some(&r) {
            return;
        }
        self.retention.insert(key.clone(), r);
        if let Some(&index) = self.stream_index.get(key) {
            self.apply_stream_retention(index, key);
        }
    }

    /// The bounds every shard log of stream `index` runs with now.
    pub(super) fn apply_stream_retention(&mut self, index: usize, key: &StreamKey) {
        let own = self.retention.get(key).copied().unwrap_or_default();
        let Some(logs) = self.logs.as_mut() else {
            return;
        };
        let (bytes, age) = logs.default_retention;
        let (bytes, age) = (own.max_bytes.or(bytes), own.max_age.or(age));
        let ids: Vec<LogId> = self.streams[index]
            .shards
            .iter()
            .filter_map(|s| s.store.as_ref().map(|st| st.log))
            .collect();
        for id in ids {
            if let Some(log) = logs.slot_mut(id).and_then(|s| s.log.stream_mut()) {
                log.set_retention(bytes, age);
            }
            logs.mark_dirty(id);
        }
    }

    /// A follower's copy starts where its leader's log starts (`log_start`).
    pub(crate) fn trim_log(&mut self, log: LogId, start: u64) {
        let Some(logs) = self.logs.as_mut() else {
            return;
        };
        logs.mark_dirty(log);
        if let Some(l) = logs.slot_mut(log).and_then(|s| s.log.stream_mut()) {
            l.trim_to(start);
        }
    }

    /// Where every held log stands, each field summed (wrapping) over the logs: it moves
    /// when retention cuts a log, a follower's copy is trimmed to its leader's start, records
    /// are appended or made durable, a segment is born, or a segment's file is removed. Walks
    /// every shard: for a waiter, not per turn.
    pub(crate) fn log_positions(&self) -> LogPositions {
        let Some(logs) = self.logs.as_ref() else {
            return LogPositions::default();
        };
        self.streams
            .iter()
            .flat_map(|s| s.shards.iter())
            .filter_map(|s| logs.slot(s.store.as_ref()?.log))
            .map(|slot| slot.log.shard())
            .fold(LogPositions::default(), |p, log| LogPositions {
                start: p.start.wrapping_add(log.start_offset()),
                next: p.next.wrapping_add(log.next_offset()),
                durable: p.durable.wrapping_add(log.durable_offset()),
                segments: p.segments.wrapping_add(log.segment_count() as u64),
                housekeeping: p
                    .housekeeping
                    .wrapping_add(log.housekeeping_queued() as u64),
            })
    }

    /// Where this node's copy of each shard of `key` starts and ends (`None`: not held
    /// here), for the admin API's view.
    pub(crate) fn log_bounds(&self, key: &StreamKey) -> Vec<Option<(u64, u64)>> {
        let (Some(&index), Some(logs)) = (self.stream_index.get(key), self.logs.as_ref()) else {
            return Vec::new();
        };
        self.streams[index]
            .shards
            .iter()
            .map(|s| {
                let log = logs.slot(s.store.as_ref()?.log)?.log.shard();
                Some((log.start_offset(), log.next_offset()))
            })
            .collect()
    }
}
