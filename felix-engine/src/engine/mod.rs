//! [`Engine`]: the broker node. Owns the QUIC endpoint, its connections, the broker and the
//! token verifier, and moves bytes between them.

mod drain;
mod forwarded;
mod replication;

use core::net::IpAddr;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quinn_proto::{
    ConnectionHandle, DatagramEvent, Endpoint, EndpointConfig, ServerConfig, StreamId, TimeSource,
};
use tracing::{debug, warn};

use crate::broker::{Broker, Notice, StreamKey};
use crate::clock::UnixAnchor;
use crate::cluster::Wired;
use crate::config::{AuthConfig, EngineConfig, MAX_GSO_BATCH_BYTES};
use crate::conn::{Conn, CLOSE_CODE_NORMAL};
use crate::metrics::{Stats, Usage};
use crate::net::{Datagram, Transmit};
use crate::node::Core;
use crate::tls::{AlpnSelector, TlsConfigError, TlsIdentity, TlsSettings};
use crate::{seed, settings};
use felix_auth::Verifier;
use felix_storage::ops::{FileCompletion, FileOp, LogId};

/// Rounds of storage work (log events, released answers, deliveries) within one turn.
const MAX_SETTLE_ROUNDS: usize = 8;

/// What the engine asks its runtime to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Output {
    /// Send datagrams.
    Transmit(Transmit),
    /// Send datagrams from the internal (peer) socket, `FELIX_INTERNAL_BIND`.
    PeerTransmit(Transmit),
    /// Perform a file operation under the storage directory and hand its completion, with
    /// the same id, to [`Engine::handle_file_completion`]. Operations may run concurrently
    /// and complete in any order; at most [`DurableConfig::max_inflight_file_ops`] are out
    /// at once.
    FileOp(FileOp),
}

