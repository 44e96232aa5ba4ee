//! `felix-deploy-check`: acknowledged load and real faults against the Docker Compose cluster
//! of `deploy/compose.yaml`, then a history check (scripts/test-deploy; docs/deploy.md).
//!
//! Given each node's container and address, it waits until every node answers `/readyz` and
//! every shard has a leader, publishes through one seed with our SDK, then runs clients that
//! publish acked, keyed records with payloads unique to the run while it makes the faults
//! with the Docker engine, one at a time: `docker kill` a shard's leader and start it again;
//! disconnect a leader from the network and connect it again; restart every node in turn (a
//! rolling restart). After each it waits until the node is ready and every follower has
//! caught up. Then every shard is read back from its leader and `felix_testkit::history`
//! judges what the clients were told against what the shards hold; the stream is `quorum`,
//! so nothing acknowledged may be missing whoever leads. Each fault's write gap (the longest
//! time any shard went without an acknowledged write, from the fault until the node is back
//! and caught up) must stay within the failover bound: 4.5 s, or 6.5 s when the control
//! plane's leader moved with the fault.
//!
//! A node not ready, or followers not caught up, within the limits after a fault is reported
//! under `liveness` and the run goes on; with `--strict-liveness` that fails it. The gap of
//! the fault right after such a report is not judged against the bound (a shard a copy short
//! can lose its quorum to it). docs/deploy.md has the one found so far.
//!
//! Exit 0 clean, 1 on a violation, a judged gap over its bound, or (strict) a liveness
//! report; 2 when the run could not be carried out. Every wait is bounded; the caller
//! (scripts/test-deploy) owns the containers and removes them.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use felix_chaos::cluster::http_get;
use felix_chaos::readback::Reader;
use felix_client::{Ack, Client, ClientConfig, ClientError, RetryClass};
use felix_proto::routing::{shard_for_key, RoutingMapping};
use felix_testkit::history::{self, Op, ShardId, Tolerance};

/// What deploy/compose/cluster.toml declares: a `quorum` stream of three shards on all three
/// nodes, for this tenant and namespace.
const TENANT: &str = "t1";
const NAMESPACE: &str = "deploy";
const STREAM: &str = "orders";
const SHARDS: u32 = 3;
/// The image's ports (deploy/Dockerfile).
const CLIENT_PORT: u16 = 5000;
const OPS_PORT: u16 = 8080;
/// The shard lease the compose cluster runs with (the broker's default).
const LEASE_MS: u64 = 2000;
/// How long a shard may go without an acknowledged write across a fault: two leases and
/// half a second, the failover target of docs/replication.md.
const FAILOVER_BOUND: Duration = Duration::from_millis(2 * LEASE_MS + 500);
/// The bound when the fault also took the control plane's leader (its raft term moved): the
/// survivors first elect one, which takes an election timeout (10 to 20 ticks of 100 ms, so at
/// most 2 s; docs/cluster.md), before any shard can move.
const METADATA_FAILOVER_BOUND: Duration = Duration::from_millis(2 * LEASE_MS + 500 + 2000);
/// Client tasks publishing at once; each starts on node `id % 3`.
const CLIENTS: u32 = 6;
/// Distinct routing keys the clients draw from.
const KEYS: u64 = 256;
/// Bound on one client call; a publish stuck behind a dead leader is given up and recorded
/// as unknown, and the client dials the next node. Short, so that the write gaps measure the
/// cluster's failover rather than how long a client waits (an ack takes milliseconds).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause before a client dials again after a failed connect.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// From `docker compose up` to every node ready.
const READY_LIMIT: Duration = Duration::from_secs(90);
/// A node back from a fault answers `/readyz` 200 within this.
const REJOIN_LIMIT: Duration = Duration::from_secs(30);
/// Every follower caught up within this once the node is ready.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(30);
/// A follower lacking at most this many records is caught up: the clients keep a few
/// publishes in flight all the time.
const CAUGHT_UP_RECORDS: u64 = 32;
/// Bound on finding a leader for every shard, and on reading every shard back.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// Load before the first fault, and quiet load between two faults.
const WARM_UP: Duration = Duration::from_secs(3);
const QUIET: Duration = Duration::from_secs(2);
/// A killed node stays down this long: past the failover bound, so its shards move.
const KILL_DOWN: Duration = Duration::from_secs(5);
/// A disconnected node stays off the network this long.
const CUT_HOLD: Duration = Duration::from_secs(8);
/// `docker restart`'s grace between SIGTERM and SIGKILL.
const STOP_GRACE_SECS: u32 = 15;
/// Bound on one `docker` command.
const DOCKER_TIMEOUT: Duration = Duration::from_secs(60);
/// At most this many kills and disconnects each (`--kills`, `--cuts`).
const MAX_FAULTS: u32 = 10;
/// Records the SDK publishes through the one seed before the load starts.
const SMOKE_RECORDS: u32 = 30;
/// The load stops on its own this long after it started, whatever happens to the faults.
const MAX_LOAD: Duration = Duration::from_secs(600);
/// Records per `stream_read` page.
const PAGE: u32 = 500;
/// Between two looks at a node's health or metrics, or at a `docker` command.
const POLL: Duration = Duration::from_millis(100);

