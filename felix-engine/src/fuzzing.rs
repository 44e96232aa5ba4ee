//! A frame-level harness that drives sessions and the broker beneath QUIC, for the
//! `engine_frames` fuzz target (feature `fuzzing`, off by default: nothing in the product
//! calls it).
//!
//! The `engine` fuzz target drives a whole [`Engine`] through real QUIC and TLS, which costs
//! a handshake per input. [`FrameHarness`] skips the QUIC connection instead: it owns the
//! core (broker, verifier, capabilities, waiters) that [`Engine::new`] builds from the same
//! [`EngineConfig`], and client connections whose streams are real sessions. Client bytes go
//! straight into a session's frame decoder; what the broker writes back comes out as
//! [`Written`] items; file operations come out for the caller to perform, in any order; time
//! passes when the caller says.
//!
//! It stands in for `conn` and the engine's turn: a stream is read frame by frame under the
//! publish window and the connection's budget of unwritten answers, granted subscriptions
//! get event streams, and every call ends with the engine's end-of-turn work (broker flush,
//! log notices, deliveries). QUIC is modelled as a client that takes every answer and event
//! at once unless told to stop reading; flow control, loss and the budget of partly received
//! frames stay the `engine` target's to cover.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use felix_proto::FrameDecoder;
use quinn_proto::{ConnectionHandle, Dir, Side, StreamId};

use crate::broker::{Delivery, Notice, StreamKey, SubscriberId};
use crate::conn::session::{FrameResult, Session, SessionCx};
use crate::conn::ConnShared;
use crate::metrics::{Stats, Usage};
use crate::node::Core;
use crate::{DeleteStreamError, Engine, EngineConfig, EngineError, FileCompletion, FileOp};

/// Rounds of storage work and resumed reads within one call (the engine's turn has the same
/// bound on storage rounds).
const MAX_TURN_ROUNDS: usize = 16;
/// Read-and-write rounds of one stream within a call; each round moves at least one frame.
const MAX_STREAM_ROUNDS: usize = 100_000;
/// Deadlines fired one by one within one [`FrameHarness::advance`]; past them the rest of
/// the interval is one late firing, as a busy runtime would make it.
const MAX_TIMER_FIRINGS: usize = 64;

/// What a `stream_read` page not read from its log yet counts against its connection's
/// budget of unwritten answers (a full page): the most one held answer adds past the budget.
pub const UNREAD_PAGE_RESERVE: usize = crate::broker::PAGE_FRAME_RESERVE;

/// What the broker wrote back, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// One answer frame on a session stream (bidirectional stream `stream` of `conn`).
    Answer {
        conn: usize,
        stream: u64,
        frame: Bytes,
    },
    /// The broker finished its side of a session stream.
    Finished { conn: usize, stream: u64 },
    /// One frame on a subscription's event stream (`event_stream_hello` first).
    Event {
        conn: usize,
        events: u64,
        frame: Bytes,
    },
    /// The broker finished an event stream.
    EventsEnded { conn: usize, events: u64 },
    /// The broker closed a connection (authentication timeout or idle reap).
    Closed { conn: usize },
}

/// A client connection: the connection-wide state sessions share, its session streams and
/// its event streams.
struct Conn {
    shared: ConnShared,
    sessions: BTreeMap<StreamId, Stream>,
    events: BTreeMap<StreamId, Events>,
    next_bi: u64,
    next_uni: u64,
    created: Instant,
    closed: bool,
}

struct Stream {
    session: Session,
    /// Bytes the client sent that the session has not read yet (QUIC's receive buffer).
    unread: BytesMut,
    /// The client finished its side after `unread`.
    fin: bool,
    /// The client does not read answers for now: they stay in the outbox.
    blocked: bool,
}

struct Events {
    subscriber: SubscriberId,
    /// The client does not read this event stream for now: the broker's queue fills.
    blocked: bool,
}

/// A broker core and client sessions on it, driven frame by frame. See the module docs.
pub struct FrameHarness {
    core: Core,
    conns: Vec<Conn>,
    now: Instant,
    dev_token: Option<String>,
    max_bidi: usize,
    file_ops_in_flight: usize,
    max_inflight_file_ops: usize,
    written: Vec<Written>,
}

