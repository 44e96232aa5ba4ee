//! The async front end, on tokio or smol ([`Runtime`]): one QUIC connection (quinn),
//! authenticated bidi streams driven by the Sans-IO [`crate::core`] types, and a task that
//! routes broker-opened event streams to their subscriptions. Tasks and timers go through
//! quinn's runtime trait, so this file is the one front end for every runtime.
//!
//! Streams, like the reference client: `connect_streams` request streams opened one after
//! another at connect (cache operations go round-robin over them); one dedicated publish
//! stream per (namespace, stream), opened on first use; one new stream per subscribe.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use felix_proto::binary::AckOwner;
use felix_proto::frame::DEFAULT_MAX_FRAME_BYTES;
use felix_proto::{Features, Frame, FrameDecoder};
use tokio::sync::{mpsc, oneshot, OnceCell, Semaphore};

use crate::runtime::{timeout, Runtime};

pub(crate) mod cache_features;
pub(crate) mod cluster;
pub(crate) mod groups;
pub(crate) mod stream_ops;
pub(crate) mod watch;

use crate::core::cluster::{ClusterConfig, RetryPolicy};
use crate::core::requests::{
    cache_delete_answer, cache_get_answer, cache_put_answer, published_answer,
};
use crate::core::{
    auth_frame, read_auth_reply, read_subscribe_reply, subscribe_frame, Ack, Answer, Capabilities,
    Encoded, Event, EventFrame, EventStreamReader, Offer, RequestKind, RequestStream, Start,
    SubscribeRequest, SubscriptionEnd, Target,
};
use crate::error::ClientError;
use crate::transport::{endpoint_config, quic_client_config, GsoBounded, QuicSettings};

/// How to reach and authenticate to a broker.
#[derive(Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// The broker's client listener: the only seed when `seeds` is empty.
    pub addr: SocketAddr,
    /// Brokers of a cluster to start from, dialled in order until one answers; the others
    /// are learned from `topology`. Empty: `addr` alone.
    pub seeds: Vec<SocketAddr>,
    /// Bounds on retried calls (attempts, full-jitter backoff, optional deadline).
    pub retry: RetryPolicy,
    /// The seed of the backoff's jitter (so a test can replay a run's delays).
    pub jitter_seed: u64,
    /// `not_leader` redirects one attempt follows (default
    /// [`crate::core::cluster::DEFAULT_MAX_REDIRECT_HOPS`]).
    pub max_redirect_hops: usize,
    /// How often `topology` is asked again while connected.
    pub topology_interval: Duration,
    /// How long a `shard_owners` answer routes calls before it is asked again.
    pub owners_refresh: Duration,
    /// The "recently lost broker" window: for this long after a broker's connection failed
    /// it is dialled last, no shard is routed to it, and a redirect naming it is not dialled
    /// but fails the attempt as `shard_unavailable` (retried with backoff). Default
    /// [`crate::core::cluster::DEFAULT_SUSPECT_FOR`] (5 s).
    pub suspect_for: Duration,
    /// How long an answer naming a lost broker as a shard's owner is believed.
    pub lost_owner_reask: Duration,
    /// TLS server name (SNI and certificate check). Default `"localhost"`, whatever `addr` is.
    pub server_name: String,
    /// PEM of the CA(s) to trust.
    pub ca_pem: Vec<u8>,
    /// Tenant every stream authenticates as.
    pub tenant: String,
    /// Bearer token sent verbatim on every `auth`.
    pub token: String,
    /// Offer ALPN `felix/1` (off by default, like the reference client).
    pub offer_alpn: bool,
    /// Flags and features offered on `auth`.
    pub offer: Offer,
    /// Request streams opened (and authenticated, one after another) at connect. The
    /// reference client opens 40.
    pub connect_streams: usize,
    /// Bound on the QUIC handshake, and on each auth round trip.
    pub connect_timeout: Duration,
    /// Bound on waiting for any answer (publish ack, cache answer, `subscribed`, hello): the
    /// per-request deadline. A broker that lets it pass is treated as lost: its connection
    /// is closed and the call's outcome is unknown.
    pub request_timeout: Duration,
    /// QUIC idle timeout, the bound on noticing a dead or frozen broker; a keep-alive is
    /// sent at a quarter of it. 6 s for one broker (as the reference client), and
    /// [`DEFAULT_IDLE_TIMEOUT`] for the cluster client.
    pub idle_timeout: Duration,
    /// QUIC receive window per stream: how far the broker may run ahead of a reader (an
    /// event stream the application does not read stops the broker at this many bytes).
    pub stream_receive_window: u32,
    /// The async runtime the connection runs on (tokio by default when built in).
    pub runtime: Runtime,
    /// The datagram size path-MTU discovery probes up to, 1200 to 65527 (default
    /// [`crate::DEFAULT_MTU_UPPER_BOUND`]); also the largest datagram accepted (at least 1472).
    /// A path that carries less is found by probing.
    pub mtu_upper_bound: u16,
    /// The datagram size the connection starts with, 1200 up to `mtu_upper_bound`.
    pub initial_mtu: u16,
    /// Ack-eliciting packets the broker may receive before it acknowledges, asked of it
    /// with an ACK_FREQUENCY frame (default [`crate::DEFAULT_ACK_ELICITING_THRESHOLD`]); 1
    /// is QUIC's usual and sends no frame.
    pub ack_eliciting_threshold: u32,
    /// The longest the broker may hold an acknowledgement, with a threshold other than 1.
    pub max_ack_delay: Duration,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a credential: never in logs.
        f.debug_struct("ClientConfig")
            .field("addr", &self.addr)
            .field("seeds", &self.seeds)
            .field("server_name", &self.server_name)
            .field("tenant", &self.tenant)
            .field("token", &"<redacted>")
            .field("offer_alpn", &self.offer_alpn)
            .field("offer", &self.offer)
            .field("connect_streams", &self.connect_streams)
            .field("runtime", &self.runtime)
            .finish_non_exhaustive()
    }
}

