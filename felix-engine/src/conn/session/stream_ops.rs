//! The session side of the stream features beyond publish and subscribe: idempotent
//! producers (`producer_init`, `publish_idempotent`, the binary 0x0100 frame),
//! `publish_if`, `commit` / `state_get`, `stream_read`, `offset_for_time` and `topology`.
//! Each checks the identity's permission, calls the broker, and answers in request order
//! (an answer that is only true once the log has written waits for it).

use bytes::Bytes;
use felix_proto::binary::{ProducerSeq, PublishBatchView};
use felix_proto::message::{
    self, CacheValue, CommitOk, Message, ProducerInitOk, PublishError, PublishOk,
    PublishRefusalReason, PublishRefused, StateValue, TopologyView,
};
use felix_proto::Features;

use super::{encode_message, FailAnswer, Held, HeldValue, Session, SessionCx};
use crate::broker::{BrokerError, Guard, Guarded, PageRequest, Published, ReadAnswer, StreamKey};
use felix_auth::Action;
use felix_storage::log::ReadTicket;
use felix_storage::ops::LogId;

/// A publish guarded by a producer sequence or an expected offset, as either encoding
/// carried it.
struct GuardedPublish<'a> {
    names: (&'a str, &'a str, &'a str),
    key: Option<Bytes>,
    shard: Option<u64>,
    payloads: Vec<Bytes>,
    request_id: u64,
    guard: Guard,
}

impl Session {
    pub(super) fn on_producer_init(&mut self, p: message::ProducerInit, cx: &mut SessionCx<'_>) {
        let unix = cx.core.unix_micros(cx.now);
        let producer_id = cx.core.broker.new_producer_id(unix);
        self.push_message(&Message::ProducerInitOk(ProducerInitOk {
            request_id: p.request_id,
            producer_id,
        }));
    }

    pub(super) fn on_publish_idempotent(
        &mut self,
        p: message::PublishIdempotent,
        cx: &mut SessionCx<'_>,
    ) {
        let publish = GuardedPublish {
            names: (&p.tenant_id, &p.namespace, &p.stream),
            key: p.key,
            shard: p.shard,
            payloads: p.payloads,
            request_id: p.request_id,
            guard: Guard::Sequence {
                producer: p.producer_id,
                sequence: p.sequence,
            },
        };
        self.on_guarded_publish(publish, cx);
    }

    pub(super) fn on_publish_if(&mut self, p: message::PublishIf, cx: &mut SessionCx<'_>) {
        let publish = GuardedPublish {
            names: (&p.tenant_id, &p.namespace, &p.stream),
            key: p.key,
            shard: p.shard,
            payloads: p.payloads,
            request_id: p.request_id,
            guard: Guard::Offset(p.expected_offset),
        };
        self.on_guarded_publish(publish, cx);
    }

    /// The binary idempotent frame (0x0100): answered as `publish_idempotent` is, in JSON.
    pub(super) fn on_binary_idempotent(
        &mut self,
        view: &PublishBatchView<'_>,
        seq: ProducerSeq,
        request_id: u64,
        cx: &mut SessionCx<'_>,
    ) {
        let h = &view.header;
        self.on_guarded_publish(
            GuardedPublish {
                names: (h.tenant_id, h.namespace, h.stream),
                key: view.key_bytes(),
                shard: None,
                payloads: view.payloads().collect(),
                request_id,
                guard: Guard::Sequence {
                    producer: seq.producer_id,
                    sequence: seq.sequence,
                },
            },
            cx,
        );
    }

    fn on_guarded_publish(&mut self, p: GuardedPublish<'_>, cx: &mut SessionCx<'_>) {
        let (tenant, namespace, stream) = p.names;
        let request_id = p.request_id;
        let reused = self
            .negotiated()
            .features
            .contains(Features::SEQUENCE_REUSED);
        let result = self
            .guarded_target(tenant, namespace, stream, p.shard)
            .and_then(|(target, explicit)| {
                let unix = cx.core.unix_micros(cx.now);
                cx.core.broker.publish_guarded(
                    cx.now,
                    unix,
                    &target,
                    (p.key.as_deref(), explicit),
                    p.payloads,
                    p.guard,
                    reused,
                )
            });
        match result {
            Err(e) if self.stalls(&e) => {}
            Err(e) => {
                cx.core.stats.publishes_refused += 1;
                self.push_publish_error(request_id, e);
            }
            Ok(Guarded::Refused(reason)) => {
                cx.core.stats.publishes_refused += 1;
                self.push_refused(request_id, reason);
            }
            Ok(Guarded::Written(published) | Guarded::Duplicate(published)) => {
                cx.core.stats.publishes += 1;
                self.push_publish_ok(cx, request_id, &published);
            }
        }
    }

