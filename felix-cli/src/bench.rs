//! `felix bench`: a load generator.
//!
//! - `pubsub`: publishers on `--connections` connections, `--inflight` publish calls of
//!   `--batch` messages in flight on each, delivered to `--fanout` subscribers (one
//!   connection each). Every payload starts with the time it was sent (nanoseconds since the
//!   run began, on this process's monotonic clock), so each subscriber measures
//!   publish→deliver latency against the same clock.
//! - `latency`: one message at a time; the next is sent once every subscriber has the last.
//! - `cache`: `--concurrency` workers doing puts, then gets over the keys written.
//! - `--cluster` (pubsub): every publish carries a key (from `--keys` distinct ones), so the
//!   load spreads over the stream's shards and the cluster client sends each batch to its
//!   shard's owner; subscribers take every shard (`subscribe_sharded`), and the report adds
//!   what each owning node was sent and how fast it acknowledged.
//!
//! Every run is bounded by `--duration` and by `--count` (whichever comes first), and the
//! wait for deliveries after the last publish by `--drain`.
//!
//! Each run also reports CPU per unit of work (a delivered message, or a cache operation):
//! this process's, and with `--metrics http://HOST:PORT` the broker's, from its
//! `process_cpu_seconds_total` read before and after the run.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use clap::{Args, ValueEnum};
use felix_client::{
    Ack, Client, ClientConfig, ClientError, ShardedSubscription, Start, Subscription,
    SubscriptionItem,
};
use felix_proto::routing::{shard_for_key, RoutingMapping};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

use crate::conn::ConnectArgs;
use crate::cpu::{own_cpu_seconds, MetricsUrl};
use crate::failure::Failure;

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Scenario::Pubsub)]
    scenario: Scenario,
    /// Bytes per message (pubsub, latency: at least 8, for the send timestamp) or per cache
    /// value.
    #[arg(long, default_value_t = 1024)]
    payload: usize,
    /// Messages per publish (the latency scenario always sends 1).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Subscribers, each on a connection of its own; every message goes to all of them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    fanout: u32,
    /// Ask the broker to acknowledge each publish (the default).
    #[arg(long, overrides_with = "no_ack")]
    acked: bool,
    /// Fire-and-forget publishes.
    #[arg(long, overrides_with = "acked")]
    no_ack: bool,
    /// Publisher connections (cache: client connections).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    connections: u32,
    /// Publish calls in flight per publisher connection.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    inflight: u32,
    /// Longest the load runs (cache: each of the put and get phases).
    #[arg(long, default_value = "10s", value_parser = crate::duration::parse)]
    duration: Duration,
    /// Messages to publish (cache: operations per phase); stops earlier than --duration.
    #[arg(long)]
    count: Option<u64>,
    /// Longest to wait for deliveries after the last publish.
    #[arg(long, default_value = "5s", value_parser = crate::duration::parse)]
    drain: Duration,
    /// Stream to use (default: a fresh name per run).
    #[arg(long)]
    stream: Option<String>,
    /// Cache workers (cache scenario).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    concurrency: u32,
    /// Spread keyed publishes over the stream's shards and report figures per owning node
    /// (pubsub; give the cluster's brokers with --addr, comma-separated).
    #[arg(long)]
    cluster: bool,
    /// Distinct cache keys (cache scenario), or publish keys (--cluster).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Cache to use (default: a fresh name per run).
    #[arg(long)]
    cache: Option<String>,
    /// Print one JSON object instead of the human report.
    #[arg(long)]
    json: bool,
    /// The clients' QUIC datagram size bound (path-MTU discovery probes up to it; 1200 to
    /// 65527; default the client's, 8952).
    #[arg(long, value_name = "BYTES")]
    mtu_upper_bound: Option<u16>,
    /// Ack-eliciting packets the broker may receive before it acknowledges, asked of it by
    /// the clients (1, the default: QUIC's usual, every second packet).
    #[arg(long, value_name = "N")]
    ack_eliciting_threshold: Option<u32>,
    /// The broker's metrics endpoint (http://HOST:PORT); its process_cpu_seconds_total is
    /// read before and after the run to report broker CPU per delivered message or cache op.
    #[arg(long, value_name = "URL")]
    metrics: Option<String>,
    /// Tokio worker threads for the bench's clients (default: one per core).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    #[command(flatten)]
    conn: ConnectArgs,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// Publish→deliver throughput and latency.
    Pubsub,
    /// Publish→deliver latency, one message at a time.
    Latency,
    /// Cache put and get.
    Cache,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Pubsub => "pubsub",
            Scenario::Latency => "latency",
            Scenario::Cache => "cache",
        }
    }
}

/// Bytes at the start of each payload: the send time.
const STAMP_BYTES: usize = 8;
/// A stamp of zero marks a warm-up message, which subscribers do not count.
const WARMUP_STAMP: u64 = 0;