impl ClientConfig {
    /// Defaults for everything but where to go and who we are.
    pub fn new(addr: SocketAddr, ca_pem: impl Into<Vec<u8>>, tenant: &str, token: &str) -> Self {
        let cluster = ClusterConfig::new(Vec::new());
        ClientConfig {
            addr,
            seeds: Vec::new(),
            retry: cluster.retry,
            jitter_seed: 0,
            max_redirect_hops: cluster.max_redirect_hops,
            topology_interval: cluster.topology_interval,
            owners_refresh: cluster.owners_refresh,
            suspect_for: cluster.suspect_for,
            lost_owner_reask: cluster.lost_owner_reask,
            server_name: "localhost".into(),
            ca_pem: ca_pem.into(),
            tenant: tenant.into(),
            token: token.into(),
            offer_alpn: false,
            offer: Offer::full(),
            connect_streams: 1,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(6),
            stream_receive_window: 64 << 20,
            runtime: Runtime::default(),
            mtu_upper_bound: crate::transport::DEFAULT_MTU_UPPER_BOUND,
            initial_mtu: crate::transport::DEFAULT_INITIAL_MTU,
            ack_eliciting_threshold: crate::transport::DEFAULT_ACK_ELICITING_THRESHOLD,
            max_ack_delay: crate::transport::DEFAULT_MAX_ACK_DELAY,
        }
    }

    /// Defaults for the cluster client, reached through `seeds` (at least one): calls are
    /// routed to owners, retried and resumed, and a broker is presumed dead after
    /// [`DEFAULT_IDLE_TIMEOUT`] of silence.
    pub fn with_seeds(
        seeds: Vec<SocketAddr>,
        ca_pem: impl Into<Vec<u8>>,
        tenant: &str,
        token: &str,
    ) -> Self {
        let first = *seeds.first().expect("at least one seed");
        let mut config = ClientConfig::new(first, ca_pem, tenant, token);
        config.seeds = seeds;
        config.idle_timeout = DEFAULT_IDLE_TIMEOUT;
        config.offer = Offer::cluster();
        config
    }

    /// The seeds to dial: `seeds`, or `addr` when there are none.
    pub fn seed_list(&self) -> Vec<SocketAddr> {
        if self.seeds.is_empty() {
            vec![self.addr]
        } else {
            self.seeds.clone()
        }
    }

    fn cluster_config(&self) -> ClusterConfig {
        let mut c = ClusterConfig::new(self.seed_list());
        c.seed = self.jitter_seed;
        c.retry = self.retry;
        c.max_redirect_hops = self.max_redirect_hops;
        c.topology_interval = self.topology_interval;
        c.owners_refresh = self.owners_refresh;
        c.suspect_for = self.suspect_for;
        c.lost_owner_reask = self.lost_owner_reask;
        c
    }
}

/// The default QUIC idle timeout: a broker silent this long (its keep-alives unanswered) is
/// dead to the client, and its calls are failed over. Short enough that a killed leader's
/// shards are noticed well within a lease; long enough for a loaded machine's pauses.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// A client of one broker or of a cluster. Clones share the connections and their streams.
///
/// Publishes, cache calls and subscriptions are routed to their shard's owner, follow
/// redirects and moves, and are retried ([`crate::core::cluster`] decides; `cluster.rs`
/// carries it). Other calls (groups, watches, stream operations) go to the broker first
/// connected, which forwards them.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// The cluster this client routes over; `None` for the per-broker clients it holds.
    cluster: Option<Arc<cluster::ClusterShared>>,
}

/// A publish stream, opened once on first use.
type PublishSlot = Arc<OnceCell<Arc<RequestChannel>>>;

struct Inner {
    runtime: Arc<dyn quinn::Runtime>,
    endpoint: quinn::Endpoint,
    conn: quinn::Connection,
    config: ClientConfig,
    caps: Capabilities,
    request_streams: Vec<Arc<RequestChannel>>,
    next_request_stream: AtomicUsize,
    publish_streams: Mutex<HashMap<(String, String), PublishSlot>>,
    /// One window for every stream when the broker's window is per connection.
    connection_window: Option<Arc<Semaphore>>,
    events: Arc<EventRouter>,
    /// Idle streams for consumer-group calls.
    group_streams: groups::GroupStreams,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Reader tasks hold stream handles, which would keep the connection open.
        self.conn.close(0u32.into(), b"client dropped");
    }
}

