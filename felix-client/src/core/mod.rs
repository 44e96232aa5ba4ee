//! The client protocol as Sans-IO state, one file per request family; every frame the
//! client builds and every frame it reads is encoded or decoded here.
//!
//! - [`auth_frame`] / [`read_auth_reply`]: the `auth` exchange and the [`Capabilities`] it
//!   negotiates (advertised ∩ offered; a plain `ok` means `ORIGINAL_V1` flags, no features).
//! - [`RequestStream`]: encodes publishes (binary `0x0001`/`0x0009`/`0x0041`/`0x0049`, or the
//!   JSON fallback when the broker did not advertise the layout), cache operations, counters
//!   and conditional writes, and matches every answer to its request id (in request order
//!   when pipelining was negotiated, which it also checks).
//! - [`subscribe_frame`] / [`read_subscribe_reply`] and [`EventStreamReader`]: the subscribe
//!   exchange and the event stream that follows it.
//! - [`GroupRef`] / [`read_group_answer`]: consumer-group calls and their answers.
//! - [`watch_frame`] / [`read_watch_answer`]: cache watches, their answer and
//!   [`read_watch_event`] for their changes.
//! - `stream_ops`: idempotent batches ([`idempotent_frame`] / [`read_guarded_reply`]),
//!   `publish_if`, commits, reads and routing questions, one request and one answer each.
//!
//! Inputs are whole [`felix_proto::Frame`]s (use [`felix_proto::FrameDecoder`] on the bytes);
//! outputs are encoded frames as `Bytes`. Nothing here blocks, reads a clock or owns I/O.
//! `codec` is the leaf every family shares (JSON framing, refusals).

mod auth;
// Every family is public: the core is the client protocol for any driver (our front end, the
// simulator, an embedder's own loop), so nothing in it is dead when the front end is off. The
// most used items are re-exported below.
pub mod cache_features;
pub mod cluster;
mod codec;
pub mod groups;
pub mod requests;
pub mod stream_ops;
mod subscribe;
pub mod watch;

pub use auth::{auth_frame, capabilities, read_auth_reply, Capabilities, Offer};
pub use groups::{
    read_group_answer, GroupAnswer, GroupCall, GroupInfo, GroupRecord, GroupRef, GroupRequest,
    PollOptions,
};
pub use requests::{
    Ack, Answer, Completion, Encoded, RequestKind, RequestStream, Target, DEFAULT_UNWINDOWED_LIMIT,
};
pub use stream_ops::{
    idempotent_frame, read_guarded_reply, Guarded, GuardedReply, IdempotentBatch,
    IdempotentEncoding,
};
pub use subscribe::{
    read_subscribe_reply, subscribe_frame, Event, EventBatch, EventFrame, EventStreamReader, Start,
    SubscribeRequest, Subscribed, SubscriptionEnd,
};
pub use watch::{
    read_watch_answer, read_watch_event, watch_frame, CacheChange, CacheWatchItem, WatchFilter,
    WatchReply, WatchStart, WatchStarted,
};

#[cfg(test)]
mod tests;
