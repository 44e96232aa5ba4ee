//! Forwards this node sends to a shard's leader, as plain state (docs/cluster.md, "Forwarding").
//!
//! A client session whose request belongs to a shard led elsewhere forwards it, over a
//! channel that names the session on the leader (the high half of a forward id). This module
//! keeps, per target node, a window of forwards owed an answer, the ones waiting for a place in
//! it, the deadline of each, and the channels it opened, and decides:
//! - a forward waits (in order, so a session's requests keep their order) while its target's
//!   window is full, and one that waited past its deadline is answered as *not taken* instead
//!   of sent late, after requests its session may have served elsewhere since;
//! - one sent and not answered by its deadline ends as *unanswered* (it may have been applied);
//! - a refusal because the leader no longer knows the channel reopens it once and sends again,
//!   in order, every forward of the channel still unanswered there; the refusals of their first
//!   attempts are then expected and ignored.
//!
//! Targets are node ids and sessions an opaque `S` (the engine's connection and stream): what
//! to send and what ended come out of [`Forwards::poll_output`] for the caller to carry.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_peer_proto::{Forward, ForwardAnswer, ForwardRefused};

use crate::NodeId;

/// What the forwards ask their caller to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardOutput<S> {
    /// Send `forward` to `to` over the peer link.
    Send { to: NodeId, forward: Forward },
    /// A forward owed an answer to session `owner` ended.
    Ended {
        owner: S,
        forward_id: u64,
        end: ForwardEnd,
    },
}

/// How a forward owed an answer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardEnd {
    /// The leader's answer frame.
    Answered(Bytes),
    /// `by` refused it.
    Refused { by: NodeId, refusal: ForwardRefused },
    /// Sent to `to`, no answer within `after`: it may or may not have been applied.
    Unanswered { to: NodeId, after: Duration },
    /// It waited for a place in `to`'s full window longer than `after` and was never sent: it
    /// was not applied.
    NotTaken { to: NodeId, after: Duration },
}

/// A forward sent, waiting for its answer.
#[derive(Debug)]
struct Sent<S> {
    owner: S,
    deadline: Instant,
    to: NodeId,
    /// Kept to send again once if the leader no longer knows its channel.
    forward: Forward,
    retried: bool,
    /// Sent again by a reopen before its first attempt's refusal came back: that refusal is
    /// expected and means nothing.
    stale_refusal: bool,
}

/// A forward not sent yet: its target's window is full, or others wait before it.
#[derive(Debug)]
struct Waiting<S> {
    forward: Forward,
    answer_to: Option<S>,
    deadline: Instant,
}

/// One session's forward channel: what opens it on a node, and where it is open.
#[derive(Debug)]
struct Channel<S> {
    owner: S,
    open: Forward,
    on: Vec<NodeId>,
}

#[derive(Debug)]
pub struct Forwards<S> {
    /// Sent and not answered, by id.
    sent: BTreeMap<u64, Sent<S>>,
    /// Per target: forwards owed an answer in flight, and those waiting for a place.
    in_flight: BTreeMap<NodeId, usize>,
    waiting: BTreeMap<NodeId, VecDeque<Waiting<S>>>,
    /// Open channels by number.
    channels: BTreeMap<u32, Channel<S>>,
    window: usize,
    timeout: Duration,
    next_channel: u32,
    out: VecDeque<ForwardOutput<S>>,
}

impl<S: Copy + Eq> Forwards<S> {
    /// `window`: forwards owed an answer in flight per target (`limits.forward_window`);
    /// `timeout`: how long one may take; channels are numbered from `first_channel` (never 0).
    pub fn new(window: usize, timeout: Duration, first_channel: u32) -> Forwards<S> {
        Forwards {
            sent: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            waiting: BTreeMap::new(),
            channels: BTreeMap::new(),
            window,
            timeout,
            next_channel: first_channel.max(1),
            out: VecDeque::new(),
        }
    }

