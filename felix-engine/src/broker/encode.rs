//! Encoding of the frames the broker hands out: shared event batches and the JSON
//! `subscription_lagged` that ends a subscription.
//!
//! Event batches use felix-proto's shared layout (flags 0x0004 plus modifiers), each built in
//! one exact-size allocation so a sealed batch costs one buffer however many subscribers
//! share it.

use bytes::{BufMut, Bytes, BytesMut};
use felix_proto::binary::{encode_event_batch_frame, EventBatchHeader};
use felix_proto::frame::{encode_frame_header, HEADER_LEN};
use felix_proto::message::Message;
use felix_proto::Flags;

/// Longest publisher name a batch can carry (`u8` length prefix); a longer one is not sent.
pub(crate) const MAX_PUBLISHER_LEN: usize = 255;

/// The parts of a sealed batch a frame can be built from.
pub(crate) struct BatchView<'a> {
    /// Offset of the first record; written only under [`Flags::EVENT_BATCH_OFFSETS`].
    pub(crate) base_offset: u64,
    /// Principal that published the batch; written only under [`Flags::EVENT_BATCH_PUBLISHER`].
    pub(crate) publisher: Option<&'a str>,
    /// Per-record append times; written only under [`Flags::EVENT_BATCH_TIMESTAMPS`].
    pub(crate) times: &'a [u64],
    pub(crate) payloads: &'a [Bytes],
}

/// Encodes one shared event batch frame (header included) with exactly the modifiers in
/// `flags` (a subset of 0x0020 | 0x2000 | 0x4000 on top of 0x0004), in one exact-size
/// allocation. The caller only asks for a modifier the batch can fill: a publisher for
/// 0x2000, one time per payload for 0x4000.
pub(crate) fn encode_event_batch(flags: Flags, batch: &BatchView<'_>) -> Bytes {
    let timestamps = flags.contains(Flags::EVENT_BATCH_TIMESTAMPS);
    debug_assert!(!timestamps || batch.times.len() == batch.payloads.len());
    let publisher = flags.contains(Flags::EVENT_BATCH_PUBLISHER).then(|| {
        let p = batch
            .publisher
            .expect("publisher variant asked for a batch without one");
        debug_assert!(p.len() <= MAX_PUBLISHER_LEN);
        p.as_bytes()
    });
    let header = EventBatchHeader {
        subscription_id: None,
        base_offset: flags
            .contains(Flags::EVENT_BATCH_OFFSETS)
            .then_some(batch.base_offset),
        skipped_before: None,
        publisher,
        timestamps,
    };
    let events = batch.payloads.iter().enumerate().map(|(i, payload)| {
        let time = if timestamps { batch.times[i] } else { 0 };
        (time, &payload[..])
    });
    encode_event_batch_frame(&header, events)
}

/// The JSON frame that ends a lagging subscription's event stream.
pub(crate) fn encode_subscription_lagged(subscription_id: u64, resume_from: u64) -> Bytes {
    let json = format!(
        "{{\"type\":\"subscription_lagged\",\"subscription_id\":{subscription_id},\"resume_from\":{resume_from}}}"
    );
    let mut out = BytesMut::with_capacity(HEADER_LEN + json.len());
    encode_frame_header(Flags::NONE, json.len(), &mut out);
    out.put_slice(json.as_bytes());
    out.freeze()
}

/// What an encoded answer's buffer starts with.
const ANSWER_CAPACITY: usize = 512;

/// A JSON message as a whole frame, header included.
pub(crate) fn encode_message(msg: &Message) -> Bytes {
    // Most answers fit (a 256-byte cache value is about 450): growing from empty took six
    // reallocations.
    let mut out = Vec::with_capacity(ANSWER_CAPACITY);
    msg.encode_frame_into(&mut out);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn plain_shared_batch_matches_the_layout() {
        let payloads = [Bytes::from_static(b"probe-event-1")];
        let view = BatchView {
            base_offset: 5,
            publisher: None,
            times: &[],
            payloads: &payloads,
        };
        let frame = encode_event_batch(Flags::NONE, &view);
        assert_eq!(
            hex(&frame),
            concat!(
                "464c583100010004",
                "00000015",
                "00000001",
                "0000000d",
                "70726f62652d6576656e742d31"
            )
        );
        assert_eq!(frame.len(), HEADER_LEN + 4 + 4 + 13);
    }

    #[test]
    fn offsets_variant_matches_the_captured_frame() {
        // The 0x0024 frame captured from the reference (peer-client-wire.md).
        let payloads = [Bytes::from_static(b"probe-event-1")];
        let view = BatchView {
            base_offset: 5,
            publisher: None,
            times: &[],
            payloads: &payloads,
        };
        let frame = encode_event_batch(Flags::EVENT_BATCH_OFFSETS, &view);
        assert_eq!(
            hex(&frame),
            "464c5831000100240000001d0000000000000005000000010000000d70726f62652d6576656e742d31"
        );
    }

    #[test]
    fn publisher_and_timestamps_are_placed_per_the_layout() {
        let payloads = [Bytes::from_static(b"x"), Bytes::from_static(b"yz")];
        let times = [7u64, 7];
        let view = BatchView {
            base_offset: 9,
            publisher: Some("p1"),
            times: &times,
            payloads: &payloads,
        };
        let flags = Flags::EVENT_BATCH_OFFSETS
            .union(Flags::EVENT_BATCH_PUBLISHER)
            .union(Flags::EVENT_BATCH_TIMESTAMPS);
        let frame = encode_event_batch(flags, &view);
        let mut expect = String::from("464c58310001");
        expect += "6024";
        expect += &format!("{:08x}", 8 + 3 + 4 + (12 + 1) + (12 + 2));
        expect += "0000000000000009"; // base_offset
        expect += "027031"; // publisher "p1"
        expect += "00000002";
        expect += concat!("0000000000000007", "00000001", "78"); // time, len, "x"
        expect += concat!("0000000000000007", "00000002", "797a"); // time, len, "yz"
        assert_eq!(hex(&frame), expect);
    }

    #[test]
    fn lagged_frame_is_json_with_a_plain_header() {
        let frame = encode_subscription_lagged(1001, 42);
        let body = &frame[HEADER_LEN..];
        assert_eq!(&frame[..8], &hex_bytes("464c583100010000")[..]);
        assert_eq!(
            std::str::from_utf8(body).unwrap(),
            r#"{"type":"subscription_lagged","subscription_id":1001,"resume_from":42}"#
        );
        assert_eq!(
            u32::from_be_bytes(frame[8..12].try_into().unwrap()) as usize,
            body.len()
        );
    }

    fn hex_bytes(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
