//! `felix-chaos`: a chaos run against a real 3-node `felix-broker` cluster
//! (docs/replication.md, "Chaos test").
//!
//! Clients publish acked, keyed records with unique payloads to a `quorum` and a `leader`
//! stream while a nemesis driven by the seed kills a node and restarts it, stops one for two
//! leases, or cuts one direction of one peer link. Then everything heals, every shard is read
//! back from its leader in full, and the history checker (`felix_testkit::history`) judges
//! what the clients were told against what the shards hold. Exit 0 clean, 1 on a violation,
//! 2 when the run itself could not be carried out.
//!
//! A shard whose leader is down refuses or times out, and those publishes are recorded as
//! failed or unknown. Kills land on any node, so on `leader`-stream leaders too: such a shard
//! waits for its leader (or passes to a follower recorded level with it), so nothing it
//! acknowledged may be lost. Only with `--wipe-on-kill`, where a killed leader comes back on
//! an empty disk, may a `leader` shard whose generation moved lose acknowledged records (the
//! spec's one allowed loss); those are reported as tolerated. Every other check holds
//! either way.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use felix_client::{Ack, Client, ClientConfig, ClientError, RetryClass};
use felix_proto::routing::{shard_for_key, RoutingMapping};
use felix_testkit::history::{self, Op, ShardId, Tolerance};
use felix_testkit::{Direction, Rule};

use felix_chaos::cluster::{
    Cluster, LEASE, NAMESPACE, NODES, READY_LIMIT, SHARDS, STREAMS, TENANT,
};
use felix_chaos::readback::Reader;

/// `--duration-secs` at most: the run is meant for a test suite.
const MAX_DURATION: u64 = 600;
const DEFAULT_DURATION: u64 = 60;
/// Client tasks publishing at once.
const CLIENTS: u32 = 4;
/// Distinct routing keys the clients draw from.
const KEYS: u64 = 256;
/// Bound on one client call (below the broker's 10 s forward timeout, so a publish stuck
/// behind a dead leader is given up by the client first and recorded as unknown).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause before a client dials again after a failed connect.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// Bound on the heal phase: every shard named with a leader and read back.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// How long a node may take to answer `/readyz` 200 after a restart or the final heal (a
/// node rejoins within two leases when all is well). Past it the run goes on and reports
/// the node under "liveness"; with `--strict-liveness` that fails the run.
const REJOIN_LIMIT: Duration = Duration::from_secs(20);
/// Report lines printed in full; past it, a count per kind.
const MAX_PRINTED: usize = 60;
/// Records per `stream_read` page.
const PAGE: u32 = 500;
/// How long a killed node stays down before its restart, at most.
const MAX_DOWN: Duration = Duration::from_millis(2000);
/// A cut lasts between these.
const CUT_MIN: Duration = Duration::from_millis(2000);
const CUT_MAX: Duration = Duration::from_millis(5000);
/// Quiet time between two faults, at most.
const MAX_GAP: Duration = Duration::from_millis(1500);
/// The datagram size a "drop large" cut keeps to: QUIC's minimum, so handshakes and small
/// packets pass while anything a path-MTU probe or a full packet carries is lost.
const SMALL_DATAGRAM: usize = 1200;

/// splitmix64: small, seedable, the same on every machine.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn duration(&mut self, min: Duration, max: Duration) -> Duration {
        let span = (max - min).as_millis() as u64;
        min + Duration::from_millis(self.below(span + 1))
    }
}