    /// The stream a guarded publish writes to, if the identity may publish there, and the
    /// explicit shard it named.
    fn guarded_target(
        &mut self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: Option<u64>,
    ) -> Result<(StreamKey, Option<u32>), BrokerError> {
        if !self.publish_allowed(tenant, namespace, stream) {
            return Err(self.publish_refusal(tenant, namespace, stream));
        }
        Ok((
            StreamKey::new(tenant, namespace, stream),
            shard_index(shard)?,
        ))
    }

    /// The stream, if the identity holds `action` on it, and the shard the request named;
    /// on refusal answers and returns `None`.
    fn scoped_shard(
        &mut self,
        (tenant, namespace, stream): (&str, &str, &str),
        action: Action,
        shard: Option<u64>,
    ) -> Option<(StreamKey, Option<u32>)> {
        let key = self.stream_scope(tenant, namespace, stream, action)?;
        match shard_index(shard) {
            Ok(shard) => Some((key, shard)),
            Err(e) => {
                self.push_broker_error(e);
                None
            }
        }
    }

    /// `publish_ok` with the batch's first offset, once the batch is durable.
    fn push_publish_ok(&mut self, cx: &mut SessionCx<'_>, request_id: u64, p: &Published) {
        let ok = encode_message(&Message::PublishOk(PublishOk {
            request_id,
            offset: p.first_offset,
        }));
        self.push_once_durable(cx, p.durable_at, ok, FailAnswer::JsonPublish(request_id));
    }

    fn push_refused(&mut self, request_id: u64, reason: PublishRefusalReason) {
        let message = match &reason {
            PublishRefusalReason::SequenceGap { expected } => {
                format!("sequence gap: {expected} is the next this producer may send")
            }
            PublishRefusalReason::UnknownProducer => "unknown producer".into(),
            PublishRefusalReason::SequenceExpired => "sequence expired".into(),
            PublishRefusalReason::SequenceReused => {
                "this sequence was used for a different batch".into()
            }
            PublishRefusalReason::OffsetMismatch { tail } => {
                format!("the shard's next offset is {tail}")
            }
            PublishRefusalReason::NotLeader { .. } => "not the leader".into(),
        };
        self.push_message(&Message::PublishRefused(PublishRefused {
            request_id,
            reason,
            message,
        }));
    }

    /// `publish_error` for a refused publish, coded for a client that offered error codes
    /// (the JSON publish in session.rs answers the same way).
    pub(super) fn push_publish_error(&mut self, request_id: u64, e: BrokerError) {
        let coded = self.negotiated().error_codes();
        let retry = e.code.default_retry();
        self.push_message(&Message::PublishError(PublishError {
            request_id,
            message: e.message,
            code: coded.then_some(e.code),
            retry: coded.then_some(retry),
            detail: None,
        }));
    }

    pub(super) fn on_commit(&mut self, c: message::Commit, cx: &mut SessionCx<'_>) {
        let names = (
            c.tenant_id.as_str(),
            c.namespace.as_str(),
            c.stream.as_str(),
        );
        let Some((key, explicit)) = self.scoped_shard(names, Action::StreamPublish, c.shard) else {
            return;
        };
        let unix = cx.core.unix_micros(cx.now);
        let result = cx.core.broker.commit(
            cx.now,
            unix,
            &key,
            (&c.entity_key, explicit),
            c.event,
            &c.changes,
            c.expected_offset,
        );
        match result {
            Err(e) if self.stalls(&e) => {}
            Err(e) => self.push_broker_error(e),
            Ok(crate::broker::Committed::Refused(reason)) => {
                self.push_refused(c.request_id, reason)
            }
            Ok(crate::broker::Committed::Written(p)) => {
                let (Some(offset), Some((log, end))) = (p.first_offset, p.durable_at) else {
                    unreachable!("a commit is written to a durable shard");
                };
                let ok = encode_message(&Message::CommitOk(CommitOk {
                    request_id: c.request_id,
                    offset,
                }));
                self.push_after_durable(cx, log, end, ok, FailAnswer::Error);
            }
        }
    }

