//! `felix-client-failover`: how long a killed leader's shard goes without an acknowledgement,
//! seen through our cluster client and through the real Python client (PyPI
//! `felix-client`, `chaos/scripts/failover_probe.py`), on the same cluster and the same kills.
//!
//! Three `felix-broker` processes (felix-chaos's layout: durable, fsync on commit, 1 s lease,
//! one 3-shard quorum stream on every node). Each round both clients publish keyed records
//! to shard 0 one after another; once both have acknowledgements, shard 0's leader is
//! SIGKILLed; after `--window-secs` the clients stop, the longest time each went without an
//! acknowledgement across the kill is taken, and the node is restarted for the next round.
//!
//! ```text
//! cargo run --release -p felix-chaos --bin felix-client-failover -- --kills 5
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use felix_chaos::cluster::{Cluster, Layout, StreamDecl, LEASE, NAMESPACE, READY_LIMIT, TENANT};
use felix_client::{Client, ClientConfig, RetryPolicy};
use felix_proto::routing::{shard_for_key, RoutingMapping};

const STREAM: &str = "orders";
const SHARDS: u32 = 3;
/// Acknowledgements each client must have before the kill.
const WARM_ACKS: usize = 20;
/// Bound on the warm-up of one round.
const WARM_LIMIT: Duration = Duration::from_secs(60);
/// Rounds at most.
const MAX_KILLS: u32 = 50;

struct Args {
    broker: PathBuf,
    python: String,
    kills: u32,
    window: Duration,
    /// Our client's `idle_timeout` (its failure detection bound).
    idle: Option<Duration>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        broker: PathBuf::from("target/release/felix-broker"),
        python: "python3".into(),
        kills: 5,
        window: Duration::from_secs(12),
        idle: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--broker-bin" => args.broker = PathBuf::from(value()?),
            "--python" => args.python = value()?,
            "--kills" => {
                let v = value()?;
                args.kills = v.parse().map_err(|e| format!("--kills {v:?}: {e}"))?;
                if !(1..=MAX_KILLS).contains(&args.kills) {
                    return Err(format!("--kills: 1 to {MAX_KILLS}"));
                }
            }
            "--window-secs" => {
                let v = value()?;
                let secs: u64 = v.parse().map_err(|e| format!("--window-secs {v:?}: {e}"))?;
                if !(1..=120).contains(&secs) {
                    return Err("--window-secs: 1 to 120".into());
                }
                args.window = Duration::from_secs(secs);
            }
            "--idle-ms" => {
                let v = value()?;
                let ms: u64 = v.parse().map_err(|e| format!("--idle-ms {v:?}: {e}"))?;
                if !(100..=60_000).contains(&ms) {
                    return Err("--idle-ms: 100 to 60000".into());
                }
                args.idle = Some(Duration::from_millis(ms));
            }
            "-h" | "--help" => {
                return Err("usage: felix-client-failover [--kills N (default 5)] \
                            [--window-secs S (after each kill, default 12)] \
                            [--broker-bin PATH (default target/release/felix-broker)] \
                            [--python PATH (default python3, with felix-client installed)] \
                            [--idle-ms MS (our client's idle timeout; default its own, 2000)]"
                    .into())
            }
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    if !args.broker.is_file() {
        return Err(format!(
            "--broker-bin {}: no such file",
            args.broker.display()
        ));
    }
    Ok(args)
}

fn unix_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The longest time between consecutive acknowledgements, from the last one at or before
/// the kill on; `None` when none came after it.
fn gap(acks: &[u128], kill: u128) -> Option<Duration> {
    let mut acks = acks.to_vec();
    acks.sort_unstable();
    let from = acks.iter().rposition(|t| *t <= kill)?;
    if from + 1 >= acks.len() {
        return None;
    }
    acks[from..]
        .windows(2)
        .map(|w| Duration::from_nanos((w[1] - w[0]) as u64))
        .max()
}

