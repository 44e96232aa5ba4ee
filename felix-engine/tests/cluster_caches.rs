//! A cache declared with three copies keeps its values and counters through the loss of its
//! leader: its values log and counter log are shipped to its followers, and the next leader
//! rebuilds its index and sums from its copies. Three durable nodes on felix-testkit's
//! `ClusterNet` and its virtual clock.

use std::time::Duration;

use felix_engine::{DeclaredCache, DurableConfig, EngineConfig, FsyncPolicy};
use felix_testkit::*;
use quinn_proto::StreamId;
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

/// The cache's values log on node `at`, as shipped entries.
fn values_log(c: &ClusterNet, at: usize) -> Vec<(u64, Vec<u8>)> {
    let dir = felix_storage::layout::cache_shard_dir("t1", "default", "sessions", 0);
    log_entries_on(&c.nodes[at].disk, &dir)
}

#[test]
fn a_follower_copy_takes_no_expiry_deletes_of_its_own() {
    // Only the leader writes a cache's TTL deletes, and ships them. A follower that ran its
    // own expiry pass (armed by recovery after a restart) would append deletes the leader
    // never wrote: its copy would diverge from the leader's at those offsets.
    let mut c = ClusterNet::started(&spec(), durable);
    let control = c.control_leader();
    let (leader, _) = cache_leader(&c, control);
    let leader = leader.expect("a leader");
    let follower = (0..3).find(|&i| i != leader).unwrap();
    let body = r#""type":"cache_put","key":"short","value":"eA==","request_id":1,"ttl_ms":3000"#;
    assert_eq!(ask(&mut c, leader, body)["type"], "cache_ok");
    put(&mut c, leader, "long", "eQ==");
    c.until(Duration::from_secs(10), |c| {
        values_log(c, follower) == values_log(c, leader)
    });
    // Recovery finds a key with a TTL in the follower's copy and arms its expiry pass.
    c.restart(follower, &spec(), durable);
    c.until(Duration::from_secs(30), |c| {
        let (l, _) = cache_leader(c, follower);
        l == Some(leader) && c.nodes[follower].engine.is_serving()
    });
    let before = values_log(&c, follower);
    // Past the TTL, with the follower cut off from the leader: its copy must not change,
    // whatever its own expiry pass finds due.
    c.cut_both(follower, leader, true);
    c.advance(Duration::from_secs(5));
    assert_eq!(
        values_log(&c, follower),
        before,
        "the follower wrote to its copy"
    );
    c.cut_both(follower, leader, false);
    // The leader deleted the key and ships the delete.
    c.until(Duration::from_secs(10), |c| {
        let lag = c.nodes[leader].engine.metrics().replication_lag_records;
        lag.iter()
            .any(|(l, n)| l == "t1/default/sessions#0" && *n == 0)
    });
    let leader_log = values_log(&c, leader);
    assert_eq!(leader_log.len(), 3, "two puts and the leader's delete");
    for at in (0..3).filter(|&i| i != leader) {
        assert_eq!(
            values_log(&c, at),
            leader_log,
            "node {at}'s copy is the leader's"
        );
    }
}

