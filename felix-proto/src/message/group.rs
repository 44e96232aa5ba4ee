//! Consumer groups: polling, settling, claim control, dead letters and administration.
//! Every request names one shard of a stream and a group on it, and is served only by the
//! shard's leader.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::subscribe::Start;

/// Defines a group request addressed to (tenant, namespace, stream, shard, group), with any
/// extra fields between `group` and the trailing `request_id`.
macro_rules! group_request {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
        pub struct $name {
            pub tenant_id: String,
            pub namespace: String,
            pub stream: String,
            pub shard: u64,
            pub group: String,
            $($(#[$fdoc])* pub $field: $ty,)*
            pub request_id: u64,
        }
    };
}

/// `group_poll`: claim up to `max_records` records, waiting up to `wait_ms` for some.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GroupPoll {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u64,
    pub group: String,
    pub max_records: u64,
    /// Omitted or `0` answers at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    pub request_id: u64,
    /// The member polling (`FEATURE_GROUP_CONSUMER`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    /// Take back this member's claims from older connections first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<bool>,
    /// How long this poll's claims stand (`FEATURE_GROUP_CLAIM_CONTROL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_ms: Option<u64>,
}

/// One record handed out by `group_records`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GroupRecord {
    pub offset: u64,
    #[serde(with = "crate::message::fields::b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_bytes))]
    pub payload: Bytes,
    /// Deliveries including this one; absent means not reported (not "first").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u64>,
    /// Offsets just below this one settled without delivery (`FEATURE_GROUP_SKIPPED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_before: Option<u64>,
    /// The publishing principal (`FEATURE_GROUP_PUBLISHER`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<String>,
    /// Append time in Unix microseconds (`FEATURE_RECORD_TIMESTAMPS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_micros: Option<u64>,
}

/// `group_records`: the answer to a poll, possibly empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GroupRecords {
    pub records: Vec<GroupRecord>,
    pub request_id: u64,
}

group_request! {
    /// `group_ack`: finishes a record. Answered with `cache_ok`.
    GroupAck { offset: u64, }
}

/// `group_nack`: hands a record back for redelivery. Answered with `cache_ok`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GroupNack {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u64,
    pub group: String,
    pub offset: u64,
    pub request_id: u64,
    /// Owed again only this many milliseconds from now; omitted or `0` is at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Names the delivery being handed back; omitted or `0` hands back whatever stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u64>,
}

group_request! {
    /// `group_extend`: keeps the claim named by `attempts` standing for `extend_ms`.
    GroupExtend {
        offset: u64,
        /// The delivery count the record was handed out with.
        attempts: u64,
        extend_ms: u64,
    }
}

/// `group_extended`: the visibility granted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GroupExtended {
    pub visible_ms: u64,
    pub request_id: u64,
}

group_request! {
    /// `group_dead_letter`: gives up on one record. Answered with `cache_ok`.
    GroupDeadLetter { offset: u64, }
}

group_request! {
    /// `group_dead_letters`: lists the group's dead letters.
    GroupDeadLetters {}
}

/// `group_dead_letter_list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GroupDeadLetterList {
    pub offsets: Vec<u64>,
    pub request_id: u64,
}

group_request! {
    /// `group_discard`: drops a dead letter. Answered with `cache_ok`.
    GroupDiscard { offset: u64, }
}

group_request! {
    /// `group_redrive`: puts a dead letter back. Answered with `cache_ok`.
    GroupRedrive { offset: u64, }
}

/// `group_seek`: moves the group's cursor; with `if_new`, only if the group does not exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GroupSeek {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u64,
    pub group: String,
    pub start: Start,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_new: Option<bool>,
    pub request_id: u64,
}

/// `group_position`: where the group stands after a seek.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GroupPosition {
    pub offset: u64,
    /// False when `if_new` found the group already there.
    pub moved: bool,
    pub request_id: u64,
}

group_request! {
    /// `group_describe`, answered with `group_info`.
    GroupDescribe {}
}

/// `group_info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GroupInfo {
    /// Absent for a group with no cursor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed: Option<u64>,
    /// The shard's committed tail.
    pub tail: u64,
    pub in_flight: u64,
    /// Records owed again after a nack or a lapsed claim.
    pub owed: u64,
    pub dead_letters: u64,
    pub request_id: u64,
}

group_request! {
    /// `group_delete`, answered with `group_deleted`.
    GroupDelete {}
}

/// `group_deleted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct GroupDeleted {
    pub existed: bool,
    pub request_id: u64,
}
