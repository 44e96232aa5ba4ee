//! One client bidirectional stream as a Felix session: the `auth` that opens it, the
//! capabilities it negotiated, and every request after it, each answered in the encoding it
//! arrived in and in the order the stream carried it.
//!
//! The session only decides what to answer. It writes answers to its outbox as whole encoded
//! frames; the connection moves them onto the QUIC stream as flow control allows and stops
//! reading the stream while the outbox holds a publish window's worth.
//!
//! On durable shards two things can make a request wait, and both keep the stream's order:
//! an answer that is only true once the log has written (an ack after the write, a cache
//! write) is *held*, and every answer after it queues behind it until the log reports the
//! offset durable; a request for a shard whose log is still opening *stalls* the stream,
//! and is run again, from scratch, once the log is open.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use felix_proto::binary::{AckResult, PublishAck, PublishBatchView};
use felix_proto::frame::encode_frame_header;
use felix_proto::message::{
    self, CacheOk, CacheShardsView, CacheValue, ErrorMessage, EventStreamHello, Message,
    PublishError, PublishOk, ShardKind, ShardOwner, ShardOwnersView, StreamShardsView,
    Subscribed as SubscribedMsg, Unsupported,
};
use felix_proto::negotiate::{broker_answer, Negotiated};
use felix_proto::routing::RoutingMapping;
use felix_proto::{DecodeError, ErrorCode, Features, Flags, Frame, FrameDecoder};
use tracing::{debug, trace};

use quinn_proto::{ConnectionHandle, StreamId};

use crate::broker::encode_message;
use crate::broker::CacheAnswer;
use crate::broker::{
    BrokerError, CacheKey, LogGone, Start, StreamKey, SubscribeError, SubscribeOpts, SubscriberId,
};
use crate::conn::ConnShared;
use crate::node::Core;
use felix_auth::{cache_object, name_charset_ok, stream_object, Action, Identity, NAME_MAX_BYTES};
use felix_storage::log::ReadTicket;
use felix_storage::ops::LogId;

mod cache_features;
mod cluster;
pub(crate) use cluster::routing_target;
mod groups;
mod stream_ops;

/// The message of a held publish answer ended because its stream was deleted first.
const DELETED: &str = "the stream was deleted before the write became durable";

/// A subscription granted on this stream, whose event stream the connection opens.
pub(crate) struct NewSubscription {
    pub(crate) subscriber: SubscriberId,
    /// The `event_stream_hello` frame that starts the event stream.
    pub(crate) hello: Bytes,
}

/// What a session handler may touch besides its own stream.
pub(crate) struct SessionCx<'a> {
    pub(crate) now: Instant,
    pub(crate) core: &'a mut Core,
    pub(crate) conn: &'a mut ConnShared,
    /// Where this session lives, for answers and requests that wait on a log.
    pub(crate) ch: ConnectionHandle,
    pub(crate) stream: StreamId,
}

/// Whether the stream goes on after a frame.
/// The two cache requests answered with `cache_value`.
#[derive(Clone, Copy)]
enum CacheRead {
    Get,
    Delete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameResult {
    Continue,
    /// Stop reading; finish the stream once the answers are written.
    CloseStream,
    /// The frame needs a log that is still opening: it is kept, nothing was changed, and
    /// nothing more is read until the engine re-runs it.
    Stall,
}

/// An answer that waits for durability, or one queued behind such an answer.
enum Held {
    Ready(Bytes),
    /// `ok` goes out once `log` is durable below `end`; if the log fails first, the
    /// failure `fail` describes does.
    Durable {
        log: LogId,
        end: u64,
        /// The log's leadership here it was written under (0: not gated).
        leadership: u64,
        ok: Bytes,
        fail: FailAnswer,
    },
    Value(Box<HeldValue>),
    /// A `group_records` waiting for its poll's answer.
    Group(Box<groups::HeldGroup>),
    /// A request forwarded to its shard's leader, waiting for the answer it relays.
    Forward(Box<cluster::HeldForward>),
}

/// A held `cache_value`: the value comes from a log read, and a delete's answer also
/// waits for the delete to be durable.
struct HeldValue {
    log: LogId,
    ticket: Option<ReadTicket>,
    /// `None` until the read answers.
    value: Option<Result<Option<Bytes>, String>>,
    durable_at: Option<u64>,
    answer: CacheValue,
    /// The value is a whole answer frame the broker encoded (a `stream_read` page or an
    /// `offset_value`), sent as it is.
    raw: bool,
}

/// How to answer a held request whose write failed.
#[derive(Debug, Clone, Copy)]
enum FailAnswer {
    /// A binary ack error for this request id.
    BinaryAck(u64),
    /// `publish_error` for this request id.
    JsonPublish(u64),
    /// A plain `error`.
    Error,
}

/// An authenticated stream's identity and negotiated capabilities.
struct Authed {
    identity: Identity,
    negotiated: Negotiated,
    /// The stream this session last published to and whether the identity may: a publish
    /// stream carries one stream, so the check and the key are built once.
    publish_target: Option<(StreamKey, bool)>,
    /// The `auth` frame as the client sent it: a forward channel opens with it, so the
    /// leader checks the same token and negotiates the same answers.
    auth_frame: Bytes,
    /// This session's forwards: its channel number, the last sequence used, and the nodes
    /// the channel is open on.
    forwarding: Option<Box<cluster::Forwarding>>,
}

pub(crate) struct Session {
    pub(crate) decoder: FrameDecoder,
    /// Encoded answers not yet taken by the QUIC stream.
    pub(crate) outbox: VecDeque<Bytes>,
    /// The client's side is done (FIN or reset read, or we stopped it).
    pub(crate) recv_done: bool,
    /// Our side is done (finished and acknowledged, stopped by the client, or failed).
    pub(crate) send_done: bool,
    /// Finish our side once the outbox is written.
    pub(crate) finish_when_flushed: bool,
    /// `finish()` was called.
    pub(crate) finished: bool,
    /// Not read because the outbox is at the window.
    pub(crate) paused: bool,
    /// Answers behind one waiting for durability, in request order.
    held: VecDeque<Held>,
    /// A request that met a log still opening, to run again once it is open.
    stalled: Option<Frame>,
    /// Set by a handler that met an opening log; `on_frame` turns it into a stall.
    stall_on: Option<LogId>,
    /// The request just run waits for its stream's placement (a first use in a cluster).
    stall_placement: bool,
    /// When a request waiting for placement gives up and is refused.
    placement_deadline: Option<Instant>,
    auth: Option<Box<Authed>>,
    /// The request being handled, encoded, when it may be forwarded (in a cluster).
    forward_frame: Option<Bytes>,
    /// Error codes sent, collected into the engine's metrics by the connection.
    pub(crate) raised: crate::metrics::ErrorTally,
}

impl Session {
    pub(crate) fn new(preauth_max_frame_bytes: u32) -> Session {
        Session {
            decoder: FrameDecoder::new(preauth_max_frame_bytes),
            outbox: VecDeque::new(),
            recv_done: false,
            send_done: false,
            finish_when_flushed: false,
            finished: false,
            paused: false,
            held: VecDeque::new(),
            stalled: None,
            stall_on: None,
            stall_placement: false,
            placement_deadline: None,
            auth: None,
            forward_frame: None,
            raised: Default::default(),
        }
    }

