//! A node's readiness (`/readyz`, `Engine::is_serving`) after a start waits until every copy
//! placed on it has caught up with its leader, not only until it has joined: a rolling
//! restart that takes the next node down as soon as the previous one answers ready would
//! otherwise leave a shard's records on fewer copies than it has replicas. Three durable nodes
//! on felix-testkit's `ClusterNet` and its virtual clock; three shards with three copies at
//! quorum consistency.

use std::time::Duration;

use felix_engine::{DurableConfig, EngineConfig};
use felix_testkit::*;

const SHARDS: u32 = 3;
const RECORDS: u64 = 5;

fn durable(_: usize, cfg: &mut EngineConfig) {
    cfg.durable = Some(DurableConfig::default());
}

fn role_of(c: &ClusterNet, node: usize, shard: u32) -> &'static str {
    let view = c.nodes[node].engine.cluster_view().expect("a cluster node");
    view.replicas()
        .iter()
        .find(|r| r.shard == shard && r.object.starts_with("stream:"))
        .map_or("none", |r| r.role)
}

#[test]
fn a_restarted_node_is_ready_only_once_its_copies_hold_what_their_leaders_held() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let (control, shard, leader, _) = c.shard_led_off_control(SHARDS);
    let follower = (0..3).find(|&i| i != control && i != leader).unwrap();

    // The follower misses records its shard's leader acknowledges with the control plane's
    // node, then restarts still cut off from that leader (but not from the control plane).
    c.cut_both(follower, leader, true);
    for request in 1..=RECORDS {
        c.publish_acked(leader, (SHARDS, shard), request, b"missed");
    }
    c.restart(follower, &spec, durable);
    c.advance(Duration::from_secs(5));
    assert_eq!(
        role_of(&c, follower, shard),
        "asking",
        "its copy is not fed"
    );
    assert!(
        !c.nodes[follower].engine.is_serving(),
        "joined and leased through the control plane, but a copy is behind: not ready"
    );

    c.cut_both(follower, leader, false);
    c.until(Duration::from_secs(10), |c| {
        c.nodes[follower].engine.is_serving()
    });
    assert!(
        shard_log_on(&c.nodes[follower].disk, "orders", shard).len() as u64 >= RECORDS,
        "ready only once the copy holds what its leader held when it was fed"
    );
}
