//! The leader's side of forwarding: requests another node forwarded here run in a session of
//! their own, opened with the client's `auth` (so the same token is checked and the same
//! answer shapes negotiated) and answered back over the peer link in request order.
//!
//! One session per (peer, channel): a channel is one client session on the forwarding node.
//! Only publishes and cache operations are taken; anything else is refused, and a forward for
//! a shard this node does not lead is refused `not_leader` naming the forward.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_cluster::routing::{ForwardVerdict, RequestClass};
use felix_peer_proto::{Forward, ForwardAnswer, ForwardRefused, PeerMessage};
use felix_proto::frame::FrameDecoder;
use felix_proto::message::Message;
use felix_proto::{ErrorCode, Flags};
use quinn_proto::{ConnectionHandle, Dir, Side, StreamId};

use super::Engine;
use crate::cluster::Wired;
use crate::conn::session::{FrameResult, Session, SessionCx};
use crate::conn::ConnShared;

pub(crate) struct Virtual {
    peer: String,
    channel: u32,
    session: Session,
    shared: ConnShared,
    /// Forward ids owed an answer, in request order: answers leave in the same order.
    owed: VecDeque<u64>,
    /// Frames that arrived while the session waited for a log to open.
    queued: VecDeque<(Pending, felix_proto::frame::Frame)>,
    /// The forward whose frame the session holds stalled.
    stalled: Option<Pending>,
    last_used: Instant,
    /// The forwarding node's session ended: gone once everything it sent is answered.
    closing: bool,
}

/// A forward not yet run: checked again against the metadata when it runs.
struct Pending {
    forward_id: u64,
    scope: felix_peer_proto::ShardScope,
    answered: bool,
}

impl Virtual {
    fn idle(&self) -> bool {
        self.owed.is_empty() && self.queued.is_empty() && self.session.all_answered()
    }
}

#[derive(Default)]
pub(crate) struct Forwarded {
    by_handle: BTreeMap<ConnectionHandle, Virtual>,
    by_channel: BTreeMap<(String, u32), ConnectionHandle>,
    next: usize,
}

/// The stream id every virtual session answers as (each has a handle of its own).
fn virtual_stream() -> StreamId {
    StreamId::new(Side::Client, Dir::Bi, 0)
}

fn decode(frame: &Bytes) -> Option<felix_proto::frame::Frame> {
    let mut d = FrameDecoder::new(u32::MAX);
    d.feed_bytes(frame.clone());
    d.next_frame().ok().flatten().filter(|_| d.buffered() == 0)
}

/// Whether a forwarded frame is one a leader takes, and whether it is owed an answer.
fn classify(frame: &felix_proto::frame::Frame) -> Option<bool> {
    if frame.flags.contains(Flags::BINARY_PUBLISH_BATCH) {
        return Some(frame.flags.contains(Flags::BINARY_PUBLISH_ACKED));
    }
    if !frame.flags.is_empty() {
        return None;
    }
    let msg = Message::decode(&frame.payload).ok()?;
    let t = crate::conn::session::routing_target(&msg)?;
    matches!(t.0, RequestClass::Publish | RequestClass::CacheOp).then_some(t.1)
}

impl Forwarded {
    pub(crate) fn contains(&self, ch: ConnectionHandle) -> bool {
        self.by_handle.contains_key(&ch)
    }

    /// Virtual sessions open now.
    pub(crate) fn len(&self) -> usize {
        self.by_handle.len()
    }

    fn remove(&mut self, ch: ConnectionHandle) {
        if let Some(v) = self.by_handle.remove(&ch) {
            self.by_channel.remove(&(v.peer, v.channel));
        }
    }
}

impl Engine {
    /// Runs what the cluster has for the engine: answers to forwards this node sent, and
    /// forwards other nodes sent here.
    pub(super) fn cluster_work(&mut self, now: Instant) {
        for _ in 0..1024 {
            let Some(cluster) = self.core.router.driver_mut() else {
                return;
            };
            if let Some((ch, stream, id, outcome)) = cluster.poll_done() {
                if let Some(conn) = self.conns.get_mut(&ch) {
                    let reserve = self.core.limits.value_reserve;
                    conn.fill_forward(stream, id, outcome, reserve);
                }
                self.release_answers(now, vec![(ch, stream)]);
                continue;
            }
            let Some(inbound) = cluster.poll_inbound() else {
                return;
            };
            self.on_forward(now, inbound.from, inbound.forward);
        }
    }

    /// A forward this node would have to refuse as routed by a leadership since ended here
    /// and begun again ([`ForwardVerdict::Outdated`]).
    fn outdated(&self, scope: &felix_peer_proto::ShardScope) -> bool {
        self.core
            .router
            .driver()
            .is_some_and(|c| c.judge_forward(scope) == ForwardVerdict::Outdated)
    }

    fn refuse_forward(&mut self, now: Instant, from: &str, forward_id: u64, code: ErrorCode) {
        if let Some(c) = self.core.router.driver_mut() {
            let refused = ForwardRefused {
                forward_id,
                code,
                leader: None,
            };
            c.answer(now, from, PeerMessage::ForwardRefused(refused));
        }
    }

