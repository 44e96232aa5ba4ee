//! How an [`EngineConfig`] becomes each part's settings: the checks across fields, the
//! QUIC transport, the broker's config and storage, the capabilities offered in the
//! handshake, the sessions' limits, and what a cluster node is built with beyond its
//! `ClusterConfig` (the peer links' crypto, where its metadata log lives). Plain functions, so [`Engine::new`] only assembles;
//! a refusal is the message `Engine::new` returns as `EngineError::Config`.
//!
//! [`Engine::new`]: crate::Engine::new

use std::sync::Arc;

use felix_proto::negotiate::BrokerCapabilities;
use felix_proto::{Features, Flags};
use quinn_proto::{AckFrequencyConfig, IdleTimeout, MtuDiscoveryConfig, TransportConfig, VarInt};

use rustls::crypto::CryptoProvider;

use crate::broker::{BrokerConfig, DurableSettings, StreamKey};
use crate::config::{DurableConfig, EngineConfig, FsyncPolicy, MAX_MTU, MIN_MTU};
use crate::node::Limits;
use felix_storage::log::{FsyncMode, LogConfig};

/// Frame flags this broker decodes and produces in every mode. A durable broker adds 0x4000
/// (record timestamps on event batches). Not 0x0080 (the forwarded-ack owner hint: a single
/// broker never forwards) nor 0x2000 (the publisher on event batches): not served.
pub const SERVED_FLAGS: Flags = Flags(
    0x0001
        | 0x0002
        | 0x0004
        | 0x0008
        | 0x0010
        | 0x0020
        | 0x0040
        | 0x0100
        | 0x0200
        | 0x0400
        | 0x0800
        | 0x1000,
);

/// Features this broker answers in every mode. Nothing is advertised that is not served: no
/// REDIRECT (a single broker never redirects). Groups, watches, counters and the log reads
/// need durable storage: `DURABLE_FEATURES`, `DURABLE_CACHE_FEATURES`, `GROUP_FEATURES`.
pub const SERVED_FEATURES: Features = Features(
    Features::ERROR_CODES.0
        | Features::UNSUPPORTED.0
        | Features::PUBLISH_PIPELINE.0
        | Features::STREAM_PUBLISH_WINDOW.0
        | Features::CACHE_DELETE.0
        | Features::STREAM_SHARDS.0
        | Features::CACHE_SHARDS.0
        | Features::SHARD_OWNERS.0
        | Features::SUBSCRIBE_QUEUE.0
        | Features::TOPOLOGY.0
        | Features::IDEMPOTENT_PRODUCER.0
        | Features::SEQUENCE_REUSED.0
        | Features::CACHE_CONDITIONAL.0
        | Features::STREAM_DELETED.0,
);

/// Features served only with durable storage: they read or check a shard's log.
pub(crate) const DURABLE_FEATURES: Features = Features(
    Features::PUBLISH_CONDITIONAL.0
        | Features::ATOMIC_COMMIT.0
        | Features::STREAM_READ.0
        | Features::RECORD_TIMESTAMPS.0,
);

/// Cache features served only over a durable cache: a watch's offsets and a counter's sum
/// are log offsets and a fold over a log (docs/cache-features.md).
const DURABLE_CACHE_FEATURES: Features =
    Features(Features::CACHE_WATCH.0 | Features::CACHE_WATCH_RETAINED.0 | Features::COUNTERS.0);

/// The rules that span fields (each field's own range is checked where it is used).
pub(crate) fn check(config: &EngineConfig) -> Result<(), String> {
    if config.max_producers_per_tenant == 0 {
        return Err("max_producers_per_tenant must be at least 1".into());
    }
    if config.max_gso_segments == 0 {
        return Err("max_gso_segments must be at least 1".into());
    }
    if let Some(d) = &config.durable {
        if d.ack_before_write && (d.ack_on_commit || d.fsync == FsyncPolicy::OnCommit) {
            return Err(
                "ack_before_write cannot be combined with ack_on_commit or the on_commit fsync mode".into(),
            );
        }
        // On a cluster node a `quorum` publish would be answered on arrival, before any
        // follower holds it: the replication promise would be void.
        if d.ack_before_write && config.cluster.is_some() {
            return Err(
                "ack_before_write cannot be used on a cluster node (FELIX_ACK_BEFORE_WRITE \
                 with FELIX_NODE_ID): acks must wait for the write and for replication"
                    .into(),
            );
        }
    }
    Ok(())
}

