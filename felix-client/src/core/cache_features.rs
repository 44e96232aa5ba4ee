//! Counters and conditional cache writes: requests on a [`RequestStream`] like `cache_put`,
//! each refused locally unless the broker advertised its feature.

use bytes::Bytes;
use felix_proto::message::{self, CacheCondition, Message};
use felix_proto::Features;

use super::requests::{Answer, Encoded, RequestKind, RequestStream, Target};
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

impl RequestStream {
    /// Encodes `counter_add` (needs `FEATURE_COUNTERS`).
    pub fn counter_add(
        &mut self,
        target: Target<'_>,
        key: &str,
        delta: i64,
    ) -> Result<Encoded, ClientError> {
        self.feature_request(RequestKind::Counter, Features::COUNTERS, |tenant, id| {
            Message::CounterAdd(message::CounterAdd {
                tenant_id: tenant.to_owned(),
                namespace: target.namespace.to_owned(),
                cache: target.name.to_owned(),
                key: key.to_owned(),
                delta,
                request_id: id,
            })
        })
    }

    /// Encodes `counter_get` (needs `FEATURE_COUNTERS`).
    pub fn counter_get(&mut self, target: Target<'_>, key: &str) -> Result<Encoded, ClientError> {
        self.feature_request(RequestKind::Counter, Features::COUNTERS, |tenant, id| {
            Message::CounterGet(message::CounterGet {
                tenant_id: tenant.to_owned(),
                namespace: target.namespace.to_owned(),
                cache: target.name.to_owned(),
                key: key.to_owned(),
                request_id: id,
            })
        })
    }

    /// Encodes `cache_put_if` (needs `FEATURE_CACHE_CONDITIONAL`).
    pub fn cache_put_if(
        &mut self,
        target: Target<'_>,
        key: &str,
        value: Bytes,
        ttl_ms: Option<u64>,
        condition: Condition,
    ) -> Result<Encoded, ClientError> {
        let condition = match condition {
            Condition::Absent => CacheCondition::Absent,
            Condition::Version(v) => CacheCondition::Version(v),
        };
        self.conditional(|tenant, id| {
            Message::CachePutIf(message::CachePutIf {
                tenant_id: tenant.to_owned(),
                namespace: target.namespace.to_owned(),
                cache: target.name.to_owned(),
                key: key.to_owned(),
                value,
                ttl_ms,
                condition,
                request_id: id,
            })
        })
    }

    /// Encodes `cache_delete_if` (needs `FEATURE_CACHE_CONDITIONAL`).
    pub fn cache_delete_if(
        &mut self,
        target: Target<'_>,
        key: &str,
        version: u64,
    ) -> Result<Encoded, ClientError> {
        self.conditional(|tenant, id| {
            Message::CacheDeleteIf(message::CacheDeleteIf {
                tenant_id: tenant.to_owned(),
                namespace: target.namespace.to_owned(),
                cache: target.name.to_owned(),
                key: key.to_owned(),
                version,
                request_id: id,
            })
        })
    }

    fn conditional(
        &mut self,
        build: impl FnOnce(&str, u64) -> Message,
    ) -> Result<Encoded, ClientError> {
        self.feature_request(
            RequestKind::CacheConditional,
            Features::CACHE_CONDITIONAL,
            build,
        )
    }
}

/// The sum `counter_add` answered (it always has one).
pub fn counter_add_answer(answer: Answer) -> Result<i64, ClientError> {
    match answer {
        Answer::Counter(Some(sum)) => Ok(sum),
        other => Err(ClientError::protocol(format!(
            "{other:?} answered counter_add"
        ))),
    }
}

/// The sum `counter_get` answered; `None` if the counter was never written.
pub fn counter_get_answer(answer: Answer) -> Result<Option<i64>, ClientError> {
    match answer {
        Answer::Counter(sum) => Ok(sum),
        other => Err(ClientError::protocol(format!(
            "{other:?} answered counter_get"
        ))),
    }
}

/// A `cache_get` answer read for its version: `None` when the key is absent.
pub fn versioned_value_answer(answer: Answer) -> Result<Option<(Bytes, u64)>, ClientError> {
    match answer {
        Answer::VersionedValue { value, version } => Ok(Some((value, version))),
        Answer::CacheValue(None) => Ok(None),
        other => Err(ClientError::protocol(format!(
            "{other:?} answered cache_get without a version"
        ))),
    }
}

/// What a conditional write was answered.
pub fn condition_answer(answer: Answer) -> Result<ConditionResult, ClientError> {
    match answer {
        Answer::Condition { applied, version } => Ok(ConditionResult { applied, version }),
        other => Err(ClientError::protocol(format!(
            "{other:?} answered a conditional write"
        ))),
    }
}
