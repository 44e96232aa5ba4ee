//! A shard's leader ships a record once written, while it syncs its own copy. A follower can
//! then hold a record its leader loses in a power cut. The leader comes back at the next
//! generation (`Command::Reopen`), never at the one it wrote that record at, so the epochs
//! tell the follower's copy apart from what the leader writes at the same offset later, and
//! the follower is cut and fed again. Three durable nodes on felix-testkit's `ClusterNet`
//! and its virtual clock; one stream of three shards with three copies at quorum consistency.

use std::time::Duration;

use felix_engine::{DurableConfig, EngineConfig, FsyncPolicy};
use felix_storage::memfs::Crash;
use felix_storage::ops::FileOpKind;
use felix_testkit::*;

const SHARDS: u32 = 3;

fn durable(_: usize, cfg: &mut EngineConfig) {
    let mut d = DurableConfig::default();
    d.fsync = FsyncPolicy::OnCommit;
    cfg.durable = Some(d);
}

fn log_of(c: &ClusterNet, node: usize, shard: u32) -> Vec<(u64, Vec<u8>)> {
    shard_log_on(&c.nodes[node].disk, "orders", shard)
}

#[test]
fn a_record_shipped_before_its_leader_lost_it_is_cut_from_the_follower_that_took_it() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let (control, shard, leader, generation) = c.shard_led_off_control(SHARDS);
    // `took` receives the doomed record; the control plane's node does not.
    let took = (0..3).find(|&i| i != leader && i != control).unwrap();
    assert_eq!(c.publish_acked(leader, (SHARDS, shard), 1, b"kept"), 0);

    // The leader's syncs stall: the next write lands in its page cache and is shipped to
    // `took` alone, which syncs it; then the leader loses power, and the record with it.
    c.cut.insert((leader, control));
    let p = c.connect(leader);
    let (id, _) = c.auth_stream(leader, p);
    c.nodes[leader].hold = |op| matches!(op, FileOpKind::Sync { .. });
    let key = key_for_shard(SHARDS, shard);
    let frame = binary_publish(Some(2), Some(&key), "orders", &[b"lost".as_slice()]);
    c.nodes[leader].send(p, id, &frame);
    c.until(Duration::from_secs(5), |c| {
        log_of(c, took, shard).len() == 2
    });
    assert!(
        c.nodes[leader].read_frames(p, id).is_empty(),
        "never acknowledged"
    );
    c.nodes[leader].disk.crash(Crash::Power);
    assert_eq!(log_of(&c, leader, shard).len(), 1, "the leader lost it");

    // Back, it reaches only the control plane's node: it leads on at the next generation,
    // with that node as its majority, and writes a different record at the same offset.
    c.cut_both(leader, took, true);
    c.cut.remove(&(leader, control));
    c.restart(leader, &spec, durable);
    c.until(Duration::from_secs(30), |c| {
        c.orders_leader(control, shard).0 == Some(leader) && c.writable(leader, shard)
    });
    assert_eq!(c.publish_acked(leader, (SHARDS, shard), 3, b"new"), 1);
    assert_eq!(
        c.orders_leader(control, shard),
        (Some(leader), generation + 1),
        "it leads on at the next generation"
    );

    // The follower that took the lost record rejoins: cut where the generations part, and
    // fed the leader's record at offset 1. Every copy ends the same, byte for byte.
    c.cut_both(leader, took, false);
    c.until(Duration::from_secs(30), |c| {
        let lead = log_of(c, leader, shard);
        lead.len() == 2 && log_of(c, took, shard) == lead && log_of(c, control, shard) == lead
    });
}
