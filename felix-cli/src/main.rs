//! `felix`: the Felix command line. Publish, subscribe, use the cache, mint tokens,
//! benchmark a broker and run a local cluster. Every command but `token` and `cluster` talks
//! to a broker through `felix-client`.
//!
//! Exit codes (see docs/cli.md): 0 done, 1 cache miss, 2 usage, 3 refused by the broker,
//! 4 connection/timeout/protocol failure, 5 subscription ended by the broker.

mod admin;
mod admin_streams;
mod bench;
mod cache;
mod cluster;
mod conn;
mod cpu;
mod duration;
mod failure;
mod pubsub;
mod token;

use std::future::Future;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::failure::Failure;

#[derive(Parser)]
#[command(
    name = "felix",
    version,
    about = "The Felix command line",
    after_help = "Exit codes: 0 done, 1 cache miss, 2 usage, 3 refused by the broker, \
                  4 connection/timeout/protocol failure, 5 subscription ended by the broker."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Publish messages (arguments, or lines from stdin) to a stream.
    Pub(pubsub::PubArgs),
    /// Subscribe to a stream and print its events.
    Sub(pubsub::SubArgs),
    /// Read, write or delete cache entries.
    Cache(cache::CacheArgs),
    /// Mint a Felix token (Ed25519 JWT), or generate a signing key and its JWKS.
    Token(token::TokenArgs),
    /// Load-generate against a broker: publish→deliver throughput and latency, or cache ops.
    Bench(bench::BenchArgs),
    /// Run a local cluster of felix-broker processes (`felix cluster up --nodes 3`).
    Cluster(cluster::ClusterArgs),
    /// Cluster operations on a node's ops endpoint (`felix admin abandon`).
    Admin(admin::AdminArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        // Minting is local and synchronous: no runtime needed.
        Command::Token(args) => token::run(args),
        // Processes and files only: no runtime needed.
        Command::Cluster(args) => cluster::run(args),
        Command::Admin(args) => admin::run(args),
        Command::Pub(args) => block_on(None, pubsub::publish(args)),
        Command::Sub(args) => block_on(None, pubsub::subscribe(args)),
        Command::Cache(args) => block_on(None, cache::run(args)),
        Command::Bench(args) => {
            let threads = args.threads;
            block_on(threads, bench::run(args))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if let Some(message) = failure.message() {
                eprintln!("felix: {message}");
            }
            ExitCode::from(failure.exit_code())
        }
    }
}

fn block_on(
    threads: Option<usize>,
    command: impl Future<Output = Result<(), Failure>>,
) -> Result<(), Failure> {
    // One thread is a current-thread runtime: tasks woken together run in the order woken,
    // so requests written in one round leave in one datagram (a one-worker multi-thread
    // runtime runs the connection's driver after each request, one datagram each).
    let mut builder = match threads {
        Some(n) if n <= 1 => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if let Some(n) = threads.filter(|&n| n > 1) {
        builder.worker_threads(n);
    }
    let rt = builder
        .enable_all()
        .build()
        .map_err(|e| Failure::io("cannot start the async runtime", e))?;
    rt.block_on(command)
}

#[cfg(test)]
mod tests {
    use tokio::runtime::{Handle, RuntimeFlavor};

    use super::*;

    fn flavor(threads: Option<usize>) -> RuntimeFlavor {
        let seen = std::cell::Cell::new(None);
        let ran = block_on(threads, async {
            seen.set(Some(Handle::current().runtime_flavor()));
            Ok(())
        });
        assert!(ran.is_ok());
        seen.take().expect("the command ran")
    }

    /// Pins `--threads 1` to a current-thread runtime: on a one-worker multi-thread runtime
    /// each request the bench's workers wrote left in a datagram of its own
    /// (docs/performance.md, "Profiled pass").
    #[test]
    fn one_thread_is_a_current_thread_runtime() {
        assert_eq!(flavor(Some(1)), RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(Some(2)), RuntimeFlavor::MultiThread);
        assert_eq!(flavor(None), RuntimeFlavor::MultiThread);
    }
}
