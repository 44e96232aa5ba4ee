//! Every JSON control message, both directions: the payload of a frame with flags `0`.
//!
//! A message is a JSON object tagged by `type`. [`Message`] has one variant per wire type,
//! each holding a plain struct of public fields; [`Message::decode`] reads one from a
//! payload and [`Message::encode_into`] writes it back with `type` first and the remaining
//! keys in the order peers put them on the wire, so the shared vectors re-encode byte for
//! byte.
//!
//! Conventions, applied throughout:
//! - Byte fields are standard padded base64 on the wire and [`bytes::Bytes`] here.
//! - Numbers are `u64` (feature words exceed 2^31), counter deltas and sums `i64`.
//! - Optional fields are `Option`s, left out when `None`, except where peers always send
//!   the field (`cache_put.ttl_ms`, `cache_value.value`, `state_value.value`: `null`).
//! - Unknown fields are ignored. An unknown `type` decodes to [`Message::Unknown`] so a
//!   broker can answer it with `unsupported`; it is never an error.

mod auth;
mod cache;
mod commit;
mod error;
pub(crate) mod fields;
mod group;
mod inspect;
mod publish;
mod query;
mod subscribe;

use std::borrow::Cow;
use std::fmt;
use std::io::Write as _;

use bytes::Bytes;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::error::DecodeError;
use crate::flags::Flags;
use crate::frame::{encode_frame_header, Frame, HEADER_LEN};

pub use auth::{Auth, AuthOk};
pub use cache::{
    CacheCondition, CacheConditionResult, CacheDelete, CacheDeleteIf, CacheEvent, CacheGet,
    CacheOk, CachePut, CachePutIf, CacheValue, CacheWatch, CacheWatchLagged, CacheWatchStarted,
    CounterAdd, CounterGet, CounterValue,
};
pub use commit::{Commit, CommitOk, StateChange, StateGet, StateValue};
pub use error::{ErrorDetail, ErrorMessage, Extension, NotLeader, Unsupported};
pub use group::{
    GroupAck, GroupDeadLetter, GroupDeadLetterList, GroupDeadLetters, GroupDelete, GroupDeleted,
    GroupDescribe, GroupDiscard, GroupExtend, GroupExtended, GroupInfo, GroupNack, GroupPoll,
    GroupPosition, GroupRecord, GroupRecords, GroupRedrive, GroupSeek,
};
pub use inspect::{
    InspectedAssignment, InspectedFence, InspectedLease, InspectedReplica, InspectedSubscription,
    ShardInspect, ShardInspectInfo, ShardInspection, SubscriptionCursor, SubscriptionFilter,
    SubscriptionsList, SubscriptionsListInfo,
};
pub use publish::{
    AckMode, ProducerInit, ProducerInitOk, Publish, PublishBatch, PublishError, PublishIdempotent,
    PublishIf, PublishOk, PublishRefusalReason, PublishRefused, PublishWidth,
};
pub use query::{
    BrokerEndpoint, CacheShards, CacheShardsView, OffsetForTime, OffsetValue, ShardKind,
    ShardOwner, ShardOwners, ShardOwnersView, StreamRead, StreamRecord, StreamRecords,
    StreamShards, StreamShardsView, TopologyView,
};
pub use subscribe::{
    CursorErrorReason, Event, EventBatch, EventStreamHello, ShardMoved, Start, StreamDeleted,
    Subscribe, SubscribeCursorError, Subscribed, SubscriptionLagged,
};

/// A message whose `type` this crate does not know. Carried, not refused: the broker
/// answers it with `unsupported`, echoing `request_type` and `request_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct UnknownMessage {
    /// The `type` as it arrived.
    pub request_type: String,
    /// The `request_id`, when it was present and a `u64`.
    pub request_id: Option<u64>,
}

macro_rules! request_id_of {
    (required, $m:expr) => {
        Some($m.request_id)
    };
    (optional, $m:expr) => {
        $m.request_id
    };
    (none, $m:expr) => {{
        let _ = $m;
        None
    }};
}

