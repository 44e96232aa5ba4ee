//! Engine configuration: every limit with its name, its default and its field.
//!
//! The engine never reads the environment or files: the runtime builds an [`EngineConfig`]
//! (from its own config layer) and hands it over whole.

use core::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use felix_proto::routing::RoutingMapping;

use rustls_pki_types::CertificateDer;

use crate::tls::TlsIdentity;

/// Acked publishes a stream may have unanswered before the broker stops reading it
/// (`publish_window` in `auth_ok`).
pub const DEFAULT_PUBLISH_WINDOW: u32 = 256;
/// A connection that authenticates no stream within this time is closed (code 1). Zero
/// disables the deadline.
pub const DEFAULT_AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection with no Felix frame in either direction for this long, and no live
/// subscription, is closed (code 0, "idle"). Zero disables reaping.
pub const DEFAULT_IDLE_CONNECTION_REAP: Duration = Duration::from_secs(120);
/// Concurrent client-opened bidirectional streams per connection (the real client opens 40 at
/// connect plus one per subscription or one-off request).
pub const DEFAULT_MAX_CONCURRENT_BIDI_STREAMS: u32 = 1024;
/// Streams per connection that may be open and not yet authenticated.
pub const DEFAULT_PREAUTH_MAX_STREAMS_PER_CONNECTION: usize = 16;
/// Subscriptions (broker-opened uni streams) per connection.
pub const DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION: usize = 1024;
/// Connections the endpoint holds at once; more are refused during the handshake.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Connections from one source IP address; more are refused during the handshake.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 1024;
/// Frame payload limit before a stream authenticates.
pub const DEFAULT_PREAUTH_MAX_FRAME_BYTES: u32 =
    felix_proto::frame::DEFAULT_PREAUTH_MAX_FRAME_BYTES;
/// Frame payload limit after a stream authenticates.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = felix_proto::frame::DEFAULT_MAX_FRAME_BYTES;
/// Bytes of partly received frames a connection's streams may hold together; past it, a
/// stream in the middle of a frame is not read until others complete theirs.
pub const DEFAULT_MAX_CONNECTION_BUFFERED_BYTES: usize = 64 * 1024 * 1024;
/// Bytes of partly received frames every connection together may hold. While the broker is
/// over it, a connection holding more than its fair share (this over the connections open)
/// reads no stream that is in the middle of a frame; connections under their share go on.
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 512 * 1024 * 1024;
/// Bytes of answers a connection's streams may hold unwritten together (a client that does
/// not read its answers, or reads them slowly); past it no stream of the connection is read
/// until answers drain. Answer counts alone do not bound this: a `cache_value` can be as
/// large as a cache value.
pub const DEFAULT_MAX_CONNECTION_UNWRITTEN_BYTES: usize = 32 * 1024 * 1024;
/// QUIC receive window per stream (bytes the client may send ahead of what we read).
pub const DEFAULT_STREAM_RECEIVE_WINDOW: u32 = 1024 * 1024;
/// QUIC receive window per connection.
pub const DEFAULT_CONNECTION_RECEIVE_WINDOW: u32 = 16 * 1024 * 1024;
/// Bytes quinn holds per connection written but not yet acknowledged by the peer.
pub const DEFAULT_SEND_WINDOW: u64 = 16 * 1024 * 1024;
/// QUIC idle timeout we advertise (the effective one is the smaller of both sides').
pub const DEFAULT_QUIC_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest chunk read from a stream in one call, which bounds the frames decoded ahead of the
/// window check.
pub const DEFAULT_READ_CHUNK_BYTES: usize = 64 * 1024;
/// Datagrams in one GSO batch (the runtime lowers it to what its socket supports).
pub const DEFAULT_MAX_GSO_SEGMENTS: usize = 44;
/// The largest UDP payload one send may carry: Linux refuses a GSO batch whose total
/// exceeds it, so a batch holds at most this over the datagram size.
pub const MAX_GSO_BATCH_BYTES: usize = 65_507;
/// The smallest datagram QUIC allows (RFC 9000 §14), and the lowest MTU setting.
pub const MIN_MTU: u16 = 1200;
/// The largest UDP payload IPv6 permits, and the highest MTU setting.
pub const MAX_MTU: u16 = 65_527;
/// The datagram size path-MTU discovery probes up to (the path and the peer's
/// `max_udp_payload_size` may stop it lower). Loopback and jumbo-frame LANs carry far more than
/// Ethernet's 1500; a path that carries less is found by probing, so a high bound costs a
/// few lost probes, not a broken connection.
pub const DEFAULT_MTU_UPPER_BOUND: u16 = 8952;
/// The datagram size a connection starts with, before discovery (QUIC's safe minimum).
pub const DEFAULT_INITIAL_MTU: u16 = MIN_MTU;
/// The largest datagram the broker accepts, advertised as `max_udp_payload_size`: it bounds
/// what a client's discovery may reach. quinn clients send GSO batches of up to 10
/// datagrams, and Linux drops a batch over [`MAX_GSO_BATCH_BYTES`] whole, so the default
/// keeps ten of them within it.
pub const DEFAULT_MAX_UDP_PAYLOAD_SIZE: u16 = 6550;
/// Ack-eliciting packets a peer may receive before it must acknowledge, asked of it with an
/// ACK_FREQUENCY frame (QUIC's usual is 1: every second packet; `1` sends no frame). Fewer
/// acknowledgements save the broker datagrams to read, but measured at 20 they made fan-out
/// delivery burstier (docs/performance.md), so the default asks nothing.
pub const DEFAULT_ACK_ELICITING_THRESHOLD: u32 = 1;
/// The longest the peer may hold an acknowledgement (with the threshold above): short, so a
/// quiet connection's sender learns of delivery about as soon as unasked.
pub const DEFAULT_MAX_ACK_DELAY: Duration = Duration::from_millis(2);
/// Endpoint-level responses (version negotiation, refusals, stateless resets) queued before
/// new ones are dropped.
pub const DEFAULT_MAX_QUEUED_ENDPOINT_TRANSMITS: usize = 256;

