//! JSON control messages against the shared vectors, the frames the real client was seen
//! sending and accepting, the documented catalogue, and malformed input.

use std::path::PathBuf;

use bytes::Bytes;
use felix_proto::message::*;
use felix_proto::{DecodeError, ErrorCode, Flags, FrameHeader, RetryClass};

fn shared_reference() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference")
}

fn decode_ok(json: &str) -> Message {
    Message::decode(json.as_bytes()).unwrap_or_else(|e| panic!("{json}: {e}"))
}

/// Decodes `json`, checks it is `expected`, and that it re-encodes to exactly `json`.
fn assert_wire(json: &str, expected: Message) {
    let m = decode_ok(json);
    assert_eq!(m, expected, "decoded {json}");
    assert_eq!(String::from_utf8(m.encode()).unwrap(), json, "re-encoded");
}

/// Splits a captured frame, checks its header, and returns the payload.
fn frame_payload(frame: &[u8]) -> &[u8] {
    let header = FrameHeader::decode(frame[..12].try_into().unwrap(), u32::MAX).unwrap();
    assert_eq!(header.flags, Flags::NONE, "a JSON frame has flags 0");
    assert_eq!(header.length as usize, frame.len() - 12, "length field");
    &frame[12..]
}

fn invalid_json(payload: &[u8]) -> String {
    match Message::decode(payload) {
        Err(DecodeError::InvalidJson { detail }) => detail,
        other => panic!(
            "{:?}: expected InvalidJson, got {other:?}",
            String::from_utf8_lossy(payload)
        ),
    }
}

