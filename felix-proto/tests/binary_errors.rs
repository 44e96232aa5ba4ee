//! Every way a binary payload can be refused, with the specific error each must produce.

use bytes::Bytes;
use felix_proto::binary::{
    AckDetail, AckMode, AckOwner, AckResult, AckedPrefix, BinaryFrame, Event, EventBatch,
    EventBatchView, ProducerSeq, PublishAck, PublishBatch, PublishBatchView,
};
use felix_proto::flags::FlagError;
use felix_proto::{DecodeError, ErrorCode, Flags, RetryClass};

fn full_publish() -> PublishBatch {
    PublishBatch {
        acked: Some(AckedPrefix {
            request_id: 7,
            ack_mode: AckMode::PerBatch,
        }),
        idempotent: Some(ProducerSeq {
            producer_id: 1,
            sequence: 2,
        }),
        key: Some(Bytes::from_static(b"key")),
        tenant_id: "t1".into(),
        namespace: "default".into(),
        stream: "orders".into(),
        payloads: vec![Bytes::from_static(b"hello"), Bytes::from_static(b"world")],
    }
}

fn error_ack() -> PublishAck {
    PublishAck {
        request_id: 3,
        result: AckResult::Err {
            message: "nope".into(),
            code: Some((ErrorCode::ShardUnavailable, RetryClass::RetryAfter)),
            detail: Some(AckDetail {
                reason: "moving".into(),
                retry_after_ms: 100,
            }),
        },
        owner: Some(AckOwner {
            node_id: "n1".into(),
            addr: Some("h:1".into()),
            generation: 4,
        }),
    }
}

fn ok_ack() -> PublishAck {
    PublishAck {
        request_id: 3,
        result: AckResult::Ok { offset: Some(9) },
        owner: Some(AckOwner {
            node_id: "n1".into(),
            addr: None,
            generation: 4,
        }),
    }
}

fn full_events(legacy: bool) -> EventBatch {
    EventBatch {
        subscription_id: legacy.then_some(1001),
        base_offset: Some(10),
        skipped_before: Some(1),
        publisher: Some(Bytes::from_static(b"alice")),
        events: vec![
            // Long enough that a cut inside the second event passes the count check.
            Event {
                timestamp_micros: Some(5),
                payload: Bytes::from_static(b"abcdefghijklmnopqrst"),
            },
            Event {
                timestamp_micros: Some(6),
                payload: Bytes::from_static(b"bc"),
            },
        ],
    }
}

/// Decodes every strict prefix of `payload`; each must be `Truncated`. Returns the field
/// names in the order the cuts hit them (consecutive duplicates merged).
fn truncated_fields(
    payload: &Bytes,
    decode: impl Fn(&Bytes) -> Result<(), DecodeError>,
) -> Vec<&'static str> {
    assert_eq!(decode(payload), Ok(()), "the whole payload decodes");
    let mut fields: Vec<&'static str> = Vec::new();
    for cut in 0..payload.len() {
        match decode(&payload.slice(..cut)) {
            Err(DecodeError::Truncated {
                field,
                needed,
                available,
            }) => {
                assert!(
                    needed > available,
                    "cut {cut}: needed {needed} <= available {available}"
                );
                if fields.last() != Some(&field) {
                    fields.push(field);
                }
            }
            other => panic!("cut at {cut} of {}: {other:?}", payload.len()),
        }
    }
    fields
}

#[test]
fn publish_truncated_at_every_field() {
    let f = full_publish().to_frame();
    let fields = truncated_fields(&f.payload, |p| PublishBatch::decode(f.flags, p).map(drop));
    assert_eq!(
        fields,
        [
            "request_id",
            "ack_mode",
            "producer_id",
            "sequence",
            "key",
            "tenant_id",
            "namespace",
            "stream",
            "payload count",
            "records",
            "payload",
            "payload length",
            "payload"
        ]
    );
    // The view refuses exactly the same cuts.
    for cut in 0..f.payload.len() {
        let p = f.payload.slice(..cut);
        assert_eq!(
            PublishBatchView::parse(f.flags, &p).map(|v| v.to_batch()),
            PublishBatch::decode(f.flags, &p)
        );
    }
}

#[test]
fn ack_truncated_at_every_field() {
    let f = error_ack().to_frame();
    let fields = truncated_fields(&f.payload, |p| PublishAck::decode(f.flags, p).map(drop));
    assert_eq!(
        fields,
        [
            "status",
            "request_id",
            "message",
            "code",
            "retry",
            "reason",
            "retry_after_ms",
            "node_id",
            "addr",
            "generation"
        ]
    );
    let f = ok_ack().to_frame();
    let fields = truncated_fields(&f.payload, |p| PublishAck::decode(f.flags, p).map(drop));
    assert_eq!(
        fields,
        [
            "status",
            "request_id",
            "message",
            "node_id",
            "addr",
            "generation",
            "offset"
        ]
    );
}