pub(crate) async fn run(args: BenchArgs) -> Result<(), Failure> {
    if args.scenario != Scenario::Cache && args.payload < STAMP_BYTES {
        return Err(Failure::usage(format!(
            "--payload must be at least {STAMP_BYTES} bytes: each message carries its send time"
        )));
    }
    let mut config = args.conn.client_config()?;
    if args.cluster && config.seeds.is_empty() {
        // `--cluster` through one address: still the cluster client, which learns the others.
        config.seeds = vec![config.addr];
        config.offer = felix_client::Offer::cluster();
        config.idle_timeout = felix_client::DEFAULT_IDLE_TIMEOUT;
    }
    if let Some(mtu) = args.mtu_upper_bound {
        config.mtu_upper_bound = mtu;
    }
    if let Some(n) = args.ack_eliciting_threshold {
        config.ack_eliciting_threshold = n;
    }
    let metrics = args.metrics.as_deref().map(MetricsUrl::parse).transpose()?;
    let broker_before = metrics
        .as_ref()
        .map(MetricsUrl::broker_cpu_seconds)
        .transpose()?;
    let own_before = own_cpu_seconds();
    let mut report = match args.scenario {
        Scenario::Pubsub | Scenario::Latency => pubsub(&args, config).await?,
        Scenario::Cache => cache(&args, config).await?,
    };
    let own = own_before.zip(own_cpu_seconds()).map(|(a, b)| b - a);
    let broker = match (&metrics, broker_before) {
        (Some(m), Some(before)) => Some(m.broker_cpu_seconds()? - before),
        _ => None,
    };
    report.add_cpu(own, broker);
    if args.json {
        println!("{}", report.json);
    } else {
        print!("{}", report.human);
    }
    match report.errors.first() {
        None => Ok(()),
        Some(first) => Err(Failure::Connection(format!(
            "{} error(s) during the run; the first: {first}",
            report.errors.len()
        ))),
    }
}

struct Report {
    json: Value,
    human: String,
    errors: Vec<String>,
    /// What CPU is divided by: messages delivered, or cache operations done.
    work: u64,
    /// Its name in the report.
    unit: &'static str,
}

impl Report {
    /// The CPU seconds this process (`own`) and the broker spent over the run, in total and
    /// per unit of work.
    fn add_cpu(&mut self, own: Option<f64>, broker: Option<f64>) {
        let per = |secs: f64| round(secs * 1e6 / self.work.max(1) as f64, 3);
        let mut cpu = serde_json::Map::new();
        cpu.insert("per".into(), self.unit.into());
        for (who, secs) in [("bench", own), ("broker", broker)] {
            let Some(secs) = secs else { continue };
            cpu.insert(format!("{who}_cpu_secs"), round(secs, 3).into());
            cpu.insert(format!("{who}_cpu_us_per_{}", self.unit), per(secs).into());
            self.human += &format!(
                "  {who} CPU  {secs:>8.3} s  {:>8.2} us per {}\n",
                per(secs),
                self.unit.replace('_', " ")
            );
        }
        self.json["cpu"] = Value::Object(cpu);
    }
}

/// Errors seen by any task; the run goes on where it can and reports them.
#[derive(Default)]
struct Errors(Mutex<Vec<String>>);

impl Errors {
    fn push(&self, e: String) {
        self.0.lock().expect("errors").push(e);
    }
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().expect("errors"))
    }
}

/// Counters shared by the publishers, the subscribers and the progress bar.
struct Shared {
    epoch: Instant,
    published: AtomicU64,
    delivered: AtomicU64,
    ended_subscriptions: AtomicU64,
    /// Set when a subscriber sees an event (latency mode waits on it).
    delivery: Notify,
    stop_publishing: AtomicBool,
    errors: Errors,
}

impl Shared {
    fn now_stamp(&self) -> u64 {
        // Never zero: zero marks warm-up.
        (self.epoch.elapsed().as_nanos() as u64).max(1)
    }
}

fn histogram() -> Histogram<u64> {
    // 1 ns to 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static bounds")
}

fn stamped_payload(size: usize, stamp: u64) -> Bytes {
    let mut buf = BytesMut::with_capacity(size);
    buf.put_u64(stamp);
    buf.resize(size, 0);
    buf.freeze()
}

fn read_stamp(payload: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(
        payload.get(..STAMP_BYTES)?.try_into().ok()?,
    ))
}

fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

async fn connect(config: &ClientConfig) -> Result<Client, Failure> {
    Client::connect(config.clone())
        .await
        .map_err(|e| Failure::client("bench connection", e))
}

async fn close_all(clients: Vec<Client>) {
    let mut set = JoinSet::new();
    for c in clients {
        set.spawn(c.close());
    }
    while set.join_next().await.is_some() {}
}

