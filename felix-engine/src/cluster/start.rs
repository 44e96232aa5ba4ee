//! Starting this node's part in the cluster: its configuration checked and turned into the
//! peer endpoint, the control plane's settings and the standing wishes (join, declare), and
//! raft started once the metadata log is replayed (or at once, without one).

use core::net::SocketAddr;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use felix_cluster::control::store::MetaStore;
use felix_cluster::control::{ControlConfig, ControlPlane};
use felix_cluster::forward::Forwards;
use felix_cluster::meta::{
    CacheSpec, Command, Consistency as MetaConsistency, Declarations, Metadata, ObjectKey,
    StreamSpec,
};
use felix_cluster::replication::promotion::LeaderShards;
use felix_cluster::{NodeId, Voters};
use tracing::warn;

use super::metalog::MetaLog;
use super::peers::{Identity, PeerCrypto, PeerLimits, PeerNet};
use super::{replicas, ClusterNode};
use crate::config::{ClusterConfig, Consistency, DeclaredStream};

fn declarations(streams: &[DeclaredStream], cfg: &ClusterConfig) -> Declarations {
    let mut d = Declarations::default();
    for s in streams {
        d.streams.insert(
            ObjectKey::new(&s.tenant, &s.namespace, &s.stream),
            StreamSpec {
                shards: s.shards,
                replication_factor: s.replication_factor,
                consistency: match s.consistency {
                    Consistency::Leader => MetaConsistency::Leader,
                    Consistency::Quorum => MetaConsistency::Quorum,
                },
                retention: felix_cluster::meta::Retention {
                    max_age_seconds: s.retention_max_age_seconds,
                    max_bytes: s.retention_max_bytes,
                },
                durable: true,
            },
        );
    }
    for c in &cfg.declared_caches {
        d.caches.insert(
            ObjectKey::new(&c.tenant, &c.namespace, &c.cache),
            CacheSpec {
                shards: c.shards,
                replication_factor: c.replication_factor,
            },
        );
    }
    d
}

