//! Exact bytes for one message of each kind (and a snapshot-carrying raft message and an
//! empty replicate), and every truncation of each refused without a panic.

use bytes::Bytes;
use felix_peer_proto::{
    decode_body, decode_frame, encode_frame, Epoch, Fence, FenceAnswer, Follow, FollowFrom,
    Forward, ForwardAnswer, ForwardRefused, Hello, HelloRefusal, HelloRefused, LeaderHint,
    LeaseGrant, LeaseRenew, PeerDecodeError, PeerFrameDecoder, PeerKind, PeerMessage,
    RaftConfState, RaftEntry, RaftEntryType, RaftMessage, RaftMessageType, RaftSnapshot,
    RaftSnapshotMetadata, RefusalReason, ReplicaReport, Replicate, ReplicationRefused, ShardId,
    ShardKind, ShardScope, TailChunk, TailFetch, KIND_TABLE,
};
use felix_proto::ErrorCode;

fn client_frame() -> Bytes {
    felix_proto::Frame::new(felix_proto::Flags::NONE, Bytes::from_static(b"{}")).to_bytes()
}

fn scope() -> ShardScope {
    ShardScope {
        shard: ShardId {
            cluster_id: "c1".into(),
            kind: ShardKind::Stream,
            tenant: "t".into(),
            namespace: "ns".into(),
            name: "orders".into(),
            shard: 3,
        },
        generation: 9,
    }
}

/// The sample shard at the generation a promoted leader fences it with, one above the view's.
fn promoted() -> ShardScope {
    ShardScope {
        generation: 10,
        ..scope()
    }
}

/// Generation 1 wrote from offset 0, generation 9 from 120.
fn epochs() -> Vec<Epoch> {
    vec![
        Epoch {
            generation: 1,
            start: 0,
        },
        Epoch {
            generation: 9,
            start: 120,
        },
    ]
}

/// The view the samples decode under: the sample shard at generation 9.
fn view(s: &ShardId) -> Option<u64> {
    (s == &scope().shard).then_some(9)
}

/// The hex of a golden frame, laid out field by field with spaces and newlines between.
fn unspaced(golden: &str) -> String {
    golden.split_whitespace().collect()
}