    /// Answers not yet handed to QUIC, held ones included (what the window counts).
    pub(crate) fn backlog(&self) -> usize {
        self.outbox.len() + self.held.len()
    }

    /// Bytes of answers not yet handed to QUIC, held ones included; a held cache value not
    /// read from its log yet counts as `value_reserve` (what the largest would take).
    pub(crate) fn unwritten_bytes(&self, value_reserve: usize) -> usize {
        let queued: usize = self.outbox.iter().map(Bytes::len).sum();
        let held: usize = self
            .held
            .iter()
            .map(|h| match h {
                Held::Ready(b) => b.len(),
                Held::Durable { ok, .. } => ok.len(),
                Held::Value(v) => match &v.value {
                    // base64 grows a value by a third; the rest of the answer is small.
                    Some(Ok(Some(value))) => value.len() / 3 * 4 + 4 + 256 + v.answer.key.len(),
                    Some(_) => 256 + v.answer.key.len(),
                    // A page not read yet may be as large as a page can be.
                    None if v.raw => crate::broker::PAGE_FRAME_RESERVE,
                    None => value_reserve,
                },
                Held::Group(g) => match &g.result {
                    Some(Ok(records)) => records.iter().map(|r| r.payload.len() / 3 * 4 + 96).sum(),
                    _ => 256,
                },
                Held::Forward(f) => f.answer.as_ref().map_or(256, Bytes::len),
            })
            .sum();
        queued + held
    }

    /// Every answer is written (none held).
    pub(crate) fn all_answered(&self) -> bool {
        self.outbox.is_empty() && self.held.is_empty()
    }

    /// The stream can take no answers any more.
    pub(crate) fn drop_answers(&mut self) {
        self.outbox.clear();
        self.held.clear();
    }

    /// The value a held cache read waited for has arrived.
    pub(crate) fn fill_value(
        &mut self,
        log: LogId,
        ticket: ReadTicket,
        value: Result<Option<Bytes>, String>,
    ) {
        for held in &mut self.held {
            if let Held::Value(v) = held {
                if v.log == log && v.ticket == Some(ticket) && v.value.is_none() {
                    v.value = Some(value);
                    return;
                }
            }
        }
    }

    /// Waiting for a log to open before reading on.
    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.is_some()
    }

    /// The request that stalled, to run again.
    pub(crate) fn take_stalled(&mut self) -> Option<Frame> {
        self.stalled.take()
    }

    /// Moves held answers whose records are now durable (or whose log failed) to the
    /// outbox, in order, stopping at the first that still waits. True if any moved.
    pub(crate) fn release_held(&mut self, core: &Core) -> bool {
        let mut moved = false;
        while let Some(front) = self.held.front() {
            let frame = match front {
                Held::Ready(_) => match self.held.pop_front() {
                    Some(Held::Ready(b)) => b,
                    _ => unreachable!("front is ready"),
                },
                Held::Durable {
                    log,
                    end,
                    leadership,
                    fail,
                    ..
                } => {
                    let (log, end, leadership, fail) = (*log, *end, *leadership, *fail);
                    // Written under a leadership here that has ended: answered by what that
                    // one committed, never by the log's durability now (the record may have
                    // been cut and its offset reused by a later leadership).
                    if leadership != 0 && leadership != core.broker.leadership(log) {
                        let committed = core.broker.retired_committed(log, leadership) >= end;
                        let Some(Held::Durable { ok, .. }) = self.held.pop_front() else {
                            unreachable!("front is durable")
                        };
                        if committed {
                            ok
                        } else {
                            self.raised.note(&ErrorCode::QuorumTimeout);
                            let message = "the shard's leader changed before the publish \
                                           reached a majority of its replicas; it may still be \
                                           committed";
                            self.fail_frame(fail, ErrorCode::QuorumTimeout, message)
                        }
                    } else if core.broker.durable_offset(log) >= end {
                        match self.held.pop_front() {
                            Some(Held::Durable { ok, .. }) => ok,
                            _ => unreachable!("front is durable"),
                        }
                    } else if let Some(frame) = self.gone_frame(core, log, fail) {
                        self.held.pop_front();
                        frame
                    } else if core.broker.timed_out_mark(log) >= end {
                        self.held.pop_front();
                        self.raised.note(&ErrorCode::QuorumTimeout);
                        let message = "the publish did not reach a majority of the shard's \
                                       replicas in time; it may still be committed";
                        self.fail_frame(fail, ErrorCode::QuorumTimeout, message)
                    } else {
                        break;
                    }
                }
                Held::Forward(f) => {
                    if f.answer.is_none() {
                        break;
                    }
                    let Some(Held::Forward(f)) = self.held.pop_front() else {
                        unreachable!("front is a forward");
                    };
                    f.answer.expect("checked")
                }
                Held::Group(g) => {
                    if g.result.is_none() {
                        break;
                    }
                    let Some(Held::Group(g)) = self.held.pop_front() else {
                        unreachable!("front is a group answer");
                    };
                    self.group_records_frame(*g)
                }
                Held::Value(v) => {
                    let durable = v
                        .durable_at
                        .is_none_or(|end| core.broker.durable_offset(v.log) >= end);
                    match (&v.value, durable) {
                        (Some(_), true) => {
                            let Some(Held::Value(v)) = self.held.pop_front() else {
                                unreachable!("front is a value");
                            };
                            let HeldValue {
                                value, answer, raw, ..
                            } = *v;
                            match value.expect("checked") {
                                Ok(frame) if raw => frame.unwrap_or_default(),
                                Ok(value) => encode_message(&Message::CacheValue(CacheValue {
                                    // A version only on a hit.
                                    version: value.as_ref().and(answer.version),
                                    value,
                                    ..answer
                                })),
                                Err(why) => self.error_frame(ErrorCode::Storage, why),
                            }
                        }
                        _ => match core.broker.log_gone(v.log) {
                            Some(LogGone::Failed(why)) => {
                                let message = format!("the cache's log failed: {why}");
                                self.held.pop_front();
                                self.error_frame(ErrorCode::Storage, message)
                            }
                            Some(LogGone::Deleted) => {
                                self.held.pop_front();
                                let message = "the stream was deleted".to_owned();
                                self.error_frame(ErrorCode::NotFound, message)
                            }
                            None => break,
                        },
                    }
                }
            };
            self.outbox.push_back(frame);
            moved = true;
        }
        moved
    }