struct Node {
    id: String,
    container: String,
    ip: IpAddr,
}

impl Node {
    fn client(&self) -> SocketAddr {
        SocketAddr::new(self.ip, CLIENT_PORT)
    }
    fn ops(&self) -> SocketAddr {
        SocketAddr::new(self.ip, OPS_PORT)
    }
}

struct Args {
    nodes: Vec<Node>,
    network: String,
    ca: PathBuf,
    token: PathBuf,
    kills: u32,
    cuts: u32,
    rolling: bool,
    /// Followers not caught up after a fault fail the run (otherwise they are reported).
    strict_liveness: bool,
    /// When `docker compose up` began (Unix ms), to report how long until every shard was led.
    since_unix_ms: Option<u64>,
}

const USAGE: &str =
    "usage: felix-deploy-check --node ID=CONTAINER=IP (three times) --network NAME \
    --ca PATH --token-file PATH [--kills N (default 3)] [--cuts N (default 2)] \
    [--no-rolling] [--strict-liveness] [--since-unix-ms MS]";

fn parse_args() -> Result<Args, String> {
    let mut nodes = Vec::new();
    let (mut network, mut ca, mut token) = (None, None, None);
    let (mut kills, mut cuts, mut rolling, mut since) = (3, 2, true, None);
    let mut strict_liveness = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--node" => {
                let v = value()?;
                let parts: Vec<&str> = v.split('=').collect();
                let [id, container, ip] = parts[..] else {
                    return Err(format!("--node {v:?}: expected ID=CONTAINER=IP"));
                };
                let ip = ip.parse().map_err(|e| format!("--node {v:?}: {e}"))?;
                nodes.push(Node {
                    id: id.into(),
                    container: container.into(),
                    ip,
                });
            }
            "--network" => network = Some(value()?),
            "--ca" => ca = Some(PathBuf::from(value()?)),
            "--token-file" => token = Some(PathBuf::from(value()?)),
            "--kills" | "--cuts" => {
                let v = value()?;
                let n: u32 = v.parse().map_err(|e| format!("{flag} {v:?}: {e}"))?;
                if n > MAX_FAULTS {
                    return Err(format!("{flag} {n}: at most {MAX_FAULTS}"));
                }
                if flag == "--kills" {
                    kills = n;
                } else {
                    cuts = n;
                }
            }
            "--no-rolling" => rolling = false,
            "--strict-liveness" => strict_liveness = true,
            "--since-unix-ms" => {
                let v = value()?;
                since = Some(
                    v.parse()
                        .map_err(|e| format!("--since-unix-ms {v:?}: {e}"))?,
                );
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    if nodes.len() != 3 {
        return Err(format!(
            "three --node arguments, not {}; {USAGE}",
            nodes.len()
        ));
    }
    let missing = |what: &str| format!("{what} is required; {USAGE}");
    Ok(Args {
        nodes,
        network: network.ok_or_else(|| missing("--network"))?,
        ca: ca.ok_or_else(|| missing("--ca"))?,
        token: token.ok_or_else(|| missing("--token-file"))?,
        kills,
        cuts,
        rolling,
        strict_liveness,
        since_unix_ms: since,
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("felix-deploy-check: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("felix-deploy-check: FAILED (see above)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("felix-deploy-check: the run could not be carried out: {e}");
            ExitCode::from(2)
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Credentials every client of the run uses.
#[derive(Clone)]
struct Creds {
    ca: String,
    token: String,
}

impl Creds {
    fn config(&self, addr: SocketAddr) -> ClientConfig {
        let mut config = ClientConfig::new(addr, self.ca.as_bytes().to_vec(), TENANT, &self.token);
        config.request_timeout = REQUEST_TIMEOUT;
        config.connect_timeout = CONNECT_TIMEOUT;
        config
    }

    /// The read-back's view of the cluster at `addrs`.
    fn reader(&self, addrs: &[SocketAddr]) -> Reader {
        Reader {
            addrs: addrs.to_vec(),
            ca: self.ca.clone(),
            tenant: TENANT.into(),
            token: self.token.clone(),
            namespace: NAMESPACE.into(),
            request_timeout: REQUEST_TIMEOUT,
            connect_timeout: CONNECT_TIMEOUT,
            pause: RECONNECT_PAUSE,
            page: PAGE,
        }
    }
}

/// One fault as made, with when it began and when its node was back and caught up (from
/// the load's start).
struct Fault {
    kind: Kind,
    node: String,
    from: Duration,
    to: Duration,
    /// Every copy had caught up when it began: only then does the failover bound apply (a
    /// shard one copy short may lose its quorum to the fault).
    judged: bool,
    /// The control plane's term before the fault and once it was over.
    terms: (u64, u64),
}

impl Fault {
    /// The bound its gap is held to: more when the control plane's leader moved too.
    fn bound(&self) -> Duration {
        if self.terms.1 > self.terms.0 {
            METADATA_FAILOVER_BOUND
        } else {
            FAILOVER_BOUND
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Kill,
    Disconnect,
    Restart,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Kill => "docker kill, then start",
            Kind::Disconnect => "network disconnect, then connect",
            Kind::Restart => "rolling restart (docker restart)",
        }
    }
}

fn run(args: &Args) -> Result<bool, String> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))
    };
    let creds = Creds {
        ca: read(&args.ca)?,
        token: read(&args.token)?.trim().to_owned(),
    };
    let nodes = &args.nodes;
    let started = Instant::now();
    for node in nodes {
        wait_ready(node, READY_LIMIT)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting tokio: {e}"))?;
    let addrs: Vec<SocketAddr> = nodes.iter().map(Node::client).collect();
    let reader = creds.reader(&addrs);
    let before = runtime.block_on(reader.owners_everywhere(&[STREAM], SHARDS, SETTLE_LIMIT))?;
    let ready_at = unix_ms();
    match args.since_unix_ms {
        Some(since) => println!(
            "figure cluster_led_s {:.2} (from `up` to every node ready and every shard led)",
            ready_at.saturating_sub(since) as f64 / 1000.0
        ),
        None => println!(
            "cluster ready {:.2} s after this check started",
            started.elapsed().as_secs_f64()
        ),
    }
    for (shard, ((node, _), generation)) in &before {
        println!("  {shard}: leader {node} generation {generation}");
    }

    // Our SDK through one seed: the seed forwards each keyed publish to its shard's leader.
    let mut ops = runtime.block_on(smoke(addrs[0], &creds))?;
    println!(
        "sdk: {SMOKE_RECORDS} keyed publishes through the one seed {} acknowledged",
        addrs[0]
    );

    let stop = Arc::new(AtomicBool::new(false));
    let load_start = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let task = Load {
                id,
                rng: 0x9e37_79b9_7f4a_7c15 ^ u64::from(id + 1).wrapping_mul(0x2545_f491_4f6c_dd1d),
                nodes: addrs.clone(),
                creds: creds.clone(),
                start: load_start,
                stop: stop.clone(),
            };
            runtime.spawn(task.run())
        })
        .collect();

    let faults = make_faults(args, &runtime, &creds, load_start);
    stop.store(true, Ordering::SeqCst);
    let mut acks: BTreeMap<u32, Vec<Duration>> = BTreeMap::new();
    for task in tasks {
        let (task_ops, task_acks) = runtime
            .block_on(task)
            .map_err(|e| format!("a client task failed: {e}"))?;
        ops.extend(task_ops);
        for (shard, at) in task_acks {
            acks.entry(shard).or_default().push(at);
        }
    }
    let (faults, liveness) = faults?;
    for times in acks.values_mut() {
        times.sort();
    }

    let named = runtime.block_on(reader.owners_everywhere(&[STREAM], SHARDS, SETTLE_LIMIT))?;
    let reads = runtime.block_on(reader.read_back(&named, SETTLE_LIMIT))?;
    let report = history::check(&ops, &reads, &Tolerance::default());
    print!("{report}");
    let lost = report
        .violations
        .iter()
        .filter(|v| v.kind() == "lost write")
        .count();
    println!(
        "figure records_acked {} records_lost {lost} (unknown outcome {}, of which in the log {})",
        report.stats.acked, report.stats.unknown, report.stats.unknown_visible
    );

    let mut clean = report.is_clean();
    for l in &liveness {
        println!("liveness: {l}");
    }
    if !liveness.is_empty() && args.strict_liveness {
        println!("felix-deploy-check: followers did not catch up (--strict-liveness)");
        clean = false;
    }
    let mut by_kind: BTreeMap<Kind, Vec<Duration>> = BTreeMap::new();
    for f in &faults {
        let (gap, shard) = worst_gap(&acks, f.from, f.to);
        let over = gap > f.bound();
        let verdict = match (over, f.judged) {
            (false, _) => "",
            (true, true) => " OVER THE BOUND",
            (true, false) => " (over the bound; not judged: a copy had not caught up before it)",
        };
        println!(
            "{} {}: at {:.2} s, back and caught up at {:.2} s; longest write gap {:.2} s on {} \
             (bound {:.1} s{}){}",
            f.kind.name(),
            f.node,
            f.from.as_secs_f64(),
            f.to.as_secs_f64(),
            gap.as_secs_f64(),
            ShardId::new(STREAM, shard),
            f.bound().as_secs_f64(),
            if f.terms.1 > f.terms.0 {
                format!(", control plane term {} -> {}", f.terms.0, f.terms.1)
            } else {
                String::new()
            },
            verdict
        );
        clean &= !(over && f.judged);
        by_kind.entry(f.kind).or_default().push(gap);
    }
    for (kind, mut gaps) in by_kind {
        gaps.sort();
        let key = match kind {
            Kind::Kill => "kill",
            Kind::Disconnect => "disconnect",
            Kind::Restart => "rolling_restart",
        };
        println!(
            "figure {key}_gap_s median {:.2} max {:.2} n {} (bound {:.1}, {:.1} if the control plane's leader moved)",
            median(&gaps).as_secs_f64(),
            gaps[gaps.len() - 1].as_secs_f64(),
            gaps.len(),
            FAILOVER_BOUND.as_secs_f64(),
            METADATA_FAILOVER_BOUND.as_secs_f64()
        );
    }
    Ok(clean)
}