/// Streams are created on first use with this many shards.
pub const DEFAULT_SHARDS: u32 = 1;
/// Streams the broker holds; creating one more is refused `overloaded`.
pub const DEFAULT_MAX_STREAMS: usize = 100_000;
/// Sealed batches queued per subscriber before new ones are dropped for it.
pub const DEFAULT_SUBSCRIBER_QUEUE_CAPACITY: usize = 512;
/// Largest `queue_capacity` a subscribe may ask for.
pub const DEFAULT_SUBSCRIBER_QUEUE_CAPACITY_MAX: usize = 8192;
/// An open event batch is sealed early at this many records.
pub const DEFAULT_EVENT_BATCH_MAX_RECORDS: usize = 1024;
/// An open event batch is sealed early at this many payload bytes.
pub const DEFAULT_EVENT_BATCH_MAX_BYTES: usize = 1024 * 1024;
/// Event bytes queued for one connection's subscribers together (a client that subscribes to
/// many busy streams and reads none). A batch that would go past it is dropped for that
/// subscriber as if its queue were full (or ends it with `subscription_lagged` where it asked
/// for that). Subscribers on other connections are not affected.
pub const DEFAULT_MAX_CONNECTION_EVENT_BYTES: usize = 256 * 1024 * 1024;
/// Committed state one durable shard holds, keys plus values (`commit`, `state_get`). A
/// commit whose puts would take the shard past it is refused `limit_exceeded` and nothing
/// is written; a commit that shrinks the state always goes through, and recovery applies
/// whatever the log holds. The state lives in memory, so this bounds what one shard's
/// writers can make the broker hold.
pub const DEFAULT_STATE_MAX_BYTES_PER_SHARD: usize = 64 * 1024 * 1024;
/// Change frames one live cache watch may have queued; at the next change past it the watch
/// ends with `cache_watch_lagged` naming that change (re-watching from it is gapless).
pub const DEFAULT_CACHE_WATCH_QUEUE_CAPACITY: usize = 4096;
/// Durable caches this broker holds, each one log under `caches/`. Creating one more (a put
/// or a watch naming a cache never written) is refused `limit_exceeded`; caches found on disk
/// at startup are all opened, whatever their number.
pub const DEFAULT_DURABLE_CACHE_MAX_LOGS: usize = 1024;
/// Counter logs (one per cache that has counters, under `counters/`), bounded as above.
pub const DEFAULT_COUNTER_MAX_LOGS: usize = 1024;
/// Idempotent producers one tenant's shards remember together (each holds its last batches'
/// marks in memory). A new producer past it takes the place of the tenant's least recently
/// used one, if that one has been idle for the eviction time; else it is refused
/// `limit_exceeded`. Another tenant's producers are never touched.
pub const DEFAULT_MAX_PRODUCERS_PER_TENANT: usize = 65_536;
/// Keys over every durable cache and counter log together (each is an index entry in
/// memory). A put or add that would create one more is refused `limit_exceeded`.
pub const DEFAULT_DURABLE_CACHE_MAX_KEYS: usize = 1 << 20;
/// Bytes of the live entries (key, value and record framing) over every durable cache and
/// counter log together. A write that would grow them past it is refused `limit_exceeded`;
/// writes that shrink them go through. Compaction keeps each log within a few times its
/// live bytes, so this also bounds the disk the caches take.
pub const DEFAULT_DURABLE_CACHE_MAX_TOTAL_BYTES: u64 = 1 << 30;
/// Largest cache key.
pub const DEFAULT_CACHE_MAX_KEY_BYTES: usize = 1024;
/// Largest cache value.
pub const DEFAULT_CACHE_MAX_VALUE_BYTES: usize = 1024 * 1024;
/// Cache memory (keys + values) before puts are refused `overloaded`.
pub const DEFAULT_CACHE_MAX_TOTAL_BYTES: usize = 256 * 1024 * 1024;