impl FrameHarness {
    /// Builds the core exactly as [`Engine::new`] does (`now` and `unix_micros` name the
    /// same moment). A durable configuration starts with recovery: perform file ops until
    /// [`is_ready`](Self::is_ready).
    pub fn new(
        config: EngineConfig,
        now: Instant,
        unix_micros: u64,
    ) -> Result<FrameHarness, EngineError> {
        let max_bidi = config.max_concurrent_bidi_streams as usize;
        let max_inflight_file_ops = config
            .durable
            .as_ref()
            .map_or(1, |d| d.max_inflight_file_ops.max(1));
        let engine = Engine::new(config, now, unix_micros)?;
        let dev_token = engine.dev_token().map(str::to_owned);
        let mut harness = FrameHarness {
            core: engine.into_core(),
            conns: Vec::new(),
            now,
            dev_token,
            max_bidi,
            file_ops_in_flight: 0,
            max_inflight_file_ops,
            written: Vec::new(),
        };
        harness.turn();
        Ok(harness)
    }

    /// The development token (dev-mode configurations only).
    pub fn dev_token(&self) -> Option<&str> {
        self.dev_token.as_deref()
    }

    /// The harness's clock.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Startup recovery is done.
    pub fn is_ready(&self) -> bool {
        self.core.broker.is_ready()
    }

    /// Why the broker must not start, if recovery failed.
    pub fn storage_error(&self) -> Option<&str> {
        self.core.broker.storage_fatal()
    }

    /// Counters, as [`Engine::stats`] keeps them.
    pub fn stats(&self) -> Stats {
        self.core.stats
    }

    /// Opens a client connection; returns its number.
    pub fn connect(&mut self) -> usize {
        self.conns.push(Conn {
            shared: ConnShared {
                authenticated: false,
                last_activity: self.now,
                subscriptions: 0,
                new_subscriptions: Vec::new(),
                group_serial: None,
            },
            sessions: BTreeMap::new(),
            events: BTreeMap::new(),
            next_bi: 0,
            next_uni: 0,
            created: self.now,
            closed: false,
        });
        self.conns.len() - 1
    }

    /// Opens a session stream on `conn`; `None` if the connection is closed, at its stream
    /// limit, or the broker refuses the stream (too many unauthenticated ones).
    pub fn open_stream(&mut self, conn: usize) -> Option<u64> {
        let limits = self.core.limits;
        let c = self.conns.get_mut(conn).filter(|c| !c.closed)?;
        if c.sessions.len() >= self.max_bidi {
            return None;
        }
        let index = c.next_bi;
        c.next_bi += 1;
        self.core.stats.streams_accepted += 1;
        let unauthenticated = c
            .sessions
            .values()
            .filter(|s| !s.session.is_authenticated())
            .count();
        if unauthenticated >= limits.preauth_max_streams_per_connection {
            return None;
        }
        c.sessions.insert(
            StreamId::new(Side::Client, Dir::Bi, index),
            Stream {
                session: Session::new(limits.preauth_max_frame_bytes),
                unread: BytesMut::new(),
                fin: false,
                blocked: false,
            },
        );
        Some(index)
    }

    /// Session streams of `conn` still open, by number.
    pub fn streams(&self, conn: usize) -> Vec<u64> {
        self.conns.get(conn).map_or_else(Vec::new, |c| {
            c.sessions.keys().map(|id| id.index()).collect()
        })
    }

    /// Event streams of `conn` still open, by number.
    pub fn event_streams(&self, conn: usize) -> Vec<u64> {
        self.conns
            .get(conn)
            .map_or_else(Vec::new, |c| c.events.keys().map(|id| id.index()).collect())
    }

    /// The client sends `bytes` on a session stream. Ignored once the client finished it
    /// or the broker stopped reading it.
    pub fn send(&mut self, conn: usize, stream: u64, bytes: &[u8]) {
        let id = bi(stream);
        if let Some(st) = self.stream_mut(conn, id) {
            if !st.fin && !st.session.recv_done {
                st.unread.extend_from_slice(bytes);
                self.read_session(conn, id);
            }
        }
        self.turn();
    }

