//! Subscriptions: the `subscribe` request on its own bidi stream, and the broker-opened uni
//! event stream (`event_stream_hello`, then event batches, then maybe a final frame).

use bytes::Bytes;
use felix_proto::binary::EventBatch as BinaryEventBatch;
use felix_proto::message::{self, Message};
use felix_proto::{Flags, Frame};

use super::auth::Capabilities;
use super::codec::{decode_json, frame_bytes, refusal, unexpected};
use crate::error::ClientError;

/// Where a subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Start {
    /// Only what is published from now on (sent as no `start` field, like the reference).
    #[default]
    Latest,
    /// The oldest retained record.
    Earliest,
    /// Exactly this offset.
    Offset(u64),
}

/// What to subscribe to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscribeRequest<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Stream.
    pub stream: &'a str,
    /// Start position.
    pub start: Start,
    /// Shard; `None` (shard 0) sends no field.
    pub shard: Option<u32>,
}

/// The broker's confirmation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subscribed {
    /// The id the event stream's hello will carry.
    pub subscription_id: u64,
    /// First offset delivered (durable streams only).
    pub start_offset: Option<u64>,
    /// The tail at registration (durable streams only).
    pub live_offset: Option<u64>,
}

/// Builds the `subscribe` frame.
pub fn subscribe_frame(tenant: &str, request: &SubscribeRequest<'_>) -> Result<Bytes, ClientError> {
    let start = match request.start {
        Start::Latest => None,
        Start::Earliest => Some(message::Start::Earliest),
        Start::Offset(n) => Some(message::Start::Offset(n)),
    };
    Ok(frame_bytes(&Message::Subscribe(message::Subscribe {
        tenant_id: tenant.to_owned(),
        namespace: request.namespace.to_owned(),
        stream: request.stream.to_owned(),
        subscription_id: None,
        start,
        shard: request.shard.map(u64::from),
        queue_capacity: None,
    })))
}

/// Reads the answer on the subscribe stream: `subscribed`, or a refusal.
pub fn read_subscribe_reply(frame: &Frame) -> Result<Subscribed, ClientError> {
    match decode_json(frame)? {
        Message::Subscribed(s) => Ok(Subscribed {
            subscription_id: s.subscription_id,
            start_offset: s.start_offset,
            live_offset: s.live_offset,
        }),
        Message::Error(e) => Err(refusal(e)),
        Message::NotLeader(n) => Err(ClientError::NotLeader {
            node_id: n.node_id,
            addr: n.addr,
            generation: n.generation,
        }),
        Message::SubscribeCursorError(e) => Err(ClientError::server(
            Some(felix_proto::ErrorCode::InvalidRequest),
            // Past retention is final; ahead of the tail is not: a broker promoted a moment
            // ago may not hold the records a failed-over subscription resumes from yet.
            Some(match e.reason {
                message::CursorErrorReason::TooOld => felix_proto::RetryClass::Fatal,
                message::CursorErrorReason::InFuture => felix_proto::RetryClass::Retry,
            }),
            format!(
                "cursor {}: requested {}, available {}",
                match e.reason {
                    message::CursorErrorReason::TooOld => "too_old",
                    message::CursorErrorReason::InFuture => "in_future",
                },
                e.requested,
                e.available
            ),
        )),
        Message::Unsupported(u) => Err(ClientError::Unsupported {
            request_type: u.request_type,
        }),
        other => Err(unexpected(&other, "subscribed")),
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The payload as published.
    pub payload: Bytes,
    /// Its offset in the stream's log, when the stream has offsets on the wire.
    pub offset: Option<u64>,
}

/// A batch of events as one frame carried them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventBatch {
    /// Offset of the first payload, if the frame carried one.
    pub base_offset: Option<u64>,
    /// The payloads in stream order.
    pub payloads: Vec<Bytes>,
}

impl EventBatch {
    /// The batch as individual events (payload `i` sits at `base_offset + i`).
    pub fn into_events(self) -> impl Iterator<Item = Event> {
        let base = self.base_offset;
        self.payloads
            .into_iter()
            .enumerate()
            .map(move |(i, payload)| Event {
                payload,
                offset: base.map(|b| b + i as u64),
            })
    }
}

