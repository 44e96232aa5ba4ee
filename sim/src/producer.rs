//! A simulated idempotent producer: one per worker, kept across its client's connections.
//! It numbers its batches on each shard from 0, sends one at a time (JSON `publish_idempotent` or the
//! binary 0x0100 frame, drawn per send, both built by the client core) on a stream of its own,
//! each under the next request id of that stream, and re-sends the same batch
//! under the same sequence after a lost connection or an error until it is answered
//! `publish_ok`. The broker must land each batch once (`invariants/idempotent_once.rs`).
//!
//! The id is drawn by the client: the broker takes any id whose first batch is sequence 0,
//! so no `producer_init` round trip is needed (the integration tests cover that call).

use std::collections::BTreeMap;

use bytes::Bytes;
use felix_client::core::{
    idempotent_frame, Guarded, GuardedReply, IdempotentBatch, IdempotentEncoding,
};
use felix_engine::RoutingMapping;
use felix_proto::message;
use felix_proto::routing::shard_for_key;

use crate::client::{NAMESPACE, STREAM, TENANT};
use crate::rng::SimRng;

/// The batch a producer owes the broker until it is answered `publish_ok`.
#[derive(Debug, Clone)]
pub(crate) struct Batch {
    pub(crate) sequence: u64,
    pub(crate) shard: u32,
    key: Option<Bytes>,
    pub(crate) payloads: Vec<Bytes>,
}

#[derive(Debug)]
pub(crate) struct Producer {
    id: u64,
    /// Written at the start of each payload: `<publisher>:<n>|`, one name for the producer's
    /// whole life, so a batch appended twice shows up as a repeated number.
    publisher: String,
    /// Sequences count the producer's batches per shard, from 0.
    next_sequence: BTreeMap<u32, u64>,
    next_payload: u64,
    pending: Option<Batch>,
    /// The request id of the send waiting for its answer, on the current connection.
    in_flight: Option<u64>,
    next_request: u64,
    pub(crate) sends: u64,
    pub(crate) resends: u64,
}

/// What an answer meant.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Written (now or by an earlier send): the batch and its first offset, if any.
    Written(Batch, Option<u64>),
    /// Refused for a reason a correct producer never meets.
    Refused(Batch, message::PublishRefusalReason),
    /// A transient error: the batch is sent again later.
    Retry(String),
    /// Not an answer to the send in flight.
    Stray,
}

impl Producer {
    pub(crate) fn new(client: usize, rng: &mut SimRng) -> Producer {
        Producer {
            id: rng.next_u64(),
            publisher: format!("c{client}i"),
            next_sequence: BTreeMap::new(),
            next_payload: 0,
            pending: None,
            in_flight: None,
            next_request: 1,
            sends: 0,
            resends: 0,
        }
    }

    /// Whether `publisher` (from a payload) is an idempotent producer's.
    pub(crate) fn is_idempotent_publisher(publisher: &str) -> bool {
        publisher.ends_with('i')
    }

    /// The frame to send now, with its request id: the pending batch again, or a new one.
    /// `None` while a send waits for its answer.
    pub(crate) fn next_send(
        &mut self,
        rng: &mut SimRng,
        shards: u32,
    ) -> Option<(Bytes, u64, &Batch)> {
        if self.in_flight.is_some() {
            return None;
        }
        if self.pending.is_some() {
            self.resends += 1;
        } else {
            let key = rng
                .chance(0.5)
                .then(|| Bytes::from(format!("key{}", rng.below(16))));
            let n = 1 + rng.below(3) as usize;
            let pad = rng.below(200) as usize;
            let payloads = (0..n)
                .map(|_| {
                    self.next_payload += 1;
                    let mut p = format!("{}:{}|", self.publisher, self.next_payload).into_bytes();
                    p.resize(p.len() + pad, b'.');
                    Bytes::from(p)
                })
                .collect();
            let shard = shard_for_key(key.as_deref(), shards, RoutingMapping::Modulo);
            self.pending = Some(Batch {
                sequence: self.next_sequence.get(&shard).copied().unwrap_or(0),
                shard,
                key,
                payloads,
            });
        }
        self.sends += 1;
        let request_id = self.next_request;
        self.next_request += 1;
        self.in_flight = Some(request_id);
        let batch = self.pending.as_ref().expect("set above");
        let encoding = if rng.chance(0.5) {
            IdempotentEncoding::Binary
        } else {
            IdempotentEncoding::Json
        };
        let frame = idempotent_frame(
            TENANT,
            IdempotentBatch {
                namespace: NAMESPACE,
                stream: STREAM,
                key: batch.key.clone(),
                producer_id: self.id,
                sequence: batch.sequence,
                payloads: batch.payloads.clone(),
            },
            encoding,
            request_id,
        );
        Some((frame, request_id, batch))
    }

    /// The request id of the send waiting for its answer.
    pub(crate) fn in_flight(&self) -> Option<u64> {
        self.in_flight
    }

    /// The connection went away: the send in flight may or may not have landed, and the
    /// batch is sent again, unchanged, on the next one. With the `resend_as_new` canary it
    /// goes again under the next sequence, as a producer that forgot the rule would.
    pub(crate) fn connection_lost(&mut self, resend_as_new: bool) {
        if self.in_flight.take().is_some() && resend_as_new {
            if let Some(batch) = &mut self.pending {
                batch.sequence += 1;
            }
        }
    }

    /// An answer on the producer's stream.
    pub(crate) fn on_answer(&mut self, reply: GuardedReply) -> Outcome {
        let Some(request_id) = reply.request_id else {
            // One send at a time: an uncorrelated refusal can only be about it.
            self.in_flight = None;
            return Outcome::Retry(match reply.result {
                Err(e) => e.to_string(),
                Ok(g) => format!("{g:?} naming no request"),
            });
        };
        if self.in_flight != Some(request_id) {
            return Outcome::Stray;
        }
        self.in_flight = None;
        match reply.result {
            Ok(Guarded::Written(offset)) => {
                let batch = self.pending.take().expect("a send in flight has a batch");
                self.next_sequence.insert(batch.shard, batch.sequence + 1);
                Outcome::Written(batch, offset)
            }
            Ok(Guarded::Refused(reason)) => {
                let batch = self.pending.take().expect("a send in flight has a batch");
                Outcome::Refused(batch, reason)
            }
            Err(e) => Outcome::Retry(e.to_string()),
        }
    }
}