impl Client {
    /// Dials the seeds in order on `config.runtime` until one completes a handshake and
    /// authenticates `connect_streams` streams, asks it `topology`, and starts routing event
    /// streams. Other brokers are connected when a call is routed to them. On tokio, call it
    /// inside the runtime.
    ///
    /// With no `seeds` (a config from [`ClientConfig::new`]) it is the client of the one
    /// broker at `addr`: every call goes there, nothing is routed, retried or resumed. With
    /// seeds ([`ClientConfig::with_seeds`], even one) it is the cluster client.
    pub async fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        if config.seeds.is_empty() {
            let addr = config.addr;
            return Client::connect_node(config, addr).await;
        }
        cluster::ClusterShared::connect(config.clone(), config.cluster_config()).await
    }

    /// One connection to the broker at `addr`, with no routing or retries of its own.
    pub(crate) async fn connect_node(
        config: ClientConfig,
        addr: SocketAddr,
    ) -> Result<Client, ClientError> {
        let mut config = config;
        config.addr = addr;
        let runtime = config.runtime.quinn();
        let quic = quic_client_config(&QuicSettings {
            ca_pem: &config.ca_pem,
            offer_alpn: config.offer_alpn,
            idle_timeout: config.idle_timeout,
            stream_receive_window: config.stream_receive_window,
            mtu_upper_bound: config.mtu_upper_bound,
            initial_mtu: config.initial_mtu,
            ack_eliciting_threshold: config.ack_eliciting_threshold,
            max_ack_delay: config.max_ack_delay,
        })?;
        let bind: SocketAddr = if config.addr.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal")
        } else {
            "[::]:0".parse().expect("literal")
        };
        let endpoint = std::net::UdpSocket::bind(bind)
            .and_then(|socket| {
                size_socket_buffers(&socket);
                let socket = runtime.wrap_udp_socket(socket)?;
                quinn::Endpoint::new_with_abstract_socket(
                    endpoint_config(config.mtu_upper_bound),
                    None,
                    Arc::new(GsoBounded::new(socket, config.mtu_upper_bound)),
                    runtime.clone(),
                )
            })
            .map_err(|e| ClientError::Connection(format!("cannot bind a UDP socket: {e}")))?;
        let connecting = endpoint
            .connect_with(quic, config.addr, &config.server_name)
            .map_err(|e| ClientError::Usage(format!("cannot dial {}: {e}", config.addr)))?;
        let conn = match timeout(&*runtime, config.connect_timeout, connecting).await {
            Err(_) => return Err(ClientError::Timeout("the QUIC handshake")),
            Ok(Err(e)) => return Err(ClientError::Connection(format!("handshake: {e}"))),
            Ok(Ok(conn)) => conn,
        };

        let mut streams = Vec::with_capacity(config.connect_streams.max(1));
        let mut caps = None;
        for _ in 0..config.connect_streams.max(1) {
            match open_authenticated(&*runtime, &conn, &config).await {
                Ok((send, recv, decoder, stream_caps)) => {
                    caps.get_or_insert(stream_caps);
                    streams.push((send, recv, decoder, stream_caps));
                }
                Err(e) => {
                    conn.close(0u32.into(), b"connect failed");
                    return Err(e);
                }
            }
        }
        let caps = caps.expect("at least one stream");
        let connection_window = match caps.publish_window() {
            Some(w) if !caps.broker_has(Features::STREAM_PUBLISH_WINDOW) => {
                Some(Arc::new(Semaphore::new(w as usize)))
            }
            _ => None,
        };
        let request_streams = streams
            .into_iter()
            .map(|(send, recv, decoder, stream_caps)| {
                RequestChannel::start(
                    &runtime,
                    send,
                    recv,
                    decoder,
                    RequestStream::new(stream_caps, config.tenant.clone()),
                    connection_window.clone(),
                )
            })
            .collect();

        let events = Arc::new(EventRouter::default());
        runtime.spawn(Box::pin(route_event_streams(
            runtime.clone(),
            conn.clone(),
            events.clone(),
            caps,
            config.request_timeout,
        )));

        Ok(Client {
            cluster: None,
            inner: Arc::new(Inner {
                runtime,
                endpoint,
                conn,
                config,
                caps,
                request_streams,
                next_request_stream: AtomicUsize::new(0),
                publish_streams: Mutex::new(HashMap::new()),
                group_streams: groups::GroupStreams::default(),
                connection_window,
                events,
            }),
        })
    }

    /// What the first stream negotiated.
    pub fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    /// The ALPN protocol the handshake selected, if any.
    pub fn negotiated_alpn(&self) -> Option<Vec<u8>> {
        let data = self.inner.conn.handshake_data()?;
        data.downcast::<quinn::crypto::rustls::HandshakeData>()
            .ok()?
            .protocol
    }

    /// The underlying QUIC connection (for statistics and tests).
    pub fn connection(&self) -> &quinn::Connection {
        &self.inner.conn
    }

    /// Publishes `payloads` as one batch to `namespace/stream`, on the stream's dedicated
    /// publish stream. Several publishes may be in flight at once (up to the negotiated
    /// window); each call returns when its own answer arrives. Returns the offset of the
    /// first record when the broker gave one; `Ack::None` returns once the frame is written.
    ///
    /// In a cluster the batch goes to its key's shard owner. A refusal that proves nothing
    /// was written (`not_leader`, `shard_unavailable`, `overloaded`...) and a failure before
    /// the batch left are retried; a batch whose outcome is unknown (the connection went
    /// away with it unanswered, `quorum_timeout`, ...) is **never re-sent**: the error says
    /// so, and [`Client::publish_at_least_once`] is the call that re-sends.
    pub async fn publish(
        &self,
        namespace: &str,
        stream: &str,
        payloads: Vec<Bytes>,
        key: Option<Bytes>,
        ack: Ack,
    ) -> Result<Option<u64>, ClientError> {
        match &self.cluster {
            Some(cluster) => {
                cluster
                    .publish(namespace, stream, &payloads, key.as_deref(), ack, false)
                    .await
            }
            None => self
                .publish_here(namespace, stream, &payloads, key.as_deref(), ack)
                .await
                .map(|(offset, _)| offset)
                .map_err(|(e, _)| e),
        }
    }

    /// Like [`Client::publish`], but re-sends a batch whose outcome is unknown, until it is
    /// acknowledged or the retry bounds run out: the batch is written at least once, and
    /// may be written twice (an idempotent producer, [`Client::publish_idempotent`], is the
    /// way to have neither loss nor duplicate).
    pub async fn publish_at_least_once(
        &self,
        namespace: &str,
        stream: &str,
        payloads: Vec<Bytes>,
        key: Option<Bytes>,
    ) -> Result<Option<u64>, ClientError> {
        match &self.cluster {
            Some(cluster) => {
                cluster
                    .publish(
                        namespace,
                        stream,
                        &payloads,
                        key.as_deref(),
                        Ack::PerMessage,
                        true,
                    )
                    .await
            }
            None => self
                .publish_here(
                    namespace,
                    stream,
                    &payloads,
                    key.as_deref(),
                    Ack::PerMessage,
                )
                .await
                .map(|(offset, _)| offset)
                .map_err(|(e, _)| e),
        }
    }

    /// One publish on this connection; the flag says whether the batch was written.
    pub(crate) async fn publish_here(
        &self,
        namespace: &str,
        stream: &str,
        payloads: &[Bytes],
        key: Option<&[u8]>,
        ack: Ack,
    ) -> Result<(Option<u64>, Option<AckOwner>), (ClientError, bool)> {
        let channel = self
            .publish_stream(namespace, stream)
            .await
            .map_err(|e| (e, false))?;
        let target = Target {
            namespace,
            name: stream,
        };
        let answer = channel
            .call_hinted(
                ack != Ack::None,
                self.inner.config.request_timeout,
                |core| core.publish(target, payloads, key, ack),
            )
            .await
            .map_err(|e| {
                let sent = !matches!(e, ClientError::Usage(_));
                (e, sent)
            })?;
        match answer {
            None => Ok((None, None)),
            Some((answer, owner)) => published_answer(answer)
                .map(|offset| (offset, owner))
                .map_err(|e| (e, true)),
        }
    }

    /// Stores `value` under `key`, expiring after `ttl` if given. In a cluster it goes to the
    /// cache's owner; a refusal proving nothing was written is retried, an unknown outcome
    /// is reported (never re-sent).
    pub async fn cache_put(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
        value: Bytes,
        ttl: Option<Duration>,
    ) -> Result<(), ClientError> {
        let Some(cluster) = &self.cluster else {
            return self
                .cache_put_here(namespace, cache, key, &value, ttl)
                .await;
        };
        cluster
            .cache_call(namespace, cache, key, false, |node| {
                let value = value.clone();
                Box::pin(async move {
                    node.cache_put_here(namespace, cache, key, &value, ttl)
                        .await
                })
            })
            .await
    }

    /// Reads `key`; `None` when absent or expired. In a cluster it is read from the cache's
    /// owner, and retried (a read changes nothing) until answered or the bounds run out.
    pub async fn cache_get(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
    ) -> Result<Option<Bytes>, ClientError> {
        let Some(cluster) = &self.cluster else {
            return self.cache_get_here(namespace, cache, key).await;
        };
        cluster
            .cache_call(namespace, cache, key, true, |node| {
                Box::pin(async move { node.cache_get_here(namespace, cache, key).await })
            })
            .await
    }

    /// Removes `key`, returning the value it held (`None` if there was none). Routed and
    /// retried as [`Client::cache_put`] is.
    pub async fn cache_delete(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
    ) -> Result<Option<Bytes>, ClientError> {
        let Some(cluster) = &self.cluster else {
            return self.cache_delete_here(namespace, cache, key).await;
        };
        cluster
            .cache_call(namespace, cache, key, false, |node| {
                Box::pin(async move { node.cache_delete_here(namespace, cache, key).await })
            })
            .await
    }

    /// Runs `call` on the connection to the cache's owner in a cluster (routed and retried,
    /// `read` calls re-sent on an unknown outcome), or on this one.
    pub(crate) async fn on_cache_owner<'a, T: 'a>(
        &self,
        namespace: &str,
        cache: &str,
        key: &'a str,
        read: bool,
        mut call: impl FnMut(Client) -> cluster::NodeCall<'a, T>,
    ) -> Result<T, ClientError> {
        match &self.cluster {
            Some(cluster) => cluster.cache_call(namespace, cache, key, read, call).await,
            None => call(self.clone()).await,
        }
    }

    pub(crate) async fn cache_put_here(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
        value: &Bytes,
        ttl: Option<Duration>,
    ) -> Result<(), ClientError> {
        let target = Target {
            namespace,
            name: cache,
        };
        let ttl_ms = ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
        cache_put_answer(
            self.cache_call(|core| core.cache_put(target, key, value, ttl_ms))
                .await?,
        )
    }

    pub(crate) async fn cache_get_here(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
    ) -> Result<Option<Bytes>, ClientError> {
        let target = Target {
            namespace,
            name: cache,
        };
        cache_get_answer(self.cache_call(|core| core.cache_get(target, key)).await?)
    }

    pub(crate) async fn cache_delete_here(
        &self,
        namespace: &str,
        cache: &str,
        key: &str,
    ) -> Result<Option<Bytes>, ClientError> {
        let target = Target {
            namespace,
            name: cache,
        };
        cache_delete_answer(
            self.cache_call(|core| core.cache_delete(target, key))
                .await?,
        )
    }

    /// Subscribes to shard 0 of `namespace/stream` on a new stream, and waits for both the
    /// `subscribed` answer and the broker's event stream. In a cluster it subscribes at the
    /// shard's owner, following `not_leader`; the subscription survives a lost broker and a
    /// `shard_moved`, resuming after the last delivered offset.
    pub async fn subscribe(
        &self,
        namespace: &str,
        stream: &str,
        start: Start,
    ) -> Result<Subscription, ClientError> {
        self.subscribe_shard(namespace, stream, start, None).await
    }

    /// Like [`Client::subscribe`], for one shard of a multi-shard stream.
    pub async fn subscribe_shard(
        &self,
        namespace: &str,
        stream: &str,
        start: Start,
        shard: Option<u32>,
    ) -> Result<Subscription, ClientError> {
        match &self.cluster {
            Some(cluster) => {
                cluster
                    .clone()
                    .subscribe(
                        namespace,
                        stream,
                        shard,
                        crate::core::cluster::Cursor::new(start),
                        None,
                    )
                    .await
            }
            None => self.subscribe_here(namespace, stream, start, shard).await,
        }
    }

    /// One subscription on this connection, with no routing or resumption.
    pub(crate) async fn subscribe_here(
        &self,
        namespace: &str,
        stream: &str,
        start: Start,
        shard: Option<u32>,
    ) -> Result<Subscription, ClientError> {
        let inner = &self.inner;
        let timeout = inner.config.request_timeout;
        let (mut send, mut recv, mut decoder, _caps) =
            open_authenticated(&*inner.runtime, &inner.conn, &inner.config).await?;
        let request = SubscribeRequest {
            namespace,
            stream,
            start,
            shard,
        };
        let frame = subscribe_frame(&inner.config.tenant, &request)?;
        send.write_chunk(frame).await.map_err(write_error)?;
        // Like the reference client: nothing more goes on this stream.
        let _ = send.finish();
        let reply = read_frame(
            &*inner.runtime,
            &mut recv,
            &mut decoder,
            timeout,
            "the subscribe answer",
        )
        .await?
        .ok_or_else(|| ClientError::Connection("subscribe stream ended with no answer".into()))?;
        let subscribed = read_subscribe_reply(&reply)?;
        // Dropping the receive side sends STOP_SENDING, as the reference client does; the
        // subscription lives on the event stream.
        drop(recv);
        let events = crate::runtime::timeout(
            &*inner.runtime,
            timeout,
            inner.events.wait(subscribed.subscription_id),
        )
        .await
        .map_err(|_| ClientError::Timeout("the subscription's event stream"))??;
        Ok(Subscription {
            subscription_id: subscribed.subscription_id,
            start_offset: subscribed.start_offset,
            recv: events.recv,
            decoder: events.decoder,
            reader: events.reader,
            pending: VecDeque::new(),
            end: None,
            _client: self.inner.clone(),
            resume: None,
        })
    }

    /// Opens a new bidi stream for hand-made frames, authenticated first when asked.
    /// For tests of the broker's edges (unknown requests, oversize frames...).
    pub async fn open_raw_stream(&self, authenticate: bool) -> Result<RawStream, ClientError> {
        // A cluster client's one-request calls (stream operations) go to its current entry
        // broker, which forwards.
        if let Some(cluster) = &self.cluster {
            let entry = Box::pin(cluster.entry_node()).await?;
            return Box::pin(entry.open_raw_stream(authenticate)).await;
        }
        let inner = &self.inner;
        if authenticate {
            let (send, recv, decoder, caps) =
                open_authenticated(&*inner.runtime, &inner.conn, &inner.config).await?;
            Ok(RawStream {
                runtime: inner.runtime.clone(),
                send,
                recv,
                decoder,
                caps: Some(caps),
                timeout: inner.config.request_timeout,
            })
        } else {
            let (send, recv) = inner.conn.open_bi().await.map_err(connection_error)?;
            Ok(RawStream {
                runtime: inner.runtime.clone(),
                send,
                recv,
                decoder: FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES),
                caps: None,
                timeout: inner.config.request_timeout,
            })
        }
    }

    /// Opens and authenticates one more idle stream, returning its capabilities. The stream
    /// stays open as long as the returned handle lives (the reference client keeps 40).
    pub async fn open_idle_stream(&self) -> Result<RawStream, ClientError> {
        self.open_raw_stream(true).await
    }

    /// The tenant every stream authenticates as.
    pub(crate) fn tenant(&self) -> &str {
        &self.inner.config.tenant
    }

    /// Closes the connection (code 0) for every clone and subscription, and waits briefly
    /// for the close to be sent.
    pub async fn close(self) {
        if let Some(cluster) = &self.cluster {
            cluster.close_all();
        }
        self.inner.conn.close(0u32.into(), b"client closed");
        let inner = &self.inner;
        let _ = timeout(
            &*inner.runtime,
            Duration::from_secs(1),
            inner.endpoint.wait_idle(),
        )
        .await;
    }

    async fn cache_call(
        &self,
        encode: impl FnOnce(&mut RequestStream) -> Result<Encoded, ClientError>,
    ) -> Result<Answer, ClientError> {
        let streams = &self.inner.request_streams;
        let i = self
            .inner
            .next_request_stream
            .fetch_add(1, Ordering::Relaxed)
            % streams.len();
        streams[i]
            .call(false, self.inner.config.request_timeout, encode)
            .await?
            .ok_or_else(|| ClientError::protocol("cache request without a request id"))
    }

    async fn publish_stream(
        &self,
        namespace: &str,
        stream: &str,
    ) -> Result<Arc<RequestChannel>, ClientError> {
        let cell = {
            let mut map = self
                .inner
                .publish_streams
                .lock()
                .expect("publish stream map");
            let key = (namespace.to_owned(), stream.to_owned());
            // A stream the broker ended is replaced by a fresh one on the next publish.
            if map
                .get(&key)
                .and_then(|c| c.get())
                .is_some_and(|c| c.is_failed())
            {
                map.remove(&key);
            }
            map.entry(key).or_default().clone()
        };
        let inner = &self.inner;
        let channel = cell
            .get_or_try_init(|| async {
                let (send, recv, decoder, caps) =
                    open_authenticated(&*inner.runtime, &inner.conn, &inner.config).await?;
                Ok::<_, ClientError>(RequestChannel::start(
                    &inner.runtime,
                    send,
                    recv,
                    decoder,
                    RequestStream::new(caps, inner.config.tenant.clone()),
                    inner.connection_window.clone(),
                ))
            })
            .await?;
        Ok(channel.clone())
    }
}

