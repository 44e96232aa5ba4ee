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

/// Node `at`'s own copy of each shard, as its `get --json` shows it: the `bound` field
/// (`log_start` or `log_end`) of each shard's `here`.
fn bounds_on(c: &Cluster, at: usize, bound: &str) -> Option<Vec<u64>> {
    let out = admin(c, at, &["get", TENANT, NAMESPACE, STREAM, "--json"]);
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["shards"]
        .as_array()?
        .iter()
        .map(|s| s["here"][bound].as_u64())
        .collect()
}

/// Where every node's copy of each shard starts: `[node][shard]`.
fn starts(c: &Cluster) -> Option<Vec<Vec<u64>>> {
    (0..NODES.len())
        .map(|i| bounds_on(c, i, "log_start"))
        .collect()
}

/// Where every node's copy of each shard ends: `[node][shard]`.
fn ends(c: &Cluster) -> Option<Vec<Vec<u64>>> {
    (0..NODES.len())
        .map(|i| bounds_on(c, i, "log_end"))
        .collect()
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

/// Every shard's directory is on the disk, starts at segment 0, and holds several segments.
fn filled(dirs: &[(String, Vec<u64>)]) -> bool {
    dirs.len() == SHARDS
        && dirs
            .iter()
            .all(|(_, segs)| segs.first() == Some(&0) && segs.len() > 3)
}

/// Every shard's directory is on the disk, and none holds a segment wholly below its shard's
/// cut: the second segment, if any, starts past the cut. The directory's name ends with the
/// shard's number.
fn cut_on(dirs: &[(String, Vec<u64>)], cut: &[u64]) -> bool {
    dirs.len() == SHARDS
        && dirs.iter().all(|(dir, segs)| {
            let shard: usize = dir
                .rsplit('/')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            segs.get(1).is_none_or(|&second| second > cut[shard])
        })
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
    // A quorum publish is answered once two copies hold it; wait for the third to catch up
    // and for every copy's segments to be on its disk (log ends, syncs and segment births
    // are among the changes `until` follows).
    let ends = until(&c, "every copy holds the whole log on disk", || {
        let e = ends(&c)?;
        let alike = e.iter().all(|n| *n == e[0]) && e[0].iter().all(|&x| x > 0);
        (alike && NODES.iter().all(|id| filled(&segments_on(&c, id)))).then(|| e[0].clone())
    });
    eprintln!("every copy ends at {ends:?}");
    // No retention yet anywhere: every copy starts at 0 once it holds the shard.
    let before = starts(&c).expect("every node shows its copies");
    assert_eq!(before, vec![vec![0; SHARDS]; NODES.len()]);
    for id in NODES {
        let dirs = segments_on(&c, id);
        assert!(filled(&dirs), "{id}: {dirs:?}");
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
    // The old segments leave every disk: what is left starts at most one segment below the
    // cut, and no file holds only records below it. A copy removes its files one by one
    // after its start moved (each removal a change `until` follows).
    let left = until(&c, "every disk rid of the segments below the cut", || {
        let left: Vec<_> = NODES.iter().map(|id| segments_on(&c, id)).collect();
        left.iter().all(|dirs| cut_on(dirs, &cut)).then_some(left)
    });
    for (id, dirs) in NODES.iter().zip(left) {
        assert_eq!(dirs.len(), SHARDS, "{id}: {dirs:?}");
        for (dir, segs) in dirs {
            assert!(segs[0] > 0, "{id}: {dir}: {segs:?}");
        }
    }
    c.stop_all();
}