    /// True once the stream has authenticated.
    pub(crate) fn is_authenticated(&self) -> bool {
        self.auth.is_some()
    }

    /// The frame stream is out of sync (bad magic, version, flags, or an oversize frame):
    /// answer with an error if possible; the connection then closes the stream.
    pub(crate) fn on_decode_error(&mut self, err: DecodeError) {
        debug!(%err, "closing a stream whose frames cannot be read");
        // Before auth only an oversize frame can be refused here; either way the code is
        // sent only to a stream that negotiated error codes.
        let code = match err {
            _ if self.auth.is_none() => ErrorCode::Unauthenticated,
            // The frame may be fine; it is over a configured limit.
            DecodeError::FrameTooLarge { .. } => ErrorCode::LimitExceeded,
            _ => err.code(),
        };
        self.push_error(code, err.to_string());
    }

    /// Handles one whole frame.
    pub(crate) fn on_frame(&mut self, frame: Frame, cx: &mut SessionCx<'_>) -> FrameResult {
        if self.auth.is_none() {
            return self.on_first_frame(frame, cx);
        }
        let result = self.on_request(&frame, cx);
        if let Some(log) = self.stall_on.take() {
            self.stalled = Some(frame);
            cx.core.wait_opened(log, cx.ch, cx.stream);
            return FrameResult::Stall;
        }
        if std::mem::take(&mut self.stall_placement) {
            let deadline = self.placement_deadline.expect("set with the stall");
            self.stalled = Some(frame);
            cx.core.wait_placement(deadline, cx.ch, cx.stream);
            return FrameResult::Stall;
        }
        result
    }

    fn on_request(&mut self, frame: &Frame, cx: &mut SessionCx<'_>) -> FrameResult {
        if cx.core.router.is_some() {
            // Kept for a forward: the leader runs the request exactly as the client sent it.
            self.forward_frame = Some(frame.to_bytes());
        }
        if frame.flags.contains(Flags::BINARY_PUBLISH_BATCH) {
            cx.core.metrics.request("binary_publish");
            self.on_binary_publish(frame, cx);
            return FrameResult::Continue;
        }
        if !frame.flags.is_empty() {
            // A layout only a broker sends (ack or event batch).
            self.push_error(
                ErrorCode::InvalidRequest,
                format!("frame flags {:#06x} are not a request", frame.flags.bits()),
            );
            return FrameResult::Continue;
        }
        match Message::decode(&frame.payload) {
            Ok(msg) => self.on_message(msg, cx),
            Err(err) => {
                // Frame boundaries are intact, so the stream goes on.
                self.push_error(ErrorCode::InvalidRequest, err.to_string());
                FrameResult::Continue
            }
        }
    }

    fn on_first_frame(&mut self, frame: Frame, cx: &mut SessionCx<'_>) -> FrameResult {
        let auth = match frame
            .flags
            .is_empty()
            .then(|| Message::decode(&frame.payload))
        {
            Some(Ok(Message::Auth(auth))) => auth,
            Some(Err(err)) => {
                self.push_error(ErrorCode::Unauthenticated, format!("expected auth: {err}"));
                return FrameResult::CloseStream;
            }
            _ => {
                self.push_error(
                    ErrorCode::Unauthenticated,
                    "the first frame on a stream must be auth".to_owned(),
                );
                return FrameResult::CloseStream;
            }
        };
        let offer = auth.offer();
        let coded = offer.features().contains(Features::ERROR_CODES);
        if cx.core.broker.is_draining() {
            return self.refuse_auth_draining(coded);
        }
        let unix_secs = cx.core.unix_secs(cx.now);
        match cx
            .core
            .verifier
            .verify(&auth.token, &auth.tenant_id, unix_secs)
        {
            Ok(identity) => {
                let (answer, negotiated) = broker_answer(&cx.core.capabilities, &offer);
                self.push_message(&Message::from(answer));
                self.decoder.set_max_payload(cx.core.limits.max_frame_bytes);
                self.auth = Some(Box::new(Authed {
                    identity,
                    negotiated,
                    publish_target: None,
                    auth_frame: if cx.core.router.is_some() {
                        frame.to_bytes()
                    } else {
                        Bytes::new()
                    },
                    forwarding: None,
                }));
                cx.conn.authenticated = true;
                cx.core.stats.auths_accepted += 1;
                cx.core.metrics.auth_ok();
                FrameResult::Continue
            }
            Err(err) => {
                debug!(tenant = %auth.tenant_id, %err, "auth refused");
                cx.core.stats.auths_refused += 1;
                cx.core.metrics.auth_refused(ErrorCode::Unauthenticated);
                let msg = if coded {
                    ErrorMessage::coded(ErrorCode::Unauthenticated, err.to_string())
                } else {
                    ErrorMessage::plain(err.to_string())
                };
                self.push_message(&Message::Error(msg));
                FrameResult::CloseStream
            }
        }
    }

