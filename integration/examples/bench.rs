//! Felix benchmark: our client against our broker over QUIC on loopback.
//!
//! ```text
//! cargo run --release -p felix-integration --example bench -- <scenario> [options]
//!   throughput [--fanout N] [--secs S] [--batch B] [--size BYTES] [--inflight K] [--broker PATH]
//!   latency    [--samples N]
//!   connect    [--samples N]
//!   memory     [--conns N] [--subs N] [--broker PATH]
//!   all
//! every scenario also takes --client-threads N (tokio workers for the clients, default 1:
//! with the broker on its own thread that fills this 2-core machine without the cross-thread
//! wake-ups a second client worker adds)
//! throughput and latency also take the transport knobs, each defaulting to the broker's
//! and the client's own default:
//!   --mtu N                 the broker's limits.mtu_upper_bound and max_udp_payload_size,
//!                           and the clients' mtu_upper_bound
//!   --client-mtu N          the clients' mtu_upper_bound alone
//!   --ack-threshold N       the broker's limits.ack_eliciting_threshold (asked of clients)
//!   --ack-delay-ms D        the broker's limits.max_ack_delay_ms
//!   --client-ack-threshold N  the clients' ack_eliciting_threshold (asked of the broker)
//! ```
//!
//! Both report the broker's CPU per delivered message: the broker threads' CPU time
//! (`/proc/self/task`, threads named `broker*`) in process, the child's (`/proc/PID/stat`)
//! with `--broker`; and this process's CPU the same way (clients included).
//!
//! `throughput` and `latency` run the broker in this process on its own tokio runtime (its
//! own thread), so the client's work does not queue behind it; `throughput --broker PATH`
//! uses the spawned binary instead. `memory` spawns the release
//! `felix-broker` binary so its VmRSS (/proc/<pid>/status) is the broker's alone.
//! Output is plain `name: value` lines.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{Ack, Client, ClientConfig, Start, SubscriptionItem};
use felix_integration::BenchBroker;
use felix_runtime_tokio::BrokerOptions;
use hdrhistogram::Histogram;

struct Args {
    scenario: String,
    opts: Vec<(String, String)>,
}

impl Args {
    fn parse() -> Args {
        let mut it = std::env::args().skip(1);
        let scenario = it.next().unwrap_or_else(|| "all".into());
        let mut opts = Vec::new();
        while let Some(k) = it.next() {
            let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
            opts.push((k.trim_start_matches("--").to_owned(), v));
        }
        Args { scenario, opts }
    }
    fn get<T: std::str::FromStr>(&self, key: &str, default: T) -> T {
        self.opts
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| {
                v.parse()
                    .unwrap_or_else(|_| panic!("bad value for --{key}"))
            })
            .unwrap_or(default)
    }
    fn opt<T: std::str::FromStr>(&self, key: &str) -> Option<T> {
        self.opts
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| {
                v.parse()
                    .unwrap_or_else(|_| panic!("bad value for --{key}"))
            })
    }
    fn get_str(&self, key: &str, default: &str) -> String {
        self.opts
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| default.into())
    }
}

/// Where the broker is and how to authenticate.
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    ca_pem: Vec<u8>,
    token: String,
    /// The spawned broker's pid; `None`: the broker threads of this process.
    pid: Option<u32>,
    /// Transport settings for every client.
    client: ClientKnobs,
}

/// The clients' transport knobs (`None`: the client's default).
#[derive(Clone, Copy, Default)]
struct ClientKnobs {
    mtu: Option<u16>,
    ack_threshold: Option<u32>,
}

impl ClientKnobs {
    fn from_args(args: &Args) -> ClientKnobs {
        let mtu = args.opt("client-mtu").or(args.opt("mtu"));
        ClientKnobs {
            mtu,
            ack_threshold: args.opt("client-ack-threshold"),
        }
    }
}

/// CPU seconds of the broker and of this process, read at one moment.
#[derive(Clone, Copy)]
struct Cpu {
    broker: Option<f64>,
    bench: Option<f64>,
}

impl Cpu {
    fn now(target: &Target) -> Cpu {
        Cpu {
            broker: match target.pid {
                Some(pid) => felix_integration::process_cpu_seconds(Some(pid)),
                None => felix_integration::threads_cpu_seconds("broker"),
            },
            bench: felix_integration::process_cpu_seconds(None),
        }
    }

    /// Prints each side's CPU since `self`, in µs per `n` of `what`.
    fn report(self, target: &Target, n: u64, what: &str) {
        let after = Cpu::now(target);
        let per = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if n > 0 => format!("{:.2}", (b - a) * 1e6 / n as f64),
            _ => "unknown".into(),
        };
        let secs = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.3}", b - a),
            _ => "unknown".into(),
        };
        println!(
            "  broker_cpu_s: {}  broker_cpu_us_per_{what}: {}",
            secs(self.broker, after.broker),
            per(self.broker, after.broker)
        );
        println!(
            "  bench_process_cpu_s: {}  bench_cpu_us_per_{what}: {}",
            secs(self.bench, after.bench),
            per(self.bench, after.bench)
        );
    }
}