/// Opens a bidi stream and runs the `auth` exchange on it.
async fn open_authenticated(
    runtime: &dyn quinn::Runtime,
    conn: &quinn::Connection,
    config: &ClientConfig,
) -> Result<
    (
        quinn::SendStream,
        quinn::RecvStream,
        FrameDecoder,
        Capabilities,
    ),
    ClientError,
> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(connection_error)?;
    send.write_chunk(auth_frame(&config.tenant, &config.token, &config.offer))
        .await
        .map_err(write_error)?;
    let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
    let reply = read_frame(
        runtime,
        &mut recv,
        &mut decoder,
        config.connect_timeout,
        "the auth answer",
    )
    .await?
    .ok_or_else(|| ClientError::Connection("auth response missing: stream ended".into()))?;
    let caps = read_auth_reply(&config.offer, &reply)?;
    Ok((send, recv, decoder, caps))
}

/// Reads the next whole frame; `None` when the stream finished cleanly between frames.
async fn read_frame(
    runtime: &dyn quinn::Runtime,
    recv: &mut quinn::RecvStream,
    decoder: &mut FrameDecoder,
    limit: Duration,
    what: &'static str,
) -> Result<Option<Frame>, ClientError> {
    let read = async {
        loop {
            if let Some(frame) = decoder.next_frame()? {
                return Ok(Some(frame));
            }
            match recv.read_chunk(usize::MAX, true).await {
                Ok(Some(chunk)) => decoder.feed_bytes(chunk.bytes),
                Ok(None) if decoder.buffered() == 0 => return Ok(None),
                Ok(None) => {
                    return Err(ClientError::protocol(
                        "stream ended in the middle of a frame",
                    ))
                }
                Err(e) => return Err(read_error(e)),
            }
        }
    };
    timeout(runtime, limit, read)
        .await
        .map_err(|_| ClientError::Timeout(what))?
}

