//! Subscriptions: live delivery in order, fanout, independence from the control stream,
//! subscribers on separate connections, and a lost connection reported as an error.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{Ack, ClientError, Start, SubscriptionItem};
use felix_integration::{broker, next_event, unique, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_delivery_is_in_publish_order() {
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("order");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    for batch in 0..20u32 {
        let payloads = (0..5)
            .map(|i| Bytes::from(format!("{batch}:{i}")))
            .collect();
        client
            .publish("default", &stream, payloads, None, Ack::PerBatch)
            .await
            .unwrap();
    }
    for batch in 0..20u32 {
        for i in 0..5 {
            assert_eq!(
                next_event(&mut sub).await.payload,
                Bytes::from(format!("{batch}:{i}"))
            );
        }
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_published_before_a_latest_subscribe_is_delivered() {
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("latest");
    client
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"before")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    client
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"after")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    assert_eq!(&next_event(&mut sub).await.payload[..], b"after");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_reaches_every_subscriber() {
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("fanout");
    let mut subs = Vec::new();
    for _ in 0..4 {
        subs.push(
            client
                .subscribe("default", &stream, Start::Latest)
                .await
                .unwrap(),
        );
    }
    let ids: std::collections::HashSet<u64> = subs.iter().map(|s| s.id()).collect();
    assert_eq!(ids.len(), 4, "each subscription has its own id");
    for i in 0..10u8 {
        client
            .publish(
                "default",
                &stream,
                vec![Bytes::from(vec![i])],
                None,
                Ack::PerMessage,
            )
            .await
            .unwrap();
    }
    for sub in &mut subs {
        for i in 0..10u8 {
            assert_eq!(next_event(sub).await.payload, Bytes::from(vec![i]));
        }
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_survives_the_control_stream_closing() {
    // The client FINs its side of the subscribe stream and STOP_SENDINGs the broker's side
    // as soon as `subscribed` arrives, like the reference client. The broker must have seen
    // both before the publish: the subscription must not go with the control stream.
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("control-closed");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    // Instead of sleeping: one answered request. The FIN went with the subscribe request and
    // STOP_SENDING was queued before `subscribe` returned, so this request's packet leaves no
    // earlier than both; once it is answered the broker has processed them.
    assert_eq!(
        client
            .cache_get("default", "control-closed", "k")
            .await
            .unwrap(),
        None
    );
    client
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"still here")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    assert_eq!(&next_event(&mut sub).await.payload[..], b"still here");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_on_different_connections_both_receive() {
    let broker = broker().await;
    let publisher = broker.client().await;
    let a = broker.client().await;
    let b = broker.client().await;
    let stream = unique("two-conns");
    let mut sub_a = a
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    let mut sub_b = b
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    for i in 0..10u8 {
        publisher
            .publish(
                "default",
                &stream,
                vec![Bytes::from(vec![i])],
                None,
                Ack::PerMessage,
            )
            .await
            .unwrap();
    }
    for i in 0..10u8 {
        assert_eq!(next_event(&mut sub_a).await.payload, Bytes::from(vec![i]));
        assert_eq!(next_event(&mut sub_b).await.payload, Bytes::from(vec![i]));
    }
    // Dropping one subscriber's connection leaves the other's subscription alone.
    drop(sub_a);
    drop(a);
    publisher
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"after")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    assert_eq!(&next_event(&mut sub_b).await.payload[..], b"after");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_is_an_error_not_silence() {
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("lost");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    broker.shutdown().await;
    match within(15, sub.next()).await {
        Err(ClientError::Connection(_)) => {}
        other => panic!("a subscription on a closed connection must fail, got {other:?}"),
    }
    let publish = within(
        15,
        client.publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"x")],
            None,
            Ack::PerMessage,
        ),
    )
    .await;
    assert!(
        matches!(publish, Err(ClientError::Connection(_))),
        "{publish:?}"
    );
    let get = within(15, client.cache_get("default", "c", "k")).await;
    assert!(matches!(get, Err(ClientError::Connection(_))), "{get:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_items_are_events_until_an_end() {
    let broker = broker().await;
    let client = broker.client().await;
    let stream = unique("items");
    let mut sub = client
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    client
        .publish(
            "default",
            &stream,
            vec![Bytes::from_static(b"e")],
            None,
            Ack::PerMessage,
        )
        .await
        .unwrap();
    match within(10, sub.next()).await.unwrap() {
        SubscriptionItem::Event(e) => assert_eq!(&e.payload[..], b"e"),
        other => panic!("{other:?}"),
    }
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_drops_alone_and_blocks_nobody() {
    // A subscriber that stops reading: its QUIC window (64 KiB here) fills, then its broker
    // queue (4 batches); further batches are dropped for it alone. The publisher is acked
    // throughout and a reading subscriber gets everything.
    let broker = felix_integration::broker_with(|c| c.subscriber_queue_capacity = 4).await;
    let publisher = broker.client().await;
    let reader = broker.client().await;
    let stalled_conn = broker
        .client_with(|c| c.stream_receive_window = 64 * 1024)
        .await
        .unwrap();
    let stream = unique("stalled");
    let mut fast = reader
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    let mut stalled = stalled_conn
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();

    const BATCHES: usize = 200;
    let body = Bytes::from(vec![b'x'; 16 * 1024]);
    let publishing = async {
        for i in 0..BATCHES {
            let mut payload = body.to_vec();
            payload[..8].copy_from_slice(&(i as u64).to_be_bytes());
            publisher
                .publish(
                    "default",
                    &stream,
                    vec![Bytes::from(payload)],
                    None,
                    Ack::PerMessage,
                )
                .await
                .unwrap();
        }
    };
    let reading = async {
        for i in 0..BATCHES {
            let event = next_event(&mut fast).await;
            assert_eq!(
                &event.payload[..8],
                &(i as u64).to_be_bytes(),
                "the reading subscriber misses nothing"
            );
        }
    };
    within(30, async { tokio::join!(publishing, reading) }).await;

    // The stalled one now reads what it was sent: a prefix in order, then a gap.
    let mut seen = Vec::new();
    while let Ok(item) = tokio::time::timeout(Duration::from_millis(300), stalled.next()).await {
        match item.unwrap() {
            SubscriptionItem::Event(e) => {
                seen.push(u64::from_be_bytes(e.payload[..8].try_into().unwrap()))
            }
            SubscriptionItem::End(end) => panic!("in-memory subscription ended: {end:?}"),
        }
    }
    assert!(
        !seen.is_empty(),
        "the stalled subscriber got what fit before it stalled"
    );
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "in order, no duplicates: {seen:?}"
    );
    assert!(
        seen.len() < BATCHES,
        "its queue is bounded, so batches were dropped for it"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_event_stream_carries_only_its_subscription() {
    // Several subscriptions on one connection, to different streams: the event streams are
    // matched by their hello, and nothing crosses over.
    let broker = broker().await;
    let client = broker.client().await;
    let streams: Vec<String> = (0..3).map(|_| unique("routed")).collect();
    let mut subs = Vec::new();
    for s in &streams {
        subs.push(client.subscribe("default", s, Start::Latest).await.unwrap());
    }
    for round in 0..5 {
        for (i, s) in streams.iter().enumerate().rev() {
            let payload = Bytes::from(format!("{i}:{round}"));
            client
                .publish("default", s, vec![payload], None, Ack::PerMessage)
                .await
                .unwrap();
        }
    }
    for (i, sub) in subs.iter_mut().enumerate() {
        for round in 0..5 {
            assert_eq!(
                next_event(sub).await.payload,
                Bytes::from(format!("{i}:{round}"))
            );
        }
        felix_integration::assert_quiet(sub, 50).await;
    }
    broker.shutdown().await;
}
