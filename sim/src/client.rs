//! A simulated client: a real quinn-proto client connection carrying the felix-client Sans-IO
//! core (auth, request correlation, event-stream decoding), with a seeded workload that
//! publishes (acked, unacked, keyed), subscribes, and uses the cache, and tells the oracle
//! everything it was promised and everything it saw.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use felix_client::core::{
    auth_frame, read_auth_reply, read_guarded_reply, read_subscribe_reply, read_watch_event,
    subscribe_frame, Ack, Answer, CacheWatchItem, Capabilities, EventFrame, EventStreamReader,
    Offer, RequestKind, RequestStream, Start, SubscribeRequest, SubscriptionEnd, Target,
};
use felix_engine::RoutingMapping;
use felix_proto::routing::shard_for_key;
use felix_proto::{Frame, FrameDecoder};
use quinn_proto::{
    ClientConfig, Connection, ConnectionHandle, DatagramEvent, Dir, Endpoint, Event, StreamEvent,
    StreamId,
};

use crate::invariants::{cache_reads, idempotent_once, offsets, subscriber_order::SubscriberView};
use crate::oracle::{Oracle, Promise, Violation, WriteOutcome};
use crate::producer::{Outcome, Producer};
use crate::rng::SimRng;
use crate::trace::Trace;
use crate::watcher::{CacheWatcher, WatchEnd};

mod groups;

pub(crate) const TENANT: &str = "t1";
pub(crate) const NAMESPACE: &str = "default";
pub(crate) const STREAM: &str = "orders";
/// A second stream workers publish to and the operator deletes (`world.rs`): nobody reads
/// it, so only the answers to its publishes are checked (`requests_answered`).
pub(crate) const SCRATCH: &str = "scratch";
pub(crate) const CACHE: &str = "sessions";
/// Cache keys each client owns (it is their only writer).
const KEYS_PER_CLIENT: usize = 3;
/// Datagrams a stuck client's socket buffers before dropping more.
const STUCK_SOCKET_BUFFER: usize = 256;
/// Frames held on an event stream whose `subscribed` answer has not arrived yet.
const MAX_HELD_FRAMES: usize = 4096;
/// `not_leader` redirects one subscribe may follow before it must have reached a node that
/// serves it (`redirects_end`): the real client follows at most three.
pub(crate) const MAX_REDIRECT_HOPS: u32 = 3;

/// What the run does to the world around the clients, shared by every client call.
pub(crate) struct Ctx<'a> {
    pub(crate) start: Instant,
    pub(crate) oracle: &'a mut Oracle,
    pub(crate) trace: &'a mut Trace,
    pub(crate) token: &'a str,
    pub(crate) broker_addr: SocketAddr,
    pub(crate) client_count: usize,
    /// Canary: drop one event batch for a subscriber without telling anyone.
    pub(crate) drop_one_event_frame: &'a mut bool,
    /// Canary: the idempotent producer re-sends a batch under a new sequence.
    pub(crate) resend_as_new: bool,
    /// Canary: drop one put change for a cache watcher without telling anyone.
    pub(crate) drop_one_watch_change: &'a mut bool,
    /// Canary: values first read per key, answered again for every later get of it.
    pub(crate) stale_cache: Option<&'a mut BTreeMap<String, Bytes>>,
    /// Canary: a record handed to worker `.0` (shard `.1`, offset `.2`) waiting to turn up
    /// in another worker's poll answer.
    pub(crate) misroute_claim: Option<&'a mut Option<(usize, u32, u64)>>,
    /// Canary: client 0 stops taking answers on each publish stream after its first one,
    /// as if the broker had left them owed.
    pub(crate) withhold_answers: bool,
    /// True once the fault phase is over: no new work, only reading and reconnecting.
    pub(crate) quiet: bool,
    /// Cluster runs: each shard's leader (its client address), to tell which acks were
    /// forwarded (`forwarded_acks`).
    pub(crate) leaders: Option<&'a BTreeMap<u32, SocketAddr>>,
    /// Canary (`RedirectLoop`): a `not_leader` is followed back to the node that sent it.
    pub(crate) redirect_loop: bool,
}

impl Ctx<'_> {
    fn log(&mut self, now: Instant, what: std::fmt::Arguments<'_>) {
        let at = now.saturating_duration_since(self.start);
        self.trace.event(at, what);
    }
}

/// What this client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Publishes, subscribes and uses the cache.
    Worker,
    /// The end-of-run auditor: reads every shard from the earliest offset, nothing else.
    Auditor,
}

/// A subscription the client keeps up across reconnects and lags.
#[derive(Debug, Clone)]
struct SubSpec {
    shard: u32,
    start: Start,
    /// Durable: the next offset to ask for after a reconnect or a lag.
    resume: Option<u64>,
}

#[derive(Debug)]
enum ReqMeta {
    Publish {
        shard: u32,
        payloads: Vec<Bytes>,
    },
    /// A publish to the scratch stream: any answer will do, ok or `not_found`.
    ScratchPublish,
    CacheWrite {
        key: String,
        index: usize,
    },
    CacheGet {
        key: String,
        sent: Instant,
    },
}

#[derive(Debug)]
enum Phase {
    Authing,
    Ready(RequestStream),
    /// `subscribe` sent, waiting for `subscribed`.
    Subscribing(Capabilities),
    Subscribed,
    /// `cache_watch` sent, waiting for `cache_watch_started`.
    Watching,
    Watched,
    Dead,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Publish,
    Cache,
    /// The idempotent producer's stream (`producer.rs`).
    Idempotent,
    Subscribe(usize),
    Group,
    Watch,
}

struct BiStream {
    no: u64,
    purpose: Purpose,
    phase: Phase,
    decoder: FrameDecoder,
    out: VecDeque<Bytes>,
    reqs: BTreeMap<u64, ReqMeta>,
    /// Canary (`withhold_answers`): frames arriving here are dropped unread.
    withheld: bool,
}

struct UniStream {
    decoder: FrameDecoder,
    reader: Option<EventStreamReader>,
    subscription: Option<u64>,
    held: Vec<Frame>,
    done: bool,
}

struct Conn {
    gen: u64,
    ch: ConnectionHandle,
    quic: Connection,
    connected: bool,
    caps: Option<Capabilities>,
    next_stream_no: u64,
    bi: BTreeMap<StreamId, BiStream>,
    uni: BTreeMap<StreamId, UniStream>,
    /// Subscription id -> (spec index, the subscriber's view).
    views: BTreeMap<u64, (usize, SubscriberView)>,
    publish_stream: Option<StreamId>,
    cache_stream: Option<StreamId>,
    idempotent_stream: Option<StreamId>,
    /// Frames decrypted from the broker so far, and when that count last moved: proof that
    /// the broker still holds this connection.
    frames_heard: u64,
    last_heard: Instant,
    /// Consumer-group work (durable runs).
    group: groups::GroupWork,
}

