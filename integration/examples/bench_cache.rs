//! Cache features under load: watch fan-out latency (a put until each watcher has the
//! change) at several watcher counts, and counter adds per second.
//!
//! ```text
//! cargo run --release -p felix-integration --example bench_cache -- \
//!     [--watchers 1,50,500] [--puts 300] [--interval-ms 5] \
//!     [--adders 1,16] [--secs 3] [--fsync periodic|on_commit] [--dir PATH]
//! ```
//!
//! One broker, durable (the features need a log) under a fresh directory, in this process
//! on a runtime and thread of its own; the clients run on another runtime. For each watcher
//! count: that many key watches (spread over connections of at most 100), then `puts`
//! sequential puts `interval-ms` apart, each value carrying its send time; a watcher's
//! latency is its receipt time minus that. For each adder count: that many tasks add 1 to
//! one counter in a loop, each waiting for its answer, for `secs`. Output is plain lines.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{CacheWatchItem, Client, WatchFilter, WatchStart};
use felix_integration::{BenchArgs, BenchBroker};
use felix_runtime_tokio::felix_engine::{DurableConfig, FsyncPolicy};
use felix_runtime_tokio::BrokerOptions;
use hdrhistogram::Histogram;

async fn client(broker: &BenchBroker) -> Client {
    let mut c = broker.client_config();
    c.connect_streams = 8;
    Client::connect(c).await.expect("client connects")
}

fn micros(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64
}

async fn fanout(
    broker: &BenchBroker,
    base: Instant,
    watchers: usize,
    puts: usize,
    interval: Duration,
) {
    let cache = format!("fanout-{watchers}");
    let per_conn = 100;
    let mut clients = Vec::new();
    for _ in 0..watchers.div_ceil(per_conn) {
        clients.push(client(broker).await);
    }
    let hist = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram"),
    ));
    let mut tasks = Vec::new();
    for i in 0..watchers {
        let mut w = clients[i / per_conn]
            .watch_cache(
                "default",
                &cache,
                WatchFilter::Key("k".into()),
                WatchStart::Live,
            )
            .await
            .expect("watch");
        let hist = hist.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::with_capacity(puts);
            while mine.len() < puts {
                match tokio::time::timeout(Duration::from_secs(30), w.next()).await {
                    Ok(Ok(CacheWatchItem::Change(c))) => {
                        let value = c.value.expect("a put");
                        let sent = u64::from_le_bytes(value[..8].try_into().expect("8 bytes"));
                        let now = base.elapsed().as_micros() as u64;
                        mine.push(now.saturating_sub(sent).max(1));
                    }
                    other => panic!("watcher stopped: {other:?}"),
                }
            }
            let mut h = hist.lock().expect("histogram");
            for v in mine {
                h.record(v).expect("in range");
            }
        }));
    }
    let writer = client(broker).await;
    let started = Instant::now();
    for _ in 0..puts {
        let sent = base.elapsed().as_micros() as u64;
        let mut value = sent.to_le_bytes().to_vec();
        value.extend_from_slice(&[b'x'; 56]);
        writer
            .cache_put("default", &cache, "k", Bytes::from(value), None)
            .await
            .expect("put");
        tokio::time::sleep(interval).await;
    }
    for t in tasks {
        t.await.expect("watcher");
    }
    let elapsed = started.elapsed();
    let h = hist.lock().expect("histogram").clone();
    println!(
        "watch_fanout watchers={watchers} puts={puts} changes_delivered={} p50_us={:.0} p99_us={:.0} max_us={} changes_per_s={:.0}",
        h.len(),
        micros(&h, 0.5),
        micros(&h, 0.99),
        h.max(),
        h.len() as f64 / elapsed.as_secs_f64()
    );
    for c in clients {
        c.close().await;
    }
    writer.close().await;
}

async fn counters(broker: &BenchBroker, adders: usize, secs: u64) {
    let c = client(broker).await;
    let cache = format!("counters-{adders}");
    let stop_at = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..adders {
        let c = c.clone();
        let cache = cache.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < stop_at {
                c.counter_add("default", &cache, "n", 1).await.expect("add");
                n += 1;
            }
            n
        }));
    }
    let started = Instant::now();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("adder");
    }
    let elapsed = started.elapsed();
    let sum = c
        .counter_get("default", &cache, "n")
        .await
        .expect("get")
        .expect("written");
    assert_eq!(sum as u64, total, "every acknowledged add counted once");
    println!(
        "counter_adds adders={adders} adds={total} adds_per_s={:.0} mean_latency_us={:.0}",
        total as f64 / elapsed.as_secs_f64(),
        elapsed.as_micros() as f64 * adders as f64 / total.max(1) as f64
    );
    c.close().await;
}

fn main() {
    let args = BenchArgs::parse();
    let watchers = args.list("watchers", "1,50,500");
    let adders = args.list("adders", "1,16");
    let puts: usize = args.get("puts", 300);
    let interval = Duration::from_millis(args.get("interval-ms", 5));
    let secs: u64 = args.get("secs", 3);
    let fsync = match args.get("fsync", "periodic".to_owned()).as_str() {
        "on_commit" => FsyncPolicy::OnCommit,
        _ => FsyncPolicy::Periodic(Duration::from_millis(250)),
    };
    let root: PathBuf = args.get("dir", std::env::temp_dir());
    let dir = root.join(format!("felix-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("storage dir");
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().expect("literal"));
    opts.storage_dir = Some(dir.clone());
    opts.durable = {
        let mut durable_config = DurableConfig::default();
        durable_config.fsync = fsync;
        durable_config
    };
    let broker = BenchBroker::start(opts);
    println!("fsync: {fsync:?}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime");
    rt.block_on(async {
        let base = Instant::now();
        for &n in &watchers {
            fanout(&broker, base, n, puts, interval).await;
        }
        for &n in &adders {
            counters(&broker, n, secs).await;
        }
    });
    drop(rt);
    broker.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
