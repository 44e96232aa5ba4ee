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
    assert_eq!(c.owners(2).await, owners, "same placement and generations");

    // Every node stops, then all restart from their directories.
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
    // Alone, n1 cannot reach a quorum: it serves from what it replayed, with no election
    // (a blank node could not: it would wait to join).
    c.brokers[0] = Some(c.boot(0, 6).await);
    c.wait_ready(0).await;
    assert_eq!(progress(&c, 0).await, mid[0], "replayed, nothing new");
    assert_eq!(c.owners(0).await, owners);
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
        assert_eq!(c.owners(i).await, owners, "{}", NODES[i]);
    }

    // A wiped directory is a blank node: it learns everything again from the others.
    stop(&mut c, 1).await;
    std::fs::remove_dir_all(&paths[1]).unwrap();
    std::fs::create_dir_all(&paths[1]).unwrap();
    c.brokers[1] = Some(c.boot(1, 6).await);
    c.wait_ready(1).await;
    assert_eq!(c.owners(1).await, owners);
    let (_, applied) = progress(&c, 1).await;
    assert!(applied >= mid[1].1, "caught up: {applied}");
    c.shutdown().await;
}
