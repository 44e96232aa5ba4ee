//! A stream's own retention on every copy: after an `alter` sets it, the leader decides
//! the cut and its followers start their copies at exactly the leader's log start, though
//! each node rolls its segments at other offsets (each has another segment size); after the
//! leader stops, the copy promoted serves from the same start and its cuts are followed. Three
//! durable nodes on felix-testkit's `ClusterNet` and its virtual clock; one stream of
//! three shards with three copies at quorum consistency; no broker-wide retention.

use std::time::Duration;

use felix_engine::{DurableConfig, EngineConfig, FsyncPolicy};
use felix_testkit::*;

const SHARDS: u32 = 3;
const NAMES: (&str, &str, &str) = ("t1", "default", "orders");

/// Durable, no broker-wide retention, checked often; segments of another size on each node.
fn durable(i: usize, cfg: &mut EngineConfig) {
    let mut d = DurableConfig::default();
    d.fsync = FsyncPolicy::OnCommit;
    d.segment_max_bytes = [2048, 3000, 1500][i];
    d.retention_check_interval = Duration::from_millis(100);
    cfg.durable = Some(d);
}

/// Where node `at`'s copy of `shard` starts and ends, as its admin view says.
fn bounds(c: &ClusterNet, at: usize, shard: u32) -> Option<(u64, u64)> {
    let view = c.nodes[at].engine.stream_view(c.now, None, NAMES).ok()?;
    let here = view.shards[shard as usize].here?;
    Some((here.log_start, here.log_end))
}

fn starts(c: &ClusterNet, shard: u32) -> Vec<Option<u64>> {
    (0..c.nodes.len())
        .map(|i| bounds(c, i, shard).map(|b| b.0))
        .collect()
}

/// The log start in `shard`'s replica state file on `disk`.
fn replica_log_start(disk: &felix_storage::memfs::MemFs, shard: u32) -> Option<u64> {
    let dir = felix_storage::layout::stream_shard_dir("t1", "default", "orders", shard);
    let path = felix_storage::layout::join(&dir, felix_storage::replica_state::REPLICA_STATE_FILE);
    let bytes = disk.file(&path)?;
    felix_storage::replica_state::ReplicaState::decode(bytes)
        .ok()
        .map(|s| s.log_start)
}

fn publish_many(c: &mut ClusterNet, leader: usize, shard: u32, ids: std::ops::Range<u64>) {
    for i in ids {
        let payload = vec![b'a' + (i % 26) as u8; 500];
        assert_eq!(c.publish_acked(leader, (SHARDS, shard), i, &payload), i);
    }
}

#[test]
fn after_an_alter_every_copy_starts_where_its_leader_cut() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let control = c.control_leader();
    let shard = (0..SHARDS)
        .find(|&s| c.orders_leader(control, s).0 == Some(control))
        .expect("the control plane's node leads a shard");
    c.until(Duration::from_secs(10), |c| c.writable(control, shard));
    let leader = control;
    publish_many(&mut c, leader, shard, 0..30);
    c.until(Duration::from_secs(10), |c| {
        (0..3).all(|i| bounds(c, i, shard).is_some_and(|b| b.1 == 30))
    });
    // No retention anywhere yet: every copy keeps everything.
    c.advance(Duration::from_secs(1));
    assert_eq!(starts(&c, shard), vec![Some(0); 3]);

    // The alter, through a follower: keep 4 KiB.
    let at = (0..3).find(|&i| i != leader).unwrap();
    let token = c.nodes[at].token();
    let retention = felix_engine::stream_admin::Retention {
        max_age_seconds: None,
        max_bytes: Some(4096),
    };
    let now = c.now;
    let asked = c.nodes[at]
        .engine
        .alter_stream_as(now, &token, NAMES, retention);
    assert_eq!(asked, Ok(false), "asked of the control plane");
    c.until(Duration::from_secs(10), |c| {
        let s = starts(c, shard);
        s[leader].is_some_and(|l| l > 0) && s.iter().all(|x| *x == s[leader])
    });
    let first = starts(&c, shard)[leader].unwrap();
    // The leader cut on one of its own segment bases; the others hold a segment that
    // straddles it (their segments end elsewhere) yet start at the same offset.
    let on_disk = |c: &ClusterNet, i: usize| {
        shard_log_on(&c.nodes[i].disk, "orders", shard)
            .first()
            .map(|e| e.0)
    };
    assert_eq!(on_disk(&c, leader), Some(first));
    for i in (0..3).filter(|&i| i != leader) {
        assert!(on_disk(&c, i).is_some_and(|o| o <= first), "node {i}");
    }

    // A follower restarted alone (its links cut, so its leader cannot tell it again) still
    // starts where its leader cut: the start it was told is in its replica state file.
    let follower = (0..3).find(|&i| i != leader && i != at).unwrap();
    c.until(Duration::from_secs(5), |c| {
        let disk = &c.nodes[follower].disk;
        replica_log_start(disk, shard) == Some(first)
    });
    for i in (0..3).filter(|&i| i != follower) {
        c.cut_both(i, follower, true);
    }
    c.restart(follower, &spec, durable);
    c.until(Duration::from_secs(10), |c| {
        bounds(c, follower, shard).is_some()
    });
    assert_eq!(starts(&c, shard)[follower], Some(first));
    for i in (0..3).filter(|&i| i != follower) {
        c.cut_both(i, follower, false);
    }

    // Later cuts are followed too.
    publish_many(&mut c, leader, shard, 30..60);
    c.until(Duration::from_secs(10), |c| {
        let s = starts(c, shard);
        s[leader].is_some_and(|l| l > first) && s.iter().all(|x| *x == s[leader])
    });
    // And they stay level: a follower never cuts past its leader on its own.
    c.advance(Duration::from_secs(2));
    let s = starts(&c, shard);
    assert!(s.iter().all(|x| *x == s[leader]), "{s:?}");

    // The leader stops: the copy promoted serves from the same start (it never serves what
    // the old leader dropped), and cuts for the one left from there.
    let old_start = s[leader].unwrap();
    c.freeze(leader);
    let other = (0..3).find(|&i| i != leader).unwrap();
    c.until(Duration::from_secs(30), |c| {
        let (l, _) = c.orders_leader(other, shard);
        l.is_some_and(|l| l != leader && c.writable(l, shard))
    });
    let next = c.orders_leader(other, shard).0.unwrap();
    assert_eq!(starts(&c, shard)[next], Some(old_start));
    publish_many(&mut c, next, shard, 60..90);
    let live: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    c.until(Duration::from_secs(10), |c| {
        let s = starts(c, shard);
        s[next].is_some_and(|l| l > old_start) && live.iter().all(|&i| s[i] == s[next])
    });
}
