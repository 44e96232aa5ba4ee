//! One QUIC connection: its quinn-proto state machine, the Felix session on each client
//! bidirectional stream, and the event stream (broker-opened uni stream) of each subscription.

pub(crate) mod session;

use core::net::IpAddr;
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use bytes::Bytes;
use felix_proto::FrameDecoder;
use quinn_proto::{
    ConnectionHandle, Dir, Event, ReadError, StreamEvent, StreamId, VarInt, WriteError,
};
use tracing::{debug, trace};

use crate::broker::{Delivery, SubscriberId};
use crate::node::Core;
use session::{FrameResult, NewSubscription, Session, SessionCx};

/// Application error code on STOP_SENDING / RESET_STREAM after a protocol error.
const STREAM_CODE_PROTOCOL: VarInt = VarInt::from_u32(1);

/// QUIC application close code: broker shutting down, or an idle connection reaped.
pub(crate) const CLOSE_CODE_NORMAL: VarInt = VarInt::from_u32(0);
/// QUIC application close code: no stream authenticated in time.
pub(crate) const CLOSE_CODE_AUTH_TIMEOUT: VarInt = VarInt::from_u32(1);

/// Connection-wide state a session may read or change.
pub(crate) struct ConnShared {
    /// Some stream on this connection has authenticated.
    pub(crate) authenticated: bool,
    /// Last Felix frame in either direction.
    pub(crate) last_activity: Instant,
    /// Subscriptions granted on this connection (event stream open or waiting to open).
    pub(crate) subscriptions: usize,
    /// Subscriptions granted during this turn whose event stream is not open yet.
    pub(crate) new_subscriptions: Vec<NewSubscription>,
    /// This connection's number for consumer-group reclaims (newer is larger), once it polls.
    pub(crate) group_serial: Option<u64>,
}

impl ConnShared {
    pub(crate) fn new(now: Instant) -> ConnShared {
        ConnShared {
            authenticated: false,
            last_activity: now,
            subscriptions: 0,
            new_subscriptions: Vec::new(),
            group_serial: None,
        }
    }
}

/// A subscription's event stream.
struct EventStream {
    subscriber: SubscriberId,
    /// One frame (or the unwritten rest of one) that the stream could not take yet. Frames
    /// are popped from the broker only when this is empty, so none is ever lost.
    pending: Option<Bytes>,
    /// The broker handed over its last frame: finish the stream once it is written.
    last: bool,
    /// `finish()` was called; waiting for the peer to acknowledge.
    finished: bool,
}

pub(crate) struct Conn {
    pub(crate) quic: quinn_proto::Connection,
    pub(crate) shared: ConnShared,
    sessions: BTreeMap<StreamId, Session>,
    events: BTreeMap<StreamId, EventStream>,
    /// Sessions that forwarded to other nodes and have ended, for the engine to close
    /// their channels.
    pub(crate) ended_forwarding: Vec<StreamId>,
    /// Granted subscriptions waiting for the peer to allow another uni stream.
    waiting_for_stream: VecDeque<NewSubscription>,
    /// Bytes of partial frames held in this connection's session decoders.
    buffered_bytes: usize,
    /// The part of `buffered_bytes` already counted in the broker-wide total.
    reported_bytes: usize,
    /// Streams not read because `buffered_bytes` is over budget; read again when it drops.
    starved: Vec<StreamId>,
    /// The address the connection was accepted from (its per-IP slot).
    pub(crate) peer_ip: IpAddr,
    /// Bytes of answers every session holds unwritten (`Session::unwritten_bytes`, summed).
    unwritten_bytes: usize,
    /// Sessions not read because `unwritten_bytes` reached its budget.
    paused_for_answers: Vec<StreamId>,
    pub(crate) created: Instant,
    /// `close()` was called (by us) or the connection was lost.
    pub(crate) closing: bool,
    /// quinn-proto reported the connection drained; remove it.
    pub(crate) drained: bool,
    /// In the engine's `touched` list this turn.
    pub(crate) touched: bool,
    /// Given events to deliver this turn: its transmits go ahead of the turn's answers.
    pub(crate) delivering: bool,
    /// In the engine's transmit queue.
    pub(crate) queued: bool,
    /// The deadline registered in the engine's timer index.
    pub(crate) deadline: Option<Instant>,
}