/// What one subscriber saw.
struct Received {
    count: u64,
    latency: Histogram<u64>,
    last_delivery: Option<Instant>,
}

async fn pubsub(args: &BenchArgs, config: ClientConfig) -> Result<Report, Failure> {
    let latency_mode = args.scenario == Scenario::Latency;
    let (batch, inflight) = if latency_mode {
        (1, 1)
    } else {
        (args.batch as usize, args.inflight as usize)
    };
    let acked = !args.no_ack;
    let ack = if acked { Ack::PerBatch } else { Ack::None };
    let namespace = args.conn.namespace.clone();
    let stream = args.stream.clone().unwrap_or_else(|| unique_name("bench"));
    let fanout = args.fanout as u64;
    let publishers = if latency_mode { 1 } else { args.connections };

    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        published: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        ended_subscriptions: AtomicU64::new(0),
        delivery: Notify::new(),
        stop_publishing: AtomicBool::new(false),
        errors: Errors::default(),
    });

    // Subscribers first, so they see everything published afterwards.
    let mut clients = Vec::new();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut subscribers = JoinSet::new();
    // In a cluster the stream is placed on first use: one publish before subscribing to
    // its shards (a warm-up payload, which subscribers skip).
    let load = if args.cluster {
        let client = connect(&config).await?;
        Some(Arc::new(
            ClusterLoad::start(&client, &namespace, &stream, args.payload, args.keys).await?,
        ))
    } else {
        None
    };
    for _ in 0..fanout {
        let client = connect(&config).await?;
        let sub = if args.cluster {
            let none = std::collections::HashMap::new();
            client
                .subscribe_sharded(&namespace, &stream, Start::Latest, &none)
                .await
                .map(BenchSub::Sharded)
        } else {
            client
                .subscribe(&namespace, &stream, Start::Latest)
                .await
                .map(|s| BenchSub::One(Box::new(s)))
        }
        .map_err(|e| Failure::client(&format!("subscribe to {stream}"), e))?;
        clients.push(client);
        subscribers.spawn(receive(sub, shared.clone(), stop_rx.clone(), latency_mode));
    }
    let mut publisher_clients = Vec::new();
    for _ in 0..publishers {
        let client = connect(&config).await?;
        // Opens (and authenticates) the publish stream outside the measurement.
        client
            .publish(
                &namespace,
                &stream,
                vec![stamped_payload(args.payload, WARMUP_STAMP)],
                None,
                Ack::PerBatch,
            )
            .await
            .map_err(|e| Failure::client(&format!("publish to {stream}"), e))?;
        publisher_clients.push(client);
    }

    let progress = Progress::start(args, shared.clone());
    let started = Instant::now();
    let deadline = started + args.duration;
    let budget = Arc::new(Budget::new(args.count));
    let mut publishing = JoinSet::new();
    for client in &publisher_clients {
        for _ in 0..inflight {
            let task = Publisher {
                client: client.clone(),
                namespace: namespace.clone(),
                stream: stream.clone(),
                payload: args.payload,
                batch,
                ack,
                deadline,
                budget: budget.clone(),
                shared: shared.clone(),
                await_delivery: latency_mode.then_some((fanout, args.drain)),
                load: load.clone(),
            };
            publishing.spawn(task.run());
        }
    }
    let mut ack_latency = histogram();
    while let Some(done) = publishing.join_next().await {
        match done {
            Ok(h) => ack_latency.add(h).expect("same bounds"),
            Err(e) => shared.errors.push(format!("publisher task: {e}")),
        }
    }
    let publish_elapsed = started.elapsed();

    // Wait (bounded) for every delivery, or for every subscription to have ended.
    let published = shared.published.load(Ordering::Relaxed);
    let expected = published * fanout;
    let drain_deadline = Instant::now() + args.drain;
    while shared.delivered.load(Ordering::Relaxed) < expected
        && shared.ended_subscriptions.load(Ordering::Relaxed) < fanout
        && Instant::now() < drain_deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop_tx.send(true);
    let mut latency = histogram();
    let mut delivered = 0u64;
    let mut last_delivery = None::<Instant>;
    while let Some(done) = subscribers.join_next().await {
        match done {
            Ok(r) => {
                delivered += r.count;
                latency.add(&r.latency).expect("same bounds");
                last_delivery = last_delivery.max(r.last_delivery);
            }
            Err(e) => shared.errors.push(format!("subscriber task: {e}")),
        }
    }
    progress.finish();
    let nodes = match (&load, publisher_clients.first()) {
        (Some(load), Some(client)) => Some(load.per_node(client, &namespace, &stream).await),
        _ => None,
    };
    clients.extend(publisher_clients);
    close_all(clients).await;

    let deliver_elapsed = last_delivery
        .map(|t| t.saturating_duration_since(started))
        .unwrap_or(publish_elapsed)
        .max(publish_elapsed);
    let r = PubsubResult {
        scenario: args.scenario,
        stream,
        payload: args.payload,
        batch,
        fanout,
        acked,
        connections: publishers,
        inflight,
        published,
        publish_elapsed,
        delivered,
        expected,
        deliver_elapsed,
        latency,
        ack_latency: acked.then_some(ack_latency),
        nodes,
    };
    Ok(Report {
        json: r.json(),
        human: r.human(),
        errors: shared.errors.take(),
        work: r.delivered,
        unit: "delivered_msg",
    })
}