/// Fsync interval of [`FsyncPolicy::Periodic`] unless configured (`FELIX_DURABLE_FSYNC_INTERVAL_MS`).
pub const DEFAULT_FSYNC_INTERVAL: Duration = Duration::from_millis(250);
/// A shard's log rolls to a new segment file at this size.
pub const DEFAULT_SEGMENT_MAX_BYTES: u64 = 64 << 20;
/// File operations handed to the runtime and not yet completed; past it the engine keeps
/// further ones queued (the runtime's executor never holds more).
pub const DEFAULT_MAX_INFLIGHT_FILE_OPS: usize = 64;

/// Consumer-group polls waiting for work at once across the broker
/// ([`GroupConfig::max_waiting_polls`](crate::GroupConfig::max_waiting_polls)); one more is
/// answered at once instead of waiting.
pub const DEFAULT_GROUP_MAX_WAITING_POLLS: usize = 100_000;

/// Newest written entries each log keeps in memory, so subscribers catching up at the tail
/// and gets of fresh cache keys need no file read.
pub const DEFAULT_TAIL_CACHE_BYTES: usize = 4 << 20;

/// When appended records are forced to the device (`FELIX_DURABLE_FSYNC_MODE`), and so what
/// an acknowledgement after the write means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Only at segment roll-over and shutdown: a record survives a process crash once
    /// written, not a machine crash.
    None,
    /// Within this interval of the first unsynced append (the default, 250 ms).
    Periodic(Duration),
    /// Before the record counts as durable; one fsync releases every waiter queued behind
    /// it (group commit).
    OnCommit,
}

impl FsyncPolicy {
    /// `none` | `periodic` | `on_commit`, as `FELIX_DURABLE_FSYNC_MODE` spells them;
    /// `interval` is the periodic one.
    pub fn parse(name: &str, interval: Duration) -> Result<FsyncPolicy, String> {
        match name.trim() {
            "none" => Ok(FsyncPolicy::None),
            "periodic" if interval.is_zero() => Err("the fsync interval must be above zero".into()),
            "periodic" => Ok(FsyncPolicy::Periodic(interval)),
            "on_commit" => Ok(FsyncPolicy::OnCommit),
            other => Err(format!(
                "unknown fsync mode {other:?}: expected none, periodic or on_commit"
            )),
        }
    }
}

/// Durable storage: with it every stream and cache lives in segment logs under the runtime's
/// storage directory; without it ([`EngineConfig::durable`] `None`) they stay in memory.
/// The engine only names files relative to that directory; the runtime performs the
/// operations ([`crate::Output::FileOp`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DurableConfig {
    /// See [`FsyncPolicy`].
    pub fsync: FsyncPolicy,
    /// Kept so that configurations setting it still load: every acknowledged publish is
    /// answered after its write, with its offset, unless [`DurableConfig::ack_before_write`]
    /// says otherwise (`FELIX_ACK_ON_COMMIT`). Setting both is a configuration error.
    pub ack_on_commit: bool,
    /// Under `none` and `periodic`, answer an acknowledged publish on arrival, before its
    /// write reaches the page cache, and without an offset: a broker *process* crash can then
    /// lose acknowledged records (`FELIX_ACK_BEFORE_WRITE`, default `false`). A client that
    /// offered FEATURE_ACK_ON_COMMIT still gets its answers after the write. Refused with
    /// `on_commit`, whose acks always wait for the fsync.
    pub ack_before_write: bool,
    /// Delete a shard's oldest whole segments while its log is larger than this
    /// (`FELIX_DURABLE_RETENTION_BYTES`).
    pub retention_bytes: Option<u64>,
    /// Delete whole segments whose newest record is older than this
    /// (`FELIX_DURABLE_RETENTION_SECONDS`).
    pub retention_age: Option<Duration>,
    /// How often retention is checked, when a bound is set.
    pub retention_check_interval: Duration,
    /// See [`DEFAULT_SEGMENT_MAX_BYTES`].
    pub segment_max_bytes: u64,
    /// See [`DEFAULT_MAX_INFLIGHT_FILE_OPS`]. At least 1.
    pub max_inflight_file_ops: usize,
    /// See [`DEFAULT_TAIL_CACHE_BYTES`].
    pub tail_cache_bytes: usize,
    /// Consumer groups over the durable shards.
    pub groups: crate::GroupConfig,
}

