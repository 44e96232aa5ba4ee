//! Consumer groups: `group_poll` and the calls that settle and manage what it hands out.
//!
//! Each call is one JSON request naming the group and one answer carrying the same request
//! id. [`GroupRef`] builds the request (the caller picks the id: the front end sends one
//! call per stream with id 1, the simulator pipelines several on one stream), and
//! [`read_group_answer`] reads the answer for the call it was given.

use std::time::Duration;

use bytes::Bytes;
use felix_proto::message::{self, Message};
use felix_proto::{Features, Frame};

use super::auth::Capabilities;
use super::codec::{frame_bytes, refusal};
use super::subscribe::Start;
use crate::error::ClientError;

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

/// Which group call a request is, for reading its answer and checking its feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupCall {
    Poll,
    Ack,
    Nack,
    Extend,
    DeadLetter,
    DeadLetters,
    Discard,
    Redrive,
    Seek,
    Describe,
    Delete,
}

impl GroupCall {
    /// The request's wire name.
    pub fn name(self) -> &'static str {
        match self {
            GroupCall::Poll => "group_poll",
            GroupCall::Ack => "group_ack",
            GroupCall::Nack => "group_nack",
            GroupCall::Extend => "group_extend",
            GroupCall::DeadLetter => "group_dead_letter",
            GroupCall::DeadLetters => "group_dead_letters",
            GroupCall::Discard => "group_discard",
            GroupCall::Redrive => "group_redrive",
            GroupCall::Seek => "group_seek",
            GroupCall::Describe => "group_describe",
            GroupCall::Delete => "group_delete",
        }
    }

    /// The feature the broker must have advertised (and we offered) before we send it;
    /// `None` for acks and nacks, which every group-serving broker takes.
    fn feature(self) -> Option<Features> {
        match self {
            GroupCall::Poll => Some(Features::CONSUMER_GROUP),
            GroupCall::Ack | GroupCall::Nack => None,
            GroupCall::Extend | GroupCall::DeadLetter => Some(Features::GROUP_CLAIM_CONTROL),
            GroupCall::DeadLetters | GroupCall::Discard | GroupCall::Redrive => {
                Some(Features::GROUP_DEAD_LETTERS)
            }
            GroupCall::Seek | GroupCall::Describe | GroupCall::Delete => {
                Some(Features::GROUP_ADMIN)
            }
        }
    }

    /// Refuses the call locally unless both sides have its feature (an unknown request
    /// can cost the stream).
    pub fn check(self, caps: &Capabilities) -> Result<(), ClientError> {
        match self.feature() {
            Some(feature) if !caps.features().contains(feature) => {
                Err(ClientError::Usage(format!(
                    "the broker did not advertise what {} needs ({feature:?})",
                    self.name()
                )))
            }
            _ => Ok(()),
        }
    }
}

/// A group request ready for the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRequest {
    /// What it asks, for [`read_group_answer`].
    pub call: GroupCall,
    /// The whole frame, header included.
    pub frame: Bytes,
}

/// One group on one shard of a stream, as its requests name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupRef<'a> {
    pub tenant: &'a str,
    pub namespace: &'a str,
    pub stream: &'a str,
    pub shard: u32,
    pub group: &'a str,
}

