//! Consumer-group benchmark: records/s through poll → ack with several consumers, and how
//! soon a waiting poll returns after a publish.
//!
//! ```text
//! cargo run --release -p felix-integration --example bench_groups -- \
//!     [--records 100000] [--consumers 4] [--size 256] [--batch 256] [--acks-in-flight 32] \
//!     [--wakeups 50] [--fsync periodic|on_commit]
//! ```
//!
//! A fresh in-process durable broker (own runtime and thread, storage in a temporary
//! directory) is filled with `records` records of `size` bytes, then `consumers` clients
//! poll the same group (up to `batch` records each, waiting 1 s) and ack every record,
//! `acks-in-flight` acks at a time per consumer. Then one consumer waits on an empty group
//! while a publish lands, `wakeups` times: the wake-up latency is from just before the
//! publish to the poll's answer (it includes the publish's own round trip and write).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{Ack, PollOptions};
use felix_integration::BenchBroker;
use felix_runtime_tokio::felix_engine::{DurableConfig, FsyncPolicy};
use felix_runtime_tokio::BrokerOptions;

const NS: &str = "default";

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == &format!("--{name}"))
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("--{name} {v}?")))
        .unwrap_or(default)
}

/// A durable broker on its own thread, storing under `dir`.
fn start_broker(dir: PathBuf, durable: DurableConfig) -> BenchBroker {
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().expect("literal"));
    opts.storage_dir = Some(dir);
    opts.durable = durable;
    BenchBroker::start(opts)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let records: u64 = arg("records", 100_000);
    let consumers: usize = arg("consumers", 4);
    let size: usize = arg("size", 256);
    let batch: u64 = arg("batch", 256);
    let acks_in_flight: usize = arg("acks-in-flight", 32);
    let wakeups: usize = arg("wakeups", 50);
    let fsync: String = arg("fsync", "periodic".to_string());
    let durable = {
        let mut durable_config = DurableConfig::default();
        durable_config.fsync = match fsync.as_str() {
            "on_commit" => FsyncPolicy::OnCommit,
            _ => DurableConfig::default().fsync,
        };
        durable_config
    };
    let dir = std::env::temp_dir().join(format!("felix-bench-groups-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    println!(
        "config: {records} records x {size} B, {consumers} consumers, poll batch {batch}, \
         {acks_in_flight} acks in flight per consumer, fsync {fsync}"
    );
    let broker = start_broker(dir.clone(), durable);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("client-rt")
        .enable_all()
        .build()
        .expect("client runtime");
    rt.block_on(async {
        let publisher = broker.client().await;
        let payload = Bytes::from(vec![0x5a; size]);
        let mut sent = 0;
        while sent < records {
            let n = (records - sent).min(512);
            let batch: Vec<Bytes> = (0..n).map(|_| payload.clone()).collect();
            publisher
                .publish(NS, "work", batch, None, Ack::PerMessage)
                .await
                .expect("publish");
            sent += n;
        }

        let acked = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..consumers {
            let c = broker.client().await;
            let acked = acked.clone();
            tasks.push(tokio::spawn(async move {
                let opts = PollOptions {
                    max_records: batch,
                    wait: Duration::from_secs(1),
                    consumer: Some(format!("bench-{i}")),
                    ..PollOptions::default()
                };
                let g = c.group(NS, "work", 0, "g");
                loop {
                    if acked.load(Ordering::Relaxed) >= records {
                        break;
                    }
                    let got = g.poll(&opts).await.expect("poll");
                    if got.is_empty() {
                        continue;
                    }
                    let mut acks: tokio::task::JoinSet<Result<(), felix_client::ClientError>> =
                        tokio::task::JoinSet::new();
                    for r in got {
                        if acks.len() >= acks_in_flight {
                            acks.join_next()
                                .await
                                .expect("some")
                                .expect("task")
                                .expect("ack");
                        }
                        let g = g.clone();
                        acks.spawn(async move { g.ack(r.offset).await });
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    while let Some(r) = acks.join_next().await {
                        r.expect("task").expect("ack");
                    }
                }
                c.close().await;
            }));
        }
        for t in tasks {
            t.await.expect("consumer");
        }
        let secs = started.elapsed().as_secs_f64();
        let info = publisher
            .group(NS, "work", 0, "g")
            .describe()
            .await
            .expect("describe");
        assert_eq!(info.committed, Some(records), "every record acked once");
        println!(
            "poll→ack: {records} records in {secs:.2} s = {:.0} records/s ({:.1} MB/s of payload)",
            records as f64 / secs,
            records as f64 * size as f64 / secs / 1e6
        );

        // Wake-up latency: a poll waiting on an empty group, then one publish.
        let waiter = broker.client().await;
        let mut lat = Vec::new();
        for _ in 0..wakeups {
            let w = waiter.clone();
            let poll = tokio::spawn(async move {
                let opts = PollOptions {
                    max_records: 1,
                    wait: Duration::from_secs(5),
                    ..PollOptions::default()
                };
                let got = w.group(NS, "wake", 0, "g").poll(&opts).await.expect("poll");
                (Instant::now(), got)
            });
            // Let the poll reach the broker and start waiting.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let at = Instant::now();
            publisher
                .publish(NS, "wake", vec![payload.clone()], None, Ack::PerMessage)
                .await
                .expect("publish");
            let (done, got) = poll.await.expect("poll task");
            assert_eq!(got.len(), 1, "the waiting poll got the record");
            waiter
                .group(NS, "wake", 0, "g")
                .ack(got[0].offset)
                .await
                .expect("ack");
            lat.push(done.duration_since(at));
        }
        lat.sort();
        println!(
            "wake-up: {wakeups} polls, publish→answer p50 {:?} p99 {:?} max {:?}",
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat[lat.len() - 1]
        );
        publisher.close().await;
        waiter.close().await;
    });
    broker.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
