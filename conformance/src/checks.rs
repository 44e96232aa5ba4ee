//! Invariants the fuzzers drive. Every function accepts any bytes and panics only when the
//! codec breaks a promise: a panic inside a decoder, a round trip that changes a value, or an
//! incremental decode that depends on how the bytes were chunked.

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use felix_proto::binary::{BinaryFrame, EventBatchView, PublishBatchView};
use felix_proto::frame::FrameDecoder;
use felix_proto::message::Message;
use felix_proto::{DecodeError, Flags, Frame};

/// Feeds `data` to a [`FrameDecoder`] whole and again in chunks whose sizes come from the
/// data itself; both must yield the same frames and end in the same state. Every frame that
/// decodes is re-encoded and must reproduce its bytes.
pub fn frame_decoder(data: &[u8]) {
    let (limit_byte, data) = match data.split_first() {
        Some((b, rest)) => (*b, rest),
        None => return,
    };
    // Small limits exercise the oversize path; 0xFF means the default 16 MiB.
    let limit = if limit_byte == 0xFF {
        felix_proto::frame::DEFAULT_MAX_FRAME_BYTES
    } else {
        u32::from(limit_byte) * 16
    };
    let whole = drain(limit, std::iter::once(data));
    let chunked = drain(limit, chunks(data));
    assert_eq!(whole, chunked, "chunking changed the decoded frames");
    let bytewise = drain(limit, data.chunks(1));
    assert_eq!(
        whole, bytewise,
        "one byte at a time changed the decoded frames"
    );

    for frame in &whole.0 {
        let bytes = frame.to_bytes();
        let mut again = FrameDecoder::new(limit);
        again.feed(&bytes);
        assert_eq!(again.next_frame().unwrap().as_ref(), Some(frame));
        // Whatever the payload, interpreting it must not panic.
        let _ = felix_proto::decode_frame(frame);
    }
}

type Drained = (Vec<Frame>, Option<DecodeError>);

fn drain<'a>(limit: u32, pieces: impl Iterator<Item = &'a [u8]>) -> Drained {
    let mut decoder = FrameDecoder::new(limit);
    let mut frames = Vec::new();
    for piece in pieces {
        decoder.feed(piece);
        loop {
            match decoder.next_frame() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => return (frames, Some(e)),
            }
        }
    }
    (frames, None)
}

/// Splits `data` into chunks sized by its own bytes (1..=64), deterministic for a given input.
fn chunks(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = data;
    let mut seed = data.len();
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        seed = seed.wrapping_mul(31).wrapping_add(usize::from(rest[0]));
        let n = (seed % 64 + 1).min(rest.len());
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Some(head)
    })
}

/// Decodes `data` as a JSON message; a message that decodes must survive encode → decode
/// unchanged, and encoding must be deterministic.
pub fn json_message(data: &[u8]) {
    if let Ok(message) = Message::decode(data) {
        message_round_trip(&message);
    }
}

/// Encode → decode is the identity, and encode is stable.
pub fn message_round_trip(message: &Message) {
    let encoded = message.encode();
    let decoded = Message::decode(&encoded)
        .unwrap_or_else(|e| panic!("{message:?} encoded to bytes that do not decode: {e}"));
    assert_eq!(&decoded, message, "round trip changed the message");
    assert_eq!(decoded.encode(), encoded, "encoding is not stable");
}

/// Builds a message from `data` with `arbitrary` and round-trips it.
pub fn structured_message(data: &[u8]) {
    let mut u = Unstructured::new(data);
    if let Ok(message) = Message::arbitrary(&mut u) {
        if known_shape(&message) {
            message_round_trip(&message);
        }
    }
}

/// An `Unknown` message whose type names a known message cannot round-trip as `Unknown`.
fn known_shape(message: &Message) -> bool {
    match message {
        Message::Unknown(u) => matches!(
            Message::decode(&message.encode()),
            Ok(Message::Unknown(ref d)) if d.request_type == u.request_type
        ),
        _ => true,
    }
}

