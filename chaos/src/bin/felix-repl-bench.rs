//! `felix-repl-bench`: replication benchmarks against real `felix-broker` processes on
//! loopback (docs/replication.md, "Benchmarks"). Each subcommand lays out its own brokers with
//! the chaos run's harness (`chaos/src/cluster.rs`), with direct peer links, and prints figures.
//!
//! - `compare`: a 3-node cluster with a `quorum` and a `leader` stream (one shard, replication
//!   factor 3 each) and one durable broker outside any cluster with the same fsync mode, all
//!   running at once. Rounds alternate between the three: acked publish throughput (batches of
//!   `--batch` × `--payload` bytes) and sequential batch-1 acked publish latency, each published
//!   to the shard's leader directly. Prints each figure and the ratios to the single node.
//! - `failover`: publishes under load, SIGKILLs the shard's leader, and times the first
//!   acknowledged publish sent after the kill; then restarts the node and waits until it is
//!   ready and the leader's lag is zero; `--iterations` times. A `leader` stream's shard waits
//!   for its leader, so with `--stream leader` the node is restarted at once and the figure is
//!   the shard's unavailability across a crash and restart.
//! - `catch-up`: stops (SIGSTOP, or SIGKILL with `--fault kill`) one follower, publishes
//!   `--bytes` to the quorum shard (the leader and the other follower are a majority), resumes
//!   it, and times until the leader reports its lag zero. `--fault wipe` kills it and empties
//!   its data directory before the restart: it comes back on a new disk and is rebuilt.
//!
//! Every loop is bounded in count and in time. Exit 0 when the benchmark ran, 1 when the
//! cluster did not do what it measures in time (failover, catch-up: logs kept and printed),
//! 2 on a usage error or a harness failure.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{Ack, Client, ClientConfig, Offer};
use felix_proto::message::{self, Message, ShardKind};

use felix_chaos::cluster::{self, http_get, Cluster, Layout, StreamDecl, NAMESPACE, NODES, TENANT};

const USAGE: &str = "\
usage: felix-repl-bench <compare|failover|catch-up> [options]
common:   --broker-bin PATH (default target/release/felix-broker)
          --fsync-mode MODE (default on_commit)   --lease-ms N (default 2000, the broker's)
          --payload BYTES (default 1024)   --keep (keep the run directory)
compare:  --rounds N (3)  --secs S per throughput phase (3)  --samples N per latency phase (1000)
          --batch N (64)  --connections N (1)  --inflight N per connection (4)
failover: --iterations N (20, at most 100)  --stream quorum|leader (quorum)  --max-secs S (1200)
catch-up: --bytes N[K|M|G] (1G)  --fault stop|kill|wipe (stop)  --batch N (64)  --connections N (1)
          --inflight N (4)  --max-secs S (900)";

/// How long one failover may take before it counts as never completed.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);
/// A restarted node: ready and caught up within this, or the run reports it.
const REJOIN_LIMIT: Duration = Duration::from_secs(60);
/// Between two looks at `shard_owners` or `/metrics` while waiting for an event.
const POLL: Duration = Duration::from_millis(20);
/// Bound on one publish in the failover load (a publish forwarded to the dead leader waits
/// there until this, then its connection is dropped and dialed again).
const LOAD_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on one request everywhere else.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Records per publish in the failover load.
const LOAD_BATCH: usize = 16;
/// Publishes before each figure is taken, not counted.
const WARMUP_PUBLISHES: usize = 200;
const MB: f64 = 1e6;

struct Args {
    cmd: String,
    broker: PathBuf,
    fsync_mode: String,
    lease: Duration,
    payload: usize,
    keep: bool,
    rounds: u32,
    secs: u64,
    samples: u32,
    batch: usize,
    connections: usize,
    inflight: usize,
    iterations: u32,
    stream: &'static str,
    max_secs: u64,
    bytes: u64,
    fault: Fault,
}

/// What `catch-up` does to the follower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGSTOP, then SIGCONT.
    Stop,
    /// SIGKILL, then a restart on its disk.
    Kill,
    /// SIGKILL, its data directory emptied, then a restart: rebuilt from the leader.
    Wipe,
}

