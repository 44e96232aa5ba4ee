//! Stream calls beyond publish and subscribe: idempotent producers, `publish_if`, atomic
//! commits, bounded reads and routing questions. Each call opens its own authenticated
//! stream (as the reference client does for commits and routing requests), sends one
//! request and reads its one answer.

use bytes::Bytes;
use felix_proto::binary::{
    encode_publish_batch_frame, AckMode as BinaryAckMode, AckedPrefix, ProducerSeq,
    PublishBatchHeader,
};
use felix_proto::message::{self, Message, PublishRefusalReason, StateChange};

use crate::client::{Client, RawStream};
use crate::core::codec::{decode_json, frame_bytes};
use crate::error::ClientError;

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

/// A page of records read by [`Client::stream_read`].
pub type StreamPage = message::StreamRecords;

/// A state key as [`Client::state_get`] read it.
pub type StateValue = message::StateValue;

const REQUEST_ID: u64 = 1;

fn refused(msg: Message, expected: &str) -> ClientError {
    match msg {
        Message::Error(e) => ClientError::server(e.code, e.retry, e.message),
        Message::PublishError(e) => ClientError::server(e.code, e.retry, e.message),
        Message::Unsupported(u) => ClientError::Unsupported {
            request_type: u.request_type,
        },
        Message::SubscribeCursorError(c) => ClientError::Server {
            code: None,
            retry: None,
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

fn guarded_answer(msg: Message) -> Result<Guarded, ClientError> {
    match msg {
        Message::PublishOk(ok) => Ok(Guarded::Written(ok.offset)),
        Message::CommitOk(ok) => Ok(Guarded::Written(Some(ok.offset))),
        Message::PublishRefused(r) => Ok(Guarded::Refused(r.reason)),
        other => Err(refused(other, "publish_ok or publish_refused")),
    }
}

impl Client {
    /// Sends one request frame on a new stream and reads the answer.
    async fn one_shot(&self, frame: Bytes) -> Result<Message, ClientError> {
        let mut stream: RawStream = self.open_raw_stream(true).await?;
        stream.send(frame).await?;
        let answer = stream
            .recv_frame()
            .await?
            .ok_or_else(|| ClientError::Connection("the broker ended the stream".into()))?;
        stream.finish();
        decode_json(&answer)
    }

    /// A new idempotent producer id from the broker (`producer_init`).
    pub async fn producer_init(&self) -> Result<u64, ClientError> {
        let msg = Message::ProducerInit(message::ProducerInit {
            request_id: REQUEST_ID,
        });
        match self.one_shot(frame_bytes(&msg)).await? {
            Message::ProducerInitOk(ok) => Ok(ok.producer_id),
            other => Err(refused(other, "producer_init_ok")),
        }
    }

    /// Publishes a batch once however many times it is sent: re-send a batch whose answer
    /// was lost under the same sequence, and it is answered with the first copy's offset.
    pub async fn publish_idempotent(
        &self,
        batch: IdempotentBatch<'_>,
        encoding: IdempotentEncoding,
    ) -> Result<Guarded, ClientError> {
        let tenant = self.tenant();
        let frame = match encoding {
            IdempotentEncoding::Json => {
                frame_bytes(&Message::PublishIdempotent(message::PublishIdempotent {
                    tenant_id: tenant.to_owned(),
                    namespace: batch.namespace.to_owned(),
                    stream: batch.stream.to_owned(),
                    payloads: batch.payloads,
                    key: batch.key,
                    shard: None,
                    request_id: REQUEST_ID,
                    producer_id: batch.producer_id,
                    sequence: batch.sequence,
                }))
            }
            IdempotentEncoding::Binary => {
                let header = PublishBatchHeader {
                    acked: Some(AckedPrefix {
                        request_id: REQUEST_ID,
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
        };
        guarded_answer(self.one_shot(frame).await?)
    }

    /// Appends `payloads` only if they would start at exactly `expected_offset` on the shard
    /// `key` routes to; otherwise refused with `offset_mismatch` and the shard's tail.
    pub async fn publish_if(
        &self,
        namespace: &str,
        stream: &str,
        key: Option<Bytes>,
        expected_offset: u64,
        payloads: Vec<Bytes>,
    ) -> Result<Guarded, ClientError> {
        let msg = Message::PublishIf(message::PublishIf {
            tenant_id: self.tenant().to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
            payloads,
            key,
            shard: None,
            expected_offset,
            request_id: REQUEST_ID,
        });
        guarded_answer(self.one_shot(frame_bytes(&msg)).await?)
    }

    /// Appends `event` and applies `changes` to the state of the shard `entity_key` routes
    /// to, as one record; with `expected_offset`, only if the shard's tail is there.
    pub async fn commit(
        &self,
        namespace: &str,
        stream: &str,
        entity_key: Bytes,
        event: Bytes,
        changes: Vec<StateChange>,
        expected_offset: Option<u64>,
    ) -> Result<Guarded, ClientError> {
        let msg = Message::Commit(message::Commit {
            tenant_id: self.tenant().to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
            entity_key,
            shard: None,
            event,
            changes,
            request_id: REQUEST_ID,
            expected_offset,
        });
        guarded_answer(self.one_shot(frame_bytes(&msg)).await?)
    }

    /// `key` in the state of the shard `entity_key` routes to.
    pub async fn state_get(
        &self,
        namespace: &str,
        stream: &str,
        entity_key: Bytes,
        key: &str,
    ) -> Result<StateValue, ClientError> {
        let msg = Message::StateGet(message::StateGet {
            tenant_id: self.tenant().to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
            entity_key,
            shard: None,
            key: key.to_owned(),
            request_id: REQUEST_ID,
        });
        match self.one_shot(frame_bytes(&msg)).await? {
            Message::StateValue(v) => Ok(v),
            other => Err(refused(other, "state_value")),
        }
    }

    /// One page of a durable shard's records from `from`, stopping before `end`; read on
    /// from the answer's `next_offset`.
    pub async fn stream_read(
        &self,
        namespace: &str,
        stream: &str,
        shard: u32,
        from: u64,
        end: Option<u64>,
        max_records: Option<u32>,
    ) -> Result<StreamPage, ClientError> {
        let msg = Message::StreamRead(message::StreamRead {
            tenant_id: self.tenant().to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
            shard: shard.into(),
            from,
            end,
            max_records: max_records.map(u64::from),
            max_bytes: None,
            request_id: REQUEST_ID,
        });
        match self.one_shot(frame_bytes(&msg)).await? {
            Message::StreamRecords(page) => Ok(page),
            other => Err(refused(other, "stream_records")),
        }
    }

    /// The first offset on a durable shard appended at or after `at_micros` (Unix µs);
    /// `None` when no record is that recent.
    pub async fn offset_for_time(
        &self,
        namespace: &str,
        stream: &str,
        shard: u32,
        at_micros: u64,
    ) -> Result<Option<u64>, ClientError> {
        let msg = Message::OffsetForTime(message::OffsetForTime {
            tenant_id: self.tenant().to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
            shard: shard.into(),
            at_micros,
            request_id: REQUEST_ID,
        });
        match self.one_shot(frame_bytes(&msg)).await? {
            Message::OffsetValue(v) => Ok(v.offset),
            other => Err(refused(other, "offset_value")),
        }
    }

    /// The brokers this one says a client may connect to (`topology`).
    pub async fn topology(&self) -> Result<message::TopologyView, ClientError> {
        match self.one_shot(frame_bytes(&Message::Topology)).await? {
            Message::TopologyView(v) => Ok(v),
            other => Err(refused(other, "topology_view")),
        }
    }

    /// How many shards the broker says a stream has (`stream_shards`).
    pub async fn stream_shards(&self, namespace: &str, stream: &str) -> Result<u64, ClientError> {
        let msg = Message::StreamShards(message::StreamShards {
            tenant_id: self.tenant().to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
            request_id: REQUEST_ID,
        });
        match self.one_shot(frame_bytes(&msg)).await? {
            Message::StreamShardsView(v) => Ok(v.shards),
            other => Err(refused(other, "stream_shards_view")),
        }
    }
}