/// How many messages may still be published (`None`: until the deadline).
struct Budget {
    remaining: Option<AtomicU64>,
}

impl Budget {
    fn new(count: Option<u64>) -> Budget {
        Budget {
            remaining: count.map(AtomicU64::new),
        }
    }

    /// Takes up to `want` messages; zero when the budget is spent.
    fn take(&self, want: u64) -> u64 {
        let Some(remaining) = &self.remaining else {
            return want;
        };
        let mut current = remaining.load(Ordering::Relaxed);
        loop {
            let n = current.min(want);
            if n == 0 {
                return 0;
            }
            match remaining.compare_exchange_weak(
                current,
                current - n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return n,
                Err(now) => current = now,
            }
        }
    }
}

/// One publish loop (there are `--inflight` per connection).
struct Publisher {
    client: Client,
    namespace: String,
    stream: String,
    payload: usize,
    batch: usize,
    ack: Ack,
    deadline: Instant,
    budget: Arc<Budget>,
    shared: Arc<Shared>,
    /// Latency mode: wait for this many deliveries per message, at most this long.
    await_delivery: Option<(u64, Duration)>,
    /// `--cluster`: the keys, and what each shard was sent.
    load: Option<Arc<ClusterLoad>>,
}

impl Publisher {
    /// Publishes until the deadline, the budget or an error; returns publish→answer times.
    async fn run(self) -> Histogram<u64> {
        let mut ack_latency = histogram();
        let shared = &self.shared;
        while Instant::now() < self.deadline && !shared.stop_publishing.load(Ordering::Relaxed) {
            let n = self.budget.take(self.batch as u64);
            if n == 0 {
                break;
            }
            // One stamp per batch: the batch leaves in one call.
            let sent = Instant::now();
            let payload = stamped_payload(self.payload, shared.now_stamp());
            let payloads = vec![payload; n as usize];
            let (key, shard) = match &self.load {
                Some(load) => {
                    let (key, shard) = load.next_key();
                    (Some(key), Some(shard))
                }
                None => (None, None),
            };
            if let Err(e) = self
                .client
                .publish(&self.namespace, &self.stream, payloads, key, self.ack)
                .await
            {
                shared.errors.push(format!("publish: {e}"));
                shared.stop_publishing.store(true, Ordering::Relaxed);
                break;
            }
            ack_latency.saturating_record(sent.elapsed().as_nanos() as u64);
            if let (Some(load), Some(shard)) = (&self.load, shard) {
                load.record(shard, n, sent.elapsed());
            }
            let total = shared.published.fetch_add(n, Ordering::Relaxed) + n;
            if let Some((fanout, wait)) = self.await_delivery {
                if !wait_for_deliveries(shared, total * fanout, wait).await {
                    shared.errors.push(format!(
                        "message {total} was not delivered to every subscriber within {wait:?}"
                    ));
                    shared.stop_publishing.store(true, Ordering::Relaxed);
                    break;
                }
            }
        }
        ack_latency
    }
}

async fn wait_for_deliveries(shared: &Shared, target: u64, wait: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    while shared.delivered.load(Ordering::Acquire) < target {
        if shared.ended_subscriptions.load(Ordering::Relaxed) > 0 {
            return false;
        }
        // `notify_one` stores a permit, so a delivery between the check and the wait is
        // not missed.
        if tokio::time::timeout_at(deadline, shared.delivery.notified())
            .await
            .is_err()
        {
            return shared.delivered.load(Ordering::Acquire) >= target;
        }
    }
    true
}

/// Counts events and their latency until told to stop or the subscription ends.
/// A subscriber's subscription: one shard, or every shard (`--cluster`).
enum BenchSub {
    One(Box<Subscription>),
    Sharded(ShardedSubscription),
}

impl BenchSub {
    async fn next(&mut self) -> Result<SubscriptionItem, ClientError> {
        match self {
            BenchSub::One(sub) => sub.next().await,
            BenchSub::Sharded(sub) => sub.next().await.map(|e| e.item),
        }
    }
}

