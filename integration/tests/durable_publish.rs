//! Durable publishing end to end: offsets on acks (when the ack comes after the write) and on
//! events, and records surviving a broker restart.

use bytes::Bytes;
use felix_client::{Ack, Start};
use felix_integration::durable_support::*;
use felix_integration::{next_event, unique, within};
use felix_proto::Features;

fn batch(prefix: &str, i: usize, n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|j| Bytes::from(format!("{prefix}-{i}-{j}")))
        .collect()
}

#[tokio::test]
async fn on_commit_acks_carry_contiguous_offsets_and_events_carry_them_too() {
    let dir = TempDir::new("durable-publish");
    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    let stream = unique("orders");
    let mut sub = c
        .subscribe("default", &stream, Start::Latest)
        .await
        .unwrap();
    assert_eq!(sub.start_offset(), Some(0));

    let mut sent = Vec::new();
    for i in 0..10 {
        let payloads = batch("p", i, 3);
        let offset = c
            .publish("default", &stream, payloads.clone(), None, Ack::PerBatch)
            .await
            .unwrap();
        assert_eq!(
            offset,
            Some(3 * i as u64),
            "batch {i} starts where the last ended"
        );
        sent.extend(payloads);
    }
    for (i, payload) in sent.iter().enumerate() {
        let event = next_event(&mut sub).await;
        assert_eq!(event.offset, Some(i as u64));
        assert_eq!(&event.payload, payload);
    }
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn periodic_acks_carry_offsets_unless_the_broker_acks_before_the_write() {
    let dir = TempDir::new("durable-ack-modes");
    let broker = start(dir.path(), {
        let mut durable_config = periodic();
        durable_config.ack_before_write = true;
        durable_config
    })
    .await;
    let stream = unique("acks");
    let plain = client(&broker).await;
    let first = plain
        .publish("default", &stream, batch("a", 0, 2), None, Ack::PerBatch)
        .await
        .unwrap();
    assert_eq!(first, None, "acked on arrival: no offset yet");

    let committed = client_with(&broker, |c| {
        c.offer.features = c.offer.features | Features::ACK_ON_COMMIT
    })
    .await;
    let offset = committed
        .publish("default", &stream, batch("b", 0, 1), None, Ack::PerBatch)
        .await
        .unwrap();
    assert_eq!(
        offset,
        Some(2),
        "FEATURE_ACK_ON_COMMIT: answered after the write"
    );
    plain.close().await;
    committed.close().await;
    stop(broker).await;

    // By default every client's acks wait for the write.
    let broker = start(dir.path(), periodic()).await;
    let plain = client(&broker).await;
    let offset = plain
        .publish("default", &stream, batch("c", 0, 1), None, Ack::PerBatch)
        .await
        .unwrap();
    assert_eq!(offset, Some(3), "the offsets went on after the restart");
    plain.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn acked_records_survive_a_restart() {
    let dir = TempDir::new("durable-restart");
    let stream = unique("kept");
    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    let mut sent = Vec::new();
    for i in 0..20 {
        let payloads = batch("r", i, 5);
        c.publish("default", &stream, payloads.clone(), None, Ack::PerBatch)
            .await
            .unwrap();
        sent.extend(payloads);
    }
    c.close().await;
    stop(broker).await;

    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    let mut sub = c
        .subscribe("default", &stream, Start::Earliest)
        .await
        .unwrap();
    assert_eq!(sub.start_offset(), Some(0));
    for (i, payload) in sent.iter().enumerate() {
        let event = next_event(&mut sub).await;
        assert_eq!((event.offset, &event.payload), (Some(i as u64), payload));
    }
    let next = within(
        10,
        c.publish(
            "default",
            &stream,
            batch("after", 0, 1),
            None,
            Ack::PerBatch,
        ),
    )
    .await
    .unwrap();
    assert_eq!(next, Some(100));
    let event = next_event(&mut sub).await;
    assert_eq!(event.offset, Some(100));
    c.close().await;
    stop(broker).await;
}
