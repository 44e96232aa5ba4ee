//! Conditional cache writes: `cache_put_if` / `cache_delete_if` against a key's version,
//! and the version a get reports.
//!
//! On a durable cache a version is the log offset of the put that wrote the value: unique
//! in the cache, only growing, kept by compaction. The check counts writes accepted but not
//! yet durable (they become durable in order or not at all), and the check and the write
//! happen in one engine step, so two racing writers cannot both meet one condition. The
//! answer waits for durability like a plain write's, applied or not: a refusal waits for
//! every write accepted before it, so the version it reports is durable.
//!
//! In memory a version is a counter that starts each run at the wall-clock microseconds
//! (`CacheStore::start_versions_at`), as protocol.md says, so a version read before a
//! restart never matches a value written after it.

use std::time::Instant;

use bytes::Bytes;

use super::cache::{DurableKind, DurableWrite};
use super::{append_error, Broker, BrokerError, CacheKey};
use felix_storage::ops::LogId;

/// What a conditional write requires of the key's live entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Condition {
    Absent,
    Version(u64),
}

impl Condition {
    fn holds(self, current: Option<u64>) -> bool {
        match self {
            Condition::Absent => current.is_none(),
            Condition::Version(v) => current == Some(v),
        }
    }
}

/// A conditional write's outcome; on a durable cache its answer waits until `durable_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conditional {
    pub(crate) applied: bool,
    /// The version written, or the key's current one (`None`: no live entry).
    pub(crate) version: Option<u64>,
    pub(crate) durable_at: Option<(LogId, u64)>,
}

impl Broker {
    /// In-memory versions start here (the engine's start in Unix microseconds).
    pub(crate) fn start_cache_versions_at(&mut self, unix_micros: u64) {
        self.cache.start_versions_at(unix_micros);
    }

    /// The version of the key's live, visible entry: what a get at this moment reads.
    pub(crate) fn cache_version(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &CacheKey,
        k: &str,
    ) -> Option<u64> {
        if self.logs.is_none() {
            return self.cache.version_of(now, key, k);
        }
        let log = self.cache_log(now, key, false).ok().flatten()?;
        let cache = self.cache_of(log).ok()?;
        cache.durable_version(k.as_bytes(), unix_micros / 1000)
    }

    /// Stores the value only if the key's live entry meets `condition`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cache_put_if(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &CacheKey,
        k: &str,
        value: Bytes,
        ttl_ms: Option<u64>,
        condition: Condition,
    ) -> Result<Conditional, BrokerError> {
        if self.logs.is_none() {
            let current = self.cache.version_of(now, key, k);
            if !condition.holds(current) {
                return Ok(refused(current, None));
            }
            let version = self.cache.put(now, key, k, value, ttl_ms)?;
            return Ok(applied(Some(version), None));
        }
        self.cache_sizes(k, &value)?;
        let write = DurableWrite::Put {
            key: k,
            value_len: value.len(),
        };
        let log = self.durable_log_for(now, key, DurableKind::Cache, write)?;
        let cache = self.cache_of(log)?;
        let current = cache.current_version(k.as_bytes(), unix_micros / 1000);
        if !condition.holds(current) {
            let tail = cache.log().next_offset();
            return Ok(refused(current, Some((log, tail))));
        }
        let (_, end) = self.log_cache_put(now, unix_micros, key, k, value, ttl_ms)?;
        Ok(applied(Some(end - 1), Some((log, end))))
    }

    /// Removes the key only if its live entry has `version`.
    pub(crate) fn cache_delete_if(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &CacheKey,
        k: &str,
        version: u64,
    ) -> Result<Conditional, BrokerError> {
        let condition = Condition::Version(version);
        if self.logs.is_none() {
            let current = self.cache.version_of(now, key, k);
            if !condition.holds(current) {
                return Ok(refused(current, None));
            }
            self.cache.delete(now, key, k);
            return Ok(applied(None, None));
        }
        // A cache never written holds no version.
        let Some(log) = self.cache_log(now, key, false)? else {
            return Ok(refused(None, None));
        };
        let cache = self.cache_of(log)?;
        let current = cache.current_version(k.as_bytes(), unix_micros / 1000);
        if !condition.holds(current) {
            let tail = cache.log().next_offset();
            return Ok(refused(current, Some((log, tail))));
        }
        let offset = cache
            .delete(now, unix_micros, k.as_bytes())
            .map_err(append_error)?
            .expect("a live entry to delete");
        self.stats.cache_deletes += 1;
        Ok(applied(None, Some((log, offset + 1))))
    }
}

fn applied(version: Option<u64>, durable_at: Option<(LogId, u64)>) -> Conditional {
    Conditional {
        applied: true,
        version,
        durable_at,
    }
}

fn refused(current: Option<u64>, durable_at: Option<(LogId, u64)>) -> Conditional {
    Conditional {
        applied: false,
        version: current,
        durable_at,
    }
}
