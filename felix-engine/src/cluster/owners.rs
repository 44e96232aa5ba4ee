//! Ownership and routing answers from the applied metadata: who serves a shard (for a
//! client, and for a forward another node sent), how wide an object is, `topology` and
//! `shard_owners`, and a first-used stream's placement asked for. The router
//! (`crate::router`) hands these to sessions.

use std::time::Instant;

use felix_cluster::meta::{
    Command, Consistency as MetaConsistency, ObjectKey, ShardMeta, StreamSpec,
};
use felix_cluster::routing::{judge_forward, ForwardVerdict, Owner};
use felix_cluster::NodeId;

use super::ClusterNode;

impl ClusterNode {
    /// `topology`'s answer: every member that can serve and has a client address.
    pub(crate) fn topology(&self) -> Vec<(String, String)> {
        self.meta()
            .serving_members()
            .map(|(n, a)| (n.0.clone(), a.to_owned()))
            .collect()
    }

    pub(super) fn member_addr(&self, node: &NodeId) -> Option<String> {
        self.meta()
            .members
            .get(node)
            .and_then(|m| m.client_addr.clone())
    }

    /// Who serves `shard` for a client: as [`owner_of`](Self::owner_of), but a `leader`
    /// shard whose leader is down is awaited, not sent to (`may_hand_over`: nobody else may
    /// take it, so clients are told to retry instead of dialing a dead node).
    pub(super) fn client_owner_of(&self, shard: &ShardMeta, consistency: MetaConsistency) -> Owner {
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

    pub(super) fn owner_of(&self, shard: &ShardMeta) -> Owner {
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

    pub(super) fn stream_shards_meta(&self, key: &ObjectKey) -> Option<&[ShardMeta]> {
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

    /// What this node does with a forward, by its metadata (felix-cluster's `routing`
    /// decides).
    pub(crate) fn judge_forward(&self, scope: &felix_peer_proto::ShardScope) -> ForwardVerdict {
        let meta = self.scope_meta(scope);
        let owner = meta.map_or(Owner::Unassigned, |m| self.owner_of(m));
        judge_forward(&owner, meta.map(|m| m.generation), scope.generation)
    }

    pub(super) fn scope_meta(&self, scope: &felix_peer_proto::ShardScope) -> Option<&ShardMeta> {
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
}

/// A shard's owner as `shard_owners` reports it (sessions read it through the router).
pub(crate) struct OwnerEntry {
    pub(crate) node_id: Option<String>,
    pub(crate) addr: Option<String>,
    pub(crate) generation: u64,
}
