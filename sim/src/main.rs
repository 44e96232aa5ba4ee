//! `felix-sim`: runs seeds of the deterministic simulator.
//!
//! ```text
//! felix-sim --seeds 0..100          # run seeds 0 to 99
//! felix-sim --seed 42 --verbose     # replay one seed, printing its event trace
//! felix-sim --seeds 0..20 --canary lying-sync   # the canary must be caught
//! felix-sim --seeds 0..20 --hashes  # only `seed S hash H` per seed (scripts/sim-determinism)
//! felix-sim --cluster --seeds 0..50  # the cluster workload (3 or 5 nodes)
//! felix-sim --cluster --seeds 0..10000 --quiet --keep-going   # a sweep: count violations
//! ```
//! Exits 1 on the first violation (printing the seed, the invariant and the replay command),
//! 2 on bad arguments.

use std::io::Write;
use std::process::ExitCode;

use felix_sim::{run, run_cluster, Canary, RunOptions};

fn usage() -> ExitCode {
    eprintln!(
        "usage: felix-sim (--seeds A..B | --seed S) [--cluster] [--verbose] [--canary drop-event-frame|lying-sync|resend-as-new|drop-watch-change|stale-cache-read|misroute-claim|withhold-answers|metadata-divergence|split-leader|wipe-leader-disk|redirect-loop|promote-behind|serve-past-lease|ack-before-durable|abandon-on-silence|spec-divergence] [--quiet | --hashes] [--keep-going] [--majority-crashes] [--replicated] [--wipe-disks] [--leader-consistency] [--admin-ops]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    if let Ok(filter) = std::env::var("FELIX_SIM_LOG") {
        // Without wall-clock stamps: the trace lines around them give virtual time.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .without_time()
            .with_ansi(false)
            .with_writer(|| {
                // Each log line is tagged with the node whose engine wrote it.
                let mut out = std::io::stdout();
                if let Some(i) = felix_sim::current_node() {
                    let _ = write!(out, "[n{}] ", i + 1);
                }
                out
            })
            .try_init();
        felix_sim::print_trace_live();
    }
    let mut seeds: Option<(u64, u64)> = None;
    let mut verbose = false;
    let mut quiet = false;
    let mut hashes = false;
    let mut cluster = false;
    let mut keep_going = false;
    let mut majority_crashes = false;
    let mut replicated = false;
    let mut wipe_disks = false;
    let mut leader_consistency = false;
    let mut admin_ops = false;
    let mut canary: Option<Canary> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seeds" => {
                let Some(range) = args.next() else {
                    return usage();
                };
                let Some((a, b)) = range.split_once("..") else {
                    return usage();
                };
                match (a.parse(), b.parse()) {
                    (Ok(a), Ok(b)) if a < b => seeds = Some((a, b)),
                    _ => return usage(),
                }
            }
            "--seed" => {
                let Some(Ok(s)) = args.next().map(|s| s.parse::<u64>()) else {
                    return usage();
                };
                seeds = Some((s, s + 1));
            }
            "--verbose" => verbose = true,
            "--quiet" => quiet = true,
            "--hashes" => hashes = true,
            "--cluster" => cluster = true,
            "--keep-going" => keep_going = true,
            "--majority-crashes" => majority_crashes = true,
            "--replicated" => replicated = true,
            "--wipe-disks" => wipe_disks = true,
            "--leader-consistency" => leader_consistency = true,
            "--admin-ops" => admin_ops = true,
            "--canary" => match args.next().map(|c| c.parse()) {
                Some(Ok(c)) => canary = Some(c),
                Some(Err(e)) => {
                    eprintln!("{e}");
                    return usage();
                }
                None => return usage(),
            },
            _ => return usage(),
        }
    }
    let Some((first, end)) = seeds else {
        return usage();
    };
    let started = std::time::Instant::now();
    let canary_flag = match canary {
        Some(Canary::DropEventFrame) => " --canary drop-event-frame",
        Some(Canary::LyingSync) => " --canary lying-sync",
        Some(Canary::ResendAsNew) => " --canary resend-as-new",
        Some(Canary::DropWatchChange) => " --canary drop-watch-change",
        Some(Canary::StaleCacheRead) => " --canary stale-cache-read",
        Some(Canary::MisrouteClaim) => " --canary misroute-claim",
        Some(Canary::WithholdAnswers) => " --canary withhold-answers",
        Some(Canary::MetadataDivergence) => " --canary metadata-divergence",
        Some(Canary::SplitLeader) => " --canary split-leader",
        Some(Canary::WipeLeaderDisk) => " --canary wipe-leader-disk",
        Some(Canary::RedirectLoop) => " --canary redirect-loop",
        Some(Canary::PromoteBehind) => " --canary promote-behind",
        Some(Canary::ServePastLease) => " --canary serve-past-lease",
        Some(Canary::AckBeforeDurable) => " --canary ack-before-durable",
        Some(Canary::AbandonOnSilence) => " --canary abandon-on-silence",
        Some(Canary::SpecDivergence) => " --canary spec-divergence",
        None => "",
    };
    let mut out = std::io::stdout().lock();
    // `--keep-going`: violations per invariant, with the first seed of each.
    let mut failed: std::collections::BTreeMap<&'static str, (u64, u64)> = Default::default();
    // A reader that went away (`| head`) ends the sweep quietly.
    macro_rules! say {
        ($($arg:tt)*) => {
            if writeln!(out, $($arg)*).is_err() {
                return ExitCode::SUCCESS;
            }
        };
    }
    for seed in first..end {
        let options = RunOptions {
            seed,
            verbose,
            canary,
            majority_crashes,
            replicated,
            wipe_disks,
            leader_consistency,
            admin_ops,
        };
        let outcome = if cluster {
            run_cluster(&options)
        } else {
            run(&options)
        };
        for line in &outcome.trace {
            say!("{line}");
        }
        if hashes {
            // No summary: it carries wall time, which differs between runs and builds.
            say!("seed {seed} hash {}", outcome.hash);
        } else if !quiet || outcome.violation.is_some() {
            say!("seed {seed} hash {} | {}", outcome.hash, outcome.summary);
        }
        if let Some(v) = outcome.violation {
            say!();
            say!("VIOLATION at seed {seed}: {}", v.invariant);
            say!("  {}", v.detail);
            say!(
                "replay: cargo run --release -p felix-sim -- --seed {seed}{}{}{}{}{canary_flag} --verbose",
                match (cluster, majority_crashes, replicated) {
                    (false, ..) => "",
                    (true, false, false) => " --cluster",
                    (true, true, false) => " --cluster --majority-crashes",
                    (true, false, true) => " --cluster --replicated",
                    (true, true, true) => " --cluster --majority-crashes --replicated",
                },
                if wipe_disks { " --wipe-disks" } else { "" },
                if leader_consistency { " --leader-consistency" } else { "" },
                if admin_ops { " --admin-ops" } else { "" }
            );
            if !keep_going {
                return ExitCode::from(1);
            }
            failed.entry(v.invariant).or_insert((0, seed)).0 += 1;
        }
    }
    if hashes {
        return ExitCode::SUCCESS;
    }
    let n = end - first;
    let secs = started.elapsed().as_secs_f64();
    if !failed.is_empty() {
        for (invariant, (count, first_seed)) in &failed {
            say!("{invariant}: {count} seeds failed, first {first_seed}");
        }
        let bad: u64 = failed.values().map(|(c, _)| c).sum();
        say!("{bad} of {n} seeds failed in {secs:.1} s");
        return ExitCode::from(1);
    }
    say!(
        "{n} seeds passed in {secs:.1} s ({:.2} seeds/s)",
        n as f64 / secs.max(1e-9)
    );
    ExitCode::SUCCESS
}