impl Default for DurableConfig {
    fn default() -> Self {
        DurableConfig {
            fsync: FsyncPolicy::Periodic(DEFAULT_FSYNC_INTERVAL),
            ack_on_commit: false,
            ack_before_write: false,
            retention_bytes: None,
            retention_age: None,
            retention_check_interval: Duration::from_secs(60),
            segment_max_bytes: DEFAULT_SEGMENT_MAX_BYTES,
            max_inflight_file_ops: DEFAULT_MAX_INFLIGHT_FILE_OPS,
            tail_cache_bytes: DEFAULT_TAIL_CACHE_BYTES,
            groups: crate::GroupConfig::default(),
        }
    }
}

/// How stream tokens are verified.
#[derive(Clone)]
pub enum AuthConfig {
    /// A JWKS document (the bytes of the file; the runtime reads it).
    Jwks(Vec<u8>),
    /// Development mode: a signing key derived from this seed; the engine mints a
    /// full-permission token for tenant `t1`, readable through [`crate::Engine::dev_token`].
    Dev {
        /// Seed of the Ed25519 signing key.
        seed: [u8; 32],
    },
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthConfig::Jwks(doc) => write!(f, "Jwks({} bytes)", doc.len()),
            AuthConfig::Dev { .. } => f.write_str("Dev"),
        }
    }
}

/// A stream declared with a fixed shard count (others are created on first use).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeclaredStream {
    /// Tenant id.
    pub tenant: String,
    /// Namespace.
    pub namespace: String,
    /// Stream name.
    pub stream: String,
    /// Number of shards.
    pub shards: u32,
    /// In a cluster: how many nodes hold each shard (1..=5; 1 outside a cluster).
    pub replication_factor: u8,
    /// In a cluster: what an acknowledgement waits for.
    pub consistency: Consistency,
    /// The stream's own retention by size (`retention_max_bytes`); `None` keeps the
    /// broker-wide `durable.retention_bytes`.
    pub retention_max_bytes: Option<u64>,
    /// The stream's own retention by age (`retention_max_age_seconds`); `None` keeps the
    /// broker-wide `durable.retention_seconds`.
    pub retention_max_age_seconds: Option<u64>,
}

/// What a cluster stream's acknowledgement promises (docs/replication.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Consistency {
    /// The leader holds the record under its fsync mode.
    #[default]
    Leader,
    /// A majority of the replica set, leader included, holds it durably.
    Quorum,
}

/// A cache declared for a cluster, placed like a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeclaredCache {
    pub tenant: String,
    pub namespace: String,
    pub cache: String,
    /// Number of shards (default 1).
    pub shards: u32,
    /// How many nodes hold each shard (1..=5).
    pub replication_factor: u8,
}

impl DeclaredCache {
    pub fn new(
        tenant: impl Into<String>,
        namespace: impl Into<String>,
        cache: impl Into<String>,
        replication_factor: u8,
    ) -> DeclaredCache {
        DeclaredCache {
            tenant: tenant.into(),
            namespace: namespace.into(),
            cache: cache.into(),
            shards: 1,
            replication_factor,
        }
    }
}

/// One node of the cluster as this node reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAddr {
    /// Its `FELIX_NODE_ID`.
    pub node_id: String,
    /// Where this node dials it (possibly through a relay): `FELIX_CLUSTER_PEERS`.
    pub addr: SocketAddr,
}

/// Peer mTLS material: this node's identity, whose leaf certificate names its node id (as a
/// DNS subject alternative name), and the CA that signs every node's.
#[derive(Debug, Clone)]
pub struct PeerTls {
    pub identity: TlsIdentity,
    pub ca: Vec<CertificateDer<'static>>,
}