fn parse_size(v: &str) -> Result<u64, String> {
    let (num, mult) = match v.char_indices().last() {
        Some((i, 'K' | 'k')) => (&v[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&v[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&v[..i], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>()
        .map_err(|e| format!("{v:?}: {e}"))?
        .checked_mul(mult)
        .ok_or_else(|| format!("{v:?}: too large"))
}

/// `v` as a number from `lo` to `hi`.
fn num<T>(flag: &str, v: String, lo: T, hi: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
    T::Err: std::fmt::Display,
{
    let n: T = v.parse().map_err(|e| format!("{flag} {v:?}: {e}"))?;
    if n < lo || n > hi {
        return Err(format!("{flag} {v}: {lo} to {hi}"));
    }
    Ok(n)
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let cmd = it.next().ok_or("no subcommand")?;
    if !["compare", "failover", "catch-up"].contains(&cmd.as_str()) {
        return Err(format!("unknown subcommand {cmd:?}"));
    }
    let mut a = Args {
        cmd,
        broker: PathBuf::from("target/release/felix-broker"),
        fsync_mode: "on_commit".into(),
        lease: Duration::from_millis(2000),
        payload: 1024,
        keep: false,
        rounds: 3,
        secs: 3,
        samples: 1000,
        batch: 64,
        connections: 1,
        inflight: 4,
        iterations: 20,
        stream: "quorum",
        max_secs: 0,
        bytes: 1 << 30,
        fault: Fault::Stop,
    };
    let mut max_secs = None;
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--broker-bin" => a.broker = PathBuf::from(value()?),
            "--fsync-mode" => a.fsync_mode = value()?,
            "--lease-ms" => {
                a.lease = Duration::from_millis(num(&flag, value()?, 100u64, 60_000)?);
            }
            "--payload" => a.payload = num(&flag, value()?, 1usize, 1 << 20)?,
            "--keep" => a.keep = true,
            "--rounds" => a.rounds = num(&flag, value()?, 1, 20)?,
            "--secs" => a.secs = num(&flag, value()?, 1, 60)?,
            "--samples" => a.samples = num(&flag, value()?, 10, 100_000)?,
            "--batch" => a.batch = num(&flag, value()?, 1, 4096)?,
            "--connections" => a.connections = num(&flag, value()?, 1, 16)?,
            "--inflight" => a.inflight = num(&flag, value()?, 1, 64)?,
            "--iterations" => a.iterations = num(&flag, value()?, 1, 100)?,
            "--stream" => {
                a.stream = match value()?.as_str() {
                    "quorum" => "quorum",
                    "leader" => "leader",
                    other => return Err(format!("--stream {other:?}: quorum or leader")),
                }
            }
            "--max-secs" => max_secs = Some(num(&flag, value()?, 10, 3600)?),
            "--bytes" => {
                a.bytes = parse_size(&value()?)?;
                if !(1 << 20..=16 << 30).contains(&a.bytes) {
                    return Err("--bytes: 1M to 16G".into());
                }
            }
            "--fault" => {
                a.fault = match value()?.as_str() {
                    "stop" => Fault::Stop,
                    "kill" => Fault::Kill,
                    "wipe" => Fault::Wipe,
                    other => return Err(format!("--fault {other:?}: stop, kill or wipe")),
                }
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    a.max_secs = max_secs.unwrap_or(if a.cmd == "failover" { 1200 } else { 900 });
    if !a.broker.is_file() {
        return Err(format!("--broker-bin {}: no such file", a.broker.display()));
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("felix-repl-bench: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("felix-repl-bench: starting tokio: {e}");
            return ExitCode::from(2);
        }
    };
    // The machine may be shared: say how busy it was, to read the figures by.
    let load = || {
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "unknown".into())
    };
    println!("load average at start: {}", load());
    let outcome = match args.cmd.as_str() {
        "compare" => compare(&args, &runtime),
        "failover" => failover(&args, &runtime),
        _ => catch_up(&args, &runtime),
    };
    println!("load average at the end: {}", load());
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("felix-repl-bench: {e}");
            ExitCode::from(2)
        }
    }
}

// ---- the brokers -----------------------------------------------------------------------

fn stream(name: &'static str, replication_factor: u32, consistency: &'static str) -> StreamDecl {
    StreamDecl {
        name,
        shards: 1,
        replication_factor,
        consistency,
    }
}

/// Three nodes, direct links, a `quorum` and a `leader` stream of one shard each at RF 3.
fn lay_out_cluster(args: &Args) -> Result<Cluster, String> {
    Cluster::lay_out_with(
        &args.broker,
        &Layout {
            cluster: true,
            streams: vec![stream("quorum", 3, "quorum"), stream("leader", 3, "leader")],
            fsync_mode: args.fsync_mode.clone(),
            lease: args.lease,
            relays: false,
            prefix: "felix-repl-bench",
        },
    )
}

fn start_all(c: &mut Cluster) -> Result<(), String> {
    for i in 0..c.nodes.len() {
        c.start(i)?;
    }
    for i in 0..c.nodes.len() {
        c.wait_ready(i, cluster::READY_LIMIT)?;
    }
    Ok(())
}

/// Stops the brokers; the directory stays when asked or when the run found a fault.
fn finish(c: &mut Cluster, keep: bool) {
    c.stop_all();
    if keep {
        println!("logs and data kept in {}", c.dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&c.dir);
    }
}

fn client_config(addr: SocketAddr, c: &Cluster, timeout: Duration) -> ClientConfig {
    let mut config = ClientConfig::new(addr, c.ca_pem.as_bytes().to_vec(), TENANT, &c.token);
    config.request_timeout = timeout;
    config.connect_timeout = CONNECT_TIMEOUT;
    config
}

/// A connection for `shard_owners` questions (raw frames, as the reference client offers).
async fn control(addr: SocketAddr, c: &Cluster) -> Result<Client, String> {
    let mut config = client_config(addr, c, REQUEST_TIMEOUT);
    config.offer = Offer::reference_client();
    Client::connect(config)
        .await
        .map_err(|e| format!("{addr}: {e}"))
}

/// Shard 0's leader of `stream` as `client`'s node knows it: node id, client address and
/// generation; `None` while nobody leads it.
async fn shard_leader(
    client: &Client,
    stream: &str,
) -> Result<Option<(String, SocketAddr, u64)>, String> {
    let ask = Message::ShardOwners(message::ShardOwners {
        tenant_id: TENANT.into(),
        namespace: NAMESPACE.into(),
        name: stream.into(),
        kind: ShardKind::Stream,
        request_id: 1,
    });
    let mut raw = client
        .open_raw_stream(true)
        .await
        .map_err(|e| e.to_string())?;
    raw.send(ask.to_frame().to_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let frame = tokio::time::timeout(REQUEST_TIMEOUT, raw.recv_frame())
        .await
        .map_err(|_| "no shard_owners answer".to_owned())?
        .map_err(|e| e.to_string())?
        .ok_or("the stream ended without an answer")?;
    match Message::decode(&frame.payload).map_err(|e| e.to_string())? {
        Message::ShardOwnersView(v) => {
            Ok(v.owners.into_iter().find(|o| o.shard == 0).and_then(|o| {
                match (o.node_id, o.addr.and_then(|a| a.parse().ok()), o.generation) {
                    (Some(n), Some(a), Some(g)) => Some((n, a, g)),
                    _ => None,
                }
            }))
        }
        other => Err(format!("expected shard_owners_view, got {other:?}")),
    }
}

/// Waits (bounded) until `client`'s node names a leader of `stream` that `accept` takes.
async fn wait_leader(
    client: &Client,
    stream: &str,
    limit: Duration,
    accept: impl Fn(&str, u64) -> bool,
) -> Result<(String, SocketAddr, u64), String> {
    let deadline = Instant::now() + limit;
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        match shard_leader(client, stream).await {
            Ok(Some((node, addr, g))) if accept(&node, g) => return Ok((node, addr, g)),
            Ok(Some((node, _, g))) => last = format!("{node} at generation {g}"),
            Ok(None) => last = "no leader".into(),
            Err(e) => last = e,
        }
        tokio::time::sleep(POLL).await;
    }
    Err(format!(
        "{stream}: no acceptable leader within {limit:?} (last: {last})"
    ))
}

fn node_index(c: &Cluster, id: &str) -> Result<usize, String> {
    c.nodes
        .iter()
        .position(|n| n.id == id)
        .ok_or_else(|| format!("unknown node {id:?}"))
}

fn scrape(ops: SocketAddr) -> Option<String> {
    http_get(ops, "/metrics", true).map(|(_, text)| text)
}

/// The value of the sample whose line starts with `name` followed by a space.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn cpu_seconds(ops: SocketAddr) -> Option<f64> {
    sample(&scrape(ops)?, "process_cpu_seconds_total")
}

/// `felix_broker_replication_lag_records` for shard 0 of `stream`, on the node whose
/// metrics these are (only its leader exports it).
fn lag_records(text: &str, stream: &str) -> Option<u64> {
    let shard = format!("/{stream}#0\"");
    text.lines()
        .filter(|l| l.starts_with("felix_broker_replication_lag_records{") && l.contains(&shard))
        .find_map(|l| l.rsplit(' ').next()?.trim().parse().ok())
}

fn catch_up_bytes(ops: SocketAddr) -> Option<u64> {
    sample(
        &scrape(ops)?,
        "felix_broker_replication_catch_up_bytes_total",
    )
    .map(|v| v as u64)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn batch_of(args: &Args, n: usize) -> Vec<Bytes> {
    // Not all one byte, so nothing on the way can shrink it.
    let payload: Bytes = (0..args.payload).map(|i| (i * 131 % 251) as u8).collect();
    vec![payload; n]
}

/// Acked publishes of `batch` on `clients`, `inflight` at once on each, until `deadline` or
/// until `budget` payload bytes were sent. Returns the payload bytes acknowledged and the
/// time taken; the first error ends the run.
async fn pump(
    clients: &[Client],
    stream: &'static str,
    batch: Vec<Bytes>,
    inflight: usize,
    deadline: Instant,
    budget: Option<u64>,
) -> Result<(u64, Duration), String> {
    let bytes: u64 = batch.iter().map(|b| b.len() as u64).sum();
    let claimed = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for client in clients {
        for _ in 0..inflight {
            let (client, batch) = (client.clone(), batch.clone());
            let (claimed, acked, failed) = (claimed.clone(), acked.clone(), failed.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < deadline && !failed.load(Ordering::Relaxed) {
                    if budget.is_some_and(|b| claimed.fetch_add(bytes, Ordering::Relaxed) >= b) {
                        break;
                    }
                    let answer = client
                        .publish(NAMESPACE, stream, batch.clone(), None, Ack::PerBatch)
                        .await;
                    match answer {
                        Ok(Some(_)) => {
                            acked.fetch_add(bytes, Ordering::Relaxed);
                        }
                        other => {
                            failed.store(true, Ordering::Relaxed);
                            return Err(format!("{stream}: publish answered {other:?}"));
                        }
                    }
                }
                Ok(())
            }));
        }
    }
    let mut first_error = None;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(format!("a publisher task failed: {e}"));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok((acked.load(Ordering::Relaxed), start.elapsed())),
    }
}

