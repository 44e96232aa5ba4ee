//! Deleting a stream in a cluster (issue 33 item 5): one `DeleteStream` command through the
//! control plane, asked of any node; every node ends its subscriptions with
//! `stream_deleted` and removes its copies; the name then answers not-found until it is
//! created again, empty, at generations above the old ones; a node that was stopped through
//! the delete and the re-creation removes its old copy when it comes back and holds only the
//! new life's records. Three durable nodes on felix-testkit's `ClusterNet` and its virtual
//! clock; `t1/default/orders` of three shards, three copies each, quorum.

use std::time::Duration;

use felix_engine::stream_admin::{Consistency, StreamSpec};
use felix_engine::{AdminError, DeleteStreamError, DurableConfig, EngineConfig};
use felix_proto::frame::Frame;
use felix_testkit::*;
use quinn_proto::StreamId;

const SHARDS: u32 = 3;
const NAMES: (&str, &str, &str) = ("t1", "default", "orders");

fn durable(_: usize, cfg: &mut EngineConfig) {
    cfg.durable = Some(DurableConfig::default());
}

/// Subscribes to `shard` on node `at` (its leader) with the real client's offer; returns the
/// subscription id and its event stream.
fn subscribe(c: &mut ClusterNet, at: usize, shard: u32) -> (usize, u64, StreamId) {
    let p = c.connect(at);
    let (id, _) = c.auth_stream(at, p);
    let ask = json_frame(&format!(
        r#"{{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"orders","shard":{shard}}}"#
    ));
    c.nodes[at].send(p, id, &ask);
    c.nodes[at].finish(p, id);
    c.run();
    let frames = c.nodes[at].read_frames(p, id);
    let answer: serde_json::Value = serde_json::from_str(text(&frames[0])).unwrap();
    assert_eq!(answer["type"], "subscribed", "{answer}");
    c.nodes[at].stop(p, id);
    c.run();
    let uni = c.nodes[at].take_uni(p);
    let hello = c.nodes[at].read_frames(p, uni);
    assert!(text(&hello[0]).contains("event_stream_hello"));
    (p, answer["subscription_id"].as_u64().unwrap(), uni)
}

fn leader_of(c: &ClusterNet, shard: u32) -> usize {
    c.orders_leader(0, shard).0.expect("led")
}

fn deleted_everywhere(c: &ClusterNet, incarnation: u64) -> bool {
    c.nodes
        .iter()
        .all(|n| n.engine.stream_deleted_here(NAMES, incarnation))
}

fn last_text(frames: &[Frame]) -> String {
    frames
        .last()
        .map(|f| text(f).to_owned())
        .unwrap_or_default()
}

