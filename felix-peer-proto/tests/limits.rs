//! Every named limit at its edge: the limit itself passes, one more is refused with the
//! named error, on the sending side and on the receiving side.

use bytes::Bytes;
use felix_peer_proto::limits::{
    Limit, MAX_CONF_NODES, MAX_CONTEXT_BYTES, MAX_ENTRY_DATA_BYTES, MAX_EPOCHS,
    MAX_FORWARDED_FRAME_BYTES, MAX_FRAME_BODY_BYTES, MAX_RAFT_ENTRIES, MAX_REPLICATED_BYTES,
    MAX_SNAPSHOT_DATA_BYTES, MAX_STRING_BYTES,
};
use felix_peer_proto::{
    decode_frame, encode_frame, Epoch, FenceAnswer, Follow, FollowFrom, Forward, ForwardAnswer,
    Hello, PeerDecodeError, PeerEncodeError, PeerFrameDecoder, PeerHeader, PeerKind, PeerMessage,
    RaftConfState, RaftEntry, RaftMessage, RaftSnapshot, RaftSnapshotMetadata, Replicate, ShardId,
    ShardKind, ShardScope, TailChunk, HEADER_LEN,
};

fn any_shard(_: &ShardId) -> Option<u64> {
    Some(0)
}

fn hello(node_id: String) -> PeerMessage {
    PeerMessage::Hello(Hello {
        cluster_id: "c".into(),
        node_id,
        protocol_version: 1,
        storage_id: [0; 16],
        incarnation: 0,
    })
}

fn raft(f: impl FnOnce(&mut RaftMessage)) -> PeerMessage {
    let mut m = RaftMessage::default();
    f(&mut m);
    PeerMessage::Raft(m)
}

/// A scope of one-byte names: 2+1, 1, 2+1, 2+1, 2+1, 4, 8 bytes.
fn scope() -> ShardScope {
    ShardScope {
        shard: ShardId {
            cluster_id: "c".into(),
            kind: ShardKind::Cache,
            tenant: "t".into(),
            namespace: "n".into(),
            name: "x".into(),
            shard: 0,
        },
        generation: 0,
    }
}

const SCOPE_LEN: usize = 3 + 1 + 3 + 3 + 3 + 4 + 8;

fn forward(frame: Bytes) -> PeerMessage {
    PeerMessage::Forward(Forward {
        forward_id: 1,
        scope: scope(),
        tenant: "t".into(),
        principal: "p".into(),
        frame,
    })
}

fn zeros(n: usize) -> Bytes {
    Bytes::from(vec![0u8; n])
}

/// `at` encodes and decodes back; `past` is refused by the encoder with `limit`, and the
/// bytes of `at` with the offending count or length bumped by one are refused by the decoder
/// with `limit` too. `bump` finds that length in the frame.
fn edge(limit: Limit, at: PeerMessage, past: PeerMessage, bump: impl Fn(&mut Vec<u8>)) {
    let mut frame = Vec::new();
    encode_frame(&at, &mut frame).unwrap_or_else(|e| panic!("{limit:?} at the limit: {e}"));
    let ok = Bytes::from(frame.clone());
    assert_eq!(decode_frame(&ok, &any_shard).as_ref(), Ok(&at));

    let mut out = vec![0xEE];
    match encode_frame(&past, &mut out) {
        Err(PeerEncodeError::OverLimit { limit: l, got, .. }) => {
            assert_eq!(l, limit);
            assert_eq!(got, limit.max() as u64 + 1);
        }
        other => panic!("{limit:?} + 1 encoded: {other:?}"),
    }
    assert_eq!(out, vec![0xEE], "a refused encode leaves nothing behind");

    bump(&mut frame);
    match decode_frame(&Bytes::from(frame), &any_shard) {
        Err(PeerDecodeError::OverLimit { limit: l, got, .. }) => {
            assert_eq!(l, limit);
            assert_eq!(got, limit.max() as u64 + 1);
        }
        other => panic!("{limit:?} + 1 decoded: {other:?}"),
    }
}

/// Adds one to the big-endian integer of `width` bytes at `at`.
fn plus_one(frame: &mut [u8], at: usize, width: usize) {
    let field = &mut frame[at..at + width];
    let mut v = field.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b));
    v += 1;
    for (i, b) in field.iter_mut().rev().enumerate() {
        *b = (v >> (8 * i)) as u8;
    }
}

/// Where the raft message's `context` length sits: header, type, 12 fixed fields.
const RAFT_CONTEXT_AT: usize = HEADER_LEN + 1 + 8 * 8 + 1 + 8 * 3;
const RAFT_ENTRIES_AT: usize = RAFT_CONTEXT_AT + 4;

