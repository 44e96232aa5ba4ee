//! Binary layouts against the reference wire vectors and against frames captured from the
//! real client (felix-client 0.6.2, `peer-client-wire.md` §5 and §6).

use bytes::Bytes;
use felix_proto::binary::{
    encode_event_batch_frame, encode_publish_batch_frame, AckDetail, AckMode, AckOwner, AckResult,
    AckedPrefix, BinaryFrame, Event, EventBatch, EventBatchView, PublishAck, PublishBatch,
    PublishBatchView,
};
use felix_proto::{ErrorCode, Flags, Frame, FrameDecoder, RetryClass};
use serde_json::Value;

const VECTORS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/reference/felix/vectors"
);

/// One whole frame from hex, ignoring the spaces and `|` the capture sheet uses.
fn frame(hex_text: &str) -> (Bytes, Frame) {
    let clean: String = hex_text.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    let wire = Bytes::from(hex::decode(clean).expect("hex"));
    let mut decoder = FrameDecoder::new(u32::MAX);
    decoder.feed(&wire);
    let frame = decoder
        .next_frame()
        .expect("valid header")
        .expect("whole frame");
    assert_eq!(decoder.buffered(), 0, "one frame exactly");
    (wire, frame)
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn check_publish_vector(name: &str, v: &Value, flags: Flags, payload: &Bytes) {
    let batch = PublishBatch::decode(flags, payload).unwrap_or_else(|e| panic!("{name}: {e}"));
    match v.get("request_id").and_then(Value::as_u64) {
        Some(id) => {
            let acked = batch
                .acked
                .unwrap_or_else(|| panic!("{name}: no acked prefix"));
            assert_eq!(acked.request_id, id, "{name}: request_id");
            let mode = match str_field(v, "ack_mode") {
                Some("per_message") => AckMode::PerMessage,
                Some("per_batch") => AckMode::PerBatch,
                other => panic!("{name}: ack_mode {other:?}"),
            };
            assert_eq!(acked.ack_mode, mode, "{name}: ack_mode");
        }
        None => assert_eq!(batch.acked, None, "{name}: acked"),
    }
    assert_eq!(
        batch.key.as_deref(),
        str_field(v, "key_utf8").map(str::as_bytes),
        "{name}: key"
    );
    assert_eq!(
        Some(batch.tenant_id.as_str()),
        str_field(v, "tenant_id"),
        "{name}: tenant_id"
    );
    assert_eq!(
        Some(batch.namespace.as_str()),
        str_field(v, "namespace"),
        "{name}: namespace"
    );
    assert_eq!(
        Some(batch.stream.as_str()),
        str_field(v, "stream"),
        "{name}: stream"
    );
    let expected: Vec<&[u8]> = v["payloads_utf8"]
        .as_array()
        .unwrap_or_else(|| panic!("{name}: payloads_utf8"))
        .iter()
        .map(|p| p.as_str().expect("utf8 payload").as_bytes())
        .collect();
    let got: Vec<&[u8]> = batch.payloads.iter().map(|p| &p[..]).collect();
    assert_eq!(got, expected, "{name}: payloads");
    assert_eq!(batch.flags(), flags, "{name}: flags");

    // The hot-path encoder produces the same frame.
    let hot = encode_publish_batch_frame(&batch.header(), &batch.payloads);
    assert_eq!(hot, batch.to_frame().to_bytes(), "{name}: hot-path encoder");
}

fn check_ack_vector(name: &str, v: &Value, flags: Flags, payload: &Bytes) {
    let ack = PublishAck::decode(flags, payload).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        Some(ack.request_id),
        v["request_id"].as_u64(),
        "{name}: request_id"
    );
    match (str_field(v, "status"), &ack.result) {
        (Some("ok"), AckResult::Ok { offset: None }) => {
            assert!(
                v["message"].is_null(),
                "{name}: an ok vector with a message"
            );
        }
        (
            Some("error"),
            AckResult::Err {
                message,
                code: None,
                detail: None,
            },
        ) => {
            assert_eq!(
                Some(message.as_str()),
                str_field(v, "message"),
                "{name}: message"
            );
        }
        (status, result) => panic!("{name}: status {status:?} decoded as {result:?}"),
    }
    assert_eq!(ack.owner, None, "{name}: owner");
    assert_eq!(ack.flags(), flags, "{name}: flags");
}