/// Declares the catalogue once: the enum, the type names, and the encode and decode
/// dispatch all come from this list, so they cannot disagree.
macro_rules! messages {
    (
        units { $( $uvariant:ident = $uname:literal, )* }
        structs { $( $variant:ident($ty:ident) = $name:literal, $rid:ident; )* }
    ) => {
        /// One JSON control message. See the [module docs](self) for the conventions.
        #[derive(Debug, Clone, PartialEq)]
        #[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
        pub enum Message {
            $( #[doc = concat!("`", $uname, "`")] $uvariant, )*
            $( #[doc = concat!("`", $name, "`")] $variant($ty), )*
            /// Any other `type`.
            Unknown(UnknownMessage),
        }

        /// Every wire `type` [`Message::decode`] knows.
        pub const MESSAGE_TYPES: &[&str] = &[ $( $uname, )* $( $name, )* ];

        impl Message {
            /// The wire `type`.
            pub fn type_name(&self) -> &str {
                match self {
                    $( Message::$uvariant => $uname, )*
                    $( Message::$variant(_) => $name, )*
                    Message::Unknown(u) => &u.request_type,
                }
            }

            /// The `request_id` the message carries, if its type has one and it is set.
            pub fn request_id(&self) -> Option<u64> {
                match self {
                    $( Message::$uvariant => None, )*
                    $( Message::$variant(m) => request_id_of!($rid, m), )*
                    Message::Unknown(u) => u.request_id,
                }
            }

            /// Appends the JSON payload to `out`.
            pub fn encode_into(&self, out: &mut Vec<u8>) {
                match self {
                    $( Message::$uvariant => write_unit(out, $uname), )*
                    $( Message::$variant(m) => write_tagged(out, $name, m), )*
                    Message::Unknown(u) => write_unknown(out, u),
                }
            }
        }

        /// Decodes the fields after `type` as the message `type_name` names.
        fn decode_body<'de, D: Deserializer<'de>>(
            type_name: &str,
            body: D,
        ) -> Result<Message, D::Error> {
            Ok(match type_name {
                $( $uname => {
                    IgnoredAny::deserialize(body)?;
                    Message::$uvariant
                } )*
                $( $name => Message::$variant($ty::deserialize(body)?), )*
                other => Message::Unknown(UnknownMessage {
                    request_type: other.to_owned(),
                    request_id: UnknownBody::deserialize(body)?.request_id,
                }),
            })
        }
    };
}

messages! {
    units {
        Ok = "ok",
        Topology = "topology",
    }
    structs {
        Auth(Auth) = "auth", none;
        AuthOk(AuthOk) = "auth_ok", none;
        Error(ErrorMessage) = "error", none;
        NotLeader(NotLeader) = "not_leader", none;
        Unsupported(Unsupported) = "unsupported", optional;
        Extension(Extension) = "extension", optional;

        Publish(Publish) = "publish", optional;
        PublishBatch(PublishBatch) = "publish_batch", optional;
        PublishOk(PublishOk) = "publish_ok", required;
        PublishError(PublishError) = "publish_error", required;
        PublishRefused(PublishRefused) = "publish_refused", required;
        ProducerInit(ProducerInit) = "producer_init", required;
        ProducerInitOk(ProducerInitOk) = "producer_init_ok", required;
        PublishIdempotent(PublishIdempotent) = "publish_idempotent", required;
        PublishIf(PublishIf) = "publish_if", required;
        PublishWidth(PublishWidth) = "publish_width", none;

        Commit(Commit) = "commit", required;
        CommitOk(CommitOk) = "commit_ok", required;
        StateGet(StateGet) = "state_get", required;
        StateValue(StateValue) = "state_value", required;

        Subscribe(Subscribe) = "subscribe", none;
        Subscribed(Subscribed) = "subscribed", none;
        SubscribeCursorError(SubscribeCursorError) = "subscribe_cursor_error", none;
        EventStreamHello(EventStreamHello) = "event_stream_hello", none;
        Event(Event) = "event", none;
        EventBatch(EventBatch) = "event_batch", none;
        SubscriptionLagged(SubscriptionLagged) = "subscription_lagged", none;
        ShardMoved(ShardMoved) = "shard_moved", none;
        StreamDeleted(StreamDeleted) = "stream_deleted", none;

        CachePut(CachePut) = "cache_put", optional;
        CacheGet(CacheGet) = "cache_get", optional;
        CacheDelete(CacheDelete) = "cache_delete", optional;
        CacheValue(CacheValue) = "cache_value", optional;
        CacheOk(CacheOk) = "cache_ok", required;
        CachePutIf(CachePutIf) = "cache_put_if", required;
        CacheDeleteIf(CacheDeleteIf) = "cache_delete_if", required;
        CacheConditionResult(CacheConditionResult) = "cache_condition_result", required;
        CacheWatch(CacheWatch) = "cache_watch", none;
        CacheWatchStarted(CacheWatchStarted) = "cache_watch_started", none;
        CacheEvent(CacheEvent) = "cache_event", none;
        CacheWatchLagged(CacheWatchLagged) = "cache_watch_lagged", none;
        CounterAdd(CounterAdd) = "counter_add", required;
        CounterGet(CounterGet) = "counter_get", required;
        CounterValue(CounterValue) = "counter_value", required;

        GroupPoll(GroupPoll) = "group_poll", required;
        GroupRecords(GroupRecords) = "group_records", required;
        GroupAck(GroupAck) = "group_ack", required;
        GroupNack(GroupNack) = "group_nack", required;
        GroupExtend(GroupExtend) = "group_extend", required;
        GroupExtended(GroupExtended) = "group_extended", required;
        GroupDeadLetter(GroupDeadLetter) = "group_dead_letter", required;
        GroupDeadLetters(GroupDeadLetters) = "group_dead_letters", required;
        GroupDeadLetterList(GroupDeadLetterList) = "group_dead_letter_list", required;
        GroupDiscard(GroupDiscard) = "group_discard", required;
        GroupRedrive(GroupRedrive) = "group_redrive", required;
        GroupSeek(GroupSeek) = "group_seek", required;
        GroupPosition(GroupPosition) = "group_position", required;
        GroupDescribe(GroupDescribe) = "group_describe", required;
        GroupInfo(GroupInfo) = "group_info", required;
        GroupDelete(GroupDelete) = "group_delete", required;
        GroupDeleted(GroupDeleted) = "group_deleted", required;

        StreamRead(StreamRead) = "stream_read", required;
        StreamRecords(StreamRecords) = "stream_records", required;
        OffsetForTime(OffsetForTime) = "offset_for_time", required;
        OffsetValue(OffsetValue) = "offset_value", required;
        StreamShards(StreamShards) = "stream_shards", required;
        StreamShardsView(StreamShardsView) = "stream_shards_view", required;
        CacheShards(CacheShards) = "cache_shards", required;
        CacheShardsView(CacheShardsView) = "cache_shards_view", required;
        ShardOwners(ShardOwners) = "shard_owners", required;
        ShardOwnersView(ShardOwnersView) = "shard_owners_view", required;
        TopologyView(TopologyView) = "topology_view", none;

        ShardInspect(ShardInspect) = "shard_inspect", required;
        ShardInspectInfo(ShardInspectInfo) = "shard_inspect_info", required;
        SubscriptionsList(SubscriptionsList) = "subscriptions_list", required;
        SubscriptionsListInfo(SubscriptionsListInfo) = "subscriptions_list_info", required;
    }
}

impl Message {
    /// Decodes a JSON payload in one pass.
    ///
    /// Invalid UTF-8, invalid JSON, a missing or non-string `type`, a missing required field
    /// or a field of the wrong type is [`DecodeError::InvalidJson`]; a byte field that is not
    /// standard padded base64 is [`DecodeError::InvalidBase64`]. An unknown `type` is
    /// [`Message::Unknown`].
    pub fn decode(payload: &[u8]) -> Result<Message, DecodeError> {
        // The spec requires the whole payload to be UTF-8, including fields we skip, which
        // serde_json would not check; after this, `from_str` skips its own validation.
        let text = std::str::from_utf8(payload).map_err(|e| DecodeError::InvalidJson {
            detail: format!("payload is not UTF-8: {e}"),
        })?;
        serde_json::from_str(text).map_err(classify_error)
    }

    /// The JSON payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        self.encode_into(&mut out);
        out
    }

    /// The message as a JSON frame (flags `0`).
    pub fn to_frame(&self) -> Frame {
        Frame::new(Flags::NONE, Bytes::from(self.encode()))
    }

    /// Appends the whole frame, header and payload, to `out`, encoding the payload in place.
    pub fn encode_frame_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; HEADER_LEN]);
        self.encode_into(out);
        let len = out.len() - start - HEADER_LEN;
        let mut header = &mut out[start..start + HEADER_LEN];
        encode_frame_header(Flags::NONE, len, &mut header);
    }
}

