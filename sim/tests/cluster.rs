//! The cluster workload (`felix_sim::run_cluster`): a run is a function of its seed, a small
//! sweep passes, and each cluster invariant catches its canary within the seeds given here.

use felix_sim::{run_cluster, Canary, RunOptions};

fn first_caught(canary: Canary, budget: u64) -> Option<(u64, felix_sim::Violation)> {
    (0..budget).find_map(|seed| {
        let outcome = run_cluster(&RunOptions {
            canary: Some(canary),
            ..RunOptions::seed(seed)
        });
        outcome.violation.map(|v| (seed, v))
    })
}

#[test]
fn same_seed_same_cluster_trace() {
    for seed in [0, 7] {
        let opts = RunOptions {
            verbose: true,
            ..RunOptions::seed(seed)
        };
        let a = run_cluster(&opts);
        let b = run_cluster(&opts);
        assert!(a.events > 100, "seed {seed} did too little: {}", a.summary);
        let first_diff = a.trace.iter().zip(&b.trace).position(|(x, y)| x != y);
        assert_eq!(first_diff, None, "seed {seed}: traces diverge");
        assert_eq!(a.hash, b.hash, "seed {seed} is not deterministic");
        // Peer links carried raft and forwards; clients were on several nodes.
        assert!(
            a.trace.iter().any(|l| l.contains(" net n1>n2 ")),
            "no peer traffic"
        );
        assert!(
            a.trace.iter().any(|l| l.contains(" applied ")),
            "nothing applied"
        );
    }
}

#[test]
fn a_small_cluster_sweep_passes() {
    let mut forwarded = 0;
    let mut redirects = false;
    for seed in 0..5 {
        let outcome = run_cluster(&RunOptions::seed(seed));
        if let Some(v) = &outcome.violation {
            panic!(
                "seed {seed}: {v}\nreplay (same build profile as this test): cargo run -p felix-sim -- --cluster --seed {seed} --verbose\n{}",
                outcome.summary
            );
        }
        forwarded += u64::from(!outcome.summary.contains(" 0 acked records forwarded"));
        redirects |= !outcome.summary.contains(" 0 redirects");
    }
    // The workload exercised what the invariants judge: forwarded acks and redirects.
    assert!(forwarded > 0, "no forwarded ack in 5 seeds");
    assert!(redirects, "no redirect in 5 seeds");
}

#[test]
fn divergent_metadata_is_caught() {
    let (seed, v) = first_caught(Canary::MetadataDivergence, 4).expect("went unnoticed");
    assert_eq!(v.invariant, "meta_agreement", "seed {seed}: {v}");
}

#[test]
fn a_second_leader_at_one_generation_is_caught() {
    let (seed, v) = first_caught(Canary::SplitLeader, 4).expect("went unnoticed");
    assert_eq!(v.invariant, "one_leader_per_generation", "seed {seed}: {v}");
}

#[test]
fn a_forwarded_ack_missing_from_the_leader_is_caught() {
    let (seed, v) = first_caught(Canary::WipeLeaderDisk, 6).expect("went unnoticed");
    assert_eq!(v.invariant, "forwarded_acks", "seed {seed}: {v}");
}

#[test]
fn a_redirect_loop_is_caught() {
    let (seed, v) = first_caught(Canary::RedirectLoop, 6).expect("went unnoticed");
    assert_eq!(v.invariant, "redirects_end", "seed {seed}: {v}");
}

/// Seed 1 with crashes free to take down two of three nodes at once. While the metadata log
/// lived in memory both restarted blank, the blank majority re-founded the cluster at term 1
/// without the third node's committed entries, and the nodes never converged
/// (docs/simulator.md, "Findings"); with the log on disk they replay it and agree.
#[test]
fn a_blank_majority_keeps_committed_metadata() {
    let outcome = run_cluster(&RunOptions {
        majority_crashes: true,
        replicated: false,
        ..RunOptions::seed(1)
    });
    assert_eq!(outcome.violation, None, "{}", outcome.summary);
}

/// Replicated seed 661 (docs/simulator.md, "Findings"): n1 restarted, dialed n3, and was
/// frozen before n3's answer reached it; n3 forgot the handshake, and n1's link to n3 stayed
/// a dead handshake for about a minute (QUIC measured the freeze as its round trip), so the
/// raft leader n3 never heard n1 again and n1's metadata never caught up. The schedule is
/// the release build's (`scripts/test` runs the seed there); in this profile it is one more
/// replicated seed with a crash and a freeze.
#[test]
fn replicated_seed_661_converges() {
    let outcome = run_cluster(&RunOptions {
        replicated: true,
        ..RunOptions::seed(661)
    });
    assert_eq!(outcome.violation, None, "{}", outcome.summary);
}

