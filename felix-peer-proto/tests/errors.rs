//! Each decode error, provoked by one changed byte of a valid frame.

use bytes::Bytes;
use felix_peer_proto::{
    decode_frame, encode_frame, Follow, Hello, HelloRefusal, HelloRefused, NoShards,
    PeerDecodeError, PeerFrameDecoder, PeerMessage, RaftEntry, RaftMessage, RaftMessageType,
    RefusalReason, ReplicationRefused, ShardId, ShardKind, ShardScope, TailChunk, HEADER_LEN,
};

fn frame(msg: &PeerMessage) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(msg, &mut out).unwrap();
    out
}

fn decode(bytes: Vec<u8>) -> Result<PeerMessage, PeerDecodeError> {
    decode_frame(&Bytes::from(bytes), &NoShards)
}

fn hello() -> PeerMessage {
    PeerMessage::Hello(Hello {
        cluster_id: "c".into(),
        node_id: "n".into(),
        protocol_version: 1,
        storage_id: [0; 16],
        incarnation: 0,
    })
}

#[test]
fn the_header_is_refused_before_the_body() {
    let mut f = frame(&hello());
    f[0] = b'G';
    assert_eq!(decode(f), Err(PeerDecodeError::BadMagic { found: *b"GXP" }));
    let mut f = frame(&hello());
    f[3] = 2;
    assert_eq!(decode(f), Err(PeerDecodeError::BadVersion { found: 2 }));
    let mut f = frame(&hello());
    f[5] = 0x7F;
    assert_eq!(
        decode(f.clone()),
        Err(PeerDecodeError::UnknownKind { code: 0x017F })
    );
    // The stream decoder refuses an unknown kind on the header alone and stays refused.
    let mut d = PeerFrameDecoder::default();
    d.feed(&f[..HEADER_LEN]);
    assert_eq!(
        d.next_frame(),
        Err(PeerDecodeError::UnknownKind { code: 0x017F })
    );
    d.feed(&frame(&hello()));
    assert!(d.next_frame().is_err());
}

#[test]
fn unknown_enum_numbers_are_refused() {
    // The raft message type: one past the proto's last (MsgRequestPreVoteResponse = 18).
    let mut f = frame(&PeerMessage::Raft(RaftMessage::default()));
    assert_eq!(
        RaftMessageType::from_number(18),
        Some(RaftMessageType::RequestPreVoteResponse)
    );
    f[HEADER_LEN] = 19;
    assert_eq!(
        decode(f),
        Err(PeerDecodeError::InvalidValue {
            field: "raft.msg_type",
            value: 19
        })
    );
    // The entry type, first byte of the first entry.
    let msg = PeerMessage::Raft(RaftMessage {
        entries: vec![RaftEntry::default()],
        ..RaftMessage::default()
    });
    let mut f = frame(&msg);
    let entry_at = HEADER_LEN + 1 + 64 + 1 + 24 + 4 + 4;
    f[entry_at] = 3;
    assert_eq!(
        decode(f),
        Err(PeerDecodeError::InvalidValue {
            field: "raft.entry.entry_type",
            value: 3
        })
    );
    // A refusal reason.
    let refused = PeerMessage::HelloRefused(HelloRefused {
        reason: HelloRefusal::UnknownNode,
        cluster_id: String::new(),
        node_id: String::new(),
        protocol_version: 1,
    });
    let mut f = frame(&refused);
    f[HEADER_LEN] = 0;
    assert_eq!(
        decode(f),
        Err(PeerDecodeError::InvalidValue {
            field: "hello_refused.reason",
            value: 0
        })
    );
}

#[test]
fn a_bool_is_zero_or_one() {
    let mut f = frame(&PeerMessage::Raft(RaftMessage::default()));
    // `reject` follows the type and eight u64s.
    f[HEADER_LEN + 1 + 64] = 2;
    assert_eq!(
        decode(f),
        Err(PeerDecodeError::InvalidValue {
            field: "raft.reject",
            value: 2
        })
    );
}

#[test]
fn strings_must_be_utf8() {
    let mut f = frame(&hello());
    // cluster_id "c" is the byte after its u16 length.
    f[HEADER_LEN + 2] = 0xFF;
    assert_eq!(
        decode(f),
        Err(PeerDecodeError::BadUtf8 {
            field: "hello.cluster_id"
        })
    );
}

#[test]
fn a_forged_count_fails_before_anything_is_sized_from_it() {
    let mut f = frame(&PeerMessage::Raft(RaftMessage::default()));
    // Claim 1000 entries (under the limit) with no bytes behind them.
    let count_at = HEADER_LEN + 1 + 64 + 1 + 24 + 4;
    f[count_at..count_at + 4].copy_from_slice(&1000u32.to_be_bytes());
    assert_eq!(
        decode(f),
        Err(PeerDecodeError::Truncated {
            field: "raft.entries",
            needed: 1000 * 26,
            available: 1
        })
    );
}

/// An empty scope (five empty strings' lengths and a kind byte, shard and generation).
fn empty_scope() -> ShardScope {
    ShardScope {
        shard: ShardId {
            cluster_id: String::new(),
            kind: ShardKind::Stream,
            tenant: String::new(),
            namespace: String::new(),
            name: String::new(),
            shard: 0,
        },
        generation: 0,
    }
}

const EMPTY_SCOPE_LEN: usize = 2 + 1 + 2 + 2 + 2 + 4 + 8;

fn any_shard(_: &ShardId) -> Option<u64> {
    Some(0)
}

#[test]
fn replication_values_have_one_encoding_each() {
    let refused = PeerMessage::ReplicationRefused(ReplicationRefused {
        scope: empty_scope(),
        reason: RefusalReason::NotOpen,
        current_generation: 0,
        detail: String::new(),
    });
    let f = frame(&refused);
    let reason_at = HEADER_LEN + EMPTY_SCOPE_LEN;
    assert_eq!(f[reason_at], 6);
    // Below the first reason and past the last.
    for bad in [0, 7] {
        let mut f = f.clone();
        f[reason_at] = bad;
        assert_eq!(
            decode_frame(&Bytes::from(f), &any_shard),
            Err(PeerDecodeError::InvalidValue {
                field: "replication_refused.reason",
                value: bad.into()
            })
        );
    }
    let chunk = PeerMessage::TailChunk(TailChunk {
        scope: empty_scope(),
        base_offset: 0,
        record_count: 0,
        entries: Bytes::new(),
        end: 0,
        last: true,
    });
    let mut f = frame(&chunk);
    *f.last_mut().unwrap() = 2;
    assert_eq!(
        decode_frame(&Bytes::from(f), &any_shard),
        Err(PeerDecodeError::InvalidValue {
            field: "tail_chunk.last",
            value: 2
        })
    );
}

#[test]
fn a_forged_epoch_count_fails_before_anything_is_sized_from_it() {
    let follow = PeerMessage::Follow(Follow {
        scope: empty_scope(),
        storage_id: String::new(),
        epochs: vec![],
        end: 0,
        durable_end: 0,
        commit: 0,
    });
    let mut f = frame(&follow);
    // Claim 4000 epochs (under the limit) with only end, durable end and commit behind them.
    let count_at = HEADER_LEN + EMPTY_SCOPE_LEN + 2;
    f[count_at..count_at + 4].copy_from_slice(&4000u32.to_be_bytes());
    assert_eq!(
        decode_frame(&Bytes::from(f), &any_shard),
        Err(PeerDecodeError::Truncated {
            field: "follow.epochs",
            needed: 4000 * 16,
            available: 24
        })
    );
}
