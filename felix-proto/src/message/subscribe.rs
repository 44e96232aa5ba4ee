//! Subscriptions: `subscribe` and its answers, and the JSON frames of an event stream
//! (`event_stream_hello`, `event`, `event_batch` and the stream's last words).

use std::fmt;

use bytes::Bytes;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

/// Where a subscription (or a `group_seek`) starts: `"latest"`, `"earliest"` or
/// `{"offset": n}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Start {
    /// Only what is published from now on (what an absent `start` means).
    Latest,
    /// The oldest record still retained.
    Earliest,
    /// Exactly this offset: the first record the client has not seen.
    Offset(u64),
}

impl Serialize for Start {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Start::Latest => s.serialize_str("latest"),
            Start::Earliest => s.serialize_str("earliest"),
            Start::Offset(offset) => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("offset", offset)?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Start {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct StartVisitor;
        impl<'de> Visitor<'de> for StartVisitor {
            type Value = Start;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#""latest", "earliest" or {"offset": <u64>}"#)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Start, E> {
                match s {
                    "latest" => Ok(Start::Latest),
                    "earliest" => Ok(Start::Earliest),
                    other => Err(E::unknown_variant(other, &["latest", "earliest", "offset"])),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Start, A::Error> {
                let mut offset = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "offset" {
                        offset = Some(map.next_value::<u64>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                offset
                    .map(Start::Offset)
                    .ok_or_else(|| de::Error::missing_field("offset"))
            }
        }
        d.deserialize_any(StartVisitor)
    }
}

/// `subscribe`: start a subscription to one shard of a stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Subscribe {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    /// An explicit id; absent, the broker assigns one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription_id: Option<u64>,
    /// Absent means [`Start::Latest`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Start>,
    /// Absent means shard 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u64>,
    /// Requested broker-side queue capacity, in batches (`FEATURE_SUBSCRIBE_QUEUE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_capacity: Option<u64>,
}

/// `subscribed`: confirms a subscription; the same id opens its event stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Subscribed {
    pub subscription_id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_offset: Option<u64>,
    /// The granted capacity, only when the subscribe asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_capacity: Option<u64>,
}

/// Why a cursor could not be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[serde(rename_all = "snake_case")]
pub enum CursorErrorReason {
    /// Retention discarded the offset; `available` is the oldest retained.
    TooOld,
    /// The offset is past the end; `available` is the tail.
    InFuture,
}

/// `subscribe_cursor_error`: the requested offset cannot be served (also the answer to a
/// `stream_read` or `cache_watch` with such an offset).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct SubscribeCursorError {
    pub reason: CursorErrorReason,
    pub requested: u64,
    pub available: u64,
}

/// `event_stream_hello`: the first frame on a broker-opened event stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct EventStreamHello {
    pub subscription_id: u64,
}

/// `event`: one record on an event stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Event {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    #[serde(with = "crate::message::fields::b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_bytes))]
    pub payload: Bytes,
    /// Present on a durable stream, absent on an in-memory one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// `event_batch`: several records; record `i` is at `base_offset + i`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct EventBatch {
    pub tenant_id: String,
    pub namespace: String,
    pub stream: String,
    #[serde(with = "crate::message::fields::vec_b64")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_vec_bytes))]
    pub payloads: Vec<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_offset: Option<u64>,
}

/// `subscription_lagged`: the last frame of a subscription whose broker queue dropped
/// records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct SubscriptionLagged {
    pub subscription_id: u64,
    /// The first offset the queue dropped.
    pub resume_from: u64,
}

/// `shard_moved`: the last frame of a subscription or cache watch whose shard moved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ShardMoved {
    pub subscription_id: u64,
    /// The first offset the reader was not offered; absent on an in-memory stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// The assignment generation that moved the shard.
    pub generation: u64,
}

/// `stream_deleted`: the last frame of a subscription whose stream was deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct StreamDeleted {
    pub subscription_id: u64,
}
