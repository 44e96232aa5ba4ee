//! The glue between the client's state machines and felix-proto's codecs: every frame the
//! client builds and every frame it reads goes through here.

use bytes::Bytes;
use felix_proto::binary::{
    encode_publish_batch_frame, AckMode as BinaryAckMode, AckResult, AckedPrefix,
    EventBatch as BinaryEventBatch, PublishAck, PublishBatchHeader,
};
use felix_proto::message::{self, Message};
use felix_proto::negotiate::BrokerAdvertisement;
use felix_proto::{Flags, Frame};

use super::auth::{Capabilities, Offer};
use super::requests::{Ack, Answer, Target};
use super::subscribe::{
    EventBatch, EventFrame, Start, SubscribeRequest, Subscribed, SubscriptionEnd,
};
use crate::error::ClientError;

pub(crate) fn frame_bytes(message: &Message) -> Bytes {
    message.to_frame().to_bytes()
}

pub(crate) fn decode_json(frame: &Frame) -> Result<Message, ClientError> {
    if !frame.flags.is_empty() {
        return Err(ClientError::protocol(format!(
            "expected a JSON frame, got flags {:#06x}",
            frame.flags.0
        )));
    }
    Ok(Message::decode(&frame.payload)?)
}

fn refusal(e: message::ErrorMessage) -> ClientError {
    ClientError::server(e.code, e.retry, e.message)
}

fn unexpected(message: &Message, expected: &str) -> ClientError {
    ClientError::protocol(format!(
        "got {} where {expected} was expected",
        message.type_name()
    ))
}

pub(crate) fn auth_frame(tenant: &str, token: &str, offer: &Offer) -> Bytes {
    let (flags, features, features_hi) = match offer.flags {
        None => (None, None, None),
        Some(flags) => {
            let (lo, hi) = offer.features.to_words();
            (
                Some(u64::from(flags.0)),
                (lo != 0).then_some(u64::from(lo)),
                hi.map(u64::from),
            )
        }
    };
    frame_bytes(&Message::Auth(message::Auth {
        tenant_id: tenant.to_owned(),
        token: token.to_owned(),
        client_flags: flags,
        client_features: features,
        client_features_hi: features_hi,
    }))
}

/// `Some(advertisement)` for `auth_ok`, `None` for plain `ok`.
pub(crate) fn auth_reply(frame: &Frame) -> Result<Option<BrokerAdvertisement>, ClientError> {
    match decode_json(frame)? {
        Message::AuthOk(ok) => Ok(Some(ok.advertisement())),
        Message::Ok => Ok(None),
        Message::Error(e) => Err(refusal(e)),
        other => Err(unexpected(&other, "auth_ok, ok or error")),
    }
}

fn binary_ack_mode(ack: Ack) -> Option<BinaryAckMode> {
    match ack {
        Ack::None => None,
        Ack::PerMessage => Some(BinaryAckMode::PerMessage),
        Ack::PerBatch => Some(BinaryAckMode::PerBatch),
    }
}

fn check_name(field: &str, value: &str) -> Result<(), ClientError> {
    if value.len() > usize::from(u16::MAX) {
        return Err(ClientError::Usage(format!(
            "{field} is longer than 65535 bytes"
        )));
    }
    Ok(())
}

pub(crate) fn binary_publish(
    flags: Flags,
    tenant: &str,
    target: Target<'_>,
    payloads: &[Bytes],
    key: Option<&[u8]>,
    ack: Ack,
    request_id: Option<u64>,
) -> Result<Bytes, ClientError> {
    check_name("tenant", tenant)?;
    check_name("namespace", target.namespace)?;
    check_name("stream", target.name)?;
    if key.is_some_and(|k| k.len() > usize::from(u16::MAX)) {
        return Err(ClientError::Usage(
            "routing key is longer than 65535 bytes".into(),
        ));
    }
    if payloads.len() > u32::MAX as usize || payloads.iter().any(|p| p.len() > u32::MAX as usize) {
        return Err(ClientError::Usage("batch too large for one frame".into()));
    }
    let acked = match (binary_ack_mode(ack), request_id) {
        (Some(ack_mode), Some(request_id)) => Some(AckedPrefix {
            request_id,
            ack_mode,
        }),
        _ => None,
    };
    let header = PublishBatchHeader {
        acked,
        idempotent: None,
        key,
        tenant_id: tenant,
        namespace: target.namespace,
        stream: target.name,
    };
    debug_assert_eq!(
        header.flags(),
        flags,
        "negotiated layout and header disagree"
    );
    let payload_len: usize = payloads.iter().map(|p| 4 + p.len()).sum();
    if payload_len > u32::MAX as usize - 1024 {
        return Err(ClientError::Usage("batch too large for one frame".into()));
    }
    Ok(encode_publish_batch_frame(&header, payloads))
}

pub(crate) fn json_publish(
    tenant: &str,
    target: Target<'_>,
    payloads: &[Bytes],
    key: Option<&[u8]>,
    ack: Ack,
    request_id: Option<u64>,
) -> Result<Bytes, ClientError> {
    let ack = match ack {
        Ack::None => message::AckMode::None,
        Ack::PerMessage => message::AckMode::PerMessage,
        Ack::PerBatch => message::AckMode::PerBatch,
    };
    Ok(frame_bytes(&Message::PublishBatch(message::PublishBatch {
        tenant_id: tenant.to_owned(),
        namespace: target.namespace.to_owned(),
        stream: target.name.to_owned(),
        payloads: payloads.to_vec(),
        key: key.map(Bytes::copy_from_slice),
        shard: None,
        request_id,
        ack: Some(ack),
    })))
}

