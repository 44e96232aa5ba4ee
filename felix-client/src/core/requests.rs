//! Request/answer correlation on one client bidi stream: publishes (binary or JSON) and
//! cache operations, each with a request id, answered on the same stream.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use felix_proto::binary::{
    encode_publish_batch_frame, AckMode as BinaryAckMode, AckOwner, AckResult, AckedPrefix,
    PublishAck, PublishBatchHeader,
};
use felix_proto::message::{self, Message};
use felix_proto::negotiate::PublishEncoding;
use felix_proto::{Flags, Frame};

use super::auth::Capabilities;
use super::codec::{decode_json, frame_bytes, refusal, unexpected};
use crate::error::ClientError;

/// Outstanding acked publishes a stream allows when the broker granted no window. Answers
/// then come back in completion order, matched by request id; the limit only bounds memory.
pub const DEFAULT_UNWINDOWED_LIMIT: usize = 256;

/// How a publish is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ack {
    /// Fire and forget: no request id, no answer.
    None,
    /// Acknowledged once the batch is accepted (`ack_mode` 1).
    PerMessage,
    /// Acknowledged once for the batch (`ack_mode` 2).
    PerBatch,
}

/// Where a publish or cache operation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    /// Namespace within the stream's tenant.
    pub namespace: &'a str,
    /// Stream or cache name.
    pub name: &'a str,
}

/// A request ready for the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// The id its answer will carry; `None` for a publish with [`Ack::None`].
    pub request_id: Option<u64>,
    /// The whole frame, header included.
    pub frame: Bytes,
}

/// What kind of request an id belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// An acked publish.
    Publish,
    /// `cache_put`.
    CachePut,
    /// `cache_get`.
    CacheGet,
    /// `cache_delete`.
    CacheDelete,
    /// `counter_add` or `counter_get`.
    Counter,
    /// `cache_put_if` or `cache_delete_if`.
    CacheConditional,
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The publish was accepted; `offset` of its first record when the broker gave one.
    Published { offset: Option<u64> },
    /// `cache_ok`.
    CacheStored,
    /// `cache_value`: the value read, or removed by a delete (`None` = absent).
    CacheValue(Option<Bytes>),
    /// `cache_value` of a hit carrying the value's version (brokers that serve
    /// `FEATURE_CACHE_CONDITIONAL`, to a client that offered it).
    VersionedValue { value: Bytes, version: u64 },
    /// `counter_value`: the sum (`None` = never written).
    Counter(Option<i64>),
    /// `cache_condition_result`: whether the write was made, and the version answering it.
    Condition { applied: bool, version: Option<u64> },
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The request's id.
    pub request_id: u64,
    /// What it was.
    pub kind: RequestKind,
    /// Its outcome.
    pub result: Result<Answer, ClientError>,
    /// The `0x0080` owner hint of a forwarded publish's ack: the broker that owns the
    /// batch's shard (the cluster client routes the next one there).
    pub owner: Option<AckOwner>,
}

/// Sans-IO state of one request stream.
///
/// Feed every frame the broker sends on the stream to [`RequestStream::handle_frame`]. An
/// `Err` from it means the stream is finished for us (a protocol violation, or a refusal
/// that names no request): fail everything [`RequestStream::drain_outstanding`] returns
/// with that error.
#[derive(Debug)]
pub struct RequestStream {
    caps: Capabilities,
    tenant: String,
    next_id: u64,
    /// Acked publishes in the order they went out.
    publishes: VecDeque<u64>,
    /// Other requests by id.
    others: HashMap<u64, RequestKind>,
    publish_limit: usize,
}

impl RequestStream {
    /// State for a stream authenticated as `tenant` with `caps`.
    pub fn new(caps: Capabilities, tenant: impl Into<String>) -> RequestStream {
        let publish_limit = caps
            .publish_window()
            .map(|w| w as usize)
            .unwrap_or(DEFAULT_UNWINDOWED_LIMIT)
            .max(1);
        RequestStream {
            caps,
            tenant: tenant.into(),
            // Per stream, from 1, like the reference client.
            next_id: 1,
            publishes: VecDeque::new(),
            others: HashMap::new(),
            publish_limit,
        }
    }

    /// The stream's capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// How many acked publishes may be outstanding at once on this stream.
    pub fn publish_limit(&self) -> usize {
        self.publish_limit
    }

    /// True when another acked publish fits in the window.
    pub fn can_publish_acked(&self) -> bool {
        self.publishes.len() < self.publish_limit
    }

