//! `stream_read` throughput: pages of a durable shard read back over QUIC by our client.
//!
//! ```text
//! cargo run --release -p felix-integration --example bench_stream_read -- \
//!     [--mib 64] [--size 1024] [--batch 64] [--dir /tmp] [--direct-io on|off]
//! ```
//!
//! Writes `--mib` MiB of `--size`-byte records (`--batch` per publish, eight publishers in
//! flight) to one shard of a durable broker (periodic fsync), then reads the shard back from
//! offset 0 page by page (the broker's caps: 4 MiB or 10 000 records a page), once from the
//! broker that wrote it (the tail cache may hold the newest records) and once after a
//! restart on the same directory (every page is a file read; the OS page cache holds the
//! data only with `--direct-io off`).
//! Prints payload MB/s (10^6 bytes) for each read pass. The broker runs on its own thread
//! and runtime; the client on one tokio worker.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{Ack, Client};
use felix_integration::BenchBroker;
use felix_runtime_tokio::felix_engine::{DurableConfig, FsyncPolicy};
use felix_runtime_tokio::BrokerOptions;

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == &format!("--{name}"))
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().unwrap_or_else(|_| panic!("bad --{name}")))
        .unwrap_or(default)
}

/// A durable broker (periodic fsync) on its own thread, storing under `dir`.
fn start_broker(dir: PathBuf) -> BenchBroker {
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().expect("literal"));
    opts.storage_dir = Some(dir);
    // `--direct-io off`: buffered appends, so the restarted pass reads a warm page cache
    // (direct appends leave nothing there).
    opts.direct_io = arg("direct-io", "on".to_owned()) != "off";
    opts.durable = {
        let mut durable_config = DurableConfig::default();
        durable_config.fsync = FsyncPolicy::Periodic(Duration::from_millis(250));
        durable_config
    };
    BenchBroker::start(opts)
}

/// Reads the whole shard page by page; gives (records, payload bytes, seconds, pages).
async fn read_all(c: &Client, stream: &str, end: u64) -> (u64, u64, f64, u64) {
    let started = Instant::now();
    let (mut from, mut records, mut bytes, mut pages) = (0u64, 0u64, 0u64, 0u64);
    while from < end {
        let page = c
            .stream_read("default", stream, 0, from, Some(end), None)
            .await
            .expect("page");
        assert!(page.next_offset > from, "stuck at {from}");
        records += page.records.len() as u64;
        bytes += page
            .records
            .iter()
            .map(|r| r.payload.len() as u64)
            .sum::<u64>();
        pages += 1;
        from = page.next_offset;
    }
    (records, bytes, started.elapsed().as_secs_f64(), pages)
}

fn main() {
    let mib: u64 = arg("mib", 64);
    let size: usize = arg("size", 1024);
    let batch: usize = arg("batch", 64);
    let base = PathBuf::from(arg(
        "dir",
        std::env::temp_dir().to_string_lossy().into_owned(),
    ));
    let dir = base.join(format!("felix-bench-stream-read-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("storage dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("client runtime");
    let stream = "history";
    let total_records = mib * (1 << 20) / size as u64;
    let publishes = total_records.div_ceil(batch as u64);
    println!("config: {mib} MiB as {total_records} records of {size} B, {batch} per publish");

    let broker = start_broker(dir.clone());
    let end = rt.block_on(async {
        let c = broker.client().await;
        let started = Instant::now();
        let mut tasks = Vec::new();
        let writers = 8u64;
        for w in 0..writers {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let payloads: Vec<Bytes> = (0..batch).map(|_| Bytes::from(vec![w as u8; size])).collect();
                let mut i = w;
                while i < publishes {
                    c.publish("default", stream, payloads.clone(), None, Ack::PerBatch)
                        .await
                        .expect("publish");
                    i += writers;
                }
            }));
        }
        for t in tasks {
            t.await.expect("writer");
        }
        let secs = started.elapsed().as_secs_f64();
        let end = publishes * batch as u64;
        println!(
            "write: {:.1} MB/s ({end} records in {secs:.2} s)",
            (end * size as u64) as f64 / secs / 1e6
        );
        // Periodic fsync: wait for the interval so every record is readable.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let (records, bytes, secs, pages) = read_all(&c, stream, end).await;
        assert_eq!(records, end, "every record read back");
        println!(
            "stream_read (writing broker): {:.1} MB/s ({records} records, {pages} pages, {secs:.2} s)",
            bytes as f64 / secs / 1e6
        );
        end
    });
    broker.stop();

    let broker = start_broker(dir.clone());
    rt.block_on(async {
        let c = broker.client().await;
        let (records, bytes, secs, pages) = read_all(&c, stream, end).await;
        assert_eq!(records, end, "every record read back after the restart");
        println!(
            "stream_read (after restart): {:.1} MB/s ({records} records, {pages} pages, {secs:.2} s)",
            bytes as f64 / secs / 1e6
        );
    });
    broker.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
