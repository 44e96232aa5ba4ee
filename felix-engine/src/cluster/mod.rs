//! This node's part in a cluster, as wiring: the engine drives it, it drives felix-cluster's
//! decisions (the control plane, the forwards, the lease holder, each copy's rules) and routes
//! their outputs to the peers (`peers.rs`), the broker (`ReplicaIo`) and the metadata log
//! (`metalog.rs`). Sessions never reach it: they ask `crate::router`, which answers from it.
//!
//! By concern: `mod.rs` the driver's state, its inputs, timers and the pump between the links
//! and the control plane; `start.rs` building it from the configuration; `applied.rs` what
//! applied metadata changes here; `owners.rs` ownership and routing answers; `forwarding.rs`
//! the forwards sent and received; `objects.rs` an operator's creates, alters and deletes;
//! `lease.rs` the lease holder's wiring; `replicas.rs` the copies of replicated shards;
//! `abandon.rs` `felix admin abandon`; `observe.rs` a read-only view for the simulator.
//!
//! Metadata is small and kept in memory. On a node with durable storage the raft log and its
//! snapshots are also on disk (`metalog.rs`): the control plane starts only once they are
//! replayed, and each record it asks for is confirmed only after its sync. Without durable
//! storage the log is memory only: a restarted node comes back blank, and the control
//! plane's disk guard keeps it from voting until it has caught up (docs/cluster.md).

pub(crate) mod abandon;
mod applied;
mod forwarding;
mod lease;
mod metalog;
pub(crate) mod objects;
pub(crate) mod observe;
mod owners;
mod peers;
mod replicas;
mod start;

use std::collections::BTreeMap;
use std::time::Instant;

use felix_cluster::control::wire::{from_peer, to_peer};
use felix_cluster::control::{ControlConfig, ControlOutput, ControlPlane};
use felix_cluster::forward::Forwards;
use felix_cluster::meta::{Command, Metadata, ObjectKey, ObjectKind, ShardRef};
use felix_cluster::NodeId;
use felix_peer_proto::PeerMessage;
use felix_storage::ops::{FileCompletion, FileOp};
use tracing::warn;

use crate::net::{Datagram, Transmit};
pub(crate) use forwarding::ForwardOutcome;
pub(crate) use metalog::METALOG_LOG;
use metalog::{Done, MetaLog};
pub(crate) use owners::OwnerEntry;
use peers::{PeerEvent, PeerNet};
pub(crate) use replicas::{CopyKind, LogView, ReplicaIo};

/// The engine's way to the cluster driver the router wraps (implemented in `router.rs`):
/// sessions ask the router, and cannot reach the driver without importing this trait from
/// `cluster/`, which tidy refuses them.
pub(crate) trait Wired {
    fn driver(&self) -> Option<&ClusterNode>;
    fn driver_mut(&mut self) -> Option<&mut ClusterNode>;
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

impl ClusterNode {
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

    /// Peer links up now, and messages dropped for a full peer backlog.
    pub(crate) fn peer_link_stats(&self) -> (u64, u64) {
        (self.net.ready_links() as u64, self.net.backlog_dropped)
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

    /// The other nodes of the cluster.
    pub(crate) fn peer_count(&self) -> usize {
        self.meta().voters.len().saturating_sub(1)
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
}