/// Forwarded requests owed an answer that may be in flight on one peer link at once; the
/// ones past it wait, in order, on this node until an answer frees a place.
pub const DEFAULT_FORWARD_WINDOW: usize = 1024;
/// How long a forwarded request may wait for the leader's answer, counted from when the
/// client's request was read, before the client is told the outcome is unknown
/// (`unacknowledged`). Below the real client's own 30 s ack timeout.
pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// Forward channels (one per client session forwarding here) a leader keeps open at once;
/// past it the longest idle one is closed, and its session's next forward reopens it.
pub const DEFAULT_MAX_FORWARD_CHANNELS: usize = 4096;
/// Bytes queued for a peer whose link is not up; past it messages are dropped (raft resends
/// what matters, and a dropped forward ends in its timeout).
pub const DEFAULT_MAX_PEER_BACKLOG_BYTES: usize = 8 << 20;
/// A peer link with nothing received for this long is lost and redialed (keep-alives go at
/// a third of it).
pub const DEFAULT_PEER_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bidirectional streams a peer may open on a link (the protocol uses one).
pub const DEFAULT_PEER_MAX_STREAMS: u32 = 16;
/// The shard leadership lease.
pub const DEFAULT_LEASE: Duration = Duration::from_millis(2000);
/// Bytes of metadata log after which a durable cluster node writes a snapshot of the
/// metadata and starts a fresh log after it (`limits.metadata_log_compact_bytes`, 1 MiB).
pub const DEFAULT_METADATA_LOG_COMPACT_BYTES: u64 = 1 << 20;
/// Lease renewals the control plane's leader holds while it confirms its leadership
/// (`limits.max_pending_lease_grants`); past it the oldest is dropped and its holder asks
/// again within a quarter lease.
pub const DEFAULT_MAX_PENDING_LEASE_GRANTS: usize =
    felix_cluster::control::DEFAULT_MAX_PENDING_GRANTS;

/// How long a quorum publish waits for a majority of its shard's replicas before it is
/// answered `quorum_timeout` (`replication.quorum_timeout_ms`).
pub const DEFAULT_QUORUM_TIMEOUT: Duration = Duration::from_millis(5000);
/// How long a `leader` shard's leader goes without a new record, every record durable on a
/// follower, before it has the cluster record that follower as level with it
/// (`replication.leader_quiet_after_ms`): from then on that follower may take the shard over
/// if the leader fails, and the first write after the quiet spell waits one metadata round
/// trip (docs/replication.md, "Who may lead a `leader` shard").
pub const DEFAULT_LEADER_QUIET_AFTER: Duration = Duration::from_millis(2000);
/// Bytes a leader ships to one follower ahead of its reports
/// (`replication.window_bytes`, 8 MiB).
pub const DEFAULT_REPLICATION_WINDOW_BYTES: u64 = 8 << 20;

/// A known replication bug put back on purpose, for the simulator's canaries: each must be
/// caught by an invariant (sim/tests/). Never set outside tests.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplicationCanary {
    #[default]
    None,
    /// A promoted leader opens at once, without fencing a majority or adopting the most
    /// advanced copy: a replica that is behind serves.
    PromoteBehind,
    /// A leader keeps writing after its lease lapsed.
    ServePastLease,
    /// The quorum mark counts what followers received, not what they made durable: a
    /// follower's ack comes before its write is durable.
    AckBeforeDurable,
    /// A `leader` shard whose leader went silent is handed to any live replica holding a
    /// copy, as before the spec's rule was kept: what only the leader held is lost.
    AbandonOnSilence,
}

/// This node's place in a cluster (docs/cluster.md). `None` in [`EngineConfig::cluster`] is a
/// single node, as before.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClusterConfig {
    /// `FELIX_NODE_ID`.
    pub node_id: String,
    /// Every node, this one included (3 or 5): `FELIX_CLUSTER_PEERS`.
    pub peers: Vec<PeerAddr>,
    /// What clients are told this node's address is: `FELIX_CLIENT_ADVERTISE_ADDR`.
    pub client_advertise_addr: Option<String>,
    /// `FELIX_LEASE_MS`.
    pub lease: Duration,
    /// `None` only with `FELIX_INTERNAL_ALLOW_UNAUTHENTICATED=true`: peers then use the
    /// client-facing certificate and do not verify each other.
    pub peer_tls: Option<PeerTls>,
    /// `[[caches]]`.
    pub declared_caches: Vec<DeclaredCache>,
    /// Replicas of a stream created on first use (`limits.default_replication_factor`).
    pub default_replication_factor: u8,
    /// Whether a request naming a stream the cluster has not placed places it
    /// (`cluster.place_streams_on_first_use`, default true). Without it only `[[streams]]`
    /// exist: such a request is refused `not_found`, and `stream_shards` answers 0.
    pub place_streams_on_first_use: bool,
    /// See [`DEFAULT_FORWARD_WINDOW`] (`limits.forward_window`). At least 1.
    pub forward_window: usize,
    /// See [`DEFAULT_FORWARD_TIMEOUT`] (`limits.forward_timeout_ms`). Above zero.
    pub forward_timeout: Duration,
    /// See [`DEFAULT_MAX_FORWARD_CHANNELS`] (`limits.max_forward_channels`). At least 1.
    pub max_forward_channels: usize,
    /// See [`DEFAULT_MAX_PEER_BACKLOG_BYTES`] (`limits.max_peer_backlog_bytes`).
    pub max_peer_backlog_bytes: usize,
    /// See [`DEFAULT_PEER_IDLE_TIMEOUT`] (`limits.peer_idle_timeout_ms`). Above zero.
    pub peer_idle_timeout: Duration,
    /// See [`DEFAULT_PEER_MAX_STREAMS`] (`limits.peer_max_streams`). At least 1.
    pub peer_max_streams: u32,
    /// See [`DEFAULT_METADATA_LOG_COMPACT_BYTES`]; used only with durable storage.
    pub metadata_log_compact_bytes: u64,
    /// See [`DEFAULT_MAX_PENDING_LEASE_GRANTS`]. At least 1.
    pub max_pending_lease_grants: usize,
    /// See [`DEFAULT_QUORUM_TIMEOUT`]. Above zero.
    pub quorum_timeout: Duration,
    /// See [`DEFAULT_REPLICATION_WINDOW_BYTES`]. Above zero.
    pub replication_window_bytes: u64,
    /// See [`DEFAULT_LEADER_QUIET_AFTER`]. Above zero.
    pub leader_quiet_after: Duration,
    #[doc(hidden)]
    pub canary: ReplicationCanary,
}