/// One sample per kind, and its frame in hex.
fn samples() -> Vec<(PeerMessage, &'static str)> {
    vec![
        (
            PeerMessage::Hello(Hello {
                cluster_id: "c1".into(),
                node_id: "n1".into(),
                protocol_version: 1,
                storage_id: *b"0123456789abcdef",
                incarnation: 7,
            }),
            "
                46585001 0101 00000022
                0002 6331 0002 6e31 0001
                30313233343536373839616263646566 0000000000000007
            ",
        ),
        (
            PeerMessage::HelloAck(Hello {
                cluster_id: "c1".into(),
                node_id: "n2".into(),
                protocol_version: 1,
                storage_id: [0xA5; 16],
                incarnation: 3,
            }),
            "
                46585001 0102 00000022
                0002 6331 0002 6e32 0001
                a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5 0000000000000003
            ",
        ),
        (
            PeerMessage::HelloRefused(HelloRefused {
                reason: HelloRefusal::WrongCluster,
                cluster_id: "c2".into(),
                node_id: "n3".into(),
                protocol_version: 1,
            }),
            "
                46585001 0103 0000000b
                01 0002 6332 0002 6e33 0001
            ",
        ),
        (
            PeerMessage::Raft(RaftMessage {
                msg_type: RaftMessageType::Append,
                to: 2,
                from: 1,
                term: 5,
                log_term: 4,
                index: 10,
                entries: vec![RaftEntry {
                    entry_type: RaftEntryType::Normal,
                    term: 5,
                    index: 11,
                    data: Bytes::from_static(b"put"),
                    context: Bytes::new(),
                    sync_log: false,
                }],
                commit: 9,
                commit_term: 4,
                snapshot: None,
                request_snapshot: 0,
                reject: false,
                reject_hint: 0,
                context: Bytes::new(),
                deprecated_priority: 0,
                priority: -1,
            }),
            "
                46585001 0201 00000080
                03
                0000000000000002 0000000000000001 0000000000000005
                0000000000000004 000000000000000a 0000000000000009
                0000000000000004 0000000000000000
                00 0000000000000000 0000000000000000 ffffffffffffffff
                00000000
                00000001
                00 0000000000000005 000000000000000b 00
                00000003 707574 00000000
                00
            ",
        ),
        (
            PeerMessage::Forward(Forward {
                forward_id: 42,
                scope: scope(),
                tenant: "t".into(),
                principal: "svc".into(),
                frame: client_frame(),
            }),
            "
                46585001 0301 00000042
                000000000000002a
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 0000000000000009
                0001 74 0003 737663
                0000000e 464c58310001000000000002 7b7d
            ",
        ),
        (
            PeerMessage::ForwardAnswer(ForwardAnswer {
                forward_id: 42,
                frame: client_frame(),
            }),
            "
                46585001 0302 0000001a
                000000000000002a
                0000000e 464c58310001000000000002 7b7d
            ",
        ),
        (
            PeerMessage::ForwardRefused(ForwardRefused {
                forward_id: 42,
                code: ErrorCode::NotLeader,
                leader: Some(LeaderHint {
                    node_id: "n2".into(),
                    generation: 10,
                }),
            }),
            "
                46585001 0303 00000017
                000000000000002a 0006 01 0002 6e32 000000000000000a
            ",
        ),
        (
            PeerMessage::Follow(Follow {
                scope: scope(),
                storage_id: "d1".into(),
                epochs: epochs(),
                end: 130,
                durable_end: 128,
                commit: 100,
            }),
            "
                46585001 0401 00000060
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 0000000000000009
                0002 6431
                00000002 0000000000000001 0000000000000000
                         0000000000000009 0000000000000078
                0000000000000082 0000000000000080 0000000000000064
            ",
        ),
        (
            PeerMessage::FollowFrom(FollowFrom {
                scope: scope(),
                truncate_to: 120,
                leader_end: 200,
                commit: 150,
                epochs: epochs(),
                rebuild: false,
            }),
            "
                46585001 0402 0000005d
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 0000000000000009
                0000000000000078 00000000000000c8 0000000000000096
                00000002 0000000000000001 0000000000000000
                         0000000000000009 0000000000000078
                00
            ",
        ),
        (
            PeerMessage::Replicate(Replicate {
                scope: scope(),
                base_offset: 120,
                record_count: 2,
                commit: 118,
                entries: Bytes::from_static(b"ab"),
            }),
            "
                46585001 0403 0000003a
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 0000000000000009
                0000000000000078 00000002 0000000000000076
                00000002 6162
            ",
        ),
        (
            PeerMessage::ReplicaReport(ReplicaReport {
                scope: scope(),
                storage_id: "d2".into(),
                end: 122,
                durable_end: 120,
            }),
            "
                46585001 0404 00000034
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 0000000000000009
                0002 6432 000000000000007a 0000000000000078
            ",
        ),
        (
            PeerMessage::Fence(Fence {
                scope: promoted(),
                leader_storage_id: "d1".into(),
            }),
            "
                46585001 0405 00000024
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 000000000000000a
                0002 6431
            ",
        ),
        (
            PeerMessage::FenceAnswer(FenceAnswer {
                scope: promoted(),
                storage_id: "d2".into(),
                last_generation: 9,
                end: 122,
                durable_end: 122,
                commit: 118,
                epochs: epochs(),
            }),
            "
                46585001 0406 00000068
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 000000000000000a
                0002 6432
                0000000000000009 000000000000007a 000000000000007a 0000000000000076
                00000002 0000000000000001 0000000000000000
                         0000000000000009 0000000000000078
            ",
        ),
        (
            PeerMessage::TailFetch(TailFetch {
                scope: promoted(),
                from: 118,
                max_bytes: 65536,
            }),
            "
                46585001 0407 0000002c
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 000000000000000a
                0000000000000076 00010000
            ",
        ),
        (
            PeerMessage::TailChunk(TailChunk {
                scope: promoted(),
                base_offset: 118,
                record_count: 4,
                entries: Bytes::from_static(b"abcd"),
                end: 122,
                last: true,
            }),
            "
                46585001 0408 0000003d
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 000000000000000a
                0000000000000076 00000004 00000004 61626364 000000000000007a 01
            ",
        ),
        (
            PeerMessage::ReplicationRefused(ReplicationRefused {
                scope: scope(),
                reason: RefusalReason::Fenced,
                current_generation: 10,
                detail: "fenced".into(),
            }),
            "
                46585001 0409 00000031
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 0000000000000009
                03 000000000000000a 0006 66656e636564
            ",
        ),
        (
            PeerMessage::LogStart(felix_peer_proto::LogStart {
                scope: scope(),
                start: 96,
            }),
            "
                46585001 040a 00000028
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 0000000000000009
                0000000000000060
            ",
        ),
        (
            PeerMessage::LeaseRenew(LeaseRenew {
                node: "n1".into(),
                seq: 7,
                storage_id: "d1".into(),
            }),
            "
                46585001 0481 00000010
                0002 6e31 0000000000000007 0002 6431
            ",
        ),
        (
            PeerMessage::LeaseGrant(LeaseGrant {
                seq: 7,
                term: 5,
                lease_ms: 3000,
                applied: 42,
            }),
            "
                46585001 0482 0000001c
                0000000000000007 0000000000000005 00000bb8 000000000000002a
            ",
        ),
    ]
}