macro_rules! group_msg {
    ($g:ident, $ty:ident, $rid:expr, { $($f:ident: $v:expr),* $(,)? }) => {
        Message::$ty(message::$ty {
            tenant_id: $g.tenant.to_owned(),
            namespace: $g.namespace.to_owned(),
            stream: $g.stream.to_owned(),
            shard: u64::from($g.shard),
            group: $g.group.to_owned(),
            $($f: $v,)*
            request_id: $rid,
        })
    };
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl GroupRef<'_> {
    fn request(call: GroupCall, msg: &Message) -> GroupRequest {
        GroupRequest {
            call,
            frame: frame_bytes(msg),
        }
    }

    /// `group_poll`: up to `opts.max_records` records, waiting up to `opts.wait`.
    pub fn poll(&self, opts: &PollOptions, request_id: u64) -> GroupRequest {
        let msg = group_msg!(self, GroupPoll, request_id, {
            max_records: opts.max_records.max(1),
            wait_ms: Some(millis(opts.wait)),
            consumer: opts.consumer.clone(),
            reclaim: opts.reclaim.then_some(true),
            visibility_ms: opts.visibility.map(millis),
        });
        Self::request(GroupCall::Poll, &msg)
    }

    /// `group_ack`: finishes one record.
    pub fn ack(&self, offset: u64, request_id: u64) -> GroupRequest {
        let msg = group_msg!(self, GroupAck, request_id, { offset: offset });
        Self::request(GroupCall::Ack, &msg)
    }

    /// `group_nack`: hands one record back, owed again at once or after `delay`;
    /// `attempts` names the delivery being handed back.
    pub fn nack(
        &self,
        offset: u64,
        delay: Option<Duration>,
        attempts: Option<u64>,
        request_id: u64,
    ) -> GroupRequest {
        let msg = group_msg!(self, GroupNack, request_id, {
            offset: offset,
            delay_ms: delay.map(|d| d.as_millis() as u64),
            attempts: attempts,
        });
        Self::request(GroupCall::Nack, &msg)
    }

    /// `group_extend`: keeps the claim made with delivery `attempts` standing for `by`.
    pub fn extend(
        &self,
        offset: u64,
        attempts: u64,
        by: Duration,
        request_id: u64,
    ) -> GroupRequest {
        let msg = group_msg!(self, GroupExtend, request_id, {
            offset: offset,
            attempts: attempts,
            extend_ms: by.as_millis() as u64,
        });
        Self::request(GroupCall::Extend, &msg)
    }

    /// `group_dead_letter`: gives up on one record.
    pub fn dead_letter(&self, offset: u64, request_id: u64) -> GroupRequest {
        let msg = group_msg!(self, GroupDeadLetter, request_id, { offset: offset });
        Self::request(GroupCall::DeadLetter, &msg)
    }

    /// `group_dead_letters`: the offsets the group gave up on.
    pub fn dead_letters(&self, request_id: u64) -> GroupRequest {
        let msg = group_msg!(self, GroupDeadLetters, request_id, {});
        Self::request(GroupCall::DeadLetters, &msg)
    }

    /// `group_discard`: drops one dead letter.
    pub fn discard(&self, offset: u64, request_id: u64) -> GroupRequest {
        let msg = group_msg!(self, GroupDiscard, request_id, { offset: offset });
        Self::request(GroupCall::Discard, &msg)
    }

    /// `group_redrive`: puts one dead letter back in delivery.
    pub fn redrive(&self, offset: u64, request_id: u64) -> GroupRequest {
        let msg = group_msg!(self, GroupRedrive, request_id, { offset: offset });
        Self::request(GroupCall::Redrive, &msg)
    }

    /// `group_seek`: moves the cursor (`Start::Latest` is the shard's tail); with
    /// `if_new`, only if the group does not exist yet.
    pub fn seek(&self, start: Start, if_new: bool, request_id: u64) -> GroupRequest {
        let start = match start {
            Start::Latest => message::Start::Latest,
            Start::Earliest => message::Start::Earliest,
            Start::Offset(o) => message::Start::Offset(o),
        };
        let msg = group_msg!(self, GroupSeek, request_id, {
            start: start,
            if_new: if_new.then_some(true),
        });
        Self::request(GroupCall::Seek, &msg)
    }

    /// `group_describe`: where the group stands.
    pub fn describe(&self, request_id: u64) -> GroupRequest {
        let msg = group_msg!(self, GroupDescribe, request_id, {});
        Self::request(GroupCall::Describe, &msg)
    }

    /// `group_delete`: removes the group's cursor and dead letters.
    pub fn delete(&self, request_id: u64) -> GroupRequest {
        let msg = group_msg!(self, GroupDelete, request_id, {});
        Self::request(GroupCall::Delete, &msg)
    }
}

/// What a group call was answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupAnswer {
    /// `group_records`, answering a poll (empty: nothing was available).
    Records(Vec<GroupRecord>),
    /// `cache_ok`, answering an ack, nack, dead letter, discard or redrive.
    Done,
    /// `group_extended`: how long the claim now stands.
    Extended(Duration),
    /// `group_dead_letter_list`, lowest offset first.
    DeadLetters(Vec<u64>),
    /// `group_position`: where the cursor stands and whether it moved.
    Position { offset: u64, moved: bool },
    /// `group_info`.
    Info(GroupInfo),
    /// `group_deleted`: whether the group existed.
    Deleted(bool),
}