#[test]
fn a_delete_asked_of_one_node_ends_every_subscription_and_removes_every_copy() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    for shard in 0..SHARDS {
        let leader = leader_of(&c, shard);
        c.until(Duration::from_secs(10), |c| c.writable(leader, shard));
    }
    // Publish through every node, one record per shard each (forwarded when not led there).
    for at in 0..3 {
        for shard in 0..SHARDS {
            let id = (at as u64) * 10 + u64::from(shard) + 1;
            c.publish_acked(at, (SHARDS, shard), id, b"old");
        }
    }
    // A subscription on every shard's leader: one on each node.
    let subs: Vec<(usize, usize, u64, StreamId)> = (0..SHARDS)
        .map(|shard| {
            let at = leader_of(&c, shard);
            let (p, sub, uni) = subscribe(&mut c, at, shard);
            (at, p, sub, uni)
        })
        .collect();
    let mut ats: Vec<usize> = subs.iter().map(|s| s.0).collect();
    ats.sort();
    ats.dedup();
    assert_eq!(
        ats.len(),
        3,
        "leaders are balanced: a subscription on each node"
    );
    let generations: Vec<u64> = (0..SHARDS).map(|s| c.orders_leader(0, s).1).collect();
    let incarnation = c.nodes[0].engine.stream_incarnation(NAMES).expect("placed");

    // Asked of a node that is not the control plane's leader: raft forwards the proposal.
    let control = c.control_leader();
    let via = (0..3).find(|&i| i != control).unwrap();
    let now = c.now;
    let token = c.nodes[via].token();
    c.nodes[via]
        .engine
        .delete_stream_as(now, &token, NAMES.0, NAMES.1, NAMES.2)
        .expect("asked");
    c.until(Duration::from_secs(5), |c| {
        deleted_everywhere(c, incarnation)
    });

    for (at, p, sub, uni) in &subs {
        let frames = c.nodes[*at].read_frames(*p, *uni);
        assert_eq!(
            last_text(&frames),
            format!(r#"{{"type":"stream_deleted","subscription_id":{sub}}}"#),
            "node {at}"
        );
        assert!(c.nodes[*at].peers[*p].finished.contains(uni), "node {at}");
    }
    c.advance(Duration::from_secs(1));
    for (i, n) in c.nodes.iter().enumerate() {
        for shard in 0..SHARDS {
            assert!(
                shard_log_on(&n.disk, "orders", shard).is_empty(),
                "node {i} shard {shard}: the copy's files are gone"
            );
        }
        assert!(
            n.disk.dirs().iter().all(|d| !d.contains(".deleted.")),
            "node {i}: the tombstones are removed too"
        );
        assert!(
            matches!(
                n.engine.stream_view(c.now, None, NAMES),
                Err(AdminError::NotFound(_))
            ),
            "node {i}"
        );
        // A second delete, on any node, finds nothing.
        assert_eq!(
            c.nodes[i]
                .engine
                .stream_view(c.now, None, NAMES)
                .map(|_| ())
                .map_err(|e| e.status()),
            Err(404)
        );
    }
    let now = c.now;
    assert_eq!(
        c.nodes[0]
            .engine
            .delete_stream(now, NAMES.0, NAMES.1, NAMES.2),
        Err(DeleteStreamError::NotFound)
    );

    // Created again, narrower: a new incarnation, generations above the old ones, no old
    // record, and the new width is what routes.
    const NARROW: u32 = 2;
    let token = c.nodes[0].token();
    let asked = c.nodes[0].engine.create_stream_as(
        now,
        &token,
        NAMES,
        StreamSpec::new(NARROW, 3, Consistency::Quorum),
    );
    assert!(matches!(asked, Ok(None)), "{asked:?}");
    c.until(Duration::from_secs(10), |c| {
        c.nodes.iter().all(|n| {
            n.engine
                .stream_view(c.now, None, NAMES)
                .is_ok_and(|v| v.writable())
        })
    });
    assert_eq!(
        c.nodes[0].engine.stream_incarnation(NAMES),
        Some(incarnation + 1)
    );
    for shard in 0..NARROW {
        assert!(c.orders_leader(0, shard).1 > generations[shard as usize]);
        let leader = leader_of(&c, shard);
        c.until(Duration::from_secs(10), |c| c.writable(leader, shard));
        let offset = c.publish_acked(
            shard as usize,
            (NARROW, shard),
            100 + u64::from(shard),
            b"new",
        );
        assert_eq!(offset, 0, "shard {shard} starts empty");
    }
}

