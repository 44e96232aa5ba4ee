//! Replay from the log: `earliest` and `{"offset": n}` joined with live delivery with no gap
//! and no duplicate, and both cursor errors.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{Ack, ClientError, Start};
use felix_integration::durable_support::*;
use felix_integration::{next_event, unique};

fn record(i: u64) -> Bytes {
    Bytes::from(format!("record-{i:06}"))
}

/// Publishes records `from..to` in batches of `per_batch`.
async fn publish_range(c: &felix_client::Client, stream: &str, from: u64, to: u64, per_batch: u64) {
    let mut i = from;
    while i < to {
        let end = (i + per_batch).min(to);
        let offset = c
            .publish(
                "default",
                stream,
                (i..end).map(record).collect(),
                None,
                Ack::PerBatch,
            )
            .await
            .unwrap();
        assert_eq!(offset, Some(i));
        i = end;
    }
}

#[tokio::test]
async fn earliest_and_offset_replays_join_live_delivery_without_gap_or_duplicate() {
    let dir = TempDir::new("durable-replay");
    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    let stream = unique("history");
    publish_range(&c, &stream, 0, 3000, 50).await;

    let mut from_start = c
        .subscribe("default", &stream, Start::Earliest)
        .await
        .unwrap();
    let mut from_offset = c
        .subscribe("default", &stream, Start::Offset(2500))
        .await
        .unwrap();
    assert_eq!(from_start.start_offset(), Some(0));
    assert_eq!(from_offset.start_offset(), Some(2500));

    // Live publishing goes on while both replays read the log.
    let publisher = c.clone();
    let live_stream = stream.clone();
    let live =
        tokio::spawn(async move { publish_range(&publisher, &live_stream, 3000, 4000, 10).await });

    for (sub, first) in [(&mut from_start, 0u64), (&mut from_offset, 2500)] {
        for i in first..4000 {
            let event = next_event(sub).await;
            assert_eq!(event.offset, Some(i), "offsets are contiguous from {first}");
            assert_eq!(event.payload, record(i));
        }
    }
    live.await.unwrap();
    c.close().await;
    stop(broker).await;
}

fn cursor_error(e: ClientError) -> String {
    match e {
        ClientError::Server { message, .. } => message,
        other => panic!("expected a cursor error, got {other:?}"),
    }
}

#[tokio::test]
async fn offsets_past_the_tail_or_below_retention_are_cursor_errors() {
    let dir = TempDir::new("durable-cursor");
    let durable = {
        let mut durable_config = periodic();
        durable_config.segment_max_bytes = 4096;
        durable_config.retention_bytes = Some(16 * 1024);
        durable_config.retention_check_interval = Duration::from_millis(50);
        durable_config.ack_on_commit = true;
        durable_config
    };
    let broker = start(dir.path(), durable).await;
    let c = client(&broker).await;
    let stream = unique("trimmed");
    // ~60 KiB of records: retention keeps about the newest 16 KiB, in whole segments.
    publish_range(&c, &stream, 0, 2000, 20).await;

    let e = c
        .subscribe("default", &stream, Start::Offset(2001))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        cursor_error(e),
        "cursor in_future: requested 2001, available 2000"
    );

    // Retention runs on its timer (and ran while the records were published); wait,
    // bounded, until the head is trimmed and stays put for several check intervals.
    let mut earliest = 0;
    for _ in 0..100 {
        let sub = c
            .subscribe("default", &stream, Start::Earliest)
            .await
            .unwrap();
        let now = sub.start_offset().unwrap();
        if now > 0 && now == earliest {
            break;
        }
        earliest = now;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(earliest > 0, "retention removed old segments");
    let e = c
        .subscribe("default", &stream, Start::Offset(0))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        cursor_error(e),
        format!("cursor too_old: requested 0, available {earliest}")
    );
    // Earliest means the oldest retained record, and it reads from there.
    let mut sub = c
        .subscribe("default", &stream, Start::Earliest)
        .await
        .unwrap();
    let first = sub.start_offset().unwrap();
    let event = next_event(&mut sub).await;
    assert_eq!((event.offset, event.payload), (Some(first), record(first)));
    c.close().await;
    stop(broker).await;
}
