//! A shard leader whose process is replaced (killed and started again on its disk) before
//! its lease ran out leads the shard again at the same generation, and its followers, which
//! thought themselves fed, are fed again: writes after the restart reach a quorum. Its peers
//! learn of the new process from its hello and drop the links they had dialed to the old
//! one (which QUIC would have kept until its idle timer). Three durable nodes on
//! felix-testkit's `ClusterNet` and its virtual clock; three shards with three copies at
//! quorum consistency.

use std::time::Duration;

use felix_engine::{Consistency, DeclaredStream, DurableConfig, EngineConfig};
use felix_proto::binary::{AckResult, PublishAck};
use felix_testkit::*;

const SHARDS: u32 = 3;

fn spec() -> ClusterSpec {
    let mut s = ClusterSpec::default();
    let mut d = DeclaredStream::new("t1", "default", "orders", SHARDS);
    d.replication_factor = 3;
    d.consistency = Consistency::Quorum;
    s.streams.push(d);
    s
}

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

/// Publishes one record on `shard` through node `at` and waits (virtual time, bounded) for
/// its ack: the offset it was written at.
fn publish(c: &mut ClusterNet, at: usize, shard: u32, request_id: u64) -> u64 {
    let p = c.connect(at);
    let (id, _) = c.auth_stream(at, p);
    let key = key_for_shard(SHARDS, shard);
    let frame = binary_publish(Some(request_id), Some(&key), "orders", &[b"r"]);
    let mut answer = c.exchange(at, p, id, &frame);
    let start = c.now;
    while answer.is_empty() {
        assert!(
            c.now - start < Duration::from_secs(20),
            "publish {request_id} never answered"
        );
        c.advance(Duration::from_millis(10));
        answer = c.nodes[at].read_frames(p, id);
    }
    let a = PublishAck::decode(answer[0].flags, &answer[0].payload).expect("a binary ack");
    match a.result {
        AckResult::Ok { offset, .. } => offset.expect("an offset"),
        other => panic!("publish {request_id} refused: {other:?}"),
    }
}

#[test]
fn a_leader_restarted_within_its_lease_feeds_its_followers_again() {
    let spec = spec();
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
    assert_eq!(publish(&mut c, leader, shard, 1), 0);

    c.restart(leader, &spec, durable);
    c.until(Duration::from_secs(10), |c| c.writable(leader, shard));
    assert_eq!(
        leader_of(&c, control, shard),
        (Some(leader), generation),
        "the restarted node leads again at the same generation"
    );
    assert_eq!(
        publish(&mut c, leader, shard, 2),
        1,
        "a write after the restart reaches a quorum"
    );
}
