//! Refusals: unknown requests, replay on an in-memory stream, oversize and unauthenticated
//! frames.

use bytes::{BufMut, Bytes, BytesMut};
use felix_client::{ClientError, ErrorCode, Start};
use felix_integration::{broker, unique, within, TENANT};
use felix_proto::frame::{FrameHeader, DEFAULT_PREAUTH_MAX_FRAME_BYTES};
use felix_proto::message::{self, Message};
use felix_proto::{Flags, Frame};

fn json(text: &str) -> Bytes {
    Frame::new(Flags::NONE, Bytes::copy_from_slice(text.as_bytes())).to_bytes()
}

/// The stream must end (FIN or reset) within 10 s, possibly after an `error` frame, which
/// is returned.
async fn ends_with_optional_error(
    raw: &mut felix_client::RawStream,
) -> Option<message::ErrorMessage> {
    let mut error = None;
    for _ in 0..4 {
        match within(10, raw.recv_frame()).await {
            Ok(None) | Err(ClientError::Connection(_)) => return error,
            Ok(Some(frame)) => match Message::decode(&frame.payload) {
                Ok(Message::Error(e)) => error = Some(e),
                other => panic!("expected an error or the end of the stream, got {other:?}"),
            },
            Err(other) => panic!("{other:?}"),
        }
    }
    panic!("the stream did not end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_request_is_answered_unsupported_and_the_stream_kept() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(true).await.unwrap();
    raw.send(json(r#"{"type":"brand_new_request","request_id":7}"#))
        .await
        .unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("an answer");
    match Message::decode(&frame.payload).unwrap() {
        Message::Unsupported(u) => {
            assert_eq!(u.request_type, "brand_new_request");
            assert_eq!(u.request_id, Some(7));
        }
        other => panic!("expected unsupported, got {other:?}"),
    }
    // The stream still serves requests.
    let get = Message::CacheGet(message::CacheGet {
        tenant_id: TENANT.into(),
        namespace: "default".into(),
        cache: "c".into(),
        key: "k".into(),
        request_id: Some(8),
    });
    raw.send(get.to_frame().to_bytes()).await.unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("an answer");
    match Message::decode(&frame.payload).unwrap() {
        Message::CacheValue(v) => assert_eq!(v.request_id, Some(8)),
        other => panic!("expected cache_value, got {other:?}"),
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_on_an_in_memory_stream_is_refused_with_a_code() {
    let broker = broker().await;
    let client = broker.client().await;
    for start in [Start::Earliest, Start::Offset(0)] {
        let err = within(10, client.subscribe("default", &unique("replay"), start))
            .await
            .err()
            .unwrap_or_else(|| panic!("{start:?} on an in-memory stream must be refused"));
        assert_eq!(
            err.code(),
            Some(&ErrorCode::InvalidRequest),
            "{start:?}: {err:?}"
        );
    }
    // The connection is unaffected.
    client
        .subscribe("default", &unique("replay"), Start::Latest)
        .await
        .unwrap();
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_preauth_frame_is_refused() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(false).await.unwrap();
    // Only the header: the broker must refuse on it alone, without waiting for 64 KiB.
    let header = FrameHeader {
        flags: Flags::NONE,
        length: DEFAULT_PREAUTH_MAX_FRAME_BYTES + 1,
    };
    raw.send(Bytes::copy_from_slice(&header.to_bytes()))
        .await
        .unwrap();
    if let Some(e) = ends_with_optional_error(&mut raw).await {
        // Nothing was offered on this stream, so the refusal carries no code.
        assert_eq!(e.code, None, "{e:?}");
    }
    // Other streams on the connection are unaffected.
    client.cache_get("default", "c", "k").await.unwrap();
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_before_auth_is_refused_unauthenticated() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(false).await.unwrap();
    raw.send(json(r#"{"type":"cache_get","tenant_id":"t1","namespace":"default","cache":"c","key":"k","request_id":1}"#))
        .await
        .unwrap();
    let error = ends_with_optional_error(&mut raw).await;
    // The broker cannot know we read codes (no auth, no offer); if it answers, it refuses.
    if let Some(e) = error {
        assert!(
            e.code.is_none() || e.code == Some(ErrorCode::Unauthenticated),
            "{e:?}"
        );
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_with_an_unknown_flag_is_refused() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(true).await.unwrap();
    let mut wire = BytesMut::new();
    wire.put_u32(felix_proto::frame::MAGIC);
    wire.put_u16(1);
    wire.put_u16(0x8000);
    wire.put_u32(0);
    raw.send(wire.freeze()).await.unwrap();
    if let Some(e) = ends_with_optional_error(&mut raw).await {
        assert_eq!(e.code, Some(ErrorCode::InvalidRequest), "{e:?}");
    }
    broker.shutdown().await;
}

fn acked_publish_frame(request_id: u64, tenant: &str, stream: &str, payloads: &[&[u8]]) -> Bytes {
    use felix_proto::binary::{
        encode_publish_batch_frame, AckMode, AckedPrefix, PublishBatchHeader,
    };
    let header = PublishBatchHeader {
        acked: Some(AckedPrefix {
            request_id,
            ack_mode: AckMode::PerMessage,
        }),
        idempotent: None,
        key: None,
        tenant_id: tenant,
        namespace: "default",
        stream,
    };
    encode_publish_batch_frame(&header, payloads)
}

/// Reads the binary ack for one publish.
async fn read_ack(raw: &mut felix_client::RawStream) -> felix_proto::binary::PublishAck {
    let frame = within(10, raw.recv_frame()).await.unwrap().expect("an ack");
    assert!(frame.flags.contains(Flags::BINARY_PUBLISH_ACK), "{frame:?}");
    felix_proto::binary::PublishAck::decode(frame.flags, &frame.payload).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_into_another_tenant_is_forbidden() {
    use felix_proto::binary::AckResult;
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("cross-tenant");
    // A t2 subscriber cannot exist (the dev token is t1's), so check the ack and that t1's
    // own stream of the same name receives nothing.
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    let mut raw = client.open_raw_stream(true).await.unwrap();
    raw.send(acked_publish_frame(1, "t2", &stream, &[b"smuggled"]))
        .await
        .unwrap();
    let ack = read_ack(&mut raw).await;
    assert_eq!(ack.request_id, 1);
    match ack.result {
        AckResult::Err {
            code: Some((code, _)),
            ..
        } => {
            assert_eq!(
                code,
                ErrorCode::Forbidden,
                "publishing as t2 on a t1 stream"
            )
        }
        other => panic!("a publish into another tenant must be refused with a code, got {other:?}"),
    }
    felix_integration::assert_quiet(&mut sub, 200).await;
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribing_to_another_tenant_is_forbidden() {
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(true).await.unwrap();
    let subscribe = Message::Subscribe(message::Subscribe {
        tenant_id: "t2".into(),
        namespace: "default".into(),
        stream: unique("other-tenant"),
        subscription_id: None,
        start: None,
        shard: None,
        queue_capacity: None,
    });
    raw.send(subscribe.to_frame().to_bytes()).await.unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("an answer");
    match Message::decode(&frame.payload).unwrap() {
        Message::Error(e) => assert_eq!(e.code, Some(ErrorCode::Forbidden), "{e:?}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribing_to_a_shard_the_stream_lacks_is_refused() {
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("one-shard");
    // Create the stream (default width 1).
    client
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"x")],
            None,
            felix_client::Ack::PerMessage,
        )
        .await
        .unwrap();
    let err = within(
        10,
        client.subscribe_shard("default", &stream, Start::Latest, Some(7)),
    )
    .await
    .err()
    .expect("shard 7 of a one-shard stream must be refused");
    assert_eq!(err.code(), Some(&ErrorCode::InvalidRequest), "{err:?}");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_batch_is_answered_delivers_nothing_and_keeps_the_stream() {
    // The protocol does not say whether an empty batch is an error (only `publish_if` is
    // refused); either answer is fine, but it must be answered, deliver nothing, and leave
    // the stream serving.
    use felix_proto::binary::AckResult;
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("empty-batch");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    let mut raw = client.open_raw_stream(true).await.unwrap();
    raw.send(acked_publish_frame(1, TENANT, &stream, &[]))
        .await
        .unwrap();
    let ack = read_ack(&mut raw).await;
    assert_eq!(ack.request_id, 1);
    match &ack.result {
        AckResult::Ok { .. } => {}
        AckResult::Err { code, .. } => {
            assert_eq!(
                code.as_ref().map(|c| &c.0),
                Some(&ErrorCode::InvalidRequest),
                "{ack:?}"
            )
        }
    }
    raw.send(acked_publish_frame(2, TENANT, &stream, &[b"ok"]))
        .await
        .unwrap();
    let ack = read_ack(&mut raw).await;
    assert_eq!(ack.request_id, 2);
    assert!(matches!(ack.result, AckResult::Ok { .. }), "{ack:?}");
    assert_eq!(
        &felix_integration::next_event(&mut sub).await.payload[..],
        b"ok"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_cache_value_is_refused_with_a_code() {
    let broker = broker().await;
    let client = broker.client().await;
    let cache = unique("big");
    let too_big = Bytes::from(vec![0u8; 1024 * 1024 + 1]);
    let err = within(10, client.cache_put("default", &cache, "k", too_big, None))
        .await
        .expect_err("a value over cache_max_value_bytes must be refused");
    assert!(
        matches!(
            err.code(),
            Some(ErrorCode::LimitExceeded | ErrorCode::InvalidRequest)
        ),
        "{err:?}"
    );
    // The client's cache stream still works afterwards.
    client
        .cache_put("default", &cache, "k", Bytes::from_static(b"small"), None)
        .await
        .unwrap();
    assert_eq!(
        client
            .cache_get("default", &cache, "k")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"small"[..])
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_cannot_form_an_object_are_invalid_requests() {
    // Permission objects are `stream:tenant/ns/name`: a name with '/' or ':' (or an empty
    // one) could alias another object, so the broker refuses it as malformed.
    let broker = broker().await;
    let client = broker.client().await;
    let mut wrong = Vec::new();
    let mut check = |what: String, result: Option<ClientError>| match result {
        Some(e) if e.code() == Some(&ErrorCode::InvalidRequest) => {}
        other => wrong.push(format!("{what}: {other:?}")),
    };
    for bad in ["a/b", "x:y", ""] {
        let publish = client.publish(
            "default",
            bad,
            vec![Bytes::from_static(b"p")],
            None,
            felix_client::Ack::PerMessage,
        );
        check(
            format!("publish to {bad:?}"),
            within(10, publish).await.err(),
        );
        check(
            format!("subscribe to {bad:?}"),
            within(10, client.subscribe("default", bad, Start::Latest))
                .await
                .err(),
        );
        check(
            format!("cache_get in {bad:?}"),
            within(10, client.cache_get("default", bad, "k"))
                .await
                .err(),
        );
    }
    check(
        "cache_get in namespace \"ns/evil\"".into(),
        within(10, client.cache_get("ns/evil", "c", "k"))
            .await
            .err(),
    );
    assert!(
        wrong.is_empty(),
        "expected invalid_request for each:\n{}",
        wrong.join("\n")
    );
    // The client's streams keep working after the refusals.
    client.cache_get("default", "c", "k").await.unwrap();
    client
        .publish(
            "default",
            &unique("fine"),
            vec![Bytes::from_static(b"p")],
            None,
            felix_client::Ack::PerMessage,
        )
        .await
        .unwrap();
    broker.shutdown().await;
}
