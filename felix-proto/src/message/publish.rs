//! Publishing as JSON: the compatibility `publish` / `publish_batch`, the idempotent and
//! conditional forms, `publish_width`, and their answers.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, RetryClass};
use crate::routing::RoutingMapping;

use super::error::ErrorDetail;

/// The `ack` of a JSON publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[serde(rename_all = "snake_case")]
pub enum AckMode {
    /// Fire and forget (also what an absent `ack` means).
    None,
    PerMessage,
    PerBatch,
}

/// `publish`: one record. Current clients publish with binary frames; this is the fallback,
/// and the form for a publish that names its `shard`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Publish {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    #[serde(with = "crate::message::fields::b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_bytes))]
    pub payload: Bytes,
    /// Routing key; absent means shard 0.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::message::fields::opt_b64"
    )]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_bytes))]
    pub key: Option<Bytes>,
    /// An explicit shard, used instead of hashing `key` (`FEATURE_EXPLICIT_SHARD`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u64>,
    /// Required whenever `ack` is not `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack: Option<AckMode>,
}

/// `publish_batch`: several records, appended in order and answered once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PublishBatch {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    #[serde(with = "crate::message::fields::vec_b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_vec_bytes))]
    pub payloads: Vec<Bytes>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::message::fields::opt_b64"
    )]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_bytes))]
    pub key: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack: Option<AckMode>,
}

/// `publish_ok`. `offset` (the batch's first record) only for a client that offered
/// `BINARY_PUBLISH_ACK_OFFSET`, and only when the broker answered after the write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PublishOk {
    pub request_id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// `publish_error`: an acked publish failed. Codes as on `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PublishError {
    pub request_id: u64,
    pub message: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::message::fields::opt_code"
    )]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_code))]
    pub code: Option<ErrorCode>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::message::fields::opt_retry"
    )]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_retry))]
    pub retry: Option<RetryClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<ErrorDetail>,
}

/// Why a `publish_idempotent`, `publish_if` or conditional `commit` was refused. On the
/// wire a bare string, or an object with one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[serde(rename_all = "snake_case")]
pub enum PublishRefusalReason {
    /// The sequence is past the next expected one.
    SequenceGap { expected: u64 },
    /// The producer is not known here and the sequence is not zero.
    UnknownProducer,
    /// The sequence is older than the leader remembers.
    SequenceExpired,
    /// A remembered sequence with different payloads.
    SequenceReused,
    /// The write would not start at `expected_offset`; `tail` is the shard's next offset.
    OffsetMismatch { tail: u64 },
    /// This broker does not lead the shard.
    NotLeader {
        node_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        addr: Option<String>,
    },
}

/// `publish_refused`: nothing was written, for the typed reason given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PublishRefused {
    pub request_id: u64,
    pub reason: PublishRefusalReason,
    #[serde(default)]
    pub message: String,
}

/// `producer_init`: asks for an idempotent producer id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ProducerInit {
    pub request_id: u64,
}

/// `producer_init_ok`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ProducerInitOk {
    pub request_id: u64,
    pub producer_id: u64,
}

/// `publish_idempotent`: a batch appended once however many times it arrives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PublishIdempotent {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    #[serde(with = "crate::message::fields::vec_b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_vec_bytes))]
    pub payloads: Vec<Bytes>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::message::fields::opt_b64"
    )]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_bytes))]
    pub key: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u64>,
    pub request_id: u64,
    pub producer_id: u64,
    /// This producer's batch number on the shard, from zero.
    pub sequence: u64,
}

/// `publish_if`: a batch appended only if it would start at `expected_offset`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PublishIf {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    #[serde(with = "crate::message::fields::vec_b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_vec_bytes))]
    pub payloads: Vec<Bytes>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::message::fields::opt_b64"
    )]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_bytes))]
    pub key: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u64>,
    pub expected_offset: u64,
    pub request_id: u64,
}

/// `publish_width`: the width a client routed a stream's keyed batches by, sent ahead of
/// them on the publish stream (`FEATURE_PUBLISH_WIDTH`). Never answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PublishWidth {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    pub shards: u64,
    /// Absent means `modulo`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::message::fields::opt_routing"
    )]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_routing))]
    pub routing: Option<RoutingMapping>,
}
