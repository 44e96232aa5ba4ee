//! The broker's configuration: one TOML file for every setting, `FELIX_*` environment
//! variables overriding it, defaults for the rest — read and validated in one place.
//!
//! The file is named by `felix-broker --config PATH`, or `FELIX_CONFIG` (`FELIX_BROKER_CONFIG`,
//! the reference's name, also works). Every setting is declared once in [`SETTINGS`]: its key
//! in the file (`section.name`), its environment variables (the first is ours, the others are
//! the reference broker's names where they differ), its kind and its default. Unknown keys in
//! the file are refused with their name; a value of the wrong kind or out of range is refused
//! naming the key (or the variable) and why. [`Config::effective`] keeps each value with its
//! source, which `felix-broker --print-config` prints as TOML. `docs/operations.md` is the
//! reference, with an example file.
//!
//! Unknown `FELIX_*` variables are ignored, so one environment can serve several versions;
//! the file is stricter, because a typo there is only ever a mistake.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use felix_engine::{
    ClusterConfig, Consistency, DeclaredCache, DeclaredStream, EngineConfig, FsyncPolicy, PeerAddr,
    PeerTls,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use toml::Value;

use crate::files::{CACHE_BEHIND_VAR, DEFAULT_CACHE_BEHIND_BYTES, DIRECT_IO_VAR};
use crate::BrokerOptions;

mod groups;

/// The listen address when none is configured.
pub const DEFAULT_QUIC_BIND: &str = "127.0.0.1:5000";
/// The metrics and health endpoint when none is configured (`off` disables it).
pub const DEFAULT_METRICS_BIND: &str = "127.0.0.1:8080";
/// How often rotated certificate and JWKS files are looked for, by default.
pub const DEFAULT_RELOAD_INTERVAL_MS: u64 = 1000;
/// The shortest `reload_interval_ms` accepted (other than 0, which turns watching off):
/// each look is a `stat` of every watched file, and a rotation needs no faster notice.
pub const MIN_RELOAD_INTERVAL_MS: u64 = 100;
/// `durable.fsync_mode` unless configured.
const DEFAULT_FSYNC_MODE: &str = "periodic";
/// `durable.fsync_interval_ms` unless configured: the engine's default.
const DEFAULT_FSYNC_INTERVAL_MS: u64 = felix_engine::DEFAULT_FSYNC_INTERVAL.as_millis() as u64;
/// The highest `limits.ack_eliciting_threshold`: beyond a few hundred packets the ACK delay
/// alone decides, and a peer holds that many packets' ranges meanwhile.
const MAX_ACK_ELICITING_THRESHOLD: u64 = 1000;
/// The highest `limits.max_ack_delay_ms`: QUIC's limit for an ACK delay (2^14 ms).
const MAX_ACK_DELAY_MS: u64 = 16_383;
/// Variables naming the configuration file, first match wins.
pub const CONFIG_FILE_VARS: &[&str] = &["FELIX_CONFIG", "FELIX_BROKER_CONFIG"];

/// A configuration the binary can run.
#[non_exhaustive]
pub struct Config {
    /// What to start.
    pub options: BrokerOptions,
    /// Write the CA PEM here once listening (`tls.cert_export`).
    pub tls_cert_export: Option<PathBuf>,
    /// Write the dev token here once listening (`auth.dev_token_export`).
    pub dev_token_export: Option<PathBuf>,
    /// The runtime named by the file or `FELIX_RUNTIME` (a `--runtime` flag beats it).
    pub runtime: Option<String>,
    /// Files re-read when they change, and how often to look.
    pub reload: Reload,
    /// Every setting's value and where it came from.
    pub effective: Effective,
    /// The broker-to-broker QUIC listener (`cluster.internal_bind`); `Some` exactly when
    /// `cluster.node_id` is set, and then `options.configure_engine` sets the engine's
    /// `cluster`.
    pub internal_bind: Option<SocketAddr>,
}

/// What is watched for rotation (see `crate::reload`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reload {
    /// `tls.cert` and `tls.key`.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `auth.jwks_file`.
    pub jwks: Option<PathBuf>,
    /// How often to look; `None` watches nothing.
    pub interval: Option<Duration>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("options", &self.options)
            .field("tls_cert_export", &self.tls_cert_export)
            .field("dev_token_export", &self.dev_token_export)
            .field("runtime", &self.runtime)
            .field("reload", &self.reload)
            .field("internal_bind", &self.internal_bind)
            .finish_non_exhaustive()
    }
}

/// A setting that could not be used; the message names it and says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    File(PathBuf),
    Env(&'static str),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Env(name) => write!(f, "env {name}"),
        }
    }
}

/// What values a setting takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An unsigned integer.
    Int,
    Bool,
    Text,
    /// An unsigned integer or the string `off`.
    IntOrOff,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Int => "an unsigned integer",
            Kind::Bool => "true or false",
            Kind::Text => "a string",
            Kind::IntOrOff => "an unsigned integer or \"off\"",
        }
    }
}

type Setter = fn(&mut EngineConfig, u64) -> Result<(), String>;
type Getter = fn(&EngineConfig) -> u64;

/// A setting's default.
#[derive(Clone, Copy)]
enum Default_ {
    /// Unset unless configured.
    Unset,
    Int(u64),
    Bool(bool),
    Text(&'static str),
    /// An engine limit: its `EngineConfig` default.
    Engine(Getter),
}

/// One setting.
#[derive(Clone, Copy)]
pub struct Setting {
    /// Its key in the file: `name` at the top, or `section.name`.
    pub key: &'static str,
    /// Variables that override it, first match wins.
    pub env: &'static [&'static str],
    kind: Kind,
    default: Default_,
    /// For engine limits: how the value reaches [`EngineConfig`].
    engine: Option<Setter>,
}

fn to<T: TryFrom<u64>>(v: u64) -> Result<T, String> {
    T::try_from(v).map_err(|_| format!("{v} is out of range"))
}

fn ms(v: u64) -> Result<Duration, String> {
    Ok(Duration::from_millis(v))
}

const fn plain(
    key: &'static str,
    env: &'static [&'static str],
    kind: Kind,
    default: Default_,
) -> Setting {
    Setting {
        key,
        env,
        kind,
        default,
        engine: None,
    }
}

/// An engine limit: an integer field, or a duration in milliseconds.
macro_rules! limit {
    ($key:literal, $env:expr, int $field:ident) => {
        Setting {
            key: $key,
            env: $env,
            kind: Kind::Int,
            default: Default_::Engine(|c: &EngineConfig| c.$field as u64),
            engine: Some(|c: &mut EngineConfig, v: u64| {
                c.$field = to(v)?;
                Ok(())
            }),
        }
    };
    ($key:literal, $env:expr, int $field:ident in $lo:literal..=$hi:expr) => {
        Setting {
            key: $key,
            env: $env,
            kind: Kind::Int,
            default: Default_::Engine(|c: &EngineConfig| c.$field as u64),
            engine: Some(|c: &mut EngineConfig, v: u64| {
                if !($lo..=$hi as u64).contains(&v) {
                    return Err(format!("must be {} to {}, not {v}", $lo, $hi));
                }
                c.$field = to(v)?;
                Ok(())
            }),
        }
    };
    ($key:literal, $env:expr, ms $field:ident in $lo:literal..=$hi:expr) => {
        Setting {
            key: $key,
            env: $env,
            kind: Kind::Int,
            default: Default_::Engine(|c: &EngineConfig| c.$field.as_millis() as u64),
            engine: Some(|c: &mut EngineConfig, v: u64| {
                if !($lo..=$hi as u64).contains(&v) {
                    return Err(format!("must be {} to {} ms, not {v}", $lo, $hi));
                }
                c.$field = ms(v)?;
                Ok(())
            }),
        }
    };
    ($key:literal, $env:expr, ms $field:ident) => {
        Setting {
            key: $key,
            env: $env,
            kind: Kind::Int,
            default: Default_::Engine(|c: &EngineConfig| c.$field.as_millis() as u64),
            engine: Some(|c: &mut EngineConfig, v: u64| {
                c.$field = ms(v)?;
                Ok(())
            }),
        }
    };
}