    /// Forwards that waited for this node's metadata: all run again once it changed (each
    /// waits again if still ahead of it), else those past their wait are refused
    /// `shard_unavailable` (the forwarding node has answered its client by then).
    pub(super) fn resume_forwards_awaiting_metadata(&mut self, now: Instant, changed: bool) {
        if self.core.forwards_awaiting_metadata.is_empty() {
            return;
        }
        if changed {
            let parked = std::mem::take(&mut self.core.forwards_awaiting_metadata);
            for (_, from, forward) in parked {
                self.on_forward(now, from, forward);
            }
            return;
        }
        while let Some((at, _, _)) = self.core.forwards_awaiting_metadata.front() {
            if *at > now {
                break;
            }
            let (_, from, forward) = self
                .core
                .forwards_awaiting_metadata
                .pop_front()
                .expect("checked");
            self.refuse_forward(now, &from, forward.forward_id, ErrorCode::ShardUnavailable);
        }
    }

    fn on_forward(&mut self, now: Instant, from: String, forward: Forward) {
        let channel = (forward.forward_id >> 32) as u32;
        let opening = forward.forward_id & 0xffff_ffff == 0;
        if opening && forward.frame.is_empty() {
            // The client session behind the channel ended.
            self.close_channel(&(from, channel));
            return;
        }
        let Some(frame) = decode(&forward.frame) else {
            if !opening {
                self.refuse_forward(now, &from, forward.forward_id, ErrorCode::InvalidRequest);
            }
            return;
        };
        let key = (from.clone(), channel);
        if opening {
            let ch = self.open_channel(now, key, frame);
            self.drain_virtual(now, ch);
            return;
        }
        let Some(&ch) = self.forwarded.by_channel.get(&key) else {
            self.refuse_forward(now, &from, forward.forward_id, ErrorCode::Unauthenticated);
            return;
        };
        let Some(answered) = classify(&frame) else {
            self.refuse_forward(now, &from, forward.forward_id, ErrorCode::InvalidRequest);
            return;
        };
        let verdict = self
            .core
            .router
            .driver()
            .map_or(ForwardVerdict::NotLeader, |c| {
                c.judge_forward(&forward.scope)
            });
        if verdict == ForwardVerdict::Outdated {
            if answered {
                self.refuse_forward(now, &from, forward.forward_id, ErrorCode::NotLeader);
            }
            return;
        }
        // A forward behind one of its channel's that waits for metadata waits too, whatever
        // the metadata now says: run first, it would overtake the older one once that runs.
        let queued_behind = self
            .core
            .forwards_awaiting_metadata
            .iter()
            .any(|(_, f, w)| *f == from && (w.forward_id >> 32) as u32 == channel);
        if verdict != ForwardVerdict::Serve || queued_behind {
            let behind = queued_behind || verdict == ForwardVerdict::AwaitMetadata;
            // Bounded by what the peers may have in flight here (`limits.forward_window` each).
            let cap = self
                .core
                .router
                .driver()
                .map_or(0, |c| c.forward_window() * c.peer_count());
            if behind && self.core.forwards_awaiting_metadata.len() < cap {
                let deadline = now
                    + self
                        .core
                        .router
                        .driver()
                        .map_or(Duration::ZERO, |c| c.forward_timeout());
                self.core
                    .forwards_awaiting_metadata
                    .push_back((deadline, from, forward));
                return;
            }
            if answered {
                self.refuse_forward(now, &from, forward.forward_id, ErrorCode::NotLeader);
            }
            return;
        }
        let v = self.forwarded.by_handle.get_mut(&ch).expect("indexed");
        if !v.session.is_authenticated() {
            if answered {
                self.refuse_forward(now, &from, forward.forward_id, ErrorCode::Unauthenticated);
            }
            return;
        }
        v.last_used = now;
        self.core.stats.forwards_served += 1;
        if answered {
            v.owed.push_back(forward.forward_id);
        }
        let pending = Pending {
            forward_id: forward.forward_id,
            scope: forward.scope,
            answered,
        };
        if v.session.is_stalled() || !v.queued.is_empty() {
            v.queued.push_back((pending, frame));
            return;
        }
        self.run_virtual(now, ch, frame, Some(pending));
        self.drain_virtual(now, ch);
    }

