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
                })
            })
            .collect()
    }
}