impl Target {
    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new(self.addr, self.ca_pem.clone(), "t1", &self.token);
        c.request_timeout = Duration::from_secs(30);
        if let Some(mtu) = self.client.mtu {
            c.mtu_upper_bound = mtu;
        }
        if let Some(t) = self.client.ack_threshold {
            c.ack_eliciting_threshold = t;
        }
        c
    }
    async fn connect(&self) -> Client {
        Client::connect(self.config()).await.expect("connect")
    }
}

/// Runs the broker on a runtime of its own, in its own threads, until the process ends.
fn start_inprocess_broker(args: &Args) -> Target {
    let mtu: Option<u16> = args.opt("mtu");
    let ack_threshold: Option<u32> = args.opt("ack-threshold");
    let ack_delay: Option<u64> = args.opt("ack-delay-ms");
    let opts =
        BrokerOptions::new("127.0.0.1:0".parse().expect("literal")).configure_engine(move |c| {
            if let Some(mtu) = mtu {
                c.mtu_upper_bound = mtu;
                c.max_udp_payload_size = mtu;
            }
            if let Some(t) = ack_threshold {
                c.ack_eliciting_threshold = t;
            }
            if let Some(ms) = ack_delay {
                c.max_ack_delay = Duration::from_millis(ms);
            }
        });
    let broker = BenchBroker::start(opts);
    let target = Target {
        addr: broker.addr,
        ca_pem: broker.ca_pem.clone(),
        token: broker.token.clone(),
        pid: None,
        client: ClientKnobs::from_args(args),
    };
    // Never stopped: its thread serves until the process exits.
    std::mem::forget(broker);
    target
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.get("client-threads", 1usize))
        .enable_all()
        .build()
        .expect("client runtime");
    println!(
        "machine_cores: {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    match args.scenario.as_str() {
        "throughput" => {
            let spawned = args.opts.iter().any(|(k, _)| k == "broker");
            let (child, target) = if spawned {
                let (child, mut target) =
                    rt.block_on(spawn_broker_binary(&args.get_str("broker", "")));
                target.client = ClientKnobs::from_args(&args);
                (Some(child), target)
            } else {
                (None, start_inprocess_broker(&args))
            };
            println!(
                "broker: {}",
                if spawned {
                    "spawned binary"
                } else {
                    "in-process"
                }
            );
            rt.block_on(throughput(&target, &args, args.get("fanout", 1usize)));
            if let Some(mut child) = child {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        "latency" => {
            let target = start_inprocess_broker(&args);
            rt.block_on(latency(&target, &args));
        }
        "connect" => {
            let target = start_inprocess_broker(&args);
            rt.block_on(connect_time(&target, &args));
        }
        "memory" => rt.block_on(memory(&args)),
        "all" => {
            let target = start_inprocess_broker(&args);
            rt.block_on(async {
                connect_time(&target, &args).await;
                latency(&target, &args).await;
                throughput(&target, &args, 1).await;
                throughput(&target, &args, 10).await;
            });
            rt.block_on(memory(&args));
        }
        other => {
            panic!("unknown scenario {other:?}: throughput | latency | connect | memory | all")
        }
    }
}

/// Acked publishes of `batch` × `size` bytes, `inflight` at a time, delivered to `fanout`
/// subscribers (each on its own connection). Reports what was published and delivered.
async fn throughput(target: &Target, args: &Args, fanout: usize) {
    let secs: u64 = args.get("secs", 5);
    let batch: usize = args.get("batch", 64);
    let size: usize = args.get("size", 1024);
    // Publishes in flight. The broker drops (drop-new) for a subscriber that falls behind,
    // so more in flight than the delivery path sustains shows up as drops, not speed.
    let inflight: usize = args.get("inflight", 2);
    let stream = format!("tp-{fanout}-{}", std::process::id());

    let publisher = Arc::new(target.connect().await);
    let mut subscribers = Vec::new();
    for _ in 0..fanout {
        let client = target.connect().await;
        let sub = client
            .subscribe("default", &stream, Start::Latest)
            .await
            .expect("subscribe");
        subscribers.push((client, sub));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let delivered_msgs = Arc::new(AtomicU64::new(0));
    let mut sub_tasks = Vec::new();
    for (client, mut sub) in subscribers {
        let delivered = delivered_msgs.clone();
        let stop = stop.clone();
        sub_tasks.push(tokio::spawn(async move {
            let _client = client;
            let mut local = 0u64;
            let mut last_event = Instant::now();
            loop {
                match tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
                    Ok(Ok(SubscriptionItem::Event(_))) => {
                        local += 1;
                        if local.is_multiple_of(1024) {
                            delivered.fetch_add(1024, Ordering::Relaxed);
                            last_event = Instant::now();
                        }
                    }
                    Ok(other) => panic!("subscription ended: {other:?}"),
                    Err(_) if stop.load(Ordering::Relaxed) => break,
                    Err(_) => {}
                }
            }
            if !local.is_multiple_of(1024) {
                last_event = Instant::now() - Duration::from_millis(300);
            }
            delivered.fetch_add(local % 1024, Ordering::Relaxed);
            let stats = _client.connection().stats();
            (
                local,
                last_event,
                stats.path.lost_packets,
                stats.udp_rx.datagrams,
            )
        }));
    }

    let payloads: Vec<Bytes> = (0..batch)
        .map(|i| Bytes::from(vec![i as u8; size]))
        .collect();
    let published_batches = Arc::new(AtomicU64::new(0));
    let cpu = Cpu::now(target);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut pub_tasks = Vec::new();
    for _ in 0..inflight {
        let publisher = publisher.clone();
        let payloads = payloads.clone();
        let stream = stream.clone();
        let published = published_batches.clone();
        pub_tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                publisher
                    .publish("default", &stream, payloads.clone(), None, Ack::PerBatch)
                    .await
                    .expect("publish");
                published.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in pub_tasks {
        t.await.expect("publisher task");
    }
    let publish_elapsed = started.elapsed();
    // Subscribers stop once they have been quiet for 300 ms after the last publish.
    stop.store(true, Ordering::Relaxed);
    let mut per_sub = Vec::new();
    let mut last_delivery = started;
    let (mut lost, mut datagrams) = (0u64, 0u64);
    for t in sub_tasks {
        let (count, last, sub_lost, sub_datagrams) = t.await.expect("subscriber task");
        per_sub.push(count);
        last_delivery = last_delivery.max(last);
        lost += sub_lost;
        datagrams += sub_datagrams;
    }
    let publisher_stats = publisher.connection().stats();
    let delivery_elapsed = last_delivery.duration_since(started);

    let batches = published_batches.load(Ordering::Relaxed);
    let msgs = batches * batch as u64;
    let bytes = msgs * size as u64;
    let delivered: u64 = per_sub.iter().sum();
    let expected = msgs * fanout as u64;
    let p_secs = publish_elapsed.as_secs_f64();
    let d_secs = delivery_elapsed.as_secs_f64().max(p_secs);
    println!("scenario: throughput fanout={fanout} batch={batch} size={size} inflight={inflight} secs={secs}");
    println!("  published_msgs: {msgs}");
    println!("  publish_acked_MBps: {:.1}", bytes as f64 / p_secs / 1e6);
    println!("  publish_acked_msgs_per_s: {:.0}", msgs as f64 / p_secs);
    println!(
        "  delivered_msgs: {delivered} of {expected} ({} dropped)",
        expected.saturating_sub(delivered)
    );
    println!(
        "  delivered_MBps_total: {:.1}",
        (delivered * size as u64) as f64 / d_secs / 1e6
    );
    println!(
        "  delivered_msgs_per_s_total: {:.0}",
        delivered as f64 / d_secs
    );
    println!(
        "  delivered_MBps_per_subscriber: {:.1}",
        (delivered * size as u64) as f64 / d_secs / 1e6 / fanout as f64
    );
    println!(
        "  quic_packets_lost: publisher {} of {} sent; subscribers {} (broker to client, of {} datagrams received)",
        publisher_stats.path.lost_packets, publisher_stats.udp_tx.datagrams, lost, datagrams
    );
    println!(
        "  datagrams: publisher sent {} received {} (MTU {}); subscribers received {datagrams}, {:.2} per delivered msg",
        publisher_stats.udp_tx.datagrams,
        publisher_stats.udp_rx.datagrams,
        publisher_stats.path.current_mtu,
        datagrams as f64 / delivered.max(1) as f64
    );
    cpu.report(target, delivered, "delivered_msg");
}

/// One acked 1-record publish at a time; each waits for its delivery before the next.
/// Latency is publish call → event in the subscriber (same process clock).
async fn latency(target: &Target, args: &Args) {
    let samples: usize = args.get("samples", 5000);
    let size: usize = args.get("size", 1024);
    let stream = format!("lat-{}", std::process::id());
    let publisher = target.connect().await;
    let subscriber = target.connect().await;
    let mut sub = subscriber
        .subscribe("default", &stream, Start::Latest)
        .await
        .expect("subscribe");
    let payload = Bytes::from(vec![7u8; size]);
    let mut deliver = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).expect("histogram");
    let mut ack = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).expect("histogram");
    let warmup = samples / 10;
    let mut cpu = Cpu::now(target);
    for i in 0..samples + warmup {
        if i == warmup {
            cpu = Cpu::now(target);
        }
        let sent = Instant::now();
        let (published, delivered) = tokio::join!(
            async {
                publisher
                    .publish(
                        "default",
                        &stream,
                        vec![payload.clone()],
                        None,
                        Ack::PerMessage,
                    )
                    .await
                    .expect("publish");
                sent.elapsed()
            },
            async {
                match sub.next().await.expect("event") {
                    SubscriptionItem::Event(_) => sent.elapsed(),
                    other => panic!("{other:?}"),
                }
            }
        );
        if i >= warmup {
            deliver
                .record(delivered.as_micros().max(1) as u64)
                .expect("record");
            ack.record(published.as_micros().max(1) as u64)
                .expect("record");
        }
    }
    println!("scenario: latency batch=1 size={size} samples={samples}");
    for (name, h) in [("publish_to_deliver", &deliver), ("publish_to_ack", &ack)] {
        println!(
            "  {name}_us: p50={} p90={} p99={} p999={} max={}",
            h.value_at_quantile(0.50),
            h.value_at_quantile(0.90),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max()
        );
    }
    cpu.report(target, samples as u64, "delivered_msg");
}