fn main() -> std::process::ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("felix-client-failover: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let layout = Layout {
        cluster: true,
        streams: vec![StreamDecl {
            name: STREAM,
            shards: SHARDS,
            replication_factor: 3,
            consistency: "quorum",
        }],
        fsync_mode: "on_commit".into(),
        lease: LEASE,
        relays: false,
        prefix: "felix-client-failover",
    };
    let mut cluster = Cluster::lay_out_with(&args.broker, &layout)?;
    for i in 0..3 {
        cluster.start(i)?;
    }
    for i in 0..3 {
        cluster.wait_ready(i, READY_LIMIT)?;
    }
    let seeds: Vec<SocketAddr> = cluster.nodes.iter().map(|n| n.client).collect();
    let key = (0..10_000)
        .map(|i| format!("key-{i}"))
        .find(|k| shard_for_key(Some(k.as_bytes()), SHARDS, RoutingMapping::Modulo) == 0)
        .expect("a key for shard 0");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut config = ClientConfig::with_seeds(
        seeds.clone(),
        cluster.ca_pem.as_bytes().to_vec(),
        TENANT,
        &cluster.token,
    );
    config.request_timeout = Duration::from_secs(10);
    if let Some(idle) = args.idle {
        config.idle_timeout = idle;
    }
    config.retry = RetryPolicy {
        max_attempts: 10_000,
        deadline: Some(Duration::from_secs(60)),
        ..RetryPolicy::default()
    };
    let ca_file = cluster.dir.join("ca.pem");
    println!(
        "felix-client-failover: {} kills of shard 0's leader, lease {LEASE:?}, our client's idle \
         timeout {:?}",
        args.kills, config.idle_timeout
    );
    println!("round  victim  ours          python");
    let (mut ours_all, mut python_all) = (Vec::new(), Vec::new());
    for round in 1..=args.kills {
        // Who leads shard 0 now (placing the stream on the first round).
        let victim = rt.block_on(async {
            let client = Client::connect(config.clone())
                .await
                .map_err(|e| e.to_string())?;
            client
                .publish_at_least_once(
                    NAMESPACE,
                    STREAM,
                    vec![Bytes::from_static(b"probe")],
                    Some(Bytes::from(key.clone())),
                )
                .await
                .map_err(|e| e.to_string())?;
            let owners = client
                .shard_owners(NAMESPACE, STREAM)
                .await
                .map_err(|e| e.to_string())?;
            client.close().await;
            let leader = owners
                .first()
                .copied()
                .flatten()
                .ok_or("shard 0 has no leader")?;
            seeds
                .iter()
                .position(|s| *s == leader)
                .ok_or_else(|| format!("{leader} is no node's address"))
        })?;

        // The Python client, on its own process.
        let mut python = Command::new(&args.python)
            .arg("chaos/scripts/failover_probe.py")
            .args([
                "--seeds",
                &seeds
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            ])
            .arg("--ca")
            .arg(&ca_file)
            .args(["--token", &cluster.token, "--tenant", TENANT])
            .args(["--namespace", NAMESPACE, "--stream", STREAM, "--key", &key])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", args.python))?;
        let python_acks = Arc::new(Mutex::new(Vec::<u128>::new()));
        let reader = {
            let acks = python_acks.clone();
            let out = python.stdout.take().expect("piped");
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let mut words = line.split_whitespace();
                    if words.next() == Some("ack") {
                        if let Some(t) = words.next().and_then(|t| t.parse().ok()) {
                            acks.lock().expect("acks").push(t);
                        }
                    }
                }
            })
        };

        // Ours, in this process.
        let stop = Arc::new(AtomicBool::new(false));
        let our_acks = Arc::new(Mutex::new(Vec::<u128>::new()));
        let producer = {
            let (config, stop, acks, key) =
                (config.clone(), stop.clone(), our_acks.clone(), key.clone());
            rt.spawn(async move {
                let client = Client::connect(config).await.map_err(|e| e.to_string())?;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let body = vec![Bytes::from(format!("rs-{i}"))];
                    let keyed = Some(Bytes::from(key.clone()));
                    if client
                        .publish_at_least_once(NAMESPACE, STREAM, body, keyed)
                        .await
                        .is_ok()
                    {
                        acks.lock().expect("acks").push(unix_ns(SystemTime::now()));
                    }
                    i += 1;
                }
                client.close().await;
                Ok::<(), String>(())
            })
        };

        let warm_until = std::time::Instant::now() + WARM_LIMIT;
        while our_acks.lock().expect("acks").len() < WARM_ACKS
            || python_acks.lock().expect("acks").len() < WARM_ACKS
        {
            if std::time::Instant::now() > warm_until {
                stop.store(true, Ordering::Relaxed);
                let _ = python.kill();
                return Err(format!(
                    "round {round}: the clients did not warm up ({} ours, {} python)",
                    our_acks.lock().expect("acks").len(),
                    python_acks.lock().expect("acks").len()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let kill = unix_ns(SystemTime::now());
        cluster.kill(victim)?;
        std::thread::sleep(args.window);
        stop.store(true, Ordering::Relaxed);
        drop(python.stdin.take());
        let _ = python.wait();
        let _ = reader.join();
        let _ = rt.block_on(producer);

        let ours = gap(&our_acks.lock().expect("acks"), kill);
        let py = gap(&python_acks.lock().expect("acks"), kill);
        let show = |g: Option<Duration>| {
            g.map_or_else(
                || "no ack".to_owned(),
                |d| format!("{:.2} s", d.as_secs_f64()),
            )
        };
        println!(
            "{round:>5}  {:>6}  {:<12}  {}",
            cluster.nodes[victim].id,
            show(ours),
            show(py)
        );
        let _ = std::io::stdout().flush();
        ours_all.push(ours);
        python_all.push(py);

        cluster.start(victim)?;
        cluster.wait_ready(victim, READY_LIMIT)?;
    }
    let summary = |all: &[Option<Duration>]| {
        let mut s: Vec<f64> = all.iter().flatten().map(Duration::as_secs_f64).collect();
        s.sort_by(f64::total_cmp);
        if s.is_empty() {
            return "no acknowledgement after any kill".to_owned();
        }
        format!(
            "min {:.2} s, median {:.2} s, max {:.2} s ({} of {} rounds acknowledged again)",
            s[0],
            s[s.len() / 2],
            s[s.len() - 1],
            s.len(),
            all.len()
        )
    };
    println!("ours:   {}", summary(&ours_all));
    println!("python: {}", summary(&python_all));
    cluster.stop_all();
    Ok(())
}
