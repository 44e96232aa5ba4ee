//! Operator questions (`FEATURE_INSPECT`): `shard_inspect` and `subscriptions_list`.
//! Role, phase, reason and state words are strings, not closed sets, so a later broker can
//! add one without an older reader failing the frame.

use serde::{Deserialize, Serialize};

use super::query::ShardKind;

/// `shard_inspect`: this broker's own view of one shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ShardInspect {
    pub tenant_id: String,
    pub namespace: String,
    pub name: String,
    pub kind: ShardKind,
    pub shard: u64,
    pub request_id: u64,
}

/// `shard_inspect_info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ShardInspectInfo {
    pub request_id: u64,
    /// Boxed: it is by far the largest answer, and every `Message` would pay for it inline.
    pub view: Box<ShardInspection>,
}

/// The `view` of a `shard_inspect_info`. Everything after `serving` is left out when it
/// does not apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ShardInspection {
    pub node_id: String,
    /// Shards of the stream or cache by this broker's routing; `0` when unknown.
    pub shards: u64,
    /// `leader`, `follower` or `none`.
    pub role: String,
    /// `unassigned`, `opening`, `fencing`, `active`, `draining`, `closed`, `failed`, ...
    pub phase: String,
    pub serving: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment: Option<InspectedAssignment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<InspectedFence>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<InspectedLease>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_generation: Option<u64>,
    /// A leader's view of every other replica; a follower answers with none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<InspectedReplica>,
}

/// The assignment this broker's routing holds for the shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct InspectedAssignment {
    pub generation: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    #[serde(default)]
    pub replicas: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successor: Option<String>,
}

/// A promoted leader waiting for its replicas to take its generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct InspectedFence {
    #[serde(default)]
    pub took: Vec<String>,
    #[serde(default)]
    pub pending: Vec<String>,
    pub attempts: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_in_ms: Option<u64>,
}

/// The shard lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct InspectedLease {
    pub held: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_ms: Option<u64>,
}

/// A leader's view of one other replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct InspectedReplica {
    pub node_id: String,
    /// `follower` or `learner`.
    pub role: String,
    pub next_offset: u64,
    pub lag: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<bool>,
    /// `shipping`, `stalled`, `copying`, `rebuilding`, `halted`, `fencing`, ...
    pub state: String,
    /// Why shipping halted, with `state` `halted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<String>,
}

/// Narrows a `subscriptions_list`; every field set narrows further.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct SubscriptionFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u64>,
    /// The `sub` of the subscribing connection's token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// Only subscriptions whose queue has dropped records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropping: Option<bool>,
}

/// A position in the subscription listing; the next page starts after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct SubscriptionCursor {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u64,
    pub subscriber_id: u64,
}

/// `subscriptions_list`: one page of the subscriptions this broker serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct SubscriptionsList {
    pub request_id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<SubscriptionFilter>,
    /// Defaults to 100, capped at 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// The previous page's `next_cursor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<SubscriptionCursor>,
}

/// One subscription of a `subscriptions_list_info` page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct InspectedSubscription {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u64,
    /// The shard's own id for the subscriber.
    pub subscriber_id: u64,
    /// The id the client sees on its `event_stream_hello`.
    pub subscription_id: u64,
    /// The broker's id for the QUIC connection; absent with no client connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// `block`, `drop_new` or `drop_old`.
    pub policy: String,
    /// Batches queued.
    pub depth: u64,
    pub capacity: u64,
    /// Records dropped since the subscription started.
    pub dropped: u64,
    /// One past the last offset taken from the queue; absent without offsets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    pub tail: u64,
    pub age_ms: u64,
}

/// `subscriptions_list_info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct SubscriptionsListInfo {
    pub request_id: u64,
    /// The answering broker; empty outside a cluster.
    #[serde(default)]
    pub node_id: String,
    pub subscriptions: Vec<InspectedSubscription>,
    /// Absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<SubscriptionCursor>,
}
