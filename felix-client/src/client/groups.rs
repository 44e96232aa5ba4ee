//! Consumer groups: `group_poll` and the calls that settle what it handed out.
//!
//! Each call is one request and one answer on an authenticated stream of its own, as the
//! reference client does; finished streams go back to a small pool for the next call, so
//! a consumer in a loop does not pay an `auth` round trip per call.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use felix_proto::message::{self, Message};
use felix_proto::{Features, FrameDecoder};

use super::{open_authenticated, read_frame, write_error, Client};
use crate::core::Start;
use crate::error::ClientError;

/// Idle group streams a client keeps for reuse.
const POOL_MAX: usize = 64;

/// One record a poll handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecord {
    pub offset: u64,
    pub payload: Bytes,
    /// Deliveries including this one (1 = first); `None` if the broker did not say.
    pub attempts: Option<u64>,
    /// Offsets directly below this one the group skipped (retention removed them).
    pub skipped_before: u64,
    /// The publishing principal, when the broker stored one.
    pub publisher: Option<String>,
    /// When the record was appended, in Unix microseconds. `None` only from a broker that
    /// did not advertise `FEATURE_RECORD_TIMESTAMPS`, which sends no such field.
    pub timestamp_micros: Option<u64>,
}

/// How a poll waits and claims.
#[derive(Debug, Clone, Default)]
pub struct PollOptions {
    /// At most this many records (the broker also caps at 1,000). 0 is read as 1.
    pub max_records: u64,
    /// How long the broker may hold the poll open waiting for work.
    pub wait: Duration,
    /// How long the claims stand; `None` is the broker's default.
    pub visibility: Option<Duration>,
    /// The member name, stable across restarts of the consumer.
    pub consumer: Option<String>,
    /// Take back the claims `consumer` held from an older connection first.
    pub reclaim: bool,
}

/// Where a group stands (`group_describe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupInfo {
    pub committed: Option<u64>,
    pub tail: u64,
    pub in_flight: u64,
    pub owed: u64,
    pub dead_letters: u64,
}

/// A group call answered with a message it does not expect.
fn wrong_answer(answer: &Message, call: &str) -> ClientError {
    ClientError::protocol(format!("{} answered {call}", answer.type_name()))
}

struct GroupStream {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
}

/// Idle authenticated streams for group calls.
#[derive(Default)]
pub(crate) struct GroupStreams(Mutex<Vec<GroupStream>>);

