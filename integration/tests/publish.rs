//! Publishing: acked per message and per batch, unacked, keyed routing across shards, and
//! pipelining up to the negotiated window.

use bytes::{Bytes, BytesMut};
use felix_client::{Ack, Start};
use felix_integration::{
    assert_quiet, broker, broker_with, declare_stream, join_all, next_event, unique, within, TENANT,
};
use felix_proto::binary::{
    encode_publish_batch_frame, AckMode, AckResult, AckedPrefix, PublishAck, PublishBatchHeader,
};
use felix_proto::routing::{shard_for_key, RoutingMapping};
use felix_proto::{Features, Flags};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_per_message_and_per_batch_are_answered_and_delivered() {
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("acked");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();

    for (ack, body) in [
        (Ack::PerMessage, "per-message"),
        (Ack::PerBatch, "per-batch"),
    ] {
        let payloads = vec![
            Bytes::from(format!("{body}-0")),
            Bytes::from(format!("{body}-1")),
        ];
        let offset = within(10, client.publish("default", &stream, payloads, None, ack))
            .await
            .unwrap();
        // In-memory streams put no offsets on the wire.
        assert_eq!(offset, None);
        for i in 0..2 {
            let event = next_event(&mut sub).await;
            assert_eq!(event.payload, Bytes::from(format!("{body}-{i}")));
            assert_eq!(event.offset, None);
        }
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_publish_is_delivered() {
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("unacked");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    for i in 0..5u8 {
        let answer = client
            .publish(
                "default",
                &stream,
                vec![Bytes::from(vec![i])],
                None,
                Ack::None,
            )
            .await;
        assert_eq!(answer.unwrap(), None);
    }
    for i in 0..5u8 {
        assert_eq!(next_event(&mut sub).await.payload, Bytes::from(vec![i]));
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_publish_lands_on_the_key_shard() {
    const SHARDS: u32 = 4;
    let stream = unique("keyed");
    let declared = stream.clone();
    let broker = broker_with(move |c| declare_stream(c, "default", &declared, SHARDS)).await;
    let client = broker.client().await;
    let mut subs = Vec::new();
    for shard in 0..SHARDS {
        subs.push(
            client
                .subscribe_shard("default", &stream, Start::Latest, Some(shard))
                .await
                .unwrap(),
        );
    }
    // Keys from the routing vectors, each on its own expected shard (modulo routing).
    for key in ["user-42", "k1", "orders/123", "a", ""] {
        let expected = shard_for_key(Some(key.as_bytes()), SHARDS, RoutingMapping::Modulo);
        let payload = Bytes::from(format!("payload for {key:?}"));
        within(
            10,
            client.publish(
                "default",
                &stream,
                vec![payload.clone()],
                Some(Bytes::from(key)),
                Ack::PerMessage,
            ),
        )
        .await
        .unwrap();
        let event = next_event(&mut subs[expected as usize]).await;
        assert_eq!(
            event.payload, payload,
            "key {key:?} should route to shard {expected}"
        );
        for (shard, sub) in subs.iter_mut().enumerate() {
            if shard != expected as usize {
                assert_quiet(sub, 50).await;
            }
        }
    }
    // Unkeyed goes to shard 0.
    client
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"nokey")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    assert_eq!(&next_event(&mut subs[0]).await.payload[..], b"nokey");
    // Keyed fire-and-forget (0x0041) routes the same way.
    let expected = shard_for_key(Some(b"user-42"), SHARDS, RoutingMapping::Modulo) as usize;
    client
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"unacked keyed")],
            Some(Bytes::from_static(b"user-42")),
            Ack::None,
        )
        .await
        .unwrap();
    assert_eq!(
        &next_event(&mut subs[expected]).await.payload[..],
        b"unacked keyed"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_publishes_fill_the_window_and_keep_order() {
    let broker = broker().await;
    let client = broker.client().await;
    let caps = *client.capabilities();
    let window = caps
        .publish_window()
        .expect("the broker grants a publish window") as usize;
    assert!(caps.broker_has(Features::STREAM_PUBLISH_WINDOW), "{caps:?}");
    let stream = unique("pipelined");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();

    // Three windows' worth, all issued at once: the client keeps `window` in flight and the
    // broker answers each in request order (the client checks the order as it reads).
    let total = window * 3;
    let publishes = (0..total).map(|i| {
        client.publish(
            "default",
            &stream,
            vec![Bytes::from(i.to_string())],
            None,
            Ack::PerMessage,
        )
    });
    let results = within(30, join_all(publishes)).await;
    for (i, r) in results.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("publish {i}: {e}"));
    }
    for i in 0..total {
        assert_eq!(
            next_event(&mut sub).await.payload,
            Bytes::from(i.to_string()),
            "event {i}"
        );
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_window_written_at_once_is_answered_in_order() {
    // Raw frames: `window` acked publishes in one write, before reading any answer.
    let broker = broker().await;
    let client = broker.client().await;
    let mut raw = client.open_raw_stream(true).await.unwrap();
    let caps = *raw.capabilities().unwrap();
    let window = caps.publish_window().expect("window granted");
    assert!(caps.flags().contains(Flags(0x0019)));
    let stream = unique("raw-window");
    let mut wire = BytesMut::new();
    for id in 1..=u64::from(window) {
        let header = PublishBatchHeader {
            acked: Some(AckedPrefix {
                request_id: id,
                ack_mode: AckMode::PerMessage,
            }),
            idempotent: None,
            key: None,
            tenant_id: TENANT,
            namespace: "default",
            stream: &stream,
        };
        wire.extend_from_slice(&encode_publish_batch_frame(&header, &[b"x"]));
    }
    raw.send(wire.freeze()).await.unwrap();
    for id in 1..=u64::from(window) {
        let frame = within(10, raw.recv_frame()).await.unwrap().expect("an ack");
        assert!(frame.flags.contains(Flags::BINARY_PUBLISH_ACK));
        let ack = PublishAck::decode(frame.flags, &frame.payload).unwrap();
        assert_eq!(ack.request_id, id, "answers in request order");
        assert!(matches!(ack.result, AckResult::Ok { .. }), "{ack:?}");
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_publish_forms_are_answered_like_the_protocol_says() {
    use felix_proto::message::{self, Message};
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("json");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    let mut raw = client.open_raw_stream(true).await.unwrap();
    let single = |payload: &'static [u8], request_id, ack| {
        Message::Publish(message::Publish {
            tenant_id: TENANT.into(),
            namespace: "default".into(),
            stream: stream.clone(),
            payload: Bytes::from_static(payload),
            key: None,
            shard: None,
            request_id,
            ack,
        })
        .to_frame()
        .to_bytes()
    };
    // Acked single publish: publish_ok with its request id.
    raw.send(single(b"one", Some(5), Some(message::AckMode::PerMessage)))
        .await
        .unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("publish_ok");
    match Message::decode(&frame.payload).unwrap() {
        Message::PublishOk(ok) => assert_eq!(ok.request_id, 5),
        other => panic!("{other:?}"),
    }
    // Unacked: no answer, but delivered (checked below, in order).
    raw.send(single(b"two", None, Some(message::AckMode::None)))
        .await
        .unwrap();
    raw.send(single(
        b"three",
        Some(6),
        Some(message::AckMode::PerMessage),
    ))
    .await
    .unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("publish_ok");
    match Message::decode(&frame.payload).unwrap() {
        Message::PublishOk(ok) => assert_eq!(ok.request_id, 6, "the unacked publish got no answer"),
        other => panic!("{other:?}"),
    }
    for expected in [&b"one"[..], b"two", b"three"] {
        assert_eq!(&next_event(&mut sub).await.payload[..], expected);
    }
    // A refused JSON publish is a publish_error carrying the request id and a code.
    let foreign = Message::PublishBatch(message::PublishBatch {
        tenant_id: "t2".into(),
        namespace: "default".into(),
        stream: stream.clone(),
        payloads: vec![Bytes::from_static(b"x")],
        key: None,
        shard: None,
        request_id: Some(7),
        ack: Some(message::AckMode::PerBatch),
    });
    raw.send(foreign.to_frame().to_bytes()).await.unwrap();
    let frame = within(10, raw.recv_frame())
        .await
        .unwrap()
        .expect("publish_error");
    match Message::decode(&frame.payload).unwrap() {
        Message::PublishError(e) => {
            assert_eq!(e.request_id, 7);
            assert_eq!(e.code, Some(felix_proto::ErrorCode::Forbidden), "{e:?}");
        }
        other => panic!("{other:?}"),
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_publish_never_leaves_half_a_frame() {
    // The broker reads slowly relative to a 1 MiB batch (64 KiB stream window), so the
    // frame is still being written when the caller gives up after the first poll. It must
    // go out whole anyway: the next publish on the same stream works and both arrive intact.
    let broker = broker_with(|c| c.stream_receive_window = 64 * 1024).await;
    let client = broker.client().await;
    let stream = unique("cancelled");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    // Open the publish stream first, so the cancelled call gets as far as queueing its frame.
    client
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"warm")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    assert_eq!(&next_event(&mut sub).await.payload[..], b"warm");

    let big = Bytes::from(vec![b'b'; 1024 * 1024]);
    let cancelled = tokio::time::timeout(
        std::time::Duration::from_micros(1),
        client.publish("default", &stream, vec![big.clone()], None, Ack::PerMessage),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the publish should still have been in flight"
    );
    within(
        10,
        client.publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"after")],
            None,
            Ack::PerMessage,
        ),
    )
    .await
    .expect("the stream is intact");
    let first = next_event(&mut sub).await;
    assert!(
        first.payload == big,
        "expected the 1 MiB batch first, got {} bytes",
        first.payload.len()
    );
    assert_eq!(&next_event(&mut sub).await.payload[..], b"after");
    broker.shutdown().await;
}
