use std::time::{Duration, Instant};

use super::*;

const AFTER: Duration = Duration::from_secs(2);

fn view(end: u64, level: &[&str], quiet: Option<u64>, resume: Option<u64>) -> QuietView {
    QuietView {
        end,
        durable_here: true,
        level: level.iter().map(|n| NodeId::new(*n)).collect(),
        recorded_quiet: quiet,
        recorded_resume: resume,
    }
}

fn at(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

#[test]
fn an_idle_leader_with_a_level_follower_asks_once_idle_for_quiet_after_and_holds_from_then() {
    let t0 = Instant::now();
    let mut q = QuietLeader::new(t0, 10, AFTER);
    assert_eq!(q.look(at(t0, 1999), &view(10, &["n2"], None, None)), None);
    assert_eq!(q.held_past(), None);
    let wish = q.look(at(t0, 2000), &view(10, &["n2"], None, None));
    assert_eq!(
        wish,
        Some(QuietWish::Quiesce {
            end: 10,
            level: vec![NodeId::new("n2")]
        })
    );
    // Held from the moment it asks: the quiescence may be applied after a write.
    assert_eq!(q.held_past(), Some(10));
    // Asked again until recorded, then nothing.
    assert!(q
        .look(at(t0, 2100), &view(10, &["n2"], None, None))
        .is_some());
    assert_eq!(
        q.look(at(t0, 2200), &view(10, &["n2"], Some(10), None)),
        None
    );
}

#[test]
fn a_write_restarts_the_idle_clock() {
    let t0 = Instant::now();
    let mut q = QuietLeader::new(t0, 10, AFTER);
    assert_eq!(q.look(at(t0, 1500), &view(11, &["n2"], None, None)), None);
    assert_eq!(q.look(at(t0, 3000), &view(11, &["n2"], None, None)), None);
    assert!(q
        .look(at(t0, 3500), &view(11, &["n2"], None, None))
        .is_some());
}

#[test]
fn no_level_follower_or_an_unsynced_log_means_no_quiescence() {
    let t0 = Instant::now();
    let mut q = QuietLeader::new(t0, 10, AFTER);
    assert_eq!(q.look(at(t0, 5000), &view(10, &[], None, None)), None);
    let mut unsynced = view(10, &["n2"], None, None);
    unsynced.durable_here = false;
    assert_eq!(q.look(at(t0, 5000), &unsynced), None);
    assert_eq!(q.held_past(), None);
}

#[test]
fn a_write_after_asking_resumes_and_is_released_only_once_the_resumption_is_recorded() {
    let t0 = Instant::now();
    let mut q = QuietLeader::new(t0, 10, AFTER);
    q.look(at(t0, 2000), &view(10, &["n2"], None, None));
    // Recorded, then a write arrives (appended at 10, the log now ends at 11).
    q.look(at(t0, 2100), &view(10, &["n2"], Some(10), None));
    let wish = q.look(at(t0, 2200), &view(11, &[], Some(10), None));
    assert_eq!(wish, Some(QuietWish::Resume { end: 10 }));
    assert_eq!(q.held_past(), Some(10));
    // Not yet recorded: asked again, still held.
    assert_eq!(
        q.look(at(t0, 2300), &view(11, &[], Some(10), None)),
        Some(QuietWish::Resume { end: 10 })
    );
    assert_eq!(q.held_past(), Some(10));
    assert_eq!(q.look(at(t0, 2400), &view(11, &[], None, Some(10))), None);
    assert_eq!(q.held_past(), None);
}

#[test]
fn a_quiescence_asked_for_but_not_yet_recorded_is_resumed_from_too() {
    // The write lands between the ask and its application: the resumption makes the
    // quiescence stale whichever of the two the metadata log orders first.
    let t0 = Instant::now();
    let mut q = QuietLeader::new(t0, 10, AFTER);
    q.look(at(t0, 2000), &view(10, &["n2"], None, None));
    assert_eq!(
        q.look(at(t0, 2001), &view(11, &[], None, None)),
        Some(QuietWish::Resume { end: 10 })
    );
    assert_eq!(q.look(at(t0, 2002), &view(11, &[], None, Some(10))), None);
    assert_eq!(q.held_past(), None);
}

#[test]
fn a_quiescence_recorded_before_a_restart_is_resumed_before_anything_is_acknowledged() {
    let t0 = Instant::now();
    let mut q = QuietLeader::new(t0, 10, AFTER);
    assert_eq!(q.look(t0, &view(10, &["n2"], Some(10), None)), None);
    assert_eq!(q.held_past(), Some(10));
    assert_eq!(
        q.look(at(t0, 1), &view(12, &[], Some(10), None)),
        Some(QuietWish::Resume { end: 10 })
    );
}

#[test]
fn after_a_resumption_the_same_end_is_never_asked_for_again() {
    // A resumption at 10 whose write failed leaves the log at 10: a quiescence at 10 would
    // be stale on arrival, so the leader does not ask for one.
    let t0 = Instant::now();
    let mut q = QuietLeader::new(t0, 10, AFTER);
    assert_eq!(
        q.look(at(t0, 9000), &view(10, &["n2"], None, Some(10))),
        None
    );
    assert_eq!(q.held_past(), None);
}
