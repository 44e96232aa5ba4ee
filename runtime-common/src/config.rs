//! The broker's configuration from the environment, read in one place.
//!
//! | Variable | Meaning | Default |
//! | --- | --- | --- |
//! | `FELIX_QUIC_BIND` | UDP address to listen on | `127.0.0.1:5000` |
//! | `FELIX_TLS_CERT`, `FELIX_TLS_KEY` | PEM certificate chain and key (both or neither) | a generated CA + leaf |
//! | `FELIX_TLS_CERT_EXPORT` | where to write the generated CA's PEM | not written |
//! | `FELIX_AUTH_JWKS_FILE` | JWKS document verifying tokens | dev mode |
//! | `FELIX_DEV_TOKEN_EXPORT` | where dev mode writes its token | not written |
//! | `FELIX_DURABLE_STORAGE_DIR` | durable streams and caches live here | in memory |
//! | `FELIX_DURABLE_FSYNC_MODE` | `none`, `periodic` or `on_commit` | `periodic` |
//! | `FELIX_DURABLE_FSYNC_INTERVAL_MS` | the periodic fsync interval | 250 |
//! | `FELIX_DURABLE_RETENTION_BYTES` | keep at most this much per shard (whole segments) | unbounded |
//! | `FELIX_DURABLE_RETENTION_SECONDS` | drop segments whose newest record is older | unbounded |
//! | `FELIX_DURABLE_SEGMENT_MAX_BYTES` | roll a shard's log to a new segment at this size | 64 MiB |
//! | `FELIX_ACK_ON_COMMIT` | answer every acked publish after its write, with its offset | `false` |
//! | `FELIX_GROUP_*` | consumer-group limits (see `config/groups.rs`) | docs/groups.md |
//!
//! and one variable per engine limit, listed in [`ENGINE_VARS`] (for example
//! `FELIX_PUBLISH_WINDOW`, `FELIX_AUTH_TIMEOUT_MS`, `FELIX_IDLE_CONNECTION_REAP_MS`).
//! Unknown `FELIX_*` variables are ignored, so one environment can serve several versions.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use felix_engine::{EngineConfig, FsyncPolicy, DEFAULT_FSYNC_INTERVAL};

use crate::BrokerOptions;

mod groups;

/// The listen address when `FELIX_QUIC_BIND` is unset.
pub const DEFAULT_QUIC_BIND: &str = "127.0.0.1:5000";

/// A configuration the binary can run.
pub struct Config {
    /// What to start.
    pub options: BrokerOptions,
    /// Write the CA PEM here once listening (`FELIX_TLS_CERT_EXPORT`).
    pub tls_cert_export: Option<PathBuf>,
    /// Write the dev token here once listening (`FELIX_DEV_TOKEN_EXPORT`).
    pub dev_token_export: Option<PathBuf>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("options", &self.options)
            .field("tls_cert_export", &self.tls_cert_export)
            .field("dev_token_export", &self.dev_token_export)
            .finish()
    }
}

/// A variable that could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

type Setter = fn(&mut EngineConfig, u64) -> Result<(), String>;

fn to<T: TryFrom<u64>>(v: u64) -> Result<T, String> {
    T::try_from(v).map_err(|_| format!("{v} is out of range"))
}

fn ms(v: u64) -> Result<Duration, String> {
    Ok(Duration::from_millis(v))
}

/// A setter for one field through a conversion.
macro_rules! set {
    ($field:ident, $conv:expr) => {
        |c: &mut EngineConfig, v: u64| {
            c.$field = $conv(v)?;
            Ok(())
        }
    };
}

