//! A small seed sweep passes every invariant (the CI budget; the long sweep is
//! `cargo run --release -p felix-sim -- --seeds 0..10000`, see docs/simulator.md).

use felix_sim::{run, RunOptions};

#[test]
fn a_small_sweep_passes() {
    let mut claims_checked = 0;
    for seed in 0..12 {
        let outcome = run(&RunOptions::seed(seed));
        claims_checked += outcome.group_claims_checked;
        if let Some(v) = &outcome.violation {
            panic!(
                "seed {seed}: {v}\nreplay (same build profile as this test): cargo run -p felix-sim -- --seed {seed} --verbose\n{}",
                outcome.summary
            );
        }
    }
    // The group invariant judged something: a workload that stopped polling would pass
    // it vacuously.
    assert!(
        claims_checked > 0,
        "no group handout was checked in 12 seeds"
    );
}

/// Seeds that once found something, kept so it stays fixed (see docs/simulator.md).
#[test]
fn regression_seeds_pass() {
    for seed in [135, 375, 832, 3322] {
        let outcome = run(&RunOptions::seed(seed));
        assert_eq!(outcome.violation, None, "seed {seed}: {}", outcome.summary);
    }
}
