//! A three-node cluster on felix-testkit's `ClusterNet`: what clients see, frame by frame.
//! Placement is deterministic: `orders`'s shards 0, 1, 2 are led by n2, n3, n1, and the
//! `sessions` cache by n2 (the `shard_owners` test pins this down).

use felix_engine::{DeclaredCache, DeclaredStream};
use felix_testkit::*;

fn spec() -> ClusterSpec {
    let mut s = ClusterSpec::default();
    s.streams
        .push(DeclaredStream::new("t1", "default", "orders", 3));
    s.caches
        .push(DeclaredCache::new("t1", "default", "sessions", 1));
    s
}

/// The real client's `auth` with FEATURE_REDIRECT (0x0002) withdrawn.
fn auth_without_redirect(token: &str) -> Vec<u8> {
    json_frame(&format!(
        r#"{{"type":"auth","tenant_id":"t1","token":"{token}","client_flags":{REAL_CLIENT_FLAGS},"client_features":{},"client_features_hi":{REAL_CLIENT_FEATURES_HI}}}"#,
        REAL_CLIENT_FEATURES & !0x0002
    ))
}

fn subscribe(shard: u32) -> Vec<u8> {
    json_frame(&format!(
        r#"{{"type":"subscribe","tenant_id":"t1","namespace":"default","stream":"orders","shard":{shard}}}"#
    ))
}

