//! Property tests for the JSON messages: arbitrary messages survive encode → decode →
//! encode unchanged, and no input makes the decoder panic.

use std::collections::BTreeSet;

use arbitrary::{Arbitrary, Unstructured};
use felix_proto::message::{Message, MESSAGE_TYPES};
use proptest::prelude::*;
use serde_json::Value;

/// An arbitrary message, or `None` when the bytes ran out or it is an `Unknown` whose type
/// collides with a known one (that decodes as the known type, by design).
fn message_from(data: &[u8]) -> Option<Message> {
    let m = Message::arbitrary(&mut Unstructured::new(data)).ok()?;
    match &m {
        Message::Unknown(u) if MESSAGE_TYPES.contains(&u.request_type.as_str()) => None,
        _ => Some(m),
    }
}

fn assert_round_trip(m: &Message) {
    let bytes = m.encode();
    let back = Message::decode(&bytes).unwrap_or_else(|e| {
        panic!(
            "{m:?} encoded as {} fails to decode: {e}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert_eq!(&back, m, "decoded from {}", String::from_utf8_lossy(&bytes));
    assert_eq!(back.encode(), bytes, "re-encoded");
    assert_eq!(back.type_name(), m.type_name());
    assert_eq!(back.request_id(), m.request_id());
}

/// Deterministic sweep: enough generated messages that every type in the catalogue is
/// exercised at least once, each round-tripping exactly.
#[test]
fn every_message_type_round_trips_from_arbitrary_values() {
    let mut seen = BTreeSet::new();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut buf = vec![0u8; 768];
    for _ in 0..20_000 {
        for b in buf.iter_mut() {
            // xorshift64*: cheap, reproducible bytes.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            *b = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8;
        }
        if let Some(m) = message_from(&buf) {
            assert_round_trip(&m);
            if !matches!(m, Message::Unknown(_)) {
                seen.insert(m.type_name().to_owned());
            }
        }
        if seen.len() == MESSAGE_TYPES.len() {
            break;
        }
    }
    let missing: Vec<_> = MESSAGE_TYPES
        .iter()
        .filter(|t| !seen.contains(**t))
        .collect();
    assert!(missing.is_empty(), "never generated: {missing:?}");
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        "[a-zA-Z0-9+/=_ ]{0,12}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,16}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Field names the catalogue uses, so random objects hit real fields often.
const FIELD_NAMES: &[&str] = &[
    "tenant_id",
    "namespace",
    "stream",
    "cache",
    "key",
    "value",
    "payload",
    "payloads",
    "request_id",
    "ttl_ms",
    "start",
    "shard",
    "offset",
    "token",
    "client_flags",
    "client_features",
    "server_flags",
    "message",
    "code",
    "retry",
    "detail",
    "reason",
    "condition",
    "version",
    "records",
    "changes",
    "entity_key",
    "event",
    "body",
    "view",
    "subscription_id",
    "delta",
    "group",
    "max_records",
    "kind",
    "name",
    "owners",
    "brokers",
];

fn message_like_object() -> impl Strategy<Value = Value> {
    let field = prop_oneof![
        prop::sample::select(FIELD_NAMES).prop_map(str::to_owned),
        "[a-z_]{1,10}",
    ];
    (
        prop::sample::select(MESSAGE_TYPES),
        prop::collection::btree_map(field, json_value(), 0..10),
    )
        .prop_map(|(type_name, fields)| {
            let mut object = serde_json::Map::new();
            object.insert("type".into(), Value::from(type_name));
            object.extend(fields);
            Value::Object(object)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_messages_round_trip(data in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Some(m) = message_from(&data) {
            assert_round_trip(&m);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = Message::decode(&data);
    }

    /// Objects shaped like messages (a known `type`, plausible field names, random values):
    /// decoding never panics, and whatever decodes is stable under re-encoding.
    #[test]
    fn message_like_objects_decode_stably(object in message_like_object()) {
        let bytes = serde_json::to_vec(&object).unwrap();
        if let Ok(m) = Message::decode(&bytes) {
            assert_round_trip(&m);
        }
    }

    /// Valid frames, truncated or with one byte changed, never panic the decoder.
    #[test]
    fn damaged_messages_never_panic(
        data in prop::collection::vec(any::<u8>(), 0..1024),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        if let Some(m) = message_from(&data) {
            let bytes = m.encode();
            let _ = Message::decode(&bytes[..cut.index(bytes.len() + 1)]);
            let mut changed = bytes.clone();
            changed[flip.index(bytes.len())] = byte;
            let _ = Message::decode(&changed);
        }
    }
}