#[test]
fn string_limit() {
    // hello.node_id's length follows cluster_id ("c": 2 + 1 bytes).
    edge(
        Limit::String,
        hello("n".repeat(MAX_STRING_BYTES)),
        hello("n".repeat(MAX_STRING_BYTES + 1)),
        |f| plus_one(f, HEADER_LEN + 3, 2),
    );
}

#[test]
fn context_limit() {
    edge(
        Limit::Context,
        raft(|m| m.context = zeros(MAX_CONTEXT_BYTES)),
        raft(|m| m.context = zeros(MAX_CONTEXT_BYTES + 1)),
        |f| plus_one(f, RAFT_CONTEXT_AT, 4),
    );
}

#[test]
fn entries_limit() {
    let n = |count| raft(|m| m.entries = vec![RaftEntry::default(); count]);
    edge(
        Limit::RaftEntries,
        n(MAX_RAFT_ENTRIES),
        n(MAX_RAFT_ENTRIES + 1),
        |f| plus_one(f, RAFT_ENTRIES_AT, 4),
    );
}

#[test]
fn entry_data_limit() {
    let e = |len| {
        raft(|m| {
            m.entries = vec![RaftEntry {
                data: zeros(len),
                ..RaftEntry::default()
            }]
        })
    };
    // The entry's data length follows type, term, index, sync_log.
    edge(
        Limit::EntryData,
        e(MAX_ENTRY_DATA_BYTES),
        e(MAX_ENTRY_DATA_BYTES + 1),
        |f| plus_one(f, RAFT_ENTRIES_AT + 4 + 18, 4),
    );
}

#[test]
fn snapshot_data_limit() {
    let s = |len| {
        raft(|m| {
            m.snapshot = Some(RaftSnapshot {
                data: zeros(len),
                metadata: None,
            })
        })
    };
    // Zero entries, then the presence byte, then the data length.
    edge(
        Limit::SnapshotData,
        s(MAX_SNAPSHOT_DATA_BYTES),
        s(MAX_SNAPSHOT_DATA_BYTES + 1),
        |f| plus_one(f, RAFT_ENTRIES_AT + 4 + 1, 4),
    );
}

#[test]
fn conf_nodes_limit() {
    let c = |n| {
        raft(|m| {
            m.snapshot = Some(RaftSnapshot {
                data: Bytes::new(),
                metadata: Some(RaftSnapshotMetadata {
                    conf_state: Some(RaftConfState {
                        voters: vec![7; n],
                        ..RaftConfState::default()
                    }),
                    index: 0,
                    term: 0,
                }),
            })
        })
    };
    // Presence, empty data, presence, index, term, presence, then the voters count.
    edge(
        Limit::ConfNodes,
        c(MAX_CONF_NODES),
        c(MAX_CONF_NODES + 1),
        |f| plus_one(f, RAFT_ENTRIES_AT + 4 + 1 + 4 + 1 + 16 + 1, 4),
    );
}

#[test]
fn forwarded_frame_limit() {
    // Id 8, scope, tenant 2+1, principal 2+1.
    let frame_at = HEADER_LEN + 8 + SCOPE_LEN + 3 + 3;
    edge(
        Limit::ForwardedFrame,
        forward(zeros(MAX_FORWARDED_FRAME_BYTES)),
        forward(zeros(MAX_FORWARDED_FRAME_BYTES + 1)),
        |f| plus_one(f, frame_at, 4),
    );
    let answer = |len| {
        PeerMessage::ForwardAnswer(ForwardAnswer {
            forward_id: 0,
            frame: zeros(len),
        })
    };
    edge(
        Limit::ForwardedFrame,
        answer(MAX_FORWARDED_FRAME_BYTES),
        answer(MAX_FORWARDED_FRAME_BYTES + 1),
        |f| plus_one(f, HEADER_LEN + 8, 4),
    );
}

/// `n` epochs, strictly increasing like a real log's.
fn epochs(n: usize) -> Vec<Epoch> {
    (0..n as u64)
        .map(|i| Epoch {
            generation: i + 1,
            start: i * 10,
        })
        .collect()
}

#[test]
fn epochs_limit() {
    // Follow: scope, empty storage id (2), then the count.
    let follow = |n| {
        PeerMessage::Follow(Follow {
            scope: scope(),
            storage_id: String::new(),
            epochs: epochs(n),
            end: 0,
            durable_end: 0,
            commit: 0,
        })
    };
    edge(
        Limit::Epochs,
        follow(MAX_EPOCHS),
        follow(MAX_EPOCHS + 1),
        |f| plus_one(f, HEADER_LEN + SCOPE_LEN + 2, 4),
    );
    // FollowFrom: scope, three u64s, then the count.
    let follow_from = |n| {
        PeerMessage::FollowFrom(FollowFrom {
            scope: scope(),
            truncate_to: 0,
            leader_end: 0,
            commit: 0,
            epochs: epochs(n),
            rebuild: false,
        })
    };
    edge(
        Limit::Epochs,
        follow_from(MAX_EPOCHS),
        follow_from(MAX_EPOCHS + 1),
        |f| plus_one(f, HEADER_LEN + SCOPE_LEN + 24, 4),
    );
    // FenceAnswer: scope, empty storage id, four u64s, then the count.
    let answer = |n| {
        PeerMessage::FenceAnswer(FenceAnswer {
            scope: scope(),
            storage_id: String::new(),
            last_generation: 0,
            end: 0,
            durable_end: 0,
            commit: 0,
            epochs: epochs(n),
        })
    };
    edge(
        Limit::Epochs,
        answer(MAX_EPOCHS),
        answer(MAX_EPOCHS + 1),
        |f| plus_one(f, HEADER_LEN + SCOPE_LEN + 2 + 32, 4),
    );
}

