//! A shard-scoped message is checked against the receiver's generations while it decodes:
//! older is refused, unknown is refused, equal or newer passes; other kinds ignore the view.

use std::collections::HashMap;

use bytes::Bytes;
use felix_peer_proto::{
    decode_frame, encode_frame, Forward, ForwardAnswer, GenerationView, Hello, NoShards,
    PeerDecodeError, PeerFrameDecoder, PeerMessage, RaftMessage, ShardId, ShardKind, ShardScope,
    KIND_TABLE,
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
    for msg in [hello, raft, answer] {
        assert!(!msg.kind().shard_scoped());
        assert_eq!(decode_frame(&frame(&msg), &NoShards), Ok(msg));
    }
    let scoped: Vec<&str> = KIND_TABLE
        .iter()
        .filter(|s| s.shard_scoped)
        .map(|s| s.name)
        .collect();
    assert_eq!(scoped, ["forward"]);
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
