//! Replays every saved input of the peer fuzz targets (`fuzz/corpus/peer_*/`) through the
//! same check the targets run, so a regression found once stays caught by `cargo test`.

use std::fs;
use std::path::PathBuf;

use felix_peer_proto::fuzzing;
use felix_peer_proto::Family;

fn replay(target: &str, family: Family) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut inputs: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{} has no corpus: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} is empty", dir.display());
    for path in &inputs {
        let data = fs::read(path).unwrap();
        if let Err(panic) = std::panic::catch_unwind(|| fuzzing::family(family, &data)) {
            std::panic::resume_unwind(Box::new(format!(
                "{}: {:?}",
                path.display(),
                panic.downcast_ref::<String>()
            )));
        }
    }
}

#[test]
fn peer_hello_corpus() {
    replay("peer_hello", Family::Hello);
}

#[test]
fn peer_raft_corpus() {
    replay("peer_raft", Family::Raft);
}

#[test]
fn peer_forward_corpus() {
    replay("peer_forward", Family::Forward);
}

#[test]
fn peer_replication_corpus() {
    replay("peer_replication", Family::Replication);
}

const TARGETS: [(&str, Family); 4] = [
    ("peer_hello", Family::Hello),
    ("peer_raft", Family::Raft),
    ("peer_forward", Family::Forward),
    ("peer_replication", Family::Replication),
];

/// The kinds of the seeds of `target` that decode.
fn seeded_kinds(target: &str, family: Family) -> Vec<felix_peer_proto::PeerKind> {
    use bytes::Bytes;
    let view = |_: &felix_peer_proto::ShardId| Some(0);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let data = fs::read(e.unwrap().path()).unwrap();
            let (&low, body) = data.split_first()?;
            let kind = felix_peer_proto::PeerKind::from_code(
                u16::from(family as u8) << 8 | u16::from(low),
            )?;
            felix_peer_proto::decode_body(kind, &Bytes::copy_from_slice(body), &view)
                .ok()
                .map(|m| m.kind())
        })
        .collect()
}

/// The seeds are real messages: each decodes (the check would pass vacuously on garbage).
#[test]
fn the_seeds_decode() {
    for (target, family) in TARGETS {
        assert!(
            !seeded_kinds(target, family).is_empty(),
            "{target} has no seed that decodes"
        );
    }
}

/// The replication family's seeds are its golden frames, one or more of every kind.
#[test]
fn every_replication_kind_is_seeded() {
    let seeded = seeded_kinds("peer_replication", Family::Replication);
    for spec in felix_peer_proto::KIND_TABLE {
        if spec.family == Family::Replication {
            assert!(seeded.contains(&spec.kind), "no seed for {}", spec.name);
        }
    }
}