/// A raft snapshot message: the nested presence bytes and every conf-state list.
fn snapshot_sample() -> (PeerMessage, &'static str) {
    (
        PeerMessage::Raft(RaftMessage {
            msg_type: RaftMessageType::Snapshot,
            to: 3,
            from: 1,
            term: 2,
            snapshot: Some(RaftSnapshot {
                data: Bytes::from_static(b"S"),
                metadata: Some(RaftSnapshotMetadata {
                    conf_state: Some(RaftConfState {
                        voters: vec![1, 2],
                        learners: vec![],
                        voters_outgoing: vec![3],
                        learners_next: vec![],
                        auto_leave: true,
                    }),
                    index: 100,
                    term: 2,
                }),
            }),
            ..RaftMessage::default()
        }),
        "
                46585001 0201 000000a3
                07
                0000000000000003 0000000000000001 0000000000000002
                0000000000000000 0000000000000000 0000000000000000
                0000000000000000 0000000000000000
                00 0000000000000000 0000000000000000 0000000000000000
                00000000
                00000000
                01 00000001 53
                01 0000000000000064 0000000000000002
                01
                00000002 0000000000000001 0000000000000002
                00000000
                00000001 0000000000000003
                00000000
                01
            ",
    )
}

/// A replicate with no entries: the heartbeat that carries the leader's commit mark alone.
fn heartbeat_sample() -> (PeerMessage, &'static str) {
    (
        PeerMessage::Replicate(Replicate {
            scope: scope(),
            base_offset: 122,
            record_count: 0,
            commit: 121,
            entries: Bytes::new(),
        }),
        "
                46585001 0403 00000038
                0002 6331 01 0001 74 0002 6e73 0006 6f7264657273
                00000003 0000000000000009
                000000000000007a 00000000 0000000000000079
                00000000
            ",
    )
}

fn all_samples() -> Vec<(PeerMessage, &'static str)> {
    let mut v = samples();
    v.push(snapshot_sample());
    v.push(heartbeat_sample());
    v
}

#[test]
fn every_kind_has_a_sample() {
    let kinds: Vec<PeerKind> = samples().iter().map(|(m, _)| m.kind()).collect();
    let table: Vec<PeerKind> = KIND_TABLE.iter().map(|s| s.kind).collect();
    assert_eq!(kinds, table);
}

