//! A session's consumer-group requests: permission checks, the call into the broker, and
//! the answers the real client expects (settles are answered `cache_ok` with the request
//! id; a poll's `group_records` is held until its records are read, or its wait ends).

use std::time::Duration;

use bytes::Bytes;
use felix_proto::message::{
    CacheOk, ErrorMessage, GroupDeadLetterList, GroupDeleted, GroupExtended, GroupInfo,
    GroupPosition, GroupRecord, GroupRecords, Message, Start,
};
use felix_proto::{ErrorCode, Features, RetryClass};

use super::{encode_message, FailAnswer, Held, Session, SessionCx};
use crate::broker::groups::{
    GroupAddr, PollRequest, PolledRecord, SeekTo, SettleOp, MAX_CONSUMER_BYTES,
};
use crate::broker::{BrokerError, StreamKey};
use felix_auth::{name_charset_ok, stream_object, Action, NAME_MAX_BYTES};

/// A held `group_records`: filled when the broker answers the poll.
pub(crate) struct HeldGroup {
    pub(super) waiter: u64,
    pub(super) request_id: u64,
    pub(super) result: Option<Result<Vec<PolledRecord>, BrokerError>>,
}

/// The five fields every group request starts with.
struct Named<'a> {
    tenant: &'a str,
    namespace: &'a str,
    stream: &'a str,
    shard: u64,
    group: &'a str,
}

macro_rules! named {
    ($m:expr) => {
        Named {
            tenant: &$m.tenant_id,
            namespace: &$m.namespace,
            stream: &$m.stream,
            shard: $m.shard,
            group: &$m.group,
        }
    };
}

impl<'a> Named<'a> {
    fn addr(&self, key: &'a StreamKey) -> GroupAddr<'a> {
        GroupAddr {
            key,
            shard: self.shard,
            group: self.group,
        }
    }
}

fn millis(ms: Option<u64>) -> Option<Duration> {
    ms.filter(|&m| m > 0).map(Duration::from_millis)
}

/// The operation a group request counts as in `felix_broker_group_operations_total`.
fn group_op_name(msg: &Message) -> &'static str {
    match msg {
        Message::GroupPoll(_) => "poll",
        Message::GroupAck(_) => "ack",
        Message::GroupNack(_) => "nack",
        Message::GroupExtend(_) => "extend",
        Message::GroupDeadLetter(_) => "dead_letter",
        Message::GroupDiscard(_) => "discard",
        Message::GroupRedrive(_) => "redrive",
        Message::GroupDeadLetters(_) => "dead_letters",
        Message::GroupSeek(_) => "seek",
        Message::GroupDescribe(_) => "describe",
        Message::GroupDelete(_) => "delete",
        _ => "other",
    }
}

impl Session {
    /// Any `group_*` request.
    pub(super) fn on_group(&mut self, msg: Message, cx: &mut SessionCx<'_>) {
        let op = group_op_name(&msg);
        self.dispatch_group(msg, cx);
        // A request that waits for its log to open runs again later; it counts once, then.
        if self.stall_on.is_none() {
            cx.core.metrics.group_op(op);
        }
    }

