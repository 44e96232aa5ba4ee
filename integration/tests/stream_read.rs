//! Bounded reads: `stream_read` pages through a durable shard without subscribing, and
//! `offset_for_time` gives an offset a subscription then starts at.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{Ack, Start};
use felix_integration::durable_support::*;
use felix_integration::{next_event, unique, unix_micros};

#[tokio::test]
async fn stream_read_pages_through_a_shard() {
    let dir = TempDir::new("stream-read");
    let broker = start(dir.path(), on_commit()).await;
    let stream = unique("history");
    let c = client(&broker).await;
    for i in 0..25 {
        let p = vec![Bytes::from(format!("r{i}"))];
        c.publish("default", &stream, p, None, Ack::PerBatch)
            .await
            .unwrap();
    }
    let mut from = 0;
    let mut got = Vec::new();
    for _ in 0..10 {
        let page = c
            .stream_read("default", &stream, 0, from, Some(23), Some(10))
            .await
            .unwrap();
        assert!(page.records.len() <= 10, "the page keeps to max_records");
        got.extend(page.records.iter().map(|r| (r.offset, r.payload.clone())));
        if page.next_offset == 23 {
            break;
        }
        assert!(page.next_offset > from, "pages move on");
        from = page.next_offset;
    }
    let expect: Vec<(u64, Bytes)> = (0..23).map(|i| (i, Bytes::from(format!("r{i}")))).collect();
    assert_eq!(got, expect, "every record up to end once, in order");
    let err = c
        .stream_read("default", &stream, 0, 99, None, None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("InFuture"), "{err}");
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn offset_for_time_then_subscribe_at_the_answer() {
    let dir = TempDir::new("offset-for-time");
    let broker = start(dir.path(), on_commit()).await;
    let stream = unique("timeline");
    let c = client(&broker).await;
    for i in 0..5 {
        c.publish(
            "default",
            &stream,
            vec![Bytes::from(format!("old{i}"))],
            None,
            Ack::PerBatch,
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let cut = unix_micros();
    tokio::time::sleep(Duration::from_millis(30)).await;
    for i in 0..3 {
        c.publish(
            "default",
            &stream,
            vec![Bytes::from(format!("new{i}"))],
            None,
            Ack::PerBatch,
        )
        .await
        .unwrap();
    }
    let at = c.offset_for_time("default", &stream, 0, cut).await.unwrap();
    assert_eq!(at, Some(5), "the first record appended after the cut");
    assert_eq!(
        c.offset_for_time("default", &stream, 0, 0).await.unwrap(),
        Some(0)
    );
    let later = unix_micros() + 60_000_000;
    assert_eq!(
        c.offset_for_time("default", &stream, 0, later)
            .await
            .unwrap(),
        None
    );

    let mut sub = c
        .subscribe("default", &stream, Start::Offset(at.unwrap()))
        .await
        .unwrap();
    for i in 0..3 {
        let e = next_event(&mut sub).await;
        assert_eq!(
            (e.offset, e.payload),
            (Some(5 + i), Bytes::from(format!("new{i}")))
        );
    }
    c.close().await;
    stop(broker).await;
}
