//! Stream calls beyond publish and subscribe: idempotent producers, `publish_if`, atomic
//! commits, bounded reads and routing questions. Each is one request (request id 1, as the
//! reference client sends them, one call per stream) and one JSON answer; the builders
//! here make the request and the readers read the answer. An idempotent batch takes its
//! request id from the caller, for a producer that keeps one stream for all its sends.

use bytes::Bytes;
use felix_proto::binary::{
    encode_publish_batch_frame, AckMode as BinaryAckMode, AckedPrefix, ProducerSeq,
    PublishBatchHeader,
};
use felix_proto::message::{self, Message, PublishRefusalReason, StateChange};
use felix_proto::Frame;

use super::codec::{decode_json, frame_bytes};
use super::Capabilities;
use crate::error::ClientError;

/// Commits and state reads go only to a broker that advertised `FEATURE_ATOMIC_COMMIT`; to
/// any other the call is refused here, unsent.
pub fn require_atomic_commit(caps: &Capabilities) -> Result<(), ClientError> {
    if caps.broker_has(felix_proto::Features::ATOMIC_COMMIT) {
        Ok(())
    } else {
        Err(ClientError::Usage(
            "the broker did not advertise atomic commits (FEATURE_ATOMIC_COMMIT)".into(),
        ))
    }
}

/// How a guarded publish (`publish_idempotent`, `publish_if`) or a conditional commit ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guarded {
    /// Written, or already written by an earlier send of the same batch: the batch's first
    /// offset (absent on an in-memory stream).
    Written(Option<u64>),
    /// Nothing was written, for this reason.
    Refused(PublishRefusalReason),
}

/// Which encoding an idempotent batch travels in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdempotentEncoding {
    /// JSON `publish_idempotent`.
    Json,
    /// The binary publish frame with flag 0x0100.
    Binary,
}

/// One idempotent batch: the producer, its sequence on the shard, and the records.
#[derive(Debug, Clone)]
pub struct IdempotentBatch<'a> {
    pub namespace: &'a str,
    pub stream: &'a str,
    /// The routing key (shard 0 without one).
    pub key: Option<Bytes>,
    pub producer_id: u64,
    pub sequence: u64,
    pub payloads: Vec<Bytes>,
}

/// A page of records read by `stream_read`.
pub type StreamPage = message::StreamRecords;

/// A state key as `state_get` read it.
pub type StateValue = message::StateValue;

/// The id a one-call stream's request carries.
pub const REQUEST_ID: u64 = 1;

/// `producer_init`: asks for a new idempotent producer id.
pub fn producer_init_frame() -> Bytes {
    frame_bytes(&Message::ProducerInit(message::ProducerInit {
        request_id: REQUEST_ID,
    }))
}

/// An idempotent batch in `encoding`, under `request_id` (its answer names it).
pub fn idempotent_frame(
    tenant: &str,
    batch: IdempotentBatch<'_>,
    encoding: IdempotentEncoding,
    request_id: u64,
) -> Bytes {
    match encoding {
        IdempotentEncoding::Json => {
            frame_bytes(&Message::PublishIdempotent(message::PublishIdempotent {
                tenant_id: tenant.to_owned(),
                namespace: batch.namespace.to_owned(),
                stream: batch.stream.to_owned(),
                payloads: batch.payloads,
                key: batch.key,
                shard: None,
                request_id,
                producer_id: batch.producer_id,
                sequence: batch.sequence,
            }))
        }
        IdempotentEncoding::Binary => {
            let header = PublishBatchHeader {
                acked: Some(AckedPrefix {
                    request_id,
                    ack_mode: BinaryAckMode::PerBatch,
                }),
                idempotent: Some(ProducerSeq {
                    producer_id: batch.producer_id,
                    sequence: batch.sequence,
                }),
                key: batch.key.as_deref(),
                tenant_id: tenant,
                namespace: batch.namespace,
                stream: batch.stream,
            };
            encode_publish_batch_frame(&header, &batch.payloads)
        }
    }
}