    pub(super) fn on_state_get(&mut self, g: message::StateGet, cx: &mut SessionCx<'_>) {
        let names = (
            g.tenant_id.as_str(),
            g.namespace.as_str(),
            g.stream.as_str(),
        );
        let Some((key, explicit)) = self.scoped_shard(names, Action::StreamSubscribe, g.shard)
        else {
            return;
        };
        match cx
            .core
            .broker
            .state_get(cx.now, &key, (&g.entity_key, explicit), &g.key)
        {
            Err(e) if self.stalls(&e) => {}
            Err(e) => self.push_broker_error(e),
            Ok(answer) => {
                let frame = encode_message(&Message::StateValue(StateValue {
                    value: answer.value,
                    version: answer.version,
                    as_of: answer.as_of,
                    request_id: g.request_id,
                }));
                self.push_once_durable(cx, answer.durable_at, frame, FailAnswer::Error);
            }
        }
    }

    pub(super) fn on_stream_read(&mut self, r: message::StreamRead, cx: &mut SessionCx<'_>) {
        let names = (
            r.tenant_id.as_str(),
            r.namespace.as_str(),
            r.stream.as_str(),
        );
        let Some((key, Some(shard))) =
            self.scoped_shard(names, Action::StreamSubscribe, Some(r.shard))
        else {
            return;
        };
        let req = PageRequest {
            shard,
            from: r.from,
            end: r.end,
            max_records: r.max_records,
            max_bytes: r.max_bytes,
            request_id: r.request_id,
        };
        let answer = cx.core.broker.stream_read(cx.now, &key, req);
        self.push_read_answer(cx, answer);
    }

    pub(super) fn on_offset_for_time(&mut self, o: message::OffsetForTime, cx: &mut SessionCx<'_>) {
        let names = (
            o.tenant_id.as_str(),
            o.namespace.as_str(),
            o.stream.as_str(),
        );
        let Some((key, Some(shard))) =
            self.scoped_shard(names, Action::StreamSubscribe, Some(o.shard))
        else {
            return;
        };
        let answer = cx
            .core
            .broker
            .offset_for_time(cx.now, &key, shard, o.at_micros, o.request_id);
        self.push_read_answer(cx, answer);
    }

    pub(super) fn on_topology(&mut self) {
        // A broker outside a cluster names no other broker; the client keeps the address
        // it dialled (an empty list is an answer, not an error).
        self.push_message(&Message::TopologyView(TopologyView {
            brokers: Vec::new(),
        }));
    }

    fn push_read_answer(
        &mut self,
        cx: &mut SessionCx<'_>,
        answer: Result<ReadAnswer, BrokerError>,
    ) {
        match answer {
            Err(e) if self.stalls(&e) => {}
            Err(e) => self.push_broker_error(e),
            Ok(ReadAnswer::Now(frame)) => self.push_frame(frame),
            Ok(ReadAnswer::Later { log, ticket }) => self.hold_read(cx, log, ticket),
        }
    }

    /// Holds the answer until the log read lands; the broker encodes the frame.
    fn hold_read(&mut self, cx: &mut SessionCx<'_>, log: LogId, ticket: ReadTicket) {
        cx.core.wait_value(log, ticket, cx.ch, cx.stream);
        self.held.push_back(Held::Value(Box::new(HeldValue {
            log,
            ticket: Some(ticket),
            value: None,
            durable_at: None,
            answer: CacheValue {
                tenant_id: String::new(),
                namespace: String::new(),
                cache: String::new(),
                key: String::new(),
                value: None,
                request_id: None,
                version: None,
            },
            raw: true,
        })));
    }
}

/// A shard the request named, as the broker indexes shards.
fn shard_index(shard: Option<u64>) -> Result<Option<u32>, BrokerError> {
    shard.map(u32::try_from).transpose().map_err(|_| {
        BrokerError::new(
            felix_proto::ErrorCode::InvalidRequest,
            "shard is out of range",
        )
    })
}
