//! What every request family shares when it builds or reads a frame: JSON framing and the
//! refusals any answer may be. A leaf: it knows felix-proto and the error type, nothing of
//! the families that use it.

use bytes::Bytes;
use felix_proto::message::{self, Message};
use felix_proto::Frame;

use crate::error::ClientError;

/// The message as a whole JSON frame, header included, in one buffer.
pub(crate) fn frame_bytes(message: &Message) -> Bytes {
    let mut out = Vec::new();
    message.encode_frame_into(&mut out);
    Bytes::from(out)
}

/// A JSON frame's message; a frame with flags set is refused (they mark binary layouts).
pub(crate) fn decode_json(frame: &Frame) -> Result<Message, ClientError> {
    if !frame.flags.is_empty() {
        return Err(ClientError::protocol(format!(
            "expected a JSON frame, got flags {:#06x}",
            frame.flags.0
        )));
    }
    Ok(Message::decode(&frame.payload)?)
}

/// The broker's `error` as the client's error.
pub(crate) fn refusal(e: message::ErrorMessage) -> ClientError {
    ClientError::server(e.code, e.retry, e.message)
}

/// A message that answers nothing the caller could have asked.
pub(crate) fn unexpected(message: &Message, expected: &str) -> ClientError {
    ClientError::protocol(format!(
        "got {} where {expected} was expected",
        message.type_name()
    ))
}