struct Args {
    seed: u64,
    duration: Duration,
    broker: PathBuf,
    strict_liveness: bool,
    /// Each killed node restarts with its data directory emptied: a lost drive, which its
    /// copies survive by being rebuilt from their leaders (docs/replication.md).
    wipe_on_kill: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut seed = None;
    let mut duration = DEFAULT_DURATION;
    let mut broker = PathBuf::from("target/release/felix-broker");
    let mut strict_liveness = false;
    let mut wipe_on_kill = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--seed" => {
                let v = value()?;
                seed = Some(v.parse().map_err(|e| format!("--seed {v:?}: {e}"))?);
            }
            "--duration-secs" => {
                let v = value()?;
                duration = v.parse().map_err(|e| format!("--duration-secs {v:?}: {e}"))?;
                if !(1..=MAX_DURATION).contains(&duration) {
                    return Err(format!("--duration-secs {duration}: 1 to {MAX_DURATION}"));
                }
            }
            "--broker-bin" => broker = PathBuf::from(value()?),
            "--strict-liveness" => strict_liveness = true,
            "--wipe-on-kill" => wipe_on_kill = true,
            "-h" | "--help" => {
                return Err("usage: felix-chaos [--seed N] [--duration-secs S (default 60, at most 600)] \
                            [--broker-bin PATH (default target/release/felix-broker)] \
                            [--strict-liveness (a node not ready again after a fault fails the run)] \
                            [--wipe-on-kill (killed nodes come back on an empty disk, rebuilt from the leaders)]"
                    .into())
            }
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    if !broker.is_file() {
        return Err(format!("--broker-bin {}: no such file", broker.display()));
    }
    let seed = seed.unwrap_or_else(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng(nanos ^ u64::from(std::process::id())).next()
    });
    Ok(Args {
        seed,
        duration: Duration::from_secs(duration),
        broker,
        strict_liveness,
        wipe_on_kill,
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("felix-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "felix-chaos: seed {} duration {}s broker {}",
        args.seed,
        args.duration.as_secs(),
        args.broker.display()
    );
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("felix-chaos: VIOLATION; repeat with --seed {}", args.seed);
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("felix-chaos: the run failed (seed {}): {e}", args.seed);
            ExitCode::from(2)
        }
    }
}

/// The fault log, printed as each is injected and again at the end.
struct Schedule {
    start: Instant,
    lines: Vec<String>,
    /// Nodes that did not answer `/readyz` 200 within [`REJOIN_LIMIT`], with the evidence.
    unready: Vec<String>,
}

impl Schedule {
    fn note(&mut self, what: String) {
        let line = format!("[{:>7.3}s] {what}", self.start.elapsed().as_secs_f64());
        println!("{line}");
        self.lines.push(line);
    }

    fn unready(&mut self, what: String) {
        let first = what.lines().next().unwrap_or_default().to_owned();
        self.note(format!("NOT READY: {first}"));
        self.unready.push(format!(
            "[{:>7.3}s] {what}",
            self.start.elapsed().as_secs_f64()
        ));
    }
}