#[test]
fn every_binary_reference_vector_decodes_and_reencodes_byte_for_byte() {
    let mut checked = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(VECTORS)
        .unwrap_or_else(|e| panic!("{VECTORS}: {e}"))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    entries.sort();
    for path in entries {
        let v: Value = serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        let Some(kind) = str_field(&v, "kind").filter(|k| k.starts_with("binary_")) else {
            continue;
        };
        let name = str_field(&v, "name").unwrap_or("?").to_owned();
        let flags = Flags(v["flags"].as_u64().expect("flags") as u16);
        let payload =
            Bytes::from(hex::decode(str_field(&v, "payload_hex").expect("payload_hex")).unwrap());
        let frame_hex = str_field(&v, "frame_hex").expect("frame_hex");

        let reencoded = match kind {
            "binary_publish_batch" | "binary_acked_publish_batch" => {
                check_publish_vector(&name, &v, flags, &payload);
                PublishBatch::decode(flags, &payload).unwrap().to_frame()
            }
            "binary_publish_ack" => {
                check_ack_vector(&name, &v, flags, &payload);
                PublishAck::decode(flags, &payload).unwrap().to_frame()
            }
            other => panic!("{name}: unknown binary vector kind {other}"),
        };
        assert_eq!(reencoded.flags, flags, "{name}: flags");
        assert_eq!(
            hex::encode(&reencoded.payload),
            str_field(&v, "payload_hex").unwrap(),
            "{name}: payload"
        );
        assert_eq!(
            hex::encode(reencoded.to_bytes()),
            frame_hex,
            "{name}: frame"
        );
        // The sibling .hex file holds the same frame.
        let hex_file = std::fs::read_to_string(path.with_extension("hex")).expect(".hex");
        assert_eq!(hex_file.trim(), frame_hex, "{name}: .hex file");
        // And dispatch picks the same layout.
        assert_eq!(
            BinaryFrame::decode(flags, &payload).unwrap().to_frame(),
            reencoded,
            "{name}"
        );
        checked.push(name);
    }
    assert_eq!(checked.len(), 5, "binary vectors checked: {checked:?}");
}

fn publish(wire_hex: &str) -> (Bytes, Frame, PublishBatch) {
    let (wire, frame) = frame(wire_hex);
    let batch = PublishBatch::decode(frame.flags, &frame.payload).expect("decodes");
    assert_eq!(batch.to_frame().to_bytes(), wire, "re-encodes identically");
    assert_eq!(
        encode_publish_batch_frame(&batch.header(), &batch.payloads),
        wire
    );
    let view = PublishBatchView::parse(frame.flags, &frame.payload).unwrap();
    assert_eq!(view.to_batch(), batch);
    (wire, frame, batch)
}

fn orders(
    acked: Option<AckedPrefix>,
    key: Option<&'static [u8]>,
    payload: &'static [u8],
) -> PublishBatch {
    PublishBatch {
        acked,
        idempotent: None,
        key: key.map(Bytes::from_static),
        tenant_id: "t1".into(),
        namespace: "default".into(),
        stream: "orders".into(),
        payloads: vec![Bytes::from_static(payload)],
    }
}

// peer-client-wire.md §5, "Captured (tenant t1, namespace default, stream orders)".
#[test]
fn captured_client_publishes() {
    let (_, frame, batch) = publish(
        "464c5831 0001 0009 0000002b | 0000000000000001 01 | 0002 7431 | 0007 64656661756c74 | 0006 6f7264657273 | 00000001 | 00000005 68656c6c6f",
    );
    assert_eq!(frame.flags, Flags(0x0009));
    let per_message = AckedPrefix {
        request_id: 1,
        ack_mode: AckMode::PerMessage,
    };
    assert_eq!(batch, orders(Some(per_message), None, b"hello"));

    let (_, _, batch) = publish(
        "464c5831 0001 0009 00000028 | 0000000000000003 02 | 0002 7431 | 0007 64656661756c74 | 0006 6f7264657273 | 00000001 | 00000002 7062",
    );
    let per_batch = AckedPrefix {
        request_id: 3,
        ack_mode: AckMode::PerBatch,
    };
    assert_eq!(batch, orders(Some(per_batch), None, b"pb"));

    let (_, frame, batch) = publish(
        "464c5831 0001 0001 00000021 | 0002 7431 | 0007 64656661756c74 | 0006 6f7264657273 | 00000001 | 00000004 66697265",
    );
    assert_eq!(frame.flags, Flags(0x0001));
    assert_eq!(batch, orders(None, None, b"fire"));

    let (_, frame, batch) = publish(
        "464c5831 0001 0049 0000002f | 0000000000000004 01 | 0002 6b31 | 0002 7431 | 0007 64656661756c74 | 0006 6f7264657273 | 00000001 | 00000005 6b65796564",
    );
    assert_eq!(frame.flags, Flags(0x0049));
    let acked = AckedPrefix {
        request_id: 4,
        ack_mode: AckMode::PerMessage,
    };
    assert_eq!(batch, orders(Some(acked), Some(b"k1"), b"keyed"));

    let (_, frame, batch) = publish(
        "464c5831 0001 0041 0000002b | 0002 6b31 | 0002 7431 | 0007 64656661756c74 | 0006 6f7264657273 | 00000001 | 0000000a 6b657965642d6e6f6e65",
    );
    assert_eq!(frame.flags, Flags(0x0041));
    assert_eq!(batch, orders(None, Some(b"k1"), b"keyed-none"));
}