/// Decodes `data` (two flag bytes, then the payload) as a binary layout. What decodes must
/// re-encode to the same bytes and agree with the allocation-free views.
pub fn binary_layout(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let flags = Flags(u16::from_be_bytes([data[0], data[1]]));
    let payload = Bytes::copy_from_slice(&data[2..]);
    let decoded = BinaryFrame::decode(flags, &payload);
    if let (Ok(_), Err(e)) = (&decoded, flags.validate_frame()) {
        panic!("decoded a frame with refused flags: {e}");
    }
    let Ok(frame) = decoded else {
        return;
    };
    // Canonical input re-encodes byte for byte. Input with bits the layout tolerates but does
    // not keep (an unknown retry byte reads as fatal; an offset bit on a failed ack is ignored)
    // need not, but the value it decodes to must be a fixed point of encode → decode.
    let encoded = frame.to_frame();
    let again = BinaryFrame::decode(encoded.flags, &encoded.payload)
        .unwrap_or_else(|e| panic!("{frame:?} re-encoded to bytes that do not decode: {e}"));
    assert_eq!(again, frame, "encode → decode changed the value");
    assert_eq!(again.to_frame(), encoded, "encoding is not stable");
    // An empty event batch cannot say whether its events carry times, so 0x4000 on one is
    // tolerated and dropped.
    let empty_timed = matches!(&frame, BinaryFrame::Events(b) if b.events.is_empty())
        && flags.contains(Flags::EVENT_BATCH_TIMESTAMPS);
    if !matches!(frame, BinaryFrame::Ack(_)) && !empty_timed {
        assert_eq!(
            frame.flags(),
            flags,
            "the value does not reproduce its flags"
        );
        assert_eq!(encoded.payload, payload, "re-encoding changed the bytes");
    }
    match &frame {
        BinaryFrame::Publish(batch) => {
            let view =
                PublishBatchView::parse(flags, &payload).expect("view refused a valid batch");
            assert_eq!(&view.to_batch(), batch);
        }
        BinaryFrame::Events(batch) => {
            let view = EventBatchView::parse(flags, &payload).expect("view refused a valid batch");
            assert_eq!(&view.to_batch(), batch);
        }
        BinaryFrame::Ack(_) => {}
    }
}

/// Builds a binary layout from `data` with `arbitrary` and round-trips it.
pub fn structured_binary(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(frame) = BinaryFrame::arbitrary(&mut u) else {
        return;
    };
    let encoded = frame.to_frame();
    let Ok(flags) = encoded.flags.validate_frame() else {
        // The value asked for a combination the wire refuses (e.g. skipped_before without
        // base_offset); the decoder must refuse it too.
        assert!(BinaryFrame::decode(encoded.flags, &encoded.payload).is_err());
        return;
    };
    let decoded = BinaryFrame::decode(flags, &encoded.payload)
        .unwrap_or_else(|e| panic!("{frame:?} encoded to bytes that do not decode: {e}"));
    assert_eq!(decoded, frame, "round trip changed the value");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_accept_valid_frames_in_any_chunking() {
        let ok = Message::Ok.to_frame().to_bytes();
        let mut data = vec![0xFF];
        data.extend_from_slice(&ok);
        data.extend_from_slice(&ok);
        frame_decoder(&data);
        json_message(br#"{"type":"cache_get","tenant_id":"t","namespace":"n","cache":"c","key":"k","request_id":4}"#);
        binary_layout(&[
            0x00, 0x24, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0, 1, b'x',
        ]);
    }

    #[test]
    fn chunks_cover_the_input_exactly() {
        let data: Vec<u8> = (0..=255).collect();
        let joined: Vec<u8> = chunks(&data).flatten().copied().collect();
        assert_eq!(joined, data);
        assert!(chunks(&data).count() > 1);
    }
}