/// Why an engine could not be built.
#[derive(Debug)]
pub enum EngineError {
    /// The certificate or key was refused.
    Tls(TlsConfigError),
    /// The JWKS document could not be used.
    Auth(String),
    /// A configuration value is out of range.
    Config(String),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Tls(e) => e.fmt(f),
            EngineError::Auth(e) => write!(f, "auth configuration: {e}"),
            EngineError::Config(e) => write!(f, "configuration: {e}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<TlsConfigError> for EngineError {
    fn from(e: TlsConfigError) -> Self {
        EngineError::Tls(e)
    }
}

/// Timestamps for quinn's address-validation tokens. The engine issues none (tokens are
/// off), so the value only has to exist; it must not come from a clock read.
struct FixedTime(SystemTime);

impl TimeSource for FixedTime {
    fn now(&self) -> SystemTime {
        self.0
    }
}

/// One Felix broker node as a state machine: QUIC datagrams and time in, datagrams and
/// deadlines out. It reads no clock, draws no OS randomness, and owns no socket, thread or
/// file; a runtime (or a simulator) does all of that around it.
///
/// # Methods
///
/// The methods fall into four families, after quinn-proto's `Connection`:
///
/// - **Inputs**, `handle_*`: [`handle_datagram`](Self::handle_datagram) for each datagram (or
///   GRO batch) received, [`handle_timeout`](Self::handle_timeout) when the deadline from
///   [`poll_timeout`](Self::poll_timeout) passes, and
///   [`handle_file_completion`](Self::handle_file_completion) when a file operation the
///   engine asked for has finished. Each call is one *turn*: it processes the input, lets
///   every affected session answer, then seals the broker's open event batches once, so
///   publishes that arrive in one turn go out to subscribers as one frame.
/// - **Commands**, plain verbs: [`drain`](Self::drain) (graceful stop: refuse new work),
///   [`shutdown`](Self::shutdown),
///   [`set_tls_identity`](Self::set_tls_identity) (certificate rotation),
///   [`set_jwks`](Self::set_jwks) (token key rotation).
/// - **Outputs**, `poll_*`: [`poll_output`](Self::poll_output) hands out the next thing to do
///   (datagrams to send, batched for GSO, and file operations); [`poll_timeout`](Self::poll_timeout)
///   the instant at which to call `handle_timeout`.
/// - **Getters**, `&self`: [`dev_token`](Self::dev_token), [`stats`](Self::stats),
///   [`usage`](Self::usage), [`connection_count`](Self::connection_count),
///   [`is_ready`](Self::is_ready),
///   [`storage_error`](Self::storage_error), [`storage_idle`](Self::storage_idle),
///   [`metrics`](Self::metrics) (counters for an exporter), [`is_drained`](Self::is_drained).
///
/// # Durable storage
///
/// With [`EngineConfig::durable`] set, every stream shard (and cache) is a log of segment
/// files under the runtime's storage directory. The engine never touches a file: it emits
/// [`Output::FileOp`]s (create, append, sync, read, list...) carrying ids, and the runtime
/// performs them — concurrently, in any order — and feeds each completion back through
/// [`handle_file_completion`](Self::handle_file_completion). The logs order their own
/// operations so that nothing in flight depends on another op in flight.
///
/// Startup recovery is file operations too: [`Engine::new`] begins a walk of the storage
/// directory that opens (and repairs the torn tail of) every log found. Until
/// [`is_ready`](Self::is_ready) the runtime should perform file operations only and not
/// feed datagrams; if [`storage_error`](Self::storage_error) becomes `Some` (a log is
/// corrupt in its interior, naming the file and byte), the broker must not start. A stream
/// first used after startup opens its log then: requests that need it wait, in order on
/// their stream, until it is open.
///
/// # Polling order
///
/// After every input or command, call [`poll_output`](Self::poll_output) until it returns
/// `None` and act on each output, *then* read [`poll_timeout`](Self::poll_timeout): sending
/// arms loss-detection timers, so the deadline is only final once the outputs are drained.
/// Answers are produced in the same turn as the request that caused them; nothing waits for
/// a timer.
///
/// ```text
/// loop {
///     wait for: a datagram, or the deadline
///     engine.handle_datagram(now, dg)   |   engine.handle_timeout(now)
///     while let Some(out) = engine.poll_output(now, &mut buf) { send(out, &buf) }
///     deadline = engine.poll_timeout()
/// }
/// ```
///
/// # Time and randomness
///
/// Every input carries `now`. Unix time (token expiry, record timestamps) is derived from the
/// `(now, unix_micros)` pair given to [`Engine::new`]. Connection ids, reset and token keys
/// come from [`EngineConfig::rng_seed`]; only TLS key shares and nonces come from the crypto
/// provider, which a simulator would replace.
pub struct Engine {
    endpoint: Endpoint,
    conns: BTreeMap<ConnectionHandle, Conn>,
    core: Core,
    /// Connections touched this turn: processed and re-armed at the end of it.
    touched: Vec<ConnectionHandle>,
    /// Connections that may have datagrams to send, in round-robin order.
    send_queue: VecDeque<ConnectionHandle>,
    /// Each connection's next deadline.
    timers: BTreeSet<(Instant, ConnectionHandle)>,
    /// Answers the endpoint produced itself (refusals, version negotiation, resets).
    endpoint_transmits: VecDeque<(Transmit, Vec<u8>)>,
    scratch: Vec<u8>,
    max_connections: usize,
    max_connections_per_ip: usize,
    /// Connections per source IP.
    per_ip: HashMap<IpAddr, usize>,
    max_gso_segments: usize,
    max_queued_endpoint_transmits: usize,
    dev_token: Option<String>,
    /// What new handshakes are configured from; the identity is replaced on rotation.
    tls: TlsSettings,
    /// The endpoint's server config, whose crypto is swapped on rotation.
    server_config: ServerConfig,
    shutting_down: bool,
    /// File ops handed out and not completed, and the most that may be.
    file_ops_in_flight: usize,
    max_inflight_file_ops: usize,
    /// Requests other nodes forwarded here, each channel a session of its own.
    forwarded: forwarded::Forwarded,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("connections", &self.conns.len())
            .field("shutting_down", &self.shutting_down)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Builds an engine. `now` and `unix_micros` name the same moment: the engine derives
    /// Unix time from them for every later `now`.
    pub fn new(
        config: EngineConfig,
        now: Instant,
        unix_micros: u64,
    ) -> Result<Engine, EngineError> {
        settings::check(&config).map_err(EngineError::Config)?;
        let transport = settings::transport(&config).map_err(EngineError::Config)?;
        let unix_secs = unix_micros / 1_000_000;
        let (verifier, dev_token) = match &config.auth {
            AuthConfig::Jwks(doc) => {
                let v = Verifier::from_jwks(doc).map_err(|e| EngineError::Auth(e.to_string()))?;
                (v, None)
            }
            AuthConfig::Dev { seed } => {
                let (v, token) = Verifier::dev(*seed, unix_secs);
                (v, Some(token))
            }
        };

        let seed = config.rng_seed;
        let tls = TlsSettings {
            identity: config.tls.clone(),
            client_ca: config.client_ca.clone(),
            require_alpn: config.require_alpn,
            provider: config.crypto_provider.clone(),
        };
        let selector = Arc::new(AlpnSelector::new(&tls)?);
        let mut server = ServerConfig::new(selector, seed::token_key(&seed));
        server.transport_config(Arc::new(transport));
        // No NEW_TOKEN tokens: they would be the engine's only use of wall-clock time.
        server.validation_token.sent(0);
        server.time_source(Arc::new(FixedTime(
            UNIX_EPOCH + Duration::from_micros(unix_micros),
        )));

        let mut endpoint_config = EndpointConfig::new(seed::reset_key(&seed));
        endpoint_config
            .cid_generator(move || Box::new(seed::SeededCidGenerator::new(&seed)))
            .rng_seed(Some(seed::endpoint_rng_seed(&seed)))
            .max_udp_payload_size(config.max_udp_payload_size)
            .map_err(|_| EngineError::Config("max_udp_payload_size is out of range".into()))?;
        let endpoint = Endpoint::new(
            Arc::new(endpoint_config),
            Some(Arc::new(server.clone())),
            true,
            None,
        );

        let broker_config = settings::broker_config(&config);
        let mut broker = match &config.durable {
            None => Broker::new(broker_config),
            Some(d) => Broker::with_storage(
                broker_config,
                settings::durable_settings(d),
                UnixAnchor::new(now, unix_micros),
            ),
        };

        // In-memory cache versions start at this run's wall-clock time (protocol.md).
        broker.start_cache_versions_at(unix_micros);
        let router = match &config.cluster {
            None => None,
            Some(c) => {
                let node = crate::cluster::ClusterNode::new(
                    c,
                    &config,
                    settings::peer_crypto_provider(&config),
                    &seed,
                    settings::metadata_log(&config),
                    now,
                )
                .map_err(EngineError::Config)?;
                Some(crate::router::Router::new(node))
            }
        };
        let core = Core {
            limits: settings::limits(&config),
            capabilities: settings::capabilities(&config),
            broker,
            verifier,
            routing_mapping: config.routing_mapping,
            default_shards: config.default_shards.max(1),
            anchor: UnixAnchor::new(now, unix_micros),
            routes: BTreeMap::new(),
            waiters: HashMap::new(),
            stalled: HashMap::new(),
            awaiting_placement: Vec::new(),
            forwards_awaiting_metadata: VecDeque::new(),
            value_waiters: HashMap::new(),
            group_waiters: HashMap::new(),
            next_subscription_id: 0,
            stats: Stats::default(),
            metrics: crate::metrics::Metrics::default(),
            buffered_bytes: 0,
            starved_conns: BTreeSet::new(),
            open_connections: 0,
            router,
            forwarding_here: false,
        };

        Ok(Engine {
            endpoint,
            conns: BTreeMap::new(),
            core,
            touched: Vec::new(),
            send_queue: VecDeque::new(),
            timers: BTreeSet::new(),
            endpoint_transmits: VecDeque::new(),
            scratch: Vec::new(),
            max_connections: config.max_connections,
            max_connections_per_ip: config.max_connections_per_ip,
            per_ip: HashMap::new(),
            max_gso_segments: config.max_gso_segments,
            max_queued_endpoint_transmits: config.max_queued_endpoint_transmits,
            dev_token,
            tls,
            server_config: server,
            shutting_down: false,
            file_ops_in_flight: 0,
            forwarded: Default::default(),
            max_inflight_file_ops: settings::max_inflight_file_ops(&config),
        })
    }

    /// The core this constructor built, for the frame-level fuzz harness
    /// (`crate::fuzzing`), which drives sessions on it beneath QUIC.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn into_core(self) -> Core {
        self.core
    }

    // ---- inputs -------------------------------------------------------------------------

