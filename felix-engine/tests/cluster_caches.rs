//! A cache declared with three copies keeps its values and counters through the loss of its
//! leader: its values log and counter log are shipped to its followers, and the next leader
//! rebuilds its index and sums from its copies. Three durable nodes on felix-testkit's
//! `ClusterNet` and its virtual clock.

use std::time::Duration;

use felix_engine::{DeclaredCache, DurableConfig, EngineConfig, FsyncPolicy};
use felix_testkit::*;
use serde_json::Value;

fn durable(_: usize, cfg: &mut EngineConfig) {
    let mut d = DurableConfig::default();
    d.fsync = FsyncPolicy::OnCommit;
    cfg.durable = Some(d);
}

fn spec() -> ClusterSpec {
    let mut s = ClusterSpec::default();
    s.caches
        .push(DeclaredCache::new("t1", "default", "sessions", 3));
    s
}

/// The cache's leader and generation as node `at` sees them.
fn cache_leader(c: &ClusterNet, at: usize) -> (Option<usize>, u64) {
    let view = c.nodes[at].engine.cluster_view().expect("a cluster node");
    let s = view
        .shard_leaders()
        .into_iter()
        .find(|s| s.object == "cache:t1/default/sessions" && s.shard == 0)
        .expect("the cache is placed");
    (s.leader.map(|l| c.index(&l)), s.generation)
}

/// The followers the cache's leader had the cluster record as level with it.
fn quiet_level(c: &ClusterNet, at: usize) -> Vec<String> {
    let view = c.nodes[at].engine.cluster_view().expect("a cluster node");
    view.shard_leaders()
        .into_iter()
        .find(|s| s.object == "cache:t1/default/sessions" && s.shard == 0)
        .map(|s| s.quiet_level)
        .unwrap_or_default()
}

/// Sends one cache request (`body` without its scope) to node `at` and waits (virtual time)
/// for the answer.
fn ask(c: &mut ClusterNet, at: usize, body: &str) -> Value {
    let json = format!(r#"{{"tenant_id":"t1","namespace":"default","cache":"sessions",{body}}}"#);
    let answer = c.request(at, &json_frame(&json));
    serde_json::from_str(text(&answer)).expect("a JSON answer")
}

fn put(c: &mut ClusterNet, at: usize, key: &str, value_b64: &str) {
    let body = format!(
        r#""type":"cache_put","key":"{key}","value":"{value_b64}","request_id":1,"ttl_ms":null"#
    );
    let answer = ask(c, at, &body);
    assert_eq!(answer["type"], "cache_ok", "put {key}: {answer}");
}

fn get(c: &mut ClusterNet, at: usize, key: &str) -> Value {
    let answer = ask(
        c,
        at,
        &format!(r#""type":"cache_get","key":"{key}","request_id":2"#),
    );
    answer["value"].clone()
}

fn add(c: &mut ClusterNet, at: usize, key: &str, delta: i64) -> Value {
    let body = format!(r#""type":"counter_add","key":"{key}","delta":{delta},"request_id":3"#);
    ask(c, at, &body)["value"].clone()
}

#[test]
fn a_caches_values_and_counters_survive_the_loss_of_its_leader() {
    let mut c = ClusterNet::started(&spec(), durable);
    let control = c.control_leader();
    let (leader, generation) = cache_leader(&c, control);
    let leader = leader.expect("a leader");
    // The cache led off the control plane's node, so stopping its leader leaves the control
    // plane its leader; else the test stops the other way round (control plane and cache
    // together), which it survives as well.
    let ask_at = (0..3).find(|&i| i != leader).unwrap();
    put(&mut c, ask_at, "a", "djE="); // v1
    put(&mut c, ask_at, "b", "djI="); // v2
    put(&mut c, ask_at, "a", "djM="); // v3
    let del = ask(
        &mut c,
        ask_at,
        r#""type":"cache_delete","key":"b","request_id":4"#,
    );
    assert!(del["type"] != "error", "{del}");
    assert_eq!(add(&mut c, ask_at, "n", 5), 5);
    assert_eq!(add(&mut c, ask_at, "n", -2), 3);
    // Both logs reach both followers (leader consistency: the acks did not wait for them):
    // the leader's lag on each is 0.
    c.until(Duration::from_secs(10), |c| {
        let lag = c.nodes[leader].engine.metrics().replication_lag_records;
        let level = |label: &str| lag.iter().any(|(l, n)| l == label && *n == 0);
        level("t1/default/sessions#0") && level("t1/default/sessions#0/counters")
    });
    // A `leader` shard passes on only to a follower its leader had the cluster record as
    // level with it, after `leader_quiet_after` without writes (docs/replication.md, "Who
    // may lead a `leader` shard").
    c.until(Duration::from_secs(10), |c| {
        quiet_level(c, ask_at).len() == 2
    });

    c.freeze(leader);
    let next_leader = |c: &ClusterNet| {
        let (l, g) = cache_leader(c, ask_at);
        l.filter(|&l| g > generation && l != leader)
    };
    c.until(Duration::from_secs(30), |c| next_leader(c).is_some());
    let next = next_leader(&c).unwrap();
    assert_eq!(get(&mut c, next, "a"), "djM=", "the last write of a");
    assert_eq!(get(&mut c, next, "b"), Value::Null, "b stays deleted");
    assert_eq!(add(&mut c, next, "n", 1), 4, "the sum goes on from 3");
}
