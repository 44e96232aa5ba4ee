//! Retention outranks a group: records removed before the group reached them are skipped
//! (reported as `skipped_before`), and the group moves on rather than stalling.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{Ack, PollOptions, Start};
use felix_integration::durable_support::*;
use felix_integration::unique;

const NS: &str = "default";

#[tokio::test]
async fn a_group_behind_retention_skips_what_was_removed() {
    let dir = TempDir::new("groups-retention");
    let durable = {
        let mut durable_config = periodic();
        durable_config.segment_max_bytes = 4096;
        durable_config.retention_bytes = Some(16 * 1024);
        durable_config.retention_check_interval = Duration::from_millis(50);
        durable_config
    };
    let broker = start(dir.path(), durable).await;
    let c = client(&broker).await;
    let s = unique("trimmed");
    for chunk in 0..20 {
        let payloads = (0..100)
            .map(|i| Bytes::from(format!("record-{:06}-xxxxxx", chunk * 100 + i)))
            .collect();
        c.publish(NS, &s, payloads, None, Ack::PerMessage)
            .await
            .unwrap();
    }
    // Wait, bounded, until retention has trimmed the head and stays put.
    let mut oldest = 0;
    for _ in 0..100 {
        let (now, _) = c
            .group(NS, &s, 0, "probe")
            .seek(Start::Earliest, false)
            .await
            .unwrap();
        if now > 0 && now == oldest {
            break;
        }
        oldest = now;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(oldest > 0, "retention removed old segments");

    let opts = PollOptions {
        max_records: 5,
        ..PollOptions::default()
    };
    let got = c.group(NS, &s, 0, "g").poll(&opts).await.unwrap();
    let first = &got[0];
    assert_eq!(first.offset, oldest, "the group starts at what is left");
    assert_eq!(first.skipped_before, oldest, "and says how many it skipped");
    assert_eq!(
        &first.payload[..],
        format!("record-{oldest:06}-xxxxxx").as_bytes()
    );
    assert!(got[1..].iter().all(|r| r.skipped_before == 0));
    for r in &got {
        c.group(NS, &s, 0, "g").ack(r.offset).await.unwrap();
    }
    let info = c.group(NS, &s, 0, "g").describe().await.unwrap();
    assert_eq!(info.committed, Some(oldest + got.len() as u64));
    c.close().await;
    stop(broker).await;
}
