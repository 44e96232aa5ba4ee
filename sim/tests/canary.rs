//! The invariants can fail: with a piece of the simulator broken on purpose, a run must report
//! a violation within a few seeds (well inside the CI budget).

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
fn a_silently_dropped_event_frame_is_caught() {
    let (seed, v) = first_caught(Canary::DropEventFrame, 8).expect("the canary went unnoticed");
    assert_eq!(v.invariant, "subscriber_order", "seed {seed}: {v}");
}

#[test]
fn a_sync_that_persists_nothing_is_caught() {
    let (seed, v) = first_caught(Canary::LyingSync, 8).expect("the canary went unnoticed");
    // Lost acknowledged records, or a log the lie left unrecoverable.
    assert!(
        ["no_acked_loss", "recovery", "offsets_unique_and_contiguous"].contains(&v.invariant),
        "seed {seed}: {v}"
    );
}

#[test]
fn a_batch_resent_under_a_new_sequence_is_caught() {
    let (seed, v) = first_caught(Canary::ResendAsNew, 40).expect("the canary went unnoticed");
    // Appended twice (the first copy had landed), or refused as a gap (it had not).
    assert!(
        ["idempotent_once", "subscriber_order"].contains(&v.invariant),
        "seed {seed}: {v}"
    );
}

#[test]
fn an_answer_left_owed_is_caught() {
    let (seed, v) = first_caught(Canary::WithholdAnswers, 8).expect("the canary went unnoticed");
    assert_eq!(v.invariant, "requests_answered", "seed {seed}: {v}");
}
