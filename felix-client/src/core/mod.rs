//! The client protocol as Sans-IO state, one value per stream.
//!
//! - [`auth_frame`] / [`read_auth_reply`]: the `auth` exchange and the [`Capabilities`] it
//!   negotiates (advertised ∩ offered; a plain `ok` means `ORIGINAL_V1` flags, no features).
//! - [`RequestStream`]: encodes publishes (binary `0x0001`/`0x0009`/`0x0041`/`0x0049`, or the
//!   JSON fallback when the broker did not advertise the layout) and cache operations, and
//!   matches every answer to its request id (in request order when pipelining was
//!   negotiated, which it also checks).
//! - [`subscribe_frame`] / [`read_subscribe_reply`] and [`EventStreamReader`]: the subscribe
//!   exchange and the event stream that follows it.
//!
//! Inputs are whole [`felix_proto::Frame`]s (use [`felix_proto::FrameDecoder`] on the bytes);
//! outputs are encoded frames as `Bytes`. Nothing here blocks, reads a clock or owns I/O.

mod auth;
pub(crate) mod codec;
mod requests;
mod subscribe;

pub use auth::{auth_frame, capabilities, read_auth_reply, Capabilities, Offer};
pub use requests::{
    Ack, Answer, Completion, Encoded, RequestKind, RequestStream, Target, DEFAULT_UNWINDOWED_LIMIT,
};
pub use subscribe::{
    read_subscribe_reply, subscribe_frame, Event, EventBatch, EventFrame, EventStreamReader, Start,
    SubscribeRequest, Subscribed, SubscriptionEnd,
};

#[cfg(test)]
mod tests;
