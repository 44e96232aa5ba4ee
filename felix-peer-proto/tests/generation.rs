//! A shard-scoped message is checked against the receiver's generations while it decodes:
//! older is refused, unknown is refused, equal or newer passes; other kinds ignore the view.

use std::collections::HashMap;

use bytes::Bytes;
use felix_peer_proto::{
    decode_frame, encode_frame, Epoch, Fence, FenceAnswer, Follow, FollowFrom, Forward,
    ForwardAnswer, GenerationView, Hello, LeaseGrant, LeaseRenew, NoShards, PeerDecodeError,
    PeerFrameDecoder, PeerKind, PeerMessage, RaftMessage, RefusalReason, ReplicaReport, Replicate,
    ReplicationRefused, ShardId, ShardKind, ShardScope, TailChunk, TailFetch, KIND_TABLE,
};

fn shard(n: u32) -> ShardId {
    ShardId {
        cluster_id: "c1".into(),
        kind: ShardKind::Stream,
        tenant: "t".into(),
        namespace: "ns".into(),
        name: "orders".into(),
        shard: n,
    }
}

fn forward(shard: ShardId, generation: u64) -> Bytes {
    let msg = PeerMessage::Forward(Forward {
        forward_id: 5,
        scope: ShardScope { shard, generation },
        tenant: "t".into(),
        principal: "p".into(),
        frame: Bytes::from_static(b"x"),
    });
    frame(&msg)
}

fn frame(msg: &PeerMessage) -> Bytes {
    let mut out = Vec::new();
    encode_frame(msg, &mut out).unwrap();
    Bytes::from(out)
}

/// Shard 0 at generation 9, shard 1 at 2; nothing else.
fn view() -> HashMap<ShardId, u64> {
    HashMap::from([(shard(0), 9), (shard(1), 2)])
}

struct Map(HashMap<ShardId, u64>);

impl GenerationView for Map {
    fn current(&self, shard: &ShardId) -> Option<u64> {
        self.0.get(shard).copied()
    }
}

#[test]
fn a_stale_generation_is_refused_at_decode() {
    let v = Map(view());
    assert_eq!(
        decode_frame(&forward(shard(0), 8), &v),
        Err(PeerDecodeError::StaleGeneration { got: 8, current: 9 })
    );
    // The same generation number is current for another shard: the view is per shard.
    assert!(decode_frame(&forward(shard(1), 8), &v).is_ok());
    assert!(decode_frame(&forward(shard(0), 9), &v).is_ok());
    // A newer generation passes: the receiver is the one behind.
    assert!(decode_frame(&forward(shard(0), 10), &v).is_ok());
}

#[test]
fn an_unknown_shard_is_its_own_refusal() {
    let v = Map(view());
    assert_eq!(
        decode_frame(&forward(shard(7), 100), &v),
        Err(PeerDecodeError::UnknownShard {
            shard: Box::new(shard(7))
        })
    );
    assert_eq!(
        decode_frame(&forward(shard(0), 9), &NoShards),
        Err(PeerDecodeError::UnknownShard {
            shard: Box::new(shard(0))
        })
    );
}

#[test]
fn a_closure_is_a_view() {
    let map = view();
    let v = |s: &ShardId| map.get(s).copied();
    assert_eq!(
        decode_frame(&forward(shard(1), 1), &v),
        Err(PeerDecodeError::StaleGeneration { got: 1, current: 2 })
    );
}

#[test]
fn kinds_that_are_not_shard_scoped_ignore_the_view() {
    let hello = PeerMessage::Hello(Hello {
        cluster_id: "c1".into(),
        node_id: "n1".into(),
        protocol_version: 1,
        storage_id: [1; 16],
        incarnation: 1,
    });
    let raft = PeerMessage::Raft(RaftMessage::default());
    let answer = PeerMessage::ForwardAnswer(ForwardAnswer {
        forward_id: 5,
        frame: Bytes::from_static(b"y"),
    });
    // A lease is the node's, not one shard's: no scope to check.
    let renew = PeerMessage::LeaseRenew(LeaseRenew {
        node: "n1".into(),
        seq: 1,
        storage_id: "d1".into(),
    });
    let grant = PeerMessage::LeaseGrant(LeaseGrant {
        seq: 1,
        term: 2,
        lease_ms: 3000,
        applied: 4,
    });
    for msg in [hello, raft, answer, renew, grant] {
        assert!(!msg.kind().shard_scoped());
        assert_eq!(decode_frame(&frame(&msg), &NoShards), Ok(msg));
    }
    let scoped: Vec<&str> = KIND_TABLE
        .iter()
        .filter(|s| s.shard_scoped)
        .map(|s| s.name)
        .collect();
    assert_eq!(
        scoped,
        [
            "forward",
            "follow",
            "follow_from",
            "replicate",
            "replica_report",
            "fence",
            "fence_answer",
            "tail_fetch",
            "tail_chunk",
            "replication_refused",
            "log_start",
        ]
    );
}