/// `samples` batch-1 acked publishes one after another; each one's round trip.
async fn latencies(
    client: &Client,
    stream: &'static str,
    payload: &Bytes,
    samples: u32,
    deadline: Instant,
) -> Result<Vec<Duration>, String> {
    let mut out = Vec::with_capacity(samples as usize);
    for _ in 0..samples {
        if Instant::now() >= deadline {
            break;
        }
        let sent = Instant::now();
        match client
            .publish(
                NAMESPACE,
                stream,
                vec![payload.clone()],
                None,
                Ack::PerBatch,
            )
            .await
        {
            Ok(Some(_)) => out.push(sent.elapsed()),
            other => return Err(format!("{stream}: batch-1 publish answered {other:?}")),
        }
    }
    Ok(out)
}

// ---- compare ---------------------------------------------------------------------------

struct Target {
    label: &'static str,
    stream: &'static str,
    clients: Vec<Client>,
    /// Every broker of its setup, for CPU.
    ops: Vec<SocketAddr>,
    bytes: u64,
    busy: Duration,
    cpu: f64,
    lat: Vec<Duration>,
}

fn compare(args: &Args, rt: &tokio::runtime::Runtime) -> Result<bool, String> {
    let mut c = lay_out_cluster(args)?;
    let mut single = Cluster::lay_out_with(
        &args.broker,
        &Layout {
            cluster: false,
            streams: vec![stream("single", 1, "leader")],
            fsync_mode: args.fsync_mode.clone(),
            lease: args.lease,
            relays: false,
            prefix: "felix-repl-bench-single",
        },
    )?;
    println!(
        "compare: fsync_mode {}, {} × {} B per publish, {} connection(s) × {} in flight, \
         {} round(s) of {} s throughput + {} batch-1 samples per setup",
        args.fsync_mode,
        args.batch,
        args.payload,
        args.connections,
        args.inflight,
        args.rounds,
        args.secs,
        args.samples
    );
    println!("runs in {} and {}", c.dir.display(), single.dir.display());
    start_all(&mut c)?;
    start_all(&mut single)?;
    let result = rt.block_on(compare_rounds(args, &c, &single));
    finish(&mut c, args.keep);
    finish(&mut single, args.keep);
    result
}