/// Engine limits settable from the environment: names (first is canonical, the rest are
/// aliases the reference broker uses), and what each sets. Values are unsigned integers.
#[rustfmt::skip]
pub const ENGINE_VARS: &[(&[&str], Setter)] = &[
    (&["FELIX_PUBLISH_WINDOW", "FELIX_BROKER_PUBLISH_WINDOW"], set!(publish_window, to)),
    (&["FELIX_AUTH_TIMEOUT_MS"], set!(auth_timeout, ms)),
    (&["FELIX_IDLE_CONNECTION_REAP_MS"], set!(idle_connection_reap, ms)),
    (&["FELIX_QUIC_IDLE_TIMEOUT_MS"], set!(quic_idle_timeout, ms)),
    (&["FELIX_MAX_CLIENT_CONNECTIONS"], set!(max_connections, to)),
    (&["FELIX_MAX_CONCURRENT_BIDI_STREAMS"], set!(max_concurrent_bidi_streams, to)),
    (&["FELIX_PREAUTH_MAX_STREAMS_PER_CONN"], set!(preauth_max_streams_per_connection, to)),
    (&["FELIX_MAX_SUBSCRIPTIONS_PER_CONNECTION"], set!(max_subscriptions_per_connection, to)),
    (&["FELIX_MAX_FRAME_BYTES"], set!(max_frame_bytes, to)),
    (&["FELIX_PREAUTH_MAX_FRAME_BYTES"], set!(preauth_max_frame_bytes, to)),
    (&["FELIX_MAX_CONNECTION_BUFFERED_BYTES"], set!(max_connection_buffered_bytes, to)),
    (&["FELIX_STREAM_RECV_WINDOW"], set!(stream_receive_window, to)),
    (&["FELIX_CONN_RECV_WINDOW"], set!(connection_receive_window, to)),
    (&["FELIX_SEND_WINDOW"], set!(send_window, to)),
    (&["FELIX_DEFAULT_SHARDS"], set!(default_shards, to)),
    (&["FELIX_MAX_STREAMS"], set!(max_streams, to)),
    (&["FELIX_SUBSCRIBER_QUEUE_CAPACITY"], set!(subscriber_queue_capacity, to)),
    (&["FELIX_SUBSCRIBER_QUEUE_CAPACITY_MAX"], set!(subscriber_queue_capacity_max, to)),
    (&["FELIX_EVENT_BATCH_MAX_RECORDS", "FELIX_EVENT_BATCH_MAX_EVENTS"], set!(event_batch_max_records, to)),
    (&["FELIX_EVENT_BATCH_MAX_BYTES"], set!(event_batch_max_bytes, to)),
    (&["FELIX_CACHE_MAX_KEY_BYTES"], set!(cache_max_key_bytes, to)),
    (&["FELIX_CACHE_MAX_VALUE_BYTES"], set!(cache_max_value_bytes, to)),
    (&["FELIX_CACHE_MAX_TOTAL_BYTES"], set!(cache_max_total_bytes, to)),
];

/// Reads the process environment.
pub fn from_env() -> Result<Config, ConfigError> {
    from_vars(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
}

/// Reads configuration through `get` (the environment, or a map in tests). Files named by
/// variables are read here.
pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let bind_text = get("FELIX_QUIC_BIND").unwrap_or_else(|| DEFAULT_QUIC_BIND.to_owned());
    let bind: SocketAddr = bind_text
        .parse()
        .map_err(|e| ConfigError(format!("FELIX_QUIC_BIND={bind_text:?}: {e}")))?;
    let read = |var: &str, path: &str| {
        std::fs::read(path).map_err(|e| ConfigError(format!("{var}={path:?}: {e}")))
    };

    let mut options = BrokerOptions::new(bind);
    options.tls_pem = match (get("FELIX_TLS_CERT"), get("FELIX_TLS_KEY")) {
        (Some(cert), Some(key)) => {
            Some((read("FELIX_TLS_CERT", &cert)?, read("FELIX_TLS_KEY", &key)?))
        }
        (None, None) => None,
        _ => {
            return Err(ConfigError(
                "set both FELIX_TLS_CERT and FELIX_TLS_KEY, or neither".into(),
            ))
        }
    };
    options.jwks = match get("FELIX_AUTH_JWKS_FILE") {
        Some(path) => Some(read("FELIX_AUTH_JWKS_FILE", &path)?),
        None => None,
    };

    durable_from_vars(&get, &mut options)?;

    let mut settings: Vec<(Setter, u64)> = Vec::new();
    for (names, setter) in ENGINE_VARS {
        let Some((name, text)) = names.iter().find_map(|n| get(n).map(|v| (*n, v))) else {
            continue;
        };
        let value: u64 = text
            .trim()
            .parse()
            .map_err(|_| ConfigError(format!("{name}={text:?} is not an unsigned integer")))?;
        // Apply once now to report range errors at start, not inside the engine.
        let mut probe = probe_config();
        setter(&mut probe, value).map_err(|e| ConfigError(format!("{name}: {e}")))?;
        settings.push((*setter, value));
    }
    if !settings.is_empty() {
        options = options.configure_engine(move |c| {
            for (setter, value) in settings {
                let _ = setter(c, value);
            }
        });
    }

    Ok(Config {
        options,
        tls_cert_export: get("FELIX_TLS_CERT_EXPORT").map(PathBuf::from),
        dev_token_export: get("FELIX_DEV_TOKEN_EXPORT").map(PathBuf::from),
    })
}