/// The QUIC transport the client endpoint serves with, checked.
pub(crate) fn transport(config: &EngineConfig) -> Result<TransportConfig, String> {
    let mut transport = TransportConfig::default();
    datagram_sizes(config, &mut transport)?;
    transport
        .max_concurrent_bidi_streams(VarInt::from_u32(config.max_concurrent_bidi_streams))
        // The client opens no uni streams; events flow on ones we open.
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .stream_receive_window(VarInt::from_u32(config.stream_receive_window))
        .receive_window(VarInt::from_u32(config.connection_receive_window))
        .send_window(config.send_window)
        .max_idle_timeout(Some(
            IdleTimeout::try_from(config.quic_idle_timeout)
                .map_err(|_| "quic_idle_timeout is too large".to_owned())?,
        ))
        .keep_alive_interval(None)
        .datagram_receive_buffer_size(None);
    Ok(transport)
}

/// The datagram-size and acknowledgement settings of `config` on `transport`, checked.
fn datagram_sizes(config: &EngineConfig, transport: &mut TransportConfig) -> Result<(), String> {
    let range = MIN_MTU..=MAX_MTU;
    for (name, v) in [
        ("mtu_upper_bound", config.mtu_upper_bound),
        ("initial_mtu", config.initial_mtu),
        ("max_udp_payload_size", config.max_udp_payload_size),
    ] {
        if !range.contains(&v) {
            return Err(format!("{name} must be {MIN_MTU} to {MAX_MTU}, not {v}"));
        }
    }
    if config.initial_mtu > config.mtu_upper_bound {
        return Err(format!(
            "initial_mtu ({}) is above mtu_upper_bound ({})",
            config.initial_mtu, config.mtu_upper_bound
        ));
    }
    let mut mtu = MtuDiscoveryConfig::default();
    mtu.upper_bound(config.mtu_upper_bound);
    transport
        .initial_mtu(config.initial_mtu)
        .mtu_discovery_config(Some(mtu));
    // 1 is what a peer does unasked; only another threshold is worth a frame.
    if config.ack_eliciting_threshold != 1 {
        let mut ack = AckFrequencyConfig::default();
        ack.ack_eliciting_threshold(VarInt::from_u32(config.ack_eliciting_threshold))
            .max_ack_delay(Some(config.max_ack_delay));
        transport.ack_frequency_config(Some(ack));
    }
    Ok(())
}

/// The broker's settings.
pub(crate) fn broker_config(config: &EngineConfig) -> BrokerConfig {
    BrokerConfig {
        default_shards: config.default_shards,
        declared_streams: config
            .declared_streams
            .iter()
            .map(|d| (StreamKey::new(&d.tenant, &d.namespace, &d.stream), d.shards))
            .collect(),
        // Outside a cluster a declaration's retention is the stream's; in one, the
        // metadata's record is (a declaration only proposes it).
        declared_retention: config
            .declared_streams
            .iter()
            .filter(|_| config.cluster.is_none())
            .filter(|d| d.retention_max_bytes.is_some() || d.retention_max_age_seconds.is_some())
            .map(|d| {
                let key = StreamKey::new(&d.tenant, &d.namespace, &d.stream);
                let r = crate::broker::retention::StreamRetention {
                    max_bytes: d.retention_max_bytes,
                    max_age: d
                        .retention_max_age_seconds
                        .map(std::time::Duration::from_secs),
                };
                (key, r)
            })
            .collect(),
        routing_mapping: config.routing_mapping,
        max_streams: config.max_streams,
        subscriber_queue_capacity: config.subscriber_queue_capacity,
        subscriber_queue_capacity_max: config.subscriber_queue_capacity_max,
        event_batch_max_records: config.event_batch_max_records,
        event_batch_max_bytes: config.event_batch_max_bytes,
        cache_max_key_bytes: config.cache_max_key_bytes,
        cache_max_value_bytes: config.cache_max_value_bytes,
        cache_max_total_bytes: config.cache_max_total_bytes,
        max_owner_event_bytes: config.max_connection_event_bytes,
        state_max_bytes_per_shard: config.state_max_bytes_per_shard,
        cache_watch_queue_capacity: config.cache_watch_queue_capacity,
        durable_cache_max_logs: config.durable_cache_max_logs,
        counter_max_logs: config.counter_max_logs,
        durable_cache_max_keys: config.durable_cache_max_keys as u64,
        durable_cache_max_total_bytes: config.durable_cache_max_total_bytes,
        max_producers_per_tenant: config.max_producers_per_tenant,
    }
}