/// `publish_if`: `payloads` only if they would start at exactly `expected_offset`.
pub fn publish_if_frame(
    tenant: &str,
    namespace: &str,
    stream: &str,
    key: Option<Bytes>,
    expected_offset: u64,
    payloads: Vec<Bytes>,
) -> Bytes {
    frame_bytes(&Message::PublishIf(message::PublishIf {
        tenant_id: tenant.to_owned(),
        namespace: namespace.to_owned(),
        stream: stream.to_owned(),
        payloads,
        key,
        shard: None,
        expected_offset,
        request_id: REQUEST_ID,
    }))
}

/// `commit`: `event` and `changes` to the state of the shard `entity_key` routes to, as
/// one record; with `expected_offset`, only if the shard's tail is there.
pub fn commit_frame(
    tenant: &str,
    namespace: &str,
    stream: &str,
    entity_key: Bytes,
    event: Bytes,
    changes: Vec<StateChange>,
    expected_offset: Option<u64>,
) -> Bytes {
    frame_bytes(&Message::Commit(message::Commit {
        tenant_id: tenant.to_owned(),
        namespace: namespace.to_owned(),
        stream: stream.to_owned(),
        entity_key,
        shard: None,
        event,
        changes,
        request_id: REQUEST_ID,
        expected_offset,
    }))
}

/// `state_get`: `key` in the state of the shard `entity_key` routes to.
pub fn state_get_frame(
    tenant: &str,
    namespace: &str,
    stream: &str,
    entity_key: Bytes,
    key: &str,
) -> Bytes {
    frame_bytes(&Message::StateGet(message::StateGet {
        tenant_id: tenant.to_owned(),
        namespace: namespace.to_owned(),
        stream: stream.to_owned(),
        entity_key,
        shard: None,
        key: key.to_owned(),
        request_id: REQUEST_ID,
    }))
}

/// `stream_read`: one page of a durable shard's records from `from`, stopping before `end`.
pub fn stream_read_frame(
    tenant: &str,
    namespace: &str,
    stream: &str,
    shard: u32,
    from: u64,
    end: Option<u64>,
    max_records: Option<u32>,
) -> Bytes {
    frame_bytes(&Message::StreamRead(message::StreamRead {
        tenant_id: tenant.to_owned(),
        namespace: namespace.to_owned(),
        stream: stream.to_owned(),
        shard: shard.into(),
        from,
        end,
        max_records: max_records.map(u64::from),
        max_bytes: None,
        request_id: REQUEST_ID,
    }))
}

/// `offset_for_time`: the first offset on a durable shard appended at or after `at_micros`.
pub fn offset_for_time_frame(
    tenant: &str,
    namespace: &str,
    stream: &str,
    shard: u32,
    at_micros: u64,
) -> Bytes {
    frame_bytes(&Message::OffsetForTime(message::OffsetForTime {
        tenant_id: tenant.to_owned(),
        namespace: namespace.to_owned(),
        stream: stream.to_owned(),
        shard: shard.into(),
        at_micros,
        request_id: REQUEST_ID,
    }))
}

/// `topology`: the brokers this one says a client may connect to.
pub fn topology_frame() -> Bytes {
    frame_bytes(&Message::Topology)
}

/// `stream_shards`: how many shards the broker says a stream has.
pub fn stream_shards_frame(tenant: &str, namespace: &str, stream: &str) -> Bytes {
    frame_bytes(&Message::StreamShards(message::StreamShards {
        tenant_id: tenant.to_owned(),
        namespace: namespace.to_owned(),
        stream: stream.to_owned(),
        request_id: REQUEST_ID,
    }))
}

/// `shard_owners`: which broker owns each shard of a stream or cache.
pub fn shard_owners_frame(
    tenant: &str,
    namespace: &str,
    name: &str,
    kind: message::ShardKind,
) -> Bytes {
    frame_bytes(&Message::ShardOwners(message::ShardOwners {
        tenant_id: tenant.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        kind,
        request_id: REQUEST_ID,
    }))
}

/// The answer to `shard_owners`.
pub fn read_shard_owners(frame: &Frame) -> Result<message::ShardOwnersView, ClientError> {
    match decode_json(frame)? {
        Message::ShardOwnersView(v) => Ok(v),
        other => Err(refused(other, "shard_owners_view")),
    }
}

