//! A follower whose copy cannot be fed from its own log end is rebuilt from its leader's
//! retained log: one whose disk was wiped (a new storage identity), and one whose log ends
//! below the first offset the leader still keeps. Once level it counts again: with the
//! other follower stopped, quorum writes still commit; and once the metadata records the
//! new disk, the next leader's fence counts it. Three durable nodes on
//! felix-testkit's `ClusterNet` and its virtual clock; one stream of three shards with three
//! copies at quorum consistency.

use std::time::Duration;

use felix_cluster::meta::{Metadata, ObjectKey, ObjectKind, ShardRef};
use felix_cluster::NodeId;
use felix_engine::{DurableConfig, EngineConfig, FsyncPolicy};
use felix_storage::memfs::MemFs;
use felix_testkit::*;

const SHARDS: u32 = 3;

fn durable(_: usize, cfg: &mut EngineConfig) {
    let mut d = DurableConfig::default();
    d.fsync = FsyncPolicy::OnCommit;
    cfg.durable = Some(d);
}

/// Small segments and a small size bound, checked often: a leader's log start moves up
/// while a follower is away.
fn durable_trimmed(_: usize, cfg: &mut EngineConfig) {
    let mut d = DurableConfig::default();
    d.fsync = FsyncPolicy::OnCommit;
    d.segment_max_bytes = 2048;
    d.retention_bytes = Some(4096);
    d.retention_check_interval = Duration::from_millis(100);
    cfg.durable = Some(d);
}

/// One entry of a shard's log on a node's disk: its first offset and its bytes.
type Entry = (u64, Vec<u8>);

/// The entries of `shard`'s log on `disk`, in offset order (the bytes the leader shipped).
fn log_on(disk: &MemFs, shard: u32) -> Vec<Entry> {
    shard_log_on(disk, "orders", shard)
}

/// The control plane's leader, a shard it leads, and that shard's two followers: stopping
/// a follower then leaves the control plane a majority of its own.
fn layout(c: &mut ClusterNet) -> (u32, usize, usize, usize) {
    let control = c.control_leader();
    let shard = (0..SHARDS)
        .find(|&s| c.orders_leader(control, s).0 == Some(control))
        .expect("leaders are balanced: the control plane's node leads a shard");
    c.until(Duration::from_secs(10), |c| c.writable(control, shard));
    let mut others = (0..c.nodes.len()).filter(|&i| i != control);
    let (rebuilt, other) = (others.next().unwrap(), others.next().unwrap());
    (shard, control, rebuilt, other)
}

/// The disk the metadata, as node `at` has it, records for `node`'s copy of `shard`, and
/// whether that is the disk `node` has now: fences and promotions count the copy only then.
fn recorded_disk(c: &ClusterNet, at: usize, node: usize, shard: u32) -> (String, bool) {
    let view = c.nodes[at].engine.cluster_view().expect("a cluster node");
    let meta = Metadata::restore(&view.metadata_bytes()).expect("a metadata snapshot");
    let r = ShardRef {
        kind: ObjectKind::Stream,
        key: ObjectKey::new("t1", "default", "orders"),
        shard,
    };
    let node = NodeId::new(&c.ids[node]);
    let m = meta.shard(&r).expect("the shard is placed");
    let disk = m.storage_of(&node).unwrap_or("").to_owned();
    (disk, m.holds_copy(&node, &meta.members))
}

/// Whether the metadata at `at` records `node`'s copy on a disk other than `old`, and that
/// disk is the node's now.
fn recorded_anew(c: &ClusterNet, at: usize, node: usize, shard: u32, old: &str) -> bool {
    let (disk, holds) = recorded_disk(c, at, node, shard);
    holds && disk != old
}

/// Whether `follower` holds, entry for entry, the leader's log from the leader's start
/// (its start follows the leader's once told, and may lag it until then).
fn level(c: &ClusterNet, leader: usize, follower: usize, shard: u32) -> bool {
    let theirs = log_on(&c.nodes[leader].disk, shard);
    let Some(start) = theirs.first().map(|e| e.0) else {
        return false;
    };
    let mut ours = log_on(&c.nodes[follower].disk, shard);
    ours.retain(|e| e.0 >= start);
    ours == theirs
}

/// Publishes `size` bytes (a letter chosen by `request_id`) to `shard` through node `at`
/// and waits for its ack: the offset it was written at.
fn publish(c: &mut ClusterNet, at: usize, shard: u32, request_id: u64, size: usize) -> u64 {
    let payload = vec![b'a' + (request_id % 26) as u8; size];
    c.publish_acked(at, (SHARDS, shard), request_id, &payload)
}

