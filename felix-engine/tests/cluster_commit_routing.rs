//! A commit (and a state read) in a cluster is routed by its entity key, as the broker places
//! it: asked of shard 0's leader for an entity on another shard, it is redirected to that
//! shard's leader. Routed as shard 0, it ran on shard 0's leader, on its follower copy of the
//! entity's shard: acknowledged, its state readable there, and its event never handed to a
//! reader of the real leader (found by the conformance kit, docs/conformance.md).

use std::time::Duration;

use base64::Engine as _;
use felix_engine::{DurableConfig, EngineConfig, FsyncPolicy};
use felix_testkit::*;

const SHARDS: u32 = 3;

fn durable(_: usize, cfg: &mut EngineConfig) {
    let mut d = DurableConfig::default();
    d.fsync = FsyncPolicy::OnCommit;
    cfg.durable = Some(d);
}

#[test]
fn a_commit_and_a_state_read_go_to_the_leader_of_the_entitys_shard() {
    let spec = ClusterSpec::quorum_orders(SHARDS);
    let mut c = ClusterNet::started(&spec, durable);
    let control = c.control_leader();
    let (entry, _) = c.orders_leader(control, 0);
    let entry = entry.expect("shard 0 is led");
    // Leaders are balanced: another shard is led by another node.
    let (shard, owner) = (1..SHARDS)
        .find_map(|s| match c.orders_leader(control, s).0 {
            Some(l) if l != entry => Some((s, l)),
            _ => None,
        })
        .expect("a shard led elsewhere");
    c.until(Duration::from_secs(10), |c| {
        c.writable(entry, 0) && c.writable(owner, shard)
    });
    let entity = base64::engine::general_purpose::STANDARD.encode(key_for_shard(SHARDS, shard));
    let owner_id = c.ids[owner].clone();
    let commit = json_frame(&format!(
        r#"{{"type":"commit","tenant_id":"t1","namespace":"default","stream":"orders","entity_key":"{entity}","event":"ZXY=","changes":[{{"op":"put","key":"k","value":"dg=="}}],"request_id":1}}"#
    ));
    let answer = c.request(entry, &commit);
    assert!(
        text(&answer).starts_with(&format!(r#"{{"type":"not_leader","node_id":"{owner_id}""#)),
        "{}",
        text(&answer)
    );
    let state = json_frame(&format!(
        r#"{{"type":"state_get","tenant_id":"t1","namespace":"default","stream":"orders","entity_key":"{entity}","key":"k","request_id":2}}"#
    ));
    let answer = c.request(entry, &state);
    assert!(
        text(&answer).starts_with(r#"{"type":"not_leader""#),
        "{}",
        text(&answer)
    );
    // At the owner it is written at the entity's shard's first offset.
    let answer = c.request(owner, &commit);
    assert_eq!(
        text(&answer),
        r#"{"type":"commit_ok","request_id":1,"offset":0}"#
    );
}