/// Every setting, in the order `--print-config` shows them (top-level keys first, as TOML
/// requires). Sections: `tls`, `auth`, `durable`, `groups`, `limits`, `cluster`; `[[streams]]`
/// declares streams, `[[caches]]` caches (cluster only).
#[rustfmt::skip]
pub const SETTINGS: &[Setting] = &[
    plain("quic_bind", &["FELIX_QUIC_BIND"], Kind::Text, Default_::Text(DEFAULT_QUIC_BIND)),
    plain("metrics_bind", &["FELIX_METRICS_BIND", "FELIX_BROKER_METRICS_BIND"], Kind::Text, Default_::Text(DEFAULT_METRICS_BIND)),
    plain("runtime", &["FELIX_RUNTIME"], Kind::Text, Default_::Unset),
    plain("reload_interval_ms", &["FELIX_RELOAD_INTERVAL_MS"], Kind::Int, Default_::Int(DEFAULT_RELOAD_INTERVAL_MS)),
    plain("tls.cert", &["FELIX_TLS_CERT"], Kind::Text, Default_::Unset),
    plain("tls.key", &["FELIX_TLS_KEY"], Kind::Text, Default_::Unset),
    plain("tls.client_ca", &["FELIX_TLS_CLIENT_CA"], Kind::Text, Default_::Unset),
    plain("tls.require_alpn", &["FELIX_TLS_REQUIRE_ALPN"], Kind::Bool, Default_::Bool(false)),
    plain("tls.cert_export", &["FELIX_TLS_CERT_EXPORT"], Kind::Text, Default_::Unset),
    plain("auth.jwks_file", &["FELIX_AUTH_JWKS_FILE"], Kind::Text, Default_::Unset),
    plain("auth.dev_token_export", &["FELIX_DEV_TOKEN_EXPORT"], Kind::Text, Default_::Unset),
    plain("durable.storage_dir", &["FELIX_DURABLE_STORAGE_DIR"], Kind::Text, Default_::Unset),
    plain("durable.fsync_mode", &["FELIX_DURABLE_FSYNC_MODE"], Kind::Text, Default_::Text(DEFAULT_FSYNC_MODE)),
    plain("durable.fsync_interval_ms", &["FELIX_DURABLE_FSYNC_INTERVAL_MS"], Kind::Int, Default_::Int(DEFAULT_FSYNC_INTERVAL_MS)),
    plain("durable.ack_on_commit", &["FELIX_ACK_ON_COMMIT"], Kind::Bool, Default_::Bool(false)),
    plain("durable.ack_before_write", &["FELIX_ACK_BEFORE_WRITE"], Kind::Bool, Default_::Bool(false)),
    plain("durable.retention_bytes", &["FELIX_DURABLE_RETENTION_BYTES"], Kind::Int, Default_::Unset),
    plain("durable.retention_seconds", &["FELIX_DURABLE_RETENTION_SECONDS"], Kind::Int, Default_::Unset),
    plain("durable.retention_check_interval_ms", &["FELIX_DURABLE_RETENTION_CHECK_INTERVAL_MS"], Kind::Int, Default_::Int(DEFAULT_RETENTION_CHECK_INTERVAL_MS)),
    plain("durable.segment_max_bytes", &["FELIX_DURABLE_SEGMENT_MAX_BYTES", "FELIX_DURABLE_SEGMENT_BYTES"], Kind::Int, Default_::Int(felix_engine::DEFAULT_SEGMENT_MAX_BYTES)),
    plain("durable.cache_behind_bytes", &[CACHE_BEHIND_VAR], Kind::IntOrOff, Default_::Int(DEFAULT_CACHE_BEHIND_BYTES)),
    plain("durable.direct_io", &[DIRECT_IO_VAR], Kind::Bool, Default_::Bool(true)),
    plain("groups.max_attempts", &["FELIX_GROUP_MAX_ATTEMPTS"], Kind::Int, Default_::Int(5)),
    plain("groups.visibility_timeout_ms", &["FELIX_GROUP_VISIBILITY_TIMEOUT_MS"], Kind::Int, Default_::Int(30_000)),
    plain("groups.max_visibility_ms", &["FELIX_GROUP_MAX_VISIBILITY_MS"], Kind::Int, Default_::Int(12 * 3600 * 1000)),
    plain("groups.max_wait_ms", &["FELIX_GROUP_MAX_WAIT_MS"], Kind::Int, Default_::Int(30_000)),
    plain("groups.max_in_flight", &["FELIX_GROUP_MAX_IN_FLIGHT"], Kind::Int, Default_::Int(10_000)),
    plain("groups.max_waiting_polls", &["FELIX_GROUP_MAX_WAITING_POLLS"], Kind::Int, Default_::Int(felix_engine::DEFAULT_GROUP_MAX_WAITING_POLLS as u64)),
    limit!("limits.publish_window", &["FELIX_PUBLISH_WINDOW", "FELIX_BROKER_PUBLISH_WINDOW"], int publish_window),
    limit!("limits.auth_timeout_ms", &["FELIX_AUTH_TIMEOUT_MS"], ms auth_timeout),
    limit!("limits.idle_connection_reap_ms", &["FELIX_IDLE_CONNECTION_REAP_MS"], ms idle_connection_reap),
    limit!("limits.quic_idle_timeout_ms", &["FELIX_QUIC_IDLE_TIMEOUT_MS"], ms quic_idle_timeout),
    limit!("limits.max_connections", &["FELIX_MAX_CLIENT_CONNECTIONS"], int max_connections),
    limit!("limits.max_connections_per_ip", &["FELIX_MAX_CONNECTIONS_PER_IP"], int max_connections_per_ip),
    limit!("limits.max_concurrent_bidi_streams", &["FELIX_MAX_CONCURRENT_BIDI_STREAMS"], int max_concurrent_bidi_streams),
    limit!("limits.preauth_max_streams_per_connection", &["FELIX_PREAUTH_MAX_STREAMS_PER_CONN"], int preauth_max_streams_per_connection),
    limit!("limits.max_subscriptions_per_connection", &["FELIX_MAX_SUBSCRIPTIONS_PER_CONNECTION"], int max_subscriptions_per_connection),
    limit!("limits.max_frame_bytes", &["FELIX_MAX_FRAME_BYTES"], int max_frame_bytes),
    limit!("limits.preauth_max_frame_bytes", &["FELIX_PREAUTH_MAX_FRAME_BYTES"], int preauth_max_frame_bytes),
    limit!("limits.max_connection_buffered_bytes", &["FELIX_MAX_CONNECTION_BUFFERED_BYTES"], int max_connection_buffered_bytes),
    limit!("limits.max_buffered_bytes", &["FELIX_MAX_BUFFERED_BYTES"], int max_buffered_bytes),
    limit!("limits.max_connection_unwritten_bytes", &["FELIX_MAX_CONNECTION_UNWRITTEN_BYTES"], int max_connection_unwritten_bytes),
    limit!("limits.max_connection_event_bytes", &["FELIX_MAX_CONNECTION_EVENT_BYTES"], int max_connection_event_bytes),
    limit!("limits.state_max_bytes_per_shard", &["FELIX_STATE_MAX_BYTES_PER_SHARD"], int state_max_bytes_per_shard),
    limit!("limits.stream_receive_window", &["FELIX_STREAM_RECV_WINDOW"], int stream_receive_window),
    limit!("limits.connection_receive_window", &["FELIX_CONN_RECV_WINDOW"], int connection_receive_window),
    limit!("limits.send_window", &["FELIX_SEND_WINDOW"], int send_window),
    limit!("limits.mtu_upper_bound", &["FELIX_MTU_UPPER_BOUND"], int mtu_upper_bound in 1200..=felix_engine::MAX_MTU),
    limit!("limits.initial_mtu", &["FELIX_INITIAL_MTU"], int initial_mtu in 1200..=felix_engine::MAX_MTU),
    limit!("limits.max_udp_payload_size", &["FELIX_MAX_UDP_PAYLOAD"], int max_udp_payload_size in 1200..=felix_engine::MAX_MTU),
    limit!("limits.ack_eliciting_threshold", &["FELIX_ACK_ELICITING_THRESHOLD"], int ack_eliciting_threshold in 0..=MAX_ACK_ELICITING_THRESHOLD),
    limit!("limits.max_ack_delay_ms", &["FELIX_MAX_ACK_DELAY_MS"], ms max_ack_delay in 1..=MAX_ACK_DELAY_MS),
    limit!("limits.default_shards", &["FELIX_DEFAULT_SHARDS"], int default_shards),
    limit!("limits.max_streams", &["FELIX_MAX_STREAMS"], int max_streams),
    limit!("limits.subscriber_queue_capacity", &["FELIX_SUBSCRIBER_QUEUE_CAPACITY"], int subscriber_queue_capacity),
    limit!("limits.subscriber_queue_capacity_max", &["FELIX_SUBSCRIBER_QUEUE_CAPACITY_MAX"], int subscriber_queue_capacity_max),
    limit!("limits.event_batch_max_records", &["FELIX_EVENT_BATCH_MAX_RECORDS", "FELIX_EVENT_BATCH_MAX_EVENTS"], int event_batch_max_records),
    limit!("limits.event_batch_max_bytes", &["FELIX_EVENT_BATCH_MAX_BYTES"], int event_batch_max_bytes),
    limit!("limits.cache_max_key_bytes", &["FELIX_CACHE_MAX_KEY_BYTES"], int cache_max_key_bytes),
    limit!("limits.cache_max_value_bytes", &["FELIX_CACHE_MAX_VALUE_BYTES"], int cache_max_value_bytes),
    limit!("limits.cache_max_total_bytes", &["FELIX_CACHE_MAX_TOTAL_BYTES"], int cache_max_total_bytes),
    limit!("limits.cache_watch_queue_capacity", &["FELIX_CACHE_WATCH_QUEUE_CAPACITY"], int cache_watch_queue_capacity),
    limit!("limits.durable_cache_max_logs", &["FELIX_DURABLE_CACHE_MAX_LOGS"], int durable_cache_max_logs),
    limit!("limits.counter_max_logs", &["FELIX_COUNTER_MAX_LOGS"], int counter_max_logs),
    limit!("limits.durable_cache_max_keys", &["FELIX_DURABLE_CACHE_MAX_KEYS"], int durable_cache_max_keys),
    limit!("limits.durable_cache_max_total_bytes", &["FELIX_DURABLE_CACHE_MAX_TOTAL_BYTES"], int durable_cache_max_total_bytes),
    limit!("limits.max_producers_per_tenant", &["FELIX_MAX_PRODUCERS_PER_TENANT"], int max_producers_per_tenant),
    plain("limits.busy_poll_us", &["FELIX_BUSY_POLL_US"], Kind::Int, Default_::Int(crate::DEFAULT_BUSY_POLL.as_micros() as u64)),
    // Cluster (docs/cluster.md). Every setting from here on needs `cluster.node_id`; the
    // cluster limits stay in `[limits]` (they must follow the other limits for `--print-config`).
    plain("limits.default_replication_factor", &["FELIX_DEFAULT_REPLICATION_FACTOR"], Kind::Int, Default_::Int(DEFAULT_REPLICATION_FACTOR as u64)),
    plain("limits.forward_window", &["FELIX_FORWARD_WINDOW"], Kind::Int, Default_::Int(felix_engine::DEFAULT_FORWARD_WINDOW as u64)),
    plain("limits.forward_timeout_ms", &["FELIX_FORWARD_TIMEOUT_MS"], Kind::Int, Default_::Int(felix_engine::DEFAULT_FORWARD_TIMEOUT.as_millis() as u64)),
    plain("limits.max_forward_channels", &["FELIX_MAX_FORWARD_CHANNELS"], Kind::Int, Default_::Int(felix_engine::DEFAULT_MAX_FORWARD_CHANNELS as u64)),
    plain("limits.max_peer_backlog_bytes", &["FELIX_MAX_PEER_BACKLOG_BYTES"], Kind::Int, Default_::Int(felix_engine::DEFAULT_MAX_PEER_BACKLOG_BYTES as u64)),
    plain("limits.peer_idle_timeout_ms", &["FELIX_PEER_IDLE_TIMEOUT_MS"], Kind::Int, Default_::Int(felix_engine::DEFAULT_PEER_IDLE_TIMEOUT.as_millis() as u64)),
    plain("limits.peer_max_streams", &["FELIX_PEER_MAX_STREAMS"], Kind::Int, Default_::Int(felix_engine::DEFAULT_PEER_MAX_STREAMS as u64)),
    plain("limits.metadata_log_compact_bytes", &["FELIX_METADATA_LOG_COMPACT_BYTES"], Kind::Int, Default_::Int(felix_engine::DEFAULT_METADATA_LOG_COMPACT_BYTES)),
    plain("limits.max_pending_lease_grants", &["FELIX_MAX_PENDING_LEASE_GRANTS"], Kind::Int, Default_::Int(felix_engine::DEFAULT_MAX_PENDING_LEASE_GRANTS as u64)),
    plain("cluster.node_id", &["FELIX_NODE_ID"], Kind::Text, Default_::Unset),
    plain("cluster.internal_bind", &["FELIX_INTERNAL_BIND"], Kind::Text, Default_::Unset),
    plain("cluster.peers", &["FELIX_CLUSTER_PEERS"], Kind::Text, Default_::Unset),
    plain("cluster.client_advertise_addr", &["FELIX_CLIENT_ADVERTISE_ADDR"], Kind::Text, Default_::Unset),
    plain("cluster.lease_ms", &["FELIX_LEASE_MS"], Kind::Int, Default_::Int(felix_engine::DEFAULT_LEASE.as_millis() as u64)),
    plain("cluster.place_streams_on_first_use", &["FELIX_PLACE_STREAMS_ON_FIRST_USE"], Kind::Bool, Default_::Bool(true)),
    plain("cluster.internal_tls_cert", &["FELIX_INTERNAL_TLS_CERT"], Kind::Text, Default_::Unset),
    plain("cluster.internal_tls_key", &["FELIX_INTERNAL_TLS_KEY"], Kind::Text, Default_::Unset),
    plain("cluster.internal_tls_ca", &["FELIX_INTERNAL_TLS_CA"], Kind::Text, Default_::Unset),
    plain("cluster.internal_allow_unauthenticated", &["FELIX_INTERNAL_ALLOW_UNAUTHENTICATED"], Kind::Bool, Default_::Bool(false)),
    // Replicated shards (docs/replication.md).
    plain("replication.quorum_timeout_ms", &["FELIX_QUORUM_TIMEOUT_MS"], Kind::Int, Default_::Int(felix_engine::DEFAULT_QUORUM_TIMEOUT.as_millis() as u64)),
    plain("replication.window_bytes", &["FELIX_REPLICATION_WINDOW_BYTES"], Kind::Int, Default_::Int(felix_engine::DEFAULT_REPLICATION_WINDOW_BYTES)),
    plain("replication.leader_quiet_after_ms", &["FELIX_LEADER_QUIET_AFTER_MS"], Kind::Int, Default_::Int(felix_engine::DEFAULT_LEADER_QUIET_AFTER.as_millis() as u64)),
];

/// Sections of the file; every other table is refused.
const SECTIONS: &[&str] = &[
    "tls",
    "auth",
    "durable",
    "groups",
    "limits",
    "cluster",
    "replication",
];
/// Keys of a `[[caches]]` entry.
const CACHE_KEYS: &[&str] = &[
    "tenant",
    "namespace",
    "cache",
    "shards",
    "replication_factor",
];
/// `limits.default_replication_factor` unless configured: one copy, as a single node has.
const DEFAULT_REPLICATION_FACTOR: u8 = 1;
/// The most replicas a shard can have: every node of the largest cluster (5 voters).
pub const MAX_REPLICATION_FACTOR: u8 = 5;
/// The longest node id (felix-cluster's `MAX_NODE_ID_LEN`: it fits every length-prefixed
/// field that carries one).
pub const MAX_NODE_ID_LEN: usize = 64;
/// How often retention bounds are checked (`durable.retention_check_interval_ms`): felix-storage's
/// `DEFAULT_RETENTION_CHECK_INTERVAL`.
const DEFAULT_RETENTION_CHECK_INTERVAL_MS: u64 = 60_000;
/// Keys of a `[[streams]]` entry.
const STREAM_KEYS: &[&str] = &[
    "tenant",
    "namespace",
    "stream",
    "shards",
    "replication_factor",
    "consistency",
    "retention_max_bytes",
    "retention_max_age_seconds",
];

/// Every setting's value (or `None`: unset) and its source, and the declared streams.
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    values: Vec<(Setting, Option<Value>, Source)>,
    streams: Vec<(DeclaredStream, Source)>,
    caches: Vec<(DeclaredCache, Source)>,
}

impl fmt::Debug for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key)
    }
}

impl PartialEq for Setting {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Effective {
    /// A setting's value (`None`: unset) and where it came from.
    pub fn get(&self, key: &str) -> Option<(Option<&Value>, &Source)> {
        self.values
            .iter()
            .find(|(s, _, _)| s.key == key)
            .map(|(_, v, src)| (v.as_ref(), src))
    }

    /// The streams declared in the file.
    pub fn streams(&self) -> impl Iterator<Item = &DeclaredStream> {
        self.streams.iter().map(|(d, _)| d)
    }

    /// The caches declared in the file (`[[caches]]`, cluster only).
    pub fn caches(&self) -> impl Iterator<Item = &DeclaredCache> {
        self.caches.iter().map(|(d, _)| d)
    }

    /// The effective configuration as TOML (a file `--config` accepts), each value followed
    /// by its source; unset settings are listed as comments.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# felix-broker: the effective configuration; after each value, where it came from\n",
        );
        let mut section = "";
        for (setting, value, source) in &self.values {
            let (sect, name) = setting.key.split_once('.').unwrap_or(("", setting.key));
            if sect != section {
                let _ = write!(out, "\n[{sect}]\n");
                section = sect;
            }
            let vars = setting.env.join(", ");
            match value {
                Some(v) => {
                    let _ = writeln!(out, "{name} = {v}  # {source} (env {vars})");
                }
                None => {
                    let _ = writeln!(out, "# {name} is unset  # {source} (env {vars})");
                }
            }
        }
        for (d, source) in &self.streams {
            let _ = write!(
                out,
                "\n[[streams]]  # {source}\ntenant = {}\nnamespace = {}\nstream = {}\nshards = {}\n\
                 replication_factor = {}\nconsistency = {}\n",
                Value::from(d.tenant.as_str()),
                Value::from(d.namespace.as_str()),
                Value::from(d.stream.as_str()),
                d.shards,
                d.replication_factor,
                Value::from(consistency_name(d.consistency)),
            );
            if let Some(b) = d.retention_max_bytes {
                let _ = writeln!(out, "retention_max_bytes = {b}");
            }
            if let Some(s) = d.retention_max_age_seconds {
                let _ = writeln!(out, "retention_max_age_seconds = {s}");
            }
        }
        for (d, source) in &self.caches {
            let _ = write!(
                out,
                "\n[[caches]]  # {source}\ntenant = {}\nnamespace = {}\ncache = {}\nshards = {}\n\
                 replication_factor = {}\n",
                Value::from(d.tenant.as_str()),
                Value::from(d.namespace.as_str()),
                Value::from(d.cache.as_str()),
                d.shards,
                d.replication_factor,
            );
        }
        out
    }
}

