//! The in-memory cache: (tenant, namespace, cache) → key → value with an absolute expiry.
//!
//! TTL is checked lazily on every access; a bounded sweep ([`CacheStore::sweep`]) walks an
//! expiry index in time order so values nobody reads again do not hold memory forever.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_proto::ErrorCode;

use super::{Broker, BrokerError, CacheKey};
use felix_storage::cache_log::put_entry_bytes;
use felix_storage::counter_log::add_entry_bytes;
use felix_storage::layout;
use felix_storage::ops::LogId;
use felix_storage::table::{AnyLog, Owner};

/// At most this many expired entries are removed per sweep, so one timer turn stays short.
pub(crate) const CACHE_SWEEP_MAX_ENTRIES: usize = 1024;
/// Pause between sweeps that found less than a full batch; lazy expiry covers the gap.
pub(crate) const CACHE_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheLimits {
    pub(crate) max_key_bytes: usize,
    pub(crate) max_value_bytes: usize,
    pub(crate) max_total_bytes: usize,
}

/// Counters the broker folds into its stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CacheCounters {
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) puts: u64,
    pub(crate) deletes: u64,
    /// Entries removed because their TTL passed (on access or by the sweep).
    pub(crate) expired: u64,
}

struct Entry {
    value: Bytes,
    /// What a conditional write compares: unique per put within this run.
    version: u64,
    /// Key into the expiry index, when the entry has a TTL.
    expiry: Option<(Instant, u64)>,
}

struct Scope {
    key: CacheKey,
    entries: HashMap<String, Entry>,
}

type ScopeId = u64;

pub(crate) struct CacheStore {
    limits: CacheLimits,
    scope_ids: HashMap<CacheKey, ScopeId>,
    scopes: HashMap<ScopeId, Scope>,
    /// The scopes held, in order: a cache's shards side by side, for [`remove_scope`].
    ///
    /// [`remove_scope`]: CacheStore::remove_scope
    held: BTreeSet<CacheKey>,
    next_scope_id: ScopeId,
    /// Entries with a TTL in expiry order; the `u64` breaks ties between equal instants.
    expiry_index: BTreeMap<(Instant, u64), (ScopeId, String)>,
    next_expiry_seq: u64,
    /// Key plus value bytes of every stored entry, expired-but-unswept ones included.
    total_bytes: usize,
    entries: usize,
    /// No sweep before this instant (pacing); `None` until the first sweep.
    sweep_not_before: Option<Instant>,
    pub(crate) counters: CacheCounters,
    /// The version the next put gets. Starts at the run's wall-clock microseconds
    /// ([`CacheStore::start_versions_at`]), so a version read before a restart does not
    /// match a value written after it.
    next_version: u64,
}

fn cost(key: &str, value: &Bytes) -> usize {
    key.len() + value.len()
}

impl CacheStore {
    pub(crate) fn new(limits: CacheLimits) -> CacheStore {
        CacheStore {
            limits,
            scope_ids: HashMap::new(),
            scopes: HashMap::new(),
            held: BTreeSet::new(),
            next_scope_id: 0,
            expiry_index: BTreeMap::new(),
            next_expiry_seq: 0,
            total_bytes: 0,
            entries: 0,
            sweep_not_before: None,
            counters: CacheCounters::default(),
            next_version: 1,
        }
    }

    /// Versions from here on (the engine passes its start time in Unix microseconds).
    pub(crate) fn start_versions_at(&mut self, base: u64) {
        self.next_version = self.next_version.max(base);
    }

    /// The version of the key's live entry.
    pub(crate) fn version_of(&mut self, now: Instant, scope: &CacheKey, key: &str) -> Option<u64> {
        self.live_entry(now, scope, key).map(|e| e.version)
    }

