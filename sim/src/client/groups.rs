//! The consumer-group workload of a simulated worker (durable runs only): on a stream of its
//! own, one request at a time, it polls the group `workers` on a random shard (with a random
//! wait and visibility), then acks or nacks what it holds. Every handout goes to the
//! `group_claims` invariant; every request to `requests_answered`. The requests and the
//! reading of their answers are felix-client's core (`GroupRef`, `read_group_answer`).
//!
//! The auditor drains the group once the run is quiet: per shard it polls (waiting long
//! enough for every worker's claim to lapse) and acks everything it gets, until a poll finds
//! nothing; then it asks where the group stands. `group_claims::check_drained` wants the
//! cursor at the shard's tail: every record finished (acked or dead-lettered), none lost.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use felix_client::core::{
    read_group_answer, GroupAnswer, GroupCall, GroupRef, GroupRequest, PollOptions,
};
use felix_client::ClientError;
use felix_proto::Frame;
use quinn_proto::StreamId;

use super::{protocol, Ctx, Phase, SimClient, NAMESPACE, STREAM, TENANT};
use crate::oracle::{Promise, Violation};

const GROUP: &str = "workers";

/// A group request waiting for its answer.
#[derive(Debug)]
enum Asked {
    Poll {
        shard: u32,
        sent: Instant,
        visibility: Duration,
    },
    /// An ack or a nack.
    Settle(GroupCall),
    Describe {
        shard: u32,
    },
}

/// The auditor's drain: the shard it is on, and whether it has asked where it stands.
#[derive(Debug, Default)]
struct Drain {
    shard: u32,
    done: bool,
}

/// This connection's group work: the request in flight and the records it holds.
#[derive(Debug, Default)]
pub(super) struct GroupWork {
    pub(super) stream: Option<StreamId>,
    asked: VecDeque<(u64, Asked)>,
    drain: Option<Drain>,
    next_rid: u64,
    /// (shard, offset, attempts) handed to this connection and not settled by it.
    held: Vec<(u32, u64, u64)>,
}

impl GroupWork {
    /// Forgets the request in flight (its stream ended); its request id.
    pub(super) fn take_asked(&mut self) -> Option<u64> {
        self.asked.pop_front().map(|(rid, _)| rid)
    }
}

impl Asked {
    fn call(&self) -> GroupCall {
        match self {
            Asked::Poll { .. } => GroupCall::Poll,
            Asked::Settle(call) => *call,
            Asked::Describe { .. } => GroupCall::Describe,
        }
    }
}

/// The workload's group on `shard`.
fn group(shard: u32) -> GroupRef<'static> {
    GroupRef {
        tenant: TENANT,
        namespace: NAMESPACE,
        stream: STREAM,
        shard,
        group: GROUP,
    }
}

