//! TTL expiry as a change on durable caches: once a second, while some cache holds keys
//! with a TTL, each cache log this node writes (not a follower's copy) writes a delete for (at most [`CACHE_EXPIRY_MAX_PER_PASS`])
//! keys whose expiry has passed. Watchers receive it as a delete, and compaction drops it.
//! Gets already read an expired key as absent; the delete only makes the expiry visible
//! in the log. Under a mass expiry the deletes lag the TTLs by as many passes as it takes.

use std::time::{Duration, Instant};

use super::Broker;
use felix_storage::ops::LogId;

/// Pause between expiry passes.
pub(crate) const CACHE_EXPIRY_INTERVAL: Duration = Duration::from_secs(1);
/// Deletes one pass writes per cache at most.
pub(crate) const CACHE_EXPIRY_MAX_PER_PASS: usize = 1024;

impl Broker {
    /// A key with a TTL exists (or may, after a restart): a pass is due within the interval.
    pub(super) fn arm_cache_expiry(&mut self, now: Instant) {
        if self.cache_expiry.is_none() {
            self.cache_expiry = Some(now + CACHE_EXPIRY_INTERVAL);
        }
    }

    /// Writes the deletes that are due, then re-arms while any cache still has keys with a
    /// TTL.
    pub(super) fn run_cache_expiry(&mut self, now: Instant, unix_micros: u64) {
        if self.cache_expiry.is_none_or(|at| at > now) {
            return;
        }
        self.cache_expiry = None;
        let Some(logs) = self.logs.as_mut() else {
            return;
        };
        let ids: Vec<LogId> = logs.live_ids().collect();
        let mut armed = false;
        for id in ids {
            let Some(slot) = logs.slot_mut(id) else {
                continue;
            };
            // A follower's copy: its leader writes the deletes and ships them.
            if slot.log.shard().only_shipped() {
                continue;
            }
            let Some(cache) = slot.log.cache_mut() else {
                continue;
            };
            if cache.expiring() == 0 {
                continue;
            }
            armed = true;
            match cache.expire_due(now, unix_micros, CACHE_EXPIRY_MAX_PER_PASS) {
                Ok(0) => {}
                Ok(n) => {
                    tracing::trace!(log = id.0, n, "expired cache keys deleted");
                    logs.mark_dirty(id);
                }
                // Backpressure or a failed log: the next pass tries again (or never will).
                Err(e) => tracing::debug!(log = id.0, error = ?e, "cache expiry pass skipped"),
            }
        }
        if armed {
            self.cache_expiry = Some(now + CACHE_EXPIRY_INTERVAL);
        }
    }
}