    pub fn window(&self) -> usize {
        self.window
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A channel number for one session's forwards (the high half of their ids).
    pub fn new_channel(&mut self) -> u32 {
        let c = self.next_channel;
        self.next_channel = self.next_channel.wrapping_add(1).max(1);
        c
    }

    /// Sends a forward to `to`; with `answer_to`, its answer is owed to that session. A
    /// forward owed an answer takes a place in `to`'s window; with the window full, or
    /// others already waiting, it waits in order (so a session's forwards keep their order).
    pub fn forward(&mut self, now: Instant, to: &NodeId, forward: Forward, answer_to: Option<S>) {
        let deadline = now + self.timeout;
        self.waiting
            .entry(to.clone())
            .or_default()
            .push_back(Waiting {
                forward,
                answer_to,
                deadline,
            });
        self.send_waiting(now, to);
    }

    /// Sends what waits for `to`, in order, while its window has room. One whose deadline has
    /// passed is answered as not taken instead of sent: its session may have served later
    /// requests for the same shard elsewhere since (a node frozen past the deadline handles
    /// what reached it before its timers), and sent now it would land after them.
    fn send_waiting(&mut self, now: Instant, to: &NodeId) {
        let Some(queue) = self.waiting.get_mut(to) else {
            return;
        };
        let in_flight = self.in_flight.entry(to.clone()).or_default();
        while let Some(front) = queue.front() {
            if let Some(owner) = front.answer_to.filter(|_| front.deadline <= now) {
                let w = queue.pop_front().expect("front");
                self.out
                    .push_back(not_taken(to, self.timeout, &w.forward, owner));
                continue;
            }
            if front.answer_to.is_some() && *in_flight >= self.window {
                break;
            }
            let w = queue.pop_front().expect("front");
            if let Some(owner) = w.answer_to {
                *in_flight += 1;
                self.sent.insert(
                    w.forward.forward_id,
                    Sent {
                        owner,
                        deadline: w.deadline,
                        to: to.clone(),
                        forward: w.forward.clone(),
                        retried: false,
                        stale_refusal: false,
                    },
                );
            }
            self.out.push_back(ForwardOutput::Send {
                to: to.clone(),
                forward: w.forward,
            });
        }
        if queue.is_empty() {
            self.waiting.remove(to);
        }
    }

    /// A forward to `to` owed an answer has ended: its place goes to the next waiting one.
    fn answered(&mut self, now: Instant, to: &NodeId) {
        if let Some(n) = self.in_flight.get_mut(to) {
            *n = n.saturating_sub(1);
        }
        self.send_waiting(now, to);
    }

    /// Ends what passed its deadline: waiting ones never left this node, so their outcome is
    /// known (not taken); sent ones may or may not have been applied.
    pub fn handle_timeout(&mut self, now: Instant) {
        for (to, queue) in self.waiting.iter_mut() {
            let timeout = self.timeout;
            let out = &mut self.out;
            queue.retain(|w| match w.answer_to {
                Some(owner) if w.deadline <= now => {
                    out.push_back(not_taken(to, timeout, &w.forward, owner));
                    false
                }
                _ => true,
            });
        }
        self.waiting.retain(|_, q| !q.is_empty());
        let expired: Vec<u64> = self
            .sent
            .iter()
            .filter(|(_, s)| s.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let s = self.sent.remove(&id).expect("listed");
            self.out.push_back(ForwardOutput::Ended {
                owner: s.owner,
                forward_id: id,
                end: ForwardEnd::Unanswered {
                    to: s.to.clone(),
                    after: self.timeout,
                },
            });
            self.answered(now, &s.to);
        }
    }

    /// The earliest deadline of a forward owed an answer, sent or waiting.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let sent = self.sent.values().map(|s| s.deadline).min();
        let waiting = self
            .waiting
            .values()
            .flat_map(|q| {
                q.iter()
                    .filter(|w| w.answer_to.is_some())
                    .map(|w| w.deadline)
            })
            .min();
        [sent, waiting].into_iter().flatten().min()
    }

    /// The leader answered a forward.
    pub fn answer(&mut self, now: Instant, answer: ForwardAnswer) {
        if let Some(s) = self.sent.remove(&answer.forward_id) {
            self.out.push_back(ForwardOutput::Ended {
                owner: s.owner,
                forward_id: answer.forward_id,
                end: ForwardEnd::Answered(answer.frame),
            });
            self.answered(now, &s.to);
        }
    }

    /// The leader refused a forward; `channel_unknown` when because it no longer knows the
    /// forward's channel (it restarted, or closed the channel as idle past its cap).
    pub fn refused(&mut self, now: Instant, refusal: ForwardRefused, channel_unknown: bool) {
        let id = refusal.forward_id;
        if channel_unknown {
            if let Some(s) = self.sent.get_mut(&id) {
                if std::mem::take(&mut s.stale_refusal) {
                    return;
                }
            }
            if self.reopen(id) {
                return;
            }
        }
        if let Some(s) = self.sent.remove(&id) {
            self.out.push_back(ForwardOutput::Ended {
                owner: s.owner,
                forward_id: id,
                end: ForwardEnd::Refused {
                    by: s.to.clone(),
                    refusal,
                },
            });
            self.answered(now, &s.to);
        }
    }

