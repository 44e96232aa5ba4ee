//! Core tests against felix-proto's codecs and the frames captured from the reference client
//! (peer-client-wire.md §3, §5, §6).

use bytes::Bytes;
use felix_proto::binary::{AckResult, EventBatch as BinEventBatch, PublishAck, PublishBatch};
use felix_proto::message::{self, Message};
use felix_proto::negotiate::BrokerAdvertisement;
use felix_proto::{ErrorCode, Features, Flags, Frame, FrameDecoder, RetryClass};

use super::*;
use crate::error::ClientError;

fn hex_frame(hex_str: &str) -> Frame {
    let clean: String = hex_str.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    let bytes = hex::decode(clean).expect("hex");
    one_frame(&bytes)
}

fn one_frame(bytes: &[u8]) -> Frame {
    let mut d = FrameDecoder::new(1 << 24);
    d.feed(bytes);
    let f = d.next_frame().expect("valid frame").expect("whole frame");
    assert_eq!(d.buffered(), 0, "exactly one frame");
    f
}

fn hex_of(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

fn clean(hex_str: &str) -> String {
    hex_str.chars().filter(|c| c.is_ascii_hexdigit()).collect()
}

fn json_frame(m: Message) -> Frame {
    m.to_frame()
}

/// Capabilities as negotiated with a broker advertising `flags`/`features`/`window`.
fn caps_with(flags: u16, features: Features, window: Option<u64>) -> Capabilities {
    let (lo, hi) = features.to_words();
    capabilities(
        &Offer::full(),
        Some(&BrokerAdvertisement {
            server_flags: u64::from(flags),
            server_features: Some(u64::from(lo)),
            server_features_hi: hi.map(u64::from),
            publish_window: window,
        }),
    )
}

fn plain_caps() -> Capabilities {
    caps_with(
        0x1FFF,
        Features::ERROR_CODES | Features::CACHE_DELETE | Features::UNSUPPORTED,
        None,
    )
}

fn pipelined_caps(window: u64) -> Capabilities {
    caps_with(
        0x1FFF,
        Features::ERROR_CODES | Features::PUBLISH_PIPELINE | Features::STREAM_PUBLISH_WINDOW,
        Some(window),
    )
}

const ORDERS: Target<'static> = Target {
    namespace: "default",
    name: "orders",
};

#[test]
fn auth_frame_matches_the_reference_capture() {
    let frame = auth_frame("t1", "probe-token", &Offer::reference_client());
    assert_eq!(
        hex_of(&frame),
        "464c5831000100000000007f7b2274797065223a2261757468222c2274656e616e745f6964223a227431222c22746f6b656e223a2270726f62652d746f6b656e222c22636c69656e745f666c616773223a383139312c22636c69656e745f6665617475726573223a343231383934353533352c22636c69656e745f66656174757265735f6869223a31357d"
    );
}

