//! Real `felix-broker` processes (docs/operations.md, "Retention per stream"): a quorum
//! stream of 2 shards with three copies is created through `felix admin streams create`
//! with no retention on a cluster with none broker-wide, filled, then given a size bound
//! with `felix admin streams alter` through another node. Every copy of every shard, on
//! every node, then starts at the offset its leader cut at (each node's own `GET` shows where
//! its copy starts), and the old segment files are gone from every node's disk, though each
//! node rolls its segments at its own size.
//!
//! The broker and CLI are the workspace's builds (`felix_chaos::harness`).

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_chaos::cluster::{Cluster, NAMESPACE, NODES, TENANT};
use felix_chaos::harness::{self, admin_layout, all_ready, laid_out, text, until, LIMIT};
use felix_client::{Ack, Client, ClientConfig, Offer};

const STREAM: &str = "retained";
const SHARDS: usize = 2;
/// The size bound the alter sets, per shard.
const MAX_BYTES: u64 = 16_384;

/// `felix admin streams ARGS…` against node `at`'s ops endpoint.
fn admin(c: &Cluster, at: usize, args: &[&str]) -> Output {
    harness::admin(c, at, "streams", &c.token, args)
}

/// Where node `at`'s own copy of each shard starts, as its `get --json` shows it.
fn starts_on(c: &Cluster, at: usize) -> Option<Vec<u64>> {
    let out = admin(c, at, &["get", TENANT, NAMESPACE, STREAM, "--json"]);
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["shards"]
        .as_array()?
        .iter()
        .map(|s| s["here"]["log_start"].as_u64())
        .collect()
}

/// Every node's view: `[node][shard]`.
fn starts(c: &Cluster) -> Option<Vec<Vec<u64>>> {
    (0..NODES.len()).map(|i| starts_on(c, i)).collect()
}

/// The segment files of `STREAM`'s shards on node `id`'s disk, by shard directory.
fn segments_on(c: &Cluster, id: &str) -> Vec<(String, Vec<u64>)> {
    fn walk(dir: &Path, out: &mut Vec<(String, Vec<u64>)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut segs = Vec::new();
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if let Some(base) = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".seg"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                segs.push(base);
            }
        }
        let d = dir.to_string_lossy();
        if !segs.is_empty() && d.contains("/streams/") && d.contains(STREAM) {
            segs.sort();
            out.push((dir.display().to_string(), segs));
        }
    }
    let mut out = Vec::new();
    walk(&c.dir.join(id).join("data"), &mut out);
    out.sort();
    out
}

#[test]
fn altering_retention_cuts_every_copy_at_its_leaders_offset() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut c = laid_out(&admin_layout("felix-admin-retention"));
    // Small segments, of another size on each node, and retention checked often. A child
    // takes the environment as it is when it starts (this file's only test sets it).
    std::env::set_var("FELIX_DURABLE_RETENTION_CHECK_INTERVAL_MS", "200");
    for (i, size) in [4096, 6000, 3000].iter().enumerate() {
        std::env::set_var("FELIX_DURABLE_SEGMENT_MAX_BYTES", size.to_string());
        c.start(i).expect("a node starts");
    }
    all_ready(&mut c);

    let out = admin(
        &c,
        0,
        &[
            "create",
            TENANT,
            NAMESPACE,
            STREAM,
            "--shards",
            "2",
            "--rf",
            "3",
            "--consistency",
            "quorum",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));

    // 64 KiB into each shard, in acknowledged batches of 10 records of 400 bytes.
    let mut config = ClientConfig::new(
        c.nodes[1].client,
        c.ca_pem.as_bytes().to_vec(),
        TENANT,
        &c.token,
    );
    config.request_timeout = Duration::from_secs(5);
    config.offer = Offer::reference_client();
    rt.block_on(async {
        let deadline = Instant::now() + LIMIT;
        let mut sent = 0;
        let mut n = 0u64;
        while sent < 2 * 16 {
            assert!(
                Instant::now() < deadline,
                "publishes not acknowledged in time"
            );
            let Ok(client) = Client::connect(config.clone()).await else {
                continue;
            };
            while sent < 2 * 16 {
                let batch: Vec<Bytes> = (0..10).map(|_| Bytes::from(vec![b'r'; 400])).collect();
                let key = Bytes::from(format!("key-{}", n % 7));
                match client
                    .publish(NAMESPACE, STREAM, batch, Some(key), Ack::PerMessage)
                    .await
                {
                    Ok(Some(_)) => sent += 1,
                    other => {
                        eprintln!("publish: {other:?}");
                        break;
                    }
                }
                n += 1;
            }
            client.close().await;
        }
    });
    // No retention yet anywhere: every copy starts at 0 once it holds the shard.
    let before = starts(&c).expect("every node shows its copies");
    assert_eq!(before, vec![vec![0; SHARDS]; NODES.len()]);
    for id in NODES {
        for (dir, segs) in segments_on(&c, id) {
            assert_eq!(segs.first(), Some(&0), "{id}: {dir}");
            assert!(segs.len() > 3, "{id}: {dir}: {segs:?}");
        }
    }

    // The alter, through node 2.
    let altered_at = Instant::now();
    let max = MAX_BYTES.to_string();
    let alter = admin(
        &c,
        2,
        &["alter", TENANT, NAMESPACE, STREAM, "--max-bytes", &max],
    );
    assert!(alter.status.success(), "{}", text(&alter));

    // Every copy starts where its leader cut: one offset per shard, on every node.
    let cut = until(&c, "every copy cut alike", || {
        let s = starts(&c)?;
        let alike = s[0].iter().all(|&x| x > 0) && s.iter().all(|n| *n == s[0]);
        alike.then(|| s[0].clone())
    });
    eprintln!(
        "every copy starts at {cut:?}, {:?} after the alter was asked",
        altered_at.elapsed()
    );
    // The old segments are gone from every disk: what is left starts at most one segment
    // below the cut, and no file holds only records below it.
    for id in NODES {
        let dirs = segments_on(&c, id);
        assert_eq!(dirs.len(), SHARDS, "{id}: {dirs:?}");
        for (dir, segs) in dirs {
            assert!(segs[0] > 0, "{id}: {dir}: {segs:?}");
            assert!(
                segs.get(1)
                    .is_none_or(|&second| cut.iter().any(|&c| second > c)),
                "{id}: {dir}: a segment wholly below the cut is left: {segs:?} vs {cut:?}"
            );
        }
    }
    c.stop_all();
}
