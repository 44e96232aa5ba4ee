//! The binary data-plane layouts: publish batches (client → broker), publish acks (broker →
//! client) and event batches (broker → subscriber).
//!
//! Every layout comes in three forms:
//! - an owned value ([`PublishBatch`], [`PublishAck`], [`EventBatch`]) with `flags()`,
//!   `decode`, `encode_into` and `to_frame`; decoded record payloads are `Bytes` slices of
//!   the frame, never copies;
//! - for the two batch layouts, a borrowing view ([`PublishBatchView`], [`EventBatchView`])
//!   that validates the whole payload without allocating and then iterates records lazily;
//! - for the two batch layouts, a one-allocation frame encoder that skips the owned value
//!   ([`encode_publish_batch_frame`], [`encode_event_batch_frame`]).
//!
//! Decoders check the flag word first: an unknown bit or a modifier without its base is
//! [`DecodeError::Flags`], another layout's base is [`DecodeError::UnexpectedLayout`]. A
//! payload must be consumed exactly ([`DecodeError::TrailingBytes`]), and a record count is
//! checked against the bytes left before anything is sized from it.
//!
//! All integers are big-endian.

mod ack;
mod event;
mod publish;
mod reader;

pub use ack::{AckDetail, AckOwner, AckResult, PublishAck};
pub use event::{
    encode_event_batch_frame, Event, EventBatch, EventBatchHeader, EventBatchView, Events,
};
pub use publish::{
    encode_publish_batch_frame, AckMode, AckedPrefix, Payloads, ProducerSeq, PublishBatch,
    PublishBatchHeader, PublishBatchView,
};

use bytes::Bytes;

use crate::error::DecodeError;
use crate::flags::Flags;
use crate::frame::Frame;

/// Any binary payload, chosen by the frame's base bit.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum BinaryFrame {
    /// `0x0001`.
    Publish(PublishBatch),
    /// `0x0010`.
    Ack(PublishAck),
    /// `0x0002` or `0x0004`.
    Events(EventBatch),
}

impl BinaryFrame {
    /// Decodes a binary payload; a JSON frame (no base bit) is
    /// [`DecodeError::UnexpectedLayout`].
    pub fn decode(flags: Flags, payload: &Bytes) -> Result<BinaryFrame, DecodeError> {
        let flags = flags.validate_frame()?;
        if flags.contains(Flags::BINARY_PUBLISH_BATCH) {
            PublishBatch::decode(flags, payload).map(BinaryFrame::Publish)
        } else if flags.contains(Flags::BINARY_PUBLISH_ACK) {
            PublishAck::decode(flags, payload).map(BinaryFrame::Ack)
        } else if flags.intersects(Flags::BINARY_EVENT_BATCH | Flags::BINARY_EVENT_BATCH_SHARED) {
            EventBatch::decode(flags, payload).map(BinaryFrame::Events)
        } else {
            Err(DecodeError::UnexpectedLayout {
                flags: flags.bits(),
                expected: "a binary layout",
            })
        }
    }

    /// The exact flag word this payload is sent with.
    pub fn flags(&self) -> Flags {
        match self {
            BinaryFrame::Publish(b) => b.flags(),
            BinaryFrame::Ack(a) => a.flags(),
            BinaryFrame::Events(e) => e.flags(),
        }
    }

    /// The payload as a frame.
    pub fn to_frame(&self) -> Frame {
        match self {
            BinaryFrame::Publish(b) => b.to_frame(),
            BinaryFrame::Ack(a) => a.to_frame(),
            BinaryFrame::Events(e) => e.to_frame(),
        }
    }
}

/// Validates `flags` and checks that they select one of `bases`.
fn expect_layout(flags: Flags, bases: Flags, expected: &'static str) -> Result<Flags, DecodeError> {
    let flags = flags.validate_frame()?;
    if flags.intersects(bases) {
        Ok(flags)
    } else {
        Err(DecodeError::UnexpectedLayout {
            flags: flags.bits(),
            expected,
        })
    }
}

/// `arbitrary` helpers that only build values the wire can carry (length prefixes bound
/// strings and keys), so encode → decode is the identity on every generated value.
#[cfg(feature = "arbitrary")]
mod arb {
    use arbitrary::{Arbitrary, Result, Unstructured};
    use bytes::Bytes;

    fn clip(mut s: String, max: usize) -> String {
        if s.len() > max {
            let mut end = max;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
        }
        s
    }

    pub(super) fn bytes(u: &mut Unstructured<'_>) -> Result<Bytes> {
        Ok(Bytes::from(Vec::<u8>::arbitrary(u)?))
    }

    pub(super) fn short_string(u: &mut Unstructured<'_>) -> Result<String> {
        Ok(clip(String::arbitrary(u)?, u16::MAX.into()))
    }

    pub(super) fn non_empty_short_string_opt(u: &mut Unstructured<'_>) -> Result<Option<String>> {
        Ok(Option::<String>::arbitrary(u)?
            .map(|s| clip(s, u16::MAX.into()))
            .filter(|s| !s.is_empty()))
    }

    pub(super) fn short_bytes_opt(u: &mut Unstructured<'_>) -> Result<Option<Bytes>> {
        let mut v: Option<Vec<u8>> = u.arbitrary()?;
        if let Some(v) = &mut v {
            v.truncate(u16::MAX.into());
        }
        Ok(v.map(Bytes::from))
    }

    pub(super) fn publisher_opt(u: &mut Unstructured<'_>) -> Result<Option<Bytes>> {
        let mut v: Option<Vec<u8>> = u.arbitrary()?;
        if let Some(v) = &mut v {
            v.truncate(u8::MAX.into());
        }
        Ok(v.map(Bytes::from))
    }

    pub(super) fn payloads(u: &mut Unstructured<'_>) -> Result<Vec<Bytes>> {
        u.arbitrary_iter::<Vec<u8>>()?
            .map(|p| p.map(Bytes::from))
            .collect()
    }
}