fn connection_error(e: quinn::ConnectionError) -> ClientError {
    ClientError::Connection(e.to_string())
}

fn write_error(e: quinn::WriteError) -> ClientError {
    ClientError::Connection(format!("write: {e}"))
}

fn read_error(e: quinn::ReadError) -> ClientError {
    ClientError::Connection(format!("read: {e}"))
}

/// An answer, with the owner hint a forwarded publish's ack carried.
type Answered = (Answer, Option<AckOwner>);
type Waiter = oneshot::Sender<Result<Answered, ClientError>>;

/// Frames queued for a stream's writer task beyond the one being written. The real bound
/// on bytes in flight is QUIC flow control (and the publish window); this only keeps a
/// burst of fire-and-forget publishes from queueing without limit.
const WRITE_QUEUE_FRAMES: usize = 64;

/// One request stream: the core state, the queue to its writer task, and the answers being
/// waited for.
///
/// Frames are written by a task of their own, never by the caller: a caller whose future is
/// dropped mid-write (a timeout, a `select!`) would otherwise leave half a frame on the
/// stream, and every later frame would be misread.
struct RequestChannel {
    runtime: Arc<dyn quinn::Runtime>,
    /// The queue every call waits in, in arrival order, for its window slot and its place
    /// in `frames`: calls cannot overtake one another, so concurrent calls reach the wire
    /// in the order they first got in line.
    turn: tokio::sync::Mutex<()>,
    frames: mpsc::Sender<Bytes>,
    state: Mutex<ChannelState>,
    window: Arc<Semaphore>,
}