/// Reads the process environment and the file it names (`FELIX_CONFIG`).
pub fn from_env() -> Result<Config, ConfigError> {
    load(None, env_var)
}

/// The process environment, with empty variables read as unset.
pub fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Reads configuration through `get` (the environment, or a map in tests), and the file it
/// names with `FELIX_CONFIG`, if any.
pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    load(None, get)
}

/// Reads `file` (or the one `get` names with `FELIX_CONFIG`), overrides it with the
/// variables `get` gives, and builds the configuration. Files named by settings (TLS, JWKS)
/// are read here.
pub fn load(
    file: Option<&Path>,
    get: impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let file = match file {
        Some(p) => Some(p.to_path_buf()),
        None => CONFIG_FILE_VARS
            .iter()
            .find_map(|v| get(v))
            .map(PathBuf::from),
    };
    let effective = resolve(file.as_deref(), &get)?;
    build(effective)
}

/// Defaults, then the file, then the environment.
fn resolve(
    file: Option<&Path>,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Effective, ConfigError> {
    let probe = probe_config();
    let mut values: Vec<(Setting, Option<Value>, Source)> = SETTINGS
        .iter()
        .map(|s| (*s, default_value(s, &probe), Source::Default))
        .collect();
    let mut streams = Vec::new();
    let mut caches = Vec::new();

    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("config file {}: {e}", path.display())))?;
        let table: toml::Table = text
            .parse()
            .map_err(|e| ConfigError(format!("config file {}: {e}", path.display())))?;
        let source = Source::File(path.to_path_buf());
        let at = |key: &str| format!("`{key}` in {}", path.display());
        for (key, value) in table {
            if key == "streams" {
                streams = declared_streams(&value, &at)?
                    .into_iter()
                    .map(|d| (d, source.clone()))
                    .collect();
                continue;
            }
            if key == "caches" {
                caches = declared_caches(&value, &at)?
                    .into_iter()
                    .map(|d| (d, source.clone()))
                    .collect();
                continue;
            }
            let entries: Vec<(String, Value)> = match value {
                Value::Table(t) if SECTIONS.contains(&key.as_str()) => t
                    .into_iter()
                    .map(|(k, v)| (format!("{key}.{k}"), v))
                    .collect(),
                Value::Table(_) => {
                    return Err(ConfigError(format!(
                        "{}: unknown section (known: {}, [[streams]], [[caches]])",
                        at(&key),
                        SECTIONS.join(", ")
                    )))
                }
                v => vec![(key, v)],
            };
            for (key, value) in entries {
                let Some(slot) = values.iter_mut().find(|(s, _, _)| s.key == key) else {
                    return Err(ConfigError(format!("{}: unknown key", at(&key))));
                };
                let value = check_kind(slot.0.kind, value)
                    .map_err(|why| ConfigError(format!("{}: {why}", at(&key))))?;
                slot.1 = Some(value);
                slot.2 = source.clone();
            }
        }
    }

    for (setting, value, source) in &mut values {
        let Some((name, text)) = setting.env.iter().find_map(|n| get(n).map(|v| (*n, v))) else {
            continue;
        };
        *value = Some(
            parse_env(setting.kind, &text)
                .map_err(|why| ConfigError(format!("{name}={text:?}: {why}")))?,
        );
        *source = Source::Env(name);
    }
    Ok(Effective {
        values,
        streams,
        caches,
    })
}

/// A setting's default value (`None`: unset); `probe` gives the engine's defaults.
fn default_value(s: &Setting, probe: &EngineConfig) -> Option<Value> {
    match s.default {
        Default_::Unset => None,
        Default_::Int(n) => Some(int_value(n)),
        Default_::Bool(b) => Some(Value::Boolean(b)),
        Default_::Text(t) => Some(Value::from(t)),
        Default_::Engine(getter) => Some(int_value(getter(probe))),
    }
}

fn int_value(n: u64) -> Value {
    // Every default and limit fits; the file cannot hold more than i64 anyway.
    Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

fn check_kind(kind: Kind, value: Value) -> Result<Value, String> {
    let ok = match (&value, kind) {
        (Value::Integer(n), Kind::Int | Kind::IntOrOff) => *n >= 0,
        (Value::String(s), Kind::IntOrOff) => s == "off",
        (Value::Boolean(_), Kind::Bool) => true,
        (Value::String(_), Kind::Text) => true,
        _ => false,
    };
    if ok {
        Ok(value)
    } else {
        Err(format!("expected {}, found {value}", kind.describe()))
    }
}

fn parse_env(kind: Kind, text: &str) -> Result<Value, String> {
    let text = text.trim();
    let int = |t: &str| {
        t.parse::<u64>()
            .ok()
            .and_then(|n| i64::try_from(n).ok())
            .map(Value::Integer)
            .ok_or_else(|| "is not an unsigned integer".to_owned())
    };
    match kind {
        Kind::Int => int(text),
        Kind::IntOrOff if text == "off" => Ok(Value::from("off")),
        Kind::IntOrOff => int(text).map_err(|_| "expected a byte count or off".to_owned()),
        Kind::Bool => match text.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(Value::Boolean(true)),
            "false" | "0" | "no" | "off" => Ok(Value::Boolean(false)),
            _ => Err("expected true or false".to_owned()),
        },
        Kind::Text => Ok(Value::from(text)),
    }
}

/// `[[streams]]`: tenant, namespace, stream and shards, each required.
fn declared_streams(
    value: &Value,
    at: &impl Fn(&str) -> String,
) -> Result<Vec<DeclaredStream>, ConfigError> {
    let Value::Array(entries) = value else {
        return Err(ConfigError(format!(
            "{}: expected [[streams]] tables",
            at("streams")
        )));
    };
    let mut out = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let key = |k: &str| format!("streams[{i}].{k}");
        let Value::Table(t) = entry else {
            return Err(ConfigError(format!("{}: expected a table", at(&key("")))));
        };
        for k in t.keys() {
            if k == "durable" {
                return Err(ConfigError(format!(
                    "{}: durability is broker-wide (set durable.storage_dir), not per stream",
                    at(&key(k))
                )));
            }
            if !STREAM_KEYS.contains(&k.as_str()) {
                return Err(ConfigError(format!(
                    "{}: unknown key (a stream has {})",
                    at(&key(k)),
                    STREAM_KEYS.join(", ")
                )));
            }
        }
        let text = |k: &str| match t.get(k) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(v) => Err(ConfigError(format!(
                "{}: expected a non-empty string, found {v}",
                at(&key(k))
            ))),
            None => Err(ConfigError(format!("{}: missing", at(&key(k))))),
        };
        let shards = match t.get("shards") {
            Some(Value::Integer(n)) if (1..=i64::from(u16::MAX)).contains(n) => *n as u32,
            Some(v) => {
                return Err(ConfigError(format!(
                    "{}: expected 1 to {}, found {v}",
                    at(&key("shards")),
                    u16::MAX
                )))
            }
            None => return Err(ConfigError(format!("{}: missing", at(&key("shards"))))),
        };
        let mut d =
            DeclaredStream::new(text("tenant")?, text("namespace")?, text("stream")?, shards);
        d.replication_factor =
            replication_factor(t.get("replication_factor"), &key, at)?.unwrap_or(1);
        // A stream's own retention: above zero (0 would keep nothing); unset keeps the
        // broker-wide `durable.retention_*`.
        let bound = |k: &str| match t.get(k) {
            None => Ok(None),
            Some(Value::Integer(n)) if *n >= 1 => Ok(Some(*n as u64)),
            Some(v) => Err(ConfigError(format!(
                "{}: expected a positive integer, found {v}",
                at(&key(k))
            ))),
        };
        d.retention_max_bytes = bound("retention_max_bytes")?;
        d.retention_max_age_seconds = bound("retention_max_age_seconds")?;
        d.consistency = match t.get("consistency") {
            None => Consistency::Leader,
            Some(Value::String(s)) if s == "leader" => Consistency::Leader,
            Some(Value::String(s)) if s == "quorum" => Consistency::Quorum,
            Some(v) => {
                return Err(ConfigError(format!(
                    "{}: expected \"leader\" or \"quorum\", found {v}",
                    at(&key("consistency"))
                )))
            }
        };
        out.push(d);
    }
    Ok(out)
}

fn consistency_name(c: Consistency) -> &'static str {
    match c {
        Consistency::Leader => "leader",
        Consistency::Quorum => "quorum",
    }
}

/// A declaration's `replication_factor`: 1..=[`MAX_REPLICATION_FACTOR`] when present.
fn replication_factor(
    value: Option<&Value>,
    key: &impl Fn(&str) -> String,
    at: &impl Fn(&str) -> String,
) -> Result<Option<u8>, ConfigError> {
    match value {
        None => Ok(None),
        Some(Value::Integer(n)) if (1..=i64::from(MAX_REPLICATION_FACTOR)).contains(n) => {
            Ok(Some(*n as u8))
        }
        Some(v) => Err(ConfigError(format!(
            "{}: expected 1 to {MAX_REPLICATION_FACTOR}, found {v}",
            at(&key("replication_factor"))
        ))),
    }
}

/// `[[caches]]`: tenant, namespace, cache and replication_factor, each required; shards
/// (default 1). Only a cluster node takes them (checked in [`cluster`]).
fn declared_caches(
    value: &Value,
    at: &impl Fn(&str) -> String,
) -> Result<Vec<DeclaredCache>, ConfigError> {
    let Value::Array(entries) = value else {
        return Err(ConfigError(format!(
            "{}: expected [[caches]] tables",
            at("caches")
        )));
    };
    let mut out = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let key = |k: &str| format!("caches[{i}].{k}");
        let Value::Table(t) = entry else {
            return Err(ConfigError(format!("{}: expected a table", at(&key("")))));
        };
        if let Some(k) = t.keys().find(|k| !CACHE_KEYS.contains(&k.as_str())) {
            return Err(ConfigError(format!(
                "{}: unknown key (a cache has {})",
                at(&key(k)),
                CACHE_KEYS.join(", ")
            )));
        }
        let text = |k: &str| match t.get(k) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(v) => Err(ConfigError(format!(
                "{}: expected a non-empty string, found {v}",
                at(&key(k))
            ))),
            None => Err(ConfigError(format!("{}: missing", at(&key(k))))),
        };
        let shards = match t.get("shards") {
            None => 1,
            Some(Value::Integer(n)) if (1..=i64::from(u16::MAX)).contains(n) => *n as u32,
            Some(v) => {
                return Err(ConfigError(format!(
                    "{}: expected 1 to {}, found {v}",
                    at(&key("shards")),
                    u16::MAX
                )))
            }
        };
        let rf = replication_factor(t.get("replication_factor"), &key, at)?
            .ok_or_else(|| ConfigError(format!("{}: missing", at(&key("replication_factor")))))?;
        let mut d = DeclaredCache::new(text("tenant")?, text("namespace")?, text("cache")?, rf);
        d.shards = shards;
        out.push(d);
    }
    Ok(out)
}