pub(crate) struct SimClient {
    pub(crate) id: usize,
    pub(crate) addr: SocketAddr,
    pub(crate) role: Role,
    /// What the client offers on `auth` (some offer FEATURE_ACK_ON_COMMIT).
    offer: Offer,
    endpoint: Endpoint,
    config: ClientConfig,
    conn: Option<Conn>,
    gen: u64,
    /// How far this client's clock runs ahead of true time (clock jumps move it forward).
    pub(crate) skew: Duration,
    pub(crate) stuck_until: Option<Instant>,
    stuck_inbox: Vec<(SocketAddr, Bytes)>,
    /// Slow clients read their event streams only every `read_every`.
    read_every: Option<Duration>,
    next_read: Instant,
    reconnect_at: Option<Instant>,
    next_action: Instant,
    action_gap: (Duration, Duration),
    subs: Vec<SubSpec>,
    rng: SimRng,
    seq: u64,
    cache_busy: BTreeSet<String>,
    cache_values: u64,
    /// Sends batches that must land once, across connections (`producer.rs`).
    producer: Producer,
    pub(crate) shards: u32,
    /// The auditor's reading: per shard, start offset and records by offset.
    pub(crate) audit: BTreeMap<u32, (u64, BTreeMap<u64, Bytes>)>,
    pub(crate) stats: ClientStats,
    /// Durable runs: a prefix watch on the whole cache (`watcher.rs`).
    watcher: Option<CacheWatcher>,
    /// Cluster runs: the node this client connects to now (`None`: the one broker). A
    /// `not_leader` moves it.
    pub(crate) home: Option<SocketAddr>,
    /// Redirects followed since the last `subscribed`.
    hops: u32,
    /// Of those, the ones made while faults were still being injected.
    loud_hops: u32,
    /// The newest generation a redirect in the current chain named, and where.
    newest_redirect: Option<(u64, SocketAddr)>,
    /// Set by a `not_leader` (or a refused subscribe): reconnect there at that instant.
    redirect_to: Option<(SocketAddr, Instant)>,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ClientStats {
    pub(crate) connects: u64,
    pub(crate) publishes: u64,
    pub(crate) acks: u64,
    pub(crate) refusals: u64,
    pub(crate) events: u64,
    pub(crate) cache_ops: u64,
    pub(crate) redirects: u64,
    /// `not_leader` answers that named no address.
    pub(crate) addressless_redirects: u64,
}

pub(crate) struct Setup {
    pub(crate) id: usize,
    pub(crate) role: Role,
    pub(crate) shards: u32,
    pub(crate) durable: bool,
    pub(crate) slow: bool,
    pub(crate) crypto: Arc<quinn_proto::crypto::rustls::QuicClientConfig>,
    pub(crate) rng: SimRng,
    pub(crate) now: Instant,
    /// Cluster runs: the node to connect to first, and (for an auditor) the one shard it
    /// reads. A cluster client publishes, uses the cache and keeps at most one
    /// subscription (a redirect moves the whole connection).
    pub(crate) cluster: Option<(SocketAddr, Option<u32>)>,
}

impl SimClient {
    pub(crate) fn new(s: Setup) -> SimClient {
        let mut rng = s.rng;
        let endpoint = crate::crypto::client_endpoint(rng.fork("endpoint"));
        let mut config = ClientConfig::new(s.crypto);
        config
            .initial_dst_cid_provider(crate::crypto::initial_cid_provider(rng.fork("initial cid")));
        let window: u32 = if s.slow { 16 * 1024 } else { 1024 * 1024 };
        config.transport_config(felix_testkit::client_transport(
            &felix_testkit::ClientTransport {
                stream_window: window,
                max_uni_streams: 64,
                keep_alive: Some(Duration::from_millis(1000)),
                idle_timeout: Some(Duration::from_millis(5_000)),
            },
        ));
        let cluster = s.cluster.is_some();
        let subs = match s.role {
            Role::Auditor if cluster => {
                let shard = s.cluster.and_then(|c| c.1).unwrap_or(0);
                vec![SubSpec {
                    shard,
                    start: Start::Earliest,
                    resume: None,
                }]
            }
            Role::Auditor => (0..s.shards)
                .map(|shard| SubSpec {
                    shard,
                    start: Start::Earliest,
                    resume: None,
                })
                .collect(),
            Role::Worker => {
                let n = rng.below(if cluster { 2 } else { 3 });
                (0..n)
                    .map(|_| SubSpec {
                        shard: rng.below(u64::from(s.shards)) as u32,
                        start: if s.durable {
                            *rng.pick(&[Start::Latest, Start::Earliest, Start::Offset(0)])
                        } else {
                            Start::Latest
                        },
                        resume: None,
                    })
                    .collect()
            }
        };
        let lo = rng.duration(Duration::from_millis(2), Duration::from_millis(60));
        let producer = Producer::new(s.id, &mut rng.fork("producer"));
        let watcher = (!cluster && s.durable && s.role == Role::Worker && rng.chance(0.6))
            .then(CacheWatcher::default);
        let mut offer = Offer::full();
        if cluster {
            offer.features = offer.features.union(felix_proto::Features::REDIRECT);
        }
        if rng.chance(0.5) {
            offer.features = offer.features.union(felix_proto::Features::ACK_ON_COMMIT);
        }
        SimClient {
            id: s.id,
            addr: SocketAddr::from(([127, 0, 1, (s.id % 250) as u8 + 1], 40_000 + s.id as u16)),
            role: s.role,
            offer,
            endpoint,
            config,
            conn: None,
            gen: 0,
            skew: Duration::ZERO,
            stuck_until: None,
            stuck_inbox: Vec::new(),
            read_every: s
                .slow
                .then(|| rng.duration(Duration::from_millis(100), Duration::from_millis(800))),
            next_read: s.now,
            reconnect_at: Some(s.now),
            next_action: s.now + lo,
            action_gap: (lo, lo * 4),
            subs,
            rng,
            seq: 0,
            cache_busy: BTreeSet::new(),
            cache_values: 0,
            producer,
            shards: s.shards,
            audit: BTreeMap::new(),
            stats: ClientStats::default(),
            watcher,
            home: s.cluster.map(|c| c.0),
            hops: 0,
            loud_hops: 0,
            newest_redirect: None,
            redirect_to: None,
        }
    }

    /// Changes this client's cache watch received.
    pub(crate) fn watch_changes(&self) -> u64 {
        self.watcher.as_ref().map_or(0, |w| w.view.changes)
    }

    /// The `watch_gapless` end check for this client's watch, if it keeps one.
    pub(crate) fn check_watch(&self, oracle: &Oracle, start: Instant) -> Result<(), Violation> {
        let Some(w) = &self.watcher else {
            return Ok(());
        };
        let live = self.is_connected() && w.current.is_some();
        crate::invariants::watch_gapless::check_end(
            oracle,
            &format!("c{} watch", self.id),
            &w.view,
            live,
            start,
        )
    }

    fn local(&self, now: Instant) -> Instant {
        now + self.skew
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| c.connected)
    }

    pub(crate) fn is_stuck(&self, now: Instant) -> bool {
        self.stuck_until.is_some_and(|t| now < t)
    }

    /// The next true instant at which this client has something to do.
    pub(crate) fn next_deadline(&mut self, quiet: bool) -> Option<Instant> {
        if let Some(t) = self.stuck_until {
            return Some(t);
        }
        let mut next = self.reconnect_at;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        if let Some((_, at)) = self.redirect_to {
            consider(at);
        }
        if let Some(conn) = &mut self.conn {
            if let Some(t) = conn.quic.poll_timeout() {
                consider(t.checked_sub(self.skew).unwrap_or(t));
            }
            if conn.connected && !quiet && self.role == Role::Worker {
                consider(self.next_action);
            }
            if self.read_every.is_some() && !conn.uni.is_empty() {
                consider(self.next_read);
            }
        }
        next
    }