    /// Opens the channel of `forward_id` again and sends, in their order, every forward of that
    /// channel still unanswered there — the ones sent after this one were refused too, or will
    /// be, and re-sending only this one would land it after them and reorder the client's
    /// stream. Each is sent again at most once. False if this one was already, or the channel
    /// is gone here too.
    fn reopen(&mut self, forward_id: u64) -> bool {
        let channel = (forward_id >> 32) as u32;
        let Some(c) = self.channels.get(&channel) else {
            return false;
        };
        let Some(first) = self.sent.get(&forward_id) else {
            return false;
        };
        if first.retried {
            return false;
        }
        let to = first.to.clone();
        self.out.push_back(ForwardOutput::Send {
            to: to.clone(),
            forward: c.open.clone(),
        });
        let lo = u64::from(channel) << 32;
        let hi = lo | 0xffff_ffff;
        for (&id, s) in self.sent.range_mut(forward_id..=hi) {
            if s.to != to || s.retried || id < lo {
                continue;
            }
            s.retried = true;
            // The first attempts of the later ones are still to be refused.
            s.stale_refusal = id != forward_id;
            self.out.push_back(ForwardOutput::Send {
                to: to.clone(),
                forward: s.forward.clone(),
            });
        }
        true
    }

    /// Registers that a session's channel is being opened on `to` with `open` (its `auth`), so
    /// that the channel can be reopened and closed from here.
    pub fn channel_opened(&mut self, channel: u32, owner: S, to: &NodeId, open: &Forward) {
        let c = self.channels.entry(channel).or_insert_with(|| Channel {
            owner,
            open: open.clone(),
            on: Vec::new(),
        });
        if !c.on.contains(to) {
            c.on.push(to.clone());
        }
    }

    /// Sessions ended (`ended` says which owners): their channels are forgotten, and closed on
    /// every node they were opened on by the forwards returned (an opening forward with an
    /// empty frame, owed no answer), for the caller to send through [`Forwards::forward`] so
    /// no virtual session is left there.
    pub fn sessions_ended(&mut self, ended: impl Fn(&S) -> bool) -> Vec<(NodeId, Forward)> {
        let gone: Vec<u32> = self
            .channels
            .iter()
            .filter(|(_, c)| ended(&c.owner))
            .map(|(n, _)| *n)
            .collect();
        let mut closes = Vec::new();
        for n in gone {
            let c = self.channels.remove(&n).expect("listed");
            for to in c.on {
                let close = Forward {
                    frame: Bytes::new(),
                    ..c.open.clone()
                };
                closes.push((to, close));
            }
        }
        closes
    }

    /// Open channels.
    pub fn channels(&self) -> usize {
        self.channels.len()
    }

    /// Forwards waiting for a place in a target's window (all targets).
    pub fn waiting_forwards(&self) -> usize {
        self.waiting.values().map(|q| q.len()).sum()
    }

    pub fn poll_output(&mut self) -> Option<ForwardOutput<S>> {
        self.out.pop_front()
    }
}

