//! The cache-watch invariant can fail: with one put change dropped on its way to a watcher,
//! a run must report `watch_gapless` within a few seeds.

use felix_sim::{run, Canary, RunOptions};

#[test]
fn a_silently_dropped_watch_change_is_caught() {
    let caught = (0..8).find_map(|seed| {
        run(&RunOptions {
            seed,
            verbose: false,
            canary: Some(Canary::DropWatchChange),
            majority_crashes: false,
            replicated: false,
            wipe_disks: false,
            leader_consistency: false,
            admin_ops: false,
        })
        .violation
        .map(|v| (seed, v))
    });
    let (seed, v) = caught.expect("the canary went unnoticed");
    assert_eq!(v.invariant, "watch_gapless", "seed {seed}: {v}");
}