#[test]
fn each_kind_encodes_to_its_golden_bytes_and_back() {
    for (msg, golden) in all_samples() {
        let mut out = Vec::new();
        encode_frame(&msg, &mut out).unwrap();
        assert_eq!(hex::encode(&out), unspaced(golden), "{}", msg.kind().name());
        let bytes = hex::decode(unspaced(golden)).unwrap();
        let decoded = decode_frame(&Bytes::from(bytes), &view).unwrap();
        assert_eq!(decoded, msg);
    }
}

#[test]
fn every_truncation_is_refused_without_a_panic() {
    for (msg, golden) in all_samples() {
        let bytes = hex::decode(unspaced(golden)).unwrap();
        for cut in 0..bytes.len() {
            let prefix = Bytes::copy_from_slice(&bytes[..cut]);
            assert!(
                matches!(
                    decode_frame(&prefix, &view),
                    Err(PeerDecodeError::Truncated { .. })
                ),
                "{} cut at {cut}",
                msg.kind().name()
            );
            // The body alone, cut short, is refused the same way.
            if cut >= felix_peer_proto::HEADER_LEN {
                let body = prefix.slice(felix_peer_proto::HEADER_LEN..);
                assert!(
                    matches!(
                        decode_body(msg.kind(), &body, &view),
                        Err(PeerDecodeError::Truncated { .. })
                    ),
                    "{} body cut at {cut}",
                    msg.kind().name()
                );
            }
        }
        // One byte too many is refused too.
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            decode_frame(&Bytes::from(long), &view),
            Err(PeerDecodeError::TrailingBytes { extra: 1 })
        );
    }
}

#[test]
fn the_stream_decoder_yields_every_sample_fed_one_byte_at_a_time() {
    let mut wire = Vec::new();
    for (msg, _) in all_samples() {
        encode_frame(&msg, &mut wire).unwrap();
    }
    let mut d = PeerFrameDecoder::default();
    let mut got = Vec::new();
    for b in &wire {
        d.feed(std::slice::from_ref(b));
        while let Some(f) = d.next_frame().unwrap() {
            got.push(f.decode(&view).unwrap());
        }
    }
    let want: Vec<PeerMessage> = all_samples().into_iter().map(|(m, _)| m).collect();
    assert_eq!(got, want);
    assert_eq!(d.buffered(), 0);
}

/// A log riding a shard (a stream shard's group log, kind 3; a cache's counters, kind 4) is
/// replicated under its shard's scope with its own kind: the same fields, one byte apart,
/// and a view that knows the shard accepts it.
#[test]
fn a_riding_logs_scope_is_its_own_kind_and_checked_against_its_shards_generation() {
    for (kind, byte) in [
        (ShardKind::StreamGroups, "03"),
        (ShardKind::CacheCounters, "04"),
    ] {
        let mut riding = scope();
        riding.shard.kind = kind;
        let msg = PeerMessage::ReplicaReport(ReplicaReport {
            scope: riding,
            storage_id: "d2".into(),
            end: 122,
            durable_end: 120,
        });
        let mut out = Vec::new();
        encode_frame(&msg, &mut out).unwrap();
        let golden = format!(
            "46585001 0404 00000034
             0002 6331 {byte} 0001 74 0002 6e73 0006 6f7264657273
             00000003 0000000000000009
             0002 6432 000000000000007a 0000000000000078"
        );
        assert_eq!(hex::encode(&out), unspaced(&golden), "{kind:?}");
        // The view here is the engine's: it answers for a riding log as for its shard.
        let shard_view = |s: &ShardId| {
            let mut as_stream = s.clone();
            as_stream.kind = ShardKind::Stream;
            view(&as_stream)
        };
        let decoded = decode_frame(&Bytes::from(out), &shard_view).unwrap();
        assert_eq!(decoded, msg);
    }
}
