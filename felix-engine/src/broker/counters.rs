//! Counters beside each durable cache: `counter_add` folds a signed delta into a sum kept
//! by a [`CounterLog`] under `counters/`, answered once durable with the sum including it;
//! `counter_get` reads the durable sum (`None`: never written). A counter and a cache value
//! may share a key and are unrelated; cache watches do not see counters.

use std::time::Instant;

use felix_proto::ErrorCode;

use super::cache::{DurableKind, DurableWrite};
use super::durable::{LogState, Owner};
use super::{append_error, Broker, BrokerError, CacheKey};
use felix_storage::cache_log::MAX_CACHE_KEY_BYTES;
use felix_storage::counter_log::{AddError, CounterLog};
use felix_storage::layout;
use felix_storage::ops::LogId;

impl Broker {
    /// The counters' log of a cache, open; `None` when it has none and `create` is false.
    /// A log still opening stalls the request.
    pub(super) fn counter_log(
        &mut self,
        now: Instant,
        key: &CacheKey,
        create: bool,
    ) -> Result<Option<LogId>, BrokerError> {
        let Some(logs) = self.logs.as_mut() else {
            return Err(BrokerError::invalid(
                "counters need durable storage: a sum every restart resets is not served",
            ));
        };
        let dir = layout::counter_shard_dir(&key.tenant, &key.namespace, &key.cache, key.shard);
        if let (None, Some(retiring)) = (
            logs.find(&dir),
            logs.retiring_blocks(&super::delete::parent_dir(&dir)),
        ) {
            // Deleted a moment ago: a new log must not open the old files (`delete.rs`).
            return Err(BrokerError::opening(retiring));
        }
        let log = match (logs.find(&dir), create) {
            (Some(log), _) => log,
            (None, true) => logs.claim(dir, Owner::Counter, now),
            (None, false) => return Ok(None),
        };
        match &logs.slot(log).expect("live").state {
            LogState::Opening => Err(BrokerError::opening(log)),
            LogState::Failed(e) => Err(BrokerError::storage(format!(
                "the counters' log failed: {e}"
            ))),
            LogState::Open => Ok(Some(log)),
        }
    }

    fn counters_of(&mut self, log: LogId) -> Result<&mut CounterLog, BrokerError> {
        let logs = self.logs.as_mut().expect("durable");
        logs.mark_dirty(log);
        logs.slot_mut(log)
            .and_then(|s| s.log.counter_mut())
            .ok_or_else(|| BrokerError::storage("not a counter log"))
    }

    fn counter_key_fits(&self, k: &str) -> Result<(), BrokerError> {
        let max = self.cfg.cache_max_key_bytes.min(MAX_CACHE_KEY_BYTES);
        if k.len() > max {
            return Err(BrokerError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "counter key of {} bytes exceeds cache_max_key_bytes ({max})",
                    k.len()
                ),
            ));
        }
        Ok(())
    }

    /// Adds `delta`; the sum including it is the answer, to be sent once the log is durable
    /// below the returned offset.
    pub(crate) fn counter_add(
        &mut self,
        now: Instant,
        unix_micros: u64,
        key: &CacheKey,
        k: &str,
        delta: i64,
    ) -> Result<(LogId, u64, i64), BrokerError> {
        self.counter_key_fits(k)?;
        let log =
            self.durable_log_for(now, key, DurableKind::Counter, DurableWrite::Add { key: k })?;
        match self
            .counters_of(log)?
            .add(now, unix_micros, k.as_bytes(), delta)
        {
            Ok((offset, sum)) => Ok((log, offset + 1, sum)),
            Err(AddError::Overflow { sum }) => Err(BrokerError::invalid(format!(
                "adding {delta} to {sum} leaves the 64-bit range; the counter is unchanged"
            ))),
            Err(AddError::Append(e)) => Err(append_error(e)),
        }
    }

    /// The durable sum; `None` if the counter was never written.
    pub(crate) fn counter_get(
        &mut self,
        now: Instant,
        key: &CacheKey,
        k: &str,
    ) -> Result<Option<i64>, BrokerError> {
        self.counter_key_fits(k)?;
        match self.counter_log(now, key, false)? {
            Some(log) => Ok(self.counters_of(log)?.get(k.as_bytes())),
            None => Ok(None),
        }
    }
}
