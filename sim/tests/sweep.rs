//! A small seed sweep passes every invariant (the CI budget; the long sweep is
//! `cargo run --release -p felix-sim -- --seeds 0..10000`, see docs/simulator.md).

use felix_sim::{run, RunOptions};

#[test]
fn a_small_sweep_passes() {
    for seed in 0..12 {
        let outcome = run(&RunOptions::seed(seed));
        if let Some(v) = &outcome.violation {
            panic!(
                "seed {seed}: {v}\nreplay (same build profile as this test): cargo run -p felix-sim -- --seed {seed} --verbose\n{}",
                outcome.summary
            );
        }
    }
}

/// Seeds that once found something, kept so it stays fixed (see docs/simulator.md).
#[test]
fn regression_seeds_pass() {
    for seed in [135, 375, 832, 3322] {
        let outcome = run(&RunOptions::seed(seed));
        assert_eq!(outcome.violation, None, "seed {seed}: {}", outcome.summary);
    }
}