/// The storage settings a durable configuration gives the broker.
pub(crate) fn durable_settings(d: &DurableConfig) -> DurableSettings {
    let fsync = match d.fsync {
        FsyncPolicy::None => FsyncMode::None,
        FsyncPolicy::Periodic(iv) => FsyncMode::Periodic(iv),
        FsyncPolicy::OnCommit => FsyncMode::OnCommit,
    };
    DurableSettings {
        log: LogConfig {
            fsync,
            segment_max_bytes: d.segment_max_bytes,
            retention_bytes: d.retention_bytes,
            retention_age: d.retention_age,
            retention_check_interval: d.retention_check_interval,
            tail_cache_bytes: d.tail_cache_bytes,
            ..LogConfig::default()
        },
        // After the write unless the operator took the risk (`ack_before_write`, refused
        // with `on_commit` in `check`).
        ack_after_write: !d.ack_before_write,
        groups: d.groups.clone(),
    }
}

/// What the handshake offers: durable shards have offsets and stored times (acks can wait
/// for the write, subscriptions end with `subscription_lagged`, events carry their times);
/// a cluster member redirects readers, names the owner on forwarded acks, and ends a
/// reader whose shard's leadership moved with `shard_moved`.
pub(crate) fn capabilities(config: &EngineConfig) -> BrokerCapabilities {
    let mut capabilities = match &config.durable {
        None => BrokerCapabilities {
            flags: SERVED_FLAGS,
            features: SERVED_FEATURES,
            publish_window: config.publish_window,
        },
        Some(_) => BrokerCapabilities {
            flags: SERVED_FLAGS.union(Flags::EVENT_BATCH_TIMESTAMPS),
            features: SERVED_FEATURES
                .union(DURABLE_FEATURES)
                .union(Features::ACK_ON_COMMIT)
                .union(Features::SUBSCRIPTION_LAGGED)
                .union(DURABLE_CACHE_FEATURES)
                .union(crate::broker::groups::GROUP_FEATURES),
            publish_window: config.publish_window,
        },
    };
    if config.cluster.is_some() {
        capabilities.features = capabilities
            .features
            .union(Features::REDIRECT)
            .union(Features::SHARD_MOVED);
        capabilities.flags = capabilities.flags.union(Flags::BINARY_PUBLISH_ACK_OWNER);
    }
    capabilities
}

/// The sessions' limits.
pub(crate) fn limits(config: &EngineConfig) -> Limits {
    Limits {
        auth_timeout: config.auth_timeout,
        idle_connection_reap: config.idle_connection_reap,
        preauth_max_frame_bytes: config.preauth_max_frame_bytes,
        max_frame_bytes: config.max_frame_bytes,
        stream_answer_backlog: config.publish_window.max(1) as usize,
        read_chunk_bytes: config.read_chunk_bytes.max(1),
        max_subscriptions_per_connection: config.max_subscriptions_per_connection,
        preauth_max_streams_per_connection: config.preauth_max_streams_per_connection,
        max_connection_buffered_bytes: config.max_connection_buffered_bytes,
        max_buffered_bytes: config.max_buffered_bytes,
        max_connection_unwritten_bytes: config.max_connection_unwritten_bytes,
        value_reserve: value_reserve(config.cache_max_value_bytes),
    }
}

