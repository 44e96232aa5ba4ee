//! Cluster benchmark: three in-process nodes on loopback, publishes direct to a shard's leader
//! against the same publishes through a node that forwards them, in one run.
//!
//! ```text
//! cargo run --release -p felix-integration --example bench_cluster -- [--secs S] [--rounds R]
//!     [--publishers K] [--samples N] [--size BYTES]
//! ```
//!
//! Prints, as `name: value` lines: the time from starting three nodes to all three answering
//! `/readyz` 200 (joined); per round, acked publishes per second with K concurrent publishers
//! and batch-1 acked publish latency (p50, p99), direct and forwarded, in alternating order;
//! and the medians' ratios. The machine is shared with the clients, so compare the ratios.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{Ack, Client, Offer};
use felix_integration::cluster_support::{Cluster, NODES};
use hdrhistogram::Histogram;

struct Opts {
    secs: u64,
    rounds: usize,
    publishers: usize,
    samples: usize,
    size: usize,
}

fn opts() -> Opts {
    let mut o = Opts {
        secs: 3,
        rounds: 3,
        publishers: 8,
        samples: 2000,
        size: 256,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = || {
            args.get(i + 1)
                .and_then(|v| v.parse::<u64>().ok())
                .expect("a number")
        };
        match args[i].as_str() {
            "--secs" => o.secs = v(),
            "--rounds" => o.rounds = v() as usize,
            "--publishers" => o.publishers = v() as usize,
            "--samples" => o.samples = v() as usize,
            "--size" => o.size = v() as usize,
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    o
}

async fn throughput(c: &Client, stream: &str, key: &Bytes, o: &Opts) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let payload = Bytes::from(vec![7u8; o.size]);
    let mut tasks = Vec::new();
    for _ in 0..o.publishers {
        let (c, stop, done) = (c.clone(), stop.clone(), done.clone());
        let (stream, key, payload) = (stream.to_owned(), key.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                c.publish(
                    "default",
                    &stream,
                    vec![payload.clone()],
                    Some(key.clone()),
                    Ack::PerBatch,
                )
                .await
                .expect("acked publish");
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let began = Instant::now();
    tokio::time::sleep(Duration::from_secs(o.secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / began.elapsed().as_secs_f64()
}

async fn latency(c: &Client, stream: &str, key: &Bytes, o: &Opts) -> (u64, u64) {
    let mut h = Histogram::<u64>::new(3).unwrap();
    let payload = Bytes::from(vec![7u8; o.size]);
    for _ in 0..o.samples {
        let t = Instant::now();
        c.publish(
            "default",
            stream,
            vec![payload.clone()],
            Some(key.clone()),
            Ack::PerBatch,
        )
        .await
        .expect("acked publish");
        h.record(t.elapsed().as_micros() as u64).unwrap();
    }
    (h.value_at_quantile(0.5), h.value_at_quantile(0.99))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = opts();
    let began = Instant::now();
    let c = Cluster::start(3).await;
    println!(
        "connect_to_ready_ms: {:.0}",
        began.elapsed().as_secs_f64() * 1e3
    );
    let owners = c.owners(0).await;
    let led = owners
        .iter()
        .find(|s| s.node_id.as_deref() != Some(NODES[0]))
        .expect("n1 does not lead every shard");
    let leader = NODES
        .iter()
        .position(|n| Some(*n) == led.node_id.as_deref())
        .unwrap();
    let shard = led.shard as u32;
    let key = (0..10_000)
        .map(|i| format!("key-{i}"))
        .find(|k| {
            let m = felix_proto::routing::RoutingMapping::Modulo;
            felix_proto::routing::shard_for_key(Some(k.as_bytes()), 3, m) == shard
        })
        .map(Bytes::from)
        .unwrap();
    println!(
        "leader: {}  entry_for_forwarded: {}",
        NODES[leader], NODES[0]
    );
    let direct = c.client(leader, Offer::reference_client()).await;
    let forwarded = c.client(0, Offer::reference_client()).await;
    let (mut dt, mut ft, mut dl, mut fl) = (vec![], vec![], vec![], vec![]);
    for round in 0..o.rounds {
        let order: [(&str, &Client); 2] = if round % 2 == 0 {
            [("direct", &direct), ("forwarded", &forwarded)]
        } else {
            [("forwarded", &forwarded), ("direct", &direct)]
        };
        for (name, client) in order {
            let rate = throughput(client, &c.stream, &key, &o).await;
            let (p50, p99) = latency(client, &c.stream, &key, &o).await;
            println!(
                "round {round} {name}: {rate:.0} acked publishes/s ({} publishers), batch-1 p50 {p50} us p99 {p99} us",
                o.publishers
            );
            let (t, l) = if name == "direct" {
                (&mut dt, &mut dl)
            } else {
                (&mut ft, &mut fl)
            };
            t.push(rate);
            l.push(p50 as f64);
        }
    }
    println!(
        "forwarded_over_direct_throughput: {:.2}",
        median(ft) / median(dt)
    );
    println!("forwarded_over_direct_p50: {:.2}", median(fl) / median(dl));
    c.shutdown().await;
}