impl ClusterConfig {
    pub fn new(node_id: impl Into<String>, peers: Vec<PeerAddr>) -> ClusterConfig {
        ClusterConfig {
            node_id: node_id.into(),
            peers,
            client_advertise_addr: None,
            lease: DEFAULT_LEASE,
            peer_tls: None,
            declared_caches: Vec::new(),
            default_replication_factor: 1,
            place_streams_on_first_use: true,
            forward_window: DEFAULT_FORWARD_WINDOW,
            forward_timeout: DEFAULT_FORWARD_TIMEOUT,
            max_forward_channels: DEFAULT_MAX_FORWARD_CHANNELS,
            max_peer_backlog_bytes: DEFAULT_MAX_PEER_BACKLOG_BYTES,
            peer_idle_timeout: DEFAULT_PEER_IDLE_TIMEOUT,
            peer_max_streams: DEFAULT_PEER_MAX_STREAMS,
            metadata_log_compact_bytes: DEFAULT_METADATA_LOG_COMPACT_BYTES,
            max_pending_lease_grants: DEFAULT_MAX_PENDING_LEASE_GRANTS,
            quorum_timeout: DEFAULT_QUORUM_TIMEOUT,
            replication_window_bytes: DEFAULT_REPLICATION_WINDOW_BYTES,
            leader_quiet_after: DEFAULT_LEADER_QUIET_AFTER,
            canary: ReplicationCanary::None,
        }
    }
}

impl DeclaredStream {
    /// A stream `tenant/namespace/stream` with `shards` shards.
    pub fn new(
        tenant: impl Into<String>,
        namespace: impl Into<String>,
        stream: impl Into<String>,
        shards: u32,
    ) -> DeclaredStream {
        DeclaredStream {
            tenant: tenant.into(),
            namespace: namespace.into(),
            stream: stream.into(),
            shards,
            replication_factor: 1,
            consistency: Consistency::Leader,
            retention_max_bytes: None,
            retention_max_age_seconds: None,
        }
    }
}

