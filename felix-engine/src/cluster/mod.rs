//! This node's part in a cluster: the control plane (felix-cluster's raft-rs driver) over the
//! peer links (`peers.rs`), and the views of the metadata that sessions route by.
//!
//! Metadata is small and kept in memory. On a node with durable storage the raft log and its
//! snapshots are also on disk (`metalog.rs`): the control plane starts only once they are
//! replayed, and each record it asks for is confirmed only after its sync. Without durable
//! storage the log is memory only: a restarted node comes back blank, and the control
//! plane's disk guard keeps it from voting until it has caught up (docs/cluster.md).

pub(crate) mod abandon;
mod lease;
mod metalog;
pub(crate) mod objects;
pub(crate) mod observe;
mod peers;
mod replicas;

use core::net::SocketAddr;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use felix_cluster::control::store::MetaStore;
use felix_cluster::control::wire::{from_peer, to_peer};
use felix_cluster::control::{ControlConfig, ControlOutput, ControlPlane};
use felix_cluster::forward::{ForwardEnd, ForwardOutput, Forwards};
use felix_cluster::meta::{
    Applied, CacheSpec, Command, Consistency as MetaConsistency, Declarations, Metadata, ObjectKey,
    ObjectKind, ShardMeta, ShardRef, StreamSpec,
};
use felix_cluster::replication::promotion::LeaderShards;
use felix_cluster::routing::{judge_forward, ForwardVerdict, Owner};
use felix_cluster::{NodeId, Voters};
use felix_peer_proto::PeerMessage;
use felix_storage::ops::{FileCompletion, FileOp};
use tracing::{debug, info, warn};

use crate::config::{ClusterConfig, Consistency, DeclaredStream};
use crate::net::{Datagram, Transmit};
use crate::router::{ForwardOutcome, OwnerEntry, Router};
pub(crate) use metalog::METALOG_LOG;
use metalog::{Done, MetaLog};
use peers::{Identity, PeerCrypto, PeerEvent, PeerLimits, PeerNet};
pub(crate) use replicas::{CopyKind, LogView, ReplicaIo};

/// The engine's way to the cluster driver a [`Router`] wraps: sessions ask the router, and
/// cannot reach the driver without importing this trait from `cluster/` (which tidy refuses
/// them).
pub(crate) trait Wired {
    fn driver(&self) -> Option<&ClusterNode>;
    fn driver_mut(&mut self) -> Option<&mut ClusterNode>;
}

/// The witness [`Router::wired`] asks for: only `cluster/` can make one.
pub(crate) struct Wiring(());

impl Wired for Option<Router> {
    fn driver(&self) -> Option<&ClusterNode> {
        self.as_ref().map(|r| r.wired(Wiring(())))
    }

    fn driver_mut(&mut self) -> Option<&mut ClusterNode> {
        self.as_mut().map(|r| r.wired_mut(Wiring(())))
    }
}

/// Where a forward's answer goes: the client's session.
type SessionAt = (quinn_proto::ConnectionHandle, quinn_proto::StreamId);

/// A forward another node sent here.
pub(crate) struct Inbound {
    pub(crate) from: String,
    pub(crate) forward: felix_peer_proto::Forward,
}