#[test]
fn events_truncated_at_every_field() {
    let f = full_events(true).to_frame();
    let fields = truncated_fields(&f.payload, |p| EventBatch::decode(f.flags, p).map(drop));
    assert_eq!(
        fields,
        [
            "subscription_id",
            "base_offset",
            "skipped_before",
            "publisher",
            "event count",
            "records",
            "payload",
            "timestamp_micros",
            "payload length",
            "payload"
        ]
    );
    for cut in 0..f.payload.len() {
        let p = f.payload.slice(..cut);
        assert_eq!(
            EventBatchView::parse(f.flags, &p).map(|v| v.to_batch()),
            EventBatch::decode(f.flags, &p)
        );
    }
}

#[test]
fn forged_counts_fail_before_allocating() {
    // tenant "", namespace "", stream "", count u32::MAX, then four bytes.
    let payload = Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1]);
    assert_eq!(
        PublishBatch::decode(Flags::BINARY_PUBLISH_BATCH, &payload),
        Err(DecodeError::Truncated {
            field: "records",
            needed: u32::MAX as usize * 4,
            available: 4
        })
    );
    // Timestamped events need at least 12 bytes each.
    let payload = Bytes::from_static(&[0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        EventBatch::decode(Flags(0x4004), &payload),
        Err(DecodeError::Truncated {
            field: "records",
            needed: 24,
            available: 16
        })
    );
    // Without timestamps the same count fits the bytes (two empty records and then...).
    assert_eq!(
        EventBatch::decode(Flags(0x0004), &payload),
        Err(DecodeError::TrailingBytes {
            layout: "binary event batch",
            extra: 8
        })
    );
}

#[test]
fn trailing_bytes_are_refused() {
    let cases: Vec<(Flags, Bytes, &str)> = vec![
        (
            full_publish().flags(),
            full_publish().to_frame().payload,
            "binary publish batch",
        ),
        (
            error_ack().flags(),
            error_ack().to_frame().payload,
            "binary publish ack",
        ),
        (
            ok_ack().flags(),
            ok_ack().to_frame().payload,
            "binary publish ack",
        ),
        (
            full_events(false).flags(),
            full_events(false).to_frame().payload,
            "binary event batch",
        ),
    ];
    for (flags, payload, layout) in cases {
        let mut longer = payload.to_vec();
        longer.extend_from_slice(&[0, 0]);
        assert_eq!(
            BinaryFrame::decode(flags, &Bytes::from(longer)),
            Err(DecodeError::TrailingBytes { layout, extra: 2 }),
            "{layout}"
        );
    }
}

#[test]
fn invalid_utf8_names_the_field() {
    let plain = PublishBatch {
        acked: None,
        idempotent: None,
        key: None,
        ..full_publish()
    };
    let f = plain.to_frame();
    // tenant "t1" sits at bytes 2..4.
    let mut bytes = f.payload.to_vec();
    bytes[2] = 0xff;
    assert_eq!(
        PublishBatch::decode(f.flags, &Bytes::from(bytes)),
        Err(DecodeError::InvalidUtf8 { field: "tenant_id" })
    );
    // namespace "default" at 6..13, stream "orders" at 15..21.
    let mut bytes = f.payload.to_vec();
    bytes[6] = 0xc3;
    assert_eq!(
        PublishBatch::decode(f.flags, &Bytes::from(bytes)),
        Err(DecodeError::InvalidUtf8 { field: "namespace" })
    );
    let mut bytes = f.payload.to_vec();
    bytes[20] = 0x80;
    assert_eq!(
        PublishBatch::decode(f.flags, &Bytes::from(bytes)),
        Err(DecodeError::InvalidUtf8 { field: "stream" })
    );
    // The key is bytes, not text.
    let keyed = PublishBatch {
        key: Some(Bytes::from_static(&[0xff, 0xfe])),
        ..plain
    };
    let f = keyed.to_frame();
    assert_eq!(PublishBatch::decode(f.flags, &f.payload), Ok(keyed));

    // An error ack's message: status, request_id, len, then "nope" at 11.
    let f = error_ack().to_frame();
    let mut bytes = f.payload.to_vec();
    bytes[11] = 0xff;
    assert_eq!(
        PublishAck::decode(f.flags, &Bytes::from(bytes)),
        Err(DecodeError::InvalidUtf8 { field: "message" })
    );
}

#[test]
fn ack_mode_must_be_one_or_two() {
    let f = full_publish().to_frame();
    for mode in [0u8, 3, 255] {
        let mut bytes = f.payload.to_vec();
        bytes[8] = mode;
        match PublishBatch::decode(f.flags, &Bytes::from(bytes)) {
            Err(DecodeError::InvalidValue {
                field: "ack_mode", ..
            }) => {}
            other => panic!("ack_mode {mode}: {other:?}"),
        }
    }
}