/// Everything the engine needs. Build one with [`EngineConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The certificate and key the endpoint presents (replace it on a running engine with
    /// [`crate::Engine::set_tls_identity`]).
    pub tls: TlsIdentity,
    /// CA certificates (DER) a client certificate must chain to. `None` (the default) asks
    /// clients for no certificate; with CAs set, a client without a valid one fails the
    /// handshake. Tokens are checked on every stream either way.
    pub client_ca: Option<Vec<CertificateDer<'static>>>,
    /// Refuse a client that offers no ALPN (the real client offers none unless asked to).
    /// Default `false`; with it, only clients offering `felix/1` complete the handshake.
    pub require_alpn: bool,
    /// How tokens are verified.
    pub auth: AuthConfig,
    /// Seeds every random choice the engine and quinn-proto make (connection ids, reset and
    /// token keys, packet-number skipping). TLS key material comes from rustls's provider.
    pub rng_seed: [u8; 32],
    /// The rustls crypto provider for the endpoint's TLS; `None` is ring's default. A
    /// simulator installs a seeded one so key shares and randoms repeat with the seed.
    pub crypto_provider: Option<Arc<rustls::crypto::CryptoProvider>>,

    /// See [`DEFAULT_PUBLISH_WINDOW`]. `0` withdraws the pipeline features.
    pub publish_window: u32,
    /// See [`DEFAULT_AUTH_TIMEOUT`].
    pub auth_timeout: Duration,
    /// See [`DEFAULT_IDLE_CONNECTION_REAP`].
    pub idle_connection_reap: Duration,
    /// See [`DEFAULT_MAX_CONCURRENT_BIDI_STREAMS`].
    pub max_concurrent_bidi_streams: u32,
    /// See [`DEFAULT_PREAUTH_MAX_STREAMS_PER_CONNECTION`].
    pub preauth_max_streams_per_connection: usize,
    /// See [`DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION`].
    pub max_subscriptions_per_connection: usize,
    /// See [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// See [`DEFAULT_MAX_CONNECTIONS_PER_IP`].
    pub max_connections_per_ip: usize,
    /// See [`DEFAULT_PREAUTH_MAX_FRAME_BYTES`].
    pub preauth_max_frame_bytes: u32,
    /// See [`DEFAULT_MAX_FRAME_BYTES`].
    pub max_frame_bytes: u32,
    /// See [`DEFAULT_MAX_CONNECTION_BUFFERED_BYTES`].
    pub max_connection_buffered_bytes: usize,
    /// See [`DEFAULT_MAX_BUFFERED_BYTES`].
    pub max_buffered_bytes: usize,
    /// See [`DEFAULT_MAX_CONNECTION_UNWRITTEN_BYTES`].
    pub max_connection_unwritten_bytes: usize,
    /// See [`DEFAULT_STREAM_RECEIVE_WINDOW`].
    pub stream_receive_window: u32,
    /// See [`DEFAULT_CONNECTION_RECEIVE_WINDOW`].
    pub connection_receive_window: u32,
    /// See [`DEFAULT_SEND_WINDOW`].
    pub send_window: u64,
    /// See [`DEFAULT_QUIC_IDLE_TIMEOUT`].
    pub quic_idle_timeout: Duration,
    /// See [`DEFAULT_READ_CHUNK_BYTES`].
    pub read_chunk_bytes: usize,
    /// See [`DEFAULT_MAX_GSO_SEGMENTS`]. At least 1.
    pub max_gso_segments: usize,
    /// See [`DEFAULT_MAX_QUEUED_ENDPOINT_TRANSMITS`].
    pub max_queued_endpoint_transmits: usize,
    /// See [`DEFAULT_MTU_UPPER_BOUND`]. [`MIN_MTU`] to [`MAX_MTU`].
    pub mtu_upper_bound: u16,
    /// See [`DEFAULT_INITIAL_MTU`]. [`MIN_MTU`] to `mtu_upper_bound`.
    pub initial_mtu: u16,
    /// See [`DEFAULT_MAX_UDP_PAYLOAD_SIZE`]. [`MIN_MTU`] to [`MAX_MTU`].
    pub max_udp_payload_size: u16,
    /// See [`DEFAULT_ACK_ELICITING_THRESHOLD`].
    pub ack_eliciting_threshold: u32,
    /// See [`DEFAULT_MAX_ACK_DELAY`]; used when `ack_eliciting_threshold` is not 1.
    pub max_ack_delay: Duration,

    /// See [`DEFAULT_SHARDS`].
    pub default_shards: u32,
    /// Streams with a fixed shard count.
    pub declared_streams: Vec<DeclaredStream>,
    /// How a routing key picks a shard.
    pub routing_mapping: RoutingMapping,
    /// See [`DEFAULT_MAX_STREAMS`].
    pub max_streams: usize,
    /// See [`DEFAULT_SUBSCRIBER_QUEUE_CAPACITY`].
    pub subscriber_queue_capacity: usize,
    /// See [`DEFAULT_SUBSCRIBER_QUEUE_CAPACITY_MAX`].
    pub subscriber_queue_capacity_max: usize,
    /// See [`DEFAULT_EVENT_BATCH_MAX_RECORDS`].
    pub event_batch_max_records: usize,
    /// See [`DEFAULT_EVENT_BATCH_MAX_BYTES`].
    pub event_batch_max_bytes: usize,
    /// See [`DEFAULT_MAX_CONNECTION_EVENT_BYTES`].
    pub max_connection_event_bytes: usize,
    /// See [`DEFAULT_STATE_MAX_BYTES_PER_SHARD`].
    pub state_max_bytes_per_shard: usize,
    /// See [`DEFAULT_CACHE_MAX_KEY_BYTES`].
    pub cache_max_key_bytes: usize,
    /// See [`DEFAULT_CACHE_MAX_VALUE_BYTES`].
    pub cache_max_value_bytes: usize,
    /// See [`DEFAULT_CACHE_MAX_TOTAL_BYTES`].
    pub cache_max_total_bytes: usize,
    /// See [`DEFAULT_CACHE_WATCH_QUEUE_CAPACITY`].
    pub cache_watch_queue_capacity: usize,
    /// See [`DEFAULT_DURABLE_CACHE_MAX_LOGS`].
    pub durable_cache_max_logs: usize,
    /// See [`DEFAULT_COUNTER_MAX_LOGS`].
    pub counter_max_logs: usize,
    /// See [`DEFAULT_DURABLE_CACHE_MAX_KEYS`].
    pub durable_cache_max_keys: usize,
    /// See [`DEFAULT_MAX_PRODUCERS_PER_TENANT`]. Above zero.
    pub max_producers_per_tenant: usize,
    /// See [`DEFAULT_DURABLE_CACHE_MAX_TOTAL_BYTES`].
    pub durable_cache_max_total_bytes: u64,

    /// Durable streams and caches; `None` keeps everything in memory.
    pub durable: Option<DurableConfig>,

    /// This node's cluster; `None` is a single node.
    pub cluster: Option<ClusterConfig>,
}

