//! Consumer groups end to end through our client: poll and ack, nack and redelivery with
//! attempts counted, dead letters after the attempt bound, redrive and discard, two
//! groups over one shard, a waiting poll woken by a publish, and each record's append time.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{Ack, Client, PollOptions};
use felix_integration::durable_support::*;
use felix_integration::ops_support::{scrape, value};
use felix_integration::{start_broker, unique, unix_micros, within};
use felix_runtime_tokio::felix_engine::{DurableConfig, GroupConfig};
use felix_runtime_tokio::BrokerOptions;

const NS: &str = "default";

fn groups_config() -> DurableConfig {
    let mut durable_config = on_commit();
    durable_config.groups = {
        let mut group_config = GroupConfig::default();
        group_config.max_attempts = 3;
        group_config
    };
    durable_config
}

fn now_poll(max: u64) -> PollOptions {
    PollOptions {
        max_records: max,
        ..PollOptions::default()
    }
}

async fn publish(c: &Client, stream: &str, payloads: &[&'static str]) {
    let payloads = payloads
        .iter()
        .map(|p| Bytes::from_static(p.as_bytes()))
        .collect();
    c.publish(NS, stream, payloads, None, Ack::PerMessage)
        .await
        .expect("publish");
}

#[tokio::test]
async fn poll_ack_nack_dead_letter_redrive_and_discard() {
    let dir = TempDir::new("groups-delivery");
    let broker = start(dir.path(), groups_config()).await;
    let c = client(&broker).await;
    let s = unique("jobs");
    publish(&c, &s, &["a", "b", "c"]).await;

    let got = c.group(NS, &s, 0, "g").poll(&now_poll(10)).await.unwrap();
    let seen: Vec<(u64, &[u8], Option<u64>)> = got
        .iter()
        .map(|r| (r.offset, &r.payload[..], r.attempts))
        .collect();
    assert_eq!(
        seen,
        vec![
            (0, &b"a"[..], Some(1)),
            (1, &b"b"[..], Some(1)),
            (2, &b"c"[..], Some(1))
        ]
    );
    // Claimed: nobody else gets them.
    assert!(c
        .group(NS, &s, 0, "g")
        .poll(&now_poll(10))
        .await
        .unwrap()
        .is_empty());

    c.group(NS, &s, 0, "g").ack(0).await.unwrap();
    c.group(NS, &s, 0, "g").ack(2).await.unwrap();
    let info = c.group(NS, &s, 0, "g").describe().await.unwrap();
    assert_eq!(
        info.committed,
        Some(1),
        "the cursor stops at the unsettled 1"
    );
    assert_eq!(info.tail, 3);

    // 1 is nacked until it runs out of attempts (3), then dead-lettered.
    c.group(NS, &s, 0, "g")
        .nack(1, None, Some(1))
        .await
        .unwrap();
    for attempt in 2..=3 {
        let again = c.group(NS, &s, 0, "g").poll(&now_poll(10)).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].offset, again[0].attempts), (1, Some(attempt)));
        c.group(NS, &s, 0, "g")
            .nack(1, None, Some(attempt))
            .await
            .unwrap();
    }
    assert!(c
        .group(NS, &s, 0, "g")
        .poll(&now_poll(10))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        c.group(NS, &s, 0, "g").dead_letters().await.unwrap(),
        vec![1]
    );
    let info = c.group(NS, &s, 0, "g").describe().await.unwrap();
    assert_eq!((info.committed, info.dead_letters), (Some(3), 1));

    // Redrive: delivered again with attempts reset; the cursor does not move back.
    c.group(NS, &s, 0, "g").redrive(1).await.unwrap();
    assert!(c
        .group(NS, &s, 0, "g")
        .dead_letters()
        .await
        .unwrap()
        .is_empty());
    let again = c.group(NS, &s, 0, "g").poll(&now_poll(10)).await.unwrap();
    assert_eq!(
        again
            .iter()
            .map(|r| (r.offset, r.attempts))
            .collect::<Vec<_>>(),
        vec![(1, Some(1))]
    );
    // Given up on by hand this time, then discarded.
    c.group(NS, &s, 0, "g").dead_letter(1).await.unwrap();
    assert_eq!(
        c.group(NS, &s, 0, "g").dead_letters().await.unwrap(),
        vec![1]
    );
    c.group(NS, &s, 0, "g").discard(1).await.unwrap();
    assert!(c
        .group(NS, &s, 0, "g")
        .dead_letters()
        .await
        .unwrap()
        .is_empty());
    let err = c.group(NS, &s, 0, "g").discard(1).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some(&felix_client::ErrorCode::InvalidRequest),
        "{err}"
    );
    // Past the tail was never handed out.
    let err = c.group(NS, &s, 0, "g").ack(99).await.unwrap_err();
    assert_eq!(err.code(), Some(&felix_client::ErrorCode::InvalidRequest));
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn polled_records_carry_their_append_time() {
    // Taken before the broker starts: its wall clock is the time it read at startup plus
    // monotonic time since, so no append it stamps can be earlier than this.
    let before = unix_micros();
    let dir = TempDir::new("groups-times");
    let broker = start(dir.path(), groups_config()).await;
    let c = client(&broker).await;
    let s = unique("stamped");
    publish(&c, &s, &["a"]).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    publish(&c, &s, &["b", "c"]).await;
    let got = c.group(NS, &s, 0, "g").poll(&now_poll(10)).await.unwrap();
    let after = unix_micros();

    let times: Vec<u64> = got
        .iter()
        .map(|r| {
            r.timestamp_micros
                .unwrap_or_else(|| panic!("record {} has no timestamp_micros", r.offset))
        })
        .collect();
    assert_eq!(times.len(), 3);
    // The monotonic clock may run a little ahead of the wall clock over the test, hence
    // the slack at the end; a value in another unit or from another clock is far outside.
    let window = before..=after + 5_000;
    for t in &times {
        assert!(window.contains(t), "{t} not in {window:?}");
    }
    assert!(
        times[1] >= times[0] + 20_000,
        "the second batch was appended after the 20 ms pause: {times:?}"
    );
    assert!(times[1] <= times[2], "appended in offset order: {times:?}");
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn two_groups_over_one_shard_each_see_every_record() {
    let dir = TempDir::new("groups-two");
    let broker = start(dir.path(), groups_config()).await;
    let c = client(&broker).await;
    let s = unique("fanout");
    publish(&c, &s, &["x", "y"]).await;
    let a = c.group(NS, &s, 0, "a").poll(&now_poll(10)).await.unwrap();
    for r in &a {
        c.group(NS, &s, 0, "a").ack(r.offset).await.unwrap();
    }
    let b = c.group(NS, &s, 0, "b").poll(&now_poll(10)).await.unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(
        a.iter().map(|r| r.offset).collect::<Vec<_>>(),
        b.iter().map(|r| r.offset).collect::<Vec<_>>()
    );
    let ia = c.group(NS, &s, 0, "a").describe().await.unwrap();
    let ib = c.group(NS, &s, 0, "b").describe().await.unwrap();
    assert_eq!(ia.committed, Some(2));
    assert_eq!((ib.committed, ib.in_flight), (None, 2));
    c.close().await;
    stop(broker).await;
}

/// How many `group_poll` requests have reached their handler, from `/metrics`. A poll is
/// counted once the broker has registered it, so a count that moved means it is waiting.
/// The scrape is blocking I/O, kept off the runtime the broker runs on.
async fn polls_handled(http: std::net::SocketAddr) -> f64 {
    let samples = tokio::task::spawn_blocking(move || scrape(http))
        .await
        .unwrap();
    value(&samples, "felix_broker_group_operations_total{op=\"poll\"}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_poll_returns_as_soon_as_a_record_is_published() {
    let dir = TempDir::new("groups-wait");
    // The poll may wait an hour: only the publish can end it within the test's deadline, and
    // that deadline only fails a hung test. How soon the wake comes is not asserted; the
    // engine's virtual-clock tests (felix-engine/tests/groups.rs) pin the deadlines.
    let mut durable = groups_config();
    durable.groups.max_wait = Duration::from_secs(3_600);
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.storage_dir = Some(dir.path().to_path_buf());
    opts.durable = durable;
    opts.metrics_bind = Some("127.0.0.1:0".parse().unwrap());
    let broker = within(20, start_broker(opts)).await.unwrap();
    let http = broker.metrics_addr().expect("metrics endpoint enabled");
    let c = client(&broker).await;
    let s = unique("wake");
    // The stream exists and is empty.
    assert!(c
        .group(NS, &s, 0, "g")
        .poll(&now_poll(1))
        .await
        .unwrap()
        .is_empty());
    let before = polls_handled(http).await;
    let poller = {
        let c = c.clone();
        let s = s.clone();
        tokio::spawn(async move {
            let opts = PollOptions {
                max_records: 10,
                wait: Duration::from_secs(3_600),
                ..PollOptions::default()
            };
            c.group(NS, &s, 0, "g").poll(&opts).await.unwrap()
        })
    };
    // Wait for the broker to hold the poll (it found nothing, so it is waiting), not for a
    // guessed length of time: the publish must come after it for this to test the wake.
    within(20, async {
        while polls_handled(http).await == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(!poller.is_finished(), "an empty shard's poll waits");
    publish(&c, &s, &["late"]).await;
    let got = within(60, poller)
        .await
        .expect("the publish wakes the poll long before its hour");
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].payload[..], b"late");

    // A wait with nothing to find ends, empty (at its deadline: the engine test above).
    let opts = PollOptions {
        max_records: 10,
        wait: Duration::from_millis(100),
        ..PollOptions::default()
    };
    assert!(within(60, c.group(NS, &s, 0, "g").poll(&opts))
        .await
        .unwrap()
        .is_empty());
    c.close().await;
    stop(broker).await;
}

#[tokio::test]
async fn a_lapsed_claim_is_delivered_again_and_an_extension_keeps_it() {
    let dir = TempDir::new("groups-lapse");
    let broker = start(dir.path(), groups_config()).await;
    let c = client(&broker).await;
    let s = unique("lapse");
    publish(&c, &s, &["p", "q"]).await;
    let short = PollOptions {
        max_records: 10,
        visibility: Some(Duration::from_millis(300)),
        ..PollOptions::default()
    };
    let got = c.group(NS, &s, 0, "g").poll(&short).await.unwrap();
    assert_eq!(got.len(), 2);
    // Keep 1's claim; let 0's lapse.
    let granted = c
        .group(NS, &s, 0, "g")
        .extend(1, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(granted, Duration::from_secs(30));
    let opts = PollOptions {
        max_records: 10,
        wait: Duration::from_secs(5),
        ..PollOptions::default()
    };
    let again = c.group(NS, &s, 0, "g").poll(&opts).await.unwrap();
    assert_eq!(
        again
            .iter()
            .map(|r| (r.offset, r.attempts))
            .collect::<Vec<_>>(),
        vec![(0, Some(2))],
        "the waiting poll is woken by the lapse"
    );
    // The first delivery of 0 no longer stands.
    let err = c
        .group(NS, &s, 0, "g")
        .extend(0, 1, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&felix_client::ErrorCode::StaleClaim));
    assert_eq!(err.retry(), Some(felix_client::RetryClass::Fatal));
    c.close().await;
    stop(broker).await;
}