/// `--cluster`: keys round-robin over `keys` distinct ones; per shard, what was sent and how
/// long its acknowledgements took.
struct ClusterLoad {
    keys: u64,
    next: AtomicU64,
    shards: u32,
    per_shard: Vec<Mutex<(u64, Histogram<u64>)>>,
}

impl ClusterLoad {
    async fn start(
        client: &Client,
        namespace: &str,
        stream: &str,
        payload: usize,
        keys: u64,
    ) -> Result<ClusterLoad, Failure> {
        client
            .publish(
                namespace,
                stream,
                vec![stamped_payload(payload, WARMUP_STAMP)],
                None,
                Ack::PerBatch,
            )
            .await
            .map_err(|e| Failure::client(&format!("publish to {stream}"), e))?;
        let shards = client
            .shard_owners(namespace, stream)
            .await
            .map_err(|e| Failure::client(&format!("the owners of {stream}"), e))?
            .len()
            .max(1) as u32;
        client.clone().close().await;
        Ok(ClusterLoad {
            keys,
            next: AtomicU64::new(0),
            shards,
            per_shard: (0..shards).map(|_| Mutex::new((0, histogram()))).collect(),
        })
    }

    /// The next key and the shard it routes to.
    fn next_key(&self) -> (Bytes, u32) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.keys;
        let key = Bytes::from(format!("k{i}"));
        let shard = shard_for_key(Some(&key), self.shards, RoutingMapping::Modulo);
        (key, shard)
    }

    fn record(&self, shard: u32, messages: u64, took: Duration) {
        let mut slot = self.per_shard[shard as usize].lock().expect("per shard");
        slot.0 += messages;
        slot.1.saturating_record(took.as_nanos() as u64);
    }

    /// The figures grouped by each shard's owner at the end of the run.
    async fn per_node(&self, client: &Client, namespace: &str, stream: &str) -> Vec<NodeFigures> {
        let owners = client
            .shard_owners(namespace, stream)
            .await
            .unwrap_or_default();
        let mut nodes: Vec<NodeFigures> = Vec::new();
        for (shard, slot) in self.per_shard.iter().enumerate() {
            let owner = owners
                .get(shard)
                .copied()
                .flatten()
                .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
            let (sent, acks) = &*slot.lock().expect("per shard");
            let at = match nodes.iter().position(|n| n.owner == owner) {
                Some(i) => i,
                None => {
                    nodes.push(NodeFigures {
                        owner,
                        shards: Vec::new(),
                        published: 0,
                        ack_latency: histogram(),
                    });
                    nodes.len() - 1
                }
            };
            let node = &mut nodes[at];
            node.shards.push(shard as u32);
            node.published += sent;
            node.ack_latency.add(acks).expect("same bounds");
        }
        nodes.sort_by(|a, b| a.owner.cmp(&b.owner));
        nodes
    }
}

/// What one node was sent in a `--cluster` run.
struct NodeFigures {
    owner: String,
    shards: Vec<u32>,
    published: u64,
    ack_latency: Histogram<u64>,
}

async fn receive(
    mut sub: BenchSub,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    notify: bool,
) -> Received {
    let mut r = Received {
        count: 0,
        latency: histogram(),
        last_delivery: None,
    };
    loop {
        let item = tokio::select! {
            item = sub.next() => item,
            _ = stop.changed() => break,
        };
        match item {
            Ok(SubscriptionItem::Event(event)) => {
                let Some(stamp) = read_stamp(&event.payload) else {
                    shared
                        .errors
                        .push("an event too short to carry a send time".into());
                    continue;
                };
                if stamp == WARMUP_STAMP {
                    continue;
                }
                let now = Instant::now();
                let since_epoch = now.duration_since(shared.epoch).as_nanos() as u64;
                r.latency
                    .saturating_record(since_epoch.saturating_sub(stamp).max(1));
                r.count += 1;
                r.last_delivery = Some(now);
                shared.delivered.fetch_add(1, Ordering::Release);
                if notify {
                    shared.delivery.notify_one();
                }
            }
            Ok(SubscriptionItem::End(end)) => {
                shared.errors.push(format!("subscription ended: {end:?}"));
                break;
            }
            Err(e) => {
                shared.errors.push(format!("subscription: {e}"));
                break;
            }
        }
    }
    shared.ended_subscriptions.fetch_add(1, Ordering::Relaxed);
    if notify {
        shared.delivery.notify_one();
    }
    r
}

struct PubsubResult {
    scenario: Scenario,
    stream: String,
    payload: usize,
    batch: usize,
    fanout: u64,
    acked: bool,
    connections: u32,
    inflight: usize,
    published: u64,
    publish_elapsed: Duration,
    delivered: u64,
    expected: u64,
    deliver_elapsed: Duration,
    latency: Histogram<u64>,
    ack_latency: Option<Histogram<u64>>,
    /// `--cluster`: per owning node.
    nodes: Option<Vec<NodeFigures>>,
}

