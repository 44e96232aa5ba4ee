//! Real `felix-broker` processes (docs/operations.md, "Caches through the admin API"): a cache
//! of 4 shards with replication factor 3 is created on a running durable cluster through
//! `felix admin caches create`, its shards led over all three nodes; `cache_shards` and
//! `shard_owners` agree with `felix admin caches get` through every node; values written
//! through every node land on every shard; then the node leading the most shards is
//! SIGKILLed and every value is read back through the other nodes, from the shards' new
//! leaders. A cache above the shard limit is refused naming `shards`.
//!
//! The broker and CLI are the workspace's builds (`felix_chaos::harness`).

use std::collections::BTreeSet;
use std::process::Output;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_chaos::cluster::{http_get, Cluster, NAMESPACE, NODES, TENANT};
use felix_chaos::harness::{
    self, admin_layout, cli, client_config, index, started, text, until, until_async, LIMIT,
};
use felix_client::{CacheWatchItem, Client, ClientConfig, WatchFilter, WatchStart};
use felix_proto::routing::{shard_for_key, RoutingMapping};

const CACHE: &str = "sessions";
const SHARDS: u32 = 4;
/// Values written through each node.
const PER_NODE: usize = 8;

/// `felix admin caches ARGS…` against node `at`'s ops endpoint.
fn admin(c: &Cluster, at: usize, args: &[&str]) -> Output {
    harness::admin(c, at, "caches", &c.token, args)
}

/// `felix cache shards` through node `at`'s client port: `cache_shards`, then each shard's
/// owner as `shard_owners` names it.
fn client_shards(c: &Cluster, at: usize) -> Option<(u64, Vec<Option<String>>)> {
    let out = std::process::Command::new(cli())
        .args(["cache", "shards", CACHE, "--addr"])
        .arg(c.nodes[at].client.to_string())
        .arg("--ca")
        .arg(c.dir.join("ca.pem"))
        .args([
            "--token",
            &c.token,
            "--namespace",
            NAMESPACE,
            "--tenant",
            TENANT,
        ])
        .output()
        .expect("the CLI runs");
    if !out.status.success() {
        eprintln!("cache shards through {at}: {}", text(&out));
        return None;
    }
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = stdout.lines();
    let count = lines.next()?.strip_prefix("cache_shards ")?.parse().ok()?;
    let owners = lines
        .map(|l| {
            let node = l.split_whitespace().nth(2).unwrap_or("-");
            (node != "-").then(|| node.to_owned())
        })
        .collect();
    Some((count, owners))
}

/// The cache as `get --json` through node `at` shows it: each shard's leader.
fn leaders(c: &Cluster, at: usize) -> Option<Vec<Option<String>>> {
    let out = admin(c, at, &["get", TENANT, NAMESPACE, CACHE, "--json"]);
    if !out.status.success() {
        eprintln!("get through {at}: {}", text(&out));
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["spec"]["shards"], SHARDS, "{v}");
    assert_eq!(v["spec"]["replication_factor"], 3, "{v}");
    let shards = v["shards"].as_array().expect("shards");
    assert_eq!(shards.len(), SHARDS as usize, "{v}");
    Some(
        shards
            .iter()
            .map(|s| {
                assert_eq!(s["replicas"].as_array().map(Vec::len), Some(3), "{s}");
                (s["writable"] == true)
                    .then(|| s["leader"].as_str().map(str::to_owned))
                    .flatten()
            })
            .collect(),
    )
}

/// Requests the nodes answered with a redirect (`felix_broker_redirects`), all together.
fn redirects(c: &Cluster) -> u64 {
    (0..NODES.len())
        .filter_map(|i| http_get(c.nodes[i].ops, "/metrics", true))
        .flat_map(|(_, body)| {
            body.lines()
                .filter_map(|l| l.strip_prefix("felix_broker_redirects_total "))
                .filter_map(|v| v.trim().parse::<f64>().ok())
                .map(|v| v as u64)
                .collect::<Vec<_>>()
        })
        .sum()
}