#[test]
fn a_wiped_follower_is_rebuilt_from_its_leader_and_counts_for_the_quorum_once_level() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let (shard, leader, wiped, other) = layout(&mut c);
    for i in 0..5 {
        assert_eq!(publish(&mut c, leader, shard, i, 100), i);
    }
    let (old_disk, recorded) = recorded_disk(&c, leader, wiped, shard);
    assert!(recorded);
    c.restart_wiped(wiped, &spec, durable);
    for i in 5..10 {
        assert_eq!(publish(&mut c, leader, shard, i, 100), i);
    }
    c.until(Duration::from_secs(20), |c| level(c, leader, wiped, shard));
    assert_eq!(log_on(&c.nodes[wiped].disk, shard).len(), 10);
    // Level, it is recorded on its new disk, for the fences of later generations.
    c.until(Duration::from_secs(10), |c| {
        recorded_anew(c, leader, wiped, shard, &old_disk)
    });

    // The rebuilt copy and the leader are a majority on their own.
    c.freeze(other);
    for i in 10..13 {
        assert_eq!(publish(&mut c, leader, shard, i, 100), i);
    }
    assert!(level(&c, leader, wiped, shard));
}

#[test]
fn a_rebuilt_copy_once_recorded_counts_in_the_next_leaders_fence() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let (shard, leader, wiped, other) = layout(&mut c);
    for i in 0..5 {
        assert_eq!(publish(&mut c, leader, shard, i, 100), i);
    }
    let (old_disk, _) = recorded_disk(&c, other, wiped, shard);
    c.restart_wiped(wiped, &spec, durable);
    for i in 5..8 {
        assert_eq!(publish(&mut c, leader, shard, i, 100), i);
    }
    c.until(Duration::from_secs(20), |c| {
        level(c, leader, wiped, shard) && recorded_anew(c, other, wiped, shard, &old_disk)
    });
    let (_, generation) = c.orders_leader(other, shard);
    // The leader stops. The next one, whichever survivor it is, opens only once a majority
    // of the set has taken its fence from the disks the metadata names: itself and the
    // other survivor, which counts only because its new disk was recorded.
    c.freeze(leader);
    let next_leader = |c: &ClusterNet| {
        let (l, g) = c.orders_leader(other, shard);
        l.filter(|&l| g > generation && l != leader && c.writable(l, shard))
    };
    c.until(Duration::from_secs(30), |c| next_leader(c).is_some());
    let next = next_leader(&c).unwrap();
    assert_eq!(publish(&mut c, next, shard, 8, 100), 8);
    // Nothing acknowledged was lost on the way.
    let survivor = if next == wiped { other } else { wiped };
    c.until(Duration::from_secs(10), |c| level(c, next, survivor, shard));
    assert_eq!(log_on(&c.nodes[next].disk, shard).len(), 9);
}

#[test]
fn a_leader_back_on_an_empty_disk_never_opens_the_shard_it_was_named_for() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    // A shard led off the control plane's node; the control plane's node is a follower.
    let (control, shard, leader, generation) = c.shard_led_off_control(SHARDS);
    let third = (0..3).find(|&i| i != leader && i != control).unwrap();
    // The control plane's node falls behind on this shard: the leader and the third node
    // commit alone.
    c.cut_both(leader, control, true);
    for i in 0..5 {
        assert_eq!(publish(&mut c, leader, shard, i, 100), i);
    }
    // The leader comes back at once on an empty disk, reaching only the follower that is
    // behind. Named leader still, it must not fence with that one and open its short log.
    c.cut_both(leader, control, false);
    c.cut_both(leader, third, true);
    c.restart_wiped(leader, &spec, durable);
    let moved = |c: &ClusterNet| {
        let (l, g) = c.orders_leader(control, shard);
        l.filter(|&l| g > generation && l != leader && c.writable(l, shard))
    };
    c.until(Duration::from_secs(30), |c| {
        assert!(
            !c.writable(leader, shard),
            "the wiped node opened the shard it holds nothing of"
        );
        moved(c).is_some()
    });
    let next = moved(&c).unwrap();
    assert_eq!(
        publish(&mut c, next, shard, 5, 100),
        5,
        "every acknowledged record is still there"
    );
}

#[test]
fn a_follower_behind_its_leaders_log_start_is_rebuilt_from_that_start() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable_trimmed);
    let (shard, leader, behind, other) = layout(&mut c);
    for i in 0..3 {
        assert_eq!(publish(&mut c, leader, shard, i, 500), i);
    }
    c.until(Duration::from_secs(10), |c| level(c, leader, behind, shard));
    // Cut off while the leader writes and retention drops the leader's oldest segments
    // (what was shipped is lost with the links), then restarted on its own disk.
    let n = c.nodes.len();
    for i in (0..n).filter(|&i| i != behind) {
        c.cut.insert((i, behind));
        c.cut.insert((behind, i));
    }
    for i in 3..30 {
        assert_eq!(publish(&mut c, leader, shard, i, 500), i);
    }
    let behind_end = log_on(&c.nodes[behind].disk, shard)
        .last()
        .map_or(0, |e| e.0 + 1);
    c.until(Duration::from_secs(10), |c| {
        log_on(&c.nodes[leader].disk, shard)
            .first()
            .is_some_and(|e| e.0 > behind_end)
    });
    c.restart(behind, &spec, durable_trimmed);
    c.cut.clear();
    c.until(Duration::from_secs(20), |c| level(c, leader, behind, shard));

    c.freeze(other);
    for i in 30..33 {
        assert_eq!(publish(&mut c, leader, shard, i, 500), i);
    }
    assert!(level(&c, leader, behind, shard));
}
