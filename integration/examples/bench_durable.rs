//! Durable throughput: acked publishes of `batch` × `size` bytes under each storage mode,
//! against the same broker in memory, and how many records one fsync carries.
//!
//! ```text
//! cargo run --release -p felix-integration --example bench_durable -- \
//!     [--secs S] [--batch B] [--size BYTES] [--inflight K[,K...]] [--fanout N] \
//!     [--modes memory,on_commit,periodic,none,periodic_ack_before_write] [--dir PATH] \
//!     [--rounds R] [--direct-io on|off]
//! ```
//!
//! Every durable mode acks after the write, as the broker does by default;
//! `periodic_ack_before_write` is `periodic` with `FELIX_ACK_BEFORE_WRITE=true` (acks on
//! arrival, without offsets), to measure what waiting for the write costs.
//!
//! `--direct-io off` buffers the durable modes' appends (`FELIX_DURABLE_DIRECT_IO=false`), to
//! compare with the default direct appends.
//!
//! With `--rounds R` the modes run R times, alternating, and each round prints its own ratio;
//! the last line is the median ratio (for an odd R, the middle round).
//!
//! Each (mode, inflight) run gets a fresh broker (in this process, on a runtime and thread
//! of its own) and, for the durable modes, a fresh storage directory under `--dir` (default:
//! the system temp directory). `inflight` publishes are kept in flight on one connection
//! (group commit needs several waiting behind each fsync); `fanout` subscribers read
//! everything. A mode's throughput is its best over the inflight values: records delivered
//! per subscriber per second with subscribers (what a consumer gets; an in-memory broker
//! that acks faster than it delivers drops the rest), acked records per second without.
//! Output is plain `name: value` lines, then one ratio line per durable mode.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_client::{Ack, Start, SubscriptionEnd, SubscriptionItem};
use felix_integration::{BenchArgs, BenchBroker};
use felix_runtime_tokio::felix_engine::{DurableConfig, FsyncPolicy};
use felix_runtime_tokio::files::FileStats;
use felix_runtime_tokio::BrokerOptions;

/// A broker on a runtime and thread of its own, durable under `storage` when given.
fn start_broker(storage: Option<(PathBuf, DurableConfig)>, direct_io: bool) -> BenchBroker {
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().expect("literal"));
    if let Some((dir, durable)) = storage {
        opts.storage_dir = Some(dir);
        opts.durable = durable;
    }
    opts.direct_io = direct_io;
    BenchBroker::start(opts)
}

struct Outcome {
    /// CPU seconds the broker's and the client's threads used during the run.
    cpu: Option<(f64, f64)>,
    /// CPU seconds the whole machine used (every process and the kernel's own threads).
    machine_cpu: Option<f64>,
    /// Times a subscriber was ended as lagging and resumed from the log.
    lagged: u64,
    records_per_sec: f64,
    mb_per_sec: f64,
    delivered_per_sec: f64,
    files: FileStats,
    secs: f64,
}

