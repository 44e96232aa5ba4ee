//! A simulated client: a real quinn-proto client connection carrying the felix-client Sans-IO
//! core (auth, request correlation, event-stream decoding), with a seeded workload that
//! publishes (acked, unacked, keyed), subscribes, and uses the cache, and tells the oracle
//! everything it was promised and everything it saw. In a cluster run it also carries the
//! core's cluster state machine (`felix_client::core::cluster::Cluster`): one connection per
//! broker the core routes to, and every dial, `topology` and `shard_owners` question,
//! redirect and retry as the core decides (`drive_cluster`, `route`, `on_not_leader`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use felix_client::core::cluster::{
    Attempts, Cluster, ClusterConfig, Next, Object, RedirectRefused, Redirects, Resend, Route,
    Routing,
};
use felix_client::core::stream_ops::{
    read_shard_owners, read_topology, shard_owners_frame, topology_frame,
};
use felix_client::core::{
    auth_frame, read_auth_reply, read_guarded_reply, read_subscribe_reply, read_watch_event,
    subscribe_frame, Ack, Answer, CacheWatchItem, Capabilities, EventFrame, EventStreamReader,
    Offer, RequestKind, RequestStream, Start, SubscribeRequest, SubscriptionEnd, Target,
};
use felix_client::ClientError;
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
/// serves it (`redirects_end`): the bound the cluster core enforces, as for our SDK.
pub(crate) const MAX_REDIRECT_HOPS: usize = felix_client::core::cluster::DEFAULT_MAX_REDIRECT_HOPS;
/// Cluster runs: while no broker's connection is up, how long before another is dialled.
const DIAL_AGAIN: Duration = Duration::from_millis(1_000);
/// Cluster runs: how soon a subscription that could not be placed (no entry yet, owners
/// being asked) is tried again.
const PLACE_AGAIN: Duration = Duration::from_millis(100);
/// Cluster runs: how often a client asks a broker `topology` again (the SDK's default, 30 s,
/// would ask once per run).
const TOPOLOGY_INTERVAL: (Duration, Duration) =
    (Duration::from_millis(1_000), Duration::from_millis(4_000));

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
    /// Cluster runs: the broker its subscribe stream is on, while it is on one.
    at: Option<SocketAddr>,
    /// Cluster runs: when it is placed again (the core's backoff after a failed attempt).
    due: Option<Instant>,
    /// Cluster runs: this attempt's redirects (the core's), and whether the attempt began
    /// once the faults were over (`redirects_end` holds those to the hop bound).
    redirects: Option<(Redirects, bool)>,
    /// Cluster runs: the attempts since it was last served (the core's retry state).
    attempts: Option<Attempts>,
}

impl SubSpec {
    fn new(shard: u32, start: Start) -> SubSpec {
        SubSpec {
            shard,
            start,
            resume: None,
            at: None,
            due: None,
            redirects: None,
            attempts: None,
        }
    }
}

/// What a routed call is on.
#[derive(Debug, Clone, Copy)]
enum Routed {
    Stream,
    Cache,
}

/// A one-request question a cluster client asks a broker for the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ask {
    Topology,
    StreamOwners,
    CacheOwners,
}

/// A cluster client's routing: the felix-client core's [`Cluster`] decides where each call
/// goes (dial order, entry, `topology`, `shard_owners`, redirects, retry backoff); this
/// client only carries its decisions out and reports what happened.
struct Net {
    core: Cluster,
    stream: Object,
    cache: Object,
    /// Questions in flight (one of each at a time).
    asking: BTreeSet<Ask>,
    /// When to dial again while no broker is connected or being dialled.
    dial_at: Instant,
}

