//! This node's part in a cluster: the control plane (felix-cluster's raft-rs driver) over the
//! peer links (`peers.rs`), and the views of the metadata that sessions route by.
//!
//! Metadata is small and kept in memory. A node's raft log is in memory too in this version:
//! a restarted node comes back blank, and the control plane's disk guard keeps it from voting
//! until it has caught up from the others (docs/cluster.md, "Restarts").

pub(crate) mod observe;
mod peers;

use core::net::SocketAddr;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use felix_cluster::control::store::MetaStore;
use felix_cluster::control::wire::{from_peer, to_peer};
use felix_cluster::control::{ControlConfig, ControlOutput, ControlPlane};
use felix_cluster::meta::{
    Applied, CacheSpec, Command, Consistency as MetaConsistency, Declarations, ObjectKey,
    ShardMeta, StreamSpec,
};
use felix_cluster::routing::Owner;
use felix_cluster::{NodeId, Voters};
use felix_peer_proto::PeerMessage;
use tracing::{info, warn};

use crate::config::{ClusterConfig, Consistency, DeclaredStream};
use crate::engine::{Datagram, Transmit};
use crate::tls::TlsIdentity;
use peers::{Identity, PeerCrypto, PeerEvent, PeerNet};

/// A shard's owner as `shard_owners` reports it.
pub(crate) struct OwnerEntry {
    pub(crate) node_id: Option<String>,
    pub(crate) addr: Option<String>,
    pub(crate) generation: u64,
}

/// How long a forwarded request may wait for the leader's answer before the client is told
/// the outcome is unknown (`unacknowledged`). Below the client's own 30 s ack timeout.
pub(crate) const FORWARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How a forward this node sent ended.
#[derive(Debug)]
pub(crate) enum ForwardOutcome {
    /// The leader's answer frame.
    Answered(bytes::Bytes),
    /// The leader refused it, or it never answered.
    Refused(felix_proto::ErrorCode, String),
}

/// A forward sent, waiting for its answer: where the client's session is.
struct Sent {
    ch: quinn_proto::ConnectionHandle,
    stream: quinn_proto::StreamId,
    deadline: Instant,
    to: NodeId,
}

/// A forward another node sent here.
pub(crate) struct Inbound {
    pub(crate) from: String,
    pub(crate) forward: felix_peer_proto::Forward,
}

