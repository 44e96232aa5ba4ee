//! A shard leader whose process is replaced (killed and started again on its disk) before
//! its lease ran out leads the shard again at the same generation, and its followers, which
//! thought themselves fed, are fed again: writes after the restart reach a quorum. Its peers
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

/// The shard's leader and generation as node `at` knows them.
fn leader_of(c: &ClusterNet, at: usize, shard: u32) -> (Option<usize>, u64) {
    let view = c.nodes[at].engine.cluster_view().expect("a cluster node");
    let s = view
        .shard_leaders()
        .into_iter()
        .find(|s| s.object == "stream:t1/default/orders" && s.shard == shard)
        .expect("the shard is placed");
    (s.leader.map(|l| c.index(&l)), s.generation)
}

#[test]
fn a_leader_restarted_within_its_lease_feeds_its_followers_again() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let control = {
        let view = c.nodes[0].engine.cluster_view().expect("a cluster node");
        c.index(view.raft_leader().expect("an elected control plane"))
    };
    // Leaders are balanced, one shard each: some shard is led off the control plane's node,
    // so the restart leaves the control plane alone.
    let shard = (0..SHARDS)
        .find(|&s| leader_of(&c, control, s).0.is_some_and(|l| l != control))
        .expect("a shard led elsewhere");
    let (leader, generation) = leader_of(&c, control, shard);
    let leader = leader.unwrap();
    c.until(Duration::from_secs(10), |c| c.writable(leader, shard));
    assert_eq!(c.publish_acked(leader, (SHARDS, shard), 1, b"r"), 0);

    c.restart(leader, &spec, durable);
    c.until(Duration::from_secs(10), |c| c.writable(leader, shard));
    assert_eq!(
        leader_of(&c, control, shard),
        (Some(leader), generation),
        "the restarted node leads again at the same generation"
    );
    assert_eq!(
        c.publish_acked(leader, (SHARDS, shard), 2, b"r"),
        1,
        "a write after the restart reaches a quorum"
    );
}
