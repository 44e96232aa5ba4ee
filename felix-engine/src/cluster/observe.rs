//! A read-only look at this node's cluster state, for the simulator's invariants
//! (`sim/src/invariants/meta_agreement.rs`, `shard_leaders.rs`): what it has applied, and who
//! it believes leads each shard. Nothing here changes the node.

use super::ClusterNode;

/// This node's control-plane state as it is now (empty metadata while a durable node is
/// still replaying its metadata log). Borrowed from the engine: take what you
/// need and drop it before driving the engine again.
pub struct ClusterView<'a> {
    node: &'a ClusterNode,
}

/// One shard's assignment as a node's metadata records it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ShardLeader {
    /// `stream:tenant/namespace/name` or `cache:tenant/namespace/name`.
    pub object: String,
    pub shard: u32,
    pub generation: u64,
    /// `None` while the shard has no leader.
    pub leader: Option<String>,
    /// A `leader` shard's standing quiescence: the followers recorded level with its
    /// leader, who may take it over (empty when none stands).
    pub quiet_level: Vec<String>,
}

impl<'a> ClusterView<'a> {
    pub(crate) fn new(node: &'a ClusterNode) -> ClusterView<'a> {
        ClusterView { node }
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        self.node.me.as_str()
    }

    /// The last raft index applied to the metadata here.
    pub fn applied_index(&self) -> u64 {
        self.node.meta().applied
    }

    /// The raft term, and the control plane's leader as this node knows it.
    pub fn raft_term(&self) -> u64 {
        self.node.control.as_ref().map_or(0, |c| c.term())
    }

    pub fn raft_leader(&self) -> Option<&str> {
        self.node.control.as_ref()?.leader().map(|n| n.as_str())
    }

    /// The whole metadata as applied up to [`applied_index`](Self::applied_index), encoded
    /// (the snapshot encoding): two nodes that applied the same entries hold equal bytes.
    pub fn metadata_bytes(&self) -> Vec<u8> {
        self.node.meta().snapshot()
    }

    /// The members that have joined, by id.
    pub fn members(&self) -> Vec<String> {
        let meta = self.node.meta();
        meta.members.keys().map(|n| n.0.clone()).collect()
    }

    /// Per stream and cache that is placed or was deleted (keyed as [`ShardLeader::object`]):
    /// the incarnation placed now (`None`: not placed) and the highest incarnation deleted
    /// (`None`: none). What lets an invariant tell a delete this node applied from metadata
    /// it forgot.
    pub fn incarnations(&self) -> std::collections::BTreeMap<String, (Option<u64>, Option<u64>)> {
        let meta = self.node.meta();
        let mut out = std::collections::BTreeMap::new();
        let placed = (meta
            .streams
            .iter()
            .map(|(k, s)| ("stream", k, s.incarnation)))
        .chain(meta.caches.iter().map(|(k, c)| ("cache", k, c.incarnation)));
        for (kind, key, incarnation) in placed {
            out.insert(
                format!("{kind}:{key}"),
                (Some(incarnation), incarnation.checked_sub(1)),
            );
        }
        let tombs = (meta.deleted_streams.iter().map(|(k, t)| ("stream", k, t)))
            .chain(meta.deleted_caches.iter().map(|(k, t)| ("cache", k, t)));
        for (kind, key, tomb) in tombs {
            let e = out.entry(format!("{kind}:{key}")).or_insert((None, None));
            e.1 = Some(e.1.map_or(tomb.incarnation, |d| d.max(tomb.incarnation)));
        }
        out
    }

    /// Every placed shard of every stream and cache, in object order.
    pub fn shard_leaders(&self) -> Vec<ShardLeader> {
        let meta = self.node.meta();
        let streams = meta.streams.iter().map(|(k, s)| ("stream", k, &s.shards));
        let caches = meta.caches.iter().map(|(k, c)| ("cache", k, &c.shards));
        streams
            .chain(caches)
            .flat_map(|(kind, key, shards)| {
                shards.iter().enumerate().map(move |(i, s)| ShardLeader {
                    object: format!("{kind}:{key}"),
                    shard: i as u32,
                    generation: s.generation,
                    leader: s.leader.as_ref().map(|l| l.0.clone()),
                    quiet_level: s
                        .quiet
                        .iter()
                        .flat_map(|q| q.level.iter().map(|n| n.0.clone()))
                        .collect(),
                })
            })
            .collect()
    }
}

/// One replicated shard copy on this node, as its replication role stands now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaView {
    /// `stream:tenant/namespace/name`.
    pub object: String,
    pub shard: u32,
    /// The generation the role is for.
    pub generation: u64,
    /// `preparing`, `fencing`, `leading`, `asking`, `truncating`, `following` (fed),
    /// `halted` or `idle`.
    pub role: &'static str,
    /// Leading: the commit mark (records below it are held as the consistency requires).
    pub commit: Option<u64>,
    /// Leading at the metadata's generation: the last instant (this node's clock) its lease
    /// lets it accept a write. `None` when it may not write at all.
    pub writable_until: Option<std::time::Instant>,
}

/// Publishes this node served as a shard's leader: the latest generation it served at, and
/// how many it has served in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritesServed {
    pub generation: u64,
    pub count: u64,
}

impl ClusterView<'_> {
    /// Every replicated shard copy this node holds.
    pub fn replicas(&self) -> Vec<ReplicaView> {
        self.node.replica_views()
    }

    /// Publishes served here as leader, by `(object, shard)` as in [`ReplicaView`].
    pub fn writes_served(&self) -> Vec<((String, u32), WritesServed)> {
        self.node
            .writes_served
            .iter()
            .map(|(r, &(generation, count))| {
                (
                    (format!("stream:{}", r.key), r.shard),
                    WritesServed { generation, count },
                )
            })
            .collect()
    }
}