async fn compare_rounds(args: &Args, c: &Cluster, single: &Cluster) -> Result<bool, String> {
    let ctl = control(c.nodes[0].client, c).await?;
    let mut targets = Vec::new();
    for (label, stream, nodes) in [
        ("quorum RF3", "quorum", Some(c)),
        ("leader RF3", "leader", Some(c)),
        ("single node", "single", None),
    ] {
        let (addr, ops, who) = match nodes {
            Some(c) => {
                let (node, addr, _) = wait_leader(&ctl, stream, REJOIN_LIMIT, |_, _| true).await?;
                (addr, c.nodes.iter().map(|n| n.ops).collect(), node)
            }
            None => (
                single.nodes[0].client,
                vec![single.nodes[0].ops],
                single.nodes[0].id.to_owned(),
            ),
        };
        let mut clients = Vec::new();
        for _ in 0..args.connections {
            let cfg = client_config(
                addr,
                if nodes.is_some() { c } else { single },
                REQUEST_TIMEOUT,
            );
            clients.push(
                Client::connect(cfg)
                    .await
                    .map_err(|e| format!("{label}: {e}"))?,
            );
        }
        println!("{label}: stream {stream}, publishing to {who} at {addr}");
        targets.push(Target {
            label,
            stream,
            clients,
            ops,
            bytes: 0,
            busy: Duration::ZERO,
            cpu: 0.0,
            lat: Vec::new(),
        });
    }
    ctl.close().await;
    let batch = batch_of(args, args.batch);
    let one = batch_of(args, 1).remove(0);
    let phase_limit = Duration::from_secs(args.secs) + Duration::from_secs(60);
    // Warm-up: leases taken, files open, connections' windows grown.
    for t in &targets {
        let far = Instant::now() + phase_limit;
        let budget = WARMUP_PUBLISHES as u64 * batch.iter().map(|b| b.len() as u64).sum::<u64>();
        pump(
            &t.clients,
            t.stream,
            batch.clone(),
            args.inflight,
            far,
            Some(budget),
        )
        .await?;
        latencies(&t.clients[0], t.stream, &one, WARMUP_PUBLISHES as u32, far).await?;
    }
    for round in 0..args.rounds as usize {
        // Each round starts with the next setup, so none always runs first.
        for k in 0..targets.len() {
            let i = (round + k) % targets.len();
            let t = &mut targets[i];
            let cpu_before: Option<f64> = t.ops.iter().map(|&o| cpu_seconds(o)).sum();
            let deadline = Instant::now() + Duration::from_secs(args.secs);
            let (bytes, busy) = pump(
                &t.clients,
                t.stream,
                batch.clone(),
                args.inflight,
                deadline,
                None,
            )
            .await?;
            let cpu_after: Option<f64> = t.ops.iter().map(|&o| cpu_seconds(o)).sum();
            let cpu = cpu_before.zip(cpu_after).map_or(0.0, |(a, b)| b - a);
            let mut lat = latencies(
                &t.clients[0],
                t.stream,
                &one,
                args.samples,
                Instant::now() + phase_limit,
            )
            .await?;
            lat.sort();
            println!(
                "round {round} {:<12} {:>8.1} MB/s  broker CPU {:>6.1} ms/MB  batch-1 p50 {:>6} µs p99 {:>6} µs",
                t.label,
                bytes as f64 / MB / busy.as_secs_f64(),
                cpu * 1e3 / (bytes as f64 / MB),
                percentile(&lat, 50.0).as_micros(),
                percentile(&lat, 99.0).as_micros(),
            );
            t.bytes += bytes;
            t.busy += busy;
            t.cpu += cpu;
            t.lat.extend(lat);
        }
    }
    for t in &mut targets {
        t.lat.sort();
    }
    let mbps = |t: &Target| t.bytes as f64 / MB / t.busy.as_secs_f64();
    let p = |t: &Target, q| percentile(&t.lat, q).as_secs_f64() * 1e6;
    let cpu = |t: &Target| t.cpu * 1e3 / (t.bytes as f64 / MB);
    let s = &targets[2];
    println!("\nall rounds together:");
    println!(
        "{:<34} {:>12} {:>12} {:>12} {:>14} {:>14}",
        "figure", targets[0].label, targets[1].label, s.label, "quorum/single", "leader/single"
    );
    type Figure<'a> = &'a dyn Fn(&Target) -> f64;
    let rows: [(&str, Figure); 4] = [
        ("acked throughput MB/s", &mbps),
        ("batch-1 acked latency p50 µs", &|t| p(t, 50.0)),
        ("batch-1 acked latency p99 µs", &|t| p(t, 99.0)),
        ("broker CPU ms per MB (all nodes)", &cpu),
    ];
    for (name, f) in rows {
        let (q, l, one) = (f(&targets[0]), f(&targets[1]), f(s));
        println!(
            "{name:<34} {q:>12.1} {l:>12.1} {one:>12.1} {:>14.2} {:>14.2}",
            q / one,
            l / one
        );
    }
    let tput = mbps(&targets[0]) / mbps(s);
    let p99 = p(&targets[0], 99.0) / p(s, 99.0);
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!(
        "target: quorum throughput ≥ 0.40 × single: {tput:.2} ({})",
        verdict(tput >= 0.4)
    );
    println!(
        "target: quorum batch-1 p99 ≤ 2 × single: {p99:.2} ({})",
        verdict(p99 <= 2.0)
    );
    for t in targets {
        for client in t.clients {
            client.close().await;
        }
    }
    Ok(true)
}