    /// The client finishes its side of a session stream.
    pub fn finish(&mut self, conn: usize, stream: u64) {
        let id = bi(stream);
        if let Some(st) = self.stream_mut(conn, id) {
            st.fin = true;
            self.read_session(conn, id);
        }
        self.turn();
    }

    /// The client resets its side of a session stream: what the session did not read is
    /// gone, and the broker finishes once its answers are written.
    pub fn reset(&mut self, conn: usize, stream: u64) {
        let id = bi(stream);
        if let Some(st) = self.stream_mut(conn, id) {
            st.unread.clear();
            st.fin = true;
            let s = &mut st.session;
            if !s.recv_done {
                s.recv_done = true;
                s.finish_when_flushed = true;
                s.decoder = FrameDecoder::new(0);
            }
            self.flush_session(conn, id);
        }
        self.turn();
    }

    /// The client stops reading a session stream for good (STOP_SENDING): answers are
    /// dropped, requests already sent are still read.
    pub fn stop(&mut self, conn: usize, stream: u64) {
        let id = bi(stream);
        if let Some(st) = self.stream_mut(conn, id) {
            let s = &mut st.session;
            s.send_done = true;
            s.drop_answers();
            let resume = s.paused;
            s.paused = false;
            if resume {
                self.read_session(conn, id);
            }
            self.maybe_forget(conn, id);
        }
        self.turn();
    }

    /// The client stops (`true`) or resumes (`false`) reading the answers of a session
    /// stream; they queue meanwhile.
    pub fn block_answers(&mut self, conn: usize, stream: u64, blocked: bool) {
        let id = bi(stream);
        if let Some(st) = self.stream_mut(conn, id) {
            st.blocked = blocked;
            self.flush_session(conn, id);
        }
        self.turn();
    }

    /// The client stops or resumes reading an event stream.
    pub fn block_events(&mut self, conn: usize, events: u64, blocked: bool) {
        let id = uni(events);
        if let Some(ev) = self.conns.get_mut(conn).and_then(|c| c.events.get_mut(&id)) {
            ev.blocked = blocked;
            self.pump_events(conn, id);
        }
        self.turn();
    }

    /// The client drops an event stream (STOP_SENDING): the subscription ends.
    pub fn stop_events(&mut self, conn: usize, events: u64) {
        let id = uni(events);
        if let Some(c) = self.conns.get_mut(conn) {
            if let Some(ev) = c.events.remove(&id) {
                self.core.unsubscribe(ev.subscriber);
                c.shared.subscriptions = c.shared.subscriptions.saturating_sub(1);
            }
        }
        self.turn();
    }

    /// The client closes its connection: its sessions and subscriptions are forgotten.
    pub fn close(&mut self, conn: usize) {
        self.release(conn);
        self.turn();
    }

    /// Deletes a stream, as [`Engine::delete_stream`] does.
    pub fn delete_stream(
        &mut self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<(), DeleteStreamError> {
        let unix_micros = self.core.unix_micros(self.now);
        let key = StreamKey::new(tenant, namespace, stream);
        let result = self.core.broker.delete_stream(unix_micros, &key);
        self.turn();
        result.map_err(Into::into)
    }

    /// Lets `d` pass, firing every timer due on the way: the broker's, and each
    /// connection's authentication timeout and idle reap.
    pub fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        for _ in 0..MAX_TIMER_FIRINGS {
            let Some(at) = self.next_deadline().filter(|at| *at <= end) else {
                break;
            };
            self.now = self.now.max(at);
            self.fire_timers();
        }
        self.now = end;
        self.fire_timers();
    }

    /// The next file operation to perform, while fewer than the configured number are out.
    pub fn poll_file_op(&mut self) -> Option<FileOp> {
        if self.file_ops_in_flight >= self.max_inflight_file_ops {
            return None;
        }
        let op = self.core.broker.poll_file_op()?;
        self.file_ops_in_flight += 1;
        self.core.stats.file_ops += 1;
        Some(op)
    }