#[test]
fn a_node_stopped_through_the_delete_and_the_recreation_drops_its_old_copy_when_back() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let (control, shard, away, _) = c.shard_led_off_control(SHARDS);
    for s in 0..SHARDS {
        let leader = leader_of(&c, s);
        c.until(Duration::from_secs(10), |c| c.writable(leader, s));
        for i in 0..3 {
            c.publish_acked(control, (SHARDS, s), u64::from(s) * 10 + i, b"old");
        }
    }
    c.until(Duration::from_secs(5), |c| {
        shard_log_on(&c.nodes[away].disk, "orders", shard).len() == 3
    });
    let (p, sub, uni) = subscribe(&mut c, away, shard);

    // `away` stops; the others delete the stream and create it again, and write to it.
    c.freeze(away);
    let now = c.now;
    c.nodes[control]
        .engine
        .delete_stream(now, NAMES.0, NAMES.1, NAMES.2)
        .expect("asked");
    c.until(Duration::from_secs(5), |c| {
        c.nodes[control].engine.stream_deleted_here(NAMES, 0)
    });
    let token = c.nodes[control].token();
    let now = c.now;
    let spec3 = StreamSpec::new(SHARDS, 3, Consistency::Quorum);
    c.nodes[control]
        .engine
        .create_stream_as(now, &token, NAMES, spec3)
        .expect("asked");
    c.until(Duration::from_secs(5), |c| {
        c.nodes[control].engine.stream_incarnation(NAMES) == Some(1)
    });
    let live = (0..SHARDS)
        .find(|&s| c.orders_leader(control, s).0.is_some_and(|l| l != away))
        .expect("a shard led by a live node");
    let leader = c.orders_leader(control, live).0.unwrap();
    c.until(Duration::from_secs(10), |c| c.writable(leader, live));
    c.publish_acked(control, (SHARDS, live), 500, b"new");

    // Back: it learns of the delete, ends its subscription, drops its old copies, and is
    // fed the new life's records only.
    c.thaw(away);
    c.until(Duration::from_secs(20), |c| {
        c.nodes[away].engine.stream_deleted_here(NAMES, 0)
            && c.nodes[away].engine.stream_incarnation(NAMES) == Some(1)
    });
    let frames = c.nodes[away].read_frames(p, uni);
    assert_eq!(
        last_text(&frames),
        format!(r#"{{"type":"stream_deleted","subscription_id":{sub}}}"#)
    );
    c.until(Duration::from_secs(20), |c| {
        shard_log_on(&c.nodes[away].disk, "orders", live).len() == 1
    });
    let entries = shard_log_on(&c.nodes[away].disk, "orders", live);
    assert_eq!(entries[0].0, 0, "the new life from offset 0");
    for s in 0..SHARDS {
        let entries = shard_log_on(&c.nodes[away].disk, "orders", s);
        assert!(
            entries
                .iter()
                .all(|(_, bytes)| !bytes.windows(3).any(|w| w == b"old")),
            "shard {s}: no record of the old life is left on the node that was away"
        );
    }
}

/// Every node compacts its metadata log at once, so a node that comes back behind is sent a
/// snapshot rather than the entries it missed.
fn durable_compacting(_: usize, cfg: &mut EngineConfig) {
    cfg.durable = Some(DurableConfig::default());
    if let Some(cluster) = cfg.cluster.as_mut() {
        cluster.metadata_log_compact_bytes = 1;
    }
}

/// As above, with the node's process replaced while it was cut off: it restarts from its own
/// metadata log (which still has the old life placed) and its old files, then learns of the
/// delete from a snapshot. A stream of one replica led there shows it: no leader would feed
/// or cut that copy, so only the removal keeps its old records from being served.
#[test]
fn a_node_restarted_while_cut_off_learns_of_the_delete_by_snapshot_and_drops_its_old_copy() {
    let spec = ClusterSpec::default();
    let mut c = ClusterNet::started(&spec, durable_compacting);
    let token = c.nodes[0].token();
    // Single-replica streams until one is placed off the control plane's node.
    let control = c.control_leader();
    let one = StreamSpec::new(1, 1, Consistency::Leader);
    let (name, away) = (0..12)
        .find_map(|i| {
            let name = format!("solo-{i}");
            let now = c.now;
            let names = ("t1", "default", name.as_str());
            c.nodes[control]
                .engine
                .create_stream_as(now, &token, names, one)
                .expect("asked");
            c.until(Duration::from_secs(5), |c| {
                c.nodes[control].engine.stream_incarnation(names).is_some()
            });
            let view = c.nodes[control]
                .engine
                .stream_view(c.now, None, names)
                .unwrap();
            let leader = c.index(view.shards[0].leader.as_deref().unwrap());
            (leader != control).then_some((name, leader))
        })
        .expect("placement spreads streams over the nodes");
    let names = ("t1", "default", name.as_str());
    let frame = binary_publish(Some(1), None, &name, &[b"old"]);
    let answer = c.request(away, &frame);
    assert!(
        matches!(
            felix_proto::binary::PublishAck::decode(answer.flags, &answer.payload)
                .unwrap()
                .result,
            felix_proto::binary::AckResult::Ok { .. }
        ),
        "the old record is acknowledged"
    );
    c.until(Duration::from_secs(5), |c| {
        shard_log_on(&c.nodes[away].disk, &name, 0).len() == 1
    });

    for other in (0..3).filter(|&i| i != away) {
        c.cut_both(away, other, true);
    }
    let now = c.now;
    c.nodes[control]
        .engine
        .delete_stream(now, names.0, names.1, names.2)
        .expect("asked");
    c.until(Duration::from_secs(5), |c| {
        c.nodes[control].engine.stream_deleted_here(names, 0)
    });
    let now = c.now;
    c.nodes[control]
        .engine
        .create_stream_as(now, &token, names, one)
        .expect("asked");
    c.until(Duration::from_secs(5), |c| {
        c.nodes[control].engine.stream_incarnation(names) == Some(1)
    });
    c.restart(away, &spec, durable_compacting);
    assert_eq!(
        c.nodes[away].engine.stream_incarnation(names),
        Some(0),
        "its own log still has the old life"
    );
    assert_eq!(shard_log_on(&c.nodes[away].disk, &name, 0).len(), 1);
    c.advance(Duration::from_secs(1));
    for other in (0..3).filter(|&i| i != away) {
        c.cut_both(away, other, false);
    }
    c.until(Duration::from_secs(20), |c| {
        c.nodes[away].engine.stream_incarnation(names) == Some(1)
            && c.nodes[away].engine.stream_deleted_here(names, 0)
    });
    c.advance(Duration::from_secs(2));
    assert!(
        shard_log_on(&c.nodes[away].disk, &name, 0).is_empty(),
        "the old copy's files are gone"
    );
    // Served again from the node that was away, the new life starts empty.
    let frame = binary_publish(Some(2), None, &name, &[b"new"]);
    let answer = c.request(away, &frame);
    match felix_proto::binary::PublishAck::decode(answer.flags, &answer.payload)
        .unwrap()
        .result
    {
        felix_proto::binary::AckResult::Ok { offset } => assert_eq!(offset, Some(0)),
        other => panic!("refused: {other:?}"),
    }
}