impl EngineConfig {
    /// A configuration with every limit at its default.
    pub fn new(tls: TlsIdentity, auth: AuthConfig, rng_seed: [u8; 32]) -> EngineConfig {
        EngineConfig {
            tls,
            client_ca: None,
            require_alpn: false,
            auth,
            rng_seed,
            crypto_provider: None,
            publish_window: DEFAULT_PUBLISH_WINDOW,
            auth_timeout: DEFAULT_AUTH_TIMEOUT,
            idle_connection_reap: DEFAULT_IDLE_CONNECTION_REAP,
            max_concurrent_bidi_streams: DEFAULT_MAX_CONCURRENT_BIDI_STREAMS,
            preauth_max_streams_per_connection: DEFAULT_PREAUTH_MAX_STREAMS_PER_CONNECTION,
            max_subscriptions_per_connection: DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
            preauth_max_frame_bytes: DEFAULT_PREAUTH_MAX_FRAME_BYTES,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_connection_buffered_bytes: DEFAULT_MAX_CONNECTION_BUFFERED_BYTES,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            max_connection_unwritten_bytes: DEFAULT_MAX_CONNECTION_UNWRITTEN_BYTES,
            stream_receive_window: DEFAULT_STREAM_RECEIVE_WINDOW,
            connection_receive_window: DEFAULT_CONNECTION_RECEIVE_WINDOW,
            send_window: DEFAULT_SEND_WINDOW,
            quic_idle_timeout: DEFAULT_QUIC_IDLE_TIMEOUT,
            read_chunk_bytes: DEFAULT_READ_CHUNK_BYTES,
            max_gso_segments: DEFAULT_MAX_GSO_SEGMENTS,
            max_queued_endpoint_transmits: DEFAULT_MAX_QUEUED_ENDPOINT_TRANSMITS,
            mtu_upper_bound: DEFAULT_MTU_UPPER_BOUND,
            initial_mtu: DEFAULT_INITIAL_MTU,
            max_udp_payload_size: DEFAULT_MAX_UDP_PAYLOAD_SIZE,
            ack_eliciting_threshold: DEFAULT_ACK_ELICITING_THRESHOLD,
            max_ack_delay: DEFAULT_MAX_ACK_DELAY,
            default_shards: DEFAULT_SHARDS,
            declared_streams: Vec::new(),
            routing_mapping: RoutingMapping::Modulo,
            max_streams: DEFAULT_MAX_STREAMS,
            subscriber_queue_capacity: DEFAULT_SUBSCRIBER_QUEUE_CAPACITY,
            subscriber_queue_capacity_max: DEFAULT_SUBSCRIBER_QUEUE_CAPACITY_MAX,
            event_batch_max_records: DEFAULT_EVENT_BATCH_MAX_RECORDS,
            event_batch_max_bytes: DEFAULT_EVENT_BATCH_MAX_BYTES,
            max_connection_event_bytes: DEFAULT_MAX_CONNECTION_EVENT_BYTES,
            state_max_bytes_per_shard: DEFAULT_STATE_MAX_BYTES_PER_SHARD,
            cache_max_key_bytes: DEFAULT_CACHE_MAX_KEY_BYTES,
            cache_max_value_bytes: DEFAULT_CACHE_MAX_VALUE_BYTES,
            cache_max_total_bytes: DEFAULT_CACHE_MAX_TOTAL_BYTES,
            cache_watch_queue_capacity: DEFAULT_CACHE_WATCH_QUEUE_CAPACITY,
            durable_cache_max_logs: DEFAULT_DURABLE_CACHE_MAX_LOGS,
            counter_max_logs: DEFAULT_COUNTER_MAX_LOGS,
            durable_cache_max_keys: DEFAULT_DURABLE_CACHE_MAX_KEYS,
            durable_cache_max_total_bytes: DEFAULT_DURABLE_CACHE_MAX_TOTAL_BYTES,
            max_producers_per_tenant: DEFAULT_MAX_PRODUCERS_PER_TENANT,
            durable: None,
            cluster: None,
        }
    }
}