fn invalid_base64(payload: &str) -> String {
    match Message::decode(payload.as_bytes()) {
        Err(DecodeError::InvalidBase64 { detail }) => detail,
        other => panic!("{payload}: expected InvalidBase64, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Shared vectors

#[test]
fn every_json_vector_round_trips_byte_for_byte() {
    let dir = shared_reference().join("felix/vectors");
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let vector: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let kind = vector
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or("json_message");
        if kind != "json_message" || vector.get("payload_json").is_none() {
            continue;
        }
        let payload = hex::decode(vector["payload_hex"].as_str().unwrap()).unwrap();
        let frame = hex::decode(vector["frame_hex"].as_str().unwrap()).unwrap();
        assert_eq!(
            payload,
            vector["payload_json"].as_str().unwrap().as_bytes(),
            "vector {name}: payload_hex is payload_json"
        );
        let m = Message::decode(&payload).unwrap_or_else(|e| panic!("vector {name}: {e}"));
        assert_eq!(
            String::from_utf8(m.encode()).unwrap(),
            String::from_utf8(payload.clone()).unwrap(),
            "vector {name}: re-encoded payload"
        );
        assert_eq!(m.to_frame().to_bytes(), frame, "vector {name}: frame");
        let mut in_place = Vec::new();
        m.encode_frame_into(&mut in_place);
        assert_eq!(in_place, frame, "vector {name}: encode_frame_into");
        checked.push(name);
    }
    checked.sort();
    assert_eq!(
        checked,
        [
            "auth_extended_features",
            "auth_ok",
            "auth_ok_extended_features",
            "auth_with_capabilities",
            "cache_get",
            "cache_put",
            "cache_value",
            "error",
            "event",
            "ok",
            "publish",
            "subscribe",
        ]
    );
}

#[test]
fn vectors_decode_to_the_documented_values() {
    assert_eq!(
        decode_ok(
            r#"{"type":"auth","tenant_id":"t1","token":"demo-token","client_flags":25,"client_features":2147483649,"client_features_hi":1}"#
        ),
        Message::Auth(Auth {
            tenant_id: "t1".into(),
            token: "demo-token".into(),
            client_flags: Some(25),
            client_features: Some(2_147_483_649),
            client_features_hi: Some(1),
        })
    );
    assert_eq!(
        decode_ok(
            r#"{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"primary","key":"demo-key","value":"Y2FjaGVk","ttl_ms":1000}"#
        ),
        Message::CachePut(CachePut {
            tenant_id: "t1".into(),
            namespace: "default".into(),
            cache: "primary".into(),
            key: "demo-key".into(),
            value: Bytes::from_static(b"cached"),
            request_id: None,
            ttl_ms: Some(1000),
        })
    );
    assert_eq!(
        decode_ok(
            r#"{"type":"event","tenant_id":"t1","namespace":"default","stream":"demo","payload":"d29ybGQ="}"#
        ),
        Message::Event(Event {
            tenant_id: "t1".into(),
            namespace: "default".into(),
            stream: "demo".into(),
            payload: Bytes::from_static(b"world"),
            offset: None,
        })
    );
    assert_eq!(
        decode_ok(r#"{"type":"error","message":"oops"}"#),
        Message::Error(ErrorMessage::plain("oops"))
    );
}

// ---------------------------------------------------------------------------------------
// What the real client (felix-client 0.6.2) put on the wire: peer-client-wire.md

struct Capture {
    section: &'static str,
    hex: &'static str,
    expected: Message,
}

fn captures() -> Vec<Capture> {
    let t1 = || "t1".to_owned();
    let default = || "default".to_owned();
    vec![
        Capture {
            section: "§3 auth (127-byte payload)",
            hex: "464c5831000100000000007f7b2274797065223a2261757468222c2274656e616e745f6964223a227431222c22746f6b656e223a2270726f62652d746f6b656e222c22636c69656e745f666c616773223a383139312c22636c69656e745f6665617475726573223a343231383934353533352c22636c69656e745f66656174757265735f6869223a31357d",
            expected: Message::Auth(Auth {
                tenant_id: t1(),
                token: "probe-token".into(),
                client_flags: Some(8191),
                client_features: Some(4_218_945_535),
                client_features_hi: Some(15),
            }),
        },
        Capture {
            section: "§6 auth_ok",
            hex: "464c583100010000000000247b2274797065223a22617574685f6f6b222c227365727665725f666c616773223a36337d",
            expected: Message::AuthOk(AuthOk {
                server_flags: 63,
                server_features: None,
                server_features_hi: None,
                listener_ports: None,
                publish_window: None,
            }),
        },
        Capture {
            section: "§6 ok",
            hex: "464c5831000100000000000d7b2274797065223a226f6b227d",
            expected: Message::Ok,
        },
        Capture {
            section: "§6 subscribe",
            hex: "464c5831000100000000004d7b2274797065223a22737562736372696265222c2274656e616e745f6964223a227431222c226e616d657370616365223a2264656661756c74222c2273747265616d223a226f7264657273227d",
            expected: Message::Subscribe(Subscribe {
                tenant_id: t1(),
                namespace: default(),
                stream: "orders".into(),
                subscription_id: None,
                start: None,
                shard: None,
                queue_capacity: None,
            }),
        },
        Capture {
            section: "§6 subscribe start=earliest",
            hex: "464c583100010000000000607b2274797065223a22737562736372696265222c2274656e616e745f6964223a227431222c226e616d657370616365223a2264656661756c74222c2273747265616d223a226f7264657273222c227374617274223a226561726c69657374227d",
            expected: Message::Subscribe(Subscribe {
                tenant_id: t1(),
                namespace: default(),
                stream: "orders".into(),
                subscription_id: None,
                start: Some(Start::Earliest),
                shard: None,
                queue_capacity: None,
            }),
        },
        Capture {
            section: "§6 subscribed",
            hex: "464c5831000100000000002c7b2274797065223a2273756273637269626564222c22737562736372697074696f6e5f6964223a313030317d",
            expected: Message::Subscribed(Subscribed {
                subscription_id: 1001,
                start_offset: None,
                live_offset: None,
                queue_capacity: None,
            }),
        },
        Capture {
            section: "§6 event_stream_hello",
            hex: "464c583100010000000000347b2274797065223a226576656e745f73747265616d5f68656c6c6f222c22737562736372697074696f6e5f6964223a313030317d",
            expected: Message::EventStreamHello(EventStreamHello { subscription_id: 1001 }),
        },
        Capture {
            section: "§6 cache_put with ttl_ms null",
            hex: "464c5831000100000000007e7b2274797065223a2263616368655f707574222c2274656e616e745f6964223a227431222c226e616d657370616365223a2264656661756c74222c226361636865223a226331222c226b6579223a226b222c2276616c7565223a22646a453d222c22726571756573745f6964223a322c2274746c5f6d73223a6e756c6c7d",
            expected: Message::CachePut(CachePut {
                tenant_id: t1(),
                namespace: default(),
                cache: "c1".into(),
                key: "k".into(),
                value: Bytes::from_static(b"v1"),
                request_id: Some(2),
                ttl_ms: None,
            }),
        },
        Capture {
            section: "§6 cache_ok",
            hex: "464c583100010000000000227b2274797065223a2263616368655f6f6b222c22726571756573745f6964223a327d",
            expected: Message::CacheOk(CacheOk { request_id: 2 }),
        },
        Capture {
            section: "§6 cache_get",
            hex: "464c583100010000000000617b2274797065223a2263616368655f676574222c2274656e616e745f6964223a227431222c226e616d657370616365223a2264656661756c74222c226361636865223a226331222c226b6579223a226b222c22726571756573745f6964223a347d",
            expected: Message::CacheGet(CacheGet {
                tenant_id: t1(),
                namespace: default(),
                cache: "c1".into(),
                key: "k".into(),
                request_id: Some(4),
            }),
        },
        Capture {
            section: "§6 cache_value",
            hex: "464c583100010000000000727b2274797065223a2263616368655f76616c7565222c2274656e616e745f6964223a227431222c226e616d657370616365223a2264656661756c74222c226361636865223a226331222c226b6579223a226b222c2276616c7565223a22646a453d222c22726571756573745f6964223a347d",
            expected: Message::CacheValue(CacheValue {
                tenant_id: t1(),
                namespace: default(),
                cache: "c1".into(),
                key: "k".into(),
                value: Some(Bytes::from_static(b"v1")),
                request_id: Some(4),
                version: None,
            }),
        },
    ]
}

#[test]
fn captured_client_frames_round_trip_byte_for_byte() {
    for c in captures() {
        let frame = hex::decode(c.hex).unwrap();
        let payload = frame_payload(&frame);
        let m = Message::decode(payload).unwrap_or_else(|e| panic!("{}: {e}", c.section));
        assert_eq!(m, c.expected, "{}", c.section);
        assert_eq!(
            c.expected.to_frame().to_bytes(),
            frame,
            "{}: re-encoded frame",
            c.section
        );
    }
}

#[test]
fn captured_auth_offer_reads_as_the_client_meant_it() {
    // §3: features 0xFB77FFFF (above 2^31) with the extended marker, hi word 0xF.
    let Message::Auth(auth) = &captures()[0].expected else {
        unreachable!()
    };
    let offer = auth.offer();
    assert!(offer.reads_extended_word());
    assert!(offer.features().contains(felix_proto::Features::INSPECT));
    assert_eq!(offer.flags(), Some(Flags(0x1fff)));
}

/// §4 shows the frames the client sends with field values elided; these are the same
/// shapes with values filled in.
#[test]
fn client_request_shapes_from_section_4_decode() {
    assert_eq!(
        decode_ok(
            r#"{"type":"counter_add","tenant_id":"t1","namespace":"default","cache":"c1","key":"k","delta":5,"request_id":9}"#
        ),
        Message::CounterAdd(CounterAdd {
            tenant_id: "t1".into(),
            namespace: "default".into(),
            cache: "c1".into(),
            key: "k".into(),
            delta: 5,
            request_id: 9,
        })
    );
    // The probe answered with `request_id` first: order does not matter on decode.
    assert_eq!(
        decode_ok(r#"{"type":"counter_value","request_id":9,"value":5}"#),
        Message::CounterValue(CounterValue {
            value: Some(5),
            request_id: 9
        })
    );
    assert_wire(
        r#"{"type":"stream_shards","tenant_id":"t1","namespace":"default","stream":"orders","request_id":3}"#,
        Message::StreamShards(StreamShards {
            tenant_id: "t1".into(),
            namespace: "default".into(),
            stream: "orders".into(),
            request_id: 3,
        }),
    );
    assert_wire(
        r#"{"type":"stream_shards_view","shards":1,"request_id":3}"#,
        Message::StreamShardsView(StreamShardsView {
            shards: 1,
            request_id: 3,
            routing: None,
        }),
    );
    assert_wire(
        r#"{"type":"commit","tenant_id":"t1","namespace":"default","stream":"orders","entity_key":"ZTE=","event":"ZXY=","changes":[{"op":"put","key":"sk","value":"djE="},{"op":"delete","key":"old"}],"request_id":5}"#,
        Message::Commit(Commit {
            tenant_id: "t1".into(),
            namespace: "default".into(),
            stream: "orders".into(),
            entity_key: Bytes::from_static(b"e1"),
            shard: None,
            event: Bytes::from_static(b"ev"),
            changes: vec![
                StateChange::Put {
                    key: "sk".into(),
                    value: Bytes::from_static(b"v1"),
                },
                StateChange::Delete { key: "old".into() },
            ],
            request_id: 5,
            expected_offset: None,
        }),
    );
    assert_wire(
        r#"{"type":"state_value","value":null,"request_id":6}"#,
        Message::StateValue(StateValue {
            value: None,
            version: None,
            as_of: None,
            request_id: 6,
        }),
    );
    assert_wire(
        r#"{"type":"group_poll","tenant_id":"t1","namespace":"default","stream":"orders","shard":0,"group":"g1","max_records":32,"wait_ms":500,"request_id":7,"consumer":"c-1"}"#,
        Message::GroupPoll(GroupPoll {
            tenant_id: "t1".into(),
            namespace: "default".into(),
            stream: "orders".into(),
            shard: 0,
            group: "g1".into(),
            max_records: 32,
            wait_ms: Some(500),
            request_id: 7,
            consumer: Some("c-1".into()),
            reclaim: None,
            visibility_ms: None,
        }),
    );
    assert_wire(
        r#"{"type":"group_records","records":[{"offset":4,"payload":"aGk=","attempts":1}],"request_id":7}"#,
        Message::GroupRecords(GroupRecords {
            records: vec![GroupRecord {
                offset: 4,
                payload: Bytes::from_static(b"hi"),
                attempts: Some(1),
                skipped_before: None,
                publisher: None,
                timestamp_micros: None,
            }],
            request_id: 7,
        }),
    );
    assert_wire(
        r#"{"type":"group_nack","tenant_id":"t1","namespace":"default","stream":"orders","shard":0,"group":"g1","offset":4,"request_id":8,"attempts":1}"#,
        Message::GroupNack(GroupNack {
            tenant_id: "t1".into(),
            namespace: "default".into(),
            stream: "orders".into(),
            shard: 0,
            group: "g1".into(),
            offset: 4,
            request_id: 8,
            delay_ms: None,
            attempts: Some(1),
        }),
    );
    assert_wire(
        r#"{"type":"group_dead_letter_list","offsets":[],"request_id":9}"#,
        Message::GroupDeadLetterList(GroupDeadLetterList {
            offsets: vec![],
            request_id: 9,
        }),
    );
    assert_wire(
        r#"{"type":"cache_watch","tenant_id":"t1","namespace":"default","cache":"c1","prefix":"p/","retained":true}"#,
        Message::CacheWatch(CacheWatch {
            tenant_id: "t1".into(),
            namespace: "default".into(),
            cache: "c1".into(),
            key: None,
            prefix: Some("p/".into()),
            shard: None,
            from_offset: None,
            retained: Some(true),
            subscription_id: None,
        }),
    );
    assert_wire(
        r#"{"type":"cache_watch_started","subscription_id":3,"resume_offset":10,"retained_count":0}"#,
        Message::CacheWatchStarted(CacheWatchStarted {
            subscription_id: 3,
            resume_offset: 10,
            resnapshot: None,
            retained_count: Some(0),
        }),
    );
    assert_wire(
        r#"{"type":"shard_owners","tenant_id":"t1","namespace":"default","name":"orders","kind":"stream","request_id":1}"#,
        Message::ShardOwners(ShardOwners {
            tenant_id: "t1".into(),
            namespace: "default".into(),
            name: "orders".into(),
            kind: ShardKind::Stream,
            request_id: 1,
        }),
    );
    assert_wire(
        r#"{"type":"shard_owners_view","request_id":1,"owners":[]}"#,
        Message::ShardOwnersView(ShardOwnersView {
            request_id: 1,
            owners: vec![],
        }),
    );
    assert_wire(
        r#"{"type":"publish_width","tenant_id":"t1","namespace":"default","stream":"orders","shards":1}"#,
        Message::PublishWidth(PublishWidth {
            tenant_id: "t1".into(),
            namespace: "default".into(),
            stream: "orders".into(),
            shards: 1,
            routing: None,
        }),
    );
    assert_wire(
        r#"{"type":"topology_view","brokers":[]}"#,
        Message::TopologyView(TopologyView { brokers: vec![] }),
    );
}

// ---------------------------------------------------------------------------------------
// The documented catalogue

/// Every `"type": "<name>"` in protocol.md, the wire spec and the capture sheet is a
/// message this crate decodes.
#[test]
fn every_documented_type_is_in_the_catalogue() {
    let root = shared_reference();
    let docs = [
        root.join("felix/docs/protocol.md"),
        root.join("peer-client-wire.md"),
        root.join("../spec/000_98f6fc61393e745d.txt"),
    ];
    let mut found = std::collections::BTreeSet::new();
    for path in docs {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut rest = text.as_str();
        while let Some(at) = rest.find("\"type\"") {
            rest = &rest[at + 6..];
            let after = rest.trim_start_matches([' ', ':']);
            if let Some(quoted) = after.strip_prefix('"') {
                let name: String = quoted
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if quoted[name.len()..].starts_with('"') && !name.is_empty() {
                    found.insert(name);
                }
            }
        }
    }
    // Named in prose rather than as a `"type"` example.
    for prose in [
        "publish_error",
        "cache_watch_lagged",
        "group_ack",
        "topology",
    ] {
        found.insert(prose.to_owned());
    }
    assert!(found.len() >= 75, "the scan found too little: {found:?}");
    for name in &found {
        assert!(
            MESSAGE_TYPES.contains(&name.as_str()),
            "{name} is documented but not decoded"
        );
    }
}

#[test]
fn auth_ok_with_window_and_listener_ports() {
    assert_wire(
        r#"{"type":"auth_ok","server_flags":2047,"server_features":196132,"publish_window":256}"#,
        Message::AuthOk(AuthOk {
            server_flags: 2047,
            server_features: Some(196_132),
            server_features_hi: None,
            listener_ports: None,
            publish_window: Some(256),
        }),
    );
    let m = decode_ok(r#"{"type":"auth_ok","server_flags":63,"listener_ports":{"kafka":9092}}"#);
    let Message::AuthOk(ok) = &m else {
        panic!("{m:?}")
    };
    assert_eq!(ok.listener_ports, Some(serde_json::json!({"kafka": 9092})));
    assert_eq!(
        String::from_utf8(m.encode()).unwrap(),
        r#"{"type":"auth_ok","server_flags":63,"listener_ports":{"kafka":9092}}"#
    );
}

#[test]
fn coded_errors_carry_code_retry_and_detail() {
    assert_wire(
        r#"{"type":"error","message":"shard is moving","code":"shard_unavailable","retry":"retry","detail":{"reason":"moving","retry_after_ms":250}}"#,
        Message::Error(ErrorMessage {
            message: "shard is moving".into(),
            code: Some(ErrorCode::ShardUnavailable),
            retry: Some(RetryClass::Retry),
            detail: Some(ErrorDetail {
                reason: Some("moving".into()),
                retry_after_ms: Some(250),
            }),
        }),
    );
    assert_wire(
        r#"{"type":"publish_error","request_id":7,"message":"no","code":"brand_new_code","retry":"fatal","detail":{}}"#,
        Message::PublishError(PublishError {
            request_id: 7,
            message: "no".into(),
            code: Some(ErrorCode::Other("brand_new_code".into())),
            retry: Some(RetryClass::Fatal),
            detail: Some(ErrorDetail::default()),
        }),
    );
    // An unknown retry class is read as `fatal`.
    let m = decode_ok(r#"{"type":"error","message":"m","code":"overloaded","retry":"someday"}"#);
    assert_eq!(
        m,
        Message::Error(ErrorMessage {
            message: "m".into(),
            code: Some(ErrorCode::Overloaded),
            retry: Some(RetryClass::Fatal),
            detail: None,
        })
    );
    assert_eq!(
        Message::Error(ErrorMessage::coded(ErrorCode::Forbidden, "no")).encode(),
        br#"{"type":"error","message":"no","code":"forbidden","retry":"fatal"}"#
    );
}

#[test]
fn publish_refusal_reasons_are_strings_or_one_key_objects() {
    let cases = [
        (
            r#"{"sequence_gap":{"expected":4}}"#,
            PublishRefusalReason::SequenceGap { expected: 4 },
        ),
        (
            r#""unknown_producer""#,
            PublishRefusalReason::UnknownProducer,
        ),
        (
            r#""sequence_expired""#,
            PublishRefusalReason::SequenceExpired,
        ),
        (r#""sequence_reused""#, PublishRefusalReason::SequenceReused),
        (
            r#"{"offset_mismatch":{"tail":12}}"#,
            PublishRefusalReason::OffsetMismatch { tail: 12 },
        ),
        (
            r#"{"not_leader":{"node_id":"b","addr":"10.0.0.5:5000"}}"#,
            PublishRefusalReason::NotLeader {
                node_id: "b".into(),
                addr: Some("10.0.0.5:5000".into()),
            },
        ),
        (
            r#"{"not_leader":{"node_id":"b"}}"#,
            PublishRefusalReason::NotLeader {
                node_id: "b".into(),
                addr: None,
            },
        ),
    ];
    for (reason, expected) in cases {
        assert_wire(
            &format!(
                r#"{{"type":"publish_refused","request_id":3,"reason":{reason},"message":"refused"}}"#
            ),
            Message::PublishRefused(PublishRefused {
                request_id: 3,
                reason: expected,
                message: "refused".into(),
            }),
        );
    }
    invalid_json(br#"{"type":"publish_refused","request_id":3,"reason":"bogus","message":""}"#);
}

#[test]
fn idempotent_and_conditional_publishes() {
    assert_wire(
        r#"{"type":"producer_init","request_id":1}"#,
        Message::ProducerInit(ProducerInit { request_id: 1 }),
    );
    assert_wire(
        r#"{"type":"producer_init_ok","request_id":1,"producer_id":18446744073709551615}"#,
        Message::ProducerInitOk(ProducerInitOk {
            request_id: 1,
            producer_id: u64::MAX,
        }),
    );
    assert_wire(
        r#"{"type":"publish_idempotent","tenant_id":"t","namespace":"n","stream":"s","payloads":["YQ==","Yg=="],"key":"aw==","request_id":2,"producer_id":99,"sequence":0}"#,
        Message::PublishIdempotent(PublishIdempotent {
            tenant_id: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            payloads: vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")],
            key: Some(Bytes::from_static(b"k")),
            shard: None,
            request_id: 2,
            producer_id: 99,
            sequence: 0,
        }),
    );
    assert_wire(
        r#"{"type":"publish_if","tenant_id":"t","namespace":"n","stream":"s","payloads":[],"shard":2,"expected_offset":41,"request_id":3}"#,
        Message::PublishIf(PublishIf {
            tenant_id: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            payloads: vec![],
            key: None,
            shard: Some(2),
            expected_offset: 41,
            request_id: 3,
        }),
    );
    assert_wire(
        r#"{"type":"publish_batch","tenant_id":"t","namespace":"n","stream":"s","payloads":["YQ=="],"request_id":4,"ack":"per_batch"}"#,
        Message::PublishBatch(PublishBatch {
            tenant_id: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            payloads: vec![Bytes::from_static(b"a")],
            key: None,
            shard: None,
            request_id: Some(4),
            ack: Some(AckMode::PerBatch),
        }),
    );
    assert_wire(
        r#"{"type":"publish_ok","request_id":7,"offset":42}"#,
        Message::PublishOk(PublishOk {
            request_id: 7,
            offset: Some(42),
        }),
    );
}

#[test]
fn subscribe_starts_and_cursor_errors() {
    let base = r#"{"type":"subscribe","tenant_id":"t","namespace":"n","stream":"s""#;
    for (start, expected) in [
        (r#""latest""#, Start::Latest),
        (r#""earliest""#, Start::Earliest),
        (r#"{"offset":3}"#, Start::Offset(3)),
    ] {
        let json = format!(
            r#"{base},"subscription_id":5,"start":{start},"shard":1,"queue_capacity":64}}"#
        );
        assert_wire(
            &json,
            Message::Subscribe(Subscribe {
                tenant_id: "t".into(),
                namespace: "n".into(),
                stream: "s".into(),
                subscription_id: Some(5),
                start: Some(expected),
                shard: Some(1),
                queue_capacity: Some(64),
            }),
        );
    }
    invalid_json(format!(r#"{base},"start":"middle"}}"#).as_bytes());
    invalid_json(format!(r#"{base},"start":{{"ofset":3}}}}"#).as_bytes());
    invalid_json(format!(r#"{base},"start":{{"offset":-3}}}}"#).as_bytes());
    assert_wire(
        r#"{"type":"subscribe_cursor_error","reason":"too_old","requested":1,"available":7}"#,
        Message::SubscribeCursorError(SubscribeCursorError {
            reason: CursorErrorReason::TooOld,
            requested: 1,
            available: 7,
        }),
    );
    assert_wire(
        r#"{"type":"subscribed","subscription_id":1,"start_offset":7,"live_offset":7,"queue_capacity":64}"#,
        Message::Subscribed(Subscribed {
            subscription_id: 1,
            start_offset: Some(7),
            live_offset: Some(7),
            queue_capacity: Some(64),
        }),
    );
}

#[test]
fn event_stream_endings() {
    assert_wire(
        r#"{"type":"shard_moved","subscription_id":1,"resume_from":9,"node_id":"b","addr":"h:1","generation":3}"#,
        Message::ShardMoved(ShardMoved {
            subscription_id: 1,
            resume_from: Some(9),
            node_id: Some("b".into()),
            addr: Some("h:1".into()),
            generation: 3,
        }),
    );
    assert_wire(
        r#"{"type":"subscription_lagged","subscription_id":1,"resume_from":9}"#,
        Message::SubscriptionLagged(SubscriptionLagged {
            subscription_id: 1,
            resume_from: 9,
        }),
    );
    assert_wire(
        r#"{"type":"stream_deleted","subscription_id":1}"#,
        Message::StreamDeleted(StreamDeleted { subscription_id: 1 }),
    );
    assert_wire(
        r#"{"type":"event_batch","tenant_id":"t","namespace":"n","stream":"s","payloads":["YQ==",""],"base_offset":5}"#,
        Message::EventBatch(EventBatch {
            tenant_id: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            payloads: vec![Bytes::from_static(b"a"), Bytes::new()],
            base_offset: Some(5),
        }),
    );
    assert_wire(
        r#"{"type":"cache_event","key":"k","offset":3,"expires_at_millis":0}"#,
        Message::CacheEvent(CacheEvent {
            key: "k".into(),
            value: None,
            offset: 3,
            expires_at_millis: Some(0),
        }),
    );
    assert_wire(
        r#"{"type":"cache_watch_lagged","resume_from":11}"#,
        Message::CacheWatchLagged(CacheWatchLagged { resume_from: 11 }),
    );
}

#[test]
fn conditional_cache_writes_and_counters() {
    for (condition, expected) in [
        (r#""absent""#, CacheCondition::Absent),
        (r#"{"version":17}"#, CacheCondition::Version(17)),
    ] {
        assert_wire(
            &format!(
                r#"{{"type":"cache_put_if","tenant_id":"t","namespace":"n","cache":"c","key":"k","value":"eA==","ttl_ms":5,"condition":{condition},"request_id":1}}"#
            ),
            Message::CachePutIf(CachePutIf {
                tenant_id: "t".into(),
                namespace: "n".into(),
                cache: "c".into(),
                key: "k".into(),
                value: Bytes::from_static(b"x"),
                ttl_ms: Some(5),
                condition: expected,
                request_id: 1,
            }),
        );
    }
    invalid_json(br#"{"type":"cache_put_if","tenant_id":"t","namespace":"n","cache":"c","key":"k","value":"eA==","condition":"present","request_id":1}"#);
    assert_wire(
        r#"{"type":"cache_delete_if","tenant_id":"t","namespace":"n","cache":"c","key":"k","version":17,"request_id":2}"#,
        Message::CacheDeleteIf(CacheDeleteIf {
            tenant_id: "t".into(),
            namespace: "n".into(),
            cache: "c".into(),
            key: "k".into(),
            version: 17,
            request_id: 2,
        }),
    );
    assert_wire(
        r#"{"type":"cache_condition_result","applied":false,"version":17,"request_id":2}"#,
        Message::CacheConditionResult(CacheConditionResult {
            applied: false,
            version: Some(17),
            request_id: 2,
        }),
    );
    // A miss keeps `value` on the wire as null; a hit to a conditional client has `version`.
    assert_wire(
        r#"{"type":"cache_value","tenant_id":"t","namespace":"n","cache":"c","key":"k","value":null,"request_id":3}"#,
        Message::CacheValue(CacheValue {
            tenant_id: "t".into(),
            namespace: "n".into(),
            cache: "c".into(),
            key: "k".into(),
            value: None,
            request_id: Some(3),
            version: None,
        }),
    );
    assert_wire(
        r#"{"type":"cache_value","tenant_id":"t","namespace":"n","cache":"c","key":"k","value":"eA==","request_id":3,"version":9}"#,
        Message::CacheValue(CacheValue {
            tenant_id: "t".into(),
            namespace: "n".into(),
            cache: "c".into(),
            key: "k".into(),
            value: Some(Bytes::from_static(b"x")),
            request_id: Some(3),
            version: Some(9),
        }),
    );
    assert_wire(
        r#"{"type":"counter_add","tenant_id":"t","namespace":"n","cache":"c","key":"k","delta":-9223372036854775808,"request_id":4}"#,
        Message::CounterAdd(CounterAdd {
            tenant_id: "t".into(),
            namespace: "n".into(),
            cache: "c".into(),
            key: "k".into(),
            delta: i64::MIN,
            request_id: 4,
        }),
    );
    assert_wire(
        r#"{"type":"counter_value","request_id":4}"#,
        Message::CounterValue(CounterValue {
            value: None,
            request_id: 4,
        }),
    );
    assert_wire(
        r#"{"type":"counter_value","value":-3,"request_id":4}"#,
        Message::CounterValue(CounterValue {
            value: Some(-3),
            request_id: 4,
        }),
    );
}

#[test]
fn group_administration() {
    assert_wire(
        r#"{"type":"group_seek","tenant_id":"t","namespace":"n","stream":"s","shard":0,"group":"g","start":{"offset":5},"if_new":true,"request_id":1}"#,
        Message::GroupSeek(GroupSeek {
            tenant_id: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            shard: 0,
            group: "g".into(),
            start: Start::Offset(5),
            if_new: Some(true),
            request_id: 1,
        }),
    );
    assert_wire(
        r#"{"type":"group_position","offset":5,"moved":false,"request_id":1}"#,
        Message::GroupPosition(GroupPosition {
            offset: 5,
            moved: false,
            request_id: 1,
        }),
    );
    assert_wire(
        r#"{"type":"group_info","tail":9,"in_flight":1,"owed":0,"dead_letters":2,"request_id":2}"#,
        Message::GroupInfo(GroupInfo {
            committed: None,
            tail: 9,
            in_flight: 1,
            owed: 0,
            dead_letters: 2,
            request_id: 2,
        }),
    );
    assert_wire(
        r#"{"type":"group_extend","tenant_id":"t","namespace":"n","stream":"s","shard":0,"group":"g","offset":4,"attempts":2,"extend_ms":3000,"request_id":3}"#,
        Message::GroupExtend(GroupExtend {
            tenant_id: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            shard: 0,
            group: "g".into(),
            offset: 4,
            attempts: 2,
            extend_ms: 3000,
            request_id: 3,
        }),
    );
    assert_wire(
        r#"{"type":"group_extended","visible_ms":3000,"request_id":3}"#,
        Message::GroupExtended(GroupExtended {
            visible_ms: 3000,
            request_id: 3,
        }),
    );
    assert_wire(
        r#"{"type":"group_deleted","existed":true,"request_id":4}"#,
        Message::GroupDeleted(GroupDeleted {
            existed: true,
            request_id: 4,
        }),
    );
    let m = decode_ok(
        r#"{"type":"group_describe","tenant_id":"t","namespace":"n","stream":"s","shard":1,"group":"g","request_id":5}"#,
    );
    assert_eq!(m.request_id(), Some(5));
    assert!(matches!(
        m,
        Message::GroupDescribe(GroupDescribe { shard: 1, .. })
    ));
}

#[test]
fn reads_shards_owners_and_redirects() {
    assert_wire(
        r#"{"type":"stream_read","tenant_id":"t","namespace":"n","stream":"s","shard":0,"from":10,"end":20,"request_id":1}"#,
        Message::StreamRead(StreamRead {
            tenant_id: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            shard: 0,
            from: 10,
            end: Some(20),
            max_records: None,
            max_bytes: None,
            request_id: 1,
        }),
    );
    assert_wire(
        r#"{"type":"stream_records","records":[{"offset":10,"payload":"YQ==","publisher":"svc","timestamp_micros":1700000000000000}],"next_offset":11,"request_id":1}"#,
        Message::StreamRecords(StreamRecords {
            records: vec![StreamRecord {
                offset: 10,
                payload: Bytes::from_static(b"a"),
                publisher: Some("svc".into()),
                timestamp_micros: Some(1_700_000_000_000_000),
            }],
            next_offset: 11,
            request_id: 1,
        }),
    );
    assert_wire(
        r#"{"type":"offset_value","request_id":2}"#,
        Message::OffsetValue(OffsetValue {
            offset: None,
            request_id: 2,
        }),
    );
    assert_wire(
        r#"{"type":"stream_shards_view","shards":4,"request_id":3,"routing":"jump_hash"}"#,
        Message::StreamShardsView(StreamShardsView {
            shards: 4,
            request_id: 3,
            routing: Some(felix_proto::routing::RoutingMapping::JumpHash),
        }),
    );
    assert_wire(
        r#"{"type":"shard_owners_view","request_id":4,"owners":[{"shard":0,"node_id":"a","addr":"h:1","generation":2},{"shard":1,"unavailable":"moving"}]}"#,
        Message::ShardOwnersView(ShardOwnersView {
            request_id: 4,
            owners: vec![
                ShardOwner {
                    shard: 0,
                    node_id: Some("a".into()),
                    addr: Some("h:1".into()),
                    generation: Some(2),
                    unavailable: None,
                },
                ShardOwner {
                    shard: 1,
                    node_id: None,
                    addr: None,
                    generation: None,
                    unavailable: Some("moving".into()),
                },
            ],
        }),
    );
    assert_wire(
        r#"{"type":"not_leader","node_id":"broker-b","addr":"10.0.0.5:5000","generation":7}"#,
        Message::NotLeader(NotLeader {
            node_id: "broker-b".into(),
            addr: Some("10.0.0.5:5000".into()),
            generation: 7,
        }),
    );
    assert_wire(
        r#"{"type":"topology_view","brokers":[{"node_id":"broker-a","addr":"10.0.0.4:5000"}]}"#,
        Message::TopologyView(TopologyView {
            brokers: vec![BrokerEndpoint {
                node_id: "broker-a".into(),
                addr: "10.0.0.4:5000".into(),
            }],
        }),
    );
}

#[test]
fn unsupported_and_extension() {
    assert_wire(
        r#"{"type":"unsupported","request_type":"extension","extension":"x.y","request_id":4}"#,
        Message::Unsupported(Unsupported {
            request_type: "extension".into(),
            extension: Some("x.y".into()),
            request_id: Some(4),
        }),
    );
    assert_wire(
        r#"{"type":"extension","name":"x.y","request_id":4,"body":{"a":[1,"b",null],"z":false}}"#,
        Message::Extension(Extension {
            name: "x.y".into(),
            request_id: Some(4),
            body: serde_json::json!({"a": [1, "b", null], "z": false}),
        }),
    );
    assert_wire(
        r#"{"type":"extension","name":"x.y"}"#,
        Message::Extension(Extension {
            name: "x.y".into(),
            request_id: None,
            body: serde_json::Value::Null,
        }),
    );
}

#[test]
fn inspection_answers() {
    let json = r#"{"type":"shard_inspect_info","request_id":1,"view":{"node_id":"a","shards":2,"role":"leader","phase":"active","serving":true,"generation":4,"assignment":{"generation":4,"leader":"a","replicas":["a","b"]},"lease":{"held":true,"remaining_ms":900},"tail":10,"committed":9,"replicas":[{"node_id":"b","role":"follower","next_offset":10,"lag":0,"state":"shipping"}]}}"#;
    let m = decode_ok(json);
    let Message::ShardInspectInfo(info) = &m else {
        panic!("{m:?}")
    };
    assert_eq!(info.view.role, "leader");
    assert_eq!(info.view.replicas.len(), 1);
    assert_eq!(info.view.assignment.as_ref().unwrap().replicas, ["a", "b"]);
    assert_eq!(String::from_utf8(m.encode()).unwrap(), json);

    let json = r#"{"type":"subscriptions_list","request_id":2,"filter":{"stream":"s","dropping":true},"limit":10,"cursor":{"tenant_id":"t","namespace":"n","stream":"s","shard":0,"subscriber_id":5}}"#;
    let m = decode_ok(json);
    assert_eq!(String::from_utf8(m.encode()).unwrap(), json);
    let json = r#"{"type":"subscriptions_list_info","request_id":2,"node_id":"","subscriptions":[{"tenant_id":"t","namespace":"n","stream":"s","shard":0,"subscriber_id":6,"subscription_id":1001,"connection":3,"peer":"127.0.0.1:5000","principal":"svc","policy":"drop_new","depth":0,"capacity":512,"dropped":0,"tail":4,"age_ms":10}]}"#;
    let m = decode_ok(json);
    assert_eq!(String::from_utf8(m.encode()).unwrap(), json);
}

// ---------------------------------------------------------------------------------------
// Malformed input and leniency

#[test]
fn invalid_utf8_is_invalid_json() {
    let detail = invalid_json(b"{\"type\":\"ok\",\"x\":\"\xff\"}");
    assert!(detail.contains("UTF-8"), "{detail}");
    invalid_json(b"{\"type\":\"o\xc3\"}");
}

#[test]
fn invalid_json_is_invalid_json() {
    for bad in [
        &b""[..],
        b"{",
        b"{\"type\":",
        b"{\"type\":\"ok\"",
        b"{\"type\":\"ok\"}x",
        b"nul",
        b"{'type':'ok'}",
    ] {
        invalid_json(bad);
    }
}

#[test]
fn non_objects_are_invalid_json() {
    for bad in [&b"[]"[..], b"\"ok\"", b"1", b"null", b"true"] {
        invalid_json(bad);
    }
}

#[test]
fn missing_or_non_string_type_is_invalid_json() {
    assert!(invalid_json(b"{}").contains("type"));
    assert!(invalid_json(br#"{"request_id":1}"#).contains("type"));
    assert!(invalid_json(br#"{"type":1}"#).contains("type"));
    invalid_json(br#"{"type":null}"#);
    invalid_json(br#"{"type":["ok"]}"#);
}

#[test]
fn missing_required_field_is_invalid_json() {
    let detail = invalid_json(br#"{"type":"cache_ok"}"#);
    assert!(detail.contains("request_id"), "{detail}");
    let detail = invalid_json(br#"{"type":"auth","tenant_id":"t1"}"#);
    assert!(detail.contains("token"), "{detail}");
    let detail = invalid_json(br#"{"type":"event","tenant_id":"t","namespace":"n","stream":"s"}"#);
    assert!(detail.contains("payload"), "{detail}");
    invalid_json(br#"{"type":"commit","tenant_id":"t","namespace":"n","stream":"s","entity_key":"","event":"","changes":[{"op":"put","key":"k"}],"request_id":1}"#);
}

#[test]
fn wrong_field_types_are_invalid_json() {
    for bad in [
        r#"{"type":"auth","tenant_id":"t","token":"x","client_features":"many"}"#,
        r#"{"type":"auth","tenant_id":"t","token":"x","client_flags":-1}"#,
        r#"{"type":"auth","tenant_id":"t","token":"x","client_flags":1.5}"#,
        r#"{"type":"cache_ok","request_id":18446744073709551616}"#,
        r#"{"type":"cache_ok","request_id":"1"}"#,
        r#"{"type":"auth","tenant_id":7,"token":"x"}"#,
        r#"{"type":"publish_batch","tenant_id":"t","namespace":"n","stream":"s","payloads":"YQ=="}"#,
        r#"{"type":"publish","tenant_id":"t","namespace":"n","stream":"s","payload":"YQ==","ack":"always"}"#,
        r#"{"type":"group_position","offset":1,"moved":"yes","request_id":1}"#,
        r#"{"type":"counter_add","tenant_id":"t","namespace":"n","cache":"c","key":"k","delta":9223372036854775808,"request_id":1}"#,
        r#"{"type":"error","message":"m","code":5}"#,
        r#"{"type":"shard_owners","tenant_id":"t","namespace":"n","name":"x","kind":"topic","request_id":1}"#,
        r#"{"type":"stream_shards_view","shards":1,"request_id":1,"routing":"random"}"#,
    ] {
        invalid_json(bad.as_bytes());
    }
}

#[test]
fn malformed_base64_is_invalid_base64() {
    let event = |payload: &str| {
        format!(
            r#"{{"type":"event","tenant_id":"t","namespace":"n","stream":"s","payload":"{payload}"}}"#
        )
    };
    // Missing padding, bad symbol, bad length, non-canonical trailing bits.
    for bad in ["d29ybGQ", "d29y!GQ=", "d", "YR=="] {
        let detail = invalid_base64(&event(bad));
        assert!(!detail.is_empty());
    }
    // In a list, an optional field, a nested object and a tagged enum.
    invalid_base64(
        r#"{"type":"publish_batch","tenant_id":"t","namespace":"n","stream":"s","payloads":["YQ==","*"]}"#,
    );
    invalid_base64(
        r#"{"type":"cache_value","tenant_id":"t","namespace":"n","cache":"c","key":"k","value":"*"}"#,
    );
    invalid_base64(
        r#"{"type":"group_records","records":[{"offset":1,"payload":"*"}],"request_id":1}"#,
    );
    invalid_base64(
        r#"{"type":"commit","tenant_id":"t","namespace":"n","stream":"s","entity_key":"","event":"","changes":[{"op":"put","key":"k","value":"*"}],"request_id":1}"#,
    );
    // A base64 field of the wrong JSON type is a shape error, not a base64 one.
    invalid_json(event("").replace("\"\"}", "5}").as_bytes());
}

#[test]
fn unknown_type_is_carried_with_its_request_id() {
    assert_eq!(
        decode_ok(r#"{"type":"frobnicate","request_id":42,"whatever":{"deep":[1,2]}}"#),
        Message::Unknown(UnknownMessage {
            request_type: "frobnicate".into(),
            request_id: Some(42)
        })
    );
    assert_eq!(
        decode_ok(r#"{"type":"frobnicate"}"#),
        Message::Unknown(UnknownMessage {
            request_type: "frobnicate".into(),
            request_id: None
        })
    );
    let m = decode_ok(r#"{"type":"frobnicate","request_id":-1}"#);
    assert_eq!(m.request_id(), None);
    assert_eq!(m.type_name(), "frobnicate");
}

#[test]
fn unknown_fields_are_ignored() {
    assert_eq!(
        decode_ok(
            r#"{"type":"cache_ok","future":{"a":[1,{"b":null}]},"request_id":2,"x":"\u00e9"}"#
        ),
        Message::CacheOk(CacheOk { request_id: 2 })
    );
    let m = decode_ok(
        r#"{"type":"subscribe","tenant_id":"t","namespace":"n","stream":"s","start":{"offset":3,"hint":1},"new_field":true}"#,
    );
    let Message::Subscribe(s) = m else { panic!() };
    assert_eq!(s.start, Some(Start::Offset(3)));
    // Nested structs ignore unknown fields too.
    let m = decode_ok(
        r#"{"type":"topology_view","brokers":[{"node_id":"a","addr":"h:1","zone":"z"}]}"#,
    );
    assert_eq!(
        m,
        Message::TopologyView(TopologyView {
            brokers: vec![BrokerEndpoint {
                node_id: "a".into(),
                addr: "h:1".into()
            }]
        })
    );
}

#[test]
fn feature_words_above_2_31_and_2_32_decode() {
    for (lo, hi) in [
        (2_147_483_649u64, 1u64),
        (4_294_967_296, 4_294_967_297),
        (u64::MAX, u64::MAX),
    ] {
        let json = format!(
            r#"{{"type":"auth","tenant_id":"t","token":"x","client_flags":8191,"client_features":{lo},"client_features_hi":{hi}}}"#
        );
        let Message::Auth(auth) = decode_ok(&json) else {
            panic!()
        };
        assert_eq!(
            (auth.client_features, auth.client_features_hi),
            (Some(lo), Some(hi))
        );
        assert_eq!(Message::Auth(auth).encode(), json.as_bytes());
        let json = format!(
            r#"{{"type":"auth_ok","server_flags":63,"server_features":{lo},"server_features_hi":{hi}}}"#
        );
        let Message::AuthOk(ok) = decode_ok(&json) else {
            panic!()
        };
        assert_eq!(
            (ok.server_features, ok.server_features_hi),
            (Some(lo), Some(hi))
        );
    }
}

#[test]
fn cache_put_always_carries_ttl_and_accepts_it_missing() {
    let m = Message::CachePut(CachePut {
        tenant_id: "t".into(),
        namespace: "n".into(),
        cache: "c".into(),
        key: "k".into(),
        value: Bytes::new(),
        request_id: None,
        ttl_ms: None,
    });
    let json = r#"{"type":"cache_put","tenant_id":"t","namespace":"n","cache":"c","key":"k","value":"","ttl_ms":null}"#;
    assert_eq!(String::from_utf8(m.encode()).unwrap(), json);
    assert_eq!(
        decode_ok(
            r#"{"type":"cache_put","tenant_id":"t","namespace":"n","cache":"c","key":"k","value":""}"#
        ),
        m
    );
}

/// Byte fields are encoded on the stack up to 768 bytes and on the heap above: both sides of
/// that edge give the same standard padded base64 and read back to the same bytes.
#[test]
fn byte_fields_encode_alike_either_side_of_the_stack_buffer() {
    use base64::Engine as _;
    for len in [0usize, 1, 2, 766, 767, 768, 769, 770, 4096] {
        let value: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let b64 = base64::engine::general_purpose::STANDARD.encode(&value);
        assert_wire(
            &format!(
                r#"{{"type":"cache_value","tenant_id":"t","namespace":"n","cache":"c","key":"k","value":"{b64}","request_id":3}}"#
            ),
            Message::CacheValue(CacheValue {
                tenant_id: "t".into(),
                namespace: "n".into(),
                cache: "c".into(),
                key: "k".into(),
                value: Some(Bytes::from(value)),
                request_id: Some(3),
                version: None,
            }),
        );
    }
}