fn refused(msg: Message, expected: &str) -> ClientError {
    match msg {
        Message::Error(e) => ClientError::server(e.code, e.retry, e.message),
        Message::PublishError(e) => ClientError::server(e.code, e.retry, e.message),
        // Routing, not a refusal: the front end follows it (`one_shot_retried`).
        Message::NotLeader(n) => ClientError::NotLeader {
            node_id: n.node_id,
            addr: n.addr,
            generation: n.generation,
        },
        Message::Unsupported(u) => ClientError::Unsupported {
            request_type: u.request_type,
        },
        // As on a subscription: past retention is final, ahead of the tail is not (a broker
        // promoted a moment ago may not hold the records yet).
        Message::SubscribeCursorError(c) => ClientError::Server {
            code: Some(felix_proto::ErrorCode::InvalidRequest),
            retry: Some(match c.reason {
                message::CursorErrorReason::TooOld => felix_proto::RetryClass::Fatal,
                message::CursorErrorReason::InFuture => felix_proto::RetryClass::Retry,
            }),
            message: format!(
                "offset {} is {:?}: {} is available",
                c.requested, c.reason, c.available
            ),
        },
        other => ClientError::protocol(format!(
            "got {} where {expected} was expected",
            other.type_name()
        )),
    }
}

/// The id `producer_init` was answered with.
pub fn read_producer_init(frame: &Frame) -> Result<u64, ClientError> {
    match decode_json(frame)? {
        Message::ProducerInitOk(ok) => Ok(ok.producer_id),
        other => Err(refused(other, "producer_init_ok")),
    }
}

/// An answer to a guarded publish or commit, with the request id it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardedReply {
    /// The id the answer carries; `None` for a refusal that names no request (`error`).
    pub request_id: Option<u64>,
    /// How the request ended; `Err` for a refusal (`publish_error`, `error`, ...).
    pub result: Result<Guarded, ClientError>,
}

const GUARDED_ANSWERS: &str = "publish_ok or publish_refused";

/// Reads the answer to an idempotent publish, `publish_if` or `commit`. `Err` for a frame
/// that answers none of them.
pub fn read_guarded_reply(frame: &Frame) -> Result<GuardedReply, ClientError> {
    let (request_id, result) = match decode_json(frame)? {
        Message::PublishOk(ok) => (Some(ok.request_id), Ok(Guarded::Written(ok.offset))),
        Message::CommitOk(ok) => (Some(ok.request_id), Ok(Guarded::Written(Some(ok.offset)))),
        Message::PublishRefused(r) => (Some(r.request_id), Ok(Guarded::Refused(r.reason))),
        Message::PublishError(e) => (
            Some(e.request_id),
            Err(ClientError::server(e.code, e.retry, e.message)),
        ),
        Message::Unsupported(u) => (
            u.request_id,
            Err(refused(Message::Unsupported(u), GUARDED_ANSWERS)),
        ),
        refusal @ (Message::Error(_) | Message::SubscribeCursorError(_)) => {
            (None, Err(refused(refusal, GUARDED_ANSWERS)))
        }
        other => return Err(refused(other, GUARDED_ANSWERS)),
    };
    Ok(GuardedReply { request_id, result })
}

/// How an idempotent publish, `publish_if` or `commit` ended.
pub fn read_guarded(frame: &Frame) -> Result<Guarded, ClientError> {
    read_guarded_reply(frame)?.result
}

/// The `not_leader` a request for one entity's shard (a commit, a state read) was answered
/// with, if it was: the broker named the owner instead of forwarding, to a client that
/// offered `FEATURE_REDIRECT`. Nothing was applied, so the request may go to the owner.
pub fn read_not_leader(frame: &Frame) -> Option<message::NotLeader> {
    match decode_json(frame) {
        Ok(Message::NotLeader(n)) => Some(n),
        _ => None,
    }
}

/// The answer to `state_get`.
pub fn read_state_value(frame: &Frame) -> Result<StateValue, ClientError> {
    match decode_json(frame)? {
        Message::StateValue(v) => Ok(v),
        other => Err(refused(other, "state_value")),
    }
}

