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

use felix_engine::{DeclaredStream, EngineConfig, FsyncPolicy};
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
/// requires). Sections: `tls`, `auth`, `durable`, `groups`, `limits`; `[[streams]]` declares streams.
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
];

/// Sections of the file; every other table is refused.
const SECTIONS: &[&str] = &["tls", "auth", "durable", "groups", "limits"];
/// Keys of a `[[streams]]` entry.
const STREAM_KEYS: &[&str] = &["tenant", "namespace", "stream", "shards"];

/// Every setting's value (or `None`: unset) and its source, and the declared streams.
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    values: Vec<(Setting, Option<Value>, Source)>,
    streams: Vec<(DeclaredStream, Source)>,
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
                "\n[[streams]]  # {source}\ntenant = {}\nnamespace = {}\nstream = {}\nshards = {}\n",
                Value::from(d.tenant.as_str()),
                Value::from(d.namespace.as_str()),
                Value::from(d.stream.as_str()),
                d.shards
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
        .map(|s| {
            let v = match s.default {
                Default_::Unset => None,
                Default_::Int(n) => Some(int_value(n)),
                Default_::Bool(b) => Some(Value::Boolean(b)),
                Default_::Text(t) => Some(Value::from(t)),
                Default_::Engine(getter) => Some(int_value(getter(&probe))),
            };
            (*s, v, Source::Default)
        })
        .collect();
    let mut streams = Vec::new();

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
            let entries: Vec<(String, Value)> = match value {
                Value::Table(t) if SECTIONS.contains(&key.as_str()) => t
                    .into_iter()
                    .map(|(k, v)| (format!("{key}.{k}"), v))
                    .collect(),
                Value::Table(_) => {
                    return Err(ConfigError(format!(
                        "{}: unknown section (known: {}, [[streams]])",
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
    Ok(Effective { values, streams })
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
        out.push(DeclaredStream::new(
            text("tenant")?,
            text("namespace")?,
            text("stream")?,
            shards,
        ));
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

    durable(&name, &text, &int, &flag, &mut options)?;

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
    if !limits.is_empty() || client_ca.is_some() || require_alpn || !streams.is_empty() {
        options = options.configure_engine(move |c| {
            for (setter, value) in limits {
                let _ = setter(c, value);
            }
            if client_ca.is_some() {
                c.client_ca = client_ca;
            }
            c.require_alpn = require_alpn;
            c.declared_streams.extend(streams);
        });
    }

    Ok(Config {
        options,
        tls_cert_export: text("tls.cert_export").map(PathBuf::from),
        dev_token_export: text("auth.dev_token_export").map(PathBuf::from),
        runtime: text("runtime"),
        reload,
        effective,
    })
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
            ("[[streams]]\ntenant = \"t1\"\nnamespace = \"n\"\nstream = \"s\"\nshards = 2\ndurable = true", "durability is broker-wide"),
            ("[[streams]]\ntenant = \"t1\"\nnamespace = \"n\"\nstream = \"s\"", "`streams[0].shards`"),
            ("[[streams]]\ntenant = \"t1\"\nnamespace = \"n\"\nstream = \"s\"\nshards = 0", "`streams[0].shards`"),
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
}