/// Reads the effective values into broker options.
fn build(effective: Effective) -> Result<Config, ConfigError> {
    // How an error names a value: the variable it came from, or the key (and the file).
    let name = |key: &str| -> String {
        match effective.get(key) {
            Some((_, Source::Env(var))) => (*var).to_owned(),
            Some((_, Source::File(p))) => format!("`{key}` in {}", p.display()),
            _ => format!("`{key}`"),
        }
    };
    let text = |key: &str| -> Option<String> {
        match effective.get(key) {
            Some((Some(Value::String(s)), _)) => Some(s.clone()),
            _ => None,
        }
    };
    let int = |key: &str| -> Option<u64> {
        match effective.get(key) {
            Some((Some(Value::Integer(n)), _)) => u64::try_from(*n).ok(),
            _ => None,
        }
    };
    let flag =
        |key: &str| -> bool { matches!(effective.get(key), Some((Some(Value::Boolean(true)), _))) };
    let read = |key: &str, path: &str| {
        std::fs::read(path).map_err(|e| ConfigError(format!("{}={path:?}: {e}", name(key))))
    };

    let bind_text = text("quic_bind").unwrap_or_else(|| DEFAULT_QUIC_BIND.to_owned());
    let bind: SocketAddr = bind_text
        .parse()
        .map_err(|e| ConfigError(format!("{}={bind_text:?}: {e}", name("quic_bind"))))?;
    let mut options = BrokerOptions::new(bind);

    let metrics_text = text("metrics_bind").unwrap_or_default();
    options.metrics_bind = match metrics_text.trim() {
        "" | "off" => None,
        addr => Some(addr.parse().map_err(|e| {
            ConfigError(format!(
                "{}={metrics_text:?}: {e} (an address, or off)",
                name("metrics_bind")
            ))
        })?),
    };
    options.metrics_bind_optional =
        matches!(effective.get("metrics_bind"), Some((_, Source::Default)));

    let mut reload = Reload::default();
    options.tls_pem = match (text("tls.cert"), text("tls.key")) {
        (Some(cert), Some(key)) => {
            let pem = (read("tls.cert", &cert)?, read("tls.key", &key)?);
            reload.tls = Some((PathBuf::from(cert), PathBuf::from(key)));
            Some(pem)
        }
        (None, None) => None,
        _ => {
            return Err(ConfigError(
                "set both tls.cert and tls.key (FELIX_TLS_CERT and FELIX_TLS_KEY), or neither"
                    .into(),
            ))
        }
    };
    if let Some(path) = text("auth.jwks_file") {
        options.jwks = Some(read("auth.jwks_file", &path)?);
        reload.jwks = Some(PathBuf::from(path));
    }
    reload.interval = match int("reload_interval_ms") {
        Some(0) | None => None,
        Some(ms) if ms < MIN_RELOAD_INTERVAL_MS => {
            return Err(ConfigError(format!(
                "{} must be 0 (off) or at least {MIN_RELOAD_INTERVAL_MS}, not {ms}",
                name("reload_interval_ms")
            )))
        }
        Some(ms) => Some(Duration::from_millis(ms)),
    };

    options.busy_poll = match int("limits.busy_poll_us") {
        Some(us) if us > crate::MAX_BUSY_POLL.as_micros() as u64 => {
            return Err(ConfigError(format!(
                "{} must be 0 (never spin) to {}, not {us}",
                name("limits.busy_poll_us"),
                crate::MAX_BUSY_POLL.as_micros()
            )))
        }
        Some(us) => Duration::from_micros(us),
        None => crate::DEFAULT_BUSY_POLL,
    };
    durable(&name, &text, &int, &flag, &mut options)?;
    let (cluster, internal_bind) = cluster(&effective, &name, &text, &int, &flag, bind)?;
    // Acking on arrival would answer a `quorum` publish before any follower holds it.
    if options.durable.ack_before_write && cluster.is_some() {
        return Err(ConfigError(format!(
            "{} cannot be used on a cluster node ({} is set): acks must wait for the write \
             and for replication",
            name("durable.ack_before_write"),
            name("cluster.node_id")
        )));
    }

    // Engine settings: limits, TLS client certificates and ALPN, declared streams.
    let mut limits: Vec<(Setter, u64)> = Vec::new();
    let mut probe = probe_config();
    for (setting, value, source) in &effective.values {
        let (Some(setter), Some(Value::Integer(n)), false) =
            (setting.engine, value, *source == Source::Default)
        else {
            continue;
        };
        let n = *n as u64;
        setter(&mut probe, n).map_err(|e| ConfigError(format!("{}: {e}", name(setting.key))))?;
        limits.push((setter, n));
    }
    if probe.initial_mtu > probe.mtu_upper_bound {
        return Err(ConfigError(format!(
            "{} ({}) is above {} ({})",
            name("limits.initial_mtu"),
            probe.initial_mtu,
            name("limits.mtu_upper_bound"),
            probe.mtu_upper_bound
        )));
    }
    let client_ca = match text("tls.client_ca") {
        Some(path) => {
            let pem = read("tls.client_ca", &path)?;
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ConfigError(format!("{}={path:?}: {e}", name("tls.client_ca"))))?;
            if certs.is_empty() {
                return Err(ConfigError(format!(
                    "{}={path:?}: holds no certificate",
                    name("tls.client_ca")
                )));
            }
            Some(certs)
        }
        None => None,
    };
    let require_alpn = flag("tls.require_alpn");
    let streams: Vec<DeclaredStream> = effective.streams().cloned().collect();
    if !limits.is_empty()
        || client_ca.is_some()
        || require_alpn
        || !streams.is_empty()
        || cluster.is_some()
    {
        options = options.configure_engine(move |c| {
            for (setter, value) in limits {
                let _ = setter(c, value);
            }
            if client_ca.is_some() {
                c.client_ca = client_ca;
            }
            c.require_alpn = require_alpn;
            c.declared_streams.extend(streams);
            if cluster.is_some() {
                c.cluster = cluster;
            }
        });
    }

    Ok(Config {
        options,
        tls_cert_export: text("tls.cert_export").map(PathBuf::from),
        dev_token_export: text("auth.dev_token_export").map(PathBuf::from),
        runtime: text("runtime"),
        reload,
        effective,
        internal_bind,
    })
}

/// Every setting that only a cluster node takes.
const CLUSTER_ONLY: &[&str] = &[
    "limits.default_replication_factor",
    "limits.forward_window",
    "limits.forward_timeout_ms",
    "limits.max_forward_channels",
    "limits.max_peer_backlog_bytes",
    "limits.peer_idle_timeout_ms",
    "limits.peer_max_streams",
    "limits.metadata_log_compact_bytes",
    "limits.max_pending_lease_grants",
    "cluster.internal_bind",
    "cluster.peers",
    "cluster.client_advertise_addr",
    "cluster.lease_ms",
    "cluster.place_streams_on_first_use",
    "cluster.internal_tls_cert",
    "cluster.internal_tls_key",
    "cluster.internal_tls_ca",
    "cluster.internal_allow_unauthenticated",
    "replication.quorum_timeout_ms",
    "replication.window_bytes",
    "replication.leader_quiet_after_ms",
];

/// The `cluster.*` settings, the two cluster limits and `[[caches]]`: the engine's
/// [`ClusterConfig`] and the internal bind address, or neither without `cluster.node_id`.
///
/// Without a node id, a cluster setting with a value other than its default is refused rather
/// than ignored: a node that was meant to join a cluster and quietly runs alone would answer
/// clients with data the cluster never sees. Defaults pass, so `--print-config` output (which
/// spells every default) loads again.
fn cluster(
    effective: &Effective,
    name: &impl Fn(&str) -> String,
    text: &impl Fn(&str) -> Option<String>,
    int: &impl Fn(&str) -> Option<u64>,
    flag: &impl Fn(&str) -> bool,
    client_bind: SocketAddr,
) -> Result<(Option<ClusterConfig>, Option<SocketAddr>), ConfigError> {
    let Some(node_id) = text("cluster.node_id") else {
        let probe = probe_config();
        let given: Vec<String> = effective
            .values
            .iter()
            .filter(|(s, v, _)| CLUSTER_ONLY.contains(&s.key) && *v != default_value(s, &probe))
            .map(|(s, _, _)| name(s.key))
            .collect();
        if !given.is_empty() {
            let (verb, them) = if given.len() == 1 {
                ("applies", "it")
            } else {
                ("apply", "them")
            };
            return Err(ConfigError(format!(
                "{} only {verb} to a cluster node: set FELIX_NODE_ID (cluster.node_id) too, or \
                 remove {them}",
                given.join(", ")
            )));
        }
        if let Some(c) = effective.caches().next() {
            return Err(ConfigError(format!(
                "[[caches]] ({}/{}/{}) declares placement for a cluster: set FELIX_NODE_ID \
                 (cluster.node_id), or remove it (a single node creates caches on first use)",
                c.tenant, c.namespace, c.cache
            )));
        }
        if let Some(s) = effective.streams().find(|s| s.replication_factor > 1) {
            return Err(ConfigError(format!(
                "stream {}/{}/{}: replication_factor {} needs a cluster (FELIX_NODE_ID); a \
                 single node holds one copy",
                s.tenant, s.namespace, s.stream, s.replication_factor
            )));
        }
        return Ok((None, None));
    };
    let node_id = node_id.trim().to_owned();
    check_node_id(&node_id)
        .map_err(|why| ConfigError(format!("{}: {why}", name("cluster.node_id"))))?;

    let missing: Vec<String> = [
        ("cluster.internal_bind", "FELIX_INTERNAL_BIND"),
        ("cluster.peers", "FELIX_CLUSTER_PEERS"),
    ]
    .iter()
    .filter(|(k, _)| text(k).is_none())
    .map(|(k, var)| format!("{var} ({k})"))
    .collect();
    if !missing.is_empty() {
        return Err(ConfigError(format!(
            "{} is set, so {} must be set too",
            name("cluster.node_id"),
            missing.join(" and ")
        )));
    }
    let bind_text = text("cluster.internal_bind").unwrap_or_default();
    let internal_bind: SocketAddr = bind_text.trim().parse().map_err(|e| {
        ConfigError(format!(
            "{}={bind_text:?}: {e} (a socket address, e.g. 0.0.0.0:5100)",
            name("cluster.internal_bind")
        ))
    })?;
    if internal_bind == client_bind && internal_bind.port() != 0 {
        return Err(ConfigError(format!(
            "{}={internal_bind}: the peer listener needs a socket of its own, not {}'s",
            name("cluster.internal_bind"),
            name("quic_bind")
        )));
    }
    let peers_text = text("cluster.peers").unwrap_or_default();
    let peers = parse_peers(&peers_text, &node_id)
        .map_err(|why| ConfigError(format!("{}={peers_text:?}: {why}", name("cluster.peers"))))?;

    let client_advertise_addr = match text("cluster.client_advertise_addr") {
        Some(addr) => {
            let addr = addr.trim().to_owned();
            check_host_port(&addr).map_err(|why| {
                ConfigError(format!(
                    "{}={addr:?}: {why}",
                    name("cluster.client_advertise_addr")
                ))
            })?;
            Some(addr)
        }
        None => None,
    };
    let lease_ms = positive(int, name, "cluster.lease_ms")?
        .unwrap_or(felix_engine::DEFAULT_LEASE.as_millis() as u64);
    let forward_window = positive(int, name, "limits.forward_window")?.map_or(
        Ok(felix_engine::DEFAULT_FORWARD_WINDOW),
        |n| {
            usize::try_from(n).map_err(|_| {
                ConfigError(format!(
                    "{}: {n} is out of range",
                    name("limits.forward_window")
                ))
            })
        },
    )?;
    let count = |key: &str| -> Result<Option<usize>, ConfigError> {
        positive(int, name, key)?
            .map(|n| {
                usize::try_from(n)
                    .map_err(|_| ConfigError(format!("{}: {n} is out of range", name(key))))
            })
            .transpose()
    };
    let forward_timeout =
        positive(int, name, "limits.forward_timeout_ms")?.map(Duration::from_millis);
    let quorum_timeout =
        positive(int, name, "replication.quorum_timeout_ms")?.map(Duration::from_millis);
    let replication_window = positive(int, name, "replication.window_bytes")?;
    let leader_quiet_after =
        positive(int, name, "replication.leader_quiet_after_ms")?.map(Duration::from_millis);
    let max_forward_channels = count("limits.max_forward_channels")?;
    // 0 is allowed: nothing is queued for a peer whose link is down.
    let max_peer_backlog_bytes = int("limits.max_peer_backlog_bytes")
        .map(|n| {
            usize::try_from(n).map_err(|_| {
                ConfigError(format!(
                    "{}: {n} is out of range",
                    name("limits.max_peer_backlog_bytes")
                ))
            })
        })
        .transpose()?;
    // quinn takes idle timeouts up to 2^62 ms; a day is far more than any link needs.
    let peer_idle_timeout = match positive(int, name, "limits.peer_idle_timeout_ms")? {
        Some(ms) if ms > 86_400_000 => {
            return Err(ConfigError(format!(
                "{}: {ms} is more than a day",
                name("limits.peer_idle_timeout_ms")
            )))
        }
        other => other.map(Duration::from_millis),
    };
    let peer_max_streams = match positive(int, name, "limits.peer_max_streams")? {
        Some(n) if n > 1024 => {
            return Err(ConfigError(format!(
                "{}: {n} is more than 1024 (a link uses one stream)",
                name("limits.peer_max_streams")
            )))
        }
        other => other.map(|n| n as u32),
    };
    let compact_bytes = positive(int, name, "limits.metadata_log_compact_bytes")?
        .unwrap_or(felix_engine::DEFAULT_METADATA_LOG_COMPACT_BYTES);
    let max_pending_lease_grants = positive(int, name, "limits.max_pending_lease_grants")?
        .map_or(felix_engine::DEFAULT_MAX_PENDING_LEASE_GRANTS, |n| {
            n as usize
        });
    let nodes = peers.len();
    let default_rf = match int("limits.default_replication_factor") {
        None => DEFAULT_REPLICATION_FACTOR,
        Some(n) if (1..=u64::from(MAX_REPLICATION_FACTOR)).contains(&n) && n as usize <= nodes => {
            n as u8
        }
        Some(n) => {
            return Err(ConfigError(format!(
                "{}: {n} must be 1 to {MAX_REPLICATION_FACTOR} and at most the {nodes} nodes \
                 of the cluster",
                name("limits.default_replication_factor")
            )))
        }
    };
    for s in effective.streams() {
        if usize::from(s.replication_factor) > nodes {
            return Err(ConfigError(format!(
                "stream {}/{}/{}: replication_factor {} is more than the {nodes} nodes of the \
                 cluster",
                s.tenant, s.namespace, s.stream, s.replication_factor
            )));
        }
    }
    // Replicas are copies of a shard's log: a node keeping streams in memory has none to
    // copy, and a failover would hand clients an empty shard.
    if text("durable.storage_dir").is_none() {
        let replicated = effective.streams().find(|s| s.replication_factor > 1);
        if let Some(s) = replicated {
            return Err(ConfigError(format!(
                "stream {}/{}/{}: replication_factor {} needs durable storage \
                 (FELIX_DURABLE_STORAGE_DIR): replicas are copies of a shard's log",
                s.tenant, s.namespace, s.stream, s.replication_factor
            )));
        }
        if default_rf > 1 {
            return Err(ConfigError(format!(
                "{}: {default_rf} needs durable storage (FELIX_DURABLE_STORAGE_DIR): replicas \
                 are copies of a shard's log",
                name("limits.default_replication_factor")
            )));
        }
    }
    for c in effective.caches() {
        if usize::from(c.replication_factor) > nodes {
            return Err(ConfigError(format!(
                "cache {}/{}/{}: replication_factor {} is more than the {nodes} nodes of the \
                 cluster",
                c.tenant, c.namespace, c.cache, c.replication_factor
            )));
        }
    }

    let peer_tls = internal_tls(name, text, flag)?;

    let mut config = ClusterConfig::new(node_id, peers);
    config.client_advertise_addr = client_advertise_addr;
    config.lease = Duration::from_millis(lease_ms);
    config.peer_tls = peer_tls;
    config.declared_caches = effective.caches().cloned().collect();
    config.default_replication_factor = default_rf;
    config.place_streams_on_first_use = flag("cluster.place_streams_on_first_use");
    config.forward_window = forward_window;
    if let Some(t) = forward_timeout {
        config.forward_timeout = t;
    }
    if let Some(n) = max_forward_channels {
        config.max_forward_channels = n;
    }
    if let Some(n) = max_peer_backlog_bytes {
        config.max_peer_backlog_bytes = n;
    }
    if let Some(t) = peer_idle_timeout {
        config.peer_idle_timeout = t;
    }
    if let Some(n) = peer_max_streams {
        config.peer_max_streams = n;
    }
    config.metadata_log_compact_bytes = compact_bytes;
    config.max_pending_lease_grants = max_pending_lease_grants;
    if let Some(t) = leader_quiet_after {
        config.leader_quiet_after = t;
    }
    if let Some(t) = quorum_timeout {
        config.quorum_timeout = t;
    }
    if let Some(n) = replication_window {
        config.replication_window_bytes = n;
    }
    Ok((Some(config), Some(internal_bind)))
}