fn per_sec(n: u64, d: Duration) -> f64 {
    let secs = d.as_secs_f64();
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Rounds for the JSON output (sub-microsecond and sub-unit noise is not information).
fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

impl PubsubResult {
    fn json(&self) -> Value {
        let payload = self.payload as u64;
        json!({
            "scenario": self.scenario.name(),
            "stream": self.stream,
            "payload_bytes": self.payload,
            "batch": self.batch,
            "fanout": self.fanout,
            "acked": self.acked,
            "connections": self.connections,
            "inflight": self.inflight,
            "published": self.published,
            "publish_secs": round(self.publish_elapsed.as_secs_f64(), 3),
            "publish_msgs_per_sec": round(per_sec(self.published, self.publish_elapsed), 1),
            "publish_mb_per_sec": round(mb(payload) * per_sec(self.published, self.publish_elapsed), 3),
            "delivered": self.delivered,
            "expected": self.expected,
            "lost": self.expected.saturating_sub(self.delivered),
            "deliver_secs": round(self.deliver_elapsed.as_secs_f64(), 3),
            "deliver_msgs_per_sec": round(per_sec(self.delivered, self.deliver_elapsed), 1),
            "deliver_mb_per_sec": round(mb(payload) * per_sec(self.delivered, self.deliver_elapsed), 3),
            "latency_us": percentiles_json(&self.latency),
            "ack_latency_us": self.ack_latency.as_ref().map(percentiles_json),
            "nodes": self.nodes.as_ref().map(|nodes| nodes.iter().map(|n| json!({
                "owner": n.owner,
                "shards": n.shards,
                "published": n.published,
                "publish_msgs_per_sec": round(per_sec(n.published, self.publish_elapsed), 1),
                "ack_latency_us": percentiles_json(&n.ack_latency),
            })).collect::<Vec<_>>()),
        })
    }

    fn human(&self) -> String {
        let payload = self.payload as u64;
        let mut s = format!(
            "felix bench {}: {} B x {} per publish, fanout {}, {}, {} connection(s) x {} in flight, stream {}\n",
            self.scenario.name(),
            self.payload,
            self.batch,
            self.fanout,
            if self.acked { "acked" } else { "not acked" },
            self.connections,
            self.inflight,
            self.stream,
        );
        s += &format!(
            "  published  {:>10} msgs in {:>7.3} s  {:>11.0} msg/s  {:>9.2} MB/s\n",
            self.published,
            self.publish_elapsed.as_secs_f64(),
            per_sec(self.published, self.publish_elapsed),
            mb(payload) * per_sec(self.published, self.publish_elapsed),
        );
        s += &format!(
            "  delivered  {:>10} msgs in {:>7.3} s  {:>11.0} msg/s  {:>9.2} MB/s  ({} of {} lost)\n",
            self.delivered,
            self.deliver_elapsed.as_secs_f64(),
            per_sec(self.delivered, self.deliver_elapsed),
            mb(payload) * per_sec(self.delivered, self.deliver_elapsed),
            self.expected.saturating_sub(self.delivered),
            self.expected,
        );
        s += &format!(
            "  publish->deliver latency (us)  {}\n",
            percentiles_text(&self.latency)
        );
        if let Some(h) = &self.ack_latency {
            s += &format!("  publish->ack latency (us)      {}\n", percentiles_text(h));
        }
        for n in self.nodes.iter().flatten() {
            s += &format!(
                "  node {} (shards {:?}): {} msgs, {:.0} msg/s, publish->ack (us) {}\n",
                n.owner,
                n.shards,
                n.published,
                per_sec(n.published, self.publish_elapsed),
                percentiles_text(&n.ack_latency)
            );
        }
        s
    }
}

fn quantile_us(h: &Histogram<u64>, q: f64) -> f64 {
    round(h.value_at_quantile(q) as f64 / 1e3, 1)
}

fn percentiles_json(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return json!({"count": 0});
    }
    json!({
        "count": h.len(),
        "min": round(h.min() as f64 / 1e3, 1),
        "mean": round(h.mean() / 1e3, 1),
        "p50": quantile_us(h, 0.50),
        "p90": quantile_us(h, 0.90),
        "p99": quantile_us(h, 0.99),
        "p999": quantile_us(h, 0.999),
        "max": round(h.max() as f64 / 1e3, 1),
    })
}

fn percentiles_text(h: &Histogram<u64>) -> String {
    if h.is_empty() {
        return "no samples".into();
    }
    format!(
        "p50 {:.1}  p90 {:.1}  p99 {:.1}  p999 {:.1}  max {:.1}  (n={})",
        quantile_us(h, 0.50),
        quantile_us(h, 0.90),
        quantile_us(h, 0.99),
        quantile_us(h, 0.999),
        h.max() as f64 / 1e3,
        h.len()
    )
}

