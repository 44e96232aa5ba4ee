//! Consumer groups over the network: each call is one request and one answer on an
//! authenticated stream of its own, as the reference client does; finished streams go back
//! to a small pool for the next call, so a consumer in a loop does not pay an `auth` round
//! trip per call. The requests and answers are `core::groups`.

use std::sync::Mutex;
use std::time::Duration;

use felix_proto::FrameDecoder;

use super::{open_authenticated, read_frame, write_error, Client};
use crate::core::groups::{
    GroupAnswer, GroupCall, GroupInfo, GroupRecord, GroupRef, GroupReply, GroupRequest, PollOptions,
};
use crate::core::Start;
use crate::error::ClientError;

/// Idle group streams a client keeps for reuse.
const POOL_MAX: usize = 64;

/// The request id of every group call: one call per stream at a time.
const REQUEST_ID: u64 = 1;

struct GroupStream {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
}

/// Idle authenticated streams for group calls.
#[derive(Default)]
pub(crate) struct GroupStreams(Mutex<Vec<GroupStream>>);

/// One consumer group on one shard of a stream: `Client::group` makes one, and every
/// group call goes through it.
#[derive(Clone)]
pub struct Group {
    client: Client,
    namespace: String,
    stream: String,
    shard: u32,
    name: String,
}

impl Client {
    /// Sends one group request and reads its one answer.
    async fn group_call(
        &self,
        request: GroupRequest,
        wait: Duration,
    ) -> Result<GroupAnswer, ClientError> {
        // A cluster client asks its current entry broker, which forwards or names the
        // group's owner (followed); a failed attempt is retried by the core's classes.
        if let Some(cluster) = &self.cluster {
            let resend = crate::core::cluster::group_resend(request.call);
            return Box::pin(cluster.redirected(resend, |node| {
                let request = request.clone();
                Box::pin(async move { node.group_call_here(request, wait).await })
            }))
            .await;
        }
        self.group_call_here(request, wait).await
    }

    /// One group request on this broker's connection.
    async fn group_call_here(
        &self,
        request: GroupRequest,
        wait: Duration,
    ) -> Result<GroupAnswer, ClientError> {
        let inner = &self.inner;
        request.call.check(&inner.caps)?;
        let pooled = inner.group_streams.0.lock().expect("pool lock").pop();
        let mut s = match pooled {
            Some(s) => s,
            None => {
                let (send, recv, decoder, _caps) =
                    open_authenticated(&*inner.runtime, &inner.conn, &inner.config).await?;
                GroupStream {
                    send,
                    recv,
                    decoder,
                }
            }
        };
        s.send
            .write_chunk(request.frame)
            .await
            .map_err(write_error)?;
        let limit = inner.config.request_timeout + wait;
        let reply = read_frame(
            &*inner.runtime,
            &mut s.recv,
            &mut s.decoder,
            limit,
            "a group answer",
        )
        .await?
        .ok_or_else(|| ClientError::Connection("group stream ended with no answer".into()))?;
        // A stream whose answer decoded is good for the next call, whatever it said.
        let reply = GroupReply::decode(&reply)?;
        let mut pool = inner.group_streams.0.lock().expect("pool lock");
        if pool.len() < POOL_MAX {
            pool.push(s);
        }
        drop(pool);
        reply.answer(request.call).map(|(_, answer)| answer)
    }

    async fn group_ok(&self, request: GroupRequest) -> Result<(), ClientError> {
        let call = request.call;
        match self.group_call(request, Duration::ZERO).await? {
            GroupAnswer::Done => Ok(()),
            other => Err(mismatch(&other, call)),
        }
    }

    /// The group `group` on `shard` of `namespace/stream`.
    pub fn group(&self, namespace: &str, stream: &str, shard: u32, group: &str) -> Group {
        Group {
            client: self.clone(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
            shard,
            name: group.to_owned(),
        }
    }
}

/// An answer the core read for another call (it reads each answer for its own call, so
/// this does not happen).
fn mismatch(answer: &GroupAnswer, call: GroupCall) -> ClientError {
    ClientError::protocol(format!("{answer:?} answered {}", call.name()))
}

impl Group {
    fn target(&self) -> GroupRef<'_> {
        GroupRef {
            tenant: &self.client.inner.config.tenant,
            namespace: &self.namespace,
            stream: &self.stream,
            shard: self.shard,
            group: &self.name,
        }
    }