/// Peer mTLS from `cluster.internal_tls_{cert,key,ca}`: all three, or none and
/// `cluster.internal_allow_unauthenticated`.
fn internal_tls(
    name: &impl Fn(&str) -> String,
    text: &impl Fn(&str) -> Option<String>,
    flag: &impl Fn(&str) -> bool,
) -> Result<Option<PeerTls>, ConfigError> {
    const KEYS: [&str; 3] = [
        "cluster.internal_tls_cert",
        "cluster.internal_tls_key",
        "cluster.internal_tls_ca",
    ];
    let [cert, key, ca] = KEYS.map(text);
    let (Some(cert), Some(key), Some(ca)) = (&cert, &key, &ca) else {
        let set = [&cert, &key, &ca].iter().filter(|v| v.is_some()).count();
        if set == 0 && flag("cluster.internal_allow_unauthenticated") {
            return Ok(None);
        }
        let missing: Vec<&str> = [
            (&cert, "FELIX_INTERNAL_TLS_CERT"),
            (&key, "FELIX_INTERNAL_TLS_KEY"),
            (&ca, "FELIX_INTERNAL_TLS_CA"),
        ]
        .into_iter()
        .filter(|(v, _)| v.is_none())
        .map(|(_, var)| var)
        .collect();
        return Err(ConfigError(format!(
            "a cluster node authenticates its peers with mTLS: missing {} (cluster.internal_tls_cert, \
             _key, _ca; all three are needed){}",
            missing.join(", "),
            if set == 0 {
                "; FELIX_INTERNAL_ALLOW_UNAUTHENTICATED=true runs without it, for tests only"
            } else {
                ""
            }
        )));
    };
    let read = |k: &str, path: &str| {
        std::fs::read(path).map_err(|e| ConfigError(format!("{}={path:?}: {e}", name(k))))
    };
    let identity =
        crate::tls::from_pem(&read(KEYS[0], cert)?, &read(KEYS[1], key)?).map_err(|e| {
            ConfigError(format!(
                "{} and {} ({cert:?}, {key:?}): {e}",
                name(KEYS[0]),
                name(KEYS[1])
            ))
        })?;
    let ca_certs = crate::tls::ca_from_pem(&read(KEYS[2], ca)?)
        .map_err(|e| ConfigError(format!("{}={ca:?}: {e}", name(KEYS[2]))))?;
    Ok(Some(PeerTls {
        identity,
        ca: ca_certs,
    }))
}

/// A node id: 1..=[`MAX_NODE_ID_LEN`] bytes of `[A-Za-z0-9._-]` (felix-cluster's rule; it is
/// also the DNS name in the node's peer certificate).
fn check_node_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_NODE_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "node id {id:?} must be 1 to {MAX_NODE_ID_LEN} bytes of [A-Za-z0-9._-]"
        ))
    }
}

/// `host:port` with a port number and a non-empty host (`[v6]:port` too).
fn check_host_port(addr: &str) -> Result<(), String> {
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err("expected host:port".to_owned()),
    }
}

/// `id=host:port,…`: 3 or 5 distinct ids, this node's among them, distinct addresses. A host
/// name is resolved now (IPv4 preferred, so `localhost` is 127.0.0.1), once: peers are dialled
/// at these addresses for the life of the process.
fn parse_peers(text: &str, node_id: &str) -> Result<Vec<PeerAddr>, String> {
    use std::net::ToSocketAddrs;
    let mut peers: Vec<PeerAddr> = Vec::new();
    for (i, entry) in text.split(',').map(str::trim).enumerate() {
        let bad = |why: String| format!("entry {} {entry:?}: {why}", i + 1);
        if entry.is_empty() {
            return Err(bad("is empty (expected id=host:port)".into()));
        }
        let Some((id, addr)) = entry.split_once('=') else {
            return Err(bad("expected id=host:port".into()));
        };
        let (id, addr) = (id.trim(), addr.trim());
        check_node_id(id).map_err(bad)?;
        let addr = match addr.parse::<SocketAddr>() {
            Ok(a) => a,
            Err(_) => {
                check_host_port(addr).map_err(bad)?;
                let resolved: Vec<SocketAddr> = addr
                    .to_socket_addrs()
                    .map_err(|e| bad(format!("cannot resolve {addr:?}: {e}")))?
                    .collect();
                resolved
                    .iter()
                    .find(|a| a.is_ipv4())
                    .or(resolved.first())
                    .copied()
                    .ok_or_else(|| bad(format!("{addr:?} resolves to no address")))?
            }
        };
        if addr.port() == 0 {
            return Err(bad("port 0 cannot be dialled".into()));
        }
        if peers.iter().any(|p| p.node_id == id) {
            return Err(bad(format!("node {id} is listed twice")));
        }
        if let Some(p) = peers.iter().find(|p| p.addr == addr) {
            return Err(bad(format!("{addr} is also node {}'s address", p.node_id)));
        }
        peers.push(PeerAddr {
            node_id: id.to_owned(),
            addr,
        });
    }
    if !peers.iter().any(|p| p.node_id == node_id) {
        return Err(format!(
            "this node ({node_id}) is not in the list; it must name every node, this one included"
        ));
    }
    if peers.len() != 3 && peers.len() != 5 {
        return Err(format!(
            "a cluster has 3 or 5 nodes (a majority that survives a failure); the list names {}",
            peers.len()
        ));
    }
    Ok(peers)
}

/// The `durable.*` settings.
fn durable(
    name: &impl Fn(&str) -> String,
    text: &impl Fn(&str) -> Option<String>,
    int: &impl Fn(&str) -> Option<u64>,
    flag: &impl Fn(&str) -> bool,
    options: &mut BrokerOptions,
) -> Result<(), ConfigError> {
    options.storage_dir = text("durable.storage_dir").map(PathBuf::from);
    let interval = positive(int, name, "durable.fsync_interval_ms")?
        .map_or(felix_engine::DEFAULT_FSYNC_INTERVAL, Duration::from_millis);
    let mode = text("durable.fsync_mode").unwrap_or_else(|| DEFAULT_FSYNC_MODE.into());
    options.durable.fsync = FsyncPolicy::parse(&mode, interval)
        .map_err(|e| ConfigError(format!("{}: {e}", name("durable.fsync_mode"))))?;
    options.durable.ack_on_commit = flag("durable.ack_on_commit");
    options.durable.ack_before_write = flag("durable.ack_before_write");
    if options.durable.ack_before_write
        && (options.durable.ack_on_commit || options.durable.fsync == FsyncPolicy::OnCommit)
    {
        return Err(ConfigError(format!(
            "{}: acking before the write cannot be combined with {} or the on_commit fsync mode",
            name("durable.ack_before_write"),
            name("durable.ack_on_commit")
        )));
    }
    options.durable.retention_bytes = int("durable.retention_bytes");
    options.durable.retention_age = int("durable.retention_seconds").map(Duration::from_secs);
    if let Some(ms) = positive(int, name, "durable.retention_check_interval_ms")? {
        options.durable.retention_check_interval = Duration::from_millis(ms);
    }
    if let Some(bytes) = positive(int, name, "durable.segment_max_bytes")? {
        options.durable.segment_max_bytes = bytes;
    }
    groups::groups_from_settings(int, name, &mut options.durable.groups)?;
    // `off` is the string the kind allows besides a count.
    options.cache_behind_bytes = int("durable.cache_behind_bytes");
    options.direct_io = flag("durable.direct_io");
    Ok(())
}

/// An integer setting that must be above zero when set.
fn positive(
    int: &impl Fn(&str) -> Option<u64>,
    name: &impl Fn(&str) -> String,
    key: &str,
) -> Result<Option<u64>, ConfigError> {
    match int(key) {
        Some(0) => Err(ConfigError(format!("{} must be above zero", name(key)))),
        other => Ok(other),
    }
}

/// A throwaway config to try setters on and read defaults from.
fn probe_config() -> EngineConfig {
    let identity = felix_engine::TlsIdentity {
        cert_chain: Vec::new(),
        key: rustls_pki_types::PrivateKeyDer::Pkcs8(Vec::new().into()),
    };
    EngineConfig::new(
        identity,
        felix_engine::AuthConfig::Dev { seed: [0; 32] },
        [0; 32],
    )
}