    /// Moves the client's clock forward by `by`.
    pub(crate) fn jump_clock(&mut self, by: Duration) {
        self.skew += by;
    }

    /// Freezes the client (no timers, no reading) until `until`.
    pub(crate) fn freeze(&mut self, until: Instant) {
        self.stuck_until = Some(until);
    }

    /// A datagram arrived from `from`. Returns datagrams to send.
    pub(crate) fn handle_datagram(
        &mut self,
        now: Instant,
        from: SocketAddr,
        data: Bytes,
        ctx: &mut Ctx<'_>,
    ) -> Result<Vec<(SocketAddr, Bytes)>, Violation> {
        if self.is_stuck(now) {
            if self.stuck_inbox.len() < STUCK_SOCKET_BUFFER {
                self.stuck_inbox.push((from, data));
            }
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        self.feed(now, from, data, &mut out);
        let read_events = self.read_every.is_none();
        self.process(now, ctx, &mut out, read_events)?;
        Ok(out)
    }

    fn feed(
        &mut self,
        now: Instant,
        from: SocketAddr,
        data: Bytes,
        out: &mut Vec<(SocketAddr, Bytes)>,
    ) {
        let local = self.local(now);
        let mut resp = Vec::new();
        match self.endpoint.handle(
            local,
            from,
            None,
            None,
            BytesMut::from(&data[..]),
            &mut resp,
        ) {
            Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                if let Some(conn) = self.conn.as_mut().filter(|c| c.ch == ch) {
                    conn.quic.handle_event(ev);
                }
            }
            Some(DatagramEvent::Response(t)) => {
                out.push((t.destination, Bytes::copy_from_slice(&resp[..t.size])));
            }
            Some(DatagramEvent::NewConnection(_)) | None => {}
        }
    }

    /// Runs whatever is due at `now`: unfreezing, reconnecting, timers, reads, the workload.
    pub(crate) fn tick(
        &mut self,
        now: Instant,
        ctx: &mut Ctx<'_>,
    ) -> Result<Vec<(SocketAddr, Bytes)>, Violation> {
        let mut out = Vec::new();
        if let Some(t) = self.stuck_until {
            if now < t {
                return Ok(out);
            }
            self.stuck_until = None;
            ctx.log(
                now,
                format_args!(
                    "c{} unstuck, {} datagrams buffered",
                    self.id,
                    self.stuck_inbox.len()
                ),
            );
            for (from, data) in std::mem::take(&mut self.stuck_inbox) {
                self.feed(now, from, data, &mut out);
            }
        }
        if let Some((to, _)) = self.redirect_to.take_if(|(_, at)| *at <= now) {
            self.follow_redirect(now, to, ctx, &mut out);
        }
        if self.reconnect_at.is_some_and(|t| t <= now) {
            self.reconnect_at = None;
            self.connect(now, ctx);
        }
        let local = self.local(now);
        if let Some(conn) = &mut self.conn {
            if conn.quic.poll_timeout().is_some_and(|t| t <= local) {
                conn.quic.handle_timeout(local);
            }
        }
        let mut read_events = self.read_every.is_none();
        if let Some(every) = self.read_every {
            if self.next_read <= now {
                self.next_read = now + every;
                read_events = true;
            }
        }
        let connected = self.is_connected();
        if connected && !ctx.quiet && self.role == Role::Worker && self.next_action <= now {
            let (lo, hi) = self.action_gap;
            self.next_action = now + self.rng.duration(lo, hi);
            self.act(now, ctx)?;
        }
        self.process(now, ctx, &mut out, read_events)?;
        Ok(out)
    }

    fn connect(&mut self, now: Instant, ctx: &mut Ctx<'_>) {
        self.gen += 1;
        self.stats.connects += 1;
        let local = self.local(now);
        match self.endpoint.connect(
            local,
            self.config.clone(),
            self.home.unwrap_or(ctx.broker_addr),
            "localhost",
        ) {
            Ok((ch, quic)) => {
                ctx.log(now, format_args!("c{} connect gen {}", self.id, self.gen));
                self.conn = Some(Conn {
                    gen: self.gen,
                    ch,
                    quic,
                    connected: false,
                    caps: None,
                    next_stream_no: 0,
                    bi: BTreeMap::new(),
                    uni: BTreeMap::new(),
                    views: BTreeMap::new(),
                    publish_stream: None,
                    cache_stream: None,
                    idempotent_stream: None,
                    frames_heard: 0,
                    last_heard: now,
                    group: Default::default(),
                });
            }
            Err(e) => {
                ctx.log(now, format_args!("c{} connect failed: {e}", self.id));
                self.reconnect_at = Some(now + Duration::from_millis(500));
            }
        }
    }

