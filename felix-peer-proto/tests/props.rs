//! Property tests: for every kind in the table, values drawn by `arbitrary` encode, decode
//! to themselves, and re-encode to the same bytes; no input makes a decoder panic.

use arbitrary::Unstructured;
use bytes::Bytes;
use felix_peer_proto::{
    decode_body, decode_frame, encode_frame, PeerDecodeError, PeerEncodeError, PeerFrameDecoder,
    PeerMessage, ShardId, KIND_TABLE,
};
use proptest::prelude::*;

/// Every shard known, at generation 0: nothing is stale.
fn all_current(_: &ShardId) -> Option<u64> {
    Some(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_kind_round_trips(seed in proptest::collection::vec(any::<u8>(), 0..1024)) {
        for spec in KIND_TABLE {
            let mut u = Unstructured::new(&seed);
            let Ok(msg) = PeerMessage::arbitrary_of_kind(spec.kind, &mut u) else { continue };
            prop_assert_eq!(msg.kind(), spec.kind);
            prop_assert_eq!(msg.scope().is_some(), spec.shard_scoped);
            let mut frame = Vec::new();
            match encode_frame(&msg, &mut frame) {
                Ok(()) => {}
                // Arbitrary strings can pass the string limit; the encoder refuses them whole.
                Err(PeerEncodeError::OverLimit { .. }) => {
                    prop_assert!(frame.is_empty());
                    continue;
                }
            }
            let frame = Bytes::from(frame);
            let decoded = decode_frame(&frame, &all_current);
            prop_assert_eq!(decoded.as_ref(), Ok(&msg));
            let mut again = Vec::new();
            encode_frame(decoded.as_ref().unwrap(), &mut again).unwrap();
            prop_assert_eq!(&again[..], &frame[..]);
        }
    }

    #[test]
    fn any_bytes_decode_or_fail_cleanly(
        code_low in any::<u8>(),
        family in 1u8..=4,
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let code = u16::from(family) << 8 | u16::from(code_low);
        let body = Bytes::from(body);
        let _ = decode_frame(&body, &all_current);
        if let Some(kind) = felix_peer_proto::PeerKind::from_code(code) {
            if let Ok(msg) = decode_body(kind, &body, &all_current) {
                let mut again = Vec::new();
                msg.encode_body(&mut again).unwrap();
                prop_assert_eq!(&again[..], &body[..]);
            }
        }
        // The stream decoder over the same bytes, in two pieces, ends the same as whole.
        let split = body.len() / 2;
        let mut a = PeerFrameDecoder::default();
        a.feed(&body);
        let mut b = PeerFrameDecoder::default();
        b.feed(&body[..split]);
        let first = drain(&mut b);
        b.feed(&body[split..]);
        let pieces = first.and_then(|mut v| {
            v.extend(drain(&mut b)?);
            Ok(v)
        });
        prop_assert_eq!(drain(&mut a), pieces);
    }
}

fn drain(d: &mut PeerFrameDecoder) -> Result<Vec<Bytes>, PeerDecodeError> {
    let mut out = Vec::new();
    for _ in 0..1024 {
        match d.next_frame()? {
            Some(f) => out.push(f.body),
            None => return Ok(out),
        }
    }
    Ok(out)
}
