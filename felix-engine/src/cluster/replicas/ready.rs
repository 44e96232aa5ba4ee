//! What sessions and observers ask of this node's copies: may a write be served here now,
//! have the copies caught up, what each copy is doing, replication's figures.

use std::time::Instant;

use felix_cluster::meta::{ObjectKey, ObjectKind, ShardMeta, ShardRef};
use felix_cluster::routing::Owner;

use super::{CopyKind, CopyRef};
use crate::broker::replicated::MovedTo;
use crate::cluster::ClusterNode;

/// What `/metrics` reports about replication on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReplicationStats {
    /// Per shard led here: records the slowest follower lacks durably.
    pub(crate) lag_records: Vec<(String, u64)>,
    /// Shard leadership changes this node applied (cluster-wide).
    pub(crate) leader_changes: u64,
    /// Times quorum publishes on shards led here ran out of time, or were cut off by a
    /// step-down.
    pub(crate) quorum_timeouts: u64,
    /// Bytes of shipped or adopted entries appended here.
    pub(crate) catch_up_bytes: u64,
    /// Records known acknowledged that a new leadership here could not recover (a lost
    /// disk, or an operator's abandon).
    pub(crate) acknowledged_abandoned: u64,
    /// Replica state writes the log refused (each a copy deciding again instead of waiting).
    pub(crate) replica_states_refused: u64,
    /// `leader` shards led here holding acknowledgements for a resumption.
    pub(crate) leader_shards_quiet: u64,
}