    /// Takes up to `opts.max_records` records for `group` on one shard, waiting up to
    /// `opts.wait` for some. An empty list means nothing was available.
    pub async fn poll(&self, opts: &PollOptions) -> Result<Vec<GroupRecord>, ClientError> {
        let request = self.target().poll(opts, REQUEST_ID);
        match self.client.group_call(request, opts.wait).await? {
            GroupAnswer::Records(records) => Ok(records),
            other => Err(mismatch(&other, GroupCall::Poll)),
        }
    }

    /// Finishes one record.
    pub async fn ack(&self, offset: u64) -> Result<(), ClientError> {
        self.client
            .group_ok(self.target().ack(offset, REQUEST_ID))
            .await
    }

    /// Hands one record back: owed again at once, or after `delay`. `attempts` names the
    /// delivery being handed back (refused `stale_claim` once that claim no longer stands).
    pub async fn nack(
        &self,
        offset: u64,
        delay: Option<Duration>,
        attempts: Option<u64>,
    ) -> Result<(), ClientError> {
        self.client
            .group_ok(self.target().nack(offset, delay, attempts, REQUEST_ID))
            .await
    }

    /// Keeps the claim made with delivery `attempts` standing for `by`; returns what the
    /// broker granted.
    pub async fn extend(
        &self,
        offset: u64,
        attempts: u64,
        by: Duration,
    ) -> Result<Duration, ClientError> {
        let request = self.target().extend(offset, attempts, by, REQUEST_ID);
        match self.client.group_call(request, Duration::ZERO).await? {
            GroupAnswer::Extended(visible) => Ok(visible),
            other => Err(mismatch(&other, GroupCall::Extend)),
        }
    }

    /// Gives up on one record: listed as a dead letter, then finished.
    pub async fn dead_letter(&self, offset: u64) -> Result<(), ClientError> {
        self.client
            .group_ok(self.target().dead_letter(offset, REQUEST_ID))
            .await
    }

    /// The offsets the group gave up on, lowest first.
    pub async fn dead_letters(&self) -> Result<Vec<u64>, ClientError> {
        let request = self.target().dead_letters(REQUEST_ID);
        match self.client.group_call(request, Duration::ZERO).await? {
            GroupAnswer::DeadLetters(offsets) => Ok(offsets),
            other => Err(mismatch(&other, GroupCall::DeadLetters)),
        }
    }

    /// Drops one dead letter.
    pub async fn discard(&self, offset: u64) -> Result<(), ClientError> {
        self.client
            .group_ok(self.target().discard(offset, REQUEST_ID))
            .await
    }

    /// Puts one dead letter back in delivery with its attempts reset.
    pub async fn redrive(&self, offset: u64) -> Result<(), ClientError> {
        self.client
            .group_ok(self.target().redrive(offset, REQUEST_ID))
            .await
    }

    /// Moves the group's cursor (`Start::Latest` is the shard's tail); with `if_new`, only if the group does not exist yet.
    /// Returns where it stands and whether it moved.
    pub async fn seek(&self, start: Start, if_new: bool) -> Result<(u64, bool), ClientError> {
        let request = self.target().seek(start, if_new, REQUEST_ID);
        match self.client.group_call(request, Duration::ZERO).await? {
            GroupAnswer::Position { offset, moved } => Ok((offset, moved)),
            other => Err(mismatch(&other, GroupCall::Seek)),
        }
    }

    /// Where the group stands.
    pub async fn describe(&self) -> Result<GroupInfo, ClientError> {
        let request = self.target().describe(REQUEST_ID);
        match self.client.group_call(request, Duration::ZERO).await? {
            GroupAnswer::Info(info) => Ok(info),
            other => Err(mismatch(&other, GroupCall::Describe)),
        }
    }

    /// Removes the group's cursor and dead letters; returns whether it existed.
    pub async fn delete(&self) -> Result<bool, ClientError> {
        let request = self.target().delete(REQUEST_ID);
        match self.client.group_call(request, Duration::ZERO).await? {
            GroupAnswer::Deleted(existed) => Ok(existed),
            other => Err(mismatch(&other, GroupCall::Delete)),
        }
    }
}
