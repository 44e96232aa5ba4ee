//! A durable cluster keeps its metadata on disk: a node restarted from its data directory, or
//! every node at once, comes back with its term, its applied index and the same placement and
//! generations, and serves from them; a node whose directory was wiped is blank and catches
//! up from the others (by their snapshot, since their logs are compacted).

use std::path::{Path, PathBuf};

use felix_integration::cluster_support::{Cluster, NODES};
use felix_integration::durable_support::TempDir;
use felix_integration::ops_support::{scrape, value};
use felix_integration::within;

/// The node's metadata term and applied index, from `/metrics`.
async fn progress(c: &Cluster, i: usize) -> (u64, u64) {
    let ops = c.nodes[i].ops;
    let s = tokio::task::spawn_blocking(move || scrape(ops))
        .await
        .unwrap();
    (
        value(&s, "felix_broker_cluster_metadata_term") as u64,
        value(&s, "felix_broker_cluster_metadata_applied") as u64,
    )
}

/// Who leads each shard, without generations: a node that was down long enough had its
/// shards handed on (to nobody, with one replica) and back, each time at a new generation.
fn leaders(owners: &[felix_proto::message::ShardOwner]) -> Vec<(u64, Option<String>)> {
    owners
        .iter()
        .map(|o| (o.shard, o.node_id.clone()))
        .collect()
}

/// Asks node `i` until every shard is led by the node it was led by in `expected`, and
/// returns that answer; at most 30 s, then fails naming what it saw last.
async fn settled(
    c: &Cluster,
    i: usize,
    expected: &[felix_proto::message::ShardOwner],
) -> Vec<felix_proto::message::ShardOwner> {
    let last = std::cell::RefCell::new(Vec::new());
    let wait = async {
        loop {
            let changed = c.brokers[i].as_ref().expect("running").metadata_changed();
            let now = c.owners(i).await;
            if leaders(&now) == leaders(expected) {
                return now;
            }
            *last.borrow_mut() = now;
            let _ = changed.await;
        }
    };
    match tokio::time::timeout(std::time::Duration::from_secs(30), wait).await {
        Ok(now) => now,
        Err(_) => panic!(
            "node {} did not settle within 30 s: wanted leaders {:?}, saw {:?}",
            NODES[i],
            leaders(expected),
            last.borrow()
        ),
    }
}

async fn stop(c: &mut Cluster, i: usize) {
    let b = c.brokers[i].take().expect("running");
    within(15, b.shutdown()).await.expect("clean shutdown");
}

fn metadata_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("cluster"))
        .expect("a durable node has a cluster/ directory")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_durable_cluster_keeps_its_metadata_across_restarts() {
    felix_integration::test_logs();
    let dirs: Vec<TempDir> = NODES
        .iter()
        .map(|n| TempDir::new(&format!("metalog-{n}")))
        .collect();
    let paths: Vec<PathBuf> = dirs.iter().map(|d| d.path().to_path_buf()).collect();
    // A small threshold, so the metadata logs are compacted into snapshots along the way.
    let mut c = Cluster::start_durable(6, paths.clone(), Some(512)).await;
    let owners = c.owners(0).await;
    assert_eq!(owners.len(), 6);
    let mut before = Vec::new();
    for (i, name) in NODES.iter().enumerate() {
        let (term, applied) = progress(&c, i).await;
        assert!(term >= 1 && applied >= 1, "{name}: {term} {applied}");
        before.push((term, applied));
    }

    // One node restarts from its directory.
    stop(&mut c, 2).await;
    c.brokers[2] = Some(c.boot(2, 6).await);
    c.wait_ready(2).await;
    let (term, applied) = progress(&c, 2).await;
    assert!(term >= before[2].0, "term {term} < {:?}", before[2]);
    assert!(
        applied >= before[2].1,
        "applied {applied} < {:?}",
        before[2]
    );
    // Same placement; the generation moved only where the stopped node led (if it was down
    // longer than its lease), and never back.
    let after = settled(&c, 2, &owners).await;
    for (a, b) in after.iter().zip(&owners) {
        assert!(a.generation >= b.generation, "{a:?} {b:?}");
    }

    // Every node stops, then all restart from their directories.
    let mid_owners = settled(&c, 0, &owners).await;
    let mut mid = Vec::new();
    for i in 0..NODES.len() {
        mid.push(progress(&c, i).await);
    }
    for i in 0..NODES.len() {
        stop(&mut c, i).await;
    }
    for (i, p) in paths.iter().enumerate() {
        let files = metadata_files(p);
        assert!(
            files.contains(&"meta.snapshot".to_owned()),
            "{}: {files:?}",
            NODES[i]
        );
        assert_eq!(
            files.iter().filter(|f| f.ends_with(".log")).count(),
            1,
            "{}: {files:?}",
            NODES[i]
        );
        assert!(!files.iter().any(|f| f.ends_with(".tmp")), "{files:?}");
    }
    // Alone, n1 cannot reach a quorum: it replays its metadata and answers from it, with no
    // election (a blank node could not: it would wait to join). It is not ready: without a
    // majority nobody renews its lease, so it must not take writes.
    c.brokers[0] = Some(c.boot(0, 6).await);
    within(20, async {
        loop {
            let changed = c.brokers[0].as_ref().expect("running").metadata_changed();
            if progress(&c, 0).await == mid[0] {
                return;
            }
            let _ = changed.await;
        }
    })
    .await;
    assert_eq!(c.owners(0).await, mid_owners, "replayed, nothing new");
    for i in 1..NODES.len() {
        c.brokers[i] = Some(c.boot(i, 6).await);
    }
    for i in 1..NODES.len() {
        c.wait_ready(i).await;
    }
    for (i, (term0, applied0)) in mid.iter().enumerate() {
        let (term, applied) = progress(&c, i).await;
        assert!(term >= *term0, "{}: term {term} < {term0}", NODES[i]);
        assert!(
            applied >= *applied0,
            "{}: applied {applied} < {applied0}",
            NODES[i]
        );
        settled(&c, i, &owners).await;
    }

    // A wiped directory is a blank node: it learns everything again from the others. The
    // shards it held alone lost their only copy with the disk: nobody leads them, rather than
    // the blank node serving them empty (docs/replication.md).
    stop(&mut c, 1).await;
    std::fs::remove_dir_all(&paths[1]).unwrap();
    std::fs::create_dir_all(&paths[1]).unwrap();
    c.brokers[1] = Some(c.boot(1, 6).await);
    c.wait_ready(1).await;
    let mut orphaned = owners.clone();
    for o in orphaned.iter_mut() {
        if o.node_id.as_deref() == Some(NODES[1]) {
            o.node_id = None;
        }
    }
    assert!(orphaned != owners, "placement gives n2 a shard to lead");
    settled(&c, 1, &orphaned).await;
    let (_, applied) = progress(&c, 1).await;
    assert!(applied >= mid[1].1, "caught up: {applied}");
    c.shutdown().await;
}