/// The faults, one at a time, each over once its node is ready and caught up; and what did
/// not come back (a node not ready, followers not caught up within the limits).
fn make_faults(
    args: &Args,
    runtime: &tokio::runtime::Runtime,
    creds: &Creds,
    load_start: Instant,
) -> Result<(Vec<Fault>, Vec<String>), String> {
    let nodes = &args.nodes;
    let addrs: Vec<SocketAddr> = nodes.iter().map(Node::client).collect();
    let (mut faults, mut liveness) = (Vec::new(), Vec::new());
    // Whether every copy had caught up after the previous fault.
    let mut caught_up = true;
    let since = |at: Instant| at.duration_since(load_start);
    std::thread::sleep(WARM_UP);
    // The leader of shard `k` now: a kill or a cut there moves a leadership.
    let leader_of = |k: u32| -> Result<usize, String> {
        let owners = runtime.block_on(creds.reader(&addrs).owners_everywhere(
            &[STREAM],
            SHARDS,
            SETTLE_LIMIT,
        ))?;
        let ((id, _), _) = owners
            .get(&ShardId::new(STREAM, k % SHARDS))
            .ok_or("a shard without a leader")?;
        nodes
            .iter()
            .position(|n| &n.id == id)
            .ok_or_else(|| format!("leader {id:?} is none of the nodes"))
    };
    for k in 0..args.kills {
        let i = leader_of(k)?;
        let node = &nodes[i];
        let (from, judged, term) = (Instant::now(), caught_up, metadata_term(nodes));
        println!(
            "[{:>6.2}s] docker kill {} (leads {STREAM}/{})",
            since(from).as_secs_f64(),
            node.id,
            k % SHARDS
        );
        docker(&["kill", "--signal", "KILL", &node.container])?;
        std::thread::sleep(KILL_DOWN);
        docker(&["start", &node.container])?;
        caught_up = settle(nodes, i, &mut liveness);
        faults.push(Fault {
            kind: Kind::Kill,
            node: node.id.clone(),
            from: since(from),
            to: since(Instant::now()),
            judged,
            terms: (term, metadata_term(nodes)),
        });
        std::thread::sleep(QUIET);
    }
    for k in 0..args.cuts {
        let i = leader_of(k + 1)?;
        let node = &nodes[i];
        let (from, judged, term) = (Instant::now(), caught_up, metadata_term(nodes));
        println!(
            "[{:>6.2}s] docker network disconnect {} (leads {STREAM}/{})",
            since(from).as_secs_f64(),
            node.id,
            (k + 1) % SHARDS
        );
        docker(&[
            "network",
            "disconnect",
            "--force",
            &args.network,
            &node.container,
        ])?;
        std::thread::sleep(CUT_HOLD);
        docker(&[
            "network",
            "connect",
            "--ip",
            &node.ip.to_string(),
            &args.network,
            &node.container,
        ])?;
        caught_up = settle(nodes, i, &mut liveness);
        faults.push(Fault {
            kind: Kind::Disconnect,
            node: node.id.clone(),
            from: since(from),
            to: since(Instant::now()),
            judged,
            terms: (term, metadata_term(nodes)),
        });
        std::thread::sleep(QUIET);
    }
    if args.rolling {
        for (i, node) in nodes.iter().enumerate() {
            let (from, judged, term) = (Instant::now(), caught_up, metadata_term(nodes));
            println!(
                "[{:>6.2}s] docker restart {}",
                since(from).as_secs_f64(),
                node.id
            );
            docker(&[
                "restart",
                "--time",
                &STOP_GRACE_SECS.to_string(),
                &node.container,
            ])?;
            caught_up = settle(nodes, i, &mut liveness);
            faults.push(Fault {
                kind: Kind::Restart,
                node: node.id.clone(),
                from: since(from),
                to: since(Instant::now()),
                judged,
                terms: (term, metadata_term(nodes)),
            });
            std::thread::sleep(QUIET);
        }
    }
    Ok((faults, liveness))
}