    fn open_channel(
        &mut self,
        now: Instant,
        key: (String, u32),
        auth: felix_proto::frame::Frame,
    ) -> ConnectionHandle {
        if let Some(&old) = self.forwarded.by_channel.get(&key) {
            // Opened again (the forwarding node restarted its count): start afresh.
            self.forwarded.by_handle.remove(&old);
            self.forwarded.by_channel.remove(&key);
        }
        let cap = self
            .core
            .router
            .driver()
            .map_or(usize::MAX, |c| c.max_forward_channels);
        if self.forwarded.by_handle.len() >= cap {
            let idle = self
                .forwarded
                .by_handle
                .iter()
                .filter(|(_, v)| v.idle())
                .min_by_key(|(_, v)| v.last_used)
                .map(|(ch, _)| *ch);
            if let Some(ch) = idle {
                // Its forwarding node reopens it on the next forward it sends.
                self.forwarded.remove(ch);
            }
        }
        // Handles from the top of the range: quinn numbers real connections from zero.
        self.forwarded.next += 1;
        let ch = ConnectionHandle(usize::MAX - self.forwarded.next);
        let v = Virtual {
            peer: key.0.clone(),
            channel: key.1,
            session: Session::new(self.core.limits.preauth_max_frame_bytes),
            shared: ConnShared::new(now),
            owed: VecDeque::new(),
            queued: VecDeque::new(),
            stalled: None,
            last_used: now,
            closing: false,
        };
        self.forwarded.by_handle.insert(ch, v);
        self.forwarded.by_channel.insert(key, ch);
        self.run_virtual(now, ch, auth, None);
        if let Some(v) = self.forwarded.by_handle.get_mut(&ch) {
            // The auth answer stays here: the forwarding node already answered its client.
            v.session.outbox.clear();
        }
        ch
    }

    /// Closes a channel whose client session ended, at once if nothing of it is pending,
    /// else once its last answer has gone.
    fn close_channel(&mut self, key: &(String, u32)) {
        let Some(&ch) = self.forwarded.by_channel.get(key) else {
            return;
        };
        let v = self.forwarded.by_handle.get_mut(&ch).expect("indexed");
        if v.idle() {
            self.forwarded.remove(ch);
        } else {
            v.closing = true;
        }
    }

    /// Runs one forwarded frame (`pending` names its forward; none for the channel's `auth`).
    fn run_virtual(
        &mut self,
        now: Instant,
        ch: ConnectionHandle,
        frame: felix_proto::frame::Frame,
        pending: Option<Pending>,
    ) {
        let Some(v) = self.forwarded.by_handle.get_mut(&ch) else {
            return;
        };
        let mut cx = SessionCx {
            now,
            core: &mut self.core,
            conn: &mut v.shared,
            ch,
            stream: virtual_stream(),
        };
        cx.core.forwarding_here = true;
        let result = v.session.on_frame(frame, &mut cx);
        cx.core.forwarding_here = false;
        self.core.metrics.absorb(&mut v.session.raised);
        if result == FrameResult::Stall {
            // Run again on `Opened`, or once what it waits for (a lease, a fence) is done.
            v.stalled = pending;
        }
    }

    /// Sends what a virtual session has answered, each with the forward it answers.
    fn drain_virtual(&mut self, now: Instant, ch: ConnectionHandle) {
        let Some(v) = self.forwarded.by_handle.get_mut(&ch) else {
            return;
        };
        v.session.release_held(&self.core);
        // A held write refused on its release (`quorum_timeout`) is counted as sent.
        self.core.metrics.absorb(&mut v.session.raised);
        let mut answers = Vec::new();
        while let Some(frame) = v.session.outbox.pop_front() {
            match v.owed.pop_front() {
                Some(forward_id) => answers.push(ForwardAnswer { forward_id, frame }),
                // An answer nobody is owed (it cannot be matched): dropped.
                None => continue,
            }
        }
        let peer = v.peer.clone();
        if v.closing && v.idle() {
            self.forwarded.remove(ch);
        }
        if let Some(c) = self.core.router.driver_mut() {
            for a in answers {
                c.answer(now, &peer, PeerMessage::ForwardAnswer(a));
            }
        }
    }

    /// A log a virtual session waited on has news: release, or re-run what stalled.
    pub(super) fn wake_virtual(&mut self, now: Instant, ch: ConnectionHandle, resume: bool) {
        if resume {
            loop {
                let Some(v) = self.forwarded.by_handle.get_mut(&ch) else {
                    return;
                };
                let (pending, next) = match v.session.take_stalled() {
                    Some(f) => (v.stalled.take(), f),
                    None => match v.queued.pop_front() {
                        Some((p, f)) => (Some(p), f),
                        None => break,
                    },
                };
                // Held while this node was not ready: its leadership may have ended and begun
                // again at a later generation since.
                if let Some(p) = pending.as_ref().filter(|p| self.outdated(&p.scope)) {
                    let v = self.forwarded.by_handle.get_mut(&ch).expect("looked up");
                    if p.answered {
                        v.owed.retain(|id| *id != p.forward_id);
                        let peer = v.peer.clone();
                        self.refuse_forward(now, &peer, p.forward_id, ErrorCode::NotLeader);
                    }
                    continue;
                }
                self.run_virtual(now, ch, next, pending);
                if self
                    .forwarded
                    .by_handle
                    .get(&ch)
                    .is_some_and(|v| v.session.is_stalled())
                {
                    break;
                }
            }
        }
        self.drain_virtual(now, ch);
    }

    pub(super) fn fill_virtual_value(
        &mut self,
        ch: ConnectionHandle,
        log: felix_storage::ops::LogId,
        ticket: felix_storage::log::ReadTicket,
        value: Result<Option<Bytes>, String>,
    ) {
        if let Some(v) = self.forwarded.by_handle.get_mut(&ch) {
            v.session.fill_value(log, ticket, value);
        }
    }
}
