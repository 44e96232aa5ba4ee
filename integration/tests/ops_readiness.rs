//! `/readyz` tells the truth during recovery: a broker reopening a large durable directory
//! answers `/livez` 200 and `/readyz` 503 while it scans its logs, and `/readyz` 200 once it
//! serves. The durable gauges and histograms (log bytes, fsync latency, group commit) move.

use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::Ack;
use felix_integration::durable_support::{client, on_commit, TempDir};
use felix_integration::ops_support::{get, scrape, value};
use felix_integration::{start_broker, unique, within};
use felix_runtime_tokio::BrokerOptions;

/// Records of 64 KiB, 16 per publish: 1 MiB a request.
const RECORD: usize = 64 * 1024;
const PER_PUBLISH: usize = 16;
const PUBLISHES: usize = 64;

fn options(dir: &std::path::Path, metrics: std::net::SocketAddr) -> BrokerOptions {
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().unwrap());
    opts.storage_dir = Some(dir.to_path_buf());
    opts.durable = on_commit();
    opts.metrics_bind = Some(metrics);
    opts
}

/// A loopback TCP port free a moment ago.
fn free_tcp_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_false_while_a_large_log_recovers_and_true_after() {
    let dir = TempDir::new("ops-ready");
    let broker = within(
        20,
        start_broker(options(dir.path(), "127.0.0.1:0".parse().unwrap())),
    )
    .await
    .unwrap();
    let http = broker.metrics_addr().unwrap();
    let c = client(&broker).await;
    let stream = unique("big");
    let payload = Bytes::from(vec![7u8; RECORD]);
    for _ in 0..PUBLISHES {
        let batch = vec![payload.clone(); PER_PUBLISH];
        within(
            20,
            c.publish("default", &stream, batch, None, Ack::PerBatch),
        )
        .await
        .unwrap();
    }
    let m = scrape(http);
    let written = (RECORD * PER_PUBLISH * PUBLISHES) as f64;
    assert!(value(&m, "felix_broker_log_bytes") >= written, "{m:?}");
    // on_commit: every acked publish waited for an fsync, which released its answer.
    assert!(value(&m, "felix_broker_fsync_seconds_count") >= 1.0);
    assert!(value(&m, "felix_broker_group_commit_batch_count") >= 1.0);
    assert_eq!(
        value(
            &m,
            "felix_broker_published_records_total{encoding=\"binary\"}"
        ),
        (PER_PUBLISH * PUBLISHES) as f64
    );
    c.close().await;
    within(20, broker.shutdown()).await.unwrap();

    // Reopen on a known port, probing from the first moment the endpoint answers.
    let metrics: std::net::SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    let began = Instant::now();
    let starting = tokio::spawn(start_broker(options(dir.path(), metrics)));
    let (mut not_ready, mut live_while_not_ready) = (0, 0);
    let mut ready = false;
    while began.elapsed() < Duration::from_secs(30) {
        let probe =
            tokio::task::spawn_blocking(move || (get(metrics, "/readyz"), get(metrics, "/livez")));
        match probe.await.unwrap() {
            (Some((503, _)), live) => {
                not_ready += 1;
                live_while_not_ready += usize::from(live.is_some_and(|(s, _)| s == 200));
            }
            (Some((200, _)), _) => {
                ready = true;
                break;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let broker = within(30, starting).await.unwrap().unwrap();
    let took = began.elapsed();
    eprintln!("recovery: {took:?}, /readyz 503 seen {not_ready} times");
    assert!(ready, "/readyz never turned 200");
    assert!(
        not_ready > 0,
        "/readyz was never seen false (recovery took {took:?})"
    );
    assert!(live_while_not_ready > 0, "/livez answers during recovery");
    // Ready means serving: the scrape now comes from the running loop.
    assert_eq!(value(&scrape(metrics), "felix_broker_ready"), 1.0);
    assert!(value(&scrape(metrics), "felix_broker_log_bytes") >= written);
    within(20, broker.shutdown()).await.unwrap();
}
