//! Read-only questions: bounded stream reads, offsets by time, shard counts, shard owners
//! and the topology.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::routing::RoutingMapping;

/// `stream_read`: one page of a durable shard's records, from `from` and stopping before
/// `end` (`FEATURE_STREAM_READ`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct StreamRead {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u64,
    pub from: u64,
    /// Absent runs to the committed tail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u64>,
    /// Absent or `0` takes the broker's cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_records: Option<u64>,
    /// Absent or `0` takes the broker's cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    pub request_id: u64,
}

/// One record of a `stream_records` page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct StreamRecord {
    pub offset: u64,
    #[serde(with = "crate::message::fields::b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_bytes))]
    pub payload: Bytes,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_micros: Option<u64>,
}

/// `stream_records`: a page in offset order; the next page starts at `next_offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct StreamRecords {
    pub records: Vec<StreamRecord>,
    pub next_offset: u64,
    pub request_id: u64,
}

/// `offset_for_time`: the first offset appended at or after `at_micros`
/// (`FEATURE_RECORD_TIMESTAMPS`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct OffsetForTime {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u64,
    pub at_micros: u64,
    pub request_id: u64,
}

/// `offset_value`: absent when no readable record is that recent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct OffsetValue {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    pub request_id: u64,
}

/// `stream_shards`: how many shards a stream has (`FEATURE_STREAM_SHARDS`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct StreamShards {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    pub request_id: u64,
}

/// `stream_shards_view`. `0` shards means the broker knows nothing of the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct StreamShardsView {
    pub shards: u64,
    pub request_id: u64,
    /// Sent only for a `jump_hash` stream; absent means `modulo`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::message::fields::opt_routing"
    )]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_routing))]
    pub routing: Option<RoutingMapping>,
}

/// `cache_shards`: how many shards a cache has (`FEATURE_CACHE_SHARDS`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheShards {
    pub tenant_id: String,
    pub namespace: String,
    pub cache: String,
    pub request_id: u64,
}

/// `cache_shards_view`. `0` means the broker does not know the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CacheShardsView {
    pub shards: u64,
    pub request_id: u64,
}

/// Whether a name is a stream or a cache (they may share one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[serde(rename_all = "snake_case")]
pub enum ShardKind {
    Stream,
    Cache,
}

/// `shard_owners`: which broker owns each shard of a stream or cache
/// (`FEATURE_SHARD_OWNERS`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ShardOwners {
    pub tenant_id: String,
    pub namespace: String,
    pub name: String,
    pub kind: ShardKind,
    pub request_id: u64,
}

/// One shard of a `shard_owners_view`. Absent fields are left out, never `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ShardOwner {
    pub shard: u64,
    /// Absent when nobody can serve the shard, or outside a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The `shard_unavailable` reason when nobody serves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// `shard_owners_view`: one entry per shard, in shard order; empty for an unknown name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ShardOwnersView {
    pub request_id: u64,
    pub owners: Vec<ShardOwner>,
}

/// A broker a client may connect to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct BrokerEndpoint {
    pub node_id: String,
    /// The broker's client-facing listener.
    pub addr: String,
}

/// `topology_view`: the answer to `topology` ([`super::Message::Topology`]). Empty is valid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TopologyView {
    pub brokers: Vec<BrokerEndpoint>,
}