    /// Feeds a received datagram (or a GRO batch of them). One turn.
    pub fn handle_datagram(&mut self, now: Instant, datagram: Datagram) {
        let Datagram {
            remote,
            local_ip,
            ecn,
            mut data,
            segment_size,
        } = datagram;
        let segment = segment_size.unwrap_or(data.len()).max(1);
        while !data.is_empty() {
            let one = data.split_to(segment.min(data.len()));
            self.scratch.clear();
            match self
                .endpoint
                .handle(now, remote, local_ip, ecn, one, &mut self.scratch)
            {
                Some(DatagramEvent::ConnectionEvent(ch, event)) => {
                    if let Some(conn) = self.conns.get_mut(&ch) {
                        conn.quic.handle_event(event);
                        self.touch(ch);
                    }
                }
                Some(DatagramEvent::NewConnection(incoming)) => self.accept(now, incoming),
                Some(DatagramEvent::Response(t)) => self.queue_endpoint_transmit(t),
                None => {}
            }
        }
        self.settle(now);
    }

    /// Feeds a datagram that arrived on the internal (peer) socket. One turn.
    pub fn handle_peer_datagram(&mut self, now: Instant, datagram: Datagram) {
        if let Some(c) = self.core.router.driver_mut() {
            c.handle_datagram(now, datagram);
        }
        self.settle(now);
    }