impl SimClient {
    /// One group step: settle something held, or poll.
    pub(super) fn group_op(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Result<(), Violation> {
        if ctx.oracle.promise != Promise::Durable {
            return Ok(());
        }
        let me = self.id;
        let settle = self.rng.chance(0.7);
        let nack = self.rng.chance(0.2);
        let pick = self.rng.below(1 << 16) as usize;
        let shard = self.rng.below(u64::from(self.shards)) as u32;
        let max = 1 + self.rng.below(8);
        let wait_ms = *self.rng.pick(&[0u64, 100, 500]);
        let visibility = Duration::from_millis(*self.rng.pick(&[100u64, 500, 2000]));
        let Some(conn) = self.conns.values_mut().next() else {
            return Ok(());
        };
        let gen = conn.gen;
        let work = &mut conn.group;
        let Some(id) = work.stream else {
            return Ok(());
        };
        if !work.asked.is_empty() {
            return Ok(());
        }
        let Some(s) = conn.bi.get_mut(&id) else {
            return Ok(());
        };
        if !matches!(s.phase, Phase::Ready(_)) {
            return Ok(());
        }
        work.next_rid += 1;
        let rid = work.next_rid;
        let (req, asked, what) = if settle && !work.held.is_empty() {
            let (shard, offset, attempts) = work.held.swap_remove(pick % work.held.len());
            ctx.oracle.groups.released(shard, offset, (me, gen), now);
            let req = if nack {
                group(shard).nack(offset, None, Some(attempts), rid)
            } else {
                group(shard).ack(offset, rid)
            };
            let what = format!(
                "group {} {shard}/{offset}",
                if nack { "nack" } else { "ack" }
            );
            let asked = Asked::Settle(req.call);
            (req, asked, what)
        } else {
            let req = poll(shard, max, wait_ms, visibility, rid);
            let asked = Asked::Poll {
                shard,
                sent: now,
                visibility,
            };
            (
                req,
                asked,
                format!("group_poll shard {shard} wait {wait_ms}"),
            )
        };
        s.out.push_back(req.frame);
        ctx.oracle
            .request_sent((me, gen, s.no, rid), now, what.clone());
        ctx.log(now, format_args!("c{me} {what} req {rid}"));
        work.asked.push_back((rid, asked));
        Ok(())
    }

    /// The auditor's next drain request, when nothing is in flight.
    pub(super) fn drain_groups(&mut self, now: Instant, ctx: &mut Ctx<'_>) {
        if ctx.oracle.promise != Promise::Durable {
            return;
        }
        let me = self.id;
        let shards = self.shards;
        let Some(conn) = self.conns.values_mut().next() else {
            return;
        };
        let gen = conn.gen;
        let work = &mut conn.group;
        let Some(id) = work.stream else {
            return;
        };
        let Some(s) = conn.bi.get_mut(&id) else {
            return;
        };
        if !work.asked.is_empty() || !matches!(s.phase, Phase::Ready(_)) {
            return;
        }
        let drain = work.drain.get_or_insert_with(Drain::default);
        if drain.shard >= shards {
            return;
        }
        let shard = drain.shard;
        work.next_rid += 1;
        let rid = work.next_rid;
        let (req, asked) = if drain.done {
            (group(shard).describe(rid), Asked::Describe { shard })
        } else {
            // Long enough for every worker's claim (2 s at most) to lapse meanwhile.
            let visibility = Duration::from_secs(60);
            let req = poll(shard, 1000, 3000, visibility, rid);
            let asked = Asked::Poll {
                shard,
                sent: now,
                visibility,
            };
            (req, asked)
        };
        let what = format!("drain {}", req.call.name());
        s.out.push_back(req.frame);
        ctx.oracle.request_sent((me, gen, s.no, rid), now, what);
        work.asked.push_back((rid, asked));
    }

    /// A frame on the group stream: the answer to the request in flight.
    pub(super) fn on_group_frame(
        &mut self,
        now: Instant,
        no: u64,
        frame: &Frame,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Violation> {
        let me = self.id;
        let conn = self.conns.values_mut().next().expect("conn");
        let gen = conn.gen;
        let Some((rid, asked)) = conn.group.asked.pop_front() else {
            return Err(protocol(me, "a group answer with no request".into()));
        };
        ctx.oracle.request_answered((me, gen, no, rid));
        match (&asked, read_group_answer(asked.call(), frame)) {
            (
                &Asked::Poll {
                    shard,
                    sent,
                    visibility,
                },
                Ok((answered, GroupAnswer::Records(records))),
            ) => {
                if answered != rid {
                    return Err(protocol(
                        me,
                        format!("group_records for {answered} not {rid}"),
                    ));
                }
                let mut got: Vec<(u64, u64)> = records
                    .iter()
                    .map(|r| (r.offset, r.attempts.unwrap_or(1)))
                    .collect();
                if let Some(slot) = ctx.misroute_claim.as_deref_mut() {
                    // Canary: another worker's record joins this answer; this answer's
                    // first record waits to do the same to the next worker.
                    let worker = self.role == super::Role::Worker;
                    match *slot {
                        Some((from, s, offset)) if worker && from != me && s == shard => {
                            got.push((offset, 1));
                            *slot = None;
                        }
                        None if worker => *slot = got.first().map(|&(o, _)| (me, shard, o)),
                        _ => {}
                    }
                }
                for (offset, attempts) in got {
                    ctx.oracle
                        .groups
                        .handed(shard, offset, (me, gen), sent, now, visibility)?;
                    ctx.log(
                        now,
                        format_args!("c{me} group got {shard}/{offset} attempt {attempts}"),
                    );
                    conn.group.held.push((shard, offset, attempts));
                }
                if let Some(drain) = conn.group.drain.as_mut() {
                    // The auditor finishes what it takes, all at once (answers come back in
                    // order), and polls again; an empty poll ends the shard's drain.
                    let held = std::mem::take(&mut conn.group.held);
                    if held.is_empty() {
                        drain.done = true;
                    }
                    let s = conn
                        .group
                        .stream
                        .and_then(|id| conn.bi.get_mut(&id))
                        .expect("the group stream answered");
                    for (shard, offset, _) in held {
                        conn.group.next_rid += 1;
                        let rid = conn.group.next_rid;
                        ctx.oracle.groups.released(shard, offset, (me, gen), now);
                        s.out.push_back(group(shard).ack(offset, rid).frame);
                        ctx.oracle.request_sent(
                            (me, gen, no, rid),
                            now,
                            format!("drain ack {offset}"),
                        );
                        conn.group
                            .asked
                            .push_back((rid, Asked::Settle(GroupCall::Ack)));
                    }
                }
            }
            (&Asked::Describe { shard }, Ok((_, GroupAnswer::Info(info)))) => {
                ctx.log(
                    now,
                    format_args!(
                        "c{me} group drained shard {shard}: committed {:?} tail {} dead {}",
                        info.committed, info.tail, info.dead_letters
                    ),
                );
                ctx.oracle
                    .groups
                    .drained(shard, info.committed.unwrap_or(0), info.tail);
                if let Some(drain) = conn.group.drain.as_mut() {
                    drain.shard += 1;
                    drain.done = false;
                }
            }
            (Asked::Settle(_), Ok((answered, GroupAnswer::Done))) if answered == rid => {}
            // A lapsed claim (stale), or a log still failing after a crash: refusals the
            // workload takes as they come.
            (_, Err(ClientError::Server { message, .. })) => {
                self.stats.refusals += 1;
                ctx.log(now, format_args!("c{me} group refused: {message}"));
            }
            (_, Err(e)) => return Err(protocol(me, format!("group answer: {e}"))),
            (_, Ok((answered, other))) => {
                return Err(protocol(
                    me,
                    format!("{other:?} (request {answered}) answered {asked:?} (request {rid})"),
                ));
            }
        }
        if self.role == super::Role::Auditor {
            self.drain_groups(now, ctx);
        }
        Ok(())
    }
}

/// An anonymous `group_poll` of the workload's group.
fn poll(
    shard: u32,
    max_records: u64,
    wait_ms: u64,
    visibility: Duration,
    rid: u64,
) -> GroupRequest {
    let opts = PollOptions {
        max_records,
        wait: Duration::from_millis(wait_ms),
        visibility: Some(visibility),
        consumer: None,
        reclaim: false,
    };
    group(shard).poll(&opts, rid)
}
