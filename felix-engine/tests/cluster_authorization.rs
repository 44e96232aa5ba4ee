//! Authorization comes before routing: a request the identity may not make is refused by the
//! node that received it, never forwarded to the shard's leader nor redirected there, and no
//! answer to it names the node that leads the shard. Three nodes on felix-testkit's
//! `ClusterNet`, tokens signed with their dev key; one stream of three shards.

use felix_auth::SigningKey;
use felix_engine::{DurableConfig, EngineConfig, FsyncPolicy};
use felix_testkit::*;
use serde_json::Value;
use std::time::Duration;

const SHARDS: u32 = 3;

fn durable(_: usize, cfg: &mut EngineConfig) {
    let mut d = DurableConfig::default();
    d.fsync = FsyncPolicy::OnCommit;
    cfg.durable = Some(d);
}

/// The key behind the nodes' dev-mode verifier (`AuthConfig::Dev { seed: [7; 32] }`).
fn key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

/// A token for tenant `t1` holding `perms`, valid at the cluster's start.
fn token(perms: &[&str]) -> String {
    let now = 1_767_225_600u64;
    let perms = perms.iter().map(|p| (*p).to_owned()).collect();
    felix_auth::mint_token(
        &key(),
        felix_auth::DEV_KID,
        &felix_auth::Claims::for_tenant("t1", perms, now, 3600),
    )
}

/// Sends `body` to node `at` as an identity holding `perms` (a client offering what the real
/// one does, redirects included) and returns the first answer.
fn ask_as(c: &mut ClusterNet, at: usize, perms: &[&str], body: &str) -> Value {
    let p = c.connect(at);
    let auth = real_client_auth("t1", &token(perms));
    let (sid, ok) = c.auth_with(at, p, &auth);
    assert!(text(&ok).contains("auth_ok"), "{}", text(&ok));
    let frames = std::cell::RefCell::new(c.exchange(at, p, sid, &json_frame(body)));
    c.until(Duration::from_secs(20), |c| {
        let mut got = frames.borrow_mut();
        got.extend(c.nodes[at].read_frames(p, sid));
        !got.is_empty()
    });
    let first = &frames.borrow()[0];
    serde_json::from_str(text(first)).expect("a JSON answer")
}

/// The answer names neither the leader's id nor its client address.
fn reveals_nothing(answer: &Value, leader: usize) {
    let s = answer.to_string();
    let id = format!("n{}", leader + 1);
    let addr = format!("127.0.0.1:{}", 5001 + leader);
    assert!(
        !s.contains(&format!("\"{id}\"")) && !s.contains(&format!("by {id}")),
        "{s}"
    );
    assert!(!s.contains(&addr), "{s}");
    assert_ne!(answer["type"], "not_leader", "{s}");
}

#[test]
fn a_forbidden_request_is_refused_where_it_arrived() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let (_, shard, leader, _) = c.shard_led_off_control(SHARDS);
    let at = (0..3).find(|&i| i != leader).unwrap();
    let reader = ["stream.subscribe:stream:t1/*"];

    // A group request (redirected when allowed): forbidden here, the leader not named.
    let poll = format!(
        r#"{{"type":"group_poll","tenant_id":"t1","namespace":"default","stream":"orders","shard":{shard},"group":"g","max_records":1,"request_id":1}}"#
    );
    // (`stream.subscribe` would imply `group.consume`.)
    let answer = ask_as(&mut c, at, &["stream.publish:stream:t1/*"], &poll);
    assert_eq!(answer["type"], "error", "{answer}");
    assert_eq!(answer["code"], "forbidden", "{answer}");
    reveals_nothing(&answer, leader);

    // A publish (forwarded when allowed): refused here, nothing forwarded.
    let forwards = c.nodes[at].engine.metrics().forwards_sent;
    let publish = format!(
        r#"{{"type":"publish","tenant_id":"t1","namespace":"default","stream":"orders","payload":"eA==","shard":{shard},"ack":"per_message","request_id":2}}"#
    );
    let answer = ask_as(&mut c, at, &reader, &publish);
    assert_eq!(answer["type"], "publish_error", "{answer}");
    assert_eq!(answer["code"], "forbidden", "{answer}");
    reveals_nothing(&answer, leader);
    assert_eq!(c.nodes[at].engine.metrics().forwards_sent, forwards);

    // Where each shard lives is for those who may read the stream.
    let owners = r#"{"type":"shard_owners","tenant_id":"t1","namespace":"default","name":"orders","kind":"stream","request_id":3}"#;
    let answer = ask_as(&mut c, at, &["cache.read:cache:t1/*"], owners);
    assert_eq!(answer["code"], "forbidden", "{answer}");
    reveals_nothing(&answer, leader);

    // Allowed, the same requests route as before.
    let writer = ["stream.publish:stream:t1/*"];
    let answer = ask_as(&mut c, at, &writer, &publish);
    assert_eq!(answer["type"], "publish_ok", "{answer}");
    let consumer = ["group.consume:group:t1/*"];
    let answer = ask_as(&mut c, at, &consumer, &poll);
    assert_eq!(answer["type"], "not_leader", "{answer}");
}