/// One message of every shard-scoped replication kind, under `scope`.
fn replication(scope: ShardScope) -> Vec<PeerMessage> {
    let epochs = vec![Epoch {
        generation: scope.generation,
        start: 0,
    }];
    vec![
        PeerMessage::Follow(Follow {
            scope: scope.clone(),
            storage_id: "d2".into(),
            epochs: epochs.clone(),
            end: 5,
            durable_end: 5,
            commit: 3,
        }),
        PeerMessage::FollowFrom(FollowFrom {
            scope: scope.clone(),
            truncate_to: 4,
            leader_end: 9,
            commit: 3,
            epochs: epochs.clone(),
            rebuild: false,
        }),
        PeerMessage::Replicate(Replicate {
            scope: scope.clone(),
            base_offset: 4,
            record_count: 1,
            commit: 3,
            entries: Bytes::from_static(b"e"),
        }),
        PeerMessage::ReplicaReport(ReplicaReport {
            scope: scope.clone(),
            storage_id: "d2".into(),
            end: 5,
            durable_end: 5,
        }),
        PeerMessage::Fence(Fence {
            scope: scope.clone(),
            leader_storage_id: "d1".into(),
        }),
        PeerMessage::FenceAnswer(FenceAnswer {
            scope: scope.clone(),
            storage_id: "d2".into(),
            last_generation: 1,
            end: 5,
            durable_end: 5,
            commit: 3,
            epochs,
        }),
        PeerMessage::TailFetch(TailFetch {
            scope: scope.clone(),
            from: 3,
            max_bytes: 1024,
        }),
        PeerMessage::TailChunk(TailChunk {
            scope: scope.clone(),
            base_offset: 3,
            record_count: 0,
            entries: Bytes::new(),
            end: 3,
            last: true,
        }),
        PeerMessage::ReplicationRefused(ReplicationRefused {
            scope: scope.clone(),
            reason: RefusalReason::StaleGeneration,
            current_generation: 9,
            detail: String::new(),
        }),
        PeerMessage::LogStart(felix_peer_proto::LogStart { scope, start: 4 }),
    ]
}

#[test]
fn every_replication_kind_checks_its_generation_at_decode() {
    let v = Map(view());
    let at = |shard, generation| replication(ShardScope { shard, generation });
    // Every scoped kind of the family is here.
    let kinds: Vec<PeerKind> = at(shard(0), 9).iter().map(PeerMessage::kind).collect();
    let want: Vec<PeerKind> = KIND_TABLE
        .iter()
        .filter(|s| s.shard_scoped && s.kind != PeerKind::Forward)
        .map(|s| s.kind)
        .collect();
    assert_eq!(kinds, want);

    for msg in at(shard(0), 8) {
        // A deposed leader's shipment, or an answer to one, never reaches the engine.
        assert_eq!(
            decode_frame(&frame(&msg), &v),
            Err(PeerDecodeError::StaleGeneration { got: 8, current: 9 }),
            "{}",
            msg.kind().name()
        );
    }
    // Current passes, and so does newer: a fence names the generation it promotes to, which
    // the replica may not have applied yet.
    for generation in [9, 10] {
        for msg in at(shard(0), generation) {
            assert_eq!(decode_frame(&frame(&msg), &v).as_ref(), Ok(&msg));
        }
    }
    for msg in at(shard(7), 9) {
        assert_eq!(
            decode_frame(&frame(&msg), &v),
            Err(PeerDecodeError::UnknownShard {
                shard: Box::new(shard(7))
            })
        );
    }
}

#[test]
fn a_stale_message_does_not_end_the_link() {
    let v = Map(view());
    let mut d = PeerFrameDecoder::default();
    d.feed(&forward(shard(0), 1));
    d.feed(&forward(shard(0), 9));
    let first = d.next_frame().unwrap().unwrap();
    assert!(matches!(
        first.decode(&v),
        Err(PeerDecodeError::StaleGeneration { got: 1, current: 9 })
    ));
    let second = d.next_frame().unwrap().unwrap();
    assert!(second.decode(&v).is_ok());
}