    fn dispatch_group(&mut self, msg: Message, cx: &mut SessionCx<'_>) {
        match msg {
            Message::GroupPoll(p) => self.on_group_poll(p, cx),
            Message::GroupAck(m) => {
                self.group_settle(cx, named!(m), m.offset, m.request_id, SettleOp::Ack)
            }
            Message::GroupNack(m) => {
                let op = SettleOp::Nack {
                    delay: millis(m.delay_ms),
                    attempts: m.attempts.filter(|&a| a > 0),
                };
                self.group_settle(cx, named!(m), m.offset, m.request_id, op)
            }
            Message::GroupExtend(m) => {
                if m.extend_ms == 0 {
                    return self.push_error(
                        ErrorCode::InvalidRequest,
                        "extend_ms must be at least 1".into(),
                    );
                }
                let op = SettleOp::Extend {
                    attempts: m.attempts,
                    by: Duration::from_millis(m.extend_ms),
                };
                self.group_settle(cx, named!(m), m.offset, m.request_id, op)
            }
            Message::GroupDeadLetter(m) => {
                self.group_settle(cx, named!(m), m.offset, m.request_id, SettleOp::DeadLetter)
            }
            Message::GroupDiscard(m) => {
                self.group_settle(cx, named!(m), m.offset, m.request_id, SettleOp::Discard)
            }
            Message::GroupRedrive(m) => {
                self.group_settle(cx, named!(m), m.offset, m.request_id, SettleOp::Redrive)
            }
            Message::GroupDeadLetters(m) => {
                let n = named!(m);
                let Some(key) = self.group_scope(&n, Action::GroupConsume) else {
                    return;
                };
                match cx.core.broker.group_dead_letters(cx.now, n.addr(&key)) {
                    Ok(offsets) => {
                        self.push_message(&Message::GroupDeadLetterList(GroupDeadLetterList {
                            offsets,
                            request_id: m.request_id,
                        }))
                    }
                    Err(e) => self.group_refused(e),
                }
            }
            Message::GroupSeek(m) => {
                let n = named!(m);
                let Some(key) = self.group_scope(&n, Action::GroupManage) else {
                    return;
                };
                let addr = n.addr(&key);
                let to = match m.start {
                    Start::Earliest => SeekTo::Earliest,
                    Start::Latest => SeekTo::Latest,
                    Start::Offset(o) => SeekTo::Offset(o),
                };
                let if_new = m.if_new.unwrap_or(false);
                match cx.core.broker.group_seek(cx.now, addr, to, if_new) {
                    Ok((offset, moved, durable_at)) => {
                        let frame = encode_message(&Message::GroupPosition(GroupPosition {
                            offset,
                            moved,
                            request_id: m.request_id,
                        }));
                        self.push_group_answer(cx, frame, durable_at);
                    }
                    Err(e) => self.group_refused(e),
                }
            }
            Message::GroupDescribe(m) => {
                let n = named!(m);
                let Some(key) = self.group_scope(&n, Action::GroupConsume) else {
                    return;
                };
                match cx.core.broker.group_describe(cx.now, n.addr(&key)) {
                    Ok(d) => self.push_message(&Message::GroupInfo(GroupInfo {
                        committed: d.committed,
                        tail: d.tail,
                        in_flight: d.in_flight,
                        owed: d.owed,
                        dead_letters: d.dead_letters,
                        request_id: m.request_id,
                    })),
                    Err(e) => self.group_refused(e),
                }
            }
            Message::GroupDelete(m) => {
                let n = named!(m);
                let Some(key) = self.group_scope(&n, Action::GroupManage) else {
                    return;
                };
                match cx.core.broker.group_delete(cx.now, n.addr(&key)) {
                    Ok((existed, durable_at)) => {
                        let frame = encode_message(&Message::GroupDeleted(GroupDeleted {
                            existed,
                            request_id: m.request_id,
                        }));
                        self.push_group_answer(cx, frame, durable_at);
                    }
                    Err(e) => self.group_refused(e),
                }
            }
            _ => {}
        }
    }

    fn on_group_poll(&mut self, p: felix_proto::message::GroupPoll, cx: &mut SessionCx<'_>) {
        let n = named!(p);
        let Some(key) = self.group_scope(&n, Action::GroupConsume) else {
            return;
        };
        let member = match &p.consumer {
            Some(name) if name.is_empty() || name.len() > MAX_CONSUMER_BYTES => {
                return self.push_error(
                    ErrorCode::InvalidRequest,
                    format!("a consumer name is 1 to {MAX_CONSUMER_BYTES} bytes"),
                );
            }
            Some(name) => {
                let subject = self
                    .auth
                    .as_ref()
                    .expect("authenticated")
                    .identity
                    .subject
                    .clone();
                Some((subject, name.clone()))
            }
            None => None,
        };
        let conn = *cx
            .conn
            .group_serial
            .get_or_insert_with(|| cx.core.next_subscription_id());
        let req = PollRequest {
            max_records: p.max_records,
            wait: Duration::from_millis(p.wait_ms.unwrap_or(0)),
            visibility: millis(p.visibility_ms),
            reclaim: p.reclaim.unwrap_or(false) && member.is_some(),
            member,
            conn,
        };
        match cx.core.broker.group_poll(cx.now, n.addr(&key), req) {
            Ok(waiter) => {
                cx.core.wait_group(waiter, cx.ch, cx.stream);
                self.held.push_back(Held::Group(Box::new(HeldGroup {
                    waiter,
                    request_id: p.request_id,
                    result: None,
                })));
            }
            Err(e) => self.group_refused(e),
        }
    }