fn on_commit(_: usize, cfg: &mut EngineConfig) {
    let mut d = DurableConfig::default();
    d.fsync = felix_engine::FsyncPolicy::OnCommit;
    cfg.durable = Some(d);
}

/// Syncs of stream segment files wait on every node: a quorum publish is then held, written
/// but not durable anywhere.
fn hold_stream_syncs(k: &felix_storage::ops::FileOpKind) -> bool {
    matches!(k, felix_storage::ops::FileOpKind::Sync { path } if path.starts_with("streams/"))
}

/// A publish racing the delete: written on the leader and shipped, but not yet durable on a
/// majority when the delete is applied. It is refused `not_found`, never acknowledged, and
/// no copy of it outlives the delete on any node.
#[test]
fn a_publish_waiting_for_its_quorum_when_the_delete_applies_is_refused() {
    use felix_proto::binary::{AckResult, PublishAck};
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, on_commit);
    let (control, shard, leader, _) = c.shard_led_off_control(SHARDS);
    c.publish_acked(leader, (SHARDS, shard), 1, b"before");

    for n in &mut c.nodes {
        n.hold = hold_stream_syncs;
    }
    let p = c.connect(leader);
    let (id, _) = c.auth_stream(leader, p);
    let key = key_for_shard(SHARDS, shard);
    let racing = binary_publish(Some(2), Some(&key), "orders", &[b"racing"]);
    c.nodes[leader].send(p, id, &racing);
    c.advance(Duration::from_millis(200));
    assert!(
        c.nodes[leader].read_frames(p, id).is_empty(),
        "not durable anywhere: not acknowledged yet"
    );

    let now = c.now;
    c.nodes[control]
        .engine
        .delete_stream(now, NAMES.0, NAMES.1, NAMES.2)
        .expect("asked");
    let mut answer = Vec::new();
    let start = c.now;
    while answer.is_empty() {
        assert!(
            c.now - start < Duration::from_secs(5),
            "the publish was never answered"
        );
        c.advance(Duration::from_millis(1));
        answer = c.nodes[leader].read_frames(p, id);
    }
    let ack = PublishAck::decode(answer[0].flags, &answer[0].payload).expect("a binary ack");
    match ack.result {
        AckResult::Err { code, .. } => {
            assert_eq!(code.map(|c| c.0), Some(felix_proto::ErrorCode::NotFound))
        }
        other => panic!("a publish racing the delete was answered {other:?}"),
    }
    c.until(Duration::from_secs(5), |c| deleted_everywhere(c, 0));
    for n in &mut c.nodes {
        n.release_held_ops();
    }
    c.advance(Duration::from_secs(1));
    for (i, n) in c.nodes.iter().enumerate() {
        for s in 0..SHARDS {
            assert!(
                shard_log_on(&n.disk, "orders", s).is_empty(),
                "node {i} shard {s}: nothing of the deleted stream is left"
            );
        }
    }
}