    /// A file operation from [`poll_file_op`](Self::poll_file_op) finished.
    pub fn handle_file_completion(&mut self, completion: FileCompletion) {
        self.file_ops_in_flight = self.file_ops_in_flight.saturating_sub(1);
        self.core
            .broker
            .handle_file_completion(self.now, completion);
        self.turn();
    }

    /// Everything written back since the last call.
    pub fn take_written(&mut self) -> Vec<Written> {
        std::mem::take(&mut self.written)
    }

    /// What the harness holds now, against the engine's limits (the fields a connection
    /// and the broker report; `buffered_bytes` counts only what session decoders hold).
    pub fn usage(&self) -> Usage {
        let reserve = self.core.limits.value_reserve;
        let mut usage = Usage::default();
        for c in self.conns.iter().filter(|c| !c.closed) {
            usage.connections += 1;
            usage.sessions += c.sessions.len();
            let unauthenticated = c
                .sessions
                .values()
                .filter(|s| !s.session.is_authenticated())
                .count();
            usage.max_unauthenticated_per_connection = usage
                .max_unauthenticated_per_connection
                .max(unauthenticated);
            let mut buffered = 0;
            let mut unwritten = 0;
            for s in c.sessions.values() {
                usage.max_session_backlog = usage.max_session_backlog.max(s.session.backlog());
                buffered += s.session.decoder.buffered();
                unwritten += s.session.unwritten_bytes(reserve);
            }
            usage.buffered_bytes += buffered;
            usage.max_connection_buffered_bytes = usage.max_connection_buffered_bytes.max(buffered);
            usage.max_connection_unwritten_bytes =
                usage.max_connection_unwritten_bytes.max(unwritten);
            usage.subscriptions += c.shared.subscriptions;
            usage.max_connection_subscriptions = usage
                .max_connection_subscriptions
                .max(c.shared.subscriptions);
        }
        (usage.max_subscriber_queue, usage.streams) = self.core.broker.queue_usage();
        usage.max_connection_event_bytes = self.core.broker.max_owner_event_bytes();
        usage
    }

    // ---- the connection's part ------------------------------------------------------------

    fn stream_mut(&mut self, conn: usize, id: StreamId) -> Option<&mut Stream> {
        self.conns.get_mut(conn)?.sessions.get_mut(&id)
    }

    /// Reads and answers a stream until it is drained, paused or stalled (`Conn::read_session`).
    fn read_session(&mut self, conn: usize, id: StreamId) {
        for _ in 0..MAX_STREAM_ROUNDS {
            self.read_until_blocked(conn, id);
            self.open_new_event_streams(conn);
            if !self.write_answers(conn, id) {
                return;
            }
        }
    }

    /// Writes answers, and reads on if that reopened the window.
    fn flush_session(&mut self, conn: usize, id: StreamId) {
        if self.write_answers(conn, id) {
            self.read_session(conn, id);
        }
    }

