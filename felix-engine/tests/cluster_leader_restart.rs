//! A shard leader whose process is replaced (killed and started again on its disk) before
//! its lease ran out leads the shard again, at the next generation (it never opens one
//! twice: it shipped records before syncing them, which its disk may have lost), and its
//! followers, which thought themselves fed, are fed again: writes after the restart reach a
//! quorum. Its peers
//! learn of the new process from its hello and drop the links they had dialed to the old
//! one (which QUIC would have kept until its idle timer). Three durable nodes on
//! felix-testkit's `ClusterNet` and its virtual clock; three shards with three copies at
//! quorum consistency.

use std::time::Duration;

use felix_engine::{DurableConfig, EngineConfig};
use felix_testkit::*;

const SHARDS: u32 = 3;

fn durable(_: usize, cfg: &mut EngineConfig) {
    cfg.durable = Some(DurableConfig::default());
}

#[test]
fn a_leader_restarted_within_its_lease_feeds_its_followers_again() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    // Some shard is led off the control plane's node, so the restart leaves the control
    // plane alone.
    let (control, shard, leader, generation) = c.shard_led_off_control(SHARDS);
    assert_eq!(c.publish_acked(leader, (SHARDS, shard), 1, b"r"), 0);

    c.restart(leader, &spec, durable);
    c.until(Duration::from_secs(10), |c| c.writable(leader, shard));
    assert_eq!(
        c.orders_leader(control, shard),
        (Some(leader), generation + 1),
        "the restarted node leads again, at the next generation"
    );
    assert_eq!(
        c.publish_acked(leader, (SHARDS, shard), 2, b"r"),
        1,
        "a write after the restart reaches a quorum"
    );
}