    fn on_message(&mut self, msg: Message, cx: &mut SessionCx<'_>) -> FrameResult {
        cx.core.metrics.request(msg.type_name());
        if let Some(target) = cluster::target(&msg) {
            // In a cluster the permission comes first: a forbidden request is refused here,
            // never forwarded, and no `not_leader` tells its sender where the shard lives.
            let may = match cx.core.router.is_some() {
                true => self.may_route(&msg, &target),
                false => cluster::MayRoute::Yes,
            };
            match may {
                cluster::MayRoute::Refused => return FrameResult::Continue,
                cluster::MayRoute::Handler => {}
                cluster::MayRoute::Yes => {
                    if self.answered_elsewhere(&target, cx) {
                        return FrameResult::Continue;
                    }
                }
            }
        }
        match msg {
            Message::Auth(_) => {
                self.push_error(
                    ErrorCode::InvalidRequest,
                    "this stream is already authenticated".into(),
                );
            }
            Message::Publish(p) => {
                let ack = p.ack.unwrap_or(message::AckMode::None);
                self.on_json_publish(
                    cx,
                    (&p.tenant_id, &p.namespace, &p.stream),
                    p.key,
                    p.shard,
                    vec![p.payload],
                    p.request_id,
                    ack,
                );
                // A publish that waits for its log to open runs again; it counts then.
                if self.stall_on.is_none() {
                    cx.core.metrics.json_publish_frame("publish");
                }
            }
            Message::PublishBatch(p) => {
                let ack = p.ack.unwrap_or(message::AckMode::None);
                self.on_json_publish(
                    cx,
                    (&p.tenant_id, &p.namespace, &p.stream),
                    p.key,
                    p.shard,
                    p.payloads,
                    p.request_id,
                    ack,
                );
                // A publish that waits for its log to open runs again; it counts then.
                if self.stall_on.is_none() {
                    cx.core.metrics.json_publish_frame("publish_batch");
                }
            }
            // Sent ahead of keyed publishes by clients that offer PUBLISH_WIDTH; never answered.
            Message::PublishWidth(_) => {}
            Message::Subscribe(s) => self.on_subscribe(s, cx),
            Message::CacheWatch(w) => return self.on_cache_watch(w, cx),
            Message::CounterAdd(a) => return self.on_counter_add(a, cx),
            Message::CounterGet(g) => return self.on_counter_get(g, cx),
            Message::CachePutIf(p) => return self.on_cache_put_if(p, cx),
            Message::CacheDeleteIf(d) => return self.on_cache_delete_if(d, cx),
            Message::CachePut(p) => {
                cx.core.stats.cache_requests += 1;
                let names = (&p.tenant_id[..], &p.namespace[..], &p.cache[..]);
                let Some(key) = self.cache_key_scope(cx, names, &p.key, Action::CacheWrite) else {
                    return FrameResult::Continue;
                };
                let unix = cx.core.unix_micros(cx.now);
                match cx
                    .core
                    .broker
                    .cache_put(cx.now, unix, &key, &p.key, p.value, p.ttl_ms)
                {
                    Ok(durable_at) => {
                        let ok = match p.request_id {
                            Some(request_id) => {
                                encode_message(&Message::CacheOk(CacheOk { request_id }))
                            }
                            None => encode_message(&Message::Ok),
                        };
                        // A durable cache acknowledges a write once the log has it.
                        self.push_once_durable(cx, durable_at, ok, FailAnswer::Error);
                    }
                    Err(e) if self.stalls(&e) => {}
                    Err(e) => self.push_broker_error(e),
                }
            }
            Message::CacheGet(g) => {
                let answer = CacheValue {
                    tenant_id: g.tenant_id,
                    namespace: g.namespace,
                    cache: g.cache,
                    key: g.key,
                    value: None,
                    request_id: g.request_id,
                    version: None,
                };
                self.answer_cache_read(cx, CacheRead::Get, answer);
            }
            Message::CacheDelete(d) => {
                let answer = CacheValue {
                    tenant_id: d.tenant_id,
                    namespace: d.namespace,
                    cache: d.cache,
                    key: d.key,
                    value: None,
                    request_id: d.request_id,
                    version: None,
                };
                self.answer_cache_read(cx, CacheRead::Delete, answer);
            }
            Message::StreamShards(s) => {
                let Some(shards) = self.stream_width(
                    cx,
                    &s.tenant_id,
                    &s.namespace,
                    &s.stream,
                    Action::StreamSubscribe,
                ) else {
                    return FrameResult::Continue;
                };
                let routing = cx.core.routing_mapping;
                self.push_message(&Message::StreamShardsView(StreamShardsView {
                    shards: shards.into(),
                    request_id: s.request_id,
                    routing: (routing != RoutingMapping::Modulo).then_some(routing),
                }));
            }
            Message::CacheShards(c) => {
                if self
                    .cache_scope(&c.tenant_id, &c.namespace, &c.cache, Action::CacheRead)
                    .is_none()
                {
                    return FrameResult::Continue;
                }
                // As many as the cluster placed (the count `shard_owners` lists), and one
                // outside a cluster or for a cache the cluster has not placed.
                let shards = cache_width(cx, &c.tenant_id, &c.namespace, &c.cache);
                self.push_message(&Message::CacheShardsView(CacheShardsView {
                    shards: shards.into(),
                    request_id: c.request_id,
                }));
            }
            m @ (Message::GroupPoll(_)
            | Message::GroupAck(_)
            | Message::GroupNack(_)
            | Message::GroupExtend(_)
            | Message::GroupDeadLetter(_)
            | Message::GroupDeadLetters(_)
            | Message::GroupDiscard(_)
            | Message::GroupRedrive(_)
            | Message::GroupSeek(_)
            | Message::GroupDescribe(_)
            | Message::GroupDelete(_)) => self.on_group(m, cx),
            Message::ShardOwners(o) => {
                // Where shards live is for those who may read the object.
                let allowed = match o.kind {
                    ShardKind::Stream => self
                        .stream_scope(&o.tenant_id, &o.namespace, &o.name, Action::StreamSubscribe)
                        .is_some(),
                    ShardKind::Cache => self
                        .cache_scope(&o.tenant_id, &o.namespace, &o.name, Action::CacheRead)
                        .is_some(),
                };
                if !allowed {
                    return FrameResult::Continue;
                }
                if let Some(answer) = self.cluster_owners(
                    cx,
                    o.kind,
                    (&o.tenant_id, &o.namespace, &o.name),
                    o.request_id,
                ) {
                    self.push_message(&answer);
                    return FrameResult::Continue;
                }
                let shards = match o.kind {
                    ShardKind::Stream => self.stream_width(
                        cx,
                        &o.tenant_id,
                        &o.namespace,
                        &o.name,
                        Action::StreamSubscribe,
                    ),
                    ShardKind::Cache => self
                        .cache_scope(&o.tenant_id, &o.namespace, &o.name, Action::CacheRead)
                        .map(|_| 1),
                };
                let Some(shards) = shards else {
                    return FrameResult::Continue;
                };
                // A broker outside a cluster serves every shard itself: no node_id, generation 0.
                let owners = (0..u64::from(shards))
                    .map(|shard| ShardOwner {
                        shard,
                        node_id: None,
                        addr: None,
                        generation: Some(0),
                        unavailable: None,
                    })
                    .collect();
                self.push_message(&Message::ShardOwnersView(ShardOwnersView {
                    request_id: o.request_id,
                    owners,
                }));
            }
            Message::ProducerInit(p) => self.on_producer_init(p, cx),
            Message::PublishIdempotent(p) => self.on_publish_idempotent(p, cx),
            Message::PublishIf(p) => self.on_publish_if(p, cx),
            Message::Commit(c) => self.on_commit(c, cx),
            Message::StateGet(g) => self.on_state_get(g, cx),
            Message::StreamRead(r) => self.on_stream_read(r, cx),
            Message::OffsetForTime(o) => self.on_offset_for_time(o, cx),
            Message::Topology => {
                if !self.cluster_topology(cx) {
                    self.on_topology()
                }
            }
            other if sent_only_by_brokers(&other) => {
                // An answer or an event-stream frame on a request stream: the client has its
                // streams mixed up, but the frame boundaries are intact, so the stream goes on.
                self.push_error(
                    ErrorCode::InvalidRequest,
                    format!("{} is sent by brokers, not a request", other.type_name()),
                );
            }
            other => return self.on_unsupported(&other, cx),
        }
        FrameResult::Continue
    }