impl ClusterNode {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cfg: &ClusterConfig,
        engine: &crate::config::EngineConfig,
        provider: Arc<rustls::crypto::CryptoProvider>,
        seed: &[u8; 32],
        metadata_log_compact_bytes: Option<u64>,
        now: Instant,
    ) -> Result<ClusterNode, String> {
        let voters = Voters::new(cfg.peers.iter().map(|p| NodeId::new(&p.node_id)).collect())
            .map_err(|e| format!("FELIX_CLUSTER_PEERS: {e}"))?;
        let me = NodeId::new(&cfg.node_id);
        if voters.raft_id(&me).is_none() {
            return Err(format!(
                "FELIX_CLUSTER_PEERS does not list this node ({})",
                cfg.node_id
            ));
        }
        let derived = crate::seed::derive(seed, b"felix cluster node");
        let storage_id: [u8; 16] = derived[..16].try_into().expect("16 bytes");
        let incarnation = u64::from_be_bytes(derived[16..24].try_into().expect("8 bytes"));
        let crypto = PeerCrypto {
            identity: cfg
                .peer_tls
                .as_ref()
                .map_or_else(|| engine.tls.clone(), |t| t.identity.clone()),
            ca: cfg.peer_tls.as_ref().map(|t| t.ca.clone()),
            provider,
        };
        let dial: BTreeMap<String, SocketAddr> = cfg
            .peers
            .iter()
            .map(|p| (p.node_id.clone(), p.addr))
            .collect();
        let cid = voters.cluster_id();
        let identity = Identity {
            cluster_id: cid.clone(),
            node_id: cfg.node_id.clone(),
            storage_id,
            incarnation,
        };
        let names = voters.names().iter().map(|n| n.0.clone()).collect();
        if cfg.forward_window == 0
            || cfg.max_forward_channels == 0
            || cfg.peer_max_streams == 0
            || cfg.max_pending_lease_grants == 0
            || cfg.forward_timeout.is_zero()
            || cfg.peer_idle_timeout.is_zero()
        {
            return Err(
                "forward_window, max_forward_channels, peer_max_streams, \
                 max_pending_lease_grants, forward_timeout and peer_idle_timeout must be above zero"
                    .into(),
            );
        }
        let limits = PeerLimits {
            backlog_bytes: cfg.max_peer_backlog_bytes,
            idle_timeout: cfg.peer_idle_timeout,
            max_streams: cfg.peer_max_streams,
            // Peer links carry replication: the client links' datagram sizes (checked by
            // the engine before this) and GSO batches serve them the same way.
            mtu_upper_bound: engine.mtu_upper_bound,
            initial_mtu: engine.initial_mtu,
            max_udp_payload_size: engine.max_udp_payload_size,
            max_gso_segments: engine.max_gso_segments,
        };
        let net = PeerNet::new(identity, names, dial, &crypto, limits, seed, now)?;
        let control_seed = u64::from_be_bytes(derived[24..32].try_into().expect("8 bytes"));
        let raft_ids = voters.raft_ids();
        let blank = Metadata::new(voters.names().to_vec());
        let mut control_cfg = ControlConfig::new(me.clone(), voters, control_seed, cfg.lease);
        control_cfg.max_pending_grants = cfg.max_pending_lease_grants;
        if cfg.canary == crate::config::ReplicationCanary::AbandonOnSilence {
            control_cfg.leader_shards = LeaderShards::AbandonOnSilence;
        }
        if cfg.leader_quiet_after.is_zero() {
            return Err("leader_quiet_after must be above zero".into());
        }
        let storage_hex: String = storage_id.iter().map(|b| format!("{b:02x}")).collect();
        let wishes = vec![
            Command::Join {
                node: me.clone(),
                client_addr: cfg.client_advertise_addr.clone(),
                storage_id: storage_hex,
                durable: metadata_log_compact_bytes.is_some(),
            },
            Command::Declare {
                node: me.clone(),
                declarations: declarations(&engine.declared_streams, cfg),
            },
        ];
        let metalog =
            metadata_log_compact_bytes.map(|b| MetaLog::open(raft_ids.clone(), b, storage_id));
        let mut node = ClusterNode {
            // Channel numbers name forwards on the leaders (the high half of forward ids):
            // a restarted node starts where its last process is unlikely to have been, so an
            // answer a leader still owes that process never matches one of this one's.
            forwards: Forwards::new(cfg.forward_window, cfg.forward_timeout, incarnation as u32),
            done: Default::default(),
            inbound: Default::default(),
            metadata_changed: false,
            max_forward_channels: cfg.max_forward_channels,
            cluster_id: cid,
            me,
            net,
            control: None,
            starting: Some((control_cfg, wishes)),
            blank,
            metalog,
            refusal: None,
            warned_declarations: Vec::new(),
            caught_up: false,
            default_replication_factor: cfg.default_replication_factor.max(1),
            place_streams_on_first_use: cfg.place_streams_on_first_use,
            storage_id,
            lease: felix_cluster::replication::holder::LeaseHolder::new(
                felix_cluster::replication::lease::LeaseTerms::for_lease(
                    cfg.lease.as_millis() as u64
                ),
                now,
            ),
            replicas: replicas::Replicas::new(
                felix_cluster::replication::leader::LeaderSettings {
                    window_bytes: cfg.replication_window_bytes,
                    max_ship_bytes: 1 << 20,
                    quorum_timeout: cfg.quorum_timeout,
                    resend_after: replicas::REPLICATION_RETRY * 5,
                },
                metadata_log_compact_bytes.is_some(),
                cfg.leader_quiet_after,
            ),
            replicas_changed: true,
            deleted_here: Default::default(),
            old_lives: BTreeMap::new(),
            removals_done: 0,
            canary: cfg.canary,
            writes_served: BTreeMap::new(),
        };
        if node.metalog.is_none() {
            node.start_control(MetaStore::new(raft_ids), now);
        }
        node.pump(now);
        Ok(node)
    }

    /// Starts raft from `store` (replayed, or blank) with this node's standing wishes.
    pub(super) fn start_control(&mut self, store: MetaStore, now: Instant) {
        let Some((cfg, mut wishes)) = self.starting.take() else {
            return;
        };
        if let Some(log) = &self.metalog {
            // A durable node announces the identity its disk keeps, not this process's.
            let kept: String = log
                .storage_id()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            for w in &mut wishes {
                if let Command::Join { storage_id, .. } = w {
                    *storage_id = kept.clone();
                }
            }
        }
        let mut control = ControlPlane::new(cfg, store, now);
        // A refusal inside a replayed snapshot is not applied again: read it from the state.
        if let Some(reason) = control.metadata().refused.get(&self.me) {
            warn!(%reason, "the cluster refused this node's declarations");
            self.refusal = Some(reason.clone());
        }
        for w in wishes {
            control.want(w, now);
        }
        self.control = Some(control);
    }

    /// The storage identity this node announces, in hex: its disk's when it has one.
    pub(super) fn storage_hex(&self) -> String {
        let id = self
            .metalog
            .as_ref()
            .map_or(self.storage_id, |l| l.storage_id());
        id.iter().map(|b| format!("{b:02x}")).collect()
    }
}