/// One cache request (`body` without its scope) to node `at`, answered.
fn cache_ask(c: &mut ClusterNet, at: usize, body: &str) -> serde_json::Value {
    let json = format!(r#"{{"tenant_id":"t1","namespace":"default","cache":"sessions",{body}}}"#);
    let answer = c.request(at, &json_frame(&json));
    serde_json::from_str(text(&answer)).expect("a JSON answer")
}

/// A cache's delete is the same: one `DeleteCache` command asked of any node, and every node
/// drops its values, counters and files; created again the name is empty, at generations above
/// the old life's.
#[test]
fn a_cache_delete_asked_of_one_node_removes_every_copy() {
    use felix_engine::stream_admin::CacheSpec;
    let names = ("t1", "default", "sessions");
    let mut spec = ClusterSpec::default();
    spec.caches.push(felix_engine::DeclaredCache::new(
        "t1", "default", "sessions", 3,
    ));
    let mut c = ClusterNet::started(&spec, on_commit);
    let put = r#""type":"cache_put","key":"k","value":"dg==","request_id":1,"ttl_ms":null"#;
    let add = r#""type":"counter_add","key":"n","delta":5,"request_id":3"#;
    for at in 0..3 {
        let answer = cache_ask(&mut c, at, put);
        assert_eq!(answer["type"], "cache_ok", "{answer}");
    }
    assert_eq!(cache_ask(&mut c, 0, add)["value"], 5);
    let held = |c: &ClusterNet, i: usize| -> Vec<String> {
        c.nodes[i]
            .disk
            .files()
            .into_keys()
            .filter(|f| f.contains("/sessions/") || f.contains(".deleted."))
            .collect()
    };
    c.until(Duration::from_secs(5), |c| {
        (0..3).all(|i| !held(c, i).is_empty())
    });
    let old_generation = c.nodes[0]
        .engine
        .cache_view(c.now, None, names)
        .unwrap()
        .shards[0]
        .generation;

    // A watch on the cache's leader (a watch is served there).
    let view = c.nodes[0].engine.cache_view(c.now, None, names).unwrap();
    let leader = c.index(view.shards[0].leader.as_deref().unwrap());
    let p = c.connect(leader);
    let (id, _) = c.auth_stream(leader, p);
    let ask = json_frame(
        r#"{"type":"cache_watch","tenant_id":"t1","namespace":"default","cache":"sessions","key":"k"}"#,
    );
    let frames = c.exchange(leader, p, id, &ask);
    assert!(
        text(&frames[0]).contains("cache_watch_started"),
        "{}",
        text(&frames[0])
    );
    let watch = c.nodes[leader].take_uni(p);
    c.run();
    let _hello = c.nodes[leader].read_frames(p, watch);

    let control = c.control_leader();
    let via = (0..3).find(|&i| i != control).unwrap();
    let token = c.nodes[via].token();
    let now = c.now;
    assert_eq!(
        c.nodes[via].engine.delete_cache_as(now, &token, names),
        Ok(0)
    );
    c.until(Duration::from_secs(5), |c| {
        c.nodes
            .iter()
            .all(|n| n.engine.cache_deleted_here(names, 0))
    });
    let end = c.nodes[leader].read_frames(p, watch);
    let last: serde_json::Value = serde_json::from_str(&last_text(&end)).expect("JSON");
    assert_eq!(last["type"], "error", "{last}");
    assert_eq!(last["code"], "not_found", "{last}");
    assert_eq!(last["message"], "the cache was deleted", "{last}");
    assert!(c.nodes[leader].peers[p].finished.contains(&watch));
    c.advance(Duration::from_secs(1));
    for i in 0..3 {
        assert_eq!(held(&c, i), Vec::<String>::new(), "node {i}: files left");
        assert_eq!(
            c.nodes[i]
                .engine
                .cache_view(c.now, None, names)
                .map_err(|e| e.status()),
            Err(404)
        );
    }
    let now = c.now;
    assert_eq!(
        c.nodes[0]
            .engine
            .delete_cache_as(now, &token, names)
            .map_err(|e| e.status()),
        Err(404)
    );

    let one = CacheSpec {
        shards: 1,
        replication_factor: 3,
    };
    let now = c.now;
    assert!(c.nodes[0]
        .engine
        .create_cache_as(now, &token, names, one)
        .is_ok());
    c.until(Duration::from_secs(10), |c| {
        c.nodes.iter().all(|n| {
            n.engine
                .cache_view(c.now, None, names)
                .is_ok_and(|v| v.writable())
        })
    });
    let view = c.nodes[0].engine.cache_view(c.now, None, names).unwrap();
    assert!(view.shards[0].generation > old_generation);
    let got = cache_ask(&mut c, 1, r#""type":"cache_get","key":"k","request_id":2"#);
    assert!(got["value"].is_null(), "the old value is gone: {got}");
    assert_eq!(
        cache_ask(&mut c, 2, add)["value"],
        5,
        "the counter starts again"
    );
}

/// After a delete the name is unknown until it is created again; with first-use placement
/// (the default) a publish is that creation: a new incarnation, empty, at the first-use
/// defaults.
#[test]
fn a_publish_after_the_delete_creates_the_stream_afresh_on_first_use() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let (control, shard, leader, _) = c.shard_led_off_control(SHARDS);
    c.publish_acked(leader, (SHARDS, shard), 1, b"old");
    let now = c.now;
    c.nodes[control]
        .engine
        .delete_stream(now, NAMES.0, NAMES.1, NAMES.2)
        .expect("asked");
    c.until(Duration::from_secs(5), |c| deleted_everywhere(c, 0));
    let frame = binary_publish(Some(2), None, "orders", &[b"new"]);
    let answer = c.request(control, &frame);
    match felix_proto::binary::PublishAck::decode(answer.flags, &answer.payload)
        .unwrap()
        .result
    {
        felix_proto::binary::AckResult::Ok { offset } => assert_eq!(offset, Some(0)),
        other => panic!("refused: {other:?}"),
    }
    assert_eq!(c.nodes[control].engine.stream_incarnation(NAMES), Some(1));
    let view = c.nodes[control]
        .engine
        .stream_view(c.now, None, NAMES)
        .unwrap();
    assert_eq!(
        view.spec.consistency,
        Consistency::Leader,
        "first-use defaults"
    );
}

/// Renames of stream directories wait: a delete's tombstone is not made.
fn hold_stream_renames(k: &felix_storage::ops::FileOpKind) -> bool {
    matches!(k, felix_storage::ops::FileOpKind::Rename { from, .. } if from.starts_with("streams/"))
}

/// A node that crashes after applying a delete but before its old files were renamed away
/// replays the delete from its own metadata log at restart (the name is still deleted) and
/// removes the old files once its storage has found them; nothing of the old life is served.
#[test]
fn a_node_that_crashed_mid_removal_removes_the_old_files_after_its_restart() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let (control, shard, leader, _) = c.shard_led_off_control(SHARDS);
    c.publish_acked(leader, (SHARDS, shard), 1, b"old");
    let crashing = (0..3).find(|&i| i != control).unwrap();
    c.until(Duration::from_secs(5), |c| {
        shard_log_on(&c.nodes[crashing].disk, "orders", shard).len() == 1
    });
    c.nodes[crashing].hold = hold_stream_renames;
    let now = c.now;
    c.nodes[control]
        .engine
        .delete_stream(now, NAMES.0, NAMES.1, NAMES.2)
        .expect("asked");
    c.until(Duration::from_secs(5), |c| deleted_everywhere(c, 0));
    c.advance(Duration::from_millis(500));
    assert_eq!(
        shard_log_on(&c.nodes[crashing].disk, "orders", shard).len(),
        1,
        "the rename is held: the old files are still there"
    );
    // The crash: what was held is lost with the process.
    c.restart(crashing, &spec, durable);
    c.until(Duration::from_secs(10), |c| {
        (0..SHARDS).all(|s| shard_log_on(&c.nodes[crashing].disk, "orders", s).is_empty())
            && c.nodes[crashing]
                .disk
                .dirs()
                .iter()
                .all(|d| !d.contains(".deleted."))
    });
    assert_eq!(c.nodes[crashing].engine.stream_incarnation(NAMES), None);
}