async fn run(broker: &BenchBroker, args: &BenchArgs, inflight: usize) -> Outcome {
    let secs: u64 = args.get("secs", 5);
    let batch: usize = args.get("batch", 64);
    let size: usize = args.get("size", 1024);
    let fanout: usize = args.get("fanout", 1);
    let stream = format!("bench-durable-{}", std::process::id());

    let stop = Arc::new(AtomicBool::new(false));
    let delivered = Arc::new(AtomicU64::new(0));
    let lagged = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..fanout {
        let client = broker.client().await;
        let mut sub = client
            .subscribe("default", &stream, Start::Latest)
            .await
            .expect("subscribe");
        let (stop, delivered, lagged) = (stop.clone(), delivered.clone(), lagged.clone());
        let stream = stream.clone();
        readers.push(tokio::spawn(async move {
            loop {
                match tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
                    Ok(Ok(SubscriptionItem::Event(_))) => {
                        delivered.fetch_add(1, Ordering::Relaxed);
                    }
                    // A durable broker ends a subscriber that fell behind its queue; it
                    // resumes from the log where the drop began, as a real consumer would.
                    Ok(Ok(SubscriptionItem::End(SubscriptionEnd::Lagged { resume_from }))) => {
                        lagged.fetch_add(1, Ordering::Relaxed);
                        sub = client
                            .subscribe("default", &stream, Start::Offset(resume_from))
                            .await
                            .expect("resubscribe");
                    }
                    Ok(other) => panic!("subscription ended: {other:?}"),
                    Err(_) if stop.load(Ordering::Relaxed) => break,
                    Err(_) => {}
                }
            }
        }));
    }

    let publisher = Arc::new(broker.client().await);
    let payloads: Vec<Bytes> = (0..batch)
        .map(|i| Bytes::from(vec![i as u8; size]))
        .collect();
    // Warm up: the first publish opens the shard's log.
    publisher
        .publish("default", &stream, payloads.clone(), None, Ack::PerBatch)
        .await
        .expect("publish");
    let files_before = broker.file_stats();
    let cpu_before = thread_cpu();
    let machine_before = machine_cpu();
    let delivered_before = delivered.load(Ordering::Relaxed);
    let acked = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..inflight {
        let (publisher, payloads, stream, acked) = (
            publisher.clone(),
            payloads.clone(),
            stream.clone(),
            acked.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                publisher
                    .publish("default", &stream, payloads.clone(), None, Ack::PerBatch)
                    .await
                    .expect("publish");
                acked.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("publisher");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = thread_cpu()
        .zip(cpu_before)
        .map(|(a, b)| (a.0 - b.0, a.1 - b.1));
    let machine_cpu = machine_cpu().zip(machine_before).map(|(a, b)| a - b);
    let files_after = broker.file_stats();
    let delivered_count = delivered.load(Ordering::Relaxed) - delivered_before;
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.await.expect("reader");
    }
    let records = acked.load(Ordering::Relaxed) * batch as u64;
    Outcome {
        lagged: lagged.load(Ordering::Relaxed),
        machine_cpu,
        records_per_sec: records as f64 / elapsed,
        mb_per_sec: (records * size as u64) as f64 / elapsed / 1e6,
        delivered_per_sec: delivered_count as f64 / elapsed / fanout.max(1) as f64,
        files: FileStats {
            ops: files_after.ops - files_before.ops,
            appends: files_after.appends - files_before.appends,
            appended_bytes: files_after.appended_bytes - files_before.appended_bytes,
            append_micros: files_after.append_micros - files_before.append_micros,
            syncs: files_after.syncs - files_before.syncs,
            sync_micros: files_after.sync_micros - files_before.sync_micros,
            reads: files_after.reads - files_before.reads,
            failures: files_after.failures - files_before.failures,
            direct_appends: files_after.direct_appends - files_before.direct_appends,
        },
        secs: elapsed,
        cpu,
    }
}

/// Busy CPU seconds of the whole machine so far, from `/proc/stat` (Linux). Minus the
/// broker's and client's threads it is the kernel's writeback and journal threads, plus
/// whatever else runs (so only meaningful on a quiet machine).
fn machine_cpu() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let busy = v.iter().take(8).sum::<u64>() - v.get(3)? - v.get(4)?;
    Some(busy as f64 / 100.0)
}