    fn read_until_blocked(&mut self, conn: usize, id: StreamId) {
        let now = self.now;
        let limits = self.core.limits;
        let reserve = limits.value_reserve;
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        // The connection's other sessions' share of the unwritten-answer budget.
        let others: usize = c
            .sessions
            .iter()
            .filter(|(k, _)| **k != id)
            .map(|(_, s)| s.session.unwritten_bytes(reserve))
            .sum();
        let Conn {
            shared, sessions, ..
        } = c;
        let Some(st) = sessions.get_mut(&id) else {
            return;
        };
        for _ in 0..MAX_STREAM_ROUNDS {
            let s = &mut st.session;
            if s.recv_done || s.is_stalled() {
                return;
            }
            let mut close = false;
            let mut stalled = false;
            for _ in 0..MAX_STREAM_ROUNDS {
                if s.backlog() >= limits.stream_answer_backlog
                    || others + s.unwritten_bytes(reserve) >= limits.max_connection_unwritten_bytes
                {
                    s.paused = true;
                    break;
                }
                let frame = match s.decoder.next_frame() {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(err) => {
                        s.on_decode_error(err);
                        close = true;
                        break;
                    }
                };
                shared.last_activity = now;
                self.core.stats.frames_received += 1;
                let mut cx = SessionCx {
                    now,
                    core: &mut self.core,
                    conn: shared,
                    ch: ConnectionHandle(conn),
                    stream: id,
                };
                match s.on_frame(frame, &mut cx) {
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
            self.core.metrics.absorb(&mut s.raised);
            if close {
                stop_reading(st);
                return;
            }
            if s.paused || stalled {
                return;
            }
            if st.unread.is_empty() {
                if st.fin {
                    // A frame cut off by the FIN can never complete.
                    s.recv_done = true;
                    s.finish_when_flushed = true;
                    s.decoder = FrameDecoder::new(0);
                }
                return;
            }
            let n = st.unread.len().min(limits.read_chunk_bytes);
            s.decoder.feed_bytes(st.unread.split_to(n).freeze());
        }
    }

    /// Hands queued answers to the client and finishes the stream when it is done. True
    /// when a stream paused on its window has room again and should be read.
    fn write_answers(&mut self, conn: usize, id: StreamId) -> bool {
        let limits = self.core.limits;
        let now = self.now;
        let Some(c) = self.conns.get_mut(conn) else {
            return false;
        };
        let Some(st) = c.sessions.get_mut(&id) else {
            return false;
        };
        let s = &mut st.session;
        if s.send_done {
            s.drop_answers();
        } else if !st.blocked {
            while let Some(frame) = s.outbox.pop_front() {
                self.core.stats.frames_sent += 1;
                c.shared.last_activity = now;
                self.written.push(Written::Answer {
                    conn,
                    stream: id.index(),
                    frame,
                });
            }
            if s.all_answered() && s.finish_when_flushed && !s.finished {
                // The client acknowledges the FIN at once.
                s.finished = true;
                s.send_done = true;
                self.written.push(Written::Finished {
                    conn,
                    stream: id.index(),
                });
            }
        }
        if s.paused && s.backlog() < limits.stream_answer_backlog {
            let unwritten: usize = c
                .sessions
                .values()
                .map(|s| s.session.unwritten_bytes(limits.value_reserve))
                .sum();
            if unwritten < limits.max_connection_unwritten_bytes {
                if let Some(st) = c.sessions.get_mut(&id) {
                    st.session.paused = false;
                }
                return true;
            }
        }
        self.maybe_forget(conn, id);
        false
    }

    fn maybe_forget(&mut self, conn: usize, id: StreamId) {
        if let Some(c) = self.conns.get_mut(conn) {
            if c.sessions
                .get(&id)
                .is_some_and(|s| s.session.recv_done && s.session.send_done)
            {
                c.sessions.remove(&id);
            }
        }
    }

    /// Opens an event stream for each subscription granted during this call.
    fn open_new_event_streams(&mut self, conn: usize) {
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        for sub in std::mem::take(&mut c.shared.new_subscriptions) {
            let c = &mut self.conns[conn];
            let id = uni(c.next_uni);
            c.next_uni += 1;
            self.core
                .routes
                .insert(sub.subscriber, (ConnectionHandle(conn), id));
            c.events.insert(
                id,
                Events {
                    subscriber: sub.subscriber,
                    blocked: false,
                },
            );
            self.core.stats.frames_sent += 1;
            self.written.push(Written::Event {
                conn,
                events: id.index(),
                frame: sub.hello,
            });
            self.pump_events(conn, id);
        }
    }

    /// Moves a subscription's frames from the broker to the client while it reads them.
    fn pump_events(&mut self, conn: usize, id: StreamId) {
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        let Some(ev) = c.events.get(&id) else {
            return;
        };
        if ev.blocked {
            return;
        }
        let subscriber = ev.subscriber;
        for _ in 0..MAX_STREAM_ROUNDS {
            match self.core.broker.next_delivery(subscriber) {
                Some(Delivery::Frame(frame)) => {
                    self.core.stats.frames_sent += 1;
                    c.shared.last_activity = self.now;
                    self.written.push(Written::Event {
                        conn,
                        events: id.index(),
                        frame,
                    });
                }
                Some(Delivery::Final(frame)) => {
                    if !frame.is_empty() {
                        self.core.stats.frames_sent += 1;
                        self.written.push(Written::Event {
                            conn,
                            events: id.index(),
                            frame,
                        });
                    }
                    self.written.push(Written::EventsEnded {
                        conn,
                        events: id.index(),
                    });
                    c.events.remove(&id);
                    self.core.unsubscribe(subscriber);
                    c.shared.subscriptions = c.shared.subscriptions.saturating_sub(1);
                    return;
                }
                None => return,
            }
        }
    }

    /// Forgets a connection's sessions and subscriptions (`Conn::release`).
    fn release(&mut self, conn: usize) {
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        for (_, ev) in std::mem::take(&mut c.events) {
            self.core.unsubscribe(ev.subscriber);
        }
        for sub in std::mem::take(&mut c.shared.new_subscriptions) {
            self.core.unsubscribe(sub.subscriber);
        }
        c.shared.subscriptions = 0;
        c.sessions.clear();
        c.closed = true;
    }

    // ---- the engine's part ----------------------------------------------------------------

    /// Ends a call as the engine ends a turn: flushes the broker, acts on log notices,
    /// delivers events; then reads streams that have room again, until nothing moves.
    fn turn(&mut self) {
        for _ in 0..MAX_TURN_ROUNDS {
            self.core.broker.flush(self.now);
            self.handle_notices();
            while let Some(sub) = self.core.broker.poll_ready() {
                if let Some(&(ch, id)) = self.core.routes.get(&sub) {
                    self.pump_events(ch.0, id);
                }
            }
            let resumed = self.resume_paused();
            if !resumed && !self.core.broker.has_storage_work() {
                break;
            }
        }
    }

    /// Reads sessions that paused on their window or the connection's budget and have room
    /// again. True if any did.
    fn resume_paused(&mut self) -> bool {
        let mut any = false;
        for conn in 0..self.conns.len() {
            let ids: Vec<StreamId> = self.conns[conn].sessions.keys().copied().collect();
            for id in ids {
                if self
                    .stream_mut(conn, id)
                    .is_some_and(|st| st.session.paused && !st.blocked)
                    && self.write_answers(conn, id)
                {
                    self.read_session(conn, id);
                    any = true;
                }
            }
        }
        any
    }

    /// `Engine::handle_notices`, on the harness's sessions.
    fn handle_notices(&mut self) {
        while let Some(notice) = self.core.broker.poll_notice() {
            match notice {
                Notice::Durable { log, up_to } => {
                    let mut ready = Vec::new();
                    if let Some(q) = self.core.waiters.get_mut(&log) {
                        while q.front().is_some_and(|&(end, _, _)| end <= up_to) {
                            let (_, ch, stream) = q.pop_front().expect("front exists");
                            if ready.last() != Some(&(ch, stream)) {
                                ready.push((ch, stream));
                            }
                        }
                        if q.is_empty() {
                            self.core.waiters.remove(&log);
                        }
                    }
                    self.release_answers(ready);
                }
                Notice::Value { log, ticket, value } => {
                    if let Some((ch, id)) = self.core.value_waiters.remove(&(log, ticket)) {
                        if let Some(st) = self.stream_mut(ch.0, id) {
                            st.session.fill_value(log, ticket, value);
                        }
                        self.release_answers(vec![(ch, id)]);
                    }
                }
                Notice::Failed { log } => {
                    let mut ready: Vec<_> = self
                        .core
                        .waiters
                        .remove(&log)
                        .into_iter()
                        .flatten()
                        .map(|(_, ch, stream)| (ch, stream))
                        .collect();
                    let mut reads: Vec<_> = self
                        .core
                        .value_waiters
                        .keys()
                        .filter(|(l, _)| *l == log)
                        .copied()
                        .collect();
                    reads.sort_unstable_by_key(|(_, t)| t.0);
                    for key in reads {
                        ready.extend(self.core.value_waiters.remove(&key));
                    }
                    self.release_answers(ready);
                    self.resume_stalled(log);
                }
                Notice::Opened { log } => self.resume_stalled(log),
                Notice::GroupRecords { waiter, result } => {
                    if let Some((ch, id)) = self.core.group_waiters.remove(&waiter) {
                        if let Some(st) = self.stream_mut(ch.0, id) {
                            st.session.fill_group(waiter, result);
                        }
                        self.release_answers(vec![(ch, id)]);
                    }
                }
                // This harness runs one node: no log is replicated, so none of these come.
                Notice::LocalDurable { .. } | Notice::TimedOut { .. } | Notice::Replica { .. } => {}
            }
        }
    }

    fn release_answers(&mut self, streams: Vec<(ConnectionHandle, StreamId)>) {
        for (ch, id) in streams {
            let Some(c) = self.conns.get_mut(ch.0) else {
                continue;
            };
            let Some(st) = c.sessions.get_mut(&id) else {
                continue;
            };
            if st.session.release_held(&self.core) {
                self.flush_session(ch.0, id);
            }
        }
    }

    fn resume_stalled(&mut self, log: felix_storage::ops::LogId) {
        for (ch, id) in self.core.stalled.remove(&log).unwrap_or_default() {
            let now = self.now;
            let Some(c) = self.conns.get_mut(ch.0) else {
                continue;
            };
            let Conn {
                shared, sessions, ..
            } = c;
            let Some(st) = sessions.get_mut(&id) else {
                continue;
            };
            let Some(frame) = st.session.take_stalled() else {
                continue;
            };
            let mut cx = SessionCx {
                now,
                core: &mut self.core,
                conn: shared,
                ch,
                stream: id,
            };
            let result = st.session.on_frame(frame, &mut cx);
            self.core.metrics.absorb(&mut st.session.raised);
            match result {
                FrameResult::Stall => continue,
                FrameResult::CloseStream => stop_reading(st),
                FrameResult::Continue => {}
            }
            self.read_session(ch.0, id);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let limits = &self.core.limits;
        let conns = self.conns.iter().filter(|c| !c.closed).flat_map(|c| {
            let auth = (!c.shared.authenticated && !limits.auth_timeout.is_zero())
                .then(|| c.created + limits.auth_timeout);
            let reap = (c.shared.subscriptions == 0 && !limits.idle_connection_reap.is_zero())
                .then(|| c.shared.last_activity + limits.idle_connection_reap);
            [auth, reap].into_iter().flatten()
        });
        conns.chain(self.core.broker.poll_timeout()).min()
    }

    /// Runs every timer due now (`Conn::handle_timeout`, `Engine::handle_timeout`).
    fn fire_timers(&mut self) {
        let now = self.now;
        let limits = self.core.limits;
        for conn in 0..self.conns.len() {
            let c = &self.conns[conn];
            if c.closed {
                continue;
            }
            let auth_due = !c.shared.authenticated
                && !limits.auth_timeout.is_zero()
                && now >= c.created + limits.auth_timeout;
            let idle_due = c.shared.subscriptions == 0
                && !limits.idle_connection_reap.is_zero()
                && now >= c.shared.last_activity + limits.idle_connection_reap;
            if auth_due || idle_due {
                self.release(conn);
                self.written.push(Written::Closed { conn });
            }
        }
        if self.core.broker.poll_timeout().is_some_and(|at| at <= now) {
            let unix = self.core.unix_micros(now);
            self.core.broker.handle_timeout(now, unix);
        }
        self.turn();
    }
}

/// A request closed the stream: whatever follows it is never read.
fn stop_reading(st: &mut Stream) {
    st.unread.clear();
    let s = &mut st.session;
    s.decoder = FrameDecoder::new(0);
    s.recv_done = true;
    s.finish_when_flushed = true;
}

fn bi(index: u64) -> StreamId {
    StreamId::new(Side::Client, Dir::Bi, index)
}

fn uni(index: u64) -> StreamId {
    StreamId::new(Side::Server, Dir::Uni, index)
}