/// A progress bar on stderr, only on a terminal and never with --json.
struct Progress {
    bar: Option<ProgressBar>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    fn start(args: &BenchArgs, shared: Arc<Shared>) -> Progress {
        if args.json || !std::io::stderr().is_terminal() {
            return Progress {
                bar: None,
                ticker: None,
            };
        }
        // The cache scenario runs two phases, each up to --count and --duration.
        let phases = if args.scenario == Scenario::Cache {
            2
        } else {
            1
        };
        let (len, by_count) = match args.count {
            Some(n) => (n.saturating_mul(phases), true),
            None => (
                (args.duration.as_millis() as u64).saturating_mul(phases),
                false,
            ),
        };
        let bar = ProgressBar::new(len.max(1));
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}")
                .expect("static template"),
        );
        let started = Instant::now();
        let ticking = bar.clone();
        let ticker = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let published = shared.published.load(Ordering::Relaxed);
                let delivered = shared.delivered.load(Ordering::Relaxed);
                ticking.set_position(if by_count {
                    published
                } else {
                    started.elapsed().as_millis() as u64
                });
                ticking.set_message(format!("{published} sent, {delivered} delivered"));
            }
        });
        Progress {
            bar: Some(bar),
            ticker: Some(ticker),
        }
    }

    fn finish(self) {
        if let Some(t) = self.ticker {
            t.abort();
        }
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

/// What one cache phase did.
#[derive(Default)]
struct Phase {
    ops: u64,
    hits: u64,
    misses: u64,
    errors: u64,
    elapsed: Duration,
    latency: Option<Histogram<u64>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CacheOp {
    Put,
    Get,
}

async fn cache(args: &BenchArgs, mut config: ClientConfig) -> Result<Report, Failure> {
    let namespace = args.conn.namespace.clone();
    let cache = args.cache.clone().unwrap_or_else(|| unique_name("bench"));
    let concurrency = args.concurrency as usize;
    let connections = (args.connections as usize).min(concurrency);
    // Cache calls go round-robin over the request streams; a few keep one slow answer from
    // holding up the rest.
    config.connect_streams = concurrency.div_ceil(connections).clamp(1, 8);
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(connect(&config).await?);
    }
    let value = Bytes::from(vec![0x5au8; args.payload]);
    let errors = Arc::new(Errors::default());
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        published: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        ended_subscriptions: AtomicU64::new(0),
        delivery: Notify::new(),
        stop_publishing: AtomicBool::new(false),
        errors: Errors::default(),
    });
    let progress = Progress::start(args, shared.clone());
    let put = cache_phase(
        CachePhase {
            op: CacheOp::Put,
            clients: &clients,
            namespace: &namespace,
            cache: &cache,
            value: &value,
            keys: args.keys,
            concurrency,
            duration: args.duration,
            count: args.count,
        },
        &errors,
        &shared,
    )
    .await;
    let written = put.ops.min(args.keys).max(1);
    let get = cache_phase(
        CachePhase {
            op: CacheOp::Get,
            clients: &clients,
            namespace: &namespace,
            cache: &cache,
            value: &value,
            keys: written,
            concurrency,
            duration: args.duration,
            count: args.count,
        },
        &errors,
        &shared,
    )
    .await;
    progress.finish();
    close_all(clients).await;

    let phase_json = |p: &Phase, op: CacheOp| {
        let mut v = json!({
            "ops": p.ops,
            "errors": p.errors,
            "secs": round(p.elapsed.as_secs_f64(), 3),
            "ops_per_sec": round(per_sec(p.ops, p.elapsed), 1),
            "mb_per_sec": round(mb(args.payload as u64) * per_sec(p.ops - p.misses, p.elapsed), 3),
            "latency_us": p.latency.as_ref().map(percentiles_json),
        });
        if op == CacheOp::Get {
            v["hits"] = p.hits.into();
            v["misses"] = p.misses.into();
        }
        v
    };
    let json = json!({
        "scenario": "cache",
        "cache": cache,
        "payload_bytes": args.payload,
        "concurrency": concurrency,
        "connections": connections,
        "keys": args.keys,
        "put": phase_json(&put, CacheOp::Put),
        "get": phase_json(&get, CacheOp::Get),
    });
    let mut human = format!(
        "felix bench cache: {} B values, {} keys, concurrency {}, {} connection(s), cache {}\n",
        args.payload, args.keys, concurrency, connections, cache
    );
    for (name, p) in [("put", &put), ("get", &get)] {
        human += &format!(
            "  {name}  {:>10} ops in {:>7.3} s  {:>11.0} ops/s  {:>9.2} MB/s",
            p.ops,
            p.elapsed.as_secs_f64(),
            per_sec(p.ops, p.elapsed),
            mb(args.payload as u64) * per_sec(p.ops - p.misses, p.elapsed),
        );
        if name == "get" {
            human += &format!("  ({} hits, {} misses)", p.hits, p.misses);
        }
        human += "\n";
        if let Some(h) = &p.latency {
            human += &format!("  {name} latency (us)  {}\n", percentiles_text(h));
        }
    }
    Ok(Report {
        json,
        human,
        errors: errors.take(),
        work: put.ops + get.ops,
        unit: "cache_op",
    })
}