/// The page `stream_read` was answered with.
pub fn read_stream_records(frame: &Frame) -> Result<StreamPage, ClientError> {
    match decode_json(frame)? {
        Message::StreamRecords(page) => Ok(page),
        other => Err(refused(other, "stream_records")),
    }
}

/// The offset `offset_for_time` was answered with (`None`: no record that recent).
pub fn read_offset_value(frame: &Frame) -> Result<Option<u64>, ClientError> {
    match decode_json(frame)? {
        Message::OffsetValue(v) => Ok(v.offset),
        other => Err(refused(other, "offset_value")),
    }
}

/// The answer to `topology`.
pub fn read_topology(frame: &Frame) -> Result<message::TopologyView, ClientError> {
    match decode_json(frame)? {
        Message::TopologyView(v) => Ok(v),
        other => Err(refused(other, "topology_view")),
    }
}

/// The shard count `stream_shards` was answered with.
pub fn read_stream_shards(frame: &Frame) -> Result<u64, ClientError> {
    match decode_json(frame)? {
        Message::StreamShardsView(v) => Ok(v.shards),
        other => Err(refused(other, "stream_shards_view")),
    }
}

/// One operation of a commit given as a list, as the reference clients take one: a publish
/// (the commit's event) or a state change, each naming its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOp {
    Publish {
        stream: String,
        payload: Bytes,
    },
    Put {
        stream: String,
        key: String,
        value: Bytes,
    },
    Delete {
        stream: String,
        key: String,
    },
}

/// Why a list of operations is not one commit. Refused here, before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitRefused {
    /// Operation `index` names `stream`, not the first operation's: a commit is one record
    /// on one shard of one stream, so it cannot span two logs.
    NotOnOwningShard { index: usize, stream: String },
    /// A commit carries exactly one event (one record, one offset); these had `count`.
    EventCount { count: usize },
}

impl std::fmt::Display for CommitRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommitRefused::NotOnOwningShard { index, stream } => write!(
                f,
                "commit operation {index} is on stream {stream:?}, not the commit's own"
            ),
            CommitRefused::EventCount { count } => {
                write!(f, "a commit carries exactly one event, not {count}")
            }
        }
    }
}

impl std::error::Error for CommitRefused {}

/// A list of operations checked to be one commit: the arguments of `Client::commit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPlan {
    pub stream: String,
    pub event: Bytes,
    pub changes: Vec<StateChange>,
}

impl CommitPlan {
    /// Checks `ops` are one commit: every operation on the first one's stream (else the
    /// first that is not, by index), and exactly one publish among them.
    pub fn from_ops(ops: Vec<CommitOp>) -> Result<CommitPlan, CommitRefused> {
        let stream_of = |op: &CommitOp| match op {
            CommitOp::Publish { stream, .. }
            | CommitOp::Put { stream, .. }
            | CommitOp::Delete { stream, .. } => stream.clone(),
        };
        let Some(stream) = ops.first().map(stream_of) else {
            return Err(CommitRefused::EventCount { count: 0 });
        };
        if let Some((index, other)) = ops
            .iter()
            .map(stream_of)
            .enumerate()
            .find(|(_, s)| *s != stream)
        {
            return Err(CommitRefused::NotOnOwningShard {
                index,
                stream: other,
            });
        }
        let mut events = Vec::new();
        let mut changes = Vec::new();
        for op in ops {
            match op {
                CommitOp::Publish { payload, .. } => events.push(payload),
                CommitOp::Put { key, value, .. } => changes.push(StateChange::Put { key, value }),
                CommitOp::Delete { key, .. } => changes.push(StateChange::Delete { key }),
            }
        }
        if events.len() != 1 {
            return Err(CommitRefused::EventCount {
                count: events.len(),
            });
        }
        Ok(CommitPlan {
            stream,
            event: events.pop().expect("one"),
            changes,
        })
    }
}

#[cfg(test)]
mod commit_plan_tests {
    use super::*;
    use crate::core::{capabilities, Offer};
    use felix_proto::negotiate::BrokerAdvertisement;
    use felix_proto::Features;