struct ChannelState {
    core: RequestStream,
    waiters: HashMap<u64, Waiter>,
    failed: Option<ClientError>,
    /// The broker stopped reading this stream: nothing more is written, but the answers it
    /// sent before are still read and delivered; new requests go to another stream.
    writes_closed: Option<ClientError>,
}

impl ChannelState {
    fn fail(&mut self, error: ClientError) {
        for (id, _) in self.core.drain_outstanding() {
            if let Some(tx) = self.waiters.remove(&id) {
                let _ = tx.send(Err(error.clone()));
            }
        }
        self.waiters.clear();
        self.failed.get_or_insert(error);
    }
}

impl RequestChannel {
    fn start(
        runtime: &Arc<dyn quinn::Runtime>,
        send: quinn::SendStream,
        recv: quinn::RecvStream,
        decoder: FrameDecoder,
        core: RequestStream,
        connection_window: Option<Arc<Semaphore>>,
    ) -> Arc<RequestChannel> {
        let window =
            connection_window.unwrap_or_else(|| Arc::new(Semaphore::new(core.publish_limit())));
        let (frames, queued) = mpsc::channel(WRITE_QUEUE_FRAMES);
        let channel = Arc::new(RequestChannel {
            runtime: runtime.clone(),
            turn: tokio::sync::Mutex::new(()),
            frames,
            state: Mutex::new(ChannelState {
                core,
                waiters: HashMap::new(),
                failed: None,
                writes_closed: None,
            }),
            window,
        });
        runtime.spawn(Box::pin(channel.clone().read_answers(recv, decoder)));
        runtime.spawn(Box::pin(write_frames(
            Arc::downgrade(&channel),
            send,
            queued,
        )));
        channel
    }

    /// Queues a request and waits for its answer. Cancel-safe: nothing is encoded until the
    /// queue has room, and encoding and queueing happen together under one lock, so request
    /// ids reach the wire in order and a queued frame is always written whole. Calls are
    /// served first come, first served (see `turn`).
    /// `windowed` requests hold a window slot until answered.
    async fn call(
        &self,
        windowed: bool,
        limit: Duration,
        encode: impl FnOnce(&mut RequestStream) -> Result<Encoded, ClientError>,
    ) -> Result<Option<Answer>, ClientError> {
        Ok(self
            .call_hinted(windowed, limit, encode)
            .await?
            .map(|(answer, _)| answer))
    }

    /// [`RequestChannel::call`], with the owner hint of a forwarded publish's ack.
    async fn call_hinted(
        &self,
        windowed: bool,
        limit: Duration,
        encode: impl FnOnce(&mut RequestStream) -> Result<Encoded, ClientError>,
    ) -> Result<Option<Answered>, ClientError> {
        let exchange = async {
            // Two separate waits (window, then queue) would let a later call that gets
            // polled sooner slip past an earlier one between them.
            let turn = self.turn.lock().await;
            let permit = if windowed {
                match self.window.acquire().await {
                    Ok(permit) => Some(permit),
                    // Closed when the stream failed.
                    Err(_) => return Err(self.failure()),
                }
            } else {
                None
            };
            let Ok(slot) = self.frames.reserve().await else {
                return Err(self.failure());
            };
            let rx = {
                let mut state = self.state.lock().expect("request stream state");
                if let Some(e) = state.failed.as_ref().or(state.writes_closed.as_ref()) {
                    return Err(e.clone());
                }
                let encoded = encode(&mut state.core)?;
                let rx = encoded.request_id.map(|id| {
                    let (tx, rx) = oneshot::channel();
                    state.waiters.insert(id, tx);
                    rx
                });
                slot.send(encoded.frame);
                rx
            };
            drop(turn);
            let Some(rx) = rx else { return Ok(None) };
            if let Some(p) = permit {
                // Given back by the reader when the answer arrives.
                p.forget();
            }
            match rx.await {
                Ok(result) => result.map(Some),
                Err(_) => Err(self.failure()),
            }
        };
        timeout(&*self.runtime, limit, exchange)
            .await
            .map_err(|_| ClientError::Timeout("an answer"))?
    }

    fn fail(&self, error: ClientError) {
        self.state.lock().expect("request stream state").fail(error);
        self.window.close();
    }

    /// The broker stopped reading: see [`ChannelState::writes_closed`].
    fn close_writes(&self, error: ClientError) {
        let mut state = self.state.lock().expect("request stream state");
        state.writes_closed.get_or_insert(error);
    }

    fn failure(&self) -> ClientError {
        let state = self.state.lock().expect("request stream state");
        state
            .failed
            .clone()
            .or_else(|| state.writes_closed.clone())
            .unwrap_or_else(|| ClientError::Connection("request stream closed".into()))
    }

    /// No new request may use this stream (it failed, or the broker stopped reading it).
    fn is_failed(&self) -> bool {
        let state = self.state.lock().expect("request stream state");
        state.failed.is_some() || state.writes_closed.is_some()
    }