/// CPU seconds used so far by the broker's runtime threads (its file ops included) and by
/// the client's, from `/proc/self/task/*/stat` (Linux; `None` elsewhere). A thread that
/// exited is not counted, so runs stay short of tokio's 10 s idle-thread timeout.
fn thread_cpu() -> Option<(f64, f64)> {
    let ticks_per_sec = 100.0; // USER_HZ, 100 on every Linux this runs on
    let (mut broker, mut client) = (0u64, 0u64);
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ...`: utime and stime are fields 14 and 15.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let used = fields
            .get(11)
            .and_then(|u| u.parse::<u64>().ok())
            .unwrap_or(0)
            + fields
                .get(12)
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0);
        if comm.starts_with("broker") {
            broker += used;
        } else if comm.starts_with("client") {
            client += used;
        }
    }
    Some((broker as f64 / ticks_per_sec, client as f64 / ticks_per_sec))
}

fn main() {
    let args = BenchArgs::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("client-rt")
        .enable_all()
        .build()
        .expect("client runtime");
    let base = args.get("dir", std::env::temp_dir());
    let modes: String = args.get("modes", "memory,on_commit".into());
    let inflights = args.list("inflight", "2,8,32");
    let fanout: usize = args.get("fanout", 1);
    println!(
        "config: batch {} x {} B, inflight {inflights:?}, fanout {fanout}, {} s per run",
        args.get("batch", 64usize),
        args.get("size", 1024usize),
        args.get("secs", 5u64)
    );
    // Rounds alternate the modes, so a ratio compares runs a minute apart rather than
    // minutes apart: on a shared machine the in-memory figure alone drifts by 10 % or more.
    let rounds: usize = args.get("rounds", 1);
    let mut ratios: Vec<(String, Vec<f64>)> = Vec::new();
    for round in 1..=rounds {
        let mut memory_rate = None;
        let mut results = Vec::new();
        for mode in modes.split(',') {
            let fsync = match mode {
                "memory" => None,
                "on_commit" => Some(FsyncPolicy::OnCommit),
                "periodic" => Some(FsyncPolicy::Periodic(Duration::from_millis(250))),
                "none" => Some(FsyncPolicy::None),
                "periodic_ack_before_write" => {
                    Some(FsyncPolicy::Periodic(Duration::from_millis(250)))
                }
                other => panic!(
                    "unknown mode {other:?}: memory | on_commit | periodic | none | periodic_ack_before_write"
                ),
            };
            let mut best = 0f64;
            for &inflight in &inflights {
                let best_here = run_one(&rt, &args, &base, mode, fsync, inflight, fanout);
                best = best.max(best_here);
            }
            println!("{mode}.best_records_per_sec: {best:.0}");
            if mode == "memory" {
                memory_rate = Some(best);
            } else {
                results.push((mode.to_owned(), best));
            }
        }
        let Some(memory) = memory_rate else {
            continue;
        };
        for (mode, rate) in results {
            let ratio = rate / memory;
            println!("ratio.{mode}_vs_memory: {ratio:.2}");
            match ratios.iter_mut().find(|(m, _)| *m == mode) {
                Some((_, all)) => all.push(ratio),
                None => ratios.push((mode, vec![ratio])),
            }
        }
        if rounds > 1 {
            println!("round {round} of {rounds} done");
        }
    }
    if rounds > 1 {
        for (mode, mut all) in ratios {
            all.sort_by(f64::total_cmp);
            let median = all[all.len() / 2];
            let listed: Vec<String> = all.iter().map(|r| format!("{r:.2}")).collect();
            println!(
                "ratio.{mode}_vs_memory.median_of_{rounds}: {median:.2} (sorted: {})",
                listed.join(" ")
            );
        }
    }
}

/// One (mode, inflight) run; prints its lines and returns its throughput.
fn run_one(
    rt: &tokio::runtime::Runtime,
    args: &BenchArgs,
    base: &std::path::Path,
    mode: &str,
    fsync: Option<FsyncPolicy>,
    inflight: usize,
    fanout: usize,
) -> f64 {
    let dir = base.join(format!("felix-bench-durable-{}-{mode}", std::process::id()));
    let storage = fsync.map(|fsync| {
        let _ = std::fs::remove_dir_all(&dir);
        // The default: acks after the write, with an offset, once the mode calls the record
        // durable; only the `_ack_before_write` mode answers on arrival.
        let durable = {
            let mut durable_config = DurableConfig::default();
            durable_config.fsync = fsync;
            durable_config.ack_before_write = mode.ends_with("_ack_before_write");
            durable_config
        };
        (dir.clone(), durable)
    });
    let direct_io = args.get("direct-io", "on".to_owned()) != "off";
    let broker = start_broker(storage, direct_io);
    let o = rt.block_on(run(&broker, args, inflight));
    broker.stop();
    let _ = std::fs::remove_dir_all(&dir);
    let name = format!("{mode}.inflight_{inflight}");
    println!("{name}.acked_records_per_sec: {:.0}", o.records_per_sec);
    println!("{name}.acked_mb_per_sec: {:.1}", o.mb_per_sec);
    if fanout > 0 {
        println!(
            "{name}.delivered_records_per_sec: {:.0}",
            o.delivered_per_sec
        );
    }
    if o.lagged > 0 {
        println!("{name}.subscriber_lagged_and_resumed: {}", o.lagged);
    }
    if let Some((broker_cpu, client_cpu)) = o.cpu {
        let records = o.records_per_sec * o.secs;
        println!("{name}.broker_cpu_cores: {:.2}", broker_cpu / o.secs);
        println!("{name}.client_cpu_cores: {:.2}", client_cpu / o.secs);
        if let Some(m) = o.machine_cpu {
            let rest = (m - broker_cpu - client_cpu).max(0.0);
            println!("{name}.other_cpu_cores: {:.2}", rest / o.secs);
        }
        if records > 0.0 {
            println!(
                "{name}.broker_cpu_us_per_record: {:.2}",
                broker_cpu * 1e6 / records
            );
        }
    }
    let f = &o.files;
    if f.ops > 0 {
        let syncs_per_sec = f.syncs as f64 / o.secs;
        println!("{name}.fsyncs_per_sec: {syncs_per_sec:.0}");
        println!("{name}.appends_per_sec: {:.0}", f.appends as f64 / o.secs);
        println!(
            "{name}.direct_appends: {} of {}",
            f.direct_appends, f.appends
        );
        if f.appends > 0 {
            println!(
                "{name}.mean_append_ms: {:.2} ({:.0} KiB)",
                f.append_micros as f64 / f.appends as f64 / 1000.0,
                f.appended_bytes as f64 / f.appends as f64 / 1024.0
            );
        }
        if f.syncs > 0 {
            println!(
                "{name}.records_per_fsync: {:.0}",
                o.records_per_sec / syncs_per_sec
            );
            println!(
                "{name}.mean_fsync_ms: {:.2}",
                f.sync_micros as f64 / f.syncs as f64 / 1000.0
            );
        }
        println!("{name}.file_ops_failed: {}", f.failures);
    }
    if fanout > 0 {
        o.delivered_per_sec
    } else {
        o.records_per_sec
    }
}
