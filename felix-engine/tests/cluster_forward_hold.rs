//! A forwarded write that reaches its shard's leader while that leader may not write (its
//! lease lapsed) waits there for half the forward timeout, like one sent to it directly,
//! and then ends with a retryable refusal, which the forwarding node passes on: the client
//! learns "not applied, retry" instead of the unknown outcome of a forward timed out.
//! Three durable nodes on felix-testkit's `ClusterNet` and its virtual clock; one shard
//! with three copies at quorum consistency.

use std::time::Duration;

use felix_engine::{DurableConfig, EngineConfig};
use felix_proto::binary::{AckResult, PublishAck};
use felix_proto::ErrorCode;
use felix_testkit::*;

const SHARDS: u32 = 3;

#[test]
fn a_forward_held_by_a_leader_whose_lease_lapsed_is_refused_retryably_before_the_forward_timeout() {
    let mut c = ClusterNet::started(
        &ClusterSpec::quorum_orders(SHARDS),
        |_, cfg: &mut EngineConfig| {
            cfg.durable = Some(DurableConfig::default());
        },
    );
    let control = c.control_leader();
    // Leaders are balanced, one shard each: some shard is led off the control plane's node.
    let shard = (0..SHARDS)
        .find(|&s| c.orders_leader(control, s).0.is_some_and(|l| l != control))
        .expect("a shard led elsewhere");
    let leader = c.orders_leader(control, shard).0.unwrap();
    let entry = (0..3).find(|&i| i != leader && i != control).unwrap();
    c.until(Duration::from_secs(10), |c| c.writable(leader, shard));
    let p = c.connect(entry);
    let (id, _) = c.auth_stream(entry, p);

    // The leader no longer reaches the control plane: its lease runs out, and only later
    // may the control plane name another leader. In between, the entry node still routes
    // to the old one.
    c.cut.insert((leader, control));
    c.cut.insert((control, leader));
    c.until(Duration::from_secs(10), |c| !c.writable(leader, shard));
    assert_eq!(
        c.orders_leader(entry, shard).0,
        Some(leader),
        "the entry node still names the old leader"
    );
    let key = key_for_shard(SHARDS, shard);
    let f = c.exchange(
        entry,
        p,
        id,
        &binary_publish(Some(1), Some(&key), "orders", &[b"r"]),
    );
    assert!(f.is_empty(), "held while the leader may not write: {f:?}");
    let forward_timeout = Duration::from_secs(10);
    let start = c.now;
    let answer = loop {
        let f = c.nodes[entry].read_frames(p, id);
        if !f.is_empty() {
            break f;
        }
        assert!(c.now - start < 2 * forward_timeout, "never answered");
        c.advance(Duration::from_millis(10));
    };
    let waited = c.now - start;
    assert_eq!(answer.len(), 1);
    let a = PublishAck::decode(answer[0].flags, &answer[0].payload).expect("a binary ack");
    assert_eq!(a.request_id, 1);
    match a.result {
        AckResult::Err {
            code: Some((code, _)),
            message,
            ..
        } => assert_eq!(code, ErrorCode::ShardUnavailable, "{message}"),
        other => panic!("expected a coded refusal, got {other:?}"),
    }
    assert!(
        waited < forward_timeout,
        "answered by the leader's hold ({waited:?}), not by the forward timeout"
    );
    assert_eq!(c.nodes[leader].engine.stats().published_records, 0);
}