    /// A request this broker does not serve: `unsupported` to a client that offered it,
    /// else an error and the end of the stream.
    fn on_unsupported(&mut self, msg: &Message, cx: &mut SessionCx<'_>) -> FrameResult {
        cx.core.stats.unsupported_requests += 1;
        trace!(request = msg.type_name(), "unsupported request");
        if self.negotiated().features.contains(Features::UNSUPPORTED) {
            let extension = match msg {
                Message::Extension(e) => Some(e.name.clone()),
                _ => None,
            };
            self.push_message(&Message::Unsupported(Unsupported {
                request_type: msg.type_name().to_owned(),
                extension,
                request_id: msg.request_id(),
            }));
            FrameResult::Continue
        } else {
            self.push_error(
                ErrorCode::InvalidRequest,
                format!("unsupported request type {:?}", msg.type_name()),
            );
            FrameResult::CloseStream
        }
    }

    fn on_subscribe(&mut self, s: message::Subscribe, cx: &mut SessionCx<'_>) {
        let Some(key) = self.stream_scope(
            &s.tenant_id,
            &s.namespace,
            &s.stream,
            Action::StreamSubscribe,
        ) else {
            return;
        };
        if cx.conn.subscriptions >= cx.core.limits.max_subscriptions_per_connection {
            self.push_error(
                ErrorCode::LimitExceeded,
                format!(
                    "too many subscriptions on one connection (max_subscriptions_per_connection {})",
                    cx.core.limits.max_subscriptions_per_connection
                ),
            );
            return;
        }
        let Ok(shard) = u32::try_from(s.shard.unwrap_or(0)) else {
            self.push_error(ErrorCode::InvalidRequest, "shard is out of range".into());
            return;
        };
        let start = match s.start {
            None | Some(message::Start::Latest) => Start::Latest,
            Some(message::Start::Earliest) => Start::Earliest,
            Some(message::Start::Offset(n)) => Start::Offset(n),
        };
        let subscription_id = match s.subscription_id {
            Some(id) => id,
            None => cx.core.next_subscription_id(),
        };
        let negotiated = self.negotiated();
        let queue_capacity = s
            .queue_capacity
            .map(|q| u32::try_from(q).unwrap_or(u32::MAX));
        let mut opts = SubscribeOpts::negotiated(
            subscription_id,
            negotiated.flags,
            negotiated.features,
            queue_capacity,
        );
        // Its queue counts against this connection's event budget.
        opts.owner = cx.ch.0 as u64;
        match cx.core.broker.subscribe(cx.now, &key, shard, start, opts) {
            Ok(granted) => {
                cx.core.stats.subscriptions += 1;
                self.push_message(&Message::Subscribed(SubscribedMsg {
                    subscription_id,
                    start_offset: granted.start_offset,
                    live_offset: granted.live_offset,
                    queue_capacity: granted.queue_capacity.map(u64::from),
                }));
                self.open_event_stream(cx, granted.id, subscription_id);
            }
            Err(SubscribeError::Broker(e)) if self.stalls(&e) => {}
            Err(SubscribeError::Broker(e)) => self.push_broker_error(e),
            Err(SubscribeError::Cursor {
                reason,
                requested,
                available,
            }) => self.push_cursor_error(reason, requested, available),
        }
    }

    /// A granted subscription or watch: the connection opens its event stream, which starts
    /// with `event_stream_hello`.
    pub(super) fn open_event_stream(
        &mut self,
        cx: &mut SessionCx<'_>,
        subscriber: SubscriberId,
        subscription_id: u64,
    ) {
        cx.conn.subscriptions += 1;
        cx.conn.new_subscriptions.push(NewSubscription {
            subscriber,
            hello: encode_message(&Message::EventStreamHello(EventStreamHello {
                subscription_id,
            })),
        });
    }

    /// A start offset the log cannot serve: `subscribe_cursor_error` naming what it has.
    pub(super) fn push_cursor_error(
        &mut self,
        reason: crate::broker::CursorReason,
        requested: u64,
        available: u64,
    ) {
        let reason = match reason {
            crate::broker::CursorReason::TooOld => message::CursorErrorReason::TooOld,
            crate::broker::CursorReason::InFuture => message::CursorErrorReason::InFuture,
        };
        self.push_message(&Message::SubscribeCursorError(
            message::SubscribeCursorError {
                reason,
                requested,
                available,
            },
        ));
    }