impl Conn {
    pub(crate) fn new(quic: quinn_proto::Connection, now: Instant, peer_ip: IpAddr) -> Conn {
        Conn {
            quic,
            shared: ConnShared::new(now),
            sessions: BTreeMap::new(),
            events: BTreeMap::new(),
            ended_forwarding: Vec::new(),
            waiting_for_stream: VecDeque::new(),
            buffered_bytes: 0,
            reported_bytes: 0,
            starved: Vec::new(),
            peer_ip,
            unwritten_bytes: 0,
            paused_for_answers: Vec::new(),
            created: now,
            closing: false,
            drained: false,
            touched: false,
            delivering: false,
            queued: false,
            deadline: None,
        }
    }

    /// The next instant this connection needs a timeout: quinn's own timers, the
    /// authentication deadline, and the idle reap.
    pub(crate) fn next_deadline(&mut self, core: &Core) -> Option<Instant> {
        let quic = self.quic.poll_timeout();
        if self.closing {
            return quic;
        }
        let limits = &core.limits;
        let auth = (!self.shared.authenticated && !limits.auth_timeout.is_zero())
            .then(|| self.created + limits.auth_timeout);
        let reap = (self.shared.subscriptions == 0 && !limits.idle_connection_reap.is_zero())
            .then(|| self.shared.last_activity + limits.idle_connection_reap);
        [quic, auth, reap].into_iter().flatten().min()
    }

    /// Runs quinn's timers and the Felix ones (authentication timeout, idle reap; a zero
    /// duration disables either).
    pub(crate) fn handle_timeout(&mut self, now: Instant, core: &mut Core) {
        self.quic.handle_timeout(now);
        if self.closing {
            return;
        }
        let limits = core.limits;
        if !self.shared.authenticated
            && !limits.auth_timeout.is_zero()
            && now >= self.created + limits.auth_timeout
        {
            debug!(remote = %self.quic.remote_address(), "no stream authenticated in time");
            self.close(now, CLOSE_CODE_AUTH_TIMEOUT, "authentication timeout", core);
        } else if self.shared.subscriptions == 0
            && !limits.idle_connection_reap.is_zero()
            && now >= self.shared.last_activity + limits.idle_connection_reap
        {
            debug!(remote = %self.quic.remote_address(), "reaping idle connection");
            self.close(now, CLOSE_CODE_NORMAL, "idle", core);
        }
    }

    /// Closes the connection with an application code and forgets its sessions and
    /// subscriptions (quinn reports no loss for a close of our own).
    pub(crate) fn close(
        &mut self,
        now: Instant,
        code: VarInt,
        reason: &'static str,
        core: &mut Core,
    ) {
        if !self.closing {
            self.closing = true;
            self.quic
                .close(now, code, Bytes::from_static(reason.as_bytes()));
            self.release(core);
        }
    }

    /// Forgets every subscription on this connection (it closed or was lost).
    pub(crate) fn release(&mut self, core: &mut Core) {
        for (_, ev) in std::mem::take(&mut self.events) {
            core.unsubscribe(ev.subscriber);
        }
        for sub in std::mem::take(&mut self.waiting_for_stream) {
            core.unsubscribe(sub.subscriber);
        }
        for sub in std::mem::take(&mut self.shared.new_subscriptions) {
            core.unsubscribe(sub.subscriber);
        }
        self.shared.subscriptions = 0;
        self.sessions.clear();
        self.buffered_bytes = 0;
        self.sync_buffered(core);
        self.starved.clear();
        self.unwritten_bytes = 0;
        self.paused_for_answers.clear();
    }