fn run(args: &Args) -> Result<bool, String> {
    let mut c = Cluster::lay_out(&args.broker)?;
    println!("felix-chaos: files and logs in {}", c.dir.display());
    for i in 0..NODES.len() {
        c.start(i)?;
    }
    for i in 0..NODES.len() {
        c.wait_ready(i, READY_LIMIT)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting tokio: {e}"))?;
    let addrs: Vec<SocketAddr> = c.nodes.iter().map(|n| n.client).collect();
    let (ca, token) = (c.ca_pem.clone(), c.token.clone());
    let reader = Reader {
        addrs: addrs.clone(),
        ca: ca.clone(),
        tenant: TENANT.into(),
        token: token.clone(),
        namespace: NAMESPACE.into(),
        request_timeout: REQUEST_TIMEOUT,
        connect_timeout: CONNECT_TIMEOUT,
        pause: RECONNECT_PAUSE,
        page: PAGE,
    };
    let owners = |limit| runtime.block_on(reader.owners_everywhere(&STREAMS, SHARDS, limit));
    let before = owners(SETTLE_LIMIT)?;

    let mut schedule = Schedule {
        start: Instant::now(),
        lines: Vec::new(),
        unready: Vec::new(),
    };
    let deadline = Instant::now() + args.duration;
    let mut plan = Plan::new(args.seed);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let task = ClientTask {
                id,
                rng: Rng(args.seed ^ (u64::from(id) + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)),
                nodes: addrs.clone(),
                ca: ca.clone(),
                token: token.clone(),
                deadline,
            };
            runtime.spawn(task.run())
        })
        .collect();

    let faults = nemesis(
        &mut c,
        &mut plan,
        &mut schedule,
        deadline,
        args.wipe_on_kill,
    );

    let mut ops = Vec::new();
    for handle in clients {
        ops.extend(
            runtime
                .block_on(handle)
                .map_err(|e| format!("a client task failed: {e}"))?,
        );
    }
    faults?;

    // Heal: every relay passes, every node runs and is ready, every shard answers a read.
    schedule.note("heal: every link passes, every node running".into());
    c.heal_all();
    let exited = c.exited();
    if !exited.is_empty() {
        return Err(format!("nodes died by themselves: {}", exited.join(", ")));
    }
    for i in 0..NODES.len() {
        if let Err(e) = c.wait_ready(i, REJOIN_LIMIT) {
            schedule.unready(format!("after the heal: {e}\n{}", c.diagnose()));
        }
    }
    let named = owners(SETTLE_LIMIT)?;
    let reads = runtime.block_on(reader.read_back(&named, SETTLE_LIMIT))?;
    // Asked again once read: a leadership that moved after `named` counts as moved.
    let after = owners(SETTLE_LIMIT)?;
    for (shard, (_, generation)) in &after {
        if named.get(shard).map(|(_, g)| *g) != Some(*generation) {
            schedule.note(format!(
                "{shard} changed leader during the read-back (generation {generation})"
            ));
        }
    }
    schedule.note(format!("read back {} shards", reads.len()));

    // Only a lost disk may lose what a `leader` shard's leader alone held.
    let mut tolerance = Tolerance::default();
    for (shard, (_, generation)) in &after {
        let moved = before.get(shard).map(|(_, g)| *g) != Some(*generation);
        if args.wipe_on_kill && shard.stream == "leader" && moved {
            tolerance.loss_allowed.insert(shard.clone());
        }
    }
    let report = history::check(&ops, &reads, &tolerance);

    println!("felix-chaos: seed {}", args.seed);
    println!("fault schedule:");
    for line in &schedule.lines {
        println!("  {line}");
    }
    println!("shards after the heal:");
    for (shard, ((node, _), generation)) in &after {
        let was = before.get(shard).map(|(_, g)| *g);
        println!("  {shard}: leader {node} generation {generation} (at start {was:?})");
    }
    // The report whole, unless it is long: then the first violations and a count per kind.
    if report.violations.len() + report.tolerated.len() <= MAX_PRINTED {
        print!("{report}");
    } else {
        let text = report.to_string();
        let lines: Vec<&str> = text.lines().collect();
        for line in &lines[..MAX_PRINTED] {
            println!("{line}");
        }
        println!("… {} lines more", lines.len() - MAX_PRINTED);
        let mut per_kind = std::collections::BTreeMap::<&str, usize>::new();
        for v in &report.violations {
            *per_kind.entry(v.kind()).or_default() += 1;
        }
        for (kind, n) in per_kind {
            println!("violations of kind {kind}: {n}");
        }
        println!("verdict: {} violations", report.violations.len());
    }
    if report.stats.failed_visible > 0 {
        println!(
            "note: {} publishes refused as not applied are in the log anyway",
            report.stats.failed_visible
        );
    }
    let mut clean = report.is_clean();
    if schedule.unready.is_empty() {
        println!("liveness: every node was ready again within {REJOIN_LIMIT:?} of each restart and of the heal");
    } else {
        for u in &schedule.unready {
            println!("liveness: {u}");
        }
        if args.strict_liveness {
            println!("felix-chaos: a node did not rejoin (--strict-liveness)");
            clean = false;
        }
    }
    c.stop_all();
    if clean {
        let _ = std::fs::remove_dir_all(&c.dir);
    } else {
        println!("felix-chaos: logs kept in {}", c.dir.display());
    }
    Ok(clean)
}