/// Every setting's key with its variables, for docs and usage text.
pub fn setting_names() -> BTreeMap<&'static str, &'static [&'static str]> {
    SETTINGS.iter().map(|s| (s.key, s.env)).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn engine_of(c: Config) -> EngineConfig {
        let mut engine = probe_config();
        if let Some(configure) = c.options.configure_engine {
            configure(&mut engine);
        }
        engine
    }

    #[test]
    fn defaults_and_overrides() {
        let c = from_vars(vars(&[])).unwrap();
        assert_eq!(c.options.bind, DEFAULT_QUIC_BIND.parse().unwrap());
        assert!(c.options.tls_pem.is_none() && c.options.jwks.is_none());
        assert!(c.options.configure_engine.is_none());
        assert_eq!(
            c.options.metrics_bind,
            Some(DEFAULT_METRICS_BIND.parse().unwrap())
        );
        assert!(c.options.metrics_bind_optional);
        assert_eq!(
            c.options.cache_behind_bytes,
            Some(DEFAULT_CACHE_BEHIND_BYTES)
        );
        assert!(c.options.direct_io, "direct appends are on by default");

        let c = from_vars(vars(&[
            ("FELIX_QUIC_BIND", "127.0.0.1:0"),
            ("FELIX_BROKER_PUBLISH_WINDOW", "64"),
            ("FELIX_IDLE_CONNECTION_REAP_MS", "1500"),
            ("FELIX_DEV_TOKEN_EXPORT", "/tmp/x"),
            ("FELIX_METRICS_BIND", "off"),
        ]))
        .unwrap();
        assert_eq!(c.dev_token_export, Some(PathBuf::from("/tmp/x")));
        assert_eq!(c.options.metrics_bind, None);
        let engine = engine_of(c);
        assert_eq!(engine.publish_window, 64);
        assert_eq!(engine.idle_connection_reap, Duration::from_millis(1500));
    }

    #[test]
    fn the_reload_interval_is_off_or_at_least_its_minimum() {
        let interval = |v: &str| {
            from_vars(vars(&[("FELIX_RELOAD_INTERVAL_MS", v)])).map(|c| c.reload.interval)
        };
        assert_eq!(interval("0").unwrap(), None);
        let min = MIN_RELOAD_INTERVAL_MS;
        assert_eq!(
            interval(&min.to_string()).unwrap(),
            Some(Duration::from_millis(min))
        );
        let e = interval(&(min - 1).to_string()).unwrap_err();
        assert!(
            e.0.contains("RELOAD_INTERVAL_MS") && e.0.contains("at least"),
            "{e:?}"
        );
        assert!(interval("1").is_err());
    }

    #[test]
    fn issue_six_knobs_reach_the_engine_and_the_executor() {
        let c = from_vars(vars(&[
            ("FELIX_TLS_REQUIRE_ALPN", "true"),
            ("FELIX_MAX_CONNECTIONS_PER_IP", "3"),
            ("FELIX_MAX_BUFFERED_BYTES", "1000000"),
            ("FELIX_MAX_CONNECTION_UNWRITTEN_BYTES", "200000"),
            ("FELIX_MAX_CONNECTION_EVENT_BYTES", "300000"),
            ("FELIX_STATE_MAX_BYTES_PER_SHARD", "4096"),
            ("FELIX_DURABLE_CACHE_BEHIND_BYTES", "off"),
        ]))
        .unwrap();
        assert_eq!(c.options.cache_behind_bytes, None);
        let e = engine_of(c);
        assert!(e.require_alpn);
        assert_eq!(e.max_connections_per_ip, 3);
        assert_eq!(e.max_buffered_bytes, 1_000_000);
        assert_eq!(e.max_connection_unwritten_bytes, 200_000);
        assert_eq!(e.max_connection_event_bytes, 300_000);
        assert_eq!(e.state_max_bytes_per_shard, 4096);
        let e = engine_of(
            from_vars(vars(&[
                ("FELIX_DURABLE_CACHE_MAX_LOGS", "11"),
                ("FELIX_COUNTER_MAX_LOGS", "12"),
                ("FELIX_DURABLE_CACHE_MAX_KEYS", "13"),
                ("FELIX_DURABLE_CACHE_MAX_TOTAL_BYTES", "14"),
                ("FELIX_MAX_PRODUCERS_PER_TENANT", "15"),
            ]))
            .unwrap(),
        );
        assert_eq!(e.max_producers_per_tenant, 15);
        assert_eq!(
            (
                e.durable_cache_max_logs,
                e.counter_max_logs,
                e.durable_cache_max_keys,
                e.durable_cache_max_total_bytes
            ),
            (11, 12, 13, 14)
        );
        let c = from_vars(vars(&[("FELIX_DURABLE_CACHE_BEHIND_BYTES", "4096")])).unwrap();
        assert_eq!(c.options.cache_behind_bytes, Some(4096));
        let e = from_vars(vars(&[("FELIX_DURABLE_CACHE_BEHIND_BYTES", "lots")])).unwrap_err();
        assert!(e.0.contains("FELIX_DURABLE_CACHE_BEHIND_BYTES"), "{e}");
        let c = from_vars(vars(&[("FELIX_DURABLE_DIRECT_IO", "false")])).unwrap();
        assert!(!c.options.direct_io, "buffered appends on request");
        let e = from_vars(vars(&[("FELIX_DURABLE_DIRECT_IO", "sometimes")])).unwrap_err();
        assert!(e.0.contains("FELIX_DURABLE_DIRECT_IO"), "{e}");
        let e = from_vars(vars(&[("FELIX_TLS_CLIENT_CA", "/definitely/not/here")])).unwrap_err();
        assert!(e.0.contains("FELIX_TLS_CLIENT_CA"), "{e}");
    }

    #[test]
    fn datagram_and_ack_knobs_reach_the_engine_and_refuse_their_edges() {
        let e = engine_of(from_vars(vars(&[])).unwrap());
        assert_eq!(e.mtu_upper_bound, felix_engine::DEFAULT_MTU_UPPER_BOUND);
        assert_eq!(e.initial_mtu, 1200);
        let e = engine_of(
            from_vars(vars(&[
                ("FELIX_MTU_UPPER_BOUND", "65527"),
                ("FELIX_INITIAL_MTU", "1200"),
                ("FELIX_MAX_UDP_PAYLOAD", "1200"),
                ("FELIX_ACK_ELICITING_THRESHOLD", "0"),
                ("FELIX_MAX_ACK_DELAY_MS", "1"),
            ]))
            .unwrap(),
        );
        assert_eq!(e.mtu_upper_bound, 65527);
        assert_eq!(e.max_udp_payload_size, 1200);
        assert_eq!(e.ack_eliciting_threshold, 0);
        assert_eq!(e.max_ack_delay, Duration::from_millis(1));
        // One past each edge is refused, naming the variable.
        for (var, bad) in [
            ("FELIX_MTU_UPPER_BOUND", "1199"),
            ("FELIX_MTU_UPPER_BOUND", "65528"),
            ("FELIX_INITIAL_MTU", "1199"),
            ("FELIX_MAX_UDP_PAYLOAD", "65528"),
            ("FELIX_ACK_ELICITING_THRESHOLD", "1001"),
            ("FELIX_MAX_ACK_DELAY_MS", "0"),
            ("FELIX_MAX_ACK_DELAY_MS", "16384"),
        ] {
            let err = from_vars(vars(&[(var, bad)])).unwrap_err();
            assert!(
                err.0.contains(var) && err.0.contains("must be"),
                "{var}={bad}: {err}"
            );
        }
        // The start may not be above the bound it probes up to.
        let err = from_vars(vars(&[
            ("FELIX_MTU_UPPER_BOUND", "1400"),
            ("FELIX_INITIAL_MTU", "1401"),
        ]))
        .unwrap_err();
        assert!(err.0.contains("FELIX_INITIAL_MTU"), "{err}");
        // The engine refuses the same edges when embedded without the config file.
        let mut c = probe_config();
        c.initial_mtu = 1401;
        c.mtu_upper_bound = 1400;
        let err = felix_engine::Engine::new(c, std::time::Instant::now(), 0).unwrap_err();
        assert!(err.to_string().contains("initial_mtu"), "{err}");
    }

    #[test]
    fn busy_poll_has_a_default_a_knob_and_refuses_past_its_edge() {
        let c = from_vars(vars(&[])).unwrap();
        assert_eq!(c.options.busy_poll, crate::DEFAULT_BUSY_POLL);
        let c = from_vars(vars(&[("FELIX_BUSY_POLL_US", "0")])).unwrap();
        assert_eq!(c.options.busy_poll, Duration::ZERO, "zero never spins");
        let max = crate::MAX_BUSY_POLL.as_micros().to_string();
        let c = from_vars(vars(&[("FELIX_BUSY_POLL_US", max.as_str())])).unwrap();
        assert_eq!(c.options.busy_poll, crate::MAX_BUSY_POLL);
        let over = (crate::MAX_BUSY_POLL.as_micros() + 1).to_string();
        let err = from_vars(vars(&[("FELIX_BUSY_POLL_US", over.as_str())])).unwrap_err();
        assert!(
            err.0.contains("FELIX_BUSY_POLL_US") && err.0.contains("must be"),
            "{err}"
        );
    }

    #[test]
    fn durable_variables() {
        let c = from_vars(vars(&[])).unwrap();
        assert_eq!(c.options.storage_dir, None);
        assert_eq!(
            c.options.durable.fsync,
            FsyncPolicy::Periodic(Duration::from_millis(250))
        );
        assert!(!c.options.durable.ack_on_commit);
        assert!(
            !c.options.durable.ack_before_write,
            "acks wait for the write by default"
        );

        let c = from_vars(vars(&[("FELIX_ACK_BEFORE_WRITE", "true")])).unwrap();
        assert!(c.options.durable.ack_before_write);
        for clash in [
            ("FELIX_DURABLE_FSYNC_MODE", "on_commit"),
            ("FELIX_ACK_ON_COMMIT", "true"),
        ] {
            let e = from_vars(vars(&[("FELIX_ACK_BEFORE_WRITE", "true"), clash])).unwrap_err();
            assert!(e.0.contains("FELIX_ACK_BEFORE_WRITE"), "{e}");
        }

        let c = from_vars(vars(&[
            ("FELIX_DURABLE_STORAGE_DIR", "/var/lib/felix"),
            ("FELIX_DURABLE_FSYNC_MODE", "on_commit"),
            ("FELIX_DURABLE_RETENTION_BYTES", "1048576"),
            ("FELIX_DURABLE_RETENTION_SECONDS", "3600"),
            ("FELIX_ACK_ON_COMMIT", "true"),
            ("FELIX_GROUP_MAX_WAITING_POLLS", "250"),
        ]))
        .unwrap();
        let d = &c.options.durable;
        assert_eq!(d.groups.max_waiting_polls, 250);
        assert_eq!(c.options.storage_dir, Some(PathBuf::from("/var/lib/felix")));
        assert_eq!(d.fsync, FsyncPolicy::OnCommit);
        assert_eq!(d.retention_bytes, Some(1 << 20));
        assert_eq!(d.retention_age, Some(Duration::from_secs(3600)));
        assert!(d.ack_on_commit);

        let c = from_vars(vars(&[
            ("FELIX_DURABLE_FSYNC_MODE", "periodic"),
            ("FELIX_DURABLE_FSYNC_INTERVAL_MS", "40"),
        ]))
        .unwrap();
        assert_eq!(
            c.options.durable.fsync,
            FsyncPolicy::Periodic(Duration::from_millis(40))
        );
        for bad in [
            ("FELIX_DURABLE_FSYNC_MODE", "sometimes"),
            ("FELIX_DURABLE_FSYNC_INTERVAL_MS", "0"),
            ("FELIX_DURABLE_RETENTION_BYTES", "-1"),
            ("FELIX_ACK_ON_COMMIT", "maybe"),
            ("FELIX_DURABLE_SEGMENT_BYTES", "0"),
        ] {
            let e = from_vars(vars(&[bad])).unwrap_err();
            assert!(e.0.contains(bad.0), "{e}");
        }
    }

    #[test]
    fn bad_values_are_refused_with_their_name() {
        let e = from_vars(vars(&[("FELIX_PUBLISH_WINDOW", "lots")])).unwrap_err();
        assert!(e.0.contains("FELIX_PUBLISH_WINDOW"), "{e}");
        let e = from_vars(vars(&[("FELIX_PUBLISH_WINDOW", "99999999999")])).unwrap_err();
        assert!(e.0.contains("out of range"), "{e}");
        let e = from_vars(vars(&[("FELIX_QUIC_BIND", "nowhere")])).unwrap_err();
        assert!(e.0.contains("FELIX_QUIC_BIND"), "{e}");
        let e = from_vars(vars(&[("FELIX_TLS_CERT", "/a")])).unwrap_err();
        assert!(e.0.contains("both"), "{e}");
        let e = from_vars(vars(&[("FELIX_AUTH_JWKS_FILE", "/definitely/not/here")])).unwrap_err();
        assert!(e.0.contains("FELIX_AUTH_JWKS_FILE"), "{e}");
        let e = from_vars(vars(&[("FELIX_METRICS_BIND", "everywhere")])).unwrap_err();
        assert!(e.0.contains("FELIX_METRICS_BIND"), "{e}");
    }

    /// A config file in a fresh temporary directory.
    fn file(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("felix-config-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("felix.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    const EXAMPLE: &str = r#"
quic_bind = "127.0.0.1:7000"
metrics_bind = "127.0.0.1:0"

[durable]
storage_dir = "/var/lib/felix"
fsync_mode = "on_commit"

[limits]
publish_window = 32
max_frame_bytes = 1048576
auth_timeout_ms = 2000

[[streams]]
tenant = "t1"
namespace = "orders"
stream = "created"
shards = 4
retention_max_age_seconds = 86400
"#;

    #[test]
    fn file_values_are_overridden_by_the_environment_and_printed_with_their_source() {
        let path = file("effective", EXAMPLE);
        let c = load(
            Some(&path),
            vars(&[
                ("FELIX_PUBLISH_WINDOW", "128"),
                ("FELIX_QUIC_BIND", "127.0.0.1:7001"),
            ]),
        )
        .unwrap();
        assert_eq!(c.options.bind, "127.0.0.1:7001".parse().unwrap());
        assert_eq!(c.options.metrics_bind, Some("127.0.0.1:0".parse().unwrap()));
        assert!(
            !c.options.metrics_bind_optional,
            "an explicit bind must work"
        );
        assert_eq!(c.options.storage_dir, Some(PathBuf::from("/var/lib/felix")));
        assert_eq!(c.options.durable.fsync, FsyncPolicy::OnCommit);
        let from_file = Source::File(path.clone());
        let eff = &c.effective;
        assert_eq!(
            eff.get("limits.publish_window").unwrap().1,
            &Source::Env("FELIX_PUBLISH_WINDOW")
        );
        assert_eq!(eff.get("limits.max_frame_bytes").unwrap().1, &from_file);
        assert_eq!(eff.get("limits.max_streams").unwrap().1, &Source::Default);
        assert_eq!(eff.get("tls.cert").unwrap(), (None, &Source::Default));

        let printed = eff.render();
        let line = |prefix: &str| {
            printed
                .lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{printed}"))
                .to_owned()
        };
        assert!(line("quic_bind = \"127.0.0.1:7001\"").contains("# env FELIX_QUIC_BIND"));
        assert!(line("publish_window = 128").contains("# env FELIX_PUBLISH_WINDOW"));
        assert!(line("max_frame_bytes = 1048576").contains(&format!("# file {}", path.display())));
        assert!(line("fsync_mode = \"on_commit\"").contains("# file"));
        assert!(line("max_streams = 100000").contains("# default"));
        assert!(line("# cert is unset").contains("# default"));
        assert!(line("[[streams]]").contains("# file"));
        assert!(printed.contains("shards = 4"));

        // What is printed is itself a configuration that gives the same values.
        let again = file("printed", &printed);
        let c2 = load(Some(&again), vars(&[])).unwrap();
        assert_eq!(c2.options.bind, c.options.bind);
        assert_eq!(c2.effective.streams().count(), 1);
        let e = engine_of(c2);
        assert_eq!(e.publish_window, 128);
        assert_eq!(e.max_frame_bytes, 1 << 20);
        assert_eq!(e.auth_timeout, Duration::from_secs(2));
        assert_eq!(e.declared_streams[0].shards, 4);
        assert_eq!(e.declared_streams[0].stream, "created");
        assert_eq!(e.declared_streams[0].retention_max_age_seconds, Some(86400));
        assert_eq!(e.declared_streams[0].retention_max_bytes, None);
    }

    #[test]
    fn bad_keys_and_values_in_the_file_are_refused_with_their_name() {
        for (text, needle) in [
            ("quic_bnd = \"x\"", "`quic_bnd`"),
            ("[limits]\npublish_windw = 3", "`limits.publish_windw`"),
            ("[limit]\npublish_window = 3", "`limit`"),
            ("[limits]\npublish_window = \"many\"", "`limits.publish_window`"),
            ("[limits]\npublish_window = -1", "`limits.publish_window`"),
            ("[limits]\nmax_frame_bytes = 99999999999", "`limits.max_frame_bytes`"),
            ("[tls]\nrequire_alpn = \"yes\"", "`tls.require_alpn`"),
            ("[durable]\nfsync_mode = \"sometimes\"", "`durable.fsync_mode`"),
            ("[durable]\nretention_check_interval_ms = 0", "`durable.retention_check_interval_ms`"),
            ("[[streams]]\ntenant = \"t1\"\nnamespace = \"n\"\nstream = \"s\"\nshards = 2\ndurable = true", "durability is broker-wide"),
            ("[[streams]]\ntenant = \"t1\"\nnamespace = \"n\"\nstream = \"s\"", "`streams[0].shards`"),
            ("[[streams]]\ntenant = \"t1\"\nnamespace = \"n\"\nstream = \"s\"\nshards = 0", "`streams[0].shards`"),
            ("[[streams]]\ntenant = \"t1\"\nnamespace = \"n\"\nstream = \"s\"\nshards = 1\nretention_max_bytes = 0", "`streams[0].retention_max_bytes`"),
            ("[[streams]]\ntenant = \"t1\"\nnamespace = \"n\"\nstream = \"s\"\nshards = 1\nretention_max_age_seconds = \"1d\"", "`streams[0].retention_max_age_seconds`"),
            ("quic_bind = ", "TOML"),
        ] {
            let path = file("bad", text);
            let e = load(Some(&path), vars(&[])).unwrap_err();
            assert!(e.0.contains(needle), "{text:?}: {e}");
        }
        let e = load(Some(Path::new("/definitely/not/here.toml")), vars(&[])).unwrap_err();
        assert!(e.0.contains("/definitely/not/here.toml"), "{e}");
        // FELIX_CONFIG names the file when no path is given.
        let path = file("by-var", "[limits]\npublish_window = 7");
        let c = from_vars(vars(&[("FELIX_CONFIG", path.to_str().unwrap())])).unwrap();
        assert_eq!(engine_of(c).publish_window, 7);
    }

    // Cluster settings (docs/cluster.md).

    const PEERS3: &str = "n1=127.0.0.1:7101,n2=localhost:7102,n3=127.0.0.1:7103";

    /// PEM files for peer mTLS in a fresh directory: (cert, key, ca).
    fn peer_tls_files(name: &str) -> (String, String, String) {
        let dir = std::env::temp_dir().join(format!("felix-config-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["n1".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let paths = ["cert.pem", "key.pem", "ca.pem"].map(|f| dir.join(f));
        std::fs::write(&paths[0], cert.pem()).unwrap();
        std::fs::write(&paths[1], key.serialize_pem()).unwrap();
        std::fs::write(&paths[2], cert.pem()).unwrap();
        let [a, b, c] = paths.map(|p| p.to_str().unwrap().to_owned());
        (a, b, c)
    }

    /// A node `n1` of [`PEERS3`], unauthenticated, plus `extra`.
    fn node<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut v = vec![
            ("FELIX_NODE_ID", "n1"),
            ("FELIX_INTERNAL_BIND", "127.0.0.1:7101"),
            ("FELIX_CLUSTER_PEERS", PEERS3),
            ("FELIX_INTERNAL_ALLOW_UNAUTHENTICATED", "true"),
        ];
        v.extend_from_slice(extra);
        v
    }

    fn cluster_of(pairs: &[(&str, &str)]) -> Result<(ClusterConfig, SocketAddr), ConfigError> {
        let c = from_vars(vars(pairs))?;
        let bind = c
            .internal_bind
            .expect("a cluster node has an internal bind");
        Ok((engine_of(c).cluster.expect("a cluster config"), bind))
    }

    fn refused(pairs: &[(&str, &str)]) -> String {
        from_vars(vars(pairs)).unwrap_err().0
    }

    #[test]
    fn a_cluster_node_gets_its_cluster_config_with_defaults() {
        let (c, bind) = cluster_of(&node(&[])).unwrap();
        assert_eq!(bind, "127.0.0.1:7101".parse().unwrap());
        assert_eq!(c.node_id, "n1");
        let peers: Vec<(String, SocketAddr)> = c
            .peers
            .iter()
            .map(|p| (p.node_id.clone(), p.addr))
            .collect();
        assert_eq!(
            peers,
            [
                ("n1".to_owned(), "127.0.0.1:7101".parse().unwrap()),
                ("n2".to_owned(), "127.0.0.1:7102".parse().unwrap()),
                ("n3".to_owned(), "127.0.0.1:7103".parse().unwrap()),
            ],
            "localhost resolves to 127.0.0.1"
        );
        assert_eq!(c.lease, Duration::from_millis(2000));
        assert_eq!(c.default_replication_factor, 1);
        assert_eq!(c.forward_window, felix_engine::DEFAULT_FORWARD_WINDOW);
        assert_eq!(c.forward_timeout, felix_engine::DEFAULT_FORWARD_TIMEOUT);
        assert_eq!(c.quorum_timeout, felix_engine::DEFAULT_QUORUM_TIMEOUT);
        assert_eq!(
            c.leader_quiet_after,
            felix_engine::DEFAULT_LEADER_QUIET_AFTER
        );
        assert_eq!(
            c.replication_window_bytes,
            felix_engine::DEFAULT_REPLICATION_WINDOW_BYTES
        );
        assert_eq!(
            c.max_forward_channels,
            felix_engine::DEFAULT_MAX_FORWARD_CHANNELS
        );
        assert_eq!(
            c.max_peer_backlog_bytes,
            felix_engine::DEFAULT_MAX_PEER_BACKLOG_BYTES
        );
        assert_eq!(c.peer_idle_timeout, felix_engine::DEFAULT_PEER_IDLE_TIMEOUT);
        assert_eq!(c.peer_max_streams, felix_engine::DEFAULT_PEER_MAX_STREAMS);
        assert_eq!(
            c.metadata_log_compact_bytes,
            felix_engine::DEFAULT_METADATA_LOG_COMPACT_BYTES
        );
        assert_eq!(
            c.max_pending_lease_grants,
            felix_engine::DEFAULT_MAX_PENDING_LEASE_GRANTS
        );
        assert_eq!(c.client_advertise_addr, None);
        assert!(c.peer_tls.is_none(), "allowed unauthenticated");
        assert!(c.declared_caches.is_empty());

        let (c, _) = cluster_of(&node(&[
            ("FELIX_CLIENT_ADVERTISE_ADDR", "broker-1.example:5000"),
            ("FELIX_LEASE_MS", "1"),
            ("FELIX_DEFAULT_REPLICATION_FACTOR", "3"),
            ("FELIX_FORWARD_WINDOW", "1"),
            ("FELIX_FORWARD_TIMEOUT_MS", "1"),
            ("FELIX_MAX_FORWARD_CHANNELS", "1"),
            ("FELIX_MAX_PEER_BACKLOG_BYTES", "0"),
            ("FELIX_PEER_IDLE_TIMEOUT_MS", "86400000"),
            ("FELIX_PEER_MAX_STREAMS", "1024"),
            ("FELIX_METADATA_LOG_COMPACT_BYTES", "1"),
            ("FELIX_MAX_PENDING_LEASE_GRANTS", "1"),
            ("FELIX_QUORUM_TIMEOUT_MS", "1"),
            ("FELIX_LEADER_QUIET_AFTER_MS", "1"),
            ("FELIX_REPLICATION_WINDOW_BYTES", "1"),
            ("FELIX_DURABLE_STORAGE_DIR", "/var/lib/felix"),
        ]))
        .unwrap();
        assert_eq!(c.quorum_timeout, Duration::from_millis(1));
        assert_eq!(c.leader_quiet_after, Duration::from_millis(1));
        assert_eq!(c.replication_window_bytes, 1);
        assert_eq!(
            c.client_advertise_addr.as_deref(),
            Some("broker-1.example:5000")
        );
        assert_eq!(c.lease, Duration::from_millis(1));
        assert_eq!(c.default_replication_factor, 3);
        assert_eq!(c.forward_window, 1);
        assert_eq!(c.forward_timeout, Duration::from_millis(1));
        assert_eq!(c.max_forward_channels, 1);
        assert_eq!(c.max_peer_backlog_bytes, 0);
        assert_eq!(c.peer_idle_timeout, Duration::from_secs(86_400));
        assert_eq!(c.peer_max_streams, 1024);
        assert_eq!(
            c.metadata_log_compact_bytes, 1,
            "the smallest threshold is one byte"
        );
        assert_eq!(c.max_pending_lease_grants, 1, "the smallest bound is one");

        // No node id: a single node, as before.
        let c = from_vars(vars(&[])).unwrap();
        assert_eq!(c.internal_bind, None);
        assert!(c.options.configure_engine.is_none());
    }

    #[test]
    fn the_peer_list_names_three_or_five_distinct_nodes_including_this_one() {
        let five = "n1=127.0.0.1:1,n2=127.0.0.1:2,n3=127.0.0.1:3,n4=127.0.0.1:4,n5=127.0.0.1:5";
        let (c, _) = cluster_of(&node(&[("FELIX_CLUSTER_PEERS", five)])).unwrap();
        assert_eq!(c.peers.len(), 5);
        for (peers, needle) in [
            ("n1=127.0.0.1:1,n2=127.0.0.1:2", "the list names 2"),
            (
                "n1=127.0.0.1:1,n2=127.0.0.1:2,n3=127.0.0.1:3,n4=127.0.0.1:4",
                "names 4",
            ),
            (
                "n2=127.0.0.1:2,n3=127.0.0.1:3,n4=127.0.0.1:4",
                "this node (n1) is not in the list",
            ),
            (
                "n1=127.0.0.1:1,n1=127.0.0.1:2,n3=127.0.0.1:3",
                "entry 2 \"n1=127.0.0.1:2\": node n1 is listed twice",
            ),
            (
                "n1=127.0.0.1:1,n2=127.0.0.1:1,n3=127.0.0.1:3",
                "entry 2 \"n2=127.0.0.1:1\": 127.0.0.1:1 is also node n1's address",
            ),
            (
                "n1=127.0.0.1:1,n2:127.0.0.1:2,n3=127.0.0.1:3",
                "entry 2 \"n2:127.0.0.1:2\": expected id=host:port",
            ),
            ("n1=127.0.0.1:1,,n3=127.0.0.1:3", "entry 2 \"\": is empty"),
            (
                "n1=127.0.0.1:1,n2=127.0.0.1,n3=127.0.0.1:3",
                "entry 2 \"n2=127.0.0.1\": expected host:port",
            ),
            (
                "n1=127.0.0.1:1,n2=127.0.0.1:99999,n3=127.0.0.1:3",
                "entry 2",
            ),
            ("n1=127.0.0.1:1,n2=127.0.0.1:0,n3=127.0.0.1:3", "port 0"),
            (
                "n1=127.0.0.1:1,n 2=127.0.0.1:2,n3=127.0.0.1:3",
                "node id \"n 2\"",
            ),
            (
                "n1=127.0.0.1:1,n2=no-such-host.invalid:2,n3=127.0.0.1:3",
                "cannot resolve",
            ),
        ] {
            let e = refused(&node(&[("FELIX_CLUSTER_PEERS", peers)]));
            assert!(
                e.contains("FELIX_CLUSTER_PEERS") && e.contains(needle),
                "{peers}: {e}"
            );
        }
    }

    #[test]
    fn ack_before_write_is_refused_on_a_cluster_node() {
        let e = refused(&node(&[("FELIX_ACK_BEFORE_WRITE", "true")]));
        assert!(
            e.contains("FELIX_ACK_BEFORE_WRITE cannot be used on a cluster node")
                && e.contains("FELIX_NODE_ID is set"),
            "{e}"
        );
    }

    #[test]
    fn a_node_id_needs_an_internal_bind_peers_and_peer_tls() {
        let e = refused(&[("FELIX_NODE_ID", "n1")]);
        assert!(
            e.contains("FELIX_NODE_ID is set")
                && e.contains(
                    "FELIX_INTERNAL_BIND (cluster.internal_bind) and FELIX_CLUSTER_PEERS \
                     (cluster.peers)"
                ),
            "{e}"
        );
        let e = refused(&[("FELIX_NODE_ID", "n1"), ("FELIX_CLUSTER_PEERS", PEERS3)]);
        assert!(
            e.contains("FELIX_INTERNAL_BIND (cluster.internal_bind) must be set"),
            "{e}"
        );
        let e = refused(&node(&[("FELIX_NODE_ID", "n/1")]));
        assert!(
            e.contains("FELIX_NODE_ID") && e.contains("[A-Za-z0-9._-]"),
            "{e}"
        );
        let long = "n".repeat(MAX_NODE_ID_LEN + 1);
        assert!(refused(&node(&[("FELIX_NODE_ID", &long)])).contains("1 to 64 bytes"));
        let e = refused(&node(&[("FELIX_INTERNAL_BIND", "here")]));
        assert!(e.contains("FELIX_INTERNAL_BIND=\"here\""), "{e}");
        let e = refused(&node(&[("FELIX_QUIC_BIND", "127.0.0.1:7101")]));
        assert!(
            e.contains("FELIX_INTERNAL_BIND") && e.contains("FELIX_QUIC_BIND"),
            "{e}"
        );
        let e = refused(&node(&[("FELIX_CLIENT_ADVERTISE_ADDR", "broker-1")]));
        assert!(
            e.contains("FELIX_CLIENT_ADVERTISE_ADDR") && e.contains("host:port"),
            "{e}"
        );

        // Peer mTLS: all three files, or none and the explicit opt-out.
        let mut bare = node(&[]);
        bare.retain(|(k, _)| *k != "FELIX_INTERNAL_ALLOW_UNAUTHENTICATED");
        let e = refused(&bare);
        for var in [
            "FELIX_INTERNAL_TLS_CERT",
            "FELIX_INTERNAL_TLS_KEY",
            "FELIX_INTERNAL_TLS_CA",
            "FELIX_INTERNAL_ALLOW_UNAUTHENTICATED",
        ] {
            assert!(e.contains(var), "{var}: {e}");
        }
        let e = refused(&node(&[("FELIX_INTERNAL_ALLOW_UNAUTHENTICATED", "false")]));
        assert!(e.contains("missing FELIX_INTERNAL_TLS_CERT"), "{e}");
        let e = refused(&node(&[(
            "FELIX_INTERNAL_ALLOW_UNAUTHENTICATED",
            "perhaps",
        )]));
        assert!(e.contains("FELIX_INTERNAL_ALLOW_UNAUTHENTICATED"), "{e}");
        let (cert, key, ca) = peer_tls_files("peer-tls");
        let mut with = bare.clone();
        with.push(("FELIX_INTERNAL_TLS_CERT", &cert));
        let e = refused(&with);
        assert!(
            e.contains("missing FELIX_INTERNAL_TLS_KEY, FELIX_INTERNAL_TLS_CA")
                && !e.contains("ALLOW_UNAUTHENTICATED"),
            "a partial set is a mistake, not a choice: {e}"
        );
        with.push(("FELIX_INTERNAL_TLS_KEY", &key));
        with.push(("FELIX_INTERNAL_TLS_CA", &ca));
        let (c, _) = cluster_of(&with).unwrap();
        let tls = c.peer_tls.expect("peer mTLS");
        assert_eq!(tls.identity.cert_chain.len(), 1);
        assert_eq!(tls.ca.len(), 1);
        let mut broken = with.clone();
        broken.retain(|(k, _)| *k != "FELIX_INTERNAL_TLS_CA");
        broken.push(("FELIX_INTERNAL_TLS_CA", &key));
        let e = refused(&broken);
        assert!(
            e.contains("FELIX_INTERNAL_TLS_CA") && e.contains("no certificate"),
            "{e}"
        );
        let mut missing = with.clone();
        missing.retain(|(k, _)| *k != "FELIX_INTERNAL_TLS_KEY");
        missing.push(("FELIX_INTERNAL_TLS_KEY", "/definitely/not/here"));
        let e = refused(&missing);
        assert!(
            e.contains("FELIX_INTERNAL_TLS_KEY=\"/definitely/not/here\""),
            "{e}"
        );
    }

    #[test]
    fn cluster_limits_and_the_lease_are_refused_outside_their_range() {
        for (var, value, needle) in [
            ("FELIX_DEFAULT_REPLICATION_FACTOR", "0", "1 to 5"),
            (
                "FELIX_DEFAULT_REPLICATION_FACTOR",
                "4",
                "at most the 3 nodes",
            ),
            ("FELIX_DEFAULT_REPLICATION_FACTOR", "6", "1 to 5"),
            (
                "FELIX_DEFAULT_REPLICATION_FACTOR",
                "many",
                "unsigned integer",
            ),
            ("FELIX_FORWARD_WINDOW", "0", "above zero"),
            ("FELIX_FORWARD_TIMEOUT_MS", "0", "above zero"),
            ("FELIX_MAX_FORWARD_CHANNELS", "0", "above zero"),
            ("FELIX_MAX_PEER_BACKLOG_BYTES", "-1", "unsigned integer"),
            ("FELIX_PEER_IDLE_TIMEOUT_MS", "0", "above zero"),
            ("FELIX_PEER_IDLE_TIMEOUT_MS", "86400001", "more than a day"),
            ("FELIX_PEER_MAX_STREAMS", "0", "above zero"),
            ("FELIX_PEER_MAX_STREAMS", "1025", "more than 1024"),
            ("FELIX_METADATA_LOG_COMPACT_BYTES", "0", "above zero"),
            ("FELIX_MAX_PENDING_LEASE_GRANTS", "0", "above zero"),
            (
                "FELIX_METADATA_LOG_COMPACT_BYTES",
                "lots",
                "unsigned integer",
            ),
            ("FELIX_LEASE_MS", "0", "above zero"),
            ("FELIX_LEASE_MS", "-5", "unsigned integer"),
            ("FELIX_QUORUM_TIMEOUT_MS", "0", "above zero"),
            ("FELIX_REPLICATION_WINDOW_BYTES", "0", "above zero"),
            (
                "FELIX_DEFAULT_REPLICATION_FACTOR",
                "2",
                "needs durable storage",
            ),
        ] {
            let e = refused(&node(&[(var, value)]));
            assert!(e.contains(var) && e.contains(needle), "{var}={value}: {e}");
        }
    }

    #[test]
    fn cluster_settings_without_a_node_id_are_refused_naming_them() {
        for (var, value) in [
            ("FELIX_INTERNAL_BIND", "127.0.0.1:7101"),
            ("FELIX_CLUSTER_PEERS", PEERS3),
            ("FELIX_CLIENT_ADVERTISE_ADDR", "a:1"),
            ("FELIX_LEASE_MS", "2001"),
            ("FELIX_INTERNAL_TLS_CERT", "/a"),
            ("FELIX_INTERNAL_TLS_KEY", "/a"),
            ("FELIX_INTERNAL_TLS_CA", "/a"),
            ("FELIX_INTERNAL_ALLOW_UNAUTHENTICATED", "true"),
            ("FELIX_DEFAULT_REPLICATION_FACTOR", "2"),
            ("FELIX_FORWARD_WINDOW", "8"),
            ("FELIX_FORWARD_TIMEOUT_MS", "5000"),
            ("FELIX_MAX_FORWARD_CHANNELS", "8"),
            ("FELIX_MAX_PEER_BACKLOG_BYTES", "8"),
            ("FELIX_PEER_IDLE_TIMEOUT_MS", "8000"),
            ("FELIX_PEER_MAX_STREAMS", "8"),
            ("FELIX_METADATA_LOG_COMPACT_BYTES", "4096"),
            ("FELIX_QUORUM_TIMEOUT_MS", "4000"),
            ("FELIX_REPLICATION_WINDOW_BYTES", "4096"),
        ] {
            let e = refused(&[(var, value)]);
            assert!(
                e.contains(var) && e.contains("only applies to a cluster node: set FELIX_NODE_ID"),
                "{var}: {e}"
            );
        }
        let e = refused(&[("FELIX_LEASE_MS", "5"), ("FELIX_FORWARD_WINDOW", "5")]);
        assert!(
            e.contains("FELIX_FORWARD_WINDOW, FELIX_LEASE_MS only apply"),
            "every one is named: {e}"
        );
        // Their defaults, spelled out (as --print-config does), are not a cluster.
        let c = from_vars(vars(&[
            ("FELIX_LEASE_MS", "2000"),
            ("FELIX_DEFAULT_REPLICATION_FACTOR", "1"),
            ("FELIX_INTERNAL_ALLOW_UNAUTHENTICATED", "false"),
        ]))
        .unwrap();
        assert_eq!(c.internal_bind, None);
        let caches = file(
            "caches-alone",
            "[[caches]]\ntenant = \"t1\"\nnamespace = \"n\"\ncache = \"c\"\nreplication_factor = 1",
        );
        let e = load(Some(&caches), vars(&[])).unwrap_err().0;
        assert!(
            e.contains("[[caches]] (t1/n/c)") && e.contains("FELIX_NODE_ID"),
            "{e}"
        );
        let replicated = file(
            "replicated-alone",
            "[[streams]]\ntenant = \"t1\"\nnamespace = \"n\"\nstream = \"s\"\nshards = 1\nreplication_factor = 2",
        );
        let e = load(Some(&replicated), vars(&[])).unwrap_err().0;
        assert!(
            e.contains("stream t1/n/s: replication_factor 2 needs a cluster"),
            "{e}"
        );
    }

    const CLUSTER_FILE: &str = r#"
quic_bind = "127.0.0.1:7001"

[durable]
storage_dir = "/var/lib/felix-test-n2"

[cluster]
node_id = "n2"
internal_bind = "127.0.0.1:7102"
peers = "n1=127.0.0.1:7101,n2=127.0.0.1:7102,n3=127.0.0.1:7103"
client_advertise_addr = "127.0.0.1:7001"
lease_ms = 3000
internal_allow_unauthenticated = true

[limits]
default_replication_factor = 2
forward_window = 64

[[streams]]
tenant = "t1"
namespace = "orders"
stream = "created"
shards = 6
replication_factor = 3
consistency = "quorum"

[[streams]]
tenant = "t1"
namespace = "orders"
stream = "plain"
shards = 1

[[caches]]
tenant = "t1"
namespace = "app"
cache = "sessions"
replication_factor = 3
shards = 2

[[caches]]
tenant = "t1"
namespace = "app"
cache = "small"
replication_factor = 1
"#;

    #[test]
    fn a_replicated_stream_on_a_node_without_durable_storage_is_refused() {
        let memory =
            CLUSTER_FILE.replace("[durable]\nstorage_dir = \"/var/lib/felix-test-n2\"\n", "");
        assert_ne!(memory, CLUSTER_FILE);
        let path = file("replicated-memory", &memory);
        let e = load(Some(&path), vars(&[])).unwrap_err().0;
        assert!(
            e.contains("stream t1/orders/created: replication_factor 3 needs durable storage"),
            "{e}"
        );
    }

    #[test]
    fn cluster_file_declarations_reach_the_engine_and_print_again() {
        let path = file("cluster", CLUSTER_FILE);
        let c = load(Some(&path), vars(&[])).unwrap();
        let printed = c.effective.render();
        let e = engine_of(c);
        let cluster = e.cluster.clone().unwrap();
        assert_eq!(cluster.node_id, "n2");
        assert_eq!(cluster.lease, Duration::from_secs(3));
        assert_eq!(cluster.default_replication_factor, 2);
        assert_eq!(cluster.forward_window, 64);
        assert_eq!(
            cluster.client_advertise_addr.as_deref(),
            Some("127.0.0.1:7001")
        );
        assert!(cluster.place_streams_on_first_use, "the default");
        let off = load(
            Some(&path),
            vars(&[("FELIX_PLACE_STREAMS_ON_FIRST_USE", "false")]),
        )
        .unwrap();
        assert!(!engine_of(off).cluster.unwrap().place_streams_on_first_use);
        let s = &e.declared_streams;
        assert_eq!(
            (s[0].shards, s[0].replication_factor, s[0].consistency),
            (6, 3, Consistency::Quorum)
        );
        assert_eq!(
            (s[1].replication_factor, s[1].consistency),
            (1, Consistency::Leader),
            "defaults"
        );
        let d = &cluster.declared_caches;
        assert_eq!(
            (d[0].cache.as_str(), d[0].shards, d[0].replication_factor),
            ("sessions", 2, 3)
        );
        assert_eq!(
            (d[1].cache.as_str(), d[1].shards, d[1].replication_factor),
            ("small", 1, 1),
            "shards default to 1"
        );

        for expected in [
            "node_id = \"n2\"",
            "peers = \"n1=127.0.0.1:7101,n2=127.0.0.1:7102,n3=127.0.0.1:7103\"",
            "lease_ms = 3000",
            "default_replication_factor = 2",
            "forward_window = 64",
            "internal_allow_unauthenticated = true",
            "consistency = \"quorum\"",
            "replication_factor = 3",
            "cache = \"sessions\"",
            "# internal_tls_cert is unset",
        ] {
            assert!(printed.contains(expected), "{expected} not in\n{printed}");
        }
        let again = file("cluster-printed", &printed);
        let e2 = engine_of(load(Some(&again), vars(&[])).unwrap());
        assert_eq!(e2.declared_streams, e.declared_streams);
        assert_eq!(e2.cluster.unwrap().declared_caches, cluster.declared_caches);
    }

    #[test]
    fn bad_cluster_declarations_in_the_file_are_refused_with_their_name() {
        let node = "[cluster]\nnode_id = \"n1\"\ninternal_bind = \"127.0.0.1:7101\"\n\
                    peers = \"n1=127.0.0.1:7101,n2=127.0.0.1:7102,n3=127.0.0.1:7103\"\n\
                    internal_allow_unauthenticated = true\n";
        let stream =
            "[[streams]]\ntenant = \"t1\"\nnamespace = \"n\"\nstream = \"s\"\nshards = 1\n";
        let cache = "[[caches]]\ntenant = \"t1\"\nnamespace = \"n\"\ncache = \"c\"\n";
        for (text, needle) in [
            (
                format!("{node}{stream}replication_factor = 0"),
                "`streams[0].replication_factor`",
            ),
            (
                format!("{node}{stream}replication_factor = 6"),
                "expected 1 to 5, found 6",
            ),
            (
                format!("{node}{stream}replication_factor = 4"),
                "stream t1/n/s: replication_factor 4 is more than the 3 nodes",
            ),
            (
                format!("{node}{stream}consistency = \"all\""),
                "`streams[0].consistency`",
            ),
            (
                format!("{node}{stream}consistency = 1"),
                "expected \"leader\" or \"quorum\"",
            ),
            (format!("{node}{cache}"), "`caches[0].replication_factor`"),
            (
                format!("{node}{cache}replication_factor = 0"),
                "expected 1 to 5",
            ),
            (
                format!("{node}{cache}replication_factor = 4"),
                "cache t1/n/c: replication_factor 4",
            ),
            (
                format!("{node}{cache}replication_factor = 1\nshards = 0"),
                "`caches[0].shards`",
            ),
            (
                format!("{node}{cache}replication_factor = 1\nttl = 3"),
                "`caches[0].ttl`",
            ),
            (
                format!(
                    "{node}[[caches]]\nnamespace = \"n\"\ncache = \"c\"\nreplication_factor = 1"
                ),
                "`caches[0].tenant`",
            ),
            (format!("caches = 3\n{node}"), "expected [[caches]] tables"),
            (format!("{node}node_name = \"x\""), "`cluster.node_name`"),
            (format!("{node}lease_ms = \"long\""), "`cluster.lease_ms`"),
        ] {
            let path = file("bad-cluster", &text);
            let e = load(Some(&path), vars(&[])).unwrap_err();
            assert!(e.0.contains(needle), "{text:?}: {e}");
        }
    }
}