pub(crate) struct ClusterNode {
    me: NodeId,
    /// Forwards sent and not answered, by id.
    sent: BTreeMap<u64, Sent>,
    done: std::collections::VecDeque<(
        quinn_proto::ConnectionHandle,
        quinn_proto::StreamId,
        u64,
        ForwardOutcome,
    )>,
    inbound: std::collections::VecDeque<Inbound>,
    next_channel: u32,
    cluster_id: String,
    net: PeerNet,
    control: ControlPlane,
    /// Why the cluster refused this node (its declarations disagree): fatal.
    refusal: Option<String>,
    default_replication_factor: u8,
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
        declared_streams: &[DeclaredStream],
        client_identity: &TlsIdentity,
        provider: Arc<rustls::crypto::CryptoProvider>,
        seed: &[u8; 32],
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
                .map_or_else(|| client_identity.clone(), |t| t.identity.clone()),
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
        let net = PeerNet::new(identity, names, dial, &crypto, seed, now)?;
        let control_seed = u64::from_be_bytes(derived[24..32].try_into().expect("8 bytes"));
        let store = MetaStore::new(voters.raft_ids());
        let control_cfg = ControlConfig::new(me.clone(), voters, control_seed, cfg.lease);
        let mut control = ControlPlane::new(control_cfg, store, now);
        let storage_hex: String = storage_id.iter().map(|b| format!("{b:02x}")).collect();
        control.want(
            Command::Join {
                node: me.clone(),
                client_addr: cfg.client_advertise_addr.clone(),
                storage_id: storage_hex,
            },
            now,
        );
        control.want(
            Command::Declare {
                node: me.clone(),
                declarations: declarations(declared_streams, cfg),
            },
            now,
        );
        let mut node = ClusterNode {
            sent: BTreeMap::new(),
            done: Default::default(),
            inbound: Default::default(),
            next_channel: 1,
            cluster_id: cid,
            me,
            net,
            control,
            refusal: None,
            default_replication_factor: cfg.default_replication_factor.max(1),
        };
        node.pump(now);
        Ok(node)
    }

    pub(crate) fn handle_datagram(&mut self, now: Instant, datagram: Datagram) {
        self.net.handle_datagram(now, datagram);
        self.pump(now);
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .sent
            .iter()
            .filter(|(_, s)| s.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let s = self.sent.remove(&id).expect("listed");
            let why = format!(
                "no answer from {} within {FORWARD_TIMEOUT:?}; the request may or may not have been applied",
                s.to
            );
            let outcome = ForwardOutcome::Refused(felix_proto::ErrorCode::Unacknowledged, why);
            self.done.push_back((s.ch, s.stream, id, outcome));
        }
        self.net.handle_timeout(now);
        if self.control.poll_timeout() <= now {
            self.control.handle_timeout(now);
        }
        self.pump(now);
    }

    pub(crate) fn poll_timeout(&self) -> Instant {
        let forwards = self.sent.values().map(|s| s.deadline).min();
        [self.net.poll_timeout(), forwards]
            .into_iter()
            .flatten()
            .fold(self.control.poll_timeout(), Instant::min)
    }

    /// A channel number for one client session's forwards (the high half of their ids).
    pub(crate) fn new_channel(&mut self) -> u32 {
        let c = self.next_channel;
        self.next_channel = self.next_channel.wrapping_add(1).max(1);
        c
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

    /// Sends a forward to `to`; with `answer_to`, its answer is owed to that session.
    pub(crate) fn forward(
        &mut self,
        now: Instant,
        to: &NodeId,
        forward: felix_peer_proto::Forward,
        answer_to: Option<(quinn_proto::ConnectionHandle, quinn_proto::StreamId)>,
    ) {
        if let Some((ch, stream)) = answer_to {
            let deadline = now + FORWARD_TIMEOUT;
            self.sent.insert(
                forward.forward_id,
                Sent {
                    ch,
                    stream,
                    deadline,
                    to: to.clone(),
                },
            );
        }
        self.net.send(to.as_str(), &PeerMessage::Forward(forward));
        self.pump(now);
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

    /// Who serves the shard a forward names, as this node's metadata says.
    pub(crate) fn scope_owner(&self, scope: &felix_peer_proto::ShardScope) -> Owner {
        let s = &scope.shard;
        let owner = match s.kind {
            felix_peer_proto::ShardKind::Cache => {
                self.cache_owner(&s.tenant, &s.namespace, &s.name)
            }
            felix_peer_proto::ShardKind::Stream => {
                self.stream_owner(&s.tenant, &s.namespace, &s.name, s.shard)
            }
        };
        owner.unwrap_or(Owner::Unassigned)
    }

    pub(crate) fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        let t = self.net.poll_transmit(now, buf);
        if t.is_none() {
            self.pump(now);
        }
        t
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
                        self.control.peer_reconnected(&NodeId::new(from));
                        continue;
                    }
                };
                match message {
                    PeerMessage::Raft(m) => {
                        if let Some(m) = from_peer(m) {
                            self.control.handle_message(now, &NodeId::new(from), m);
                        }
                    }
                    PeerMessage::Forward(forward) => {
                        self.inbound.push_back(Inbound { from, forward });
                    }
                    PeerMessage::ForwardAnswer(a) => {
                        if let Some(s) = self.sent.remove(&a.forward_id) {
                            let outcome = ForwardOutcome::Answered(a.frame);
                            self.done.push_back((s.ch, s.stream, a.forward_id, outcome));
                        }
                    }
                    PeerMessage::ForwardRefused(r) => {
                        if let Some(s) = self.sent.remove(&r.forward_id) {
                            let why = format!("{} refused the forwarded request", s.to);
                            let outcome = ForwardOutcome::Refused(r.code, why);
                            self.done.push_back((s.ch, s.stream, r.forward_id, outcome));
                        }
                    }
                    other => warn!(%from, kind = ?other.kind(), "unexpected peer message"),
                }
            }
            while let Some(out) = self.control.poll_output() {
                any = true;
                match out {
                    ControlOutput::Send { to, message } => {
                        self.net
                            .send(to.as_str(), &PeerMessage::Raft(to_peer(&message)));
                    }
                    // The metadata log lives in memory: durable as soon as it is written.
                    ControlOutput::Persist { ready, .. } => self.control.persisted(ready),
                    ControlOutput::Applied(a) => self.on_applied(a),
                }
            }
            self.net.pump(now);
            if !any {
                return;
            }
        }
    }

    fn on_applied(&mut self, applied: Applied) {
        match applied {
            Applied::Refused { node, reason } if node == self.me => {
                warn!(%reason, "the cluster refused this node's declarations");
                self.refusal = Some(reason);
            }
            Applied::Declared(node) if node == self.me => {
                info!(node = %node, "joined the cluster's declarations");
            }
            _ => {}
        }
    }

    /// Why this node must stop: the cluster refused it.
    pub(crate) fn refusal(&self) -> Option<&str> {
        self.refusal.as_deref()
    }

    /// Joined, its declarations accepted: it can serve.
    pub(crate) fn is_serving(&self) -> bool {
        let meta = self.control.metadata();
        self.refusal.is_none()
            && meta.members.get(&self.me).is_some_and(|m| m.up)
            && meta.declared_by.get(&self.me) == Some(&true)
    }

    /// How many stream and cache shards this node leads, and holds without leading.
    pub(crate) fn shard_roles(&self) -> (u64, u64) {
        let meta = self.control.metadata();
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

    /// `topology`'s answer: every member that can serve and has a client address.
    pub(crate) fn topology(&self) -> Vec<(String, String)> {
        self.control
            .metadata()
            .serving_members()
            .map(|(n, a)| (n.0.clone(), a.to_owned()))
            .collect()
    }

    fn member_addr(&self, node: &NodeId) -> Option<String> {
        self.control
            .metadata()
            .members
            .get(node)
            .and_then(|m| m.client_addr.clone())
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
        self.control
            .metadata()
            .streams
            .get(key)
            .map(|s| s.shards.as_slice())
    }

    /// Who serves shard `shard` of a stream; `None` for a stream not placed yet.
    pub(crate) fn stream_owner(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
    ) -> Option<Owner> {
        let shards = self.stream_shards_meta(&ObjectKey::new(tenant, namespace, stream))?;
        Some(
            shards
                .get(shard as usize)
                .map_or(Owner::Unassigned, |s| self.owner_of(s)),
        )
    }

    /// Who serves a cache (its one shard).
    pub(crate) fn cache_owner(&self, tenant: &str, namespace: &str, cache: &str) -> Option<Owner> {
        let c = self
            .control
            .metadata()
            .caches
            .get(&ObjectKey::new(tenant, namespace, cache))?;
        Some(
            c.shards
                .first()
                .map_or(Owner::Unassigned, |s| self.owner_of(s)),
        )
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
        };
        self.control
            .want_stream(ObjectKey::new(tenant, namespace, stream), spec, now);
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
        let meta = self.control.metadata();
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
