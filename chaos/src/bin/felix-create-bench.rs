//! `felix-create-bench`: how long a stream create through the admin API takes
//! (docs/operations.md, "How long a create takes"). Lays out and starts the admin tests'
//! cluster (three durable nodes, fsync `on_commit`, 1 s leases; `felix_chaos::harness`), then
//! creates `--creates` streams in turn with `POST /v1/streams`, through each node in turn,
//! each a `quorum` stream of `--shards` shards with replication factor 3, and times each from
//! the `POST` to its answer (every shard led by a live node). A `503` (retryable: a
//! control-plane election under way) is asked again after 100 ms, and the time counts.
//! Prints each create's time and answer, then the p50, the max and creates per second.
//!
//! The broker is `--broker-bin`, else `FELIX_BROKER_BIN`, else `target/release`, else
//! `target/debug`. Exit 0 when every create was answered, 1 when one was not within
//! `--limit-secs` or was refused otherwise, 2 on a usage error.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use felix_chaos::cluster::{Cluster, NAMESPACE, NODES, TENANT};
use felix_chaos::harness::{admin_layout, broker, http_post, start_all};

const USAGE: &str = "\
usage: felix-create-bench [--creates N (20)] [--shards N (6)] [--limit-secs S (60)]
                          [--broker-bin PATH]";

/// Between a `503` and asking again.
const RETRY: Duration = Duration::from_millis(100);

struct Args {
    creates: usize,
    shards: u32,
    limit: Duration,
    broker: Option<std::path::PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        creates: 20,
        shards: 6,
        limit: Duration::from_secs(60),
        broker: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} wants a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--creates" => args.creates = number(value()?)? as usize,
            "--shards" => {
                args.shards = u32::try_from(number(value()?)?).map_err(|e| e.to_string())?
            }
            "--limit-secs" => args.limit = Duration::from_secs(number(value()?)?),
            "--broker-bin" => args.broker = Some(value()?.into()),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if args.creates == 0 || args.shards == 0 {
        return Err("--creates and --shards are at least 1".into());
    }
    Ok(args)
}

/// A usage error (none for `--help`): the usage, exit 2.
fn usage(error: &str) -> ExitCode {
    if !error.is_empty() {
        eprintln!("felix-create-bench: {error}");
    }
    eprintln!("{USAGE}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => return usage(&e),
    };
    let broker = args.broker.unwrap_or_else(broker);
    let mut c = match Cluster::lay_out_with(&broker, &admin_layout("felix-create-bench")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("laying out the cluster: {e}");
            return ExitCode::from(2);
        }
    };
    start_all(&mut c);
    let mut took = Vec::with_capacity(args.creates);
    for i in 0..args.creates {
        let body = format!(
            r#"{{"tenant":"{TENANT}","namespace":"{NAMESPACE}","stream":"bench-{i}","shards":{},"replication_factor":3,"consistency":"quorum"}}"#,
            args.shards
        );
        let ops = c.nodes[i % NODES.len()].ops;
        let started = Instant::now();
        loop {
            let left = args.limit.saturating_sub(started.elapsed());
            if left.is_zero() {
                eprintln!("bench-{i}: not created within {:?}", args.limit);
                c.stop_all();
                return ExitCode::from(1);
            }
            let answer = http_post(ops, "/v1/streams", &c.token, &body, left);
            match answer {
                Some((200 | 201, _)) => break,
                // Retryable by contract: asked again, and the time counts.
                Some((503, answer)) => {
                    println!("bench-{i}: 503 {}", answer.lines().last().unwrap_or(""));
                    std::thread::sleep(RETRY);
                }
                Some((status, answer)) => {
                    eprintln!("bench-{i}: refused {status}: {answer}");
                    c.stop_all();
                    return ExitCode::from(1);
                }
                None => std::thread::sleep(RETRY),
            }
        }
        let t = started.elapsed();
        println!("bench-{i}: {t:?}");
        took.push(t);
    }
    c.stop_all();
    let total: Duration = took.iter().sum();
    took.sort();
    println!(
        "create of a quorum {}-shard RF 3 stream, {} in turn: p50 {:?}, max {:?}, {:.1} creates/s",
        args.shards,
        took.len(),
        took[took.len() / 2],
        took[took.len() - 1],
        took.len() as f64 / total.as_secs_f64()
    );
    ExitCode::SUCCESS
}