/// Waits for node `i` to be back and caught up; if it is not, says so and notes it under
/// liveness, and the run goes on (the figures and the history check still come).
fn settle(nodes: &[Node], i: usize, liveness: &mut Vec<String>) -> bool {
    match back_and_caught_up(nodes, i) {
        Ok(()) => true,
        Err(e) => {
            println!("  NOT CAUGHT UP: {e}");
            liveness.push(e);
            false
        }
    }
}

/// The highest control-plane (raft) term any reachable node reports: it moves when the
/// control plane's leader changes.
fn metadata_term(nodes: &[Node]) -> u64 {
    nodes
        .iter()
        .filter_map(|n| http_get(n.ops(), "/metrics", true))
        .filter_map(|(_, text)| gauge(&text, "felix_broker_cluster_metadata_term"))
        .max()
        .unwrap_or(0)
}

/// An unlabelled gauge's value in a `/metrics` text.
fn gauge(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Node `i` answers `/readyz` 200 again, then every leader's followers are caught up.
fn back_and_caught_up(nodes: &[Node], i: usize) -> Result<(), String> {
    wait_ready(&nodes[i], REJOIN_LIMIT)?;
    let deadline = Instant::now() + CATCH_UP_LIMIT;
    loop {
        let lags = lags(nodes);
        if let Ok(lags) = &lags {
            let covered = lags.keys().filter(|s| is_stream_shard(s)).count();
            if covered >= SHARDS as usize && lags.values().all(|&n| n <= CAUGHT_UP_RECORDS) {
                println!(
                    "  {} back; every follower within {CAUGHT_UP_RECORDS} records",
                    nodes[i].id
                );
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{}: the followers did not catch up within {CATCH_UP_LIMIT:?}: {lags:?}",
                nodes[i].id
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// `felix_broker_replication_lag_records` of every shard led anywhere, by shard label.
fn lags(nodes: &[Node]) -> Result<BTreeMap<String, u64>, String> {
    let mut out = BTreeMap::new();
    for node in nodes {
        let (status, text) = http_get(node.ops(), "/metrics", true)
            .ok_or_else(|| format!("{}: no /metrics answer", node.id))?;
        if status != 200 {
            return Err(format!("{}: /metrics answered {status}", node.id));
        }
        out.extend(parse_lags(&text));
    }
    Ok(out)
}

/// A lag label of one of the stream's shards (not its groups log: `…#0/groups`).
fn is_stream_shard(label: &str) -> bool {
    label
        .strip_prefix(&format!("{TENANT}/{NAMESPACE}/{STREAM}#"))
        .is_some_and(|n| n.parse::<u32>().is_ok())
}

/// The lag gauges of one `/metrics` text: `…_replication_lag_records{shard="S"} N`.
fn parse_lags(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("felix_broker_replication_lag_records{shard=\"")?;
            let (shard, value) = rest.split_once("\"} ")?;
            Some((shard.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

fn wait_ready(node: &Node, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if http_get(node.ops(), "/readyz", false).map(|(s, _)| s) == Some(200) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} ({}) did not answer /readyz 200 within {limit:?}",
                node.id,
                node.ops()
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// Runs `docker ARGS…`, bounded by [`DOCKER_TIMEOUT`].
fn docker(args: &[&str]) -> Result<(), String> {
    let what = format!("docker {}", args.join(" "));
    let mut child = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    let deadline = Instant::now() + DOCKER_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return Err(format!("{what}: {status}: {}", err.trim()));
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what}: no answer within {DOCKER_TIMEOUT:?}"));
            }
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
}

/// The longest time any shard went without an acknowledged write within `[from, to]`, and
/// that shard: from `from` to its first ack, between two acks, from its last ack to `to`.
fn worst_gap(acks: &BTreeMap<u32, Vec<Duration>>, from: Duration, to: Duration) -> (Duration, u32) {
    (0..SHARDS)
        .map(|shard| {
            let times = acks.get(&shard).map(Vec::as_slice).unwrap_or_default();
            (longest_gap(times, from, to), shard)
        })
        .max()
        .unwrap_or_default()
}

/// The median of sorted, non-empty `xs` (the mean of the middle two when even).
fn median(xs: &[Duration]) -> Duration {
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2
    }
}

/// `times` sorted.
fn longest_gap(times: &[Duration], from: Duration, to: Duration) -> Duration {
    let mut last = from;
    let mut longest = Duration::ZERO;
    for &t in times.iter().filter(|&&t| t > from && t <= to) {
        longest = longest.max(t - last);
        last = t;
    }
    longest.max(to.saturating_sub(last))
}

/// splitmix64, for keys: the same on every machine.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn shard_of(key: &str) -> u32 {
    shard_for_key(Some(key.as_bytes()), SHARDS, RoutingMapping::Modulo)
}

/// [`SMOKE_RECORDS`] keyed publishes through `seed` alone, every one acknowledged.
async fn smoke(seed: SocketAddr, creds: &Creds) -> Result<Vec<Op>, String> {
    const SMOKE_CLIENT: u32 = 1000;
    let client = Client::connect(creds.config(seed))
        .await
        .map_err(|e| format!("sdk: connecting to the seed {seed}: {e}"))?;
    let mut ops = Vec::new();
    for n in 0..SMOKE_RECORDS {
        let key = format!("smoke-{n}");
        let payload = Bytes::from(format!("sdk-smoke-{n}"));
        let answer = client
            .publish(
                NAMESPACE,
                STREAM,
                vec![payload.clone()],
                Some(Bytes::from(key.clone())),
                Ack::PerMessage,
            )
            .await;
        match answer {
            Ok(Some(offset)) => ops.push(Op::Acked {
                client: SMOKE_CLIENT,
                shard: ShardId::new(STREAM, shard_of(&key)),
                offset,
                payload,
            }),
            other => return Err(format!("sdk: publish {n} through {seed}: {other:?}")),
        }
    }
    client.close().await;
    Ok(ops)
}

/// One publishing client: acked keyed publishes of one record each, one at a time, until
/// told to stop. After any error it drops the connection and dials the next node.
struct Load {
    id: u32,
    rng: u64,
    nodes: Vec<SocketAddr>,
    creds: Creds,
    start: Instant,
    stop: Arc<AtomicBool>,
}

impl Load {
    /// What the client was told, and when (from the load's start) each shard acked.
    async fn run(mut self) -> (Vec<Op>, Vec<(u32, Duration)>) {
        let (mut ops, mut acks) = (Vec::new(), Vec::new());
        let mut client: Option<Client> = None;
        let mut dial = self.id as usize;
        let mut seq = 0u64;
        while !self.stop.load(Ordering::SeqCst) && self.start.elapsed() < MAX_LOAD {
            let Some(conn) = &client else {
                let addr = self.nodes[dial % self.nodes.len()];
                dial += 1;
                match Client::connect(self.creds.config(addr)).await {
                    Ok(conn) => client = Some(conn),
                    Err(_) => tokio::time::sleep(RECONNECT_PAUSE).await,
                }
                continue;
            };
            seq += 1;
            let key = format!("key-{}", next(&mut self.rng) % KEYS);
            let shard = shard_of(&key);
            let payload = Bytes::from(format!("c{}-{seq}", self.id));
            let answer = conn
                .publish(
                    NAMESPACE,
                    STREAM,
                    vec![payload.clone()],
                    Some(Bytes::from(key)),
                    Ack::PerMessage,
                )
                .await;
            let client_id = self.id;
            ops.push(match answer {
                Ok(Some(offset)) => {
                    acks.push((shard, self.start.elapsed()));
                    Op::Acked {
                        client: client_id,
                        shard: ShardId::new(STREAM, shard),
                        offset,
                        payload,
                    }
                }
                Ok(None) => Op::Unknown {
                    client: client_id,
                    payload,
                },
                Err(e) => {
                    client = None;
                    if not_applied(&e) {
                        Op::Failed {
                            client: client_id,
                            payload,
                        }
                    } else {
                        Op::Unknown {
                            client: client_id,
                            payload,
                        }
                    }
                }
            });
        }
        if let Some(conn) = client {
            conn.close().await;
        }
        (ops, acks)
    }
}

/// A refusal whose class says nothing was applied.
fn not_applied(e: &ClientError) -> bool {
    matches!(
        e.retry(),
        Some(RetryClass::Retry | RetryClass::RetryAfter | RetryClass::Redirect)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn a_gap_runs_from_the_fault_between_acks_and_to_the_end() {
        let times = [s(100), s(900), s(1000), s(3500), s(3600)];
        // From the fault at 950 to the ack at 1000, then 1000 → 3500.
        assert_eq!(longest_gap(&times, s(950), s(4000)), s(2500));
        // No ack in the window at all: the whole window.
        assert_eq!(longest_gap(&times, s(1000), s(3000)), s(2000));
        // The tail after the last ack counts.
        assert_eq!(longest_gap(&times, s(3500), s(9000)), s(5400));
        assert_eq!(longest_gap(&[], s(0), s(10)), s(10));
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[s(1), s(5), s(9)]), s(5));
        assert_eq!(median(&[s(2), s(4)]), s(3));
        assert_eq!(median(&[s(7)]), s(7));
    }

    #[test]
    fn the_worst_shard_is_named() {
        let mut acks = BTreeMap::new();
        acks.insert(0, vec![s(10), s(20), s(30)]);
        acks.insert(1, vec![s(10), s(25)]);
        acks.insert(2, vec![s(5), s(15), s(26), s(30)]);
        assert_eq!(worst_gap(&acks, s(0), s(30)), (s(15), 1));
        // A shard never acked is gap-long everywhere.
        acks.remove(&2);
        assert_eq!(worst_gap(&acks, s(0), s(30)), (s(30), 2));
    }

    #[test]
    fn lag_gauges_are_read_by_shard() {
        let text = "# HELP x\n\
                    felix_broker_replication_lag_records{shard=\"t1/deploy/orders#0\"} 3\n\
                    felix_broker_replication_lag_records{shard=\"t1/deploy/orders#2\"} 0\n\
                    felix_broker_replication_leader_changes_total 4\n";
        assert_eq!(
            parse_lags(text),
            vec![
                ("t1/deploy/orders#0".to_owned(), 3),
                ("t1/deploy/orders#2".to_owned(), 0)
            ]
        );
        assert!(is_stream_shard("t1/deploy/orders#2"));
        assert!(!is_stream_shard("t1/deploy/orders#2/groups"));
        assert!(!is_stream_shard("t1/deploy/events#2"));
        let text = "felix_broker_cluster_metadata_term 7\nfelix_broker_cluster_metadata_termx 9\n";
        assert_eq!(gauge(text, "felix_broker_cluster_metadata_term"), Some(7));
        assert_eq!(gauge(text, "felix_broker_ready"), None);
    }
}