/// Connect with 40 streams authenticated one after another, like the reference client.
async fn connect_time(target: &Target, args: &Args) {
    let samples: usize = args.get("samples", 20);
    drop(target.connect().await);
    let mut times = Vec::new();
    for _ in 0..samples {
        let mut c = target.config();
        c.connect_streams = 40;
        let started = Instant::now();
        let client = Client::connect(c).await.expect("connect");
        times.push(started.elapsed());
        client.close().await;
    }
    times.sort();
    println!("scenario: connect streams=40 samples={samples}");
    println!(
        "  connect_ms: p50={:.2} min={:.2} max={:.2}",
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3
    );
}

fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS")
}

/// Broker memory per idle connection (40 authenticated streams each) and per idle
/// subscription, from the spawned release binary's VmRSS.
async fn memory(args: &Args) {
    let conns: usize = args.get("conns", 200);
    let subs: usize = args.get("subs", 2000);
    let binary = args.get_str("broker", "target/release/felix-broker");
    let (mut child, target) = spawn_broker_binary(&binary).await;
    let pid = child.id();

    // Baseline with one warm connection, so first-use allocations are not counted.
    let warm = target.connect().await;
    warm.cache_put("default", "warm", "k", Bytes::from_static(b"v"), None)
        .await
        .expect("warm");
    let warm_sub = warm
        .subscribe("default", "warm", Start::Latest)
        .await
        .expect("warm sub");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base = vm_rss_kib(pid);

    let mut clients = Vec::new();
    for _ in 0..conns {
        let mut c = target.config();
        c.connect_streams = 40;
        clients.push(Client::connect(c).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let with_conns = vm_rss_kib(pid);
    let per_conn = (with_conns.saturating_sub(base)) as f64 / conns as f64;

    // Subscriptions spread over a few connections (each connection allows 1024).
    let holders: Vec<Client> = {
        let mut v = Vec::new();
        for _ in 0..subs.div_ceil(500).max(1) {
            v.push(target.connect().await);
        }
        v
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before_subs = vm_rss_kib(pid);
    let mut subscriptions = Vec::new();
    for i in 0..subs {
        let holder = &holders[i % holders.len()];
        subscriptions.push(
            holder
                .subscribe("default", &format!("idle-{}", i % 50), Start::Latest)
                .await
                .expect("subscribe"),
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let with_subs = vm_rss_kib(pid);
    let per_sub = (with_subs.saturating_sub(before_subs)) as f64 / subs as f64;

    println!("scenario: memory conns={conns} (40 streams each) subs={subs}");
    println!("  broker_rss_base_kib: {base}");
    println!("  broker_rss_with_conns_kib: {with_conns}");
    println!("  broker_kib_per_idle_connection: {per_conn:.1}");
    println!("  broker_kib_per_idle_subscription: {per_sub:.2}");
    drop((subscriptions, holders, clients, warm_sub, warm));
    let _ = child.kill();
    let _ = child.wait();
}

/// Starts the release broker binary on 127.0.0.1:0 in a temporary directory and reads back
/// its address, CA and dev token.
async fn spawn_broker_binary(binary: &str) -> (std::process::Child, Target) {
    let (child, addr, ca_pem, token) = felix_integration::spawn_broker_binary(binary).await;
    let pid = child.id();
    (
        child,
        Target {
            addr,
            ca_pem,
            token,
            pid: Some(pid),
            client: ClientKnobs::default(),
        },
    )
}
