//! Limits at their edges, seen from a client: subscriptions per connection (and their
//! release), the publish window setting, idle-connection reaping.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{Ack, ClientError, ErrorCode, RetryClass, Start};
use felix_integration::{broker_with, next_event, unique, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_per_connection_are_capped_and_released_on_drop() {
    let broker = broker_with(|c| c.max_subscriptions_per_connection = 3).await;
    let client = broker.client().await;
    let stream = unique("capped");
    let mut subs = Vec::new();
    for _ in 0..3 {
        subs.push(
            client
                .subscribe("default", &stream, Start::Latest)
                .await
                .unwrap(),
        );
    }
    let err = within(10, client.subscribe("default", &stream, Start::Latest))
        .await
        .err()
        .expect("a fourth subscription must be refused");
    assert_eq!(err.code(), Some(&ErrorCode::LimitExceeded), "{err:?}");

    // Dropping one (STOP_SENDING on its event stream) frees its slot.
    drop(subs.pop());
    // The release travels as a QUIC frame, so retry until it has landed; the deadline is
    // generous and only fails a slot that is never released.
    let mut replacement = within(60, async {
        loop {
            match client.subscribe("default", &stream, Start::Latest).await {
                Ok(sub) => break sub,
                Err(e) if e.code() == Some(&ErrorCode::LimitExceeded) => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    })
    .await;
    client
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"x")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    assert_eq!(&next_event(&mut replacement).await.payload[..], b"x");
    for sub in &mut subs {
        assert_eq!(&next_event(sub).await.payload[..], b"x");
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_window_setting_is_granted_and_zero_withdraws_pipelining() {
    let broker = broker_with(|c| c.publish_window = 8).await;
    let client = broker.client().await;
    assert_eq!(client.capabilities().publish_window(), Some(8));
    // 40 concurrent publishes through a window of 8 all complete.
    let stream = unique("window8");
    let publishes = (0..40u8).map(|i| {
        client.publish(
            "default",
            &stream,
            vec![Bytes::from(vec![i])],
            None,
            Ack::PerMessage,
        )
    });
    for r in within(20, felix_integration::join_all(publishes)).await {
        r.unwrap();
    }
    broker.shutdown().await;

    let broker = broker_with(|c| c.publish_window = 0).await;
    let client = broker.client().await;
    assert_eq!(client.capabilities().publish_window(), None);
    assert!(!client
        .capabilities()
        .broker_has(felix_proto::Features::PUBLISH_PIPELINE));
    // Unordered answers still work, matched by request id.
    let stream = unique("window0");
    let publishes = (0..40u8).map(|i| {
        client.publish(
            "default",
            &stream,
            vec![Bytes::from(vec![i])],
            None,
            Ack::PerMessage,
        )
    });
    for r in within(20, felix_integration::join_all(publishes)).await {
        r.unwrap();
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_reaped_and_the_client_is_told() {
    let broker = broker_with(|c| c.idle_connection_reap = Duration::from_millis(400)).await;
    let idle = broker.client().await;
    let subscribed = broker.client().await;
    let stream = unique("reap");
    let mut sub = subscribed
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    // Wait for the reap itself, not a guessed time: the close docs/limits.md names is
    // application code 0, reason `idle`. The deadline only fails a broker that never reaps.
    let closed = within(60, idle.connection().closed()).await;
    assert_eq!(closed.to_string(), "closed by peer: idle (code 0)");
    // The client reports it rather than hanging.
    let err = within(10, idle.cache_get("default", "c", "k"))
        .await
        .expect_err("reaped");
    assert!(matches!(err, ClientError::Connection(_)), "{err:?}");
    // A connection with a live subscription is not idle.
    let publisher = broker.client().await;
    publisher
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"alive")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    assert_eq!(&next_event(&mut sub).await.payload[..], b"alive");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_credit_comes_back_from_subscribe_streams() {
    // Many more subscribe streams than the broker allows at once, one after another on one
    // connection: each finished stream must give its credit back.
    let broker = broker_with(|c| c.max_concurrent_bidi_streams = 64).await;
    let client = broker.client().await;
    let stream = unique("one-off-sub");
    for i in 0..200 {
        let sub = within(10, client.subscribe("default", &stream, Start::Latest)).await;
        drop(sub.unwrap_or_else(|e| panic!("subscribe #{i}: {e}")));
    }
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    client
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"end")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    assert_eq!(&next_event(&mut sub).await.payload[..], b"end");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_credit_comes_back_from_abandoned_streams() {
    let broker = broker_with(|c| c.max_concurrent_bidi_streams = 64).await;
    let client = broker.client().await;
    for i in 0..200 {
        let opened =
            tokio::time::timeout(Duration::from_secs(3), client.open_raw_stream(true)).await;
        let mut raw = match opened {
            Ok(raw) => raw.unwrap(),
            Err(_) => panic!("stream #{i} could not be opened: the broker granted no more streams"),
        };
        // FIN our side and (on drop) STOP_SENDING theirs, in one packet.
        raw.finish();
        drop(raw);
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_records_are_delivered_whole() {
    let broker = felix_integration::broker().await;
    let client = broker.client().await;
    let stream = unique("large");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    // Over the event batch's 1 MiB seal size, under the 16 MiB frame limit.
    let big = Bytes::from(
        (0..8 * 1024 * 1024)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let small = Bytes::from_static(b"small");
    within(
        20,
        client.publish(
            "default",
            &stream,
            vec![big.clone(), small.clone()],
            None,
            Ack::PerBatch,
        ),
    )
    .await
    .unwrap();
    let first = next_event(&mut sub).await;
    assert!(
        first.payload == big,
        "8 MiB record came back as {} bytes",
        first.payload.len()
    );
    assert_eq!(next_event(&mut sub).await.payload, small);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_frame_limit_fails_without_hanging() {
    let broker = broker_with(|c| c.max_frame_bytes = 1024 * 1024).await;
    let client = broker.client().await;
    let stream = unique("too-big");
    let too_big = Bytes::from(vec![0u8; 2 * 1024 * 1024]);
    let result = within(
        20,
        client.publish("default", &stream, vec![too_big], None, Ack::PerMessage),
    )
    .await;
    // docs/limits.md: past `max_frame_bytes`, `limit_exceeded` [fatal] on the header.
    match result {
        Err(ClientError::Server { code, retry, .. }) => {
            assert_eq!(code, Some(ErrorCode::LimitExceeded));
            assert_eq!(retry, Some(RetryClass::Fatal));
        }
        other => panic!("an oversize batch must be refused with limit_exceeded, got {other:?}"),
    }
    // The connection (and a fresh publish stream) still works. The refusal ends the old
    // stream, and the client learns that only when the end arrives: a publish queued on it
    // in between is failed as such (never answered as a success), and the next one goes to a
    // fresh stream.
    let fits = || {
        client.publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"fits")],
            None,
            Ack::PerMessage,
        )
    };
    match fits().await {
        Ok(_) => {}
        // The broker ends both halves: the client sees whichever it meets first.
        Err(ClientError::Connection(e))
            if e.contains("finished the stream") || e.contains("sending stopped by peer") =>
        {
            fits().await.expect("a fresh stream serves the publish");
        }
        Err(e) => panic!("a publish after the refusal failed for another reason: {e:?}"),
    }
    broker.shutdown().await;
}