/// How a subscription ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriptionEnd {
    /// The broker's queue for us dropped records; resume from `resume_from`.
    Lagged { resume_from: u64 },
    /// The shard moved to another broker.
    ShardMoved {
        resume_from: Option<u64>,
        node_id: Option<String>,
        addr: Option<String>,
    },
    /// The stream was deleted.
    StreamDeleted,
    /// The broker finished the event stream with no final frame.
    Closed,
}

/// What one event-stream frame meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventFrame {
    /// The stream's first frame: which subscription it serves.
    Hello { subscription_id: u64 },
    /// Events.
    Batch(EventBatch),
    /// The last frame: the subscription is over.
    End(SubscriptionEnd),
}

/// Sans-IO reader of one event stream.
#[derive(Debug, Clone)]
pub struct EventStreamReader {
    /// Frame flags the broker may use towards us.
    allowed: Flags,
    subscription_id: Option<u64>,
    ended: bool,
}

impl EventStreamReader {
    /// A reader for a connection with `caps`.
    pub fn new(caps: &Capabilities) -> EventStreamReader {
        EventStreamReader {
            allowed: caps.flags(),
            subscription_id: None,
            ended: false,
        }
    }

    /// The subscription this stream serves, once the hello arrived.
    pub fn subscription_id(&self) -> Option<u64> {
        self.subscription_id
    }

    /// Reads one frame. A broker `error` frame comes back as `Err(ClientError::Server)`.
    pub fn handle_frame(&mut self, frame: &Frame) -> Result<EventFrame, ClientError> {
        if self.ended {
            return Err(ClientError::protocol(
                "frame after the subscription's final frame",
            ));
        }
        if !self.allowed.contains(frame.flags) {
            return Err(ClientError::protocol(format!(
                "event frame flags {:#06x} include bits not negotiated ({:#06x})",
                frame.flags.0, self.allowed.0
            )));
        }
        let decoded = event_frame(frame)?;
        match (&decoded, self.subscription_id) {
            (EventFrame::Hello { subscription_id }, None) => {
                self.subscription_id = Some(*subscription_id);
            }
            (EventFrame::Hello { .. }, Some(_)) => {
                return Err(ClientError::protocol(
                    "second event_stream_hello on one stream",
                ))
            }
            (_, None) => {
                return Err(ClientError::protocol(
                    "event stream did not start with event_stream_hello",
                ))
            }
            (EventFrame::End(_), Some(_)) => self.ended = true,
            (EventFrame::Batch(_), Some(_)) => {}
        }
        Ok(decoded)
    }

    /// The broker finished the stream.
    pub fn handle_finish(&mut self) -> Result<SubscriptionEnd, ClientError> {
        if self.subscription_id.is_none() {
            return Err(ClientError::protocol(
                "event stream ended before event_stream_hello",
            ));
        }
        self.ended = true;
        Ok(SubscriptionEnd::Closed)
    }
}

fn event_frame(frame: &Frame) -> Result<EventFrame, ClientError> {
    if frame.flags.intersects(Flags(
        Flags::BINARY_EVENT_BATCH.0 | Flags::BINARY_EVENT_BATCH_SHARED.0,
    )) {
        let batch = BinaryEventBatch::decode(frame.flags, &frame.payload)?;
        return Ok(EventFrame::Batch(EventBatch {
            base_offset: batch.base_offset,
            payloads: batch.events.into_iter().map(|e| e.payload).collect(),
        }));
    }
    Ok(match decode_json(frame)? {
        Message::EventStreamHello(h) => EventFrame::Hello {
            subscription_id: h.subscription_id,
        },
        Message::EventBatch(b) => EventFrame::Batch(EventBatch {
            base_offset: b.base_offset,
            payloads: b.payloads,
        }),
        Message::Event(e) => EventFrame::Batch(EventBatch {
            base_offset: e.offset,
            payloads: vec![e.payload],
        }),
        Message::SubscriptionLagged(l) => EventFrame::End(SubscriptionEnd::Lagged {
            resume_from: l.resume_from,
        }),
        Message::ShardMoved(m) => EventFrame::End(SubscriptionEnd::ShardMoved {
            resume_from: m.resume_from,
            node_id: m.node_id,
            addr: m.addr,
        }),
        Message::StreamDeleted(_) => EventFrame::End(SubscriptionEnd::StreamDeleted),
        Message::Error(e) => return Err(refusal(e)),
        other => return Err(unexpected(&other, "an event-stream frame")),
    })
}
