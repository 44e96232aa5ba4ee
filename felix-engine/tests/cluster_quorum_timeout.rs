//! A quorum publish its leader's followers never confirm is answered `quorum_timeout`, and
//! the answer is counted among the errors sent (`Metrics::errors`), as every other refusal:
//! the conformance fixture's evidence of `error.quorum_timeout_is_outcome_unknown` is that
//! count (docs/conformance.md). Three durable nodes on felix-testkit's `ClusterNet`.

use felix_engine::{DurableConfig, EngineConfig, FsyncPolicy};
use felix_proto::binary::{AckResult, PublishAck};
use felix_proto::ErrorCode;
use felix_testkit::*;

const SHARDS: u32 = 3;

fn durable(_: usize, cfg: &mut EngineConfig) {
    let mut d = DurableConfig::default();
    d.fsync = FsyncPolicy::OnCommit;
    cfg.durable = Some(d);
}

#[test]
fn a_quorum_publish_nobody_confirms_is_answered_and_counted_quorum_timeout() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let (_, shard, leader, _) = c.shard_led_off_control(SHARDS);
    assert_eq!(c.publish_acked(leader, (SHARDS, shard), 1, b"confirmed"), 0);
    for other in (0..3).filter(|&i| i != leader) {
        c.cut_both(leader, other, true);
    }
    let answer = c.request(
        leader,
        &binary_publish(
            Some(2),
            Some(&key_for_shard(SHARDS, shard)),
            "orders",
            &[b"unconfirmed".as_slice()],
        ),
    );
    let a = PublishAck::decode(answer.flags, &answer.payload).expect("a binary ack");
    assert!(
        matches!(
            &a.result,
            AckResult::Err {
                code: Some((ErrorCode::QuorumTimeout, _)),
                ..
            }
        ),
        "{a:?}"
    );
    let errors = c.nodes[leader].engine.metrics().errors;
    assert_eq!(errors.get("quorum_timeout"), Some(&1), "{errors:?}");
}