    /// Drains the connection: endpoint events, connection events, stream reads, writes and
    /// transmits, until nothing moves. `read_events` is false for a slow client between its
    /// read ticks.
    fn process(
        &mut self,
        now: Instant,
        ctx: &mut Ctx<'_>,
        out: &mut Vec<(SocketAddr, Bytes)>,
        read_events: bool,
    ) -> Result<(), Violation> {
        let local = self.local(now);
        for _round in 0..64 {
            let Some(conn) = &mut self.conn else {
                return Ok(());
            };
            let mut moved = false;
            while let Some(ev) = conn.quic.poll_endpoint_events() {
                moved = true;
                if let Some(reply) = self.endpoint.handle_event(conn.ch, ev) {
                    conn.quic.handle_event(reply);
                }
            }
            let mut events = Vec::new();
            while let Some(ev) = conn.quic.poll() {
                events.push(ev);
            }
            for ev in events {
                moved = true;
                match ev {
                    Event::Connected => {
                        let conn = self.conn.as_mut().expect("conn");
                        conn.connected = true;
                        ctx.log(now, format_args!("c{} connected gen {}", self.id, conn.gen));
                        self.open_streams(now, ctx);
                    }
                    Event::ConnectionLost { reason } => {
                        self.connection_lost(now, &reason.to_string(), ctx);
                        return Ok(());
                    }
                    Event::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                        let conn = self.conn.as_mut().expect("conn");
                        while let Some(id) = conn.quic.streams().accept(Dir::Uni) {
                            conn.uni.insert(
                                id,
                                UniStream {
                                    decoder: FrameDecoder::new(64 << 20),
                                    reader: conn.caps.as_ref().map(EventStreamReader::new),
                                    subscription: None,
                                    held: Vec::new(),
                                    done: false,
                                },
                            );
                        }
                    }
                    _ => {}
                }
            }
            if self.read_streams(now, ctx, read_events)? {
                moved = true;
            }
            if self.flush_writes() {
                moved = true;
            }
            let Some(conn) = self.conn.as_mut() else {
                return Ok(());
            };
            let rx = conn.quic.stats().frame_rx;
            let heard = rx.acks + rx.stream + rx.ping + rx.max_data + rx.max_stream_data;
            if heard != conn.frames_heard {
                conn.frames_heard = heard;
                conn.last_heard = now;
            }
            let mut buf = Vec::new();
            while let Some(t) = conn.quic.poll_transmit(local, 1, &mut buf) {
                moved = true;
                out.push((t.destination, Bytes::copy_from_slice(&buf[..t.size])));
                buf.clear();
            }
            if !moved {
                break;
            }
        }
        Ok(())
    }

    fn connection_lost(&mut self, now: Instant, reason: &str, ctx: &mut Ctx<'_>) {
        let Some(conn) = self.conn.take() else { return };
        if let Some(w) = self.watcher.as_mut() {
            w.current = None;
        }
        ctx.log(
            now,
            format_args!("c{} lost gen {}: {reason}", self.id, conn.gen),
        );
        for s in conn.bi.values() {
            for meta in s.reqs.values() {
                if let ReqMeta::CacheWrite { key, index } = meta {
                    ctx.oracle
                        .cache_write_done(key, *index, WriteOutcome::Unknown);
                    self.cache_busy.remove(key);
                }
            }
        }
        ctx.oracle.connection_closed(self.id, conn.gen);
        self.producer.connection_lost(ctx.resend_as_new);
        let backoff = self
            .rng
            .duration(Duration::from_millis(50), Duration::from_millis(1000));
        self.reconnect_at = Some(now + backoff);
    }

    fn open_bi(&mut self, now: Instant, purpose: Purpose, ctx: &mut Ctx<'_>) -> Option<StreamId> {
        let conn = self.conn.as_mut()?;
        let id = conn.quic.streams().open(Dir::Bi)?;
        let no = conn.next_stream_no;
        conn.next_stream_no += 1;
        let mut s = BiStream {
            no,
            purpose,
            phase: Phase::Authing,
            decoder: FrameDecoder::new(64 << 20),
            out: VecDeque::new(),
            reqs: BTreeMap::new(),
            withheld: false,
        };
        s.out.push_back(auth_frame(TENANT, ctx.token, &self.offer));
        ctx.oracle
            .request_sent((self.id, conn.gen, no, 0), now, "auth".into());
        conn.bi.insert(id, s);
        Some(id)
    }

    fn open_streams(&mut self, now: Instant, ctx: &mut Ctx<'_>) {
        if self.role == Role::Worker && self.home.is_some() {
            // A cluster client: publishes and cache calls, through whichever node it is on.
            let p = self.open_bi(now, Purpose::Publish, ctx);
            let c = self.open_bi(now, Purpose::Cache, ctx);
            if let Some(conn) = &mut self.conn {
                conn.publish_stream = p;
                conn.cache_stream = c;
            }
        } else if self.role == Role::Worker {
            let p = self.open_bi(now, Purpose::Publish, ctx);
            let c = self.open_bi(now, Purpose::Cache, ctx);
            let i = self.open_bi(now, Purpose::Idempotent, ctx);
            let g = (ctx.oracle.promise == crate::oracle::Promise::Durable)
                .then(|| self.open_bi(now, Purpose::Group, ctx))
                .flatten();
            if let Some(conn) = &mut self.conn {
                conn.publish_stream = p;
                conn.cache_stream = c;
                conn.idempotent_stream = i;
                conn.group.stream = g;
            }
        }
        if self.role == Role::Auditor
            && self.home.is_none()
            && ctx.oracle.promise == crate::oracle::Promise::Durable
        {
            let g = self.open_bi(now, Purpose::Group, ctx);
            if let Some(conn) = &mut self.conn {
                conn.group.stream = g;
            }
        }
        for i in 0..self.subs.len() {
            self.open_bi(now, Purpose::Subscribe(i), ctx);
        }
        if self.watcher.is_some() {
            self.open_bi(now, Purpose::Watch, ctx);
        }
    }

    fn flush_writes(&mut self) -> bool {
        let Some(conn) = &mut self.conn else {
            return false;
        };
        let mut moved = false;
        for (id, s) in conn.bi.iter_mut() {
            while let Some(front) = s.out.front_mut() {
                match conn.quic.send_stream(*id).write(front) {
                    Ok(n) if n == front.len() => {
                        s.out.pop_front();
                        moved = true;
                    }
                    Ok(n) => {
                        let _ = front.split_to(n);
                        moved |= n > 0;
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
        moved
    }

    /// Reads every stream that has data. True if anything was read.
    fn read_streams(
        &mut self,
        now: Instant,
        ctx: &mut Ctx<'_>,
        read_events: bool,
    ) -> Result<bool, Violation> {
        let mut moved = false;
        let ids: Vec<StreamId> = match &self.conn {
            Some(c) => c.bi.keys().copied().collect(),
            None => return Ok(false),
        };
        for id in ids {
            let frames = {
                let conn = self.conn.as_mut().expect("conn");
                let s = conn.bi.get_mut(&id).expect("stream");
                let (got, ended) = read_into(&mut conn.quic, id, &mut s.decoder);
                moved |= got;
                let mut frames = Vec::new();
                loop {
                    match s.decoder.next_frame() {
                        Ok(Some(f)) => frames.push(f),
                        Ok(None) => break,
                        Err(e) => {
                            return Err(protocol(self.id, format!("undecodable frame: {e}")));
                        }
                    }
                }
                if ended && !matches!(s.phase, Phase::Dead) {
                    if s.purpose == Purpose::Idempotent {
                        self.producer.connection_lost(ctx.resend_as_new);
                    }
                    // The broker ended the stream: its requests will not be answered here.
                    let gen = conn.gen;
                    let no = s.no;
                    for (rid, meta) in std::mem::take(&mut s.reqs) {
                        ctx.oracle.request_answered((self.id, gen, no, rid));
                        if let ReqMeta::CacheWrite { key, index } = meta {
                            ctx.oracle
                                .cache_write_done(&key, index, WriteOutcome::Unknown);
                            self.cache_busy.remove(&key);
                        }
                    }
                    ctx.oracle.request_answered((self.id, gen, no, 0));
                    ctx.oracle.request_answered((self.id, gen, no, u64::MAX));
                    if s.purpose == Purpose::Group {
                        if let Some(rid) = conn.group.take_asked() {
                            ctx.oracle.request_answered((self.id, gen, no, rid));
                        }
                    }
                    ctx.log(
                        now,
                        format_args!("c{} stream {no} ended by the broker", self.id),
                    );
                    s.phase = Phase::Dead;
                }
                frames
            };
            for f in frames {
                self.on_bi_frame(now, id, &f, ctx)?;
            }
        }
        let reading = read_events;
        if reading {
            let ids: Vec<StreamId> = self
                .conn
                .as_ref()
                .map(|c| c.uni.keys().copied().collect())
                .unwrap_or_default();
            for id in ids {
                if self.read_uni(now, id, ctx)? {
                    moved = true;
                }
            }
        }
        Ok(moved)
    }

    fn on_bi_frame(
        &mut self,
        now: Instant,
        id: StreamId,
        frame: &Frame,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Violation> {
        let me = self.id;
        let conn = self.conn.as_mut().expect("conn");
        let gen = conn.gen;
        let s = conn.bi.get_mut(&id).expect("stream");
        let no = s.no;
        if s.withheld {
            return Ok(());
        }
        if ctx.withhold_answers
            && me == 0
            && s.purpose == Purpose::Publish
            && matches!(s.phase, Phase::Ready(_))
        {
            // This answer and every later one on the stream stay owed.
            s.withheld = true;
            ctx.log(
                now,
                format_args!("c{me} canary: withholds answers on stream {no}"),
            );
            return Ok(());
        }
        if s.purpose == Purpose::Idempotent && matches!(s.phase, Phase::Ready(_)) {
            return self.on_idempotent_answer(now, frame, (gen, no), ctx);
        }
        match std::mem::replace(&mut s.phase, Phase::Dead) {
            Phase::Authing => {
                ctx.oracle.request_answered((me, gen, no, 0));
                let caps = read_auth_reply(&self.offer, frame)
                    .map_err(|e| protocol(me, format!("auth refused: {e}")))?;
                if conn.caps.is_none() {
                    conn.caps = Some(caps);
                    for u in conn.uni.values_mut() {
                        u.reader
                            .get_or_insert_with(|| EventStreamReader::new(&caps));
                    }
                }
                match s.purpose {
                    Purpose::Publish | Purpose::Cache | Purpose::Idempotent | Purpose::Group => {
                        s.phase = Phase::Ready(RequestStream::new(caps, TENANT));
                    }
                    Purpose::Subscribe(i) => {
                        let spec = &self.subs[i];
                        let start = match spec.resume {
                            Some(o) => Start::Offset(o),
                            None => match spec.start {
                                Start::Offset(_) => {
                                    let tail = ctx.oracle.known_tail(spec.shard);
                                    Start::Offset(self.rng.below(tail + 1))
                                }
                                other => other,
                            },
                        };
                        let req = SubscribeRequest {
                            namespace: NAMESPACE,
                            stream: STREAM,
                            start,
                            shard: Some(spec.shard),
                        };
                        let f = subscribe_frame(TENANT, &req)
                            .map_err(|e| protocol(me, format!("subscribe encode: {e}")))?;
                        s.out.push_back(f);
                        ctx.oracle.request_sent(
                            (me, gen, no, u64::MAX),
                            now,
                            format!("subscribe shard {} {start:?}", spec.shard),
                        );
                        ctx.trace.event(
                            now.saturating_duration_since(ctx.start),
                            format_args!("c{me} subscribe shard {} {start:?}", spec.shard),
                        );
                        s.phase = Phase::Subscribing(caps);
                    }
                    Purpose::Watch => {
                        let w = self.watcher.as_ref().expect("a watcher opens this stream");
                        let f = w
                            .request(&caps)
                            .map_err(|e| protocol(me, format!("cache_watch encode: {e}")))?;
                        s.out.push_back(f);
                        let what = format!("cache_watch from {:?}", w.resume);
                        ctx.oracle
                            .request_sent((me, gen, no, u64::MAX), now, what.clone());
                        ctx.trace.event(
                            now.saturating_duration_since(ctx.start),
                            format_args!("c{me} {what}"),
                        );
                        s.phase = Phase::Watching;
                    }
                }
            }
            Phase::Watching => {
                ctx.oracle.request_answered((me, gen, no, u64::MAX));
                let w = self.watcher.as_mut().expect("a watcher opened this stream");
                let what = w.on_answer(now, &format!("c{me}"), frame)?;
                ctx.trace.event(
                    now.saturating_duration_since(ctx.start),
                    format_args!("c{me} {what}"),
                );
                if w.current.is_some() {
                    s.phase = Phase::Watched;
                }
            }
            Phase::Watched => {
                return Err(protocol(
                    me,
                    "a frame on a cache_watch stream after `cache_watch_started`".into(),
                ));
            }
            Phase::Subscribing(_caps) => {
                ctx.oracle.request_answered((me, gen, no, u64::MAX));
                let Purpose::Subscribe(i) = s.purpose else {
                    unreachable!()
                };
                if let Ok(felix_proto::message::Message::NotLeader(nl)) =
                    felix_proto::message::Message::decode(&frame.payload)
                {
                    return self.on_not_leader(now, i, nl, ctx);
                }
                match read_subscribe_reply(frame) {
                    Ok(sub) => {
                        let shard = self.subs[i].shard;
                        ctx.log(
                            now,
                            format_args!(
                                "c{me} subscribed {} shard {shard} start {:?} live {:?}",
                                sub.subscription_id, sub.start_offset, sub.live_offset
                            ),
                        );
                        if ctx.oracle.promise == Promise::Durable && sub.start_offset.is_none() {
                            return Err(protocol(
                                me,
                                "a durable subscription without start_offset".into(),
                            ));
                        }
                        self.hops = 0;
                        self.loud_hops = 0;
                        self.newest_redirect = None;
                        conn.views.insert(
                            sub.subscription_id,
                            (i, SubscriberView::new(shard, sub.start_offset)),
                        );
                        if self.role == Role::Auditor {
                            self.audit
                                .entry(shard)
                                .or_insert((sub.start_offset.unwrap_or(0), BTreeMap::new()));
                        }
                        s.phase = Phase::Subscribed;
                    }
                    Err(e) => {
                        ctx.log(now, format_args!("c{me} subscribe refused: {e}"));
                        self.stats.refusals += 1;
                        if let Some(here) = self.home {
                            // A node not serving yet (or its shard's leader away): try again
                            // on a fresh connection, where the node is now.
                            let wait = self
                                .rng
                                .duration(Duration::from_millis(100), Duration::from_millis(600));
                            self.redirect_to = Some((here, now + wait));
                            return Ok(());
                        }
                        // Start over from the live end next time.
                        self.subs[i].resume = None;
                        self.subs[i].start = Start::Latest;
                    }
                }
            }
            Phase::Subscribed => {
                return Err(protocol(
                    me,
                    "a frame on a subscribe stream after `subscribed`".into(),
                ));
            }
            Phase::Dead => {}
            Phase::Ready(rs) if s.purpose == Purpose::Group => {
                s.phase = Phase::Ready(rs);
                return self.on_group_frame(now, no, frame, ctx);
            }
            Phase::Ready(mut rs) => {
                let done = rs
                    .handle_frame(frame)
                    .map_err(|e| protocol(me, format!("stream {no}: {e}")))?;
                s.phase = Phase::Ready(rs);
                ctx.oracle.request_answered((me, gen, no, done.request_id));
                let meta = s.reqs.remove(&done.request_id);
                self.on_completion(now, done.kind, done.result, meta, ctx)?;
            }
        }
        if self.role == Role::Auditor {
            self.drain_groups(now, ctx);
        }
        Ok(())
    }

    fn on_completion(
        &mut self,
        now: Instant,
        kind: RequestKind,
        result: Result<Answer, felix_client::ClientError>,
        meta: Option<ReqMeta>,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Violation> {
        let me = self.id;
        // A hit carries its version (the offer includes FEATURE_CACHE_CONDITIONAL); the
        // reads check only the value.
        let result = result.map(|a| match a {
            Answer::VersionedValue { value, .. } => Answer::CacheValue(Some(value)),
            a => a,
        });
        match (meta, result) {
            (Some(ReqMeta::Publish { shard, payloads }), Ok(Answer::Published { offset })) => {
                self.stats.acks += 1;
                ctx.oracle.acked_count += 1;
                ctx.log(
                    now,
                    format_args!(
                        "c{me} ack {} shard {shard} offset {offset:?}",
                        crate::oracle::show(&payloads[0])
                    ),
                );
                match offset {
                    Some(base) => {
                        for (i, p) in payloads.iter().enumerate() {
                            let o = base + i as u64;
                            offsets::observe(ctx.oracle, shard, o, p, "ack")?;
                            ctx.oracle
                                .acked
                                .entry(shard)
                                .or_default()
                                .insert(o, p.clone());
                            let leader = ctx.leaders.and_then(|l| l.get(&shard));
                            if let (Some(home), Some(leader)) = (self.home, leader) {
                                if home != *leader {
                                    ctx.oracle.forwarded_acks.push((shard, o, p.clone(), home));
                                }
                            }
                        }
                    }
                    // Acked at accept time (no ack-on-commit): the audit looks for the payload.
                    None if ctx.oracle.promise == Promise::Durable => {
                        for p in payloads {
                            ctx.oracle.acked_unplaced.push((shard, p));
                        }
                    }
                    None => {}
                }
            }
            (Some(ReqMeta::ScratchPublish), Ok(Answer::Published { offset })) => {
                ctx.log(now, format_args!("c{me} scratch ack offset {offset:?}"));
            }
            (Some(ReqMeta::CacheWrite { key, index }), result) => {
                self.cache_busy.remove(&key);
                let outcome = match &result {
                    Ok(_) => WriteOutcome::Acked(now),
                    // A forward whose answer never came: it may have been applied.
                    Err(e) if e.code() == Some(&felix_proto::ErrorCode::Unacknowledged) => {
                        WriteOutcome::Unknown
                    }
                    Err(_) => WriteOutcome::Refused,
                };
                let ok = matches!(outcome, WriteOutcome::Acked(_));
                ctx.log(
                    now,
                    format_args!("c{me} cache write {key} #{index} ok={ok}"),
                );
                ctx.oracle.cache_write_done(&key, index, outcome);
            }
            (Some(ReqMeta::CacheGet { key, sent }), Ok(Answer::CacheValue(mut v))) => {
                if let Some(stale) = ctx.stale_cache.as_deref_mut() {
                    match (stale.get(&key), &v) {
                        (Some(first), _) => v = Some(first.clone()),
                        (None, Some(read)) => {
                            stale.insert(key.clone(), read.clone());
                        }
                        (None, None) => {}
                    }
                }
                ctx.log(
                    now,
                    format_args!(
                        "c{me} cache get {key} = {}",
                        v.as_ref()
                            .map_or("<absent>".to_owned(), |v| crate::oracle::show(v))
                    ),
                );
                if !ctx.oracle.cache_values_may_be_lost {
                    cache_reads::check_get(ctx.oracle, &key, v.as_ref(), sent, now, ctx.start)?;
                }
            }
            (meta, Err(e)) => {
                self.stats.refusals += 1;
                // Not `{meta:?}`: a get's send time is an `Instant`, whose value differs per run.
                let what = match &meta {
                    Some(ReqMeta::CacheGet { key, .. }) => format!("get {key}"),
                    other => format!("{other:?}"),
                };
                ctx.log(now, format_args!("c{me} {kind:?} refused: {e} ({what})"));
            }
            (meta, Ok(answer)) => {
                return Err(protocol(me, format!("{answer:?} answers {meta:?}")));
            }
        }
        Ok(())
    }

    /// Reads one event stream. True if anything was read.
    fn read_uni(
        &mut self,
        now: Instant,
        id: StreamId,
        ctx: &mut Ctx<'_>,
    ) -> Result<bool, Violation> {
        let me = self.id;
        let conn = self.conn.as_mut().expect("conn");
        let u = conn.uni.get_mut(&id).expect("uni");
        if u.done {
            return Ok(false);
        }
        let (got, ended) = read_into(&mut conn.quic, id, &mut u.decoder);
        loop {
            match u.decoder.next_frame() {
                Ok(Some(f)) => u.held.push(f),
                Ok(None) => break,
                Err(e) => return Err(protocol(me, format!("undecodable event frame: {e}"))),
            }
            if u.held.len() > MAX_HELD_FRAMES {
                return Err(protocol(
                    me,
                    "event frames pile up before `subscribed`".into(),
                ));
            }
        }
        let Some(reader) = u.reader.as_mut() else {
            return Ok(got);
        };
        let mut finished = None;
        let mut watch_end = None;
        let mut i = 0;
        while i < u.held.len() {
            let frame = &u.held[i];
            if let Some(sub) = u.subscription {
                // A cache watch's stream carries JSON changes: the watcher reads them.
                if let Some(w) = self.watcher.as_mut().filter(|w| w.current == Some(sub)) {
                    i += 1;
                    if *ctx.drop_one_watch_change && w.view.changes >= 3 && is_put_change(frame) {
                        *ctx.drop_one_watch_change = false;
                        ctx.log(now, format_args!("c{me} (canary: a watch change vanished)"));
                        continue;
                    }
                    if let Some(end) = w.on_event_frame(&format!("c{me} watch {sub}"), frame)? {
                        watch_end = Some(end);
                        break;
                    }
                    continue;
                }
                if !conn.views.contains_key(&sub) {
                    // Its `subscribed` or `cache_watch_started` is not read yet.
                    break;
                }
            }
            let decoded = reader
                .handle_frame(frame)
                .map_err(|e| protocol(me, format!("event stream: {e}")))?;
            match decoded {
                EventFrame::Hello { subscription_id } => {
                    u.subscription = Some(subscription_id);
                    i += 1;
                }
                EventFrame::Batch(batch) => {
                    let Some(sub) = u.subscription else {
                        unreachable!("hello comes first")
                    };
                    let Some((spec_i, view)) = conn.views.get_mut(&sub) else {
                        // `subscribed` not read yet: keep the frame, and its successors.
                        break;
                    };
                    i += 1;
                    if *ctx.drop_one_event_frame && view.seen >= 3 {
                        *ctx.drop_one_event_frame = false;
                        ctx.log(now, format_args!("c{me} (canary: an event frame vanished)"));
                        continue;
                    }
                    let who = format!("c{me} sub {sub}");
                    for ev in batch.into_events() {
                        self.stats.events += 1;
                        ctx.oracle.events_seen += 1;
                        view.on_event(&who, ev.offset, &ev.payload)?;
                        if let Some(o) = ev.offset {
                            offsets::observe(ctx.oracle, view.shard, o, &ev.payload, "event")?;
                            self.subs[*spec_i].resume = Some(o + 1);
                            if self.role == Role::Auditor {
                                let e =
                                    self.audit.entry(view.shard).or_insert((o, BTreeMap::new()));
                                e.1.insert(o, ev.payload.clone());
                            }
                        }
                    }
                }
                EventFrame::End(end) => {
                    i += 1;
                    finished = Some(end);
                }
            }
        }
        u.held.drain(..i);
        let watch_stream = u.subscription.is_some()
            && self
                .watcher
                .as_ref()
                .is_some_and(|w| w.current == u.subscription);
        if watch_end.is_some() || (ended && watch_stream && u.held.is_empty()) {
            u.done = true;
            let sub = u.subscription;
            ctx.log(
                now,
                format_args!("c{me} watch {sub:?} ended: {watch_end:?}"),
            );
            if let Some(w) = self.watcher.as_mut() {
                w.current = None;
                if let Some(WatchEnd::Lagged(_)) = watch_end {
                    ctx.oracle.lagged += 1;
                }
            }
            self.open_bi(now, Purpose::Watch, ctx);
            return Ok(got);
        }
        if ended && finished.is_none() && u.held.is_empty() {
            finished = Some(
                reader
                    .handle_finish()
                    .map_err(|e| protocol(me, format!("event stream: {e}")))?,
            );
        }
        if let Some(end) = finished {
            u.done = true;
            let sub = u.subscription;
            ctx.log(
                now,
                format_args!("c{me} subscription {sub:?} ended: {end:?}"),
            );
            if let Some((spec_i, mut view)) = sub.and_then(|s| conn.views.remove(&s)) {
                if let SubscriptionEnd::Lagged { resume_from } = end {
                    ctx.oracle.lagged += 1;
                    view.on_lagged(&format!("c{me} sub {sub:?}"), resume_from)?;
                    self.subs[spec_i].resume = Some(resume_from);
                }
                // The shard's leadership moved: subscribe again (here, to be redirected) from
                // after the last record seen, or from where the broker stopped offering,
                // whichever is later, as the reference client does.
                if let SubscriptionEnd::ShardMoved {
                    resume_from: Some(r),
                    ..
                } = end
                {
                    let resume = &mut self.subs[spec_i].resume;
                    *resume = Some(resume.map_or(r, |o| o.max(r)));
                }
                if ctx.oracle.promise == Promise::Memory {
                    self.subs[spec_i].resume = None;
                }
                self.open_bi(now, Purpose::Subscribe(spec_i), ctx);
            }
        }
        Ok(got)
    }

    /// One workload step: a publish, a cache write or a cache read.
    fn act(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Result<(), Violation> {
        let roll = self.rng.below(10);
        if self.home.is_some() {
            // Cluster: acked publishes and cache calls, forwarded where this node is no owner.
            return if roll < 6 {
                self.publish(now, ctx)
            } else {
                self.cache_op(now, ctx)
            };
        }
        if roll < 5 {
            self.publish(now, ctx)
        } else if roll < 6 {
            self.idempotent_send(now, ctx)
        } else if roll < 8 || ctx.oracle.promise != crate::oracle::Promise::Durable {
            self.cache_op(now, ctx)
        } else {
            self.group_op(now, ctx)
        }
    }

    fn publish(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Result<(), Violation> {
        if self.home.is_none() && self.rng.chance(0.15) {
            return self.scratch_publish(now, ctx);
        }
        let me = self.id;
        let ack = *self
            .rng
            .pick(&[Ack::None, Ack::PerMessage, Ack::PerMessage, Ack::PerBatch]);
        let key = self
            .rng
            .chance(0.5)
            .then(|| format!("key{}", self.rng.below(16)).into_bytes());
        let n = 1 + self.rng.below(3) as usize;
        let pad = self.rng.below(300) as usize;
        let Some(conn) = &mut self.conn else {
            return Ok(());
        };
        let Some(id) = conn.publish_stream else {
            return Ok(());
        };
        let gen = conn.gen;
        let s = conn.bi.get_mut(&id).expect("stream");
        let Phase::Ready(rs) = &mut s.phase else {
            return Ok(());
        };
        if ack != Ack::None && !rs.can_publish_acked() {
            return Ok(());
        }
        let publisher = format!("c{me}g{gen}");
        let payloads: Vec<Bytes> = (0..n)
            .map(|_| {
                self.seq += 1;
                let mut p = format!("{publisher}:{}|", self.seq).into_bytes();
                p.resize(p.len() + pad, b'.');
                Bytes::from(p)
            })
            .collect();
        let shard = shard_for_key(key.as_deref(), self.shards, RoutingMapping::Modulo);
        let enc = rs
            .publish(
                Target {
                    namespace: NAMESPACE,
                    name: STREAM,
                },
                &payloads,
                key.as_deref(),
                ack,
            )
            .map_err(|e| protocol(me, format!("publish encode: {e}")))?;
        s.out.push_back(enc.frame);
        self.stats.publishes += 1;
        ctx.log(
            now,
            format_args!(
                "c{me} publish {}..+{n} shard {shard} {ack:?} req {:?}",
                crate::oracle::show(&payloads[0]),
                enc.request_id
            ),
        );
        if let Some(rid) = enc.request_id {
            ctx.oracle.request_sent(
                (me, gen, s.no, rid),
                now,
                format!("publish {}", crate::oracle::show(&payloads[0])),
            );
            s.reqs.insert(rid, ReqMeta::Publish { shard, payloads });
        }
        Ok(())
    }

    /// One acked publish to the scratch stream, which the operator deletes now and then.
    fn scratch_publish(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Result<(), Violation> {
        let me = self.id;
        let ack = *self.rng.pick(&[Ack::PerMessage, Ack::PerBatch]);
        let Some(conn) = &mut self.conn else {
            return Ok(());
        };
        let Some(id) = conn.publish_stream else {
            return Ok(());
        };
        let gen = conn.gen;
        let s = conn.bi.get_mut(&id).expect("stream");
        let Phase::Ready(rs) = &mut s.phase else {
            return Ok(());
        };
        if !rs.can_publish_acked() {
            return Ok(());
        }
        let payload = Bytes::from(format!("c{me}g{gen}:scratch|"));
        let target = Target {
            namespace: NAMESPACE,
            name: SCRATCH,
        };
        let enc = rs
            .publish(target, std::slice::from_ref(&payload), None, ack)
            .map_err(|e| protocol(me, format!("publish encode: {e}")))?;
        s.out.push_back(enc.frame);
        ctx.log(
            now,
            format_args!("c{me} publish {SCRATCH} {ack:?} req {:?}", enc.request_id),
        );
        if let Some(rid) = enc.request_id {
            let what = format!("publish {SCRATCH}");
            ctx.oracle.request_sent((me, gen, s.no, rid), now, what);
            s.reqs.insert(rid, ReqMeta::ScratchPublish);
        }
        Ok(())
    }

    /// The producer's pending batch again, or its next one, unless a send waits.
    fn idempotent_send(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Result<(), Violation> {
        let me = self.id;
        let Some(conn) = &mut self.conn else {
            return Ok(());
        };
        let Some(id) = conn.idempotent_stream else {
            return Ok(());
        };
        let gen = conn.gen;
        let s = conn.bi.get_mut(&id).expect("stream");
        if !matches!(s.phase, Phase::Ready(_)) {
            return Ok(());
        }
        let Some((frame, rid, batch)) = self.producer.next_send(&mut self.rng, self.shards) else {
            return Ok(());
        };
        let what = format!(
            "idempotent seq {} {}..+{} shard {}",
            batch.sequence,
            crate::oracle::show(&batch.payloads[0]),
            batch.payloads.len(),
            batch.shard
        );
        ctx.log(now, format_args!("c{me} {what} req {rid}"));
        ctx.oracle.request_sent((me, gen, s.no, rid), now, what);
        s.out.push_back(frame);
        self.stats.publishes += 1;
        Ok(())
    }

    fn on_idempotent_answer(
        &mut self,
        now: Instant,
        frame: &Frame,
        (gen, no): (u64, u64),
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Violation> {
        let me = self.id;
        let reply = read_guarded_reply(frame)
            .map_err(|e| protocol(me, format!("idempotent answer: {e}")))?;
        let waiting = self.producer.in_flight();
        let outcome = self.producer.on_answer(reply);
        if let (Some(rid), None) = (waiting, self.producer.in_flight()) {
            ctx.oracle.request_answered((me, gen, no, rid));
        }
        match outcome {
            Outcome::Written(batch, offset) => {
                self.stats.acks += 1;
                ctx.log(
                    now,
                    format_args!(
                        "c{me} idempotent ack seq {} {} shard {} offset {offset:?}",
                        batch.sequence,
                        crate::oracle::show(&batch.payloads[0]),
                        batch.shard
                    ),
                );
                idempotent_once::written(ctx.oracle, &batch, offset)
            }
            Outcome::Refused(batch, reason) => Err(idempotent_once::refused(&batch, &reason)),
            Outcome::Retry(why) => {
                self.stats.refusals += 1;
                ctx.log(now, format_args!("c{me} idempotent send failed: {why}"));
                Ok(())
            }
            Outcome::Stray => Err(protocol(me, "an idempotent answer to no send".into())),
        }
    }

    fn cache_op(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Result<(), Violation> {
        let me = self.id;
        let roll = self.rng.below(10);
        let own = format!("c{me}.k{}", self.rng.below(KEYS_PER_CLIENT as u64));
        let any = format!(
            "c{}.k{}",
            self.rng.below(ctx.client_count as u64),
            self.rng.below(KEYS_PER_CLIENT as u64)
        );
        let ttl = self
            .rng
            .chance(0.4)
            .then(|| Duration::from_millis(self.rng.range(20..3000)));
        self.cache_values += 1;
        let value = Bytes::from(format!(
            "c{me}v{}:{}|",
            self.cache_values, self.cache_values
        ));
        let Some(conn) = &mut self.conn else {
            return Ok(());
        };
        let Some(id) = conn.cache_stream else {
            return Ok(());
        };
        let gen = conn.gen;
        let s = conn.bi.get_mut(&id).expect("stream");
        let Phase::Ready(rs) = &mut s.phase else {
            return Ok(());
        };
        let target = Target {
            namespace: NAMESPACE,
            name: CACHE,
        };
        let (enc, meta, what) = if roll < 5 {
            let enc = rs
                .cache_get(target, &any)
                .map_err(|e| protocol(me, e.to_string()))?;
            (
                enc,
                ReqMeta::CacheGet {
                    key: any.clone(),
                    sent: now,
                },
                format!("get {any}"),
            )
        } else {
            if self.cache_busy.contains(&own) {
                return Ok(());
            }
            let (enc, value, what) = if roll < 9 {
                let ttl_ms = ttl.map(|t| t.as_millis() as u64);
                let enc = rs
                    .cache_put(target, &own, &value, ttl_ms)
                    .map_err(|e| protocol(me, e.to_string()))?;
                let what = format!("put {own}={} ttl {ttl_ms:?}", crate::oracle::show(&value));
                (enc, Some(value), what)
            } else {
                let enc = rs
                    .cache_delete(target, &own)
                    .map_err(|e| protocol(me, e.to_string()))?;
                (enc, None, format!("delete {own}"))
            };
            let ttl = if value.is_some() { ttl } else { None };
            let index = ctx.oracle.cache_write_sent(&own, value, ttl, now);
            self.cache_busy.insert(own.clone());
            (enc, ReqMeta::CacheWrite { key: own, index }, what)
        };
        let rid = enc.request_id.expect("cache requests carry ids");
        s.out.push_back(enc.frame);
        s.reqs.insert(rid, meta);
        self.stats.cache_ops += 1;
        ctx.oracle
            .request_sent((me, gen, s.no, rid), now, what.clone());
        ctx.log(now, format_args!("c{me} cache {what} req {rid}"));
        Ok(())
    }

    /// A `not_leader` answered subscription `i`: count the hop (`redirects_end`) and move
    /// the connection to the owner it names at the next turn.
    fn on_not_leader(
        &mut self,
        now: Instant,
        i: usize,
        nl: felix_proto::message::NotLeader,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Violation> {
        let me = self.id;
        self.hops += 1;
        self.stats.redirects += 1;
        let from = self.home.unwrap_or(ctx.broker_addr);
        ctx.log(
            now,
            format_args!(
                "c{me} not_leader for shard {}: {} {:?} generation {} (hop {})",
                self.subs[i].shard, nl.node_id, nl.addr, nl.generation, self.hops
            ),
        );
        let to = nl
            .addr
            .as_deref()
            .and_then(|a| a.parse::<SocketAddr>().ok());
        if nl.addr.is_none() {
            // The node knows the owner but not yet its address (the owner's join is not
            // applied there yet): not a hop; ask the same node again shortly.
            self.hops -= 1;
            self.stats.addressless_redirects += 1;
            let wait = self
                .rng
                .duration(Duration::from_millis(100), Duration::from_millis(600));
            self.redirect_to = Some((from, now + wait));
            return Ok(());
        }
        // A node whose metadata is behind names a leader older than one this chain was
        // already sent to: not a broker's redirect loop but a stale view. Go back to the
        // newest named leader after a pause (its metadata, or the stale node's, catches up);
        // not a hop.
        if let (Some((newest, at)), Some(_)) = (self.newest_redirect, to) {
            if nl.generation < newest {
                self.hops -= 1;
                let wait = self
                    .rng
                    .duration(Duration::from_millis(100), Duration::from_millis(600));
                self.redirect_to = Some((at, now + wait));
                return Ok(());
            }
        }
        if let Some(to) = to {
            if self.newest_redirect.is_none_or(|(g, _)| nl.generation >= g) {
                self.newest_redirect = Some((nl.generation, to));
            }
        }
        if !ctx.quiet {
            self.loud_hops = self.hops;
        }
        let hops = ctx.quiet.then_some(self.hops - self.loud_hops);
        crate::invariants::redirects_end::check_hop(me, hops, from, to, &nl.node_id)?;
        let to = to.expect("checked");
        let to = if ctx.redirect_loop { from } else { to };
        self.redirect_to = Some((to, now));
        Ok(())
    }

    /// Closes the connection and dials `to` at once.
    fn follow_redirect(
        &mut self,
        now: Instant,
        to: SocketAddr,
        ctx: &mut Ctx<'_>,
        out: &mut Vec<(SocketAddr, Bytes)>,
    ) {
        let local = self.local(now);
        if let Some(conn) = &mut self.conn {
            conn.quic
                .close(local, 0u32.into(), Bytes::from_static(b"redirected"));
            let mut buf = Vec::new();
            while let Some(t) = conn.quic.poll_transmit(local, 1, &mut buf) {
                out.push((t.destination, Bytes::copy_from_slice(&buf[..t.size])));
                buf.clear();
            }
        }
        self.connection_lost(now, "redirected", ctx);
        self.home = Some(to);
        self.reconnect_at = Some(now);
    }

    /// The current connection's generation and when the broker was last heard on it.
    pub(crate) fn last_heard(&self) -> Option<(u64, Instant)> {
        self.conn.as_ref().map(|c| (c.gen, c.last_heard))
    }

    /// Outstanding work, for the end-of-run summary.
    pub(crate) fn describe(&self) -> String {
        format!(
            "c{} {:?} gen {} connected {} {:?}",
            self.id,
            self.role,
            self.gen,
            self.is_connected(),
            self.stats
        )
    }
}

/// A `cache_event` carrying a value (the canary drops only those: a put is what the
/// watch invariant accounts for).
fn is_put_change(frame: &Frame) -> bool {
    matches!(
        read_watch_event(frame),
        Ok(CacheWatchItem::Change(c)) if c.value.is_some()
    )
}

fn protocol(client: usize, detail: String) -> Violation {
    Violation {
        invariant: "broker_protocol",
        detail: format!("c{client}: {detail}"),
    }
}

/// Reads what `id` has (the kit's reader): whether anything arrived, and whether the
/// stream ended (finished or reset).
fn read_into(quic: &mut Connection, id: StreamId, decoder: &mut FrameDecoder) -> (bool, bool) {
    let r = felix_testkit::read_stream(quic, id, decoder);
    (r.read, r.finished || r.reset.is_some())
}