impl ClusterNode {
    /// Whether a write on this stream shard may be served here now: the lease holds, and a
    /// replicated shard's copy is open for writes at the metadata's generation.
    pub(crate) fn local_ready(
        &self,
        now: Instant,
        names: (&str, &str, &str),
        shard: u32,
    ) -> Result<(), &'static str> {
        self.ready(
            now,
            (ObjectKind::Stream, names, shard),
            &[CopyKind::Records],
        )
    }

    /// Whether a consumer-group request on this stream shard may be served here now: as
    /// [`local_ready`](Self::local_ready), and the shard's group log is open too.
    pub(crate) fn groups_ready(
        &self,
        now: Instant,
        names: (&str, &str, &str),
        shard: u32,
    ) -> Result<(), &'static str> {
        let copies = [CopyKind::Records, CopyKind::Groups];
        self.ready(now, (ObjectKind::Stream, names, shard), &copies)
    }

    /// Whether a request on this cache shard led here may be served now: the lease holds,
    /// and a replicated shard's values and counters are open at the metadata's generation.
    pub(crate) fn local_ready_cache(
        &self,
        now: Instant,
        names: (&str, &str, &str),
        shard: u32,
    ) -> Result<(), &'static str> {
        let copies = [CopyKind::Values, CopyKind::Counters];
        self.ready(now, (ObjectKind::Cache, names, shard), &copies)
    }

    /// The lease holds, and each of `copies` of the shard is ready (`copy_ready`).
    fn ready(
        &self,
        now: Instant,
        (kind, names, shard): (ObjectKind, (&str, &str, &str), u32),
        copies: &[CopyKind],
    ) -> Result<(), &'static str> {
        if !self.lease_valid(now) {
            return Err("this node's lease on the shard lapsed; it is being renewed");
        }
        let r = ShardRef {
            kind,
            key: ObjectKey::new(names.0, names.1, names.2),
            shard,
        };
        if self.removing(kind, &r.key) {
            return Err("the object's deleted copies are still being removed here");
        }
        copies
            .iter()
            .try_for_each(|&copy| self.copy_ready(r.clone(), copy))
    }

    fn copy_ready(&self, r: ShardRef, kind: CopyKind) -> Result<(), &'static str> {
        let copy = CopyRef { shard: r, kind };
        match self.replicas.slots.get(&copy) {
            // No copy kept here yet: fine for a shard of one replica, but a replicated one
            // must wait for its slot (and its fence), or the write would skip replication.
            None if self
                .meta()
                .shard(&copy.shard)
                .is_some_and(|m| m.replicas.len() > 1) =>
            {
                Err("the shard's copy here is still being prepared")
            }
            None => Ok(()),
            Some(s)
                if self
                    .generation_of(&copy.shard)
                    .is_some_and(|g| s.copy.writable_at(g)) =>
            {
                Ok(())
            }
            Some(_) => Err("the shard's new leader is still fencing its replicas"),
        }
    }

    /// Whether every copy placed here has caught up with its leader: a follower holds what
    /// its leader's log held when it answered this copy's request to be fed, a leader here has
    /// opened its generation. Readiness waits for it once after a start (docs/deploy.md). A
    /// copy without a leader, following a node marked down, or halted does not hold readiness
    /// back: waiting would not change it.
    pub(in crate::cluster) fn copies_caught_up(&self) -> bool {
        let meta = self.meta();
        let leader_down = |m: &ShardMeta| {
            m.leader
                .as_ref()
                .is_none_or(|l| *l != self.me && !meta.members.get(l).is_some_and(|mm| mm.up))
        };
        self.replicated_here().iter().all(|(r, m)| {
            self.replicas
                .slots
                .get(r)
                .is_some_and(|slot| slot.copy.caught_up(m.generation, leader_down(m)))
        })
    }

    /// What [`crate::cluster::observe::ClusterView::replicas`] shows.
    pub(in crate::cluster) fn replica_views(&self) -> Vec<crate::cluster::observe::ReplicaView> {
        self.replicas
            .slots
            .iter()
            .map(|(r, slot)| {
                let (role, commit) = slot.copy.role_name();
                let current = slot
                    .copy
                    .leader()
                    .is_some_and(|l| Some(l.generation()) == self.generation_of(&r.shard));
                let object = match r.kind {
                    CopyKind::Records => format!("stream:{}", r.shard.key),
                    CopyKind::Groups => format!("stream-groups:{}", r.shard.key),
                    CopyKind::Values => format!("cache:{}", r.shard.key),
                    CopyKind::Counters => format!("cache-counters:{}", r.shard.key),
                };
                crate::cluster::observe::ReplicaView {
                    object,
                    shard: r.shard.shard,
                    generation: slot.copy.generation(),
                    role,
                    commit,
                    writable_until: if current {
                        self.lease.writable_until()
                    } else {
                        None
                    },
                }
            })
            .collect()
    }

    /// A publish on this stream shard is served here as its leader (it passed
    /// [`local_ready`](Self::local_ready)): counted for the simulator's one-writer checks.
    pub(crate) fn note_write(&mut self, names: (&str, &str, &str), shard: u32) {
        let r = ShardRef {
            kind: ObjectKind::Stream,
            key: ObjectKey::new(names.0, names.1, names.2),
            shard,
        };
        let generation = self.generation_of(&r).unwrap_or(0);
        let mark = self.writes_served.entry(r).or_insert((generation, 0));
        *mark = (generation, mark.1 + 1);
    }

    /// Replication's figures for `/metrics`, with each led shard's lag as of now.
    pub(crate) fn replication_stats(&self) -> ReplicationStats {
        let mut stats = self.replicas.stats.clone();
        stats.lag_records = self
            .replicas
            .slots
            .iter()
            .filter_map(|(r, s)| {
                let l = s.copy.leader()?;
                let shard = format!("{}#{}", r.shard.key, r.shard.shard);
                let label = match r.kind {
                    CopyKind::Records | CopyKind::Values => shard,
                    CopyKind::Groups => format!("{shard}/groups"),
                    CopyKind::Counters => format!("{shard}/counters"),
                };
                Some((label, l.lag_records()))
            })
            .collect();
        stats.leader_shards_quiet = self.leader_shards_quiet() as u64;
        stats
    }

    /// Where the shard `r` went, as the metadata here says.
    pub(super) fn moved_to(&self, r: &CopyRef) -> MovedTo {
        let generation = self.generation_of(&r.shard).unwrap_or(0);
        let k = &r.shard.key;
        let owner = match r.shard.kind {
            ObjectKind::Stream => {
                self.stream_owner(&k.tenant, &k.namespace, &k.name, r.shard.shard)
            }
            ObjectKind::Cache => {
                self.cache_owner((&k.tenant, &k.namespace, &k.name), r.shard.shard)
            }
        };
        match owner {
            Some(Owner::Remote {
                node,
                addr,
                generation,
            }) => MovedTo {
                node_id: Some(node.0),
                addr,
                generation,
            },
            // Led here again at a new generation once its fence is done.
            Some(Owner::Local) => MovedTo {
                node_id: Some(self.me.0.clone()),
                addr: self
                    .meta()
                    .members
                    .get(&self.me)
                    .and_then(|m| m.client_addr.clone()),
                generation,
            },
            _ => MovedTo {
                node_id: None,
                addr: None,
                generation,
            },
        }
    }
}