/// The node's `felix_broker_leader_shards_quiet`: `leader` shards led there whose followers
/// the cluster recorded level with it (only then may a follower take one over).
fn quiet_shards(c: &Cluster, at: usize) -> Option<u64> {
    let (_, body) = http_get(c.nodes[at].ops, "/metrics", true)?;
    body.lines()
        .find_map(|l| l.strip_prefix("felix_broker_leader_shards_quiet "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

#[test]
fn a_four_shard_cache_spreads_over_the_nodes_and_survives_its_leaders_loss() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut c = started(&admin_layout("felix-admin-caches"));

    // Above the limit streams have too: refused, naming the field.
    let wide = admin(
        &c,
        0,
        &[
            "create", TENANT, NAMESPACE, "wide", "--shards", "1025", "--rf", "3",
        ],
    );
    assert_eq!(wide.status.code(), Some(3), "{}", text(&wide));
    assert!(
        String::from_utf8_lossy(&wide.stderr).contains("400: shards"),
        "{}",
        text(&wide)
    );

    let out = admin(
        &c,
        1,
        &[
            "create", TENANT, NAMESPACE, CACHE, "--shards", "4", "--rf", "3",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("created"),
        "{}",
        text(&out)
    );
    let again = admin(
        &c,
        2,
        &[
            "create", TENANT, NAMESPACE, CACHE, "--shards", "2", "--rf", "3",
        ],
    );
    assert_eq!(again.status.code(), Some(3), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("409: shards"),
        "{}",
        text(&again)
    );

    // Led over all three nodes, and every node says so alike, through the admin API and
    // through the client protocol (`cache_shards`, `shard_owners`).
    let placed = until(&c, "every shard led", || {
        leaders(&c, 0).filter(|l| l.iter().all(Option::is_some))
    });
    let distinct: BTreeSet<&Option<String>> = placed.iter().collect();
    assert_eq!(
        distinct.len(),
        NODES.len(),
        "spread over the nodes: {placed:?}"
    );
    for at in 0..NODES.len() {
        assert_eq!(
            leaders(&c, at).as_ref(),
            Some(&placed),
            "get through node {at}"
        );
        let (count, owners) = until(&c, "cache_shards and shard_owners", || {
            client_shards(&c, at)
        });
        assert_eq!(count, u64::from(SHARDS), "cache_shards through node {at}");
        assert_eq!(owners, placed, "shard_owners through node {at}");
    }

    // Values written through every node, keyed over every shard.
    let mut written: Vec<(String, String)> = Vec::new();
    for (at, node) in NODES.iter().enumerate() {
        for n in 0..PER_NODE {
            let key = format!("key-{at}-{n}");
            let value = format!("value-{node}-{n}");
            rt.block_on(until_async(&c, &format!("put {key}"), || async {
                let answer = match Client::connect(client_config(&c, at)).await {
                    Ok(client) => {
                        let a = client
                            .cache_put(NAMESPACE, CACHE, &key, Bytes::from(value.clone()), None)
                            .await;
                        client.close().await;
                        a.map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                };
                answer
                    .map_err(|e| eprintln!("put {key} through {node}: {e}"))
                    .ok()
            }));
            written.push((key, value));
        }
    }
    let used: BTreeSet<u32> = written
        .iter()
        .map(|(k, _)| shard_for_key(Some(k.as_bytes()), SHARDS, RoutingMapping::Modulo))
        .collect();
    assert_eq!(used.len(), SHARDS as usize, "the keys cover every shard");

    // Our cluster client, seeded with node 0 alone, watches a key of a shard another node
    // leads (not shard 0's): it goes to that owner by the key's hash, so no node answers it
    // with a redirect.
    let (watched, shard) = written
        .iter()
        .map(|(k, _)| {
            (
                k.clone(),
                shard_for_key(Some(k.as_bytes()), SHARDS, RoutingMapping::Modulo),
            )
        })
        .find(|(_, s)| {
            let owner = &placed[*s as usize];
            owner.as_deref() != Some(NODES[0]) && *owner != placed[0]
        })
        .expect("a key of a shard led neither by node 0 nor by shard 0's leader");
    let redirects_before = redirects(&c);
    let change = rt.block_on(async {
        let mut config = ClientConfig::with_seeds(
            vec![c.nodes[0].client],
            c.ca_pem.as_bytes().to_vec(),
            TENANT,
            &c.token,
        );
        config.request_timeout = Duration::from_secs(5);
        let client = Client::connect(config).await.expect("a cluster client");
        let mut watch = client
            .watch_cache(
                NAMESPACE,
                CACHE,
                WatchFilter::Key(watched.clone()),
                WatchStart::Live,
            )
            .await
            .expect("a key watch");
        client
            .cache_put(
                NAMESPACE,
                CACHE,
                &watched,
                Bytes::from_static(b"watched"),
                None,
            )
            .await
            .expect("a put");
        let item = tokio::time::timeout(LIMIT, watch.next())
            .await
            .expect("a change within the limit")
            .expect("a change");
        client.close().await;
        item
    });
    match change {
        CacheWatchItem::Change(ch) => {
            assert_eq!(
                (ch.key.as_str(), ch.value.as_deref()),
                (watched.as_str(), Some(&b"watched"[..]))
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        redirects(&c),
        redirects_before,
        "shard {shard}'s owner was asked directly"
    );
    for (key, value) in written.iter_mut() {
        if *key == watched {
            *value = "watched".into();
        }
    }

    // The node leading the most shards is lost once each of its shards had its followers
    // recorded level with it (a cache's writes are `leader` consistency).
    let victim_id = NODES
        .iter()
        .max_by_key(|n| placed.iter().filter(|l| l.as_deref() == Some(**n)).count())
        .expect("a node");
    let victim = index(victim_id);
    let led = placed
        .iter()
        .filter(|l| l.as_deref() == Some(*victim_id))
        .count() as u64;
    until(&c, "the victim's shards recorded quiet", || {
        (quiet_shards(&c, victim)? >= led).then_some(())
    });
    c.kill(victim).expect("SIGKILL");
    let killed = Instant::now();
    let others: Vec<usize> = (0..NODES.len()).filter(|&i| i != victim).collect();

    // Every shard led by a live node again, as both survivors see it.
    let after = until(&c, "every shard led by a survivor", || {
        let l = leaders(&c, others[0])?;
        l.iter()
            .all(|x| x.as_deref().is_some_and(|x| x != *victim_id))
            .then_some(l)
    });
    // A figure, not a check (docs/operations.md, "A cache of several shards").
    eprintln!(
        "{victim_id} (leading {led} of {SHARDS} shards) SIGKILLed: every shard led by a survivor \
         after {:?}",
        killed.elapsed()
    );
    for (s, (before, now)) in placed.iter().zip(&after).enumerate() {
        if before.as_deref() != Some(*victim_id) {
            assert_eq!(
                before, now,
                "shard {s} was not the victim's: it kept its leader"
            );
        }
    }

    // Every value is read back through each survivor.
    for &at in &others {
        for (key, value) in &written {
            let got = rt.block_on(until_async(&c, &format!("get {key}"), || async {
                let client = Client::connect(client_config(&c, at)).await.ok()?;
                let got = client.cache_get(NAMESPACE, CACHE, key).await;
                client.close().await;
                got.map_err(|e| eprintln!("get {key} through {at}: {e}"))
                    .ok()
            }));
            assert_eq!(
                got.as_deref(),
                Some(value.as_bytes()),
                "{key} through node {at} after {victim_id}'s loss"
            );
        }
    }
    eprintln!(
        "{} values read back through both survivors {:?} after the SIGKILL",
        written.len(),
        killed.elapsed()
    );
    c.stop_all();
}