    /// A binary publish (0x0001, optionally acked 0x0008 and keyed 0x0040), accepted
    /// whatever was advertised. Acked ones are answered with a binary ack.
    fn on_binary_publish(&mut self, frame: &Frame, cx: &mut SessionCx<'_>) {
        let view = match PublishBatchView::parse(frame.flags, &frame.payload) {
            Ok(view) => view,
            Err(err) => {
                cx.core.stats.publishes_refused += 1;
                let acked = frame.flags.contains(Flags::BINARY_PUBLISH_ACKED);
                match frame.payload.get(..8) {
                    // The request id is readable: the publish is owed an ack.
                    Some(id) if acked => {
                        let request_id = u64::from_be_bytes(id.try_into().expect("8 bytes"));
                        self.push_ack_error(
                            request_id,
                            ErrorCode::InvalidRequest,
                            &err.to_string(),
                        );
                    }
                    _ if acked => self.push_error(ErrorCode::InvalidRequest, err.to_string()),
                    // Nobody waits for an unacked publish; it is dropped and counted.
                    _ => debug!(%err, "dropping a malformed unacked publish"),
                }
                return;
            }
        };
        let header = view.header;
        let request_id = header.acked.map(|a| a.request_id);
        if let Some(seq) = header.idempotent {
            // 0x0100 comes only with 0x0008 (the flag table refuses it alone).
            if let Some(id) = request_id {
                self.on_binary_idempotent(&view, seq, id, cx);
            }
            return;
        }
        if !self.publish_allowed(header.tenant_id, header.namespace, header.stream) {
            cx.core.stats.publishes_refused += 1;
            if let Some(id) = request_id {
                let e = self.publish_refusal(header.tenant_id, header.namespace, header.stream);
                self.push_ack_error(id, e.code, &e.message);
            }
            return;
        }
        let key = view.key_bytes();
        if cx.core.router.is_some() {
            let names = (header.tenant_id, header.namespace, header.stream);
            let t = cluster::binary_publish_target(names, key.as_deref(), request_id);
            if self.answered_elsewhere(&t, cx) {
                return;
            }
        }
        let payloads: Vec<Bytes> = view.payloads().collect();
        let tally = crate::metrics::PublishTally::of(&payloads);
        let unix = cx.core.unix_micros(cx.now);
        let target = &self
            .auth
            .as_ref()
            .expect("authenticated")
            .publish_target
            .as_ref()
            .expect("set")
            .0;
        let result =
            cx.core
                .broker
                .publish(cx.now, unix, target, key.as_deref(), None, payloads, None);
        match result {
            Ok(published) => {
                cx.core.stats.publishes += 1;
                cx.core.metrics.published_binary(tally);
                if let Some(id) = request_id {
                    match self.ack_after_write(cx, &published) {
                        Some((log, end, offset)) => {
                            let ok = ack_frame(&PublishAck::ok(id, offset));
                            self.push_after_durable(cx, log, end, ok, FailAnswer::BinaryAck(id));
                        }
                        // `ack_before_write`: acknowledged as accepted, so no offset, which
                        // only a written batch has.
                        None => self.push_ack(&PublishAck::ok(id, None)),
                    }
                }
            }
            Err(e) if self.stalls(&e) => {}
            Err(e) => {
                cx.core.stats.publishes_refused += 1;
                if let Some(id) = request_id {
                    self.push_ack_error(id, e.code, &e.message);
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_json_publish(
        &mut self,
        cx: &mut SessionCx<'_>,
        (tenant, namespace, stream): (&str, &str, &str),
        key: Option<Bytes>,
        shard: Option<u64>,
        payloads: Vec<Bytes>,
        request_id: Option<u64>,
        ack: message::AckMode,
    ) {
        let answered = ack != message::AckMode::None;
        let tally = crate::metrics::PublishTally::of(&payloads);
        let result = if !self.publish_allowed(tenant, namespace, stream) {
            Err(self.publish_refusal(tenant, namespace, stream))
        } else {
            match shard.map(u32::try_from) {
                Some(Err(_)) => Err(BrokerError::new(
                    ErrorCode::InvalidRequest,
                    "shard is out of range",
                )),
                Some(Ok(s)) => Ok(Some(s)),
                None => Ok(None),
            }
            .and_then(|explicit| {
                let unix = cx.core.unix_micros(cx.now);
                let target = &self
                    .auth
                    .as_ref()
                    .expect("authenticated")
                    .publish_target
                    .as_ref()
                    .expect("set")
                    .0;
                cx.core.broker.publish(
                    cx.now,
                    unix,
                    target,
                    key.as_deref(),
                    explicit,
                    payloads,
                    None,
                )
            })
        };
        match &result {
            Err(e) if self.stalls(e) => return,
            Ok(_) => {
                cx.core.stats.publishes += 1;
                cx.core.metrics.published_json(tally);
            }
            Err(_) => cx.core.stats.publishes_refused += 1,
        }
        if !answered {
            return;
        }
        let coded = self.negotiated().error_codes();
        match (request_id, result) {
            (request_id, Ok(p)) => match (self.ack_after_write(cx, &p), request_id) {
                (Some((log, end, offset)), Some(request_id)) => {
                    let ok = encode_message(&Message::PublishOk(PublishOk { request_id, offset }));
                    let fail = FailAnswer::JsonPublish(request_id);
                    self.push_after_durable(cx, log, end, ok, fail);
                }
                (Some((log, end, _)), None) => {
                    let ok = encode_message(&Message::Ok);
                    self.push_after_durable(cx, log, end, ok, FailAnswer::Error);
                }
                (None, Some(request_id)) => self.push_message(&Message::PublishOk(PublishOk {
                    request_id,
                    offset: None,
                })),
                (None, None) => self.push_message(&Message::Ok),
            },
            (Some(request_id), Err(e)) => {
                let retry = e.code.default_retry();
                self.push_message(&Message::PublishError(PublishError {
                    request_id,
                    message: e.message,
                    code: coded.then_some(e.code),
                    retry: coded.then_some(retry),
                    detail: None,
                }))
            }
            (None, Err(e)) => self.push_broker_error(e),
        }
    }

    /// Whether this stream's identity may publish to the stream, remembering the stream's
    /// key for the publish that follows.
    fn publish_allowed(&mut self, tenant: &str, namespace: &str, stream: &str) -> bool {
        let authed = self.auth.as_mut().expect("authenticated");
        if let Some((key, allowed)) = &authed.publish_target {
            if key.tenant == tenant && key.namespace == namespace && key.stream == stream {
                return *allowed;
            }
        }
        let allowed = stream_object(tenant, namespace, stream)
            .is_some_and(|object| authed.identity.allows(Action::StreamPublish, &object));
        authed.publish_target = Some((StreamKey::new(tenant, namespace, stream), allowed));
        allowed
    }

    /// Why a publish was not allowed: a name that cannot form an object is a malformed
    /// request (`invalid_request`); a missing permission is `forbidden`.
    fn publish_refusal(&self, tenant: &str, namespace: &str, stream: &str) -> BrokerError {
        let identity = &self.auth.as_ref().expect("authenticated").identity;
        if stream_object(tenant, namespace, stream).is_none() {
            name_refusal("stream", [tenant, namespace, stream])
        } else {
            let message = format!(
                "{} may not publish to {tenant}/{namespace}/{stream}",
                if identity.subject.is_empty() {
                    "this token"
                } else {
                    &identity.subject
                }
            );
            BrokerError::new(ErrorCode::Forbidden, message)
        }
    }

    /// Checks a stream permission; on refusal answers and returns `None`.
    fn stream_scope(
        &mut self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        action: Action,
    ) -> Option<StreamKey> {
        let Some(object) = stream_object(tenant, namespace, stream) else {
            self.push_broker_error(name_refusal("stream", [tenant, namespace, stream]));
            return None;
        };
        if !self
            .auth
            .as_ref()
            .expect("authenticated")
            .identity
            .allows(action, &object)
        {
            self.push_error(
                ErrorCode::Forbidden,
                format!("{action} is not granted on {object}"),
            );
            return None;
        }
        Some(StreamKey::new(tenant, namespace, stream))
    }

    /// Checks a cache permission; on refusal answers and returns `None`.
    fn cache_scope(
        &mut self,
        tenant: &str,
        namespace: &str,
        cache: &str,
        action: Action,
    ) -> Option<CacheKey> {
        let Some(object) = cache_object(tenant, namespace, cache) else {
            self.push_broker_error(name_refusal("cache", [tenant, namespace, cache]));
            return None;
        };
        if !self
            .auth
            .as_ref()
            .expect("authenticated")
            .identity
            .allows(action, &object)
        {
            self.push_error(
                ErrorCode::Forbidden,
                format!("{action} is not granted on {object}"),
            );
            return None;
        }
        Some(CacheKey::new(tenant, namespace, cache))
    }

    /// As [`cache_scope`](Self::cache_scope), on the shard the item `k` hashes to.
    fn cache_key_scope(
        &mut self,
        cx: &SessionCx<'_>,
        (tenant, namespace, cache): (&str, &str, &str),
        k: &str,
        action: Action,
    ) -> Option<CacheKey> {
        let mut key = self.cache_scope(tenant, namespace, cache, action)?;
        let width = cache_width(cx, tenant, namespace, cache);
        key.shard = felix_cluster::routing::cache_shard(k.as_bytes(), width);
        Some(key)
    }

    /// A stream's shard count as routing answers give it: streams are created on first use,
    /// so one not seen yet has the default width a publish would give it. In a cluster that
    /// places no stream on first use, one it has not placed has none: 0, so a client does not
    /// read shard 0 of a stream that does not exist.
    fn stream_width(
        &mut self,
        cx: &SessionCx<'_>,
        tenant: &str,
        namespace: &str,
        stream: &str,
        action: Action,
    ) -> Option<u32> {
        let key = self.stream_scope(tenant, namespace, stream, action)?;
        if let Some(router) = cx.core.router.as_ref() {
            if !router.places_streams_on_first_use() {
                return Some(router.stream_width(tenant, namespace, stream).unwrap_or(0));
            }
        }
        Some(
            cx.core
                .broker
                .shard_count(&key)
                .unwrap_or(cx.core.default_shards),
        )
    }

    fn negotiated(&self) -> &Negotiated {
        &self.auth.as_ref().expect("authenticated").negotiated
    }

    /// A refusal because the shard's log is still opening: the request will run again.
    fn stalls(&mut self, e: &BrokerError) -> bool {
        match e.opening {
            Some(log) => {
                self.stall_on = Some(log);
                true
            }
            None => false,
        }
    }

    /// Whether this publish is answered after its write: on a durable shard always, unless
    /// the operator chose `ack_before_write` and this client did not offer
    /// FEATURE_ACK_ON_COMMIT.
    /// Gives the log, the offset the batch must be durable below, and the offset to put in
    /// the answer (for a client that offered 0x1000).
    fn ack_after_write(
        &self,
        cx: &SessionCx<'_>,
        published: &crate::broker::Published,
    ) -> Option<(LogId, u64, Option<u64>)> {
        let (log, end) = published.durable_at?;
        let negotiated = self.negotiated();
        let wanted = cx.core.broker.acks_after_write()
            || negotiated.features.contains(Features::ACK_ON_COMMIT);
        if !wanted {
            return None;
        }
        let offset = published
            .first_offset
            .filter(|_| negotiated.flags.contains(Flags::BINARY_PUBLISH_ACK_OFFSET));
        Some((log, end, offset))
    }

    // ---- answers ------------------------------------------------------------------------

    /// Queues an encoded answer behind every earlier one.
    fn push_frame(&mut self, frame: Bytes) {
        if self.held.is_empty() {
            self.outbox.push_back(frame);
        } else {
            self.held.push_back(Held::Ready(frame));
        }
    }

    /// Queues `frame` to go out once `durable_at` (a log and the offset it must be durable
    /// below) holds, or in turn when there is nothing to wait for.
    fn push_once_durable(
        &mut self,
        cx: &mut SessionCx<'_>,
        durable_at: Option<(LogId, u64)>,
        frame: Bytes,
        fail: FailAnswer,
    ) {
        match durable_at {
            Some((log, end)) => self.push_after_durable(cx, log, end, frame, fail),
            None => self.push_frame(frame),
        }
    }

    /// Queues `ok` to go out once `log` is durable below `end`.
    fn push_after_durable(
        &mut self,
        cx: &mut SessionCx<'_>,
        log: LogId,
        end: u64,
        ok: Bytes,
        fail: FailAnswer,
    ) {
        cx.core.stats.answers_after_write += 1;
        if self.held.is_empty() && cx.core.broker.durable_offset(log) >= end {
            self.outbox.push_back(ok);
            return;
        }
        // A log already forgotten sends no more notices: answer now, in turn.
        if let Some(frame) = self.gone_frame(cx.core, log, fail) {
            self.push_frame(frame);
            return;
        }
        let leadership = cx.core.broker.leadership(log);
        self.held.push_back(Held::Durable {
            log,
            end,
            leadership,
            ok,
            fail,
        });
        cx.core.wait_durable(log, end, cx.ch, cx.stream);
    }

    /// Queues a `cache_value`: now, or once the log has read the value (and made a delete
    /// durable).
    /// `cache_get` and `cache_delete`: both answer `cache_value` with the value found (or
    /// removed), so they differ only in the broker call and the permission it needs.
    fn answer_cache_read(&mut self, cx: &mut SessionCx<'_>, op: CacheRead, answer: CacheValue) {
        cx.core.stats.cache_requests += 1;
        let action = match op {
            CacheRead::Get => Action::CacheRead,
            CacheRead::Delete => Action::CacheWrite,
        };
        let names = (
            &answer.tenant_id[..],
            &answer.namespace[..],
            &answer.cache[..],
        );
        let Some(key) = self.cache_key_scope(cx, names, &answer.key, action) else {
            return;
        };
        let unix = cx.core.unix_micros(cx.now);
        let mut answer = answer;
        if matches!(op, CacheRead::Get) {
            answer.version = self.value_version(cx, &key, &answer.key);
        }
        let result = match op {
            CacheRead::Get => cx.core.broker.cache_get(cx.now, unix, &key, &answer.key),
            CacheRead::Delete => cx.core.broker.cache_delete(cx.now, unix, &key, &answer.key),
        };
        match result {
            Ok(found) => self.push_cache_value(cx, found, answer),
            Err(e) if self.stalls(&e) => {}
            Err(e) => self.push_broker_error(e),
        }
    }

    fn push_cache_value(&mut self, cx: &mut SessionCx<'_>, found: CacheAnswer, answer: CacheValue) {
        match found {
            CacheAnswer::Now(value) => self.push_message(&Message::CacheValue(CacheValue {
                version: value.as_ref().and(answer.version),
                value,
                ..answer
            })),
            CacheAnswer::Later {
                log,
                ticket,
                durable_at,
            } => {
                if let Some(ticket) = ticket {
                    cx.core.wait_value(log, ticket, cx.ch, cx.stream);
                }
                if let Some(end) = durable_at {
                    cx.core.wait_durable(log, end, cx.ch, cx.stream);
                }
                self.held.push_back(Held::Value(Box::new(HeldValue {
                    log,
                    ticket,
                    value: ticket.is_none().then_some(Ok(None)),
                    durable_at,
                    answer,
                    raw: false,
                })));
            }
        }
    }

    /// The answer to a held request whose log can no longer make it durable: `storage` if
    /// the log failed, `not_found` if its stream was deleted (the log is forgotten, so the
    /// wait could never end). `None` while the log may still get there.
    fn gone_frame(&self, core: &Core, log: LogId, fail: FailAnswer) -> Option<Bytes> {
        Some(match core.broker.log_gone(log)? {
            LogGone::Failed(why) => {
                let message = format!("the write did not become durable: {why}");
                self.fail_frame(fail, ErrorCode::Storage, &message)
            }
            LogGone::Deleted => self.fail_frame(fail, ErrorCode::NotFound, DELETED),
        })
    }

    fn fail_frame(&self, fail: FailAnswer, code: ErrorCode, message: &str) -> Bytes {
        match fail {
            FailAnswer::BinaryAck(id) => self.ack_error_frame(id, code, message),
            FailAnswer::JsonPublish(request_id) => {
                let coded = self.negotiated().error_codes();
                let retry = code.default_retry();
                encode_message(&Message::PublishError(PublishError {
                    request_id,
                    message: message.to_owned(),
                    code: coded.then_some(code),
                    retry: coded.then_some(retry),
                    detail: None,
                }))
            }
            FailAnswer::Error => self.error_frame(code, message.to_owned()),
        }
    }

    /// `auth` while the broker drains: `draining` [retry] (plain text to a client that did
    /// not offer error codes), and the stream ends.
    fn refuse_auth_draining(&mut self, coded: bool) -> FrameResult {
        let text = "the broker is shutting down".to_owned();
        let msg = match coded {
            true => ErrorMessage::coded(ErrorCode::Draining, text),
            false => ErrorMessage::plain(text),
        };
        self.raised.note(&ErrorCode::Draining);
        self.push_message(&Message::Error(msg));
        FrameResult::CloseStream
    }

    fn push_message(&mut self, msg: &Message) {
        self.push_frame(encode_message(msg));
    }

    /// An `error`, coded when the stream negotiated error codes.
    fn error_frame(&self, code: ErrorCode, message: String) -> Bytes {
        let coded = self
            .auth
            .as_ref()
            .is_some_and(|a| a.negotiated.error_codes());
        let msg = if coded {
            ErrorMessage::coded(code, message)
        } else {
            ErrorMessage::plain(message)
        };
        encode_message(&Message::Error(msg))
    }

    fn push_error(&mut self, code: ErrorCode, message: String) {
        self.raised.note(&code);
        let frame = self.error_frame(code, message);
        self.push_frame(frame);
    }

    fn push_broker_error(&mut self, e: BrokerError) {
        self.push_error(e.code, e.message);
    }

    fn push_ack(&mut self, ack: &PublishAck) {
        self.push_frame(ack_frame(ack));
    }

    /// A failed binary ack; the code goes only to a client that offered 0x0200.
    fn ack_error_frame(&self, request_id: u64, code: ErrorCode, message: &str) -> Bytes {
        let coded = self
            .negotiated()
            .flags
            .contains(Flags::BINARY_PUBLISH_ACK_CODE);
        let retry = code.default_retry();
        ack_frame(&PublishAck {
            request_id,
            result: AckResult::Err {
                message: message.to_owned(),
                code: coded.then_some((code, retry)),
                detail: None,
            },
            owner: None,
        })
    }

    fn push_ack_error(&mut self, request_id: u64, code: ErrorCode, message: &str) {
        self.raised.note(&code);
        let frame = self.ack_error_frame(request_id, code, message);
        self.push_frame(frame);
    }
}

/// Why names cannot form an object: a name longer than [`NAME_MAX_BYTES`] (otherwise of
/// the allowed characters) is `limit_exceeded`; anything else is `invalid_request`.
fn name_refusal(kind: &str, names: [&str; 3]) -> BrokerError {
    let path = names.join("/");
    let shown: String = path.chars().take(96).collect();
    let too_long = names.iter().any(|n| n.len() > NAME_MAX_BYTES);
    if too_long && names.iter().all(|n| !n.is_empty() && name_charset_ok(n)) {
        return BrokerError::new(
            ErrorCode::LimitExceeded,
            format!("a {kind} name in {shown}... is longer than {NAME_MAX_BYTES} bytes"),
        );
    }
    BrokerError::new(
        ErrorCode::InvalidRequest,
        format!(
            "invalid {kind} name {shown:?}: tenant, namespace and {kind} names are 1 to \
             {NAME_MAX_BYTES} bytes of A-Z a-z 0-9 . _ -"
        ),
    )
}

/// Messages only a broker sends: answers, and what travels on event streams.
fn sent_only_by_brokers(msg: &Message) -> bool {
    matches!(
        msg,
        Message::Ok
            | Message::AuthOk(_)
            | Message::Error(_)
            | Message::NotLeader(_)
            | Message::Unsupported(_)
            | Message::PublishOk(_)
            | Message::PublishError(_)
            | Message::PublishRefused(_)
            | Message::ProducerInitOk(_)
            | Message::CommitOk(_)
            | Message::StateValue(_)
            | Message::Subscribed(_)
            | Message::SubscribeCursorError(_)
            | Message::EventStreamHello(_)
            | Message::Event(_)
            | Message::EventBatch(_)
            | Message::SubscriptionLagged(_)
            | Message::ShardMoved(_)
            | Message::StreamDeleted(_)
            | Message::CacheValue(_)
            | Message::CacheOk(_)
            | Message::CacheConditionResult(_)
            | Message::CacheWatchStarted(_)
            | Message::CacheEvent(_)
            | Message::CacheWatchLagged(_)
            | Message::CounterValue(_)
            | Message::GroupRecords(_)
            | Message::GroupExtended(_)
            | Message::GroupPosition(_)
            | Message::GroupInfo(_)
            | Message::GroupDeleted(_)
            | Message::StreamRecords(_)
            | Message::OffsetValue(_)
            | Message::StreamShardsView(_)
            | Message::CacheShardsView(_)
            | Message::ShardOwnersView(_)
            | Message::TopologyView(_)
            | Message::ShardInspectInfo(_)
            | Message::SubscriptionsListInfo(_)
    )
}

/// A binary ack as a whole frame.
fn ack_frame(ack: &PublishAck) -> Bytes {
    let len = ack.encoded_len();
    let mut out = BytesMut::with_capacity(felix_proto::frame::HEADER_LEN + len);
    encode_frame_header(ack.flags(), len, &mut out);
    ack.encode_into(&mut out);
    out.freeze()
}

/// How many shards `cache` has: as the cluster placed it, and one outside a cluster or for a
/// cache not placed (as `cache_shards` answers).
pub(super) fn cache_width(cx: &SessionCx<'_>, tenant: &str, namespace: &str, cache: &str) -> u32 {
    cx.core
        .router
        .as_ref()
        .and_then(|c| c.cache_width(tenant, namespace, cache))
        .unwrap_or(1)
}