fn not_taken<S>(to: &NodeId, after: Duration, forward: &Forward, owner: S) -> ForwardOutput<S> {
    ForwardOutput::Ended {
        owner,
        forward_id: forward.forward_id,
        end: ForwardEnd::NotTaken {
            to: to.clone(),
            after,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_peer_proto::{ShardId, ShardKind, ShardScope};
    use felix_proto::ErrorCode;

    const TIMEOUT: Duration = Duration::from_millis(1000);

    /// A session, as the engine's (connection, stream) would be.
    type Session = u32;

    fn n(node: &str) -> NodeId {
        NodeId::new(node)
    }

    /// Forward `seq` of channel `channel`, with a frame naming it.
    fn fwd(channel: u32, seq: u32) -> Forward {
        Forward {
            forward_id: (u64::from(channel) << 32) | u64::from(seq),
            scope: ShardScope {
                shard: ShardId {
                    cluster_id: "c".into(),
                    kind: ShardKind::Stream,
                    tenant: "t".into(),
                    namespace: "ns".into(),
                    name: "s".into(),
                    shard: 0,
                },
                generation: 1,
            },
            tenant: "t".into(),
            principal: "p".into(),
            frame: Bytes::from(format!("{channel}.{seq}")),
        }
    }

    fn refusal(f: &Forward, code: ErrorCode) -> ForwardRefused {
        ForwardRefused {
            forward_id: f.forward_id,
            code,
            leader: None,
        }
    }

    fn name(id: u64) -> String {
        format!("{}.{}", id >> 32, id & 0xffff_ffff)
    }

    /// Every output, one line each: `send n2 1.1` (its frame; `1.0 close` for a channel's
    /// closing forward, whose frame is empty), or `end s7 1.1 answered …|refused by n2 …|
    /// unanswered n2 …|not-taken n2 …`.
    fn drain(f: &mut Forwards<Session>) -> Vec<String> {
        std::iter::from_fn(|| f.poll_output())
            .map(|o| match o {
                ForwardOutput::Send { to, forward } => {
                    let what = match std::str::from_utf8(&forward.frame).unwrap() {
                        "" => format!("{} close", name(forward.forward_id)),
                        frame => frame.to_owned(),
                    };
                    format!("send {to} {what}")
                }
                ForwardOutput::Ended {
                    owner,
                    forward_id,
                    end,
                } => {
                    let how = match end {
                        ForwardEnd::Answered(frame) => {
                            format!("answered {}", std::str::from_utf8(&frame).unwrap())
                        }
                        ForwardEnd::Refused { by, refusal } => {
                            format!("refused by {by} {:?}", refusal.code)
                        }
                        ForwardEnd::Unanswered { to, after } => {
                            format!("unanswered {to} after {}ms", after.as_millis())
                        }
                        ForwardEnd::NotTaken { to, after } => {
                            format!("not-taken {to} after {}ms", after.as_millis())
                        }
                    };
                    format!("end s{owner} {} {how}", name(forward_id))
                }
            })
            .collect()
    }

    fn answer(f: &Forward) -> ForwardAnswer {
        ForwardAnswer {
            forward_id: f.forward_id,
            frame: Bytes::from(format!("ok {}", name(f.forward_id))),
        }
    }

    #[test]
    fn a_full_window_holds_later_forwards_in_order_and_an_answer_frees_a_place() {
        let t0 = Instant::now();
        let mut f: Forwards<Session> = Forwards::new(2, TIMEOUT, 1);
        for seq in 1..=4 {
            f.forward(t0, &n("n2"), fwd(1, seq), Some(7));
        }
        // Another target has its own window.
        f.forward(t0, &n("n3"), fwd(2, 1), Some(8));
        assert_eq!(drain(&mut f), ["send n2 1.1", "send n2 1.2", "send n3 2.1"]);
        assert_eq!(f.waiting_forwards(), 2);
        // A forward owed no answer (a channel's close) takes no place, but keeps its turn.
        f.forward(t0, &n("n2"), fwd(1, 5), None);
        assert!(drain(&mut f).is_empty());
        f.answer(t0, answer(&fwd(1, 1)));
        assert_eq!(drain(&mut f), ["end s7 1.1 answered ok 1.1", "send n2 1.3"]);
        // An answer for a forward that is not in flight frees nothing.
        f.answer(t0, answer(&fwd(1, 1)));
        f.answer(t0, answer(&fwd(9, 9)));
        assert!(drain(&mut f).is_empty());
        f.answer(t0, answer(&fwd(1, 2)));
        assert_eq!(
            drain(&mut f),
            ["end s7 1.2 answered ok 1.2", "send n2 1.4", "send n2 1.5"]
        );
        assert_eq!(f.waiting_forwards(), 0);
    }

    #[test]
    fn deadlines_end_a_waiting_forward_as_not_taken_and_a_sent_one_as_unanswered() {
        let t0 = Instant::now();
        let mut f: Forwards<Session> = Forwards::new(1, TIMEOUT, 1);
        f.forward(t0, &n("n2"), fwd(1, 1), Some(7));
        let t1 = t0 + Duration::from_millis(10);
        f.forward(t1, &n("n2"), fwd(1, 2), Some(7));
        drain(&mut f);
        assert_eq!(f.poll_timeout(), Some(t0 + TIMEOUT));
        f.handle_timeout(t0 + TIMEOUT - Duration::from_millis(1));
        assert!(drain(&mut f).is_empty(), "not yet");
        // The sent one ends at its deadline; the waiting one gets the place but is still
        // within its own, so it goes.
        f.handle_timeout(t0 + TIMEOUT);
        assert_eq!(
            drain(&mut f),
            ["end s7 1.1 unanswered n2 after 1000ms", "send n2 1.2"]
        );
        assert_eq!(f.poll_timeout(), Some(t1 + TIMEOUT));
    }

    #[test]
    fn a_forward_that_waited_past_its_deadline_is_never_sent_late() {
        let t0 = Instant::now();
        let mut f: Forwards<Session> = Forwards::new(1, TIMEOUT, 1);
        f.forward(t0, &n("n2"), fwd(1, 1), Some(7));
        f.forward(t0, &n("n2"), fwd(1, 2), Some(7));
        f.forward(
            t0 + Duration::from_millis(500),
            &n("n2"),
            fwd(1, 3),
            Some(7),
        );
        drain(&mut f);
        // The answer frees a place after the second's deadline: it is answered as not
        // taken (its session may have moved on), and the third, within its own, goes.
        f.answer(t0 + TIMEOUT, answer(&fwd(1, 1)));
        assert_eq!(
            drain(&mut f),
            [
                "end s7 1.1 answered ok 1.1",
                "end s7 1.2 not-taken n2 after 1000ms",
                "send n2 1.3"
            ]
        );
        // And by the timer alone, with the window still full.
        f.forward(t0 + TIMEOUT, &n("n2"), fwd(1, 4), Some(7));
        f.handle_timeout(t0 + TIMEOUT * 2);
        assert_eq!(
            drain(&mut f),
            [
                "end s7 1.4 not-taken n2 after 1000ms",
                "end s7 1.3 unanswered n2 after 1000ms"
            ]
        );
        assert_eq!(f.poll_timeout(), None);
    }

    #[test]
    fn an_unknown_channel_is_reopened_once_and_its_unanswered_forwards_sent_again_in_order() {
        let t0 = Instant::now();
        let mut f: Forwards<Session> = Forwards::new(8, TIMEOUT, 1);
        let open = fwd(1, 0);
        f.channel_opened(1, 7, &n("n2"), &open);
        for seq in 1..=3 {
            f.forward(t0, &n("n2"), fwd(1, seq), Some(7));
        }
        // Another channel's forward to the same leader is not this channel's business.
        f.forward(t0, &n("n2"), fwd(2, 1), Some(8));
        f.answer(t0, answer(&fwd(1, 1)));
        drain(&mut f);
        f.refused(t0, refusal(&fwd(1, 2), ErrorCode::Unauthenticated), true);
        assert_eq!(drain(&mut f), ["send n2 1.0", "send n2 1.2", "send n2 1.3"]);
        // The first attempt of 1.3 is refused too: expected, and ignored.
        f.refused(t0, refusal(&fwd(1, 3), ErrorCode::Unauthenticated), true);
        assert!(drain(&mut f).is_empty());
        // Refused again after the reopen: no second reopen, the session is told.
        f.refused(t0, refusal(&fwd(1, 2), ErrorCode::Unauthenticated), true);
        assert_eq!(drain(&mut f), ["end s7 1.2 refused by n2 Unauthenticated"]);
        // Any other refusal ends the forward at once.
        f.refused(t0, refusal(&fwd(1, 3), ErrorCode::NotLeader), false);
        assert_eq!(drain(&mut f), ["end s7 1.3 refused by n2 NotLeader"]);
        // A channel this node never opened cannot be reopened.
        f.refused(t0, refusal(&fwd(2, 1), ErrorCode::Unauthenticated), true);
        assert_eq!(drain(&mut f), ["end s8 2.1 refused by n2 Unauthenticated"]);
    }

    #[test]
    fn an_ended_session_closes_its_channels_on_every_node_they_were_opened_on() {
        let t0 = Instant::now();
        let mut f: Forwards<Session> = Forwards::new(1, TIMEOUT, 1);
        f.channel_opened(1, 7, &n("n2"), &fwd(1, 0));
        f.channel_opened(1, 7, &n("n3"), &fwd(1, 0));
        f.channel_opened(1, 7, &n("n2"), &fwd(1, 0));
        f.channel_opened(2, 8, &n("n2"), &fwd(2, 0));
        assert_eq!(f.channels(), 2);
        for (to, close) in f.sessions_ended(|s| *s == 7) {
            f.forward(t0, &to, close, None);
        }
        assert_eq!(drain(&mut f), ["send n2 1.0 close", "send n3 1.0 close"]);
        assert_eq!(f.channels(), 1);
        assert!(f.sessions_ended(|s| *s == 7).is_empty());
    }

    #[test]
    fn channel_numbers_skip_zero_when_they_wrap() {
        let mut f: Forwards<Session> = Forwards::new(1, TIMEOUT, u32::MAX);
        assert_eq!(f.new_channel(), u32::MAX);
        assert_eq!(f.new_channel(), 1);
        let mut z: Forwards<Session> = Forwards::new(1, TIMEOUT, 0);
        assert_eq!(z.new_channel(), 1);
    }
}
