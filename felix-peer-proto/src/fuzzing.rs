//! The invariants the fuzz targets drive (`fuzz/fuzz_targets/peer_*.rs`), here so the corpus
//! replay test (`tests/fuzz_corpus.rs`) runs exactly the same code. Each accepts any bytes
//! and panics only when the codec breaks a promise: a panic inside a decoder, a value that
//! does not survive re-encoding, or a decode that depends on how the bytes were chunked.

use bytes::Bytes;

use crate::frame::PeerFrameDecoder;
use crate::scope::ShardId;
use crate::{decode_body, decode_frame, encode_frame, Family, PeerKind};

/// The generation the fuzz view holds for every shard: below it is stale.
const CURRENT_GENERATION: u64 = 2;

fn view(_: &ShardId) -> Option<u64> {
    Some(CURRENT_GENERATION)
}

/// The first byte picks a kind of `family` (by its low byte, so unknown codes are tried too),
/// the rest is its body. Whatever decodes re-encodes to the very same bytes (the encoding is
/// canonical), and the frame built from them decodes to the same value whole and one byte at
/// a time.
pub fn family(family: Family, data: &[u8]) {
    let Some((&low, body)) = data.split_first() else {
        return;
    };
    let code = u16::from(family as u8) << 8 | u16::from(low);
    let body = Bytes::copy_from_slice(body);
    // Any bytes as a whole frame, too: must not panic.
    let _ = decode_frame(&body, &view);
    let Some(kind) = PeerKind::from_code(code) else {
        return;
    };
    let Ok(msg) = decode_body(kind, &body, &view) else {
        return;
    };
    if let Some(scope) = msg.scope() {
        assert!(
            scope.generation >= CURRENT_GENERATION,
            "a stale scope decoded"
        );
    }
    assert_eq!(kind.shard_scoped(), msg.scope().is_some());
    let mut again = Vec::new();
    msg.encode_body(&mut again)
        .expect("a decoded message re-encodes");
    assert_eq!(again, &body[..], "re-encoding changed the bytes");

    let mut frame = Vec::new();
    encode_frame(&msg, &mut frame).expect("a decoded message frames");
    let frame = Bytes::from(frame);
    assert_eq!(decode_frame(&frame, &view).as_ref(), Ok(&msg));
    let mut decoder = PeerFrameDecoder::default();
    let mut got = Vec::new();
    for b in frame.chunks(1) {
        decoder.feed(b);
        while let Some(f) = decoder.next_frame().expect("our own frame") {
            got.push(f.decode(&view).expect("our own body"));
        }
    }
    assert_eq!(got, vec![msg]);
}
