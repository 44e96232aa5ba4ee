//! Counters and conditional cache writes, on the pooled cache streams like `cache_put`.

use bytes::Bytes;
use felix_proto::message::{self, CacheCondition, Message};
use felix_proto::Features;

use super::Client;
use crate::core::{Answer, RequestKind};
use crate::error::ClientError;

/// What a conditional write requires of the key's live entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// No live entry (never written, deleted or expired).
    Absent,
    /// The live entry has this version.
    Version(u64),
}

/// The answer to a conditional write. A refusal is an answer, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConditionResult {
    pub applied: bool,
    /// After an applied put, the version written; otherwise the key's current version
    /// (`None`: no live entry, as after an applied delete).
    pub version: Option<u64>,
}

impl Client {
    /// Adds `delta` to a counter and returns the sum including it (at least once: a retry
    /// after a lost answer counts twice).
    pub async fn counter_add(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
        delta: i64,
    ) -> Result<i64, ClientError> {
        let answer = self
            .cache_call(|core| {
                core.feature_request(RequestKind::Counter, Features::COUNTERS, |tenant, id| {
                    Message::CounterAdd(message::CounterAdd {
                        tenant_id: tenant.to_owned(),
                        namespace: namespace.to_owned(),
                        cache: cache.to_owned(),
                        key: key.to_owned(),
                        delta,
                        request_id: id,
                    })
                })
            })
            .await?;
        match answer {
            Answer::Counter(Some(sum)) => Ok(sum),
            other => Err(ClientError::protocol(format!(
                "{other:?} answered counter_add"
            ))),
        }
    }

    /// A counter's sum; `None` if it was never written (which is not zero).
    pub async fn counter_get(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
    ) -> Result<Option<i64>, ClientError> {
        let answer = self
            .cache_call(|core| {
                core.feature_request(RequestKind::Counter, Features::COUNTERS, |tenant, id| {
                    Message::CounterGet(message::CounterGet {
                        tenant_id: tenant.to_owned(),
                        namespace: namespace.to_owned(),
                        cache: cache.to_owned(),
                        key: key.to_owned(),
                        request_id: id,
                    })
                })
            })
            .await?;
        match answer {
            Answer::Counter(sum) => Ok(sum),
            other => Err(ClientError::protocol(format!(
                "{other:?} answered counter_get"
            ))),
        }
    }

    /// Reads `key` with its version (the offset of the put that wrote it), for a
    /// conditional write to compare against.
    pub async fn cache_get_versioned(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
    ) -> Result<Option<(Bytes, u64)>, ClientError> {
        let target = crate::core::Target {
            namespace,
            name: cache,
        };
        match self.cache_call(|core| core.cache_get(target, key)).await? {
            Answer::VersionedValue { value, version } => Ok(Some((value, version))),
            Answer::CacheValue(None) => Ok(None),
            other => Err(ClientError::protocol(format!(
                "{other:?} answered cache_get without a version"
            ))),
        }
    }

    /// Stores `value` only if the key's live entry meets `condition`.
    pub async fn cache_put_if(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
        value: Bytes,
        ttl_ms: Option<u64>,
        condition: Condition,
    ) -> Result<ConditionResult, ClientError> {
        let condition = match condition {
            Condition::Absent => CacheCondition::Absent,
            Condition::Version(v) => CacheCondition::Version(v),
        };
        self.conditional(|tenant, id| {
            Message::CachePutIf(message::CachePutIf {
                tenant_id: tenant.to_owned(),
                namespace: namespace.to_owned(),
                cache: cache.to_owned(),
                key: key.to_owned(),
                value,
                ttl_ms,
                condition,
                request_id: id,
            })
        })
        .await
    }

    /// Removes the key only if its live entry has `version`.
    pub async fn cache_delete_if(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
        version: u64,
    ) -> Result<ConditionResult, ClientError> {
        self.conditional(|tenant, id| {
            Message::CacheDeleteIf(message::CacheDeleteIf {
                tenant_id: tenant.to_owned(),
                namespace: namespace.to_owned(),
                cache: cache.to_owned(),
                key: key.to_owned(),
                version,
                request_id: id,
            })
        })
        .await
    }

    async fn conditional(
        &self,
        build: impl FnOnce(&str, u64) -> Message,
    ) -> Result<ConditionResult, ClientError> {
        let answer = self
            .cache_call(|core| {
                core.feature_request(
                    RequestKind::CacheConditional,
                    Features::CACHE_CONDITIONAL,
                    build,
                )
            })
            .await?;
        match answer {
            Answer::Condition { applied, version } => Ok(ConditionResult { applied, version }),
            other => Err(ClientError::protocol(format!(
                "{other:?} answered a conditional write"
            ))),
        }
    }
}
