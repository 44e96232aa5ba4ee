//! The incremental frame decoder yields the same frames however the byte stream is chunked,
//! and never panics on arbitrary input.

use bytes::Bytes;
use felix_proto::frame::{FrameDecoder, DEFAULT_MAX_FRAME_BYTES};
use felix_proto::{DecodeError, Flags, Frame};
use proptest::prelude::*;

/// Flag words that are valid layouts, so the stream decodes to the end.
const VALID_FLAGS: [u16; 10] = [
    0x0000, 0x0001, 0x0009, 0x0041, 0x0049, 0x0010, 0x1010, 0x0210, 0x0024, 0x0824,
];

fn frames() -> impl Strategy<Value = Vec<Frame>> {
    prop::collection::vec(
        (
            prop::sample::select(&VALID_FLAGS[..]),
            prop::collection::vec(any::<u8>(), 0..300),
        ),
        0..12,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(f, p)| Frame::new(Flags(f), Bytes::from(p)))
            .collect()
    })
}

fn decode_chunked(wire: &[u8], sizes: &[usize], limit: u32) -> (Vec<Frame>, Option<DecodeError>) {
    let mut decoder = FrameDecoder::new(limit);
    let mut out = Vec::new();
    let mut rest = wire;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes
            .get(i % sizes.len().max(1))
            .copied()
            .unwrap_or(1)
            .clamp(1, rest.len());
        i += 1;
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        if i % 2 == 0 {
            decoder.feed_bytes(Bytes::copy_from_slice(chunk));
        } else {
            decoder.feed(chunk);
        }
        loop {
            match decoder.next_frame() {
                Ok(Some(f)) => out.push(f),
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
}

proptest! {
    #[test]
    fn same_frames_under_every_chunking(frames in frames(), sizes in prop::collection::vec(1usize..80, 1..20)) {
        let wire: Vec<u8> = frames.iter().flat_map(|f| f.to_bytes().to_vec()).collect();
        let (whole, err) = decode_chunked(&wire, &[wire.len().max(1)], DEFAULT_MAX_FRAME_BYTES);
        prop_assert!(err.is_none());
        prop_assert_eq!(&whole, &frames);
        let (chunked, err) = decode_chunked(&wire, &sizes, DEFAULT_MAX_FRAME_BYTES);
        prop_assert!(err.is_none());
        prop_assert_eq!(&chunked, &frames);
        let (bytewise, _) = decode_chunked(&wire, &[1], DEFAULT_MAX_FRAME_BYTES);
        prop_assert_eq!(&bytewise, &frames);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_chunking_does_not_matter(
        wire in prop::collection::vec(any::<u8>(), 0..600),
        sizes in prop::collection::vec(1usize..40, 1..10),
        limit in 0u32..400,
    ) {
        let whole = decode_chunked(&wire, &[wire.len().max(1)], limit);
        let chunked = decode_chunked(&wire, &sizes, limit);
        prop_assert_eq!(whole, chunked);
    }

    #[test]
    fn the_limit_is_enforced_on_the_header(len in 0u32..2000, limit in 0u32..1000) {
        let header = felix_proto::FrameHeader { flags: Flags::NONE, length: len }.to_bytes();
        let mut decoder = FrameDecoder::new(limit);
        decoder.feed(&header);
        let got = decoder.next_frame();
        if len > limit {
            prop_assert_eq!(got, Err(DecodeError::FrameTooLarge { length: len, limit }));
        } else if len == 0 {
            // A header of length 0 is a whole (empty) frame.
            prop_assert!(matches!(got, Ok(Some(f)) if f.payload.is_empty()));
        } else {
            // Within the limit, a header alone waits for its payload.
            prop_assert_eq!(got, Ok(None));
        }
    }
}