    fn group_settle(
        &mut self,
        cx: &mut SessionCx<'_>,
        n: Named<'_>,
        offset: u64,
        request_id: u64,
        op: SettleOp,
    ) {
        let action = match op {
            SettleOp::Discard | SettleOp::Redrive => Action::GroupManage,
            _ => Action::GroupConsume,
        };
        let Some(key) = self.group_scope(&n, action) else {
            return;
        };
        match cx
            .core
            .broker
            .group_settle(cx.now, n.addr(&key), offset, op)
        {
            Ok(settled) => {
                let frame = match op {
                    SettleOp::Extend { .. } => {
                        encode_message(&Message::GroupExtended(GroupExtended {
                            visible_ms: settled.granted.as_millis() as u64,
                            request_id,
                        }))
                    }
                    _ => encode_message(&Message::CacheOk(CacheOk { request_id })),
                };
                self.push_group_answer(cx, frame, settled.durable_at);
            }
            Err(e) if e.code == ErrorCode::StaleClaim => {
                // A named delivery that no longer stands will not come back by retrying.
                let named = matches!(
                    op,
                    SettleOp::Extend { .. }
                        | SettleOp::Nack {
                            attempts: Some(_),
                            ..
                        }
                );
                if named && self.negotiated().error_codes() {
                    let mut msg = ErrorMessage::coded(e.code, e.message);
                    msg.retry = Some(RetryClass::Fatal);
                    self.push_message(&Message::Error(msg));
                } else {
                    self.push_broker_error(e);
                }
            }
            Err(e) => self.group_refused(e),
        }
    }

    /// Answers now, or once the group log has the write it made.
    fn push_group_answer(
        &mut self,
        cx: &mut SessionCx<'_>,
        frame: Bytes,
        durable_at: Option<(felix_storage::ops::LogId, u64)>,
    ) {
        match durable_at {
            Some((log, end)) => self.push_after_durable(cx, log, end, frame, FailAnswer::Error),
            None => self.push_frame(frame),
        }
    }

    fn group_refused(&mut self, e: BrokerError) {
        if self.stalls(&e) {
            return;
        }
        self.push_broker_error(e);
    }

    /// Checks a group permission over `group:{tenant}/{ns}/{stream}/{group}`; on refusal
    /// answers and returns `None`.
    fn group_scope(&mut self, n: &Named<'_>, action: Action) -> Option<StreamKey> {
        let stream = stream_object(n.tenant, n.namespace, n.stream);
        let group_ok = (1..=NAME_MAX_BYTES).contains(&n.group.len()) && name_charset_ok(n.group);
        let (Some(stream), true) = (stream, group_ok) else {
            self.push_error(
                ErrorCode::InvalidRequest,
                "tenant, namespace, stream and group names are 1 to 255 bytes of A-Z a-z 0-9 . _ -"
                    .into(),
            );
            return None;
        };
        let object = format!("group:{}/{}", &stream["stream:".len()..], n.group);
        let allowed = self
            .auth
            .as_ref()
            .expect("authenticated")
            .identity
            .allows(action, &object);
        if !allowed {
            self.push_error(
                ErrorCode::Forbidden,
                format!("{action} is not granted on {object}"),
            );
            return None;
        }
        Some(StreamKey::new(n.tenant, n.namespace, n.stream))
    }

    /// The answer a held poll waited for has arrived.
    pub(crate) fn fill_group(
        &mut self,
        waiter: u64,
        result: Result<Vec<PolledRecord>, BrokerError>,
    ) {
        for held in &mut self.held {
            if let Held::Group(g) = held {
                if g.waiter == waiter && g.result.is_none() {
                    g.result = Some(result);
                    return;
                }
            }
        }
    }

    /// Encodes a filled poll answer with the fields this stream negotiated.
    pub(super) fn group_records_frame(&self, g: HeldGroup) -> Bytes {
        let features = self.negotiated().features;
        let skipped = features.contains(Features::GROUP_SKIPPED);
        let publisher = features.contains(Features::GROUP_PUBLISHER);
        let times = features.contains(Features::RECORD_TIMESTAMPS);
        match g.result.expect("filled") {
            Ok(records) => encode_message(&Message::GroupRecords(GroupRecords {
                records: records
                    .into_iter()
                    .map(|r| GroupRecord {
                        offset: r.offset,
                        payload: r.payload,
                        attempts: Some(u64::from(r.attempts)),
                        skipped_before: (skipped && r.skipped_before > 0)
                            .then_some(r.skipped_before),
                        publisher: r
                            .publisher
                            .filter(|_| publisher)
                            .map(|p| String::from_utf8_lossy(&p).into_owned()),
                        timestamp_micros: times.then_some(r.time_us),
                    })
                    .collect(),
                request_id: g.request_id,
            })),
            Err(e) => self.error_frame(e.code, e.message),
        }
    }
}