// ---- failover --------------------------------------------------------------------------

/// What the load tasks saw, shared with the measuring loop.
#[derive(Default)]
struct LoadView {
    stop: AtomicBool,
    acks: AtomicU64,
    errors: AtomicU64,
    /// Set just before the SIGKILL.
    kill_at: Mutex<Option<Instant>>,
    /// The first ack of a publish sent after the kill.
    first_ack: Mutex<Option<Instant>>,
}

impl LoadView {
    fn acked(&self, sent: Instant) {
        self.acks.fetch_add(1, Ordering::Relaxed);
        let killed = *self.kill_at.lock().expect("lock");
        if killed.is_some_and(|k| sent >= k) {
            let now = Instant::now();
            let mut first = self.first_ack.lock().expect("lock");
            if first.is_none_or(|f| now < f) {
                *first = Some(now);
            }
        }
    }
}

/// One publisher on `addr`: acked batches one at a time; after an error or a time-out the
/// connection is dropped and dialed again (a publish stream stuck behind a forward to the
/// dead leader would hold every later publish on it).
async fn load_task(
    config: ClientConfig,
    stream: &'static str,
    batch: Vec<Bytes>,
    view: Arc<LoadView>,
    deadline: Instant,
) {
    let mut client: Option<Client> = None;
    while !view.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let Some(conn) = &client else {
            match Client::connect(config.clone()).await {
                Ok(conn) => client = Some(conn),
                Err(_) => tokio::time::sleep(POLL).await,
            }
            continue;
        };
        let sent = Instant::now();
        match conn
            .publish(NAMESPACE, stream, batch.clone(), None, Ack::PerBatch)
            .await
        {
            Ok(Some(_)) => view.acked(sent),
            _ => {
                view.errors.fetch_add(1, Ordering::Relaxed);
                client = None;
            }
        }
    }
    if let Some(conn) = client {
        conn.close().await;
    }
}

struct Round {
    killed: String,
    generation: u64,
    named: Duration,
    first_ack: Duration,
    new_leader: String,
    ready: Duration,
    caught_up: Duration,
    errors: u64,
    /// The metadata log's raft term on a survivor before the kill and at the first ack: a
    /// change means the control plane elected a leader too (the killed node led it).
    terms: (Option<u64>, Option<u64>),
    probe_failures: u32,
    probe_error: Option<String>,
}