    /// Number of requests awaiting an answer.
    pub fn outstanding(&self) -> usize {
        self.publishes.len() + self.others.len()
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Encodes a publish of `payloads` to `target`, binary when the broker advertised the
    /// layout and JSON `publish_batch` otherwise. An acked publish takes a window slot
    /// until its answer arrives; check [`RequestStream::can_publish_acked`] first.
    pub fn publish(
        &mut self,
        target: Target<'_>,
        payloads: &[Bytes],
        key: Option<&[u8]>,
        ack: Ack,
    ) -> Result<Encoded, ClientError> {
        if payloads.is_empty() {
            return Err(ClientError::Usage(
                "a publish needs at least one payload".into(),
            ));
        }
        let acked = ack != Ack::None;
        if acked && !self.can_publish_acked() {
            return Err(ClientError::Usage(format!(
                "publish window of {} is full",
                self.publish_limit
            )));
        }
        let request_id = acked.then(|| self.take_id());
        let frame = match self.caps.publish_encoding(acked, key.is_some()) {
            PublishEncoding::Binary(flags) => {
                binary_publish(flags, &self.tenant, target, payloads, key, ack, request_id)?
            }
            PublishEncoding::Json => {
                json_publish(&self.tenant, target, payloads, key, ack, request_id)?
            }
        };
        if let Some(id) = request_id {
            self.publishes.push_back(id);
        }
        Ok(Encoded { request_id, frame })
    }

    /// Encodes `cache_put` (`ttl_ms` null when `None`).
    pub fn cache_put(
        &mut self,
        target: Target<'_>,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
    ) -> Result<Encoded, ClientError> {
        let id = self.take_id();
        let frame = cache_put(&self.tenant, target, key, value, ttl_ms, id)?;
        self.others.insert(id, RequestKind::CachePut);
        Ok(Encoded {
            request_id: Some(id),
            frame,
        })
    }

    /// Encodes `cache_get`.
    pub fn cache_get(&mut self, target: Target<'_>, key: &str) -> Result<Encoded, ClientError> {
        let id = self.take_id();
        let frame = cache_get(&self.tenant, target, key, id)?;
        self.others.insert(id, RequestKind::CacheGet);
        Ok(Encoded {
            request_id: Some(id),
            frame,
        })
    }

    /// Encodes `cache_delete`; refused locally unless the broker advertised
    /// `FEATURE_CACHE_DELETE` (an unknown request can cost the stream).
    pub fn cache_delete(&mut self, target: Target<'_>, key: &str) -> Result<Encoded, ClientError> {
        if !self.caps.broker_has(felix_proto::Features::CACHE_DELETE) {
            return Err(ClientError::Usage(
                "the broker did not advertise FEATURE_CACHE_DELETE".into(),
            ));
        }
        let id = self.take_id();
        let frame = cache_delete(&self.tenant, target, key, id)?;
        self.others.insert(id, RequestKind::CacheDelete);
        Ok(Encoded {
            request_id: Some(id),
            frame,
        })
    }

    /// Encodes a request whose JSON message `build` makes from its request id: counters
    /// and conditional cache writes, each refused locally unless the broker advertised its
    /// feature (an unknown request can cost the stream).
    pub fn feature_request(
        &mut self,
        kind: RequestKind,
        feature: felix_proto::Features,
        build: impl FnOnce(&str, u64) -> felix_proto::message::Message,
    ) -> Result<Encoded, ClientError> {
        if !self.caps.broker_has(feature) {
            return Err(ClientError::Usage(format!(
                "the broker did not advertise {feature:?}"
            )));
        }
        let id = self.take_id();
        let frame = frame_bytes(&build(&self.tenant, id));
        self.others.insert(id, kind);
        Ok(Encoded {
            request_id: Some(id),
            frame,
        })
    }

    /// Reads one frame the broker sent on this stream.
    pub fn handle_frame(&mut self, frame: &Frame) -> Result<Completion, ClientError> {
        let answered = request_answer(&self.caps, frame)?;
        match answered {
            Answered::Publish {
                request_id,
                result,
                owner,
            } => {
                let position = self.publishes.iter().position(|id| *id == request_id);
                match position {
                    None => Err(ClientError::protocol(format!(
                        "publish answer for request {request_id}, which is not outstanding"
                    ))),
                    Some(i) if i != 0 && self.caps.ordered_publish_answers() => {
                        Err(ClientError::protocol(format!(
                            "publish answer for request {request_id} overtook request {} \
                             although pipelining was negotiated",
                            self.publishes[0]
                        )))
                    }
                    Some(i) => {
                        self.publishes.remove(i);
                        Ok(Completion {
                            request_id,
                            kind: RequestKind::Publish,
                            result,
                            owner,
                        })
                    }
                }
            }
            Answered::Other { request_id, result } => {
                let Some(kind) = self.others.remove(&request_id) else {
                    return Err(ClientError::protocol(format!(
                        "answer for request {request_id}, which is not outstanding"
                    )));
                };
                let result = result.and_then(|answer| match (kind, &answer) {
                    (RequestKind::CachePut, Answer::CacheStored)
                    | (RequestKind::CacheGet | RequestKind::CacheDelete, Answer::CacheValue(_))
                    | (RequestKind::CacheGet, Answer::VersionedValue { .. })
                    | (RequestKind::Counter, Answer::Counter(_))
                    | (RequestKind::CacheConditional, Answer::Condition { .. }) => Ok(answer),
                    _ => Err(ClientError::protocol(format!(
                        "{answer:?} does not answer a {kind:?} request"
                    ))),
                });
                Ok(Completion {
                    request_id,
                    kind,
                    result,
                    owner: None,
                })
            }
            Answered::Refusal {
                request_id: Some(id),
                error,
            } => {
                if let Some(i) = self.publishes.iter().position(|p| *p == id) {
                    self.publishes.remove(i);
                    return Ok(Completion {
                        request_id: id,
                        kind: RequestKind::Publish,
                        result: Err(error),
                        owner: None,
                    });
                }
                match self.others.remove(&id) {
                    Some(kind) => Ok(Completion {
                        request_id: id,
                        kind,
                        result: Err(error),
                        owner: None,
                    }),
                    None => Err(ClientError::protocol(format!(
                        "refusal for request {id}, which is not outstanding: {error}"
                    ))),
                }
            }
            // `error` names no request. The broker answers a stream's requests in order, so
            // it refuses the oldest one still outstanding; with none, it is unsolicited and
            // ends the stream for us.
            Answered::Refusal {
                request_id: None,
                error,
            } => {
                let oldest_publish = self.publishes.front().copied();
                let oldest_other = self.others.keys().min().copied();
                match (oldest_publish, oldest_other) {
                    (None, None) => Err(error),
                    (Some(p), o) if o.is_none_or(|o| p < o) => {
                        self.publishes.pop_front();
                        Ok(Completion {
                            request_id: p,
                            kind: RequestKind::Publish,
                            result: Err(error),
                            owner: None,
                        })
                    }
                    (_, Some(o)) => {
                        let kind = self.others.remove(&o).expect("present");
                        Ok(Completion {
                            request_id: o,
                            kind,
                            result: Err(error),
                            owner: None,
                        })
                    }
                    (Some(_), None) => unreachable!("covered above"),
                }
            }
        }
    }

    /// Removes and returns every outstanding request (publishes first, in request order),
    /// for failing them when the stream ends.
    pub fn drain_outstanding(&mut self) -> Vec<(u64, RequestKind)> {
        let mut out: Vec<(u64, RequestKind)> = self
            .publishes
            .drain(..)
            .map(|id| (id, RequestKind::Publish))
            .collect();
        let mut others: Vec<(u64, RequestKind)> = self.others.drain().collect();
        others.sort_unstable_by_key(|(id, _)| *id);
        out.extend(others);
        out
    }
}

/// The offset a publish's answer gave (`None`: no offset on the wire).
pub fn published_answer(answer: Answer) -> Result<Option<u64>, ClientError> {
    match answer {
        Answer::Published { offset } => Ok(offset),
        other => Err(ClientError::protocol(format!(
            "{other:?} answered a publish"
        ))),
    }
}

/// Checks `cache_put`'s answer.
pub fn cache_put_answer(answer: Answer) -> Result<(), ClientError> {
    match answer {
        Answer::CacheStored => Ok(()),
        other => Err(ClientError::protocol(format!(
            "{other:?} answered cache_put"
        ))),
    }
}

/// The value `cache_get` read (`None` when absent or expired), version or not.
pub fn cache_get_answer(answer: Answer) -> Result<Option<Bytes>, ClientError> {
    match answer {
        Answer::CacheValue(v) => Ok(v),
        Answer::VersionedValue { value, .. } => Ok(Some(value)),
        other => Err(ClientError::protocol(format!(
            "{other:?} answered cache_get"
        ))),
    }
}

/// The value `cache_delete` removed (`None` if there was none).
pub fn cache_delete_answer(answer: Answer) -> Result<Option<Bytes>, ClientError> {
    match answer {
        Answer::CacheValue(v) => Ok(v),
        other => Err(ClientError::protocol(format!(
            "{other:?} answered cache_delete"
        ))),
    }
}

// The wire forms of the requests above, and the reading of what answers them.

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

fn binary_publish(
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

fn json_publish(
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

fn cache_put(
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

fn cache_get(
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

fn cache_delete(
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
enum Answered {
    /// A publish's answer (binary ack, `publish_ok` or `publish_error`).
    Publish {
        request_id: u64,
        result: Result<Answer, ClientError>,
        owner: Option<AckOwner>,
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

fn request_answer(caps: &Capabilities, frame: &Frame) -> Result<Answered, ClientError> {
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
            owner: ack.owner,
        });
    }
    let message = decode_json(frame)?;
    Ok(match message {
        Message::PublishOk(ok) => Answered::Publish {
            request_id: ok.request_id,
            result: Ok(Answer::Published { offset: ok.offset }),
            owner: None,
        },
        Message::PublishError(e) => Answered::Publish {
            request_id: e.request_id,
            result: Err(ClientError::server(e.code, e.retry, e.message)),
            owner: None,
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
