//! Atomic commits: `commit` / `commit_ok` and `state_get` / `state_value`.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// One state change of a `commit`, tagged by `op`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StateChange {
    Put {
        key: String,
        #[serde(with = "crate::message::fields::b64")]
        #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_bytes))]
        value: Bytes,
    },
    Delete {
        key: String,
    },
}

/// `commit`: appends `event` and applies `changes` to the shard `entity_key` routes to, as
/// one record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Commit {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    #[serde(with = "crate::message::fields::b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_bytes))]
    pub entity_key: Bytes,
    /// An explicit shard instead of routing `entity_key` (`FEATURE_EXPLICIT_SHARD`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u64>,
    #[serde(with = "crate::message::fields::b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_bytes))]
    pub event: Bytes,
    #[serde(default)]
    pub changes: Vec<StateChange>,
    pub request_id: u64,
    /// Makes the commit conditional, as `publish_if` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_offset: Option<u64>,
}

/// `commit_ok`: the commit is durable; `offset` is where its event is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CommitOk {
    pub request_id: u64,
    pub offset: u64,
}

/// `state_get`: reads `key` in the state of the shard `entity_key` routes to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct StateGet {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    #[serde(with = "crate::message::fields::b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_bytes))]
    pub entity_key: Bytes,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u64>,
    pub key: String,
    pub request_id: u64,
}

/// `state_value`. `value` is always on the wire, `null` for a key never written or deleted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct StateValue {
    #[serde(default, with = "crate::message::fields::opt_b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_bytes))]
    pub value: Option<Bytes>,
    /// The offset of the commit that wrote `value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// The offset of the last commit the answer reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<u64>,
    pub request_id: u64,
}