impl From<ErrorMessage> for Message {
    fn from(e: ErrorMessage) -> Self {
        Message::Error(e)
    }
}

fn classify_error(e: serde_json::Error) -> DecodeError {
    let text = e.to_string();
    match text.strip_prefix(fields::BASE64_ERROR_PREFIX) {
        Some(detail) => DecodeError::InvalidBase64 {
            detail: detail.to_owned(),
        },
        None => DecodeError::InvalidJson { detail: text },
    }
}

/// `{"type":"<name>"` — callers close the object.
fn write_type_prefix(out: &mut Vec<u8>, type_name: &'static str) {
    // Catalogue names are plain snake_case ASCII: nothing to escape.
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(type_name.as_bytes());
    out.push(b'"');
}

fn write_unit(out: &mut Vec<u8>, type_name: &'static str) {
    write_type_prefix(out, type_name);
    out.push(b'}');
}

/// Writes `type` and then the struct's own fields into the same object: the struct is
/// serialized in place and its opening brace becomes the separator.
fn write_tagged<T: Serialize>(out: &mut Vec<u8>, type_name: &'static str, body: &T) {
    write_type_prefix(out, type_name);
    let at = out.len();
    serde_json::to_writer(&mut *out, body).expect("message fields serialize infallibly into a Vec");
    if out.len() - at == 2 {
        // `{}`: every field was left out.
        out.truncate(at);
        out.push(b'}');
    } else {
        out[at] = b',';
    }
}