/// What a cache value not yet read counts for against the unwritten-bytes budget: the
/// largest value in base64 (4 bytes per 3, padded) plus room for the answer around it.
fn value_reserve(cache_max_value_bytes: usize) -> usize {
    cache_max_value_bytes / 3 * 4 + 4 + 256
}

/// File operations that may be in flight at once: one when nothing is durable (the walk
/// of an empty directory), and never none.
pub(crate) fn max_inflight_file_ops(config: &EngineConfig) -> usize {
    config
        .durable
        .as_ref()
        .map_or(1, |d| d.max_inflight_file_ops.max(1))
}

/// The crypto provider a cluster node's peer links use: the engine's, or ring's.
pub(crate) fn peer_crypto_provider(config: &EngineConfig) -> Arc<CryptoProvider> {
    config
        .crypto_provider
        .clone()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// A durable cluster node keeps its metadata log on disk beside its streams, compacted past
/// this many bytes; `None` keeps it in memory (no durable storage, or no cluster).
pub(crate) fn metadata_log(config: &EngineConfig) -> Option<u64> {
    let cluster = config.cluster.as_ref()?;
    config
        .durable
        .as_ref()
        .map(|_| cluster.metadata_log_compact_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AuthConfig, ClusterConfig};

    fn config() -> EngineConfig {
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec!["n1".to_owned()]).expect("params");
        let cert = params.self_signed(&key).expect("certificate");
        let tls = crate::tls::TlsIdentity {
            cert_chain: vec![cert.der().clone()],
            key: rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key"),
        };
        EngineConfig::new(tls, AuthConfig::Dev { seed: [7; 32] }, [1; 32])
    }

    fn cluster_config() -> ClusterConfig {
        ClusterConfig::new("n1", Vec::new())
    }

    #[test]
    fn value_reserve_covers_the_largest_value_in_base64() {
        // 3 bytes become 4; a partial last group is padded to 4 more.
        assert_eq!(value_reserve(0), 4 + 256);
        assert_eq!(value_reserve(3), 4 + 4 + 256);
        assert_eq!(value_reserve(4), 4 + 4 + 256);
        assert_eq!(value_reserve(1 << 20), (1 << 20) / 3 * 4 + 4 + 256);
        for n in [0usize, 1, 2, 3, 100, 1 << 20] {
            assert!(value_reserve(n) >= n.div_ceil(3) * 4, "{n}");
        }
    }

    #[test]
    fn capabilities_grow_with_durability_and_a_cluster() {
        let plain = config();
        let c = capabilities(&plain);
        assert_eq!((c.flags, c.features), (SERVED_FLAGS, SERVED_FEATURES));

        let durable = EngineConfig {
            durable: Some(DurableConfig::default()),
            ..config()
        };
        let d = capabilities(&durable);
        assert!(d.flags.contains(Flags::EVENT_BATCH_TIMESTAMPS));
        assert!(d.features.contains(DURABLE_CACHE_FEATURES));
        assert!(!d.features.contains(Features::REDIRECT));

        let cluster = EngineConfig {
            cluster: Some(cluster_config()),
            ..durable
        };
        let k = capabilities(&cluster);
        assert!(k.features.contains(
            d.features
                .union(Features::REDIRECT)
                .union(Features::SHARD_MOVED)
        ));
        assert!(k
            .flags
            .contains(d.flags.union(Flags::BINARY_PUBLISH_ACK_OWNER)));
    }

    #[test]
    fn ack_before_write_is_refused_with_on_commit_and_on_a_cluster() {
        let with = |d: DurableConfig, cluster: bool| EngineConfig {
            durable: Some(d),
            cluster: cluster.then(cluster_config),
            ..config()
        };
        let early = DurableConfig {
            ack_before_write: true,
            ..DurableConfig::default()
        };
        assert!(check(&with(early.clone(), false)).is_ok());
        assert!(check(&with(early.clone(), true)).is_err());
        let on_commit = DurableConfig {
            ack_on_commit: true,
            ..early.clone()
        };
        assert!(check(&with(on_commit, false)).is_err());
        let fsync_on_commit = DurableConfig {
            fsync: FsyncPolicy::OnCommit,
            ..early
        };
        assert!(check(&with(fsync_on_commit, false)).is_err());
    }
}