pub(crate) struct ClusterNode {
    me: NodeId,
    /// Forwards this node sends to shard leaders (felix-cluster's `forward`).
    forwards: Forwards<SessionAt>,
    done: std::collections::VecDeque<(
        quinn_proto::ConnectionHandle,
        quinn_proto::StreamId,
        u64,
        ForwardOutcome,
    )>,
    inbound: std::collections::VecDeque<Inbound>,
    /// Set when metadata is applied; taken by the engine to resume requests waiting for it.
    metadata_changed: bool,
    pub(crate) max_forward_channels: usize,
    cluster_id: String,
    net: PeerNet,
    /// `None` while the metadata log is replayed; then `starting` holds what it needs.
    control: Option<ControlPlane>,
    starting: Option<(ControlConfig, Vec<Command>)>,
    /// What sessions see before the control plane runs: nothing placed, nobody joined.
    blank: Metadata,
    /// The metadata log on disk; `None` without durable storage.
    metalog: Option<MetaLog>,
    /// Why the cluster refused this node (a declaration it could never place): fatal.
    refusal: Option<String>,
    /// What this node's declarations differ in from the cluster's record, as last warned
    /// about: one warning per difference per process, however often a `Declare` of this
    /// node is applied (its own of this start, and older ones replayed from the log).
    warned_declarations: Vec<String>,
    /// Every copy placed here caught up with its leader once since this process started
    /// (`copies_caught_up`): readiness waits for it, and does not flap with later failovers.
    caught_up: bool,
    default_replication_factor: u8,
    /// `cluster.place_streams_on_first_use`.
    place_streams_on_first_use: bool,
    /// The identity of this node's disk (or of this process, without one), as announced.
    storage_id: [u8; 16],
    /// This node's shard leases (`lease.rs`).
    lease: felix_cluster::replication::holder::LeaseHolder,
    /// Its copies of replicated shards (`replicas.rs`).
    replicas: replicas::Replicas,
    /// Metadata or a copy's state changed: the copies are checked on the next drive.
    replicas_changed: bool,
    /// Streams the metadata deleted whose copies here the broker has yet to remove
    /// ([`ClusterNode::take_deleted_stream`]); while one is listed, no copy of that name is
    /// opened or served here, so a re-created stream never meets the old files.
    deleted_here: std::collections::BTreeSet<(ObjectKind, ObjectKey)>,
    /// Of those, the names found living again at start ([`Applied::Recreated`]), with the
    /// highest generation their deleted lives reached:
    /// only copies at or below it are removed, a later life's are kept.
    old_lives: BTreeMap<(ObjectKind, ObjectKey), u64>,
    /// How many such removals finished since start: what the admin API's delete waits on.
    removals_done: u64,
    /// A bug put back for the simulator's canaries.
    canary: crate::config::ReplicationCanary,
    /// Publishes served here as the leader, per stream shard: (generation, count). Read by
    /// the simulator's one-writer invariants (`observe.rs`).
    writes_served: BTreeMap<ShardRef, (u64, u64)>,
}

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
    fn start_control(&mut self, store: MetaStore, now: Instant) {
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
    fn storage_hex(&self) -> String {
        let id = self
            .metalog
            .as_ref()
            .map_or(self.storage_id, |l| l.storage_id());
        id.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The metadata as applied here (empty until the control plane runs).
    fn meta(&self) -> &Metadata {
        self.control.as_ref().map_or(&self.blank, |c| c.metadata())
    }

    /// The metadata log's next file op.
    pub(crate) fn poll_file_op(&mut self) -> Option<FileOp> {
        self.metalog.as_mut()?.poll_op()
    }

    /// A metadata log op completed: confirms records to raft, starts it once replayed.
    pub(crate) fn handle_file_completion(&mut self, now: Instant, c: FileCompletion) {
        let Some(log) = self.metalog.as_mut() else {
            return;
        };
        log.handle_completion(c);
        if let Some(store) = log.take_loaded() {
            self.start_control(store, now);
        }
        self.pump(now);
    }

    /// Confirmations from the metadata log, and a compaction once its log is long enough.
    fn drain_metalog(&mut self) -> bool {
        let (Some(log), Some(control)) = (self.metalog.as_mut(), self.control.as_mut()) else {
            return false;
        };
        let mut any = false;
        while let Some(done) = log.poll_done() {
            any = true;
            match done {
                Done::Persisted(ready) => control.persisted(ready),
                Done::Compacted(c) => control.compacted(&c),
            }
        }
        if log.wants_compaction() {
            if let Some(c) = control.compaction() {
                log.compact(c);
            }
        }
        any
    }

    /// The metadata log is replayed (always true without durable storage).
    pub(crate) fn storage_ready(&self) -> bool {
        self.metalog.as_ref().is_none_or(|l| l.is_open())
    }

    /// Why the metadata log cannot go on (a corrupt snapshot, a failed write).
    pub(crate) fn storage_error(&self) -> Option<&str> {
        self.metalog.as_ref().and_then(|l| l.fatal())
    }

    /// No metadata log op queued or in flight.
    pub(crate) fn storage_idle(&self) -> bool {
        self.metalog.as_ref().is_none_or(|l| l.is_idle())
    }

    pub(crate) fn handle_datagram(&mut self, now: Instant, datagram: Datagram) {
        self.net.handle_datagram(now, datagram);
        self.pump(now);
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.forwards.handle_timeout(now);
        self.drain_forwards();
        self.net.handle_timeout(now);
        if let Some(c) = self.control.as_mut() {
            if c.poll_timeout() <= now {
                c.handle_timeout(now);
            }
        }
        self.renew_lease(now);
        self.pump(now);
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let forwards = self.forwards.poll_timeout();
        let control = self.control.as_ref().map(|c| c.poll_timeout());
        let lease = self.control.is_some().then(|| self.lease.poll_timeout());
        let replication = self.replication_timeout();
        [
            self.net.poll_timeout(),
            forwards,
            control,
            lease,
            replication,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// A channel number for one client session's forwards (the high half of their ids).
    pub(crate) fn new_channel(&mut self) -> u32 {
        self.forwards.new_channel()
    }

    /// The scope a forward names: the shard, at the generation this node routed by.
    pub(crate) fn scope(
        &self,
        cache: bool,
        names: (&str, &str, &str),
        shard: u32,
        generation: u64,
    ) -> felix_peer_proto::ShardScope {
        felix_peer_proto::ShardScope {
            shard: felix_peer_proto::ShardId {
                cluster_id: self.cluster_id.clone(),
                kind: if cache {
                    felix_peer_proto::ShardKind::Cache
                } else {
                    felix_peer_proto::ShardKind::Stream
                },
                tenant: names.0.to_owned(),
                namespace: names.1.to_owned(),
                name: names.2.to_owned(),
                shard,
            },
            generation,
        }
    }

    /// Sends a forward to `to`; with `answer_to`, its answer is owed to that session. A
    /// forward owed an answer takes a place in `to`'s window; with the window full, or
    /// others already waiting, it waits in order (so a session's forwards keep their order).
    pub(crate) fn forward(
        &mut self,
        now: Instant,
        to: &NodeId,
        forward: felix_peer_proto::Forward,
        answer_to: Option<(quinn_proto::ConnectionHandle, quinn_proto::StreamId)>,
    ) {
        self.forwards.forward(now, to, forward, answer_to);
        self.drain_forwards();
        self.pump(now);
    }

    /// Carries out what the forwards decided: messages to peers, ended forwards to the
    /// sessions that wait for them.
    fn drain_forwards(&mut self) {
        while let Some(out) = self.forwards.poll_output() {
            match out {
                ForwardOutput::Send { to, forward } => {
                    self.net.send(to.as_str(), &PeerMessage::Forward(forward));
                }
                ForwardOutput::Ended {
                    owner: (ch, stream),
                    forward_id,
                    end,
                } => {
                    let outcome = match end {
                        ForwardEnd::Answered(frame) => ForwardOutcome::Answered(frame),
                        ForwardEnd::Refused { by, refusal } => ForwardOutcome::Refused(
                            refusal.code,
                            format!("{by} refused the forwarded request"),
                        ),
                        ForwardEnd::Unanswered { to, after } => ForwardOutcome::Refused(
                            felix_proto::ErrorCode::Unacknowledged,
                            format!(
                                "no answer from {to} within {after:?}; the request may or may \
                                 not have been applied"
                            ),
                        ),
                        ForwardEnd::NotTaken { to, after } => ForwardOutcome::Refused(
                            felix_proto::ErrorCode::ShardUnavailable,
                            format!(
                                "{to} did not take the forwarded request within {after:?} (its \
                                 forward window stayed full); it was not applied"
                            ),
                        ),
                    };
                    self.done.push_back((ch, stream, forward_id, outcome));
                }
            }
        }
    }

    /// Peer links up now, and messages dropped for a full peer backlog.
    pub(crate) fn peer_link_stats(&self) -> (u64, u64) {
        (self.net.ready_links() as u64, self.net.backlog_dropped)
    }

    /// Forwards waiting for a place in a peer's window (all peers).
    pub(crate) fn waiting_forwards(&self) -> usize {
        self.forwards.waiting_forwards()
    }

    /// Registers that a session's channel is being opened on `to` with `open` (its
    /// `auth`), so that the channel can be reopened and closed from here.
    pub(crate) fn channel_opened(
        &mut self,
        channel: u32,
        owner: (quinn_proto::ConnectionHandle, quinn_proto::StreamId),
        to: &NodeId,
        open: &felix_peer_proto::Forward,
    ) {
        self.forwards.channel_opened(channel, owner, to, open);
    }

    /// A client session ended: close its channel on every node it was opened on (an
    /// opening forward with an empty frame), so no virtual session is left there.
    pub(crate) fn session_ended(
        &mut self,
        now: Instant,
        owner: (quinn_proto::ConnectionHandle, Option<quinn_proto::StreamId>),
    ) {
        let closes = self
            .forwards
            .sessions_ended(|o| o.0 == owner.0 && owner.1.is_none_or(|s| s == o.1));
        for (to, close) in closes {
            self.forward(now, &to, close, None);
        }
    }

    /// Answers a forward `from` sent.
    pub(crate) fn answer(&mut self, now: Instant, from: &str, message: PeerMessage) {
        self.net.reply(from, &message);
        self.pump(now);
    }

    /// Answers or forwards are waiting for the engine.
    pub(crate) fn has_work(&self) -> bool {
        !self.done.is_empty() || !self.inbound.is_empty()
    }

    /// Forwards this node sent that have ended.
    pub(crate) fn poll_done(
        &mut self,
    ) -> Option<(
        quinn_proto::ConnectionHandle,
        quinn_proto::StreamId,
        u64,
        ForwardOutcome,
    )> {
        self.done.pop_front()
    }

    /// Forwards other nodes sent here.
    pub(crate) fn poll_inbound(&mut self) -> Option<Inbound> {
        self.inbound.pop_front()
    }

    /// What this node does with a forward, by its metadata (felix-cluster's `routing`
    /// decides).
    pub(crate) fn judge_forward(&self, scope: &felix_peer_proto::ShardScope) -> ForwardVerdict {
        let meta = self.scope_meta(scope);
        let owner = meta.map_or(Owner::Unassigned, |m| self.owner_of(m));
        judge_forward(&owner, meta.map(|m| m.generation), scope.generation)
    }

    fn scope_meta(&self, scope: &felix_peer_proto::ShardScope) -> Option<&ShardMeta> {
        let s = &scope.shard;
        let key = ObjectKey::new(&s.tenant, &s.namespace, &s.name);
        match s.kind {
            felix_peer_proto::ShardKind::Cache | felix_peer_proto::ShardKind::CacheCounters => {
                self.meta().caches.get(&key)?.shards.get(s.shard as usize)
            }
            felix_peer_proto::ShardKind::Stream | felix_peer_proto::ShardKind::StreamGroups => {
                self.stream_shards_meta(&key)?.get(s.shard as usize)
            }
        }
    }

    pub(crate) fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        if let Some(t) = self.net.poll_transmit(now, buf) {
            return Some(t);
        }
        // Messages queued outside a turn (a session that ended) go out on this one.
        self.pump(now);
        self.net.poll_transmit(now, buf)
    }

    /// Moves messages between the links and the control plane until neither has more.
    fn pump(&mut self, now: Instant) {
        for _ in 0..64 {
            let mut any = false;
            while let Some(event) = self.net.poll_event() {
                any = true;
                let (from, message) = match event {
                    PeerEvent::Message { from, message } => (from, *message),
                    PeerEvent::Connected { from } => {
                        if let Some(c) = self.control.as_mut() {
                            c.peer_reconnected(&NodeId::new(from));
                        }
                        continue;
                    }
                };
                match message {
                    PeerMessage::Raft(m) => {
                        // Before the log is replayed raft is not running: dropped, as raft
                        // tolerates any lost message.
                        if let (Some(m), Some(c)) = (from_peer(m), self.control.as_mut()) {
                            c.handle_message(now, &NodeId::new(from), m);
                        }
                    }
                    PeerMessage::Forward(forward) => {
                        self.inbound.push_back(Inbound { from, forward });
                    }
                    PeerMessage::ForwardAnswer(a) => {
                        self.forwards.answer(now, a);
                        self.drain_forwards();
                    }
                    PeerMessage::ForwardRefused(r) => {
                        let channel_unknown = r.code == felix_proto::ErrorCode::Unauthenticated;
                        self.forwards.refused(now, r, channel_unknown);
                        self.drain_forwards();
                    }
                    PeerMessage::LeaseRenew(r) => self.on_lease_renew(now, &from, r),
                    m @ (PeerMessage::Follow(_)
                    | PeerMessage::FollowFrom(_)
                    | PeerMessage::Replicate(_)
                    | PeerMessage::ReplicaReport(_)
                    | PeerMessage::Fence(_)
                    | PeerMessage::FenceAnswer(_)
                    | PeerMessage::TailFetch(_)
                    | PeerMessage::TailChunk(_)
                    | PeerMessage::ReplicationRefused(_)
                    | PeerMessage::LogStart(_)) => self.replication_message(from, m),
                    PeerMessage::LeaseGrant(g) => self.on_lease_grant(g),
                    other => warn!(%from, kind = ?other.kind(), "unexpected peer message"),
                }
            }
            any |= self.drain_metalog();
            while let Some(out) = self.control.as_mut().and_then(|c| c.poll_output()) {
                any = true;
                match out {
                    ControlOutput::Send { to, message } => {
                        self.net
                            .send(to.as_str(), &PeerMessage::Raft(to_peer(&message)));
                    }
                    ControlOutput::Persist { ready, record } => match self.metalog.as_mut() {
                        // Confirmed by the sync's completion (`drain_metalog`).
                        Some(log) => log.append(ready, record),
                        // In memory only: durable as soon as it is written.
                        None => {
                            if let Some(c) = self.control.as_mut() {
                                c.persisted(ready);
                            }
                        }
                    },
                    ControlOutput::Applied(a) => self.on_applied(a),
                    ControlOutput::LeaseGranted { node, seq, grant } => {
                        self.grant_lease(&node, seq, grant)
                    }
                }
            }
            self.net.pump(now);
            if !any {
                return;
            }
        }
    }

    fn on_applied(&mut self, applied: Applied) {
        debug!(?applied, "metadata applied");
        self.metadata_changed = true;
        self.replicas_changed = true;
        self.lease_metadata_applied();
        match applied {
            Applied::Refused { node, reason } if node == self.me => {
                warn!(%reason, "the cluster refused this node's declarations");
                self.refusal = Some(reason);
            }
            Applied::Declared(node) if node == self.me => {
                info!(node = %node, "joined the cluster's declarations");
            }
            Applied::DeclaredOtherwise { node, differences } if node == self.me => {
                for d in differences {
                    if self.warned_declarations.contains(&d) {
                        continue;
                    }
                    warn!(
                        "this node's configuration declares {d}; the cluster's record is kept \
                         (change it with `felix admin streams alter`, or make the declaration match)"
                    );
                    self.warned_declarations.push(d);
                }
            }
            Applied::Promoted {
                shard,
                generation,
                leader,
            } => {
                self.replicas.stats.leader_changes += 1;
                let leader = leader.as_ref().map_or("nobody", |l| l.as_str());
                info!(%shard, generation, leader, "shard handed to the next generation");
            }
            Applied::StreamDeleted { key, incarnation } => {
                info!(stream = %key, incarnation, "stream deleted by the cluster: removing its copies here");
                self.forget_copies(ObjectKind::Stream, &key);
                // Every copy goes now, whatever life it is of.
                self.old_lives.remove(&(ObjectKind::Stream, key.clone()));
                self.deleted_here.insert((ObjectKind::Stream, key));
            }
            Applied::CacheDeleted { key, incarnation } => {
                info!(cache = %key, incarnation, "cache deleted by the cluster: removing its copies here");
                self.forget_copies(ObjectKind::Cache, &key);
                self.old_lives.remove(&(ObjectKind::Cache, key.clone()));
                self.deleted_here.insert((ObjectKind::Cache, key));
            }
            Applied::Recreated {
                kind,
                key,
                generation,
            } => {
                info!(object = %key, generation, "a name that lives again: checking for copies of its old lives here");
                self.forget_copies(kind, &key);
                let g = self.old_lives.entry((kind, key.clone())).or_default();
                *g = (*g).max(generation);
                self.deleted_here.insert((kind, key));
            }
            _ => {}
        }
    }

    /// For an object of [`ClusterNode::deleted_objects`] whose name lives again (found so at
    /// start): the highest generation of its deleted lives. Copies here at or
    /// below it go; when there are none, nothing is removed.
    pub(crate) fn old_life_up_to(&self, kind: ObjectKind, key: &ObjectKey) -> Option<u64> {
        self.old_lives.get(&(kind, key.clone())).copied()
    }

    /// The replication factor of a placed stream or cache (0 when not placed).
    pub(crate) fn replication_factor(&self, kind: ObjectKind, key: &ObjectKey) -> u32 {
        let meta = self.meta();
        match kind {
            ObjectKind::Stream => meta.streams.get(key).map(|s| s.spec.replication_factor),
            ObjectKind::Cache => meta.caches.get(key).map(|c| c.spec.replication_factor),
        }
        .map_or(0, u32::from)
    }

    /// Streams and caches whose copies here must go (the cluster deleted them): the engine
    /// deletes each from the broker, then calls [`ClusterNode::removed_here`].
    pub(crate) fn deleted_objects(&self) -> Vec<(ObjectKind, ObjectKey)> {
        self.deleted_here.iter().cloned().collect()
    }

    /// The broker removed (or never had) the object's copies: it may be opened again.
    pub(crate) fn removed_here(&mut self, kind: ObjectKind, key: &ObjectKey) {
        self.old_lives.remove(&(kind, key.clone()));
        if self.deleted_here.remove(&(kind, key.clone())) {
            self.replicas_changed = true;
            self.metadata_changed = true;
            self.removals_done += 1;
        }
    }

    /// A number that moves whenever metadata is applied here or a deleted stream's copies
    /// are removed: what waiters on either are woken by.
    pub(crate) fn changes(&self) -> u64 {
        self.metadata_progress().1 + self.removals_done
    }

    /// Asks the control plane to delete a stream (`DELETE /v1/streams/…` in a cluster): one
    /// `DeleteStream` command for the incarnation placed now. `Ok(incarnation)` when asked;
    /// the caller waits until this node's metadata no longer has it and its copies here are
    /// gone ([`ClusterNode::stream_deleted_here`]).
    pub(crate) fn delete_stream(
        &mut self,
        now: Instant,
        key: ObjectKey,
    ) -> Result<u64, crate::DeleteStreamError> {
        use crate::DeleteStreamError;
        let Some(incarnation) = self.meta().streams.get(&key).map(|s| s.incarnation) else {
            return Err(DeleteStreamError::NotFound);
        };
        let Some(control) = self.control.as_mut() else {
            return Err(DeleteStreamError::Unavailable(
                "the control plane is not running yet".into(),
            ));
        };
        if control.leader().is_none() {
            // Nothing is proposed: a retry later deletes it whole.
            return Err(DeleteStreamError::Unavailable(
                "the control plane has no leader (no majority of its voters)".into(),
            ));
        }
        control.want(Command::DeleteStream { key, incarnation }, now);
        self.pump(now);
        Ok(incarnation)
    }

    /// The incarnation of a placed stream.
    pub(crate) fn incarnation_of(&self, key: &ObjectKey) -> Option<u64> {
        self.meta().streams.get(key).map(|s| s.incarnation)
    }

    /// Whether `incarnation` of `key` is deleted as far as this node knows, its copies here
    /// removed.
    pub(crate) fn stream_deleted_here(&self, key: &ObjectKey, incarnation: u64) -> bool {
        let placed = self.meta().streams.get(key).map(|s| s.incarnation);
        placed != Some(incarnation) && !self.removing(ObjectKind::Stream, key)
    }

    /// As [`ClusterNode::delete_stream`], for a cache (`DELETE /v1/caches/…`).
    pub(crate) fn delete_cache(
        &mut self,
        now: Instant,
        key: ObjectKey,
    ) -> Result<u64, crate::AdminError> {
        use crate::AdminError;
        let Some(incarnation) = self.meta().caches.get(&key).map(|c| c.incarnation) else {
            return Err(AdminError::NotFound(format!("no cache {key}")));
        };
        let Some(control) = self.control.as_mut() else {
            return Err(AdminError::Unavailable(
                "the control plane is not running yet".into(),
            ));
        };
        if control.leader().is_none() {
            return Err(AdminError::Unavailable(
                "the control plane has no leader (no majority of its voters)".into(),
            ));
        }
        control.want(Command::DeleteCache { key, incarnation }, now);
        self.pump(now);
        Ok(incarnation)
    }

    /// Whether `incarnation` of cache `key` is deleted as far as this node knows, its copies
    /// here removed.
    pub(crate) fn cache_deleted_here(&self, key: &ObjectKey, incarnation: u64) -> bool {
        let placed = self.meta().caches.get(key).map(|c| c.incarnation);
        placed != Some(incarnation) && !self.removing(ObjectKind::Cache, key)
    }

    /// Whether the object's copies from a deleted life are still being removed here.
    pub(crate) fn removing(&self, kind: ObjectKind, key: &ObjectKey) -> bool {
        self.deleted_here.contains(&(kind, key.clone()))
    }

    /// Metadata was applied since the last call: requests waiting for a placement may go on.
    pub(crate) fn take_metadata_changed(&mut self) -> bool {
        std::mem::take(&mut self.metadata_changed)
    }

    /// `limits.forward_window`.
    pub(crate) fn forward_window(&self) -> usize {
        self.forwards.window()
    }

    /// The other nodes of the cluster.
    pub(crate) fn peer_count(&self) -> usize {
        self.meta().voters.len().saturating_sub(1)
    }

    /// How long a forward, or a request waiting for its stream's placement, may take.
    pub(crate) fn forward_timeout(&self) -> std::time::Duration {
        self.forwards.timeout()
    }

    /// `cluster.place_streams_on_first_use`.
    pub(crate) fn places_streams_on_first_use(&self) -> bool {
        self.place_streams_on_first_use
    }

    /// Why this node must stop: the cluster refused it, or its metadata log failed.
    pub(crate) fn refusal(&self) -> Option<&str> {
        self.refusal.as_deref().or_else(|| self.storage_error())
    }

    /// Joined, its declarations accepted, and (once, after its start) every copy placed here
    /// caught up with its leader: it can serve, and `/readyz` says so.
    pub(crate) fn is_serving(&self) -> bool {
        self.is_joined() && self.caught_up
    }

    fn is_joined(&self) -> bool {
        let meta = self.meta();
        self.refusal().is_none()
            && meta.members.get(&self.me).is_some_and(|m| m.up)
            && meta.declared_by.get(&self.me) == Some(&true)
            && self.lease.writable_until().is_some()
    }

    /// Latches [`ClusterNode::caught_up`] the first time the joined node's copies are level.
    pub(super) fn note_caught_up(&mut self) {
        if !self.caught_up && self.is_joined() && self.copies_caught_up() {
            self.caught_up = true;
            tracing::info!("every copy placed here has caught up with its leader: ready");
        }
    }

    /// How many stream and cache shards this node leads, and holds without leading.
    pub(crate) fn shard_roles(&self) -> (u64, u64) {
        let meta = self.meta();
        let shards = meta
            .streams
            .values()
            .flat_map(|s| &s.shards)
            .chain(meta.caches.values().flat_map(|c| &c.shards));
        let (mut led, mut followed) = (0, 0);
        for s in shards {
            if s.leader.as_ref() == Some(&self.me) {
                led += 1;
            } else if s.replicas.contains(&self.me) {
                followed += 1;
            }
        }
        (led, followed)
    }

    /// Shards the control plane (if led here) keeps waiting for their lapsed leader.
    pub(crate) fn shards_awaiting_leader(&self) -> u64 {
        self.control
            .as_ref()
            .map_or(0, |c| c.shards_awaiting_leader() as u64)
    }

    /// The metadata log's term and last applied index here (0, 0 before raft runs).
    pub(crate) fn metadata_progress(&self) -> (u64, u64) {
        self.control
            .as_ref()
            .map_or((0, 0), |c| (c.term(), c.metadata().applied))
    }

    /// `topology`'s answer: every member that can serve and has a client address.
    pub(crate) fn topology(&self) -> Vec<(String, String)> {
        self.meta()
            .serving_members()
            .map(|(n, a)| (n.0.clone(), a.to_owned()))
            .collect()
    }

    fn member_addr(&self, node: &NodeId) -> Option<String> {
        self.meta()
            .members
            .get(node)
            .and_then(|m| m.client_addr.clone())
    }

    /// Who serves `shard` for a client: as [`owner_of`](Self::owner_of), but a `leader`
    /// shard whose leader is down is awaited, not sent to (`may_hand_over`: nobody else may
    /// take it, so clients are told to retry instead of dialing a dead node).
    fn client_owner_of(&self, shard: &ShardMeta, consistency: MetaConsistency) -> Owner {
        match &shard.leader {
            Some(l)
                if *l != self.me
                    && consistency == MetaConsistency::Leader
                    && shard.replicas.len() > 1
                    && self.meta().members.get(l).is_some_and(|m| !m.up) =>
            {
                Owner::Awaiting { node: l.clone() }
            }
            _ => self.owner_of(shard),
        }
    }

    fn owner_of(&self, shard: &ShardMeta) -> Owner {
        match &shard.leader {
            Some(l) if *l == self.me => Owner::Local,
            Some(l) => Owner::Remote {
                node: l.clone(),
                addr: self.member_addr(l),
                generation: shard.generation,
            },
            None => Owner::Unassigned,
        }
    }

    fn stream_shards_meta(&self, key: &ObjectKey) -> Option<&[ShardMeta]> {
        self.meta().streams.get(key).map(|s| s.shards.as_slice())
    }

    /// Who serves shard `shard` of a stream; `None` for a stream not placed yet.
    pub(crate) fn stream_owner(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
    ) -> Option<Owner> {
        let key = ObjectKey::new(tenant, namespace, stream);
        let placed = self.meta().streams.get(&key)?;
        Some(
            placed
                .shards
                .get(shard as usize)
                .map_or(Owner::Unassigned, |s| {
                    self.client_owner_of(s, placed.spec.consistency)
                }),
        )
    }

    /// Who serves one shard of a cache; `None` for a cache not placed.
    pub(crate) fn cache_owner(
        &self,
        (tenant, namespace, cache): (&str, &str, &str),
        shard: u32,
    ) -> Option<Owner> {
        let c = self
            .meta()
            .caches
            .get(&ObjectKey::new(tenant, namespace, cache))?;
        Some(c.shards.get(shard as usize).map_or(Owner::Unassigned, |s| {
            self.client_owner_of(s, MetaConsistency::Leader)
        }))
    }

    /// A placed cache's width: its keys hash over this many shards.
    pub(crate) fn cache_width(&self, tenant: &str, namespace: &str, cache: &str) -> Option<u32> {
        let key = ObjectKey::new(tenant, namespace, cache);
        self.meta().caches.get(&key).map(|c| c.shards.len() as u32)
    }

    /// A placed stream's width.
    pub(crate) fn stream_width(&self, tenant: &str, namespace: &str, stream: &str) -> Option<u32> {
        self.stream_shards_meta(&ObjectKey::new(tenant, namespace, stream))
            .map(|s| s.len() as u32)
    }

    /// Asks the cluster to place a stream first used here.
    pub(crate) fn place_stream(
        &mut self,
        now: Instant,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shards: u32,
    ) {
        let spec = StreamSpec {
            shards: shards.max(1),
            replication_factor: self.default_replication_factor,
            consistency: MetaConsistency::Leader,
            retention: Default::default(),
            durable: true,
        };
        let key = ObjectKey::new(tenant, namespace, stream);
        match self.control.as_mut() {
            Some(c) => c.want_stream(key, spec, now),
            None => {
                if let Some((_, wishes)) = self.starting.as_mut() {
                    wishes.push(Command::CreateStream { key, spec });
                }
            }
        }
        self.pump(now);
    }

    /// Every shard's owner, for `shard_owners`; `None` for an object not placed.
    pub(crate) fn owners(
        &self,
        cache: bool,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Vec<OwnerEntry>> {
        let key = ObjectKey::new(tenant, namespace, name);
        let meta = self.meta();
        let shards = if cache {
            meta.caches.get(&key).map(|c| c.shards.as_slice())
        } else {
            meta.streams.get(&key).map(|s| s.shards.as_slice())
        }?;
        Some(
            shards
                .iter()
                .map(|s| OwnerEntry {
                    node_id: s.leader.as_ref().map(|l| l.0.clone()),
                    addr: s.leader.as_ref().and_then(|l| self.member_addr(l)),
                    generation: s.generation,
                })
                .collect(),
        )
    }
}

/// The answer to a forward that waited for `to`'s window past its deadline: it never left
/// this node, so it was not applied.
#[cfg(test)]
mod channel_tests {
    use super::*;
    use crate::config::{AuthConfig, EngineConfig, PeerAddr};

    fn node(seed: u8) -> ClusterNode {
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec!["n1".to_owned()]).expect("params");
        let cert = params.self_signed(&key).expect("certificate");
        let tls = crate::tls::TlsIdentity {
            cert_chain: vec![cert.der().clone()],
            key: rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key"),
        };
        let engine = EngineConfig::new(tls, AuthConfig::Dev { seed: [7; 32] }, [seed; 32]);
        let peers = (1..=3)
            .map(|i| PeerAddr {
                node_id: format!("n{i}"),
                addr: ([127, 0, 0, 1], 7100 + i).into(),
            })
            .collect();
        let cfg = ClusterConfig::new("n1", peers);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        ClusterNode::new(&cfg, &engine, provider, &[seed; 32], None, Instant::now()).expect("node")
    }

    #[test]
    fn a_restarted_node_numbers_its_forward_channels_elsewhere() {
        // Two processes of one node (each start draws its own seed): a leader may still owe
        // the first one answers, whose forward ids must not be the second one's.
        let (mut first, mut second) = (node(1), node(2));
        let (a, b) = (first.new_channel(), second.new_channel());
        assert_ne!(a, b);
        assert_ne!(a, 0);
        assert_eq!(first.new_channel(), a.wrapping_add(1).max(1));
    }
}