/// One fault, after a quiet `gap`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fault {
    /// SIGKILL, down for `down`, restart on the same ports and data directory.
    Kill { node: usize, down: Duration },
    /// SIGSTOP for two leases, then SIGCONT.
    Stop { node: usize },
    /// One direction of the link `from` dials to reach `to`, for `hold`.
    Cut {
        from: usize,
        to: usize,
        dir: Direction,
        rule: Rule,
        hold: Duration,
    },
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Kill { node, down } => write!(f, "SIGKILL {}, down {down:?}", NODES[*node]),
            Fault::Stop { node } => write!(f, "SIGSTOP {} for {:?}", NODES[*node], 2 * LEASE),
            Fault::Cut {
                from,
                to,
                dir,
                rule,
                hold,
            } => {
                let (a, b) = (NODES[*from], NODES[*to]);
                let way = match dir {
                    Direction::Forward => format!("{a}->{b}"),
                    Direction::Backward => format!("{b}->{a} answers"),
                };
                write!(f, "cut link {a} dials {b}: {way} {rule:?} for {hold:?}")
            }
        }
    }
}

/// The faults of a run, a pure function of the seed: kinds in rotation, targets and timings
/// drawn. Each comes with the quiet time before it.
struct Plan {
    rng: Rng,
    round: u64,
}

impl Plan {
    fn new(seed: u64) -> Plan {
        Plan {
            rng: Rng(seed),
            round: 0,
        }
    }

    fn next(&mut self) -> (Duration, Fault) {
        let rng = &mut self.rng;
        let gap = rng.duration(Duration::ZERO, MAX_GAP);
        let node = rng.below(NODES.len() as u64) as usize;
        let fault = match self.round % 3 {
            0 => Fault::Kill {
                node,
                down: rng.duration(Duration::ZERO, MAX_DOWN),
            },
            1 => Fault::Stop { node },
            _ => {
                let mut to = rng.below(NODES.len() as u64 - 1) as usize;
                if to >= node {
                    to += 1;
                }
                let dir = if rng.below(2) == 0 {
                    Direction::Forward
                } else {
                    Direction::Backward
                };
                let rule = if rng.below(3) == 0 {
                    Rule::DropAbove(SMALL_DATAGRAM)
                } else {
                    Rule::DropAll
                };
                Fault::Cut {
                    from: node,
                    to,
                    dir,
                    rule,
                    hold: rng.duration(CUT_MIN, CUT_MAX),
                }
            }
        };
        self.round += 1;
        (gap, fault)
    }
}

/// Injects the plan's faults one at a time, each healed before the next, until `deadline`.
fn nemesis(
    c: &mut Cluster,
    plan: &mut Plan,
    schedule: &mut Schedule,
    deadline: Instant,
    wipe_on_kill: bool,
) -> Result<(), String> {
    let sleep_until = |until: Instant| {
        let now = Instant::now();
        if until > now {
            std::thread::sleep(until - now);
        }
    };
    loop {
        let (gap, fault) = plan.next();
        sleep_until((Instant::now() + gap).min(deadline));
        if Instant::now() >= deadline {
            return Ok(());
        }
        match fault {
            Fault::Kill { node, down } => {
                schedule.note(format!("{fault} (pid {:?})", c.pid(node)));
                c.kill(node)?;
                if wipe_on_kill {
                    c.wipe(node)?;
                    schedule.note(format!("wiped {}'s data directory", NODES[node]));
                }
                sleep_until(Instant::now() + down);
                let pid = c.start(node)?;
                let id = NODES[node];
                schedule.note(format!(
                    "restart {id} (pid {pid}) on its ports and data dir"
                ));
                match c.wait_ready(node, REJOIN_LIMIT) {
                    Ok(()) => schedule.note(format!("{id} ready")),
                    Err(e) => schedule.unready(format!("after its restart: {e}\n{}", c.diagnose())),
                }
            }
            Fault::Stop { node } => {
                schedule.note(format!("{fault} (pid {:?})", c.pid(node)));
                c.signal(node, libc::SIGSTOP)?;
                sleep_until(Instant::now() + 2 * LEASE);
                c.signal(node, libc::SIGCONT)?;
                schedule.note(format!("SIGCONT {}", NODES[node]));
            }
            Fault::Cut {
                from,
                to,
                dir,
                rule,
                hold,
            } => {
                schedule.note(fault.to_string());
                let relay = c.relays[from][to]
                    .as_ref()
                    .expect("a relay off the diagonal");
                relay.set(dir, rule);
                sleep_until(Instant::now() + hold);
                relay.heal();
                schedule.note(format!("heal link {} dials {}", NODES[from], NODES[to]));
            }
        }
    }
}

