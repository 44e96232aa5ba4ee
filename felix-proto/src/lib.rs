//! # felix-proto
//!
//! The Felix wire protocol v1 as plain data: bytes ↔ frames ↔ messages, flag and feature
//! negotiation. Sans-IO: no async, no sockets, no files, no clock. Everything here is a pure
//! function or a value you feed bytes to.
//!
//! Layers, bottom up:
//! - [`frame`]: the 12-byte header and [`FrameDecoder`], which turns a byte stream (in chunks
//!   of any size) into [`Frame`]s, enforcing a payload limit on the header alone.
//! - [`flags`] and [`features`]: the two capability spaces, each declared once in a table.
//! - [`message`]: every JSON control message, both directions.
//! - [`binary`]: the binary publish, ack and event-batch layouts, decoded without copying
//!   payloads (they are `Bytes` slices of the frame).
//! - [`negotiate`]: what a broker advertises for a client's offer, and what each side may send.
//! - [`routing`]: the key → shard function every client and broker must agree on.
//!
//! [`decode_frame`] ties them together: a frame in, a [`Decoded`] value out.

pub mod binary;
pub mod error;
pub mod features;
pub mod flags;
pub mod frame;
pub mod message;
pub mod negotiate;
pub mod routing;

pub use error::{DecodeError, ErrorCode, RetryClass};
pub use features::Features;
pub use flags::Flags;
pub use frame::{Frame, FrameDecoder, FrameHeader};

use binary::BinaryFrame;
use message::Message;

/// A frame's payload, interpreted by its flags.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// `flags == 0`: a JSON control message.
    Json(Message),
    /// A binary layout.
    Binary(BinaryFrame),
}

/// Interprets a frame: JSON when no flag is set, else the binary layout its flags select.
pub fn decode_frame(frame: &Frame) -> Result<Decoded, DecodeError> {
    if frame.flags.is_empty() {
        Message::decode(&frame.payload).map(Decoded::Json)
    } else {
        BinaryFrame::decode(frame.flags, &frame.payload).map(Decoded::Binary)
    }
}