/// The case a restart used to get wrong: a node applies the delete *and* the re-creation of
/// the name, then crashes before its tombstone rename is on disk. At restart its metadata log
/// replays both, so the name lives again, and the old files are still under the name. The
/// copies are told apart by the generation each one's replica state records (the new life's
/// generations all lie above the old life's): the old files are retired, and the node's copy
/// of the new life (here its only copy: the new life has one replica per shard) starts empty.
#[test]
fn a_node_that_crashed_after_the_recreation_but_before_the_rename_serves_no_old_record() {
    crashed_after_the_recreation_before_the_rename(durable);
}

/// As above, the node having compacted its metadata log past the delete and the re-creation
/// before the crash: at restart it finds the name living again in its snapshot, no delete.
#[test]
fn a_node_that_crashed_so_with_its_metadata_log_compacted_serves_no_old_record() {
    crashed_after_the_recreation_before_the_rename(durable_compacting);
}

fn crashed_after_the_recreation_before_the_rename(tweak: fn(usize, &mut EngineConfig)) {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, tweak);
    let control = c.control_leader();
    for s in 0..SHARDS {
        let leader = leader_of(&c, s);
        c.until(Duration::from_secs(10), |c| c.writable(leader, s));
        c.publish_acked(control, (SHARDS, s), u64::from(s) + 1, b"old");
    }
    let crashing = (0..3).find(|&i| i != control).unwrap();
    c.until(Duration::from_secs(5), |c| {
        (0..SHARDS).all(|s| shard_log_on(&c.nodes[crashing].disk, "orders", s).len() == 1)
    });
    c.nodes[crashing].hold = hold_stream_renames;
    let now = c.now;
    c.nodes[control]
        .engine
        .delete_stream(now, NAMES.0, NAMES.1, NAMES.2)
        .expect("asked");
    c.until(Duration::from_secs(5), |c| {
        c.nodes[crashing].engine.stream_incarnation(NAMES).is_none()
    });
    // Re-created with one copy per shard: a shard whose copy is on `crashing` is served from
    // that node's disk alone.
    let token = c.nodes[control].token();
    let now = c.now;
    c.nodes[control]
        .engine
        .create_stream_as(
            now,
            &token,
            NAMES,
            StreamSpec::new(SHARDS, 1, Consistency::Leader),
        )
        .expect("asked");
    c.until(Duration::from_secs(5), |c| {
        c.nodes[crashing].engine.stream_incarnation(NAMES) == Some(1)
    });
    c.advance(Duration::from_millis(500));
    for s in 0..SHARDS {
        assert_eq!(
            shard_log_on(&c.nodes[crashing].disk, "orders", s).len(),
            1,
            "shard {s}: the rename is held, the old files are still under the name"
        );
    }
    // The crash: the held rename is lost with the process.
    c.restart(crashing, &spec, tweak);
    let mine = (0..SHARDS)
        .find(|&s| c.orders_leader(control, s).0 == Some(crashing))
        .expect("a shard of the new life led (and held only) by the crashed node");
    // One copy per shard: the publish waits until the crashed node has its copy open.
    let offset = c.publish_acked(crashing, (SHARDS, mine), 100, b"new");
    assert_eq!(offset, 0, "the new life's copy starts empty");
    let entries = shard_log_on(&c.nodes[crashing].disk, "orders", mine);
    assert_eq!(entries.len(), 1, "{entries:?}");
    for s in 0..SHARDS {
        let entries = shard_log_on(&c.nodes[crashing].disk, "orders", s);
        assert!(
            entries
                .iter()
                .all(|(_, bytes)| !bytes.windows(3).any(|w| w == b"old")),
            "shard {s}: no record of the old life is left on the crashed node"
        );
    }
    // A plain restart later keeps the new life's copy: it is fenced above the old lives.
    c.restart(crashing, &spec, tweak);
    let offset = c.publish_acked(crashing, (SHARDS, mine), 101, b"new");
    assert_eq!(offset, 1, "the new life's record is kept across a restart");
}