#[test]
fn replicated_bytes_limit() {
    // Replicate: scope, base offset, record count, commit, then the length.
    let replicate = |len| {
        PeerMessage::Replicate(Replicate {
            scope: scope(),
            base_offset: 0,
            record_count: 1,
            commit: 0,
            entries: zeros(len),
        })
    };
    edge(
        Limit::ReplicatedBytes,
        replicate(MAX_REPLICATED_BYTES),
        replicate(MAX_REPLICATED_BYTES + 1),
        |f| plus_one(f, HEADER_LEN + SCOPE_LEN + 8 + 4 + 8, 4),
    );
    // TailChunk: scope, base offset, record count, then the length.
    let chunk = |len| {
        PeerMessage::TailChunk(TailChunk {
            scope: scope(),
            base_offset: 0,
            record_count: 1,
            entries: zeros(len),
            end: 0,
            last: false,
        })
    };
    edge(
        Limit::ReplicatedBytes,
        chunk(MAX_REPLICATED_BYTES),
        chunk(MAX_REPLICATED_BYTES + 1),
        |f| plus_one(f, HEADER_LEN + SCOPE_LEN + 8 + 4, 4),
    );
}

#[test]
fn frame_body_limit_on_the_header_alone() {
    let header = |length| PeerHeader {
        kind: PeerKind::Raft,
        length,
    };
    // At the protocol limit the header is accepted and the decoder waits for the body.
    let mut d = PeerFrameDecoder::default();
    d.feed(&header(MAX_FRAME_BODY_BYTES).to_bytes());
    assert_eq!(d.next_frame(), Ok(None));
    // One more is refused on the ten header bytes, and the decoder stays refused.
    let mut d = PeerFrameDecoder::default();
    d.feed(&header(MAX_FRAME_BODY_BYTES + 1).to_bytes());
    let refused = PeerDecodeError::FrameTooLarge {
        length: MAX_FRAME_BODY_BYTES + 1,
        limit: MAX_FRAME_BODY_BYTES,
    };
    assert_eq!(d.next_frame(), Err(refused.clone()));
    assert_eq!(d.next_frame(), Err(refused.clone()));
    let whole = Bytes::from(header(MAX_FRAME_BODY_BYTES + 1).to_bytes().to_vec());
    assert_eq!(decode_frame(&whole, &any_shard), Err(refused));

    // A lower limit for the link works the same way, with real bodies.
    let mut small = Vec::new();
    encode_frame(&hello("n".into()), &mut small).unwrap();
    let body = (small.len() - HEADER_LEN) as u32;
    let mut d = PeerFrameDecoder::new(body);
    d.feed(&small);
    assert!(d.next_frame().unwrap().is_some());
    let mut d = PeerFrameDecoder::new(body - 1);
    d.feed(&small);
    assert_eq!(
        d.next_frame(),
        Err(PeerDecodeError::FrameTooLarge {
            length: body,
            limit: body - 1
        })
    );
    // A limit above the protocol's is lowered to it.
    assert_eq!(
        PeerFrameDecoder::new(u32::MAX).max_body(),
        MAX_FRAME_BODY_BYTES
    );
}

#[test]
fn an_encoder_refuses_a_body_over_the_frame_limit() {
    // Many entries each under their own limit add up past the frame body limit.
    let entry = RaftEntry {
        data: zeros(MAX_ENTRY_DATA_BYTES),
        ..RaftEntry::default()
    };
    let entries = (MAX_FRAME_BODY_BYTES as usize).div_ceil(MAX_ENTRY_DATA_BYTES);
    let msg = raft(|m| m.entries = vec![entry; entries]);
    let mut out = Vec::new();
    assert!(matches!(
        encode_frame(&msg, &mut out),
        Err(PeerEncodeError::OverLimit {
            limit: Limit::FrameBody,
            ..
        })
    ));
    assert!(out.is_empty());
}

#[test]
fn every_limit_is_tested_here() {
    // A new limit must get its edge test above; this list is the reminder.
    assert_eq!(Limit::ALL.len(), 10);
}