fn failover(args: &Args, rt: &tokio::runtime::Runtime) -> Result<bool, String> {
    let mut c = lay_out_cluster(args)?;
    let target = 2 * args.lease + Duration::from_millis(500);
    println!(
        "failover: stream {} (RF 3, one shard), lease {:?}, fsync_mode {}, {} iteration(s); \
         load: 2 publishers per surviving node, {LOAD_BATCH} × {} B acked; target 2 × lease + 0.5 s = {:?}",
        args.stream, args.lease, args.fsync_mode, args.iterations, args.payload, target
    );
    println!("runs in {}", c.dir.display());
    start_all(&mut c)?;
    let deadline = Instant::now() + Duration::from_secs(args.max_secs);
    let mut rounds: Vec<Round> = Vec::new();
    let mut fault = None;
    for i in 0..args.iterations {
        if Instant::now() >= deadline {
            println!("--max-secs reached after {i} iteration(s)");
            break;
        }
        match rt.block_on(failover_once(args, &mut c, deadline)) {
            Ok(r) => {
                println!(
                    "iteration {i:>2}: SIGKILL {} (leader at generation {}): {} named at +{:.3} s, \
                     first ack +{:.3} s; restarted: ready +{:.3} s, lag 0 +{:.3} s ({} load errors; \
                     metadata term {:?} -> {:?}; {} probe publishes failed{})",
                    r.killed,
                    r.generation,
                    r.new_leader,
                    r.named.as_secs_f64(),
                    r.first_ack.as_secs_f64(),
                    r.ready.as_secs_f64(),
                    r.caught_up.as_secs_f64(),
                    r.errors,
                    r.terms.0,
                    r.terms.1,
                    r.probe_failures,
                    r.probe_error
                        .as_ref()
                        .map_or(String::new(), |e| format!(", the first: {e}"))
                );
                rounds.push(r);
            }
            Err(e) => {
                println!("iteration {i}: FAILED: {e}");
                println!("{}", c.diagnose());
                for n in &c.nodes {
                    println!("--- {} log tail ({})", n.id, n.log.display());
                    let text = std::fs::read_to_string(&n.log).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    for l in &lines[lines.len().saturating_sub(15)..] {
                        println!("  {l}");
                    }
                }
                fault = Some(e);
                break;
            }
        }
    }
    if !rounds.is_empty() {
        let mut firsts: Vec<Duration> = rounds.iter().map(|r| r.first_ack).collect();
        firsts.sort();
        let mut named: Vec<Duration> = rounds.iter().map(|r| r.named).collect();
        named.sort();
        let mut caught: Vec<Duration> = rounds.iter().map(|r| r.caught_up).collect();
        caught.sort();
        let within = firsts.iter().filter(|d| **d <= target).count();
        println!(
            "\nkill → first acked publish over {} failover(s): p50 {:.3} s, max {:.3} s \
             (target {:.3} s = 2 × lease {:?} + 0.5 s: {within} of {} within, max {})",
            firsts.len(),
            percentile(&firsts, 50.0).as_secs_f64(),
            firsts.last().expect("not empty").as_secs_f64(),
            target.as_secs_f64(),
            args.lease,
            firsts.len(),
            if *firsts.last().expect("not empty") <= target {
                "met"
            } else {
                "MISSED"
            }
        );
        // A kill that took the metadata log's leader with it waits for an election too.
        for (what, moved) in [("also led", true), ("did not lead", false)] {
            let mut some: Vec<Duration> = rounds
                .iter()
                .filter(|r| r.terms.0.is_some() && (r.terms.0 != r.terms.1) == moved)
                .map(|r| r.first_ack)
                .collect();
            some.sort();
            if let Some(max) = some.last() {
                println!(
                    "  {} failover(s) where the killed node {what} the metadata log (its raft term \
                     moved: {moved}): p50 {:.3} s, max {:.3} s",
                    some.len(),
                    percentile(&some, 50.0).as_secs_f64(),
                    max.as_secs_f64()
                );
            }
        }
        println!(
            "kill → new leader named in shard_owners: p50 {:.3} s, max {:.3} s",
            percentile(&named, 50.0).as_secs_f64(),
            named.last().expect("not empty").as_secs_f64()
        );
        println!(
            "restart → ready and lag 0: p50 {:.3} s, max {:.3} s",
            percentile(&caught, 50.0).as_secs_f64(),
            caught.last().expect("not empty").as_secs_f64()
        );
    }
    finish(&mut c, args.keep || fault.is_some());
    Ok(fault.is_none())
}