struct CachePhase<'a> {
    op: CacheOp,
    clients: &'a [Client],
    namespace: &'a str,
    cache: &'a str,
    value: &'a Bytes,
    keys: u64,
    concurrency: usize,
    duration: Duration,
    count: Option<u64>,
}

/// Runs `concurrency` workers until the phase's count or duration is spent.
async fn cache_phase(phase: CachePhase<'_>, errors: &Arc<Errors>, shared: &Arc<Shared>) -> Phase {
    let started = Instant::now();
    let deadline = started + phase.duration;
    let next_op = Arc::new(AtomicU64::new(0));
    let budget = Arc::new(Budget::new(phase.count));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = JoinSet::new();
    for w in 0..phase.concurrency {
        let client = phase.clients[w % phase.clients.len()].clone();
        let (namespace, cache) = (phase.namespace.to_owned(), phase.cache.to_owned());
        let (value, keys, op) = (phase.value.clone(), phase.keys, phase.op);
        let (next_op, budget, stop, errors, shared) = (
            next_op.clone(),
            budget.clone(),
            stop.clone(),
            errors.clone(),
            shared.clone(),
        );
        workers.spawn(async move {
            let mut p = Phase {
                latency: Some(histogram()),
                ..Phase::default()
            };
            while Instant::now() < deadline && !stop.load(Ordering::Relaxed) && budget.take(1) == 1
            {
                let key = format!("k{}", next_op.fetch_add(1, Ordering::Relaxed) % keys);
                let sent = Instant::now();
                let result = match op {
                    CacheOp::Put => client
                        .cache_put(&namespace, &cache, &key, value.clone(), None)
                        .await
                        .map(|()| true),
                    CacheOp::Get => client
                        .cache_get(&namespace, &cache, &key)
                        .await
                        .map(|v| v.is_some()),
                };
                match result {
                    Ok(hit) => {
                        if let Some(h) = p.latency.as_mut() {
                            h.saturating_record(sent.elapsed().as_nanos() as u64);
                        }
                        p.ops += 1;
                        if hit {
                            p.hits += 1;
                        } else {
                            p.misses += 1;
                        }
                        // The progress bar shows operations as "sent".
                        shared.published.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        p.errors += 1;
                        errors.push(format!("cache: {e}"));
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
            p
        });
    }
    let mut total = Phase {
        latency: Some(histogram()),
        ..Phase::default()
    };
    while let Some(done) = workers.join_next().await {
        match done {
            Ok(p) => {
                total.ops += p.ops;
                total.hits += p.hits;
                total.misses += p.misses;
                total.errors += p.errors;
                if let (Some(t), Some(h)) = (total.latency.as_mut(), p.latency.as_ref()) {
                    t.add(h).expect("same bounds");
                }
            }
            Err(e) => errors.push(format!("cache worker: {e}")),
        }
    }
    total.elapsed = started.elapsed();
    if phase.op == CacheOp::Put {
        // A put has no miss: every stored value counts towards MB/s.
        total.hits = total.ops;
        total.misses = 0;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_and_short_payloads_have_none() {
        let p = stamped_payload(64, 123_456);
        assert_eq!(p.len(), 64);
        assert_eq!(read_stamp(&p), Some(123_456));
        assert_eq!(read_stamp(b"short"), None);
    }

    #[test]
    fn the_budget_hands_out_exactly_its_count() {
        let b = Budget::new(Some(10));
        assert_eq!(b.take(4), 4);
        assert_eq!(b.take(4), 4);
        assert_eq!(b.take(4), 2);
        assert_eq!(b.take(4), 0);
        assert_eq!(Budget::new(None).take(64), 64);
    }

    #[test]
    fn percentiles_are_reported_in_microseconds() {
        let mut h = histogram();
        for us in 1..=1000u64 {
            h.record(us * 1000).unwrap();
        }
        let v = percentiles_json(&h);
        assert_eq!(v["count"], 1000);
        let p50 = v["p50"].as_f64().unwrap();
        let p99 = v["p99"].as_f64().unwrap();
        assert!((499.0..=501.0).contains(&p50), "{p50}");
        assert!((989.0..=991.0).contains(&p99), "{p99}");
        assert!(percentiles_text(&histogram()).contains("no samples"));
    }
}