#[test]
fn legacy_offer_sends_no_capability_fields() {
    let frame = one_frame(&auth_frame("t1", "tok", &Offer::none()));
    match Message::decode(&frame.payload).unwrap() {
        Message::Auth(a) => {
            assert_eq!(a.client_flags, None);
            assert_eq!(a.client_features, None);
            assert_eq!(a.client_features_hi, None);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn auth_replies() {
    let offer = Offer::full();
    // Captured auth_ok {"server_flags":63}.
    let caps = read_auth_reply(
        &offer,
        &hex_frame("464c583100010000000000247b2274797065223a22617574685f6f6b222c227365727665725f666c616773223a36337d"),
    )
    .unwrap();
    assert_eq!(caps.flags(), Flags(0x3F));
    assert!(!caps.legacy_ok);
    // Captured plain ok.
    let caps = read_auth_reply(
        &offer,
        &hex_frame("464c5831000100000000000d7b2274797065223a226f6b227d"),
    )
    .unwrap();
    assert!(caps.legacy_ok);
    assert_eq!(caps.flags(), Flags::ORIGINAL_V1);
    // A coded refusal.
    let refused = json_frame(Message::Error(message::ErrorMessage::coded(
        ErrorCode::Unauthenticated,
        "bad token",
    )));
    match read_auth_reply(&offer, &refused) {
        Err(ClientError::Server {
            code: Some(ErrorCode::Unauthenticated),
            retry: Some(RetryClass::Fatal),
            message,
        }) => {
            assert_eq!(message, "bad token")
        }
        other => panic!("{other:?}"),
    }
    // Anything else is a protocol violation.
    let odd = json_frame(Message::CacheOk(message::CacheOk { request_id: 1 }));
    assert!(matches!(
        read_auth_reply(&offer, &odd),
        Err(ClientError::Protocol(_))
    ));
}

#[test]
fn binary_publishes_match_the_reference_captures() {
    let mut s = RequestStream::new(plain_caps(), "t1");
    let hello = s
        .publish(
            ORDERS,
            &[Bytes::from_static(b"hello")],
            None,
            Ack::PerMessage,
        )
        .unwrap();
    assert_eq!(hello.request_id, Some(1));
    assert_eq!(
        hex_of(&hello.frame),
        clean("464c5831 0001 0009 0000002b | 0000000000000001 01 | 0002 7431 | 0007 64656661756c74 | 0006 6f7264657273 | 00000001 | 00000005 68656c6c6f")
    );
    let _second = s
        .publish(ORDERS, &[Bytes::from_static(b"x")], None, Ack::PerMessage)
        .unwrap();
    let pb = s
        .publish(ORDERS, &[Bytes::from_static(b"pb")], None, Ack::PerBatch)
        .unwrap();
    assert_eq!(pb.request_id, Some(3));
    assert_eq!(
        hex_of(&pb.frame),
        clean("464c5831 0001 0009 00000028 | 0000000000000003 02 | 0002 7431 | 0007 64656661756c74 | 0006 6f7264657273 | 00000001 | 00000002 7062")
    );
    let fire = s
        .publish(ORDERS, &[Bytes::from_static(b"fire")], None, Ack::None)
        .unwrap();
    assert_eq!(fire.request_id, None);
    assert_eq!(
        hex_of(&fire.frame),
        clean("464c5831 0001 0001 00000021 | 0002 7431 | 0007 64656661756c74 | 0006 6f7264657273 | 00000001 | 00000004 66697265")
    );
    let keyed = s
        .publish(
            ORDERS,
            &[Bytes::from_static(b"keyed")],
            Some(b"k1"),
            Ack::PerMessage,
        )
        .unwrap();
    assert_eq!(keyed.request_id, Some(4));
    assert_eq!(
        hex_of(&keyed.frame),
        clean("464c5831 0001 0049 0000002f | 0000000000000004 01 | 0002 6b31 | 0002 7431 | 0007 64656661756c74 | 0006 6f7264657273 | 00000001 | 00000005 6b65796564")
    );
    let keyed_none = s
        .publish(
            ORDERS,
            &[Bytes::from_static(b"keyed-none")],
            Some(b"k1"),
            Ack::None,
        )
        .unwrap();
    assert_eq!(
        hex_of(&keyed_none.frame),
        clean("464c5831 0001 0041 0000002b | 0002 6b31 | 0002 7431 | 0007 64656661756c74 | 0006 6f7264657273 | 00000001 | 0000000a 6b657965642d6e6f6e65")
    );
    // Only the acked ones wait for answers.
    assert_eq!(s.outstanding(), 4);
    // felix-proto decodes what we sent.
    let f = one_frame(&keyed.frame);
    let batch = PublishBatch::decode(f.flags, &f.payload).unwrap();
    assert_eq!(batch.key.as_deref(), Some(&b"k1"[..]));
    assert_eq!(batch.payloads, vec![Bytes::from_static(b"keyed")]);
}

#[test]
fn acked_publish_falls_back_to_json_without_the_advertisement() {
    let caps = read_auth_reply(&Offer::full(), &json_frame(Message::Ok)).unwrap();
    let mut s = RequestStream::new(caps, "t1");
    let e = s
        .publish(
            ORDERS,
            &[Bytes::from_static(b"a"), Bytes::from_static(b"b")],
            Some(b"k"),
            Ack::PerBatch,
        )
        .unwrap();
    let f = one_frame(&e.frame);
    assert_eq!(f.flags, Flags::NONE);
    match Message::decode(&f.payload).unwrap() {
        Message::PublishBatch(p) => {
            assert_eq!(p.request_id, Some(1));
            assert_eq!(p.ack, Some(message::AckMode::PerBatch));
            assert_eq!(p.key.as_deref(), Some(&b"k"[..]));
            assert_eq!(p.payloads.len(), 2);
        }
        other => panic!("{other:?}"),
    }
    // Unkeyed fire-and-forget stays binary 0x0001 (ORIGINAL_V1).
    let e = s
        .publish(ORDERS, &[Bytes::from_static(b"a")], None, Ack::None)
        .unwrap();
    assert_eq!(one_frame(&e.frame).flags, Flags::BINARY_PUBLISH_BATCH);
    // The JSON answer completes the publish.
    let done = s
        .handle_frame(&json_frame(Message::PublishOk(message::PublishOk {
            request_id: 1,
            offset: None,
        })))
        .unwrap();
    assert_eq!(done.result, Ok(Answer::Published { offset: None }));
}

#[test]
fn binary_acks_complete_publishes() {
    let mut s = RequestStream::new(plain_caps(), "t1");
    for _ in 0..3 {
        s.publish(ORDERS, &[Bytes::from_static(b"p")], None, Ack::PerMessage)
            .unwrap();
    }
    // Captured ok ack for request 1.
    let done = s
        .handle_frame(&hex_frame(
            "464c5831 0001 0010 0000000b | 00 | 0000000000000001 | 0000",
        ))
        .unwrap();
    assert_eq!((done.request_id, done.kind), (1, RequestKind::Publish));
    assert_eq!(done.result, Ok(Answer::Published { offset: None }));
    // Without pipelining answers may come in completion order: 3 before 2.
    let ack3 = PublishAck::ok(3, Some(42)).to_frame();
    let done = s.handle_frame(&ack3).unwrap();
    assert_eq!(done.result, Ok(Answer::Published { offset: Some(42) }));
    // A coded refusal for 2.
    let refused = PublishAck {
        request_id: 2,
        result: AckResult::Err {
            message: "forbidden by probe".into(),
            code: Some((ErrorCode::Forbidden, RetryClass::Fatal)),
            detail: None,
        },
        owner: None,
    }
    .to_frame();
    assert_eq!(refused.flags, Flags(0x0210));
    let done = s.handle_frame(&refused).unwrap();
    assert_eq!(
        done.result.as_ref().unwrap_err().code(),
        Some(&ErrorCode::Forbidden)
    );
    assert_eq!(done.result.unwrap_err().retry(), Some(RetryClass::Fatal));
    assert_eq!(s.outstanding(), 0);
    // An answer to nothing is a protocol violation.
    assert!(matches!(
        s.handle_frame(&PublishAck::ok(9, None).to_frame()),
        Err(ClientError::Protocol(_))
    ));
}

#[test]
fn a_forwarded_publishs_ack_carries_its_owner() {
    let mut s = RequestStream::new(plain_caps(), "t1");
    s.publish(ORDERS, &[Bytes::from_static(b"p")], None, Ack::PerMessage)
        .unwrap();
    let owner = felix_proto::binary::AckOwner {
        node_id: "n2".into(),
        addr: Some("127.0.0.1:7002".into()),
        generation: 4,
    };
    let mut ack = PublishAck::ok(1, Some(5));
    ack.owner = Some(owner.clone());
    let frame = ack.to_frame();
    assert!(frame.flags.contains(Flags::BINARY_PUBLISH_ACK_OWNER));
    let done = s.handle_frame(&frame).unwrap();
    assert_eq!(done.result, Ok(Answer::Published { offset: Some(5) }));
    assert_eq!(done.owner, Some(owner));
}

#[test]
fn pipelined_answers_must_keep_request_order() {
    let mut s = RequestStream::new(pipelined_caps(2), "t1");
    assert_eq!(s.publish_limit(), 2);
    s.publish(ORDERS, &[Bytes::from_static(b"1")], None, Ack::PerMessage)
        .unwrap();
    s.publish(ORDERS, &[Bytes::from_static(b"2")], None, Ack::PerMessage)
        .unwrap();
    assert!(!s.can_publish_acked());
    assert!(matches!(
        s.publish(ORDERS, &[Bytes::from_static(b"3")], None, Ack::PerMessage),
        Err(ClientError::Usage(_))
    ));
    // Fire-and-forget does not take a slot.
    s.publish(ORDERS, &[Bytes::from_static(b"f")], None, Ack::None)
        .unwrap();
    // 2 overtaking 1 breaks the pipelining promise.
    assert!(matches!(
        s.handle_frame(&PublishAck::ok(2, None).to_frame()),
        Err(ClientError::Protocol(_))
    ));

    let mut s = RequestStream::new(pipelined_caps(2), "t1");
    s.publish(ORDERS, &[Bytes::from_static(b"1")], None, Ack::PerMessage)
        .unwrap();
    s.publish(ORDERS, &[Bytes::from_static(b"2")], None, Ack::PerMessage)
        .unwrap();
    assert_eq!(
        s.handle_frame(&PublishAck::ok(1, None).to_frame())
            .unwrap()
            .request_id,
        1
    );
    assert!(s.can_publish_acked());
    let third = s
        .publish(ORDERS, &[Bytes::from_static(b"3")], None, Ack::PerMessage)
        .unwrap();
    assert_eq!(third.request_id, Some(3));
    assert_eq!(
        s.handle_frame(&PublishAck::ok(2, None).to_frame())
            .unwrap()
            .request_id,
        2
    );
    assert_eq!(
        s.handle_frame(&PublishAck::ok(3, None).to_frame())
            .unwrap()
            .request_id,
        3
    );
}

#[test]
fn ack_with_a_bit_we_did_not_offer_is_refused() {
    let mut offer = Offer::full();
    offer.flags = Some(Flags(0x001F));
    let caps = capabilities(
        &offer,
        Some(&BrokerAdvertisement {
            server_flags: 0x1FFF,
            ..Default::default()
        }),
    );
    let mut s = RequestStream::new(caps, "t1");
    s.publish(ORDERS, &[Bytes::from_static(b"1")], None, Ack::PerMessage)
        .unwrap();
    // 0x1010 carries an offset we never asked for.
    let with_offset = PublishAck::ok(1, Some(7)).to_frame();
    assert_eq!(with_offset.flags, Flags(0x1010));
    assert!(matches!(
        s.handle_frame(&with_offset),
        Err(ClientError::Protocol(_))
    ));
}

#[test]
fn cache_requests_match_the_reference_capture_and_correlate() {
    let mut s = RequestStream::new(plain_caps(), "t1");
    let c1 = Target {
        namespace: "default",
        name: "c1",
    };
    let get = s.cache_get(c1, "k").unwrap();
    assert_eq!(get.request_id, Some(1));
    let put = s.cache_put(c1, "k", b"v1", None).unwrap();
    assert_eq!(
        hex_of(&put.frame),
        "464c5831000100000000007e7b2274797065223a2263616368655f707574222c2274656e616e745f6964223a227431222c226e616d657370616365223a2264656661756c74222c226361636865223a226331222c226b6579223a226b222c2276616c7565223a22646a453d222c22726571756573745f6964223a322c2274746c5f6d73223a6e756c6c7d"
    );
    let ttl = one_frame(&s.cache_put(c1, "k", b"v", Some(1500)).unwrap().frame);
    match Message::decode(&ttl.payload).unwrap() {
        Message::CachePut(p) => assert_eq!(p.ttl_ms, Some(1500)),
        other => panic!("{other:?}"),
    }
    let del = s.cache_delete(c1, "k").unwrap();
    assert_eq!(del.request_id, Some(4));

    // Answers out of order, matched by id (captured cache_ok for id 2).
    let ok2 = hex_frame("464c583100010000000000227b2274797065223a2263616368655f6f6b222c22726571756573745f6964223a327d");
    let done = s.handle_frame(&ok2).unwrap();
    assert_eq!(
        (done.request_id, done.kind, done.result),
        (2, RequestKind::CachePut, Ok(Answer::CacheStored))
    );
    let value = |id, v: Option<&'static [u8]>| {
        json_frame(Message::CacheValue(message::CacheValue {
            tenant_id: "t1".into(),
            namespace: "default".into(),
            cache: "c1".into(),
            key: "k".into(),
            value: v.map(Bytes::from_static),
            request_id: Some(id),
            version: None,
        }))
    };
    let done = s.handle_frame(&value(4, Some(b"gone"))).unwrap();
    assert_eq!(
        done.result,
        Ok(Answer::CacheValue(Some(Bytes::from_static(b"gone"))))
    );
    let done = s.handle_frame(&value(1, None)).unwrap();
    assert_eq!(done.result, Ok(Answer::CacheValue(None)));
    // cache_ok for a get is the wrong answer.
    let mut s2 = RequestStream::new(plain_caps(), "t1");
    s2.cache_get(c1, "k").unwrap();
    let wrong = s2
        .handle_frame(&json_frame(Message::CacheOk(message::CacheOk {
            request_id: 1,
        })))
        .unwrap();
    assert!(matches!(wrong.result, Err(ClientError::Protocol(_))));
}

#[test]
fn cache_delete_needs_the_feature() {
    let caps = caps_with(0x1FFF, Features::ERROR_CODES, None);
    let mut s = RequestStream::new(caps, "t1");
    assert!(matches!(
        s.cache_delete(
            Target {
                namespace: "d",
                name: "c"
            },
            "k"
        ),
        Err(ClientError::Usage(_))
    ));
    assert_eq!(s.outstanding(), 0);
}

#[test]
fn uncorrelated_error_refuses_the_oldest_request() {
    let mut s = RequestStream::new(plain_caps(), "t1");
    let c = Target {
        namespace: "d",
        name: "c",
    };
    s.cache_get(c, "a").unwrap();
    s.cache_get(c, "b").unwrap();
    let err = json_frame(Message::Error(message::ErrorMessage::coded(
        ErrorCode::LimitExceeded,
        "too big",
    )));
    let done = s.handle_frame(&err).unwrap();
    assert_eq!(done.request_id, 1);
    assert_eq!(
        done.result.unwrap_err().code(),
        Some(&ErrorCode::LimitExceeded)
    );
    // With nothing outstanding an error ends the stream.
    s.handle_frame(&json_frame(Message::CacheValue(message::CacheValue {
        tenant_id: "t1".into(),
        namespace: "d".into(),
        cache: "c".into(),
        key: "b".into(),
        value: None,
        request_id: Some(2),
        version: None,
    })))
    .unwrap();
    assert!(matches!(
        s.handle_frame(&err),
        Err(ClientError::Server { .. })
    ));
}

#[test]
fn unsupported_is_typed() {
    let mut s = RequestStream::new(plain_caps(), "t1");
    s.cache_get(
        Target {
            namespace: "d",
            name: "c",
        },
        "a",
    )
    .unwrap();
    let frame = json_frame(Message::Unsupported(message::Unsupported {
        request_type: "cache_get".into(),
        extension: None,
        request_id: Some(1),
    }));
    let done = s.handle_frame(&frame).unwrap();
    assert_eq!(
        done.result,
        Err(ClientError::Unsupported {
            request_type: "cache_get".into()
        })
    );
}

#[test]
fn drain_fails_publishes_then_others_in_order() {
    let mut s = RequestStream::new(plain_caps(), "t1");
    s.cache_get(
        Target {
            namespace: "d",
            name: "c",
        },
        "a",
    )
    .unwrap();
    s.publish(ORDERS, &[Bytes::from_static(b"x")], None, Ack::PerBatch)
        .unwrap();
    s.cache_get(
        Target {
            namespace: "d",
            name: "c",
        },
        "b",
    )
    .unwrap();
    assert_eq!(
        s.drain_outstanding(),
        vec![
            (2, RequestKind::Publish),
            (1, RequestKind::CacheGet),
            (3, RequestKind::CacheGet)
        ]
    );
    assert_eq!(s.outstanding(), 0);
}

#[test]
fn subscribe_frames_match_the_reference_captures() {
    let plain = SubscribeRequest {
        namespace: "default",
        stream: "orders",
        start: Start::Latest,
        shard: None,
    };
    assert_eq!(
        hex_of(&subscribe_frame("t1", &plain).unwrap()),
        "464c5831000100000000004d7b2274797065223a22737562736372696265222c2274656e616e745f6964223a227431222c226e616d657370616365223a2264656661756c74222c2273747265616d223a226f7264657273227d"
    );
    let earliest = SubscribeRequest {
        start: Start::Earliest,
        ..plain
    };
    assert_eq!(
        hex_of(&subscribe_frame("t1", &earliest).unwrap()),
        "464c583100010000000000607b2274797065223a22737562736372696265222c2274656e616e745f6964223a227431222c226e616d657370616365223a2264656661756c74222c2273747265616d223a226f7264657273222c227374617274223a226561726c69657374227d"
    );
    let offset = one_frame(
        &subscribe_frame(
            "t1",
            &SubscribeRequest {
                start: Start::Offset(3),
                shard: Some(2),
                ..plain
            },
        )
        .unwrap(),
    );
    match Message::decode(&offset.payload).unwrap() {
        Message::Subscribe(s) => {
            assert_eq!(s.start, Some(message::Start::Offset(3)));
            assert_eq!(s.shard, Some(2));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn subscribe_replies() {
    let ok = read_subscribe_reply(&hex_frame(
        "464c5831000100000000002c7b2274797065223a2273756273637269626564222c22737562736372697074696f6e5f6964223a313030317d",
    ))
    .unwrap();
    assert_eq!(
        ok,
        Subscribed {
            subscription_id: 1001,
            start_offset: None,
            live_offset: None
        }
    );
    let refused = json_frame(Message::Error(message::ErrorMessage::coded(
        ErrorCode::InvalidRequest,
        "replay needs durable storage",
    )));
    assert_eq!(
        read_subscribe_reply(&refused).unwrap_err().code(),
        Some(&ErrorCode::InvalidRequest)
    );
}

#[test]
fn event_stream_reads_the_captured_frames() {
    let mut r = EventStreamReader::new(&plain_caps());
    // Events before the hello are refused.
    let batch_0022 = hex_frame("464c5831 0001 0022 00000025 | 00000000000003e9 | 0000000000000007 | 00000001 | 0000000d 70726f62652d6576656e742d31");
    assert!(matches!(
        r.clone().handle_frame(&batch_0022),
        Err(ClientError::Protocol(_))
    ));
    let hello = hex_frame("464c583100010000000000347b2274797065223a226576656e745f73747265616d5f68656c6c6f222c22737562736372697074696f6e5f6964223a313030317d");
    assert_eq!(
        r.handle_frame(&hello).unwrap(),
        EventFrame::Hello {
            subscription_id: 1001
        }
    );
    assert_eq!(r.subscription_id(), Some(1001));
    let event = |offset| Event {
        payload: Bytes::from_static(b"probe-event-1"),
        offset,
    };
    match r.handle_frame(&batch_0022).unwrap() {
        EventFrame::Batch(b) => {
            assert_eq!(b.into_events().collect::<Vec<_>>(), vec![event(Some(7))])
        }
        other => panic!("{other:?}"),
    }
    let batch_0002 = hex_frame("464c5831 0001 0002 0000001d | 00000000000003e9 | 00000001 | 0000000d 70726f62652d6576656e742d31");
    match r.handle_frame(&batch_0002).unwrap() {
        EventFrame::Batch(b) => assert_eq!(b.into_events().collect::<Vec<_>>(), vec![event(None)]),
        other => panic!("{other:?}"),
    }
    let shared = hex_frame("464c5831 0001 0024 0000001d | 0000000000000005 | 00000001 | 0000000d 70726f62652d6576656e742d31");
    match r.handle_frame(&shared).unwrap() {
        EventFrame::Batch(b) => assert_eq!(b.base_offset, Some(5)),
        other => panic!("{other:?}"),
    }
    // A multi-record shared batch built by felix-proto: offsets are base + i.
    let many = BinEventBatch {
        subscription_id: None,
        base_offset: Some(10),
        skipped_before: None,
        publisher: None,
        events: (0..3)
            .map(|i| felix_proto::binary::Event {
                timestamp_micros: None,
                payload: Bytes::from(vec![i]),
            })
            .collect(),
    }
    .to_frame();
    match r.handle_frame(&many).unwrap() {
        EventFrame::Batch(b) => {
            let offsets: Vec<_> = b.into_events().map(|e| e.offset.unwrap()).collect();
            assert_eq!(offsets, vec![10, 11, 12]);
        }
        other => panic!("{other:?}"),
    }
    // JSON event_batch is accepted too.
    let json = json_frame(Message::EventBatch(message::EventBatch {
        tenant_id: "t1".into(),
        namespace: "default".into(),
        stream: "orders".into(),
        payloads: vec![Bytes::from_static(b"j")],
        base_offset: None,
    }));
    assert!(matches!(
        r.handle_frame(&json).unwrap(),
        EventFrame::Batch(_)
    ));
    // The final frame, then nothing more.
    let lagged = json_frame(Message::SubscriptionLagged(message::SubscriptionLagged {
        subscription_id: 1001,
        resume_from: 99,
    }));
    assert_eq!(
        r.handle_frame(&lagged).unwrap(),
        EventFrame::End(SubscriptionEnd::Lagged { resume_from: 99 })
    );
    assert!(r.handle_frame(&batch_0002).is_err());
}

#[test]
fn event_stream_refuses_unnegotiated_flags_and_reports_errors() {
    // Broker advertised only 0x0007: offsets were not negotiated.
    let caps = caps_with(0x0007, Features::ERROR_CODES, None);
    let mut r = EventStreamReader::new(&caps);
    r.handle_frame(&json_frame(Message::EventStreamHello(
        message::EventStreamHello { subscription_id: 1 },
    )))
    .unwrap();
    let with_offsets = hex_frame("464c5831 0001 0024 0000001d | 0000000000000005 | 00000001 | 0000000d 70726f62652d6576656e742d31");
    assert!(matches!(
        r.handle_frame(&with_offsets),
        Err(ClientError::Protocol(_))
    ));
    let revoked = json_frame(Message::Error(message::ErrorMessage::coded(
        ErrorCode::Revoked,
        "revoked",
    )));
    assert_eq!(
        r.handle_frame(&revoked).unwrap_err().code(),
        Some(&ErrorCode::Revoked)
    );
    // A FIN after the hello is a clean end; before it, a protocol violation.
    assert_eq!(r.handle_finish().unwrap(), SubscriptionEnd::Closed);
    assert!(EventStreamReader::new(&caps).handle_finish().is_err());
}

#[test]
fn a_watch_follows_a_move_and_a_not_leader_to_the_new_owner_from_the_given_offset() {
    use crate::core::cluster::{parse_addr, Redirects, DEFAULT_MAX_REDIRECT_HOPS};
    use crate::core::watch::{
        read_watch_event, read_watch_frame, read_watch_reply, resume_after_move, watch_frame,
        WatchFilter, WatchFrame, WatchStart,
    };
    let json = |s: &str| Message::decode(s.as_bytes()).unwrap().to_frame();
    // The old owner ends the watch's event stream with the move.
    let moved = json(
        r#"{"type":"shard_moved","subscription_id":5,"resume_from":42,"node_id":"n2","addr":"127.0.0.1:7002","generation":3}"#,
    );
    let WatchFrame::Moved {
        resume_from,
        node_id,
        addr,
    } = read_watch_frame(&moved).unwrap()
    else {
        panic!("a move")
    };
    assert_eq!((resume_from, node_id.as_deref()), (Some(42), Some("n2")));
    let to = addr.as_deref().and_then(parse_addr).unwrap();
    assert_eq!(to, "127.0.0.1:7002".parse().unwrap());
    // The one-broker reader, which cannot follow it, says so.
    assert!(matches!(
        read_watch_event(&moved),
        Err(ClientError::Protocol(_))
    ));
    // Resumed from the move's point when it is later than the first undelivered change,
    // else from that change: nothing repeated, nothing skipped.
    assert_eq!(resume_after_move(40, resume_from), 42);
    assert_eq!(resume_after_move(45, resume_from), 45);
    assert_eq!(resume_after_move(40, None), 40);
    // The watch made at the new owner asks for exactly that offset.
    let caps = caps_with(0x1FFF, Features::ERROR_CODES | Features::CACHE_WATCH, None);
    let again = watch_frame(
        &caps,
        "t1",
        "default",
        "prefs",
        WatchFilter::Key("k".into()),
        WatchStart::From(resume_after_move(40, resume_from)),
    )
    .unwrap();
    let mut d = FrameDecoder::new(1 << 20);
    d.feed(&again);
    let sent = d.next_frame().unwrap().unwrap();
    assert_eq!(
        std::str::from_utf8(&sent.payload).unwrap(),
        r#"{"type":"cache_watch","tenant_id":"t1","namespace":"default","cache":"prefs","key":"k","from_offset":42}"#
    );
    // A broker that does not own the cache answers the watch `not_leader`: followed to the
    // named owner with the same request (its `from_offset` carried), within the hop bound.
    let nl = json(r#"{"type":"not_leader","node_id":"n3","addr":"127.0.0.1:7003","generation":4}"#);
    let err = read_watch_reply(&nl).unwrap_err();
    let ClientError::NotLeader {
        node_id,
        addr,
        generation,
    } = &err
    else {
        panic!("{err:?}")
    };
    let mut r = Redirects::new(to, DEFAULT_MAX_REDIRECT_HOPS);
    assert_eq!(
        r.follow(node_id, addr.as_deref(), *generation),
        Ok("127.0.0.1:7003".parse().unwrap())
    );
    assert_eq!(
        crate::core::cluster::classify(&err, true),
        crate::core::cluster::Failure::NotApplied
    );
}