#[test]
fn status_must_be_zero_or_one() {
    let f = PublishAck::ok(1, None).to_frame();
    let mut bytes = f.payload.to_vec();
    bytes[0] = 2;
    match PublishAck::decode(f.flags, &Bytes::from(bytes)) {
        Err(DecodeError::InvalidValue {
            field: "status", ..
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn modifiers_without_their_base_are_refused() {
    let empty = Bytes::new();
    let missing = |modifier: u16| -> DecodeError {
        let requires_any = felix_proto::flags::FLAG_TABLE
            .iter()
            .find(|s| s.bit == modifier)
            .unwrap()
            .requires_any;
        DecodeError::Flags(FlagError::MissingBase {
            modifier,
            requires_any,
        })
    };
    assert_eq!(
        EventBatch::decode(Flags(0x0804), &empty),
        Err(missing(0x0800))
    );
    assert_eq!(
        PublishAck::decode(Flags(0x0410), &empty),
        Err(missing(0x0400))
    );
    assert_eq!(
        PublishBatch::decode(Flags(0x0101), &empty),
        Err(missing(0x0100))
    );
    assert_eq!(
        PublishBatch::decode(Flags(0x0008), &empty),
        Err(missing(0x0008))
    );
    assert_eq!(
        BinaryFrame::decode(Flags(0x0804), &empty),
        Err(missing(0x0800))
    );
    // Another layout's modifier on this layout.
    assert_eq!(
        PublishBatch::decode(Flags(0x0021), &empty),
        Err(missing(0x0020))
    );
    assert_eq!(
        BinaryFrame::decode(Flags(0x8001), &empty),
        Err(DecodeError::Flags(FlagError::Unknown { bits: 0x8000 }))
    );
    // The encoder writes what it is given: an idempotent batch without the acked prefix is
    // refused by the receiver.
    let orphan = PublishBatch {
        acked: None,
        ..full_publish()
    };
    let f = orphan.to_frame();
    assert_eq!(
        PublishBatch::decode(f.flags, &f.payload),
        Err(missing(0x0100))
    );
}

#[test]
fn each_decoder_refuses_other_layouts() {
    let empty = Bytes::new();
    let unexpected = |r: Result<(), DecodeError>| match r {
        Err(DecodeError::UnexpectedLayout { .. }) => {}
        other => panic!("{other:?}"),
    };
    for flags in [Flags::NONE, Flags(0x0010), Flags(0x0002), Flags(0x0024)] {
        unexpected(PublishBatch::decode(flags, &empty).map(drop));
        unexpected(PublishBatchView::parse(flags, &empty).map(drop));
    }
    for flags in [Flags::NONE, Flags(0x0001), Flags(0x0004), Flags(0x0049)] {
        unexpected(PublishAck::decode(flags, &empty).map(drop));
    }
    for flags in [Flags::NONE, Flags(0x0001), Flags(0x1010)] {
        unexpected(EventBatch::decode(flags, &empty).map(drop));
        unexpected(EventBatchView::parse(flags, &empty).map(drop));
    }
    assert_eq!(
        BinaryFrame::decode(Flags::NONE, &Bytes::from_static(b"{}")),
        Err(DecodeError::UnexpectedLayout {
            flags: 0,
            expected: "a binary layout"
        })
    );
}

#[test]
fn tails_that_do_not_apply_to_the_status_are_ignored() {
    // 0x1000 on a failed ack and 0x0200 on a successful one announce no field.
    let f = PublishAck::ok(5, None).to_frame();
    assert_eq!(
        PublishAck::decode(Flags(0x0210), &f.payload),
        Ok(PublishAck::ok(5, None))
    );
    let err = PublishAck {
        request_id: 5,
        result: AckResult::Err {
            message: "x".into(),
            code: None,
            detail: None,
        },
        owner: None,
    };
    let f = err.to_frame();
    assert_eq!(PublishAck::decode(Flags(0x1010), &f.payload), Ok(err));
}

#[test]
fn unknown_codes_and_retry_bytes_are_kept_or_read_as_fatal() {
    let f = error_ack().to_frame();
    let mut bytes = f.payload.to_vec();
    // code at 15..17, retry at 17.
    bytes[15..17].copy_from_slice(&999u16.to_be_bytes());
    bytes[17] = 77;
    let ack = PublishAck::decode(f.flags, &Bytes::from(bytes)).unwrap();
    match ack.result {
        AckResult::Err {
            code: Some((code, retry)),
            ..
        } => {
            assert_eq!(code, ErrorCode::OtherNumber(999));
            assert_eq!(retry, RetryClass::Fatal);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn overlong_text_is_clipped_and_overlong_identifiers_panic() {
    let long = "é".repeat(40_000);
    let ack = PublishAck {
        request_id: 1,
        result: AckResult::Err {
            message: long.clone(),
            code: None,
            detail: None,
        },
        owner: None,
    };
    let f = ack.to_frame();
    assert_eq!(f.payload.len(), ack.encoded_len());
    match PublishAck::decode(f.flags, &f.payload).unwrap().result {
        AckResult::Err { message, .. } => {
            assert_eq!(message.len(), 65_534);
            assert!(long.starts_with(&message));
        }
        other => panic!("{other:?}"),
    }

    let batch = PublishBatch {
        tenant_id: "x".repeat(70_000),
        ..full_publish()
    };
    assert!(std::panic::catch_unwind(|| batch.to_frame()).is_err());
    let events = EventBatch {
        publisher: Some(Bytes::from(vec![b'p'; 256])),
        ..full_events(false)
    };
    assert!(std::panic::catch_unwind(|| events.to_frame()).is_err());
}