/// A watch of every key of the cache through node `at`, by a client whose `auth` frame is
/// given: (connection, event stream, subscription id).
fn watch_on(
    c: &mut ClusterNet,
    at: usize,
    auth: &[u8],
    from: Option<u64>,
) -> (usize, StreamId, u64) {
    let p = c.connect(at);
    let (sid, _) = c.auth_with(at, p, auth);
    let from = from.map_or(String::new(), |n| format!(r#","from_offset":{n}"#));
    let body = format!(
        r#"{{"type":"cache_watch","tenant_id":"t1","namespace":"default","cache":"sessions","prefix":""{from}}}"#
    );
    let frames = std::cell::RefCell::new(c.exchange(at, p, sid, &json_frame(&body)));
    c.until(Duration::from_secs(10), |c| {
        let mut got = frames.borrow_mut();
        got.extend(c.nodes[at].read_frames(p, sid));
        !got.is_empty()
    });
    let answer: Value = serde_json::from_str(text(&frames.borrow()[0])).expect("JSON");
    assert_eq!(answer["type"], "cache_watch_started", "{answer}");
    let uni = c.nodes[at].take_uni(p);
    c.run();
    let hello = c.nodes[at].read_frames(p, uni);
    assert!(!hello.is_empty(), "no hello on {uni:?} of {p}: {answer}");
    assert!(text(&hello[0]).contains("event_stream_hello"));
    (p, uni, answer["subscription_id"].as_u64().unwrap())
}

/// The JSON frames that arrived on an event stream.
fn events(c: &mut ClusterNet, at: usize, (p, uni): (usize, StreamId)) -> Vec<Value> {
    let frames = c.nodes[at].read_frames(p, uni);
    frames
        .iter()
        .map(|f| serde_json::from_str(text(f)).expect("JSON"))
        .collect()
}

/// What arrives on an event stream until it ends (at most 10 s of virtual time).
fn to_the_end(c: &mut ClusterNet, at: usize, (p, uni): (usize, StreamId)) -> Vec<Value> {
    let got = std::cell::RefCell::new(Vec::new());
    c.until(Duration::from_secs(10), |c| {
        got.borrow_mut().extend(events(c, at, (p, uni)));
        c.nodes[at].peers[p].finished.contains(&uni)
    });
    got.into_inner()
}

#[test]
fn a_watch_whose_cache_leader_changes_ends_with_shard_moved() {
    let mut c = ClusterNet::started(&spec(), durable);
    let control = c.control_leader();
    let (leader, generation) = cache_leader(&c, control);
    let leader = leader.expect("a leader");
    let moves = real_client_auth("t1", &c.nodes[leader].token());
    // A client that reads coded errors but not `shard_moved`.
    let plain = json_frame(&format!(
        r#"{{"type":"auth","tenant_id":"t1","token":"{}","client_flags":{REAL_CLIENT_FLAGS},"client_features":{},"client_features_hi":{REAL_CLIENT_FEATURES_HI}}}"#,
        c.nodes[leader].token(),
        REAL_CLIENT_FEATURES & !0x1000
    ));
    let (p1, uni1, sub1) = watch_on(&mut c, leader, &moves, None);
    let (p2, uni2, _) = watch_on(&mut c, leader, &plain, None);
    put(&mut c, leader, "a", "djE=");
    let first = events(&mut c, leader, (p1, uni1));
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["offset"], 0);
    assert_eq!(events(&mut c, leader, (p2, uni2)).len(), 1);
    // Both followers hold it (the cache's `leader` consistency acked it without them).
    c.until(Duration::from_secs(10), |c| {
        let lag = c.nodes[leader].engine.metrics().replication_lag_records;
        lag.iter()
            .any(|(l, n)| l == "t1/default/sessions#0" && *n == 0)
    });
    // Only a follower recorded level with the leader may take the cache over.
    c.until(Duration::from_secs(10), |c| {
        quiet_level(c, leader).len() == 2
    });

    // The leader is cut off, another node leads the cache, and the old leader hears of it.
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &o in &others {
        c.cut_both(leader, o, true);
    }
    let moved = |c: &ClusterNet, at: usize| {
        let (l, g) = cache_leader(c, at);
        l.is_some_and(|l| l != leader) && g > generation
    };
    c.until(Duration::from_secs(60), |c| moved(c, others[0]));
    for &o in &others {
        c.cut_both(leader, o, false);
    }
    c.until(Duration::from_secs(60), |c| moved(c, leader));
    let (next, next_generation) = cache_leader(&c, leader);
    let next = next.unwrap();
    let last = to_the_end(&mut c, leader, (p1, uni1));
    let end = last.last().expect("a last frame");
    assert_eq!(end["type"], "shard_moved", "{last:?}");
    assert_eq!(end["subscription_id"], sub1);
    assert_eq!(end["resume_from"], 1, "offset 0 was offered");
    assert_eq!(end["node_id"], format!("n{}", next + 1));
    assert_eq!(end["addr"], format!("127.0.0.1:{}", 5001 + next));
    assert_eq!(end["generation"], next_generation);
    let plain_end = to_the_end(&mut c, leader, (p2, uni2));
    let end = plain_end.last().expect("a last frame");
    assert_eq!(end["type"], "error", "{plain_end:?}");
    assert_eq!(end["code"], "not_leader", "{plain_end:?}");

    // Resumed where it said, at the new leader: the next change, no gap.
    let resume = watch_on(&mut c, next, &moves, Some(1));
    put(&mut c, next, "b", "djI=");
    let after = events(&mut c, next, (resume.0, resume.1));
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0]["offset"], 1);
    assert_eq!(after[0]["key"], "b");
}