/// The `FELIX_DURABLE_*` variables and `FELIX_ACK_ON_COMMIT`.
fn durable_from_vars(
    get: &impl Fn(&str) -> Option<String>,
    options: &mut BrokerOptions,
) -> Result<(), ConfigError> {
    let number = |name: &str| -> Result<Option<u64>, ConfigError> {
        get(name)
            .map(|text| {
                text.trim()
                    .parse::<u64>()
                    .map_err(|_| ConfigError(format!("{name}={text:?} is not an unsigned integer")))
            })
            .transpose()
    };
    options.storage_dir = get("FELIX_DURABLE_STORAGE_DIR").map(PathBuf::from);
    let interval = number("FELIX_DURABLE_FSYNC_INTERVAL_MS")?
        .map_or(DEFAULT_FSYNC_INTERVAL, Duration::from_millis);
    if let Some(mode) = get("FELIX_DURABLE_FSYNC_MODE") {
        options.durable.fsync = FsyncPolicy::parse(&mode, interval)
            .map_err(|e| ConfigError(format!("FELIX_DURABLE_FSYNC_MODE: {e}")))?;
    } else if interval.is_zero() {
        return Err(ConfigError(
            "FELIX_DURABLE_FSYNC_INTERVAL_MS must be above zero".into(),
        ));
    } else {
        options.durable.fsync = FsyncPolicy::Periodic(interval);
    }
    options.durable.retention_bytes = number("FELIX_DURABLE_RETENTION_BYTES")?;
    options.durable.retention_age =
        number("FELIX_DURABLE_RETENTION_SECONDS")?.map(Duration::from_secs);
    if let Some(bytes) = number("FELIX_DURABLE_SEGMENT_MAX_BYTES")? {
        if bytes == 0 {
            return Err(ConfigError(
                "FELIX_DURABLE_SEGMENT_MAX_BYTES must be above zero".into(),
            ));
        }
        options.durable.segment_max_bytes = bytes;
    }
    groups::groups_from_vars(&number, &mut options.durable.groups)?;
    if let Some(text) = get("FELIX_ACK_ON_COMMIT") {
        options.durable.ack_on_commit = match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => true,
            "false" | "0" | "no" | "off" => false,
            _ => {
                return Err(ConfigError(format!(
                    "FELIX_ACK_ON_COMMIT={text:?}: expected true or false"
                )))
            }
        };
    }
    Ok(())
}

/// A throwaway config to try setters on.
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

    #[test]
    fn defaults_and_overrides() {
        let c = from_vars(vars(&[])).unwrap();
        assert_eq!(c.options.bind, DEFAULT_QUIC_BIND.parse().unwrap());
        assert!(c.options.tls_pem.is_none() && c.options.jwks.is_none());
        assert!(c.options.configure_engine.is_none());

        let c = from_vars(vars(&[
            ("FELIX_QUIC_BIND", "127.0.0.1:0"),
            ("FELIX_BROKER_PUBLISH_WINDOW", "64"),
            ("FELIX_IDLE_CONNECTION_REAP_MS", "1500"),
            ("FELIX_DEV_TOKEN_EXPORT", "/tmp/x"),
        ]))
        .unwrap();
        let mut engine = probe_config();
        (c.options.configure_engine.unwrap())(&mut engine);
        assert_eq!(engine.publish_window, 64);
        assert_eq!(engine.idle_connection_reap, Duration::from_millis(1500));
        assert_eq!(c.dev_token_export, Some(PathBuf::from("/tmp/x")));
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

        let c = from_vars(vars(&[
            ("FELIX_DURABLE_STORAGE_DIR", "/var/lib/felix"),
            ("FELIX_DURABLE_FSYNC_MODE", "on_commit"),
            ("FELIX_DURABLE_RETENTION_BYTES", "1048576"),
            ("FELIX_DURABLE_RETENTION_SECONDS", "3600"),
            ("FELIX_ACK_ON_COMMIT", "true"),
        ]))
        .unwrap();
        let d = &c.options.durable;
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
    }
}