fn ack(wire_hex: &str) -> PublishAck {
    let (wire, frame) = frame(wire_hex);
    let ack = PublishAck::decode(frame.flags, &frame.payload).expect("decodes");
    assert_eq!(ack.to_frame().to_bytes(), wire, "re-encodes identically");
    ack
}

// peer-client-wire.md §5, "Acks that the client accepted".
#[test]
fn captured_acks() {
    assert_eq!(
        ack("464c5831 0001 0010 0000000b | 00 | 0000000000000001 | 0000"),
        PublishAck::ok(1, None)
    );
    assert_eq!(
        ack("464c5831 0001 1010 00000013 | 00 | 0000000000000001 | 0000 | 0000000000000000"),
        PublishAck::ok(1, Some(0))
    );
    assert_eq!(
        ack(
            "464c5831 0001 0010 00000018 | 01 | 0000000000000001 | 000d 70726f62652073617973206e6f"
        ),
        PublishAck {
            request_id: 1,
            result: AckResult::Err {
                message: "probe says no".into(),
                code: None,
                detail: None
            },
            owner: None,
        }
    );
    // "forbidden by probe" spelled out in hex.
    assert_eq!(
        ack("464c5831 0001 0210 00000020 | 01 | 0000000000000001 | 0012 666f7262696464656e2062792070726f6265 | 0002 | 05"),
        PublishAck {
            request_id: 1,
            result: AckResult::Err {
                message: "forbidden by probe".into(),
                code: Some((ErrorCode::Forbidden, RetryClass::Fatal)),
                detail: None,
            },
            owner: None,
        }
    );
}

fn events(wire_hex: &str) -> EventBatch {
    let (wire, frame) = frame(wire_hex);
    let batch = EventBatch::decode(frame.flags, &frame.payload).expect("decodes");
    assert_eq!(batch.to_frame().to_bytes(), wire, "re-encodes identically");
    let hot = encode_event_batch_frame(
        &batch.header(),
        batch
            .events
            .iter()
            .map(|e| (e.timestamp_micros.unwrap_or(0), &e.payload[..])),
    );
    assert_eq!(hot, wire, "hot-path encoder");
    assert_eq!(
        EventBatchView::parse(frame.flags, &frame.payload)
            .unwrap()
            .to_batch(),
        batch
    );
    batch
}

fn probe_event() -> Vec<Event> {
    vec![Event {
        timestamp_micros: None,
        payload: Bytes::from_static(b"probe-event-1"),
    }]
}

// peer-client-wire.md §6, "Other captured frames".
#[test]
fn captured_event_batches() {
    assert_eq!(
        events("464c5831 0001 0022 00000025 | 00000000000003e9 | 0000000000000007 | 00000001 | 0000000d 70726f62652d6576656e742d31"),
        EventBatch {
            subscription_id: Some(1001),
            base_offset: Some(7),
            skipped_before: None,
            publisher: None,
            events: probe_event(),
        }
    );
    assert_eq!(
        events("464c5831 0001 0002 0000001d | 00000000000003e9 | 00000001 | 0000000d 70726f62652d6576656e742d31"),
        EventBatch {
            subscription_id: Some(1001),
            base_offset: None,
            skipped_before: None,
            publisher: None,
            events: probe_event(),
        }
    );
    assert_eq!(
        events("464c5831 0001 0024 0000001d | 0000000000000005 | 00000001 | 0000000d 70726f62652d6576656e742d31"),
        EventBatch {
            subscription_id: None,
            base_offset: Some(5),
            skipped_before: None,
            publisher: None,
            events: probe_event(),
        }
    );
}