    pub(crate) fn total_bytes(&self) -> usize {
        self.total_bytes
    }

    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    pub(crate) fn put(
        &mut self,
        now: Instant,
        scope: &CacheKey,
        key: &str,
        value: Bytes,
        ttl_ms: Option<u64>,
    ) -> Result<u64, BrokerError> {
        if key.len() > self.limits.max_key_bytes {
            return Err(BrokerError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "cache key of {} bytes exceeds cache_max_key_bytes ({})",
                    key.len(),
                    self.limits.max_key_bytes
                ),
            ));
        }
        if value.len() > self.limits.max_value_bytes {
            return Err(BrokerError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "cache value of {} bytes exceeds cache_max_value_bytes ({})",
                    value.len(),
                    self.limits.max_value_bytes
                ),
            ));
        }
        let replaced = self.existing_cost(scope, key);
        let new_cost = cost(key, &value);
        if self.total_bytes - replaced + new_cost > self.limits.max_total_bytes {
            // Expired values may be what fills the budget: reclaim some before refusing.
            self.sweep(now, CACHE_SWEEP_MAX_ENTRIES);
            let replaced = self.existing_cost(scope, key);
            if self.total_bytes - replaced + new_cost > self.limits.max_total_bytes {
                return Err(BrokerError::new(
                    ErrorCode::Overloaded,
                    format!(
                        "cache memory is full (cache_max_total_bytes {})",
                        self.limits.max_total_bytes
                    ),
                ));
            }
        }

        // An overflowing expiry is as good as none.
        let expires_at = ttl_ms.and_then(|ms| now.checked_add(Duration::from_millis(ms)));
        let id = self.scope_id_or_insert(scope);
        let expiry = expires_at.map(|at| {
            let seq = self.next_expiry_seq;
            self.next_expiry_seq += 1;
            self.expiry_index.insert((at, seq), (id, key.to_owned()));
            (at, seq)
        });
        let entries = &mut self
            .scopes
            .get_mut(&id)
            .expect("scope just ensured")
            .entries;
        let version = self.next_version;
        self.next_version += 1;
        match entries.insert(
            key.to_owned(),
            Entry {
                value,
                version,
                expiry,
            },
        ) {
            Some(old) => {
                self.total_bytes -= cost(key, &old.value);
                if let Some(at) = old.expiry {
                    self.expiry_index.remove(&at);
                }
            }
            None => self.entries += 1,
        }
        self.total_bytes += new_cost;
        self.counters.puts += 1;
        Ok(version)
    }

    pub(crate) fn get(&mut self, now: Instant, scope: &CacheKey, key: &str) -> Option<Bytes> {
        let found = self.live_entry(now, scope, key).map(|e| e.value.clone());
        match found {
            Some(_) => self.counters.hits += 1,
            None => self.counters.misses += 1,
        }
        found
    }

    /// Removes the key; returns the value it held, or `None` if it held none (or had expired).
    pub(crate) fn delete(&mut self, now: Instant, scope: &CacheKey, key: &str) -> Option<Bytes> {
        self.counters.deletes += 1;
        let id = *self.scope_ids.get(scope)?;
        let entry = self.remove(id, key)?;
        if entry.expiry.is_some_and(|(at, _)| at <= now) {
            self.counters.expired += 1;
            return None;
        }
        Some(entry.value)
    }

    /// Removes up to `max` entries whose expiry is at or before `now`; returns how many.
    pub(crate) fn sweep(&mut self, now: Instant, max: usize) -> usize {
        let mut removed = 0;
        while removed < max {
            let Some((&(at, seq), _)) = self.expiry_index.first_key_value() else {
                break;
            };
            if at > now {
                break;
            }
            let (id, key) = self
                .expiry_index
                .remove(&(at, seq))
                .expect("first key exists");
            let entry = self.remove(id, &key);
            debug_assert!(entry.is_some(), "expiry index names a missing entry");
            self.counters.expired += 1;
            removed += 1;
        }
        // A full batch may have left more behind: allow the next sweep at once.
        self.sweep_not_before = Some(if removed == max {
            now
        } else {
            now + CACHE_SWEEP_INTERVAL
        });
        removed
    }

    /// When the next sweep has work: the earliest expiry, but not before the pacing allows.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let (&(earliest, _), _) = self.expiry_index.first_key_value()?;
        Some(match self.sweep_not_before {
            Some(not_before) => earliest.max(not_before),
            None => earliest,
        })
    }

    /// The entry if present and unexpired; an expired one is removed on the way.
    fn live_entry(&mut self, now: Instant, scope: &CacheKey, key: &str) -> Option<&Entry> {
        let id = *self.scope_ids.get(scope)?;
        let expired = {
            let entry = self.scopes.get(&id)?.entries.get(key)?;
            entry.expiry.is_some_and(|(at, _)| at <= now)
        };
        if expired {
            self.remove(id, key);
            self.counters.expired += 1;
            return None;
        }
        self.scopes.get(&id)?.entries.get(key)
    }

    fn existing_cost(&self, scope: &CacheKey, key: &str) -> usize {
        self.scope_ids
            .get(scope)
            .and_then(|id| self.scopes.get(id))
            .and_then(|s| s.entries.get(key))
            .map_or(0, |e| cost(key, &e.value))
    }

    fn scope_id_or_insert(&mut self, scope: &CacheKey) -> ScopeId {
        if let Some(&id) = self.scope_ids.get(scope) {
            return id;
        }
        let id = self.next_scope_id;
        self.next_scope_id += 1;
        self.scope_ids.insert(scope.clone(), id);
        self.held.insert(scope.clone());
        self.scopes.insert(
            id,
            Scope {
                key: scope.clone(),
                entries: HashMap::new(),
            },
        );
        id
    }

    /// Removes every entry of a cache, on every shard (it was deleted); false when it held
    /// none. `scope`'s shard is not read.
    pub(crate) fn remove_scope(&mut self, scope: &CacheKey) -> bool {
        let (t, n, c) = (&scope.tenant, &scope.namespace, &scope.cache);
        let first = CacheKey::on_shard(t, n, c, 0);
        let last = CacheKey::on_shard(t, n, c, u32::MAX);
        let shards: Vec<CacheKey> = self.held.range(first..=last).cloned().collect();
        for shard in &shards {
            let Some(&id) = self.scope_ids.get(shard) else {
                continue;
            };
            let keys: Vec<String> = self.scopes[&id].entries.keys().cloned().collect();
            for k in keys {
                self.remove(id, &k);
            }
        }
        !shards.is_empty()
    }

    /// Removes an entry with its index row and byte count; drops the scope when it empties.
    fn remove(&mut self, id: ScopeId, key: &str) -> Option<Entry> {
        let scope = self.scopes.get_mut(&id)?;
        let entry = scope.entries.remove(key)?;
        if scope.entries.is_empty() {
            let scope = self.scopes.remove(&id).expect("present");
            self.scope_ids.remove(&scope.key);
            self.held.remove(&scope.key);
        }
        if let Some(at) = entry.expiry {
            self.expiry_index.remove(&at);
        }
        self.total_bytes -= cost(key, &entry.value);
        self.entries -= 1;
        Some(entry)
    }
}

