//! A cache of four shards on three durable nodes: its keys hash over its shards with the
//! protocol's routing function, each key is written to its own shard's log on that shard's
//! leader (forwarded there from whichever node took it) and shipped to that shard's replicas;
//! `cache_shards` and `shard_owners` agree on four through every node; a shard whose leader
//! stops is led by another replica, which serves its keys. felix-testkit's `ClusterNet` on its
//! virtual clock.

use std::collections::BTreeSet;
use std::time::Duration;

use felix_cluster::routing::cache_shard;
use felix_engine::{DeclaredCache, DurableConfig, EngineConfig, FsyncPolicy};
use felix_testkit::*;
use serde_json::Value;

const SHARDS: u32 = 4;
/// One key per shard (routing.md's function over 4 shards, checked below).
const KEYS: [(&str, u32); 4] = [("k6", 0), ("k3", 1), ("k0", 2), ("k5", 3)];

fn durable(_: usize, cfg: &mut EngineConfig) {
    let mut d = DurableConfig::default();
    d.fsync = FsyncPolicy::OnCommit;
    cfg.durable = Some(d);
}

fn spec() -> ClusterSpec {
    let mut s = ClusterSpec::default();
    let mut cache = DeclaredCache::new("t1", "default", "sessions", 3);
    cache.shards = SHARDS;
    s.caches.push(cache);
    s
}

/// Each cache shard's leader (node index) and generation, as node `at` sees them.
fn leaders(c: &ClusterNet, at: usize) -> Vec<(Option<usize>, u64)> {
    let view = c.nodes[at].engine.cluster_view().expect("a cluster node");
    let mut out: Vec<(u32, Option<usize>, u64)> = view
        .shard_leaders()
        .into_iter()
        .filter(|s| s.object == "cache:t1/default/sessions")
        .map(|s| (s.shard, s.leader.map(|l| c.index(&l)), s.generation))
        .collect();
    out.sort();
    out.into_iter().map(|(_, l, g)| (l, g)).collect()
}

fn quiet_level(c: &ClusterNet, at: usize, shard: u32) -> usize {
    let view = c.nodes[at].engine.cluster_view().expect("a cluster node");
    view.shard_leaders()
        .into_iter()
        .find(|s| s.object == "cache:t1/default/sessions" && s.shard == shard)
        .map_or(0, |s| s.quiet_level.len())
}