    async fn read_answers(self: Arc<Self>, mut recv: quinn::RecvStream, mut decoder: FrameDecoder) {
        let error = loop {
            match recv.read_chunk(usize::MAX, true).await {
                Ok(Some(chunk)) => decoder.feed_bytes(chunk.bytes),
                Ok(None) => break ClientError::Connection("the broker finished the stream".into()),
                Err(e) => break read_error(e),
            }
            let mut fatal = None;
            loop {
                let frame = match decoder.next_frame() {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(e) => {
                        fatal = Some(ClientError::from(e));
                        break;
                    }
                };
                let mut state = self.state.lock().expect("request stream state");
                match state.core.handle_frame(&frame) {
                    Ok(done) => {
                        if done.kind == RequestKind::Publish {
                            self.window.add_permits(1);
                        }
                        if let Some(tx) = state.waiters.remove(&done.request_id) {
                            let owner = done.owner;
                            let _ = tx.send(done.result.map(|a| (a, owner)));
                        }
                    }
                    Err(e) => {
                        fatal = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = fatal {
                break e;
            }
        };
        self.fail(error);
    }
}

/// Writes queued frames in order, several per call when they are waiting. Ends when the
/// channel is gone or a write fails (which fails the channel).
async fn write_frames(
    channel: std::sync::Weak<RequestChannel>,
    mut send: quinn::SendStream,
    mut queued: mpsc::Receiver<Bytes>,
) {
    let mut batch = Vec::with_capacity(WRITE_QUEUE_FRAMES);
    while queued.recv_many(&mut batch, WRITE_QUEUE_FRAMES).await > 0 {
        if let Err(e) = send.write_all_chunks(&mut batch).await {
            if let Some(channel) = channel.upgrade() {
                match e {
                    // The broker stopped reading, e.g. it refused a frame on its header. What
                    // it answered first is still arriving: the reader delivers it, and fails
                    // whatever is left when the stream ends.
                    quinn::WriteError::Stopped(_) => channel.close_writes(write_error(e)),
                    e => channel.fail(write_error(e)),
                }
            }
            return;
        }
        batch.clear();
    }
}

/// A stream authenticated (or not) by hand, for tests.
pub struct RawStream {
    runtime: Arc<dyn quinn::Runtime>,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
    caps: Option<Capabilities>,
    timeout: Duration,
}

impl RawStream {
    /// What the stream's `auth` negotiated, if it authenticated.
    pub fn capabilities(&self) -> Option<&Capabilities> {
        self.caps.as_ref()
    }

    /// Writes raw bytes.
    pub async fn send(&mut self, bytes: Bytes) -> Result<(), ClientError> {
        self.send.write_chunk(bytes).await.map_err(write_error)
    }

    /// Finishes our side.
    pub fn finish(&mut self) {
        let _ = self.send.finish();
    }

    /// The next frame; `None` when the broker finished the stream.
    pub async fn recv_frame(&mut self) -> Result<Option<Frame>, ClientError> {
        read_frame(
            &*self.runtime,
            &mut self.recv,
            &mut self.decoder,
            self.timeout,
            "a frame",
        )
        .await
    }
}

/// One item from [`Subscription::next`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriptionItem {
    /// An event.
    Event(Event),
    /// The subscription is over; every later call returns the same end.
    End(SubscriptionEnd),
}

/// A live subscription: events from its event stream, in order.
pub struct Subscription {
    subscription_id: u64,
    start_offset: Option<u64>,
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
    reader: EventStreamReader,
    pending: VecDeque<Event>,
    end: Option<SubscriptionEnd>,
    _client: Arc<Inner>,
    /// In a cluster: how to subscribe again after a lost broker or a move.
    resume: Option<Box<cluster::Resume>>,
}

impl Subscription {
    /// The broker's id for this subscription.
    pub fn id(&self) -> u64 {
        self.subscription_id
    }

    /// The first offset it delivers, when the broker said.
    pub fn start_offset(&self) -> Option<u64> {
        self.start_offset
    }

    /// The broker this subscription is on now (in a cluster, another after a redirect, a
    /// move or a lost broker).
    pub fn broker(&self) -> SocketAddr {
        self._client.config.addr
    }

    /// The next event, or the end of the subscription. A broker `error` on the event stream
    /// and a lost connection are errors. Cancel-safe: dropping the future (say, in a
    /// `select!` or a timeout) loses nothing; received bytes stay buffered here.
    ///
    /// In a cluster a lost broker and a `shard_moved` are not ends: the subscription is made
    /// again (at the named owner for a move) from after the last delivered offset, so
    /// delivery carries on with no gap and no repeat. It errs only once that fails within
    /// the retry bounds.
    pub async fn next(&mut self) -> Result<SubscriptionItem, ClientError> {
        loop {
            let item = self.next_here().await;
            let Some(resume) = self.resume.as_mut() else {
                return item;
            };
            let moved_to = match &item {
                Ok(SubscriptionItem::Event(e)) => {
                    if let Some(offset) = e.offset {
                        resume.cursor.handle_delivered(offset);
                    }
                    return item;
                }
                Ok(SubscriptionItem::End(SubscriptionEnd::ShardMoved {
                    resume_from,
                    addr,
                    ..
                })) => {
                    resume.cursor.handle_moved(*resume_from);
                    addr.clone()
                }
                Ok(SubscriptionItem::End(_)) => return item,
                // A refusal on the event stream is the broker's word, not a lost broker.
                Err(ClientError::Server { .. }) | Err(ClientError::Protocol(_)) => return item,
                Err(_) => {
                    // Only a closed connection condemns the broker; a stream reset alone
                    // is resubscribed on the same connection.
                    if self._client.conn.close_reason().is_some() {
                        resume.cluster.node_failed(resume.node);
                    }
                    None
                }
            };
            // Cloned, not taken: a caller dropping this future mid-way (a timeout) leaves
            // the subscription able to resume on the next call.
            let (cluster, namespace, stream, shard, cursor) = (
                resume.cluster.clone(),
                resume.namespace.clone(),
                resume.stream.clone(),
                resume.shard,
                resume.cursor,
            );
            *self = cluster
                .subscribe(&namespace, &stream, shard, cursor, moved_to.as_deref())
                .await?;
        }
    }

    /// The last offset delivered, when known (the position to resume a subscription from).
    pub fn position(&self) -> Option<u64> {
        self.resume.as_ref().and_then(|r| r.cursor.last())
    }

    async fn next_here(&mut self) -> Result<SubscriptionItem, ClientError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(SubscriptionItem::Event(event));
            }
            if let Some(end) = &self.end {
                return Ok(SubscriptionItem::End(end.clone()));
            }
            if let Some(frame) = self.decoder.next_frame()? {
                match self.reader.handle_frame(&frame)? {
                    EventFrame::Batch(batch) => self.pending.extend(batch.into_events()),
                    EventFrame::End(end) => self.end = Some(end),
                    EventFrame::Hello { .. } => unreachable!("the reader refuses a second hello"),
                }
                continue;
            }
            match self.recv.read_chunk(usize::MAX, true).await {
                Ok(Some(chunk)) => self.decoder.feed_bytes(chunk.bytes),
                Ok(None) if self.decoder.buffered() == 0 => {
                    self.end = Some(self.reader.handle_finish()?)
                }
                Ok(None) => return Err(ClientError::protocol("event stream ended mid-frame")),
                Err(e) => return Err(read_error(e)),
            }
        }
    }
}

/// An event stream whose hello arrived.
struct ArrivedEvents {
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
    reader: EventStreamReader,
}

enum Slot {
    Waiting(oneshot::Sender<Result<ArrivedEvents, ClientError>>),
    Arrived(ArrivedEvents),
}

/// Matches broker-opened event streams to subscriptions by the hello's id. Either side can
/// come first: the hello may overtake `subscribed`.
#[derive(Default)]
struct EventRouter {
    state: Mutex<RouterState>,
}

#[derive(Default)]
struct RouterState {
    slots: HashMap<u64, Slot>,
    closed: Option<ClientError>,
}

