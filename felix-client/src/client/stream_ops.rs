//! Stream calls beyond publish and subscribe over the network: each call opens its own
//! authenticated stream (as the reference client does for commits and routing requests),
//! sends one request and reads its one answer. The frames are `core::stream_ops`.

use bytes::Bytes;
use felix_proto::message::{self, StateChange};
use felix_proto::Frame;

use super::{Client, RawStream};
use crate::core::cluster::Resend;
use crate::core::stream_ops::{
    commit_frame, idempotent_frame, offset_for_time_frame, producer_init_frame, publish_if_frame,
    read_guarded, read_offset_value, read_producer_init, read_state_value, read_stream_records,
    read_stream_shards, read_topology, require_atomic_commit, state_get_frame, stream_read_frame,
    stream_shards_frame, topology_frame, Guarded, IdempotentBatch, IdempotentEncoding, StateValue,
    StreamPage, REQUEST_ID,
};
use crate::error::ClientError;

impl Client {
    /// Sends one request frame on a new stream and returns the answer's frame.
    pub(crate) async fn one_shot(&self, frame: Bytes) -> Result<Frame, ClientError> {
        self.one_shot_sent(frame).await.map_err(|(e, _)| e)
    }

    /// [`Client::one_shot`], its error saying whether the request was written (a stream
    /// that could not be opened and authenticated sent nothing).
    pub(crate) async fn one_shot_sent(&self, frame: Bytes) -> Result<Frame, (ClientError, bool)> {
        let mut stream: RawStream = self.open_raw_stream(true).await.map_err(|e| (e, false))?;
        stream.send(frame).await.map_err(|e| (e, true))?;
        let answer = stream
            .recv_frame()
            .await
            .map_err(|e| (e, true))?
            .ok_or_else(|| {
                (
                    ClientError::Connection("the broker ended the stream".into()),
                    true,
                )
            })?;
        stream.finish();
        Ok(answer)
    }

    /// One request the broker answers once, read by `read`. In a cluster: at the entry
    /// broker, a `not_leader` followed to the named owner with the same request, and a
    /// failed attempt retried (backoff, attempts, deadline) unless terminal; `resend` says
    /// whether it is sent again once its outcome is unknown. On one broker: sent once.
    async fn one_request<T>(
        &self,
        frame: Bytes,
        resend: Resend,
        read: impl Fn(&Frame) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        match &self.cluster {
            Some(cluster) => cluster.one_shot_retried(frame, resend, read).await,
            None => read(&self.one_shot(frame).await?),
        }
    }

    /// A new idempotent producer id from the broker (`producer_init`).
    pub async fn producer_init(&self) -> Result<u64, ClientError> {
        self.one_request(producer_init_frame(), Resend::Always, read_producer_init)
            .await
    }

    /// Publishes a batch once however many times it is sent: re-send a batch whose answer
    /// was lost under the same sequence, and it is answered with the first copy's offset.
    pub async fn publish_idempotent(
        &self,
        batch: IdempotentBatch<'_>,
        encoding: IdempotentEncoding,
    ) -> Result<Guarded, ClientError> {
        let frame = idempotent_frame(self.tenant(), batch, encoding, REQUEST_ID);
        // Re-sent under the same sequence, it is answered with the first copy's offset.
        self.one_request(frame, Resend::Always, read_guarded).await
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
        let frame = publish_if_frame(
            self.tenant(),
            namespace,
            stream,
            key,
            expected_offset,
            payloads,
        );
        // Not re-sent once unknown: a copy of an applied one is refused offset_mismatch.
        self.one_request(frame, Resend::Never, read_guarded).await
    }

    /// Appends `event` and applies `changes` to the state of the shard `entity_key` routes
    /// to, as one record; with `expected_offset`, only if the shard's tail is there.
    /// A commit given as a list of operations is checked into these arguments, or refused
    /// unsent, by [`crate::CommitPlan::from_ops`]. Refused unsent too when the broker did not
    /// advertise `FEATURE_ATOMIC_COMMIT`.
    pub async fn commit(
        &self,
        namespace: &str,
        stream: &str,
        entity_key: Bytes,
        event: Bytes,
        changes: Vec<StateChange>,
        expected_offset: Option<u64>,
    ) -> Result<Guarded, ClientError> {
        require_atomic_commit(self.capabilities())?;
        let frame = commit_frame(
            self.tenant(),
            namespace,
            stream,
            entity_key,
            event,
            changes,
            expected_offset,
        );
        self.one_request(frame, Resend::Never, read_guarded).await
    }

    /// `key` in the state of the shard `entity_key` routes to.
    pub async fn state_get(
        &self,
        namespace: &str,
        stream: &str,
        entity_key: Bytes,
        key: &str,
    ) -> Result<StateValue, ClientError> {
        require_atomic_commit(self.capabilities())?;
        let frame = state_get_frame(self.tenant(), namespace, stream, entity_key, key);
        self.one_request(frame, Resend::Always, read_state_value)
            .await
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
        let frame = stream_read_frame(
            self.tenant(),
            namespace,
            stream,
            shard,
            from,
            end,
            max_records,
        );
        self.one_request(frame, Resend::Always, read_stream_records)
            .await
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
        let frame = offset_for_time_frame(self.tenant(), namespace, stream, shard, at_micros);
        self.one_request(frame, Resend::Always, read_offset_value)
            .await
    }

    /// The brokers this one says a client may connect to (`topology`).
    pub async fn topology(&self) -> Result<message::TopologyView, ClientError> {
        self.one_request(topology_frame(), Resend::Always, read_topology)
            .await
    }

    /// How many shards the broker says a stream has (`stream_shards`).
    pub async fn stream_shards(&self, namespace: &str, stream: &str) -> Result<u64, ClientError> {
        let frame = stream_shards_frame(self.tenant(), namespace, stream);
        self.one_request(frame, Resend::Always, read_stream_shards)
            .await
    }
}