fn ask(c: &mut ClusterNet, at: usize, body: &str) -> Value {
    let json = format!(r#"{{"tenant_id":"t1","namespace":"default",{body}}}"#);
    let answer = c.request(at, &json_frame(&json));
    serde_json::from_str(text(&answer)).expect("a JSON answer")
}

fn cache_ask(c: &mut ClusterNet, at: usize, body: &str) -> Value {
    ask(c, at, &format!(r#""cache":"sessions",{body}"#))
}

fn value_of(key: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("value of {key}"))
}

/// Shard `shard`'s values log on node `at`, as stored entries.
fn values_log(c: &ClusterNet, at: usize, shard: u32) -> Vec<(u64, Vec<u8>)> {
    let dir = felix_storage::layout::cache_shard_dir("t1", "default", "sessions", shard);
    log_entries_on(&c.nodes[at].disk, &dir)
}

fn holds_key(entries: &[(u64, Vec<u8>)], key: &str) -> bool {
    entries
        .iter()
        .any(|(_, e)| e.windows(key.len()).any(|w| w == key.as_bytes()))
}

#[test]
fn keys_land_on_their_own_shards_served_by_each_shards_leader() {
    for (key, shard) in KEYS {
        assert_eq!(cache_shard(key.as_bytes(), SHARDS), shard, "{key}");
    }
    let mut c = ClusterNet::started(&spec(), durable);
    c.until(Duration::from_secs(30), |c| {
        leaders(c, 0).len() == SHARDS as usize && leaders(c, 0).iter().all(|(l, _)| l.is_some())
    });
    let placed = leaders(&c, 0);
    let leader_of = |s: u32| placed[s as usize].0.expect("led");
    let distinct: BTreeSet<usize> = placed.iter().filter_map(|(l, _)| *l).collect();
    assert_eq!(
        distinct.len(),
        3,
        "four shards led over all three nodes: {placed:?}"
    );

    // Every node answers the same count, and owners in shard order as the metadata has them.
    for at in 0..3 {
        let n = cache_ask(&mut c, at, r#""type":"cache_shards","request_id":7"#);
        assert_eq!(n["shards"], SHARDS, "cache_shards through node {at}: {n}");
        let o = ask(
            &mut c,
            at,
            r#""type":"shard_owners","name":"sessions","kind":"cache","request_id":8"#,
        );
        let owners = o["owners"].as_array().expect("owners");
        assert_eq!(owners.len(), SHARDS as usize, "{o}");
        for (s, owner) in owners.iter().enumerate() {
            let want = c.ids[leader_of(s as u32)].clone();
            assert_eq!(
                owner["node_id"],
                want.as_str(),
                "shard {s} through node {at}"
            );
        }
    }

    // Each key written through a node that does not lead its shard: forwarded to the leader.
    let forwards_before: u64 = (0..3)
        .map(|i| c.nodes[i].engine.metrics().forwards_served)
        .sum();
    for (key, shard) in KEYS {
        let via = (0..3).find(|&i| i != leader_of(shard)).unwrap();
        let body = format!(
            r#""type":"cache_put","key":"{key}","value":"{}","request_id":1,"ttl_ms":null"#,
            value_of(key)
        );
        let answer = cache_ask(&mut c, via, &body);
        assert_eq!(answer["type"], "cache_ok", "put {key} via {via}: {answer}");
    }
    let forwards_after: u64 = (0..3)
        .map(|i| c.nodes[i].engine.metrics().forwards_served)
        .sum();
    assert!(
        forwards_after >= forwards_before + KEYS.len() as u64,
        "every put ran on its shard's leader ({forwards_before} → {forwards_after})"
    );

    // Each shard's log holds its own key and no other, on its leader and, once shipped, on
    // every replica (three copies on three nodes).
    c.until(Duration::from_secs(10), |c| {
        KEYS.iter().all(|&(_, s)| {
            let leader = values_log(c, leader_of(s), s);
            (0..3).all(|at| values_log(c, at, s) == leader)
        })
    });
    for (key, shard) in KEYS {
        let leader = leader_of(shard);
        let log = values_log(&c, leader, shard);
        assert_eq!(log.len(), 1, "shard {shard} holds one write");
        assert!(holds_key(&log, key), "{key} is on shard {shard}'s leader");
        for other in (0..SHARDS).filter(|&s| s != shard) {
            assert!(
                !holds_key(&values_log(&c, leader_of(other), other), key),
                "{key} is not on shard {other}"
            );
        }
    }
    // Read back through every node.
    for (key, _) in KEYS {
        for at in 0..3 {
            let body = format!(r#""type":"cache_get","key":"{key}","request_id":2"#);
            let answer = cache_ask(&mut c, at, &body);
            assert_eq!(answer["value"], value_of(key).as_str(), "{key} via {at}");
        }
    }

    // A prefix watch covers one shard: naming none on a cache of four is refused, as is a
    // shard past the cache's width, through any node.
    for at in 0..3 {
        let none = cache_ask(&mut c, at, r#""type":"cache_watch","prefix":"""#);
        assert_eq!(none["type"], "error", "{none}");
        assert_eq!(none["code"], "invalid_request", "{none}");
        let past = cache_ask(&mut c, at, r#""type":"cache_watch","prefix":"","shard":4"#);
        assert_eq!(past["code"], "invalid_request", "{past}");
    }

    // A shard whose leader stops passes to a replica its leader had recorded level, which
    // serves the shard's key; the other shards are untouched by it.
    let control = c.control_leader();
    let (shard, stopped) = KEYS
        .iter()
        .map(|&(_, s)| (s, leader_of(s)))
        .find(|&(_, l)| l != control)
        .expect("a shard led off the control plane's node");
    c.until(Duration::from_secs(10), |c| {
        quiet_level(c, control, shard) == 2
    });
    let generation = placed[shard as usize].1;
    c.freeze(stopped);
    c.until(Duration::from_secs(30), |c| {
        let (l, g) = leaders(c, control)[shard as usize];
        g > generation && l.is_some_and(|l| l != stopped)
    });
    let key = KEYS[shard as usize].0;
    for at in (0..3).filter(|&i| i != stopped) {
        let body = format!(r#""type":"cache_get","key":"{key}","request_id":3"#);
        let answer = cache_ask(&mut c, at, &body);
        assert_eq!(
            answer["value"],
            value_of(key).as_str(),
            "{key} via {at} after failover"
        );
    }
}

/// `POST /v1/caches` (`Engine::create_cache_as`) takes as many shards as a stream may have:
/// 0 and one past `MAX_STREAM_SHARDS` are refused naming `shards`, nothing proposed; 4 is
/// placed, every shard led, as any node shows it.
#[test]
fn an_admin_create_takes_shards_up_to_the_stream_limit_naming_the_field_past_it() {
    use felix_engine::stream_admin::{CacheSpec, MAX_STREAM_SHARDS};
    let mut c = ClusterNet::started(&ClusterSpec::default(), durable);
    let token = c.nodes[0].engine.dev_token().expect("dev mode").to_owned();
    let names = ("t1", "default", "wide");
    for shards in [0, MAX_STREAM_SHARDS + 1] {
        let spec = CacheSpec {
            shards,
            replication_factor: 3,
        };
        let now = c.now;
        let err = c.nodes[0]
            .engine
            .create_cache_as(now, &token, names, spec)
            .unwrap_err();
        assert_eq!(err.field(), Some("shards"), "{shards}: {err}");
        assert_eq!(err.status(), 400);
    }
    let spec = CacheSpec {
        shards: SHARDS,
        replication_factor: 3,
    };
    let now = c.now;
    let first = c.nodes[0].engine.create_cache_as(now, &token, names, spec);
    assert!(matches!(first, Ok(None)), "proposed: {first:?}");
    c.until(Duration::from_secs(10), |c| {
        (0..3).all(|i| {
            c.nodes[i]
                .engine
                .cache_view(c.now, None, names)
                .is_ok_and(|v| v.shards.len() == SHARDS as usize && v.writable())
        })
    });
    let view = c.nodes[2].engine.cache_view(c.now, None, names).unwrap();
    assert_eq!(view.spec, spec);
    assert!(view.shards.iter().all(|s| s.replicas.len() == 3));

    // Values on every shard, then the cache deleted: every shard's logs go, so the cache
    // created again under the name is empty on all of them.
    let wide = |c: &mut ClusterNet, at: usize, body: &str| {
        ask(c, at, &format!(r#""cache":"wide",{body}"#))
    };
    for (key, _) in KEYS {
        let body = format!(
            r#""type":"cache_put","key":"{key}","value":"{}","request_id":1,"ttl_ms":null"#,
            value_of(key)
        );
        let answer = wide(&mut c, 1, &body);
        assert_eq!(answer["type"], "cache_ok", "put {key}: {answer}");
    }
    let now = c.now;
    let incarnation = c.nodes[0]
        .engine
        .delete_cache_as(now, &token, names)
        .expect("deleted");
    c.until(Duration::from_secs(10), |c| {
        (0..3).all(|i| c.nodes[i].engine.cache_deleted_here(names, incarnation))
    });
    let now = c.now;
    let again = c.nodes[0].engine.create_cache_as(now, &token, names, spec);
    assert!(matches!(again, Ok(None)), "proposed again: {again:?}");
    c.until(Duration::from_secs(10), |c| {
        (0..3).all(|i| {
            c.nodes[i]
                .engine
                .cache_view(c.now, None, names)
                .is_ok_and(|v| v.writable())
        })
    });
    for (key, _) in KEYS {
        for at in 0..3 {
            let body = format!(r#""type":"cache_get","key":"{key}","request_id":2"#);
            let answer = wide(&mut c, at, &body);
            assert_eq!(answer["value"], Value::Null, "{key} via {at}: {answer}");
        }
    }
}