/// A group answer that decoded, not yet read for its call (the front end keeps a stream
/// whose answer decoded for the next call, whatever the answer says).
#[derive(Debug, Clone)]
pub struct GroupReply(Message);

impl GroupReply {
    /// Decodes one frame from a group stream.
    pub fn decode(frame: &Frame) -> Result<GroupReply, ClientError> {
        Ok(GroupReply(Message::decode(&frame.payload)?))
    }

    /// Reads it as the answer to `call`: its request id and what it said. `error` is the
    /// broker's refusal; a message that does not answer `call` is a protocol violation.
    pub fn answer(self, call: GroupCall) -> Result<(u64, GroupAnswer), ClientError> {
        Ok(match (call, self.0) {
            (_, Message::Error(e)) => return Err(refusal(e)),
            // Routing: the group's shard is led elsewhere (to a client that offered
            // `FEATURE_REDIRECT`); nothing was done, and the front end follows it.
            (_, Message::NotLeader(n)) => {
                return Err(ClientError::NotLeader {
                    node_id: n.node_id,
                    addr: n.addr,
                    generation: n.generation,
                })
            }
            (GroupCall::Poll, Message::GroupRecords(r)) => (
                r.request_id,
                GroupAnswer::Records(
                    r.records
                        .into_iter()
                        .map(|r| GroupRecord {
                            offset: r.offset,
                            payload: r.payload,
                            attempts: r.attempts,
                            skipped_before: r.skipped_before.unwrap_or(0),
                            publisher: r.publisher,
                            timestamp_micros: r.timestamp_micros,
                        })
                        .collect(),
                ),
            ),
            (
                GroupCall::Ack
                | GroupCall::Nack
                | GroupCall::DeadLetter
                | GroupCall::Discard
                | GroupCall::Redrive,
                Message::CacheOk(ok),
            ) => (ok.request_id, GroupAnswer::Done),
            (GroupCall::Extend, Message::GroupExtended(e)) => (
                e.request_id,
                GroupAnswer::Extended(Duration::from_millis(e.visible_ms)),
            ),
            (GroupCall::DeadLetters, Message::GroupDeadLetterList(l)) => {
                (l.request_id, GroupAnswer::DeadLetters(l.offsets))
            }
            (GroupCall::Seek, Message::GroupPosition(p)) => (
                p.request_id,
                GroupAnswer::Position {
                    offset: p.offset,
                    moved: p.moved,
                },
            ),
            (GroupCall::Describe, Message::GroupInfo(i)) => (
                i.request_id,
                GroupAnswer::Info(GroupInfo {
                    committed: i.committed,
                    tail: i.tail,
                    in_flight: i.in_flight,
                    owed: i.owed,
                    dead_letters: i.dead_letters,
                }),
            ),
            (GroupCall::Delete, Message::GroupDeleted(d)) => {
                (d.request_id, GroupAnswer::Deleted(d.existed))
            }
            (_, other) => {
                return Err(ClientError::protocol(format!(
                    "{} answered {}",
                    other.type_name(),
                    call.name()
                )))
            }
        })
    }
}

/// [`GroupReply::decode`], then [`GroupReply::answer`].
pub fn read_group_answer(
    call: GroupCall,
    frame: &Frame,
) -> Result<(u64, GroupAnswer), ClientError> {
    GroupReply::decode(frame)?.answer(call)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_not_leader_answer_to_any_group_call_is_a_redirect() {
        let bytes = frame_bytes(&Message::NotLeader(message::NotLeader {
            node_id: "n3".into(),
            addr: Some("127.0.0.1:7003".into()),
            generation: 2,
        }));
        let mut d = felix_proto::FrameDecoder::new(1 << 20);
        d.feed(&bytes);
        let frame = d.next_frame().expect("valid").expect("whole");
        for call in [GroupCall::Poll, GroupCall::Ack, GroupCall::DeadLetters] {
            assert_eq!(
                read_group_answer(call, &frame).map(|(_, a)| a),
                Err(ClientError::NotLeader {
                    node_id: "n3".into(),
                    addr: Some("127.0.0.1:7003".into()),
                    generation: 2
                })
            );
        }
    }
}