pub(crate) fn cache_put(
    tenant: &str,
    target: Target<'_>,
    key: &str,
    value: &[u8],
    ttl_ms: Option<u64>,
    request_id: u64,
) -> Result<Bytes, ClientError> {
    Ok(frame_bytes(&Message::CachePut(message::CachePut {
        tenant_id: tenant.to_owned(),
        namespace: target.namespace.to_owned(),
        cache: target.name.to_owned(),
        key: key.to_owned(),
        value: Bytes::copy_from_slice(value),
        request_id: Some(request_id),
        ttl_ms,
    })))
}

pub(crate) fn cache_get(
    tenant: &str,
    target: Target<'_>,
    key: &str,
    request_id: u64,
) -> Result<Bytes, ClientError> {
    Ok(frame_bytes(&Message::CacheGet(message::CacheGet {
        tenant_id: tenant.to_owned(),
        namespace: target.namespace.to_owned(),
        cache: target.name.to_owned(),
        key: key.to_owned(),
        request_id: Some(request_id),
    })))
}

pub(crate) fn cache_delete(
    tenant: &str,
    target: Target<'_>,
    key: &str,
    request_id: u64,
) -> Result<Bytes, ClientError> {
    Ok(frame_bytes(&Message::CacheDelete(message::CacheDelete {
        tenant_id: tenant.to_owned(),
        namespace: target.namespace.to_owned(),
        cache: target.name.to_owned(),
        key: key.to_owned(),
        request_id: Some(request_id),
    })))
}

/// What one frame on a request stream answers.
#[derive(Debug)]
pub(crate) enum Answered {
    /// A publish's answer (binary ack, `publish_ok` or `publish_error`).
    Publish {
        request_id: u64,
        result: Result<Answer, ClientError>,
    },
    /// Any other request's answer.
    Other {
        request_id: u64,
        result: Result<Answer, ClientError>,
    },
    /// A refusal of a request of any kind (`error`, `unsupported`); `None` when it names no
    /// request.
    Refusal {
        request_id: Option<u64>,
        error: ClientError,
    },
}

pub(crate) fn request_answer(caps: &Capabilities, frame: &Frame) -> Result<Answered, ClientError> {
    if frame.flags.contains(Flags::BINARY_PUBLISH_ACK) {
        // An ack may carry only bits we offered (a receiver refuses an unknown bit).
        let offered = caps.offer.flags.unwrap_or(Flags::ORIGINAL_V1);
        if !offered.contains(frame.flags) {
            return Err(ClientError::protocol(format!(
                "ack flags {:#06x} include bits we did not offer",
                frame.flags.0
            )));
        }
        let ack = PublishAck::decode(frame.flags, &frame.payload)?;
        let result = match ack.result {
            AckResult::Ok { offset } => Ok(Answer::Published { offset }),
            AckResult::Err { message, code, .. } => {
                let (code, retry) = match code {
                    Some((c, r)) => (Some(c), Some(r)),
                    None => (None, None),
                };
                Err(ClientError::server(code, retry, message))
            }
        };
        return Ok(Answered::Publish {
            request_id: ack.request_id,
            result,
        });
    }
    let message = decode_json(frame)?;
    Ok(match message {
        Message::PublishOk(ok) => Answered::Publish {
            request_id: ok.request_id,
            result: Ok(Answer::Published { offset: ok.offset }),
        },
        Message::PublishError(e) => Answered::Publish {
            request_id: e.request_id,
            result: Err(ClientError::server(e.code, e.retry, e.message)),
        },
        Message::CacheOk(ok) => Answered::Other {
            request_id: ok.request_id,
            result: Ok(Answer::CacheStored),
        },
        Message::CacheValue(v) => match v.request_id {
            Some(request_id) => Answered::Other {
                request_id,
                result: Ok(match (v.value, v.version) {
                    (Some(value), Some(version)) => Answer::VersionedValue { value, version },
                    (value, _) => Answer::CacheValue(value),
                }),
            },
            None => return Err(ClientError::protocol("cache_value without a request_id")),
        },
        Message::CounterValue(v) => Answered::Other {
            request_id: v.request_id,
            result: Ok(Answer::Counter(v.value)),
        },
        Message::CacheConditionResult(r) => Answered::Other {
            request_id: r.request_id,
            result: Ok(Answer::Condition {
                applied: r.applied,
                version: r.version,
            }),
        },
        Message::Error(e) => Answered::Refusal {
            request_id: None,
            error: refusal(e),
        },
        Message::Unsupported(u) => Answered::Refusal {
            request_id: u.request_id,
            error: ClientError::Unsupported {
                request_type: u.request_type,
            },
        },
        other => {
            return Err(unexpected(
                &other,
                "an answer to a publish or cache request",
            ))
        }
    })
}

pub(crate) fn subscribe(
    tenant: &str,
    request: &SubscribeRequest<'_>,
) -> Result<Bytes, ClientError> {
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

pub(crate) fn subscribe_reply(frame: &Frame) -> Result<Subscribed, ClientError> {
    match decode_json(frame)? {
        Message::Subscribed(s) => Ok(Subscribed {
            subscription_id: s.subscription_id,
            start_offset: s.start_offset,
            live_offset: s.live_offset,
        }),
        Message::Error(e) => Err(refusal(e)),
        Message::SubscribeCursorError(e) => Err(ClientError::server(
            Some(felix_proto::ErrorCode::InvalidRequest),
            None,
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

pub(crate) fn event_frame(frame: &Frame) -> Result<EventFrame, ClientError> {
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