fn write_unknown(out: &mut Vec<u8>, u: &UnknownMessage) {
    out.extend_from_slice(b"{\"type\":");
    serde_json::to_writer(&mut *out, &u.request_type).expect("a string serializes infallibly");
    if let Some(id) = u.request_id {
        write!(out, ",\"request_id\":{id}").expect("writing to a Vec cannot fail");
    }
    out.push(b'}');
}

/// What an unknown message is mined for.
#[derive(Deserialize)]
struct UnknownBody {
    #[serde(default, deserialize_with = "fields::lenient_u64::deserialize")]
    request_id: Option<u64>,
}

/// Reads a string, borrowing it from the input when it has no escapes.
struct StrSeed(&'static str);

impl<'de> DeserializeSeed<'de> for StrSeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for StrSeed {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(s))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s.to_owned()))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s))
    }
}

const TYPE_EXPECTED: &str = "the message `type` as a string";

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(MessageVisitor)
    }
}

struct MessageVisitor;

impl<'de> Visitor<'de> for MessageVisitor {
    type Value = Message;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object with a string `type`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message, A::Error> {
        let Some(first) = map.next_key_seed(StrSeed("a field name"))? else {
            return Err(de::Error::missing_field("type"));
        };
        if first == "type" {
            // Every encoder we know puts `type` first: decode the rest straight from the
            // parser, with nothing buffered.
            let type_name = map.next_value_seed(StrSeed(TYPE_EXPECTED))?;
            return decode_body(&type_name, MapAccessDeserializer::new(map));
        }
        // `type` comes later: buffer the object, then decode from the buffer.
        let mut object = serde_json::Map::new();
        object.insert(first.into_owned(), map.next_value()?);
        while let Some((key, value)) = map.next_entry::<String, serde_json::Value>()? {
            object.insert(key, value);
        }
        let type_name = match object.remove("type") {
            Some(serde_json::Value::String(s)) => s,
            Some(other) => {
                return Err(de::Error::custom(format_args!(
                    "invalid type: {other}, expected {TYPE_EXPECTED}"
                )))
            }
            None => return Err(de::Error::missing_field("type")),
        };
        decode_body(&type_name, serde_json::Value::Object(object)).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(json: &str) -> Message {
        let m = Message::decode(json.as_bytes()).unwrap_or_else(|e| panic!("{json}: {e}"));
        assert_eq!(String::from_utf8(m.encode()).unwrap(), json, "re-encode");
        m
    }

    #[test]
    fn type_names_are_unique_and_match_variants() {
        let mut seen = std::collections::HashSet::new();
        for name in MESSAGE_TYPES {
            assert!(seen.insert(*name), "duplicate {name}");
            let m = Message::decode(format!("{{\"type\":\"{name}\"}}").as_bytes());
            // Either it decodes (no required fields) or it fails on a field, never Unknown.
            if let Ok(m) = m {
                assert_eq!(m.type_name(), *name);
                assert!(!matches!(m, Message::Unknown(_)));
            }
        }
        assert_eq!(MESSAGE_TYPES.len(), 78);
    }

    #[test]
    fn unit_messages() {
        assert_eq!(round_trip(r#"{"type":"ok"}"#), Message::Ok);
        assert_eq!(round_trip(r#"{"type":"topology"}"#), Message::Topology);
        // Extra fields on a unit message are ignored.
        assert_eq!(
            Message::decode(br#"{"type":"ok","x":[1,{"y":2}]}"#).unwrap(),
            Message::Ok
        );
    }

    #[test]
    fn type_not_first_decodes_the_same() {
        let late = Message::decode(br#"{"request_id":4,"type":"cache_ok"}"#).unwrap();
        assert_eq!(late, Message::CacheOk(CacheOk { request_id: 4 }));
        let late = Message::decode(br#"{"value":"aGk=","request_id":2,"type":"state_value"}"#);
        assert_eq!(
            late.unwrap(),
            Message::StateValue(StateValue {
                value: Some(Bytes::from_static(b"hi")),
                version: None,
                as_of: None,
                request_id: 2
            })
        );
        let err = Message::decode(br#"{"value":"a","request_id":2,"type":"state_value"}"#);
        assert!(
            matches!(err, Err(DecodeError::InvalidBase64 { .. })),
            "{err:?}"
        );
        let err = Message::decode(br#"{"request_id":2,"type":7}"#).unwrap_err();
        assert!(matches!(err, DecodeError::InvalidJson { .. }), "{err:?}");
        let late = Message::decode(br#"{"request_id":9,"type":"brand_new"}"#).unwrap();
        assert_eq!(
            late,
            Message::Unknown(UnknownMessage {
                request_type: "brand_new".into(),
                request_id: Some(9)
            })
        );
    }

    #[test]
    fn escaped_type_is_read() {
        let m = Message::decode(br#"{"type":"c\u0061che_ok","request_id":1}"#).unwrap();
        assert_eq!(m, Message::CacheOk(CacheOk { request_id: 1 }));
    }

    #[test]
    fn request_ids() {
        assert_eq!(
            round_trip(r#"{"type":"cache_ok","request_id":2}"#).request_id(),
            Some(2)
        );
        assert_eq!(round_trip(r#"{"type":"ok"}"#).request_id(), None);
        let get = r#"{"type":"cache_get","tenant_id":"t","namespace":"n","cache":"c","key":"k"}"#;
        assert_eq!(round_trip(get).request_id(), None);
        let m = Message::decode(br#"{"type":"nope","request_id":"seven"}"#).unwrap();
        assert_eq!(m.request_id(), None, "a non-integer request_id is not one");
    }

    #[test]
    fn unknown_encodes_and_escapes_its_type() {
        let m = Message::Unknown(UnknownMessage {
            request_type: "we\"ird".into(),
            request_id: Some(3),
        });
        let bytes = m.encode();
        assert_eq!(bytes, br#"{"type":"we\"ird","request_id":3}"#);
        assert_eq!(Message::decode(&bytes).unwrap(), m);
    }

    #[test]
    fn frame_encodings_agree() {
        let m = Message::CacheOk(CacheOk { request_id: 2 });
        let mut out = vec![0xAA];
        m.encode_frame_into(&mut out);
        assert_eq!(&out[1..], &m.to_frame().to_bytes()[..]);
        assert_eq!(out[0], 0xAA);
    }

    #[test]
    fn auth_answer_converts() {
        use crate::negotiate::AuthAnswer;
        assert_eq!(Message::from(AuthAnswer::Ok), Message::Ok);
        let m = Message::from(AuthAnswer::AuthOk {
            server_flags: 63,
            server_features: None,
            server_features_hi: None,
            publish_window: Some(256),
        });
        assert_eq!(
            m.encode(),
            br#"{"type":"auth_ok","server_flags":63,"publish_window":256}"#
        );
    }
}