    /// Runs every timer due at `now`. One turn.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(c) = self.core.router.driver_mut() {
            if c.poll_timeout().is_some_and(|at| at <= now) {
                c.handle_timeout(now);
            }
        }
        while let Some(&(at, ch)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            let Some(conn) = self.conns.get_mut(&ch) else {
                continue;
            };
            conn.deadline = None;
            conn.handle_timeout(now, &mut self.core);
            self.touch(ch);
        }
        if self.core.broker.poll_timeout().is_some_and(|at| at <= now) {
            let unix = self.core.unix_micros(now);
            self.core.broker.handle_timeout(now, unix);
        }
        self.settle(now);
    }

    /// Feeds the completion of a file operation from [`Output::FileOp`]. One turn: answers
    /// held for durability go out, replayed events are delivered.
    pub fn handle_file_completion(&mut self, now: Instant, completion: FileCompletion) {
        self.file_ops_in_flight = self.file_ops_in_flight.saturating_sub(1);
        self.core.metrics.file_op_completed(now, &completion);
        if completion.id.log() == crate::cluster::METALOG_LOG {
            if let Some(c) = self.core.router.driver_mut() {
                c.handle_file_completion(now, completion);
            }
        } else {
            self.core.broker.handle_file_completion(now, completion);
        }
        self.settle(now);
    }

    // ---- commands -----------------------------------------------------------------------

    /// Stops accepting connections and closes every open one with code 0. Keep polling
    /// outputs so the closes go out; [`connection_count`](Self::connection_count) reaches 0
    /// once every connection has drained.
    pub fn shutdown(&mut self, now: Instant) {
        self.shutting_down = true;
        // Everything written is synced before the runtime stops (see `storage_idle`).
        self.core.broker.begin_storage_shutdown();
        self.endpoint.set_server_config(None);
        let handles: Vec<_> = self.conns.keys().copied().collect();
        for ch in handles {
            if let Some(conn) = self.conns.get_mut(&ch) {
                conn.close(now, CLOSE_CODE_NORMAL, "shutdown", &mut self.core);
            }
            self.touch(ch);
        }
        self.settle(now);
    }

    /// Deletes a stream (an operator action, trusted: see [`Engine::delete_stream_as`]).
    /// Its subscriptions end — with `stream_deleted` where the client offered
    /// FEATURE_STREAM_DELETED — and the next publish or subscribe creates it afresh. On a
    /// durable broker its files are retired through file ops that keep running after this
    /// returns; keep polling outputs.
    ///
    /// On a cluster node this only asks the control plane (one `DeleteStream` command for
    /// the incarnation placed now): `Ok` once asked, `NotFound` when the stream is not
    /// placed, `Unavailable` without a control-plane leader. Every node, this one included,
    /// removes its copies as it applies the command; wait with
    /// [`Engine::stream_deleted_here`] for the incarnation [`Engine::stream_incarnation`]
    /// gave before asking.
    pub fn delete_stream(
        &mut self,
        now: Instant,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<(), crate::DeleteStreamError> {
        if let Some(cluster) = self.core.router.driver_mut() {
            // In a cluster a delete is the control plane's: asked here, carried out by every
            // node as it applies it (docs/operations.md, "Deleting a stream in a cluster").
            let key = felix_cluster::meta::ObjectKey::new(tenant, namespace, stream);
            let asked = cluster.delete_stream(now, key);
            self.settle(now);
            return asked.map(|_| ());
        }
        let unix_micros = self.core.unix_micros(now);
        let key = StreamKey::new(tenant, namespace, stream);
        let result = self.core.broker.delete_stream(unix_micros, &key);
        self.settle(now);
        result.map_err(Into::into)
    }

    /// [`Engine::delete_stream`] for the holder of `token`: it must verify for `tenant` as a
    /// session's would and grant `stream.manage` on the stream.
    pub fn delete_stream_as(
        &mut self,
        now: Instant,
        token: &str,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<(), crate::DeleteStreamError> {
        let unix_secs = self.core.unix_secs(now);
        let names = (tenant, namespace, stream);
        crate::stream_delete::authorize(&self.core.verifier, unix_secs, token, names)?;
        self.delete_stream(now, tenant, namespace, stream)
    }

    /// Creates a stream through the control plane (`POST /v1/streams`): the token must
    /// verify for `tenant` and grant `stream.manage` on the stream. `Ok(Some)` when it exists
    /// with this very spec (look again with [`Engine::stream_view`] until
    /// [`crate::StreamView::writable`]); `Ok(None)` when asked for and not placed yet.
    pub fn create_stream_as(
        &mut self,
        now: Instant,
        token: &str,
        names: (&str, &str, &str),
        spec: crate::stream_admin::StreamSpec,
    ) -> Result<Option<crate::StreamView>, crate::AdminError> {
        self.manage(now, token, Managed::Stream, names, |cluster, key| {
            cluster.create_stream(now, key, spec)
        })
    }

    /// Creates a cache through the control plane (`POST /v1/caches`): the token must grant
    /// `cache.manage` on it. As [`Engine::create_stream_as`].
    pub fn create_cache_as(
        &mut self,
        now: Instant,
        token: &str,
        names: (&str, &str, &str),
        spec: crate::stream_admin::CacheSpec,
    ) -> Result<Option<crate::stream_admin::CacheView>, crate::AdminError> {
        self.manage(now, token, Managed::Cache, names, |cluster, key| {
            cluster.create_cache(now, key, spec)
        })
    }

    /// Deletes a cache through the control plane (`DELETE /v1/caches/…`): the token must
    /// grant `cache.manage` on it. One `DeleteCache` command for the incarnation placed now;
    /// `Ok(incarnation)` once asked: every node, this one included, removes its copies as it
    /// applies it (wait with [`Engine::cache_deleted_here`]).
    pub fn delete_cache_as(
        &mut self,
        now: Instant,
        token: &str,
        names: (&str, &str, &str),
    ) -> Result<u64, crate::AdminError> {
        self.manage(now, token, Managed::Cache, names, |cluster, key| {
            cluster.delete_cache(now, key)
        })
    }

    /// Whether `incarnation` of a cache is deleted in this node's metadata and its copies
    /// here are gone (true without a cluster).
    pub fn cache_deleted_here(&self, names: (&str, &str, &str), incarnation: u64) -> bool {
        let key = felix_cluster::meta::ObjectKey::new(names.0, names.1, names.2);
        self.core
            .router
            .driver()
            .is_none_or(|c| c.cache_deleted_here(&key, incarnation))
    }

    /// A placed cache (`GET /v1/caches/{t}/{ns}/{c}`); with `None` for `token`, trusted.
    pub fn cache_view(
        &self,
        now: Instant,
        token: Option<&str>,
        names: (&str, &str, &str),
    ) -> Result<crate::stream_admin::CacheView, crate::AdminError> {
        use crate::AdminError;
        crate::stream_admin::check_cache_names(names)?;
        if let Some(token) = token {
            let unix_secs = self.core.unix_secs(now);
            let action = felix_auth::Action::CacheView;
            crate::stream_admin::authorize_cache(
                &self.core.verifier,
                unix_secs,
                token,
                action,
                names,
            )?;
        }
        let cluster = self.core.router.driver().ok_or_else(not_clustered)?;
        let key = felix_cluster::meta::ObjectKey::new(names.0, names.1, names.2);
        cluster
            .cache_view(&key)
            .ok_or_else(|| AdminError::NotFound(format!("no cache {key}")))
    }

    /// Every placed cache of the token's tenant that it may view (`GET /v1/caches`).
    pub fn cache_views(
        &self,
        now: Instant,
        token: &str,
    ) -> Result<Vec<crate::stream_admin::CacheView>, crate::AdminError> {
        use crate::AdminError;
        let tenant = felix_auth::claimed_tenant(token)
            .ok_or_else(|| AdminError::Unauthorized("the token does not parse".into()))?;
        let unix_secs = self.core.unix_secs(now);
        let identity = self
            .core
            .verifier
            .verify(token, &tenant, unix_secs)
            .map_err(|e| AdminError::Unauthorized(e.to_string()))?;
        let cluster = self.core.router.driver().ok_or_else(not_clustered)?;
        Ok(cluster
            .cache_views(&tenant)
            .into_iter()
            .filter(|v| {
                let object = format!("cache:{}/{}/{}", v.tenant, v.namespace, v.cache);
                identity.allows(felix_auth::Action::CacheView, &object)
                    || identity.allows(felix_auth::Action::CacheManage, &object)
            })
            .collect())
    }

    /// Changes a stream's retention through the control plane (`PATCH /v1/streams/…`): the
    /// token must grant `stream.manage` on it. `Ok(true)` when it already has `retention`,
    /// `Ok(false)` when asked (look again with [`Engine::stream_view`]).
    pub fn alter_stream_as(
        &mut self,
        now: Instant,
        token: &str,
        names: (&str, &str, &str),
        retention: crate::stream_admin::Retention,
    ) -> Result<bool, crate::AdminError> {
        self.manage(now, token, Managed::Stream, names, |cluster, key| {
            cluster.alter_stream(now, key, retention)
        })
    }

    /// What every change of an object through the control plane shares: valid names, a
    /// token granting `manage` on the object, a node done recovering and in a cluster; then
    /// `change` on the cluster driver with the object's key, and a settle.
    fn manage<T>(
        &mut self,
        now: Instant,
        token: &str,
        object: Managed,
        names: (&str, &str, &str),
        change: impl FnOnce(
            &mut crate::cluster::ClusterNode,
            felix_cluster::meta::ObjectKey,
        ) -> Result<T, crate::AdminError>,
    ) -> Result<T, crate::AdminError> {
        use crate::stream_admin as admin;
        let unix_secs = self.core.unix_secs(now);
        let verifier = &self.core.verifier;
        match object {
            Managed::Stream => {
                admin::check_names(names)?;
                let action = felix_auth::Action::StreamManage;
                admin::authorize(verifier, unix_secs, token, action, names)?;
            }
            Managed::Cache => {
                admin::check_cache_names(names)?;
                let action = felix_auth::Action::CacheManage;
                admin::authorize_cache(verifier, unix_secs, token, action, names)?;
            }
        }
        if !self.is_ready() {
            let unready = "recovery is not finished".into();
            return Err(crate::AdminError::Unavailable(unready));
        }
        let cluster = self.core.router.driver_mut().ok_or_else(not_clustered)?;
        let key = felix_cluster::meta::ObjectKey::new(names.0, names.1, names.2);
        let outcome = change(cluster, key);
        self.settle(now);
        outcome
    }

    /// A placed stream as this node's metadata has it (`GET /v1/streams/{t}/{ns}/{s}`), for
    /// the holder of `token` (with `None`, trusted: the endpoint already checked it).
    pub fn stream_view(
        &self,
        now: Instant,
        token: Option<&str>,
        names: (&str, &str, &str),
    ) -> Result<crate::StreamView, crate::AdminError> {
        use crate::AdminError;
        crate::stream_admin::check_names(names)?;
        if let Some(token) = token {
            let unix_secs = self.core.unix_secs(now);
            let action = felix_auth::Action::StreamView;
            crate::stream_admin::authorize(&self.core.verifier, unix_secs, token, action, names)?;
        }
        let cluster = self.core.router.driver().ok_or_else(not_clustered)?;
        let key = felix_cluster::meta::ObjectKey::new(names.0, names.1, names.2);
        let mut view = cluster
            .stream_view(&key)
            .ok_or_else(|| AdminError::NotFound(format!("no stream {key}")))?;
        self.fill_copy_bounds(&mut view);
        Ok(view)
    }

    /// Where this node's copy of each shard starts and ends (`ShardView::here`).
    fn fill_copy_bounds(&self, view: &mut crate::StreamView) {
        let key = crate::broker::StreamKey::new(&view.tenant, &view.namespace, &view.stream);
        let bounds = self.core.broker.log_bounds(&key);
        for s in &mut view.shards {
            s.here = bounds
                .get(s.shard as usize)
                .copied()
                .flatten()
                .map(|(log_start, log_end)| crate::CopyBounds { log_start, log_end });
        }
    }

    /// Every placed stream of the token's tenant that it may view (`GET /v1/streams`).
    pub fn stream_views(
        &self,
        now: Instant,
        token: &str,
    ) -> Result<Vec<crate::StreamView>, crate::AdminError> {
        use crate::AdminError;
        let tenant = felix_auth::claimed_tenant(token)
            .ok_or_else(|| AdminError::Unauthorized("the token does not parse".into()))?;
        let unix_secs = self.core.unix_secs(now);
        let identity = self
            .core
            .verifier
            .verify(token, &tenant, unix_secs)
            .map_err(|e| AdminError::Unauthorized(e.to_string()))?;
        let cluster = self.core.router.driver().ok_or_else(not_clustered)?;
        let views = cluster.stream_views(&tenant);
        Ok(views
            .into_iter()
            .filter(|v| {
                let object = format!("stream:{}/{}/{}", v.tenant, v.namespace, v.stream);
                identity.allows(felix_auth::Action::StreamView, &object)
                    || identity.allows(felix_auth::Action::StreamManage, &object)
            })
            .map(|mut v| {
                self.fill_copy_bounds(&mut v);
                v
            })
            .collect())
    }

    /// Gives up what a shard's gone leader acknowledged (`felix admin abandon`): asks the
    /// control plane to hand shard `shard` of the stream (or, `cache`, the cache) to `to` or
    /// the first live node that can take it. The token must verify for `tenant` and grant
    /// `node.manage` on `cluster:*`.
    #[allow(clippy::too_many_arguments)]
    pub fn abandon_shard_as(
        &mut self,
        now: Instant,
        token: &str,
        cache: bool,
        (tenant, namespace, name): (&str, &str, &str),
        shard: u32,
        to: Option<&str>,
    ) -> Result<crate::AbandonPlan, crate::AbandonError> {
        use crate::AbandonError;
        let unix_secs = self.core.unix_secs(now);
        let identity = self
            .core
            .verifier
            .verify(token, tenant, unix_secs)
            .map_err(|e| AbandonError::Unauthorized(e.to_string()))?;
        let object = format!("cluster:shards/{tenant}/{namespace}/{name}/{shard}");
        if !identity.allows_cluster(felix_auth::Action::NodeManage, &object) {
            return Err(AbandonError::Forbidden);
        }
        let kind = if cache {
            felix_cluster::meta::ObjectKind::Cache
        } else {
            felix_cluster::meta::ObjectKind::Stream
        };
        let cluster =
            self.core.router.driver_mut().ok_or_else(|| {
                AbandonError::NotFound("this broker is not a cluster node".into())
            })?;
        let plan = cluster.abandon(now, kind, (tenant, namespace, name), shard, to)?;
        self.settle(now);
        Ok(plan)
    }

    /// Serves `identity` (a rotated certificate and key) to every handshake from now on.
    /// Connections already established keep the session they negotiated. On error the
    /// identity in use stays.
    pub fn set_tls_identity(&mut self, identity: TlsIdentity) -> Result<(), EngineError> {
        let settings = TlsSettings {
            identity,
            ..self.tls.clone()
        };
        let selector = AlpnSelector::new(&settings)?;
        self.tls = settings;
        self.server_config.crypto = Arc::new(selector);
        if !self.shutting_down {
            self.endpoint
                .set_server_config(Some(Arc::new(self.server_config.clone())));
        }
        Ok(())
    }

    /// Verifies tokens against this JWKS document from now on (the runtime re-read its
    /// file). Streams already authenticated keep the identity they proved; every later
    /// `auth` is checked against the new keys. Only for an engine configured with
    /// [`AuthConfig::Jwks`]; on error the keys in use stay.
    pub fn set_jwks(&mut self, jwks: &[u8]) -> Result<(), EngineError> {
        if self.dev_token.is_some() {
            return Err(EngineError::Config(
                "this engine runs in dev mode; it has no JWKS to replace".into(),
            ));
        }
        self.core.verifier =
            Verifier::from_jwks(jwks).map_err(|e| EngineError::Auth(e.to_string()))?;
        Ok(())
    }

    // ---- outputs ------------------------------------------------------------------------

    /// The next output, writing any datagram bytes into `buf` (cleared first).
    #[must_use]
    pub fn poll_output(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Output> {
        buf.clear();
        // File work first: an fsync started now releases its waiters sooner.
        if self.file_ops_in_flight < self.max_inflight_file_ops {
            let metadata = self.core.router.driver_mut().and_then(|c| c.poll_file_op());
            if let Some(op) = metadata.or_else(|| self.core.broker.poll_file_op()) {
                self.file_ops_in_flight += 1;
                self.core.stats.file_ops += 1;
                self.core.metrics.file_op_issued(now, &op);
                return Some(Output::FileOp(op));
            }
        }
        if let Some((t, bytes)) = self.endpoint_transmits.pop_front() {
            buf.extend_from_slice(&bytes);
            return Some(Output::Transmit(t));
        }
        if let Some(c) = self.core.router.driver_mut() {
            if let Some(t) = c.poll_transmit(now, buf) {
                return Some(Output::PeerTransmit(t));
            }
            if c.has_work() {
                // Reading the links produced answers or forwards: one more turn for them.
                self.settle(now);
                return self.poll_output(now, buf);
            }
        }
        while let Some(&ch) = self.send_queue.front() {
            let Some(conn) = self.conns.get_mut(&ch) else {
                self.send_queue.pop_front();
                continue;
            };
            // A batch over MAX_GSO_BATCH_BYTES would be refused whole by the kernel.
            let segments = (MAX_GSO_BATCH_BYTES / usize::from(conn.quic.current_mtu()))
                .clamp(1, self.max_gso_segments);
            if let Some(t) = conn.quic.poll_transmit(now, segments, buf) {
                // Round-robin: the next call serves the next connection.
                self.send_queue.pop_front();
                self.send_queue.push_back(ch);
                return Some(Output::Transmit(Transmit::of(&t)));
            }
            self.send_queue.pop_front();
            conn.queued = false;
            // Sending may have armed timers or raised endpoint events (new connection ids,
            // drained); settle them before moving on.
            if self.process_conn(now, ch) {
                self.touch(ch);
                self.settle(now);
            } else {
                self.rearm(ch);
            }
        }
        None
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let conns = self.timers.first().map(|&(at, _)| at);
        let cluster = self.core.router.driver().and_then(|c| c.poll_timeout());
        let forwards = self
            .core
            .forwards_awaiting_metadata
            .iter()
            .map(|(at, _, _)| *at)
            .min();
        let placement = self
            .core
            .awaiting_placement
            .iter()
            .map(|&(at, _, _)| at)
            .min();
        [
            conns,
            self.core.broker.poll_timeout(),
            cluster,
            placement,
            forwards,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    // ---- getters ------------------------------------------------------------------------

    /// The development token minted at start in dev mode (full permissions, tenant `t1`).
    pub fn dev_token(&self) -> Option<&str> {
        self.dev_token.as_deref()
    }

    /// Connections open or still draining.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Startup recovery is done: every log found in the storage directory is open (always
    /// true without durable storage). Feed no datagrams before this.
    pub fn is_ready(&self) -> bool {
        self.core.broker.is_ready() && self.core.router.driver().is_none_or(|c| c.storage_ready())
    }

    /// Ready to serve clients: storage is open and, in a cluster, this node has joined and
    /// its declarations were accepted (what `/readyz` reports).
    pub fn is_serving(&self) -> bool {
        self.is_ready() && self.core.router.driver().is_none_or(|c| c.is_serving())
    }

    /// In a cluster, the last metadata index this node applied (0 before any, and outside a
    /// cluster). It moves whenever membership, liveness or placement changes.
    /// In a cluster, the incarnation of a placed stream (`None`: not placed, or no cluster).
    /// A delete through [`Engine::delete_stream_as`] is done here once
    /// [`Engine::stream_deleted_here`] says so for the incarnation read before it.
    pub fn stream_incarnation(&self, names: (&str, &str, &str)) -> Option<u64> {
        let key = felix_cluster::meta::ObjectKey::new(names.0, names.1, names.2);
        self.core.router.driver()?.incarnation_of(&key)
    }

    /// Whether `incarnation` of a stream is deleted in this node's metadata and its copies
    /// here are gone (true without a cluster).
    pub fn stream_deleted_here(&self, names: (&str, &str, &str), incarnation: u64) -> bool {
        let key = felix_cluster::meta::ObjectKey::new(names.0, names.1, names.2);
        self.core
            .router
            .driver()
            .is_none_or(|c| c.stream_deleted_here(&key, incarnation))
    }

    /// A number that moves whenever cluster metadata is applied here, or the copies of a
    /// stream the cluster deleted are removed here: what the ops endpoint wakes waiters by.
    pub fn cluster_changes(&self) -> u64 {
        self.core.router.driver().map_or(0, |c| c.changes())
    }

    /// Where every held stream log stands, summed over the logs: moves with a retention
    /// cut, a follower's trim, every append and sync, and each segment file born or removed.
    /// Walks every shard; the ops endpoint's change watch reads it only while someone waits.
    pub fn log_positions(&self) -> crate::LogPositions {
        self.core.broker.log_positions()
    }

    pub fn cluster_metadata_applied(&self) -> u64 {
        self.core
            .router
            .driver()
            .map_or(0, |c| c.metadata_progress().1)
    }

    /// A read-only view of this node's cluster state (`None` for a single node).
    pub fn cluster_view(&self) -> Option<crate::ClusterView<'_>> {
        self.core.router.driver().map(crate::ClusterView::new)
    }

    /// Why this node must stop: the cluster refused its declarations (the message names the
    /// stream or cache that can never be placed). One that differs from the cluster's record
    /// is not refused: the record is kept and the node warns.
    pub fn cluster_error(&self) -> Option<&str> {
        self.core.router.driver().and_then(|c| c.refusal())
    }

    /// Why this broker must not start: a log found at startup could not be opened (for
    /// corruption inside a segment, the message names the file and the byte).
    pub fn storage_error(&self) -> Option<&str> {
        let cluster = self.core.router.driver().and_then(|c| c.storage_error());
        self.core.broker.storage_fatal().or(cluster)
    }

    /// No file work is left: after [`shutdown`](Self::shutdown), every log has synced what
    /// it wrote. Keep performing file operations until this holds (or a deadline passes).
    pub fn storage_idle(&self) -> bool {
        self.file_ops_in_flight == 0
            && self.core.broker.storage_idle()
            && self.core.router.driver().is_none_or(|c| c.storage_idle())
    }

    /// What the engine holds now, against its limits (walks every connection).
    pub fn usage(&self) -> Usage {
        let mut usage = Usage::default();
        for conn in self.conns.values() {
            conn.add_usage(&mut usage);
            #[cfg(debug_assertions)]
            conn.check_unwritten(self.core.limits.value_reserve);
        }
        (usage.max_subscriber_queue, usage.streams) = self.core.broker.queue_usage();
        usage.max_connection_event_bytes = self.core.broker.max_owner_event_bytes();
        usage
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        let b = self.core.broker.stats();
        let (peer_links, peer_messages_dropped) = self
            .core
            .router
            .driver()
            .map_or((0, 0), |c| c.peer_link_stats());
        Stats {
            peer_links,
            peer_messages_dropped,
            connections: self.conns.len() as u64,
            dropped_batches: b.dropped_batches,
            published_records: b.published_records,
            group_skipped_records: self.core.broker.group_skipped_records(),
            forwarded_sessions: self.forwarded.len() as u64,
            forwards_waiting: self
                .core
                .router
                .driver()
                .map_or(0, |c| c.waiting_forwards() as u64),
            ..self.core.stats
        }
    }

    /// Counters and gauges for an exporter, as of now. Walks every connection: call it
    /// per scrape, not per turn.
    pub fn metrics(&self) -> crate::metrics::Metrics {
        let broker = self.core.broker.stats();
        let log_bytes = self.core.broker.log_bytes();
        let mut m = self
            .core
            .metrics
            .snapshot(&self.stats(), &self.usage(), &broker, log_bytes);
        if let Some(c) = self.core.router.driver() {
            (m.cluster_shards_led, m.cluster_shards_followed) = c.shard_roles();
            (m.cluster_metadata_term, m.cluster_metadata_applied) = c.metadata_progress();
            let r = c.replication_stats();
            m.replication_lag_records = r.lag_records;
            m.replication_leader_changes = r.leader_changes;
            m.replication_quorum_timeouts = r.quorum_timeouts;
            m.replication_catch_up_bytes = r.catch_up_bytes;
            m.acknowledged_records_abandoned = r.acknowledged_abandoned;
            m.replication_states_refused = r.replica_states_refused;
            m.leader_shards_quiet = r.leader_shards_quiet;
            m.cluster_shards_awaiting_leader = c.shards_awaiting_leader();
        }
        m
    }

    // ---- internals ----------------------------------------------------------------------

    fn accept(&mut self, now: Instant, incoming: quinn_proto::Incoming) {
        let ip = incoming.remote_address().ip();
        let from_ip = self.per_ip.get(&ip).copied().unwrap_or(0);
        if self.shutting_down
            || self.conns.len() >= self.max_connections
            || from_ip >= self.max_connections_per_ip
        {
            self.core.stats.connections_refused += 1;
            debug!(remote = %incoming.remote_address(), from_ip, "refusing connection");
            self.scratch.clear();
            let t = self.endpoint.refuse(incoming, &mut self.scratch);
            self.queue_endpoint_transmit(t);
            return;
        }
        self.scratch.clear();
        match self.endpoint.accept(incoming, now, &mut self.scratch, None) {
            Ok((ch, quic)) => {
                self.core.stats.connections_accepted += 1;
                *self.per_ip.entry(ip).or_default() += 1;
                self.core.open_connections += 1;
                self.conns.insert(ch, Conn::new(quic, now, ip));
                self.touch(ch);
            }
            Err(err) => {
                debug!(cause = %err.cause, "handshake refused");
                if let Some(t) = err.response {
                    self.queue_endpoint_transmit(t);
                }
            }
        }
    }

    fn queue_endpoint_transmit(&mut self, t: quinn_proto::Transmit) {
        if self.endpoint_transmits.len() >= self.max_queued_endpoint_transmits {
            warn!("endpoint transmit queue full; dropping a response");
            return;
        }
        let bytes = self.scratch[..t.size].to_vec();
        let t = Transmit::of(&t);
        self.endpoint_transmits.push_back((t, bytes));
    }

    fn touch(&mut self, ch: ConnectionHandle) {
        if let Some(conn) = self.conns.get_mut(&ch) {
            if !conn.touched {
                conn.touched = true;
                self.touched.push(ch);
            }
        }
    }

    /// Ends a turn: lets every touched connection handle its events, seals the broker's
    /// batches once, hands deliveries to event streams, and re-arms timers and transmits.
    fn settle(&mut self, now: Instant) {
        self.cluster_work(now);
        self.drive_replication(now);
        self.resume_awaiting_placement(now);
        let mut i = 0;
        while i < self.touched.len() {
            let ch = self.touched[i];
            self.process_conn(now, ch);
            i += 1;
            if i == self.touched.len() {
                self.wake_starved(now);
            }
        }
        // Storage work feeds on itself within a turn (a replay read answered from the tail
        // cache, a request re-run once its log opened), so go round a bounded number of times.
        for _ in 0..MAX_SETTLE_ROUNDS {
            self.core.broker.flush(now);
            self.handle_notices(now);
            self.drive_replication(now);
            while let Some(id) = self.core.broker.poll_ready() {
                let Some(&(ch, stream)) = self.core.routes.get(&id) else {
                    continue;
                };
                if let Some(conn) = self.conns.get_mut(&ch) {
                    conn.deliver(now, stream, &mut self.core);
                    conn.delivering = true;
                    self.touch(ch);
                }
            }
            if !self.core.broker.has_storage_work() {
                break;
            }
        }
        // Deliveries leave ahead of the turn's answers: a publisher's ack sent first would
        // put one more send (and, for a client in the same process, its handling) between
        // a publish and its delivery. The front keeps the deliveries' own order.
        let touched = std::mem::take(&mut self.touched);
        for &ch in touched.iter().rev() {
            if let Some(conn) = self.conns.get_mut(&ch) {
                if conn.delivering && !conn.queued {
                    conn.queued = true;
                    self.send_queue.push_front(ch);
                }
            }
        }
        for &ch in &touched {
            let Some(conn) = self.conns.get_mut(&ch) else {
                continue;
            };
            conn.touched = false;
            conn.delivering = false;
            if !conn.queued {
                conn.queued = true;
                self.send_queue.push_back(ch);
            }
            self.rearm(ch);
        }
        // The list's allocation is kept for the next turn.
        self.touched = touched;
        self.touched.clear();
    }

    /// Lets connections that held streams back for the broker-wide buffer budget read again
    /// once it has room (each checks its own budget too).
    fn wake_starved(&mut self, now: Instant) {
        if self.core.starved_conns.is_empty()
            || self.core.buffered_bytes >= self.core.limits.max_buffered_bytes
        {
            return;
        }
        for ch in std::mem::take(&mut self.core.starved_conns) {
            if let Some(conn) = self.conns.get_mut(&ch) {
                conn.resume_starved(now, ch, &mut self.core);
                if conn.has_starved() {
                    self.core.starved_conns.insert(ch);
                }
                self.touch(ch);
            }
        }
    }

    /// Acts on what the logs reported: releases answers held for durability, and re-runs
    /// requests that waited for a log to open.
    fn handle_notices(&mut self, now: Instant) {
        while let Some(notice) = self.core.broker.poll_notice() {
            match notice {
                Notice::Durable { log, up_to } => {
                    if !self.core.broker.is_gated(log) {
                        self.follower_durable(log, up_to);
                    }
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
                    self.core.metrics.group_commit(ready.len());
                    self.release_answers(now, ready);
                }
                Notice::LocalDurable { log, up_to } => self.replica_durable(now, log, up_to),
                Notice::Replica { log, event } => self.replica_event(now, log, event),
                Notice::TimedOut { log, up_to } => {
                    // Answered `quorum_timeout` by the session (`timed_out_mark`).
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
                    self.release_answers(now, ready);
                }
                Notice::Value { log, ticket, value } => {
                    if let Some((ch, stream)) = self.core.value_waiters.remove(&(log, ticket)) {
                        if self.forwarded.contains(ch) {
                            self.fill_virtual_value(ch, log, ticket, value);
                        } else if let Some(conn) = self.conns.get_mut(&ch) {
                            let reserve = self.core.limits.value_reserve;
                            conn.fill_value(stream, log, ticket, value, reserve);
                        }
                        self.release_answers(now, vec![(ch, stream)]);
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
                    // Ticket order, not the hash map's: the answers go out in this order.
                    reads.sort_unstable_by_key(|(_, t)| t.0);
                    for key in reads {
                        ready.extend(self.core.value_waiters.remove(&key));
                    }
                    self.release_answers(now, ready);
                    self.resume_stalled(now, log);
                }
                Notice::Opened { log } => self.resume_stalled(now, log),
                Notice::GroupRecords { waiter, result } => {
                    if let Some((ch, stream)) = self.core.group_waiters.remove(&waiter) {
                        if let Some(conn) = self.conns.get_mut(&ch) {
                            let reserve = self.core.limits.value_reserve;
                            conn.fill_group(stream, waiter, result, reserve);
                        }
                        self.release_answers(now, vec![(ch, stream)]);
                    }
                }
            }
        }
    }

    fn release_answers(&mut self, now: Instant, streams: Vec<(ConnectionHandle, StreamId)>) {
        for (ch, stream) in streams {
            if self.forwarded.contains(ch) {
                self.wake_virtual(now, ch, false);
                continue;
            }
            if let Some(conn) = self.conns.get_mut(&ch) {
                conn.release_held(now, ch, stream, &mut self.core);
                self.touch(ch);
            }
        }
    }

    /// Re-runs the requests that wait for a placement: all of them once metadata changed
    /// (each waits again if its stream is still unplaced), else those whose wait is over (each
    /// is refused then).
    fn resume_awaiting_placement(&mut self, now: Instant) {
        let changed = self
            .core
            .router
            .driver_mut()
            .is_some_and(|c| c.take_metadata_changed());
        if changed {
            // Streams placed at runtime are opened as wide as they were placed.
            if let Some(c) = self.core.router.driver() {
                for (key, width) in c.stream_widths() {
                    self.core.broker.learn_width(&key, width);
                }
                // And run with their own retention (an `alter` lands here on every node).
                for (key, retention) in c.stream_retentions() {
                    self.core.broker.set_stream_retention(&key, retention);
                }
            }
        }
        self.resume_forwards_awaiting_metadata(now, changed);
        if self.core.awaiting_placement.is_empty() {
            return;
        }
        let due: Vec<(Instant, ConnectionHandle, StreamId)> = if changed {
            std::mem::take(&mut self.core.awaiting_placement)
        } else {
            let (due, waiting) = std::mem::take(&mut self.core.awaiting_placement)
                .into_iter()
                .partition(|&(at, _, _)| at <= now);
            self.core.awaiting_placement = waiting;
            due
        };
        for (_, ch, stream) in due {
            // A forwarded request waits in a virtual session, not on a connection.
            if self.forwarded.contains(ch) {
                self.wake_virtual(now, ch, true);
                continue;
            }
            if let Some(conn) = self.conns.get_mut(&ch) {
                conn.resume_stalled(now, ch, stream, &mut self.core);
                self.touch(ch);
            }
        }
    }

    fn resume_stalled(&mut self, now: Instant, log: LogId) {
        for (ch, stream) in self.core.stalled.remove(&log).unwrap_or_default() {
            if self.forwarded.contains(ch) {
                self.wake_virtual(now, ch, true);
                continue;
            }
            if let Some(conn) = self.conns.get_mut(&ch) {
                conn.resume_stalled(now, ch, stream, &mut self.core);
                self.touch(ch);
            }
        }
    }

    /// Drains a connection's endpoint and application events. Returns true if there were
    /// any. Removes the connection once quinn reports it drained.
    fn process_conn(&mut self, now: Instant, ch: ConnectionHandle) -> bool {
        let mut progressed = false;
        loop {
            let Some(conn) = self.conns.get_mut(&ch) else {
                return progressed;
            };
            let mut any = false;
            while let Some(event) = conn.quic.poll_endpoint_events() {
                any = true;
                let drained = event.is_drained();
                if let Some(reply) = self.endpoint.handle_event(ch, event) {
                    conn.quic.handle_event(reply);
                }
                if drained {
                    conn.drained = true;
                }
            }
            if conn.drained {
                let mut conn = self.conns.remove(&ch).expect("present");
                conn.release(&mut self.core);
                if let Some(c) = self.core.router.driver_mut() {
                    c.session_ended(now, (ch, None));
                }
                self.core.open_connections -= 1;
                self.core.starved_conns.remove(&ch);
                if let Some(n) = self.per_ip.get_mut(&conn.peer_ip) {
                    *n -= 1;
                    if *n == 0 {
                        self.per_ip.remove(&conn.peer_ip);
                    }
                }
                if let Some(at) = conn.deadline {
                    self.timers.remove(&(at, ch));
                }
                debug!(connection = ch.0, "connection drained");
                return true;
            }
            while let Some(event) = conn.quic.poll() {
                any = true;
                conn.on_event(now, ch, event, &mut self.core);
            }
            conn.sync_buffered(&mut self.core);
            if !conn.ended_forwarding.is_empty() {
                let ended = std::mem::take(&mut conn.ended_forwarding);
                if let Some(c) = self.core.router.driver_mut() {
                    for id in ended {
                        c.session_ended(now, (ch, Some(id)));
                    }
                }
            }
            if !any {
                // Answers written outside the connection's events (a forward's answer, a
                // durable release, a value read) free its budget too, and the client may
                // have nothing more to send until its streams are read again.
                if conn.resume_paused_for_answers(now, ch, &mut self.core) {
                    progressed = true;
                    continue;
                }
                return progressed;
            }
            conn.resume_starved(now, ch, &mut self.core);
            conn.resume_paused_for_answers(now, ch, &mut self.core);
            progressed = true;
        }
    }

    /// Re-registers a connection's deadline in the timer index.
    fn rearm(&mut self, ch: ConnectionHandle) {
        let Some(conn) = self.conns.get_mut(&ch) else {
            return;
        };
        let next = conn.next_deadline(&self.core);
        if next != conn.deadline {
            if let Some(old) = conn.deadline {
                self.timers.remove(&(old, ch));
            }
            if let Some(new) = next {
                self.timers.insert((new, ch));
            }
            conn.deadline = next;
        }
    }
}

/// The admin API's streams live in the cluster's metadata; a single node has none to show.
/// The kind of object [`Engine::manage`] changes: whose names and permission it checks.
#[derive(Clone, Copy)]
enum Managed {
    Stream,
    Cache,
}

fn not_clustered() -> crate::AdminError {
    crate::AdminError::NotFound(
        "this broker is not a cluster node: a single node creates streams on first use".into(),
    )
}