#[derive(Debug)]
enum ReqMeta {
    Publish {
        shard: u32,
        payloads: Vec<Bytes>,
        /// Its routing key (a cluster client hands an ack's owner hint to the core with it).
        key: Option<Vec<u8>>,
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
    /// A question for the core sent, waiting for its answer.
    Asking,
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
    /// Cluster runs: one question for the core (`topology`, `shard_owners`).
    Ask(Ask),
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
    /// The broker it is to.
    addr: SocketAddr,
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
    /// One connection per broker in use: the one broker's, or in a cluster run those the
    /// core's routing asked for (opened on first use).
    conns: BTreeMap<SocketAddr, Conn>,
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
    /// Cluster runs: the core's routing (`None`: the one broker).
    net: Option<Net>,
    /// Cluster runs: the broker that served the last subscription (the auditor's read-back).
    pub(crate) served_by: Option<SocketAddr>,
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
    /// Cluster runs: `shard_owners` and `topology` answers the core was fed.
    pub(crate) owners_answers: u64,
    pub(crate) topology_answers: u64,
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
    /// Cluster runs: the node to connect to first (its one seed), and (for an auditor) the
    /// one shard it reads. A cluster client publishes, uses the cache and keeps at most one
    /// subscription, each call where the core routes it.
    pub(crate) cluster: Option<(SocketAddr, Option<u32>)>,
    /// Cluster runs: `ByOwners` routes by `shard_owners`; `EntryOnly` sends every call to
    /// the entry broker, which forwards (what `forwarded_acks` needs).
    pub(crate) routing: Routing,
}

impl SimClient {
    pub(crate) fn new(s: Setup) -> SimClient {
        let mut rng = s.rng;
        let endpoint = crate::crypto::client_endpoint(rng.fork("endpoint"));
        let mut config = ClientConfig::new(s.crypto);
        config
            .initial_dst_cid_provider(crate::crypto::initial_cid_provider(rng.fork("initial cid")));
        let window: u32 = if s.slow { 16 * 1024 } else { 1024 * 1024 };
        let cluster = s.cluster.is_some();
        // A cluster client notices a dead or frozen broker as our SDK's cluster client does:
        // after its idle timeout (`DEFAULT_IDLE_TIMEOUT`), keep-alives at a quarter of it.
        let (keep_alive, idle_timeout) = if cluster {
            let idle = felix_client::DEFAULT_IDLE_TIMEOUT;
            (idle / 4, idle)
        } else {
            (Duration::from_millis(1000), Duration::from_millis(5_000))
        };
        config.transport_config(felix_testkit::client_transport(
            &felix_testkit::ClientTransport {
                stream_window: window,
                max_uni_streams: 64,
                keep_alive: Some(keep_alive),
                idle_timeout: Some(idle_timeout),
            },
        ));
        let subs = match s.role {
            Role::Auditor if cluster => {
                let shard = s.cluster.and_then(|c| c.1).unwrap_or(0);
                vec![SubSpec::new(shard, Start::Earliest)]
            }
            Role::Auditor => (0..s.shards)
                .map(|shard| SubSpec::new(shard, Start::Earliest))
                .collect(),
            Role::Worker => {
                let n = rng.below(if cluster { 2 } else { 3 });
                (0..n)
                    .map(|_| {
                        let shard = rng.below(u64::from(s.shards)) as u32;
                        let start = if s.durable {
                            *rng.pick(&[Start::Latest, Start::Earliest, Start::Offset(0)])
                        } else {
                            Start::Latest
                        };
                        SubSpec::new(shard, start)
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
        let net = s.cluster.map(|(seed, _)| {
            if s.routing == Routing::ByOwners {
                offer.features = offer.features.union(felix_proto::Features::SHARD_OWNERS);
            }
            offer.features = offer.features.union(felix_proto::Features::TOPOLOGY);
            let mut config = ClusterConfig::new(vec![seed]);
            config.seed = rng.fork("cluster core").next_u64();
            config.routing = s.routing;
            config.topology_interval = rng.duration(TOPOLOGY_INTERVAL.0, TOPOLOGY_INTERVAL.1);
            // Resubscriptions are retried for as long as the run lasts.
            config.retry.max_attempts = u32::MAX;
            Net {
                core: Cluster::new(config),
                stream: Object::stream(NAMESPACE, STREAM),
                cache: Object::cache(NAMESPACE, CACHE),
                asking: BTreeSet::new(),
                dial_at: s.now,
            }
        });
        SimClient {
            id: s.id,
            addr: SocketAddr::from(([127, 0, 1, (s.id % 250) as u8 + 1], 40_000 + s.id as u16)),
            role: s.role,
            offer,
            endpoint,
            config,
            conns: BTreeMap::new(),
            gen: 0,
            skew: Duration::ZERO,
            stuck_until: None,
            stuck_inbox: Vec::new(),
            read_every: s
                .slow
                .then(|| rng.duration(Duration::from_millis(100), Duration::from_millis(800))),
            next_read: s.now,
            reconnect_at: (!cluster).then_some(s.now),
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
            net,
            served_by: None,
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
        self.conns.values().any(|c| c.connected)
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
        if let Some(net) = &self.net {
            if net.core.entry().is_none() && !self.conns.values().any(|c| c.connected) {
                consider(net.dial_at);
            }
            // A `topology` refresh, unless one is being asked (it is due until answered).
            if let Some(t) = net.core.poll_timeout() {
                if !net.asking.contains(&Ask::Topology) {
                    consider(t);
                }
            }
            for spec in &self.subs {
                if let (None, Some(t)) = (spec.at, spec.due) {
                    consider(t);
                }
            }
        }
        for conn in self.conns.values_mut() {
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
                if let Some(conn) = self.conns.values_mut().find(|c| c.ch == ch) {
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
        if self.reconnect_at.is_some_and(|t| t <= now) {
            self.reconnect_at = None;
            self.connect(now, ctx.broker_addr, ctx);
        }
        let local = self.local(now);
        for conn in self.conns.values_mut() {
            if conn.quic.poll_timeout().is_some_and(|t| t <= local) {
                conn.quic.handle_timeout(local);
            }
        }
        if self.net.is_some() {
            self.drive_cluster(now, ctx)?;
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

    /// Dials `to` (the one broker, or a broker the core routed to).
    fn connect(&mut self, now: Instant, to: SocketAddr, ctx: &mut Ctx<'_>) {
        self.gen += 1;
        self.stats.connects += 1;
        let local = self.local(now);
        match self
            .endpoint
            .connect(local, self.config.clone(), to, "localhost")
        {
            Ok((ch, quic)) => {
                if self.net.is_some() {
                    ctx.log(
                        now,
                        format_args!("c{} connect gen {} to {to}", self.id, self.gen),
                    );
                } else {
                    ctx.log(now, format_args!("c{} connect gen {}", self.id, self.gen));
                }
                let conn = Conn {
                    addr: to,
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
                };
                self.conns.insert(to, conn);
            }
            Err(e) => {
                ctx.log(now, format_args!("c{} connect failed: {e}", self.id));
                match &mut self.net {
                    Some(net) => {
                        net.core.handle_connection_lost(to, now);
                        net.dial_at = now + Duration::from_millis(500);
                    }
                    None => self.reconnect_at = Some(now + Duration::from_millis(500)),
                }
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
        let addrs: Vec<SocketAddr> = self.conns.keys().copied().collect();
        for at in addrs {
            self.process_conn(now, at, ctx, out, read_events)?;
        }
        Ok(())
    }

    /// [`SimClient::process`] for the connection to `at`.
    fn process_conn(
        &mut self,
        now: Instant,
        at: SocketAddr,
        ctx: &mut Ctx<'_>,
        out: &mut Vec<(SocketAddr, Bytes)>,
        read_events: bool,
    ) -> Result<(), Violation> {
        let local = self.local(now);
        for _round in 0..64 {
            let Some(conn) = self.conns.get_mut(&at) else {
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
                        let Some(conn) = self.conns.get_mut(&at) else {
                            return Ok(());
                        };
                        conn.connected = true;
                        ctx.log(now, format_args!("c{} connected gen {}", self.id, conn.gen));
                        if let Some(net) = &mut self.net {
                            net.core.handle_connected(at, now);
                        }
                        self.open_streams(now, at, ctx);
                    }
                    Event::ConnectionLost { reason } => {
                        self.connection_lost(now, at, &reason.to_string(), ctx);
                        return Ok(());
                    }
                    Event::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                        let Some(conn) = self.conns.get_mut(&at) else {
                            return Ok(());
                        };
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
            if self.read_streams(now, at, ctx, read_events)? {
                moved = true;
            }
            if self.flush_writes(at) {
                moved = true;
            }
            let Some(conn) = self.conns.get_mut(&at) else {
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

    fn connection_lost(&mut self, now: Instant, at: SocketAddr, reason: &str, ctx: &mut Ctx<'_>) {
        let Some(conn) = self.conns.remove(&at) else {
            return;
        };
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
            if let (Purpose::Ask(ask), Phase::Authing | Phase::Asking) = (s.purpose, &s.phase) {
                self.ask_failed(now, ask);
            }
        }
        ctx.oracle.connection_closed(self.id, conn.gen);
        if self.net.is_none() {
            self.producer.connection_lost(ctx.resend_as_new);
            let backoff = self
                .rng
                .duration(Duration::from_millis(50), Duration::from_millis(1000));
            self.reconnect_at = Some(now + backoff);
            return;
        }
        // A cluster client tells the core, and places again (after the core's backoff) each
        // subscription that was on the lost broker.
        let lost = ClientError::Connection(format!("connection to {at} lost: {reason}"));
        if let Some(net) = &mut self.net {
            net.core.handle_connection_lost(at, now);
            if self.conns.is_empty() {
                net.dial_at = now;
            }
        }
        for i in 0..self.subs.len() {
            if self.subs[i].at == Some(at) {
                self.sub_failed(now, i, lost.clone(), true, ctx);
            }
        }
    }

    fn open_bi(
        &mut self,
        now: Instant,
        at: SocketAddr,
        purpose: Purpose,
        ctx: &mut Ctx<'_>,
    ) -> Option<StreamId> {
        let conn = self.conns.get_mut(&at)?;
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

    fn open_streams(&mut self, now: Instant, at: SocketAddr, ctx: &mut Ctx<'_>) {
        if self.net.is_some() {
            // A cluster client: publishes and cache calls on every broker's connection, each
            // call on the one the core routes it to. Subscriptions are placed by the core
            // (`place_subs`).
            if self.role == Role::Worker {
                let p = self.open_bi(now, at, Purpose::Publish, ctx);
                let c = self.open_bi(now, at, Purpose::Cache, ctx);
                if let Some(conn) = self.conns.get_mut(&at) {
                    conn.publish_stream = p;
                    conn.cache_stream = c;
                }
            }
            for i in 0..self.subs.len() {
                if self.subs[i].at == Some(at)
                    && self.open_bi(now, at, Purpose::Subscribe(i), ctx).is_none()
                {
                    self.subs[i].at = None;
                    self.subs[i].due = Some(now + PLACE_AGAIN);
                }
            }
            return;
        }
        if self.role == Role::Worker {
            let p = self.open_bi(now, at, Purpose::Publish, ctx);
            let c = self.open_bi(now, at, Purpose::Cache, ctx);
            let i = self.open_bi(now, at, Purpose::Idempotent, ctx);
            let g = (ctx.oracle.promise == crate::oracle::Promise::Durable)
                .then(|| self.open_bi(now, at, Purpose::Group, ctx))
                .flatten();
            if let Some(conn) = self.conns.get_mut(&at) {
                conn.publish_stream = p;
                conn.cache_stream = c;
                conn.idempotent_stream = i;
                conn.group.stream = g;
            }
        }
        if self.role == Role::Auditor && ctx.oracle.promise == crate::oracle::Promise::Durable {
            let g = self.open_bi(now, at, Purpose::Group, ctx);
            if let Some(conn) = self.conns.get_mut(&at) {
                conn.group.stream = g;
            }
        }
        for i in 0..self.subs.len() {
            self.open_bi(now, at, Purpose::Subscribe(i), ctx);
        }
        if self.watcher.is_some() {
            self.open_bi(now, at, Purpose::Watch, ctx);
        }
    }

    fn flush_writes(&mut self, at: SocketAddr) -> bool {
        let Some(conn) = self.conns.get_mut(&at) else {
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
        at: SocketAddr,
        ctx: &mut Ctx<'_>,
        read_events: bool,
    ) -> Result<bool, Violation> {
        let mut moved = false;
        let ids: Vec<StreamId> = match self.conns.get(&at) {
            Some(c) => c.bi.keys().copied().collect(),
            None => return Ok(false),
        };
        for id in ids {
            let mut failed_ask = None;
            let frames = {
                let Some(conn) = self.conns.get_mut(&at) else {
                    return Ok(moved);
                };
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
                    if let Purpose::Ask(ask) = s.purpose {
                        failed_ask = Some(ask);
                    }
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
                self.on_bi_frame(now, at, id, &f, ctx)?;
            }
            if let Some(ask) = failed_ask {
                self.ask_failed(now, ask);
            }
        }
        let reading = read_events;
        if reading {
            let ids: Vec<StreamId> = self
                .conns
                .get(&at)
                .map(|c| c.uni.keys().copied().collect())
                .unwrap_or_default();
            for id in ids {
                if self.read_uni(now, at, id, ctx)? {
                    moved = true;
                }
            }
        }
        Ok(moved)
    }

    fn on_bi_frame(
        &mut self,
        now: Instant,
        at: SocketAddr,
        id: StreamId,
        frame: &Frame,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Violation> {
        let me = self.id;
        let Some(conn) = self.conns.get_mut(&at) else {
            return Ok(());
        };
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
                    Purpose::Ask(ask) => {
                        let f = match ask {
                            Ask::Topology => topology_frame(),
                            Ask::StreamOwners => shard_owners_frame(
                                TENANT,
                                NAMESPACE,
                                STREAM,
                                felix_proto::message::ShardKind::Stream,
                            ),
                            Ask::CacheOwners => shard_owners_frame(
                                TENANT,
                                NAMESPACE,
                                CACHE,
                                felix_proto::message::ShardKind::Cache,
                            ),
                        };
                        s.out.push_back(f);
                        ctx.oracle
                            .request_sent((me, gen, no, u64::MAX), now, format!("{ask:?}"));
                        s.phase = Phase::Asking;
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
                    return self.on_not_leader(now, at, i, nl, ctx);
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
                        if self.net.is_some() {
                            let spec = &mut self.subs[i];
                            spec.redirects = None;
                            spec.attempts = None;
                            self.served_by = Some(at);
                        }
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
                        if self.net.is_some() {
                            // A node not serving yet (or its shard's leader away): the core
                            // says whether and when to try again, and where.
                            self.sub_failed(now, i, e, true, ctx);
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
            Phase::Asking => {
                ctx.oracle.request_answered((me, gen, no, u64::MAX));
                // One question, one answer: the stream is done on our side (as the SDK's
                // one-shot requests end theirs).
                let _ = conn.quic.send_stream(id).finish();
                let Purpose::Ask(ask) = s.purpose else {
                    unreachable!("only a question is asked")
                };
                self.on_ask_answer(now, at, ask, frame, ctx);
            }
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
                if let (Some(net), Some(ReqMeta::Publish { key, .. })) = (&mut self.net, &meta) {
                    // A forwarded batch's ack names its shard's owner: the core routes the
                    // next one there.
                    if let Some(owner) = done.owner.as_ref().and_then(|o| o.addr.as_deref()) {
                        net.core
                            .handle_owner_hint(&net.stream, key.as_deref(), owner, now);
                    }
                }
                self.on_completion(now, at, done.kind, done.result, meta, ctx)?;
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
        at: SocketAddr,
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
            (
                Some(ReqMeta::Publish {
                    shard, payloads, ..
                }),
                Ok(Answer::Published { offset }),
            ) => {
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
                            if let (true, Some(leader)) = (self.net.is_some(), leader) {
                                if at != *leader {
                                    ctx.oracle.forwarded_acks.push((shard, o, p.clone(), at));
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
                if let Some(net) = &mut self.net {
                    // An owner that refuses the shard as not its own is forgotten as owner.
                    let object = match &meta {
                        Some(ReqMeta::CacheWrite { .. } | ReqMeta::CacheGet { .. }) => &net.cache,
                        _ => &net.stream,
                    };
                    if matches!(e, ClientError::NotLeader { .. })
                        || matches!(
                            e.code(),
                            Some(
                                felix_proto::ErrorCode::NotLeader
                                    | felix_proto::ErrorCode::ShardUnavailable
                            )
                        )
                    {
                        net.core.handle_stale_owner(object);
                    }
                }
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
        at: SocketAddr,
        id: StreamId,
        ctx: &mut Ctx<'_>,
    ) -> Result<bool, Violation> {
        let me = self.id;
        let Some(conn) = self.conns.get_mut(&at) else {
            return Ok(false);
        };
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
            self.open_bi(now, at, Purpose::Watch, ctx);
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
                // The shard's leadership moved: subscribe again from after the last record
                // seen, or from where the broker stopped offering, whichever is later, as the
                // reference client does.
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
                match &mut self.net {
                    // A cluster client asks the core where the shard is now (a move makes
                    // its owners stale) and subscribes there.
                    Some(net) => {
                        if matches!(end, SubscriptionEnd::ShardMoved { .. }) {
                            net.core.handle_stale_owner(&net.stream);
                        }
                        let spec = &mut self.subs[spec_i];
                        spec.at = None;
                        spec.due = Some(now);
                        spec.redirects = None;
                    }
                    None => {
                        self.open_bi(now, at, Purpose::Subscribe(spec_i), ctx);
                    }
                }
            }
        }
        Ok(got)
    }

    /// One workload step: a publish, a cache write or a cache read.
    fn act(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Result<(), Violation> {
        let roll = self.rng.below(10);
        if self.net.is_some() {
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
        if self.net.is_none() && self.rng.chance(0.15) {
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
        let Some(at) = self.route(now, Routed::Stream, key.as_deref(), ctx) else {
            return Ok(());
        };
        let Some(conn) = self.conns.get_mut(&at) else {
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
            s.reqs.insert(
                rid,
                ReqMeta::Publish {
                    shard,
                    payloads,
                    key,
                },
            );
        }
        Ok(())
    }

    /// One acked publish to the scratch stream, which the operator deletes now and then.
    fn scratch_publish(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Result<(), Violation> {
        let me = self.id;
        let ack = *self.rng.pick(&[Ack::PerMessage, Ack::PerBatch]);
        let Some(conn) = self.conns.values_mut().next() else {
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
        let Some(conn) = self.conns.values_mut().next() else {
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
        let key = if roll < 5 { &any } else { &own };
        let Some(at) = self.route(now, Routed::Cache, Some(key.as_bytes()), ctx) else {
            return Ok(());
        };
        let Some(conn) = self.conns.get_mut(&at) else {
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

    /// Where a call on the stream or the cache with `key` goes now: the connection to send
    /// it on, once that connection is up. A single-node client has one. A cluster client
    /// asks the core, which may first want a broker dialled or `shard_owners` asked; the
    /// call is not made meanwhile (the workload draws another at its next turn).
    fn route(
        &mut self,
        now: Instant,
        what: Routed,
        key: Option<&[u8]>,
        ctx: &mut Ctx<'_>,
    ) -> Option<SocketAddr> {
        let route = {
            let Some(net) = &self.net else {
                return self.conns.keys().next().copied();
            };
            let object = match what {
                Routed::Stream => &net.stream,
                Routed::Cache => &net.cache,
            };
            net.core.route(object, key, now)
        };
        match route {
            Route::Owner { addr, .. } | Route::Entry { addr } => self.use_broker(now, addr, ctx),
            Route::AskOwners { entry } => {
                let ask = match what {
                    Routed::Stream => Ask::StreamOwners,
                    Routed::Cache => Ask::CacheOwners,
                };
                self.ask(now, entry, ask, ctx);
                None
            }
            Route::NoEntry => None,
            Route::Unavailable { shard, lost } => {
                self.stats.refusals += 1;
                let e = Route::unavailable_error(shard, lost);
                ctx.log(
                    now,
                    format_args!("c{} {what:?} call not made: {e}", self.id),
                );
                None
            }
        }
    }

    /// The connection to `addr` when it is up; dialled now when there is none.
    fn use_broker(
        &mut self,
        now: Instant,
        addr: SocketAddr,
        ctx: &mut Ctx<'_>,
    ) -> Option<SocketAddr> {
        match self.conns.get(&addr) {
            Some(c) if c.connected => Some(addr),
            Some(_) => None,
            None => {
                self.connect(now, addr, ctx);
                None
            }
        }
    }

    /// Asks `ask` of the broker at `at`, unless that question is in flight already.
    fn ask(&mut self, now: Instant, at: SocketAddr, ask: Ask, ctx: &mut Ctx<'_>) {
        if self.net.as_ref().is_none_or(|n| n.asking.contains(&ask)) {
            return;
        }
        if self.use_broker(now, at, ctx).is_none() {
            return;
        }
        if self.open_bi(now, at, Purpose::Ask(ask), ctx).is_some() {
            if let Some(net) = &mut self.net {
                net.asking.insert(ask);
            }
        }
    }

    /// A question's answer, handed to the core.
    fn on_ask_answer(
        &mut self,
        now: Instant,
        at: SocketAddr,
        ask: Ask,
        frame: &Frame,
        ctx: &mut Ctx<'_>,
    ) {
        let me = self.id;
        let Some(net) = &mut self.net else { return };
        net.asking.remove(&ask);
        let object = match ask {
            Ask::Topology => {
                let view = read_topology(frame).ok();
                self.stats.topology_answers += u64::from(view.is_some());
                net.core.handle_topology(view.as_ref(), now);
                ctx.log(
                    now,
                    format_args!(
                        "c{me} topology from {at}: {:?}",
                        view.map(|v| v.brokers.len())
                    ),
                );
                return;
            }
            Ask::StreamOwners => net.stream.clone(),
            Ask::CacheOwners => net.cache.clone(),
        };
        match read_shard_owners(frame) {
            Ok(view) => {
                self.stats.owners_answers += 1;
                net.core.handle_shard_owners(&object, &view, now);
            }
            Err(_) => net.core.handle_owners_failed(&object, now),
        }
        ctx.log(
            now,
            format_args!(
                "c{me} {ask:?} from {at}: {:?}",
                net.core.owners(&object).unwrap_or_default()
            ),
        );
    }

    /// A question went unanswered (its stream or connection ended): the core keeps what it
    /// knew.
    fn ask_failed(&mut self, now: Instant, ask: Ask) {
        let Some(net) = &mut self.net else { return };
        net.asking.remove(&ask);
        match ask {
            Ask::Topology => net.core.handle_topology(None, now),
            Ask::StreamOwners => net.core.handle_owners_failed(&net.stream, now),
            Ask::CacheOwners => net.core.handle_owners_failed(&net.cache, now),
        }
    }

    /// A cluster client's turn: an entry (the core's dial order), `topology` when the core
    /// says it is due, and each subscription not on a broker placed where the core routes
    /// its shard.
    fn drive_cluster(&mut self, now: Instant, ctx: &mut Ctx<'_>) -> Result<(), Violation> {
        let Some(net) = &mut self.net else {
            return Ok(());
        };
        if net.core.entry().is_none() {
            let up = self.conns.values().find(|c| c.connected).map(|c| c.addr);
            if let Some(addr) = up {
                // The entry was lost while another broker's connection is up: it enters.
                net.core.handle_connected(addr, now);
            } else if net.dial_at <= now {
                // None up: dial the next broker in the core's order not being dialled, and
                // another a while later if none has answered by then.
                net.dial_at = now + DIAL_AGAIN;
                let next = net
                    .core
                    .dial_order(now)
                    .into_iter()
                    .find(|a| !self.conns.contains_key(a));
                if let Some(addr) = next {
                    self.connect(now, addr, ctx);
                }
            }
        }
        let Some(net) = &mut self.net else {
            return Ok(());
        };
        if net.core.topology_due(now) && !net.asking.contains(&Ask::Topology) {
            net.core.begin_topology(now);
            let entry = net.core.entry();
            if let (Some(target), Some(entry)) = (net.core.topology_target(now), entry) {
                // The broker the core picks when it is up, else the entry (and the target is
                // dialled for the next turn).
                let at = self.use_broker(now, target, ctx).unwrap_or(entry);
                self.ask(now, at, Ask::Topology, ctx);
            }
        }
        for i in 0..self.subs.len() {
            let spec = &self.subs[i];
            if spec.at.is_none() && spec.due.is_none_or(|t| t <= now) {
                self.place_sub(now, i, ctx);
            }
        }
        Ok(())
    }

    /// Subscription `i` goes where the core routes its shard; a new attempt, with its own
    /// hop bound.
    fn place_sub(&mut self, now: Instant, i: usize, ctx: &mut Ctx<'_>) {
        let Some(net) = &self.net else { return };
        let route = net.core.route_shard(&net.stream, self.subs[i].shard, now);
        match route {
            Route::Owner { addr, .. } | Route::Entry { addr } => {
                self.subs[i].redirects = Some((Redirects::new(addr, MAX_REDIRECT_HOPS), ctx.quiet));
                self.sub_at(now, i, addr, ctx);
            }
            Route::AskOwners { entry } => {
                self.ask(now, entry, Ask::StreamOwners, ctx);
                self.subs[i].due = Some(now + PLACE_AGAIN);
            }
            Route::NoEntry => self.subs[i].due = Some(now + PLACE_AGAIN),
            Route::Unavailable { shard, lost } => {
                self.sub_failed(now, i, Route::unavailable_error(shard, lost), false, ctx);
            }
        }
    }

    /// Subscription `i` subscribes at `addr`: now when its connection is up, else once it
    /// is (`open_streams`), dialled now when there is none.
    fn sub_at(&mut self, now: Instant, i: usize, addr: SocketAddr, ctx: &mut Ctx<'_>) {
        self.subs[i].at = Some(addr);
        self.subs[i].due = None;
        if self.use_broker(now, addr, ctx).is_some()
            && self
                .open_bi(now, addr, Purpose::Subscribe(i), ctx)
                .is_none()
        {
            self.subs[i].at = None;
            self.subs[i].due = Some(now + PLACE_AGAIN);
        }
    }

    /// Subscription `i`'s attempt failed with `error` (`sent`: its request reached a
    /// broker): it is placed again after the core's backoff. A terminal refusal (a cursor
    /// past retention) starts it over from the live end, as a single-node client does.
    fn sub_failed(
        &mut self,
        now: Instant,
        i: usize,
        error: ClientError,
        sent: bool,
        ctx: &mut Ctx<'_>,
    ) {
        let me = self.id;
        let Some(net) = &mut self.net else { return };
        let spec = &mut self.subs[i];
        spec.at = None;
        spec.redirects = None;
        let attempts = spec
            .attempts
            .get_or_insert_with(|| net.core.attempts(Resend::Always, now));
        let delay = match net.core.next_attempt(attempts, error, sent, now) {
            Next::RetryAfter { delay, .. } => delay,
            Next::GiveUp(e) => {
                ctx.log(now, format_args!("c{me} subscribe given up: {e}"));
                spec.attempts = None;
                spec.resume = None;
                spec.start = Start::Latest;
                PLACE_AGAIN
            }
        };
        ctx.log(
            now,
            format_args!(
                "c{me} subscribe shard {} again in {}us",
                spec.shard,
                delay.as_micros()
            ),
        );
        spec.due = Some(now + delay);
    }

    /// A `not_leader` answered subscription `i` at `at`: the core's [`Redirects`] say where
    /// to go next or why not, and `redirects_end` judges the broker by what they say.
    fn on_not_leader(
        &mut self,
        now: Instant,
        at: SocketAddr,
        i: usize,
        nl: felix_proto::message::NotLeader,
        ctx: &mut Ctx<'_>,
    ) -> Result<(), Violation> {
        let me = self.id;
        self.stats.redirects += 1;
        ctx.log(
            now,
            format_args!(
                "c{me} not_leader for shard {} from {at}: {} {:?} generation {}",
                self.subs[i].shard, nl.node_id, nl.addr, nl.generation
            ),
        );
        let Some(net) = &mut self.net else {
            return Err(protocol(me, "a not_leader without FEATURE_REDIRECT".into()));
        };
        net.core.handle_stale_owner(&net.stream);
        let quiet = ctx.quiet;
        let spec = &mut self.subs[i];
        spec.at = None;
        let (redirects, began_quiet) = spec
            .redirects
            .get_or_insert_with(|| (Redirects::new(at, MAX_REDIRECT_HOPS), quiet));
        // Canary (`RedirectLoop`): the client follows the redirect back to its sender.
        let named = if ctx.redirect_loop {
            Some(at.to_string())
        } else {
            nl.addr.clone()
        };
        let step = redirects.follow_checked(named.as_deref(), nl.generation);
        crate::invariants::redirects_end::check(me, &step, at, &nl.node_id, *began_quiet)?;
        let error = ClientError::NotLeader {
            node_id: nl.node_id,
            addr: nl.addr,
            generation: nl.generation,
        };
        match step.map(|to| net.core.check_redirect(to, now)) {
            Ok(Ok(to)) => self.sub_at(now, i, to, ctx),
            Ok(Err(e)) => self.sub_failed(now, i, e, false, ctx),
            Err(refused) => {
                if refused == RedirectRefused::NoAddress {
                    // The node knows the owner but not yet its address (the owner's join
                    // is not applied there yet).
                    self.stats.addressless_redirects += 1;
                }
                self.sub_failed(now, i, error, false, ctx);
            }
        }
        Ok(())
    }

    /// Each connection's generation and when its broker was last heard on it.
    pub(crate) fn last_heard(&self) -> Vec<(u64, Instant)> {
        self.conns.values().map(|c| (c.gen, c.last_heard)).collect()
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