struct ClientTask {
    id: u32,
    rng: Rng,
    nodes: Vec<SocketAddr>,
    ca: String,
    token: String,
    deadline: Instant,
}

impl ClientTask {
    /// Acked keyed publishes of one record each, one at a time, until the deadline, through
    /// the SDK's cluster client: seeded with every node (each task starting from another),
    /// it routes each record to its shard's owner, retries what was refused as not applied,
    /// and fails over by itself; a record whose outcome it cannot know is reported so and
    /// never re-sent, which is what the history check needs.
    async fn run(mut self) -> Vec<Op> {
        let mut ops = Vec::new();
        let n = self.nodes.len();
        let seeds: Vec<SocketAddr> = (0..n)
            .map(|i| self.nodes[(self.id as usize + i) % n])
            .collect();
        let mut config =
            ClientConfig::with_seeds(seeds, self.ca.as_bytes().to_vec(), TENANT, &self.token);
        config.request_timeout = REQUEST_TIMEOUT;
        config.connect_timeout = CONNECT_TIMEOUT;
        config.jitter_seed = self.rng.next();
        let client = loop {
            if Instant::now() >= self.deadline {
                return ops;
            }
            match Client::connect(config.clone()).await {
                Ok(client) => break client,
                // Every node down at once: try again shortly.
                Err(_) => tokio::time::sleep(RECONNECT_PAUSE).await,
            }
        };
        let mut seq = 0u64;
        while Instant::now() < self.deadline {
            seq += 1;
            let stream = STREAMS[self.rng.below(STREAMS.len() as u64) as usize];
            let key = format!("key-{}", self.rng.below(KEYS));
            let payload = Bytes::from(format!("c{}-{seq}", self.id));
            let shard = shard_for_key(Some(key.as_bytes()), SHARDS, RoutingMapping::Modulo);
            let answer = client
                .publish(
                    NAMESPACE,
                    stream,
                    vec![payload.clone()],
                    Some(Bytes::from(key)),
                    Ack::PerMessage,
                )
                .await;
            let client_id = self.id;
            ops.push(match answer {
                Ok(Some(offset)) => Op::Acked {
                    client: client_id,
                    shard: ShardId::new(stream, shard),
                    offset,
                    payload,
                },
                Ok(None) => Op::Unknown {
                    client: client_id,
                    payload,
                },
                Err(e) if not_applied(&e) => Op::Failed {
                    client: client_id,
                    payload,
                },
                Err(_) => Op::Unknown {
                    client: client_id,
                    payload,
                },
            });
        }
        client.close().await;
        ops
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

    fn first(seed: u64, n: usize) -> Vec<String> {
        let mut plan = Plan::new(seed);
        (0..n)
            .map(|_| {
                let (gap, fault) = plan.next();
                format!("+{gap:?} {fault}")
            })
            .collect()
    }

    #[test]
    fn a_seed_fixes_the_fault_plan_and_kinds_rotate() {
        assert_eq!(first(7, 12), first(7, 12), "the same seed, the same plan");
        assert_ne!(first(7, 12), first(8, 12));
        let mut plan = Plan::new(7);
        for round in 0..300 {
            let (gap, fault) = plan.next();
            assert!(gap <= MAX_GAP);
            match (round % 3, fault) {
                (0, Fault::Kill { down, .. }) => assert!(down <= MAX_DOWN),
                (1, Fault::Stop { .. }) => {}
                (2, Fault::Cut { from, to, hold, .. }) => {
                    assert_ne!(from, to, "a link joins two nodes");
                    assert!((CUT_MIN..=CUT_MAX).contains(&hold));
                }
                (r, f) => panic!("round {r}: {f:?} out of rotation"),
            }
        }
    }
}
