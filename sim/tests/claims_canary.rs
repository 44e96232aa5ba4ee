//! The cache-read and group-claim invariants can fail: with a stale read cache in front of
//! the broker, or a record misrouted into another worker's poll answer, a run must report
//! `cache_reads` or `group_claims` within the seeds given here (well inside the CI budget).

use felix_sim::{run, Canary, RunOptions};

fn first_caught(canary: Canary, budget: u64) -> Option<(u64, felix_sim::Violation)> {
    (0..budget).find_map(|seed| {
        let outcome = run(&RunOptions {
            seed,
            verbose: false,
            canary: Some(canary),
            majority_crashes: false,
            replicated: false,
            wipe_disks: false,
            leader_consistency: false,
            admin_ops: false,
        });
        outcome.violation.map(|v| (seed, v))
    })
}

#[test]
fn a_read_cache_never_invalidated_is_caught() {
    let (seed, v) = first_caught(Canary::StaleCacheRead, 8).expect("the canary went unnoticed");
    assert_eq!(v.invariant, "cache_reads", "seed {seed}: {v}");
}

#[test]
fn a_record_misrouted_to_a_second_worker_is_caught() {
    let (seed, v) = first_caught(Canary::MisrouteClaim, 8).expect("the canary went unnoticed");
    assert_eq!(v.invariant, "group_claims", "seed {seed}: {v}");
}