#[test]
fn every_node_answers_topology_with_all_three_nodes() {
    let mut c = ClusterNet::started(&spec(), |_, _| {});
    for i in 0..3 {
        let p = c.connect(i);
        let (id, _) = c.auth_stream(i, p);
        let f = c.exchange(i, p, id, &json_frame(r#"{"type":"topology"}"#));
        assert_eq!(f.len(), 1);
        assert_eq!(
            text(&f[0]),
            r#"{"type":"topology_view","brokers":[{"node_id":"n1","addr":"127.0.0.1:5001"},{"node_id":"n2","addr":"127.0.0.1:5002"},{"node_id":"n3","addr":"127.0.0.1:5003"}]}"#,
            "node {i}"
        );
    }
}

#[test]
fn every_node_answers_the_same_shard_owners() {
    let mut c = ClusterNet::started(&spec(), |_, _| {});
    let ask = |kind: &str, name: &str| {
        json_frame(&format!(
            r#"{{"type":"shard_owners","tenant_id":"t1","namespace":"default","name":"{name}","kind":"{kind}","request_id":3}}"#
        ))
    };
    for i in 0..3 {
        let p = c.connect(i);
        let (id, _) = c.auth_stream(i, p);
        let f = c.exchange(i, p, id, &ask("stream", "orders"));
        assert_eq!(
            text(&f[0]),
            r#"{"type":"shard_owners_view","request_id":3,"owners":[{"shard":0,"node_id":"n2","addr":"127.0.0.1:5002","generation":1},{"shard":1,"node_id":"n3","addr":"127.0.0.1:5003","generation":1},{"shard":2,"node_id":"n1","addr":"127.0.0.1:5001","generation":1}]}"#,
            "node {i}"
        );
        let f = c.exchange(i, p, id, &ask("cache", "sessions"));
        assert_eq!(
            text(&f[0]),
            r#"{"type":"shard_owners_view","request_id":3,"owners":[{"shard":0,"node_id":"n2","addr":"127.0.0.1:5002","generation":1}]}"#,
            "node {i}"
        );
    }
}

#[test]
fn a_publish_to_a_non_leader_is_acked_with_the_owner_hint_and_lands_on_the_leader() {
    let mut c = ClusterNet::started(&spec(), |_, _| {});
    // A subscriber on the leader of shard 0 (n2), where an unkeyed publish goes.
    let leader = c.index("n2");
    let lp = c.connect(leader);
    let (lid, _) = c.auth_stream(leader, lp);
    let f = c.exchange(leader, lp, lid, &subscribe(0));
    assert_eq!(text(&f[0]), r#"{"type":"subscribed","subscription_id":1}"#);
    let events = c.nodes[leader].take_uni(lp);
    // The event stream's opening frame.
    let opening = c.nodes[leader].read_frames(lp, events);
    assert_eq!(opening.len(), 1, "{opening:?}");

    let entry = c.index("n1");
    let p = c.connect(entry);
    let (id, _) = c.auth_stream(entry, p);
    let f = c.exchange(
        entry,
        p,
        id,
        &binary_publish(Some(1), None, "orders", &[b"via-n1"]),
    );
    assert_eq!(f.len(), 1);
    // An ack (0x0010) with the owner (0x0080): status 0 (ok), request 1, an empty message;
    // then node id "n2", its client address and generation 1.
    let mut want = vec![0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2];
    want.extend_from_slice(b"n2");
    want.extend_from_slice(&14u16.to_be_bytes());
    want.extend_from_slice(b"127.0.0.1:5002");
    want.extend_from_slice(&1u64.to_be_bytes());
    assert_eq!(bytes_of(&f[0]), binary_frame(0x0090, &want), "{f:?}");
    assert_eq!(c.nodes[entry].engine.stats().forwards, 1);
    assert_eq!(c.nodes[leader].engine.stats().forwards_served, 1);
    assert_eq!(c.nodes[leader].engine.stats().published_records, 1);

    // The record is on the leader's stream: its subscriber gets it, the same event as one
    // published on the leader itself.
    let forwarded = c.nodes[leader].read_frames(lp, events);
    let (did, _) = c.auth_stream(leader, lp);
    let f = c.exchange(
        leader,
        lp,
        did,
        &binary_publish(Some(1), None, "orders", &[b"via-n1"]),
    );
    assert_eq!(
        bytes_of(&f[0]),
        binary_frame(0x0010, &[0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0])
    );
    let direct = c.nodes[leader].read_frames(lp, events);
    assert_eq!(forwarded.len(), 1);
    assert_eq!(forwarded[0].payload, &b"\0\0\0\x01\0\0\0\x06via-n1"[..]);
    assert_eq!(forwarded, direct);
}

#[test]
fn a_subscribe_to_a_non_owner_is_redirected_or_refused_with_a_code() {
    let mut c = ClusterNet::started(&spec(), |_, _| {});
    let entry = c.index("n1");
    let p = c.connect(entry);
    let (id, _) = c.auth_stream(entry, p);
    let f = c.exchange(entry, p, id, &subscribe(0));
    assert_eq!(
        text(&f[0]),
        r#"{"type":"not_leader","node_id":"n2","addr":"127.0.0.1:5002","generation":1}"#
    );
    let (id, _) = c.auth_stream(entry, p);
    let f = c.exchange(entry, p, id, &subscribe(1));
    assert_eq!(
        text(&f[0]),
        r#"{"type":"not_leader","node_id":"n3","addr":"127.0.0.1:5003","generation":1}"#
    );
    assert!(
        c.nodes[entry].peers[p].incoming_uni.is_empty(),
        "never served here"
    );

    // Without FEATURE_REDIRECT: the coded error, naming the owner.
    let token = c.nodes[entry].token();
    let (id, auth) = c.auth_with(entry, p, &auth_without_redirect(&token));
    assert!(
        text(&auth).starts_with(r#"{"type":"auth_ok""#),
        "{}",
        text(&auth)
    );
    let f = c.exchange(entry, p, id, &subscribe(0));
    assert_eq!(
        text(&f[0]),
        r#"{"type":"error","message":"shard is led by n2","code":"not_leader","retry":"redirect"}"#
    );
    assert!(c.nodes[entry].peers[p].incoming_uni.is_empty());

    // What a conformance fixture records: three subscribes run here, two answered with a
    // redirect (the third with the coded error, counted among the errors).
    let m = c.nodes[entry].engine.metrics();
    assert_eq!(m.requests.get("subscribe"), Some(&3), "{:?}", m.requests);
    assert_eq!(m.redirects, 2);
}

#[test]
fn a_cache_put_through_one_node_is_read_through_another() {
    let mut c = ClusterNet::started(&spec(), |_, _| {});
    let (a, b) = (c.index("n1"), c.index("n3"));
    let pa = c.connect(a);
    let (ida, _) = c.auth_stream(a, pa);
    let put = json_frame(
        r#"{"type":"cache_put","tenant_id":"t1","namespace":"default","cache":"sessions","key":"k","value":"djE=","request_id":2,"ttl_ms":null}"#,
    );
    let f = c.exchange(a, pa, ida, &put);
    assert_eq!(text(&f[0]), r#"{"type":"cache_ok","request_id":2}"#);

    let pb = c.connect(b);
    let (idb, _) = c.auth_stream(b, pb);
    let get = json_frame(
        r#"{"type":"cache_get","tenant_id":"t1","namespace":"default","cache":"sessions","key":"k","request_id":3}"#,
    );
    let f = c.exchange(b, pb, idb, &get);
    let mut hit: serde_json::Value = serde_json::from_str(text(&f[0])).unwrap();
    assert!(hit["version"].as_u64().is_some(), "{hit}");
    hit.as_object_mut().unwrap().remove("version");
    assert_eq!(
        hit.to_string(),
        r#"{"cache":"sessions","key":"k","namespace":"default","request_id":3,"tenant_id":"t1","type":"cache_value","value":"djE="}"#
    );
    // Both went to the cache's leader.
    let leader = c.index("n2");
    assert_eq!(c.nodes[leader].engine.stats().cache_requests, 2);
    assert_eq!(c.nodes[a].engine.stats().forwards, 1);
    assert_eq!(c.nodes[b].engine.stats().forwards, 1);
}
