//! A group's position, dead letters and redrives survive a broker restart; its claims do
//! not (what was in flight is delivered again: at-least-once).

use bytes::Bytes;
use felix_client::{Ack, PollOptions};
use felix_integration::durable_support::*;
use felix_integration::unique;

const NS: &str = "default";

#[tokio::test]
async fn position_dead_letters_and_redrives_survive_a_restart() {
    let dir = TempDir::new("groups-restart");
    let s = unique("work");
    let opts = PollOptions {
        max_records: 100,
        ..PollOptions::default()
    };
    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    let payloads = (0..6).map(|i| Bytes::from(format!("r{i}"))).collect();
    c.publish(NS, &s, payloads, None, Ack::PerMessage)
        .await
        .unwrap();
    let got = c.group(NS, &s, 0, "g").poll(&opts).await.unwrap();
    assert_eq!(got.len(), 6);
    for off in 0..3 {
        c.group(NS, &s, 0, "g").ack(off).await.unwrap();
    }
    c.group(NS, &s, 0, "g").dead_letter(3).await.unwrap();
    c.group(NS, &s, 0, "g").dead_letter(4).await.unwrap();
    c.group(NS, &s, 0, "g").redrive(4).await.unwrap();
    // Another group that only started.
    c.group(NS, &s, 0, "other").poll(&opts).await.unwrap();
    c.group(NS, &s, 0, "other").ack(0).await.unwrap();
    let before = c.group(NS, &s, 0, "g").describe().await.unwrap();
    assert_eq!(before.committed, Some(5));
    c.close().await;
    stop(broker).await;

    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    let info = c.group(NS, &s, 0, "g").describe().await.unwrap();
    assert_eq!(
        (info.committed, info.tail, info.dead_letters),
        (Some(5), 6, 1)
    );
    assert_eq!(
        c.group(NS, &s, 0, "g").dead_letters().await.unwrap(),
        vec![3]
    );
    // The redriven 4 is still owed; 5's claim did not survive, so it goes out again.
    let got = c.group(NS, &s, 0, "g").poll(&opts).await.unwrap();
    assert_eq!(
        got.iter()
            .map(|r| (r.offset, &r.payload[..]))
            .collect::<Vec<_>>(),
        vec![(4, &b"r4"[..]), (5, &b"r5"[..])]
    );
    let other = c.group(NS, &s, 0, "other").poll(&opts).await.unwrap();
    assert_eq!(other.first().map(|r| r.offset), Some(1));
    // Finishing the redrive is itself durable: after one more restart it is not owed.
    c.group(NS, &s, 0, "g").ack(4).await.unwrap();
    c.group(NS, &s, 0, "g").ack(5).await.unwrap();
    c.close().await;
    stop(broker).await;

    let broker = start(dir.path(), on_commit()).await;
    let c = client(&broker).await;
    assert!(c
        .group(NS, &s, 0, "g")
        .poll(&opts)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        c.group(NS, &s, 0, "g").describe().await.unwrap().committed,
        Some(6)
    );
    c.close().await;
    stop(broker).await;
}
