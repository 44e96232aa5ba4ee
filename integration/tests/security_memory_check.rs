//! The memory check of docs/limits.md: 1000 connections, each with the reference client's 40
//! authenticated streams, held for a minute of light traffic against the release
//! `felix-broker` binary. Reports the broker's peak resident memory and the p99 publish latency
//! of one well-behaved client, and checks both against their stated bounds.
//!
//! A load test, run by hand (it takes minutes and most of a 2-core machine):
//!
//! ```text
//! cargo build --release --bin felix-broker
//! FELIX_BROKER_BIN=target/release/felix-broker \
//!   cargo test --release -p felix-integration --test security_memory_check -- --ignored --nocapture
//! ```
//!
//! `FELIX_MEMCHECK_CONNECTIONS` and `FELIX_MEMCHECK_SECS` shrink it for a quick look.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{Ack, Client, ClientConfig};
use felix_integration::{spawn_broker_binary, unique};

/// The broker's resident memory must stay under this.
const RSS_BOUND_BYTES: u64 = 512 << 20;
/// The well-behaved client's p99 publish round trip must stay under this.
const P99_BOUND: Duration = Duration::from_millis(10);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// VmRSS of `pid`, in bytes.
fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a load test of several minutes that needs the release broker binary; run by hand (command in docs/limits.md)"]
async fn a_thousand_reference_clients_stay_within_memory_and_latency_bounds() {
    // A relative FELIX_BROKER_BIN (as docs/limits.md writes it) is from the workspace root.
    let bin = felix_integration::from_workspace(
        &std::env::var("FELIX_BROKER_BIN")
            .unwrap_or_else(|_| "target/release/felix-broker".to_owned()),
    )
    .display()
    .to_string();
    let connections = env_or("FELIX_MEMCHECK_CONNECTIONS", 1000) as usize;
    let hold = Duration::from_secs(env_or("FELIX_MEMCHECK_SECS", 60));
    let (mut child, addr, ca, token) = spawn_broker_binary(&bin).await;
    let pid = child.id();
    let config = |streams: usize| {
        let mut c = ClientConfig::new(addr, ca.clone(), "t1", &token);
        c.connect_streams = streams;
        c.connect_timeout = Duration::from_secs(30);
        c.request_timeout = Duration::from_secs(30);
        // Keep-alives (a third of this) hold idle connections open for the minute.
        c.idle_timeout = Duration::from_secs(15);
        // A small window: the reference client does not buy megabytes per stream either.
        c.stream_receive_window = 256 * 1024;
        c
    };
    let idle_rss = rss(pid).unwrap_or(0);

    // Connect in waves of 50, each client authenticating its 40 streams.
    let started = Instant::now();
    let mut clients: Vec<Client> = Vec::with_capacity(connections);
    while clients.len() < connections {
        let wave = (connections - clients.len()).min(50);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..wave {
            let c = config(40);
            set.spawn(async move { Client::connect(c).await });
        }
        while let Some(r) = set.join_next().await {
            clients.push(r.unwrap().expect("a reference client connects"));
        }
    }
    println!(
        "{} connections x 40 streams up in {:.1} s; broker RSS {} MiB (idle {} MiB)",
        clients.len(),
        started.elapsed().as_secs_f64(),
        rss(pid).unwrap_or(0) >> 20,
        idle_rss >> 20
    );

    // Light traffic: every client publishes one small record every 5 s, spread out.
    let stop = Arc::new(AtomicBool::new(false));
    let mut background = tokio::task::JoinSet::new();
    for (i, client) in clients.iter().cloned().enumerate() {
        let stop = stop.clone();
        let stream = format!("light-{}", i % 100);
        background.spawn(async move {
            tokio::time::sleep(Duration::from_millis((i as u64 * 5) % 5000)).await;
            while !stop.load(Ordering::Relaxed) {
                let _ = client
                    .publish(
                        "default",
                        &stream,
                        vec![Bytes::from_static(b"light")],
                        None,
                        Ack::PerMessage,
                    )
                    .await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }

    // The well-behaved client: acked publishes every 20 ms, timed.
    let probe = Client::connect(config(1)).await.expect("probe connects");
    let probe_stream = unique("probe");
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    let mut peak = 0u64;
    let end = Instant::now() + hold;
    let mut next_sample = Instant::now();
    while Instant::now() < end {
        let t = Instant::now();
        probe
            .publish(
                "default",
                &probe_stream,
                vec![Bytes::from_static(b"probe")],
                None,
                Ack::PerMessage,
            )
            .await
            .expect("the probe's publish is answered");
        histogram
            .record(t.elapsed().as_micros() as u64)
            .expect("in range");
        if Instant::now() >= next_sample {
            peak = peak.max(rss(pid).unwrap_or(0));
            next_sample += Duration::from_secs(1);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    background.abort_all();
    let p99 = Duration::from_micros(histogram.value_at_quantile(0.99));
    println!(
        "held {} s: broker peak RSS {} MiB (bound {} MiB); probe p50 {} us, p99 {} us, max {} us over {} publishes (bound {} ms)",
        hold.as_secs(),
        peak >> 20,
        RSS_BOUND_BYTES >> 20,
        histogram.value_at_quantile(0.5),
        p99.as_micros(),
        histogram.max(),
        histogram.len(),
        P99_BOUND.as_millis()
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(peak < RSS_BOUND_BYTES, "broker RSS {peak} bytes");
    assert!(p99 < P99_BOUND, "p99 {p99:?}");
}