// ---- durable caches and counters: what they hold, against their limits ------------------

/// The two kinds of log a durable cache's limits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DurableKind {
    Cache,
    Counter,
}

/// What a write asks of the durable limits.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DurableWrite<'a> {
    /// A cache put of this key and value size.
    Put { key: &'a str, value_len: usize },
    /// A counter add to this key.
    Add { key: &'a str },
    /// A watch: it may create the cache's log, and writes nothing.
    Watch,
}

#[derive(Debug, Clone, Copy)]
struct LogUsage {
    keys: u64,
    bytes: u64,
}

/// Keys and live bytes of every durable cache and counter log, as last seen per log, and
/// how many logs of each kind there are. A log is refreshed from itself whenever it reports
/// an event (applied writes, expiry, compaction all do) and just before each write to it,
/// so the one being written is exact and the others are at most one event old.
#[derive(Default)]
pub(crate) struct DurableUsage {
    logs: HashMap<LogId, (DurableKind, LogUsage)>,
    keys: u64,
    bytes: u64,
    caches: usize,
    counters: usize,
}

impl DurableUsage {
    fn note(&mut self, log: LogId, kind: DurableKind, now: LogUsage) {
        match self.logs.insert(log, (kind, now)) {
            Some((_, old)) => {
                self.keys -= old.keys;
                self.bytes -= old.bytes;
            }
            None => match kind {
                DurableKind::Cache => self.caches += 1,
                DurableKind::Counter => self.counters += 1,
            },
        }
        self.keys += now.keys;
        self.bytes += now.bytes;
    }

    /// A deleted cache's log is counted no more.
    pub(super) fn forget(&mut self, log: LogId) {
        if let Some((kind, old)) = self.logs.remove(&log) {
            self.keys -= old.keys;
            self.bytes -= old.bytes;
            match kind {
                DurableKind::Cache => self.caches -= 1,
                DurableKind::Counter => self.counters -= 1,
            }
        }
    }

    fn count(&self, kind: DurableKind) -> usize {
        match kind {
            DurableKind::Cache => self.caches,
            DurableKind::Counter => self.counters,
        }
    }
}

fn limit_exceeded(message: String) -> BrokerError {
    BrokerError::new(ErrorCode::LimitExceeded, message)
}

impl Broker {
    /// Refreshes what `log` holds from the log itself; logs of other kinds are ignored.
    pub(super) fn note_durable_usage(&mut self, log: LogId) {
        let Some(slot) = self.logs.as_ref().and_then(|l| l.slot(log)) else {
            return;
        };
        let (kind, usage) = match &slot.log {
            AnyLog::Cache(c) => (
                DurableKind::Cache,
                LogUsage {
                    keys: c.len() as u64,
                    bytes: c.live_bytes(),
                },
            ),
            AnyLog::Counter(c) => (
                DurableKind::Counter,
                LogUsage {
                    keys: c.len() as u64,
                    bytes: c.live_bytes(),
                },
            ),
            AnyLog::Stream(_) | AnyLog::Group(_) => return,
        };
        self.durable_usage.note(log, kind, usage);
    }

    /// A replicated cache's values (or, with `counters`, its counters) log, claimed (it
    /// opens in the background) if this node never used it: replication keeps the copy, so
    /// the durable limits, which bound what clients create, do not refuse it.
    pub(crate) fn replica_cache_log(
        &mut self,
        now: Instant,
        key: &CacheKey,
        counters: bool,
    ) -> Option<LogId> {
        let (dir, owner, kind) = if counters {
            let dir = layout::counter_shard_dir(&key.tenant, &key.namespace, &key.cache, key.shard);
            (dir, Owner::Counter, DurableKind::Counter)
        } else {
            let dir = layout::cache_shard_dir(&key.tenant, &key.namespace, &key.cache, key.shard);
            (dir, Owner::Cache, DurableKind::Cache)
        };
        let logs = self.logs.as_mut()?;
        if let Some(id) = logs.find(&dir) {
            return Some(id);
        }
        if logs
            .retiring_blocks(&super::delete::parent_dir(&dir))
            .is_some()
        {
            // Deleted a moment ago: asked again once the old files are out of the way.
            return None;
        }
        let id = logs.claim(dir, owner, now);
        self.durable_usage
            .note(id, kind, LogUsage { keys: 0, bytes: 0 });
        Some(id)
    }

    /// The log a durable-cache write goes to, opened (created if new) once the write is
    /// within `durable_cache_max_logs` / `counter_max_logs`, `durable_cache_max_keys` and
    /// `durable_cache_max_total_bytes`. A write that creates no key and grows nothing always
    /// fits; a log still opening stalls the request as [`Broker::cache_log`] does.
    pub(crate) fn durable_log_for(
        &mut self,
        now: Instant,
        key: &CacheKey,
        kind: DurableKind,
        write: DurableWrite<'_>,
    ) -> Result<LogId, BrokerError> {
        let dir = match kind {
            DurableKind::Cache => {
                layout::cache_shard_dir(&key.tenant, &key.namespace, &key.cache, key.shard)
            }
            DurableKind::Counter => {
                layout::counter_shard_dir(&key.tenant, &key.namespace, &key.cache, key.shard)
            }
        };
        let existing = self.logs.as_ref().and_then(|l| l.find(&dir));
        if existing.is_none() {
            let (max, name, what) = match kind {
                DurableKind::Cache => (
                    self.cfg.durable_cache_max_logs,
                    "durable_cache_max_logs",
                    "durable caches",
                ),
                DurableKind::Counter => (
                    self.cfg.counter_max_logs,
                    "counter_max_logs",
                    "counter logs",
                ),
            };
            let have = self.durable_usage.count(kind);
            if have >= max {
                return Err(limit_exceeded(format!(
                    "the broker holds {have} {what}: one more exceeds {name} ({max})"
                )));
            }
        }
        let opened = match kind {
            DurableKind::Cache => self.cache_log(now, key, true),
            DurableKind::Counter => self.counter_log(now, key, true),
        };
        if existing.is_none() {
            // Counted from its claim on, so logs still opening count against the limit.
            if let Some(id) = self.logs.as_ref().and_then(|l| l.find(&dir)) {
                self.durable_usage
                    .note(id, kind, LogUsage { keys: 0, bytes: 0 });
            }
        }
        let log = opened?.expect("created");
        self.note_durable_usage(log);
        let slot = self.logs.as_ref().and_then(|l| l.slot(log)).expect("open");
        // (bytes the key holds now, bytes it would hold), `None` for a key not held.
        let (held, after) = match (write, &slot.log) {
            (DurableWrite::Watch, _) => return Ok(log),
            (DurableWrite::Put { key, value_len }, AnyLog::Cache(c)) => (
                c.entry_bytes(key.as_bytes()),
                put_entry_bytes(key.len(), value_len),
            ),
            (DurableWrite::Add { key }, AnyLog::Counter(c)) => match c.get(key.as_bytes()) {
                // An add to an existing counter rewrites a record of the same size.
                Some(_) => return Ok(log),
                None => (None, add_entry_bytes(key.len())),
            },
            _ => return Err(BrokerError::storage("not the log this write needs")),
        };
        let usage = &self.durable_usage;
        if held.is_none() {
            let max = self.cfg.durable_cache_max_keys;
            if usage.keys >= max {
                return Err(limit_exceeded(format!(
                    "durable caches and counters hold {} keys: a new one exceeds \
                     durable_cache_max_keys ({max})",
                    usage.keys
                )));
            }
        }
        let max = self.cfg.durable_cache_max_total_bytes;
        let total = usage.bytes - held.unwrap_or(0).min(usage.bytes) + after;
        if total > usage.bytes && total > max {
            return Err(limit_exceeded(format!(
                "durable caches and counters would hold {total} bytes, past \
                 durable_cache_max_total_bytes ({max})"
            )));
        }
        Ok(log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(cache: &str) -> CacheKey {
        CacheKey::new("t1", "default", cache)
    }

    fn store(max_key: usize, max_value: usize, max_total: usize) -> CacheStore {
        CacheStore::new(CacheLimits {
            max_key_bytes: max_key,
            max_value_bytes: max_value,
            max_total_bytes: max_total,
        })
    }

    #[test]
    fn ttl_expires_exactly_at_now_plus_ttl() {
        let t0 = Instant::now();
        let mut c = store(64, 64, 1024);
        c.put(t0, &scope("c"), "k", Bytes::from_static(b"v"), Some(1500))
            .unwrap();
        let edge = t0 + Duration::from_millis(1500);
        let just_before = edge - Duration::from_nanos(1);
        assert_eq!(
            c.get(just_before, &scope("c"), "k").as_deref(),
            Some(&b"v"[..])
        );
        assert_eq!(c.get(edge, &scope("c"), "k"), None);
        assert_eq!(c.entries(), 0, "lazy expiry removed it");
        assert_eq!(c.total_bytes(), 0);
        assert_eq!(c.counters.expired, 1);
        assert_eq!((c.counters.hits, c.counters.misses), (1, 1));
    }

    #[test]
    fn no_ttl_never_expires_and_overwrite_clears_the_ttl() {
        let t0 = Instant::now();
        let mut c = store(64, 64, 1024);
        c.put(t0, &scope("c"), "k", Bytes::from_static(b"1"), Some(10))
            .unwrap();
        c.put(t0, &scope("c"), "k", Bytes::from_static(b"2"), None)
            .unwrap();
        let later = t0 + Duration::from_secs(3600 * 24 * 365);
        assert_eq!(c.get(later, &scope("c"), "k").as_deref(), Some(&b"2"[..]));
        assert_eq!(c.poll_timeout(), None, "the overwritten TTL left the index");
        // A TTL too large for Instant is treated as none rather than panicking.
        c.put(
            t0,
            &scope("c"),
            "k2",
            Bytes::from_static(b"3"),
            Some(u64::MAX),
        )
        .unwrap();
        assert!(c.get(later, &scope("c"), "k2").is_some());
    }

    #[test]
    fn delete_returns_the_removed_value_once() {
        let t0 = Instant::now();
        let mut c = store(64, 64, 1024);
        c.put(t0, &scope("c"), "k", Bytes::from_static(b"v"), None)
            .unwrap();
        assert_eq!(c.delete(t0, &scope("c"), "k").as_deref(), Some(&b"v"[..]));
        assert_eq!(c.delete(t0, &scope("c"), "k"), None);
        assert_eq!(c.get(t0, &scope("c"), "k"), None);
        assert_eq!((c.entries(), c.total_bytes()), (0, 0));
        // Deleting an expired entry reports no value.
        c.put(t0, &scope("c"), "e", Bytes::from_static(b"v"), Some(5))
            .unwrap();
        assert_eq!(
            c.delete(t0 + Duration::from_millis(5), &scope("c"), "e"),
            None
        );
        assert_eq!(c.entries(), 0);
    }

    #[test]
    fn removing_a_cache_removes_every_shard_of_it_and_nothing_else() {
        let t0 = Instant::now();
        let mut c = store(64, 64, 1024);
        for shard in [0, 2, 3] {
            let key = CacheKey::on_shard("t1", "default", "c", shard);
            c.put(t0, &key, "k", Bytes::from_static(b"v"), None)
                .unwrap();
        }
        let other = CacheKey::on_shard("t1", "default", "d", 1);
        c.put(t0, &other, "k", Bytes::from_static(b"w"), None)
            .unwrap();
        assert!(c.remove_scope(&scope("c")));
        for shard in 0..4 {
            let key = CacheKey::on_shard("t1", "default", "c", shard);
            assert_eq!(c.get(t0, &key, "k"), None, "shard {shard}");
        }
        assert_eq!(c.get(t0, &other, "k").as_deref(), Some(&b"w"[..]));
        assert_eq!(c.entries(), 1);
        assert!(!c.remove_scope(&scope("c")), "nothing left to remove");
    }

    #[test]
    fn scopes_are_separate() {
        let t0 = Instant::now();
        let mut c = store(64, 64, 1024);
        c.put(t0, &scope("a"), "k", Bytes::from_static(b"a"), None)
            .unwrap();
        c.put(
            t0,
            &CacheKey::new("t2", "default", "a"),
            "k",
            Bytes::from_static(b"b"),
            None,
        )
        .unwrap();
        assert_eq!(c.get(t0, &scope("a"), "k").as_deref(), Some(&b"a"[..]));
        assert_eq!(c.get(t0, &scope("b"), "k"), None);
    }

    #[test]
    fn key_and_value_limits_at_the_edge() {
        let t0 = Instant::now();
        let mut c = store(4, 8, 1 << 20);
        c.put(t0, &scope("c"), "abcd", Bytes::from(vec![0u8; 8]), None)
            .unwrap();
        let err = c
            .put(t0, &scope("c"), "abcde", Bytes::from_static(b"v"), None)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::LimitExceeded);
        let err = c
            .put(t0, &scope("c"), "k", Bytes::from(vec![0u8; 9]), None)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::LimitExceeded);
        assert_eq!(c.entries(), 1, "refused puts stored nothing");
    }

    #[test]
    fn total_bytes_limit_at_the_edge_and_replacement_is_accounted() {
        let t0 = Instant::now();
        // Budget 10: "k1"+6 bytes = 8, then "k2"+0 = 2 fills it exactly.
        let mut c = store(64, 64, 10);
        c.put(t0, &scope("c"), "k1", Bytes::from(vec![1u8; 6]), None)
            .unwrap();
        c.put(t0, &scope("c"), "k2", Bytes::new(), None).unwrap();
        assert_eq!(c.total_bytes(), 10);
        let err = c
            .put(t0, &scope("c"), "k3", Bytes::new(), None)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Overloaded);
        // Replacing k1 with one byte more would be 11: refused; with the same size: fine.
        assert_eq!(
            c.put(t0, &scope("c"), "k1", Bytes::from(vec![1u8; 7]), None)
                .unwrap_err()
                .code,
            ErrorCode::Overloaded
        );
        c.put(t0, &scope("c"), "k1", Bytes::from(vec![2u8; 6]), None)
            .unwrap();
        assert_eq!(c.total_bytes(), 10);
    }

    #[test]
    fn a_full_cache_reclaims_expired_values_before_refusing() {
        let t0 = Instant::now();
        let mut c = store(64, 64, 10);
        c.put(t0, &scope("c"), "k1", Bytes::from(vec![1u8; 8]), Some(1))
            .unwrap();
        let later = t0 + Duration::from_millis(1);
        c.put(later, &scope("c"), "k2", Bytes::from(vec![1u8; 8]), None)
            .unwrap();
        assert_eq!((c.entries(), c.total_bytes()), (1, 10));
    }

    #[test]
    fn sweep_is_bounded_and_ordered_by_expiry() {
        let t0 = Instant::now();
        let mut c = store(64, 64, 1 << 20);
        for i in 0..10u64 {
            let ttl = 100 - i; // later keys expire earlier
            c.put(
                t0,
                &scope("c"),
                &format!("k{i}"),
                Bytes::from_static(b"v"),
                Some(ttl),
            )
            .unwrap();
        }
        c.put(t0, &scope("c"), "forever", Bytes::from_static(b"v"), None)
            .unwrap();
        assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_millis(91)));

        let now = t0 + Duration::from_millis(200);
        assert_eq!(c.sweep(now, 4), 4);
        // The four earliest to expire (k9..k6) went first.
        for i in 6..10 {
            assert!(c
                .scopes
                .values()
                .all(|s| !s.entries.contains_key(&format!("k{i}"))));
        }
        // A full batch allows the next sweep at once.
        assert_eq!(
            c.poll_timeout(),
            Some(t0 + Duration::from_millis(95)).map(|t| t.max(now))
        );
        assert_eq!(c.sweep(now, 100), 6);
        assert_eq!(c.entries(), 1);
        assert_eq!(c.poll_timeout(), None);
        assert_eq!(c.counters.expired, 10);
        assert_eq!(
            c.get(now, &scope("c"), "forever").as_deref(),
            Some(&b"v"[..])
        );
    }

    #[test]
    fn sweep_is_paced_when_it_finds_little() {
        let t0 = Instant::now();
        let mut c = store(64, 64, 1 << 20);
        c.put(t0, &scope("c"), "a", Bytes::from_static(b"v"), Some(10))
            .unwrap();
        assert_eq!(c.sweep(t0, CACHE_SWEEP_MAX_ENTRIES), 0);
        // Expires at t0+10ms, but the sweep that just ran holds the next one off.
        assert_eq!(c.poll_timeout(), Some(t0 + CACHE_SWEEP_INTERVAL));
    }
}