    #[test]
    fn a_not_leader_answer_to_a_commit_is_a_redirect() {
        let not_leader = message::NotLeader {
            node_id: "n2".into(),
            addr: Some("127.0.0.1:7001".into()),
            generation: 4,
        };
        let bytes = frame_bytes(&Message::NotLeader(not_leader.clone()));
        let mut d = felix_proto::FrameDecoder::new(1 << 20);
        d.feed(&bytes);
        let frame = d.next_frame().expect("valid").expect("whole");
        assert_eq!(read_not_leader(&frame), Some(not_leader));
        assert_eq!(
            read_guarded(&frame),
            Err(ClientError::NotLeader {
                node_id: "n2".into(),
                addr: Some("127.0.0.1:7001".into()),
                generation: 4
            })
        );
        assert!(matches!(
            read_state_value(&frame),
            Err(ClientError::NotLeader { .. })
        ));
        let ok = frame_bytes(&Message::CommitOk(message::CommitOk {
            offset: 9,
            request_id: REQUEST_ID,
        }));
        d.feed(&ok);
        let frame = d.next_frame().expect("valid").expect("whole");
        assert_eq!(read_not_leader(&frame), None);
        assert_eq!(read_guarded(&frame), Ok(Guarded::Written(Some(9))));
    }

    #[test]
    fn a_commit_needs_the_broker_to_have_advertised_it() {
        let ad = |features: u64| BrokerAdvertisement {
            server_flags: 0x1FFF,
            server_features: Some(features),
            server_features_hi: None,
            publish_window: None,
        };
        let with = capabilities(&Offer::cluster(), Some(&ad(Features::ATOMIC_COMMIT.0)));
        assert_eq!(require_atomic_commit(&with), Ok(()));
        let without = capabilities(&Offer::cluster(), Some(&ad(Features::ERROR_CODES.0)));
        assert!(matches!(
            require_atomic_commit(&without),
            Err(ClientError::Usage(_))
        ));
        // Plain `ok`: nothing advertised.
        let legacy = capabilities(&Offer::cluster(), None);
        assert!(require_atomic_commit(&legacy).is_err());
    }

    fn publish(stream: &str, payload: &'static [u8]) -> CommitOp {
        CommitOp::Publish {
            stream: stream.into(),
            payload: Bytes::from_static(payload),
        }
    }

    fn put(stream: &str, key: &str) -> CommitOp {
        CommitOp::Put {
            stream: stream.into(),
            key: key.into(),
            value: Bytes::from_static(b"v"),
        }
    }

    #[test]
    fn one_event_and_its_changes_on_one_stream_is_a_commit() {
        let plan = CommitPlan::from_ops(vec![
            put("ledger", "a"),
            publish("ledger", b"ev"),
            CommitOp::Delete {
                stream: "ledger".into(),
                key: "b".into(),
            },
        ])
        .expect("one commit");
        assert_eq!(plan.stream, "ledger");
        assert_eq!(&plan.event[..], b"ev");
        assert_eq!(
            plan.changes,
            vec![
                StateChange::Put {
                    key: "a".into(),
                    value: Bytes::from_static(b"v")
                },
                StateChange::Delete { key: "b".into() }
            ]
        );
    }

    #[test]
    fn an_operation_on_another_stream_is_refused_by_its_index() {
        assert_eq!(
            CommitPlan::from_ops(vec![
                publish("ledger", b"x"),
                put("ledger", "k"),
                put("events", "k")
            ]),
            Err(CommitRefused::NotOnOwningShard {
                index: 2,
                stream: "events".into()
            })
        );
    }

    #[test]
    fn no_event_or_two_is_refused_with_the_count() {
        assert_eq!(
            CommitPlan::from_ops(vec![put("ledger", "k")]),
            Err(CommitRefused::EventCount { count: 0 })
        );
        assert_eq!(
            CommitPlan::from_ops(Vec::new()),
            Err(CommitRefused::EventCount { count: 0 })
        );
        assert_eq!(
            CommitPlan::from_ops(vec![publish("ledger", b"1"), publish("ledger", b"2")]),
            Err(CommitRefused::EventCount { count: 2 })
        );
    }
}
