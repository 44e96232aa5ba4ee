//! Property tests over the binary layouts: values from `arbitrary` round-trip exactly, the
//! hot-path encoders and views agree with the owned types, and no input makes a decoder
//! panic.

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use felix_proto::binary::{
    encode_event_batch_frame, encode_publish_batch_frame, BinaryFrame, EventBatch, EventBatchView,
    PublishAck, PublishBatch, PublishBatchView,
};
use felix_proto::{Flags, Frame};
use proptest::prelude::*;

fn value<T: for<'a> Arbitrary<'a>>(seed: &[u8]) -> Option<T> {
    T::arbitrary(&mut Unstructured::new(seed)).ok()
}

/// Decodes a frame every way the crate offers and checks they agree; on success, checks the
/// value re-encodes to something that decodes to itself.
fn decode_everything(flags: Flags, payload: &Bytes) {
    let any = BinaryFrame::decode(flags, payload);
    let publish = PublishBatch::decode(flags, payload);
    let publish_view = PublishBatchView::parse(flags, payload);
    let ack = PublishAck::decode(flags, payload);
    let events = EventBatch::decode(flags, payload);
    let events_view = EventBatchView::parse(flags, payload);

    assert_eq!(
        publish_view.as_ref().map(|v| v.to_batch()),
        publish.as_ref().cloned()
    );
    assert_eq!(
        events_view.as_ref().map(|v| v.to_batch()),
        events.as_ref().cloned()
    );
    if let Ok(view) = &publish_view {
        assert_eq!(view.payloads().len(), view.len());
        assert_eq!(view.payloads().count(), view.len());
    }
    // At most one layout accepts a payload, and dispatch finds it.
    let accepted = [publish.is_ok(), ack.is_ok(), events.is_ok()];
    assert!(accepted.iter().filter(|ok| **ok).count() <= 1);
    match &any {
        Ok(BinaryFrame::Publish(b)) => assert_eq!(Ok(b), publish.as_ref()),
        Ok(BinaryFrame::Ack(a)) => assert_eq!(Ok(a), ack.as_ref()),
        Ok(BinaryFrame::Events(e)) => assert_eq!(Ok(e), events.as_ref()),
        Err(_) => assert_eq!(accepted, [false; 3]),
    }
    if let Ok(frame) = any {
        let again = frame.to_frame();
        assert_eq!(
            BinaryFrame::decode(again.flags, &again.payload).as_ref(),
            Ok(&frame)
        );
    }
}

fn flip(frame: &Frame, at: usize, xor: u8) -> Bytes {
    let mut bytes = frame.payload.to_vec();
    if !bytes.is_empty() {
        let at = at % bytes.len();
        bytes[at] ^= xor;
    }
    Bytes::from(bytes)
}

proptest! {
    #[test]
    fn publish_batches_round_trip(seed in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let Some(batch) = value::<PublishBatch>(&seed) else { return Ok(()) };
        let frame = batch.to_frame();
        prop_assert_eq!(frame.flags, batch.flags());
        prop_assert_eq!(frame.payload.len(), batch.encoded_len());
        let decoded = PublishBatch::decode(frame.flags, &frame.payload).unwrap();
        prop_assert_eq!(&decoded, &batch);
        prop_assert_eq!(decoded.to_frame(), frame.clone());

        let hot = encode_publish_batch_frame(&batch.header(), &batch.payloads);
        prop_assert_eq!(&hot, &frame.to_bytes());

        let view = PublishBatchView::parse(frame.flags, &frame.payload).unwrap();
        prop_assert_eq!(view.header, batch.header());
        prop_assert_eq!(view.len(), batch.payloads.len());
        prop_assert_eq!(view.payloads().collect::<Vec<_>>(), batch.payloads.clone());
    }

    #[test]
    fn acks_round_trip(seed in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let Some(ack) = value::<PublishAck>(&seed) else { return Ok(()) };
        let frame = ack.to_frame();
        prop_assert_eq!(frame.flags, ack.flags());
        prop_assert_eq!(frame.payload.len(), ack.encoded_len());
        let decoded = PublishAck::decode(frame.flags, &frame.payload).unwrap();
        prop_assert_eq!(&decoded, &ack);
        prop_assert_eq!(decoded.to_frame(), frame);
    }

    #[test]
    fn event_batches_round_trip(seed in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let Some(batch) = value::<EventBatch>(&seed) else { return Ok(()) };
        let frame = batch.to_frame();
        prop_assert_eq!(frame.flags, batch.flags());
        prop_assert_eq!(frame.payload.len(), batch.encoded_len());
        let decoded = EventBatch::decode(frame.flags, &frame.payload).unwrap();
        prop_assert_eq!(&decoded, &batch);
        prop_assert_eq!(decoded.to_frame(), frame.clone());

        let header = batch.header();
        let hot = encode_event_batch_frame(
            &header,
            batch.events.iter().map(|e| (e.timestamp_micros.unwrap_or(0), &e.payload[..])),
        );
        prop_assert_eq!(&hot, &frame.to_bytes());

        let view = EventBatchView::parse(frame.flags, &frame.payload).unwrap();
        prop_assert_eq!(view.header, header);
        prop_assert_eq!(view.events().collect::<Vec<_>>(), batch.events.clone());
    }

    #[test]
    fn any_frame_round_trips_through_dispatch(seed in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let Some(frame) = value::<BinaryFrame>(&seed) else { return Ok(()) };
        let wire = frame.to_frame();
        prop_assert_eq!(BinaryFrame::decode(wire.flags, &wire.payload), Ok(frame));
    }

    #[test]
    fn arbitrary_bytes_under_arbitrary_flags_never_panic(
        flags in any::<u16>(),
        payload in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        decode_everything(Flags(flags), &Bytes::from(payload));
    }

    /// Random bytes rarely get past the first length; damaged valid frames do.
    #[test]
    fn damaged_frames_never_panic(
        seed in proptest::collection::vec(any::<u8>(), 0..1024),
        at in any::<usize>(),
        xor in 1u8..,
        cut in any::<usize>(),
        flag_xor in any::<u16>(),
    ) {
        let Some(frame) = value::<BinaryFrame>(&seed) else { return Ok(()) };
        let wire = frame.to_frame();
        decode_everything(wire.flags, &flip(&wire, at, xor));
        decode_everything(wire.flags, &wire.payload.slice(..cut % (wire.payload.len() + 1)));
        decode_everything(Flags(wire.flags.bits() ^ flag_xor), &wire.payload);
    }
}