macro_rules! group_msg {
    ($g:ident, $ty:ident, { $($f:ident: $v:expr),* $(,)? }) => {
        Message::$ty(message::$ty {
            tenant_id: $g.client.inner.config.tenant.clone(),
            namespace: $g.namespace.clone(),
            stream: $g.stream.clone(),
            shard: u64::from($g.shard),
            group: $g.name.clone(),
            $($f: $v,)*
            request_id: 1,
        })
    };
}

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
    fn require(&self, feature: Features, call: &str) -> Result<(), ClientError> {
        if self.inner.caps.features().contains(feature) {
            Ok(())
        } else {
            Err(ClientError::Usage(format!(
                "the broker did not advertise what {call} needs ({feature:?})"
            )))
        }
    }

    /// Sends one group request and reads its one answer.
    async fn group_call(&self, msg: Message, wait: Duration) -> Result<Message, ClientError> {
        let inner = &self.inner;
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
        let mut frame = Vec::new();
        msg.encode_frame_into(&mut frame);
        s.send
            .write_chunk(Bytes::from(frame))
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
        let answer = Message::decode(&reply.payload)?;
        let mut pool = inner.group_streams.0.lock().expect("pool lock");
        if pool.len() < POOL_MAX {
            pool.push(s);
        }
        drop(pool);
        match answer {
            Message::Error(e) => Err(ClientError::server(e.code, e.retry, e.message)),
            other => Ok(other),
        }
    }

    async fn group_ok(&self, msg: Message, what: &str) -> Result<(), ClientError> {
        match self.group_call(msg, Duration::ZERO).await? {
            Message::CacheOk(_) => Ok(()),
            other => Err(wrong_answer(&other, what)),
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

impl Group {
    /// Takes up to `opts.max_records` records for `group` on one shard, waiting up to
    /// `opts.wait` for some. An empty list means nothing was available.
    pub async fn poll(&self, opts: &PollOptions) -> Result<Vec<GroupRecord>, ClientError> {
        self.client
            .require(Features::CONSUMER_GROUP, "group_poll")?;
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let msg = group_msg!(self, GroupPoll, {
            max_records: opts.max_records.max(1),
            wait_ms: Some(millis(opts.wait)),
            consumer: opts.consumer.clone(),
            reclaim: opts.reclaim.then_some(true),
            visibility_ms: opts.visibility.map(millis),
        });
        match self.client.group_call(msg, opts.wait).await? {
            Message::GroupRecords(r) => Ok(r
                .records
                .into_iter()
                .map(|r| GroupRecord {
                    offset: r.offset,
                    payload: r.payload,
                    attempts: r.attempts,
                    skipped_before: r.skipped_before.unwrap_or(0),
                    publisher: r.publisher,
                    timestamp_micros: r.timestamp_micros,
                })
                .collect()),
            other => Err(wrong_answer(&other, "group_poll")),
        }
    }

    /// Finishes one record.
    pub async fn ack(&self, offset: u64) -> Result<(), ClientError> {
        let msg = group_msg!(self, GroupAck, { offset: offset });
        self.client.group_ok(msg, "group_ack").await
    }

    /// Hands one record back: owed again at once, or after `delay`. `attempts` names the
    /// delivery being handed back (refused `stale_claim` once that claim no longer stands).
    pub async fn nack(
        &self,
        offset: u64,
        delay: Option<Duration>,
        attempts: Option<u64>,
    ) -> Result<(), ClientError> {
        let msg = group_msg!(self, GroupNack, {
            offset: offset,
            delay_ms: delay.map(|d| d.as_millis() as u64),
            attempts: attempts,
        });
        self.client.group_ok(msg, "group_nack").await
    }

    /// Keeps the claim made with delivery `attempts` standing for `by`; returns what the
    /// broker granted.
    pub async fn extend(
        &self,
        offset: u64,
        attempts: u64,
        by: Duration,
    ) -> Result<Duration, ClientError> {
        self.client
            .require(Features::GROUP_CLAIM_CONTROL, "group_extend")?;
        let msg = group_msg!(self, GroupExtend, {
            offset: offset,
            attempts: attempts,
            extend_ms: by.as_millis() as u64,
        });
        match self.client.group_call(msg, Duration::ZERO).await? {
            Message::GroupExtended(e) => Ok(Duration::from_millis(e.visible_ms)),
            other => Err(wrong_answer(&other, "group_extend")),
        }
    }

    /// Gives up on one record: listed as a dead letter, then finished.
    pub async fn dead_letter(&self, offset: u64) -> Result<(), ClientError> {
        self.client
            .require(Features::GROUP_CLAIM_CONTROL, "group_dead_letter")?;
        let msg = group_msg!(self, GroupDeadLetter, { offset: offset });
        self.client.group_ok(msg, "group_dead_letter").await
    }

    /// The offsets the group gave up on, lowest first.
    pub async fn dead_letters(&self) -> Result<Vec<u64>, ClientError> {
        self.client
            .require(Features::GROUP_DEAD_LETTERS, "group_dead_letters")?;
        let msg = group_msg!(self, GroupDeadLetters, {});
        match self.client.group_call(msg, Duration::ZERO).await? {
            Message::GroupDeadLetterList(l) => Ok(l.offsets),
            other => Err(wrong_answer(&other, "group_dead_letters")),
        }
    }

    /// Drops one dead letter.
    pub async fn discard(&self, offset: u64) -> Result<(), ClientError> {
        self.client
            .require(Features::GROUP_DEAD_LETTERS, "group_discard")?;
        let msg = group_msg!(self, GroupDiscard, { offset: offset });
        self.client.group_ok(msg, "group_discard").await
    }

    /// Puts one dead letter back in delivery with its attempts reset.
    pub async fn redrive(&self, offset: u64) -> Result<(), ClientError> {
        self.client
            .require(Features::GROUP_DEAD_LETTERS, "group_redrive")?;
        let msg = group_msg!(self, GroupRedrive, { offset: offset });
        self.client.group_ok(msg, "group_redrive").await
    }

    /// Moves the group's cursor (`Start::Latest` is the shard's tail); with `if_new`, only if the group does not exist yet.
    /// Returns where it stands and whether it moved.
    pub async fn seek(&self, start: Start, if_new: bool) -> Result<(u64, bool), ClientError> {
        self.client.require(Features::GROUP_ADMIN, "group_seek")?;
        let start = match start {
            Start::Latest => message::Start::Latest,
            Start::Earliest => message::Start::Earliest,
            Start::Offset(o) => message::Start::Offset(o),
        };
        let msg = group_msg!(self, GroupSeek, {
            start: start,
            if_new: if_new.then_some(true),
        });
        match self.client.group_call(msg, Duration::ZERO).await? {
            Message::GroupPosition(p) => Ok((p.offset, p.moved)),
            other => Err(wrong_answer(&other, "group_seek")),
        }
    }

    /// Where the group stands.
    pub async fn describe(&self) -> Result<GroupInfo, ClientError> {
        self.client
            .require(Features::GROUP_ADMIN, "group_describe")?;
        let msg = group_msg!(self, GroupDescribe, {});
        match self.client.group_call(msg, Duration::ZERO).await? {
            Message::GroupInfo(i) => Ok(GroupInfo {
                committed: i.committed,
                tail: i.tail,
                in_flight: i.in_flight,
                owed: i.owed,
                dead_letters: i.dead_letters,
            }),
            other => Err(wrong_answer(&other, "group_describe")),
        }
    }

    /// Removes the group's cursor and dead letters; returns whether it existed.
    pub async fn delete(&self) -> Result<bool, ClientError> {
        self.client.require(Features::GROUP_ADMIN, "group_delete")?;
        let msg = group_msg!(self, GroupDelete, {});
        match self.client.group_call(msg, Duration::ZERO).await? {
            Message::GroupDeleted(d) => Ok(d.existed),
            other => Err(wrong_answer(&other, "group_delete")),
        }
    }
}