/// Lost drives (`--wipe-disks`), replicated seed 1601 (docs/replication.md, "Lost-drive
/// sweep beyond seed 1600"): n4's disk is replaced at 3.5 s and n5's drawn wipe comes at
/// 6.48 s, before n4's rebuilt copies are recorded. Both wiped, shard 4 kept one recorded
/// copy of three, could fence no leader and stayed dark (`forwarded_acks`). The simulator now
/// keeps lost drives to a minority of each shard: n5 crashes with its disk.
#[test]
fn a_drawn_wipe_waits_for_the_last_wiped_copy_to_be_recorded() {
    let outcome = run_cluster(&RunOptions {
        replicated: true,
        wipe_disks: true,
        verbose: true,
        ..RunOptions::seed(1601)
    });
    assert_eq!(outcome.violation, None, "{}", outcome.summary);
    let said = |what: &str| outcome.trace.iter().any(|l| l.contains(what));
    assert!(
        said("n4 crashed: its disk replaced"),
        "the first wipe is still made"
    );
    assert!(said("n5 wipe skipped: n4's"), "the second wipe is withheld");
}

/// The replication safety invariants: any of them may be the first to see a broken rule.
const REPLICATION_SAFETY: &[&str] = &[
    "no_acked_loss",
    "offsets_unique_and_contiguous",
    "committed_prefix",
    "leases_disjoint",
    "one_writer_per_generation",
];

#[test]
fn a_leader_serving_past_its_lease_is_caught() {
    let (seed, v) = first_caught(Canary::ServePastLease, 2).expect("went unnoticed");
    assert_eq!(v.invariant, "leases_disjoint", "seed {seed}: {v}");
}

#[test]
fn promoting_a_replica_without_fencing_is_caught() {
    let (seed, v) = first_caught(Canary::PromoteBehind, 6).expect("went unnoticed");
    // An acknowledged record missing from the new leader's log shows first either way.
    assert!(
        REPLICATION_SAFETY.contains(&v.invariant) || v.invariant == "forwarded_acks",
        "seed {seed}: {v}"
    );
}

#[test]
fn a_follower_reporting_before_its_write_is_durable_is_caught() {
    // Caught first at seed 6 (7 of seeds 0..40, `no_acked_loss`); the same faults with a
    // correct follower pass (60 seeds, checked by hand with the engine's canary branch
    // disabled).
    let (seed, v) = first_caught(Canary::AckBeforeDurable, 8).expect("went unnoticed");
    assert!(
        REPLICATION_SAFETY.contains(&v.invariant),
        "seed {seed}: {v}"
    );
}

#[test]
fn a_leader_shard_handed_on_while_its_leader_may_hold_unshipped_acks_is_caught() {
    // The old rule: a `leader` shard whose leader went silent passed to any live follower.
    // The run cuts the busiest leader off from its followers while it acknowledges alone,
    // then crashes it; the follower named in its place lacks what it acknowledged.
    let (seed, v) = first_caught(Canary::AbandonOnSilence, 8).expect("went unnoticed");
    assert!(
        REPLICATION_SAFETY.contains(&v.invariant),
        "seed {seed}: {v}"
    );
}

#[test]
fn a_small_leader_consistency_sweep_loses_nothing() {
    // Crashes, freezes and cuts with `leader` shards: a shard passes on only to a follower
    // recorded level with its leader, or waits for the leader and what it acknowledged.
    for seed in 0..4 {
        let outcome = run_cluster(&RunOptions {
            replicated: true,
            leader_consistency: true,
            ..RunOptions::seed(seed)
        });
        assert_eq!(outcome.violation, None, "seed {seed}: {}", outcome.summary);
    }
}

#[test]
fn a_node_holding_a_spec_nobody_asked_for_is_caught() {
    let (seed, v) = first_caught(Canary::SpecDivergence, 10).expect("caught within 10 seeds");
    assert_eq!(v.invariant, "object_specs", "seed {seed}: {v}");
}

#[test]
fn the_operators_creates_alters_and_deletes_keep_their_answers() {
    let (mut created, mut deleted, mut recreated) = (0, 0, 0);
    for seed in 0..4 {
        let outcome = run_cluster(&RunOptions {
            admin_ops: true,
            replicated: true,
            verbose: true,
            ..RunOptions::seed(seed)
        });
        if let Some(v) = &outcome.violation {
            panic!(
                "seed {seed}: {v}\nreplay: cargo run -p felix-sim -- --cluster --replicated --admin-ops --seed {seed} --verbose"
            );
        }
        let admin = || outcome.trace.iter().filter(|l| l.contains(" ADMIN "));
        created += admin().filter(|l| l.contains(": Ok(Some(")).count();
        deleted += admin()
            .filter(|l| l.contains(" delete ") && l.ends_with(": Ok(())"))
            .count();
        // Names held at a later life at the end: created again after a delete was applied.
        let tail = outcome
            .summary
            .split(" seen applied, ")
            .nth(1)
            .expect("admin counts");
        let held_again: u64 = tail.split(' ').next().unwrap().parse().unwrap();
        recreated += held_again;
    }
    // The workload reached the answers the invariant judges: creates answered with a view,
    // deletes answered Ok, and a name created again after its delete.
    assert!(created > 0, "no create answered with its view in 4 seeds");
    assert!(deleted > 0, "no delete answered Ok in 4 seeds");
    assert!(
        recreated > 0,
        "no name created again after a delete in 4 seeds"
    );
}
