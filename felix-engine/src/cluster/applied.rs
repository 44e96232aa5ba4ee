//! Metadata applied here: what each applied command changes on this node (a refusal, a
//! promotion, a deleted or re-created object whose copies here must go), and what the engine
//! reads back (the objects to remove, a change count waiters are woken by).

use felix_cluster::meta::{Applied, ObjectKey, ObjectKind};
use tracing::{debug, info, warn};

use super::ClusterNode;

impl ClusterNode {
    pub(super) fn on_applied(&mut self, applied: Applied) {
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
}