async fn failover_once(args: &Args, c: &mut Cluster, deadline: Instant) -> Result<Round, String> {
    let stream = args.stream;
    // Who leads now, asked of every node until one answers.
    let mut before = None;
    for n in &c.nodes {
        if let Ok(ctl) = control(n.client, c).await {
            before = Some(wait_leader(&ctl, stream, REJOIN_LIMIT, |_, _| true).await?);
            ctl.close().await;
            break;
        }
    }
    let (leader, _, generation) = before.ok_or("no node answered shard_owners")?;
    let victim = node_index(c, &leader)?;
    let survivors: Vec<usize> = (0..c.nodes.len()).filter(|&i| i != victim).collect();

    // Questions and the probe publish go on connections of their own that published nothing
    // before the kill, so no forward to the dead leader stands in front of them.
    let mut ctls = Vec::new();
    let mut probes = Vec::new();
    for &s in &survivors {
        ctls.push(control(c.nodes[s].client, c).await?);
        probes.push(
            Client::connect(client_config(c.nodes[s].client, c, 2 * REQUEST_TIMEOUT))
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let view = Arc::new(LoadView::default());
    let batch = batch_of(args, LOAD_BATCH);
    let load_deadline = (Instant::now() + FAILOVER_LIMIT + REJOIN_LIMIT).min(deadline);
    let mut load = Vec::new();
    for &s in &survivors {
        for _ in 0..2 {
            load.push(tokio::spawn(load_task(
                client_config(c.nodes[s].client, c, LOAD_TIMEOUT),
                stream,
                batch.clone(),
                view.clone(),
                load_deadline,
            )));
        }
    }
    // The load flows before the kill (bounded wait for it).
    let flowing = Instant::now() + REJOIN_LIMIT;
    while view.acks.load(Ordering::Relaxed) < 50 {
        if Instant::now() >= flowing {
            view.stop.store(true, Ordering::Relaxed);
            return Err("the load got no acks before the kill".into());
        }
        tokio::time::sleep(POLL).await;
    }

    let term = |c: &Cluster| {
        scrape(c.nodes[survivors[0]].ops)
            .and_then(|t| sample(&t, "felix_broker_cluster_metadata_term"))
            .map(|v| v as u64)
    };
    let term_before = term(c);
    let killed_at = Instant::now();
    *view.kill_at.lock().expect("lock") = Some(killed_at);
    c.kill(victim)?;
    // A `leader` shard waits for its leader (docs/replication.md, "Who may lead a `leader`
    // shard"): the node is restarted at once, and the figure is how long the shard is
    // unavailable across a crash and restart.
    let restart_at_once = stream == "leader";
    if restart_at_once {
        c.start(victim)?;
    }

    // Poll the survivors for a new leader; publish to it directly once named.
    let limit = killed_at + FAILOVER_LIMIT;
    let mut named = None;
    let mut new_leader = String::new();
    let mut probe_ack = None;
    let (mut probe_failures, mut probe_error) = (0u32, None);
    let mut turn = 0usize;
    while probe_ack.is_none() && Instant::now() < limit {
        if view.first_ack.lock().expect("lock").is_some() && named.is_some() {
            break;
        }
        let k = turn % ctls.len();
        turn += 1;
        let answer = shard_leader(&ctls[k], stream).await;
        if let Ok(Some((node, _, g))) = answer {
            if (node != leader || restart_at_once) && g > generation {
                named.get_or_insert_with(|| killed_at.elapsed());
                new_leader = node;
                // The restarted leader itself: the load's acks through the others tell.
                let Some(at) = survivors.iter().position(|&s| c.nodes[s].id == new_leader) else {
                    tokio::time::sleep(POLL).await;
                    continue;
                };
                let sent = Instant::now();
                match probes[at]
                    .publish(NAMESPACE, stream, batch_of(args, 1), None, Ack::PerBatch)
                    .await
                {
                    Ok(Some(_)) => {
                        probe_ack = Some(Instant::now());
                        view.acked(sent);
                    }
                    other => {
                        probe_failures += 1;
                        probe_error.get_or_insert_with(|| format!("{other:?}"));
                        probes[at] = Client::connect(client_config(
                            c.nodes[survivors[at]].client,
                            c,
                            2 * REQUEST_TIMEOUT,
                        ))
                        .await
                        .map_err(|e| e.to_string())?;
                    }
                }
                continue;
            }
        }
        tokio::time::sleep(POLL).await;
    }
    let term_after = term(c);
    view.stop.store(true, Ordering::Relaxed);
    for t in load {
        let _ = t.await;
    }
    for ctl in ctls {
        ctl.close().await;
    }
    for p in probes {
        p.close().await;
    }
    let first = *view.first_ack.lock().expect("lock");
    let (Some(named), Some(first)) = (named, first) else {
        return Err(format!(
            "no acknowledged publish on {stream} within {FAILOVER_LIMIT:?} of SIGKILL {leader} \
             (new leader named: {named:?})"
        ));
    };
    let errors = view.errors.load(Ordering::Relaxed);

    // The node back, ready, and caught up: the new leader's lag for the shard is zero.
    let restarted = Instant::now();
    if !restart_at_once {
        c.start(victim)?;
    }
    c.wait_ready(victim, REJOIN_LIMIT)?;
    let ready = restarted.elapsed();
    let lead = node_index(c, &new_leader)?;
    let until = restarted + REJOIN_LIMIT;
    loop {
        let lag = scrape(c.nodes[lead].ops).and_then(|t| lag_records(&t, stream));
        if lag == Some(0) {
            break;
        }
        if Instant::now() >= until {
            return Err(format!(
                "{} restarted but {new_leader}'s lag for {stream} is {lag:?} after {REJOIN_LIMIT:?}",
                c.nodes[victim].id
            ));
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(Round {
        killed: leader,
        generation,
        named,
        first_ack: first - killed_at,
        new_leader,
        ready,
        caught_up: restarted.elapsed(),
        errors,
        terms: (term_before, term_after),
        probe_failures,
        probe_error,
    })
}

// ---- catch-up --------------------------------------------------------------------------

fn catch_up(args: &Args, rt: &tokio::runtime::Runtime) -> Result<bool, String> {
    let mut c = lay_out_cluster(args)?;
    println!(
        "catch-up: stream quorum (RF 3, one shard), fsync_mode {}, {} bytes of {} × {} B \
         batches while one follower is {}",
        args.fsync_mode,
        args.bytes,
        args.batch,
        args.payload,
        match args.fault {
            Fault::Stop => "stopped",
            Fault::Kill => "killed",
            Fault::Wipe => "killed and wiped",
        }
    );
    println!("runs in {}", c.dir.display());
    start_all(&mut c)?;
    let outcome = catch_up_run(args, &mut c, rt);
    if let Err(e) = &outcome {
        println!("FAILED: {e}");
    }
    finish(&mut c, args.keep || !matches!(outcome, Ok(true)));
    outcome
}

fn catch_up_run(
    args: &Args,
    c: &mut Cluster,
    rt: &tokio::runtime::Runtime,
) -> Result<bool, String> {
    let deadline = Instant::now() + Duration::from_secs(args.max_secs);
    let (leader, addr) = rt.block_on(async {
        let ctl = control(c.nodes[0].client, c).await?;
        let (node, addr, _) = wait_leader(&ctl, "quorum", REJOIN_LIMIT, |_, _| true).await?;
        ctl.close().await;
        Ok::<_, String>((node, addr))
    })?;
    let lead = node_index(c, &leader)?;
    // The follower to stop: the first node that does not lead the shard.
    let f = (0..NODES.len()).find(|&i| i != lead).expect("three nodes");
    let fid = c.nodes[f].id;
    let clients = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..args.connections {
            v.push(
                Client::connect(client_config(addr, c, REQUEST_TIMEOUT))
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok::<_, String>(v)
    })?;
    let batch = batch_of(args, args.batch);
    // Warm: leases, and every replica holding the start of the log.
    rt.block_on(pump(
        &clients,
        "quorum",
        batch.clone(),
        args.inflight,
        deadline,
        Some(WARMUP_PUBLISHES as u64 * (args.batch * args.payload) as u64),
    ))?;
    wait_lag(c, lead, "quorum", deadline, |l| l == 0)?;
    let killed = args.fault != Fault::Stop;
    let appended_before = if killed {
        0
    } else {
        catch_up_bytes(c.nodes[f].ops).ok_or("no catch-up counter on the follower")?
    };
    if killed {
        c.kill(f)?;
    } else {
        c.signal(f, libc::SIGSTOP)?;
    }
    if args.fault == Fault::Wipe {
        c.wipe(f)?;
    }
    println!(
        "leader {leader} at {addr}; {} {fid}",
        match args.fault {
            Fault::Stop => "SIGSTOP",
            Fault::Kill => "SIGKILL",
            Fault::Wipe => "SIGKILL and wiped the data directory of",
        }
    );
    let (bytes, took) = rt.block_on(pump(
        &clients,
        "quorum",
        batch,
        args.inflight,
        deadline,
        Some(args.bytes),
    ))?;
    println!(
        "published {bytes} bytes acked to the quorum of two in {:.1} s: {:.1} MB/s",
        took.as_secs_f64(),
        bytes as f64 / MB / took.as_secs_f64()
    );
    let lag_at_resume = scrape(c.nodes[lead].ops).and_then(|t| lag_records(&t, "quorum"));
    let resumed = Instant::now();
    if killed {
        c.start(f)?;
    } else {
        c.signal(f, libc::SIGCONT)?;
    }
    println!(
        "{} {fid}; the leader's lag is {lag_at_resume:?} records",
        if killed { "restart" } else { "SIGCONT" }
    );
    let caught = wait_lag(c, lead, "quorum", deadline, |l| l == 0);
    let took = resumed.elapsed();
    let appended = catch_up_bytes(c.nodes[f].ops).map(|a| a.saturating_sub(appended_before));
    for client in clients {
        rt.block_on(client.close());
    }
    if let Err(e) = caught {
        println!("{fid} did not catch up: {e}");
        return Ok(false);
    }
    println!(
        "caught up in {:.2} s: {} records at {:.1} MB/s of payload ({:.1} MB/s of replicated entries, \
         {appended:?} bytes appended on {fid} per replication_catch_up_bytes_total)",
        took.as_secs_f64(),
        lag_at_resume.map_or("?".into(), |l| l.to_string()),
        bytes as f64 / MB / took.as_secs_f64(),
        appended.unwrap_or(0) as f64 / MB / took.as_secs_f64(),
    );
    Ok(true)
}

/// Polls `node`'s lag for shard 0 of `stream` until `done` takes it, bounded by `deadline`;
/// prints progress every few seconds.
fn wait_lag(
    c: &Cluster,
    node: usize,
    stream: &str,
    deadline: Instant,
    done: impl Fn(u64) -> bool,
) -> Result<(), String> {
    let mut said = Instant::now();
    loop {
        let lag = scrape(c.nodes[node].ops).and_then(|t| lag_records(&t, stream));
        if lag.is_some_and(&done) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{}'s lag for {stream} is {lag:?} at --max-secs",
                c.nodes[node].id
            ));
        }
        if said.elapsed() >= Duration::from_secs(5) {
            println!("  lag {lag:?} records");
            said = Instant::now();
        }
        std::thread::sleep(POLL);
    }
}
