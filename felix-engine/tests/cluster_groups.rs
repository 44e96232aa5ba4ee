//! A replicated stream shard's consumer groups move with it: the shard's group log (cursors,
//! dead letters) is shipped to its followers beside the records, so the next leader serves
//! each group from where it was acknowledged, not from scratch. Three durable nodes on
//! felix-testkit's `ClusterNet` and its virtual clock; one stream of three shards with three
//! copies at quorum consistency.

use std::time::Duration;

use felix_engine::{DurableConfig, EngineConfig, FsyncPolicy};
use felix_testkit::*;
use serde_json::Value;

const SHARDS: u32 = 3;

fn durable(_: usize, cfg: &mut EngineConfig) {
    let mut d = DurableConfig::default();
    d.fsync = FsyncPolicy::OnCommit;
    cfg.durable = Some(d);
}

/// The entries of `shard`'s group log on `disk`, as (first offset, bytes), in offset order.
fn group_log_on(disk: &MemFs, shard: u32) -> Vec<(u64, Vec<u8>)> {
    let dir = format!(
        "{}/t1/default/orders/{shard}",
        felix_storage::layout::GROUPS_DIR
    );
    log_entries_on(disk, &dir)
}

/// Sends one JSON request to node `at` and waits (virtual time) for its answer.
fn ask(c: &mut ClusterNet, at: usize, body: &str) -> Value {
    let answer = c.request(at, &json_frame(body));
    serde_json::from_str(text(&answer)).expect("a JSON answer")
}

fn group_addr(shard: u32) -> String {
    format!(
        r#""tenant_id":"t1","namespace":"default","stream":"orders","shard":{shard},"group":"g""#
    )
}

/// Polls group `g` on `shard` through node `at`: the offsets handed out.
fn poll(c: &mut ClusterNet, at: usize, shard: u32, request_id: u64) -> Vec<u64> {
    let body = format!(
        r#"{{"type":"group_poll",{},"max_records":16,"request_id":{request_id}}}"#,
        group_addr(shard)
    );
    let answer = ask(c, at, &body);
    answer["records"]
        .as_array()
        .unwrap_or_else(|| panic!("group records, not {answer}"))
        .iter()
        .map(|r| r["offset"].as_u64().expect("an offset"))
        .collect()
}

fn ack(c: &mut ClusterNet, at: usize, shard: u32, offset: u64, request_id: u64) {
    let body = format!(
        r#"{{"type":"group_ack",{},"offset":{offset},"request_id":{request_id}}}"#,
        group_addr(shard)
    );
    let answer = ask(c, at, &body);
    assert_eq!(answer["type"], "cache_ok", "ack {offset}: {answer}");
}

#[test]
fn a_groups_acknowledged_cursor_survives_the_loss_of_the_shards_leader() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    // A shard led off the control plane's node, so stopping its leader leaves the control
    // plane its majority and leader.
    let (control, shard, leader, generation) = c.shard_led_off_control(SHARDS);
    for i in 0..6 {
        let payload = [b'a' + i as u8; 16];
        assert_eq!(c.publish_acked(leader, (SHARDS, shard), i, &payload), i);
    }
    assert_eq!(poll(&mut c, leader, shard, 100), (0..6).collect::<Vec<_>>());
    for offset in 0..4 {
        ack(&mut c, leader, shard, offset, 200 + offset);
    }
    // The group log goes to both followers as written.
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    c.until(Duration::from_secs(10), |c| {
        let theirs = group_log_on(&c.nodes[leader].disk, shard);
        !theirs.is_empty()
            && followers
                .iter()
                .all(|&f| group_log_on(&c.nodes[f].disk, shard) == theirs)
    });

    c.freeze(leader);
    let next_leader = |c: &ClusterNet| {
        let (l, g) = c.orders_leader(control, shard);
        l.filter(|&l| g > generation && l != leader && c.writable(l, shard))
    };
    c.until(Duration::from_secs(30), |c| next_leader(c).is_some());
    let next = next_leader(&c).unwrap();
    // A write at the new generation commits everything before it.
    assert_eq!(c.publish_acked(next, (SHARDS, shard), 6, b"after"), 6);
    // The claims of the poll on the old leader lapse with it; what was acknowledged there
    // stays acknowledged: the next leader hands out only the rest.
    assert_eq!(poll(&mut c, next, shard, 300), vec![4, 5, 6]);
}

#[test]
fn a_poll_waiting_on_a_node_that_stops_leading_the_shard_ends() {
    // Polls may wait long here, so an end by the deadline cannot pass for the step-down's.
    let long_waits = |i: usize, cfg: &mut EngineConfig| {
        durable(i, cfg);
        cfg.durable.as_mut().unwrap().groups.max_wait = Duration::from_secs(600);
    };
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, long_waits);
    let (_, shard, leader, generation) = c.shard_led_off_control(SHARDS);
    let p = c.connect(leader);
    let (sid, _) = c.auth_stream(leader, p);
    let body = format!(
        r#"{{"type":"group_poll",{},"max_records":16,"wait_ms":600000,"request_id":7}}"#,
        group_addr(shard)
    );
    let frames = c.exchange(leader, p, sid, &json_frame(&body));
    assert!(frames.is_empty(), "the poll waits: {frames:?}");

    // The leader is cut off; another node leads the shard; the old leader hears of it.
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &o in &others {
        c.cut_both(leader, o, true);
    }
    let moved = |c: &ClusterNet, at: usize| {
        let (l, g) = c.orders_leader(at, shard);
        l.is_some_and(|l| l != leader) && g > generation
    };
    c.until(Duration::from_secs(60), |c| moved(c, others[0]));
    for &o in &others {
        c.cut_both(leader, o, false);
    }
    c.until(Duration::from_secs(60), |c| moved(c, leader));
    let (next, _) = c.orders_leader(leader, shard);
    // A record at the new generation reaches the old leader's copy as a follower's.
    assert_eq!(
        c.publish_acked(next.unwrap(), (SHARDS, shard), 1, b"later"),
        0
    );
    let answer = std::cell::RefCell::new(Vec::new());
    c.until(Duration::from_secs(10), |c| {
        let mut got = answer.borrow_mut();
        got.extend(c.nodes[leader].read_frames(p, sid));
        !got.is_empty()
    });
    let answer: Value = serde_json::from_str(text(&answer.borrow()[0])).expect("JSON");
    // Ended without records: its claims would be the old leadership's, written nowhere.
    assert_eq!(answer["type"], "group_records", "{answer}");
    assert_eq!(answer["records"], serde_json::json!([]), "{answer}");
}