impl EventRouter {
    async fn wait(&self, id: u64) -> Result<ArrivedEvents, ClientError> {
        let rx = {
            let mut state = self.state.lock().expect("event router");
            match state.slots.remove(&id) {
                Some(Slot::Arrived(events)) => return Ok(events),
                Some(Slot::Waiting(_)) => {
                    return Err(ClientError::protocol(format!(
                        "subscription id {id} given twice"
                    )))
                }
                None => {}
            }
            if let Some(e) = &state.closed {
                return Err(e.clone());
            }
            let (tx, rx) = oneshot::channel();
            state.slots.insert(id, Slot::Waiting(tx));
            rx
        };
        rx.await
            .map_err(|_| ClientError::Connection("connection closed".into()))?
    }

    fn arrived(&self, id: u64, events: ArrivedEvents) {
        let mut state = self.state.lock().expect("event router");
        match state.slots.remove(&id) {
            Some(Slot::Waiting(tx)) => {
                let _ = tx.send(Ok(events));
            }
            // A stray or duplicate: keep the newest, the old one is dropped (STOP_SENDING).
            _ => {
                state.slots.insert(id, Slot::Arrived(events));
            }
        }
    }

    fn close(&self, error: ClientError) {
        let mut state = self.state.lock().expect("event router");
        for (_, slot) in state.slots.drain() {
            if let Slot::Waiting(tx) = slot {
                let _ = tx.send(Err(error.clone()));
            }
        }
        state.closed = Some(error);
    }
}

async fn route_event_streams(
    runtime: Arc<dyn quinn::Runtime>,
    conn: quinn::Connection,
    router: Arc<EventRouter>,
    caps: Capabilities,
    limit: Duration,
) {
    loop {
        let recv = match conn.accept_uni().await {
            Ok(recv) => recv,
            Err(e) => {
                router.close(connection_error(e));
                return;
            }
        };
        let router = router.clone();
        let task_runtime = runtime.clone();
        runtime.spawn(Box::pin(async move {
            let mut recv = recv;
            let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
            let mut reader = EventStreamReader::new(&caps);
            let Ok(Some(first)) = read_frame(
                &*task_runtime,
                &mut recv,
                &mut decoder,
                limit,
                "event_stream_hello",
            )
            .await
            else {
                return;
            };
            let Ok(EventFrame::Hello { subscription_id }) = reader.handle_frame(&first) else {
                // Not an event stream we can use; dropping it stops the broker sending.
                return;
            };
            router.arrived(
                subscription_id,
                ArrivedEvents {
                    recv,
                    decoder,
                    reader,
                },
            );
        }));
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn config_debug_hides_the_token() {
        let config = super::ClientConfig::new(
            "127.0.0.1:1".parse().unwrap(),
            b"pem".to_vec(),
            "t1",
            "secret-token",
        );
        let shown = format!("{config:?}");
        assert!(!shown.contains("secret-token"), "{shown}");
        assert!(shown.contains("t1"));
    }

    /// `suspect_for` reaches the core: a redirect to a broker lost just inside the window
    /// is refused as retryable (not applied), and one at the window's end is dialled. Time
    /// is an input here: offsets from one instant, no sleeping.
    #[test]
    fn suspect_for_is_the_window_a_redirect_to_a_lost_broker_is_refused() {
        use crate::core::cluster::{classify, Cluster, Failure, DEFAULT_SUSPECT_FOR};
        use std::time::{Duration, Instant};
        let lost: std::net::SocketAddr = "127.0.0.1:7002".parse().unwrap();
        let mut config = super::ClientConfig::with_seeds(
            vec!["127.0.0.1:7001".parse().unwrap()],
            b"pem".to_vec(),
            "t1",
            "token",
        );
        assert_eq!(config.suspect_for, DEFAULT_SUSPECT_FOR);
        for window in [Duration::from_millis(750), DEFAULT_SUSPECT_FOR * 2] {
            config.suspect_for = window;
            let mut core = Cluster::new(config.cluster_config());
            let t0 = Instant::now();
            assert_eq!(core.check_redirect(lost, t0), Ok(lost));
            core.handle_connection_lost(lost, t0);
            let edge = t0 + window;
            let refused = core
                .check_redirect(lost, edge - Duration::from_millis(1))
                .unwrap_err();
            assert_eq!(
                refused.code(),
                Some(&crate::ErrorCode::ShardUnavailable),
                "{refused}"
            );
            assert_eq!(classify(&refused, true), Failure::NotApplied);
            assert_eq!(core.check_redirect(lost, edge), Ok(lost), "{window:?}");
        }
    }
}

/// What the client asks of the kernel for its UDP socket's receive and send buffers.
///
/// Why: a broker answers in bursts (a group commit releases hundreds of KiB of events and
/// acks at once), and the kernel's default receive buffer (about 208 KiB on Linux) overflows
/// before the client's task is scheduled to drain it. Every datagram dropped there is a QUIC
/// loss: a retransmission and a cut in the broker's congestion window. The kernel caps the
/// request at `net.core.rmem_max` / `wmem_max`; a refusal leaves the default in place.
pub(crate) const SOCKET_BUFFER_BYTES: usize = 4 * 1024 * 1024;

fn size_socket_buffers(socket: &std::net::UdpSocket) {
    if let Ok(state) = quinn::udp::UdpSocketState::new(socket.into()) {
        let _ = state.set_recv_buffer_size(socket.into(), SOCKET_BUFFER_BYTES);
        let _ = state.set_send_buffer_size(socket.into(), SOCKET_BUFFER_BYTES);
    }
}

#[cfg(test)]
mod socket_buffer_tests {
    use super::*;

    /// The receive buffer is raised to what the kernel allows, up to `SOCKET_BUFFER_BYTES`
    /// (Linux reports twice the request, for its own bookkeeping).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_socket_receive_buffer_is_raised_to_the_kernel_cap() {
        let cap: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .expect("rmem_max")
            .trim()
            .parse()
            .expect("a number");
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let state = quinn::udp::UdpSocketState::new((&socket).into()).expect("state");
        let before = state.recv_buffer_size((&socket).into()).expect("size");
        size_socket_buffers(&socket);
        let after = state.recv_buffer_size((&socket).into()).expect("size");
        let want = SOCKET_BUFFER_BYTES.min(cap) * 2;
        assert!(after >= want, "{before} -> {after}, want {want}");
    }
}