/// Every optional field at once, in the order protocol.md gives them.
#[test]
fn all_tails_in_documented_order() {
    let ack = PublishAck {
        request_id: 9,
        result: AckResult::Err {
            message: "m".into(),
            code: Some((ErrorCode::ShardUnavailable, RetryClass::RetryAfter)),
            detail: Some(AckDetail {
                reason: "moving".into(),
                retry_after_ms: 250,
            }),
        },
        owner: Some(AckOwner {
            node_id: "n2".into(),
            addr: None,
            generation: 3,
        }),
    };
    let f = ack.to_frame();
    assert_eq!(f.flags, Flags(0x0010 | 0x0200 | 0x0400 | 0x0080));
    let mut expected = hex::decode("01 0000000000000009 0001 6d".replace(' ', "")).unwrap();
    expected.extend(ErrorCode::ShardUnavailable.number().to_be_bytes());
    expected.push(2);
    expected.extend(hex::decode("0006 6d6f76696e67 00000000000000fa".replace(' ', "")).unwrap());
    expected.extend(hex::decode("0002 6e32 0000 0000000000000003".replace(' ', "")).unwrap());
    assert_eq!(hex::encode(&f.payload), hex::encode(&expected));
    assert_eq!(PublishAck::decode(f.flags, &f.payload).unwrap(), ack);

    let ok = PublishAck {
        request_id: 1,
        result: AckResult::Ok { offset: Some(42) },
        owner: Some(AckOwner {
            node_id: "n".into(),
            addr: Some("10.0.0.1:5000".into()),
            generation: 1,
        }),
    };
    let f = ok.to_frame();
    assert_eq!(f.flags, Flags(0x1090));
    // The offset comes last, after the owner.
    assert_eq!(&f.payload[f.payload.len() - 8..], &42u64.to_be_bytes());
    assert_eq!(PublishAck::decode(f.flags, &f.payload).unwrap(), ok);

    let batch = EventBatch {
        subscription_id: None,
        base_offset: Some(100),
        skipped_before: Some(2),
        publisher: Some(Bytes::from_static(b"alice")),
        events: vec![
            Event {
                timestamp_micros: Some(1),
                payload: Bytes::from_static(b"x"),
            },
            Event {
                timestamp_micros: Some(2),
                payload: Bytes::new(),
            },
        ],
    };
    let f = batch.to_frame();
    assert_eq!(f.flags, Flags(0x0004 | 0x0020 | 0x0800 | 0x2000 | 0x4000));
    let expected = "0000000000000064 0000000000000002 05 616c696365 00000002 \
                    0000000000000001 00000001 78 0000000000000002 00000000"
        .replace(' ', "");
    assert_eq!(hex::encode(&f.payload), expected);
    assert_eq!(EventBatch::decode(f.flags, &f.payload).unwrap(), batch);
}

#[test]
fn decoded_payloads_share_the_frame() {
    let (_, frame) = frame(
        "464c5831 0001 0024 0000001d | 0000000000000005 | 00000001 | 0000000d 70726f62652d6576656e742d31",
    );
    let batch = EventBatch::decode(frame.flags, &frame.payload).unwrap();
    let range = frame.payload.as_ptr_range();
    assert!(
        range.contains(&batch.events[0].payload.as_ptr()),
        "payload was copied"
    );
}

#[test]
fn idempotent_prefix_follows_acked_prefix_and_precedes_key() {
    let batch = PublishBatch {
        acked: Some(AckedPrefix {
            request_id: 5,
            ack_mode: AckMode::PerBatch,
        }),
        idempotent: Some(felix_proto::binary::ProducerSeq {
            producer_id: 0xAB,
            sequence: 2,
        }),
        key: Some(Bytes::from_static(b"k")),
        tenant_id: "t".into(),
        namespace: "n".into(),
        stream: "s".into(),
        payloads: vec![],
    };
    let f = batch.to_frame();
    assert_eq!(f.flags, Flags(0x0149));
    let expected = "0000000000000005 02 00000000000000ab 0000000000000002 0001 6b \
                    0001 74 0001 6e 0001 73 00000000"
        .replace(' ', "");
    assert_eq!(hex::encode(&f.payload), expected);
    assert_eq!(PublishBatch::decode(f.flags, &f.payload).unwrap(), batch);
}