    /// Handles one application event from quinn. Returns nothing; all effects are on
    /// streams (to transmit) and on `core` (the broker).
    pub(crate) fn on_event(
        &mut self,
        now: Instant,
        ch: ConnectionHandle,
        ev: Event,
        core: &mut Core,
    ) {
        match ev {
            Event::HandshakeDataReady => {}
            Event::Connected => {
                debug!(remote = %self.quic.remote_address(), "connection established");
            }
            Event::ConnectionLost { reason } => {
                debug!(remote = %self.quic.remote_address(), %reason, "connection lost");
                self.closing = true;
                self.release(core);
            }
            Event::Stream(StreamEvent::Opened { dir: Dir::Bi }) => {
                while let Some(id) = self.quic.streams().accept(Dir::Bi) {
                    core.stats.streams_accepted += 1;
                    let unauthenticated = self
                        .sessions
                        .values()
                        .filter(|s| !s.is_authenticated())
                        .count();
                    if unauthenticated >= core.limits.preauth_max_streams_per_connection {
                        // Refuse the stream outright: each one costs a decoder until it
                        // authenticates, and honest clients authenticate one at a time.
                        debug!(%id, "too many unauthenticated streams; refusing one");
                        let _ = self.quic.recv_stream(id).stop(STREAM_CODE_PROTOCOL);
                        let _ = self.quic.send_stream(id).reset(STREAM_CODE_PROTOCOL);
                        continue;
                    }
                    self.sessions
                        .insert(id, Session::new(core.limits.preauth_max_frame_bytes));
                    self.read_session(now, ch, id, core);
                }
            }
            Event::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                // We grant no uni streams; refuse any that slip through.
                while let Some(id) = self.quic.streams().accept(Dir::Uni) {
                    let _ = self.quic.recv_stream(id).stop(STREAM_CODE_PROTOCOL);
                }
            }
            Event::Stream(StreamEvent::Readable { id }) => self.read_session(now, ch, id, core),
            Event::Stream(StreamEvent::Writable { id }) => {
                if self.sessions.contains_key(&id) {
                    self.flush_session(now, ch, id, core);
                } else if self.events.contains_key(&id) {
                    self.pump_events(now, id, core);
                }
            }
            Event::Stream(StreamEvent::Finished { id }) => {
                if let Some(s) = self.sessions.get_mut(&id) {
                    s.send_done = true;
                    self.maybe_forget_session(id, core.limits.value_reserve);
                } else if let Some(ev) = self.events.remove(&id) {
                    self.end_subscription(ev, core);
                }
            }
            Event::Stream(StreamEvent::Stopped { id, error_code }) => {
                if let Some(s) = self.sessions.get_mut(&id) {
                    // No answer can be written any more, but requests already sent still
                    // count: a subscribe whose STOP_SENDING overtook it (quinn puts control
                    // frames before stream data) must still open its event stream. So the
                    // stream is read to its end; answers are dropped.
                    trace!(%id, %error_code, "client stopped a session stream");
                    s.send_done = true;
                    self.unwritten_bytes -= s.unwritten_bytes(core.limits.value_reserve);
                    s.drop_answers();
                    // quinn frees a stopped send half (and the peer's stream credit) only
                    // once the application resets it.
                    let _ = self.quic.send_stream(id).reset(error_code);
                    if s.paused {
                        s.paused = false;
                        self.read_session(now, ch, id, core);
                    }
                    self.maybe_forget_session(id, core.limits.value_reserve);
                } else if let Some(ev) = self.events.remove(&id) {
                    trace!(%id, %error_code, "client stopped an event stream");
                    let _ = self.quic.send_stream(id).reset(error_code);
                    self.end_subscription(ev, core);
                }
            }
            Event::Stream(StreamEvent::Available { dir: Dir::Uni }) => {
                self.open_event_streams(now, ch, core);
            }
            Event::Stream(StreamEvent::Available { dir: Dir::Bi }) => {}
            Event::DatagramReceived | Event::DatagramsUnblocked => {}
        }
    }

    fn end_subscription(&mut self, ev: EventStream, core: &mut Core) {
        core.unsubscribe(ev.subscriber);
        self.shared.subscriptions = self.shared.subscriptions.saturating_sub(1);
    }

    fn maybe_forget_session(&mut self, id: StreamId, value_reserve: usize) {
        if self
            .sessions
            .get(&id)
            .is_some_and(|s| s.recv_done && s.send_done)
        {
            if let Some(s) = self.sessions.remove(&id) {
                if s.has_forwarded() {
                    // Its forward channels are closed on the leaders (Engine::process_conn).
                    self.ended_forwarding.push(id);
                }
                self.buffered_bytes -= s.decoder.buffered();
                // Whatever it still held (nothing, normally) goes with it.
                self.unwritten_bytes -= s.unwritten_bytes(value_reserve);
            }
        }
    }

    /// Reads sessions paused for the connection's answer budget once it has room again
    /// (answers written on any stream free it).
    pub(crate) fn resume_paused_for_answers(
        &mut self,
        now: Instant,
        ch: ConnectionHandle,
        core: &mut Core,
    ) -> bool {
        if self.paused_for_answers.is_empty()
            || self.unwritten_bytes >= core.limits.max_connection_unwritten_bytes
        {
            return false;
        }
        let mut resumed = false;
        for id in std::mem::take(&mut self.paused_for_answers) {
            let Some(session) = self.sessions.get_mut(&id) else {
                continue;
            };
            if session.paused && session.backlog() < core.limits.stream_answer_backlog {
                session.paused = false;
                resumed = true;
                self.read_session(now, ch, id, core);
            }
        }
        resumed
    }

    /// Brings the broker-wide total of partly received bytes up to date with this
    /// connection's.
    pub(crate) fn sync_buffered(&mut self, core: &mut Core) {
        core.buffered_bytes = core.buffered_bytes + self.buffered_bytes - self.reported_bytes;
        self.reported_bytes = self.buffered_bytes;
    }

    /// Streams are held back for the buffer budget.
    pub(crate) fn has_starved(&self) -> bool {
        !self.starved.is_empty()
    }

    /// Reads streams that were held back by the buffer budgets, if there is room again.
    /// Called once the connection's events of a turn are handled, and by the engine when
    /// the broker-wide total drops.
    pub(crate) fn resume_starved(&mut self, now: Instant, ch: ConnectionHandle, core: &mut Core) {
        self.sync_buffered(core);
        if self.starved.is_empty() || over_budget(self.buffered_bytes, core) {
            return;
        }
        for id in std::mem::take(&mut self.starved) {
            self.read_session(now, ch, id, core);
        }
    }

    /// Decodes and handles what the stream holds, one chunk at a time, until it is drained,
    /// finished, or its unwritten answers reach the window; writes the answers; and goes on
    /// reading while writing makes room again.
    pub(crate) fn read_session(
        &mut self,
        now: Instant,
        ch: ConnectionHandle,
        id: StreamId,
        core: &mut Core,
    ) {
        loop {
            self.read_until_blocked(now, ch, id, core);
            self.open_new_event_streams(now, ch, core);
            if !self.write_answers(now, id, core) {
                return;
            }
        }
    }

    /// Called when the stream can take more: writes answers, and resumes reading a stream
    /// that was paused on its window.
    pub(crate) fn flush_session(
        &mut self,
        now: Instant,
        ch: ConnectionHandle,
        id: StreamId,
        core: &mut Core,
    ) {
        if self.write_answers(now, id, core) {
            self.read_session(now, ch, id, core);
        }
    }

    /// Answers held for durability on this stream may go now: writes them, and reads on if
    /// that reopened the window.
    pub(crate) fn release_held(
        &mut self,
        now: Instant,
        ch: ConnectionHandle,
        id: StreamId,
        core: &mut Core,
    ) {
        let Some(session) = self.sessions.get_mut(&id) else {
            return;
        };
        let reserve = core.limits.value_reserve;
        let before = session.unwritten_bytes(reserve);
        let moved = session.release_held(core);
        // A held write refused on its release (`quorum_timeout`) is counted as sent.
        core.metrics.absorb(&mut session.raised);
        self.unwritten_bytes = self.unwritten_bytes + session.unwritten_bytes(reserve) - before;
        if moved {
            self.flush_session(now, ch, id, core);
        }
    }

    /// A cache read a held answer on `id` waited for has its value.
    /// The answer (or refusal) to a request this connection's session forwarded.
    pub(crate) fn fill_forward(
        &mut self,
        id: StreamId,
        forward_id: u64,
        outcome: crate::router::ForwardOutcome,
        value_reserve: usize,
    ) {
        if let Some(session) = self.sessions.get_mut(&id) {
            let before = session.unwritten_bytes(value_reserve);
            session.fill_forward(forward_id, outcome);
            self.unwritten_bytes =
                self.unwritten_bytes + session.unwritten_bytes(value_reserve) - before;
        }
    }

    pub(crate) fn fill_value(
        &mut self,
        id: StreamId,
        log: felix_storage::ops::LogId,
        ticket: felix_storage::log::ReadTicket,
        value: Result<Option<Bytes>, String>,
        value_reserve: usize,
    ) {
        if let Some(session) = self.sessions.get_mut(&id) {
            let before = session.unwritten_bytes(value_reserve);
            session.fill_value(log, ticket, value);
            self.unwritten_bytes =
                self.unwritten_bytes + session.unwritten_bytes(value_reserve) - before;
        }
    }

    /// A group poll a held answer on `id` waited for is answered.
    pub(crate) fn fill_group(
        &mut self,
        id: StreamId,
        waiter: u64,
        result: Result<Vec<crate::broker::groups::PolledRecord>, crate::broker::BrokerError>,
        value_reserve: usize,
    ) {
        if let Some(session) = self.sessions.get_mut(&id) {
            let before = session.unwritten_bytes(value_reserve);
            session.fill_group(waiter, result);
            self.unwritten_bytes =
                self.unwritten_bytes + session.unwritten_bytes(value_reserve) - before;
        }
    }

    /// The log a stalled request waited for is open (or failed): runs the request again,
    /// then reads on.
    pub(crate) fn resume_stalled(
        &mut self,
        now: Instant,
        ch: ConnectionHandle,
        id: StreamId,
        core: &mut Core,
    ) {
        let Some(session) = self.sessions.get_mut(&id) else {
            return;
        };
        let Some(frame) = session.take_stalled() else {
            return;
        };
        let reserve = core.limits.value_reserve;
        let before = session.unwritten_bytes(reserve);
        let mut cx = SessionCx {
            now,
            core,
            conn: &mut self.shared,
            ch,
            stream: id,
        };
        let result = session.on_frame(frame, &mut cx);
        core.metrics.absorb(&mut session.raised);
        self.unwritten_bytes = self.unwritten_bytes + session.unwritten_bytes(reserve) - before;
        match result {
            FrameResult::Stall => return,
            FrameResult::CloseStream => self.stop_reading(id),
            FrameResult::Continue => {}
        }
        self.read_session(now, ch, id, core);
    }

    /// A request closed the stream: whatever follows it is never read.
    fn stop_reading(&mut self, id: StreamId) {
        let Some(session) = self.sessions.get_mut(&id) else {
            return;
        };
        self.buffered_bytes -= session.decoder.buffered();
        session.decoder = FrameDecoder::new(0);
        session.recv_done = true;
        session.finish_when_flushed = true;
        let _ = self.quic.recv_stream(id).stop(STREAM_CODE_PROTOCOL);
    }

    fn read_until_blocked(
        &mut self,
        now: Instant,
        ch: ConnectionHandle,
        id: StreamId,
        core: &mut Core,
    ) {
        let window = core.limits.stream_answer_backlog;
        let chunk_limit = core.limits.read_chunk_bytes;
        let answer_budget = core.limits.max_connection_unwritten_bytes;
        let reserve = core.limits.value_reserve;
        let Some(session) = self.sessions.get_mut(&id) else {
            return;
        };
        while !session.recv_done && !session.is_stalled() {
            // Frames already buffered first: they were read before the window filled.
            let held_before = session.decoder.buffered();
            let mut close = false;
            let mut stalled = false;
            loop {
                if session.backlog() >= window {
                    session.paused = true;
                    break;
                }
                if self.unwritten_bytes >= answer_budget {
                    // The connection holds its budget of unwritten answers: read on only
                    // once they drain (whichever stream's they are).
                    session.paused = true;
                    if !self.paused_for_answers.contains(&id) {
                        self.paused_for_answers.push(id);
                    }
                    break;
                }
                let frame = match session.decoder.next_frame() {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(err) => {
                        let before = session.unwritten_bytes(reserve);
                        session.on_decode_error(err);
                        self.unwritten_bytes =
                            self.unwritten_bytes + session.unwritten_bytes(reserve) - before;
                        close = true;
                        break;
                    }
                };
                self.shared.last_activity = now;
                core.stats.frames_received += 1;
                let before = session.unwritten_bytes(reserve);
                let mut cx = SessionCx {
                    now,
                    core,
                    conn: &mut self.shared,
                    ch,
                    stream: id,
                };
                let result = session.on_frame(frame, &mut cx);
                self.unwritten_bytes =
                    self.unwritten_bytes + session.unwritten_bytes(reserve) - before;
                match result {
                    FrameResult::Continue => {}
                    FrameResult::CloseStream => {
                        close = true;
                        break;
                    }
                    FrameResult::Stall => {
                        stalled = true;
                        break;
                    }
                }
            }
            self.buffered_bytes -= held_before - session.decoder.buffered();
            core.metrics.absorb(&mut session.raised);
            core.buffered_bytes = core.buffered_bytes + self.buffered_bytes - self.reported_bytes;
            self.reported_bytes = self.buffered_bytes;
            if close {
                // Whatever follows the bad frame is never read.
                self.stop_reading(id);
                return;
            }
            if session.paused || stalled {
                return;
            }
            // Over the connection's budget, a stream holding part of a frame waits: reading
            // on would only grow it. Streams between frames still read, so small requests
            // keep flowing.
            if session.decoder.buffered() > 0 && over_budget(self.buffered_bytes, core) {
                // A reset must still be seen, or its bytes would hold the budget forever.
                if let Ok(Some(code)) = self.quic.recv_stream(id).received_reset() {
                    trace!(%id, %code, "client reset a held-back stream");
                    self.buffered_bytes -= session.decoder.buffered();
                    session.decoder = FrameDecoder::new(0);
                    session.recv_done = true;
                    session.finish_when_flushed = true;
                    return;
                }
                if !self.starved.contains(&id) {
                    self.starved.push(id);
                }
                core.starved_conns.insert(ch);
                return;
            }
            let mut recv = self.quic.recv_stream(id);
            let mut chunks = match recv.read(true) {
                Ok(chunks) => chunks,
                Err(_) => {
                    session.recv_done = true;
                    return;
                }
            };
            let outcome = chunks.next(chunk_limit);
            let _ = chunks.finalize();
            match outcome {
                Ok(Some(chunk)) => {
                    self.buffered_bytes += chunk.bytes.len();
                    session.decoder.feed_bytes(chunk.bytes);
                }
                Ok(None) => {
                    // The client finished its side: once the answers are written, ours is
                    // done too. A frame cut off by the FIN can never complete.
                    session.recv_done = true;
                    session.finish_when_flushed = true;
                    if session.decoder.buffered() > 0 {
                        trace!(%id, bytes = session.decoder.buffered(), "stream ended inside a frame");
                    }
                    self.buffered_bytes -= session.decoder.buffered();
                    session.decoder = FrameDecoder::new(0);
                }
                Err(ReadError::Blocked) => return,
                Err(ReadError::Reset(code)) => {
                    trace!(%id, %code, "client reset a session stream");
                    session.recv_done = true;
                    session.finish_when_flushed = true;
                    self.buffered_bytes -= session.decoder.buffered();
                    session.decoder = FrameDecoder::new(0);
                }
            }
        }
    }

    /// Writes queued answers and finishes the stream when it is done. Returns true when a
    /// stream paused on its window has room again and should be read.
    fn write_answers(&mut self, now: Instant, id: StreamId, core: &mut Core) -> bool {
        let Some(session) = self.sessions.get_mut(&id) else {
            return false;
        };
        let reserve = core.limits.value_reserve;
        let before = session.unwritten_bytes(reserve);
        if session.send_done {
            // Stopped by the client: answers have nowhere to go.
            session.drop_answers();
        } else {
            let mut send = self.quic.send_stream(id);
            while !session.outbox.is_empty() {
                let (front, _) = session.outbox.as_mut_slices();
                match send.write_chunks(front) {
                    Ok(written) => {
                        core.stats.frames_sent += written.chunks as u64;
                        session.outbox.drain(..written.chunks);
                        if written.chunks > 0 {
                            self.shared.last_activity = now;
                        }
                    }
                    Err(WriteError::Blocked) => break,
                    Err(WriteError::Stopped(code)) => {
                        let _ = send.reset(code);
                        session.send_done = true;
                        session.drop_answers();
                        break;
                    }
                    Err(WriteError::ClosedStream) => {
                        session.send_done = true;
                        session.drop_answers();
                        break;
                    }
                }
            }
            if session.all_answered() && session.finish_when_flushed && !session.finished {
                session.finished = true;
                if send.finish().is_err() {
                    session.send_done = true;
                }
            }
        }
        self.unwritten_bytes = self.unwritten_bytes + session.unwritten_bytes(reserve) - before;
        if session.paused
            && session.backlog() < core.limits.stream_answer_backlog
            && self.unwritten_bytes < core.limits.max_connection_unwritten_bytes
        {
            session.paused = false;
            return true;
        }
        self.maybe_forget_session(id, core.limits.value_reserve);
        false
    }

    /// Opens the event streams of subscriptions granted during this turn.
    fn open_new_event_streams(&mut self, now: Instant, ch: ConnectionHandle, core: &mut Core) {
        if self.shared.new_subscriptions.is_empty() {
            return;
        }
        self.waiting_for_stream
            .extend(self.shared.new_subscriptions.drain(..));
        self.open_event_streams(now, ch, core);
    }

    /// Opens event streams for waiting subscriptions while the peer allows uni streams.
    fn open_event_streams(&mut self, now: Instant, ch: ConnectionHandle, core: &mut Core) {
        while !self.waiting_for_stream.is_empty() {
            let Some(id) = self.quic.streams().open(Dir::Uni) else {
                break;
            };
            let sub = self.waiting_for_stream.pop_front().expect("front exists");
            core.routes.insert(sub.subscriber, (ch, id));
            self.events.insert(
                id,
                EventStream {
                    subscriber: sub.subscriber,
                    pending: Some(sub.hello),
                    last: false,
                    finished: false,
                },
            );
            self.pump_events(now, id, core);
        }
    }

    /// Moves a subscription's frames from the broker onto its event stream while the stream
    /// takes them.
    pub(crate) fn pump_events(&mut self, now: Instant, id: StreamId, core: &mut Core) {
        let Some(ev) = self.events.get_mut(&id) else {
            return;
        };
        let mut send = self.quic.send_stream(id);
        loop {
            if let Some(frame) = ev.pending.as_mut() {
                match send.write_chunks(std::slice::from_mut(frame)) {
                    Ok(written) if written.chunks == 1 => {
                        ev.pending = None;
                        core.stats.frames_sent += 1;
                        self.shared.last_activity = now;
                    }
                    // Partly written: the rest stays in `pending`; try again so a full
                    // window registers for a `Writable` event.
                    Ok(_) => continue,
                    Err(WriteError::Blocked) => return,
                    Err(WriteError::Stopped(code)) => {
                        let _ = send.reset(code);
                        let ev = self.events.remove(&id).expect("present");
                        self.end_subscription(ev, core);
                        return;
                    }
                    Err(WriteError::ClosedStream) => {
                        let ev = self.events.remove(&id).expect("present");
                        self.end_subscription(ev, core);
                        return;
                    }
                }
            }
            if ev.last {
                if !ev.finished {
                    ev.finished = true;
                    let _ = send.finish();
                }
                return;
            }
            match core.broker.next_delivery(ev.subscriber) {
                Some(Delivery::Frame(frame)) => ev.pending = Some(frame),
                Some(Delivery::Final(frame)) => {
                    // Empty: just finish (a deleted stream, to a client without the signal).
                    ev.pending = (!frame.is_empty()).then_some(frame);
                    ev.last = true;
                    core.routes.remove(&ev.subscriber);
                }
                None => return,
            }
        }
    }

    /// Adds what this connection holds to `usage`.
    pub(crate) fn add_usage(&self, usage: &mut crate::metrics::Usage) {
        usage.connections += 1;
        usage.sessions += self.sessions.len();
        let unauthenticated = self
            .sessions
            .values()
            .filter(|s| !s.is_authenticated())
            .count();
        usage.max_unauthenticated_per_connection = usage
            .max_unauthenticated_per_connection
            .max(unauthenticated);
        for s in self.sessions.values() {
            usage.max_session_backlog = usage.max_session_backlog.max(s.backlog());
        }
        usage.buffered_bytes += self.buffered_bytes;
        usage.max_connection_buffered_bytes =
            usage.max_connection_buffered_bytes.max(self.buffered_bytes);
        usage.max_connection_unwritten_bytes = usage
            .max_connection_unwritten_bytes
            .max(self.unwritten_bytes);
        usage.subscriptions += self.shared.subscriptions;
        usage.max_connection_subscriptions = usage
            .max_connection_subscriptions
            .max(self.shared.subscriptions);
    }

    /// Debug builds: the running total of unwritten answer bytes must match a recount.
    #[cfg(debug_assertions)]
    pub(crate) fn check_unwritten(&self, value_reserve: usize) {
        let recount: usize = self
            .sessions
            .values()
            .map(|s| s.unwritten_bytes(value_reserve))
            .sum();
        assert_eq!(
            recount, self.unwritten_bytes,
            "unwritten answer bytes drifted"
        );
    }

    /// Routes a broker readiness notice to the event stream.
    pub(crate) fn deliver(&mut self, now: Instant, id: StreamId, core: &mut Core) {
        self.pump_events(now, id, core);
    }
}

/// Whether a connection holding `conn_bytes` of partial frames must stop reading streams that
/// are in the middle of one: over its own budget, or — while the broker as a whole is over
/// its budget — over its fair share of it. A connection under its share keeps reading, so
/// connections that hoard partial frames cannot stall the others; and the share is never
/// less than one largest frame, so every connection can always complete one (were it less,
/// honest connections each midway through a large frame could wait on one another forever).
fn over_budget(conn_bytes: usize, core: &Core) -> bool {
    let limits = &core.limits;
    if conn_bytes >= limits.max_connection_buffered_bytes {
        return true;
    }
    let one_frame = limits.max_frame_bytes as usize + felix_proto::frame::HEADER_LEN;
    let share = (limits.max_buffered_bytes / core.open_connections.max(1)).max(one_frame);
    core.buffered_bytes >= limits.max_buffered_bytes && conn_bytes >= share
}
